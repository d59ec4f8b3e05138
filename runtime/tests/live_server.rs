//! The `switchyard emulate` server in-process, over real loopback sockets with a plain HTTP
//! client: vLLM's API surface (completions streaming and not, usage with cached tokens,
//! models, health before and after the load, metrics names and movement, sleep mode, errors
//! and fault injection). Speeds of 100x and more keep every test well under a second or two.

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

/// Polls /health until 200 (bounded).
async fn wait_healthy(c: &reqwest::Client, base: &str) {
    for _ in 0..400 {
        if let Ok(r) = c.get(format!("{base}/health")).send().await
            && r.status() == 200
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{base} never became healthy");
}

async fn fast_server() -> (EmulateServer, reqwest::Client, String) {
    server_at(2000.0).await
}

async fn server_at(speed: f64) -> (EmulateServer, reqwest::Client, String) {
    let mut cfg = EmulateConfig::new(DEVICE, MODEL);
    cfg.speed = speed;
    cfg.max_model_len = Some(8192);
    let s = start(cfg).await;
    let c = client();
    let base = s.base_url();
    wait_healthy(&c, &base).await;
    (s, c, base)
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
    let r = c.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(r.status(), 503, "healthy before the load finished");
    // Completions are refused while loading, models are listed.
    let (status, _) = post(
        &c,
        format!("{base}/v1/completions"),
        json!({"prompt": "hi"}),
    )
    .await;
    assert_eq!(status, 503);
    let models: Value = c
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "Qwen3-8B");
    wait_healthy(&c, &base).await;
    let waited = started.elapsed().as_secs_f64();
    assert!(
        waited >= 0.35,
        "healthy after only {waited:.3} s of a 0.4 s load"
    );
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
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
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
    let is_sleeping = |c: reqwest::Client, base: String| async move {
        let v: Value = c
            .get(format!("{base}/is_sleeping"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["is_sleeping"].as_bool().unwrap()
    };
    assert!(!is_sleeping(c.clone(), base.clone()).await);
    // Warm the prefix cache, sleep (level 1 discards it), wake.
    let body = json!({"prompt": long_prompt(), "max_tokens": 4});
    post(&c, format!("{base}/v1/completions"), body.clone()).await;
    let r = c
        .post(format!("{base}/sleep?level=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(is_sleeping(c.clone(), base.clone()).await);
    // Weight-dependent endpoints answer 503 while asleep; health stays 200.
    let (status, _) = post(&c, format!("{base}/v1/completions"), body.clone()).await;
    assert_eq!(status, 503);
    assert_eq!(
        c.get(format!("{base}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // Sleeping again is a no-op.
    assert_eq!(
        c.post(format!("{base}/sleep?level=1"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        c.post(format!("{base}/wake_up"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert!(!is_sleeping(c.clone(), base.clone()).await);
    let (status, text) = post(&c, format!("{base}/v1/completions"), body.clone()).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "sleep must drop the prefix cache"
    );
    // Level 2 and vLLM's three-step wake.
    assert_eq!(
        c.post(format!("{base}/sleep?level=2"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert!(is_sleeping(c.clone(), base.clone()).await);
    assert_eq!(
        c.post(format!("{base}/wake_up?tags=weights"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let (status, _) = post(
        &c,
        format!("{base}/collective_rpc"),
        json!({"method": "reload_weights"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        c.post(format!("{base}/wake_up?tags=kv_cache"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert!(!is_sleeping(c.clone(), base.clone()).await);
    // Bad levels are refused.
    assert_eq!(
        c.post(format!("{base}/sleep?level=3"))
            .send()
            .await
            .unwrap()
            .status(),
        400
    );
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
    let r = c
        .post(url.clone())
        .header("content-type", "application/json")
        .body("{nope")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let (status, _) = post(&c, url, json!({"prompt": ["a", "b"]})).await;
    assert_eq!(status, 400);
    s.shutdown().await.unwrap();
}

#[tokio::test]
async fn fault_injection_fails_or_garbles_answers() {
    let mut cfg = EmulateConfig::new(DEVICE, MODEL);
    cfg.speed = 2000.0;
    cfg.fail_rate = 1.0;
    let s = start(cfg).await;
    let c = client();
    let base = s.base_url();
    wait_healthy(&c, &base).await;
    let (status, _) = post(
        &c,
        format!("{base}/v1/completions"),
        json!({"prompt": "hi"}),
    )
    .await;
    assert_eq!(status, 500);
    s.shutdown().await.unwrap();

    let mut cfg = EmulateConfig::new(DEVICE, MODEL);
    cfg.speed = 2000.0;
    cfg.garbage_rate = 1.0;
    let s = start(cfg).await;
    let base = s.base_url();
    wait_healthy(&c, &base).await;
    let (status, body) = post(
        &c,
        format!("{base}/v1/completions"),
        json!({"prompt": "hi"}),
    )
    .await;
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
        let mut cfg = EmulateConfig::new(DEVICE, MODEL);
        cfg.speed = 2000.0;
        cfg.fail_rate = 0.5;
        cfg.fault_seed = 11;
        let s = start(cfg).await;
        let base = s.base_url();
        wait_healthy(&c, &base).await;
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
    let s = start(cfg).await;
    let c = client();
    let base = s.base_url();
    wait_healthy(&c, &base).await;
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
