//! The front door: OpenAI-compatible `POST /v1/chat/completions`, `POST /v1/completions` and
//! `GET /v1/models`, where an external agent framework (LangGraph, the OpenAI Agents SDK, …)
//! sends its LLM calls so that Switchyard schedules them on the pool with the same planner core
//! as its own workflows.
//!
//! The program key comes from the `X-Session-ID` header (also accepted: `x-dynamo-session-id`,
//! `X-Program-ID`, and a body field `program_id`, as Dynamo, ORACLE and ThunderAgent send it);
//! calls without one are programs of one call. Hints: `X-Program-Done: true` or a body field
//! `program_done: true` ends the program after this call; `X-Next-Model` (or body
//! `next_model`) names the model of the program's next call, which the planner then sees as
//! near-ready while the client works (paper 003 §3.2: it may prefetch or keep that model);
//! `X-Step-ID` (also `X-Node-ID`, or body `step_id` / `node_id`; 1–128 bytes) names the step of
//! the agent this call is, so the planner keeps output-length and tool-gap histories (the P90
//! timing output, TAO's readiness) per step across programs. The body's `model` names a served
//! model (`Qwen3-8B` or `Qwen/Qwen3-8B`); `max_tokens` (or `max_completion_tokens`) is the
//! answer's limit. Without one, a chat completion gets what the served context leaves after the
//! prompt, vLLM's default, or the server's `--default-max-tokens` where set (vLLM's
//! generation-config `max_new_tokens`), capped by that rest — the planner reserves KV for the
//! limit, so the flag bounds what a call without one holds — and a completion gets
//! [`COMPLETIONS_DEFAULT_MAX_TOKENS`], as vLLM's does; Qwen3's thinking mode follows
//! `chat_template_kwargs.enable_thinking` (default on, as vLLM serves Qwen3).
//!
//! `model: switchyard-router` (a runtime with a router) routes the program (paper 002): it is
//! bound at its first such call to one of the router's models by the planner core's router, its
//! later routed calls run there, the binding is journaled (and kept across a restart), and
//! `POST /v1/programs/{key}/verdict` takes its grader's verdict once it has ended.
//!
//! Answers have OpenAI's shapes, with `usage.prompt_tokens_details.cached_tokens`; a stream
//! (`stream: true`) carries the engine's text as it arrives, chunk by chunk, then a chunk with
//! the finish reason, the usage chunk when `stream_options.include_usage` asks for it, and
//! `data: [DONE]`. A client that disconnects abandons its call: the engine drops its upstream
//! connection, so the server aborts the request.
//!
//! Function calling and stop strings are passed on: `tools` (function tools, checked: type,
//! name, schema object), `tool_choice` (`none`, `auto`, `required` or a named function among
//! the tools), earlier turns' `tool_calls` and tool results' `tool_call_id` reach the engine as
//! the client sent them, and the prompt the planner counts is Qwen3's template with the tools
//! block and those calls (`tokens::chat_template_with_tools`); an answer's tool calls come back
//! as `message.tool_calls` (content `null` without text) or, streamed, as one chunk of whole
//! calls before the finish, with the engine's finish reason (`tool_calls`). The engine decides
//! the calls: vLLM launched with a tool parser (Switchyard's managed vLLM for Qwen3: `hermes`),
//! or the emulated server's stand-in rule. `stop` (a string or up to 16) ends the answer
//! before the first match, on the engine. `response_format` (`json_object`, or `json_schema`
//! with its name and schema) asks the engine for structured output (vLLM's guided decoding).
//! Parameters the front door does not honour
//! (`n > 1`, `logprobs`, legacy `functions`, a list of prompts, …) are refused
//! with a 400 naming them, unless set to what leaving them out means (`stop: []`,
//! `tool_choice: "none"`, `response_format: {"type": "text"}`, …).
//!
//! Depends on `crate::live` (the service, its engines' token sinks, the planner and program
//! actors' messages) and `crate::tokens`; must not depend on the simulator.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{Api, ApiError, JsonBody, public_reason};
use crate::live::actors::off_the_reactor;
use crate::live::engine::{Completion, TokenSink};
use crate::live::program_actor::ProgramRequest;
use crate::tokens;

/// A chat completion's limit when the request gives none: the program actor applies the front
/// door's default ([`crate::live::ServedModel::default_max_tokens`], `serve
/// --default-max-tokens`) where set, and clamps to what the served context leaves after the
/// prompt — vLLM's default for chat completions (`max_model_len` − prompt tokens).
pub const CHAT_DEFAULT_MAX_TOKENS: u32 = u32::MAX;

/// A completion's limit when the request gives none: 16, vLLM's `CompletionRequest` default
/// (and OpenAI's legacy completions').
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;

/// Headers that carry the program key, in order of precedence.
pub const PROGRAM_HEADERS: [&str; 3] = ["x-session-id", "x-dynamo-session-id", "x-program-id"];

/// Request fields the front door refuses rather than ignore silently.
const UNSUPPORTED: [&str; 7] = ["logprobs", "top_logprobs", "echo", "functions", "function_call", "best_of", "suffix"];

/// Most tool definitions one call may carry, and most stop strings.
const MAX_TOOLS: usize = 128;
const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string, in bytes.
const MAX_STOP_BYTES: usize = 1024;

/// Whether `name` is a function name OpenAI accepts: 1–64 of `a-z A-Z 0-9 _ -`.
fn function_name_ok(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The call's tool definitions (`tools`: OpenAI's `[{"type": "function", "function": {"name",
/// "description"?, "parameters"?}}]`), checked, and its `tool_choice`, checked against them:
/// `"none"`, `"auto"`, `"required"`, or `{"type": "function", "function": {"name": N}}` naming
/// one of them. A `tool_choice` other than `"none"` without tools is refused, as vLLM refuses
/// it. Empty `tools` are no tools.
fn parse_tools(obj: &serde_json::Map<String, Value>) -> Result<(Vec<Value>, Option<Value>), ApiError> {
    let tools = match obj.get("tools").filter(|v| !v.is_null()) {
        None => Vec::new(),
        Some(Value::Array(list)) if list.len() > MAX_TOOLS => {
            return Err(ApiError::bad_request(format!("`tools` lists {} tools; at most {MAX_TOOLS} are accepted", list.len()), "tools"));
        }
        Some(Value::Array(list)) => list.clone(),
        Some(_) => return Err(ApiError::bad_request("`tools` must be an array of function tools", "tools")),
    };
    let mut names = Vec::with_capacity(tools.len());
    let mut forwarded = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let field = format!("tools[{i}]");
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::bad_request(format!("{field}.type must be \"function\""), &format!("{field}.type")));
        }
        let Some(function) = tool.get("function").and_then(Value::as_object) else {
            return Err(ApiError::bad_request(format!("{field}.function must be an object"), &format!("{field}.function")));
        };
        let name = function.get("name").and_then(Value::as_str).unwrap_or("");
        if !function_name_ok(name) {
            return Err(ApiError::bad_request(
                format!("{field}.function.name must be 1 to 64 letters, digits, `_` or `-`"),
                &format!("{field}.function.name"),
            ));
        }
        if function.get("parameters").is_some_and(|p| !p.is_null() && !p.is_object()) {
            return Err(ApiError::bad_request(format!("{field}.function.parameters must be a JSON Schema object"), &format!("{field}.function.parameters")));
        }
        if function.get("description").is_some_and(|d| !d.is_null() && !d.is_string()) {
            return Err(ApiError::bad_request(format!("{field}.function.description must be a string"), &format!("{field}.function.description")));
        }
        names.push(name);
        // What the engine gets and the prompt counts: the tool's type and function only (vLLM
        // would render any other field of the tool into the prompt, uncounted here).
        forwarded.push(json!({"type": "function", "function": function}));
    }
    let choice = match obj.get("tool_choice").filter(|v| !v.is_null()) {
        None => None,
        Some(Value::String(s)) if s == "none" => Some(Value::String(s.clone())),
        Some(_) if tools.is_empty() => return Err(ApiError::bad_request("`tool_choice` needs `tools`", "tool_choice")),
        Some(Value::String(s)) if s == "auto" || s == "required" => Some(Value::String(s.clone())),
        Some(v @ Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = v.pointer("/function/name").and_then(Value::as_str).unwrap_or("");
            if !names.contains(&name) {
                return Err(ApiError::bad_request(format!("`tool_choice` names `{name}`, which is not among `tools`"), "tool_choice"));
            }
            Some(json!({"type": "function", "function": {"name": name}}))
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "`tool_choice` must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}",
                "tool_choice",
            ));
        }
    };
    Ok((forwarded, choice))
}

/// The call's `response_format`, checked and rebuilt for the engine: `{"type": "text"}` (or
/// none) asks for nothing; `{"type": "json_object"}`; `{"type": "json_schema", "json_schema":
/// {"name", "schema"?, "description"?, "strict"?}}` with a name of 1–64 letters, digits, `_`
/// or `-` and a JSON-Schema object — OpenAI's and vLLM's shape, which vLLM enforces by guided
/// decoding.
fn parse_response_format(obj: &serde_json::Map<String, Value>) -> Result<Option<Value>, ApiError> {
    let Some(format) = obj.get("response_format").filter(|v| !v.is_null()) else { return Ok(None) };
    let bad = |field: &str, why: &str| ApiError::bad_request(format!("`{field}` {why}"), field);
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let spec = format.get("json_schema").and_then(Value::as_object).ok_or_else(|| bad("response_format.json_schema", "must be an object"))?;
            let name = spec.get("name").and_then(Value::as_str).unwrap_or("");
            if !function_name_ok(name) {
                return Err(bad("response_format.json_schema.name", "must be 1 to 64 letters, digits, `_` or `-`"));
            }
            let mut out = serde_json::Map::new();
            out.insert("name".into(), json!(name));
            if let Some(schema) = spec.get("schema").filter(|v| !v.is_null()) {
                if !schema.is_object() {
                    return Err(bad("response_format.json_schema.schema", "must be a JSON Schema object"));
                }
                out.insert("schema".into(), schema.clone());
            }
            if let Some(d) = spec.get("description").filter(|v| !v.is_null()) {
                out.insert("description".into(), Value::String(d.as_str().ok_or_else(|| bad("response_format.json_schema.description", "must be a string"))?.into()));
            }
            if let Some(strict) = spec.get("strict").filter(|v| !v.is_null()) {
                out.insert("strict".into(), Value::Bool(strict.as_bool().ok_or_else(|| bad("response_format.json_schema.strict", "must be a boolean"))?));
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": out})))
        }
        _ => Err(bad("response_format.type", "must be `text`, `json_object` or `json_schema`")),
    }
}

/// The call's stop strings (`stop`: a string or a list of them), at most [`MAX_STOP_STRINGS`]
/// of at most [`MAX_STOP_BYTES`] bytes each; empty strings are refused, as vLLM refuses them.
fn parse_stop(obj: &serde_json::Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let stop: Vec<&Value> = match obj.get("stop").filter(|v| !v.is_null()) {
        // Nothing, or what frameworks send for nothing.
        None => return Ok(Vec::new()),
        Some(Value::String(s)) if s.is_empty() => return Ok(Vec::new()),
        Some(v @ Value::String(_)) => vec![v],
        Some(Value::Array(list)) if list.len() > MAX_STOP_STRINGS => {
            return Err(ApiError::bad_request(format!("`stop` lists {} strings; at most {MAX_STOP_STRINGS} are accepted", list.len()), "stop"));
        }
        Some(Value::Array(list)) => list.iter().collect(),
        Some(_) => return Err(ApiError::bad_request("`stop` must be a string or a list of strings", "stop")),
    };
    stop.into_iter()
        .map(|v| match v.as_str() {
            Some(s) if !s.is_empty() && s.len() <= MAX_STOP_BYTES => Ok(s.to_string()),
            _ => Err(ApiError::bad_request(format!("each stop string must be 1 to {MAX_STOP_BYTES} bytes of text"), "stop")),
        })
        .collect()
}

/// An assistant message's `tool_calls` (OpenAI's `[{"id", "type": "function", "function":
/// {"name", "arguments"}}]`), checked and rebuilt for the engine as vLLM takes them: it parses
/// each call's `arguments` as JSON text (a 400 otherwise) and requires `id` and `type`. A call
/// whose arguments are not JSON text is refused here, naming it; arguments sent as an object
/// are written out as text, and a missing (or empty, or null) `id` or `type` is filled in
/// (`call_{i}_{k}`, `function`), so what the engine gets is what vLLM accepts.
fn message_tool_calls(i: usize, calls: &Value) -> Result<Value, ApiError> {
    let field = format!("messages[{i}].tool_calls");
    let list = calls.as_array().ok_or_else(|| ApiError::bad_request(format!("{field} must be an array"), &field))?;
    let mut out = Vec::with_capacity(list.len());
    for (k, c) in list.iter().enumerate() {
        let bad = |why: &str| {
            ApiError::bad_request(
                format!("{field}[{k}] {why}: a call is {{\"id\": …, \"type\": \"function\", \"function\": {{\"name\": …, \"arguments\": \"{{…}}\"}}}}"),
                &format!("{field}[{k}]"),
            )
        };
        let name = c.pointer("/function/name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or_else(|| bad("has no function name"))?;
        let arguments = match c.pointer("/function/arguments") {
            Some(Value::String(text)) if serde_json::from_str::<Value>(text).is_ok() => text.clone(),
            Some(v @ Value::Object(_)) => v.to_string(),
            _ => return Err(bad("has arguments that are not JSON text")),
        };
        if c.get("type").is_some_and(|t| !t.is_null() && t.as_str() != Some("function")) {
            return Err(bad("is not of type \"function\""));
        }
        let id = match c.get("id") {
            Some(Value::String(id)) if !id.is_empty() => id.clone(),
            None | Some(Value::Null) => format!("call_{i}_{k}"),
            Some(Value::String(_)) => format!("call_{i}_{k}"),
            Some(_) => return Err(bad("has an `id` that is not a string")),
        };
        out.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}));
    }
    Ok(Value::Array(out))
}

#[derive(Clone, Copy, PartialEq)]
enum Flavor {
    Chat,
    Completions,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Longest accepted step hint.
const MAX_STEP_ID_BYTES: usize = 128;

/// Longest accepted program key (`X-Session-ID` and its aliases, or `program_id`).
const MAX_PROGRAM_KEY_BYTES: usize = 256;

/// The program a call belongs to: the first of the known headers, else the body's
/// `program_id`; `None` (a program of this call alone) when absent or empty. A key that is
/// not visible ASCII, not a string, or longer than [`MAX_PROGRAM_KEY_BYTES`] is refused (400)
/// rather than silently dropped, which would cut the caller's program into one-call programs.
fn program_key(headers: &HeaderMap, body: &Value) -> Result<Option<String>, ApiError> {
    let key = match PROGRAM_HEADERS.iter().find_map(|h| headers.get(*h).map(|v| (*h, v))) {
        Some((h, v)) => {
            let v = v.to_str().map_err(|_| ApiError::bad_request(format!("`{h}` must be visible ASCII"), "program_id"))?;
            v.to_string()
        }
        None => match body.get("program_id").filter(|v| !v.is_null()) {
            // The header's rule (visible ASCII and spaces), so a key means the same either way.
            Some(Value::String(s)) if s.bytes().any(|b| !(b' '..=b'~').contains(&b)) => {
                return Err(ApiError::bad_request("`program_id` must be visible ASCII", "program_id"));
            }
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(ApiError::bad_request("`program_id` must be a string", "program_id")),
            None => return Ok(None),
        },
    };
    if key.len() > MAX_PROGRAM_KEY_BYTES {
        return Err(ApiError::bad_request(
            format!("the program key (`X-Session-ID` or `program_id`) is {} bytes; at most {MAX_PROGRAM_KEY_BYTES} are accepted", key.len()),
            "program_id",
        ));
    }
    Ok((!key.is_empty()).then_some(key))
}


/// Whether unsupported parameter `field` is set to what leaving it out means, as frameworks
/// send it (LangChain sends `stop: []`, agent SDKs `tools: []` and `tool_choice: "none"`):
/// `null`, `false`, an empty list or string, `tool_choice: "none"`, `response_format: {"type":
/// "text"}`, `best_of: 1`, `top_logprobs: 0`. Anything else is refused by name.
fn neutral(field: &str, v: &Value) -> bool {
    match (field, v) {
        (_, Value::Null | Value::Bool(false)) => true,
        (_, Value::Array(a)) => a.is_empty(),
        (_, Value::String(s)) if s.is_empty() => true,
        ("tool_choice", Value::String(s)) => s == "none",
        ("response_format", Value::Object(o)) => o.len() == 1 && o.get("type").and_then(Value::as_str) == Some("text"),
        ("best_of", n) => n.as_u64() == Some(1),
        ("top_logprobs", n) => n.as_u64() == Some(0),
        _ => false,
    }
}

fn truthy(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s.eq_ignore_ascii_case("true") || s == "1",
        _ => false,
    }
}

/// The request, checked: what the program actor needs, the model, and how to answer.
struct Parsed {
    model: String,
    request: ProgramRequest,
    stream: bool,
    include_usage: bool,
}

fn parse(flavor: Flavor, headers: &HeaderMap, body: &Value) -> Result<Parsed, ApiError> {
    let obj = body.as_object().ok_or_else(|| ApiError::bad_request("the body must be a JSON object", "body"))?;
    let model = obj
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("`model` is required", "model"))?
        .to_string();
    for f in UNSUPPORTED {
        if obj.get(f).is_some_and(|v| !neutral(f, v)) {
            return Err(ApiError::bad_request(format!("`{f}` is not supported by this front door"), f));
        }
    }
    if let Some(n) = obj.get("n").filter(|v| !v.is_null())
        && n.as_u64() != Some(1)
    {
        return Err(ApiError::bad_request("only `n: 1` is supported", "n"));
    }
    let max_tokens = match obj.get("max_completion_tokens").or_else(|| obj.get("max_tokens")).filter(|v| !v.is_null()) {
        None if flavor == Flavor::Chat => CHAT_DEFAULT_MAX_TOKENS,
        None => COMPLETIONS_DEFAULT_MAX_TOKENS,
        Some(v) => match v.as_u64() {
            // Past u32 it saturates below the "no limit given" value: the context caps it.
            Some(n) if n >= 1 => u32::try_from(n).unwrap_or(u32::MAX).min(CHAT_DEFAULT_MAX_TOKENS - 1),
            _ => return Err(ApiError::bad_request("`max_tokens` must be an integer of at least 1", "max_tokens")),
        },
    };
    if let Some(t) = obj.get("temperature").filter(|v| !v.is_null())
        && !t.as_f64().is_some_and(|t| (0.0..=2.0).contains(&t))
    {
        return Err(ApiError::bad_request("`temperature` must be between 0 and 2", "temperature"));
    }
    let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false);
    let enable_thinking = body.pointer("/chat_template_kwargs/enable_thinking").and_then(Value::as_bool).unwrap_or(true);
    let program_done = truthy(headers.get("x-program-done").and_then(|v| v.to_str().ok()).map(|s| Value::String(s.into())).as_ref())
        || truthy(obj.get("program_done"));
    let next_model = headers
        .get("x-next-model")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| obj.get("next_model").and_then(Value::as_str).map(str::to_string));
    let step = match headers.get("x-step-id").or_else(|| headers.get("x-node-id")) {
        Some(v) => Some(v.to_str().map(str::to_string).map_err(|_| ApiError::bad_request("`X-Step-ID` must be visible ASCII", "step_id"))?),
        None => match obj.get("step_id").or_else(|| obj.get("node_id")).filter(|v| !v.is_null()) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(ApiError::bad_request("`step_id` must be a string", "step_id")),
            None => None,
        },
    };
    if let Some(s) = &step
        && (s.is_empty() || s.len() > MAX_STEP_ID_BYTES)
    {
        return Err(ApiError::bad_request(format!("`step_id` must be 1 to {MAX_STEP_ID_BYTES} bytes"), "step_id"));
    }
    let (messages, prompt) = match flavor {
        Flavor::Chat => {
            let list = obj
                .get("messages")
                .and_then(Value::as_array)
                .filter(|l| !l.is_empty())
                .ok_or_else(|| ApiError::bad_request("`messages` must be a non-empty array", "messages"))?;
            let mut out = Vec::with_capacity(list.len());
            for (i, m) in list.iter().enumerate() {
                let role = m.get("role").and_then(Value::as_str).unwrap_or("");
                if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
                    return Err(ApiError::bad_request(format!("messages[{i}].role `{role}` is not a chat role"), &format!("messages[{i}].role")));
                }
                let content = match m.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Null) | None if role == "assistant" => String::new(),
                    // Content parts: text parts are joined; anything else is refused.
                    Some(Value::Array(parts)) => {
                        let mut text = String::new();
                        for p in parts {
                            match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                                (Some("text"), Some(t)) => text.push_str(t),
                                _ => {
                                    return Err(ApiError::bad_request(
                                        format!("messages[{i}].content: only text parts are supported"),
                                        &format!("messages[{i}].content"),
                                    ));
                                }
                            }
                        }
                        text
                    }
                    _ => return Err(ApiError::bad_request(format!("messages[{i}].content must be text"), &format!("messages[{i}].content"))),
                };
                let role = if role == "developer" { "system" } else { role };
                let mut message = json!({"role": role, "content": content});
                if role == "assistant"
                    && let Some(calls) = m.get("tool_calls").filter(|v| !v.is_null())
                {
                    message["tool_calls"] = message_tool_calls(i, calls)?;
                }
                if role == "tool"
                    && let Some(id) = m.get("tool_call_id").filter(|v| !v.is_null())
                {
                    let id = id.as_str().ok_or_else(|| {
                        ApiError::bad_request(format!("messages[{i}].tool_call_id must be a string"), &format!("messages[{i}].tool_call_id"))
                    })?;
                    message["tool_call_id"] = json!(id);
                }
                out.push(message);
            }
            (Some(out), None)
        }
        Flavor::Completions => match obj.get("prompt") {
            Some(Value::String(p)) => (None, Some(p.clone())),
            Some(Value::Array(_)) => {
                return Err(ApiError::bad_request("a list of prompts is not supported: send one request per prompt", "prompt"));
            }
            _ => return Err(ApiError::bad_request("`prompt` must be a string", "prompt")),
        },
    };
    let (tools, tool_choice) = match flavor {
        Flavor::Chat => parse_tools(obj)?,
        Flavor::Completions => match ["tools", "tool_choice"].into_iter().find(|f| obj.get(*f).is_some_and(|v| !neutral(f, v))) {
            Some(f) => return Err(ApiError::bad_request(format!("`{f}` needs the chat API (`/v1/chat/completions`)"), f)),
            None => (Vec::new(), None),
        },
    };
    let parallel_tool_calls = match obj.get("parallel_tool_calls") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b).filter(|_| !tools.is_empty()),
        Some(_) => return Err(ApiError::bad_request("`parallel_tool_calls` must be a boolean", "parallel_tool_calls")),
    };
    let stop = parse_stop(obj)?;
    // Both APIs take it, as vLLM's do.
    let response_format = parse_response_format(obj)?;
    Ok(Parsed {
        model,
        request: ProgramRequest { messages, prompt, max_tokens, enable_thinking, program_done, next_model, step, tools, tool_choice, parallel_tool_calls, stop, response_format },
        stream,
        include_usage,
    })
}

fn usage(c: &Completion) -> Value {
    json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.output_tokens,
        "total_tokens": c.prompt_tokens + c.output_tokens,
        "prompt_tokens_details": { "cached_tokens": c.cached_prompt_tokens },
    })
}

/// Why the answer ended: the engine's own reason where it gave one OpenAI defines (`stop`,
/// `length`, `tool_calls`, `content_filter`), else `length` when the answer reached its limit
/// and `stop` otherwise.
fn finish_reason(c: &Completion, max_tokens: impl Fn(u32) -> u32) -> &'static str {
    // A call the limit cut has arguments that are not whole JSON: OpenAI's `length`, not a
    // call the client would try to run (vLLM's streaming parser says `tool_calls` for it).
    // (Empty arguments are a call without parameters, as some servers send it.)
    let cut_call = || c.tool_calls.iter().any(|t| !t.arguments.is_empty() && serde_json::from_str::<Value>(&t.arguments).is_err());
    match c.finish_reason.as_deref() {
        Some("tool_calls") if cut_call() => "length",
        Some("stop") => "stop",
        Some("length") => "length",
        Some("tool_calls") => "tool_calls",
        Some("content_filter") => "content_filter",
        _ if c.output_tokens >= max_tokens(c.prompt_tokens) => "length",
        _ => "stop",
    }
}

/// An answer's tool calls as OpenAI's `tool_calls` (an id of ours where the engine gave none).
fn tool_calls_json(c: &Completion) -> Value {
    Value::Array(
        c.tool_calls
            .iter()
            .enumerate()
            .map(|(index, t)| {
                let id = if t.id.is_empty() { format!("call_{}", &uuid_like()[..24]) } else { t.id.clone() };
                json!({"index": index, "id": id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}})
            })
            .collect(),
    )
}

async fn handle(api: Arc<Api>, flavor: Flavor, headers: HeaderMap, body: Value) -> Result<Response, ApiError> {
    let parsed = parse(flavor, &headers, &body)?;
    let program = program_key(&headers, &body)?;
    let routed = api.service.is_router_model(&parsed.model);
    let served = if routed { api.service.routed_model() } else { api.service.served_model(&parsed.model).cloned() };
    let Some(served) = served else {
        let m = format!("the model `{}` is not served here; served: {}", parsed.model, api.service.models().join(", "));
        return Err(ApiError { param: Some("model".into()), ..ApiError::new(StatusCode::NOT_FOUND, "model_not_found", m) });
    };
    let context = served.context;
    // A prompt the served context cannot hold is the client's error, as vLLM answers it (400),
    // before anything is scheduled or journaled: at once when its bytes alone say so (no token
    // is longer than `MAX_TOKEN_BYTES`), else by its count, taken off the reactor. (The count is
    // the tokenizer's cached one: the program actor counts the same text again.)
    let prompt = parsed.request.rendered_prompt().0;
    let at_least = prompt.len() / tokens::MAX_TOKEN_BYTES;
    let prompt_tokens = if at_least >= context as usize { None } else { Some(off_the_reactor(|| tokens::count(&prompt))) };
    if prompt_tokens.is_none_or(|n| n >= context as usize) {
        let has = prompt_tokens.map_or_else(|| format!("at least {at_least}"), |n| n.to_string());
        return Err(ApiError {
            param: Some(if flavor == Flavor::Chat { "messages" } else { "prompt" }.into()),
            ..ApiError::new(
                StatusCode::BAD_REQUEST,
                "context_length_exceeded",
                format!("this model's maximum context length is {context} tokens; the prompt has {has} (`{}`)", parsed.model),
            )
        });
    }
    // The limit the program actor applies (before the context's cap): the client's, else the
    // front door's default (`serve --default-max-tokens`), else none.
    let requested = match parsed.request.max_tokens {
        CHAT_DEFAULT_MAX_TOKENS => served.default_max_tokens,
        limit => limit,
    };
    if routed {
        return routed_call(api, flavor, program, parsed, requested).await;
    }
    let (tx, rx) = mpsc::unbounded_channel::<String>();
    let (accepted, done) = api.service.call_admitted(program, &parsed.model, parsed.request, TokenSink::new(tx)).map_err(|e| match e {
        crate::live::ServiceError::NotServed(m) => ApiError { param: Some("model".into()), ..ApiError::new(StatusCode::NOT_FOUND, "model_not_found", m) },
        other => other.into(),
    })?;
    // A refusal (the runtime stops, too many programs are open) has its own status, also for a
    // stream, whose 200 would otherwise be sent first.
    accepted
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", "the runtime dropped the call"))?
        .map_err(call_error)?;
    let answer = Answer { flavor, model: parsed.model, requested, context, stream: parsed.stream, include_usage: parsed.include_usage };
    answer.respond(rx, done).await
}

/// A routed call (`model: switchyard-router`): the program is bound (or was) to one of the
/// router's models (with `--state` the planner records an open routed program in the journal
/// before the binding comes back, so that after a restart it keeps its model); the answer
/// names the bound model, and the
/// `x-switchyard-model` / `x-switchyard-verifier` headers say the binding (the verifier the
/// program's task type selects: the grader the client runs before it posts the verdict).
async fn routed_call(api: Arc<Api>, flavor: Flavor, program: Option<String>, parsed: Parsed, requested: u32) -> Result<Response, ApiError> {
    let Some(key) = program else {
        return Err(ApiError::bad_request(
            "a routed call (`model: switchyard-router`) needs a program key (`X-Session-ID` or `program_id`): the router binds programs, and a verdict names its program by it",
            "program_id",
        ));
    };
    let (tx, rx) = mpsc::unbounded_channel::<String>();
    let (bound, done) = api.service.call_routed(Some(key), parsed.request, TokenSink::new(tx))?;
    let binding = bound
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", "the runtime dropped the call"))?
        .map_err(|m| match call_error(m) {
            e if e.status == StatusCode::BAD_GATEWAY => ApiError { status: StatusCode::SERVICE_UNAVAILABLE, kind: "routing_error", ..e },
            e => e,
        })?;
    let context = api.service.served_model(&binding.model).map_or(0, |s| s.context);
    let answer = Answer { flavor, model: binding.model.clone(), requested, context, stream: parsed.stream, include_usage: parsed.include_usage };
    let mut resp = answer.respond(rx, done).await?;
    for (name, value) in [("x-switchyard-model", &binding.model), ("x-switchyard-verifier", &binding.verifier)] {
        if let Ok(v) = axum::http::HeaderValue::from_str(value) {
            resp.headers_mut().insert(name, v);
        }
    }
    Ok(resp)
}

/// How to answer a scheduled call: its endpoint, the model to name, the client's limit and
/// the served context (the program actor clamps the limit to what the context leaves after the
/// prompt, as vLLM does, and `length` is reported against that), streamed or not.
struct Answer {
    flavor: Flavor,
    model: String,
    requested: u32,
    context: u32,
    stream: bool,
    include_usage: bool,
}

impl Answer {
    async fn respond(
        self,
        rx: mpsc::UnboundedReceiver<String>,
        done: tokio::sync::oneshot::Receiver<Result<Completion, String>>,
    ) -> Result<Response, ApiError> {
        let Answer { flavor, model, requested, context, stream, include_usage } = self;
        let max_tokens = move |prompt: u32| requested.min(context.saturating_sub(prompt)).max(1);
        let id = format!("{}-{}", if flavor == Flavor::Chat { "chatcmpl" } else { "cmpl" }, uuid_like());
        let created = unix_now();
        if !stream {
            // `rx` lives until the answer: dropping it (the client went away, axum dropped this
            // future) abandons the call upstream.
            let result = done.await.map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", "the runtime dropped the call"))?;
            drop(rx);
            let c = result.map_err(call_error)?;
            let choice = match flavor {
                Flavor::Chat if !c.tool_calls.is_empty() => {
                    let mut calls = tool_calls_json(&c);
                    for call in calls.as_array_mut().into_iter().flatten() {
                        call.as_object_mut().map(|o| o.remove("index"));
                    }
                    let content = if c.text.is_empty() { Value::Null } else { Value::String(c.text.clone()) };
                    json!({"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": calls}, "finish_reason": finish_reason(&c, max_tokens)})
                }
                Flavor::Chat => json!({"index": 0, "message": {"role": "assistant", "content": c.text}, "finish_reason": finish_reason(&c, max_tokens)}),
                Flavor::Completions => json!({"index": 0, "text": c.text, "finish_reason": finish_reason(&c, max_tokens)}),
            };
            let object = if flavor == Flavor::Chat { "chat.completion" } else { "text_completion" };
            return Ok(Json(json!({
                "id": id, "object": object, "created": created, "model": model,
                "choices": [choice], "usage": usage(&c),
            }))
            .into_response());
        }
        let render = Render::new(flavor, &id, created, &model, requested, context);
        let st = Streaming { rx, done: Some(done), first: true, tail: std::collections::VecDeque::new(), render, include_usage };
        let events = futures::stream::unfold(st, |mut st| async move {
            loop {
                if let Some(e) = st.tail.pop_front() {
                    return Some((Ok::<_, Infallible>(e), st));
                }
                let done = st.done.as_mut()?;
                let result = tokio::select! {
                    biased;
                    piece = st.rx.recv() => match piece {
                        Some(text) => {
                            let e = st.render.piece(&text, st.first);
                            st.first = false;
                            return Some((Ok(e), st));
                        }
                        None => done.await,
                    },
                    r = &mut *done => r,
                };
                st.done = None;
                // Pieces that arrived just before the answer, then its end.
                while let Ok(text) = st.rx.try_recv() {
                    let e = st.render.piece(&text, st.first);
                    st.first = false;
                    st.tail.push_back(e);
                }
                match result {
                    Ok(Ok(c)) => {
                        if st.first && !c.text.is_empty() {
                            // An engine that does not stream: the whole text at once.
                            st.tail.push_back(st.render.piece(&c.text, true));
                            st.first = false;
                        }
                        if !c.tool_calls.is_empty() {
                            st.tail.push_back(st.render.tool_calls(&c, st.first));
                            st.first = false;
                        }
                        st.tail.push_back(st.render.finish(&c));
                        if st.include_usage {
                            st.tail.push_back(st.render.usage(&c));
                        }
                    }
                    Ok(Err(m)) => {
                        let e = call_error(m);
                        let err = json!({"error": {"message": e.message, "type": e.kind, "param": null, "code": e.status.as_u16()}});
                        st.tail.push_back(Event::default().data(err.to_string()));
                    }
                    Err(_) => {
                        let err = json!({"error": {"message": "the runtime dropped the call", "type": "unavailable_error", "param": null, "code": 503}});
                        st.tail.push_back(Event::default().data(err.to_string()));
                    }
                }
                st.tail.push_back(Event::default().data("[DONE]"));
            }
        });
        Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
    }
}

/// The `Retry-After` of a call refused past `--max-programs`: a slot frees as soon as any keyed
/// program ends (its last call, or 5 idle minutes), so the client may try again shortly. (The
/// server's other refusals carry none: past `--max-workflows` nothing frees a slot until a
/// restart, and a 503 while it stops is not worth retrying on this process.)
pub const PROGRAMS_RETRY_AFTER_S: u32 = 1;

/// Why a scheduled call has no answer, as the client gets it: 503 once the runtime stops (the
/// call refused, or abandoned in the queue or on its engine), 429 with a `Retry-After` of
/// [`PROGRAMS_RETRY_AFTER_S`] for a program past `--max-programs`, 400 when the engine found
/// the request itself invalid (its 400 or 422: a parameter it refuses, a tool schema its
/// guided decoding cannot compile — sending it again cannot help, and OpenAI's clients retry a
/// 5xx), else the engine's failure (502: a model the server does not serve, a server that
/// serves a shorter context than its pool file says, a crash); never with the engine's address.
fn call_error(m: String) -> ApiError {
    use crate::live::engine::INVALID_PREFIX;
    use crate::live::planner_actor::{SHUTTING_DOWN, TOO_MANY_PROGRAMS};
    if m.starts_with(SHUTTING_DOWN) {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", m)
    } else if m.starts_with(TOO_MANY_PROGRAMS) {
        ApiError { retry_after_s: Some(PROGRAMS_RETRY_AFTER_S), ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", m) }
    } else if let Some(why) = m.strip_prefix(INVALID_PREFIX) {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", format!("the engine found the request invalid: {}", public_reason(why)))
    } else {
        ApiError::new(StatusCode::BAD_GATEWAY, "engine_error", public_reason(&m))
    }
}

/// `POST /v1/programs/{key}/verdict` — the verdict of routed program `key` from the client's
/// grader, `{"success": true | false | 0…1}`, once the program has ended: the router's learner
/// learns from it (paper 002's delayed feedback; routing never waits for it). Answers the
/// reward (success − a·cost/scale).
pub(super) async fn program_verdict(
    State(api): State<Arc<Api>>,
    axum::extract::Path(key): axum::extract::Path<String>,
    body: Result<JsonBody<Value>, ApiError>,
) -> Result<Json<Value>, ApiError> {
    let JsonBody(body) = body?;
    let success = match body.get("success") {
        Some(Value::Bool(b)) => f64::from(u8::from(*b)),
        Some(Value::Number(n)) => n.as_f64().filter(|x| (0.0..=1.0).contains(x)).ok_or_else(|| ApiError::bad_request("`success` must be a boolean or a number from 0 to 1", "success"))?,
        _ => return Err(ApiError::bad_request("`success` (a boolean or a number from 0 to 1) is required", "success")),
    };
    let reward = api.service.program_verdict(key.clone(), success).await?;
    Ok(Json(json!({"program": key, "success": success, "reward": reward})))
}

/// A streamed answer in progress: the engine's pieces (`rx`; dropping it — the client went
/// away and axum dropped the stream — cancels the call upstream), the whole answer (`done`),
/// and the events still to send after it.
struct Streaming {
    rx: mpsc::UnboundedReceiver<String>,
    done: Option<tokio::sync::oneshot::Receiver<Result<Completion, String>>>,
    first: bool,
    tail: std::collections::VecDeque<Event>,
    render: Render,
    include_usage: bool,
}

/// The chunks of one streamed answer, rendered without building a JSON tree per piece: the
/// fixed head (`id`, `object`, `created`, `model`) once, each piece's text escaped into it.
struct Render {
    flavor: Flavor,
    head: String,
    /// The request's `max_tokens` and the served context (see `finish_reason`).
    requested: u32,
    context: u32,
}

impl Render {
    fn new(flavor: Flavor, id: &str, created: u64, model: &str, requested: u32, context: u32) -> Self {
        let object = if flavor == Flavor::Chat { "chat.completion.chunk" } else { "text_completion" };
        let head = format!(
            "{{\"id\":{},\"object\":\"{object}\",\"created\":{created},\"model\":{},",
            Value::String(id.to_string()),
            Value::String(model.to_string())
        );
        Render { flavor, head, requested, context }
    }

    fn piece(&self, text: &str, first: bool) -> Event {
        let text = Value::String(text.to_string());
        let choice = match self.flavor {
            Flavor::Chat if first => format!("{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":{text}}},\"finish_reason\":null}}"),
            Flavor::Chat => format!("{{\"index\":0,\"delta\":{{\"content\":{text}}},\"finish_reason\":null}}"),
            Flavor::Completions => format!("{{\"index\":0,\"text\":{text},\"finish_reason\":null}}"),
        };
        Event::default().data(format!("{}\"choices\":[{choice}]}}", self.head))
    }

    /// The answer's tool calls, whole, in one chunk (OpenAI's stream may split a call's
    /// arguments over chunks; clients concatenate them by `index`, so one piece is the same).
    fn tool_calls(&self, c: &Completion, first: bool) -> Event {
        let role = if first { "\"role\":\"assistant\",\"content\":null," } else { "" };
        let choice = format!("{{\"index\":0,\"delta\":{{{role}\"tool_calls\":{}}},\"finish_reason\":null}}", tool_calls_json(c));
        Event::default().data(format!("{}\"choices\":[{choice}]}}", self.head))
    }

    fn finish(&self, c: &Completion) -> Event {
        let reason = finish_reason(c, |prompt| self.requested.min(self.context.saturating_sub(prompt)).max(1));
        let choice = match self.flavor {
            Flavor::Chat => format!("{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"{reason}\"}}"),
            Flavor::Completions => format!("{{\"index\":0,\"text\":\"\",\"finish_reason\":\"{reason}\"}}"),
        };
        Event::default().data(format!("{}\"choices\":[{choice}]}}", self.head))
    }

    fn usage(&self, c: &Completion) -> Event {
        Event::default().data(format!("{}\"choices\":[],\"usage\":{}}}", self.head, usage(c)))
    }
}

/// A random 32-hex-digit id (OpenAI's ids are opaque).
fn uuid_like() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Answer, and count the request by endpoint and status (`switchyard_front_door_requests_total`;
/// a stream counts as its 200, whatever happens later in it).
async fn counted(api: Arc<Api>, flavor: Flavor, headers: HeaderMap, body: Result<Value, ApiError>) -> Response {
    let metrics = Arc::clone(api.service.metrics());
    let endpoint = if flavor == Flavor::Chat { "/v1/chat/completions" } else { "/v1/completions" };
    let resp = match body {
        Ok(body) => handle(api, flavor, headers, body).await.unwrap_or_else(IntoResponse::into_response),
        Err(e) => e.into_response(),
    };
    metrics.front_door(endpoint, resp.status().as_u16());
    resp
}

pub(super) async fn chat_completions(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    body: Result<JsonBody<Value>, ApiError>,
) -> Response {
    counted(api, Flavor::Chat, headers, body.map(|JsonBody(b)| b)).await
}

pub(super) async fn completions(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    body: Result<JsonBody<Value>, ApiError>,
) -> Response {
    counted(api, Flavor::Completions, headers, body.map(|JsonBody(b)| b)).await
}

pub(super) async fn models(State(api): State<Arc<Api>>) -> Json<Value> {
    let created = unix_now();
    let data: Vec<Value> = api
        .service
        .models()
        .into_iter()
        .map(|m| json!({"id": m, "object": "model", "created": created, "owned_by": "switchyard"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(axum::http::HeaderName::from_bytes(k.as_bytes()).expect("name"), v.parse().expect("value"));
        }
        h
    }

    /// The data of an SSE event, as the client reads it off the wire.
    async fn data(e: Event) -> Value {
        let resp = Sse::new(futures::stream::iter([Ok::<_, Infallible>(e)])).into_response();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("body");
        let text = String::from_utf8(bytes.to_vec()).expect("UTF-8");
        let json = text.lines().find_map(|l| l.strip_prefix("data: ")).expect("a data line");
        serde_json::from_str(json).unwrap_or_else(|err| panic!("{err}: {json}"))
    }

    #[tokio::test]
    async fn streamed_pieces_are_valid_chunks_whatever_the_text() {
        let r = Render::new(Flavor::Chat, "chatcmpl-1", 7, "Qwen/Qwen3-8B", 16, 4096);
        for text in ["plain", "quote \" and \\ backslash", "line\nbreak", "üñí 漢字 😀", ""] {
            let v = data(r.piece(text, false)).await;
            assert_eq!(v.pointer("/choices/0/delta/content").and_then(Value::as_str), Some(text), "{v}");
            assert_eq!((v["id"].as_str(), v["created"].as_u64(), v["model"].as_str()), (Some("chatcmpl-1"), Some(7), Some("Qwen/Qwen3-8B")));
        }
        let first = data(r.piece("hi", true)).await;
        assert_eq!(first.pointer("/choices/0/delta/role").and_then(Value::as_str), Some("assistant"));
        let c = Completion { text: "x".into(), prompt_tokens: 3, cached_prompt_tokens: 1, output_tokens: 16, ttft_s: 0.0, latency_s: 0.0, ..Default::default() };
        assert_eq!(data(r.finish(&c)).await.pointer("/choices/0/finish_reason").and_then(Value::as_str), Some("length"));
        assert_eq!(data(r.usage(&c)).await.pointer("/usage/prompt_tokens_details/cached_tokens").and_then(Value::as_u64), Some(1));
        let rc = Render::new(Flavor::Completions, "cmpl-1", 7, "m", 16, 4096);
        assert_eq!(data(rc.piece("a\"b", false)).await.pointer("/choices/0/text").and_then(Value::as_str), Some("a\"b"));
    }

    /// An engine's finding that the request is invalid (its 400) is the client's 400, not a 502
    /// that OpenAI's clients would send again; its other refusals (a 404: a model it does not
    /// serve) and failures stay 502; none shows the address.
    #[test]
    fn an_invalid_request_is_a_400_and_a_server_side_refusal_a_502() {
        use crate::live::engine::{EngineError, INVALID_PREFIX};
        let invalid = EngineError::Invalid("request 3 to http://10.0.0.7:8000/v1/chat/completions: HTTP 400 (bad schema)".into()).to_string();
        assert!(invalid.starts_with(INVALID_PREFIX), "{invalid}");
        let e = call_error(invalid);
        assert_eq!((e.status, e.kind), (StatusCode::BAD_REQUEST, "invalid_request_error"));
        assert!(e.message.contains("bad schema") && !e.message.contains("10.0.0.7"), "{}", e.message);
        assert_eq!(e.message.matches("invalid").count(), 1, "said once: {}", e.message);
        for failure in [EngineError::Rejected("HTTP 404 (no such model)".into()), EngineError::BadResponse("HTTP 500 (boom)".into())] {
            assert_eq!(call_error(failure.to_string()).status, StatusCode::BAD_GATEWAY);
        }
    }

    #[test]
    fn engine_addresses_are_not_shown_to_front_door_clients() {
        assert_eq!(
            super::public_reason("engine answered badly: request 12 to http://10.0.0.7:8000/v1/chat/completions: HTTP 500 (boom)"),
            "engine answered badly: request 12 to <engine>: HTTP 500 (boom)"
        );
        assert_eq!(super::public_reason("a https://h/x, then http://k:1/"), "a <engine>, then <engine>");
        assert_eq!(super::public_reason("the server stayed overloaded"), "the server stayed overloaded");
    }

    #[test]
    fn the_program_key_comes_from_the_known_headers_then_the_body() {
        let body = json!({"program_id": "from-body"});
        let key = |h: &HeaderMap, b: &Value| program_key(h, b).ok().flatten();
        assert_eq!(key(&headers(&[("X-Session-ID", "a")]), &body).as_deref(), Some("a"));
        assert_eq!(key(&headers(&[("x-dynamo-session-id", "b")]), &body).as_deref(), Some("b"));
        assert_eq!(key(&headers(&[("X-Program-ID", "c")]), &body).as_deref(), Some("c"));
        assert_eq!(key(&HeaderMap::new(), &body).as_deref(), Some("from-body"));
        assert_eq!(key(&HeaderMap::new(), &json!({})), None);
        assert_eq!(key(&headers(&[("X-Session-ID", "")]), &json!({})), None);
        // Too long, or not a string: refused with a 400 naming the key, not dropped.
        let long = "k".repeat(257);
        for (h, b) in [(headers(&[("X-Session-ID", long.as_str())]), json!({})), (HeaderMap::new(), json!({"program_id": long})), (HeaderMap::new(), json!({"program_id": 7})), (HeaderMap::new(), json!({"program_id": "ключ"}))] {
            let e = program_key(&h, &b).expect_err("refused");
            assert_eq!((e.status, e.param.as_deref()), (StatusCode::BAD_REQUEST, Some("program_id")));
        }
        assert_eq!(key(&headers(&[("X-Session-ID", &"k".repeat(256))]), &json!({})).map(|k| k.len()), Some(256));
    }

    /// Any JSON value, a few levels deep, with the front door's own field names likely.
    fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let key = prop_oneof![
            Just("model".to_string()),
            Just("messages".to_string()),
            Just("prompt".to_string()),
            Just("max_tokens".to_string()),
            Just("n".to_string()),
            Just("stream".to_string()),
            Just("temperature".to_string()),
            Just("role".to_string()),
            Just("content".to_string()),
            Just("program_done".to_string()),
            "[a-z_]{1,8}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_map(|f| json!(f)),
            ".{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(key.clone(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        /// Whatever the body and headers, checking a request never panics: it is accepted, or
        /// refused with a 400 that names a parameter.
        #[test]
        fn any_request_is_accepted_or_refused_with_a_named_400(body in arb_json(), done in ".{0,6}", chat in proptest::bool::ANY) {
            let mut h = HeaderMap::new();
            if let Ok(v) = done.parse() {
                h.insert("x-program-done", v);
            }
            let flavor = if chat { Flavor::Chat } else { Flavor::Completions };
            match parse(flavor, &h, &body) {
                Ok(p) => proptest::prop_assert!(p.request.max_tokens >= 1),
                Err(e) => {
                    proptest::prop_assert_eq!(e.status, StatusCode::BAD_REQUEST);
                    proptest::prop_assert!(e.param.is_some());
                }
            }
            if let Err(e) = program_key(&h, &body) {
                proptest::prop_assert_eq!(e.status, StatusCode::BAD_REQUEST);
                proptest::prop_assert!(e.param.is_some());
            }
        }
    }

    #[test]
    fn requests_are_checked_before_anything_is_scheduled() {
        let h = HeaderMap::new();
        let ok = parse(Flavor::Chat, &h, &json!({"model": "Qwen3-8B", "messages": [{"role": "user", "content": "hi"}]}));
        let ok = ok.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!((ok.request.max_tokens, ok.request.enable_thinking, ok.stream), (CHAT_DEFAULT_MAX_TOKENS, true, false));
        let cases = [
            (json!({"messages": [{"role": "user", "content": "hi"}]}), "model"),
            (json!({"model": "m", "messages": []}), "messages"),
            (json!({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}), "messages[0].role"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}), "n"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}), "max_tokens"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": -1}), "temperature"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": true}), "logprobs"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}), "tools[0].function"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "code_interpreter"}]}), "tools[0].type"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "a b"}}]}), "tools[0].function.name"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}), "tools[0].function.parameters"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": {"type": "function"}}), "tools"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": [""]}), "stop"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": 5}), "stop"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"}), "tool_choice"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}}}), "tool_choice"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": "sometimes"}), "tool_choice"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c"}]}]}),
                "messages[1].tool_calls[0]"),
            (json!({"model": "m", "messages": [{"role": "tool", "content": "42", "tool_call_id": 7}]}), "messages[0].tool_call_id"),
            // vLLM parses an earlier call's arguments as JSON (a 400 there, a 502 here after it).
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"q\":"}}]}]}),
                "messages[1].tool_calls[0]"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}]}]}),
                "messages[1].tool_calls[0]"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [{"id": 5, "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}),
                "messages[1].tool_calls[0]"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "code", "function": {"name": "f", "arguments": "{}"}}]}]}),
                "messages[1].tool_calls[0]"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}],
                "parallel_tool_calls": "yes"}), "parallel_tool_calls"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "yaml"}}), "response_format.type"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema"}}), "response_format.json_schema"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "a plan", "schema": {}}}}), "response_format.json_schema.name"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "plan", "schema": "object"}}}), "response_format.json_schema.schema"),
        ];
        for (body, param) in cases {
            let e = parse(Flavor::Chat, &h, &body).err().unwrap_or_else(|| panic!("accepted {body}"));
            assert_eq!((e.status, e.param.as_deref()), (StatusCode::BAD_REQUEST, Some(param)), "{body}");
        }
        // What frameworks send for "none of that" is what leaving it out means.
        let neutral = json!({
            "model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": [], "tools": [], "tool_choice": "none",
            "response_format": {"type": "text"}, "logprobs": false, "best_of": 1, "suffix": "", "functions": null,
        });
        assert!(parse(Flavor::Chat, &h, &neutral).is_ok(), "{neutral}");
        // A limit past u32 is a very large limit (the context caps it), not "none given".
        let huge = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 99_999_999_999u64});
        assert!(parse(Flavor::Chat, &h, &huge).is_ok_and(|p| p.request.max_tokens == CHAT_DEFAULT_MAX_TOKENS - 1));
        let tools = parse(Flavor::Completions, &h, &json!({"model": "m", "prompt": "p", "tools": [{"type": "function", "function": {"name": "f"}}]}));
        assert_eq!(tools.err().and_then(|e| e.param), Some("tools".to_string()));
        let list = parse(Flavor::Completions, &h, &json!({"model": "m", "prompt": ["a", "b"]}));
        assert_eq!(list.err().and_then(|e| e.param), Some("prompt".to_string()));
        let done = parse(Flavor::Completions, &headers(&[("x-program-done", "true")]), &json!({"model": "m", "prompt": "p"}));
        assert!(done.is_ok_and(|p| p.request.program_done));
    }

    /// Function calling: the tools and the choice reach the engine as the client sent them, an
    /// earlier turn's tool calls and a tool result's id stay in the messages, and the prompt the
    /// planner counts holds the tools block and the earlier call.
    #[test]
    fn tools_tool_calls_and_stop_strings_are_passed_on() {
        let tool = json!({"type": "function", "function": {"name": "get_time", "description": "The time.", "parameters": {"type": "object", "properties": {}}}});
        // A field of the tool beside its function (a vendor's cache hint) is not passed on: vLLM
        // would render it into the prompt, which the planner would not have counted.
        let mut with_extra = tool.clone();
        with_extra["cache_control"] = json!({"type": "ephemeral"});
        let body = json!({
            "model": "m", "stop": ["\nObservation:", "END"], "tool_choice": {"type": "function", "function": {"name": "get_time"}},
            "tools": [with_extra], "parallel_tool_calls": false,
            "messages": [
                {"role": "user", "content": "What time is it?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
                // Arguments as an object, no id and no type: written out and filled in, as vLLM
                // takes a call.
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_time", "arguments": {"city": "Paris"}}},
                    {"id": "", "type": null, "function": {"name": "get_time", "arguments": "[1]"}}]},
            ],
        });
        let p = parse(Flavor::Chat, &HeaderMap::new(), &body).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(p.request.tools, vec![tool]);
        assert_eq!(p.request.tool_choice, Some(json!({"type": "function", "function": {"name": "get_time"}})));
        assert_eq!(p.request.parallel_tool_calls, Some(false));
        assert_eq!(p.request.stop, ["\nObservation:", "END"]);
        let messages = p.request.messages.clone().unwrap_or_default();
        assert_eq!(messages[1]["tool_calls"][0]["function"]["name"], "get_time");
        assert_eq!(messages[2]["tool_call_id"], "call_1");
        assert_eq!(
            messages[3]["tool_calls"],
            json!([{"id": "call_3_0", "type": "function", "function": {"name": "get_time", "arguments": "{\"city\":\"Paris\"}"}},
                   {"id": "call_3_1", "type": "function", "function": {"name": "get_time", "arguments": "[1]"}}])
        );
        let (prompt, raw) = p.request.rendered_prompt();
        assert!(!raw);
        assert!(prompt.contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_time\""), "{prompt}");
        assert!(prompt.contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call><|im_end|>"), "{prompt}");
        // Structured output: the format rebuilt for the engine, the text format none.
        let schema = json!({"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "string"}}}, "required": ["steps"]});
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "Plan."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "Plan", "schema": schema, "strict": true, "extra": 1}}});
        let p = parse(Flavor::Chat, &HeaderMap::new(), &body).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(p.request.response_format, Some(json!({"type": "json_schema", "json_schema": {"name": "Plan", "schema": schema, "strict": true}})));
        let text = parse(Flavor::Chat, &HeaderMap::new(), &json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"}}));
        assert!(text.is_ok_and(|p| p.request.response_format.is_none()));
        // `stop` as one string.
        let one = parse(Flavor::Completions, &HeaderMap::new(), &json!({"model": "m", "prompt": "p", "stop": "\n"}));
        assert!(one.is_ok_and(|p| p.request.stop == ["\n"]));
    }

    /// An answer with tool calls: `message.tool_calls` (ids kept, or made), `content` null when
    /// there is no text, the engine's `tool_calls` finish reason; in a stream, one chunk with the
    /// calls before the finish.
    #[tokio::test]
    async fn an_answer_with_tool_calls_has_openais_shape() {
        use crate::live::engine::ToolCall;
        let c = Completion {
            prompt_tokens: 20,
            output_tokens: 12,
            tool_calls: vec![
                ToolCall { id: "chatcmpl-tool-1".into(), name: "get_time".into(), arguments: "{}".into() },
                ToolCall { id: String::new(), name: "search".into(), arguments: "{\"q\": \"x\"}".into() },
            ],
            finish_reason: Some("tool_calls".into()),
            ..Default::default()
        };
        assert_eq!(finish_reason(&c, |_| 100), "tool_calls");
        let calls = tool_calls_json(&c);
        assert_eq!(calls[0]["id"], "chatcmpl-tool-1");
        assert!(calls[1]["id"].as_str().is_some_and(|id| id.starts_with("call_") && id.len() == 29), "{calls}");
        assert_eq!(calls[1]["function"], json!({"name": "search", "arguments": "{\"q\": \"x\"}"}));
        let r = Render::new(Flavor::Chat, "chatcmpl-1", 7, "m", 100, 4096);
        let chunk = data(r.tool_calls(&c, true)).await;
        assert_eq!(chunk.pointer("/choices/0/delta/role").and_then(Value::as_str), Some("assistant"));
        assert_eq!(chunk.pointer("/choices/0/delta/tool_calls/1/index").and_then(Value::as_u64), Some(1));
        assert_eq!(chunk.pointer("/choices/0/delta/tool_calls/0/function/name").and_then(Value::as_str), Some("get_time"));
        assert_eq!(data(r.finish(&c)).await.pointer("/choices/0/finish_reason").and_then(Value::as_str), Some("tool_calls"));
        // A call the limit cut (its arguments not whole JSON) ends `length`.
        let cut = Completion {
            tool_calls: vec![ToolCall { id: "a".into(), name: "search".into(), arguments: "{\"q\":".into() }],
            finish_reason: Some("tool_calls".into()),
            ..Default::default()
        };
        assert_eq!(finish_reason(&cut, |_| 100), "length");
        let no_parameters = Completion {
            tool_calls: vec![ToolCall { id: "a".into(), name: "now".into(), arguments: String::new() }],
            finish_reason: Some("tool_calls".into()),
            ..Default::default()
        };
        assert_eq!(finish_reason(&no_parameters, |_| 100), "tool_calls");
        // Without the engine's reason, the limit decides as before.
        let plain = Completion { output_tokens: 100, ..Default::default() };
        assert_eq!(finish_reason(&plain, |_| 100), "length");
    }

    #[test]
    fn a_step_hint_comes_from_a_header_or_the_body_and_is_bounded() {
        let body = json!({"model": "m", "prompt": "p"});
        let step = |h: &[(&str, &str)], b: &Value| parse(Flavor::Completions, &headers(h), b).map(|p| p.request.step);
        assert_eq!(step(&[("X-Step-ID", "coder")], &body).ok().flatten().as_deref(), Some("coder"));
        assert_eq!(step(&[("x-node-id", "tester")], &body).ok().flatten().as_deref(), Some("tester"));
        let with = json!({"model": "m", "prompt": "p", "step_id": "planner"});
        assert_eq!(step(&[], &with).ok().flatten().as_deref(), Some("planner"));
        assert_eq!(step(&[("X-Step-ID", "h")], &with).ok().flatten().as_deref(), Some("h"), "the header wins");
        assert_eq!(step(&[], &body).ok().flatten(), None);
        for bad in [json!({"model": "m", "prompt": "p", "step_id": 3}), json!({"model": "m", "prompt": "p", "node_id": ""})] {
            let e = step(&[], &bad).err().unwrap_or_else(|| panic!("accepted {bad}"));
            assert_eq!(e.param.as_deref(), Some("step_id"));
        }
        let long = "s".repeat(MAX_STEP_ID_BYTES + 1);
        assert!(step(&[("X-Step-ID", long.as_str())], &body).is_err());
    }
}
