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
        workflow_arrivals: Vec::new(),
        handoff_s: switchyard_runtime::exec::FRAMEWORK_HANDOFF_S,
        routing: Default::default(),
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

/// QMSum sessions beside the four-model MBPP workflow on one A100 and two V100s: more models
/// than GPUs, so every policy reclaims.
fn pressure(policy: &str, substrate: Substrate) -> RunConfig {
    let mut cfg = config(policy, 4, substrate);
    cfg.workflows.push(Arc::new(load_workflow(&repo().join("workflows/mbpp.yaml")).expect("mbpp")));
    cfg.session_counts = vec![4, 2];
    cfg.pool = PoolSpec::load(&repo().join("workflows/pools/small.yaml")).expect("pool");
    cfg
}

#[test]
fn a_teardown_holds_its_gpu_until_it_ends_for_every_policy() {
    for policy in ["parrot", "kairos", "joint"] {
        let out = sim::simulate(&pressure(policy, Substrate::default()), &mut |_, _| {}).expect("runs");
        assert_eq!(out.report.sessions_failed, 0, "{policy}");
        assert!(out.report.evictions >= 1, "{policy}: no reclaim under pressure");
        // Each unload's teardown ends 5 s later, and no load starts on that GPU in between.
        let mut teardowns = Vec::new();
        for l in out.trace.iter().filter(|l| l.event == "unload") {
            let end = out.trace.iter().find(|e| e.event == "unloaded" && e.replica == l.replica).map(|e| e.t);
            let end = end.unwrap_or_else(|| panic!("{policy}: replica {:?} never finished its teardown", l.replica));
            assert!((end - l.t - switchyard_emulator::teardown_time()).abs() < 2e-3, "{policy}: {} → {end}", l.t);
            teardowns.push((l.device.expect("unload names its device"), l.t, end));
        }
        for (device, from, to) in teardowns {
            let segments = &out.timelines[device as usize].segments;
            let early = segments.iter().find(|s| s.kind == switchyard_runtime::report::SegmentKind::Loading && s.start > from + 1e-6 && s.start < to - 1e-3);
            assert!(early.is_none(), "{policy}: a load started on GPU {device} during a teardown ({from}–{to}): {early:?}");
        }
    }
}

#[test]
fn reclaim_by_sleep_wakes_sleepers_for_every_policy() {
    let sleeping = Substrate { reclaim: switchyard_runtime::planner::Reclaim::Sleep, ..Substrate::default() };
    let mut wakes = 0;
    for policy in ["parrot", "kairos", "joint"] {
        let unload = sim::simulate(&pressure(policy, Substrate::default()), &mut |_, _| {}).expect("runs");
        let out = sim::simulate(&pressure(policy, sleeping), &mut |_, _| {}).expect("runs");
        assert_eq!(out.report.sessions_failed, 0, "{policy}");
        assert_eq!(out.report.sessions_completed, unload.report.sessions_completed, "{policy}");
        // The baselines sleep every replica they reclaim; joint only where the model has work
        // again in the window (its own rule, tested in the planner), and never with `--no-sleep`.
        if policy != "joint" {
            assert!(out.report.sleeps >= 1, "{policy}: nothing slept under pressure");
        } else {
            let mut never = pressure(policy, sleeping);
            never.options.sleep = false;
            let never = sim::simulate(&never, &mut |_, _| {}).expect("runs");
            assert_eq!((never.report.sleeps, never.report.wakes), (0, 0), "joint --no-sleep slept");
            assert!(never.report.evictions >= 1, "joint --no-sleep reclaims by unloading");
        }
        assert_eq!((unload.report.sleeps, unload.report.wakes), (0, 0), "{policy}: sleep is off by default");
        wakes += out.report.wakes;
        // A model is never loaded cold on a GPU where it sleeps: it is woken there.
        let mut model_of = BTreeMap::new();
        let mut sleepers: BTreeMap<u32, (String, u32)> = BTreeMap::new();
        for l in &out.trace {
            match (l.event, l.replica) {
                ("load", Some(r)) => {
                    let (model, device) = (l.detail.clone().expect("model"), l.device.expect("device"));
                    assert!(
                        !sleepers.values().any(|s| *s == (model.clone(), device)),
                        "{policy}: {model} loaded cold on GPU {device} where it sleeps (t = {})",
                        l.t
                    );
                    model_of.insert(r, (model, device));
                }
                ("sleep", Some(r)) => {
                    sleepers.insert(r, model_of[&r].clone());
                }
                ("wake" | "unload", Some(r)) => {
                    sleepers.remove(&r);
                }
                _ => {}
            }
        }
        assert_eq!(out.trace.iter().filter(|l| l.event == "wake").count() as u64, out.report.wakes, "{policy}");
    }
    assert!(wakes >= 1, "no sleeper was ever woken");
}
