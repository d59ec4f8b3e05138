//! Run reports: session latencies, makespan, the GPU-time breakdown and accuracy, as data that
//! serialises to the documented JSON schema, plus the GPU timeline as SVG.
//!
//! Pure computation over what a shell recorded; depends on no shell and no engine.

pub mod gpu;
pub mod timeline;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::planner::{FusionChecks, PrefetchChecks, TaoChecks};

pub use gpu::{DeviceTimeline, GpuBreakdown, Segment, SegmentKind};

/// p50 / p95 / p99 of a sample (nearest-rank), seconds. Serialises as `{p50, p95, p99}`, or
/// as `null` when the sample was empty (no session completed: there is no such latency, and a
/// 0.0 would read as an instant one).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    /// Size of the sample the figures come from (0: none, the figures are 0 and mean nothing).
    pub samples: usize,
}

impl Percentiles {
    /// Nearest-rank percentiles of `xs` (all 0, `samples` 0, for an empty sample).
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
        Percentiles { p50: rank(50.0), p95: rank(95.0), p99: rank(99.0), samples: v.len() }
    }

    /// Whether there is a figure at all (the sample was not empty).
    pub fn is_known(&self) -> bool {
        self.samples > 0
    }

    /// p95, or NaN when no session completed (tables print `–`, changes are not computed).
    pub fn p95_or_nan(&self) -> f64 {
        if self.is_known() { self.p95 } else { f64::NAN }
    }
}

impl Serialize for Percentiles {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        if !self.is_known() {
            return serializer.serialize_none();
        }
        let mut s = serializer.serialize_struct("Percentiles", 3)?;
        s.serialize_field("p50", &self.p50)?;
        s.serialize_field("p95", &self.p95)?;
        s.serialize_field("p99", &self.p99)?;
        s.end()
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
    /// First arrival of the workflow to the last end of one of its sessions (completed or
    /// failed).
    pub makespan_s: f64,
    /// Latencies of the completed sessions.
    pub latency_s: Percentiles,
    /// The workflow's share of the pool's GPU time (`gpu_seconds_total`) per *completed*
    /// session; with none completed it equals `gpu_seconds_total` (divided by 1).
    pub gpu_seconds_per_session: GpuBreakdown,
    /// The workflow's share of the pool's GPU time over the run's window (by token work).
    pub gpu_seconds_total: GpuBreakdown,
    /// GSM8K exact-answer rate, MBPP final-tests pass rate, QMSum ROUGE-L F1, per the
    /// workflow's `metric`: the mean over *all* its sessions, a failed session scoring 0.
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
    /// First arrival to the last end of a session (completed or failed), seconds (virtual in
    /// the simulator, wall in the live runtime).
    pub makespan_s: f64,
    /// Latencies of the completed sessions.
    pub latency_s: Percentiles,
    /// Whole-pool GPU time over the makespan divided by the completed sessions (failed
    /// sessions' GPU time included); the four parts sum to gpus × makespan /
    /// max(sessions_completed, 1) — with no completed session it equals `gpu_seconds_total`.
    pub gpu_seconds_per_session: GpuBreakdown,
    /// Whole-pool GPU time over the makespan; the four parts sum to gpus × makespan.
    pub gpu_seconds_total: GpuBreakdown,
    /// Cold loads, and unloads (teardowns) issued.
    pub loads: u64,
    pub evictions: u64,
    /// Replicas put to sleep, and sleepers woken (`--sleep`).
    pub sleeps: u64,
    pub wakes: u64,
    /// What the near-ready prefetch checks found (only `joint` prefetches; zero otherwise).
    pub prefetch: PrefetchChecks,
    /// Per dispatched unit with a fusible successor (Eq. 3), whether its chain ran fused or Eq.
    /// 8 ruled it out (its envelope passes the context); only a fusing policy counts.
    pub fusion: FusionChecks,
    /// What TAO's admission did under `joint` (paper 000): DP solves, fallbacks, units granted
    /// (on a replica caching their context), holds for returning turns; zero otherwise.
    pub tao_admission: TaoChecks,
    pub llm_calls: u64,
    pub tool_calls: u64,
    pub generated_tokens: u64,
    pub prompt_tokens: u64,
    pub cached_prompt_tokens: u64,
    pub preemptions: u64,
    pub workflows: BTreeMap<String, WorkflowReport>,
    /// Why sessions failed (at most the first 20 reasons).
    pub failures: Vec<String>,
    /// The run was stopped early (Ctrl-C): the sessions still open, and those yet to arrive,
    /// are counted as failed with the reason `interrupted`.
    pub interrupted: bool,
    /// Failed tool calls with their causes, and how test verdicts were checked.
    pub tools: ToolReport,
    /// Live runs: devices served by fixed endpoints (`engine: {kind: openai}`), whose GPU time
    /// and residency are not ours to see: no loads are counted for them and their GPU time
    /// reads as empty ("other"). Omitted when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub fixed_endpoint_gpus: usize,
    /// Routed workflows (ORACLE): per workflow and model, the programs bound there and their
    /// verdicts. Omitted when nothing was routed.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub routing: BTreeMap<String, BTreeMap<String, RouteStats>>,
    /// Live runs: what engines computed for attempts that gave no answer the run used — failed
    /// or retried attempts and calls aborted with their session. Not in `prompt_tokens` /
    /// `generated_tokens`, which count answered calls. Omitted when nothing was wasted (the
    /// simulator's emulated engines never fail a call).
    #[serde(skip_serializing_if = "WastedWork::is_empty")]
    pub wasted: WastedWork,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Engine work thrown away: attempts of calls that failed, were retried or were aborted, as
/// far as their answers showed it before they ended (`live::engine::CallMeter`: a lower
/// bound — an attempt that ended before its first token counts nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WastedWork {
    /// Attempts that had produced at least their first token.
    pub attempts: u64,
    /// Their prompts (Qwen3 tokens as the runtime counts them; prefix-cache hits unknown).
    pub prompt_tokens: u64,
    /// Output tokens they streamed before they ended.
    pub output_tokens: u64,
}

impl WastedWork {
    pub fn is_empty(&self) -> bool {
        *self == WastedWork::default()
    }

    /// One ended attempt of a `prompt_tokens`-token prompt: counted if its first token came.
    pub fn add_attempt(&mut self, prefilled: bool, prompt_tokens: u32, output_tokens: u64) {
        if prefilled || output_tokens > 0 {
            self.attempts += 1;
            self.prompt_tokens += u64::from(prompt_tokens);
            self.output_tokens += output_tokens;
        }
    }

    pub fn add(&mut self, other: &WastedWork) {
        self.attempts += other.attempts;
        self.prompt_tokens += other.prompt_tokens;
        self.output_tokens += other.output_tokens;
    }
}

/// What the router did with one workflow's programs on one model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RouteStats {
    /// Programs bound to the model.
    pub programs: u64,
    /// Of those, programs DISC diverted there from the learner's choice.
    pub diverted: u64,
    /// Programs that waited for the model's ledger to admit them.
    pub gated: u64,
    /// Verdicts that landed, and how many were successes.
    pub verdicts: u64,
    pub successes: u64,
    /// Programs judged by the workflow's own verifier (the one the classifier selected, or
    /// the run's single verifier).
    pub right_verifier: u64,
    /// The programs' compute cost, billions of parameter-tokens (`exec::routing::call_cost`).
    pub cost: f64,
}

/// Largest number of failed tool calls listed one by one in a report.
pub const MAX_LISTED_TOOL_FAILURES: usize = 20;

/// One failed tool call, as the report lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolFailureRecord {
    pub session: u32,
    /// The workflow node that called the tool.
    pub node: String,
    pub tool: String,
    /// [`switchyard_tools::ToolFailureCause::name`]: `timeout`, `memory`, `tests_failed`, …
    pub cause: String,
    pub detail: String,
}

/// What one session's tool calls reported, kept by a shell while the session runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SessionToolLog {
    pub failures: Vec<ToolFailureRecord>,
    pub checked_outside: u64,
    pub untrusted: u64,
}

impl SessionToolLog {
    /// Records one tool outcome of `session` at `node`.
    pub fn record(&mut self, session: u32, node: &str, tool: &str, outcome: &switchyard_tools::ToolOutcome) {
        self.checked_outside += u64::from(outcome.checks.outside);
        self.untrusted += u64::from(outcome.checks.untrusted);
        if let Some(failure) = &outcome.failure {
            self.failures.push(ToolFailureRecord {
                session,
                node: node.to_string(),
                tool: tool.to_string(),
                cause: failure.cause.name().to_string(),
                detail: failure.detail.clone(),
            });
        }
    }
}

/// The run's tool calls in the report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ToolReport {
    /// Failed tool calls by cause.
    pub failures_by_cause: BTreeMap<String, u64>,
    /// The first [`MAX_LISTED_TOOL_FAILURES`] failed calls, by session, then call order.
    pub failures: Vec<ToolFailureRecord>,
    /// Test checks decided outside the sandbox (the sandboxed code could not forge them).
    pub checks_outside_sandbox: u64,
    /// Test checks whose outcome the sandboxed code reported itself (asserts that could not be
    /// split into a value and an expectation).
    pub checks_untrusted: u64,
}

impl ToolReport {
    /// Aggregates the sessions' logs, in session order whatever the order given.
    #[cfg(test)]
    pub fn collect<'a>(logs: impl IntoIterator<Item = (u32, &'a SessionToolLog)>) -> Self {
        let mut report = ToolReport::default();
        for (session, log) in logs {
            report.add(session, log);
        }
        report
    }

    /// The text report's line for tool calls whose verdict is not a pass — an error (a
    /// timeout, a crash) or a result (an MBPP candidate failing its tests) — by cause, most
    /// frequent first (`tool calls not passed: 3 of 7 (timeout 2, crashed 1)`); `None` when
    /// every call passed.
    /// `calls` is the run's tool calls.
    pub fn failed_line(&self, calls: u64) -> Option<String> {
        let failed: u64 = self.failures_by_cause.values().sum();
        if failed == 0 {
            return None;
        }
        let mut causes: Vec<(&String, &u64)> = self.failures_by_cause.iter().collect();
        causes.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let by_cause: Vec<String> = causes.iter().map(|(c, n)| format!("{c} {n}")).collect();
        let listed = if failed > MAX_LISTED_TOOL_FAILURES as u64 {
            format!("the first {MAX_LISTED_TOOL_FAILURES} are listed")
        } else {
            "each is listed".to_string()
        };
        Some(format!("tool calls not passed: {failed} of {} ({}); {listed} in --json's `tools.failures`", calls.max(failed), by_cause.join(", ")))
    }

    /// Add one session's log. Sessions may come in any order (a shell adds each as it ends):
    /// the listed failures stay the first [`MAX_LISTED_TOOL_FAILURES`] by session, then call
    /// order — a failure cut from the list has a larger key than every one kept, and the kept
    /// set only moves towards smaller keys, so what is cut is never needed again.
    pub fn add(&mut self, session: u32, log: &SessionToolLog) {
        self.checks_outside_sandbox += log.checked_outside;
        self.checks_untrusted += log.untrusted;
        for failure in &log.failures {
            *self.failures_by_cause.entry(failure.cause.clone()).or_default() += 1;
        }
        let at = self.failures.partition_point(|f| f.session <= session);
        if at >= MAX_LISTED_TOOL_FAILURES || log.failures.is_empty() {
            return;
        }
        let room = MAX_LISTED_TOOL_FAILURES - at;
        let tail = self.failures.split_off(at);
        self.failures.extend(log.failures.iter().take(room).cloned());
        let room = MAX_LISTED_TOOL_FAILURES - self.failures.len();
        self.failures.extend(tail.into_iter().take(room));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(session: u32, cause: &str) -> ToolFailureRecord {
        ToolFailureRecord { session, node: "test".into(), tool: "python_tests".into(), cause: cause.into(), detail: String::new() }
    }

    #[test]
    fn failed_tool_calls_make_one_line_by_cause() {
        assert_eq!(ToolReport::default().failed_line(9), None);
        let a = SessionToolLog { failures: vec![failure(0, "timeout"), failure(0, "crashed"), failure(0, "timeout")], ..Default::default() };
        let report = ToolReport::collect([(0, &a)]);
        let line = report.failed_line(7).unwrap_or_default();
        assert!(line.starts_with("tool calls not passed: 3 of 7 (timeout 2, crashed 1); "), "{line}");
    }

    #[test]
    fn tool_report_counts_causes_in_session_order_and_caps_the_list() {
        let a = SessionToolLog { failures: vec![failure(1, "timeout"); 15], checked_outside: 3, untrusted: 1 };
        let b = SessionToolLog { failures: vec![failure(0, "tests_failed"); 10], checked_outside: 2, untrusted: 0 };
        let report = ToolReport::collect([(1, &a), (0, &b)]);
        assert_eq!(report.failures_by_cause, BTreeMap::from([("tests_failed".into(), 10), ("timeout".into(), 15)]));
        assert_eq!(report.failures.len(), MAX_LISTED_TOOL_FAILURES);
        assert_eq!(report.failures[0].session, 0, "session 0 first");
        assert_eq!(report.failures[10].session, 1);
        assert_eq!((report.checks_outside_sandbox, report.checks_untrusted), (5, 1));
    }

    #[test]
    fn tool_report_lists_the_same_failures_whatever_order_the_sessions_end_in() {
        let log = |session: u32, n: usize| SessionToolLog {
            failures: (0..n).map(|i| ToolFailureRecord { detail: i.to_string(), ..failure(session, "timeout") }).collect(),
            checked_outside: 1,
            untrusted: 0,
        };
        let logs: Vec<(u32, SessionToolLog)> = [(3, 4), (0, 0), (7, 9), (1, 6), (5, 12), (2, 1)].iter().map(|&(s, n)| (s, log(s, n))).collect();
        let mut sorted = logs.clone();
        sorted.sort_by_key(|(s, _)| *s);
        let in_order = ToolReport::collect(sorted.iter().map(|(s, l)| (*s, l)));
        assert_eq!(in_order.failures.len(), MAX_LISTED_TOOL_FAILURES);
        let keys: Vec<(u32, String)> = in_order.failures.iter().map(|f| (f.session, f.detail.clone())).collect();
        assert_eq!(keys[..5].iter().map(|k| k.0).collect::<Vec<_>>(), vec![1, 1, 1, 1, 1]);
        assert_eq!(keys.last(), Some(&(5, "8".to_string())), "1×6, 2×1, 3×4, then 9 of session 5's 12: cut at 20");
        // Every order of ending gives the same report.
        for rotation in 0..logs.len() {
            let mut order = logs.clone();
            order.rotate_left(rotation);
            if rotation % 2 == 1 {
                order.reverse();
            }
            assert_eq!(ToolReport::collect(order.iter().map(|(s, l)| (*s, l))), in_order, "rotation {rotation}");
        }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&xs);
        assert_eq!((p.p50, p.p95, p.p99), (50.0, 95.0, 99.0));
        let p = Percentiles::of(&[3.0]);
        assert_eq!((p.p50, p.p99), (3.0, 3.0));
        assert_eq!(Percentiles::of(&[]), Percentiles::default());
    }

    #[test]
    fn percentiles_of_nothing_serialise_as_null() {
        let none = serde_json::to_value(Percentiles::of(&[])).unwrap();
        assert!(none.is_null(), "no completed session has no latency, not 0.0: {none}");
        let some = serde_json::to_value(Percentiles::of(&[1.0, 2.0])).unwrap();
        assert_eq!(some, serde_json::json!({"p50": 1.0, "p95": 2.0, "p99": 2.0}));
    }
}
