//! The bench report as markdown: paper 003's numbers beside ours (`paper.rs`), then the tables
//! of Figures 5–7 with the ratio to the lower bound and the reductions of `joint` against the
//! baselines. Pure text formatting of a [`BenchReport`]; no I/O.

use std::fmt::Write;

use super::paper::{BASELINES, OURS, pct};
use super::{BenchReport, BenchRun, VariantKind, change_pct};

/// Seconds with one decimal; `–` for no figure (NaN: no completed session).
fn secs(x: f64) -> String {
    if x.is_finite() { format!("{x:.1}") } else { "–".into() }
}

fn times(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.2}×")).unwrap_or_else(|| "–".into())
}

/// A completion scope of Figure 5: overall, or one model's path.
#[derive(Clone, Copy)]
enum Scope<'a> {
    Overall,
    Path(&'a str),
}

impl Scope<'_> {
    fn title(&self) -> String {
        match self {
            Scope::Overall => "overall".into(),
            Scope::Path(m) => format!("{m} path"),
        }
    }

    /// (makespan, p95, ratio to the bound) of a row in this scope.
    fn metrics(&self, r: &BenchRun) -> Option<(f64, f64, Option<f64>)> {
        match self {
            Scope::Overall => Some((r.makespan_s, r.latency_s.p95_or_nan(), Some(r.ratio_to_lower_bound))),
            Scope::Path(m) => r.paths.get(*m).map(|p| (p.makespan_s, p.latency_s.p95_or_nan(), p.ratio_to_lower_bound)),
        }
    }
}

fn scopes(report: &BenchReport) -> Vec<Scope<'_>> {
    let mut s = vec![Scope::Overall];
    let mut models: Vec<&str> = Vec::new();
    for r in &report.runs {
        for m in r.paths.keys() {
            if !models.contains(&m.as_str()) {
                models.push(m);
            }
        }
    }
    models.sort();
    s.extend(models.into_iter().map(Scope::Path));
    s
}

fn header(out: &mut String, first: &str, arrivals: &[String], per_arrival: &[&str]) {
    let mut cols = vec![first.to_string()];
    for a in arrivals {
        for c in per_arrival {
            cols.push(format!("{a} {c}"));
        }
    }
    let _ = writeln!(out, "| {} |", cols.join(" | "));
    let _ = writeln!(out, "|{}", cols.iter().map(|_| "---|").collect::<String>());
}

/// Render the report.
pub fn markdown(report: &BenchReport) -> String {
    let s = &report.setup;
    let mut out = String::new();
    let _ = writeln!(out, "# Switchyard bench\n");
    let _ = writeln!(
        out,
        "{} sessions per workflow ({}) on pool `{}` ({} GPUs), arrivals {}, trace seed {}, \
         mean of {} repetition(s) (engine-noise seeds 0..{}), predictor `{}`, {} simulations. \
         Times are virtual seconds of the emulated pool.\n",
        s.sessions_per_workflow,
        s.workflows.join(", "),
        s.pool,
        s.gpus,
        s.arrivals.join(", "),
        s.seed,
        s.repetitions,
        s.repetitions,
        s.predictor,
        s.simulations
    );
    super::paper::beside_paper(&mut out, report);
    super::goals::render(&mut out, &report.goals);
    figure5(&mut out, report);
    figure6(&mut out, report);
    figure7(&mut out, report);
    sleep_rows(&mut out, report);
    lower_bound(&mut out, report);
    timelines(&mut out, report);
    out
}

/// The timeline file of `policy` in burst (written by [`super::write_timelines`]).
pub fn timeline_file(policy: &str) -> String {
    format!("timeline_{policy}_burst.svg")
}

fn timelines(out: &mut String, report: &BenchReport) {
    if !report.setup.arrivals.iter().any(|a| a == "burst") {
        return;
    }
    let _ = writeln!(out, "## GPU timelines (burst, engine-noise seed 0)
");
    let _ = writeln!(
        out,
        "One row per GPU; bars coloured by the model responsible, shaded generating / idle \
         resident / loading or waking, a thin line while a replica sleeps, white where the GPU \
         is empty.\n"
    );
    for p in policies(report) {
        let f = timeline_file(&p);
        let _ = writeln!(out, "- `{p}`: [{f}]({f})");
    }
    let _ = writeln!(out);
}

fn policies(report: &BenchReport) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for r in report.runs.iter().filter(|r| r.kind == VariantKind::Policy) {
        if !v.contains(&r.variant) {
            v.push(r.variant.clone());
        }
    }
    v
}

fn figure5(out: &mut String, report: &BenchReport) {
    let arrivals = &report.setup.arrivals;
    let _ = writeln!(out, "## Figure 5 — makespan and p95 completion latency\n");
    let _ = writeln!(
        out,
        "Makespan: first arrival to last completion; p95: 95th percentile of session completion \
         latency; ×LB: makespan over the trace's lower bound. A model's *path* ends, per session, \
         with its last call on that model (the model-scoped completion of paper 003 §4.2).\n"
    );
    for scope in scopes(report) {
        let _ = writeln!(out, "### {}\n", scope.title());
        header(out, "policy", arrivals, &["makespan s", "p95 s", "×LB"]);
        for p in policies(report) {
            let mut cells = vec![p.clone()];
            for a in arrivals {
                match report.row(&p, a).and_then(|r| scope.metrics(r)) {
                    Some((m, p95, x)) => cells.extend([secs(m), secs(p95), times(x)]),
                    None => cells.extend(["–".into(), "–".into(), "–".into()]),
                }
            }
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        let _ = writeln!(out);
        // Reductions of ours.
        let baselines: Vec<&str> = BASELINES.iter().copied().filter(|b| policies(report).iter().any(|p| p == b)).collect();
        if policies(report).iter().any(|p| p == OURS) && !baselines.is_empty() {
            let cols: Vec<String> = baselines
                .iter()
                .flat_map(|b| [format!("makespan vs {b}"), format!("p95 vs {b}")])
                .collect();
            let _ = writeln!(out, "Change of `{OURS}` against the baselines ({}; negative = lower):\n", scope.title());
            let _ = writeln!(out, "| arrival | {} |", cols.join(" | "));
            let _ = writeln!(out, "|---|{}", cols.iter().map(|_| "---|").collect::<String>());
            for a in arrivals {
                let ours = report.row(OURS, a).and_then(|r| scope.metrics(r));
                let mut cells = vec![a.clone()];
                for b in &baselines {
                    let base = report.row(b, a).and_then(|r| scope.metrics(r));
                    match (ours, base) {
                        (Some(o), Some(b)) => cells.extend([pct(change_pct(o.0, b.0)), pct(change_pct(o.1, b.1))]),
                        _ => cells.extend(["–".into(), "–".into()]),
                    }
                }
                let _ = writeln!(out, "| {} |", cells.join(" | "));
            }
            let _ = writeln!(out);
        }
    }
}

/// The arrival Figure 6 is drawn for: burst if run, else the first one.
pub(super) fn figure6_arrival(report: &BenchReport) -> Option<&String> {
    report.setup.arrivals.iter().find(|a| *a == "burst").or(report.setup.arrivals.first())
}

fn figure6(out: &mut String, report: &BenchReport) {
    let Some(arrival) = figure6_arrival(report) else { return };
    let _ = writeln!(out, "## Figure 6 — GPU-seconds per completed session ({arrival})\n");
    let _ = writeln!(
        out,
        "Pool GPU time over the makespan, split into generation / idle resident / loading / other \
         and charged to workflows by their share of each model's token work (paper 003 §4.3), \
         divided by the workflow's completed sessions.\n"
    );
    let _ = writeln!(out, "| workflow | policy | total | generation | idle resident | loading | other | generation share |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    let pols = policies(report);
    for w in &report.setup.workflows {
        for p in &pols {
            let Some(g) = report.row(p, arrival).and_then(|r| r.workflows.get(w)).map(|x| x.gpu_seconds_per_session) else {
                continue;
            };
            let total = g.total();
            let share = if total > 0.0 { format!("{:.0} %", g.generation / total * 100.0) } else { "–".into() };
            let _ = writeln!(
                out,
                "| {w} | {p} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {share} |",
                total, g.generation, g.idle_resident, g.loading, g.other
            );
        }
    }
    let _ = writeln!(out);
    let baselines: Vec<&str> = BASELINES.iter().copied().filter(|b| pols.iter().any(|p| p == b)).collect();
    if pols.iter().any(|p| p == OURS) && !baselines.is_empty() {
        let _ = writeln!(out, "Change of `{OURS}`'s GPU-seconds per completed session (negative = lower):\n");
        let _ = writeln!(
            out,
            "| workflow | {} |",
            baselines.iter().flat_map(|b| [format!("total vs {b}"), format!("idle vs {b}")]).collect::<Vec<_>>().join(" | ")
        );
        let _ = writeln!(out, "|---|{}", baselines.iter().map(|_| "---|---|").collect::<String>());
        let gpu = |p: &str, w: &str| report.row(p, arrival).and_then(|r| r.workflows.get(w)).map(|x| x.gpu_seconds_per_session);
        let mut names = report.setup.workflows.clone();
        names.push("all sessions".into());
        for w in &names {
            let pick = |p: &str| {
                if w == "all sessions" {
                    report.row(p, arrival).map(|r| r.gpu_seconds_per_session)
                } else {
                    gpu(p, w)
                }
            };
            let mut cells = vec![w.clone()];
            for b in &baselines {
                match (pick(OURS), pick(b)) {
                    (Some(o), Some(x)) => cells.extend([
                        pct(change_pct(o.total(), x.total())),
                        pct(change_pct(o.idle_resident, x.idle_resident)),
                    ]),
                    _ => cells.extend(["–".into(), "–".into()]),
                }
            }
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        let _ = writeln!(out);
    }
}

fn figure7(out: &mut String, report: &BenchReport) {
    let arrivals = &report.setup.arrivals;
    let rows: Vec<(String, VariantKind)> = {
        let mut v: Vec<(String, VariantKind)> = Vec::new();
        let full = report.runs.iter().find(|r| r.variant == OURS).map(|r| (r.variant.clone(), r.kind));
        v.extend(full);
        for r in report.runs.iter().filter(|r| matches!(r.kind, VariantKind::Ablation | VariantKind::Predictor)) {
            if !v.iter().any(|(l, _)| *l == r.variant) {
                v.push((r.variant.clone(), r.kind));
            }
        }
        v
    };
    if rows.len() <= 1 {
        return;
    }
    let _ = writeln!(out, "## Figure 7 — ablations and predictor substitutions\n");
    let _ = writeln!(
        out,
        "`no-fusion`: no Constructor chain fusion; `no-prefetch`: no near-ready prefetch; \
         `per-workflow-lifecycle`: each workflow estimates reuse, orders its waiting requests and \
         evaluates loading benefit alone (loaded replicas stay shared); `resource-order`: not an \
         ablation but our departure from Eq. 12, off in the full policy (among lifecycle bindings \
         within 10 % of the best completion, the least capable device); `history-admission`: our \
         departure from §3.3, off in the full policy (KV admission against each node's recent P90 \
         output instead of its configured limit); `no-tao-admission`: ready units take resident \
         replicas first-fit in rank order instead of by TAO's dynamic program (paper 000: cache \
         credit, tool-return readiness, tokens); `no-drain`: no drain-to-reclaim (a busy redundant \
         copy of a flexible model is never stopped from taking units so that a more constrained \
         model finishing last can have its device once its leases end); `no-outlook`: only the \
         ready and near-ready window protects an idle replica from a scale-out (by default, while \
         sessions in flight can still reach a model in their graphs, a scale-out takes neither \
         its last replica nor any replica of it when it is more constrained than the model \
         scaling out); `fifo-rank`: ready units first come first served within a priority level \
         (by default the unit whose session has the longest remaining critical path goes first: \
         expected tokens still to generate, further loop rounds counted); `predictor:NAME`: the full \
         policy planning with that predictor. Δ: change against the full `{OURS}` (positive = worse).\n"
    );
    header(out, "variant", arrivals, &["makespan s", "p95 s", "×LB", "Δ makespan", "Δ p95"]);
    for (label, kind) in &rows {
        let mut cells = vec![match kind {
            VariantKind::Policy => format!("{label} (full)"),
            _ => label.clone(),
        }];
        for a in arrivals {
            let full = report.row(OURS, a);
            match report.row(label, a) {
                Some(r) => {
                    let full_row = *kind == VariantKind::Policy;
                    let d = |x: f64, base: Option<f64>| {
                        if full_row { "–".to_string() } else { pct(base.and_then(|b| change_pct(x, b))) }
                    };
                    cells.extend([
                        secs(r.makespan_s),
                        secs(r.latency_s.p95_or_nan()),
                        times(Some(r.ratio_to_lower_bound)),
                        d(r.makespan_s, full.map(|f| f.makespan_s)),
                        d(r.latency_s.p95_or_nan(), full.map(|f| f.latency_s.p95_or_nan())),
                    ]);
                }
                None => cells.extend(std::iter::repeat_n("–".to_string(), 5)),
            }
        }
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    let _ = writeln!(out);
    lifecycle_counts(out, report, &rows);
    paper_settings(out, report);
}

/// Loads, near-ready prefetches and unloads per run of the baselines and each Figure 7 row: what
/// the lifecycle mechanisms actually did.
fn lifecycle_counts(out: &mut String, report: &BenchReport, rows: &[(String, VariantKind)]) {
    let arrivals = &report.setup.arrivals;
    let _ = writeln!(
        out,
        "Lifecycle actions per run (mean over the repetitions): *loads* (cold loads, prefetches \
         included), *prefetches* (cold loads or wakes issued to stage a near-ready model; only \
         `{OURS}` prefetches), *unloads* (teardowns).\n"
    );
    let mut labels: Vec<&str> = BASELINES.to_vec();
    labels.extend(rows.iter().map(|(l, _)| l.as_str()));
    header(out, "variant", arrivals, &["loads", "prefetches", "unloads"]);
    for label in labels {
        let mut cells = vec![label.to_string()];
        for a in arrivals {
            match report.row(label, a) {
                Some(r) => cells.extend([
                    format!("{:.1}", r.loads),
                    format!("{:.1}", r.prefetch.issued),
                    format!("{:.1}", r.evictions),
                ]),
                None => cells.extend(std::iter::repeat_n("–".to_string(), 3)),
            }
        }
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    let _ = writeln!(out);
}

/// How a variant's change against the full policy reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Worse,
    Better,
    Tie,
    NotRun,
}

impl Verdict {
    /// A change (percent, positive = worse) as the report prints it, to one decimal: a printed
    /// difference under 1 % is a tie.
    fn of(change: Option<f64>) -> Self {
        match change.map(|c| (c * 10.0).round() / 10.0) {
            Some(c) if c >= 1.0 => Verdict::Worse,
            Some(c) if c <= -1.0 => Verdict::Better,
            Some(_) => Verdict::Tie,
            None => Verdict::NotRun,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Verdict::Worse => "worse",
            Verdict::Better => "better",
            Verdict::Tie => "a tie",
            Verdict::NotRun => "not run",
        }
    }
}

/// Each ablation in the setting where paper 003 says it matters (fusion: p95; cross-workflow
/// lifecycle: makespan; prefetch: makespan), read off the rows: worse than the full policy, or
/// not — with the lifecycle counts that say why where they can.
fn paper_settings(out: &mut String, report: &BenchReport) {
    let arrivals = &report.setup.arrivals;
    let claims: [(&str, &str, &str, fn(&BenchRun) -> f64); 3] = [
        ("no-fusion", "p95", "chain fusion, one admission for same-model successors (§2.2, §4.5)", |r| {
            r.latency_s.p95_or_nan()
        }),
        ("per-workflow-lifecycle", "makespan", "cross-workflow lifecycle planning (§4.5)", |r| r.makespan_s),
        ("no-prefetch", "makespan", "near-ready prefetch (§4.5)", |r| r.makespan_s),
    ];
    let mut lines: Vec<String> = Vec::new();
    for (variant, metric, what, get) in claims {
        let per: Vec<(String, Option<f64>)> = arrivals
            .iter()
            .map(|a| {
                let change = match (report.row(variant, a), report.row(OURS, a)) {
                    (Some(v), Some(f)) => change_pct(get(v), get(f)),
                    _ => None,
                };
                (a.clone(), change)
            })
            .collect();
        if per.iter().all(|(_, c)| c.is_none()) {
            continue;
        }
        let worse = per.iter().filter(|(_, c)| Verdict::of(*c) == Verdict::Worse).count();
        let detail: Vec<String> =
            per.iter().map(|(a, c)| format!("{a} {} ({})", pct(*c), Verdict::of(*c).word())).collect();
        let mut line = format!(
            "- `{variant}` — {what}; the paper's metric: {metric}. Worse than full `{OURS}` in {worse} of {} \
             arrival settings: {}.",
            per.len(),
            detail.join(", ")
        );
        if variant == "no-prefetch" {
            // What full joint's prefetch checks found: the reason it did or did not fire.
            let checks: Vec<String> = arrivals
                .iter()
                .filter_map(|a| {
                    let c = report.row(OURS, a)?.prefetch;
                    Some(format!(
                        "{a}: {:.1} issued, {:.1} model already resident, {:.1} no capacity, {:.1} not yet \
                         timely, {:.1} refused",
                        c.issued, c.resident, c.no_capacity, c.not_timely, c.refused
                    ))
                })
                .collect();
            line.push_str(&format!(
                " The rule (§3.5) stages a near-ready model that has no replica into capacity no ready or \
                 near-ready work holds, once its release is within its load time plus a dispatch slack; \
                 full `{OURS}`'s checks per run (one per near-ready model per planning tick, so a model \
                 resident for many ticks counts many times) found — {}.",
                checks.join("; ")
            ));
            let never_fired = arrivals.iter().all(|a| {
                report.row(OURS, a).is_some_and(|r| r.prefetch.issued == 0.0 && r.prefetch.refused == 0.0)
            });
            let all_ties = per.iter().all(|(_, c)| Verdict::of(*c) == Verdict::Tie);
            if never_fired && all_ties {
                line.push_str(" It never fired, so turning it off changes nothing.");
            }
        }
        if variant == "no-fusion" {
            // What became of full joint's chains: fused, or ruled out by Eq. 8's first cut.
            let counts: Vec<String> = arrivals
                .iter()
                .filter_map(|a| {
                    let c = report.row(OURS, a)?.fusion;
                    Some(format!("{a}: {:.1} fused, {:.1} over the context", c.fused, c.over_context))
                })
                .collect();
            line.push_str(&format!(
                " Full `{OURS}`'s units with a same-deployment successor (Eq. 3), per run, by what became \
                 of their chain — fused (one grant for the chain, Eq. 4) or over the context (Eq. 8's \
                 first cut: the chain's envelope I_adm + O_adm from that link on passes the \
                 deployment's L_max, so the link runs as a unit of its own): {}.",
                counts.join("; ")
            ));
            let never_fused = arrivals.iter().all(|a| report.row(OURS, a).is_some_and(|r| r.fusion.fused == 0.0));
            let all_ties = per.iter().all(|(_, c)| Verdict::of(*c) == Verdict::Tie);
            if never_fused && all_ties {
                line.push_str(" No chain fit its context, so turning fusion off changes nothing.");
            }
        }
        if variant == "per-workflow-lifecycle" {
            let counts: Vec<String> = arrivals
                .iter()
                .filter_map(|a| {
                    let (v, f) = (report.row(variant, a)?, report.row(OURS, a)?);
                    Some(format!(
                        "{a} {:.1} vs {:.1} loads, {:.1} vs {:.1} unloads",
                        v.loads, f.loads, v.evictions, f.evictions
                    ))
                })
                .collect();
            line.push_str(&format!(" Lifecycle actions (`{variant}` vs full): {}.", counts.join("; ")));
        }
        lines.push(line);
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "Where paper 003 says each ablation matters (a difference under 1 % is a tie; generated from \
         the rows above):\n"
    );
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    let _ = writeln!(out);
}

/// The three-state lifecycle (beyond paper 003): every policy again on the substrate that
/// reclaims by vLLM sleep — the baselines sleep their least recently used idle replica, joint
/// sleeps where predicted next use makes it cheaper than unloading — and joint's `--no-sleep`.
fn sleep_rows(out: &mut String, report: &BenchReport) {
    let rows: Vec<&str> = {
        let mut v: Vec<&str> = Vec::new();
        for r in report.runs.iter().filter(|r| r.kind == VariantKind::Sleep) {
            if !v.contains(&r.variant.as_str()) {
                v.push(&r.variant);
            }
        }
        v
    };
    if rows.is_empty() {
        return;
    }
    let arrivals = &report.setup.arrivals;
    let _ = writeln!(out, "## Sleep — the three-state lifecycle (beyond paper 003)\n");
    let _ = writeln!(
        out,
        "Every policy again on the substrate that reclaims by vLLM sleep mode (`--sleep`): \
         `sleep:parrot` and `sleep:kairos` put the least recently used idle replica to sleep \
         instead of unloading it; `sleep:joint` sleeps a replica it reclaims when its model has \
         ready or near-ready work and a sleep plus a wake costs less than a teardown plus a cold \
         load, and unloads it otherwise; `sleep:joint-no-sleep` is joint on that substrate never \
         sleeping. Δ vs {OURS}: against joint on the paper's substrate (no sleep); Δ vs \
         no-sleep: against `sleep:joint-no-sleep` (positive = worse).\n"
    );
    header(out, "variant", arrivals, &["makespan s", "p95 s", "Δ vs joint", "Δ vs no-sleep"]);
    for label in &rows {
        let mut cells = vec![label.to_string()];
        for a in arrivals {
            let Some(r) = report.row(label, a) else {
                cells.extend(std::iter::repeat_n("–".to_string(), 4));
                continue;
            };
            let vs = |other: &str| pct(report.row(other, a).and_then(|o| change_pct(r.makespan_s, o.makespan_s)));
            cells.extend([secs(r.makespan_s), secs(r.latency_s.p95_or_nan()), vs(OURS), vs(NO_SLEEP)]);
        }
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Lifecycle actions per run (mean over the repetitions): *loads* (cold loads), *sleeps* \
         (replicas put to sleep), *wakes* (sleepers woken), *unloads* (teardowns).\n"
    );
    header(out, "variant", arrivals, &["loads", "sleeps", "wakes", "unloads"]);
    for label in &rows {
        let mut cells = vec![label.to_string()];
        for a in arrivals {
            match report.row(label, a) {
                Some(r) => cells.extend([r.loads, r.sleeps, r.wakes, r.evictions].map(|x| format!("{x:.1}"))),
                None => cells.extend(std::iter::repeat_n("–".to_string(), 4)),
            }
        }
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    let _ = writeln!(out);
    sleep_why(out, report);
}

/// Joint's sleeping row and its `--no-sleep` ablation on the substrate that sleeps.
const SLEEP_JOINT: &str = "sleep:joint";
const NO_SLEEP: &str = "sleep:joint-no-sleep";

/// Why `sleep:joint` and `sleep:joint-no-sleep` differ or tie, read off the rows: the makespan
/// change per arrival and how often each slept and woke per run.
fn sleep_why(out: &mut String, report: &BenchReport) {
    let arrivals = &report.setup.arrivals;
    let per: Vec<(&String, &BenchRun, &BenchRun)> =
        arrivals.iter().filter_map(|a| Some((a, report.row(SLEEP_JOINT, a)?, report.row(NO_SLEEP, a)?))).collect();
    if per.is_empty() {
        return;
    }
    let changes: Vec<Option<f64>> = per.iter().map(|(_, j, n)| change_pct(j.makespan_s, n.makespan_s)).collect();
    let detail: Vec<String> = per
        .iter()
        .zip(&changes)
        .map(|((a, ..), c)| format!("{a} {} ({})", pct(*c), Verdict::of(*c).word()))
        .collect();
    let counts = |no_sleep: bool| -> String {
        per.iter()
            .map(|&(a, j, n)| {
                let r = if no_sleep { n } else { j };
                format!("{a}: {:.1} slept, {:.1} woke, {:.1} loads", r.sleeps, r.wakes, r.loads)
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let better = changes.iter().filter(|c| Verdict::of(**c) == Verdict::Better).count();
    let mut line = format!(
        "- `{SLEEP_JOINT}` against `{NO_SLEEP}` (makespan, negative = sleeping helped): better in {better} of {} \
         arrival settings: {}. Per run, `{SLEEP_JOINT}` — {}; with `--no-sleep` — {}.",
        per.len(),
        detail.join(", "),
        counts(false),
        counts(true)
    );
    let all_ties = changes.iter().all(|c| Verdict::of(*c) == Verdict::Tie);
    let never_slept = per.iter().all(|(_, j, _)| j.sleeps == 0.0);
    if all_ties && never_slept {
        line.push_str(" Joint never chose to sleep a replica, so `--no-sleep` changes nothing.");
    } else if all_ties {
        let most = per.iter().map(|(_, j, _)| j.wakes).fold(0.0, f64::max);
        line.push_str(&format!(
            " Every difference is a tie: a sleep pays off only when its replica is woken instead of loaded \
             cold, and `{SLEEP_JOINT}` woke at most {most:.1} times per run in any arrival setting."
        ));
    }
    let _ = writeln!(out, "What joint's sleep decision did (generated from the rows above):\n");
    let _ = writeln!(out, "{line}");
    let _ = writeln!(out);
}

fn lower_bound(out: &mut String, report: &BenchReport) {
    let _ = writeln!(out, "## Lower bound\n");
    let _ = writeln!(
        out,
        "Per trace: max(critical path, work, per-model). *Critical path*: every session alone on the \
         fastest device that holds each model, batch-1 emulator iteration costs on its real \
         token counts with a fully cached prefill, modeled tool durations, and no call on a model \
         before that model's shortest load (the pool starts empty). *Work*: one load per model \
         plus every generated token at the cheapest per-token cost of any device at any batch \
         size, over the GPUs. *Per-model*: for each model, the earliest contention-free start of \
         any of its calls (release and first load), plus its generated tokens at that cheapest \
         cost over the devices that can hold it, plus the shortest contention-free tail one of \
         its calls leaves in its session; the table shows the largest (prefill work is not \
         counted). LLM times are scaled by 0.97 for engine noise. See \
         `runtime/src/lower_bound.rs`.\n"
    );
    let models: Vec<String> = {
        let mut m: Vec<String> = report.lower_bounds.values().flat_map(|b| b.paths.keys().cloned()).collect();
        m.sort();
        m.dedup();
        m
    };
    let mut cols = vec!["arrival", "bound s", "critical path s", "work s", "per-model s", "first load s"]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    cols.extend(models.iter().map(|m| format!("{m} path s")));
    let _ = writeln!(out, "| {} |", cols.join(" | "));
    let _ = writeln!(out, "|{}", cols.iter().map(|_| "---|").collect::<String>());
    for a in &report.setup.arrivals {
        let Some(b) = report.lower_bounds.get(a) else { continue };
        let mut cells = vec![
            a.clone(),
            secs(b.makespan_s),
            secs(b.critical_path_s),
            secs(b.work_s),
            secs(b.model_s),
            secs(b.first_load_s),
        ];
        cells.extend(models.iter().map(|m| b.paths.get(m).map(|x| secs(*x)).unwrap_or_else(|| "–".into())));
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    let _ = writeln!(out);
}
