//! What a shell records about a run ([`SessionRecord`] per session, folded into a [`SessionTally`] as it ends; [`Counters`], token work per
//! deployment, GPU timelines) and the one function that turns it into the [`RunReport`]:
//! [`build_report`]. Both shells build their report here, so a simulated and a live run of the
//! same trace report the same way.
//!
//! Pure: the report is a function of the records. Must not depend on `sim` or `live`.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::ids::SessionId;
use crate::planner::{DeploymentId, FusionChecks, PrefetchChecks, TaoChecks};
use crate::report::{
    DeviceTimeline, GpuBreakdown, Percentiles, RunReport, Segment, SegmentKind, SessionToolLog, ToolReport,
    WorkflowReport, gpu, round3,
};
use crate::workflow::WorkflowSpec;

/// One session as a shell recorded it, for the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionRecord {
    pub session: SessionId,
    /// Index of the workflow in the run's list.
    pub workflow: u32,
    pub arrived: f64,
    pub finished: Option<f64>,
    pub failed: Option<String>,
    /// When the session failed (with `failed`); the report's window and makespans cover failed
    /// sessions' ends as well as completions.
    pub failed_at: Option<f64>,
    /// [`session_score`](super::session_score) at completion (`None` without a metric or when it
    /// did not complete).
    pub score: Option<f64>,
    /// What the session's tool calls reported.
    pub tools: SessionToolLog,
}

/// Run-wide counters a shell keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Counters {
    pub llm_calls: u64,
    pub tool_calls: u64,
    pub generated_tokens: u64,
    pub prompt_tokens: u64,
    pub cached_prompt_tokens: u64,
    pub preemptions: u64,
}

impl Counters {
    /// Count a finished LLM call's tokens, and charge its token work (uncached prompt tokens +
    /// output tokens) to (deployment, workflow) in `work`, by which GPU time is attributed.
    pub fn llm_call_finished(
        &mut self,
        work: &mut TokenWork,
        deployment: DeploymentId,
        workflow: u32,
        prompt_tokens: u32,
        cached_prompt_tokens: u32,
        output_tokens: u32,
    ) {
        self.generated_tokens += u64::from(output_tokens);
        self.prompt_tokens += u64::from(prompt_tokens);
        self.cached_prompt_tokens += u64::from(cached_prompt_tokens);
        // In f64: a server's counts are a peer's numbers, and their u32 sum may overflow.
        let x = f64::from(prompt_tokens.saturating_sub(cached_prompt_tokens)) + f64::from(output_tokens);
        *work.entry((deployment, workflow)).or_insert(0.0) += x;
    }
}

/// Per-workflow token work per deployment, to attribute GPU time (paper 003 §4.3).
pub type TokenWork = BTreeMap<(DeploymentId, u32), f64>;

/// Everything [`build_report`] reads.
pub struct ReportInput<'a> {
    pub workflows: &'a [Arc<WorkflowSpec>],
    pub policy: &'a str,
    pub seed: u64,
    pub noise_seed: u64,
    pub arrival: String,
    pub pool: &'a str,
    pub gpus: usize,
    /// The sessions, each added as it ended (or, open, at the end of the run).
    pub sessions: &'a SessionTally,
    /// Sessions that could not even be instantiated: (workflow, arrival, reason).
    pub start_failures: &'a [(u32, f64, String)],
    /// Per device; resident intervals still open must be given in `open_resident`.
    pub timelines: &'a mut Vec<DeviceTimeline>,
    /// Replicas still resident at the end: (device index, deployment, since).
    pub open_resident: &'a [(u32, DeploymentId, f64)],
    pub work: &'a TokenWork,
    pub counters: Counters,
    pub loads: u64,
    pub evictions: u64,
    /// Replicas put to sleep and woken (substrate reclaim by sleep).
    pub sleeps: u64,
    pub wakes: u64,
    /// What the near-ready prefetch checks found (`PlannerState::prefetch_checks`).
    pub prefetch: PrefetchChecks,
    /// What became of the units with a fusible successor (`PlannerState::fusion_checks`).
    pub fusion: FusionChecks,
    /// What TAO's admission did (`PlannerState::tao_checks`).
    pub tao_admission: TaoChecks,
    /// The run was stopped early (Ctrl-C); the sessions still open were failed as `interrupted`.
    pub interrupted: bool,
}

/// Reason of a session that was still open (or had not arrived yet) when the run was
/// interrupted.
pub const INTERRUPTED: &str = "interrupted";

impl SessionRecord {
    /// When the session ended: its completion or its failure (`None` while it is open).
    pub fn ended(&self) -> Option<f64> {
        self.finished.or(self.failed_at)
    }
}

/// What the report needs of the sessions, folded in as each one ends, so that a shell can drop
/// a session's record once it is counted: a long run's memory grows with its sessions only by
/// one latency (8 bytes) per completed session, which the exact percentiles need. Sessions may
/// be added in any order; the report does not depend on it (the score sum is kept in fixed
/// point, so that its float rounding does not depend on the order either).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionTally {
    sessions: usize,
    completed: usize,
    /// Earliest arrival (+∞ before the first session) and latest end, completed or failed
    /// (−∞ before the first end).
    first_arrival: f64,
    last_end: f64,
    workflows: Vec<WorkflowTally>,
    /// The failed sessions with the smallest ids (at most [`LISTED_FAILURES`]), with why.
    failures: BTreeMap<SessionId, String>,
    tools: ToolReport,
}

/// How many session failures the report lists.
const LISTED_FAILURES: usize = 20;

/// Fixed-point scale of the score sum: 2⁻⁶⁴ per unit, exact for 0/1 scores and within 2⁻⁶⁴ of
/// any other score in (−2⁶³, 2⁶³).
const SCORE_SCALE: f64 = 18_446_744_073_709_551_616.0;

#[derive(Debug, Clone, PartialEq)]
struct WorkflowTally {
    sessions: usize,
    latencies: Vec<f64>,
    first_arrival: f64,
    last_end: f64,
    /// Σ score of its completed sessions, in units of 1 / [`SCORE_SCALE`].
    score_sum: i128,
}

impl Default for WorkflowTally {
    fn default() -> Self {
        WorkflowTally { sessions: 0, latencies: Vec::new(), first_arrival: f64::INFINITY, last_end: f64::NEG_INFINITY, score_sum: 0 }
    }
}

impl Default for SessionTally {
    fn default() -> Self {
        SessionTally {
            sessions: 0,
            completed: 0,
            first_arrival: f64::INFINITY,
            last_end: f64::NEG_INFINITY,
            workflows: Vec::new(),
            failures: BTreeMap::new(),
            tools: ToolReport::default(),
        }
    }
}

impl SessionTally {
    /// The tally of `records`.
    pub fn of<'r>(records: impl IntoIterator<Item = &'r SessionRecord>) -> Self {
        let mut tally = SessionTally::default();
        for r in records {
            tally.add(r);
        }
        tally
    }

    /// Count one session (once: when it ended, or at the end of the run if it is still open).
    pub fn add(&mut self, r: &SessionRecord) {
        self.sessions += 1;
        let end = r.ended();
        self.first_arrival = self.first_arrival.min(r.arrived);
        self.last_end = end.map_or(self.last_end, |e| self.last_end.max(e));
        let w = r.workflow as usize;
        if self.workflows.len() <= w {
            self.workflows.resize_with(w + 1, WorkflowTally::default);
        }
        let wf = &mut self.workflows[w];
        wf.sessions += 1;
        wf.first_arrival = wf.first_arrival.min(r.arrived);
        if let Some(e) = end {
            wf.last_end = wf.last_end.max(e);
        }
        if let Some(f) = r.finished {
            self.completed += 1;
            wf.latencies.push(f - r.arrived);
            wf.score_sum = wf.score_sum.saturating_add((r.score.unwrap_or(0.0) * SCORE_SCALE) as i128);
        }
        if let Some(why) = &r.failed {
            let listed_last = self.failures.keys().next_back().copied();
            if self.failures.len() < LISTED_FAILURES || listed_last.is_some_and(|last| r.session < last) {
                self.failures.insert(r.session, why.clone());
                if self.failures.len() > LISTED_FAILURES {
                    self.failures.pop_last();
                }
            }
        }
        self.tools.add(r.session.0, &r.tools);
    }

    /// Sessions counted.
    pub fn len(&self) -> usize {
        self.sessions
    }

    /// Whether no session was counted.
    pub fn is_empty(&self) -> bool {
        self.sessions == 0
    }
}

/// Build the run report from what a shell recorded (both shells call this); returns it with its
/// window (first arrival, last end of a session — completed or failed).
///
/// - The makespans (run and per workflow) run from the first arrival to the last session that
///   *ended*, completed or failed, so a run whose sessions fail still reports the time it took;
///   the pool's GPU time is partitioned over that window (`gpu_seconds_total`), whether or not
///   any session completed.
/// - `gpu_seconds_per_session` divides by the *completed* sessions (the cost of a useful
///   result, failures' GPU time included); with no completed session it divides by 1, i.e. it
///   equals the total (never 0 while the pool was busy). The CLI shows `-` there.
/// - Accuracy is over all the workflow's sessions: a failed session scores 0.
pub fn build_report(input: ReportInput<'_>) -> (RunReport, (f64, f64)) {
    let runs = input.sessions;
    let t0 = if runs.first_arrival.is_finite() { runs.first_arrival } else { 0.0 };
    // A served runtime folds old timeline segments; the window covers what it folded (the
    // sessions of that time may have been forgotten, `--keep-ended`).
    let t0 = input.timelines.iter().filter_map(|tl| tl.folded.as_ref()).map(|f| f.from).fold(t0, f64::min);
    let t1 = runs.last_end.max(t0);
    let t1 = input.timelines.iter().filter_map(|tl| tl.folded.as_ref()).map(|f| f.until).fold(t1, f64::max);
    for &(device, deployment, since) in input.open_resident {
        if let Some(tl) = input.timelines.get_mut(device as usize) {
            tl.segments.push(Segment {
                start: since,
                end: t1.max(since),
                kind: SegmentKind::Resident,
                deployment: deployment.0,
            });
        }
    }
    let mut total = GpuBreakdown::default();
    let mut by_dep: BTreeMap<Option<u32>, GpuBreakdown> = BTreeMap::new();
    for tl in input.timelines.iter() {
        for ((cat, dep), secs) in tl.partition(t0, t1) {
            let b = by_dep.entry(dep).or_default();
            let slot = match cat {
                gpu::Category::Loading => &mut b.loading,
                gpu::Category::Generation => &mut b.generation,
                gpu::Category::IdleResident => &mut b.idle_resident,
                gpu::Category::Other => &mut b.other,
            };
            *slot += secs;
        }
    }
    for b in by_dep.values() {
        total.add(b);
    }
    let nw = input.workflows.len();
    let mut dep_total: BTreeMap<u32, f64> = BTreeMap::new();
    let mut wf_total = vec![0.0; nw];
    for ((d, w), x) in input.work {
        *dep_total.entry(d.0).or_insert(0.0) += x;
        if let Some(t) = wf_total.get_mut(*w as usize) {
            *t += x;
        }
    }
    let all_work: f64 = wf_total.iter().sum();
    let mut wf_gpu = vec![GpuBreakdown::default(); nw];
    for (dep, b) in &by_dep {
        for (w, slot) in wf_gpu.iter_mut().enumerate() {
            let share = match dep {
                Some(d) => {
                    let dt = dep_total.get(d).copied().unwrap_or(0.0);
                    let x = input.work.get(&(DeploymentId(*d), w as u32)).copied().unwrap_or(0.0);
                    if dt > 0.0 { x / dt } else { 0.0 }
                }
                None => {
                    if all_work > 0.0 { wf_total[w] / all_work } else { 1.0 / nw as f64 }
                }
            };
            slot.add(&b.scaled(share));
        }
    }
    let latencies: Vec<f64> = runs.workflows.iter().flat_map(|w| w.latencies.iter().copied()).collect();
    let mut workflows = BTreeMap::new();
    let none = WorkflowTally::default();
    for (w, wf) in input.workflows.iter().enumerate() {
        let mine = runs.workflows.get(w).unwrap_or(&none);
        let done = mine.latencies.len();
        let lat = &mine.latencies;
        let (first, last) = (mine.first_arrival, mine.last_end);
        let failed = mine.sessions - done + input.start_failures.iter().filter(|f| f.0 as usize == w).count();
        // Over every session of the workflow: a failed one (started or not) scores 0. (From
        // +0.0: no score must print as `0.0`, not `-0.0`.)
        let accuracy = wf.metric.as_ref().map(|_| {
            let sum = 0.0 + mine.score_sum as f64 / SCORE_SCALE;
            let all = done + failed;
            if all == 0 { 0.0 } else { round3(sum / all as f64) }
        });
        let n = done.max(1) as f64;
        workflows.insert(wf.name.clone(), WorkflowReport {
            sessions_completed: done,
            sessions_failed: failed,
            makespan_s: if last.is_finite() && first.is_finite() { round3((last - first).max(0.0)) } else { 0.0 },
            latency_s: Percentiles::of(lat),
            gpu_seconds_per_session: wf_gpu[w].scaled(1.0 / n).rounded(),
            gpu_seconds_total: wf_gpu[w].rounded(),
            accuracy,
            metric: wf.metric.as_ref().map(|m| m.label()),
        });
    }
    let failures: Vec<String> = runs
        .failures
        .iter()
        .map(|(session, f)| format!("{session}: {f}"))
        .chain(input.start_failures.iter().map(|f| f.2.clone()))
        .take(LISTED_FAILURES)
        .collect();
    let n_done = runs.completed;
    let c = input.counters;
    let report = RunReport {
        policy: input.policy.to_string(),
        seed: input.seed,
        noise_seed: input.noise_seed,
        arrival: input.arrival,
        pool: input.pool.to_string(),
        gpus: input.gpus,
        sessions_total: runs.len() + input.start_failures.len(),
        sessions_completed: n_done,
        sessions_failed: runs.len() - n_done + input.start_failures.len(),
        makespan_s: round3(t1 - t0),
        latency_s: Percentiles::of(&latencies),
        gpu_seconds_per_session: total.scaled(1.0 / n_done.max(1) as f64).rounded(),
        gpu_seconds_total: total.rounded(),
        loads: input.loads,
        evictions: input.evictions,
        sleeps: input.sleeps,
        wakes: input.wakes,
        prefetch: input.prefetch,
        fusion: input.fusion,
        tao_admission: input.tao_admission,
        llm_calls: c.llm_calls,
        tool_calls: c.tool_calls,
        generated_tokens: c.generated_tokens,
        prompt_tokens: c.prompt_tokens,
        cached_prompt_tokens: c.cached_prompt_tokens,
        preemptions: c.preemptions,
        workflows,
        failures,
        interrupted: input.interrupted,
        tools: runs.tools.clone(),
        fixed_endpoint_gpus: 0,
        wasted: Default::default(),
        routing: BTreeMap::new(),
    };
    (report, (t0, t1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::tests::bundled_workflows as workflows;

    #[test]
    fn report_counts_and_accuracy_follow_the_records() {
        let wfs = workflows();
        let sessions = vec![
            SessionRecord { session: SessionId(0), workflow: 0, arrived: 0.0, finished: Some(4.0), failed: None, failed_at: None, score: Some(1.0), tools: Default::default() },
            SessionRecord { session: SessionId(1), workflow: 0, arrived: 1.0, finished: Some(3.0), failed: None, failed_at: None, score: Some(0.0), tools: Default::default() },
            SessionRecord { session: SessionId(2), workflow: 1, arrived: 0.0, finished: None, failed: Some("boom".into()), failed_at: None, score: None, tools: Default::default() },
        ];
        let mut timelines = vec![DeviceTimeline::new("A40")];
        let (r, window) = build_report(ReportInput {
            workflows: &wfs,
            policy: "joint",
            seed: 1,
            noise_seed: 0,
            arrival: "burst".into(),
            pool: "p",
            gpus: 1,
            sessions: &SessionTally::of(&sessions),
            start_failures: &[],
            timelines: &mut timelines,
            open_resident: &[(0, DeploymentId(0), 1.0)],
            work: &TokenWork::new(),
            counters: Counters { llm_calls: 5, ..Counters::default() },
            loads: 1,
            evictions: 0,
            sleeps: 0,
            wakes: 0,
            prefetch: PrefetchChecks::default(),
            fusion: FusionChecks::default(),
            tao_admission: TaoChecks::default(),
            interrupted: false,
        });
        assert_eq!(window, (0.0, 4.0));
        assert_eq!((r.sessions_total, r.sessions_completed, r.sessions_failed), (3, 2, 1));
        assert_eq!(r.makespan_s, 4.0);
        assert_eq!(r.workflows[&wfs[0].name].accuracy, Some(0.5));
        assert_eq!(r.failures, vec!["s2: boom".to_string()]);
        // One GPU over a 4 s window: 3 s resident (idle) + 1 s other.
        assert!((r.gpu_seconds_total.total() - 4.0).abs() < 1e-9);
        assert!((r.gpu_seconds_total.idle_resident - 3.0).abs() < 1e-9);
    }

    fn record(session: u32, workflow: u32, finished: Option<f64>, failed_at: Option<f64>, score: Option<f64>) -> SessionRecord {
        SessionRecord {
            session: SessionId(session),
            workflow,
            arrived: 0.0,
            finished,
            failed: failed_at.map(|_| "boom".to_string()),
            failed_at,
            score,
            tools: Default::default(),
        }
    }

    fn report_of(sessions: &[SessionRecord], segments: Vec<Segment>, start_failures: &[(u32, f64, String)]) -> (RunReport, (f64, f64)) {
        let wfs = workflows();
        let mut timelines = vec![DeviceTimeline { segments, ..DeviceTimeline::new("A40") }];
        let mut work = TokenWork::new();
        work.insert((DeploymentId(0), 0), 100.0);
        build_report(ReportInput {
            workflows: &wfs,
            policy: "joint",
            seed: 1,
            noise_seed: 0,
            arrival: "burst".into(),
            pool: "p",
            gpus: 1,
            sessions: &SessionTally::of(sessions),
            start_failures,
            timelines: &mut timelines,
            open_resident: &[],
            work: &work,
            counters: Counters::default(),
            loads: 1,
            evictions: 0,
            sleeps: 0,
            wakes: 0,
            prefetch: PrefetchChecks::default(),
            fusion: FusionChecks::default(),
            tao_admission: TaoChecks::default(),
            interrupted: false,
        })
    }

    #[test]
    fn failed_sessions_end_the_window_and_the_pool_time_is_counted_without_completions() {
        // Every session failed, the last at 6 s, after a load (0–2 s) and generation (2–5 s).
        let sessions = [record(0, 0, None, Some(3.0), None), record(1, 0, None, Some(6.0), None)];
        let segments = vec![
            Segment { start: 0.0, end: 2.0, kind: SegmentKind::Loading, deployment: 0 },
            Segment { start: 2.0, end: 5.0, kind: SegmentKind::Generating, deployment: 0 },
        ];
        let (r, window) = report_of(&sessions, segments, &[]);
        assert_eq!(window, (0.0, 6.0));
        assert_eq!(r.makespan_s, 6.0);
        assert_eq!((r.sessions_completed, r.sessions_failed), (0, 2));
        assert_eq!(r.gpu_seconds_total.loading, 2.0);
        assert_eq!(r.gpu_seconds_total.generation, 3.0);
        assert_eq!(r.gpu_seconds_total.total(), 6.0);
        // No completed session: the per-session figure is the total, not 0.
        assert_eq!(r.gpu_seconds_per_session, r.gpu_seconds_total);
        let w = &r.workflows[&workflows()[0].name];
        assert_eq!(w.makespan_s, 6.0);
        // No session completed: accuracy 0, and a plain 0 in JSON (not `-0.0`).
        assert_eq!(w.accuracy, Some(0.0));
        assert_eq!(serde_json::to_string(&w.accuracy).unwrap_or_default(), "0.0");
        assert!(w.gpu_seconds_total.total() > 0.0);
    }

    #[test]
    fn accuracy_counts_failed_sessions_as_zero_and_per_session_gpu_divides_by_completions() {
        let sessions = [
            record(0, 0, Some(4.0), None, Some(1.0)),
            record(1, 0, Some(2.0), None, Some(1.0)),
            record(2, 0, None, Some(8.0), None),
        ];
        let segments = vec![Segment { start: 0.0, end: 8.0, kind: SegmentKind::Generating, deployment: 0 }];
        // One more session of workflow 0 could not even start.
        let (r, _) = report_of(&sessions, segments, &[(0, 0.0, "s3: bad input".into())]);
        let w = &r.workflows[&workflows()[0].name];
        assert_eq!((w.sessions_completed, w.sessions_failed), (2, 2));
        assert_eq!(w.accuracy, Some(0.5), "two of four sessions scored 1");
        assert_eq!(r.makespan_s, 8.0);
        assert_eq!(r.gpu_seconds_total.generation, 8.0);
        assert_eq!(r.gpu_seconds_per_session.generation, 4.0, "8 GPU-s over 2 completed sessions");
        assert_eq!(r.failures, vec!["s2: boom".to_string(), "s3: bad input".to_string()]);
    }
}
