//! Running `switchyard run --live` as a user would, for the live runtime's end-to-end tests:
//! a live pool of fixed OpenAI-compatible endpoints, the CLI as a child process bounded in
//! time, and its JSON report and stderr.

#![allow(dead_code)] // each test file uses a different part of it

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_switchyard");

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// A live pool of two devices, each a fixed endpoint at `base` (the API root, `…/v1`), every
/// Qwen3 size mapped to `served` (the one model the server serves); short timeouts so faults
/// show in seconds. `extra` is appended inside the `engine:` mapping (`, api_key: k`).
pub fn pool(dir: &Path, base: &str, served: &str, extra: &str) -> PathBuf {
    let models = ["Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B"]
        .iter()
        .map(|m| format!("{m}: {served}"))
        .collect::<Vec<_>>()
        .join(", ");
    let text = format!(
        "name: faults\ndevices:\n  - kind: A100-80GB\n    count: 2\n    engine: {{ kind: openai, base_url: \"{base}\", \
         request_timeout_s: 3, stall_timeout_s: 1, models: {{ {models} }}{extra} }}\n"
    );
    let path = dir.join("pool.yaml");
    std::fs::write(&path, text).expect("pool file");
    path
}

/// `switchyard run --live` of 2 sessions of a two-call chain (`tests/fixtures/tiny_chain.yaml`)
/// on `pool`; killed if it outlives `limit`.
pub fn run(pool: &Path, extra: &[&str], limit: Duration) -> (Output, Duration) {
    run_workflow(&repo().join("tests/fixtures/tiny_chain.yaml"), pool, extra, limit)
}

/// [`run`] of another workflow file.
pub fn run_workflow(workflow: &Path, pool: &Path, extra: &[&str], limit: Duration) -> (Output, Duration) {
    let started = Instant::now();
    let mut child = Command::new(BIN)
        .arg("run")
        .arg(workflow)
        .args(["--live", "--sessions", "2", "--deadline", "60", "--json", "--pool"])
        .arg(pool)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn switchyard run --live");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stderr.read_to_end(&mut s);
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the run did not end within {limit:?}: {}", String::from_utf8_lossy(&err_reader.join().unwrap_or_default()));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = Output {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    };
    (output, started.elapsed())
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn report(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("no JSON report ({e}): {}", stderr(o)))
}

