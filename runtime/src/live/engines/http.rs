//! `HttpEngine`: one vLLM-compatible server at a base URL, over HTTP with reqwest. The
//! `emulated` and `vllm` engines talk through it; on its own it is the engine of a running
//! `switchyard emulate` server (kind `emulated` with a `base_url`).
//!
//! Calls (vLLM's OpenAI-compatible server and dev-mode endpoints, field anchors §1.1–1.3):
//! `POST /v1/completions` (or `/v1/chat/completions`), streaming with
//! `stream_options.include_usage` or not; `POST /sleep?level=N`; `POST /wake_up` (after a
//! level-2 sleep: `wake_up?tags=weights`, `collective_rpc reload_weights`,
//! `wake_up?tags=kv_cache`, as `docs/features/sleep_mode.md` prescribes); `GET /is_sleeping`;
//! `GET /health`; `GET /metrics`. The prompt goes in Qwen3's chat template with thinking
//! disabled: rendered by us for `/v1/completions` (`tokens::chat_prompt`), by the server for
//! `/v1/chat/completions` (`chat_template_kwargs.enable_thinking = false`), so the server
//! counts the prompt tokens the runtime planned with (`tokens::encode_chat`).
//!
//! Errors: connection refused/reset, timeouts and a stream cut short → `Unreachable`; HTTP 5xx
//! and unparsable answers → `BadResponse` (and 429: overload); other 4xx → `Rejected`. One HTTP
//! request per call, no hidden retries (the replica actor decides).
//!
//! Timing: TTFT is the time to the first streamed choice chunk; without streaming the first
//! token is not observable, and TTFT is the time to the (complete) response.
//!
//! Depends on the `Engine` interface, the metrics parser and `crate::tokens` only.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

use super::ApiFlavor;
use super::metrics::MetricsSnapshot;
use crate::live::engine::{
    Completion, Engine, EngineError, EngineFuture, EngineTelemetry, LlmRequest,
};
use crate::tokens;

/// Seconds one `/health` probe may take.
const HEALTH_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Connect timeout of every request (loopback or LAN).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest error-body excerpt kept in an error message.
const ERROR_EXCERPT: usize = 300;

/// Options shared by the HTTP engines.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpOptions {
    pub api: ApiFlavor,
    /// Longest time one call may take.
    pub request_timeout: Duration,
    /// Longest wait for `/health` in `load`.
    pub health_timeout: Duration,
    /// `Authorization: Bearer` key.
    pub api_key: Option<String>,
    pub headers: BTreeMap<String, String>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            api: ApiFlavor::Completions,
            request_timeout: Duration::from_secs(600),
            health_timeout: Duration::from_secs(900),
            api_key: None,
            headers: BTreeMap::new(),
        }
    }
}

/// Builds a reqwest client with the options' headers (no retries, no proxy for loopback).
pub(crate) fn build_client(options: &HttpOptions) -> Result<Client, EngineError> {
    let mut headers = HeaderMap::new();
    for (k, v) in &options.headers {
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|e| EngineError::Lifecycle(format!("header name `{k}`: {e}")))?;
        let value = HeaderValue::from_str(v)
            .map_err(|e| EngineError::Lifecycle(format!("header `{k}` value: {e}")))?;
        headers.insert(name, value);
    }
    if let Some(key) = &options.api_key {
        let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|e| EngineError::Lifecycle(format!("api key: {e}")))?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    Client::builder()
        .default_headers(headers)
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(options.request_timeout)
        .no_proxy()
        .build()
        .map_err(|e| EngineError::Lifecycle(format!("cannot build the HTTP client: {e}")))
}

/// Maps a transport error (no HTTP status) to `Unreachable`.
pub(crate) fn transport_error(what: &str, e: &reqwest::Error) -> EngineError {
    EngineError::Unreachable(format!("{what}: {}", error_chain(e)))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

fn excerpt(body: &str) -> String {
    let body = body.trim();
    match body.char_indices().nth(ERROR_EXCERPT) {
        Some((i, _)) => format!("{}…", &body[..i]),
        None => body.to_string(),
    }
}

/// Maps a non-success status to the error kind: 4xx → Rejected (the request itself is
/// wrong), except 429 Too Many Requests, which is overload and may succeed later or
/// elsewhere → BadResponse like 5xx.
pub(crate) fn status_error(what: &str, status: StatusCode, body: &str) -> EngineError {
    let message = format!("{what}: HTTP {status}: {}", excerpt(body));
    if status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS {
        EngineError::Rejected(message)
    } else {
        EngineError::BadResponse(message)
    }
}

/// Usage numbers of an OpenAI response (`prompt_tokens_details.cached_tokens` may be absent
/// or null: vLLM only reports it with `--enable-prompt-tokens-details`).
pub(crate) fn parse_usage(usage: &Value) -> Option<(u32, u32, u32)> {
    let num = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    let prompt = num(usage.get("prompt_tokens")?)?;
    let completion = num(usage.get("completion_tokens")?)?;
    let cached = usage
        .get("prompt_tokens_details")
        .and_then(|d| d.get("cached_tokens"))
        .and_then(num)
        .unwrap_or(0);
    Some((prompt, completion, cached))
}

/// The text of a choice: `text` (completions), `message.content` (chat) or `delta.content`
/// (chat chunks).
pub(crate) fn choice_text(choice: &Value) -> Option<&str> {
    choice
        .get("text")
        .and_then(Value::as_str)
        .or_else(|| choice.get("message")?.get("content")?.as_str())
        .or_else(|| choice.get("delta")?.get("content")?.as_str())
}

/// Folds a stream of OpenAI chunks into a completion.
#[derive(Debug, Default)]
pub(crate) struct StreamFold {
    text: String,
    first_choice_at: Option<Duration>,
    usage: Option<(u32, u32, u32)>,
}

impl StreamFold {
    /// Takes one parsed chunk observed `elapsed` after submission.
    pub(crate) fn push(&mut self, chunk: &Value, elapsed: Duration) -> Result<(), EngineError> {
        if let Some(err) = chunk.get("error") {
            return Err(EngineError::BadResponse(format!("stream error: {err}")));
        }
        if let Some(choices) = chunk.get("choices").and_then(Value::as_array) {
            for c in choices {
                if self.first_choice_at.is_none() {
                    self.first_choice_at = Some(elapsed);
                }
                if let Some(t) = choice_text(c) {
                    self.text.push_str(t);
                }
            }
        } else if chunk.get("usage").is_none() {
            return Err(EngineError::BadResponse(format!(
                "stream chunk without choices: {}",
                excerpt(&chunk.to_string())
            )));
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage =
                Some(parse_usage(u).ok_or_else(|| {
                    EngineError::BadResponse(format!("bad usage in stream: {u}"))
                })?);
        }
        Ok(())
    }

    pub(crate) fn finish(self, latency: Duration) -> Result<Completion, EngineError> {
        let (prompt_tokens, output_tokens, cached) = self.usage.ok_or_else(|| {
            EngineError::BadResponse(
                "the stream carried no usage (stream_options.include_usage unsupported?)".into(),
            )
        })?;
        Ok(Completion {
            text: self.text,
            prompt_tokens,
            cached_prompt_tokens: cached,
            output_tokens,
            ttft_s: self.first_choice_at.unwrap_or(latency).as_secs_f64(),
            latency_s: latency.as_secs_f64(),
        })
    }
}

/// Parses a complete (non-streamed) OpenAI completion body.
pub(crate) fn parse_full(body: &Value, latency: Duration) -> Result<Completion, EngineError> {
    let bad = |what: &str| {
        EngineError::BadResponse(format!(
            "{what} in response: {}",
            excerpt(&body.to_string())
        ))
    };
    let choice = body
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| bad("no choices"))?;
    let text = choice_text(choice)
        .ok_or_else(|| bad("no text"))?
        .to_string();
    let (prompt_tokens, output_tokens, cached) = body
        .get("usage")
        .and_then(parse_usage)
        .ok_or_else(|| bad("no usage"))?;
    Ok(Completion {
        text,
        prompt_tokens,
        cached_prompt_tokens: cached,
        output_tokens,
        ttft_s: latency.as_secs_f64(),
        latency_s: latency.as_secs_f64(),
    })
}

/// One vLLM-compatible server.
#[derive(Debug)]
pub struct HttpEngine {
    kind: &'static str,
    client: Client,
    base: String,
    model: String,
    options: HttpOptions,
    /// The level of the last successful sleep (decides the wake sequence).
    slept_level: Mutex<Option<u8>>,
}

impl Clone for HttpEngine {
    fn clone(&self) -> Self {
        HttpEngine {
            kind: self.kind,
            client: self.client.clone(),
            base: self.base.clone(),
            model: self.model.clone(),
            options: self.options.clone(),
            slept_level: Mutex::new(self.last_sleep_level()),
        }
    }
}

impl HttpEngine {
    /// An engine for the server at `base_url` (`http://host:port`, an optional trailing `/v1`
    /// is dropped) serving `model`.
    pub fn new(
        kind: &'static str,
        base_url: &str,
        model: &str,
        options: HttpOptions,
    ) -> Result<Self, EngineError> {
        let trimmed = base_url.trim_end_matches('/');
        let base = trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(EngineError::Lifecycle(format!(
                "base URL `{base_url}` is not http(s)"
            )));
        }
        Ok(HttpEngine {
            kind,
            client: build_client(&options)?,
            base,
            model: model.to_string(),
            options,
            slept_level: Mutex::new(None),
        })
    }

    /// The server root (no trailing slash, no `/v1`).
    pub fn base_url(&self) -> &str {
        &self.base
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    fn last_sleep_level(&self) -> Option<u8> {
        self.slept_level.lock().map(|g| *g).unwrap_or(None)
    }

    fn set_sleep_level(&self, level: Option<u8>) {
        if let Ok(mut g) = self.slept_level.lock() {
            *g = level;
        }
    }

    /// The request body vLLM expects.
    pub fn request_body(&self, request: &LlmRequest) -> Value {
        let model = if request.model.is_empty() {
            &self.model
        } else {
            &request.model
        };
        let mut body = match self.options.api {
            // The prompt inside Qwen3's chat template, as the chat endpoint would render it:
            // both flavours count the simulator's prompt tokens (`tokens::encode_chat`).
            ApiFlavor::Completions => json!({
                "model": model,
                "prompt": tokens::chat_prompt_mode(&request.prompt, request.enable_thinking),
                "max_tokens": request.max_tokens,
                "stream": request.stream,
            }),
            ApiFlavor::Chat => json!({
                "model": model,
                "messages": [{ "role": "user", "content": request.prompt }],
                "max_tokens": request.max_tokens,
                "stream": request.stream,
                "chat_template_kwargs": { "enable_thinking": request.enable_thinking },
            }),
        };
        if request.stream {
            body["stream_options"] = json!({ "include_usage": true });
        }
        if let Some(output) = &request.emulated_output {
            body["switchyard"] = json!({ "output": output });
        }
        body
    }

    /// Runs one request to completion (one HTTP request, no retry).
    pub async fn complete(&self, request: &LlmRequest) -> Result<Completion, EngineError> {
        let path = match self.options.api {
            ApiFlavor::Completions => "/v1/completions",
            ApiFlavor::Chat => "/v1/chat/completions",
        };
        let what = format!("request {} to {}{}", request.id, self.base, path);
        let started = Instant::now();
        let response = self
            .client
            .post(self.url(path))
            .header("X-Request-Id", format!("switchyard-{}", request.id))
            .json(&self.request_body(request))
            .send()
            .await
            .map_err(|e| transport_error(&what, &e))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(status_error(&what, status, &body));
        }
        if !request.stream {
            let bytes = response
                .bytes()
                .await
                .map_err(|e| transport_error(&what, &e))?;
            let latency = started.elapsed();
            let body: Value = serde_json::from_slice(&bytes).map_err(|e| {
                EngineError::BadResponse(format!(
                    "{what}: unparsable body ({e}): {}",
                    excerpt(&String::from_utf8_lossy(&bytes))
                ))
            })?;
            return parse_full(&body, latency);
        }
        let mut events = response.bytes_stream().eventsource();
        let mut fold = StreamFold::default();
        let mut done = false;
        while let Some(event) = events.next().await {
            let event = event.map_err(|e| match e {
                eventsource_stream::EventStreamError::Transport(t) => transport_error(&what, &t),
                other => EngineError::BadResponse(format!("{what}: bad event stream: {other}")),
            })?;
            if event.data == "[DONE]" {
                done = true;
                break;
            }
            let chunk: Value = serde_json::from_str(&event.data).map_err(|e| {
                EngineError::BadResponse(format!(
                    "{what}: unparsable stream chunk ({e}): {}",
                    excerpt(&event.data)
                ))
            })?;
            fold.push(&chunk, started.elapsed())?;
        }
        if !done {
            return Err(EngineError::Unreachable(format!(
                "{what}: the stream ended before [DONE]"
            )));
        }
        fold.finish(started.elapsed())
    }

    async fn post_ok(&self, path_and_query: &str, body: Option<Value>) -> Result<(), EngineError> {
        let what = format!("POST {}{}", self.base, path_and_query);
        let mut req = self.client.post(self.url(path_and_query));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let response = req.send().await.map_err(|e| transport_error(&what, &e))?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            let body = response.text().await.unwrap_or_default();
            Err(status_error(&what, status, &body))
        }
    }

    /// `POST /sleep?level=N` (vLLM dev mode).
    pub async fn sleep_level(&self, level: u8) -> Result<(), EngineError> {
        self.post_ok(&format!("/sleep?level={level}"), None).await?;
        self.set_sleep_level(Some(level));
        Ok(())
    }

    /// `POST /wake_up`; after a level-2 sleep, vLLM's three-step sequence (weights, reload,
    /// KV cache).
    pub async fn wake_up(&self) -> Result<(), EngineError> {
        if self.last_sleep_level() == Some(2) {
            self.post_ok("/wake_up?tags=weights", None).await?;
            self.post_ok(
                "/collective_rpc",
                Some(json!({ "method": "reload_weights" })),
            )
            .await?;
            self.post_ok("/wake_up?tags=kv_cache", None).await?;
        } else {
            self.post_ok("/wake_up", None).await?;
        }
        self.set_sleep_level(None);
        Ok(())
    }

    /// `GET /is_sleeping` → `{"is_sleeping": bool}`.
    pub async fn is_sleeping(&self) -> Result<bool, EngineError> {
        let what = format!("GET {}/is_sleeping", self.base);
        let response = self
            .client
            .get(self.url("/is_sleeping"))
            .send()
            .await
            .map_err(|e| transport_error(&what, &e))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| transport_error(&what, &e))?;
        if !status.is_success() {
            return Err(status_error(&what, status, &body));
        }
        serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v.get("is_sleeping").and_then(Value::as_bool))
            .ok_or_else(|| EngineError::BadResponse(format!("{what}: {}", excerpt(&body))))
    }

    /// One `/health` probe: `Ok(true)` on 200, `Ok(false)` on another status (not up yet).
    pub async fn health(&self) -> Result<bool, EngineError> {
        let what = format!("GET {}/health", self.base);
        let response = self
            .client
            .get(self.url("/health"))
            .timeout(HEALTH_PROBE_TIMEOUT)
            .send()
            .await
            .map_err(|e| transport_error(&what, &e))?;
        Ok(response.status() == StatusCode::OK)
    }

    /// Polls `/health` until 200 or `timeout`.
    pub async fn wait_healthy(&self, timeout: Duration) -> Result<(), EngineError> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(10);
        let mut last: String;
        loop {
            match self.health().await {
                Ok(true) => return Ok(()),
                Ok(false) => last = "/health answered, but not 200".into(),
                Err(e) => last = e.to_string(),
            }
            if Instant::now() + pause > deadline {
                return Err(EngineError::Lifecycle(format!(
                    "{} not healthy after {:.1} s ({last})",
                    self.base,
                    timeout.as_secs_f64()
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }

    /// `GET /metrics`, parsed.
    pub async fn scrape(&self) -> Result<MetricsSnapshot, EngineError> {
        let what = format!("GET {}/metrics", self.base);
        let response = self
            .client
            .get(self.url("/metrics"))
            .send()
            .await
            .map_err(|e| transport_error(&what, &e))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| transport_error(&what, &e))?;
        if !status.is_success() {
            return Err(status_error(&what, status, &body));
        }
        MetricsSnapshot::parse(&body).map_err(|e| EngineError::BadResponse(format!("{what}: {e}")))
    }

    /// Scraped gauges and counters plus `/is_sleeping` (false where the endpoint is absent,
    /// i.e. the server runs without dev mode).
    pub async fn scrape_telemetry(&self) -> Result<EngineTelemetry, EngineError> {
        let mut t = self.scrape().await?.telemetry();
        t.sleeping = match self.is_sleeping().await {
            Ok(s) => s,
            Err(EngineError::Rejected(_)) => false,
            Err(e) => return Err(e),
        };
        Ok(t)
    }
}

impl Engine for HttpEngine {
    fn kind(&self) -> &'static str {
        self.kind
    }

    /// A fixed server: wait until it is healthy.
    fn load(&self) -> EngineFuture<'_, ()> {
        Box::pin(self.wait_healthy(self.options.health_timeout))
    }

    fn sleep(&self, level: u8) -> EngineFuture<'_, ()> {
        Box::pin(self.sleep_level(level))
    }

    fn wake(&self) -> EngineFuture<'_, ()> {
        Box::pin(self.wake_up())
    }

    fn unload(&self) -> EngineFuture<'_, ()> {
        Box::pin(async {
            Err(EngineError::Unsupported(format!(
                "{} is a fixed server; it cannot be unloaded from here",
                self.base
            )))
        })
    }

    fn submit(&self, request: LlmRequest) -> EngineFuture<'_, Completion> {
        Box::pin(async move { self.complete(&request).await })
    }

    fn telemetry(&self) -> EngineFuture<'_, EngineTelemetry> {
        Box::pin(self.scrape_telemetry())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_with_and_without_cached_tokens() {
        let u = json!({"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                       "prompt_tokens_details": {"cached_tokens": 8}});
        assert_eq!(parse_usage(&u), Some((10, 3, 8)));
        let u = json!({"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": null});
        assert_eq!(parse_usage(&u), Some((10, 3, 0)));
        assert_eq!(parse_usage(&json!({"prompt_tokens": 1})), None);
        assert_eq!(
            parse_usage(&json!({"prompt_tokens": -1, "completion_tokens": 1})),
            None
        );
    }

    #[test]
    fn full_bodies_of_both_apis() {
        let t = Duration::from_millis(20);
        let usage = json!({"prompt_tokens": 5, "completion_tokens": 2});
        let c = parse_full(&json!({"choices": [{"text": "hi"}], "usage": usage}), t).unwrap();
        assert_eq!(
            (c.text.as_str(), c.prompt_tokens, c.output_tokens),
            ("hi", 5, 2)
        );
        assert_eq!(c.ttft_s, c.latency_s);
        let c = parse_full(
            &json!({"choices": [{"message": {"role": "assistant", "content": "yo"}}], "usage": usage}),
            t,
        )
        .unwrap();
        assert_eq!(c.text, "yo");
        assert!(matches!(
            parse_full(&json!({"choices": []}), t),
            Err(EngineError::BadResponse(_))
        ));
        assert!(matches!(
            parse_full(&json!({"choices": [{"text": "x"}]}), t),
            Err(EngineError::BadResponse(_))
        ));
    }

    #[test]
    fn stream_fold_concatenates_and_times_the_first_chunk() {
        let mut f = StreamFold::default();
        f.push(
            &json!({"choices": [{"delta": {"role": "assistant", "content": "Hel"}}]}),
            Duration::from_millis(5),
        )
        .unwrap();
        f.push(
            &json!({"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]}),
            Duration::from_millis(9),
        )
        .unwrap();
        f.push(
            &json!({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2,
                    "prompt_tokens_details": {"cached_tokens": 0}}}),
            Duration::from_millis(9),
        )
        .unwrap();
        let c = f.finish(Duration::from_millis(10)).unwrap();
        assert_eq!(c.text, "Hello");
        assert_eq!(c.ttft_s, 0.005);
        assert_eq!(c.latency_s, 0.010);
        assert_eq!(c.output_tokens, 2);
        let mut f = StreamFold::default();
        f.push(&json!({"choices": [{"text": "x"}]}), Duration::ZERO)
            .unwrap();
        assert!(matches!(
            f.finish(Duration::ZERO),
            Err(EngineError::BadResponse(_))
        ));
        let mut f = StreamFold::default();
        assert!(
            f.push(&json!({"error": {"message": "boom"}}), Duration::ZERO)
                .is_err()
        );
        assert!(f.push(&json!({"id": 1}), Duration::ZERO).is_err());
    }

    #[test]
    fn status_classes_map_to_error_kinds() {
        assert!(matches!(
            status_error("x", StatusCode::NOT_FOUND, ""),
            EngineError::Rejected(_)
        ));
        assert!(matches!(
            status_error("x", StatusCode::BAD_GATEWAY, ""),
            EngineError::BadResponse(_)
        ));
        assert!(matches!(
            status_error("x", StatusCode::TOO_MANY_REQUESTS, ""),
            EngineError::BadResponse(_)
        ));
        assert!(matches!(
            status_error("x", StatusCode::SERVICE_UNAVAILABLE, "asleep"),
            EngineError::BadResponse(m) if m.contains("asleep")
        ));
        let long = "y".repeat(5000);
        let EngineError::BadResponse(m) =
            status_error("x", StatusCode::INTERNAL_SERVER_ERROR, &long)
        else {
            panic!("5xx must be BadResponse");
        };
        assert!(m.len() < 400);
    }

    #[test]
    fn request_bodies_carry_the_switchyard_output_and_usage_option() {
        let e = HttpEngine::new(
            "emulated",
            "http://127.0.0.1:9/v1/",
            "m",
            HttpOptions::default(),
        )
        .unwrap();
        assert_eq!(e.base_url(), "http://127.0.0.1:9");
        let req = LlmRequest {
            id: 1,
            model: "m".into(),
            prompt: "p".into(),
            max_tokens: 7,
            emulated_output: Some("out".into()),
            enable_thinking: false,
            stream: true,
        };
        let b = e.request_body(&req);
        assert_eq!(b["prompt"], tokens::chat_prompt("p"));
        assert_eq!(b["max_tokens"], 7);
        assert_eq!(b["switchyard"]["output"], "out");
        assert_eq!(b["stream_options"]["include_usage"], true);
        let chat = HttpEngine::new(
            "vllm",
            "http://h:1",
            "m",
            HttpOptions {
                api: ApiFlavor::Chat,
                ..HttpOptions::default()
            },
        )
        .unwrap();
        let b = chat.request_body(&LlmRequest {
            stream: false,
            emulated_output: None,
            enable_thinking: false,
            ..req
        });
        assert_eq!(b["messages"][0]["content"], "p");
        assert_eq!(b["chat_template_kwargs"]["enable_thinking"], false);
        assert!(b.get("switchyard").is_none() && b.get("stream_options").is_none());
        assert!(HttpEngine::new("vllm", "ftp://h", "m", HttpOptions::default()).is_err());
    }
}
