//! Values that flow between the workflow model, the responders, the tools and the shells:
//! dataset records, node outputs and output-length distributions.
//!
//! Plain data with small pure helpers; depends on nothing else in the crate.

use std::collections::BTreeMap;

use rand::Rng;
use rand_distr::{Distribution, LogNormal};
use serde::{Deserialize, Serialize};

/// One dataset record after the workflow's field mapping: field name → JSON value.
pub type Record = BTreeMap<String, serde_json::Value>;

/// The result of one activation (LLM call or tool call).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NodeOutput {
    /// What later prompts see when they reference this node.
    pub text: String,
    /// A short control value that branch conditions test (tools: `pass` / `fail`; the vote:
    /// `majority` / `tie`); `None` for free text.
    pub verdict: Option<String>,
    /// Structured result (e.g. the vote's `{answer, votes}`), `Null` when there is none.
    pub value: serde_json::Value,
    /// Generated tokens (LLM nodes), 0 for tools.
    pub output_tokens: u32,
}

/// A per-node output-length distribution: log-normal with the given mean and coefficient of
/// variation, in tokens, always capped by the node's output limit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthDist {
    /// Mean output length in tokens (before the cap).
    pub mean: f64,
    /// Coefficient of variation (standard deviation / mean); 0 gives a fixed length.
    #[serde(default = "LengthDist::default_cv")]
    pub cv: f64,
}

impl LengthDist {
    fn default_cv() -> f64 {
        0.3
    }

    /// Draw a length in `[1, cap]`.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R, cap: u32) -> u32 {
        let cap = cap.max(1);
        if !(self.mean.is_finite() && self.mean > 0.0) {
            return 1;
        }
        let x = if self.cv <= 0.0 || !self.cv.is_finite() {
            self.mean
        } else {
            // For a log-normal: sigma² = ln(1 + cv²), mu = ln(mean) − sigma²/2.
            let sigma2 = (1.0 + self.cv * self.cv).ln();
            let mu = self.mean.ln() - sigma2 / 2.0;
            match LogNormal::new(mu, sigma2.sqrt()) {
                Ok(d) => d.sample(rng),
                Err(_) => self.mean,
            }
        };
        (x.round().max(1.0) as u64).min(cap as u64) as u32
    }
}

/// How a JSON value is named in "expected X, found Y" messages (`a string`, `a list`, …).
pub fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Derive a stable 64-bit seed from a base seed and a list of parts (SplitMix64 over FNV-1a):
/// the same (seed, session, node, round) always gives the same stream, whatever the policy.
pub fn derive_seed(base: u64, parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ base;
    for p in parts {
        for b in p.as_bytes() {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // SplitMix64 finaliser.
    let mut z = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn lengths_have_the_requested_mean_and_respect_the_cap() {
        let d = LengthDist { mean: 200.0, cv: 0.4 };
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let n = 20_000;
        let xs: Vec<u32> = (0..n).map(|_| d.sample(&mut rng, 10_000)).collect();
        let mean = xs.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
        assert!((mean - 200.0).abs() < 4.0, "{mean}");
        assert!(xs.iter().all(|&x| x >= 1));
        let capped: Vec<u32> = (0..1000).map(|_| d.sample(&mut rng, 150)).collect();
        assert!(capped.iter().all(|&x| x <= 150));
        assert_eq!(LengthDist { mean: 42.0, cv: 0.0 }.sample(&mut rng, 100), 42);
    }

    #[test]
    fn derived_seeds_are_stable_and_distinct() {
        assert_eq!(derive_seed(42, &["s1", "solve"]), derive_seed(42, &["s1", "solve"]));
        assert_ne!(derive_seed(42, &["s1", "solve"]), derive_seed(43, &["s1", "solve"]));
        assert_ne!(derive_seed(42, &["s1", "solve"]), derive_seed(42, &["s1solve"]));
    }
}

/// `bytes` as text; where they are not UTF-8, an error naming the line and column (1-based,
/// in characters) of the first bad byte, for messages about files a user gave.
pub fn utf8_text(bytes: Vec<u8>) -> Result<String, std::io::Error> {
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let good = std::str::from_utf8(&e.as_bytes()[..at]).unwrap_or_default();
        let line = good.matches('\n').count() + 1;
        let column = good.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not UTF-8 text: line {line}, column {column} (byte {at})"))
    })
}

#[cfg(test)]
mod utf8_tests {
    #[test]
    fn the_first_bad_byte_is_named_by_line_and_column() {
        let e = super::utf8_text(b"ab\ncd\xe9f\n".to_vec()).map(|_| ()).unwrap_err().to_string();
        assert_eq!(e, "not UTF-8 text: line 2, column 3 (byte 5)");
        assert_eq!(super::utf8_text("é\n".as_bytes().to_vec()).ok().as_deref(), Some("é\n"));
    }
}
