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
        match self.table.key(*di, *gi, batch, input, output) {
            Some(k) => self.table.run_time(k),
            // Beyond the largest bucket: no profile covers it, so no device is predicted to fit.
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
