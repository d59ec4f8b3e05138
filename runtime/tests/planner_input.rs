//! What the simulator's shell tells the planner core about ready units, read back from a
//! recorded run (`SimOptions::record_planner`): the remaining critical path of an MBPP repair
//! loop's units counts the rounds their loop may still run after their own round.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use switchyard_runtime::exec::{PoolSpec, RunConfig};
use switchyard_runtime::planner::Event;
use switchyard_runtime::sim::{self, Flow, SimOptions};
use switchyard_runtime::workflow::load_workflow;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn a_repair_loops_units_count_the_rounds_still_to_come() {
    let mbpp = Arc::new(load_workflow(&repo().join("workflows/mbpp.yaml")).expect("mbpp"));
    let diagnose = mbpp.nodes.iter().position(|n| n.id == "diagnose").expect("a diagnose node") as u32;
    let generate = mbpp.nodes.iter().position(|n| n.id == "generate").expect("a generate node") as u32;
    let max_rounds = mbpp.loops[0].max_rounds;
    let pool = PoolSpec::load(&repo().join("workflows/pools/paper.yaml")).expect("pool");
    let cfg = RunConfig {
        sessions: 40,
        predictor: "formula".into(),
        tool_workers: 1,
        handoff_s: switchyard_runtime::exec::FRAMEWORK_HANDOFF_S,
        ..RunConfig::served(vec![mbpp], pool)
    };
    let opts = SimOptions { keep_trace: false, keep_calls: false, keep_sessions: false, timeline_segments: None, record_planner: true };
    let out = sim::simulate_opts(&cfg, opts, &mut |_| Flow::Continue).expect("the simulation runs");
    // Per session, the further-round tokens of its `diagnose` units in the order they became
    // ready (round 0, 1, 2), and of its `generate` unit.
    let mut rounds: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut before_loop: Vec<u32> = Vec::new();
    for (_, tick) in &out.planner_ticks {
        for e in tick {
            if let Event::UnitReady(w) = e {
                if w.node == diagnose {
                    rounds.entry(w.activation.session.0).or_default().push(w.further_round_tokens);
                } else if w.node == generate {
                    before_loop.push(w.further_round_tokens);
                }
            }
        }
    }
    let per_round = rounds.values().next().and_then(|r| r.first()).copied().expect("some session repairs")
        / (max_rounds - 1);
    assert!(per_round > 0);
    for (session, r) in &rounds {
        let expected: Vec<u32> = (0..r.len() as u32).map(|k| (max_rounds - 1 - k) * per_round).collect();
        assert_eq!(r, &expected, "session {session}: round k counts {} − k − 1 rounds still to come", max_rounds);
    }
    assert!(rounds.values().any(|r| r.len() >= 2), "some session reaches a second round: {rounds:?}");
    // Before the loop every round of it is still possible.
    assert!(before_loop.iter().all(|&t| t == (max_rounds - 1) * per_round), "{before_loop:?}");
}
