//! Whole activations as training data: one LLM call (prefill and every decode step, served in a
//! batch of `batch` concurrent sequences) on one device, with its measured run time, peak
//! device memory and the deployment's load time (paper 003 Table 1 scores these, not single
//! operators).
//!
//! The crate does not produce such measurements: a caller that can run the calls (the
//! runtime's `bench predictor`, on the emulator) hands them in as [`ActivationSample`]s, and
//! the estimators fit their whole-activation parts on them
//! ([`crate::estimators::formula::Formula::calibrate_on_activations`],
//! [`crate::estimators::gbdt::ActivationGbdt::train`],
//! [`crate::estimators::graph_device::GraphDevice::with_activation_heads`]). Also here: the
//! small non-negative least-squares solver those fits share, and the Gaussian elimination
//! under it, which the attention model's fit ([`crate::estimators::attention`]) uses too.
//!
//! Pure data and arithmetic: this module must not depend on the emulator or the runtime, and
//! holds no estimator logic of its own.

use serde::{Deserialize, Serialize};

use crate::arch::Architecture;
use crate::graph::{Deployment, OperatorGraph};
use crate::request::{ForwardPass, Request};
use crate::spec::{DeviceSpec, Dtype, ModelArch};

/// One measured whole activation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActivationSample {
    pub model: ModelArch,
    pub dtype: Dtype,
    pub device: DeviceSpec,
    /// The call as the predictor sees it: `batch` concurrent sequences, this call's prompt and
    /// output lengths.
    pub request: Request,
    /// Seconds from submission to the call's last token.
    pub run_s: f64,
    /// Peak device memory while the call ran, bytes.
    pub peak_bytes: f64,
    /// Seconds to load the deployment onto the device (cold start).
    pub load_s: f64,
}

impl ActivationSample {
    /// The operator graph of the sample's deployment (one GPU, no tensor parallelism).
    pub fn graph(&self) -> OperatorGraph {
        OperatorGraph::build(&Deployment::new(
            Architecture::from(&self.model),
            self.dtype,
        ))
    }
}

/// The forward passes a request's run time is made of, with the weight each pass carries:
/// `run_time = Σ weight × pass_time` (the prefill once, the decode steps by the rule of
/// [`crate::estimators::decode_time`]).
pub fn weighted_passes(request: &Request) -> Vec<(f64, ForwardPass)> {
    let mut out = vec![(1.0, request.prefill())];
    let steps = request.decode_steps();
    let batch = request.batch.max(1);
    let at = |k: u32| ForwardPass::decode(batch, request.input_tokens + k - 1);
    if steps <= 3 {
        out.extend((1..=steps).map(|k| (1.0, at(k))));
    } else {
        let mid = 1 + (steps - 1) / 2;
        let s = f64::from(steps) / 6.0;
        out.extend([(s, at(1)), (4.0 * s, at(mid)), (s, at(steps))]);
    }
    out
}

/// Non-negative weighted least squares `y ≈ Σ c_j x_j`, minimizing `Σ w_i (ŷ_i − y_i)²`: every
/// subset of the columns is solved and the best solution with all coefficients ≥ 0 kept (the
/// columns are few, at most 8). Columns that are all zero get coefficient 0. `None` when no
/// subset has a non-negative solution or the rows are empty.
pub fn nonneg_lsq(rows: &[Vec<f64>], y: &[f64], w: &[f64]) -> Option<Vec<f64>> {
    let k = rows.first()?.len();
    if k == 0 || k > 8 || rows.len() != y.len() || rows.len() != w.len() {
        return None;
    }
    // Scale each column to unit weighted RMS so the pivot test is scale-free.
    let scale: Vec<f64> = (0..k)
        .map(|j| {
            let s: f64 = rows.iter().zip(w).map(|(r, wi)| wi * r[j] * r[j]).sum();
            s.sqrt()
        })
        .collect();
    let mut best: Option<(f64, Vec<f64>)> = None;
    for mask in 1u32..(1 << k) {
        let cols: Vec<usize> = (0..k)
            .filter(|j| mask & (1 << j) != 0 && scale[*j] > 0.0)
            .collect();
        if cols.len() != (mask.count_ones() as usize) {
            continue;
        }
        let n = cols.len();
        let mut a = vec![vec![0.0; n + 1]; n];
        for ((r, &yi), &wi) in rows.iter().zip(y).zip(w) {
            for (p, &cp) in cols.iter().enumerate() {
                let xp = r[cp] / scale[cp];
                for (q, &cq) in cols.iter().enumerate() {
                    a[p][q] += wi * xp * r[cq] / scale[cq];
                }
                a[p][n] += wi * xp * yi;
            }
        }
        // Unit columns: a pivot below 1e-9 is singular.
        let Some(sol) = solve(a, 1e-9) else { continue };
        if sol.iter().any(|c| !c.is_finite() || *c < 0.0) {
            continue;
        }
        let mut coef = vec![0.0; k];
        for (p, &c) in cols.iter().enumerate() {
            coef[c] = sol[p] / scale[c];
        }
        let loss: f64 = rows
            .iter()
            .zip(y)
            .zip(w)
            .map(|((r, &yi), &wi)| {
                let p: f64 = r.iter().zip(&coef).map(|(x, c)| x * c).sum();
                wi * (p - yi).powi(2)
            })
            .sum();
        if best.as_ref().is_none_or(|(l, _)| loss < *l) {
            best = Some((loss, coef));
        }
    }
    best.map(|(_, c)| c)
}

/// Gaussian elimination with partial pivoting on an augmented `n × (n+1)` matrix; a pivot of
/// magnitude below `min_pivot` is singular (`None`). The caller picks the threshold for the
/// scale of its columns.
pub(crate) fn solve(mut a: Vec<Vec<f64>>, min_pivot: f64) -> Option<Vec<f64>> {
    let n = a.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < min_pivot {
            return None;
        }
        a.swap(col, pivot);
        let pr = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pr[col];
                for (x, p) in row.iter_mut().zip(&pr).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..n).map(|i| a[i][n] / a[i][i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonneg_lsq_recovers_and_clips() {
        let rows: Vec<Vec<f64>> = (1..40)
            .map(|i| vec![1.0, i as f64, ((i * 7) % 11) as f64])
            .collect();
        let y: Vec<f64> = rows.iter().map(|r| 2.0 + 0.5 * r[1] + 3.0 * r[2]).collect();
        let w = vec![1.0; y.len()];
        let c = nonneg_lsq(&rows, &y, &w).unwrap();
        assert!((c[0] - 2.0).abs() < 1e-6 && (c[1] - 0.5).abs() < 1e-6 && (c[2] - 3.0).abs() < 1e-6, "{c:?}");
        // A negative true coefficient is clipped to 0.
        let y: Vec<f64> = rows.iter().map(|r| 10.0 + r[1] - 0.1 * r[2]).collect();
        let c = nonneg_lsq(&rows, &y, &w).unwrap();
        assert!(c.iter().all(|&x| x >= 0.0) && c[2] == 0.0, "{c:?}");
        // A constant column next to the intercept: the collinear subset is skipped.
        let rows: Vec<Vec<f64>> = (1..10).map(|i| vec![1.0, 1.0, i as f64]).collect();
        let y: Vec<f64> = rows.iter().map(|r| 1.0 + r[2]).collect();
        let c = nonneg_lsq(&rows, &y, &[1.0; 9]).unwrap();
        assert!((c[0] + c[1] - 1.0).abs() < 1e-6 && (c[2] - 1.0).abs() < 1e-6, "{c:?}");
        assert!(nonneg_lsq(&[], &[], &[]).is_none());
    }

    #[test]
    fn weighted_passes_reproduce_run_time() {
        use crate::estimators::{Predict, formula::Formula};
        use crate::graph::Coverage;
        let m = crate::spec::model("Qwen3-0.6B").unwrap();
        let g = OperatorGraph::build(&Deployment::new(Architecture::from(&m), Dtype::Bf16));
        let d = crate::spec::device("L4").unwrap();
        let f = Formula::default();
        for r in [Request::new(1, 10, 1), Request::new(2, 100, 3), Request::new(4, 900, 257)] {
            let sum: f64 = weighted_passes(&r)
                .iter()
                .map(|(w, p)| w * f.pass_time(&g, p, &d, Coverage::Full))
                .sum();
            let run = f.run_time(&g, &r, &d);
            assert!((sum - run).abs() <= 1e-12 * run.max(1.0), "{sum} vs {run}");
        }
    }
}
