//! The router's learner replayed over measured per-task outcomes: paper 002's accuracy–cost
//! frontier protocol (Appendix E, behind Fig. 5 and 9), on the emulated pool's tasks.
//!
//! The paper "replay[s] the router over measured per-task outcomes and costs of both models" from
//! single-model runs; "each point is the mean over 100 random stream orders; the steady state
//! runs eight passes over the stream and scores the last, the cold start one pass"; the matched
//! cost takes "the adaptive point nearest the midpoint between single-model costs" and
//! interpolates single-verifier accuracy there, with "task bootstraps stratified by family, 200
//! draws". This module is that protocol over [`ReplayTask`]s: per task, the learner's context
//! and the verifier the router's classifier selects for its first request (the router's own
//! features), its workflow's own verifier, and per route member the outcome and compute cost
//! that member's single-model run measured on it (`bench::oracle` builds them). The learner is
//! the core's LinUCB (α = 0.6, the reward of Appendix B.4); a verdict lands right after its
//! decision (a replay has no serving delay). Only the feedback differs between the two
//! configurations, with the same stream orders: *adaptive* judges a task by the verifier its
//! request classifies to, *single verifier* by one verifier for every task — a task of another
//! family gets failure feedback, as the paper's patch verifier gives τ²-bench tasks. Both are
//! scored by the task's own outcome. Each configuration's regret is measured against the best
//! fixed member in hindsight (the member whose single-model run has the highest mean reward at
//! that cost weight), pass by pass, beside the per-task optimum no learner can exceed.
//!
//! Pure: no I/O; the stream orders and the bootstrap draw from fixed seeds. Depends on
//! `planner::routing` only; `bench::oracle` is its one user.

use std::collections::BTreeMap;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::planner::routing::{ALPHA_UCB, LinUcb, LinUcbError, reward};

/// The paper's cost weights (Appendix E: a ∈ {0, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3}).
pub const PAPER_COST_WEIGHTS: [f64; 9] = [0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0];

/// One task of the replayed stream.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayTask {
    /// Its family (workflow) index: the bootstrap's stratum.
    pub family: usize,
    /// The stream (task set) it belongs to; each stream is replayed on its own.
    pub stream: usize,
    /// Its workflow's own verifier (the benchmark's success signal).
    pub own_verifier: String,
    /// The verifier the router's classifier selects for its first request.
    pub classified: String,
    /// The learner's context for its first request.
    pub context: Vec<f64>,
    /// Per route member: its outcome in that member's single-model run (0 or 1).
    pub success: Vec<f64>,
    /// Per route member: its compute cost there.
    pub cost: Vec<f64>,
}

/// Which verdict teaches the learner.
#[derive(Debug, Clone, PartialEq)]
pub enum Feedback {
    /// The verifier the task's request classifies to.
    Adaptive,
    /// This verifier for every task.
    Single(String),
}

/// How the replay runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayOptions {
    /// Passes over each stream; the last is scored (the paper: 8), and the first is reported as
    /// the cold start.
    pub passes: usize,
    /// Random orders per stream (the paper: 100 orders of its one stream).
    pub orders: usize,
    pub cost_weights: Vec<f64>,
    /// Bootstrap draws (the paper: 200).
    pub bootstrap: usize,
    pub seed: u64,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions { passes: 8, orders: 20, cost_weights: PAPER_COST_WEIGHTS.to_vec(), bootstrap: 200, seed: 0x5eed }
    }
}

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("replay: {0}")]
    Input(String),
    #[error(transparent)]
    Learner(#[from] LinUcbError),
    /// [`ReplayReport::frontier_svg`] of a replay without points.
    #[error("the replay has no points")]
    NoPoints,
    /// Plotters failed to draw the replay's chart (its message).
    #[error("{0}")]
    Chart(String),
}

/// One configuration at one cost weight: mean accuracy and cost per task in the scored (last)
/// pass and in the first (cold) pass.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayPoint {
    pub cost_weight: f64,
    pub accuracy: f64,
    pub cost: f64,
    pub cold_accuracy: f64,
    pub cold_cost: f64,
    /// Share of decisions per member in the scored pass.
    pub share: Vec<f64>,
    /// The learner's mean reward per task (r = success − a·cost/scale, scored by the task's own
    /// outcome), per pass; the first is the cold start, the last the scored pass.
    pub reward_by_pass: Vec<f64>,
    /// Regret per task against the best fixed member in hindsight at this cost weight (its mean
    /// reward minus the learner's), per pass. Negative where the contextual learner beats every
    /// fixed member.
    pub regret_by_pass: Vec<f64>,
}

/// The benchmarks a learner's regret is measured against at one cost weight.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hindsight {
    pub cost_weight: f64,
    /// The member whose fixed policy has the highest mean reward over all tasks.
    pub best_fixed: usize,
    /// Its mean reward per task.
    pub best_fixed_reward: f64,
    /// Mean reward per task of the per-task best member (the contextual optimum in hindsight).
    pub per_task_best_reward: f64,
}

/// The matched-cost comparison at one point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MatchedCost {
    pub cost_weight: f64,
    pub cost: f64,
    pub adaptive: f64,
    /// Single-verifier accuracy interpolated at `cost` (`None` outside its range).
    pub single: Option<f64>,
    /// Adaptive − single, points, with its 95 % task-bootstrap interval.
    pub gain_pp: Option<f64>,
    pub gain_ci_pp: Option<(f64, f64)>,
}

/// The replay's results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    pub members: Vec<String>,
    pub tasks: usize,
    pub streams: usize,
    pub passes: usize,
    pub orders_per_stream: usize,
    pub bootstrap_draws: usize,
    /// The reward's cost scale: the dearest member's mean cost per task.
    pub cost_scale: f64,
    /// Each member alone: (accuracy, cost per task).
    pub fixed: Vec<(f64, f64)>,
    /// The per-task best: the cheapest successful member of each task (the cheapest member
    /// where none succeeds).
    pub per_task_best: (f64, f64),
    /// Per cost weight, the best fixed member in hindsight and the per-task optimum's reward.
    pub hindsight: Vec<Hindsight>,
    pub adaptive: Vec<ReplayPoint>,
    pub single: Vec<ReplayPoint>,
    /// The midpoint between the cheapest and the dearest member's cost.
    pub midpoint_cost: f64,
    /// At the adaptive point nearest the midpoint (the paper's highlighted comparison), steady
    /// state and cold start.
    pub headline: MatchedCost,
    pub headline_cold: MatchedCost,
    /// Every adaptive point against the single-verifier frontier (steady state).
    pub matched: Vec<MatchedCost>,
}

/// Per task, over the orders: mean outcome and cost of the decisions in a pass, and decisions
/// per member.
#[derive(Debug, Clone)]
struct PerTask {
    success: Vec<f64>,
    cost: Vec<f64>,
}

/// Replay one configuration at cost weight `a`: per task, the mean (over orders) outcome and cost
/// in the last pass and in the first, and the scored pass's share per member.
fn replay(
    tasks: &[ReplayTask],
    members: usize,
    feedback: &Feedback,
    a: f64,
    scale: f64,
    opts: &ReplayOptions,
) -> Result<(PerTask, PerTask, Vec<f64>, Vec<f64>), ReplayError> {
    let n = tasks.len();
    let mut by_pass = vec![0.0; opts.passes];
    let mut last = PerTask { success: vec![0.0; n], cost: vec![0.0; n] };
    let mut first = last.clone();
    let mut picks = vec![0u64; members];
    let mut streams: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, t) in tasks.iter().enumerate() {
        streams.entry(t.stream).or_default().push(i);
    }
    let dim = tasks.first().map_or(0, |t| t.context.len());
    let mut program = 0u64;
    for (&stream, indices) in &streams {
        for k in 0..opts.orders {
            // The same orders for every configuration and cost weight: the comparison is paired.
            let mut rng = ChaCha8Rng::seed_from_u64(opts.seed ^ ((stream as u64) << 32) ^ k as u64);
            let mut order = indices.clone();
            order.shuffle(&mut rng);
            let mut learner = LinUcb::new(members, dim, ALPHA_UCB, true)?;
            for (pass, pass_reward) in by_pass.iter_mut().enumerate() {
                for &i in &order {
                    let t = &tasks[i];
                    let arm = learner.decide(program, &t.context)?.arm;
                    let verifier = match feedback {
                        Feedback::Adaptive => &t.classified,
                        Feedback::Single(v) => v,
                    };
                    let verdict = if *verifier == t.own_verifier { t.success[arm] } else { 0.0 };
                    learner.land(program, reward(verdict, t.cost[arm], a, scale))?;
                    program += 1;
                    *pass_reward += reward(t.success[arm], t.cost[arm], a, scale);
                    if pass + 1 == opts.passes {
                        last.success[i] += t.success[arm];
                        last.cost[i] += t.cost[arm];
                        picks[arm] += 1;
                    }
                    if pass == 0 {
                        first.success[i] += t.success[arm];
                        first.cost[i] += t.cost[arm];
                    }
                }
            }
        }
    }
    let orders = opts.orders.max(1) as f64;
    for v in [&mut last.success, &mut last.cost, &mut first.success, &mut first.cost] {
        v.iter_mut().for_each(|x| *x /= orders);
    }
    let total = picks.iter().sum::<u64>().max(1) as f64;
    // Every pass visits every task once per order.
    let decisions = (orders * n as f64).max(1.0);
    by_pass.iter_mut().for_each(|x| *x /= decisions);
    Ok((last, first, picks.iter().map(|&p| p as f64 / total).collect(), by_pass))
}

/// The best fixed member in hindsight and the per-task optimum at cost weight `a`.
fn hindsight_at(tasks: &[ReplayTask], members: usize, a: f64, scale: f64) -> Hindsight {
    let n = tasks.len().max(1) as f64;
    let fixed: Vec<f64> = (0..members)
        .map(|k| tasks.iter().map(|t| reward(t.success[k], t.cost[k], a, scale)).sum::<f64>() / n)
        .collect();
    // The first member wins a tie: the report names one.
    let best_fixed = (0..members).fold(0, |b, k| if fixed[k] > fixed[b] { k } else { b });
    let per_task_best_reward = tasks
        .iter()
        .map(|t| (0..members).map(|k| reward(t.success[k], t.cost[k], a, scale)).fold(f64::NEG_INFINITY, f64::max))
        .sum::<f64>()
        / n;
    Hindsight { cost_weight: a, best_fixed, best_fixed_reward: fixed.get(best_fixed).copied().unwrap_or(0.0), per_task_best_reward }
}

fn mean_at(values: &[f64], draw: &[usize]) -> f64 {
    draw.iter().map(|&i| values[i]).sum::<f64>() / draw.len().max(1) as f64
}

/// Linear interpolation of accuracy at `cost` on the (cost, accuracy) points, sorted by cost;
/// `None` outside their range.
pub fn interpolate(points: &[(f64, f64)], cost: f64) -> Option<f64> {
    let mut p = points.to_vec();
    p.sort_by(|x, y| x.0.total_cmp(&y.0));
    p.windows(2).find(|w| w[0].0 <= cost && cost <= w[1].0).map(|w| {
        let t = if w[1].0 > w[0].0 { (cost - w[0].0) / (w[1].0 - w[0].0) } else { 0.0 };
        w[0].1 + t * (w[1].1 - w[0].1)
    })
}

/// One configuration's per-task results at every cost weight.
struct Side {
    last: Vec<PerTask>,
    first: Vec<PerTask>,
    share: Vec<Vec<f64>>,
    reward_by_pass: Vec<Vec<f64>>,
}

impl Side {
    /// Accuracy and cost at cost weight `j` over the tasks of `draw`.
    fn point(&self, j: usize, draw: &[usize], cold: bool) -> (f64, f64) {
        let p = if cold { &self.first[j] } else { &self.last[j] };
        (mean_at(&p.success, draw), mean_at(&p.cost, draw))
    }
}

/// The matched-cost gain at adaptive point `j` on the tasks of `draw`.
fn gain_at(adaptive: &Side, single: &Side, weights: &[f64], j: usize, draw: &[usize], cold: bool) -> MatchedCost {
    let (acc, cost) = adaptive.point(j, draw, cold);
    let frontier: Vec<(f64, f64)> = (0..weights.len())
        .map(|k| {
            let (y, c) = single.point(k, draw, cold);
            (c, y)
        })
        .collect();
    let at = interpolate(&frontier, cost);
    MatchedCost {
        cost_weight: weights[j],
        cost,
        adaptive: acc,
        single: at,
        gain_pp: at.map(|y| (acc - y) * 100.0),
        gain_ci_pp: None,
    }
}

/// Run the replay for both configurations (adaptive, and `single_verifier` for every task).
pub fn run(
    members: &[String],
    tasks: &[ReplayTask],
    single_verifier: &str,
    opts: &ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    let m = members.len();
    if m == 0 || tasks.is_empty() || opts.passes == 0 || opts.orders == 0 || opts.cost_weights.is_empty() {
        return Err(ReplayError::Input("needs members, tasks, passes, orders and cost weights".into()));
    }
    let dim = tasks[0].context.len();
    if let Some(t) = tasks.iter().find(|t| t.success.len() != m || t.cost.len() != m || t.context.len() != dim) {
        return Err(ReplayError::Input(format!(
            "a task has {} outcomes, {} costs and a context of {} for {m} members and a context of {dim}",
            t.success.len(),
            t.cost.len(),
            t.context.len()
        )));
    }
    let all: Vec<usize> = (0..tasks.len()).collect();
    let fixed: Vec<(f64, f64)> = (0..m)
        .map(|k| {
            let s: Vec<f64> = tasks.iter().map(|t| t.success[k]).collect();
            let c: Vec<f64> = tasks.iter().map(|t| t.cost[k]).collect();
            (mean_at(&s, &all), mean_at(&c, &all))
        })
        .collect();
    let best: Vec<(f64, f64)> = tasks
        .iter()
        .map(|t| {
            let cheapest = |ok: bool| {
                (0..m).filter(|&k| !ok || t.success[k] >= 1.0).min_by(|&x, &y| t.cost[x].total_cmp(&t.cost[y]))
            };
            match cheapest(true) {
                Some(k) => (1.0, t.cost[k]),
                None => (0.0, cheapest(false).map_or(0.0, |k| t.cost[k])),
            }
        })
        .collect();
    let per_task_best = (
        best.iter().map(|b| b.0).sum::<f64>() / tasks.len() as f64,
        best.iter().map(|b| b.1).sum::<f64>() / tasks.len() as f64,
    );
    let cost_scale = fixed.iter().map(|f| f.1).fold(0.0, f64::max).max(f64::MIN_POSITIVE);
    let weights = &opts.cost_weights;
    let mut sides = Vec::new();
    for feedback in [Feedback::Adaptive, Feedback::Single(single_verifier.to_string())] {
        let mut side = Side { last: Vec::new(), first: Vec::new(), share: Vec::new(), reward_by_pass: Vec::new() };
        for &a in weights {
            let (last, first, share, by_pass) = replay(tasks, m, &feedback, a, cost_scale, opts)?;
            side.last.push(last);
            side.first.push(first);
            side.share.push(share);
            side.reward_by_pass.push(by_pass);
        }
        sides.push(side);
    }
    let (adaptive, single) = (&sides[0], &sides[1]);
    let hindsight: Vec<Hindsight> = weights.iter().map(|&a| hindsight_at(tasks, m, a, cost_scale)).collect();
    let points = |s: &Side| -> Vec<ReplayPoint> {
        weights
            .iter()
            .enumerate()
            .map(|(j, &a)| {
                let (accuracy, cost) = s.point(j, &all, false);
                let (cold_accuracy, cold_cost) = s.point(j, &all, true);
                let reward_by_pass = s.reward_by_pass[j].clone();
                let regret_by_pass = reward_by_pass.iter().map(|r| hindsight[j].best_fixed_reward - r).collect();
                ReplayPoint {
                    cost_weight: a,
                    accuracy,
                    cost,
                    cold_accuracy,
                    cold_cost,
                    share: s.share[j].clone(),
                    reward_by_pass,
                    regret_by_pass,
                }
            })
            .collect()
    };
    let (lo, hi) = fixed.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), f| (lo.min(f.1), hi.max(f.1)));
    let midpoint_cost = (lo + hi) / 2.0;
    let nearest = |cold: bool| {
        (0..weights.len())
            .min_by(|&x, &y| {
                let dx = (adaptive.point(x, &all, cold).1 - midpoint_cost).abs();
                let dy = (adaptive.point(y, &all, cold).1 - midpoint_cost).abs();
                dx.total_cmp(&dy)
            })
            .unwrap_or(0)
    };
    // Stratified task bootstrap: each draw resamples every family's tasks with replacement.
    let mut families: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, t) in tasks.iter().enumerate() {
        families.entry(t.family).or_default().push(i);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed.wrapping_add(1));
    let draws: Vec<Vec<usize>> = (0..opts.bootstrap)
        .map(|_| {
            families
                .values()
                .flat_map(|f| (0..f.len()).map(|_| f[rng.random_range(0..f.len())]).collect::<Vec<_>>())
                .collect()
        })
        .collect();
    let with_interval = |j: usize, cold: bool| {
        let mut g = gain_at(adaptive, single, weights, j, &all, cold);
        let mut boots: Vec<f64> =
            draws.iter().filter_map(|d| gain_at(adaptive, single, weights, j, d, cold).gain_pp).collect();
        // An interval only when (nearly) every draw has an interpolated single-verifier point.
        if g.gain_pp.is_some() && boots.len() * 20 >= draws.len() * 19 && !boots.is_empty() {
            boots.sort_by(f64::total_cmp);
            let q = |p: f64| boots[((boots.len() as f64 * p) as usize).min(boots.len() - 1)];
            g.gain_ci_pp = Some((q(0.025), q(0.975)));
        }
        g
    };
    Ok(ReplayReport {
        members: members.to_vec(),
        tasks: tasks.len(),
        streams: tasks.iter().map(|t| t.stream).collect::<std::collections::BTreeSet<_>>().len(),
        passes: opts.passes,
        orders_per_stream: opts.orders,
        bootstrap_draws: opts.bootstrap,
        cost_scale,
        fixed,
        per_task_best,
        adaptive: points(adaptive),
        single: points(single),
        hindsight,
        midpoint_cost,
        headline: with_interval(nearest(false), false),
        headline_cold: with_interval(nearest(true), true),
        matched: (0..weights.len()).map(|j| gain_at(adaptive, single, weights, j, &all, false)).collect(),
    })
}

impl ReplayReport {
    /// The report as Markdown (a section of `bench-report/oracle.md`).
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "## Steady state: the learner replayed over measured per-task outcomes (paper 002 Appendix E)\n\n\
             ![accuracy against cost per feedback configuration; regret by pass](oracle.svg)\n\n\
             The paper's frontier protocol on this bench's tasks: {} tasks ({} streams — one per seed — of the routed \
             sessions above), each with its outcome and compute cost in every member's single-model run of the same trace; \
             the core's LinUCB replayed over {} random orders per stream, {} passes, the last scored (the first is the cold \
             start); verdicts land at once; the same orders for both feedback configurations. Matched cost: the adaptive point \
             nearest the midpoint between the cheapest and the dearest member's cost ({:.0}), single-verifier accuracy \
             interpolated there; 95 % task bootstrap stratified by workflow, {} draws. Reward scale {:.0} (the dearest \
             member's mean cost per task).\n\n| policy | a | accuracy | cost / task | cold accuracy | cold cost |\n\
             | --- | ---: | ---: | ---: | ---: | ---: |\n",
            self.tasks,
            self.streams,
            self.orders_per_stream,
            self.passes,
            self.midpoint_cost,
            self.bootstrap_draws,
            self.cost_scale
        );
        for (name, (acc, cost)) in self.members.iter().zip(&self.fixed) {
            out.push_str(&format!("| {name} alone | – | {:.1} % | {cost:.0} | | |\n", acc * 100.0));
        }
        out.push_str(&format!(
            "| per-task best | – | {:.1} % | {:.0} | | |\n",
            self.per_task_best.0 * 100.0,
            self.per_task_best.1
        ));
        for (name, side) in [("adaptive", &self.adaptive), ("single verifier", &self.single)] {
            for p in side {
                out.push_str(&format!(
                    "| {name} | {} | {:.1} % | {:.0} | {:.1} % | {:.0} |\n",
                    p.cost_weight,
                    p.accuracy * 100.0,
                    p.cost,
                    p.cold_accuracy * 100.0,
                    p.cold_cost
                ));
            }
        }
        let line = |label: &str, g: &MatchedCost| match (g.single, g.gain_pp) {
            (Some(y), Some(gain)) => format!(
                "{label}: adaptive at a = {} costs {:.0} for {:.1} %, single-verifier feedback at that cost {:.1} %: \
                 **{gain:+.1} pp**{}.\n",
                g.cost_weight,
                g.cost,
                g.adaptive * 100.0,
                y * 100.0,
                g.gain_ci_pp.map(|(lo, hi)| format!(" (95 % interval {lo:+.1} … {hi:+.1} pp)")).unwrap_or_default()
            ),
            _ => format!(
                "{label}: adaptive at a = {} costs {:.0}, outside the single-verifier frontier's cost range.\n",
                g.cost_weight, g.cost
            ),
        };
        out.push('\n');
        out.push_str(&line("Steady state (last of the passes), matched cost", &self.headline));
        out.push_str(&line("\nCold start (first pass), matched cost", &self.headline_cold));
        out.push_str("\nEvery adaptive point against the single-verifier frontier (steady state):\n\n| a | cost / task | adaptive | single at that cost | gain |\n| ---: | ---: | ---: | ---: | ---: |\n");
        for g in &self.matched {
            match (g.single, g.gain_pp) {
                (Some(y), Some(gain)) => out.push_str(&format!(
                    "| {} | {:.0} | {:.1} % | {:.1} % | {gain:+.1} pp |\n",
                    g.cost_weight,
                    g.cost,
                    g.adaptive * 100.0,
                    y * 100.0
                )),
                _ => out.push_str(&format!(
                    "| {} | {:.0} | {:.1} % | outside its range | – |\n",
                    g.cost_weight,
                    g.cost,
                    g.adaptive * 100.0
                )),
            }
        }
        out.push_str(&self.regret_markdown());
        out
    }

    /// The regret table: each configuration's mean reward per task against the best fixed member
    /// in hindsight, per cost weight.
    fn regret_markdown(&self) -> String {
        let mut out = format!(
            "\nRegret against the best fixed policy in hindsight (Appendix E's reward r = success − a·cost/scale, scored by \
             the task's own outcome, mean per task; the best fixed member is the one whose single-model run has the \
             highest mean reward over all {} tasks at that a; regret = its reward − the learner's; negative: the \
             contextual learner beats every fixed member; the per-task best is the contextual optimum, no learner can \
             exceed it). First pass = cold start, last = the scored pass, mean = over all {} passes (the cumulative \
             regret per task divided by the passes):\n\n\
             | a | best fixed member | its reward | per-task best | adaptive reward | adaptive regret first / last / mean | \
             single-verifier reward | its regret first / last / mean |\n\
             | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
            self.tasks, self.passes
        );
        let regret = |p: &ReplayPoint| {
            let first = p.regret_by_pass.first().copied().unwrap_or(0.0);
            let last = p.regret_by_pass.last().copied().unwrap_or(0.0);
            let mean = p.regret_by_pass.iter().sum::<f64>() / p.regret_by_pass.len().max(1) as f64;
            format!("{first:+.3} / {last:+.3} / {mean:+.3}")
        };
        for ((h, ad), si) in self.hindsight.iter().zip(&self.adaptive).zip(&self.single) {
            out.push_str(&format!(
                "| {} | {} | {:.3} | {:.3} | {:.3} | {} | {:.3} | {} |\n",
                h.cost_weight,
                self.members.get(h.best_fixed).map_or("–", String::as_str),
                h.best_fixed_reward,
                h.per_task_best_reward,
                ad.reward_by_pass.last().copied().unwrap_or(0.0),
                regret(ad),
                si.reward_by_pass.last().copied().unwrap_or(0.0),
                regret(si)
            ));
        }
        out.push('\n');
        out
    }
}

impl ReplayReport {
    /// The replay as an SVG chart (plotters): (a) accuracy against compute cost per task for
    /// both feedback configurations in the steady state (solid) and the cold pass (dashed), each
    /// member alone and the per-task best (Fig. 5 / 9's frontier); (b) regret per task against
    /// the best fixed member in hindsight, pass by pass, at a = 0 and at the headline's a.
    pub fn frontier_svg(&self) -> Result<String, ReplayError> {
        use plotters::prelude::*;
        let s = |e: &dyn std::fmt::Display| ReplayError::Chart(e.to_string());
        if self.adaptive.is_empty() || self.single.is_empty() {
            return Err(ReplayError::NoPoints);
        }
        let palette = crate::report::timeline::PALETTE;
        let (adaptive_color, single_color) = (palette[0], palette[1]);
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (1100, 460)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| s(&e))?;
            let panels = root.split_evenly((1, 2));
            // (a) The frontier.
            // Every (accuracy, cost) point drawn: both configurations steady and cold, each
            // member alone, the per-task best.
            let points: Vec<(f64, f64)> = self
                .adaptive
                .iter()
                .chain(&self.single)
                .flat_map(|p| [(p.accuracy, p.cost), (p.cold_accuracy, p.cold_cost)])
                .chain(self.fixed.iter().copied())
                .chain([self.per_task_best])
                .collect();
            let xmax = points.iter().map(|p| p.1).fold(1.0, f64::max) * 1.08;
            let ymin = (points.iter().map(|p| p.0).fold(1.0, f64::min) * 100.0 - 8.0).clamp(0.0, 90.0).floor();
            let mut chart = ChartBuilder::on(&panels[0])
                .caption("(a) accuracy against compute cost (steady state solid, cold pass dashed)", ("sans-serif", 14))
                .margin(12)
                .x_label_area_size(34)
                .y_label_area_size(50)
                .build_cartesian_2d(0.0..xmax, ymin..104.0)
                .map_err(|e| s(&e))?;
            chart
                .configure_mesh()
                .x_desc("cost per task (billions of parameter-tokens)")
                .y_desc("accuracy %")
                .draw()
                .map_err(|e| s(&e))?;
            for (name, side, color) in [("adaptive", &self.adaptive, adaptive_color), ("single verifier", &self.single, single_color)] {
                let steady: Vec<(f64, f64)> = side.iter().map(|p| (p.cost, p.accuracy * 100.0)).collect();
                let cold: Vec<(f64, f64)> = side.iter().map(|p| (p.cold_cost, p.cold_accuracy * 100.0)).collect();
                chart
                    .draw_series(LineSeries::new(steady.clone(), color.stroke_width(2)))
                    .map_err(|e| s(&e))?
                    .label(name.to_string())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                chart.draw_series(steady.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(|e| s(&e))?;
                chart
                    .draw_series(DashedLineSeries::new(cold, 5, 4, color.mix(0.7).stroke_width(1)))
                    .map_err(|e| s(&e))?;
            }
            let fixed: Vec<(String, (f64, f64))> = self
                .members
                .iter()
                .zip(&self.fixed)
                .map(|(m, f)| (format!("{m} alone"), (f.1, f.0 * 100.0)))
                .chain([("per-task best".to_string(), (self.per_task_best.1, self.per_task_best.0 * 100.0))])
                .collect();
            for (label, at) in fixed {
                use plotters::style::text_anchor::{HPos, Pos, VPos};
                chart
                    .draw_series([Rectangle::new([(at.0 - xmax * 0.006, at.1 - 0.8), (at.0 + xmax * 0.006, at.1 + 0.8)], BLACK.filled())])
                    .map_err(|e| s(&e))?;
                // Labels of points in the right third read leftwards, so they stay in the panel.
                let (x, h) = if at.0 > xmax * 0.66 { (at.0 - xmax * 0.012, HPos::Right) } else { (at.0 + xmax * 0.012, HPos::Left) };
                let style = ("sans-serif", 12).into_font().color(&BLACK).pos(Pos::new(h, VPos::Bottom));
                chart.draw_series([Text::new(label, (x, at.1 + 1.0), style)]).map_err(|e| s(&e))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| s(&e))?;
            // (b) Regret pass by pass.
            let headline = self.adaptive.iter().position(|p| p.cost_weight == self.headline.cost_weight).unwrap_or(0);
            let mut shown = vec![0usize];
            if headline != 0 {
                shown.push(headline);
            }
            let regrets = shown.iter().flat_map(|&j| self.adaptive[j].regret_by_pass.iter().chain(&self.single[j].regret_by_pass));
            let (lo, hi) = regrets.fold((0.0f64, 0.0f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
            let pad = (hi - lo).max(0.01) * 0.35;
            let mut chart = ChartBuilder::on(&panels[1])
                .caption("(b) regret per task against the best fixed member in hindsight", ("sans-serif", 14))
                .margin(12)
                .x_label_area_size(34)
                .y_label_area_size(56)
                .build_cartesian_2d(0.5..self.passes as f64 + 0.5, (lo - pad * 0.3)..(hi + pad))
                .map_err(|e| s(&e))?;
            chart.configure_mesh().x_desc("pass over the stream").y_desc("regret per task").draw().map_err(|e| s(&e))?;
            for (k, &j) in shown.iter().enumerate() {
                for (name, side, color) in [("adaptive", &self.adaptive, adaptive_color), ("single verifier", &self.single, single_color)] {
                    let pts: Vec<(f64, f64)> =
                        side[j].regret_by_pass.iter().enumerate().map(|(i, r)| ((i + 1) as f64, *r)).collect();
                    let a = side[j].cost_weight;
                    let label = format!("{name}, a = {a}");
                    if k == 0 {
                        chart
                            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                            .map_err(|e| s(&e))?
                            .label(label)
                            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                    } else {
                        chart
                            .draw_series(DashedLineSeries::new(pts.clone(), 5, 4, color.stroke_width(2)))
                            .map_err(|e| s(&e))?
                            .label(label)
                            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 6, y), (x + 10, y), (x + 18, y)], color.mix(0.6).stroke_width(2)));
                    }
                    chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled()))).map_err(|e| s(&e))?;
                }
            }
            chart
                .draw_series(LineSeries::new([(0.5, 0.0), (self.passes as f64 + 0.5, 0.0)], BLACK.mix(0.5).stroke_width(1)))
                .map_err(|e| s(&e))?;
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| s(&e))?;
            root.present().map_err(|e| s(&e))?;
        }
        Ok(svg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two families told apart by the context; on family 0 (verifier "x") only member 1
    /// succeeds, on family 1 (verifier "y") only member 0 — and member 1 costs four times more.
    fn tasks(per_family: usize) -> Vec<ReplayTask> {
        (0..2 * per_family)
            .map(|i| {
                let f = i % 2;
                ReplayTask {
                    family: f,
                    stream: 0,
                    own_verifier: ["x", "y"][f].into(),
                    classified: ["x", "y"][f].into(),
                    context: if f == 0 { vec![1.0, 1.0, 0.0] } else { vec![1.0, 0.0, 1.0] },
                    success: if f == 0 { vec![0.0, 1.0] } else { vec![1.0, 0.0] },
                    cost: vec![1.0, 4.0],
                }
            })
            .collect()
    }

    fn opts() -> ReplayOptions {
        ReplayOptions { passes: 4, orders: 3, cost_weights: vec![0.0, 0.5, 1.0], bootstrap: 50, seed: 7 }
    }

    #[test]
    fn the_adaptive_learner_converges_to_each_familys_member_and_the_single_one_cannot() {
        let members = vec!["small".to_string(), "large".to_string()];
        let r = run(&members, &tasks(20), "x", &opts()).unwrap();
        assert_eq!(r.fixed, vec![(0.5, 1.0), (0.5, 4.0)]);
        assert_eq!(r.per_task_best, (1.0, 2.5), "the cheaper successful member of each task");
        // Adaptive at a = 0: after four passes every task goes to the member that succeeds on it.
        assert_eq!(r.adaptive[0].accuracy, 1.0, "{:?}", r.adaptive[0]);
        assert!(r.adaptive[0].cold_accuracy < 1.0, "the first pass explores: {:?}", r.adaptive[0]);
        // Single verifier "x": family 1's successes on member 0 read as failures; at a = 0 both
        // members score 0 there, so it keeps sending some of family 1 to member 1. (Once cost
        // counts it sends family 1 to the cheap member, which happens to be the right one here.)
        assert!(r.single[0].accuracy < 1.0, "{:?}", r.single[0]);
        assert!(r.single[0].share[1] > r.adaptive[0].share[1], "{:?} {:?}", r.single[0], r.adaptive[0]);
        // Deterministic: the same inputs give the same report.
        assert_eq!(r, run(&members, &tasks(20), "x", &opts()).unwrap());
    }

    #[test]
    fn regret_is_measured_against_the_best_fixed_member_in_hindsight() {
        let members = vec!["small".to_string(), "large".to_string()];
        let r = run(&members, &tasks(20), "x", &opts()).unwrap();
        assert_eq!(r.cost_scale, 4.0);
        // a = 0: both members succeed on half the tasks (a tie, the first is named); the per-task
        // optimum succeeds everywhere.
        let h0 = &r.hindsight[0];
        assert_eq!((h0.best_fixed, h0.best_fixed_reward, h0.per_task_best_reward), (0, 0.5, 1.0));
        // a = 1, scale 4: small 0.5 − 1/4, large 0.5 − 4/4; per task, family 0 max(0 − 0.25, 1 − 1)
        // = 0 and family 1 max(1 − 0.25, 0 − 1) = 0.75.
        let h2 = &r.hindsight[2];
        assert_eq!(h2.cost_weight, 1.0);
        assert_eq!((h2.best_fixed, h2.best_fixed_reward, h2.per_task_best_reward), (0, 0.25, 0.375));
        // The adaptive learner at a = 0 ends at the per-task optimum: it beats the best fixed
        // member by half a success per task, and it got there by learning.
        let p = &r.adaptive[0];
        assert_eq!(p.reward_by_pass.len(), 4);
        assert_eq!(p.reward_by_pass[3], 1.0);
        assert_eq!(p.regret_by_pass[3], -0.5);
        assert!(p.regret_by_pass[0] > p.regret_by_pass[3], "{:?}", p.regret_by_pass);
        // Reward and regret add up to the best fixed reward, pass by pass.
        for (reward, regret) in p.reward_by_pass.iter().zip(&p.regret_by_pass) {
            assert!((reward + regret - 0.5).abs() < 1e-12);
        }
        // The scored pass's reward is its accuracy less the weighted cost.
        for (j, q) in r.adaptive.iter().enumerate() {
            let a = r.hindsight[j].cost_weight;
            assert!((q.reward_by_pass[3] - (q.accuracy - a * q.cost / r.cost_scale)).abs() < 1e-12, "{q:?}");
        }
        let md = r.markdown();
        assert!(md.contains("| 0 | small | 0.500 | 1.000 | 1.000 | "), "{md}");
        let svg = r.frontier_svg().unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("small alone") && svg.contains("per-task best"), "{svg}");
        assert!(svg.contains("adaptive, a = 0") && svg.contains("single verifier, a = 0"));
    }

    #[test]
    fn interpolation_stays_inside_the_frontier() {
        let points = [(1.0, 0.5), (3.0, 0.7)];
        assert_eq!(interpolate(&points, 2.0), Some(0.6));
        assert_eq!(interpolate(&points, 0.5), None);
        assert_eq!(interpolate(&points, 3.5), None);
    }

    #[test]
    fn the_headline_is_the_adaptive_point_nearest_the_midpoint_cost() {
        let members = vec!["small".to_string(), "large".to_string()];
        let r = run(&members, &tasks(20), "x", &opts()).unwrap();
        assert_eq!(r.midpoint_cost, 2.5);
        let nearest = r
            .adaptive
            .iter()
            .min_by(|p, q| (p.cost - 2.5).abs().total_cmp(&(q.cost - 2.5).abs()))
            .map(|p| p.cost_weight)
            .unwrap();
        assert_eq!(r.headline.cost_weight, nearest);
    }

    #[test]
    fn mismatched_tasks_are_refused() {
        let mut t = tasks(2);
        t[1].cost.pop();
        assert!(matches!(run(&["a".into(), "b".into()], &t, "x", &opts()), Err(ReplayError::Input(_))));
    }
}
