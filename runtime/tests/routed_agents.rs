//! Routed agent programs in the agent-session simulator (paper 002 §5.2–5.3): every program runs
//! once on the model it is bound to, runs are reproducible to the bit, DISC's admission and
//! divert rule, the static cap, the feedback modes (delayed, batch-synchronous, independent) and
//! what the layer refuses.

use switchyard_predictor::spec::Dtype;
use switchyard_runtime::agentic::{AgentTrace, AgentWorkload, generate, generate_with_steps};
use switchyard_runtime::bench::oracle_programs::{self, ProgramsBenchConfig};
use switchyard_runtime::planner::admission::{SchedulerKind, TaoOptions};
use switchyard_runtime::planner::routing::{DiscConfig, RouterOptions};
use switchyard_runtime::sim::agent_routing::{
    Feedback, Judge, PriorOutcome, ProgramAdmission, ProgramRouting, RoutedArm, RoutedRunReport,
};
use switchyard_runtime::sim::agentic::{
    AgentPoolSpec, AgentReplicaSpec, AgentRunConfig, AgentSimError, run_routed_agents, run_routed_agents_by_model,
};

fn cfg(scheduler: SchedulerKind, workers: usize) -> AgentRunConfig {
    AgentRunConfig { workers, scheduler, tao: TaoOptions::default(), noise_seed: 0, plan_latency_s: 0.002, thunder_acting_decay: false }
}

/// The bench's H100 pair: Qwen3-32B (fp8) and Qwen3-8B (bf16).
fn pair() -> AgentPoolSpec {
    oracle_programs::pool("H100-80GB", (oracle_programs::LARGER, oracle_programs::SMALLER), 0)
}

fn routing(admission: ProgramAdmission, reassign: bool, feedback: Feedback) -> ProgramRouting {
    let arm = |model: &str, success| RoutedArm {
        model: model.into(),
        success,
        prior_peak_tokens: 20_000.0,
        prior_run_s: 200.0,
    };
    ProgramRouting {
        arms: vec![arm("Qwen3-32B", 0.7), arm("Qwen3-8B", 0.44)],
        admission,
        options: RouterOptions { disc: DiscConfig::default(), reassign, ..RouterOptions::default() },
        feedback,
        verifier_s: 120.0,
        judge: None,
        outcome_seed: 7,
        prior: Vec::new(),
    }
}

fn run(trace: &AgentTrace, scheduler: SchedulerKind, workers: usize, r: &ProgramRouting) -> RoutedRunReport {
    run_routed_agents(trace, &pair(), &cfg(scheduler, workers), r).unwrap().1
}

#[test]
fn every_program_runs_once_on_its_model_and_runs_are_reproducible() {
    let trace = generate(AgentWorkload::SweLite, 24, 3);
    for (scheduler, admission, reassign) in [
        (SchedulerKind::CacheAware, ProgramAdmission::Immediate, false),
        (SchedulerKind::RoundRobin, ProgramAdmission::Immediate, false),
        (SchedulerKind::ThunderAgent, ProgramAdmission::Immediate, false),
        (SchedulerKind::ThunderAgent, ProgramAdmission::StaticCap(vec![3, 3]), false),
        (SchedulerKind::ThunderAgent, ProgramAdmission::Disc, false),
        (SchedulerKind::ThunderAgent, ProgramAdmission::Disc, true),
    ] {
        let r = routing(admission.clone(), reassign, Feedback::Delayed);
        let (a, ra) = run_routed_agents(&trace, &pair(), &cfg(scheduler, 12), &r).unwrap();
        let label = format!("{} {admission:?} reassign {reassign}", scheduler.name());
        // Every turn of every session ran exactly once (the sim's own count), every program
        // finished and is counted on exactly one model.
        assert_eq!(a.requests as usize, trace.turns(), "{label}");
        assert_eq!(ra.programs, 24, "{label}");
        assert_eq!(ra.arms.iter().map(|x| x.programs).sum::<u64>(), 24, "{label}");
        assert_eq!(ra.arms.iter().map(|x| x.resolved).sum::<u64>(), ra.resolved, "{label}");
        assert!(ra.programs_per_hour > 0.0 && ra.mean_call_latency_s > 0.0, "{label}: {ra:?}");
        // Same inputs, same bits.
        let (b, rb) = run_routed_agents(&trace, &pair(), &cfg(scheduler, 12), &r).unwrap();
        assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap(), "{label}");
        assert_eq!(serde_json::to_string(&ra).unwrap(), serde_json::to_string(&rb).unwrap(), "{label}");
    }
}

/// Programs that depend on their model: each runs its bound model's version — a diverted one its
/// new model's — and every call of that version runs once; versions that are not versions of one
/// set of programs are refused.
#[test]
fn a_program_runs_the_version_of_the_model_it_is_bound_to() {
    let larger = generate(AgentWorkload::SweLite, 24, 3);
    let smaller = generate_with_steps(AgentWorkload::SweLite, 24, 3, 2.0);
    assert!(smaller.turns() > larger.turns() + 24);
    let mut diverted = 0;
    for (scheduler, admission, reassign) in [
        (SchedulerKind::CacheAware, ProgramAdmission::Immediate, false),
        (SchedulerKind::ThunderAgent, ProgramAdmission::Disc, true),
    ] {
        let mut r = routing(admission, reassign, Feedback::Delayed);
        // A prior far above the real peaks keeps programs waiting, so the divert rule moves some
        // (as in the DISC test below).
        r.arms.iter_mut().for_each(|a| a.prior_peak_tokens = 200_000.0);
        let (a, ra) = run_routed_agents_by_model(&[&larger, &smaller], &pair(), &cfg(scheduler, 16), &r).unwrap();
        let versions = [&larger, &smaller];
        let expected: usize =
            ra.rows.iter().enumerate().map(|(i, row)| versions[row.arm].sessions[i].turns.len()).sum();
        assert_eq!(a.requests as usize, expected, "{}", scheduler.name());
        // Every generated token is its bound version's (decode rate × makespan = tokens).
        let generated: u64 = ra
            .rows
            .iter()
            .enumerate()
            .flat_map(|(i, row)| &versions[row.arm].sessions[i].turns)
            .map(|t| u64::from(t.output_tokens + t.reasoning_tokens))
            .sum();
        assert!((a.decode_tps * a.makespan_s / generated as f64 - 1.0).abs() < 1e-9, "{}", scheduler.name());
        assert!(ra.rows.iter().any(|x| x.arm == 1) && ra.rows.iter().any(|x| x.arm == 0));
        diverted += ra.arms.iter().map(|x| x.diverted_in).sum::<u64>();
        // Both versions the same: the run of the one trace, to the bit.
        let (b, rb) = run_routed_agents_by_model(&[&larger, &larger], &pair(), &cfg(scheduler, 16), &r).unwrap();
        let (c, rc) = run_routed_agents(&larger, &pair(), &cfg(scheduler, 16), &r).unwrap();
        assert_eq!(serde_json::to_string(&(b, rb)).unwrap(), serde_json::to_string(&(c, rc)).unwrap());
    }
    assert!(diverted > 0, "no program was diverted: the divert path is untested");
    let r = routing(ProgramAdmission::Immediate, false, Feedback::Delayed);
    let run =
        |traces: &[&AgentTrace]| run_routed_agents_by_model(traces, &pair(), &cfg(SchedulerKind::CacheAware, 4), &r);
    let other = generate(AgentWorkload::SweLite, 24, 4);
    let fewer = generate(AgentWorkload::SweLite, 23, 3);
    for bad in [vec![&larger, &smaller, &larger], vec![&larger, &other], vec![&larger, &fewer]] {
        assert!(matches!(run(&bad), Err(AgentSimError::ProgramsByModel(_))));
    }
}

/// The most programs of `arm` admitted at once (between admission and end).
fn peak_admitted(r: &RoutedRunReport, arm: usize) -> usize {
    let mut edges: Vec<(f64, i32)> = Vec::new();
    for row in r.rows.iter().filter(|x| x.arm == arm) {
        if let (Some(a), Some(f)) = (row.admitted_at, row.finished_at) {
            edges.push((a, 1));
            edges.push((f, -1));
        }
    }
    // Ends before starts at the same instant (a freed place is taken at that instant).
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        peak = peak.max(now);
    }
    peak as usize
}

/// A learner taught outcomes before the run (the bench's calibration passes) binds from its
/// first program on what it learned; a bad prior is refused before the run.
#[test]
fn a_prior_steers_the_first_bindings_and_a_bad_one_is_refused() {
    let trace = generate(AgentWorkload::SweLite, 24, 5);
    let cold = routing(ProgramAdmission::Immediate, false, Feedback::Delayed);
    let cold_run = run(&trace, SchedulerKind::ThunderAgent, 12, &cold);
    // The cold learner spreads the programs bound before any verdict over both models.
    let first_wave = |r: &RoutedRunReport| -> Vec<usize> {
        let mut rows: Vec<_> = r.rows.iter().collect();
        rows.sort_by(|a, b| a.bound_at.total_cmp(&b.bound_at));
        rows.iter().take(12).map(|x| x.arm).collect()
    };
    let first_cold = first_wave(&cold_run);
    assert!(first_cold.contains(&1), "{first_cold:?}");
    // Taught that the smaller model resolves every task and the larger none, every program of
    // the first wave goes to the smaller one.
    let mut taught = cold.clone();
    for _ in 0..20 {
        taught.prior.push(PriorOutcome { arm: 0, success: 0.0, cost: 100.0 });
        taught.prior.push(PriorOutcome { arm: 1, success: 1.0, cost: 100.0 });
    }
    let taught_run = run(&trace, SchedulerKind::ThunderAgent, 12, &taught);
    assert_eq!(first_wave(&taught_run), vec![1; 12]);
    for bad in [
        PriorOutcome { arm: 2, success: 1.0, cost: 0.0 },
        PriorOutcome { arm: 0, success: 1.5, cost: 0.0 },
        PriorOutcome { arm: 0, success: 1.0, cost: f64::NAN },
    ] {
        let mut r = cold.clone();
        r.prior.push(bad);
        assert!(matches!(
            run_routed_agents(&trace, &pair(), &cfg(SchedulerKind::ThunderAgent, 2), &r),
            Err(AgentSimError::Routing(_))
        ), "{bad:?}");
    }
}

#[test]
fn delayed_feedback_reuses_a_slot_as_soon_as_its_program_ends() {
    let trace = generate(AgentWorkload::SweLite, 24, 8);
    let r =
        run(&trace, SchedulerKind::ThunderAgent, 6, &routing(ProgramAdmission::Immediate, false, Feedback::Delayed));
    for slot in 0..6 {
        let mut rows: Vec<_> = r.rows.iter().filter(|x| x.slot == slot).collect();
        rows.sort_by(|a, b| a.bound_at.total_cmp(&b.bound_at));
        assert!(rows.len() >= 2, "slot {slot}: {rows:?}");
        for w in rows.windows(2) {
            // The next program is bound at the instant the previous one finished, not at its
            // verdict (120 s later).
            assert_eq!(Some(w[1].bound_at), w[0].finished_at, "slot {slot}");
        }
    }
    for x in &r.rows {
        if let (Some(v), Some(f)) = (x.verified_at, x.finished_at) {
            assert!((v - f - 120.0).abs() < 1e-9, "{x:?}");
        }
    }
}

#[test]
fn outcomes_are_nested_by_difficulty() {
    // The smaller model never succeeds: every resolved program ran on the larger one; with
    // both certain, every program resolves. (The nesting itself — a task the smaller model
    // resolves, the larger resolves too — is a unit test in `sim::agent_routing`.)
    let trace = generate(AgentWorkload::SweLite, 20, 4);
    let mut r = routing(ProgramAdmission::Immediate, false, Feedback::Delayed);
    r.arms[1].success = 0.0;
    let out = run(&trace, SchedulerKind::CacheAware, 8, &r);
    assert_eq!(out.arms[1].resolved, 0);
    assert_eq!(out.resolved, out.arms[0].resolved);
    assert!(out.arms[0].programs > 0 && out.arms[1].programs > 0, "both models tried: {out:?}");
    r.arms[0].success = 1.0;
    r.arms[1].success = 1.0;
    assert_eq!(run(&trace, SchedulerKind::CacheAware, 8, &r).resolved, 20);
}

#[test]
fn disc_admits_within_its_ledger_and_diverts_only_with_reassignment() {
    // Sixteen concurrent programs against a prior peak of 200k tokens: each ledger (a few
    // hundred thousand tokens of KV on an H100) admits one or two programs at a time until
    // finished programs' real peaks (~15k) pull its estimate down, so programs wait; with
    // reassignment some are diverted to the other model, without it none is.
    let trace = generate(AgentWorkload::SweLite, 24, 5);
    let mut r = routing(ProgramAdmission::Disc, false, Feedback::Delayed);
    for a in &mut r.arms {
        a.prior_peak_tokens = 200_000.0;
    }
    let only = run(&trace, SchedulerKind::ThunderAgent, 16, &r);
    assert!(only.mean_admission_wait_s > 0.0, "{only:?}");
    assert_eq!(only.arms.iter().map(|a| a.diverted_in).sum::<u64>(), 0);
    // The count admitted while programs waited is a time average within what was admitted.
    for (m, a) in only.arms.iter().enumerate() {
        assert!(a.admitted_while_waiting > 0.0 && a.admitted_while_waiting <= peak_admitted(&only, m) as f64, "{a:?}");
    }
    // With the ledger's real prior and two programs nothing waits: the average is 0.
    let mut calm = routing(ProgramAdmission::Disc, false, Feedback::Delayed);
    calm.arms.iter_mut().for_each(|a| a.prior_peak_tokens = 20_000.0);
    let calm = run(&trace, SchedulerKind::ThunderAgent, 2, &calm);
    assert_eq!(calm.mean_admission_wait_s, 0.0);
    assert!(calm.arms.iter().all(|a| a.admitted_while_waiting == 0.0), "{calm:?}");
    r.options.reassign = true;
    let full = run(&trace, SchedulerKind::ThunderAgent, 16, &r);
    assert!(full.arms.iter().map(|a| a.diverted_in).sum::<u64>() > 0, "{full:?}");
    assert!(full.mean_admission_wait_s < only.mean_admission_wait_s, "{full:?} vs {only:?}");
}

#[test]
fn static_cap_queues_programs_beyond_it() {
    let trace = generate(AgentWorkload::SweLite, 24, 6);
    let capped = run(
        &trace,
        SchedulerKind::ThunderAgent,
        16,
        &routing(ProgramAdmission::StaticCap(vec![2, 2]), false, Feedback::Delayed),
    );
    assert!(capped.mean_admission_wait_s > 0.0);
    assert!(capped.mean_start_wait_s >= capped.mean_admission_wait_s);
    assert_eq!(peak_admitted(&capped, 0), 2, "{:?}", capped.rows);
    assert_eq!(peak_admitted(&capped, 1), 2, "{:?}", capped.rows);
    let free =
        run(&trace, SchedulerKind::ThunderAgent, 16, &routing(ProgramAdmission::Immediate, false, Feedback::Delayed));
    assert_eq!(free.mean_admission_wait_s, 0.0);
    assert!(peak_admitted(&free, 0).max(peak_admitted(&free, 1)) > 2);
    assert!(capped.makespan_s > free.makespan_s, "{} vs {}", capped.makespan_s, free.makespan_s);
}

#[test]
fn batch_synchronous_dispatch_waits_for_the_batch_verdicts() {
    // With a long verifier, a batch-synchronous run pays it once per batch; delayed feedback
    // overlaps it with the next programs.
    let trace = generate(AgentWorkload::SweLite, 24, 7);
    let mut r = routing(ProgramAdmission::Immediate, false, Feedback::Delayed);
    r.verifier_s = 600.0;
    let delayed = run(&trace, SchedulerKind::ThunderAgent, 8, &r);
    r.feedback = Feedback::BatchSynchronous;
    let batch = run(&trace, SchedulerKind::ThunderAgent, 8, &r);
    // Three batches of eight: at least two verifier waits between them.
    assert!(
        batch.makespan_s > delayed.makespan_s + 2.0 * 600.0 - 1.0,
        "{} vs {}",
        batch.makespan_s,
        delayed.makespan_s
    );
    assert_eq!(batch.programs, 24);
    // Batch k + 1 is bound at the instant batch k's last verdict lands.
    for k in 0..2u64 {
        let last_verdict = batch.rows.iter().filter(|x| x.batch == k).filter_map(|x| x.verified_at).fold(0.0, f64::max);
        let bound: Vec<f64> = batch.rows.iter().filter(|x| x.batch == k + 1).map(|x| x.bound_at).collect();
        assert_eq!(bound.len(), 8, "batch {}", k + 1);
        assert!(bound.iter().all(|&b| b == last_verdict), "batch {}: {bound:?} vs {last_verdict}", k + 1);
    }
    r.feedback = Feedback::Independent;
    let indep = run(&trace, SchedulerKind::ThunderAgent, 8, &r);
    assert_eq!(indep.programs, 24);
    // One learner per slot: each program is bound (and verified) by its slot's learner.
    assert!(indep.rows.iter().all(|x| x.learner == x.slot), "{:?}", indep.rows);
    assert!(delayed.rows.iter().all(|x| x.learner == 0));
}

#[test]
fn refusals_are_typed() {
    let trace = generate(AgentWorkload::SweLite, 4, 1);
    let indep_disc = routing(ProgramAdmission::Disc, true, Feedback::Independent);
    assert!(matches!(
        run_routed_agents(&trace, &pair(), &cfg(SchedulerKind::ThunderAgent, 2), &indep_disc),
        Err(AgentSimError::Routing(_))
    ));
    let ok = routing(ProgramAdmission::Immediate, false, Feedback::Delayed);
    assert!(matches!(
        run_routed_agents(&trace, &pair(), &cfg(SchedulerKind::Tao, 2), &ok),
        Err(AgentSimError::RoutedTao)
    ));
    let mut pool = pair();
    pool.replicas.push(AgentReplicaSpec {
        model: "Qwen3-4B".into(),
        device: "H100-80GB".into(),
        tensor_parallel: 1,
        max_model_len: 40_960,
        dtype: Dtype::Bf16,
        request_state_tokens: 0,
        kv_cache_dtype: None,
    });
    let err = run_routed_agents(&trace, &pool, &cfg(SchedulerKind::CacheAware, 2), &ok).unwrap_err();
    assert!(err.to_string().contains("Qwen3-4B"), "{err}");
    let divert_without_ledger = routing(ProgramAdmission::Immediate, true, Feedback::Delayed);
    assert!(matches!(
        run_routed_agents(&trace, &pair(), &cfg(SchedulerKind::ThunderAgent, 2), &divert_without_ledger),
        Err(AgentSimError::Routing(_))
    ));
    let bad_cap = routing(ProgramAdmission::StaticCap(vec![0, 3]), false, Feedback::Delayed);
    assert!(run_routed_agents(&trace, &pair(), &cfg(SchedulerKind::ThunderAgent, 2), &bad_cap).is_err());
}

#[test]
fn the_bench_runs_its_three_experiments() {
    let cfg = ProgramsBenchConfig {
        programs: 16,
        concurrency: vec![8],
        feedback_concurrency: vec![4],
        calibration_concurrency: 8,
        betas: vec![0.0, 1.0],
        seeds: vec![1],
        verifier_s: 60.0,
        verifier_concurrency: 8,
        judge_prompt_tokens: 4_096,
        judge_output_tokens: 128,
        judge_error: 0.15,
    };
    let r = oracle_programs::run_programs_bench(&cfg, |_| {}).unwrap();
    assert_eq!(r.pools.len(), oracle_programs::POOLS.len());
    // c₀ per model: the thinking programs' 9B version is longer; elsewhere both models run the
    // same programs.
    for p in &r.pools {
        let [larger, smaller] = p.prior_peak_tokens;
        if p.workload == AgentWorkload::SweVerifiedThinking {
            assert!(smaller > 1.5 * larger, "{}: {larger} / {smaller}", p.pool.name);
        } else {
            assert_eq!(larger, smaller, "{}", p.pool.name);
        }
    }
    assert_eq!(r.admission.len(), oracle_programs::POOLS.len() * oracle_programs::SYSTEMS.len());
    assert_eq!(r.admission_calibrated.len(), r.admission.len());
    // The calibrated learner was taught every calibration program on each model, and prefers
    // the larger model from the first binding: stock vLLM (no divert) sends it at least the
    // cold learner's share, and on each pool the bulk of the programs.
    for p in &r.pools {
        assert_eq!(p.prior.len(), 2 * 16, "{}", p.pool.name);
        let share = |cells: &[oracle_programs::ProgramsCell]| {
            cells.iter().find(|c| c.pool == p.pool.name && c.system == "vllm").map(|c| c.larger_share).unwrap()
        };
        assert!(share(&r.admission_calibrated) >= share(&r.admission), "{}", p.pool.name);
        assert!(share(&r.admission_calibrated) > 0.8, "{}: {}", p.pool.name, share(&r.admission_calibrated));
    }
    // The teaching sweep runs on paper 002's own programs only: 0–9 programs, then every tenth.
    for p in &r.pools {
        let ns: Vec<usize> = p.teaching_sweep.iter().map(|s| s.0).collect();
        if p.workload == AgentWorkload::SweVerifiedThinking {
            assert_eq!(ns, vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 14, 16], "{}", p.pool.name);
            assert!(p.teaching_sweep.iter().all(|s| (0.0..=1.0).contains(&s.1)));
        } else {
            assert!(ns.is_empty(), "{}", p.pool.name);
        }
    }
    assert_eq!(r.feedback.len(), 3);
    assert_eq!(r.beta_sweep.len(), 3);
    assert_eq!(r.verifiers.len(), 3);
    assert_eq!(r.verifiers[0].wrong_verdicts, 0.0, "the harness is always right");
    assert!(r.admission.iter().all(|c| c.runs.iter().all(|x| x.programs == 16)));
    // β = 0 never diverts (the rule needs a positive weight on the wait).
    assert_eq!(r.beta_sweep[0].diverted, 0.0);
    let svg = oracle_programs::programs_svg(&r).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("β = 0") && svg.contains("batch-synchronous"), "{svg:.200}");
    let md = r.markdown();
    assert!(md.contains("ORACLE / ThunderAgent program throughput") && md.contains("delayed / batch-synchronous"));
    assert!(md.contains("Why neither learner condition is the paper's ThunderAgent"));
}

#[test]
fn an_llm_judge_is_a_model_call_on_the_pool_and_errs_at_its_rate() {
    let trace = generate(AgentWorkload::SweLite, 24, 9);
    let judge = |model: &str, error| Judge { model: model.into(), prompt_tokens: 4_096, output_tokens: 128, error };
    let mut r = routing(ProgramAdmission::Immediate, false, Feedback::Delayed);
    let (base, harness) = run_routed_agents(&trace, &pair(), &cfg(SchedulerKind::ThunderAgent, 8), &r).unwrap();
    r.judge = Some(judge("Qwen3-8B", 0.0));
    let (a, right) = run_routed_agents(&trace, &pair(), &cfg(SchedulerKind::ThunderAgent, 8), &r).unwrap();
    // The sessions' own requests are the same; the judge's calls are counted as verdicts, and
    // they ran on the engines: they take time there, so the run differs from the harness's.
    assert_eq!(a.requests as usize, trace.turns());
    assert_eq!(right.verifier, "judge:Qwen3-8B");
    assert!(right.verdicts >= 20 && right.wrong_verdicts == 0, "{right:?}");
    assert_ne!(serde_json::to_string(&base).unwrap(), serde_json::to_string(&a).unwrap());
    assert_eq!(harness.verifier, "harness");
    r.judge = Some(judge("Qwen3-8B", 1.0));
    let wrong = run(&trace, SchedulerKind::ThunderAgent, 8, &r);
    assert!(wrong.verdicts > 0 && wrong.wrong_verdicts == wrong.verdicts, "{wrong:?}");
    // An intermediate rate: the share of wrong verdicts is near it (binomial over ~200 draws
    // on a larger trace: within 4 σ).
    let big = generate(AgentWorkload::SweLite, 200, 12);
    r.judge = Some(judge("Qwen3-8B", 0.3));
    let mid = run(&big, SchedulerKind::ThunderAgent, 16, &r);
    let share = mid.wrong_verdicts as f64 / mid.verdicts as f64;
    let sigma = (0.3f64 * 0.7 / mid.verdicts as f64).sqrt();
    assert!((share - 0.3).abs() < 4.0 * sigma, "{share} over {} verdicts", mid.verdicts);
    // Batch-synchronous dispatch waits for the judge's verdicts and finishes every program.
    r.feedback = Feedback::BatchSynchronous;
    let batch = run(&trace, SchedulerKind::ThunderAgent, 8, &r);
    assert_eq!(batch.programs, 24);
    assert!(batch.verdicts >= 16, "{batch:?}");
    // A judge needs a model of the pool.
    r.feedback = Feedback::Delayed;
    r.judge = Some(judge("Qwen3-4B", 0.1));
    assert!(matches!(
        run_routed_agents(&trace, &pair(), &cfg(SchedulerKind::ThunderAgent, 8), &r),
        Err(AgentSimError::Routing(_))
    ));
}

#[test]
fn disc_learns_the_per_request_state_a_hybrid_engine_holds() {
    // Dense engines: the excess over the running tokens is block rounding (less the shared
    // prefix, clamped at 0); hybrid ones hold their state per running request.
    let trace = generate(AgentWorkload::SweLite, 24, 10);
    let r = routing(ProgramAdmission::Disc, false, Feedback::Delayed);
    let dense = run(&trace, SchedulerKind::ThunderAgent, 12, &r);
    assert!(dense.allowance_tokens.iter().all(|&a| (0.0..32.0).contains(&a)), "{:?}", dense.allowance_tokens);
    let hybrid = run_routed_agents(
        &trace,
        &oracle_programs::pool("H100-80GB", (oracle_programs::LARGER, oracle_programs::SMALLER), 4_096),
        &cfg(SchedulerKind::ThunderAgent, 12),
        &r,
    )
    .unwrap()
    .1;
    // The ledger finds most of it: the sessions' shared system prompt is one set of blocks in
    // the engine but counts once per request in the running tokens, which pulls the estimate
    // below the state (the paper's ledger, too, converged below its offline measurement).
    assert!(
        hybrid.allowance_tokens.iter().all(|&a| (2_000.0..4_096.0 + 32.0).contains(&a)),
        "{:?}",
        hybrid.allowance_tokens
    );
    // Without the ledger there is nothing that learns it.
    let free = routing(ProgramAdmission::Immediate, false, Feedback::Delayed);
    assert!(run(&trace, SchedulerKind::ThunderAgent, 12, &free).allowance_tokens.is_empty());
}

/// Paper 002's own pair, hybrid-attention models with their configs' state (Qwen3.6-27B, FP8
/// weights and a BF16 cache: 2,349 tokens of KV per running request; Qwen3.5-9B: 1,572): DISC's ledger learns
/// each model's own allowance from usage, the larger one's well above the smaller one's.
#[test]
fn disc_learns_each_hybrid_models_own_state() {
    let trace = generate(AgentWorkload::SweLite, 24, 10);
    let mut r = routing(ProgramAdmission::Disc, false, Feedback::Delayed);
    r.arms[0].model = oracle_programs::HYBRID_LARGER.into();
    r.arms[1].model = oracle_programs::HYBRID_SMALLER.into();
    let hybrid =
        oracle_programs::pool("H100-80GB", (oracle_programs::HYBRID_LARGER, oracle_programs::HYBRID_SMALLER), 0);
    let report = run_routed_agents(&trace, &hybrid, &cfg(SchedulerKind::ThunderAgent, 12), &r).unwrap().1;
    let a = &report.allowance_tokens;
    assert_eq!(a.len(), 2, "{a:?}");
    // Below the state by at most the shared prefix's share (see the dense counterfactual test
    // above), never above it by more than a block's rounding.
    assert!((1_200.0..2_349.0 + 32.0).contains(&a[0]), "{a:?}");
    assert!((500.0..1_572.0 + 32.0).contains(&a[1]), "{a:?}");
    // A hybrid model refuses a counterfactual state on top of its own.
    let both =
        oracle_programs::pool("H100-80GB", (oracle_programs::HYBRID_LARGER, oracle_programs::HYBRID_SMALLER), 1_000);
    assert!(run_routed_agents(&trace, &both, &cfg(SchedulerKind::ThunderAgent, 12), &r).is_err());
}

/// DISC's 95 % per-call ceiling (paper 002 B.2, "the hard limit"): with a ledger that admits
/// far more programs than the cache holds, calls that would take an engine's KV past the
/// ceiling wait for a call there to end; without the ceiling they go at once and the engine
/// preempts.
#[test]
fn the_per_call_ceiling_holds_calls_an_engine_cannot_take() {
    let trace = generate(AgentWorkload::SweLite, 48, 10);
    let state_pool = oracle_programs::pool("H100-80GB", (oracle_programs::LARGER, oracle_programs::SMALLER), 4_096);
    let with_ceiling = |ceiling: f64| {
        let mut r = routing(ProgramAdmission::Disc, false, Feedback::Delayed);
        r.options.disc = DiscConfig { admit_fraction: 50.0, call_ceiling: ceiling, ..DiscConfig::default() };
        run_routed_agents(&trace, &state_pool, &cfg(SchedulerKind::ThunderAgent, 48), &r).unwrap().1
    };
    let held = with_ceiling(0.95);
    let free = with_ceiling(f64::INFINITY);
    let preemptions = |r: &RoutedRunReport| r.arms.iter().map(|a| a.preemptions).sum::<u64>();
    assert!(held.ceiling_holds > 0, "no call was held: {held:?}");
    assert_eq!(free.ceiling_holds, 0);
    assert!(preemptions(&held) < preemptions(&free), "{} vs {}", preemptions(&held), preemptions(&free));
    assert_eq!(held.programs, 48);
}

/// Paper 002 Fig. 2c's measure: under stock vLLM (no admission control) at high concurrency the
/// larger model's KV cache fills, with few programs it does not; `kv_full_at_s` is set exactly
/// when the peak reached the threshold.
#[test]
fn the_larger_models_cache_fills_without_admission_control_only_under_load() {
    let trace = generate(AgentWorkload::SweVerified, 64, 3);
    let r = routing(ProgramAdmission::Immediate, false, Feedback::Delayed);
    let busy = run(&trace, SchedulerKind::CacheAware, 64, &r);
    let calm = run(&trace, SchedulerKind::CacheAware, 2, &r);
    let larger = |x: &RoutedRunReport| x.arms[0].clone();
    assert!(larger(&busy).kv_usage_peak >= switchyard_runtime::sim::agentic::KV_FULL, "{:?}", larger(&busy));
    assert!(larger(&busy).kv_full_at_s.is_some_and(|t| t > 0.0), "{:?}", larger(&busy));
    assert!(larger(&calm).kv_usage_peak > 0.0 && larger(&calm).kv_usage_peak < switchyard_runtime::sim::agentic::KV_FULL, "{:?}", larger(&calm));
    assert_eq!(larger(&calm).kv_full_at_s, None);
    for x in [&busy, &calm] {
        for a in &x.arms {
            assert_eq!(a.kv_full_at_s.is_some(), a.kv_usage_peak >= switchyard_runtime::sim::agentic::KV_FULL, "{a:?}");
        }
    }
}
