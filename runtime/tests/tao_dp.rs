//! Property tests of TAO's joint selection-and-placement DP (paper 000 §3.5, Algorithm 1) and of
//! its revalidation (Appendix B.2), on small random snapshots:
//! - exactness: the DP's objective equals brute force over every assignment of the quantized
//!   problem, with cache-equivalent grouping and bound pruning each on and off;
//! - feasibility: every plan (DP or best-fit decreasing) admits each session at most once, only
//!   on an eligible replica, within every replica's quantized capacity, and reports the objective
//!   of its own assignments;
//! - BFD is never better than the DP;
//! - determinism: the same snapshot always gives the same plan;
//! - revalidation discards on a changed signature and otherwise applies the longest prefix that
//!   fits the live capacities.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use switchyard_runtime::planner::tao::dp::{BEAM_WIDTH, RESTART_STATES};
use switchyard_runtime::planner::tao::{
    Applied, Candidate, DiscardReason, LiveSession, LiveState, Objective, Plan, Problem, SolveOptions, Solver, Value,
    best_fit_decreasing, revalidate, solve,
};

/// Every combination of the solver's exact switches; the last one is the plain DP of Eq. 7.
/// `restart_states: 2` forces the restart through a (narrow) beam run on almost every instance.
const ALL_OPTIONS: [SolveOptions; 5] = [
    SolveOptions { grouping: true, bound_pruning: true, restart_states: RESTART_STATES, beam_width: BEAM_WIDTH },
    SolveOptions { grouping: true, bound_pruning: true, restart_states: 2, beam_width: 2 },
    SolveOptions { grouping: true, bound_pruning: false, restart_states: RESTART_STATES, beam_width: BEAM_WIDTH },
    SolveOptions { grouping: false, bound_pruning: true, restart_states: 2, beam_width: 1 },
    SolveOptions { grouping: false, bound_pruning: false, restart_states: RESTART_STATES, beam_width: BEAM_WIDTH },
];

/// The best objective over every assignment of the quantized problem (each candidate skipped or
/// placed on one eligible replica).
fn brute_force(p: &Problem) -> Objective {
    let q = p.quantum;
    let caps: Vec<u64> = p.capacities.iter().map(|c| c / q).collect();
    let mut best = Objective::ZERO;
    let mut used = vec![0u64; caps.len()];
    fn go(p: &Problem, caps: &[u64], used: &mut [u64], i: usize, acc: Objective, best: &mut Objective) {
        if i == p.candidates.len() {
            *best = (*best).max(acc);
            return;
        }
        go(p, caps, used, i + 1, acc, best);
        let c = &p.candidates[i];
        let wq = c.weight.div_ceil(p.quantum);
        for &(b, k) in &c.options {
            if used[b] + wq <= caps[b] {
                used[b] += wq;
                go(p, caps, used, i + 1, acc.plus(c.value(k)), best);
                used[b] -= wq;
            }
        }
    }
    go(p, &caps, &mut used, 0, Objective::ZERO, &mut best);
    best
}

/// Assert that `plan` is feasible for `p` and that its objective is its assignments' sum.
fn assert_feasible(p: &Problem, plan: &Plan) {
    let q = p.quantum;
    let by_session: BTreeMap<u64, &Candidate> = p.candidates.iter().map(|c| (c.session, c)).collect();
    let mut used = vec![0u64; p.capacities.len()];
    let mut seen = BTreeSet::new();
    let mut objective = Objective::ZERO;
    for a in &plan.assignments {
        assert!(seen.insert(a.session), "session {} admitted twice", a.session);
        let c = by_session[&a.session];
        let credit = c.options.iter().find(|o| o.0 == a.replica).map(|o| o.1);
        let credit = credit.unwrap_or_else(|| panic!("session {} on ineligible replica {}", a.session, a.replica));
        assert_eq!(a.value, Value { credit, ready: c.ready, tokens: c.tokens });
        assert_eq!((a.weight, a.signature), (c.weight, c.signature));
        used[a.replica] += c.weight.div_ceil(q);
        objective = objective.plus(a.value);
    }
    for (b, (u, c)) in used.iter().zip(&p.capacities).enumerate() {
        assert!(*u <= c / q, "replica {b}: {u} quanta used of {}", c / q);
    }
    assert_eq!(plan.objective, objective);
    // Plan order: value descending, then session ascending.
    for w in plan.assignments.windows(2) {
        assert!((w[1].value, std::cmp::Reverse(w[1].session)) < (w[0].value, std::cmp::Reverse(w[0].session)));
    }
}

/// Small random snapshots: up to 7 candidates, 1–3 replicas, capacities up to 14 tokens and
/// Δ of 1–3 tokens. Credits are often 0 and eligibility often complete, so that replicas are
/// often cache-equivalent (grouping has work) and objectives often tie.
fn problems() -> impl Strategy<Value = Problem> {
    sized_problems(3, 7, 14)
}

/// Random snapshots with up to `max_m` replicas, `max_n` candidates and `max_cap` tokens of
/// capacity per replica (weights up to `max_cap * 2 / 3`).
fn sized_problems(max_m: usize, max_n: usize, max_cap: u64) -> impl Strategy<Value = Problem> {
    (1usize..=max_m, 0usize..=max_n, 1u64..=3, any::<bool>()).prop_flat_map(move |(m, n, quantum, symmetric)| {
        let candidate = (
            0u64..=(max_cap * 2 / 3),
            any::<bool>(),
            0u64..=20,
            proptest::collection::vec((0u8..=9, prop_oneof![4 => Just(0u64), 1 => 1u64..=5]), m),
        );
        (proptest::collection::vec(0u64..=max_cap, m), proptest::collection::vec(candidate, n)).prop_map(
            move |(capacities, cands)| {
                let candidates = cands
                    .into_iter()
                    .enumerate()
                    .map(|(i, (weight, ready, tokens, per_replica))| {
                        let options = per_replica
                            .into_iter()
                            .enumerate()
                            .filter(|(_, (e, _))| symmetric || *e < 8)
                            .map(|(b, (_, k))| (b, if symmetric { 0 } else { k }))
                            .collect();
                        let session = 10 * i as u64 + 3;
                        Candidate { session, signature: session ^ 0xABCD, weight, ready, tokens, options }
                    })
                    .collect();
                Problem { candidates, capacities, quantum, state_budget: 1_000_000 }
            },
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn the_dp_is_exact_and_feasible(p in problems()) {
        let best = brute_force(&p);
        let mut solver = Solver::new();
        for options in ALL_OPTIONS {
            let plan = solver.solve_with(&p, options).unwrap();
            prop_assert!(!plan.fallback);
            assert_feasible(&p, &plan);
            prop_assert_eq!(plan.objective, best, "options {:?}", options);
        }
    }

    /// Beyond brute force's reach: grouping and bound pruning agree with the plain DP (which is
    /// exact by construction) on up to 16 candidates and 4 replicas. The capacities keep the
    /// plain DP's state space (at most 19⁴ states a layer) within its budget.
    #[test]
    fn the_exact_switches_agree_on_larger_snapshots(p in sized_problems(4, 16, 18)) {
        let mut solver = Solver::new();
        let plain = solver.solve_with(&p, ALL_OPTIONS[4]).unwrap();
        prop_assert!(!plain.fallback);
        for options in &ALL_OPTIONS[..4] {
            let plan = solver.solve_with(&p, *options).unwrap();
            prop_assert!(!plan.fallback);
            assert_feasible(&p, &plan);
            prop_assert_eq!(plan.objective, plain.objective, "options {:?}", options);
        }
    }

    #[test]
    fn bfd_is_feasible_and_never_better(p in problems()) {
        let bfd = best_fit_decreasing(&p).unwrap();
        prop_assert!(bfd.fallback);
        assert_feasible(&p, &bfd);
        prop_assert!(bfd.objective <= solve(&p).unwrap().objective);
        // A budget too small for the DP yields that same BFD plan.
        let tight = Problem { state_budget: 0, ..p.clone() };
        let fb = solve(&tight).unwrap();
        if !p.candidates.is_empty() && fb.fallback {
            prop_assert_eq!(fb.assignments, bfd.assignments);
        }
    }

    #[test]
    fn solving_is_deterministic(p in problems()) {
        let a = solve(&p).unwrap();
        let mut solver = Solver::new();
        // A reused solver (warm buffers, a different problem in between) gives the same plan.
        let _ = solver.solve(&Problem { quantum: 1, ..p.clone() }).unwrap();
        let b = solver.solve(&p).unwrap();
        prop_assert_eq!(a, b);
    }

    #[test]
    fn revalidation_applies_a_fitting_prefix(p in problems(), shrink in proptest::collection::vec(0u64..=14, 3)) {
        let plan = solve(&p).unwrap();
        let sessions = p.candidates.iter().map(|c| {
            (c.session, LiveSession { signature: c.signature, eligible: c.options.iter().map(|o| o.0).collect() })
        }).collect();
        let capacities: Vec<u64> = p.capacities.iter().zip(&shrink).map(|(c, s)| c.saturating_sub(*s)).collect();
        let live = LiveState { sessions, capacities: capacities.clone() };
        let out = revalidate(&plan, &live);
        prop_assert!(!out.discarded);
        let k = out.assignments.len();
        prop_assert_eq!(&out.assignments[..], &plan.assignments[..k]);
        prop_assert_eq!(out.partial, k < plan.assignments.len());
        let mut used = vec![0u64; capacities.len()];
        for a in &out.assignments {
            used[a.replica] += a.weight;
        }
        prop_assert!(used.iter().zip(&capacities).all(|(u, c)| u <= c));
        // The prefix is the longest: the next assignment does not fit.
        if let Some(next) = plan.assignments.get(k) {
            prop_assert!(used[next.replica] + next.weight > capacities[next.replica]);
        }
    }
}

/// Snapshots shaped like the bench's (Δ = 2,048; 5k–30k-token contexts; residuals up to 40k
/// tokens; half the sessions with decayed credit on one replica; all replicas eligible), small
/// enough for the plain DP: the default solver must reach the same objective.
fn agentic_problems() -> impl Strategy<Value = Problem> {
    (2usize..=3, 4usize..=24).prop_flat_map(|(m, n)| {
        let candidate = (5_000u64..=30_000, proptest::bool::weighted(0.3), proptest::option::of((0..m, 0u64..=30_000)));
        (proptest::collection::vec(0u64..=40_000, m), proptest::collection::vec(candidate, n)).prop_map(
            move |(capacities, cands)| {
                let candidates = cands
                    .into_iter()
                    .enumerate()
                    .map(|(i, (tokens, ready, cached))| {
                        let options =
                            (0..m).map(|b| (b, cached.filter(|c| c.0 == b).map_or(0, |c| c.1.min(tokens)))).collect();
                        Candidate {
                            session: i as u64,
                            signature: i as u64,
                            weight: tokens - 988,
                            ready,
                            tokens,
                            options,
                        }
                    })
                    .collect();
                Problem { candidates, capacities, quantum: 2048, state_budget: 1 << 20 }
            },
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_default_solver_is_exact_on_agentic_snapshots(p in agentic_problems()) {
        let mut solver = Solver::new();
        let plain = solver.solve_with(&p, ALL_OPTIONS[4]).unwrap();
        prop_assert!(!plain.fallback);
        for options in &ALL_OPTIONS[..2] {
            let plan = solver.solve_with(&p, *options).unwrap();
            prop_assert!(!plan.fallback);
            assert_feasible(&p, &plan);
            prop_assert_eq!(plan.objective, plain.objective, "options {:?}", options);
        }
    }
}

fn snapshot() -> Problem {
    // Two replicas of 10 tokens, Δ = 1. Credits make the plan order 1, 2, 3, 4.
    let c = |session: u64, weight: u64, credit: u64, replica: usize| Candidate {
        session,
        signature: session * 1_000,
        weight,
        ready: session.is_multiple_of(2),
        tokens: weight * 10,
        options: vec![(replica, credit), (1 - replica, 0)],
    };
    Problem {
        candidates: vec![c(1, 6, 40, 0), c(2, 5, 30, 1), c(3, 4, 20, 0), c(4, 3, 10, 1)],
        capacities: vec![10, 10],
        quantum: 1,
        state_budget: 1_000,
    }
}

fn live_of(p: &Problem) -> LiveState {
    LiveState {
        sessions: p
            .candidates
            .iter()
            .map(|c| (c.session, LiveSession { signature: c.signature, eligible: vec![0, 1] }))
            .collect(),
        capacities: p.capacities.clone(),
    }
}

#[test]
fn revalidation_discards_a_plan_whose_session_changed() {
    let p = snapshot();
    let plan = solve(&p).unwrap();
    assert_eq!(plan.assignments.iter().map(|a| a.session).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    let mut live = live_of(&p);
    live.sessions.get_mut(&4).unwrap().signature += 1;
    let out = revalidate(&plan, &live);
    assert_eq!(
        out,
        Applied {
            assignments: vec![],
            discarded: true,
            partial: false,
            reason: Some(DiscardReason::SignatureChanged { session: 4 })
        }
    );
    // An unselected session's change does not matter.
    let mut live = live_of(&p);
    live.sessions.insert(99, LiveSession { signature: 5, eligible: vec![] });
    assert!(!revalidate(&plan, &live).discarded);
}

#[test]
fn revalidation_applies_the_longest_prefix_when_capacity_shrank() {
    let p = snapshot();
    let plan = solve(&p).unwrap();
    // Replica 1 (sessions 2 and 4, 5 + 3 tokens) shrank to 6: session 2 fits, 4 does not, so the
    // prefix ends before 4 — here at the end of the plan.
    let mut live = live_of(&p);
    live.capacities = vec![10, 6];
    let out = revalidate(&plan, &live);
    assert!(out.partial && !out.discarded);
    assert_eq!(out.assignments.iter().map(|a| a.session).collect::<Vec<_>>(), vec![1, 2, 3]);
    // Replica 0 shrank to 7: session 1 (6) fits, session 3 (4) would not, so 2 is applied but
    // nothing after 3 is, not even 4 which would fit.
    live.capacities = vec![7, 10];
    let out = revalidate(&plan, &live);
    assert_eq!(out.assignments.iter().map(|a| a.session).collect::<Vec<_>>(), vec![1, 2]);
}

#[test]
fn a_zero_weight_session_is_admitted_even_on_a_full_replica() {
    // w̄ = 0 fits a replica with C̄ = 0; admitting it always raises the objective (count + 1).
    let c = |session, weight, options: Vec<(usize, u64)>| Candidate {
        session,
        signature: 0,
        weight,
        ready: false,
        tokens: 0,
        options,
    };
    let p = Problem {
        candidates: vec![c(1, 0, vec![(0, 0)]), c(2, 0, vec![(0, 3), (1, 7)]), c(3, 2, vec![(1, 0)])],
        capacities: vec![0, 2],
        quantum: 1,
        state_budget: 100,
    };
    for options in ALL_OPTIONS {
        let plan = Solver::new().solve_with(&p, options).unwrap();
        assert_feasible(&p, &plan);
        assert_eq!(plan.objective, brute_force(&p));
        let at: Vec<(u64, usize)> = plan.assignments.iter().map(|a| (a.session, a.replica)).collect();
        assert_eq!(at, vec![(2, 1), (1, 0), (3, 1)]);
    }
}
