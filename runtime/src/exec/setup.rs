//! Setting a run up, identically in both shells: the deployment table (one identity per model
//! and dtype across workflows), the static node facts of every workflow, the dataset records,
//! and the planner with its policy and predictor.
//!
//! Pure functions over the run's configuration (reading the datasets is the only I/O). Must not
//! depend on `sim` or `live`.

use std::collections::BTreeMap;
use std::sync::Arc;

use switchyard_predictor::{Dtype, spec};

use super::ShellError;
use super::graph_info::NodeFacts;
use super::oracle;
use super::profiles::{PREDICTORS, profile_table};
use crate::planner::profiled::ProfiledEstimates;
use crate::planner::{DeploymentId, DeploymentInfo, DeviceInfo, Estimates, JointOptions, Planner, Substrate, policy_by_name};
use crate::values::Record;
use crate::workflow::WorkflowSpec;

/// Deployment of each (workflow index, deployment name).
pub type DeploymentMap = BTreeMap<(u32, String), DeploymentId>;

/// Build the deployment table: one identity per (model, dtype) across all workflows, served with
/// the largest max context (and GPU memory utilization) any workflow declares, so deployments of
/// one model share replicas. The served `max_model_len` is the engine's limit only: each node is
/// still held to its own deployment's `max_context` ([`super::activation::prepare`]), so a
/// workflow's calls fail or fit the same way whatever else the run declares.
pub fn deployment_table(
    workflows: &[Arc<WorkflowSpec>],
    max_num_seqs: u32,
) -> Result<(Vec<DeploymentInfo>, DeploymentMap), ShellError> {
    let mut by_key: BTreeMap<(String, Dtype), (u32, f64)> = BTreeMap::new();
    for wf in workflows {
        for d in wf.deployments.values() {
            let m = spec::model(&d.model).map_err(|e| ShellError::Deployment {
                workflow: wf.name.clone(),
                deployment: d.name.clone(),
                message: e.to_string(),
            })?;
            let e = by_key.entry((m.name.clone(), d.dtype)).or_insert((0, 0.0));
            e.0 = e.0.max(d.max_context);
            e.1 = e.1.max(d.gpu_memory_utilization);
        }
    }
    let mut table = Vec::new();
    let mut ids = BTreeMap::new();
    for (i, ((model, dtype), (max_len, util))) in by_key.iter().enumerate() {
        let m = spec::model(model).map_err(|e| ShellError::Internal(e.to_string()))?;
        table.push(DeploymentInfo {
            id: DeploymentId(i as u32),
            model: model.clone(),
            dtype: *dtype,
            max_model_len: *max_len,
            gpu_memory_utilization: *util,
            weight_bytes: m.param_bytes(*dtype),
            kv_bytes_per_token: m.kv_bytes_per_token(*dtype),
            max_num_seqs,
        });
        ids.insert((model.clone(), *dtype), DeploymentId(i as u32));
    }
    let mut deployment_of = BTreeMap::new();
    for (w, wf) in workflows.iter().enumerate() {
        for d in wf.deployments.values() {
            let m = spec::model(&d.model).map_err(|e| ShellError::Internal(e.to_string()))?;
            if let Some(id) = ids.get(&(m.name.clone(), d.dtype)) {
                deployment_of.insert((w as u32, d.name.clone()), *id);
            }
        }
    }
    Ok((table, deployment_of))
}

/// The name of each deployment identity, by id, as timelines and tables show it: the model,
/// with the dtype where two identities share a model.
pub fn deployment_names(workflows: &[Arc<WorkflowSpec>], max_num_seqs: u32) -> Result<Vec<String>, ShellError> {
    let (table, _) = deployment_table(workflows, max_num_seqs)?;
    let shared = |m: &str| table.iter().filter(|d| d.model == m).count() > 1;
    Ok(table.iter().map(|d| if shared(&d.model) { format!("{} {:?}", d.model, d.dtype) } else { d.model.clone() }).collect())
}

/// Static per-node facts of every workflow (fused chains, critical paths), and of each routed
/// workflow bound to each member of its route.
pub fn node_infos(workflows: &[Arc<WorkflowSpec>], deployment_of: &DeploymentMap) -> NodeFacts {
    NodeFacts::new(workflows, |w, name| deployment_of.get(&(w, name.to_string())).copied())
}

/// The planner with the named policy and predictor (`oracle`: the emulator's own costs).
pub fn build_planner(
    pool: &super::PoolSpec,
    deployments: &[DeploymentInfo],
    policy: &str,
    options: JointOptions,
    predictor: &str,
    substrate: Substrate,
) -> Result<Planner, ShellError> {
    let devices: Vec<DeviceInfo> = pool
        .devices
        .iter()
        .enumerate()
        .map(|(i, s)| DeviceInfo { id: crate::ids::DeviceId(i as u32), spec: s.clone() })
        .collect();
    let estimates: Box<dyn Estimates> = match predictor {
        "oracle" => Box::new(crate::planner::estimates::Cached::new(oracle::OracleEstimates)),
        name if PREDICTORS.contains(&name) => {
            let table = profile_table(name, deployments, &pool.devices).map_err(|e| ShellError::Predictor(e.to_string()))?;
            Box::new(ProfiledEstimates::new(table, deployments, &devices))
        }
        other => {
            return Err(ShellError::Predictor(format!(
                "unknown predictor `{other}` (known: {}, oracle)",
                PREDICTORS.join(", ")
            )));
        }
    };
    let policy = policy_by_name(policy, options, estimates, substrate)?;
    let mut planner = Planner::new(devices, deployments.to_vec(), policy);
    planner.set_substrate_lifecycle(
        substrate.reclaim,
        pool.node_of.clone(),
        pool.nodes.iter().map(|n| n.host_memory_bytes).collect(),
    );
    Ok(planner)
}

/// Every workflow's dataset records (none may be empty), read once per workflow
/// ([`WorkflowSpec::load_records`]).
pub fn load_records(workflows: &[Arc<WorkflowSpec>]) -> Result<Vec<Arc<Vec<Record>>>, ShellError> {
    let mut records = Vec::new();
    for wf in workflows {
        let r = wf
            .load_records()
            .map_err(|e| ShellError::Workflow { workflow: wf.name.clone(), message: e.to_string() })?;
        if r.is_empty() {
            return Err(ShellError::Workflow {
                workflow: wf.name.clone(),
                message: "the dataset has no records".into(),
            });
        }
        records.push(r);
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::exec::tests::bundled_workflows as workflows;

    #[test]
    fn identical_deployments_share_one_identity() {
        let wfs = workflows();
        let (table, of) = deployment_table(&wfs, 8).unwrap();
        // Every (workflow, deployment name) maps to an identity of the table, and identities are
        // unique per (model, dtype).
        let keys: BTreeSet<(String, Dtype)> = table.iter().map(|d| (d.model.clone(), d.dtype)).collect();
        assert_eq!(keys.len(), table.len());
        for (w, wf) in wfs.iter().enumerate() {
            for name in wf.deployments.keys() {
                let id = of[&(w as u32, name.clone())];
                assert!(table[id.0 as usize].max_model_len >= wf.deployments[name].max_context);
            }
        }
    }
}
