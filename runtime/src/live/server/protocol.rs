//! The request side of the emulate server's OpenAI-compatible API, as vLLM 0.10.2–0.12's
//! `vllm/entrypoints/openai/protocol.py` and `SamplingParams._verify_args` have it: the request
//! bodies, the validation of the sampling parameters (a bad value is a 400 whose `param` names
//! the field), vLLM's error body `{"error": {"message", "type", "param", "code"}}` with the
//! integer HTTP status as `code` (`ErrorInfo` since vLLM 0.10), and the shaping of an emulated
//! output by `max_tokens`, `min_tokens`, `ignore_eos`, `stop` and `stop_token_ids`.
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

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
}

impl ChatMessage {
    /// (role, text): the text parts of a multi-part content, concatenated.
    pub fn into_pair(self) -> (String, String) {
        let content = match self.content {
            None => String::new(),
            Some(MessageContent::Text(t)) => t,
            Some(MessageContent::Parts(parts)) => parts.into_iter().filter_map(|p| p.text).collect(),
        };
        (self.role, content)
    }
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
    #[serde(flatten)]
    pub sampling: Sampling,
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

/// Renders chat messages with Qwen3's chat template ([`tokens::chat_template`]: per message
/// `<|im_start|>role\ncontent<|im_end|>\n`, tool results as a user turn of
/// `<tool_response>` blocks, earlier assistant turns' reasoning dropped before the last user
/// query; then the generation prompt, with the empty thinking block when `enable_thinking` is
/// false), the prompt a Qwen3 vLLM server tokenises; its special markers are single tokens.
/// Tool definitions and assistant tool calls are not rendered.
pub fn render_chat(messages: &[(String, String)], enable_thinking: bool) -> String {
    render_chat_prompt(messages, enable_thinking, true)
}

/// [`render_chat`], with or without the generation prompt (`/tokenize`'s
/// `add_generation_prompt`).
pub fn render_chat_prompt(
    messages: &[(String, String)],
    enable_thinking: bool,
    add_generation_prompt: bool,
) -> String {
    let pairs: Vec<(&str, &str)> = messages.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
    tokens::chat_template(&pairs, enable_thinking, add_generation_prompt)
}

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

    #[test]
    fn token_strings_are_byte_level_bpe_spellings() {
        assert_eq!(token_str(b" hello"), "\u{120}hello");
        assert_eq!(token_str(b"\n"), "\u{10A}");
        assert_eq!(token_str(b"<|im_end|>"), "<|im_end|>");
    }
}
