//! Integration tests of the `python_tests` tool in CPython compiled to WASI, under the
//! WebAssembly sandbox: real MBPP problems and each denial (endless loop, sleep, memory bomb,
//! reading `/etc/passwd`, writing outside the work directory, sockets). Every test skips with a
//! printed note when the runtime is not installed (`cargo run -p switchyard-tools --example
//! install_python_wasm`).

mod common;

use std::path::PathBuf;

use common::mbpp::{self, MBPP_2_CODE, MBPP_2_TESTS, call};
use serde_json::{Value, json};
use switchyard_tools::python_tests::{self, Backend, PythonTests};
use switchyard_tools::sandbox::WasmSandbox;
use switchyard_tools::ToolOutcome;

/// The installed runtime, or `None` with a note.
fn runtime() -> Option<PathBuf> {
    match python_tests::wasm_runtime() {
        Ok(path) => Some(path),
        Err(reason) => {
            eprintln!("note: skipping the python-in-wasm test: {reason}");
            None
        }
    }
}

fn run(inputs: Value) -> ToolOutcome {
    python_tests::run_with(&call(inputs), Backend::Wasm).expect("python_tests runs in wasm")
}

#[test]
fn correct_mbpp_solution_passes_in_wasm() {
    if runtime().is_none() {
        return;
    }
    let out = run(json!({"code": MBPP_2_CODE, "tests": MBPP_2_TESTS}));
    assert_eq!(out.verdict.as_deref(), Some("pass"), "{out:?}");
    assert_eq!(out.text, "3/3 tests passed");
    assert_eq!(out.value["sandbox"], json!("wasm"));
    assert_eq!(out.value["interpreter"], json!("3.12.0"));
    let note = out.sandbox_note.as_deref().unwrap_or("");
    assert!(note.starts_with("wasm sandbox: wasmtime 48.0.8, WASI preview 1"), "{note}");
    // Virtual time does not depend on the backend.
    let job = PythonTests::from_call(&call(json!({"code": MBPP_2_CODE, "tests": MBPP_2_TESTS}))).expect("valid");
    assert_eq!(out.modeled_duration_s, job.modeled_duration_s());
}

#[test]
fn auto_uses_wasm_or_says_why_it_fell_back() {
    let inputs = json!({"code": "x = 1", "tests": ["assert x == 1"]});
    match python_tests::wasm_runtime() {
        Ok(_) => {
            let out = python_tests::run_with(&call(inputs), Backend::Auto).expect("runs");
            assert_eq!(out.value["sandbox"], json!("wasm"));
        }
        Err(reason) => {
            if switchyard_tools::python::interpreter().is_none() {
                eprintln!("note: neither python.wasm nor a sandboxed python3 here; skipping");
                return;
            }
            let out = python_tests::run_with(&call(inputs), Backend::Auto).expect("falls back");
            assert_eq!(out.value["sandbox"], json!("process"));
            let note = out.sandbox_note.as_deref().unwrap_or("");
            assert!(note.starts_with("python_tests fell back to the process sandbox: python.wasm is not installed"), "{note}");
            assert!(note.contains(&reason.to_string()), "{note}");
            // The same note on every call, so a report listing distinct notes says it once.
            let again = python_tests::run_with(&call(json!({"code": "y = 2", "tests": ["assert y"]})), Backend::Auto)
                .expect("falls back");
            assert_eq!(
                again.sandbox_note.as_deref().map(|n| n.split("; uid:").next().map(str::to_string)),
                Some(note.split("; uid:").next().map(str::to_string))
            );
            // Asking for wasm explicitly is an error that names the reason, not a crash.
            let err = python_tests::run_with(&call(json!({"code": "", "tests": ["pass"]})), Backend::Wasm)
                .expect_err("unavailable");
            assert!(err.to_string().contains("not installed"), "{err}");
        }
    }
}

#[test]
fn mbpp_reference_solutions_pass_in_wasm() {
    if runtime().is_none() {
        return;
    }
    mbpp::reference_sample_passes(run);
}

#[test]
fn failures_name_the_assert_and_code_errors() {
    if runtime().is_none() {
        return;
    }
    let partly = "def f(x):\n    return x * 2 if x < 2 else x + 1\n";
    let out = run(json!({"code": partly, "tests": ["assert f(1) == 2", "assert f(2) == 4", "assert f(0) == 0"]}));
    assert_eq!(out.verdict.as_deref(), Some("fail"));
    assert_eq!(out.text, "2/3 tests passed; first failure: assert f(2) == 4 -> AssertionError: got 3");

    let out = run(json!({"code": "def f(x) return x", "tests": ["assert f(1) == 1"]}));
    assert!(out.text.starts_with("0/1 tests passed; code failed: SyntaxError"), "{}", out.text);

    let out = run(json!({"code": "import sys\nsys.exit(3)\n", "tests": ["assert True"]}));
    assert_eq!(out.text, "0/1 tests passed; code failed: SystemExit: 3");

    let out = run(json!({"code": "import os\nos._exit(4)\n", "tests": ["assert True"]}));
    assert_eq!(out.text, "0/1 tests passed; interpreter stopped before finishing (exit status 4)");
}

#[test]
fn candidate_prints_cannot_forge_the_report() {
    if runtime().is_none() {
        return;
    }
    let code = "print('test\\t0\\tok')\nprint('done')\nimport sys\nsys.stdout.write('code\\t0\\tok\\n')\n";
    let out = run(json!({"code": code, "tests": ["assert False"]}));
    assert_eq!(out.text, "0/1 tests passed; first failure: assert False -> AssertionError");
    assert!(out.value["output"].as_str().is_some_and(|o| o.contains("done")), "prints are kept as output");
}

#[test]
fn an_infinite_loop_times_out_as_a_failed_test() {
    if runtime().is_none() {
        return;
    }
    let out = run(json!({
        "code": "def f():\n    while True:\n        pass\n", "tests": ["assert f() is None"], "timeout_s": 1
    }));
    assert_eq!(out.verdict.as_deref(), Some("fail"));
    assert_eq!(out.value["reason"], json!("timed out after 1 s"));
    assert_eq!(out.text, "0/1 tests passed; timed out after 1 s");
    assert_eq!(out.modeled_duration_s, 1.0, "a timeout is modeled as the limit");
    // Its CPU budget stops it (the wall-clock backstop, 3 s, only on a machine that left it
    // under a third of a core: the exact clock is `wasm_sandbox.rs`'s test, with a wide backstop).
    assert!(out.wall_seconds >= 1.0 && out.wall_seconds < 4.0, "{}", out.wall_seconds);
    let hit = &out.value["limits_hit"];
    assert!(*hit == json!(["cpu_time"]) || *hit == json!(["wall_time"]), "{hit}");
}

#[test]
fn a_sleep_is_cut_at_the_time_limit() {
    if runtime().is_none() {
        return;
    }
    // A sleep spends no CPU: the wall-clock backstop (2 × 1 s + 1 s) cuts it.
    let out = run(json!({"code": "import time", "tests": ["time.sleep(60)"], "timeout_s": 1}));
    assert_eq!(out.value["reason"], json!("timed out after 1 s"), "{out:?}");
    assert_eq!(out.value["limits_hit"], json!(["wall_time"]));
    assert_eq!(out.modeled_duration_s, 1.0, "modeled as the timeout, whichever clock stopped it");
    assert!(out.wall_seconds >= 3.0 && out.wall_seconds < 5.0, "{}", out.wall_seconds);
}

#[test]
fn memory_bombs_fail_with_memory_error() {
    if runtime().is_none() {
        return;
    }
    // wasm32: 10**10 bytes do not even fit an index (OverflowError); 1 GiB fits but exceeds
    // the 512 MiB linear-memory limit.
    let out = run(json!({"code": "x = bytearray(2**30)", "tests": ["assert x"]}));
    assert_eq!(out.text, "0/1 tests passed; code failed: MemoryError");
    assert!(out.value["limits_hit"].as_array().is_some_and(|l| l.contains(&json!("memory"))), "{out:?}");
    let growing = "def grow():\n    chunks = []\n    while True:\n        chunks.append(bytearray(8 * 1024 * 1024))\n";
    let out = run(json!({"code": growing, "tests": ["grow()", "assert 1 + 1 == 2"]}));
    assert_eq!(out.text, "1/2 tests passed; first failure: grow() -> MemoryError", "{out:?}");
    assert!(out.value["limits_hit"].as_array().is_some_and(|l| l.contains(&json!("memory"))), "{out:?}");
}

#[test]
fn etc_passwd_cannot_be_read() {
    if runtime().is_none() {
        return;
    }
    let code = "def peek(path):\n    with open(path) as f:\n        return f.read()\n";
    let out = run(json!({"code": code, "tests": [
        "assert peek('/etc/passwd')",
        "assert peek('/work/../etc/passwd')",
        "assert peek('../../etc/passwd')",
    ]}));
    assert_eq!(out.value["passed"], json!(0), "{out:?}");
    for test in out.value["tests"].as_array().expect("tests") {
        let error = test["error"].as_str().unwrap_or("");
        assert!(
            ["FileNotFoundError", "PermissionError", "OSError"].iter().any(|e| error.starts_with(e)),
            "{error}"
        );
    }
}

#[test]
fn writing_outside_the_work_dir_is_refused_and_inside_works() {
    if runtime().is_none() {
        return;
    }
    let target = format!("/tmp/{}", common::unique("wasm-python-escape"));
    let code = format!("def escape():\n    with open('{target}', 'w') as f:\n        f.write('x')\n    return True\n");
    let out = run(json!({"code": code, "tests": ["assert escape()"]}));
    let escaped = std::path::Path::new(&target).exists();
    let _ = std::fs::remove_file(&target);
    assert!(!escaped, "the guest wrote {target}");
    assert_eq!(out.verdict.as_deref(), Some("fail"));
    assert!(out.text.contains("escape() ->"), "{}", out.text);

    let out = run(json!({
        "code": "open('/work/scratch.txt', 'w').write('ok')\nimport tempfile\nt = tempfile.mkstemp()\n",
        "tests": ["assert open('/work/scratch.txt').read() == 'ok'", "assert t[1].startswith('/work/')"],
    }));
    assert_eq!(out.verdict.as_deref(), Some("pass"), "{out:?}");
}

#[test]
fn no_sockets_processes_or_host_environment() {
    if runtime().is_none() {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let code = format!(
        "import os\ndef reach():\n    import socket\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n    return True\n"
    );
    let out = run(json!({
        "code": code,
        "tests": [
            "assert reach()",
            "assert sorted(os.environ) == ['HOME', 'LANG', 'TMPDIR'], sorted(os.environ)",
            "assert not hasattr(os, 'fork')",
        ],
    }));
    assert_eq!(out.value["tests"][0]["passed"], json!(false), "{out:?}");
    assert_eq!(out.value["tests"][1]["passed"], json!(true), "{out:?}");
    assert_eq!(out.value["tests"][2]["passed"], json!(true), "{out:?}");
}

#[test]
fn runs_are_reproducible() {
    if runtime().is_none() {
        return;
    }
    // Hash seed and `random` come from the guest's random bytes, which depend only on the job.
    let inputs = json!({"code": "import random\nR = (hash('switchyard'), random.random())\nprint(R)", "tests": ["assert R"]});
    let first = run(inputs.clone());
    let second = run(inputs);
    assert_eq!(first.value["output"], second.value["output"]);
    assert!(first.value["output"].as_str().is_some_and(|o| o.starts_with('(')), "{first:?}");
}

#[test]
fn a_module_that_never_reports_fails_with_a_reason() {
    // Independent of the installation: any WASI command as "interpreter" gives a verdict.
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = dir.path().join("python-3.12.0.wat");
    std::fs::write(&fake, "(module (memory (export \"memory\") 1) (func (export \"_start\")))").expect("write");
    let job = PythonTests::from_call(&call(json!({"code": "x = 1", "tests": ["assert x"]}))).expect("valid");
    let out = python_tests::run_in_wasm(&WasmSandbox::new(), &fake, &job).expect("an outcome");
    assert_eq!(out.verdict.as_deref(), Some("fail"));
    assert_eq!(out.text, "0/1 tests passed; interpreter stopped before finishing (exit status 0)");
}

#[test]
fn backend_names_parse() {
    assert_eq!(Backend::parse("auto"), Some(Backend::Auto));
    assert_eq!(Backend::parse("wasm"), Some(Backend::Wasm));
    assert_eq!(Backend::parse("process"), Some(Backend::Process));
    assert_eq!(Backend::parse("gpu"), None);
}
