//! `formula`: a static size-and-bandwidth estimator in the style of LLMFit (paper 003 §4.1,
//! "Formula predictor").
//!
//! A forward pass takes `max(FLOPs / (η_c · P), bytes / (η_m · B))` over the whole model: FLOPs
//! of every covered operator, bytes of the covered weights plus the KV cache attention reads;
//! `P` is the device's dense fp16 throughput and `B` its memory bandwidth. Peak memory is
//! weights + KV cache, load time is weights over the host link. The only free parameters are
//! the two efficiencies: LLMFit's rule of thumb puts achieved bandwidth at 60–80 % of peak
//! (we take 70 % for both), and [`Formula::calibrate`] fits the pair to the training
//! measurements by minimizing their WAPE, so the baseline is trained on the same data as the
//! learned estimators. Uses the operator graph only for its totals. It must not depend on the
//! other estimators (`gbdt` and `graph_device` build on it), the evaluation, the emulator or
//! the runtime.

use serde::{Deserialize, Serialize};

use super::{Predict, lifecycle};
use crate::activation::{ActivationSample, weighted_passes};
use crate::data::ProfileData;
use crate::error::PredictorError;
use crate::graph::{Coverage, OpKind, OperatorGraph};
use crate::measured::{MeasuredSet, keep_for_training};
use crate::request::{ForwardPass, Request};
use crate::spec::DeviceSpec;

/// The formula estimator.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Formula {
    /// Achieved fraction of the dense fp16 throughput.
    pub compute_efficiency: f64,
    /// Achieved fraction of the memory bandwidth.
    pub memory_efficiency: f64,
}

impl Default for Formula {
    /// LLMFit's rule of thumb: 70 % of peak.
    fn default() -> Self {
        Formula {
            compute_efficiency: 0.7,
            memory_efficiency: 0.7,
        }
    }
}

/// Total FLOPs / P and bytes / B of a pass (seconds at 100 % efficiency).
fn ideal_times(
    graph: &OperatorGraph,
    pass: &ForwardPass,
    device: &DeviceSpec,
    coverage: Coverage,
) -> (f64, f64) {
    let mut flops = 0.0;
    let mut bytes = 0.0;
    for node in graph.nodes.iter().filter(|n| coverage.includes(n)) {
        let reps = graph.repetitions(node) as f64;
        let cost = graph.cost(node, pass);
        flops += reps * cost.flops;
        bytes += reps
            * if node.kind == OpKind::Attention {
                cost.bytes
            } else {
                node.param_bytes as f64
            };
    }
    (
        flops / device.dense_fp16_flops,
        bytes / device.memory_bandwidth,
    )
}

/// Candidate efficiencies of the calibration grid: 2.5 % to 100 % in steps of 2.5 %.
fn grid() -> impl Iterator<Item = f64> {
    (1..=40).map(|i| f64::from(i) * 0.025)
}

impl Formula {
    /// Fit both efficiencies to the measured configurations of `data` (coordinate search on a
    /// 2.5 % grid, minimizing WAPE).
    pub fn calibrate(data: &ProfileData) -> Result<Self, PredictorError> {
        Self::calibrate_on(&MeasuredSet::build(data)?)
    }

    /// [`Formula::calibrate`] on prepared measurements (the training share of them).
    pub fn calibrate_on(set: &MeasuredSet<'_>) -> Result<Self, PredictorError> {
        let rows: Vec<(f64, f64, f64)> = set
            .configs
            .iter()
            .filter(|c| keep_for_training(c.pass.tokens()))
            .filter_map(|c| {
                let device = set.device(c)?;
                let (tc, tm) =
                    ideal_times(&set.graphs[c.graph], &c.pass, device, Coverage::Profiled);
                Some((tc, tm, c.seconds))
            })
            .collect();
        Self::fit(&rows, "configuration", |&(tc, tm, t), f| {
            (f.time_at(tc, tm) - t).abs()
        })
    }

    /// Fit both efficiencies to whole activations (their run time: prefill and every decode
    /// step, minimizing WAPE on the same grid). Peak memory and load time stay static
    /// (weights + KV, weights over the host link): LLMFit has no parameter for them.
    pub fn calibrate_on_activations(samples: &[ActivationSample]) -> Result<Self, PredictorError> {
        // Per sample: its passes as (weight, FLOPs/P, bytes/B), and the measured run time.
        type Passes = Vec<(f64, f64, f64)>;
        let rows: Vec<(Passes, f64)> = samples
            .iter()
            .filter(|s| s.run_s > 0.0)
            .map(|s| {
                let graph = s.graph();
                let passes = weighted_passes(&s.request)
                    .iter()
                    .map(|(w, p)| {
                        let (tc, tm) = ideal_times(&graph, p, &s.device, Coverage::Full);
                        (*w, tc, tm)
                    })
                    .collect();
                (passes, s.run_s)
            })
            .collect();
        Self::fit(&rows, "activation", |(passes, t), f| {
            let p: f64 = passes
                .iter()
                .map(|&(w, tc, tm)| w * f.time_at(tc, tm))
                .sum();
            (p - t).abs()
        })
    }

    /// The efficiencies that minimize `Σ error(row, candidate)` over `rows` (the absolute
    /// errors: their measured total is fixed, so this minimizes WAPE): coordinate search on
    /// the grid from the rule of thumb, four rounds of compute then memory. No rows: an error,
    /// `no measured {what}`.
    fn fit<R>(
        rows: &[R],
        what: &str,
        error: impl Fn(&R, &Formula) -> f64,
    ) -> Result<Self, PredictorError> {
        if rows.is_empty() {
            return Err(PredictorError::Training {
                estimator: "formula".into(),
                message: format!("no measured {what}"),
            });
        }
        let wape = |ec: f64, em: f64| -> f64 {
            let candidate = Formula {
                compute_efficiency: ec,
                memory_efficiency: em,
            };
            rows.iter().map(|r| error(r, &candidate)).sum::<f64>()
        };
        let mut f = Formula::default();
        for _ in 0..4 {
            f.compute_efficiency = grid()
                .min_by(|&a, &b| {
                    wape(a, f.memory_efficiency).total_cmp(&wape(b, f.memory_efficiency))
                })
                .unwrap_or(f.compute_efficiency);
            f.memory_efficiency = grid()
                .min_by(|&a, &b| {
                    wape(f.compute_efficiency, a).total_cmp(&wape(f.compute_efficiency, b))
                })
                .unwrap_or(f.memory_efficiency);
        }
        Ok(f)
    }

    /// Seconds of a pass whose times at 100 % efficiency ([`ideal_times`]) are `tc` (compute)
    /// and `tm` (memory): the larger bound at this formula's efficiencies.
    fn time_at(&self, tc: f64, tm: f64) -> f64 {
        (tc / self.compute_efficiency).max(tm / self.memory_efficiency)
    }
}

impl Predict for Formula {
    fn name(&self) -> &'static str {
        "formula"
    }

    fn pass_time(
        &self,
        graph: &OperatorGraph,
        pass: &ForwardPass,
        device: &DeviceSpec,
        coverage: Coverage,
    ) -> f64 {
        let (tc, tm) = ideal_times(graph, pass, device, coverage);
        self.time_at(tc, tm)
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
            0.0,
        )
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
    fn decode_of_one_token_is_weights_over_bandwidth() {
        let m = spec::model("Qwen3-8B").unwrap();
        let g = OperatorGraph::build(&Deployment::new(Architecture::from(&m), Dtype::Bf16));
        let d = spec::device("A100-80GB").unwrap();
        let f = Formula::default();
        let pass = ForwardPass::decode(1, 0);
        let t = f.pass_time(&g, &pass, &d, Coverage::Full);
        // Weights + the KV of one token (q, k, v of one step are negligible).
        let bytes = m.param_bytes(Dtype::Bf16) as f64;
        let lo = bytes / (0.7 * d.memory_bandwidth);
        assert!(t >= lo && t < lo * 1.01, "{t} vs {lo}");
    }

    #[test]
    fn long_prefill_is_compute_bound() {
        let m = spec::model("Qwen3-8B").unwrap();
        let g = OperatorGraph::build(&Deployment::new(Architecture::from(&m), Dtype::Bf16));
        let d = spec::device("H100-80GB").unwrap();
        let f = Formula::default();
        let t = f.pass_time(&g, &ForwardPass::prefill(1, 8192), &d, Coverage::Full);
        let linear = 8192.0 * m.linear_flops_per_token() as f64 / (0.7 * d.dense_fp16_flops);
        assert!(t > linear, "{t} {linear}");
    }

    #[test]
    fn calibration_improves_on_the_rule_of_thumb() {
        let data = ProfileData::load(&crate::data::default_train_dir()).unwrap();
        let cal = Formula::calibrate(&data).unwrap();
        let set = MeasuredSet::build(&data).unwrap();
        let wape = |f: &Formula| {
            let (mut err, mut sum) = (0.0, 0.0);
            for c in &set.configs {
                let d = set.device(c).unwrap();
                err += (f.pass_time(&set.graphs[c.graph], &c.pass, d, Coverage::Profiled)
                    - c.seconds)
                    .abs();
                sum += c.seconds;
            }
            err / sum
        };
        assert!(wape(&cal) <= wape(&Formula::default()));
        assert!(
            cal.compute_efficiency > 0.2 && cal.memory_efficiency > 0.2,
            "{cal:?}"
        );
    }
}
