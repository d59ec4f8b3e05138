//! Small text utilities shared by the responders: number spans and their normalised form,
//! word tokens, sentence splitting and a stop-word list.
//!
//! Depends on nothing else in the crate.

use std::collections::{BTreeSet, HashSet};
use std::sync::OnceLock;

/// A number written in text: its byte span and its normalised value (see [`normalize_number`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NumberSpan {
    pub start: usize,
    pub end: usize,
    pub normalized: String,
}

/// Normalise a written number: drop `$`, `,` and surrounding blanks, drop a trailing `.`,
/// drop trailing zeros after a decimal point (`18.00` → `18`, `2.50` → `2.5`), drop a leading
/// `+` and leading zeros (`007` → `7`), and write `-0` as `0`. Returns `None` when what is left
/// is not a decimal number.
pub(crate) fn normalize_number(raw: &str) -> Option<String> {
    let mut s: String = raw.trim().chars().filter(|c| *c != ',' && *c != '$' && !c.is_whitespace()).collect();
    while s.ends_with('.') {
        s.pop();
    }
    let (neg, body) = match s.strip_prefix('-') {
        Some(rest) => (true, rest.to_string()),
        None => (false, s.strip_prefix('+').unwrap_or(&s).to_string()),
    };
    if body.is_empty() || !body.chars().all(|c| c.is_ascii_digit() || c == '.') || body.matches('.').count() > 1 {
        return None;
    }
    let (int, frac) = match body.split_once('.') {
        Some((i, f)) => (i, f.trim_end_matches('0')),
        None => (body.as_str(), ""),
    };
    let int = int.trim_start_matches('0');
    let int = if int.is_empty() { "0" } else { int };
    if int == "0" && frac.is_empty() && !body.chars().any(|c| c.is_ascii_digit()) {
        return None;
    }
    let mut out = String::new();
    if neg && !(int == "0" && frac.is_empty()) {
        out.push('-');
    }
    out.push_str(int);
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    Some(out)
}

/// All numbers in `text`, in order. A number is an optional `-` (not preceded by a letter or
/// digit), digits with optional thousands commas (`1,234`), and an optional decimal part; a
/// leading `.5` counts. A `$` before the number is allowed and left out of the span.
pub(crate) fn number_spans(text: &str) -> Vec<NumberSpan> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts_digit = b[i].is_ascii_digit() || (b[i] == b'.' && i + 1 < b.len() && b[i + 1].is_ascii_digit());
        let glued = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if !starts_digit || glued {
            i += 1;
            continue;
        }
        let mut start = i;
        if start > 0 && b[start - 1] == b'-' {
            let before_minus = if start >= 2 { Some(b[start - 2]) } else { None };
            if before_minus.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == b')')) {
                start -= 1;
            }
        }
        let mut j = i;
        let mut seen_dot = false;
        while j < b.len() {
            let c = b[j];
            let thousands_comma = c == b',' && j > i && !seen_dot && followed_by_three_digits(b, j);
            if c.is_ascii_digit() || thousands_comma {
                j += 1;
            } else if c == b'.' && !seen_dot && j + 1 < b.len() && b[j + 1].is_ascii_digit() {
                seen_dot = true;
                j += 1;
            } else {
                break;
            }
        }
        if let Some(normalized) = normalize_number(&text[start..j]) {
            out.push(NumberSpan { start, end: j, normalized });
        }
        i = j.max(i + 1);
    }
    out
}

fn followed_by_three_digits(b: &[u8], comma: usize) -> bool {
    let digits = b[comma + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
    digits == 3
}

/// Format a computed value the way a solution writes it: integers without a decimal point,
/// others rounded to two decimals without trailing zeros.
pub(crate) fn format_value(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        let r = v.round();
        if r == 0.0 {
            return "0".to_string();
        }
        return format!("{r:.0}");
    }
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".to_string() } else { s.to_string() }
}

/// Lower-cased alphanumeric word tokens of `text` (Unicode letters and digits; everything
/// else separates words).
pub(crate) fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// English function words ignored when ranking sentences against a query. A short list in
/// the spirit of the SMART / NLTK stop lists (with contraction fragments such as `s`, `t`,
/// `ll`), plus spoken-meeting fillers (`um`, `yeah`, `think`, `going`) and the words of
/// generic summarization queries (`summarize`, `whole`, `meeting`).
const STOP_WORDS: &[&str] = &[
    "a", "about", "actually", "all", "also", "an", "and", "any", "are", "as", "at", "be", "because", "been",
    "before", "but", "by", "can", "could", "did", "do", "does", "don", "for", "from", "get", "go", "going",
    "got", "had", "has", "have", "he", "her", "here", "his", "how", "i", "if", "in", "into", "is", "it",
    "its", "just", "kind", "know", "like", "ll", "lot", "me", "mean", "meeting", "more", "much", "my",
    "need", "no", "not", "now", "of", "oh", "okay", "on", "one", "or", "our", "re", "really", "right", "s",
    "said", "say", "see", "she", "should", "so", "some", "sort", "t", "than", "that", "the", "their",
    "them", "then", "there", "these", "they", "thing", "things", "think", "this", "to", "um", "uh", "up",
    "us", "ve", "very", "want", "was", "way", "we", "well", "were", "what", "when", "which", "who", "why",
    "will", "with", "would", "yeah", "yes", "you", "your", "summarize", "discuss", "discussed",
    "discussion", "whole",
];

/// Content words of `text`: lower-cased words that are not stop words.
pub(crate) fn content_words(text: &str) -> BTreeSet<String> {
    static STOP: OnceLock<HashSet<&'static str>> = OnceLock::new();
    let stop = STOP.get_or_init(|| STOP_WORDS.iter().copied().collect());
    let mut out = BTreeSet::new();
    for w in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        let w = w.to_lowercase();
        if !stop.contains(w.as_str()) {
            out.insert(w);
        }
    }
    out
}

/// Split `text` into sentences: at `.`, `?`, `!` or `…` followed by whitespace, and at line
/// breaks.
/// Sentences are trimmed; empty ones are dropped.
pub(crate) fn split_sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut start = 0;
        let chars: Vec<(usize, char)> = line.char_indices().collect();
        for (k, &(i, c)) in chars.iter().enumerate() {
            if matches!(c, '.' | '?' | '!' | '…') {
                let next_is_space = chars.get(k + 1).is_none_or(|&(_, n)| n.is_whitespace());
                if next_is_space {
                    let end = i + c.len_utf8();
                    push_trimmed(&mut out, &line[start..end]);
                    start = end;
                }
            }
        }
        push_trimmed(&mut out, &line[start..]);
    }
    out
}

fn push_trimmed(out: &mut Vec<String>, s: &str) {
    let t = s.trim();
    if !t.is_empty() {
        out.push(t.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_normalised() {
        assert_eq!(normalize_number("$1,234.50").as_deref(), Some("1234.5"));
        assert_eq!(normalize_number("18.0").as_deref(), Some("18"));
        assert_eq!(normalize_number("18.").as_deref(), Some("18"));
        assert_eq!(normalize_number("-0.00").as_deref(), Some("0"));
        assert_eq!(normalize_number("007").as_deref(), Some("7"));
        assert_eq!(normalize_number(".5").as_deref(), Some("0.5"));
        assert_eq!(normalize_number("-3").as_deref(), Some("-3"));
        assert_eq!(normalize_number("abc"), None);
        assert_eq!(normalize_number("$"), None);
        assert_eq!(normalize_number("1.2.3"), None);
    }

    #[test]
    fn number_spans_find_money_commas_and_signs() {
        let t = "He paid $80,000 and got -5 back, then 2.5 more in year 2021. x3 is not.";
        let n: Vec<String> = number_spans(t).into_iter().map(|s| s.normalized).collect();
        assert_eq!(n, vec!["80000", "-5", "2.5", "2021"]);
        let spans = number_spans("16-3-4=9");
        let n: Vec<&str> = spans.iter().map(|s| s.normalized.as_str()).collect();
        assert_eq!(n, vec!["16", "3", "4", "9"]);
        // A list "1,2,3" is three numbers, not one thousand-separated number.
        let n: Vec<String> = number_spans("1,2,3").into_iter().map(|s| s.normalized).collect();
        assert_eq!(n, vec!["1", "2", "3"]);
    }

    #[test]
    fn values_format_like_a_solution() {
        assert_eq!(format_value(18.0), "18");
        assert_eq!(format_value(2.5), "2.5");
        assert_eq!(format_value(1.0 / 3.0), "0.33");
        assert_eq!(format_value(-4.0), "-4");
        assert_eq!(format_value(-0.0001), "0");
    }

    #[test]
    fn sentences_split_at_terminal_punctuation_and_lines() {
        let s = split_sentences("Hello there. It costs 2.5 dollars! Really?\nNext line");
        assert_eq!(s, vec!["Hello there.", "It costs 2.5 dollars!", "Really?", "Next line"]);
    }
}
