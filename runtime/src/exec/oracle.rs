//! The `oracle` estimates: the emulator's own cost model read back by the planner. For
//! reference only — a planner judged with it is judged against itself. The real Predictor
//! (`switchyard-predictor`) never reads the emulator. Either shell may plan with it (`--predictor
//! oracle`), so it lives in the shared layer; it depends on the emulator's cost and load models
//! and the planner's `Estimates` trait only, never on `sim` or `live`.

use switchyard_emulator::{BatchShape, PrefillChunk, iteration_time, load_time};
use switchyard_predictor::spec;

use crate::planner::{DeploymentInfo, DeviceInfo, Estimates};

/// Emulator ground truth as [`Estimates`].
#[derive(Debug, Default)]
pub struct OracleEstimates;

impl Estimates for OracleEstimates {
    fn name(&self) -> &str {
        "oracle"
    }

    fn run_time(&self, d: &DeploymentInfo, g: &DeviceInfo, batch: u32, input: u32, output: u32) -> f64 {
        let Ok(model) = spec::model(&d.model) else { return f64::INFINITY };
        let others = batch.saturating_sub(1) as usize;
        // Prefill of this request among `batch − 1` decoding neighbours with similar context.
        let prefill = BatchShape {
            prefills: vec![PrefillChunk { tokens: input.max(1), cached_context: 0 }],
            decode_contexts: vec![input; others],
        };
        // Decode steps at the mean context, all `batch` sequences decoding.
        let mid = input + output / 2;
        let decode = BatchShape { prefills: Vec::new(), decode_contexts: vec![mid; batch.max(1) as usize] };
        iteration_time(&g.spec, &model, d.dtype, &prefill)
            + output.saturating_sub(1) as f64 * iteration_time(&g.spec, &model, d.dtype, &decode)
    }

    fn load_time(&self, d: &DeploymentInfo, g: &DeviceInfo) -> f64 {
        match spec::model(&d.model) {
            Ok(model) => load_time(&g.spec, &model, d.dtype),
            Err(_) => f64::INFINITY,
        }
    }
}
