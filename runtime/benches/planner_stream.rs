//! Planner cost over a recorded event stream (the joint-planner issue's p99 figure): a
//! simulation records the planner's input tick by tick, then a fresh planner of the same
//! configuration replays it and each tick (fold the tick's events, plan once) is timed with
//! the wall clock. Because the core is deterministic, the replay makes the same decisions the
//! recorded run made. Reports p50 / p99 / max per tick for every policy, at the main job (180
//! sessions, paper pool, burst) and at 1,000 sessions on 64 GPUs (GSM8K + QMSum, Poisson 0.2
//! per workflow).
//!
//! Run with `cargo bench -p switchyard-runtime --bench planner_stream` (release; a few
//! minutes). Not a test: wall-clock numbers go to stdout, nothing is asserted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use switchyard_runtime::exec::{self, Arrival, PoolSpec, RunConfig};
use switchyard_runtime::planner::JointOptions;
use switchyard_runtime::sim::{self, Flow, SimOptions};
use switchyard_runtime::workflow::load_workflow;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn config(workflows: &[&str], sessions: usize, pool: &str, arrival: Arrival, policy: &str) -> RunConfig {
    RunConfig {
        workflows: workflows
            .iter()
            .map(|w| Arc::new(load_workflow(&repo().join("workflows").join(format!("{w}.yaml"))).expect("bundled workflow")))
            .collect(),
        sessions,
        arrival,
        seed: 42,
        noise_seed: 0,
        pool: PoolSpec::load(&repo().join("workflows/pools").join(format!("{pool}.yaml"))).expect("bundled pool"),
        policy: policy.into(),
        options: JointOptions::default(),
        predictor: "graph".into(),
        tool_workers: 2,
        max_num_seqs: 256,
        substrate: Default::default(),
        session_counts: Vec::new(),
        workflow_arrivals: Vec::new(),
        handoff_s: exec::FRAMEWORK_HANDOFF_S,
        routing: Default::default(),
    }
}

/// Per-tick wall seconds of replaying `cfg`'s recorded planner input, sorted.
fn replay(cfg: &RunConfig) -> (Vec<f64>, usize) {
    let opts = SimOptions { keep_trace: false, keep_calls: false, keep_sessions: false, timeline_segments: None, record_planner: true };
    let out = sim::simulate_opts(cfg, opts, &mut |_| Flow::Continue).expect("the simulation runs");
    let (deployments, _) = exec::deployment_table(&cfg.workflows, cfg.max_num_seqs).expect("deployments");
    let mut planner = exec::build_planner(&cfg.pool, &deployments, &cfg.policy, cfg.options, &cfg.predictor, cfg.substrate)
        .expect("planner");
    let mut times = Vec::with_capacity(out.planner_ticks.len());
    let mut events = 0;
    for (now, tick) in out.planner_ticks {
        events += tick.len();
        let t = Instant::now();
        let cmds = planner.handle_all(tick, now).expect("the replay is consistent");
        times.push(t.elapsed().as_secs_f64());
        std::hint::black_box(cmds);
    }
    times.sort_by(f64::total_cmp);
    (times, events)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn main() {
    let cases: [(&str, &[&str], usize, &str, Arrival); 2] = [
        ("180 sessions, 12 GPUs (main job, burst)", &["gsm8k", "mbpp", "qmsum"], 60, "paper", Arrival::Burst),
        ("1,000 sessions, 64 GPUs (gsm8k+qmsum, poisson:0.2)", &["gsm8k", "qmsum"], 500, "scale-64", Arrival::Poisson(0.2)),
    ];
    println!("| case | policy | ticks | events | p50 ms | p99 ms | max ms | mean ms |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for (label, workflows, sessions, pool, arrival) in cases {
        for policy in ["joint", "parrot", "kairos"] {
            let (t, events) = replay(&config(workflows, sessions, pool, arrival, policy));
            let mean = t.iter().sum::<f64>() / t.len().max(1) as f64;
            println!(
                "| {label} | {policy} | {} | {events} | {:.3} | {:.3} | {:.3} | {:.3} |",
                t.len(),
                1e3 * quantile(&t, 0.5),
                1e3 * quantile(&t, 0.99),
                1e3 * t.last().copied().unwrap_or(0.0),
                1e3 * mean
            );
        }
    }
}
