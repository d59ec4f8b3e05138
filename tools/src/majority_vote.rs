//! The `majority_vote` tool: aggregate solver outputs by voting on their final answers.
//!
//! Owns answer extraction (GSM8K style: the answer after the last `####`, else the last number
//! in the text), number normalisation and the vote itself. Pure, in-process Rust with no I/O.
//! Must not depend on the runtime or the sandbox.
//!
//! Rules:
//! * every candidate yields at most one answer; candidates without one (empty, `null`, no
//!   number) do not vote;
//! * the winner has the most votes; among equals, the answer of the earliest candidate wins;
//! * verdict `majority` when the winner holds more than half of the votes cast, `tie` when
//!   another answer has as many votes as the winner, `plurality` when the winner is alone at
//!   the top but holds at most half, and `no_answer` when nobody voted.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::{ToolCall, ToolError, ToolOutcome};

/// Tool name.
pub const NAME: &str = "majority_vote";

/// Modeled duration of one vote: the measured in-process cost is a few microseconds (see
/// `examples/calibrate.rs`), so this is a dispatch overhead of 1 ms, the figure the tool's
/// specification suggests, kept constant so virtual time stays deterministic.
pub const MODELED_DURATION_S: f64 = 0.001;

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
    let result = vote(&candidates, extract);
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
        sandbox_note: None,
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

    proptest! {
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
