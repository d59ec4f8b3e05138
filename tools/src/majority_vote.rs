//! The `majority_vote` tool: aggregate solver outputs by voting on their final answers.
//!
//! Owns answer extraction (GSM8K style: the answer after the last `####`, else the last number
//! in the text), number normalisation and the vote. Extraction and normalisation run in Rust;
//! the vote itself runs in the WebAssembly sandbox, in the module `tools/wasm/majority_vote.wat`
//! shipped with the project ([`vote_in_sandbox`]: the answers go into the module's memory, it
//! returns the winner and the counts). [`vote`] is the in-process reference implementation the
//! module is tested against. Must not depend on the runtime.
//!
//! Rules:
//! * every candidate yields at most one answer; candidates without one (empty, `null`, no
//!   number) do not vote;
//! * the winner has the most votes; among equals, the answer of the earliest candidate wins;
//! * verdict `majority` when the winner holds more than half of the votes cast, `tie` when
//!   another answer has as many votes as the winner, `plurality` when the winner is alone at
//!   the top but holds at most half, and `no_answer` when nobody voted (also the verdict of a
//!   vote stopped by its time limit, whose text and value say so).

use std::collections::BTreeMap;

use std::time::Duration;

use serde_json::{Value, json};

use crate::sandbox::wasm::{ComputeEnd, LoadedModule, module_from_wat, run_compute};
use crate::{ToolCall, ToolError, ToolFailure, ToolFailureCause, ToolOutcome, VerdictChecks};

/// Tool name.
pub const NAME: &str = "majority_vote";

/// Modeled duration of one vote: the measured cost is tens of microseconds in the sandbox (a
/// few in process; see `examples/tool_durations.rs`), so this is a dispatch overhead of 1 ms, the
/// figure the tool's specification suggests, kept constant so virtual time stays deterministic.
pub const MODELED_DURATION_S: f64 = 0.001;

/// The vote module's source, shipped with the project.
pub const VOTE_WAT: &str = include_str!("../wasm/majority_vote.wat");

/// Linear-memory limit of the vote module. Assumption: 16 MiB holds the answers of thousands
/// of candidates (each answer is one line or one number after extraction) with room to spare.
pub const VOTE_MEMORY_BYTES: u64 = 16 << 20;

/// Time limit of a vote when the call declares none. Assumption: the quadratic comparison of a
/// few hundred short answers takes microseconds, so 1 s only ever stops a runaway.
pub const VOTE_TIMEOUT_S: f64 = 1.0;

/// WebAssembly page size.
const PAGE_BYTES: usize = 65_536;

/// Words of the vote module's result header (winner, top, counted, tied, verdict).
const HEADER_WORDS: usize = 5;

/// How an answer is read out of a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extract {
    /// The first number after the last `####` (or the text there when it has no number), else
    /// the last number anywhere; numbers normalised by [`normalize_number`].
    Gsm8k,
    /// The whole candidate, trimmed, with runs of whitespace collapsed to one space.
    Exact,
}

impl Extract {
    /// Parses the `extract` input (`gsm8k`, `exact`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "gsm8k" => Some(Self::Gsm8k),
            "exact" => Some(Self::Exact),
            _ => None,
        }
    }

    /// The answer this rule reads from `candidate`, if any.
    pub fn answer(self, candidate: &str) -> Option<String> {
        match self {
            Self::Gsm8k => extract_gsm8k(candidate),
            Self::Exact => {
                let collapsed = candidate.split_whitespace().collect::<Vec<_>>().join(" ");
                (!collapsed.is_empty()).then_some(collapsed)
            }
        }
    }
}

/// Outcome class of a vote (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoteVerdict {
    /// The winner has more than half of the votes.
    Majority,
    /// The winner is alone at the top with at most half of the votes.
    Plurality,
    /// Another answer has as many votes as the winner (the earliest was chosen).
    Tie,
    /// No candidate yielded an answer.
    NoAnswer,
}

impl VoteVerdict {
    /// The verdict string used in workflow branches.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Majority => "majority",
            Self::Plurality => "plurality",
            Self::Tie => "tie",
            Self::NoAnswer => "no_answer",
        }
    }
}

/// The result of a vote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vote {
    /// The winning answer (`None` when nobody voted).
    pub winner: Option<String>,
    /// Votes per answer.
    pub votes: BTreeMap<String, u32>,
    /// Answers tied with the winner, winner first, in order of first appearance.
    pub tied: Vec<String>,
    /// Number of candidates that voted.
    pub counted: usize,
    /// The answer read from each candidate.
    pub answers: Vec<Option<String>>,
    /// Outcome class.
    pub verdict: VoteVerdict,
}

/// Counts the answers of `candidates` (`None` = a candidate without text).
pub fn vote(candidates: &[Option<String>], extract: Extract) -> Vote {
    let answers: Vec<Option<String>> =
        candidates.iter().map(|c| c.as_deref().and_then(|text| extract.answer(text))).collect();
    let mut votes: BTreeMap<String, u32> = BTreeMap::new();
    // Order of first appearance, for the tie-break.
    let mut order: Vec<&str> = Vec::new();
    for answer in answers.iter().flatten() {
        let count = votes.entry(answer.clone()).or_insert(0);
        if *count == 0 {
            order.push(answer);
        }
        *count += 1;
    }
    let counted = votes.values().map(|&v| v as usize).sum::<usize>();
    let top = votes.values().copied().max().unwrap_or(0);
    let tied: Vec<String> =
        order.iter().filter(|a| votes.get(**a) == Some(&top)).map(|a| a.to_string()).collect();
    let winner = tied.first().cloned();
    let verdict = if winner.is_none() {
        VoteVerdict::NoAnswer
    } else if 2 * top as usize > counted {
        VoteVerdict::Majority
    } else if tied.len() > 1 {
        VoteVerdict::Tie
    } else {
        VoteVerdict::Plurality
    };
    Vote { winner, votes, tied, counted, answers, verdict }
}

/// The vote module, compiled once per process.
pub fn vote_module() -> Result<LoadedModule, ToolError> {
    module_from_wat("majority_vote.wat", VOTE_WAT).map_err(|source| ToolError::Sandbox { tool: NAME, source })
}

/// The vote module's input: per answer its length (`-1` for none) and bytes.
pub fn encode_answers(answers: &[Option<String>]) -> Vec<u8> {
    let mut input = Vec::new();
    for answer in answers {
        match answer {
            Some(text) => {
                // Answers longer than i32::MAX bytes cannot reach here: the memory limit is far
                // smaller and is checked before the call.
                input.extend_from_slice(&(text.len() as i32).to_le_bytes());
                input.extend_from_slice(text.as_bytes());
            }
            None => input.extend_from_slice(&(-1i32).to_le_bytes()),
        }
    }
    input
}

fn sandbox_failure(problem: String) -> ToolError {
    ToolError::Sandbox {
        tool: NAME,
        source: crate::sandbox::SandboxError::WasmInstantiate { module: "majority_vote.wat".into(), reason: problem },
    }
}

/// Counts the answers of `candidates` like [`vote`], with the vote itself run by the
/// WebAssembly module ([`VOTE_WAT`]) under [`VOTE_MEMORY_BYTES`] and `time_limit`. `Ok(None)`
/// when the time limit stopped it.
pub fn vote_in_sandbox(
    candidates: &[Option<String>],
    extract: Extract,
    time_limit: Duration,
) -> Result<Option<Vote>, ToolError> {
    let answers: Vec<Option<String>> =
        candidates.iter().map(|c| c.as_deref().and_then(|text| extract.answer(text))).collect();
    let n = answers.len();
    let input = encode_answers(&answers);
    let out_offset = input.len().div_ceil(4) * 4;
    let out_words = HEADER_WORDS + 4 * n;
    let needed = out_offset + 4 * out_words;
    if needed as u64 > VOTE_MEMORY_BYTES || n > i32::MAX as usize {
        return Err(ToolError::InvalidInput {
            tool: NAME,
            field: "candidates",
            problem: format!("{n} answers need {needed} bytes, more than the vote module's {VOTE_MEMORY_BYTES}"),
        });
    }
    let module = vote_module()?;
    let end = run_compute(&module, VOTE_MEMORY_BYTES, time_limit, |store, instance| {
        let memory = instance
            .get_memory(&mut *store, "memory")
            .ok_or_else(|| wasmtime::format_err!("the module exports no memory"))?;
        let pages = needed.div_ceil(PAGE_BYTES) as u64;
        let have = memory.size(&*store);
        if pages > have {
            memory.grow(&mut *store, pages - have)?;
        }
        memory.write(&mut *store, 0, &input)?;
        let vote = instance.get_typed_func::<(i32, i32, i32, i32), i32>(&mut *store, "vote")?;
        let status = vote.call(&mut *store, (0, input.len() as i32, n as i32, out_offset as i32))?;
        let mut out = vec![0u8; 4 * out_words];
        memory.read(&*store, out_offset, &mut out)?;
        let words: Vec<i32> =
            out.chunks_exact(4).map(|w| i32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
        Ok((status, words))
    })
    .map_err(|source| ToolError::Sandbox { tool: NAME, source })?;
    let (status, words) = match end {
        ComputeEnd::Done(result) => result,
        ComputeEnd::TimedOut => return Ok(None),
    };
    if status != 0 {
        return Err(sandbox_failure(format!("the module rejected its input (status {status})")));
    }
    decode_vote(answers, &words).map(Some).map_err(sandbox_failure)
}

/// Builds the [`Vote`] from the module's result words (see the ABI in [`VOTE_WAT`]), checking
/// every index and count it returned.
fn decode_vote(answers: Vec<Option<String>>, words: &[i32]) -> Result<Vote, String> {
    let n = answers.len();
    let word = |k: usize| words.get(k).copied().ok_or_else(|| format!("result word {k} missing"));
    let (winner, top, counted, tied_count, verdict) = (word(0)?, word(1)?, word(2)?, word(3)?, word(4)?);
    let mut votes: BTreeMap<String, u32> = BTreeMap::new();
    let mut tied: Vec<String> = Vec::new();
    let mut voters = 0usize;
    for (i, answer) in answers.iter().enumerate() {
        let first = word(HEADER_WORDS + i)?;
        let count = word(HEADER_WORDS + n + i)?;
        match (answer, first) {
            (None, -1) => {}
            (Some(_), f) if f >= 0 && (f as usize) <= i => {
                voters += 1;
                if answers.get(f as usize).and_then(Option::as_ref) != answer.as_ref() {
                    return Err(format!("candidate {i} grouped with candidate {f}, whose answer differs"));
                }
            }
            _ => return Err(format!("candidate {i}: invalid group {first}")),
        }
        if count < 0 || (count > 0 && first != i as i32) {
            return Err(format!("candidate {i}: invalid vote count {count}"));
        }
        if let (Some(text), true) = (answer, count > 0) {
            votes.insert(text.clone(), count as u32);
            if count == top {
                tied.push(text.clone());
            }
        }
    }
    let verdict = match verdict {
        0 => VoteVerdict::Majority,
        1 => VoteVerdict::Plurality,
        2 => VoteVerdict::Tie,
        3 => VoteVerdict::NoAnswer,
        other => return Err(format!("unknown verdict code {other}")),
    };
    let winner = match winner {
        -1 => None,
        w if w >= 0 && (w as usize) < n => answers[w as usize].clone(),
        w => return Err(format!("winner index {w} out of range")),
    };
    let sum: u64 = votes.values().map(|&v| u64::from(v)).sum();
    if counted < 0 || counted as usize != voters || sum != voters as u64 || tied.len() != tied_count.max(0) as usize {
        return Err(format!("inconsistent counts (counted {counted}, voters {voters}, sum {sum}, tied {tied_count})"));
    }
    if winner.as_ref() != tied.first() {
        return Err("the winner is not the earliest answer with the most votes".into());
    }
    Ok(Vote { winner, votes, tied, counted: voters, answers, verdict })
}

/// GSM8K answer extraction: the first number after the last `####`, or, when there is no number
/// there, the trimmed rest of that line (lower-cased); without `####`, the last number in the
/// text. `None` when there is nothing.
pub fn extract_gsm8k(text: &str) -> Option<String> {
    if let Some(pos) = text.rfind("####") {
        let rest = &text[pos + 4..];
        if let Some(first) = numbers(rest).into_iter().next() {
            return Some(first);
        }
        let line = rest.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
        let line = line.trim_end_matches('.').trim();
        if !line.is_empty() {
            return Some(line.to_lowercase());
        }
    }
    numbers(text).pop()
}

/// All numbers in `text`, normalised, in order. A number is an optional `-` (not directly after
/// a letter or digit), digits with optional `,ddd` thousands groups, and an optional fraction.
pub fn numbers(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let negative = bytes[i] == b'-'
            && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)
            && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric());
        if !(bytes[i].is_ascii_digit() || negative) {
            i += 1;
            continue;
        }
        let start = i;
        if negative {
            i += 1;
        }
        while i < bytes.len() {
            let b = bytes[i];
            let next_digit = bytes.get(i + 1).is_some_and(u8::is_ascii_digit);
            let thousands_group =
                b == b',' && bytes.len() >= i + 4 && bytes[i + 1..i + 4].iter().all(u8::is_ascii_digit);
            let fraction_point = b == b'.' && next_digit && !text[start..i].contains('.');
            if !(b.is_ascii_digit() || thousands_group || fraction_point) {
                break;
            }
            i += 1;
        }
        if let Some(n) = normalize_number(&text[start..i]) {
            out.push(n);
        }
    }
    out
}

/// Canonical text of a number: commas, `$` and spaces removed, leading zeros of the integer
/// part and trailing zeros of the fraction dropped (`1,000.50` → `1000.5`, `$18.00` → `18`,
/// `-0` → `0`). `None` when the text is not a plain decimal number.
pub fn normalize_number(raw: &str) -> Option<String> {
    let cleaned: String = raw.chars().filter(|c| !matches!(c, ',' | '$' | ' ')).collect();
    let (negative, body) = match cleaned.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, cleaned.as_str()),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let int = int.trim_start_matches('0');
    let int = if int.is_empty() { "0" } else { int };
    let frac = frac.trim_end_matches('0');
    let magnitude = if frac.is_empty() { int.to_string() } else { format!("{int}.{frac}") };
    Some(if negative && magnitude != "0" { format!("-{magnitude}") } else { magnitude })
}

/// Reads the `candidates` input: an array whose entries are strings, numbers (voted as their
/// text) or `null` (a candidate without an answer).
fn read_candidates(call: &ToolCall) -> Result<Vec<Option<String>>, ToolError> {
    let value = call.inputs.get("candidates").ok_or(ToolError::MissingInput { tool: NAME, field: "candidates" })?;
    let list = value.as_array().ok_or_else(|| ToolError::InvalidInput {
        tool: NAME,
        field: "candidates",
        problem: format!("must be a list of strings, got {}", kind(value)),
    })?;
    list.iter()
        .enumerate()
        .map(|(i, entry)| match entry {
            Value::String(s) => Ok(Some(s.clone())),
            Value::Number(n) => Ok(Some(n.to_string())),
            Value::Null => Ok(None),
            other => Err(ToolError::InvalidInput {
                tool: NAME,
                field: "candidates",
                problem: format!("entry {i} must be a string, got {}", kind(other)),
            }),
        })
        .collect()
}

fn read_extract(call: &ToolCall) -> Result<Extract, ToolError> {
    match call.inputs.get("extract") {
        None | Some(Value::Null) => Ok(Extract::Gsm8k),
        Some(Value::String(name)) => Extract::parse(name).ok_or_else(|| ToolError::InvalidInput {
            tool: NAME,
            field: "extract",
            problem: format!("unknown extraction {name:?} (known: gsm8k, exact)"),
        }),
        Some(other) => Err(ToolError::InvalidInput {
            tool: NAME,
            field: "extract",
            problem: format!("must be a string, got {}", kind(other)),
        }),
    }
}

/// The call's time limit: its `timeout_s`, else [`VOTE_TIMEOUT_S`].
fn read_time_limit(call: &ToolCall) -> Result<Duration, ToolError> {
    let seconds = call.timeout_s.unwrap_or(VOTE_TIMEOUT_S);
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= 3600.0) {
        return Err(ToolError::InvalidInput {
            tool: NAME,
            field: "timeout_s",
            problem: format!("must be in (0, 3600] seconds, got {seconds}"),
        });
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// JSON type name for error messages.
pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Summary line of a vote.
pub fn summary(vote: &Vote, candidates: usize) -> String {
    let top = vote.winner.as_ref().and_then(|w| vote.votes.get(w)).copied().unwrap_or(0);
    match (&vote.winner, vote.verdict) {
        (None, _) | (_, VoteVerdict::NoAnswer) => {
            format!("No answer found in {candidates} candidate{}", if candidates == 1 { "" } else { "s" })
        }
        (Some(w), VoteVerdict::Majority) => format!("Majority answer: {w} ({top} of {} votes)", vote.counted),
        (Some(w), VoteVerdict::Plurality) => {
            format!("Plurality answer: {w} ({top} of {} votes, no majority)", vote.counted)
        }
        (Some(w), VoteVerdict::Tie) => format!(
            "Tie between {} ({top} of {} votes each); chose {w}, the earliest candidate's answer",
            vote.tied.join(", "),
            vote.counted
        ),
    }
}

/// Runs the tool.
pub fn run(call: &ToolCall) -> Result<ToolOutcome, ToolError> {
    let started = std::time::Instant::now();
    let candidates = read_candidates(call)?;
    let extract = read_extract(call)?;
    let time_limit = read_time_limit(call)?;
    let note = Some(format!(
        "majority_vote: the vote runs in the wasm sandbox (majority_vote.wat, wasmtime {}, no imports, memory ≤ {} MiB)",
        crate::sandbox::wasm::wasmtime_version(),
        VOTE_MEMORY_BYTES >> 20
    ));
    let Some(result) = vote_in_sandbox(&candidates, extract, time_limit)? else {
        let seconds = time_limit.as_secs_f64();
        return Ok(ToolOutcome {
            text: format!("Vote timed out after {seconds} s; no answer"),
            verdict: Some(VoteVerdict::NoAnswer.as_str().to_string()),
            value: json!({
                "answer": null,
                "candidates": candidates.len(),
                "timed_out": true,
                "reason": format!("timed out after {seconds} s"),
            }),
            // A stopped run is modeled as lasting exactly its limit.
            modeled_duration_s: seconds,
            wall_seconds: started.elapsed().as_secs_f64(),
            sandbox_note: note,
            failure: Some(ToolFailure { cause: ToolFailureCause::Timeout, detail: format!("vote timed out after {seconds} s") }),
            checks: VerdictChecks::default(),
        });
    };
    let text = summary(&result, candidates.len());
    let value = json!({
        "answer": result.winner,
        "votes": result.votes,
        "counted": result.counted,
        "candidates": candidates.len(),
        "answers": result.answers,
    });
    Ok(ToolOutcome {
        text,
        verdict: Some(result.verdict.as_str().to_string()),
        value,
        modeled_duration_s: MODELED_DURATION_S,
        wall_seconds: started.elapsed().as_secs_f64(),
        sandbox_note: note,
        failure: None,
        checks: VerdictChecks::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn some(items: &[&str]) -> Vec<Option<String>> {
        items.iter().map(|s| Some(s.to_string())).collect()
    }

    #[test]
    fn normalisation_strips_formatting() {
        assert_eq!(normalize_number("1,000").as_deref(), Some("1000"));
        assert_eq!(normalize_number("$18.00").as_deref(), Some("18"));
        assert_eq!(normalize_number("18.0").as_deref(), Some("18"));
        assert_eq!(normalize_number("18.50").as_deref(), Some("18.5"));
        assert_eq!(normalize_number("007").as_deref(), Some("7"));
        assert_eq!(normalize_number("-0.0").as_deref(), Some("0"));
        assert_eq!(normalize_number("-3").as_deref(), Some("-3"));
        assert_eq!(normalize_number("0.25").as_deref(), Some("0.25"));
        assert_eq!(normalize_number("abc"), None);
        assert_eq!(normalize_number(""), None);
        assert_eq!(normalize_number("."), None);
    }

    #[test]
    fn numbers_are_scanned_in_order() {
        assert_eq!(numbers("16 - 3 - 4 = 9 eggs, $1,250.50 total"), ["16", "3", "4", "9", "1250.5"]);
        assert_eq!(numbers("a-5 and -5 and x3"), ["5", "-5", "3"]);
        assert_eq!(numbers("ends with 18."), ["18"]);
        assert_eq!(numbers("1,23 is not grouped"), ["1", "23"]);
        assert_eq!(numbers("1.2.3"), ["1.2", "3"]);
    }

    #[test]
    fn gsm8k_answer_after_last_marker() {
        assert_eq!(extract_gsm8k("9 * 2 = 18\n#### 18").as_deref(), Some("18"));
        assert_eq!(extract_gsm8k("#### 5\nthen again\n#### $1,000.00").as_deref(), Some("1000"));
        assert_eq!(extract_gsm8k("She makes 9 * 2 = 18 dollars.").as_deref(), Some("18"));
        assert_eq!(extract_gsm8k("#### eighteen.").as_deref(), Some("eighteen"));
        assert_eq!(extract_gsm8k("I cannot solve this"), None);
        assert_eq!(extract_gsm8k(""), None);
        assert_eq!(extract_gsm8k("3 apples\n####   ").as_deref(), Some("3"));
    }

    #[test]
    fn clear_majority_wins() {
        let v = vote(&some(&["#### 18", "#### 17", "x = 18", "#### 18.00", "#### 17"]), Extract::Gsm8k);
        assert_eq!(v.winner.as_deref(), Some("18"));
        assert_eq!(v.verdict, VoteVerdict::Majority);
        assert_eq!(v.votes.get("18"), Some(&3));
        assert_eq!(v.votes.get("17"), Some(&2));
        assert_eq!(summary(&v, 5), "Majority answer: 18 (3 of 5 votes)");
    }

    #[test]
    fn tie_goes_to_the_earliest_candidate() {
        let v = vote(&some(&["#### 17", "#### 18", "#### 18", "#### 17"]), Extract::Gsm8k);
        assert_eq!(v.winner.as_deref(), Some("17"));
        assert_eq!(v.verdict, VoteVerdict::Tie);
        assert_eq!(v.tied, ["17", "18"]);
        let v = vote(&some(&["#### 18", "#### 17", "#### 18", "#### 17"]), Extract::Gsm8k);
        assert_eq!(v.winner.as_deref(), Some("18"));
    }

    #[test]
    fn plurality_without_majority() {
        let v = vote(&some(&["#### 1", "#### 2", "#### 3", "#### 3", "#### 4"]), Extract::Gsm8k);
        assert_eq!(v.winner.as_deref(), Some("3"));
        assert_eq!(v.verdict, VoteVerdict::Plurality);
        assert_eq!(summary(&v, 5), "Plurality answer: 3 (2 of 5 votes, no majority)");
        // Exactly half is not a majority.
        let v = vote(&some(&["#### 1", "#### 1", "#### 2", "#### 3"]), Extract::Gsm8k);
        assert_eq!(v.verdict, VoteVerdict::Plurality);
    }

    #[test]
    fn empty_and_garbage_candidates_do_not_vote() {
        let v = vote(&[None, Some(String::new()), Some("no idea".into()), Some("#### 4".into())], Extract::Gsm8k);
        assert_eq!(v.counted, 1);
        assert_eq!(v.winner.as_deref(), Some("4"));
        assert_eq!(v.verdict, VoteVerdict::Majority);
        assert_eq!(v.answers, [None, None, None, Some("4".to_string())]);
        let none = vote(&[None, Some("???".into())], Extract::Gsm8k);
        assert_eq!(none.verdict, VoteVerdict::NoAnswer);
        assert_eq!(none.winner, None);
        assert_eq!(summary(&none, 2), "No answer found in 2 candidates");
        assert_eq!(vote(&[], Extract::Gsm8k).verdict, VoteVerdict::NoAnswer);
    }

    #[test]
    fn exact_extraction_collapses_whitespace() {
        let v = vote(&some(&["  yes  ", "yes", "no\n", "   "]), Extract::Exact);
        assert_eq!(v.votes.get("yes"), Some(&2));
        assert_eq!(v.counted, 3);
        assert_eq!(v.verdict, VoteVerdict::Majority);
    }

    #[test]
    fn tool_reads_inputs_and_reports() {
        let mut inputs = BTreeMap::new();
        inputs.insert("candidates".to_string(), json!(["#### 18", "#### 18", null, 17, "#### 17"]));
        let out = run(&ToolCall { tool: NAME.into(), inputs, timeout_s: None }).expect("valid call");
        // The number candidate 17 votes like the text "17", so 18 and 17 tie at 2 of 4.
        assert_eq!(out.verdict.as_deref(), Some("tie"));
        assert_eq!(out.value["answer"], json!("18"));
        assert_eq!(out.value["votes"], json!({"18": 2, "17": 2}));
        assert_eq!(out.value["counted"], json!(4));
        assert_eq!(out.value["candidates"], json!(5));
        assert_eq!(out.value["answers"], json!(["18", "18", null, "17", "17"]));
        assert_eq!(out.text, "Tie between 18, 17 (2 of 4 votes each); chose 18, the earliest candidate's answer");
        assert_eq!(out.modeled_duration_s, MODELED_DURATION_S);
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let call = |inputs: Value| ToolCall {
            tool: NAME.into(),
            inputs: serde_json::from_value(inputs).expect("object"),
            timeout_s: None,
        };
        assert!(matches!(run(&call(json!({}))), Err(ToolError::MissingInput { field: "candidates", .. })));
        assert!(matches!(
            run(&call(json!({"candidates": "18"}))),
            Err(ToolError::InvalidInput { field: "candidates", .. })
        ));
        assert!(matches!(
            run(&call(json!({"candidates": [["18"]]}))),
            Err(ToolError::InvalidInput { field: "candidates", .. })
        ));
        assert!(matches!(
            run(&call(json!({"candidates": ["1"], "extract": "regex"}))),
            Err(ToolError::InvalidInput { field: "extract", .. })
        ));
    }

    #[test]
    fn answers_are_encoded_as_length_prefixed_records() {
        let input = encode_answers(&[Some("18".into()), None, Some(String::new())]);
        assert_eq!(input, [2, 0, 0, 0, b'1', b'8', 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
    }

    #[test]
    fn sandboxed_vote_matches_the_examples() {
        let limit = Duration::from_secs(5);
        let cases: [(&[Option<&str>], Extract); 5] = [
            (&[Some("#### 18"), Some("#### 17"), Some("x = 18"), Some("#### 18.00"), Some("#### 17")], Extract::Gsm8k),
            (&[Some("#### 17"), Some("#### 18"), Some("#### 18"), Some("#### 17")], Extract::Gsm8k),
            (&[None, Some(""), Some("no idea"), Some("#### 4")], Extract::Gsm8k),
            (&[], Extract::Gsm8k),
            (&[Some("  yes  "), Some("yes"), Some("no\n"), Some("   ")], Extract::Exact),
        ];
        for (candidates, extract) in cases {
            let candidates: Vec<Option<String>> = candidates.iter().map(|c| c.map(str::to_string)).collect();
            let sandboxed = vote_in_sandbox(&candidates, extract, limit).expect("runs");
            assert_eq!(sandboxed, Some(vote(&candidates, extract)), "{candidates:?}");
        }
    }

    #[test]
    fn a_vote_past_its_time_limit_is_a_result() {
        // 20 000 distinct answers of equal length: about 2·10⁸ comparisons, far beyond 1 ms.
        let many: Vec<Option<String>> = (0..20_000).map(|i| Some(format!("answer {i:08}"))).collect();
        assert_eq!(vote_in_sandbox(&many, Extract::Exact, Duration::from_millis(1)).expect("runs"), None);
        let mut inputs = BTreeMap::new();
        inputs.insert("candidates".to_string(), json!(many));
        inputs.insert("extract".to_string(), json!("exact"));
        let out = run(&ToolCall { tool: NAME.into(), inputs, timeout_s: Some(0.001) }).expect("an outcome");
        assert_eq!(out.verdict.as_deref(), Some("no_answer"));
        assert_eq!(out.value["timed_out"], json!(true));
        assert_eq!(out.text, "Vote timed out after 0.001 s; no answer");
        assert_eq!(out.modeled_duration_s, 0.001);
    }

    #[test]
    fn inconsistent_module_results_are_rejected() {
        let answers = vec![Some("a".to_string()), Some("b".to_string()), Some("a".to_string())];
        // winner 0, top 2, counted 3, tied 1, majority; first = [0, 1, 0]; votes = [2, 1, 0].
        let good = [0, 2, 3, 1, 0, 0, 1, 0, 2, 1, 0];
        let decoded = decode_vote(answers.clone(), &good).expect("consistent");
        assert_eq!(decoded, vote(&answers, Extract::Exact));
        let mut wrong_group = good;
        wrong_group[6] = 0; // "b" grouped with "a"
        assert!(decode_vote(answers.clone(), &wrong_group).is_err());
        let mut wrong_count = good;
        wrong_count[8] = 3;
        assert!(decode_vote(answers.clone(), &wrong_count).is_err());
        let mut wrong_winner = good;
        wrong_winner[0] = 1;
        assert!(decode_vote(answers.clone(), &wrong_winner).is_err());
        let mut bad_verdict = good;
        bad_verdict[4] = 9;
        assert!(decode_vote(answers.clone(), &bad_verdict).is_err());
        assert!(decode_vote(answers, &good[..6]).is_err(), "missing words");
    }

    proptest! {
        /// The WebAssembly module and the Rust reference agree on every vote: winner, counts,
        /// ties, verdict.
        #[test]
        fn sandboxed_vote_agrees_with_the_reference(
            picks in proptest::collection::vec(proptest::option::of(0usize..12), 0..24),
            exact in proptest::bool::ANY,
        ) {
            const TEXTS: [&str; 12] = [
                "#### 18", "so 18.00", "#### 17", "#### -3", "no answer here", "", "#### eighteen.",
                "ends with 1,000", "#### 1000", "yes", "  yes ", "ÿes ✓",
            ];
            let candidates: Vec<Option<String>> = picks.iter().map(|p| p.map(|i| TEXTS[i].to_string())).collect();
            let extract = if exact { Extract::Exact } else { Extract::Gsm8k };
            let sandboxed = vote_in_sandbox(&candidates, extract, Duration::from_secs(5)).expect("runs");
            prop_assert_eq!(sandboxed, Some(vote(&candidates, extract)));
        }

        /// The winner always has the maximal vote count, votes add up, and the verdict agrees
        /// with the counts.
        #[test]
        fn vote_invariants(answers in proptest::collection::vec(proptest::option::of(0u8..6), 0..12)) {
            let candidates: Vec<Option<String>> =
                answers.iter().map(|a| a.map(|n| format!("work... #### {n}"))).collect();
            let v = vote(&candidates, Extract::Gsm8k);
            let cast = answers.iter().flatten().count();
            prop_assert_eq!(v.counted, cast);
            prop_assert_eq!(v.votes.values().map(|&c| c as usize).sum::<usize>(), cast);
            match &v.winner {
                None => prop_assert_eq!(cast, 0),
                Some(w) => {
                    let top = v.votes[w];
                    prop_assert!(v.votes.values().all(|&c| c <= top));
                    // Earliest among the tied.
                    let first_tied = answers.iter().flatten().map(|n| n.to_string())
                        .find(|a| v.votes[a] == top);
                    prop_assert_eq!(Some(w.clone()), first_tied);
                    let majority = 2 * top as usize > cast;
                    prop_assert_eq!(v.verdict == VoteVerdict::Majority, majority);
                    if !majority {
                        prop_assert_eq!(v.verdict == VoteVerdict::Tie, v.tied.len() > 1);
                    }
                }
            }
        }

        /// Normalisation is idempotent and insensitive to thousands separators and `.0`.
        #[test]
        fn normalisation_is_canonical(n in 0u64..10_000_000, cents in 0u8..100) {
            let plain = normalize_number(&format!("{n}.{cents:02}")).expect("number");
            prop_assert_eq!(normalize_number(&plain), Some(plain.clone()));
            let grouped = {
                let digits = n.to_string();
                let mut out = String::new();
                for (i, c) in digits.chars().enumerate() {
                    if i > 0 && (digits.len() - i) % 3 == 0 { out.push(','); }
                    out.push(c);
                }
                out
            };
            prop_assert_eq!(normalize_number(&format!("${grouped}.00")), Some(n.to_string()));
            prop_assert_eq!(extract_gsm8k(&format!("so #### {grouped}")), Some(n.to_string()));
        }
    }
}
