//! TAO's live-state revalidation (paper 000 Appendix B.2): a plan is solved on a frozen snapshot
//! in an isolated worker, so before it is applied the executor checks it against the live state.
//!
//! Owns: the live view a plan is checked against ([`LiveState`]) and the outcome ([`Applied`]).
//! The rule: if any selected session is gone, has a changed state signature, or is no longer
//! eligible on its planned replica, the whole plan is discarded; otherwise the longest prefix of
//! the plan (in plan order, see [`Plan`]) whose weights fit the current residual capacities (in
//! tokens, the live admission constraint) is applied, and the rest is dropped.
//!
//! Must not depend on: the solvers ([`super::dp`], [`super::bfd`]; it uses only the plan types of
//! [`super::problem`]), any shell, the emulator or the tools crate; no I/O, clock or randomness.

use std::collections::BTreeMap;

use super::problem::{Assignment, Plan};

/// One waiting session as the executor sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveSession {
    /// The caller's digest of the session's state; compared with the plan's.
    pub signature: u64,
    /// Replicas the session is eligible on now.
    pub eligible: Vec<usize>,
}

/// The live state at application time: the waiting sessions and each replica's residual
/// admission capacity in tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveState {
    pub sessions: BTreeMap<u64, LiveSession>,
    pub capacities: Vec<u64>,
}

/// Why a plan was discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscardReason {
    /// A selected session is no longer waiting.
    SessionGone { session: u64 },
    /// A selected session's state signature changed since the snapshot.
    SignatureChanged { session: u64 },
    /// A selected session is no longer eligible on its planned replica (or the replica is gone).
    NoLongerEligible { session: u64, replica: usize },
}

/// What revalidation lets the executor apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The applied prefix of the plan (empty if discarded).
    pub assignments: Vec<Assignment>,
    /// The whole plan was discarded.
    pub discarded: bool,
    /// Only a proper prefix fit the current capacities.
    pub partial: bool,
    /// Set when `discarded`.
    pub reason: Option<DiscardReason>,
}

/// Revalidate `plan` against `live` (Appendix B.2).
pub fn revalidate(plan: &Plan, live: &LiveState) -> Applied {
    for a in &plan.assignments {
        let reason = match live.sessions.get(&a.session) {
            None => Some(DiscardReason::SessionGone { session: a.session }),
            Some(s) if s.signature != a.signature => Some(DiscardReason::SignatureChanged { session: a.session }),
            Some(s) if a.replica >= live.capacities.len() || !s.eligible.contains(&a.replica) => {
                Some(DiscardReason::NoLongerEligible { session: a.session, replica: a.replica })
            }
            Some(_) => None,
        };
        if reason.is_some() {
            return Applied { assignments: Vec::new(), discarded: true, partial: false, reason };
        }
    }
    let mut residual = live.capacities.clone();
    let mut applied = Vec::with_capacity(plan.assignments.len());
    for a in &plan.assignments {
        // Every replica index was checked against `capacities` above.
        let room = &mut residual[a.replica];
        if *room < a.weight {
            break;
        }
        *room -= a.weight;
        applied.push(*a);
    }
    let partial = applied.len() < plan.assignments.len();
    Applied { assignments: applied, discarded: false, partial, reason: None }
}

#[cfg(test)]
mod tests {
    use super::super::dp::{Candidate, Problem, solve};
    use super::*;

    fn problem() -> Problem {
        let c = |session: u64, weight: u64, credit: u64| Candidate {
            session,
            signature: 100 + session,
            weight,
            ready: false,
            tokens: weight,
            options: vec![(0, credit), (1, 0)],
        };
        Problem {
            candidates: vec![c(1, 4, 30), c(2, 3, 20), c(3, 2, 10)],
            capacities: vec![9, 0],
            quantum: 1,
            state_budget: 100,
        }
    }

    fn live(p: &Problem, capacities: Vec<u64>) -> LiveState {
        let sessions = p
            .candidates
            .iter()
            .map(|c| (c.session, LiveSession { signature: c.signature, eligible: vec![0, 1] }))
            .collect();
        LiveState { sessions, capacities }
    }

    #[test]
    fn unchanged_state_applies_the_whole_plan() {
        let p = problem();
        let plan = solve(&p).unwrap();
        assert_eq!(plan.assignments.len(), 3);
        let out = revalidate(&plan, &live(&p, p.capacities.clone()));
        assert_eq!(
            out,
            Applied { assignments: plan.assignments.clone(), discarded: false, partial: false, reason: None }
        );
    }

    #[test]
    fn a_changed_signature_discards_the_plan() {
        let p = problem();
        let plan = solve(&p).unwrap();
        let mut l = live(&p, p.capacities.clone());
        l.sessions.get_mut(&2).unwrap().signature ^= 1;
        let out = revalidate(&plan, &l);
        assert!(out.discarded && out.assignments.is_empty());
        assert_eq!(out.reason, Some(DiscardReason::SignatureChanged { session: 2 }));
        let mut l = live(&p, p.capacities.clone());
        l.sessions.get_mut(&3).unwrap().eligible = vec![1];
        assert_eq!(revalidate(&plan, &l).reason, Some(DiscardReason::NoLongerEligible { session: 3, replica: 0 }));
        let mut l = live(&p, p.capacities.clone());
        l.sessions.remove(&1);
        assert_eq!(revalidate(&plan, &l).reason, Some(DiscardReason::SessionGone { session: 1 }));
    }

    #[test]
    fn shrunken_capacity_applies_the_longest_feasible_prefix() {
        let p = problem();
        let plan = solve(&p).unwrap();
        // Plan order is by value: 1 (credit 30), 2 (20), 3 (10), all on replica 0.
        let order: Vec<u64> = plan.assignments.iter().map(|a| a.session).collect();
        assert_eq!(order, vec![1, 2, 3]);
        // 8 tokens left: 4 + 3 fit, then 2 does not.
        let out = revalidate(&plan, &live(&p, vec![8, 0]));
        assert!(!out.discarded && out.partial);
        assert_eq!(out.assignments.iter().map(|a| a.session).collect::<Vec<_>>(), vec![1, 2]);
        // 6 tokens left: 4 fits, 3 does not — and session 3 (2 tokens) after the first misfit is
        // not applied although it would fit: a prefix, not a re-packing.
        let out = revalidate(&plan, &live(&p, vec![6, 0]));
        assert_eq!(out.assignments.iter().map(|a| a.session).collect::<Vec<_>>(), vec![1]);
        let out = revalidate(&plan, &live(&p, vec![3, 0]));
        assert!(out.partial && out.assignments.is_empty());
    }
}
