//! ORACLE's router (paper 002 §4.1–4.3): the program-ID table that binds each program, at its
//! first request, to a model and a verifier, composed of the pieces beside it.
//!
//! At a program's first request the router (1) embeds the request ([`super::embed`]) and picks
//! the verifier of its task type by nearest prototype; (2) builds the learner's context — a bias,
//! the task type one-hot, the request's principal components; (3) asks the learner
//! ([`super::linucb`]) for every model's selection index and takes the best; (4) with DISC on,
//! looks at every model's ledger ([`super::disc`]) and diverts the program once, before it
//! starts, to the model that the divert rule prefers most (the largest
//! (1 − β)·â − β·w / w₀ among those the rule lets it move to); (5) records the decision on the
//! model the program will run on and queues it in that model's ledger. Every later request of
//! the program uses the binding. When the program ends its reservation is released (its peak
//! context and run time teach the ledger) and its verifier runs — elsewhere, asynchronously;
//! the verdict lands with [`Router::verdict`] whenever it arrives and updates the learner then.
//! Routing never waits on a verdict.
//!
//! Pure: no I/O, no clock (run times are arguments), no randomness.
//!
//! Must not depend on anything outside `planner` (the core's rule).

use std::collections::BTreeMap;

use thiserror::Error;

use super::disc::{DiscConfig, Ledger, LedgerError, divert};
use super::embed::{Pca, SparseVec, VerifierSelector, Vocabulary};
use super::linucb::{Decision, LinUcb, LinUcbError, reward};

/// What the router refuses.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RouterError {
    #[error("a router needs at least one model, one ledger per model and at least one verifier")]
    Config,
    #[error("program {0} is already bound")]
    Bound(u64),
    #[error("program {0} is not bound")]
    Unbound(u64),
    #[error(transparent)]
    Learner(#[from] LinUcbError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// How the router is set up (the comparison configurations of §5 are other values here).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouterOptions {
    pub disc: DiscConfig,
    /// Reassign a program to another model's backend by the divert rule (off: admission only,
    /// the ablation of Fig. 7(a)).
    pub reassign: bool,
    /// The reward's cost weight a and scale (Appendix B.4).
    pub cost_weight: f64,
    pub cost_scale: f64,
}

impl Default for RouterOptions {
    fn default() -> Self {
        RouterOptions { disc: DiscConfig::default(), reassign: true, cost_weight: 0.0, cost_scale: 1.0 }
    }
}

/// One program's row of the lookup table.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    /// The model (learner arm and ledger) the program runs on.
    pub model: usize,
    /// The model the learner chose (differs from `model` when DISC diverted it).
    pub chosen: usize,
    pub verifier: String,
    /// The learner's context of the program's first request.
    pub context: Vec<f64>,
    /// Every model's selection index at the decision (â of the divert rule).
    pub index: Vec<f64>,
    /// Every model's forecast wait at the decision, seconds.
    pub waits: Vec<f64>,
}

/// The learner's context for an embedded request, and its verifier: a bias, the one-hot of the
/// verifier the selector picks (its first verifier if it picks none),
/// the request's principal components. Its length is [`Router::context_dim`].
pub fn learner_context(selector: &VerifierSelector, pca: &Pca, e: &SparseVec) -> (String, Vec<f64>) {
    let chosen = selector.select(e).map(|(v, _)| v).or_else(|| selector.verifiers().next()).unwrap_or_default();
    let mut x = vec![1.0];
    x.extend(selector.verifiers().map(|v| if v == chosen { 1.0 } else { 0.0 }));
    x.extend(pca.project(e));
    (chosen.to_string(), x)
}

/// The program-ID table with its learner, its verifier selector and one ledger per model.
#[derive(Debug, Clone)]
pub struct Router {
    vocabulary: Vocabulary,
    pca: Pca,
    selector: VerifierSelector,
    learner: LinUcb,
    ledgers: Vec<Ledger>,
    options: RouterOptions,
    table: BTreeMap<u64, Binding>,
}

impl Router {
    /// A router over `ledgers.len()` models. The learner's context is 1 + verifiers + PCA
    /// components features; `learner` must have that dimension and one arm per model.
    pub fn new(
        vocabulary: Vocabulary,
        pca: Pca,
        selector: VerifierSelector,
        learner: LinUcb,
        ledgers: Vec<Ledger>,
        options: RouterOptions,
    ) -> Result<Self, RouterError> {
        let verifiers: Vec<String> = selector.verifiers().map(str::to_string).collect();
        if ledgers.is_empty() || verifiers.is_empty() || learner.arms() != ledgers.len() {
            return Err(RouterError::Config);
        }
        if learner.dim() != Self::context_dim(verifiers.len(), pca.len()) {
            return Err(RouterError::Config);
        }
        Ok(Router { vocabulary, pca, selector, learner, ledgers, options, table: BTreeMap::new() })
    }

    /// The context length for `verifiers` task types and `components` principal components.
    pub fn context_dim(verifiers: usize, components: usize) -> usize {
        1 + verifiers + components
    }

    /// The verifier of a request and the learner's context for it: a bias, the task type
    /// one-hot, the request's principal components.
    pub fn context(&self, request: &str) -> (String, Vec<f64>) {
        learner_context(&self.selector, &self.pca, &self.vocabulary.embed(request))
    }

    /// Bind `program` at its first request (`tokens` of it): verifier, model, divert, ledger.
    /// `eligible` are the models the program may run on (its route; empty: every model).
    pub fn bind(&mut self, program: u64, request: &str, tokens: u64, eligible: &[usize]) -> Result<&Binding, RouterError> {
        let all: Vec<usize> = (0..self.ledgers.len()).collect();
        let eligible = if eligible.is_empty() { &all[..] } else { eligible };
        if eligible.iter().any(|&m| m >= self.ledgers.len()) {
            return Err(RouterError::Config);
        }
        let d = self.decision(program, request, tokens)?;
        // The best selection index among the eligible models (ties: the first listed).
        let chosen = eligible.iter().copied().fold(eligible[0], |best, m| if d.index[m] > d.index[best] { m } else { best });
        let mut model = chosen;
        if self.options.reassign {
            let (beta, w0) = (self.options.disc.beta, self.options.disc.w0_s);
            let score = |m: usize| (1.0 - beta) * d.index[m] - beta * d.waits[m] / w0.max(f64::MIN_POSITIVE);
            for &m in eligible {
                if m != chosen
                    && divert(beta, w0, d.index[chosen], d.index[m], d.waits[chosen], d.waits[m])
                    && score(m) > score(model)
                {
                    model = m;
                }
            }
        }
        self.commit(program, tokens, model, chosen, d)
    }

    /// Bind `program` to `model` without a choice: a binding made before (by an earlier process,
    /// recorded in a journal) that the program keeps. Its verifier and the learner's context
    /// come from its request as for [`Router::bind`]; the learner records the decision as its
    /// own, so the program's verdict teaches it; the model's ledger admits it like any other.
    pub fn bind_to(&mut self, program: u64, request: &str, tokens: u64, model: usize) -> Result<&Binding, RouterError> {
        if model >= self.ledgers.len() {
            return Err(RouterError::Config);
        }
        let d = self.decision(program, request, tokens)?;
        self.commit(program, tokens, model, model, d)
    }

    /// What a binding of `program` is decided on: its verifier and learner context, every
    /// model's selection index and forecast wait. Refused for a program bound already.
    fn decision(&self, program: u64, request: &str, tokens: u64) -> Result<Binding, RouterError> {
        if self.table.contains_key(&program) {
            return Err(RouterError::Bound(program));
        }
        let (verifier, context) = self.context(request);
        let decision: Decision = self.learner.evaluate(&context)?;
        let index: Vec<f64> = (0..self.ledgers.len()).map(|m| decision.index(m)).collect();
        let waits: Vec<f64> = self.ledgers.iter().map(|l| l.wait_forecast(tokens)).collect();
        Ok(Binding { model: 0, chosen: 0, verifier, context, index, waits })
    }

    /// Record `program` on `model` (the learner chose `chosen`): the model's ledger queues it,
    /// the learner records the decision (undone in the ledger if that fails), the table keeps it.
    fn commit(&mut self, program: u64, tokens: u64, model: usize, chosen: usize, d: Binding) -> Result<&Binding, RouterError> {
        self.ledgers[model].submit(program, tokens)?;
        if let Err(e) = self.learner.record(program, model, &d.context) {
            let _ = self.ledgers[model].withdraw(program);
            return Err(e.into());
        }
        self.table.insert(program, Binding { model, chosen, ..d });
        Ok(&self.table[&program])
    }

    /// Admit what each model's ledger can now (strictly FIFO per model): (program, model).
    pub fn admit(&mut self) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        for (m, l) in self.ledgers.iter_mut().enumerate() {
            out.extend(l.admit().into_iter().map(|p| (p, m)));
        }
        out
    }

    /// The binding of a program (every request after the first uses its model).
    pub fn binding(&self, program: u64) -> Option<&Binding> {
        self.table.get(&program)
    }

    /// The program's last call returned: release its reservation, learning its peak context and
    /// run time (since its admission). A program that ended before its ledger admitted it (it
    /// needed no call of that model) leaves the queue and teaches nothing. Its verifier runs
    /// next (elsewhere); the row stays until the verdict lands.
    pub fn finished(&mut self, program: u64, peak_tokens: u64, run_s: f64) -> Result<(), RouterError> {
        let b = self.table.get(&program).ok_or(RouterError::Unbound(program))?;
        let ledger = &mut self.ledgers[b.model];
        if ledger.is_admitted(program) {
            ledger.finish(program, peak_tokens, run_s)?;
        } else {
            ledger.withdraw(program)?;
        }
        Ok(())
    }

    /// The verdict of a finished program landed: update the learner with the reward
    /// (success − a·cost/scale) and drop the program's row. Returns the reward.
    pub fn verdict(&mut self, program: u64, success: f64, cost: f64) -> Result<f64, RouterError> {
        let model = self.table.get(&program).ok_or(RouterError::Unbound(program))?.model;
        if self.ledgers[model].is_admitted(program) || self.ledgers[model].withdraw(program).is_ok() {
            // A verdict before `finished`: release what the program still holds.
            let _ = self.ledgers[model].release(program);
        }
        let r = reward(success, cost, self.options.cost_weight, self.options.cost_scale);
        self.learner.land(program, r)?;
        self.table.remove(&program);
        Ok(r)
    }

    /// A program bound by an earlier router over the same features, ended and awaiting its
    /// verdict when that router stopped (a restart): the learner records its decision again —
    /// pending, so it counts in the width until its verdict lands — and the table keeps its row,
    /// with nothing reserved in any ledger (it ended). Its verdict then lands like any other
    /// ([`Self::verdict`]). Refused for an unknown model, a bound program or a context of
    /// another length.
    pub fn restore_awaiting(
        &mut self,
        program: u64,
        model: usize,
        context: Vec<f64>,
        verifier: String,
    ) -> Result<&Binding, RouterError> {
        if model >= self.ledgers.len() {
            return Err(RouterError::Config);
        }
        if self.table.contains_key(&program) {
            return Err(RouterError::Bound(program));
        }
        self.learner.record(program, model, &context)?;
        let b = Binding { model, chosen: model, verifier, context, index: Vec::new(), waits: Vec::new() };
        self.table.insert(program, b);
        Ok(&self.table[&program])
    }

    /// An outcome verified outside this router's table — `model` ran `request` and its verifier
    /// said `success` at `cost` (a calibration pass before deployment, another process's
    /// records): the learner learns it as a decision with its verdict. No ledger or table row
    /// is touched. Returns the reward.
    pub fn learn(&mut self, model: usize, request: &str, success: f64, cost: f64) -> Result<f64, RouterError> {
        let (_, context) = self.context(request);
        let r = reward(success, cost, self.options.cost_weight, self.options.cost_scale);
        self.relearn(model, &context, r)?;
        Ok(r)
    }

    /// Teach the learner an outcome recorded as a context and a reward (what an earlier
    /// router over the same features learned: [`crate::planner::routing::LearnedOutcome`]).
    pub fn relearn(&mut self, model: usize, context: &[f64], reward: f64) -> Result<(), RouterError> {
        if model >= self.ledgers.len() {
            return Err(RouterError::Config);
        }
        Ok(self.learner.observe(model, context, reward)?)
    }

    /// A program that failed before it could be verified: release whatever it holds and drop
    /// its row (its decision stays in the learner's width).
    pub fn abandon(&mut self, program: u64) -> Result<(), RouterError> {
        let b = self.table.remove(&program).ok_or(RouterError::Unbound(program))?;
        let ledger = &mut self.ledgers[b.model];
        if ledger.is_admitted(program) {
            ledger.release(program)?;
        } else {
            let _ = ledger.withdraw(program);
        }
        let _ = self.learner.abandon(program);
        Ok(())
    }

    /// An engine usage observation for `model`'s backend, standing for `weight` samples (e.g.
    /// the engine steps it covers; [`Ledger::observe_usage_weighted`]): whether it taught the
    /// allowance.
    pub fn observe_usage(
        &mut self,
        model: usize,
        used_tokens: u64,
        context_tokens: u64,
        running: u32,
        weight: u32,
    ) -> bool {
        self.ledgers.get_mut(model).is_some_and(|l| l.observe_usage_weighted(used_tokens, context_tokens, running, weight))
    }

    pub fn options(&self) -> RouterOptions {
        self.options
    }

    pub fn ledger(&self, model: usize) -> Option<&Ledger> {
        self.ledgers.get(model)
    }

    /// `model`'s backend now holds `replicas` engines' worth of KV (a replica on a smaller device
    /// counts for its share): its ledger's pool becomes that many engines
    /// ([`Ledger::set_capacity`]); with no replica at all, one engine (the replica its first
    /// admitted program's load brings). Whether that changed the pool.
    pub fn set_replicas(&mut self, model: usize, replicas: f64) -> bool {
        let Some(l) = self.ledgers.get_mut(model) else { return false };
        let engines = if replicas > 0.0 { replicas } else { 1.0 };
        let pool = (l.engine_tokens() as f64 * engines).round() as u64;
        if l.capacity_tokens() == pool.max(1) {
            return false;
        }
        l.set_capacity(pool);
        true
    }

    /// Give `model`'s ledger what an earlier ledger of its backend learned ([`Ledger::restore`]).
    pub fn restore_ledger(&mut self, model: usize, learned: &super::disc::LedgerLearned) -> Result<(), RouterError> {
        Ok(self.ledgers.get_mut(model).ok_or(RouterError::Config)?.restore(learned)?)
    }

    pub fn learner(&self) -> &LinUcb {
        &self.learner
    }

    /// The verifiers (task types) its classifier selects among, in the order of its prototypes.
    pub fn verifiers(&self) -> impl Iterator<Item = &str> {
        self.selector.verifiers()
    }

    /// Rows of the table (programs bound and not yet verified).
    pub fn programs(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::routing::embed::COMPONENTS;
    use crate::planner::routing::linucb::ALPHA_UCB;

    const MATH: &str = "Tom has 5 apples and buys 3 more. How many apples does Tom have now?";
    const CODE: &str = "Write a python function to reverse the words of a given string.";

    fn router(reassign: bool, capacity: u64) -> Router {
        let exemplars = [
            ("exact_answer", "Natalia sold 48 clips in April and half as many in May. How many clips did she sell?"),
            ("exact_answer", "Weng earns $12 an hour. She worked 50 minutes. How much did she earn?"),
            ("tests_pass", "Write a python function to find the first repeated character in a string."),
            ("tests_pass", "Write a python function to check whether a number is prime."),
        ];
        let texts: Vec<&str> = exemplars.iter().map(|e| e.1).collect();
        let vocabulary = Vocabulary::fit(&texts);
        let points: Vec<_> = texts.iter().map(|t| vocabulary.embed(t)).collect();
        let pca = Pca::fit(&points, COMPONENTS);
        let selector = VerifierSelector::fit(&vocabulary, &exemplars);
        let dim = Router::context_dim(2, pca.len());
        let learner = LinUcb::new(2, dim, ALPHA_UCB, true).unwrap();
        let ledgers =
            (0..2).map(|_| Ledger::new(capacity, 1_000.0, 100.0, DiscConfig::default()).unwrap()).collect();
        Router::new(vocabulary, pca, selector, learner, ledgers, RouterOptions { reassign, ..Default::default() })
            .unwrap()
    }

    #[test]
    fn a_program_is_bound_once_to_a_model_and_a_verifier_and_learns_from_its_verdict() {
        let mut r = router(true, 100_000);
        let b = r.bind(1, MATH, 200, &[]).unwrap().clone();
        assert_eq!(b.verifier, "exact_answer");
        assert_eq!((b.chosen, b.model), (0, 0), "an untrained learner ties; the first model");
        assert_eq!(b.context[..3], [1.0, 1.0, 0.0], "bias, then the task type one-hot");
        assert_eq!(r.bind(1, MATH, 200, &[]).unwrap_err(), RouterError::Bound(1));
        // Program 1's pending decision already narrows model 0's width (the pending term), so
        // the untrained learner explores model 1 for the next program.
        let b2 = r.bind(2, CODE, 200, &[]).unwrap();
        assert_eq!((b2.verifier.as_str(), b2.chosen), ("tests_pass", 1));
        assert_eq!(r.admit(), vec![(1, 0), (2, 1)]);
        r.finished(1, 900, 40.0).unwrap();
        assert_eq!(r.programs(), 2, "the row stays until the verdict");
        // The verdict lands later; the learner's estimate for model 0 moves then.
        let before = r.learner().evaluate(&b.context).unwrap().mean[0];
        assert_eq!(r.verdict(1, 1.0, 0.0).unwrap(), 1.0);
        let after = r.learner().evaluate(&b.context).unwrap().mean[0];
        assert!(after > before);
        assert_eq!(r.programs(), 1);
        assert_eq!(r.verdict(1, 1.0, 0.0).unwrap_err(), RouterError::Unbound(1));
        // A verdict that lands before the program's end releases what it still holds.
        assert_eq!(r.ledger(1).unwrap().admitted(), 1);
        r.verdict(2, 0.0, 0.0).unwrap();
        assert_eq!(r.ledger(1).unwrap().admitted(), 0);
        assert_eq!(r.finished(2, 100, 1.0).unwrap_err(), RouterError::Unbound(2));
        // A program id bound again while its first binding lives is refused without a trace.
        r.bind(3, CODE, 200, &[]).unwrap();
        assert_eq!(r.bind(3, CODE, 200, &[]).unwrap_err(), RouterError::Bound(3));
        r.abandon(3).unwrap();
        assert_eq!(r.programs(), 0);
    }

    #[test]
    fn a_kept_binding_takes_its_model_through_the_ledger_and_its_verdict_teaches_the_learner() {
        // An untrained learner would choose model 0 for this task; the program keeps model 1
        // (bound before a restart). Its verifier comes from its request all the same.
        let mut r = router(true, 100_000);
        let b = r.bind_to(1, MATH, 200, 1).unwrap().clone();
        assert_eq!((b.model, b.chosen, b.verifier.as_str()), (1, 1, "exact_answer"));
        assert_eq!(r.bind_to(1, MATH, 200, 1).unwrap_err(), RouterError::Bound(1));
        assert_eq!(r.bind_to(2, MATH, 200, 2).unwrap_err(), RouterError::Config, "no such model");
        assert_eq!(r.admit(), vec![(1, 1)], "model 1's ledger admits it");
        r.finished(1, 900, 40.0).unwrap();
        let before = r.learner().evaluate(&b.context).unwrap().mean[1];
        r.verdict(1, 1.0, 0.0).unwrap();
        assert!(r.learner().evaluate(&b.context).unwrap().mean[1] > before, "model 1's estimate moved");
        assert_eq!(r.programs(), 0);
    }

    #[test]
    fn outcomes_learned_before_deployment_steer_the_first_binding_and_touch_no_ledger() {
        // Untrained, the learner ties and binds to model 0; after calibration outcomes where
        // model 1 succeeds on math and model 0 fails, the first math program goes to model 1.
        let mut r = router(false, 100_000);
        for _ in 0..5 {
            assert_eq!(r.learn(1, MATH, 1.0, 0.0).unwrap(), 1.0);
            assert_eq!(r.learn(0, MATH, 0.0, 0.0).unwrap(), 0.0);
        }
        assert_eq!(r.learner().counts(1), Some((5, 5)));
        assert_eq!(r.learner().pending(), 0);
        assert_eq!((r.programs(), r.ledger(0).unwrap().queued(), r.ledger(1).unwrap().queued()), (0, 0, 0));
        assert_eq!(r.learn(2, MATH, 1.0, 0.0).unwrap_err(), RouterError::Config, "no such model");
        assert_eq!(r.bind(1, MATH, 200, &[]).unwrap().model, 1);
        // The reward is the router's own: with a cost weight, cost counts against success.
        let mut priced = router(false, 100_000);
        priced.options.cost_weight = 1.0;
        priced.options.cost_scale = 100.0;
        assert_eq!(priced.learn(0, CODE, 1.0, 50.0).unwrap(), 0.5);
    }

    #[test]
    fn disc_diverts_a_program_from_a_full_backend_and_the_ablation_does_not() {
        // Train the learner: model 0 succeeds on these tasks, model 1 fails (each program runs
        // 100 s and peaks at 1,000 tokens). Then a burst of twelve programs arrives before any
        // is admitted: model 0's queue grows, its forecast wait (q + 1)·100 s with nothing
        // admitted passes the accuracy gap priced at w₀ = 600 s, and DISC diverts the later
        // ones to the idle model 1 — unless reassignment is off.
        for reassign in [true, false] {
            let mut r = router(reassign, 10_000);
            for p in 100..160 {
                let model = r.bind(p, MATH, 100, &[]).unwrap().model;
                r.admit();
                r.finished(p, 1_000, 100.0).unwrap();
                r.verdict(p, if model == 0 { 1.0 } else { 0.0 }, 0.0).unwrap();
            }
            let mut moved = Vec::new();
            for p in 0..12 {
                let b = r.bind(p, MATH, 100, &[]).unwrap();
                assert_eq!(b.chosen, 0, "the trained learner prefers model 0");
                if b.model != b.chosen {
                    assert!(b.waits[1] < b.waits[0], "{b:?}");
                    moved.push(p);
                }
            }
            if reassign {
                assert!(!moved.is_empty() && !moved.contains(&0), "the first programs stay: {moved:?}");
            } else {
                assert!(moved.is_empty());
                assert_eq!(r.ledger(0).unwrap().queued(), 12);
            }
        }
    }
}
