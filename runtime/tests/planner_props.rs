//! Property tests of the planner core's invariants (DESIGN.md) over random pools and random
//! streams of ready units, driven by a minimal fake shell: loads finish after a delay, admitted
//! units after their run time. Checked at every step, for every policy:
//! - a unit is dispatched at most once, only when ready, only to an awake replica of its
//!   deployment;
//! - a replica under lease is never reclaimed; every load precedes its consumers;
//! - claimed memory never exceeds a device's capacity;
//! - every unit whose deployment fits some device completes (nothing is lost).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use switchyard_predictor::{Dtype, spec};
use switchyard_runtime::ids::{ActivationId, DeviceId, ReplicaId, SessionId};
use switchyard_runtime::planner::{
    Command, DeploymentId, DeploymentInfo, DeviceInfo, Estimates, Event, JointOptions, Planner, WorkItem,
    policy_by_name,
};

struct Fixed;
impl Estimates for Fixed {
    fn name(&self) -> &str {
        "fixed"
    }
    fn run_time(&self, _: &DeploymentInfo, _: &DeviceInfo, batch: u32, input: u32, output: u32) -> f64 {
        (input as f64 / 5000.0 + output as f64 / 50.0) * (1.0 + batch as f64 / 32.0)
    }
    fn load_time(&self, d: &DeploymentInfo, _: &DeviceInfo) -> f64 {
        5.0 + d.weight_bytes as f64 / 2e9
    }
}

const MODELS: [&str; 4] = ["Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B"];
const DEVICES: [&str; 3] = ["A100-40GB", "V100-32GB", "L4"];

#[derive(Debug, Clone)]
struct Case {
    devices: Vec<usize>,
    units: Vec<(f64, usize, u32, u32, bool)>, // (ready at, deployment, prompt, output, chain_next)
    policy: usize,
    options: (bool, bool, bool),
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(0..DEVICES.len(), 1..4),
        prop::collection::vec((0.0..60.0f64, 0..MODELS.len(), 10..3000u32, 1..400u32, any::<bool>()), 1..40),
        0..2usize,
        (any::<bool>(), any::<bool>(), any::<bool>()),
    )
        .prop_map(|(devices, units, policy, options)| Case { devices, units, policy, options })
}

fn run(case: &Case) -> Result<(), TestCaseError> {
    let devices: Vec<DeviceInfo> = case
        .devices
        .iter()
        .enumerate()
        .map(|(i, &k)| DeviceInfo { id: DeviceId(i as u32), spec: spec::device(DEVICES[k]).unwrap() })
        .collect();
    let deployments: Vec<DeploymentInfo> = MODELS
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let m = spec::model(name).unwrap();
            DeploymentInfo {
                id: DeploymentId(i as u32),
                model: m.name.clone(),
                dtype: Dtype::Fp16,
                max_model_len: 4096,
                gpu_memory_utilization: 0.9,
                weight_bytes: m.param_bytes(Dtype::Fp16),
                kv_bytes_per_token: m.kv_bytes_per_token(Dtype::Fp16),
                max_num_seqs: 8,
            }
        })
        .collect();
    let fits: Vec<bool> = deployments.iter().map(|d| devices.iter().any(|g| d.fits(g))).collect();
    let (fusion, prefetch, shared) = case.options;
    let name = ["parrot", "joint"][case.policy];
    let policy = policy_by_name(name, JointOptions { fusion, prefetch, shared_lifecycle: shared }, Box::new(Fixed), Default::default())
        .unwrap();
    let mut planner = Planner::new(devices.clone(), deployments.clone(), policy);

    // The fake shell's own truth.
    #[derive(Debug)]
    enum Ev {
        Ready(usize),
        Loaded(ReplicaId),
        Finished(usize, ReplicaId),
    }
    let mut events: Vec<(f64, u64, Ev)> = Vec::new();
    let mut seq = 0u64;
    for (i, u) in case.units.iter().enumerate() {
        seq += 1;
        events.push((u.0, seq, Ev::Ready(i)));
    }
    let mut awake: BTreeMap<ReplicaId, (DeploymentId, DeviceId, u64)> = BTreeMap::new();
    let mut loading: BTreeMap<ReplicaId, (DeploymentId, DeviceId, u64)> = BTreeMap::new();
    let mut leases: BTreeMap<ReplicaId, BTreeSet<usize>> = BTreeMap::new();
    let mut ready: BTreeSet<usize> = BTreeSet::new();
    let mut dispatched: BTreeSet<usize> = BTreeSet::new();
    let mut finished: BTreeSet<usize> = BTreeSet::new();
    let act = |i: usize| ActivationId { session: SessionId(i as u32), index: 0 };
    let mut steps = 0;
    while !events.is_empty() {
        steps += 1;
        prop_assert!(steps < 10_000, "no progress");
        events.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
        let (now, _, ev) = events.pop().unwrap();
        let event = match ev {
            Ev::Ready(i) => {
                ready.insert(i);
                let u = case.units[i];
                Event::UnitReady(WorkItem {
                    activation: act(i),
                    workflow: (i % 3) as u32,
                    deployment: DeploymentId(u.1 as u32),
                    prompt_tokens: u.2,
                    max_output_tokens: u.3,
                    ready_at: now,
                    node: 0,
                    chain_prev: None,
                    chain_next: u.4,
                    envelope: (u.2, u.3),
                    remaining_path_tokens: u.3,
                })
            }
            Ev::Loaded(r) => {
                let v = loading.remove(&r).unwrap();
                awake.insert(r, v);
                Event::ReplicaLoaded { replica: r }
            }
            Ev::Finished(i, r) => {
                leases.get_mut(&r).unwrap().remove(&i);
                finished.insert(i);
                Event::UnitFinished { activation: act(i), replica: r, output_tokens: case.units[i].3 }
            }
        };
        // A chain link without a successor in this synthetic stream: end its "session" so a
        // held grant is released.
        let ended = match &event {
            Event::UnitFinished { activation, .. } => Some(activation.session),
            _ => None,
        };
        let mut cmds = planner.handle(event, now).map_err(|e| TestCaseError::fail(e.to_string()))?;
        if let Some(s) = ended {
            cmds.extend(planner.handle(Event::SessionEnded { session: s }, now).unwrap());
        }
        for c in cmds {
            match c {
                Command::Load { replica, deployment, device } => {
                    let g = &devices[device.0 as usize];
                    let claim = deployments[deployment.0 as usize].claim_bytes(g);
                    let used: u64 = awake
                        .values()
                        .chain(loading.values())
                        .filter(|v| v.1 == device)
                        .map(|v| v.2)
                        .sum();
                    prop_assert!(used + claim <= g.spec.memory_bytes, "memory over capacity on {device}");
                    prop_assert!(deployments[deployment.0 as usize].fits(g));
                    loading.insert(replica, (deployment, device, claim));
                    seq += 1;
                    events.push((now + Fixed.load_time(&deployments[deployment.0 as usize], g), seq, Ev::Loaded(replica)));
                }
                Command::Unload { replica } => {
                    prop_assert!(awake.contains_key(&replica), "unload of a replica that is not awake");
                    prop_assert!(leases.get(&replica).is_none_or(|l| l.is_empty()), "reclaimed a leased replica");
                    awake.remove(&replica);
                }
                Command::Dispatch { activation, replica } => {
                    let i = activation.session.0 as usize;
                    prop_assert!(ready.contains(&i), "dispatched before ready");
                    prop_assert!(dispatched.insert(i), "dispatched twice");
                    let (d, g, _) = *awake.get(&replica).ok_or_else(|| TestCaseError::fail("dispatch to a replica that is not awake"))?;
                    prop_assert_eq!(d.0 as usize, case.units[i].1, "wrong deployment");
                    leases.entry(replica).or_default().insert(i);
                    let u = case.units[i];
                    let run = Fixed.run_time(&deployments[d.0 as usize], &devices[g.0 as usize], 1, u.2, u.3);
                    seq += 1;
                    events.push((now + run, seq, Ev::Finished(i, replica)));
                }
            }
        }
    }
    for (i, u) in case.units.iter().enumerate() {
        if fits[u.1] {
            prop_assert!(finished.contains(&i), "unit {i} (deployment {}) never completed", u.1);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn planner_invariants_hold(c in case()) {
        run(&c)?;
    }
}
