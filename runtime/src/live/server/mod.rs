//! The `switchyard emulate` server: ONE emulated replica ([`EmulatedReplica`], the simulator's
//! ground truth) served on wall-clock time behind vLLM's HTTP API, so that the live runtime's
//! engines are exercised over real sockets (and, through the `vllm` engine's command template,
//! real child processes) on machines without GPUs, and so that vLLM clients see what a vLLM
//! server would do.
//!
//! Which vLLM it follows: vLLM 0.10.2 (the engine of paper 003; `/version` says so), with the
//! behaviour kept through 0.11–0.12 unless said otherwise:
//! - `POST /v1/completions`, `POST /v1/chat/completions` (`protocol.rs`: bodies, validation,
//!   vLLM's error body with the integer `code`): streaming (SSE, `data: [DONE]`, one chunk per
//!   token as the engine decodes it — for a client more than 64 tokens behind, the tokens it
//!   has not read merged into its next chunk, as vLLM's output collector merges deltas — a
//!   usage chunk with `stream_options.include_usage`) and
//!   not; `usage` with `prompt_tokens_details.cached_tokens`; a list of prompts in
//!   `/v1/completions` and `n > 1` run one engine request per (prompt, sample), choice index
//!   `prompt × n + sample` as vLLM numbers them (the n samples are identical: the emulated
//!   model is deterministic); `echo` prepends the prompt; `stop`, `stop_token_ids`,
//!   `include_stop_str_in_output`, `min_tokens`, `ignore_eos` shape the answer; `logprobs`,
//!   `top_logprobs`, `prompt_logprobs`, `suffix` and `best_of` are refused with a 400 naming
//!   the field (no token distribution is sampled, so there is nothing true to return);
//! - structured output (`response_format` of chat and completions: `json_object`, `json_schema`, checked as vLLM
//!   0.10.2's `ResponseFormat`): vLLM constrains the model by guided decoding; the emulated
//!   model writes the schema's instance (`protocol::ResponseFormat::text`: required
//!   properties valued by their schemas, local `$ref`s followed, a union's first non-null
//!   branch, strings from the last user message; `{"answer": …}` for `json_object`), which
//!   the engine generates token by token like any output (under `auto` no tool call is made
//!   then, as vLLM's format constrains the whole answer; a named or required call comes first);
//! - tool calling, as vLLM 0.10.2 launched with `--enable-auto-tool-choice
//!   --tool-call-parser hermes` (Qwen's setup for Qwen3): `tools` and `tool_choice` validated
//!   as vLLM's `check_tool_usage` does (400s in its words, `param` naming the field; tools
//!   without `tool_choice` mean `"auto"`), the tools rendered in the prompt by Qwen3's template
//!   (with `"none"` too, 0.10.2's default) as are earlier assistant tool calls (a message's
//!   `tool_calls`, arguments as JSON text or an object; a tool message's `tool_call_id` is
//!   accepted and ignored), so prompt tokens count them. THE EMULATED MODEL'S DECISION (there
//!   is no model; this is the emulation's rule, `protocol::ToolRequest::plan`): under `"auto"`
//!   it calls ONE tool, the first of `tools`, when the conversation's last message is a user
//!   message, and after a tool result answers in text (the filler) — one tool round per user
//!   turn, so an agent loop ends; `"required"` always calls the first tool, a named choice the
//!   named one, `"none"` never calls. Arguments: the function's `required` properties valued by
//!   their schemas (`protocol::tool_arguments`: strings are the last user message, cut to 64
//!   characters). The engine generates the call's text as Qwen3 writes it — `<tool_call>\n{"name":
//!   …, "arguments": {…}}\n</tool_call>` under `"auto"`, the arguments JSON alone for a named
//!   choice, `[{"name": …, "parameters": {…}}]` for `"required"` (vLLM's guided decoding) — so
//!   its tokens are the answer's generated tokens, and `max_tokens` or a stop can cut it; with
//!   thinking on, no thinking text precedes a call. The answer is read as vLLM reads it: an
//!   `"auto"` call becomes `message.tool_calls` (`id` `chatcmpl-tool-<32 hex>`, `arguments` as
//!   `json.dumps` writes them), `content` the text before `<tool_call>` or null,
//!   `finish_reason: "tool_calls"`; a cut `"auto"` call does not parse and comes back as content
//!   (`finish_reason: "length"`); a named or `"required"` call has `content: ""` and, not
//!   streamed, the engine's finish reason (`"stop"`; 0.10.2 sets `"tool_calls"` for auto calls
//!   only), streamed `"tool_calls"`; a cut `"required"` answer is vLLM's 400 (its output is no
//!   list of calls) when not streamed. Streamed, content before the call goes out as content
//!   deltas, the call as ONE delta `{"tool_calls": [{"index": 0, "id", "type": "function",
//!   "function": {"name", "arguments"}}]}` with the chunk of its last token (vLLM streams the
//!   arguments in fragments; one piece is valid OpenAI streaming too), no call for a cut one.
//!   Requests without tools are answered, timed and counted exactly as before;
//! - a client that disconnects aborts its request (vLLM's `abort_request` when the HTTP
//!   request is cancelled): it leaves the engine's queue or batch and frees its KV blocks;
//! - without `max_tokens`, a chat answer ends at the emulated model's end of sequence: the
//!   `switchyard` output's own length, or a filler of `protocol::FILLER_EOS_TOKENS` tokens,
//!   capped by the context (vLLM's default `max_tokens` = what the context leaves); a
//!   completion defaults to `max_tokens = 16` as vLLM's `CompletionRequest` does;
//! - `POST /tokenize`, `POST /detokenize` (vLLM's shapes, Qwen3's tokenizer), `GET|POST
//!   /ping`, `GET /version` (vLLM's `{"version"}` plus `"switchyard_emulate"`: the one server
//!   the live runtime sends emulated outputs to), `GET /v1/models`, `GET /health` (503 until
//!   the start-up load has finished), `GET /metrics` (`metrics.rs`); unknown paths and wrong
//!   methods answer FastAPI's JSON bodies (`{"detail": "Not Found"}`, 404; `{"detail": "Method
//!   Not Allowed"}`, 405), as vLLM's server does;
//! - sleep mode (dev mode endpoints, `docs/features/sleep_mode.md`): `POST /sleep?level=1|2`,
//!   `POST /wake_up[?tags=weights|kv_cache]`, `GET /is_sleeping`, `POST /collective_rpc`
//!   (`reload_weights` only). A sleep puts both memory tags (`weights`, `kv_cache`) to sleep;
//!   a wake with tags wakes only those (the first one pays the replica's whole wake time), and
//!   the replica serves, and `is_sleeping` turns false, only once both are awake (vLLM's
//!   executor keeps `is_sleeping` until `sleeping_tags` is empty). Requests in flight at a
//!   sleep: vLLM 0.10–0.12 do not guard this (the engine faults and every request ends with
//!   `finish_reason: "abort"`, vLLM issues #31618, #45520); the first release that documents it
//!   (0.17, `mode=abort|wait`) aborts them by default or, with `mode=wait`, lets them finish
//!   first. The emulator does what 0.17 documents: `mode=abort` (the default) ends them with
//!   `finish_reason: "abort"`, `mode=wait` drains them (new requests get 503 meanwhile).
//!   While not serving, the completion endpoints answer 503.
//!
//! Time: virtual (emulated) seconds = wall seconds × `speed`. A driver task runs the replica's
//! iteration loop as a discrete-event loop paced by the wall clock: an iteration that ends at
//! virtual time `e` is completed once the wall clock reaches `e / speed`, and the next one
//! starts at `e` (not at the late wake-up time), so timer slack delays answers but never
//! distorts the emulated timeline. A request arriving at wall time `w` enters the engine at
//! virtual time `w × speed`. Metrics in seconds are virtual.
//!
//! Outputs: the body's `"switchyard": {"output": "..."}` (sent by the live runtime's emulated
//! sessions, see `LlmRequest::emulated_output`), the emulated model's tool call (above) or a
//! deterministic filler; prompt and output
//! tokens are Qwen3 tokenizer tokens (`crate::tokens`; a chat request is rendered in Qwen3's
//! chat template, honouring `chat_template_kwargs.enable_thinking`), and prefix caching keys on
//! `tokens::block_hashes(ids, block_size)` like the simulator.
//!
//! Depends on the emulator crate, the predictor's spec catalogue, `crate::tokens` and the web
//! stack (axum, prometheus-client); it must not depend on the planner or the simulator.

mod metrics;
mod protocol;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use futures::{Stream, StreamExt};
use prometheus_client::registry::Registry;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use serde_json::{Value, json};
use switchyard_emulator::{
    EmulatedReplica, EmulatorError, EngineEvent, EngineRequest, ReplicaState, ServingConfig,
};
use switchyard_predictor::spec::{self, Dtype, SpecError};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::tokens;

pub use metrics::{E2E_BUCKETS, TOKEN_LATENCY_BUCKETS, TTFT_BUCKETS};
pub use protocol::{
    COMPLETIONS_DEFAULT_MAX_TOKENS, FILLER_EOS_TOKENS, render_chat_prompt,
};
use metrics::{FinishedRequest, Metrics};
use protocol::{
    ApiError, CallMode, ChatBody, Checked, CompletionBody, PromptField, Shaped, ToolChoice,
    ToolOutput,
};

/// Largest request body read (32 MiB: a prompt far past any served context, which then gets
/// vLLM's 400, still fits).
const MAX_BODY_BYTES: usize = 32 << 20;

/// Most iterations the driver completes while holding the lock before it yields to the
/// request handlers (only reached when the driver runs behind the wall clock).
const DRIVER_BATCH: usize = 64;

/// How often a draining sleep (`mode=wait`, or the end of an aborted batch's step) looks
/// whether the engine is idle, in wall time.
const DRAIN_POLL: Duration = Duration::from_millis(2);

/// vLLM's memory tags of sleep mode.
const SLEEP_TAGS: [&str; 2] = ["weights", "kv_cache"];

/// Options of `switchyard emulate`.
#[derive(Debug, Clone, PartialEq)]
pub struct EmulateConfig {
    /// Device catalogue name (`switchyard_predictor::spec::device`).
    pub device: String,
    /// Model catalogue name (`switchyard_predictor::spec::model`).
    pub model: String,
    pub dtype: Dtype,
    /// vLLM `--max-model-len`; `None` = the model's `max_position_embeddings` (vLLM's default).
    pub max_model_len: Option<u32>,
    /// vLLM `--gpu-memory-utilization`.
    pub gpu_memory_utilization: f64,
    /// vLLM `--max-num-seqs`.
    pub max_num_seqs: u32,
    /// Virtual seconds per wall second (> 0).
    pub speed: f64,
    /// Seed of the engine's timing noise.
    pub noise_seed: u64,
    /// vLLM `--served-model-name`; `None` = the model name.
    pub served_model_name: Option<String>,
    /// Fault injection: the fraction of completion requests answered with HTTP 500.
    pub fail_rate: f64,
    /// Fault injection: the fraction answered 200 with an unparsable body.
    pub garbage_rate: f64,
    /// Seed of the fault draws (one draw per completion request, in arrival order).
    pub fault_seed: u64,
}

impl EmulateConfig {
    /// vLLM's defaults (fp16, 90 % memory, 256 sequences), real time, no faults.
    pub fn new(device: impl Into<String>, model: impl Into<String>) -> Self {
        EmulateConfig {
            device: device.into(),
            model: model.into(),
            dtype: Dtype::Fp16,
            max_model_len: None,
            gpu_memory_utilization: 0.9,
            max_num_seqs: 256,
            speed: 1.0,
            noise_seed: 0,
            served_model_name: None,
            fail_rate: 0.0,
            garbage_rate: 0.0,
            fault_seed: 0,
        }
    }

    /// The model name clients must send.
    pub fn served_name(&self) -> &str {
        self.served_model_name.as_deref().unwrap_or(&self.model)
    }
}

/// Why the server could not start.
#[derive(Debug, Error)]
pub enum ServeError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// vLLM would refuse to start with this configuration (memory plan, dtype, flags).
    #[error(transparent)]
    Emulator(#[from] EmulatorError),
    #[error("invalid option --{field} {value}: {reason}")]
    InvalidOption {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A `--dtype` value [`parse_dtype`] does not know (lowercased as given).
    #[error("unknown dtype `{0}` (fp16/float16/half, bf16/bfloat16, fp32/float32, fp8)")]
    UnknownDtype(String),
}

/// The speeds (virtual seconds per wall second) the emulator runs at: from a thousandth (slow
/// motion) to a million. Outside it virtual times map to wall instants past what `Instant` can
/// hold (a speed of 1e-20) or to nothing measurable. A pool's `engine.speed` has the same
/// range (`engines::SPEED_RANGE`).
pub const SPEED_RANGE: std::ops::RangeInclusive<f64> = 1e-3..=1e6;

/// Virtual time = wall time since `epoch` × `speed`.
#[derive(Debug, Clone, Copy)]
struct Clock {
    epoch: Instant,
    speed: f64,
}

impl Clock {
    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * self.speed
    }

    /// The wall instant at which virtual time `v` is reached; one past what `Instant` can hold
    /// saturates a year after the epoch (never a panic).
    fn instant(&self, v: f64) -> Instant {
        const FAR: Duration = Duration::from_secs(365 * 24 * 3600);
        let wall = Duration::try_from_secs_f64((v / self.speed).max(0.0)).unwrap_or(FAR);
        self.epoch
            .checked_add(wall.min(FAR))
            .unwrap_or(self.epoch)
    }
}

/// What the driver tells a waiting request handler.
#[derive(Debug, Clone, PartialEq)]
enum Progress {
    FirstToken,
    /// More output tokens: one, or, for a handler [`MAX_UNREAD_REPORTS`] reports behind, all
    /// it has not read (see [`UnreadTokens`]).
    Tokens,
    Finished { cached_prompt_tokens: u32 },
    /// The engine aborted the request (a sleep with `mode=abort`).
    Aborted,
    Failed(String),
}

/// Most [`Progress::Tokens`] reports queued for one choice: past them a handler that does
/// not keep up (a client reading slowly, or not at all) gets its unread tokens merged into
/// one chunk, as vLLM's output collector merges the deltas its consumer has not taken.
const MAX_UNREAD_REPORTS: u32 = 64;

/// Output tokens one choice decoded that its handler has not read yet. The driver adds one per
/// iteration and queues a [`Progress::Tokens`] report while fewer than [`MAX_UNREAD_REPORTS`]
/// tokens are unread; each report the handler reads takes one token, or all but
/// `MAX_UNREAD_REPORTS − 1` of them when more are unread. So the reports queued are always
/// min(unread, `MAX_UNREAD_REPORTS`): a handler that keeps up sends one chunk per token, none
/// is left unread once the reports are read, and what a request keeps queued is bounded by its
/// choices, not by the tokens they generate (one report per token, unread by a client that
/// stopped reading, grew up to `max_tokens` × samples).
#[derive(Debug, Clone, Default)]
struct UnreadTokens(Arc<std::sync::atomic::AtomicU32>);

impl UnreadTokens {
    /// One more token; true when a report must be queued for it.
    fn add(&self) -> bool {
        self.0.fetch_add(1, std::sync::atomic::Ordering::AcqRel) < MAX_UNREAD_REPORTS
    }

    /// The tokens one report stands for, now read.
    fn take(&self) -> u32 {
        let unread = &self.0;
        let mut now = unread.load(std::sync::atomic::Ordering::Acquire);
        loop {
            let take = now.saturating_sub(MAX_UNREAD_REPORTS - 1).max(1).min(now);
            match unread.compare_exchange_weak(
                now,
                now - take,
                std::sync::atomic::Ordering::AcqRel,
                std::sync::atomic::Ordering::Acquire,
            ) {
                Ok(_) => return take,
                Err(actual) => now = actual,
            }
        }
    }
}

/// A request accepted by a handler, not yet submitted to the replica.
#[derive(Debug)]
struct Pending {
    request: EngineRequest,
    arrival: f64,
}

/// One engine request's handler-side state: where its progress goes, and what the metrics
/// need when it finishes.
#[derive(Debug)]
struct Waiter {
    /// The choice index within its HTTP request.
    index: usize,
    tx: mpsc::UnboundedSender<(usize, Progress)>,
    /// Tokens decoded and not yet read by the handler (shared with its [`Choice`]).
    unread: UnreadTokens,
    arrival: f64,
    scheduled: Option<f64>,
    first_token: Option<f64>,
    last_token: f64,
    prompt_tokens: u32,
    generated: u32,
    finish_reason: &'static str,
    max_tokens: Option<u32>,
    n: u32,
    first_sample: bool,
}

impl Waiter {
    fn finished(&self, reason: &'static str, at: f64) -> FinishedRequest {
        FinishedRequest {
            finish_reason: reason,
            arrival: self.arrival,
            scheduled: self.scheduled,
            first_token: self.first_token,
            finished: at,
            prompt_tokens: self.prompt_tokens,
            generation_tokens: self.generated,
            max_tokens: self.max_tokens,
            n: self.n,
            first_sample: self.first_sample,
        }
    }
}

/// Everything the driver and the handlers share under one lock.
#[derive(Debug)]
struct Core {
    replica: EmulatedReplica,
    /// The driver's virtual time: the end of the last completed event.
    cursor: f64,
    inbox: VecDeque<Pending>,
    waiters: BTreeMap<u64, Waiter>,
    next_id: u64,
    closing: bool,
    /// A sleep is draining or ending the requests in flight: no new request is accepted.
    pausing: bool,
    /// vLLM's `sleeping_tags`: the memory tags asleep (empty while awake).
    sleeping_tags: BTreeSet<&'static str>,
    /// Prefill tokens of the step in progress (for `vllm:iteration_tokens_total`).
    step_prefill: u64,
}

impl Core {
    /// Completes a lifecycle transition whose end time has passed.
    fn settle(&mut self, now: f64) {
        let until = match self.replica.state() {
            ReplicaState::Loading { until }
            | ReplicaState::Sleeping { until }
            | ReplicaState::Waking { until } => until,
            _ => return,
        };
        if until <= now && self.replica.finish_transition(until) {
            self.cursor = self.cursor.max(until);
        }
    }

    fn loaded(&self) -> bool {
        !matches!(
            self.replica.state(),
            ReplicaState::Cold | ReplicaState::Loading { .. }
        )
    }

    fn is_sleeping(&self) -> bool {
        !self.sleeping_tags.is_empty()
            || matches!(
                self.replica.state(),
                ReplicaState::Sleeping { .. } | ReplicaState::Asleep | ReplicaState::Waking { .. }
            )
    }

    fn busy(&self) -> bool {
        !self.inbox.is_empty() || self.replica.in_flight() > 0 || self.replica.in_iteration()
    }

    /// Why a new request cannot be served now, if it cannot.
    fn refusal(&self) -> Option<String> {
        if self.closing {
            return Some("the server is shutting down".into());
        }
        if self.pausing {
            return Some("the engine is pausing to sleep".into());
        }
        match self.replica.state() {
            ReplicaState::Awake if self.sleeping_tags.is_empty() => None,
            ReplicaState::Awake => Some(format!(
                "the model is sleeping ({} asleep)",
                self.sleeping_tags.iter().copied().collect::<Vec<_>>().join(", ")
            )),
            ReplicaState::Cold | ReplicaState::Loading { .. } => {
                Some("the model is still loading".into())
            }
            state => Some(format!("the model is sleeping ({state})")),
        }
    }

    /// Removes request `id` wherever it is (inbox or engine) and forgets its waiter; returns
    /// the waiter if it was still waiting.
    fn abort(&mut self, id: u64, now: f64) -> Option<Waiter> {
        let waiter = self.waiters.remove(&id)?;
        let queued = self.inbox.len();
        self.inbox.retain(|p| p.request.id != id);
        if self.inbox.len() == queued {
            let at = now.max(self.cursor);
            self.replica.abort(id, at);
        }
        Some(waiter)
    }
}

/// Seconds since the Unix epoch, now: what vLLM writes as `created` (its answers' and model
/// cards' `int(time.time())`, taken when each is made).
fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// State shared by the handlers and the driver.
#[derive(Debug)]
struct Shared {
    core: Arc<Mutex<Core>>,
    driver_wake: Notify,
    clock: Clock,
    served_name: String,
    model: String,
    max_model_len: u32,
    block_size: u32,
    metrics: Metrics,
    faults: Mutex<Faults>,
    filler: Vec<u32>,
}

#[derive(Debug)]
struct Faults {
    rng: ChaCha8Rng,
    fail_rate: f64,
    garbage_rate: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    None,
    Fail,
    Garbage,
}

impl Faults {
    fn draw(&mut self) -> Fault {
        if self.fail_rate <= 0.0 && self.garbage_rate <= 0.0 {
            return Fault::None;
        }
        let x: f64 = self.rng.random();
        if x < self.fail_rate {
            Fault::Fail
        } else if x < self.fail_rate + self.garbage_rate {
            Fault::Garbage
        } else {
            Fault::None
        }
    }
}

fn lock(core: &Mutex<Core>) -> MutexGuard<'_, Core> {
    // A handler that panicked while holding the lock leaves consistent data behind (every
    // mutation is a single replica call), so a poisoned lock is still usable.
    core.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Core> {
        lock(&self.core)
    }

    /// The core with pending transitions settled at the current virtual time.
    fn settled(&self) -> MutexGuard<'_, Core> {
        let mut core = self.lock();
        let now = self.clock.now();
        core.settle(now);
        core
    }
}

/// A running emulate server (in-process). Dropping it without [`shutdown`](Self::shutdown)
/// aborts the server task.
#[derive(Debug)]
pub struct EmulateServer {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

impl EmulateServer {
    /// Binds `addr` (port 0 picks a free port) and serves `config` in a background task.
    pub async fn start(config: EmulateConfig, addr: SocketAddr) -> Result<Self, ServeError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Io {
                context: format!("cannot bind {addr}"),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ServeError::Io {
            context: "cannot read the bound address".into(),
            source,
        })?;
        let app = EmulateApp::new(config)?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(app.serve(listener, async move {
            let _ = rx.await;
        }));
        Ok(EmulateServer {
            addr,
            shutdown: Some(tx),
            task: Some(task),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, fails the requests still in flight with 503, and waits for the task.
    pub async fn shutdown(mut self) -> Result<(), ServeError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(task) => task.await.unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl Drop for EmulateServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The emulate server before it is bound: validated configuration, replica, metrics.
#[derive(Debug)]
pub struct EmulateApp {
    shared: Arc<Shared>,
    registry: Arc<Registry>,
}

impl EmulateApp {
    /// Validates the options and builds the (cold) replica; fails where vLLM would refuse to
    /// start (unknown model or device, memory plan, bf16 on a V100, bad flags).
    pub fn new(config: EmulateConfig) -> Result<Self, ServeError> {
        let bad = |field, value: String, reason| ServeError::InvalidOption {
            field,
            value,
            reason,
        };
        if !(config.speed.is_finite() && config.speed > 0.0) {
            return Err(bad(
                "speed",
                config.speed.to_string(),
                "must be a positive number",
            ));
        }
        if !SPEED_RANGE.contains(&config.speed) {
            return Err(bad(
                "speed",
                config.speed.to_string(),
                "must be from 0.001 to 1000000 (virtual seconds per wall second)",
            ));
        }
        for (field, rate) in [
            ("fail-rate", config.fail_rate),
            ("garbage-rate", config.garbage_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(bad(field, rate.to_string(), "must be in [0, 1]"));
            }
        }
        if config.fail_rate + config.garbage_rate > 1.0 {
            return Err(bad(
                "garbage-rate",
                config.garbage_rate.to_string(),
                "fail-rate + garbage-rate must not exceed 1",
            ));
        }
        let device = spec::device(&config.device)?;
        let model = spec::model(&config.model)?;
        let max_model_len = match config.max_model_len {
            Some(n) => n,
            None => u32::try_from(model.max_position_embeddings).unwrap_or(u32::MAX),
        };
        let mut serving = ServingConfig::vllm_defaults_on(&device, config.dtype, max_model_len);
        serving.gpu_memory_utilization = config.gpu_memory_utilization;
        serving.max_num_seqs = config.max_num_seqs;
        serving.validate(&device, &model)?;
        let replica = EmulatedReplica::new(device, model, serving.clone(), config.noise_seed)?;
        let kv_blocks = replica.telemetry().kv_blocks_total;

        let served_name = config.served_name().to_string();
        let core = Arc::new(Mutex::new(Core {
            replica,
            cursor: 0.0,
            inbox: VecDeque::new(),
            waiters: BTreeMap::new(),
            next_id: 0,
            closing: false,
            pausing: false,
            sleeping_tags: BTreeSet::new(),
            step_prefill: 0,
        }));
        let metrics = Metrics::new(max_model_len);
        metrics.set_cache_config(&[
            ("block_size", serving.block_size.to_string()),
            ("cache_dtype", "auto".to_string()),
            ("enable_prefix_caching", python_bool(serving.enable_prefix_caching)),
            ("gpu_memory_utilization", serving.gpu_memory_utilization.to_string()),
            ("num_gpu_blocks", kv_blocks.to_string()),
            ("num_cpu_blocks", "0".to_string()),
            ("enable_sleep_mode", "True".to_string()),
        ]);
        let scrape_core = Arc::clone(&core);
        let registry = metrics.registry(
            &served_name,
            Arc::new(move || {
                let core = lock(&scrape_core);
                (core.replica.telemetry(), core.inbox.len())
            }),
        );
        let shared = Shared {
            core,
            driver_wake: Notify::new(),
            clock: Clock {
                epoch: Instant::now(),
                speed: config.speed,
            },
            served_name,
            model: config.model.clone(),
            max_model_len,
            block_size: serving.block_size,
            metrics,
            faults: Mutex::new(Faults {
                rng: ChaCha8Rng::seed_from_u64(config.fault_seed),
                fail_rate: config.fail_rate,
                garbage_rate: config.garbage_rate,
            }),
            filler: tokens::encode(protocol::FILLER_TEXT).to_vec(),
        };
        Ok(EmulateApp {
            shared: Arc::new(shared),
            registry: Arc::new(registry),
        })
    }

    /// The axum router (exposed for tests that drive it without a socket).
    pub fn router(&self) -> Router {
        let state = AppState {
            shared: Arc::clone(&self.shared),
            registry: Arc::clone(&self.registry),
        };
        Router::new()
            .route("/v1/completions", post(completions))
            .route("/v1/chat/completions", post(chat_completions))
            .route("/v1/models", get(models))
            .route("/health", get(health))
            .route("/ping", get(health).post(health))
            .route("/version", get(version))
            .route("/metrics", get(metrics))
            .route("/tokenize", post(tokenize))
            .route("/detokenize", post(detokenize))
            .route("/sleep", post(sleep))
            .route("/wake_up", post(wake_up))
            .route("/is_sleeping", get(is_sleeping))
            .route("/collective_rpc", post(collective_rpc))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            // vLLM reads any body; axum's default 2 MiB answered a long prompt 413 in plain text
            // where vLLM answers its JSON 400 (the prompt is past the context).
            .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(state)
    }

    /// Loads the replica (health turns 200 when done), runs the driver, and serves until
    /// `shutdown` resolves; then fails the requests in flight with 503 and returns.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let shared = Arc::clone(&self.shared);
        let driver = tokio::spawn(drive(Arc::clone(&shared)));
        let loader = tokio::spawn(load(Arc::clone(&shared)));
        let router = self.router();
        let closing = Arc::clone(&shared);
        // Streamed answers are several small writes: without TCP_NODELAY, Nagle's algorithm
        // and the client's delayed ACK add ~40 ms to every streamed request.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let result = axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                shutdown.await;
                close(&closing);
            })
            .await
            .map_err(|source| ServeError::Io {
                context: "HTTP server failed".into(),
                source,
            });
        driver.abort();
        loader.abort();
        result
    }
}

fn python_bool(b: bool) -> String {
    if b { "True" } else { "False" }.to_string()
}

/// Parses a `--dtype` value: ours (`fp16`, `bf16`, `fp32`, `fp8`) or vLLM's spelling
/// (`float16`/`half`, `bfloat16`, `float32`/`float`). vLLM's `auto` (the checkpoint's dtype)
/// is refused: the emulator needs an explicit one.
pub fn parse_dtype(text: &str) -> Result<Dtype, ServeError> {
    match text.to_ascii_lowercase().as_str() {
        "fp16" | "float16" | "half" => Ok(Dtype::Fp16),
        "bf16" | "bfloat16" => Ok(Dtype::Bf16),
        "fp32" | "float32" | "float" => Ok(Dtype::Fp32),
        "fp8" => Ok(Dtype::Fp8),
        other => Err(ServeError::UnknownDtype(other.to_string())),
    }
}

/// Runs the server on its own tokio runtime until SIGINT or SIGTERM (the `switchyard emulate`
/// command). `on_listening` is told the bound address before the start-up load begins.
pub fn run_blocking(
    config: EmulateConfig,
    addr: SocketAddr,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| ServeError::Io {
            context: "cannot start the async runtime".into(),
            source,
        })?;
    runtime.block_on(async move {
        let app = EmulateApp::new(config)?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Io {
                context: format!("cannot bind {addr}"),
                source,
            })?;
        let bound = listener.local_addr().map_err(|source| ServeError::Io {
            context: "cannot read the bound address".into(),
            source,
        })?;
        let mut terminate = tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        )
        .map_err(|source| ServeError::Io {
            context: "cannot install the SIGTERM handler".into(),
            source,
        })?;
        on_listening(bound);
        app.serve(listener, async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        })
        .await
    })
}

/// Fails everything in flight (the server is going away) and refuses new requests.
fn close(shared: &Shared) {
    let mut core = shared.lock();
    core.closing = true;
    core.inbox.clear();
    for (_, w) in std::mem::take(&mut core.waiters) {
        let _ = w.tx.send((
            w.index,
            Progress::Failed("the server is shutting down".into()),
        ));
    }
}

/// The start-up load: Cold → Loading → Awake after the model's load time (virtual).
async fn load(shared: Arc<Shared>) {
    let until = {
        let mut core = shared.lock();
        let now = shared.clock.now();
        match core.replica.begin_load(now) {
            Ok(until) => until,
            Err(_) => return,
        }
    };
    tokio::time::sleep_until(shared.clock.instant(until)).await;
    drop(shared.settled());
    shared.driver_wake.notify_one();
}

/// The iteration loop (see the module doc).
async fn drive(shared: Arc<Shared>) {
    enum Next {
        SleepUntil(f64),
        Idle,
        Yield,
    }
    loop {
        let next = {
            let mut guard = shared.lock();
            let core = &mut *guard;
            let now = shared.clock.now();
            core.settle(now);
            let mut done = 0usize;
            loop {
                if done >= DRIVER_BATCH {
                    break Next::Yield;
                }
                if let Some(end) = core.replica.iteration_end() {
                    if end > now {
                        break Next::SleepUntil(end);
                    }
                    let generated_before = core.replica.telemetry().generated_tokens;
                    let events = core.replica.finish_iteration(end);
                    let generated = core.replica.telemetry().generated_tokens - generated_before;
                    shared.metrics.iteration(core.step_prefill + generated);
                    core.step_prefill = 0;
                    // The requests that sampled a token in this step, past their first (counted
                    // with its event below): exactly those — not a decode a prefill-only step
                    // (vLLM V0's) left out, nor a request still recomputing after a preemption,
                    // which streams on from the step its recompute ends, as vLLM's does.
                    let Core { replica, waiters, .. } = &mut *core;
                    for id in replica.sampled() {
                        let Some(w) = waiters.get_mut(id) else { continue };
                        if w.first_token.is_none() {
                            continue;
                        }
                        shared.metrics.inter_token(end - w.last_token);
                        w.last_token = end;
                        w.generated += 1;
                        if w.unread.add() {
                            let _ = w.tx.send((w.index, Progress::Tokens));
                        }
                    }
                    core.cursor = core.cursor.max(end);
                    deliver(core, &shared, events);
                    done += 1;
                    continue;
                }
                // Idle engine: jump to the next arrival (never past the wall clock).
                if core.replica.in_flight() == 0
                    && let Some(front) = core.inbox.front()
                {
                    core.cursor = core.cursor.max(front.arrival.min(now));
                }
                admit(core);
                let cursor = core.cursor;
                let prefill_before = core.replica.telemetry().prefill_tokens;
                if core.replica.start_iteration(cursor).is_none() {
                    break Next::Idle;
                }
                core.step_prefill = core.replica.telemetry().prefill_tokens - prefill_before;
                let Core { replica, waiters, .. } = core;
                for (id, at) in replica.running_admissions() {
                    if let Some(w) = waiters.get_mut(&id)
                        && w.scheduled.is_none()
                    {
                        w.scheduled = Some(at);
                    }
                }
            }
        };
        match next {
            Next::SleepUntil(end) => tokio::time::sleep_until(shared.clock.instant(end)).await,
            Next::Idle => shared.driver_wake.notified().await,
            Next::Yield => tokio::task::yield_now().await,
        }
    }
}

/// Submits the inbox requests that arrived by the driver's cursor.
fn admit(core: &mut Core) {
    while core.inbox.front().is_some_and(|p| p.arrival <= core.cursor) {
        let Some(p) = core.inbox.pop_front() else {
            break;
        };
        let id = p.request.id;
        if let Err(e) = core.replica.submit(p.request, p.arrival)
            && let Some(w) = core.waiters.remove(&id)
        {
            let _ = w.tx.send((w.index, Progress::Failed(e.to_string())));
        }
    }
}

fn deliver(core: &mut Core, shared: &Shared, events: Vec<EngineEvent>) {
    for event in events {
        match event {
            EngineEvent::FirstToken { id, at } => {
                if let Some(w) = core.waiters.get_mut(&id) {
                    shared.metrics.first_token(at - w.arrival, w.prompt_tokens);
                    w.first_token = Some(at);
                    w.last_token = at;
                    w.generated = 1;
                    let _ = w.tx.send((w.index, Progress::FirstToken));
                }
            }
            EngineEvent::Finished {
                id,
                at,
                cached_prompt_tokens,
                output_tokens,
                ..
            } => {
                if let Some(mut w) = core.waiters.remove(&id) {
                    w.generated = output_tokens;
                    shared.metrics.finished(&w.finished(w.finish_reason, at));
                    let _ = w.tx.send((
                        w.index,
                        Progress::Finished {
                            cached_prompt_tokens,
                        },
                    ));
                }
            }
            // Recomputed (prompt and output so far): it streams on from the step its recompute
            // samples again (the driver's token loop reads the replica's sampled requests).
            EngineEvent::Preempted { .. } => {}
        }
    }
}

#[derive(Debug, Clone)]
struct AppState {
    shared: Arc<Shared>,
    registry: Arc<Registry>,
}

/// vLLM answers 404 for a model it does not serve.
fn check_model(shared: &Shared, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != shared.served_name => Err(ApiError::not_found(format!(
            "The model `{m}` does not exist."
        ))),
        _ => Ok(()),
    }
}

fn draw_fault(shared: &Shared) -> Fault {
    shared
        .faults
        .lock()
        .map(|mut f| f.draw())
        .unwrap_or(Fault::None)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Api {
    Completions,
    Chat,
}

/// One prompt of a request: its tokens and (for `echo`) its text.
struct PromptIn {
    ids: Vec<u32>,
    text: String,
}

/// Most engine requests (prompts × `n`) one HTTP request may enqueue: this emulator's own
/// bound, not vLLM's (which has none), so that one body cannot make the server allocate and
/// schedule billions of samples (`"n": 4000000000` fits the protocol's `u32`).
pub const MAX_SAMPLES_PER_REQUEST: usize = 4096;

fn check_samples(prompts: usize, n: u32) -> Result<(), ApiError> {
    match prompts.checked_mul(n as usize) {
        Some(total) if total <= MAX_SAMPLES_PER_REQUEST => Ok(()),
        _ => Err(ApiError::bad_param(
            "n",
            format!(
                "this emulated server runs at most {MAX_SAMPLES_PER_REQUEST} samples per request \
                 (prompts × n); got {prompts} × {n}."
            ),
        )),
    }
}

/// A validated request, ready for the engine.
struct Prepared {
    api: Api,
    prompts: Vec<PromptIn>,
    checked: Checked,
    /// `max_tokens` in effect (the client's, or the API's default).
    limit: u32,
    /// The output each prompt's choices generate, when given (the `switchyard` extension, a
    /// tool call, a response format's instance): one entry shared by every prompt, or one per
    /// prompt (a completions list under a response format, each instance from its own prompt).
    provided: Vec<Option<String>>,
    echo: bool,
    /// The request's `tool_choice` when it has tools: its answer is read for a tool call.
    tool_choice: Option<ToolChoice>,
}

fn context_error(shared: &Shared, prompt: usize, max_tokens: Option<u32>, param: &str) -> ApiError {
    let len = shared.max_model_len;
    match max_tokens {
        Some(m) => ApiError::bad_param(
            "max_tokens",
            format!(
                "This model's maximum context length is {len} tokens. However, you requested \
                 {} tokens ({prompt} in the messages, {m} in the completion). Please reduce the \
                 length of the messages or completion.",
                prompt as u64 + u64::from(m)
            ),
        ),
        None => ApiError::bad_param(
            param,
            format!(
                "This model's maximum context length is {len} tokens. However, your request has \
                 {prompt} input tokens. Please reduce the length of the input messages."
            ),
        ),
    }
}

async fn completions(State(state): State<AppState>, body: Bytes) -> Response {
    match prepare_completion(&state.shared, &body) {
        Ok(p) => run(&state.shared, p).await,
        Err(e) => e.into_response(),
    }
}

fn prepare_completion(shared: &Shared, body: &[u8]) -> Result<Prepared, ApiError> {
    let body: CompletionBody = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid completion request: {e}")))?;
    check_model(shared, body.sampling.model.as_deref())?;
    if body.suffix.is_some() {
        return Err(ApiError::bad_param("suffix", "suffix is not currently supported"));
    }
    if body.logprobs.is_some() {
        return Err(protocol::not_emulated("logprobs"));
    }
    if body.best_of.is_some_and(|b| b != body.sampling.n.unwrap_or(1)) {
        return Err(ApiError::bad_param(
            "best_of",
            "best_of is not supported by the emulated replica (vLLM's V1 engine has no best_of)",
        ));
    }
    let checked = body.sampling.check(body.sampling.max_tokens)?;
    let from_ids = |ids: Vec<u32>| PromptIn {
        text: tokens::decode(&ids),
        ids,
    };
    let from_text = |t: String| PromptIn {
        ids: tokens::encode(&t).to_vec(),
        text: t,
    };
    // As vLLM's input processor: a token id outside the vocabulary is the client's error (ids
    // the server made from text are its own).
    let known = |ids: &[u32]| match ids.iter().find(|&&id| !tokens::is_token(id)) {
        Some(id) => Err(ApiError::bad_param("prompt", format!("Token id {id} is out of vocabulary"))),
        None => Ok(()),
    };
    let prompts: Vec<PromptIn> = match body.prompt {
        PromptField::Text(t) => vec![from_text(t)],
        PromptField::Texts(ts) => ts.into_iter().map(from_text).collect(),
        PromptField::Ids(ids) => {
            known(&ids)?;
            vec![from_ids(ids)]
        }
        PromptField::IdLists(ls) => {
            ls.iter().try_for_each(|l| known(l))?;
            ls.into_iter().map(from_ids).collect()
        }
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_param("prompt", "Prompt must not be empty."));
    }
    let limit = checked.max_tokens.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS);
    for p in &prompts {
        if p.ids.is_empty() {
            return Err(ApiError::bad_param("prompt", "The prompt is empty."));
        }
        if p.ids.len() as u64 + u64::from(limit) > u64::from(shared.max_model_len) {
            return Err(context_error(shared, p.ids.len(), Some(limit), "prompt"));
        }
    }
    min_tokens_within(&checked, limit)?;
    check_samples(prompts.len(), checked.n)?;
    // Structured output (vLLM's completions take `response_format` too): the schema's instance,
    // its strings from each prompt.
    let format = protocol::check_response_format(body.response_format)?;
    let provided = match (body.sampling.switchyard.and_then(|s| s.output), format) {
        (Some(output), _) => vec![Some(output)],
        (None, Some(format)) => prompts
            .iter()
            .map(|p| {
                let turn = tokens::ChatTurn { role: "user".into(), content: p.text.clone(), tool_calls: Vec::new() };
                Some(format.text(std::slice::from_ref(&turn)))
            })
            .collect(),
        (None, None) => vec![None],
    };
    Ok(Prepared {
        api: Api::Completions,
        prompts,
        limit,
        provided,
        echo: body.echo.unwrap_or(false),
        checked,
        tool_choice: None,
    })
}

async fn chat_completions(State(state): State<AppState>, body: Bytes) -> Response {
    match prepare_chat(&state.shared, &body) {
        Ok(p) => run(&state.shared, p).await,
        Err(e) => e.into_response(),
    }
}

/// A chat request: its messages rendered with Qwen3's chat template (tool definitions and
/// earlier tool calls included), and, when it has tools, the emulated model's tool call.
///
/// The emulated model's decision (there is no model: this is the emulation's rule, see
/// [`protocol::ToolRequest::plan`]): with `tool_choice` `"auto"` it calls ONE tool, the first
/// of `tools`, when the last message is a user message, and answers in text (the filler)
/// after a tool result — one tool round per user turn, so an agent loop ends; `"required"`
/// always calls the first tool, a named choice the named one, `"none"` never calls. The call's
/// text as Qwen3 writes it ([`protocol::PlannedCall::text`]) is the output the engine
/// generates, token for token, shaped by `max_tokens` and the stop conditions like any output;
/// a request's `switchyard` output, when it has one, is the output instead (and is read for a
/// call all the same).
fn prepare_chat(shared: &Shared, body: &[u8]) -> Result<Prepared, ApiError> {
    let body: ChatBody = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid chat completion request: {e}")))?;
    check_model(shared, body.sampling.model.as_deref())?;
    if body.messages.is_empty() {
        return Err(ApiError::bad_param("messages", "messages must not be empty"));
    }
    if body.logprobs == Some(true) {
        return Err(protocol::not_emulated("logprobs"));
    }
    if body.top_logprobs.is_some() {
        return Err(protocol::not_emulated("top_logprobs"));
    }
    let checked = body
        .sampling
        .check(body.max_completion_tokens.or(body.sampling.max_tokens))?;
    let tools = protocol::check_tools(body.tools, body.tool_choice)?;
    let format = protocol::check_response_format(body.response_format)?;
    protocol::check_message_tool_calls(&body.messages)?;
    let turns: Vec<tokens::ChatTurn> = body.messages.into_iter().map(|m| m.into_turn()).collect();
    // Qwen3's template thinks unless told otherwise, as vLLM renders it.
    let enable_thinking = body
        .chat_template_kwargs
        .and_then(|k| k.enable_thinking)
        .unwrap_or(true);
    let tool_defs = tools.as_ref().map_or(&[][..], |t| t.tools.as_slice());
    let text = render_chat_prompt(&turns, tool_defs, enable_thinking, true);
    let ids = tokens::encode(&text).to_vec();
    let len = shared.max_model_len as usize;
    let limit = match checked.max_tokens {
        Some(m) if ids.len() as u64 + u64::from(m) > len as u64 => {
            return Err(context_error(shared, ids.len(), Some(m), "messages"));
        }
        Some(m) => m,
        None if ids.len() >= len => return Err(context_error(shared, ids.len(), None, "messages")),
        None => (len - ids.len()) as u32,
    };
    min_tokens_within(&checked, limit)?;
    check_samples(1, checked.n)?;
    let provided = body
        .sampling
        .switchyard
        .and_then(|s| s.output)
        // Under a JSON format, vLLM 0.10.2 (no reasoning parser) constrains the whole answer to
        // it: an `auto` tool call cannot be written then (only a named or required choice,
        // itself guided, overrides the format).
        .or_else(|| {
            tools
                .as_ref()
                .filter(|t| format.is_none() || !matches!(t.choice, ToolChoice::Auto))
                .and_then(|t| t.plan(&turns))
                .map(|call| call.text())
        })
        .or_else(|| format.map(|f| f.text(&turns)));
    Ok(Prepared {
        api: Api::Chat,
        prompts: vec![PromptIn { ids, text }],
        limit,
        provided: vec![provided],
        echo: false,
        checked,
        tool_choice: tools.map(|t| t.choice),
    })
}

/// `min_tokens` against the limit in force — the client's `max_tokens`, else the default (16
/// for completions, what the context leaves for chat) — as vLLM's sampling parameters check it.
fn min_tokens_within(checked: &protocol::Checked, limit: u32) -> Result<(), ApiError> {
    if checked.min_tokens > limit {
        return Err(ApiError::bad_param(
            "min_tokens",
            format!("min_tokens must be less than or equal to max_tokens={limit}, got {}.", checked.min_tokens),
        ));
    }
    Ok(())
}

/// The engine requests of one HTTP request still in flight: dropping it (the client went
/// away, the handler's future or the response stream is dropped) aborts them, as vLLM aborts
/// a request whose HTTP connection closes.
struct InFlight {
    shared: Arc<Shared>,
    ids: Vec<u64>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut core = self.shared.lock();
        let now = self.shared.clock.now();
        let mut aborted = false;
        for &id in &self.ids {
            aborted |= core.abort(id, now).is_some();
        }
        drop(core);
        if aborted {
            self.shared.driver_wake.notify_one();
        }
    }
}

/// Enqueues one engine request per (prompt, sample) and answers.
async fn run(shared: &Arc<Shared>, p: Prepared) -> Response {
    let stream = p.checked.stream;
    match draw_fault(shared) {
        Fault::None => {}
        Fault::Fail => {
            return ApiError::internal("injected fault (--fail-rate)").into_response();
        }
        Fault::Garbage => return garbage(stream),
    }
    let n = p.checked.n as usize;
    let mut choices = Vec::with_capacity(p.prompts.len() * n);
    // An answer is shaped once per distinct provided output (one for the whole request unless
    // each prompt has its own), shared by every sample (n samples of a long answer held n copies
    // of it), and each prompt's blocks hashed once, outside the core's lock. A request with
    // tools is a chat: one prompt, one answer.
    let shape = |provided: Option<&str>| Arc::new(protocol::shape(provided, &shared.filler, p.limit, &p.checked));
    let answers: Vec<Arc<Shaped>> = p.provided.iter().map(|provided| shape(provided.as_deref())).collect();
    // One entry serves every prompt; none (never built so) is the filler's answer.
    let fallback = answers.last().cloned().unwrap_or_else(|| shape(None));
    let answer_of = |prompt_idx: usize| answers.get(prompt_idx).cloned().unwrap_or_else(|| Arc::clone(&fallback));
    let tool_answer = p.tool_choice.as_ref().map(|choice| Arc::new(ToolAnswer::read(choice, &answer_of(0), stream)));
    let prefix_hashes: Vec<Arc<Vec<u64>>> =
        p.prompts.iter().map(|prompt| Arc::new(tokens::block_hashes(&prompt.ids, shared.block_size as usize))).collect();
    for (prompt_idx, prompt) in p.prompts.iter().enumerate() {
        for _ in 0..n {
            choices.push(Choice {
                index: choices.len(),
                prompt_idx,
                prompt_tokens: prompt.ids.len() as u32,
                echo: p.echo.then(|| prompt.text.clone()),
                shaped: answer_of(prompt_idx),
                cursor: TokenCursor::default(),
                unread: UnreadTokens::default(),
                started: false,
                end: None,
                cached: 0,
                tools: tool_answer.as_ref().map(|answer| ChoiceTools::new(Arc::clone(answer))),
            });
        }
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let ids = {
        let mut core = shared.settled();
        if let Some(why) = core.refusal() {
            return ApiError::unavailable(why).into_response();
        }
        let arrival = shared.clock.now().max(core.cursor);
        let mut ids = Vec::with_capacity(choices.len());
        for c in &choices {
            let id = core.next_id;
            core.next_id += 1;
            core.waiters.insert(
                id,
                Waiter {
                    index: c.index,
                    tx: tx.clone(),
                    unread: c.unread.clone(),
                    arrival,
                    scheduled: None,
                    first_token: None,
                    last_token: arrival,
                    prompt_tokens: c.prompt_tokens,
                    generated: 0,
                    finish_reason: c.shaped.finish_reason,
                    max_tokens: p.checked.max_tokens,
                    n: p.checked.n,
                    first_sample: c.index % n == 0,
                },
            );
            core.inbox.push_back(Pending {
                request: EngineRequest {
                    id,
                    prompt_tokens: c.prompt_tokens,
                    prefix_hashes: prefix_hashes[c.prompt_idx].as_ref().clone(),
                    generated_hashes: Vec::new(),
                    output_tokens: c.shaped.generated.max(1),
                },
                arrival,
            });
            ids.push(id);
        }
        ids
    };
    shared.driver_wake.notify_one();
    let first = ids.first().copied().unwrap_or(0);
    let answer = Answer {
        id: match p.api {
            Api::Completions => format!("cmpl-{first}"),
            Api::Chat => format!("chatcmpl-{first}"),
        },
        api: p.api,
        // vLLM stamps each answer with the time of its request (`int(time.time())`).
        created: unix_now(),
        model: shared.served_name.clone(),
        include_usage: p.checked.include_usage,
        choices,
        _in_flight: InFlight {
            shared: Arc::clone(shared),
            ids,
        },
    };
    if stream {
        Sse::new(answer.stream(rx)).into_response()
    } else {
        answer.wait(rx).await
    }
}

/// An injected unparsable answer with status 200.
fn garbage(stream: bool) -> Response {
    if stream {
        let events = futures::stream::iter([
            Ok::<_, Infallible>(Event::default().data("{\"id\": \"cmpl-garbage\", \"choices\": [")),
            Ok(Event::default().data("[DONE]")),
        ]);
        Sse::new(events).into_response()
    } else {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            "{\"id\": \"cmpl-garbage\", \"choices\": [{\"text\": ",
        )
            .into_response()
    }
}

/// How a choice ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum End {
    Finished,
    Aborted,
}

/// The answer of a request with tools, as vLLM reads it: the generated text read for a tool
/// call ([`protocol::read_tool_output`]), and where the call is complete.
#[derive(Debug)]
struct ToolAnswer {
    output: ToolOutput,
    /// Tokens generated once the call's text is complete: its stream delta goes out with the
    /// chunk of that token.
    call_tokens: usize,
    stream: bool,
}

impl ToolAnswer {
    fn read(choice: &ToolChoice, shaped: &Shaped, stream: bool) -> Self {
        let output = protocol::read_tool_output(choice, &shaped.text);
        let call_tokens = match &output {
            ToolOutput::Call { call_end, .. } => shaped.tokens_through(*call_end),
            ToolOutput::Text | ToolOutput::Unparsed(_) => 0,
        };
        ToolAnswer {
            output,
            call_tokens,
            stream,
        }
    }

    /// The bytes of the text that are the message's content: the text before an `auto` call,
    /// none of a named or `required` one's (or of a `required` answer that did not parse),
    /// all of a text answer.
    fn content_end(&self) -> usize {
        match &self.output {
            ToolOutput::Text => usize::MAX,
            ToolOutput::Call { content_end, .. } => *content_end,
            ToolOutput::Unparsed(_) => 0,
        }
    }

    /// vLLM 0.10.2's finish reason: `tool_calls` for an `auto` call; for a named or `required`
    /// call `tool_calls` when streamed (its `tools_streamed`), the engine's reason when not
    /// (`chat_completion_full_generator` sets `tool_calls` for auto calls only).
    fn finish_reason(&self, engine: &'static str) -> &'static str {
        match &self.output {
            ToolOutput::Call { mode: CallMode::Auto, .. } => "tool_calls",
            ToolOutput::Call { .. } if self.stream => "tool_calls",
            _ => engine,
        }
    }
}

/// A choice's side of a [`ToolAnswer`]: its call's id and how far its stream got.
#[derive(Debug)]
struct ChoiceTools {
    answer: Arc<ToolAnswer>,
    /// vLLM's `make_tool_call_id()`: `chatcmpl-tool-` and 32 random hex digits.
    call_id: String,
    /// The call's delta was streamed.
    call_sent: bool,
    /// Bytes of the text handed to the stream's chunks so far.
    streamed: usize,
}

impl ChoiceTools {
    fn new(answer: Arc<ToolAnswer>) -> Self {
        ChoiceTools {
            answer,
            call_id: format!("chatcmpl-tool-{:032x}", rand::random::<u128>()),
            call_sent: false,
            streamed: 0,
        }
    }

    /// The call as a message's `tool_calls` item.
    fn call_json(&self) -> Option<Value> {
        match &self.answer.output {
            ToolOutput::Call { call, .. } => Some(json!({
                "id": self.call_id,
                "type": "function",
                "function": { "name": call.name, "arguments": call.arguments },
            })),
            ToolOutput::Text | ToolOutput::Unparsed(_) => None,
        }
    }
}

/// One choice of an answer: its shaped output and how far it got.
struct Choice {
    index: usize,
    prompt_idx: usize,
    prompt_tokens: u32,
    /// The prompt text, sent before the answer (`echo`).
    echo: Option<String>,
    shaped: Arc<Shaped>,
    cursor: TokenCursor,
    /// Tokens the engine decoded for it that are not yet read (shared with its [`Waiter`]).
    unread: UnreadTokens,
    /// A chunk of it was sent.
    started: bool,
    end: Option<End>,
    cached: u32,
    /// The request has tools: how its answer reads as a tool call.
    tools: Option<ChoiceTools>,
}

impl Choice {
    fn advance(&mut self) -> Option<String> {
        self.cursor.next_piece(&self.shaped.ids, &self.shaped.text)
    }

    /// The text that a progress report of decoded tokens adds: one token for
    /// [`Progress::FirstToken`], every unread one for [`Progress::Tokens`]; `None` when they
    /// lie past the text's last token.
    fn advance_by(&mut self, p: &Progress) -> Option<String> {
        let tokens = match p {
            Progress::FirstToken => 1,
            Progress::Tokens => self.unread.take(),
            _ => 0,
        };
        let mut text: Option<String> = None;
        for _ in 0..tokens {
            match self.advance() {
                Some(piece) => text.get_or_insert_with(String::new).push_str(&piece),
                None => break,
            }
        }
        text
    }

    /// The answer's text (the part decoded by an abort).
    fn text(&self) -> &str {
        match self.end {
            Some(End::Aborted) => self.shaped.text.get(..self.cursor.sent).unwrap_or_default(),
            _ => &self.shaped.text,
        }
    }

    fn completion_tokens(&self) -> u32 {
        match self.end {
            Some(End::Aborted) => self.cursor.tokens as u32,
            _ => self.shaped.generated,
        }
    }

    fn finish_reason(&self) -> &'static str {
        match (self.end, &self.tools) {
            (Some(End::Aborted), _) => "abort",
            (_, Some(tools)) => tools.answer.finish_reason(self.shaped.finish_reason),
            (_, None) => self.shaped.finish_reason,
        }
    }

    /// Whether the tokens of its tool call's text have all been generated.
    fn call_complete(&self) -> bool {
        let Some(tools) = &self.tools else { return false };
        matches!(tools.answer.output, ToolOutput::Call { .. })
            && (self.end == Some(End::Finished) || self.cursor.tokens >= tools.answer.call_tokens)
    }

    /// The chat message of a non-streamed answer: `content` alone without tools; with tools,
    /// also `tool_calls` (empty for a text answer), the content being the text before an
    /// `auto` call (null when empty) or `""` for a named or `required` one, as vLLM's. A
    /// `required` answer that is no list of calls is vLLM's 400.
    fn chat_message(&self) -> Result<Value, ApiError> {
        let text = self.text();
        let Some(tools) = &self.tools else {
            return Ok(json!({ "role": "assistant", "content": text }));
        };
        let (content, calls) = match &tools.answer.output {
            ToolOutput::Unparsed(why) if self.end != Some(End::Aborted) => {
                return Err(ApiError::bad_request(why.clone()));
            }
            ToolOutput::Text | ToolOutput::Unparsed(_) => (json!(text), Vec::new()),
            ToolOutput::Call { mode, content_end, .. } => {
                let content = match mode {
                    CallMode::Auto => {
                        let before = text.get(..(*content_end).min(text.len())).unwrap_or_default();
                        if before.is_empty() { Value::Null } else { json!(before) }
                    }
                    CallMode::Named | CallMode::Required => json!(""),
                };
                let calls = if self.call_complete() { tools.call_json().into_iter().collect() } else { Vec::new() };
                (content, calls)
            }
        };
        Ok(json!({ "role": "assistant", "content": content, "tool_calls": calls }))
    }

    /// The stream deltas of `piece` (the text's next bytes) for a choice with tools: the part
    /// that is content (before an `auto` call), then the call as ONE delta
    /// (`{"tool_calls": [{"index": 0, "id", "type": "function", "function": {"name",
    /// "arguments"}}]}`) once its last token is generated — vLLM streams the arguments in
    /// fragments; one piece is valid OpenAI streaming too. When `finish`, at least one delta
    /// (an empty content) to carry the finish reason.
    fn tool_deltas(&mut self, piece: &str, finish: bool) -> Vec<Value> {
        let complete = self.call_complete();
        let Some(tools) = self.tools.as_mut() else { return Vec::new() };
        let start = tools.streamed;
        tools.streamed += piece.len();
        let mut deltas = Vec::with_capacity(2);
        let shown = tools.answer.content_end().saturating_sub(start).min(piece.len());
        if let Some(content) = piece.get(..shown).filter(|c| !c.is_empty()) {
            deltas.push(json!({ "content": content }));
        }
        if complete
            && !tools.call_sent
            && let Some(call) = tools.call_json()
        {
            tools.call_sent = true;
            let mut delta = call;
            delta["index"] = json!(0);
            deltas.push(json!({ "tool_calls": [delta] }));
        }
        if finish && deltas.is_empty() {
            deltas.push(json!({ "content": "" }));
        }
        deltas
    }

    fn stop_reason(&self) -> Value {
        match self.end {
            Some(End::Aborted) => Value::Null,
            _ => self.shaped.stop_reason.clone(),
        }
    }
}

/// What a request answers, as its choices progress.
struct Answer {
    id: String,
    api: Api,
    created: u64,
    model: String,
    include_usage: bool,
    choices: Vec<Choice>,
    /// Aborts the engine requests still running when the answer is dropped.
    _in_flight: InFlight,
}

impl Answer {
    /// vLLM's usage: prompt tokens (and cached ones) once per prompt, completion tokens of
    /// every choice.
    fn usage(&self) -> Value {
        let mut prompt = 0u32;
        let mut cached = 0u32;
        let mut seen = BTreeSet::new();
        for c in &self.choices {
            if seen.insert(c.prompt_idx) {
                prompt += c.prompt_tokens;
                cached += c.cached;
            }
        }
        let completion: u32 = self.choices.iter().map(Choice::completion_tokens).sum();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": { "cached_tokens": cached },
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Completions, _) => "text_completion",
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
        }
    }

    fn all_ended(&self) -> bool {
        self.choices.iter().all(|c| c.end.is_some())
    }

    /// Applies one progress report; `Err` when the request failed.
    fn apply(&mut self, i: usize, p: &Progress) -> Result<(), String> {
        let Some(c) = self.choices.get_mut(i) else {
            return Ok(());
        };
        match p {
            Progress::FirstToken | Progress::Tokens => {}
            Progress::Finished {
                cached_prompt_tokens,
            } => {
                c.cached = *cached_prompt_tokens;
                c.end = Some(End::Finished);
            }
            Progress::Aborted => c.end = Some(End::Aborted),
            Progress::Failed(reason) => return Err(reason.clone()),
        }
        Ok(())
    }

    async fn wait(mut self, mut rx: mpsc::UnboundedReceiver<(usize, Progress)>) -> Response {
        while !self.all_ended() {
            let Some((i, p)) = rx.recv().await else {
                return ApiError::unavailable("the engine dropped the request").into_response();
            };
            if let Some(c) = self.choices.get_mut(i) {
                c.advance_by(&p);
            }
            if let Err(reason) = self.apply(i, &p) {
                return ApiError::unavailable(reason).into_response();
            }
        }
        match self.full() {
            Ok(body) => Json(body).into_response(),
            Err(e) => e.into_response(),
        }
    }

    /// The non-streamed answer; `Err` where vLLM cannot read a choice's output (a
    /// `required` tool choice's answer that is no list of calls).
    fn full(&self) -> Result<Value, ApiError> {
        let choices = self
            .choices
            .iter()
            .map(|c| {
                Ok(match self.api {
                    Api::Completions => json!({
                        "index": c.index,
                        "text": format!("{}{}", c.echo.as_deref().unwrap_or(""), c.text()),
                        "logprobs": null,
                        "finish_reason": c.finish_reason(),
                        "stop_reason": c.stop_reason(),
                    }),
                    Api::Chat => json!({
                        "index": c.index,
                        "message": c.chat_message()?,
                        "logprobs": null,
                        "finish_reason": c.finish_reason(),
                        "stop_reason": c.stop_reason(),
                    }),
                })
            })
            .collect::<Result<Vec<Value>, ApiError>>()?;
        Ok(json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        }))
    }

    /// One chunk of choice `i`: `piece` (after the echoed prompt on its first chunk), with
    /// its finish reason when it ends. A chat choice's first chunk is preceded by one carrying
    /// only the role (`delta: {"role": "assistant", "content": ""}`), as vLLM sends it.
    fn chunk(&mut self, i: usize, piece: &str, finish: bool) -> Vec<Event> {
        let api = self.api;
        let Some(c) = self.choices.get_mut(i) else { return Vec::new() };
        let first = !c.started;
        c.started = true;
        let text = match (&c.echo, first) {
            (Some(e), true) => format!("{e}{piece}"),
            _ => piece.to_string(),
        };
        let (finish_reason, stop_reason) = if finish {
            (json!(c.finish_reason()), c.stop_reason())
        } else {
            (Value::Null, Value::Null)
        };
        let mut choices = Vec::with_capacity(2);
        match api {
            Api::Completions => choices.push(json!({
                "index": c.index,
                "text": text,
                "logprobs": null,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
            })),
            Api::Chat => {
                if first {
                    choices.push(json!({ "index": c.index, "delta": { "role": "assistant", "content": "" },
                                         "logprobs": null, "finish_reason": null }));
                }
                if c.tools.is_some() {
                    // Content before a tool call, the call, the finish on the last of them.
                    let deltas = c.tool_deltas(&text, finish);
                    let last = deltas.len();
                    for (k, delta) in deltas.into_iter().enumerate() {
                        let (finish_reason, stop_reason) = if k + 1 == last {
                            (finish_reason.clone(), stop_reason.clone())
                        } else {
                            (Value::Null, Value::Null)
                        };
                        choices.push(json!({ "index": c.index, "delta": delta, "logprobs": null,
                                             "finish_reason": finish_reason, "stop_reason": stop_reason }));
                    }
                } else {
                    choices.push(json!({ "index": c.index, "delta": { "content": text }, "logprobs": null,
                                         "finish_reason": finish_reason, "stop_reason": stop_reason }));
                }
            }
        }
        choices
            .into_iter()
            .map(|choice| {
                let data = json!({
                    "id": self.id,
                    "object": self.object(true),
                    "created": self.created,
                    "model": self.model,
                    "choices": [choice],
                });
                Event::default().data(data.to_string())
            })
            .collect()
    }

    /// Choice `i` ended (`end`: finished or aborted): its last chunk — `sent_before` (a piece
    /// read but not yet sent), the rest of its text, and its finish reason — or why it has no
    /// answer.
    fn end_chunk(&mut self, i: usize, end: &Progress, sent_before: &str) -> Result<Vec<Event>, String> {
        self.apply(i, end)?;
        let rest = self.choices.get(i).map(|c| c.text().get(c.cursor.sent..).unwrap_or_default().to_string()).unwrap_or_default();
        Ok(self.chunk(i, &format!("{sent_before}{rest}"), true))
    }

    /// A stream: one chunk per decoded token of each choice at the engine's pace while the
    /// client keeps up (past [`MAX_UNREAD_REPORTS`] unread tokens, those go out together in its
    /// next chunk; a token
    /// that ends inside a multi-byte character waits for the rest of it), the rest of a
    /// choice's text with its finish reason when it ends, then (all ended) the usage chunk
    /// and `[DONE]`. Dropping the stream (the client went away) aborts what still runs.
    fn stream(
        self,
        rx: mpsc::UnboundedReceiver<(usize, Progress)>,
    ) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
        futures::stream::unfold(
            (self, rx, false, None::<(usize, Progress)>),
            |(mut answer, mut rx, done, mut ahead)| async move {
                if done {
                    return None;
                }
                loop {
                    let (i, p) = match ahead.take() {
                        Some(next) => next,
                        None => rx.recv().await?,
                    };
                    let mut events = Vec::new();
                    match &p {
                        Progress::FirstToken | Progress::Tokens => {
                            let Some(c) = answer.choices.get_mut(i) else {
                                continue;
                            };
                            let first = !c.started;
                            let Some(piece) = c.advance_by(&p) else {
                                continue;
                            };
                            if piece.is_empty() && !first {
                                continue;
                            }
                            // A choice's last token and its end come from one engine step: as
                            // vLLM's, one chunk carries both (not an empty chunk after it).
                            match rx.try_recv() {
                                Ok((j, end @ (Progress::Finished { .. } | Progress::Aborted))) if j == i => {
                                    match answer.end_chunk(i, &end, &piece) {
                                        Ok(chunk) => events.extend(chunk),
                                        Err(reason) => return Some((stream_error(reason), (answer, rx, true, None))),
                                    }
                                }
                                Ok(other) => {
                                    ahead = Some(other);
                                    events.extend(answer.chunk(i, &piece, false));
                                }
                                Err(_) => events.extend(answer.chunk(i, &piece, false)),
                            }
                        }
                        Progress::Finished { .. } | Progress::Aborted => match answer.end_chunk(i, &p, "") {
                            Ok(chunk) => events.extend(chunk),
                            Err(reason) => return Some((stream_error(reason), (answer, rx, true, None))),
                        },
                        Progress::Failed(reason) => return Some((stream_error(reason.clone()), (answer, rx, true, None))),
                    }
                    let ended = answer.all_ended();
                    if ended {
                        if answer.include_usage {
                            let usage = json!({
                                "id": answer.id,
                                "object": answer.object(true),
                                "created": answer.created,
                                "model": answer.model,
                                "choices": [],
                                "usage": answer.usage(),
                            });
                            events.push(Event::default().data(usage.to_string()));
                        }
                        events.push(Event::default().data("[DONE]"));
                    }
                    return Some((events, (answer, rx, ended, ahead)));
                }
            },
        )
        .flat_map(|events| futures::stream::iter(events.into_iter().map(Ok)))
    }
}

/// A stream that ends without its answer: the error event, then `[DONE]` all the same, as
/// vLLM's generators end.
fn stream_error(reason: String) -> Vec<Event> {
    vec![Event::default().data(ApiError::unavailable(reason).body().to_string()), Event::default().data("[DONE]")]
}

/// How far a stream got through its answer: tokens decoded, bytes of text sent, and the bytes
/// of a character still incomplete.
#[derive(Debug, Default)]
struct TokenCursor {
    tokens: usize,
    sent: usize,
    pending: Vec<u8>,
}

impl TokenCursor {
    /// The text the next decoded token adds (empty while a character is incomplete); `None`
    /// past the text's last token (the rest, if any, goes with the finish).
    fn next_piece(&mut self, ids: &[u32], text: &str) -> Option<String> {
        let id = *ids.get(self.tokens)?;
        self.tokens += 1;
        self.pending.extend_from_slice(&tokens::decode_bytes(&[id]));
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) => e.valid_up_to(),
        };
        let piece = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        // Only what really continues the text is sent (the text is what the answer says).
        if !text.get(self.sent..).is_some_and(|rest| rest.starts_with(&piece)) {
            return Some(String::new());
        }
        self.pending.drain(..valid);
        self.sent += piece.len();
        Some(piece)
    }
}

/// The vLLM release whose API and behaviour the emulator follows (paper 003's engine).
pub const EMULATED_VLLM_VERSION: &str = "0.10.2";

/// `GET /version`: vLLM's `{"version": …}`, plus `switchyard_emulate` (this crate's version):
/// how the live runtime's engines know they talk to an emulator, the only server that is sent
/// the emulated output.
async fn version() -> Response {
    Json(serde_json::json!({
        "version": EMULATED_VLLM_VERSION,
        "switchyard_emulate": env!("CARGO_PKG_VERSION"),
    }))
    .into_response()
}

async fn models(State(state): State<AppState>) -> Response {
    let s = &state.shared;
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.served_name,
            "object": "model",
            "created": unix_now(),
            "owned_by": "vllm",
            "root": s.model,
            "parent": null,
            "max_model_len": s.max_model_len,
        }]
    }))
    .into_response()
}

/// `GET /health`, and `GET|POST /ping` (SageMaker's health check, the same answer in vLLM).
async fn health(State(state): State<AppState>) -> Response {
    let core = state.shared.settled();
    if core.loaded() && !core.closing {
        StatusCode::OK.into_response()
    } else {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    drop(state.shared.settled());
    let mut body = String::new();
    match prometheus_client::encoding::prometheus_text::encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            )],
            body,
        )
            .into_response(),
        Err(_) => ApiError::internal("cannot encode metrics").into_response(),
    }
}

/// `POST /tokenize`: vLLM's `TokenizeCompletionRequest` (`prompt`) or `TokenizeChatRequest`
/// (`messages` and `tools`, rendered with Qwen3's chat template) → `{count, max_model_len, tokens,
/// token_strs}` (`token_strs` with `return_token_strs`, in the byte-level BPE spelling).
async fn tokenize(State(state): State<AppState>, body: Bytes) -> Response {
    let shared = &state.shared;
    let result = (|| {
        let body: protocol::TokenizeBody = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("invalid tokenize request: {e}")))?;
        check_model(shared, body.model.as_deref())?;
        let ids: Vec<u32> = match (body.prompt, body.messages) {
            (Some(p), None) => tokens::encode(&p).to_vec(),
            (None, Some(messages)) => {
                let tools = protocol::check_tool_list(body.tools)?;
                let turns: Vec<tokens::ChatTurn> = messages.into_iter().map(|m| m.into_turn()).collect();
                let thinking = body
                    .chat_template_kwargs
                    .and_then(|k| k.enable_thinking)
                    .unwrap_or(true);
                let text = render_chat_prompt(
                    &turns,
                    &tools,
                    thinking,
                    body.add_generation_prompt.unwrap_or(true),
                );
                tokens::encode(&text).to_vec()
            }
            _ => {
                return Err(ApiError::bad_request(
                    "a tokenize request has either `prompt` or `messages`",
                ));
            }
        };
        let token_strs = body.return_token_strs.unwrap_or(false).then(|| {
            ids.iter()
                .map(|&id| protocol::token_str(&tokens::decode_bytes(&[id])))
                .collect::<Vec<_>>()
        });
        Ok(json!({
            "count": ids.len(),
            "max_model_len": shared.max_model_len,
            "tokens": ids,
            "token_strs": token_strs,
        }))
    })();
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /detokenize`: `{tokens}` → `{prompt}`; an id outside the vocabulary is a 400.
async fn detokenize(State(state): State<AppState>, body: Bytes) -> Response {
    let shared = &state.shared;
    let result = (|| {
        let body: protocol::DetokenizeBody = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("invalid detokenize request: {e}")))?;
        check_model(shared, body.model.as_deref())?;
        let mut ids = Vec::with_capacity(body.tokens.len());
        for t in body.tokens {
            match u32::try_from(t) {
                Ok(id) if !tokens::decode_bytes(&[id]).is_empty() => ids.push(id),
                _ => {
                    return Err(ApiError::bad_param(
                        "tokens",
                        format!("token id {t} is out of vocabulary"),
                    ));
                }
            }
        }
        Ok(json!({ "prompt": tokens::decode(&ids) }))
    })();
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Unknown path: FastAPI's 404 body, as vLLM's server answers.
async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, Json(json!({ "detail": "Not Found" }))).into_response()
}

/// Known path, wrong method: FastAPI's 405 body.
async fn method_not_allowed() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        Json(json!({ "detail": "Method Not Allowed" })),
    )
        .into_response()
}

/// The `key=value` pairs of a query string (repeated keys kept, as FastAPI's `getlist`).
fn query_pairs(raw: Option<&str>) -> Vec<(String, String)> {
    raw.unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (kv.to_string(), String::new()),
        })
        .collect()
}

fn conflict(message: impl Into<String>) -> Response {
    ApiError::new(StatusCode::CONFLICT, "ConflictError", message).into_response()
}

/// How a sleep treats the requests in flight (vLLM ≥ 0.17's `mode`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum SleepMode {
    Abort,
    Wait,
}

/// `POST /sleep?level=1|2[&mode=abort|wait]` (see the module doc).
async fn sleep(State(state): State<AppState>, RawQuery(raw): RawQuery) -> Response {
    run_to_the_end(state, raw, sleep_transition).await
}

/// Runs a lifecycle transition (`/sleep`, `/wake_up`) in a task of its own: a client that hangs
/// up mid-transition drops the handler, not the transition — as in vLLM, whose engine call runs
/// to its end whatever the HTTP connection does. (Dropped with the handler, an abandoned wake
/// left the replica awake but reporting `is_sleeping` and refusing requests until the next
/// wake, and an abandoned `mode=wait` drain cancelled the sleep.)
async fn run_to_the_end<F, Fut>(state: AppState, raw: Option<String>, transition: F) -> Response
where
    F: FnOnce(Arc<Shared>, Option<String>) -> Fut,
    Fut: std::future::Future<Output = Response> + Send + 'static,
{
    match tokio::spawn(transition(state.shared, raw)).await {
        Ok(response) => response,
        Err(e) => ApiError::unavailable(format!("the transition failed: {e}")).into_response(),
    }
}

async fn sleep_transition(shared: Arc<Shared>, raw: Option<String>) -> Response {
    let shared = &*shared;
    let mut level = 1u8;
    let mut mode = SleepMode::Abort;
    for (k, v) in query_pairs(raw.as_deref()) {
        match k.as_str() {
            "level" => match v.parse() {
                Ok(l) => level = l,
                Err(_) => {
                    return ApiError::bad_param("level", format!("invalid sleep level `{v}`"))
                        .into_response();
                }
            },
            "mode" => match v.as_str() {
                "abort" => mode = SleepMode::Abort,
                "wait" => mode = SleepMode::Wait,
                _ => {
                    return ApiError::bad_param(
                        "mode",
                        format!("sleep mode `{v}` is not emulated (abort, wait)"),
                    )
                    .into_response();
                }
            },
            "tags" => {
                return ApiError::bad_param(
                    "tags",
                    "the emulated replica sleeps by level only (sleeping by tags is not emulated)",
                )
                .into_response();
            }
            _ => {}
        }
    }
    if !matches!(level, 1 | 2) {
        return ApiError::bad_param("level", EmulatorError::InvalidSleepLevel(level).to_string())
            .into_response();
    }
    // A wake under way ends first, so the last call wins (it would read as "already asleep").
    if let Err(stopped) = wait_while(shared, |core| matches!(core.replica.state(), ReplicaState::Waking { .. })).await {
        return stopped;
    }
    {
        let mut core = shared.settled();
        if core.is_sleeping() {
            // vLLM: "Executor is already sleeping" — a no-op.
            return StatusCode::OK.into_response();
        }
        if core.pausing {
            return conflict("a sleep is already in progress");
        }
        match core.replica.state() {
            ReplicaState::Awake => {}
            state => return conflict(format!("cannot sleep while {state}")),
        }
        core.pausing = true;
        if mode == SleepMode::Abort {
            let now = shared.clock.now();
            let ids: Vec<u64> = core.waiters.keys().copied().collect();
            for id in ids {
                if let Some(w) = core.abort(id, now) {
                    let at = now.max(core.cursor);
                    shared.metrics.finished(&w.finished("abort", at));
                    let _ = w.tx.send((w.index, Progress::Aborted));
                }
            }
        }
    }
    shared.driver_wake.notify_one();
    // This runs in a task of its own (`run_to_the_end`): a client that goes away does not drop it.
    // Should it be dropped all the same (the runtime shutting down), the pause ends with it, or
    // every later request would be refused as "pausing" while `/health` says 200.
    let mut pausing = EndPauseOnDrop(Some(shared));
    // Drain: the requests (wait) or the step in progress (abort) end first.
    let until = loop {
        {
            let mut core = shared.settled();
            if core.closing {
                core.pausing = false;
                pausing.disarm();
                return ApiError::unavailable("the server is shutting down").into_response();
            }
            if !core.busy() {
                let at = shared.clock.now().max(core.cursor);
                let result = core.replica.begin_sleep(level, at);
                core.pausing = false;
                // The pause ended here, under the lock: the guard must not end a later one.
                pausing.disarm();
                match result {
                    Ok(until) => {
                        core.sleeping_tags = SLEEP_TAGS.into_iter().collect();
                        break until;
                    }
                    Err(e @ EmulatorError::InvalidSleepLevel(_)) => {
                        return ApiError::bad_param("level", e.to_string()).into_response();
                    }
                    Err(e) => return conflict(e.to_string()),
                }
            }
        }
        tokio::time::sleep(DRAIN_POLL).await;
    };
    finish_transition(shared, until).await
}

/// Waits (polling every [`DRAIN_POLL`]) while `busy` holds of the replica: another lifecycle
/// call's transition. `Err` (503) when the server shuts down meanwhile.
async fn wait_while(shared: &Shared, busy: impl Fn(&Core) -> bool) -> Result<(), Response> {
    loop {
        {
            let core = shared.settled();
            if core.closing {
                return Err(ApiError::unavailable("the server is shutting down").into_response());
            }
            if !busy(&core) {
                return Ok(());
            }
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

/// Ends a sleep's pause (`Core::pausing`) if dropped armed: the `/sleep` handler's drain was
/// cut short.
struct EndPauseOnDrop<'a>(Option<&'a Shared>);

impl EndPauseOnDrop<'_> {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for EndPauseOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(shared) = self.0 {
            shared.settled().pausing = false;
            shared.driver_wake.notify_one();
        }
    }
}

async fn finish_transition(shared: &Shared, until: f64) -> Response {
    tokio::time::sleep_until(shared.clock.instant(until)).await;
    drop(shared.settled());
    shared.driver_wake.notify_one();
    StatusCode::OK.into_response()
}

/// `POST /wake_up[?tags=weights|kv_cache ...]`: wakes the tags asked for (all without tags).
/// A tag that is not asleep makes the call a no-op, as vLLM 0.10's executor does. The first
/// wake of a sleeping replica takes the replica's whole wake time; the replica serves once no
/// tag sleeps.
async fn wake_up(State(state): State<AppState>, RawQuery(raw): RawQuery) -> Response {
    run_to_the_end(state, raw, wake_transition).await
}

async fn wake_transition(shared: Arc<Shared>, raw: Option<String>) -> Response {
    let shared = &*shared;
    let tags: Vec<String> = query_pairs(raw.as_deref())
        .into_iter()
        .filter(|(k, _)| k == "tags")
        .map(|(_, v)| v)
        .collect();
    // A sleep under way (its drain, or falling asleep) ends first, so the last call wins: a
    // wake during a drain was a no-op, and the replica then slept after it.
    let falling_asleep = |core: &Core| core.pausing || matches!(core.replica.state(), ReplicaState::Sleeping { .. });
    if let Err(stopped) = wait_while(shared, falling_asleep).await {
        return stopped;
    }
    let until = {
        let mut core = shared.settled();
        if !core.is_sleeping() {
            return StatusCode::OK.into_response();
        }
        if tags.iter().any(|t| !core.sleeping_tags.contains(t.as_str())) {
            return StatusCode::OK.into_response();
        }
        match core.replica.state() {
            ReplicaState::Awake => None,
            ReplicaState::Waking { until } => Some(until),
            ReplicaState::Asleep => {
                let at = shared.clock.now().max(core.cursor);
                match core.replica.begin_wake(at) {
                    Ok(until) => Some(until),
                    Err(e) => return conflict(e.to_string()),
                }
            }
            state => return conflict(format!("cannot wake while {state}")),
        }
    };
    if let Some(until) = until {
        tokio::time::sleep_until(shared.clock.instant(until)).await;
    }
    {
        let mut core = shared.settled();
        if tags.is_empty() {
            core.sleeping_tags.clear();
        } else {
            core.sleeping_tags.retain(|t| !tags.iter().any(|x| x == t));
        }
    }
    shared.driver_wake.notify_one();
    StatusCode::OK.into_response()
}

async fn is_sleeping(State(state): State<AppState>) -> Response {
    let sleeping = state.shared.settled().is_sleeping();
    Json(json!({ "is_sleeping": sleeping })).into_response()
}

#[derive(Debug, Deserialize)]
struct RpcBody {
    method: String,
}

/// Only `reload_weights` (step two of vLLM's level-2 wake sequence) is known: the emulated
/// wake already restored the weights, so it is a no-op.
async fn collective_rpc(body: Bytes) -> Response {
    match serde_json::from_slice::<RpcBody>(&body) {
        Ok(b) if b.method == "reload_weights" => Json(json!({ "results": [null] })).into_response(),
        Ok(b) => ApiError::bad_param(
            "method",
            format!("collective_rpc method `{}` is not emulated", b.method),
        )
        .into_response(),
        Err(e) => ApiError::bad_request(format!("invalid collective_rpc body: {e}")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_sends_the_text_token_by_token_and_whole_characters_only() {
        for text in ["The plan ships on Friday.", "naïve café — 東京 🚀 done", ""] {
            let ids = tokens::encode(text).to_vec();
            let mut cursor = TokenCursor::default();
            let mut pieces = Vec::new();
            while let Some(piece) = cursor.next_piece(&ids, text) {
                assert!(std::str::from_utf8(piece.as_bytes()).is_ok());
                pieces.push(piece);
            }
            assert_eq!(pieces.len(), ids.len(), "one step per token");
            assert_eq!(pieces.concat(), text, "the pieces are the text");
            assert_eq!(text.get(cursor.sent..), Some(""));
        }
        // A token split inside a multi-byte character: the first half sends nothing.
        let text = "🚀";
        let ids = tokens::encode(text).to_vec();
        if ids.len() > 1 {
            let mut cursor = TokenCursor::default();
            assert_eq!(cursor.next_piece(&ids, text).as_deref(), Some(""));
        }
    }

    /// A client that stops reading does not make the server queue a report per token: past
    /// `MAX_UNREAD_REPORTS` the unread tokens are read together, as one piece of the text, in
    /// order; a reader that keeps up gets one report per token.
    #[test]
    fn unread_tokens_are_bounded_in_reports_and_read_in_order() {
        let text = "naïve café — 東京 🚀 done, and the plan ships on Friday. ".repeat(40);
        let ids = tokens::encode(&text).to_vec();
        assert!(ids.len() > 4 * MAX_UNREAD_REPORTS as usize);
        let shaped = Arc::new(Shaped {
            generated: ids.len() as u32,
            ids: ids.clone(),
            text: text.clone(),
            finish_reason: "length",
            stop_reason: Value::Null,
        });
        let choice = || Choice {
            index: 0,
            prompt_idx: 0,
            prompt_tokens: 1,
            echo: None,
            shaped: Arc::clone(&shaped),
            cursor: TokenCursor::default(),
            unread: UnreadTokens::default(),
            started: false,
            end: None,
            cached: 0,
            tools: None,
        };
        // The driver's side, as `drive` does it: the first token, then one per iteration.
        let decode = |c: &Choice, tx: &mpsc::UnboundedSender<(usize, Progress)>, tokens: usize| {
            for _ in 0..tokens {
                if c.unread.add() {
                    tx.send((0, Progress::Tokens)).expect("send");
                }
            }
        };
        let drain = |rx: &mut mpsc::UnboundedReceiver<(usize, Progress)>| {
            let mut reports = Vec::new();
            while let Ok((_, p)) = rx.try_recv() {
                reports.push(p);
            }
            reports
        };

        // Nobody reads while the whole answer decodes.
        let mut slow = choice();
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send((0, Progress::FirstToken)).expect("send");
        decode(&slow, &tx, ids.len() - 1);
        let reports = drain(&mut rx);
        assert_eq!(reports.len(), 1 + MAX_UNREAD_REPORTS as usize, "bounded, not one per token");
        let pieces: Vec<String> = reports.iter().map(|p| slow.advance_by(p).expect("within the text")).collect();
        assert_eq!(pieces.concat(), text, "every token read, in order");
        assert_eq!(slow.cursor.tokens, ids.len());
        assert_eq!(slow.unread.take(), 0, "nothing left unread once the reports are read");

        // A reader that keeps up: one report and one token per iteration.
        let mut live = choice();
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send((0, Progress::FirstToken)).expect("send");
        let mut read = live.advance_by(&drain(&mut rx)[0]).expect("first token");
        for _ in 1..ids.len() {
            decode(&live, &tx, 1);
            let reports = drain(&mut rx);
            assert_eq!(reports, vec![Progress::Tokens]);
            let before = live.cursor.tokens;
            read.push_str(&live.advance_by(&reports[0]).expect("within the text"));
            assert_eq!(live.cursor.tokens, before + 1);
        }
        assert_eq!(read, text);
        // A token past the text's last one adds nothing (the rest goes with the finish).
        assert!(live.unread.add());
        assert_eq!(live.advance_by(&Progress::Tokens), None);
    }

    #[test]
    fn dtype_names_of_both_vocabularies() {
        assert_eq!(parse_dtype("float16").ok(), Some(Dtype::Fp16));
        assert_eq!(parse_dtype("FP16").ok(), Some(Dtype::Fp16));
        assert_eq!(parse_dtype("bfloat16").ok(), Some(Dtype::Bf16));
        assert_eq!(parse_dtype("fp32").ok(), Some(Dtype::Fp32));
        assert!(parse_dtype("auto").is_err());
        assert_eq!(
            parse_dtype("Auto").map_err(|e| e.to_string()).err().as_deref(),
            Some("unknown dtype `auto` (fp16/float16/half, bf16/bfloat16, fp32/float32, fp8)")
        );
    }

    #[test]
    fn chat_template_is_qwen3s() {
        let hi = [tokens::ChatTurn { role: "user".into(), content: "hi".into(), tool_calls: Vec::new() }];
        let p = render_chat_prompt(&hi, &[], true, true);
        assert_eq!(p, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        // Non-thinking mode, as the runtime's prompts are counted (`tokens::chat_prompt`).
        let p = render_chat_prompt(&hi, &[], false, true);
        assert_eq!(p, tokens::chat_prompt("hi"));
        assert_eq!(tokens::count(&p), tokens::count("hi") + tokens::chat_overhead());
    }

    #[test]
    fn clock_maps_virtual_to_wall_by_speed() {
        let epoch = Instant::now();
        let c = Clock {
            epoch,
            speed: 100.0,
        };
        assert_eq!(c.instant(50.0) - epoch, Duration::from_millis(500));
        assert_eq!(c.instant(-1.0), epoch);
        // Absurd values do not panic.
        let _ = c.instant(f64::INFINITY);
        let _ = c.instant(f64::NAN);
        // A wall time that fits a Duration but not an Instant (speed 1e-20: 0.15 virtual
        // seconds are 1.5e19 wall seconds).
        let slow = Clock { epoch, speed: 1e-20 };
        assert!(slow.instant(0.15) > epoch);
        assert!(slow.instant(f64::MAX) > epoch);
    }

    #[test]
    fn fault_draws_follow_the_rates_and_the_seed() {
        let mk = |seed| Faults {
            rng: ChaCha8Rng::seed_from_u64(seed),
            fail_rate: 0.2,
            garbage_rate: 0.3,
        };
        let (mut a, mut b) = (mk(7), mk(7));
        let draws: Vec<Fault> = (0..4000).map(|_| a.draw()).collect();
        assert!(
            draws
                .iter()
                .zip((0..4000).map(|_| b.draw()))
                .all(|(x, y)| *x == y)
        );
        let fails = draws.iter().filter(|f| **f == Fault::Fail).count() as f64 / 4000.0;
        let garbage = draws.iter().filter(|f| **f == Fault::Garbage).count() as f64 / 4000.0;
        assert!((fails - 0.2).abs() < 0.03, "{fails}");
        assert!((garbage - 0.3).abs() < 0.03, "{garbage}");
        let mut none = Faults {
            rng: ChaCha8Rng::seed_from_u64(0),
            fail_rate: 0.0,
            garbage_rate: 0.0,
        };
        assert!((0..100).all(|_| none.draw() == Fault::None));
    }

    #[test]
    fn rejects_what_vllm_refuses_at_start() {
        let mut c = EmulateConfig::new("V100-32GB", "Qwen3-0.6B");
        c.dtype = Dtype::Bf16;
        assert!(matches!(EmulateApp::new(c), Err(ServeError::Emulator(_))));
        assert!(matches!(
            EmulateApp::new(EmulateConfig::new("no-such-gpu", "Qwen3-0.6B")),
            Err(ServeError::Spec(_))
        ));
        let mut c = EmulateConfig::new("A100-80GB", "Qwen3-0.6B");
        c.speed = 0.0;
        assert!(matches!(
            EmulateApp::new(c),
            Err(ServeError::InvalidOption { field: "speed", .. })
        ));
        // Outside SPEED_RANGE: 1e-20 made virtual times wall instants past what Instant holds.
        for speed in [1e-20, 1e-4, 1e7] {
            let mut c = EmulateConfig::new("A100-80GB", "Qwen3-0.6B");
            c.speed = speed;
            let e = EmulateApp::new(c).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains("--speed") && e.contains("0.001 to 1000000"), "{speed}: {e}");
        }
        let mut c = EmulateConfig::new("A100-80GB", "Qwen3-0.6B");
        c.fail_rate = 0.7;
        c.garbage_rate = 0.7;
        assert!(matches!(
            EmulateApp::new(c),
            Err(ServeError::InvalidOption { .. })
        ));
    }

}
