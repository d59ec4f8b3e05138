//! `graph`: the learned graph–device predictor (paper 003 §3.3, "Graph–device prediction").
//!
//! Each operator of the deployment's graph gets its own time, predicted from that operator's
//! shape and the device's features; the times are combined along the graph (critical path per
//! layer, times the layer count — see [`OperatorGraph::combine`]).
//!
//! **Learner.** One gradient-boosted tree ensemble per operator class (GEMM, norm, rotary,
//! activation, residual add, embedding), trained on Vidur's per-operator medians. The target
//! is not the time but the log of its ratio to the operator's roofline time on that device,
//! `log₂(t / max(FLOPs / P, bytes / B))`, i.e. how far the kernel falls short of the device's
//! compute or bandwidth bound; the features are the operator's shape (rows, `k`, `n`), its
//! FLOPs and bytes, where it sits against the device's ridge point (`(FLOPs/P)/(bytes/B)`), its
//! absolute roofline time (small kernels are launch-bound) and the device's throughput and
//! bandwidth. Why: the roofline carries what transfers across devices and models (a GEMM twice
//! as large on a device twice as fast takes the same time), so the trees only learn the
//! efficiency surface, which varies slowly with shape and is similar across GPU generations
//! (an A100 and an H100 both reach about 70 % of dense peak on large GEMMs). That is what lets
//! it predict an unseen model from its config and an unseen device from its spec sheet; a
//! learner on raw times (the `gbdt` baseline) cannot extrapolate to a faster device. Message
//! passing along edges was not used: on one CUDA stream an operator's time depends on its own
//! shapes, which the edges already fix, and the data has no cross-operator effects to learn.
//!
//! Attention kernels (no per-model measurements) use [`AttentionModel`]; peak memory and load
//! time use the graph-based models of [`lifecycle`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::attention::AttentionModel;
use super::{Predict, lifecycle};
use crate::boost::{BoostParams, BoostedTrees};
use crate::data::ProfileData;
use crate::error::PredictorError;
use crate::graph::{Coverage, OpCost, OpKind, OperatorGraph};
use crate::measured::{MeasuredSet, keep_for_training};
use crate::request::{ForwardPass, Request};
use crate::spec::DeviceSpec;

/// Features of one operator instance on one device.
pub const OP_FEATURES: usize = 6;

fn log2(x: f64) -> f64 {
    x.max(1e-30).log2()
}

/// Roofline time: the larger of the compute and the memory bound.
pub fn roofline(cost: &OpCost, device: &DeviceSpec) -> f64 {
    (cost.flops / device.dense_fp16_flops)
        .max(cost.bytes / device.memory_bandwidth)
        .max(1e-12)
}

/// The operator features the class models read.
pub fn op_features(cost: &OpCost, device: &DeviceSpec) -> [f64; OP_FEATURES] {
    let tc = cost.flops / device.dense_fp16_flops;
    let tm = cost.bytes / device.memory_bandwidth;
    [
        log2(cost.rows),
        log2(cost.k),
        log2(cost.n),
        log2(tc.max(1e-15) / tm.max(1e-15)),
        log2(device.dense_fp16_flops),
        log2(device.memory_bandwidth),
    ]
}

/// Hyper-parameters of each class ensemble.
pub const PARAMS: BoostParams = BoostParams {
    trees: 60,
    max_depth: 5,
    learning_rate: 0.2,
    min_leaf: 6,
    lambda: 1.0,
    bins: 64,
};

/// Efficiency assumed for an operator class with no training sample (e.g. a user directory
/// without rotary measurements): a tenth of the roofline plus a 5 µs launch. A conservative
/// guess, not a fit; the shipped data trains every class.
const UNTRAINED_RATIO_LOG2: f64 = 3.32;
const UNTRAINED_LAUNCH_S: f64 = 5e-6;

/// The graph–device estimator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphDevice {
    classes: BTreeMap<OpKind, BoostedTrees>,
    attention: AttentionModel,
}

impl GraphDevice {
    /// Train one ensemble per operator class on `data`'s per-operator measurements, and fit
    /// the attention model on its attention measurements (if any).
    pub fn train(data: &ProfileData) -> Result<Self, PredictorError> {
        Self::train_on(&MeasuredSet::build(data)?)
    }

    /// [`GraphDevice::train`] on prepared measurements (the training share of them).
    pub fn train_on(set: &MeasuredSet<'_>) -> Result<Self, PredictorError> {
        let mut samples: BTreeMap<OpKind, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        for c in &set.configs {
            let Some(device) = set.device(c) else {
                continue;
            };
            if !keep_for_training(c.pass.tokens()) {
                continue;
            }
            let raw = set.raw(c);
            let graph = &set.graphs[c.graph];
            let mut seen = [false; crate::graph::ProfiledOp::ALL.len()];
            for node in &graph.nodes {
                let Some(op) = node.profiled else { continue };
                if std::mem::replace(&mut seen[op.index()], true) {
                    continue; // the second residual add repeats the first's sample
                }
                let Some(ms) = raw.op_ms[op.index()] else {
                    continue;
                };
                if ms <= 0.0 {
                    continue;
                }
                let cost = graph.cost(node, &c.pass);
                let (x, y) = samples.entry(node.kind).or_default();
                x.extend(op_features(&cost, device));
                y.push((ms / 1000.0 / roofline(&cost, device)).log2());
            }
        }
        if samples.is_empty() {
            return Err(PredictorError::Training {
                estimator: "graph".into(),
                message: "no per-operator measurement".into(),
            });
        }
        let mut classes = BTreeMap::new();
        for (kind, (x, y)) in samples {
            let model = BoostedTrees::fit(&x, OP_FEATURES, &y, PARAMS).map_err(|e| {
                PredictorError::Training {
                    estimator: "graph".into(),
                    message: format!("{}: {e}", kind.name()),
                }
            })?;
            classes.insert(kind, model);
        }
        Ok(GraphDevice {
            classes,
            attention: AttentionModel::fit(&set.attention, &set.data.devices)
                .unwrap_or(AttentionModel::SHIPPED),
        })
    }

    /// Predicted seconds of one execution of an operator of class `kind` with work `cost`.
    pub fn op_time(
        &self,
        kind: OpKind,
        cost: &OpCost,
        pass: &ForwardPass,
        device: &DeviceSpec,
    ) -> f64 {
        if kind == OpKind::Attention {
            return self.attention.time(cost, pass.phase, device);
        }
        match self.classes.get(&kind) {
            Some(model) => {
                roofline(cost, device) * model.predict(&op_features(cost, device)).exp2()
            }
            None => UNTRAINED_LAUNCH_S + roofline(cost, device) * UNTRAINED_RATIO_LOG2.exp2(),
        }
    }

    /// Per-node times of one pass (0 for nodes outside `coverage`).
    pub fn node_times(
        &self,
        graph: &OperatorGraph,
        pass: &ForwardPass,
        device: &DeviceSpec,
        coverage: Coverage,
    ) -> Vec<f64> {
        let mut times: Vec<f64> = Vec::with_capacity(graph.nodes.len());
        for (i, node) in graph.nodes.iter().enumerate() {
            let t = if !coverage.includes(node) {
                0.0
            } else if let Some(j) = (0..i).find(|&j| {
                let other = &graph.nodes[j];
                coverage.includes(other)
                    && other.kind == node.kind
                    && other.shape == node.shape
                    && other.rows == node.rows
            }) {
                times[j] // same operator on the same shapes (the two residual adds)
            } else {
                self.op_time(node.kind, &graph.cost(node, pass), pass, device)
            };
            times.push(t);
        }
        times
    }
}

impl Predict for GraphDevice {
    fn name(&self) -> &'static str {
        "graph"
    }

    fn pass_time(
        &self,
        graph: &OperatorGraph,
        pass: &ForwardPass,
        device: &DeviceSpec,
        coverage: Coverage,
    ) -> f64 {
        graph.combine(&self.node_times(graph, pass, device, coverage), coverage)
    }

    fn memory(
        &self,
        graph: &OperatorGraph,
        request: &Request,
        _device: &DeviceSpec,
    ) -> (f64, f64, f64) {
        (
            graph.param_bytes() as f64,
            lifecycle::kv_bytes(graph, request),
            lifecycle::activation_bytes(graph, request),
        )
    }

    fn load_time(&self, graph: &OperatorGraph, device: &DeviceSpec) -> f64 {
        lifecycle::graph_load_time(graph, device)
    }
}
