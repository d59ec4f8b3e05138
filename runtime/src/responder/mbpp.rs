//! MBPP responders: `mbpp.generate`, `mbpp.diagnose`, `mbpp.review`, `mbpp.repair`, and
//! [`extract_code`].
//!
//! A coder returns, in a ```` ```python ```` block, either the record's reference solution
//! (`input["code"]`) — with its model's MBPP pass@1 for a generation, with its repair
//! probability for a repair ([`super::models`]) — or a mutant of it
//! (see `super::mutate`). The responder never declares a pass: the real `python_tests` tool
//! runs the code and decides the branch. Diagnoses and reviews are prose that cite the failing
//! test (from the upstream tool output) and a line of the code; whether they point at the line
//! that is really wrong is drawn with the model's localisation probability.
//!
//! Depends on `super::{fit, mutate, models}` and the crate's `values`; never reads files.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::fit::fit;
use super::models;
use super::mutate::mutate;
use super::{ResponderError, ResponderRequest};

/// The code in a model's answer: the body of the first ```` ```python ```` (or ```` ```py ````)
/// fenced block, else of the first fenced block of any language, else the whole text. A block
/// whose closing fence was cut off runs to the end of the text.
pub fn extract_code(text: &str) -> String {
    let mut first_any: Option<String> = None;
    let mut rest = text;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let (info, body_start) = match after.find('\n') {
            Some(nl) => (after[..nl].trim(), nl + 1),
            None => (after.trim(), after.len()),
        };
        let body = &after[body_start..];
        let (code, next) = match body.find("```") {
            Some(close) => (&body[..close], &body[close + 3..]),
            None => (body, ""),
        };
        let code = code.strip_suffix('\n').unwrap_or(code).to_string();
        let lang = info.to_ascii_lowercase();
        if lang == "python" || lang == "py" || lang == "python3" {
            return code;
        }
        if first_any.is_none() {
            first_any = Some(code);
        }
        rest = next;
    }
    first_any.unwrap_or_else(|| text.to_string())
}

/// Name and parameter list of the first `def` in `code`, e.g. `("similar_elements", "a, b")`.
fn signature(code: &str) -> Option<(String, String)> {
    let line = code.lines().find(|l| l.trim_start().starts_with("def "))?;
    let after = line.trim_start().strip_prefix("def ")?;
    let open = after.find('(')?;
    let close = after.rfind(')')?;
    (close > open).then(|| (after[..open].trim().to_string(), after[open + 1..close].trim().to_string()))
}

/// What a line of code does, in a few words, for the explanation after a code block.
fn describe(line: &str) -> &'static str {
    let l = line.trim_start();
    if l.starts_with("def ") {
        "defines the function and its parameters"
    } else if l.starts_with("for ") || l.starts_with("while ") {
        "loops over the relevant values"
    } else if l.starts_with("if ") || l.starts_with("elif ") || l.starts_with("else") {
        "handles this case separately"
    } else if l.starts_with("return ") || l == "return" {
        "returns the result"
    } else if l.starts_with("import ") || l.starts_with("from ") {
        "imports what the solution needs"
    } else if l.contains('=') && !l.contains("==") {
        "stores an intermediate value"
    } else {
        "performs one step of the computation"
    }
}

/// Explanation lines a coder writes after its code block: the task, a walk through the code,
/// and the examples it expects to satisfy.
fn explanation_lines(code: &str, task: Option<&str>, tests: &[&str], lead: &str) -> Vec<String> {
    let mut lines = Vec::new();
    match signature(code) {
        Some((name, params)) => lines.push(format!("\n\n{lead} `{name}({params})`.")),
        None => lines.push(format!("\n\n{lead} the function above.")),
    }
    if let Some(task) = task {
        lines.push(format!(" The task: {}", task.trim()));
    }
    for l in code.lines().filter(|l| !l.trim().is_empty()) {
        lines.push(format!("\n- `{}` {}.", l.trim(), describe(l)));
    }
    for t in tests {
        lines.push(format!("\nIt should satisfy `{}`.", t.trim()));
    }
    lines.push("\nThe function has no side effects and only uses the standard library.".to_string());
    lines
}

fn optional_str<'a>(req: &'a ResponderRequest, field: &str) -> Option<&'a str> {
    req.input.get(field).and_then(|v| v.as_str())
}

/// `input.test_list` when present (an empty list when absent; an error when ill-typed).
fn optional_tests<'a>(req: &'a ResponderRequest) -> Result<Vec<&'a str>, ResponderError> {
    match req.input.get("test_list") {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(_) => req.str_list_field("test_list"),
    }
}

/// A program for the task: the reference with probability `p`, else a mutant of it. Returns
/// (code, mutation operator or `None`).
fn program(reference: &str, p: f64, rng: &mut ChaCha8Rng) -> (String, Option<&'static str>) {
    if rng.random_bool(p.clamp(0.0, 1.0)) {
        return (reference.to_string(), None);
    }
    match mutate(reference, rng) {
        Some((code, edit)) => (code, Some(edit.operator)),
        // No mutation site at all (a one-line body without operators or constants): the
        // model can only write the reference.
        None => (reference.to_string(), None),
    }
}

fn coder_output(
    req: &ResponderRequest,
    code: &str,
    intro: &str,
    lead: &str,
    target: usize,
) -> Result<String, ResponderError> {
    let head = format!("{intro}```python\n{code}\n```");
    // Only the asserts the prompt shows: the model has not seen the hidden ones.
    let tests: Vec<&str> = optional_tests(req)?.into_iter().filter(|t| req.prompt.contains(t.trim())).collect();
    let lines = explanation_lines(code, optional_str(req, "prompt"), &tests, lead);
    Ok(fit(&head, "", target, &mut |i| lines[i % lines.len()].clone()))
}

/// `mbpp.generate`: a ```` ```python ```` block with the reference solution (probability: the
/// model's MBPP pass@1) or a mutant, then an explanation. Needs `input.code`; uses
/// `input.prompt` and those `input.test_list` asserts that the prompt shows, when present.
pub(crate) fn generate(
    req: &ResponderRequest,
    rng: &mut ChaCha8Rng,
    target: usize,
) -> Result<(String, serde_json::Value), ResponderError> {
    let reference = req.str_field("code")?;
    let p = models::mbpp_accuracy(req.model).ok_or_else(|| req.unknown_model())?;
    let (code, mutation) = program(reference, p, rng);
    let text = coder_output(req, &code, "", "This defines", target)?;
    Ok((text, json!({ "mutation": mutation, "intended_correct": mutation.is_none() })))
}

/// `mbpp.repair`: a new program after feedback — the reference with the model's repair
/// probability ([`models::mbpp_repair_probability`]), else a (possibly different) mutant.
/// Needs `input.code`.
pub(crate) fn repair(
    req: &ResponderRequest,
    rng: &mut ChaCha8Rng,
    target: usize,
) -> Result<(String, serde_json::Value), ResponderError> {
    let reference = req.str_field("code")?;
    let p = models::mbpp_repair_probability(req.model).ok_or_else(|| req.unknown_model())?;
    let (code, mutation) = program(reference, p, rng);
    let feedback = Feedback::gather(req);
    let intro = match &feedback.cited {
        Some(line) => format!("Based on the failing test and the review, the problem is around `{line}`. Here is the corrected function:\n\n"),
        None => "Here is the corrected function:\n\n".to_string(),
    };
    let text = coder_output(req, &code, &intro, "The corrected version defines", target)?;
    Ok((text, json!({ "mutation": mutation, "intended_correct": mutation.is_none() })))
}

/// What a diagnosing or reviewing model sees: the failing test report, the candidate code, and
/// the line an earlier diagnosis cited.
struct Feedback {
    /// The test tool's report of the failure, e.g. `1/3 tests passed; first failure: …`.
    failure: Option<String>,
    /// The latest candidate program.
    code: Option<String>,
    /// The line cited by the latest upstream diagnosis or review.
    cited: Option<String>,
}

impl Feedback {
    fn gather(req: &ResponderRequest) -> Feedback {
        let mut failure = None;
        let mut code = None;
        let mut cited = None;
        for (_, out) in req.upstream {
            if out.verdict.as_deref() == Some("fail") {
                failure = Some(first_line(&out.text));
            }
            if out.text.contains("```") {
                code = Some(extract_code(&out.text));
            }
            if let Some(line) = out.value.get("cited_line").and_then(|v| v.as_str()) {
                cited = Some(line.to_string());
            }
        }
        // Without a failing tool output upstream, the prompt may quote the report.
        if failure.is_none() {
            failure = req
                .prompt
                .lines()
                .find(|l| l.contains("tests passed") || l.contains("failure:") || l.trim_start().starts_with("assert "))
                .map(first_line);
        }
        if code.is_none() && req.prompt.contains("```") {
            code = Some(extract_code(req.prompt));
        }
        Feedback { failure, code, cited }
    }
}

/// The first non-empty line of a report, at most [`REPORT_CHARS`] characters.
fn first_line(text: &str) -> String {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    line.chars().take(REPORT_CHARS).collect()
}

/// How much of a test report a diagnosis quotes.
const REPORT_CHARS: usize = 400;

/// The line that really differs between `candidate` and `reference`: the first candidate line
/// absent from the reference, else the first reference line absent from the candidate
/// (a deleted statement, reported as missing). `None` when they agree line by line.
fn faulty_line(candidate: &str, reference: &str) -> Option<(String, bool)> {
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let cand: Vec<String> = candidate.lines().map(norm).filter(|l| !l.is_empty()).collect();
    let refr: Vec<String> = reference.lines().map(norm).filter(|l| !l.is_empty()).collect();
    if let Some(l) = cand.iter().find(|l| !refr.contains(l)) {
        return Some((l.clone(), false));
    }
    refr.iter().find(|l| !cand.contains(l)).map(|l| (l.clone(), true))
}

/// Pick the line a diagnosis cites: the faulty one with probability `p`, else another line of
/// the candidate (not its `def` line when there is a choice).
fn cite(candidate: &str, reference: &str, p: f64, rng: &mut ChaCha8Rng) -> (Option<String>, bool, bool) {
    let truth = faulty_line(candidate, reference);
    let localized = rng.random_bool(p.clamp(0.0, 1.0));
    if localized && let Some((line, missing)) = &truth {
        return (Some(line.clone()), true, *missing);
    }
    let others: Vec<String> = candidate
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty() && !l.starts_with("def ") && truth.as_ref().is_none_or(|(t, _)| t != l))
        .collect();
    if others.is_empty() {
        return (truth.as_ref().map(|(l, _)| l.clone()), truth.is_some(), truth.is_some_and(|(_, m)| m));
    }
    (Some(others[rng.random_range(0..others.len())].clone()), false, false)
}

fn analysis_lines(code: &str, failure: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for l in code.lines().filter(|l| !l.trim().is_empty()) {
        lines.push(format!("\nTracing the failing case through `{}`: it {}.", l.trim(), describe(l)));
    }
    lines.push(format!("\nThe test report was: {failure}"));
    lines.push("\nThe other asserts exercise the same logic, so one fix should make them all pass.".to_string());
    lines
}

/// `mbpp.diagnose`: prose that cites the failing test and the line it blames. Needs
/// `input.code` (to know which line is really wrong).
pub(crate) fn diagnose(
    req: &ResponderRequest,
    rng: &mut ChaCha8Rng,
    target: usize,
) -> Result<(String, serde_json::Value), ResponderError> {
    let reference = req.str_field("code")?;
    let p = models::mbpp_localization_probability(req.model).ok_or_else(|| req.unknown_model())?;
    let fb = Feedback::gather(req);
    let failure = fb.failure.clone().unwrap_or_else(|| "the tests fail".to_string());
    let code = fb.code.clone().unwrap_or_default();
    let (cited, localized, missing) = cite(&code, reference, p, rng);
    let mut head = format!("The program fails its tests: {failure}");
    match (&cited, missing) {
        (Some(line), true) => head.push_str(&format!("\nThe function is missing a statement: `{line}` is never executed, so the result is incomplete.")),
        (Some(line), false) => head.push_str(&format!("\nThe most likely cause is the line `{line}`: it produces a wrong intermediate value for this input.")),
        (None, _) => head.push_str("\nThe code reads correctly; the failure may depend on an edge case of the input."),
    }
    let lines = analysis_lines(&code, &failure);
    let text = fit(&head, "", target, &mut |i| lines[i % lines.len()].clone());
    Ok((text, json!({ "cited_line": cited, "localized": localized })))
}

/// `mbpp.review`: a second opinion on the diagnosis. A reviewer that localises the bug (its
/// model's localisation probability) agrees with a correct diagnosis and corrects a wrong one;
/// one that does not follows the diagnosis. Needs `input.code`.
pub(crate) fn review(
    req: &ResponderRequest,
    rng: &mut ChaCha8Rng,
    target: usize,
) -> Result<(String, serde_json::Value), ResponderError> {
    let reference = req.str_field("code")?;
    let p = models::mbpp_localization_probability(req.model).ok_or_else(|| req.unknown_model())?;
    let fb = Feedback::gather(req);
    let failure = fb.failure.clone().unwrap_or_else(|| "the tests fail".to_string());
    let code = fb.code.clone().unwrap_or_default();
    let truth = faulty_line(&code, reference).map(|(l, _)| l);
    let (cited, localized, head) = match &fb.cited {
        // With a diagnosis to check: a reviewer that localises the bug confirms or corrects it.
        Some(d) => {
            let localized = rng.random_bool(p.clamp(0.0, 1.0)) && truth.is_some();
            match (localized, &truth) {
                (true, Some(t)) if t == d => {
                    (Some(d.clone()), true, format!("I agree with the diagnosis: `{d}` is where the program goes wrong."))
                }
                (true, Some(t)) => (
                    Some(t.clone()),
                    true,
                    format!("I disagree with the diagnosis: `{d}` is fine; the real problem is `{t}`."),
                ),
                _ => (Some(d.clone()), false, format!("The diagnosis is plausible: `{d}` should be changed.")),
            }
        }
        // Without one, the review is a diagnosis of its own.
        None => {
            let (cited, localized, _) = cite(&code, reference, p, rng);
            let head = match &cited {
                Some(line) => format!("Reviewing the code, the line to change is `{line}`."),
                None => "The code reads correctly; the failure may depend on an edge case of the input.".to_string(),
            };
            (cited, localized, head)
        }
    };
    let head = format!("{head}\nFailing test: {failure}");
    let lines = analysis_lines(&code, &failure);
    let text = fit(&head, "", target, &mut |i| lines[i % lines.len()].clone());
    Ok((text, json!({ "cited_line": cited, "localized": localized })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_extraction() {
        assert_eq!(extract_code("Here:\n```python\ndef f():\n    return 1\n```\nDone."), "def f():\n    return 1");
        assert_eq!(extract_code("```\nx = 1\n```\n```py\ny = 2\n```"), "y = 2");
        assert_eq!(extract_code("```\nx = 1\n```"), "x = 1");
        assert_eq!(extract_code("```python\ndef f():\n    return"), "def f():\n    return");
        assert_eq!(extract_code("def f(): pass"), "def f(): pass");
    }

    #[test]
    fn faulty_lines_are_found_both_ways() {
        let r = "def f(x):\n    y = x + 1\n    return y";
        assert_eq!(faulty_line("def f(x):\n    y = x - 1\n    return y", r), Some(("y = x - 1".into(), false)));
        assert_eq!(faulty_line("def f(x):\n    return y", r), Some(("y = x + 1".into(), true)));
        assert_eq!(faulty_line(r, r), None);
    }

    #[test]
    fn signatures() {
        assert_eq!(signature("import re\ndef f(a, b=2):\n  pass"), Some(("f".into(), "a, b=2".into())));
        assert_eq!(signature("x = 1"), None);
    }
}
