//! The bench harness (`switchyard bench`): paper 003's evaluation (§4.2–4.5) reproduced on the
//! emulated pool, as a library.
//!
//! A [`BenchConfig`] names the workflows, sessions per workflow, pool, arrival processes, trace
//! seed and repetitions, the policies, the ablations and the predictor substitutions. Every
//! (arrival × variant × repetition) is one independent simulation — same trace, engine-noise
//! seed = repetition index — run on a small pool of std threads. Runs are aggregated into
//! means per (variant, arrival) and compared with the offline lower bound of each trace
//! ([`crate::lower_bound`]). The result, [`BenchReport`], serialises to the JSON shape;
//! [`markdown`] renders the tables of Figures 5–7 and [`write_outputs`] writes the report, the
//! JSON and one SVG chart per figure.
//!
//! **Model paths.** Every workflow of the paper uses both Qwen3-4B and Qwen3-8B, so "sessions
//! of workflows that use the model" would repeat the overall numbers. A session's *Qwen3-4B
//! path* instead ends when its last call on Qwen3-4B finishes (QMSum: its 4B lanes; MBPP: its
//! last 4B repair step), and so on per model: the path makespan is first arrival → last such
//! finish, the path latency is arrival → that finish, over completed sessions that called the
//! model. This is the paper's "model-scoped completion" (§4.2: it includes DAG dependencies,
//! queueing, loading and execution).
//!
//! Depends on the simulator shell, the reports and the lower bound; not on the CLI.

mod charts;
pub mod goals;
mod markdown;
mod paper;
pub mod motivation;
pub mod oracle;
pub mod oracle_programs;
pub mod oracle_replay;
pub mod tao;
pub mod predictor_eval;
pub mod verifier;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use thiserror::Error;

pub use markdown::markdown;

use crate::exec::{Arrival, CallRecord, PoolSpec, RunConfig};
use crate::lower_bound::{self, LowerBound, LowerBoundError, TraceTimes};
use crate::planner::JointOptions;
use crate::report::{GpuBreakdown, Percentiles, RunReport, round3};
use crate::sim::{self, SimError};
use crate::workflow::WorkflowSpec;

/// Why a bench could not complete.
#[derive(Debug, Error)]
pub enum BenchError {
    #[error("bench configuration: {0}")]
    Config(String),
    #[error("run `{variant}` ({arrival}, noise seed {noise_seed}): {source}")]
    Run { variant: String, arrival: String, noise_seed: u64, source: Box<SimError> },
    #[error("lower bound of the {arrival} trace: {source}")]
    Bound { arrival: String, source: LowerBoundError },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: cannot draw: {message}")]
    Chart { path: PathBuf, message: String },
    #[error("cannot serialise the report: {0}")]
    Json(#[from] serde_json::Error),
    #[error("a bench worker stopped without a result for run {0}")]
    Lost(usize),
}

/// What a row of the report compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VariantKind {
    /// A scheduling policy with the default predictor (Figure 5, 6).
    Policy,
    /// The joint policy with one mechanism switched off (Figure 7).
    Ablation,
    /// The joint policy planning with another predictor (Figure 7).
    Predictor,
    /// A policy on the substrate that can sleep (`--sleep`): beyond paper 003, reported apart.
    Sleep,
}

/// One configuration under comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    /// Row label: the policy name, `no-fusion`, `predictor:gbdt`, …
    pub label: String,
    pub kind: VariantKind,
    pub policy: String,
    pub options: JointOptions,
    pub predictor: String,
    /// The substrate reclaims by vLLM sleep mode (`--sleep`) instead of unloading.
    pub sleep_substrate: bool,
}

impl Variant {
    /// Runs of variants with the same key are the same simulation (every option is in it).
    fn key(&self) -> (String, JointOptions, bool, String) {
        (self.policy.clone(), self.options, self.sleep_substrate, self.predictor.clone())
    }
}

/// Everything a bench needs.
#[derive(Clone)]
pub struct BenchConfig {
    pub workflows: Vec<Arc<WorkflowSpec>>,
    /// Sessions per workflow.
    pub sessions: usize,
    pub pool: PoolSpec,
    pub arrivals: Vec<Arrival>,
    /// Trace (and responder) seed, shared by every run.
    pub seed: u64,
    /// Runs per (variant, arrival), with engine-noise seeds `0..repetitions`; means are reported.
    pub repetitions: u64,
    /// Policies compared in Figures 5 and 6.
    pub policies: Vec<String>,
    /// Whether to run the three ablations of the joint policy (Figure 7).
    pub ablations: bool,
    /// The predictor every run plans with, unless it is a substitution.
    pub predictor: String,
    /// Predictor substitutions of the joint policy (Figure 7): one row per name.
    pub predictors: Vec<String>,
    /// Models whose paths get their own rows in Figure 5 (catalogue names).
    pub path_models: Vec<String>,
    /// Simulations run at once (std threads).
    pub workers: usize,
    /// vLLM `--max-num-seqs` of every replica.
    pub max_num_seqs: u32,
    /// Whether to run the policies again on the substrate that sleeps (`--sleep`), with joint's
    /// `--no-sleep` ablation: the three-state lifecycle, beyond the paper, reported apart.
    pub sleep: bool,
}

impl BenchConfig {
    /// The paper's evaluation (§4.1–4.2): 60 sessions per workflow, arrivals burst,
    /// `poisson:0.150` and `poisson:0.075`, trace seed 42, five repetitions, `parrot`, `kairos`
    /// and `joint`, the three ablations, the `oracle` predictor, Qwen3-4B and Qwen3-8B paths,
    /// two workers, 256 sequences per replica.
    pub fn paper(workflows: Vec<Arc<WorkflowSpec>>, pool: PoolSpec) -> Self {
        BenchConfig {
            workflows,
            sessions: 60,
            pool,
            arrivals: vec![Arrival::Burst, Arrival::Poisson(0.150), Arrival::Poisson(0.075)],
            seed: 42,
            repetitions: 5,
            policies: ["parrot", "kairos", "joint"].map(String::from).to_vec(),
            ablations: true,
            predictor: "oracle".into(),
            predictors: vec!["oracle".into()],
            path_models: ["Qwen3-4B", "Qwen3-8B"].map(String::from).to_vec(),
            workers: 2,
            max_num_seqs: 256,
            sleep: true,
        }
    }

    /// One repetition, burst only.
    pub fn quick(mut self) -> Self {
        self.repetitions = 1;
        self.arrivals = vec![Arrival::Burst];
        self.sleep = false;
        self
    }

    /// The rows of the report, in order: policies, ablations, predictor substitutions.
    pub fn variants(&self) -> Vec<Variant> {
        let full = JointOptions::default();
        let mut v: Vec<Variant> = self
            .policies
            .iter()
            .map(|p| Variant {
                label: p.clone(),
                kind: VariantKind::Policy,
                policy: p.clone(),
                options: full,
                predictor: self.predictor.clone(),
                sleep_substrate: false,
            })
            .collect();
        if self.ablations {
            let ablated = [
                ("no-fusion", JointOptions { fusion: false, ..full }),
                ("no-prefetch", JointOptions { prefetch: false, ..full }),
                ("per-workflow-lifecycle", JointOptions { shared_lifecycle: false, ..full }),
                ("resource-order", JointOptions { resource_order: true, ..full }),
                ("history-admission", JointOptions { history_admission: true, ..full }),
                ("no-tao-admission", JointOptions { tao_admission: false, ..full }),
                ("no-drain", JointOptions { drain: false, ..full }),
                ("no-outlook", JointOptions { outlook: false, ..full }),
                ("fifo-rank", JointOptions { critical_path_rank: false, ..full }),
            ];
            for (label, options) in ablated {
                v.push(Variant {
                    label: label.into(),
                    kind: VariantKind::Ablation,
                    policy: "joint".into(),
                    options,
                    predictor: self.predictor.clone(),
                    sleep_substrate: false,
                });
            }
        }
        for p in &self.predictors {
            v.push(Variant {
                label: format!("predictor:{p}"),
                kind: VariantKind::Predictor,
                policy: "joint".into(),
                options: full,
                predictor: p.clone(),
                sleep_substrate: false,
            });
        }
        if self.sleep {
            let mut rows: Vec<(String, String, JointOptions)> =
                self.policies.iter().map(|p| (format!("sleep:{p}"), p.clone(), full)).collect();
            if self.policies.iter().any(|p| p == "joint") {
                rows.push(("sleep:joint-no-sleep".into(), "joint".into(), JointOptions { sleep: false, ..full }));
            }
            for (label, policy, options) in rows {
                v.push(Variant {
                    label,
                    kind: VariantKind::Sleep,
                    policy,
                    options,
                    predictor: self.predictor.clone(),
                    sleep_substrate: true,
                });
            }
        }
        v
    }

    fn validate(&self) -> Result<(), BenchError> {
        let bad = |m: &str| Err(BenchError::Config(m.to_string()));
        if self.workflows.is_empty() {
            return bad("no workflow");
        }
        if self.sessions == 0 {
            return bad("sessions per workflow must be at least 1");
        }
        if self.repetitions == 0 {
            return bad("repetitions must be at least 1");
        }
        if self.arrivals.is_empty() {
            return bad("no arrival process");
        }
        if self.variants().is_empty() {
            return bad("no policy, ablation or predictor to compare");
        }
        let mut labels: Vec<String> = self.variants().into_iter().map(|v| v.label).collect();
        labels.sort();
        if labels.windows(2).any(|w| w[0] == w[1]) {
            return bad("a policy or predictor is listed twice");
        }
        Ok(())
    }

    fn sim_config(&self, v: &Variant, arrival: Arrival, noise_seed: u64) -> RunConfig {
        RunConfig {
            workflows: self.workflows.clone(),
            sessions: self.sessions,
            arrival,
            seed: self.seed,
            noise_seed,
            pool: self.pool.clone(),
            policy: v.policy.clone(),
            options: v.options,
            predictor: v.predictor.clone(),
            // Bench runs are already parallel; one tool thread per run keeps them within the
            // machine's cores.
            tool_workers: 1,
            max_num_seqs: self.max_num_seqs,
            substrate: crate::planner::Substrate {
                reclaim: if v.sleep_substrate { crate::planner::Reclaim::Sleep } else { crate::planner::Reclaim::Unload },
                ..Default::default()
            },
            session_counts: Vec::new(),
            workflow_arrivals: Vec::new(),
            handoff_s: crate::exec::FRAMEWORK_HANDOFF_S,
            routing: Default::default(),
        }
    }
}

/// Completion on one model's path (see the module doc), mean over repetitions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathMetrics {
    pub makespan_s: f64,
    pub latency_s: Percentiles,
    /// Completed sessions that called the model.
    pub sessions: f64,
    pub ratio_to_lower_bound: Option<f64>,
}

/// One workflow's slice of a row, mean over repetitions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchWorkflow {
    pub sessions_completed: f64,
    pub sessions_failed: f64,
    pub makespan_s: f64,
    pub latency_s: Percentiles,
    pub gpu_seconds_per_session: GpuBreakdown,
    pub accuracy: Option<f64>,
}

/// One row: a variant under one arrival process, mean over repetitions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchRun {
    pub policy: String,
    pub variant: String,
    pub kind: VariantKind,
    pub predictor: String,
    pub arrival: String,
    pub repetitions: usize,
    pub makespan_s: f64,
    /// Makespan of each repetition (noise seed = index).
    pub makespan_runs_s: Vec<f64>,
    pub latency_s: Percentiles,
    pub gpu_seconds_per_session: GpuBreakdown,
    pub workflows: BTreeMap<String, BenchWorkflow>,
    pub paths: BTreeMap<String, PathMetrics>,
    pub ratio_to_lower_bound: f64,
    pub sessions_completed: f64,
    pub sessions_failed: f64,
    pub loads: f64,
    /// Near-ready prefetch checks per run, by outcome.
    pub prefetch: PrefetchMeans,
    /// Units with a fusible successor per run, by what became of their chain.
    pub fusion: FusionMeans,
    pub evictions: f64,
    /// Replicas put to sleep, and sleepers woken, per run (zero off the substrate that sleeps).
    pub sleeps: f64,
    pub wakes: f64,
    pub preemptions: f64,
}

/// A row's near-ready prefetch checks per run by outcome, means over the repetitions (see
/// `planner::PrefetchChecks`: one check per near-ready model per planning tick).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PrefetchMeans {
    pub issued: f64,
    pub resident: f64,
    pub no_capacity: f64,
    pub not_timely: f64,
    pub refused: f64,
}

/// A row's units with a fusible successor per run, means over the repetitions (see
/// `planner::FusionChecks`: once per such unit at its dispatch; zero for a policy that does not
/// fuse).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct FusionMeans {
    pub fused: f64,
    pub over_context: f64,
}

/// What was run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchSetup {
    pub workflows: Vec<String>,
    pub sessions_per_workflow: usize,
    pub pool: String,
    pub gpus: usize,
    pub arrivals: Vec<String>,
    pub seed: u64,
    pub repetitions: u64,
    pub predictor: String,
    pub max_num_seqs: u32,
    pub simulations: usize,
}

/// The bench result (`switchyard bench --json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    pub setup: BenchSetup,
    pub runs: Vec<BenchRun>,
    /// Makespan lower bound per arrival process.
    pub lower_bound_s: BTreeMap<String, f64>,
    /// The bound's parts per arrival process.
    pub lower_bounds: BTreeMap<String, LowerBound>,
    /// The open issues' numeric goals, checked on these runs ([`goals::check`]).
    pub goals: Vec<goals::Goal>,
}

impl BenchReport {
    /// The row of `variant` under `arrival`.
    pub fn row(&self, variant: &str, arrival: &str) -> Option<&BenchRun> {
        self.runs.iter().find(|r| r.variant == variant && r.arrival == arrival)
    }
}

/// What one simulation leaves for aggregation.
struct RunSummary {
    report: RunReport,
    /// Per path model: (last finish − first arrival, latencies of completed sessions).
    paths: BTreeMap<String, (f64, Vec<f64>)>,
    calls: Vec<CallRecord>,
    times: TraceTimes,
}

impl RunSummary {
    /// Cheap identity of the trace's work: the bound of one run holds for another with the same.
    fn fingerprint(&self) -> (usize, u64, u64) {
        let llm = self.calls.iter().filter(|c| c.model.is_some());
        let (mut n, mut p, mut o) = (0, 0u64, 0u64);
        for c in llm {
            n += 1;
            p += u64::from(c.prompt_tokens);
            o += u64::from(c.output_tokens);
        }
        (n, p, o)
    }
}

fn summarise(out: sim::SimOutput, path_models: &[String]) -> RunSummary {
    let times = TraceTimes::from_trace(&out.trace);
    let done: std::collections::BTreeSet<u32> =
        out.trace.iter().filter(|l| l.event == "session_done").filter_map(|l| l.session).collect();
    let t0 = out.window.0;
    let mut paths = BTreeMap::new();
    for m in path_models {
        let mut last: BTreeMap<u32, f64> = BTreeMap::new();
        for c in &out.calls {
            if c.model.as_ref().is_some_and(|(name, _)| name == m) && done.contains(&c.session) {
                let e = last.entry(c.session).or_insert(f64::NEG_INFINITY);
                *e = e.max(c.finished_at);
            }
        }
        let makespan = last.values().copied().fold(t0, f64::max) - t0;
        let lat: Vec<f64> = last
            .iter()
            .filter_map(|(s, f)| times.arrivals.get(s).map(|a| (f - a).max(0.0)))
            .collect();
        paths.insert(m.clone(), (makespan, lat));
    }
    RunSummary { report: out.report, paths, calls: out.calls, times }
}

/// A simulation to run.
struct Job {
    variant: usize,
    arrival: usize,
    noise_seed: u64,
}

/// Run the bench. `progress(done, total)` is called from the worker threads as runs finish.
pub fn run_bench(cfg: &BenchConfig, progress: &(dyn Fn(usize, usize) + Sync)) -> Result<BenchReport, BenchError> {
    cfg.validate()?;
    let variants = cfg.variants();
    // One simulation per distinct (policy, options, predictor): a substitution equal to the
    // default predictor reuses the joint runs.
    let mut keys: Vec<(String, JointOptions, bool, String)> = Vec::new();
    let mut owner: Vec<usize> = Vec::new();
    let mut key_of: Vec<usize> = Vec::new();
    for (i, v) in variants.iter().enumerate() {
        match keys.iter().position(|k| *k == v.key()) {
            Some(k) => key_of.push(k),
            None => {
                keys.push(v.key());
                owner.push(i);
                key_of.push(keys.len() - 1);
            }
        }
    }
    let mut jobs = Vec::new();
    for a in 0..cfg.arrivals.len() {
        for &v in &owner {
            for seed in 0..cfg.repetitions {
                jobs.push(Job { variant: v, arrival: a, noise_seed: seed });
            }
        }
    }
    let results = execute(cfg, &variants, &jobs, progress)?;

    // Index results: (key, arrival) → summaries in repetition order.
    let mut by: BTreeMap<(usize, usize), Vec<&RunSummary>> = BTreeMap::new();
    for (job, r) in jobs.iter().zip(&results) {
        by.entry((key_of[job.variant], job.arrival)).or_default().push(r);
    }

    // Lower bound per arrival: from the first run of the trace, and from any run whose work
    // differs from it (then the smallest bound holds for all).
    let mut lower_bounds = BTreeMap::new();
    let devices = &cfg.pool.devices;
    for (a, arrival) in cfg.arrivals.iter().enumerate() {
        let name = arrival.to_string();
        let runs: Vec<&RunSummary> =
            jobs.iter().zip(&results).filter(|(j, _)| j.arrival == a).map(|(_, r)| r).collect();
        let Some(first) = runs.first() else { continue };
        let bound_of = |r: &RunSummary| {
            lower_bound::compute(&r.calls, &r.times, devices, cfg.max_num_seqs)
                .map_err(|source| BenchError::Bound { arrival: name.clone(), source })
        };
        let mut lb = bound_of(first)?;
        let mut seen = vec![first.fingerprint()];
        for r in &runs[1..] {
            let f = r.fingerprint();
            if seen.contains(&f) {
                continue;
            }
            seen.push(f);
            let other = bound_of(r)?;
            if other.makespan_s < lb.makespan_s {
                lb.makespan_s = other.makespan_s;
                lb.critical_path_s = lb.critical_path_s.min(other.critical_path_s);
                lb.work_s = lb.work_s.min(other.work_s);
            }
            for (m, v) in other.paths {
                let e = lb.paths.entry(m).or_insert(v);
                *e = e.min(v);
            }
        }
        lower_bounds.insert(name, lb);
    }

    let mut rows = Vec::new();
    for (a, arrival) in cfg.arrivals.iter().enumerate() {
        let name = arrival.to_string();
        let lb = lower_bounds.get(&name);
        for (i, v) in variants.iter().enumerate() {
            let Some(runs) = by.get(&(key_of[i], a)) else { continue };
            rows.push(aggregate(v, &name, runs, lb, &cfg.path_models));
        }
    }
    let mut report = BenchReport {
        setup: BenchSetup {
            workflows: cfg.workflows.iter().map(|w| w.name.clone()).collect(),
            sessions_per_workflow: cfg.sessions,
            pool: cfg.pool.name.clone(),
            gpus: cfg.pool.devices.len(),
            arrivals: cfg.arrivals.iter().map(|a| a.to_string()).collect(),
            seed: cfg.seed,
            repetitions: cfg.repetitions,
            predictor: cfg.predictor.clone(),
            max_num_seqs: cfg.max_num_seqs,
            simulations: jobs.len(),
        },
        runs: rows,
        lower_bound_s: lower_bounds.iter().map(|(k, v)| (k.clone(), v.makespan_s)).collect(),
        lower_bounds,
        goals: Vec::new(),
    };
    report.goals = goals::check(&report);
    Ok(report)
}

/// Run `jobs` on `cfg.workers` threads; results in job order. Stops at the first error.
fn execute(
    cfg: &BenchConfig,
    variants: &[Variant],
    jobs: &[Job],
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Vec<RunSummary>, BenchError> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let slots: Mutex<Vec<Option<Result<RunSummary, BenchError>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    let total = jobs.len();
    std::thread::scope(|scope| {
        for _ in 0..cfg.workers.clamp(1, total.max(1)) {
            scope.spawn(|| {
                loop {
                    if failed.load(Ordering::Relaxed) {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { return };
                    let v = &variants[job.variant];
                    let arrival = cfg.arrivals[job.arrival];
                    let sim_cfg = cfg.sim_config(v, arrival, job.noise_seed);
                    let result = sim::simulate(&sim_cfg, &mut |_, _| {})
                        .map(|out| summarise(out, &cfg.path_models))
                        .map_err(|source| BenchError::Run {
                            variant: v.label.clone(),
                            arrival: arrival.to_string(),
                            noise_seed: job.noise_seed,
                            source: Box::new(source),
                        });
                    if result.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    let mut guard = match slots.lock() {
                        Ok(g) => g,
                        Err(poisoned) => poisoned.into_inner(),
                    };
                    guard[i] = Some(result);
                    drop(guard);
                    progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
                }
            });
        }
    });
    let slots = match slots.into_inner() {
        Ok(s) => s,
        Err(poisoned) => poisoned.into_inner(),
    };
    let mut out = Vec::with_capacity(total);
    let mut first_error = None;
    for (i, s) in slots.into_iter().enumerate() {
        match s {
            Some(Ok(r)) => out.push(r),
            Some(Err(e)) => {
                first_error.get_or_insert(e);
            }
            None => {
                first_error.get_or_insert(BenchError::Lost(i));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

fn mean(xs: impl IntoIterator<Item = f64>) -> f64 {
    let (mut s, mut n) = (0.0, 0usize);
    for x in xs {
        s += x;
        n += 1;
    }
    if n == 0 { 0.0 } else { s / n as f64 }
}

/// Mean of the known percentiles (repetitions where no session completed have none).
fn mean_percentiles<'a>(ps: impl IntoIterator<Item = &'a Percentiles> + Clone) -> Percentiles {
    let known = || ps.clone().into_iter().filter(|p| p.is_known());
    Percentiles {
        p50: round3(mean(known().map(|p| p.p50))),
        p95: round3(mean(known().map(|p| p.p95))),
        p99: round3(mean(known().map(|p| p.p99))),
        samples: known().map(|p| p.samples).sum(),
    }
}

fn mean_breakdown<'a>(bs: impl IntoIterator<Item = &'a GpuBreakdown>) -> GpuBreakdown {
    let mut total = GpuBreakdown::default();
    let mut n = 0usize;
    for b in bs {
        total.add(b);
        n += 1;
    }
    total.scaled(1.0 / n.max(1) as f64).rounded()
}

/// Ratio of a measured makespan to its bound (`None` without a positive bound), unrounded:
/// the tables round it once (rounded to 3 decimals first, 1.1748 printed as 1.18).
fn ratio(measured: f64, bound: Option<f64>) -> Option<f64> {
    bound.filter(|b| *b > 0.0).map(|b| measured / b)
}

fn aggregate(v: &Variant, arrival: &str, runs: &[&RunSummary], lb: Option<&LowerBound>, path_models: &[String]) -> BenchRun {
    let reports: Vec<&RunReport> = runs.iter().map(|r| &r.report).collect();
    let makespan = round3(mean(reports.iter().map(|r| r.makespan_s)));
    let mut workflows = BTreeMap::new();
    for name in reports.first().map(|r| r.workflows.keys().cloned().collect::<Vec<_>>()).unwrap_or_default() {
        let ws: Vec<_> = reports.iter().filter_map(|r| r.workflows.get(&name)).collect();
        let accuracy = if ws.iter().all(|w| w.accuracy.is_some()) {
            Some(round3(mean(ws.iter().filter_map(|w| w.accuracy))))
        } else {
            None
        };
        workflows.insert(name, BenchWorkflow {
            sessions_completed: mean(ws.iter().map(|w| w.sessions_completed as f64)),
            sessions_failed: mean(ws.iter().map(|w| w.sessions_failed as f64)),
            makespan_s: round3(mean(ws.iter().map(|w| w.makespan_s))),
            latency_s: mean_percentiles(ws.iter().map(|w| &w.latency_s)),
            gpu_seconds_per_session: mean_breakdown(ws.iter().map(|w| &w.gpu_seconds_per_session)),
            accuracy,
        });
    }
    let mut paths = BTreeMap::new();
    for m in path_models {
        let per: Vec<&(f64, Vec<f64>)> = runs.iter().filter_map(|r| r.paths.get(m)).collect();
        if per.iter().all(|(_, lat)| lat.is_empty()) {
            continue;
        }
        let makespan = round3(mean(per.iter().map(|p| p.0)));
        let pcts: Vec<Percentiles> = per.iter().map(|p| Percentiles::of(&p.1)).collect();
        paths.insert(m.clone(), PathMetrics {
            makespan_s: makespan,
            latency_s: mean_percentiles(pcts.iter()),
            sessions: mean(per.iter().map(|p| p.1.len() as f64)),
            ratio_to_lower_bound: ratio(makespan, lb.and_then(|b| b.paths.get(m).copied())),
        });
    }
    BenchRun {
        policy: v.policy.clone(),
        variant: v.label.clone(),
        kind: v.kind,
        predictor: v.predictor.clone(),
        arrival: arrival.to_string(),
        repetitions: runs.len(),
        makespan_s: makespan,
        makespan_runs_s: reports.iter().map(|r| r.makespan_s).collect(),
        latency_s: mean_percentiles(reports.iter().map(|r| &r.latency_s)),
        gpu_seconds_per_session: mean_breakdown(reports.iter().map(|r| &r.gpu_seconds_per_session)),
        workflows,
        paths,
        ratio_to_lower_bound: ratio(makespan, lb.map(|b| b.makespan_s)).unwrap_or(0.0),
        sessions_completed: mean(reports.iter().map(|r| r.sessions_completed as f64)),
        sessions_failed: mean(reports.iter().map(|r| r.sessions_failed as f64)),
        loads: mean(reports.iter().map(|r| r.loads as f64)),
        prefetch: PrefetchMeans {
            issued: mean(reports.iter().map(|r| r.prefetch.issued as f64)),
            resident: mean(reports.iter().map(|r| r.prefetch.resident as f64)),
            no_capacity: mean(reports.iter().map(|r| r.prefetch.no_capacity as f64)),
            not_timely: mean(reports.iter().map(|r| r.prefetch.not_timely as f64)),
            refused: mean(reports.iter().map(|r| r.prefetch.refused as f64)),
        },
        fusion: FusionMeans {
            fused: mean(reports.iter().map(|r| r.fusion.fused as f64)),
            over_context: mean(reports.iter().map(|r| r.fusion.over_context as f64)),
        },
        evictions: mean(reports.iter().map(|r| r.evictions as f64)),
        sleeps: mean(reports.iter().map(|r| r.sleeps as f64)),
        wakes: mean(reports.iter().map(|r| r.wakes as f64)),
        preemptions: mean(reports.iter().map(|r| r.preemptions as f64)),
    }
}

/// Change of `ours` relative to `baseline`, in percent: negative = ours is lower (the paper's
/// "−35.8 %" convention).
pub fn change_pct(ours: f64, baseline: f64) -> Option<f64> {
    (baseline > 0.0 && ours.is_finite() && baseline.is_finite()).then(|| (ours - baseline) / baseline * 100.0)
}

/// Write `report.md`, `bench.json` and the charts `fig5_completion.svg`,
/// `fig6_gpu_seconds.svg`, `fig7_ablations.svg` into `dir` (created if missing).
/// Returns the files written.
pub fn write_outputs(report: &BenchReport, dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Io { path: dir.to_path_buf(), source })?;
    let write = |name: &str, text: &str| -> Result<PathBuf, BenchError> {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|source| BenchError::Io { path: path.clone(), source })?;
        Ok(path)
    };
    let mut files = vec![
        write("report.md", &markdown(report))?,
        write("bench.json", &(serde_json::to_string_pretty(report)? + "\n"))?,
    ];
    files.push(charts::figure5(report, &dir.join("fig5_completion.svg"))?);
    files.push(charts::figure6(report, &dir.join("fig6_gpu_seconds.svg"))?);
    files.push(charts::figure7(report, &dir.join("fig7_ablations.svg"))?);
    Ok(files)
}

/// Draw one GPU timeline per policy of `cfg` in burst (engine-noise seed 0) into `dir`, as
/// [`markdown`]'s "GPU timelines" section names them: one more simulation per policy. Nothing
/// is written when the bench has no burst arrival.
pub fn write_timelines(cfg: &BenchConfig, dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
    let mut files = Vec::new();
    let Some(&burst) = cfg.arrivals.iter().find(|a| matches!(a, Arrival::Burst)) else { return Ok(files) };
    let names = crate::exec::deployment_names(&cfg.workflows, cfg.max_num_seqs)
        .map_err(|e| BenchError::Config(e.to_string()))?;
    for v in cfg.variants().into_iter().filter(|v| v.kind == VariantKind::Policy) {
        let sim_cfg = cfg.sim_config(&v, burst, 0);
        let opts = sim::SimOptions { keep_trace: false, keep_calls: false, keep_sessions: false, timeline_segments: None, record_planner: false };
        let out = sim::simulate_opts(&sim_cfg, opts, &mut |_| sim::Flow::Continue).map_err(|source| BenchError::Run {
            variant: v.label.clone(),
            arrival: burst.to_string(),
            noise_seed: 0,
            source: Box::new(source),
        })?;
        let path = dir.join(markdown::timeline_file(&v.label));
        let title = format!(
            "{} on {} ({} GPUs), burst, noise seed 0: makespan {:.1} s",
            v.label, out.report.pool, out.report.gpus, out.report.makespan_s
        );
        crate::report::timeline::write_svg(&path, &title, &out.timelines, &names, out.window.0, out.window.1)
            .map_err(|e| BenchError::Config(e.to_string()))?;
        files.push(path);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_and_ratios() {
        assert_eq!(change_pct(64.0, 100.0), Some(-36.0));
        assert_eq!(change_pct(120.0, 100.0), Some(20.0));
        assert_eq!(change_pct(1.0, 0.0), None);
        assert_eq!(ratio(300.0, Some(100.0)), Some(3.0));
        assert_eq!(ratio(300.0, Some(0.0)), None);
        assert_eq!(ratio(300.0, None), None);
    }

    #[test]
    fn means_of_percentiles_and_breakdowns() {
        let a = Percentiles { p50: 1.0, p95: 2.0, p99: 3.0, samples: 1 };
        let b = Percentiles { p50: 3.0, p95: 4.0, p99: 5.0, samples: 1 };
        assert_eq!(mean_percentiles([&a, &b]), Percentiles { p50: 2.0, p95: 3.0, p99: 4.0, samples: 2 });
        let x = GpuBreakdown { generation: 1.0, idle_resident: 2.0, loading: 3.0, other: 4.0 };
        let y = GpuBreakdown { generation: 3.0, idle_resident: 2.0, loading: 1.0, other: 0.0 };
        let m = mean_breakdown([&x, &y]);
        assert_eq!((m.generation, m.idle_resident, m.loading, m.other), (2.0, 2.0, 2.0, 2.0));
        assert_eq!(mean(std::iter::empty()), 0.0);
    }

    fn paper_config() -> BenchConfig {
        let pool = PoolSpec::parse(Path::new("p.yaml"), "name: t\ndevices:\n  - { kind: A100-40GB }\n").unwrap();
        BenchConfig::paper(Vec::new(), pool)
    }

    #[test]
    fn variants_list_policies_ablations_and_predictors_and_share_identical_runs() {
        let mut cfg = paper_config();
        cfg.predictors = vec!["oracle".into(), "formula".into()];
        let v = cfg.variants();
        let labels: Vec<&str> = v.iter().map(|v| v.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "parrot",
                "kairos",
                "joint",
                "no-fusion",
                "no-prefetch",
                "per-workflow-lifecycle",
                "resource-order",
                "history-admission",
                "no-tao-admission",
                "no-drain",
                "no-outlook",
                "fifo-rank",
                "predictor:oracle",
                "predictor:formula",
                "sleep:parrot",
                "sleep:kairos",
                "sleep:joint",
                "sleep:joint-no-sleep"
            ]
        );
        // The oracle substitution is the joint run itself; the formula one is not, and neither
        // is a variant that differs only in an option (every option is part of the key).
        assert_eq!(v[2].key(), v[12].key());
        assert_ne!(v[2].key(), v[13].key());
        for k in 6..12 {
            assert_ne!(v[2].key(), v[k].key());
        }
        assert!(!v[3].options.fusion && v[3].options.prefetch && v[3].options.shared_lifecycle);
        assert!(!v[5].options.shared_lifecycle);
        assert!(!v[8].options.tao_admission && v[8].options.fusion);
        assert!(!v[9].options.drain && v[9].options.tao_admission && v[2].options.drain);
        assert!(!v[10].options.outlook && v[10].options.drain && v[2].options.outlook);
        assert!(!v[11].options.critical_path_rank && v[11].options.outlook && v[2].options.critical_path_rank);
        // The sleep rows run on the substrate that sleeps: never the same simulation as the
        // rows above, and joint's `--no-sleep` differs from joint there.
        assert!(v[14..].iter().all(|x| x.sleep_substrate && x.kind == VariantKind::Sleep));
        assert!(v[..14].iter().all(|x| !x.sleep_substrate));
        assert_ne!(v[2].key(), v[16].key());
        assert_ne!(v[16].key(), v[17].key());
        assert!(!v[17].options.sleep);
    }

    #[test]
    fn a_row_without_a_completed_session_has_no_p95_to_compare() {
        let none = Percentiles::of(&[]);
        assert!(none.p95_or_nan().is_nan());
        assert_eq!(change_pct(none.p95_or_nan(), 600.0), None, "not −100 %");
        assert_eq!(change_pct(600.0, none.p95_or_nan()), None);
        assert_eq!(change_pct(660.0, 600.0), Some(10.0));
        assert_eq!(mean_percentiles([&none, &Percentiles::of(&[4.0])]).p95, 4.0, "the known repetitions only");
    }

    #[test]
    fn bad_configurations_are_refused() {
        let cfg = paper_config();
        assert!(matches!(cfg.validate(), Err(BenchError::Config(m)) if m.contains("no workflow")));
        let gsm8k = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows/gsm8k.yaml");
        let mut cfg = paper_config().quick();
        cfg.workflows = vec![Arc::new(crate::workflow::load_workflow(&gsm8k).unwrap())];
        assert_eq!(cfg.repetitions, 1);
        assert_eq!(cfg.arrivals, vec![Arrival::Burst]);
        assert!(cfg.validate().is_ok());
        let mut twice = cfg.clone();
        twice.policies.push("parrot".into());
        assert!(matches!(twice.validate(), Err(BenchError::Config(m)) if m.contains("twice")));
        let mut none = cfg.clone();
        none.repetitions = 0;
        assert!(matches!(none.validate(), Err(BenchError::Config(m)) if m.contains("repetitions")));
        let mut empty = cfg;
        (empty.policies, empty.ablations, empty.predictors) = (Vec::new(), false, Vec::new());
        assert!(matches!(empty.validate(), Err(BenchError::Config(m)) if m.contains("no policy")));
    }
}
