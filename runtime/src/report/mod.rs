//! Run reports: session latencies, makespan, the GPU-time breakdown and accuracy, as data that
//! serialises to the documented JSON schema, plus the GPU timeline as SVG.
//!
//! Pure computation over what a shell recorded; depends on no shell and no engine.

pub mod gpu;
pub mod timeline;

use std::collections::BTreeMap;

use serde::Serialize;

pub use gpu::{DeviceTimeline, GpuBreakdown, Segment, SegmentKind};

/// p50 / p95 / p99 of a sample (nearest-rank), seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `xs` (0 for an empty sample).
    pub fn of(xs: &[f64]) -> Self {
        if xs.is_empty() {
            return Percentiles::default();
        }
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let k = ((p / 100.0) * v.len() as f64).ceil() as usize;
            round3(v[k.clamp(1, v.len()) - 1])
        };
        Percentiles { p50: rank(50.0), p95: rank(95.0), p99: rank(99.0) }
    }
}

/// Round to milliseconds (reports are in seconds; sub-millisecond digits are noise).
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// One workflow's slice of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkflowReport {
    pub sessions_completed: usize,
    pub sessions_failed: usize,
    /// First arrival of the workflow to its last completion.
    pub makespan_s: f64,
    pub latency_s: Percentiles,
    pub gpu_seconds_per_session: GpuBreakdown,
    /// GSM8K exact-answer rate, MBPP final-tests pass rate, QMSum ROUGE-L F1 (mean over
    /// completed sessions), per the workflow's `metric`.
    pub accuracy: Option<f64>,
    pub metric: Option<String>,
}

/// The result of one run (`switchyard run --json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReport {
    pub policy: String,
    pub seed: u64,
    pub noise_seed: u64,
    pub arrival: String,
    pub pool: String,
    pub gpus: usize,
    pub sessions_total: usize,
    pub sessions_completed: usize,
    pub sessions_failed: usize,
    /// First arrival to last completion, virtual seconds.
    pub makespan_s: f64,
    pub latency_s: Percentiles,
    /// Whole-pool GPU time over the makespan divided by completed sessions; the four parts sum
    /// to gpus × makespan / sessions_completed.
    pub gpu_seconds_per_session: GpuBreakdown,
    pub gpu_seconds_total: GpuBreakdown,
    pub loads: u64,
    pub evictions: u64,
    pub llm_calls: u64,
    pub tool_calls: u64,
    pub generated_tokens: u64,
    pub prompt_tokens: u64,
    pub cached_prompt_tokens: u64,
    pub preemptions: u64,
    pub workflows: BTreeMap<String, WorkflowReport>,
    /// Why sessions failed (at most the first 20 reasons).
    pub failures: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&xs);
        assert_eq!((p.p50, p.p95, p.p99), (50.0, 95.0, 99.0));
        let p = Percentiles::of(&[3.0]);
        assert_eq!((p.p50, p.p99), (3.0, 3.0));
        assert_eq!(Percentiles::of(&[]), Percentiles::default());
    }
}
