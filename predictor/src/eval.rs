//! `switchyard predictor eval`: the estimators judged on held-out measurements, like Table 1
//! of paper 003 (§4.4).
//!
//! Without a test directory, the measured data of the training directory is split twice:
//! leave-one-model-out (each measured model held out in turn, every estimator trained on the
//! rest) and leave-one-device-out (likewise per device); each fold is scored and the folds are
//! pooled per split. With a test directory, every estimator is trained on the whole training
//! directory and judged on every measurement of the test directory; a model or device the
//! training data lacks is predicted from its config and spec sheet alone.
//!
//! What is judged is the run time of the profiled operators of one forward pass (see
//! [`crate::measured`]). Load time and peak memory have no measurement in Vidur's profiles
//! and attention kernels only one shape, so the report says so instead of printing a figure.
//! The CLI (root crate) only formats what [`run`] returns. It must not depend on the
//! scheduling path (`profile`, `feedback`), the emulator or the runtime: nothing but the
//! CLI and the runtime's `bench predictor` call it, and the estimators must not call it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::data::ProfileData;
use crate::error::PredictorError;
use crate::estimators::attention::{AttentionModel, sample_cost};
use crate::estimators::formula::Formula;
use crate::estimators::gbdt::Gbdt;
use crate::estimators::graph_device::GraphDevice;
use crate::estimators::{ESTIMATORS, Predict};
use crate::graph::Coverage;
use crate::measured::MeasuredSet;
use crate::metrics::Tally;

/// The measurements shipped with the crate, in the source tree (moved to [`crate::data`]; kept
/// here for callers of the old path).
pub use crate::data::default_train_dir;

/// Split name of the pooled leave-one-model-out folds.
pub const LOMO: &str = "leave-one-model-out";
/// Split name of the pooled leave-one-device-out folds.
pub const LODO: &str = "leave-one-device-out";

/// What a row says about the targets with no measurement.
pub const NO_LOAD_DATA: &str =
    "load time: no measured data (Vidur profiles kernels only); judged against the emulator on whole activations by `switchyard bench predictor`";
pub const NO_PEAK_DATA: &str =
    "peak VRAM: no measured data (Vidur profiles kernels only); judged against the emulator on whole activations by `switchyard bench predictor`";

/// One estimator on one split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRow {
    pub estimator: String,
    /// `leave-one-model-out`, `leave-one-device-out`, a fold (`model:<name>`,
    /// `device:<name>`), or `test`.
    pub split: String,
    /// WAPE of run time, fraction.
    pub wape_runtime: f64,
    /// Ordering accuracy, fraction.
    pub ordering: f64,
    /// Window-fit accuracy, fraction.
    pub window_fit: f64,
    /// Held-out configurations judged.
    pub configurations: u64,
    /// Pairs compared for ordering.
    pub pairs: u64,
    /// The window (median measured run time) in seconds; for a pooled split, of the largest fold.
    pub window_s: f64,
    /// WAPE of load time, where measured.
    pub wape_load: Option<f64>,
    /// WAPE of peak memory, where measured.
    pub wape_peak_memory: Option<f64>,
    pub notes: String,
}

/// The evaluation's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    pub train_dir: PathBuf,
    pub test_dir: Option<PathBuf>,
    rows: Vec<EvalRow>,
    /// Report-wide notes (what is and is not measured).
    pub notes: Vec<String>,
}

impl EvalReport {
    pub fn rows(&self) -> &[EvalRow] {
        &self.rows
    }

    /// Append a row judged elsewhere (e.g. load time against the emulator, marked as such in
    /// its `split` and `notes`).
    pub fn push_row(&mut self, row: EvalRow) {
        self.rows.push(row);
    }

    /// The row of `estimator` on `split`.
    pub fn row(&self, estimator: &str, split: &str) -> Option<&EvalRow> {
        self.rows
            .iter()
            .find(|r| r.estimator == estimator && r.split == split)
    }

    /// `[{"estimator", "split", "wape_runtime", "ordering", "window_fit", ...}, ...]`.
    pub fn to_json(&self) -> serde_json::Value {
        json!(self.rows)
    }

    /// A Markdown table of every row, then the notes.
    pub fn to_markdown(&self) -> String {
        let pct = |x: f64| format!("{:.2} %", 100.0 * x);
        let opt = |x: Option<f64>| x.map(pct).unwrap_or_else(|| "no data".into());
        let mut s = String::from(
            "| split | estimator | configs | run-time WAPE | ordering | window fit | load WAPE | peak VRAM WAPE |\n\
             | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for r in &self.rows {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                r.split,
                r.estimator,
                r.configurations,
                pct(r.wape_runtime),
                pct(r.ordering),
                pct(r.window_fit),
                opt(r.wape_load),
                opt(r.wape_peak_memory),
            ));
        }
        if !self.notes.is_empty() {
            s.push('\n');
            for n in &self.notes {
                s.push_str(&format!("- {n}\n"));
            }
        }
        s
    }
}

/// What a fold holds out.
enum HeldOut {
    Model(String),
    Device(String),
}

/// A fold: which measurements are held out, and its name.
struct Fold {
    split: &'static str,
    name: String,
    held: HeldOut,
}

impl Fold {
    fn held_out(&self, model: &str, device: &str) -> bool {
        match &self.held {
            HeldOut::Model(m) => m == model,
            HeldOut::Device(d) => d == device,
        }
    }
}

/// Score every estimator on one fold: train on what is not held out, judge what is.
fn run_fold(
    judged: &MeasuredSet<'_>,
    fold: &Fold,
) -> Result<Vec<(String, Tally, f64)>, PredictorError> {
    let train_set = judged.subset(|m, d| !fold.held_out(m, d));
    let held: Vec<usize> = (0..judged.configs.len())
        .filter(|&i| {
            let r = judged.raw(&judged.configs[i]);
            fold.held_out(&r.model, &r.device)
        })
        .collect();
    if held.is_empty() {
        return Ok(Vec::new());
    }
    let measured: Vec<f64> = held.iter().map(|&i| judged.configs[i].seconds).collect();
    let window = crate::metrics::median(&measured);
    let mut out = Vec::new();
    for est in train_all(&train_set)? {
        let predicted = predict_all(est.as_ref(), judged, &held)?;
        out.push((
            est.name().to_string(),
            Tally::score(&predicted, &measured),
            window,
        ));
    }
    Ok(out)
}

/// The three estimators trained on `set`, in [`ESTIMATORS`] order (the formula is calibrated
/// once and reused as the GBDT's fallback).
fn train_all(set: &MeasuredSet<'_>) -> Result<Vec<Box<dyn Predict>>, PredictorError> {
    let formula = Formula::calibrate_on(set)?;
    Ok(vec![
        Box::new(formula),
        Box::new(Gbdt::train_on(set, formula)?),
        Box::new(GraphDevice::train_on(set)?),
    ])
}

fn predict_all(
    est: &dyn Predict,
    set: &MeasuredSet<'_>,
    which: &[usize],
) -> Result<Vec<f64>, PredictorError> {
    which
        .iter()
        .map(|&i| {
            let c = &set.configs[i];
            let device = set.device(c).ok_or_else(|| PredictorError::BadLayout {
                path: set.data.root.join("device_configs"),
                message: format!("no config for device `{}`", set.raw(c).device),
            })?;
            Ok(est.pass_time(&set.graphs[c.graph], &c.pass, device, Coverage::Profiled))
        })
        .collect()
}

fn row(estimator: &str, split: &str, t: &Tally, window_s: f64, notes: &str) -> EvalRow {
    EvalRow {
        estimator: estimator.to_string(),
        split: split.to_string(),
        wape_runtime: t.wape(),
        ordering: t.ordering(),
        window_fit: t.window_fit(),
        configurations: t.configurations,
        pairs: t.pairs,
        window_s,
        wape_load: None,
        wape_peak_memory: None,
        notes: notes.to_string(),
    }
}

/// Run the evaluation. `train_dir` and `test_dir` are directories in Vidur's profiling layout
/// (see [`crate::data`]).
pub fn run(train_dir: &Path, test_dir: Option<&Path>) -> Result<EvalReport, PredictorError> {
    run_on(ProfileData::load(train_dir)?, test_dir)
}

/// [`run`] with the training data already loaded (e.g. [`ProfileData::shipped`]).
pub fn run_on(data: ProfileData, test_dir: Option<&Path>) -> Result<EvalReport, PredictorError> {
    let train_dir = data.root.clone();
    let mut rows = Vec::new();
    let mut notes = vec![
        "run time = the profiled operators of one forward pass (embedding; per layer the norms, \
         QKV and output projections, rotary, MLP up/act/down, residual adds), assembled on the \
         operator graph; attention kernels and the LM head are not measured per model and are \
         not judged"
            .to_string(),
        format!("{NO_LOAD_DATA}; {NO_PEAK_DATA}"),
    ];
    notes.push(attention_note(&data));
    match test_dir {
        Some(test_dir) => {
            let test = ProfileData::load(test_dir)?;
            let judged = MeasuredSet::build(&test)?;
            let all: Vec<usize> = (0..judged.configs.len()).collect();
            let measured: Vec<f64> = judged.configs.iter().map(|c| c.seconds).collect();
            let window = crate::metrics::median(&measured);
            let unseen_models: Vec<String> = test
                .measured_models()
                .into_iter()
                .filter(|m| !data.measured_models().contains(m))
                .collect();
            let unseen_devices: Vec<String> = test
                .measured_devices()
                .into_iter()
                .filter(|d| !data.measured_devices().contains(d))
                .collect();
            let note = format!(
                "trained on {}; models not in training: [{}]; devices not in training: [{}]",
                train_dir.display(),
                unseen_models.join(", "),
                unseen_devices.join(", ")
            );
            for est in train_all(&MeasuredSet::build(&data)?)? {
                let predicted = predict_all(est.as_ref(), &judged, &all)?;
                rows.push(row(
                    est.name(),
                    "test",
                    &Tally::score(&predicted, &measured),
                    window,
                    &note,
                ));
            }
        }
        None => {
            let judged = MeasuredSet::build(&data)?;
            let mut folds = Vec::new();
            for m in data.measured_models() {
                folds.push(Fold {
                    split: LOMO,
                    name: format!("model:{m}"),
                    held: HeldOut::Model(m),
                });
            }
            for d in data.measured_devices() {
                folds.push(Fold {
                    split: LODO,
                    name: format!("device:{d}"),
                    held: HeldOut::Device(d),
                });
            }
            let results = run_folds(&judged, &folds)?;
            for split in [LOMO, LODO] {
                for name in ESTIMATORS {
                    let mut pooled = Tally::default();
                    let mut window: f64 = 0.0;
                    let mut largest = 0;
                    for (fold, res) in folds.iter().zip(&results) {
                        if fold.split != split {
                            continue;
                        }
                        for (est, t, w) in res {
                            if est == name {
                                pooled.merge(t);
                                if t.configurations > largest {
                                    largest = t.configurations;
                                    window = *w;
                                }
                            }
                        }
                    }
                    rows.push(row(
                        name,
                        split,
                        &pooled,
                        window,
                        "folds pooled; window per fold",
                    ));
                }
            }
            for (fold, res) in folds.iter().zip(&results) {
                for (est, t, w) in res {
                    rows.push(row(est, &fold.name, t, *w, fold.split));
                }
            }
        }
    }
    Ok(EvalReport {
        train_dir: train_dir.to_path_buf(),
        test_dir: test_dir.map(Path::to_path_buf),
        rows,
        notes,
    })
}

type FoldResult = Vec<(String, Tally, f64)>;

/// Run the folds on up to two threads (the folds are independent and deterministic, and the
/// results are returned in fold order).
fn run_folds(judged: &MeasuredSet<'_>, folds: &[Fold]) -> Result<Vec<FoldResult>, PredictorError> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 2);
    let mut results: Vec<Option<Result<FoldResult, PredictorError>>> =
        (0..folds.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                scope.spawn(move || {
                    (w..folds.len())
                        .step_by(workers)
                        .map(|i| (i, run_fold(judged, &folds[i])))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(done) => {
                    for (i, r) in done {
                        results[i] = Some(r);
                    }
                }
                Err(_) => {
                    // A panicking fold leaves its slot empty; reported below.
                }
            }
        }
    });
    results
        .into_iter()
        .zip(folds)
        .map(|(r, f)| {
            r.unwrap_or_else(|| {
                Err(PredictorError::Training {
                    estimator: "eval".into(),
                    message: format!("fold {} did not finish", f.name),
                })
            })
        })
        .collect()
}

/// What the attention data supports: an in-sample fit of one shape, not a held-out figure.
fn attention_note(data: &ProfileData) -> String {
    let Some(model) = AttentionModel::fit(&data.attention, &data.devices) else {
        return "attention kernels: no measured data; the graph estimator uses the shipped \
                attention fit, unjudged"
            .into();
    };
    let mut shapes: Vec<(String, u64, u64, u64, u32)> = data
        .attention
        .iter()
        .map(|s| {
            (
                s.device.clone(),
                s.q_heads,
                s.kv_heads,
                s.head_dim,
                s.tensor_parallel,
            )
        })
        .collect();
    shapes.sort();
    shapes.dedup();
    let (mut err, mut sum) = (0.0, 0.0);
    for s in &data.attention {
        let Some(device) = data.devices.get(&s.device) else {
            continue;
        };
        let (cost, phase) = sample_cost(s);
        err += (model.time(&cost, phase, device) - s.time_ms / 1000.0).abs();
        sum += s.time_ms / 1000.0;
    }
    let wape = if sum > 0.0 { err / sum } else { 0.0 };
    format!(
        "attention kernels: {} measured kernels of {} shape(s) only ({}); too few to hold any \
         out, so no held-out figure: they calibrate the attention model (in-sample WAPE {:.2} %)",
        data.attention.len(),
        shapes.len(),
        shapes
            .iter()
            .map(|(d, q, kv, hd, tp)| format!("{d}: {q} q / {kv} kv heads × {hd}, TP {tp}"))
            .collect::<Vec<_>>()
            .join("; "),
        100.0 * wape
    )
}
