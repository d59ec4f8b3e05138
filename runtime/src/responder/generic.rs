//! `generic`: the responder of any agent a workflow author declares (a role with a goal), for
//! the emulated pool. No model runs, and the output says so: free text is a marked header
//! (`[emulated output of …]`) followed by neutral filler words up to the drawn length; a
//! structured output is a JSON value drawn from the node's schema (deterministic in the seed)
//! whose free-text strings carry the same filler, so that its length follows the node's
//! distribution too. The verdict of a structured output is its `verdict` property.
//!
//! Depends on `super::fit`, `crate::schema` and `crate::tokens`; never reads files.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::fit::{fit, truncate_tokens};
use super::{ResponderError, ResponderRequest};
use crate::schema::verdict_of;
use crate::tokens;

/// Neutral filler words (each one Qwen3 token with its leading space: a draw of `n` words is
/// `n` tokens).
const FILLER: &[&str] = &[
    " generated", " text", " stands", " in", " for", " the", " answer", " of", " this", " agent", " no", " model",
    " ran", " here", " words", " keep", " its", " length",
];

fn filler_words(rng: &mut ChaCha8Rng, n: usize) -> String {
    (0..n).map(|_| FILLER[rng.random_range(0..FILLER.len())]).collect::<String>().trim_start().to_string()
}

/// The output of a generic agent: `(text, value, verdict)`.
pub(crate) fn respond(
    req: &ResponderRequest,
    rng: &mut ChaCha8Rng,
    target: usize,
) -> Result<(String, serde_json::Value, Option<String>), ResponderError> {
    let who = match req.role {
        Some(r) => format!("node `{}` ({r})", req.node),
        None => format!("node `{}`", req.node),
    };
    let Some(schema) = req.schema else {
        let head = format!("[emulated output of {who} on {}]", req.model);
        let mut words = |_: usize| FILLER[rng.random_range(0..FILLER.len())].to_string();
        let text = fit(&head, "", target, &mut words);
        return Ok((text, serde_json::Value::Null, None));
    };
    // Structured: share what the drawn length leaves after the smallest answer among the
    // free-text strings, then cut back whole draws until the answer fits the cap (the JSON
    // stays valid: the cap is never reached by truncating text).
    let base = tokens::count(&schema.smallest().to_string());
    let slots = schema.free_text_slots().max(1);
    let mut per_string = target.saturating_sub(base + 2) / slots;
    let cap = req.max_output_tokens as usize;
    let seed: u64 = rng.random();
    for _ in 0..8 {
        let mut draw = <ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed);
        let mut text_rng = <ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
        let value = schema.sample(&mut draw, per_string, &mut |n| filler_words(&mut text_rng, n));
        let text = value.to_string();
        let n = tokens::count(&text);
        if n <= cap || per_string == 0 {
            let verdict = req.verdict_field.and_then(|f| verdict_of(&value, f));
            // The smallest answer is checked against the cap when the workflow loads; a drawn
            // one without free text that still exceeds it is cut (as a length cap would).
            let text = if n <= cap { text } else { truncate_tokens(&text, cap) };
            return Ok((text, value, verdict));
        }
        per_string = per_string * cap / n.max(1);
    }
    let value = schema.smallest();
    let verdict = req.verdict_field.and_then(|f| verdict_of(&value, f));
    Ok((value.to_string(), value, verdict))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_filler_word_is_one_token() {
        for w in FILLER {
            assert_eq!(tokens::count(w), 1, "{w:?}");
        }
    }
}
