//! `gbdt`: gradient-boosted trees on scalar features (paper 003 §4.1, "GBDT predictor").
//!
//! One ensemble maps a configuration's scalar features (model size, layer count, hidden size,
//! batch size, sequence lengths, memory bandwidth, compute throughput, tensor-parallel degree)
//! to the log of its forward-pass time. It sees no graph structure and no roofline, so it
//! interpolates between the models and devices it was trained on and cannot extrapolate to a
//! faster device. Trained only on what is measured (the profiled operators); the parts of a
//! pass with no measurement (attention, LM head), peak memory and load time come from the
//! calibrated [`Formula`], which this baseline would otherwise have no data for.

use serde::{Deserialize, Serialize};

use super::formula::Formula;
use super::{Predict, lifecycle};
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Architecture;
    use crate::graph::Deployment;
    use crate::spec::{self, Dtype};

    #[test]
    fn fits_its_training_data_and_defers_the_rest_to_the_formula() {
        let data = ProfileData::load(&crate::eval::default_train_dir()).unwrap();
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
