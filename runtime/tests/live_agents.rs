//! Agent sessions (paper 000) on the live shell (`live::agents`) against two `switchyard
//! emulate` processes over real sockets: under TAO and under round-robin, every session pauses
//! at each tool call and resumes after it, every turn is answered with the trace's token
//! counts, later turns hit the engine's prefix cache, and every session completes exactly once.
//!
//! The other schedulers (cache-aware, Dynamo, ThunderAgent) and the error paths (retries,
//! rejected requests, turns too large to admit) run against an in-process fake engine.
//!
//! The processes: this test binary re-executes itself running the ignored test
//! `emulate_child_process`, which serves `switchyard emulate` (the same `server::run_blocking`
//! the CLI calls) on a free port it prints (`env!("CARGO_BIN_EXE_switchyard")` is only visible
//! to the root package's tests; `runtime/tests/live_engines.rs` does the same).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use switchyard_runtime::agentic::{AgentSession, AgentTrace, ToolStep, Turn};
use switchyard_runtime::live::agents::{
    AgentReplica, LiveAgentConfig, LiveAgentError, LiveAgentReport, run_agents_live,
};
use switchyard_runtime::live::engine::{Completion, Engine, EngineError, EngineFuture, EngineTelemetry, LlmRequest};
use switchyard_runtime::live::engines::{ApiFlavor, HttpEngine, HttpOptions};
use switchyard_runtime::live::server::{self, EmulateConfig};
use switchyard_runtime::planner::admission::{SchedulerKind, TaoOptions};

const DEVICE: &str = "L4";
const MODEL: &str = "Qwen3-0.6B";
const CHILD_ENV: &str = "SWITCHYARD_TEST_AGENTS_EMULATE_CHILD";
const LISTENING: &str = "agents emulate child listening on ";
/// Emulated seconds per wall second, for the engines and the tools alike.
const SPEED: f64 = 20.0;
/// Admission budget per replica (tokens): about two sessions each, so sessions wait in the
/// pool and TAO holds and re-plans.
const KV_TOKENS: u64 = 1_100;

/// Entry point of the child process (run only when re-executed with `CHILD_ENV` set).
#[test]
#[ignore = "entry point of the emulate child processes of the live agent tests"]
fn emulate_child_process() {
    let Ok(speed) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut cfg = EmulateConfig::new(DEVICE, MODEL);
    cfg.speed = speed.parse().expect("speed");
    cfg.max_model_len = Some(8192);
    server::run_blocking(cfg, SocketAddr::from(([127, 0, 0, 1], 0)), |a| eprintln!("{LISTENING}{a}"))
        .expect("emulate server");
}

/// One `switchyard emulate` child process, killed when dropped.
struct EmulateProcess {
    child: Child,
    base: String,
}

impl EmulateProcess {
    fn start() -> Self {
        let exe = std::env::current_exe().expect("test binary path");
        let mut child = Command::new(exe)
            .args(["emulate_child_process", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, SPEED.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the emulate child");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads the address, then keeps draining the pipe so that the child never blocks on it.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix(LISTENING) {
                    let _ = tx.send(addr.trim().to_string());
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a,
            Err(e) => {
                let _ = child.kill();
                panic!("the emulate child did not report its address: {e}");
            }
        };
        EmulateProcess { child, base: format!("http://{addr}") }
    }
}

impl Drop for EmulateProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Six sessions of three turns (two tool calls each), a shared 128-token system prompt.
fn trace() -> AgentTrace {
    let tools = ["bash.test", "bash.grep", "editor.view"];
    let sessions = (0..6u32)
        .map(|i| AgentSession {
            id: format!("task-{i}"),
            system_tokens: 128,
            turns: (0..3u32)
                .map(|k| Turn {
                    new_tokens: 80 + 16 * ((i + k) % 3),
                    output_tokens: 24 + 8 * ((i * 2 + k) % 3),
                    reasoning_tokens: 0,
                    tool: (k < 2).then(|| ToolStep {
                        name: tools[((i + k) % 3) as usize].to_string(),
                        duration_s: 0.4 + 0.3 * f64::from((i * 3 + k) % 5),
                        hint_s: (i % 2 == 0).then_some(0.4 + 0.3 * f64::from((i * 3 + k) % 5)),
                    }),
                })
                .collect(),
        })
        .collect();
    AgentTrace { sessions }
}

async fn replicas(procs: &[EmulateProcess]) -> Vec<AgentReplica> {
    let mut out = Vec::new();
    for p in procs {
        let options = HttpOptions {
            api: ApiFlavor::Completions,
            request_timeout: Duration::from_secs(20),
            health_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(5),
            ..HttpOptions::default()
        };
        let engine = HttpEngine::new("emulated", &p.base, MODEL, options).expect("engine");
        engine.load().await.expect("the emulate server loads");
        assert!(engine.facts().emulator, "{} is not `switchyard emulate`", p.base);
        out.push(AgentReplica { engine: Arc::new(engine), kv_tokens: KV_TOKENS });
    }
    out
}

/// Each session's turns (shown with `--nocapture`).
fn print_timeline(r: &LiveAgentReport) {
    for o in &r.outcomes {
        eprintln!("  {} latency {:.2} s", o.id, o.latency_s);
        for t in &o.turns {
            eprintln!(
                "    replica {} sent {:.2} done {:.2} ttft {:.2} prompt {} cached {}",
                t.replica, t.sent_at_s, t.finished_at_s, t.ttft_s, t.prompt_tokens, t.cached_tokens
            );
        }
    }
}

/// Whether a request on `replica` finished before `at` (trace seconds).
fn served_before(r: &LiveAgentReport, replica: usize, at: f64) -> bool {
    r.outcomes.iter().flat_map(|o| &o.turns).any(|t| t.replica == replica && t.finished_at_s < at)
}

fn check(trace: &AgentTrace, r: &LiveAgentReport) {
    let tool_calls = trace.tool_calls() as u64;
    assert_eq!(r.sessions, trace.sessions.len(), "{r:#?}");
    assert_eq!(r.requests, trace.turns() as u64, "every turn's request answered once");
    assert_eq!(r.tool_calls, tool_calls);
    assert_eq!(r.pauses, tool_calls, "one pause per tool call");
    assert_eq!(r.resumes, tool_calls, "one resume per tool call");
    assert_eq!(r.retries, 0);
    for (s, o) in trace.sessions.iter().zip(&r.outcomes) {
        assert_eq!(o.id, s.id);
        assert_eq!(o.completions, 1, "{} completed {} times", o.id, o.completions);
        assert_eq!(o.turns.len(), s.turns.len(), "{}: every turn answered", o.id);
        assert_eq!(o.tool_calls as usize, s.turns.len() - 1);
        for (k, (t, spec)) in o.turns.iter().zip(&s.turns).enumerate() {
            // The engine counted the trace's tokens: the prompt is the conversation so far.
            assert_eq!(t.prompt_tokens, s.prompt_tokens(k), "{} turn {k}: prompt tokens", o.id);
            assert_eq!(t.output_tokens, spec.output_tokens, "{} turn {k}: output tokens", o.id);
            assert!(t.ttft_s >= 0.0);
            if k > 0 && t.replica == o.turns[k - 1].replica {
                // Turn k extends turn k-1's prompt on the same engine: its whole prefix hits.
                let previous = o.turns[k - 1].prompt_tokens / 16 * 16;
                assert!(
                    t.cached_tokens >= previous,
                    "{} turn {k}: cached {} < previous prompt {previous}",
                    o.id,
                    t.cached_tokens
                );
            } else if k > 0 && served_before(r, t.replica, t.sent_at_s) {
                // Another engine that already served the shared system prompt.
                assert!(t.cached_tokens >= 128, "{} turn {k}: the system prompt missed ({t:?})", o.id);
            }
        }
        assert!(o.latency_s > 0.0);
    }
    // Every session's later turns found some of their conversation cached.
    for o in &r.outcomes {
        assert!(o.turns[1..].iter().any(|t| t.cached_tokens > 0), "{}: no later turn hit the cache: {o:?}", o.id);
    }
    assert!(r.cached_tokens > 0 && r.cache_hit_rate > 0.0);
    assert!(r.mean_latency_s > 0.0 && r.mean_ttft_s > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sessions_pause_and_resume_at_tool_calls_and_complete_exactly_once() {
    let procs = [EmulateProcess::start(), EmulateProcess::start()];
    let replicas = replicas(&procs).await;
    let trace = trace();
    for (seed, scheduler) in [(1, SchedulerKind::Tao), (2, SchedulerKind::RoundRobin)] {
        let mut cfg = LiveAgentConfig::new(MODEL, scheduler, 4);
        cfg.speed = SPEED;
        cfg.deadline_s = 20.0;
        cfg.text_seed = seed;
        cfg.tao = TaoOptions { quantum: 64, reserve_tokens: 64, ..TaoOptions::default() };
        let report = run_agents_live(&trace, &replicas, &cfg).await.unwrap_or_else(|e| panic!("{scheduler:?}: {e}"));
        eprintln!(
            "{}: {} sessions, {} requests, wall {:.2} s, mean latency {:.2} s, mean TTFT {:.3} s, cache hit {:.2}, \
             pauses {}, resumes {}, holds {}, planner {:?}, peak admitted {:?}",
            report.scheduler,
            report.sessions,
            report.requests,
            report.wall_s,
            report.mean_latency_s,
            report.mean_ttft_s,
            report.cache_hit_rate,
            report.pauses,
            report.resumes,
            report.holds,
            report.planner,
            report.peak_admitted_tokens
        );
        print_timeline(&report);
        check(&trace, &report);
        if scheduler == SchedulerKind::Tao {
            // Admission kept every replica within its budget (less the shared system prompt,
            // held once), and plans were applied.
            for &peak in &report.peak_admitted_tokens {
                assert!(peak > 0 && peak + 128 <= KV_TOKENS, "admitted {peak} of {KV_TOKENS}: {report:#?}");
            }
            assert!(report.planner.applications > 0 && report.planner.nonempty_applications > 0);
        }
    }
    drop(procs);
}

// ---- an in-process engine: the other schedulers and the error paths, without processes ----

/// Answers every request with its emulated output after `latency`, reporting the prompt's
/// full blocks as cached from the second turn on; the first `fail_first` calls fail with
/// `fail_with`.
struct FakeEngine {
    latency: Duration,
    fail_first: u32,
    fail_with: EngineError,
    calls: AtomicU32,
}

impl FakeEngine {
    fn new(fail_first: u32, fail_with: EngineError) -> Self {
        FakeEngine { latency: Duration::from_millis(3), fail_first, fail_with, calls: AtomicU32::new(0) }
    }
}

impl Engine for FakeEngine {
    fn kind(&self) -> &'static str {
        "fake"
    }
    fn load(&self) -> EngineFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn sleep(&self, _level: u8) -> EngineFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn wake(&self) -> EngineFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn unload(&self) -> EngineFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn telemetry(&self) -> EngineFuture<'_, EngineTelemetry> {
        Box::pin(async { Ok(EngineTelemetry::default()) })
    }
    fn submit(&self, request: LlmRequest) -> EngineFuture<'_, Completion> {
        Box::pin(async move {
            tokio::time::sleep(self.latency).await;
            if self.calls.fetch_add(1, Ordering::SeqCst) < self.fail_first {
                // The attempt fails mid-answer: its prompt was computed, three tokens streamed.
                request.meter.first_token();
                request.meter.add_output(3);
                return Err(self.fail_with.clone());
            }
            Ok(Completion {
                text: request.emulated_output.clone().unwrap_or_default(),
                prompt_tokens: request.prompt_tokens,
                cached_prompt_tokens: 0,
                output_tokens: request.max_tokens,
                ttft_s: 0.001,
                latency_s: self.latency.as_secs_f64(),
                ..Default::default()
            })
        })
    }
}

fn fake_pool(engines: Vec<FakeEngine>) -> Vec<AgentReplica> {
    engines.into_iter().map(|e| AgentReplica { engine: Arc::new(e), kv_tokens: KV_TOKENS }).collect()
}

fn fake_config(scheduler: SchedulerKind) -> LiveAgentConfig {
    let mut cfg = LiveAgentConfig::new(MODEL, scheduler, 4);
    cfg.speed = SPEED;
    cfg.deadline_s = 20.0;
    cfg.tao = TaoOptions { quantum: 64, reserve_tokens: 64, ..TaoOptions::default() };
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scheduler_pauses_resumes_and_completes_each_session_once() {
    let trace = trace();
    for scheduler in SchedulerKind::ALL {
        let pool = fake_pool(vec![
            FakeEngine::new(0, EngineError::BadResponse(String::new())),
            FakeEngine::new(0, EngineError::BadResponse(String::new())),
        ]);
        let r = run_agents_live(&trace, &pool, &fake_config(scheduler))
            .await
            .unwrap_or_else(|e| panic!("{scheduler:?}: {e}"));
        let tool_calls = trace.tool_calls() as u64;
        assert_eq!((r.sessions, r.requests), (trace.sessions.len(), trace.turns() as u64), "{scheduler:?}");
        assert_eq!((r.pauses, r.resumes, r.tool_calls), (tool_calls, tool_calls, tool_calls), "{scheduler:?}");
        for (s, o) in trace.sessions.iter().zip(&r.outcomes) {
            assert_eq!(o.completions, 1, "{scheduler:?}: {}", o.id);
            let prompts: Vec<u32> = o.turns.iter().map(|t| t.prompt_tokens).collect();
            let expected: Vec<u32> = (0..s.turns.len()).map(|k| s.prompt_tokens(k)).collect();
            assert_eq!(prompts, expected, "{scheduler:?}: {}", o.id);
        }
        assert!(r.wasted.is_empty(), "{scheduler:?}: {:?}", r.wasted);
        if scheduler == SchedulerKind::Tao {
            assert!(r.peak_admitted_tokens.iter().all(|&p| p + 128 <= KV_TOKENS), "{r:?}");
        }
    }
}

/// Out-of-range numbers are configuration errors: a `deadline_s` of 1e19 fit a `Duration` but
/// not `Instant + Duration` (it panicked once the run started), and a speed of 1e-300 made
/// every wall wait unbounded.
#[tokio::test]
async fn out_of_range_deadline_and_speed_are_configuration_errors() {
    let trace = trace();
    for (field, deadline_s, speed) in [("deadline_s", 1e19, SPEED), ("deadline_s", 4e7, SPEED), ("speed", 20.0, 1e-300), ("speed", 20.0, 1e9)] {
        let pool = fake_pool(vec![FakeEngine::new(0, EngineError::BadResponse(String::new()))]);
        let mut cfg = fake_config(SchedulerKind::RoundRobin);
        cfg.deadline_s = deadline_s;
        cfg.speed = speed;
        match run_agents_live(&trace, &pool, &cfg).await {
            Err(LiveAgentError::Config(m)) => assert!(m.contains(field), "{m}"),
            other => panic!("{field} {deadline_s} {speed}: {:?}", other.map(|r| r.sessions)),
        }
    }
}

#[tokio::test]
async fn retryable_errors_are_retried_and_counted_and_others_fail_the_run_with_their_kind() {
    let trace = trace();
    // Two transient failures: retried on the same replica, and the run completes.
    let pool = fake_pool(vec![
        FakeEngine::new(2, EngineError::BadResponse("HTTP 500".into())),
        FakeEngine::new(0, EngineError::BadResponse(String::new())),
    ]);
    let r = run_agents_live(&trace, &pool, &fake_config(SchedulerKind::RoundRobin)).await.unwrap();
    assert_eq!(r.retries, 2);
    // What the two failed attempts had cost is reported as wasted, from the call meter.
    assert_eq!((r.wasted.attempts, r.wasted.output_tokens), (2, 6));
    assert!(r.wasted.prompt_tokens > 0, "{:?}", r.wasted);
    assert_eq!(r.requests, trace.turns() as u64);
    assert!(r.outcomes.iter().all(|o| o.completions == 1));
    // A rejected request is not retried: the run fails with the engine's error, at once.
    for scheduler in [SchedulerKind::RoundRobin, SchedulerKind::Tao] {
        let pool = fake_pool(vec![
            FakeEngine::new(u32::MAX, EngineError::Rejected("HTTP 400".into())),
            FakeEngine::new(u32::MAX, EngineError::Rejected("HTTP 400".into())),
        ]);
        match run_agents_live(&trace, &pool, &fake_config(scheduler)).await {
            Err(LiveAgentError::Engine { source: EngineError::Rejected(_), turn: 0, .. }) => {}
            other => panic!("{scheduler:?}: {other:?}"),
        }
    }
    // A turn no replica could ever admit is refused before anything runs.
    let mut pool = fake_pool(vec![FakeEngine::new(0, EngineError::BadResponse(String::new()))]);
    pool[0].kv_tokens = 400;
    match run_agents_live(&trace, &pool, &fake_config(SchedulerKind::Tao)).await {
        Err(LiveAgentError::TooLarge { capacity: 272, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        run_agents_live(&trace, &[], &fake_config(SchedulerKind::Tao)).await,
        Err(LiveAgentError::EmptyPool)
    ));
    // Reasoning the conversation drops is simulated only: the live replay refuses it, naming
    // the session and the turn.
    let mut thinking = trace.clone();
    thinking.sessions[1].turns[2].reasoning_tokens = 64;
    let pool = fake_pool(vec![FakeEngine::new(0, EngineError::BadResponse(String::new()))]);
    match run_agents_live(&thinking, &pool, &fake_config(SchedulerKind::Tao)).await {
        Err(LiveAgentError::Config(m)) => assert!(m.contains("session task-1: turns[2].reasoning_tokens"), "{m}"),
        other => panic!("{other:?}"),
    }
}
