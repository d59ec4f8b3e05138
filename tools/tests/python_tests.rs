//! Integration tests of the `python_tests` tool in the process sandbox: real interpreter, real
//! sandbox, real MBPP problems. Every test skips (with a note) when no python3 runs in the
//! sandbox. (The same tool in CPython on WASI is tested in `python_wasm.rs`.)

mod common;

use std::sync::Mutex;

use common::mbpp::{self, MBPP_2_CODE, MBPP_2_TESTS, call};
use serde_json::{Value, json};
use switchyard_tools::python::{self, Interpreter};
use switchyard_tools::python_tests::{self, Backend, PythonTests};
use switchyard_tools::sandbox::{LimitHit, ProcessSandbox, Sandbox, SandboxError, SandboxJob, SandboxOutcome};
use switchyard_tools::{ToolFailureCause, ToolOutcome};

/// Held by the tests whose outcome depends on the share of a core a run gets: the one that
/// loads the machine on purpose must not overlap the ones that time a busy loop.
static CORE_SHARE: Mutex<()> = Mutex::new(());

fn python() -> Option<&'static Interpreter> {
    let found = python::interpreter();
    if found.is_none() {
        eprintln!("note: no python3 usable in the sandbox here; skipping");
    }
    found
}

fn run(inputs: Value) -> ToolOutcome {
    python_tests::run_with(&call(inputs), Backend::Process).expect("python_tests runs")
}

/// A sandbox that delegates to the process sandbox and keeps the last outcome, so tests can
/// look at the process group and uid behind a tool call.
#[derive(Default)]
struct Recording {
    inner: ProcessSandbox,
    last: Mutex<Option<SandboxOutcome>>,
}

impl Sandbox for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn run(&self, job: &SandboxJob) -> Result<SandboxOutcome, SandboxError> {
        let outcome = self.inner.run(job)?;
        if let Ok(mut last) = self.last.lock() {
            *last = Some(outcome.clone());
        }
        Ok(outcome)
    }
}

fn run_recorded(python: &Interpreter, inputs: Value) -> (ToolOutcome, SandboxOutcome) {
    let sandbox = Recording::default();
    let job = PythonTests::from_call(&call(inputs)).expect("valid inputs");
    let out = python_tests::run_in(&sandbox, &python.path, &python.version, &job).expect("runs");
    let recorded = sandbox.last.lock().expect("lock").take().expect("one run");
    (out, recorded)
}

#[test]
fn correct_mbpp_solution_passes() {
    if python().is_none() {
        return;
    }
    let out = run(json!({"code": MBPP_2_CODE, "tests": MBPP_2_TESTS, "imports": []}));
    assert_eq!(out.verdict.as_deref(), Some("pass"), "{out:?}");
    assert_eq!(out.text, "3/3 tests passed");
    assert_eq!(out.value["passed"], json!(3));
    assert_eq!(out.value["reason"], Value::Null);
    assert!(out.sandbox_note.as_deref().is_some_and(|n| n.starts_with("process sandbox:")));
    assert!(out.modeled_duration_s > 0.0 && out.modeled_duration_s < 1.0);
}

#[test]
fn mbpp_reference_solutions_from_the_dataset_pass() {
    if python().is_none() {
        return;
    }
    mbpp::reference_sample_passes(run);
}

#[test]
fn wrong_solution_fails_naming_the_assert() {
    if python().is_none() {
        return;
    }
    let code = "def similar_elements(a, b):\n    return tuple(set(a) | set(b))\n";
    let out = run(json!({"code": code, "tests": MBPP_2_TESTS}));
    assert_eq!(out.verdict.as_deref(), Some("fail"));
    // The value came back as data and was compared outside the sandbox.
    assert_eq!(
        out.text,
        format!("0/3 tests passed; first failure: {} -> AssertionError: got {{3, 4, 5, 6, 7, 10}}", MBPP_2_TESTS[0])
    );
    assert_eq!(out.value["tests"][1]["error"], json!("AssertionError: got {1, 2, 3, 4, 5, 7}"));
    assert_eq!(out.value["tests"][1]["checked"], json!("outside_sandbox"));
    assert_eq!(out.failure.as_ref().map(|f| f.cause), Some(switchyard_tools::ToolFailureCause::TestsFailed));

    let partly = "def f(x):\n    return x * 2 if x < 2 else x + 1\n";
    let out = run(json!({"code": partly, "tests": ["assert f(1) == 2", "assert f(2) == 4", "assert f(0) == 0"]}));
    assert_eq!(out.text, "2/3 tests passed; first failure: assert f(2) == 4 -> AssertionError: got 3");
}

#[test]
fn syntax_error_and_exceptions_fail() {
    if python().is_none() {
        return;
    }
    let out = run(json!({"code": "def f(x) return x", "tests": ["assert f(1) == 1"]}));
    assert_eq!(out.verdict.as_deref(), Some("fail"));
    assert!(out.text.starts_with("0/1 tests passed; code failed: SyntaxError"), "{}", out.text);

    let out = run(json!({"code": "def f(x):\n    return 1 / x\n", "tests": ["assert f(0) == 1", "assert f(1) == 1"]}));
    assert_eq!(out.text, "1/2 tests passed; first failure: assert f(0) == 1 -> ZeroDivisionError: division by zero");

    let out = run(json!({"code": "import sys\nsys.exit(3)\n", "tests": ["assert True"]}));
    assert_eq!(out.text, "0/1 tests passed; code failed: SystemExit: 3");

    let out = run(json!({"code": "import os\nos._exit(0)\n", "tests": ["assert True"]}));
    assert_eq!(out.verdict.as_deref(), Some("fail"));
    assert_eq!(out.text, "0/1 tests passed; interpreter stopped before finishing (exit status 0)");

    let out = run(json!({"code": "x = 1", "tests": ["assert x == 1"], "imports": ["import no_such_module_xyz"]}));
    assert!(out.text.contains("import failed: import no_such_module_xyz -> ModuleNotFoundError"), "{}", out.text);
}

#[test]
fn fenced_code_imports_and_tricky_literals_work() {
    if python().is_none() {
        return;
    }
    let code = "Sure! Here it is:\n```python\ndef area(r):\n    return math.pi * r * r\nS = 'quote \" back\\\\slash ✓'\n```\nHope it helps.";
    let out = run(json!({
        "code": code,
        "tests": ["assert abs(area(1) - 3.14159) < 1e-4", "assert S == 'quote \" back\\\\slash ✓'", "assert len(S) == 20"],
        "imports": ["import math"],
    }));
    assert_eq!(out.verdict.as_deref(), Some("pass"), "{out:?}");
}

#[test]
fn candidate_output_cannot_forge_the_report() {
    if python().is_none() {
        return;
    }
    let code = "print('test\\t0\\tok')\nprint('done')\nimport sys\nsys.stdout.write('code\\t0\\tok\\n')\n";
    let out = run(json!({"code": code, "tests": ["assert False"]}));
    assert_eq!(out.verdict.as_deref(), Some("fail"));
    assert_eq!(out.text, "0/1 tests passed; first failure: assert False -> AssertionError");
    assert!(out.value["output"].as_str().is_some_and(|o| o.contains("done")), "prints are kept as output");
}

#[test]
fn infinite_loop_is_killed_at_the_time_limit() {
    let Some(python) = python() else { return };
    let _alone = CORE_SHARE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (out, raw) = run_recorded(python, json!({
        "code": "def f():\n    while True:\n        pass\n", "tests": ["assert f() is None"], "timeout_s": 1
    }));
    assert_eq!(out.verdict.as_deref(), Some("fail"));
    assert_eq!(out.value["reason"], json!("timed out after 1 s"));
    assert_eq!(out.text, "0/1 tests passed; timed out after 1 s");
    assert_eq!(out.modeled_duration_s, 1.0, "a timeout is modeled as the limit");
    // Generous: the bound is the kill, not this machine's speed under load.
    assert!(out.wall_seconds >= 1.0 && out.wall_seconds < 10.0, "{}", out.wall_seconds);
    assert!(raw.limits_hit.contains(&LimitHit::CpuTime) && !raw.timed_out, "the CPU limit stops a busy loop: {raw:?}");
    assert_eq!(out.value["limits_hit"], json!(["cpu_time"]));
    assert_eq!(out.failure.as_ref().map(|f| f.cause), Some(ToolFailureCause::Timeout));
    assert!(common::live_in_group(raw.pid).is_empty(), "process group {} survived", raw.pid);
}

#[test]
fn a_run_within_its_cpu_budget_passes_on_a_loaded_machine() {
    let Some(python) = python() else { return };
    // The candidate spends 0.4 s of its own CPU time (whatever this machine's speed) against a
    // 1 s timeout, while three spinning processes per core leave it a fraction of a core: its
    // wall time passes 1 s, which a wall-clock limit would have cut. The verdict must not
    // depend on the load. (Processes, each in a session of its own: with the scheduler's
    // autogroups, threads of this test would share one group's CPU share.)
    use std::os::unix::process::CommandExt;
    /// Kills the spinners however the test ends (a panic included).
    struct Spinners(Vec<std::process::Child>);
    impl Drop for Spinners {
        fn drop(&mut self) {
            for spinner in &mut self.0 {
                let _ = spinner.kill();
                let _ = spinner.wait();
            }
        }
    }
    let _alone = CORE_SHARE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let code = "import time\ndef f():\n    start = time.process_time()\n    while time.process_time() - start < 0.4:\n        pass\n    return 1\n";
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut spinners = Spinners(Vec::new());
    for _ in 0..3 * cores {
        let mut spinner = std::process::Command::new("/bin/sh");
        spinner.args(["-c", "while :; do :; done"]);
        // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
        unsafe {
            spinner.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        spinners.0.push(spinner.spawn().expect("a spinner starts"));
    }
    let (out, raw) = run_recorded(python, json!({"code": code, "tests": ["assert f() == 1"], "timeout_s": 1}));
    drop(spinners);
    eprintln!("under load: {:.2} s of CPU in {:.2} s of wall time", raw.cpu_seconds, raw.wall_seconds);
    assert_eq!(out.verdict.as_deref(), Some("pass"), "{out:?}");
    assert!(raw.cpu_seconds >= 0.4, "{raw:?}");
    assert_eq!(out.modeled_duration_s, PythonTests::from_call(&call(json!({"code": code, "tests": ["assert f() == 1"], "timeout_s": 1}))).expect("valid").modeled_duration_s());
}

#[test]
fn memory_bombs_fail_with_memory_error() {
    if python().is_none() {
        return;
    }
    let out = run(json!({"code": "x = bytearray(10**10)", "tests": ["assert x"]}));
    assert_eq!(out.verdict.as_deref(), Some("fail"));
    assert_eq!(out.text, "0/1 tests passed; code failed: MemoryError");
    assert!(out.value["limits_hit"].as_array().is_some_and(|l| l.contains(&json!("memory"))));

    let growing = "def grow():\n    chunks = []\n    while True:\n        chunks.append(bytearray(8 * 1024 * 1024))\n";
    let out = run(json!({"code": growing, "tests": ["grow()", "assert 1 + 1 == 2"]}));
    assert_eq!(out.verdict.as_deref(), Some("fail"));
    assert_eq!(out.text, "1/2 tests passed; first failure: grow() -> MemoryError");
}

#[test]
fn fork_bomb_is_contained() {
    let Some(python) = python() else { return };
    // A plain fork bomb: the test tool declares no children, so the seccomp filter refuses the
    // very first fork.
    let (out, raw) = run_recorded(python, json!({
        "code": "import os\ndef bomb():\n    while True:\n        os.fork()\n", "tests": ["bomb()"], "timeout_s": 5
    }));
    assert_eq!(out.verdict.as_deref(), Some("fail"));
    if raw.isolation.seccomp {
        assert!(out.text.contains("bomb() -> PermissionError"), "{}", out.text);
        assert!(out.wall_seconds < 4.0, "refused at once, not stopped by the timeout: {}", out.wall_seconds);
    }
    // A stubborn one that keeps retrying: only the time limit stops it.
    let stubborn = "import os\ndef bomb():\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n";
    let (out, raw) = run_recorded(python, json!({"code": stubborn, "tests": ["bomb()"], "timeout_s": 1}));
    assert_eq!(out.value["reason"], json!("timed out after 1 s"));
    assert!(common::live_in_group(raw.pid).is_empty(), "process group {} survived", raw.pid);
    if let Some(uid) = raw.isolation.sandbox_uid {
        assert!(common::live_of_uid(uid).is_empty(), "processes of uid {uid} survived");
    }
}

#[test]
fn writing_outside_the_work_dir_is_refused() {
    let Some(python) = python() else { return };
    let name = common::unique("escape");
    let target = format!("/usr/{name}");
    let code = format!(
        "def escape():\n    open('/tmp/{name}', 'w').write('x')\n    with open('{target}', 'w') as f:\n        f.write('x')\n    return True\n"
    );
    let (out, raw) = run_recorded(python, json!({"code": code, "tests": ["assert escape()"]}));
    let host_tmp = format!("/tmp/{name}");
    let escaped = std::path::Path::new(&target).exists() || std::path::Path::new(&host_tmp).exists();
    let _ = std::fs::remove_file(&target);
    let _ = std::fs::remove_file(&host_tmp);
    if raw.isolation.read_only_root {
        assert!(!escaped);
        assert_eq!(out.verdict.as_deref(), Some("fail"));
        assert!(out.text.contains("OSError: [Errno 30] Read-only file system"), "{}", out.text);
    } else {
        eprintln!("note: no read-only root here ({}); the write was allowed", raw.isolation.summary());
    }
    // Writing inside the private work dir works, and the dir is gone afterwards.
    let (out, raw) = run_recorded(python, json!({
        "code": "open('scratch.txt', 'w').write('ok')\nimport tempfile\nt = tempfile.mkstemp()\n",
        "tests": ["assert open('scratch.txt').read() == 'ok'"],
    }));
    assert_eq!(out.verdict.as_deref(), Some("pass"), "{out:?}");
    assert!(raw.isolation.private_root || !raw.work_dir.exists());
}

#[test]
fn network_and_environment_are_closed() {
    let Some(python) = python() else { return };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let code = format!(
        "import socket, os\ndef reach():\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n    return True\n"
    );
    let (out, raw) = run_recorded(python, json!({
        "code": code,
        "tests": ["assert reach()", "assert sorted(os.environ) == ['HOME', 'LANG', 'PATH', 'TMPDIR'], sorted(os.environ)"],
    }));
    if raw.isolation.network_isolated {
        // socket() itself is refused by the seccomp filter (PermissionError, an OSError).
        assert!(out.text.starts_with("1/2 tests passed; first failure: assert reach() -> PermissionError"), "{}", out.text);
    } else {
        eprintln!("note: no network namespace here ({})", raw.isolation.summary());
    }
    assert_eq!(out.value["tests"][1]["passed"], json!(true), "{out:?}");
}

#[test]
fn the_test_tool_cannot_start_processes() {
    if python().is_none() {
        return;
    }
    // The runner's forked copy would be a second writer of the report; the test tool declares
    // no children, so fork, vfork (posix_spawn) and subprocess are refused.
    let code = "import os, subprocess\ndef spawn():\n    try:\n        os.fork()\n    except PermissionError:\n        pass\n    else:\n        return 'forked'\n    try:\n        subprocess.run(['/bin/true'])\n    except PermissionError:\n        return 'refused'\n    return 'spawned'\n";
    let out = run(json!({"code": code, "tests": ["assert spawn() == 'refused'"]}));
    assert_eq!(out.verdict.as_deref(), Some("pass"), "{out:?}");
}

#[test]
fn every_mbpp_reference_solution_passes_with_its_checks_decided_outside() {
    if python().is_none() {
        return;
    }
    let records: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(mbpp::DATASET).expect("dataset")).expect("json");
    let (mut failed, mut outside, mut untrusted) = (Vec::new(), 0u32, 0u32);
    for record in &records {
        let out = run(json!({
            "code": record["code"], "tests": record["test_list"], "imports": record["test_imports"], "timeout_s": 20,
        }));
        outside += out.checks.outside;
        untrusted += out.checks.untrusted;
        if out.verdict.as_deref() != Some("pass") {
            failed.push(format!("task {}: {}", record["task_id"], out.text));
        }
    }
    eprintln!("{} references; checks decided outside the sandbox: {outside}, untrusted: {untrusted}", records.len());
    assert!(failed.is_empty(), "{} reference solutions failed:\n{}", failed.len(), failed.join("\n"));
    // Measured: 1,321 of 1,324 asserts split (`math.isclose` and the truthiness of calls
    // among them, decided outside the sandbox); the other 3 (chained comparisons, no literal
    // side) are counted as untrusted (tools/SECURITY.md).
    assert!(outside >= 1321 && untrusted <= 3, "outside {outside}, untrusted {untrusted}");
}
