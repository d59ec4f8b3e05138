//! ORACLE inside the planner core: the router over a run's routed deployments, and what it has
//! bound each routed program (a session of a routed workflow) to.
//!
//! The arms of the router are the distinct deployments that appear in some workflow's route; a
//! program may only be bound to a member of its own route. Binding happens once, when the
//! program arrives ([`RoutedPrograms::bind`], called by the planner for the shells); the
//! program's ledger admission gates its units in the planner's queue; its end releases the
//! reservation (peak context and run time teach the ledger); its verdict lands whenever the
//! shell's verifier returns ([`RoutedPrograms::verdict`]) and updates the learner then. Routing
//! never waits on a verdict.
//!
//! Pure, like the rest of `routing`: no I/O, no clock, no randomness.
//!
//! Must not depend on anything outside `planner` (the core's rule).

use std::collections::BTreeMap;

use super::disc::{DiscConfig, Ledger};
use super::embed::{COMPONENTS, Pca, VerifierSelector, Vocabulary};
use super::linucb::{ALPHA_UCB, LinUcb};
use super::router::{Binding, Router, RouterError, RouterOptions};
use crate::planner::DeploymentId;

/// What the shells hand the core to build its router.
#[derive(Debug, Clone)]
pub struct RoutingSetup {
    /// The routed deployments (the learner's arms), in a fixed order.
    pub arms: Vec<DeploymentId>,
    /// Per arm: the KV-cache capacity in tokens of one replica of its backend on the pool's
    /// largest device — DISC's pool while the model has at most that (no replica yet,
    /// or one there); [`RoutedPrograms::follow_replicas`] grows it with the replicas.
    pub capacity_tokens: Vec<u64>,
    /// Per arm: the ledger's prior peak context c₀ (tokens).
    pub prior_peak_tokens: Vec<f64>,
    /// The ledgers' prior program run time D₀ (seconds).
    pub prior_run_s: f64,
    /// Exemplar tasks per verifier: (verifier, task text); k = 5 each in Appendix B.3.
    pub exemplars: Vec<(String, String)>,
    pub options: RouterOptions,
}

/// One routed program's row, as the run's report shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteRecord {
    pub deployment: DeploymentId,
    /// The deployment the learner chose (differs from `deployment` when DISC diverted it).
    pub chosen: DeploymentId,
    pub verifier: String,
    /// When the program was bound (planner time).
    pub bound_at: f64,
    /// When its ledger admitted it (`None` while it waits).
    pub admitted_at: Option<f64>,
    /// The largest KV footprint (prompt + output limit) among its units so far: its peak
    /// context, which teaches its ledger when it ends.
    pub peak_tokens: u64,
}

/// What the router embeds requests with, fitted on the exemplars (verifier, task text): the
/// TF-IDF vocabulary, the [`COMPONENTS`] principal components of the exemplars' embeddings and
/// the nearest-prototype verifier selector. The router and an offline replay of its learner
/// (`bench::oracle_replay`) build them the same way.
pub fn router_features(exemplars: &[(String, String)]) -> (Vocabulary, Pca, VerifierSelector) {
    let texts: Vec<&str> = exemplars.iter().map(|(_, t)| t.as_str()).collect();
    let vocabulary = Vocabulary::fit(&texts);
    let points: Vec<_> = texts.iter().map(|t| vocabulary.embed(t)).collect();
    let pca = Pca::fit(&points, COMPONENTS);
    let selector = VerifierSelector::fit(&vocabulary, exemplars);
    (vocabulary, pca, selector)
}

/// The router and the bindings of the programs it has not forgotten yet.
#[derive(Debug, Clone)]
pub struct RoutedPrograms {
    router: Router,
    arms: Vec<DeploymentId>,
    live: BTreeMap<u64, RouteRecord>,
    features: u64,
}

/// What one landed verdict taught the learner: the program's deployment, its context and the
/// reward. Another router over the same features ([`RoutedPrograms::features_digest`]) learns the
/// same from it ([`RoutedPrograms::relearn`]) — how a restarted server keeps what its router
/// learned.
#[derive(Debug, Clone, PartialEq)]
pub struct LearnedOutcome {
    pub deployment: DeploymentId,
    pub context: Vec<f64>,
    pub reward: f64,
}

/// The version of how contexts are computed from exemplars and requests (tokenisation, TF-IDF,
/// PCA, classifier): bump it when any of that changes, so that outcomes learned before are not
/// relearned as if they meant the same.
pub const FEATURES_VERSION: u64 = 1;

/// FNV-1a ([`super::embed::fnv1a`]) over [`FEATURES_VERSION`], the context length, the reward's
/// cost weight and scale (their bits) and the exemplars (verifier and text): the vocabulary, the
/// PCA basis and the verifier prototypes are functions of the exemplars, so two routers with
/// the same digest give every request the same context and price a verdict alike.
fn features_digest(exemplars: &[(String, String)], dim: usize, options: &RouterOptions) -> u64 {
    let head = [
        FEATURES_VERSION.to_string(),
        dim.to_string(),
        options.cost_weight.to_bits().to_string(),
        options.cost_scale.to_bits().to_string(),
    ];
    let parts: Vec<&str> = head
        .iter()
        .map(String::as_str)
        .chain(exemplars.iter().flat_map(|(v, t)| [v.as_str(), t.as_str()]))
        .collect();
    super::embed::fnv1a(&parts)
}

impl RoutedPrograms {
    pub fn new(setup: RoutingSetup) -> Result<Self, RouterError> {
        let n = setup.arms.len();
        if n == 0
            || setup.capacity_tokens.len() != n
            || setup.prior_peak_tokens.len() != n
            || setup.exemplars.is_empty()
        {
            return Err(RouterError::Config);
        }
        let (vocabulary, pca, selector) = router_features(&setup.exemplars);
        let verifiers = selector.verifiers().count();
        let dim = Router::context_dim(verifiers, pca.len());
        let learner = LinUcb::new(n, dim, ALPHA_UCB, true)?;
        let features = features_digest(&setup.exemplars, dim, &setup.options);
        let mut ledgers = Vec::with_capacity(n);
        for (cap, c0) in setup.capacity_tokens.iter().zip(&setup.prior_peak_tokens) {
            ledgers.push(Ledger::new(*cap, *c0, setup.prior_run_s, setup.options.disc)?);
        }
        let router = Router::new(vocabulary, pca, selector, learner, ledgers, setup.options)?;
        Ok(RoutedPrograms { router, arms: setup.arms, live: BTreeMap::new(), features })
    }

    /// A digest of the learner's features (the exemplars it was built from): a
    /// [`LearnedOutcome`] recorded under one digest means the same to any router with it.
    pub fn features_digest(&self) -> u64 {
        self.features
    }

    /// Teach the learner what an earlier router over the same features learned (a verdict that
    /// landed before a restart). Refused for a deployment outside every route or a context of
    /// another length; nothing is learned then.
    pub fn relearn(&mut self, outcome: &LearnedOutcome) -> Result<(), RouterError> {
        let arm = self.arm(outcome.deployment).ok_or(RouterError::Config)?;
        self.router.relearn(arm, &outcome.context, outcome.reward)
    }

    /// Routed `program` ended under an earlier router over the same features and awaited its
    /// verdict at a restart: its decision on `deployment` for `context` is pending again and its
    /// verdict lands with [`Self::verdict`] (or it is given up with [`Self::abandon`]). `program`
    /// must not collide with a program this run binds. Refused for a deployment outside every
    /// route, a bound program or a context of another length.
    pub fn restore_awaiting(
        &mut self,
        program: u64,
        deployment: DeploymentId,
        context: Vec<f64>,
        verifier: &str,
        now: f64,
    ) -> Result<(), RouterError> {
        let arm = self.arm(deployment).ok_or(RouterError::Config)?;
        self.router.restore_awaiting(program, arm, context, verifier.to_string())?;
        let record = RouteRecord {
            deployment,
            chosen: deployment,
            verifier: verifier.to_string(),
            bound_at: now,
            admitted_at: None,
            peak_tokens: 0,
        };
        self.live.insert(program, record);
        Ok(())
    }

    /// The learner's context of bound `program`'s first request (what a verdict teaches it with).
    pub fn context(&self, program: u64) -> Option<&[f64]> {
        self.router.binding(program).map(|b| b.context.as_slice())
    }

    /// The KV capacity deployment `d`'s ledger reserves from (`None` outside every route).
    pub fn capacity_tokens(&self, d: DeploymentId) -> Option<u64> {
        self.arm(d).and_then(|arm| self.router.ledger(arm)).map(super::disc::Ledger::capacity_tokens)
    }

    /// The one-replica KV capacity deployment `d`'s ledger was built with (`None` outside every
    /// route): what names its backend in a journal, whatever its replicas are now.
    pub fn base_capacity_tokens(&self, d: DeploymentId) -> Option<u64> {
        self.arm(d).and_then(|arm| self.router.ledger(arm)).map(super::disc::Ledger::engine_tokens)
    }

    /// DISC's ledger is kept per model over its replicas (paper 002 §4): `replicas` gives each
    /// replica the planner holds (loading, waking or awake), by deployment, as a share of the
    /// one replica its ledger was built with (on the pool's largest device: 1.0 there, less on a
    /// smaller one). Each routed deployment's pool becomes that many times the built capacity (a
    /// model whose one replica sits on a smaller device reserves from that device's KV, not the
    /// largest's; a model without a replica yet is admitted against the replica a load would
    /// bring). Answers the programs the ledgers admit now (admission time `now`).
    pub fn follow_replicas(&mut self, replicas: &[(DeploymentId, f64)], now: f64) -> Vec<u64> {
        let mut changed = false;
        for (arm, d) in self.arms.iter().enumerate() {
            let shares: f64 = replicas.iter().filter(|(r, _)| r == d).map(|(_, s)| s.max(0.0)).sum();
            changed |= self.router.set_replicas(arm, shares);
        }
        if changed { self.admit(now) } else { Vec::new() }
    }

    /// What deployment `d`'s ledger has learned (`None` outside every route).
    pub fn ledger_learned(&self, d: DeploymentId) -> Option<super::disc::LedgerLearned> {
        self.arm(d).and_then(|arm| self.router.ledger(arm)).map(super::disc::Ledger::learned)
    }

    /// Give deployment `d`'s ledger what an earlier ledger of its backend learned (a restart):
    /// refused for a deployment outside every route or a learned state that is not valid.
    pub fn restore_ledger(&mut self, d: DeploymentId, learned: &super::disc::LedgerLearned) -> Result<(), RouterError> {
        let arm = self.arm(d).ok_or(RouterError::Config)?;
        self.router.restore_ledger(arm, learned)
    }

    /// The DISC settings the router runs with.
    pub fn disc(&self) -> DiscConfig {
        self.router_options().disc
    }

    fn router_options(&self) -> RouterOptions {
        self.router.options()
    }

    fn arm(&self, d: DeploymentId) -> Option<usize> {
        self.arms.iter().position(|a| *a == d)
    }

    /// An engine usage observation from one replica of deployment `d` (DISC's δ̂, Appendix B:
    /// the KV it holds against its running requests' tokens); whether `d`'s ledger learned from
    /// it (`false` for a deployment outside every route, or a saturated engine). The observation
    /// stands for `steps` engine steps.
    pub fn observe_usage(
        &mut self,
        d: DeploymentId,
        used_tokens: u64,
        context_tokens: u64,
        running: u32,
        steps: u32,
    ) -> bool {
        self.arm(d).is_some_and(|arm| self.router.observe_usage(arm, used_tokens, context_tokens, running, steps))
    }

    /// The verifiers the router's classifier selects among (fixed when it was built).
    pub fn verifiers(&self) -> Vec<String> {
        self.router.verifiers().map(str::to_string).collect()
    }

    /// Whether `d` is a member of some route (has a ledger).
    pub fn routes(&self, d: DeploymentId) -> bool {
        self.arm(d).is_some()
    }

    /// δ̂ of deployment `d`'s ledger (`None` outside every route).
    pub fn allowance(&self, d: DeploymentId) -> Option<f64> {
        self.arm(d).and_then(|arm| self.router.ledger(arm)).map(|l| l.allowance())
    }

    /// Bind `program` (its task text and first prompt's tokens) to a member of `route`; returns
    /// its row (admitted at once when its `admitted_at` is set) and every program admitted now.
    pub fn bind(
        &mut self,
        program: u64,
        route: &[DeploymentId],
        task: &str,
        tokens: u64,
        now: f64,
    ) -> Result<(RouteRecord, Vec<u64>), RouterError> {
        let eligible: Vec<usize> =
            route.iter().map(|d| self.arm(*d).ok_or(RouterError::Config)).collect::<Result<_, _>>()?;
        if eligible.is_empty() {
            return Err(RouterError::Config);
        }
        let b = self.router.bind(program, task, tokens, &eligible)?.clone();
        self.keep(program, &b, now)
    }

    /// Bind `program` to member `deployment` without a choice (a binding it had before, e.g. in
    /// a journal, kept across a restart): see [`Router::bind_to`]. Answers as [`Self::bind`].
    pub fn bind_to(
        &mut self,
        program: u64,
        deployment: DeploymentId,
        task: &str,
        tokens: u64,
        now: f64,
    ) -> Result<(RouteRecord, Vec<u64>), RouterError> {
        let arm = self.arm(deployment).ok_or(RouterError::Config)?;
        let b = self.router.bind_to(program, task, tokens, arm)?.clone();
        self.keep(program, &b, now)
    }

    /// The row of `program`, just bound as `b`, and what the ledgers admit now (it among them,
    /// when its `admitted_at` is set).
    fn keep(&mut self, program: u64, b: &Binding, now: f64) -> Result<(RouteRecord, Vec<u64>), RouterError> {
        let record = RouteRecord {
            deployment: self.arms[b.model],
            chosen: self.arms[b.chosen],
            verifier: b.verifier.clone(),
            bound_at: now,
            admitted_at: None,
            peak_tokens: 0,
        };
        self.live.insert(program, record);
        let admitted = self.admit(now);
        let record = self.live.get(&program).cloned().ok_or(RouterError::Unbound(program))?;
        Ok((record, admitted))
    }

    /// The route members (the deployments the router chooses among), in arm order.
    pub fn members(&self) -> &[DeploymentId] {
        &self.arms
    }

    /// Admit what the ledgers can now; answers the programs admitted (their admission time is
    /// `now`).
    fn admit(&mut self, now: f64) -> Vec<u64> {
        let admitted: Vec<u64> = self.router.admit().into_iter().map(|(p, _)| p).collect();
        for p in &admitted {
            if let Some(r) = self.live.get_mut(p) {
                r.admitted_at = Some(now);
            }
        }
        admitted
    }

    /// A unit of `program` on `deployment` became ready holding `tokens` of KV at most (a no-op
    /// for a program that is not routed, and for a unit off the program's bound deployment — an
    /// unrouted node's call, such as an LLM judge's, is not part of what the bound model's ledger
    /// reserves, and no ledger reserves it).
    pub fn unit_ready(&mut self, program: u64, deployment: DeploymentId, tokens: u64) {
        if let Some(r) = self.live.get_mut(&program)
            && r.deployment == deployment
        {
            r.peak_tokens = r.peak_tokens.max(tokens);
        }
    }

    /// The program ended (its last call returned): release its reservation, learning its peak
    /// context and its run time since admission (one that never was admitted leaves its queue);
    /// answers the programs the ledgers admit now.
    pub fn finished(&mut self, program: u64, now: f64) -> Result<Vec<u64>, RouterError> {
        let Some(r) = self.live.get(&program) else { return Err(RouterError::Unbound(program)) };
        let run_s = r.admitted_at.map_or(0.0, |t| (now - t).max(0.0));
        self.router.finished(program, r.peak_tokens, run_s)?;
        Ok(self.admit(now))
    }

    /// The program's verdict landed: the learner's update (what it learned returned, with the
    /// programs the ledgers admit now). Its row goes.
    pub fn verdict(
        &mut self,
        program: u64,
        success: f64,
        cost: f64,
        now: f64,
    ) -> Result<(LearnedOutcome, Vec<u64>), RouterError> {
        let (arm, context) = match self.router.binding(program) {
            Some(b) => (b.model, b.context.clone()),
            None => return Err(RouterError::Unbound(program)),
        };
        let reward = self.router.verdict(program, success, cost)?;
        self.live.remove(&program);
        let learned = LearnedOutcome { deployment: self.arms[arm], context, reward };
        Ok((learned, self.admit(now)))
    }

    /// A program that cannot be verified (it failed): release what it holds, forget it.
    pub fn abandon(&mut self, program: u64, now: f64) -> Result<Vec<u64>, RouterError> {
        self.router.abandon(program)?;
        self.live.remove(&program);
        Ok(self.admit(now))
    }

    /// The row of a bound program not yet verified.
    pub fn record(&self, program: u64) -> Option<&RouteRecord> {
        self.live.get(&program)
    }

    pub fn router(&self) -> &Router {
        &self.router
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MATH: &str = "Tom has 5 apples and buys 3 more. How many apples does Tom have now?";

    fn setup(capacity: u64) -> RoutingSetup {
        let exemplars = [
            ("exact_answer", "Natalia sold 48 clips in April and half as many in May. How many clips did she sell?"),
            ("exact_answer", "Weng earns $12 an hour. She worked 50 minutes. How much did she earn?"),
            ("tests_pass", "Write a python function to find the first repeated character in a string."),
            ("tests_pass", "Write a python function to check whether a number is prime."),
        ];
        RoutingSetup {
            arms: vec![DeploymentId(3), DeploymentId(5), DeploymentId(7)],
            capacity_tokens: vec![capacity; 3],
            prior_peak_tokens: vec![1_000.0; 3],
            prior_run_s: 60.0,
            exemplars: exemplars.iter().map(|(v, t)| (v.to_string(), t.to_string())).collect(),
            options: RouterOptions::default(),
        }
    }

    #[test]
    fn a_program_is_bound_within_its_route_and_learns_from_its_verdict() {
        let mut p = RoutedPrograms::new(setup(1_000_000)).unwrap();
        let route = [DeploymentId(5), DeploymentId(7)];
        // Untrained, the learner explores: each binding's pending decision narrows its arm's
        // width, so the next program goes to the other member — never to the arm outside the
        // route.
        let mut seen = Vec::new();
        for program in 0..4 {
            let (r, admitted) = p.bind(program, &route, MATH, 100, 0.0).unwrap();
            assert_eq!(admitted, vec![program]);
            assert_eq!(r.verifier, "exact_answer");
            assert!(route.contains(&r.deployment), "{r:?}");
            seen.push(r.deployment);
        }
        assert!(seen.contains(&DeploymentId(5)) && seen.contains(&DeploymentId(7)), "{seen:?}");
        assert_eq!(p.bind(0, &route, MATH, 100, 0.0).unwrap_err(), RouterError::Bound(0));
        assert_eq!(p.bind(9, &[DeploymentId(4)], MATH, 100, 0.0).unwrap_err(), RouterError::Config, "not an arm");
        // Verdicts: member 7 succeeds, member 5 fails; the learner then prefers 7.
        for program in 0..4 {
            let d = p.record(program).unwrap().deployment;
            p.unit_ready(program, d, 900);
            p.finished(program, 30.0).unwrap();
            let good = p.record(program).unwrap().deployment == DeploymentId(7);
            p.verdict(program, if good { 1.0 } else { 0.0 }, 0.0, 60.0).unwrap();
        }
        for program in 10..40 {
            let (r, _) = p.bind(program, &route, MATH, 100, 40.0).unwrap();
            p.unit_ready(program, r.deployment, 900);
            p.finished(program, 50.0).unwrap();
            let good = r.deployment == DeploymentId(7);
            p.verdict(program, if good { 1.0 } else { 0.0 }, 0.0, 60.0).unwrap();
        }
        let (r, _) = p.bind(100, &route, MATH, 100, 60.0).unwrap();
        assert_eq!(r.deployment, DeploymentId(7), "the learner prefers the member that succeeds");
        assert!(p.record(3).is_none(), "a verified program's row is gone");
    }

    #[test]
    fn the_ledger_is_kept_over_the_models_replicas() {
        // One replica's pool of 10,000 tokens: 85 % admits 8 programs of 1,000 (the prior ĉ).
        let mut p = RoutedPrograms::new(setup(10_000)).unwrap();
        let d = DeploymentId(5);
        let mut admitted = Vec::new();
        for program in 0..30 {
            let (_, now) = p.bind_to(program, d, MATH, 100, 0.0).unwrap();
            admitted.extend(now);
        }
        let one = admitted.len();
        assert_eq!(one, 8, "{admitted:?}");
        // A second replica of the same size: the pool is both, and the queue moves at once.
        let more = p.follow_replicas(&[(d, 1.0), (d, 1.0), (DeploymentId(7), 1.0)], 5.0);
        assert_eq!(p.capacity_tokens(d), Some(20_000));
        assert_eq!(one + more.len(), 17, "about twice as many: {more:?}");
        assert!(more.iter().all(|x| p.record(*x).is_some_and(|r| r.admitted_at == Some(5.0))));
        assert!(p.follow_replicas(&[(d, 1.0), (d, 1.0)], 6.0).is_empty(), "no change, no admission");
        // A replica on a device with half the KV counts for half.
        p.follow_replicas(&[(d, 1.0), (d, 1.0), (d, 0.5)], 6.5);
        assert_eq!(p.capacity_tokens(d), Some(25_000));
        // The replicas go: never below the one-replica pool it was built with, which still
        // names its backend.
        assert!(p.follow_replicas(&[], 7.0).is_empty());
        assert_eq!((p.capacity_tokens(d), p.base_capacity_tokens(d)), (Some(10_000), Some(10_000)));
        assert_eq!(p.capacity_tokens(DeploymentId(7)), Some(10_000));
        // Its only replica on a device with 60 % of the KV: the pool is that device's, not the
        // largest device's.
        p.follow_replicas(&[(d, 0.6)], 7.5);
        assert_eq!(p.capacity_tokens(d), Some(6_000));
        // The per-engine checks stay one engine's: 9,600 tokens on one engine is past its 95 %
        // ceiling (saturated, not a sample of δ̂) however many replicas the pool has.
        p.follow_replicas(&[(d, 1.0), (d, 1.0)], 8.0);
        assert!(!p.observe_usage(d, 9_600, 9_000, 3, 1), "a saturated engine teaches nothing");
        assert!(p.observe_usage(d, 9_000, 8_700, 3, 1));
    }

    #[test]
    fn a_program_awaiting_its_verdict_at_a_restart_is_verified_by_the_next_router() {
        // The first router binds a program; it ends; the router stops before its verdict.
        let mut first = RoutedPrograms::new(setup(1_000_000)).unwrap();
        let route = [DeploymentId(5), DeploymentId(7)];
        let (r, _) = first.bind(0, &route, MATH, 100, 0.0).unwrap();
        first.unit_ready(0, r.deployment, 900);
        first.finished(0, 30.0).unwrap();
        let context = first.context(0).unwrap().to_vec();
        // The next router records the decision again: pending, it narrows that arm's width
        // (the learner's pending term) before any verdict, and holds no reservation.
        let mut second = RoutedPrograms::new(setup(10)).unwrap();
        let arm = |d: DeploymentId| second.members().iter().position(|m| *m == d).unwrap();
        let (a, other) = (arm(r.deployment), arm(if r.deployment == DeploymentId(5) { DeploymentId(7) } else { DeploymentId(5) }));
        let before = second.router().learner().evaluate(&context).unwrap();
        second.restore_awaiting(1 << 32, r.deployment, context.clone(), "exact_answer", 40.0).unwrap();
        assert_eq!(second.router().learner().counts(a), Some((1, 0)));
        let pending = second.router().learner().evaluate(&context).unwrap();
        assert!(pending.index(a) < before.index(a), "{} vs {}", pending.index(a), before.index(a));
        assert_eq!(pending.index(other), before.index(other));
        // A ledger of 10 tokens admits nothing; the restored program needs no admission.
        assert_eq!(second.record(1 << 32).map(|r| (r.deployment, r.admitted_at)), Some((r.deployment, None)));
        // Its verdict lands as the first router's would have: the same outcome.
        let (outcome, _) = second.verdict(1 << 32, 1.0, 0.0, 50.0).unwrap();
        let (expected, _) = first.verdict(0, 1.0, 0.0, 50.0).unwrap();
        assert_eq!(outcome, expected);
        assert_eq!(second.router().learner().counts(a), Some((1, 1)));
        assert!(second.record(1 << 32).is_none());
        // Refused: a bound program, a deployment outside every route, a context of another length.
        second.restore_awaiting(7 << 32, r.deployment, context.clone(), "exact_answer", 60.0).unwrap();
        assert_eq!(second.restore_awaiting(7 << 32, r.deployment, context.clone(), "exact_answer", 60.0).unwrap_err(), RouterError::Bound(7 << 32));
        assert_eq!(second.restore_awaiting(8 << 32, DeploymentId(4), context.clone(), "exact_answer", 60.0).unwrap_err(), RouterError::Config);
        assert!(second.restore_awaiting(9 << 32, r.deployment, context[1..].to_vec(), "exact_answer", 60.0).is_err());
        // Given up (its key was reused): its decision goes, no verdict lands afterwards.
        second.abandon(7 << 32, 70.0).unwrap();
        assert_eq!(second.verdict(7 << 32, 1.0, 0.0, 80.0).unwrap_err(), RouterError::Unbound(7 << 32));
        assert_eq!(second.router().learner().counts(a), Some((2, 1)), "the abandoned decision is not learned");
    }

    #[test]
    fn what_a_router_learned_teaches_a_fresh_router_over_the_same_features_the_same() {
        // A router learns from verdicts; a fresh one (a restart) relearns the outcomes it
        // recorded and then decides exactly as the first.
        let mut first = RoutedPrograms::new(setup(1_000_000)).unwrap();
        let route = [DeploymentId(5), DeploymentId(7)];
        let mut learned = Vec::new();
        for program in 0..12 {
            let (r, _) = first.bind(program, &route, MATH, 100, 0.0).unwrap();
            first.unit_ready(program, r.deployment, 900);
            first.finished(program, 30.0).unwrap();
            let good = r.deployment == DeploymentId(7);
            let (outcome, _) = first.verdict(program, if good { 1.0 } else { 0.0 }, 0.0, 40.0).unwrap();
            assert_eq!((outcome.deployment, outcome.reward), (r.deployment, if good { 1.0 } else { 0.0 }));
            learned.push(outcome);
        }
        let mut second = RoutedPrograms::new(setup(1_000_000)).unwrap();
        assert_eq!(second.features_digest(), first.features_digest());
        for o in &learned {
            second.relearn(o).unwrap();
        }
        let context = first.router().context(MATH).1;
        let a = first.router().learner().evaluate(&context).unwrap();
        let b = second.router().learner().evaluate(&context).unwrap();
        for m in 0..3 {
            assert!((a.index(m) - b.index(m)).abs() < 1e-9, "arm {m}: {} vs {}", a.index(m), b.index(m));
        }
        assert!(learned.iter().any(|o| o.deployment == DeploymentId(5)), "both members were tried");
        assert_eq!(second.bind(100, &route, MATH, 100, 50.0).unwrap().0.deployment, DeploymentId(7));
        // Without the outcomes, a fresh router decides otherwise (untrained, it ties and takes
        // the route's first member).
        let mut cold = RoutedPrograms::new(setup(1_000_000)).unwrap();
        assert_eq!(cold.bind(100, &route, MATH, 100, 50.0).unwrap().0.deployment, DeploymentId(5));
        cold.abandon(100, 50.0).unwrap();
        // Refused: a deployment outside every route, a context of another length; nothing learned.
        let mut bad = learned[0].clone();
        bad.deployment = DeploymentId(4);
        assert_eq!(cold.relearn(&bad).unwrap_err(), RouterError::Config);
        let mut short = learned[0].clone();
        short.context.pop();
        assert!(cold.relearn(&short).is_err());
        assert_eq!(cold.router().learner().counts(0), Some((0, 0)));
        // Other exemplars, another cost weight: another digest.
        let mut other = setup(1_000_000);
        other.exemplars[0].1.push_str(" Answer with a number.");
        assert_ne!(RoutedPrograms::new(other).unwrap().features_digest(), first.features_digest());
        let mut priced = setup(1_000_000);
        priced.options.cost_weight = 0.5;
        assert_ne!(RoutedPrograms::new(priced).unwrap().features_digest(), first.features_digest());
        assert_eq!(first.verdict(0, 1.0, 0.0, 60.0).unwrap_err(), RouterError::Unbound(0), "a verdict lands once");
    }

    #[test]
    fn a_full_ledger_gates_programs_until_one_finishes() {
        // Room for about one program (prior peak 1,000 tokens + allowance within 85 % of 1,500).
        let mut p = RoutedPrograms::new(setup(1_500)).unwrap();
        let route = [DeploymentId(3)];
        let (first, _) = p.bind(1, &route, MATH, 100, 0.0).unwrap();
        let (second, _) = p.bind(2, &route, MATH, 100, 0.0).unwrap();
        assert!(first.admitted_at.is_some() && second.admitted_at.is_none(), "the second waits in the ledger's FIFO");
        p.unit_ready(1, DeploymentId(3), 900);
        // A unit off the bound deployment (an unrouted node's call, e.g. an LLM judge's) is not
        // part of the program's peak.
        p.unit_ready(1, DeploymentId(9), 50_000);
        assert_eq!(p.record(1).unwrap().peak_tokens, 900);
        assert_eq!(p.finished(1, 10.0).unwrap(), vec![2], "the first's end admits the second");
        assert_eq!(p.record(2).unwrap().admitted_at, Some(10.0));
        // A program that ends while it waits (it needed no call of its model) leaves the queue.
        let (third, _) = p.bind(3, &route, MATH, 100, 11.0).unwrap();
        assert!(third.admitted_at.is_none());
        p.unit_ready(3, DeploymentId(3), 0);
        assert_eq!(p.finished(3, 12.0).unwrap(), Vec::<u64>::new());
        assert_eq!(p.verdict(3, 1.0, 0.0, 12.5).unwrap().1, Vec::<u64>::new());
        // A program abandoned while it waits frees its place in the queue too.
        let (fourth, _) = p.bind(4, &route, MATH, 100, 13.0).unwrap();
        assert!(fourth.admitted_at.is_none());
        p.abandon(4, 13.5).unwrap();
        p.unit_ready(2, DeploymentId(3), 900);
        assert_eq!(p.finished(2, 20.0).unwrap(), Vec::<u64>::new(), "nothing left to admit");
    }
}
