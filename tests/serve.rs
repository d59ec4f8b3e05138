//! `switchyard serve` end to end, as a client sees it: the binary on a live pool of
//! `switchyard emulate` children, its REST API over real HTTP — authentication, limits and
//! validation errors, registering workflows, runs with their outputs, the SSE event stream,
//! cancel — the front door (streaming, a disconnect that aborts upstream) and a SIGTERM that
//! stops it cleanly.

mod support;

use std::process::Command;
use std::time::Duration;

use support::serve::{BIN, Server, TOKEN, repo};

use futures::StreamExt;
use serde_json::{Value, json};


async fn body(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let v = resp.json::<Value>().await.unwrap_or(Value::Null);
    (status, v)
}

fn error_code(v: &Value) -> Option<i64> {
    v.pointer("/error/code").and_then(Value::as_i64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_end_to_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_slow(dir.path());
    let http = reqwest::Client::new();
    let auth = format!("Bearer {TOKEN}");

    // Open routes; everything under /v1 needs the token.
    let (s, v) = body(http.get(server.url("/health")).send().await.expect("health")).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("ok")));
    let (s, v) = body(http.get(server.url("/openapi.json")).send().await.expect("openapi")).await;
    assert_eq!(s, 200);
    assert!(v.pointer("/paths/~1v1~1runs").is_some(), "{v}");
    let resp = http.get(server.url("/v1/workflows")).send().await.expect("no token");
    assert_eq!(resp.headers().get("www-authenticate").map(|h| h.as_bytes()), Some(&b"Bearer"[..]));
    let (s, v) = body(resp).await;
    assert_eq!((s, error_code(&v)), (401, Some(401)), "{v}");
    let (s, _) = body(http.get(server.url("/v1/workflows")).header("authorization", "Bearer wrong").send().await.expect("bad token")).await;
    assert_eq!(s, 401);

    // The start-up workflows are registered.
    let (s, v) = body(http.get(server.url("/v1/workflows")).header("authorization", &auth).send().await.expect("list")).await;
    assert_eq!(s, 200);
    let names: Vec<&str> = v["workflows"].as_array().expect("list").iter().filter_map(|w| w["name"].as_str()).collect();
    assert_eq!(names, ["long-chain", "tiny-chain"]);

    // Invalid workflows: 422 with every problem's line, column and field.
    let bad = "name: bad\nnodes:\n  - id: a\n    deployment: nope\n    prompt: hi\n";
    let (s, v) = body(http.post(server.url("/v1/workflows")).header("authorization", &auth).body(bad).send().await.expect("bad")).await;
    assert_eq!((s, error_code(&v)), (422, Some(422)), "{v}");
    let errors = v.pointer("/error/errors").and_then(Value::as_array).expect("errors");
    let unknown = errors.iter().find(|e| e["field"] == "nodes.a.deployment").expect("the unknown deployment is named");
    assert_eq!((unknown["line"].as_u64(), unknown["column"].as_u64()), (Some(4), Some(17)), "{unknown}");
    // A deployment the server does not serve, and a dataset (a path on the server's disk).
    let tiny = std::fs::read_to_string(repo().join("tests/fixtures/tiny_chain.yaml")).expect("fixture");
    let other_model = tiny.replace("name: tiny-chain", "name: other").replace("Qwen3-0.6B", "Qwen3-14B");
    let (s, v) = body(http.post(server.url("/v1/workflows")).header("authorization", &auth).body(other_model).send().await.expect("unserved")).await;
    assert_eq!(s, 422, "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("not served"), "{v}");
    let with_dataset = tiny.replace("name: tiny-chain", "name: reads-files")
        + "\ndataset: {file: /etc/passwd, format: jsonl, fields: {x: x}}\n";
    let (s, v) = body(http.post(server.url("/v1/workflows")).header("authorization", &auth).body(with_dataset).send().await.expect("dataset")).await;
    assert_eq!(s, 422, "{v}");
    // A path that does not exist gets the very same answer: the reply says nothing about
    // which files the server has.
    let missing = tiny.replace("name: tiny-chain", "name: reads-files")
        + "
dataset: {file: /etc/no-such-file, format: jsonl, fields: {x: x}}
";
    let (s2, v2) = body(http.post(server.url("/v1/workflows")).header("authorization", &auth).body(missing).send().await.expect("dataset")).await;
    assert_eq!((s2, &v2), (s, &v));
    // A `shell` step that declares host paths to read (the server's files): refused; without
    // `reads` the same step registers.
    let peek = tiny.replace("name: tiny-chain", "name: peek").trim_end().to_string()
        + "\n\n  - id: look\n    tool: shell\n    after: edit\n    inputs: {command: \"cat /etc/passwd\", reads: [/etc/passwd]}\n";
    let (s, v) = body(http.post(server.url("/v1/workflows")).header("authorization", &auth).body(peek.clone()).send().await.expect("peek")).await;
    assert_eq!((s, v["error"]["param"].as_str()), (422, Some("nodes.look.inputs.reads")), "{v}");
    // A path that does not exist gets the very same answer (the refusal comes before the loader
    // looks the paths up on disk).
    let ghost = peek.replace("reads: [/etc/passwd]", "reads: [/etc/no-such-file]");
    let (s3, v3) = body(http.post(server.url("/v1/workflows")).header("authorization", &auth).body(ghost).send().await.expect("ghost")).await;
    assert_eq!((s3, &v3), (s, &v));
    let blind = peek.replace(", reads: [/etc/passwd]", "").replace("name: peek", "name: blind");
    let (s, v) = body(http.post(server.url("/v1/workflows")).header("authorization", &auth).body(blind).send().await.expect("blind")).await;
    assert_eq!(s, 201, "{v}");
    // Without a router, the router's model is not served and no program awaits a verdict.
    let routed_call = json!({"model": "switchyard-router", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    let (s, v) = body(http.post(server.url("/v1/chat/completions")).header("authorization", &auth).header("X-Session-ID", "r").json(&routed_call).send().await.expect("routed")).await;
    assert_eq!((s, v.pointer("/error/type").and_then(Value::as_str)), (404, Some("model_not_found")), "{v}");
    let (s, v) = body(http.post(server.url("/v1/programs/r/verdict")).header("authorization", &auth).json(&json!({"success": true})).send().await.expect("verdict")).await;
    assert_eq!(s, 404, "{v}");
    // A routed workflow on a server started without one: there is no router to route it.
    let routed = tiny.replace("name: tiny-chain", "name: routed").replacen("deployment: small", "deployment: {route: [small]}", 1);
    assert!(routed.contains("route: [small]"), "the fixture's deployment key changed");
    let (s, v) = body(http.post(server.url("/v1/workflows")).header("authorization", &auth).body(routed).send().await.expect("routed")).await;
    assert_eq!(s, 422, "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("this runtime has no router"), "{v}");
    // Register: 201, the same text again 200, another text under that name 409.
    let second = tiny.replace("name: tiny-chain", "name: second");
    let (s, v) = body(http.post(server.url("/v1/workflows")).header("authorization", &auth).body(second.clone()).send().await.expect("register")).await;
    assert_eq!((s, v["name"].as_str()), (201, Some("second")), "{v}");
    let (s, _) = body(http.post(server.url("/v1/workflows")).header("authorization", &auth).body(second.clone()).send().await.expect("again")).await;
    assert_eq!(s, 200);
    let changed = second.replace("Write the sentence.", "Write two sentences.");
    let (s, _) = body(http.post(server.url("/v1/workflows")).header("authorization", &auth).body(changed).send().await.expect("conflict")).await;
    assert_eq!(s, 409);
    // Limits and malformed bodies.
    // (its own client: the server closes a connection whose body it refused unread). One byte
    // over the 4 MiB limit, so that the client has written it all when the refusal comes; a
    // server may still close before the client's last write lands (a broken pipe or a reset
    // while writing the body: seen under load with a 5 MiB body), which refuses it as well.
    let once = reqwest::Client::new();
    match once.post(server.url("/v1/workflows")).header("authorization", &auth).body(vec![b'a'; (4 << 20) + 1]).send().await {
        Ok(resp) => {
            let (s, v) = body(resp).await;
            assert_eq!((s, error_code(&v)), (413, Some(413)), "{v}");
        }
        Err(e) => assert!(closed_while_writing(&e), "big: {e:?}"),
    }
    let (s, v) = body(http.post(server.url("/v1/runs")).header("authorization", &auth).json(&json!({"workflow": "second", "input": [{}]})).send().await.expect("typo")).await;
    assert_eq!((s, error_code(&v)), (400, Some(400)), "{v}");
    let (s, _) = body(http.post(server.url("/v1/runs")).header("authorization", &auth).json(&json!({"workflow": "nope"})).send().await.expect("unknown")).await;
    assert_eq!(s, 404);
    let (s, _) = body(http.delete(server.url("/v1/runs")).header("authorization", &auth).send().await.expect("405")).await;
    assert_eq!(s, 405);

    // A run: three sessions, followed on the event stream to its end.
    let (s, v) = body(http.post(server.url("/v1/runs")).header("authorization", &auth).json(&json!({"workflow": "second", "sessions": 3})).send().await.expect("run")).await;
    assert_eq!(s, 201, "{v}");
    let run = v["id"].as_str().expect("run id").to_string();
    let events = http.get(server.url(&format!("/v1/runs/{run}/events"))).header("authorization", &auth).send().await.expect("events");
    assert_eq!(events.status().as_u16(), 200);
    let mut stream = events.bytes_stream();
    let mut text = String::new();
    let followed = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(chunk) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
            if text.contains("event: run_end") && text.ends_with("\n\n") {
                break;
            }
        }
    })
    .await;
    assert!(followed.is_ok(), "the event stream ended: {text}");
    let count = |name: &str| text.matches(&format!("event: {name}\n")).count();
    assert_eq!(count("session_done"), 3, "{text}");
    assert_eq!(count("finish"), 6, "two calls per session: {text}");
    assert!(count("dispatch") >= 6, "{text}");
    let (s, v) = body(http.get(server.url(&format!("/v1/runs/{run}"))).header("authorization", &auth).send().await.expect("status")).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("completed")), "{v}");
    for session in v["sessions"].as_array().expect("sessions") {
        let out = session.pointer("/output/text").and_then(Value::as_str).unwrap_or("");
        assert!(out.contains("emulated output of node `edit`"), "the final node's answer: {session}");
    }

    // Cancel a run of long answers before it could finish: its sessions fail as cancelled.
    let (s, v) = body(http.post(server.url("/v1/runs")).header("authorization", &auth).json(&json!({"workflow": "long-chain", "sessions": 2})).send().await.expect("long")).await;
    assert_eq!(s, 201, "{v}");
    let long = v["id"].as_str().expect("run id").to_string();
    let (s, _) = body(http.post(server.url(&format!("/v1/runs/{long}/cancel"))).header("authorization", &auth).send().await.expect("cancel")).await;
    assert_eq!(s, 202);
    let mut state = String::new();
    for _ in 0..100 {
        let (_, v) = body(http.get(server.url(&format!("/v1/runs/{long}"))).header("authorization", &auth).send().await.expect("status")).await;
        state = v["state"].as_str().unwrap_or("").to_string();
        if state != "running" {
            let reasons: Vec<&str> = v["sessions"].as_array().expect("sessions").iter().filter_map(|s| s["reason"].as_str()).collect();
            assert_eq!(reasons.len(), 2, "{v}");
            assert!(reasons.iter().all(|r| r.contains("cancelled")), "{v}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, "cancelled");

    // The front door: a streamed chat call arrives token by token, with OpenAI's shapes.
    let (s, v) = body(http.get(server.url("/v1/models")).header("authorization", &auth).send().await.expect("models")).await;
    assert_eq!(s, 200);
    let models: Vec<&str> = v["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(models, ["Qwen3-0.6B", "Qwen3-8B"]);
    let call = json!({"model": "Qwen/Qwen3-0.6B", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 24,
                      "stream": true, "stream_options": {"include_usage": true}});
    let resp = http.post(server.url("/v1/chat/completions")).header("authorization", &auth).header("X-Session-ID", "agent-1").json(&call).send().await.expect("chat");
    assert_eq!(resp.status().as_u16(), 200);
    let text = resp.text().await.expect("stream");
    let chunks: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("chunk JSON"))
        .collect();
    let pieces: Vec<&str> = chunks.iter().filter_map(|c| c.pointer("/choices/0/delta/content").and_then(Value::as_str)).collect();
    assert!(pieces.len() >= 12, "one chunk per token, not the whole answer at once: {text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let usage = chunks.last().and_then(|c| c.get("usage")).expect("the usage chunk");
    assert_eq!(usage["completion_tokens"].as_u64(), Some(24), "{usage}");
    assert!(usage.pointer("/prompt_tokens_details/cached_tokens").is_some(), "{usage}");
    // The same program's second call, not streamed, named as a step of the agent.
    let call = json!({"model": "Qwen3-0.6B", "messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"},
                      {"role": "user", "content": "again"}], "max_tokens": 8, "program_done": true});
    let (s, v) = body(http.post(server.url("/v1/chat/completions")).header("authorization", &auth).header("X-Session-ID", "agent-1").header("X-Step-ID", "reviewer").json(&call).send().await.expect("chat")).await;
    assert_eq!((s, v["object"].as_str(), v.pointer("/usage/completion_tokens").and_then(Value::as_u64)), (200, Some("chat.completion"), Some(8)), "{v}");
    assert!(v.pointer("/choices/0/message/content").and_then(Value::as_str).is_some_and(|t| !t.is_empty()), "{v}");
    let (s, v) = body(http.post(server.url("/v1/chat/completions")).header("authorization", &auth).json(&json!({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]})).send().await.expect("chat")).await;
    assert_eq!((s, v["error"]["param"].as_str()), (404, Some("model")), "{v}");
    // A prompt longer than the served context (2,048 tokens): 400, as vLLM answers, before it
    // is scheduled — not a 502 naming the engine's address.
    let long = "hello ".repeat(5000);
    let (s, v) = body(http.post(server.url("/v1/completions")).header("authorization", &auth).json(&json!({"model": "Qwen3-0.6B", "prompt": long})).send().await.expect("long")).await;
    assert_eq!((s, v["error"]["type"].as_str(), v["error"]["param"].as_str()), (400, Some("context_length_exceeded"), Some("prompt")), "{v}");
    assert!(!v.to_string().contains("http://"), "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("the prompt has ") && !m.contains("at least")), "counted: {v}");
    // One so long that its bytes alone say so is refused without tokenizing it.
    let huge = "x".repeat(300_000);
    let (s, v) = body(http.post(server.url("/v1/completions")).header("authorization", &auth).json(&json!({"model": "Qwen3-0.6B", "prompt": huge})).send().await.expect("huge")).await;
    assert_eq!((s, v["error"]["type"].as_str()), (400, Some("context_length_exceeded")), "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("the prompt has at least 2343")), "{v}");

    // The runtime's own metrics, without a token.
    let metrics = http.get(server.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    for needle in [
        "switchyard_sessions{state=\"completed\"}",
        "switchyard_queue_depth",
        "switchyard_replicas{state=\"awake\"}",
        "switchyard_planning_latency_seconds_count",
        "switchyard_lifecycle_actions_total{action=\"load\"}",
        "switchyard_front_door_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2",
        // An unknown model's call and the router's model without a router.
        "switchyard_front_door_requests_total{endpoint=\"/v1/chat/completions\",status=\"404\"} 2",
    ] {
        assert!(metrics.contains(needle), "`{needle}` missing from /metrics:\n{metrics}");
    }

    // SIGTERM: the server stops cleanly.
    let pid = server.child.id() as libc::pid_t;
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let mut server = server;
    let mut status = None;
    for _ in 0..300 {
        if let Ok(Some(s)) = server.child.try_wait() {
            status = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(status.is_some_and(|s| s.success()), "exit after SIGTERM: {status:?}");
}

#[test]
fn serve_refuses_to_start_without_a_token_or_on_a_public_address_without_auth() {
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--pool", "workflows/pools/live-emulated.yaml", "--workflow", "tests/fixtures/tiny_chain.yaml"])
        .current_dir(repo())
        .env_remove("SWITCHYARD_API_TOKEN")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no API token"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(BIN)
        .args(["serve", "--no-auth", "--listen", "0.0.0.0:0", "--pool", "workflows/pools/live-emulated.yaml", "--workflow", "tests/fixtures/tiny_chain.yaml"])
        .current_dir(repo())
        .env_remove("SWITCHYARD_API_TOKEN")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// An upstream OpenAI-compatible server that streams a long answer slowly and records whether
/// its client went away before the end.
mod slow_upstream {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use axum::response::sse::{Event, Sse};
    use axum::routing::{get, post};
    use axum::{Json, Router};
    use serde_json::json;

    #[derive(Default)]
    pub struct Seen {
        pub started: AtomicUsize,
        pub dropped_early: AtomicBool,
    }

    struct Guard {
        seen: Arc<Seen>,
        finished: bool,
    }

    impl Guard {
        /// The stream reached its end: dropping the guard now is not an early drop.
        fn finish(mut self) {
            self.finished = true;
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            if !self.finished {
                self.seen.dropped_early.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Serve on a loopback port; answers the `/v1` root URL.
    pub async fn start() -> (String, Arc<Seen>) {
        let seen = Arc::new(Seen::default());
        let s2 = Arc::clone(&seen);
        let app = Router::new()
            .route("/health", get(|| async { "ok" }))
            .route("/v1/models", get(|| async { Json(json!({"object": "list", "data": [{"id": "up", "object": "model"}]})) }))
            .route(
                "/v1/chat/completions",
                post(move || {
                    let seen = Arc::clone(&s2);
                    async move {
                        seen.started.fetch_add(1, Ordering::SeqCst);
                        let guard = Guard { seen, finished: false };
                        let stream = futures::stream::unfold((0u32, guard), |(i, guard)| async move {
                            if i == 200 {
                                guard.finish();
                                return None;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            let data = if i == 199 {
                                "[DONE]".to_string()
                            } else {
                                json!({"choices": [{"index": 0, "delta": {"content": " tok"}}]}).to_string()
                            };
                            Some((Ok::<_, std::convert::Infallible>(Event::default().data(data)), (i + 1, guard)))
                        });
                        Sse::new(stream)
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (format!("http://{addr}/v1"), seen)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_door_client_that_disconnects_aborts_its_call_upstream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, seen) = slow_upstream::start().await;
    let models = ["Qwen3-0.6B", "Qwen3-8B"].iter().map(|m| format!("{m}: up")).collect::<Vec<_>>().join(", ");
    let pool = dir.path().join("pool.yaml");
    std::fs::write(
        &pool,
        format!("name: upstream\ndevices:\n  - kind: A100-80GB\n    count: 1\n    engine: {{ kind: openai, base_url: \"{base}\", request_timeout_s: 30, models: {{ {models} }} }}\n"),
    )
    .expect("pool");
    let server = Server::start(&pool, &[&repo().join("tests/fixtures/tiny_chain.yaml")]);
    let http = reqwest::Client::new();
    let call = json!({"model": "Qwen3-0.6B", "messages": [{"role": "user", "content": "Write a lot"}], "max_tokens": 500, "stream": true});
    let resp = http
        .post(server.url("/v1/chat/completions"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .json(&call)
        .send()
        .await
        .expect("chat");
    assert_eq!(resp.status().as_u16(), 200);
    let mut stream = resp.bytes_stream();
    let mut got = String::new();
    while got.matches("tok").count() < 3 {
        let chunk = tokio::time::timeout(Duration::from_secs(30), stream.next()).await.expect("a chunk in time");
        got.push_str(&String::from_utf8_lossy(&chunk.expect("stream open").expect("chunk")));
    }
    assert_eq!(seen.started.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(!seen.dropped_early.load(std::sync::atomic::Ordering::SeqCst));
    // The client goes away mid-answer: the upstream sees its connection dropped well before
    // the answer's end (200 chunks × 20 ms = 4 s).
    drop(stream);
    let t0 = std::time::Instant::now();
    while !seen.dropped_early.load(std::sync::atomic::Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen.dropped_early.load(std::sync::atomic::Ordering::SeqCst), "the call went on upstream after the client left");
    assert_eq!(seen.started.load(std::sync::atomic::Ordering::SeqCst), 1, "an abandoned call is not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_aborts_its_calls_upstream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, seen) = slow_upstream::start().await;
    let pool = dir.path().join("pool.yaml");
    std::fs::write(
        &pool,
        format!("name: upstream\ndevices:\n  - kind: A100-80GB\n    count: 1\n    engine: {{ kind: openai, base_url: \"{base}\", request_timeout_s: 30, models: {{ Qwen3-0.6B: up }} }}\n"),
    )
    .expect("pool");
    let server = Server::start(&pool, &[&repo().join("tests/fixtures/tiny_chain.yaml")]);
    let http = reqwest::Client::new();
    let auth = format!("Bearer {TOKEN}");
    let resp = http.post(server.url("/v1/runs")).header("authorization", &auth).json(&json!({"workflow": "tiny-chain", "sessions": 1})).send().await.expect("run");
    assert_eq!(resp.status().as_u16(), 201);
    let v: Value = resp.json().await.expect("json");
    let id = v["id"].as_str().expect("id").to_string();
    // The session's first call is streaming upstream (200 chunks × 20 ms = 4 s).
    let t0 = std::time::Instant::now();
    while seen.started.load(std::sync::atomic::Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen.started.load(std::sync::atomic::Ordering::SeqCst), 1, "the session's call reached the upstream");
    let resp = http.post(server.url(&format!("/v1/runs/{id}/cancel"))).header("authorization", &auth).send().await.expect("cancel");
    assert_eq!(resp.status().as_u16(), 202);
    // The cancel reaches the call: its connection is dropped well before the answer's end.
    let t1 = std::time::Instant::now();
    while !seen.dropped_early.load(std::sync::atomic::Ordering::SeqCst) && t1.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen.dropped_early.load(std::sync::atomic::Ordering::SeqCst), "the cancelled session's call went on upstream");
    let run: Value = http.get(server.url(&format!("/v1/runs/{id}"))).header("authorization", &auth).send().await.expect("status").json().await.expect("json");
    assert_eq!(run["state"], "cancelled", "{run}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(seen.started.load(std::sync::atomic::Ordering::SeqCst), 1, "an aborted call is not retried, and the session sends nothing more");
}

/// The count of one lifecycle action in the server's `/metrics`.
async fn lifecycle_count(http: &reqwest::Client, server: &Server, action: &str) -> u64 {
    let text = http.get(server.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    let needle = format!("switchyard_lifecycle_actions_total{{action=\"{action}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&needle)).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_model_hint_lets_the_planner_prefetch_that_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let big = dir.path().join("big.yaml");
    std::fs::write(&big, "name: big\ndeployments:\n  b: {model: Qwen3-8B, dtype: fp16, max_context: 4096, max_output_tokens: 100}\nnodes:\n  - id: x\n    deployment: b\n    prompt: hi\n").expect("write");
    let server = Server::start(&repo().join("workflows/pools/live-emulated.yaml"), &[&repo().join("tests/fixtures/tiny_chain.yaml"), &big]);
    let http = reqwest::Client::new();
    let auth = format!("Bearer {TOKEN}");
    let call = json!({"model": "Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8});
    // Without a hint: the call's own model is loaded, nothing else.
    let resp = http.post(server.url("/v1/chat/completions")).header("authorization", &auth).header("X-Session-ID", "plain").json(&call).send().await.expect("call");
    assert_eq!(resp.status().as_u16(), 200);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(lifecycle_count(&http, &server, "load").await, 1);
    // With `X-Next-Model`, the next call is near-ready while the client works: its model loads.
    let resp = http
        .post(server.url("/v1/chat/completions"))
        .header("authorization", &auth)
        .header("X-Session-ID", "hinted")
        .header("X-Next-Model", "Qwen3-8B")
        .json(&call)
        .send()
        .await
        .expect("call");
    assert_eq!(resp.status().as_u16(), 200);
    let mut loads = 0;
    for _ in 0..50 {
        loads = lifecycle_count(&http, &server, "load").await;
        if loads >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(loads, 2, "the hinted model was prefetched");
}

/// Function calling through the front door on the emulated pool, as an agent framework runs a
/// tool loop: the model calls the tool (whole and streamed answers), the tool's result goes
/// back in the conversation with the call, and the model answers in text — with the earlier
/// prompt's blocks cached; a stop string ends an answer early; a JSON-schema response format
/// gets an instance of its schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_loop_runs_through_the_front_door() {
    let server = Server::start(&repo().join("workflows/pools/live-emulated.yaml"), &[&repo().join("tests/fixtures/tiny_chain.yaml")]);
    let http = reqwest::Client::new();
    let auth = format!("Bearer {TOKEN}");
    let tools = json!([{"type": "function", "function": {"name": "local_time", "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let question = json!({"role": "user", "content": "What time is it in Paris?"});
    let ask = json!({"model": "Qwen3-0.6B", "max_tokens": 64, "messages": [question], "tools": tools});
    let post = |body: Value| http.post(server.url("/v1/chat/completions")).header("authorization", &auth).header("X-Session-ID", "tools").json(&body).send();
    let (s, v) = body(post(ask.clone()).await.expect("call")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v.pointer("/choices/0/finish_reason").and_then(Value::as_str), Some("tool_calls"), "{v}");
    let call = v.pointer("/choices/0/message/tool_calls/0").cloned().unwrap_or(Value::Null);
    assert_eq!(call["function"]["name"], "local_time", "{v}");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or("")).unwrap_or(Value::Null);
    assert_eq!(args, json!({"city": "What time is it in Paris?"}), "{v}");
    assert!(v.pointer("/choices/0/message/content").is_some_and(Value::is_null), "{v}");
    // Without the tools the same question counts fewer prompt tokens: the tools block is counted.
    let (_, plain) = body(post(json!({"model": "Qwen3-0.6B", "max_tokens": 4, "messages": [question]})).await.expect("call")).await;
    let tokens = |v: &Value| v.pointer("/usage/prompt_tokens").and_then(Value::as_u64).unwrap_or(0);
    assert!(tokens(&v) > tokens(&plain) + 50, "{v} {plain}");

    // Streamed: one chunk with the whole call, then the finish.
    let resp = post(json!({"model": "Qwen3-0.6B", "max_tokens": 64, "messages": [question], "tools": tools, "stream": true})).await.expect("stream");
    let text = resp.text().await.expect("stream body");
    let chunks: Vec<Value> = text.lines().filter_map(|l| l.strip_prefix("data: ")).filter_map(|d| serde_json::from_str(d).ok()).collect();
    let with_call: Vec<&Value> = chunks.iter().filter(|c| c.pointer("/choices/0/delta/tool_calls/0/function/name").is_some()).collect();
    assert_eq!(with_call.len(), 1, "{text}");
    assert_eq!(with_call[0].pointer("/choices/0/delta/tool_calls/0/function/name").and_then(Value::as_str), Some("local_time"));
    assert_eq!(chunks.last().and_then(|c| c.pointer("/choices/0/finish_reason")).and_then(Value::as_str), Some("tool_calls"), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");

    // The tool's result: the model answers in text, the conversation's prefix cached.
    let answer = json!({"model": "Qwen3-0.6B", "max_tokens": 16, "tools": tools, "messages": [
        question,
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "12:00"},
    ]});
    let (s, v) = body(post(answer.clone()).await.expect("call")).await;
    assert_eq!(s, 200, "{v}");
    assert!(v.pointer("/choices/0/message/tool_calls").is_none(), "{v}");
    assert!(v.pointer("/choices/0/message/content").and_then(Value::as_str).is_some_and(|t| !t.is_empty()), "{v}");
    assert!(v.pointer("/usage/prompt_tokens_details/cached_tokens").and_then(Value::as_u64) > Some(0), "{v}");
    // A stop string (a word of the emulated filler) ends the answer before it.
    let mut stopped = answer;
    stopped["stop"] = json!(["filler"]);
    stopped["max_tokens"] = json!(64);
    let (s, v) = body(post(stopped).await.expect("call")).await;
    assert_eq!(s, 200, "{v}");
    let content = v.pointer("/choices/0/message/content").and_then(Value::as_str).unwrap_or("");
    assert!(!content.contains("filler") && v.pointer("/choices/0/finish_reason") == Some(&json!("stop")), "{v}");
    assert!(v.pointer("/usage/completion_tokens").and_then(Value::as_u64) < Some(16), "{v}");

    // Structured output: the answer is an instance of the schema (the emulated model's; vLLM's
    // guided decoding for a real one).
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}}, "required": ["city", "days"]});
    let (s, v) = body(post(json!({"model": "Qwen3-0.6B", "max_tokens": 64, "messages": [question],
        "response_format": {"type": "json_schema", "json_schema": {"name": "Trip", "schema": schema, "strict": true}}})).await.expect("call")).await;
    assert_eq!(s, 200, "{v}");
    let content = v.pointer("/choices/0/message/content").and_then(Value::as_str).unwrap_or("");
    let trip: Value = serde_json::from_str(content).unwrap_or(Value::Null);
    assert!(trip["city"].is_string() && trip["days"].as_u64() >= Some(1), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_forgets_the_oldest_ended_sessions_beyond_its_limit() {
    let server = Server::start_with(
        &repo().join("workflows/pools/live-emulated.yaml"),
        &[&repo().join("tests/fixtures/tiny_chain.yaml")],
        &["--keep-ended".as_ref(), "2".as_ref(), "--keep-runs".as_ref(), "3".as_ref()],
    );
    let http = reqwest::Client::new();
    let auth = format!("Bearer {TOKEN}");
    let mut runs = Vec::new();
    for _ in 0..3 {
        let resp = http.post(server.url("/v1/runs")).header("authorization", &auth).json(&json!({"workflow": "tiny-chain", "sessions": 1})).send().await.expect("run");
        let v: Value = resp.json().await.expect("json");
        let id = v["id"].as_str().expect("id").to_string();
        // One after the other, so that they end in order.
        for _ in 0..300 {
            let v: Value = http.get(server.url(&format!("/v1/runs/{id}"))).header("authorization", &auth).send().await.expect("status").json().await.expect("json");
            if v["state"] != "running" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        runs.push(id);
    }
    let state = |v: &Value| v.pointer("/sessions/0/state").and_then(Value::as_str).map(str::to_string);
    let first: Value = http.get(server.url(&format!("/v1/runs/{}", runs[0]))).header("authorization", &auth).send().await.expect("s").json().await.expect("j");
    let last: Value = http.get(server.url(&format!("/v1/runs/{}", runs[2]))).header("authorization", &auth).send().await.expect("s").json().await.expect("j");
    assert_eq!(state(&first).as_deref(), Some("unknown"), "the oldest ended session is forgotten: {first}");
    // Its run has ended (not failed), and its event stream ends.
    assert_eq!((first["state"].as_str(), first.pointer("/counts/unknown").and_then(Value::as_u64)), (Some("ended"), Some(1)), "{first}");
    let events = http.get(server.url(&format!("/v1/runs/{}/events", runs[0]))).header("authorization", &auth).timeout(Duration::from_secs(20)).send().await.expect("events");
    let text = events.text().await.expect("the stream ends");
    assert!(text.contains("run_end"), "{text}");
    assert_eq!(state(&last).as_deref(), Some("completed"), "{last}");
    let metrics = http.get(server.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains("switchyard_sessions{state=\"completed\"} 3"), "forgotten sessions still count: {metrics}");
    // Past `--keep-runs 3`, a new run forgets the oldest runs whose sessions were all forgotten
    // (the first), and keeps the rest.
    let resp = http.post(server.url("/v1/runs")).header("authorization", &auth).json(&json!({"workflow": "tiny-chain", "sessions": 1})).send().await.expect("run");
    assert_eq!(resp.status().as_u16(), 201);
    let gone = http.get(server.url(&format!("/v1/runs/{}", runs[0]))).header("authorization", &auth).send().await.expect("s");
    assert_eq!(gone.status().as_u16(), 404, "the forgotten run is dropped");
    // The list pages oldest first.
    let page = |q: &'static str| {
        let (http, auth, url) = (http.clone(), auth.clone(), server.url(&format!("/v1/runs{q}")));
        async move { http.get(url).header("authorization", auth).send().await.expect("list") }
    };
    let first_page: Value = page("?limit=2").await.json().await.expect("j");
    let ids = |v: &Value| v["runs"].as_array().map(|a| a.iter().filter_map(|r| r["id"].as_str().map(str::to_string)).collect::<Vec<_>>()).unwrap_or_default();
    assert_eq!(ids(&first_page), vec![runs[1].clone(), runs[2].clone()], "{first_page}");
    assert_eq!(first_page["next"].as_str(), Some(runs[2].as_str()));
    let rest: Value = http.get(server.url(&format!("/v1/runs?limit=2&after={}", runs[2]))).header("authorization", &auth).send().await.expect("list").json().await.expect("j");
    assert_eq!(ids(&rest).len(), 1, "{rest}");
    assert!(rest["next"].is_null(), "{rest}");
    let bad = page("?limit=0").await;
    assert_eq!(bad.status().as_u16(), 400);
    let bad: Value = bad.json().await.expect("j");
    assert_eq!(bad.pointer("/error/param").and_then(Value::as_str), Some("limit"), "{bad}");
}

/// Whether a request failed because the server closed the connection while the body was being
/// written (a broken pipe or a reset).
fn closed_while_writing(e: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(io.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset)
        {
            return true;
        }
        source = err.source();
    }
    false
}

/// One routed call (`model: switchyard-router`) of program `key` (`None`: without a key), the
/// last of its program when `done`: status, body, and the binding headers.
async fn routed_call(http: &reqwest::Client, server: &Server, key: Option<&str>, question: &str, done: bool) -> (u16, Value, Option<String>, Option<String>) {
    let mut req = http
        .post(server.url("/v1/chat/completions"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .json(&json!({"model": "switchyard-router", "messages": [{"role": "user", "content": question}], "max_tokens": 16}));
    if let Some(k) = key {
        req = req.header("X-Session-ID", k);
    }
    if done {
        req = req.header("X-Program-Done", "true");
    }
    let resp = req.send().await.expect("routed call");
    let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let (model, verifier) = (header("x-switchyard-model"), header("x-switchyard-verifier"));
    let (s, v) = body(resp).await;
    (s, v, model, verifier)
}

async fn post_verdict(http: &reqwest::Client, server: &Server, key: &str, verdict: Value) -> (u16, Value) {
    let url = server.url(&format!("/v1/programs/{key}/verdict"));
    body(http.post(url).header("authorization", format!("Bearer {TOKEN}")).json(&verdict).send().await.expect("verdict")).await
}

/// Paper 002 through the front door: a program that names the router's model is bound at its
/// first call to one of the router's models (the headers say which, and the verifier its task
/// type selects), every later routed call of it runs there, and its client's verdict — taken
/// once the program has ended — teaches the learner (the reward comes back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_front_door_program_is_bound_once_and_learns_from_its_verdict() {
    let server = Server::start(&repo().join("workflows/pools/live-emulated.yaml"), &[&repo().join("workflows/gsm8k-routed.yaml")]);
    let http = reqwest::Client::new();
    let auth = format!("Bearer {TOKEN}");
    let (s, v) = body(http.get(server.url("/v1/models")).header("authorization", &auth).send().await.expect("models")).await;
    assert_eq!(s, 200);
    let ids: Vec<&str> = v["data"].as_array().expect("list").iter().filter_map(|m| m["id"].as_str()).collect();
    assert!(ids.contains(&"switchyard-router"), "{ids:?}");

    let question = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether?";
    // The router binds programs: a call without a key is refused.
    let (s, v, _, _) = routed_call(&http, &server, None, question, false).await;
    assert_eq!((s, v.pointer("/error/param").and_then(Value::as_str)), (400, Some("program_id")), "{v}");

    let (s, v, model, verifier) = routed_call(&http, &server, Some("p1"), question, false).await;
    assert_eq!(s, 200, "{v}");
    let model = model.expect("x-switchyard-model");
    assert!(["Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-8B"].contains(&model.as_str()), "{model}");
    assert_eq!(v["model"].as_str(), Some(model.as_str()), "the answer names the bound model");
    assert_eq!(verifier.as_deref(), Some("gsm8k_exact"), "a GSM8K task selects the exact-answer verifier");
    // Open: no verdict yet.
    let (s, v) = post_verdict(&http, &server, "p1", json!({"success": true})).await;
    assert_eq!(s, 409, "{v}");
    // The program's later calls run on its model, whatever the text.
    let (s, v, again, _) = routed_call(&http, &server, Some("p1"), "Now write a python function that reverses a list.", true).await;
    assert_eq!((s, again.as_deref()), (200, Some(model.as_str())), "{v}");
    // Ended: the verdict lands once.
    let (s, v) = post_verdict(&http, &server, "p1", json!({"success": 2})).await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = post_verdict(&http, &server, "p1", json!({"success": true})).await;
    assert_eq!(s, 200, "{v}");
    let reward = v["reward"].as_f64().expect("reward");
    assert!(reward <= 1.0 && reward > 0.0, "success 1 less the cost term: {v}");
    let (s, _) = post_verdict(&http, &server, "p1", json!({"success": true})).await;
    assert_eq!(s, 404, "a verdict lands once");
    let (s, _) = post_verdict(&http, &server, "never-routed", json!({"success": false})).await;
    assert_eq!(s, 404);
    // A key names one program at a time: a new program under p2 before p2's verdict gives the
    // ended one up; the verdict then waits for the new one to end, and lands on it.
    let (s, _, _, _) = routed_call(&http, &server, Some("p2"), question, true).await;
    assert_eq!(s, 200);
    let (s, _, _, _) = routed_call(&http, &server, Some("p2"), question, false).await;
    assert_eq!(s, 200);
    let (s, v) = post_verdict(&http, &server, "p2", json!({"success": 0.5})).await;
    assert_eq!(s, 409, "the new program under p2 is open: {v}");
    let (s, _, _, _) = routed_call(&http, &server, Some("p2"), question, true).await;
    assert_eq!(s, 200);
    let (s, v) = post_verdict(&http, &server, "p2", json!({"success": 0.5})).await;
    assert_eq!((s, v["success"].as_f64()), (200, Some(0.5)), "{v}");
    // Reused while the earlier program's last call still runs: the new program is routed
    // afresh, the earlier one is given up once it has ended, and the verdict lands on the new.
    let long = json!({"model": "switchyard-router", "messages": [{"role": "user", "content": question}], "max_tokens": 4000});
    let last = http
        .post(server.url("/v1/chat/completions"))
        .header("authorization", &auth)
        .header("X-Session-ID", "p3")
        .header("X-Program-Done", "true")
        .json(&long)
        .send();
    let next = async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        routed_call(&http, &server, Some("p3"), question, false).await
    };
    let (a, (s, _, _, _)) = tokio::join!(last, next);
    assert_eq!((a.expect("p3's last call").status().as_u16(), s), (200, 200));
    let (s, _) = post_verdict(&http, &server, "p3", json!({"success": true})).await;
    assert_eq!(s, 409, "the later program under p3 is open");
    let (s, _, _, _) = routed_call(&http, &server, Some("p3"), question, true).await;
    assert_eq!(s, 200);
    let (s, v) = post_verdict(&http, &server, "p3", json!({"success": true})).await;
    assert_eq!(s, 200, "{v}");
    // The metrics: five programs bound, three verdicts landed, the first p2 and p3 given up.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = http.get(server.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    let count = |prefix: &str| -> f64 {
        text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
    };
    assert_eq!(count("switchyard_routed_programs_total{"), 5.0, "{text}");
    assert_eq!(count("switchyard_program_verdicts_total{kind=\"landed\"}"), 3.0, "{text}");
    assert_eq!(count("switchyard_program_verdicts_total{kind=\"given_up\"}"), 2.0, "{text}");
}
