//! LinUCB with delayed feedback (paper 002 §4.2.2, Appendices B.4 and E.9).
//!
//! One linear model per arm (a model the router may bind a program to) over a context vector x
//! (a bias, task-type indicators and principal components of the request's embedding). Ridge
//! regression with unit prior: θ_m = A_m⁻¹ b_m, A_m = I + Σ x xᵀ and b_m = Σ r x over the
//! verdicts that have *landed* for arm m. The selection index of arm m for x is
//!
//! ```text
//! index_m(x) = θ_mᵀ x + α · sqrt(xᵀ W_m⁻¹ x),   W_m = I + Σ x xᵀ over every decision for m
//! ```
//!
//! where W counts every decision made so far, landed or not — the *pending term*: while verdicts
//! are in flight the width still shrinks with the decisions already taken, so concurrent programs
//! do not all explore the same arm (Appendix E.9). Without it (the ablation), W = A.
//!
//! A decision never waits on the learner: [`LinUcb::decide`] reads the current state and records
//! the decision as pending; [`LinUcb::land`] applies a verdict whenever it arrives, in the order
//! the verdicts arrive (which need not be the order of the decisions). Both inverses are kept by
//! Sherman–Morrison rank-one updates, O(d²) per decision and per verdict.
//!
//! Pure: no clock, no randomness (ties go to the lowest arm index).
//!
//! Must not depend on anything outside `planner` (the core's rule).

use std::collections::BTreeMap;

use thiserror::Error;

/// The exploration width α_UCB the paper fixes (Table 2; §5.1).
pub const ALPHA_UCB: f64 = 0.6;

/// What the learner refuses.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum LinUcbError {
    #[error("a learner needs at least one arm and a context of at least one feature")]
    Empty,
    #[error("context has {got} features, the learner {expected}")]
    Dimension { expected: usize, got: usize },
    #[error("context feature {index} is {value}, not a finite number")]
    NonFinite { index: usize, value: f64 },
    #[error("program {0} already has a pending decision")]
    DuplicateProgram(u64),
    #[error("program {0} has no pending decision")]
    UnknownProgram(u64),
    #[error("reward {0} is not a finite number")]
    Reward(f64),
    #[error("the exploration width must be finite and non-negative, not {0}")]
    Alpha(f64),
    #[error("arm {arm} does not exist (the learner has {arms})")]
    UnknownArm { arm: usize, arms: usize },
}

/// One routing decision: the arm taken and every arm's selection index and parts (the index is
/// the accuracy estimate â_m the divert rule compares; Appendix C.1).
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub arm: usize,
    /// θ_mᵀ x per arm.
    pub mean: Vec<f64>,
    /// α·sqrt(xᵀ W_m⁻¹ x) per arm.
    pub width: Vec<f64>,
}

impl Decision {
    /// The selection index of arm `m`: mean + width.
    pub fn index(&self, m: usize) -> f64 {
        self.mean.get(m).copied().unwrap_or(f64::NEG_INFINITY) + self.width.get(m).copied().unwrap_or(0.0)
    }
}

/// The reward of a verified program (Appendix B.4): r = success − a·cost/scale, with `scale` the
/// stream's mean cost per task of the reference model (a scale of 0 prices cost at nothing).
pub fn reward(success: f64, cost: f64, a: f64, scale: f64) -> f64 {
    if scale > 0.0 { success - a * cost / scale } else { success }
}

/// A symmetric d×d matrix, row-major.
#[derive(Debug, Clone, PartialEq)]
struct Square {
    d: usize,
    m: Vec<f64>,
}

impl Square {
    fn identity(d: usize) -> Self {
        let mut m = vec![0.0; d * d];
        for i in 0..d {
            m[i * d + i] = 1.0;
        }
        Square { d, m }
    }

    /// M x.
    fn times(&self, x: &[f64]) -> Vec<f64> {
        (0..self.d).map(|i| self.m[i * self.d..(i + 1) * self.d].iter().zip(x).map(|(a, b)| a * b).sum()).collect()
    }

    /// xᵀ M x.
    fn quadratic(&self, x: &[f64]) -> f64 {
        self.times(x).iter().zip(x).map(|(a, b)| a * b).sum()
    }

    /// Given M = A⁻¹, make it (A + x xᵀ)⁻¹ (Sherman–Morrison: M − M x xᵀ M / (1 + xᵀ M x)).
    fn rank_one_inverse_update(&mut self, x: &[f64]) {
        let mx = self.times(x);
        let denom = 1.0 + mx.iter().zip(x).map(|(a, b)| a * b).sum::<f64>();
        for i in 0..self.d {
            for j in 0..self.d {
                self.m[i * self.d + j] -= mx[i] * mx[j] / denom;
            }
        }
    }
}

impl Arm {
    /// A verdict with `reward` for context `x`: the estimate's update (A⁻¹, b, θ).
    fn learn(&mut self, x: &[f64], reward: f64) {
        self.landed += 1;
        self.a_inv.rank_one_inverse_update(x);
        for (b, v) in self.b.iter_mut().zip(x) {
            *b += reward * v;
        }
        self.theta = self.a_inv.times(&self.b);
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Arm {
    /// A⁻¹ over the landed verdicts.
    a_inv: Square,
    b: Vec<f64>,
    /// θ = A⁻¹ b, kept current.
    theta: Vec<f64>,
    /// W⁻¹: over every decision with the pending term, else the same as A⁻¹.
    w_inv: Square,
    decisions: u64,
    landed: u64,
}

/// The delayed-feedback LinUCB learner.
#[derive(Debug, Clone, PartialEq)]
pub struct LinUcb {
    dim: usize,
    alpha: f64,
    pending_term: bool,
    arms: Vec<Arm>,
    /// Decisions awaiting their verdict: program → (arm, context).
    pending: BTreeMap<u64, (usize, Vec<f64>)>,
}

impl LinUcb {
    /// A learner over `arms` arms and contexts of `dim` features, width `alpha`, with the pending
    /// term in the width (the paper's configuration) or without it (`pending_term = false`).
    pub fn new(arms: usize, dim: usize, alpha: f64, pending_term: bool) -> Result<Self, LinUcbError> {
        if arms == 0 || dim == 0 {
            return Err(LinUcbError::Empty);
        }
        if !alpha.is_finite() || alpha < 0.0 {
            return Err(LinUcbError::Alpha(alpha));
        }
        let arm = Arm {
            a_inv: Square::identity(dim),
            b: vec![0.0; dim],
            theta: vec![0.0; dim],
            w_inv: Square::identity(dim),
            decisions: 0,
            landed: 0,
        };
        Ok(LinUcb { dim, alpha, pending_term, arms: vec![arm; arms], pending: BTreeMap::new() })
    }

    pub fn arms(&self) -> usize {
        self.arms.len()
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Decisions made for arm `m` and verdicts landed for it.
    pub fn counts(&self, m: usize) -> Option<(u64, u64)> {
        self.arms.get(m).map(|a| (a.decisions, a.landed))
    }

    /// Programs whose verdict has not landed.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    fn check(&self, x: &[f64]) -> Result<(), LinUcbError> {
        if x.len() != self.dim {
            return Err(LinUcbError::Dimension { expected: self.dim, got: x.len() });
        }
        if let Some((index, &value)) = x.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(LinUcbError::NonFinite { index, value });
        }
        Ok(())
    }

    /// Every arm's index for context `x`, and the arm with the highest (lowest index on ties),
    /// without recording anything.
    pub fn evaluate(&self, x: &[f64]) -> Result<Decision, LinUcbError> {
        self.check(x)?;
        let mean: Vec<f64> = self.arms.iter().map(|a| a.theta.iter().zip(x).map(|(t, v)| t * v).sum()).collect();
        let width: Vec<f64> = self.arms.iter().map(|a| self.alpha * a.w_inv.quadratic(x).max(0.0).sqrt()).collect();
        let mut arm = 0;
        for m in 1..self.arms.len() {
            if mean[m] + width[m] > mean[arm] + width[arm] {
                arm = m;
            }
        }
        Ok(Decision { arm, mean, width })
    }

    /// Route `program` with context `x`: evaluate, bind it to the best arm and record the
    /// decision as pending (in the width at once, with the pending term).
    pub fn decide(&mut self, program: u64, x: &[f64]) -> Result<Decision, LinUcbError> {
        let decision = self.evaluate(x)?;
        self.record(program, decision.arm, x)?;
        Ok(decision)
    }

    /// Record that `program` was bound to `arm` with context `x` (a decision made elsewhere: a
    /// diverted program is recorded on the arm it runs on).
    pub fn record(&mut self, program: u64, arm: usize, x: &[f64]) -> Result<(), LinUcbError> {
        self.check(x)?;
        if self.pending.contains_key(&program) {
            return Err(LinUcbError::DuplicateProgram(program));
        }
        let pending_term = self.pending_term;
        let arms = self.arms.len();
        let Some(a) = self.arms.get_mut(arm) else {
            return Err(LinUcbError::UnknownArm { arm, arms });
        };
        a.decisions += 1;
        if pending_term {
            a.w_inv.rank_one_inverse_update(x);
        }
        self.pending.insert(program, (arm, x.to_vec()));
        Ok(())
    }

    /// The verdict of `program` landed with `reward`: update its arm's estimate (and, without the
    /// pending term, its width). Verdicts are applied in the order this is called.
    pub fn land(&mut self, program: u64, reward: f64) -> Result<usize, LinUcbError> {
        if !reward.is_finite() {
            return Err(LinUcbError::Reward(reward));
        }
        let Some((arm, x)) = self.pending.remove(&program) else {
            return Err(LinUcbError::UnknownProgram(program));
        };
        let pending_term = self.pending_term;
        let a = &mut self.arms[arm];
        a.learn(&x, reward);
        if !pending_term {
            a.w_inv.rank_one_inverse_update(&x);
        }
        Ok(arm)
    }

    /// An outcome learned outside the program table — a decision for `arm` on context `x` made
    /// and verified before this learner existed (a calibration pass, a replay): both its
    /// decision and its verdict enter at once, exactly as [`LinUcb::record`] followed by
    /// [`LinUcb::land`] would enter them, with nothing left pending.
    pub fn observe(&mut self, arm: usize, x: &[f64], reward: f64) -> Result<(), LinUcbError> {
        self.check(x)?;
        if !reward.is_finite() {
            return Err(LinUcbError::Reward(reward));
        }
        let arms = self.arms.len();
        let Some(a) = self.arms.get_mut(arm) else {
            return Err(LinUcbError::UnknownArm { arm, arms });
        };
        a.decisions += 1;
        a.learn(x, reward);
        // With the pending term the decision enters the width at `record`, without it at
        // `land`: once either way.
        a.w_inv.rank_one_inverse_update(x);
        Ok(())
    }

    /// Forget a pending decision without a verdict (a program that failed before it could be
    /// verified): it stays in the width, as a decision made.
    pub fn abandon(&mut self, program: u64) -> Result<usize, LinUcbError> {
        self.pending.remove(&program).map(|(arm, _)| arm).ok_or(LinUcbError::UnknownProgram(program))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn the_update_and_the_width_match_a_hand_computation() {
        // Two arms, d = 2. Arm 0 is chosen for x = (1, 0) and its verdict is reward 1:
        // A = diag(2, 1), b = (1, 0), θ = (0.5, 0). For x' = (1, 1): mean 0.5,
        // width 0.6·sqrt(x'ᵀ A⁻¹ x') = 0.6·sqrt(0.5 + 1).
        let mut l = LinUcb::new(2, 2, ALPHA_UCB, true).unwrap();
        let d = l.decide(7, &[1.0, 0.0]).unwrap();
        assert_eq!(d.arm, 0, "ties go to the lowest arm");
        assert!(close(d.width[0], 0.6) && close(d.mean[0], 0.0));
        assert_eq!(l.land(7, 1.0).unwrap(), 0);
        let e = l.evaluate(&[1.0, 1.0]).unwrap();
        assert!(close(e.mean[0], 0.5), "{e:?}");
        assert!(close(e.width[0], 0.6 * 1.5f64.sqrt()), "{e:?}");
        // The untouched arm: θ = 0, width 0.6·sqrt(2).
        assert!(close(e.mean[1], 0.0) && close(e.width[1], 0.6 * 2f64.sqrt()));
        assert_eq!(e.arm, 0, "0.5 + 0.735 > 0 + 0.849");
        assert!(close(e.index(0), 0.5 + 0.6 * 1.5f64.sqrt()));
        // A second verdict on the same arm, x = (0, 1), reward −0.5: A = diag(2, 2),
        // b = (1, −0.5), θ = (0.5, −0.25).
        l.record(8, 0, &[0.0, 1.0]).unwrap();
        l.land(8, -0.5).unwrap();
        let e = l.evaluate(&[1.0, 1.0]).unwrap();
        assert!(close(e.mean[0], 0.25) && close(e.width[0], 0.6), "{e:?}");
        assert_eq!(l.counts(0), Some((2, 2)));
    }

    #[test]
    fn the_pending_term_narrows_the_width_before_the_verdict_lands() {
        // With the pending term the decision counts in W at once: width for (1, 0) falls from
        // 0.6 to 0.6·sqrt(1/2) before any verdict; without it, only when the verdict lands. The
        // estimate θ moves only with the verdict in both.
        for pending_term in [true, false] {
            let mut l = LinUcb::new(1, 2, ALPHA_UCB, pending_term).unwrap();
            l.decide(1, &[1.0, 0.0]).unwrap();
            let before = l.evaluate(&[1.0, 0.0]).unwrap();
            let expected = if pending_term { 0.6 * 0.5f64.sqrt() } else { 0.6 };
            assert!(close(before.width[0], expected), "{pending_term}: {before:?}");
            assert!(close(before.mean[0], 0.0));
            l.land(1, 1.0).unwrap();
            let after = l.evaluate(&[1.0, 0.0]).unwrap();
            assert!(close(after.width[0], 0.6 * 0.5f64.sqrt()) && close(after.mean[0], 0.5), "{after:?}");
        }
    }

    #[test]
    fn verdicts_land_in_arrival_order_not_decision_order() {
        // Three programs decided 1, 2, 3; their verdicts land 3, 1, 2. Each landing is applied
        // as it arrives: after the first, only program 3's reward is in the estimate.
        let xs = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]];
        let mut l = LinUcb::new(1, 2, ALPHA_UCB, true).unwrap();
        for (p, x) in xs.iter().enumerate() {
            l.record(p as u64 + 1, 0, x).unwrap();
        }
        l.land(3, 1.0).unwrap();
        // Only x3 = (1, 1), r = 1: A = I + x3 x3ᵀ = [[2, 1], [1, 2]], A⁻¹ = [[2, −1], [−1, 2]]/3,
        // θ = A⁻¹ (1, 1) = (1/3, 1/3).
        let e = l.evaluate(&[1.0, 0.0]).unwrap();
        assert!(close(e.mean[0], 1.0 / 3.0), "{e:?}");
        assert_eq!(l.pending(), 2);
        l.land(1, 0.0).unwrap();
        l.land(2, 0.0).unwrap();
        assert_eq!(l.pending(), 0);
        assert_eq!(l.land(2, 0.0), Err(LinUcbError::UnknownProgram(2)));
        // Ridge regression is order-free once all have landed: the same as landing 1, 2, 3.
        let mut m = LinUcb::new(1, 2, ALPHA_UCB, true).unwrap();
        for (p, x) in xs.iter().enumerate() {
            m.record(p as u64 + 1, 0, x).unwrap();
        }
        for (p, r) in [(1, 0.0), (2, 0.0), (3, 1.0)] {
            m.land(p, r).unwrap();
        }
        let (a, b) = (l.evaluate(&[0.3, 0.7]).unwrap(), m.evaluate(&[0.3, 0.7]).unwrap());
        assert!((a.mean[0] - b.mean[0]).abs() < 1e-12 && (a.width[0] - b.width[0]).abs() < 1e-12);
    }

    #[test]
    fn an_observed_outcome_equals_a_recorded_decision_whose_verdict_landed() {
        for pending_term in [true, false] {
            let mut observed = LinUcb::new(2, 3, 0.6, pending_term).unwrap();
            let mut played = observed.clone();
            let outcomes = [(0, [1.0, 0.5, -0.2], 1.0), (1, [1.0, -0.3, 0.4], 0.0), (0, [1.0, 0.1, 0.1], 0.5)];
            for (k, (arm, x, r)) in outcomes.iter().enumerate() {
                observed.observe(*arm, x, *r).unwrap();
                played.record(k as u64, *arm, x).unwrap();
                played.land(k as u64, *r).unwrap();
            }
            assert_eq!(observed, played, "pending term {pending_term}");
            assert_eq!(observed.pending(), 0);
            assert_eq!(observed.counts(0), Some((2, 2)));
        }
        let mut l = LinUcb::new(2, 3, 0.6, true).unwrap();
        assert!(matches!(l.observe(2, &[1.0, 0.0, 0.0], 1.0), Err(LinUcbError::UnknownArm { arm: 2, arms: 2 })));
        assert!(matches!(l.observe(0, &[1.0, 0.0], 1.0), Err(LinUcbError::Dimension { .. })));
        assert!(matches!(l.observe(0, &[1.0, 0.0, 0.0], f64::NAN), Err(LinUcbError::Reward(_))));
        assert_eq!(l, LinUcb::new(2, 3, 0.6, true).unwrap(), "a refused outcome changes nothing");
    }

    #[test]
    fn the_learner_finds_the_better_arm_and_refuses_bad_input() {
        // Arm 1 succeeds on feature 1 tasks, arm 0 on feature 0 tasks; after a few verdicts each
        // task type goes to its arm.
        let mut l = LinUcb::new(2, 3, ALPHA_UCB, true).unwrap();
        let task = |t: usize| -> Vec<f64> {
            let mut x = vec![1.0, 0.0, 0.0];
            x[1 + t] = 1.0;
            x
        };
        for p in 0..200u64 {
            let t = (p % 2) as usize;
            let d = l.decide(p, &task(t)).unwrap();
            let success = if d.arm == t { 1.0 } else { 0.0 };
            l.land(p, reward(success, 1.0, 0.0, 1.0)).unwrap();
        }
        assert_eq!(l.evaluate(&task(0)).unwrap().arm, 0);
        assert_eq!(l.evaluate(&task(1)).unwrap().arm, 1);
        assert_eq!(l.evaluate(&[1.0]), Err(LinUcbError::Dimension { expected: 3, got: 1 }));
        assert!(matches!(l.evaluate(&[1.0, f64::NAN, 0.0]), Err(LinUcbError::NonFinite { index: 1, .. })));
        l.record(1000, 0, &task(0)).unwrap();
        assert_eq!(l.record(1000, 1, &task(0)), Err(LinUcbError::DuplicateProgram(1000)));
        assert_eq!(l.land(1000, f64::INFINITY), Err(LinUcbError::Reward(f64::INFINITY)));
        assert_eq!(l.abandon(1000), Ok(0));
        assert_eq!(LinUcb::new(0, 3, 0.6, true), Err(LinUcbError::Empty));
        assert_eq!(LinUcb::new(2, 3, -1.0, true), Err(LinUcbError::Alpha(-1.0)));
        // The reward of Appendix B.4.
        assert!(close(reward(1.0, 2.0, 0.5, 4.0), 0.75));
        assert!(close(reward(1.0, 2.0, 0.5, 0.0), 1.0));
    }
}
