//! The live runtime's failure semantics, end to end through the CLI: `switchyard run --live`
//! against a fixed OpenAI-compatible endpoint (`engine: {kind: openai}`) — a `switchyard
//! emulate` process behind a fault-injecting proxy (`support/fault_proxy.rs`) — for each fault
//! a user meets on first contact with a real server: a server that is down, a wrong API key,
//! overload with `Retry-After`, a stalled answer, dropped connections while `/v1/models` still
//! answers, a prompt over the served context. Each must give its own clear message within
//! seconds, never a hot loop, and a non-zero exit when sessions fail. Also: a server that is
//! not `switchyard emulate` never receives the emulated output, and `--trace` records a live
//! run's events. Loopback only; every run is bounded by `--deadline` and the test's timeout.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::fault_proxy::{Fault, FaultProxy};
use support::live_cli::{self, report, run, stderr};

const BIN: &str = env!("CARGO_BIN_EXE_switchyard");
const MODEL: &str = "Qwen3-0.6B";

/// A `switchyard emulate` child serving `MODEL` at 1000× (calls take milliseconds).
struct Upstream {
    child: Child,
    url: String,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn upstream(max_model_len: u32) -> Upstream {
    let mut child = Command::new(BIN)
        .args(["emulate", "--device", "A100-80GB", "--model", MODEL, "--port", "0", "--speed", "1000"])
        .args(["--max-model-len", &max_model_len.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn switchyard emulate");
    let stderr = child.stderr.take().expect("stderr");
    let mut line = String::new();
    BufReader::new(stderr).read_line(&mut line).expect("the listening line");
    let addr = line
        .split("http://")
        .nth(1)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| panic!("no address in `{line}`"));
    Upstream { child, url: format!("http://{addr}") }
}

/// A live pool of two fixed endpoints at `base`, every Qwen3 size mapped to `MODEL`.
fn pool(dir: &Path, base: &str, extra: &str) -> PathBuf {
    live_cli::pool(dir, base, MODEL, extra)
}

#[test]
fn a_down_server_fails_fast_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let pool = pool(dir.path(), &format!("http://127.0.0.1:{port}/v1"), "");
    let (o, took) = run(&pool, &[], Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("first unreachable error from"), "the first error is printed: {err}");
    assert!(err.to_lowercase().contains("connection refused"), "the server's error is named: {err}");
    let r = report(&o);
    assert_eq!(r["sessions_failed"], 2);
    let failures = r["failures"].to_string();
    assert!(failures.contains("could not be placed") && failures.to_lowercase().contains("connection refused"), "{failures}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn a_wrong_api_key_is_an_authentication_failure() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstream(8192);
    let proxy = FaultProxy::start(&up.url, Fault::Everything { status: 401 }, false);
    let pool = pool(dir.path(), &format!("{}/v1", proxy.url()), ", api_key: wrong");
    let (o, took) = run(&pool, &[], Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("first auth error") && err.contains("401"), "{err}");
    assert!(report(&o)["failures"].to_string().contains("authentication failed"), "{err}");
    assert_eq!(proxy.completion_calls(), 0, "an endpoint refusing the key gets no calls");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn overload_is_waited_out_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstream(8192);
    let proxy = FaultProxy::start(&up.url, Fault::Status { status: 429, retry_after: Some(0.2), times: 3 }, false);
    let pool = pool(dir.path(), &format!("{}/v1", proxy.url()), "");
    let trace = dir.path().join("trace.jsonl");
    let (o, _) = run(&pool, &["--trace", trace.to_str().unwrap()], Duration::from_secs(90));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(proxy.injected(), 3);
    assert!(err.contains("first overload error") && err.contains("429"), "{err}");
    // The retries are counted once at the end (they were only a note before).
    assert!(err.contains("faults: 3 retries of LLM calls"), "{err}");
    let r = report(&o);
    assert_eq!(r["sessions_completed"], 2);
    assert_eq!(r["loads"], 0, "a fixed endpoint is never loaded");
    assert!(r["fixed_endpoint_gpus"].as_u64() >= Some(1), "{r}");
    // --trace with --live: the simulator's schema, every session's events.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for event in ["arrival", "ready", "dispatch", "first_token", "finish", "session_done"] {
        assert!(lines.iter().any(|l| l["event"] == event), "no `{event}` in the live trace");
    }
}

#[test]
fn a_stalled_answer_times_out_without_a_restart_loop() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstream(8192);
    let proxy = FaultProxy::start(&up.url, Fault::Stall, false);
    let pool = pool(dir.path(), &format!("{}/v1", proxy.url()), "");
    let (o, took) = run(&pool, &[], Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("first timeout error"), "{err}");
    assert!(report(&o)["failures"].to_string().contains("timed out"), "{err}");
    // Each call is sent at most twice (one retry after its deadline), never restarted in a loop.
    let calls = proxy.completion_calls();
    assert!(calls <= 2 * 2, "{calls} calls reached the stalled server");
    assert!(took < Duration::from_secs(40), "took {took:?}");
}

#[test]
fn dropped_connections_while_the_server_answers_do_not_loop() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstream(8192);
    let proxy = FaultProxy::start(&up.url, Fault::Drop, false);
    let pool = pool(dir.path(), &format!("{}/v1", proxy.url()), "");
    let (o, took) = run(&pool, &[], Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(report(&o)["failures"].to_string().contains("connection dropped"), "{err}");
    let calls = proxy.completion_calls();
    assert!(calls <= 4 * 2, "{calls} calls: a hot loop");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn a_prompt_over_the_served_context_is_refused_before_it_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstream(24);
    let proxy = FaultProxy::start(&up.url, Fault::None, false);
    let pool = pool(dir.path(), &format!("{}/v1", proxy.url()), "");
    let (o, _) = run(&pool, &[], Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(report(&o)["failures"].to_string().contains("does not fit the served context of 24 tokens"), "{err}");
    assert_eq!(proxy.completion_calls(), 0, "nothing is sent that cannot fit");
}

#[test]
fn only_switchyard_emulate_receives_the_emulated_output() {
    let dir = tempfile::tempdir().unwrap();
    let up = upstream(8192);
    // A server that does not say it is `switchyard emulate` (no /version): never the output.
    let hidden = FaultProxy::start(&up.url, Fault::None, true);
    let (o, _) = run(&pool(dir.path(), &format!("{}/v1", hidden.url()), ""), &[], Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(0), "{} {}", stderr(&o), report(&o)["failures"]);
    let bodies = hidden.bodies();
    assert!(!bodies.is_empty());
    let has_output = |b: &String| {
        serde_json::from_str::<serde_json::Value>(b).map(|v| v.get("switchyard").is_some()).unwrap_or(true)
    };
    assert!(!bodies.iter().any(has_output), "emulator output sent to a real server: {bodies:?}");
    // The emulator itself, recognised by its /version: it gets the output (so the check above
    // can fail).
    let shown = FaultProxy::start(&up.url, Fault::None, false);
    let (o, _) = run(&pool(dir.path(), &format!("{}/v1", shown.url()), ""), &[], Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(shown.bodies().iter().all(has_output));
}
