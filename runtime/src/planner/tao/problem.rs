//! The snapshot TAO plans on and the plan it produces (paper 000 §3.5, Appendix B.1): the
//! shared vocabulary of the exact DP ([`super::dp`]), its best-fit-decreasing fallback
//! ([`super::bfd`]) and revalidation ([`super::revalidate`](mod@super::revalidate)).
//!
//! Owns: the snapshot types ([`Problem`], [`Candidate`]), the plan ([`Plan`], [`Assignment`]),
//! input validation (Δ > 0, unique sessions, known and distinct replicas, sums within the solver's
//! exact range: [`MAX_CANDIDATES`], [`VALUE_LIMIT`]), quantization (w̄ = ⌈w/Δ⌉, C̄ = ⌊C/Δ⌋,
//! [`DEFAULT_QUANTUM`]) and building a plan in plan order from chosen pairs.
//!
//! Must not depend on: the solvers that use it ([`super::dp`], [`super::bfd`]) or revalidation —
//! it is the leaf they share, so that neither solver imports the other's module for these —, any
//! shell, the emulator or the tools crate; no I/O, clock or randomness. It uses only the value
//! types ([`super::value`]) and [`super::TaoError`].

use std::collections::BTreeSet;

use super::TaoError;
use super::value::{Objective, Value};

/// The capacity quantum Δ (tokens) the benches use: 2,048 tokens, 128 vLLM blocks of 16.
pub const DEFAULT_QUANTUM: u64 = 2048;

/// The most candidates one solve takes (the ready and admitted counts are 16-bit fields).
pub const MAX_CANDIDATES: usize = u16::MAX as usize;
/// Summed credit and summed tokens must stay below this (48-bit fields).
pub const VALUE_LIMIT: u64 = 1 << 48;

/// One waiting agent session of the frozen snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The session's identity (unique within a problem).
    pub session: u64,
    /// The session's state signature when the snapshot was frozen; revalidation compares it
    /// with the live one (Appendix B.2).
    pub signature: u64,
    /// Admission cost w_i in tokens (the session's memory demand on the replica that admits it).
    pub weight: u64,
    /// Tool-return readiness r_i (Eq. 6).
    pub ready: bool,
    /// Token count t_i.
    pub tokens: u64,
    /// The eligible replicas E_i and the decayed cache credit k_{i,b} (Eq. 4) on each:
    /// `(replica index, credit)`. A replica absent here is not eligible.
    pub options: Vec<(usize, u64)>,
}

impl Candidate {
    /// v_{i,b} for a replica on which the candidate has `credit`.
    pub fn value(&self, credit: u64) -> Value {
        Value { credit, ready: self.ready, tokens: self.tokens }
    }
}

/// The frozen snapshot the planner solves: candidates P, residual capacities C_b (tokens), Δ,
/// and the bound on live DP states per layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub candidates: Vec<Candidate>,
    /// Residual admission capacity of each replica, in tokens.
    pub capacities: Vec<u64>,
    /// Δ in tokens (> 0).
    pub quantum: u64,
    /// The most live states one layer D_j may hold before the solver falls back to BFD.
    pub state_budget: usize,
}

/// One admitted session and where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    pub session: u64,
    pub replica: usize,
    /// w_i in tokens, as in the candidate.
    pub weight: u64,
    /// The signature the plan was made against.
    pub signature: u64,
    /// v_{i,b} of this assignment.
    pub value: Value,
}

/// A plan: the selected assignments and their objective.
///
/// `assignments` are in plan order: value v_{i,b} descending (credit, readiness, tokens), then
/// session id ascending. Revalidation applies the longest prefix that fits, so under shrunken
/// capacity the most valuable assignments are the ones kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub assignments: Vec<Assignment>,
    /// Σ u_{i,b} over the assignments.
    pub objective: Objective,
    /// The plan is the best-fit-decreasing fallback, not the DP optimum.
    pub fallback: bool,
    /// Σ_j |D_j|: live states over all layers (including D_0) of every DP run of this solve,
    /// up to where it stopped (a restart adds the aborted first run and the beam run).
    pub states_explored: usize,
}

/// Check a problem: Δ > 0, unique sessions, known and distinct replicas per candidate, and sums
/// within the packed objective's exact range (the credit over every eligible pair, since the
/// credit bound may count a candidate once per group; the tokens over every candidate).
pub(super) fn validate(problem: &Problem) -> Result<(), TaoError> {
    if problem.quantum == 0 {
        return Err(TaoError::ZeroQuantum);
    }
    let n = problem.candidates.len();
    if n > MAX_CANDIDATES {
        return Err(TaoError::TooManyCandidates { count: n, limit: MAX_CANDIDATES });
    }
    let replicas = problem.capacities.len();
    let mut sessions = BTreeSet::new();
    let (mut credit_sum, mut token_sum) = (0u128, 0u128);
    let mut seen = vec![false; replicas];
    for c in &problem.candidates {
        if !sessions.insert(c.session) {
            return Err(TaoError::DuplicateSession(c.session));
        }
        for &(b, k) in &c.options {
            if b >= replicas {
                return Err(TaoError::UnknownReplica { session: c.session, replica: b, replicas });
            }
            if seen[b] {
                for &(b, _) in &c.options {
                    seen[b] = false;
                }
                return Err(TaoError::DuplicateOption { session: c.session, replica: b });
            }
            seen[b] = true;
            credit_sum += u128::from(k);
        }
        for &(b, _) in &c.options {
            seen[b] = false;
        }
        token_sum += u128::from(c.tokens);
    }
    for (what, sum) in [("credit", credit_sum), ("tokens", token_sum)] {
        if sum >= u128::from(VALUE_LIMIT) {
            return Err(TaoError::ValueRange { what, sum, limit: VALUE_LIMIT });
        }
    }
    Ok(())
}

/// w̄_i = ⌈w_i/Δ⌉ (Δ > 0).
pub(super) fn quantize_weight(weight: u64, quantum: u64) -> u64 {
    weight.div_ceil(quantum)
}

/// C̄_b = ⌊C_b/Δ⌋ (Δ > 0).
pub(super) fn quantize_capacity(capacity: u64, quantum: u64) -> u64 {
    capacity / quantum
}

/// A plan from chosen `(candidate index, replica)` pairs: assignments in plan order and their
/// objective.
pub(super) fn build_plan(problem: &Problem, chosen: &[(usize, usize)], fallback: bool, states: usize) -> Plan {
    let mut assignments: Vec<Assignment> = chosen
        .iter()
        .map(|&(i, b)| {
            let c = &problem.candidates[i];
            let credit = c.options.iter().find(|o| o.0 == b).map_or(0, |o| o.1);
            Assignment {
                session: c.session,
                replica: b,
                weight: c.weight,
                signature: c.signature,
                value: c.value(credit),
            }
        })
        .collect();
    assignments.sort_by(|a, b| b.value.cmp(&a.value).then(a.session.cmp(&b.session)));
    let objective = assignments.iter().fold(Objective::ZERO, |o, a| o.plus(a.value));
    Plan { assignments, objective, fallback, states_explored: states }
}
