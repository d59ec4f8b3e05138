//! `switchyard emulate` as a real process: the CLI flags, the printed address, vLLM's API over
//! a loopback socket (health, completions with usage and cached tokens, metrics names, sleep
//! mode, the served model name, /ping, /tokenize, JSON 404s and validation errors) and a clean
//! exit on SIGTERM. Plain std HTTP/1.1, so that the
//! root package needs no async runtime; the engines that manage such processes are tested in
//! `runtime/tests/live_engines.rs`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_switchyard");

/// One HTTP/1.1 exchange with `Connection: close`; returns the status and the body.
fn http(addr: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let payload = body.map(Value::to_string).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
        payload.len()
    );
    stream.write_all(request.as_bytes()).expect("write");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read");
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(extra: &[&str]) -> Server {
    let mut child = Command::new(BIN)
        .args([
            "emulate",
            "--device",
            "A100-80GB",
            "--model",
            "Qwen3-0.6B",
            "--port",
            "0",
        ])
        .args(["--speed", "1000", "--max-model-len", "8192"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn switchyard emulate");
    let stderr = child.stderr.take().expect("stderr");
    let mut line = String::new();
    BufReader::new(stderr)
        .read_line(&mut line)
        .expect("read the listening line");
    let addr = line
        .split("http://")
        .nth(1)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| panic!("no address in `{line}`"));
    let server = Server { child, addr };
    let deadline = Instant::now() + Duration::from_secs(20);
    while http(&server.addr, "GET", "/health", None).0 != 200 {
        assert!(Instant::now() < deadline, "never healthy");
        std::thread::sleep(Duration::from_millis(10));
    }
    server
}

#[test]
fn emulate_serves_vllms_api_and_exits_on_sigterm() {
    let mut s = spawn(&["--served-model-name", "qwen-small"]);
    let (status, body) = http(&s.addr, "GET", "/v1/models", None);
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(models["data"][0]["id"], "qwen-small");

    let prompt = "Explain the switchyard of a railway in three sentences. ".repeat(12);
    let req = json!({"model": "qwen-small", "prompt": prompt, "max_tokens": 32,
                     "switchyard": {"output": "A switchyard sorts railway cars."}});
    let (status, body) = http(&s.addr, "POST", "/v1/completions", Some(&req));
    assert_eq!(status, 200, "{body}");
    let first: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        first["choices"][0]["text"],
        "A switchyard sorts railway cars."
    );
    let (_, body) = http(&s.addr, "POST", "/v1/completions", Some(&req));
    let second: Value = serde_json::from_str(&body).unwrap();
    assert!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    let (status, body) = http(&s.addr, "GET", "/metrics", None);
    assert_eq!(status, 200);
    for name in [
        "vllm:num_requests_running{",
        "vllm:num_requests_waiting{",
        "vllm:kv_cache_usage_perc{",
        "vllm:prefix_cache_queries_total{",
        "vllm:prefix_cache_hits_total{",
        "vllm:time_to_first_token_seconds_bucket{",
        "vllm:prompt_tokens_total{",
        "vllm:generation_tokens_total{",
        "vllm:request_success_total{",
        "vllm:inter_token_latency_seconds_bucket{",
        "vllm:e2e_request_latency_seconds_bucket{",
        "vllm:request_queue_time_seconds_bucket{",
        "vllm:cache_config_info{",
    ] {
        assert!(body.contains(name), "{name} missing from /metrics");
    }
    assert!(body.contains("model_name=\"qwen-small\""));

    // What vLLM clients also find: /ping, /tokenize under the served name, JSON 404s,
    // validation errors with vLLM's integer code.
    assert_eq!(http(&s.addr, "GET", "/ping", None).0, 200);
    let (status, body) = http(
        &s.addr,
        "POST",
        "/tokenize",
        Some(&json!({"model": "qwen-small", "prompt": "hello world"})),
    );
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["count"], 2);
    let (status, body) = http(&s.addr, "GET", "/no/such/path", None);
    assert_eq!((status, body.as_str()), (404, r#"{"detail":"Not Found"}"#));
    let (status, body) = http(
        &s.addr,
        "POST",
        "/v1/completions",
        Some(&json!({"prompt": "x", "n": 0})),
    );
    assert_eq!(status, 400);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((v["error"]["code"].as_u64(), v["error"]["param"].as_str()), (Some(400), Some("n")));

    assert_eq!(http(&s.addr, "POST", "/sleep?level=1", None).0, 200);
    assert_eq!(
        http(&s.addr, "GET", "/is_sleeping", None).1,
        r#"{"is_sleeping":true}"#
    );
    assert_eq!(http(&s.addr, "POST", "/v1/completions", Some(&req)).0, 503);
    assert_eq!(http(&s.addr, "POST", "/wake_up", None).0, 200);
    assert_eq!(
        http(&s.addr, "GET", "/is_sleeping", None).1,
        r#"{"is_sleeping":false}"#
    );

    let term = Command::new("kill")
        .args(["-TERM", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            assert!(status.success(), "emulate exited with {status}");
            break;
        }
        assert!(Instant::now() < deadline, "emulate ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn emulate_refuses_what_vllm_refuses() {
    // bf16 on a V100 (compute capability 7.0): vLLM refuses to start.
    let out = Command::new(BIN)
        .args([
            "emulate",
            "--device",
            "V100-32GB",
            "--model",
            "Qwen3-0.6B",
            "--dtype",
            "bf16",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("V100-32GB does not support bf16"), "{err}");
    let out = Command::new(BIN)
        .args([
            "emulate",
            "--device",
            "A100-80GB",
            "--model",
            "Qwen3-0.6B",
            "--speed",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--speed"));
    // A tool-call parser other than Qwen3's `hermes` is not emulated: refused at start.
    let out = Command::new(BIN)
        .args(["emulate", "--device", "A100-80GB", "--model", "Qwen3-0.6B", "--enable-auto-tool-choice", "--tool-call-parser", "mistral"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tool-call-parser"));
}

/// `vllm serve`'s tool-calling flags, as Qwen3 is served, are accepted (tool calling is always
/// on in the emulator): a command line copied from vLLM starts, and its tools work.
#[test]
fn emulate_takes_vllms_tool_calling_flags() {
    let s = spawn(&["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]);
    let req = json!({"model": "Qwen3-0.6B", "max_tokens": 64, "messages": [{"role": "user", "content": "time?"}],
        "tools": [{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]});
    let (status, body) = http(&s.addr, "POST", "/v1/chat/completions", Some(&req));
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(v.pointer("/choices/0/message/tool_calls/0/function/name").and_then(Value::as_str), Some("now"), "{v}");
}
