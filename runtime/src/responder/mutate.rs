//! Behaviour-changing mutations of Python source, for emulated wrong MBPP programs.
//!
//! A small Python lexer (names, numbers, string literals with prefixes and triple quotes,
//! comments, operators, brackets) finds mutation sites outside strings and comments. The
//! operators are the classic mutation-testing ones (Offutt et al., *An Experimental
//! Determination of Sufficient Mutant Operators*, TOSEM 1996: relational, arithmetic and
//! logical operator replacement, constant replacement, statement deletion) plus the
//! off-by-one errors typical of generated code (range bounds, indices). Whether a mutant really
//! fails its tests is decided later by the real test tool; the operators are weighted so that
//! it almost always does (see [`OPERATOR_WEIGHTS`]; measured by
//! `runtime/tests/responder_mbpp_python.rs`).
//!
//! Depends on nothing else in the crate.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Name,
    Number,
    Str,
    Op,
    Comment,
    Newline,
    Space,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tok {
    kind: Kind,
    start: usize,
    end: usize,
}

const OPERATORS: &[&str] = &[
    "**=", "//=", ">>=", "<<=", "...", "->", ":=", "**", "//", "<<", ">>", "<=", ">=", "==", "!=", "+=", "-=", "*=",
    "/=", "%=", "&=", "|=", "^=", "@=",
];

fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Tokenize Python source. Never fails: an unterminated string runs to the end.
fn lex(src: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < src.len() {
        let rest = &src[i..];
        let Some(c) = rest.chars().next() else { break };
        let (kind, len) = if c == '\n' {
            (Kind::Newline, 1)
        } else if c.is_whitespace() {
            (Kind::Space, c.len_utf8())
        } else if c == '#' {
            (Kind::Comment, rest.find('\n').unwrap_or(rest.len()))
        } else if c == '\'' || c == '"' {
            (Kind::Str, string_len(rest, 0))
        } else if c.is_ascii_digit() || (c == '.' && rest[1..].starts_with(|d: char| d.is_ascii_digit())) {
            let bytes = rest.as_bytes();
            let mut j = 0;
            while j < bytes.len() {
                let b = bytes[j];
                let exp_sign = (b == b'+' || b == b'-') && j > 0 && matches!(bytes[j - 1], b'e' | b'E') && !rest.starts_with("0x");
                if b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || exp_sign {
                    j += 1;
                } else {
                    break;
                }
            }
            (Kind::Number, j)
        } else if is_name_char(c) {
            let len: usize = rest.chars().take_while(|c| is_name_char(*c)).map(char::len_utf8).sum();
            let after = &rest[len..];
            let is_prefix = len <= 2 && rest[..len].chars().all(|p| "rRbBuUfF".contains(p));
            if is_prefix && (after.starts_with('\'') || after.starts_with('"')) {
                (Kind::Str, string_len(rest, len))
            } else {
                (Kind::Name, len)
            }
        } else if let Some(op) = OPERATORS.iter().find(|op| rest.starts_with(**op)) {
            (Kind::Op, op.len())
        } else {
            (Kind::Op, c.len_utf8())
        };
        out.push(Tok { kind, start: i, end: i + len });
        i += len.max(1);
    }
    out
}

/// Length of the string literal starting at `rest` whose quote is at byte `q`.
fn string_len(rest: &str, q: usize) -> usize {
    let body = &rest[q..];
    let quote = if body.starts_with("'''") {
        "'''"
    } else if body.starts_with("\"\"\"") {
        "\"\"\""
    } else if body.starts_with('\'') {
        "'"
    } else {
        "\""
    };
    let bytes = body.as_bytes();
    let mut j = quote.len();
    while j < bytes.len() {
        if bytes[j] == b'\\' {
            j += 2;
            continue;
        }
        if body[j..].starts_with(quote) {
            return q + j + quote.len();
        }
        if quote.len() == 1 && bytes[j] == b'\n' {
            return q + j;
        }
        j += 1;
    }
    rest.len()
}

/// A mutation: replace `start..end` of the source by `with`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Edit {
    pub operator: &'static str,
    pub start: usize,
    pub end: usize,
    pub with: String,
}

impl Edit {
    pub fn apply(&self, src: &str) -> String {
        let mut s = String::with_capacity(src.len() + self.with.len());
        s.push_str(&src[..self.start]);
        s.push_str(&self.with);
        s.push_str(&src[self.end..]);
        s
    }
}

/// Significant tokens (no spaces, comments or newlines), with their index into `toks`.
fn significant(toks: &[Tok]) -> Vec<Tok> {
    toks.iter().copied().filter(|t| !matches!(t.kind, Kind::Space | Kind::Comment | Kind::Newline)).collect()
}

/// All candidate mutations of `src`, grouped by operator name.
pub(crate) fn candidates(src: &str) -> Vec<Vec<Edit>> {
    let toks = lex(src);
    let sig = significant(&toks);
    let text = |t: &Tok| &src[t.start..t.end];
    let mut relational = Vec::new();
    let mut arithmetic = Vec::new();
    let mut logical = Vec::new();
    let mut constant = Vec::new();
    let mut index = Vec::new();
    let mut range = Vec::new();
    for (k, t) in sig.iter().enumerate() {
        let s = text(t);
        let prev = k.checked_sub(1).map(|p| sig[p]);
        let operand_before = prev.is_some_and(|p| {
            matches!(p.kind, Kind::Name | Kind::Number | Kind::Str) && !is_keyword(text(&p))
                || matches!(text(&p), ")" | "]" | "}")
        });
        match (t.kind, s) {
            (Kind::Op, "<" | ">" | "<=" | ">=" | "==" | "!=") => {
                let flipped = match s {
                    "<" => ">=",
                    ">" => "<=",
                    "<=" => ">",
                    ">=" => "<",
                    "==" => "!=",
                    _ => "==",
                };
                relational.push(Edit { operator: "relational", start: t.start, end: t.end, with: flipped.into() });
            }
            (Kind::Op, "+" | "-" | "+=" | "-=") if operand_before || s.ends_with('=') => {
                let swapped = match s {
                    "+" => "-",
                    "-" => "+",
                    "+=" => "-=",
                    _ => "+=",
                };
                arithmetic.push(Edit { operator: "arithmetic", start: t.start, end: t.end, with: swapped.into() });
            }
            (Kind::Op, "*" | "//") if operand_before => {
                let swapped = if s == "*" { "+" } else { "*" };
                arithmetic.push(Edit { operator: "arithmetic", start: t.start, end: t.end, with: swapped.into() });
            }
            (Kind::Name, "and" | "or" | "True" | "False") => {
                let swapped = match s {
                    "and" => "or",
                    "or" => "and",
                    "True" => "False",
                    _ => "True",
                };
                logical.push(Edit { operator: "logical", start: t.start, end: t.end, with: swapped.into() });
            }
            (Kind::Number, _) => {
                if let Ok(n) = s.parse::<i64>() {
                    constant.push(Edit { operator: "constant", start: t.start, end: t.end, with: (n + 1).to_string() });
                }
            }
            (Kind::Op, "[") if operand_before => {
                // A subscript `x[i]` with a single name or integer inside: `x[i + 1]`.
                if let (Some(inner), Some(close)) = (sig.get(k + 1), sig.get(k + 2))
                    && text(close) == "]"
                    && (inner.kind == Kind::Name && !is_keyword(text(inner)) || inner.kind == Kind::Number)
                {
                    index.push(Edit {
                        operator: "index",
                        start: inner.start,
                        end: inner.end,
                        with: format!("{} + 1", text(inner)),
                    });
                }
            }
            (Kind::Name, "range") => {
                if let Some(e) = range_stop_edit(src, &sig, k) {
                    range.push(e);
                }
            }
            _ => {}
        }
    }
    let statement = statement_deletions(src, &toks);
    let groups: Vec<Vec<Edit>> =
        [relational, arithmetic, logical, constant, index, range, statement].into_iter().filter(|g| !g.is_empty()).collect();
    if groups.is_empty() { wrong_return_constant(src, &sig).into_iter().map(|e| vec![e]).collect() } else { groups }
}

/// Last resort for a body with no other site (`return min(xs)`): return a wrong constant,
/// `return None`, from the first one-line `return` with a value.
fn wrong_return_constant(src: &str, sig: &[Tok]) -> Option<Edit> {
    sig.iter().filter(|t| t.kind == Kind::Name && &src[t.start..t.end] == "return").find_map(|t| {
        let line_end = src[t.end..].find('\n').map_or(src.len(), |i| t.end + i);
        let expr = src[t.end..line_end].trim();
        let simple = !expr.is_empty() && expr != "None" && !expr.contains('#') && !expr.ends_with(['(', '[', '{', ',', '\\']);
        simple.then(|| Edit { operator: "return_constant", start: t.end, end: line_end, with: " None".into() })
    })
}

fn is_keyword(s: &str) -> bool {
    matches!(
        s,
        "and" | "or" | "not" | "in" | "is" | "if" | "else" | "elif" | "for" | "while" | "return" | "lambda" | "yield"
            | "def" | "class" | "import" | "from" | "as" | "with" | "try" | "except" | "finally" | "raise" | "pass"
            | "break" | "continue" | "global" | "nonlocal" | "del" | "assert" | "await" | "async"
    )
}

/// `range(a)` → `range(a - 1)`, `range(a, b[, s])` → `range(a, b - 1[, s])`: the loop misses
/// its last iteration.
fn range_stop_edit(src: &str, sig: &[Tok], k: usize) -> Option<Edit> {
    if sig.get(k + 1).map(|t| &src[t.start..t.end]) != Some("(") {
        return None;
    }
    let mut depth = 0usize;
    let mut arg_ends = Vec::new();
    let mut close = None;
    for t in &sig[k + 1..] {
        match &src[t.start..t.end] {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    close = Some(t.start);
                    arg_ends.push(t.start);
                    break;
                }
            }
            "," if depth == 1 => arg_ends.push(t.start),
            _ => {}
        }
    }
    close?;
    let stop_end = if arg_ends.len() == 1 { arg_ends[0] } else { arg_ends[1] };
    let end = src[..stop_end].trim_end().len();
    Some(Edit { operator: "range", start: end, end, with: " - 1".into() })
}

/// Deletion of one simple statement in a function body, where its block keeps at least one
/// other statement (so the program still parses).
fn statement_deletions(src: &str, toks: &[Tok]) -> Vec<Edit> {
    // Byte ranges of lines that start a logical line and end it (depth 0 at both ends, no
    // backslash continuation, not inside a multi-line string).
    let mut line_ok = Vec::new();
    let mut depth: i64 = 0;
    let mut line_start = 0usize;
    let mut start_depth = 0i64;
    let mut continued = false;
    let mut last_sig: Option<&str> = None;
    let mut spans_lines = false;
    for t in toks {
        let s = &src[t.start..t.end];
        match t.kind {
            Kind::Op if matches!(s, "(" | "[" | "{") => depth += 1,
            Kind::Op if matches!(s, ")" | "]" | "}") => depth -= 1,
            Kind::Str if s.contains('\n') => spans_lines = true,
            _ => {}
        }
        if !matches!(t.kind, Kind::Space | Kind::Comment | Kind::Newline) {
            last_sig = Some(s);
        }
        if t.kind == Kind::Newline {
            let line = &src[line_start..t.start];
            let simple = start_depth == 0
                && depth == 0
                && !continued
                && !spans_lines
                && !line.trim_end().ends_with('\\')
                && last_sig.is_some_and(|l| l != ":");
            line_ok.push((line_start, t.end, simple));
            continued = line.trim_end().ends_with('\\');
            line_start = t.end;
            start_depth = depth;
            last_sig = None;
            spans_lines = false;
        }
    }
    if line_start < src.len() {
        let simple = start_depth == 0 && depth == 0 && !continued && !spans_lines && last_sig.is_some_and(|l| l != ":");
        line_ok.push((line_start, src.len(), simple));
    }
    let indent = |r: &(usize, usize, bool)| {
        let line = &src[r.0..r.1];
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            None
        } else {
            Some(line.len() - line.trim_start().len())
        }
    };
    let mut out = Vec::new();
    for (i, r) in line_ok.iter().enumerate() {
        let Some(ind) = indent(r) else { continue };
        if ind == 0 || !r.2 {
            continue;
        }
        let prev = line_ok[..i].iter().rev().find_map(&indent);
        let next = line_ok[i + 1..].iter().find_map(&indent);
        let first = src[r.0..r.1].trim_start();
        let is_docstring = first.starts_with('"') || first.starts_with('\'');
        if (prev == Some(ind) || next == Some(ind)) && !is_docstring {
            out.push(Edit { operator: "statement", start: r.0, end: r.1, with: String::new() });
        }
    }
    out
}

/// Relative weight of each mutation operator when several apply. The weights follow how often
/// each operator's mutants failed the dataset's own asserts when we ran them (sanitized MBPP,
/// 427 tasks, 12 seeds each, `measure_mutant_kill_rate_on_the_dataset` with uniform choice):
/// relational 0.98, statement deletion 0.97, arithmetic 0.92, logical 0.90, index 0.87,
/// constant 0.79, range bound 0.62, `return None` 1.00 (only where nothing else applies);
/// 0.882 overall. Operators whose mutants more often survive weak test suites are drawn less
/// often: with these weights 2,771 of 2,989 wrong draws (0.927) fail the dataset's asserts.
/// The rest survive MBPP's few asserts, as real wrong programs do (EvalPlus, Liu et al.,
/// NeurIPS 2023), so a model's effective pass rate is its pass@1 plus ~7 % of its misses.
pub(crate) const OPERATOR_WEIGHTS: &[(&str, u32)] = &[
    ("relational", 3),
    ("statement", 3),
    ("arithmetic", 2),
    ("logical", 2),
    ("index", 1),
    ("constant", 1),
    ("range", 1),
    ("return_constant", 1),
];

fn weight(operator: &str) -> u32 {
    OPERATOR_WEIGHTS.iter().find(|(o, _)| *o == operator).map_or(1, |(_, w)| *w)
}

/// A mutant of `src`: an operator group drawn with [`OPERATOR_WEIGHTS`] among those with
/// sites, then a site uniformly. `None` when the source offers no mutation site at all.
pub(crate) fn mutate(src: &str, rng: &mut ChaCha8Rng) -> Option<(String, Edit)> {
    let groups = candidates(src);
    let weights: Vec<u32> = groups.iter().map(|g| g.first().map_or(0, |e| weight(e.operator))).collect();
    let total: u32 = weights.iter().sum();
    if total == 0 {
        return None;
    }
    let mut roll = rng.random_range(0..total);
    let mut chosen = 0;
    for (i, w) in weights.iter().enumerate() {
        if roll < *w {
            chosen = i;
            break;
        }
        roll -= w;
    }
    let g = &groups[chosen];
    let e = g[rng.random_range(0..g.len())].clone();
    Some((e.apply(src), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    const SRC: &str = "def f(xs, n):\n    # add < not\n    s = \"a < b\"\n    total = 0\n    for i in range(1, n):\n        if xs[i] > 0 and True:\n            total += xs[i] * 2\n    return total\n";

    #[test]
    fn lexer_keeps_strings_and_comments_whole() {
        let toks = lex("x = r'a\\'b' + \"\"\"c\nd\"\"\" # e < f\ny");
        let kinds: Vec<Kind> = significant(&toks).iter().map(|t| t.kind).collect();
        assert_eq!(kinds, vec![Kind::Name, Kind::Op, Kind::Str, Kind::Op, Kind::Str, Kind::Name]);
    }

    #[test]
    fn no_mutation_touches_strings_or_comments() {
        for group in candidates(SRC) {
            for e in group {
                let m = e.apply(SRC);
                assert!(m.contains("# add < not"), "{m}");
                // Only a whole-statement deletion may remove the line holding the string.
                assert!(m.contains("s = \"a < b\"") || e.operator == "statement", "{m}");
                assert_ne!(m, SRC);
            }
        }
    }

    #[test]
    fn each_operator_finds_its_sites() {
        let all: Vec<String> = candidates(SRC).into_iter().flatten().map(|e| e.apply(SRC)).collect();
        assert!(all.iter().any(|m| m.contains("xs[i] <= 0")));
        assert!(all.iter().any(|m| m.contains("total -= xs[i]")));
        assert!(all.iter().any(|m| m.contains("xs[i] + 2")));
        assert!(all.iter().any(|m| m.contains(" or True")));
        assert!(all.iter().any(|m| m.contains("and False")));
        assert!(all.iter().any(|m| m.contains("total = 1")));
        assert!(all.iter().any(|m| m.contains("xs[i + 1] > 0")));
        assert!(all.iter().any(|m| m.contains("range(1, n - 1)")));
        // Deleting `total = 0` leaves a valid block; the only statement of a block is kept.
        assert!(all.iter().any(|m| !m.contains("total = 0")));
        assert!(all.iter().all(|m| m.contains("total += xs[i]") || m.contains("total -= xs[i]") || m.contains("total += xs[i + 1]") || m.contains("total += xs[i] + 2") || m.contains("* 3")));
    }

    #[test]
    fn mutation_is_deterministic_in_the_seed() {
        let a = mutate(SRC, &mut ChaCha8Rng::seed_from_u64(9));
        let b = mutate(SRC, &mut ChaCha8Rng::seed_from_u64(9));
        assert_eq!(a, b);
        assert!(mutate("", &mut ChaCha8Rng::seed_from_u64(9)).is_none());
        let (m, e) = mutate("def smallest_num(xs):\n  return min(xs)\n", &mut ChaCha8Rng::seed_from_u64(1))
            .unwrap_or_else(|| panic!("no site"));
        assert_eq!(e.operator, "return_constant");
        assert_eq!(m, "def smallest_num(xs):\n  return None\n");
    }
}
