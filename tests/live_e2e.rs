//! End to end over real processes and sockets: the live runtime manages `switchyard emulate`
//! child processes through the `vllm` engine's command template (the same code that manages
//! `vllm serve`), runs sessions of the three workflows, and its results (final answers and
//! accuracy; not timings) equal the simulator's for the same seed. A fault test kills an
//! emulator process mid-run: every session still completes, exactly once, with the same
//! answers; no child process outlives the run. Loopback only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use switchyard_runtime::exec::{self, Arrival, RunConfig};
use switchyard_runtime::live::engines::EngineSpec;
use switchyard_runtime::live::{self, LiveConfig, LiveOutput, LivePoolSpec, PoolEngines, RetryPolicy};
use switchyard_runtime::planner::JointOptions;
use switchyard_runtime::sim;
use switchyard_runtime::workflow::load_workflow;

// The CLI's live entry point, compiled into this test as `switchyard` compiles it.
#[path = "../src/live_cmd.rs"]
mod live_cmd;

const EXE: &str = env!("CARGO_BIN_EXE_switchyard");

/// The tests here find their emulator processes as children of this test process, and the
/// fault tests kill or stop all of them: they must not run at the same time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// A live pool of one A100-40GB and two V100-32GB, each replica an emulator at `speed`.
fn pool_file(dir: &Path, speed: f64) -> PathBuf {
    let engine = format!(
        "{{ kind: vllm, speed: {speed}, health_timeout_s: 30, shutdown_grace_s: 2, stall_timeout_s: 1, command: \"switchyard emulate \
         --device {{device}} --model {{model}} --port {{port}} --speed {{speed}} --host {{host}} --dtype {{dtype}} \
         --max-model-len {{max_len}} --gpu-memory-utilization {{util}} --max-num-seqs {{max_num_seqs}} \
         --noise-seed {{noise_seed}} --enable-sleep-mode\" }}"
    );
    let text = format!(
        "name: e2e\ndevices:\n  - {{ kind: A100-40GB, engine: {engine} }}\n  - {{ kind: V100-32GB, count: 2, engine: {engine} }}\n"
    );
    let path = dir.join("pool.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn configs(pool: &Path, sessions: usize, seed: u64) -> (RunConfig, LiveConfig, PoolEngines) {
    let workflows = ["gsm8k", "mbpp", "qmsum"]
        .iter()
        .map(|n| Arc::new(load_workflow(&repo().join("workflows").join(format!("{n}.yaml"))).unwrap()))
        .collect();
    let live_pool: LivePoolSpec<EngineSpec> = LivePoolSpec::load(pool).unwrap();
    let run = RunConfig {
        workflows,
        sessions,
        arrival: Arrival::Burst,
        seed,
        noise_seed: 0,
        pool: live_pool.pool.clone(),
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
    };
    let engines = PoolEngines::new(&live_pool, 0, Some(PathBuf::from(EXE))).unwrap();
    let mut cfg = LiveConfig::new(run.clone());
    cfg.speed = engines.speed().unwrap();
    cfg.retry = RetryPolicy {
        backoff: Duration::from_millis(20),
        restart_backoff: Duration::from_millis(50),
        ..RetryPolicy::default()
    };
    cfg.telemetry_every = Some(Duration::from_millis(200));
    cfg.deadline = Some(Duration::from_secs(240));
    (run, cfg, engines)
}

/// Emulator processes that are children of this test process.
fn emulator_children() -> Vec<u32> {
    let me = std::process::id();
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Field 4 (after the parenthesised command) is the parent pid.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        if ppid == Some(me) && cmd.contains("emulate") && !stat.contains(") Z ") {
            out.push(pid);
        }
    }
    out
}

fn assert_no_children_left() {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !emulator_children().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(emulator_children(), Vec::<u32>::new(), "emulator processes outlived the run");
}

fn assert_equal_to_simulation(live: &LiveOutput, run: &RunConfig) {
    let simulated = sim::simulate(run, &mut |_, _| {}).unwrap();
    let (s, l) = (&simulated.report, &live.report);
    assert!(l.failures.is_empty(), "{:?}", l.failures);
    let ids: BTreeSet<_> = live.sessions.iter().map(|r| r.session).collect();
    assert_eq!((live.sessions.len(), ids.len()), (s.sessions_total, s.sessions_total), "each session once");
    assert_eq!(l.sessions_completed, s.sessions_completed);
    assert_eq!((l.llm_calls, l.tool_calls), (s.llm_calls, s.tool_calls));
    for (name, w) in &s.workflows {
        assert_eq!(l.workflows[name].accuracy, w.accuracy, "accuracy of {name}");
    }
    let key = |c: &exec::CallRecord| (c.session, c.activation, c.node, c.prompt_tokens, c.output_tokens);
    let mut a: Vec<_> = live.calls.iter().map(key).collect();
    let mut b: Vec<_> = simulated.calls.iter().map(key).collect();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b, "the same activations with the same prompts and outputs");
}

#[test]
fn live_runs_over_emulator_processes_equal_the_simulation() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let pool = pool_file(dir.path(), 400.0);
    let (run, _, _) = configs(&pool, 2, 21);
    // Through the CLI's entry point, with the pool's devices read from the live pool file.
    let mut cli_run = run.clone();
    cli_run.pool = live_cmd::pool_spec(&pool).unwrap();
    let options = live_cmd::LiveOptions {
        deadline_s: Some(240.0),
        stream: true,
        switchyard_exe: Some(PathBuf::from(EXE)),
        ..Default::default()
    };
    let live = live_cmd::run_live(cli_run, &pool, &options, None).expect("live run");
    assert_equal_to_simulation(&live, &run);
    assert!(live.report.cached_prompt_tokens <= live.report.prompt_tokens);
    assert!(!live.telemetry.is_empty(), "replicas report their engines' /metrics");
    assert_no_children_left();
}

/// After 1.5 s of the run, sends `signal` (`-KILL`, `-STOP`) to every emulator child at once
/// (the ones serving are hit mid-request). Join the handle after the run to learn how many
/// were signalled; `done` ends the wait early when the run ended first.
fn signal_emulators_mid_run(signal: &'static str, done: Arc<AtomicBool>) -> std::thread::JoinHandle<u32> {
    std::thread::spawn(move || {
        let start = Instant::now();
        while !done.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(20));
            if start.elapsed() < Duration::from_millis(1500) {
                continue;
            }
            let signalled = emulator_children()
                .into_iter()
                .filter(|pid| {
                    let status = std::process::Command::new("kill").arg(signal).arg(pid.to_string()).status();
                    status.is_ok_and(|s| s.success())
                })
                .count();
            return u32::try_from(signalled).unwrap_or(u32::MAX);
        }
        0
    })
}

#[test]
fn an_emulator_killed_mid_run_costs_no_session() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (run, cfg, engines) = configs(&pool_file(dir.path(), 100.0), 2, 8);
    let done = Arc::new(AtomicBool::new(false));
    let killer = signal_emulators_mid_run("-KILL", Arc::clone(&done));
    let live = live::run_blocking(&cfg, Arc::new(engines), None).expect("live run");
    done.store(true, Ordering::SeqCst);
    assert_ne!(killer.join().unwrap(), 0, "emulator processes were killed mid-run");
    assert!(live.faults.restarts >= 1, "a replica serving requests was restarted: {:?}", live.faults);
    assert_equal_to_simulation(&live, &run);
    assert_no_children_left();
}

#[test]
fn an_emulator_stopped_mid_run_costs_seconds() {
    let _serial = serial();
    // `kill -STOP`: the process lives, its sockets accept, nothing answers. The stall probe
    // (`stall_timeout_s: 1`) finds the server dead, the replica is restarted in place (the
    // stopped group gets SIGTERM and SIGCONT), and the calls run again: seconds, not the
    // 600 s request timeout.
    let dir = tempfile::tempdir().unwrap();
    let (run, cfg, engines) = configs(&pool_file(dir.path(), 100.0), 2, 8);
    let done = Arc::new(AtomicBool::new(false));
    let stopper = signal_emulators_mid_run("-STOP", Arc::clone(&done));
    let started = Instant::now();
    let live = live::run_blocking(&cfg, Arc::new(engines), None).expect("live run");
    let took = started.elapsed();
    done.store(true, Ordering::SeqCst);
    assert_ne!(stopper.join().unwrap(), 0, "emulator processes were stopped mid-run");
    eprintln!("a run whose emulators were all stopped mid-run took {took:.1?} (restarts: {})", live.faults.restarts);
    assert!(live.faults.restarts >= 1, "a stopped replica was restarted: {:?}", live.faults);
    assert!(took < Duration::from_secs(90), "a stopped engine cost {took:?}");
    assert_equal_to_simulation(&live, &run);
    assert_no_children_left();
}
