//! GSM8K responders (`gsm8k.solve`, `gsm8k.refine`) and final-answer extraction.
//!
//! The worked steps come from the record's reference answer (`input["answer"]`, the dataset's
//! solution with `<<expr=result>>` calculator annotations and a final `#### <answer>` line);
//! the annotations are stripped, as a model writes no calculator calls. A solver is right with
//! its model's GSM8K accuracy ([`super::models::gsm8k_accuracy`]); a wrong solution perturbs
//! the step that produces the final answer in one of three realistic ways (a wrong operation,
//! a dropped step or an arithmetic slip; see `Slip` for their weights).
//! Correctness is drawn from the request's own seed, so solvers with different seeds are
//! independent.
//!
//! The drawn length is independent of the problem, so a short draw can cut off the final
//! `####` line (the answer then falls back to the last number written). Measured over the
//! 1,319 test problems at the solvers' distribution in `workflows/gsm8k.yaml` (mean 200, cv
//! 0.4): 6.3 % of the solutions lose their final line and Qwen3-8B scores 0.845 against 0.894
//! intended (`runtime/tests/responder_measure.rs`). Reference solutions are 76 tokens at the
//! median, 130 at the 90th percentile.
//!
//! Depends on `super::{fit, text, models}` and the crate's `values`; never reads files.

use std::collections::BTreeMap;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::fit::fit;
use super::models;
use super::text::{format_value, normalize_number, number_spans, split_sentences};
use super::{ResponderError, ResponderRequest};

/// The final answer of a GSM8K solution: the first number on the line after the last `####`;
/// when there is no `####` or no number after it, the last number in the text. The number is
/// normalised: `$`, thousands commas and blanks dropped, trailing zeros after a decimal point
/// and a trailing `.` dropped (`$1,200.00` → `1200`, `18.0` → `18`, `2.50` → `2.5`).
/// `None` when the text holds no number at all.
///
/// The `majority_vote` tool applies the same rule to each candidate.
pub fn extract_gsm8k_answer(text: &str) -> Option<String> {
    if let Some(pos) = text.rfind("####") {
        let rest = &text[pos + 4..];
        let line = rest.lines().next().unwrap_or("");
        if let Some(n) = number_spans(line).into_iter().next() {
            return Some(n.normalized);
        }
    }
    number_spans(text).pop().map(|n| n.normalized)
}

/// Normalise an answer given on its own (a vote key, a reference answer): a bare number is
/// normalised, anything else goes through [`extract_gsm8k_answer`].
pub fn normalize_answer(raw: &str) -> Option<String> {
    normalize_number(raw).or_else(|| extract_gsm8k_answer(raw))
}

/// One calculator annotation `<<expr=result>>` of a step.
#[derive(Debug, Clone, PartialEq)]
struct Calc {
    /// The expression as annotated, e.g. `16-3-4`.
    expr: String,
    /// Normalised result, e.g. `9`.
    result: String,
    /// Byte offset in the step's visible text where the annotation stood (the visible result
    /// follows it).
    at: usize,
}

/// One line of a worked solution, annotations removed.
#[derive(Debug, Clone, PartialEq)]
struct Step {
    text: String,
    /// The line's last annotation, if any.
    calc: Option<Calc>,
}

/// A worked solution: steps and the normalised final answer.
#[derive(Debug, Clone, PartialEq)]
struct Worked {
    steps: Vec<Step>,
    answer: String,
}

/// Parse a GSM8K reference answer into steps and the final answer.
fn parse_reference(answer: &str) -> Option<Worked> {
    let mut steps = Vec::new();
    let mut final_answer = None;
    for line in answer.lines() {
        let trimmed = line.trim();
        if let Some(rest) = trimmed.strip_prefix("####") {
            final_answer = normalize_answer(rest);
            continue;
        }
        if trimmed.is_empty() {
            continue;
        }
        steps.push(strip_annotations(trimmed));
    }
    let answer = match final_answer {
        Some(a) => a,
        None => steps.iter().rev().find_map(|s| number_spans(&s.text).pop().map(|n| n.normalized))?,
    };
    Some(Worked { steps, answer })
}

/// Remove `<<...>>` annotations from a line, remembering the last one.
fn strip_annotations(line: &str) -> Step {
    let mut text = String::with_capacity(line.len());
    let mut calc = None;
    let mut rest = line;
    while let Some(open) = rest.find("<<") {
        let Some(close_rel) = rest[open + 2..].find(">>") else { break };
        let inner = &rest[open + 2..open + 2 + close_rel];
        text.push_str(&rest[..open]);
        if let Some((expr, result)) = inner.rsplit_once('=')
            && let Some(result) = normalize_number(result)
        {
            calc = Some(Calc { expr: expr.trim().to_string(), result, at: text.len() });
        }
        rest = &rest[open + 2 + close_rel + 2..];
    }
    text.push_str(rest);
    Step { text, calc }
}

// ---------------------------------------------------------------------------------------------
// Arithmetic of calculator annotations.

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Op(char),
    Open,
    Close,
}

/// Lex an annotation expression; `None` on anything but numbers, `+ - * /` and parentheses.
fn lex(expr: &str) -> Option<Vec<Tok>> {
    let mut out = Vec::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || c == '.' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.' || chars[i] == ',') {
                i += 1;
            }
            let s: String = chars[start..i].iter().filter(|c| **c != ',').collect();
            out.push(Tok::Num(s.parse().ok()?));
        } else if matches!(c, '+' | '-' | '*' | '/') {
            out.push(Tok::Op(c));
            i += 1;
        } else if c == '(' {
            out.push(Tok::Open);
            i += 1;
        } else if c == ')' {
            out.push(Tok::Close);
            i += 1;
        } else {
            return None;
        }
    }
    Some(out)
}

/// Indices in `toks` of binary operators (a `-` after an operator, `(` or at the start is a
/// sign).
fn binary_ops(toks: &[Tok]) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        if let Tok::Op(_) = t {
            let unary = i == 0 || matches!(toks[i - 1], Tok::Op(_) | Tok::Open);
            if !unary {
                out.push(i);
            }
        }
    }
    out
}

/// Evaluate tokens with the usual precedence; `None` on a syntax error or a non-finite value.
fn eval(toks: &[Tok]) -> Option<f64> {
    struct P<'a> {
        t: &'a [Tok],
        i: usize,
    }
    impl P<'_> {
        fn expr(&mut self) -> Option<f64> {
            let mut v = self.term()?;
            while let Some(Tok::Op(c @ ('+' | '-'))) = self.t.get(self.i) {
                let c = *c;
                self.i += 1;
                let r = self.term()?;
                v = if c == '+' { v + r } else { v - r };
            }
            Some(v)
        }
        fn term(&mut self) -> Option<f64> {
            let mut v = self.factor()?;
            while let Some(Tok::Op(c @ ('*' | '/'))) = self.t.get(self.i) {
                let c = *c;
                self.i += 1;
                let r = self.factor()?;
                v = if c == '*' { v * r } else { v / r };
            }
            Some(v)
        }
        fn factor(&mut self) -> Option<f64> {
            match self.t.get(self.i)? {
                Tok::Num(n) => {
                    self.i += 1;
                    Some(*n)
                }
                Tok::Op('-') => {
                    self.i += 1;
                    Some(-self.factor()?)
                }
                Tok::Open => {
                    self.i += 1;
                    let v = self.expr()?;
                    if self.t.get(self.i) != Some(&Tok::Close) {
                        return None;
                    }
                    self.i += 1;
                    Some(v)
                }
                _ => None,
            }
        }
    }
    let mut p = P { t: toks, i: 0 };
    let v = p.expr()?;
    (p.i == toks.len() && v.is_finite()).then_some(v)
}

// ---------------------------------------------------------------------------------------------
// Wrong solutions.

/// How a wrong solution goes wrong. Weights are an assumption loosely following the error
/// analysis of wrong chain-of-thought answers on GSM8K in Wei et al., *Chain-of-Thought
/// Prompting Elicits Reasoning in Large Language Models* (NeurIPS 2022, Appendix D.2), where
/// calculator errors, symbol-mapping errors and one missing step are the "minor" error classes,
/// in comparable shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slip {
    /// The last step uses the wrong operation (`+`↔`-`, `*`→`/` or `+`, `/`→`*`).
    WrongOperation,
    /// The last step is missing: the previous step's result is given as the answer.
    DroppedStep,
    /// An arithmetic slip in the last step: off by one, two or ten, or transposed digits.
    Arithmetic,
}

/// Relative weights of [`Slip`] kinds (see there for the source).
const SLIP_WEIGHTS: [(Slip, f64); 3] = [(Slip::WrongOperation, 0.4), (Slip::DroppedStep, 0.3), (Slip::Arithmetic, 0.3)];

/// A wrong variant of `w`, deterministic in `rng`. The answer always differs from `w.answer`.
fn wrong_solution(w: &Worked, rng: &mut ChaCha8Rng) -> Worked {
    let roll: f64 = rng.random::<f64>() * SLIP_WEIGHTS.iter().map(|(_, p)| p).sum::<f64>();
    let mut acc = 0.0;
    let mut kind = Slip::Arithmetic;
    for (k, p) in SLIP_WEIGHTS {
        acc += p;
        if roll < acc {
            kind = k;
            break;
        }
    }
    let attempt = match kind {
        Slip::WrongOperation => wrong_operation(w, rng),
        Slip::DroppedStep => dropped_step(w),
        Slip::Arithmetic => None,
    };
    match attempt {
        Some(x) if x.answer != w.answer => x,
        _ => arithmetic_slip(w, rng),
    }
}

/// Index of the step whose annotation produces the final answer (the last such step).
fn final_step(w: &Worked) -> Option<usize> {
    w.steps.iter().rposition(|s| s.calc.as_ref().is_some_and(|c| c.result == w.answer))
}

/// Replace, in the steps from `from` on, the last written occurrence of `old` by `new`.
fn propagate(steps: &mut [Step], from: usize, old: &str, new: &str) {
    for s in steps.iter_mut().skip(from) {
        if let Some(span) = number_spans(&s.text).into_iter().rev().find(|n| n.normalized == old) {
            s.text.replace_range(span.start..span.end, new);
        }
    }
}

fn wrong_operation(w: &Worked, rng: &mut ChaCha8Rng) -> Option<Worked> {
    let k = final_step(w)?;
    let calc = w.steps[k].calc.as_ref()?;
    let mut toks = lex(&calc.expr)?;
    let ops = binary_ops(&toks);
    if ops.is_empty() {
        return None;
    }
    let which = rng.random_range(0..ops.len());
    let at = ops[which];
    let Tok::Op(old) = toks[at] else { return None };
    let new = match old {
        '+' => '-',
        '-' => '+',
        '*' => {
            if rng.random_bool(0.5) {
                '/'
            } else {
                '+'
            }
        }
        _ => '*',
    };
    toks[at] = Tok::Op(new);
    let value = format_value(eval(&toks)?);
    if value == w.answer {
        return None;
    }
    let mut steps = w.steps.clone();
    let step = &mut steps[k];
    // Operands appear in the visible text before the annotation: find them and swap the
    // operator between operand `which` and `which + 1`.
    let operands: Vec<String> =
        toks.iter().filter_map(|t| if let Tok::Num(n) = t { Some(format_value(*n)) } else { None }).collect();
    let mut new_text = step.text.clone();
    if let Some(result) = number_spans(&step.text[calc.at..]).into_iter().next() {
        new_text.replace_range(calc.at + result.start..calc.at + result.end, &value);
    }
    if let Some(gap) = operator_gap(&step.text[..calc.at], &operands, which) {
        let sym = match new {
            '*' if step.text[gap.0..gap.1].contains('x') => "x",
            '*' => "*",
            c => match c {
                '+' => "+",
                '-' => "-",
                _ => "/",
            },
        };
        if let Some(pos) = step.text[gap.0..gap.1].find(['+', '-', '*', '/', 'x', '×', '÷']) {
            let start = gap.0 + pos;
            let len = step.text[start..].chars().next().map_or(1, char::len_utf8);
            new_text.replace_range(start..start + len, sym);
        }
    }
    step.text = new_text;
    propagate(&mut steps, k + 1, &w.answer, &value);
    Some(Worked { steps, answer: value })
}

/// Byte range of the gap between visible operand `which` and `which + 1` of an expression
/// whose operands are `operands`, searching the last matching run of numbers in `visible`.
fn operator_gap(visible: &str, operands: &[String], which: usize) -> Option<(usize, usize)> {
    let spans = number_spans(visible);
    let k = operands.len();
    if k < 2 || spans.len() < k {
        return None;
    }
    let is_gap = |a: usize, b: usize| visible[a..b].chars().all(|c| c.is_whitespace() || "+-*/x×÷()$".contains(c));
    for start in (0..=spans.len() - k).rev() {
        let run = &spans[start..start + k];
        let numbers_match = run.iter().zip(operands).all(|(s, o)| normalize_number(o).as_deref() == Some(&s.normalized));
        let gaps_ok = run.windows(2).all(|p| is_gap(p[0].end, p[1].start));
        if numbers_match && gaps_ok {
            return Some((run[which].end, run[which + 1].start));
        }
    }
    None
}

fn dropped_step(w: &Worked) -> Option<Worked> {
    let k = final_step(w)?;
    let prev = w.steps[..k].iter().rev().find_map(|s| s.calc.as_ref().map(|c| c.result.clone()))?;
    (prev != w.answer).then(|| Worked { steps: w.steps[..k].to_vec(), answer: prev })
}

fn arithmetic_slip(w: &Worked, rng: &mut ChaCha8Rng) -> Worked {
    let value: f64 = w.answer.parse().unwrap_or(0.0);
    let is_int = (value - value.round()).abs() < 1e-9;
    let digits: Vec<char> = w.answer.chars().filter(char::is_ascii_digit).collect();
    let transposable = is_int && digits.len() >= 2 && digits[digits.len() - 1] != digits[digits.len() - 2];
    let choice = rng.random_range(0..7u32);
    let mut wrong = if choice == 6 && transposable {
        let mut s: Vec<char> = w.answer.chars().collect();
        let n = s.len();
        s.swap(n - 1, n - 2);
        s.into_iter().collect()
    } else {
        let delta = [1.0, -1.0, 2.0, -2.0, 10.0, -10.0, 1.0][choice as usize];
        let mut v = value + delta;
        if v < 0.0 && value >= 0.0 {
            v = value + delta.abs();
        }
        format_value(v)
    };
    if normalize_number(&wrong).as_deref() == Some(w.answer.as_str()) || normalize_number(&wrong).is_none() {
        wrong = format_value(value + 1.0);
    }
    let wrong = normalize_number(&wrong).unwrap_or(wrong);
    let mut steps = w.steps.clone();
    match final_step(w) {
        Some(k) => {
            if let Some(calc) = &w.steps[k].calc
                && let Some(r) = number_spans(&w.steps[k].text[calc.at..]).into_iter().next()
            {
                steps[k].text.replace_range(calc.at + r.start..calc.at + r.end, &wrong);
            }
            propagate(&mut steps, k + 1, &w.answer, &wrong);
        }
        None => {
            if let Some(last) = steps.len().checked_sub(1) {
                propagate(&mut steps, last, &w.answer, &wrong);
            }
        }
    }
    Worked { steps, answer: wrong }
}

// ---------------------------------------------------------------------------------------------
// Responders.

/// Verification lines a solver writes when it keeps going: re-checks of its own steps (as
/// written, so a wrong solution re-checks its own mistake) and re-readings of the question.
fn verification_lines(w: &Worked, question: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for s in &w.steps {
        lines.push(format!("\nLet me double-check this step: {}", s.text));
    }
    for q in split_sentences(question) {
        lines.push(format!("\nRe-reading the problem: \"{q}\" This is used above."));
    }
    lines.push(format!("\nEverything is consistent, so the final answer is {}.", w.answer));
    lines
}

fn render_steps(w: &Worked) -> String {
    let mut s = String::from("Let's solve this step by step.");
    for step in &w.steps {
        s.push('\n');
        s.push_str(&step.text);
    }
    s
}

fn reference(req: &ResponderRequest) -> Result<Worked, ResponderError> {
    let answer = req.str_field("answer")?;
    parse_reference(answer).ok_or_else(|| req.bad_field("answer", "holds no final answer (no `####` line and no number)".into()))
}

/// `gsm8k.solve`: a worked solution ending in `#### <answer>`, correct with the model's GSM8K
/// accuracy. Needs `input.question` and `input.answer` (the reference solution). The output
/// value is `{answer, intended_answer, intended_correct, model}`: `answer` is what the text
/// really ends with (after any cut), `intended_*` what the model set out to write.
pub(crate) fn solve(
    req: &ResponderRequest,
    rng: &mut ChaCha8Rng,
    target: usize,
) -> Result<(String, serde_json::Value), ResponderError> {
    let question = req.str_field("question")?;
    let reference = reference(req)?;
    let p = models::gsm8k_accuracy(req.model).ok_or_else(|| req.unknown_model())?;
    let correct = rng.random_bool(p.clamp(0.0, 1.0));
    let solution = if correct { reference.clone() } else { wrong_solution(&reference, rng) };
    let lines = verification_lines(&solution, question);
    let text = fit(&render_steps(&solution), &format!("\n#### {}", solution.answer), target, &mut |i| {
        lines[i % lines.len()].clone()
    });
    let answer = extract_gsm8k_answer(&text);
    Ok((
        text,
        json!({ "answer": answer, "intended_answer": solution.answer, "intended_correct": correct, "model": req.model }),
    ))
}

/// What the refine step decided, recorded in its output value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RefineRule {
    /// The vote had a strict majority: the refiner keeps it.
    KeptMajority,
    /// No strict majority: the refiner solved the problem again, correctly.
    Rederived,
    /// No strict majority and the refiner's own attempt failed: it takes the answer of the
    /// strongest solver (highest GSM8K accuracy among the upstream solvers).
    StrongestSolver,
    /// As `StrongestSolver`, but no upstream solver says which model it ran: it keeps the
    /// vote's plurality answer.
    KeptPlurality,
    /// No answer to vote on at all: the refiner's own attempt decides.
    Solved,
}

impl RefineRule {
    fn as_str(self) -> &'static str {
        match self {
            RefineRule::KeptMajority => "kept_majority",
            RefineRule::Rederived => "rederived",
            RefineRule::StrongestSolver => "strongest_solver",
            RefineRule::KeptPlurality => "kept_plurality",
            RefineRule::Solved => "solved",
        }
    }
}

/// The vote the refiner reads: from an upstream output whose value has `votes` (the
/// `majority_vote` tool's `{answer, votes}`), else counted from the upstream texts' answers.
/// Returns (winner, votes, strict majority?).
fn read_vote(req: &ResponderRequest) -> (Option<String>, BTreeMap<String, u64>, bool) {
    for (_, out) in req.upstream {
        let Some(votes_obj) = out.value.get("votes").and_then(|v| v.as_object()) else { continue };
        let mut votes = BTreeMap::new();
        for (k, v) in votes_obj {
            if let (Some(a), Some(n)) = (normalize_answer(k), v.as_u64()) {
                *votes.entry(a).or_insert(0) += n;
            }
        }
        let winner = match out.value.get("answer") {
            Some(serde_json::Value::String(s)) => normalize_answer(s),
            Some(serde_json::Value::Number(n)) => normalize_answer(&n.to_string()),
            _ => None,
        }
        .or_else(|| plurality(&votes));
        let total: u64 = votes.values().sum();
        let top = winner.as_ref().and_then(|w| votes.get(w)).copied().unwrap_or(0);
        let majority = match out.verdict.as_deref() {
            Some("majority") => true,
            Some(_) => false,
            None => 2 * top > total,
        };
        let majority = majority && winner.is_some();
        return (winner, votes, majority);
    }
    let mut votes = BTreeMap::new();
    let mut first_seen: Vec<String> = Vec::new();
    for (_, out) in req.upstream {
        if let Some(a) = extract_gsm8k_answer(&out.text) {
            if !first_seen.contains(&a) {
                first_seen.push(a.clone());
            }
            *votes.entry(a).or_insert(0u64) += 1;
        }
    }
    let best = votes.values().copied().max().unwrap_or(0);
    let winner = first_seen.into_iter().find(|a| votes.get(a) == Some(&best));
    let total: u64 = votes.values().sum();
    (winner, votes.clone(), best > 0 && 2 * best > total)
}

/// Most-voted answer, ties broken by the smallest answer string (order of a BTreeMap).
fn plurality(votes: &BTreeMap<String, u64>) -> Option<String> {
    let best = votes.values().copied().max()?;
    votes.iter().find(|(_, n)| **n == best).map(|(a, _)| a.clone())
}

/// The final answer of the upstream solver with the highest GSM8K accuracy: solver outputs
/// carry their model in `value.model` (see [`solve`]); ties go to the earlier upstream output.
fn strongest_solver_answer(req: &ResponderRequest) -> Option<String> {
    let mut best: Option<(f64, String)> = None;
    for (_, out) in req.upstream {
        let Some(model) = out.value.get("model").and_then(|m| m.as_str()) else { continue };
        let (Some(p), Some(answer)) = (models::gsm8k_accuracy(model), extract_gsm8k_answer(&out.text)) else { continue };
        if best.as_ref().is_none_or(|(b, _)| p > *b) {
            best = Some((p, answer));
        }
    }
    best.map(|(_, a)| a)
}

/// `gsm8k.refine`: the final solution after the vote, ending in `#### <answer>`.
///
/// Rule: when the vote has a strict majority the refiner keeps the majority answer (without
/// external feedback, self-correction rarely overturns agreement — Huang et al., *Large
/// Language Models Cannot Self-Correct Reasoning Yet*, ICLR 2024). When the solvers disagree
/// (a tie or a mere plurality), the refiner solves the problem again and gets it right with its
/// own model's GSM8K accuracy; otherwise it takes the answer of the strongest solver — the
/// upstream `gsm8k.solve` output whose `value.model` has the highest GSM8K accuracy — or, when
/// no upstream output names its model, the vote's plurality answer. With no answer to vote on,
/// its own attempt decides.
/// Needs `input.question` and `input.answer`.
pub(crate) fn refine(
    req: &ResponderRequest,
    rng: &mut ChaCha8Rng,
    target: usize,
) -> Result<(String, serde_json::Value), ResponderError> {
    let question = req.str_field("question")?;
    let reference = reference(req)?;
    let p = models::gsm8k_accuracy(req.model).ok_or_else(|| req.unknown_model())?;
    let own_attempt_correct = rng.random_bool(p.clamp(0.0, 1.0));
    let (winner, votes, majority) = read_vote(req);
    let strongest = strongest_solver_answer(req);
    let (rule, final_answer) = match (&winner, majority) {
        (Some(w), true) => (RefineRule::KeptMajority, w.clone()),
        (Some(_), false) if own_attempt_correct => (RefineRule::Rederived, reference.answer.clone()),
        (Some(w), false) => match strongest {
            Some(a) => (RefineRule::StrongestSolver, a),
            None => (RefineRule::KeptPlurality, w.clone()),
        },
        (None, _) if own_attempt_correct => (RefineRule::Solved, reference.answer.clone()),
        (None, _) => (RefineRule::Solved, wrong_solution(&reference, rng).answer),
    };
    let mut head = String::new();
    if votes.is_empty() {
        head.push_str("No solver produced an answer, so I solve the problem myself.");
    } else {
        let tally: Vec<String> = votes.iter().map(|(a, n)| format!("{a} ({n} vote{})", if *n == 1 { "" } else { "s" })).collect();
        head.push_str(&format!("The solvers' answers: {}.", tally.join(", ")));
    }
    let solution = if final_answer == reference.answer {
        reference.clone()
    } else {
        wrong_with_answer(&reference, &final_answer, rng)
    };
    match rule {
        RefineRule::KeptMajority => head.push_str(&format!("\nA majority agrees on {final_answer}; checking its derivation.")),
        RefineRule::Rederived => head.push_str("\nThe solvers disagree, so I work through the problem again."),
        RefineRule::StrongestSolver => {
            head.push_str(&format!("\nThe solvers disagree; the most reliable solver's answer is {final_answer}."))
        }
        RefineRule::KeptPlurality => {
            head.push_str(&format!("\nThe solvers disagree; the best-supported answer is {final_answer}."))
        }
        RefineRule::Solved => {}
    }
    head.push('\n');
    head.push_str(&render_steps(&solution));
    let lines = verification_lines(&solution, question);
    let text = fit(&head, &format!("\n#### {final_answer}"), target, &mut |i| lines[i % lines.len()].clone());
    let answer = extract_gsm8k_answer(&text);
    Ok((text, json!({ "answer": answer, "intended_answer": final_answer, "rule": rule.as_str() })))
}

/// A wrong solution whose answer is `answer`: a perturbed solution with its final number
/// replaced, so the written steps end where the refiner's chosen answer does.
fn wrong_with_answer(reference: &Worked, answer: &str, rng: &mut ChaCha8Rng) -> Worked {
    let mut w = wrong_solution(reference, rng);
    let old = w.answer.clone();
    if let Some(last) = w.steps.len().checked_sub(1) {
        propagate(&mut w.steps, last, &old, answer);
    }
    w.answer = answer.to_string();
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    const JANET: &str = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day at the farmer’s market.\n#### 18";
    const HOUSE: &str = "The cost of the house and repairs came out to 80,000+50,000=$<<80000+50000=130000>>130,000\nHe increased the value of the house by 80,000*1.5=<<80000*1.5=120000>>120,000\nSo the new value of the house is 120,000+80,000=$<<120000+80000=200000>>200,000\nSo he made a profit of 200,000-130,000=$<<200000-130000=70000>>70,000\n#### 70000";

    #[test]
    fn extraction_edge_cases() {
        assert_eq!(extract_gsm8k_answer("so 5 + 5\n#### 10").as_deref(), Some("10"));
        assert_eq!(extract_gsm8k_answer("#### 1,234.00 dollars").as_deref(), Some("1234"));
        assert_eq!(extract_gsm8k_answer("#### $18.").as_deref(), Some("18"));
        assert_eq!(extract_gsm8k_answer("#### -7").as_deref(), Some("-7"));
        assert_eq!(extract_gsm8k_answer("#### 2.50").as_deref(), Some("2.5"));
        // The last `####` wins.
        assert_eq!(extract_gsm8k_answer("#### 3\nno wait\n#### 4").as_deref(), Some("4"));
        // No number after `####` (cut off): the last number in the text.
        assert_eq!(extract_gsm8k_answer("She makes 9 * 2 = 18 dollars.\n#### ").as_deref(), Some("18"));
        assert_eq!(extract_gsm8k_answer("The answer is 42.").as_deref(), Some("42"));
        assert_eq!(extract_gsm8k_answer("no numbers here"), None);
        assert_eq!(extract_gsm8k_answer(""), None);
        assert_eq!(normalize_answer("18.0").as_deref(), Some("18"));
        assert_eq!(normalize_answer(" $5 ").as_deref(), Some("5"));
    }

    #[test]
    fn reference_parsing_strips_annotations() {
        let w = parse_reference(JANET).unwrap_or_else(|| panic!("parse"));
        assert_eq!(w.answer, "18");
        assert_eq!(w.steps.len(), 2);
        assert_eq!(w.steps[0].text, "Janet sells 16 - 3 - 4 = 9 duck eggs a day.");
        assert_eq!(w.steps[1].text, "She makes 9 * 2 = $18 every day at the farmer’s market.");
        let c = w.steps[1].calc.clone().unwrap_or_else(|| panic!("calc"));
        assert_eq!((c.expr.as_str(), c.result.as_str()), ("9*2", "18"));
        assert_eq!(&w.steps[1].text[c.at..c.at + 2], "18");
    }

    #[test]
    fn arithmetic_follows_precedence() {
        let e = |s: &str| lex(s).and_then(|t| eval(&t));
        assert_eq!(e("16-3-4"), Some(9.0));
        assert_eq!(e("2+3*4"), Some(14.0));
        assert_eq!(e("(2+3)*4"), Some(20.0));
        assert_eq!(e("-5+2"), Some(-3.0));
        assert_eq!(e("80000*1.5"), Some(120000.0));
        assert_eq!(e("1/0"), None);
        assert_eq!(e("2^3"), None);
        assert_eq!(e("(2+3"), None);
    }

    #[test]
    fn wrong_operation_rewrites_the_visible_step() {
        let w = parse_reference(JANET).unwrap_or_else(|| panic!("parse"));
        for seed in 0..40 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            if let Some(x) = wrong_operation(&w, &mut rng) {
                assert!(x.answer == "11" || x.answer == "4.5", "{}", x.answer);
                let last = &x.steps[1].text;
                assert!(
                    last == "She makes 9 + 2 = $11 every day at the farmer’s market."
                        || last == "She makes 9 / 2 = $4.5 every day at the farmer’s market.",
                    "{last}"
                );
            }
        }
    }

    #[test]
    fn dropped_step_answers_the_previous_result() {
        let w = parse_reference(HOUSE).unwrap_or_else(|| panic!("parse"));
        let x = dropped_step(&w).unwrap_or_else(|| panic!("dropped"));
        assert_eq!(x.answer, "200000");
        assert_eq!(x.steps.len(), 3);
    }

    #[test]
    fn wrong_solutions_always_differ_and_are_deterministic() {
        for reference in [JANET, HOUSE, "It takes 2/2=<<2/2=1>>1 bolt\n#### 1", "Just 7.\n#### 7"] {
            let w = parse_reference(reference).unwrap_or_else(|| panic!("parse"));
            for seed in 0..200 {
                let a = wrong_solution(&w, &mut ChaCha8Rng::seed_from_u64(seed));
                let b = wrong_solution(&w, &mut ChaCha8Rng::seed_from_u64(seed));
                assert_eq!(a, b);
                assert_ne!(a.answer, w.answer, "seed {seed}");
                assert!(normalize_number(&a.answer).is_some(), "{}", a.answer);
            }
        }
    }

    #[test]
    fn the_arithmetic_slip_changes_the_written_result() {
        let w = parse_reference(JANET).unwrap_or_else(|| panic!("parse"));
        let x = arithmetic_slip(&w, &mut ChaCha8Rng::seed_from_u64(3));
        assert_ne!(x.answer, "18");
        assert!(x.steps[1].text.contains(&format!("${}", x.answer)), "{}", x.steps[1].text);
    }
}
