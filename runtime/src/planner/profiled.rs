//! Cached Predictor profiles as the planner's [`Estimates`] (paper 003 §3.3): the tables
//! C_κ, κ = (deployment, device, batch, input, output), and C_load(deployment, device),
//! materialised ahead of time by one of the predictor crate's estimators; on the scheduling
//! path a query is a bucket lookup — a few array reads.
//!
//! Pure: the table is handed in ready (the shells train the estimator and build it, see
//! `exec::profiles`); nothing here reads a file or keeps state beyond the table.
//!
//! Part of the pure core: must not depend on anything outside `planner` but `crate::ids` and the
//! predictor crate (the core's rule, checked by `runtime/tests/module_boundaries.rs`).

use std::sync::Arc;

use switchyard_predictor::arch::Architecture;
use switchyard_predictor::graph::Deployment;
use switchyard_predictor::profile::{DeploymentIndex, DeviceIndex, ProfileTable};
use switchyard_predictor::spec;

use super::estimates::Estimates;
use super::{DeploymentInfo, DeviceInfo};

/// The name of a planner deployment's row in a profile table.
pub fn table_row(d: &DeploymentInfo) -> Option<String> {
    let arch = spec::model(&d.model).ok()?;
    Some(Deployment::new(Architecture::from(&arch), d.dtype).name())
}

/// Estimates read from a materialised profile table.
pub struct ProfiledEstimates {
    table: Arc<ProfileTable>,
    /// Table index of each planner deployment id and device id.
    deployment_index: Vec<Option<DeploymentIndex>>,
    device_index: Vec<Option<DeviceIndex>>,
}

impl ProfiledEstimates {
    /// Look the planner's deployments and devices up in `table` (a pair the table lacks is
    /// estimated as never fitting).
    pub fn new(table: Arc<ProfileTable>, deployments: &[DeploymentInfo], devices: &[DeviceInfo]) -> Self {
        let deployment_index = deployments.iter().map(|d| table.deployment(&table_row(d)?)).collect();
        let device_index = devices.iter().map(|g| table.device(&g.spec.name)).collect();
        ProfiledEstimates { table, deployment_index, device_index }
    }
}

impl Estimates for ProfiledEstimates {
    fn name(&self) -> &str {
        self.table.estimator()
    }

    fn run_time(&self, d: &DeploymentInfo, g: &DeviceInfo, batch: u32, input: u32, output: u32) -> f64 {
        let (Some(Some(di)), Some(Some(gi))) =
            (self.deployment_index.get(d.id.0 as usize), self.device_index.get(g.id.0 as usize))
        else {
            return f64::INFINITY;
        };
        if let Some(k) = self.table.key(*di, *gi, batch, input, output) {
            return self.table.run_time(k);
        }
        // Beyond the largest bucket of a dimension (a front-door call asking for more output
        // than any workflow node, a prompt past 32,768 tokens): the largest bucket's time,
        // scaled by how far the input and the output go past it — decode steps grow with the
        // output tokens, prefill with the prompt — and a batch past the largest taken at it.
        // Infinity here made every completion that summed it infinite, which switched off
        // scale-out for the deployment's other work and priced its models as never needed.
        let largest = self.table.buckets();
        let top = |bounds: &[u32]| bounds.last().copied().unwrap_or(1).max(1);
        let (top_in, top_out) = (top(&largest.input), top(&largest.output));
        match self.table.key(*di, *gi, batch.min(top(&largest.batch)), input.min(top_in), output.min(top_out)) {
            Some(k) => {
                let past = |value: u32, top: u32| (f64::from(value) / f64::from(top)).max(1.0);
                self.table.run_time(k) * past(input, top_in) * past(output, top_out)
            }
            None => f64::INFINITY,
        }
    }

    fn load_time(&self, d: &DeploymentInfo, g: &DeviceInfo) -> f64 {
        match (self.deployment_index.get(d.id.0 as usize), self.device_index.get(g.id.0 as usize)) {
            (Some(Some(di)), Some(Some(gi))) => self.table.load_time(*di, *gi),
            _ => f64::INFINITY,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::DeviceId;
    use crate::planner::DeploymentId;
    use switchyard_predictor::estimators::formula::Formula;
    use switchyard_predictor::profile::Buckets;
    use switchyard_predictor::spec::{self, Dtype};

    #[test]
    fn past_the_largest_bucket_the_estimate_grows_instead_of_becoming_infinite() {
        let m = spec::model("Qwen3-8B").expect("model");
        let d = DeploymentInfo {
            id: DeploymentId(0),
            model: m.name.clone(),
            dtype: Dtype::Bf16,
            max_model_len: 40_960,
            gpu_memory_utilization: 0.9,
            weight_bytes: m.param_bytes(Dtype::Bf16),
            kv_bytes_per_token: m.kv_bytes_per_token(Dtype::Bf16),
            max_num_seqs: 256,
        };
        let g = DeviceInfo { id: DeviceId(0), spec: spec::device("A100-40GB").expect("device") };
        let row = Deployment::new(Architecture::from(&m), Dtype::Bf16);
        let buckets = Buckets { batch: vec![1, 4], input: vec![256, 1024], output: vec![64, 512] };
        let table = ProfileTable::build(&Formula::default(), &[row], std::slice::from_ref(&g.spec), buckets).expect("table");
        let est = ProfiledEstimates::new(Arc::new(table), std::slice::from_ref(&d), std::slice::from_ref(&g));
        let inside = est.run_time(&d, &g, 4, 1024, 512);
        assert!(inside.is_finite() && inside > 0.0);
        // Within the buckets nothing changes: a lookup.
        assert_eq!(est.run_time(&d, &g, 3, 900, 500), inside);
        // Twice the largest output: twice its time; four times the input too: eight times.
        assert_eq!(est.run_time(&d, &g, 4, 1024, 1024), 2.0 * inside);
        assert_eq!(est.run_time(&d, &g, 4, 4096, 1024), 8.0 * inside);
        // A batch past the largest bucket is timed at it.
        assert_eq!(est.run_time(&d, &g, 64, 1024, 512), inside);
        // A deployment the table lacks still never fits.
        let other = DeploymentInfo { id: DeploymentId(1), ..d.clone() };
        assert_eq!(est.run_time(&other, &g, 1, 1, 1), f64::INFINITY);
    }
}
