//! `OpenAiEngine`: a fixed OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp or a hosted
//! API) through `async-openai` with a custom base URL, API key and headers. No lifecycle
//! control: residency is taken as given — `load` only checks that the endpoint answers
//! (`GET {base}/models`), and `sleep` / `wake` / `unload` are `Unsupported`.
//!
//! Requests go to the chat API (`create_byot` / `create_stream_byot` with JSON values, so the
//! vLLM-only `prompt_tokens_details` and our `switchyard.output` pass through). A hosted API
//! rejects unknown fields: the live runtime must not set `emulated_output` for such endpoints.
//!
//! Retries: `async-openai` 0.43 silently retries 429, 5xx and connection errors three times
//! with backoff (its default `OpenAIRetryLayer`), which would hide overload and dead replicas
//! from the planner. The client is built with `with_http_service(ReqwestService)` (the
//! `middleware` feature), i.e. with no retry layer: one call, one HTTP request.
//!
//! Telemetry: a `/metrics` next to the API (vLLM's, scraped with our parser) when there is
//! one, else `Unsupported`.
//!
//! Depends on the HTTP engine's helpers and the metrics parser; not on the planner or actors.

use std::time::Instant;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::ReqwestService;
use futures::StreamExt;
use reqwest::header::HeaderName;
use serde_json::{Value, json};

use super::http::{
    HttpEngine, HttpOptions, StreamFold, build_client, parse_full, status_error, transport_error,
};
use crate::live::engine::{
    Completion, Engine, EngineError, EngineFuture, EngineTelemetry, LlmRequest,
};

/// A fixed OpenAI-compatible endpoint.
#[derive(Debug)]
pub struct OpenAiEngine {
    client: Client<OpenAIConfig>,
    /// Plain client with the same key and headers, for the reachability probe.
    probe: reqwest::Client,
    /// For `/metrics` next to the API.
    metrics: HttpEngine,
    api_base: String,
    model: String,
}

/// Maps an `async-openai` error to the engine's kinds.
fn map_error(what: &str, e: OpenAIError) -> EngineError {
    match e {
        OpenAIError::Reqwest(r) => match r.status() {
            Some(status) => status_error(what, status, &r.to_string()),
            None => transport_error(what, &r),
        },
        OpenAIError::ApiError(api) => {
            status_error(what, api.status_code, &api.api_error.to_string())
        }
        OpenAIError::JSONDeserialize(err, body) => {
            EngineError::BadResponse(format!("{what}: unparsable answer ({err}): {body}"))
        }
        OpenAIError::StreamError(s) => EngineError::BadResponse(format!("{what}: stream: {s}")),
        OpenAIError::InvalidArgument(m) => EngineError::Rejected(format!("{what}: {m}")),
        other => EngineError::BadResponse(format!("{what}: {other}")),
    }
}

impl OpenAiEngine {
    /// An engine for `api_base` (e.g. `http://host:8000/v1`) and `model`.
    pub fn new(api_base: &str, model: &str, options: HttpOptions) -> Result<Self, EngineError> {
        let api_base = api_base.trim_end_matches('/').to_string();
        let mut config = OpenAIConfig::new()
            .with_api_base(api_base.clone())
            // Never forward an ambient OPENAI_API_KEY to a configured endpoint.
            .with_api_key(options.api_key.clone().unwrap_or_default());
        for (k, v) in &options.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| EngineError::Lifecycle(format!("header name `{k}`: {e}")))?;
            config = config
                .with_header(name, v.as_str())
                .map_err(|e| EngineError::Lifecycle(format!("header `{k}`: {e}")))?;
        }
        let bare = build_client(&HttpOptions {
            api_key: None,
            headers: Default::default(),
            ..options.clone()
        })?;
        let client =
            Client::build(bare.clone(), config).with_http_service(ReqwestService::new(bare));
        Ok(OpenAiEngine {
            client,
            probe: build_client(&options)?,
            metrics: HttpEngine::new("openai", &api_base, model, options)?,
            api_base,
            model: model.to_string(),
        })
    }

    pub fn api_base(&self) -> &str {
        &self.api_base
    }

    fn body(&self, request: &LlmRequest) -> Value {
        let model = if request.model.is_empty() {
            &self.model
        } else {
            &request.model
        };
        let mut body = json!({
            "model": model,
            "messages": [{ "role": "user", "content": request.prompt }],
            "max_tokens": request.max_tokens,
            "stream": request.stream,
        });
        if request.stream {
            body["stream_options"] = json!({ "include_usage": true });
        }
        if let Some(output) = &request.emulated_output {
            body["switchyard"] = json!({ "output": output });
        }
        body
    }

    /// One chat completion (one HTTP request).
    pub async fn complete(&self, request: &LlmRequest) -> Result<Completion, EngineError> {
        let what = format!(
            "request {} to {}/chat/completions",
            request.id, self.api_base
        );
        let body = self.body(request);
        let started = Instant::now();
        if !request.stream {
            let answer: Value = self
                .client
                .chat()
                .create_byot(body)
                .await
                .map_err(|e| map_error(&what, e))?;
            return parse_full(&answer, started.elapsed());
        }
        let mut stream = self
            .client
            .chat()
            .create_stream_byot::<Value, Value>(body)
            .await
            .map_err(|e| map_error(&what, e))?;
        let mut fold = StreamFold::default();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| map_error(&what, e))?;
            fold.push(&chunk, started.elapsed())?;
        }
        fold.finish(started.elapsed())
    }

    /// `GET {base}/models`: any answer but 4xx/5xx means reachable.
    pub async fn check_reachable(&self) -> Result<(), EngineError> {
        let what = format!("GET {}/models", self.api_base);
        let response = self
            .probe
            .get(format!("{}/models", self.api_base))
            .send()
            .await
            .map_err(|e| transport_error(&what, &e))?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            let body = response.text().await.unwrap_or_default();
            Err(status_error(&what, status, &body))
        }
    }

    async fn scrape_telemetry(&self) -> Result<EngineTelemetry, EngineError> {
        match self.metrics.scrape().await {
            Ok(m) => Ok(m.telemetry()),
            Err(EngineError::Rejected(m)) => Err(EngineError::Unsupported(format!(
                "the endpoint exposes no Prometheus metrics ({m})"
            ))),
            Err(e) => Err(e),
        }
    }
}

fn unsupported(what: &str) -> EngineFuture<'_, ()> {
    let message = format!("{what}: an openai endpoint is fixed (no lifecycle control)");
    Box::pin(async move { Err(EngineError::Unsupported(message)) })
}

impl Engine for OpenAiEngine {
    fn kind(&self) -> &'static str {
        "openai"
    }

    fn load(&self) -> EngineFuture<'_, ()> {
        Box::pin(self.check_reachable())
    }

    fn sleep(&self, _level: u8) -> EngineFuture<'_, ()> {
        unsupported("sleep")
    }

    fn wake(&self) -> EngineFuture<'_, ()> {
        unsupported("wake")
    }

    fn unload(&self) -> EngineFuture<'_, ()> {
        unsupported("unload")
    }

    fn submit(&self, request: LlmRequest) -> EngineFuture<'_, Completion> {
        Box::pin(async move { self.complete(&request).await })
    }

    fn telemetry(&self) -> EngineFuture<'_, EngineTelemetry> {
        Box::pin(self.scrape_telemetry())
    }
}
