//! The open issues' numeric goals checked against a [`BenchReport`]: the joint planner's margins
//! over the baselines (paper 003's, as the joint-planner issue states them) and the calibrated
//! regime's targets for the baselines (the regime issue). Each goal is computed from the runs
//! of the report it is part of, never written by hand: the section "Goals" of `report.md` and
//! `goals` in `bench.json`. Pure computation and text; no I/O.
//!
//! A goal whose rows the report lacks (a quick bench without a baseline or an arrival) is left
//! out, and so are the regime's targets unless the bench ran the paper's setup (pool `paper`, 60
//! sessions per workflow): they compare absolute numbers with the paper's. "A difference under 1 % is a tie, not a win": a goal to be *lower* asks for at least
//! 1 % less; a goal to be *no worse* accepts a tie.

use std::fmt::Write;

use serde::Serialize;

use super::paper::{self, BASELINES, OURS, Published};
use super::{BenchReport, BenchRun, change_pct};

/// The paper's setup (§4.1): its pool and 60 sessions per workflow.
const PAPER_POOL: &str = "paper";
const PAPER_SESSIONS: usize = 60;

/// A change under this (in %) is a tie.
const TIE_PCT: f64 = 1.0;

/// How a goal's measured value is judged.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Target {
    /// The value must be at most `bound`.
    AtMost { bound: f64 },
    /// The value must be below `bound` (a tie at the bound is not enough).
    Below { bound: f64 },
    /// The value must lie in `[low, high]`.
    Within { low: f64, high: f64 },
}

impl Target {
    fn met(&self, v: f64) -> bool {
        match *self {
            Target::AtMost { bound } => v <= bound,
            Target::Below { bound } => v < bound,
            Target::Within { low, high } => (low..=high).contains(&v),
        }
    }

    /// How far `v` is from the target (0 when met), in the value's unit.
    fn miss(&self, v: f64) -> f64 {
        match *self {
            Target::AtMost { bound } | Target::Below { bound } => (v - bound).max(0.0),
            Target::Within { low, high } => (low - v).max(v - high).max(0.0),
        }
    }
}

/// One goal, measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Goal {
    /// Which issue states it: `joint` (the joint planner, second half) or `regime` (the paper's
    /// regime on the emulated pool).
    pub issue: &'static str,
    /// What is measured, in words.
    pub goal: String,
    /// The measured value (mean over the repetitions), in `unit`.
    pub measured: f64,
    /// `%` (a change against a baseline) or `×` (a ratio).
    pub unit: &'static str,
    pub target: Target,
    pub met: bool,
    /// How far the value is from the target, in `unit`; 0 when met.
    pub missed_by: f64,
}

fn goal(issue: &'static str, text: String, measured: Option<f64>, unit: &'static str, target: Target) -> Option<Goal> {
    let v = measured.filter(|v| v.is_finite())?;
    Some(Goal { issue, goal: text, measured: v, unit, met: target.met(v), missed_by: target.miss(v), target })
}

fn p95(r: &BenchRun) -> f64 {
    r.latency_s.p95_or_nan()
}

/// Every goal the report's rows allow, in the order the issues state them.
pub fn check(report: &BenchReport) -> Vec<Goal> {
    let mut out = Vec::new();
    joint_margins(report, &mut out);
    if report.setup.pool == PAPER_POOL && report.setup.sessions_per_workflow == PAPER_SESSIONS {
        regime_targets(report, &mut out);
    }
    out
}

/// The joint-planner issue, item 7: margins in burst, the lowest makespan in every arrival,
/// Poisson p95 no worse than the better baseline's, GPU-seconds per session below both
/// baselines for every workflow, and the ratio to the lower bound in burst.
fn joint_margins(report: &BenchReport, out: &mut Vec<Goal>) {
    let baselines: Vec<&str> = BASELINES.iter().copied().filter(|b| report.runs.iter().any(|r| r.variant == *b)).collect();
    let burst = "burst";
    if let Some(j) = report.row(OURS, burst) {
        for b in &baselines {
            let Some(x) = report.row(b, burst) else { continue };
            out.extend(goal(
                "joint",
                format!("burst makespan against {b} (paper −35.8 / −36.8 %)"),
                change_pct(j.makespan_s, x.makespan_s),
                "%",
                Target::AtMost { bound: -35.0 },
            ));
            out.extend(goal(
                "joint",
                format!("burst p95 against {b} (paper −25.4 / −25.9 %)"),
                change_pct(p95(j), p95(x)),
                "%",
                Target::AtMost { bound: -25.0 },
            ));
        }
    }
    for a in &report.setup.arrivals {
        let Some(j) = report.row(OURS, a) else { continue };
        for b in &baselines {
            let Some(x) = report.row(b, a) else { continue };
            out.extend(goal(
                "joint",
                format!("{a} makespan against {b}: the lowest, by more than a tie"),
                change_pct(j.makespan_s, x.makespan_s),
                "%",
                Target::AtMost { bound: -TIE_PCT },
            ));
        }
        if a != burst {
            let better = baselines.iter().filter_map(|b| report.row(b, a)).map(p95).filter(|v| v.is_finite()).reduce(f64::min);
            if let Some(better) = better {
                out.extend(goal(
                    "joint",
                    format!("{a} p95 against the better baseline's: no worse"),
                    change_pct(p95(j), better),
                    "%",
                    Target::Below { bound: TIE_PCT },
                ));
            }
        }
    }
    if let Some(j) = report.row(OURS, burst) {
        for w in &report.setup.workflows {
            for b in &baselines {
                let ours = j.workflows.get(w).map(|x| x.gpu_seconds_per_session.total());
                let base = report.row(b, burst).and_then(|r| r.workflows.get(w)).map(|x| x.gpu_seconds_per_session.total());
                if let (Some(o), Some(x)) = (ours, base) {
                    out.extend(goal(
                        "joint",
                        format!("burst GPU-s per completed session, {w}, against {b}: lower"),
                        change_pct(o, x),
                        "%",
                        Target::AtMost { bound: -TIE_PCT },
                    ));
                }
            }
        }
        out.extend(goal(
            "joint",
            "burst makespan over the lower bound".into(),
            Some(j.ratio_to_lower_bound),
            "×",
            Target::AtMost { bound: 1.3 },
        ));
    }
}

/// The regime issue, item 2: each baseline's burst makespan and p95 within ±20 % of the paper's
/// and its GPU-seconds per completed session within ±25 % per workflow (ratios to the midpoint
/// of the published value).
fn regime_targets(report: &BenchReport, out: &mut Vec<Goal>) {
    let ratio = |ours: f64, paper: &Published| {
        let m = paper.mid();
        (m > 0.0).then(|| ours / m)
    };
    for (policy, arrival, makespan, p95_paper) in paper::figure5() {
        if arrival != "burst" || !BASELINES.contains(&policy) {
            continue;
        }
        let Some(r) = report.row(policy, arrival) else { continue };
        out.extend(goal(
            "regime",
            format!("{policy} burst makespan over the paper's ({})", makespan.text(1)),
            ratio(r.makespan_s, &makespan),
            "×",
            Target::Within { low: 0.8, high: 1.2 },
        ));
        if let Some(pp) = p95_paper {
            out.extend(goal(
                "regime",
                format!("{policy} burst p95 over the paper's ({})", pp.text(1)),
                ratio(p95(r), &pp),
                "×",
                Target::Within { low: 0.8, high: 1.2 },
            ));
        }
    }
    for (wf, policy, total, _) in paper::figure6() {
        if !BASELINES.contains(&policy) {
            continue;
        }
        let Some(w) = report.row(policy, "burst").and_then(|r| r.workflows.get(wf)) else { continue };
        out.extend(goal(
            "regime",
            format!("{policy} burst GPU-s per completed session, {wf}, over the paper's ({})", total.text(2)),
            ratio(w.gpu_seconds_per_session.total(), &total),
            "×",
            Target::Within { low: 0.75, high: 1.25 },
        ));
    }
}

fn value(v: f64, unit: &str) -> String {
    if unit == "%" { paper::pct(Some(v)) } else { format!("{v:.2}{unit}") }
}

fn target_text(t: &Target, unit: &str) -> String {
    match *t {
        Target::AtMost { bound } => format!("≤ {}", value(bound, unit)),
        Target::Below { bound } => format!("< {}", value(bound, unit)),
        Target::Within { low, high } => format!("{} – {}", value(low, unit), value(high, unit)),
    }
}

/// The section "Goals" of `report.md`.
pub fn render(out: &mut String, goals: &[Goal]) {
    if goals.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Goals, computed from these runs\n");
    let _ = writeln!(
        out,
        "The numeric goals of the open issues, each checked on this report's means (a difference \
         under 1 % is a tie: *lower* asks for at least 1 % less, *no worse* accepts a tie). \
         `joint`: the joint planner's margins (paper 003 §4.2–4.3); `regime`: the baselines' \
         calibration targets (ratio to the paper's value, the midpoint of a range). Misses are \
         in points (%) or in the ratio's unit.\n"
    );
    let _ = writeln!(out, "| issue | goal | measured | target | result |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for g in goals {
        let result = if g.met {
            "met".to_string()
        } else if g.unit == "%" {
            format!("missed by {:.1} points", g.missed_by)
        } else {
            format!("missed by {:.2}", g.missed_by)
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {result} |",
            g.issue,
            g.goal,
            value(g.measured, g.unit),
            target_text(&g.target, g.unit)
        );
    }
    let met = goals.iter().filter(|g| g.met).count();
    let _ = writeln!(out, "\n{met} of {} goals met.\n", goals.len());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tie_is_not_a_win_but_is_no_worse() {
        let lower = Target::AtMost { bound: -TIE_PCT };
        assert!(!lower.met(-0.6), "a 0.6 % reduction is a tie, not the lowest makespan");
        assert!(lower.met(-1.0) && lower.met(-24.1));
        assert!((lower.miss(0.6) - 1.6).abs() < 1e-12);
        let no_worse = Target::Below { bound: TIE_PCT };
        assert!(no_worse.met(0.6) && no_worse.met(-9.0));
        assert!(!no_worse.met(1.0) && !no_worse.met(4.0));
    }

    #[test]
    fn a_margin_goal_is_missed_by_the_points_it_lacks() {
        let t = Target::AtMost { bound: -35.0 };
        assert!(!t.met(-28.7));
        assert!((t.miss(-28.7) - 6.3).abs() < 1e-9);
        assert_eq!(t.miss(-36.0), 0.0);
        let band = Target::Within { low: 0.8, high: 1.2 };
        assert!(band.met(1.18) && !band.met(1.25) && !band.met(0.7));
        assert!((band.miss(1.25) - 0.05).abs() < 1e-12 && (band.miss(0.7) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn an_unmeasured_value_is_no_goal() {
        assert!(goal("joint", "x".into(), None, "%", Target::AtMost { bound: 0.0 }).is_none());
        assert!(goal("joint", "x".into(), Some(f64::NAN), "%", Target::AtMost { bound: 0.0 }).is_none());
        let g = goal("joint", "x".into(), Some(-40.0), "%", Target::AtMost { bound: -35.0 });
        assert!(g.is_some_and(|g| g.met && g.missed_by == 0.0));
    }
}
