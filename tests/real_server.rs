//! The live runtime against a real third-party OpenAI-compatible server: llama-cpp-python's
//! server (`python3 -m llama_cpp.server`, FastAPI over llama.cpp) on a tiny random-weight
//! Llama model that `tests/real_server/make_tiny_gguf.py` writes (answers are gibberish, which
//! is fine). Through `switchyard run --live` with the `openai` engine, and the fault-injecting
//! proxy where a fault needs one: a completed workflow (its answers carry no `usage` in
//! streams: counted with our tokenizer), a server that is down, a wrong API key (401), overload
//! (429 with `Retry-After`), a stalled answer, and a prompt over the server's context — each
//! with its message and exit status, and no request body carrying emulator output.
//!
//! `.ci/run` installs the server (pinned, `tests/real_server/requirements.txt`); under
//! `CI=true` a missing server fails this test, elsewhere it is skipped with a note.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::fault_proxy::{Fault, FaultProxy};
use support::live_cli::{self, report, repo, run, run_workflow, stderr};

/// The model id the server serves (`--model_alias`).
const SERVED: &str = "tiny";
const KEY: &str = "sekret-test-key";

struct Server {
    pid: i32,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the server's own pid.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
        }
    }
}

fn server_installed() -> bool {
    Command::new("python3")
        .args(["-c", "import llama_cpp.server.app, gguf"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn start(dir: &Path, port: u16) -> Server {
    let model = dir.join("tiny.gguf");
    let out = Command::new("bash")
        .arg(repo().join("tests/real_server/start_server.sh"))
        .arg(&model)
        .arg(port.to_string())
        .arg(dir.join("server.log"))
        .env("API_KEY", KEY)
        .output()
        .expect("start_server.sh");
    assert!(out.status.success(), "the server did not start: {}", String::from_utf8_lossy(&out.stderr));
    let pid = String::from_utf8_lossy(&out.stdout).trim().parse().expect("the server's pid");
    Server { pid }
}

#[test]
fn a_real_llama_cpp_server_completes_and_fails_clearly() {
    if !server_installed() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "llama-cpp-python is not installed; .ci/run installs it (tests/real_server/README.md)"
        );
        eprintln!("skipped: llama-cpp-python is not installed (see tests/real_server/README.md)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = start(dir.path(), port);
    let upstream = format!("http://127.0.0.1:{port}");
    let limit = Duration::from_secs(120);
    let pool = |base: &str, key: &str| live_cli::pool(dir.path(), base, SERVED, &format!(", api_key: {key}"));

    // A completed workflow, streamed (llama.cpp's streams carry no usage: we count).
    let proxy = FaultProxy::start(&upstream, Fault::None, false);
    let (o, _) = run(&pool(&format!("{}/v1", proxy.url()), KEY), &[], limit);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r = report(&o);
    assert_eq!(r["sessions_completed"], 2, "{r}");
    assert!(r["prompt_tokens"].as_u64() > Some(0) && r["generated_tokens"].as_u64() > Some(0), "{r}");
    assert_eq!(r["loads"], 0, "a fixed endpoint is never loaded");
    let bodies = proxy.bodies();
    assert_eq!(bodies.len(), 4, "two sessions of two calls");
    for b in &bodies {
        let v: serde_json::Value = serde_json::from_str(b).unwrap();
        assert!(v.get("switchyard").is_none(), "emulator output sent to a real server: {b}");
        assert_eq!(v["model"], SERVED);
    }
    // The same, not streamed (usage in the answer).
    let (o, _) = run(&pool(&format!("{upstream}/v1"), KEY), &["--no-stream"], limit);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // A wrong API key: the server's 401, at load, as an authentication failure.
    let (o, _) = run(&pool(&format!("{upstream}/v1"), "wrong-key"), &[], limit);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("first auth error") && err.contains("401"), "{err}");

    // Overload: two 429s with Retry-After, then served.
    let proxy = FaultProxy::start(&upstream, Fault::Status { status: 429, retry_after: Some(0.3), times: 2 }, false);
    let (o, _) = run(&pool(&format!("{}/v1", proxy.url()), KEY), &[], limit);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("first overload error"), "{err}");
    assert_eq!(proxy.injected(), 2);

    // A stalled answer (the server still answers its models list): timed out, not a loop.
    let proxy = FaultProxy::start(&upstream, Fault::Stall, false);
    let (o, took) = run(&pool(&format!("{}/v1", proxy.url()), KEY), &[], limit);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(report(&o)["failures"].to_string().contains("timed out"), "{err}");
    assert!(proxy.completion_calls() <= 4, "{} calls", proxy.completion_calls());
    assert!(took < Duration::from_secs(60), "took {took:?}");

    // A prompt over the server's context (n_ctx 512 of its byte-level tokens): the server's own
    // refusal, named.
    let long = dir.path().join("long.yaml");
    let text = std::fs::read_to_string(repo().join("tests/fixtures/tiny_chain.yaml"))
        .unwrap()
        .replace("prompt: Write the sentence.", &format!("prompt: \"Write the sentence. {}\"", "Context matters. ".repeat(60)));
    std::fs::write(&long, text).unwrap();
    for extra in [&[][..], &["--no-stream"][..]] {
        let (o, _) = run_workflow(&long, &pool(&format!("{upstream}/v1"), KEY), extra, limit);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(3), "{err}");
        let failures = report(&o)["failures"].to_string();
        assert!(failures.contains("context"), "{extra:?}: {failures}");
    }

    // The server is down.
    drop(server);
    std::thread::sleep(Duration::from_millis(300));
    let (o, took) = run(&pool(&format!("{upstream}/v1"), KEY), &[], limit);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.to_lowercase().contains("connection refused"), "{err}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}
