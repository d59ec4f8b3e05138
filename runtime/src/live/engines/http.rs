//! `HttpEngine`: one OpenAI-compatible server over HTTP with reqwest — a vLLM server (the
//! `vllm` and `emulated` engines talk through it), a running `switchyard emulate`, or a fixed
//! endpoint of any other OpenAI-compatible server (the `openai` engine wraps it).
//!
//! Calls (vLLM's OpenAI-compatible server and dev-mode endpoints, field anchors §1.1–1.3):
//! `POST {api}/completions` or `{api}/chat/completions`, streaming with
//! `stream_options.include_usage` or not; `POST /sleep?level=N` (with `&mode=wait` from vLLM
//! 0.17 on, which drains running requests; before, the replica actor drains them itself);
//! `POST /wake_up` (after a level-2 sleep: `wake_up?tags=weights`, `collective_rpc
//! reload_weights`, `wake_up?tags=kv_cache`, as `docs/features/sleep_mode.md` prescribes);
//! `GET /is_sleeping`; `GET /health`; `GET /metrics`; `GET /version`; `GET {api}/models`.
//! `{api}` is the server root plus `/v1` for a vLLM server, the configured base URL for an
//! `openai` endpoint. The prompt goes in Qwen3's chat template: rendered by us for the
//! completions API (`tokens::chat_prompt_mode`), by the server for the chat API
//! (`chat_template_kwargs.enable_thinking`), so that the server counts the prompt tokens the
//! runtime planned with.
//!
//! **What the server is, found at load** ([`ServerFacts`]): `/version` (vLLM's version, which
//! chooses the sleep calls; `switchyard emulate` says so there, and only then does a request
//! carry the emulated output — a real server never receives it); `{api}/models` (the mapped
//! model must be served, else `Misconfigured`; its `max_model_len` where the server reports
//! it). A prompt that cannot fit the served context is refused before it is sent, and
//! `max_tokens` is clamped to what is left of it.
//!
//! **Errors**: connection refused/reset and a stream cut short → `Unreachable`; 401/403 →
//! `Auth`; 429, and 503 with `Retry-After` → `Overloaded` (with the server's `Retry-After`);
//! 400 / 422 → `Invalid`; other 4xx → `Rejected`; 5xx and unparsable answers → `BadResponse`, and so is a 200 that holds
//! no answer, streamed or not: no choice (`"choices": []`, a stream of only `[DONE]` or with no
//! event at all), or a body that is neither JSON nor an event stream (a gateway's HTML page:
//! its excerpt is in the error). A stream is whole at `[DONE]`, or when it closes after a
//! choice carried its `finish_reason`; one that closes before either was cut short
//! (`Unreachable`). A call that makes no progress for `stall_timeout` gets its server probed
//! (`/health`): a server that does not answer is `Unreachable` (a stopped or hung process: the replica is dead), one that answers
//! keeps the call waiting until its deadline (the request's `deadline_s`, at most
//! `request_timeout`), then `TimedOut` (a slow request, not a dead replica). One HTTP request
//! per call, no hidden retries (the replica actor decides).
//!
//! **Answers without `usage`** (llama.cpp's streams, some proxies): the prompt count is the
//! request's own (Qwen3's tokenizer and chat template), the output count our tokenizer's count
//! of the text.
//!
//! Timing: TTFT is the time to the first streamed choice chunk; without streaming the first
//! token is not observable, and TTFT is the time to the (complete) response.
//!
//! Depends on the `Engine` interface and its API flavours, the metrics parser and
//! `crate::tokens` only.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

use super::ApiFlavor;
use super::metrics::MetricsSnapshot;
use crate::live::engine::{
    Completion, Engine, EngineError, EngineFuture, EngineTelemetry, LlmRequest, ToolCall,
};
use crate::tokens;

/// Seconds one `/health` probe may take.
const HEALTH_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Connect timeout of every request (loopback or LAN).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest error-body excerpt kept in an error message.
const ERROR_EXCERPT: usize = 300;
/// Longest `Retry-After` honoured (a server asking for more is waited on this long, then
/// asked again).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// The first vLLM version whose `/sleep` takes `mode=wait` (drain running requests first).
const SLEEP_MODE_WAIT_SINCE: (u32, u32) = (0, 17);

/// Options shared by the HTTP engines.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpOptions {
    pub api: ApiFlavor,
    /// Longest time one call may take.
    pub request_timeout: Duration,
    /// Longest wait for `/health` in `load`.
    pub health_timeout: Duration,
    /// A call with no progress (no answer, no stream chunk) for this long gets its server
    /// probed; a server that does not answer the probe is taken as dead.
    pub stall_timeout: Duration,
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
            stall_timeout: Duration::from_secs(30),
            api_key: None,
            headers: BTreeMap::new(),
        }
    }
}

/// What the server said about itself at load.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerFacts {
    /// `/version`'s `version`, when the server has that endpoint.
    pub version: Option<String>,
    /// The server is `switchyard emulate` (its `/version` says so): requests may carry the
    /// emulated output.
    pub emulator: bool,
    /// The served context length of the model (`{api}/models` `max_model_len`, or
    /// llama.cpp's `meta.n_ctx_train`), when reported.
    pub max_model_len: Option<u32>,
    /// `/metrics` answered 404 once: never scraped again.
    pub no_metrics: bool,
}

impl ServerFacts {
    /// `major.minor` of a vLLM-style version string (`0.10.2`, `0.11.0rc1`, `v0.17.1`).
    pub fn version_number(&self) -> Option<(u32, u32)> {
        let v = self.version.as_deref()?.trim_start_matches('v');
        let mut parts = v.split(|c: char| !c.is_ascii_digit());
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some((major, minor))
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
        // No redirects: a redirect to another host would carry the pool's headers (reqwest
        // strips only `Authorization` and cookies) and re-post the prompt there.
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(options.request_timeout)
        .no_proxy()
        .build()
        .map_err(|e| EngineError::Lifecycle(format!("cannot build the HTTP client: {e}")))
}

/// Maps a transport error (no HTTP status): a timeout → `TimedOut`, anything else (refused,
/// reset, DNS, a body cut short) → `Unreachable`.
pub(crate) fn transport_error(what: &str, e: &reqwest::Error) -> EngineError {
    if e.is_timeout() {
        EngineError::TimedOut(format!("{what}: {}", error_chain(e)))
    } else {
        EngineError::Unreachable(format!("{what}: {}", error_chain(e)))
    }
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

/// Most bytes read of a whole response body (an answer, a models list, `/metrics`): an
/// upstream server is a network peer, and a body it never ends must not fill this process.
const MAX_BODY_BYTES: usize = 32 << 20;
/// Most bytes of an error response's body read (only an excerpt is kept).
const MAX_ERROR_BODY_BYTES: usize = 64 << 10;
/// Most bytes of one server-sent event (its lines up to the blank line that ends it): the SSE
/// parser keeps an event's lines until it ends, and parses its buffer again at every chunk.
const MAX_SSE_EVENT_BYTES: usize = 1 << 20;

/// A response body, read up to `cap` bytes (more is an error, not a truncation: a cut JSON body
/// is no answer).
async fn read_capped(what: &str, mut response: reqwest::Response, cap: usize) -> Result<Vec<u8>, EngineError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| transport_error(what, &e))? {
        if body.len() + chunk.len() > cap {
            return Err(EngineError::BadResponse(format!("{what}: a response body longer than {cap} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Why an event stream's bytes stopped: the transport, an event past [`MAX_SSE_EVENT_BYTES`],
/// or bytes that are not UTF-8.
#[derive(Debug)]
enum StreamBytesError {
    Transport(reqwest::Error),
    EventTooLong,
    NotUtf8,
}

impl std::fmt::Display for StreamBytesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamBytesError::Transport(e) => write!(f, "{e}"),
            StreamBytesError::EventTooLong => write!(f, "an event longer than {MAX_SSE_EVENT_BYTES} bytes"),
            StreamBytesError::NotUtf8 => write!(f, "bytes that are not UTF-8 text"),
        }
    }
}

/// Where an event stream stands between chunks ([`sse_bounded`]).
#[derive(Default)]
struct SseCut {
    /// Bytes after the last line end, held until their line ends.
    partial: Vec<u8>,
    /// Bytes of the current line so far, and of the event's earlier lines.
    line: usize,
    event: usize,
    /// The last line ended with `\r`: a `\n` next is the same line end (`\r\n`).
    after_cr: bool,
}

impl SseCut {
    /// The whole lines `chunk` completes (with what was held), as the SSE parser reads lines:
    /// ended by `\n`, `\r\n` or `\r`; a blank line ends an event.
    fn take(&mut self, chunk: &[u8]) -> Result<Vec<u8>, StreamBytesError> {
        let mut cut = 0;
        for (i, &b) in chunk.iter().enumerate() {
            if std::mem::take(&mut self.after_cr) && b == b'\n' {
                cut = i + 1;
                continue;
            }
            if b == b'\n' || b == b'\r' {
                self.event = if self.line == 0 { 0 } else { self.event + self.line };
                self.line = 0;
                self.after_cr = b == b'\r';
                cut = i + 1;
            } else {
                self.line += 1;
                if self.event + self.line > MAX_SSE_EVENT_BYTES {
                    return Err(StreamBytesError::EventTooLong);
                }
            }
        }
        if cut == 0 {
            // No line ended: everything waits for its line end.
            self.partial.extend_from_slice(chunk);
            return Ok(Vec::new());
        }
        let mut whole = std::mem::take(&mut self.partial);
        whole.extend_from_slice(&chunk[..cut]);
        self.partial.extend_from_slice(&chunk[cut..]);
        // Whole lines end at a line end, never inside a character: the check is exact. (The
        // parser keeps every byte after an invalid one and parses it again at each chunk.)
        if std::str::from_utf8(&whole).is_err() {
            return Err(StreamBytesError::NotUtf8);
        }
        Ok(whole)
    }
}

/// The bytes of an event stream handed on in whole lines (a line's start is held here until it
/// ends, so the SSE parser never re-parses an unfinished line), cut with an error once one
/// event passes [`MAX_SSE_EVENT_BYTES`] or a line is not UTF-8.
fn sse_bounded<B: AsRef<[u8]>>(
    bytes: impl futures::Stream<Item = Result<B, reqwest::Error>>,
) -> impl futures::Stream<Item = Result<Vec<u8>, StreamBytesError>> {
    let mut cut = SseCut::default();
    bytes.map(move |chunk| cut.take(chunk.map_err(StreamBytesError::Transport)?.as_ref()))
}

/// Most bytes of a stream's start kept to show in an error (an excerpt is [`ERROR_EXCERPT`]
/// characters, of up to 4 bytes each).
const HEAD_BYTES: usize = 4 * ERROR_EXCERPT;

/// Whether a streamed request's answer is one whole body rather than an event stream: its
/// `Content-Type` says JSON (a server or proxy that ignores `stream`, or an error object with a
/// 200) or HTML (a gateway's page). Anything else — `text/event-stream`, no header, or another
/// type some proxies label a stream with (`text/plain`) — is parsed as a stream; one with no
/// event in it is a bad answer then, with an excerpt of its body.
fn is_whole_body(headers: &HeaderMap) -> bool {
    headers.get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
        let v = v.trim_start().to_ascii_lowercase();
        v.starts_with("application/json") || v.starts_with("text/html")
    })
}

/// The start of a server's text for an error message: at most [`ERROR_EXCERPT`] characters,
/// control characters escaped.
fn excerpt(body: &str) -> String {
    let mut out = String::new();
    for (n, c) in body.trim().chars().enumerate() {
        if n == ERROR_EXCERPT {
            out.push('…');
            break;
        }
        push_terminal_safe(&mut out, c);
    }
    out
}

/// `c`, or its escape where it could act on a terminal. A server's or an engine process's bytes
/// reach the operator's terminal in notes and failures: control characters (escape sequences
/// that retitle, clear or recolour it; NULs) and the invisible format characters that reorder
/// or hide text (bidi overrides, zero-width ones) go escaped.
fn push_terminal_safe(out: &mut String, c: char) {
    if c.is_control() || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}') {
        out.extend(c.escape_default());
    } else {
        out.push(c);
    }
}

/// One line of a process's output, safe to print: see [`push_terminal_safe`].
pub(crate) fn terminal_safe(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    for c in line.chars() {
        push_terminal_safe(&mut out, c);
    }
    out
}

/// `Retry-After` in seconds (the HTTP-date form is not used by inference servers and is
/// ignored), capped at [`MAX_RETRY_AFTER`].
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let secs: f64 = v.parse().ok()?;
    Duration::try_from_secs_f64(secs).ok().map(|d| d.min(MAX_RETRY_AFTER))
}

/// Maps a non-success status to the error kind: 401/403 → `Auth`; 429, and 503 with
/// `Retry-After` → `Overloaded`; 400, 422 → `Invalid` (the request itself is wrong); other
/// 4xx → `Rejected` (the server will not take it); 5xx →
/// `BadResponse`.
pub(crate) fn status_error(
    what: &str,
    status: StatusCode,
    retry: Option<Duration>,
    body: &str,
) -> EngineError {
    let message = format!("{what}: HTTP {status}: {}", excerpt(body));
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => EngineError::Auth(message),
        StatusCode::TOO_MANY_REQUESTS => EngineError::Overloaded { message, retry_after: retry },
        StatusCode::SERVICE_UNAVAILABLE if retry.is_some() => {
            EngineError::Overloaded { message, retry_after: retry }
        }
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => EngineError::Invalid(message),
        s if s.is_client_error() => EngineError::Rejected(message),
        _ => EngineError::BadResponse(message),
    }
}

/// The error of a non-success response (reads its body).
async fn response_error(what: &str, response: reqwest::Response) -> EngineError {
    let status = response.status();
    let retry = retry_after(response.headers());
    // Only an excerpt is kept: a longer body is read no further.
    let mut body = Vec::new();
    let mut response = response;
    while let Ok(Some(chunk)) = response.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() >= MAX_ERROR_BODY_BYTES {
            break;
        }
    }
    status_error(what, status, retry, &String::from_utf8_lossy(&body))
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
/// (chat chunks). A message whose `content` is null has empty text: vLLM answers so when a
/// reasoning model spent its whole budget on reasoning (`reasoning_content`).
pub(crate) fn choice_text(choice: &Value) -> Option<&str> {
    choice
        .get("text")
        .and_then(Value::as_str)
        .or_else(|| {
            let content = choice.get("message")?.get("content")?;
            if content.is_null() { Some("") } else { content.as_str() }
        })
        .or_else(|| choice.get("delta")?.get("content")?.as_str())
}

/// Token counts of an answer that carried no `usage`: the request's own prompt count and our
/// tokenizer's count of the text (Qwen3's, what the runtime plans with).
fn counted_usage(text: &str, prompt_tokens: u32) -> (u32, u32, u32) {
    let output = u32::try_from(tokens::count(text)).unwrap_or(u32::MAX);
    (prompt_tokens, output, 0)
}

/// A server's `usage` held to what the request allows: at most `max_tokens` generated, a prompt
/// no longer than the served context (where the server said it), at most the prompt cached (the counts of a buggy or hostile peer would skew the planner's output
/// histories and the report's GPU-time attribution).
fn within_limits(mut c: Completion, request: &LlmRequest, max_model_len: Option<u32>) -> Completion {
    c.output_tokens = c.output_tokens.min(request.max_tokens);
    // The server's prompt count may differ from ours (its template), but not pass its context.
    if let Some(len) = max_model_len {
        c.prompt_tokens = c.prompt_tokens.min(len);
    }
    c.cached_prompt_tokens = c.cached_prompt_tokens.min(c.prompt_tokens);
    c
}

/// The tool calls of a chat answer (`message.tool_calls`), or of one chunk
/// (`delta.tool_calls`: fragments, keyed by `index`, whose `arguments` concatenate). Entries
/// that are not objects are skipped; a missing `index` counts as the entry's position.
fn tool_call_parts(choice: &Value) -> impl Iterator<Item = (usize, &Value)> {
    let calls = choice
        .get("message")
        .and_then(|m| m.get("tool_calls"))
        .or_else(|| choice.get("delta").and_then(|d| d.get("tool_calls")))
        .and_then(Value::as_array);
    calls.into_iter().flatten().enumerate().filter(|(_, c)| c.is_object()).map(|(i, c)| {
        let index = c.get("index").and_then(Value::as_u64).and_then(|n| usize::try_from(n).ok()).unwrap_or(i);
        (index, c)
    })
}

/// Most tool calls kept from one answer (a hostile server's indices cannot make us allocate
/// more).
const MAX_TOOL_CALLS: usize = 128;

/// Adds a tool call (or a fragment of one) to `calls`: the id and name where given, the
/// arguments appended. Returns the generated text it added (the name and the arguments'
/// fragment), for the stream's cap and meter.
fn merge_tool_call(calls: &mut Vec<ToolCall>, index: usize, part: &Value) -> String {
    let mut added = String::new();
    if index >= MAX_TOOL_CALLS {
        return added;
    }
    if calls.len() <= index {
        calls.resize_with(index + 1, ToolCall::default);
    }
    let call = &mut calls[index];
    if let Some(id) = part.get("id").and_then(Value::as_str).filter(|s| !s.is_empty()) {
        call.id = id.to_string();
    }
    if let Some(f) = part.get("function") {
        if let Some(name) = f.get("name").and_then(Value::as_str).filter(|s| !s.is_empty()) {
            call.name = name.to_string();
            added.push_str(name);
        }
        let fragment = match f.get("arguments") {
            Some(Value::String(a)) => a.clone(),
            // Some servers send the arguments as an object.
            Some(a @ Value::Object(_)) => a.to_string(),
            _ => String::new(),
        };
        call.arguments.push_str(&fragment);
        added.push_str(&fragment);
    }
    added
}

/// A choice's `finish_reason`, when it carries one.
fn finish_reason_of(choice: &Value) -> Option<String> {
    choice.get("finish_reason").and_then(Value::as_str).map(str::to_string)
}

/// Folds a stream of OpenAI chunks into a completion.
#[derive(Debug, Default)]
pub(crate) struct StreamFold {
    text: String,
    first_choice_at: Option<Duration>,
    usage: Option<(u32, u32, u32)>,
    /// A choice carried a `finish_reason`: the answer is whole (the server ended it).
    finished: bool,
    finish_reason: Option<String>,
    tool_calls: Vec<ToolCall>,
    /// Bytes of the tool calls' names and arguments so far.
    tool_call_bytes: usize,
    /// Tool-call text added since the caller last took it (for the attempt's meter).
    fresh_tool_text: String,
}

impl StreamFold {
    /// Takes one parsed chunk observed `elapsed` after submission.
    pub(crate) fn push(&mut self, chunk: &Value, elapsed: Duration) -> Result<(), EngineError> {
        if let Some(err) = chunk.get("error") {
            return Err(EngineError::BadResponse(format!("stream error: {}", excerpt(&err.to_string()))));
        }
        if let Some(choices) = chunk.get("choices").and_then(Value::as_array) {
            for c in choices {
                if self.first_choice_at.is_none() {
                    self.first_choice_at = Some(elapsed);
                }
                if let Some(t) = choice_text(c) {
                    self.text.push_str(t);
                }
                for (index, part) in tool_call_parts(c) {
                    let added = merge_tool_call(&mut self.tool_calls, index, part);
                    self.tool_call_bytes += added.len();
                    self.fresh_tool_text.push_str(&added);
                }
                if c.get("finish_reason").is_some_and(|r| !r.is_null()) {
                    self.finished = true;
                    self.finish_reason = finish_reason_of(c);
                }
            }
        } else if chunk.get("usage").is_none() {
            return Err(EngineError::BadResponse(format!(
                "stream chunk without choices: {}",
                excerpt(&chunk.to_string())
            )));
        }
        // A `usage` we cannot read (a field missing) leaves the counts to us: the answer itself
        // is whole, and asking again would generate it again.
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()).and_then(parse_usage) {
            self.usage = Some(u);
        }
        Ok(())
    }

    /// Whether a choice came: a stream without one (only `[DONE]`, or only `usage`) holds no
    /// answer, as a whole body with `"choices": []` holds none.
    pub(crate) fn any_choice(&self) -> bool {
        self.first_choice_at.is_some()
    }

    /// Whether a choice carried a `finish_reason` (the server ended the answer).
    pub(crate) fn finished(&self) -> bool {
        self.finished
    }

    /// The completion; without a `usage` chunk the counts are ours ([`counted_usage`]).
    pub(crate) fn finish(self, latency: Duration, prompt_tokens: u32) -> Completion {
        let (prompt_tokens, output_tokens, cached) =
            self.usage.unwrap_or_else(|| counted_usage(&self.text, prompt_tokens));
        Completion {
            text: self.text,
            prompt_tokens,
            cached_prompt_tokens: cached,
            output_tokens,
            ttft_s: self.first_choice_at.unwrap_or(latency).as_secs_f64(),
            latency_s: latency.as_secs_f64(),
            tool_calls: self.tool_calls.into_iter().filter(|c| !c.name.is_empty()).collect(),
            finish_reason: self.finish_reason,
        }
    }
}

/// Parses a complete (non-streamed) OpenAI completion body; without `usage` the counts are
/// ours ([`counted_usage`]).
pub(crate) fn parse_full(
    body: &Value,
    latency: Duration,
    prompt_tokens: u32,
) -> Result<Completion, EngineError> {
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
    // Without a readable `usage` (absent, or a field missing) the counts are ours.
    let (prompt_tokens, output_tokens, cached) = body
        .get("usage")
        .and_then(parse_usage)
        .unwrap_or_else(|| counted_usage(&text, prompt_tokens));
    let mut tool_calls = Vec::new();
    for (index, part) in tool_call_parts(choice) {
        let _ = merge_tool_call(&mut tool_calls, index, part);
    }
    tool_calls.retain(|c| !c.name.is_empty());
    Ok(Completion {
        text,
        prompt_tokens,
        cached_prompt_tokens: cached,
        output_tokens,
        ttft_s: latency.as_secs_f64(),
        latency_s: latency.as_secs_f64(),
        tool_calls,
        finish_reason: finish_reason_of(choice),
    })
}

/// The `X-Request-Id` of one send of call `id`, shaped as a UUID (vLLM takes any id, but
/// llama-cpp-python's server — starlette-context — answers 400 to one that is not a UUID).
/// Unique per send: a retry of a call whose first attempt vLLM has not yet aborted, or a call
/// of a later run (or process) with the same number, must not reuse an id the server may still
/// hold ("request id already running"). The last group is the call's number, for the logs;
/// the first two are a per-process random salt, then a per-process send counter.
fn request_uuid(id: u64) -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SALT: OnceLock<u64> = OnceLock::new();
    static SENDS: AtomicU64 = AtomicU64::new(0);
    let salt = *SALT.get_or_init(rand::random::<u64>);
    let send = SENDS.fetch_add(1, Ordering::Relaxed);
    uuid_of(salt, send, id)
}

/// [`request_uuid`]'s layout: 48 bits of salt, 24 bits of send counter, 48 bits of call id.
fn uuid_of(salt: u64, send: u64, id: u64) -> String {
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        (salt >> 16) & 0xffff_ffff,
        salt & 0xffff,
        (send >> 12) & 0xfff,
        send & 0xfff,
        id & 0xffff_ffff_ffff
    )
}

/// The served context length in a `/v1/models` entry: vLLM's `max_model_len`, or llama.cpp's
/// `meta.n_ctx_train`.
fn served_context(entry: &Value) -> Option<u32> {
    let num = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    entry
        .get("max_model_len")
        .and_then(num)
        .or_else(|| entry.get("meta")?.get("n_ctx_train").and_then(num))
}

/// One OpenAI-compatible server.
#[derive(Debug)]
pub struct HttpEngine {
    kind: &'static str,
    client: Client,
    /// The server root (`/health`, `/metrics`, `/sleep`, `/version`).
    base: String,
    /// The OpenAI API root (`{api}/completions`, `{api}/models`).
    api: String,
    model: String,
    options: HttpOptions,
    /// A fixed endpoint (kind `openai`): no health wait, no sleep, no lifecycle.
    fixed: bool,
    /// The level of the last successful sleep (decides the wake sequence).
    slept_level: Mutex<Option<u8>>,
    facts: Mutex<ServerFacts>,
}

impl Clone for HttpEngine {
    fn clone(&self) -> Self {
        HttpEngine {
            kind: self.kind,
            client: self.client.clone(),
            base: self.base.clone(),
            api: self.api.clone(),
            model: self.model.clone(),
            options: self.options.clone(),
            fixed: self.fixed,
            slept_level: Mutex::new(self.last_sleep_level()),
            facts: Mutex::new(self.facts()),
        }
    }
}

impl HttpEngine {
    /// An engine for the vLLM-style server at `base_url` (`http://host:port`, an optional
    /// trailing `/v1` is dropped) serving `model`.
    pub fn new(
        kind: &'static str,
        base_url: &str,
        model: &str,
        options: HttpOptions,
    ) -> Result<Self, EngineError> {
        let trimmed = base_url.trim_end_matches('/');
        let base = trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string();
        let api = format!("{base}/v1");
        Self::build(kind, base, api, model, options, false)
    }

    /// A fixed OpenAI-compatible endpoint at `api_base` (e.g. `http://host:8000/v1`; the API
    /// paths are relative to it, the health and metrics probes to it without a trailing
    /// `/v1`).
    pub fn fixed_endpoint(
        kind: &'static str,
        api_base: &str,
        model: &str,
        options: HttpOptions,
    ) -> Result<Self, EngineError> {
        let api = api_base.trim_end_matches('/').to_string();
        let base = api.strip_suffix("/v1").unwrap_or(&api).to_string();
        Self::build(kind, base, api, model, options, true)
    }

    fn build(
        kind: &'static str,
        base: String,
        api: String,
        model: &str,
        options: HttpOptions,
        fixed: bool,
    ) -> Result<Self, EngineError> {
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(EngineError::Lifecycle(format!(
                "base URL `{base}` is not http(s)"
            )));
        }
        // Credentials in the URL would be printed wherever the endpoint is named (errors,
        // notes, logs): they go in `api_key_env` or `headers`, which are never printed.
        let authority = base.split_once("://").map_or("", |(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or(""));
        if authority.contains('@') {
            return Err(EngineError::Lifecycle(
                "the base URL carries credentials (`user:key@host`): give the key in `api_key_env` or `headers` instead".into(),
            ));
        }
        Ok(HttpEngine {
            kind,
            client: build_client(&options)?,
            base,
            api,
            model: model.to_string(),
            options,
            fixed,
            slept_level: Mutex::new(None),
            facts: Mutex::new(ServerFacts::default()),
        })
    }

    /// The server root (no trailing slash, no `/v1`).
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The OpenAI API root (`…/v1`).
    pub fn api_base(&self) -> &str {
        &self.api
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    pub fn options(&self) -> &HttpOptions {
        &self.options
    }

    /// What the server said about itself at the last load.
    pub fn facts(&self) -> ServerFacts {
        self.facts.lock().map(|g| g.clone()).unwrap_or_default()
    }

    fn update_facts(&self, f: impl FnOnce(&mut ServerFacts)) {
        if let Ok(mut g) = self.facts.lock() {
            f(&mut g);
        }
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

    /// The request body the server expects (the emulated output only for `switchyard
    /// emulate`, and `max_tokens` as given: see [`Self::fit`]).
    pub fn request_body(&self, request: &LlmRequest) -> Value {
        let model = if request.model.is_empty() {
            &self.model
        } else {
            &request.model
        };
        let mut body = match Self::api_of(self.options.api, request) {
            // An external client's raw completion prompt, as it is.
            ApiFlavor::Completions if request.raw_prompt => json!({
                "model": model,
                "prompt": request.prompt,
                "max_tokens": request.max_tokens,
                "stream": request.stream,
            }),
            // An external client's chat messages, as they are.
            ApiFlavor::Chat if request.messages.is_some() => json!({
                "model": model,
                "messages": request.messages,
                "max_tokens": request.max_tokens,
                "stream": request.stream,
                "chat_template_kwargs": { "enable_thinking": request.enable_thinking },
            }),
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
        // An external client's tools and stop strings, as it sent them.
        if request.messages.is_some() && !request.tools.is_empty() {
            body["tools"] = json!(request.tools);
            if let Some(choice) = &request.tool_choice {
                body["tool_choice"] = choice.clone();
            }
            if let Some(parallel) = request.parallel_tool_calls {
                body["parallel_tool_calls"] = json!(parallel);
            }
        }
        if !request.stop.is_empty() {
            body["stop"] = json!(request.stop);
        }
        if let (true, Some(format)) = (request.messages.is_some() || request.raw_prompt, &request.response_format) {
            body["response_format"] = format.clone();
        }
        if request.server_default_limit
            && let Some(fields) = body.as_object_mut()
        {
            fields.remove("max_tokens");
        }
        if let (true, Some(output)) = (self.facts().emulator, &request.emulated_output) {
            body["switchyard"] = json!({ "output": output });
        }
        body
    }

    /// Refuse a prompt that cannot fit the served context, clamp `max_tokens` to what is
    /// left of it (when the server reported its context length).
    pub fn fit(&self, request: &mut LlmRequest) -> Result<(), EngineError> {
        let Some(context) = self.facts().max_model_len else { return Ok(()) };
        if request.prompt_tokens >= context {
            return Err(EngineError::Rejected(format!(
                "request {}: the prompt of {} tokens does not fit the served context of {} tokens of `{}` at {}",
                request.id, request.prompt_tokens, context, self.model, self.api
            )));
        }
        let room = context - request.prompt_tokens;
        if request.max_tokens > room {
            tracing::debug!(request = request.id, from = request.max_tokens, to = room, "max_tokens clamped to the served context");
            request.max_tokens = room;
        }
        Ok(())
    }

    /// Awaits `work`, probing the server whenever it made no progress for `stall_timeout`:
    /// `Unreachable` when the probe fails, `TimedOut` at `deadline`.
    async fn watched<T>(
        &self,
        what: &str,
        work: impl Future<Output = Result<T, EngineError>>,
        started: Instant,
        deadline: Duration,
    ) -> Result<T, EngineError> {
        let mut work = std::pin::pin!(work);
        loop {
            let left = deadline.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(EngineError::TimedOut(format!(
                    "{what}: no answer within its deadline of {:.1} s",
                    deadline.as_secs_f64()
                )));
            }
            let wait = self.options.stall_timeout.min(left);
            match tokio::time::timeout(wait, &mut work).await {
                Ok(result) => return result,
                Err(_) if started.elapsed() >= deadline => {
                    return Err(EngineError::TimedOut(format!(
                        "{what}: no answer within its deadline of {:.1} s",
                        deadline.as_secs_f64()
                    )));
                }
                Err(_) => {
                    if let Err(e) = self.probe_health().await {
                        return Err(EngineError::Unreachable(format!(
                            "{what}: no progress for {:.1} s and the server does not answer its health probe ({e})",
                            self.options.stall_timeout.as_secs_f64()
                        )));
                    }
                }
            }
        }
    }

    /// The endpoint a request goes to: an external client's raw prompt to the completions API
    /// and its messages to the chat API, whatever the engine's own flavour.
    fn api_of(flavor: ApiFlavor, request: &LlmRequest) -> ApiFlavor {
        if request.raw_prompt {
            ApiFlavor::Completions
        } else if request.messages.is_some() {
            ApiFlavor::Chat
        } else {
            flavor
        }
    }

    /// Runs one request to completion (one HTTP request, no retry). The answer's text goes to
    /// the request's sink as it arrives; when the sink's caller goes away the call is
    /// abandoned — its connection dropped, so the server aborts it — as
    /// [`EngineError::Cancelled`].
    pub async fn complete(&self, request: &LlmRequest) -> Result<Completion, EngineError> {
        let sink = request.sink.clone();
        tokio::select! {
            r = self.complete_once(request) => r,
            () = sink.closed() => Err(EngineError::Cancelled(format!("request {}: the caller went away", request.id))),
        }
    }

    async fn complete_once(&self, request: &LlmRequest) -> Result<Completion, EngineError> {
        let mut request = request.clone();
        self.fit(&mut request)?;
        let path = match Self::api_of(self.options.api, &request) {
            ApiFlavor::Completions => "/completions",
            ApiFlavor::Chat => "/chat/completions",
        };
        let what = format!("request {} to {}{}", request.id, self.api, path);
        let deadline = request
            .deadline_s
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .map_or(self.options.request_timeout, |d| d.min(self.options.request_timeout));
        let started = Instant::now();
        let send = async {
            self.client
                .post(format!("{}{}", self.api, path))
                .header("X-Request-Id", request_uuid(request.id))
                // The deadline is enforced by `watched`; this is only a backstop (a stream in
                // progress may outlive the call's deadline, up to `request_timeout`).
                .timeout(if request.stream { self.options.request_timeout.max(deadline) } else { deadline } + Duration::from_secs(1))
                .json(&self.request_body(&request))
                .send()
                .await
                .map_err(|e| transport_error(&what, &e))
        };
        let response = self.watched(&what, send, started, deadline).await?;
        if !response.status().is_success() {
            return Err(response_error(&what, response).await);
        }
        // A streamed request answered with one whole body — JSON (a server or proxy that
        // ignores `stream`, or an error object with a 200), a gateway's HTML page — is read as
        // without streaming: JSON is the answer, anything else an unparsable body (a bad
        // answer, sent again), never an empty stream ([`is_whole_body`]).
        if !request.stream || is_whole_body(response.headers()) {
            let read = read_capped(&what, response, MAX_BODY_BYTES);
            let bytes = self.watched(&what, read, started, deadline).await?;
            let latency = started.elapsed();
            let body: Value = serde_json::from_slice(&bytes).map_err(|e| {
                EngineError::BadResponse(format!(
                    "{what}: unparsable body ({e}): {}",
                    excerpt(&String::from_utf8_lossy(&bytes))
                ))
            })?;
            let parsed = parse_full(&body, latency, request.prompt_tokens).map_err(|e| match e {
                EngineError::BadResponse(m) => EngineError::BadResponse(format!("{what}: {m}")),
                other => other,
            })?;
            let completion = within_limits(parsed, &request, self.facts().max_model_len);
            if !request.sink.send(&completion.text) {
                return Err(EngineError::Cancelled(format!("{what}: the caller went away")));
            }
            return Ok(completion);
        }
        // The stream's first bytes, to show when they hold no event.
        let head = std::sync::Arc::new(Mutex::new(Vec::new()));
        let bytes = response.bytes_stream().inspect({
            let head = std::sync::Arc::clone(&head);
            move |chunk| {
                if let (Ok(chunk), Ok(mut head)) = (chunk, head.lock()) {
                    let room = HEAD_BYTES.saturating_sub(head.len());
                    head.extend_from_slice(&chunk[..chunk.len().min(room)]);
                }
            }
        });
        let mut events = sse_bounded(bytes).eventsource();
        // The answer's text cannot be longer than its token limit allows: a server that streams
        // on past it (a bug, or a hostile peer) is cut off, not buffered.
        let text_cap = (request.max_tokens as usize).saturating_mul(tokens::MAX_TOKEN_BYTES).saturating_add(4096);
        let mut fold = StreamFold::default();
        let mut done = false;
        let mut any_event = false;
        loop {
            // The call's deadline bounds the wait for its first chunk; a stream that is making
            // progress is not cut by it (a resend would compute the same tokens again), only by
            // the engine's `request_timeout` — and a stream that stops is the stall watch's.
            let limit = if any_event { self.options.request_timeout.max(deadline) } else { deadline };
            let next = async { Ok(events.next().await) };
            let Some(event) = self.watched(&what, next, started, limit).await? else { break };
            let event = event.map_err(|e| match e {
                eventsource_stream::EventStreamError::Transport(StreamBytesError::Transport(t)) => transport_error(&what, &t),
                other => EngineError::BadResponse(format!("{what}: bad event stream: {other}")),
            })?;
            any_event = true;
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
            let before = fold.text.len();
            fold.push(&chunk, started.elapsed())?;
            // Tool calls' names and arguments are generated text too: they count toward the cap.
            if fold.text.len() + fold.tool_call_bytes > text_cap {
                return Err(EngineError::BadResponse(format!(
                    "{what}: the stream's text passed {text_cap} bytes, more than {} tokens can hold",
                    request.max_tokens
                )));
            }
            // What this attempt has cost the engine so far, in case it does not finish.
            if fold.first_choice_at.is_some() {
                request.meter.first_token();
            }
            let fresh_call_text = std::mem::take(&mut fold.fresh_tool_text);
            if !fresh_call_text.is_empty() {
                request.meter.add_output(tokens::count(&fresh_call_text) as u64);
            }
            let piece = &fold.text[before..];
            if !piece.is_empty() {
                request.meter.add_output(tokens::count(piece) as u64);
            }
            if !request.sink.send(piece) {
                return Err(EngineError::Cancelled(format!("{what}: the caller went away")));
            }
        }
        let head = head.lock().map(|h| String::from_utf8_lossy(&h).into_owned()).unwrap_or_default();
        if !any_event && head.is_empty() {
            // A 200 with an empty stream holds no answer, as `"choices": []` holds none: a bad
            // answer, sent again. llama-cpp-python answers a streamed prompt over its context so.
            return Err(EngineError::BadResponse(format!(
                "{what}: the server answered with an empty stream (no answer: llama-cpp-python refuses a prompt over its context so)"
            )));
        }
        if !any_event {
            return Err(EngineError::BadResponse(format!(
                "{what}: unparsable event stream (no event in it): {}",
                excerpt(&head)
            )));
        }
        // Without a choice there is no answer, whether `[DONE]` came or not.
        if !fold.any_choice() {
            return Err(EngineError::BadResponse(format!(
                "{what}: no choices in the stream: {}",
                excerpt(&head)
            )));
        }
        // A stream that ended without `[DONE]` is whole when a choice carried its
        // `finish_reason` (the server ended the answer, then closed without the marker);
        // without either it was cut short.
        if !done && !fold.finished() {
            return Err(EngineError::Unreachable(format!(
                "{what}: the stream ended before [DONE] and before any finish_reason"
            )));
        }
        Ok(within_limits(fold.finish(started.elapsed(), request.prompt_tokens), &request, self.facts().max_model_len))
    }

    async fn post_ok(&self, path_and_query: &str, body: Option<Value>) -> Result<(), EngineError> {
        let what = format!("POST {}{}", self.base, path_and_query);
        let mut req = self.client.post(self.url(path_and_query));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let response = req.send().await.map_err(|e| transport_error(&what, &e))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(response_error(&what, response).await)
        }
    }

    /// Whether this server's `/sleep` drains running requests itself (`mode=wait`).
    pub fn sleep_drains(&self) -> bool {
        self.facts()
            .version_number()
            .is_some_and(|v| v >= SLEEP_MODE_WAIT_SINCE)
    }

    pub async fn sleep_level(&self, level: u8) -> Result<(), EngineError> {
        let path = if self.sleep_drains() {
            format!("/sleep?level={level}&mode=wait")
        } else {
            format!("/sleep?level={level}")
        };
        self.post_ok(&path, None).await?;
        self.set_sleep_level(Some(level));
        Ok(())
    }

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

    pub async fn is_sleeping(&self) -> Result<bool, EngineError> {
        let what = format!("GET {}/is_sleeping", self.base);
        let response = self
            .client
            .get(self.url("/is_sleeping"))
            .send()
            .await
            .map_err(|e| transport_error(&what, &e))?;
        if !response.status().is_success() {
            return Err(response_error(&what, response).await);
        }
        let body = response
            .text()
            .await
            .map_err(|e| transport_error(&what, &e))?;
        serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v.get("is_sleeping").and_then(Value::as_bool))
            .ok_or_else(|| EngineError::BadResponse(format!("{what}: {}", excerpt(&body))))
    }

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

    /// One liveness probe: `/health` answers 200, or (a server without `/health`) the models
    /// list answers at all. Auth failures count as alive (the server answered).
    pub async fn probe_health(&self) -> Result<(), EngineError> {
        match self.health().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(e),
        }
        let what = format!("GET {}/models", self.api);
        let response = self
            .client
            .get(format!("{}/models", self.api))
            .timeout(HEALTH_PROBE_TIMEOUT)
            .send()
            .await
            .map_err(|e| transport_error(&what, &e))?;
        if response.status().is_server_error() {
            Err(EngineError::Unreachable(format!("{what}: HTTP {}", response.status())))
        } else {
            Ok(())
        }
    }

    pub async fn wait_healthy(&self, timeout: Duration) -> Result<(), EngineError> {
        let deadline = super::deadline_after(timeout);
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

    /// Learn what the server is ([`ServerFacts`]): its `/version` (optional), and from the
    /// models list that the model is served and its context length. A server that does not
    /// list the model is `Misconfigured`.
    pub async fn inspect(&self) -> Result<ServerFacts, EngineError> {
        let mut facts = ServerFacts::default();
        if let Ok(response) = self
            .client
            .get(self.url("/version"))
            .timeout(HEALTH_PROBE_TIMEOUT)
            .send()
            .await
            && response.status().is_success()
            && let Ok(body) = read_capped("GET /version", response, MAX_ERROR_BODY_BYTES).await
            && let Ok(v) = serde_json::from_slice::<Value>(&body)
        {
            facts.version = v.get("version").and_then(Value::as_str).map(str::to_string);
            facts.emulator = v.get("switchyard_emulate").is_some();
        }
        let what = format!("GET {}/models", self.api);
        let response = self
            .client
            .get(format!("{}/models", self.api))
            .send()
            .await
            .map_err(|e| transport_error(&what, &e))?;
        if !response.status().is_success() {
            return Err(response_error(&what, response).await);
        }
        let body = read_capped(&what, response, MAX_BODY_BYTES).await?;
        let list: Value = serde_json::from_slice(&body)
            .map_err(|e| EngineError::BadResponse(format!("{what}: unparsable models list: {e}")))?;
        let entries = list.get("data").and_then(Value::as_array).cloned().unwrap_or_default();
        let served: Vec<&str> = entries.iter().filter_map(|m| m.get("id")?.as_str()).collect();
        let Some(entry) = entries.iter().find(|m| m.get("id").and_then(Value::as_str) == Some(self.model.as_str())) else {
            return Err(EngineError::Misconfigured(format!(
                "model `{}` is not served at {} (it serves: {}); map it in the pool file's `engine.models`",
                self.model,
                self.api,
                if served.is_empty() { "nothing".to_string() } else { excerpt(&served.join(", ")) }
            )));
        };
        facts.max_model_len = served_context(entry);
        let no_metrics = self.facts().no_metrics;
        self.update_facts(|f| {
            *f = ServerFacts { no_metrics, ..facts.clone() };
        });
        tracing::info!(server = %self.base, version = ?facts.version, emulator = facts.emulator, max_model_len = ?facts.max_model_len, "server inspected");
        Ok(facts)
    }

    /// `load` of a managed server once its process runs: wait for `/health`, then inspect.
    pub async fn wait_ready(&self) -> Result<(), EngineError> {
        self.wait_healthy(self.options.health_timeout).await?;
        self.inspect().await.map(|_| ())
    }

    pub async fn scrape(&self) -> Result<MetricsSnapshot, EngineError> {
        if self.facts().no_metrics {
            return Err(EngineError::Unsupported(format!("{} has no /metrics", self.base)));
        }
        let what = format!("GET {}/metrics", self.base);
        let response = self
            .client
            .get(self.url("/metrics"))
            .send()
            .await
            .map_err(|e| transport_error(&what, &e))?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND || status == StatusCode::METHOD_NOT_ALLOWED {
            self.update_facts(|f| f.no_metrics = true);
            return Err(EngineError::Unsupported(format!("{what}: HTTP {status}: no metrics here")));
        }
        if !status.is_success() {
            return Err(response_error(&what, response).await);
        }
        let body = read_capped(&what, response, MAX_BODY_BYTES).await?;
        let body = String::from_utf8_lossy(&body);
        MetricsSnapshot::parse(&body).map_err(|e| EngineError::BadResponse(format!("{what}: {e}")))
    }

    pub async fn scrape_telemetry(&self) -> Result<EngineTelemetry, EngineError> {
        let mut t = self.scrape().await?.telemetry();
        if !self.fixed {
            t.sleeping = match self.is_sleeping().await {
                Ok(s) => s,
                Err(EngineError::Rejected(_) | EngineError::Invalid(_)) => false,
                Err(e) => return Err(e),
            };
        }
        Ok(t)
    }
}

fn unsupported(what: &str, base: &str) -> EngineFuture<'static, ()> {
    let message = format!("{what}: {base} is a fixed endpoint (no lifecycle control from here)");
    Box::pin(async move { Err(EngineError::Unsupported(message)) })
}

impl Engine for HttpEngine {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn load(&self) -> EngineFuture<'_, ()> {
        if self.fixed {
            Box::pin(async { self.inspect().await.map(|_| ()) })
        } else {
            Box::pin(self.wait_ready())
        }
    }

    fn sleep(&self, level: u8) -> EngineFuture<'_, ()> {
        if self.fixed {
            return unsupported("sleep", &self.base);
        }
        Box::pin(self.sleep_level(level))
    }

    fn wake(&self) -> EngineFuture<'_, ()> {
        if self.fixed {
            return unsupported("wake", &self.base);
        }
        Box::pin(self.wake_up())
    }

    fn unload(&self) -> EngineFuture<'_, ()> {
        unsupported("unload", &self.base)
    }

    fn submit(&self, request: LlmRequest) -> EngineFuture<'_, Completion> {
        Box::pin(async move { self.complete(&request).await })
    }

    fn telemetry(&self) -> EngineFuture<'_, EngineTelemetry> {
        Box::pin(self.scrape_telemetry())
    }

    fn probe(&self) -> EngineFuture<'_, ()> {
        Box::pin(self.probe_health())
    }

    fn endpoint(&self) -> String {
        self.api.clone()
    }

    fn fixed(&self) -> bool {
        self.fixed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hostile server's bytes never reach the operator's terminal raw: escape sequences and
    /// NULs in an error body are escaped in every message built from it (found by review: a
    /// 500 whose body retitled, cleared and recoloured the terminal through `note:` lines).
    #[test]
    fn an_excerpt_escapes_control_characters() {
        let e = excerpt("\x1b]0;PWNED\x07\x1b[2J\x1b[31mRED\0\nnext line");
        assert!(!e.chars().any(char::is_control), "{e:?}");
        assert_eq!(e, "\\u{1b}]0;PWNED\\u{7}\\u{1b}[2J\\u{1b}[31mRED\\u{0}\\nnext line");
        assert_eq!(excerpt("ok \u{202e}txt.exe"), "ok \\u{202e}txt.exe");
        let long = "x".repeat(ERROR_EXCERPT + 5);
        assert_eq!(excerpt(&long).chars().count(), ERROR_EXCERPT + 1, "cut, with an ellipsis");
    }

    #[test]
    fn an_event_stream_is_handed_on_in_whole_lines_with_every_byte_in_order() {
        let stream = b"data: a\r\n\r\ndata: b\rdata: c\r\rdata: d\n\n";
        // Every split of the stream into two chunks gives the same bytes, in whole lines.
        let whole_lines = |b: &[u8]| b.is_empty() || matches!(b.last(), Some(b'\n' | b'\r'));
        for at in 0..=stream.len() {
            let mut cut = SseCut::default();
            let first = cut.take(&stream[..at]).unwrap();
            let second = cut.take(&stream[at..]).unwrap();
            assert!(whole_lines(&first) && whole_lines(&second), "split at {at}: {first:?} {second:?}");
            assert_eq!([first, second].concat(), stream, "split at {at}");
        }
        // Held across several chunks without a line end, then handed on whole.
        let mut cut = SseCut::default();
        for piece in [&b"da"[..], b"ta: ", b"x"] {
            assert_eq!(cut.take(piece).unwrap(), b"");
        }
        assert_eq!(cut.take(b"\n").unwrap(), b"data: x\n");
        let mut cut = SseCut::default();
        assert_eq!(cut.take(b"data: x").unwrap(), b"");
        assert_eq!(cut.take(b"y\n").unwrap(), b"data: xy\n");
    }

    #[test]
    fn a_long_event_or_bytes_that_are_not_text_are_refused() {
        // Lines of one event add up; a blank line (any line end) starts the count again.
        let line = vec![b'x'; MAX_SSE_EVENT_BYTES / 2 + 1];
        let mut cut = SseCut::default();
        cut.take(&line).unwrap();
        assert!(cut.take(b"\r\n").is_ok());
        assert!(matches!(cut.take(&line), Err(StreamBytesError::EventTooLong)));
        let mut cut = SseCut::default();
        cut.take(&line).unwrap();
        cut.take(b"\r\r").unwrap();
        assert!(cut.take(&line).is_ok(), "a CR-only blank line ends the event");
        assert!(matches!(SseCut::default().take(b"data: \xff\n"), Err(StreamBytesError::NotUtf8)));
    }

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
        let c = parse_full(&json!({"choices": [{"text": "hi"}], "usage": usage}), t, 9).unwrap();
        assert_eq!(
            (c.text.as_str(), c.prompt_tokens, c.output_tokens),
            ("hi", 5, 2)
        );
        assert_eq!(c.ttft_s, c.latency_s);
        let c = parse_full(
            &json!({"choices": [{"message": {"role": "assistant", "content": "yo"}}], "usage": usage}),
            t,
            9,
        )
        .unwrap();
        assert_eq!(c.text, "yo");
        assert!(matches!(
            parse_full(&json!({"choices": []}), t, 9),
            Err(EngineError::BadResponse(_))
        ));
        // No usage (llama.cpp, some proxies): the request's prompt count, our count of the text.
        let c = parse_full(&json!({"choices": [{"text": "hello world"}]}), t, 9).unwrap();
        assert_eq!((c.prompt_tokens, c.output_tokens, c.cached_prompt_tokens), (9, 2, 0));
        // A usage block we cannot read (no `completion_tokens`): the whole answer is kept with our
        // counts, never thrown away and generated again.
        let c = parse_full(&json!({"choices": [{"text": "hello world"}], "usage": {"prompt_tokens": 7}}), t, 9).unwrap();
        assert_eq!((c.text.as_str(), c.prompt_tokens, c.output_tokens), ("hello world", 9, 2));
        // A reasoning model that spent its budget on reasoning: null content is empty text.
        let c = parse_full(
            &json!({"choices": [{"message": {"role": "assistant", "content": null, "reasoning_content": "hmm"}}], "usage": usage}),
            t,
            9,
        )
        .unwrap();
        assert_eq!((c.text.as_str(), c.output_tokens), ("", 2));
    }

    #[test]
    fn tool_calls_and_finish_reasons_are_read_from_whole_and_streamed_answers() {
        // Whole: `message.tool_calls`, content null.
        let body = json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "get_time", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "chatcmpl-tool-2", "type": "function", "function": {"name": "now", "arguments": {}}},
        ]}, "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 30, "completion_tokens": 20}});
        let c = parse_full(&body, Duration::ZERO, 30).unwrap();
        assert_eq!((c.text.as_str(), c.finish_reason.as_deref()), ("", Some("tool_calls")));
        assert_eq!(
            c.tool_calls,
            [
                ToolCall { id: "chatcmpl-tool-1".into(), name: "get_time".into(), arguments: "{\"city\": \"Paris\"}".into() },
                ToolCall { id: "chatcmpl-tool-2".into(), name: "now".into(), arguments: "{}".into() },
            ]
        );
        // Streamed: a call's fragments joined by `index` (name first, arguments in pieces), two
        // calls interleaved; text before them is the content.
        let mut f = StreamFold::default();
        let chunks = [
            json!({"choices": [{"delta": {"role": "assistant", "content": "Let me look."}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "get_time", "arguments": ""}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1, "id": "b", "type": "function", "function": {"name": "now"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}, {"index": 1, "function": {"arguments": "{}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ];
        for chunk in &chunks {
            f.push(chunk, Duration::ZERO).unwrap();
        }
        assert!(f.finished());
        // The calls' names and arguments are generated text: counted for the stream's cap, and
        // handed to the attempt's meter as they come.
        assert_eq!(f.tool_call_bytes, "get_time".len() + "now".len() + "{\"city\": \"Paris\"}".len() + "{}".len());
        assert_eq!(std::mem::take(&mut f.fresh_tool_text), "get_timenow{\"city\": \"Paris\"}{}");
        let c = f.finish(Duration::ZERO, 30);
        assert_eq!((c.text.as_str(), c.finish_reason.as_deref()), ("Let me look.", Some("tool_calls")));
        let calls: Vec<(&str, &str, &str)> = c.tool_calls.iter().map(|t| (t.id.as_str(), t.name.as_str(), t.arguments.as_str())).collect();
        assert_eq!(calls, [("a", "get_time", "{\"city\": \"Paris\"}"), ("b", "now", "{}")]);
        // A hostile server's index cannot make the answer allocate without bound; a fragment
        // that never named its function is dropped.
        let mut f = StreamFold::default();
        f.push(&json!({"choices": [{"delta": {"tool_calls": [{"index": 4_000_000_000u64, "function": {"name": "x"}}, {"index": 2, "function": {"arguments": "{}"}}]}}]}), Duration::ZERO).unwrap();
        assert!(f.finish(Duration::ZERO, 1).tool_calls.is_empty());
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
        let c = f.finish(Duration::from_millis(10), 99);
        assert_eq!(c.text, "Hello");
        assert_eq!(c.ttft_s, 0.005);
        assert_eq!(c.latency_s, 0.010);
        assert_eq!(c.output_tokens, 2);
        // A stream without usage (llama.cpp): counted by us.
        let mut f = StreamFold::default();
        f.push(&json!({"choices": [{"text": "hello"}]}), Duration::ZERO)
            .unwrap();
        f.push(&json!({"choices": [{"text": " world"}]}), Duration::ZERO)
            .unwrap();
        let c = f.finish(Duration::ZERO, 12);
        assert_eq!((c.text.as_str(), c.prompt_tokens, c.output_tokens), ("hello world", 12, 2));
        // A usage chunk without `completion_tokens`: the streamed answer stands, counted by us.
        let mut f = StreamFold::default();
        f.push(&json!({"choices": [{"text": "hello world"}]}), Duration::ZERO).unwrap();
        f.push(&json!({"choices": [], "usage": {"prompt_tokens": 3}}), Duration::ZERO).unwrap();
        let c = f.finish(Duration::ZERO, 12);
        assert_eq!((c.text.as_str(), c.prompt_tokens, c.output_tokens), ("hello world", 12, 2));
        let mut f = StreamFold::default();
        assert!(
            f.push(&json!({"error": {"message": "boom"}}), Duration::ZERO)
                .is_err()
        );
        assert!(f.push(&json!({"id": 1}), Duration::ZERO).is_err());
    }

    #[test]
    fn status_classes_map_to_error_kinds() {
        let kind = |status, retry, body: &str| status_error("x", status, retry, body).kind();
        assert_eq!(kind(StatusCode::NOT_FOUND, None, ""), "rejected");
        assert_eq!(kind(StatusCode::METHOD_NOT_ALLOWED, None, ""), "rejected");
        // A 413 is a size limit of the server or a proxy before it (the front door's own is
        // larger): the server's, not the client's.
        assert_eq!(kind(StatusCode::PAYLOAD_TOO_LARGE, None, ""), "rejected");
        for invalid in [StatusCode::BAD_REQUEST, StatusCode::UNPROCESSABLE_ENTITY] {
            assert_eq!(kind(invalid, None, "context"), "invalid");
            assert!(!status_error("x", invalid, None, "").retryable());
        }
        assert_eq!(kind(StatusCode::UNAUTHORIZED, None, ""), "auth");
        assert_eq!(kind(StatusCode::FORBIDDEN, None, ""), "auth");
        assert_eq!(kind(StatusCode::BAD_GATEWAY, None, ""), "bad_response");
        let secs = Some(Duration::from_secs(3));
        assert_eq!(
            status_error("x", StatusCode::TOO_MANY_REQUESTS, secs, ""),
            EngineError::Overloaded { message: "x: HTTP 429 Too Many Requests: ".into(), retry_after: secs }
        );
        assert_eq!(kind(StatusCode::TOO_MANY_REQUESTS, None, ""), "overload");
        // 503 is overload only when the server says when to come back.
        assert_eq!(kind(StatusCode::SERVICE_UNAVAILABLE, secs, ""), "overload");
        assert!(matches!(
            status_error("x", StatusCode::SERVICE_UNAVAILABLE, None, "asleep"),
            EngineError::BadResponse(m) if m.contains("asleep")
        ));
        let long = "y".repeat(5000);
        let EngineError::BadResponse(m) =
            status_error("x", StatusCode::INTERNAL_SERVER_ERROR, None, &long)
        else {
            panic!("5xx must be BadResponse");
        };
        assert!(m.len() < 400);
    }

    #[test]
    fn retry_after_is_read_in_seconds_and_capped() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert(RETRY_AFTER, HeaderValue::from_static("0.5"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(500)));
        h.insert(RETRY_AFTER, HeaderValue::from_static("86400"));
        assert_eq!(retry_after(&h), Some(MAX_RETRY_AFTER));
        h.insert(RETRY_AFTER, HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"));
        assert_eq!(retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("-3"));
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn versions_choose_the_sleep_call() {
        let v = |s: &str| ServerFacts { version: Some(s.into()), ..ServerFacts::default() }.version_number();
        assert_eq!(v("0.10.2"), Some((0, 10)));
        assert_eq!(v("v0.17.1"), Some((0, 17)));
        assert_eq!(v("0.11.0rc1"), Some((0, 11)));
        assert_eq!(v("dev"), None);
        let e = HttpEngine::new("vllm", "http://h:1", "m", HttpOptions::default()).unwrap();
        assert!(!e.sleep_drains());
        e.update_facts(|f| f.version = Some("0.17.0".into()));
        assert!(e.sleep_drains());
        e.update_facts(|f| f.version = Some("0.10.2".into()));
        assert!(!e.sleep_drains());
    }

    #[test]
    fn request_ids_are_uuids_unique_per_send() {
        assert_eq!(uuid_of(0x0123_4567_89ab, 0x00a_00b, 42), "01234567-89ab-400a-800b-00000000002a");
        let (a, b) = (request_uuid(42), request_uuid(42));
        assert_ne!(a, b, "two sends of one call get two ids");
        for id in [a, b] {
            let groups: Vec<usize> = id.split('-').map(str::len).collect();
            assert_eq!(groups, [8, 4, 4, 4, 12]);
            assert!(id.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
            assert!(id.ends_with("-00000000002a"), "{id}");
        }
    }

    #[test]
    fn served_context_from_vllm_and_llama_cpp_model_cards() {
        assert_eq!(served_context(&json!({"id": "m", "max_model_len": 40960})), Some(40960));
        assert_eq!(served_context(&json!({"id": "m", "meta": {"n_ctx_train": 512}})), Some(512));
        assert_eq!(served_context(&json!({"id": "m"})), None);
    }

    #[test]
    fn prompts_over_the_served_context_are_refused_and_max_tokens_clamped() {
        let e = HttpEngine::new("vllm", "http://h:1", "m", HttpOptions::default()).unwrap();
        let mut req = LlmRequest {
            id: 3,
            model: "m".into(),
            prompt: "p".into(),
            prompt_tokens: 100,
            max_tokens: 8192,
            server_default_limit: false,
            emulated_output: None,
            enable_thinking: false,
            stream: false,
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
        };
        // Unknown context: sent as is.
        e.fit(&mut req).unwrap();
        assert_eq!(req.max_tokens, 8192);
        e.update_facts(|f| f.max_model_len = Some(1000));
        e.fit(&mut req).unwrap();
        assert_eq!(req.max_tokens, 900);
        req.prompt_tokens = 1000;
        let err = e.fit(&mut req).unwrap_err();
        assert!(matches!(&err, EngineError::Rejected(m) if m.contains("1000 tokens does not fit the served context of 1000")), "{err}");
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
            prompt_tokens: 10,
            max_tokens: 7,
            server_default_limit: false,
            emulated_output: Some("out".into()),
            enable_thinking: false,
            stream: true,
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
        };
        // Not known to be `switchyard emulate`: the emulated output is never sent.
        let b = e.request_body(&req);
        assert!(b.get("switchyard").is_none(), "{b}");
        e.update_facts(|f| f.emulator = true);
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
            ..req.clone()
        });
        assert_eq!(b["messages"][0]["content"], "p");
        assert_eq!(b["chat_template_kwargs"]["enable_thinking"], false);
        assert!(b.get("switchyard").is_none() && b.get("stream_options").is_none());
        assert!(b.get("max_tokens").is_some(), "a limit the caller gave is sent");
        // A caller without a limit leaves it to the server (its own count of the room).
        let no_limit = chat.request_body(&LlmRequest { server_default_limit: true, stream: false, enable_thinking: false, ..req.clone() });
        assert!(no_limit.get("max_tokens").is_none(), "{no_limit}");
        // An external client's tools, choice and stop strings go with its messages.
        let tool = json!({"type": "function", "function": {"name": "f"}});
        let with_tools = LlmRequest {
            messages: Some(vec![json!({"role": "user", "content": "hi"})]),
            tools: vec![tool.clone()],
            tool_choice: Some(json!("required")),
            parallel_tool_calls: Some(false),
            stop: vec!["END".into()],
            response_format: Some(json!({"type": "json_object"})),
            ..req.clone()
        };
        let b = chat.request_body(&with_tools);
        assert_eq!((&b["tools"], &b["tool_choice"], &b["stop"]), (&json!([tool]), &json!("required"), &json!(["END"])), "{b}");
        assert_eq!((&b["parallel_tool_calls"], &b["response_format"]), (&json!(false), &json!({"type": "json_object"})), "{b}");
        // The emulated pool's completions engines send a client's messages to the chat API.
        let b = e.request_body(&with_tools);
        assert_eq!((b["messages"][0]["content"].as_str(), b["tools"][0]["function"]["name"].as_str()), (Some("hi"), Some("f")), "{b}");
        // Without any, none of the fields.
        let b = chat.request_body(&req);
        assert!(["tools", "tool_choice", "parallel_tool_calls", "stop", "response_format"].iter().all(|f| b.get(*f).is_none()), "{b}");
        assert!(HttpEngine::new("vllm", "ftp://h", "m", HttpOptions::default()).is_err());
    }
}
