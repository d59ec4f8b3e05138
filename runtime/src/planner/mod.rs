//! The planner core: a pure state machine, `Planner::handle_all(events, now) ->
//! Result<Vec<Command>, PlanError>` (a tick's events folded, then one planning pass).
//!
//! It owns the planner's *view* of the pool (devices, replicas and their leases, the queue of
//! ready units) and delegates every decision to a [`Policy`]. Invariants that no policy may
//! break are enforced here, in [`PlannerState`]'s `issue_*` methods: a leased replica is never
//! reclaimed, a load never over-commits device memory, a unit is dispatched only to an awake
//! replica of its deployment, and each unit is dispatched at most once.
//!
//! No I/O, no clock (time is the `now` argument), no randomness, no process-global state. It
//! must not depend on the shells (`sim`, `live`) or what they share (`exec`), on `bench` or
//! `lower_bound`, on the emulator crate, or on the tools crate: both shells (the simulator and
//! the live runtime) drive this same core (`runtime/tests/module_boundaries.rs` checks it).

pub mod admission;
pub mod estimates;
pub mod fusion;
mod joint;
mod kairos;
pub mod memory;
pub mod timeline;
pub mod profiled;
mod parrot;
pub mod routing;
mod state;
pub mod substrate;
pub mod tao;

pub use estimates::Estimates;
pub use joint::{Joint, JointOptions};
pub use kairos::Kairos;
pub use parrot::Parrot;
pub use substrate::Substrate;
pub use state::{
    AsleepReplica, ChainLink, DeploymentInfo, DeviceInfo, FusionChecks, NearReadyItem, PlanError, PlannerState, PrefetchChecks, PrefetchOutcome, TaoChecks,
    PriorContext, Reclaim, ReplicaPhase, ReplicaView, RunningUnit, WorkItem,
};

use serde::Serialize;

use crate::ids::{ActivationId, DeviceId, ReplicaId, SessionId};

/// Index of a deployment identity (model + dtype + serving configuration) in the planner's
/// deployment table. Identical deployments of different workflows share one identity, so their
/// units share replicas (paper 003 §2.3: cross-workflow sharing of model residency).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct DeploymentId(pub u32);

/// What happened, as reported by a shell.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A session of workflow `workflow` (index in the run's workflow list) arrived.
    SessionArrived { session: SessionId, workflow: u32 },
    /// An LLM activation became ready (all predecessors completed).
    UnitReady(WorkItem),
    /// A dispatched unit finished on `replica`.
    UnitFinished { activation: ActivationId, replica: ReplicaId, output_tokens: u32 },
    /// A ready unit the shell takes back before it was dispatched (a front-door call whose
    /// client went away): it leaves the queue and is never placed.
    UnitWithdrawn { activation: ActivationId },
    /// A load or a wake finished: the replica is awake and accepts requests.
    ReplicaLoaded { replica: ReplicaId },
    /// A sleep finished: the replica keeps only its sleep-mode remainder on the device.
    ReplicaAsleep { replica: ReplicaId },
    /// A teardown finished (or a replica that was to sleep was unloaded instead): its device
    /// memory is free.
    ReplicaUnloaded { replica: ReplicaId },
    /// A load could not be carried out (the engine refused the deployment on that device).
    ReplicaLoadFailed { replica: ReplicaId, reason: String },
    /// An activation became near-ready (paper 003 §3.2).
    UnitNearReady(NearReadyItem),
    /// A tool activation started, with the shell's predicted duration; tools hold no GPU.
    ToolStarted { activation: ActivationId, predicted_s: f64, workflow: u32, node: u32 },
    ToolFinished { activation: ActivationId },
    /// The deployments session `session` can still call, from its frontier on (the nodes
    /// reachable in its workflow graph, a loop's whole body while another round may run):
    /// replaces what the session said before. The graph-wide successor demand behind
    /// resource ordering (paper 003 §2.3: a constrained *successor*), beyond the near-ready
    /// window.
    SessionOutlook { session: SessionId, deployments: Vec<DeploymentId> },
    /// The session completed or failed: nothing more will come from it.
    SessionEnded { session: SessionId },
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Command {
    /// Start loading `deployment` as a new replica on `device`.
    Load { replica: ReplicaId, deployment: DeploymentId, device: DeviceId },
    /// Reclaim an idle replica or a sleeper: tear the engine down and free its device memory
    /// (answered by `ReplicaUnloaded`).
    Unload { replica: ReplicaId },
    /// Put an idle replica to sleep (vLLM sleep mode `level` 1 or 2; answered by
    /// `ReplicaAsleep`, or by `ReplicaUnloaded` when the engine cannot sleep).
    Sleep { replica: ReplicaId, level: u8 },
    /// Wake a sleeping replica (answered by `ReplicaLoaded`).
    Wake { replica: ReplicaId },
    /// Admit a ready unit to a replica (a grant; its lease lasts until the unit finishes).
    Dispatch { activation: ActivationId, replica: ReplicaId },
}

/// A scheduling policy: the decisions, given the planner's view. Implementations must be
/// deterministic functions of the state and `now`.
pub trait Policy: Send {
    /// Stable name used on the CLI and in reports.
    fn name(&self) -> &'static str;
    /// Whether the policy fuses same-deployment chains (holds leases across links).
    fn fuses_chains(&self) -> bool {
        false
    }
    /// See an event after the view folded it in (history, predictions). Default: nothing.
    fn observe(&mut self, _event: &Event, _state: &PlannerState, _now: f64) {}
    /// Decide what to do now. Issue commands only through `state.issue_*`, which keeps the
    /// view consistent and enforces the invariants.
    fn plan(&mut self, state: &mut PlannerState, now: f64, out: &mut Vec<Command>);
    /// The earliest time after `now` (the last planning pass) at which a rule that waits (the
    /// substrate's upscale delay) may act though no event comes: the shell plans again then
    /// (an empty [`Planner::handle_all`]). `None`: nothing waits. Default: `None`.
    fn next_wakeup(&self, _now: f64) -> Option<f64> {
        None
    }
}

/// The names accepted by [`policy_by_name`].
pub const POLICIES: &[&str] = &["joint", "parrot", "kairos"];

/// Router program ids from here up are programs restored from an earlier run (ended, awaiting
/// their verdict: [`Planner::restore_awaiting`]); below it, a program's id is its session's.
pub const RESTORED_PROGRAMS: u64 = 1 << 32;

/// Build a policy from its CLI name. `options` switch the joint policy's mechanisms (the
/// ablations); `estimates` is the Predictor the policy plans with (baselines ignore both);
/// `substrate` is the serving substrate every policy shares (replica cap, reactive scale-out).
pub fn policy_by_name(
    name: &str,
    options: JointOptions,
    estimates: Box<dyn Estimates>,
    substrate: Substrate,
) -> Result<Box<dyn Policy>, PlanError> {
    match name {
        "joint" => Ok(Box::new(Joint::new(options, estimates).with_substrate(substrate))),
        "parrot" => Ok(Box::new(Parrot::new(substrate))),
        "kairos" => Ok(Box::new(Kairos::new(substrate))),
        other => Err(PlanError::UnknownPolicy(other.to_string(), POLICIES.join(", "))),
    }
}

/// The pure planner: state + policy, and ORACLE's router when the run has routed workflows.
pub struct Planner {
    state: PlannerState,
    policy: Box<dyn Policy>,
    routing: Option<routing::RoutedPrograms>,
}

impl Planner {
    pub fn new(
        devices: Vec<DeviceInfo>,
        deployments: Vec<DeploymentInfo>,
        policy: Box<dyn Policy>,
    ) -> Self {
        let mut state = PlannerState::new(devices, deployments);
        state.set_fusion(policy.fuses_chains());
        Planner { state, policy, routing: None }
    }

    /// The substrate's lifecycle settings: how idle replicas are reclaimed, each device's
    /// node (by device index) and each node's host memory in bytes.
    pub fn set_substrate_lifecycle(&mut self, reclaim: Reclaim, node_of: Vec<usize>, host_memory: Vec<u64>) {
        self.state.set_reclaim(reclaim);
        self.state.set_hosts(node_of, host_memory);
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// When, after `now`, the policy wants a planning pass though no event comes
    /// ([`Policy::next_wakeup`]).
    pub fn next_wakeup(&self, now: f64) -> Option<f64> {
        self.policy.next_wakeup(now)
    }

    pub fn state(&self) -> &PlannerState {
        &self.state
    }

    /// Fold one event into the view, then let the policy plan. Returns the commands to run.
    pub fn handle(&mut self, event: Event, now: f64) -> Result<Vec<Command>, PlanError> {
        self.handle_all(vec![event], now)
    }

    /// Route the run's routed workflows with ORACLE's router (paper 002) built from `setup`.
    pub fn set_routing(&mut self, setup: routing::RoutingSetup) -> Result<(), PlanError> {
        self.routing = Some(routing::RoutedPrograms::new(setup).map_err(|e| PlanError::Routing(e.to_string()))?);
        Ok(())
    }

    /// Bind the program of routed session `session` to a member of `route`: ORACLE's learner
    /// chooses by its task text (`task`; `tokens` of first prompt), DISC may divert it once,
    /// and until its model's ledger admits it its units stay out of the queue. Answers the
    /// deployment every routed node of the session runs on.
    pub fn bind_program(
        &mut self,
        session: SessionId,
        route: &[DeploymentId],
        task: &str,
        tokens: u64,
        now: f64,
    ) -> Result<routing::RouteRecord, PlanError> {
        let routing = self.router_mut()?;
        let bound = routing.bind(u64::from(session.0), route, task, tokens, now);
        self.gate_bound(session, bound)
    }

    /// A program just bound: gated until its ledger admits it; the others its ledger admitted
    /// now join the queue.
    fn gate_bound(
        &mut self,
        session: SessionId,
        bound: Result<(routing::RouteRecord, Vec<u64>), routing::RouterError>,
    ) -> Result<routing::RouteRecord, PlanError> {
        let (record, admitted) = bound.map_err(|e| PlanError::Routing(e.to_string()))?;
        if record.admitted_at.is_none() {
            self.state.gate(session);
        }
        for p in admitted.into_iter().filter(|p| *p != u64::from(session.0)) {
            self.state.ungate(SessionId(p as u32));
        }
        Ok(record)
    }

    /// Bind the program of session `session` to member `deployment` without a choice — a
    /// binding it already had (a front-door program's, journaled before a restart): the learner
    /// records it as its decision and the member's ledger admits it as for [`Self::bind_program`].
    pub fn bind_program_to(
        &mut self,
        session: SessionId,
        deployment: DeploymentId,
        task: &str,
        tokens: u64,
        now: f64,
    ) -> Result<routing::RouteRecord, PlanError> {
        let routing = self.router_mut()?;
        let bound = routing.bind_to(u64::from(session.0), deployment, task, tokens, now);
        self.gate_bound(session, bound)
    }

    /// The verdict of routed session `session` landed (its verifier ran after the session
    /// ended): update the learner. Answers what it learned (the reward in it). A session that
    /// was never routed, or whose verdict already landed, is an error.
    pub fn program_verdict(
        &mut self,
        session: SessionId,
        success: f64,
        cost: f64,
        now: f64,
    ) -> Result<routing::LearnedOutcome, PlanError> {
        self.verdict_of(u64::from(session.0), success, cost, now)
    }

    /// A routed program that ended under an earlier router over the same features and awaited
    /// its verdict at a restart ([`routing::RoutedPrograms::restore_awaiting`]): `program` is an
    /// id outside this run's sessions (see [`RESTORED_PROGRAMS`]); its verdict lands with
    /// [`Self::restored_verdict`], or it is given up with [`Self::restored_abandoned`].
    pub fn restore_awaiting(
        &mut self,
        program: u64,
        deployment: DeploymentId,
        context: Vec<f64>,
        verifier: &str,
        now: f64,
    ) -> Result<(), PlanError> {
        if program < RESTORED_PROGRAMS {
            return Err(PlanError::Routing(format!("restored program {program} would collide with a session")));
        }
        let routing = self.router_mut()?;
        routing.restore_awaiting(program, deployment, context, verifier, now).map_err(|e| PlanError::Routing(e.to_string()))
    }

    /// The verdict of restored `program` ([`Self::restore_awaiting`]) landed.
    pub fn restored_verdict(
        &mut self,
        program: u64,
        success: f64,
        cost: f64,
        now: f64,
    ) -> Result<routing::LearnedOutcome, PlanError> {
        Self::check_restored(program)?;
        self.verdict_of(program, success, cost, now)
    }

    /// Restored `program` will get no verdict (its key was reused): its decision is dropped.
    pub fn restored_abandoned(&mut self, program: u64, now: f64) -> Result<(), PlanError> {
        Self::check_restored(program)?;
        self.abandon_of(program, now)
    }

    /// Give deployment `d`'s DISC ledger what an earlier run's ledger of its backend learned
    /// ([`routing::RoutedPrograms::restore_ledger`]).
    pub fn restore_ledger(&mut self, d: DeploymentId, learned: &routing::LedgerLearned) -> Result<(), PlanError> {
        let routing = self.router_mut()?;
        routing.restore_ledger(d, learned).map_err(|e| PlanError::Routing(e.to_string()))
    }

    /// The learner's context of routed session `session`'s first request (`None`: not routed,
    /// or no router).
    pub fn program_context(&self, session: SessionId) -> Option<Vec<f64>> {
        self.routing.as_ref()?.context(u64::from(session.0)).map(<[f64]>::to_vec)
    }

    /// The digest of the router's features ([`routing::RoutedPrograms::features_digest`]); `None` in a
    /// run without a router.
    pub fn routing_features_digest(&self) -> Option<u64> {
        self.routing.as_ref().map(routing::RoutedPrograms::features_digest)
    }

    /// Teach the router's learner what an earlier router over the same features learned
    /// ([`routing::RoutedPrograms::relearn`]).
    pub fn relearn(&mut self, outcome: &routing::LearnedOutcome) -> Result<(), PlanError> {
        let routing = self.router_mut()?;
        routing.relearn(outcome).map_err(|e| PlanError::Routing(e.to_string()))
    }

    /// DISC's usage observation from one replica of deployment `d`: the KV it holds
    /// (`used_tokens`) for `running` requests whose contexts sum to `context_tokens`. Teaches
    /// the ledger of a routed deployment its per-request allowance δ̂; a no-op otherwise (and in
    /// a run without a router). It stands for `steps` engine steps (an observer that samples
    /// once per planned run of steps weights it by them). Answers whether a ledger learned.
    pub fn observe_backend_usage(
        &mut self,
        d: DeploymentId,
        used_tokens: u64,
        context_tokens: u64,
        running: u32,
        steps: u32,
    ) -> bool {
        self.routing.as_mut().is_some_and(|r| r.observe_usage(d, used_tokens, context_tokens, running, steps))
    }

    /// The verifiers the router's classifier selects among; `None` in a run without a router.
    pub fn routing_verifiers(&self) -> Option<Vec<String>> {
        self.routing.as_ref().map(|r| r.verifiers())
    }

    /// Whether deployment `d` is routed (DISC keeps a ledger for it).
    pub fn is_routed(&self, d: DeploymentId) -> bool {
        self.routing.as_ref().is_some_and(|r| r.routes(d))
    }

    /// The per-request allowance δ̂ DISC's ledger of routed deployment `d` has learned.
    pub fn backend_allowance(&self, d: DeploymentId) -> Option<f64> {
        self.routing.as_ref().and_then(|r| r.allowance(d))
    }

    /// Let session `session`'s held units into the queue: a shell that withdrew the binding of a
    /// program that goes on unrouted (its binding could not be recorded) calls it after
    /// [`Self::program_abandoned`], which does not ungate the program itself.
    pub fn ungate(&mut self, session: SessionId) {
        self.state.ungate(session);
    }

    /// A routed session that cannot be verified (it failed): it releases what it holds and
    /// teaches the ledger nothing. Shells call it before the session's `SessionEnded`.
    pub fn program_abandoned(&mut self, session: SessionId, now: f64) -> Result<(), PlanError> {
        self.abandon_of(u64::from(session.0), now)
    }

    fn router_mut(&mut self) -> Result<&mut routing::RoutedPrograms, PlanError> {
        self.routing.as_mut().ok_or_else(|| PlanError::Routing("this run has no router".into()))
    }

    /// Programs a ledger admitted: their units may run.
    fn ungate_admitted(&mut self, admitted: Vec<u64>) {
        for p in admitted {
            self.state.ungate(SessionId(p as u32));
        }
    }

    /// Router program `program`'s verdict lands (a session's, or a restored one's).
    fn verdict_of(&mut self, program: u64, success: f64, cost: f64, now: f64) -> Result<routing::LearnedOutcome, PlanError> {
        let (learned, admitted) =
            self.router_mut()?.verdict(program, success, cost, now).map_err(|e| PlanError::Routing(e.to_string()))?;
        self.ungate_admitted(admitted);
        Ok(learned)
    }

    /// Router program `program` gets no verdict: what it holds goes.
    fn abandon_of(&mut self, program: u64, now: f64) -> Result<(), PlanError> {
        let admitted = self.router_mut()?.abandon(program, now).map_err(|e| PlanError::Routing(e.to_string()))?;
        self.ungate_admitted(admitted);
        Ok(())
    }

    fn check_restored(program: u64) -> Result<(), PlanError> {
        if program < RESTORED_PROGRAMS {
            return Err(PlanError::Routing(format!("program {program} was not restored")));
        }
        Ok(())
    }

    /// The router, when the run has one.
    pub fn routing(&self) -> Option<&routing::RoutedPrograms> {
        self.routing.as_ref()
    }

    /// Fold every event of one scheduling tick (all that happened at `now`), then plan once:
    /// the window the policy sees holds all of them.
    pub fn handle_all(&mut self, events: Vec<Event>, now: f64) -> Result<Vec<Command>, PlanError> {
        // Outlooks alone change no unit's readiness and no replica: they are folded in and the
        // next event plans with them (a planning pass per outlook would re-plan mid-tick). No
        // event at all is a planning pass the shell asks for (after a verdict ungated programs).
        let informational =
            !events.is_empty() && events.iter().all(|e| matches!(e, Event::SessionOutlook { .. }));
        let mut routing_error = None;
        for event in events {
            // A routed program that ended releases its ledger reservation (its peak context and
            // run time teach the ledger) and may admit the next ones. The state sees the end
            // whatever the router says.
            let ended = match (&event, self.routing.as_mut()) {
                (Event::SessionEnded { session }, _) => Some(*session),
                (Event::UnitReady(item), Some(routing)) => {
                    let tokens = u64::from(item.envelope.0) + u64::from(item.envelope.1);
                    routing.unit_ready(u64::from(item.activation.session.0), item.deployment, tokens);
                    None
                }
                _ => None,
            };
            self.state.observe(event.clone(), now)?;
            self.policy.observe(&event, &self.state, now);
            if let (Some(session), Some(routing)) = (ended, self.routing.as_mut())
                && routing.record(u64::from(session.0)).is_some()
            {
                match routing.finished(u64::from(session.0), now) {
                    Ok(admitted) => {
                        for p in admitted {
                            self.state.ungate(SessionId(p as u32));
                        }
                    }
                    Err(e) => routing_error = routing_error.or(Some(PlanError::Routing(format!("session {session}: {e}")))),
                }
            }
        }
        if let Some(e) = routing_error {
            return Err(e);
        }
        // DISC's ledgers follow their models' replicas (loads issued last pass included).
        if let Some(routing) = self.routing.as_mut() {
            let held = replica_shares(&self.state, routing.members());
            for p in routing.follow_replicas(&held, now) {
                self.state.ungate(SessionId(p as u32));
            }
        }
        let mut out = Vec::new();
        if !informational {
            self.policy.plan(&mut self.state, now, &mut out);
        }
        Ok(out)
    }
}

/// Each replica of `deployments` the state holds (loading, waking or awake) as a share of one
/// replica on the pool's largest device — the replica a routed deployment's ledger pool is
/// sized by (`exec::routing::routing_setup`): its KV capacity (the claim's share of the device
/// minus the weights) over that one's.
fn replica_shares(state: &PlannerState, deployments: &[DeploymentId]) -> Vec<(DeploymentId, f64)> {
    let largest = state.devices().iter().map(|g| g.spec.memory_bytes).max().unwrap_or(0);
    let mut out = Vec::new();
    for &d in deployments {
        let Some(dep) = state.deployment(d) else { continue };
        let kv = |memory: u64| (dep.gpu_memory_utilization * memory as f64 - dep.weight_bytes as f64).max(0.0);
        let reference = kv(largest);
        if reference <= 0.0 {
            continue;
        }
        for r in state.replicas_of(d) {
            let Some(device) = state.device(r.device) else { continue };
            out.push((d, kv(device.spec.memory_bytes) / reference));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Counts its planning passes.
    struct Counting(Arc<AtomicUsize>);
    impl Policy for Counting {
        fn name(&self) -> &'static str {
            "counting"
        }
        fn plan(&mut self, _: &mut PlannerState, _: f64, _: &mut Vec<Command>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn outlooks_alone_are_folded_in_without_a_pass_and_an_empty_batch_is_one() {
        let passes = Arc::new(AtomicUsize::new(0));
        let mut p = Planner::new(Vec::new(), Vec::new(), Box::new(Counting(passes.clone())));
        let outlook = |s: u32| Event::SessionOutlook { session: SessionId(s), deployments: vec![DeploymentId(0)] };
        p.handle_all(vec![outlook(1), outlook(2)], 0.0).unwrap();
        assert_eq!(passes.load(Ordering::SeqCst), 0, "outlooks alone change nothing to plan on");
        assert_eq!(p.state().successor_sessions(DeploymentId(0)), 2, "but they are folded in");
        // The shells ask for a pass with no event (after a verdict let the ledgers admit programs).
        p.handle_all(Vec::new(), 1.0).unwrap();
        assert_eq!(passes.load(Ordering::SeqCst), 1);
        p.handle_all(vec![outlook(3), Event::SessionArrived { session: SessionId(3), workflow: 0 }], 2.0).unwrap();
        assert_eq!(passes.load(Ordering::SeqCst), 2);
    }
}
