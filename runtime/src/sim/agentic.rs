//! The simulator's agent-session loop (paper 000): closed-loop workers run the sessions of an
//! [`AgentTrace`] on a pool of emulated replicas, in virtual time; a scheduler of
//! [`crate::planner::admission`] decides where and when each model turn runs. Tools are
//! modeled (their trace durations): nothing runs.
//!
//! The loop is the shell: it keeps the sessions (their scheduling state and the views TAO reads
//! of it are `exec::agent_session`'s, shared with the live coordinator), the replicas' engines
//! and the event queue, it
//! observes (cached tokens as the engine reports them, tool durations, each replica's admitted
//! tokens) and it applies what the scheduler decides. TAO's plans are solved on a frozen
//! snapshot and applied a modeled solve latency later, after revalidation against the live
//! state (Appendix B.2): a plan whose selected session moved on is discarded, otherwise the
//! longest prefix that still fits is applied.
//!
//! Every session runs to completion exactly once. Same trace, pool, scheduler and seed → the
//! same report, to the bit. Must not depend on the live shell.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use serde::Serialize;
use switchyard_emulator::{EmulatedReplica, EngineEvent, EngineRequest, ServingConfig};
use switchyard_predictor::spec::{self, Dtype};
use thiserror::Error;

use crate::agentic::{AgentTrace, mix};
use crate::planner::admission::{
    CacheAware, CacheObservation, DynamoRouter, PoolSession, ReplicaLoad, RoundRobin, RouteRequest, SchedulerKind,
    THUNDER_PERIOD_S, TaoOptions, ThunderAgent, admission_weight, tao_plan,
};
use crate::exec::agent_session::{self, AgentPhase, AgentSession, without_holds};
use crate::planner::tao::{self, Assignment, ToolCall, ToolHistory};
use crate::sim::agent_routing::{Feedback, ProgramRouting, ProgramRoutingError, RoutedRunReport, RoutingLayer};

/// Engine block size (vLLM's default).
const BLOCK: u32 = 16;
/// Decode steps a replica plans ahead at once (the emulator's closed-form runs).
const RUN_STEPS: usize = 64;
/// Seconds between TAO's periodic re-plans (its scheduling period; readiness looks one
/// horizon ahead of it).
const TAO_PERIOD_S: f64 = 1.0;
/// Ticks between two samples of the running-request series.
const SERIES_STEP_TICKS: u64 = 5;
/// Seconds between two samples of the running-request series.
pub const SERIES_STEP_S: f64 = TAO_PERIOD_S * SERIES_STEP_TICKS as f64;

#[derive(Debug, Error)]
pub enum AgentSimError {
    #[error("replica {index}: {reason}")]
    Replica { index: usize, reason: String },
    #[error("the pool has no replica")]
    EmptyPool,
    #[error("the trace: {0}")]
    Trace(#[from] crate::agentic::TraceError),
    #[error("session {session}: turn {turn} needs {tokens} tokens, more than max_model_len {max_model_len}")]
    TooLong { session: String, turn: usize, tokens: u32, max_model_len: u32 },
    #[error("TAO: {0}")]
    Tao(#[from] tao::TaoError),
    #[error("a run needs at least one worker")]
    NoWorkers,
    #[error("the run stalled at {at:.3} s with {open} sessions open")]
    Stalled { at: f64, open: usize },
    #[error("routed programs: {0}")]
    Routing(#[from] ProgramRoutingError),
    #[error("routed programs run under the request-level schedulers and ThunderAgent, not TAO")]
    RoutedTao,
    #[error("programs by model: {0}")]
    ProgramsByModel(String),
}

/// One replica of the pool: a model on `tensor_parallel` GPUs of one kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentReplicaSpec {
    pub model: String,
    pub device: String,
    pub tensor_parallel: u32,
    pub max_model_len: u32,
    /// Weights' (and, unless `kv_cache_dtype` says otherwise, KV cache's) format.
    pub dtype: Dtype,
    /// The KV cache's format when it differs from the weights' (vLLM's `--kv-cache-dtype`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_dtype: Option<Dtype>,
    /// KV token-equivalents each running request of a dense model holds beyond its tokens (a
    /// counterfactual hybrid-attention state, `EmulatedReplica::set_request_state_tokens`);
    /// 0: none. A hybrid model (Qwen3.5) holds its own state, from its config.
    pub request_state_tokens: u32,
}

/// A pool of identical or mixed replicas.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentPoolSpec {
    pub name: String,
    pub replicas: Vec<AgentReplicaSpec>,
}

/// How to run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentRunConfig {
    pub workers: usize,
    pub scheduler: SchedulerKind,
    pub tao: TaoOptions,
    pub noise_seed: u64,
    /// Modeled time from a TAO snapshot to its plan's application (the asynchronous solve).
    pub plan_latency_s: f64,
    /// ThunderAgent's proxy with its 2^−t decay of acting programs' tokens at resume (its
    /// `--use-acting-token-decay`; paper 002 ran it on, the proxy ships it off).
    pub thunder_acting_decay: bool,
}

/// TAO's planner outcomes (paper 000 Table 9).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PlannerStats {
    pub submissions: u64,
    pub applications: u64,
    pub nonempty_applications: u64,
    pub fallbacks: u64,
    pub discarded: u64,
    pub partial: u64,
    pub states_mean: f64,
    pub states_max: u64,
    pub candidates_mean: f64,
    pub plan_age_mean_s: f64,
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentRunReport {
    pub scheduler: String,
    pub workers: usize,
    pub sessions: usize,
    pub requests: u64,
    pub makespan_s: f64,
    /// Mean session latency (first request ready → last token), tools included.
    pub mean_latency_s: f64,
    /// Mean time from a request being ready (session start or tool return) to its first token.
    pub mean_ttft_s: f64,
    pub p90_ttft_s: f64,
    /// Generated tokens per second of makespan.
    pub decode_tps: f64,
    /// Prompt tokens served from the prefix cache over all prompt tokens.
    pub cache_hit_rate: f64,
    /// Mean time from a tool's return to its session's next first token.
    pub tool_end_to_first_token_s: f64,
    /// Mean time from a request's end to its session's next dispatch (the tool call included).
    pub pause_wait_s: f64,
    pub preemptions: u64,
    /// Readiness prediction: mean absolute error of the predicted tool duration at the call's
    /// start (Eq. 8 history, hints first), and the share within 0.5 s; `None` (JSON `null`)
    /// when no tool call was scored.
    pub readiness_mae_s: Option<f64>,
    pub readiness_within_half_s: Option<f64>,
    pub planner: PlannerStats,
    /// Requests running or queued in the engines, sampled every [`SERIES_STEP_S`] seconds.
    pub running_series: Vec<u32>,
}

/// What the simulator keeps of a session besides its scheduling state.
#[derive(Debug, Clone, Default)]
struct SimSession {
    /// The largest context any of its calls reached (prompt, reasoning and answer).
    peak: u64,
}

type SessionState = AgentSession<SimSession>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    IterationEnd { replica: usize, token: u64 },
    ToolReturn { session: usize, signature: u64 },
    /// A routed program's verifier returned.
    Verdict { session: usize },
    PlanApply { id: u64 },
    Tick,
    ThunderTick,
}

struct Queued {
    at: f64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> Ordering {
        // Min-heap on (time, sequence).
        o.at.total_cmp(&self.at).then(o.seq.cmp(&self.seq))
    }
}

struct Replica {
    engine: EmulatedReplica,
    iterating: bool,
    token: u64,
    scheduled_end: Option<f64>,
    kv_tokens: u64,
    admitted: u64,
    /// Sessions whose conversation the router index places here (for the shared prefix).
    served_any: bool,
}

struct PendingPlan {
    id: u64,
    made_at: f64,
    signatures: BTreeMap<u64, u64>,
    plan: tao::Plan,
}

struct Sim<'a> {
    /// The sessions; routed, as the first model runs them.
    trace: &'a AgentTrace,
    /// Routed with programs that depend on their model: arm `a`'s version of every session
    /// (empty when every model runs [`Sim::trace`]'s).
    by_arm: Vec<&'a AgentTrace>,
    cfg: &'a AgentRunConfig,
    now: f64,
    seq: u64,
    queue: BinaryHeap<Queued>,
    replicas: Vec<Replica>,
    sessions: Vec<SessionState>,
    next_session: usize,
    /// Sessions started and not done, in session order: the only ones a plan can concern
    /// (a trace holds up to hundreds of thousands; at most `workers` are open at once).
    open: BTreeSet<usize>,
    /// Request id → session index.
    requests: BTreeMap<u64, usize>,
    /// A judge's request id → the program it judges.
    judges: BTreeMap<u64, usize>,
    next_request: u64,
    /// Replicas each scheduler instance places among: one group of every replica, or, with
    /// routed programs, one per routed model.
    groups: Vec<Vec<usize>>,
    rr: Vec<RoundRobin>,
    thunder: Vec<ThunderAgent>,
    /// Per replica: calls of DISC-admitted programs its engine could not take under the 95 %
    /// per-call ceiling, in arrival order; retried whenever a call there ends.
    ceiling_wait: Vec<std::collections::VecDeque<usize>>,
    routing: Option<RoutingLayer>,
    history: ToolHistory,
    pending: Option<PendingPlan>,
    plan_dirty: bool,
    next_plan_id: u64,
    // Measurements.
    ttft: Vec<f64>,
    tool_end_ttft: Vec<f64>,
    pause: Vec<f64>,
    latency: Vec<f64>,
    prompt_tokens: u64,
    cached_tokens: u64,
    generated: u64,
    n_requests: u64,
    pred_err: Vec<f64>,
    stats: PlannerStats,
    states_sum: f64,
    candidates_sum: f64,
    age_sum: f64,
    running_series: Vec<u32>,
    ticks: u64,
    /// Per replica: the highest KV-cache usage a tick saw, and the first tick at which it
    /// reached [`KV_FULL`] (paper 002 Fig. 2c's "approaches full KV-cache capacity").
    kv_peak: Vec<f64>,
    kv_full_at: Vec<Option<f64>>,
    last_end: f64,
    /// The trace's shared system prompt (tokens), held once per replica.
    shared_tokens: u64,
}

/// Runs the trace on the pool with the configured scheduler.
pub fn run_agents(
    trace: &AgentTrace,
    pool: &AgentPoolSpec,
    cfg: &AgentRunConfig,
) -> Result<AgentRunReport, AgentSimError> {
    Ok(run(&[trace], pool, cfg, None)?.0)
}

/// Runs the trace's sessions as routed programs ([`super::agent_routing`]): each is bound to
/// one of the pool's models by ORACLE's router and admitted by `routing`'s rule; the
/// scheduler places its requests among its model's replicas.
pub fn run_routed_agents(
    trace: &AgentTrace,
    pool: &AgentPoolSpec,
    cfg: &AgentRunConfig,
    routing: &ProgramRouting,
) -> Result<(AgentRunReport, RoutedRunReport), AgentSimError> {
    run_routed_agents_by_model(&[trace], pool, cfg, routing)
}

/// [`run_routed_agents`] where a program depends on the model it is bound to: `traces[a]` is
/// every program as `routing`'s arm `a` runs it (one trace per arm, the same sessions by id,
/// each with the same first turn — the router binds a program on its first request; one trace
/// alone serves every arm). A diverted program runs its new model's version from its start.
pub fn run_routed_agents_by_model(
    traces: &[&AgentTrace],
    pool: &AgentPoolSpec,
    cfg: &AgentRunConfig,
    routing: &ProgramRouting,
) -> Result<(AgentRunReport, RoutedRunReport), AgentSimError> {
    let (report, routed) = run(traces, pool, cfg, Some(routing))?;
    let routed = routed.ok_or(AgentSimError::EmptyPool)?;
    Ok((report, routed))
}

/// Checks that `traces` are versions of one set of programs, one per arm.
fn check_versions(traces: &[&AgentTrace], arms: usize) -> Result<(), AgentSimError> {
    let bad = |reason: String| Err(AgentSimError::ProgramsByModel(reason));
    if traces.len() != arms {
        return bad(format!("{} traces for {arms} models (one per model, or one for all)", traces.len()));
    }
    let first = traces[0];
    let first_turn = |s: &crate::agentic::AgentSession| s.prompt_tokens(0);
    for (a, t) in traces.iter().enumerate().skip(1) {
        if t.sessions.len() != first.sessions.len() {
            return bad(format!("trace {a} has {} sessions, trace 0 {}", t.sessions.len(), first.sessions.len()));
        }
        for (x, y) in first.sessions.iter().zip(&t.sessions) {
            if x.id != y.id || x.system_tokens != y.system_tokens || first_turn(x) != first_turn(y) {
                return bad(format!(
                    "session {} of trace {a} is not a version of trace 0's {} (the id, system prompt and first \
                     request must match)",
                    y.id, x.id
                ));
            }
        }
    }
    Ok(())
}

fn run(
    traces: &[&AgentTrace],
    pool: &AgentPoolSpec,
    cfg: &AgentRunConfig,
    routing: Option<&ProgramRouting>,
) -> Result<(AgentRunReport, Option<RoutedRunReport>), AgentSimError> {
    if routing.is_some() && cfg.scheduler == SchedulerKind::Tao {
        return Err(AgentSimError::RoutedTao);
    }
    if pool.replicas.is_empty() {
        return Err(AgentSimError::EmptyPool);
    }
    if cfg.workers == 0 {
        return Err(AgentSimError::NoWorkers);
    }
    let Some(&trace) = traces.first() else {
        return Err(AgentSimError::ProgramsByModel("no trace".into()));
    };
    for t in traces {
        t.validate()?;
    }
    // Versions by model: routed runs only (`run_agents` passes one trace).
    let by_arm = match routing {
        Some(r) if traces.len() > 1 => {
            check_versions(traces, r.arms.len())?;
            traces.to_vec()
        }
        _ => Vec::new(),
    };
    let mut replicas = Vec::with_capacity(pool.replicas.len());
    let mut ready_at: f64 = 0.0;
    for (index, r) in pool.replicas.iter().enumerate() {
        let bad = |reason: String| AgentSimError::Replica { index, reason };
        let device = spec::device(&r.device).map_err(|e| bad(e.to_string()))?;
        let model = spec::model(&r.model).map_err(|e| bad(e.to_string()))?;
        let mut config = ServingConfig::vllm_defaults_on(&device, r.dtype, r.max_model_len);
        config.tensor_parallel = r.tensor_parallel;
        config.kv_cache_dtype = r.kv_cache_dtype;
        let seed = crate::values::derive_seed(cfg.noise_seed, &["agentic", &index.to_string()]);
        let mut engine = EmulatedReplica::new(device, model, config, seed).map_err(|e| bad(e.to_string()))?;
        if r.request_state_tokens > 0 {
            engine.set_request_state_tokens(r.request_state_tokens).map_err(|e| bad(e.to_string()))?;
        }
        let until = engine.begin_load(0.0).map_err(|e| bad(e.to_string()))?;
        engine.finish_transition(until);
        ready_at = ready_at.max(until);
        let kv_tokens = u64::from(engine.memory_plan().kv_blocks) * u64::from(BLOCK);
        replicas.push(Replica {
            engine,
            iterating: false,
            token: 0,
            scheduled_end: None,
            kv_tokens,
            admitted: 0,
            served_any: false,
        });
    }
    let max_len = pool.replicas.iter().map(|r| r.max_model_len).min().unwrap_or(0);
    for s in traces.iter().flat_map(|t| &t.sessions) {
        for k in 0..s.turns.len() {
            let tokens = s.prompt_tokens(k) + s.turns[k].reasoning_tokens + s.turns[k].output_tokens;
            if tokens > max_len {
                return Err(AgentSimError::TooLong { session: s.id.clone(), turn: k, tokens, max_model_len: max_len });
            }
        }
    }
    let sessions = trace
        .sessions
        .iter()
        .map(|_| SessionState::new(SimSession::default()))
        .collect();
    let mut sim = Sim {
        trace,
        by_arm,
        cfg,
        now: ready_at,
        seq: 0,
        queue: BinaryHeap::new(),
        replicas,
        sessions,
        next_session: 0,
        open: BTreeSet::new(),
        requests: BTreeMap::new(),
        judges: BTreeMap::new(),
        next_request: 0,
        groups: vec![(0..pool.replicas.len()).collect()],
        rr: vec![RoundRobin::default()],
        thunder: vec![ThunderAgent::new().with_acting_decay(cfg.thunder_acting_decay)],
        ceiling_wait: Vec::new(),
        routing: None,
        history: ToolHistory::default(),
        pending: None,
        plan_dirty: false,
        next_plan_id: 0,
        ttft: Vec::new(),
        tool_end_ttft: Vec::new(),
        pause: Vec::new(),
        latency: Vec::new(),
        prompt_tokens: 0,
        cached_tokens: 0,
        generated: 0,
        n_requests: 0,
        pred_err: Vec::new(),
        stats: PlannerStats::default(),
        states_sum: 0.0,
        candidates_sum: 0.0,
        age_sum: 0.0,
        running_series: Vec::new(),
        ticks: 0,
        kv_peak: Vec::new(),
        kv_full_at: Vec::new(),
        last_end: ready_at,
        shared_tokens: traces.iter().flat_map(|t| &t.sessions).map(|s| u64::from(s.system_tokens)).max().unwrap_or(0),
    };
    if let Some(routing) = routing {
        let models: Vec<&str> = pool.replicas.iter().map(|r| r.model.as_str()).collect();
        let kv: Vec<u64> = sim.replicas.iter().map(|r| r.kv_tokens).collect();
        let layer = RoutingLayer::new(routing.clone(), &models, &kv, trace.sessions.len(), cfg.workers)?;
        if let Some((j, _)) = layer.judge()
            && j.prompt_tokens.saturating_add(j.output_tokens) > max_len
        {
            return Err(ProgramRoutingError::Judge.into());
        }
        let arms = layer.arms();
        sim.groups = (0..arms).map(|a| (0..kv.len()).filter(|&r| layer.replica_arm[r] == a).collect()).collect();
        sim.rr = vec![RoundRobin::default(); arms];
        sim.thunder = vec![ThunderAgent::new().with_acting_decay(sim.cfg.thunder_acting_decay); arms];
        sim.ceiling_wait = vec![std::collections::VecDeque::new(); kv.len()];
        sim.routing = Some(layer);
    }
    sim.run()?;
    let routed = sim.routing.as_ref().map(|l| {
        let preemptions: Vec<u64> = sim.replicas.iter().map(|r| r.engine.telemetry().preemptions).collect();
        let kv: Vec<(f64, Option<f64>)> =
            (0..sim.replicas.len()).map(|r| (sim.kv_peak.get(r).copied().unwrap_or(0.0), sim.kv_full_at.get(r).copied().flatten())).collect();
        l.report(&preemptions, &kv)
    });
    Ok((sim.report(ready_at), routed))
}

/// KV-cache usage counted as full (vLLM's `kv_cache_usage_perc`).
pub const KV_FULL: f64 = 0.95;

impl<'a> Sim<'a> {
    /// One tick's look at every replica's KV-cache usage: the peak, and when it first was full.
    fn observe_kv(&mut self) {
        let n = self.replicas.len();
        self.kv_peak.resize(n, 0.0);
        self.kv_full_at.resize(n, None);
        for (r, replica) in self.replicas.iter().enumerate() {
            let usage = replica.engine.telemetry().kv_usage;
            self.kv_peak[r] = self.kv_peak[r].max(usage);
            if usage >= KV_FULL && self.kv_full_at[r].is_none() {
                self.kv_full_at[r] = Some(self.now);
            }
        }
    }

    /// Session `i` as it runs: routed with programs by model, its bound model's version (arm 0's
    /// before it is bound — the versions share the first request).
    fn session(&self, i: usize) -> &'a crate::agentic::AgentSession {
        let arm = self.routing.as_ref().map_or(0, |layer| layer.arm_of(i));
        let trace = self.by_arm.get(arm).copied().unwrap_or(self.trace);
        &trace.sessions[i]
    }

    fn schedule(&mut self, at: f64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Queued { at, seq: self.seq, ev });
    }

    fn run(&mut self) -> Result<(), AgentSimError> {
        let start = self.now;
        for slot in 0..self.cfg.workers.min(self.trace.sessions.len()) {
            self.start_next_session(slot)?;
        }
        self.schedule(start, Ev::Tick);
        if self.cfg.scheduler == SchedulerKind::ThunderAgent {
            self.schedule(start + THUNDER_PERIOD_S, Ev::ThunderTick);
        }
        self.after_event()?;
        while !self.open.is_empty() || self.next_session < self.trace.sessions.len() {
            let Some(q) = self.queue.pop() else {
                return Err(AgentSimError::Stalled { at: self.now, open: self.open.len() });
            };
            self.now = q.at;
            match q.ev {
                Ev::IterationEnd { replica, token } => self.iteration_end(replica, token)?,
                Ev::ToolReturn { session, signature } => self.tool_return(session, signature)?,
                Ev::Verdict { session } => self.verdict(session)?,
                Ev::PlanApply { id } => self.apply_plan(id),
                Ev::ThunderTick => {
                    self.thunder_step();
                    if !self.open.is_empty() || self.next_session < self.trace.sessions.len() {
                        self.schedule(self.now + THUNDER_PERIOD_S, Ev::ThunderTick);
                    }
                }
                Ev::Tick => {
                    self.observe_usage();
                    self.observe_kv();
                    // Running requests sampled every SERIES_STEP_S (Figure 4's series).
                    self.ticks += 1;
                    if (self.ticks - 1).is_multiple_of(SERIES_STEP_TICKS) {
                        let running: usize = self.replicas.iter().map(|r| r.engine.in_flight()).sum();
                        self.running_series.push(running as u32);
                    }
                    self.plan_dirty = true;
                    if !self.open.is_empty() || self.next_session < self.trace.sessions.len() {
                        self.schedule(self.now + TAO_PERIOD_S, Ev::Tick);
                    }
                }
            }
            self.after_event()?;
        }
        Ok(())
    }

    /// After each event: an admission scheduler replans when something changed.
    fn after_event(&mut self) -> Result<(), AgentSimError> {
        if self.cfg.scheduler == SchedulerKind::Tao && self.plan_dirty && self.pending.is_none() {
            self.submit_plan()?;
        }
        Ok(())
    }

    /// Worker `slot` takes the next session: it starts at once, or, routed, is bound to a
    /// model and starts when that model admits it.
    fn start_next_session(&mut self, slot: usize) -> Result<(), AgentSimError> {
        let i = self.next_session;
        if i >= self.trace.sessions.len() {
            return Ok(());
        }
        self.next_session += 1;
        self.open.insert(i);
        self.sessions[i].started_at = self.now;
        let tokens = u64::from(self.next_prompt(i));
        let now = self.now;
        match &mut self.routing {
            None => self.begin(i),
            Some(layer) => {
                self.sessions[i].phase = AgentPhase::Admitting;
                for a in layer.bind(i, slot, tokens, now)? {
                    self.begin(a);
                }
            }
        }
        Ok(())
    }

    /// Session `i`'s first request is ready now.
    fn begin(&mut self, i: usize) {
        let s = &mut self.sessions[i];
        s.ready_at = self.now;
        s.paused_at = self.now;
        s.phase = AgentPhase::Pooled { returned: true };
        self.request_ready(i);
    }

    /// The scheduler group (and its replicas) session `i` runs in.
    fn group_of(&self, i: usize) -> usize {
        self.routing.as_ref().map_or(0, |l| l.arm_of(i))
    }

    /// A routed program's verdict landed; batch-synchronous dispatch starts the next batch
    /// once every program of this one is verified.
    fn verdict(&mut self, i: usize) -> Result<(), AgentSimError> {
        let Some(layer) = &mut self.routing else { return Ok(()) };
        layer.verdict(i, self.now)?;
        if layer.feedback() == Feedback::BatchSynchronous && !layer.batch_open() {
            layer.next_batch();
            for slot in 0..self.cfg.workers {
                self.start_next_session(slot)?;
            }
        }
        Ok(())
    }

    /// Tokens of the conversation a session's next request sends.
    fn next_prompt(&self, i: usize) -> u32 {
        self.session(i).prompt_tokens(self.sessions[i].turn)
    }

    fn request_ready(&mut self, i: usize) {
        match self.cfg.scheduler {
            SchedulerKind::RoundRobin | SchedulerKind::CacheAware | SchedulerKind::Dynamo => {
                let g = self.group_of(i);
                let loads = self.group_loads(g);
                let mut req = self.route_request(i);
                if self.routing.is_some() {
                    req.overlap_tokens = self.groups[g].iter().map(|&r| req.overlap_tokens[r]).collect();
                }
                let local = match self.cfg.scheduler {
                    SchedulerKind::RoundRobin => self.rr[g].route(&loads),
                    SchedulerKind::CacheAware => CacheAware.route(&req, &loads),
                    _ => DynamoRouter::default().route(&req, &loads),
                };
                let b = self.groups[g][local];
                self.dispatch(i, b);
            }
            SchedulerKind::ThunderAgent => {
                let g = self.group_of(i);
                let tokens = u64::from(self.next_prompt(i));
                let loads = self.group_loads(g);
                let backend = if self.sessions[i].call.is_none() {
                    self.thunder[g].arrive(i as u64, tokens, &loads)
                } else {
                    self.thunder[g].request(i as u64, tokens)
                };
                match backend {
                    Some(local) => {
                        let b = self.groups[g][local];
                        if self.under_call_ceiling(i, b) {
                            self.dispatch(i, b);
                        } else {
                            self.sessions[i].phase = AgentPhase::Pooled { returned: true };
                            self.ceiling_wait[b].push_back(i);
                            if let Some(layer) = &mut self.routing {
                                layer.ceiling_holds += 1;
                            }
                        }
                    }
                    None => self.sessions[i].phase = AgentPhase::Pooled { returned: true },
                }
            }
            SchedulerKind::Tao => {
                if let AgentPhase::Held { replica } = self.sessions[i].phase {
                    self.dispatch(i, replica);
                } else {
                    self.sessions[i].phase = AgentPhase::Pooled { returned: true };
                    self.plan_dirty = true;
                }
            }
        }
    }

    /// DISC's per-call ceiling (paper 002 B.2): session `i`'s next call goes to replica `b`
    /// only if the KV its engine holds plus the call's whole footprint (prompt, reasoning and
    /// answer) stays within the ceiling's share of the engine's KV cache. Always true without
    /// DISC admission.
    fn under_call_ceiling(&self, i: usize, b: usize) -> bool {
        let Some(ceiling) = self.routing.as_ref().and_then(RoutingLayer::per_call_ceiling) else { return true };
        let t = self.replicas[b].engine.telemetry();
        let session = self.session(i);
        let turn = &session.turns[self.sessions[i].turn];
        let call = u64::from(session.prompt_tokens(self.sessions[i].turn)) + u64::from(turn.reasoning_tokens) + u64::from(turn.output_tokens);
        let in_use = u64::from(t.kv_blocks_in_use) * u64::from(BLOCK);
        let capacity = u64::from(t.kv_blocks_total) * u64::from(BLOCK);
        // An idle engine takes any call (one larger than the ceiling would otherwise wait forever).
        in_use == 0 || (in_use + call) as f64 <= ceiling * capacity as f64
    }

    /// Calls held at replica `b` by the per-call ceiling go, in order, while they fit.
    fn release_ceiling_wait(&mut self, b: usize) {
        while let Some(&i) = self.ceiling_wait.get(b).and_then(|q| q.front()) {
            if !self.under_call_ceiling(i, b) {
                break;
            }
            self.ceiling_wait[b].pop_front();
            // Still waiting (ThunderAgent may have paused and resumed it elsewhere meanwhile).
            if matches!(self.sessions[i].phase, AgentPhase::Pooled { returned: true }) {
                self.dispatch(i, b);
            }
        }
    }

    fn route_request(&self, i: usize) -> RouteRequest {
        let prompt = u64::from(self.next_prompt(i));
        let system = u64::from(self.session(i).system_tokens);
        let overlap_tokens = (0..self.replicas.len())
            .map(|b| {
                let own = self.sessions[i].indexed.iter().find(|(r, _)| *r == b).map(|&(_, t)| t).unwrap_or(0);
                let shared = if self.replicas[b].served_any { system } else { 0 };
                own.max(shared).min(prompt)
            })
            .collect();
        RouteRequest { session: i as u64, prompt_tokens: prompt, overlap_tokens }
    }

    /// The loads of group `g`'s replicas, in the group's order.
    fn group_loads(&self, g: usize) -> Vec<ReplicaLoad> {
        let all = self.loads();
        if self.routing.is_none() {
            // One group of every replica, in order.
            return all;
        }
        self.groups[g].iter().map(|&r| all[r].clone()).collect()
    }

    fn loads(&self) -> Vec<ReplicaLoad> {
        self.replicas
            .iter()
            .map(|r| {
                let t = r.engine.telemetry();
                ReplicaLoad {
                    kv_tokens: r.kv_tokens,
                    admitted_tokens: r.admitted,
                    shared_tokens: self.shared_tokens,
                    requests: t.in_flight as u32,
                    active_blocks: u64::from(t.kv_blocks_in_use),
                }
            })
            .collect()
    }

    /// Sends session `i`'s next request to replica `b`.
    fn dispatch(&mut self, i: usize, b: usize) {
        // A routed program's requests go to its own model's replicas only (each scheduler
        // instance places among its group).
        debug_assert!(self.routing.as_ref().is_none_or(|l| l.replica_arm[b] == l.arm_of(i)));
        let now = self.now;
        if let Some(layer) = &mut self.routing {
            layer.started(i, now);
        }
        let session = self.session(i);
        let turn = self.sessions[i].turn;
        let prompt = session.prompt_tokens(turn);
        let reasoning = session.turns[turn].reasoning_tokens;
        let output = reasoning + session.turns[turn].output_tokens;
        let system_blocks = session.system_tokens / BLOCK;
        let key = i as u64 + 1;
        let hash =
            |block: u32| if block < system_blocks { mix(0, u64::from(block)) } else { mix(key, u64::from(block)) };
        let full = prompt / BLOCK;
        let prefix_hashes: Vec<u64> = (0..full).map(hash).collect();
        // What the call generates: with reasoning first, no block of it is a block of the next
        // turn's prompt (the conversation drops the reasoning), so its blocks get hashes of
        // their own (keyed by the session and turn) that no later prompt asks for.
        let generated_hashes: Vec<u64> = if reasoning == 0 {
            (full..(prompt + output) / BLOCK).map(hash).collect()
        } else {
            let own = mix(key, u64::from(turn as u32) | 1 << 40);
            (full..(prompt + output) / BLOCK).map(|block| mix(own, u64::from(block))).collect()
        };
        let id = self.next_request;
        self.next_request += 1;
        self.requests.insert(id, i);
        let weight = admission_weight(&self.pool_view(i), self.cfg.tao.reserve_tokens);
        let st = &mut self.sessions[i];
        // A held session's weight is already on its replica.
        if !matches!(st.phase, AgentPhase::Held { replica } if replica == b) {
            self.replicas[b].admitted += weight;
        } else {
            self.replicas[b].admitted = self.replicas[b].admitted - st.weight + weight;
        }
        st.weight = weight;
        st.phase = AgentPhase::Running { replica: b };
        st.signature += 1;
        self.pause.push(now - st.paused_at);
        let r = &mut self.replicas[b];
        r.served_any = true;
        let before = r.scheduled_end;
        let req = EngineRequest { id, prompt_tokens: prompt, prefix_hashes, generated_hashes, output_tokens: output };
        if let Err(e) = r.engine.submit(req, now) {
            // The trace was validated (`AgentTrace::validate`: outputs ≥ 1 token, a non-empty
            // first prompt) and checked against max_model_len, the hashes are built to the
            // engine's rule and the replica is awake: a refusal here is a bug in this loop, not
            // an input problem.
            unreachable!("engine refused a checked request: {e}");
        }
        if r.iterating && r.engine.iteration_end() != before {
            self.retime(b);
        }
        self.kick(b);
    }

    /// DISC's usage observation, once per tick: per routed model, the KV its replicas hold
    /// against the running requests' tokens (the ledger learns the per-request allowance δ̂
    /// from the excess while the engines are not saturated).
    fn observe_usage(&mut self) {
        let Some(layer) = &mut self.routing else { return };
        for (arm, group) in self.groups.iter().enumerate() {
            let (mut used, mut context, mut running) = (0u64, 0u64, 0u32);
            for &r in group {
                let engine = &self.replicas[r].engine;
                let t = engine.telemetry();
                used += u64::from(t.kv_blocks_in_use) * u64::from(BLOCK);
                context += engine.running_context_tokens();
                running += t.running as u32;
            }
            layer.observe_usage(arm, used, context, running);
        }
    }

    /// Submits the LLM judge's call for program `i` to the least busy replica of the judge's
    /// model: a request like any other (its own prompt blocks: the judge's rubric comes first,
    /// so it shares no cached prefix with the program).
    fn submit_judge(&mut self, i: usize, arm: usize, prompt: u32, output: u32) -> Result<(), AgentSimError> {
        let now = self.now;
        let loads = self.loads();
        let Some(&b) = self.groups[arm].iter().min_by_key(|&&r| (loads[r].requests, r)) else {
            return Err(AgentSimError::EmptyPool);
        };
        let key = mix(0x06a7_d6e5, i as u64 + 1);
        let prefix_hashes: Vec<u64> = (0..prompt / BLOCK).map(|k| mix(key, u64::from(k))).collect();
        let generated_hashes: Vec<u64> =
            (prompt / BLOCK..(prompt + output) / BLOCK).map(|k| mix(key, u64::from(k))).collect();
        let id = self.next_request;
        self.next_request += 1;
        self.judges.insert(id, i);
        let r = &mut self.replicas[b];
        let before = r.scheduled_end;
        let req = EngineRequest { id, prompt_tokens: prompt, prefix_hashes, generated_hashes, output_tokens: output };
        r.engine.submit(req, now).map_err(|e| AgentSimError::Replica { index: b, reason: e.to_string() })?;
        if r.iterating && r.engine.iteration_end() != before {
            self.retime(b);
        }
        self.kick(b);
        Ok(())
    }

    fn retime(&mut self, b: usize) {
        let r = &mut self.replicas[b];
        if let Some(end) = r.engine.iteration_end() {
            r.token += 1;
            r.scheduled_end = Some(end);
            let token = r.token;
            self.schedule(end, Ev::IterationEnd { replica: b, token });
        }
    }

    fn kick(&mut self, b: usize) {
        let now = self.now;
        let r = &mut self.replicas[b];
        if r.iterating {
            return;
        }
        if let Some(first) = r.engine.start_iteration(now) {
            let end = r.engine.extend_decode_run(RUN_STEPS).unwrap_or(first);
            r.iterating = true;
            r.token += 1;
            r.scheduled_end = Some(end);
            let token = r.token;
            self.schedule(end, Ev::IterationEnd { replica: b, token });
        }
    }

    fn iteration_end(&mut self, b: usize, token: u64) -> Result<(), AgentSimError> {
        let now = self.now;
        let r = &mut self.replicas[b];
        if r.token != token || !r.iterating {
            return Ok(());
        }
        r.iterating = false;
        r.scheduled_end = None;
        let events = r.engine.finish_iteration(now);
        for e in events {
            match e {
                EngineEvent::FirstToken { id, at } => {
                    if let Some(&i) = self.requests.get(&id) {
                        let st = &self.sessions[i];
                        self.ttft.push(at - st.ready_at);
                        if let Some(t) = st.tool_returned_at {
                            self.tool_end_ttft.push(at - t);
                        }
                    }
                }
                EngineEvent::Finished { id, at, prompt_tokens, cached_prompt_tokens, output_tokens } => {
                    // A judge's call is the verifier's work, not the sessions': the routed
                    // report counts it (`verdicts`), the sessions' totals do not.
                    if let Some(i) = self.judges.remove(&id) {
                        self.verdict(i)?;
                        continue;
                    }
                    self.n_requests += 1;
                    self.prompt_tokens += u64::from(prompt_tokens);
                    self.cached_tokens += u64::from(cached_prompt_tokens);
                    self.generated += u64::from(output_tokens);
                    if let Some(i) = self.requests.remove(&id) {
                        if let Some(layer) = &mut self.routing {
                            let latency = at - self.sessions[i].ready_at;
                            layer.call_finished(i, latency, prompt_tokens, cached_prompt_tokens, output_tokens);
                        }
                        self.request_finished(i, b, at, u64::from(prompt_tokens + output_tokens))?;
                    }
                }
                EngineEvent::Preempted { .. } => {}
            }
        }
        if self.ceiling_wait.get(b).is_some_and(|q| !q.is_empty()) {
            self.release_ceiling_wait(b);
        }
        self.kick(b);
        Ok(())
    }

    /// Session `i`'s call on replica `b` finished at `at`, its context (prompt, reasoning and
    /// answer) `context` tokens.
    fn request_finished(&mut self, i: usize, b: usize, at: f64, context: u64) -> Result<(), AgentSimError> {
        self.last_end = self.last_end.max(at);
        let weight = self.sessions[i].weight;
        self.replicas[b].admitted = self.replicas[b].admitted.saturating_sub(weight);
        // What the next prompt can find cached there: the whole conversation, or — after a call
        // that reasoned, whose reasoning the conversation drops — its prompt only.
        let call = &self.session(i).turns[self.sessions[i].turn];
        let cacheable = if call.reasoning_tokens > 0 {
            context.saturating_sub(u64::from(call.reasoning_tokens) + u64::from(call.output_tokens))
        } else {
            context
        };
        // The conversation as kept: the call's prompt and its answer.
        let transcript = cacheable + if call.reasoning_tokens > 0 { u64::from(call.output_tokens) } else { 0 };
        let st = &mut self.sessions[i];
        st.weight = 0;
        st.signature += 1;
        st.shell.peak = st.shell.peak.max(context);
        let peak = st.shell.peak;
        // A fresh cache observation there.
        st.cache.retain(|o| o.replica != b);
        st.cache.push(CacheObservation { replica: b, tokens: cacheable, at });
        st.indexed.retain(|(r, _)| *r != b);
        st.indexed.push((b, cacheable));
        let turn = st.turn;
        let session = self.session(i);
        let st = &mut self.sessions[i];
        match &session.turns[turn].tool {
            None => {
                st.phase = AgentPhase::Done;
                self.latency.push(at - st.started_at);
                self.open.remove(&i);
                self.plan_dirty = true;
                let g = self.group_of(i);
                self.thunder[g].release(i as u64);
                match &mut self.routing {
                    None => self.start_next_session(0)?,
                    Some(layer) => {
                        // Its reservation is released now; its verifier runs; its slot is free
                        // (batch-synchronous dispatch waits for the whole batch's verdicts).
                        let admitted = layer.finished(i, peak, at)?;
                        let (verifier_s, feedback, slot) = (layer.verifier_s(), layer.feedback(), layer.slot_of(i));
                        match layer.judge().map(|(j, arm)| (j.prompt_tokens, j.output_tokens, arm)) {
                            None => self.schedule(at + verifier_s, Ev::Verdict { session: i }),
                            Some((prompt, output, arm)) => {
                                let prompt = prompt.min(u32::try_from(transcript).unwrap_or(u32::MAX)).max(1);
                                self.submit_judge(i, arm, prompt, output)?;
                            }
                        }
                        for a in admitted {
                            self.begin(a);
                        }
                        if feedback != Feedback::BatchSynchronous {
                            self.start_next_session(slot)?;
                        }
                    }
                }
            }
            Some(tool) => {
                let mut call = ToolCall::new(tool.name.clone(), at);
                if let Some(h) = tool.hint_s {
                    call = call.with_deadline(at + h);
                }
                call.refresh(&self.history, at);
                // The readiness prediction at the call's start (hint first, then history),
                // scored against the truth.
                let predicted = call.remaining_s(&self.history, at);
                self.pred_err.push((predicted - tool.duration_s).abs());
                st.call = Some(call);
                st.turn += 1;
                st.phase = AgentPhase::Pooled { returned: false };
                st.paused_at = at;
                st.tool_returned_at = None;
                let (duration, signature) = (tool.duration_s, st.signature);
                self.plan_dirty = true;
                let g = self.group_of(i);
                self.thunder[g].response_done(i as u64, context, at);
                self.schedule(at + duration, Ev::ToolReturn { session: i, signature });
            }
        }
        Ok(())
    }

    fn tool_return(&mut self, i: usize, _signature: u64) -> Result<(), AgentSimError> {
        let now = self.now;
        let st = &mut self.sessions[i];
        if let Some(call) = &mut st.call {
            call.completed_at = Some(now);
            let elapsed = now - call.started_at;
            self.history.observe(&call.tool, elapsed)?;
        }
        st.tool_returned_at = Some(now);
        st.ready_at = now;
        self.request_ready(i);
        Ok(())
    }

    /// The scheduler's view of session `i` (not running).
    fn pool_view(&self, i: usize) -> PoolSession {
        self.sessions[i].pool_view(i, u64::from(self.next_prompt(i)), u64::from(self.session(i).system_tokens))
    }

    /// Sessions TAO may place: every one between turns (pooled or held), in session order.
    fn tao_pool(&self) -> Vec<PoolSession> {
        self.open.iter().copied().filter(|&i| self.sessions[i].in_pool()).map(|i| self.pool_view(i)).collect()
    }

    /// Loads with the weights of running sessions only: holds are re-decided by each plan.
    fn running_loads(&self) -> Vec<ReplicaLoad> {
        without_holds(self.loads(), self.open.iter().map(|&i| &self.sessions[i]))
    }

    fn submit_plan(&mut self) -> Result<(), AgentSimError> {
        self.plan_dirty = false;
        // The predictor republishes its predictions for the calls still running (their
        // freshness, Eq. 6's g_i).
        let now = self.now;
        for &i in &self.open {
            let st = &mut self.sessions[i];
            if matches!(st.phase, AgentPhase::Pooled { .. } | AgentPhase::Held { .. })
                && let Some(call) = &mut st.call
                && call.completed_at.is_none()
            {
                call.refresh(&self.history, now);
            }
        }
        let pool = self.tao_pool();
        if pool.is_empty() {
            return Ok(());
        }
        let loads = self.running_loads();
        let plan = tao_plan(&pool, &loads, &self.history, self.now, &self.cfg.tao)?;
        self.stats.submissions += 1;
        self.stats.fallbacks += u64::from(plan.fallback);
        self.states_sum += plan.states_explored as f64;
        self.stats.states_max = self.stats.states_max.max(plan.states_explored as u64);
        self.candidates_sum += pool.len() as f64;
        let signatures = pool.iter().map(|s| (s.session, s.signature)).collect();
        let id = self.next_plan_id;
        self.next_plan_id += 1;
        self.pending = Some(PendingPlan { id, made_at: self.now, signatures, plan });
        self.schedule(self.now + self.cfg.plan_latency_s, Ev::PlanApply { id });
        Ok(())
    }

    fn apply_plan(&mut self, id: u64) {
        let Some(p) = self.pending.take_if(|p| p.id == id) else { return };
        self.stats.applications += 1;
        self.age_sum += self.now - p.made_at;
        // Live state: sessions still between turns keep their signature; capacities without
        // the holds this plan replaces.
        let live = agent_session::revalidation_state(
            p.signatures.keys().map(|&s| (s as usize, &self.sessions[s as usize])),
            self.replicas.len(),
            &self.running_loads(),
            self.cfg.tao.safe_fraction,
        );
        let applied = tao::revalidate(&p.plan, &live);
        if applied.discarded {
            self.stats.discarded += 1;
            self.plan_dirty = true;
            return;
        }
        self.stats.partial += u64::from(applied.partial);
        self.stats.nonempty_applications += u64::from(!applied.assignments.is_empty());
        // Release every hold, then take the plan's.
        for (replica, w) in agent_session::release_holds(&mut self.sessions, self.open.iter().copied()) {
            self.replicas[replica].admitted = self.replicas[replica].admitted.saturating_sub(w);
        }
        for Assignment { session, replica, .. } in applied.assignments {
            let i = session as usize;
            if self.sessions[i].can_resume() {
                self.dispatch(i, replica);
            } else {
                let w = admission_weight(&self.pool_view(i), self.cfg.tao.reserve_tokens);
                self.sessions[i].hold(replica, w);
                self.replicas[replica].admitted += w;
            }
        }
    }

    /// ThunderAgent's step: pause and resume programs against each backend's capacity.
    fn thunder_step(&mut self) {
        for g in 0..self.groups.len() {
            let loads = self.group_loads(g);
            for (session, local) in self.thunder[g].tick(&loads, self.now) {
                let i = session as usize;
                // A resumed program with its request pending runs now; an acting one is active
                // again and sends its next request there when its tool returns.
                if matches!(self.sessions[i].phase, AgentPhase::Pooled { returned: true }) {
                    self.dispatch(i, self.groups[g][local]);
                }
            }
        }
    }

    fn report(&self, start: f64) -> AgentRunReport {
        let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
        let mut sorted = self.ttft.clone();
        sorted.sort_by(f64::total_cmp);
        let p90 = sorted.get(((sorted.len() as f64 * 0.9).ceil() as usize).saturating_sub(1)).copied().unwrap_or(0.0);
        let makespan = self.last_end - start;
        let s = &self.stats;
        let n = s.submissions.max(1) as f64;
        AgentRunReport {
            scheduler: self.cfg.scheduler.name().to_string(),
            workers: self.cfg.workers,
            sessions: self.trace.sessions.len(),
            requests: self.n_requests,
            makespan_s: makespan,
            mean_latency_s: mean(&self.latency),
            mean_ttft_s: mean(&self.ttft),
            p90_ttft_s: p90,
            decode_tps: if makespan > 0.0 { self.generated as f64 / makespan } else { 0.0 },
            cache_hit_rate: if self.prompt_tokens > 0 {
                self.cached_tokens as f64 / self.prompt_tokens as f64
            } else {
                0.0
            },
            tool_end_to_first_token_s: mean(&self.tool_end_ttft),
            pause_wait_s: mean(&self.pause),
            preemptions: self.replicas.iter().map(|r| r.engine.telemetry().preemptions).sum(),
            readiness_mae_s: (!self.pred_err.is_empty()).then(|| mean(&self.pred_err)),
            readiness_within_half_s: (!self.pred_err.is_empty())
                .then(|| self.pred_err.iter().filter(|&&e| e <= 0.5).count() as f64 / self.pred_err.len() as f64),
            planner: PlannerStats {
                states_mean: self.states_sum / n,
                candidates_mean: self.candidates_sum / n,
                plan_age_mean_s: self.age_sum / s.applications.max(1) as f64,
                ..s.clone()
            },
            running_series: self.running_series.clone(),
        }
    }
}
