//! The evaluation on the shipped measurements, and on user-supplied test directories.
//! Asserts the goals: the graph estimator beats the baselines on every held-out split
//! and reaches the paper's anchors on leave-one-model-out.

use std::fs;
use std::path::Path;
use std::sync::OnceLock;

use switchyard_predictor::eval::{self, EvalReport, LODO, LOMO};

fn report() -> &'static EvalReport {
    static REPORT: OnceLock<EvalReport> = OnceLock::new();
    REPORT.get_or_init(|| {
        eval::run(&eval::default_train_dir(), None).expect("shipped data evaluates")
    })
}

#[test]
fn graph_reaches_the_paper_anchors_on_leave_one_model_out() {
    let g = report().row("graph", LOMO).unwrap();
    // Paper 003, Table 1: 7.25 % run-time WAPE, 97.94 % ordering, 97.82 % window fit.
    assert!(g.wape_runtime < 0.0725, "{g:?}");
    assert!(g.ordering > 0.98, "{g:?}");
    assert!(g.window_fit > 0.98, "{g:?}");
}

#[test]
fn graph_beats_both_baselines_on_every_pooled_split() {
    for split in [LOMO, LODO] {
        let g = report().row("graph", split).unwrap();
        for baseline in ["formula", "gbdt"] {
            let b = report().row(baseline, split).unwrap();
            assert!(g.wape_runtime < b.wape_runtime, "{split}: {g:?} vs {b:?}");
            assert!(g.ordering > b.ordering, "{split}: {g:?} vs {b:?}");
            assert!(g.window_fit > b.window_fit, "{split}: {g:?} vs {b:?}");
        }
    }
}

#[test]
fn graph_has_the_lowest_error_on_every_fold() {
    let folds: Vec<&str> = report()
        .rows()
        .iter()
        .filter(|r| r.split.starts_with("model:") || r.split.starts_with("device:"))
        .map(|r| r.split.as_str())
        .collect();
    // Eight measured models and two devices, three estimators each.
    assert_eq!(folds.len(), 30);
    for split in folds {
        let g = report().row("graph", split).unwrap();
        for baseline in ["formula", "gbdt"] {
            let b = report().row(baseline, split).unwrap();
            assert!(g.wape_runtime < b.wape_runtime, "{split}: {g:?} vs {b:?}");
        }
    }
}

#[test]
fn every_configuration_is_judged_once_per_split() {
    let lomo = report().row("graph", LOMO).unwrap();
    let lodo = report().row("graph", LODO).unwrap();
    assert_eq!(lomo.configurations, lodo.configurations);
    assert!(lomo.configurations > 14_000);
    assert!(lomo.pairs > 0 && lomo.window_s > 0.0);
}

#[test]
fn json_and_markdown_carry_every_row_and_say_what_is_unmeasured() {
    let r = report();
    let json = r.to_json();
    let rows = json.as_array().unwrap();
    assert_eq!(rows.len(), r.rows().len());
    for row in rows {
        for key in [
            "estimator",
            "split",
            "wape_runtime",
            "ordering",
            "window_fit",
        ] {
            assert!(row.get(key).is_some(), "{key} missing in {row}");
        }
        for key in ["ordering", "window_fit"] {
            let v = row[key].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&v), "{key} = {v}");
        }
        assert!(row["wape_load"].is_null() && row["wape_peak_memory"].is_null());
    }
    let md = r.to_markdown();
    assert!(md.contains("| leave-one-model-out | graph |"), "{md}");
    assert!(md.contains("no data"));
    assert!(md.contains("attention kernels"));
    assert!(md.contains("load time: no measured data"));
}

fn copy(from: &Path, to: &Path) {
    fs::create_dir_all(to.parent().unwrap()).unwrap();
    fs::copy(from, to).unwrap();
}

#[test]
fn a_test_directory_is_judged_and_unseen_devices_come_from_their_spec_sheet() {
    let src = eval::default_train_dir();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // A user's measurements of phi-2 on the H100 (from the shipped data) and on a GPU the
    // training data has never seen, described by its spec sheet alone.
    copy(
        &src.join("device_configs/h100.yml"),
        &root.join("device_configs/h100.yml"),
    );
    fs::write(
        root.join("device_configs/mygpu.yml"),
        "fp16_tflops: 400\ntotal_memory_gb: 48\nmemory_bandwidth_gbps: 2000\n",
    )
    .unwrap();
    copy(
        &src.join("model_configs/microsoft/phi-2.yml"),
        &root.join("model_configs/microsoft/phi-2.yml"),
    );
    let csv = src.join("profiling/compute/h100/microsoft/phi-2/mlp.csv");
    copy(
        &csv,
        &root.join("profiling/compute/h100/microsoft/phi-2/mlp.csv"),
    );
    copy(
        &csv,
        &root.join("profiling/compute/mygpu/microsoft/phi-2/mlp.csv"),
    );
    let r = eval::run(&src, Some(root)).unwrap();
    assert_eq!(r.rows().len(), 3);
    for row in r.rows() {
        assert_eq!(row.split, "test");
        assert_eq!(row.configurations, 2 * 259);
        assert!(row.notes.contains("mygpu"), "{}", row.notes);
        assert!(row.wape_runtime.is_finite());
    }
}

#[test]
fn a_bad_test_directory_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("profiling/compute/x100/org/m")).unwrap();
    fs::write(
        root.join("profiling/compute/x100/org/m/mlp.csv"),
        "num_tokens\n1\n",
    )
    .unwrap();
    let err = eval::run(&eval::default_train_dir(), Some(root))
        .unwrap_err()
        .to_string();
    assert!(err.contains("x100.yml"), "{err}");
}
