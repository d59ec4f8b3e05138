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
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
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
    ArrivalStream::new(arrivals, sessions, dataset_sizes, seed).collect()
}

/// The trace of [`trace_per_workflow`], drawn as it is consumed: entry by entry in trace order
/// (time, then workflow, then draw order), holding per workflow only its generator and its
/// shuffled record order — a long run does not keep its whole trace.
#[derive(Debug, Clone)]
pub struct ArrivalStream {
    workflows: Vec<WorkflowArrivals>,
    remaining: usize,
}

#[derive(Debug, Clone)]
struct WorkflowArrivals {
    rng: ChaCha8Rng,
    order: Vec<usize>,
    gap: Option<Exp<f64>>,
    /// Sessions drawn so far and in all.
    drawn: usize,
    total: usize,
    /// The next entry, drawn ahead so that the streams can be merged by time.
    next: Option<f64>,
}

impl WorkflowArrivals {
    fn draw(&mut self, after: f64) {
        self.next = (self.drawn < self.total).then(|| match &self.gap {
            // The first session of each workflow arrives after one gap too (a Poisson process
            // started at 0).
            Some(g) => after + g.sample(&mut self.rng),
            None => after,
        });
    }
}

impl ArrivalStream {
    pub fn new(arrivals: &[Arrival], sessions: &[usize], dataset_sizes: &[usize], seed: u64) -> Self {
        let workflows: Vec<WorkflowArrivals> = dataset_sizes
            .iter()
            .enumerate()
            .map(|(w, &size)| {
                let arrival = arrivals.get(w).or(arrivals.last()).copied().unwrap_or(Arrival::Burst);
                let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(seed, &["trace", &w.to_string()]));
                let mut order: Vec<usize> = (0..size.max(1)).collect();
                order.shuffle(&mut rng);
                let gap = match arrival {
                    Arrival::Poisson(rate) => Exp::new(rate).ok(),
                    Arrival::Burst => None,
                };
                let mut stream =
                    WorkflowArrivals { rng, order, gap, drawn: 0, total: sessions.get(w).copied().unwrap_or(0), next: None };
                stream.draw(0.0);
                stream
            })
            .collect();
        let remaining = workflows.iter().map(|w| w.total).sum();
        ArrivalStream { workflows, remaining }
    }

    /// The time of the next entry, if any, without drawing it.
    pub fn peek_at(&self) -> Option<f64> {
        self.workflows.iter().filter_map(|w| w.next).min_by(f64::total_cmp)
    }

    /// Entries not drawn yet.
    pub fn remaining(&self) -> usize {
        self.remaining
    }
}

impl Iterator for ArrivalStream {
    type Item = TraceEntry;

    fn next(&mut self) -> Option<TraceEntry> {
        // The earliest next entry; on a tie the lower workflow (the order of a stable sort by
        // time, then workflow, of the workflows' draws in turn).
        let (w, at) = self
            .workflows
            .iter()
            .enumerate()
            .filter_map(|(w, s)| Some((w, s.next?)))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))?;
        let stream = &mut self.workflows[w];
        let record = stream.order[stream.drawn % stream.order.len()];
        stream.drawn += 1;
        stream.draw(at);
        self.remaining -= 1;
        Some(TraceEntry { at, workflow: w as u32, record })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
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
    fn the_stream_draws_the_trace_a_sort_of_each_workflows_draws_gives() {
        // Reference: every workflow's entries drawn in turn, then a stable sort by time, then
        // workflow (what the trace was built as before it was drawn lazily).
        let reference = |arrivals: &[Arrival], sessions: &[usize], sizes: &[usize], seed: u64| {
            let mut out = Vec::new();
            for (w, &size) in sizes.iter().enumerate() {
                let arrival = arrivals.get(w).or(arrivals.last()).copied().unwrap_or(Arrival::Burst);
                let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(seed, &["trace", &w.to_string()]));
                let mut order: Vec<usize> = (0..size.max(1)).collect();
                order.shuffle(&mut rng);
                let mut t = 0.0;
                for i in 0..sessions[w] {
                    if let Arrival::Poisson(rate) = arrival {
                        t += Exp::new(rate).unwrap().sample(&mut rng);
                    }
                    out.push(TraceEntry { at: t, workflow: w as u32, record: order[i % order.len()] });
                }
            }
            out.sort_by(|a, b| a.at.total_cmp(&b.at).then(a.workflow.cmp(&b.workflow)));
            out
        };
        let cases: [(&[Arrival], &[usize], &[usize]); 4] = [
            (&[Arrival::Poisson(0.15)], &[60, 60, 60], &[100, 50, 35]),
            (&[Arrival::Burst], &[3, 7, 0], &[10, 10, 4]),
            (&[Arrival::Burst, Arrival::Poisson(0.05)], &[10, 5], &[35, 100]),
            (&[Arrival::Poisson(2.0), Arrival::Burst, Arrival::Poisson(0.5)], &[200, 4, 50], &[3, 9, 1]),
        ];
        for (arrivals, sessions, sizes) in cases {
            for seed in [1, 42] {
                let stream = ArrivalStream::new(arrivals, sessions, sizes, seed);
                assert_eq!(stream.remaining(), sessions.iter().sum::<usize>());
                assert_eq!(stream.collect::<Vec<_>>(), reference(arrivals, sessions, sizes, seed), "{arrivals:?} {sessions:?}");
            }
        }
        let mut s = ArrivalStream::new(&[Arrival::Poisson(1.0)], &[2], &[5], 3);
        let first = s.peek_at().unwrap();
        assert_eq!(s.next().map(|e| e.at), Some(first));
        assert!(s.peek_at().unwrap() > first);
        s.next();
        assert_eq!((s.peek_at(), s.next(), s.remaining()), (None, None, 0));
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
