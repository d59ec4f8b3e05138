//! `gbdt`: gradient-boosted trees on scalar features (paper 003 §4.1, "GBDT predictor").
//!
//! One ensemble maps a configuration's scalar features (model size, layer count, hidden size,
//! batch size, sequence lengths, memory bandwidth, compute throughput, tensor-parallel degree)
//! to the log of its forward-pass time. It sees no graph structure and no roofline, so it
//! interpolates between the models and devices it was trained on and cannot extrapolate to a
//! faster device. Trained only on what is measured (the profiled operators); the parts of a
//! pass with no measurement (attention, LM head), peak memory and load time come from the
//! calibrated [`Formula`], which this baseline would otherwise have no data for. It must not
//! depend on the graph estimator (`graph_device`), the evaluation, the emulator or the
//! runtime.

use serde::{Deserialize, Serialize};

use super::formula::Formula;
use super::{Predict, lifecycle};
use crate::activation::ActivationSample;
use crate::boost::{BoostParams, BoostedTrees};
use crate::data::ProfileData;
use crate::error::PredictorError;
use crate::graph::{Coverage, OperatorGraph};
use crate::measured::{MeasuredSet, keep_for_training};
use crate::request::{ForwardPass, Request};
use crate::spec::DeviceSpec;

/// The GBDT baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gbdt {
    trees: BoostedTrees,
    fallback: Formula,
}

const FEATURES: usize = 10;

fn log2(x: f64) -> f64 {
    x.max(1e-30).log2()
}

/// The scalar features of a configuration.
fn features(graph: &OperatorGraph, pass: &ForwardPass, device: &DeviceSpec) -> [f64; FEATURES] {
    let covered_params: u64 = graph
        .nodes
        .iter()
        .filter(|n| Coverage::Profiled.includes(n))
        .map(|n| n.param_bytes * graph.repetitions(n))
        .sum();
    [
        log2(covered_params as f64),
        graph.layers() as f64,
        log2(graph.deployment.arch.hidden_size as f64),
        log2(pass.tokens() as f64),
        log2(f64::from(pass.sequences)),
        log2(f64::from(pass.query_tokens)),
        log2(f64::from(pass.context_tokens) + 1.0),
        log2(device.memory_bandwidth),
        log2(device.dense_fp16_flops),
        f64::from(graph.deployment.tensor_parallel),
    ]
}

/// Hyper-parameters of the ensemble.
pub const PARAMS: BoostParams = BoostParams {
    trees: 80,
    max_depth: 6,
    learning_rate: 0.15,
    min_leaf: 8,
    lambda: 1.0,
    bins: 64,
};

impl Gbdt {
    /// Train on the measured configurations of `data` (calibrating its formula fallback).
    pub fn train(data: &ProfileData) -> Result<Self, PredictorError> {
        let set = MeasuredSet::build(data)?;
        Self::train_on(&set, Formula::calibrate_on(&set)?)
    }

    /// Train on prepared measurements, with an already calibrated formula for the parts no
    /// measurement covers.
    pub fn train_on(set: &MeasuredSet<'_>, fallback: Formula) -> Result<Self, PredictorError> {
        let mut x = Vec::new();
        let mut y = Vec::new();
        for c in &set.configs {
            let Some(device) = set.device(c) else {
                continue;
            };
            if !keep_for_training(c.pass.tokens()) || c.seconds <= 0.0 {
                continue;
            }
            x.extend(features(&set.graphs[c.graph], &c.pass, device));
            y.push(c.seconds.log2());
        }
        let trees =
            BoostedTrees::fit(&x, FEATURES, &y, PARAMS).map_err(|e| PredictorError::Training {
                estimator: "gbdt".into(),
                message: e.to_string(),
            })?;
        Ok(Gbdt { trees, fallback })
    }
}

impl Predict for Gbdt {
    fn name(&self) -> &'static str {
        "gbdt"
    }

    fn pass_time(
        &self,
        graph: &OperatorGraph,
        pass: &ForwardPass,
        device: &DeviceSpec,
        coverage: Coverage,
    ) -> f64 {
        let learned = || self.trees.predict(&features(graph, pass, device)).exp2();
        match coverage {
            Coverage::Profiled => learned(),
            Coverage::Unprofiled => {
                self.fallback
                    .pass_time(graph, pass, device, Coverage::Unprofiled)
            }
            Coverage::Full => {
                learned()
                    + self
                        .fallback
                        .pass_time(graph, pass, device, Coverage::Unprofiled)
            }
        }
    }

    fn memory(
        &self,
        graph: &OperatorGraph,
        request: &Request,
        device: &DeviceSpec,
    ) -> (f64, f64, f64) {
        self.fallback.memory(graph, request, device)
    }

    fn load_time(&self, graph: &OperatorGraph, device: &DeviceSpec) -> f64 {
        lifecycle::formula_load_time(graph, device)
    }
}

/// Features of a deployment on a device: model size, layers, hidden size, memory bandwidth,
/// compute throughput, device memory and bf16 support (the engine generation a device runs).
const DEPLOYMENT_FEATURES: usize = 7;
/// ... plus the request: batch, prompt and output lengths.
const ACTIVATION_FEATURES: usize = DEPLOYMENT_FEATURES + 3;

fn deployment_features(graph: &OperatorGraph, device: &DeviceSpec) -> [f64; DEPLOYMENT_FEATURES] {
    [
        log2(graph.param_bytes() as f64),
        graph.layers() as f64,
        log2(graph.deployment.arch.hidden_size as f64),
        log2(device.memory_bandwidth),
        log2(device.dense_fp16_flops),
        log2(device.memory_bytes as f64),
        f64::from(u8::from(device.supports_bf16)),
    ]
}

fn activation_features(
    graph: &OperatorGraph,
    request: &Request,
    device: &DeviceSpec,
) -> [f64; ACTIVATION_FEATURES] {
    let d = deployment_features(graph, device);
    let mut x = [0.0; ACTIVATION_FEATURES];
    x[..DEPLOYMENT_FEATURES].copy_from_slice(&d);
    x[DEPLOYMENT_FEATURES] = log2(f64::from(request.batch.max(1)));
    x[DEPLOYMENT_FEATURES + 1] = log2(f64::from(request.input_tokens.max(1)));
    x[DEPLOYMENT_FEATURES + 2] = log2(f64::from(request.output_tokens.max(1)));
    x
}

/// The GBDT baseline trained on whole activations (paper 003 §4.1: LightGBM on scalar model,
/// request and device features): one ensemble per target of Eq. 1 — log run time, log peak
/// memory, log load time. It sees no graph and no roofline. `pass_time` (one forward pass,
/// which no activation measures) is the calibrated formula's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActivationGbdt {
    run: BoostedTrees,
    peak: BoostedTrees,
    load: BoostedTrees,
    fallback: Formula,
}

/// Hyper-parameters of the activation ensembles (a few hundred samples: shallower trees).
pub const ACTIVATION_PARAMS: BoostParams = BoostParams {
    trees: 120,
    max_depth: 4,
    learning_rate: 0.1,
    min_leaf: 4,
    lambda: 1.0,
    bins: 64,
};

impl ActivationGbdt {
    /// Train the three ensembles on `samples`; `fallback` answers single passes.
    pub fn train(samples: &[ActivationSample], fallback: Formula) -> Result<Self, PredictorError> {
        let mut x = Vec::new();
        let (mut run, mut peak) = (Vec::new(), Vec::new());
        // Load time is one value per (model, device): one row per pair.
        let mut pairs = std::collections::BTreeMap::new();
        for s in samples {
            if !(s.run_s > 0.0 && s.peak_bytes > 0.0 && s.load_s > 0.0) {
                continue;
            }
            let graph = s.graph();
            x.extend(activation_features(&graph, &s.request, &s.device));
            run.push(s.run_s.log2());
            peak.push(s.peak_bytes.log2());
            pairs
                .entry((s.model.name.clone(), s.device.name.clone()))
                .or_insert_with(|| (deployment_features(&graph, &s.device), s.load_s.log2()));
        }
        let xl: Vec<f64> = pairs.values().flat_map(|(f, _)| f.iter().copied()).collect();
        let load: Vec<f64> = pairs.values().map(|(_, y)| *y).collect();
        let fit = |x: &[f64], width: usize, y: &[f64], target: &str| {
            BoostedTrees::fit(x, width, y, ACTIVATION_PARAMS).map_err(|e| {
                PredictorError::Training {
                    estimator: "gbdt".into(),
                    message: format!("{target}: {e}"),
                }
            })
        };
        Ok(ActivationGbdt {
            run: fit(&x, ACTIVATION_FEATURES, &run, "run time")?,
            peak: fit(&x, ACTIVATION_FEATURES, &peak, "peak memory")?,
            load: fit(&xl, DEPLOYMENT_FEATURES, &load, "load time")?,
            fallback,
        })
    }
}

impl Predict for ActivationGbdt {
    fn name(&self) -> &'static str {
        "gbdt"
    }

    fn pass_time(
        &self,
        graph: &OperatorGraph,
        pass: &ForwardPass,
        device: &DeviceSpec,
        coverage: Coverage,
    ) -> f64 {
        self.fallback.pass_time(graph, pass, device, coverage)
    }

    fn run_time(&self, graph: &OperatorGraph, request: &Request, device: &DeviceSpec) -> f64 {
        self.run
            .predict(&activation_features(graph, request, device))
            .exp2()
    }

    /// The learned peak, reported as weights + the learned rest (no KV / activation split).
    fn memory(
        &self,
        graph: &OperatorGraph,
        request: &Request,
        device: &DeviceSpec,
    ) -> (f64, f64, f64) {
        let peak = self
            .peak
            .predict(&activation_features(graph, request, device))
            .exp2();
        let weights = graph.param_bytes() as f64;
        (weights, (peak - weights).max(0.0), 0.0)
    }

    fn load_time(&self, graph: &OperatorGraph, device: &DeviceSpec) -> f64 {
        self.load.predict(&deployment_features(graph, device)).exp2()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Architecture;
    use crate::graph::Deployment;
    use crate::spec::{self, Dtype};

    #[test]
    fn fits_its_training_data_and_defers_the_rest_to_the_formula() {
        let data = ProfileData::load(&crate::data::default_train_dir()).unwrap();
        let set = MeasuredSet::build(&data).unwrap();
        let phi = set.subset(|m, _| m == "microsoft/phi-2");
        let formula = Formula::calibrate_on(&phi).unwrap();
        let gbdt = Gbdt::train_on(&phi, formula).unwrap();
        let (mut err, mut sum) = (0.0, 0.0);
        for c in &phi.configs {
            let d = phi.device(c).unwrap();
            err += (gbdt.pass_time(&phi.graphs[c.graph], &c.pass, d, Coverage::Profiled)
                - c.seconds)
                .abs();
            sum += c.seconds;
        }
        assert!(err / sum < 0.05, "in-sample WAPE {}", err / sum);
        let g = OperatorGraph::build(&Deployment::new(
            Architecture::from(&spec::model("Qwen3-4B").unwrap()),
            Dtype::Bf16,
        ));
        let d = spec::device("L4").unwrap();
        let pass = ForwardPass::decode(4, 1000);
        assert_eq!(
            gbdt.pass_time(&g, &pass, &d, Coverage::Unprofiled),
            formula.pass_time(&g, &pass, &d, Coverage::Unprofiled)
        );
        let full = gbdt.pass_time(&g, &pass, &d, Coverage::Full);
        let parts = gbdt.pass_time(&g, &pass, &d, Coverage::Profiled)
            + gbdt.pass_time(&g, &pass, &d, Coverage::Unprofiled);
        assert!((full - parts).abs() < 1e-12);
    }
}
