//! The `switchyard emulate` server in-process, over real loopback sockets with a plain HTTP
//! client: vLLM's API surface (completions streaming and not, usage with cached tokens,
//! models, health before and after the load, metrics names, types and movement, sleep mode,
//! errors and fault injection), and what vLLM clients rely on: aborts on disconnect, answers
//! without `max_tokens`, `n` and prompt lists, stop strings, parameter validation, JSON 404 and
//! 405, tokenize / detokenize, partial wakes and sleeps with requests in flight, tool calling
//! as vLLM's hermes parser answers it (auto, named, required, none, streamed, refusals). Speeds of 100x and more keep every test well under a second or two.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_emulator::load_time;
use switchyard_predictor::spec::{self, Dtype};
use switchyard_runtime::live::engines::metrics::{self, MetricsSnapshot};
use switchyard_runtime::live::server::{EmulateConfig, EmulateServer};
use switchyard_runtime::tokens;

const DEVICE: &str = "A100-80GB";
const MODEL: &str = "Qwen3-0.6B";

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

async fn start(config: EmulateConfig) -> EmulateServer {
    EmulateServer::start(config, loopback()).await.unwrap()
}

/// Polls /health every `every` until 200, `tries` times at most.
async fn wait_healthy_polling(c: &reqwest::Client, base: &str, every: Duration, tries: u32) {
    for _ in 0..tries {
        if let Ok(r) = c.get(format!("{base}/health")).send().await
            && r.status() == 200
        {
            return;
        }
        tokio::time::sleep(every).await;
    }
    panic!("{base} never became healthy");
}

/// Polls /health until 200 (bounded).
async fn wait_healthy(c: &reqwest::Client, base: &str) {
    wait_healthy_polling(c, base, Duration::from_millis(5), 400).await;
}

/// Starts a server on `cfg` and waits until it is healthy; returns it and its base URL.
async fn start_healthy(cfg: EmulateConfig, c: &reqwest::Client) -> (EmulateServer, String) {
    let s = start(cfg).await;
    let base = s.base_url();
    wait_healthy(c, &base).await;
    (s, base)
}

/// The tests' configuration: [`MODEL`] on [`DEVICE`] at `speed`, with an 8192-token context.
fn config_at(speed: f64) -> EmulateConfig {
    let mut cfg = EmulateConfig::new(DEVICE, MODEL);
    cfg.speed = speed;
    cfg.max_model_len = Some(8192);
    cfg
}

async fn fast_server() -> (EmulateServer, reqwest::Client, String) {
    server_at(2000.0).await
}

async fn server_at(speed: f64) -> (EmulateServer, reqwest::Client, String) {
    let c = client();
    let (s, base) = start_healthy(config_at(speed), &c).await;
    (s, c, base)
}

/// The status of a request (the lifecycle endpoints, `/health`, `/ping`: no body to read).
async fn send_status(req: reqwest::RequestBuilder) -> u16 {
    req.send().await.unwrap().status().as_u16()
}

/// The JSON body of a GET.
async fn get_json(c: &reqwest::Client, url: String) -> Value {
    c.get(url).send().await.unwrap().json().await.unwrap()
}

/// `/is_sleeping`'s answer.
async fn is_sleeping(c: &reqwest::Client, base: &str) -> bool {
    let v = get_json(c, format!("{base}/is_sleeping")).await;
    v["is_sleeping"].as_bool().expect("is_sleeping is a bool")
}

/// A prompt of several hundred BPE tokens (many full 16-token blocks).
fn long_prompt() -> String {
    "Question: a farmer has 17 sheep and buys 5 more each week for 9 weeks. How many? ".repeat(20)
}

async fn post(c: &reqwest::Client, url: String, body: Value) -> (u16, String) {
    let r = c.post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

/// The `data:` payloads of an SSE body.
fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.trim_start().to_string())
        .collect()
}

#[tokio::test]
async fn health_is_503_until_the_model_has_loaded() {
    let device = spec::device(DEVICE).unwrap();
    let model = spec::model("Qwen3-8B").unwrap();
    let load = load_time(&device, &model, Dtype::Fp16);
    let mut cfg = EmulateConfig::new(DEVICE, "Qwen3-8B");
    // The load takes 0.4 s of wall time.
    cfg.speed = load / 0.4;
    let started = std::time::Instant::now();
    let s = start(cfg).await;
    let c = client();
    let base = s.base_url();
    assert_eq!(send_status(c.get(format!("{base}/health"))).await, 503, "healthy before the load finished");
    // Completions are refused while loading, models are listed.
    let (status, _) = post(
        &c,
        format!("{base}/v1/completions"),
        json!({"prompt": "hi"}),
    )
    .await;
    assert_eq!(status, 503);
    let models = get_json(&c, format!("{base}/v1/models")).await;
    assert_eq!(models["data"][0]["id"], "Qwen3-8B");
    wait_healthy(&c, &base).await;
    let waited = started.elapsed().as_secs_f64();
    assert!(
        waited >= 0.35,
        "healthy after only {waited:.3} s of a 0.4 s load"
    );
    s.shutdown().await.unwrap();
}

/// `created` is the time of each answer (and model listing), as vLLM stamps it, not the
/// server's start.
#[tokio::test]
async fn created_is_the_time_of_the_answer() {
    let (s, c, base) = fast_server().await;
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let before = now();
    let body = json!({"model": MODEL, "prompt": "hi", "max_tokens": 2});
    let (status, text) = post(&c, format!("{base}/v1/completions"), body).await;
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    let created = answer["created"].as_u64().unwrap_or(0);
    assert!((before..=now()).contains(&created), "created {created}, asked at {before}");
    let models = get_json(&c, format!("{base}/v1/models")).await;
    assert!(models["data"][0]["created"].as_u64() >= Some(before), "{models}");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn completions_report_usage_and_cached_tokens_on_a_repeated_prompt() {
    let (s, c, base) = fast_server().await;
    let prompt = long_prompt();
    let prompt_tokens = tokens::count(&prompt) as u64;
    let output = "The farmer has 62 sheep. #### 62";
    let body = json!({
        "model": MODEL, "prompt": prompt, "max_tokens": 64,
        "switchyard": {"output": output},
    });
    let (status, text) = post(&c, format!("{base}/v1/completions"), body.clone()).await;
    assert_eq!(status, 200, "{text}");
    let first: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(first["object"], "text_completion");
    assert_eq!(first["choices"][0]["text"], output);
    assert_eq!(first["choices"][0]["finish_reason"], "stop");
    let usage = &first["usage"];
    assert_eq!(usage["prompt_tokens"], prompt_tokens);
    assert_eq!(usage["completion_tokens"], tokens::count(output) as u64);
    assert_eq!(
        usage["total_tokens"],
        prompt_tokens + tokens::count(output) as u64
    );
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);

    let (_, text) = post(&c, format!("{base}/v1/completions"), body).await;
    let second: Value = serde_json::from_str(&text).unwrap();
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // Every full block but the one holding the last prompt token is a hit (vLLM recomputes
    // at least one token).
    assert_eq!(cached, (prompt_tokens - 1) / 16 * 16);
    assert!(cached > prompt_tokens / 2);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn output_is_capped_by_max_tokens_and_filler_fills_max_tokens() {
    let (s, c, base) = fast_server().await;
    let (_, text) = post(
        &c,
        format!("{base}/v1/completions"),
        json!({"prompt": "Tell me a story.", "max_tokens": 3,
               "switchyard": {"output": "one two three four five six seven"}}),
    )
    .await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert!(
        "one two three four five six seven".starts_with(v["choices"][0]["text"].as_str().unwrap())
    );
    let (_, text) = post(
        &c,
        format!("{base}/v1/completions"),
        json!({"prompt": "Tell me a story.", "max_tokens": 40}),
    )
    .await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 40);
    assert!(!v["choices"][0]["text"].as_str().unwrap().is_empty());
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn streamed_completions_and_chat_end_with_usage_and_done() {
    let (s, c, base) = fast_server().await;
    let output = "def add(a, b):\n    return a + b\n";
    let (status, body) = post(
        &c,
        format!("{base}/v1/completions"),
        json!({"model": MODEL, "prompt": long_prompt(), "max_tokens": 100, "stream": true,
               "stream_options": {"include_usage": true}, "switchyard": {"output": output}}),
    )
    .await;
    assert_eq!(status, 200);
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(chunks.len() >= 3, "first token, rest, usage: {chunks:?}");
    // As vLLM's: the finish reason rides on the chunk of the last token, not on an empty one.
    let finishing: Vec<&Value> = chunks.iter().filter(|c| c["choices"].get(0).is_some_and(|ch| !ch["finish_reason"].is_null())).collect();
    assert_eq!(finishing.len(), 1, "{chunks:?}");
    assert!(finishing[0]["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()), "{chunks:?}");
    let text: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"]
                .get(0)
                .and_then(|ch| ch["text"].as_str())
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, output);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], tokens::count(output) as u64);
    assert!(
        chunks.last().unwrap()["choices"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // Chat, streamed: role in the first delta, content concatenates to the output.
    let (_, body) = post(
        &c,
        format!("{base}/v1/chat/completions"),
        json!({"model": MODEL, "messages": [{"role": "user", "content": "add two numbers"}],
               "max_tokens": 100, "stream": true, "stream_options": {"include_usage": true},
               "switchyard": {"output": output}}),
    )
    .await;
    let data = sse_data(&body);
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    // As vLLM: a chunk of the role alone first, then content chunks without it.
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    assert!(chunks[1..].iter().all(|c| c["choices"][0]["delta"].get("role").is_none()), "{chunks:?}");
    let text: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"]
                .get(0)
                .and_then(|ch| ch["delta"]["content"].as_str())
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, output);
    // Without include_usage: no usage chunk.
    let (_, body) = post(
        &c,
        format!("{base}/v1/completions"),
        json!({"prompt": "hello there", "max_tokens": 5, "stream": true}),
    )
    .await;
    assert!(sse_data(&body).iter().all(|d| !d.contains("\"usage\"")));

    // Chat, not streamed.
    let (_, body) = post(
        &c,
        format!("{base}/v1/chat/completions"),
        json!({"messages": [{"role": "system", "content": "be brief"},
                            {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
               "max_tokens": 20, "switchyard": {"output": "Hello!"}}),
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "Hello!");
    let rendered = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(v["usage"]["prompt_tokens"], tokens::count(rendered) as u64);
    s.shutdown().await.unwrap();
}

async fn scrape(c: &reqwest::Client, base: &str) -> MetricsSnapshot {
    let r = c.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    MetricsSnapshot::parse(&r.text().await.unwrap()).unwrap()
}

#[tokio::test]
async fn metrics_carry_vllm_names_and_move_with_load() {
    // Slow enough (50x) that eight 1500-token generations stay in flight for a while.
    let (s, c, base) = server_at(50.0).await;
    let before = scrape(&c, &base).await;
    for name in [metrics::RUNNING, metrics::WAITING, metrics::KV_CACHE_USAGE] {
        assert_eq!(before.sum(name), Some(0.0), "{name}");
    }
    assert_eq!(before.counter(metrics::PREFIX_CACHE_QUERIES), Some(0.0));
    assert_eq!(before.counter(metrics::PREFIX_CACHE_HITS), Some(0.0));
    assert_eq!(
        before
            .histogram(metrics::TIME_TO_FIRST_TOKEN)
            .map(|h| h.count),
        Some(0.0)
    );
    let labels = &before
        .samples_named(metrics::RUNNING)
        .next()
        .unwrap()
        .labels;
    assert_eq!(labels["model_name"], MODEL);
    assert_eq!(labels["engine"], "0");

    // Eight concurrent long generations: the gauges see them mid-flight.
    let mut handles = Vec::new();
    for i in 0..8 {
        let c = c.clone();
        let url = format!("{base}/v1/completions");
        let prompt = format!("{i} {}", long_prompt());
        handles.push(tokio::spawn(async move {
            post(&c, url, json!({"prompt": prompt, "max_tokens": 1500})).await
        }));
    }
    let mut saw_running = false;
    let mut saw_kv = false;
    for _ in 0..200 {
        let m = scrape(&c, &base).await;
        saw_running |=
            m.sum(metrics::RUNNING).unwrap_or(0.0) + m.sum(metrics::WAITING).unwrap_or(0.0) > 0.0;
        saw_kv |= m.sum(metrics::KV_CACHE_USAGE).unwrap_or(0.0) > 0.0;
        if saw_running && saw_kv {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for h in handles {
        assert_eq!(h.await.unwrap().0, 200);
    }
    assert!(saw_running, "num_requests_running/waiting never moved");
    assert!(saw_kv, "kv_cache_usage_perc never moved");
    let after = scrape(&c, &base).await;
    assert_eq!(after.sum(metrics::RUNNING), Some(0.0));
    assert!(after.counter(metrics::PREFIX_CACHE_QUERIES).unwrap() > 0.0);
    let ttft = after.histogram(metrics::TIME_TO_FIRST_TOKEN).unwrap();
    assert_eq!(ttft.count, 8.0);
    assert!(ttft.sum > 0.0);
    assert_eq!(after.counter("vllm:generation_tokens"), Some(8.0 * 1500.0));
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn sleep_wake_and_is_sleeping() {
    let (s, c, base) = fast_server().await;
    assert!(!is_sleeping(&c, &base).await);
    // Warm the prefix cache, sleep (level 1 discards it), wake.
    let body = json!({"prompt": long_prompt(), "max_tokens": 4});
    post(&c, format!("{base}/v1/completions"), body.clone()).await;
    assert_eq!(send_status(c.post(format!("{base}/sleep?level=1"))).await, 200);
    assert!(is_sleeping(&c, &base).await);
    // Weight-dependent endpoints answer 503 while asleep; health stays 200.
    let (status, _) = post(&c, format!("{base}/v1/completions"), body.clone()).await;
    assert_eq!(status, 503);
    assert_eq!(send_status(c.get(format!("{base}/health"))).await, 200);
    // Sleeping again is a no-op.
    assert_eq!(send_status(c.post(format!("{base}/sleep?level=1"))).await, 200);
    assert_eq!(send_status(c.post(format!("{base}/wake_up"))).await, 200);
    assert!(!is_sleeping(&c, &base).await);
    let (status, text) = post(&c, format!("{base}/v1/completions"), body.clone()).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "sleep must drop the prefix cache"
    );
    // Level 2 and vLLM's three-step wake.
    assert_eq!(send_status(c.post(format!("{base}/sleep?level=2"))).await, 200);
    assert!(is_sleeping(&c, &base).await);
    assert_eq!(send_status(c.post(format!("{base}/wake_up?tags=weights"))).await, 200);
    let (status, _) = post(
        &c,
        format!("{base}/collective_rpc"),
        json!({"method": "reload_weights"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(send_status(c.post(format!("{base}/wake_up?tags=kv_cache"))).await, 200);
    assert!(!is_sleeping(&c, &base).await);
    // Bad levels are refused.
    assert_eq!(send_status(c.post(format!("{base}/sleep?level=3"))).await, 400);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_requests_get_vllm_like_errors() {
    let (s, c, base) = fast_server().await;
    let url = format!("{base}/v1/completions");
    let (status, body) = post(&c, url.clone(), json!({"model": "gpt-9", "prompt": "x"})).await;
    assert_eq!(status, 404);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("gpt-9"));
    let (status, _) = post(&c, url.clone(), json!({"prompt": ""})).await;
    assert_eq!(status, 400);
    let (status, body) = post(&c, url.clone(), json!({"prompt": "x", "max_tokens": 9000})).await;
    assert_eq!(status, 400, "prompt + output beyond max_model_len");
    assert!(body.contains("maximum context length"));
    // A prompt of megabytes is a context error too, as vLLM answers it (axum's default 2 MiB
    // body limit answered 413 in plain text).
    let (status, body) = post(&c, url.clone(), json!({"prompt": "word ".repeat(500_000)})).await;
    assert_eq!(status, 400, "{}", &body[..body.len().min(300)]);
    assert!(body.contains("maximum context length"), "{}", &body[..body.len().min(300)]);
    let bad_json = c.post(url.clone()).header("content-type", "application/json").body("{nope");
    assert_eq!(send_status(bad_json).await, 400);
    let (status, body) = post(&c, url, json!({"prompt": []})).await;
    assert_eq!(status, 400, "{body}");
    s.shutdown().await.unwrap();
}

/// A 2000x server's configuration (no context limit set) that fails `fail_rate` and garbles
/// `garbage_rate` of its answers.
fn faulty(fail_rate: f64, garbage_rate: f64) -> EmulateConfig {
    let mut cfg = EmulateConfig::new(DEVICE, MODEL);
    cfg.speed = 2000.0;
    cfg.fail_rate = fail_rate;
    cfg.garbage_rate = garbage_rate;
    cfg
}

#[tokio::test]
async fn fault_injection_fails_or_garbles_answers() {
    let c = client();
    let (s, base) = start_healthy(faulty(1.0, 0.0), &c).await;
    let (status, _) = post(&c, format!("{base}/v1/completions"), json!({"prompt": "hi"})).await;
    assert_eq!(status, 500);
    s.shutdown().await.unwrap();

    let (s, base) = start_healthy(faulty(0.0, 1.0), &c).await;
    let (status, body) = post(&c, format!("{base}/v1/completions"), json!({"prompt": "hi"})).await;
    assert_eq!(status, 200);
    assert!(
        serde_json::from_str::<Value>(&body).is_err(),
        "garbage parsed: {body}"
    );
    let (_, body) = post(
        &c,
        format!("{base}/v1/completions"),
        json!({"prompt": "hi", "stream": true}),
    )
    .await;
    assert!(
        sse_data(&body)
            .iter()
            .any(|d| d != "[DONE]" && serde_json::from_str::<Value>(d).is_err())
    );
    s.shutdown().await.unwrap();

    // A partial rate is seeded: two servers with the same seed fail the same requests.
    let mut outcomes = Vec::new();
    for _ in 0..2 {
        let mut cfg = faulty(0.5, 0.0);
        cfg.fault_seed = 11;
        let (s, base) = start_healthy(cfg, &c).await;
        let mut statuses = Vec::new();
        for _ in 0..24 {
            statuses.push(
                post(
                    &c,
                    format!("{base}/v1/completions"),
                    json!({"prompt": "hi", "max_tokens": 2}),
                )
                .await
                .0,
            );
        }
        s.shutdown().await.unwrap();
        outcomes.push(statuses);
    }
    assert_eq!(outcomes[0], outcomes[1]);
    let fails = outcomes[0].iter().filter(|s| **s == 500).count();
    assert!(
        (4..=20).contains(&fails),
        "{fails} of 24 failed at rate 0.5"
    );
}

#[tokio::test]
async fn virtual_time_runs_at_the_requested_speed() {
    // A 1500-token generation of Qwen3-0.6B takes seconds of emulated time; at 200x it must
    // take about 1/200 of that in wall time, and its virtual latency shows in the histogram.
    let mut cfg = EmulateConfig::new(DEVICE, MODEL);
    cfg.speed = 200.0;
    let c = client();
    let (s, base) = start_healthy(cfg, &c).await;
    let t = std::time::Instant::now();
    let (status, _) = post(
        &c,
        format!("{base}/v1/completions"),
        json!({"prompt": "Count to a thousand.", "max_tokens": 1500}),
    )
    .await;
    let wall = t.elapsed().as_secs_f64();
    assert_eq!(status, 200);
    let m = scrape(&c, &base).await;
    let e2e = m.histogram("vllm:e2e_request_latency_seconds").unwrap();
    assert_eq!(e2e.count, 1.0);
    let virtual_s = e2e.sum;
    assert!(virtual_s > 1.0, "emulated latency {virtual_s} s");
    let ratio = virtual_s / wall;
    assert!(
        ratio > 100.0 && ratio < 260.0,
        "virtual {virtual_s:.3} s over wall {wall:.3} s = {ratio:.0}x"
    );
    s.shutdown().await.unwrap();
}

/// Polls `/metrics` until `ok` holds (bounded), returning the last snapshot.
async fn scrape_until(
    c: &reqwest::Client,
    base: &str,
    ok: impl Fn(&MetricsSnapshot) -> bool,
) -> MetricsSnapshot {
    let mut last = scrape(c, base).await;
    for _ in 0..400 {
        if ok(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        last = scrape(c, base).await;
    }
    last
}

fn running_and_kv(m: &MetricsSnapshot) -> (f64, f64) {
    (
        m.sum(metrics::RUNNING).unwrap_or(-1.0),
        m.sum(metrics::KV_CACHE_USAGE).unwrap_or(-1.0),
    )
}

#[tokio::test]
async fn a_client_that_disconnects_aborts_its_request_streaming_or_not() {
    // 10x: a 6000-token answer (23.5 emulated seconds) runs for over 2 s of wall time if
    // nobody aborts it.
    let (s, c, base) = slow_server(10.0).await;
    let body = json!({"prompt": long_prompt(), "max_tokens": 6000, "stream": true});
    let mut r = c.post(format!("{base}/v1/completions")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // The first token arrived: the request runs and holds KV blocks.
    let first = r.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("data:"));
    let busy = scrape(&c, &base).await;
    let (running, kv) = running_and_kv(&busy);
    assert_eq!(running, 1.0);
    assert!(kv > 0.0);
    drop(r);
    let after = scrape_until(&c, &base, |m| running_and_kv(m) == (0.0, 0.0)).await;
    assert_eq!(running_and_kv(&after), (0.0, 0.0), "the stream's request was not aborted");
    // It generates no more tokens, and never finished.
    let generated = after.counter("vllm:generation_tokens").unwrap();
    assert!(generated < 6000.0, "{generated}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(scrape(&c, &base).await.counter("vllm:generation_tokens"), Some(generated));

    // Non-streaming: the client gives up after 300 ms.
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let body = json!({"prompt": long_prompt(), "max_tokens": 6000});
    let err = impatient.post(format!("{base}/v1/completions")).json(&body).send().await;
    assert!(err.is_err(), "the answer cannot be ready in 300 ms");
    let after = scrape_until(&c, &base, |m| running_and_kv(m) == (0.0, 0.0)).await;
    assert_eq!(running_and_kv(&after), (0.0, 0.0), "the timed-out request was not aborted");
    let total = after.counter("vllm:generation_tokens").unwrap();
    assert!(total < generated + 6000.0, "{total}");
    let finished: f64 = after.samples_named("vllm:request_success_total").map(|s| s.value).sum();
    assert_eq!(finished, 0.0, "neither request finished");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_max_tokens_a_chat_answer_ends_by_itself() {
    let (s, c, base) = fast_server().await;
    let url = format!("{base}/v1/chat/completions");
    let messages = json!([{"role": "user", "content": "Say something."}]);
    let (status, text) = post(&c, url.clone(), json!({"messages": messages})).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 256, "the filler's own length");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let (_, text) = post(
        &c,
        url,
        json!({"messages": messages, "switchyard": {"output": "Fine, thanks."}}),
    )
    .await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "Fine, thanks.");
    assert_eq!(v["usage"]["completion_tokens"], tokens::count("Fine, thanks.") as u64);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // /v1/completions keeps vLLM's default of 16.
    let (_, text) = post(&c, format!("{base}/v1/completions"), json!({"prompt": "Go on"})).await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 16);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn n_and_prompt_lists_give_one_choice_each() {
    let (s, c, base) = fast_server().await;
    let url = format!("{base}/v1/completions");
    let out = "The answer is 42.";
    let (status, text) = post(
        &c,
        url.clone(),
        json!({"prompt": ["first prompt", "the second prompt"], "n": 2, "max_tokens": 50,
               "switchyard": {"output": out}}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, ch) in choices.iter().enumerate() {
        assert_eq!(ch["index"], i as u64);
        assert_eq!(ch["text"], out);
    }
    let prompts = tokens::count("first prompt") + tokens::count("the second prompt");
    assert_eq!(v["usage"]["prompt_tokens"], prompts as u64, "prompt tokens once per prompt");
    assert_eq!(v["usage"]["completion_tokens"], 4 * tokens::count(out) as u64);
    // Token-id prompts, and a stream of n = 2: both indices end, one [DONE].
    let (status, text) = post(
        &c,
        url,
        json!({"prompt": [[9707, 11, 1879]], "n": 2, "max_tokens": 50, "stream": true,
               "stream_options": {"include_usage": true}, "switchyard": {"output": out}}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1);
    let mut texts = [String::new(), String::new()];
    let mut finished = [false, false];
    for d in &data[..data.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap();
        for ch in v["choices"].as_array().unwrap() {
            let i = ch["index"].as_u64().unwrap() as usize;
            texts[i].push_str(ch["text"].as_str().unwrap());
            finished[i] |= ch["finish_reason"] == "stop";
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            assert_eq!(u["prompt_tokens"], 3);
            assert_eq!(u["completion_tokens"], 2 * tokens::count(out) as u64);
        }
    }
    assert_eq!(texts, [out.to_string(), out.to_string()]);
    assert_eq!(finished, [true, true]);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn stop_strings_cut_the_text_and_echo_prepends_the_prompt() {
    let (s, c, base) = fast_server().await;
    let url = format!("{base}/v1/completions");
    let out = "The answer is 42. Then it goes on and on.";
    let body = json!({"prompt": "Q:", "max_tokens": 100, "stop": [". ", "never"],
                      "switchyard": {"output": out}});
    let (status, text) = post(&c, url.clone(), body.clone()).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["text"], "The answer is 42");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["stop_reason"], ". ");
    let used = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(used < tokens::count(out) as u64, "generation stopped at the stop string");
    // Streamed, the same text arrives.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, text) = post(&c, url.clone(), streamed).await;
    let mut joined = String::new();
    for d in sse_data(&text).iter().filter(|d| *d != "[DONE]") {
        let v: Value = serde_json::from_str(d).unwrap();
        joined.push_str(v["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(joined, "The answer is 42");
    // Chat honours stop too; echo prepends the prompt.
    let (_, text) = post(
        &c,
        format!("{base}/v1/chat/completions"),
        json!({"messages": [{"role": "user", "content": "hi"}], "stop": "42",
               "switchyard": {"output": out}}),
    )
    .await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "The answer is ");
    let (_, text) = post(
        &c,
        url,
        json!({"prompt": "Q: why?", "echo": true, "max_tokens": 10, "switchyard": {"output": " Because."}}),
    )
    .await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["text"], "Q: why? Because.");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn invalid_parameters_get_400_naming_the_param() {
    let (s, c, base) = fast_server().await;
    let completions = format!("{base}/v1/completions");
    let chat = format!("{base}/v1/chat/completions");
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (&completions, json!({"prompt": "x", "n": 0}), "n"),
        (&completions, json!({"prompt": "x", "temperature": -1}), "temperature"),
        (&completions, json!({"prompt": "x", "max_tokens": 0}), "max_tokens"),
        (&completions, json!({"prompt": "x", "top_p": 0}), "top_p"),
        (&completions, json!({"prompt": "x", "top_p": 1.5}), "top_p"),
        (&completions, json!({"prompt": "x", "top_k": -5}), "top_k"),
        (&completions, json!({"prompt": "x", "presence_penalty": 9}), "presence_penalty"),
        (&completions, json!({"prompt": "x", "min_tokens": 20, "max_tokens": 5}), "min_tokens"),
        // Against the default limit too (16 for completions, what the context leaves for chat).
        (&completions, json!({"prompt": "x", "min_tokens": 100}), "min_tokens"),
        (&chat, json!({"messages": msgs, "min_tokens": 1_000_000}), "min_tokens"),
        // A token id outside the vocabulary, as vLLM's input processor refuses it.
        (&completions, json!({"prompt": [4_294_967_295u64]}), "prompt"),
        (&completions, json!({"prompt": "x", "logprobs": 2}), "logprobs"),
        (&completions, json!({"prompt": "x", "suffix": "y"}), "suffix"),
        (&completions, json!({"prompt": "x", "stream_options": {"include_usage": true}}), "stream_options"),
        (&completions, json!({"prompt": "x", "max_tokens": 9000}), "max_tokens"),
        (&chat, json!({"messages": msgs, "n": 0}), "n"),
        // The emulator's bound on samples per request (prompts × n), before anything is allocated.
        (&chat, json!({"messages": msgs, "n": 4_000_000_000u64, "max_tokens": 1}), "n"),
        (&completions, json!({"prompt": ["a", "b"], "n": 2049, "max_tokens": 1}), "n"),
        (&chat, json!({"messages": msgs, "logprobs": true}), "logprobs"),
        (&chat, json!({"messages": msgs, "top_logprobs": 3}), "top_logprobs"),
        (&chat, json!({"messages": msgs, "max_completion_tokens": 0}), "max_tokens"),
    ];
    for (url, body, param) in cases {
        let (status, text) = post(&c, url.clone(), body.clone()).await;
        assert_eq!(status, 400, "{body}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], param, "{body}: {text}");
        assert_eq!(v["error"]["code"], 400, "the code is the integer status");
        assert_eq!(v["error"]["type"], "BadRequestError");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    // Valid edge values pass.
    let (status, text) =
        post(&c, completions, json!({"prompt": "x", "temperature": 0, "top_p": 1, "top_k": -1, "max_tokens": 1})).await;
    assert_eq!(status, 200, "{text}");
    let (status, text) = post(&c, format!("{base}/v1/completions"), json!({"model": "gpt-9", "prompt": "x"})).await;
    assert_eq!(status, 404);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["code"], 404);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn unknown_paths_and_methods_answer_json_and_ping_answers() {
    let (s, c, base) = fast_server().await;
    let r = c.get(format!("{base}/no/such/path")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v, json!({"detail": "Not Found"}));
    let r = c.get(format!("{base}/v1/completions")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v, json!({"detail": "Method Not Allowed"}));
    assert_eq!(send_status(c.get(format!("{base}/ping"))).await, 200);
    assert_eq!(send_status(c.post(format!("{base}/ping"))).await, 200);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn tokenize_and_detokenize_round_trip() {
    let (s, c, base) = fast_server().await;
    let text = "naïve café — 東京 🚀 done";
    let (status, body) = post(&c, format!("{base}/tokenize"), json!({"prompt": text, "return_token_strs": true})).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let ids: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    assert_eq!(ids, tokens::encode(text).to_vec());
    assert_eq!(v["count"], ids.len() as u64);
    assert_eq!(v["max_model_len"], 8192);
    assert_eq!(v["token_strs"].as_array().map(Vec::len), Some(ids.len()));
    let (status, body) = post(&c, format!("{base}/detokenize"), json!({"tokens": ids})).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["prompt"], text);
    // Chat messages are counted as a chat completion counts them.
    let (_, body) = post(
        &c,
        format!("{base}/tokenize"),
        json!({"messages": [{"role": "user", "content": "hi"}],
               "chat_template_kwargs": {"enable_thinking": false}}),
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["count"], tokens::count_chat("hi") as u64);
    let (status, body) = post(&c, format!("{base}/detokenize"), json!({"tokens": [-1]})).await;
    assert_eq!(status, 400, "{body}");
    s.shutdown().await.unwrap();
}

/// `# TYPE` lines of a Prometheus text body: name → type.
fn metric_types(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

#[tokio::test]
async fn metric_families_have_vllm_names_types_labels_and_buckets() {
    let (s, c, base) = fast_server().await;
    let (status, _) = post(
        &c,
        format!("{base}/v1/completions"),
        json!({"prompt": long_prompt(), "max_tokens": 30}),
    )
    .await;
    assert_eq!(status, 200);
    let text = c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let types = metric_types(&text);
    let expected = [
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:cache_config_info", "gauge"),
        ("vllm:prefix_cache_queries", "counter"),
        ("vllm:prefix_cache_hits", "counter"),
        ("vllm:num_preemptions", "counter"),
        ("vllm:prompt_tokens", "counter"),
        ("vllm:generation_tokens", "counter"),
        ("vllm:request_success", "counter"),
        ("vllm:time_to_first_token_seconds", "histogram"),
        ("vllm:time_per_output_token_seconds", "histogram"),
        ("vllm:inter_token_latency_seconds", "histogram"),
        ("vllm:request_time_per_output_token_seconds", "histogram"),
        ("vllm:e2e_request_latency_seconds", "histogram"),
        ("vllm:request_queue_time_seconds", "histogram"),
        ("vllm:request_inference_time_seconds", "histogram"),
        ("vllm:request_prefill_time_seconds", "histogram"),
        ("vllm:request_decode_time_seconds", "histogram"),
        ("vllm:request_prompt_tokens", "histogram"),
        ("vllm:request_generation_tokens", "histogram"),
        ("vllm:request_max_num_generation_tokens", "histogram"),
        ("vllm:request_params_n", "histogram"),
        ("vllm:request_params_max_tokens", "histogram"),
        ("vllm:iteration_tokens_total", "histogram"),
    ];
    // A strict scraper (Prometheus, Python's `prometheus_client`) refuses the whole text when a
    // sample repeats a label name: `vllm:cache_config_info` carried `engine` twice.
    for line in text.lines().filter(|l| !l.starts_with('#') && l.contains('{')) {
        let labels = line.split_once('{').and_then(|(_, rest)| rest.rsplit_once('}')).map_or("", |(l, _)| l);
        let mut names: Vec<&str> = labels.split("\",").filter_map(|kv| kv.split_once('=').map(|(k, _)| k.trim_start_matches(','))).collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "a label name repeats: {line}");
    }
    // 0.10.2's deprecated aliases, still emitted there.
    for (name, kind) in [("vllm:gpu_cache_usage_perc", "gauge"), ("vllm:gpu_prefix_cache_queries", "counter"), ("vllm:gpu_prefix_cache_hits", "counter")] {
        let found = types.get(name).or_else(|| types.get(&format!("{name}_total")));
        assert_eq!(found.map(String::as_str), Some(kind), "{name}");
    }
    for (name, kind) in expected {
        // Counters' TYPE lines carry `_total` in the 0.0.4 text format (as Python's client writes them).
        let found = types.get(name).or_else(|| types.get(&format!("{name}_total")));
        assert_eq!(found.map(String::as_str), Some(kind), "{name}");
    }
    let m = MetricsSnapshot::parse(&text).unwrap();
    for name in ["vllm:prompt_tokens", "vllm:generation_tokens"] {
        assert!(m.counter(name).is_some_and(|v| v > 0.0), "{name}");
    }
    assert_eq!(m.counter("vllm:generation_tokens"), Some(30.0));
    let success: Vec<_> = m.samples_named("vllm:request_success_total").collect();
    assert_eq!(success.len(), 3, "stop, length, abort");
    let length = success
        .iter()
        .find(|s| s.labels.iter().any(|(k, v)| k == "finished_reason" && v == "length"))
        .unwrap();
    assert_eq!(length.value, 1.0);
    assert!(length.labels.iter().any(|(k, _)| k == "model_name"));
    assert!(length.labels.iter().any(|(k, v)| k == "engine" && v == "0"));
    for name in [
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_time_per_output_token_seconds",
    ] {
        assert_eq!(m.histogram(name).map(|h| h.count), Some(1.0), "{name}");
    }
    // 29 tokens after the first, each an inter-token latency.
    assert_eq!(m.histogram("vllm:inter_token_latency_seconds").map(|h| h.count), Some(29.0));
    let has = |name: &str, le: &str| {
        text.lines().any(|l| l.starts_with(&format!("{name}_bucket{{")) && l.contains(&format!("le=\"{le}")))
    };
    assert!(has("vllm:e2e_request_latency_seconds", "7680"), "vLLM's last latency bound");
    assert!(has("vllm:time_to_first_token_seconds", "2560"), "TTFT's last bound");
    assert!(has("vllm:inter_token_latency_seconds", "0.025"));
    let info: Vec<&str> = text.lines().filter(|l| l.starts_with("vllm:cache_config_info")).collect();
    assert!(info.len() == 1 && info[0].contains("block_size=\"16\""), "{info:?}");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_weights_only_wake_keeps_completions_at_503_until_the_kv_cache_wakes() {
    let (s, c, base) = fast_server().await;
    let body = json!({"prompt": "hello", "max_tokens": 4});
    let completions = format!("{base}/v1/completions");
    assert_eq!(send_status(c.post(format!("{base}/sleep?level=2"))).await, 200);
    assert_eq!(send_status(c.post(format!("{base}/wake_up?tags=weights"))).await, 200);
    assert!(is_sleeping(&c, &base).await, "kv_cache still sleeps");
    let (status, text) = post(&c, completions.clone(), body.clone()).await;
    assert_eq!(status, 503, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["code"], 503);
    // Waking a tag that is not asleep is a no-op.
    assert_eq!(send_status(c.post(format!("{base}/wake_up?tags=weights"))).await, 200);
    assert_eq!(post(&c, completions.clone(), body.clone()).await.0, 503);
    assert_eq!(send_status(c.post(format!("{base}/wake_up?tags=kv_cache"))).await, 200);
    assert!(!is_sleeping(&c, &base).await);
    assert_eq!(post(&c, completions, body).await.0, 200);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_sleep_aborts_the_requests_in_flight_or_waits_for_them() {
    let (s, c, base) = slow_server(10.0).await;
    let completions = format!("{base}/v1/completions");
    // mode=abort (the default): a long stream ends with finish_reason "abort".
    let body = json!({"prompt": long_prompt(), "max_tokens": 6000, "stream": true});
    let mut r = c.post(completions.clone()).json(&body).send().await.unwrap();
    let _ = r.chunk().await.unwrap();
    assert_eq!(send_status(c.post(format!("{base}/sleep?level=1"))).await, 200);
    let mut rest = String::new();
    while let Some(chunk) = r.chunk().await.unwrap() {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    let data = sse_data(&rest);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "abort");
    let m = scrape(&c, &base).await;
    assert_eq!(running_and_kv(&m), (0.0, 0.0));
    let aborted = m
        .samples_named("vllm:request_success_total")
        .find(|s| s.labels.iter().any(|(k, v)| k == "finished_reason" && v == "abort"))
        .map(|s| s.value);
    assert_eq!(aborted, Some(1.0));
    assert_eq!(send_status(c.post(format!("{base}/wake_up"))).await, 200);
    // mode=wait: the request in flight finishes first, with its own finish reason.
    let c2 = c.clone();
    let url = completions.clone();
    let pending = tokio::spawn(async move {
        post(&c2, url, json!({"prompt": "hello", "max_tokens": 2000})).await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(scrape(&c, &base).await.sum(metrics::RUNNING), Some(1.0), "in flight at the sleep");
    assert_eq!(send_status(c.post(format!("{base}/sleep?level=1&mode=wait"))).await, 200);
    let (status, text) = pending.await.unwrap();
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 2000);
    s.shutdown().await.unwrap();
}

/// A `/sleep?mode=wait` whose client goes away during the drain still sleeps once the drain
/// ends, as vLLM's engine call runs to its end whatever the connection does; its pause ends
/// with it (the pause once stayed on for good, every completion refused with 503 while
/// `/health` answered 200; then, dropped with the handler, the sleep was cancelled instead).
/// A `/wake_up` whose client goes away wakes the replica all the same (dropped with the
/// handler, it left the replica awake but reporting `is_sleeping` and refusing requests).
#[tokio::test]
async fn a_transition_whose_client_went_away_runs_to_its_end() {
    // Qwen3-8B at level 2: its wake re-reads 16 GB from the page cache, seconds of device time.
    let speed = 10.0;
    let mut cfg = config_at(speed);
    cfg.model = "Qwen3-8B".into();
    let wake_s = switchyard_emulator::wake_time(
        &spec::device(DEVICE).unwrap(),
        &spec::model("Qwen3-8B").unwrap(),
        Dtype::Fp16,
        switchyard_emulator::SleepLevel::DiscardWeights,
    ) / speed;
    assert!(wake_s > 0.3, "the wake must outlast the client's 100 ms: {wake_s} s");
    let s = start(cfg).await;
    let c = client();
    let base = s.base_url();
    wait_healthy_polling(&c, &base, Duration::from_millis(20), 1500).await;
    let completions = format!("{base}/v1/completions");
    let pending = one_running_request(&c, &base, 2000).await;
    // The client gives up on the sleep while the request above still runs.
    let gave_up = c.post(format!("{base}/sleep?level=2&mode=wait")).timeout(Duration::from_millis(200)).send().await;
    assert!(gave_up.is_err(), "the drain outlasted the client's timeout");
    let (status, text) = pending.await.unwrap();
    assert_eq!(status, 200, "the drained request completes: {text}");
    let asleep = std::time::Instant::now() + Duration::from_secs(20);
    while !is_sleeping(&c, &base).await {
        assert!(std::time::Instant::now() < asleep, "the abandoned sleep never happened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Asleep once its transition ends (a wake while it falls asleep is refused).
    let falling_s = switchyard_emulator::sleep_time(
        &spec::device(DEVICE).unwrap(),
        &spec::model("Qwen3-8B").unwrap(),
        Dtype::Fp16,
        switchyard_emulator::SleepLevel::DiscardWeights,
    ) / speed;
    tokio::time::sleep(Duration::from_secs_f64(falling_s + 0.3)).await;
    // The client gives up on the wake.
    let gave_up = c.post(format!("{base}/wake_up")).timeout(Duration::from_millis(100)).send().await;
    assert!(gave_up.is_err(), "the wake outlasted the client's timeout");
    let awake = std::time::Instant::now() + Duration::from_secs_f64(20.0 + 4.0 * wake_s);
    while is_sleeping(&c, &base).await {
        assert!(std::time::Instant::now() < awake, "the abandoned wake never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, text) = post(&c, completions.clone(), json!({"prompt": "again", "max_tokens": 4})).await;
    assert_eq!(status, 200, "served after the abandoned wake: {text}");

    // The last call wins: a wake sent during a sleep's drain waits for the sleep, then wakes
    // (it was a no-op, and the replica then fell asleep after it).
    let pending = one_running_request(&c, &base, 500).await;
    let (c3, b3) = (c.clone(), base.clone());
    let sleeping = tokio::spawn(async move { send_status(c3.post(format!("{b3}/sleep?level=1&mode=wait"))).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(send_status(c.post(format!("{base}/wake_up"))).await, 200);
    assert_eq!(sleeping.await.unwrap(), 200);
    assert_eq!(pending.await.unwrap().0, 200);
    assert!(!is_sleeping(&c, &base).await, "the wake came last");
    let (status, text) = post(&c, completions, json!({"prompt": "again", "max_tokens": 4})).await;
    assert_eq!(status, 200, "{text}");
    s.shutdown().await.unwrap();
}

/// Sends a completion of `max_tokens` tokens in the background and returns once the engine runs
/// it (10 s at most): its answer's task.
async fn one_running_request(c: &reqwest::Client, base: &str, max_tokens: u32) -> tokio::task::JoinHandle<(u16, String)> {
    let (c2, url) = (c.clone(), format!("{base}/v1/completions"));
    let pending = tokio::spawn(async move { post(&c2, url, json!({"prompt": "hello", "max_tokens": max_tokens})).await });
    let running = std::time::Instant::now() + Duration::from_secs(10);
    while scrape(c, base).await.sum(metrics::RUNNING) != Some(1.0) {
        assert!(std::time::Instant::now() < running, "the request never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pending
}

/// A server slow enough to keep long requests in flight for seconds; its start-up load takes
/// seconds of wall time too, so health is awaited longer.
async fn slow_server(speed: f64) -> (EmulateServer, reqwest::Client, String) {
    let s = start(config_at(speed)).await;
    let c = client();
    let base = s.base_url();
    // 30 s at the least.
    wait_healthy_polling(&c, &base, Duration::from_millis(20), 1500).await;
    (s, c, base)
}

/// A streamed request that is preempted (KV pressure) streams on, token by token, once its
/// recompute ends — as vLLM's recompute preemption keeps its output and decodes again. It
/// stopped streaming at the preemption and sent the rest in one chunk at its end (49 chunks
/// for 500 tokens), and the inter-token histogram lost every later token.
#[tokio::test]
async fn a_preempted_stream_streams_on_after_its_recompute() {
    let mut cfg = config_at(10.0);
    cfg.device = "A100-40GB".into();
    cfg.gpu_memory_utilization = 0.05;
    cfg.max_model_len = Some(1024);
    let c = client();
    let s = start(cfg).await;
    let base = s.base_url();
    // The load takes a few seconds of wall time at this speed.
    wait_healthy_polling(&c, &base, Duration::from_millis(20), 1000).await;
    let body = |stream: bool| json!({"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 500, "ignore_eos": true, "stream": stream});
    let background = (0..8).map(|_| post(&c, format!("{base}/v1/completions"), body(false)));
    let streamed = post(&c, format!("{base}/v1/completions"), body(true));
    let (others, (status, text)) = tokio::join!(futures::future::join_all(background), streamed);
    assert!(others.iter().all(|(s, _)| *s == 200) && status == 200, "{others:?}");
    let m = MetricsSnapshot::parse(&c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap()).unwrap();
    assert!(m.counter("vllm:num_preemptions").is_some_and(|p| p > 0.0), "the test needs KV pressure");
    // Every token after each request's first is one inter-token latency, preempted or not: 9
    // requests of 500 tokens (a token counted in a step where its request did not sample, or
    // lost after a recompute, moves this).
    assert_eq!(m.histogram("vllm:inter_token_latency_seconds").map(|h| h.count), Some(9.0 * 499.0));
    let pieces: Vec<String> = sse_data(&text)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["choices"][0]["text"].as_str().map(str::to_string))
        .filter(|t| !t.is_empty())
        .collect();
    let longest = pieces.iter().map(|p| tokens::count(p)).max().unwrap_or(0);
    assert!(pieces.len() >= 400 && longest <= 20, "{} pieces, the longest {longest} tokens", pieces.len());
    drop(s);
}

/// On a V0 engine (Volta) a step that admits a request runs prefills only, and the requests
/// decoding beside it sample nothing in that step: the server counted each a token there (the
/// stream ran ahead of the engine, the inter-token histogram got samples no token had).
#[tokio::test]
async fn a_prefill_only_step_streams_no_token_to_the_decoding_requests() {
    let mut cfg = config_at(10.0);
    cfg.device = "V100-32GB".into();
    let c = client();
    let s = start(cfg).await;
    let base = s.base_url();
    wait_healthy_polling(&c, &base, Duration::from_millis(20), 1500).await;
    let url = format!("{base}/v1/completions");
    let body = json!({"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 200, "ignore_eos": true});
    // Staggered: each later request is admitted while the earlier ones decode.
    let calls = (0..4u64).map(|k| {
        let (c, url, body) = (c.clone(), url.clone(), body.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(40 * k)).await;
            post(&c, url, body).await
        }
    });
    let answers = futures::future::join_all(calls).await;
    assert!(answers.iter().all(|(s, _)| *s == 200), "{answers:?}");
    let m = MetricsSnapshot::parse(&c.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap()).unwrap();
    assert_eq!(m.histogram("vllm:inter_token_latency_seconds").map(|h| h.count), Some(4.0 * 199.0));
    drop(s);
}

/// The tools of the tool-calling tests: a search whose required arguments are a string and an
/// integer with a minimum (and an optional one), and a clock without parameters.
fn search_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "web_search", "description": "Search the web.",
            "parameters": {"type": "object",
                "properties": {"query": {"type": "string"}, "top_k": {"type": "integer", "minimum": 3},
                               "lang": {"type": "string"}},
                "required": ["query", "top_k"]}}},
        {"type": "function", "function": {"name": "clock", "description": "The time now."}}
    ])
}

const QUESTION: &str = "Who won the 2018 World Cup?";

/// The prompt tokens of `messages` and `tools` as Qwen3's template renders them (thinking on).
fn template_tokens(turns: &[tokens::ChatTurn], tools: &Value) -> u64 {
    let tools = tools.as_array().cloned().unwrap_or_default();
    tokens::count(&tokens::chat_template_with_tools(turns, &tools, true, true)) as u64
}

fn turn(role: &str, content: &str, calls: Vec<tokens::TurnToolCall>) -> tokens::ChatTurn {
    tokens::ChatTurn { role: role.into(), content: content.into(), tool_calls: calls }
}

/// The one choice of a non-streamed chat answer (status 200 asserted).
async fn chat_choice(c: &reqwest::Client, base: &str, body: Value) -> (Value, Value) {
    let (status, text) = post(c, format!("{base}/v1/chat/completions"), body.clone()).await;
    assert_eq!(status, 200, "{body}: {text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    (v["choices"][0].clone(), v["usage"].clone())
}

fn is_tool_call_id(id: &Value) -> bool {
    id.as_str()
        .and_then(|s| s.strip_prefix("chatcmpl-tool-"))
        .is_some_and(|hex| hex.len() == 32 && hex.chars().all(|ch| ch.is_ascii_hexdigit()))
}

/// vLLM 0.10.2 with `--enable-auto-tool-choice --tool-call-parser hermes`: under "auto" the
/// emulated model calls the first tool after a user message (arguments: the required ones, the
/// string the question), the prompt counts the tools block; after the tool's result it answers
/// in text.
/// A JSON-schema response format constrains the whole answer, as vLLM 0.10.2's guided decoding
/// does: with `auto` tools the emulated model makes no call and writes the schema's instance;
/// a named choice still calls.
#[tokio::test]
async fn a_response_format_answer_is_its_schemas_instance_and_makes_no_auto_call() {
    let (s, c, base) = fast_server().await;
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer", "exclusiveMinimum": 2}}, "required": ["city", "n"]});
    let format = json!({"type": "json_schema", "json_schema": {"name": "Answer", "schema": schema}});
    let user = json!({"role": "user", "content": "Paris"});
    let (choice, _) = chat_choice(&c, &base, json!({"model": MODEL, "messages": [user], "tools": search_tools(), "response_format": format})).await;
    assert!(choice["message"]["tool_calls"].as_array().is_some_and(Vec::is_empty), "{choice}");
    let answer: Value = serde_json::from_str(choice["message"]["content"].as_str().unwrap_or("")).unwrap_or_default();
    assert_eq!(answer, json!({"city": "Paris", "n": 3}), "{choice}");
    let named = json!({"type": "function", "function": {"name": "web_search"}});
    let (choice, _) = chat_choice(&c, &base, json!({"model": MODEL, "messages": [user], "tools": search_tools(), "tool_choice": named, "response_format": format})).await;
    assert_eq!(choice["message"]["tool_calls"][0]["function"]["name"], "web_search", "{choice}");
    // The completions API takes the format too (vLLM's does), its strings from the prompt.
    let (status, text) = post(&c, format!("{base}/v1/completions"), json!({"model": MODEL, "prompt": "Rome", "max_tokens": 32, "response_format": format})).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_default();
    let answer: Value = serde_json::from_str(v["choices"][0]["text"].as_str().unwrap_or("")).unwrap_or_default();
    assert_eq!(answer, json!({"city": "Rome", "n": 3}), "{text}");
    // A list of prompts: each choice's instance from its own prompt.
    let (status, text) = post(&c, format!("{base}/v1/completions"), json!({"model": MODEL, "prompt": ["Rome", "Oslo"], "max_tokens": 32, "response_format": format})).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_default();
    let cities: Vec<Value> = (0..2)
        .map(|i| {
            let choice = v["choices"].as_array().and_then(|c| c.iter().find(|c| c["index"] == i)).cloned().unwrap_or_default();
            serde_json::from_str::<Value>(choice["text"].as_str().unwrap_or("")).unwrap_or_default()["city"].clone()
        })
        .collect();
    assert_eq!(cities, [json!("Rome"), json!("Oslo")], "{text}");
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_auto_tool_call_then_a_text_answer_after_the_tool_result() {
    let (s, c, base) = fast_server().await;
    let tools = search_tools();
    let user = json!({"role": "user", "content": QUESTION});
    let (choice, usage) = chat_choice(&c, &base, json!({"model": MODEL, "messages": [user], "tools": tools})).await;
    assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
    let message = &choice["message"];
    assert_eq!(message["content"], Value::Null, "no text before the call: {message}");
    let calls = message["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "{message}");
    let call = &calls[0];
    assert!(is_tool_call_id(&call["id"]), "{call}");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "web_search");
    let arguments = call["function"]["arguments"].as_str().expect("arguments are JSON text");
    assert_eq!(arguments, format!("{{\"query\": \"{QUESTION}\", \"top_k\": 3}}"), "json.dumps style");
    // The generated tokens are the hermes call Qwen3 writes.
    let generated = format!("<tool_call>\n{{\"name\": \"web_search\", \"arguments\": {arguments}}}\n</tool_call>");
    assert_eq!(usage["completion_tokens"], tokens::count(&generated) as u64);
    // The prompt carries the tools block: more tokens than without tools, exactly the template's.
    let asked = [turn("user", QUESTION, Vec::new())];
    assert_eq!(usage["prompt_tokens"], template_tokens(&asked, &tools));
    let (_, plain) = chat_choice(&c, &base, json!({"messages": [user], "max_tokens": 5})).await;
    assert_eq!(plain["prompt_tokens"], template_tokens(&asked, &json!([])));
    assert!(usage["prompt_tokens"].as_u64() > plain["prompt_tokens"].as_u64(), "{usage} vs {plain}");

    // The tool's result goes back: the model answers in text, the call counted in the prompt.
    let messages = json!([user,
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "France"}]);
    let (choice, usage) = chat_choice(&c, &base, json!({"messages": messages, "tools": tools})).await;
    assert_eq!(choice["finish_reason"], "stop", "{choice}");
    assert_eq!(choice["message"]["tool_calls"], json!([]));
    assert!(choice["message"]["content"].as_str().is_some_and(|t| !t.is_empty()), "{choice}");
    let answered = [
        turn("user", QUESTION, Vec::new()),
        turn("assistant", "", vec![tokens::TurnToolCall { name: "web_search".into(), arguments: arguments.into() }]),
        turn("tool", "France", Vec::new()),
    ];
    assert_eq!(usage["prompt_tokens"], template_tokens(&answered, &tools));
    // With a limit, the answer after the result runs to it.
    let (choice, _) = chat_choice(&c, &base, json!({"messages": messages, "tools": tools, "max_tokens": 7})).await;
    assert_eq!((choice["finish_reason"].clone(), choice["message"]["tool_calls"].clone()), (json!("length"), json!([])));
    // `/tokenize` renders the tools too (vLLM's `TokenizeChatRequest.tools`).
    let (status, body) = post(&c, format!("{base}/tokenize"), json!({"messages": [user], "tools": tools})).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["count"], template_tokens(&asked, &tools));
    s.shutdown().await.unwrap();
}

/// A streamed auto call: the role chunk, the call as one `tool_calls` delta on the chunk of its
/// last token with `finish_reason: "tool_calls"`, then usage and `[DONE]`.
#[tokio::test]
async fn a_streamed_auto_tool_call_arrives_as_one_delta() {
    let (s, c, base) = fast_server().await;
    let (status, body) = post(
        &c,
        format!("{base}/v1/chat/completions"),
        json!({"messages": [{"role": "user", "content": QUESTION}], "tools": search_tools(), "stream": true,
               "stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    let deltas: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"].get(0)).collect();
    let content: String = deltas.iter().filter_map(|d| d["delta"]["content"].as_str()).collect();
    assert_eq!(content, "", "nothing before the call is content: {chunks:?}");
    let calls: Vec<&Value> = deltas.iter().filter(|d| d["delta"].get("tool_calls").is_some()).copied().collect();
    assert_eq!(calls.len(), 1, "{chunks:?}");
    let call = &calls[0]["delta"]["tool_calls"][0];
    assert_eq!(call["index"], 0);
    assert!(is_tool_call_id(&call["id"]), "{call}");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "web_search");
    assert_eq!(call["function"]["arguments"], format!("{{\"query\": \"{QUESTION}\", \"top_k\": 3}}"));
    // The finish reason rides on the call's chunk, the last of the choice.
    let finishing: Vec<&&Value> = deltas.iter().filter(|d| !d["finish_reason"].is_null()).collect();
    assert_eq!(finishing.len(), 1, "{chunks:?}");
    assert_eq!(finishing[0]["finish_reason"], "tool_calls");
    assert!(finishing[0]["delta"].get("tool_calls").is_some(), "{chunks:?}");
    let usage = &chunks.last().unwrap()["usage"];
    let generated = format!(
        "<tool_call>\n{{\"name\": \"web_search\", \"arguments\": {}}}\n</tool_call>",
        call["function"]["arguments"].as_str().unwrap_or_default()
    );
    assert_eq!(usage["completion_tokens"], tokens::count(&generated) as u64);
    // After the tool's result, the text answer streams as content deltas, as without tools.
    let answer = json!({"messages": [{"role": "user", "content": QUESTION},
                                     {"role": "assistant", "content": "", "tool_calls": [call]},
                                     {"role": "tool", "content": "France"}],
                        "tools": search_tools(), "max_tokens": 12});
    let (whole, _) = chat_choice(&c, &base, answer.clone()).await;
    let mut streamed = answer;
    streamed["stream"] = json!(true);
    let (status, body) = post(&c, format!("{base}/v1/chat/completions"), streamed).await;
    assert_eq!(status, 200, "{body}");
    let chunks: Vec<Value> = sse_data(&body).iter().filter_map(|d| serde_json::from_str(d).ok()).collect();
    let content: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert!(!content.is_empty());
    assert_eq!(Some(content.as_str()), whole["message"]["content"].as_str(), "{chunks:?}");
    assert!(chunks.iter().all(|c| c["choices"][0]["delta"].get("tool_calls").is_none()), "{chunks:?}");
    assert_eq!(chunks.last().map(|c| c["choices"][0]["finish_reason"].clone()), Some(json!("length")));
    s.shutdown().await.unwrap();
}

/// Named and "required" choices (vLLM's guided decoding: the arguments JSON alone, a JSON list
/// of calls), "none" (text, the tools still in the prompt) and an auto call cut by
/// `max_tokens` (content, `length`), each as vLLM 0.10.2 answers it.
#[tokio::test]
async fn named_required_and_none_tool_choices_and_a_cut_call() {
    let (s, c, base) = fast_server().await;
    let tools = search_tools();
    let messages = json!([{"role": "user", "content": QUESTION}]);
    let named = json!({"type": "function", "function": {"name": "clock"}});
    let (choice, usage) = chat_choice(&c, &base, json!({"messages": messages, "tools": tools, "tool_choice": named})).await;
    assert_eq!(choice["message"]["content"], "");
    let call = &choice["message"]["tool_calls"][0];
    assert!(is_tool_call_id(&call["id"]), "{choice}");
    assert_eq!((call["function"]["name"].clone(), call["function"]["arguments"].clone()), (json!("clock"), json!("{}")));
    // vLLM 0.10.2 reports `tool_calls` as the finish reason of auto calls only.
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(usage["completion_tokens"], tokens::count("{}") as u64);
    // Streamed, a named call finishes with `tool_calls` (vLLM's `tools_streamed`).
    let (_, body) = post(
        &c,
        format!("{base}/v1/chat/completions"),
        json!({"messages": messages, "tools": tools, "tool_choice": named, "stream": true}),
    )
    .await;
    let chunks: Vec<Value> = sse_data(&body).iter().filter_map(|d| serde_json::from_str(d).ok()).collect();
    let last = chunks.last().map(|c| c["choices"][0].clone()).unwrap_or_default();
    assert_eq!(last["finish_reason"], "tool_calls", "{chunks:?}");
    assert_eq!(last["delta"]["tool_calls"][0]["function"], json!({"name": "clock", "arguments": "{}"}), "{chunks:?}");

    let (choice, usage) = chat_choice(&c, &base, json!({"messages": messages, "tools": tools, "tool_choice": "required"})).await;
    assert_eq!(choice["message"]["content"], "");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "web_search");
    let arguments = format!("{{\"query\": \"{QUESTION}\", \"top_k\": 3}}");
    assert_eq!(call["function"]["arguments"], arguments.as_str());
    assert_eq!(choice["finish_reason"], "stop");
    let generated = format!("[{{\"name\": \"web_search\", \"parameters\": {arguments}}}]");
    assert_eq!(usage["completion_tokens"], tokens::count(&generated) as u64);

    // "none": a text answer, the tools still rendered in the prompt.
    let (choice, usage) = chat_choice(&c, &base, json!({"messages": messages, "tools": tools, "tool_choice": "none"})).await;
    assert_eq!((choice["finish_reason"].clone(), choice["message"]["tool_calls"].clone()), (json!("stop"), json!([])));
    assert_eq!(usage["prompt_tokens"], template_tokens(&[turn("user", QUESTION, Vec::new())], &tools));

    // An auto call cut by max_tokens does not parse: it comes back as content.
    let (choice, usage) = chat_choice(&c, &base, json!({"messages": messages, "tools": tools, "max_tokens": 6})).await;
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["message"]["tool_calls"], json!([]));
    assert!(choice["message"]["content"].as_str().is_some_and(|t| t.starts_with("<tool_call>\n{\"name\"")), "{choice}");
    assert_eq!(usage["completion_tokens"], 6);
    // A cut "required" list is vLLM's 400 (its output is no list of calls).
    let (status, text) = post(
        &c,
        format!("{base}/v1/chat/completions"),
        json!({"messages": messages, "tools": tools, "tool_choice": "required", "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, 400, "{text}");
    s.shutdown().await.unwrap();
}

/// vLLM's `check_tool_usage` refusals, in its words, `param` naming the field.
#[tokio::test]
async fn tool_fields_vllm_refuses_get_400s() {
    let (s, c, base) = fast_server().await;
    let messages = json!([{"role": "user", "content": QUESTION}]);
    let cases = [
        (json!({"messages": messages, "tool_choice": "auto"}), "tool_choice", "When using `tool_choice`, `tools` must be set."),
        (
            json!({"messages": messages, "tools": search_tools(),
                   "tool_choice": {"type": "function", "function": {"name": "weather"}}}),
            "tool_choice",
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
        ),
        (
            json!({"messages": messages, "tools": search_tools(), "tool_choice": "sometimes"}),
            "tool_choice",
            "Invalid value for `tool_choice`: sometimes! Only named tools, \"none\", \"auto\" or \"required\" are supported.",
        ),
        (json!({"messages": messages, "tools": [{"type": "retrieval", "function": {"name": "x"}}]}), "tools", ""),
        (json!({"messages": messages, "tools": [{"type": "function", "function": {"description": "no name"}}]}), "tools", ""),
    ];
    for (body, param, message) in cases {
        let (status, text) = post(&c, format!("{base}/v1/chat/completions"), body.clone()).await;
        assert_eq!(status, 400, "{body}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], param, "{text}");
        assert_eq!(v["error"]["type"], "BadRequestError");
        assert_eq!(v["error"]["code"], 400);
        let got = v["error"]["message"].as_str().unwrap_or_default();
        assert!(!got.is_empty() && (message.is_empty() || got == message), "{text}");
    }
    // "none" needs no tools; an empty list with "auto" is a plain request.
    chat_choice(&c, &base, json!({"messages": messages, "tool_choice": "none", "max_tokens": 2})).await;
    chat_choice(&c, &base, json!({"messages": messages, "tools": [], "tool_choice": "auto", "max_tokens": 2})).await;
    s.shutdown().await.unwrap();
}
