//! `OpenAiEngine`: a fixed OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp or a hosted
//! API) at a base URL with an API key and headers. No lifecycle control: residency is taken as
//! given — `load` checks that the endpoint answers and serves the mapped model (reading its
//! context length where the server reports it), and `sleep` / `wake` / `unload` are
//! `Unsupported`. The report counts no loads and no GPU time for it (`Engine::fixed`).
//!
//! Requests go to the chat API by default, or to the completions API with `api: completions`
//! (the prompt then in Qwen3's chat template, rendered by us). Everything else — the error
//! kinds (401 → `Auth`, 429 with `Retry-After` → `Overloaded`, …), the stall probe and
//! deadline, answers without `usage`, the emulated output sent only to `switchyard emulate` —
//! is the [`HttpEngine`]'s, built as a fixed endpoint. (An earlier version used
//! `async-openai`; its errors carry no response headers, so `Retry-After` could not be
//! honoured, and it retried 429s and 5xx behind the planner's back.)
//!
//! Telemetry: a vLLM `/metrics` next to the API when there is one; after a 404 it is never
//! asked for again.
//!
//! Depends on the HTTP engine; not on the planner or actors.

use super::http::{HttpEngine, HttpOptions};
use crate::live::engine::{
    Completion, Engine, EngineError, EngineFuture, EngineTelemetry, LlmRequest,
};

/// A fixed OpenAI-compatible endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiEngine {
    http: HttpEngine,
}

impl OpenAiEngine {
    /// An engine for `api_base` (e.g. `http://host:8000/v1`) and `model`.
    pub fn new(api_base: &str, model: &str, options: HttpOptions) -> Result<Self, EngineError> {
        Ok(OpenAiEngine { http: HttpEngine::fixed_endpoint("openai", api_base, model, options)? })
    }

    pub fn api_base(&self) -> &str {
        self.http.api_base()
    }

    /// The HTTP engine underneath (what the server said about itself, request bodies).
    pub fn http(&self) -> &HttpEngine {
        &self.http
    }
}

impl Engine for OpenAiEngine {
    fn kind(&self) -> &'static str {
        "openai"
    }

    fn load(&self) -> EngineFuture<'_, ()> {
        self.http.load()
    }

    fn sleep(&self, level: u8) -> EngineFuture<'_, ()> {
        self.http.sleep(level)
    }

    fn wake(&self) -> EngineFuture<'_, ()> {
        self.http.wake()
    }

    fn unload(&self) -> EngineFuture<'_, ()> {
        self.http.unload()
    }

    fn submit(&self, request: LlmRequest) -> EngineFuture<'_, Completion> {
        self.http.submit(request)
    }

    fn telemetry(&self) -> EngineFuture<'_, EngineTelemetry> {
        self.http.telemetry()
    }

    fn probe(&self) -> EngineFuture<'_, ()> {
        self.http.probe()
    }

    fn endpoint(&self) -> String {
        self.http.endpoint()
    }

    fn fixed(&self) -> bool {
        true
    }
}
