//! The `Engine` interface: one GPU replica as the live runtime drives it (DESIGN.md, Engines).
//!
//! A replica actor owns one `Box<dyn Engine>` and drives it through its lifecycle (load, sleep,
//! wake, unload), submits requests and polls telemetry. Implementations: `emulated` over HTTP
//! (a `switchyard emulate` server), `vllm` (a managed `vllm serve` child process, or in tests a
//! `switchyard emulate` child through the same command template) and `openai` (a fixed
//! OpenAI-compatible endpoint, no lifecycle control). Engines do I/O; they decide nothing.

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A boxed future, so that `Engine` is object-safe.
pub type EngineFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, EngineError>> + Send + 'a>>;

/// Why an engine call failed. `retryable` errors may succeed on another try or replica.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum EngineError {
    /// Connection refused / reset, timeout, process gone: the replica may be dead.
    #[error("engine unreachable: {0}")]
    Unreachable(String),
    /// HTTP 5xx or an unparsable answer.
    #[error("engine answered badly: {0}")]
    BadResponse(String),
    /// HTTP 4xx: the request itself is wrong (not retryable).
    #[error("request rejected: {0}")]
    Rejected(String),
    /// The engine cannot do this (e.g. lifecycle control on a fixed endpoint).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Starting or stopping the engine failed.
    #[error("lifecycle: {0}")]
    Lifecycle(String),
}

impl EngineError {
    pub fn retryable(&self) -> bool {
        matches!(self, EngineError::Unreachable(_) | EngineError::BadResponse(_))
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
    pub max_tokens: u32,
    /// For emulated engines only: the text the emulated model returns (the workload's
    /// responder output, computed by the session like the simulator does). Sent to
    /// `switchyard emulate` in the request body as `"switchyard": {"output": ...}`; a real
    /// vLLM ignores the unknown field and generates its own text.
    pub emulated_output: Option<String>,
    /// Qwen3 thinking mode (`chat_template_kwargs.enable_thinking`; for the completions API,
    /// the chat template rendered with or without the empty thinking block).
    #[serde(default)]
    pub enable_thinking: bool,
    /// Stream the answer (time to first token is measured either way).
    pub stream: bool,
}

/// The result of one LLM call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    pub text: String,
    pub prompt_tokens: u32,
    pub cached_prompt_tokens: u32,
    pub output_tokens: u32,
    /// Seconds from submission to the first token and to the last.
    pub ttft_s: f64,
    pub latency_s: f64,
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
}
