//! The request side of the emulate server's OpenAI-compatible API, as vLLM 0.10.2–0.12's
//! `vllm/entrypoints/openai/protocol.py` and `SamplingParams._verify_args` have it: the request
//! bodies, the validation of the sampling parameters (a bad value is a 400 whose `param` names
//! the field), vLLM's error body `{"error": {"message", "type", "param", "code"}}` with the
//! integer HTTP status as `code` (`ErrorInfo` since vLLM 0.10), and the shaping of an emulated
//! output by `max_tokens`, `min_tokens`, `ignore_eos`, `stop` and `stop_token_ids`.
//!
//! Tool calling, as vLLM 0.10.2 launched with `--enable-auto-tool-choice --tool-call-parser
//! hermes` (Qwen's setup for Qwen3): `tools` and `tool_choice` validated as
//! `ChatCompletionRequest.check_tool_usage` does ([`check_tools`]), the emulated model's tool
//! call ([`ToolRequest::plan`], [`PlannedCall`]: the text Qwen3 writes for it) and the reading
//! of a generated answer as vLLM's parsers read it ([`read_tool_output`]: the hermes parser for
//! `auto`, the guided JSON of a named or `required` choice).
//!
//! Owns no state. Depends on `crate::tokens` and serde/axum types only; must not depend on the
//! replica, the driver or the metrics.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use thiserror::Error;

use crate::tokens;

/// The default `max_tokens` of `/v1/completions` (vLLM's `CompletionRequest.max_tokens = 16`,
/// as OpenAI's API). Chat requests default to what the context leaves, as vLLM does.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;

/// Length of the filler answer of a request that neither carries a `switchyard` output nor
/// sets a limit (a chat request without `max_tokens`): the emulated model then ends its answer
/// (its end-of-sequence token) after this many tokens, so that a client that sets no limit
/// gets an answer of a plausible length instead of one running to the context limit. With an
/// explicit `max_tokens` the filler runs to it (finish reason `length`), the way benchmarks
/// use vLLM (`ignore_eos`).
pub const FILLER_EOS_TOKENS: u32 = 256;

/// Token ids the filler output cycles through: the BPE encoding of this text.
pub const FILLER_TEXT: &str = " The emulated replica generates this deterministic filler text \
    because the request carried no switchyard output.";

/// An error answered in vLLM's shape.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    /// vLLM's `type` (`BadRequestError`, `NotFoundError`, ...).
    pub kind: &'static str,
    pub param: Option<String>,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            param: None,
            message: message.into(),
        }
    }

    /// A 400 about the request field `param`.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::bad_request(message)
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "BadRequestError", message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
            message,
        )
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "NotFoundError", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            message,
        )
    }

    /// vLLM's `ErrorResponse` body (also the data of a stream's error event).
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status.as_u16(),
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

/// The `"switchyard"` extension of a request body.
#[derive(Debug, Default, Deserialize)]
pub struct SwitchyardExt {
    #[serde(default)]
    pub output: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// The sampling fields both completion APIs share (vLLM's `SamplingParams` plus the stream
/// and `switchyard` fields). Numbers are read wide so that an out-of-range value is reported
/// by the validation (with its `param`) rather than as a parse error.
#[derive(Debug, Default, Deserialize)]
pub struct Sampling {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub n: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub min_p: Option<f64>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub repetition_penalty: Option<f64>,
    #[serde(default)]
    pub stop: Option<StopField>,
    #[serde(default)]
    pub stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub include_stop_str_in_output: bool,
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub min_tokens: Option<i64>,
    #[serde(default)]
    pub prompt_logprobs: Option<i64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub switchyard: Option<SwitchyardExt>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionBody {
    pub prompt: PromptField,
    /// Structured output, as for chat (checked by [`check_response_format`]).
    #[serde(default)]
    pub response_format: Option<Value>,
    #[serde(default)]
    pub echo: Option<bool>,
    #[serde(default)]
    pub logprobs: Option<i64>,
    #[serde(default)]
    pub suffix: Option<String>,
    #[serde(default)]
    pub best_of: Option<i64>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(default)]
    pub text: Option<String>,
}

/// A tool call of an assistant message (`{"id", "type": "function", "function": {"name",
/// "arguments"}}`); its `id` and `type` are not rendered.
#[derive(Debug, Deserialize)]
pub struct MessageToolCall {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    pub function: MessageFunction,
}

#[derive(Debug, Deserialize)]
pub struct MessageFunction {
    pub name: String,
    /// The arguments as JSON text (OpenAI's wire format) or as a JSON object.
    #[serde(default)]
    pub arguments: Option<Value>,
}

impl MessageFunction {
    /// The arguments as JSON text: a string as it is, an object (or any other value)
    /// serialised, none as `{}`.
    fn arguments_text(&self) -> String {
        match &self.arguments {
            None | Some(Value::Null) => "{}".to_string(),
            Some(Value::String(text)) => text.clone(),
            Some(other) => other.to_string(),
        }
    }
}

/// vLLM 0.10.2 takes an assistant message's tool call only with its `id` and `type` (its
/// pydantic message types) and with `arguments` that are JSON text (`chat_utils` parses them
/// with `json.loads` before rendering): anything else is its 400, here too.
pub fn check_message_tool_calls(messages: &[ChatMessage]) -> Result<(), ApiError> {
    for (i, m) in messages.iter().enumerate() {
        for (k, call) in m.tool_calls.iter().flatten().enumerate() {
            let parsed = match &call.function.arguments {
                Some(Value::String(text)) => serde_json::from_str::<Value>(text).is_ok(),
                _ => false,
            };
            if call.id.is_none() || call.kind.is_none() || !parsed {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}].tool_calls[{k}]: a tool call needs an `id`, a `type` and \
                     `function.arguments` that are JSON text"
                )));
            }
        }
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// An assistant message's tool calls (rendered in the prompt as Qwen3's template does).
    #[serde(default)]
    pub tool_calls: Option<Vec<MessageToolCall>>,
    /// A tool message's call id: accepted and ignored (Qwen3's template does not render it).
    #[serde(default)]
    #[allow(dead_code)]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// The message as Qwen3's chat template reads it: its role, the text parts of a
    /// multi-part content concatenated (no content is empty text), its tool calls.
    pub fn into_turn(self) -> tokens::ChatTurn {
        let tool_calls = self
            .tool_calls
            .unwrap_or_default()
            .iter()
            .map(|call| tokens::TurnToolCall {
                name: call.function.name.clone(),
                arguments: call.function.arguments_text(),
            })
            .collect();
        let content = match self.content {
            None => String::new(),
            Some(MessageContent::Text(t)) => t,
            Some(MessageContent::Parts(parts)) => parts.into_iter().filter_map(|p| p.text).collect(),
        };
        tokens::ChatTurn {
            role: self.role,
            content,
            tool_calls,
        }
    }
}

/// A field whose presence matters even when its value is `null`: absent is `None`, `null` is
/// `Some(Value::Null)` (vLLM defaults `tool_choice` only when the key is absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

#[derive(Debug, Default, Deserialize)]
pub struct ChatTemplateKwargs {
    #[serde(default)]
    pub enable_thinking: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct ChatBody {
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    /// vLLM's extra arguments of the chat template (`enable_thinking` for Qwen3).
    #[serde(default)]
    pub chat_template_kwargs: Option<ChatTemplateKwargs>,
    /// The tool definitions, as the client sent them (checked by [`check_tools`]).
    #[serde(default)]
    pub tools: Option<Value>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name"}}`;
    /// `Some(Value::Null)` when the client sent `null`.
    #[serde(default, deserialize_with = "present")]
    pub tool_choice: Option<Value>,
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", …}}`
    /// (checked by [`check_response_format`]).
    #[serde(default)]
    pub response_format: Option<Value>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// What a chat request's `response_format` asks the answer to be.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    /// JSON: an object (`json_object`), or an instance of the schema (`json_schema`).
    JsonObject,
    JsonSchema(Value),
}

impl ResponseFormat {
    /// What the emulated model writes (vLLM constrains the real one by guided decoding; there
    /// is no model here, so this is the emulation's rule): for `json_object`, `{"answer": …}`
    /// holding the last user message's first characters; for `json_schema`, the schema's
    /// instance built as a tool call's arguments are ([`schema_instance`]: required
    /// properties, references followed, a union's first non-null branch unless it recurs). JSON as Python's
    /// `json.dumps` writes it; no thinking text before it.
    pub fn text(&self, turns: &[tokens::ChatTurn]) -> String {
        let user = turns.iter().rev().find(|t| t.role == "user").map_or("", |t| t.content.as_str());
        match self {
            ResponseFormat::JsonObject => {
                let answer: String = user.chars().take(MAX_STRING_ARGUMENT_CHARS).collect();
                python_json(&json!({ "answer": answer }))
            }
            ResponseFormat::JsonSchema(schema) => python_json(&schema_instance(schema, user)),
        }
    }
}

/// vLLM 0.10.2's `ResponseFormat`: `type` one of `text`, `json_object`, `json_schema` (its
/// `structural_tag` is not emulated), and a `json_schema` format carries `json_schema` with a
/// `name` and, to constrain anything, a `schema` object. `text` (or none) asks for nothing.
pub fn check_response_format(format: Option<Value>) -> Result<Option<ResponseFormat>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else { return Ok(None) };
    let bad = |message: &str| ApiError::bad_param("response_format", message.to_string());
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ResponseFormat::JsonObject)),
        Some("json_schema") => {
            let spec = format.get("json_schema").filter(|j| j.is_object()).ok_or_else(|| bad("a `json_schema` response format needs its `json_schema`"))?;
            if !spec.get("name").is_some_and(Value::is_string) {
                return Err(bad("`response_format.json_schema.name` must be a string"));
            }
            match spec.get("schema") {
                Some(schema @ Value::Object(_)) => Ok(Some(ResponseFormat::JsonSchema(schema.clone()))),
                None | Some(Value::Null) => Ok(Some(ResponseFormat::JsonObject)),
                Some(_) => Err(bad("`response_format.json_schema.schema` must be a JSON Schema object")),
            }
        }
        Some("structural_tag") => Err(not_emulated("response_format")),
        _ => Err(bad("`response_format.type` must be `text`, `json_object` or `json_schema`")),
    }
}

/// `POST /tokenize`: vLLM's `TokenizeCompletionRequest` or `TokenizeChatRequest`.
#[derive(Debug, Deserialize)]
pub struct TokenizeBody {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub return_token_strs: Option<bool>,
    #[serde(default)]
    pub chat_template_kwargs: Option<ChatTemplateKwargs>,
    /// Tool definitions rendered with `messages` (vLLM's `TokenizeChatRequest.tools`).
    #[serde(default)]
    pub tools: Option<Value>,
}

/// `POST /detokenize`: vLLM's `DetokenizeRequest`.
#[derive(Debug, Deserialize)]
pub struct DetokenizeBody {
    #[serde(default)]
    pub model: Option<String>,
    pub tokens: Vec<i64>,
}

/// The sampling parameters after validation.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    pub n: u32,
    /// `max_tokens` as the client set it.
    pub max_tokens: Option<u32>,
    pub min_tokens: u32,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub include_stop_str_in_output: bool,
    pub ignore_eos: bool,
    pub stream: bool,
    pub include_usage: bool,
}

fn int_at_least(param: &str, value: Option<i64>, min: i64) -> Result<Option<u32>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) if v < min => Err(ApiError::bad_param(
            param,
            format!("{param} must be at least {min}, got {v}."),
        )),
        Some(v) => u32::try_from(v)
            .map(Some)
            .map_err(|_| ApiError::bad_param(param, format!("{param} is too large: {v}."))),
    }
}

impl Sampling {
    /// `SamplingParams._verify_args` and the protocol's validators (vLLM 0.10.2): the same
    /// bounds, messages in vLLM's words, `param` naming the field.
    pub fn check(&self, max_tokens: Option<i64>) -> Result<Checked, ApiError> {
        let n = int_at_least("n", self.n, 1)?.unwrap_or(1);
        let max_tokens = int_at_least("max_tokens", max_tokens, 1)?;
        let range = |param: &str, v: Option<f64>, ok: fn(f64) -> bool, what: &str| match v {
            Some(x) if !ok(x) => Err(ApiError::bad_param(
                param,
                format!("{param} must be {what}, got {x}."),
            )),
            _ => Ok(()),
        };
        range("presence_penalty", self.presence_penalty, |x| (-2.0..=2.0).contains(&x), "in [-2, 2]")?;
        range("frequency_penalty", self.frequency_penalty, |x| (-2.0..=2.0).contains(&x), "in [-2, 2]")?;
        range("repetition_penalty", self.repetition_penalty, |x| x > 0.0, "greater than zero")?;
        range("temperature", self.temperature, |x| x >= 0.0 && x.is_finite(), "non-negative")?;
        range("top_p", self.top_p, |x| x > 0.0 && x <= 1.0, "in (0, 1]")?;
        range("min_p", self.min_p, |x| (0.0..=1.0).contains(&x), "in [0, 1]")?;
        if let Some(k) = self.top_k
            && k < -1
        {
            return Err(ApiError::bad_param(
                "top_k",
                format!("top_k must be -1 or 0 (disable), or at least 1, got {k}."),
            ));
        }
        let min_tokens = match self.min_tokens {
            Some(m) if m < 0 => {
                return Err(ApiError::bad_param(
                    "min_tokens",
                    format!("min_tokens must be greater than or equal to 0, got {m}."),
                ));
            }
            Some(m) => u32::try_from(m).unwrap_or(u32::MAX),
            None => 0,
        };
        if let Some(max) = max_tokens
            && min_tokens > max
        {
            return Err(ApiError::bad_param(
                "min_tokens",
                format!("min_tokens must be less than or equal to max_tokens={max}, got {min_tokens}."),
            ));
        }
        if self.prompt_logprobs.is_some() {
            return Err(not_emulated("prompt_logprobs"));
        }
        let stream = self.stream.unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(ApiError::bad_param(
                "stream_options",
                "Stream options can only be defined when `stream=True`.",
            ));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::bad_param("stop", "stop strings must not be empty."));
        }
        Ok(Checked {
            n,
            max_tokens,
            min_tokens,
            stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            include_stop_str_in_output: self.include_stop_str_in_output,
            ignore_eos: self.ignore_eos,
            stream,
            // vLLM's `StreamOptions.include_usage` defaults to true once `stream_options` is
            // given.
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage.unwrap_or(true)),
        })
    }
}

/// A 400 for a parameter whose effect the emulated replica cannot produce: it samples no
/// token distribution, so it has no log-probabilities to return.
pub fn not_emulated(param: &str) -> ApiError {
    ApiError::bad_param(
        param,
        format!(
            "{param} is not supported by the emulated replica: it samples no token \
             distribution, so it has no log-probabilities to return"
        ),
    )
}

/// Renders a conversation with Qwen3's whole chat template
/// ([`tokens::chat_template_with_tools`]: the `# Tools` system block listing `tools` when
/// there are any, per message `<|im_start|>role\ncontent<|im_end|>\n`, an assistant turn's
/// tool calls as `<tool_call>` blocks, tool results as a user turn of `<tool_response>`
/// blocks, earlier assistant turns' reasoning dropped before the last user query; then, with
/// `add_generation_prompt`, the generation prompt, with the empty thinking block when
/// `enable_thinking` is false): the prompt a Qwen3 vLLM server tokenises; its special markers
/// are single tokens.
pub fn render_chat_prompt(
    turns: &[tokens::ChatTurn],
    tools: &[Value],
    enable_thinking: bool,
    add_generation_prompt: bool,
) -> String {
    tokens::chat_template_with_tools(turns, tools, enable_thinking, add_generation_prompt)
}

/// `tool_choice` after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// `"none"` (or `null`): the tools are still rendered in the prompt (vLLM 0.10.2's
    /// default), the answer is text and is not read for tool calls.
    None,
    /// `"auto"`, the default once `tools` are given: the model decides; vLLM's hermes parser
    /// reads its answer.
    Auto,
    /// `"required"`: a call is forced (vLLM's guided decoding of a JSON list of calls).
    Required,
    /// `{"type": "function", "function": {"name": …}}`: a call of that function is forced
    /// (vLLM's guided decoding of its arguments).
    Named(String),
}

/// How a call came to be, which decides its generated text and how vLLM reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallMode {
    Auto,
    Required,
    Named,
}

/// The tool fields of a chat request that has tools (a non-empty `tools` list).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    /// The tool definitions as the client sent them (each checked by [`check_tool_list`]).
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
}

/// vLLM's hint after a malformed named `tool_choice`.
const TOOL_CHOICE_USAGE: &str =
    "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`";

/// The name of a (checked) tool definition.
fn tool_name(tool: &Value) -> Option<&str> {
    tool.get("function")?.get("name")?.as_str()
}

/// A value as Python's f-string shows it in vLLM's messages: a string bare, anything else as
/// JSON.
fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `tools` as vLLM's `ChatCompletionToolsParam` list accepts it: absent or `null` is no tools;
/// else a list whose every item is `{"type": "function", "function": {"name": …}}` (`type`
/// may be left out: it defaults to `"function"`; `parameters`, when given, is an object). A
/// bad item is a 400 whose `param` is `tools`.
pub fn check_tool_list(tools: Option<Value>) -> Result<Vec<Value>, ApiError> {
    let items = match tools {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(ApiError::bad_param(
                "tools",
                format!("`tools` must be a list of tools, got {other}."),
            ));
        }
    };
    for (i, tool) in items.iter().enumerate() {
        let bad = |what: String| ApiError::bad_param("tools", format!("tools[{i}]: {what}"));
        let Some(fields) = tool.as_object() else {
            return Err(bad(format!(
                "a tool is an object {{\"type\": \"function\", \"function\": {{…}}}}, got {tool}."
            )));
        };
        match fields.get("type") {
            None => {}
            Some(Value::String(t)) if t == "function" => {}
            Some(other) => return Err(bad(format!("`type` must be \"function\", got {other}."))),
        }
        let Some(function) = fields.get("function").and_then(Value::as_object) else {
            return Err(bad("`function` must be an object with a `name`.".into()));
        };
        if !function.get("name").is_some_and(Value::is_string) {
            return Err(bad("`function.name` must be a string.".into()));
        }
        if !matches!(function.get("parameters"), None | Some(Value::Null | Value::Object(_))) {
            return Err(bad("`function.parameters` must be a JSON schema object.".into()));
        }
    }
    Ok(items)
}

/// `tools` and `tool_choice` as vLLM 0.10.2's `ChatCompletionRequest.check_tool_usage`
/// validates them, in its words (400s whose `param` names the field):
/// - `tool_choice` absent with tools given defaults to `"auto"`; `"none"` or `null` needs no
///   tools;
/// - any other `tool_choice` without `tools` is "When using `tool_choice`, `tools` must be
///   set.";
/// - a string other than `"auto"` / `"required"` (or a value that is no object) is refused;
///   `"required"` with an empty `tools` list behaves as `"none"`;
/// - a named choice needs `function.name`, a non-empty string that names one of `tools` (else
///   "The tool specified in `tool_choice` does not match any of the specified `tools`" —
///   the validator's message, which vLLM answers before its later "Tool '…' has not been
///   passed in `tools`." can be reached).
///
/// `None` when the request has no tools (absent, `null` or an empty list): nothing is rendered
/// and the answer is plain text, exactly as for a request without the fields.
pub fn check_tools(tools: Option<Value>, tool_choice: Option<Value>) -> Result<Option<ToolRequest>, ApiError> {
    let tools_set = matches!(tools, Some(ref t) if !t.is_null());
    let choice = match tool_choice {
        None => ToolChoice::Auto,
        Some(Value::Null) => ToolChoice::None,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(_) if !tools_set => {
            return Err(ApiError::bad_param(
                "tool_choice",
                "When using `tool_choice`, `tools` must be set.",
            ));
        }
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(Value::Object(named)) => {
            let function = named.get("function").and_then(Value::as_object).ok_or_else(|| {
                let shown_fn = named.get("function").map_or("None".to_string(), shown);
                ApiError::bad_param(
                    "tool_choice",
                    format!("Invalid value for `function`: `{shown_fn}` in `tool_choice`! {TOOL_CHOICE_USAGE}"),
                )
            })?;
            match function.get("name") {
                None => {
                    return Err(ApiError::bad_param(
                        "tool_choice",
                        format!("Expected field `name` in `function` in `tool_choice`! {TOOL_CHOICE_USAGE}"),
                    ));
                }
                Some(Value::String(name)) if !name.is_empty() => ToolChoice::Named(name.clone()),
                Some(other) => {
                    return Err(ApiError::bad_param(
                        "tool_choice",
                        format!("Invalid `name` in `function`: `{}` in `tool_choice`! {TOOL_CHOICE_USAGE}", shown(other)),
                    ));
                }
            }
        }
        Some(other) => {
            return Err(ApiError::bad_param(
                "tool_choice",
                format!(
                    "Invalid value for `tool_choice`: {}! Only named tools, \"none\", \"auto\" or \"required\" are supported.",
                    shown(&other)
                ),
            ));
        }
    };
    let tools = check_tool_list(tools)?;
    if let ToolChoice::Named(name) = &choice
        && !tools.iter().any(|t| tool_name(t) == Some(name.as_str()))
    {
        return Err(ApiError::bad_param(
            "tool_choice",
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
        ));
    }
    if tools.is_empty() {
        // `"auto"` or `"required"` over an empty list: nothing to call (vLLM treats
        // `"required"` as `"none"` there, and renders no tools block).
        return Ok(None);
    }
    Ok(Some(ToolRequest { tools, choice }))
}

/// From this nesting depth on, generated JSON takes its shortest form: a union its branch that
/// ends soonest, an array its `minItems` items only, an object its required properties only.
pub const MAX_ARGUMENT_DEPTH: usize = 12;

/// Past this depth (or [`MAX_SCHEMA_HOPS`] references on a path) a value is null: a schema
/// that requires itself without end cannot be satisfied.
const HARD_DEPTH: usize = 4 * MAX_ARGUMENT_DEPTH;

/// References (`$ref`) and combinators (`anyOf`, `oneOf`, `allOf`) followed along one path.
pub const MAX_SCHEMA_HOPS: usize = 64;

/// Values (and object keys) generated for one instance in all: a hostile schema of many
/// references to itself, or of huge required lists, would otherwise grow without bound; past
/// it, values are null and objects take no more keys.
pub const MAX_INSTANCE_VALUES: usize = 4096;

/// Values a union's branch may take when it is tried for how soon it ends.
const PROBE_VALUES: usize = 64;

/// Branches of a union tried for how soon they end.
const PROBED_BRANCHES: usize = 16;

/// The longest string argument, in characters: the last user message's text is cut to it.
pub const MAX_STRING_ARGUMENT_CHARS: usize = 64;

/// The arguments the emulated model writes for a function whose `parameters` schema is given:
/// an object of the schema's `required` properties, each valued by its own schema (see
/// [`schema_instance`]); no parameters at all is `{}`.
pub fn tool_arguments(parameters: Option<&Value>, user_text: &str) -> Value {
    match parameters {
        Some(schema) => {
            let text: String = user_text.chars().take(MAX_STRING_ARGUMENT_CHARS).collect();
            Instance::new(schema, &text, MAX_INSTANCE_VALUES).object(schema, 0, 0)
        }
        None => Value::Object(serde_json::Map::new()),
    }
}

/// The JSON the emulated model writes under a JSON schema (a `json_schema` response format, a
/// tool's parameters) — what a model under vLLM's guided decoding could write, chosen so that
/// a validator of the schema (pydantic, `jsonschema`) takes it:
///
/// - `$ref` to a local pointer followed (keywords beside it merged in, as draft 2019 allows);
///   `allOf` merged (a merge costs the budget its keys);
/// - `anyOf` / `oneOf` (pydantic's `Optional`, unions of models): its first branch that is not
///   `null` — but where the same union recurs on its own path (a recursive type), or from
///   [`MAX_ARGUMENT_DEPTH`] on, the branch that ends soonest (each tried with a small budget),
///   so a recursive union ends instead of doubling at every level;
/// - `enum` / `const`: the first value;
/// - `"string"`: `user_text`'s first [`MAX_STRING_ARGUMENT_CHARS`] characters (a search tool
///   gets the question), padded with `x` to `minLength` and cut to `maxLength`; a `format`'s
///   fixed sample instead (`date-time`, `date`, `time`, `duration`, `uuid`, `email`, `uri`,
///   `hostname`, `ipv4`, `ipv6` and pydantic's `ipvany…`); `pattern` is not followed;
/// - `"integer"` / `"number"`: the least value `minimum` / `exclusiveMinimum` allow (1, or 1.0,
///   without), held under `maximum` / `exclusiveMaximum`, a multiple of `multipleOf`;
/// - `"boolean"`: true; `"null"`: null;
/// - `"array"`: its `prefixItems` (or draft-07's `items` list), then items up to `minItems`
///   (distinct ones under `uniqueItems`);
/// - `"object"` (or properties without a type): its `required` properties (valued by
///   `properties`, else `additionalProperties`), then optional ones — or keys of
///   `additionalProperties` — up to `minProperties`;
/// - no or an unknown type: null; past [`MAX_INSTANCE_VALUES`] values, or a path of a schema
///   that requires itself without end, null.
///
/// Object keys come out in serde_json's (sorted) order, where guided decoding writes the
/// schema's.
pub fn schema_instance(schema: &Value, user_text: &str) -> Value {
    let text: String = user_text.chars().take(MAX_STRING_ARGUMENT_CHARS).collect();
    Instance::new(schema, &text, MAX_INSTANCE_VALUES).value(schema, 0, 0)
}

/// Builds one instance (see [`schema_instance`]).
struct Instance<'a> {
    root: &'a Value,
    text: &'a str,
    /// Values still allowed.
    left: usize,
    /// The unions on the current path (by location): one met again is a recursive type.
    unions: Vec<*const Value>,
    /// This builder tries a branch for [`Instance::shortest_branch`]: it probes no further.
    probing: bool,
}

impl<'a> Instance<'a> {
    fn new(root: &'a Value, text: &'a str, left: usize) -> Self {
        Instance { root, text, left, unions: Vec::new(), probing: false }
    }

    /// Takes one value of the budget; false when none is left.
    fn spend(&mut self) -> bool {
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        true
    }

    fn resolve(&self, reference: &str) -> Option<&'a Value> {
        self.root.pointer(reference.strip_prefix('#')?)
    }

    fn value(&mut self, schema: &Value, depth: usize, hops: usize) -> Value {
        // Every value counts, a null past the limits too: an array that must hold `minItems`
        // of them would otherwise fill without spending the budget.
        if !self.spend() || depth > HARD_DEPTH || hops > MAX_SCHEMA_HOPS {
            return Value::Null;
        }
        if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
            let Some(target) = self.resolve(reference) else { return Value::Null };
            // Keywords beside the reference (draft 2019) refine its target.
            let siblings = schema.as_object().is_some_and(|o| o.keys().any(|k| !matches!(k.as_str(), "$ref" | "description" | "title" | "default" | "examples" | "$defs" | "definitions")));
            if siblings {
                let mut merged = target.clone();
                if let (Some(m), Some(o)) = (merged.as_object_mut(), schema.as_object()) {
                    for (k, v) in o.iter().filter(|(k, _)| *k != "$ref") {
                        m.insert(k.clone(), v.clone());
                    }
                }
                self.left = self.left.saturating_sub(merge_cost(&merged));
                return self.value(&merged, depth, hops + 1);
            }
            return self.value(target, depth, hops + 1);
        }
        if let Some(parts) = schema.get("allOf").and_then(Value::as_array) {
            let merged = self.merge_all_of(schema, parts);
            // A merge copies schema: it costs the budget its keys, so a hostile schema of many
            // merges of itself runs out of budget, not of time.
            self.left = self.left.saturating_sub(merge_cost(&merged));
            return self.value(&merged, depth, hops + 1);
        }
        if let Some(branches) = schema.get("anyOf").or_else(|| schema.get("oneOf")).and_then(Value::as_array) {
            let key = schema as *const Value;
            let recurs = self.unions.contains(&key);
            let branch = if recurs || depth >= MAX_ARGUMENT_DEPTH {
                self.shortest_branch(branches, depth, hops)
            } else {
                branches.iter().find(|b| b.get("type").and_then(Value::as_str) != Some("null")).or(branches.first())
            };
            let Some(branch) = branch else { return Value::Null };
            self.unions.push(key);
            let v = self.value(branch, depth, hops + 1);
            self.unions.pop();
            return v;
        }
        if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|e| e.first()) {
            return first.clone();
        }
        if let Some(constant) = schema.get("const") {
            return constant.clone();
        }
        let kind = match schema.get("type") {
            Some(Value::String(t)) => Some(t.as_str()),
            Some(Value::Array(types)) => types.iter().filter_map(Value::as_str).find(|t| *t != "null"),
            None if schema.get("properties").is_some() || schema.get("additionalProperties").is_some_and(Value::is_object) => Some("object"),
            None if schema.get("items").is_some() || schema.get("prefixItems").is_some() => Some("array"),
            _ => None,
        };
        match kind {
            Some("string") => self.string(schema),
            Some("integer") => integer(schema),
            Some("number") => number(schema),
            Some("boolean") => Value::Bool(true),
            Some("array") => self.array(schema, depth, hops),
            Some("object") => self.object(schema, depth, hops),
            _ => Value::Null,
        }
    }

    /// The union branch whose instance ends soonest: `null` if there is one, else each of the
    /// first [`PROBED_BRANCHES`] tried with at most [`PROBE_VALUES`] values from here (what a
    /// try spends is taken from the budget; a try probes no further), the first that ends in
    /// the fewest — the first branch when none ends within its try.
    fn shortest_branch<'b>(&mut self, branches: &'b [Value], depth: usize, hops: usize) -> Option<&'b Value> {
        if let Some(null) = branches.iter().find(|b| b.get("type").and_then(Value::as_str) == Some("null")) {
            return Some(null);
        }
        if self.probing {
            return branches.first();
        }
        let mut best: Option<(usize, &Value)> = None;
        for b in branches.iter().take(PROBED_BRANCHES) {
            let budget = PROBE_VALUES.min(self.left);
            let mut probe = Instance::new(self.root, self.text, budget);
            probe.unions = self.unions.clone();
            probe.probing = true;
            let _ = probe.value(b, depth, hops + 1);
            let used = budget - probe.left;
            self.left = self.left.saturating_sub(used);
            if probe.left > 0 && best.is_none_or(|(u, _)| used < u) {
                best = Some((used, b));
            }
        }
        best.map(|(_, b)| b).or(branches.first())
    }

    /// `allOf`'s parts as one schema: the parent's own keywords, then each part's (references
    /// followed one level), properties and `required` lists joined.
    fn merge_all_of(&self, schema: &Value, parts: &[Value]) -> Value {
        let mut merged: serde_json::Map<String, Value> =
            schema.as_object().map(|o| o.iter().filter(|(k, _)| *k != "allOf").map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default();
        let mut properties = merged.remove("properties").and_then(|p| p.as_object().cloned()).unwrap_or_default();
        let mut required: Vec<Value> = merged.remove("required").and_then(|r| r.as_array().cloned()).unwrap_or_default();
        for part in parts {
            let part = match part.get("$ref").and_then(Value::as_str) {
                Some(reference) => self.resolve(reference).unwrap_or(part),
                None => part,
            };
            let Some(fields) = part.as_object() else { continue };
            for (k, v) in fields {
                match k.as_str() {
                    "properties" => properties.extend(v.as_object().cloned().unwrap_or_default()),
                    "required" => required.extend(v.as_array().cloned().unwrap_or_default()),
                    _ => {
                        merged.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
            }
        }
        if !properties.is_empty() {
            merged.insert("properties".into(), Value::Object(properties));
        }
        if !required.is_empty() {
            merged.insert("required".into(), Value::Array(required));
        }
        Value::Object(merged)
    }

    fn string(&self, schema: &Value) -> Value {
        let sample = match schema.get("format").and_then(Value::as_str) {
            Some("date-time") => Some("2026-01-01T00:00:00Z"),
            Some("date") => Some("2026-01-01"),
            Some("time") => Some("00:00:00"),
            Some("duration") => Some("P1D"),
            Some("uuid" | "uuid4") => Some("00000000-0000-4000-8000-000000000000"),
            Some("uuid1") => Some("00000000-0000-1000-8000-000000000000"),
            Some("email") => Some("user@example.com"),
            Some("uri" | "url") => Some("https://example.com/"),
            Some("ipv4" | "ipvanyaddress") => Some("127.0.0.1"),
            Some("ipv6") => Some("::1"),
            Some("ipvanyinterface") => Some("127.0.0.1/32"),
            Some("ipvanynetwork") => Some("127.0.0.0/8"),
            Some("hostname") => Some("example.com"),
            _ => None,
        };
        let mut text = sample.unwrap_or(self.text).to_string();
        let count = |key: &str| schema.get(key).and_then(Value::as_u64).map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        // A format's sample is not padded (padding would break the format).
        if let Some(min) = count("minLength").map(|m| m.min(MAX_STRING_ARGUMENT_CHARS * 64)).filter(|_| sample.is_none()) {
            let have = text.chars().count();
            text.extend(std::iter::repeat_n('x', min.saturating_sub(have)));
        }
        if let Some(max) = count("maxLength") {
            text = text.chars().take(max).collect();
        }
        Value::String(text)
    }

    fn array(&mut self, schema: &Value, depth: usize, hops: usize) -> Value {
        let mut items: Vec<Value> = Vec::new();
        // draft 2020's `prefixItems`, or draft 7's list-valued `items`.
        let prefix = schema.get("prefixItems").or_else(|| schema.get("items").filter(|i| i.is_array())).and_then(Value::as_array);
        for p in prefix.into_iter().flatten() {
            if self.left == 0 {
                break;
            }
            items.push(self.value(p, depth + 1, hops));
        }
        let min = schema.get("minItems").and_then(Value::as_u64).map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX));
        let unique = schema.get("uniqueItems").and_then(Value::as_bool).unwrap_or(false);
        if let Some(item) = schema.get("items").filter(|i| i.is_object()) {
            while items.len() < min && self.left > 0 {
                let mut v = self.value(item, depth + 1, hops);
                if unique {
                    v = distinct(v, items.len());
                }
                items.push(v);
            }
        }
        Value::Array(items)
    }

    fn object(&mut self, schema: &Value, depth: usize, hops: usize) -> Value {
        let mut out = serde_json::Map::new();
        let properties = schema.get("properties").and_then(Value::as_object);
        let extra = schema.get("additionalProperties").filter(|a| a.is_object());
        let required: Vec<&str> = schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        // The shortest form from the depth limit on: required properties only.
        let min = if depth >= MAX_ARGUMENT_DEPTH {
            0
        } else {
            schema.get("minProperties").and_then(Value::as_u64).map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
        };
        let optional = properties.into_iter().flatten().map(|(k, _)| k.as_str()).filter(|k| !required.contains(k));
        let wanted: Vec<String> = required.iter().copied().chain(optional).map(str::to_string).collect();
        for (i, name) in wanted.into_iter().enumerate() {
            // Every key takes from the budget: past it the instance is cut short.
            if (i >= required.len() && out.len() >= min) || !self.spend() {
                break;
            }
            let value = match properties.and_then(|p| p.get(&name)).or(extra) {
                Some(property) => self.value(property, depth + 1, hops),
                None => Value::Null,
            };
            out.insert(name, value);
        }
        // Keys of `additionalProperties` up to `minProperties`.
        if let Some(extra) = extra {
            let mut k = 1;
            while out.len() < min && self.spend() {
                let name = format!("key{k}");
                k += 1;
                if !out.contains_key(&name) {
                    let v = self.value(extra, depth + 1, hops);
                    out.insert(name, v);
                }
            }
        }
        Value::Object(out)
    }
}

/// What a merged schema costs the budget: its keys and its properties.
fn merge_cost(merged: &Value) -> usize {
    merged.as_object().map_or(0, |o| o.len() + o.get("properties").and_then(Value::as_object).map_or(0, serde_json::Map::len))
}

/// The `i`-th of distinct items (`uniqueItems`): numbers shifted by `i`, strings suffixed, other
/// values as they are.
fn distinct(v: Value, i: usize) -> Value {
    if i == 0 {
        return v;
    }
    match v {
        Value::Number(n) if n.is_i64() => json!(n.as_i64().unwrap_or(0).saturating_add(i as i64)),
        Value::Number(n) => json!(n.as_f64().unwrap_or(0.0) + i as f64),
        Value::String(s) => Value::String(format!("{s}{i}")),
        other => other,
    }
}

/// The least integer the schema's bounds allow (1 without a lower bound), held under its upper
/// bound, a multiple of `multipleOf`.
fn integer(schema: &Value) -> Value {
    let num = |key: &str| schema.get(key).and_then(Value::as_f64);
    let low = match (num("minimum"), num("exclusiveMinimum")) {
        (Some(m), Some(e)) => Some(m.ceil().max(e.floor() + 1.0)),
        (Some(m), None) => Some(m.ceil()),
        (None, Some(e)) => Some(e.floor() + 1.0),
        (None, None) => None,
    };
    let high = match (num("maximum"), num("exclusiveMaximum")) {
        (Some(m), Some(e)) => Some(m.floor().min(e.ceil() - 1.0)),
        (Some(m), None) => Some(m.floor()),
        (None, Some(e)) => Some(e.ceil() - 1.0),
        (None, None) => None,
    };
    let mut v = low.unwrap_or(1.0);
    if let Some(h) = high.filter(|h| v > *h) {
        v = h;
    }
    if let Some(step) = num("multipleOf").filter(|m| *m > 0.0 && m.is_finite()) {
        // The least multiple of the step at or above `v` that is a whole number (a step of
        // 2.5 gives 5, 10, …), below the upper bound where one is.
        let first = (v / step).ceil();
        let found = (0..1000).map(|k| (first + f64::from(k)) * step).find(|c| c.fract() == 0.0 && high.is_none_or(|h| *c <= h));
        if let Some(c) = found {
            v = c;
        }
    }
    json!(v.clamp(i64::MIN as f64, i64::MAX as f64) as i64)
}

/// The least number the schema's bounds allow (1.0 without a lower bound; an exclusive lower
/// bound plus one, or halfway to the upper bound when that is nearer), held under its upper
/// bound, a multiple of `multipleOf` where one lies within the bounds.
fn number(schema: &Value) -> Value {
    let num = |key: &str| schema.get(key).and_then(Value::as_f64);
    let high = num("maximum").or(num("exclusiveMaximum"));
    let mut v = match (num("minimum"), num("exclusiveMinimum")) {
        (Some(m), _) => m,
        (None, Some(e)) => match num("exclusiveMaximum").or(num("maximum")) {
            Some(h) if h - e <= 1.0 => (e + h) / 2.0,
            _ => e + 1.0,
        },
        (None, None) => match (num("maximum"), num("exclusiveMaximum")) {
            (Some(m), _) if m < 1.0 => m,
            (None, Some(e)) if e <= 1.0 => e - 1.0,
            _ => 1.0,
        },
    };
    if high.is_some_and(|h| v > h) {
        v = num("maximum").unwrap_or(v);
    }
    if let Some(step) = num("multipleOf").filter(|m| *m > 0.0 && m.is_finite()) {
        let mut c = (v / step).ceil() * step;
        if num("exclusiveMinimum").is_some_and(|e| c <= e) {
            c += step;
        }
        let fits = num("maximum").is_none_or(|m| c <= m) && num("exclusiveMaximum").is_none_or(|m| c < m);
        if fits {
            v = c;
        }
    }
    serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)
}

/// The tool call the emulated model makes: which function, with what arguments, and how
/// (which decides the text it generates).
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedCall {
    pub mode: CallMode,
    pub name: String,
    pub arguments: Value,
}

impl PlannedCall {
    /// The text Qwen3 generates for the call (its tokens are the answer's generated tokens):
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` under `auto` (the hermes
    /// format of Qwen3's chat template), the arguments object alone for a named choice and
    /// `[{"name": …, "parameters": {…}}]` for `required` (what vLLM's guided decoding makes
    /// the model write); JSON as Python's `json.dumps` writes it.
    pub fn text(&self) -> String {
        let arguments = python_json(&self.arguments);
        let name = Value::String(self.name.clone()).to_string();
        match self.mode {
            CallMode::Auto => format!("<tool_call>\n{{\"name\": {name}, \"arguments\": {arguments}}}\n</tool_call>"),
            CallMode::Named => arguments,
            CallMode::Required => format!("[{{\"name\": {name}, \"parameters\": {arguments}}}]"),
        }
    }
}

impl ToolRequest {
    /// The emulated model's decision — there is no model, so this is the emulation's rule,
    /// deterministic: under `"auto"` it calls ONE tool, the first of `tools`, when the
    /// conversation's last message is a user message (not a tool result), so an agent loop
    /// runs one tool round per user turn and ends: after a tool result it answers in text.
    /// `"required"` always calls the first tool, a named choice the named one; `"none"` never
    /// calls. The arguments are [`tool_arguments`] of the function's `parameters`, strings
    /// taken from the last user message. No thinking text comes before a call, thinking on or
    /// off.
    pub fn plan(&self, turns: &[tokens::ChatTurn]) -> Option<PlannedCall> {
        let (mode, tool) = match &self.choice {
            ToolChoice::None => return None,
            ToolChoice::Auto => {
                if turns.last().is_none_or(|t| t.role != "user") {
                    return None;
                }
                (CallMode::Auto, self.tools.first()?)
            }
            ToolChoice::Required => (CallMode::Required, self.tools.first()?),
            ToolChoice::Named(name) => (
                CallMode::Named,
                self.tools.iter().find(|t| tool_name(t) == Some(name.as_str()))?,
            ),
        };
        let user_text = turns
            .iter()
            .rev()
            .find(|t| t.role == "user")
            .map_or("", |t| t.content.as_str());
        let parameters = tool.get("function").and_then(|f| f.get("parameters")).filter(|p| !p.is_null());
        Some(PlannedCall {
            mode,
            name: tool_name(tool)?.to_string(),
            arguments: tool_arguments(parameters, user_text),
        })
    }
}

/// A function call of an answer as vLLM returns it (`arguments`: JSON text).
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// An answer of a request with tools, as vLLM reads its generated text.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutput {
    /// No call: the text is the message's content.
    Text,
    /// A call. The message's content is the text's first `content_end` bytes (`auto`: the text
    /// before `<tool_call>`, null when empty; a named or `required` choice: `""`); the call's
    /// text ends at byte `call_end` (it is complete once the tokens up to there are generated).
    Call {
        mode: CallMode,
        call: FunctionCall,
        content_end: usize,
        call_end: usize,
    },
    /// A `required` answer that is no list of calls (cut by `max_tokens`): vLLM's
    /// non-streamed answer is a 400 with pydantic's message, this one.
    Unparsed(String),
}

/// Reads a generated `text` as vLLM 0.10.2 does for `choice`: under `"auto"` the hermes
/// parser (`Hermes2ProToolParser.extract_tool_calls`: the first `<tool_call>…</tool_call>`
/// block, or `<tool_call>` to the end, must be a JSON object with `name` and `arguments`, the
/// arguments re-serialised as `json.dumps` does; an answer that does not parse, a call cut by
/// `max_tokens` included, is content); a named choice's text is the arguments as they are;
/// `"required"` must be a JSON list of `{"name", "parameters"}` (its first call is taken: the
/// emulated model writes one); `"none"` is not read.
pub fn read_tool_output(choice: &ToolChoice, text: &str) -> ToolOutput {
    match choice {
        ToolChoice::None => ToolOutput::Text,
        ToolChoice::Auto => read_hermes(text),
        ToolChoice::Named(name) => ToolOutput::Call {
            mode: CallMode::Named,
            call: FunctionCall {
                name: name.clone(),
                arguments: text.to_string(),
            },
            content_end: 0,
            call_end: text.len(),
        },
        ToolChoice::Required => read_required(text),
    }
}

fn read_hermes(text: &str) -> ToolOutput {
    const START: &str = "<tool_call>";
    const END: &str = "</tool_call>";
    let Some(start) = text.find(START) else {
        return ToolOutput::Text;
    };
    let body_from = start + START.len();
    let rest = text.get(body_from..).unwrap_or_default();
    let (body, call_end) = match rest.find(END) {
        Some(k) => (&rest[..k], body_from + k + END.len()),
        None => (rest, text.len()),
    };
    let Ok(Value::Object(call)) = serde_json::from_str::<Value>(body) else {
        return ToolOutput::Text;
    };
    match (call.get("name"), call.get("arguments")) {
        (Some(Value::String(name)), Some(arguments)) => ToolOutput::Call {
            mode: CallMode::Auto,
            call: FunctionCall {
                name: name.clone(),
                arguments: python_json(arguments),
            },
            content_end: start,
            call_end,
        },
        _ => ToolOutput::Text,
    }
}

/// vLLM's `FunctionDefinition`, as a `required` answer's items are validated.
#[derive(Debug, Deserialize)]
struct RequiredCall {
    name: String,
    #[serde(default)]
    parameters: Option<serde_json::Map<String, Value>>,
}

fn read_required(text: &str) -> ToolOutput {
    match serde_json::from_str::<Vec<RequiredCall>>(text) {
        Ok(calls) => match calls.into_iter().next() {
            Some(first) => ToolOutput::Call {
                mode: CallMode::Required,
                call: FunctionCall {
                    name: first.name,
                    arguments: python_json(&first.parameters.map_or(Value::Null, Value::Object)),
                },
                content_end: 0,
                call_end: text.len(),
            },
            None => ToolOutput::Text,
        },
        Err(e) => ToolOutput::Unparsed(format!(
            "1 validation error for list[FunctionDefinition]\n  Invalid JSON: {e} [type=json_invalid, input_type=str]"
        )),
    }
}

/// Python's `json.dumps` (`", "` and `": "` separators, non-ASCII kept): how vLLM's hermes
/// parser writes a call's arguments ([`tokens::python_json`]).
pub use crate::tokens::python_json;

/// One emulated answer, shaped by the request's limits and stop conditions.
#[derive(Debug, Clone, PartialEq)]
pub struct Shaped {
    /// The tokens whose text is sent (a stream sends them one by one).
    pub ids: Vec<u32>,
    /// Tokens the engine generates (a matched stop token is generated but not shown).
    pub generated: u32,
    pub text: String,
    pub finish_reason: &'static str,
    /// vLLM's `stop_reason`: the stop string or stop token id that ended the answer.
    pub stop_reason: Value,
}

impl Shaped {
    /// How many of the answer's tokens it takes to generate its text's first `bytes` bytes
    /// (all of them when the text is shorter).
    pub fn tokens_through(&self, bytes: usize) -> usize {
        let mut at = 0usize;
        for (k, &id) in self.ids.iter().enumerate() {
            if at >= bytes {
                return k;
            }
            at += tokens::decode_bytes(&[id]).len();
        }
        self.ids.len()
    }
}

/// Shapes an answer: the emulated model's own output (the `switchyard` output, which ends
/// with its end-of-sequence token; without one, [`FILLER_TEXT`] cycled to `max_tokens` when
/// the client set one, else [`FILLER_EOS_TOKENS`] long), extended with filler while
/// `ignore_eos` or `min_tokens` forbids the end, cut at the first stop token id or stop string
/// (vLLM's `check_stop` order: stop tokens and strings before the length limit), and capped at
/// `limit` tokens.
pub fn shape(provided: Option<&str>, filler: &[u32], limit: u32, c: &Checked) -> Shaped {
    let limit = limit as usize;
    let cycle = |n: usize| -> Vec<u32> { filler.iter().copied().cycle().take(n).collect() };
    let (mut ids, natural_text) = match provided {
        Some(text) => (tokens::encode(text).to_vec(), Some(text.to_string())),
        None => {
            let n = match c.max_tokens {
                Some(max) => max as usize,
                None => FILLER_EOS_TOKENS as usize,
            };
            (cycle(n.min(limit)), None)
        }
    };
    // Without a client limit the filler ends with its EOS; with one it runs to the limit.
    let mut eos = provided.is_some() || c.max_tokens.is_none();
    let floor = if c.ignore_eos { limit } else { (c.min_tokens as usize).min(limit) };
    if ids.len() < floor && !filler.is_empty() {
        let more = floor - ids.len();
        ids.extend(filler.iter().copied().cycle().take(more));
        eos = !c.ignore_eos;
    }
    let full_text = match (&natural_text, ids.len() == natural_text.as_ref().map_or(0, |t| tokens::count(t))) {
        (Some(t), true) => t.clone(),
        _ => tokens::decode(&ids),
    };
    // Byte offset of the text's end after each token.
    let mut ends = Vec::with_capacity(ids.len());
    let mut at = 0usize;
    for &id in &ids {
        at += tokens::decode_bytes(&[id]).len();
        ends.push(at);
    }
    let min = c.min_tokens as usize;
    // (tokens generated, text end, reason, stop_reason)
    let mut best: Option<(usize, usize, Value)> = None;
    if let Some(k) = ids
        .iter()
        .enumerate()
        .position(|(i, id)| i + 1 >= min.max(1) && c.stop_token_ids.contains(id))
    {
        let text_end = if k == 0 { 0 } else { ends[k - 1] };
        best = Some((k + 1, text_end, json!(ids[k])));
    }
    for s in &c.stop {
        let Some(p) = full_text.find(s.as_str()) else {
            continue;
        };
        let need = p + s.len();
        let Some(k) = ends.iter().position(|&e| e >= need) else {
            continue;
        };
        let generated = (k + 1).max(min);
        let text_end = if c.include_stop_str_in_output { need } else { p };
        if best.as_ref().is_none_or(|b| generated < b.0) {
            best = Some((generated, text_end, json!(s)));
        }
    }
    if let Some((generated, text_end, reason)) = best
        && generated <= limit
    {
        let text = full_text.get(..text_end).unwrap_or_default().to_string();
        let shown = ends.iter().take_while(|&&e| e <= text_end).count();
        return Shaped {
            ids: ids[..shown.min(generated)].to_vec(),
            generated: generated as u32,
            text,
            finish_reason: "stop",
            stop_reason: reason,
        };
    }
    if ids.len() > limit {
        ids.truncate(limit);
        let text = tokens::decode(&ids);
        return Shaped {
            generated: ids.len() as u32,
            ids,
            text,
            finish_reason: "length",
            stop_reason: Value::Null,
        };
    }
    // Ended by EOS (an empty answer still samples one token, the EOS), or by the limit.
    let reason = if eos && ids.len() < limit { "stop" } else { "length" };
    Shaped {
        generated: (ids.len() as u32).max(1),
        ids,
        text: full_text,
        finish_reason: reason,
        stop_reason: Value::Null,
    }
}

/// GPT-2's byte-to-unicode map, in which byte-level BPE vocabularies (Qwen3's included) spell
/// their tokens: printable bytes stand for themselves, the others (space, control bytes, ...)
/// for the code points from U+0100 on, in byte order.
pub fn token_str(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| {
            let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
            if printable {
                char::from(b)
            } else {
                let rank = (0..b)
                    .filter(|&x| !((b'!'..=b'~').contains(&x) || (0xA1..=0xAC).contains(&x) || x >= 0xAE))
                    .count() as u32;
                char::from_u32(0x100 + rank).unwrap_or('\u{FFFD}')
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked() -> Checked {
        Sampling::default().check(None).unwrap()
    }

    fn filler() -> Vec<u32> {
        tokens::encode(FILLER_TEXT).to_vec()
    }

    #[test]
    fn validation_names_the_param() {
        let s = |f: fn(&mut Sampling)| {
            let mut s = Sampling::default();
            f(&mut s);
            s.check(None).err().and_then(|e| e.param)
        };
        assert_eq!(s(|s| s.n = Some(0)).as_deref(), Some("n"));
        assert_eq!(s(|s| s.temperature = Some(-1.0)).as_deref(), Some("temperature"));
        assert_eq!(s(|s| s.top_p = Some(0.0)).as_deref(), Some("top_p"));
        assert_eq!(s(|s| s.top_p = Some(1.5)).as_deref(), Some("top_p"));
        assert_eq!(s(|s| s.top_k = Some(-2)).as_deref(), Some("top_k"));
        assert_eq!(s(|s| s.presence_penalty = Some(3.0)).as_deref(), Some("presence_penalty"));
        assert_eq!(s(|s| s.min_tokens = Some(-1)).as_deref(), Some("min_tokens"));
        assert_eq!(s(|s| s.stream_options = Some(StreamOptions::default())).as_deref(), Some("stream_options"));
        assert_eq!(s(|s| s.temperature = Some(0.0)), None);
        let e = Sampling::default().check(Some(0)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert_eq!(e.body()["error"]["code"], 400);
        let s = Sampling {
            stream: Some(true),
            stream_options: Some(StreamOptions::default()),
            ..Sampling::default()
        };
        assert!(s.check(None).unwrap().include_usage, "vLLM's default once stream_options is set");
    }

    #[test]
    fn shaping_follows_eos_limits_and_stops() {
        let f = filler();
        let text = "The answer is 42. Done here.";
        let c = checked();
        let a = shape(Some(text), &f, 100, &c);
        assert_eq!((a.text.as_str(), a.finish_reason), (text, "stop"));
        assert_eq!(a.generated as usize, tokens::count(text));
        let a = shape(Some(text), &f, 3, &c);
        assert_eq!((a.generated, a.finish_reason), (3, "length"));
        // No switchyard output, no client limit: the filler ends by itself.
        let a = shape(None, &f, 40_000, &c);
        assert_eq!((a.generated, a.finish_reason), (FILLER_EOS_TOKENS, "stop"));
        let c40 = Checked { max_tokens: Some(40), ..checked() };
        let a = shape(None, &f, 40, &c40);
        assert_eq!((a.generated, a.finish_reason), (40, "length"));
        // Stop strings cut the text before the stop (or after it, when asked).
        let cs = Checked { stop: vec![". ".into(), "zzz".into()], ..checked() };
        let a = shape(Some(text), &f, 100, &cs);
        assert_eq!((a.text.as_str(), a.finish_reason), ("The answer is 42", "stop"));
        assert_eq!(a.stop_reason, json!(". "));
        assert!((a.generated as usize) < tokens::count(text));
        let ci = Checked { include_stop_str_in_output: true, ..cs.clone() };
        assert_eq!(shape(Some(text), &f, 100, &ci).text, "The answer is 42. ");
        // ignore_eos and min_tokens extend the answer with filler.
        let ce = Checked { ignore_eos: true, max_tokens: Some(30), ..checked() };
        let a = shape(Some("Hi"), &f, 30, &ce);
        assert_eq!((a.generated, a.finish_reason), (30, "length"));
        let cm = Checked { min_tokens: 10, ..checked() };
        let a = shape(Some("Hi"), &f, 100, &cm);
        assert_eq!((a.generated, a.finish_reason), (10, "stop"));
        // A stop token id ends the answer; it is generated but not shown.
        let ids = tokens::encode(text).to_vec();
        let ct = Checked { stop_token_ids: vec![ids[2]], ..checked() };
        let a = shape(Some(text), &f, 100, &ct);
        assert_eq!((a.generated, a.ids.len()), (3, 2));
        assert_eq!(a.text, tokens::decode(&ids[..2]));
        // An empty answer still samples its EOS.
        assert_eq!(shape(Some(""), &f, 10, &c).generated, 1);
    }

    fn turn(role: &str, content: &str) -> tokens::ChatTurn {
        tokens::ChatTurn {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
        }
    }

    #[test]
    fn arguments_fill_the_required_properties_by_their_schemas() {
        let schema = json!({
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 5},
                "page": {"type": "integer"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "ratio": {"type": "number"},
                "floor": {"type": "number", "minimum": 0.5},
                "exact": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "filter": {"type": "object", "properties": {"lang": {"type": "string"}, "n": {"type": "integer"}},
                           "required": ["lang"]},
                "maybe": {"type": ["null", "integer"]},
                "anything": {"description": "no type"},
                "optional": {"type": "string"}
            },
            "required": ["query", "limit", "page", "unit", "ratio", "floor", "exact", "tags", "filter",
                         "maybe", "anything", "undescribed"]
        });
        let question = "What is the weather like in Paris today, and should I take an umbrella with me?";
        let args = tool_arguments(Some(&schema), question);
        let cut: String = question.chars().take(MAX_STRING_ARGUMENT_CHARS).collect();
        assert_eq!(cut.chars().count(), 64);
        assert_eq!(
            args,
            json!({"query": cut, "limit": 5, "page": 1, "unit": "celsius", "ratio": 1.0, "floor": 0.5,
                   "exact": true, "tags": [], "filter": {"lang": cut}, "maybe": 1, "anything": null,
                   "undescribed": null})
        );
        // Only required properties; no parameters at all is an empty object.
        assert!(args.get("optional").is_none());
        assert_eq!(tool_arguments(None, "hi"), json!({}));
        assert_eq!(tool_arguments(Some(&json!({"type": "object", "properties": {}})), "hi"), json!({}));
        // Short text is kept whole, multi-byte characters counted as characters.
        let args = tool_arguments(Some(&json!({"properties": {"q": {"type": "string"}}, "required": ["q"]})), "東京 🚀");
        assert_eq!(args, json!({"q": "東京 🚀"}));
    }

    #[test]
    fn required_nesting_is_whole_past_the_depth_limit_and_recursion_ends() {
        // More levels of objects than the limit, each requiring the next one (and a flag): a
        // validator wants every level, so the shortest form past the limit keeps them.
        let mut schema = json!({"type": "object", "properties": {"flag": {"type": "boolean"}}, "required": ["flag"]});
        for _ in 0..MAX_ARGUMENT_DEPTH + 2 {
            schema = json!({"type": "object", "properties": {"inner": schema}, "required": ["inner"]});
        }
        let mut at = &tool_arguments(Some(&schema), "x");
        for _ in 0..MAX_ARGUMENT_DEPTH + 2 {
            at = &at["inner"];
        }
        assert_eq!(at, &json!({"flag": true}));
        // A recursive union without a null branch (an expression tree): the recurring union
        // takes the branch that ends, so the instance is small and whole.
        let expr = json!({
            "$defs": {
                "BinOp": {"type": "object", "properties": {"op": {"enum": ["+", "-"]}, "left": {"$ref": "#/$defs/Expr"}, "right": {"$ref": "#/$defs/Expr"}},
                    "required": ["op", "left", "right"]},
                "Num": {"type": "object", "properties": {"value": {"type": "number"}}, "required": ["value"]},
                "Expr": {"anyOf": [{"$ref": "#/$defs/BinOp"}, {"$ref": "#/$defs/Num"}]},
            },
            "type": "object", "properties": {"expr": {"$ref": "#/$defs/Expr"}}, "required": ["expr"],
        });
        assert_eq!(schema_instance(&expr, "x"), json!({"expr": {"op": "+", "left": {"value": 1.0}, "right": {"value": 1.0}}}));
        // Mutual recursion through an Optional ends at its null.
        let mutual = json!({
            "$defs": {
                "A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}, "required": ["b"]},
                "B": {"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}}, "required": ["a"]},
            },
            "$ref": "#/$defs/A",
        });
        let v = schema_instance(&mutual, "x");
        let mut at = &v;
        while at["b"]["a"].is_object() {
            at = &at["b"]["a"];
        }
        assert!(at["b"].is_object() && at["b"]["a"].is_null(), "{v}");
        // A required list far past the budget is cut at the budget (every key counts).
        let required: Vec<String> = (0..20_000).map(|i| format!("k{i}")).collect();
        let wide = json!({"$defs": {"O": {"type": "object", "required": required}}, "type": "array", "items": {"$ref": "#/$defs/O"}, "minItems": 500});
        let keys: usize = schema_instance(&wide, "x").as_array().map_or(0, |a| a.iter().map(|o| o.as_object().map_or(0, |m| m.len())).sum());
        assert!(keys <= MAX_INSTANCE_VALUES, "{keys}");
    }

    /// An array that requires itself as its items with a huge `minItems` reaches the depth
    /// limit with budget left; there every value is null, and each still counts against the
    /// budget, so the items end at it (a null that cost nothing filled `minItems` — 10¹² — until
    /// memory ran out: found by review, reachable from any `response_format` or tool schema).
    #[test]
    fn nulls_past_the_depth_limit_count_against_the_budget() {
        fn count(v: &Value) -> usize {
            1 + v.as_array().map_or(0, |a| a.iter().map(count).sum())
        }
        for min_items in [5_000u64, 1_000_000_000_000] {
            let schema = json!({"type": "array", "minItems": min_items, "items": {"$ref": "#"}});
            let v = schema_instance(&schema, "x");
            assert!(count(&v) <= MAX_INSTANCE_VALUES + 1, "minItems {min_items}: {} values", count(&v));
        }
    }

    /// A schema of many merges of itself (`allOf` of the root per property) ends within the
    /// budget: merges are charged by what they copy.
    #[test]
    fn many_merges_of_a_large_schema_end_within_the_budget() {
        let mut props = serde_json::Map::new();
        for i in 0..5000 {
            props.insert(format!("p{i}"), json!({"allOf": [{"$ref": "#"}]}));
        }
        let required: Vec<String> = (0..5000).map(|i| format!("p{i}")).collect();
        let schema = json!({"type": "object", "properties": props, "required": required});
        // The first merge copies the 5,000-property root and spends the budget: the instance is
        // cut there (without the charge every property merged the root again: 9 s, ~4,000 keys).
        let v = schema_instance(&schema, "x");
        assert!(v.as_object().is_some_and(|o| !o.is_empty() && o.len() < 10), "{}", v.as_object().map_or(0, serde_json::Map::len));
    }

    /// Shapes validators check that a plain builder gets wrong: a dict with `minProperties`,
    /// `uniqueItems`, a draft-07 tuple, whole multiples of a fractional step, formats.
    #[test]
    fn dicts_sets_tuples_and_steps_are_valid() {
        let v = schema_instance(&json!({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}), "x");
        assert_eq!(v, json!({"key1": 1, "key2": 1}));
        let v = schema_instance(&json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true, "minItems": 3}), "x");
        assert_eq!(v, json!([1, 2, 3]));
        let v = schema_instance(&json!({"type": "array", "items": [{"type": "integer"}, {"type": "string"}], "minItems": 2}), "x");
        assert_eq!(v, json!([1, "x"]));
        assert_eq!(schema_instance(&json!({"type": "integer", "multipleOf": 2.5}), "x"), json!(5));
        assert_eq!(schema_instance(&json!({"type": "number", "multipleOf": 0.25, "exclusiveMinimum": 0.3}), "x"), json!(1.5));
        assert_eq!(schema_instance(&json!({"type": "string", "format": "duration"}), "x"), json!("P1D"));
        assert_eq!(schema_instance(&json!({"type": "string", "format": "ipv6"}), "x"), json!("::1"));
        assert_eq!(schema_instance(&json!({"type": "string", "format": "ipvanynetwork"}), "x"), json!("127.0.0.0/8"));
        // A format's sample is not padded to a `minLength` (it would no longer be the format).
        assert_eq!(schema_instance(&json!({"type": "string", "format": "date", "minLength": 12}), "x"), json!("2026-01-01"));
        // Keywords beside a reference refine it (draft 2019).
        let v = schema_instance(&json!({"$defs": {"S": {"type": "string"}}, "$ref": "#/$defs/S", "minLength": 5}), "ab");
        assert_eq!(v, json!("abxxx"));
    }

    fn weather_tools() -> ToolRequest {
        let tools = vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                "required": ["city", "days"]}}}),
            json!({"type": "function", "function": {"name": "now"}}),
        ];
        ToolRequest { tools, choice: ToolChoice::Auto }
    }

    #[test]
    fn the_emulated_model_calls_once_per_user_turn() {
        let auto = weather_tools();
        let asked = [turn("system", "s"), turn("user", "Paris")];
        let call = auto.plan(&asked).expect("a call after a user message");
        assert_eq!((call.mode, call.name.as_str()), (CallMode::Auto, "get_weather"));
        assert_eq!(call.arguments, json!({"city": "Paris", "days": 1}));
        assert_eq!(
            call.text(),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 1}}\n</tool_call>"
        );
        // After the tool's result: text.
        let answered = [turn("user", "Paris"), turn("assistant", ""), turn("tool", "21 C")];
        assert_eq!(auto.plan(&answered), None);
        // "required" calls anyway (the first tool), a named choice the named one, "none" never.
        let required = ToolRequest { choice: ToolChoice::Required, ..weather_tools() };
        let call = required.plan(&answered).expect("required calls");
        assert_eq!(call.text(), "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 1}}]");
        let named = ToolRequest { choice: ToolChoice::Named("now".into()), ..weather_tools() };
        let call = named.plan(&asked).expect("named calls");
        assert_eq!((call.name.as_str(), call.text().as_str()), ("now", "{}"));
        let none = ToolRequest { choice: ToolChoice::None, ..weather_tools() };
        assert_eq!(none.plan(&asked), None);
    }

    #[test]
    fn generated_calls_read_back_as_vllm_reads_them() {
        let call = weather_tools().plan(&[turn("user", "Paris")]).unwrap();
        let text = format!("Let me look.{}", call.text());
        let ToolOutput::Call { mode, call: read, content_end, call_end } = read_tool_output(&ToolChoice::Auto, &text) else {
            panic!("no call read from {text}");
        };
        assert_eq!((mode, content_end, call_end), (CallMode::Auto, "Let me look.".len(), text.len()));
        assert_eq!((read.name.as_str(), read.arguments.as_str()), ("get_weather", "{\"city\": \"Paris\", \"days\": 1}"));
        // A call cut before its JSON ends is content (vLLM's parser fails on it).
        let cut = &text[..text.len() - 20];
        assert_eq!(read_tool_output(&ToolChoice::Auto, cut), ToolOutput::Text);
        assert_eq!(read_tool_output(&ToolChoice::Auto, "plain answer"), ToolOutput::Text);
        assert_eq!(read_tool_output(&ToolChoice::None, &text), ToolOutput::Text);
        // Named: the text is the arguments as they are.
        let named = read_tool_output(&ToolChoice::Named("now".into()), "{}");
        assert!(matches!(named, ToolOutput::Call { mode: CallMode::Named, content_end: 0, call_end: 2, ref call }
            if call.name == "now" && call.arguments == "{}"), "{named:?}");
        // Required: a list of calls; cut, vLLM's validation error.
        let required = weather_tools().plan(&[turn("user", "Paris")]).map(|c| PlannedCall { mode: CallMode::Required, ..c }).unwrap();
        let out = read_tool_output(&ToolChoice::Required, &required.text());
        assert!(matches!(out, ToolOutput::Call { mode: CallMode::Required, ref call, .. }
            if call.name == "get_weather" && call.arguments == "{\"city\": \"Paris\", \"days\": 1}"), "{out:?}");
        let ToolOutput::Unparsed(why) = read_tool_output(&ToolChoice::Required, "[{\"name\": \"get_we") else {
            panic!("a cut list parsed");
        };
        assert!(why.starts_with("1 validation error for list[FunctionDefinition]"), "{why}");
        // The hermes markers are single tokens of Qwen3's vocabulary.
        assert_eq!(tokens::count("<tool_call>"), 1);
        assert_eq!(tokens::count("</tool_call>"), 1);
    }

    #[test]
    fn tool_fields_are_checked_as_vllm_checks_them() {
        let tools = json!([{"type": "function", "function": {"name": "now"}}]);
        let err = |tools: Option<Value>, choice: Option<Value>| check_tools(tools, choice).err().map(|e| (e.param, e.message));
        let (param, message) = err(None, Some(json!("auto"))).unwrap();
        assert_eq!((param.as_deref(), message.as_str()), (Some("tool_choice"), "When using `tool_choice`, `tools` must be set."));
        let (param, message) = err(Some(tools.clone()), Some(json!({"type": "function", "function": {"name": "later"}}))).unwrap();
        assert_eq!(param.as_deref(), Some("tool_choice"));
        assert_eq!(message, "The tool specified in `tool_choice` does not match any of the specified `tools`");
        assert!(err(Some(tools.clone()), Some(json!("always"))).unwrap().1.starts_with("Invalid value for `tool_choice`: always!"));
        assert!(err(Some(tools.clone()), Some(json!({"function": {}}))).unwrap().1.starts_with("Expected field `name`"));
        assert_eq!(err(Some(json!([{"type": "retrieval"}])), None).unwrap().0.as_deref(), Some("tools"));
        assert_eq!(err(Some(json!([{"type": "function", "function": {}}])), None).unwrap().0.as_deref(), Some("tools"));
        assert_eq!(err(Some(json!({"name": "now"})), None).unwrap().0.as_deref(), Some("tools"));
        // Defaults: tools without a choice are "auto"; "none" and null need no tools; "required"
        // or "auto" over no tools is a plain request; `type` may be left out.
        let checked = check_tools(Some(tools.clone()), None).unwrap().unwrap();
        assert_eq!(checked.choice, ToolChoice::Auto);
        assert_eq!(check_tools(None, Some(json!("none"))).unwrap(), None);
        assert_eq!(check_tools(None, Some(Value::Null)).unwrap(), None);
        assert_eq!(check_tools(Some(json!([])), Some(json!("required"))).unwrap(), None);
        assert_eq!(check_tools(None, None).unwrap(), None);
        let untyped = check_tools(Some(json!([{"function": {"name": "now"}}])), Some(json!({"type": "function", "function": {"name": "now"}})));
        assert_eq!(untyped.unwrap().map(|t| t.choice), Some(ToolChoice::Named("now".into())));
        assert_eq!(check_tools(Some(tools), Some(json!("none"))).unwrap().map(|t| t.choice), Some(ToolChoice::None));
    }

    #[test]
    fn python_json_is_json_dumps() {
        let v = json!({"b": [1, 2.5, 1e20], "a": "é\n\"", "c": null, "d": {}});
        assert_eq!(python_json(&v), "{\"a\": \"é\\n\\\"\", \"b\": [1, 2.5, 1e+20], \"c\": null, \"d\": {}}");
    }

    #[test]
    fn messages_carry_their_tool_calls_into_the_template() {
        let m: ChatMessage = serde_json::from_value(json!({"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                           {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": {"tz": "UTC"}}}]}))
        .unwrap();
        let t = m.into_turn();
        assert_eq!(t.content, "");
        assert_eq!(
            t.tool_calls,
            vec![
                tokens::TurnToolCall { name: "get_weather".into(), arguments: "{\"city\": \"Paris\"}".into() },
                tokens::TurnToolCall { name: "now".into(), arguments: "{\"tz\":\"UTC\"}".into() },
            ]
        );
        let m: ChatMessage = serde_json::from_value(json!({"role": "tool", "tool_call_id": "call_1", "content": "21 C"})).unwrap();
        assert_eq!((m.tool_call_id.clone(), m.into_turn().content), (Some("call_1".to_string()), "21 C".to_string()));
    }

    /// Structured output: a pydantic-style schema (nested model by `$ref`, an `Optional` field
    /// as `anyOf` with null) gets an instance that has every required field with its type;
    /// `json_object` an object; the format is checked as vLLM's `ResponseFormat`.
    #[test]
    fn a_response_format_gets_an_instance_of_its_schema() {
        let schema = json!({
            "$defs": {"Step": {"type": "object", "properties": {"tool": {"type": "string"}, "n": {"type": "integer", "minimum": 2}},
                "required": ["tool", "n"]}},
            "properties": {
                "steps": {"type": "array", "items": {"$ref": "#/$defs/Step"}},
                "first": {"$ref": "#/$defs/Step"},
                "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "done": {"type": "boolean"},
                "kind": {"enum": ["plan", "answer"]},
            },
            "required": ["steps", "first", "note", "done", "kind"],
            "title": "Plan", "type": "object",
        });
        let user = tokens::ChatTurn { role: "user".into(), content: "Plan a trip".into(), tool_calls: Vec::new() };
        let f = check_response_format(Some(json!({"type": "json_schema", "json_schema": {"name": "Plan", "schema": schema}}))).unwrap();
        let text = f.clone().map(|f| f.text(std::slice::from_ref(&user))).unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v, json!({"steps": [], "first": {"tool": "Plan a trip", "n": 2}, "note": "Plan a trip", "done": true, "kind": "plan"}), "{text}");
        // A self-referential schema ends (the depth bound).
        let tree = json!({"$defs": {"Node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Node"}}, "required": ["child"]}},
            "$ref": "#/$defs/Node"});
        assert!(schema_instance(&tree, "x").is_object());
        let object = check_response_format(Some(json!({"type": "json_object"}))).unwrap().map(|f| f.text(&[user]));
        assert_eq!(object.as_deref(), Some("{\"answer\": \"Plan a trip\"}"));
        assert_eq!(check_response_format(Some(json!({"type": "text"}))).unwrap(), None);
        for bad in [json!({"type": "yaml"}), json!({"type": "json_schema"}), json!({"type": "json_schema", "json_schema": {"schema": {}}}),
            json!({"type": "json_schema", "json_schema": {"name": "a", "schema": 3}})] {
            assert!(check_response_format(Some(bad.clone())).is_err(), "{bad}");
        }
    }

    /// What validators check of common pydantic / zod schemas holds for the instance: nested
    /// models four levels down through `$ref`s (references are not nesting), an `Optional`
    /// model, `allOf: [$ref]`, list lengths, tuples, formats, string lengths, numeric bounds.
    #[test]
    fn instances_satisfy_the_constraints_validators_check() {
        let schema = json!({
            "$defs": {
                "Geo": {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90}}, "required": ["lat"]},
                "Address": {"type": "object", "properties": {"geo": {"$ref": "#/$defs/Geo"}, "street": {"type": "string", "minLength": 3}}, "required": ["geo", "street"]},
                "Person": {"type": "object", "properties": {"address": {"$ref": "#/$defs/Address"}, "name": {"type": "string", "maxLength": 4}}, "required": ["address", "name"]},
            },
            "type": "object",
            "properties": {
                "ceo": {"$ref": "#/$defs/Person"},
                "deputy": {"anyOf": [{"$ref": "#/$defs/Person"}, {"type": "null"}]},
                "founder": {"allOf": [{"$ref": "#/$defs/Person"}], "description": "the first"},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string", "format": "uuid"}]},
                "when": {"type": "string", "format": "date-time"},
                "gt5": {"type": "integer", "exclusiveMinimum": 5},
                "le0": {"type": "integer", "maximum": 0},
                "even": {"type": "integer", "minimum": 3, "multipleOf": 2},
                "share": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.5},
            },
            "required": ["ceo", "deputy", "founder", "tags", "pair", "when", "gt5", "le0", "even", "share"],
        });
        let v = schema_instance(&schema, "");
        let person = json!({"address": {"geo": {"lat": -90.0}, "street": "xxx"}, "name": ""});
        assert_eq!((&v["ceo"], &v["deputy"], &v["founder"]), (&person, &person, &person), "{v}");
        assert_eq!(v["tags"], json!(["", ""]), "{v}");
        assert_eq!(v["pair"], json!([1, "00000000-0000-4000-8000-000000000000"]), "{v}");
        assert_eq!(v["when"], "2026-01-01T00:00:00Z");
        assert_eq!((&v["gt5"], &v["le0"], &v["even"], &v["share"]), (&json!(6), &json!(0), &json!(4), &json!(0.25)), "{v}");
        // A name longer than `maxLength` is cut.
        assert_eq!(schema_instance(&json!({"type": "string", "maxLength": 4}), "Paris"), json!("Pari"));
        // A schema that references itself many times over ends within the value budget.
        let mut props = serde_json::Map::new();
        for i in 0..2000 {
            props.insert(format!("p{i}"), json!({"$ref": "#/$defs/A"}));
        }
        let required: Vec<String> = (0..2000).map(|i| format!("p{i}")).collect();
        let hostile = json!({"$defs": {"A": {"type": "object", "properties": props, "required": required}}, "$ref": "#/$defs/A"});
        let v = schema_instance(&hostile, "x");
        fn count(v: &Value) -> usize {
            1 + match v {
                Value::Object(o) => o.values().map(count).sum(),
                Value::Array(a) => a.iter().map(count).sum(),
                _ => 0,
            }
        }
        assert!(count(&v) <= 2 * MAX_INSTANCE_VALUES + 1, "{}", count(&v));
    }

    /// As vLLM 0.10.2: an earlier call needs its id and type, and arguments that are JSON text.
    #[test]
    fn earlier_tool_calls_are_checked_as_vllm_checks_them() {
        let with = |call: Value| -> Vec<ChatMessage> {
            vec![serde_json::from_value(json!({"role": "assistant", "content": null, "tool_calls": [call]})).unwrap()]
        };
        let ok = json!({"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}});
        assert!(check_message_tool_calls(&with(ok)).is_ok());
        for bad in [
            json!({"id": "c", "type": "function", "function": {"name": "f", "arguments": "{bad"}}),
            json!({"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}),
            json!({"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}),
            json!({"type": "function", "function": {"name": "f", "arguments": "{}"}}),
            json!({"id": "c", "function": {"name": "f", "arguments": "{}"}}),
        ] {
            let e = check_message_tool_calls(&with(bad.clone())).expect_err("refused");
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn token_strings_are_byte_level_bpe_spellings() {
        assert_eq!(token_str(b" hello"), "\u{120}hello");
        assert_eq!(token_str(b"\n"), "\u{10A}");
        assert_eq!(token_str(b"<|im_end|>"), "<|im_end|>");
    }
}
