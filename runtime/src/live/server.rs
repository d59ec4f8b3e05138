//! The `switchyard emulate` server: ONE emulated replica ([`EmulatedReplica`], the simulator's
//! ground truth) served on wall-clock time behind vLLM's HTTP API, so that the live runtime's
//! engines are exercised over real sockets (and, through the `vllm` engine's command template,
//! real child processes) on machines without GPUs.
//!
//! Endpoints, as vLLM's OpenAI-compatible server exposes them (vLLM docs "OpenAI-Compatible
//! Server", "Production Metrics" <https://docs.vllm.ai/en/stable/usage/metrics/>, and
//! `docs/features/sleep_mode.md`; field anchors §1):
//! - `POST /v1/completions`, `POST /v1/chat/completions` — streaming (SSE, `data: [DONE]`) and
//!   not, with `usage` = `prompt_tokens`, `completion_tokens`, `total_tokens` and
//!   `prompt_tokens_details.cached_tokens`; a stream sends one chunk per token as the engine
//!   decodes it (its first token at the first-token event, then one per iteration in which the
//!   request decoded; a preempted request's rest comes with its finish) and ends with a usage
//!   chunk when `stream_options.include_usage` is set;
//! - `GET /version` (vLLM's `{"version"}` plus `"switchyard_emulate"`: the one server the
//!   live runtime sends emulated outputs to);
//! - `GET /v1/models`, `GET /health` (503 until the start-up load has finished, like a vLLM
//!   server that is not up yet), `GET /metrics` (Prometheus text 0.0.4 with vLLM's names);
//! - sleep mode (dev mode endpoints): `POST /sleep?level=1|2`, `POST /wake_up[?tags=..]`,
//!   `GET /is_sleeping` → `{"is_sleeping": bool}`, `POST /collective_rpc`
//!   (`reload_weights` only). While the replica is not awake, the completion endpoints answer
//!   503, as vLLM's sleep-mode docs say the weight-dependent endpoints do.
//!
//! Time: virtual (emulated) seconds = wall seconds × `speed`. A driver task runs the replica's
//! iteration loop as a discrete-event loop paced by the wall clock: an iteration that ends at
//! virtual time `e` is completed once the wall clock reaches `e / speed`, and the next one
//! starts at `e` (not at the late wake-up time), so timer slack delays answers but never
//! distorts the emulated timeline. A request arriving at wall time `w` enters the engine at
//! virtual time `w × speed`. Metrics in seconds (TTFT, end-to-end latency) are virtual.
//!
//! Outputs: the body's `"switchyard": {"output": "..."}` (sent by the live runtime's emulated
//! sessions, see `LlmRequest::emulated_output`) or a deterministic filler of `max_tokens`
//! tokens; prompt and output tokens are Qwen3 tokenizer tokens (`crate::tokens`; a chat request
//! is rendered in Qwen3's chat template, honouring `chat_template_kwargs.enable_thinking`), and
//! prefix caching keys on `tokens::block_hashes(ids, block_size)` like the simulator.
//!
//! Depends on the emulator crate, the predictor's spec catalogue, `crate::tokens` and the web
//! stack (axum, prometheus-client); it must not depend on the planner or the simulator.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use futures::{Stream, StreamExt};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
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

/// vLLM's bucket bounds of `vllm:time_to_first_token_seconds` (`vllm/v1/metrics/loggers.py`;
/// field anchors §1.3: 0.001…2560 s).
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// vLLM's bucket bounds of `vllm:e2e_request_latency_seconds` (`vllm/v1/metrics/loggers.py`).
pub const E2E_BUCKETS: [f64; 20] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0,
];

/// The default `max_tokens` of `/v1/completions` (OpenAI's API reference and vLLM's
/// `CompletionRequest.max_tokens` default: 16). Chat requests default to what the context
/// leaves, as vLLM does.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;

/// Token ids the filler output cycles through: the BPE encoding of this text.
const FILLER_TEXT: &str = " The emulated replica generates this deterministic filler text \
    because the request carried no switchyard output.";

/// Most iterations the driver completes while holding the lock before it yields to the
/// request handlers (only reached when the driver runs behind the wall clock).
const DRIVER_BATCH: usize = 64;

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
}

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

    /// The wall instant at which virtual time `v` is reached.
    fn instant(&self, v: f64) -> Instant {
        let wall = Duration::try_from_secs_f64((v / self.speed).max(0.0))
            .unwrap_or(Duration::from_secs(365 * 24 * 3600));
        self.epoch + wall
    }
}

/// What the driver tells a waiting request handler.
#[derive(Debug, Clone, PartialEq)]
enum Progress {
    FirstToken,
    /// One more output token (an iteration in which the request decoded).
    Token,
    Finished { cached_prompt_tokens: u32 },
    Failed(String),
}

/// A request accepted by a handler, not yet submitted to the replica.
#[derive(Debug)]
struct Pending {
    request: EngineRequest,
    arrival: f64,
}

#[derive(Debug)]
struct Waiter {
    arrival: f64,
    tx: mpsc::UnboundedSender<Progress>,
    /// Past its first token and not preempted: each iteration decodes one more token.
    decoding: bool,
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
        matches!(
            self.replica.state(),
            ReplicaState::Sleeping { .. } | ReplicaState::Asleep | ReplicaState::Waking { .. }
        )
    }

    fn busy(&self) -> bool {
        !self.inbox.is_empty() || self.replica.in_flight() > 0 || self.replica.in_iteration()
    }
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
    created: u64,
    ttft: Histogram,
    e2e: Histogram,
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

        let served_name = config.served_name().to_string();
        let core = Arc::new(Mutex::new(Core {
            replica,
            cursor: 0.0,
            inbox: VecDeque::new(),
            waiters: BTreeMap::new(),
            next_id: 0,
            closing: false,
        }));
        let ttft = Histogram::new(TTFT_BUCKETS);
        let e2e = Histogram::new(E2E_BUCKETS);
        let labels = [
            (Cow::Borrowed("model_name"), Cow::Owned(served_name.clone())),
            (Cow::Borrowed("engine"), Cow::Borrowed("0")),
        ];
        let mut registry = Registry::with_labels(labels.into_iter());
        registry.register_collector(Box::new(ReplicaCollector {
            core: Arc::clone(&core),
        }));
        registry.register(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds (emulated time)",
            ttft.clone(),
        );
        registry.register(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds (emulated time)",
            e2e.clone(),
        );
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
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
            created,
            ttft,
            e2e,
            faults: Mutex::new(Faults {
                rng: ChaCha8Rng::seed_from_u64(config.fault_seed),
                fail_rate: config.fail_rate,
                garbage_rate: config.garbage_rate,
            }),
            filler: tokens::encode(FILLER_TEXT).to_vec(),
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
            .route("/version", get(version))
            .route("/metrics", get(metrics))
            .route("/sleep", post(sleep))
            .route("/wake_up", post(wake_up))
            .route("/is_sleeping", get(is_sleeping))
            .route("/collective_rpc", post(collective_rpc))
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

/// Parses a `--dtype` value: ours (`fp16`, `bf16`, `fp32`, `fp8`) or vLLM's spelling
/// (`float16`/`half`, `bfloat16`, `float32`/`float`). vLLM's `auto` (the checkpoint's dtype)
/// is refused: the emulator needs an explicit one.
pub fn parse_dtype(text: &str) -> Result<Dtype, String> {
    match text.to_ascii_lowercase().as_str() {
        "fp16" | "float16" | "half" => Ok(Dtype::Fp16),
        "bf16" | "bfloat16" => Ok(Dtype::Bf16),
        "fp32" | "float32" | "float" => Ok(Dtype::Fp32),
        "fp8" => Ok(Dtype::Fp8),
        other => Err(format!(
            "unknown dtype `{other}` (fp16/float16/half, bf16/bfloat16, fp32/float32, fp8)"
        )),
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
        let _ =
            w.tx.send(Progress::Failed("the server is shutting down".into()));
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
            let mut core = shared.lock();
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
                    let events = core.replica.finish_iteration(end);
                    // The requests that were decoding got one token each in this iteration
                    // (before the events: a first token is not counted twice).
                    for w in core.waiters.values().filter(|w| w.decoding) {
                        let _ = w.tx.send(Progress::Token);
                    }
                    core.cursor = core.cursor.max(end);
                    deliver(&mut core, &shared, events);
                    done += 1;
                    continue;
                }
                // Idle engine: jump to the next arrival (never past the wall clock).
                if core.replica.in_flight() == 0
                    && let Some(front) = core.inbox.front()
                {
                    core.cursor = core.cursor.max(front.arrival.min(now));
                }
                admit(&mut core);
                let cursor = core.cursor;
                if core.replica.start_iteration(cursor).is_none() {
                    break Next::Idle;
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
            let _ = w.tx.send(Progress::Failed(e.to_string()));
        }
    }
}

fn deliver(core: &mut Core, shared: &Shared, events: Vec<EngineEvent>) {
    for event in events {
        match event {
            EngineEvent::FirstToken { id, at } => {
                if let Some(w) = core.waiters.get_mut(&id) {
                    shared.ttft.observe((at - w.arrival).max(0.0));
                    w.decoding = true;
                    let _ = w.tx.send(Progress::FirstToken);
                }
            }
            EngineEvent::Finished {
                id,
                at,
                cached_prompt_tokens,
                ..
            } => {
                if let Some(w) = core.waiters.remove(&id) {
                    shared.e2e.observe((at - w.arrival).max(0.0));
                    let _ = w.tx.send(Progress::Finished {
                        cached_prompt_tokens,
                    });
                }
            }
            EngineEvent::Preempted { id, .. } => {
                // Recomputed from scratch: its tokens stream on only at its finish.
                if let Some(w) = core.waiters.get_mut(&id) {
                    w.decoding = false;
                }
            }
        }
    }
}

/// Scrape-time gauges and counters read from the replica's telemetry.
#[derive(Debug)]
struct ReplicaCollector {
    core: Arc<Mutex<Core>>,
}

impl Collector for ReplicaCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (t, queued) = {
            let core = lock(&self.core);
            (core.replica.telemetry(), core.inbox.len())
        };
        let gauges = [
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches",
                t.running as f64,
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed",
                (t.waiting + queued) as f64,
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage",
                t.kv_usage,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            let metric_encoder =
                encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric_encoder)?;
        }
        let counters = [
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens",
                t.prefix_cache_queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens",
                t.prefix_cache_hits,
            ),
            (
                "vllm:num_preemptions",
                "Cumulative number of preemption from the engine",
                t.preemptions,
            ),
            (
                "vllm:generation_tokens",
                "Number of generation tokens processed",
                t.generated_tokens,
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            let metric_encoder =
                encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric_encoder)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct AppState {
    shared: Arc<Shared>,
    registry: Arc<Registry>,
}

/// An OpenAI-shaped error (`{"error": {...}}`, the shape OpenAI clients parse).
fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response {
    let body = json!({
        "error": {
            "message": message.into(),
            "type": kind,
            "param": null,
            "code": status.as_u16().to_string(),
        }
    });
    (status, Json(body)).into_response()
}

fn unavailable(message: impl Into<String>) -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailableError",
        message,
    )
}

fn bad_request(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, "BadRequestError", message)
}

/// The `"switchyard"` extension of a request body.
#[derive(Debug, Default, Deserialize)]
struct SwitchyardExt {
    #[serde(default)]
    output: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
}

#[derive(Debug, Deserialize)]
struct CompletionBody {
    #[serde(default)]
    model: Option<String>,
    prompt: PromptField,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    switchyard: Option<SwitchyardExt>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<MessageContent>,
}

#[derive(Debug, Deserialize)]
struct ChatBody {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    switchyard: Option<SwitchyardExt>,
    /// vLLM's extra arguments of the chat template (`enable_thinking` for Qwen3).
    #[serde(default)]
    chat_template_kwargs: Option<ChatTemplateKwargs>,
}

#[derive(Debug, Default, Deserialize)]
struct ChatTemplateKwargs {
    #[serde(default)]
    enable_thinking: Option<bool>,
}

/// Renders chat messages with Qwen3's chat template (`<|im_start|>role\ncontent<|im_end|>\n`
/// per message, then the generation prompt, with the empty thinking block when
/// `enable_thinking` is false), the prompt a Qwen3 vLLM server tokenises; its special markers
/// are single tokens. Only plain system / user / assistant turns are rendered (no tools, no
/// reasoning-content handling of earlier assistant turns).
pub fn render_chat(messages: &[(String, String)], enable_thinking: bool) -> String {
    let mut out = String::new();
    for (role, content) in messages {
        out.push_str("<|im_start|>");
        out.push_str(role);
        out.push('\n');
        out.push_str(content);
        out.push_str("<|im_end|>\n");
    }
    let suffix = tokens::chat_generation_suffix(enable_thinking);
    out.push_str(suffix.strip_prefix("<|im_end|>\n").unwrap_or(&suffix));
    out
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Api {
    Completions,
    Chat,
}

/// A validated request, ready for the engine.
struct Prepared {
    api: Api,
    prompt_ids: Vec<u32>,
    output_ids: Vec<u32>,
    text: String,
    finish_reason: &'static str,
    stream: bool,
    include_usage: bool,
}

fn prepare_output(
    shared: &Shared,
    provided: Option<String>,
    max_tokens: u32,
) -> (Vec<u32>, String, &'static str) {
    let max = max_tokens as usize;
    match provided {
        Some(text) => {
            let ids = tokens::encode(&text);
            if ids.len() > max {
                let kept = ids[..max].to_vec();
                let text = tokens::decode(&kept);
                (kept, text, "length")
            } else {
                (ids.to_vec(), text, "stop")
            }
        }
        None => {
            let ids: Vec<u32> = shared.filler.iter().copied().cycle().take(max).collect();
            let text = tokens::decode(&ids);
            (ids, text, "length")
        }
    }
}

async fn completions(State(state): State<AppState>, body: Bytes) -> Response {
    let body: CompletionBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(format!("invalid completion request: {e}")),
    };
    let shared = &state.shared;
    if let Some(r) = check_model(shared, body.model.as_deref()) {
        return r;
    }
    let prompt_ids: Vec<u32> = match body.prompt {
        PromptField::Text(t) => tokens::encode(&t).to_vec(),
        PromptField::Ids(ids) => ids,
        PromptField::Texts(ts) => match ts.as_slice() {
            [one] => tokens::encode(one).to_vec(),
            _ => return bad_request("only one prompt per request is supported"),
        },
    };
    let max_tokens = body.max_tokens.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS);
    let (output_ids, text, finish_reason) =
        prepare_output(shared, body.switchyard.and_then(|s| s.output), max_tokens);
    let prepared = Prepared {
        api: Api::Completions,
        prompt_ids,
        output_ids,
        text,
        finish_reason,
        stream: body.stream,
        include_usage: body.stream_options.is_some_and(|o| o.include_usage),
    };
    run(shared, prepared).await
}

async fn chat_completions(State(state): State<AppState>, body: Bytes) -> Response {
    let body: ChatBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return bad_request(format!("invalid chat completion request: {e}")),
    };
    let shared = &state.shared;
    if let Some(r) = check_model(shared, body.model.as_deref()) {
        return r;
    }
    if body.messages.is_empty() {
        return bad_request("messages must not be empty");
    }
    let messages: Vec<(String, String)> = body
        .messages
        .into_iter()
        .map(|m| {
            let content = match m.content {
                None => String::new(),
                Some(MessageContent::Text(t)) => t,
                Some(MessageContent::Parts(parts)) => {
                    parts.into_iter().filter_map(|p| p.text).collect()
                }
            };
            (m.role, content)
        })
        .collect();
    // Qwen3's template thinks unless told otherwise, as vLLM renders it.
    let enable_thinking = body.chat_template_kwargs.and_then(|k| k.enable_thinking).unwrap_or(true);
    let prompt_ids = tokens::encode(&render_chat(&messages, enable_thinking)).to_vec();
    let room = (shared.max_model_len as usize).saturating_sub(prompt_ids.len()) as u32;
    let max_tokens = body
        .max_completion_tokens
        .or(body.max_tokens)
        .unwrap_or(room.max(1));
    let (output_ids, text, finish_reason) =
        prepare_output(shared, body.switchyard.and_then(|s| s.output), max_tokens);
    let prepared = Prepared {
        api: Api::Chat,
        prompt_ids,
        output_ids,
        text,
        finish_reason,
        stream: body.stream,
        include_usage: body.stream_options.is_some_and(|o| o.include_usage),
    };
    run(shared, prepared).await
}

/// vLLM answers 404 for a model it does not serve.
fn check_model(shared: &Shared, model: Option<&str>) -> Option<Response> {
    match model {
        Some(m) if m != shared.served_name => Some(error(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            format!("The model `{m}` does not exist."),
        )),
        _ => None,
    }
}

fn draw_fault(shared: &Shared) -> Fault {
    shared
        .faults
        .lock()
        .map(|mut f| f.draw())
        .unwrap_or(Fault::None)
}

/// Validates, enqueues and answers one completion request.
async fn run(shared: &Arc<Shared>, p: Prepared) -> Response {
    match draw_fault(shared) {
        Fault::None => {}
        Fault::Fail => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                "injected fault (--fail-rate)",
            );
        }
        Fault::Garbage => return garbage(p.stream),
    }
    let prompt_tokens = p.prompt_ids.len() as u32;
    if prompt_tokens == 0 {
        return bad_request("The prompt is empty.");
    }
    // An empty answer still samples one token (the end-of-sequence token).
    let output_tokens = (p.output_ids.len() as u32).max(1);
    let total = u64::from(prompt_tokens) + u64::from(output_tokens);
    if total > u64::from(shared.max_model_len) {
        return bad_request(format!(
            "This model's maximum context length is {} tokens. However, you requested {} \
             tokens ({} in the messages, {} in the completion). Please reduce the length of \
             the messages or completion.",
            shared.max_model_len, total, prompt_tokens, output_tokens
        ));
    }
    let prefix_hashes = tokens::block_hashes(&p.prompt_ids, shared.block_size as usize);
    let (tx, rx) = mpsc::unbounded_channel();
    let id = {
        let mut core = shared.settled();
        if core.closing {
            return unavailable("the server is shutting down");
        }
        match core.replica.state() {
            ReplicaState::Awake => {}
            ReplicaState::Cold | ReplicaState::Loading { .. } => {
                return unavailable("the model is still loading");
            }
            state => return unavailable(format!("the model is sleeping ({state})")),
        }
        let id = core.next_id;
        core.next_id += 1;
        let arrival = shared.clock.now().max(core.cursor);
        core.waiters.insert(id, Waiter { arrival, tx, decoding: false });
        core.inbox.push_back(Pending {
            request: EngineRequest {
                id,
                prompt_tokens,
                prefix_hashes,
                generated_hashes: Vec::new(),
                output_tokens,
            },
            arrival,
        });
        id
    };
    shared.driver_wake.notify_one();
    let answer = Answer {
        id: match p.api {
            Api::Completions => format!("cmpl-{id}"),
            Api::Chat => format!("chatcmpl-{id}"),
        },
        api: p.api,
        created: shared.created,
        model: shared.served_name.clone(),
        prompt_tokens,
        output_tokens,
        text: p.text,
        output_ids: p.output_ids,
        finish_reason: p.finish_reason,
        include_usage: p.include_usage,
    };
    if p.stream {
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

/// What a completed request answers.
struct Answer {
    id: String,
    api: Api,
    created: u64,
    model: String,
    prompt_tokens: u32,
    output_tokens: u32,
    text: String,
    /// The text's tokens: a stream sends them one by one as the engine decodes them.
    output_ids: Vec<u32>,
    finish_reason: &'static str,
    include_usage: bool,
}

impl Answer {
    fn usage(&self, cached: u32) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.output_tokens,
            "total_tokens": self.prompt_tokens + self.output_tokens,
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

    async fn wait(self, mut rx: mpsc::UnboundedReceiver<Progress>) -> Response {
        loop {
            match rx.recv().await {
                Some(Progress::FirstToken | Progress::Token) => continue,
                Some(Progress::Finished {
                    cached_prompt_tokens,
                }) => return Json(self.full(cached_prompt_tokens)).into_response(),
                Some(Progress::Failed(reason)) => return unavailable(reason),
                None => return unavailable("the engine dropped the request"),
            }
        }
    }

    fn full(&self, cached: u32) -> Value {
        let choice = match self.api {
            Api::Completions => json!({
                "index": 0,
                "text": self.text,
                "logprobs": null,
                "finish_reason": self.finish_reason,
                "stop_reason": null,
            }),
            Api::Chat => json!({
                "index": 0,
                "message": { "role": "assistant", "content": self.text },
                "logprobs": null,
                "finish_reason": self.finish_reason,
                "stop_reason": null,
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(cached),
        })
    }

    fn chunk(&self, piece: &str, first: bool, finish: Option<&str>) -> Value {
        let choice = match self.api {
            Api::Completions => json!({
                "index": 0,
                "text": piece,
                "logprobs": null,
                "finish_reason": finish,
            }),
            Api::Chat => {
                let delta = if first {
                    json!({ "role": "assistant", "content": piece })
                } else {
                    json!({ "content": piece })
                };
                json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish })
            }
        };
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        })
    }

    /// A stream: one chunk per decoded token at the engine's pace (a token that ends inside a
    /// multi-byte character waits for the rest of it), the rest of the text with the finish
    /// reason at completion, then the usage chunk and `[DONE]`.
    fn stream(
        self,
        rx: mpsc::UnboundedReceiver<Progress>,
    ) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
        futures::stream::unfold(
            (self, rx, TokenCursor::default(), false),
            |(answer, mut rx, mut cursor, done)| async move {
                if done {
                    return None;
                }
                loop {
                    match rx.recv().await {
                        Some(Progress::FirstToken | Progress::Token) => {
                            let first = cursor.tokens == 0;
                            let Some(piece) = cursor.next_piece(&answer.output_ids, &answer.text) else {
                                continue;
                            };
                            if piece.is_empty() && !first {
                                continue;
                            }
                            let data = answer.chunk(&piece, first, None).to_string();
                            return Some((vec![Event::default().data(data)], (answer, rx, cursor, false)));
                        }
                        Some(Progress::Finished {
                            cached_prompt_tokens,
                        }) => {
                            let mut events = Vec::new();
                            let first = cursor.tokens == 0;
                            let rest = answer.text.get(cursor.sent..).unwrap_or_default();
                            let data = answer.chunk(rest, first, Some(answer.finish_reason)).to_string();
                            events.push(Event::default().data(data));
                            if answer.include_usage {
                                let usage = json!({
                                    "id": answer.id,
                                    "object": answer.object(true),
                                    "created": answer.created,
                                    "model": answer.model,
                                    "choices": [],
                                    "usage": answer.usage(cached_prompt_tokens),
                                });
                                events.push(Event::default().data(usage.to_string()));
                            }
                            events.push(Event::default().data("[DONE]"));
                            return Some((events, (answer, rx, cursor, true)));
                        }
                        Some(Progress::Failed(reason)) => {
                            let data = json!({
                                "error": { "message": reason, "type": "ServiceUnavailableError",
                                           "param": null, "code": "503" }
                            });
                            let events = vec![Event::default().data(data.to_string())];
                            return Some((events, (answer, rx, cursor, true)));
                        }
                        None => return None,
                    }
                }
            },
        )
        .flat_map(|events| futures::stream::iter(events.into_iter().map(Ok)))
    }
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
            "created": s.created,
            "owned_by": "vllm",
            "root": s.model,
            "parent": null,
            "max_model_len": s.max_model_len,
        }]
    }))
    .into_response()
}

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
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            "cannot encode metrics",
        ),
    }
}

#[derive(Debug, Deserialize)]
struct SleepQuery {
    #[serde(default)]
    level: Option<u8>,
    #[serde(default)]
    tags: Option<String>,
}

fn conflict(message: impl Into<String>) -> Response {
    error(StatusCode::CONFLICT, "ConflictError", message)
}

async fn sleep(State(state): State<AppState>, Query(q): Query<SleepQuery>) -> Response {
    if q.tags.is_some() {
        return bad_request("the emulated replica sleeps by level only (tags are not supported)");
    }
    let shared = &state.shared;
    let level = q.level.unwrap_or(1);
    let until = {
        let mut core = shared.settled();
        match core.replica.state() {
            ReplicaState::Asleep => return StatusCode::OK.into_response(),
            ReplicaState::Awake if core.busy() => {
                return conflict(
                    "requests are in flight; the emulated replica sleeps only when idle",
                );
            }
            ReplicaState::Awake => {}
            state => return conflict(format!("cannot sleep while {state}")),
        }
        let at = shared.clock.now().max(core.cursor);
        match core.replica.begin_sleep(level, at) {
            Ok(until) => until,
            Err(e @ EmulatorError::InvalidSleepLevel(_)) => return bad_request(e.to_string()),
            Err(e) => return conflict(e.to_string()),
        }
    };
    finish_transition(shared, until).await
}

async fn finish_transition(shared: &Shared, until: f64) -> Response {
    tokio::time::sleep_until(shared.clock.instant(until)).await;
    drop(shared.settled());
    shared.driver_wake.notify_one();
    StatusCode::OK.into_response()
}

async fn wake_up(State(state): State<AppState>) -> Response {
    // vLLM wakes by tags (`weights`, `kv_cache`); the emulated replica restores both at once
    // on the first call, and later calls (e.g. `?tags=kv_cache` after `?tags=weights` in the
    // level-2 sequence) find it awake and return 200.
    let shared = &state.shared;
    let until = {
        let mut core = shared.settled();
        match core.replica.state() {
            ReplicaState::Awake => return StatusCode::OK.into_response(),
            ReplicaState::Waking { until } => until,
            ReplicaState::Asleep => {
                let at = shared.clock.now().max(core.cursor);
                match core.replica.begin_wake(at) {
                    Ok(until) => until,
                    Err(e) => return conflict(e.to_string()),
                }
            }
            state => return conflict(format!("cannot wake while {state}")),
        }
    };
    finish_transition(shared, until).await
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
        Ok(b) => bad_request(format!(
            "collective_rpc method `{}` is not emulated",
            b.method
        )),
        Err(e) => bad_request(format!("invalid collective_rpc body: {e}")),
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

    #[test]
    fn dtype_names_of_both_vocabularies() {
        assert_eq!(parse_dtype("float16"), Ok(Dtype::Fp16));
        assert_eq!(parse_dtype("FP16"), Ok(Dtype::Fp16));
        assert_eq!(parse_dtype("bfloat16"), Ok(Dtype::Bf16));
        assert_eq!(parse_dtype("fp32"), Ok(Dtype::Fp32));
        assert!(parse_dtype("auto").is_err());
    }

    #[test]
    fn chat_template_is_qwen3s() {
        let p = render_chat(&[("user".into(), "hi".into())], true);
        assert_eq!(p, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        // Non-thinking mode, as the runtime's prompts are counted (`tokens::chat_prompt`).
        let p = render_chat(&[("user".into(), "hi".into())], false);
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
        let mut c = EmulateConfig::new("A100-80GB", "Qwen3-0.6B");
        c.fail_rate = 0.7;
        c.garbage_rate = 0.7;
        assert!(matches!(
            EmulateApp::new(c),
            Err(ServeError::InvalidOption { .. })
        ));
    }

    #[test]
    fn filler_output_has_exactly_max_tokens_and_provided_text_is_capped() {
        let app = EmulateApp::new(EmulateConfig::new("A100-80GB", "Qwen3-0.6B")).unwrap();
        let (ids, text, reason) = prepare_output(&app.shared, None, 40);
        assert_eq!(ids.len(), 40);
        assert!(!text.is_empty());
        assert_eq!(reason, "length");
        let (ids, text, reason) =
            prepare_output(&app.shared, Some("The answer is 42.".into()), 100);
        assert_eq!(ids.len(), tokens::count("The answer is 42."));
        assert_eq!(text, "The answer is 42.");
        assert_eq!(reason, "stop");
        let (ids, _, reason) =
            prepare_output(&app.shared, Some("one two three four five".into()), 2);
        assert_eq!(ids.len(), 2);
        assert_eq!(reason, "length");
    }
}
