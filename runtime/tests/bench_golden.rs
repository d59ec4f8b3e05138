//! Golden bench report: one small configuration (2 sessions per workflow of the three paper
//! workflows on `workflows/pools/small.yaml`, burst, one repetition, every policy, ablation,
//! predictor and sleep row) compared byte for byte with `tests/golden/bench_small.json`, so any
//! change of a number the bench reports fails here.
//!
//! The `python_tests` tool models its durations per sandbox backend (host python3 process or
//! CPython on WASI), so MBPP's timing depends on which one runs; the test pins the process
//! backend, which needs only `python3` on the PATH.
//!
//! After an intended change, regenerate the golden file and review its diff:
//!
//! ```sh
//! SWITCHYARD_BLESS=1 cargo test -p switchyard-runtime --test bench_golden
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use switchyard_runtime::bench::{BenchConfig, BenchReport, VariantKind, markdown, run_bench, write_outputs};
use switchyard_runtime::exec::PoolSpec;
use switchyard_runtime::workflow::load_workflow;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn config() -> BenchConfig {
    let workflows = ["gsm8k", "mbpp", "qmsum"]
        .iter()
        .map(|w| Arc::new(load_workflow(&repo().join(format!("workflows/{w}.yaml"))).expect("workflow")))
        .collect();
    let pool = PoolSpec::load(&repo().join("workflows/pools/small.yaml")).expect("pool");
    let mut cfg = BenchConfig::paper(workflows, pool).quick();
    cfg.sessions = 2;
    // The substrate that sleeps too: its rows, and joint's `--no-sleep`, are checked below.
    cfg.sleep = true;
    cfg
}

fn report() -> &'static BenchReport {
    static REPORT: OnceLock<BenchReport> = OnceLock::new();
    REPORT.get_or_init(|| {
        // SAFETY: every test of this binary reaches the environment only through this
        // initialiser (the others block on the OnceLock), and the bench threads start after it.
        unsafe { std::env::set_var(switchyard_tools::python_tests::BACKEND_ENV, "process") };
        run_bench(&config(), &|_, _| {}).expect("bench")
    })
}

#[test]
fn the_small_bench_matches_its_golden_report() {
    let json = serde_json::to_string_pretty(report()).expect("json") + "\n";
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/bench_small.json");
    if std::env::var_os("SWITCHYARD_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&golden, &json).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&golden).expect(
        "tests/golden/bench_small.json is missing: SWITCHYARD_BLESS=1 cargo test -p switchyard-runtime --test bench_golden",
    );
    assert!(
        json == expected,
        "the bench report changed; if intended, regenerate with \
         SWITCHYARD_BLESS=1 cargo test -p switchyard-runtime --test bench_golden\n--- got ---\n{json}"
    );
}

#[test]
fn every_row_completes_and_stays_above_the_lower_bound() {
    let r = report();
    let names: Vec<&str> = r.runs.iter().map(|x| x.variant.as_str()).collect();
    assert_eq!(
        names,
        ["parrot", "kairos", "joint", "no-fusion", "no-prefetch", "per-workflow-lifecycle", "resource-order", "history-admission", "no-tao-admission", "no-drain", "no-outlook", "fifo-rank", "predictor:oracle", "sleep:parrot", "sleep:kairos", "sleep:joint", "sleep:joint-no-sleep"]
    );
    let bound = r.lower_bounds.get("burst").expect("burst bound");
    assert!(bound.makespan_s > 0.0 && bound.critical_path_s >= bound.first_load_s);
    assert_eq!(r.lower_bound_s["burst"], bound.makespan_s);
    for run in &r.runs {
        assert_eq!(run.sessions_completed, 6.0, "{}", run.variant);
        assert_eq!(run.sessions_failed, 0.0, "{}", run.variant);
        assert!(run.makespan_s >= bound.makespan_s, "{}: {} < {}", run.variant, run.makespan_s, bound.makespan_s);
        assert!(run.ratio_to_lower_bound >= 1.0, "{}", run.variant);
        for (model, p) in &run.paths {
            let b = bound.paths[model];
            assert!(p.makespan_s >= b, "{} {model}: {} < {b}", run.variant, p.makespan_s);
            assert!(p.makespan_s <= run.makespan_s + 1e-9);
        }
        assert_eq!(run.paths.len(), 2, "{}", run.variant);
    }
    // The oracle substitution is the joint run itself.
    let joint = r.row("joint", "burst").expect("joint");
    let oracle = r.row("predictor:oracle", "burst").expect("oracle row");
    assert_eq!(joint.makespan_s, oracle.makespan_s);
}

#[test]
fn the_report_renders_as_markdown_json_and_svg() {
    let r = report();
    let md = markdown(r);
    for needle in ["## Figure 5", "### Qwen3-4B path", "## Figure 6", "## Figure 7", "## Lower bound", "| joint |"] {
        assert!(md.contains(needle), "missing `{needle}` in\n{md}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let files = write_outputs(r, dir.path()).expect("write");
    assert_eq!(files.len(), 5);
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        if f.extension().is_some_and(|e| e == "svg") {
            assert!(text.contains("<svg") && text.contains("<rect"), "{}", f.display());
        }
    }
    let back: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("bench.json")).expect("json")).expect("parse");
    let run = &back["runs"][0];
    for key in ["policy", "arrival", "makespan_s", "latency_s", "gpu_seconds_per_session", "workflows"] {
        assert!(!run[key].is_null(), "run lacks `{key}`");
    }
    assert!(back["lower_bound_s"]["burst"].is_number());
}

#[test]
fn the_regime_targets_are_checked_only_on_the_papers_setup() {
    // The small bench (2 sessions per workflow on the small pool) says nothing about the paper's
    // absolute numbers: only joint's relative margins are goals there.
    let r = report();
    assert!(!r.goals.is_empty());
    assert!(r.goals.iter().all(|g| g.issue == "joint"), "{:?}", r.goals.iter().map(|g| &g.goal).collect::<Vec<_>>());
}

#[test]
fn the_report_says_where_each_ablation_is_not_worse_and_what_prefetch_found() {
    let r = report();
    let md = markdown(r);
    let full = r.row("joint", "burst").expect("joint");
    let checks: [(&str, fn(&switchyard_runtime::bench::BenchRun) -> f64); 3] = [
        ("no-fusion", |x| x.latency_s.p95),
        ("per-workflow-lifecycle", |x| x.makespan_s),
        ("no-prefetch", |x| x.makespan_s),
    ];
    for (variant, metric) in checks {
        let row = r.row(variant, "burst").expect("ablation row");
        let (change, verdict) = printed_change(metric(row), metric(full));
        let worse = usize::from(change >= 1.0);
        let line = md.lines().find(|l| l.starts_with(&format!("- `{variant}`"))).expect("a line per ablation");
        assert!(line.contains(&format!("Worse than full `joint` in {worse} of 1 arrival settings")), "{line}");
        assert!(line.contains(&format!("({verdict})")), "{line}");
    }
    // The prefetch line reports full joint's checks as counted in its runs.
    let line = md.lines().find(|l| l.starts_with("- `no-prefetch`")).expect("prefetch line");
    let c = full.prefetch;
    let expected = format!("burst: {:.1} issued, {:.1} model already resident", c.issued, c.resident);
    assert!(line.contains(&expected), "{line}");
    // Joint's checks ran (its near-ready successors were looked at), and none was refused.
    assert!(c.issued + c.resident + c.no_capacity + c.not_timely > 0.0, "{c:?}");
    assert_eq!(c.refused, 0.0);
    let no_prefetch = r.row("no-prefetch", "burst").expect("no-prefetch");
    let never_fired = c.issued == 0.0 && no_prefetch.makespan_s == full.makespan_s;
    assert_eq!(line.contains("It never fired"), never_fired, "{line}");
    // With prefetch off nothing is checked; the baselines never prefetch.
    for b in ["no-prefetch", "parrot", "kairos"] {
        assert_eq!(r.row(b, "burst").expect("row").prefetch, Default::default(), "{b}");
    }
    // The fusion line says what became of full joint's chains, as counted in its runs: QMSum's
    // three chains (two 4B lanes, the 8B merge → refine → answer) have links with a fusible
    // successor in every session.
    let line = md.lines().find(|l| l.starts_with("- `no-fusion`")).expect("fusion line");
    let f = full.fusion;
    assert!(line.contains(&format!("burst: {:.1} fused, {:.1} over the context", f.fused, f.over_context)), "{line}");
    assert!(f.fused + f.over_context > 0.0, "{f:?}");
    let no_fusion = r.row("no-fusion", "burst").expect("no-fusion");
    let never_fused = f.fused == 0.0 && no_fusion.latency_s.p95 == full.latency_s.p95;
    assert_eq!(line.contains("No chain fit its context"), never_fused, "{line}");
    for b in ["no-fusion", "parrot", "kairos"] {
        assert_eq!(r.row(b, "burst").expect("row").fusion, Default::default(), "{b}: it does not fuse");
    }
}

#[test]
fn the_report_says_how_often_joint_slept_and_woke() {
    let r = report();
    let md = markdown(r);
    // Off the substrate that sleeps nothing sleeps; joint's `--no-sleep` never sleeps on it.
    for run in r.runs.iter().filter(|x| x.kind != VariantKind::Sleep) {
        assert_eq!((run.sleeps, run.wakes), (0.0, 0.0), "{}", run.variant);
    }
    let joint = r.row("sleep:joint", "burst").expect("sleep:joint");
    let no_sleep = r.row("sleep:joint-no-sleep", "burst").expect("sleep:joint-no-sleep");
    assert_eq!((no_sleep.sleeps, no_sleep.wakes), (0.0, 0.0));
    // The baselines sleep their least recently used idle replica instead of unloading it.
    for b in ["sleep:parrot", "sleep:kairos"] {
        let x = r.row(b, "burst").expect("sleep baseline");
        assert!(x.sleeps > 0.0 && x.evictions == 0.0, "{b}: {} sleeps, {} unloads", x.sleeps, x.evictions);
    }
    // The counts table and the line report the rows' own counts.
    for x in r.runs.iter().filter(|x| x.kind == VariantKind::Sleep) {
        let label = &x.variant;
        let row = format!("| {label} | {:.1} | {:.1} | {:.1} | {:.1} |", x.loads, x.sleeps, x.wakes, x.evictions);
        assert!(md.lines().any(|l| l == row), "missing `{row}` in\n{md}");
    }
    let line = md.lines().find(|l| l.starts_with("- `sleep:joint` against")).expect("the sleep line");
    for (name, x) in [("`sleep:joint` — ", joint), ("`--no-sleep` — ", no_sleep)] {
        let expected = format!("{name}burst: {:.1} slept, {:.1} woke, {:.1} loads", x.sleeps, x.wakes, x.loads);
        assert!(line.contains(&expected), "missing `{expected}` in {line}");
    }
    // Negative = sleeping helped.
    let (change, verdict) = printed_change(joint.makespan_s, no_sleep.makespan_s);
    assert!(line.contains(&format!("({verdict})")), "{line}");
    assert!(line.contains(&format!("better in {} of 1 arrival settings", usize::from(change <= -1.0))), "{line}");
    let never_slept = joint.sleeps == 0.0 && verdict == "a tie";
    assert_eq!(line.contains("Joint never chose to sleep a replica"), never_slept, "{line}");
    assert_eq!(line.contains("Every difference is a tie: a sleep pays off only when"), verdict == "a tie" && !never_slept, "{line}");
    // Had joint slept without changing the makespan, the line would say how seldom it woke.
    if verdict == "a tie" {
        let mut slept = r.clone();
        let j = slept.runs.iter_mut().find(|x| x.variant == "sleep:joint").expect("sleep:joint");
        (j.sleeps, j.wakes) = (3.6, 0.6);
        let md = markdown(&slept);
        let line = md.lines().find(|l| l.starts_with("- `sleep:joint` against")).expect("the sleep line");
        assert!(line.contains("`sleep:joint` — burst: 3.6 slept, 0.6 woke"), "{line}");
        assert!(line.contains("woke at most 0.6 times per run") && !line.contains("never chose"), "{line}");
    }
}

/// The report's change of `value` against `base` as printed (percent, one decimal) and its
/// verdict: a printed difference under 1 % is a tie.
fn printed_change(value: f64, base: f64) -> (f64, &'static str) {
    let change = (1000.0 * (value - base) / base).round() / 10.0;
    let verdict = if change >= 1.0 {
        "worse"
    } else if change <= -1.0 {
        "better"
    } else {
        "a tie"
    };
    (change, verdict)
}
