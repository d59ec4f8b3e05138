//! The live shell of agent sessions (paper 000, TAO): closed-loop workers replay an
//! [`AgentTrace`] on tokio and wall-clock time against real OpenAI-compatible engines (one
//! [`Engine`] per replica: `switchyard emulate` servers, vLLM, any fixed endpoint), with a
//! scheduler of [`crate::planner::admission`] deciding admission and placement — the same pure
//! functions, called on the same events with the same views, as the simulator's agent loop
//! (`sim::agentic`).
//!
//! Owns: the coordinator (one task that alone holds every session's and replica's state and
//! applies what the scheduler decides; the tasks it spawns — engine calls, tool calls, TAO
//! solves — only report back over its channel), the deterministic conversation text of a
//! trace ([`system_text`], [`observation_text`], [`output_text`]: one Qwen3 token per word, so
//! that prompts have the trace's token counts and turn k+1's prompt extends turn k's prompt
//! and output, which the engine's prefix cache hits), and the run's [`LiveAgentReport`].
//!
//! Semantics (the simulator's, on wall-clock time):
//! - a session's model turn sends its whole conversation so far plus the turn's new tokens
//!   (a raw `/v1/completions` prompt) and asks for the turn's output tokens (the emulated
//!   output to a `switchyard emulate` server; a real model's answer is appended as it came);
//! - after every turn but the last the session is *interrupted* at its tool call (a pause): it
//!   releases the capacity it was admitted with and waits in the pool while the tool runs (a
//!   `tokio::time::sleep` of the tool's duration / `speed`; this is where a sandboxed tool
//!   would run). Its return is observed in the tool-duration history (TAO's readiness);
//! - routers (round-robin, cache-aware, Dynamo) send a ready request at once; ThunderAgent
//!   pauses and resumes programs on its 5 s period; TAO solves on a snapshot of the pool in a
//!   blocking worker (`spawn_blocking`: off the event path, at most one solve in flight), and
//!   when the plan comes back it is revalidated against the live state
//!   ([`tao::revalidate`]): a plan whose selected session moved on is discarded, otherwise the
//!   longest feasible prefix is applied — sessions whose tool returned are dispatched (a
//!   resume), the others are *held* on their replica, reserving its capacity until their tool
//!   returns, and each new plan re-decides every hold;
//! - every session completes exactly once (counted; a second completion, a second answer or
//!   a second tool return is an [`LiveAgentError::Internal`] error, not a silent double).
//!
//! Time: the scheduler sees trace seconds = wall seconds × `speed` (as `switchyard emulate
//! --speed` does); the report's times are in those seconds too.
//!
//! Depends on the `Engine` interface, the agent trace model, the sessions' scheduling state it
//! shares with the simulator's loop (`exec::agent_session`) and the pure planner
//! (`planner::admission`, `planner::tao`); no tokenizer work on the event path (token counts
//! are the trace's and the engines' usage). It must not depend on the simulator (`sim`) or
//! `bench`.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use thiserror::Error;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::agentic::{AgentTrace, mix};
use crate::exec::agent_session::{self, AgentPhase, AgentSession, without_holds};
use crate::live::engine::{Completion, Engine, EngineError, LlmRequest};
use crate::planner::admission::{
    CacheAware, CacheObservation, DynamoRouter, PoolSession, ReplicaLoad, RoundRobin, RouteRequest, SchedulerKind,
    THUNDER_PERIOD_S, TaoOptions, ThunderAgent, admission_weight, residual_capacities, tao_plan,
};
use crate::report::WastedWork;
use crate::planner::tao::{self, Assignment, Plan, TaoError, ToolCall, ToolHistory};

/// Engine block size (vLLM's default): a router's estimate of a request's KV blocks.
const BLOCK: u64 = 16;
/// TAO's re-planning period, trace seconds (the simulator's `TAO_PERIOD_S`).
const TAO_PERIOD_S: f64 = 1.0;
/// First wait before retrying a retryable engine error (doubled each attempt).
const RETRY_BACKOFF: Duration = Duration::from_millis(50);

/// Words that are one Qwen3 token each with their leading space: a text of `n` of them is `n`
/// tokens, and texts concatenate token by token (the pre-tokenizer splits at each space).
const WORDS: [&str; 64] = [
    "the", "and", "of", "to", "in", "is", "that", "for", "it", "with", "as", "was", "on", "be", "at", "by", "this",
    "had", "not", "are", "but", "from", "or", "have", "an", "they", "which", "one", "you", "were", "all", "there",
    "would", "their", "we", "him", "been", "has", "when", "who", "will", "more", "if", "out", "so", "said", "what",
    "up", "its", "about", "into", "than", "them", "can", "only", "other", "new", "some", "could", "time", "these",
    "two", "may", "then",
];

#[derive(Debug, Error)]
pub enum LiveAgentError {
    #[error("the pool has no replica")]
    EmptyPool,
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A turn's admission weight exceeds every replica's admission capacity: TAO could never
    /// admit it.
    #[error("session {session}: turn {turn} weighs {weight} tokens, more than any replica admits ({capacity})")]
    TooLarge { session: String, turn: usize, weight: u64, capacity: u64 },
    /// An engine call failed (after the configured retries of a retryable error).
    #[error("session {session}: turn {turn} on replica {replica}: {source}")]
    Engine {
        session: String,
        turn: usize,
        replica: usize,
        #[source]
        source: EngineError,
    },
    #[error("TAO: {0}")]
    Tao(#[from] TaoError),
    /// A spawned task (engine call, tool, solve) panicked or was cancelled.
    #[error("a task of the run failed: {0}")]
    Task(String),
    /// Nothing is running, held or waiting on a tool, and the last plan admitted nothing.
    #[error("the run stalled with {open} sessions open and nothing admissible")]
    Stalled { open: usize },
    #[error("the run passed its deadline of {deadline_s:.1} s (wall) with {open} sessions open")]
    Deadline { deadline_s: f64, open: usize },
    /// A broken invariant of the coordinator (a session completing twice, an answer or tool
    /// return nobody waits for): a bug, reported instead of counted twice.
    #[error("internal: {0}")]
    Internal(String),
}

/// One replica of the pool: its engine (loaded by the caller) and the KV tokens admission may
/// fill on it (the engine's KV blocks × block size, or a smaller safe budget).
#[derive(Clone)]
pub struct AgentReplica {
    pub engine: Arc<dyn Engine>,
    pub kv_tokens: u64,
}

/// How to run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveAgentConfig {
    /// Closed-loop workers: sessions open at once.
    pub workers: usize,
    pub scheduler: SchedulerKind,
    pub tao: TaoOptions,
    /// Trace seconds per wall second (tool durations are slept for `duration_s / speed`; the
    /// `--speed` of `switchyard emulate` engines, 1 on real GPUs).
    pub speed: f64,
    /// The served model name requests carry.
    pub model: String,
    /// Ask engines to stream their answers (time to first token is measured either way).
    pub stream: bool,
    /// Retries of a retryable engine error (same replica, exponential backoff).
    pub retries: u32,
    /// Wall seconds the whole run may take.
    pub deadline_s: f64,
    /// ThunderAgent's 2^−t decay of acting programs' tokens at resume (off, as the proxy ships).
    pub thunder_acting_decay: bool,
    /// Seeds the conversation text: runs with different seeds share no prefix, so a second
    /// run against the same engines starts with cold prefix caches.
    pub text_seed: u64,
}

/// The longest `deadline_s` a run may have: one year (wall seconds).
pub const MAX_DEADLINE_S: f64 = 86_400.0 * 365.0;

impl LiveAgentConfig {
    /// `workers` sessions at once under `scheduler`, real time, streamed, 2 retries, 1 hour.
    pub fn new(model: impl Into<String>, scheduler: SchedulerKind, workers: usize) -> Self {
        LiveAgentConfig {
            workers,
            scheduler,
            tao: TaoOptions::default(),
            speed: 1.0,
            model: model.into(),
            stream: true,
            retries: 2,
            deadline_s: 3_600.0,
            thunder_acting_decay: false,
            text_seed: 0,
        }
    }
}

/// TAO's planner outcomes in a live run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LivePlannerStats {
    pub submissions: u64,
    pub applications: u64,
    pub nonempty_applications: u64,
    pub fallbacks: u64,
    pub discarded: u64,
    pub partial: u64,
    /// Mean wall-clock age of a plan when applied (the asynchronous solve's latency), seconds.
    pub plan_age_mean_wall_s: f64,
}

/// One answered model turn.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnOutcome {
    pub replica: usize,
    /// As the engine counted them (`usage`).
    pub prompt_tokens: u32,
    /// `usage.prompt_tokens_details.cached_tokens` (0 when the engine does not report it).
    pub cached_tokens: u32,
    pub output_tokens: u32,
    /// Trace seconds from the request being ready (session start or tool return) to its
    /// first token.
    pub ttft_s: f64,
    /// Engine calls it took (1 + retries).
    pub attempts: u32,
    /// Trace seconds since the run's start when it was sent, and when its answer came back.
    pub sent_at_s: f64,
    pub finished_at_s: f64,
}

/// One session of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionOutcome {
    pub id: String,
    /// Times it completed: 1 in every finished run.
    pub completions: u32,
    pub turns: Vec<TurnOutcome>,
    /// Tool calls it made (each a pause and a resume).
    pub tool_calls: u32,
    /// Trace seconds from its start to its last token.
    pub latency_s: f64,
}

/// What one live run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveAgentReport {
    pub scheduler: String,
    pub workers: usize,
    /// Sessions completed.
    pub sessions: usize,
    /// Model turns answered.
    pub requests: u64,
    pub tool_calls: u64,
    /// Tool-call interruptions: a session released its capacity and entered the pool.
    pub pauses: u64,
    /// Re-admissions after a tool call: the session's next turn dispatched.
    pub resumes: u64,
    /// TAO holds: a session admitted onto a replica while its tool still ran (a hold a later
    /// plan keeps on the same replica counts once).
    pub holds: u64,
    pub retries: u64,
    /// What the retried attempts had cost the engines before they failed (from each request's
    /// call meter: attempts whose first token had come, their prompts and streamed output).
    pub wasted: WastedWork,
    pub wall_s: f64,
    /// Trace seconds from the start to the last token.
    pub makespan_s: f64,
    pub mean_latency_s: f64,
    pub mean_ttft_s: f64,
    pub prompt_tokens: u64,
    /// Prompt tokens the engines reported served from their prefix cache.
    pub cached_tokens: u64,
    /// `cached_tokens / prompt_tokens` (0 when the engines report no cached tokens).
    pub cache_hit_rate: f64,
    /// Mean |predicted − actual| tool duration at each call's start (hint, then history);
    /// `None` (JSON `null`) when no tool call was scored.
    pub readiness_mae_s: Option<f64>,
    /// Per replica, the most admission weight its admitted sessions held at once.
    pub peak_admitted_tokens: Vec<u64>,
    pub planner: LivePlannerStats,
    pub outcomes: Vec<SessionOutcome>,
}

/// `n` one-token words drawn deterministically from `key`, each with its leading space.
fn words(key: u64, n: u32) -> String {
    let mut out = String::with_capacity(n as usize * 5);
    for j in 0..u64::from(n) {
        out.push(' ');
        out.push_str(WORDS[(mix(key, j) % WORDS.len() as u64) as usize]);
    }
    out
}

/// The shared system prompt of `tokens` tokens (the same for every session of a run).
pub fn system_text(seed: u64, tokens: u32) -> String {
    words(mix(seed, 0), tokens)
}

/// The new tokens of `session`'s turn `turn` (the task, or the previous tool's observation).
pub fn observation_text(seed: u64, session: usize, turn: usize, tokens: u32) -> String {
    words(mix(mix(seed, session as u64 + 1), 2 * turn as u64), tokens)
}

/// The output the emulated model returns for `session`'s turn `turn`.
pub fn output_text(seed: u64, session: usize, turn: usize, tokens: u32) -> String {
    words(mix(mix(seed, session as u64 + 1), 2 * turn as u64 + 1), tokens)
}

/// What the live coordinator keeps of a session besides its scheduling state: its
/// conversation, the request in flight and what it reports.
struct Conversation {
    /// The conversation so far (prompts and outputs of its answered turns).
    text: String,
    /// Tokens of `text`, counted as it grows: the trace's counts for the words this shell
    /// writes (one token each, concatenating token by token) plus each answer's output
    /// tokens as the engine reported them — exact for `switchyard emulate`, within a token or
    /// so for a real model's answer (a merge at its boundary, an end-of-sequence token).
    text_tokens: u64,
    /// The request in flight, its dispatch time and its estimated KV blocks.
    request: Option<(u64, f64, u64)>,
    outcome: SessionOutcome,
}

type SessionState = AgentSession<Conversation>;

struct ReplicaState {
    engine: Arc<dyn Engine>,
    kv_tokens: u64,
    admitted: u64,
    peak_admitted: u64,
    requests: u32,
    active_blocks: u64,
    served_any: bool,
}

struct Answer {
    result: Result<Completion, EngineError>,
    attempts: u32,
    /// What its failed attempts had cost.
    wasted: WastedWork,
}

enum Event {
    Answered {
        session: usize,
        request: u64,
        replica: usize,
        answer: Answer,
    },
    ToolReturned {
        session: usize,
    },
    /// A TAO solve's plan, or why the blocking worker failed.
    Planned {
        id: u64,
        result: Result<Result<Plan, TaoError>, String>,
    },
}

struct PendingPlan {
    id: u64,
    made_at: Instant,
    /// Nothing was running, held or waiting on a tool at the snapshot.
    quiescent: bool,
}

struct Shell<'a> {
    trace: &'a AgentTrace,
    cfg: &'a LiveAgentConfig,
    start: Instant,
    tx: mpsc::UnboundedSender<Event>,
    tasks: JoinSet<()>,
    replicas: Vec<ReplicaState>,
    sessions: Vec<SessionState>,
    next_session: usize,
    open: usize,
    next_request: u64,
    rr: RoundRobin,
    thunder: ThunderAgent,
    history: ToolHistory,
    pending: Option<PendingPlan>,
    plan_dirty: bool,
    next_plan_id: u64,
    shared_tokens: u64,
    // Measurements.
    pauses: u64,
    resumes: u64,
    holds: u64,
    retries: u64,
    wasted: WastedWork,
    requests: u64,
    prompt_tokens: u64,
    cached_tokens: u64,
    last_end: f64,
    pred_err: Vec<f64>,
    stats: LivePlannerStats,
    age_sum: f64,
}

/// Runs `trace` on `replicas` (engines already loaded) with `cfg`'s scheduler; returns when
/// every session has completed, or the first error.
pub async fn run_agents_live(
    trace: &AgentTrace,
    replicas: &[AgentReplica],
    cfg: &LiveAgentConfig,
) -> Result<LiveAgentReport, LiveAgentError> {
    if replicas.is_empty() {
        return Err(LiveAgentError::EmptyPool);
    }
    if cfg.workers == 0 {
        return Err(LiveAgentError::Config("workers must be at least 1".into()));
    }
    trace.validate().map_err(|e| LiveAgentError::Config(format!("the trace: {e}")))?;
    if let Some((s, k)) = trace.sessions.iter().find_map(|s| {
        s.turns.iter().position(|t| t.reasoning_tokens > 0).map(|k| (s.id.as_str(), k))
    }) {
        return Err(LiveAgentError::Config(format!(
            "the trace: session {s}: turns[{k}].reasoning_tokens: reasoning that the conversation drops is \
             simulated only (the live replay sends each turn's kept text)"
        )));
    }
    if !(cfg.speed.is_finite() && cfg.speed > 0.0) {
        return Err(LiveAgentError::Config(format!("speed must be a positive number, not {}", cfg.speed)));
    }
    if !crate::live::server::SPEED_RANGE.contains(&cfg.speed) {
        return Err(LiveAgentError::Config(format!(
            "speed must be from {} to {} (trace seconds per wall second), not {}",
            crate::live::server::SPEED_RANGE.start(),
            crate::live::server::SPEED_RANGE.end(),
            cfg.speed
        )));
    }
    if !(cfg.deadline_s.is_finite() && cfg.deadline_s > 0.0) {
        return Err(LiveAgentError::Config(format!("deadline_s must be a positive number, not {}", cfg.deadline_s)));
    }
    if cfg.deadline_s > MAX_DEADLINE_S {
        return Err(LiveAgentError::Config(format!(
            "deadline_s must be at most one year ({MAX_DEADLINE_S} s), not {}",
            cfg.deadline_s
        )));
    }
    let shared_tokens = trace.sessions.iter().map(|s| u64::from(s.system_tokens)).max().unwrap_or(0);
    if cfg.scheduler == SchedulerKind::Tao {
        let loads: Vec<ReplicaLoad> = replicas
            .iter()
            .map(|r| ReplicaLoad {
                kv_tokens: r.kv_tokens,
                admitted_tokens: 0,
                shared_tokens,
                requests: 0,
                active_blocks: 0,
            })
            .collect();
        let capacity = residual_capacities(&loads, cfg.tao.safe_fraction).into_iter().max().unwrap_or(0);
        for s in &trace.sessions {
            for k in 0..s.turns.len() {
                let weight =
                    u64::from(s.prompt_tokens(k)).saturating_sub(u64::from(s.system_tokens)) + cfg.tao.reserve_tokens;
                if weight > capacity {
                    return Err(LiveAgentError::TooLarge { session: s.id.clone(), turn: k, weight, capacity });
                }
            }
        }
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut shell = Shell {
        trace,
        cfg,
        start: Instant::now(),
        tx,
        tasks: JoinSet::new(),
        replicas: replicas
            .iter()
            .map(|r| ReplicaState {
                engine: Arc::clone(&r.engine),
                kv_tokens: r.kv_tokens,
                admitted: 0,
                peak_admitted: 0,
                requests: 0,
                active_blocks: 0,
                served_any: false,
            })
            .collect(),
        sessions: trace
            .sessions
            .iter()
            .map(|s| {
                SessionState::new(Conversation {
                    text: String::new(),
                    text_tokens: 0,
                    request: None,
                    outcome: SessionOutcome {
                        id: s.id.clone(),
                        completions: 0,
                        turns: Vec::new(),
                        tool_calls: 0,
                        latency_s: 0.0,
                    },
                })
            })
            .collect(),
        next_session: 0,
        open: 0,
        next_request: 0,
        rr: RoundRobin::default(),
        thunder: ThunderAgent::new().with_acting_decay(cfg.thunder_acting_decay),
        history: ToolHistory::new(),
        pending: None,
        plan_dirty: false,
        next_plan_id: 0,
        shared_tokens,
        pauses: 0,
        resumes: 0,
        holds: 0,
        retries: 0,
        wasted: WastedWork::default(),
        requests: 0,
        prompt_tokens: 0,
        cached_tokens: 0,
        last_end: 0.0,
        pred_err: Vec::new(),
        stats: LivePlannerStats::default(),
        age_sum: 0.0,
    };
    let result = shell.run(&mut rx).await;
    // Whatever is still in flight (a late solve, a tool of a failed run) is abandoned.
    shell.tasks.abort_all();
    result?;
    shell.report()
}

/// One engine call with retries of retryable errors (same replica, exponential backoff or the
/// server's `Retry-After`).
async fn call_engine(engine: Arc<dyn Engine>, request: LlmRequest, retries: u32) -> Answer {
    let mut attempts = 0;
    let mut wasted = WastedWork::default();
    loop {
        attempts += 1;
        let result = engine.submit(request.clone()).await;
        // The attempt's cost as far as its answer showed; counted only if it failed.
        let cost = request.meter.take();
        if result.is_err() {
            wasted.add_attempt(cost.prefilled, request.prompt_tokens, cost.output_tokens);
        }
        match result {
            Err(e) if e.retryable() && attempts <= retries => {
                let backoff = match &e {
                    EngineError::Overloaded { retry_after: Some(after), .. } => *after,
                    _ => RETRY_BACKOFF * 2u32.saturating_pow(attempts - 1),
                };
                tracing::debug!(request = request.id, error = %e, attempts, "agent turn retried");
                tokio::time::sleep(backoff).await;
            }
            result => return Answer { result, attempts, wasted },
        }
    }
}

impl Shell<'_> {
    /// Trace seconds since the start.
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * self.cfg.speed
    }

    fn wall(&self, trace_s: f64) -> Duration {
        Duration::try_from_secs_f64((trace_s / self.cfg.speed).max(0.0)).unwrap_or(Duration::MAX)
    }

    async fn run(&mut self, rx: &mut mpsc::UnboundedReceiver<Event>) -> Result<(), LiveAgentError> {
        let year = Duration::from_secs(86_400 * 365);
        let wait = Duration::try_from_secs_f64(self.cfg.deadline_s).unwrap_or(year).min(year);
        let deadline = self.start.checked_add(wait).unwrap_or(self.start);
        let period = if self.cfg.scheduler == SchedulerKind::ThunderAgent { THUNDER_PERIOD_S } else { TAO_PERIOD_S };
        let period = self.wall(period).clamp(Duration::from_millis(1), Duration::from_secs(3_600));
        let mut tick = tokio::time::interval_at(self.start + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for _ in 0..self.cfg.workers.min(self.trace.sessions.len()) {
            self.start_next_session()?;
        }
        self.after_event();
        while self.open > 0 || self.next_session < self.trace.sessions.len() {
            tokio::select! {
                ev = rx.recv() => {
                    // The shell holds a sender: the channel cannot close while it runs.
                    let Some(ev) = ev else { return Err(LiveAgentError::Internal("event channel closed".into())) };
                    self.handle(ev)?;
                }
                _ = tick.tick() => self.on_tick()?,
                Some(joined) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    if let Err(e) = joined {
                        return Err(LiveAgentError::Task(e.to_string()));
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(LiveAgentError::Deadline { deadline_s: self.cfg.deadline_s, open: self.open });
                }
            }
            self.after_event();
        }
        Ok(())
    }

    fn handle(&mut self, ev: Event) -> Result<(), LiveAgentError> {
        match ev {
            Event::Answered { session, request, replica, answer } => self.answered(session, request, replica, answer),
            Event::ToolReturned { session } => self.tool_returned(session),
            Event::Planned { id, result } => self.apply_plan(id, result),
        }
    }

    fn on_tick(&mut self) -> Result<(), LiveAgentError> {
        match self.cfg.scheduler {
            // Readiness moves with time: the next event replans.
            SchedulerKind::Tao => self.plan_dirty = true,
            SchedulerKind::ThunderAgent => self.thunder_step()?,
            _ => {}
        }
        Ok(())
    }

    /// After each event: TAO replans when something changed and no solve is in flight.
    fn after_event(&mut self) {
        if self.cfg.scheduler == SchedulerKind::Tao && self.plan_dirty && self.pending.is_none() {
            self.submit_plan();
        }
    }

    fn start_next_session(&mut self) -> Result<(), LiveAgentError> {
        let i = self.next_session;
        if i >= self.trace.sessions.len() {
            return Ok(());
        }
        self.next_session += 1;
        self.open += 1;
        let now = self.now();
        let system = self.trace.sessions[i].system_tokens;
        let seed = self.cfg.text_seed;
        let s = &mut self.sessions[i];
        s.started_at = now;
        s.ready_at = now;
        s.paused_at = now;
        s.shell.text = system_text(seed, system);
        s.shell.text_tokens = u64::from(system);
        s.phase = AgentPhase::Pooled { returned: true };
        self.request_ready(i)
    }

    /// Tokens of the prompt session `i`'s next request sends: its conversation plus the
    /// turn's new tokens.
    fn next_prompt(&self, i: usize) -> u64 {
        let st = &self.sessions[i];
        let new = self.trace.sessions[i].turns.get(st.turn).map_or(0, |t| t.new_tokens);
        st.shell.text_tokens + u64::from(new)
    }

    fn request_ready(&mut self, i: usize) -> Result<(), LiveAgentError> {
        match self.cfg.scheduler {
            SchedulerKind::RoundRobin | SchedulerKind::CacheAware | SchedulerKind::Dynamo => {
                let loads = self.loads();
                let req = self.route_request(i);
                let b = match self.cfg.scheduler {
                    SchedulerKind::RoundRobin => self.rr.route(&loads),
                    SchedulerKind::CacheAware => CacheAware.route(&req, &loads),
                    _ => DynamoRouter::default().route(&req, &loads),
                };
                self.dispatch(i, b)
            }
            SchedulerKind::ThunderAgent => {
                let tokens = self.next_prompt(i);
                let loads = self.loads();
                let backend = if self.sessions[i].call.is_none() {
                    self.thunder.arrive(i as u64, tokens, &loads)
                } else {
                    self.thunder.request(i as u64, tokens)
                };
                match backend {
                    Some(b) => self.dispatch(i, b),
                    None => {
                        self.sessions[i].phase = AgentPhase::Pooled { returned: true };
                        Ok(())
                    }
                }
            }
            SchedulerKind::Tao => {
                if let AgentPhase::Held { replica } = self.sessions[i].phase {
                    self.dispatch(i, replica)
                } else {
                    self.sessions[i].phase = AgentPhase::Pooled { returned: true };
                    self.plan_dirty = true;
                    Ok(())
                }
            }
        }
    }

    fn route_request(&self, i: usize) -> RouteRequest {
        let prompt = self.next_prompt(i);
        let system = u64::from(self.trace.sessions[i].system_tokens);
        let overlap_tokens = (0..self.replicas.len())
            .map(|b| {
                let own = self.sessions[i].indexed.iter().find(|(r, _)| *r == b).map(|&(_, t)| t).unwrap_or(0);
                let shared = if self.replicas[b].served_any { system } else { 0 };
                own.max(shared).min(prompt)
            })
            .collect();
        RouteRequest { session: i as u64, prompt_tokens: prompt, overlap_tokens }
    }

    fn loads(&self) -> Vec<ReplicaLoad> {
        self.replicas
            .iter()
            .map(|r| ReplicaLoad {
                kv_tokens: r.kv_tokens,
                admitted_tokens: r.admitted,
                shared_tokens: self.shared_tokens,
                requests: r.requests,
                active_blocks: r.active_blocks,
            })
            .collect()
    }

    fn admit(&mut self, b: usize, weight: u64) {
        let r = &mut self.replicas[b];
        r.admitted += weight;
        r.peak_admitted = r.peak_admitted.max(r.admitted);
    }

    /// Sends session `i`'s next turn to replica `b`.
    fn dispatch(&mut self, i: usize, b: usize) -> Result<(), LiveAgentError> {
        let now = self.now();
        let trace = self.trace;
        let turn = self.sessions[i].turn;
        let Some(spec) = trace.sessions[i].turns.get(turn) else {
            return Err(LiveAgentError::Internal(format!("session {i}: dispatch past its last turn {turn}")));
        };
        if !matches!(self.sessions[i].phase, AgentPhase::Pooled { .. } | AgentPhase::Held { .. }) {
            return Err(LiveAgentError::Internal(format!(
                "session {i}: dispatched while {:?}",
                self.sessions[i].phase
            )));
        }
        let weight = admission_weight(&self.pool_view(i), self.cfg.tao.reserve_tokens);
        // A held session's weight is already on its replica.
        if let AgentPhase::Held { replica } = self.sessions[i].phase {
            let held = self.sessions[i].weight;
            self.replicas[replica].admitted = self.replicas[replica].admitted.saturating_sub(held);
        }
        self.admit(b, weight);
        let st = &mut self.sessions[i];
        st.shell.text.push_str(&observation_text(self.cfg.text_seed, i, turn, spec.new_tokens));
        let prompt = st.shell.text.clone();
        // Counted, not tokenized: no tokenizer work on the event path (see `text_tokens`).
        st.shell.text_tokens += u64::from(spec.new_tokens);
        let prompt_tokens = u32::try_from(st.shell.text_tokens).unwrap_or(u32::MAX);
        let id = self.next_request;
        self.next_request += 1;
        let blocks = u64::from(prompt_tokens).div_ceil(BLOCK);
        st.weight = weight;
        st.phase = AgentPhase::Running { replica: b };
        st.signature += 1;
        st.shell.request = Some((id, now, blocks));
        if turn > 0 {
            self.resumes += 1;
        }
        let r = &mut self.replicas[b];
        r.served_any = true;
        r.requests += 1;
        r.active_blocks += blocks;
        let request = LlmRequest {
            id,
            model: self.cfg.model.clone(),
            prompt,
            prompt_tokens,
            max_tokens: spec.output_tokens,
            server_default_limit: false,
            emulated_output: Some(output_text(self.cfg.text_seed, i, turn, spec.output_tokens)),
            enable_thinking: false,
            stream: self.cfg.stream,
            deadline_s: None,
            messages: None,
            raw_prompt: true,
            tools: Vec::new(),
            tool_choice: None,
            parallel_tool_calls: None,
            stop: Vec::new(),
            response_format: None,
            sink: Default::default(),
            meter: Default::default(),
        };
        let engine = Arc::clone(&r.engine);
        let tx = self.tx.clone();
        let retries = self.cfg.retries;
        self.tasks.spawn(async move {
            let answer = call_engine(engine, request, retries).await;
            // The receiver outlives every task of the run, or the run already failed.
            let _ = tx.send(Event::Answered { session: i, request: id, replica: b, answer });
        });
        Ok(())
    }

    fn answered(&mut self, i: usize, id: u64, b: usize, answer: Answer) -> Result<(), LiveAgentError> {
        let now = self.now();
        let st = &mut self.sessions[i];
        let Some((expected, sent_at, blocks)) = st.shell.request.filter(|r| r.0 == id) else {
            return Err(LiveAgentError::Internal(format!("session {i}: answer to request {id} nobody waits for")));
        };
        if st.phase != (AgentPhase::Running { replica: b }) {
            return Err(LiveAgentError::Internal(format!(
                "session {i}: request {expected} answered while {:?}",
                st.phase
            )));
        }
        st.shell.request = None;
        let r = &mut self.replicas[b];
        r.requests = r.requests.saturating_sub(1);
        r.active_blocks = r.active_blocks.saturating_sub(blocks);
        self.retries += u64::from(answer.attempts.saturating_sub(1));
        self.wasted.add(&answer.wasted);
        let turn = st.turn;
        let c = answer.result.map_err(|source| LiveAgentError::Engine {
            session: self.trace.sessions[i].id.clone(),
            turn,
            replica: b,
            source,
        })?;
        self.requests += 1;
        self.prompt_tokens += u64::from(c.prompt_tokens);
        self.cached_tokens += u64::from(c.cached_prompt_tokens);
        let first_token_at = sent_at + c.ttft_s * self.cfg.speed;
        st.shell.outcome.turns.push(TurnOutcome {
            replica: b,
            prompt_tokens: c.prompt_tokens,
            cached_tokens: c.cached_prompt_tokens,
            output_tokens: c.output_tokens,
            ttft_s: first_token_at - st.ready_at,
            attempts: answer.attempts,
            sent_at_s: sent_at,
            finished_at_s: now,
        });
        // The answer joins the conversation as the engine returned it.
        st.shell.text.push_str(&c.text);
        st.shell.text_tokens += u64::from(c.output_tokens);
        self.request_finished(i, b, now, u64::from(c.prompt_tokens) + u64::from(c.output_tokens))
    }

    fn request_finished(&mut self, i: usize, b: usize, at: f64, context: u64) -> Result<(), LiveAgentError> {
        self.last_end = self.last_end.max(at);
        let weight = self.sessions[i].weight;
        self.replicas[b].admitted = self.replicas[b].admitted.saturating_sub(weight);
        let st = &mut self.sessions[i];
        st.weight = 0;
        st.signature += 1;
        // The engine now holds the conversation: a fresh cache observation there.
        st.cache.retain(|o| o.replica != b);
        st.cache.push(CacheObservation { replica: b, tokens: context, at });
        st.indexed.retain(|(r, _)| *r != b);
        st.indexed.push((b, context));
        let turn = st.turn;
        let trace = self.trace;
        match &trace.sessions[i].turns[turn].tool {
            None => {
                st.phase = AgentPhase::Done;
                st.shell.outcome.completions += 1;
                if st.shell.outcome.completions > 1 {
                    return Err(LiveAgentError::Internal(format!("session {i} completed twice")));
                }
                st.shell.outcome.latency_s = at - st.started_at;
                self.open -= 1;
                self.plan_dirty = true;
                self.thunder.release(i as u64);
                self.start_next_session()?;
            }
            Some(tool) => {
                let mut call = ToolCall::new(tool.name.clone(), at);
                if let Some(h) = tool.hint_s {
                    call = call.with_deadline(at + h);
                }
                call.refresh(&self.history, at);
                let predicted = call.remaining_s(&self.history, at);
                self.pred_err.push((predicted - tool.duration_s).abs());
                st.call = Some(call);
                st.tool_returned_at = None;
                st.turn += 1;
                st.phase = AgentPhase::Pooled { returned: false };
                st.paused_at = at;
                st.shell.outcome.tool_calls += 1;
                self.pauses += 1;
                self.plan_dirty = true;
                self.thunder.response_done(i as u64, context, at);
                let sleep = self.wall(tool.duration_s);
                let tx = self.tx.clone();
                // The tool runs here (a sandboxed tool in the real runtime; its trace
                // duration, scaled, in a replay).
                self.tasks.spawn(async move {
                    tokio::time::sleep(sleep).await;
                    let _ = tx.send(Event::ToolReturned { session: i });
                });
            }
        }
        Ok(())
    }

    fn tool_returned(&mut self, i: usize) -> Result<(), LiveAgentError> {
        let now = self.now();
        let st = &mut self.sessions[i];
        let waiting = matches!(st.phase, AgentPhase::Pooled { returned: false } | AgentPhase::Held { .. }) && st.tool_returned_at.is_none();
        let Some(call) = st.call.as_mut().filter(|c| waiting && c.completed_at.is_none()) else {
            return Err(LiveAgentError::Internal(format!("session {i}: a tool returned that nobody waits for")));
        };
        call.completed_at = Some(now);
        let elapsed = now - call.started_at;
        self.history.observe(&call.tool, elapsed)?;
        st.tool_returned_at = Some(now);
        st.ready_at = now;
        self.request_ready(i)
    }

    /// The scheduler's view of session `i` (not running).
    fn pool_view(&self, i: usize) -> PoolSession {
        self.sessions[i].pool_view(i, self.next_prompt(i), u64::from(self.trace.sessions[i].system_tokens))
    }

    fn tao_pool(&self) -> Vec<PoolSession> {
        (0..self.sessions.len()).filter(|&i| self.sessions[i].in_pool()).map(|i| self.pool_view(i)).collect()
    }

    /// Loads with the weights of running sessions only: holds are re-decided by each plan.
    fn running_loads(&self) -> Vec<ReplicaLoad> {
        without_holds(self.loads(), &self.sessions)
    }

    /// Snapshot the pool and solve it off the event path.
    fn submit_plan(&mut self) {
        self.plan_dirty = false;
        let now = self.now();
        // The predictor republishes its predictions for the calls still running.
        for st in &mut self.sessions {
            if matches!(st.phase, AgentPhase::Pooled { .. } | AgentPhase::Held { .. })
                && let Some(call) = &mut st.call
                && call.completed_at.is_none()
            {
                call.refresh(&self.history, now);
            }
        }
        let pool = self.tao_pool();
        if pool.is_empty() {
            return;
        }
        let quiescent = self.sessions.iter().all(|s| {
            !matches!(s.phase, AgentPhase::Running { .. } | AgentPhase::Held { .. } | AgentPhase::Pooled { returned: false })
        });
        let loads = self.running_loads();
        let history = self.history.clone();
        let opts = self.cfg.tao;
        let id = self.next_plan_id;
        self.next_plan_id += 1;
        self.stats.submissions += 1;
        self.pending = Some(PendingPlan { id, made_at: Instant::now(), quiescent });
        let tx = self.tx.clone();
        self.tasks.spawn(async move {
            let solved = tokio::task::spawn_blocking(move || tao_plan(&pool, &loads, &history, now, &opts)).await;
            let _ = tx.send(Event::Planned { id, result: solved.map_err(|e| e.to_string()) });
        });
    }

    fn apply_plan(&mut self, id: u64, result: Result<Result<Plan, TaoError>, String>) -> Result<(), LiveAgentError> {
        let Some(p) = self.pending.take_if(|p| p.id == id) else {
            return Err(LiveAgentError::Internal(format!("plan {id} arrived but none is pending under that id")));
        };
        let plan = result.map_err(LiveAgentError::Task)??;
        self.stats.applications += 1;
        self.stats.fallbacks += u64::from(plan.fallback);
        self.age_sum += p.made_at.elapsed().as_secs_f64();
        // Live state: sessions still between turns keep their signature; capacities without
        // the holds this plan replaces.
        let live = agent_session::revalidation_state(
            self.sessions.iter().enumerate(),
            self.replicas.len(),
            &self.running_loads(),
            self.cfg.tao.safe_fraction,
        );
        let applied = tao::revalidate(&plan, &live);
        if applied.discarded {
            self.stats.discarded += 1;
            self.plan_dirty = true;
            return Ok(());
        }
        self.stats.partial += u64::from(applied.partial);
        self.stats.nonempty_applications += u64::from(!applied.assignments.is_empty());
        if applied.assignments.is_empty() && p.quiescent {
            // Nothing ran, was held or waited on a tool at the snapshot, and nothing fits:
            // no later event can change that.
            let idle = self.sessions.iter().all(|s| !matches!(s.phase, AgentPhase::Running { .. } | AgentPhase::Held { .. }));
            if idle && self.open > 0 {
                return Err(LiveAgentError::Stalled { open: self.open });
            }
        }
        // Release every hold, then take the plan's (a hold kept on the same replica is not a
        // new one).
        let held_before: Vec<Option<usize>> = self
            .sessions
            .iter()
            .map(|s| match s.phase {
                AgentPhase::Held { replica } => Some(replica),
                _ => None,
            })
            .collect();
        let all = 0..self.sessions.len();
        for (replica, w) in agent_session::release_holds(&mut self.sessions, all) {
            self.replicas[replica].admitted = self.replicas[replica].admitted.saturating_sub(w);
        }
        for Assignment { session, replica, .. } in applied.assignments {
            let i = session as usize;
            if self.sessions[i].can_resume() {
                self.dispatch(i, replica)?;
            } else {
                let w = admission_weight(&self.pool_view(i), self.cfg.tao.reserve_tokens);
                self.sessions[i].hold(replica, w);
                self.admit(replica, w);
                self.holds += u64::from(held_before[i] != Some(replica));
            }
        }
        Ok(())
    }

    /// ThunderAgent's step: pause and resume programs against each backend's capacity.
    fn thunder_step(&mut self) -> Result<(), LiveAgentError> {
        let loads = self.loads();
        for (session, replica) in self.thunder.tick(&loads, self.now()) {
            let i = session as usize;
            if matches!(self.sessions[i].phase, AgentPhase::Pooled { returned: true }) {
                self.dispatch(i, replica)?;
            }
        }
        Ok(())
    }

    fn report(&self) -> Result<LiveAgentReport, LiveAgentError> {
        let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
        let outcomes: Vec<SessionOutcome> = self.sessions.iter().map(|s| s.shell.outcome.clone()).collect();
        if let Some(o) = outcomes.iter().find(|o| o.completions != 1) {
            return Err(LiveAgentError::Internal(format!("session {} completed {} times", o.id, o.completions)));
        }
        let latencies: Vec<f64> = outcomes.iter().map(|o| o.latency_s).collect();
        let ttfts: Vec<f64> = outcomes.iter().flat_map(|o| o.turns.iter().map(|t| t.ttft_s)).collect();
        let tool_calls = outcomes.iter().map(|o| u64::from(o.tool_calls)).sum();
        Ok(LiveAgentReport {
            scheduler: self.cfg.scheduler.name().to_string(),
            workers: self.cfg.workers,
            sessions: outcomes.len(),
            requests: self.requests,
            tool_calls,
            pauses: self.pauses,
            resumes: self.resumes,
            holds: self.holds,
            retries: self.retries,
            wasted: self.wasted,
            wall_s: self.start.elapsed().as_secs_f64(),
            makespan_s: self.last_end,
            mean_latency_s: mean(&latencies),
            mean_ttft_s: mean(&ttfts),
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            cache_hit_rate: if self.prompt_tokens > 0 {
                self.cached_tokens as f64 / self.prompt_tokens as f64
            } else {
                0.0
            },
            readiness_mae_s: (!self.pred_err.is_empty()).then(|| mean(&self.pred_err)),
            peak_admitted_tokens: self.replicas.iter().map(|r| r.peak_admitted).collect(),
            planner: LivePlannerStats {
                plan_age_mean_wall_s: self.age_sum / self.stats.applications.max(1) as f64,
                ..self.stats.clone()
            },
            outcomes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens;

    #[test]
    fn every_word_is_one_token_and_texts_concatenate_token_by_token() {
        for w in WORDS {
            assert_eq!(tokens::count(&format!(" {w}")), 1, "`{w}`");
        }
        let parts = [
            system_text(7, 160),
            observation_text(7, 3, 0, 97),
            output_text(7, 3, 0, 31),
            observation_text(7, 3, 1, 50),
        ];
        let mut text = String::new();
        let mut ids = Vec::new();
        for p in &parts {
            text.push_str(p);
            ids.extend_from_slice(&tokens::encode(p));
        }
        assert_eq!(tokens::encode(&text).to_vec(), ids);
        assert_eq!(ids.len(), 160 + 97 + 31 + 50);
        // Sessions diverge right after the shared system prompt.
        assert_ne!(observation_text(0, 1, 0, 8), observation_text(0, 2, 0, 8));
        assert_ne!(system_text(0, 8), system_text(1, 8));
    }
}
