//! The live runtime's actor vocabulary: the messages the planner, session, replica and tool
//! actors exchange, the run-wide context they share, the clock, the retry policy and the
//! [`EngineFactory`] through which a shell obtains one [`Engine`] per replica.
//!
//! Message flow (one LLM call): session → planner `UnitReady` (with the prepared request) →
//! the planner core grants it → planner → replica `Submit` and planner → session `Dispatched` →
//! the replica's engine answers → replica → planner `Finished` → the core folds `UnitFinished`
//! → planner → session `LlmDone`. Tool calls: session → tool executors → session, with
//! `ToolStarted`/`ToolFinished` reported to the planner.
//!
//! Messages, the values they carry (a front-door call, [`ProgramRequest`] / [`ProgramCall`]; a
//! routed program's [`ProgramBinding`]; the service's refusals, [`ServiceError`] and
//! [`SHUTTING_DOWN`]; what a run returns, [`LiveOutput`] with its [`FaultCounters`]), the shared
//! run context, the wall clock and the helpers that keep blocking work off the reactor; it must
//! not depend on the simulator's event loop. Engines are reached only through the [`Engine`]
//! trait.
//!
//! It is the leaf the live actors share: of `live`'s modules it uses only `engine` and
//! `journal`, and must not depend on the actors, the shell or the service (`planner_actor`,
//! `program_actor`, `session_actor`, `replica_actor`, `tools_actor`, `shell`, `service`), which
//! all depend on it (`runtime/tests/module_boundaries.rs` checks there is no import cycle).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ractor::{ActorRef, RpcReplyPort};
use switchyard_predictor::DeviceSpec;
use switchyard_tools::ToolOutcome;
use tokio::sync::oneshot;

use super::engine::{Completion, Engine, EngineError, EngineTelemetry, LlmRequest, TokenSink};
use crate::ids::{ActivationId, DeviceId, ReplicaId, SessionId};
use crate::planner::{DeploymentId, DeploymentInfo, NearReadyItem, WorkItem};
use crate::exec::graph_info::NodeFacts;
use crate::exec::{CallRecord, DeploymentMap, SessionRecord, TraceLine};
use crate::report::{DeviceTimeline, RunReport, WastedWork};
use crate::values::{NodeOutput, Record};
use crate::workflow::WorkflowSpec;

/// The run's clock. The planner core's `now` is *device time*: wall seconds since the run
/// started times `speed` (1 on real GPUs; the acceleration of `switchyard emulate --speed X`
/// otherwise, so that the planner's estimates, which are in device seconds, stay comparable).
/// Reports are in wall-clock seconds.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    speed: f64,
}

impl Clock {
    /// A clock started now. A non-positive or non-finite `speed` counts as 1.
    pub fn start(speed: f64) -> Self {
        let speed = if speed.is_finite() && speed > 0.0 { speed } else { 1.0 };
        Clock { start: Instant::now(), speed }
    }

    /// Planner time (device seconds since the start).
    pub fn now(&self) -> f64 {
        self.wall() * self.speed
    }

    /// Wall-clock seconds since the start.
    pub fn wall(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Wall seconds from the start to `at` (0 for an instant before it).
    pub fn wall_at(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.start).as_secs_f64()
    }

    pub fn speed(&self) -> f64 {
        self.speed
    }

    /// The instant at which planner time reaches `t`. A time past what `Instant` can hold (a
    /// huge `t`, or a tiny speed) saturates about 30 years ahead instead of panicking; a time
    /// that is not a number is the start.
    pub fn instant_of(&self, t: f64) -> Instant {
        const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);
        let wall = (t / self.speed).max(0.0);
        let wall = if wall.is_nan() { Duration::ZERO } else { Duration::try_from_secs_f64(wall).unwrap_or(FAR) };
        self.start
            .checked_add(wall.min(FAR))
            .or_else(|| self.start.checked_add(Duration::from_secs(86_400)))
            .unwrap_or(self.start)
    }
}

/// The live runtime's fault policy: what each kind of engine error gets (the replica actor
/// applies it; `EngineError` names the kinds). These are our choices, not from a paper:
///
/// - a bad answer (5xx, garbage) or a dropped connection on a server that still answers its
///   health probe: the call is sent again after an exponential backoff with jitter from
///   `backoff` (50, 100, 200 ms …), `max_attempts` attempts in all, then it fails;
/// - overload (429, or 503 with `Retry-After`): sent again after the server's `Retry-After`
///   (else the backoff, capped at `max_backoff`), up to `max_overloads` times;
/// - a slow call (past its deadline, the server alive): sent again once, then it fails
///   (`max_timeouts`); the deadline is `call_deadline_factor` × the planner's predicted
///   duration, at least `call_deadline_floor` (no prediction: the engine's
///   `request_timeout_s`);
/// - a dead replica (unreachable, its health probe unanswered): restarted in place
///   `max_restarts` times, `restart_backoff` apart (doubling, capped at `max_backoff`), then
///   given up: the planner marks its device unusable for that deployment and moves its
///   calls elsewhere — never a hot loop;
/// - auth failures, rejected requests and misconfiguration fail at once (retrying cannot
///   help), and a load that fails for one of them is not retried.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts per LLM call answered badly (the first one included).
    pub max_attempts: u32,
    /// First backoff; doubles with every further attempt.
    pub backoff: Duration,
    /// Longest single backoff (also caps `Retry-After` waits).
    pub max_backoff: Duration,
    /// Overload answers (429) one call may get before it fails.
    pub max_overloads: u32,
    /// Deadline misses one call may have before it fails.
    pub max_timeouts: u32,
    /// A call's deadline: this factor times its predicted duration …
    pub call_deadline_factor: f64,
    /// … but never less than this.
    pub call_deadline_floor: Duration,
    /// In-place restarts of one replica (engine unreachable) before it is given up.
    pub max_restarts: u32,
    /// Wait before the first restart (doubles with each further one).
    pub restart_backoff: Duration,
    /// Longest wait for calls still running on a replica the planner reclaims.
    pub drain_timeout: Duration,
    /// Attempts per tool call whose executor crashed (panicked).
    pub tool_attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(30),
            max_overloads: 8,
            max_timeouts: 2,
            call_deadline_factor: 4.0,
            call_deadline_floor: Duration::from_secs(60),
            max_restarts: 2,
            restart_backoff: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(60),
            tool_attempts: 2,
        }
    }
}

impl RetryPolicy {
    /// Backoff before attempt `attempt + 1`, after `attempt` failed ones (1-based), without
    /// jitter, capped at `max_backoff`.
    pub fn backoff_after(&self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1).min(16);
        self.backoff.saturating_mul(1u32 << shift).min(self.max_backoff)
    }

    /// [`Self::backoff_after`] with "equal jitter": half of it plus a uniform draw of up to
    /// the other half (`unit` in [0, 1)), so that calls failed together do not retry together.
    pub fn jittered(&self, attempt: u32, unit: f64) -> Duration {
        let d = self.backoff_after(attempt);
        d / 2 + d.mul_f64(0.5 * unit.clamp(0.0, 1.0))
    }

    /// Wait before restart `restart` (1-based) of a dead replica.
    pub fn restart_after(&self, restart: u32) -> Duration {
        let shift = restart.saturating_sub(1).min(16);
        self.restart_backoff.saturating_mul(1u32 << shift).min(self.max_backoff)
    }

    /// The wall-clock deadline of a call predicted to take `predicted_wall_s` seconds.
    pub fn call_deadline(&self, predicted_wall_s: Option<f64>) -> Option<f64> {
        let p = predicted_wall_s.filter(|p| p.is_finite() && *p >= 0.0)?;
        Some((p * self.call_deadline_factor).max(self.call_deadline_floor.as_secs_f64()))
    }
}

/// Where the runtime reports notes as they happen (the CLI prints them on stderr).
pub type NoteSink = Arc<dyn Fn(&str) + Send + Sync>;

/// Which replica an engine is wanted for.
#[derive(Debug, Clone, Copy)]
pub struct EngineTarget<'a> {
    pub replica: ReplicaId,
    pub device: DeviceId,
    pub device_spec: &'a DeviceSpec,
    pub deployment: &'a DeploymentInfo,
}

/// One engine, and the model name its server expects in requests.
#[derive(Clone)]
pub struct EngineHandle {
    pub engine: Arc<dyn Engine>,
    pub served_model: String,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("kind", &self.engine.kind())
            .field("served_model", &self.served_model)
            .finish()
    }
}

/// Makes the engine of a new replica (the pool file says which kind per device).
pub trait EngineFactory: Send + Sync {
    fn create(&self, target: &EngineTarget<'_>) -> Result<EngineHandle, EngineError>;
}

/// Orders lifecycle work on one device: an action waits for the previous one on the same
/// device (an unload frees memory before the next load claims it) and signals when done.
#[derive(Debug)]
pub struct LifecycleTicket {
    pub after: Option<oneshot::Receiver<()>>,
    pub done: oneshot::Sender<()>,
}

impl LifecycleTicket {
    /// Wait for the previous lifecycle action on the device (a dropped one counts as done).
    pub async fn wait(&mut self) {
        if let Some(rx) = self.after.take() {
            let _ = rx.await;
        }
    }

    /// Signal the next action on the device.
    pub fn finish(self) {
        let _ = self.done.send(());
    }
}

/// The tool executors, replaceable when the planner restarts a crashed one.
#[derive(Clone, Default)]
pub struct ToolsHandle(Arc<RwLock<Option<ActorRef<ToolMsg>>>>);

impl ToolsHandle {
    pub fn set(&self, actor: ActorRef<ToolMsg>) {
        if let Ok(mut g) = self.0.write() {
            *g = Some(actor);
        }
    }

    pub fn get(&self) -> Option<ActorRef<ToolMsg>> {
        self.0.read().ok().and_then(|g| g.clone())
    }
}

/// Run blocking or CPU-bound work (prompt rendering, BPE tokenization, the responder, a
/// journal write that waits for its fsync) without stalling the other tasks: on a
/// multi-threaded runtime the worker hands its other tasks over first; elsewhere (a
/// current-thread runtime, no runtime) it simply runs — `block_in_place` would panic there.
pub fn off_the_reactor<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Run `write` (a journal write nobody waits for) beside the reactor on tokio's blocking pool;
/// in place outside a runtime.
pub fn beside_the_reactor(write: impl FnOnce() + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(h) => drop(h.spawn_blocking(write)),
        Err(_) => write(),
    }
}

/// What every actor of a run may read. A served runtime (`live::service`) replaces the
/// planner's copy when a workflow is registered; sessions keep the copy they started with.
#[derive(Clone)]
pub struct RunContext {
    pub workflows: Vec<Arc<WorkflowSpec>>,
    /// Trace and responder seed.
    pub seed: u64,
    pub deployments: Vec<DeploymentInfo>,
    pub deployment_of: DeploymentMap,
    pub node_info: NodeFacts,
    pub clock: Clock,
    pub retry: RetryPolicy,
    /// Ask engines to stream answers.
    pub stream: bool,
    pub tools: ToolsHandle,
    /// How routed workflows are routed (the single-verifier comparison).
    pub routing: crate::exec::routing::RoutingConfig,
    /// [`super::LiveConfig::front_door_max_tokens`].
    pub front_door_max_tokens: Option<u32>,
}

/// An LLM call waiting for its grant: the request (id and model are filled at dispatch) and the
/// output length the responder drew (reported to the core if the call fails).
#[derive(Debug, Clone)]
pub struct PendingCall {
    pub request: LlmRequest,
    pub expected_output_tokens: u32,
}

/// Where the time of one LLM call went, as its session saw it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct CallTiming {
    pub activation: ActivationId,
    /// Wall seconds from handing the unit to the planner to receiving its answer.
    pub total_s: f64,
    /// Wall seconds from handing the unit to the planner to learning of its grant (planner
    /// work, and any wait for a replica with room).
    pub grant_s: f64,
    /// Wall seconds the engine call itself took (`Completion::latency_s`).
    pub engine_s: f64,
}

impl CallTiming {
    /// What the runtime added to the engine call: actor hops, queueing for a grant, retries.
    pub fn overhead_s(&self) -> f64 {
        (self.total_s - self.engine_s).max(0.0)
    }

    /// What the runtime added after the grant: the hops planner → replica → engine → replica
    /// → planner → session.
    pub fn after_grant_s(&self) -> f64 {
        (self.total_s - self.grant_s - self.engine_s).max(0.0)
    }
}

/// What a session reports when it ends (exactly once).
#[derive(Debug, Clone)]
pub struct SessionReport {
    pub record: SessionRecord,
    pub result: SessionResult,
    /// Its completed activations, in completion order.
    pub calls: Vec<CallRecord>,
    /// Its completed LLM calls' timings.
    pub timings: Vec<CallTiming>,
    /// It ended because the runtime stopped, not by its own work (its `failed` reason says so):
    /// a journaled workflow session stays open in the journal and resumes at the next start on
    /// the same state directory; a front-door program closes. Its event is
    /// `session_interrupted`, not `session_failed`.
    pub interrupted: bool,
}

/// The outcome of one session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionResult {
    pub session: SessionId,
    /// Index of the workflow in the run's list.
    pub workflow: u32,
    /// Index of the dataset record.
    pub record: usize,
    /// The final answer (`Session::final_output`) of a completed session.
    pub final_output: Option<NodeOutput>,
    /// The workflow metric's score of a completed session.
    pub score: Option<f64>,
    /// Its score under the workflow's own `verifier:` term (`exec::verifier_score`), when it
    /// declares one: what a routed session's verdict is read from.
    pub verifier_score: Option<f64>,
    pub failed: Option<String>,
}

/// Messages to the planner actor.
pub enum PlannerMsg {
    /// Session `index` of the trace arrives.
    Arrive(usize),
    UnitReady { item: WorkItem, call: PendingCall },
    NearReady(NearReadyItem),
    /// The deployments a session can still call from its frontier on (its graph outlook).
    Outlook { session: SessionId, deployments: Vec<DeploymentId> },
    ToolStarted { activation: ActivationId, predicted_s: f64, workflow: u32, node: u32 },
    ToolFinished { activation: ActivationId },
    /// A tool executor crashed (panicked) while running this call.
    ToolCrashed { activation: ActivationId, reason: String },
    SessionEnded(Box<SessionReport>),
    Loaded { replica: ReplicaId, result: Result<(), String> },
    /// An attempt of a call got its first token (streamed answers), `at` then.
    FirstToken { replica: ReplicaId, activation: ActivationId, at: Instant },
    /// A call answered. `wasted`: what its earlier, failed attempts had cost the engine.
    Finished { replica: ReplicaId, activation: ActivationId, completion: Completion, attempts: u32, wasted: WastedWork },
    /// A call failed for good (bad answers past the retry bound, or a rejected request);
    /// `wasted`: what its attempts had cost the engine.
    CallFailed { replica: ReplicaId, activation: ActivationId, reason: String, attempts: u32, wasted: WastedWork },
    /// A call stopped at the planner's request ([`ReplicaMsg::Abort`]): its session had ended.
    /// Not a fault; sent once the call's task (and its connection) is gone, so its lease ends
    /// when the call no longer runs here. `wasted`: what its attempts had cost the engine.
    Aborted { replica: ReplicaId, activation: ActivationId, attempts: u32, wasted: WastedWork },
    /// The engine was unreachable and restarted in place.
    Restarted { replica: ReplicaId },
    /// The replica is gone (restarts exhausted): its calls must move elsewhere. `actor` is the
    /// replica actor that says so: a replica woken or reloaded under the same id is another
    /// actor, which a late word from its predecessor must not take down.
    /// `wasted`: what the attempts of the calls it gave up had cost the engine.
    ReplicaLost { replica: ReplicaId, actor: ractor::ActorId, reason: String, wasted: WastedWork },
    /// An engine call or lifecycle action failed with `error` (reported on every failure; the
    /// planner notes the first of each kind per endpoint as it happens).
    EngineFault { replica: ReplicaId, endpoint: String, error: EngineError },
    /// A replica's engine was put to sleep as the core asked and can be woken later.
    Parked { replica: ReplicaId, engine: EngineHandle },
    /// A replica's engine was unloaded (torn down): its device memory is free.
    Unloaded { replica: ReplicaId },
    Telemetry { replica: ReplicaId, telemetry: EngineTelemetry },
    /// A line for the run's notes (deduplicated).
    Note(String),
    /// Hand the queued events to the planner core (one scheduling tick).
    Flush,
    /// Watchdog: detect units that can never be placed.
    Tick,
    /// Fail every open session and every session still to arrive (the run's deadline passed).
    Abort(String),
    /// Answer once every session has ended.
    WaitDone(RpcReplyPort<Result<(), String>>),
    /// Reclaim everything, build the output and stop.
    Shutdown(RpcReplyPort<Box<LiveOutput>>),
    /// A served runtime: add a workflow whose deployments the served table covers; answers its
    /// index in the run's workflow list.
    Register { spec: Arc<WorkflowSpec>, reply: RpcReplyPort<Result<u32, String>> },
    /// A served runtime: start one session of workflow `workflow` per input, now (journaled
    /// when it has a [`DurableSession`]); answers their ids in input order.
    Submit { workflow: u32, inputs: Vec<(Record, Option<DurableSession>)>, reply: RpcReplyPort<Result<Vec<SessionId>, String>> },
    /// A served runtime: where these sessions stand.
    Status { sessions: Vec<SessionId>, reply: RpcReplyPort<Vec<SessionStatus>> },
    /// A served runtime: end these sessions, if still open, as failed with `reason`.
    Cancel { sessions: Vec<SessionId>, reason: String },
    /// The front door: one call of the external program `program` (`None`: a program of this
    /// call alone) on deployment `deployment`.
    ProgramCall {
        program: Option<String>,
        deployment: crate::planner::DeploymentId,
        /// The served deployment of the request's next-model hint.
        next: Option<crate::planner::DeploymentId>,
        request: ProgramRequest,
        sink: super::engine::TokenSink,
        reply: tokio::sync::oneshot::Sender<Result<super::engine::Completion, String>>,
        /// Told as soon as the call is handed to its program, or why it is refused (no
        /// program can start: the runtime stops, too many are open): the front door answers a
        /// refusal with its own status before a stream begins.
        accepted: Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
    },
    /// The front door, routed: one call of `program` that names the router's model; the
    /// program is bound at its first such call (see [`ProgramRoute`]).
    RoutedProgramCall {
        program: Option<String>,
        route: ProgramRoute,
        next: Option<crate::planner::DeploymentId>,
        request: ProgramRequest,
        sink: super::engine::TokenSink,
        reply: tokio::sync::oneshot::Sender<Result<super::engine::Completion, String>>,
    },
    /// The journal routed front-door programs are recorded in while open (`serve --state`).
    ProgramJournal(std::sync::Arc<super::journal::Journal>),
    /// The verdict of routed front-door program `program` (success 0–1); answers the reward.
    ProgramVerdict { program: String, success: f64, reply: ractor::RpcReplyPort<Result<f64, ServiceError>> },
    /// A front-door program has been idle for its timeout having received `calls` calls: it
    /// ends only if the planner has sent it no other since (else that call is on its way).
    ProgramIdle { session: SessionId, calls: u64 },
}

/// How a routed front-door call is bound: `bound` gets the binding in force before the call is
/// scheduled; `next_routed`: the call's next-model hint names the router's model (the program's
/// next call is near-ready on its bound model).
pub struct ProgramRoute {
    pub next_routed: bool,
    pub bound: tokio::sync::oneshot::Sender<Result<ProgramBinding, String>>,
}

/// A session whose progress is journaled (`switchyard serve --state`): its number in the
/// journal, and the results the journal already holds (by activation key), which it replays
/// instead of running those activations again.
#[derive(Clone)]
pub struct DurableSession {
    pub journal: Arc<super::journal::Journal>,
    pub number: u64,
    pub replay: std::collections::BTreeMap<String, serde_json::Value>,
    /// The route binding (model, dtype) the session actor journals before it starts anything,
    /// for a session of a routed workflow the router bound afresh (`None` otherwise, or when it
    /// kept a journaled one).
    pub route: Option<serde_json::Value>,
}

impl std::fmt::Debug for DurableSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableSession").field("number", &self.number).field("replay", &self.replay.len()).finish()
    }
}

/// Where one session of a served runtime stands.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionStatus {
    /// No such session.
    Unknown,
    /// Started and not ended.
    Running,
    /// Ended with its final answer.
    Completed { output: Option<NodeOutput>, score: Option<f64>, finished_at: f64 },
    /// Ended without one (a failed call, a cancel, an unplaceable unit, …).
    Failed { reason: String, at: f64 },
    /// Ended by the runtime's stop ([`SessionReport::interrupted`]): with a journal it resumes
    /// at the next start.
    Interrupted { reason: String, at: f64 },
}

/// Messages to a session actor.
pub enum SessionMsg {
    Start,
    /// The planner granted the unit to `replica`.
    Dispatched { activation: ActivationId, replica: ReplicaId },
    LlmDone { activation: ActivationId, replica: ReplicaId, completion: Completion },
    LlmFailed { activation: ActivationId, reason: String },
    /// The unit's replica was lost before it answered: run it again elsewhere.
    Requeue { activation: ActivationId },
    ToolDone { activation: ActivationId, result: Result<ToolOutcome, String> },
    /// End the session as failed.
    Fail(String),
    /// End the session as cancelled by its client (failed with this reason; a journaled
    /// session is recorded as cancelled, whatever the reason's words).
    Cancel(String),
    /// End the session as failed for this process only (the runtime is stopping): a journaled
    /// session stays unfinished in its journal and resumes at the next start.
    Abandon(String),
    /// A front-door program's next call (program actors only; sessions ignore it).
    Call(Box<ProgramCall>),
    /// A program's idle timer of the given generation (program actors only): still idle, it
    /// asks the planner whether it may end ([`PlannerMsg::ProgramIdle`]).
    Idle(u64),
    /// The planner's answer: no call is on its way to the program, and its key now names no
    /// program (a later call with it starts a new one); it ends if still at this generation.
    EndIdle(u64),
}

/// Messages to a replica actor.
pub enum ReplicaMsg {
    /// Load (or wake a parked engine), then report `Loaded`.
    Start(LifecycleTicket),
    Submit { activation: ActivationId, request: LlmRequest },
    /// An engine call returned (`generation`: the engine incarnation it was sent to).
    Done { id: u64, generation: u64, result: Result<Completion, EngineError> },
    Retry { id: u64 },
    /// Stop the calls of these activations (their sessions ended while the calls ran): each
    /// call's task is dropped with its connection, so that the server aborts the request (vLLM
    /// aborts on a disconnect), and the call is reported [`PlannerMsg::Aborted`].
    Abort { activations: Vec<ActivationId> },
    /// The task of aborted call `id` is gone: report the call `Aborted`.
    Stopped { id: u64 },
    /// Reclaim: sleep at this vLLM level (and park the engine) when `sleep`, else unload (also
    /// when the engine cannot sleep); report `Parked` or `Unloaded`; then stop.
    Reclaim { sleep: Option<u8>, ticket: LifecycleTicket },
    /// The calls a reclaim waited for did not finish in time: reclaim now.
    DrainTimeout,
    /// Unload and stop (end of the run).
    Stop(RpcReplyPort<()>),
    PollTelemetry,
    TelemetryDone(Result<EngineTelemetry, EngineError>),
}

/// Messages to the tool executors.
pub enum ToolMsg {
    Run { activation: ActivationId, call: switchyard_tools::ToolCall, reply: ActorRef<SessionMsg> },
}

// The values the messages carry that the planner actor, the program actors, the service and the
// shell all use: kept here so that none of them imports another for them (each is re-exported
// from the module it used to live in: `shell`, `service`, `program_actor`, `planner_actor`).

/// Why a workflow, a session or a front-door call is refused once the runtime stops (the
/// service answers it as unavailable, not as a bad request).
pub const SHUTTING_DOWN: &str = "the runtime is shutting down";

/// Faults the runtime absorbed.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct FaultCounters {
    /// Extra attempts of LLM calls (bad answers, unreachable engines).
    pub retries: u64,
    /// In-place replica restarts.
    pub restarts: u64,
    /// Calls moved off a lost replica.
    pub migrated_calls: u64,
    /// Calls that failed for good (their sessions failed).
    pub failed_calls: u64,
    /// Tool executor crashes.
    pub tool_crashes: u64,
}

impl FaultCounters {
    /// The counters as one line for a person, `None` when the run absorbed no fault.
    pub fn line(&self) -> Option<String> {
        (self.retries + self.restarts + self.migrated_calls + self.failed_calls + self.tool_crashes > 0).then(|| {
            format!(
                "faults: {} retries of LLM calls · {} replica restarts · {} calls moved off lost replicas · {} calls failed for good · {} tool executor crashes",
                self.retries, self.restarts, self.migrated_calls, self.failed_calls, self.tool_crashes
            )
        })
    }
}

/// What a live run produces.
#[derive(Debug, Clone)]
pub struct LiveOutput {
    pub report: RunReport,
    /// Every session's outcome, by session id.
    pub sessions: Vec<SessionResult>,
    /// Every completed activation, in completion order (wall-clock `finished_at`).
    pub calls: Vec<CallRecord>,
    /// Every completed LLM call's timing (runtime overhead = total − engine).
    pub timings: Vec<CallTiming>,
    pub timelines: Vec<DeviceTimeline>,
    /// First arrival, last completion (wall seconds).
    pub window: (f64, f64),
    pub notes: Vec<String>,
    /// The last telemetry each replica reported.
    pub telemetry: BTreeMap<ReplicaId, EngineTelemetry>,
    pub faults: FaultCounters,
    /// Why the run stopped early, if it did (the report covers what ran until then).
    pub error: Option<String>,
    /// The run's events, when [`LiveConfig::keep_trace`](super::shell::LiveConfig::keep_trace)
    /// asked for them (wall seconds).
    pub trace: Vec<TraceLine>,
    /// DISC's learned per-request allowance δ̂ per routed deployment (tokens), from the
    /// engines' `/metrics` (`PlannerActorState::observe_usage`).
    pub allowances: BTreeMap<DeploymentId, f64>,
    /// Sessions and programs the stop ended ([`SessionReport::interrupted`]; counted among the
    /// report's failed sessions too).
    pub interrupted: usize,
}

/// Why a service request was refused.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum ServiceError {
    /// The workflow cannot run on what this service serves (a deployment not in its table).
    #[error("{0}")]
    NotServed(String),
    /// The request names something that does not exist or is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The runtime stopped or did not answer.
    #[error("the runtime is not available: {0}")]
    Unavailable(String),
    /// The request names something the runtime does not know (a front-door program's key).
    #[error("{0}")]
    NotFound(String),
    /// The request does not fit the state it names (a verdict for a program still open).
    #[error("{0}")]
    Conflict(String),
}

/// Where a routed front-door program runs: the model it is bound to and the verifier its task
/// type selects (the grader the client should run before it posts the program's verdict).
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramBinding {
    pub model: String,
    pub verifier: String,
    /// DISC moved it from the learner's choice (paper 002's divert rule).
    pub diverted: bool,
    /// The binding was kept from before (a journaled binding, after a restart), not chosen now.
    pub kept: bool,
}

/// What a front-door client asks for in one call.
#[derive(Debug, Clone, Default)]
pub struct ProgramRequest {
    /// Chat messages (`/v1/chat/completions`: `role`, `content`, an assistant's `tool_calls`,
    /// a tool result's `tool_call_id`), sent to the engine as given.
    pub messages: Option<Vec<serde_json::Value>>,
    /// The chat call's tool definitions (`tools`), sent with the messages.
    pub tools: Vec<serde_json::Value>,
    /// The chat call's `tool_choice`, as given.
    pub tool_choice: Option<serde_json::Value>,
    /// The chat call's `parallel_tool_calls`, as given.
    pub parallel_tool_calls: Option<bool>,
    /// Stop strings: the answer ends before the first one.
    pub stop: Vec<String>,
    /// The chat call's structured-output format (`response_format`), checked.
    pub response_format: Option<serde_json::Value>,
    /// Or a raw completion prompt (`/v1/completions`).
    pub prompt: Option<String>,
    pub max_tokens: u32,
    pub enable_thinking: bool,
    /// The client says this is its program's last call.
    pub program_done: bool,
    /// The client says which model its next call will use (a hint: the planner sees that call
    /// as near-ready while the client works, and may load or keep the model for it).
    pub next_model: Option<String>,
    /// The client's name for the step this call is (`X-Step-ID`: `planner`, `coder`, …): the
    /// planner keeps output-length and tool-gap histories per step, across programs.
    pub step: Option<String>,
}

impl ProgramRequest {
    /// The prompt the engine receives — the messages in Qwen3's chat template (with the call's
    /// thinking mode), or the raw prompt — and whether it is raw.
    pub fn rendered_prompt(&self) -> (String, bool) {
        match (&self.messages, &self.prompt) {
            (Some(messages), _) => {
                let turns: Vec<crate::tokens::ChatTurn> = messages.iter().map(chat_turn).collect();
                (crate::tokens::chat_template_with_tools(&turns, &self.tools, self.enable_thinking, true), false)
            }
            (None, Some(p)) => (p.clone(), true),
            (None, None) => (String::new(), true),
        }
    }
}

/// A chat message as the template reads it: role, text, and an assistant's tool calls (their
/// arguments as JSON text, as OpenAI carries them; an object is written out).
fn chat_turn(m: &serde_json::Value) -> crate::tokens::ChatTurn {
    use serde_json::Value;
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
    let tool_calls = m
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let f = c.get("function").unwrap_or(c);
            let arguments = match f.get("arguments") {
                Some(Value::String(a)) => a.clone(),
                Some(other) if !other.is_null() => other.to_string(),
                _ => String::new(),
            };
            crate::tokens::TurnToolCall { name: text(f.get("name")), arguments }
        })
        .collect();
    crate::tokens::ChatTurn { role: m.get("role").and_then(Value::as_str).unwrap_or("user").to_string(), content: text(m.get("content")), tool_calls }
}

/// One call of a program, as the planner actor hands it to the program's actor.
pub struct ProgramCall {
    pub request: ProgramRequest,
    /// The served deployment the call's model names, and the front-door node serving it.
    pub deployment: DeploymentId,
    pub node: u32,
    /// The served deployment of the hinted next model, if any.
    pub next: Option<DeploymentId>,
    /// Where the answer's text goes as it arrives (the client's stream).
    pub sink: TokenSink,
    /// The answer, or why there is none.
    pub reply: oneshot::Sender<Result<Completion, String>>,
}

impl std::fmt::Debug for ProgramCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgramCall").field("deployment", &self.deployment).field("node", &self.node).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_run_reports_the_faults_it_absorbed() {
        let quiet = crate::live::LiveError::Stopped {
            reason: "planner: boom".into(),
            sessions_ended: 3,
            sessions_total: 9,
            faults: FaultCounters::default(),
        };
        assert_eq!(quiet.to_string(), "planner: boom (after 3 of 9 sessions ended)");
        let faults = FaultCounters { retries: 2, restarts: 1, ..FaultCounters::default() };
        let stopped =
            crate::live::LiveError::Stopped { reason: "planner: boom".into(), sessions_ended: 3, sessions_total: 9, faults };
        assert_eq!(
            stopped.to_string(),
            "planner: boom (after 3 of 9 sessions ended); faults: 2 retries of LLM calls · 1 replica restarts · \
             0 calls moved off lost replicas · 0 calls failed for good · 0 tool executor crashes"
        );
    }

    #[test]
    fn backoff_doubles_from_the_base() {
        let r = RetryPolicy { backoff: Duration::from_millis(10), ..RetryPolicy::default() };
        assert_eq!(r.backoff_after(1), Duration::from_millis(10));
        assert_eq!(r.backoff_after(2), Duration::from_millis(20));
        assert_eq!(r.backoff_after(4), Duration::from_millis(80));
        // Bounded shift: no overflow for absurd attempt counts.
        assert!(r.backoff_after(u32::MAX) >= Duration::from_millis(10));
    }

    #[test]
    fn lifecycle_tickets_run_in_issue_order() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (done1, rx1) = oneshot::channel();
            let first = LifecycleTicket { after: None, done: done1 };
            let (done2, _rx2) = oneshot::channel();
            let mut second = LifecycleTicket { after: Some(rx1), done: done2 };
            let order = Arc::new(std::sync::Mutex::new(Vec::new()));
            let o = Arc::clone(&order);
            let waiter = tokio::spawn(async move {
                second.wait().await;
                o.lock().unwrap().push(2);
            });
            tokio::time::sleep(Duration::from_millis(10)).await;
            order.lock().unwrap().push(1);
            first.finish();
            waiter.await.unwrap();
            assert_eq!(*order.lock().unwrap(), vec![1, 2]);
            // A dropped predecessor does not block its successor.
            let (tx, rx) = oneshot::channel::<()>();
            drop(tx);
            let (done, _) = oneshot::channel();
            LifecycleTicket { after: Some(rx), done }.wait().await;
        });
    }

    #[test]
    fn clock_scales_wall_time_into_device_time() {
        let c = Clock::start(50.0);
        std::thread::sleep(Duration::from_millis(20));
        let (wall, now) = (c.wall(), c.now());
        assert!(wall >= 0.02);
        assert!(now >= 50.0 * wall, "{now} vs {wall}");
        assert!(now <= 50.0 * c.wall(), "{now} vs {wall}");
        assert_eq!(Clock::start(-1.0).speed(), 1.0);
        let at = c.instant_of(100.0);
        assert!(((at - c.start).as_secs_f64() - 2.0).abs() < 1e-9);
    }

    #[test]
    fn clock_instants_past_what_instant_holds_saturate_instead_of_panicking() {
        let year = Duration::from_secs(86_400 * 365);
        // A pool speed of 1e-300 made an arrival at 1 s a wall time of 1e300 s.
        let slow = Clock::start(1e-300);
        assert!(slow.instant_of(1.0) > slow.start + year);
        let c = Clock::start(1.0);
        for t in [1e19, 1.7e19, 1e300, f64::INFINITY] {
            assert!(c.instant_of(t) > c.start + year, "{t}");
        }
        assert_eq!(c.instant_of(f64::NAN), c.start);
        assert_eq!(c.instant_of(-5.0), c.start);
    }
}
