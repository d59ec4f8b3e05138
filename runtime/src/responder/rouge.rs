//! ROUGE-L (Lin, *ROUGE: A Package for Automatic Evaluation of Summaries*, ACL Workshop 2004,
//! §3.1): precision, recall and F-measure from the longest common subsequence of word tokens.
//!
//! Tokens are lower-cased alphanumeric words (every other character separates words), with no
//! stemming and no stop-word removal; F uses β = 1, as the QMSum paper reports ROUGE-L F1
//! (Zhong et al., NAACL 2021). The official `ROUGE-1.5.5` script used there applies Porter
//! stemming when run with `-m`; scores here can therefore be slightly lower than published ones.
//!
//! Depends on nothing else in the crate but the responders' word splitter (`super::text`).

use super::text::words;

/// Precision, recall and F1 of ROUGE-L.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RougeScore {
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
}

/// The word tokens ROUGE-L compares: lower-cased runs of letters and digits.
pub fn rouge_tokens(text: &str) -> Vec<String> {
    words(text)
}

/// Length of the longest common subsequence of two token sequences (two-row dynamic
/// programme, O(|a|·|b|) time, O(|b|) memory).
fn lcs_len(a: &[String], b: &[String]) -> usize {
    let mut prev = vec![0usize; b.len() + 1];
    let mut cur = vec![0usize; b.len() + 1];
    for x in a {
        for (j, y) in b.iter().enumerate() {
            cur[j + 1] = if x == y { prev[j] + 1 } else { cur[j].max(prev[j + 1]) };
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// ROUGE-L of `candidate` against `reference`; all zero when either has no word.
pub fn rouge_l(candidate: &str, reference: &str) -> RougeScore {
    let c = rouge_tokens(candidate);
    let r = rouge_tokens(reference);
    if c.is_empty() || r.is_empty() {
        return RougeScore { precision: 0.0, recall: 0.0, f1: 0.0 };
    }
    let lcs = lcs_len(&c, &r) as f64;
    let precision = lcs / c.len() as f64;
    let recall = lcs / r.len() as f64;
    let f1 = if lcs == 0.0 { 0.0 } else { 2.0 * precision * recall / (precision + recall) };
    RougeScore { precision, recall, f1 }
}

/// ROUGE-L F1 (β = 1) of `candidate` against `reference`, in [0, 1].
pub fn rouge_l_f1(candidate: &str, reference: &str) -> f64 {
    rouge_l(candidate, reference).f1
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn lin_2004_example() {
        // Lin (2004) §3.1: S1 "police killed the gunman" vs S2 "police kill the gunman":
        // LCS = "police the gunman" = 3; R = P = 3/4.
        let s = rouge_l("police kill the gunman", "police killed the gunman");
        assert!(close(s.precision, 0.75) && close(s.recall, 0.75) && close(s.f1, 0.75));
        // S3 "the gunman kill police": LCS = "the gunman" = 2 → 0.5.
        assert!(close(rouge_l_f1("the gunman kill police", "police killed the gunman"), 0.5));
    }

    #[test]
    fn hand_computed_unequal_lengths() {
        // candidate 6 words, reference 4 words, LCS "the cat sat mat" = 4 → P 4/6, R 1, F 0.8.
        let s = rouge_l("The cat, sat on the mat!", "the cat sat mat");
        assert!(close(s.precision, 4.0 / 6.0));
        assert!(close(s.recall, 1.0));
        assert!(close(s.f1, 0.8));
        assert_eq!(rouge_l_f1("", "x"), 0.0);
        assert_eq!(rouge_l_f1("a b", "c d"), 0.0);
        assert!(close(rouge_l_f1("Same TEXT here.", "same text here"), 1.0));
    }

    proptest! {
        #[test]
        fn f1_is_bounded_and_symmetric(a in "[a-d ]{0,40}", b in "[a-d ]{0,40}") {
            let x = rouge_l_f1(&a, &b);
            let y = rouge_l_f1(&b, &a);
            prop_assert!((0.0..=1.0).contains(&x));
            prop_assert!((x - y).abs() < 1e-12);
            if !rouge_tokens(&a).is_empty() {
                prop_assert!((rouge_l_f1(&a, &a) - 1.0).abs() < 1e-12);
            }
        }
    }
}
