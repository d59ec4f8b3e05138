//! The simulator shell: a deterministic discrete-event loop on virtual time that drives the
//! pure planner core, the emulated replicas (`switchyard-emulator`, the ground truth) and the
//! tools (`switchyard-tools`).
//!
//! Events are processed in (time, sequence) order. Session arrivals are drawn from the seed as
//! sessions arrive (`exec::arrivals::ArrivalStream`); LLM outputs come from the responders, seeded per (trace seed, workflow,
//! session, node, round) so that every policy sees the same outputs; engine timing noise has its
//! own seed. Tool durations enter virtual time as *modeled* values, while the real tool runs on
//! a worker thread and is joined at its virtual completion — so the report is a function of the
//! inputs and seeds only: same inputs, same bytes.
//!
//! This is a shell: its bookkeeping is I/O-free and it makes no scheduling decision of its own
//! (those are the planner's); the tool worker pool (`toolpool.rs`) runs the real tools
//! (sandboxed interpreters), reads `SWITCHYARD_PYTHON_SANDBOX` and keeps the process-wide memo
//! of tool outcomes. It owns only what is particular to virtual time: the event queue, the
//! window of sessions in flight (`window.rs`), the emulated replicas, the tool worker pool, and
//! the agent-session loop of paper 000 (`agentic.rs`, `agent_routing.rs`). What both shells do
//! (setting a run up, preparing activations, the records and the report) is `crate::exec`'s;
//! `sim` depends on it and must not depend on `live`.

pub mod agent_routing;
pub mod agentic;
pub mod outcome_store;
mod toolpool;
mod window;

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use switchyard_emulator::{EmulatedReplica, EngineEvent, EngineRequest, ReplicaState, ServingConfig, WeightSource};
use switchyard_predictor::{Dtype, spec};
use switchyard_tools::{ToolCall, modeled_duration_s};
use thiserror::Error;

use crate::exec::graph_info::NodeFacts;
use crate::exec::{
    self, CallRecord, Counters, PrepareContext, PreparedLlm, Ready, ReportInput, RunConfig, SessionRecord, SessionTally,
    ShellError, TokenWork, TraceEntry, TraceLine, arrivals, finish_detail, tool_trace_detail as trace_detail,
};
use crate::ids::{ActivationId, DeviceId, ReplicaId, SessionId};
use crate::planner::{
    Command, DeploymentId, DeploymentInfo, Event, PlanError, Planner,
};
use crate::report::{DeviceTimeline, RunReport, Segment, SegmentKind, SessionToolLog, round3};
use crate::session::Session;
use crate::tokens;
use crate::values::{NodeOutput, derive_seed};
use crate::workflow::NodeKind;
use toolpool::{Follower, ToolJob, ToolPool, VerdictMatch};
pub use toolpool::{outcome_store_tally, use_outcome_store};
use window::SessionWindow;

/// Errors that stop a simulation (a failing *session* is not one: it is reported).
#[derive(Debug, Error)]
pub enum SimError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Shell(#[from] ShellError),
    #[error("internal: {0}")]
    Internal(String),
}

/// What a run produces.
pub struct SimOutput {
    pub report: RunReport,
    pub trace: Vec<TraceLine>,
    pub timelines: Vec<DeviceTimeline>,
    /// Window of the report: first arrival, last completion.
    pub window: (f64, f64),
    /// One line per sandbox fallback the tools reported (deduplicated).
    pub notes: Vec<String>,
    /// Every completed activation, in completion order.
    pub calls: Vec<CallRecord>,
    /// The planner's input tick by tick (only with [`SimOptions::record_planner`]).
    pub planner_ticks: Vec<PlannerTick>,
    /// Every session's record (arrival, end, score), in session order (only with
    /// [`SimOptions::keep_sessions`]).
    pub sessions: Vec<SessionRecord>,
    /// Every routed program the run closed (verified or failed), in the order they closed.
    pub programs: Vec<exec::routing::ProgramRecord>,
    /// The per-request allowance δ̂ each routed deployment's DISC ledger learned from the
    /// engines' usage, by deployment identity (empty without a router).
    pub allowances: BTreeMap<DeploymentId, f64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum SimEvent {
    /// Session `.0` arrives (its trace entry).
    Arrival(usize, TraceEntry),
    /// The end of a replica's iteration in progress (or of its planned decode run), with the
    /// replica's schedule token at the time: an event whose token is no longer the replica's
    /// was superseded (the run was cut short, see [`Sim::retime`]) and is ignored.
    IterationEnd(ReplicaId, u64),
    /// A load or a wake completes.
    LoadDone(ReplicaId),
    /// A sleep completes.
    SleepDone(ReplicaId),
    /// A teardown completes: the replica's device memory is free.
    UnloadDone(ReplicaId),
    ToolDone(ActivationId),
    /// The agent framework hands a finished call's output to its session
    /// ([`RunConfig::handoff_s`] after the finish).
    Handoff(ActivationId),
    /// A routed session's verifier returns ([`VERIFIER_S`] after the session ended).
    Verdict(SessionId),
    /// The policy asked to plan at this time though no event may come
    /// ([`crate::planner::Policy::next_wakeup`]: the substrate's upscale delay running out).
    Wakeup,
}

/// How long a routed session's verifier takes after the session ends (assumption: the exact
/// answer and ROUGE checks are milliseconds; MBPP's tests already ran inside the workflow).
pub const VERIFIER_S: f64 = 0.05;



struct Scheduled {
    at: f64,
    seq: u64,
    event: SimEvent,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    // Reversed: BinaryHeap is a max-heap and we pop the earliest event.
    fn cmp(&self, o: &Self) -> Ordering {
        o.at.total_cmp(&self.at).then(o.seq.cmp(&self.seq))
    }
}

/// One arrived session: its state machine and what the report needs of it (the shared record,
/// kept up to date as the session runs). The state machine (prompts, outputs) is dropped when
/// the session ends, so memory follows the sessions in flight; the record stays.
struct SessionRun {
    /// Boxed: a slot of an ended session (or of one yet to arrive) costs a pointer, not a
    /// state machine's worth, so the session table grows with the total only by its records.
    session: Option<Box<Session>>,
    record: SessionRecord,
}

/// What a run keeps beyond its report. Both default to on ([`simulate`], [`simulate_with`]);
/// a caller that needs neither (the CLI without `--trace`) turns them off, so a long run's
/// memory does not grow with its event count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimOptions {
    /// Keep every event as a [`TraceLine`] ([`SimOutput::trace`]).
    pub keep_trace: bool,
    /// Keep every completed activation ([`SimOutput::calls`]).
    pub keep_calls: bool,
    /// Keep every session's record ([`SimOutput::sessions`]); without it a session's record is
    /// dropped once the report's tally has counted it.
    pub keep_sessions: bool,
    /// Keep at most about twice this many GPU-timeline segments per device: past that, the
    /// older ones are folded into the report's partition ([`DeviceTimeline::fold_until`]) and
    /// [`SimOutput::timelines`] draws only the newest. `None`: the whole timeline (a chart).
    pub timeline_segments: Option<usize>,
    /// Record the planner's input, tick by tick ([`SimOutput::planner_ticks`]), so that the
    /// planning cost can be measured by replaying it (`benches/planner_stream.rs`).
    pub record_planner: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions { keep_trace: true, keep_calls: true, keep_sessions: true, timeline_segments: None, record_planner: false }
    }
}

/// One scheduling tick as the planner saw it: the time and the events folded at it.
pub type PlannerTick = (f64, Vec<Event>);

struct Replica {
    engine: EmulatedReplica,
    device: DeviceId,
    deployment: DeploymentId,
    iterating: bool,
    resident_since: Option<f64>,
    /// Since when it sleeps (from the sleep command until its wake or unload).
    asleep_since: Option<f64>,
    /// Identifies the replica's current [`SimEvent::IterationEnd`].
    token: u64,
    /// Decode steps the next run may plan ahead ([`EmulatedReplica::extend_decode_run`]):
    /// doubles while runs reach their end, back to the minimum when one is cut short, so a
    /// replica that keeps receiving requests plans little it must drop. (Measured on 3,000
    /// gsm8k+qmsum sessions: with runs of up to 8,192 steps a third of the planned steps were
    /// dropped by cuts, with up to 256 a seventh, for one more event per 256 steps.)
    run_steps: usize,
    /// The engine's iteration count at its last DISC usage observation (routed models only).
    observed_iterations: u64,
    /// Whether the iteration in progress ends a planned run.
    in_run: bool,
}

/// Bounds of [`Replica::run_steps`].
const MIN_RUN_STEPS: usize = 32;
const MAX_RUN_STEPS: usize = 256;

struct InFlight {
    activation: ActivationId,
    workflow: u32,
    deployment: DeploymentId,
    output: NodeOutput,
}

struct Sim<'a> {
    cfg: &'a RunConfig,
    opts: SimOptions,
    planner: Planner,
    deployments: Vec<DeploymentInfo>,
    /// Deployment of each (workflow, deployment name).
    deployment_of: BTreeMap<(u32, String), DeploymentId>,
    /// Static per-node facts of each workflow (chains, critical paths).
    node_info: NodeFacts,
    /// Near-ready units already reported to the planner.
    near_sent: std::collections::BTreeSet<ActivationId>,
    /// The outlook last told the planner, per session in flight ([`Event::SessionOutlook`]).
    outlook_sent: BTreeMap<SessionId, Vec<DeploymentId>>,
    queue: BinaryHeap<Scheduled>,
    seq: u64,
    now: f64,
    /// The trace, drawn as sessions arrive; the next arrival is drawn ahead (`next_arrival`:
    /// its index and entry), and is processed before any queued event of its time or later
    /// (as if every arrival had been queued first).
    arrivals: arrivals::ArrivalStream,
    next_arrival: Option<(usize, TraceEntry)>,
    /// A second copy of the arrival stream, [`TOOL_LOOKAHEAD_SESSIONS`] ahead of `arrivals`,
    /// and the index of its next entry: the sessions whose first tool calls are prefetched
    /// before they arrive (`None` when no workflow [`looks_ahead`]).
    lookahead: Option<(arrivals::ArrivalStream, usize)>,
    sessions_total: usize,
    records: Vec<Arc<Vec<crate::values::Record>>>,
    /// The sessions in flight ([`SessionWindow`]).
    sessions: SessionWindow<SessionRun>,
    /// The ended sessions, counted for the report.
    tally: SessionTally,
    /// The ended sessions' records (only with [`SimOptions::keep_sessions`]).
    kept_sessions: Vec<SessionRecord>,
    /// When the first session that started arrived (the report's window starts there).
    first_opened: Option<f64>,
    /// The score of each routed session that completed, until its verdict lands.
    verdict_scores: BTreeMap<SessionId, Option<f64>>,
    /// Ready LLM units whose request is prepared but not yet dispatched.
    prepared: BTreeMap<ActivationId, PreparedLlm>,
    replicas: BTreeMap<ReplicaId, Replica>,
    /// The ids in `replicas` of each device's replicas, ascending (a device's replicas are
    /// settled without visiting the others').
    on_device: Vec<Vec<ReplicaId>>,
    in_flight: BTreeMap<u64, InFlight>,
    next_request: u64,
    tools: ToolPool,
    /// Running tool calls: the job, the calling node's name and the tool's name.
    tool_jobs: BTreeMap<ActivationId, (ToolJob, String, String)>,
    /// Outputs in the agent framework's hands, delivered by [`SimEvent::Handoff`].
    handoffs: BTreeMap<ActivationId, NodeOutput>,
    handoff_s: f64,
    /// Per workflow: whether it has a tool node (only then are tool calls prefetched).
    has_tools: Vec<bool>,
    /// Per workflow: whether the lookahead prefetches its sessions' first calls ([`looks_ahead`]).
    looks_ahead: Vec<bool>,
    timelines: Vec<DeviceTimeline>,
    /// (model, dtype, device) whose weights were read before in this run: later loads read
    /// them from the page cache, the first from disk. (Per device: the emulated pool has no
    /// node grouping, so a node's other GPUs do not share it — the conservative end.)
    weights_read: std::collections::BTreeSet<(String, Dtype, u32)>,
    /// Per device: when its latest memory-releasing transition (teardown, sleep) ends; a load
    /// or wake there starts no earlier (vLLM's start-up refuses a device whose memory is
    /// still held).
    released_at: Vec<f64>,
    /// Engines being torn down, until their `UnloadDone`.
    tearing_down: BTreeMap<ReplicaId, Replica>,
    work: TokenWork,
    trace: Vec<TraceLine>,
    notes: Vec<String>,
    counters: Counters,
    done_sessions: usize,
    /// Sessions that could not even be instantiated: (workflow, arrival, reason).
    start_failures: Vec<(u32, f64, String)>,
    calls: Vec<CallRecord>,
    /// Planner events of the current tick, not yet handed over.
    tick_events: Vec<Event>,
    planner_ticks: Vec<PlannerTick>,
    /// The run was interrupted (see [`Flow::Interrupt`]).
    interrupted: bool,
    /// Routed workflows bound to a route member: (workflow, member) → the bound spec.
    bound_specs: exec::routing::BoundSpecs,
    /// Routed sessions: open rows, closed counts.
    routes: exec::routing::RouteBook,
    /// Routed programs: the first request of each open one; the record of each closed one.
    program_tasks: BTreeMap<SessionId, String>,
    programs: Vec<exec::routing::ProgramRecord>,
    /// Plan once more at this tick even without events (a verdict may have admitted programs).
    replan: bool,
    /// The policy's wake-up scheduled last ([`SimEvent::Wakeup`]), while it is in the future.
    wakeup_at: Option<f64>,
}

/// Where a running simulation stands, handed to the progress callback of [`simulate_with`] once
/// per scheduling tick (each distinct virtual time).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimProgress {
    /// Sessions that ended (completed or failed).
    pub sessions_done: usize,
    pub sessions_total: usize,
    /// Virtual time, seconds.
    pub now_s: f64,
    /// Simulator events processed so far.
    pub events: u64,
}

/// What the progress callback of [`simulate_with`] asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Stop before the next event (e.g. on Ctrl-C): the sessions still open, and those yet to
    /// arrive, are failed as [`exec::INTERRUPTED`] and the report is marked `interrupted`.
    Interrupt,
}

/// Run one simulation. `progress(done, total)` is called as sessions finish.
pub fn simulate(cfg: &RunConfig, progress: &mut dyn FnMut(usize, usize)) -> Result<SimOutput, SimError> {
    simulate_with(cfg, &mut |p: &SimProgress| {
        progress(p.sessions_done, p.sessions_total);
        Flow::Continue
    })
}

/// Run one simulation; `progress` is called once per scheduling tick and may interrupt the run,
/// which then ends with a partial report (`interrupted: true`).
pub fn simulate_with(cfg: &RunConfig, progress: &mut dyn FnMut(&SimProgress) -> Flow) -> Result<SimOutput, SimError> {
    simulate_opts(cfg, SimOptions::default(), progress)
}

/// [`simulate_with`], keeping only what `opts` asks for beyond the report (the report itself
/// does not depend on `opts`).
pub fn simulate_opts(
    cfg: &RunConfig,
    opts: SimOptions,
    progress: &mut dyn FnMut(&SimProgress) -> Flow,
) -> Result<SimOutput, SimError> {
    let mut sim = Sim::new(cfg, opts)?;
    sim.run(progress)?;
    Ok(sim.finish())
}

impl<'a> Sim<'a> {
    fn new(cfg: &'a RunConfig, opts: SimOptions) -> Result<Self, SimError> {
        let (deployments, deployment_of) = exec::deployment_table(&cfg.workflows, cfg.max_num_seqs)?;
        let planner =
            exec::build_planner(&cfg.pool, &deployments, &cfg.policy, cfg.options, &cfg.predictor, cfg.substrate)?;
        let records = exec::load_records(&cfg.workflows)?;
        let sizes: Vec<usize> = records.iter().map(|r| r.len()).collect();
        let mut arrival_stream = arrivals::ArrivalStream::new(&cfg.arrivals_of(), &cfg.sessions_of(), &sizes, cfg.seed);
        let has_tools: Vec<bool> =
            cfg.workflows.iter().map(|w| w.nodes.iter().any(|n| matches!(n.kind, NodeKind::Tool(_)))).collect();
        let looks_ahead: Vec<bool> = cfg.workflows.iter().map(|w| looks_ahead(w)).collect();
        let lookahead = looks_ahead.contains(&true).then(|| (arrival_stream.clone(), 0));
        let sessions_total = arrival_stream.remaining();
        let next_arrival = arrival_stream.next().map(|e| (0, e));
        let timelines = cfg
            .pool
            .devices
            .iter()
            .map(|d| DeviceTimeline::new(d.name.clone()))
            .collect();
        let node_info = exec::node_infos(&cfg.workflows, &deployment_of);
        let mut planner = planner;
        if let Some(setup) = exec::routing::routing_setup(&cfg.workflows, &records, &deployments, &deployment_of, &cfg.pool, &cfg.routing)? {
            planner.set_routing(setup)?;
        }
        let sim = Sim {
            cfg,
            opts,
            planner,
            deployments,
            deployment_of,
            node_info,
            near_sent: std::collections::BTreeSet::new(),
            outlook_sent: BTreeMap::new(),
            queue: BinaryHeap::new(),
            seq: 0,
            now: 0.0,
            arrivals: arrival_stream,
            next_arrival,
            lookahead,
            sessions_total,
            sessions: SessionWindow::default(),
            tally: SessionTally::default(),
            kept_sessions: Vec::new(),
            first_opened: None,
            verdict_scores: BTreeMap::new(),
            records,
            prepared: BTreeMap::new(),
            replicas: BTreeMap::new(),
            on_device: vec![Vec::new(); cfg.pool.devices.len()],
            in_flight: BTreeMap::new(),
            next_request: 0,
            tools: ToolPool::new(cfg.tool_workers),
            tool_jobs: BTreeMap::new(),
            handoffs: BTreeMap::new(),
            handoff_s: cfg.handoff_s,
            has_tools,
            looks_ahead,
            timelines,
            weights_read: std::collections::BTreeSet::new(),
            released_at: vec![0.0; cfg.pool.devices.len()],
            tearing_down: BTreeMap::new(),
            work: BTreeMap::new(),
            trace: Vec::new(),
            notes: Vec::new(),
            counters: Counters::default(),
            done_sessions: 0,
            start_failures: Vec::new(),
            calls: Vec::new(),
            tick_events: Vec::new(),
            planner_ticks: Vec::new(),
            interrupted: false,
            bound_specs: BTreeMap::new(),
            routes: exec::routing::RouteBook::default(),
            program_tasks: BTreeMap::new(),
            programs: Vec::new(),
            replan: false,
            wakeup_at: None,
        };
        Ok(sim)
    }

    /// The next event: the next arrival if no queued event comes before it (an arrival goes
    /// first at a tie, as if every arrival had been queued before anything else), else the
    /// first queued event.
    fn pop_next(&mut self) -> Option<(f64, SimEvent)> {
        if let Some((i, entry)) = self.next_arrival
            && self.queue.peek().is_none_or(|n| entry.at <= n.at)
        {
            self.next_arrival = self.arrivals.next().map(|e| (i + 1, e));
            self.look_ahead(i);
            return Some((entry.at, SimEvent::Arrival(i, entry)));
        }
        self.queue.pop().map(|n| (n.at, n.event))
    }

    /// The time of the next event, if any.
    fn next_time(&self) -> Option<f64> {
        let queued = self.queue.peek().map(|n| n.at);
        match (queued, self.next_arrival.map(|(_, e)| e.at)) {
            (Some(q), Some(a)) => Some(q.min(a)),
            (q, a) => q.or(a),
        }
    }

    fn schedule(&mut self, at: f64, event: SimEvent) {
        self.seq += 1;
        self.queue.push(Scheduled { at, seq: self.seq, event });
    }

    fn log(&mut self, event: &'static str, line: TraceLine) {
        if !self.opts.keep_trace {
            return;
        }
        self.trace.push(TraceLine { t: round3(self.now), event, ..line });
    }

    fn run(&mut self, progress: &mut dyn FnMut(&SimProgress) -> Flow) -> Result<(), SimError> {
        let total = self.sessions_total;
        let mut events = 0u64;
        while let Some((at, event)) = self.pop_next() {
            self.now = at;
            events += 1;
            match event {
                SimEvent::Arrival(i, entry) => self.on_arrival(i, entry)?,
                SimEvent::IterationEnd(r, token) => self.on_iteration_end(r, token)?,
                SimEvent::LoadDone(r) => self.on_load_done(r)?,
                SimEvent::SleepDone(r) => self.on_sleep_done(r)?,
                SimEvent::UnloadDone(r) => self.on_unload_done(r)?,
                SimEvent::ToolDone(a) => self.on_tool_done(a)?,
                SimEvent::Handoff(a) => {
                    if let Some(output) = self.handoffs.remove(&a) {
                        self.complete(a, output)?;
                    }
                }
                SimEvent::Verdict(s) => self.on_verdict(s)?,
                SimEvent::Wakeup => {
                    if self.wakeup_at == Some(self.now) {
                        self.wakeup_at = None;
                    }
                    self.replan = true;
                }
            }
            // One scheduling tick per distinct virtual time.
            if self.next_time().is_none_or(|t| t > self.now) {
                self.flush()?;
                self.bound_timelines();
                let at = SimProgress { sessions_done: self.done_sessions, sessions_total: total, now_s: self.now, events };
                if progress(&at) == Flow::Interrupt && self.next_time().is_some() {
                    self.interrupt();
                    return Ok(());
                }
            }
        }
        self.flush()?;
        // Anything still queued could never be served (e.g. no device can hold its model).
        let stranded: Vec<ActivationId> =
            self.planner.state().queue().iter().map(|w| w.activation).collect();
        for a in stranded {
            self.fail_session(a.session, format!("unit {a} could not be placed on any device of the pool"));
        }
        let now = self.now;
        let open: Vec<usize> = self.sessions.iter().map(|(i, _)| i).collect();
        for i in open {
            if let Some(mut run) = self.sessions.close(i) {
                if run.record.finished.is_none() && run.record.failed.is_none() {
                    run.record.failed = Some("the simulation ended with the session unfinished".into());
                    run.record.failed_at = Some(now);
                }
                self.count_ended(run.record);
            }
        }
        Ok(())
    }

    /// Stop here: fail every open session, and every session yet to arrive, as interrupted.
    /// Events still queued are dropped (running tool calls are joined when the pool drops).
    fn interrupt(&mut self) {
        self.interrupted = true;
        let open: Vec<usize> = self.sessions.iter().map(|(i, _)| i).collect();
        for i in open {
            self.fail_session(SessionId(i as u32), exec::INTERRUPTED.to_string());
        }
        while let Some((i, entry)) = self.next_arrival.take() {
            self.start_failures.push((entry.workflow, self.now, format!("s{i}: {} before the session arrived", exec::INTERRUPTED)));
            self.done_sessions += 1;
            self.next_arrival = self.arrivals.next().map(|e| (i + 1, e));
        }
        self.queue.clear();
        self.tick_events.clear();
    }

    /// Queue an event for the planner; it plans once per tick (see [`Sim::flush`]).
    fn plan(&mut self, event: Event) -> Result<(), SimError> {
        self.tick_events.push(event);
        Ok(())
    }

    /// Hand every event of this tick to the planner at once and execute its commands, until
    /// executing them produces no further event at this time.
    fn flush(&mut self) -> Result<(), SimError> {
        let mut planned = false;
        while !self.tick_events.is_empty() || std::mem::take(&mut self.replan) {
            let events = std::mem::take(&mut self.tick_events);
            if self.opts.record_planner {
                self.planner_ticks.push((self.now, events.clone()));
            }
            let commands = self.planner.handle_all(events, self.now)?;
            planned = true;
            for c in commands {
                self.execute(c)?;
            }
        }
        // A rule that waits (the substrate's upscale delay) acts when its time comes, not at
        // whatever event happens to follow it: one wake-up at a time, the earliest asked for.
        // Once every session has ended nothing is left to scale out for.
        let open = self.done_sessions < self.sessions_total;
        if planned && open && let Some(t) = self.planner.next_wakeup(self.now)
            && self.wakeup_at.is_none_or(|w| t < w)
        {
            self.wakeup_at = Some(t);
            self.schedule(t, SimEvent::Wakeup);
        }
        Ok(())
    }

    fn execute(&mut self, command: Command) -> Result<(), SimError> {
        match command {
            Command::Load { replica, deployment, device } => {
                let d = &self.deployments[deployment.0 as usize];
                let model = spec::model(&d.model).map_err(|e| SimError::Internal(e.to_string()))?;
                let dev = self.cfg.pool.devices[device.0 as usize].clone();
                let mut config = ServingConfig::vllm_defaults_on(&dev, d.dtype, d.max_model_len);
                config.gpu_memory_utilization = d.gpu_memory_utilization;
                config.max_num_seqs = self.cfg.max_num_seqs;
                let noise = derive_seed(self.cfg.noise_seed, &["replica", &replica.0.to_string()]);
                let source = if self.weights_read.insert((d.model.clone(), d.dtype, device.0)) {
                    WeightSource::Disk
                } else {
                    WeightSource::PageCache
                };
                self.log("load", TraceLine {
                    replica: Some(replica.0),
                    device: Some(device.0),
                    detail: Some(d.model.clone()),
                    ..blank()
                });
                // The load starts once the device's earlier teardowns and sleeps have ended.
                let start = self.released_at[device.0 as usize].max(self.now);
                let started = EmulatedReplica::new(dev, model, config, noise)
                    .map_err(|e| e.to_string())
                    .and_then(|mut engine| {
                        engine.begin_load_from(start, source).map(|until| (engine, until)).map_err(|e| e.to_string())
                    });
                match started {
                    Ok((engine, until)) => {
                        self.push_segment(device, deployment, start, until, SegmentKind::Loading);
                        if let Some(ids) = self.on_device.get_mut(device.0 as usize) {
                            let at = ids.partition_point(|id| *id < replica);
                            ids.insert(at, replica);
                        }
                        self.replicas.insert(replica, Replica {
                            engine,
                            device,
                            deployment,
                            iterating: false,
                            resident_since: None,
                            asleep_since: None,
                            token: 0,
                            run_steps: MIN_RUN_STEPS,
                            observed_iterations: 0,
                            in_run: false,
                        });
                        self.schedule(until, SimEvent::LoadDone(replica));
                    }
                    Err(reason) => {
                        self.log("load_failed", TraceLine { replica: Some(replica.0), detail: Some(reason.clone()), ..blank() });
                        self.plan(Event::ReplicaLoadFailed { replica, reason })?;
                    }
                }
            }
            Command::Unload { replica } => {
                let Some(mut r) = self.replicas.remove(&replica) else {
                    return Err(SimError::Internal(format!("unload of unknown replica {replica}")));
                };
                if let Some(ids) = self.on_device.get_mut(r.device.0 as usize) {
                    ids.retain(|id| *id != replica);
                }
                self.settle_device(r.device);
                self.close_intervals(&mut r);
                // A replica still falling asleep is torn down once its sleep has ended.
                let start = match r.engine.state() {
                    ReplicaState::Sleeping { until } => until.max(self.now),
                    _ => self.now,
                };
                r.engine.finish_transition(start);
                let until = r.engine.begin_unload(start).map_err(|e| SimError::Internal(e.to_string()))?;
                let device = r.device.0 as usize;
                self.released_at[device] = self.released_at[device].max(until);
                self.log("unload", TraceLine { replica: Some(replica.0), device: Some(r.device.0), ..blank() });
                self.tearing_down.insert(replica, r);
                self.schedule(until, SimEvent::UnloadDone(replica));
            }
            Command::Sleep { replica, level } => {
                let now = self.now;
                let Some(mut r) = self.replicas.remove(&replica) else {
                    return Err(SimError::Internal(format!("sleep of unknown replica {replica}")));
                };
                self.close_intervals(&mut r);
                r.asleep_since = Some(now);
                let until = r.engine.begin_sleep(level, now).map_err(|e| SimError::Internal(e.to_string()))?;
                let device = r.device.0 as usize;
                self.released_at[device] = self.released_at[device].max(until);
                self.log("sleep", TraceLine { replica: Some(replica.0), device: Some(r.device.0), detail: Some(format!("level {level}")), ..blank() });
                self.replicas.insert(replica, r);
                self.schedule(until, SimEvent::SleepDone(replica));
            }
            Command::Wake { replica } => {
                let Some(mut r) = self.replicas.remove(&replica) else {
                    return Err(SimError::Internal(format!("wake of unknown replica {replica}")));
                };
                self.close_intervals(&mut r);
                // A wake starts once the device's earlier teardowns and sleeps (its own
                // included) have ended.
                let start = self.released_at[r.device.0 as usize].max(self.now);
                r.engine.finish_transition(start);
                let until = r.engine.begin_wake(start).map_err(|e| SimError::Internal(e.to_string()))?;
                let (device, deployment) = (r.device, r.deployment);
                self.replicas.insert(replica, r);
                self.push_segment(device, deployment, start, until, SegmentKind::Loading);
                self.log("wake", TraceLine { replica: Some(replica.0), device: Some(device.0), ..blank() });
                self.schedule(until, SimEvent::LoadDone(replica));
            }
            Command::Dispatch { activation, replica } => self.dispatch(activation, replica)?,
        }
        Ok(())
    }

    fn dispatch(&mut self, activation: ActivationId, replica: ReplicaId) -> Result<(), SimError> {
        let Some(prep) = self.prepared.remove(&activation) else {
            return Err(SimError::Internal(format!("dispatch of unprepared unit {activation}")));
        };
        let workflow = self.session_workflow(activation.session)?;
        if let Some(session) = self.sessions.get_mut(activation.session.0 as usize).and_then(|r| r.session.as_deref_mut()) {
            session
                .mark_running(activation.index)
                .map_err(|e| SimError::Internal(e.to_string()))?;
        }
        let id = self.next_request;
        self.next_request += 1;
        let r = self
            .replicas
            .get_mut(&replica)
            .ok_or_else(|| SimError::Internal(format!("dispatch to unknown replica {replica}")))?;
        let output_tokens = prep.output.output_tokens.max(1);
        // The blocks the request's output completes are hashed as vLLM V1 hashes them, so a
        // request recomputed after a preemption hits what it had generated (when still cached).
        let block = r.engine.config().block_size.max(1);
        let prompt_blocks = prep.prompt_tokens / block;
        let generated_blocks = (prep.prompt_tokens + output_tokens) / block - prompt_blocks;
        let generated_hashes = if prep.prefix_hashes.len() == prompt_blocks as usize {
            tokens::generated_block_hashes(&prep.prefix_hashes, id, generated_blocks)
        } else {
            Vec::new()
        };
        let request = EngineRequest {
            id,
            prompt_tokens: prep.prompt_tokens,
            prefix_hashes: prep.prefix_hashes,
            generated_hashes,
            output_tokens,
        };
        let planned_end = r.engine.iteration_end();
        // A request submitted during a planned run cuts it at the step in progress.
        r.engine.submit(request, self.now).map_err(|e| SimError::Internal(e.to_string()))?;
        let deployment = r.deployment;
        let device = r.device;
        self.retime(replica, planned_end);
        self.in_flight.insert(id, InFlight { activation, workflow, deployment, output: prep.output });
        self.counters.llm_calls += 1;
        self.log("dispatch", TraceLine {
            session: Some(activation.session.0),
            activation: Some(activation.index),
            replica: Some(replica.0),
            device: Some(device.0),
            ..blank()
        });
        self.kick(replica);
        self.report_near_ready(activation.session)
    }

    /// Tell the planner about activations of `s` that became near-ready (all predecessors
    /// completed or running, at least one running).
    fn report_near_ready(&mut self, s: SessionId) -> Result<(), SimError> {
        let Some(run) = self.sessions.get(s.0 as usize) else { return Ok(()) };
        if run.record.failed.is_some() || run.record.finished.is_some() {
            return Ok(());
        }
        let Some(session) = run.session.as_deref() else { return Ok(()) };
        let Some(info) = self.node_info.of(run.record.workflow, session.spec()) else { return Ok(()) };
        let items = exec::near_ready_items(session, run.record.workflow, info, &self.near_sent);
        let outlook = exec::graph_info::outlook(session, info);
        for item in items {
            self.near_sent.insert(item.activation);
            self.plan(Event::UnitNearReady(item))?;
        }
        if self.outlook_sent.get(&s) != Some(&outlook) {
            self.outlook_sent.insert(s, outlook.clone());
            self.plan(Event::SessionOutlook { session: s, deployments: outlook })?;
        }
        Ok(())
    }

    /// Start an iteration on an idle replica that has work, and plan the decode steps after
    /// it when they are foreseeable ([`EmulatedReplica::extend_decode_run`]): the replica's
    /// next event is then the end of that run, one event instead of one per step. Nothing is
    /// lost: a step ends without an event of its own only when finishing it reports nothing,
    /// and whatever could change the run first — a request for this replica, or a segment
    /// pushed onto its device's timeline — cuts it at the step in progress then
    /// ([`Sim::retime`], [`Sim::settle_device`]), so the run is the same, event for event, as
    /// with one event per step.
    fn kick(&mut self, replica: ReplicaId) {
        let now = self.now;
        let Some(device) = self.replicas.get(&replica).filter(|r| !r.iterating).map(|r| r.device) else { return };
        self.settle_device(device);
        let Some(r) = self.replicas.get_mut(&replica) else { return };
        if let Some(first_end) = r.engine.start_iteration(now) {
            r.iterating = true;
            let planned = r.engine.extend_decode_run(r.run_steps);
            r.in_run = planned.is_some();
            let end = planned.unwrap_or(first_end);
            r.token += 1;
            let (token, deployment) = (r.token, r.deployment);
            let segments = &mut self.timelines[device.0 as usize].segments;
            // Back-to-back iterations of one replica extend one segment (one per busy period,
            // not one per iteration).
            match segments.last_mut() {
                Some(last)
                    if last.kind == SegmentKind::Generating && last.deployment == deployment.0 && last.end == now =>
                {
                    last.end = end;
                }
                _ => segments.push(Segment { start: now, end, kind: SegmentKind::Generating, deployment: deployment.0 }),
            }
            self.schedule(end, SimEvent::IterationEnd(replica, token));
        }
    }

    /// After something reached `replica` at this time (a submit), its iteration in progress
    /// may end earlier than `planned_end`, the end its queued event and its timeline segment
    /// carry (a planned run was cut): move both to the new end.
    fn retime(&mut self, replica: ReplicaId, planned_end: Option<f64>) {
        let Some(r) = self.replicas.get_mut(&replica) else { return };
        let end = r.engine.iteration_end();
        if end == planned_end || !r.iterating {
            return;
        }
        let Some(end) = end else { return };
        r.run_steps = MIN_RUN_STEPS;
        r.in_run = false;
        r.token += 1;
        let (token, device, deployment) = (r.token, r.device, r.deployment);
        // The run's segment is its device's last one: every other push onto the device
        // settles the device's runs first.
        if let Some(last) = self.timelines[device.0 as usize].segments.last_mut()
            && last.kind == SegmentKind::Generating && last.deployment == deployment.0 && Some(last.end) == planned_end
        {
            last.end = end;
        }
        self.schedule(end, SimEvent::IterationEnd(replica, token));
    }

    /// With [`SimOptions::timeline_segments`], a long run's GPU timelines stay bounded: past
    /// twice that many segments on a device, everything before its newest ones, and before now,
    /// is folded into the partition the report reads ([`DeviceTimeline::fold_until`]), and the
    /// idle-resident and sleep intervals still open there restart at the cut. Only a device's
    /// last segment is ever changed after it is pushed (a decode run cut back or extended, its
    /// end never before now), so nothing folded changes afterwards; the report's window starts
    /// at the first session's arrival, where the fold starts, and it folds only while a session
    /// is open, whose end (the window's end at the latest) is then no earlier than the cut.
    fn bound_timelines(&mut self) {
        let Some(kept) = self.opts.timeline_segments.map(|k| k.max(1)) else { return };
        let Some(from) = self.first_opened else { return };
        if self.sessions.iter().next().is_none() {
            return;
        }
        let now = self.now;
        for (d, tl) in self.timelines.iter_mut().enumerate() {
            // Segments may be pushed ahead of their end (loads, planned runs): never past now.
            let Some(cut) = tl.fold_cut(kept, from).map(|c| c.min(now)) else { continue };
            let mut open = Vec::new();
            for r in self.replicas.values_mut().filter(|r| r.device.0 as usize == d) {
                let deployment = r.deployment.0;
                for (since, kind) in [(&mut r.resident_since, SegmentKind::Resident), (&mut r.asleep_since, SegmentKind::Asleep)] {
                    if let Some(t) = since.as_mut().filter(|t| **t < cut) {
                        open.push(Segment { start: *t, end: cut, kind, deployment });
                        *t = cut;
                    }
                }
            }
            tl.fold_until(from, cut, &open);
        }
    }

    /// Cut the planned runs of the replicas on `device` at the steps in progress now (before a
    /// segment of something else is pushed onto the device's timeline, as with one event per
    /// step the runs' segments would end there).
    fn settle_device(&mut self, device: DeviceId) {
        let now = self.now;
        let Some(ids) = self.on_device.get(device.0 as usize) else { return };
        let mut running: Vec<(ReplicaId, Option<f64>)> = Vec::new();
        for id in ids {
            if let Some(r) = self.replicas.get_mut(id)
                && r.in_run
            {
                let planned_end = r.engine.iteration_end();
                r.engine.catch_up(now);
                running.push((*id, planned_end));
            }
        }
        for (id, planned_end) in running {
            self.retime(id, planned_end);
        }
    }

    fn on_arrival(&mut self, i: usize, entry: TraceEntry) -> Result<(), SimError> {
        let w = entry.workflow as usize;
        let spec = Arc::clone(&self.cfg.workflows[w]);
        let input = self.records[w][entry.record].clone();
        let id = SessionId(i as u32);
        self.log("arrival", TraceLine { session: Some(id.0), detail: Some(spec.name.clone()), ..blank() });
        match Session::new(id, spec, input) {
            Ok(session) => {
                let session = self.bind_route(id, entry.workflow, session)?;
                let opened = self.sessions.open(i, SessionRun {
                    session: Some(Box::new(session)),
                    record: SessionRecord {
                        session: id,
                        workflow: entry.workflow,
                        arrived: self.now,
                        finished: None,
                        failed: None,
                        failed_at: None,
                        score: None,
                        tools: SessionToolLog::default(),
                    },
                });
                if opened.is_err() {
                    return Err(SimError::Internal(format!("session {id} arrived out of order")));
                }
                self.first_opened.get_or_insert(self.now);
                self.plan(Event::SessionArrived { session: id, workflow: entry.workflow })?;
                let ready = self.sessions.get(i).and_then(|s| s.session.as_deref()).map(|s| s.ready()).unwrap_or_default();
                for a in ready {
                    self.on_ready(a)?;
                }
                self.report_near_ready(id)?;
                self.check_finished(id)?;
            }
            Err(e) => {
                self.start_failures.push((entry.workflow, self.now, format!("s{}: {e}", id.0)));
                self.done_sessions += 1;
                self.log("session_failed", TraceLine { session: Some(id.0), detail: Some(e.to_string()), ..blank() });
            }
        }
        Ok(())
    }

    /// A session of a routed workflow: the planner's router binds it to a route member by its
    /// first request; the session then runs the workflow bound to that member.
    fn bind_route(&mut self, id: SessionId, w: u32, session: Session) -> Result<Session, SimError> {
        let ctx = exec::routing::BindContext {
            deployment_of: &self.deployment_of,
            deployments: &self.deployments,
            config: &self.cfg.routing,
        };
        let (session, row) = exec::routing::bind_session(&mut self.planner, &ctx, &mut self.bound_specs, w, session, None, self.now)?;
        if let Some(row) = row {
            self.log("route", TraceLine { session: Some(id.0), detail: Some(format!("{} ({})", row.model, row.verifier)), ..blank() });
            self.routes.open(id, row);
            self.program_tasks.insert(id, exec::routing::first_request(&session));
        }
        Ok(session)
    }

    /// A routed session's verdict lands: the learner's update; the ledgers may admit waiting
    /// programs, so this tick plans once more (with the tick's other events, in [`Self::flush`]).
    fn on_verdict(&mut self, s: SessionId) -> Result<(), SimError> {
        let Some(metric) = self.verdict_scores.remove(&s) else { return Ok(()) };
        let Some(row) = self.routes.get(s) else { return Ok(()) };
        let spec = &self.cfg.workflows[row.workflow as usize];
        // The workflow's own verifier term when it declares one (an LLM judge), else its metric.
        let score = exec::routing::verifier_input(spec, metric, row.verifier_score);
        let success = exec::routing::verdict(spec, score, &row.feedback);
        let own = exec::routing::workflow_verifier(spec);
        let cost = row.cost;
        self.close_program(s);
        self.routes.close(s, Some(success), own);
        self.planner.program_verdict(s, success, cost, self.now)?;
        self.replan = true;
        Ok(())
    }

    /// Keep the record of routed program `s` as its row closes.
    fn close_program(&mut self, s: SessionId) {
        let Some(row) = self.routes.get(s) else { return };
        self.programs.push(exec::routing::ProgramRecord {
            session: s.0,
            workflow: row.workflow,
            task: self.program_tasks.remove(&s).unwrap_or_default(),
            model: row.model.clone(),
            cost: row.cost,
            verifier_score: row.verifier_score,
        });
    }

    fn session_workflow(&self, s: SessionId) -> Result<u32, SimError> {
        self.sessions
            .get(s.0 as usize)
            .map(|r| r.record.workflow)
            .ok_or_else(|| SimError::Internal(format!("unknown session {s}")))
    }

    fn is_live(&self, s: SessionId) -> bool {
        let Some(r) = self.sessions.get(s.0 as usize) else { return false };
        r.record.failed.is_none() && r.record.finished.is_none()
    }

    /// An activation became ready: run a tool, or prepare an LLM request and queue the unit.
    fn on_ready(&mut self, a: ActivationId) -> Result<(), SimError> {
        if !self.is_live(a.session) {
            return Ok(());
        }
        match self.prepare(a)? {
            Ready::Tool { call, node, workflow, node_index } => {
                let duration = modeled_duration_s(&call);
                let tool = call.tool.clone();
                self.tool_jobs.insert(a, (self.tools.submit(call), node.clone(), tool));
                self.counters.tool_calls += 1;
                self.log("tool_start", TraceLine {
                    session: Some(a.session.0),
                    activation: Some(a.index),
                    node: Some(node),
                    ..blank()
                });
                self.schedule(self.now + duration, SimEvent::ToolDone(a));
                self.plan(Event::ToolStarted { activation: a, predicted_s: duration, workflow, node: node_index })?;
                self.report_near_ready(a.session)
            }
            Ready::Llm { item, prepared, node } => {
                self.prefetch_tools(a, &prepared.output);
                self.prepared.insert(a, prepared);
                self.log("ready", TraceLine {
                    session: Some(a.session.0),
                    activation: Some(a.index),
                    node: Some(node),
                    ..blank()
                });
                self.plan(Event::UnitReady(item))
            }
            Ready::Fail(reason) => {
                self.fail_session(a.session, reason);
                Ok(())
            }
        }
    }

    /// Start, ahead of time, the tool calls that completing LLM unit `a` with its (already
    /// drawn) `output` would issue (see [`calls_after`]); the issued call later joins the
    /// prefetched run (see [`ToolPool::prefetch_chain`]).
    fn prefetch_tools(&self, a: ActivationId, output: &NodeOutput) {
        let Some(run) = self.sessions.get(a.session.0 as usize) else { return };
        if !self.has_tools.get(run.record.workflow as usize).copied().unwrap_or(false) {
            return;
        }
        let Some(session) = run.session.as_deref() else { return };
        for (call, followers) in calls_after(session, a.index, output) {
            self.tools.prefetch_chain(call, followers);
        }
    }

    /// Keep the lookahead stream [`TOOL_LOOKAHEAD_SESSIONS`] sessions past arrival `i`,
    /// prefetching, for each session it passes of a workflow that [`looks_ahead`], the tool
    /// calls that its first units' outputs make ready, with their followers. A session's first
    /// calls otherwise start only when its LLM unit is ready, which in wall time is a moment
    /// before the call is joined — too late to hide a candidate program that runs to its
    /// timeout. A prefetch decides nothing: the issued call joins the run, or runs its call
    /// itself, and the outcome is the call's (but see the tool's wall-time limit, README
    /// "Simulator scale").
    fn look_ahead(&mut self, i: usize) {
        let Some((mut stream, mut next)) = self.lookahead.take() else { return };
        while next <= i + TOOL_LOOKAHEAD_SESSIONS {
            let Some(entry) = stream.next() else { break };
            if self.looks_ahead.get(entry.workflow as usize).copied().unwrap_or(false) {
                self.prefetch_session(next, &entry);
            }
            next += 1;
        }
        self.lookahead = Some((stream, next));
    }

    /// Prefetch the first tool calls of session `i` (arriving as `entry`): its first units are
    /// prepared and completed on a session of its own that the run never sees, and the tool
    /// calls that become ready are queued behind every call of a session in flight.
    fn prefetch_session(&self, i: usize, entry: &TraceEntry) {
        let w = entry.workflow as usize;
        let (Some(spec), Some(input)) = (self.cfg.workflows.get(w), self.records.get(w).and_then(|r| r.get(entry.record)))
        else {
            return;
        };
        let Ok(session) = Session::new(SessionId(i as u32), Arc::clone(spec), input.clone()) else { return };
        let ctx = PrepareContext {
            seed: self.cfg.seed,
            deployments: &self.deployments,
            deployment_of: &self.deployment_of,
            node_info: &self.node_info,
        };
        let mut copy = session.clone();
        let mut outputs = Vec::new();
        for a in session.ready() {
            match exec::prepare(&ctx, &mut copy, entry.workflow, a, entry.at) {
                Ok(Ready::Llm { prepared, .. }) => outputs.push((a.index, prepared.output)),
                Ok(Ready::Tool { call, .. }) => self.tools.prefetch_ahead(call, followers_of(&session, a.index)),
                Ok(Ready::Fail(_)) | Err(_) => return,
            }
        }
        // Every first unit ends (in any order: a tool that waits for several, like a vote,
        // becomes ready with the last), then the calls it made ready are queued.
        let mut ready = Vec::new();
        for (index, output) in outputs {
            if copy.mark_running(index).is_err() {
                return;
            }
            match copy.complete(index, output) {
                Ok(r) => ready.extend(r),
                Err(_) => return,
            }
        }
        for r in ready {
            if let Some(call) = tool_call_of(&copy, r.index) {
                self.tools.prefetch_ahead(call, followers_of(&copy, r.index));
            }
        }
    }

    /// Render what a ready activation needs (shared with the live shell).
    fn prepare(&mut self, a: ActivationId) -> Result<Ready, SimError> {
        let ctx = PrepareContext {
            seed: self.cfg.seed,
            deployments: &self.deployments,
            deployment_of: &self.deployment_of,
            node_info: &self.node_info,
        };
        let Some((session, workflow)) = self
            .sessions
            .get_mut(a.session.0 as usize)
            .and_then(|r| r.session.as_deref_mut().map(|s| (s, r.record.workflow)))
        else {
            return Err(SimError::Internal(format!("unknown session of {a}")));
        };
        Ok(exec::prepare(&ctx, session, workflow, a, self.now)?)
    }

    fn on_tool_done(&mut self, a: ActivationId) -> Result<(), SimError> {
        let Some((job, node, tool)) = self.tool_jobs.remove(&a) else {
            return Err(SimError::Internal(format!("no tool job for {a}")));
        };
        let outcome = job.join();
        self.plan(Event::ToolFinished { activation: a })?;
        if !self.is_live(a.session) {
            return Ok(());
        }
        match outcome {
            Ok(o) => {
                if let Some(note) = exec::sandbox_note(&o)
                    && !self.notes.contains(&note)
                {
                    self.notes.push(note);
                }
                self.log("tool_done", TraceLine {
                    session: Some(a.session.0),
                    activation: Some(a.index),
                    node: Some(node.clone()),
                    detail: trace_detail(&o),
                    ..blank()
                });
                if let Some(run) = self.sessions.get_mut(a.session.0 as usize) {
                    run.record.tools.record(a.session.0, &node, &tool, &o);
                }
                self.record_call(a, None, 0, 0);
                self.hand_off(a, exec::tool_output(o))
            }
            Err(e) => {
                self.fail_session(a.session, format!("tool: {e}"));
                Ok(())
            }
        }
    }

    /// Push a segment onto `device`'s timeline. Segments are pushed in time order, so the
    /// device's planned decode runs are first cut back to now.
    fn push_segment(&mut self, device: DeviceId, deployment: DeploymentId, start: f64, end: f64, kind: SegmentKind) {
        self.settle_device(device);
        self.timelines[device.0 as usize].segments.push(Segment { start, end, kind, deployment: deployment.0 });
    }

    /// Close a replica's open idle-resident or sleep interval at now (it stops being resident,
    /// or is woken or unloaded).
    fn close_intervals(&mut self, r: &mut Replica) {
        let now = self.now;
        if let Some(since) = r.resident_since.take() {
            self.push_segment(r.device, r.deployment, since, now, SegmentKind::Resident);
        }
        if let Some(since) = r.asleep_since.take() {
            self.push_segment(r.device, r.deployment, since, now, SegmentKind::Asleep);
        }
    }

    fn on_sleep_done(&mut self, replica: ReplicaId) -> Result<(), SimError> {
        let now = self.now;
        let Some(r) = self.replicas.get_mut(&replica) else { return Ok(()) };
        // Already woken or unloaded (the wake completed the sleep first): nothing to report.
        if !matches!(r.engine.state(), ReplicaState::Sleeping { .. }) {
            return Ok(());
        }
        r.engine.finish_transition(now);
        self.log("asleep", TraceLine { replica: Some(replica.0), ..blank() });
        self.plan(Event::ReplicaAsleep { replica })
    }

    fn on_unload_done(&mut self, replica: ReplicaId) -> Result<(), SimError> {
        let now = self.now;
        let Some(mut r) = self.tearing_down.remove(&replica) else { return Ok(()) };
        r.engine.finish_transition(now);
        self.log("unloaded", TraceLine { replica: Some(replica.0), device: Some(r.device.0), ..blank() });
        self.plan(Event::ReplicaUnloaded { replica })
    }

    fn on_load_done(&mut self, replica: ReplicaId) -> Result<(), SimError> {
        let now = self.now;
        let Some(r) = self.replicas.get_mut(&replica) else { return Ok(()) };
        r.engine.finish_transition(now);
        r.resident_since = Some(now);
        self.log("loaded", TraceLine { replica: Some(replica.0), ..blank() });
        self.plan(Event::ReplicaLoaded { replica })
    }

    fn on_iteration_end(&mut self, replica: ReplicaId, token: u64) -> Result<(), SimError> {
        let now = self.now;
        let events = match self.replicas.get_mut(&replica) {
            Some(r) if r.token == token && r.iterating => {
                r.iterating = false;
                if std::mem::take(&mut r.in_run) {
                    r.run_steps = (r.run_steps * 2).min(MAX_RUN_STEPS);
                }
                // DISC's usage observation (a routed model's replica, at each end of an
                // iteration or planned run, weighted by the steps it covered): the KV the engine
                // holds against its running requests' tokens teaches the ledger the
                // per-request allowance δ̂ (paper 002 Appendix B).
                if self.planner.is_routed(r.deployment) {
                    let t = r.engine.telemetry();
                    let used = u64::from(t.kv_blocks_in_use) * u64::from(r.engine.config().block_size);
                    let context = r.engine.running_context_tokens();
                    let steps = u32::try_from(t.iterations.saturating_sub(r.observed_iterations)).unwrap_or(u32::MAX);
                    r.observed_iterations = t.iterations;
                    self.planner.observe_backend_usage(r.deployment, used, context, t.running as u32, steps);
                }
                r.engine.finish_iteration(now)
            }
            _ => return Ok(()),
        };
        for e in events {
            match e {
                EngineEvent::Finished { id, prompt_tokens, cached_prompt_tokens, output_tokens, .. } => {
                    let Some(f) = self.in_flight.remove(&id) else { continue };
                    if let Some(d) = self.deployments.get(f.deployment.0 as usize) {
                        self.routes.charge(f.activation.session, &d.model, prompt_tokens, cached_prompt_tokens, output_tokens);
                    }
                    self.counters.llm_call_finished(
                        &mut self.work,
                        f.deployment,
                        f.workflow,
                        prompt_tokens,
                        cached_prompt_tokens,
                        output_tokens,
                    );
                    let detail = self.opts.keep_trace.then(|| {
                        finish_detail(output_tokens, prompt_tokens, cached_prompt_tokens)
                    });
                    self.log("finish", TraceLine {
                        session: Some(f.activation.session.0),
                        activation: Some(f.activation.index),
                        replica: Some(replica.0),
                        detail,
                        ..blank()
                    });
                    self.plan(Event::UnitFinished {
                        activation: f.activation,
                        replica,
                        output_tokens,
                    })?;
                    if self.is_live(f.activation.session) {
                        self.record_call(f.activation, Some(f.deployment), prompt_tokens, output_tokens);
                        self.hand_off(f.activation, f.output)?;
                    }
                }
                EngineEvent::Preempted { .. } => self.counters.preemptions += 1,
                EngineEvent::FirstToken { id, .. } => {
                    if let Some(f) = self.in_flight.get(&id) {
                        let (session, activation) = (f.activation.session.0, f.activation.index);
                        self.log("first_token", TraceLine {
                            session: Some(session),
                            activation: Some(activation),
                            replica: Some(replica.0),
                            ..blank()
                        });
                    }
                }
            }
        }
        self.kick(replica);
        Ok(())
    }

    fn record_call(&mut self, a: ActivationId, deployment: Option<DeploymentId>, prompt: u32, output: u32) {
        if !self.opts.keep_calls {
            return;
        }
        let Some(run) = self.sessions.get(a.session.0 as usize) else { return };
        let Some(session) = run.session.as_deref() else { return };
        let model = deployment
            .and_then(|d| self.deployments.get(d.0 as usize))
            .map(|d| (d.model.clone(), d.dtype));
        self.calls.extend(CallRecord::of(session, run.record.workflow, a, model, prompt, output, self.now));
    }

    /// A finished call's output reaches its session after the framework's handoff time (the
    /// planner already knows the call finished: its replica is free in between).
    fn hand_off(&mut self, a: ActivationId, output: NodeOutput) -> Result<(), SimError> {
        if self.handoff_s > 0.0 {
            self.handoffs.insert(a, output);
            let at = self.now + self.handoff_s;
            self.schedule(at, SimEvent::Handoff(a));
            Ok(())
        } else {
            self.complete(a, output)
        }
    }

    fn complete(&mut self, a: ActivationId, output: NodeOutput) -> Result<(), SimError> {
        let Some(session) = self.sessions.get_mut(a.session.0 as usize).and_then(|r| r.session.as_deref_mut()) else {
            return Ok(());
        };
        let ready = match session.complete(a.index, output) {
            Ok(r) => r,
            Err(e) => {
                self.fail_session(a.session, e.to_string());
                return Ok(());
            }
        };
        for r in ready {
            self.on_ready(r)?;
        }
        self.report_near_ready(a.session)?;
        self.check_finished(a.session)
    }

    fn check_finished(&mut self, s: SessionId) -> Result<(), SimError> {
        let Some(run) = self.sessions.get_mut(s.0 as usize) else { return Ok(()) };
        let Some(session) = run.session.as_deref() else { return Ok(()) };
        if run.record.finished.is_some() || run.record.failed.is_some() || !session.is_finished() {
            return Ok(());
        }
        run.record.finished = Some(self.now);
        run.record.score = exec::session_score(session);
        if self.routes.contains(s) {
            self.routes.set_verifier_score(s, exec::verifier_score(session));
            self.verdict_scores.insert(s, run.record.score);
        }
        if let Some(run) = self.sessions.close(s.0 as usize) {
            self.count_ended(run.record);
        }
        self.forget_near_sent(s);
        self.done_sessions += 1;
        self.log("session_done", TraceLine { session: Some(s.0), ..blank() });
        if self.routes.contains(s) {
            self.schedule(self.now + VERIFIER_S, SimEvent::Verdict(s));
        }
        self.plan(Event::SessionEnded { session: s })
    }

    fn fail_session(&mut self, s: SessionId, reason: String) {
        let Some(run) = self.sessions.get_mut(s.0 as usize) else { return };
        if run.record.failed.is_some() || run.record.finished.is_some() {
            return;
        }
        run.record.failed = Some(reason.clone());
        run.record.failed_at = Some(self.now);
        if let Some(run) = self.sessions.close(s.0 as usize) {
            self.count_ended(run.record);
        }
        self.forget_near_sent(s);
        self.done_sessions += 1;
        self.log("session_failed", TraceLine { session: Some(s.0), detail: Some(reason), ..blank() });
        // Drop its prepared requests and let the planner forget its queued units and holds.
        self.prepared.retain(|a, _| a.session != s);
        // A routed program that failed is never verified: it releases what it holds (before its
        // end reaches the core, so that its ledger learns nothing from it).
        if let Some(row) = self.routes.get(s) {
            let own = exec::routing::workflow_verifier(&self.cfg.workflows[row.workflow as usize]);
            self.close_program(s);
            self.routes.close(s, None, own);
            if let Err(e) = self.planner.program_abandoned(s, self.now) {
                self.notes.push(format!("router: session {s}: {e}"));
            }
        }
        if let Err(e) = self.plan(Event::SessionEnded { session: s }) {
            self.notes.push(format!("planner rejected the end of session {s}: {e}"));
        }
    }

    /// Count an ended session for the report (and keep its record if asked to).
    fn count_ended(&mut self, record: SessionRecord) {
        self.tally.add(&record);
        if self.opts.keep_sessions {
            self.kept_sessions.push(record);
        }
    }

    /// Forget which units of an ended session were reported near-ready (none will be again).
    fn forget_near_sent(&mut self, s: SessionId) {
        self.outlook_sent.remove(&s);
        let range = ActivationId { session: s, index: 0 }..=ActivationId { session: s, index: u32::MAX };
        let sent: Vec<ActivationId> = self.near_sent.range(range).copied().collect();
        for a in sent {
            self.near_sent.remove(&a);
        }
    }

    /// Build the report through the same function as the live shell ([`exec::build_report`]).
    fn finish(mut self) -> SimOutput {
        let cfg = self.cfg;
        let mut sessions = std::mem::take(&mut self.kept_sessions);
        sessions.sort_by_key(|r| r.session);
        // Replicas still resident at the end (in replica order): the report closes their
        // intervals at the end of its window.
        let open_resident: Vec<(u32, DeploymentId, f64)> = self
            .replicas
            .values()
            .filter_map(|r| r.resident_since.map(|since| (r.device.0, r.deployment, since)))
            .collect();
        // Sleepers at the end: their marks run to the last event (the timeline clips them).
        let asleep: Vec<(DeviceId, DeploymentId, f64)> =
            self.replicas.values().filter_map(|r| r.asleep_since.map(|since| (r.device, r.deployment, since))).collect();
        for (device, deployment, since) in asleep {
            self.push_segment(device, deployment, since, self.now, SegmentKind::Asleep);
        }
        let state = self.planner.state();
        let (report, window) = exec::build_report(ReportInput {
            workflows: &cfg.workflows,
            policy: self.planner.policy_name(),
            seed: cfg.seed,
            noise_seed: cfg.noise_seed,
            arrival: cfg.arrival.to_string(),
            pool: &cfg.pool.name,
            gpus: cfg.pool.devices.len(),
            sessions: &self.tally,
            start_failures: &self.start_failures,
            timelines: &mut self.timelines,
            open_resident: &open_resident,
            work: &self.work,
            counters: self.counters,
            loads: state.loads(),
            evictions: state.evictions(),
            sleeps: state.sleeps(),
            wakes: state.wakes(),
            prefetch: state.prefetch_checks(),
            fusion: state.fusion_checks(),
            tao_admission: state.tao_checks(),
            interrupted: self.interrupted,
        });
        let mut report = report;
        report.routing = self.routes.report(&cfg.workflows);
        let allowances = (0..self.deployments.len() as u32)
            .map(DeploymentId)
            .filter_map(|d| Some((d, self.planner.backend_allowance(d)?)))
            .collect();
        SimOutput {
            report,
            trace: std::mem::take(&mut self.trace),
            timelines: std::mem::take(&mut self.timelines),
            window,
            notes: std::mem::take(&mut self.notes),
            calls: std::mem::take(&mut self.calls),
            planner_ticks: std::mem::take(&mut self.planner_ticks),
            sessions,
            programs: std::mem::take(&mut self.programs),
            allowances,
        }
    }
}

fn blank() -> TraceLine {
    TraceLine {
        t: 0.0,
        event: "",
        session: None,
        activation: None,
        node: None,
        replica: None,
        device: None,
        detail: None,
    }
}

/// How many sessions ahead of the arrivals the simulator prefetches first tool calls
/// ([`Sim::look_ahead`]): at the ~20 sessions per second of wall time that the three pipelines
/// run at on 2 cores, about 100 s — room for workers to run candidate programs to their
/// timeout before the sessions need their verdicts.
const TOOL_LOOKAHEAD_SESSIONS: usize = 2048;

/// Whether the lookahead prefetches `spec`'s first tool calls: it has a tool that runs
/// untrusted code in a sandbox (an in-process vote costs less than preparing the units before
/// it) and no route (a routed session's model is bound at arrival, so calls rendered before
/// it would be for another model's answer).
fn looks_ahead(spec: &crate::workflow::WorkflowSpec) -> bool {
    spec.route().is_none()
        && spec.nodes.iter().any(|n| matches!(&n.kind, NodeKind::Tool(t) if t.tool != switchyard_tools::majority_vote::NAME))
}

/// Most activations a session may have for the simulator to speculate on it: each speculation
/// completes a unit on a copy of the session, which costs its whole history, so past this a
/// long session (a loop of thousands of rounds) issues its calls when they are due instead of
/// copying itself at every unit. Prefetching decides nothing (see [`ToolPool::prefetch_chain`]),
/// so the bound changes no result; every shipped workflow stays far below it.
const MAX_SPECULATED_ACTIVATIONS: usize = 256;

/// The tool calls that completing LLM activation `index` of `session` with `output` would
/// issue, rendered on a copy of the session (nothing here changes the run), each with the
/// calls it would issue in turn when it ends (a final check after a test, say: one step of
/// speculation, see [`followers_of`]). Nothing past [`MAX_SPECULATED_ACTIVATIONS`].
fn calls_after(session: &Session, index: u32, output: &NodeOutput) -> Vec<(ToolCall, Vec<Follower>)> {
    if session.activations().len() > MAX_SPECULATED_ACTIVATIONS {
        return Vec::new();
    }
    let mut copy = session.clone();
    if copy.mark_running(index).is_err() {
        return Vec::new();
    }
    let Ok(ready) = copy.complete(index, output.clone()) else { return Vec::new() };
    ready.iter().filter_map(|r| Some((tool_call_of(&copy, r.index)?, followers_of(&copy, r.index)))).collect()
}

/// The rendered call of tool activation `index`, `None` for an LLM unit or inputs that do not
/// render.
fn tool_call_of(session: &Session, index: u32) -> Option<ToolCall> {
    let NodeKind::Tool(tool) = &session.node_of(index)?.kind else { return None };
    let inputs = session.render_tool_inputs(index).ok()?;
    Some(ToolCall { tool: tool.tool.clone(), inputs, timeout_s: tool.timeout_s })
}

/// The tool calls that ready tool activation `index` would issue when it ends. Its outcome is
/// not known yet, so they are taken for every verdict the workflow's branches tell apart —
/// each verdict a condition on the tool's node names, and one that none names — each under
/// the verdict that starts it, and only where their inputs do not depend on the tool's own
/// output (rendered after two different stand-in texts, and for the unnamed branch two
/// different unnamed verdicts, they must agree): a prefetched call is one an issued call can
/// join. Nothing past [`MAX_SPECULATED_ACTIVATIONS`].
fn followers_of(session: &Session, index: u32) -> Vec<Follower> {
    if session.activations().len() > MAX_SPECULATED_ACTIVATIONS {
        return Vec::new();
    }
    let Some(node) = session.activation(index).map(|act| act.node) else { return Vec::new() };
    let spec = session.spec();
    // Only a tool that waits for this one can follow it: otherwise nothing to speculate on
    // (and no session copies to make — an agent's long conversation, for one).
    if !spec.nodes.iter().any(|n| matches!(n.kind, NodeKind::Tool(_)) && n.after.contains(&node)) {
        return Vec::new();
    }
    let mut named: Vec<String> = spec
        .nodes
        .iter()
        .filter_map(|n| n.when.as_ref())
        .chain(spec.loops.iter().map(|l| &l.continue_when))
        .filter(|c| c.node == node)
        .flat_map(|c| c.verdicts.iter().cloned())
        .collect();
    named.sort();
    named.dedup();
    let branches: Vec<(Option<String>, VerdictMatch)> = named
        .iter()
        .map(|v| (Some(v.clone()), VerdictMatch::Is(v.clone())))
        .chain(std::iter::once((None, VerdictMatch::NoneOf(named.clone()))))
        .collect();
    let mut followers = Vec::new();
    for (verdict, when) in branches {
        let ended = |text: &str, verdict: Option<String>| {
            let mut copy = session.clone();
            copy.mark_running(index).ok()?;
            let output = NodeOutput { text: text.to_string(), verdict, ..NodeOutput::default() };
            let ready = copy.complete(index, output).ok()?;
            Some((copy, ready))
        };
        // The unnamed branch is taken by any verdict no condition names: the second stand-in
        // has another one, so a follower that reads the verdict is not taken for a sure call.
        let other_verdict = verdict.clone().or_else(|| Some("\u{0}another verdict no condition names".into()));
        let (Some((one, ready)), Some((other, _))) =
            (ended("speculated outcome A", verdict.clone()), ended("speculated outcome B", other_verdict))
        else {
            continue;
        };
        for r in ready {
            if let (Some(call), Some(check)) = (tool_call_of(&one, r.index), tool_call_of(&other, r.index))
                && call == check
            {
                followers.push(Follower { when: when.clone(), call });
            }
        }
    }
    followers
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::exec::{Arrival, PoolSpec};
    use crate::planner::JointOptions;
    use crate::workflow::load_workflow;

    fn gsm8k(sessions: usize, arrival: Arrival) -> RunConfig {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows");
        RunConfig {
            workflows: vec![Arc::new(load_workflow(&root.join("gsm8k.yaml")).expect("bundled workflow"))],
            sessions,
            arrival,
            seed: 1,
            noise_seed: 0,
            pool: PoolSpec::load(&root.join("pools/small.yaml")).expect("bundled pool"),
            policy: "joint".into(),
            options: JointOptions::default(),
            predictor: "oracle".into(),
            tool_workers: 1,
            max_num_seqs: 256,
            substrate: Default::default(),
            session_counts: Vec::new(),
            workflow_arrivals: Vec::new(),
            handoff_s: crate::exec::FRAMEWORK_HANDOFF_S,
            routing: Default::default(),
        }
    }

    #[test]
    fn a_units_prefetch_carries_the_tool_that_follows_its_tool_under_the_verdict_that_starts_it() {
        // MBPP: generate → test → (fail: the repair loop; otherwise validate). Completing
        // `generate` readies `test`; its follower is `validate`, whose inputs (the code and every
        // assert) do not depend on the test's outcome, for the branch where the test does not
        // fail — and nothing for the failing branch, which next runs an LLM unit.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows");
        let spec = Arc::new(load_workflow(&root.join("mbpp.yaml")).expect("bundled workflow"));
        let record = spec.load_records().expect("bundled dataset")[0].clone();
        let session = Session::new(SessionId(0), Arc::clone(&spec), record.clone()).expect("session");
        let code = "def f(x):\n    return x\n";
        let output = NodeOutput { text: format!("```python\n{code}```"), ..NodeOutput::default() };
        let calls = calls_after(&session, 0, &output);
        let tests = |c: &ToolCall| c.inputs.get("tests").and_then(|t| t.as_array()).map_or(0, Vec::len);
        let all = record.get("test_list").and_then(|t| t.as_array()).map_or(0, Vec::len);
        assert!(all > 1);
        let [(test, followers)] = calls.as_slice() else { panic!("one call: {calls:?}") };
        assert_eq!((test.tool.as_str(), tests(test)), ("python_tests", 1), "the visible test");
        let [validate] = followers.as_slice() else { panic!("one follower: {followers:?}") };
        assert_eq!(validate.when, VerdictMatch::NoneOf(vec!["fail".into()]), "any verdict but the repair loop's");
        assert_eq!(tests(&validate.call), all, "validate runs every assert");
        assert_eq!(validate.call.inputs.get("code"), test.inputs.get("code"));
        // The follower is the call the run would issue: completing the test with a pass makes
        // validate ready with exactly the speculated inputs.
        let mut run = session.clone();
        run.mark_running(0).expect("running");
        let ready = run.complete(0, output).expect("completed");
        run.mark_running(ready[0].index).expect("running");
        let pass = NodeOutput { text: "pass".into(), verdict: Some("pass".into()), ..NodeOutput::default() };
        let next = run.complete(ready[0].index, pass).expect("completed");
        assert_eq!(next.iter().filter_map(|r| tool_call_of(&run, r.index)).collect::<Vec<_>>(), vec![validate.call.clone()]);
    }

    #[test]
    fn a_baselines_scale_out_acts_when_the_upscale_delay_runs_out_not_at_the_next_event() {
        // A burst too big for one replica per model, on a pool with devices to spare: over
        // target from the first planning pass (t = 0), so the substrate's reactive scale-out
        // adds a replica at exactly 30 s, though no simulator event need fall there.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows");
        let pool = PoolSpec::load(&root.join("pools/paper.yaml")).expect("bundled pool");
        let cfg = RunConfig { policy: "parrot".into(), pool, ..gsm8k(40, Arrival::Burst) };
        let out = simulate(&cfg, &mut |_, _| {}).expect("simulation");
        let loads: Vec<f64> = out.trace.iter().filter(|l| l.event == "load").map(|l| l.t).collect();
        let delay = crate::planner::substrate::RAY_SERVE_UPSCALE_DELAY_S;
        assert!(loads.contains(&delay), "a scale-out at {delay} s: loads at {loads:?}");
        assert!(loads.iter().all(|&t| t == 0.0 || t >= delay), "nothing between: {loads:?}");
    }

    #[test]
    fn an_interrupt_fails_the_open_and_the_unarrived_sessions_and_marks_the_report() {
        // Poisson arrivals over ~10 virtual seconds; stop at the first tick past 2 s.
        let cfg = gsm8k(10, Arrival::Poisson(1.0));
        let mut ticks = Vec::new();
        let out = simulate_with(&cfg, &mut |p: &SimProgress| {
            ticks.push(*p);
            if p.now_s > 2.0 { Flow::Interrupt } else { Flow::Continue }
        })
        .expect("simulation");
        let r = &out.report;
        assert!(r.interrupted);
        assert_eq!(r.sessions_total, 10);
        assert_eq!(r.sessions_completed + r.sessions_failed, 10);
        assert!(r.failures.iter().any(|f| f.ends_with(": interrupted")), "{:?}", r.failures);
        assert!(r.failures.iter().any(|f| f.ends_with(": interrupted before the session arrived")), "{:?}", r.failures);
        // Progress moved forward in events and virtual time.
        assert!(ticks.windows(2).all(|w| w[0].events <= w[1].events && w[0].now_s <= w[1].now_s));
        let last = ticks.last().copied().expect("a tick");
        assert_eq!(last.sessions_total, 10);
        // The window ends at the interrupt, not at 0: the pool's time up to there is counted.
        assert!((r.makespan_s - round3(last.now_s - out.window.0)).abs() < 1e-9, "{} vs {:?}", r.makespan_s, out.window);
        assert!(r.gpu_seconds_total.total() > 0.0);
    }

    #[test]
    fn successors_become_ready_one_handoff_after_their_predecessor_finishes() {
        // The refine step of a GSM8K session follows the vote tool: its `ready` line comes
        // exactly one handoff after the vote's `tool_done`.
        let ready_gap = |handoff_s: f64| {
            let cfg = RunConfig { handoff_s, ..gsm8k(1, Arrival::Burst) };
            let out = simulate(&cfg, &mut |_, _| {}).expect("simulation");
            let vote_done = out.trace.iter().find(|l| l.event == "tool_done").map(|l| l.t).expect("the vote ran");
            let refine_ready = out.trace.iter().filter(|l| l.event == "ready" && l.t >= vote_done).map(|l| l.t).next().expect("refine became ready");
            (refine_ready - vote_done, out.report.makespan_s)
        };
        let (gap0, makespan0) = ready_gap(0.0);
        let (gap, makespan) = ready_gap(0.5);
        assert!(gap0.abs() < 1e-9, "{gap0}");
        assert!((gap - 0.5).abs() < 1e-6, "{gap}");
        assert!(makespan > makespan0, "{makespan} vs {makespan0}");
    }

    #[test]
    fn a_finish_line_says_what_its_call_generated_and_read() {
        // The trace alone tells a long generation from a long wait: each `finish` line carries
        // the tokens of the call record of the same activation.
        let out = simulate(&gsm8k(3, Arrival::Burst), &mut |_, _| {}).expect("simulation");
        let finishes: Vec<&TraceLine> = out.trace.iter().filter(|l| l.event == "finish").collect();
        let llm_calls = out.calls.iter().filter(|c| c.model.is_some()).count();
        assert_eq!(finishes.len(), llm_calls);
        for l in finishes {
            let c = out
                .calls
                .iter()
                .find(|c| Some(c.session) == l.session && Some(c.activation) == l.activation)
                .expect("a call record per finish line");
            let detail = l.detail.as_deref().expect("a detail");
            let want = format!("{} tokens; prompt {} (", c.output_tokens, c.prompt_tokens);
            assert!(detail.starts_with(&want) && detail.ends_with(" cached)"), "{detail} vs {c:?}");
        }
    }

    #[test]
    fn the_report_does_not_depend_on_what_the_run_keeps() {
        let cfg = gsm8k(6, Arrival::Poisson(2.0));
        let full = simulate(&cfg, &mut |_, _| {}).expect("simulation");
        let opts = SimOptions { keep_trace: false, keep_calls: false, keep_sessions: false, timeline_segments: None, record_planner: false };
        let lean = simulate_opts(&cfg, opts, &mut |_| Flow::Continue).expect("simulation");
        let json = |r: &RunReport| serde_json::to_string(r).expect("report serialises");
        assert_eq!(json(&full.report), json(&lean.report));
        assert!(!full.trace.is_empty() && !full.calls.is_empty());
        assert!(lean.trace.is_empty() && lean.calls.is_empty() && lean.sessions.is_empty());
        // The kept records are every session's, in session order.
        let ids: Vec<u32> = full.sessions.iter().map(|r| r.session.0).collect();
        assert_eq!(ids, (0..full.report.sessions_total as u32).collect::<Vec<_>>());
        // Back-to-back iterations share one Generating segment: no segment starts where the
        // previous one of the same replica's kind and deployment ended.
        for tl in &lean.timelines {
            for w in tl.segments.windows(2) {
                let joined = w[0].kind == SegmentKind::Generating
                    && w[1].kind == SegmentKind::Generating
                    && w[0].deployment == w[1].deployment
                    && w[0].end == w[1].start;
                assert!(!joined, "{:?}", w);
            }
        }
    }

    #[test]
    fn a_folded_timeline_gives_the_report_of_the_whole_one() {
        let cfg = gsm8k(20, Arrival::Poisson(0.02));
        let whole = simulate(&cfg, &mut |_, _| {}).expect("simulation");
        let most = whole.timelines.iter().map(|t| t.segments.len()).max().unwrap_or(0);
        assert!(most > 12, "the run must have more segments on a device than the fold keeps: {most}");
        // Down to one kept segment: events after the last session ended (loads, unloads) must
        // not fold past its end and stretch the window.
        for kept in [1, 3] {
            let opts =
                SimOptions { keep_trace: false, keep_calls: false, keep_sessions: false, timeline_segments: Some(kept), record_planner: false };
            let folded = simulate_opts(&cfg, opts, &mut |_| Flow::Continue).expect("simulation");
            assert!(folded.timelines.iter().any(|t| t.folded.is_some()), "something was folded");
            for t in &folded.timelines {
                // At most twice the kept count after a tick, plus what the end of the run adds.
                assert!(t.segments.len() <= 2 * kept + 6, "{} segments kept", t.segments.len());
            }
            // The same report, up to the float rounding of the partition's sums.
            let (a, b) = (&whole.report, &folded.report);
            assert_eq!((a.makespan_s, a.sessions_completed, &a.latency_s), (b.makespan_s, b.sessions_completed, &b.latency_s));
            let close = |x: f64, y: f64| (x - y).abs() <= 2e-3;
            for (x, y) in [(&a.gpu_seconds_total, &b.gpu_seconds_total), (&a.gpu_seconds_per_session, &b.gpu_seconds_per_session)] {
                assert!(close(x.generation, y.generation) && close(x.idle_resident, y.idle_resident), "kept {kept}: {x:?} vs {y:?}");
                assert!(close(x.loading, y.loading) && close(x.other, y.other), "kept {kept}: {x:?} vs {y:?}");
            }
            assert!(a.gpu_seconds_total.total() > 0.0);
        }
    }

    #[test]
    fn without_an_interrupt_the_report_is_not_marked() {
        let out = simulate(&gsm8k(2, Arrival::Burst), &mut |_, _| {}).expect("simulation");
        assert!(!out.report.interrupted);
        assert_eq!(out.report.sessions_completed, 2);
    }
}
