//! TAO's fallback placement (paper 000 Appendix I, Algorithm 1): best-fit decreasing, used when
//! the DP's state budget is exhausted, in the manner of ThunderAgent's token-count scheduling.
//!
//! Owns: the best-fit-decreasing plan of a [`Problem`] on its quantized weights and capacities.
//! Order: candidates by quantized admission weight w̄ descending (the "decreasing" of BFD:
//! ThunderAgent orders by token demand), ties by their best value v_{i,b} descending, then by
//! input position; each goes to the eligible replica with the smallest residual that still fits
//! (ties: the lowest replica index) and is skipped if none fits. It ignores cache credit in the
//! placement itself, which is what the DP improves on.
//!
//! Must not depend on: the DP ([`super::dp`], which falls back to this module; what both need —
//! validation, quantization and plan building — is [`super::problem`]'s), any shell, the
//! emulator or the tools crate; no I/O, clock or randomness.

use super::TaoError;
use super::problem::{Plan, Problem, build_plan, quantize_capacity, quantize_weight, validate};

/// The best-fit-decreasing plan of `problem`, flagged `fallback` (it is not the DP optimum).
pub fn best_fit_decreasing(problem: &Problem) -> Result<Plan, TaoError> {
    validate(problem)?;
    plan_unchecked(problem, 0)
}

/// [`best_fit_decreasing`] on an already validated problem; `states` is what the DP explored
/// before it gave up.
pub(super) fn plan_unchecked(problem: &Problem, states: usize) -> Result<Plan, TaoError> {
    let q = problem.quantum;
    let mut residual: Vec<u64> = problem.capacities.iter().map(|&c| quantize_capacity(c, q)).collect();
    let mut order: Vec<(u64, super::value::Value, usize)> = problem
        .candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let best = c.options.iter().map(|&(_, k)| c.value(k)).max().unwrap_or_default();
            (quantize_weight(c.weight, q), best, i)
        })
        .collect();
    order.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    let mut chosen = Vec::new();
    for (wq, _, i) in order {
        let fit = problem.candidates[i]
            .options
            .iter()
            .map(|&(b, _)| b)
            .filter(|&b| residual[b] >= wq)
            .min_by_key(|&b| (residual[b], b));
        if let Some(b) = fit {
            residual[b] -= wq;
            chosen.push((i, b));
        }
    }
    Ok(build_plan(problem, &chosen, true, states))
}
