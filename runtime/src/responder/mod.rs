//! Emulated LLM responders and accuracy scoring.
//!
//! In emulation no real LLM runs: a *responder* produces the output text of one LLM activation
//! from its request, honest about what it is. GSM8K solvers write the dataset's worked solution
//! whose final answer is right with a per-model probability (a wrong one is a realistic
//! perturbation of the last step); MBPP coders return the reference solution or a mutated one
//! that the real test tool later runs (the responder never declares a pass); QMSum summarizers
//! write extractive, query-focused summaries. Every output has (close to) the drawn number of
//! real (Qwen3 tokenizer) tokens and never more than the cap.
//!
//! A response is a pure function of its [`ResponderRequest`]: same request (including the
//! seed) → same output, whatever the scheduling policy. Randomness comes only from
//! `ChaCha8Rng::seed_from_u64(req.seed)`.
//!
//! This module owns: the responder registry ([`RESPONDERS`], [`respond`]), the per-model
//! accuracy table ([`models`]), the length fitting, and the metrics used for the per-workflow
//! `accuracy` ([`gsm8k_exact`], [`tests_pass`], [`rouge_l_f1`]).
//! It depends only on `crate::values`, `crate::tokens`, `crate::schema` (structured answers) and
//! `crate::memo`'s hasher;
//! it must not depend on the planner,
//! the simulator, the workflow model, the tools crate, on files, the clock or the network (the
//! caller hands it the already-mapped dataset record and the rendered prompt).

mod fit;
mod generic;
pub mod gsm8k;
pub mod judge;
pub mod mbpp;
pub mod models;
mod mutate;
pub mod qmsum;
mod rouge;
mod scoring;
mod text;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use thiserror::Error;

use crate::values::{LengthDist, NodeOutput, Record, json_kind};

pub use gsm8k::{extract_gsm8k_answer, normalize_answer};
pub use mbpp::extract_code;
pub use rouge::{rouge_l, rouge_l_f1, rouge_tokens, RougeScore};
pub use scoring::{gsm8k_exact, tests_pass};

/// The responder of generic agents (any role an author declares): marked filler of the drawn
/// length, or a JSON value drawn from the node's output schema.
pub const GENERIC: &str = "generic";

/// Names of the emulated responders a workflow node may ask for.
pub const RESPONDERS: &[&str] = &[
    "gsm8k.solve",
    "gsm8k.refine",
    "gsm8k.judge",
    "mbpp.generate",
    "mbpp.diagnose",
    "mbpp.review",
    "mbpp.repair",
    "qmsum.summarize",
    "qmsum.aggregate",
    "qmsum.judge",
    GENERIC,
];

/// Whether `responder` is an LLM judge ([`judge`]): its answer must be a structured output
/// with a boolean verdict property, checked when the workflow loads.
pub fn is_judge(responder: &str) -> bool {
    matches!(responder, "gsm8k.judge" | "qmsum.judge")
}

/// The input fields (of the mapped dataset record) each responder needs; the workflow loader
/// checks them before a run starts. A test checks that each responder fails without each.
pub fn input_needs(responder: &str) -> &'static [&'static str] {
    match responder {
        "gsm8k.solve" | "gsm8k.refine" => &["question", "answer"],
        "mbpp.generate" | "mbpp.diagnose" | "mbpp.review" | "mbpp.repair" => &["code"],
        "qmsum.summarize" | "qmsum.aggregate" => &["query"],
        "gsm8k.judge" | "qmsum.judge" => &["answer"],
        _ => &[],
    }
}

/// Everything one LLM activation's output may depend on.
#[derive(Debug, Clone, Copy)]
pub struct ResponderRequest<'a> {
    /// One of [`RESPONDERS`].
    pub responder: &'a str,
    /// Node id in the workflow (used in error messages).
    pub node: &'a str,
    /// Catalogue model name, e.g. `Qwen3-8B`.
    pub model: &'a str,
    /// The session's mapped dataset record.
    pub input: &'a Record,
    /// The fully rendered prompt.
    pub prompt: &'a str,
    /// (node id, output) of the completed predecessors.
    pub upstream: &'a [(&'a str, &'a NodeOutput)],
    /// The node's output-length distribution.
    pub length: LengthDist,
    /// The node's output cap in tokens.
    pub max_output_tokens: u32,
    /// Seed derived by the caller from (trace seed, session, node, round).
    pub seed: u64,
    /// The agent's declared role (generic agents).
    pub role: Option<&'a str>,
    /// The node's structured-output schema (generic agents).
    pub schema: Option<&'a crate::schema::OutputSchema>,
    /// The schema property that is the node's verdict.
    pub verdict_field: Option<&'a str>,
}

/// Why a responder could not answer. Every variant names the node.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResponderError {
    /// The responder name is not one of [`RESPONDERS`].
    #[error("node `{node}`: unknown responder `{responder}` (known: {known})", known = RESPONDERS.join(", "))]
    UnknownResponder { node: String, responder: String },
    /// The model has no accuracy entry in [`models`].
    #[error("node `{node}`: responder `{responder}` has no accuracy figure for model `{model}`")]
    UnknownModel { node: String, responder: String, model: String },
    /// The mapped input record lacks a field the responder needs.
    #[error("node `{node}`: responder `{responder}` needs input field `{field}`, which is missing")]
    MissingField { node: String, responder: String, field: String },
    /// An input field has the wrong JSON type or unusable content.
    #[error("node `{node}`: responder `{responder}`: input field `{field}` {problem}")]
    BadField { node: String, responder: String, field: String, problem: String },
    /// The node allows no output token at all.
    #[error("node `{node}`: max_output_tokens is 0, no output can be produced")]
    ZeroOutputCap { node: String },
}

impl ResponderRequest<'_> {
    /// A string field of the input record, or a typed error naming it.
    pub(crate) fn str_field(&self, field: &str) -> Result<&str, ResponderError> {
        match self.input.get(field) {
            None | Some(serde_json::Value::Null) => Err(self.missing(field)),
            Some(serde_json::Value::String(s)) => Ok(s),
            Some(other) => Err(self.bad_field(field, format!("must be a string, found {}", json_kind(other)))),
        }
    }

    /// A list-of-strings field, or a typed error naming it.
    pub(crate) fn str_list_field(&self, field: &str) -> Result<Vec<&str>, ResponderError> {
        match self.input.get(field) {
            None | Some(serde_json::Value::Null) => Err(self.missing(field)),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(|| self.bad_field(field, format!("must hold strings, found {}", json_kind(v))))
                })
                .collect(),
            Some(other) => Err(self.bad_field(field, format!("must be a list of strings, found {}", json_kind(other)))),
        }
    }

    pub(crate) fn missing(&self, field: &str) -> ResponderError {
        ResponderError::MissingField {
            node: self.node.to_string(),
            responder: self.responder.to_string(),
            field: field.to_string(),
        }
    }

    pub(crate) fn bad_field(&self, field: &str, problem: String) -> ResponderError {
        ResponderError::BadField {
            node: self.node.to_string(),
            responder: self.responder.to_string(),
            field: field.to_string(),
            problem,
        }
    }

    pub(crate) fn unknown_model(&self) -> ResponderError {
        ResponderError::UnknownModel {
            node: self.node.to_string(),
            responder: self.responder.to_string(),
            model: self.model.to_string(),
        }
    }
}


/// The reasoning trace an emulated Qwen3 writes in thinking mode before its answer, `tokens`
/// Qwen3 tokens in all (an empty block's 4 when `tokens` is 5 or fewer): `<think>\n`, neutral
/// words (one token each), `\n</think>\n\n`. `</think>` is a special token, so the trace's
/// tokens add to the answer's: an engine generating trace + answer generates the tokens the
/// simulator counts for the call (its answer and its thinking budget), never more — the trace's
/// last `\n\n` merges only with an answer that opens with whitespace, into fewer tokens — and
/// `max_tokens` never cuts the answer. Except for budgets under 5: the empty block still takes
/// its 4 tokens (a budget of 0–3 is exceeded, 5 left one token short), so an answer within 4
/// tokens of its call's limit can be cut there.
pub fn reasoning_trace(tokens: u32) -> String {
    let words = tokens.saturating_sub(REASONING_MARKER_TOKENS);
    let mut s = String::with_capacity(words as usize * 6 + 20);
    s.push_str("<think>\n");
    for i in 0..words {
        s.push_str(if i % 2 == 0 { " step" } else { " check" });
    }
    s.push_str("\n</think>\n\n");
    s
}

/// Tokens of the trace's markers: `<think>`, `\n`, `\n`, `</think>`, `\n\n`.
const REASONING_MARKER_TOKENS: u32 = 5;

/// The answer of a completion that opens with a `<think>…</think>` reasoning block (a Qwen3
/// thinking-mode reply served without a reasoning parser), or `None` when it has none. An
/// unterminated block (the output limit cut the reasoning) leaves an empty answer.
pub fn strip_reasoning(text: &str) -> Option<&str> {
    let rest = text.trim_start().strip_prefix("<think>")?;
    Some(match rest.find("</think>") {
        Some(end) => rest[end + "</think>".len()..].trim_start(),
        None => "",
    })
}

/// Produce the output of one emulated LLM activation.
///
/// The output-length target is drawn first from `req.length` (capped by
/// `req.max_output_tokens`) with the request's RNG, then the responder builds its content and
/// fits it to the target: shorter content is extended with honest filler, longer content is
/// truncated (which can cut off a final answer — a realistic failure).
/// `NodeOutput::output_tokens` is the exact BPE count of the text, `verdict` is `None` and
/// `value` carries the responder's structured result (e.g. `{"answer": "18"}` for GSM8K) —
/// except for [`GENERIC`] and the judges ([`judge`]), whose structured answers carry their
/// `verdict` property.
pub fn respond(req: &ResponderRequest) -> Result<NodeOutput, ResponderError> {
    if !RESPONDERS.contains(&req.responder) {
        return Err(ResponderError::UnknownResponder {
            node: req.node.to_string(),
            responder: req.responder.to_string(),
        });
    }
    if req.max_output_tokens == 0 {
        return Err(ResponderError::ZeroOutputCap { node: req.node.to_string() });
    }
    let mut rng = ChaCha8Rng::seed_from_u64(req.seed);
    let target = req.length.sample(&mut rng, req.max_output_tokens).min(req.max_output_tokens) as usize;
    let structured = match req.responder {
        GENERIC => Some(generic::respond(req, &mut rng, target)?),
        "gsm8k.judge" => Some(judge::judge(req, &mut rng, target, judge::Task::Gsm8k)?),
        "qmsum.judge" => Some(judge::judge(req, &mut rng, target, judge::Task::Qmsum)?),
        _ => None,
    };
    if let Some((text, value, verdict)) = structured {
        let output_tokens = u32::try_from(crate::tokens::count(&text)).unwrap_or(u32::MAX);
        return Ok(NodeOutput { text, verdict, value, output_tokens });
    }
    let (text, value) = match req.responder {
        "gsm8k.solve" => gsm8k::solve(req, &mut rng, target)?,
        "gsm8k.refine" => gsm8k::refine(req, &mut rng, target)?,
        "mbpp.generate" => mbpp::generate(req, &mut rng, target)?,
        "mbpp.diagnose" => mbpp::diagnose(req, &mut rng, target)?,
        "mbpp.review" => mbpp::review(req, &mut rng, target)?,
        "mbpp.repair" => mbpp::repair(req, &mut rng, target)?,
        "qmsum.summarize" => qmsum::summarize(req, target)?,
        "qmsum.aggregate" => qmsum::aggregate(req, target)?,
        other => {
            return Err(ResponderError::UnknownResponder {
                node: req.node.to_string(),
                responder: other.to_string(),
            });
        }
    };
    let output_tokens = u32::try_from(crate::tokens::count(&text)).unwrap_or(u32::MAX);
    Ok(NodeOutput { text, verdict: None, value, output_tokens })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reasoning_block_is_stripped_from_the_answer() {
        assert_eq!(strip_reasoning("<think>\nfirst 2+2\n</think>\n\n#### 4"), Some("#### 4"));
        assert_eq!(strip_reasoning("  <think>x</think>answer"), Some("answer"));
        assert_eq!(strip_reasoning("<think>cut by the output limit"), Some(""));
        assert_eq!(strip_reasoning("no reasoning here"), None);
        assert_eq!(strip_reasoning("answer <think>x</think>"), None);
        let trace = reasoning_trace(50);
        assert_eq!(strip_reasoning(&format!("{trace}ok")), Some("ok"));
        assert_eq!(crate::tokens::count(&reasoning_trace(3)), 4);
        assert_eq!(crate::tokens::count(&reasoning_trace(5)), 4);
    }

    #[test]
    fn a_reasoning_trace_and_its_answer_take_the_tokens_the_simulator_counts() {
        // Exactly its budget (it was one token short: a live run's engine generated one token
        // fewer per thinking-mode call than the simulator counted).
        use crate::tokens::count;
        for budget in [6, 7, 50, 851, 2500] {
            assert_eq!(count(&reasoning_trace(budget)), budget as usize, "{budget}");
        }
        // With an answer after it: the sum of both, never more, whatever the answer opens with
        // (an opening line break merges with the trace's last `\n\n`: one fewer).
        let trace = reasoning_trace(50);
        let mut openings: Vec<String> = (0x09u8..0x7f).map(|b| char::from(b).to_string()).collect();
        let blanks = [" ", "  ", "\n", "\n\n", "\t", "\r", "\r\n", " \n", "\n ", "\u{a0}", "\u{3000}"];
        for a in blanks {
            openings.extend(blanks.iter().map(|b| format!("{a}{b}")));
        }
        openings.extend(["é", "中", "🙂", "'s", "’", "12", "#### 4", "```python", "<|im_end|>", ""].map(str::to_string));
        for opening in &openings {
            for rest in ["x", " The answer", "", "\nx", "1", "def f(a):"] {
                let answer = format!("{opening}{rest}");
                let both = count(&format!("{trace}{answer}"));
                assert!(both <= 50 + count(&answer), "{answer:?}: {both}");
                if !answer.starts_with(char::is_whitespace) {
                    assert_eq!(both, 50 + count(&answer), "{answer:?}");
                }
            }
        }
    }
}
