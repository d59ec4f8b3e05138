//! The planner actor: it owns the pure planner core, folds every event the other actors report
//! into it with `now` = the run's clock, and turns the core's commands into messages: `Load`
//! spawns a replica actor (waking a parked engine of the same deployment on that device when
//! there is one), `Unload` reclaims one (asleep when the engine supports sleep mode), and
//! `Dispatch` sends the prepared request to the replica and tells the session.
//!
//! It is also the live shell's recorder (GPU timelines, token work, counters, session
//! outcomes) and its supervisor: replica, session and tool actors are linked to it. A replica
//! that is lost (restarts exhausted, or its actor crashed) has its in-flight calls released in
//! the core and requeued by their sessions, so the core places them on another replica; a
//! crashed tool executor is restarted; a crashed session actor is recorded as a failed session.
//! Every session ends exactly once. A watchdog tick fails units that no device can ever serve.
//!
//! It depends on the planner core, the actor messages and the values they carry (`actors`), the
//! actors it starts and the `Engine` trait through the factory; it never blocks on an engine call
//! (replica actors do). It must not depend on the shell or the service that start it (what it
//! answers them with, `LiveOutput`, `ProgramBinding`, `ServiceError`, is `actors`').

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use switchyard_predictor::DeviceSpec;
use tokio::sync::{broadcast, oneshot};

use super::actors::{
    EngineFactory, EngineHandle, EngineTarget, LifecycleTicket, NoteSink, PendingCall, PlannerMsg,
    DurableSession, FaultCounters, LiveOutput, ProgramBinding, ProgramCall, ProgramRequest, ReplicaMsg, RunContext,
    ServiceError, SessionMsg, SessionReport, SessionResult, SessionStatus, ToolMsg,
};
use super::engine::{EngineError, EngineTelemetry};
use super::metrics::RuntimeMetrics;
use super::program_actor::{ProgramActor, ProgramArgs};
use super::replica_actor::{ReplicaActor, ReplicaArgs};
use super::session_actor::{SessionActor, SessionArgs};
use super::tools_actor::{ToolsActor, ToolsArgs};
use crate::ids::{ActivationId, DeviceId, ReplicaId, SessionId};
use crate::planner::{Command, DeploymentId, Event, Planner, ReplicaPhase, WorkItem};
use crate::report::{DeviceTimeline, Segment, SegmentKind, WastedWork};
use crate::session::Session;
use crate::exec::{self, CallRecord, Counters, ReportInput, SessionRecord, TokenWork, TraceEntry, TraceLine, finish_detail};
use crate::values::Record;

/// The service answers with it too, so it is the actor vocabulary's.
pub use super::actors::SHUTTING_DOWN;

/// How a front-door call that would open one program too many is refused (the server answers
/// 429): the start of its message.
pub const TOO_MANY_PROGRAMS: &str = "too many open programs";

/// The watchdog's least quiet time before it fails units that no device can take (and at
/// least 3 ticks): a session actor still rendering its next prompt — a long one, under load —
/// is not a stranded unit, and a real stranding loses nothing by being declared 2 s later.
const STRANDED_AFTER: Duration = Duration::from_secs(2);

/// Planner nodes of front-door step hints start here (a served deployment's own node is its
/// index, far below).
pub const FRONT_DOOR_STEP_BASE: u32 = 1 << 16;

/// Distinct front-door step hints the runtime keeps histories for.
pub const MAX_FRONT_DOOR_STEPS: usize = 4096;

/// Routed front-door programs kept awaiting their verdict; past it the oldest ended one is
/// given up (its learner decision dropped).
pub const MAX_UNVERIFIED_PROGRAMS: usize = 10_000;

/// A DISC ledger's learned state as the journal records it: its sums as the bits of their
/// `f64`s (JSON numbers would not round-trip every one), its counts as integers.
fn ledger_json(l: &crate::planner::routing::LedgerLearned) -> serde_json::Value {
    serde_json::json!({
        "peaks_sum_bits": l.peaks_sum.to_bits(),
        "peaks_n": l.peaks_n,
        "run_sum_bits": l.run_sum.to_bits(),
        "run_n": l.run_n,
        "allowance_sum_bits": l.allowance_sum.to_bits(),
        "allowance_n_bits": l.allowance_n.to_bits(),
    })
}

/// [`ledger_json`] read back (`None` for a record of another shape).
fn ledger_from_json(v: &serde_json::Value) -> Option<crate::planner::routing::LedgerLearned> {
    let bits = |k: &str| v.get(k)?.as_u64().map(f64::from_bits);
    Some(crate::planner::routing::LedgerLearned {
        peaks_sum: bits("peaks_sum_bits")?,
        peaks_n: v.get("peaks_n")?.as_u64()?,
        run_sum: bits("run_sum_bits")?,
        run_n: v.get("run_n")?.as_u64()?,
        allowance_sum: bits("allowance_sum_bits")?,
        allowance_n: bits("allowance_n_bits")?,
    })
}

/// The learner context a journal record carries (`"context"`: its numbers).
fn learner_context_of(row: &serde_json::Value) -> Option<Vec<f64>> {
    row.get("context")?.as_array()?.iter().map(serde_json::Value::as_f64).collect()
}

/// A routed front-door program restored from the journal, awaiting its verdict: its id in the
/// router, the session number it was recorded under (its journal record's), its cost (as
/// recorded at its end), when it ended (Unix seconds: the oldest is given up first).
#[derive(Debug, Clone, Copy)]
struct RestoredProgram {
    program: u64,
    session: u64,
    cost: f64,
    ended: f64,
}

/// Longest task text a routed front-door program is classified and embedded by: what the
/// router's embedding reads of a request (paper 002 embeds the task's first request).
const MAX_TASK_BYTES: usize = crate::planner::routing::embed::PREFIX_BYTES;

/// The text a routed front-door program's first call is classified by: its user messages (or
/// its raw prompt), at most [`MAX_TASK_BYTES`] of it, cut at a character boundary.
fn program_task(request: &ProgramRequest) -> String {
    let mut text = match (&request.messages, &request.prompt) {
        (Some(messages), _) => messages
            .iter()
            .filter(|m| m.get("role").and_then(|r| r.as_str()) == Some("user"))
            .filter_map(|m| m.get("content").and_then(|c| c.as_str()))
            .collect::<Vec<_>>()
            .join("\n"),
        (None, Some(p)) => p.clone(),
        (None, None) => String::new(),
    };
    if text.len() > MAX_TASK_BYTES {
        let mut cut = MAX_TASK_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

pub struct PlannerActor;

/// Run facts the report repeats.
#[derive(Debug, Clone)]
pub struct ReportMeta {
    pub policy: String,
    pub seed: u64,
    pub noise_seed: u64,
    pub arrival: String,
    pub pool: String,
}

/// Called with (sessions ended, sessions in the trace) as sessions end.
pub type Progress = Arc<dyn Fn(usize, usize) + Send + Sync>;

pub struct PlannerArgs {
    pub ctx: Arc<RunContext>,
    pub planner: Planner,
    pub factory: Arc<dyn EngineFactory>,
    pub devices: Vec<DeviceSpec>,
    pub trace: Vec<TraceEntry>,
    pub records: Vec<Arc<Vec<Record>>>,
    pub meta: ReportMeta,
    pub telemetry_every: Option<Duration>,
    pub tool_workers: usize,
    /// Watchdog period.
    pub tick: Duration,
    pub progress: Option<Progress>,
    /// Where notes go as they happen (they are also in the output).
    pub on_note: Option<NoteSink>,
    /// Record the run's events (`--trace`, the simulator's schema).
    pub keep_trace: bool,
    /// Where each event of the run is also published as it happens (a served runtime's event
    /// streams); lagging subscribers lose events, the run never waits for them.
    pub events: Option<broadcast::Sender<TraceLine>>,
    /// A served runtime's front door: the index of its workflow (one node per served
    /// deployment, node i serving deployment i) and how long an idle program lives.
    pub front_door: Option<(u32, Duration)>,
    /// The runtime's own metrics, kept up to date at each tick (a served runtime's `/metrics`).
    pub metrics: Option<Arc<RuntimeMetrics>>,
    /// A served runtime keeps the reports of at most this many ended sessions (the oldest
    /// ended are forgotten: their status reads `unknown`, the journal still has their outcome);
    /// `None`: all (a run of a fixed trace).
    pub keep_ended: Option<usize>,
    /// A served runtime keeps at most about twice this many GPU-timeline segments per device:
    /// older ones are folded into the report's partition ([`DeviceTimeline::fold_until`]).
    /// `None`: a run's timeline is its chart and is kept whole.
    pub timeline_segments: Option<usize>,
    /// A served runtime's front door keeps at most this many keyed programs open (each holds
    /// an actor and its last prompt until it ends or idles out); a call that would open one
    /// more is refused ([`TOO_MANY_PROGRAMS`]). `None`: no limit.
    pub max_programs: Option<usize>,
}

struct ReplicaEntry {
    actor: ActorRef<ReplicaMsg>,
    device: DeviceId,
    deployment: DeploymentId,
    /// Wall time the load started; `None` once awake.
    loading_since: Option<f64>,
    resident_since: Option<f64>,
    /// Wall time the replica last went from idle to serving.
    busy_since: Option<f64>,
    serving: usize,
    /// A fixed endpoint: no load, no GPU time of ours to record.
    fixed: bool,
}

struct InFlight {
    replica: ReplicaId,
    workflow: u32,
    deployment: DeploymentId,
    call: PendingCall,
    /// Its `first_token` event was logged as the token came.
    first_token_logged: bool,
}

pub struct PlannerActorState {
    ctx: Arc<RunContext>,
    planner: Planner,
    factory: Arc<dyn EngineFactory>,
    devices: Vec<DeviceSpec>,
    trace: SessionTrace,
    records: Vec<Arc<Vec<Record>>>,
    /// Inputs of sessions submitted to a served runtime, until each arrives (the session takes
    /// its input; a run's sessions read theirs from `records`).
    inputs: BTreeMap<usize, Record>,
    meta: ReportMeta,
    telemetry_every: Option<Duration>,
    tool_workers: usize,
    progress: Option<Progress>,
    on_note: Option<NoteSink>,
    /// Engine faults already noted, by (kind, endpoint): the first of each is printed.
    faults_seen: BTreeSet<(&'static str, String)>,
    /// The last engine error on each device (named when a unit cannot be placed).
    /// The last engine error of each device, per deployment it served.
    last_error: BTreeMap<(DeviceId, DeploymentId), String>,
    /// Devices served by fixed endpoints (no loads, GPU time not known).
    fixed_devices: BTreeSet<DeviceId>,
    /// Attach "loads" and detach "evictions" of fixed endpoints (not counted in the report).
    fixed_loads: u64,
    fixed_evictions: u64,
    keep_trace: bool,
    trace_lines: Vec<TraceLine>,
    events_out: Option<broadcast::Sender<TraceLine>>,
    front_door: Option<(u32, Duration)>,
    metrics: Option<Arc<RuntimeMetrics>>,
    /// Front-door programs by their client's key, while they take calls.
    programs: BTreeMap<String, SessionId>,
    /// Calls sent to each live front-door program so far (its idle end's check).
    program_calls: BTreeMap<SessionId, u64>,
    /// Routed front-door programs (ORACLE's program table): the deployment each is bound to and
    /// its key, while it takes calls.
    program_routes: BTreeMap<SessionId, (DeploymentId, String)>,
    /// Where routed front-door programs are recorded while open (`serve --state`).
    program_journal: Option<Arc<super::journal::Journal>>,
    /// The routed programs the journal held as open when it was handed over (open at the
    /// crash), key → its recorded binding (model and, from newer journals, dtype): the first
    /// routed call under such a key binds to that deployment again, and takes it out of here (a
    /// later program under the key is routed afresh).
    journal_kept: BTreeMap<String, serde_json::Value>,
    /// Routed programs whose key a later program took while they were still open: given up
    /// (no verdict can name them) once they have ended.
    give_up_at_end: BTreeSet<SessionId>,
    /// Routed front-door programs by key whose verdict has not landed yet, open or ended (a
    /// key reused by a later program names the later one), and their order, oldest first: past
    /// [`MAX_UNVERIFIED_PROGRAMS`] the oldest ended one is abandoned (its learner decision
    /// dropped), so a client that never posts verdicts cannot grow the table without bound.
    unverified: BTreeMap<String, SessionId>,
    unverified_order: std::collections::VecDeque<(String, SessionId)>,
    /// Routed front-door programs that had ended and awaited their verdict when the journal was
    /// last written by an earlier server (a crash or a restart), by key: their decisions are
    /// pending in the learner again under ids from [`crate::planner::RESTORED_PROGRAMS`] up, and
    /// a verdict posted now lands as it would have then. At most [`MAX_UNVERIFIED_PROGRAMS`]
    /// (the newest) are restored.
    restored: BTreeMap<String, RestoredProgram>,
    /// Per routed deployment, the finished programs its ledger had learned from when its state
    /// was last journaled ([`Self::journal_ledgers`]).
    ledgers_journaled: BTreeMap<DeploymentId, u64>,
    /// Per routed deployment, what its journal record's sequence number adds to its ledger's
    /// count of finished programs, so that the sequence keeps growing across restarts (a record
    /// this run could not take is then still replaced by this run's state).
    ledger_seq_base: BTreeMap<DeploymentId, u64>,
    /// Front-door step hints (`X-Step-ID`) seen so far and the planner node each stands for, so
    /// the core keeps output-length and tool-gap histories per step across programs.
    front_door_steps: BTreeMap<String, u32>,
    /// Journaled sessions not started yet, by trace index.
    durable: BTreeMap<usize, DurableSession>,
    /// Sessions of `ended` that failed (the metrics' gauges, without a scan per tick).
    ended_failed: usize,
    /// Sessions and programs the runtime's stop ended (counted in `ended_failed` too).
    ended_interrupted: usize,
    /// Set at shutdown: replicas still loading cut their load short ([`ReplicaArgs::stopping`]).
    stopping: tokio::sync::watch::Sender<bool>,
    keep_ended: Option<usize>,
    timeline_segments: Option<usize>,
    max_programs: Option<usize>,
    /// Routed workflows bound to a route member, made once per (workflow, member).
    bound_specs: exec::routing::BoundSpecs,
    /// Routed sessions (ORACLE's bindings): open rows, closed counts.
    routes: exec::routing::RouteBook,
    /// Ended sessions in the order they ended (for forgetting the oldest), and how many were
    /// forgotten (completed, failed).
    end_order: std::collections::VecDeque<SessionId>,
    forgotten: (usize, usize),

    sessions: BTreeMap<SessionId, ActorRef<SessionMsg>>,
    session_cells: BTreeMap<ActorId, SessionId>,
    /// Ready units waiting for a grant, with their prepared requests.
    pending: BTreeMap<ActivationId, (WorkItem, PendingCall)>,
    in_flight: BTreeMap<ActivationId, InFlight>,
    replicas: BTreeMap<ReplicaId, ReplicaEntry>,
    /// Replicas lost (or whose actor stopped) that the core may still grant units to.
    gone: BTreeSet<ReplicaId>,
    /// Grants the core made to a gone replica: released and requeued by `replica_gone`.
    regrants: Vec<(ReplicaId, WorkItem, PendingCall)>,
    replica_cells: BTreeMap<ActorId, ReplicaId>,
    /// Engines asleep as the core asked (`Command::Sleep`), by replica: woken by
    /// `Command::Wake`, unloaded by `Command::Unload`.
    parked: BTreeMap<ReplicaId, (DeviceId, DeploymentId, EngineHandle)>,
    /// Replicas still falling asleep that the core already asked to wake or to unload: done
    /// when their `Parked` (or `Unloaded`) arrives.
    pending_wakes: BTreeMap<ReplicaId, (DeviceId, DeploymentId)>,
    pending_unloads: BTreeSet<ReplicaId>,
    /// Replicas whose sleep was asked for, until `Parked` or `Unloaded` says how it went.
    falling_asleep: BTreeMap<ReplicaId, (DeviceId, DeploymentId)>,
    lifecycle_tail: BTreeMap<DeviceId, oneshot::Receiver<()>>,
    tools: Option<ActorRef<ToolMsg>>,
    next_request: u64,

    timelines: Vec<DeviceTimeline>,
    work: TokenWork,
    counters: Counters,
    faults: FaultCounters,
    /// What failed, retried and aborted attempts had cost the engines (the report's `wasted`).
    wasted: WastedWork,
    ended: BTreeMap<SessionId, SessionReport>,
    start_failures: Vec<(u32, f64, String)>,
    arrived: BTreeSet<usize>,
    telemetry: BTreeMap<ReplicaId, EngineTelemetry>,
    notes: Vec<String>,

    events: u64,
    last_tick_events: u64,
    quiet_ticks: u32,
    /// Quiet ticks before the watchdog fails waiting units ([`Self::stranded_after_ticks`]).
    stranded_after_ticks: u32,
    fatal: Option<String>,
    /// Events not yet handed to the core, and whether a `Flush` is on its way.
    buffer: Vec<Event>,
    flush_scheduled: bool,
    /// When the policy asked to plan again though no event comes
    /// ([`crate::planner::Planner::next_wakeup`]),
    /// checked at each tick.
    wakeup: Option<f64>,
    waiters: Vec<RpcReplyPort<Result<(), String>>>,
    shutting_down: bool,
    /// Set by `Abort` (the first step of a shutdown): no new workflow, session or front-door
    /// call is taken from then on.
    aborted: bool,
}

impl Actor for PlannerActor {
    type Msg = PlannerMsg;
    type State = PlannerActorState;
    type Arguments = PlannerArgs;

    async fn pre_start(&self, myself: ActorRef<PlannerMsg>, args: PlannerArgs) -> Result<PlannerActorState, ActorProcessingErr> {
        let timelines = args
            .devices
            .iter()
            .map(|d| DeviceTimeline::new(d.name.clone()))
            .collect();
        let mut state = PlannerActorState {
            ctx: args.ctx,
            planner: args.planner,
            factory: args.factory,
            devices: args.devices,
            trace: SessionTrace::new(args.trace),
            inputs: BTreeMap::new(),
            records: args.records,
            meta: args.meta,
            telemetry_every: args.telemetry_every,
            tool_workers: args.tool_workers,
            progress: args.progress,
            on_note: args.on_note,
            faults_seen: BTreeSet::new(),
            last_error: BTreeMap::new(),
            fixed_devices: BTreeSet::new(),
            fixed_loads: 0,
            fixed_evictions: 0,
            keep_trace: args.keep_trace,
            trace_lines: Vec::new(),
            events_out: args.events,
            front_door: args.front_door,
            metrics: args.metrics,
            programs: BTreeMap::new(),
            program_calls: BTreeMap::new(),
            program_routes: BTreeMap::new(),
            program_journal: None,
            journal_kept: BTreeMap::new(),
            give_up_at_end: BTreeSet::new(),
            unverified: BTreeMap::new(),
            unverified_order: std::collections::VecDeque::new(),
            restored: BTreeMap::new(),
            ledgers_journaled: BTreeMap::new(),
            ledger_seq_base: BTreeMap::new(),
            front_door_steps: BTreeMap::new(),
            durable: BTreeMap::new(),
            ended_failed: 0,
            ended_interrupted: 0,
            stopping: tokio::sync::watch::Sender::new(false),
            keep_ended: args.keep_ended,
            timeline_segments: args.timeline_segments,
            max_programs: args.max_programs,
            bound_specs: BTreeMap::new(),
            routes: exec::routing::RouteBook::default(),
            end_order: std::collections::VecDeque::new(),
            forgotten: (0, 0),
            sessions: BTreeMap::new(),
            session_cells: BTreeMap::new(),
            pending: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            replicas: BTreeMap::new(),
            gone: BTreeSet::new(),
            regrants: Vec::new(),
            replica_cells: BTreeMap::new(),
            parked: BTreeMap::new(),
            pending_wakes: BTreeMap::new(),
            pending_unloads: BTreeSet::new(),
            falling_asleep: BTreeMap::new(),
            lifecycle_tail: BTreeMap::new(),
            tools: None,
            next_request: 0,
            timelines,
            work: TokenWork::new(),
            counters: Counters::default(),
            faults: FaultCounters::default(),
            wasted: WastedWork::default(),
            ended: BTreeMap::new(),
            start_failures: Vec::new(),
            arrived: BTreeSet::new(),
            telemetry: BTreeMap::new(),
            notes: Vec::new(),
            events: 0,
            last_tick_events: 0,
            quiet_ticks: 0,
            stranded_after_ticks: ((STRANDED_AFTER.as_secs_f64() / args.tick.as_secs_f64().max(1e-3)).ceil() as u32).max(3),
            fatal: None,
            buffer: Vec::new(),
            flush_scheduled: false,
            wakeup: None,
            waiters: Vec::new(),
            shutting_down: false,
            aborted: false,
        };
        state.spawn_tools(&myself).await?;
        myself.send_interval(args.tick, || PlannerMsg::Tick);
        Ok(state)
    }

    async fn handle(&self, myself: ActorRef<PlannerMsg>, msg: PlannerMsg, state: &mut PlannerActorState) -> Result<(), ActorProcessingErr> {
        state.on_message(&myself, msg).await;
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<PlannerMsg>,
        event: SupervisionEvent,
        state: &mut PlannerActorState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, err) => state.child_stopped(&myself, cell, Some(format!("crashed: {err}"))).await,
            SupervisionEvent::ActorTerminated(cell, _, reason) => state.child_stopped(&myself, cell, reason).await,
            _ => {}
        }
        Ok(())
    }
}

impl PlannerActorState {
    async fn spawn_tools(&mut self, myself: &ActorRef<PlannerMsg>) -> Result<(), ActorProcessingErr> {
        let args = ToolsArgs {
            workers: self.tool_workers,
            attempts: self.ctx.retry.tool_attempts,
            planner: myself.clone(),
        };
        let (tools, _) = Actor::spawn_linked(None, ToolsActor, args, myself.get_cell()).await?;
        self.ctx.tools.set(tools.clone());
        self.tools = Some(tools);
        Ok(())
    }

    fn wall(&self) -> f64 {
        self.ctx.clock.wall()
    }

    fn total(&self) -> usize {
        self.trace.len()
    }

    /// Every session ended — and after an abort (a deadline, Ctrl-C, a stop), every call the
    /// ended sessions had in flight came back aborted, so that what it cost is counted as
    /// wasted before the report is built (the shells wait for this, bounded).
    fn done(&self) -> bool {
        self.ended_count() >= self.total() && !(self.aborted && !self.in_flight.is_empty())
    }

    /// Answers the `WaitDone` waiters once [`Self::done`].
    fn settle_waiters(&mut self) {
        if self.done() {
            for w in self.waiters.drain(..) {
                let _ = w.send(Ok(()));
            }
        }
    }

    /// Sessions that ended, forgotten ones included.
    fn ended_count(&self) -> usize {
        self.ended.len() + self.start_failures.len() + self.forgotten.0 + self.forgotten.1
    }

    fn note(&mut self, line: String) {
        if !self.notes.contains(&line) {
            if let Some(sink) = &self.on_note {
                sink(&line);
            }
            self.notes.push(line);
        }
    }

    /// Record one event of the run (`--trace`; the simulator's schema, wall seconds).
    fn log(&mut self, event: &'static str, line: TraceLine) {
        let now = self.wall();
        self.log_at(event, now, line);
    }

    /// [`Self::log`] stamped `wall` seconds (an event that happened before its message came).
    fn log_at(&mut self, event: &'static str, wall: f64, line: TraceLine) {
        if !self.keep_trace && self.events_out.is_none() {
            return;
        }
        let t = (wall * 1000.0).round() / 1000.0;
        let line = TraceLine { t, event, ..line };
        if let Some(tx) = &self.events_out {
            // No subscriber is not an error: nobody is listening right now.
            let _ = tx.send(line.clone());
        }
        if self.keep_trace {
            self.trace_lines.push(line);
        }
    }

    /// An engine failed: remember it for the device, and note the first of each kind per
    /// endpoint as it happens (with the endpoint and the server's message).
    fn engine_fault(&mut self, replica: ReplicaId, endpoint: String, error: EngineError) {
        let device = self.replicas.get(&replica).map(|r| r.device);
        tracing::warn!(%replica, %endpoint, kind = error.kind(), %error, "engine fault");
        if let Some(r) = self.replicas.get(&replica) {
            self.last_error.insert((r.device, r.deployment), error.to_string());
        }
        if self.faults_seen.insert((error.kind(), endpoint.clone())) {
            let on = device.map(|d| format!(" (replica {replica} on {d})")).unwrap_or_default();
            self.note(format!("first {} error from {endpoint}{on}: {error}", error.kind()));
        }
    }

    /// Why units of `deployment` may be unplaceable: the last engine error of each device that
    /// had one while serving it (another model's error on the same device is not the reason).
    fn last_errors(&self, deployment: DeploymentId) -> String {
        let parts: Vec<String> =
            self.last_error.iter().filter(|((_, d), _)| *d == deployment).map(|((device, _), e)| format!("{device}: {e}")).collect();
        if parts.is_empty() {
            return String::new();
        }
        format!("; last engine errors of {}: {}", self.model_name(deployment), parts.join("; "))
    }

    async fn on_message(&mut self, myself: &ActorRef<PlannerMsg>, msg: PlannerMsg) {
        if !matches!(msg, PlannerMsg::Tick | PlannerMsg::Telemetry { .. } | PlannerMsg::Flush) {
            self.events += 1;
        }
        match msg {
            PlannerMsg::Arrive(i) => self.on_arrival(myself, i).await,
            PlannerMsg::UnitReady { item, call } => {
                if !self.sessions.contains_key(&item.activation.session) {
                    return;
                }
                self.log("ready", TraceLine {
                    session: Some(item.activation.session.0),
                    activation: Some(item.activation.index),
                    ..blank()
                });
                self.pending.insert(item.activation, (item.clone(), call));
                self.post(myself, Event::UnitReady(item));
            }
            PlannerMsg::NearReady(item) => {
                if self.sessions.contains_key(&item.activation.session) {
                    self.post(myself, Event::UnitNearReady(item));
                }
            }
            PlannerMsg::Outlook { session, deployments } => {
                if self.sessions.contains_key(&session) {
                    self.post(myself, Event::SessionOutlook { session, deployments });
                }
            }
            PlannerMsg::ToolStarted { activation, predicted_s, workflow, node } => {
                self.counters.tool_calls += 1;
                self.log("tool_start", TraceLine { session: Some(activation.session.0), activation: Some(activation.index), ..blank() });
                self.post(myself, Event::ToolStarted { activation, predicted_s, workflow, node });
            }
            PlannerMsg::ToolFinished { activation } => {
                self.log("tool_done", TraceLine { session: Some(activation.session.0), activation: Some(activation.index), ..blank() });
                self.post(myself, Event::ToolFinished { activation });
            }
            PlannerMsg::ToolCrashed { activation, reason } => {
                self.faults.tool_crashes += 1;
                tracing::warn!(%activation, %reason, "tool executor crashed");
            }
            PlannerMsg::SessionEnded(report) => self.on_session_ended(myself, *report).await,
            PlannerMsg::Loaded { replica, result } => match result {
                Ok(()) => {
                    let device = self.replicas.get(&replica).map(|r| r.device.0);
                    self.log("loaded", TraceLine { replica: Some(replica.0), device, ..blank() });
                    self.on_loaded(myself, replica).await;
                }
                Err(reason) => {
                    let device = self.replicas.get(&replica).map(|r| r.device.0);
                    self.log("load_failed", TraceLine { replica: Some(replica.0), device, detail: Some(reason.clone()), ..blank() });
                    self.replica_gone(myself, replica, format!("load failed: {reason}")).await;
                }
            },
            PlannerMsg::FirstToken { replica, activation, at } => {
                // Logged at the token's time, once per dispatch (a retried attempt's first token
                // is not a second one; a call moved off a lost replica is dispatched anew); a
                // message from an attempt of a replica the call left is stale.
                let fresh = self.in_flight.get_mut(&activation).filter(|f| f.replica == replica && !f.first_token_logged);
                if let Some(f) = fresh {
                    f.first_token_logged = true;
                    let wall = self.ctx.clock.wall_at(at);
                    let line = TraceLine { session: Some(activation.session.0), activation: Some(activation.index), replica: Some(replica.0), ..blank() };
                    self.log_at("first_token", wall, line);
                }
            }
            PlannerMsg::Finished { replica, activation, completion, attempts, wasted } => {
                self.faults.retries += u64::from(attempts.saturating_sub(1));
                let f = self.take_in_flight(activation);
                self.waste(activation, f.as_ref().map(|f| f.deployment), &wasted);
                let Some(f) = f else { return };
                let output_tokens = completion.output_tokens;
                if self.keep_trace || self.events_out.is_some() {
                    let wall = self.wall();
                    let at = |t: f64| Some((((wall - completion.latency_s + t) * 1000.0).round() / 1000.0).to_string());
                    let line = TraceLine {
                        session: Some(activation.session.0),
                        activation: Some(activation.index),
                        replica: Some(replica.0),
                        ..blank()
                    };
                    // An answer that came whole (not streamed) has its first token at its end:
                    // logged now, with the time the engine measured.
                    if !f.first_token_logged {
                        self.log("first_token", TraceLine { detail: at(completion.ttft_s).map(|t| format!("at {t} s")), ..line.clone() });
                    }
                    let detail = finish_detail(output_tokens, completion.prompt_tokens, completion.cached_prompt_tokens);
                    self.log("finish", TraceLine { detail: Some(detail), ..line });
                }
                if let Some(d) = self.ctx.deployments.get(f.deployment.0 as usize) {
                    self.routes.charge(activation.session, &d.model, completion.prompt_tokens, completion.cached_prompt_tokens, output_tokens);
                }
                self.counters.llm_call_finished(
                    &mut self.work,
                    f.deployment,
                    f.workflow,
                    completion.prompt_tokens,
                    completion.cached_prompt_tokens,
                    output_tokens,
                );
                // The session first (it is on the critical path); the core folds the finish
                // before anything the session sends next, which queues behind this message.
                if let Some(s) = self.sessions.get(&activation.session) {
                    let _ = s.send_message(SessionMsg::LlmDone { activation, replica, completion });
                }
                self.post(myself, Event::UnitFinished { activation, replica, output_tokens });
            }
            PlannerMsg::CallFailed { replica, activation, reason, attempts, wasted } => {
                self.log("call_failed", TraceLine {
                    session: Some(activation.session.0),
                    activation: Some(activation.index),
                    replica: Some(replica.0),
                    detail: Some(reason.clone()),
                    ..blank()
                });
                self.faults.retries += u64::from(attempts.saturating_sub(1));
                self.faults.failed_calls += 1;
                let f = self.take_in_flight(activation);
                self.waste(activation, f.as_ref().map(|f| f.deployment), &wasted);
                let Some(f) = f else { return };
                let output_tokens = f.call.expected_output_tokens;
                self.post(myself, Event::UnitFinished { activation, replica, output_tokens });
                if let Some(s) = self.sessions.get(&activation.session) {
                    let _ = s.send_message(SessionMsg::LlmFailed { activation, reason });
                }
            }
            PlannerMsg::Aborted { replica, activation, attempts, wasted } => {
                self.log("call_aborted", TraceLine {
                    session: Some(activation.session.0),
                    activation: Some(activation.index),
                    replica: Some(replica.0),
                    ..blank()
                });
                self.faults.retries += u64::from(attempts.saturating_sub(1));
                let f = self.take_in_flight(activation);
                self.waste(activation, f.as_ref().map(|f| f.deployment), &wasted);
                let Some(f) = f else { return };
                let output_tokens = f.call.expected_output_tokens;
                self.post(myself, Event::UnitFinished { activation, replica, output_tokens });
            }
            PlannerMsg::Restarted { replica } => {
                self.faults.restarts += 1;
                let device = self.replicas.get(&replica).map(|r| r.device.0);
                self.log("restart", TraceLine { replica: Some(replica.0), device, ..blank() });
                self.note(format!("replica {replica} was restarted after its engine stopped answering or failed to start"));
            }
            PlannerMsg::ReplicaLost { replica, actor, reason, wasted } => {
                // Its calls run again elsewhere: what their attempts here had cost is wasted
                // (counted in the run, not charged to a program).
                self.count_waste(&wasted);
                if self.is_current(replica, actor) {
                    self.replica_gone(myself, replica, reason).await;
                }
            }
            PlannerMsg::EngineFault { replica, endpoint, error } => self.engine_fault(replica, endpoint, error),
            PlannerMsg::Parked { replica, engine } => {
                let Some((device, deployment)) = self.falling_asleep.remove(&replica) else {
                    let _ = engine.engine.unload().await;
                    return;
                };
                if self.shutting_down {
                    let _ = engine.engine.unload().await;
                } else if self.pending_unloads.remove(&replica) {
                    self.parked.insert(replica, (device, deployment, engine));
                    self.unload_parked(myself, replica);
                } else if self.pending_wakes.remove(&replica).is_some() {
                    self.start_replica(myself, replica, deployment, device, Some(engine)).await;
                } else {
                    self.log("asleep", TraceLine { replica: Some(replica.0), device: Some(device.0), ..blank() });
                    self.parked.insert(replica, (device, deployment, engine));
                    self.post(myself, Event::ReplicaAsleep { replica });
                }
            }
            PlannerMsg::Unloaded { replica } => {
                self.falling_asleep.remove(&replica);
                self.pending_unloads.remove(&replica);
                if self.shutting_down {
                    return;
                }
                self.log("unloaded", TraceLine { replica: Some(replica.0), ..blank() });
                self.post(myself, Event::ReplicaUnloaded { replica });
                // Asked to wake a replica whose engine could not sleep: load it cold instead.
                if let Some((device, deployment)) = self.pending_wakes.remove(&replica) {
                    self.start_replica(myself, replica, deployment, device, None).await;
                }
            }
            PlannerMsg::Telemetry { replica, telemetry } => {
                self.observe_usage(replica, &telemetry);
                self.telemetry.insert(replica, telemetry);
            }
            PlannerMsg::Note(line) => self.note(line),
            PlannerMsg::Flush => {
                self.flush_scheduled = false;
                self.flush(myself).await;
            }
            PlannerMsg::Tick => {
                self.withdraw_abandoned_calls(myself);
                self.on_tick();
                self.wake_if_due(myself).await;
            }
            PlannerMsg::Abort(reason) => self.abort(reason),
            PlannerMsg::WaitDone(port) => {
                if let Some(f) = &self.fatal {
                    let _ = port.send(Err(f.clone()));
                } else if self.done() {
                    let _ = port.send(Ok(()));
                } else {
                    self.waiters.push(port);
                }
            }
            PlannerMsg::Shutdown(port) => {
                let out = self.shutdown().await;
                let _ = port.send(Box::new(out));
                myself.stop(None);
            }
            PlannerMsg::Register { spec, reply } => {
                let _ = reply.send(self.register(spec));
            }
            PlannerMsg::Submit { workflow, inputs, reply } => {
                let r = self.submit(myself, workflow, inputs).await;
                let _ = reply.send(r);
            }
            PlannerMsg::Status { sessions, reply } => {
                let _ = reply.send(sessions.iter().map(|s| self.status(*s)).collect());
            }
            PlannerMsg::ProgramCall { program, deployment, next, request, sink, reply, accepted } => {
                match self.program_session(myself, program.as_ref()).await {
                    Ok((id, _)) => {
                        if let Some(a) = accepted {
                            let _ = a.send(Ok(()));
                        }
                        self.send_program_call(id, program.as_ref(), deployment, next, request, sink, reply)
                    }
                    Err(why) => {
                        if let Some(a) = accepted {
                            let _ = a.send(Err(why.clone()));
                        }
                        let _ = reply.send(Err(why));
                    }
                }
            }
            PlannerMsg::RoutedProgramCall { program, route, next, request, sink, reply } => {
                self.routed_program_call(myself, program, route, next, request, sink, reply).await;
            }
            PlannerMsg::ProgramJournal(journal) => {
                match super::actors::off_the_reactor(|| journal.routed_programs()) {
                    Ok(open) => self.journal_kept = open.into_iter().collect(),
                    Err(e) => self.note(format!("router: the journal's routed programs cannot be read: {e}")),
                }
                match super::actors::off_the_reactor(|| journal.learned()) {
                    Ok(rows) => self.relearn(&rows),
                    Err(e) => self.note(format!("router: the journal's learned outcomes cannot be read: {e}")),
                }
                match super::actors::off_the_reactor(|| journal.awaited_verdicts()) {
                    Ok(rows) => self.restore_awaited(&journal, rows),
                    Err(e) => self.note(format!("router: the journal's awaited verdicts cannot be read: {e}")),
                }
                match super::actors::off_the_reactor(|| journal.ledgers()) {
                    Ok(rows) => self.restore_ledgers(&rows),
                    Err(e) => self.note(format!("router: the journal's ledger statistics cannot be read: {e}")),
                }
                self.program_journal = Some(journal);
            }
            PlannerMsg::ProgramVerdict { program, success, reply } => {
                let r = self.program_verdict(myself, &program, success).await;
                let _ = reply.send(r);
            }
            PlannerMsg::ProgramIdle { session, calls } => {
                // Ends only if no call was sent to it since it went idle; its key is freed first,
                // so the next call with that key starts a new program instead of reaching one
                // that is ending.
                if self.program_calls.get(&session) == Some(&calls)
                    && let Some(actor) = self.sessions.get(&session)
                {
                    self.programs.retain(|_, s| *s != session);
                    let _ = actor.send_message(SessionMsg::EndIdle(calls));
                }
            }
            PlannerMsg::Cancel { sessions, reason } => {
                for id in sessions {
                    if let Some(actor) = self.sessions.get(&id) {
                        let _ = actor.send_message(SessionMsg::Cancel(reason.clone()));
                    }
                }
            }
        }
    }

    /// Add `spec` to the run's workflows. Its deployments must map onto the served table: the
    /// same model and dtype, a context no longer than the served one (the planner's table and
    /// its profiles are built once, at start). A routed workflow must fit the router built at
    /// start ([`Self::check_route`]).
    fn register(&mut self, spec: Arc<crate::workflow::WorkflowSpec>) -> Result<u32, String> {
        if self.shutting_down || self.aborted {
            return Err(SHUTTING_DOWN.into());
        }
        let w = u32::try_from(self.ctx.workflows.len()).map_err(|_| "too many workflows".to_string())?;
        let mut ctx = (*self.ctx).clone();
        for d in spec.deployments.values() {
            let found = ctx.deployments.iter().find(|info| {
                info.model.eq_ignore_ascii_case(&d.model) && info.dtype == d.dtype && info.max_model_len >= d.max_context
            });
            match found {
                Some(info) => {
                    ctx.deployment_of.insert((w, d.name.clone()), info.id);
                }
                None => {
                    let served: Vec<String> = ctx
                        .deployments
                        .iter()
                        .map(|i| format!("{} {} (context {})", i.model, format!("{:?}", i.dtype).to_lowercase(), i.max_model_len))
                        .collect();
                    return Err(format!(
                        "deployment `{}` ({} {}, max_context {}) is not served here; served: {}",
                        d.name,
                        d.model,
                        format!("{:?}", d.dtype).to_lowercase(),
                        d.max_context,
                        if served.is_empty() { "nothing".to_string() } else { served.join(", ") }
                    ));
                }
            }
        }
        self.check_route(w, &spec, &ctx)?;
        let deployment_of = &ctx.deployment_of;
        ctx.node_info.push(&spec, |w, name| deployment_of.get(&(w, name.to_string())).copied());
        ctx.workflows.push(spec);
        self.records.push(Arc::new(Vec::new()));
        self.ctx = Arc::new(ctx);
        Ok(w)
    }

    /// Whether routed workflow `spec` (index `w`, its deployments mapped in `ctx`) can be routed
    /// by the router the runtime started with (`Ok` for an unrouted one). The router — its
    /// TF-IDF vocabulary, PCA basis, verifier prototypes, LinUCB arms and context, one DISC
    /// ledger per model — is fitted once on the start-up workflows' exemplars and learns online
    /// from then on; refitting it would discard what it learned. So a workflow registered later
    /// is routed only among models the router already has, and only when its verifier is one its
    /// classifier selects among (a program classified to another verifier is judged by that one,
    /// and would teach the learner failure however it did). Its programs are then bound,
    /// admitted, verified and learned from like those of a start-up workflow.
    fn check_route(&self, w: u32, spec: &crate::workflow::WorkflowSpec, ctx: &RunContext) -> Result<(), String> {
        let Some(route) = exec::routing::route_of(w, spec, &ctx.deployment_of).map_err(|e| e.to_string())? else {
            return Ok(());
        };
        let name = &spec.name;
        let Some(known) = self.planner.routing_verifiers() else {
            return Err(format!(
                "workflow `{name}` has a routed node and this runtime has no router: ORACLE's router is built from the routed workflows the runtime starts with (`switchyard serve --workflow FILE`)"
            ));
        };
        if let Some(&outside) = route.iter().find(|d| !self.planner.is_routed(**d)) {
            let model = |d: DeploymentId| ctx.deployments.get(d.0 as usize).map_or_else(|| format!("{d:?}"), |i| i.model.clone());
            let arms: Vec<String> = ctx.deployments.iter().filter(|i| self.planner.is_routed(i.id)).map(|i| model(i.id)).collect();
            return Err(format!(
                "workflow `{name}` routes to {}, which is not one of the router's models ({}): the router's models are those of the routed workflows the runtime started with",
                model(outside),
                arms.join(", ")
            ));
        }
        match exec::routing::workflow_verifier(spec) {
            None => Err(format!(
                "workflow `{name}` is routed but has no verifier: a routed workflow needs a one-term `metric:` or a `verifier:` term"
            )),
            Some(v) if !known.iter().any(|k| k == v) => Err(format!(
                "workflow `{name}` is verified by `{v}`, which the router's classifier (fitted at start on {}) cannot select: start the runtime with a routed workflow of that task type",
                known.join(", ")
            )),
            Some(_) => Ok(()),
        }
    }

    /// The planner node of a front-door step hint: steps get nodes from
    /// [`FRONT_DOOR_STEP_BASE`] up in the order they are first seen (the deployments' own nodes
    /// are below it); past [`MAX_FRONT_DOOR_STEPS`] distinct steps a new one gets none (the call
    /// keeps its deployment's node), so a client cannot grow the table without bound.
    fn step_node(&mut self, step: &str) -> Option<u32> {
        if let Some(&n) = self.front_door_steps.get(step) {
            return Some(n);
        }
        let k = u32::try_from(self.front_door_steps.len()).ok().filter(|k| (*k as usize) < MAX_FRONT_DOOR_STEPS)?;
        let node = FRONT_DOOR_STEP_BASE + k;
        self.front_door_steps.insert(step.to_string(), node);
        Some(node)
    }

    /// The front door: the session of `program` (a session of the front-door workflow), started
    /// at its first call, and whether this call started it; `Err` with why when no program can
    /// start.
    async fn program_session(&mut self, myself: &ActorRef<PlannerMsg>, program: Option<&String>) -> Result<(SessionId, bool), String> {
        let Some((workflow, idle_timeout)) = self.front_door else {
            return Err("this runtime has no front door".into());
        };
        if self.shutting_down || self.aborted || self.fatal.is_some() {
            return Err(SHUTTING_DOWN.into());
        }
        let existing = program.and_then(|p| self.programs.get(p).copied());
        if let Some(id) = existing.filter(|id| self.sessions.contains_key(id)) {
            return Ok((id, false));
        }
        if let (Some(max), Some(_)) = (self.max_programs, program)
            && self.programs.len() >= max
        {
            return Err(format!(
                "{TOO_MANY_PROGRAMS}: {} keyed programs are open, this server's limit (`--max-programs`); end programs with `X-Program-Done: true`, or wait for idle ones to end",
                self.programs.len()
            ));
        }
        let wall = self.wall();
        let i = self.trace.push(TraceEntry { at: wall, workflow, record: 0 });
        let id = SessionId(i as u32);
        self.arrived.insert(i);
        let args = ProgramArgs { ctx: Arc::clone(&self.ctx), session: id, workflow, planner: myself.clone(), arrived: wall, idle_timeout };
        match Actor::spawn_linked(None, ProgramActor, args, myself.get_cell()).await {
            Ok((actor, _)) => {
                self.session_cells.insert(actor.get_id(), id);
                self.sessions.insert(id, actor);
                let detail = Some(format!("program {}", program.map_or("(one call)", String::as_str)));
                self.log("arrival", TraceLine { session: Some(id.0), detail, ..blank() });
                self.post(myself, Event::SessionArrived { session: id, workflow });
                if let Some(p) = program {
                    self.programs.insert(p.clone(), id);
                }
                Ok((id, true))
            }
            Err(e) => {
                self.start_failure(workflow, wall, format!("{id}: program actor: {e}"));
                Err(format!("cannot start the program: {e}"))
            }
        }
    }

    /// The front door: hand one call to the actor of program session `id` (`program` its key).
    #[allow(clippy::too_many_arguments)]
    fn send_program_call(
        &mut self,
        id: SessionId,
        program: Option<&String>,
        deployment: DeploymentId,
        next: Option<DeploymentId>,
        mut request: ProgramRequest,
        sink: super::engine::TokenSink,
        reply: oneshot::Sender<Result<super::engine::Completion, String>>,
    ) {
        if program.is_none() {
            request.program_done = true;
        }
        if request.program_done
            && let Some(p) = program
        {
            // The program ends after this call: its key is free for the client's next program.
            self.programs.remove(p);
        }
        let node = match request.step.as_deref() {
            Some(step) => self.step_node(step).unwrap_or(deployment.0),
            None => deployment.0,
        };
        let call = ProgramCall { request, deployment, node, next, sink, reply };
        match self.sessions.get(&id) {
            Some(actor) => match actor.send_message(SessionMsg::Call(Box::new(call))) {
                Ok(()) => *self.program_calls.entry(id).or_insert(0) += 1,
                Err(ractor::MessagingErr::SendErr(SessionMsg::Call(call))) => {
                    tracing::warn!(%id, "program actor gone");
                    let _ = call.reply.send(Err("the program ended".into()));
                }
                Err(e) => tracing::warn!(%id, error = %e, "program actor gone"),
            },
            None => {
                let _ = call.reply.send(Err("the program ended".into()));
            }
        }
    }

    /// The front door, routed (paper 002): a call of `program` that names the router's model.
    /// At the program's first such call the core's router binds it — its verifier from the
    /// call's text, its model by the learner and DISC's divert rule, or, with a program journal
    /// that recorded the program as open (it was, at a crash), that model again — and the
    /// member's ledger admits it (until then its calls wait, gated); with a journal the binding
    /// is recorded before anything else happens. The binding goes back on `route.bound` before
    /// the call is handed on; this call and every later routed call of the program run on the
    /// bound model.
    #[allow(clippy::too_many_arguments)]
    async fn routed_program_call(
        &mut self,
        myself: &ActorRef<PlannerMsg>,
        program: Option<String>,
        route: super::actors::ProgramRoute,
        next: Option<DeploymentId>,
        request: ProgramRequest,
        sink: super::engine::TokenSink,
        reply: oneshot::Sender<Result<super::engine::Completion, String>>,
    ) {
        let fail = |route: super::actors::ProgramRoute, reply: oneshot::Sender<Result<super::engine::Completion, String>>, why: String| {
            let _ = route.bound.send(Err(why.clone()));
            let _ = reply.send(Err(why));
        };
        let Some(key) = program else {
            return fail(route, reply, "a routed call needs a program key (`X-Session-ID`): the router binds programs, and a verdict names its program by it".into());
        };
        let members = match self.planner.routing() {
            Some(r) => r.members().to_vec(),
            None => return fail(route, reply, "this runtime has no router".into()),
        };
        let (id, created) = match self.program_session(myself, Some(&key)).await {
            Ok(started) => started,
            Err(why) => return fail(route, reply, why),
        };
        let binding = match self.program_routes.get(&id) {
            Some((d, _)) => {
                let row = self.routes.get(id);
                ProgramBinding {
                    model: self.model_name(*d),
                    verifier: row.map(|r| r.verifier.clone()).unwrap_or_default(),
                    diverted: row.is_some_and(|r| r.diverted),
                    kept: false,
                }
            }
            None => match self.bind_routed_program(&key, id, &members, &request) {
                Ok(b) => b,
                Err(why) => {
                    // A program this call started ends with the reason; one that already ran
                    // calls on a named model goes on (only this call is refused).
                    if created && let Some(actor) = self.sessions.get(&id) {
                        let _ = actor.send_message(SessionMsg::Fail(why.clone()));
                    }
                    return fail(route, reply, why);
                }
            },
        };
        let Some(&(deployment, _)) = self.program_routes.get(&id) else { return };
        let next = if route.next_routed { Some(deployment) } else { next };
        let _ = route.bound.send(Ok(binding));
        self.send_program_call(id, Some(&key), deployment, next, request, sink, reply);
    }

    fn model_name(&self, d: DeploymentId) -> String {
        self.ctx.deployments.get(d.0 as usize).map(|i| i.model.clone()).unwrap_or_default()
    }

    /// Bind routed front-door program `key` (session `id`) at its first routed call: see
    /// [`Self::routed_program_call`]. An earlier program under the key still awaiting its
    /// verdict is given up (a key names one program at a time).
    fn bind_routed_program(
        &mut self,
        key: &str,
        id: SessionId,
        members: &[DeploymentId],
        request: &ProgramRequest,
    ) -> Result<ProgramBinding, String> {
        let journal = self.program_journal.clone();
        let kept = self
            .journal_kept
            .remove(key)
            .and_then(|binding| self.deployment_named(&binding))
            .filter(|d| members.contains(d));
        let (prompt, _) = request.rendered_prompt();
        let task = program_task(request);
        let tokens = crate::tokens::count(&prompt) as u64;
        let now = self.ctx.clock.now();
        let record = match kept {
            Some(d) => self.planner.bind_program_to(id, d, &task, tokens, now),
            None => self.planner.bind_program(id, members, &task, tokens, now),
        }
        .map_err(|e| format!("the router cannot bind the program: {e}"))?;
        let model = self.model_name(record.deployment);
        if let Some(j) = &journal {
            let entry = serde_json::json!({
                "model": model,
                "dtype": self.dtype_name(record.deployment),
                "verifier": record.verifier,
                "session": id.0,
            });
            if let Err(e) = super::actors::off_the_reactor(|| j.open_routed_program(key, &entry)) {
                if let Err(e) = self.planner.program_abandoned(id, now) {
                    self.note(format!("router: session {id}: {e}"));
                }
                // A program that goes on (it made calls on named models before) must not stay
                // gated by a binding it no longer has.
                self.planner.ungate(id);
                return Err(format!("the journal: {e}"));
            }
        }
        self.give_up_restored(key, "a later program took its key before its verdict came", false);
        if let Some(old) = self.unverified.get(key).copied().filter(|old| *old != id) {
            if self.sessions.contains_key(&old) {
                // Still open (its last call runs): given up once it has ended, so that its
                // ledger still learns its peak and run time and holds its reservation until then.
                self.unverified.remove(key);
                self.give_up_at_end.insert(old);
            } else {
                self.give_up_unverified(key, old, "a later program took its key before its verdict came");
            }
        }
        let front_door = self.front_door.map_or(0, |(w, _)| w);
        let diverted = record.deployment != record.chosen;
        let row = exec::routing::RouteRow {
            workflow: front_door,
            model: model.clone(),
            diverted,
            gated: self.planner.state().is_gated(id),
            // The client's grader decides the verdict; the row names the verifier the
            // classifier selected for it.
            feedback: record.verifier.clone(),
            cost: 0.0,
            verifier: record.verifier.clone(),
            verifier_score: None,
        };
        let how = if kept.is_some() { ", kept from the journal" } else if diverted { ", diverted" } else { "" };
        let detail = Some(format!("program {key} routed to {model} (verifier {}{how})", record.verifier));
        self.log("route", TraceLine { session: Some(id.0), detail, ..blank() });
        self.routes.open(id, row);
        if let Some(m) = &self.metrics {
            m.routed(&model);
        }
        self.program_routes.insert(id, (record.deployment, key.to_string()));
        self.note_unverified(key.to_string(), id);
        Ok(ProgramBinding { model, verifier: record.verifier, diverted, kept: kept.is_some() })
    }

    /// Routed front-door program `id` (key `key`) awaits its verdict; past
    /// [`MAX_UNVERIFIED_PROGRAMS`] (with those restored from before a restart) the oldest ended
    /// one is given up.
    fn note_unverified(&mut self, key: String, id: SessionId) {
        self.unverified.insert(key.clone(), id);
        self.unverified_order.push_back((key, id));
        // Programs restored from before a restart count too, and are older than any of this run.
        while self.unverified_order.len() + self.restored.len() > MAX_UNVERIFIED_PROGRAMS && !self.restored.is_empty() {
            let oldest = self.restored.iter().min_by(|a, b| a.1.ended.total_cmp(&b.1.ended)).map(|(k, _)| k.clone());
            let Some(k) = oldest else { break };
            self.give_up_restored(&k, "more than the routed programs kept awaiting a verdict", true);
        }
        while self.unverified_order.len() > MAX_UNVERIFIED_PROGRAMS {
            let Some(pos) = self.unverified_order.iter().position(|(_, s)| !self.sessions.contains_key(s)) else { break };
            let Some((k, s)) = self.unverified_order.remove(pos) else { break };
            self.give_up_unverified(&k, s, "more than the routed programs kept awaiting a verdict");
        }
    }

    /// Routed front-door program `id` (key `key`) will get no verdict: its learner decision is
    /// dropped (it taught its ledger when it ended, or releases its reservation now).
    fn give_up_unverified(&mut self, key: &str, id: SessionId, why: &str) {
        if self.unverified.get(key) == Some(&id) {
            self.unverified.remove(key);
        }
        self.unverified_order.retain(|(_, s)| *s != id);
        self.journal_forget_awaited(key, u64::from(id.0));
        if self.routes.contains(id) {
            self.routes.close(id, None, None);
            if let Err(e) = self.planner.program_abandoned(id, self.ctx.clock.now()) {
                self.note(format!("router: session {id}: {e}"));
            }
            if let Some(m) = &self.metrics {
                m.verdict("given_up");
            }
            self.log("verdict_given_up", TraceLine { session: Some(id.0), detail: Some(format!("program {key}: {why}")), ..blank() });
        }
    }

    /// The verdict of routed front-door program `key` (its client's grader): the learner's
    /// update (the reward answered), then a planning pass, since ledgers may admit programs.
    async fn program_verdict(&mut self, myself: &ActorRef<PlannerMsg>, key: &str, success: f64) -> Result<f64, ServiceError> {
        if !(0.0..=1.0).contains(&success) {
            return Err(ServiceError::BadRequest(format!("`success` must be between 0 and 1, not {success}")));
        }
        let Some(&id) = self.unverified.get(key) else {
            if let Some(restored) = self.restored.get(key).copied() {
                return self.restored_verdict(myself, key, restored, success).await;
            }
            return Err(ServiceError::NotFound(format!(
                "no routed program `{key}` awaits a verdict (never routed here, its verdict landed already, it failed, or it was given up)"
            )));
        };
        if self.sessions.contains_key(&id) {
            return Err(ServiceError::Conflict(format!(
                "program `{key}` is still open: its verdict is taken once its last call has returned (`X-Program-Done: true`, or its idle end)"
            )));
        }
        self.flush(myself).await;
        let cost = self.routes.get(id).map_or(0.0, |r| r.cost);
        let learned = self
            .planner
            .program_verdict(id, success, cost, self.ctx.clock.now())
            .map_err(|e| ServiceError::Unavailable(format!("the router refused the verdict of program `{key}`: {e}")))?;
        self.journal_learned(&learned, Some((key, u64::from(id.0))));
        let reward = learned.reward;
        self.unverified.remove(key);
        self.unverified_order.retain(|(_, s)| *s != id);
        self.routes.close(id, Some(success), None);
        if let Some(m) = &self.metrics {
            m.verdict("landed");
        }
        self.log("verdict", TraceLine { session: Some(id.0), detail: Some(format!("program {key}: success {success}, reward {reward:.4}")), ..blank() });
        self.planning_pass(myself).await;
        Ok(reward)
    }

    /// The verdict of routed program `key`, restored from the journal ([`Self::restore_awaited`]):
    /// the learner learns it as it would have before the restart.
    async fn restored_verdict(
        &mut self,
        myself: &ActorRef<PlannerMsg>,
        key: &str,
        restored: RestoredProgram,
        success: f64,
    ) -> Result<f64, ServiceError> {
        let learned = self
            .planner
            .restored_verdict(restored.program, success, restored.cost, self.ctx.clock.now())
            .map_err(|e| ServiceError::Unavailable(format!("the router refused the verdict of program `{key}`: {e}")))?;
        self.restored.remove(key);
        self.journal_learned(&learned, Some((key, restored.session)));
        if let Some(m) = &self.metrics {
            m.verdict("landed");
        }
        let reward = learned.reward;
        // Not a trace line: it has no session in this run, and every run's event stream would
        // get it (with the client's key).
        tracing::info!(program = key, success, reward, "verdict of a program that ended before the restart");
        self.planning_pass(myself).await;
        Ok(reward)
    }

    /// Restore the routed programs a journal recorded as ended and awaiting their verdict (a
    /// restart): each one recorded under this router's features, on a model it routes, with a
    /// context the learner takes — and whose key no program open at the crash holds (that one is
    /// newer) — is pending in the learner again (the newest [`MAX_UNVERIFIED_PROGRAMS`]); the
    /// others are dropped from the journal in one transaction: no verdict could teach this
    /// router anything by them.
    fn restore_awaited(&mut self, journal: &Arc<super::journal::Journal>, mut rows: Vec<(String, serde_json::Value)>) {
        let Some(features) = self.planner.routing_features_digest() else { return };
        let ended = |v: &serde_json::Value| v.get("ended").and_then(serde_json::Value::as_f64).unwrap_or(0.0);
        rows.sort_by(|a, b| ended(&b.1).total_cmp(&ended(&a.1)));
        let now = self.ctx.clock.now();
        let total = rows.len();
        for (key, row) in rows {
            let entry = (|| {
                if self.restored.len() >= MAX_UNVERIFIED_PROGRAMS
                    || self.journal_kept.contains_key(&key)
                    || row.get("features")?.as_u64()? != features
                {
                    return None;
                }
                let deployment = self.deployment_named(&row)?;
                let context = learner_context_of(&row)?;
                let verifier = row.get("verifier")?.as_str()?.to_string();
                let cost = row.get("cost")?.as_f64()?;
                Some((deployment, context, verifier, cost, row.get("session")?.as_u64()?))
            })();
            let program = crate::planner::RESTORED_PROGRAMS + self.restored.len() as u64;
            if let Some((deployment, context, verifier, cost, session)) = entry
                && self.planner.restore_awaiting(program, deployment, context, &verifier, now).is_ok()
            {
                self.restored.insert(key, RestoredProgram { program, session, cost, ended: ended(&row) });
            }
        }
        let restored = self.restored.len();
        if restored < total {
            let keep: BTreeSet<String> = self.restored.keys().cloned().collect();
            if let Err(e) = super::actors::off_the_reactor(|| journal.keep_awaited(&keep)) {
                tracing::warn!(error = %e, "the journal did not drop the awaited verdicts this router cannot use");
            }
        }
        if total > 0 {
            self.note(format!(
                "router: {restored} programs that ended before the restart await their verdict ({} dropped: recorded under other features, on a model no route has, under a key a program open at the crash holds, or past the {MAX_UNVERIFIED_PROGRAMS} newest)",
                total - restored
            ));
        }
    }

    /// Routed program `key`, restored from the journal, will get no verdict (a new program took
    /// its key, or it is the oldest past the cap): its decision is dropped, and with
    /// `forget_record` its journal record (a new program's open write removed it already: session
    /// numbers restart with each run, so a delayed removal by the old number could match the
    /// record the new program writes at its end).
    fn give_up_restored(&mut self, key: &str, why: &str, forget_record: bool) {
        let Some(r) = self.restored.remove(key) else { return };
        if let Err(e) = self.planner.restored_abandoned(r.program, self.ctx.clock.now()) {
            self.note(format!("router: program {key} (ended before the restart): {e}"));
        }
        if forget_record {
            self.journal_forget_awaited(key, r.session);
        }
        if let Some(m) = &self.metrics {
            m.verdict("given_up");
        }
        tracing::info!(program = key, why, "a program that ended before the restart was given up before its verdict came");
    }

    /// With a program journal, drop the record of the verdict awaited by program `key` recorded
    /// under `session` (it landed, or the program was given up), beside the actor: a write that
    /// does not finish leaves a record a restart restores, which only a later program under the
    /// key or a verdict clears.
    fn journal_forget_awaited(&self, key: &str, session: u64) {
        let Some(j) = self.program_journal.clone() else { return };
        let key = key.to_string();
        let write = move || {
            if let Err(e) = j.forget_awaited(&key, session) {
                tracing::warn!(error = %e, "the journal did not drop an awaited verdict");
            }
        };
        super::actors::beside_the_reactor(write);
    }

    /// Start one session of workflow `w` per input, now.
    async fn submit(&mut self, myself: &ActorRef<PlannerMsg>, w: u32, inputs: Vec<(Record, Option<DurableSession>)>) -> Result<Vec<SessionId>, String> {
        if self.shutting_down || self.aborted || self.fatal.is_some() {
            return Err(SHUTTING_DOWN.into());
        }
        if self.ctx.workflows.get(w as usize).is_none() {
            return Err(format!("no workflow {w}"));
        }
        let wall = self.wall();
        let mut ids = Vec::with_capacity(inputs.len());
        for (input, durable) in inputs {
            let i = self.trace.push(TraceEntry { at: wall, workflow: w, record: 0 });
            self.inputs.insert(i, input);
            if let Some(d) = durable {
                self.durable.insert(i, d);
            }
            self.on_arrival(myself, i).await;
            ids.push(SessionId(i as u32));
        }
        Ok(ids)
    }

    /// Where session `id` stands.
    fn status(&self, id: SessionId) -> SessionStatus {
        if let Some(r) = self.ended.get(&id) {
            return match &r.result.failed {
                Some(reason) if r.interrupted => {
                    SessionStatus::Interrupted { reason: reason.clone(), at: r.record.failed_at.unwrap_or(0.0) }
                }
                Some(reason) => SessionStatus::Failed { reason: reason.clone(), at: r.record.failed_at.unwrap_or(0.0) },
                None => SessionStatus::Completed {
                    output: r.result.final_output.clone(),
                    score: r.result.score,
                    finished_at: r.record.finished.unwrap_or(0.0),
                },
            };
        }
        if let Some((_, at, reason)) = self.start_failures.iter().find(|(_, _, r)| r.starts_with(&format!("{id}:"))) {
            return SessionStatus::Failed { reason: reason.clone(), at: *at };
        }
        if self.sessions.contains_key(&id) {
            SessionStatus::Running
        } else {
            SessionStatus::Unknown
        }
    }

    /// Queue `event` for the core. Events are folded in batches: everything that arrives
    /// before the next `Flush` is handed over at once and planned once (one scheduling tick,
    /// as the simulator does per virtual time).
    fn post(&mut self, myself: &ActorRef<PlannerMsg>, event: Event) {
        self.buffer.push(event);
        if !self.flush_scheduled && myself.send_message(PlannerMsg::Flush).is_ok() {
            self.flush_scheduled = true;
        }
    }

    /// Hand the queued events to the core and execute its commands, until executing them
    /// queues no further event.
    async fn flush(&mut self, myself: &ActorRef<PlannerMsg>) {
        while !self.buffer.is_empty() {
            if self.fatal.is_some() {
                self.buffer.clear();
                return;
            }
            let events = std::mem::take(&mut self.buffer);
            let now = self.ctx.clock.now();
            let started = std::time::Instant::now();
            let planned = self.planner.handle_all(events, now);
            if let Some(m) = &self.metrics {
                m.planning_latency.observe(started.elapsed().as_secs_f64());
            }
            match planned {
                Ok(commands) => {
                    for c in commands {
                        self.execute(myself, c).await;
                    }
                }
                Err(e) => self.set_fatal(format!("the planner rejected an event: {e}")),
            }
            self.wakeup = self.planner.next_wakeup(now);
        }
        self.bound_timelines();
        self.update_gauges();
        self.journal_ledgers();
    }

    /// With a program journal, record the DISC ledgers that learned from a finished program since
    /// they were last recorded (their usage samples ride along), beside the actor: a restart
    /// gives them back ([`Self::restore_ledgers`]). A write lost to a crash costs what the
    /// ledger learned since the last one.
    fn journal_ledgers(&mut self) {
        let (Some(j), Some(routing)) = (self.program_journal.clone(), self.planner.routing()) else { return };
        let mut rows = Vec::new();
        for &d in routing.members() {
            let Some(learned) = routing.ledger_learned(d) else { continue };
            if self.ledgers_journaled.get(&d).is_some_and(|&n| n == learned.peaks_n) {
                continue;
            }
            let Some(capacity) = routing.base_capacity_tokens(d) else { continue };
            self.ledgers_journaled.insert(d, learned.peaks_n);
            let (model, dtype) = (self.model_name(d), self.dtype_name(d));
            rows.push((
                // Per KV capacity: another pool's backend keeps its own record.
                format!("{model}/{dtype}/{capacity}"),
                serde_json::json!({
                    "model": model,
                    "dtype": dtype,
                    "capacity_tokens": capacity,
                    "seq": self.ledger_seq_base.get(&d).copied().unwrap_or(0) + learned.peaks_n,
                    "learned": ledger_json(&learned),
                }),
            ));
        }
        if rows.is_empty() {
            return;
        }
        let write = move || {
            if let Err(e) = j.record_ledgers(&rows) {
                tracing::warn!(error = %e, "the journal did not record the ledgers' statistics");
            }
        };
        super::actors::beside_the_reactor(write);
    }

    /// Give each routed deployment's DISC ledger what the journal recorded for it (a restart): a
    /// record of the same model, dtype and KV capacity (another pool's backend would reserve and
    /// run otherwise); the others are skipped.
    fn restore_ledgers(&mut self, rows: &[(String, serde_json::Value)]) {
        let (mut restored, mut skipped) = (0usize, 0usize);
        for (_, row) in rows {
            let done = (|| {
                let d = self.deployment_named(row)?;
                if row.get("capacity_tokens")?.as_u64()? != self.planner.routing()?.base_capacity_tokens(d)? {
                    return None;
                }
                // This deployment's own record: whatever happens to its state, this run's writes
                // carry on from its sequence number.
                let seq = row.get("seq").and_then(serde_json::Value::as_u64).unwrap_or(0);
                self.ledger_seq_base.insert(d, seq);
                let learned = ledger_from_json(row.get("learned")?)?;
                self.planner.restore_ledger(d, &learned).ok()?;
                self.ledger_seq_base.insert(d, seq.saturating_sub(learned.peaks_n));
                Some(())
            })();
            match done {
                Some(()) => restored += 1,
                None => skipped += 1,
            }
        }
        // From now on only what a ledger learns in this run is written (a record of another pool's
        // backend is not replaced by this one's priors).
        if let Some(routing) = self.planner.routing() {
            for &d in routing.members() {
                if let Some(l) = routing.ledger_learned(d) {
                    self.ledgers_journaled.insert(d, l.peaks_n);
                }
            }
        }
        if restored + skipped > 0 {
            self.note(format!(
                "router: restored {restored} DISC ledgers' statistics from the journal ({skipped} skipped: another deployment, pool or KV capacity, or not valid)"
            ));
        }
    }

    /// A planning pass without events once the policy's wake-up time has come (a rule that
    /// waits, such as the substrate's upscale delay, acts then rather than at the next event).
    async fn wake_if_due(&mut self, myself: &ActorRef<PlannerMsg>) {
        let now = self.ctx.clock.now();
        // Not while stopping, and not when a flush is on its way (it plans with fresher state).
        if self.fatal.is_some() || self.aborted || self.shutting_down || self.done() || !self.buffer.is_empty() || self.wakeup.is_none_or(|t| t > now) {
            return;
        }
        self.planning_pass(myself).await;
    }

    /// A planning pass without events (the core plans on what it knows), its commands
    /// executed, and the policy's next wake-up taken.
    async fn planning_pass(&mut self, myself: &ActorRef<PlannerMsg>) {
        // Events still buffered (a unit withdrawn at a tick, a session's end) reach the core
        // first: a pass on a stale view could place a unit the shell no longer holds.
        self.flush(myself).await;
        let now = self.ctx.clock.now();
        match self.planner.handle_all(Vec::new(), now) {
            Ok(commands) => {
                for c in commands {
                    self.execute(myself, c).await;
                }
            }
            Err(e) => self.set_fatal(format!("the planner rejected a planning pass: {e}")),
        }
        self.wakeup = self.planner.next_wakeup(now);
    }

    /// A served runtime's GPU timelines stay bounded: past twice `timeline_segments` segments
    /// on a device, everything before its newest `timeline_segments` is folded into the
    /// partition the report reads ([`DeviceTimeline::fold_until`]), and the intervals still
    /// open there restart at the cut. A run's timeline is its chart and is kept whole.
    fn bound_timelines(&mut self) {
        let Some(kept) = self.timeline_segments.map(|k| k.max(1)) else { return };
        let Some(from) = self.trace.first_at() else { return };
        for (d, tl) in self.timelines.iter_mut().enumerate() {
            // Segments are pushed as they close, so their ends come in order.
            let Some(cut) = tl.fold_cut(kept, from) else { continue };
            let mut open = Vec::new();
            for r in self.replicas.values_mut().filter(|r| r.device.0 as usize == d && !r.fixed) {
                let deployment = r.deployment.0;
                for (since, kind) in [
                    (&mut r.loading_since, SegmentKind::Loading),
                    (&mut r.busy_since, SegmentKind::Generating),
                    (&mut r.resident_since, SegmentKind::Resident),
                ] {
                    if let Some(t) = since.as_mut().filter(|t| **t < cut) {
                        open.push(Segment { start: *t, end: cut, kind, deployment });
                        *t = cut;
                    }
                }
            }
            tl.fold_until(from, cut, &open);
        }
    }

    /// The metrics' gauges from the actor's state (sessions, queue, replicas by state).
    fn update_gauges(&self) {
        let Some(m) = &self.metrics else { return };
        let gauge = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        let failed = self.ended_failed + self.start_failures.len() + self.forgotten.1;
        let completed = self.ended.len() - self.ended_failed + self.forgotten.0;
        RuntimeMetrics::set_state(&m.sessions, "running", gauge(self.sessions.len()));
        RuntimeMetrics::set_state(&m.sessions, "completed", gauge(completed));
        RuntimeMetrics::set_state(&m.sessions, "failed", gauge(failed));
        m.queue_depth.set(gauge(self.pending.len()));
        let loading = self.replicas.values().filter(|r| r.loading_since.is_some()).count();
        RuntimeMetrics::set_state(&m.replicas, "loading", gauge(loading));
        RuntimeMetrics::set_state(&m.replicas, "awake", gauge(self.replicas.len() - loading));
        RuntimeMetrics::set_state(&m.replicas, "asleep", gauge(self.parked.len() + self.falling_asleep.len()));
        if let Some(routing) = self.planner.routing() {
            for (arm, &d) in routing.members().iter().enumerate() {
                let Some(l) = routing.router().ledger(arm) else { continue };
                let (model, dtype) = (self.model_name(d), self.dtype_name(d));
                for (stat, v) in [
                    ("peak_tokens", l.peak_estimate()),
                    ("run_seconds", l.mean_run_s()),
                    ("allowance_tokens", l.allowance()),
                    ("reserved_tokens", l.reserved() as f64),
                    ("admitted", l.admitted() as f64),
                    ("queued", l.queued() as f64),
                ] {
                    m.ledger(&model, &dtype, stat, v);
                }
            }
        }
    }

    fn set_fatal(&mut self, reason: String) {
        tracing::error!(%reason, "live run stopped");
        if self.fatal.is_none() {
            self.fatal = Some(reason.clone());
        }
        for w in self.waiters.drain(..) {
            let _ = w.send(Err(reason.clone()));
        }
    }

    /// Spawn the replica actor that loads `replica` (or wakes `parked`, its sleeping engine).
    async fn start_replica(
        &mut self,
        myself: &ActorRef<PlannerMsg>,
        replica: ReplicaId,
        deployment: DeploymentId,
        device: DeviceId,
        parked: Option<EngineHandle>,
    ) {
        let Some(dep) = self.ctx.deployments.get(deployment.0 as usize) else {
            return self.set_fatal(format!("load of unknown deployment {deployment:?}"));
        };
        let Some(spec) = self.devices.get(device.0 as usize) else {
            return self.set_fatal(format!("load on unknown device {device}"));
        };
        let wake = parked.is_some();
        let engine = match parked {
            Some(e) => Ok(e),
            None => self.factory.create(&EngineTarget { replica, device, device_spec: spec, deployment: dep }),
        };
        let engine = match engine {
            Ok(e) => e,
            Err(e) => {
                self.buffer.push(Event::ReplicaLoadFailed { replica, reason: e.to_string() });
                return;
            }
        };
        tracing::info!(%replica, %device, model = %dep.model, wake, "load");
        let fixed = engine.engine.fixed();
        if fixed {
            self.fixed_devices.insert(device);
            if !wake {
                self.fixed_loads += 1;
            }
        }
        let line = TraceLine { replica: Some(replica.0), device: Some(device.0), detail: Some(dep.model.clone()), ..blank() };
        self.log(if wake { "wake" } else { "load" }, line);
        let args = ReplicaArgs {
            replica,
            device,
            deployment,
            engine,
            wake,
            planner: myself.clone(),
            retry: self.ctx.retry,
            telemetry_every: self.telemetry_every,
            stopping: self.stopping.subscribe(),
        };
        let actor = match Actor::spawn_linked(None, ReplicaActor, args, myself.get_cell()).await {
            Ok((a, _)) => a,
            Err(e) => {
                self.buffer.push(Event::ReplicaLoadFailed { replica, reason: format!("replica actor: {e}") });
                return;
            }
        };
        let ticket = self.ticket(device);
        self.replica_cells.insert(actor.get_id(), replica);
        let wall = self.wall();
        self.replicas.insert(replica, ReplicaEntry {
            actor: actor.clone(),
            device,
            deployment,
            loading_since: Some(wall),
            resident_since: None,
            busy_since: None,
            serving: 0,
            fixed,
        });
        if actor.send_message(ReplicaMsg::Start(ticket)).is_err() {
            self.replicas.remove(&replica);
            self.buffer.push(Event::ReplicaLoadFailed { replica, reason: "replica actor stopped".into() });
        }
    }

    /// Unload a parked (sleeping) engine after the device's earlier lifecycle actions, then
    /// report `Unloaded`.
    fn unload_parked(&mut self, myself: &ActorRef<PlannerMsg>, replica: ReplicaId) {
        let Some((device, _, engine)) = self.parked.remove(&replica) else { return };
        let mut ticket = self.ticket(device);
        let me = myself.clone();
        tokio::spawn(async move {
            ticket.wait().await;
            if let Err(e) = engine.engine.unload().await {
                tracing::warn!(error = %e, %replica, "unload of a sleeping engine failed");
            }
            ticket.finish();
            let _ = me.send_message(PlannerMsg::Unloaded { replica });
        });
    }

    fn ticket(&mut self, device: DeviceId) -> LifecycleTicket {
        let (done, rx) = oneshot::channel();
        let after = self.lifecycle_tail.insert(device, rx);
        LifecycleTicket { after, done }
    }

    fn count_action(&self, action: &str) {
        if let Some(m) = &self.metrics {
            m.action(action);
        }
    }

    async fn execute(&mut self, myself: &ActorRef<PlannerMsg>, command: Command) {
        match command {
            Command::Load { replica, deployment, device } => {
                self.count_action("load");
                self.start_replica(myself, replica, deployment, device, None).await;
            }
            Command::Wake { replica } => {
                self.count_action("wake");
                match self.parked.remove(&replica) {
                    Some((device, deployment, engine)) => {
                        self.start_replica(myself, replica, deployment, device, Some(engine)).await
                    }
                    None => match self.falling_asleep.get(&replica) {
                        Some(&at) => {
                            self.pending_wakes.insert(replica, at);
                        }
                        None => self.set_fatal(format!("wake of replica {replica}, which is not asleep")),
                    },
                }
            }
            Command::Sleep { replica, level } => {
                let Some(r) = self.replicas.remove(&replica) else {
                    return self.set_fatal(format!("sleep of unknown replica {replica}"));
                };
                self.close_segments(&r);
                self.count_action("sleep");
                let ticket = self.ticket(r.device);
                tracing::info!(%replica, device = %r.device, level, "sleep");
                self.log("sleep", TraceLine { replica: Some(replica.0), device: Some(r.device.0), detail: Some(format!("level {level}")), ..blank() });
                self.falling_asleep.insert(replica, (r.device, r.deployment));
                let _ = r.actor.send_message(ReplicaMsg::Reclaim { sleep: Some(level), ticket });
            }
            Command::Unload { replica } => {
                if self.parked.contains_key(&replica) {
                    return self.unload_parked(myself, replica);
                }
                if self.falling_asleep.contains_key(&replica) {
                    self.pending_unloads.insert(replica);
                    return;
                }
                let Some(r) = self.replicas.remove(&replica) else {
                    if self.gone.contains(&replica) {
                        // Reclaiming a replica that is already gone: nothing left to do.
                        return;
                    }
                    return self.set_fatal(format!("unload of unknown replica {replica}"));
                };
                self.close_segments(&r);
                self.count_action("unload");
                let ticket = self.ticket(r.device);
                tracing::info!(%replica, device = %r.device, "reclaim");
                if r.fixed {
                    self.fixed_evictions += 1;
                }
                self.log("unload", TraceLine { replica: Some(replica.0), device: Some(r.device.0), ..blank() });
                let _ = r.actor.send_message(ReplicaMsg::Reclaim { sleep: None, ticket });
            }
            Command::Dispatch { activation, replica } => {
                let Some((item, mut call)) = self.pending.remove(&activation) else {
                    return self.set_fatal(format!("dispatch of unprepared unit {activation}"));
                };
                let Some(device) = self.replicas.get(&replica).map(|r| r.device) else {
                    if self.gone.contains(&replica) {
                        self.regrants.push((replica, item, call));
                        return;
                    }
                    return self.set_fatal(format!("dispatch to unknown replica {replica}"));
                };
                let id = self.next_request;
                self.next_request += 1;
                call.request.id = id;
                // The call's deadline from the core's predicted duration (device seconds).
                let predicted = self.planner.state().running().get(&activation).and_then(|u| u.predicted_s);
                call.request.deadline_s = self.ctx.retry.call_deadline(predicted.map(|p| p / self.ctx.clock.speed()));
                self.log("dispatch", TraceLine {
                    session: Some(activation.session.0),
                    activation: Some(activation.index),
                    replica: Some(replica.0),
                    device: Some(device.0),
                    ..blank()
                });
                let wall = self.ctx.clock.wall();
                let Some(r) = self.replicas.get_mut(&replica) else { return };
                let submit = ReplicaMsg::Submit { activation, request: call.request.clone() };
                if r.actor.send_message(submit).is_err() {
                    // The replica actor is gone and its supervision event is on its way:
                    // `replica_gone` releases this grant and requeues the unit.
                    self.gone.insert(replica);
                    self.regrants.push((replica, item, call));
                    return;
                }
                if r.serving == 0 {
                    r.busy_since = Some(wall);
                }
                r.serving += 1;
                let deployment = r.deployment;
                let workflow = self.session_workflow(activation.session).unwrap_or(0);
                self.counters.llm_calls += 1;
                self.in_flight.insert(activation, InFlight { replica, workflow, deployment, call, first_token_logged: false });
                if let Some(s) = self.sessions.get(&activation.session) {
                    let _ = s.send_message(SessionMsg::Dispatched { activation, replica });
                }
            }
        }
    }

    fn session_workflow(&self, s: SessionId) -> Option<u32> {
        self.trace.get(s.0 as usize).map(|e| e.workflow)
    }

    /// Remove an in-flight call and close its replica's serving interval when it goes idle.
    /// DISC's usage observation from a routed model's replica (paper 002 Appendix B), one per
    /// scrape of its `/metrics`: the KV the engine reports in use (`vllm:kv_cache_usage_perc` ×
    /// its capacity from `vllm:cache_config_info`) against the prompt tokens of the calls in
    /// flight on it — what a front end knows of them, as the paper's forwarder does — teaches
    /// that model's ledger its per-request allowance δ̂. Unlike the simulator, which sees the
    /// engine's running contexts exactly, the tokens each call has generated so far are not
    /// known here, so the live allowance also covers them: what a program may hold beyond
    /// the tokens the ledger counts. Answers whether a ledger learned.
    fn observe_usage(&mut self, replica: ReplicaId, t: &EngineTelemetry) -> bool {
        let Some(entry) = self.replicas.get(&replica) else { return false };
        let Some(capacity) = t.kv_capacity_tokens else { return false };
        if t.sleeping || !self.planner.is_routed(entry.deployment) {
            return false;
        }
        let used = (t.kv_cache_usage.clamp(0.0, 1.0) * capacity).round() as u64;
        let context: u64 = self
            .in_flight
            .values()
            .filter(|f| f.replica == replica)
            .map(|f| u64::from(f.call.request.prompt_tokens))
            .sum();
        let running = t.running.max(0.0).round() as u32;
        self.planner.observe_backend_usage(entry.deployment, used, context, running, 1)
    }

    /// Wasted engine work in the run's report and the `wasted_tokens` metric.
    fn count_waste(&mut self, wasted: &WastedWork) {
        self.wasted.add(wasted);
        if let Some(m) = &self.metrics {
            m.wasted(wasted.prompt_tokens, wasted.output_tokens);
        }
    }

    /// Attempts of `activation`'s call (on `deployment`, when still known) ended without an
    /// answer the run uses: their work counts in the report's `wasted`, the `wasted_tokens`
    /// metric and, for a routed program, its cost.
    fn waste(&mut self, activation: ActivationId, deployment: Option<DeploymentId>, wasted: &WastedWork) {
        if wasted.is_empty() {
            return;
        }
        self.count_waste(wasted);
        if let Some(d) = deployment.and_then(|d| self.ctx.deployments.get(d.0 as usize)) {
            let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
            self.routes.charge(activation.session, &d.model, clamp(wasted.prompt_tokens), 0, clamp(wasted.output_tokens));
        }
    }

    fn take_in_flight(&mut self, activation: ActivationId) -> Option<InFlight> {
        let f = self.in_flight.remove(&activation)?;
        // After an abort, the last call to come back may be what the shell waits for.
        if self.aborted && self.in_flight.is_empty() {
            self.settle_waiters();
        }
        let wall = self.wall();
        if let Some(r) = self.replicas.get_mut(&f.replica) {
            r.serving = r.serving.saturating_sub(1);
            if r.serving == 0
                && let Some(since) = r.busy_since.take()
                && !r.fixed
                && let Some(tl) = self.timelines.get_mut(r.device.0 as usize)
            {
                tl.segments.push(Segment {
                    start: since,
                    end: wall.max(since),
                    kind: SegmentKind::Generating,
                    deployment: r.deployment.0,
                });
            }
        }
        Some(f)
    }

    /// Close a removed replica's open loading, serving and resident intervals.
    fn close_segments(&mut self, r: &ReplicaEntry) {
        if r.fixed {
            return;
        }
        let wall = self.wall();
        let Some(tl) = self.timelines.get_mut(r.device.0 as usize) else { return };
        let mut push = |start: f64, kind: SegmentKind| {
            tl.segments.push(Segment { start, end: wall.max(start), kind, deployment: r.deployment.0 });
        };
        if let Some(since) = r.loading_since {
            push(since, SegmentKind::Loading);
        }
        if let Some(since) = r.busy_since {
            push(since, SegmentKind::Generating);
        }
        if let Some(since) = r.resident_since {
            push(since, SegmentKind::Resident);
        }
    }

    async fn on_arrival(&mut self, myself: &ActorRef<PlannerMsg>, i: usize) {
        if self.shutting_down || !self.arrived.insert(i) {
            return;
        }
        let Some(entry) = self.trace.get(i).cloned() else { return };
        let w = entry.workflow as usize;
        // A submitted session takes its input (the actor keeps none); a run's reads its record.
        let input = match self.inputs.remove(&i) {
            Some(input) => Some(input),
            None => self.records.get(w).and_then(|r| r.get(entry.record)).cloned(),
        };
        let (Some(spec), Some(input)) = (self.ctx.workflows.get(w).cloned(), input)
        else {
            return self.set_fatal(format!("trace entry {i} names no workflow record"));
        };
        let id = SessionId(i as u32);
        let wall = self.wall();
        // A durable session of a routed workflow keeps the model it was bound to before a
        // restart (journaled at its first binding), so that its replayed results and its
        // remaining calls come from one model.
        let durable = self.durable.get(&i).map(|d| (Arc::clone(&d.journal), d.number));
        let routed = self.ctx.workflows.get(w).is_some_and(|s| s.route().is_some());
        let keep = match &durable {
            Some((j, n)) if routed => match super::actors::off_the_reactor(|| j.session_route(*n)) {
                Ok(b) => b.and_then(|b| self.deployment_named(&b)),
                Err(e) => {
                    self.note(format!("router: the journal's route of durable session {n} cannot be read: {e}"));
                    None
                }
            },
            _ => None,
        };
        let session = Session::new(id, spec, input).map_err(|e| e.to_string()).and_then(|session| {
            let ctx = exec::routing::BindContext {
                deployment_of: &self.ctx.deployment_of,
                deployments: &self.ctx.deployments,
                config: &self.ctx.routing,
            };
            let (session, row) = exec::routing::bind_session(
                &mut self.planner,
                &ctx,
                &mut self.bound_specs,
                entry.workflow,
                session,
                keep,
                self.ctx.clock.now(),
            )
            .map_err(|e| e.to_string())?;
            if let Some(row) = row {
                if let Some(m) = &self.metrics {
                    m.routed(&row.model);
                }
                self.routes.open(id, row);
            }
            Ok(session)
        });
        // A binding other than the recorded one (the first, or one whose recorded deployment the
        // session may no longer run on) is journaled by the session actor before it starts
        // anything (off this actor: a run's sessions arrive in one loop here).
        if let (Some(_), Ok(_)) = (&durable, &session)
            && let Some(d) = self.planner.routing().and_then(|r| r.record(u64::from(id.0))).map(|r| r.deployment)
            && keep != Some(d)
        {
            let entry = serde_json::json!({"model": self.model_name(d), "dtype": self.dtype_name(d)});
            if let Some(ds) = self.durable.get_mut(&i) {
                ds.route = Some(entry);
            }
        }
        match session {
            Ok(session) => {
                let args = SessionArgs {
                    ctx: Arc::clone(&self.ctx),
                    session,
                    workflow: entry.workflow,
                    record: entry.record,
                    planner: myself.clone(),
                    arrived: wall,
                    durable: self.durable.remove(&i),
                };
                match Actor::spawn_linked(None, SessionActor, args, myself.get_cell()).await {
                    Ok((actor, _)) => {
                        self.session_cells.insert(actor.get_id(), id);
                        self.sessions.insert(id, actor.clone());
                        self.log("arrival", TraceLine { session: Some(id.0), detail: Some(spec_name(&self.ctx.workflows, entry.workflow)), ..blank() });
                        self.post(myself, Event::SessionArrived { session: id, workflow: entry.workflow });
                        let _ = actor.send_message(SessionMsg::Start);
                    }
                    Err(e) => {
                        // A bound program that never started releases its ledger place, and its
                        // end reaches the core (its gate goes; a planning pass follows).
                        if self.routes.contains(id) {
                            self.routes.close(id, None, None);
                            if let Err(e) = self.planner.program_abandoned(id, self.ctx.clock.now()) {
                                self.note(format!("router: session {id}: {e}"));
                            }
                            self.post(myself, Event::SessionEnded { session: id });
                        }
                        self.start_failure(entry.workflow, wall, format!("{id}: session actor: {e}"));
                    }
                }
            }
            Err(e) => {
                // It cannot start (its input lacks a field, its route fits nothing): it would fail
                // the same way at every restart, so a durable session is journaled as failed.
                if let Some(d) = self.durable.remove(&i) {
                    let outcome = crate::live::journal::SessionOutcome::Failed { reason: format!("not started: {e}") };
                    if let Err(err) = super::actors::off_the_reactor(|| d.journal.finish_session(d.number, &outcome)) {
                        tracing::warn!(session = d.number, error = %err, "cannot journal a session that could not start");
                    }
                }
                self.start_failure(entry.workflow, wall, format!("{id}: {e}"));
            }
        }
    }

    fn start_failure(&mut self, workflow: u32, at: f64, reason: String) {
        tracing::warn!(%reason, "session could not start");
        self.start_failures.push((workflow, at, reason));
        self.after_session_end();
    }

    async fn on_session_ended(&mut self, myself: &ActorRef<PlannerMsg>, report: SessionReport) {
        let id = report.record.session;
        if self.ended.contains_key(&id) {
            self.note(format!("internal: session {id} reported its end twice; the first report stands"));
            return;
        }
        self.sessions.remove(&id);
        self.programs.retain(|_, s| *s != id);
        self.program_calls.remove(&id);
        self.pending.retain(|a, _| a.session != id);
        self.abort_calls_of(id);
        let (event, detail) = match &report.record.failed {
            Some(reason) if report.interrupted => ("session_interrupted", Some(reason.clone())),
            Some(reason) => ("session_failed", Some(reason.clone())),
            None => ("session_done", None),
        };
        if report.interrupted {
            self.ended_interrupted += 1;
        }
        self.log(event, TraceLine { session: Some(id.0), detail, ..blank() });
        let mut report = report;
        if self.events_out.is_some() {
            // A served runtime runs for long: its per-call records were published as events and
            // are not kept (only the session's record and result, which status queries read).
            report.calls = Vec::new();
            report.timings = Vec::new();
        }
        if report.record.failed.is_some() {
            self.ended_failed += 1;
        }
        self.ended.insert(id, report);
        if let Some(keep) = self.keep_ended {
            self.end_order.push_back(id);
            while self.ended.len() > keep {
                let Some(old) = self.end_order.pop_front() else { break };
                // Its arrival entry goes with its outcome: a served runtime's memory stays
                // bounded by the sessions it keeps, not by all it ever ran.
                self.trace.forget(old.0 as usize);
                self.arrived.remove(&(old.0 as usize));
                if let Some(r) = self.ended.remove(&old) {
                    if r.record.failed.is_some() {
                        self.ended_failed -= 1;
                        self.forgotten.1 += 1;
                    } else {
                        self.forgotten.0 += 1;
                    }
                }
            }
        }
        let routed = self.routes.get(id).map(|row| row.workflow);
        // A routed front-door program's verdict comes from its client (`POST
        // /v1/programs/{key}/verdict`), not from a workflow's verifier.
        let front_door_program = self.program_routes.remove(&id);
        let awaiting = front_door_program.as_ref().and_then(|(d, _)| self.awaiting_entry(id, *d));
        if let (Some((_, key)), Some(j)) = (&front_door_program, self.program_journal.clone())
            && let Err(e) = super::actors::off_the_reactor(|| j.end_routed_program(key, u64::from(id.0), awaiting.as_ref()))
        {
            // A restart would bind a new program under the key to this one's model.
            tracing::warn!(%id, error = %e, "the journal did not record a routed program's end");
        }
        let front_door_program = front_door_program.is_some();
        if let (Some(w), Some(_)) = (routed, &self.ended.get(&id).and_then(|r| r.record.failed.clone())) {
            if front_door_program {
                self.unverified.retain(|_, s| *s != id);
                self.unverified_order.retain(|(_, s)| *s != id);
            }
            // A routed program that failed is never verified: it releases what it holds before
            // its end reaches the core, so that its ledger learns nothing from it.
            let own = self.ctx.workflows.get(w as usize).and_then(|s| exec::routing::workflow_verifier(s));
            self.routes.close(id, None, own);
            if let Err(e) = self.planner.program_abandoned(id, self.ctx.clock.now()) {
                self.note(format!("router: session {id}: {e}"));
            }
        }
        self.post(myself, Event::SessionEnded { session: id });
        if self.routes.contains(id) && !front_door_program {
            self.route_verdict(myself, id).await;
        }
        if self.give_up_at_end.remove(&id) {
            // Its end reaches the core first (the ledger learns), then its decision is dropped.
            self.flush(myself).await;
            let key = self.unverified_order.iter().find(|(_, s)| *s == id).map(|(k, _)| k.clone()).unwrap_or_default();
            self.give_up_unverified(&key, id, "a later program took its key before its verdict came");
        }
        self.after_session_end();
    }

    /// Calls of session `id` still running when it ended (a cancel, a failed sibling branch)
    /// are of no use to anyone: ask their replicas to abort them, so that the engines stop
    /// computing them and their leases end when the calls do ([`PlannerMsg::Aborted`]).
    fn abort_calls_of(&mut self, id: SessionId) {
        let mut by_replica: BTreeMap<ReplicaId, Vec<ActivationId>> = BTreeMap::new();
        for (a, f) in &self.in_flight {
            if a.session == id {
                by_replica.entry(f.replica).or_default().push(*a);
            }
        }
        for (replica, activations) in by_replica {
            if let Some(r) = self.replicas.get(&replica) {
                let _ = r.actor.send_message(ReplicaMsg::Abort { activations });
            }
        }
    }

    /// A routed session completed: its end reaches the core first (the ledger learns its peak
    /// and run time), then its verdict under the selected verifier (the learner's update), then
    /// a planning pass, since the ledgers may have admitted waiting programs.
    async fn route_verdict(&mut self, myself: &ActorRef<PlannerMsg>, id: SessionId) {
        self.flush(myself).await;
        let Some(row) = self.routes.get(id).cloned() else { return };
        let spec = self.ctx.workflows.get(row.workflow as usize).cloned();
        // The workflow's own verifier term when it declares one (an LLM judge), else its metric.
        let ended = self.ended.get(&id);
        let success = spec.as_ref().map_or(0.0, |spec| {
            let score = ended.and_then(|r| exec::routing::verifier_input(spec, r.record.score, r.result.verifier_score));
            exec::routing::verdict(spec, score, &row.feedback)
        });
        self.routes.close(id, Some(success), spec.as_ref().and_then(|s| exec::routing::workflow_verifier(s)));
        match self.planner.program_verdict(id, success, row.cost, self.ctx.clock.now()) {
            Ok(learned) => self.journal_learned(&learned, None),
            Err(e) => self.note(format!("router: session {id}: {e}")),
        }
        self.planning_pass(myself).await;
    }

    /// The deployment a journaled binding names (`model` and, when recorded, `dtype`) among the
    /// routed ones.
    fn deployment_named(&self, binding: &serde_json::Value) -> Option<DeploymentId> {
        let model = binding.get("model")?.as_str()?;
        let dtype = binding.get("dtype").and_then(serde_json::Value::as_str);
        (0..self.ctx.deployments.len() as u32).map(DeploymentId).find(|&d| {
            self.model_name(d) == model
                && dtype.is_none_or(|t| t == self.dtype_name(d))
                && self.planner.routing().is_some_and(|r| r.routes(d))
        })
    }

    /// What the journal records for routed front-door program `id`, bound to `d`, when it ends
    /// well (a failed one gets no verdict): everything its verdict needs to teach a restarted
    /// router ([`Self::restore_awaited`]). `None` without a journal or a router.
    fn awaiting_entry(&self, id: SessionId, d: DeploymentId) -> Option<serde_json::Value> {
        self.program_journal.as_ref()?;
        if self.give_up_at_end.contains(&id) || self.ended.get(&id).is_some_and(|r| r.record.failed.is_some()) {
            return None;
        }
        let row = self.routes.get(id)?;
        let ended = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |t| t.as_secs_f64());
        Some(serde_json::json!({
            "session": id.0,
            "features": self.planner.routing_features_digest()?,
            "model": self.model_name(d),
            "dtype": self.dtype_name(d),
            "verifier": row.verifier,
            "context": self.planner.program_context(id)?,
            "cost": row.cost,
            "ended": ended,
        }))
    }

    /// The dtype of deployment `d` as the journal records it (with its model, it names the
    /// deployment: one model may be served at two dtypes).
    fn dtype_name(&self, d: DeploymentId) -> String {
        self.ctx.deployments.get(d.0 as usize).map(|i| format!("{:?}", i.dtype)).unwrap_or_default()
    }

    /// With a program journal, record what a landed verdict taught the learner, so that a
    /// restart teaches its learner the same ([`Self::relearn`]); with `awaited` (key, session),
    /// the end of that program's wait for its verdict in the same transaction. The write runs beside the
    /// actor, not waited for: the learner here has learned the outcome already, a failed or
    /// unfinished write (a crash right now) costs only its relearning, and the learner's sums do
    /// not depend on the order outcomes are relearned in.
    fn journal_learned(&mut self, learned: &crate::planner::routing::LearnedOutcome, awaited: Option<(&str, u64)>) {
        let (Some(j), Some(features)) = (self.program_journal.clone(), self.planner.routing_features_digest()) else {
            return;
        };
        let entry = serde_json::json!({
            "features": features,
            "model": self.model_name(learned.deployment),
            "dtype": self.dtype_name(learned.deployment),
            "context": learned.context,
            "reward": learned.reward,
        });
        let awaited = awaited.map(|(k, session)| (k.to_string(), session));
        let write = move || {
            if let Err(e) = j.record_learned(&entry, awaited.as_ref().map(|(k, session)| (k.as_str(), *session))) {
                tracing::warn!(error = %e, "the journal did not record a learned outcome; a restart will not relearn it");
            }
        };
        super::actors::beside_the_reactor(write);
    }

    /// Teach the router's learner the outcomes a journal recorded (a restart): each one recorded
    /// under this router's features and on a model it routes; the others are skipped (the
    /// server now starts with other routed workflows, whose contexts mean something else).
    fn relearn(&mut self, rows: &[serde_json::Value]) {
        let Some(features) = self.planner.routing_features_digest() else { return };
        let (mut taught, mut skipped) = (0usize, 0usize);
        for row in rows {
            let outcome = (|| {
                if row.get("features")?.as_u64()? != features {
                    return None;
                }
                let deployment = self.deployment_named(row)?;
                let context = learner_context_of(row)?;
                let reward = row.get("reward")?.as_f64()?;
                Some(crate::planner::routing::LearnedOutcome { deployment, context, reward })
            })();
            match outcome.map(|o| self.planner.relearn(&o)) {
                Some(Ok(())) => taught += 1,
                _ => skipped += 1,
            }
        }
        if taught + skipped > 0 {
            self.note(format!(
                "router: relearned {taught} verdicts from the journal ({skipped} skipped: recorded under other features, or on a model no route has)"
            ));
        }
    }

    fn after_session_end(&mut self) {
        let n = self.ended_count();
        if let Some(p) = &self.progress {
            p(n, self.total());
        }
        self.settle_waiters();
    }

    async fn on_loaded(&mut self, myself: &ActorRef<PlannerMsg>, replica: ReplicaId) {
        let wall = self.wall();
        let Some(r) = self.replicas.get_mut(&replica) else { return };
        if let Some(since) = r.loading_since.take()
            && !r.fixed
            && let Some(tl) = self.timelines.get_mut(r.device.0 as usize)
        {
            tl.segments.push(Segment { start: since, end: wall, kind: SegmentKind::Loading, deployment: r.deployment.0 });
        }
        r.resident_since = (!r.fixed).then_some(wall);
        self.post(myself, Event::ReplicaLoaded { replica });
    }

    /// A replica is gone (its load failed, its restarts were exhausted, or its actor stopped):
    /// release every lease the core holds on it (grants it makes to it meanwhile included),
    /// drop it from the view, and requeue its units so the core places them elsewhere: units
    /// already running there through their sessions, units granted but never sent directly.
    async fn replica_gone(&mut self, myself: &ActorRef<PlannerMsg>, replica: ReplicaId, reason: String) {
        let Some(entry) = self.replicas.remove(&replica) else {
            if self.gone.contains(&replica) {
                self.release_regrants(myself, replica, &reason).await;
            }
            return;
        };
        self.gone.insert(replica);
        self.close_segments(&entry);
        let was_loading = entry.loading_since.is_some();
        let lost: Vec<ActivationId> =
            self.in_flight.iter().filter(|(_, f)| f.replica == replica).map(|(a, _)| *a).collect();
        tracing::warn!(%replica, device = %entry.device, %reason, calls = lost.len(), "replica gone");
        self.log("replica_lost", TraceLine { replica: Some(replica.0), device: Some(entry.device.0), detail: Some(reason.clone()), ..blank() });
        self.last_error.entry((entry.device, entry.deployment)).or_insert_with(|| reason.clone());
        if was_loading {
            self.note(format!("replica {replica} on {} could not start ({reason}); that device is no longer used for its model", entry.device));
        } else {
            self.note(format!("replica {replica} on {} was lost ({reason}); its calls moved to other replicas", entry.device));
        }
        let mut released = Vec::new();
        for a in lost {
            if let Some(f) = self.in_flight.remove(&a) {
                released.push((a, f.call.expected_output_tokens));
            }
        }
        self.faults.migrated_calls += released.len() as u64;
        // After an abort, the last calls to come back may have been on this replica.
        self.settle_waiters();
        for (activation, output_tokens) in &released {
            self.post(myself, Event::UnitFinished { activation: *activation, replica, output_tokens: *output_tokens });
        }
        self.flush(myself).await;
        self.release_regrants(myself, replica, &reason).await;
        for (activation, _) in released {
            if let Some(s) = self.sessions.get(&activation.session) {
                let _ = s.send_message(SessionMsg::Requeue { activation });
            }
        }
    }

    /// Release the grants the core made to gone `replica`, take it out of the view, and put
    /// those units back into the queue.
    async fn release_regrants(&mut self, myself: &ActorRef<PlannerMsg>, replica: ReplicaId, reason: &str) {
        let mut requeue = Vec::new();
        loop {
            let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.regrants).into_iter().partition(|g| g.0 == replica);
            self.regrants = rest;
            if mine.is_empty() {
                break;
            }
            for (_, item, call) in mine {
                let activation = item.activation;
                let output_tokens = call.expected_output_tokens;
                requeue.push((item, call));
                self.post(myself, Event::UnitFinished { activation, replica, output_tokens });
            }
            self.flush(myself).await;
        }
        if self.planner.state().replica(replica).is_some() {
            self.post(myself, Event::ReplicaLoadFailed { replica, reason: reason.to_string() });
            self.flush(myself).await;
        }
        for (item, call) in requeue {
            if self.sessions.contains_key(&item.activation.session) {
                self.pending.insert(item.activation, (item.clone(), call));
                self.post(myself, Event::UnitReady(item));
            }
        }
    }

    async fn child_stopped(&mut self, myself: &ActorRef<PlannerMsg>, cell: ActorCell, reason: Option<String>) {
        let id = cell.get_id();
        if let Some(replica) = self.replica_cells.remove(&id) {
            // A replica woken or reloaded under the same id is a new actor: the old one's end
            // is not the new one's.
            if !self.shutting_down && self.is_current(replica, id) {
                let reason = reason.unwrap_or_else(|| "the replica actor stopped".into());
                self.replica_gone(myself, replica, reason).await;
            }
        } else if let Some(session) = self.session_cells.remove(&id) {
            // A session actor that stops normally has sent its end report first; one that
            // crashed could not, so its end is recorded here.
            if let (Some(reason), false) = (reason, self.ended.contains_key(&session))
                && self.sessions.contains_key(&session)
            {
                self.on_session_ended(myself, self.crashed_session_report(session, reason)).await;
            }
        } else if self.tools.as_ref().is_some_and(|t| t.get_id() == id) && !self.shutting_down {
            self.faults.tool_crashes += 1;
            self.note(format!("the tool executors stopped ({}); restarted", reason.unwrap_or_default()));
            if let Err(e) = self.spawn_tools(myself).await {
                self.set_fatal(format!("cannot restart the tool executors: {e}"));
            }
        }
    }

    /// Whether `actor` is the actor now serving `replica` (not one it replaced under the same
    /// id after a sleep or an unload).
    fn is_current(&self, replica: ReplicaId, actor: ActorId) -> bool {
        self.replicas.get(&replica).is_some_and(|r| r.actor.get_id() == actor)
    }

    fn crashed_session_report(&self, session: SessionId, reason: String) -> SessionReport {
        let workflow = self.session_workflow(session).unwrap_or(0);
        let record = self.trace.get(session.0 as usize).map(|e| e.record).unwrap_or(0);
        let failed = Some(format!("session actor {reason}"));
        SessionReport {
            record: SessionRecord {
                session,
                workflow,
                arrived: self.wall(),
                finished: None,
                failed_at: Some(self.wall()),
                failed: failed.clone(),
                score: None,
                tools: Default::default(),
            },
            result: SessionResult { session, workflow, record, final_output: None, score: None, verifier_score: None, failed },
            calls: Vec::new(),
            timings: Vec::new(),
            interrupted: false,
        }
    }

    /// Front-door calls still queued whose client went away (it closed the connection, so the
    /// server dropped the answer's receiver): taken back from the core before they are placed —
    /// they no longer count in the queue, ask for a load or a scale-out — and answered as failed
    /// to their program. (A call already sent is abandoned by its replica, which watches the
    /// same sink.)
    fn withdraw_abandoned_calls(&mut self, myself: &ActorRef<PlannerMsg>) {
        let gone: Vec<ActivationId> =
            self.pending.iter().filter(|(_, (_, call))| call.request.sink.is_closed()).map(|(a, _)| *a).collect();
        for activation in gone {
            self.pending.remove(&activation);
            self.log("call_withdrawn", TraceLine {
                session: Some(activation.session.0),
                activation: Some(activation.index),
                detail: Some("the client went away before its call was scheduled".into()),
                ..blank()
            });
            self.post(myself, Event::UnitWithdrawn { activation });
            if let Some(s) = self.sessions.get(&activation.session) {
                let reason = "the client went away before its call was scheduled".to_string();
                let _ = s.send_message(SessionMsg::LlmFailed { activation, reason });
            }
        }
    }

    /// Watchdog: once every session has arrived and nothing runs, loads or gets reported for a
    /// few ticks while units still wait, those units can never be placed: fail their sessions
    /// (as the simulator does when its event queue runs dry).
    fn on_tick(&mut self) {
        if self.fatal.is_some() || self.done() || self.shutting_down {
            return;
        }
        let state = self.planner.state();
        let idle = self.arrived.len() >= self.total()
            && self.in_flight.is_empty()
            && state.running().is_empty()
            && state.replicas().all(|r| r.phase == ReplicaPhase::Awake)
            && !state.queue().is_empty();
        if !idle || self.events != self.last_tick_events {
            self.last_tick_events = self.events;
            self.quiet_ticks = 0;
            return;
        }
        self.quiet_ticks += 1;
        if self.quiet_ticks < self.stranded_after_ticks {
            return;
        }
        self.quiet_ticks = 0;
        let stranded: Vec<(ActivationId, DeploymentId)> = state.queue().iter().map(|w| (w.activation, w.deployment)).collect();
        for (a, deployment) in stranded {
            let why = self.last_errors(deployment);
            if let Some(s) = self.sessions.get(&a.session) {
                let _ = s.send_message(SessionMsg::Fail(format!("unit {a} could not be placed on any device of the pool{why}")));
            }
        }
    }

    /// Fail every open session and every one still to arrive.
    fn abort(&mut self, reason: String) {
        self.aborted = true;
        for s in self.sessions.values() {
            let _ = s.send_message(SessionMsg::Abandon(reason.clone()));
        }
        let missing: Vec<(usize, u32)> =
            self.trace.entries().filter(|(i, _)| !self.arrived.contains(i)).map(|(i, e)| (i, e.workflow)).collect();
        let wall = self.wall();
        for (i, workflow) in missing {
            self.arrived.insert(i);
            self.inputs.remove(&i);
            self.start_failure(workflow, wall, format!("s{i}: {reason} before the session arrived"));
        }
    }

    /// Reclaim every replica and parked engine and build the output.
    async fn shutdown(&mut self) -> LiveOutput {
        self.shutting_down = true;
        let wall = self.wall();
        let mut open_resident = Vec::new();
        let replicas: Vec<(ReplicaId, ReplicaEntry)> = std::mem::take(&mut self.replicas).into_iter().collect();
        for (_, r) in replicas.iter().filter(|(_, r)| !r.fixed) {
            if let Some(since) = r.loading_since
                && let Some(tl) = self.timelines.get_mut(r.device.0 as usize)
            {
                tl.segments.push(Segment { start: since, end: wall, kind: SegmentKind::Loading, deployment: r.deployment.0 });
            }
            if let Some(since) = r.busy_since
                && let Some(tl) = self.timelines.get_mut(r.device.0 as usize)
            {
                tl.segments.push(Segment { start: since, end: wall, kind: SegmentKind::Generating, deployment: r.deployment.0 });
            }
            if let Some(since) = r.resident_since {
                open_resident.push((r.device.0, r.deployment, since));
            }
        }
        // A replica still loading stops its load now (its actor handles the Stop after it): a
        // deadline or Ctrl-C waited out the 30 s below for each, with nothing said.
        self.stopping.send_replace(true);
        let stops = replicas.iter().map(|(_, r)| r.actor.call(ReplicaMsg::Stop, Some(Duration::from_secs(30))));
        for (result, (replica, r)) in futures::future::join_all(stops).await.into_iter().zip(&replicas) {
            // A cut-short load stops its actor itself (its engine unloaded): nothing to confirm.
            if !matches!(result, Ok(ractor::rpc::CallResult::Success(()))) && r.loading_since.is_none() {
                self.note(format!("replica {replica} did not confirm its unload at shutdown"));
            }
        }
        let parked: Vec<EngineHandle> = std::mem::take(&mut self.parked).into_values().map(|(_, _, e)| e).collect();
        let unloads = parked.iter().map(|e| e.engine.unload());
        for (result, e) in futures::future::join_all(unloads).await.into_iter().zip(&parked) {
            if let Err(err) = result {
                self.note(format!("a parked {} engine did not unload: {err}", e.engine.kind()));
            }
        }
        if let Some(t) = self.tools.take() {
            t.stop(None);
        }
        for s in self.sessions.values() {
            s.stop(None);
        }
        let reports: Vec<SessionReport> = std::mem::take(&mut self.ended).into_values().collect();
        let tally = exec::SessionTally::of(reports.iter().map(|r| &r.record));
        let mut timelines = std::mem::take(&mut self.timelines);
        let state = self.planner.state();
        let (report, window) = exec::build_report(ReportInput {
            workflows: &self.ctx.workflows,
            policy: self.planner.policy_name(),
            seed: self.meta.seed,
            noise_seed: self.meta.noise_seed,
            arrival: self.meta.arrival.clone(),
            pool: &self.meta.pool,
            gpus: self.devices.len(),
            sessions: &tally,
            start_failures: &self.start_failures,
            timelines: &mut timelines,
            open_resident: &open_resident,
            work: &self.work,
            counters: self.counters,
            loads: state.loads().saturating_sub(self.fixed_loads),
            evictions: state.evictions().saturating_sub(self.fixed_evictions),
            sleeps: state.sleeps(),
            wakes: state.wakes(),
            prefetch: state.prefetch_checks(),
            fusion: state.fusion_checks(),
            tao_admission: state.tao_checks(),
            interrupted: false,
        });
        let mut report = report;
        report.fixed_endpoint_gpus = self.fixed_devices.len();
        report.routing = self.routes.report(&self.ctx.workflows);
        report.wasted = self.wasted;
        let mut calls: Vec<CallRecord> = reports.iter().flat_map(|r| r.calls.iter().cloned()).collect();
        calls.sort_by(|a, b| a.finished_at.total_cmp(&b.finished_at));
        let timings = reports.iter().flat_map(|r| r.timings.iter().copied()).collect();
        let allowances = (0..self.ctx.deployments.len() as u32)
            .map(DeploymentId)
            .filter_map(|d| Some((d, self.planner.backend_allowance(d)?)))
            .collect();
        LiveOutput {
            allowances,
            report,
            sessions: reports.into_iter().map(|r| r.result).collect(),
            calls,
            timings,
            timelines,
            window,
            notes: std::mem::take(&mut self.notes),
            telemetry: std::mem::take(&mut self.telemetry),
            faults: self.faults,
            error: self.fatal.clone(),
            trace: std::mem::take(&mut self.trace_lines),
            interrupted: self.ended_interrupted,
        }
    }
}

/// A trace line with no fields set.
fn blank() -> TraceLine {
    TraceLine { t: 0.0, event: "", session: None, activation: None, node: None, replica: None, device: None, detail: None }
}

fn spec_name(workflows: &[Arc<crate::workflow::WorkflowSpec>], w: u32) -> String {
    workflows.get(w as usize).map(|s| s.name.clone()).unwrap_or_default()
}

/// The sessions' arrivals, by session id (ids count from 0 in arrival order): a run's whole
/// trace, or what a served runtime has been given so far. A served runtime forgets the entry
/// of a session whose outcome it forgets (`--keep-ended`), so its memory is bounded by the
/// sessions it keeps, not by every session it ever ran.
struct SessionTrace {
    entries: BTreeMap<usize, TraceEntry>,
    /// Sessions ever given (the next id).
    next: usize,
    /// The first session's arrival, kept when its entry is forgotten.
    first_at: Option<f64>,
}

impl SessionTrace {
    fn new(trace: Vec<TraceEntry>) -> Self {
        let first_at = trace.first().map(|e| e.at);
        SessionTrace { next: trace.len(), entries: trace.into_iter().enumerate().collect(), first_at }
    }

    fn len(&self) -> usize {
        self.next
    }

    /// Add an arrival; its session id.
    fn push(&mut self, e: TraceEntry) -> usize {
        self.first_at.get_or_insert(e.at);
        let i = self.next;
        self.entries.insert(i, e);
        self.next += 1;
        i
    }

    fn get(&self, i: usize) -> Option<&TraceEntry> {
        self.entries.get(&i)
    }

    fn first_at(&self) -> Option<f64> {
        self.first_at
    }

    /// The entries not forgotten, with their ids, in id order.
    fn entries(&self) -> impl Iterator<Item = (usize, &TraceEntry)> {
        self.entries.iter().map(|(i, e)| (*i, e))
    }

    fn forget(&mut self, i: usize) {
        self.entries.remove(&i);
    }
}

#[cfg(test)]
mod tests {
    use super::SessionTrace;
    use crate::exec::TraceEntry;

    fn entry(at: f64) -> TraceEntry {
        TraceEntry { at, workflow: 0, record: 0 }
    }

    #[test]
    fn a_served_trace_forgets_sessions_and_keeps_counting_ids() {
        let mut t = SessionTrace::new(vec![entry(5.0)]);
        let ids: Vec<usize> = (1..5).map(|k| t.push(entry(10.0 + k as f64))).collect();
        assert_eq!(ids, [1, 2, 3, 4]);
        t.forget(0);
        t.forget(2);
        assert_eq!((t.get(2).is_none(), t.get(3).map(|e| e.at), t.len(), t.first_at()), (true, Some(13.0), 5, Some(5.0)));
        assert_eq!(t.push(entry(20.0)), 5);
        assert_eq!(t.entries().map(|(i, _)| i).collect::<Vec<_>>(), [1, 3, 4, 5]);
        // Forgetting an id twice, or one never given, changes nothing.
        t.forget(2);
        t.forget(99);
        assert_eq!(t.entries().count(), 4);
        // Sessions whose outcomes are forgotten keep no entry, whatever stays open.
        for _ in 0..10_000 {
            let i = t.push(entry(30.0));
            t.forget(i);
        }
        assert_eq!((t.entries.len(), t.len()), (4, 10_006));
    }
}
