//! ORACLE's routing (paper 002) composed with the planner core, end to end in the simulator:
//! routed sessions are bound once by the core's router and run on the model they were bound to;
//! verdicts teach the learner which model succeeds; routed and fixed workflows share one run
//! and one planner; DISC's ledger holds a program's units out of the queue until it admits it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use switchyard_runtime::exec::{self, Arrival, PoolSpec, RunConfig};
use switchyard_runtime::ids::{ActivationId, SessionId};
use switchyard_runtime::planner::routing::{RouterOptions, RoutingSetup};
use switchyard_runtime::planner::{Event, JointOptions, NearReadyItem, WorkItem};
use switchyard_runtime::sim::{self, Flow, SimOptions, SimOutput};
use switchyard_runtime::workflow::{WorkflowSpec, load_workflow};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn workflow(name: &str) -> Arc<WorkflowSpec> {
    Arc::new(load_workflow(&repo().join("workflows").join(format!("{name}.yaml"))).expect("bundled workflow"))
}

fn config(names: &[&str], sessions: usize, arrival: Arrival, pool: &str) -> RunConfig {
    let workflows = names.iter().map(|n| workflow(n)).collect();
    let pool = PoolSpec::load(&repo().join("workflows/pools").join(format!("{pool}.yaml"))).expect("bundled pool");
    RunConfig {
        sessions,
        arrival,
        seed: 7,
        predictor: "oracle".into(),
        handoff_s: exec::FRAMEWORK_HANDOFF_S,
        ..RunConfig::served(workflows, pool)
    }
}

fn simulate(cfg: &RunConfig) -> SimOutput {
    let opts = SimOptions { keep_trace: true, keep_calls: true, ..SimOptions::default() };
    sim::simulate_opts(cfg, opts, &mut |_| Flow::Continue).expect("the run finishes")
}

/// Each routed session's model, from the trace's `route` lines ("MODEL (verifier)").
fn bindings(out: &SimOutput) -> Vec<(u32, String)> {
    out.trace
        .iter()
        .filter(|l| l.event == "route")
        .filter_map(|l| Some((l.session?, l.detail.as_deref()?.split(' ').next()?.to_string())))
        .collect()
}

#[test]
fn routed_sessions_run_on_their_binding_and_the_learner_finds_the_model_that_succeeds() {
    let cfg = config(&["gsm8k-routed"], 120, Arrival::Poisson(0.5), "paper");
    let out = simulate(&cfg);
    let r = &out.report;
    assert_eq!((r.sessions_completed, r.sessions_failed), (120, 0), "{:?}", r.failures);
    let per_model = &r.routing["gsm8k-routed"];
    let programs: u64 = per_model.values().map(|s| s.programs).sum();
    let verdicts: u64 = per_model.values().map(|s| s.verdicts).sum();
    assert_eq!((programs, verdicts), (120, 120), "every program bound once and verified once: {per_model:?}");
    assert!(
        per_model.values().all(|s| s.right_verifier == s.programs),
        "GSM8K requests classify as GSM8K: {per_model:?}"
    );
    // Every member was tried, and the learner ends on the model with the highest GSM8K
    // accuracy (8B 89.8 % vs 1.7B 75.4 % and 0.6B 59.6 %).
    assert_eq!(per_model.len(), 3, "{per_model:?}");
    let bound = bindings(&out);
    assert_eq!(bound.len(), 120);
    let late_8b = bound[80..].iter().filter(|(_, m)| m == "Qwen3-8B").count();
    let early_8b = bound[..40].iter().filter(|(_, m)| m == "Qwen3-8B").count();
    assert!(late_8b >= 32 && late_8b > early_8b, "8B in the last 40: {late_8b}, in the first 40: {early_8b}");
    // A routed session's calls ran on the model it was bound to.
    for (session, model) in &bound {
        let calls: Vec<_> = out.calls.iter().filter(|c| c.session == *session && c.model.is_some()).collect();
        assert!(!calls.is_empty(), "session {session} made no call");
        assert!(
            calls.iter().all(|c| c.model.as_ref().is_some_and(|(m, _)| m == model)),
            "session {session} bound to {model}"
        );
    }
    // Same seed, same bindings and report.
    let again = simulate(&cfg);
    assert_eq!(bindings(&again), bound);
    assert_eq!(serde_json::to_string(&again.report).unwrap(), serde_json::to_string(r).unwrap());
}

#[test]
fn routed_and_fixed_workflows_share_one_run() {
    let cfg = config(&["gsm8k-routed", "gsm8k"], 6, Arrival::Burst, "paper");
    let out = simulate(&cfg);
    let r = &out.report;
    assert_eq!((r.sessions_completed, r.sessions_failed), (12, 0), "{:?}", r.failures);
    assert_eq!(r.routing.keys().collect::<Vec<_>>(), vec!["gsm8k-routed"], "only the routed workflow is routed");
    assert_eq!(r.routing["gsm8k-routed"].values().map(|s| s.verdicts).sum::<u64>(), 6);
    // The fixed workflow's calls keep their declared models (five solvers and a refiner).
    let fixed: std::collections::BTreeSet<&str> = out
        .calls
        .iter()
        .filter(|c| c.workflow == 1)
        .filter_map(|c| c.model.as_ref().map(|(m, _)| m.as_str()))
        .collect();
    assert_eq!(fixed.len(), 5, "{fixed:?}");
    // A routed model is shared with the fixed workflow's replicas (one deployment identity).
    assert!(r.routing["gsm8k-routed"].keys().all(|m| fixed.contains(m.as_str())));
}

fn unit(session: u32, deployment: switchyard_runtime::planner::DeploymentId) -> WorkItem {
    WorkItem {
        activation: ActivationId { session: SessionId(session), index: 0 },
        workflow: 0,
        deployment,
        prompt_tokens: 100,
        max_output_tokens: 200,
        ready_at: 0.0,
        node: 0,
        chain_prev: None,
        chain_next: false,
        envelope: (100, 200),
        remaining_path_tokens: 200,
        further_round_tokens: 0,
        prior_context: None,
        chain_rest: Vec::new(),
    }
}

/// Session `session`'s second unit, waiting for its first.
fn near_ready(session: u32, deployment: switchyard_runtime::planner::DeploymentId) -> NearReadyItem {
    NearReadyItem {
        activation: ActivationId { session: SessionId(session), index: 1 },
        workflow: 0,
        deployment,
        node: 1,
        waits_for: vec![ActivationId { session: SessionId(session), index: 0 }],
        prompt_bound: 300,
        max_output_tokens: 200,
        prior_context: None,
        chain_prev: None,
        chain_rest: Vec::new(),
    }
}

/// A joint planner for `names` on the small pool whose router has the first workflow's route as
/// its arms, each ledger `capacity` tokens: the planner, the route, the deployment map.
fn routed_planner(
    names: &[&str],
    capacity: u64,
    options: RouterOptions,
) -> (switchyard_runtime::planner::Planner, Vec<switchyard_runtime::planner::DeploymentId>, exec::DeploymentMap) {
    let cfg = config(names, 2, Arrival::Burst, "small");
    let (deployments, of) = exec::deployment_table(&cfg.workflows, cfg.max_num_seqs).unwrap();
    let mut planner =
        exec::build_planner(&cfg.pool, &deployments, "joint", JointOptions::default(), "oracle", Default::default())
            .unwrap();
    let route = exec::routing::route_of(0, &cfg.workflows[0], &of).unwrap().unwrap();
    planner
        .set_routing(RoutingSetup {
            arms: route.clone(),
            capacity_tokens: vec![capacity; route.len()],
            prior_peak_tokens: vec![2_048.0; route.len()],
            prior_run_s: 60.0,
            exemplars: vec![("gsm8k_exact".into(), "How many apples does Tom have?".into())],
            options,
        })
        .unwrap();
    (planner, route, of)
}

#[test]
fn a_program_its_ledger_has_not_admitted_keeps_its_units_out_of_the_queue() {
    // A ledger with room for one program at a time on every member.
    let (mut planner, route, _) =
        routed_planner(&["gsm8k-routed"], 3_000, RouterOptions { reassign: false, ..RouterOptions::default() });
    let only = &route[..1];
    let first = planner.bind_program(SessionId(0), only, "How many pears?", 10, 0.0).unwrap();
    planner.bind_program(SessionId(1), only, "How many plums?", 10, 0.0).unwrap();
    assert_eq!(first.deployment, route[0]);
    assert!(!planner.state().is_gated(SessionId(0)) && planner.state().is_gated(SessionId(1)));
    let events = vec![
        Event::SessionArrived { session: SessionId(0), workflow: 0 },
        Event::SessionArrived { session: SessionId(1), workflow: 0 },
        Event::UnitReady(unit(0, route[0])),
        Event::UnitReady(unit(1, route[0])),
        Event::UnitNearReady(near_ready(0, route[0])),
        Event::UnitNearReady(near_ready(1, route[0])),
    ];
    planner.handle_all(events, 0.0).unwrap();
    // Nothing forecast for a program the ledger holds may stage a model for it (kept, not shown).
    let forecast: Vec<u32> = planner.state().near_ready().map(|n| n.activation.session.0).collect();
    assert_eq!(forecast, vec![0], "only the admitted program's unit is near-ready");
    let waiting = |p: &switchyard_runtime::planner::Planner| -> Vec<u32> {
        let queued = p.state().queue().iter().map(|w| w.activation.session.0);
        let running = p.state().running().keys().map(|a| a.session.0);
        let mut v: Vec<u32> = queued.chain(running).collect();
        v.sort_unstable();
        v
    };
    assert_eq!(waiting(&planner), vec![0], "session 1's unit waits for its admission");
    // Session 0 ends: its reservation goes, the ledger admits session 1, its unit is queued.
    planner.handle_all(vec![Event::SessionEnded { session: SessionId(0) }], 10.0).unwrap();
    assert!(!planner.state().is_gated(SessionId(1)));
    assert_eq!(waiting(&planner), vec![1]);
    // Its forecast was kept while it waited, and shows now.
    let forecast: Vec<u32> = planner.state().near_ready().map(|n| n.activation.session.0).collect();
    assert_eq!(forecast, vec![1], "the admitted program's forecast returns");
    assert_eq!(planner.program_verdict(SessionId(0), 1.0, 0.0, 10.5).unwrap().reward, 1.0);
    assert!(planner.program_verdict(SessionId(0), 1.0, 0.0, 10.5).is_err(), "a verdict lands once");
    // Two more programs wait behind session 1. One fails while it waits (a shell abandons it
    // before its end reaches the core); one ends while it waits (it needed no call of its
    // model). Neither stops the planner, and the ledger then admits nothing in their place.
    planner.bind_program(SessionId(2), only, "How many figs?", 10, 11.0).unwrap();
    planner.bind_program(SessionId(3), only, "How many kiwis?", 10, 11.0).unwrap();
    assert!(planner.state().is_gated(SessionId(2)) && planner.state().is_gated(SessionId(3)));
    planner.program_abandoned(SessionId(2), 12.0).unwrap();
    planner
        .handle_all(
            vec![Event::SessionEnded { session: SessionId(2) }, Event::SessionEnded { session: SessionId(3) }],
            12.0,
        )
        .unwrap();
    assert!(!planner.state().is_gated(SessionId(2)) && !planner.state().is_gated(SessionId(3)));
    assert_eq!(planner.program_verdict(SessionId(3), 0.0, 0.0, 12.5).unwrap().reward, 0.0);
    assert_eq!(waiting(&planner), vec![1], "session 1 keeps its place");
}

#[test]
fn disc_learns_the_per_request_allowance_from_a_routed_models_engine_usage() {
    let (mut planner, route, of) = routed_planner(&["gsm8k-routed", "gsm8k"], 100_000, RouterOptions::default());
    assert_eq!(planner.backend_allowance(route[0]), Some(0.0), "nothing learned before any observation");
    // Three running requests of 1,000 tokens each, each holding 4,150 tokens of state besides.
    assert!(planner.observe_backend_usage(route[0], 3 * (1_000 + 4_150), 3_000, 3, 1));
    assert_eq!(planner.backend_allowance(route[0]), Some(4_150.0));
    assert_eq!(planner.backend_allowance(route[1]), Some(0.0), "each model has its own ledger");
    // A saturated engine (at the 95 % per-call ceiling) teaches nothing; nor does an idle one.
    assert!(!planner.observe_backend_usage(route[0], 96_000, 10_000, 2, 1));
    assert!(!planner.observe_backend_usage(route[0], 0, 0, 0, 1));
    assert_eq!(planner.backend_allowance(route[0]), Some(4_150.0));
    // A deployment outside every route has no ledger.
    let fixed = of[&(1, "qwen3-14b".to_string())];
    assert!(!planner.is_routed(fixed) && planner.is_routed(route[0]));
    assert!(!planner.observe_backend_usage(fixed, 5_000, 1_000, 1, 1));
    assert_eq!(planner.backend_allowance(fixed), None);
}

#[test]
fn the_simulator_feeds_each_routed_models_ledger_its_engines_usage() {
    // Qwen3's dense attention holds no state beyond the tokens: what a ledger learns is at most
    // the last partly filled block of each request (16 tokens), never a spurious allowance.
    let out = simulate(&config(&["gsm8k-routed"], 30, Arrival::Poisson(0.5), "paper"));
    assert_eq!(out.allowances.len(), 3, "one ledger per routed model: {:?}", out.allowances);
    assert!(out.allowances.values().all(|d| (0.0..=16.0).contains(d)), "{:?}", out.allowances);
    assert!(out.allowances.values().any(|d| *d > 0.0), "the engines were observed: {:?}", out.allowances);
}

#[test]
fn bench_oracle_pairs_adaptive_and_single_verifier_feedback_by_session() {
    use switchyard_runtime::bench::oracle::{OracleBenchConfig, run};
    let cfg = OracleBenchConfig { root: repo(), sessions: 12, rate: 0.5, seeds: vec![1] };
    let r = run(&cfg).expect("bench oracle");
    // Adaptive feedback judges every program by its own verifier; the single (exact-answer)
    // verifier judges only GSM8K's.
    assert_eq!(r.adaptive.right_verifier, 1.0);
    assert_eq!(r.single_verifier.right_verifier, 0.5);
    let (lo, hi) = r.accuracy_gain_ci_pp;
    assert!(lo <= r.accuracy_gain_pp && r.accuracy_gain_pp <= hi, "{r:?}");
    let gain = (r.adaptive.accuracy - r.single_verifier.accuracy) * 100.0;
    assert!((gain - r.accuracy_gain_pp).abs() < 1e-9, "the paired mean is the difference of the means");
    assert!(r.markdown().contains("adaptive − single"));
    // The steady-state replay: one task per routed session that every member's single-model run
    // closed, replayed with the paper's eight passes; each member alone is the mean of its runs.
    assert!(r.replay.tasks > 12 && r.replay.tasks <= 24, "{}", r.replay.tasks);
    assert_eq!((r.replay.passes, r.replay.members.len()), (8, 3));
    assert_eq!(r.replay.adaptive.len(), r.replay.single.len());
    assert!(r.markdown().contains("Steady state"));
}

#[test]
fn single_verifier_feedback_never_confirms_mbpp_and_a_cost_weight_favours_cheap_models() {
    use switchyard_runtime::exec::routing::RoutingConfig;
    let mut cfg = config(&["gsm8k-routed", "mbpp-routed"], 40, Arrival::Poisson(0.5), "paper");
    cfg.routing = RoutingConfig { single_verifier: Some("gsm8k_exact".into()), ..RoutingConfig::default() };
    let r = simulate(&cfg).report;
    let successes = |w: &str| r.routing[w].values().map(|s| s.successes).sum::<u64>();
    let verdicts = |w: &str| r.routing[w].values().map(|s| s.verdicts).sum::<u64>();
    assert_eq!(
        (verdicts("mbpp-routed"), successes("mbpp-routed")),
        (40, 0),
        "the exact-answer check cannot confirm code"
    );
    assert!(successes("gsm8k-routed") > 20, "{:?}", r.routing);
    // Priced compute: with a heavy cost weight the learner moves programs to the small model.
    let share_small = |cost_weight: f64| {
        let mut cfg = config(&["gsm8k-routed"], 80, Arrival::Poisson(0.5), "paper");
        cfg.routing = RoutingConfig { cost_weight, cost_scale: 500.0, ..RoutingConfig::default() };
        let r = simulate(&cfg).report;
        let per_model = &r.routing["gsm8k-routed"];
        assert!(per_model.values().all(|s| s.cost > 0.0), "every model's programs cost compute: {per_model:?}");
        per_model.get("Qwen3-0.6B").map_or(0, |s| s.programs) as f64 / 80.0
    };
    let (free, priced) = (share_small(0.0), share_small(2.0));
    assert!(priced > free + 0.2, "0.6B share: {free} at a = 0, {priced} at a = 2");
}

#[test]
fn an_llm_judge_is_a_call_on_the_pool_and_its_verdict_teaches_the_router() {
    let cfg = config(&["gsm8k-judged"], 60, Arrival::Poisson(0.5), "paper");
    let out = simulate(&cfg);
    let r = &out.report;
    assert_eq!((r.sessions_completed, r.sessions_failed), (60, 0), "{:?}", r.failures);
    assert_eq!(r.llm_calls, 120, "one solver call and one judge call per session");
    let per_model = &r.routing["gsm8k-judged"];
    let programs: u64 = per_model.values().map(|s| s.programs).sum();
    let verdicts: u64 = per_model.values().map(|s| s.verdicts).sum();
    assert_eq!((programs, verdicts), (60, 60), "{per_model:?}");
    // The learner is taught the judge's verdicts, not the metric's: the successes are the
    // sessions the judge accepted, and the judge (wrong with probability 0.15) disagrees with
    // the exact answer on some sessions.
    let successes: u64 = per_model.values().map(|s| s.successes).sum();
    let judged: Vec<(u32, f64)> =
        out.programs.iter().map(|p| (p.session, p.verifier_score.expect("a completed judged program"))).collect();
    assert_eq!(judged.len(), 60);
    assert_eq!(successes, judged.iter().filter(|(_, v)| *v >= 1.0).count() as u64, "{per_model:?}");
    let metric = |s: u32| out.sessions[s as usize].score.expect("completed");
    let disagree = judged.iter().filter(|(s, v)| (metric(*s) >= 1.0) != (*v >= 1.0)).count();
    assert!((1..=20).contains(&disagree), "the judge erred on {disagree} of 60 sessions");
    // The judge is not routed: its call runs on Qwen3-8B whatever model its session is bound to,
    // after the solver's.
    let bound = bindings(&out);
    assert!(bound.iter().any(|(_, m)| m != "Qwen3-8B"), "some sessions are bound to a smaller model");
    for (session, _) in &bound {
        let judge: Vec<_> = out.calls.iter().filter(|c| c.session == *session && c.node == 1).collect();
        assert_eq!(judge.len(), 1, "session {session}");
        assert_eq!(judge[0].model.as_ref().map(|(m, _)| m.as_str()), Some("Qwen3-8B"), "session {session}");
        let solve = out.calls.iter().find(|c| c.session == *session && c.node == 0).expect("the solver's call");
        assert!(solve.finished_at <= judge[0].finished_at);
    }
}

/// A routed workflow whose two agent nodes form a same-deployment chain once the session is
/// bound (both declare the same route), written next to the test's temporary directory with
/// the bundled GSM8K dataset.
fn routed_chain_workflow(dir: &Path) -> Arc<WorkflowSpec> {
    let dataset = repo().join("workflows/datasets/gsm8k/test.jsonl");
    let yaml = format!(
        r#####"name: gsm8k-routed-chain
description: A routed solver and a routed checker on the same bound model.
deployments:
  qwen3-1.7b: {{model: Qwen3-1.7B, dtype: fp16, max_context: 16384, max_output_tokens: 8192}}
  qwen3-8b:   {{model: Qwen3-8B,   dtype: fp16, max_context: 16384, max_output_tokens: 8192}}
dataset:
  file: {}
  format: jsonl
  fields:
    question: question
    answer: answer
metric: {{kind: gsm8k_exact, node: check, reference: answer}}
nodes:
  - id: solve
    deployment: {{route: [qwen3-1.7b, qwen3-8b]}}
    responder: gsm8k.solve
    max_output_tokens: 1024
    output_tokens: {{mean: 200, cv: 0.4}}
    prompt: |
      Solve step by step, then give the final answer as "#### <number>".
      Question: {{{{input.question}}}}
  - id: check
    deployment: {{route: [qwen3-1.7b, qwen3-8b]}}
    responder: gsm8k.solve
    after: [solve]
    max_output_tokens: 1024
    output_tokens: {{mean: 120, cv: 0.4}}
    prompt: |
      Check this solution and restate its final answer as "#### <number>".
      Question: {{{{input.question}}}}
      Solution: {{{{solve}}}}
"#####,
        dataset.display()
    );
    let path = dir.join("gsm8k-routed-chain.yaml");
    std::fs::write(&path, yaml).expect("write the workflow");
    Arc::new(load_workflow(&path).expect("the routed chain workflow loads"))
}

#[test]
fn a_bound_routed_chain_is_fused_and_its_successor_forecast_near_ready() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = routed_chain_workflow(dir.path());
    let pool = PoolSpec::load(&repo().join("workflows/pools/paper.yaml")).expect("bundled pool");
    let cfg = RunConfig {
        sessions: 8,
        arrival: Arrival::Burst,
        seed: 7,
        predictor: "oracle".into(),
        handoff_s: exec::FRAMEWORK_HANDOFF_S,
        ..RunConfig::served(vec![spec], pool)
    };
    let opts = SimOptions { keep_trace: true, keep_calls: true, keep_sessions: true, timeline_segments: None, record_planner: true };
    let out = sim::simulate_opts(&cfg, opts, &mut |_| Flow::Continue).expect("the run finishes");
    assert_eq!((out.report.sessions_completed, out.report.sessions_failed), (8, 0), "{:?}", out.report.failures);
    let (mut heads, mut successors, mut forecasts) = (0, 0, 0);
    let mut forecast_on = std::collections::BTreeMap::new();
    let mut ready_on = std::collections::BTreeMap::new();
    for (_, events) in &out.planner_ticks {
        for e in events {
            match e {
                Event::UnitReady(item) if item.node == 0 => {
                    assert!(item.chain_next && item.chain_prev.is_none(), "solve heads the chain: {item:?}");
                    heads += 1;
                }
                Event::UnitReady(item) if item.node == 1 => {
                    let prev = item.chain_prev.expect("check follows solve in the chain");
                    assert_eq!(prev.session, item.activation.session);
                    successors += 1;
                    ready_on.insert(item.activation, item.deployment);
                }
                Event::UnitNearReady(item) if item.node == 1 => {
                    forecasts += 1;
                    forecast_on.insert(item.activation, item.deployment);
                }
                _ => {}
            }
        }
    }
    assert_eq!((heads, successors, forecasts), (8, 8, 8), "every bound session's chain is fused and forecast");
    // Each forecast names the model the session was bound to (the one its unit then ran on).
    assert_eq!(forecast_on, ready_on);
    // The fused successor runs where its head ran (the chain's one grant), on the bound model.
    let dispatched = |node: u32| -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = out
            .trace
            .iter()
            .filter(|l| l.event == "dispatch")
            .filter_map(|l| {
                let s = l.session?;
                let a = l.activation?;
                let call = out.calls.iter().find(|c| c.session == s && c.activation == a)?;
                (call.node == node).then_some((s, l.replica?))
            })
            .collect();
        v.sort();
        v
    };
    let (solve, check) = (dispatched(0), dispatched(1));
    assert_eq!(solve.len(), 8);
    assert_eq!(solve, check, "each session's check ran on its solve's replica");

    // The same workflow as loaded (unbound) has no static deployment for its routed nodes.
    let of =
        |_: u32, name: &str| if name == "qwen3-8b" { Some(switchyard_runtime::planner::DeploymentId(1)) } else { None };
    let loaded = exec::graph_info::workflow_info(&routed_chain_workflow(dir.path()), |n| of(0, n));
    assert!(loaded.iter().all(|n| n.deployment.is_none() && n.chain.is_none()));
    let bound = exec::graph_info::workflow_info(&routed_chain_workflow(dir.path()).bound_to("qwen3-8b"), |n| of(0, n));
    assert_eq!(bound[0].chain.as_deref(), Some(&[0usize, 1][..]), "bound to one model, solve → check is a chain");
}
