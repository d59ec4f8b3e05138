//! Measured configurations, each assembled on its deployment's operator graph.
//!
//! A Vidur `mlp.csv` row measures the profiled operators of one layer for one (model, device,
//! tensor-parallel degree, token count). The judged *configuration* is the forward pass those
//! operators make up: its measured time is the per-operator medians combined along the graph
//! exactly as a prediction is ([`OperatorGraph::measured_seconds`]), over the profiled nodes
//! only (attention kernels and the LM head are not measured). Vidur profiles fp16 models, so
//! the graphs are fp16 deployments, and a row of `num_tokens = n` is the prefill of one
//! sequence of `n` tokens (the profiled operators see only the token count).
//!
//! Shared by the trainers and the evaluation; holds no estimator logic, and must not depend
//! on the estimators or the evaluation (they read it), nor on the emulator or the runtime.

use std::collections::BTreeMap;

use crate::data::{AttentionSample, MeasuredPass, ProfileData};
use crate::error::PredictorError;
use crate::graph::{Deployment, OperatorGraph};
use crate::request::ForwardPass;
use crate::spec::{DeviceSpec, Dtype};

/// One judged configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredConfig {
    /// Index into [`ProfileData::passes`].
    pub pass_index: usize,
    /// Index into [`MeasuredSet::graphs`].
    pub graph: usize,
    pub pass: ForwardPass,
    /// Measured seconds of the profiled operators of the forward pass.
    pub seconds: f64,
}

/// Every measured configuration of a profile directory, with the graphs they run on.
#[derive(Debug, Clone)]
pub struct MeasuredSet<'a> {
    pub data: &'a ProfileData,
    pub graphs: Vec<OperatorGraph>,
    pub configs: Vec<MeasuredConfig>,
    /// The attention kernels that go with these configurations.
    pub attention: Vec<AttentionSample>,
}

impl<'a> MeasuredSet<'a> {
    /// Assemble every measured pass of `data`. A pass whose CSV lacks a column the graph
    /// needs is an error naming the model, device and column.
    pub fn build(data: &'a ProfileData) -> Result<Self, PredictorError> {
        let mut index: BTreeMap<(String, u32), usize> = BTreeMap::new();
        let mut graphs = Vec::new();
        let mut configs = Vec::with_capacity(data.passes.len());
        for (pass_index, p) in data.passes.iter().enumerate() {
            let key = (p.model.clone(), p.tensor_parallel);
            let graph = match index.get(&key) {
                Some(&g) => g,
                None => {
                    let arch =
                        data.models
                            .get(&p.model)
                            .ok_or_else(|| PredictorError::BadLayout {
                                path: data.root.join("model_configs"),
                                message: format!("no config for measured model `{}`", p.model),
                            })?;
                    let deployment = Deployment {
                        arch: arch.clone(),
                        dtype: Dtype::Fp16,
                        tensor_parallel: p.tensor_parallel,
                    };
                    graphs.push(OperatorGraph::build(&deployment));
                    index.insert(key, graphs.len() - 1);
                    graphs.len() - 1
                }
            };
            let seconds = graphs[graph].measured_seconds(&p.op_ms).ok_or_else(|| {
                let missing = graphs[graph]
                    .nodes
                    .iter()
                    .filter_map(|n| n.profiled)
                    .find(|op| p.op_ms[op.index()].is_none())
                    .map(|op| op.column())
                    .unwrap_or("?");
                PredictorError::BadLayout {
                    path: data
                        .root
                        .join("profiling/compute")
                        .join(&p.device)
                        .join(&p.model)
                        .join("mlp.csv"),
                    message: format!(
                        "no `time_stats.{missing}.median` column, which the operator graph of `{}` needs",
                        p.model
                    ),
                }
            })?;
            configs.push(MeasuredConfig {
                pass_index,
                graph,
                pass: ForwardPass::prefill(1, p.tokens),
                seconds,
            });
        }
        Ok(MeasuredSet {
            data,
            graphs,
            configs,
            attention: data.attention.clone(),
        })
    }

    /// The configurations (and attention kernels) `keep(model, device)` accepts; attention
    /// kernels carry no model name and are filtered by device only (`keep("", device)`).
    pub fn subset(&self, keep: impl Fn(&str, &str) -> bool) -> MeasuredSet<'a> {
        MeasuredSet {
            data: self.data,
            graphs: self.graphs.clone(),
            configs: self
                .configs
                .iter()
                .filter(|c| {
                    let r = self.raw(c);
                    keep(&r.model, &r.device)
                })
                .cloned()
                .collect(),
            attention: self
                .attention
                .iter()
                .filter(|a| keep("", &a.device))
                .cloned()
                .collect(),
        }
    }

    /// The raw measurement behind a configuration.
    pub fn raw(&self, c: &MeasuredConfig) -> &MeasuredPass {
        &self.data.passes[c.pass_index]
    }

    /// The device a configuration ran on.
    pub fn device(&self, c: &MeasuredConfig) -> Option<&DeviceSpec> {
        self.data.devices.get(&self.raw(c).device)
    }
}

/// Whether a measured token count is used for training: eight per octave (every count up to
/// 64, then every `2^⌊log₂ n⌋ / 8`-th). Vidur's grid is dense at large counts, where
/// neighbouring rows carry the same information, and training must stay fast in a debug
/// build. Judging always uses every row.
pub fn keep_for_training(tokens: u64) -> bool {
    if tokens <= 64 {
        return true;
    }
    let octave = 1u64 << (63 - tokens.leading_zeros());
    tokens.is_multiple_of(octave / 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_keeps_eight_per_octave() {
        assert!((1..=64).all(keep_for_training));
        assert_eq!((2048..4096).filter(|&t| keep_for_training(t)).count(), 8);
        assert!(keep_for_training(4096) && !keep_for_training(4160) && keep_for_training(4608));
    }

    #[test]
    fn shipped_measurements_assemble() {
        let data = ProfileData::load(&crate::data::default_train_dir()).unwrap();
        let set = MeasuredSet::build(&data).unwrap();
        assert_eq!(set.configs.len(), data.passes.len());
        // Llama-2-7B, A100, TP 1, 4,096 tokens: emb + 32 × (the nine other operators, add
        // twice) from the CSV's medians: about 32 × 8.4 ms.
        let c = set
            .configs
            .iter()
            .find(|c| {
                let r = set.raw(c);
                r.model == "meta-llama/Llama-2-7b-hf"
                    && r.device == "a100"
                    && r.tensor_parallel == 1
                    && r.tokens == 4096
            })
            .unwrap();
        assert!(c.seconds > 0.25 && c.seconds < 0.30, "{}", c.seconds);
    }
}
