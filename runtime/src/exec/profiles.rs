//! The Predictor's profile tables for the planner (paper 003 §3.3), built by the shells: an
//! estimator of the predictor crate (`graph`, `gbdt`, `formula`) is trained on the shipped
//! measurements and materialises C_κ and C_load for the run's deployments on its device kinds;
//! the planner core only looks them up (`planner::profiled::ProfiledEstimates`).
//!
//! Trained estimators and tables are cached per (estimator, deployments, devices) for the life
//! of the process, so a benchmark that runs many simulations trains and materialises once. This
//! cache is the shells' state, never the core's. Depends on the predictor crate and the
//! planner's deployment table (`planner::DeploymentInfo`) only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use switchyard_predictor::arch::Architecture;
use switchyard_predictor::estimators;
use switchyard_predictor::graph::Deployment;
use switchyard_predictor::profile::{Buckets, ProfileTable};
use switchyard_predictor::{DeviceSpec, PredictorError, spec};

use crate::planner::DeploymentInfo;

/// Names accepted by [`profile_table`].
pub const PREDICTORS: &[&str] = &["graph", "gbdt", "formula"];

/// Bucket bounds fine enough for the workloads here (prompts up to 32k tokens, outputs up to
/// 8k, batches up to 256), each dimension rounded *up* at lookup.
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

/// The profile table of `estimator` (trained once per process) for `deployments` on the
/// device kinds among `devices`.
pub fn profile_table(estimator: &str, deployments: &[DeploymentInfo], devices: &[DeviceSpec]) -> Result<Arc<ProfileTable>, PredictorError> {
    let mut kinds: Vec<DeviceSpec> = Vec::new();
    for g in devices {
        if !kinds.iter().any(|k| k.name == g.name) {
            kinds.push(g.clone());
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
    let key: TableKey =
        (estimator.to_string(), deps.iter().map(Deployment::name).collect(), kinds.iter().map(|k| k.name.clone()).collect());
    if let Some(t) = table_cache().lock().ok().and_then(|c| c.get(&key).cloned()) {
        return Ok(t);
    }
    let predictor = trained(estimator)?;
    let t = Arc::new(ProfileTable::build(predictor.as_ref(), &deps, &kinds, scheduling_buckets())?);
    if let Ok(mut c) = table_cache().lock() {
        c.insert(key, Arc::clone(&t));
    }
    Ok(t)
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
