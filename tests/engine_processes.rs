//! Process ownership of a live run, over the real `switchyard` binary: `switchyard run --live`
//! on a pool whose engines are `switchyard emulate` children started through the `vllm` kind's
//! command template. Each engine child is recorded in the engine registry while it runs; a
//! `kill -9` of Switchyard leaves no engine child (`PR_SET_PDEATHSIG`) and only stale entries,
//! which the sweep removes; SIGTERM and SIGINT stop the run cleanly (status 130, engines
//! unloaded, entries removed); a second signal quits at once and still leaves no child.
//! Loopback only; each test takes a few seconds.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use switchyard_runtime::live::engines::registry;

const EXE: &str = env!("CARGO_BIN_EXE_switchyard");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

const EMULATE_ARGS: &str = "--device {device} --model {served} --port {port} --speed {speed} --host {host} \
     --dtype {dtype} --max-model-len {max_len} --gpu-memory-utilization {util} --max-num-seqs {max_num_seqs} \
     --noise-seed {noise_seed} --enable-sleep-mode";

/// How the engine children are started.
#[derive(Clone, Copy)]
enum Children {
    /// `switchyard emulate …` through the `vllm` kind's command template, its output sent to
    /// `/dev/null` by an `exec` of `/bin/sh`: a child writing to the dead run's pipes would
    /// die of the broken pipe on its own, and the test would prove nothing.
    Emulate,
    /// `/bin/sh` that ignores SIGTERM and forks a `sleep` (ignoring it too) and
    /// `switchyard emulate …` into its process group, then waits for both: unloading it takes
    /// the whole grace period (10 s), and PR_SET_PDEATHSIG reaches only the shell, not what it
    /// forked, as with a vLLM server's workers.
    StubbornShell,
}

/// A live pool of two emulated GPUs, slow enough (speed 5) that the run is still going when
/// the test signals it. JSON is YAML, so the engine mapping is written with serde_json.
fn pool_file(dir: &Path, children: Children) -> PathBuf {
    let engine = match children {
        Children::Emulate => serde_json::json!({
            "kind": "vllm", "speed": 5, "health_timeout_s": 30, "shutdown_grace_s": 2,
            "command": ["/bin/sh", "-c", format!("exec \"$0\" emulate {EMULATE_ARGS} >/dev/null 2>&1"), EXE],
        }),
        Children::StubbornShell => serde_json::json!({
            "kind": "vllm", "speed": 5, "health_timeout_s": 30, "shutdown_grace_s": 10,
            "command": ["/bin/sh", "-c", format!("trap '' TERM; sleep 60 & \"$0\" emulate {EMULATE_ARGS} >/dev/null 2>&1; wait"), EXE],
        }),
    };
    let text = format!("name: procs\ndevices:\n  - {{ kind: A100-80GB, count: 2, engine: {engine} }}\n");
    let path = dir.join("pool.yaml");
    std::fs::write(&path, text).expect("write the pool file");
    path
}

struct Run {
    child: Child,
    registry: PathBuf,
    stdout: PathBuf,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl Run {
    fn start(children: Children) -> Run {
        let dir = tempfile::tempdir().expect("tempdir");
        let pool = pool_file(dir.path(), children);
        let registry = dir.path().join("registry");
        let stdout = dir.path().join("stdout.txt");
        let stderr = dir.path().join("stderr.txt");
        let child = Command::new(EXE)
            .args(["run", "--live", "--json", "--sessions", "6", "--deadline", "120", "--pool"])
            .arg(&pool)
            .arg(repo().join("workflows/gsm8k.yaml"))
            .env(registry::REGISTRY_ENV, &registry)
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("start switchyard run --live");
        Run { child, registry, stdout, stderr, _dir: dir }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The JSON report on stdout (`Null` when there is none).
    fn report(&self) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&self.stdout).unwrap_or_default()).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The engine children (pid, start time) once `n` of them run, within 20 s.
    fn engines_up(&mut self, n: usize) -> Vec<(i32, u64)> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let found = emulator_children(self.pid());
            if found.len() >= n {
                return found;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("switchyard exited ({status}) before its engines ran:\n{}", self.stderr());
            }
            assert!(Instant::now() < deadline, "no engine children after 20 s:\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid; no memory is touched.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "kill({}, {signal})", self.pid());
    }

    /// The exit code within `limit` (`None`: killed by a signal).
    fn exit_within(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("switchyard did not exit within {limit:?}:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `(state, ppid, start time)` of a process from `/proc/PID/stat`.
fn stat(pid: i32) -> Option<(char, i32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.first()?.chars().next()?, f.get(1)?.parse().ok()?, f.get(19)?.parse().ok()?))
}

/// Live (not zombie) children of `parent` whose command line contains `emulate`, with their
/// start times.
fn emulator_children(parent: i32) -> Vec<(i32, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Some((state, ppid, start)) = stat(pid) else { continue };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == parent && state != 'Z' && String::from_utf8_lossy(&cmd).contains("emulate") {
            out.push((pid, start));
        }
    }
    out.sort_unstable();
    out
}

/// Whether the process `pid` that started at `start` still runs (a zombie does not; a
/// reused pid is another process).
fn still_runs(pid: i32, start: u64) -> bool {
    stat(pid).is_some_and(|(state, _, s)| s == start && state != 'Z' && state != 'X')
}

/// The live processes of process group `pgid`.
fn group_members(pgid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((_, rest)) = text.rsplit_once(')') else { continue };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid) && f.first().is_some_and(|s| *s != "Z") {
            out.push(pid);
        }
    }
    out
}

/// Every one of `engines`, and every process of their groups, is gone within `limit`.
fn assert_gone(engines: &[(i32, u64)], limit: Duration, what: &str) {
    let deadline = Instant::now() + limit;
    loop {
        let mut left: Vec<i32> = engines.iter().filter(|(p, s)| still_runs(*p, *s)).map(|(p, _)| *p).collect();
        left.extend(engines.iter().flat_map(|(p, _)| group_members(*p)));
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "engine processes {left:?} survived {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn recorded_pgids(dir: &Path) -> Vec<i32> {
    let mut v: Vec<i32> = registry::entries(dir)
        .expect("read the registry")
        .into_iter()
        .filter_map(|(_, e)| e.ok().map(|e| e.pgid))
        .collect();
    v.sort_unstable();
    v
}

/// The registry records the running children, owned by the run.
fn assert_recorded(run: &Run, engines: &[(i32, u64)]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let want: Vec<i32> = engines.iter().map(|(p, _)| *p).collect();
    loop {
        let have = recorded_pgids(&run.registry);
        if want.iter().all(|p| have.contains(p)) {
            break;
        }
        assert!(Instant::now() < deadline, "children {want:?} not in the registry ({have:?})");
        std::thread::sleep(Duration::from_millis(20));
    }
    for (_, e) in registry::entries(&run.registry).unwrap() {
        let e = e.unwrap();
        assert_eq!(e.owner_pid, run.pid());
        if let Some((_, s)) = engines.iter().find(|(p, _)| *p == e.pgid) {
            assert_eq!(e.child_start, *s);
        }
    }
}

#[test]
fn kill_9_of_switchyard_leaves_no_engine_child() {
    let mut run = Run::start(Children::Emulate);
    let engines = run.engines_up(1);
    assert_recorded(&run, &engines);
    run.signal(libc::SIGKILL);
    assert_eq!(run.exit_within(Duration::from_secs(5)), None, "killed by SIGKILL");
    assert_gone(&engines, Duration::from_secs(5), "a kill -9 of switchyard");
    // Every engine the run had recorded — also one it was still starting when the signal came —
    // dies with it (the kernel's parent-death signal is delivered at once, but a child may take
    // a moment to finish dying).
    let recorded: Vec<(i32, u64)> = registry::entries(&run.registry)
        .expect("read the registry")
        .into_iter()
        .filter_map(|(_, e)| e.ok().map(|e| (e.pgid, e.child_start)))
        .collect();
    assert_gone(&recorded, Duration::from_secs(5), "a kill -9 of switchyard");
    // What is left are stale entries of a dead owner: the next run's sweep drops them and
    // has nothing to kill.
    assert!(!recorded_pgids(&run.registry).is_empty());
    let swept = registry::sweep_orphans(&run.registry).expect("sweep");
    assert!(swept.iter().all(|o| o.killed.is_empty() && o.problem.is_none()), "{swept:?}");
    assert_eq!(recorded_pgids(&run.registry), Vec::<i32>::new());
}

fn clean_stop_on(signal: libc::c_int) {
    let mut run = Run::start(Children::Emulate);
    let engines = run.engines_up(1);
    assert_recorded(&run, &engines);
    run.signal(signal);
    let code = run.exit_within(Duration::from_secs(20));
    let err = run.stderr();
    assert_eq!(code, Some(130), "exit status after signal {signal}:\n{err}");
    assert!(err.contains("partial report"), "{err}");
    assert_gone(&engines, Duration::from_secs(2), "the clean stop");
    assert_eq!(recorded_pgids(&run.registry), Vec::<i32>::new(), "a clean unload removes its entries");
}

#[test]
fn sigterm_stops_the_run_cleanly_and_unloads_the_engines() {
    clean_stop_on(libc::SIGTERM);
}

#[test]
fn sigint_stops_the_run_cleanly_and_unloads_the_engines() {
    clean_stop_on(libc::SIGINT);
}

#[test]
fn a_second_signal_quits_at_once_and_leaves_no_engine_child() {
    let mut run = Run::start(Children::StubbornShell);
    let engines = run.engines_up(1);
    run.signal(libc::SIGTERM);
    // Wait for the first signal to be taken (the handler says so) before the second.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !run.stderr().contains("terminated (SIGTERM)") {
        assert!(Instant::now() < deadline, "the first SIGTERM went unnoticed:\n{}", run.stderr());
        std::thread::sleep(Duration::from_millis(10));
    }
    // The clean stop is now waiting out the shells' grace period; the second signal, more than
    // the half second after the first in which a signal is the same interrupt, cuts it.
    std::thread::sleep(Duration::from_millis(800));
    assert!(run.child.try_wait().unwrap().is_none(), "the clean stop ended early:\n{}", run.stderr());
    let forked: Vec<i32> = engines.iter().flat_map(|(p, _)| group_members(*p)).collect();
    assert!(forked.len() > engines.len(), "the shells' groups hold what they forked: {forked:?}");
    run.signal(libc::SIGTERM);
    assert_eq!(run.exit_within(Duration::from_secs(5)), Some(143), "{}", run.stderr());
    assert_gone(&engines, Duration::from_secs(5), "the immediate exit");
    assert_eq!(recorded_pgids(&run.registry), Vec::<i32>::new(), "the immediate exit removes its entries");
}

/// How the first signal's handling reads on stderr.
fn wait_for_the_first_signal(run: &Run) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !run.stderr().contains("terminated (SIGTERM)") {
        assert!(Instant::now() < deadline, "the first SIGTERM went unnoticed:\n{}", run.stderr());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_sigterm_repeated_at_once_is_the_same_interrupt() {
    // coreutils' `timeout` sends SIGTERM to the process and then to its process group,
    // microseconds apart: one interrupt — the run stops cleanly with its partial report (the
    // repeat was taken as a second signal when it came after the handler had taken the first,
    // and quit with 143 and no report). Back to back, then once more just after the first one
    // was taken (which made the old handler quit every time).
    let mut run = Run::start(Children::Emulate);
    let engines = run.engines_up(1);
    run.signal(libc::SIGTERM);
    run.signal(libc::SIGTERM);
    wait_for_the_first_signal(&run);
    run.signal(libc::SIGTERM);
    let code = run.exit_within(Duration::from_secs(20));
    let err = run.stderr();
    assert_eq!(code, Some(130), "a repeated SIGTERM quit at once:\n{err}");
    assert_eq!(run.report()["interrupted"], true, "no partial report:\n{err}");
    assert_gone(&engines, Duration::from_secs(2), "the clean stop");
}
