//! Planner cost: one planning event (a unit finishes; the policy replans the window) at 180
//! and 1,000 concurrent sessions on 12 and 64 GPUs, for the joint policy and the Parrot
//! baseline. Run with `cargo bench -p switchyard-runtime --bench planner`.

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use switchyard_predictor::{Dtype, spec};
use switchyard_runtime::ids::{ActivationId, DeviceId, ReplicaId, SessionId};
use switchyard_runtime::planner::{
    ChainLink, Command, DeploymentId, DeploymentInfo, DeviceInfo, Estimates, Event, JointOptions, NearReadyItem, Planner,
    WorkItem, policy_by_name,
};

/// Cheap analytic estimates: the bench measures the planner, not a predictor.
struct Analytic;
impl Estimates for Analytic {
    fn name(&self) -> &str {
        "analytic"
    }
    fn run_time(&self, d: &DeploymentInfo, g: &DeviceInfo, batch: u32, input: u32, output: u32) -> f64 {
        let flops = 2.0 * d.weight_bytes as f64 / 2.0 * (input as f64 * batch as f64);
        flops / (0.5 * g.spec.dense_fp16_flops) + output as f64 * d.weight_bytes as f64 / g.spec.memory_bandwidth
    }
    fn load_time(&self, d: &DeploymentInfo, _: &DeviceInfo) -> f64 {
        15.0 + d.weight_bytes as f64 / 2e9
    }
}

fn build(policy: &str, sessions: u32, gpus: u32) -> (Planner, ActivationId, ReplicaId) {
    let devices: Vec<DeviceInfo> = (0..gpus)
        .map(|i| {
            let kind = if i % 3 == 0 { "A100-40GB" } else { "V100-32GB" };
            DeviceInfo { id: DeviceId(i), spec: spec::device(kind).unwrap() }
        })
        .collect();
    let models = ["Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B"];
    let deployments: Vec<DeploymentInfo> = models
        .iter()
        .enumerate()
        .map(|(i, name)| DeploymentInfo::of_model(DeploymentId(i as u32), &spec::model(name).unwrap(), Dtype::Fp16, 8192, 256))
        .collect();
    let p = policy_by_name(policy, JointOptions::default(), Box::new(Analytic), Default::default()).unwrap();
    let mut planner = Planner::new(devices, deployments, p);
    // Every session has one ready or running unit and one near-ready successor.
    let mut first = None;
    let mut events = Vec::new();
    for s in 0..sessions {
        let a = ActivationId { session: SessionId(s), index: 0 };
        let d = s % 4; // the 14B deployment stays absent: lifecycle decisions have work to do
        events.push(Event::UnitReady(WorkItem {
            activation: a,
            workflow: s % 3,
            deployment: DeploymentId(d),
            prompt_tokens: 1500,
            max_output_tokens: 512,
            ready_at: 0.0,
            node: 0,
            chain_prev: None,
            chain_next: s % 2 == 0,
            envelope: (1500, 512),
            // Every other session's unit heads a fused chain of two links (Eq. 4's summed time).
            chain_rest: if s % 2 == 0 {
                vec![ChainLink { node: 1, fixed_prompt: 1500, max_output_tokens: 512, reads: vec![0] }]
            } else {
                Vec::new()
            },
            remaining_path_tokens: 800,
            further_round_tokens: 0,
            prior_context: None,
        }));
        events.push(Event::UnitNearReady(NearReadyItem {
            activation: ActivationId { session: SessionId(s), index: 1 },
            workflow: s % 3,
            deployment: DeploymentId((d + 1) % 5),
            node: 1,
            waits_for: vec![a],
            prompt_bound: 2000,
            max_output_tokens: 512,
            prior_context: None,
            chain_prev: None,
            chain_rest: Vec::new(),
        }));
    }
    let cmds = planner.handle_all(events, 0.0).unwrap();
    let loads: Vec<ReplicaId> = cmds
        .iter()
        .filter_map(|c| if let Command::Load { replica, .. } = c { Some(*replica) } else { None })
        .collect();
    let loaded: Vec<Event> = loads.iter().map(|&r| Event::ReplicaLoaded { replica: r }).collect();
    for c in planner.handle_all(loaded, 30.0).unwrap() {
        if let (Command::Dispatch { activation, replica }, None) = (&c, &first) {
            first = Some((*activation, *replica));
        }
    }
    let (a, r) = first.expect("something was dispatched");
    (planner, a, r)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("planning_event");
    for policy in ["joint", "parrot"] {
        for (sessions, gpus) in [(180u32, 12u32), (180, 64), (1000, 12), (1000, 64)] {
            let id = BenchmarkId::new(policy, format!("{sessions}sessions_{gpus}gpus"));
            group.bench_function(id, |b| {
                b.iter_batched(
                    || build(policy, sessions, gpus),
                    |(mut planner, a, r)| {
                        planner
                            .handle(Event::UnitFinished { activation: a, replica: r, output_tokens: 300 }, 40.0)
                            .unwrap()
                    },
                    BatchSize::LargeInput,
                );
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = bench
}
criterion_main!(benches);
