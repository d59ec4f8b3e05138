//! `switchyard bench oracle`: what ORACLE's adaptive verification is worth (paper 002 §5.3,
//! "adaptive vs single-verifier feedback"), on the simulator with the planner core's router.
//!
//! Workload: the routed `gsm8k-routed` and `mbpp-routed` workflows together (each session a
//! program routed among Qwen3-0.6B / 1.7B / 8B; the emulated answers are right with each model's
//! GSM8K accuracy and MBPP pass@1 from the Qwen3 report), Poisson arrivals so that verdicts land
//! while later programs are still being routed, the paper pool, the joint policy.
//!
//! Two configurations, the same trace per seed (so session i is the same task in both):
//! - **adaptive**: the router's classifier knows both verifiers (GSM8K exact answer, MBPP's
//!   tests) and picks one per request;
//! - **single verifier**: every program is judged by GSM8K's exact-answer check, whatever its
//!   task type (the classifier still infers the type for the learner's context, as Appendix
//!   B.4's family one-hot); MBPP programs can never be confirmed, so the learner learns nothing
//!   about which model writes code that passes (the paper, App. E: "the router receives the
//!   same verdict for every outcome and learns nothing").
//!
//! Reported per configuration (means over seeds): accuracy (every session's score: GSM8K exact,
//! MBPP tests; a failed session 0), per workflow, GPU-seconds per completed session, the share
//! of programs per model; and the paired difference in accuracy (adaptive − single) with a 95 %
//! bootstrap interval over sessions (paired by session: same seed, same task), resampled with a
//! fixed seed. Cost is not matched by construction: the report gives both configurations' cost
//! and their ratio, and says whether the accuracy difference holds at no higher cost.
//!
//! The steady state: each route member's single-model runs of the same traces give every task's
//! outcome and cost per member, over which `bench::oracle_replay` replays the core's learner
//! with the paper's frontier protocol (Appendix E: random orders, eight passes, the last scored,
//! matched cost at the midpoint between single-model costs, stratified task bootstrap).
//!
//! Depends on `sim`, `exec` and `planner::routing`; nothing else depends on it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::oracle_replay::{self, ReplayOptions, ReplayReport, ReplayTask};
use crate::exec::routing::RoutingConfig;
use crate::exec::{Arrival, PoolSpec, RunConfig};
use crate::planner::routing::{learner_context, router_features};
use crate::sim::{self, Flow, SimOptions};
use crate::workflow::{NodeKind, load_workflow};

/// What to run.
#[derive(Debug, Clone)]
pub struct OracleBenchConfig {
    /// The repository root (workflows and pools are read from it).
    pub root: std::path::PathBuf,
    /// Sessions per workflow per run.
    pub sessions: usize,
    /// Poisson arrival rate per workflow (sessions per second).
    pub rate: f64,
    /// Trace seeds (one paired comparison each).
    pub seeds: Vec<u64>,
}

impl Default for OracleBenchConfig {
    fn default() -> Self {
        OracleBenchConfig { root: ".".into(), sessions: 120, rate: 0.5, seeds: (1..=5).collect() }
    }
}

/// One configuration's results, means over the seeds.
#[derive(Debug, Clone, Serialize)]
pub struct FeedbackSide {
    pub accuracy: f64,
    pub accuracy_per_workflow: BTreeMap<String, f64>,
    pub gpu_seconds_per_session: f64,
    /// Compute cost per program, billions of parameter-tokens (`exec::routing::call_cost`).
    pub cost_per_program: f64,
    /// Share of programs per workflow and model.
    pub model_share: BTreeMap<String, BTreeMap<String, f64>>,
    /// Share of programs judged by their workflow's own verifier.
    pub right_verifier: f64,
}

/// The comparison.
#[derive(Debug, Clone, Serialize)]
pub struct OracleReport {
    pub sessions_per_workflow: usize,
    pub rate: f64,
    pub seeds: Vec<u64>,
    pub adaptive: FeedbackSide,
    pub single_verifier: FeedbackSide,
    /// Adaptive − single, accuracy points (0–100), paired by session, with its 95 % bootstrap
    /// interval.
    pub accuracy_gain_pp: f64,
    pub accuracy_gain_ci_pp: (f64, f64),
    /// The gain per seed (pp).
    pub per_seed_gain_pp: Vec<f64>,
    /// Single-verifier GPU-seconds per session over adaptive's.
    pub cost_ratio_single_over_adaptive: f64,
    /// Each route member alone (the fixed policies): accuracy and compute cost per program.
    pub fixed: BTreeMap<String, FeedbackSide>,
    /// The reward's cost scale: the largest member's mean cost per program (Appendix B.4).
    pub cost_scale: f64,
    /// The cost-weight sweep: (a, adaptive, single verifier), means over the seeds.
    pub sweep: Vec<(f64, FeedbackSide, FeedbackSide)>,
    /// The steady state: the learner replayed over the single-model runs' per-task outcomes
    /// (paper 002 Appendix E's frontier protocol).
    pub replay: ReplayReport,
}

/// Cost weights of the sweep (a subset of Appendix B.4's {0, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3}).
pub const COST_WEIGHTS: [f64; 4] = [0.25, 0.5, 1.0, 2.0];

/// The route members, largest last.
const MEMBERS: [&str; 3] = ["qwen3-0.6b", "qwen3-1.7b", "qwen3-8b"];

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum OracleBenchError {
    #[error("{0}")]
    Setup(String),
    #[error("a run failed: {0}")]
    Run(String),
}

const WORKFLOWS: [&str; 2] = ["gsm8k-routed", "mbpp-routed"];
const BOOTSTRAP: usize = 2_000;

/// The run of one configuration; `fixed`: every routed node's route cut to that one member
/// (a single-model policy, routed like the others so that its cost is counted the same way).
fn config(
    root: &Path,
    c: &OracleBenchConfig,
    seed: u64,
    routing: RoutingConfig,
    fixed: Option<&str>,
) -> Result<RunConfig, OracleBenchError> {
    let mut workflows = Vec::new();
    for w in WORKFLOWS {
        let mut spec = load_workflow(&root.join("workflows").join(format!("{w}.yaml")))
            .map_err(|e| OracleBenchError::Setup(e.to_string()))?;
        if let Some(member) = fixed {
            for n in &mut spec.nodes {
                if let NodeKind::Agent(a) = &mut n.kind
                    && a.route.is_some()
                {
                    a.deployment = member.to_string();
                    a.route = Some(vec![member.to_string()]);
                }
            }
        }
        workflows.push(Arc::new(spec));
    }
    let pool =
        PoolSpec::load(&root.join("workflows/pools/paper.yaml")).map_err(|e| OracleBenchError::Setup(e.to_string()))?;
    Ok(RunConfig {
        sessions: c.sessions,
        arrival: Arrival::Poisson(c.rate),
        seed,
        predictor: "oracle".into(),
        handoff_s: crate::exec::FRAMEWORK_HANDOFF_S,
        routing,
        ..RunConfig::served(workflows, pool)
    })
}

/// One run's per-session scores (by session id), its side of the report, and its routed
/// programs with their outcome by their own verifier.
struct RunResult {
    scores: BTreeMap<u32, f64>,
    side: FeedbackSide,
    programs: Vec<ProgramOutcome>,
}

/// A routed program of a run: its task, its workflow's own verifier, its outcome by that
/// verifier (0 or 1) and its compute cost.
struct ProgramOutcome {
    session: u32,
    workflow: u32,
    task: String,
    own_verifier: String,
    success: f64,
    cost: f64,
}

fn run_one(cfg: &RunConfig) -> Result<RunResult, OracleBenchError> {
    let out = sim::simulate_opts(cfg, SimOptions::default(), &mut |_| Flow::Continue)
        .map_err(|e| OracleBenchError::Run(e.to_string()))?;
    let r = &out.report;
    let scores: BTreeMap<u32, f64> = out.sessions.iter().map(|s| (s.session.0, s.score.unwrap_or(0.0))).collect();
    let outcomes = out
        .programs
        .iter()
        .filter_map(|p| {
            let spec = cfg.workflows.get(p.workflow as usize)?;
            let own = crate::exec::routing::workflow_verifier(spec)?;
            let score = crate::exec::routing::verifier_input(spec, scores.get(&p.session).copied(), p.verifier_score);
            Some(ProgramOutcome {
                session: p.session,
                workflow: p.workflow,
                task: p.task.clone(),
                own_verifier: own.to_string(),
                success: crate::exec::routing::verdict(spec, score, own),
                cost: p.cost,
            })
        })
        .collect();
    let accuracy = scores.values().sum::<f64>() / scores.len().max(1) as f64;
    let accuracy_per_workflow = r.workflows.iter().map(|(k, w)| (k.clone(), w.accuracy.unwrap_or(0.0))).collect();
    let mut model_share: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let (mut right, mut programs, mut cost) = (0u64, 0u64, 0.0);
    for (w, per_model) in &r.routing {
        let total: u64 = per_model.values().map(|s| s.programs).sum();
        for (m, s) in per_model {
            model_share.entry(w.clone()).or_default().insert(m.clone(), s.programs as f64 / total.max(1) as f64);
            right += s.right_verifier;
            programs += s.programs;
            cost += s.cost;
        }
    }
    let side = FeedbackSide {
        accuracy,
        accuracy_per_workflow,
        gpu_seconds_per_session: r.gpu_seconds_per_session.total(),
        cost_per_program: cost / programs.max(1) as f64,
        model_share,
        right_verifier: right as f64 / programs.max(1) as f64,
    };
    Ok(RunResult { scores, side, programs: outcomes })
}

fn mean_sides(sides: &[FeedbackSide]) -> FeedbackSide {
    let n = sides.len().max(1) as f64;
    let mut out = FeedbackSide {
        accuracy: 0.0,
        accuracy_per_workflow: BTreeMap::new(),
        gpu_seconds_per_session: 0.0,
        cost_per_program: 0.0,
        model_share: BTreeMap::new(),
        right_verifier: 0.0,
    };
    for s in sides {
        out.accuracy += s.accuracy / n;
        out.cost_per_program += s.cost_per_program / n;
        out.gpu_seconds_per_session += s.gpu_seconds_per_session / n;
        out.right_verifier += s.right_verifier / n;
        for (k, v) in &s.accuracy_per_workflow {
            *out.accuracy_per_workflow.entry(k.clone()).or_insert(0.0) += v / n;
        }
        for (w, m) in &s.model_share {
            for (k, v) in m {
                *out.model_share.entry(w.clone()).or_default().entry(k.clone()).or_insert(0.0) += v / n;
            }
        }
    }
    out
}

/// Run the comparison.
pub fn run(c: &OracleBenchConfig) -> Result<OracleReport, OracleBenchError> {
    if c.seeds.is_empty() || c.sessions == 0 {
        return Err(OracleBenchError::Setup("at least one seed and one session".into()));
    }
    let exact = crate::exec::routing::verifier_name(crate::workflow::MetricKind::Gsm8kExact).to_string();
    let single = RoutingConfig { single_verifier: Some(exact.clone()), ..RoutingConfig::default() };
    let (mut adaptive, mut narrow, mut diffs) = (Vec::new(), Vec::new(), Vec::new());
    for &seed in &c.seeds {
        let a = run_one(&config(&c.root, c, seed, RoutingConfig::default(), None)?)?;
        let b = run_one(&config(&c.root, c, seed, single.clone(), None)?)?;
        // Paired by session id: the same seed gives the same task to session i in both.
        if a.scores.keys().ne(b.scores.keys()) {
            return Err(OracleBenchError::Run(format!("seed {seed}: the two runs ended different sessions")));
        }
        diffs.push(a.scores.values().zip(b.scores.values()).map(|(x, y)| x - y).collect::<Vec<f64>>());
        adaptive.push(a.side);
        narrow.push(b.side);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let per_seed_gain_pp: Vec<f64> = diffs.iter().map(|d| mean(d) * 100.0).collect();
    let all: Vec<f64> = diffs.iter().flatten().copied().collect();
    let gain = mean(&all);
    // Two-level bootstrap: seeds with replacement (a run's sessions share one learner, so seeds
    // are the independent units), then each drawn seed's sessions with replacement.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x0ac1e);
    let mut boots: Vec<f64> = (0..BOOTSTRAP)
        .map(|_| {
            let (mut sum, mut n) = (0.0, 0usize);
            for _ in 0..diffs.len() {
                let d = &diffs[rng.random_range(0..diffs.len())];
                for _ in 0..d.len() {
                    sum += d[rng.random_range(0..d.len())];
                }
                n += d.len();
            }
            sum / n.max(1) as f64
        })
        .collect();
    boots.sort_by(f64::total_cmp);
    let ci = (boots[(BOOTSTRAP as f64 * 0.025) as usize], boots[(BOOTSTRAP as f64 * 0.975) as usize - 1]);
    let adaptive = mean_sides(&adaptive);
    let single_verifier = mean_sides(&narrow);
    // The fixed policies, then the reward's scale from the largest one (not from a routed run).
    let mut fixed = BTreeMap::new();
    let mut single_model_programs: Vec<Vec<Vec<ProgramOutcome>>> = Vec::new();
    for m in MEMBERS {
        let (mut sides, mut programs) = (Vec::new(), Vec::new());
        for &seed in &c.seeds {
            let r = run_one(&config(&c.root, c, seed, RoutingConfig::default(), Some(m))?)?;
            sides.push(r.side);
            programs.push(r.programs);
        }
        fixed.insert(m.to_string(), mean_sides(&sides));
        single_model_programs.push(programs);
    }
    let replay = replay_steady_state(&c.root, c, &single_model_programs, &exact)?;
    let cost_scale = fixed.get(MEMBERS[MEMBERS.len() - 1]).map_or(1.0, |s| s.cost_per_program).max(f64::MIN_POSITIVE);
    let mut sweep = Vec::new();
    for a in COST_WEIGHTS {
        let priced = RoutingConfig { cost_weight: a, cost_scale, ..RoutingConfig::default() };
        let priced_single = RoutingConfig { single_verifier: Some(exact.clone()), ..priced.clone() };
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        for &seed in &c.seeds {
            xs.push(run_one(&config(&c.root, c, seed, priced.clone(), None)?)?.side);
            ys.push(run_one(&config(&c.root, c, seed, priced_single.clone(), None)?)?.side);
        }
        sweep.push((a, mean_sides(&xs), mean_sides(&ys)));
    }
    Ok(OracleReport {
        replay,
        fixed,
        cost_scale,
        sweep,
        sessions_per_workflow: c.sessions,
        rate: c.rate,
        seeds: c.seeds.clone(),
        cost_ratio_single_over_adaptive: single_verifier.gpu_seconds_per_session
            / adaptive.gpu_seconds_per_session.max(f64::MIN_POSITIVE),
        adaptive,
        single_verifier,
        accuracy_gain_pp: gain * 100.0,
        accuracy_gain_ci_pp: (ci.0 * 100.0, ci.1 * 100.0),
        per_seed_gain_pp,
    })
}

/// The replay's tasks from the single-model runs (`per_member[m][seed]`: member m's run of that
/// seed's trace) and its result. A task is a routed session every member's run closed; its
/// context and classified verifier come from the router's own features over the run's exemplars.
fn replay_steady_state(
    root: &Path,
    c: &OracleBenchConfig,
    per_member: &[Vec<Vec<ProgramOutcome>>],
    single_verifier: &str,
) -> Result<ReplayReport, OracleBenchError> {
    let setup_err = |e: String| OracleBenchError::Setup(format!("replay: {e}"));
    let cfg = config(root, c, c.seeds.first().copied().unwrap_or(1), RoutingConfig::default(), None)?;
    let (deployments, deployment_of) =
        crate::exec::deployment_table(&cfg.workflows, cfg.max_num_seqs).map_err(|e| setup_err(e.to_string()))?;
    let records = crate::exec::load_records(&cfg.workflows).map_err(|e| setup_err(e.to_string()))?;
    let setup = crate::exec::routing::routing_setup(
        &cfg.workflows,
        &records,
        &deployments,
        &deployment_of,
        &cfg.pool,
        &cfg.routing,
    )
    .map_err(|e| setup_err(e.to_string()))?
    .ok_or_else(|| setup_err("no routed workflow".into()))?;
    let (vocabulary, pca, selector) = router_features(&setup.exemplars);
    let mut tasks = Vec::new();
    for (stream, _) in c.seeds.iter().enumerate() {
        let runs: Vec<BTreeMap<u32, &ProgramOutcome>> = per_member
            .iter()
            .map(|seeds| seeds.get(stream).map(|ps| ps.iter().map(|p| (p.session, p)).collect()).unwrap_or_default())
            .collect();
        let Some(first) = runs.first() else { continue };
        for (session, p) in first {
            let outcomes: Vec<&ProgramOutcome> = runs.iter().filter_map(|r| r.get(session).copied()).collect();
            if outcomes.len() != runs.len() {
                continue;
            }
            if outcomes.iter().any(|o| o.task != p.task || o.workflow != p.workflow) {
                return Err(setup_err(format!("session {session} is not the same task in every member's run")));
            }
            let (classified, context) = learner_context(&selector, &pca, &vocabulary.embed(&p.task));
            tasks.push(ReplayTask {
                family: p.workflow as usize,
                stream,
                own_verifier: p.own_verifier.clone(),
                classified,
                context,
                success: outcomes.iter().map(|o| o.success).collect(),
                cost: outcomes.iter().map(|o| o.cost).collect(),
            });
        }
    }
    let members: Vec<String> = MEMBERS.iter().map(|m| m.to_string()).collect();
    oracle_replay::run(&members, &tasks, single_verifier, &ReplayOptions::default())
        .map_err(|e| OracleBenchError::Run(e.to_string()))
}

impl OracleReport {
    /// For each adaptive point (a, cost, accuracy): the single-verifier accuracy at the same
    /// compute cost, interpolated linearly between the single-verifier points around it
    /// (`None` outside their range).
    pub fn matched_cost(&self) -> Vec<(f64, f64, f64, Option<f64>)> {
        let all = std::iter::once((0.0, &self.adaptive, &self.single_verifier))
            .chain(self.sweep.iter().map(|(a, x, y)| (*a, x, y)));
        let mut single: Vec<(f64, f64)> = all.clone().map(|(_, _, y)| (y.cost_per_program, y.accuracy)).collect();
        single.sort_by(|p, q| p.0.total_cmp(&q.0));
        all.map(|(a, x, _)| {
            let c = x.cost_per_program;
            let y = single.windows(2).find(|w| w[0].0 <= c && c <= w[1].0).map(|w| {
                let t = if w[1].0 > w[0].0 { (c - w[0].0) / (w[1].0 - w[0].0) } else { 0.0 };
                w[0].1 + t * (w[1].1 - w[0].1)
            });
            (a, c, x.accuracy, y)
        })
        .collect()
    }

    /// The report as Markdown.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "# ORACLE: adaptive vs single-verifier feedback (paper 002 §5.3)\n\n\
             `gsm8k-routed` + `mbpp-routed`, {} sessions each, Poisson {} /s per workflow, paper pool, joint policy, \
             seeds {:?} (means; the difference paired by session).\n\n\
             | feedback | accuracy | GSM8K | MBPP | GPU-s / session | right verifier |\n| --- | ---: | ---: | ---: | ---: | ---: |\n",
            self.sessions_per_workflow, self.rate, self.seeds
        );
        for (name, s) in [("adaptive", &self.adaptive), ("single verifier (exact answer)", &self.single_verifier)] {
            out.push_str(&format!(
                "| {name} | {:.1} % | {:.1} % | {:.1} % | {:.1} | {:.0} % |\n",
                s.accuracy * 100.0,
                s.accuracy_per_workflow.get("gsm8k-routed").copied().unwrap_or(0.0) * 100.0,
                s.accuracy_per_workflow.get("mbpp-routed").copied().unwrap_or(0.0) * 100.0,
                s.gpu_seconds_per_session,
                s.right_verifier * 100.0
            ));
        }
        out.push_str(&format!(
            "\nadaptive − single at a = 0: **{:+.1} pp** accuracy (95 % two-level bootstrap interval over seeds and sessions \
             {:+.1} … {:+.1} pp; per seed {}), at {:.2}× the \
             single-verifier configuration's GPU-seconds per session but {:.2}× its compute cost per program — not matched \
             in compute; the matched-cost comparison is below.\n\n",
            self.accuracy_gain_pp,
            self.accuracy_gain_ci_pp.0,
            self.accuracy_gain_ci_pp.1,
            self.per_seed_gain_pp.iter().map(|g| format!("{g:+.1}")).collect::<Vec<_>>().join(" / "),
            1.0 / self.cost_ratio_single_over_adaptive.max(f64::MIN_POSITIVE),
            self.adaptive.cost_per_program / self.single_verifier.cost_per_program.max(f64::MIN_POSITIVE),
        ));
        out.push_str(&format!(
            "Accuracy against compute cost (cost: billions of parameter-tokens per program, the tokens each call computed × \
             the model's parameters; reward r = success − a·cost/scale with scale {:.0}, the 8B model's mean cost per program):\n\n\
             | policy | a | accuracy | cost / program |\n| --- | ---: | ---: | ---: |\n",
            self.cost_scale
        ));
        for (m, s) in &self.fixed {
            out.push_str(&format!("| {m} alone | – | {:.1} % | {:.0} |\n", s.accuracy * 100.0, s.cost_per_program));
        }
        let points = std::iter::once((0.0, &self.adaptive, &self.single_verifier))
            .chain(self.sweep.iter().map(|(a, x, y)| (*a, x, y)));
        for (a, x, y) in points {
            out.push_str(&format!("| adaptive | {a} | {:.1} % | {:.0} |\n", x.accuracy * 100.0, x.cost_per_program));
            out.push_str(&format!(
                "| single verifier | {a} | {:.1} % | {:.0} |\n",
                y.accuracy * 100.0,
                y.cost_per_program
            ));
        }
        out.push_str("\nAt matched compute cost — single-verifier accuracy interpolated linearly between its two points around each \
             adaptive point's cost (goal: adaptive ≥ +5 pp; paper ≈ +7 pp):\n\n| a | cost / program | adaptive | single at that cost | gain |\n| ---: | ---: | ---: | ---: | ---: |\n");
        for (a, cost, x, y) in self.matched_cost() {
            match y {
                Some(y) => out.push_str(&format!(
                    "| {a} | {cost:.0} | {:.1} % | {:.1} % | {:+.1} pp |\n",
                    x * 100.0,
                    y * 100.0,
                    (x - y) * 100.0
                )),
                None => out.push_str(&format!("| {a} | {cost:.0} | {:.1} % | outside its range | – |\n", x * 100.0)),
            }
        }
        out.push('\n');
        out.push_str("Share of programs per model (mean over seeds):\n\n| feedback | workflow | model | share |\n| --- | --- | --- | ---: |\n");
        for (name, s) in [("adaptive", &self.adaptive), ("single", &self.single_verifier)] {
            for (w, m) in &s.model_share {
                for (k, v) in m {
                    out.push_str(&format!("| {name} | {w} | {k} | {:.0} % |\n", v * 100.0));
                }
            }
        }
        out.push('\n');
        out.push_str(&self.replay.markdown());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(accuracy: f64, cost: f64) -> FeedbackSide {
        FeedbackSide {
            accuracy,
            accuracy_per_workflow: BTreeMap::new(),
            gpu_seconds_per_session: 0.0,
            cost_per_program: cost,
            model_share: BTreeMap::new(),
            right_verifier: 1.0,
        }
    }

    fn no_replay() -> ReplayReport {
        let none = oracle_replay::MatchedCost {
            cost_weight: 0.0,
            cost: 0.0,
            adaptive: 0.0,
            single: None,
            gain_pp: None,
            gain_ci_pp: None,
        };
        ReplayReport {
            members: Vec::new(),
            tasks: 0,
            streams: 0,
            passes: 0,
            orders_per_stream: 0,
            bootstrap_draws: 0,
            cost_scale: 1.0,
            fixed: Vec::new(),
            per_task_best: (0.0, 0.0),
            hindsight: Vec::new(),
            adaptive: Vec::new(),
            single: Vec::new(),
            midpoint_cost: 0.0,
            headline: none.clone(),
            headline_cold: none.clone(),
            matched: Vec::new(),
        }
    }

    #[test]
    fn matched_cost_interpolates_the_single_verifier_frontier() {
        let r = OracleReport {
            sessions_per_workflow: 1,
            rate: 1.0,
            seeds: vec![1],
            adaptive: side(0.70, 1_500.0),
            single_verifier: side(0.60, 1_000.0),
            accuracy_gain_pp: 10.0,
            accuracy_gain_ci_pp: (5.0, 15.0),
            per_seed_gain_pp: vec![10.0],
            cost_ratio_single_over_adaptive: 1.0,
            fixed: BTreeMap::new(),
            cost_scale: 1.0,
            sweep: vec![(1.0, side(0.55, 600.0), side(0.50, 400.0)), (2.0, side(0.45, 300.0), side(0.44, 350.0))],
            replay: no_replay(),
        };
        let m = r.matched_cost();
        // 1,500 is beyond the single points (350 … 1,000); 600 lies between 400 (50 %) and
        // 1,000 (60 %): 50 + 200/600·10 = 53.3 %; 300 lies below them.
        assert_eq!(m[0].3, None);
        assert!((m[1].3.unwrap() - (0.50 + 200.0 / 600.0 * 0.10)).abs() < 1e-12, "{m:?}");
        assert_eq!(m[2].3, None);
    }
}
