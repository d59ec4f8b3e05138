//! DISC, ORACLE's dispatch scheduler (paper 002 §4.3, Appendix B.2, Appendix C.1): a reservation
//! ledger per model backend, its wait forecast, and the divert rule at the program boundary.
//!
//! The ledger of model m reserves, for each admitted program p, its expected peak KV footprint
//! max(tokens_p, ĉ_m) + δ̂_m tokens:
//! - ĉ_m, the running mean of finished programs' peak context, starts from a calibration prior c₀
//!   with five pseudo-observations: ĉ = (5·c₀ + Σ peaks) / (5 + n);
//! - δ̂_m, the learned per-request allowance: KV the engine holds per running request beyond its
//!   tokens (on the paper's hybrid-attention engines 3–5k token-equivalents; on a full-attention
//!   engine only its block rounding), estimated from usage observations while the engine is not
//!   saturated (above the per-call ceiling it is not identifiable, Appendix B.2).
//!
//! A program is admitted strictly FIFO when the reserved total plus its own reservation fits
//! within 85 % of the backend's KV capacity (a program larger than that limit is admitted alone
//! into an empty ledger rather than never); each call of an admitted program still meets the
//! engine's 95 % ceiling ([`Ledger::call_fits`]). The forecast wait is 0 when the queue is empty
//! and the program fits now, else w = (q + 1)·D / max(K, 1) with q programs queued ahead, K
//! admitted and D the mean run time of finished programs (a prior until the first finishes).
//! The reservation is released when the program's last call returns.
//!
//! The divert rule ([`divert`]) is evaluated once per program, before its first request: a
//! program the router bound to m moves to m′ when (1 − β)(â_m′ − â_m) > β (w_m′ − w_m) / w₀.
//! No program moves after it starts.
//!
//! Pure: no clock (run times are arguments), no randomness.
//!
//! Must not depend on anything outside `planner` (the core's rule).

use std::collections::{BTreeMap, VecDeque};

use thiserror::Error;

/// DISC's constants (paper 002 Table 2, Appendix B.2).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct DiscConfig {
    /// Share of the KV pool admission may reserve.
    pub admit_fraction: f64,
    /// Share of the KV pool a single call may bring the engine to (the hard limit).
    pub call_ceiling: f64,
    /// Pseudo-observations of the peak-context prior c₀.
    pub prior_weight: f64,
    /// Weight of the wait against accuracy in the divert rule.
    pub beta: f64,
    /// Reference wait w₀, seconds.
    pub w0_s: f64,
}

impl Default for DiscConfig {
    fn default() -> Self {
        DiscConfig { admit_fraction: 0.85, call_ceiling: 0.95, prior_weight: 5.0, beta: 0.5, w0_s: 600.0 }
    }
}

/// What the ledger refuses.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum LedgerError {
    #[error("a ledger needs a positive KV capacity, a finite non-negative peak prior and a positive run-time prior")]
    Config,
    #[error("program {0} is already queued or admitted")]
    Duplicate(u64),
    #[error("program {0} is not admitted")]
    NotAdmitted(u64),
    #[error("program {0} is not queued")]
    NotQueued(u64),
    #[error("{what} {value} is not a finite, non-negative number")]
    Value { what: &'static str, value: f64 },
    #[error("a learned state with {0} is not one a ledger learns")]
    Inconsistent(&'static str),
}

/// The reservation ledger of one model backend (over all its replicas' KV).
#[derive(Debug, Clone, PartialEq)]
pub struct Ledger {
    cfg: DiscConfig,
    capacity_tokens: u64,
    /// One engine's KV (the capacity the ledger was built with): the per-call ceiling and the
    /// saturation guard of a usage observation are about the engine that holds the call, never
    /// the model's pool over its replicas.
    engine_tokens: u64,
    c0: f64,
    peaks_sum: f64,
    peaks_n: u64,
    d0: f64,
    run_sum: f64,
    run_n: u64,
    allowance_sum: f64,
    allowance_n: f64,
    /// Admitted programs and their reservations (tokens).
    admitted: BTreeMap<u64, u64>,
    /// Programs waiting for admission, in arrival order, with their known tokens.
    queue: VecDeque<(u64, u64)>,
}

impl Ledger {
    /// A ledger over `capacity_tokens` of KV with the peak-context prior `c0` (tokens) and the
    /// run-time prior `d0` (seconds).
    pub fn new(capacity_tokens: u64, c0: f64, d0: f64, cfg: DiscConfig) -> Result<Self, LedgerError> {
        if capacity_tokens == 0 || !c0.is_finite() || c0 < 0.0 || !d0.is_finite() || d0 <= 0.0 {
            return Err(LedgerError::Config);
        }
        Ok(Ledger {
            cfg,
            capacity_tokens,
            engine_tokens: capacity_tokens,
            c0,
            peaks_sum: 0.0,
            peaks_n: 0,
            d0,
            run_sum: 0.0,
            run_n: 0,
            allowance_sum: 0.0,
            allowance_n: 0.0,
            admitted: BTreeMap::new(),
            queue: VecDeque::new(),
        })
    }

    pub fn capacity_tokens(&self) -> u64 {
        self.capacity_tokens
    }

    /// One engine's KV, the capacity the ledger was built with (it names the backend, and bounds
    /// the per-engine checks), whatever its pool over the replicas is now.
    pub fn engine_tokens(&self) -> u64 {
        self.engine_tokens
    }

    /// The backend's KV pool changed (a replica of the model was added or went): the ledger now
    /// reserves from `capacity_tokens` (at least 1). Admitted programs keep their reservations;
    /// the next [`Ledger::admit`] admits against the new limit. The per-engine checks
    /// ([`Ledger::call_fits`], [`Ledger::observe_usage`]) keep one engine's KV.
    pub fn set_capacity(&mut self, capacity_tokens: u64) {
        self.capacity_tokens = capacity_tokens.max(1);
    }

    /// ĉ: the prior-weighted mean of finished programs' peak context.
    pub fn peak_estimate(&self) -> f64 {
        (self.cfg.prior_weight * self.c0 + self.peaks_sum) / (self.cfg.prior_weight + self.peaks_n as f64)
    }

    /// δ̂: the learned per-request allowance (0 before any observation).
    pub fn allowance(&self) -> f64 {
        if self.allowance_n <= 0.0 { 0.0 } else { (self.allowance_sum / self.allowance_n).max(0.0) }
    }

    /// D: the mean run time of finished programs, the prior before any finished.
    pub fn mean_run_s(&self) -> f64 {
        if self.run_n == 0 { self.d0 } else { self.run_sum / self.run_n as f64 }
    }

    /// The reservation of a program that holds `tokens` now: max(tokens, ĉ) + δ̂, rounded up.
    pub fn reservation(&self, tokens: u64) -> u64 {
        ((tokens as f64).max(self.peak_estimate()) + self.allowance()).ceil() as u64
    }

    /// Tokens reserved by the admitted programs.
    pub fn reserved(&self) -> u64 {
        self.admitted.values().sum()
    }

    /// The admission limit: 85 % of the KV pool.
    pub fn admission_limit(&self) -> u64 {
        (self.cfg.admit_fraction * self.capacity_tokens as f64).floor() as u64
    }

    /// Whether a program holding `tokens` would be admitted now if it were at the head.
    pub fn fits(&self, tokens: u64) -> bool {
        self.reserved() + self.reservation(tokens) <= self.admission_limit() || self.admitted.is_empty()
    }

    /// Programs admitted (K) and queued (q).
    pub fn admitted(&self) -> usize {
        self.admitted.len()
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    pub fn is_admitted(&self, program: u64) -> bool {
        self.admitted.contains_key(&program)
    }

    /// The forecast wait w of a new program holding `tokens`: 0 if nothing is queued and it fits
    /// now, else (q + 1)·D / max(K, 1).
    pub fn wait_forecast(&self, tokens: u64) -> f64 {
        if self.queue.is_empty() && self.fits(tokens) {
            return 0.0;
        }
        (self.queue.len() as f64 + 1.0) * self.mean_run_s() / (self.admitted.len().max(1) as f64)
    }

    /// Queue a program (its binding to this backend is final); admit with [`Ledger::admit`].
    pub fn submit(&mut self, program: u64, tokens: u64) -> Result<(), LedgerError> {
        if self.admitted.contains_key(&program) || self.queue.iter().any(|(p, _)| *p == program) {
            return Err(LedgerError::Duplicate(program));
        }
        self.queue.push_back((program, tokens));
        Ok(())
    }

    /// Admit queued programs strictly in arrival order while the head fits; returns them.
    pub fn admit(&mut self) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some(&(program, tokens)) = self.queue.front() {
            if !self.fits(tokens) {
                break;
            }
            self.queue.pop_front();
            let r = self.reservation(tokens);
            self.admitted.insert(program, r);
            out.push(program);
        }
        out
    }

    /// Take a queued program back before admission (it was cancelled).
    pub fn withdraw(&mut self, program: u64) -> Result<(), LedgerError> {
        let Some(i) = self.queue.iter().position(|(p, _)| *p == program) else {
            return Err(LedgerError::NotQueued(program));
        };
        self.queue.remove(i);
        Ok(())
    }

    /// An admitted program's last call returned: release its reservation and learn its peak
    /// context (tokens) and run time (seconds, admission to last return). A program that failed
    /// is released with [`Ledger::release`] instead (it teaches nothing about peaks).
    pub fn finish(&mut self, program: u64, peak_tokens: u64, run_s: f64) -> Result<(), LedgerError> {
        if !run_s.is_finite() || run_s < 0.0 {
            return Err(LedgerError::Value { what: "run time", value: run_s });
        }
        self.release(program)?;
        self.peaks_sum += peak_tokens as f64;
        self.peaks_n += 1;
        self.run_sum += run_s;
        self.run_n += 1;
        Ok(())
    }

    /// Release an admitted program's reservation without learning from it.
    pub fn release(&mut self, program: u64) -> Result<(), LedgerError> {
        self.admitted.remove(&program).map(|_| ()).ok_or(LedgerError::NotAdmitted(program))
    }

    /// Whether a call bringing `call_tokens` more onto an engine holding `in_use_tokens` stays
    /// under the 95 % per-call ceiling.
    pub fn call_fits(&self, in_use_tokens: u64, call_tokens: u64) -> bool {
        (in_use_tokens + call_tokens) as f64 <= self.cfg.call_ceiling * self.engine_tokens as f64
    }

    /// An engine usage observation: it held `used_tokens` of KV for `running` requests whose
    /// contexts sum to `context_tokens`. Below the per-call ceiling the excess per request is a
    /// sample of δ̂ (usage = tokens + δ per running request); at or above it (saturated: the
    /// engine preempts) it is not identifiable and is ignored. Returns whether it was used.
    pub fn observe_usage(&mut self, used_tokens: u64, context_tokens: u64, running: u32) -> bool {
        self.observe_usage_weighted(used_tokens, context_tokens, running, 1)
    }

    /// [`Self::observe_usage`] standing for `weight` samples (e.g. the engine steps an
    /// observation covers, so that δ̂ does not depend on how often an observer looks).
    pub fn observe_usage_weighted(&mut self, used_tokens: u64, context_tokens: u64, running: u32, weight: u32) -> bool {
        if running == 0 || weight == 0 || used_tokens as f64 >= self.cfg.call_ceiling * self.engine_tokens as f64 {
            return false;
        }
        let w = f64::from(weight);
        self.allowance_sum += w * (used_tokens as f64 - context_tokens as f64) / f64::from(running);
        self.allowance_n += w;
        true
    }
}

/// What a [`Ledger`] has learned from finished programs and engine usage (its sums and counts,
/// beside its priors): another ledger of the same backend takes it with [`Ledger::restore`] —
/// how a restarted server keeps ĉ, D̂ and δ̂.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LedgerLearned {
    pub peaks_sum: f64,
    pub peaks_n: u64,
    pub run_sum: f64,
    pub run_n: u64,
    pub allowance_sum: f64,
    pub allowance_n: f64,
}

impl Ledger {
    /// What this ledger has learned (not its admissions or queue).
    pub fn learned(&self) -> LedgerLearned {
        LedgerLearned {
            peaks_sum: self.peaks_sum,
            peaks_n: self.peaks_n,
            run_sum: self.run_sum,
            run_n: self.run_n,
            allowance_sum: self.allowance_sum,
            allowance_n: self.allowance_n,
        }
    }

    /// Take what an earlier ledger of the same backend learned, replacing what this one has
    /// learned. Refused (nothing changes) for a sum that is not finite, a negative peak or run
    /// sum, a negative sample weight, or counts that disagree with their sums (every finished
    /// program adds one peak and one run time; no program, no sum); δ̂'s sum may be negative (an
    /// engine that held less than its requests' contexts). A mean peak beyond the backend's
    /// capacity is a state a ledger learns (a prompt longer than the context still counts).
    pub fn restore(&mut self, learned: &LedgerLearned) -> Result<(), LedgerError> {
        let values = [
            ("peak sum", learned.peaks_sum, learned.peaks_sum >= 0.0),
            ("run-time sum", learned.run_sum, learned.run_sum >= 0.0),
            ("allowance sum", learned.allowance_sum, true),
            ("allowance weight", learned.allowance_n, learned.allowance_n >= 0.0),
        ];
        if let Some((what, value, _)) = values.into_iter().find(|(_, v, ok)| !v.is_finite() || !ok) {
            return Err(LedgerError::Value { what, value });
        }
        let consistent = [
            ("a peak sum without a finished program", learned.peaks_n > 0 || learned.peaks_sum == 0.0),
            ("a run-time sum without a finished program", learned.run_n > 0 || learned.run_sum == 0.0),
            ("a run count other than the peak count", learned.run_n == learned.peaks_n),
            ("an allowance sum without a sample", learned.allowance_n > 0.0 || learned.allowance_sum == 0.0),
        ];
        if let Some((what, _)) = consistent.into_iter().find(|(_, ok)| !ok) {
            return Err(LedgerError::Inconsistent(what));
        }
        self.peaks_sum = learned.peaks_sum;
        self.peaks_n = learned.peaks_n;
        self.run_sum = learned.run_sum;
        self.run_n = learned.run_n;
        self.allowance_sum = learned.allowance_sum;
        self.allowance_n = learned.allowance_n;
        Ok(())
    }
}
/// The divert rule (Appendix C.1, Eq. 4): a program the router bound to model m (accuracy
/// estimate `a_bound`, forecast wait `w_bound`) moves to m′ (`a_alt`, `w_alt`) when
/// (1 − β)(â_m′ − â_m) > β (w_m′ − w_m) / w₀. At β = 0 it never moves (the bandit chose m by
/// â); at β = 1 it moves exactly when m′'s wait is shorter.
pub fn divert(beta: f64, w0_s: f64, a_bound: f64, a_alt: f64, w_bound: f64, w_alt: f64) -> bool {
    (1.0 - beta) * (a_alt - a_bound) > beta * (w_alt - w_bound) / w0_s.max(f64::MIN_POSITIVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> Ledger {
        Ledger::new(100_000, 20_000.0, 600.0, DiscConfig::default()).unwrap()
    }

    #[test]
    fn reservations_follow_the_prior_and_the_finished_peaks() {
        let mut l = ledger();
        assert_eq!(l.peak_estimate(), 20_000.0);
        assert_eq!(l.reservation(5_000), 20_000, "max(tokens, ĉ) + δ̂ with δ̂ = 0");
        assert_eq!(l.reservation(30_000), 30_000);
        l.submit(1, 5_000).unwrap();
        assert_eq!(l.admit(), vec![1]);
        // One finished program with peak 32,000: ĉ = (5·20,000 + 32,000) / 6 = 22,000.
        l.finish(1, 32_000, 300.0).unwrap();
        assert_eq!(l.peak_estimate(), 22_000.0);
        assert_eq!(l.mean_run_s(), 300.0);
        assert_eq!(l.reserved(), 0);
        assert_eq!(l.finish(1, 1, 1.0), Err(LedgerError::NotAdmitted(1)));
        // δ̂ from usage below the ceiling: 3 requests, 40,000 used for 37,000 of context → 1,000.
        assert!(l.observe_usage(40_000, 37_000, 3));
        assert_eq!(l.allowance(), 1_000.0);
        assert_eq!(l.reservation(5_000), 23_000);
        // Saturated (≥ 95 % of the pool) or idle observations teach nothing.
        assert!(!l.observe_usage(96_000, 10_000, 2));
        assert!(!l.observe_usage(10_000, 10_000, 0));
        // A weighted observation counts as that many samples: (1 × 1,000 + 3 × 2,000) / 4.
        let mut w = ledger();
        assert!(w.observe_usage_weighted(11_000, 10_000, 1, 1) && w.observe_usage_weighted(12_000, 10_000, 1, 3));
        assert!((w.allowance() - 1_750.0).abs() < 1e-9, "{}", w.allowance());
        assert!(!w.observe_usage_weighted(12_000, 10_000, 1, 0), "no step, no sample");
        assert_eq!(l.allowance(), 1_000.0);
    }

    #[test]
    fn what_a_ledger_learned_restores_its_estimates_in_another() {
        let mut l = ledger();
        l.submit(1, 5_000).unwrap();
        l.admit();
        l.finish(1, 32_000, 300.0).unwrap();
        assert!(l.observe_usage(40_000, 37_000, 3));
        let mut fresh = ledger();
        assert_eq!(fresh.peak_estimate(), 20_000.0);
        fresh.restore(&l.learned()).unwrap();
        assert_eq!((fresh.peak_estimate(), fresh.mean_run_s(), fresh.allowance()), (22_000.0, 300.0, 1_000.0));
        assert_eq!(fresh.learned(), l.learned());
        assert_eq!(fresh.admitted(), 0, "admissions are not part of what is learned");
        let mut bad = l.learned();
        bad.run_sum = f64::NAN;
        assert!(matches!(fresh.restore(&bad), Err(LedgerError::Value { what: "run-time sum", .. })));
        bad = l.learned();
        bad.peaks_sum = -1.0;
        assert!(fresh.restore(&bad).is_err());
        bad = l.learned();
        bad.run_n += 1;
        assert!(matches!(fresh.restore(&bad), Err(LedgerError::Inconsistent(_))), "counts that disagree");
        bad = LedgerLearned { peaks_n: 0, run_n: 0, ..l.learned() };
        assert!(matches!(fresh.restore(&bad), Err(LedgerError::Inconsistent(_))), "a sum without a program");
        assert_eq!(fresh.learned(), l.learned(), "a refused restore changes nothing");
        // What ledgers do learn is taken: zero peaks and run times, a negative allowance sum, a
        // mean peak beyond the capacity (a prompt longer than the context still counts).
        let odd = LedgerLearned { peaks_sum: 3e6, peaks_n: 2, run_sum: 0.0, run_n: 2, allowance_sum: -40.0, allowance_n: 2.0 };
        fresh.restore(&odd).unwrap();
        assert_eq!(fresh.learned(), odd);
    }

    #[test]
    fn admission_is_strictly_fifo_within_85_percent() {
        let mut l = ledger(); // limit 85,000; reservations ≥ 20,000
        for (p, t) in [(1, 10_000), (2, 10_000), (3, 10_000), (4, 30_000), (5, 1_000)] {
            l.submit(p, t).unwrap();
        }
        // 3 × 20,000 = 60,000; the 4th (30,000) would make 90,000 > 85,000; the 5th, smaller,
        // does not jump the queue.
        assert_eq!(l.admit(), vec![1, 2, 3]);
        assert_eq!((l.admitted(), l.queued(), l.reserved()), (3, 2, 60_000));
        assert!(!l.is_admitted(5));
        // Wait forecast for a new program: (q + 1)·D / K = 3 · 600 / 3.
        assert_eq!(l.wait_forecast(1_000), 600.0);
        l.release(1).unwrap();
        // 40,000 + 30,000 = 70,000; the 5th (20,000) would make 90,000.
        assert_eq!(l.admit(), vec![4]);
        assert_eq!(l.wait_forecast(1_000), 2.0 * 600.0 / 3.0, "one queued ahead, three admitted");
        l.release(2).unwrap();
        assert_eq!(l.admit(), vec![5]);
        assert_eq!(l.reserved(), 20_000 + 30_000 + 20_000);
        assert_eq!(l.wait_forecast(1_000), 600.0 / 3.0, "nothing queued, but 20,000 more does not fit");
        l.release(3).unwrap();
        assert_eq!(l.wait_forecast(1_000), 0.0, "nothing queued and it fits now");
        assert_eq!(l.submit(4, 1), Err(LedgerError::Duplicate(4)));
        // A program above the limit is admitted alone into an empty ledger, never starved.
        let mut m = ledger();
        m.submit(9, 90_000).unwrap();
        assert_eq!(m.admit(), vec![9]);
        m.submit(10, 1).unwrap();
        assert_eq!(m.admit(), Vec::<u64>::new());
        m.withdraw(10).unwrap();
        assert_eq!(m.withdraw(10), Err(LedgerError::NotQueued(10)));
        // The per-call ceiling: 95 % of the pool.
        assert!(m.call_fits(90_000, 5_000) && !m.call_fits(90_000, 5_001));
        assert_eq!(Ledger::new(0, 1.0, 1.0, DiscConfig::default()), Err(LedgerError::Config));
    }

    #[test]
    fn the_divert_rule_never_always_and_by_the_rule() {
        // The router bound m with â = 0.8; m′ has â = 0.7.
        let (a, a_alt) = (0.8, 0.7);
        for (w, w_alt) in [(300.0, 0.0), (30.0, 0.0), (0.0, 300.0)] {
            assert!(!divert(0.0, 600.0, a, a_alt, w, w_alt), "β = 0 never diverts");
            assert_eq!(divert(1.0, 600.0, a, a_alt, w, w_alt), w_alt < w, "β = 1: the shorter wait");
        }
        // β = 0.5: 0.5·(−0.1) = −0.05 > 0.5·(0 − 300)/600 = −0.25 → divert; with a 30 s wait at
        // m, −0.05 > −0.025 fails → stay.
        assert!(divert(0.5, 600.0, a, a_alt, 300.0, 0.0));
        assert!(!divert(0.5, 600.0, a, a_alt, 30.0, 0.0));
        // The threshold: a wait gap of w₀·(1 − β)/β · 0.1 = 60 s.
        assert!(!divert(0.5, 600.0, a, a_alt, 60.0, 0.0));
        assert!(divert(0.5, 600.0, a, a_alt, 60.5, 0.0));
    }
}
