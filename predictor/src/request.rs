//! Request features: what one LLM call asks of a replica (paper 003 §3.3, the `r` of Eq. 1).
//!
//! A [`Request`] is a whole activation: `batch` sequences, each with a prompt of `input_tokens`
//! and `output_tokens` generated tokens. An engine executes it as one prefill pass followed by
//! `output_tokens - 1` decode passes; a [`ForwardPass`] is one such pass (its phase, how many
//! sequences, how many new tokens each, how many tokens each already has cached). Pure data:
//! no costs here, and no dependency on the estimators.

use serde::{Deserialize, Serialize};

/// Serving phase of a forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The prompt: every token of every sequence in one pass.
    Prefill,
    /// One new token per sequence, attending to the cached context.
    Decode,
}

/// One engine iteration over a batch of sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ForwardPass {
    pub phase: Phase,
    /// Sequences in the batch.
    pub sequences: u32,
    /// New tokens per sequence in this pass (the prompt for prefill, 1 for decode).
    pub query_tokens: u32,
    /// Tokens per sequence already in the KV cache before this pass.
    pub context_tokens: u32,
}

impl ForwardPass {
    /// The prefill of `sequences` prompts of `prompt_tokens` each, with an empty cache.
    pub fn prefill(sequences: u32, prompt_tokens: u32) -> Self {
        ForwardPass {
            phase: Phase::Prefill,
            sequences,
            query_tokens: prompt_tokens,
            context_tokens: 0,
        }
    }

    /// One decode step of `sequences` sequences with `context_tokens` cached each.
    pub fn decode(sequences: u32, context_tokens: u32) -> Self {
        ForwardPass {
            phase: Phase::Decode,
            sequences,
            query_tokens: 1,
            context_tokens,
        }
    }

    /// Tokens processed by the token-parallel operators (`sequences × query_tokens`).
    pub fn tokens(&self) -> u64 {
        u64::from(self.sequences) * u64::from(self.query_tokens)
    }
}

/// One activation's request configuration: `batch` sequences with the same lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Request {
    pub batch: u32,
    pub input_tokens: u32,
    pub output_tokens: u32,
}

impl Request {
    pub fn new(batch: u32, input_tokens: u32, output_tokens: u32) -> Self {
        Request {
            batch,
            input_tokens,
            output_tokens,
        }
    }

    /// The prefill pass of this request.
    pub fn prefill(&self) -> ForwardPass {
        ForwardPass::prefill(self.batch.max(1), self.input_tokens.max(1))
    }

    /// Number of decode passes: the prefill emits the first output token.
    pub fn decode_steps(&self) -> u32 {
        self.output_tokens.saturating_sub(1)
    }

    /// Tokens per sequence held in the KV cache at the end of the request.
    pub fn final_context(&self) -> u64 {
        u64::from(self.input_tokens) + u64::from(self.output_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_and_decode_token_counts() {
        assert_eq!(ForwardPass::prefill(4, 100).tokens(), 400);
        assert_eq!(ForwardPass::decode(4, 100).tokens(), 4);
        let r = Request::new(2, 10, 5);
        assert_eq!(r.decode_steps(), 4);
        assert_eq!(r.final_context(), 15);
        assert_eq!(Request::new(1, 10, 0).decode_steps(), 0);
    }
}
