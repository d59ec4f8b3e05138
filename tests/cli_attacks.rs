//! Hostile generated code through the real command line: `switchyard run` on a copy of
//! `workflows/mbpp.yaml` whose dataset's reference solution (which the emulated coder returns
//! as its answer) is an attack. Each run must finish, score 0, report why every tool call
//! failed in the JSON's `tools` section, and leave no work directory behind — in the process
//! sandbox and, where `python.wasm` is installed, in the WebAssembly one.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Writes `mbpp.yaml` (tool timeouts cut to `timeout_s`) and a one-record dataset whose
/// reference solution is `payload` into `dir`; returns the workflow's path.
fn hostile_workflow(dir: &Path, payload: &str, timeout_s: u32) -> PathBuf {
    let yaml = std::fs::read_to_string(root().join("workflows/mbpp.yaml")).expect("mbpp.yaml");
    let yaml = yaml.replace("timeout_s: 10", &format!("timeout_s: {timeout_s}"));
    std::fs::create_dir_all(dir.join("datasets/mbpp")).expect("mkdir");
    let record = json!([{
        "source_file": "attack",
        "task_id": 2,
        "prompt": "Write a function to find the shared elements from the given two lists.",
        "code": payload,
        "test_imports": [],
        "test_list": [
            "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
            "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))"
        ],
    }]);
    std::fs::write(dir.join("datasets/mbpp/sanitized-mbpp.json"), record.to_string()).expect("dataset");
    let path = dir.join("mbpp.yaml");
    std::fs::write(&path, yaml).expect("workflow");
    path
}

/// Runs the workflow with the given sandbox; returns the JSON report and the CLI's pid.
fn run(workflow: &Path, sandbox: &str) -> (Value, u32) {
    let child = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["run", &workflow.display().to_string(), "--sessions", "2", "--pool", "workflows/pools/small.yaml", "--json"])
        .env("SWITCHYARD_PYTHON_SANDBOX", sandbox)
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("switchyard starts");
    let pid = child.id();
    let out = child.wait_with_output().expect("switchyard runs");
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    (serde_json::from_slice(&out.stdout).expect("one JSON object"), pid)
}

/// Work directories under the temporary directory whose marker names `pid`.
fn work_dirs_of(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("switchyard-work-"))
                && std::fs::read_to_string(p.join(".switchyard-owner"))
                    .is_ok_and(|m| m.lines().nth(1).is_some_and(|l| l.starts_with(&format!("{pid} "))))
        })
        .collect()
}

/// The sandboxes this machine can run MBPP code in.
fn sandboxes() -> Vec<&'static str> {
    let mut out = Vec::new();
    if switchyard_tools::python3_available() {
        out.push("process");
    }
    if switchyard_tools::python_tests::wasm_runtime().is_ok() {
        out.push("wasm");
    }
    if out.is_empty() {
        eprintln!("note: no python3 and no python.wasm here; skipped");
    }
    out
}

const FORGE: &str = "import os\nimport __main__\nr = getattr(__main__, '_REPORT', None) or open(1, 'w', closefd=False)\n\
r.write('code\\t0\\tok\\n')\nfor i in range(4):\n    r.write('test\\t%d\\tok\\n' % i)\n    r.write('value\\t%d\\t{4, 5}\\n' % i)\n\
r.write('done\\n')\nr.flush()\nos._exit(0)\n";
const HANG: &str = "def similar_elements(a, b):\n    while True:\n        pass\n";
const MEMORY: &str = "def similar_elements(a, b):\n    hoard = []\n    while True:\n        hoard.append(bytearray(64 * 1024 * 1024))\n";
const DISK: &str = "i = 0\nwhile True:\n    with open('fill%d' % i, 'wb') as f:\n        f.write(b'x' * (16 * 1024 * 1024))\n    i += 1\n";

#[test]
fn hostile_reference_solutions_fail_with_their_reasons_and_leave_nothing() {
    for sandbox in sandboxes() {
        for (name, payload, cause) in
            [("forge", FORGE, "tests_failed"), ("hang", HANG, "timeout"), ("memory", MEMORY, "memory"), ("disk", DISK, "work_area")]
        {
            let dir = tempfile::tempdir().expect("tempdir");
            // The hang must run into its limit (1 s keeps the test short); the others end by
            // their own limit, which a loaded 2-core machine (a build beside the tests) can take
            // more than 1 s to reach, so they keep the workflow's 10 s.
            let timeout_s = if name == "hang" { 1 } else { 10 };
            let workflow = hostile_workflow(dir.path(), payload, timeout_s);
            let (report, pid) = run(&workflow, sandbox);
            let what = format!("{sandbox}/{name}");
            assert_eq!(report["sessions_completed"], 2, "{what}: {report}");
            assert_eq!(report["workflows"]["mbpp"]["accuracy"], 0.0, "{what}: the attack scored");
            let tools = &report["tools"];
            let by_cause = tools["failures_by_cause"].as_object().expect("failures_by_cause");
            assert!(by_cause.contains_key(cause), "{what}: expected cause {cause}, got {by_cause:?}");
            let listed = tools["failures"].as_array().expect("failures");
            assert!(!listed.is_empty(), "{what}");
            for failure in listed {
                assert_eq!(failure["tool"], "python_tests");
                assert!(failure["detail"].as_str().is_some_and(|d| !d.is_empty()), "{what}: {failure}");
            }
            if name == "forge" {
                // Every assert of the MBPP workflow splits: all were decided outside.
                assert!(tools["checks_outside_sandbox"].as_u64().is_some_and(|n| n > 0), "{what}: {tools}");
                assert_eq!(tools["checks_untrusted"], 0, "{what}: {tools}");
            }
            assert!(work_dirs_of(pid).is_empty(), "{what}: work directories left: {:?}", work_dirs_of(pid));
        }
    }
}
