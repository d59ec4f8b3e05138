//! `switchyard bench oracle`'s program experiments (paper 002 §5.3, Figures 5–7): routed agent
//! programs under concurrency on a two-model pool, in the agent-session simulator
//! ([`crate::sim::agentic::run_routed_agents`]).
//!
//! Pools: two GPUs, one replica each — Qwen3-32B in FP8 in the role of the paper's
//! Qwen3.6-27B-FP8, Qwen3-8B in BF16 in the role of Qwen3.5-9B — on two H100-80GB (the
//! catalogue's closest device to the paper's main GH200 pair: the same Hopper GPU with 80 of
//! its 96 GB) and on two H200-141GB (the paper's Table 5 H200 pair). Feedback handling and the
//! β sweep run on the first.
//! Workload: SWE-bench-Verified-like agent sessions (`agentic::generate`, the TAO bench's
//! generator), one program each, `programs` per cell (paper: 108). A program resolves its task
//! with the single-model accuracies paper 002 §5.2 measured for its pair (0.70 on the larger
//! model, 0.44 on the smaller), nested by task difficulty ([`crate::sim::agent_routing`]).
//!
//! Three experiments, every system on the same trace, outcome draws and engine-noise seed:
//! 1. **Admission under concurrency** (Fig. 6, Table 4): stock vLLM (no admission control),
//!    ThunderAgent's proxy, a static per-model cap, DISC's admission without reassignment, and
//!    ORACLE (DISC with the divert rule) at each concurrency; all share the router (LinUCB,
//!    delayed feedback). The static cap is fixed as the paper fixes it: DISC's mean admitted
//!    counts while programs waited, rounded, from a run at the calibration concurrency on a
//!    seed that is not evaluated.
//! 2. **Feedback handling** (Fig. 5): delayed feedback, batch-synchronous dispatch and
//!    independent per-slot learners, router only (no admission control), at 12–32 concurrent.
//! 3. **β sweep** (Fig. 7b) at the calibration concurrency.
//!
//! DISC's priors come from calibration passes, as the paper's do: c₀ is the mean peak context
//! of a calibration trace (another seed), D₀ each model's mean program run time when that trace
//! runs on it alone under ThunderAgent's proxy at 16 concurrent programs.
//!
//! Depends on `sim`, `agentic` and the planner's router options; nothing depends on it.

use std::fmt::Write as _;

use serde::Serialize;
use switchyard_predictor::spec::Dtype;

use crate::agentic::{AgentTrace, AgentWorkload, generate, generate_with_steps};
use crate::planner::admission::{SchedulerKind, TaoOptions};
use crate::planner::routing::{DiscConfig, RouterOptions};
use crate::exec::routing::call_cost;
use crate::sim::agent_routing::{
    Feedback, Judge, PriorOutcome, ProgramAdmission, ProgramRouting, RoutedArm, RoutedRunReport, task_difficulty,
};
use crate::sim::agentic::{AgentPoolSpec, AgentReplicaSpec, AgentRunConfig, AgentSimError, run_routed_agents_by_model};

/// Paper 002 §5.2: the single-model accuracies of its pair (Qwen3.5-9B 44 %, Qwen3.6-27B-FP8 70 %).
pub const SUCCESS_LARGER: f64 = 0.70;
pub const SUCCESS_SMALLER: f64 = 0.44;

/// A judge's error rate: Zheng et al. 2023 ("Judging LLM-as-a-Judge with MT-Bench and Chatbot
/// Arena", NeurIPS Datasets and Benchmarks) measured GPT-4 as a judge agreeing with human
/// experts on 85 % of the non-tied MT-Bench pairs. An assumption for these judges (a local model
/// judging agent transcripts is likely to err more).
pub const JUDGE_ERROR: f64 = 0.15;

/// The models in the two roles on the dense pools: Qwen3-32B (FP8) for Qwen3.6-27B-FP8, Qwen3-8B
/// for Qwen3.5-9B.
pub const LARGER: &str = "Qwen3-32B";
pub const SMALLER: &str = "Qwen3-8B";

/// Paper 002's own pair (§5.1): Qwen3.6-27B-FP8 and Qwen3.5-9B, hybrid-attention models whose
/// every running request holds its linear-attention layers' state (from their configs:
/// 2,349 and 1,572 tokens of their BF16 KV caches).
pub const HYBRID_LARGER: &str = "Qwen3.6-27B";
pub const HYBRID_SMALLER: &str = "Qwen3.5-9B";

/// Context length each replica serves (Qwen3's native window; the generated sessions stay below it).
const MAX_MODEL_LEN: u32 = 40_960;

/// Seed of the calibration trace (priors and the static cap); never an evaluated seed.
const CALIBRATION_SEED: u64 = 911;

/// ThunderAgent's prefix-cache hit rate on the larger model at 64 concurrent programs, as paper
/// 002 measured it on its own programs and pool (§5.2: 0.73, against ORACLE's 0.93).
pub const PAPER_THUNDERAGENT_HIT_RATE: f64 = 0.73;

/// The concurrency of the teaching sweep ([`PoolCalibration::teaching_sweep`]): the paper's
/// headline setting.
const TEACHING_SWEEP_CONCURRENCY: usize = 64;

/// The systems of the admission experiment.
pub const SYSTEMS: [&str; 5] = ["vllm", "thunderagent", "static-cap", "admission-only", "oracle"];

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct ProgramsBenchConfig {
    /// Programs per cell.
    pub programs: usize,
    /// Concurrency levels of the admission experiment.
    pub concurrency: Vec<usize>,
    /// Concurrency levels of the feedback experiment.
    pub feedback_concurrency: Vec<usize>,
    /// The calibration concurrency (static cap, β sweep).
    pub calibration_concurrency: usize,
    pub betas: Vec<f64>,
    /// Plan seeds: each draws the trace, the outcomes and the engine noise.
    pub seeds: Vec<u64>,
    /// Modeled verifier time per program (assumption: see the report).
    pub verifier_s: f64,
    /// Concurrency of the verifier experiment (harness vs LLM judges).
    pub verifier_concurrency: usize,
    /// The judges' prompt cap and answer, tokens, and their error rate.
    pub judge_prompt_tokens: u32,
    pub judge_output_tokens: u32,
    pub judge_error: f64,
}

impl Default for ProgramsBenchConfig {
    fn default() -> Self {
        ProgramsBenchConfig {
            programs: 108,
            concurrency: vec![32, 64, 96],
            feedback_concurrency: vec![12, 16, 24, 32],
            calibration_concurrency: 64,
            betas: vec![0.0, 0.2, 0.3, 0.5, 1.0],
            seeds: vec![1, 2],
            verifier_s: 120.0,
            verifier_concurrency: 32,
            judge_prompt_tokens: 8_192,
            judge_output_tokens: 256,
            judge_error: JUDGE_ERROR,
        }
    }
}

/// One system at one setting, means over the seeds.
#[derive(Debug, Clone, Serialize)]
pub struct ProgramsCell {
    pub pool: String,
    pub system: String,
    pub concurrency: usize,
    pub beta: f64,
    pub programs_per_hour: f64,
    pub resolved: f64,
    pub resolved_per_hour: f64,
    pub larger_share: f64,
    pub larger_hit_rate: f64,
    pub smaller_hit_rate: f64,
    /// The larger model's highest KV-cache usage (mean over the seeds), and when its cache was
    /// first full (usage ≥ 95 %; mean over the seeds where it was, `None` where it never was):
    /// paper 002 Fig. 2c's measure of load imbalance.
    pub larger_kv_peak: f64,
    pub larger_kv_full_at_s: Option<f64>,
    /// Seeds on which the larger model's cache was full at some point.
    pub larger_kv_full_runs: usize,
    pub preemptions: f64,
    pub mean_call_latency_s: f64,
    pub mean_admission_wait_s: f64,
    pub mean_start_wait_s: f64,
    pub diverted: f64,
    /// Share of landed verdicts that were wrong (a judge's errors).
    pub wrong_verdicts: f64,
    pub makespan_s: f64,
    /// Every seed's run.
    pub runs: Vec<RoutedRunReport>,
}

/// The experiments' results.
#[derive(Debug, Clone, Serialize)]
pub struct ProgramsReport {
    pub config: ProgramsBenchConfig,
    /// c₀ of the TAO bench's SWE-bench Verified programs (the first four pools'; each pool's own,
    /// per model, is in [`PoolCalibration::prior_peak_tokens`]).
    pub prior_peak_tokens: f64,
    pub pools: Vec<PoolCalibration>,
    /// The admission experiment with a cold learner (no verdict before the run's first program).
    pub admission: Vec<ProgramsCell>,
    /// The same with every system's learner first taught the calibration passes' outcomes
    /// ([`PoolCalibration::prior`]): a router that has learned which model resolves more, the
    /// condition of paper 002's Fig. 2c.
    pub admission_calibrated: Vec<ProgramsCell>,
    pub feedback: Vec<ProgramsCell>,
    pub beta_sweep: Vec<ProgramsCell>,
    pub verifiers: Vec<ProgramsCell>,
}

/// A pool's calibration: DISC's run-time priors and the static cap fixed from DISC's run.
#[derive(Debug, Clone, Serialize)]
pub struct PoolCalibration {
    pub pool: AgentPoolSpec,
    /// The programs this pool runs.
    pub workload: AgentWorkload,
    /// c₀ per model (larger, smaller): the mean over the calibration trace's programs, as that
    /// model runs them, of their largest call's context (prompt, reasoning and answer), tokens.
    pub prior_peak_tokens: [f64; 2],
    /// D₀ per model (larger, smaller), seconds.
    pub prior_run_s: [f64; 2],
    pub static_cap: [usize; 2],
    /// The static cap fixed the same way with the calibrated learner.
    pub static_cap_calibrated: [usize; 2],
    /// DISC's learned per-request allowance δ̂ per model at the end of the calibration run with
    /// the cold learner.
    pub allowance_tokens: Vec<f64>,
    /// The calibration passes' outcomes a calibrated learner is taught: every calibration
    /// program on each model alone, resolved or not (its difficulty under the calibration
    /// seed), at the compute its calls cost with the earlier conversation in the prefix cache
    /// (an ideal cache: evaluated runs charge the hits they got; inert at the bench's cost
    /// weight 0, where the reward is the success alone).
    pub prior: Vec<PriorOutcome>,
    /// Paper 002's own programs only: ThunderAgent's larger-model hit rate at 64 concurrent
    /// programs on the calibration trace with the learner taught the outcomes of the first `n`
    /// calibration programs, per `n` (0–9, then every tenth): whether some amount of teaching
    /// puts the baseline where the paper measured it ([`PAPER_THUNDERAGENT_HIT_RATE`]).
    pub teaching_sweep: Vec<(usize, f64)>,
}

/// The two-model pool on two GPUs of `device`: `models` (larger, smaller), the larger with FP8
/// weights, the smaller in BF16; each running request of a dense model holding
/// `request_state_tokens` of KV beyond its tokens (0: none; a hybrid model holds its own). The
/// dense larger model keeps an FP8 KV cache (`--kv-cache-dtype fp8`), the hybrid one vLLM's
/// default for an FP8 checkpoint, a BF16 cache — as paper 002 ran it (it names no KV flag).
pub fn pool(device: &str, models: (&str, &str), request_state_tokens: u32) -> AgentPoolSpec {
    pool_for(device, models, request_state_tokens, AgentWorkload::SweVerified)
}

/// [`pool`] for `workload`'s programs: its replicas serve the workload's context window (at
/// least [`MAX_MODEL_LEN`]); a workload other than SWE-bench Verified is named in the pool's name.
pub fn pool_for(
    device: &str,
    models: (&str, &str),
    request_state_tokens: u32,
    workload: AgentWorkload,
) -> AgentPoolSpec {
    let max_model_len = MAX_MODEL_LEN.max(workload.context_limit());
    let hybrid = switchyard_predictor::spec::model(models.0).is_ok_and(|m| m.linear_attention.is_some());
    let replica = |model: &str, dtype, kv_cache_dtype| AgentReplicaSpec {
        model: model.into(),
        device: device.into(),
        tensor_parallel: 1,
        max_model_len,
        dtype,
        request_state_tokens,
        kv_cache_dtype,
    };
    let mut name = match (models.0 == LARGER, request_state_tokens) {
        (true, 0) => format!("2x {device}"),
        (true, state) => format!("2x {device}, {state}-token state"),
        (false, _) => format!("2x {device}, {} + {}", models.0, models.1),
    };
    if workload != AgentWorkload::SweVerified {
        name.push_str(&format!(", {}", workload.name()));
    }
    let larger_kv = hybrid.then_some(Dtype::Bf16);
    AgentPoolSpec {
        name,
        replicas: vec![replica(models.0, Dtype::Fp8, larger_kv), replica(models.1, Dtype::Bf16, None)],
    }
}

/// The per-request state paper 002 measured on its hybrid-attention engines (Appendix B.2:
/// "3.6–4.7k token-equivalents per running request"), the midpoint: the counterfactual pool
/// asks what DISC gains when the dense engines hold it.
pub const HYBRID_STATE_TOKENS: u32 = 4_150;

/// The pools the experiments run on (device, model pair, counterfactual per-request state, the
/// programs; feedback and β on the first): the dense Qwen3 pair on two H100s and two H200s, the
/// dense pair on two H100s holding paper 002's measured state, and paper 002's own hybrid pair
/// on two H100s with its configs' state — with the TAO bench's SWE-bench Verified programs, and
/// with paper 002's thinking programs (`swe-verified-thinking`).
pub const POOLS: [(&str, (&str, &str), u32, AgentWorkload); 5] = [
    ("H100-80GB", (LARGER, SMALLER), 0, AgentWorkload::SweVerified),
    ("H200-141GB", (LARGER, SMALLER), 0, AgentWorkload::SweVerified),
    ("H100-80GB", (LARGER, SMALLER), HYBRID_STATE_TOKENS, AgentWorkload::SweVerified),
    ("H100-80GB", (HYBRID_LARGER, HYBRID_SMALLER), 0, AgentWorkload::SweVerified),
    ("H100-80GB", (HYBRID_LARGER, HYBRID_SMALLER), 0, AgentWorkload::SweVerifiedThinking),
];

/// The per-request state of a catalogue model served in `dtype`, in tokens of its KV cache.
fn state_tokens(model: &str, dtype: Dtype, kv_dtype: Dtype) -> u64 {
    switchyard_predictor::spec::model(model).map_or(0, |m| m.request_state_tokens(dtype, kv_dtype))
}

/// Whether a pool serves hybrid-attention models (the per-request state of paper 002's engines).
fn is_hybrid(pool: &AgentPoolSpec) -> bool {
    pool.replicas.iter().any(|r| {
        r.request_state_tokens > 0
            || switchyard_predictor::spec::model(&r.model).is_ok_and(|m| m.linear_attention.is_some())
    })
}

fn arms(pool: &AgentPoolSpec, c0: [f64; 2], d0: [f64; 2]) -> Vec<RoutedArm> {
    let model = |k: usize| pool.replicas.get(k).map(|r| r.model.clone()).unwrap_or_default();
    vec![
        RoutedArm { model: model(0), success: SUCCESS_LARGER, prior_peak_tokens: c0[0], prior_run_s: d0[0] },
        RoutedArm { model: model(1), success: SUCCESS_SMALLER, prior_peak_tokens: c0[1], prior_run_s: d0[1] },
    ]
}

/// One draw of programs: as every model runs them, or — where the workload's smaller model
/// needs more calls for the same program ([`AgentWorkload::smaller_model_steps`]) — as the
/// larger and as the smaller model runs them.
pub struct Programs {
    versions: Vec<AgentTrace>,
}

impl Programs {
    /// `programs` programs of `workload` drawn from `seed`.
    pub fn draw(workload: AgentWorkload, programs: usize, seed: u64) -> Self {
        let base = generate(workload, programs, seed);
        let steps = workload.smaller_model_steps();
        let versions =
            if steps > 1.0 { vec![base, generate_with_steps(workload, programs, seed, steps)] } else { vec![base] };
        Programs { versions }
    }

    /// The programs as model `k` (0 larger, 1 smaller) runs them.
    pub fn for_model(&self, k: usize) -> &AgentTrace {
        self.versions.get(k).unwrap_or(&self.versions[0])
    }

    /// c₀ on model `k`: the mean of its programs' largest call.
    pub fn mean_peak_tokens(&self, k: usize) -> f64 {
        let t = self.for_model(k);
        t.sessions.iter().map(|s| f64::from(s.peak_call_tokens())).sum::<f64>() / t.sessions.len().max(1) as f64
    }

    fn refs(&self) -> Vec<&AgentTrace> {
        self.versions.iter().collect()
    }
}

fn run_cfg(scheduler: SchedulerKind, workers: usize, noise_seed: u64) -> AgentRunConfig {
    AgentRunConfig {
        workers,
        scheduler,
        tao: TaoOptions::default(),
        noise_seed,
        plan_latency_s: 0.002,
        // Paper 002 §5.1 / B.1: "ThunderAgent's released proxy runs in front of each engine with
        // Δt = 5 s and priority decay on, the configuration of its paper"; DISC and the static
        // cap sit on the same proxy.
        thunder_acting_decay: true,
    }
}

struct Setting {
    scheduler: SchedulerKind,
    admission: ProgramAdmission,
    reassign: bool,
    feedback: Feedback,
    beta: f64,
    judge: Option<Judge>,
    /// The learner starts from the calibration passes' outcomes (of the first `taught`
    /// calibration programs; all with `None`).
    calibrated: bool,
    taught: Option<usize>,
}

impl Setting {
    fn system(name: &str, cap: [usize; 2]) -> Self {
        let (scheduler, admission, reassign) = match name {
            "vllm" => (SchedulerKind::CacheAware, ProgramAdmission::Immediate, false),
            "thunderagent" => (SchedulerKind::ThunderAgent, ProgramAdmission::Immediate, false),
            "static-cap" => (SchedulerKind::ThunderAgent, ProgramAdmission::StaticCap(cap.to_vec()), false),
            "admission-only" => (SchedulerKind::ThunderAgent, ProgramAdmission::Disc, false),
            _ => (SchedulerKind::ThunderAgent, ProgramAdmission::Disc, true),
        };
        Setting {
            scheduler,
            admission,
            reassign,
            feedback: Feedback::Delayed,
            beta: DiscConfig::default().beta,
            judge: None,
            calibrated: false,
            taught: None,
        }
    }
}

struct Ctx<'a> {
    cfg: &'a ProgramsBenchConfig,
    pool: AgentPoolSpec,
    arms: Vec<RoutedArm>,
    prior: Vec<PriorOutcome>,
}

impl Ctx<'_> {
    fn run(
        &self,
        programs: &Programs,
        seed: u64,
        workers: usize,
        s: &Setting,
    ) -> Result<RoutedRunReport, AgentSimError> {
        let routing = ProgramRouting {
            arms: self.arms.clone(),
            admission: s.admission.clone(),
            options: RouterOptions {
                disc: DiscConfig { beta: s.beta, ..DiscConfig::default() },
                reassign: s.reassign,
                ..RouterOptions::default()
            },
            feedback: s.feedback,
            verifier_s: self.cfg.verifier_s,
            judge: s.judge.clone(),
            outcome_seed: seed,
            prior: if s.calibrated { taught(&self.prior, s.taught) } else { Vec::new() },
        };
        let cfg = run_cfg(s.scheduler, workers, seed);
        Ok(run_routed_agents_by_model(&programs.refs(), &self.pool, &cfg, &routing)?.1)
    }

    fn cell(
        &self,
        system: &str,
        workers: usize,
        s: &Setting,
        traces: &[(u64, Programs)],
        progress: &mut impl FnMut(&str),
    ) -> Result<ProgramsCell, AgentSimError> {
        let mut runs = Vec::new();
        for (seed, programs) in traces {
            runs.push(self.run(programs, *seed, workers, s)?);
            progress(&format!("oracle programs: {system} at {workers} (seed {seed})"));
        }
        Ok(mean_cell(&self.pool.name, system, workers, s.beta, runs))
    }
}

fn mean_cell(pool: &str, system: &str, concurrency: usize, beta: f64, runs: Vec<RoutedRunReport>) -> ProgramsCell {
    let n = runs.len().max(1) as f64;
    let m = |f: &dyn Fn(&RoutedRunReport) -> f64| runs.iter().map(f).sum::<f64>() / n;
    let arm = |r: &RoutedRunReport, k: usize| r.arms.get(k).cloned().unwrap_or_default();
    ProgramsCell {
        pool: pool.into(),
        system: system.into(),
        concurrency,
        beta,
        programs_per_hour: m(&|r| r.programs_per_hour),
        resolved: m(&|r| r.resolved as f64),
        resolved_per_hour: m(&|r| r.resolved_per_hour),
        larger_share: m(&|r| arm(r, 0).programs as f64 / r.programs.max(1) as f64),
        larger_hit_rate: m(&|r| arm(r, 0).cache_hit_rate),
        smaller_hit_rate: m(&|r| arm(r, 1).cache_hit_rate),
        larger_kv_peak: m(&|r| arm(r, 0).kv_usage_peak),
        larger_kv_full_at_s: {
            let at: Vec<f64> = runs.iter().filter_map(|r| arm(r, 0).kv_full_at_s).collect();
            (!at.is_empty()).then(|| at.iter().sum::<f64>() / at.len() as f64)
        },
        larger_kv_full_runs: runs.iter().filter(|r| arm(r, 0).kv_full_at_s.is_some()).count(),
        preemptions: m(&|r| r.arms.iter().map(|a| a.preemptions as f64).sum()),
        mean_call_latency_s: m(&|r| r.mean_call_latency_s),
        mean_admission_wait_s: m(&|r| r.mean_admission_wait_s),
        mean_start_wait_s: m(&|r| r.mean_start_wait_s),
        diverted: m(&|r| r.arms.iter().map(|a| a.diverted_in as f64).sum()),
        wrong_verdicts: m(&|r| r.wrong_verdicts as f64 / r.verdicts.max(1) as f64),
        makespan_s: m(&|r| r.makespan_s),
        runs,
    }
}

/// The outcomes of the first `n` calibration programs on each model (all with `None`).
fn taught(prior: &[PriorOutcome], n: Option<usize>) -> Vec<PriorOutcome> {
    let Some(n) = n else { return prior.to_vec() };
    let mut seen = [0usize; 2];
    prior
        .iter()
        .filter(|o| {
            let k = o.arm.min(1);
            seen[k] += 1;
            seen[k] <= n
        })
        .cloned()
        .collect()
}

/// The calibration passes' outcomes: each calibration program on each model alone — whether it
/// resolves there (its difficulty under the calibration seed against the model's success
/// rate, as in an evaluated run) and what its calls compute on that model (prompt tokens not in
/// the prefix cache — the earlier conversation is — plus reasoning and answer, at the model's
/// parameter count: [`call_cost`]). Larger model's first, then the smaller's.
fn prior_outcomes(arms: &[RoutedArm], calibration: &Programs) -> Vec<PriorOutcome> {
    let mut out = Vec::new();
    for (k, arm) in arms.iter().enumerate() {
        for (i, session) in calibration.for_model(k).sessions.iter().enumerate() {
            let cost = (0..session.turns.len())
                .map(|t| {
                    let turn = &session.turns[t];
                    let prompt = session.prompt_tokens(t);
                    call_cost(&arm.model, prompt, prompt - turn.new_tokens, turn.reasoning_tokens + turn.output_tokens)
                })
                .sum();
            let success = if task_difficulty(CALIBRATION_SEED, i) < arm.success { 1.0 } else { 0.0 };
            out.push(PriorOutcome { arm: k, success, cost });
        }
    }
    out
}

/// Calibrates the program layer on one pool: D₀ per model alone, the calibration passes'
/// outcomes (the calibrated learner's prior), then the static cap of each learner condition
/// from DISC's run at the calibration concurrency with that learner (all on the calibration
/// trace).
fn calibrate<'a>(
    cfg: &'a ProgramsBenchConfig,
    pool: AgentPoolSpec,
    workload: AgentWorkload,
    calibration: &Programs,
    progress: &mut impl FnMut(&str),
) -> Result<(Ctx<'a>, PoolCalibration), AgentSimError> {
    let c0 = [0, 1].map(|k| calibration.mean_peak_tokens(k));
    let mut d0 = [0.0; 2];
    for (k, replica) in pool.replicas.iter().enumerate() {
        let alone = AgentPoolSpec { name: replica.model.clone(), replicas: vec![replica.clone()] };
        let report = crate::sim::agentic::run_agents(
            calibration.for_model(k),
            &alone,
            &run_cfg(SchedulerKind::ThunderAgent, 16, CALIBRATION_SEED),
        )?;
        d0[k] = report.mean_latency_s;
    }
    let arms = arms(&pool, c0, d0);
    let prior = prior_outcomes(&arms, calibration);
    let ctx = Ctx { cfg, pool: pool.clone(), arms, prior: prior.clone() };
    // The static cap from DISC's run on the calibration trace, with the learner each condition
    // starts from. A model on which no program ever waited gave the rule no sample: its cap
    // never bound, so it is the calibration concurrency.
    let disc_run = |calibrated: bool| {
        let s = Setting { calibrated, ..Setting::system("oracle", [1, 1]) };
        ctx.run(calibration, CALIBRATION_SEED, cfg.calibration_concurrency, &s)
    };
    let cap_of = |disc: &RoutedRunReport| {
        [0, 1].map(|k| {
            disc.arms.get(k).map_or(1, |a| {
                if a.admitted_while_waiting > 0.0 {
                    (a.admitted_while_waiting.round() as usize).max(1)
                } else {
                    cfg.calibration_concurrency
                }
            })
        })
    };
    let disc = disc_run(false)?;
    let cap = cap_of(&disc);
    let cap_calibrated = cap_of(&disc_run(true)?);
    // Paper 002's own programs: ThunderAgent's larger-model hit rate against how much the
    // learner was taught (a baseline run on the calibration trace, never ORACLE's).
    let mut teaching_sweep = Vec::new();
    if workload == AgentWorkload::SweVerifiedThinking {
        let per_arm = calibration.for_model(0).sessions.len();
        let mut grid: Vec<usize> = (0..10.min(per_arm)).chain((1..=10).map(|step| per_arm * step / 10)).collect();
        grid.sort_unstable();
        grid.dedup();
        for n in grid {
            let s = Setting { calibrated: true, taught: Some(n), ..Setting::system("thunderagent", [1, 1]) };
            let r = ctx.run(calibration, CALIBRATION_SEED, TEACHING_SWEEP_CONCURRENCY, &s)?;
            teaching_sweep.push((n, r.arms.first().map_or(0.0, |a| a.cache_hit_rate)));
        }
    }
    progress(&format!(
        "oracle programs: {} calibrated: D0 {:.0} / {:.0} s, static cap {}/{} (calibrated learner {}/{})",
        pool.name, d0[0], d0[1], cap[0], cap[1], cap_calibrated[0], cap_calibrated[1]
    ));
    Ok((
        ctx,
        PoolCalibration {
            pool,
            workload,
            prior_peak_tokens: c0,
            prior_run_s: d0,
            static_cap: cap,
            static_cap_calibrated: cap_calibrated,
            allowance_tokens: disc.allowance_tokens,
            prior,
            teaching_sweep,
        },
    ))
}

/// Runs the three experiments; `progress` is told each finished run.
pub fn run_programs_bench(
    cfg: &ProgramsBenchConfig,
    mut progress: impl FnMut(&str),
) -> Result<ProgramsReport, AgentSimError> {
    // Per workload: the calibration trace on a seed never evaluated (c₀ from it) and the
    // evaluated traces.
    let workloads = |w: AgentWorkload| {
        let calibration = Programs::draw(w, cfg.programs, CALIBRATION_SEED);
        let traces: Vec<(u64, Programs)> = cfg.seeds.iter().map(|&s| (s, Programs::draw(w, cfg.programs, s))).collect();
        (calibration, traces)
    };
    let (calibration, traces) = workloads(AgentWorkload::SweVerified);
    let c0 = calibration.mean_peak_tokens(0);
    let thinking = workloads(AgentWorkload::SweVerifiedThinking);
    let mut pools = Vec::new();
    let mut admission = Vec::new();
    let mut admission_calibrated = Vec::new();
    let mut feedback = Vec::new();
    let mut beta_sweep = Vec::new();
    let mut verifiers = Vec::new();
    for (k, &(device, models, state, workload)) in POOLS.iter().enumerate() {
        let (calibration, traces) = match workload {
            AgentWorkload::SweVerifiedThinking => (&thinking.0, &thinking.1),
            _ => (&calibration, &traces),
        };
        let pool = pool_for(device, models, state, workload);
        let (ctx, cal) = calibrate(cfg, pool, workload, calibration, &mut progress)?;
        let (cap, cap_calibrated) = (cal.static_cap, cal.static_cap_calibrated);
        pools.push(cal);
        for &c in &cfg.concurrency {
            for system in SYSTEMS {
                admission.push(ctx.cell(system, c, &Setting::system(system, cap), traces, &mut progress)?);
            }
        }
        for &c in &cfg.concurrency {
            for system in SYSTEMS {
                let s = Setting { calibrated: true, ..Setting::system(system, cap_calibrated) };
                admission_calibrated.push(ctx.cell(system, c, &s, traces, &mut progress)?);
            }
        }
        if k > 0 {
            continue;
        }
        // Feedback handling on ThunderAgent's proxy without admission control: the modes differ
        // only in when slots start programs and which learner sees which verdict.
        for &c in &cfg.feedback_concurrency {
            for mode in [Feedback::Delayed, Feedback::BatchSynchronous, Feedback::Independent] {
                let s = Setting { feedback: mode, ..Setting::system("thunderagent", cap) };
                feedback.push(ctx.cell(mode.name(), c, &s, traces, &mut progress)?);
            }
        }
        let c = cfg.calibration_concurrency;
        for &beta in &cfg.betas {
            let s = Setting { beta, ..Setting::system("oracle", cap) };
            beta_sweep.push(ctx.cell("oracle", c, &s, traces, &mut progress)?);
        }
        let s = Setting { feedback: Feedback::Independent, ..Setting::system("thunderagent", cap) };
        beta_sweep.push(ctx.cell("independent", c, &s, traces, &mut progress)?);
        // The verifier: the task's harness, or an LLM judge on either model (its calls run on
        // the pool beside the programs').
        let c = cfg.verifier_concurrency;
        verifiers.push(ctx.cell("harness", c, &Setting::system("oracle", cap), traces, &mut progress)?);
        for model in [SMALLER, LARGER] {
            let judge = Judge {
                model: model.into(),
                prompt_tokens: cfg.judge_prompt_tokens,
                output_tokens: cfg.judge_output_tokens,
                error: cfg.judge_error,
            };
            let s = Setting { judge: Some(judge), ..Setting::system("oracle", cap) };
            verifiers.push(ctx.cell(&format!("judge:{model}"), c, &s, traces, &mut progress)?);
        }
    }
    Ok(ProgramsReport {
        config: cfg.clone(),
        prior_peak_tokens: c0,
        pools,
        admission,
        admission_calibrated,
        feedback,
        beta_sweep,
        verifiers,
    })
}

impl ProgramsReport {
    fn find<'a>(cells: &'a [ProgramsCell], pool: &str, system: &str, c: usize) -> Option<&'a ProgramsCell> {
        cells.iter().find(|x| x.pool == pool && x.system == system && x.concurrency == c)
    }

    /// ORACLE's program throughput over ThunderAgent's on `pool` at concurrency `c`, with a cold
    /// learner or (`calibrated`) one taught the calibration passes.
    pub fn throughput_ratio(&self, pool: &str, c: usize, calibrated: bool) -> Option<f64> {
        let cells = if calibrated { &self.admission_calibrated } else { &self.admission };
        let o = Self::find(cells, pool, "oracle", c)?;
        let t = Self::find(cells, pool, "thunderagent", c)?;
        (t.programs_per_hour > 0.0).then(|| o.programs_per_hour / t.programs_per_hour)
    }

    /// Delayed feedback's throughput over batch-synchronous dispatch's at concurrency `c`.
    pub fn delayed_ratio(&self, c: usize) -> Option<f64> {
        let pool = self.pools.first()?.pool.name.as_str();
        let d = Self::find(&self.feedback, pool, "delayed", c)?;
        let b = Self::find(&self.feedback, pool, "batch-synchronous", c)?;
        (b.programs_per_hour > 0.0).then(|| d.programs_per_hour / b.programs_per_hour)
    }

    /// The Markdown section.
    pub fn markdown(&self) -> String {
        let mut o = String::new();
        let c = &self.config;
        let _ = writeln!(o, "## Routed programs under concurrency (Figures 5–7)\n");
        let _ = writeln!(
            o,
            "{} SWE-bench-Verified-like programs per cell (`agentic::generate`, the TAO bench's generator), plan \
             seeds {:?} (each draws the trace, the outcomes and the engine noise), means over them; every system \
             runs the same traces. Pools: two GPUs, one replica each: the dense pair {LARGER} in FP8 in the 27B's \
             role and {SMALLER} in BF16 in the 9B's, or paper 002's own hybrid-attention pair {HYBRID_LARGER} in \
             FP8 and {HYBRID_SMALLER} in BF16, whose every running request holds its linear-attention layers' \
             state (from their configs: {} and {} tokens of their BF16 KV caches). A program resolves its task with paper 002's single-model accuracies for its \
             pair ({:.0} % on the larger, {:.0} % on the smaller), nested by difficulty. Verifier time {:.0} s \
             per program (an assumption for the SWE-bench harness's run, not measured here). DISC's priors come \
             from calibration passes on seed {CALIBRATION_SEED}: c₀ = {:.0} tokens (the mean over the \
             trace's programs of their largest call's context — prompt, reasoning, answer — what a proxy \
             counts; per pool in the table below), D₀ per model from that trace run on the model alone (ThunderAgent, 16 concurrent); the \
             static cap is DISC's mean admitted count over the time programs waited ({} concurrent, seed \
             {CALIBRATION_SEED}), rounded — the paper's rule (a model on which no program waited gives the \
             rule no sample: its cap is the calibration concurrency, never binding there). The dense larger model's KV cache is FP8 as \
             well (vLLM `--kv-cache-dtype fp8`), the hybrid one's BF16 (vLLM's default for an FP8 checkpoint, \
             with half the KV tokens). ThunderAgent's proxy, which the static cap, admission only and ORACLE \
             also sit on, runs as paper 002 ran it: Δt = 5 s, priority decay on (at resume an acting \
             program's tokens count 2^−t, t seconds since its last response). *Admission \
             wait*: binding → the ledger's or the cap's admission (0 without admission control); *start \
             wait*: binding → first request dispatched, which also counts ThunderAgent's hold of new \
             programs — the comparable column. *Larger KV peak*: the larger model's highest KV-cache usage \
             (vLLM's `kv_cache_usage_perc`, sampled each second); *larger KV full at*: when it first reached \
             95 % (paper 002 Fig. 2c).\n",
            c.programs,
            c.seeds,
            state_tokens(HYBRID_LARGER, Dtype::Fp8, Dtype::Bf16),
            state_tokens(HYBRID_SMALLER, Dtype::Bf16, Dtype::Bf16),
            SUCCESS_LARGER * 100.0,
            SUCCESS_SMALLER * 100.0,
            c.verifier_s,
            self.prior_peak_tokens,
            c.calibration_concurrency,
        );
        let _ = writeln!(
            o,
            "The pool whose name ends in `{}` runs paper 002's own programs instead (`agentic::generate`, \
             `workflows/traces/README.md`): every call of the thinking model writes reasoning before its \
             answer — decoded, held in the KV cache while the call runs, dropped from the conversation after \
             it. Four knobs are fitted on the calibration trace to four numbers paper 002 measured on its \
             baselines and calibration passes (GH200 pair), never on an ORACLE run: the calls per program to \
             ThunderAgent's mean call latency at 64 concurrent programs (10.9 s), the observation sizes to the \
             27B's c₀ (22.6k tokens), the reasoning per call to the 27B's D (642 s, here its D₀), and the \
             calls the 9B needs for the same program (× {}: each program runs on the 9B as its 27B version \
             continued, `agentic::generate_with_steps`) to the 9B's c₀ (44.7k). The 9B's D (paper: 639 s) is \
             not fitted: the table's D₀ smaller is the check.\n",
            AgentWorkload::SweVerifiedThinking.name(),
            AgentWorkload::SweVerifiedThinking.smaller_model_steps(),
        );
        let _ = writeln!(
            o,
            "| pool | c₀ tokens (larger / smaller where they differ) | D₀ larger s | D₀ smaller s | static cap | DISC's learned δ̂ (tokens per running request) |\n|---|---:|---:|---:|---|---|"
        );
        for p in &self.pools {
            let d: Vec<String> = p.allowance_tokens.iter().map(|a| format!("{a:.0}")).collect();
            let [larger, smaller] = p.prior_peak_tokens;
            let c0 = if larger == smaller { format!("{larger:.0}") } else { format!("{larger:.0} / {smaller:.0}") };
            let _ = writeln!(
                o,
                "| {} | {c0} | {:.0} | {:.0} | {}/{} | {} |",
                p.pool.name,
                p.prior_run_s[0],
                p.prior_run_s[1],
                p.static_cap[0],
                p.static_cap[1],
                d.join(" / ")
            );
        }
        let _ = writeln!(o);
        let table = |o: &mut String, cells: &[ProgramsCell], first: &str| {
            let _ = writeln!(
                o,
                "| pool | {first} | concurrent | programs/h | resolved | resolved/h | larger share | larger hit | \
                 smaller hit | larger KV peak | larger KV full at s | preemptions | call latency s | admission wait s | start wait s | diverted |"
            );
            let _ = writeln!(o, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
            for x in cells {
                let label = if first == "β" && x.system == "oracle" {
                    format!("oracle β = {}", x.beta)
                } else {
                    x.system.clone()
                };
                let full = match x.larger_kv_full_at_s {
                    Some(at) if x.larger_kv_full_runs < x.runs.len() => format!("{at:.0} ({} of {} seeds)", x.larger_kv_full_runs, x.runs.len()),
                    Some(at) => format!("{at:.0}"),
                    None => "never".into(),
                };
                let _ = writeln!(
                    o,
                    "| {} | {label} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.3} | {:.3} | {:.2} | {full} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                    x.pool,
                    x.concurrency,
                    x.programs_per_hour,
                    x.resolved,
                    x.resolved_per_hour,
                    x.larger_share,
                    x.larger_hit_rate,
                    x.smaller_hit_rate,
                    x.larger_kv_peak,
                    x.preemptions,
                    x.mean_call_latency_s,
                    x.mean_admission_wait_s,
                    x.mean_start_wait_s,
                    x.diverted,
                );
            }
            let _ = writeln!(o);
        };
        let _ = writeln!(
            o,
            "### Admission under concurrency (Fig. 6, Table 4)\n\nEvery system routes with the same learner \
             (LinUCB, delayed feedback). `vllm`: stock vLLM with prefix caching, no admission control; \
             `thunderagent`: ThunderAgent's proxy (Δt = 5 s; pauses programs against its token-sum KV model); \
             `static-cap`: the proxy with at most the cap's programs per model; `admission-only`: the proxy with \
             DISC's ledger, no reassignment; `oracle`: DISC with the divert rule (β = 0.5, w₀ = 600 s). Two \
             learner conditions, each system in both: *cold* — the learner has seen no verdict when the first \
             program arrives, so the first programs of a run are bound before any feedback and spread over both \
             models; *calibrated* — every system's learner is first taught the calibration passes' outcomes \
             (each of the {} calibration programs on each model alone: resolved or not — its compute, inert at \
             the cost weight 0 of these runs, too; seed \
             {CALIBRATION_SEED}, never evaluated), a router that has learned which model resolves more, the \
             condition of paper 002's Fig. 2c (\"a router that learns such preferences can concentrate tasks on \
             one model, filling its backend's KV cache\"). The static cap is fixed per condition from DISC's \
             calibration run with that learner (table above: cold; calibrated: {}). The paper does not say \
             whether its Fig. 6 learner started cold.\n",
            c.programs,
            self.pools
                .iter()
                .map(|p| format!("{} {}/{}", p.pool.name, p.static_cap_calibrated[0], p.static_cap_calibrated[1]))
                .collect::<Vec<_>>()
                .join("; "),
        );
        for (calibrated, cells, title) in [
            (false, &self.admission, "Cold learner"),
            (true, &self.admission_calibrated, "Calibrated learner (taught the calibration passes' outcomes)"),
        ] {
            let _ = writeln!(o, "#### {title}\n");
            table(&mut o, cells, "system");
            for p in &self.pools {
                for &k in &c.concurrency {
                    if let Some(r) = self.throughput_ratio(&p.pool.name, k, calibrated) {
                        let _ = writeln!(
                            o,
                            "- {}, {k} concurrent: ORACLE / ThunderAgent program throughput {r:.2}×",
                            p.pool.name
                        );
                    }
                }
            }
            let _ = writeln!(o);
            // Fig. 2c's load imbalance: how full the larger model's cache got without load-aware
            // admission, where the paper's was full within minutes.
            for p in &self.pools {
                if let Some(x) = Self::find(cells, &p.pool.name, "vllm", 64) {
                    let full = x
                        .larger_kv_full_at_s
                        .map_or("never full".to_string(), |at| format!("first full (≥ 95 %) at {at:.0} s"));
                    let _ = writeln!(
                        o,
                        "- {}, stock vLLM at 64: larger share {:.2}; the larger model's KV cache peaks at {:.0} % \
                         ({full}); hit rate {:.2}; {:.1} preemptions",
                        p.pool.name,
                        x.larger_share,
                        100.0 * x.larger_kv_peak,
                        x.larger_hit_rate,
                        x.preemptions
                    );
                }
            }
            let _ = writeln!(o);
        }
        for p in self.pools.iter().filter(|p| !p.teaching_sweep.is_empty()) {
            let _ = writeln!(
                o,
                "Why neither learner condition is the paper's ThunderAgent ({}): its larger-model hit rate at \
                 {TEACHING_SWEEP_CONCURRENCY} concurrent programs on the calibration trace, with the learner taught \
                 the outcomes of the first n of the {} calibration programs on each model — {} — against the \
                 paper's {PAPER_THUNDERAGENT_HIT_RATE}.\n",
                p.pool.name,
                c.programs,
                p.teaching_sweep.iter().map(|(n, h)| format!("n = {n}: {h:.3}")).collect::<Vec<_>>().join(", "),
            );
        }
        let _ = writeln!(
            o,
            "Paper 002: 1.8× at 64 concurrent on the GH200 pair, 1.3–1.5× on the H200 pair; 27B prefix-cache \
             hit rate 0.93 (ORACLE) vs 0.73 (ThunderAgent), 0.72 (vLLM), 0.87 (static cap). Goal: ≥ 1.5× at 64, \
             hit rate ≥ 0.9 on the larger model.\n"
        );
        let _ = writeln!(
            o,
            "Paper 002 Fig. 2c (64 SWE-bench Verified programs routed without regard to load, GH200 pair): the 27B \
             \"approaches full KV-cache capacity after approximately 6.8 minutes\" (≈ 408 s) and its prefix-cache hit \
             rate falls to near zero, while the 9B reaches at most 33 %. Where the larger model's cache never fills, \
             no admission control has cache contention to remove, and ORACLE can gain only by its divert rule.\n"
        );
        let _ = writeln!(
            o,
            "### Feedback handling (Fig. 5; {}, ThunderAgent's proxy, no admission control)\n",
            self.pools.first().map_or("", |p| p.pool.name.as_str())
        );
        table(&mut o, &self.feedback, "feedback");
        for &k in &c.feedback_concurrency {
            if let Some(r) = self.delayed_ratio(k) {
                let _ = writeln!(o, "- {k} concurrent: delayed / batch-synchronous throughput {r:.2}×");
            }
        }
        let _ = writeln!(o, "\nPaper 002: 1.7× at 32 concurrent. Goal: ≥ 1.5×.\n");
        let _ = writeln!(
            o,
            "### β sweep (Fig. 7b; {}, {} concurrent; `independent`: per-slot learners on the proxy)\n",
            self.pools.first().map_or("", |p| p.pool.name.as_str()),
            c.calibration_concurrency
        );
        table(&mut o, &self.beta_sweep, "β");
        let _ = writeln!(
            o,
            "### Verifier: the harness or an LLM judge ({}, ORACLE, {} concurrent)\n\n`harness`: the task's own \
             tests, {:.0} s after the program ends, always right. `judge:<model>`: one call per finished program \
             on that model's replica, beside the programs' own calls (prompt: the transcript up to {} tokens; \
             answer {} tokens), its verdict wrong with probability {:.2} (Zheng et al. 2023: GPT-4 agreed with \
             human experts on 85 % of non-tied MT-Bench pairs; an assumption here).\n",
            self.pools.first().map_or("", |p| p.pool.name.as_str()),
            c.verifier_concurrency,
            c.verifier_s,
            c.judge_prompt_tokens,
            c.judge_output_tokens,
            c.judge_error,
        );
        table(&mut o, &self.verifiers, "verifier");
        let _ = writeln!(o, "Wrong verdicts (share of landed verdicts):");
        for x in &self.verifiers {
            let _ = writeln!(o, "- {}: {:.3}", x.system, x.wrong_verdicts);
        }
        o
    }
}

/// Why [`programs_svg`] drew no chart.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// The report holds nothing to draw.
    #[error("the report has no pool")]
    Empty,
    /// Plotters failed to draw (its message).
    #[error("{0}")]
    Draw(String),
}

/// The program experiments as SVG (plotters): program throughput against concurrency per
/// system on each pool (Fig. 6's shape: the dense H100 and H200 pairs, the dense pair with the
/// measured state, the hybrid pair), per feedback mode (Fig. 5's), and resolved tasks against
/// throughput over the β sweep (Fig. 7b's), and paper 002's own programs with the calibrated
/// learner (panel h). Legends sit above the data (the y range leaves them a band).
pub fn programs_svg(r: &ProgramsReport) -> Result<String, ChartError> {
    use plotters::prelude::*;
    let s = |e: &dyn std::fmt::Display| ChartError::Draw(e.to_string());
    let Some(pool) = r.pools.first().map(|p| p.pool.name.clone()) else {
        return Err(ChartError::Empty);
    };
    let palette = crate::report::timeline::PALETTE;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1100, 1720)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| s(&e))?;
        let panels = root.split_evenly((4, 2));
        // Panels (a) and (b): lines of programs/h over concurrency.
        let lines = |area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
                     title: &str,
                     cells: &[ProgramsCell],
                     pool: &str,
                     names: &[&str]|
         -> Result<(), ChartError> {
            let cells: Vec<&ProgramsCell> = cells.iter().filter(|c| c.pool == pool).collect();
            let xs: Vec<usize> = {
                let mut v: Vec<usize> = cells.iter().map(|c| c.concurrency).collect();
                v.sort_unstable();
                v.dedup();
                v
            };
            let xmin = *xs.first().unwrap_or(&0) as f64;
            let xmax = (*xs.last().unwrap_or(&1) as f64).max(xmin + 1.0);
            let ymax = cells.iter().map(|c| c.programs_per_hour).fold(1.0, f64::max) * 1.45;
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 15))
                .margin(12)
                .x_label_area_size(34)
                .y_label_area_size(50)
                .build_cartesian_2d(xmin - 2.0..xmax + 2.0, 0.0..ymax)
                .map_err(|e| s(&e))?;
            chart
                .configure_mesh()
                .x_desc("concurrent programs")
                .y_desc("programs per hour")
                .draw()
                .map_err(|e| s(&e))?;
            for (k, name) in names.iter().enumerate() {
                let color = palette[k % palette.len()];
                let mut pts: Vec<(f64, f64)> = cells
                    .iter()
                    .filter(|c| c.system == *name)
                    .map(|c| (c.concurrency as f64, c.programs_per_hour))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .map_err(|e| s(&e))?
                    .label(name.to_string())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(|e| s(&e))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| s(&e))?;
            Ok(())
        };
        lines(&panels[0], &format!("(a) admission · {pool}"), &r.admission, &pool, &SYSTEMS)?;
        // The pools with a per-request state (the counterfactual on the dense pair, paper 002's
        // own hybrid pair, on the TAO bench's programs and on paper 002's thinking programs),
        // when they ran: panels (e), (f) and (g).
        for (k, p) in r.pools.iter().filter(|p| is_hybrid(&p.pool)).take(3).enumerate() {
            let name = p.pool.name.clone();
            let title = format!("({}) admission · {name}", ['e', 'f', 'g'][k]);
            lines(&panels[4 + k], &title, &r.admission, &name, &SYSTEMS)?;
        }
        // Panel (h): paper 002's own programs with the calibrated learner (Fig. 2c's condition).
        if let Some(p) = r.pools.iter().find(|p| p.workload == AgentWorkload::SweVerifiedThinking) {
            let name = p.pool.name.clone();
            let title = format!("(h) admission · {name} · calibrated learner");
            lines(&panels[7], &title, &r.admission_calibrated, &name, &SYSTEMS)?;
        }
        // Panel (b): the H200 pair, when it ran.
        if let Some(p) = r.pools.get(1).filter(|p| !is_hybrid(&p.pool)) {
            let name = p.pool.name.clone();
            lines(&panels[1], &format!("(b) admission · {name}"), &r.admission, &name, &SYSTEMS)?;
        }
        lines(
            &panels[2],
            &format!("(c) feedback · {pool}"),
            &r.feedback,
            &pool,
            &[Feedback::Delayed.name(), Feedback::BatchSynchronous.name(), Feedback::Independent.name()],
        )?;
        // Panel (d): resolved tasks against throughput, one point per β (and independent).
        let cells = &r.beta_sweep;
        let xmax = cells.iter().map(|c| c.programs_per_hour).fold(1.0, f64::max) * 1.15;
        let xmin = cells.iter().map(|c| c.programs_per_hour).fold(f64::INFINITY, f64::min).min(xmax) * 0.85;
        let ymin = cells.iter().map(|c| c.resolved).fold(f64::INFINITY, f64::min).min(1e9) - 3.0;
        let ymax = cells.iter().map(|c| c.resolved).fold(0.0, f64::max) + 3.0;
        let mut chart = ChartBuilder::on(&panels[3])
            .caption(format!("(d) β sweep · {} concurrent", r.config.calibration_concurrency), ("sans-serif", 15))
            .margin(12)
            .x_label_area_size(34)
            .y_label_area_size(50)
            .build_cartesian_2d(xmin..xmax, ymin.max(0.0)..ymax)
            .map_err(|e| s(&e))?;
        chart
            .configure_mesh()
            .x_desc("programs per hour")
            .y_desc("resolved tasks (mean per run)")
            .draw()
            .map_err(|e| s(&e))?;
        for (k, c) in cells.iter().enumerate() {
            let color = palette[k % palette.len()];
            let label = if c.system == "oracle" { format!("β = {}", c.beta) } else { c.system.clone() };
            let p = (c.programs_per_hour, c.resolved);
            chart
                .draw_series(std::iter::once(Circle::new(p, 5, color.filled())))
                .map_err(|e| s(&e))?
                .label(label)
                .legend(move |(x, y)| Circle::new((x + 8, y), 4, color.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| s(&e))?;
        root.present().map_err(|e| s(&e))?;
    }
    Ok(svg)
}
