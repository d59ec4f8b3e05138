//! The live runtime (actors on tokio, wall-clock time) against in-memory fake engines:
//! results equal the simulator's for the same seed, faults (a replica killed mid-run, engines
//! answering garbage) are absorbed or reported, and every session ends exactly once. The fake
//! engine returns the request's `emulated_output` after a short delay, counts its lifecycle
//! calls, and refuses requests when it is not awake, so a runtime that misuses an engine fails
//! these tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use switchyard_runtime::ids::SessionId;
use switchyard_runtime::live::engine::{
    Completion, Engine, EngineError, EngineFuture, EngineTelemetry, LlmRequest,
};
use switchyard_runtime::exec::{self, Arrival, PoolSpec, PrepareContext, Ready, RunConfig, arrivals};
use switchyard_runtime::live::engines::{ApiFlavor, HttpEngine, HttpOptions};
use switchyard_runtime::live::server::{EmulateConfig, EmulateServer};
use switchyard_runtime::live::{
    EngineFactory, EngineHandle, EngineTarget, LiveConfig, LiveOutput, RetryPolicy,
};
use switchyard_runtime::planner::JointOptions;
use switchyard_runtime::session::Session;
use switchyard_runtime::sim;
use switchyard_runtime::tokens;
use switchyard_runtime::values::NodeOutput;
use switchyard_runtime::workflow::{WorkflowSpec, load_workflow};
use tokio::sync::watch;

// ---------------------------------------------------------------------------------------------
// A fake engine.

/// Faults to inject, shared by every engine of a factory.
#[derive(Default)]
struct Faults {
    /// Kill the engine that receives the N-th request (1-based) and every call in flight on it.
    kill_at_request: Option<u64>,
    /// A killed engine stays dead: `load` fails too (the process cannot start again).
    stay_dead: bool,
    /// Answer the first N attempts of every request with garbage.
    bad_attempts_per_request: u32,
    /// Answer every request for this model with garbage.
    always_bad_model: Option<String>,
    /// Answer the first N calls of each prompt whose emulated answer is a JSON object with prose
    /// instead (a real model ignoring a structured agent's schema).
    prose_for_json: u32,
    /// Report `/metrics` like a hybrid-attention engine: each call in flight holds its prompt
    /// tokens plus this many tokens of state in a 1,000,000-token KV cache.
    request_state_tokens: Option<u64>,
    /// `load` never ends (a vLLM start-up of minutes, or one stuck).
    load_hangs: bool,
    /// `load` of this model always fails (its server exits at start).
    load_fails_model: Option<String>,
    /// Each answer streams its first token before its delay (so an attempt cut short during
    /// the delay is wasted work).
    first_token_before_delay: bool,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    loads: AtomicU64,
    wakes: AtomicU64,
    sleeps: AtomicU64,
    unloads: AtomicU64,
    kills: AtomicU64,
    /// Completed answers per request id (each must be 1 at most).
    answered: Mutex<BTreeMap<u64, u32>>,
    attempts: Mutex<BTreeMap<u64, u32>>,
    /// Calls per prompt whose emulated answer is JSON.
    json_prompts: Mutex<BTreeMap<String, u32>>,
    /// Prompt tokens (the runtime's count) of the attempts that broke off after streaming.
    broken_prompt_tokens: AtomicU64,
}

struct FakeEngine {
    model: String,
    delay: Duration,
    faults: Arc<Faults>,
    counters: Arc<Counters>,
    /// true while the "process" is dead (set with `send_replace`: it must stick even when no
    /// request is listening).
    dead: watch::Sender<bool>,
    awake: AtomicBool,
    /// Calls in flight on this engine, and their prompt tokens.
    in_flight: AtomicU64,
    in_flight_prompt: AtomicU64,
}

/// A call counted in flight on its engine until dropped.
struct InFlightGuard<'a>(&'a FakeEngine, u64);

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.in_flight_prompt.fetch_sub(self.1, Ordering::SeqCst);
    }
}

impl FakeEngine {
    async fn answer(&self, request: LlmRequest) -> Result<Completion, EngineError> {
        let t0 = Instant::now();
        if *self.dead.borrow() {
            return Err(EngineError::Unreachable("connection refused".into()));
        }
        if !self.awake.load(Ordering::SeqCst) {
            return Err(EngineError::Rejected(format!("{} is not awake", self.model)));
        }
        if request.model != self.model {
            return Err(EngineError::Rejected(format!("model `{}` is not served here", request.model)));
        }
        let n = self.counters.requests.fetch_add(1, Ordering::SeqCst) + 1;
        if self.faults.kill_at_request == Some(n) {
            self.counters.kills.fetch_add(1, Ordering::SeqCst);
            // Dead before not awake: a request never sees a live server that is not serving.
            self.dead.send_replace(true);
            self.awake.store(false, Ordering::SeqCst);
            return Err(EngineError::Unreachable("connection reset by peer".into()));
        }
        let attempt = {
            let mut a = self.counters.attempts.lock().unwrap();
            let e = a.entry(request.id).or_insert(0);
            *e += 1;
            *e
        };
        if attempt <= self.faults.bad_attempts_per_request || self.faults.always_bad_model.as_deref() == Some(&self.model) {
            // A streamed answer that broke off: its first piece already reached the caller, and
            // the engine had computed its prompt and three tokens.
            request.sink.send(&format!("attempt {attempt} "));
            request.meter.first_token();
            request.meter.add_output(3);
            self.counters.broken_prompt_tokens.fetch_add(u64::from(request.prompt_tokens), Ordering::SeqCst);
            return Err(EngineError::BadResponse("HTTP 500: internal server error".into()));
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.in_flight_prompt.fetch_add(u64::from(request.prompt_tokens), Ordering::SeqCst);
        let _in_flight = InFlightGuard(self, u64::from(request.prompt_tokens));
        if self.faults.first_token_before_delay {
            request.meter.first_token();
            request.meter.add_output(1);
        }
        if !self.delay.is_zero() {
            let mut died = self.dead.subscribe();
            tokio::select! {
                _ = tokio::time::sleep(self.delay) => {}
                _ = died.wait_for(|d| *d) => return Err(EngineError::Unreachable("connection reset by peer".into())),
            }
        }
        let mut text = request.emulated_output.clone().unwrap_or_default();
        if self.faults.prose_for_json > 0 && text.starts_with('{') && serde_json::from_str::<serde_json::Value>(&text).is_ok() {
            let mut seen = self.counters.json_prompts.lock().unwrap();
            let n = seen.entry(request.prompt.clone()).or_insert(0);
            *n += 1;
            if *n <= self.faults.prose_for_json {
                text = "Looks good to me, nothing to add.".into();
            }
        }
        *self.counters.answered.lock().unwrap().entry(request.id).or_insert(0) += 1;
        let latency_s = t0.elapsed().as_secs_f64();
        // A client's function calling, as the emulated model answers it: a call of the first
        // tool when the conversation ends with the user's message, else text.
        let last_role = request.messages.as_ref().and_then(|m| m.last()).and_then(|m| m["role"].as_str().map(str::to_string));
        let tool_calls = match (request.tools.first(), last_role.as_deref()) {
            (Some(tool), Some("user")) => vec![switchyard_runtime::live::engine::ToolCall {
                id: format!("call_{}", request.id),
                name: tool["function"]["name"].as_str().unwrap_or("f").to_string(),
                arguments: "{}".into(),
            }],
            _ => Vec::new(),
        };
        Ok(Completion {
            prompt_tokens: tokens::count(&request.prompt) as u32,
            cached_prompt_tokens: 0,
            output_tokens: (tokens::count(&text) as u32).max(1),
            text,
            ttft_s: latency_s,
            latency_s,
            tool_calls,
            ..Default::default()
        })
    }
}

impl Engine for FakeEngine {
    fn kind(&self) -> &'static str {
        "fake"
    }
    fn load(&self) -> EngineFuture<'_, ()> {
        Box::pin(async move {
            self.counters.loads.fetch_add(1, Ordering::SeqCst);
            if self.faults.load_hangs {
                std::future::pending::<()>().await;
            }
            if self.faults.load_fails_model.as_deref() == Some(self.model.as_str()) {
                return Err(EngineError::Lifecycle(format!("{} exits at start", self.model)));
            }
            if *self.dead.borrow() && self.faults.stay_dead {
                return Err(EngineError::Lifecycle("the server exits at start".into()));
            }
            // Awake before alive: a request never sees a live server that is not serving.
            self.awake.store(true, Ordering::SeqCst);
            self.dead.send_replace(false);
            Ok(())
        })
    }
    fn sleep(&self, _level: u8) -> EngineFuture<'_, ()> {
        Box::pin(async move {
            self.counters.sleeps.fetch_add(1, Ordering::SeqCst);
            self.awake.store(false, Ordering::SeqCst);
            Ok(())
        })
    }
    fn wake(&self) -> EngineFuture<'_, ()> {
        Box::pin(async move {
            self.counters.wakes.fetch_add(1, Ordering::SeqCst);
            if *self.dead.borrow() {
                return Err(EngineError::Unreachable("connection refused".into()));
            }
            self.awake.store(true, Ordering::SeqCst);
            Ok(())
        })
    }
    fn unload(&self) -> EngineFuture<'_, ()> {
        Box::pin(async move {
            self.counters.unloads.fetch_add(1, Ordering::SeqCst);
            self.awake.store(false, Ordering::SeqCst);
            Ok(())
        })
    }
    fn submit(&self, request: LlmRequest) -> EngineFuture<'_, Completion> {
        Box::pin(self.answer(request))
    }
    fn telemetry(&self) -> EngineFuture<'_, EngineTelemetry> {
        Box::pin(async move {
            if *self.dead.borrow() {
                return Err(EngineError::Unreachable("connection refused".into()));
            }
            let sleeping = !self.awake.load(Ordering::SeqCst);
            let Some(state) = self.faults.request_state_tokens else {
                return Ok(EngineTelemetry { sleeping, ..EngineTelemetry::default() });
            };
            let running = self.in_flight.load(Ordering::SeqCst);
            let used = self.in_flight_prompt.load(Ordering::SeqCst) + state * running;
            Ok(EngineTelemetry {
                sleeping,
                running: running as f64,
                kv_capacity_tokens: Some(1_000_000.0),
                kv_cache_usage: used as f64 / 1_000_000.0,
                ..EngineTelemetry::default()
            })
        })
    }
}

struct FakeFactory {
    delay: Duration,
    faults: Arc<Faults>,
    counters: Arc<Counters>,
}

impl FakeFactory {
    fn new(delay_ms: u64, faults: Faults) -> Arc<Self> {
        Arc::new(FakeFactory {
            delay: Duration::from_millis(delay_ms),
            faults: Arc::new(faults),
            counters: Arc::new(Counters::default()),
        })
    }
}

impl EngineFactory for FakeFactory {
    fn create(&self, target: &EngineTarget<'_>) -> Result<EngineHandle, EngineError> {
        let engine = FakeEngine {
            model: target.deployment.model.clone(),
            delay: self.delay,
            faults: Arc::clone(&self.faults),
            counters: Arc::clone(&self.counters),
            dead: watch::channel(false).0,
            awake: AtomicBool::new(false),
            in_flight: AtomicU64::new(0),
            in_flight_prompt: AtomicU64::new(0),
        };
        Ok(EngineHandle { engine: Arc::new(engine), served_model: target.deployment.model.clone() })
    }
}

// ---------------------------------------------------------------------------------------------
// The real emulated replica over HTTP: an in-process `switchyard emulate` server per replica,
// started by `load` and stopped by `unload`, reached through the engines' `HttpEngine`.

struct InProcessEmulator {
    config: EmulateConfig,
    served: String,
    server: Mutex<Option<EmulateServer>>,
    http: Mutex<Option<Arc<HttpEngine>>>,
}

impl InProcessEmulator {
    fn http(&self) -> Result<Arc<HttpEngine>, EngineError> {
        self.http.lock().unwrap().clone().ok_or_else(|| EngineError::Unreachable("no server".into()))
    }
}

fn http_options() -> HttpOptions {
    HttpOptions {
        api: ApiFlavor::Completions,
        request_timeout: Duration::from_secs(30),
        health_timeout: Duration::from_secs(30),
        stall_timeout: Duration::from_secs(30),
        api_key: None,
        headers: BTreeMap::new(),
    }
}

impl Engine for InProcessEmulator {
    fn kind(&self) -> &'static str {
        "emulated"
    }
    fn load(&self) -> EngineFuture<'_, ()> {
        Box::pin(async move {
            let server = EmulateServer::start(self.config.clone(), "127.0.0.1:0".parse().unwrap())
                .await
                .map_err(|e| EngineError::Lifecycle(e.to_string()))?;
            let http = Arc::new(HttpEngine::new("emulated", &server.base_url(), &self.served, http_options())?);
            http.load().await?;
            *self.server.lock().unwrap() = Some(server);
            *self.http.lock().unwrap() = Some(http);
            Ok(())
        })
    }
    fn sleep(&self, level: u8) -> EngineFuture<'_, ()> {
        Box::pin(async move { self.http()?.sleep(level).await })
    }
    fn wake(&self) -> EngineFuture<'_, ()> {
        Box::pin(async move { self.http()?.wake().await })
    }
    fn unload(&self) -> EngineFuture<'_, ()> {
        Box::pin(async move {
            self.http.lock().unwrap().take();
            let server = self.server.lock().unwrap().take();
            if let Some(s) = server {
                s.shutdown().await.map_err(|e| EngineError::Lifecycle(e.to_string()))?;
            }
            Ok(())
        })
    }
    fn submit(&self, request: LlmRequest) -> EngineFuture<'_, Completion> {
        Box::pin(async move { self.http()?.submit(request).await })
    }
    fn telemetry(&self) -> EngineFuture<'_, EngineTelemetry> {
        Box::pin(async move { self.http()?.telemetry().await })
    }
}

struct InProcessFactory {
    speed: f64,
}

impl EngineFactory for InProcessFactory {
    fn create(&self, target: &EngineTarget<'_>) -> Result<EngineHandle, EngineError> {
        let d = target.deployment;
        let mut config = EmulateConfig::new(target.device_spec.name.clone(), d.model.clone());
        config.dtype = d.dtype;
        config.max_model_len = Some(d.max_model_len);
        config.gpu_memory_utilization = d.gpu_memory_utilization;
        config.max_num_seqs = d.max_num_seqs;
        config.speed = self.speed;
        config.noise_seed = u64::from(target.replica.0);
        let engine = InProcessEmulator {
            config,
            served: d.model.clone(),
            server: Mutex::new(None),
            http: Mutex::new(None),
        };
        Ok(EngineHandle { engine: Arc::new(engine), served_model: d.model.clone() })
    }
}

// ---------------------------------------------------------------------------------------------
// Set-up.

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn workflows(names: &[&str]) -> Vec<Arc<WorkflowSpec>> {
    names
        .iter()
        .map(|n| Arc::new(load_workflow(&repo().join("workflows").join(format!("{n}.yaml"))).expect("bundled workflow")))
        .collect()
}

fn sim_config(names: &[&str], sessions: usize, pool: &str, seed: u64) -> RunConfig {
    RunConfig {
        workflows: workflows(names),
        sessions,
        arrival: Arrival::Burst,
        seed,
        noise_seed: 0,
        pool: PoolSpec::load(&repo().join("workflows/pools").join(format!("{pool}.yaml"))).expect("bundled pool"),
        policy: "joint".into(),
        options: JointOptions::default(),
        predictor: "oracle".into(),
        tool_workers: 2,
        max_num_seqs: 256,
        substrate: Default::default(),
        session_counts: Vec::new(),
        workflow_arrivals: Vec::new(),
        handoff_s: switchyard_runtime::exec::FRAMEWORK_HANDOFF_S,
        routing: Default::default(),
    }
}

fn live_config(run: RunConfig) -> LiveConfig {
    let mut cfg = LiveConfig::new(run);
    cfg.speed = 1000.0;
    cfg.retry = RetryPolicy { backoff: Duration::from_millis(2), ..RetryPolicy::default() };
    cfg.telemetry_every = Some(Duration::from_millis(20));
    cfg.deadline = Some(Duration::from_secs(60));
    cfg.tick = Duration::from_millis(20);
    cfg
}

/// A multi-threaded tokio runtime of two workers, timers and I/O on.
fn two_worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime")
}

fn run_live(cfg: &LiveConfig, factory: Arc<dyn EngineFactory>) -> LiveOutput {
    let rt = two_worker_runtime();
    rt.block_on(switchyard_runtime::live::run(cfg, factory, None)).expect("the live run finishes")
}

/// The outcome of every session computed without any scheduling: each session driven alone,
/// activation by activation, with the shared prepare step and the real tools.
fn reference(cfg: &RunConfig) -> BTreeMap<SessionId, (Option<NodeOutput>, Option<f64>)> {
    let (table, of) = exec::deployment_table(&cfg.workflows, cfg.max_num_seqs).unwrap();
    let info = exec::node_infos(&cfg.workflows, &of);
    let records = exec::load_records(&cfg.workflows).unwrap();
    let sizes: Vec<usize> = records.iter().map(|r| r.len()).collect();
    let ctx = PrepareContext { seed: cfg.seed, deployments: &table, deployment_of: &of, node_info: &info };
    let mut out = BTreeMap::new();
    for (i, e) in arrivals::trace_per_workflow(&cfg.arrivals_of(), &cfg.sessions_of(), &sizes, cfg.seed).iter().enumerate() {
        let id = SessionId(i as u32);
        let w = e.workflow as usize;
        let mut s = Session::new(id, Arc::clone(&cfg.workflows[w]), records[w][e.record].clone()).unwrap();
        while let Some(a) = s.ready().first().copied() {
            let output = match exec::prepare(&ctx, &mut s, e.workflow, a, 0.0).unwrap() {
                Ready::Tool { call, .. } => {
                    let o = switchyard_tools::run_tool(&call).unwrap();
                    NodeOutput { text: o.text, verdict: o.verdict, value: o.value, output_tokens: 0 }
                }
                Ready::Llm { prepared, .. } => {
                    s.mark_running(a.index).unwrap();
                    prepared.output
                }
                Ready::Fail(r) => panic!("reference session {id} failed: {r}"),
            };
            s.complete(a.index, output).unwrap();
        }
        assert!(s.is_finished(), "reference session {id} did not finish");
        out.insert(id, (s.final_output().cloned(), exec::session_score(&s)));
    }
    out
}

fn assert_each_session_once(out: &LiveOutput, total: usize) {
    let ids: BTreeSet<SessionId> = out.sessions.iter().map(|s| s.session).collect();
    assert_eq!(out.sessions.len(), total, "one result per session");
    assert_eq!(ids.len(), total, "no session reported twice");
}

fn call_keys(calls: &[exec::CallRecord]) -> Vec<(u32, u32, u32, u32, u32)> {
    let mut k: Vec<_> = calls.iter().map(|c| (c.session, c.activation, c.node, c.prompt_tokens, c.output_tokens)).collect();
    k.sort_unstable();
    k
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[test]
fn results_equal_the_simulators_for_the_same_seed() {
    let run = sim_config(&["gsm8k", "mbpp", "qmsum"], 3, "small", 11);
    let simulated = sim::simulate(&run, &mut |_, _| {}).expect("simulation");
    let factory = FakeFactory::new(2, Faults::default());
    let live = run_live(&live_config(run.clone()), factory.clone());

    assert!(live.report.failures.is_empty(), "{:?}", live.report.failures);
    assert_each_session_once(&live, 9);
    let (s, l) = (&simulated.report, &live.report);
    assert_eq!((l.sessions_total, l.sessions_completed), (s.sessions_total, s.sessions_completed));
    assert_eq!((l.llm_calls, l.tool_calls), (s.llm_calls, s.tool_calls));
    for (name, w) in &s.workflows {
        assert_eq!(l.workflows[name].accuracy, w.accuracy, "accuracy of {name}");
        assert_eq!(l.workflows[name].sessions_completed, w.sessions_completed, "{name}");
    }
    // The same activations ran, with the same prompts (token counts) and outputs, per session.
    assert_eq!(call_keys(&live.calls), call_keys(&simulated.calls));
    // Per session: the final answer and its score equal those of an unscheduled reference run.
    let expected = reference(&run);
    for r in &live.sessions {
        let (output, score) = &expected[&r.session];
        assert_eq!(&r.final_output, output, "final output of {}", r.session);
        assert_eq!(&r.score, score, "score of {}", r.session);
    }
    // The engines were driven through their lifecycle and every request answered once.
    let c = &factory.counters;
    assert!(c.loads.load(Ordering::SeqCst) >= 1);
    assert!(c.answered.lock().unwrap().values().all(|&n| n == 1));
    assert_eq!(c.answered.lock().unwrap().len() as u64, l.llm_calls);
    // GPU time partitions the window on every device, as in the simulator.
    let window = live.window.1 - live.window.0;
    let total = l.gpu_seconds_total.total();
    assert!((total - window * l.gpus as f64).abs() < 0.01 + 1e-6 * total, "{total} vs {window}");
    assert!(!live.telemetry.is_empty(), "replicas report telemetry");
}

#[test]
fn reclaim_by_sleep_puts_engines_to_sleep_and_wakes_them() {
    let mut run = sim_config(&["gsm8k", "mbpp", "qmsum"], 3, "small", 11);
    run.substrate.reclaim = switchyard_runtime::planner::Reclaim::Sleep;
    // A policy that sleeps every replica it reclaims (joint sleeps only where the model is
    // needed again soon, see the planner's tests), so the shell's sleep and wake paths run.
    run.policy = "parrot".into();
    let factory = FakeFactory::new(2, Faults::default());
    let live = run_live(&live_config(run.clone()), factory.clone());
    assert!(live.report.failures.is_empty(), "{:?}", live.report.failures);
    assert_each_session_once(&live, 9);
    let expected = reference(&run);
    for r in &live.sessions {
        assert_eq!(r.final_output, expected[&r.session].0, "final output of {}", r.session);
    }
    // The core's sleeps and wakes are what the engines were asked to do.
    let (l, c) = (&live.report, &factory.counters);
    assert!(l.sleeps >= 1, "nothing slept on a pool with more models than GPUs");
    assert_eq!(c.sleeps.load(Ordering::SeqCst), l.sleeps);
    assert_eq!(c.wakes.load(Ordering::SeqCst), l.wakes);
    assert!(c.answered.lock().unwrap().values().all(|&n| n == 1));
}

/// The live planner plans when the substrate's upscale delay runs out, not at the next event:
/// with calls that take 1.5 s of wall time (1,500 device seconds at speed 1000) no event comes
/// for a long while after the first loads, yet a baseline's scale-out starts within ticks of
/// its 30 device seconds.
#[test]
fn a_baselines_scale_out_starts_when_its_delay_runs_out_in_a_live_run() {
    // Two sequences per replica: ten sessions put each model over its target at once, and
    // their few ready units are all reported within milliseconds.
    let mut run = sim_config(&["gsm8k"], 10, "paper", 3);
    run.policy = "parrot".into();
    run.max_num_seqs = 2;
    let mut cfg = live_config(run);
    cfg.keep_trace = true;
    let live = run_live(&cfg, FakeFactory::new(1500, Faults::default()));
    assert!(live.report.failures.is_empty(), "{:?}", live.report.failures);
    // Wall seconds; the first planning pass loads one replica per model at once.
    let loads: Vec<f64> = live.trace.iter().filter(|l| l.event == "load").map(|l| l.t).collect();
    let first = loads.first().copied().expect("a load");
    let scale_out = loads.iter().copied().find(|&t| t > first + 0.02).expect("a scale-out");
    // 30 device seconds are 0.03 s of wall time; the first call ends at 1.5 s (without the
    // wake-up the scale-out came then: 1.51 s; with it 0.04–0.06 s, a tick or two late).
    assert!(scale_out < first + 1.0, "the first scale-out at {scale_out} s wall, loads at {loads:?}");
}

#[test]
fn results_over_http_against_the_emulated_replica_equal_the_simulators() {
    let run = sim_config(&["gsm8k", "mbpp", "qmsum"], 2, "small", 4);
    let simulated = sim::simulate(&run, &mut |_, _| {}).expect("simulation");
    let mut cfg = live_config(run.clone());
    cfg.speed = 1000.0;
    cfg.stream = true;
    let live = run_live(&cfg, Arc::new(InProcessFactory { speed: 1000.0 }));
    assert!(live.report.failures.is_empty(), "{:?}", live.report.failures);
    assert_each_session_once(&live, 6);
    let (s, l) = (&simulated.report, &live.report);
    assert_eq!((l.llm_calls, l.tool_calls), (s.llm_calls, s.tool_calls));
    for (name, w) in &s.workflows {
        assert_eq!(l.workflows[name].accuracy, w.accuracy, "accuracy of {name}");
    }
    assert_eq!(call_keys(&live.calls), call_keys(&simulated.calls));
    let expected = reference(&run);
    for r in &live.sessions {
        assert_eq!(r.final_output, expected[&r.session].0, "final output of {}", r.session);
    }
    // Usage came back from the server: prompt tokens counted, some served from the prefix cache.
    assert!(l.prompt_tokens > 0 && l.generated_tokens > 0);
    assert!(l.cached_prompt_tokens <= l.prompt_tokens);
    // The emulated engine generated what the simulator's did, thinking-mode calls' reasoning
    // traces included (each was one token short of its budget: one fewer per thinking call).
    assert_eq!(l.generated_tokens, s.generated_tokens, "generated tokens, live (the server's usage) vs simulated");
}

#[test]
fn a_replica_killed_mid_run_is_restarted_and_every_session_completes_once() {
    let run = sim_config(&["gsm8k", "qmsum"], 3, "small", 5);
    let expected = reference(&run);
    let factory = FakeFactory::new(5, Faults { kill_at_request: Some(6), ..Faults::default() });
    let mut cfg = live_config(run);
    cfg.keep_trace = true;
    let live = run_live(&cfg, factory.clone());
    assert_eq!(factory.counters.kills.load(Ordering::SeqCst), 1, "the fault fired");
    assert!(live.faults.restarts >= 1, "{:?}", live.faults);
    // Each restart is an event of the trace too (it was only a note, once per text).
    let restarts = live.trace.iter().filter(|l| l.event == "restart").count() as u64;
    assert_eq!(restarts, live.faults.restarts, "{:?}", live.faults);
    assert!(live.report.failures.is_empty(), "{:?}", live.report.failures);
    assert_each_session_once(&live, 6);
    for r in &live.sessions {
        assert_eq!(r.final_output, expected[&r.session].0, "{}", r.session);
    }
    assert!(factory.counters.answered.lock().unwrap().values().all(|&n| n == 1));
}

/// A deadline (or Ctrl-C) while engines are still loading ends the run at once: the loads are
/// cut short and their engines unloaded. The stop waited 30 s for each loading replica's actor,
/// which handled its stop only after its load (a review measured 38.6 s for an 8 s deadline).
#[test]
fn a_deadline_during_the_loads_cuts_them_short() {
    let run = sim_config(&["gsm8k"], 2, "small", 3);
    let factory = FakeFactory::new(5, Faults { load_hangs: true, ..Faults::default() });
    let mut cfg = live_config(run);
    cfg.deadline = Some(Duration::from_millis(500));
    let started = Instant::now();
    let live = run_live(&cfg, factory.clone());
    let took = started.elapsed();
    assert!(took < Duration::from_secs(15), "the stop waited for the loads: {took:?}");
    assert!(factory.counters.loads.load(Ordering::SeqCst) >= 1, "a load was under way");
    assert!(factory.counters.unloads.load(Ordering::SeqCst) >= 1, "the cut-short load's engine is unloaded");
    assert_eq!(live.report.sessions_completed, 0);
    assert!(!live.notes.iter().any(|n| n.contains("did not confirm its unload")), "{:?}", live.notes);
}

/// Calls still decoding at a deadline are aborted with their sessions, and what they had cost
/// is in the report's wasted work: the report was built before their aborts came back (a
/// review's run showed three calls decoding at the deadline and `wasted` empty).
#[test]
fn calls_in_flight_at_the_deadline_are_counted_as_wasted() {
    let run = sim_config(&["gsm8k"], 2, "small", 3);
    let factory = FakeFactory::new(20_000, Faults { first_token_before_delay: true, ..Faults::default() });
    let mut cfg = live_config(run);
    cfg.deadline = Some(Duration::from_millis(1500));
    let live = run_live(&cfg, factory.clone());
    assert_eq!(live.report.sessions_completed, 0);
    assert!(factory.counters.requests.load(Ordering::SeqCst) >= 1, "calls were in flight");
    let w = live.report.wasted;
    assert!(w.attempts >= 1 && w.output_tokens >= 1, "{w:?}");
}

/// A live trace's `first_token` is stamped when the first token came, not when the answer
/// ended (it was logged at the finish, its time only in `detail`): once per call, before its
/// `finish` by the engine's time after the first token.
#[test]
fn the_traces_first_token_comes_when_the_first_token_does() {
    let run = sim_config(&["gsm8k"], 2, "small", 3);
    let factory = FakeFactory::new(400, Faults { first_token_before_delay: true, ..Faults::default() });
    let mut cfg = live_config(run);
    cfg.keep_trace = true;
    let live = run_live(&cfg, factory);
    assert!(live.report.failures.is_empty(), "{:?}", live.report.failures);
    let at = |event: &str| -> BTreeMap<(u32, u32), Vec<f64>> {
        let mut m: BTreeMap<(u32, u32), Vec<f64>> = BTreeMap::new();
        for l in live.trace.iter().filter(|l| l.event == event) {
            m.entry((l.session.unwrap_or(u32::MAX), l.activation.unwrap_or(u32::MAX))).or_default().push(l.t);
        }
        m
    };
    let (first, finish) = (at("first_token"), at("finish"));
    assert_eq!(first.keys().collect::<Vec<_>>(), finish.keys().collect::<Vec<_>>(), "a first token per finished call");
    for (call, f) in &first {
        assert_eq!(f.len(), 1, "{call:?}: {f:?}");
        let end = finish[call][0];
        // The engine sleeps 0.4 s after the first token (a generous margin for a busy machine).
        assert!(f[0] <= end - 0.2, "{call:?}: first token at {} s, finish at {end} s", f[0]);
    }
}

#[test]
fn calls_of_a_replica_that_stays_dead_move_to_another_replica() {
    // Two A100s: gsm8k's models fit either, so a dead device's calls have somewhere to go.
    let mut run = sim_config(&["gsm8k"], 4, "small", 3);
    run.pool.devices = vec![run.pool.devices[0].clone(), run.pool.devices[0].clone()];
    let expected = reference(&run);
    let factory = FakeFactory::new(5, Faults { kill_at_request: Some(3), stay_dead: true, ..Faults::default() });
    let live = run_live(&live_config(run), factory.clone());
    assert_eq!(factory.counters.kills.load(Ordering::SeqCst), 1);
    assert!(live.faults.migrated_calls >= 1, "{:?}", live.faults);
    assert!(live.report.failures.is_empty(), "{:?}", live.report.failures);
    assert_each_session_once(&live, 4);
    for r in &live.sessions {
        assert_eq!(r.final_output, expected[&r.session].0, "{}", r.session);
    }
    assert!(live.notes.iter().any(|n| n.contains("was lost")), "{:?}", live.notes);
}

#[test]
fn bad_answers_are_retried_with_backoff() {
    let run = sim_config(&["qmsum"], 2, "small", 9);
    let factory = FakeFactory::new(1, Faults { bad_attempts_per_request: 2, ..Faults::default() });
    let live = run_live(&live_config(run), factory.clone());
    assert!(live.report.failures.is_empty(), "{:?}", live.report.failures);
    assert_eq!(live.report.sessions_completed, 2);
    // Two extra attempts per call.
    assert_eq!(live.faults.retries, 2 * live.report.llm_calls, "{:?}", live.faults);
    // What the broken attempts had cost is reported apart from the answered calls' work.
    let w = live.report.wasted;
    assert_eq!(w.attempts, 2 * live.report.llm_calls, "{w:?}");
    assert_eq!(w.output_tokens, 3 * w.attempts, "{w:?}");
    assert_eq!(w.prompt_tokens, factory.counters.broken_prompt_tokens.load(Ordering::SeqCst), "{w:?}");
    assert!(w.prompt_tokens > 0);
    let json = serde_json::to_value(&live.report).unwrap();
    assert_eq!(json["wasted"]["attempts"], w.attempts);
}

#[test]
fn a_backend_that_keeps_answering_garbage_fails_its_sessions_with_the_reason() {
    let run = sim_config(&["qmsum"], 2, "small", 9);
    let model = run.workflows[0].deployments.values().next().unwrap().model.clone();
    let factory = FakeFactory::new(1, Faults { always_bad_model: Some(model), ..Faults::default() });
    let live = run_live(&live_config(run), factory.clone());
    assert_each_session_once(&live, 2);
    assert_eq!(live.report.sessions_failed, 2);
    for r in &live.sessions {
        let reason = r.failed.as_deref().unwrap_or_default();
        assert!(reason.contains("answered badly 4 times") && reason.contains("HTTP 500"), "{reason}");
    }
    // Every attempt the engine saw broke off after its first tokens: the failed calls' four
    // each are wasted work, and so are their siblings' attempts, aborted with their sessions
    // (those whose word reaches the planner before the run's report is made).
    let seen: u32 = factory.counters.attempts.lock().unwrap().values().sum();
    let w = live.report.wasted;
    assert!(w.attempts >= 4 * live.faults.failed_calls && w.attempts <= u64::from(seen), "{w:?} {:?}, {seen} seen", live.faults);
    assert_eq!(w.output_tokens, 3 * w.attempts);
}

#[test]
fn a_structured_answer_that_misses_its_schema_is_asked_again_then_fails_the_session() {
    // The team's planner and reviewer declare JSON outputs: two per session.
    let run = sim_config(&["team"], 2, "small", 4);
    let sim_calls = sim::simulate(&run, &mut |_, _| {}).expect("simulates").report.llm_calls;
    let factory = FakeFactory::new(1, Faults { prose_for_json: 1, ..Faults::default() });
    let live = run_live(&live_config(run.clone()), factory);
    assert!(live.report.failures.is_empty(), "{:?}", live.report.failures);
    assert_eq!(live.report.sessions_completed, 2);
    assert_eq!(live.report.llm_calls, sim_calls + 4, "one extra call per structured activation");

    let factory = FakeFactory::new(1, Faults { prose_for_json: 99, ..Faults::default() });
    let live = run_live(&live_config(run), factory);
    assert_each_session_once(&live, 2);
    assert_eq!(live.report.sessions_failed, 2);
    for r in &live.sessions {
        let reason = r.failed.as_deref().unwrap_or_default();
        assert!(reason.starts_with("planner: the answer holds no JSON value (after 3 calls)"), "{reason}");
    }
}

#[test]
fn units_no_device_can_serve_fail_their_sessions_instead_of_hanging() {
    // GSM8K's 14B solver does not fit a V100-32GB at 0.9 utilisation.
    let mut run = sim_config(&["gsm8k"], 1, "small", 2);
    run.pool.devices = vec![run.pool.devices[1].clone()];
    let live = run_live(&live_config(run), FakeFactory::new(1, Faults::default()));
    assert_each_session_once(&live, 1);
    assert_eq!(live.report.sessions_failed, 1);
    assert!(live.report.failures[0].contains("could not be placed"), "{:?}", live.report.failures);
}

/// A unit no device can take any more fails naming the engine errors of its own model: the
/// last error was kept per device, so a unit of a model given up on a device was failed with
/// whatever other model had failed there last.
#[test]
fn an_unplaceable_unit_names_its_own_models_engine_errors() {
    // One A100: Qwen3-14B's server never starts (given up there), and another model's engine
    // fails on the same device after it.
    let mut run = sim_config(&["gsm8k"], 1, "small", 2);
    run.pool.devices = vec![run.pool.devices[0].clone()];
    let faults = Faults { load_fails_model: Some("Qwen3-14B".into()), bad_attempts_per_request: 1, ..Faults::default() };
    let live = run_live(&live_config(run), FakeFactory::new(1, faults));
    assert_eq!(live.report.sessions_failed, 1);
    let failure = &live.report.failures[0];
    assert!(failure.contains("could not be placed") && failure.contains("last engine errors of Qwen3-14B: gpu0: "), "{failure}");
    assert!(failure.contains("Qwen3-14B exits at start") && !failure.contains("HTTP 500"), "another model's error: {failure}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 6, ..proptest::prelude::ProptestConfig::default() })]

    /// Whatever the seed and whichever request a replica dies on (restartable or not), and
    /// however many bad answers precede each good one: every session ends exactly once, and
    /// completes with the answer an unscheduled run gives.
    #[test]
    fn every_session_ends_once_with_the_reference_answer_under_faults(
        seed in 0u64..10_000,
        kill_at in proptest::option::of(1u64..15),
        stay_dead: bool,
        bad in 0u32..3,
        delay_ms in 0u64..4,
    ) {
        let mut run = sim_config(&["gsm8k", "qmsum"], 2, "small", seed);
        run.pool.devices = vec![run.pool.devices[0].clone(), run.pool.devices[0].clone()];
        let expected = reference(&run);
        let faults = Faults { kill_at_request: kill_at, stay_dead, bad_attempts_per_request: bad, ..Faults::default() };
        let factory = FakeFactory::new(delay_ms, faults);
        let live = run_live(&live_config(run), factory.clone());
        assert_each_session_once(&live, 4);
        proptest::prop_assert!(live.report.failures.is_empty(), "{:?}", live.report.failures);
        for r in &live.sessions {
            proptest::prop_assert_eq!(&r.final_output, &expected[&r.session].0);
        }
        proptest::prop_assert!(factory.counters.answered.lock().unwrap().values().all(|&n| n == 1));
    }
}

/// The runtime's own overhead per LLM call (actor hops session → planner → replica → engine →
/// replica → planner → session, plus any wait for a grant) against calling the engine directly.
/// Run with `cargo test -p switchyard-runtime --test live_runtime -- --ignored --nocapture`.
#[test]
#[ignore]
fn overhead_per_llm_call() {
    let percentiles = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let at = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        (at(0.5), at(0.99), v.len())
    };
    // Directly: the same fake engine, awaited in a loop.
    let rt = two_worker_runtime();
    let factory = FakeFactory::new(0, Faults::default());
    let direct: Vec<f64> = rt.block_on(async {
        let cfg = sim_config(&["gsm8k"], 1, "paper", 1);
        let (table, _) = exec::deployment_table(&cfg.workflows, 256).unwrap();
        let spec = cfg.pool.devices[0].clone();
        let target = EngineTarget {
            replica: switchyard_runtime::ids::ReplicaId(0),
            device: switchyard_runtime::ids::DeviceId(0),
            device_spec: &spec,
            deployment: &table[0],
        };
        let h = factory.create(&target).unwrap();
        h.engine.load().await.unwrap();
        let mut out = Vec::new();
        for id in 0..2000 {
            let req = LlmRequest {
                id,
                model: h.served_model.clone(),
                prompt: "Question: what is 2 + 2?".into(),
                max_tokens: 16,
                server_default_limit: false,
                emulated_output: Some("4".into()),
                enable_thinking: false,
                stream: false,
                prompt_tokens: 0,
                deadline_s: None,
messages: None,
raw_prompt: false,
tools: Vec::new(),
tool_choice: None,
parallel_tool_calls: None,
stop: Vec::new(),
response_format: None,
sink: Default::default(),
meter: Default::default(),
            };
            let t0 = Instant::now();
            h.engine.submit(req).await.unwrap();
            out.push(t0.elapsed().as_secs_f64());
        }
        out
    });
    drop(rt);
    let mut cfg = live_config(sim_config(&["gsm8k", "qmsum"], 40, "paper", 1));
    cfg.run.arrival = Arrival::Poisson(4.0);
    cfg.speed = 1.0;
    let live = run_live(&cfg, FakeFactory::new(0, Faults::default()));
    assert!(live.report.failures.is_empty(), "{:?}", live.report.failures);
    let (d50, d99, n) = percentiles(direct);
    let (o50, o99, m) = percentiles(live.timings.iter().map(|t| t.overhead_s()).collect());
    let (g50, g99, _) = percentiles(live.timings.iter().map(|t| t.grant_s).collect());
    let (a50, a99, _) = percentiles(live.timings.iter().map(|t| t.after_grant_s()).collect());
    println!("in-memory engine, called directly: median {:.1} µs, p99 {:.1} µs over {n} calls", d50 * 1e6, d99 * 1e6);
    println!("added by the live runtime per LLM call: median {:.1} µs, p99 {:.1} µs over {m} calls", o50 * 1e6, o99 * 1e6);
    println!("  of which up to the grant (planner): median {:.1} µs, p99 {:.1} µs", g50 * 1e6, g99 * 1e6);
    println!("  of which after the grant (actor hops): median {:.1} µs, p99 {:.1} µs", a50 * 1e6, a99 * 1e6);

    // Over HTTP: the emulate server (at 10000x, so its compute is negligible) called directly,
    // and through the runtime.
    let rt = two_worker_runtime();
    let direct_http: Vec<f64> = rt.block_on(async {
        let mut config = EmulateConfig::new("A100-40GB", "Qwen3-4B");
        config.speed = 10000.0;
        config.max_model_len = Some(8192);
        let server = EmulateServer::start(config, "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let http = HttpEngine::new("emulated", &server.base_url(), "Qwen3-4B", http_options()).unwrap();
        http.load().await.unwrap();
        let mut out = Vec::new();
        for id in 0..500 {
            let req = LlmRequest {
                id,
                model: "Qwen3-4B".into(),
                prompt: format!("Question {id}: what is 2 + 2?"),
                max_tokens: 16,
                server_default_limit: false,
                emulated_output: Some("The answer is 4.".into()),
                enable_thinking: false,
                stream: false,
                prompt_tokens: 0,
                deadline_s: None,
messages: None,
raw_prompt: false,
tools: Vec::new(),
tool_choice: None,
parallel_tool_calls: None,
stop: Vec::new(),
response_format: None,
sink: Default::default(),
meter: Default::default(),
            };
            let t0 = Instant::now();
            http.submit(req).await.unwrap();
            out.push(t0.elapsed().as_secs_f64());
        }
        let _ = server.shutdown().await;
        out
    });
    drop(rt);
    let mut cfg = live_config(sim_config(&["qmsum"], 20, "paper", 1));
    cfg.run.arrival = Arrival::Poisson(4.0);
    cfg.speed = 10000.0;
    let live = run_live(&cfg, Arc::new(InProcessFactory { speed: 10000.0 }));
    assert!(live.report.failures.is_empty(), "{:?}", live.report.failures);
    let (h50, h99, n) = percentiles(direct_http);
    let (e50, e99, _) = percentiles(live.timings.iter().map(|t| t.engine_s).collect());
    let (o50, o99, m) = percentiles(live.timings.iter().map(|t| t.overhead_s()).collect());
    let (a50, a99, _) = percentiles(live.timings.iter().map(|t| t.after_grant_s()).collect());
    println!("emulate server over HTTP, called directly: median {:.1} µs, p99 {:.1} µs over {n} calls", h50 * 1e6, h99 * 1e6);
    println!("the same engine call inside the runtime: median {:.1} µs, p99 {:.1} µs", e50 * 1e6, e99 * 1e6);
    println!("added by the live runtime per LLM call: median {:.1} µs, p99 {:.1} µs over {m} calls", o50 * 1e6, o99 * 1e6);
    println!("  of which after the grant (actor hops): median {:.1} µs, p99 {:.1} µs", a50 * 1e6, a99 * 1e6);
}

/// A served runtime's configuration with the tiny chain fixture on the small pool.
fn served_tiny_chain() -> LiveConfig {
    tiny_chain_with_text().2
}

/// The tiny chain fixture, its YAML text (a server's start-up workflow takes both), and
/// [`served_tiny_chain`]'s configuration.
fn tiny_chain_with_text() -> (Arc<WorkflowSpec>, String, LiveConfig) {
    let path = repo().join("tests/fixtures/tiny_chain.yaml");
    let tiny = Arc::new(load_workflow(&path).expect("fixture"));
    let text = std::fs::read_to_string(&path).expect("fixture");
    let pool = PoolSpec::load(&repo().join("workflows/pools/small.yaml")).expect("bundled pool");
    let cfg = live_config(RunConfig::served(vec![Arc::clone(&tiny)], pool));
    (tiny, text, cfg)
}

/// Serves `app` on a loopback port until the test's tokio runtime ends; returns its root URL
/// (`http://ADDR`).
async fn serve_on_loopback(app: axum::Router) -> String {
    use switchyard_runtime::serve::serve_until;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let root = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(serve_until(listener, app, std::future::pending()));
    root
}

/// Starts `cfg`'s service on fast fake engines and serves it durably over `journal`, the tiny
/// chain its start-up workflow: the service, the server's root URL and what the journal held.
async fn serve_tiny_chain_durably(
    cfg: &LiveConfig,
    tiny: Arc<WorkflowSpec>,
    text: String,
    journal: &Arc<switchyard_runtime::live::journal::Journal>,
) -> (Arc<switchyard_runtime::live::Service>, String, switchyard_runtime::serve::Restored) {
    use switchyard_runtime::live::Service;
    use switchyard_runtime::serve::{ApiConfig, durable_router};
    let service = Arc::new(Service::start(cfg, FakeFactory::new(1, Faults::default())).await.expect("service"));
    let (app, restored) = durable_router(Arc::clone(&service), ApiConfig { token: None, ..ApiConfig::default() }, vec![(0, tiny, text)], Arc::clone(journal))
        .await
        .expect("router");
    (service, serve_on_loopback(app).await, restored)
}

/// A front-door call of one user message and 8 answer tokens; `last` ends its program.
fn front_door_call(content: &str, last: bool) -> switchyard_runtime::live::program_actor::ProgramRequest {
    switchyard_runtime::live::program_actor::ProgramRequest {
        messages: Some(vec![serde_json::json!({"role": "user", "content": content})]),
        prompt: None,
        max_tokens: 8,
        enable_thinking: false,
        program_done: last,
        next_model: None,
        step: None,
        ..Default::default()
    }
}

/// A front-door call made while the service stops is refused at once as unavailable (the
/// server answers 503), not scheduled and then failed as an engine error (502).
#[test]
fn a_call_while_the_service_stops_is_refused_as_unavailable() {
    use switchyard_runtime::live::engine::TokenSink;
    use switchyard_runtime::live::{Service, ServiceError};

    let cfg = served_tiny_chain();
    let rt = two_worker_runtime();
    rt.block_on(async {
        let service = Service::start(&cfg, FakeFactory::new(1, Faults::default())).await.expect("service");
        let mut stopping = Box::pin(service.shutdown("the test stops it"));
        // Up to its first wait (on a fast machine the whole stop may already be done): the stop
        // has begun.
        let first = futures::poll!(&mut stopping);
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let refused = service.call(Some("p".into()), "Qwen3-0.6B", front_door_call("hi", true), TokenSink::new(tx));
        assert!(matches!(&refused, Err(ServiceError::Unavailable(m)) if m.contains("shutting down")), "{:?}", refused.as_ref().err());
        match first {
            std::task::Poll::Ready(r) => drop(r.expect("shutdown")),
            std::task::Poll::Pending => drop(stopping.await.expect("shutdown")),
        }
    });
    // A call in flight when the service stops is answered as abandoned by the stop (503), not
    // as an engine's failure (502).
    let rt = two_worker_runtime();
    let answer = rt.block_on(async {
        let service = Service::start(&cfg, FakeFactory::new(5_000, Faults::default())).await.expect("service");
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let done = service.call(Some("p".into()), "Qwen3-0.6B", front_door_call("hi", false), TokenSink::new(tx)).expect("served");
        tokio::time::sleep(Duration::from_millis(100)).await;
        service.shutdown("the server stopped").await.expect("shutdown");
        done.await.expect("answered")
    });
    let shutting_down = switchyard_runtime::live::planner_actor::SHUTTING_DOWN;
    assert!(matches!(&answer, Err(m) if m.starts_with(shutting_down)), "{answer:?}");
}

/// A front-door call still queued when its client goes away is taken back before it is placed:
/// its program hears why, and the engine never gets it (it used to wait in the queue, counted
/// in the queue depth, until a replica took it).
#[test]
fn a_queued_call_whose_client_went_away_is_withdrawn() {
    use switchyard_runtime::live::Service;
    use switchyard_runtime::live::engine::TokenSink;

    let mut cfg = served_tiny_chain();
    // One replica taking one call at a time: the second and third calls queue.
    cfg.run.max_num_seqs = 1;
    cfg.run.substrate.replica_cap = Some(1);
    let factory = FakeFactory::new(300, Faults::default());
    let counters = Arc::clone(&factory.counters);
    let rt = two_worker_runtime();
    let (withdrawn, others) = rt.block_on(async {
        let service = Service::start(&cfg, factory).await.expect("service");
        let mut kept = Vec::new();
        let mut done = Vec::new();
        for (i, program) in ["a", "b", "c"].into_iter().enumerate() {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            done.push(service.call(Some(program.into()), "Qwen3-0.6B", front_door_call(&format!("call {i}"), true), TokenSink::new(tx)).expect("served"));
            kept.push(Some(rx));
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        // The last call's client goes away while the first runs and the second waits.
        kept[2] = None;
        let c = done.pop().expect("third");
        let withdrawn = tokio::time::timeout(Duration::from_secs(2), c).await;
        let mut others = Vec::new();
        for d in done {
            others.push(d.await.expect("answered").is_ok());
        }
        service.shutdown("the test ended").await.expect("shutdown");
        (withdrawn, others)
    });
    let reason = match withdrawn {
        Ok(Ok(Err(reason))) => reason,
        other => panic!("the third call was not withdrawn before the first ended: {other:?}"),
    };
    assert!(reason.contains("went away before its call was scheduled"), "{reason}");
    assert_eq!(others, [true, true]);
    assert_eq!(counters.requests.load(Ordering::SeqCst), 2, "the engine never got the withdrawn call");
}

/// Keyed programs past `max_programs` are refused (the server answers 429); the open ones and
/// calls without a key still run.
#[test]
fn programs_past_the_limit_are_refused() {
    use switchyard_runtime::live::Service;
    use switchyard_runtime::live::engine::TokenSink;
    use switchyard_runtime::live::planner_actor::TOO_MANY_PROGRAMS;

    let mut cfg = served_tiny_chain();
    cfg.max_programs = 2;
    let rt = two_worker_runtime();
    let outcomes = rt.block_on(async {
        let service = Service::start(&cfg, FakeFactory::new(1, Faults::default())).await.expect("service");
        let mut outcomes = Vec::new();
        for program in [Some("a"), Some("b"), Some("c"), Some("a"), None] {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            let done = service.call(program.map(String::from), "Qwen3-0.6B", front_door_call("hi", false), TokenSink::new(tx)).expect("served");
            outcomes.push(done.await.expect("answered").map(|_| ()));
        }
        service.shutdown("the test ended").await.expect("shutdown");
        outcomes
    });
    assert!(outcomes[..2].iter().all(Result::is_ok), "{outcomes:?}");
    assert!(matches!(&outcomes[2], Err(m) if m.starts_with(TOO_MANY_PROGRAMS)), "{outcomes:?}");
    assert!(outcomes[3..].iter().all(Result::is_ok), "an open program and a keyless call run: {outcomes:?}");
}

/// Over HTTP: a keyed program past `--max-programs` gets 429 `rate_limit_error`.
#[test]
fn the_front_door_answers_429_past_the_program_limit() {
    use switchyard_runtime::live::Service;
    use switchyard_runtime::serve::{ApiConfig, router};

    let (tiny, text, mut cfg) = tiny_chain_with_text();
    cfg.max_programs = 1;
    let rt = two_worker_runtime();
    let answers = rt.block_on(async {
        let service = Arc::new(Service::start(&cfg, FakeFactory::new(1, Faults::default())).await.expect("service"));
        let app = router(Arc::clone(&service), ApiConfig { token: None, ..ApiConfig::default() }, vec![(0, tiny, text)]);
        let url = format!("{}/v1/chat/completions", serve_on_loopback(app).await);
        let client = reqwest::Client::new();
        let mut answers = Vec::new();
        for (key, stream) in [("a", false), ("b", false), ("c", true)] {
            let body = serde_json::json!({"model": "Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream});
            let resp = client.post(&url).header("X-Session-ID", key).json(&body).send().await.expect("post");
            answers.push((resp.status().as_u16(), resp.text().await.unwrap_or_default()));
        }
        service.shutdown("the test ends").await.expect("shutdown");
        answers
    });
    assert_eq!(answers[0].0, 200, "{answers:?}");
    for refused in &answers[1..] {
        // A stream too: refused before its 200 is sent.
        assert_eq!(refused.0, 429, "{answers:?}");
        assert!(refused.1.contains("rate_limit_error") && refused.1.contains("--max-programs"), "{answers:?}");
    }
}

#[test]
fn a_served_runtime_folds_its_gpu_timeline_and_keeps_the_partition() {
    use switchyard_runtime::live::Service;
    use switchyard_runtime::live::engine::TokenSink;

    let mut cfg = served_tiny_chain();
    cfg.timeline_segments = 4;
    let rt = two_worker_runtime();
    let out = rt.block_on(async {
        let service = Service::start(&cfg, FakeFactory::new(1, Faults::default())).await.expect("service");
        // One program, 40 calls one after the other, 20 ms apart: each a busy period, so a segment
        // of its own.
        for i in 0..40 {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            let request = front_door_call(&format!("call {i}"), i == 39);
            let done = service.call(Some("p".into()), "Qwen3-0.6B", request, TokenSink::new(tx)).expect("served model");
            done.await.expect("answered").expect("completed");
            // An idle gap: the replica is resident but not generating.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        service.shutdown("the test ended").await.expect("shutdown")
    });
    let folded: Vec<_> = out.timelines.iter().filter_map(|tl| tl.folded.as_ref()).collect();
    assert!(!folded.is_empty(), "40 busy periods on a 4-segment bound fold");
    for tl in &out.timelines {
        // The bound (twice the kept segments) plus the intervals closed at the end.
        assert!(tl.segments.len() <= 2 * 4 + 3, "{}: {} segments", tl.name, tl.segments.len());
    }
    let folded_generation: f64 =
        folded.iter().flat_map(|f| f.seconds.iter()).filter(|((c, _), _)| *c == switchyard_runtime::report::gpu::Category::Generation).map(|(_, s)| s).sum();
    assert!(folded_generation > 0.0, "the folded time kept its generation: {folded:?}");
    // The partition still covers the window exactly: GPUs × makespan.
    let r = &out.report;
    let window = r.gpus as f64 * r.makespan_s;
    let g = r.gpu_seconds_total;
    assert!((g.total() - window).abs() < 1e-3 * window.max(1.0), "{g:?} vs {window}");
    assert_eq!(r.sessions_completed, 1, "{r:?}");
    // The one replica stays resident from its load to the end: its device is never *other*
    // after the load, folded part included (a fold that dropped the open resident interval
    // would turn the folded idle gaps into other).
    let busy = g.generation + g.idle_resident + g.loading;
    assert!(busy >= r.makespan_s - 0.05, "{g:?} over a makespan of {} s", r.makespan_s);
}

#[test]
fn the_live_runtime_routes_a_routed_workflow_like_the_simulator() {
    // gsm8k-routed: each session bound by the planner core's router at arrival, its verdict
    // teaching the learner at its end; its calls run (and are recorded) on the bound model.
    let run = sim_config(&["gsm8k-routed"], 8, "small", 3);
    let live = run_live(&live_config(run), FakeFactory::new(1, Faults::default()));
    let r = &live.report;
    assert_eq!((r.sessions_completed, r.sessions_failed), (8, 0), "{:?}", r.failures);
    let per_model = &r.routing["gsm8k-routed"];
    assert_eq!(per_model.values().map(|s| s.programs).sum::<u64>(), 8, "{per_model:?}");
    assert_eq!(per_model.values().map(|s| s.verdicts).sum::<u64>(), 8, "{per_model:?}");
    let models: BTreeSet<String> =
        live.calls.iter().filter_map(|c| c.model.as_ref().map(|(m, _)| m.clone())).collect();
    assert!(!models.is_empty() && models.iter().all(|m| per_model.contains_key(m)), "{models:?} vs {per_model:?}");
    assert_eq!(live.calls.iter().filter(|c| c.model.is_some()).count(), 8, "one LLM call per session, each with its model");
}

#[test]
fn disc_learns_the_allowance_from_the_engines_metrics_in_a_live_run() {
    // Engines whose every call in flight holds 300 tokens of KV beyond its prompt (the fake's
    // `/metrics`: running calls, KV usage and the cache's capacity): each routed model's ledger
    // learns δ̂ ≈ 300 from the scrapes (the calls last 150 ms, scraped every 20 ms). The fake
    // generates no KV while it decodes, so nothing else enters the allowance.
    let run = sim_config(&["gsm8k-routed"], 8, "small", 3);
    let faults = Faults { request_state_tokens: Some(300), ..Faults::default() };
    let live = run_live(&live_config(run.clone()), FakeFactory::new(150, faults));
    assert_eq!((live.report.sessions_completed, live.report.sessions_failed), (8, 0), "{:?}", live.report.failures);
    assert_eq!(live.allowances.len(), 3, "one ledger per routed model: {:?}", live.allowances);
    let learned: Vec<f64> = live.allowances.values().copied().filter(|d| *d > 0.0).collect();
    assert!(!learned.is_empty(), "the engines were observed: {:?}", live.allowances);
    assert!(learned.iter().all(|d| (200.0..=400.0).contains(d)), "{:?}", live.allowances);
    // Engines that do not report their cache (no capacity): nothing is learned.
    let blind = run_live(&live_config(run), FakeFactory::new(150, Faults::default()));
    assert!(blind.allowances.values().all(|d| *d == 0.0), "{:?}", blind.allowances);
}

#[test]
fn a_served_runtime_routes_a_routed_workflow_registered_after_start() {
    use switchyard_runtime::live::{Service, SessionStatus};
    use switchyard_runtime::workflow::parse_workflow;

    // The router is fitted at start on gsm8k-routed (models 0.6B, 1.7B, 8B; verifier
    // `gsm8k_exact`); gsm8k serves the 4B and 14B unrouted.
    let pool = PoolSpec::load(&repo().join("workflows/pools/small.yaml")).expect("bundled pool");
    let cfg = live_config(RunConfig::served(workflows(&["gsm8k-routed", "gsm8k"]), pool));
    let text = std::fs::read_to_string(repo().join("workflows/gsm8k-routed.yaml")).expect("bundled workflow");
    // Over the API a workflow names no dataset (its sessions' inputs come with each run), so its
    // emulated answers come from the generic responder.
    let (head, rest) = text.split_at(text.find("dataset:").expect("a dataset block"));
    let later = format!("{head}{}", &rest[rest.find("metric:").expect("a metric")..])
        .replace("name: gsm8k-routed", "name: later")
        .replace("responder: gsm8k.solve", "responder: generic");
    let parse = |text: &str| parse_workflow("request", text, Path::new("/nonexistent")).expect("a valid workflow");
    let inputs: Vec<_> =
        exec::load_records(&workflows(&["gsm8k-routed"])).expect("dataset").remove(0).iter().take(4).cloned().collect();
    let rt = two_worker_runtime();
    let out = rt.block_on(async {
        let service = Service::start(&cfg, FakeFactory::new(1, Faults::default())).await.expect("service");
        // A route outside the router's models, and a verifier its classifier cannot select.
        let unrouted = later.replace("name: later", "name: wider").replace("route: [qwen3-0.6b,", "route: [qwen3-14b,")
            .replace("  qwen3-0.6b: {", "  qwen3-14b: {model: Qwen3-14B, dtype: fp16, max_context: 16384, max_output_tokens: 8192}\n  qwen3-0.6b: {");
        let e = service.register(parse(&unrouted)).await.expect_err("the 14B is not a routed model");
        assert!(e.to_string().contains("Qwen3-14B, which is not one of the router's models"), "{e}");
        let summarised = later.replace("name: later", "name: summed").replace("kind: gsm8k_exact", "kind: rouge_l");
        let e = service.register(parse(&summarised)).await.expect_err("no rouge_l prototype");
        assert!(e.to_string().contains("verified by `rouge_l`"), "{e}");
        // Same models, same verifier: routed like the start-up workflow.
        let w = service.register(parse(&later)).await.expect("registered");
        let ids = service.submit(w, inputs).await.expect("submitted");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = service.status(ids.clone()).await.expect("status");
            if status.iter().all(|s| matches!(s, SessionStatus::Completed { .. } | SessionStatus::Failed { .. })) {
                assert!(status.iter().all(|s| matches!(s, SessionStatus::Completed { .. })), "{status:?}");
                break;
            }
            assert!(Instant::now() < deadline, "the sessions did not end: {status:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        service.shutdown("the test ended").await.expect("shutdown")
    });
    let per_model = &out.report.routing["later"];
    assert_eq!(per_model.values().map(|s| s.programs).sum::<u64>(), 4, "{per_model:?}");
    assert_eq!(per_model.values().map(|s| s.verdicts).sum::<u64>(), 4, "each verdict taught the learner: {per_model:?}");
    assert!(per_model.keys().all(|m| ["Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-8B"].contains(&m.as_str())), "{per_model:?}");
}

#[test]
fn a_streamed_answer_that_broke_off_after_reaching_its_caller_is_not_retried() {
    use switchyard_runtime::live::Service;
    use switchyard_runtime::live::engine::TokenSink;

    // Every request's first attempt streams a piece and then fails. A front-door call (its
    // caller streams the answer) fails rather than send a second attempt's text after the
    // first's; the runtime's own sessions (no caller streaming) still retry
    // (`bad_answers_are_retried_with_backoff`).
    let cfg = served_tiny_chain();
    let factory = FakeFactory::new(1, Faults { bad_attempts_per_request: 1, ..Faults::default() });
    let rt = two_worker_runtime();
    let (answer, pieces, out) = rt.block_on(async {
        let service = Service::start(&cfg, factory.clone()).await.expect("service");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let request = front_door_call("one call", true);
        let done = service.call(Some("p".into()), "Qwen3-0.6B", request, TokenSink::new(tx)).expect("served model");
        let answer = tokio::time::timeout(Duration::from_secs(30), done).await.expect("answered").expect("a reply");
        let mut pieces = Vec::new();
        while let Ok(p) = rx.try_recv() {
            pieces.push(p);
        }
        let out = service.shutdown("the test ended").await.expect("shutdown");
        (answer, pieces, out)
    });
    // The program's last call failed: so did the program.
    assert_eq!((out.report.sessions_completed, out.report.sessions_failed), (0, 1), "{:?}", out.report.failures);
    let reason = answer.expect_err("the call fails");
    assert!(reason.contains("after part of the answer had reached the caller"), "{reason}");
    assert_eq!(pieces, ["attempt 1 "], "the caller saw one attempt's text only");
    let attempts: Vec<u32> = factory.counters.attempts.lock().unwrap().values().copied().collect();
    assert_eq!(attempts, [1], "not sent again: {attempts:?}");
}

#[test]
fn a_run_refused_while_the_runtime_stops_is_journaled_as_never_started() {
    use switchyard_runtime::live::journal::{Journal, SessionOutcome};

    // A durable server whose runtime is stopping refuses a new run with 503; the sessions it had
    // journaled for it are finished as failed, so a restart does not resume a run its client was
    // told failed.
    let dir = tempfile::tempdir().expect("tempdir");
    let (tiny, text, cfg) = tiny_chain_with_text();
    let journal = Arc::new(Journal::open(&dir.path().join("state")).expect("journal"));
    let rt = two_worker_runtime();
    let (status, body) = rt.block_on(async {
        let (service, root, _) = serve_tiny_chain_durably(&cfg, tiny, text, &journal).await;
        let url = format!("{root}/v1/runs");
        service.shutdown("the test stops it").await.expect("shutdown");
        let resp = reqwest::Client::new().post(&url).json(&serde_json::json!({"workflow": "tiny-chain", "sessions": 3})).send().await.expect("post");
        (resp.status().as_u16(), resp.text().await.unwrap_or_default())
    });
    assert_eq!(status, 503, "{body}");
    assert!(!body.contains("enqueue"), "no actor-library wording: {body}");
    let outcomes = journal.session_outcomes().expect("outcomes");
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    assert!(outcomes.values().all(|o| matches!(o, SessionOutcome::Failed { reason } if reason.starts_with("not started"))), "{outcomes:?}");
}

/// A workflow a restart skipped (its journaled text no longer loads) keeps its name: another
/// text under that name is a conflict (409), refused before the planner registers it.
#[test]
fn a_skipped_journaled_workflow_keeps_its_name() {
    use switchyard_runtime::live::journal::Journal;

    let dir = tempfile::tempdir().expect("tempdir");
    let (tiny, text, cfg) = tiny_chain_with_text();
    let journal = Arc::new(Journal::open(&dir.path().join("state")).expect("journal"));
    let stale = text.replace("name: tiny-chain", "name: later").replace("Qwen3-0.6B", "Qwen3-0.6B-gone");
    journal.record_workflow("later", &stale).expect("record");
    let rt = two_worker_runtime();
    let (skipped, statuses, listed) = rt.block_on(async {
        let (service, root, restored) = serve_tiny_chain_durably(&cfg, tiny, text.clone(), &journal).await;
        let url = format!("{root}/v1/workflows");
        let client = reqwest::Client::new();
        let mut statuses = Vec::new();
        for _ in 0..2 {
            let resp = client.post(&url).body(text.replace("name: tiny-chain", "name: later")).send().await.expect("post");
            statuses.push(resp.status().as_u16());
        }
        let listed = client.get(&url).send().await.expect("list").text().await.unwrap_or_default();
        service.shutdown("the test ends").await.expect("shutdown");
        (restored.workflows_skipped, statuses, listed)
    });
    assert!(skipped.iter().any(|s| s.contains("`later`")), "{skipped:?}");
    assert_eq!(statuses, [409, 409]);
    assert!(!listed.contains("\"later\""), "{listed}");
    assert_eq!(journal.workflow("later").expect("read"), Some(stale), "the journaled text is kept");
}

#[test]
fn registrations_past_the_servers_workflow_limit_get_429() {
    use switchyard_runtime::live::Service;
    use switchyard_runtime::serve::{ApiConfig, router};

    let (tiny, text, cfg) = tiny_chain_with_text();
    let rt = two_worker_runtime();
    let statuses = rt.block_on(async {
        let service = Arc::new(Service::start(&cfg, FakeFactory::new(1, Faults::default())).await.expect("service"));
        let api = ApiConfig { max_workflows: 2, ..ApiConfig::default() };
        let app = router(Arc::clone(&service), api, vec![(0, tiny, text.clone())]);
        let url = format!("{}/v1/workflows", serve_on_loopback(app).await);
        let client = reqwest::Client::new();
        let mut statuses = Vec::new();
        // The start-up workflow counts: one more fits, the next does not; the same text of a
        // registered one is still answered, and validating needs no room.
        for body in [
            text.replace("name: tiny-chain", "name: second"),
            text.replace("name: tiny-chain", "name: third"),
            text.replace("name: tiny-chain", "name: second"),
        ] {
            let resp = client.post(&url).body(body).send().await.expect("post");
            statuses.push(resp.status().as_u16());
        }
        let check = serde_json::json!({"yaml": text.replace("name: tiny-chain", "name: third"), "validate_only": true});
        statuses.push(client.post(&url).json(&check).send().await.expect("validate").status().as_u16());
        service.shutdown("the test ends").await.expect("shutdown");
        statuses
    });
    assert_eq!(statuses, [201, 429, 200, 200]);
}

/// A program whose calls offer tools: after an answer that calls a tool, the client's time is
/// the tool's (the planner is told a tool runs, TAO may hold capacity for its return); after an
/// answer without a call, the agent's turn is over and no tool is reported.
#[test]
fn a_tool_gap_follows_a_tool_call_not_an_answer_that_ends_the_turn() {
    use switchyard_runtime::live::Service;
    use switchyard_runtime::live::engine::TokenSink;

    let cfg = served_tiny_chain();
    let rt = two_worker_runtime();
    let starts = rt.block_on(async {
        let service = Service::start(&cfg, FakeFactory::new(1, Faults::default())).await.expect("service");
        let mut events = service.subscribe();
        let tools = vec![serde_json::json!({"type": "function", "function": {"name": "now"}})];
        let user = serde_json::json!({"role": "user", "content": "What time is it?"});
        let turns = [
            vec![user.clone()],
            vec![user, serde_json::json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "now", "arguments": "{}"}}]}),
                serde_json::json!({"role": "tool", "tool_call_id": "c", "content": "12:00"})],
        ];
        let mut answers = Vec::new();
        for messages in turns {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            let request = switchyard_runtime::live::program_actor::ProgramRequest { messages: Some(messages), tools: tools.clone(), ..front_door_call("", false) };
            let done = service.call(Some("agent".into()), "Qwen3-0.6B", request, TokenSink::new(tx)).expect("served");
            answers.push(done.await.expect("answered").expect("answer").tool_calls.len());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(answers, [1, 0], "a call, then the answer");
        service.shutdown("the test ended").await.expect("shutdown");
        let mut starts = 0;
        while let Ok(line) = events.try_recv() {
            starts += usize::from(line.event == "tool_start");
        }
        starts
    });
    assert_eq!(starts, 1, "one tool gap: after the call, none after the answer");
}

#[test]
fn a_programs_key_reaches_a_live_program_or_starts_a_new_one_never_one_that_is_ending() {
    use switchyard_runtime::live::Service;
    use switchyard_runtime::live::engine::TokenSink;

    let mut cfg = served_tiny_chain();
    cfg.program_idle = Duration::from_millis(30);
    let rt = two_worker_runtime();
    let (answers, out) = rt.block_on(async {
        let service = Service::start(&cfg, FakeFactory::new(1, Faults::default())).await.expect("service");
        let mut answers = Vec::new();
        // Calls of one key with gaps around the idle timeout, so that some arrive while the
        // program is ending: each reaches its live program or starts a new one.
        for i in 0..30u64 {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            let done = service.call(Some("p".into()), "Qwen3-0.6B", front_door_call(&format!("call {i}"), false), TokenSink::new(tx)).expect("served model");
            answers.push(done.await.map_err(|e| e.to_string()).and_then(|r| r.map(|_| ())));
            tokio::time::sleep(Duration::from_millis(24 + (i * 7) % 13)).await;
        }
        // A program's last call frees its key at once: the next call starts a new program.
        for last in [true, false] {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            let done = service.call(Some("q".into()), "Qwen3-0.6B", front_door_call("q", last), TokenSink::new(tx)).expect("served model");
            answers.push(done.await.map_err(|e| e.to_string()).and_then(|r| r.map(|_| ())));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        (answers, service.shutdown("the test ended").await.expect("shutdown"))
    });
    let failed: Vec<_> = answers.iter().enumerate().filter(|(_, a)| a.is_err()).collect();
    assert!(failed.is_empty(), "every call is answered: {failed:?}");
    assert_eq!(out.report.sessions_failed, 0, "{:?}", out.report.failures);
    assert!(out.report.sessions_completed >= 3, "idle ends and the last call started new programs: {}", out.report.sessions_completed);
}
