//! Agent sessions (paper 000, TAO): the workload of ReAct-style sessions that alternate model
//! turns and tool calls — the trace format users replay (`switchyard run --trace-replay`), its
//! parser with `file:line: field` errors, and the seeded generators of SWE-bench-like traces
//! (`swe-lite`, `swe-verified`) whose distributions are documented with their sources in
//! `workflows/traces/README.md`.
//!
//! A session is a sequence of turns. Turn `k` sends the whole conversation so far — the shared
//! system prompt, every earlier turn's new tokens and outputs — plus its own new tokens (the
//! task for the first turn, the previous tool's observation for the others), and generates
//! `output_tokens` (after `reasoning_tokens` of reasoning the conversation does not keep); every
//! turn but the last then calls one tool. The conversation only grows, so every turn after the
//! first shares the session's prefix.
//!
//! Pure data: no I/O beyond parsing the text it is handed, no clock. Must not depend on the
//! planner, the shells or the emulator.

mod generate;
mod trace;

pub use generate::{AgentWorkload, THINKING_SMALLER_MODEL_STEPS, generate, generate_with_steps};
pub use trace::{MAX_TRACE_FILE_BYTES, TraceError, parse_trace, parse_trace_for_pool, to_jsonl};

use serde::{Deserialize, Serialize};

/// SplitMix64's finaliser of a combined key: the deterministic hash both shells derive a
/// session's block hashes and prompt text from (distinct inputs give distinct hashes in
/// practice).
pub fn mix(a: u64, b: u64) -> u64 {
    let mut z = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_add(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One tool call between two model turns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolStep {
    /// The structured tool name readiness history is keyed by (e.g. `bash.test`).
    pub name: String,
    /// How long the tool runs, seconds (modeled in the simulator: nothing runs).
    pub duration_s: f64,
    /// An exposed return deadline after the call starts, seconds (a tool timeout, or a parsed
    /// `sleep N`): a readiness hint, paper 000 §3.4. Absent when the tool exposes none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint_s: Option<f64>,
}

/// One model turn and the tool call that follows it (none on the last turn).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    /// Tokens this turn appends to the conversation before the model runs: the task on the
    /// first turn, the previous tool's observation on later ones.
    pub new_tokens: u32,
    /// Tokens the model generates in this turn that the conversation keeps (its answer).
    pub output_tokens: u32,
    /// Reasoning the model writes before that answer (a thinking model): generated in the call
    /// (decode time, KV while it runs) but not kept — Qwen3's chat template drops the reasoning
    /// of every assistant turn before the latest user message, and an agent harness's
    /// observation is one — so later turns neither carry it nor find it in the prefix cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolStep>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One agent session of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSession {
    /// A name unique in the trace (e.g. the SWE-bench instance id).
    pub id: String,
    /// Tokens of the system prompt every session of the trace shares (prefix-cacheable across
    /// sessions).
    pub system_tokens: u32,
    pub turns: Vec<Turn>,
}

impl AgentSession {
    /// Prompt tokens of turn `k`: the conversation up to and including its new tokens.
    pub fn prompt_tokens(&self, k: usize) -> u32 {
        let mut t = self.system_tokens;
        for (i, turn) in self.turns.iter().enumerate().take(k + 1) {
            t += turn.new_tokens;
            if i < k {
                t += turn.output_tokens;
            }
        }
        t
    }

    /// Tokens of the whole conversation after its last turn (of a validated session: its sums
    /// stay far below `u32::MAX`).
    pub fn final_context(&self) -> u32 {
        self.system_tokens + self.turns.iter().map(|t| t.new_tokens + t.output_tokens).sum::<u32>()
    }

    /// The largest context one of its calls reaches — its prompt, reasoning and answer, what a
    /// proxy counts from the call's usage: the peak context paper 002's ledger learns. Without
    /// reasoning, the last call's ([`Self::final_context`]). Of a validated session.
    pub fn peak_call_tokens(&self) -> u32 {
        (0..self.turns.len())
            .map(|k| self.prompt_tokens(k) + self.turns[k].reasoning_tokens + self.turns[k].output_tokens)
            .max()
            .unwrap_or(self.system_tokens)
    }
}

/// A trace: the sessions, in the order workers pick them up.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AgentTrace {
    pub sessions: Vec<AgentSession>,
}

impl AgentTrace {
    pub fn turns(&self) -> usize {
        self.sessions.iter().map(|s| s.turns.len()).sum()
    }

    /// The checks a parsed trace passes, for a trace built in code: every problem as
    /// `session N (ID): field: reason`, and duplicate ids.
    pub fn validate(&self) -> Result<(), TraceError> {
        let mut problems = Vec::new();
        let mut ids = std::collections::BTreeSet::new();
        for (n, s) in self.sessions.iter().enumerate() {
            if !s.id.is_empty() && !ids.insert(s.id.as_str()) {
                problems.push(format!("session {n} ({}): id: used by an earlier session", s.id));
            }
            for (field, why) in trace::session_problems(s) {
                problems.push(format!("session {n} ({}): {field}: {why}", s.id));
            }
        }
        if self.sessions.is_empty() {
            problems.push("the trace has no session".into());
        }
        if problems.is_empty() { Ok(()) } else { Err(TraceError::Invalid { problems }) }
    }

    pub fn tool_calls(&self) -> usize {
        self.sessions.iter().map(|s| s.turns.iter().filter(|t| t.tool.is_some()).count()).sum()
    }

    /// The same trace with every tool duration (and hint) stretched by the delay scaling of
    /// paper 000's Table 8: each session gets a fixed additional return delay drawn once per
    /// session, `scale ×` U(1, 5) s, added to every one of its tool calls.
    pub fn with_extra_delay(&self, scale: f64, seed: u64) -> AgentTrace {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut out = self.clone();
        for s in &mut out.sessions {
            let extra = scale * rng.random_range(1.0..5.0);
            for t in &mut s.turns {
                if let Some(tool) = &mut t.tool {
                    tool.duration_s += extra;
                    if let Some(h) = &mut tool.hint_s {
                        *h += extra;
                    }
                }
            }
        }
        out
    }
}
