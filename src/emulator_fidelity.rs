//! Predictor targets with no measured data (load time, peak memory — and run time on the Qwen3
//! catalogue) judged against the emulator instead, and marked as such in the report. This is
//! the only place where an estimator's output meets the emulator's numbers, and only to
//! *report* the gap: the planner never reads the emulator's costs (except the labelled
//! `oracle`).

use switchyard_emulator::{BatchShape, MemoryPlan, PrefillChunk, ServingConfig, iteration_time, load_time};
use switchyard_predictor::arch::Architecture;
use switchyard_predictor::estimators::{self, Predict};
use switchyard_predictor::eval::EvalRow;
use switchyard_predictor::graph::{Deployment, OperatorGraph};
use switchyard_predictor::request::Request;
use switchyard_predictor::{Dtype, PredictorError, spec};

/// Request shapes judged: (batch, prompt tokens, output tokens).
const REQUESTS: [(u32, u32, u32); 4] = [(1, 512, 128), (1, 2048, 512), (8, 1024, 256), (32, 2048, 256)];

fn emulated_run(device: &spec::DeviceSpec, model: &spec::ModelArch, (b, i, o): (u32, u32, u32)) -> f64 {
    let prefill = BatchShape {
        prefills: (0..b).map(|_| PrefillChunk { tokens: i, cached_context: 0 }).collect(),
        decode_contexts: Vec::new(),
    };
    let mid = i + o / 2;
    let decode = BatchShape { prefills: Vec::new(), decode_contexts: vec![mid; b as usize] };
    iteration_time(device, model, Dtype::Fp16, &prefill)
        + o.saturating_sub(1) as f64 * iteration_time(device, model, Dtype::Fp16, &decode)
}

fn wape(pairs: &[(f64, f64)]) -> f64 {
    let err: f64 = pairs.iter().map(|(p, t)| (p - t).abs()).sum();
    let total: f64 = pairs.iter().map(|(_, t)| t).sum();
    if total > 0.0 { err / total } else { 0.0 }
}

fn ordering(pairs: &[(f64, f64)]) -> f64 {
    let (mut agree, mut n) = (0u64, 0u64);
    for i in 0..pairs.len() {
        for j in i + 1..pairs.len() {
            if pairs[i].1 == pairs[j].1 {
                continue;
            }
            n += 1;
            if (pairs[i].0 < pairs[j].0) == (pairs[i].1 < pairs[j].1) {
                agree += 1;
            }
        }
    }
    if n == 0 { 1.0 } else { agree as f64 / n as f64 }
}

fn window_fit(pairs: &[(f64, f64)]) -> (f64, f64) {
    let mut truth: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    truth.sort_by(f64::total_cmp);
    let window = truth.get(truth.len() / 2).copied().unwrap_or(0.0);
    let agree = pairs.iter().filter(|(p, t)| (*p <= window) == (*t <= window)).count();
    (if pairs.is_empty() { 1.0 } else { agree as f64 / pairs.len() as f64 }, window)
}

/// One row per estimator: run time, load time and peak memory of the Qwen3 catalogue on every
/// catalogue device where the model fits, against the emulator (split `emulator (not measured)`).
pub fn rows() -> Result<Vec<EvalRow>, PredictorError> {
    let mut out = Vec::new();
    for name in ["formula", "gbdt", "graph"] {
        let est: Box<dyn Predict> = estimators::estimator(name)?;
        let (mut run, mut load, mut peak) = (Vec::new(), Vec::new(), Vec::new());
        for model in spec::model_catalogue() {
            let graph = OperatorGraph::build(&Deployment::new(Architecture::from(&model), Dtype::Fp16));
            for device in spec::device_catalogue() {
                let config = ServingConfig::vllm_defaults(Dtype::Fp16, 8192);
                let Ok(plan) = MemoryPlan::new(&device, &model, &config) else { continue };
                load.push((est.load_time(&graph, &device), load_time(&device, &model, Dtype::Fp16)));
                for r in REQUESTS {
                    let request = Request::new(r.0, r.1, r.2);
                    run.push((est.run_time(&graph, &request, &device), emulated_run(&device, &model, r)));
                    let (w, kv, act) = est.memory(&graph, &request, &device);
                    let tokens = (r.0 as u64) * (r.1 + r.2) as u64;
                    let truth = plan.weight_bytes + model.kv_bytes_per_token(Dtype::Fp16) * tokens + plan.activation_peak_bytes;
                    peak.push((w + kv + act, truth as f64));
                }
            }
        }
        let (fit, window) = window_fit(&run);
        out.push(EvalRow {
            estimator: name.to_string(),
            split: "emulator (not measured)".to_string(),
            wape_runtime: wape(&run),
            ordering: ordering(&run),
            window_fit: fit,
            configurations: run.len() as u64,
            pairs: (run.len() * run.len().saturating_sub(1) / 2) as u64,
            window_s: window,
            wape_load: Some(wape(&load)),
            wape_peak_memory: Some(wape(&peak)),
            notes: "against the emulator's cost, load and memory models (Qwen3 catalogue × device catalogue), not against measurements".into(),
        });
    }
    Ok(out)
}
