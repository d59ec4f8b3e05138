//! The simulator's agent-session loop (paper 000) end to end: every scheduler completes every
//! session exactly once, the same inputs give the same report to the bit, TAO never admits past
//! a replica's capacity, and `bench tao`'s quick configuration produces its comparisons.

use switchyard_runtime::agentic::{AgentWorkload, generate};
use switchyard_runtime::bench::tao::{self, TaoBenchConfig};
use switchyard_runtime::planner::admission::{SchedulerKind, TaoOptions};
use switchyard_runtime::sim::agentic::{AgentRunConfig, run_agents};

fn cfg(scheduler: SchedulerKind, workers: usize) -> AgentRunConfig {
    AgentRunConfig { workers, scheduler, tao: TaoOptions::default(), noise_seed: 0, plan_latency_s: 0.002, thunder_acting_decay: false }
}

#[test]
fn every_scheduler_completes_every_session_once_and_is_deterministic() {
    let trace = generate(AgentWorkload::SweLite, 24, 3);
    let pool = tao::pool_qwen14b_a100x4();
    for kind in SchedulerKind::ALL {
        let a = run_agents(&trace, &pool, &cfg(kind, 12)).unwrap();
        assert_eq!(a.requests as usize, trace.turns(), "{}: every turn runs once", kind.name());
        assert_eq!(a.sessions, 24);
        assert!(a.mean_latency_s > 0.0 && a.makespan_s > 0.0 && a.decode_tps > 0.0, "{a:?}");
        assert!((0.0..=1.0).contains(&a.cache_hit_rate));
        let b = run_agents(&trace, &pool, &cfg(kind, 12)).unwrap();
        assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap(), "{}", kind.name());
    }
}

#[test]
fn agent_turns_share_their_prefix_in_the_engine() {
    // Cache-affine scheduling keeps a session where its conversation is: most prompt tokens hit.
    let trace = generate(AgentWorkload::SweLite, 16, 5);
    let r = run_agents(&trace, &tao::pool_qwen14b_a100x4(), &cfg(SchedulerKind::Tao, 8)).unwrap();
    assert!(r.cache_hit_rate > 0.85, "hit rate {}", r.cache_hit_rate);
    // Round-robin sends consecutive turns to different replicas: each turn misses what the
    // session's previous turn added.
    let rr = run_agents(&trace, &tao::pool_qwen14b_a100x4(), &cfg(SchedulerKind::RoundRobin, 8)).unwrap();
    assert!(rr.cache_hit_rate < r.cache_hit_rate - 0.05, "rr {} vs tao {}", rr.cache_hit_rate, r.cache_hit_rate);
}

#[test]
fn tao_plans_are_solved_revalidated_and_applied() {
    let trace = generate(AgentWorkload::SweLite, 40, 9);
    let r = run_agents(&trace, &tao::pool_qwen14b_a100x4(), &cfg(SchedulerKind::Tao, 40)).unwrap();
    let p = &r.planner;
    assert!(p.submissions > 0 && p.applications > 0, "{p:?}");
    assert!(p.applications <= p.submissions);
    assert!(p.nonempty_applications <= p.applications);
    assert!((p.plan_age_mean_s - 0.002).abs() < 1e-9, "the modeled solve latency is the plan age: {p:?}");
    // The readiness predictor is scored on every tool call.
    assert!(r.readiness_mae_s.is_some_and(|e| e > 0.0) && r.readiness_within_half_s.is_some_and(|w| w > 0.0));
}

#[test]
fn the_quick_bench_compares_tao_with_every_baseline() {
    let cfg = TaoBenchConfig::quick();
    let mut labels = Vec::new();
    let r = tao::run_tao_bench(&cfg, |l| labels.push(l.to_string())).unwrap();
    assert_eq!(r.settings.len(), 1);
    assert_eq!(r.settings[0].runs.len(), SchedulerKind::ALL.len());
    assert_eq!(labels.len(), SchedulerKind::ALL.len());
    let md = tao::markdown(&r, "switchyard bench tao --quick");
    for name in ["tao", "thunderagent", "dynamo", "vllm-rr", "vllm-ca"] {
        assert!(md.contains(&format!("| {name} |")), "{name} missing from\n{md}");
    }
    let svg = tao::running_svg(&r).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("tao"), "{}", &svg[..200.min(svg.len())]);
}

#[test]
fn a_trace_built_in_code_is_checked_before_it_runs() {
    let mut trace = generate(AgentWorkload::SweLite, 3, 1);
    trace.sessions[1].turns[0].output_tokens = 0;
    let err = run_agents(&trace, &tao::pool_qwen14b_a100x4(), &cfg(SchedulerKind::Tao, 2)).unwrap_err().to_string();
    assert!(err.contains("session 1 (swe-lite-0001): turns[0].output_tokens: must be at least 1"), "{err}");
    let ok = generate(AgentWorkload::SweLite, 3, 1);
    let err = run_agents(&ok, &tao::pool_qwen14b_a100x4(), &cfg(SchedulerKind::Tao, 0)).unwrap_err().to_string();
    assert!(err.contains("at least one worker"), "{err}");
}

#[test]
fn reasoning_is_generated_but_dropped_from_the_conversation() {
    use switchyard_runtime::bench::oracle_programs;
    use switchyard_runtime::sim::agentic::AgentPoolSpec;
    // Paper 002's thinking programs on one replica of its Qwen3.6-27B, and the same sessions
    // with every turn's reasoning removed.
    let thinking = generate(AgentWorkload::SweVerifiedThinking, 12, 5);
    assert!(thinking.sessions.iter().all(|s| s.turns.iter().all(|t| t.reasoning_tokens > 0)));
    assert!(
        generate(AgentWorkload::SweVerified, 12, 5)
            .sessions
            .iter()
            .all(|s| s.turns.iter().all(|t| t.reasoning_tokens == 0))
    );
    let mut plain = thinking.clone();
    for t in plain.sessions.iter_mut().flat_map(|s| s.turns.iter_mut()) {
        t.reasoning_tokens = 0;
    }
    // The conversation does not keep the reasoning: same prompts either way.
    for (a, b) in thinking.sessions.iter().zip(&plain.sessions) {
        assert_eq!(a.final_context(), b.final_context());
        assert!((0..a.turns.len()).all(|k| a.prompt_tokens(k) == b.prompt_tokens(k)));
    }
    let pair = oracle_programs::pool_for(
        "H100-80GB",
        (oracle_programs::HYBRID_LARGER, oracle_programs::HYBRID_SMALLER),
        0,
        AgentWorkload::SweVerifiedThinking,
    );
    let pool = AgentPoolSpec { name: "one".into(), replicas: vec![pair.replicas[0].clone()] };
    let t = run_agents(&thinking, &pool, &cfg(SchedulerKind::Tao, 6)).unwrap();
    let p = run_agents(&plain, &pool, &cfg(SchedulerKind::Tao, 6)).unwrap();
    // The reasoning is decoded: every token of it and of the answers, and longer calls.
    let expected: u64 =
        thinking.sessions.iter().flat_map(|s| &s.turns).map(|t| u64::from(t.reasoning_tokens + t.output_tokens)).sum();
    let generated = (t.decode_tps * t.makespan_s).round() as u64;
    assert!(generated.abs_diff(expected) <= expected / 1000, "generated {generated}, expected {expected}");
    assert!(t.mean_latency_s > p.mean_latency_s * 1.5, "{} vs {}", t.mean_latency_s, p.mean_latency_s);
    // No later prompt finds a block of reasoning in the cache: the hit rate is not above the
    // plain run's (a turn loses at most the block its reasoning began in), and the shared
    // prefix still hits.
    assert!(t.cache_hit_rate <= p.cache_hit_rate + 1e-9, "{} vs {}", t.cache_hit_rate, p.cache_hit_rate);
    assert!(t.cache_hit_rate > 0.8, "{}", t.cache_hit_rate);
}

/// Sessions of one turn call no tool: the readiness predictor scored nothing, and the report
/// says so (`null`), not an error of 0 s and a share of 0.
#[test]
fn with_no_tool_call_readiness_is_not_scored() {
    let text = "{\"id\": \"a\", \"system_tokens\": 100, \"turns\": [{\"new_tokens\": 50, \"output_tokens\": 20}]}\n\
                {\"id\": \"b\", \"system_tokens\": 100, \"turns\": [{\"new_tokens\": 70, \"output_tokens\": 30}]}\n";
    let trace = switchyard_runtime::agentic::parse_trace("t.jsonl", text).unwrap();
    let r = run_agents(&trace, &tao::pool_qwen14b_a100x4(), &cfg(SchedulerKind::Tao, 2)).unwrap();
    assert_eq!(r.requests, 2);
    assert_eq!((r.readiness_mae_s, r.readiness_within_half_s), (None, None));
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["readiness_mae_s"].is_null(), "{json}");
}
