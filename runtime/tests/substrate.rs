//! The serving substrate is the same for every policy (paper 003 §4.1): the baselines load on
//! demand, reclaim, and scale a hot model out to more than one replica by the reactive rule,
//! and the replica cap is one setting that binds every policy.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use switchyard_runtime::exec::{Arrival, PoolSpec, RunConfig, TraceLine};
use switchyard_runtime::planner::{JointOptions, Substrate};
use switchyard_runtime::sim;
use switchyard_runtime::workflow::load_workflow;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn config(policy: &str, sessions: usize, substrate: Substrate) -> RunConfig {
    RunConfig {
        workflows: vec![Arc::new(load_workflow(&repo().join("workflows/qmsum.yaml")).expect("qmsum"))],
        sessions,
        arrival: Arrival::Burst,
        seed: 42,
        noise_seed: 0,
        pool: PoolSpec::load(&repo().join("workflows/pools/paper.yaml")).expect("pool"),
        policy: policy.into(),
        options: JointOptions::default(),
        predictor: "formula".into(),
        tool_workers: 1,
        max_num_seqs: 256,
        substrate,
        session_counts: Vec::new(),
        handoff_s: switchyard_runtime::exec::FRAMEWORK_HANDOFF_S,
    }
}

/// The most replicas of each model that existed at once, from the trace's loads and unloads.
fn peak_replicas(trace: &[TraceLine]) -> BTreeMap<String, usize> {
    let (mut model_of, mut now, mut peak) = (BTreeMap::new(), BTreeMap::<String, usize>::new(), BTreeMap::<String, usize>::new());
    for line in trace {
        match (line.event, line.replica, &line.detail) {
            ("load", Some(r), Some(model)) => {
                model_of.insert(r, model.clone());
                let n = now.entry(model.clone()).or_default();
                *n += 1;
                let p = peak.entry(model.clone()).or_default();
                *p = (*p).max(*n);
            }
            ("unload", Some(r), _) => {
                if let Some(m) = model_of.get(&r) {
                    *now.entry(m.clone()).or_default() -= 1;
                }
            }
            _ => {}
        }
    }
    peak
}

#[test]
fn baselines_scale_a_hot_model_out_to_more_than_one_replica() {
    // 35 QMSum sessions at once: six summary lanes each on Qwen3-4B with ~1–2k-token prompts,
    // more than one replica's KV holds for longer than the 30 s upscale delay.
    for policy in ["parrot", "kairos"] {
        let out = sim::simulate(&config(policy, 35, Substrate::default()), &mut |_, _| {}).expect("runs");
        assert_eq!(out.report.sessions_completed, 35, "{policy}");
        let peak = peak_replicas(&out.trace);
        assert!(peak.get("Qwen3-4B").copied().unwrap_or(0) >= 2, "{policy}: {peak:?}");
    }
}

#[test]
fn the_replica_cap_binds_every_policy() {
    let capped = Substrate { replica_cap: Some(1), ..Substrate::default() };
    for policy in ["parrot", "kairos", "joint"] {
        let out = sim::simulate(&config(policy, 35, capped), &mut |_, _| {}).expect("runs");
        assert_eq!(out.report.sessions_completed, 35, "{policy}");
        let peak = peak_replicas(&out.trace);
        assert!(peak.values().all(|&n| n == 1), "{policy}: {peak:?}");
    }
}
