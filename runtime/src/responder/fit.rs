//! Fitting a responder's content to the drawn output length, in real (Qwen3 tokenizer) tokens.
//!
//! A response is `head + filler pieces + tail`. The head is the substance (a worked solution,
//! a code block, selected sentences), the tail what a model writes last (`#### 18`). When the
//! substance is shorter than the target, honest filler pieces from the responder are inserted
//! between head and tail; when it is longer, the whole text is cut at the target — the tail
//! goes first, which is how a length cap cuts off a final answer.
//!
//! Token counts of pieces are added up (pieces start with a newline or a space, where the BPE
//! pre-tokenizer splits anyway) and the assembled text is re-counted exactly at the end.
//! Depends only on `crate::tokens`.

use crate::tokens;

/// Upper bound on filler pieces asked for, so a filler that keeps yielding empty pieces cannot
/// loop forever.
const MAX_FILLER_PIECES: usize = 20_000;

/// How many further pieces are tried when one does not fit the remaining budget, before the
/// last one is cut at a word boundary.
const FIT_ATTEMPTS: usize = 8;

/// Keep at most `max` tokens of `text` (a prefix of it), re-counted exactly.
///
/// A cut inside a multi-byte character does not decode; the cut then backs off a token at a
/// time (at most a few, a character is at most 4 bytes).
pub(crate) fn truncate_tokens(text: &str, max: usize) -> String {
    let ids = tokens::encode(text);
    if ids.len() <= max {
        return text.to_string();
    }
    let mut m = max;
    for _ in 0..8 {
        if m == 0 {
            break;
        }
        let candidate = tokens::decode(&ids[..m]);
        if !candidate.is_empty() && text.starts_with(&candidate) && tokens::count(&candidate) <= max {
            return candidate;
        }
        m -= 1;
    }
    String::new()
}

/// Cut `piece` to at most `budget` tokens, at a word boundary when that costs at most
/// [`WORD_CUT_SLACK`] tokens, else at a token boundary.
fn cut_at_word(piece: &str, budget: usize) -> String {
    let cut = truncate_tokens(piece, budget);
    if cut.len() == piece.len() {
        return cut;
    }
    if let Some(i) = cut.rfind(char::is_whitespace) {
        let at_word = cut[..i].trim_end();
        if tokens::count(at_word) + WORD_CUT_SLACK >= tokens::count(&cut) {
            return at_word.to_string();
        }
    }
    cut
}

/// Tokens a cut may give up to end on a whole word.
const WORD_CUT_SLACK: usize = 2;

/// Cut `piece` to at most `budget` tokens including `mark`, which is appended when the piece
/// had to be cut (an already marked piece is re-cut without doubling the mark).
fn cut_marked(piece: &str, budget: usize, mark: &str) -> String {
    if tokens::count(piece) <= budget {
        return piece.to_string();
    }
    let base = if mark.is_empty() { piece } else { piece.strip_suffix(mark).unwrap_or(piece) };
    let cut = cut_at_word(base, budget.saturating_sub(tokens::count(mark)));
    if cut.trim().is_empty() { String::new() } else { format!("{cut}{mark}") }
}

/// Assemble `head + filler(0) + filler(1) + … + tail` with close to `target` tokens and never
/// more. `filler(i)` yields the i-th filler piece; pieces should start with their separator.
pub(crate) fn fit(head: &str, tail: &str, target: usize, filler: &mut dyn FnMut(usize) -> String) -> String {
    fit_marked(head, tail, target, "", filler)
}

/// [`fit`], ending a filler piece that had to be cut with `mark` (e.g. `…`, so that a later
/// reader still sees a sentence boundary there).
pub(crate) fn fit_marked(
    head: &str,
    tail: &str,
    target: usize,
    mark: &str,
    filler: &mut dyn FnMut(usize) -> String,
) -> String {
    let assemble = |pieces: &[String]| {
        let mut s = String::with_capacity(head.len() + tail.len() + pieces.iter().map(String::len).sum::<usize>());
        s.push_str(head);
        for p in pieces {
            s.push_str(p);
        }
        s.push_str(tail);
        s
    };
    let base = assemble(&[]);
    let mut n = tokens::count(&base);
    if n >= target {
        return truncate_tokens(&base, target);
    }
    let mut pieces: Vec<String> = Vec::new();
    let mut i = 0;
    let mut misses = 0;
    let mut rounds = 0;
    while i < MAX_FILLER_PIECES {
        if n >= target {
            // Joins can merge tokens (`.` + `\n` is one token): re-count before stopping.
            let exact = tokens::count(&assemble(&pieces));
            rounds += 1;
            if exact >= n || rounds > 4 {
                break;
            }
            n = exact;
            continue;
        }
        let budget = target - n;
        let piece = filler(i);
        i += 1;
        let pn = tokens::count(&piece);
        if pn == 0 {
            continue;
        }
        if pn <= budget {
            pieces.push(piece);
            n += pn;
            misses = 0;
        } else if misses < FIT_ATTEMPTS {
            misses += 1;
        } else {
            // Joins can merge tokens (`.` + `\n` is one token): re-count before cutting.
            let exact = tokens::count(&assemble(&pieces));
            if exact < n {
                n = exact;
                misses = 0;
                continue;
            }
            let cut = cut_marked(&piece, budget, mark);
            if !cut.is_empty() {
                pieces.push(cut);
            }
            break;
        }
    }
    let mut text = assemble(&pieces);
    // Piece counts are additive only up to merges at the joins: trim filler, not the tail.
    for _ in 0..4 {
        let n = tokens::count(&text);
        if n <= target {
            return text;
        }
        let excess = n - target;
        match pieces.pop() {
            Some(last) => {
                let keep = tokens::count(&last).saturating_sub(excess);
                let cut = cut_marked(&last, keep, mark);
                if !cut.is_empty() {
                    pieces.push(cut);
                }
            }
            None => break,
        }
        text = assemble(&pieces);
    }
    truncate_tokens(&text, target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filler(i: usize) -> String {
        format!("\nLet me double-check step {i}: 16 - 3 - 4 = 9 eggs remain.")
    }

    #[test]
    fn fills_to_close_to_the_target_and_keeps_the_tail() {
        for target in [40usize, 57, 120, 333] {
            let out = fit("Janet sells 9 eggs.", "\n#### 18", target, &mut filler);
            let n = tokens::count(&out);
            assert!(n <= target, "{n} > {target}");
            assert!(n + 3 >= target, "{n} far below {target}: {out:?}");
            assert!(out.ends_with("\n#### 18"), "{out}");
            assert!(out.starts_with("Janet sells 9 eggs."));
        }
    }

    #[test]
    fn long_content_is_cut_and_loses_its_tail() {
        let head = "She makes 9 * 2 = 18 dollars every day at the farmers' market. ".repeat(10);
        let out = fit(&head, "\n#### 18", 20, &mut filler);
        assert_eq!(tokens::count(&out), 20);
        assert!(!out.contains("####"));
        assert!(head.starts_with(&out));
    }

    #[test]
    fn a_cut_piece_carries_the_mark() {
        let piece = |_| " The committee heard evidence from the Crown Prosecution Service today.".to_string();
        for target in 20..40 {
            let out = fit_marked("Summary.", "", target, "…", &mut { piece });
            assert!(tokens::count(&out) <= target);
            assert!(out.ends_with('.') || out.ends_with('…'), "{out}");
        }
    }

    #[test]
    fn empty_filler_terminates() {
        let out = fit("abc", "", 50, &mut |_| String::new());
        assert_eq!(out, "abc");
    }

    #[test]
    fn truncation_never_splits_a_character_into_nothing() {
        let text = "Janet’s ducks lay 16 eggs — “fresh” ones. ".repeat(5);
        for max in 0..40 {
            let t = truncate_tokens(&text, max);
            assert!(tokens::count(&t) <= max);
            assert!(text.starts_with(&t));
            if max >= 4 {
                assert!(!t.is_empty());
            }
        }
    }
}
