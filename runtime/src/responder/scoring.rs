//! Per-session accuracy metrics used for the per-workflow `accuracy` in reports.
//!
//! Depends on `super::{gsm8k, rouge}` and the crate's `values`.

use super::gsm8k::{extract_gsm8k_answer, normalize_answer};
use crate::values::NodeOutput;

/// GSM8K exact match: 1.0 when the output's final answer ([`extract_gsm8k_answer`]) equals the
/// reference's, else 0.0. The reference may be a full dataset solution (ending in `#### 18`) or
/// a bare answer (`18`, `$18.00`). Answers are compared as normalised strings, and as numbers
/// when both parse (so `0.50` and `.5` match).
pub fn gsm8k_exact(output: &NodeOutput, reference_answer: &str) -> f64 {
    let (Some(got), Some(want)) = (extract_gsm8k_answer(&output.text), normalize_answer(reference_answer)) else {
        return 0.0;
    };
    let same_number = match (got.parse::<f64>(), want.parse::<f64>()) {
        (Ok(a), Ok(b)) => (a - b).abs() <= 1e-9 * b.abs().max(1.0),
        _ => false,
    };
    if got == want || same_number { 1.0 } else { 0.0 }
}

/// MBPP: 1.0 when the (final validation) test tool's verdict is `pass`, else 0.0.
pub fn tests_pass(output: &NodeOutput) -> f64 {
    if output.verdict.as_deref() == Some("pass") { 1.0 } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(text: &str, verdict: Option<&str>) -> NodeOutput {
        NodeOutput { text: text.into(), verdict: verdict.map(String::from), ..NodeOutput::default() }
    }

    #[test]
    fn exact_match_against_full_or_bare_references() {
        let full = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 18";
        assert_eq!(gsm8k_exact(&out("so\n#### 18", None), full), 1.0);
        assert_eq!(gsm8k_exact(&out("so\n#### $18.00", None), "18"), 1.0);
        assert_eq!(gsm8k_exact(&out("#### 1,000", None), "1000"), 1.0);
        assert_eq!(gsm8k_exact(&out("#### 0.50", None), ".5"), 1.0);
        assert_eq!(gsm8k_exact(&out("#### 17", None), full), 0.0);
        assert_eq!(gsm8k_exact(&out("no answer", None), full), 0.0);
        assert_eq!(gsm8k_exact(&out("#### 18", None), "no number"), 0.0);
    }

    #[test]
    fn tests_pass_reads_the_verdict() {
        assert_eq!(tests_pass(&out("3/3 tests passed", Some("pass"))), 1.0);
        assert_eq!(tests_pass(&out("1/3 tests passed", Some("fail"))), 0.0);
        assert_eq!(tests_pass(&out("pass", None)), 0.0);
    }
}
