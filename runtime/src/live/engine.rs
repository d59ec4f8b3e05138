//! The `Engine` interface: one GPU replica as the live runtime drives it (DESIGN.md, Engines).
//!
//! A replica actor owns one `Box<dyn Engine>` and drives it through its lifecycle (load, sleep,
//! wake, unload), submits requests and polls telemetry. Implementations: `emulated` over HTTP
//! (a `switchyard emulate` server), `vllm` (a managed `vllm serve` child process, or in tests a
//! `switchyard emulate` child through the same command template) and `openai` (a fixed
//! OpenAI-compatible endpoint, no lifecycle control). Engines do I/O; they decide nothing.
//!
//! Depends on nothing else in the crate; the engines (`engines/`) and the actors depend on it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A boxed future, so that `Engine` is object-safe.
pub type EngineFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, EngineError>> + Send + 'a>>;

/// How an invalid request's failure reads ([`EngineError::Invalid`]'s message starts so): the
/// front door answers such a call with a 400, not a 502 that clients retry.
pub const INVALID_PREFIX: &str = "request invalid: ";

/// Why an engine call failed. Each kind asks for its own reaction (the replica actor's
/// fault policy): see [`EngineError::kind`].
#[derive(Debug, Error, Clone, PartialEq)]
pub enum EngineError {
    /// Connection refused / reset, a stream cut short, a server that stopped answering its
    /// health probe, a process gone: the replica may be dead.
    #[error("engine unreachable: {0}")]
    Unreachable(String),
    /// The call ran past its deadline while the server still answered its health probe: a
    /// slow request, not a dead replica.
    #[error("request timed out: {0}")]
    TimedOut(String),
    /// HTTP 401 / 403: the API key (or its absence) is refused. Not retryable.
    #[error("authentication failed: {0}")]
    Auth(String),
    /// HTTP 429 (or 503 with `Retry-After`): overloaded; retry after `retry_after` (the
    /// server's `Retry-After`) or an exponential backoff with jitter.
    #[error("server overloaded: {message}")]
    Overloaded { message: String, retry_after: Option<std::time::Duration> },
    /// HTTP 5xx or an unparsable answer.
    #[error("engine answered badly: {0}")]
    BadResponse(String),
    /// HTTP 4xx but the two below: the server will not take the request (not retryable) —
    /// a model it does not serve, a method or path it lacks — or it cannot fit the server (a
    /// prompt over the context the server says it serves).
    #[error("request rejected: {0}")]
    Rejected(String),
    /// HTTP 400 or 422: the server says the request itself is invalid — a parameter it
    /// refuses, a tool schema its guided decoding cannot compile (not retryable: the same
    /// request fails again). The front door passes it to its client as a 400.
    #[error("request invalid: {0}")]
    Invalid(String),
    /// The server does not serve what the pool file says (the mapped model is not in its
    /// `/v1/models`): a configuration error, not retryable.
    #[error("misconfigured: {0}")]
    Misconfigured(String),
    /// The engine cannot do this (e.g. lifecycle control on a fixed endpoint).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Starting or stopping the engine failed.
    #[error("lifecycle: {0}")]
    Lifecycle(String),
    /// Nobody waits for the answer any more (the front door's client went away): the call was
    /// abandoned, and its connection to the server closed so that the server aborts it.
    #[error("cancelled: {0}")]
    Cancelled(String),
}

impl EngineError {
    /// Whether another attempt (here or on another replica) may succeed.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            EngineError::Unreachable(_)
                | EngineError::BadResponse(_)
                | EngineError::TimedOut(_)
                | EngineError::Overloaded { .. }
        )
    }

    /// A short name of the kind, for notes, traces and tests.
    pub fn kind(&self) -> &'static str {
        match self {
            EngineError::Unreachable(_) => "unreachable",
            EngineError::TimedOut(_) => "timeout",
            EngineError::Auth(_) => "auth",
            EngineError::Overloaded { .. } => "overload",
            EngineError::BadResponse(_) => "bad_response",
            EngineError::Rejected(_) => "rejected",
            EngineError::Invalid(_) => "invalid",
            EngineError::Misconfigured(_) => "misconfigured",
            EngineError::Unsupported(_) => "unsupported",
            EngineError::Lifecycle(_) => "lifecycle",
            EngineError::Cancelled(_) => "cancelled",
        }
    }
}

/// One LLM call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmRequest {
    /// Unique per call (used as the OpenAI `user`/request id and in traces).
    pub id: u64,
    /// The served model name.
    pub model: String,
    pub prompt: String,
    /// The prompt's length in Qwen3 tokens as the server will count it (the chat template
    /// with the call's thinking mode, `tokens::encode_chat_mode`): checked against the served
    /// context before sending, and the prompt count of an answer without `usage`.
    #[serde(default)]
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    /// The caller gave no output limit (a front-door chat call without `max_tokens`):
    /// `max_tokens` is then what the served context leaves after the prompt — what the planner
    /// plans with — and the request body carries none, so the server applies its own default
    /// (vLLM's is that same room, counted with its own tokenizer: a count of ours one token
    /// short of the server's would otherwise be refused as over the context).
    #[serde(default)]
    pub server_default_limit: bool,
    /// For emulated engines only: the text the emulated model returns (the workload's
    /// responder output, computed by the session like the simulator does). An engine sends it
    /// (as `"switchyard": {"output": ...}`) only to a server that identified itself as
    /// `switchyard emulate` at load (its `/version`); never to vLLM or any other server.
    pub emulated_output: Option<String>,
    /// Qwen3 thinking mode (`chat_template_kwargs.enable_thinking`; for the completions API,
    /// the chat template rendered with or without the empty thinking block).
    #[serde(default)]
    pub enable_thinking: bool,
    /// Stream the answer (time to first token is measured either way).
    pub stream: bool,
    /// Wall seconds the call may take before it counts as timed out (derived by the planner
    /// actor from the predicted duration); `None`: the engine's `request_timeout_s`.
    #[serde(default)]
    pub deadline_s: Option<f64>,
    /// Chat messages of an external client (the front door), sent as they are instead of one
    /// user message holding `prompt` (`prompt` is then their rendering in Qwen3's template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<serde_json::Value>>,
    /// `prompt` is a raw completion prompt (the front door's `/v1/completions`), sent as it is
    /// rather than inside the chat template.
    #[serde(default)]
    pub raw_prompt: bool,
    /// An external client's tool definitions (OpenAI's `tools`), sent with its `messages`; the
    /// server renders them into the prompt and may answer with tool calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<serde_json::Value>,
    /// The client's `tool_choice` (`"none"`, `"auto"`, `"required"` or a named function), as
    /// it is; absent: the server's default (`auto` with tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<serde_json::Value>,
    /// The client's `parallel_tool_calls`, sent with its tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// An external client's stop strings: the server ends the answer before the first one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// An external client's `response_format` (structured output), sent with its messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<serde_json::Value>,
    /// Where the answer's text goes as it arrives, and how the engine learns that its caller
    /// went away (then it abandons the call: [`EngineError::Cancelled`]).
    #[serde(skip)]
    pub sink: TokenSink,
    /// What the engine has computed for the attempt in progress, as far as its answer shows
    /// (filled by the engine as the answer streams in; read by the replica actor when an
    /// attempt fails or is abandoned, [`CallMeter::take`]).
    #[serde(skip)]
    pub meter: CallMeter,
}

/// The caller's end of a streamed answer: text pieces in order as the server sends them. An
/// empty sink (the default: the runtime's own sessions) takes nothing and never closes. Its
/// clones share whether any text reached the caller: an answer that did cannot be retried (a
/// new attempt samples anew, and the caller would get the first attempt's text, then the
/// second's).
#[derive(Clone, Default)]
pub struct TokenSink(Option<tokio::sync::mpsc::UnboundedSender<String>>, Arc<AtomicBool>);

impl TokenSink {
    /// A sink that feeds `tx`.
    pub fn new(tx: tokio::sync::mpsc::UnboundedSender<String>) -> Self {
        TokenSink(Some(tx), Arc::default())
    }

    /// Whether some text of the answer has reached the caller.
    pub fn delivered(&self) -> bool {
        self.1.load(Ordering::Relaxed)
    }

    /// Whether a caller listens.
    pub fn is_attached(&self) -> bool {
        self.0.is_some()
    }

    /// Hand over a piece of text; false when the caller went away.
    pub fn send(&self, text: &str) -> bool {
        match &self.0 {
            Some(_) if text.is_empty() => true,
            Some(tx) => {
                let sent = tx.send(text.to_string()).is_ok();
                if sent {
                    self.1.store(true, Ordering::Relaxed);
                }
                sent
            }
            None => true,
        }
    }

    /// Whether the caller went away.
    pub fn is_closed(&self) -> bool {
        self.0.as_ref().is_some_and(|tx| tx.is_closed())
    }

    /// Resolves when the caller went away (never for an empty sink).
    pub async fn closed(&self) {
        match &self.0 {
            Some(tx) => tx.closed().await,
            None => std::future::pending().await,
        }
    }
}

impl PartialEq for TokenSink {
    /// Sinks are plumbing, not part of what a request asks for.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for TokenSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_attached() { "TokenSink(attached)" } else { "TokenSink(none)" })
    }
}

/// What one attempt of a call is known to have cost the engine before it ended: whether its
/// first token came (so its prompt was prefilled) and the output tokens streamed so far
/// (Qwen3's tokenizer over each piece). An engine fills it as the answer arrives — so it holds
/// even when the attempt's task is dropped midway — and the replica actor takes it when the
/// attempt fails, is abandoned or is superseded: those tokens were computed and thrown away.
/// A lower bound: an attempt that ended before its first token counts nothing (the engine
/// may or may not have prefilled it), and an unstreamed answer shows nothing until it is
/// whole. Clones share the counts.
#[derive(Clone, Default)]
pub struct CallMeter(Arc<MeterCounts>);

#[derive(Default)]
struct MeterCounts {
    first_token: AtomicBool,
    output_tokens: AtomicU64,
    /// Called when an attempt's first token arrives (the live trace's `first_token` event).
    on_first_token: Option<Box<dyn Fn() + Send + Sync>>,
}

/// What [`CallMeter::take`] read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttemptCost {
    /// The attempt's first token came: its prompt was computed.
    pub prefilled: bool,
    pub output_tokens: u64,
}

impl CallMeter {
    /// A meter that calls `hook` as each attempt's first token arrives (once per attempt: an
    /// attempt begins at [`Self::take`]).
    pub fn with_first_token_hook(hook: impl Fn() + Send + Sync + 'static) -> Self {
        CallMeter(Arc::new(MeterCounts { on_first_token: Some(Box::new(hook)), ..MeterCounts::default() }))
    }

    /// The attempt's first token arrived (an engine may say so at every piece after it).
    pub fn first_token(&self) {
        if !self.0.first_token.swap(true, Ordering::Relaxed)
            && let Some(hook) = &self.0.on_first_token
        {
            hook();
        }
    }

    /// `n` more output tokens arrived.
    pub fn add_output(&self, n: u64) {
        self.0.output_tokens.fetch_add(n, Ordering::Relaxed);
    }

    /// The counts so far, reset for the next attempt.
    pub fn take(&self) -> AttemptCost {
        AttemptCost {
            prefilled: self.0.first_token.swap(false, Ordering::Relaxed),
            output_tokens: self.0.output_tokens.swap(0, Ordering::Relaxed),
        }
    }
}

impl PartialEq for CallMeter {
    /// Meters are plumbing, not part of what a request asks for.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for CallMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.0;
        write!(f, "CallMeter(first_token: {}, output_tokens: {})", c.first_token.load(Ordering::Relaxed), c.output_tokens.load(Ordering::Relaxed))
    }
}

/// The result of one LLM call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    pub text: String,
    pub prompt_tokens: u32,
    pub cached_prompt_tokens: u32,
    pub output_tokens: u32,
    /// Seconds from submission to the first token and to the last.
    pub ttft_s: f64,
    pub latency_s: f64,
    /// The function calls the answer makes (a chat answer to a request with `tools`), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Why the server ended the answer (`stop`, `length`, `tool_calls`), where it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

/// One function call of an answer, as OpenAI's `tool_calls` carry it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The server's id of the call (the client's tool result names it in `tool_call_id`).
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments, as JSON text.
    pub arguments: String,
}

/// What a replica reports (scraped from vLLM's `/metrics`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineTelemetry {
    pub running: f64,
    pub waiting: f64,
    /// `vllm:kv_cache_usage_perc`, 0..1.
    pub kv_cache_usage: f64,
    pub prefix_cache_queries: f64,
    pub prefix_cache_hits: f64,
    pub sleeping: bool,
    /// Tokens the KV cache holds in all (`vllm:cache_config_info`'s `num_gpu_blocks` ×
    /// `block_size`, summed over engines); `None` when the server does not say.
    #[serde(default)]
    pub kv_capacity_tokens: Option<f64>,
}

/// One GPU replica's engine.
pub trait Engine: Send + Sync {
    /// `emulated`, `vllm` or `openai`.
    fn kind(&self) -> &'static str;
    /// Bring the deployment up (start the process / check the endpoint) and wait until healthy.
    fn load(&self) -> EngineFuture<'_, ()>;
    /// vLLM sleep mode: level 1 offloads weights to host memory, level 2 discards them.
    fn sleep(&self, level: u8) -> EngineFuture<'_, ()>;
    fn wake(&self) -> EngineFuture<'_, ()>;
    /// Stop serving and free the device (kill the process group; no orphans).
    fn unload(&self) -> EngineFuture<'_, ()>;
    /// Run one request to completion.
    fn submit(&self, request: LlmRequest) -> EngineFuture<'_, Completion>;
    fn telemetry(&self) -> EngineFuture<'_, EngineTelemetry>;
    /// Is the server alive (its health endpoint answers, its process runs)? Asked after a
    /// call lost its connection, to tell a dropped request from a dead replica. Default:
    /// `Unsupported` — the engine cannot tell, and a lost connection is taken as a dead
    /// replica (restarted in place).
    fn probe(&self) -> EngineFuture<'_, ()> {
        let kind = self.kind();
        Box::pin(async move { Err(EngineError::Unsupported(format!("a `{kind}` engine has no liveness probe"))) })
    }
    /// Where the engine is reached (for messages): a base URL, or the managed command.
    fn endpoint(&self) -> String {
        self.kind().to_string()
    }
    /// A fixed endpoint: residency and GPU time are not ours to see (no loads, no unloads;
    /// the report does not count GPU time for it).
    fn fixed(&self) -> bool {
        false
    }
}
