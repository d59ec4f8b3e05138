//! Cached Predictor profiles as the planner's [`Estimates`] (paper 003 §3.3): the tables
//! C_κ, κ = (deployment, device, batch, input, output), and C_load(deployment, device) are
//! materialised ahead of time by one of the predictor crate's estimators (`graph`, `gbdt`,
//! `formula`); on the scheduling path a query is a bucket lookup — a few array reads.
//!
//! Tables are cached per (estimator, deployments, devices) for the life of the process, so a
//! benchmark that runs many simulations trains and materialises once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use switchyard_predictor::arch::Architecture;
use switchyard_predictor::estimators;
use switchyard_predictor::graph::Deployment;
use switchyard_predictor::profile::{Buckets, DeploymentIndex, DeviceIndex, ProfileTable};
use switchyard_predictor::{DeviceSpec, PredictorError, spec};

use super::estimates::Estimates;
use super::{DeploymentInfo, DeviceInfo};

/// Names accepted by [`ProfiledEstimates::build`].
pub const PREDICTORS: &[&str] = &["graph", "gbdt", "formula"];

/// Bucket bounds fine enough for the workloads here (prompts up to 8k tokens, outputs up to
/// 512, batches up to 256), each dimension rounded *up* at lookup.
pub fn scheduling_buckets() -> Buckets {
    Buckets {
        batch: vec![1, 2, 4, 8, 16, 32, 64, 128, 256],
        input: vec![128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768],
        output: vec![16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096, 8192],
    }
}

type TableKey = (String, Vec<String>, Vec<String>);

fn table_cache() -> &'static Mutex<HashMap<TableKey, Arc<ProfileTable>>> {
    static CACHE: OnceLock<Mutex<HashMap<TableKey, Arc<ProfileTable>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Estimates read from a materialised profile table.
pub struct ProfiledEstimates {
    table: Arc<ProfileTable>,
    /// Table index of each planner deployment id and device id.
    deployment_index: Vec<Option<DeploymentIndex>>,
    device_index: Vec<Option<DeviceIndex>>,
}

impl ProfiledEstimates {
    /// Train `estimator` on the shipped measurements (once per process) and materialise the
    /// profiles of `deployments` on the device kinds of `devices`.
    pub fn build(estimator: &str, deployments: &[DeploymentInfo], devices: &[DeviceInfo]) -> Result<Self, PredictorError> {
        let mut kinds: Vec<DeviceSpec> = Vec::new();
        for g in devices {
            if !kinds.iter().any(|k| k.name == g.spec.name) {
                kinds.push(g.spec.clone());
            }
        }
        // One table row per distinct (model, dtype): workflows that deploy the same model share
        // it (rows are looked up by name, so a repeated row would never be read).
        let mut deps: Vec<Deployment> = Vec::new();
        for d in deployments {
            let arch = spec::model(&d.model).map_err(|e| PredictorError::ProfileTable(e.to_string()))?;
            let dep = Deployment::new(Architecture::from(&arch), d.dtype);
            if !deps.iter().any(|x| x.name() == dep.name()) {
                deps.push(dep);
            }
        }
        let key: TableKey = (
            estimator.to_string(),
            deps.iter().map(Deployment::name).collect(),
            kinds.iter().map(|k| k.name.clone()).collect(),
        );
        let cached = table_cache().lock().ok().and_then(|c| c.get(&key).cloned());
        let table = match cached {
            Some(t) => t,
            None => {
                let predictor = trained(estimator)?;
                let t = Arc::new(ProfileTable::build(predictor.as_ref(), &deps, &kinds, scheduling_buckets())?);
                if let Ok(mut c) = table_cache().lock() {
                    c.insert(key, Arc::clone(&t));
                }
                t
            }
        };
        let deployment_index = deployments
            .iter()
            .map(|d| {
                let arch = spec::model(&d.model).ok()?;
                table.deployment(&Deployment::new(Architecture::from(&arch), d.dtype).name())
            })
            .collect();
        let device_index = devices.iter().map(|g| table.device(&g.spec.name)).collect();
        Ok(ProfiledEstimates { table, deployment_index, device_index })
    }
}

/// A trained estimator, trained once per process per name.
fn trained(name: &str) -> Result<Arc<dyn estimators::Predict>, PredictorError> {
    static TRAINED: OnceLock<Mutex<HashMap<String, Arc<dyn estimators::Predict>>>> = OnceLock::new();
    let cache = TRAINED.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(p) = cache.lock().ok().and_then(|c| c.get(name).cloned()) {
        return Ok(p);
    }
    let p: Arc<dyn estimators::Predict> = Arc::from(estimators::estimator(name)?);
    if let Ok(mut c) = cache.lock() {
        c.insert(name.to_string(), Arc::clone(&p));
    }
    Ok(p)
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
