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
//! compute or bandwidth bound; the features are the operator's shape (rows, `k`, `n`), where it
//! sits against the device's ridge point (`(FLOPs/P)/(bytes/B)`) and the device's throughput
//! and bandwidth. (Adding its FLOPs, bytes or absolute roofline time as features made
//! leave-one-device-out worse, 3.7 % → 4.1–4.3 % WAPE: they tie the efficiency to one
//! device's speed.) Trees rather than a network: a few thousand samples per class, training
//! in well under a second, deterministic. Why normalize: the roofline carries what transfers across devices and models (a GEMM twice
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
use crate::activation::{ActivationSample, nonneg_lsq, weighted_passes};
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
const UNTRAINED_RATIO: f64 = 10.0;
const UNTRAINED_LAUNCH_S: f64 = 5e-6;

/// The graph–device estimator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphDevice {
    classes: BTreeMap<OpKind, BoostedTrees>,
    attention: AttentionModel,
    /// Target heads fitted on whole activations, when any were given
    /// ([`GraphDevice::with_activation_heads`]); without them the analytic combination.
    #[serde(default)]
    heads: ActivationHeads,
}

/// Terms of the run-time head, each computed on the operator graph for the whole request:
/// non-attention operators of the prefill and of the decode passes, attention of the prefill
/// and of the decode passes (all from the per-operator models), engine iterations (one per
/// output token) and sequence-iterations (batch × iterations: per-sequence engine work such
/// as scheduling and sampling).
pub const RUN_TERMS: usize = 6;
/// Terms of the peak-memory head (beyond weights and KV): a constant (engine context and
/// workspaces), the request's own activation peak on the graph, and the activation peak of
/// an 8,192-token pass (the size of vLLM's start-up profile run with its default
/// `max_num_batched_tokens`).
pub const MEMORY_TERMS: usize = 3;
/// Terms of the load-time head: a constant, bf16 support (the engine generation a device
/// runs), weights over the loader's throughput (capped by the host link) and kernels of one
/// pass (CUDA-graph capture).
pub const LOAD_TERMS: usize = 4;

/// The target-specific heads of paper 003 §3.3 ("target-specific heads produce the three
/// estimates"): linear, non-negative combinations of graph-derived terms, fitted on whole
/// activations. Each is `None` until fitted (or when its fit found no non-negative solution).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ActivationHeads {
    pub run: Option<[f64; RUN_TERMS]>,
    pub memory: Option<[f64; MEMORY_TERMS]>,
    pub load: Option<[f64; LOAD_TERMS]>,
}

/// Tokens of the profile-run pass of the memory head.
const PROFILE_RUN_TOKENS: u32 = 8192;

fn dot<const N: usize>(c: &[f64; N], x: &[f64; N]) -> f64 {
    c.iter().zip(x).map(|(a, b)| a * b).sum()
}

fn to_array<const N: usize>(v: Option<Vec<f64>>) -> Option<[f64; N]> {
    v.and_then(|v| <[f64; N]>::try_from(v).ok())
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
            heads: ActivationHeads::default(),
        })
    }

    /// Fit the three target heads on measured whole activations (non-negative least squares
    /// over the graph-derived terms of [`RUN_TERMS`], [`MEMORY_TERMS`], [`LOAD_TERMS`]); the
    /// per-operator models are kept as trained. Run time is fitted with weights `1/t` (between
    /// relative and absolute error), memory and load on absolute error; load on one row per
    /// (model, device).
    pub fn with_activation_heads(mut self, samples: &[ActivationSample]) -> Result<Self, PredictorError> {
        let samples: Vec<&ActivationSample> = samples
            .iter()
            .filter(|s| s.run_s > 0.0 && s.peak_bytes > 0.0 && s.load_s > 0.0)
            .collect();
        if samples.is_empty() {
            return Err(PredictorError::Training {
                estimator: "graph".into(),
                message: "no measured activation for the target heads".into(),
            });
        }
        let (mut xr, mut yr, mut wr) = (Vec::new(), Vec::new(), Vec::new());
        let (mut xm, mut ym) = (Vec::new(), Vec::new());
        let mut pairs = BTreeMap::new();
        for s in &samples {
            let graph = s.graph();
            xr.push(self.run_terms(&graph, &s.request, &s.device).to_vec());
            yr.push(s.run_s);
            wr.push(1.0 / s.run_s);
            let base = graph.param_bytes() as f64 + lifecycle::kv_bytes(&graph, &s.request);
            xm.push(memory_terms(&graph, &s.request).to_vec());
            ym.push(s.peak_bytes - base);
            pairs
                .entry((s.model.name.clone(), s.device.name.clone()))
                .or_insert_with(|| (load_terms(&graph, &s.device).to_vec(), s.load_s));
        }
        let (xl, yl): (Vec<Vec<f64>>, Vec<f64>) = pairs.into_values().unzip();
        self.heads = ActivationHeads {
            run: to_array(nonneg_lsq(&xr, &yr, &wr)),
            memory: to_array(nonneg_lsq(&xm, &ym, &vec![1.0; ym.len()])),
            load: to_array(nonneg_lsq(&xl, &yl, &vec![1.0; yl.len()])),
        };
        Ok(self)
    }

    /// The same estimator with another attention model (e.g. [`AttentionModel::ROOFLINE`]
    /// when the training data must not contribute the shipped fit).
    pub fn with_attention(mut self, attention: AttentionModel) -> Self {
        self.attention = attention;
        self
    }

    /// The attention model in use.
    pub fn attention(&self) -> &AttentionModel {
        &self.attention
    }

    /// The heads in use.
    pub fn heads(&self) -> &ActivationHeads {
        &self.heads
    }

    /// The run-time head's terms for `request` (see [`RUN_TERMS`]).
    pub fn run_terms(&self, graph: &OperatorGraph, request: &Request, device: &DeviceSpec) -> [f64; RUN_TERMS] {
        let mut x = [0.0; RUN_TERMS];
        for (w, pass) in weighted_passes(request) {
            let times = self.node_times(graph, &pass, device, Coverage::Full);
            let (mut lin, mut attn) = (times.clone(), times);
            for (i, node) in graph.nodes.iter().enumerate() {
                if node.kind == OpKind::Attention {
                    lin[i] = 0.0;
                } else {
                    attn[i] = 0.0;
                }
            }
            let (l, a) = (graph.combine(&lin, Coverage::Full), graph.combine(&attn, Coverage::Full));
            let (li, ai) = match pass.phase {
                crate::request::Phase::Prefill => (0, 2),
                crate::request::Phase::Decode => (1, 3),
            };
            x[li] += w * l;
            x[ai] += w * a;
        }
        let iterations = f64::from(request.output_tokens.max(1));
        x[4] = iterations;
        x[5] = iterations * f64::from(request.batch.max(1));
        x
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
            None => UNTRAINED_LAUNCH_S + roofline(cost, device) * UNTRAINED_RATIO,
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

/// The memory head's terms (see [`MEMORY_TERMS`]).
fn memory_terms(graph: &OperatorGraph, request: &Request) -> [f64; MEMORY_TERMS] {
    [
        1.0,
        lifecycle::activation_bytes(graph, request),
        graph.activation_peak_bytes(&ForwardPass::prefill(1, PROFILE_RUN_TOKENS)),
    ]
}

/// The load head's terms (see [`LOAD_TERMS`]).
fn load_terms(graph: &OperatorGraph, device: &DeviceSpec) -> [f64; LOAD_TERMS] {
    let throughput = lifecycle::LOADER_BYTES_PER_S.min(device.host_link_bandwidth);
    [
        1.0,
        f64::from(u8::from(device.supports_bf16)),
        graph.param_bytes() as f64 / throughput,
        lifecycle::kernels_per_pass(graph) as f64,
    ]
}

impl Predict for GraphDevice {
    fn name(&self) -> &'static str {
        "graph"
    }

    fn run_time(&self, graph: &OperatorGraph, request: &Request, device: &DeviceSpec) -> f64 {
        match &self.heads.run {
            Some(c) => dot(c, &self.run_terms(graph, request, device)),
            None => {
                self.pass_time(graph, &request.prefill(), device, Coverage::Full)
                    + super::decode_time(request, |pass| {
                        self.pass_time(graph, pass, device, Coverage::Full)
                    })
            }
        }
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
        let rest = match &self.heads.memory {
            Some(c) => dot(c, &memory_terms(graph, request)),
            None => lifecycle::activation_bytes(graph, request),
        };
        (
            graph.param_bytes() as f64,
            lifecycle::kv_bytes(graph, request),
            rest,
        )
    }

    fn load_time(&self, graph: &OperatorGraph, device: &DeviceSpec) -> f64 {
        match &self.heads.load {
            Some(c) => dot(c, &load_terms(graph, device)),
            None => lifecycle::graph_load_time(graph, device),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Architecture;
    use crate::graph::Deployment;
    use crate::spec::{self, Dtype};
    use std::sync::OnceLock;

    fn data() -> &'static ProfileData {
        static DATA: OnceLock<ProfileData> = OnceLock::new();
        DATA.get_or_init(|| ProfileData::load(&crate::data::default_train_dir()).unwrap())
    }

    fn trained() -> &'static GraphDevice {
        static MODEL: OnceLock<GraphDevice> = OnceLock::new();
        MODEL.get_or_init(|| GraphDevice::train(data()).unwrap())
    }

    fn qwen(name: &str) -> OperatorGraph {
        OperatorGraph::build(&Deployment::new(
            Architecture::from(&spec::model(name).unwrap()),
            Dtype::Bf16,
        ))
    }

    #[test]
    fn training_is_deterministic() {
        let set = MeasuredSet::build(data()).unwrap();
        let phi = set.subset(|m, _| m == "microsoft/phi-2");
        assert_eq!(
            GraphDevice::train_on(&phi).unwrap(),
            GraphDevice::train_on(&phi).unwrap()
        );
    }

    #[test]
    fn every_shipped_operator_class_is_trained() {
        let m = trained();
        for kind in OpKind::ALL {
            assert_eq!(
                m.classes.contains_key(&kind),
                kind != OpKind::Attention,
                "{kind:?}"
            );
        }
    }

    #[test]
    fn unseen_devices_are_ordered_by_their_spec_sheets() {
        // Neither the catalogue's L4 nor its H200 is in the training data.
        let g = qwen("Qwen3-8B");
        let m = trained();
        let prefill = ForwardPass::prefill(1, 4096);
        let decode = ForwardPass::decode(8, 2048);
        let t = |d: &str, p: &ForwardPass| {
            m.pass_time(&g, p, &spec::device(d).unwrap(), Coverage::Full)
        };
        assert!(t("L4", &prefill) > t("A100-40GB", &prefill));
        assert!(t("A100-40GB", &prefill) > t("H200-141GB", &prefill));
        assert!(t("L4", &decode) > t("A100-80GB", &decode));
        assert!(t("A100-80GB", &decode) > t("H200-141GB", &decode));
    }

    #[test]
    fn decode_is_near_the_bandwidth_bound_and_grows_with_context() {
        // One decode step of Qwen3-8B on an A100-80GB reads 16.4 GB of weights: at least
        // 8 ms at 2,039 GB/s, and not more than twice that.
        let g = qwen("Qwen3-8B");
        let d = spec::device("A100-80GB").unwrap();
        let m = trained();
        let short = m.pass_time(&g, &ForwardPass::decode(1, 16), &d, Coverage::Full);
        let bound = g.param_bytes() as f64 / d.memory_bandwidth;
        assert!(short > bound && short < 2.0 * bound, "{short} vs {bound}");
        let long = m.pass_time(&g, &ForwardPass::decode(32, 16_000), &d, Coverage::Full);
        assert!(long > short);
    }

    #[test]
    fn an_untrained_class_falls_back_to_a_slow_roofline() {
        let mut m = trained().clone();
        m.classes.remove(&OpKind::Rotary);
        let g = qwen("Qwen3-8B");
        let d = spec::device("A100-80GB").unwrap();
        let pass = ForwardPass::prefill(1, 1024);
        let node = g.nodes.iter().find(|n| n.kind == OpKind::Rotary).unwrap();
        let cost = g.cost(node, &pass);
        let t = m.op_time(OpKind::Rotary, &cost, &pass, &d);
        assert!((t - (5e-6 + 10.0 * roofline(&cost, &d))).abs() < 1e-6 * t.max(1e-9) + 1e-9);
    }

    #[test]
    fn activation_heads_recover_known_coefficients_and_change_nothing_else() {
        use crate::activation::ActivationSample;
        let m = trained();
        let coef = [1.2, 0.8, 0.5, 0.6, 2e-3, 5e-5];
        let mut samples = Vec::new();
        for (i, name) in ["Qwen3-0.6B", "Qwen3-4B", "Qwen3-8B"].iter().enumerate() {
            let model = spec::model(name).unwrap();
            for (j, dev) in ["A100-40GB", "L4", "V100-32GB"].iter().enumerate() {
                let device = spec::device(dev).unwrap();
                for k in 0..6u32 {
                    let request = Request::new(1 + (k * 7 + i as u32) % 17, 200 + 900 * k + 50 * j as u32, 30 + 60 * k);
                    let mut s = ActivationSample { model: model.clone(), dtype: Dtype::Fp16, device: device.clone(), request, run_s: 0.0, peak_bytes: 0.0, load_s: 0.0 };
                    let g = s.graph();
                    let x = m.run_terms(&g, &request, &device);
                    s.run_s = coef.iter().zip(&x).map(|(c, x)| c * x).sum();
                    s.peak_bytes = g.param_bytes() as f64 + lifecycle::kv_bytes(&g, &request) + 2e9;
                    s.load_s = 30.0 + g.param_bytes() as f64 / 4e9;
                    samples.push(s);
                }
            }
        }
        let fitted = m.clone().with_activation_heads(&samples).unwrap();
        let run = fitted.heads().run.unwrap();
        for (got, want) in run.iter().zip(&coef) {
            assert!((got - want).abs() <= 1e-3 * want, "{run:?}");
        }
        let mem = fitted.heads().memory.unwrap();
        assert!((mem[0] - 2e9).abs() < 1e3 && mem[1].abs() < 1e-6 && mem[2].abs() < 1e-6, "{mem:?}");
        let s = &samples[5];
        let g = s.graph();
        assert!((fitted.load_time(&g, &s.device) - s.load_s).abs() < 1e-6);
        // The per-operator models and the pass times are those of the estimator it came from.
        let pass = ForwardPass::decode(4, 1000);
        assert_eq!(fitted.pass_time(&g, &pass, &s.device, Coverage::Full), m.pass_time(&g, &pass, &s.device, Coverage::Full));
        assert!(m.heads().run.is_none() && m.clone().with_activation_heads(&[]).is_err());
    }

    #[test]
    fn memory_includes_the_activation_peak() {
        let g = qwen("Qwen3-8B");
        let d = spec::device("A100-80GB").unwrap();
        let p = trained().predict(&g, &Request::new(4, 2048, 256), &d);
        assert_eq!(p.weights_bytes, g.param_bytes() as f64);
        assert!(p.activation_bytes > 0.0);
        assert!((p.peak_bytes - (p.weights_bytes + p.kv_bytes + p.activation_bytes)).abs() < 1.0);
        assert!(p.load_s > lifecycle::ENGINE_START_S);
    }
}
