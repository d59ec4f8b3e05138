//! The `Predict` trait (paper 003, Eq. 1) and its three estimators.
//!
//! `Predict(G_m, r, h_g) → (T_run, M_peak, T_load)`: from a deployment's operator graph, a
//! request and a device's spec sheet, estimate the activation's run time, its peak device
//! memory and the deployment's load time. Every estimator answers the finer question of how
//! long one forward pass takes ([`Predict::pass_time`]); the trait composes a request's run
//! time from its prefill and decode passes.
//!
//! - [`formula::Formula`]: static size-and-bandwidth roofline in the style of LLMFit.
//! - [`gbdt::Gbdt`]: gradient-boosted trees on scalar model / request / device features.
//! - [`graph_device::GraphDevice`]: per-operator time models over the operator graph.
//!
//! Estimators run offline, to fill a [`crate::profile::ProfileTable`]; the scheduling path
//! only reads that table. This module must not depend on the emulator or the runtime.

pub mod attention;
pub mod formula;
pub mod gbdt;
pub mod graph_device;
pub mod lifecycle;

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::data::{DATA_DIR_ENV, ProfileData};
use crate::error::PredictorError;
use crate::graph::{Coverage, OperatorGraph};
use crate::request::{ForwardPass, Request};
use crate::spec::DeviceSpec;

/// The estimate of Eq. 1, with the peak memory broken down so that a caller can tell what is
/// resident (weights) from what one activation adds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Run time of the activation (prefill + all decode steps), seconds.
    pub run_s: f64,
    /// Peak device memory while serving the activation on a replica of the deployment,
    /// bytes: `weights_bytes + kv_bytes + activation_bytes`.
    pub peak_bytes: f64,
    /// Weight bytes of the deployment (resident while the replica is awake).
    pub weights_bytes: f64,
    /// KV cache of every sequence at its final length.
    pub kv_bytes: f64,
    /// Transient activations and workspace at the widest pass.
    pub activation_bytes: f64,
    /// Time to load the deployment onto the device (cold start), seconds.
    pub load_s: f64,
}

/// A run-time, peak-memory and load-time estimator.
pub trait Predict: Send + Sync {
    /// The estimator's name (`formula`, `gbdt`, `graph`).
    fn name(&self) -> &'static str;

    /// Seconds of one forward pass of `graph` on `device`, counting the nodes in `coverage`.
    fn pass_time(
        &self,
        graph: &OperatorGraph,
        pass: &ForwardPass,
        device: &DeviceSpec,
        coverage: Coverage,
    ) -> f64;

    /// Peak memory of serving `request`, broken down as (weights, KV, activations), bytes.
    fn memory(
        &self,
        graph: &OperatorGraph,
        request: &Request,
        device: &DeviceSpec,
    ) -> (f64, f64, f64);

    /// Seconds to load the deployment onto `device` from host memory.
    fn load_time(&self, graph: &OperatorGraph, device: &DeviceSpec) -> f64;

    /// Run time of a whole request: its prefill pass plus its decode passes.
    fn run_time(&self, graph: &OperatorGraph, request: &Request, device: &DeviceSpec) -> f64 {
        let prefill = self.pass_time(graph, &request.prefill(), device, Coverage::Full);
        prefill
            + decode_time(request, |pass| {
                self.pass_time(graph, pass, device, Coverage::Full)
            })
    }

    /// Eq. 1: `(T_run, M_peak, T_load)`.
    fn predict(&self, graph: &OperatorGraph, request: &Request, device: &DeviceSpec) -> Prediction {
        let (weights, kv, act) = self.memory(graph, request, device);
        Prediction {
            run_s: self.run_time(graph, request, device),
            peak_bytes: weights + kv + act,
            weights_bytes: weights,
            kv_bytes: kv,
            activation_bytes: act,
            load_s: self.load_time(graph, device),
        }
    }
}

/// Sum of the decode passes of `request`: pass `k` (1-based) has `input + k - 1` cached
/// tokens. The pass time is smooth in the context length (constant weights traffic plus
/// attention growing linearly), so Simpson's rule over the first, middle and last step
/// gives the sum; short requests are summed exactly.
pub fn decode_time(request: &Request, mut pass_time: impl FnMut(&ForwardPass) -> f64) -> f64 {
    let steps = request.decode_steps();
    let batch = request.batch.max(1);
    let mut at = |k: u32| pass_time(&ForwardPass::decode(batch, request.input_tokens + k - 1));
    if steps <= 3 {
        return (1..=steps).map(&mut at).sum();
    }
    let mid = 1 + (steps - 1) / 2;
    f64::from(steps) * (at(1) + 4.0 * at(mid) + at(steps)) / 6.0
}

/// The names [`estimator`] accepts.
pub const ESTIMATORS: [&str; 3] = ["formula", "gbdt", "graph"];

/// Train the estimator called `name` on `data`.
pub fn train(name: &str, data: &ProfileData) -> Result<Box<dyn Predict>, PredictorError> {
    match name {
        "formula" => Ok(Box::new(formula::Formula::calibrate(data)?)),
        "gbdt" => Ok(Box::new(gbdt::Gbdt::train(data)?)),
        "graph" => Ok(Box::new(graph_device::GraphDevice::train(data)?)),
        other => Err(PredictorError::UnknownEstimator(other.to_string())),
    }
}

fn default_data() -> Result<&'static ProfileData, PredictorError> {
    static DATA: OnceLock<ProfileData> = OnceLock::new();
    if let Some(d) = DATA.get() {
        return Ok(d);
    }
    let loaded = ProfileData::default_source(std::env::var_os(DATA_DIR_ENV).as_deref())?;
    Ok(DATA.get_or_init(|| loaded))
}

/// The estimator called `name` (`formula`, `gbdt` or `graph`), trained on the measurements
/// shipped with the crate ([`ProfileData::shipped`], compiled in), or on the directory named by
/// the environment variable [`DATA_DIR_ENV`] when it is set.
pub fn estimator(name: &str) -> Result<Box<dyn Predict>, PredictorError> {
    if !ESTIMATORS.contains(&name) {
        return Err(PredictorError::UnknownEstimator(name.to_string()));
    }
    train(name, default_data()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_time_is_exact_for_affine_pass_times() {
        let req = Request::new(2, 100, 50);
        let affine = |p: &ForwardPass| 1.0 + 0.01 * f64::from(p.context_tokens);
        let exact: f64 = (1..=49).map(|k| 1.0 + 0.01 * f64::from(100 + k - 1)).sum();
        assert!((decode_time(&req, affine) - exact).abs() < 1e-9);
        assert_eq!(decode_time(&Request::new(1, 10, 1), affine), 0.0);
        assert!((decode_time(&Request::new(1, 10, 3), affine) - (1.10 + 1.11)).abs() < 1e-12);
    }

    #[test]
    fn estimators_train_on_the_built_in_data_without_the_source_tree() {
        // The built-in copy reads no file: its root names no path on disk.
        let data = ProfileData::default_source(None).unwrap();
        assert!(!data.root.exists(), "{}", data.root.display());
        assert!(!data.root.starts_with(env!("CARGO_MANIFEST_DIR")));
        for name in ESTIMATORS {
            let est = train(name, &data).unwrap();
            let arch = crate::arch::Architecture::from(&crate::spec::model("Qwen3-8B").unwrap());
            let graph = OperatorGraph::build(&crate::graph::Deployment::new(arch, crate::spec::Dtype::Bf16));
            let device = crate::spec::device_catalogue().into_iter().next().unwrap();
            let p = est.predict(&graph, &Request::new(1, 512, 64), &device);
            assert!(p.run_s.is_finite() && p.run_s > 0.0, "{name}: {p:?}");
        }
    }

    #[test]
    fn data_dir_override_that_is_missing_names_the_path() {
        let err = ProfileData::default_source(Some(std::ffi::OsStr::new("/nonexistent/vidur")))
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/vidur") && err.contains(DATA_DIR_ENV), "{err}");
        // An empty value is unset.
        assert!(ProfileData::default_source(Some(std::ffi::OsStr::new(""))).is_ok());
    }

    #[test]
    fn unknown_estimator_is_an_error() {
        let err = estimator("oracle")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("oracle") && err.contains("graph"), "{err}");
    }
}
