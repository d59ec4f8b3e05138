//! Paper 003's published numbers for Figures 5–7 and the comparison of a [`BenchReport`] with
//! them: the section "Beside paper 003" of `report.md`; also the report's policy names (ours and
//! the baselines) and its percent format, which `markdown.rs` and `goals.rs` both use. Pure data
//! and text; no I/O. A leaf of `bench`: must not depend on `markdown.rs` or `goals.rs`.
//!
//! The paper reports its own system's numbers and its reductions against the baselines; the
//! baselines' values are derived from those (e.g. Parrot's burst makespan = 634.2 s / (1 −
//! 0.358)). Where the paper gives a reduction range over the two baselines without saying which
//! is which, the derived value is that range and belongs to both.

use std::fmt::Write;

use super::{BenchReport, BenchRun, change_pct};

/// The policy whose reductions are reported, and the baselines it is compared with (shared by
/// the report's sections and the goals).
pub(super) const OURS: &str = "joint";
pub(super) const BASELINES: [&str; 2] = ["parrot", "kairos"];

/// A change in percent as the report prints it: signed, one decimal; `–` for none.
pub(super) fn pct(x: Option<f64>) -> String {
    match x {
        // No "−0.0 %": a change that rounds to zero is zero.
        Some(v) if v.abs() < 0.05 => "0.0 %".into(),
        Some(v) => format!("{v:+.1} %"),
        None => "–".into(),
    }
}

/// A published value: one number, or the range the paper gives over two baselines.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Published {
    pub low: f64,
    pub high: f64,
}

impl Published {
    const fn one(v: f64) -> Self {
        Published { low: v, high: v }
    }

    /// A value `ours` reduced by `lo..hi` (fractions) from: `ours / (1 − r)`.
    fn before_reduction(ours: f64, lo: f64, hi: f64) -> Self {
        Published { low: ours / (1.0 - lo), high: ours / (1.0 - hi) }
    }

    pub(super) fn mid(&self) -> f64 {
        (self.low + self.high) / 2.0
    }

    /// The value with `digits` decimals, a range as `low–high`.
    pub(super) fn text(&self, digits: usize) -> String {
        if (self.high - self.low).abs() < 0.5 * 10f64.powi(-(digits as i32)) {
            format!("{:.*}", digits, self.low)
        } else {
            format!("{:.*}–{:.*}", digits, self.low, digits, self.high)
        }
    }
}

/// Figure 5, overall: (policy, arrival, makespan, p95) as published (§4.2). `None`: not given.
pub fn figure5() -> Vec<(&'static str, &'static str, Published, Option<Published>)> {
    let p95_baselines = Published::before_reduction(587.0, 0.254, 0.259);
    vec![
        ("joint", "burst", Published::one(634.2), Some(Published::one(587.0))),
        ("parrot", "burst", Published::before_reduction(634.2, 0.358, 0.358), Some(p95_baselines)),
        ("kairos", "burst", Published::before_reduction(634.2, 0.368, 0.368), Some(p95_baselines)),
        ("joint", "poisson:0.15", Published::one(965.1), None),
        ("parrot", "poisson:0.15", Published::before_reduction(965.1, 0.124, 0.131), None),
        ("kairos", "poisson:0.15", Published::before_reduction(965.1, 0.124, 0.131), None),
        ("joint", "poisson:0.075", Published::one(1386.4), None),
        ("parrot", "poisson:0.075", Published::before_reduction(1386.4, 0.016, 0.066), None),
        ("kairos", "poisson:0.075", Published::before_reduction(1386.4, 0.016, 0.066), None),
    ]
}

/// Figure 6 (§4.3), burst: (workflow, policy, GPU-s per completed session, idle resident).
pub fn figure6() -> Vec<(&'static str, &'static str, Published, Published)> {
    let mut v = Vec::new();
    for (wf, total, lo, hi, idle, idle_lo, idle_hi) in [
        ("gsm8k", 46.26, 0.469, 0.474, 18.27, 60.32, 60.68),
        ("mbpp", 15.33, 0.538, 0.567, 5.25, 24.43, 26.39),
        ("qmsum", 65.25, 0.145, 0.165, 4.31, 10.74, 10.92),
    ] {
        v.push((wf, "joint", Published::one(total), Published::one(idle)));
        for policy in ["parrot", "kairos"] {
            v.push((wf, policy, Published::before_reduction(total, lo, hi), Published { low: idle_lo, high: idle_hi }));
        }
    }
    v
}

/// What a Figure 7 row is compared on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Effect {
    /// Joint's makespan reduction against the variant, (variant − joint) / variant.
    JointReduction,
    /// The variant's makespan increase over joint, (variant − joint) / joint.
    MakespanIncrease,
    /// The variant's p95 increase over joint.
    P95Increase,
}

/// Figure 7 (§4.5): (variant, effect, published range in % over the three arrivals).
/// `no-prefetch` is only said to increase makespan "in every setting": a lower bound of 0.
pub fn figure7() -> Vec<(&'static str, Effect, (f64, f64))> {
    vec![
        ("predictor:gbdt", Effect::JointReduction, (1.0, 3.0)),
        ("predictor:formula", Effect::JointReduction, (6.6, 36.3)),
        ("per-workflow-lifecycle", Effect::MakespanIncrease, (7.1, 16.4)),
        ("no-fusion", Effect::MakespanIncrease, (3.0, 8.1)),
        ("no-fusion", Effect::P95Increase, (8.5, 44.9)),
        ("no-prefetch", Effect::MakespanIncrease, (0.0, f64::INFINITY)),
    ]
}

fn ratio(ours: f64, paper: &Published) -> String {
    let m = paper.mid();
    if m > 0.0 && ours.is_finite() { format!("{:.2}", ours / m) } else { "–".into() }
}

fn effect_of(effect: Effect, joint: &BenchRun, variant: &BenchRun) -> Option<f64> {
    match effect {
        Effect::JointReduction => change_pct(variant.makespan_s, joint.makespan_s).map(|c| c / (1.0 + c / 100.0)),
        Effect::MakespanIncrease => change_pct(variant.makespan_s, joint.makespan_s),
        Effect::P95Increase => change_pct(variant.latency_s.p95_or_nan(), joint.latency_s.p95_or_nan()),
    }
}

fn effect_name(e: Effect) -> &'static str {
    match e {
        Effect::JointReduction => "joint's makespan reduction against it",
        Effect::MakespanIncrease => "its makespan over joint's",
        Effect::P95Increase => "its p95 over joint's",
    }
}

/// The section "Beside paper 003": every published number of Figures 5–7 next to ours.
pub fn beside_paper(out: &mut String, report: &BenchReport) {
    let _ = writeln!(out, "## Beside paper 003\n");
    let _ = writeln!(
        out,
        "Paper 003's numbers (§4.2–4.5; baselines derived from its reductions, a range where it does not say which baseline is which) next to this run's; ratio = ours / the paper's (midpoint of a range). The emulated workload's trace lengths are fitted on the baselines' rows of Figures 5 and 6 (emulator/CALIBRATION.md, \"Workload\"), so those rows are calibration, not evidence; joint's rows and Figure 7 are not fitted.\n"
    );
    let _ = writeln!(out, "### Figure 5 (overall)\n");
    let _ = writeln!(out, "| policy | arrival | makespan s: paper | ours | ratio | p95 s: paper | ours | ratio |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for (policy, arrival, makespan, p95) in figure5() {
        let Some(r) = report.row(policy, arrival) else { continue };
        let (p95_paper, p95_ratio) = match p95 {
            Some(p) => (p.text(1), ratio(r.latency_s.p95_or_nan(), &p)),
            None => ("–".into(), "–".into()),
        };
        let _ = writeln!(
            out,
            "| {policy} | {arrival} | {} | {:.1} | {} | {p95_paper} | {} | {p95_ratio} |",
            makespan.text(1),
            r.makespan_s,
            ratio(r.makespan_s, &makespan),
            if r.latency_s.is_known() { format!("{:.1}", r.latency_s.p95) } else { "–".into() }
        );
    }
    let _ = writeln!(out, "\n### Figure 6 (burst, GPU-s per completed session)\n");
    let _ = writeln!(out, "| workflow | policy | total: paper | ours | ratio | idle resident: paper | ours | ratio |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for (wf, policy, total, idle) in figure6() {
        let Some(w) = report.row(policy, "burst").and_then(|r| r.workflows.get(wf)) else { continue };
        let g = &w.gpu_seconds_per_session;
        let _ = writeln!(
            out,
            "| {wf} | {policy} | {} | {:.2} | {} | {} | {:.2} | {} |",
            total.text(2),
            g.total(),
            ratio(g.total(), &total),
            idle.text(2),
            g.idle_resident,
            ratio(g.idle_resident, &idle)
        );
    }
    let _ = writeln!(out, "\n### Figure 7 (ablations and predictor substitutions, over the arrivals)\n");
    let _ = writeln!(out, "| variant | compared on | paper % | ours % (per arrival) | inside the paper's range |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for (variant, effect, (lo, hi)) in figure7() {
        let mut ours = Vec::new();
        for a in &report.setup.arrivals {
            if let (Some(j), Some(v)) = (report.row("joint", a), report.row(variant, a))
                && let Some(e) = effect_of(effect, j, v)
            {
                ours.push((a.as_str(), e));
            }
        }
        if ours.is_empty() {
            continue;
        }
        let paper = if hi.is_finite() { format!("{lo:.1} to {hi:.1}") } else { "> 0 (every setting)".into() };
        // An open range ("increases makespan in every setting") needs a change that does not
        // round to zero.
        let inside = ours.iter().filter(|(_, e)| if hi.is_finite() { *e >= lo && *e <= hi } else { *e >= 0.05 }).count();
        let list = ours.iter().map(|(a, e)| format!("{a} {e:+.1}")).collect::<Vec<_>>().join(", ");
        let _ = writeln!(out, "| {variant} | {} | {paper} | {list} | {inside} of {} |", effect_name(effect), ours.len());
    }
    let _ = writeln!(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_values_print_as_the_paper_does() {
        assert_eq!(Published::one(46.26).text(2), "46.26");
        assert_eq!(Published { low: 60.32, high: 60.68 }.text(2), "60.32–60.68");
        assert_eq!(Published::one(634.2).text(1), "634.2");
    }

    #[test]
    fn derived_baselines_undo_the_published_reductions() {
        let f5 = figure5();
        let parrot = f5.iter().find(|r| r.0 == "parrot" && r.1 == "burst").map(|r| r.2);
        assert!(parrot.is_some_and(|p| (p.low - 987.9).abs() < 0.1), "{parrot:?}");
        let kairos = f5.iter().find(|r| r.0 == "kairos" && r.1 == "burst").map(|r| r.2);
        assert!(kairos.is_some_and(|p| (p.low - 1003.5).abs() < 0.1), "{kairos:?}");
        let f6 = figure6();
        let mbpp = f6.iter().find(|r| r.0 == "mbpp" && r.1 == "parrot").map(|r| r.2);
        assert!(mbpp.is_some_and(|p| (p.low - 33.18).abs() < 0.01 && (p.high - 35.40).abs() < 0.01), "{mbpp:?}");
        // Joint is 35.8 % below Parrot: undoing it gives back 634.2 s.
        assert!(parrot.is_some_and(|p| (p.low * (1.0 - 0.358) - 634.2).abs() < 1e-9));
    }
}
