//! Arrival processes and the session trace: generated once from the seed, replayed identically
//! across policies (paper 003 §4.1).
//!
//! `burst` puts every session at t = 0; `poisson:RATE` draws exponential inter-arrival gaps with
//! RATE sessions per second *per workflow*. Both shells replay the same trace: the simulator in
//! virtual time, the live shell at trace time / speed. Pure; depends on rand and `values` only,
//! never on `sim` or `live`.

use std::fmt;
use std::str::FromStr;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp};
use serde::Serialize;

use crate::values::derive_seed;

/// How sessions arrive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Arrival {
    Burst,
    /// Sessions per second, per workflow.
    Poisson(f64),
}

impl fmt::Display for Arrival {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arrival::Burst => write!(f, "burst"),
            Arrival::Poisson(r) => write!(f, "poisson:{r}"),
        }
    }
}

impl FromStr for Arrival {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "burst" {
            return Ok(Arrival::Burst);
        }
        if let Some(rate) = s.strip_prefix("poisson:") {
            let r: f64 = rate.parse().map_err(|_| format!("bad Poisson rate `{rate}`"))?;
            if !(r.is_finite() && r > 0.0) {
                return Err(format!("Poisson rate must be a positive finite number of sessions per second, got `{rate}`"));
            }
            return Ok(Arrival::Poisson(r));
        }
        Err(format!("unknown arrival `{s}` (use burst or poisson:RATE)"))
    }
}

/// One session of the trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceEntry {
    pub at: f64,
    /// Index of the workflow in the run's list.
    pub workflow: u32,
    /// Index of the dataset record the session runs on.
    pub record: usize,
}

/// Build the trace: `sessions[w]` sessions of workflow `w`, records drawn without replacement (cycling when the
/// dataset is smaller), arrival times by `arrival`; sorted by time, then workflow.
pub fn trace(arrival: Arrival, sessions: &[usize], dataset_sizes: &[usize], seed: u64) -> Vec<TraceEntry> {
    trace_per_workflow(&vec![arrival; dataset_sizes.len()], sessions, dataset_sizes, seed)
}

/// [`trace`] with an arrival process per workflow (`arrivals[w]`, the last one for workflows
/// beyond the slice; burst when it is empty). Each workflow's draw depends only on its own
/// arrival, so a workflow's sessions are the same whatever the others do.
pub fn trace_per_workflow(arrivals: &[Arrival], sessions: &[usize], dataset_sizes: &[usize], seed: u64) -> Vec<TraceEntry> {
    let mut out = Vec::new();
    for (w, &size) in dataset_sizes.iter().enumerate() {
        let arrival = arrivals.get(w).or(arrivals.last()).copied().unwrap_or(Arrival::Burst);
        let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(seed, &["trace", &w.to_string()]));
        let mut order: Vec<usize> = (0..size.max(1)).collect();
        order.shuffle(&mut rng);
        let mut t = 0.0;
        let gap = match arrival {
            Arrival::Poisson(rate) => Exp::new(rate).ok(),
            Arrival::Burst => None,
        };
        for i in 0..sessions.get(w).copied().unwrap_or(0) {
            if let Some(g) = &gap {
                // The first session of each workflow arrives after one gap too (a Poisson process
                // started at 0).
                t += g.sample(&mut rng);
            }
            out.push(TraceEntry { at: t, workflow: w as u32, record: order[i % order.len()] });
        }
    }
    out.sort_by(|a, b| a.at.total_cmp(&b.at).then(a.workflow.cmp(&b.workflow)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_arrivals() {
        assert_eq!("burst".parse::<Arrival>(), Ok(Arrival::Burst));
        assert_eq!("poisson:0.15".parse::<Arrival>(), Ok(Arrival::Poisson(0.15)));
        assert!("poisson:-1".parse::<Arrival>().is_err());
        assert!("uniform".parse::<Arrival>().is_err());
    }

    #[test]
    fn same_seed_same_trace_other_seed_other_trace() {
        let a = trace(Arrival::Poisson(0.15), &[60, 60], &[100, 50], 42);
        assert_eq!(a, trace(Arrival::Poisson(0.15), &[60, 60], &[100, 50], 42));
        assert_ne!(a, trace(Arrival::Poisson(0.15), &[60, 60], &[100, 50], 43));
        assert_eq!(a.len(), 120);
        let uneven = trace(Arrival::Burst, &[3, 7], &[10, 10], 42);
        assert_eq!((uneven.iter().filter(|e| e.workflow == 0).count(), uneven.iter().filter(|e| e.workflow == 1).count()), (3, 7));
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[test]
    fn each_workflow_can_arrive_its_own_way_and_its_draw_does_not_depend_on_the_others() {
        let mixed = trace_per_workflow(&[Arrival::Burst, Arrival::Poisson(0.05)], &[10, 5], &[35, 100], 42);
        assert!(mixed.iter().filter(|e| e.workflow == 0).all(|e| e.at == 0.0));
        let mbpp: Vec<_> = mixed.iter().filter(|e| e.workflow == 1).cloned().collect();
        assert_eq!(mbpp.len(), 5);
        assert!(mbpp.iter().all(|e| e.at > 0.0));
        let alone: Vec<_> =
            trace(Arrival::Poisson(0.05), &[10, 5], &[35, 100], 42).into_iter().filter(|e| e.workflow == 1).collect();
        assert_eq!(mbpp, alone);
        // One arrival for all: the same as `trace`.
        assert_eq!(trace_per_workflow(&[Arrival::Burst], &[3, 7], &[10, 10], 1), trace(Arrival::Burst, &[3, 7], &[10, 10], 1));
    }

    #[test]
    fn poisson_rate_is_respected_and_burst_is_at_zero() {
        let a = trace(Arrival::Poisson(0.5), &[4000], &[10], 1);
        let last = a.last().unwrap().at;
        let rate = 4000.0 / last;
        assert!((rate - 0.5).abs() < 0.03, "{rate}");
        let b = trace(Arrival::Burst, &[10], &[3], 1);
        assert!(b.iter().all(|e| e.at == 0.0));
        // Records cycle without replacement: each of the 3 records used at least 3 times.
        for r in 0..3 {
            assert!(b.iter().filter(|e| e.record == r).count() >= 3);
        }
    }
}
