//! The engines against real servers over loopback: `HttpEngine` and `OpenAiEngine` against an
//! in-process `switchyard emulate` server (and a stub that counts hits, to prove no hidden
//! retries), and `VllmEngine` managing real child processes.
//!
//! The child processes: this test binary re-executes itself running the ignored test
//! `emulate_child_process`, which serves `switchyard emulate` (the same
//! `server::run_blocking` the CLI calls) with the options in `SWITCHYARD_TEST_EMULATE_CHILD`.
//! `env!("CARGO_BIN_EXE_switchyard")` is only visible to the root package's tests, so this is
//! how the runtime crate manages real processes over real sockets in its own tests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use switchyard_predictor::spec::Dtype;
use switchyard_runtime::live::engine::{AttemptCost, Engine, EngineError, LlmRequest};
use switchyard_runtime::live::engines::{
    ApiFlavor, CommandTemplate, EngineKind, EngineSpec, HttpEngine, HttpOptions, LaunchParams,
    ManagedCommand, OpenAiEngine, VllmEngine, engine_for, process_group_members,
};
use switchyard_runtime::live::server::{self, EmulateConfig, EmulateServer};
use switchyard_runtime::tokens;

const DEVICE: &str = "A100-80GB";
const MODEL: &str = "Qwen3-0.6B";
const CHILD_ENV: &str = "SWITCHYARD_TEST_EMULATE_CHILD";

fn request(id: u64, prompt: &str, output: Option<&str>, stream: bool) -> LlmRequest {
    LlmRequest {
        id,
        model: MODEL.into(),
        prompt: prompt.into(),
        max_tokens: 256,
        server_default_limit: false,
        emulated_output: output.map(str::to_string),
        enable_thinking: false,
        stream,
        prompt_tokens: tokens::count_chat(prompt) as u32,
        deadline_s: None,
messages: None,
raw_prompt: false,
tools: Vec::new(),
tool_choice: None,
parallel_tool_calls: None,
stop: Vec::new(),
response_format: None,
sink: Default::default(),
meter: Default::default(),
    }
}

fn long_prompt() -> String {
    "Summarise the meeting: the team agreed to ship the planner on Friday. ".repeat(25)
}

fn options() -> HttpOptions {
    HttpOptions {
        request_timeout: Duration::from_secs(20),
        health_timeout: Duration::from_secs(20),
        ..HttpOptions::default()
    }
}

async fn emulate(fail_rate: f64, garbage_rate: f64) -> EmulateServer {
    let mut cfg = EmulateConfig::new(DEVICE, MODEL);
    cfg.speed = 2000.0;
    cfg.max_model_len = Some(8192);
    cfg.fail_rate = fail_rate;
    cfg.garbage_rate = garbage_rate;
    EmulateServer::start(cfg, SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap()
}

async fn http_engine(server: &EmulateServer, api: ApiFlavor) -> HttpEngine {
    let e = HttpEngine::new(
        "emulated",
        &server.base_url(),
        MODEL,
        HttpOptions { api, ..options() },
    )
    .unwrap();
    e.load().await.unwrap();
    e
}

#[tokio::test]
async fn http_engine_completes_streamed_and_not_with_cached_tokens() {
    let server = emulate(0.0, 0.0).await;
    for api in [ApiFlavor::Completions, ApiFlavor::Chat] {
        let e = http_engine(&server, api).await;
        let prompt = format!("{api:?} {}", long_prompt());
        let out = "The team ships the planner on Friday.";
        let first = e
            .submit(request(1, &prompt, Some(out), false))
            .await
            .unwrap();
        assert_eq!(first.text, out);
        assert_eq!(first.output_tokens as usize, tokens::count(out));
        assert_eq!(first.cached_prompt_tokens, 0);
        // Both flavours send the prompt in Qwen3's chat template, thinking off: the server
        // counts what the runtime planned with.
        assert_eq!(first.prompt_tokens as usize, tokens::count(&tokens::chat_prompt(&prompt)));
        assert_eq!(first.prompt_tokens as usize, tokens::encode_chat(&[&prompt]).len());
        assert!(first.latency_s > 0.0 && first.ttft_s == first.latency_s);
        let second = e
            .submit(request(2, &prompt, Some(out), true))
            .await
            .unwrap();
        assert_eq!(second.text, out);
        assert_eq!(second.prompt_tokens, first.prompt_tokens);
        assert!(
            second.cached_prompt_tokens > first.prompt_tokens / 2,
            "{api:?}: repeated prompt cached {} of {}",
            second.cached_prompt_tokens,
            second.prompt_tokens
        );
        assert!(second.ttft_s > 0.0 && second.ttft_s <= second.latency_s);
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn http_engine_telemetry_and_both_sleep_levels() {
    let server = emulate(0.0, 0.0).await;
    let e = http_engine(&server, ApiFlavor::Completions).await;
    let t0 = e.telemetry().await.unwrap();
    assert_eq!(
        (t0.running, t0.waiting, t0.prefix_cache_queries),
        (0.0, 0.0, 0.0)
    );
    assert!(!t0.sleeping);
    e.submit(request(1, &long_prompt(), None, false))
        .await
        .unwrap();
    e.submit(request(2, &long_prompt(), None, false))
        .await
        .unwrap();
    let t1 = e.telemetry().await.unwrap();
    assert!(
        t1.prefix_cache_queries > 0.0 && t1.prefix_cache_hits > 0.0,
        "{t1:?}"
    );
    for level in [1, 2] {
        e.sleep(level).await.unwrap();
        assert!(e.telemetry().await.unwrap().sleeping);
        // Asleep: the server answers 503, a retryable BadResponse.
        let err = e.submit(request(3, "hi", None, false)).await.unwrap_err();
        assert!(
            matches!(err, EngineError::BadResponse(ref m) if m.contains("503")),
            "{err:?}"
        );
        assert!(err.retryable());
        // Level 2 wakes through vLLM's three calls (weights, reload_weights, kv_cache).
        e.wake().await.unwrap();
        assert!(!e.telemetry().await.unwrap().sleeping);
        e.submit(request(4, "hi", None, false)).await.unwrap();
    }
    assert!(matches!(e.unload().await, Err(EngineError::Unsupported(_))));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn faults_map_to_engine_errors() {
    // 5xx → BadResponse (retryable).
    let server = emulate(1.0, 0.0).await;
    let e = http_engine(&server, ApiFlavor::Completions).await;
    for stream in [false, true] {
        let err = e.submit(request(1, "hi", None, stream)).await.unwrap_err();
        assert!(
            matches!(err, EngineError::BadResponse(ref m) if m.contains("500")),
            "{err:?}"
        );
    }
    server.shutdown().await.unwrap();
    // Garbage with 200 → BadResponse.
    let server = emulate(0.0, 1.0).await;
    let e = http_engine(&server, ApiFlavor::Chat).await;
    for stream in [false, true] {
        let err = e.submit(request(1, "hi", None, stream)).await.unwrap_err();
        assert!(
            matches!(err, EngineError::BadResponse(_)),
            "stream={stream}: {err:?}"
        );
    }
    server.shutdown().await.unwrap();
    // 4xx → Rejected (not retryable).
    let server = emulate(0.0, 0.0).await;
    let e = http_engine(&server, ApiFlavor::Completions).await;
    let mut req = request(1, "hi", None, false);
    req.model = "no-such-model".into();
    let err = e.submit(req).await.unwrap_err();
    assert!(
        matches!(err, EngineError::Rejected(_)) && !err.retryable(),
        "{err:?}"
    );
    let base = server.base_url();
    server.shutdown().await.unwrap();
    // Nothing listening → Unreachable (retryable).
    let gone = HttpEngine::new("emulated", &base, MODEL, options()).unwrap();
    let err = gone
        .submit(request(1, "hi", None, false))
        .await
        .unwrap_err();
    assert!(
        matches!(err, EngineError::Unreachable(_)) && err.retryable(),
        "{err:?}"
    );
    let err = gone
        .wait_healthy(Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::Lifecycle(_)), "{err:?}");
}

#[tokio::test]
async fn openai_engine_serves_chat_and_has_no_lifecycle() {
    let server = emulate(0.0, 0.0).await;
    // Residency is taken as given: wait for the server's own load, then `load` only checks
    // that the endpoint answers.
    http_engine(&server, ApiFlavor::Chat).await;
    let e = OpenAiEngine::new(&format!("{}/v1", server.base_url()), MODEL, options()).unwrap();
    e.load().await.unwrap();
    let prompt = long_prompt();
    let out = "Friday.";
    let a = e
        .submit(request(1, &prompt, Some(out), false))
        .await
        .unwrap();
    assert_eq!(a.text, out);
    assert_eq!(a.output_tokens as usize, tokens::count(out));
    let b = e
        .submit(request(2, &prompt, Some(out), true))
        .await
        .unwrap();
    assert_eq!(b.text, out);
    assert!(b.cached_prompt_tokens > 0);
    let t = e.telemetry().await.unwrap();
    assert!(t.prefix_cache_hits > 0.0);
    assert!(matches!(e.sleep(1).await, Err(EngineError::Unsupported(_))));
    assert!(matches!(e.wake().await, Err(EngineError::Unsupported(_))));
    assert!(matches!(e.unload().await, Err(EngineError::Unsupported(_))));
    assert_eq!(e.kind(), "openai");
    server.shutdown().await.unwrap();
}

/// Serves `app` on a loopback port: its root URL (`http://ADDR`) and the serving task.
async fn serve_on_loopback(app: axum::Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
    let root = format!("http://{}", listener.local_addr().expect("the bound address"));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (root, task)
}

/// A stub endpoint that answers every request with `status` and counts the hits.
async fn stub(status: u16) -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    use axum::http::StatusCode;
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&hits);
    let code = StatusCode::from_u16(status).unwrap();
    let app = axum::Router::new().fallback(move || {
        let counter = Arc::clone(&counter);
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            (
                code,
                r#"{"error":{"message":"stub","type":"x","param":null,"code":null}}"#,
            )
        }
    });
    let (root, task) = serve_on_loopback(app).await;
    let base = format!("{root}/v1");
    (base, hits, task)
}

#[tokio::test]
async fn openai_engine_does_not_retry_behind_the_callers_back() {
    // One call, one HTTP request: retrying (429, 5xx) is the replica actor's decision, never hidden.
    for (status, retryable) in [(500, true), (503, true), (429, true), (400, false)] {
        let (base, hits, task) = stub(status).await;
        let e = OpenAiEngine::new(&base, MODEL, options()).unwrap();
        let err = e.submit(request(1, "hi", None, false)).await.unwrap_err();
        assert_eq!(err.retryable(), retryable, "{status}: {err:?}");
        assert_eq!(hits.load(Ordering::SeqCst), 1, "HTTP {status} was retried");
        let err = e.submit(request(2, "hi", None, true)).await.unwrap_err();
        assert_eq!(err.retryable(), retryable, "{status} streamed: {err:?}");
        assert_eq!(
            hits.load(Ordering::SeqCst),
            2,
            "streamed HTTP {status} was retried"
        );
        task.abort();
    }
}

#[tokio::test]
async fn a_streamed_call_answered_with_one_json_body_is_read_as_a_whole_answer() {
    // A server (or proxy) that ignores `stream: true` and answers one JSON completion: the
    // answer stands (it was read as an empty event stream, and refused, before); a JSON error
    // object with a 200 is a bad answer, not an empty stream.
    for (body, ok) in [
        (r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"Friday."},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3}}"#, true),
        (r#"{"error":{"message":"upstream hiccup","type":"x"}}"#, false),
    ] {
        let app = axum::Router::new().fallback(move || async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], body) });
        let (root, task) = serve_on_loopback(app).await;
        let base = format!("{root}/v1");
        let e = OpenAiEngine::new(&base, MODEL, options()).unwrap();
        let r = e.submit(request(1, "hi", None, true)).await;
        if ok {
            let a = r.unwrap();
            assert_eq!((a.text.as_str(), a.prompt_tokens, a.output_tokens), ("Friday.", 7, 3));
        } else {
            let err = r.unwrap_err();
            assert!(matches!(err, EngineError::BadResponse(_)), "{err:?}");
        }
        task.abort();
    }
}

/// What a 200 holds decides a call the same way streamed or not: no choice is a bad answer
/// (sent again: a stream of only `[DONE]` completed with empty text, one with no event at all
/// was refused at once, while `"choices": []` was sent again); a body that is neither JSON nor
/// an event stream is unparsable, its excerpt in the error (a streamed one was read as an
/// empty stream and refused, the body never shown); a body of another type (`text/plain`, as
/// some proxies label a stream) is parsed as a stream; a stream is whole at `[DONE]` or once a
/// choice carried its `finish_reason` (one that closed after it without `[DONE]` was taken
/// for a dropped connection), and cut short when it closes before either.
#[tokio::test]
async fn a_200_without_an_answer_is_a_bad_answer_streamed_or_not() {
    enum Want {
        Answer(&'static str, u32),
        Bad(&'static str),
        CutShort,
    }
    const SSE: &str = "text/event-stream";
    let chunk = |content: &str, finish: &str| {
        format!(r#"data: {{"choices":[{{"index":0,"delta":{{"content":"{content}"}},"finish_reason":{finish}}}]}}"#) + "\n\n"
    };
    let usage = r#"data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":7,"total_tokens":17}}"#.to_string() + "\n\n";
    let done = "data: [DONE]\n\n";
    let words = chunk("A ", "null") + &chunk("scheduler", "null");
    let cases: Vec<(&str, &str, String, bool, Want)> = vec![
        ("html, streamed", "text/html", "<html>gateway</html>".into(), true, Want::Bad("<html>gateway</html>")),
        ("html, whole", "text/html", "<html>gateway</html>".into(), false, Want::Bad("<html>gateway</html>")),
        ("an event stream with no event", SSE, "<html>gateway</html>".into(), true, Want::Bad("(no event in it): <html>gateway</html>")),
        ("an empty stream", SSE, String::new(), true, Want::Bad("empty stream")),
        ("only [DONE]", SSE, done.into(), true, Want::Bad("no choices")),
        ("only usage", SSE, usage.clone() + done, true, Want::Bad("no choices")),
        ("no choices, whole", "application/json", r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":0}}"#.into(), false, Want::Bad("/v1/completions: no choices")),
        ("finished, usage, no [DONE]", SSE, words.clone() + &chunk("", r#""stop""#) + &usage, true, Want::Answer("A scheduler", 7)),
        ("finished, no usage, no [DONE]", SSE, words.clone() + &chunk("", r#""length""#), true, Want::Answer("A scheduler", 2)),
        ("no finish_reason, [DONE]", SSE, words.clone() + done, true, Want::Answer("A scheduler", 2)),
        ("no finish_reason, no [DONE]", SSE, words.clone(), true, Want::CutShort),
        // A proxy that labels the event stream as plain text: still a stream.
        ("an event stream labelled text/plain", "text/plain", words.clone() + done, true, Want::Answer("A scheduler", 2)),
        ("plain text that is no stream", "text/plain", "upstream timeout".into(), true, Want::Bad("(no event in it): upstream timeout")),
    ];
    for (case, content_type, body, stream, want) in cases {
        let app = axum::Router::new().fallback(move || {
            let body = body.clone();
            async move { ([(axum::http::header::CONTENT_TYPE, content_type)], body) }
        });
        let (root, task) = serve_on_loopback(app).await;
        let e = OpenAiEngine::new(&format!("{root}/v1"), MODEL, options()).unwrap();
        let r = e.submit(request(1, "hi", None, stream)).await;
        match (want, r) {
            (Want::Answer(text, output), Ok(a)) => assert_eq!((a.text.as_str(), a.output_tokens), (text, output), "{case}"),
            (Want::Bad(said), Err(err @ EngineError::BadResponse(_))) => {
                assert!(err.retryable(), "{case}: {err:?}");
                assert!(err.to_string().contains(said), "{case}: {err}");
            }
            (Want::CutShort, Err(err @ EngineError::Unreachable(_))) => assert!(err.to_string().contains("before [DONE]"), "{case}: {err}"),
            (_, r) => panic!("{case}: {r:?}"),
        }
        task.abort();
    }
}

/// An upstream server is a network peer: one that streams text past the call's token limit,
/// sends an event-stream line that never ends, answers with a body of gigabytes or redirects to
/// another host is cut off with a bad-response error, quickly, without buffering what it sends
/// (each of these grew this process's memory until the request timeout, or followed the
/// redirect with the pool's headers).
#[tokio::test]
async fn a_hostile_upstream_is_cut_off_not_buffered() {
    use axum::response::IntoResponse;
    let endless = |piece: &'static str| {
        futures::stream::unfold((), move |()| async move { Some((Ok::<_, std::convert::Infallible>(bytes_of(piece)), ())) })
    };
    fn bytes_of(s: &'static str) -> axum::body::Bytes {
        axum::body::Bytes::from_static(s.as_bytes())
    }
    let app = axum::Router::new()
        .route(
            "/text/v1/completions",
            axum::routing::post(move || async move {
                let chunk = "data: {\"choices\":[{\"index\":0,\"text\":\" many words at once, over and over\"}]}\n\n";
                ([(axum::http::header::CONTENT_TYPE, "text/event-stream")], axum::body::Body::from_stream(endless(chunk))).into_response()
            }),
        )
        .route(
            "/line/v1/completions",
            axum::routing::post(move || async move {
                ([(axum::http::header::CONTENT_TYPE, "text/event-stream")], axum::body::Body::from_stream(endless("data: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"))).into_response()
            }),
        )
        .route(
            "/body/v1/completions",
            axum::routing::post(move || async move {
                // 64 KiB pieces: the cap, not the transport, is what the test waits for.
                static PIECE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| format!("{{\"choices\":[\"{}", "x".repeat(64 << 10)));
                let body = futures::stream::unfold((), |()| async { Some((Ok::<_, std::convert::Infallible>(axum::body::Bytes::from_static(PIECE.as_bytes())), ())) });
                ([(axum::http::header::CONTENT_TYPE, "application/json")], axum::body::Body::from_stream(body)).into_response()
            }),
        )
        .route(
            "/usage/v1/completions",
            axum::routing::post(|| async {
                let absurd = u32::MAX;
                axum::Json(serde_json::json!({"choices": [{"index": 0, "text": "hi"}],
                    "usage": {"prompt_tokens": absurd, "completion_tokens": absurd, "prompt_tokens_details": {"cached_tokens": absurd}}}))
            }),
        )
        .route(
            "/redirect/v1/completions",
            axum::routing::post(|| async { axum::response::Redirect::temporary("http://192.0.2.1/v1/completions") }),
        );
    let (root, task) = serve_on_loopback(app).await;
    for (path, stream) in [("text", true), ("line", true), ("body", false), ("redirect", false)] {
        let e = OpenAiEngine::new(&format!("{root}/{path}/v1"), MODEL, options()).unwrap();
        let started = std::time::Instant::now();
        let err = e.submit(request(1, "hi", None, stream)).await.unwrap_err();
        assert!(matches!(err, EngineError::BadResponse(_)), "{path}: {err:?}");
        assert!(started.elapsed() < Duration::from_secs(15), "{path}: cut off only after {:?}", started.elapsed());
    }
    // Credentials in a URL would be printed wherever the endpoint is named: refused, without
    // echoing them.
    let refused = OpenAiEngine::new("http://user:s3cret@127.0.0.1:1/v1", MODEL, options()).err().map(|e| e.to_string());
    assert!(refused.as_deref().is_some_and(|m| m.contains("credentials") && !m.contains("s3cret")), "{refused:?}");
    // Absurd counts are held to what the request allows (their sum overflowed a u32 in the
    // report's token work).
    let e = OpenAiEngine::new(&format!("{root}/usage/v1"), MODEL, options()).unwrap();
    let c = e.submit(request(1, "hi", None, false)).await.unwrap();
    assert_eq!((c.output_tokens, c.cached_prompt_tokens <= c.prompt_tokens), (256, true), "{c:?}");
    task.abort();
}

/// An SSE endpoint that waits `first_after` before its first chunk, then streams `chunks`
/// pieces " tok" every `every`, then `[DONE]` — or, with `done` false, ends the stream
/// without it (an answer broken off).
async fn paced_stream(first_after: Duration, chunks: u32, every: Duration, done: bool) -> (String, tokio::task::JoinHandle<()>) {
    use axum::response::sse::{Event, Sse};
    let app = axum::Router::new().fallback(move || async move {
        let stream = futures::stream::unfold(0u32, move |i| async move {
            if i > chunks || (i == chunks && !done) {
                return None;
            }
            tokio::time::sleep(if i == 0 { first_after } else { every }).await;
            let data = if i == chunks {
                "[DONE]".to_string()
            } else {
                serde_json::json!({"choices": [{"index": 0, "text": " tok"}]}).to_string()
            };
            Some((Ok::<_, std::convert::Infallible>(Event::default().data(data)), i + 1))
        });
        Sse::new(stream)
    });
    let (root, task) = serve_on_loopback(app).await;
    let base = format!("{root}/v1");
    (base, task)
}

#[tokio::test]
async fn a_call_deadline_bounds_the_first_chunk_not_a_stream_in_progress() {
    // 30 chunks every 50 ms (1.5 s) under a 0.5 s deadline: the stream is progressing, so it
    // runs to its end instead of being cut and sent again.
    let (base, task) = paced_stream(Duration::from_millis(10), 30, Duration::from_millis(50), true).await;
    let e = OpenAiEngine::new(&base, MODEL, options()).unwrap();
    let mut r = request(1, "hi", None, true);
    r.deadline_s = Some(0.5);
    let a = e.submit(r).await.unwrap();
    assert_eq!(a.text, " tok".repeat(30));
    task.abort();
    // No first chunk within the deadline: timed out, as before.
    let (base, task) = paced_stream(Duration::from_millis(1500), 3, Duration::from_millis(10), true).await;
    let e = OpenAiEngine::new(&base, MODEL, options()).unwrap();
    let mut r = request(2, "hi", None, true);
    r.deadline_s = Some(0.5);
    let err = e.submit(r).await.unwrap_err();
    assert!(matches!(err, EngineError::TimedOut(_)), "{err:?}");
    task.abort();
}

#[tokio::test]
async fn a_broken_off_stream_leaves_what_it_cost_on_the_calls_meter() {
    // Five pieces, then the stream ends without `[DONE]`: the attempt fails, and its meter
    // says its prompt was prefilled and five tokens were generated.
    let (base, task) = paced_stream(Duration::from_millis(5), 5, Duration::from_millis(5), false).await;
    let e = OpenAiEngine::new(&base, MODEL, options()).unwrap();
    let r = request(1, "hi", None, true);
    let meter = r.meter.clone();
    let err = e.submit(r).await.unwrap_err();
    assert!(matches!(err, EngineError::Unreachable(_)), "{err:?}");
    assert_eq!(meter.take(), AttemptCost { prefilled: true, output_tokens: 5 });
    // Taken: the next attempt starts from nothing.
    assert_eq!(meter.take(), AttemptCost::default());
    // No first chunk before the deadline: nothing is known to have been computed.
    let (base2, task2) = paced_stream(Duration::from_millis(1500), 3, Duration::from_millis(10), true).await;
    let e = OpenAiEngine::new(&base2, MODEL, options()).unwrap();
    let mut r = request(2, "hi", None, true);
    r.deadline_s = Some(0.3);
    let meter = r.meter.clone();
    assert!(e.submit(r).await.is_err());
    assert_eq!(meter.take(), AttemptCost::default());
    task.abort();
    task2.abort();
}

// ---- managed processes --------------------------------------------------------------------

/// Entry point of the child process (run only when re-executed with `CHILD_ENV` set).
#[test]
#[ignore = "entry point of the emulate child processes of the VllmEngine tests"]
fn emulate_child_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let words: Vec<&str> = spec.split_whitespace().collect();
    let [device, model, port, speed] = words[..] else {
        panic!("{CHILD_ENV} must be `DEVICE MODEL PORT SPEED`, got `{spec}`");
    };
    let mut cfg = EmulateConfig::new(device, model);
    cfg.speed = speed.parse().unwrap();
    cfg.max_model_len = Some(8192);
    cfg.dtype = Dtype::Fp16;
    let addr = SocketAddr::from(([127, 0, 0, 1], port.parse().unwrap()));
    server::run_blocking(cfg, addr, |a| eprintln!("child listening on {a}")).unwrap();
}

fn launch() -> LaunchParams {
    LaunchParams {
        model: MODEL.into(),
        device_kind: DEVICE.into(),
        gpu: 0,
        dtype: Dtype::Fp16,
        max_model_len: 8192,
        gpu_memory_utilization: 0.9,
        max_num_seqs: 256,
        noise_seed: 0,
        switchyard_exe: None,
    }
}

/// A `vllm` spec whose command re-executes this test binary as an emulate child; with
/// `grandchild`, through `sh` that first forks a `sleep` into the same process group (as a
/// vLLM server forks workers), so that the shutdown must kill a whole group.
fn child_spec(grandchild: bool) -> EngineSpec {
    let exe: PathBuf = std::env::current_exe().unwrap();
    let exe = exe.to_string_lossy().into_owned();
    let harness = "emulate_child_process --exact --ignored --nocapture --test-threads=1";
    let args = if grandchild {
        vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            format!("sleep 120 & exec \"$0\" {harness}"),
            exe,
        ]
    } else {
        std::iter::once(exe)
            .chain(harness.split(' ').map(str::to_string))
            .collect()
    };
    let mut spec = EngineSpec::new(EngineKind::Vllm);
    spec.command = Some(CommandTemplate::Args(args));
    spec.env
        .insert(CHILD_ENV.into(), "{device} {served} {port} 1000".into());
    spec.health_timeout_s = Some(30.0);
    spec.request_timeout_s = Some(30.0);
    spec.shutdown_grace_s = Some(5.0);
    spec
}

fn managed(grandchild: bool) -> VllmEngine {
    let spec = child_spec(grandchild);
    let command = ManagedCommand::from_spec(&spec, &launch()).unwrap();
    VllmEngine::new("vllm", command, MODEL, options(), Duration::from_secs(5))
}

#[tokio::test]
async fn vllm_engine_lifecycle_leaves_no_orphans() {
    let e = managed(true);
    assert!(matches!(
        e.submit(request(1, "hi", None, false)).await,
        Err(EngineError::Unreachable(_))
    ));
    e.load().await.unwrap();
    let pgid = e.pid().unwrap() as i32;
    let members = process_group_members(pgid);
    assert!(
        members.len() >= 2,
        "the child and its sleeping grandchild: {members:?}"
    );
    // The group is not ours: the child runs in its own process group.
    assert!(!members.contains(&std::process::id()));
    // Loading again is a no-op on a live child.
    e.load().await.unwrap();
    assert_eq!(e.pid(), Some(pgid as u32));

    let prompt = long_prompt();
    let a = e
        .submit(request(1, &prompt, Some("ok"), false))
        .await
        .unwrap();
    let b = e
        .submit(request(2, &prompt, Some("ok"), true))
        .await
        .unwrap();
    assert_eq!((a.text.as_str(), b.text.as_str()), ("ok", "ok"));
    assert!(b.cached_prompt_tokens > 0);
    e.sleep(1).await.unwrap();
    assert!(e.telemetry().await.unwrap().sleeping);
    e.wake().await.unwrap();
    let t = e.telemetry().await.unwrap();
    assert!(!t.sleeping && t.prefix_cache_queries > 0.0);

    e.unload().await.unwrap();
    assert_eq!(
        process_group_members(pgid),
        Vec::<u32>::new(),
        "orphans left in group {pgid}"
    );
    assert_eq!(e.pid(), None);
    // Unloading twice is fine; calls after it are Unreachable.
    e.unload().await.unwrap();
    assert!(matches!(
        e.telemetry().await,
        Err(EngineError::Unreachable(_))
    ));
}

#[tokio::test]
async fn vllm_engine_detects_a_crash_and_restarts() {
    let e = managed(false);
    e.load().await.unwrap();
    let pid = e.pid().unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let mut err = None;
    for i in 0..100 {
        match e.submit(request(i, "hi", None, false)).await {
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(x) => {
                err = Some(x);
                break;
            }
        }
    }
    let err = err.expect("a killed child still answered");
    assert!(
        matches!(err, EngineError::Unreachable(ref m) if m.contains("exited") || m.contains("not running")),
        "{err:?}"
    );
    assert!(err.retryable());
    assert_eq!(e.pid(), None);
    e.restart().await.unwrap();
    let new_pid = e.pid().unwrap();
    assert_ne!(new_pid, pid);
    assert_eq!(
        e.submit(request(99, "hi", Some("back"), false))
            .await
            .unwrap()
            .text,
        "back"
    );
    e.unload().await.unwrap();
    assert!(process_group_members(new_pid as i32).is_empty());
}

/// Another process's server on the port the engine picked (it bound the port in the window
/// between the engine's pick and the child's bind: another engine starting on this host,
/// another program) is not taken for the child's. The first child here writes its port and
/// never binds it, and a stranger serving another model binds it from this test process
/// (outside the child's process group), as a slow-starting child loses the race under load;
/// the start is made again on a fresh port and its own child serves there. (The engine used
/// to inspect the stranger: "model `Qwen3-0.6B` is not served at … (it serves: Qwen3-8B)", a
/// start the replica actor does not retry, so the unit could not be placed.)
#[tokio::test]
async fn vllm_engine_does_not_take_a_strangers_server_on_its_port_for_its_child() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap().to_string_lossy().into_owned();
    let harness = "emulate_child_process --exact --ignored --nocapture --test-threads=1";
    let mut spec = child_spec(false);
    spec.command = Some(CommandTemplate::Args(vec![
        "/bin/sh".into(),
        "-c".into(),
        format!("if mkdir \"$1/first\" 2>/dev/null; then echo \"$2\" > \"$1/port\"; exec sleep 60; else exec \"$0\" {harness}; fi"),
        exe,
        dir.path().to_string_lossy().into_owned(),
        "{port}".into(),
    ]));
    let e = engine_for(&spec, &launch()).unwrap();
    let port_file = dir.path().join("port");
    let stranger = async {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let port = loop {
            if let Some(p) = std::fs::read_to_string(&port_file).ok().and_then(|t| t.trim().parse::<u16>().ok()) {
                break p;
            }
            assert!(std::time::Instant::now() < deadline, "the first child never wrote its port");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let mut cfg = EmulateConfig::new(DEVICE, "Qwen3-8B");
        cfg.speed = 2000.0;
        cfg.max_model_len = Some(8192);
        EmulateServer::start(cfg, SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .unwrap()
    };
    let (loaded, stranger) = tokio::join!(e.load(), stranger);
    loaded.expect("the start moves to a port of its own");
    let stranger_port = stranger.base_url().rsplit(':').next().unwrap().to_string();
    let ours = e.endpoint();
    assert!(!ours.ends_with(&format!(":{stranger_port}")), "{ours} is the stranger's port");
    let done = e.submit(request(1, "hi", Some("from the child"), false)).await.unwrap();
    assert_eq!(done.text, "from the child");
    // The stranger was left alone.
    let other = HttpEngine::new("emulated", &stranger.base_url(), "Qwen3-8B", options()).unwrap();
    other.load().await.unwrap();
    e.unload().await.unwrap();
    stranger.shutdown().await.unwrap();
}

/// A load of `spec` that must fail with a lifecycle error: that error's message.
async fn failed_start(spec: &EngineSpec) -> String {
    let e = engine_for(spec, &launch()).expect("an engine for the spec");
    match e.load().await.expect_err("the start fails") {
        EngineError::Lifecycle(m) => m,
        other => panic!("not a lifecycle error: {other:?}"),
    }
}

#[tokio::test]
async fn vllm_engine_reports_failed_starts_with_the_childs_output() {
    let mut spec = EngineSpec::new(EngineKind::Vllm);
    spec.command = Some(CommandTemplate::Args(vec![
        "/bin/sh".into(),
        "-c".into(),
        "echo \"CUDA out of memory on port $0\" >&2; exit 3".into(),
        "{port}".into(),
    ]));
    spec.health_timeout_s = Some(10.0);
    let m = failed_start(&spec).await;
    assert!(m.contains("exit status: 3"), "{m}");
    assert!(m.contains("CUDA out of memory"), "{m}");

    spec.command = Some(CommandTemplate::Line(
        "/no/such/vllm serve {model} --port {port}".into(),
    ));
    let m = failed_start(&spec).await;
    assert!(m.contains("cannot start"), "{m}");

    // A child that never becomes healthy is stopped after the health timeout.
    spec.command = Some(CommandTemplate::Line("sleep 60 {port}".into()));
    spec.health_timeout_s = Some(0.3);
    let m = failed_start(&spec).await;
    assert!(m.contains("not healthy"), "{m}");
}

#[tokio::test]
async fn the_factory_builds_a_managed_engine_that_serves() {
    let e = engine_for(&child_spec(false), &launch()).unwrap();
    assert_eq!(e.kind(), "vllm");
    e.load().await.unwrap();
    let c = e
        .submit(request(1, "What is 6 x 7?", Some("42"), true))
        .await
        .unwrap();
    assert_eq!(c.text, "42");
    e.unload().await.unwrap();
}

/// A stub of a third-party OpenAI-compatible server (llama.cpp-like: no `/health`, `/metrics`
/// or `/version`): lists `served`, answers both completion APIs without `usage`, and records
/// each request as (method, path, body).
async fn third_party(served: &'static str) -> (String, Arc<std::sync::Mutex<Vec<(String, String, String)>>>, tokio::task::JoinHandle<()>) {
    use axum::http::StatusCode;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let log = Arc::clone(&log);
        async move {
            let method = request.method().to_string();
            let path = request.uri().path().to_string();
            let body = axum::body::to_bytes(request.into_body(), 1 << 20).await.unwrap_or_default();
            log.lock().unwrap().push((method, path.clone(), String::from_utf8_lossy(&body).into_owned()));
            match path.as_str() {
                "/v1/models" => (StatusCode::OK, format!(r#"{{"object":"list","data":[{{"id":"{served}"}}]}}"#)),
                "/v1/completions" => (StatusCode::OK, r#"{"choices":[{"text":"plain words"}]}"#.to_string()),
                "/v1/chat/completions" => {
                    (StatusCode::OK, r#"{"choices":[{"message":{"role":"assistant","content":"chat words"}}]}"#.to_string())
                }
                _ => (StatusCode::NOT_FOUND, r#"{"detail":"Not Found"}"#.to_string()),
            }
        }
    });
    let (root, task) = serve_on_loopback(app).await;
    let base = format!("{root}/v1");
    (base, seen, task)
}

#[tokio::test]
async fn the_openai_engine_keeps_a_third_party_servers_contract() {
    let (base, seen, task) = third_party("served-name").await;
    // The mapped model must be served: a clear, non-retryable error at load.
    let wrong = OpenAiEngine::new(&base, MODEL, options()).unwrap();
    let err = wrong.load().await.unwrap_err();
    assert!(
        matches!(&err, EngineError::Misconfigured(m) if m.contains("is not served") && m.contains("served-name")) && !err.retryable(),
        "{err:?}"
    );
    for (api, path, text) in [(ApiFlavor::Chat, "/v1/chat/completions", "chat words"), (ApiFlavor::Completions, "/v1/completions", "plain words")] {
        seen.lock().unwrap().clear();
        let e = OpenAiEngine::new(&base, "served-name", HttpOptions { api, ..options() }).unwrap();
        e.load().await.unwrap();
        let mut req = request(1, "hi there", Some("emulated text"), false);
        req.model = "served-name".into();
        let c = e.submit(req).await.unwrap();
        // No usage in the answer: the request's prompt count and our count of the text.
        assert_eq!((c.text.as_str(), c.prompt_tokens as usize, c.output_tokens as usize), (text, tokens::count_chat("hi there"), tokens::count(text)));
        let calls = seen.lock().unwrap().clone();
        let posted: Vec<&(String, String, String)> = calls.iter().filter(|(m, _, _)| m == "POST").collect();
        assert_eq!(posted.len(), 1, "{calls:?}");
        assert_eq!(posted[0].1, path, "api: {api:?} honoured");
        let body: serde_json::Value = serde_json::from_str(&posted[0].2).unwrap();
        assert!(body.get("switchyard").is_none(), "emulated output sent to a third-party server: {body}");
        // No /metrics here: asked once, then never again.
        for _ in 0..3 {
            assert!(matches!(e.telemetry().await, Err(EngineError::Unsupported(_))));
        }
        let scrapes = seen.lock().unwrap().iter().filter(|(_, p, _)| p == "/metrics").count();
        assert_eq!(scrapes, 1, "a missing /metrics is not polled forever");
        assert!(e.fixed());
    }
    task.abort();
}

#[tokio::test]
async fn emulated_streams_arrive_token_by_token_at_the_engines_pace() {
    // At 20x an A100-80GB decodes Qwen3-0.6B in well under a millisecond of wall time per
    // token: a 200-token answer arrives in many chunks spread over time, not at the end.
    let mut cfg = EmulateConfig::new(DEVICE, MODEL);
    cfg.speed = 20.0;
    cfg.max_model_len = Some(8192);
    let server = EmulateServer::start(cfg, SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
    let e = http_engine(&server, ApiFlavor::Chat).await;
    let out = "Step by step, the answer is forty-two. ".repeat(20);
    let client = reqwest::Client::new();
    let mut body = e.request_body(&request(7, "What is six times seven?", Some(&out), true));
    body["max_tokens"] = serde_json::json!(1024);
    let response = client.post(format!("{}/chat/completions", e.api_base())).json(&body).send().await.unwrap();
    assert!(response.status().is_success());
    let mut chunks = Vec::new();
    let mut stream = response.bytes_stream();
    let started = std::time::Instant::now();
    let mut buf = String::new();
    while let Some(bytes) = futures::StreamExt::next(&mut stream).await {
        buf.push_str(&String::from_utf8_lossy(&bytes.unwrap()));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            if let Some(data) = event.trim().strip_prefix("data: ")
                && data != "[DONE]"
            {
                let v: serde_json::Value = serde_json::from_str(data).unwrap();
                if let Some(text) = v["choices"][0]["delta"]["content"].as_str() {
                    chunks.push((started.elapsed(), text.to_string()));
                }
            }
        }
    }
    let text: String = chunks.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(text, out);
    assert!(chunks.len() > tokens::count(&out) / 2, "{} chunks for {} tokens", chunks.len(), tokens::count(&out));
    let (first, last) = (chunks[0].0, chunks[chunks.len() - 1].0);
    assert!(last > first, "the tokens are spread over the generation, not sent at its end");
    server.shutdown().await.unwrap();
}
