//! Time of attention kernels: `t = c₀ + a · FLOPs / P + b · bytes / B` per phase, with `P` the
//! device's dense fp16 throughput and `B` its memory bandwidth (so `1/a` and `1/b` are the
//! achieved compute and bandwidth efficiencies and `c₀` the launch overhead).
//!
//! Attention is the one operator class with almost no measured data here: the shipped copy of
//! Vidur's profiles holds a single shape (A100, `n_embd` 8192, 64 q / 8 kv heads, TP 2,
//! FlashAttention). A three-parameter model per phase is what such data can support; it is
//! fitted by relative-error least squares on whatever attention measurements the training
//! directory has, and falls back to [`AttentionModel::SHIPPED`] (the fit on the shipped data)
//! when it has none. Its accuracy on other shapes and devices is not measured.
//!
//! Depends on the graph's work counts, and on [`crate::activation`]'s Gaussian elimination
//! for its normal equations.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::activation::solve;
use crate::data::AttentionSample;
use crate::graph::{OpCost, attention_cost};
use crate::request::{ForwardPass, Phase};
use crate::spec::{DeviceSpec, Dtype};

/// `(c₀ seconds, a, b)` of one phase.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PhaseCoefficients {
    pub overhead_s: f64,
    pub compute_factor: f64,
    pub memory_factor: f64,
}

impl PhaseCoefficients {
    fn time(&self, cost: &OpCost, device: &DeviceSpec) -> f64 {
        self.overhead_s
            + self.compute_factor * cost.flops / device.dense_fp16_flops
            + self.memory_factor * cost.bytes / device.memory_bandwidth
    }
}

/// Attention time model, one set of coefficients per phase.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AttentionModel {
    pub prefill: PhaseCoefficients,
    pub decode: PhaseCoefficients,
}

impl AttentionModel {
    /// The fit on `legacy/a100/attention.csv` of the shipped profiles (4,418 prefill and
    /// 10,240 decode kernels of one shape; see the test `shipped_constants_are_the_fit`).
    /// Prefill runs at about 28 % of the A100's dense peak after an 18 µs launch; decode
    /// streams the cache at about 77 % of its bandwidth after a 13 µs launch.
    pub const SHIPPED: AttentionModel = AttentionModel {
        prefill: PhaseCoefficients {
            overhead_s: 1.789e-5,
            compute_factor: 3.525,
            memory_factor: 0.0,
        },
        decode: PhaseCoefficients {
            overhead_s: 1.304e-5,
            compute_factor: 0.0,
            memory_factor: 1.301,
        },
    };

    /// The bare roofline of each phase's bound (no launch time, 100 % of peak compute for
    /// prefill, of bandwidth for decode): what an estimator uses when its training data holds
    /// no attention kernel and it must not fall back on [`AttentionModel::SHIPPED`] (which was
    /// fitted on A100 kernels), e.g. when the A100 is the held-out device.
    pub const ROOFLINE: AttentionModel = AttentionModel {
        prefill: PhaseCoefficients {
            overhead_s: 0.0,
            compute_factor: 1.0,
            memory_factor: 0.0,
        },
        decode: PhaseCoefficients {
            overhead_s: 0.0,
            compute_factor: 0.0,
            memory_factor: 1.0,
        },
    };

    /// Seconds of one attention kernel with work `cost`.
    pub fn time(&self, cost: &OpCost, phase: Phase, device: &DeviceSpec) -> f64 {
        match phase {
            Phase::Prefill => self.prefill.time(cost, device),
            Phase::Decode => self.decode.time(cost, device),
        }
    }

    /// Fit on measured kernels; `None` when a phase has too few samples or a sample's device is
    /// unknown.
    pub fn fit(
        samples: &[AttentionSample],
        devices: &BTreeMap<String, DeviceSpec>,
    ) -> Option<Self> {
        let rows = |prefill: bool| -> Option<Vec<[f64; 4]>> {
            samples
                .iter()
                .filter(|s| s.is_prefill == prefill && s.time_ms > 0.0)
                .map(|s| {
                    let device = devices.get(&s.device)?;
                    let (cost, _) = sample_cost(s);
                    Some([
                        1.0,
                        cost.flops / device.dense_fp16_flops,
                        cost.bytes / device.memory_bandwidth,
                        s.time_ms / 1000.0,
                    ])
                })
                .collect()
        };
        Some(AttentionModel {
            prefill: fit_phase(&rows(true)?, PREFILL_TERMS)?,
            decode: fit_phase(&rows(false)?, DECODE_TERMS)?,
        })
    }
}

/// The work of one measured kernel (heads divided over its TP shards).
pub fn sample_cost(s: &AttentionSample) -> (OpCost, Phase) {
    let tp = u64::from(s.tensor_parallel.max(1));
    let pass = if s.is_prefill {
        ForwardPass {
            phase: Phase::Prefill,
            sequences: s.batch_size.max(1),
            query_tokens: s.chunk.max(1),
            context_tokens: s.kv_cache,
        }
    } else {
        ForwardPass::decode(s.batch_size.max(1), s.kv_cache)
    };
    let cost = attention_cost(
        s.q_heads.div_ceil(tp),
        s.kv_heads.div_ceil(tp).max(1),
        s.head_dim,
        Dtype::Fp16,
        &pass,
    );
    (cost, pass.phase)
}

/// Fewest kernels a phase needs before it is fitted.
const MIN_SAMPLES: usize = 8;

/// Terms a phase may use (bit 0: overhead, 1: compute, 2: memory). A prefill kernel is
/// compute-bound; a decode kernel streams the KV cache once per step and is bandwidth-bound.
/// With one measured shape, a phase's FLOPs and bytes are nearly collinear, so a free fit
/// trades one term for the other (a bandwidth term of 10× for prefill, a compute term of 25×
/// for decode): right for that shape, wrong on a GPU with another compute/bandwidth ratio or a
/// model with another head ratio. Each phase therefore keeps only its physical bound, at
/// about one point of in-sample WAPE.
const PREFILL_TERMS: u8 = 0b011;
const DECODE_TERMS: u8 = 0b101;

/// Non-negative relative-error least squares of `t ≈ c·x` over `rows = [1, x₁, x₂, t]`:
/// every subset of the `allowed` terms is solved and the best non-negative solution kept.
fn fit_phase(rows: &[[f64; 4]], allowed: u8) -> Option<PhaseCoefficients> {
    if rows.len() < MIN_SAMPLES {
        return None;
    }
    let mut best: Option<(f64, [f64; 3])> = None;
    for mask in (1u8..8).filter(|m| m & !allowed == 0) {
        let terms: Vec<usize> = (0..3).filter(|i| mask & (1 << i) != 0).collect();
        let k = terms.len();
        // Normal equations of the rows scaled by 1/t.
        let mut a = vec![vec![0.0; k + 1]; k];
        for r in rows {
            let w = 1.0 / r[3];
            for (i, &ti) in terms.iter().enumerate() {
                for (j, &tj) in terms.iter().enumerate() {
                    a[i][j] += r[ti] * w * r[tj] * w;
                }
                a[i][k] += r[ti] * w;
            }
        }
        // The columns are not scaled: only a pivot below 1e-300 is singular.
        let Some(sol) = solve(a, 1e-300) else {
            continue;
        };
        if sol.iter().any(|&c| c < 0.0 || !c.is_finite()) {
            continue;
        }
        let mut coef = [0.0; 3];
        for (i, &t) in terms.iter().enumerate() {
            coef[t] = sol[i];
        }
        let loss: f64 = rows
            .iter()
            .map(|r| ((coef[0] + coef[1] * r[1] + coef[2] * r[2]) / r[3] - 1.0).powi(2))
            .sum();
        if best.is_none_or(|(l, _)| loss < l) {
            best = Some((loss, coef));
        }
    }
    best.map(|(_, c)| PhaseCoefficients {
        overhead_s: c[0],
        compute_factor: c[1],
        memory_factor: c[2],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::ProfileData;

    #[test]
    fn fit_recovers_known_coefficients() {
        let rows: Vec<[f64; 4]> = (1..50)
            .map(|i| {
                let x1 = i as f64 * 1e-5;
                let x2 = ((i * 7) % 13) as f64 * 1e-5;
                [1.0, x1, x2, 2e-5 + 3.0 * x1 + 0.5 * x2]
            })
            .collect();
        let c = fit_phase(&rows, 0b111).unwrap();
        assert!((c.overhead_s - 2e-5).abs() < 1e-9, "{c:?}");
        assert!((c.compute_factor - 3.0).abs() < 1e-6);
        assert!((c.memory_factor - 0.5).abs() < 1e-6);
    }

    #[test]
    fn too_few_samples_do_not_fit() {
        assert!(fit_phase(&[[1.0, 1.0, 1.0, 1.0]; 3], 0b111).is_none());
    }

    #[test]
    fn shipped_constants_are_the_fit() {
        let data = ProfileData::load(&crate::data::default_train_dir()).unwrap();
        let fit = AttentionModel::fit(&data.attention, &data.devices).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() <= 0.02 * b.abs().max(1e-7);
        let s = AttentionModel::SHIPPED;
        for (f, s) in [(fit.prefill, s.prefill), (fit.decode, s.decode)] {
            assert!(close(f.overhead_s, s.overhead_s), "{fit:?}");
            assert!(close(f.compute_factor, s.compute_factor), "{fit:?}");
            assert!(close(f.memory_factor, s.memory_factor), "{fit:?}");
        }
    }

    #[test]
    fn decode_is_bandwidth_bound_on_the_shipped_fit() {
        // 128 sequences × 4,032 cached tokens on an A100: ≈ 1.06 GB of KV at ≈ 77 % of
        // 2,039 GB/s ≈ 0.68 ms (measured: 0.667 ms).
        let a100 = crate::data::parse_device(
            "a100",
            std::path::Path::new("a100.yml"),
            "fp16_tflops: 312\ntotal_memory_gb: 80\n",
        )
        .unwrap();
        let cost = attention_cost(32, 4, 128, Dtype::Fp16, &ForwardPass::decode(128, 4032));
        let t = AttentionModel::SHIPPED.time(&cost, Phase::Decode, &a100);
        assert!((t - 0.667e-3).abs() < 0.1e-3, "{t}");
    }
}
