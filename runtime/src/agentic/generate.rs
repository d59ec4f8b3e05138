//! Seeded generators of SWE-bench-like agent-session traces (mini-SWE-agent harness). The
//! distributions and the source of every number are in `workflows/traces/README.md`; the
//! constants here are those numbers.
//!
//! Must not depend on anything of the crate outside `agentic` (its session and trace types),
//! nor on the emulator or the tools (checked for the whole module by `module_boundaries.rs`).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal};

use super::{AgentSession, AgentTrace, ToolStep, Turn};

/// The workloads `bench tao` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentWorkload {
    /// SWE-bench Lite through mini-SWE-agent.
    SweLite,
    /// SWE-bench Verified through mini-SWE-agent: longer sessions with larger observations.
    SweVerified,
    /// Paper 002's programs: SWE-bench Verified through mini-SWE-agent with a thinking model
    /// (Qwen3.6 / Qwen3.5 think by default), each call writing reasoning the conversation drops
    /// before its answer; calibrated on paper 002's baselines (`workflows/traces/README.md`).
    SweVerifiedThinking,
}

impl AgentWorkload {
    pub fn name(self) -> &'static str {
        match self {
            AgentWorkload::SweLite => "swe-lite",
            AgentWorkload::SweVerified => "swe-verified",
            AgentWorkload::SweVerifiedThinking => "swe-verified-thinking",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "swe-lite" => Some(AgentWorkload::SweLite),
            "swe-verified" => Some(AgentWorkload::SweVerified),
            "swe-verified-thinking" => Some(AgentWorkload::SweVerifiedThinking),
            _ => None,
        }
    }

    fn params(self) -> Params {
        match self {
            AgentWorkload::SweLite => Params {
                turns_median: 28.0,
                obs_scale: 1.0,
                task_median: 300.0,
                reasoning: None,
                context_limit: CONTEXT_LIMIT,
            },
            AgentWorkload::SweVerified => Params {
                turns_median: 34.0,
                obs_scale: 1.2,
                task_median: 340.0,
                reasoning: None,
                context_limit: CONTEXT_LIMIT,
            },
            AgentWorkload::SweVerifiedThinking => Params {
                turns_median: THINKING_TURNS_MEDIAN,
                obs_scale: THINKING_OBS_SCALE,
                task_median: 340.0,
                reasoning: Some(THINKING_REASONING_MEDIAN),
                context_limit: THINKING_CONTEXT_LIMIT,
            },
        }
    }

    /// The context window a replica must serve for this workload's sessions.
    pub fn context_limit(self) -> u32 {
        self.params().context_limit
    }

    /// How many times as many calls the smaller model of a routed pair needs for the same
    /// program ([`generate_with_steps`]): 1 where the programs do not depend on the model; for
    /// paper 002's programs [`THINKING_SMALLER_MODEL_STEPS`].
    pub fn smaller_model_steps(self) -> f64 {
        match self {
            AgentWorkload::SweVerifiedThinking => THINKING_SMALLER_MODEL_STEPS,
            AgentWorkload::SweLite | AgentWorkload::SweVerified => 1.0,
        }
    }
}

struct Params {
    turns_median: f64,
    /// Multiplies the observation sizes.
    obs_scale: f64,
    task_median: f64,
    /// Median reasoning per call (log-normal, [`REASONING_SIGMA`]), if the model thinks.
    reasoning: Option<f64>,
    /// Sessions stop where the next turn would not fit this context.
    context_limit: u32,
}

/// mini-SWE-agent's system template plus the instance template's fixed instructions, identical
/// for every session (tokens).
const SYSTEM_TOKENS: u32 = 1_500;
/// Model calls per session: log-normal around the median with this sigma (mean ≈ 1.2 × the
/// median), at least 3 (read, edit, submit), at most mini-SWE-agent's `step_limit`.
const TURNS_SIGMA: f64 = 0.6;
const MIN_TURNS: u32 = 3;
const MAX_TURNS: u32 = 250;
/// Model output per call (a THOUGHT paragraph and one bash block): log-normal, median 130,
/// mean ≈ 180.
const OUTPUT_MEDIAN: f64 = 130.0;
const OUTPUT_SIGMA: f64 = 0.8;
const OUTPUT_MAX: u32 = 2_048;
/// Observations: 55 % short (an edit, `ls`: 5–80 tokens), 40 % medium (file views, grep,
/// test logs: log-normal median 400), 5 % at the harness's 10,000-character truncation
/// (≈ 2,600 tokens); mean ≈ 270.
const OBS_SHORT_SHARE: f64 = 0.55;
const OBS_LONG_SHARE: f64 = 0.05;
const OBS_MEDIUM_MEDIAN: f64 = 400.0;
const OBS_MEDIUM_SIGMA: f64 = 0.7;
const OBS_MAX: u32 = 2_600;
/// The task statement: log-normal.
const TASK_SIGMA: f64 = 0.6;
/// Sessions stop where the next turn would not fit this context (paper 000 Appendix G's
/// 33,024-token limit with its 512-token reserve).
const CONTEXT_LIMIT: u32 = 33_024;
/// Paper 002's programs (`SweVerifiedThinking`; sources and the fit in
/// `workflows/traces/README.md`). Three knobs FITTED together, on the calibration trace (seed
/// 911, 108 programs) and the Qwen3.6-27B / Qwen3.5-9B pool on two H100s, to three numbers paper
/// 002 measured on its baselines and calibration passes — the 27B's c₀ (22.6k tokens: the mean
/// peak context of finished programs, here each program's largest call), its D (642 s: mean
/// program run time in a calibration pass) and
/// ThunderAgent's mean call latency at 64 concurrent programs (10.9 s) — never on an ORACLE run:
/// model calls per program, median;
const THINKING_TURNS_MEDIAN: f64 = 45.0;
/// observation sizes, × the `swe-lite` mixture (mean ≈ 160 tokens);
const THINKING_OBS_SCALE: f64 = 0.6;
/// reasoning per call, median (mean ≈ 255 with the spread below);
const THINKING_REASONING_MEDIAN: f64 = 185.0;
/// its spread (an assumption: the answer's);
const REASONING_SIGMA: f64 = OUTPUT_SIGMA;
/// at most Qwen3's recommended thinking budget for most queries (the model card's 32,768-token
/// output), in practice far below it;
const REASONING_MAX: u32 = 32_768;
/// and the window a replica serves them in (an assumption: Qwen3.6's native window is 262,144;
/// paper 002's 9B reached a mean peak context of 44.7k, so 40,960 would cut its programs short).
const THINKING_CONTEXT_LIMIT: u32 = 65_536;
/// The smaller model (Qwen3.5-9B) needs this many times as many calls as the larger for the
/// same program. FITTED on the calibration trace (seed 911, 108 programs) to the 9B's c₀ that
/// paper 002's calibration passes measured (44.7k tokens against the 27B's 22.6k); the 9B's D
/// (639 s, against 642 s on the 27B) is left as the check: twice the calls at about half the
/// latency per call. `workflows/traces/README.md` has the fit.
pub const THINKING_SMALLER_MODEL_STEPS: f64 = 2.45;
const RESERVE: u32 = 512;

/// The bash command classes of a mini-SWE-agent session (keyed by the command's first word in
/// the paper's history), with their share of calls and the log-normal (median, sigma) of their
/// duration in seconds; overall mean ≈ 0.85 s, clipped at the harness's 60 s timeout.
const TOOLS: [(&str, f64, f64, f64); 4] = [
    ("bash.inspect", 0.55, 0.15, 0.8),
    ("bash.edit", 0.20, 0.10, 0.5),
    ("bash.run", 0.20, 1.2, 0.9),
    ("bash.test", 0.05, 5.0, 0.8),
];
const TOOL_TIMEOUT_S: f64 = 60.0;
/// A `sleep N` or an explicit `timeout N` exposes a deadline on this share of calls.
const HINTED_SHARE: f64 = 0.05;

fn lognormal(median: f64, sigma: f64) -> LogNormal<f64> {
    // Finite positive median and non-negative sigma: always valid.
    LogNormal::new(median.ln(), sigma).unwrap_or_else(|_| unreachable!("valid log-normal"))
}

/// The distributions of one workload's draws.
struct Draws {
    p: Params,
    turns: LogNormal<f64>,
    output: LogNormal<f64>,
    observation: LogNormal<f64>,
    task: LogNormal<f64>,
    reasoning: Option<LogNormal<f64>>,
    tools: Vec<LogNormal<f64>>,
}

impl Draws {
    fn new(workload: AgentWorkload) -> Self {
        let p = workload.params();
        Draws {
            turns: lognormal(p.turns_median, TURNS_SIGMA),
            output: lognormal(OUTPUT_MEDIAN, OUTPUT_SIGMA),
            observation: lognormal(OBS_MEDIUM_MEDIAN, OBS_MEDIUM_SIGMA),
            task: lognormal(p.task_median, TASK_SIGMA),
            reasoning: p.reasoning.map(|m| lognormal(m, REASONING_SIGMA)),
            tools: TOOLS.iter().map(|&(_, _, m, s)| lognormal(m, s)).collect(),
            p,
        }
    }

    /// Turn `k`'s tokens, or `None` when it would not fit the context window after `context`.
    fn turn(&self, k: u32, context: u32, rng: &mut ChaCha8Rng) -> Option<Turn> {
        let new_tokens = if k == 0 {
            (self.task.sample(rng).round() as u32).clamp(60, 6_000)
        } else {
            let u: f64 = rng.random();
            let raw = if u < OBS_SHORT_SHARE {
                rng.random_range(5.0..80.0)
            } else if u < 1.0 - OBS_LONG_SHARE {
                self.observation.sample(rng)
            } else {
                f64::from(OBS_MAX)
            };
            ((raw * self.p.obs_scale).round() as u32).clamp(5, OBS_MAX)
        };
        let output_tokens = (self.output.sample(rng).round() as u32).clamp(10, OUTPUT_MAX);
        let reasoning_tokens =
            self.reasoning.as_ref().map_or(0, |d| (d.sample(rng).round() as u32).clamp(1, REASONING_MAX));
        (context + new_tokens + reasoning_tokens + output_tokens + RESERVE <= self.p.context_limit).then_some(Turn {
            new_tokens,
            output_tokens,
            reasoning_tokens,
            tool: None,
        })
    }

    /// The tool call after a turn.
    fn tool(&self, rng: &mut ChaCha8Rng) -> ToolStep {
        let u: f64 = rng.random();
        let mut acc = 0.0;
        let mut pick = TOOLS.len() - 1;
        for (j, &(_, share, _, _)) in TOOLS.iter().enumerate() {
            acc += share;
            if u < acc {
                pick = j;
                break;
            }
        }
        let duration_s = (self.tools[pick].sample(rng).clamp(0.02, TOOL_TIMEOUT_S) * 1000.0).round() / 1000.0;
        let hint_s = (rng.random::<f64>() < HINTED_SHARE).then_some(duration_s);
        ToolStep { name: TOOLS[pick].0.to_string(), duration_s, hint_s }
    }
}

/// `sessions` sessions of `workload` drawn from `seed`.
pub fn generate(workload: AgentWorkload, sessions: usize, seed: u64) -> AgentTrace {
    generate_with_steps(workload, sessions, seed, 1.0)
}

/// The programs of [`generate`] (same seed) as a model that needs `steps` times as many calls
/// to finish them runs them: each session keeps every turn and tool call of its [`generate`]
/// version and continues with the calls it needs beyond them — `round(n × steps)` calls in
/// all for `n` drawn, at most mini-SWE-agent's step limit, while they fit the window — drawn from
/// its own stream (`mix(seed, session)`), so the draws of [`generate`] stay as they are.
/// `steps` ≤ 1 gives [`generate`]'s trace. (Paper 002's calibration passes found the smaller
/// model's programs twice as long in context at the same run time: see
/// [`THINKING_SMALLER_MODEL_STEPS`].)
pub fn generate_with_steps(workload: AgentWorkload, sessions: usize, seed: u64, steps: f64) -> AgentTrace {
    let d = Draws::new(workload);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7a0_5e55_1011);
    let mut out = Vec::with_capacity(sessions);
    for i in 0..sessions {
        let n = (d.turns.sample(&mut rng).round() as u32).clamp(MIN_TURNS, MAX_TURNS);
        let mut turns = Vec::with_capacity(n as usize);
        let mut context = SYSTEM_TOKENS;
        for k in 0..n {
            let Some(turn) = d.turn(k, context, &mut rng) else { break };
            context += turn.new_tokens + turn.output_tokens;
            turns.push(turn);
        }
        // Every turn but the last calls a tool.
        let last = turns.len().saturating_sub(1);
        for turn in turns.iter_mut().take(last) {
            turn.tool = Some(d.tool(&mut rng));
        }
        let more = ((f64::from(n) * steps).round() as u32).min(MAX_TURNS);
        if more > n && turns.len() == n as usize {
            let mut own = ChaCha8Rng::seed_from_u64(super::mix(seed ^ STEPS_STREAM, i as u64));
            let base = turns.len();
            for k in n..more {
                let Some(turn) = d.turn(k, context, &mut own) else { break };
                context += turn.new_tokens + turn.output_tokens;
                turns.push(turn);
            }
            let last = turns.len().saturating_sub(1);
            for turn in turns.iter_mut().take(last).skip(base.saturating_sub(1)) {
                turn.tool = Some(d.tool(&mut own));
            }
        }
        out.push(AgentSession { id: format!("{}-{i:04}", workload.name()), system_tokens: SYSTEM_TOKENS, turns });
    }
    AgentTrace { sessions: out }
}

/// Keys the streams of the calls a model needs beyond [`generate`]'s.
const STEPS_STREAM: u64 = 0x5e95_7e95;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_traces_are_valid_seeded_and_fit_the_context_limit() {
        let a = generate(AgentWorkload::SweLite, 50, 7);
        assert_eq!(a, generate(AgentWorkload::SweLite, 50, 7));
        assert_ne!(a, generate(AgentWorkload::SweLite, 50, 8));
        let text = super::super::to_jsonl(&a);
        assert_eq!(super::super::parse_trace("gen", &text).unwrap(), a);
        for s in &a.sessions {
            assert!(s.final_context() + RESERVE <= CONTEXT_LIMIT);
            assert!(s.turns.last().unwrap().tool.is_none());
        }
        let v = generate(AgentWorkload::SweVerified, 50, 7);
        assert!(v.turns() > a.turns(), "verified sessions are longer: {} vs {}", v.turns(), a.turns());
        // Paper 002's thinking programs: every call reasons, the reasoning round-trips through
        // the JSONL format, and the largest context a call reaches (its prompt, reasoning and
        // answer) fits the workload's window.
        let t = generate(AgentWorkload::SweVerifiedThinking, 50, 7);
        assert_eq!(super::super::parse_trace("gen", &super::super::to_jsonl(&t)).unwrap(), t);
        for s in &t.sessions {
            for (k, turn) in s.turns.iter().enumerate() {
                assert!(turn.reasoning_tokens >= 1);
                assert!(
                    s.prompt_tokens(k) + turn.reasoning_tokens + turn.output_tokens + RESERVE <= THINKING_CONTEXT_LIMIT
                );
            }
        }
        assert!(v.sessions.iter().all(|s| s.turns.iter().all(|t| t.reasoning_tokens == 0)));
        // Without reasoning the largest call is the last; with it, a call's reasoning counts.
        assert!(v.sessions.iter().all(|s| s.peak_call_tokens() == s.final_context()));
        assert!(t.sessions.iter().all(|s| s.peak_call_tokens() > s.final_context()));
        assert_eq!(AgentWorkload::parse("swe-verified-thinking"), Some(AgentWorkload::SweVerifiedThinking));
    }

    #[test]
    fn a_model_that_needs_more_steps_runs_the_same_programs_longer() {
        let w = AgentWorkload::SweVerifiedThinking;
        let base = generate(w, 108, 911);
        // `generate` pinned: the summed largest calls of the calibration traces (seed 911) that
        // every published c₀ comes from (20,180.48 and 23,154.75 tokens per program).
        let peaks = |t: &AgentTrace| t.sessions.iter().map(|s| u64::from(s.peak_call_tokens())).sum::<u64>();
        assert_eq!(peaks(&generate(AgentWorkload::SweVerified, 108, 911)), 2_179_492);
        assert_eq!(peaks(&base), 2_500_713);
        assert_eq!(w.smaller_model_steps(), THINKING_SMALLER_MODEL_STEPS);
        assert_eq!(AgentWorkload::SweVerified.smaller_model_steps(), 1.0);
        let longer = generate_with_steps(w, 108, 911, THINKING_SMALLER_MODEL_STEPS);
        assert!(longer.validate().is_ok());
        let mut extended = 0;
        for (a, b) in base.sessions.iter().zip(&longer.sessions) {
            assert_eq!(a.id, b.id);
            assert!(b.turns.len() >= a.turns.len());
            // The same program: every turn's tokens as before, every tool call but the old last
            // turn's (which now calls one) as before; the last turn calls none.
            for (k, (x, y)) in a.turns.iter().zip(&b.turns).enumerate() {
                assert_eq!(
                    (x.new_tokens, x.output_tokens, x.reasoning_tokens),
                    (y.new_tokens, y.output_tokens, y.reasoning_tokens)
                );
                if k + 1 < a.turns.len() {
                    assert_eq!(x.tool, y.tool);
                }
            }
            assert!(b.turns.last().is_some_and(|t| t.tool.is_none()));
            assert!(b.turns[..b.turns.len() - 1].iter().all(|t| t.tool.is_some()));
            for (k, turn) in b.turns.iter().enumerate() {
                assert!(
                    b.prompt_tokens(k) + turn.reasoning_tokens + turn.output_tokens + RESERVE <= THINKING_CONTEXT_LIMIT
                );
            }
            extended += usize::from(b.turns.len() > a.turns.len());
        }
        assert!(extended > 100, "{extended} of 108 programs got longer");
        // The fit: the mean largest call is paper 002's c₀ for the 9B (44.7k tokens), within 1 %.
        let c0 = longer.sessions.iter().map(|s| f64::from(s.peak_call_tokens())).sum::<f64>() / 108.0;
        assert!((c0 / 44_700.0 - 1.0).abs() < 0.01, "c0 {c0}");
        // Another session count changes nothing of the sessions both have.
        let fewer = generate_with_steps(w, 20, 911, THINKING_SMALLER_MODEL_STEPS);
        assert_eq!(fewer.sessions[..], longer.sessions[..20]);
    }
}
