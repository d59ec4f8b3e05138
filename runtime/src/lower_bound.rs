//! An offline lower bound on the makespan of a trace (paper 003 §4.2 compares every policy with
//! an offline reference; ours is a provable bound rather than an optimised schedule).
//!
//! Input: what one simulated run recorded — every completed activation with its model, prompt
//! and output tokens and predecessors ([`CallRecord`]), session arrivals and modeled tool
//! durations (from the run's trace). The outputs of a trace do not depend on the policy (the
//! responders are seeded per trace seed, workflow, session, node and round), so one run gives
//! the bound for every policy on that trace.
//!
//! The bound is `max(critical path, work, per-model)`, measured from the first arrival t₀:
//!
//! - **Critical path with first loads.** Every session runs its own DAG with no contention and
//!   no queueing: an LLM call takes its batch-1 time on the fastest device that can hold its
//!   model, computed with the emulator's own iteration cost (`CostModel::iteration_time`) on
//!   the call's real token counts; a tool call takes its modeled duration. A call starts after
//!   its session arrived and its predecessors finished, and not before a replica of its model
//!   could exist: the pool starts empty at virtual time 0, so a call on model `m` starts no
//!   earlier than `min_g load_time(m, g)` (offline, loads may start before the first arrival).
//!   The bound is the latest such session finish − t₀.
//! - **Work over capacity.** The pool must spend at least `Σ_m min_g load_time(m, g)` (each model
//!   loaded once) plus, per generated token, the cheapest per-output-token cost any device can
//!   reach (an iteration over k ≤ `max_num_seqs` sequences yields at most k output tokens and
//!   costs at least k one-token sequences on an empty context). Divided over the GPUs, minus
//!   t₀ (loads may start before the first arrival).
//! - **Per model.** A model's calls cannot start before the earliest contention-free start of
//!   any of them (its release, and its shortest load), run on at most the devices that can hold
//!   the model, each producing tokens no cheaper than above, and the session of the last one
//!   still has at least the shortest contention-free tail any of its calls leaves:
//!   `min start + tokens × cost / devices + min tail`, the largest over models. (The first
//!   prefill of each unique prompt block is necessary work too; it is not counted here.)
//!
//! Each call's batch-1 time is itself a lower bound of what the emulator can do: the prefill
//! is costed as fully prefix-cached (a single new token on a cached context), a batch with
//! other sequences only costs more (every term of the iteration cost grows with the batch), and
//! chunked prefill only adds iterations. Engine noise is log-normal with σ =
//! [`ITERATION_NOISE_SIGMA`]; every LLM time is scaled by [`NOISE_MARGIN`] so that a run's
//! noise draws cannot push it below the bound (see the constant).
//!
//! The same recursion restricted to one model's calls gives the **model-path** bounds: first
//! arrival to the last finish of a call on that model (see `bench`).
//!
//! Offline analysis only: it reads the emulator's ground-truth costs and must never be used by
//! the planner. Depends on the simulator's records, the emulator's cost model and the spec
//! sheets.

use std::collections::BTreeMap;

use serde::Serialize;
use switchyard_emulator::replica::ITERATION_NOISE_SIGMA;
use switchyard_emulator::{BatchSummary, CostModel, load_time};
use switchyard_predictor::spec::{self, DeviceSpec, Dtype, ModelArch};
use thiserror::Error;

use crate::exec::{CallRecord, TraceLine};
use crate::report::round3;
use crate::sim::SimOutput;

/// Scale applied to every LLM time of the bound. The emulator multiplies each iteration by an
/// independent log-normal draw with σ = [`ITERATION_NOISE_SIGMA`] (3 %) and mean 1. A critical
/// path sums hundreds of iterations (every call generates tens to hundreds of tokens), so its
/// noise-free time is undercut by more than σ only if the mean of n ≥ 16 draws falls 4 of its
/// standard deviations (σ/√n ≤ σ/4) below 1: probability < 10⁻⁴ per path.
pub const NOISE_MARGIN: f64 = 1.0 - ITERATION_NOISE_SIGMA;

/// Trace times are rounded to milliseconds; differences of two of them may be off by this.
const TRACE_ROUNDING_S: f64 = 1e-3;

/// Why a bound could not be computed.
#[derive(Debug, Error, PartialEq)]
pub enum LowerBoundError {
    #[error("the pool has no device")]
    EmptyPool,
    #[error("call s{session}/{activation}: model `{model}`: {message}")]
    UnknownModel { session: u32, activation: u32, model: String, message: String },
    #[error("model `{0}` fits no device of the pool")]
    NoDevice(String),
    #[error("call s{session}/{activation} has no arrival in the trace")]
    NoArrival { session: u32, activation: u32 },
}

/// The bound and its parts, seconds from the first arrival.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LowerBound {
    /// `max(critical_path_s, work_s, model_s)`.
    pub makespan_s: f64,
    /// Latest contention-free session finish, with first loads.
    pub critical_path_s: f64,
    /// Total necessary GPU time over the pool's GPUs.
    pub work_s: f64,
    /// Shortest load of any model the trace uses (no LLM call can finish before it).
    pub first_load_s: f64,
    /// The largest per-model bound (see [`LowerBound::models`]).
    pub model_s: f64,
    /// Per catalogue model: the earliest contention-free start of any of its calls (release and
    /// first load), plus its generation work at the cheapest per-token cost over the devices
    /// that can hold it, plus the shortest contention-free tail any of its calls leaves in its
    /// session: its last call cannot finish sooner, nor that session's end.
    pub models: BTreeMap<String, f64>,
    /// Per catalogue model: bound on the last finish of a call on that model.
    pub paths: BTreeMap<String, f64>,
    pub sessions: usize,
    pub llm_calls: usize,
}

/// Session arrivals and modeled tool durations, read back from a run's trace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceTimes {
    pub arrivals: BTreeMap<u32, f64>,
    /// (session, activation) → seconds.
    pub tool_s: BTreeMap<(u32, u32), f64>,
}

impl TraceTimes {
    /// Arrivals and tool durations from the `arrival`, `tool_start` and `tool_done` lines.
    pub fn from_trace(trace: &[TraceLine]) -> Self {
        let mut t = TraceTimes::default();
        let mut started: BTreeMap<(u32, u32), f64> = BTreeMap::new();
        for line in trace {
            match (line.event, line.session, line.activation) {
                ("arrival", Some(s), _) => {
                    t.arrivals.entry(s).or_insert(line.t);
                }
                ("tool_start", Some(s), Some(a)) => {
                    started.insert((s, a), line.t);
                }
                ("tool_done", Some(s), Some(a)) => {
                    if let Some(t0) = started.get(&(s, a)) {
                        t.tool_s.insert((s, a), (line.t - t0 - TRACE_ROUNDING_S).max(0.0));
                    }
                }
                _ => {}
            }
        }
        // Arrival times are rounded too: never let the rounding move an arrival later.
        for v in t.arrivals.values_mut() {
            *v = (*v - TRACE_ROUNDING_S / 2.0).max(0.0);
        }
        t
    }
}

/// Cost models of one (model, dtype) on every distinct device of the pool that can hold it.
struct ModelCosts {
    on: Vec<CostModel>,
    /// Shortest cold load over those devices.
    load_s: f64,
    /// Cheapest seconds per generated token over devices and batch sizes ≤ `max_num_seqs`.
    per_token_s: f64,
    /// Devices of the pool (counted one by one) that can hold the model.
    devices: usize,
}

impl ModelCosts {
    fn new(model: &ModelArch, dtype: Dtype, devices: &[DeviceSpec], max_num_seqs: u32) -> Option<Self> {
        let mut seen: Vec<&str> = Vec::new();
        let mut on = Vec::new();
        let mut load_s = f64::INFINITY;
        for d in devices {
            if seen.contains(&d.name.as_str()) || model.param_bytes(dtype) >= d.memory_bytes {
                continue;
            }
            seen.push(&d.name);
            on.push(CostModel::for_arch(d, model, dtype));
            load_s = load_s.min(load_time(d, model, dtype));
        }
        if on.is_empty() {
            return None;
        }
        let per_token_s = on
            .iter()
            .map(|c| min_cost_per_output_token(c, max_num_seqs.max(1)))
            .fold(f64::INFINITY, f64::min);
        let devices = devices.iter().filter(|d| model.param_bytes(dtype) < d.memory_bytes).count();
        Some(ModelCosts { on, load_s, per_token_s, devices })
    }

    /// Fastest batch-1 time of a call over the devices.
    fn call_s(&self, prompt: u32, output: u32) -> f64 {
        self.on.iter().map(|c| batch1_call_time(c, prompt, output)).fold(f64::INFINITY, f64::min)
    }
}

/// Noise-free time of one request alone on a replica, with its whole prompt but the last token
/// served from the prefix cache: one iteration computing one token on `prompt − 1` cached
/// tokens (it samples the first output token), then `output − 1` decode steps.
pub fn batch1_call_time(cost: &CostModel, prompt: u32, output: u32) -> f64 {
    let prompt = prompt.max(1);
    let mut first = BatchSummary::default();
    first.add_chunk(1, prompt - 1);
    let mut t = cost.iteration_time(&first);
    for i in 0..output.max(1).saturating_sub(1) {
        let mut d = BatchSummary::default();
        d.add_decode(prompt + i);
        t += cost.iteration_time(&d);
    }
    t
}

/// `min over 1 ≤ k ≤ max_seqs of f(k) / k`, where `f(k)` is the cheaper of an iteration of `k`
/// decodes on an empty context and of `k` one-token prefills: no iteration yielding `k` output
/// tokens can cost less than `f(k)`.
pub fn min_cost_per_output_token(cost: &CostModel, max_seqs: u32) -> f64 {
    let mut best = f64::INFINITY;
    for k in 1..=max_seqs {
        let mut dec = BatchSummary::default();
        let mut pre = BatchSummary::default();
        for _ in 0..k {
            dec.add_decode(0);
            pre.add_chunk(1, 0);
        }
        let f = cost.iteration_time(&dec).min(cost.iteration_time(&pre));
        best = best.min(f / f64::from(k));
    }
    best
}

/// The bound of a run's trace on `devices` (the run's pool).
pub fn from_output(out: &SimOutput, devices: &[DeviceSpec], max_num_seqs: u32) -> Result<LowerBound, LowerBoundError> {
    compute(&out.calls, &TraceTimes::from_trace(&out.trace), devices, max_num_seqs)
}

/// The bound of completed `calls` with `times` on `devices`.
pub fn compute(
    calls: &[CallRecord],
    times: &TraceTimes,
    devices: &[DeviceSpec],
    max_num_seqs: u32,
) -> Result<LowerBound, LowerBoundError> {
    if devices.is_empty() {
        return Err(LowerBoundError::EmptyPool);
    }
    let t0 = times.arrivals.values().copied().fold(f64::INFINITY, f64::min);
    let t0 = if t0.is_finite() { t0 } else { 0.0 };
    // Cost models per (model, dtype).
    let mut models: BTreeMap<(String, Dtype), ModelCosts> = BTreeMap::new();
    for c in calls {
        let Some((name, dtype)) = &c.model else { continue };
        if models.contains_key(&(name.clone(), *dtype)) {
            continue;
        }
        let arch = spec::model(name).map_err(|e| LowerBoundError::UnknownModel {
            session: c.session,
            activation: c.activation,
            model: name.clone(),
            message: e.to_string(),
        })?;
        let costs = ModelCosts::new(&arch, *dtype, devices, max_num_seqs)
            .ok_or_else(|| LowerBoundError::NoDevice(name.clone()))?;
        models.insert((name.clone(), *dtype), costs);
    }

    // Critical paths: process calls in completion order, a topological order of each DAG.
    let mut order: Vec<&CallRecord> = calls.iter().collect();
    order.sort_by(|a, b| a.finished_at.total_cmp(&b.finished_at).then((a.session, a.activation).cmp(&(b.session, b.activation))));
    let mut finish: BTreeMap<(u32, u32), f64> = BTreeMap::new();
    // Per call: its contention-free duration; per model key: (earliest start, generation work).
    let mut duration: BTreeMap<(u32, u32), f64> = BTreeMap::new();
    let mut per_model: BTreeMap<(String, Dtype), (f64, f64)> = BTreeMap::new();
    let mut critical = t0;
    let mut paths: BTreeMap<String, f64> = BTreeMap::new();
    let mut work = 0.0;
    let mut llm_calls = 0;
    for c in &order {
        let arrival = *times
            .arrivals
            .get(&c.session)
            .ok_or(LowerBoundError::NoArrival { session: c.session, activation: c.activation })?;
        let after_preds = c
            .predecessors
            .iter()
            .filter_map(|p| finish.get(&(c.session, *p)))
            .fold(arrival, |m, &f| m.max(f));
        let end = match &c.model {
            Some((name, dtype)) => {
                let Some(m) = models.get(&(name.clone(), *dtype)) else { continue };
                llm_calls += 1;
                let tokens = f64::from(c.output_tokens.max(1)) * m.per_token_s * NOISE_MARGIN;
                work += tokens;
                let start = after_preds.max(m.load_s);
                let e = per_model.entry((name.clone(), *dtype)).or_insert((f64::INFINITY, 0.0));
                *e = (e.0.min(start), e.1 + tokens);
                let run = m.call_s(c.prompt_tokens, c.output_tokens) * NOISE_MARGIN;
                duration.insert((c.session, c.activation), run);
                let end = start + run;
                let p = paths.entry(name.clone()).or_insert(t0);
                *p = p.max(end);
                end
            }
            None => {
                let run = times.tool_s.get(&(c.session, c.activation)).copied().unwrap_or(0.0);
                duration.insert((c.session, c.activation), run);
                after_preds + run
            }
        };
        finish.insert((c.session, c.activation), end);
        critical = critical.max(end);
    }
    // Contention-free tail after each call: the longest chain of its successors' durations
    // (reverse completion order is a reverse topological order of every session's DAG).
    let mut tail: BTreeMap<(u32, u32), f64> = BTreeMap::new();
    for c in order.iter().rev() {
        let key = (c.session, c.activation);
        if !duration.contains_key(&key) {
            continue;
        }
        let after = tail.get(&key).copied().unwrap_or(0.0) + duration[&key];
        for p in &c.predecessors {
            let t = tail.entry((c.session, *p)).or_insert(0.0);
            *t = t.max(after);
        }
    }
    let mut shortest_tail: BTreeMap<(String, Dtype), f64> = BTreeMap::new();
    for c in calls {
        let Some(key) = &c.model else { continue };
        let t = tail.get(&(c.session, c.activation)).copied().unwrap_or(0.0);
        let e = shortest_tail.entry(key.clone()).or_insert(f64::INFINITY);
        *e = e.min(t);
    }
    let mut model_bounds: BTreeMap<String, f64> = BTreeMap::new();
    for (key, (start, tokens)) in &per_model {
        let Some(m) = models.get(key) else { continue };
        let bound = start + tokens / m.devices.max(1) as f64 + shortest_tail.get(key).copied().unwrap_or(0.0) - t0;
        let e = model_bounds.entry(key.0.clone()).or_insert(0.0);
        *e = e.max(bound);
    }
    let model_s = model_bounds.values().copied().fold(0.0, f64::max);
    let mut model_names: BTreeMap<&str, f64> = BTreeMap::new();
    for ((name, _), m) in &models {
        // One load per model at least (the cheapest dtype variant if several).
        let e = model_names.entry(name).or_insert(f64::INFINITY);
        *e = e.min(m.load_s);
    }
    let loads: f64 = model_names.values().sum();
    let first_load = model_names.values().copied().fold(f64::INFINITY, f64::min);
    let work_s = ((loads + work) / devices.len() as f64 - t0).max(0.0);
    let critical_path_s = critical - t0;
    let sessions = times.arrivals.len();
    Ok(LowerBound {
        makespan_s: round_down3(critical_path_s.max(work_s).max(model_s)),
        critical_path_s: round_down3(critical_path_s),
        work_s: round_down3(work_s),
        first_load_s: if first_load.is_finite() { round3(first_load) } else { 0.0 },
        model_s: round_down3(model_s),
        models: model_bounds.into_iter().map(|(k, v)| (k, round_down3(v))).collect(),
        paths: paths.into_iter().map(|(k, v)| (k, round_down3(v - t0))).collect(),
        sessions,
        llm_calls,
    })
}

/// Round down to milliseconds (a bound must not grow by rounding).
fn round_down3(x: f64) -> f64 {
    (x * 1000.0).floor() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(session: u32, activation: u32, model: Option<&str>, prompt: u32, output: u32, preds: &[u32], at: f64) -> CallRecord {
        CallRecord {
            session,
            workflow: 0,
            activation,
            node: activation,
            model: model.map(|m| (m.to_string(), Dtype::Fp16)),
            prompt_tokens: prompt,
            output_tokens: output,
            predecessors: preds.to_vec(),
            finished_at: at,
        }
    }

    fn pool() -> Vec<DeviceSpec> {
        vec![spec::device("V100-32GB").unwrap(), spec::device("A100-40GB").unwrap()]
    }

    fn times(arrivals: &[(u32, f64)], tools: &[((u32, u32), f64)]) -> TraceTimes {
        TraceTimes { arrivals: arrivals.iter().copied().collect(), tool_s: tools.iter().copied().collect() }
    }

    /// The A100's cost model for Qwen3-4B, and the pool's fastest load of it (the V100's V0
    /// engine starts faster than the A100's V1 engine, which also compiles).
    fn a100_4b() -> (CostModel, f64) {
        let (d, m) = (spec::device("A100-40GB").unwrap(), spec::model("Qwen3-4B").unwrap());
        let load = pool().iter().map(|g| load_time(g, &m, Dtype::Fp16)).fold(f64::INFINITY, f64::min);
        (CostModel::for_arch(&d, &m, Dtype::Fp16), load)
    }

    #[test]
    fn batch1_time_is_one_cached_prefill_step_plus_decodes() {
        let (c, _) = a100_4b();
        let mut first = BatchSummary::default();
        first.add_chunk(1, 99);
        let mut expect = c.iteration_time(&first);
        for ctx in 100..102 {
            let mut d = BatchSummary::default();
            d.add_decode(ctx);
            expect += c.iteration_time(&d);
        }
        assert!((batch1_call_time(&c, 100, 3) - expect).abs() < 1e-12);
        // Longer outputs and longer prompts never cost less.
        assert!(batch1_call_time(&c, 100, 50) > batch1_call_time(&c, 100, 49));
        assert!(batch1_call_time(&c, 4000, 50) > batch1_call_time(&c, 100, 50));
    }

    #[test]
    fn a_chain_adds_up_and_starts_after_the_first_load() {
        let (c, load) = a100_4b();
        // The A100 is faster than the V100 for every call here.
        let calls = [
            call(0, 0, Some("Qwen3-4B"), 200, 100, &[], 50.0),
            call(0, 1, Some("Qwen3-4B"), 400, 80, &[0], 60.0),
        ];
        let lb = compute(&calls, &times(&[(0, 0.0)], &[]), &pool(), 256).unwrap();
        let expect = load + NOISE_MARGIN * (batch1_call_time(&c, 200, 100) + batch1_call_time(&c, 400, 80));
        assert!((lb.critical_path_s - expect).abs() < 2e-3, "{} vs {expect}", lb.critical_path_s);
        assert!(lb.critical_path_s <= expect);
        assert!((lb.first_load_s - load).abs() < 1e-3);
        assert_eq!(lb.makespan_s, lb.critical_path_s);
        assert_eq!(lb.paths["Qwen3-4B"], lb.critical_path_s);
        assert_eq!(lb.llm_calls, 2);
    }

    #[test]
    fn parallel_branches_take_the_max_and_tools_add_their_duration() {
        let (c, load) = a100_4b();
        // Two independent branches joined by a tool, then a last call.
        let calls = [
            call(0, 0, Some("Qwen3-4B"), 100, 300, &[], 10.0),
            call(0, 1, Some("Qwen3-4B"), 100, 30, &[], 11.0),
            call(0, 2, None, 0, 0, &[0, 1], 12.0),
            call(0, 3, Some("Qwen3-4B"), 100, 10, &[2], 13.0),
        ];
        let lb = compute(&calls, &times(&[(0, 0.0)], &[((0, 2), 7.0)]), &pool(), 256).unwrap();
        let expect =
            load + NOISE_MARGIN * batch1_call_time(&c, 100, 300) + 7.0 + NOISE_MARGIN * batch1_call_time(&c, 100, 10);
        assert!((lb.critical_path_s - expect).abs() < 2e-3, "{} vs {expect}", lb.critical_path_s);
    }

    #[test]
    fn late_arrivals_shift_their_session_and_the_window_starts_at_the_first_arrival() {
        let (c, _) = a100_4b();
        let calls = [
            call(0, 0, Some("Qwen3-4B"), 100, 10, &[], 30.0),
            call(1, 0, Some("Qwen3-4B"), 100, 10, &[], 300.0),
        ];
        let lb = compute(&calls, &times(&[(0, 5.0), (1, 200.0)], &[]), &pool(), 256).unwrap();
        // Session 1 arrives long after every load could have finished.
        let expect = 200.0 + NOISE_MARGIN * batch1_call_time(&c, 100, 10) - 5.0;
        assert!((lb.critical_path_s - expect).abs() < 2e-3, "{} vs {expect}", lb.critical_path_s);
    }

    #[test]
    fn the_work_bound_divides_loads_and_tokens_over_the_gpus() {
        let (c, load) = a100_4b();
        let v100 = CostModel::for_arch(&spec::device("V100-32GB").unwrap(), &spec::model("Qwen3-4B").unwrap(), Dtype::Fp16);
        let per_token = min_cost_per_output_token(&c, 8).min(min_cost_per_output_token(&v100, 8));
        // Per-token cost at a full batch is far below the batch-1 cost.
        assert!(per_token < batch1_call_time(&c, 1, 2) / 4.0);
        let calls: Vec<CallRecord> =
            (0..400).map(|s| call(s, 0, Some("Qwen3-4B"), 10, 5000, &[], 1.0 + s as f64)).collect();
        let arrivals: Vec<(u32, f64)> = (0..400).map(|s| (s, 0.0)).collect();
        let lb = compute(&calls, &times(&arrivals, &[]), &pool(), 8).unwrap();
        let expect = (load + 400.0 * 5000.0 * per_token * NOISE_MARGIN) / 2.0;
        assert!((lb.work_s - expect).abs() < 2e-3, "{} vs {expect}", lb.work_s);
        assert!(lb.work_s > lb.critical_path_s, "{lb:?}");
        // The model's own bound also waits for its first load before its tokens.
        let model = load + 400.0 * 5000.0 * per_token * NOISE_MARGIN / 2.0;
        assert!((lb.model_s - model).abs() < 2e-3, "{} vs {model}", lb.model_s);
        assert_eq!(lb.makespan_s, lb.work_s.max(lb.model_s));
    }

    #[test]
    fn per_token_cost_never_beats_the_compute_roofline_of_a_full_batch() {
        let (c, _) = a100_4b();
        let one = min_cost_per_output_token(&c, 1);
        let many = min_cost_per_output_token(&c, 256);
        assert!(many < one);
        // Monotone in the batch limit.
        assert!(min_cost_per_output_token(&c, 64) >= many);
    }

    #[test]
    fn errors_name_the_problem() {
        let calls = [call(0, 0, Some("Qwen3-4B"), 1, 1, &[], 1.0)];
        assert_eq!(compute(&calls, &times(&[(0, 0.0)], &[]), &[], 8), Err(LowerBoundError::EmptyPool));
        assert_eq!(
            compute(&calls, &times(&[], &[]), &pool(), 8),
            Err(LowerBoundError::NoArrival { session: 0, activation: 0 })
        );
        let big = [call(0, 0, Some("Qwen3-14B"), 1, 1, &[], 1.0)];
        let l4 = vec![spec::device("L4").unwrap()];
        assert!(matches!(compute(&big, &times(&[(0, 0.0)], &[]), &l4, 8), Err(LowerBoundError::NoDevice(_))));
    }

    #[test]
    fn trace_times_read_arrivals_and_tool_durations() {
        let line = |t: f64, event: &'static str, s: u32, a: Option<u32>| TraceLine {
            t,
            event,
            session: Some(s),
            activation: a,
            node: None,
            replica: None,
            device: None,
            detail: None,
        };
        let trace = [
            line(1.5, "arrival", 3, None),
            line(2.0, "tool_start", 3, Some(4)),
            line(2.75, "tool_done", 3, Some(4)),
        ];
        let t = TraceTimes::from_trace(&trace);
        assert!((t.arrivals[&3] - 1.4995).abs() < 1e-9);
        assert!((t.tool_s[&(3, 4)] - 0.749).abs() < 1e-9);
    }

    #[test]
    fn a_model_only_one_device_holds_is_bounded_by_its_own_work_and_tail() {
        // Qwen3-14B's weights fit the A100 only (not the 24 GB L4): its tokens run on one GPU,
        // not two, and every session still runs a tool of 3 s after its call.
        let (a100, m) = (spec::device("A100-40GB").unwrap(), spec::model("Qwen3-14B").unwrap());
        let cost = CostModel::for_arch(&a100, &m, Dtype::Fp16);
        let per_token = min_cost_per_output_token(&cost, 8);
        let load = load_time(&a100, &m, Dtype::Fp16);
        let mut calls = Vec::new();
        let mut tools = Vec::new();
        for s in 0..200 {
            let mut c = call(s, 0, Some("Qwen3-14B"), 10, 5000, &[], 1.0 + s as f64);
            c.model = Some(("Qwen3-14B".into(), Dtype::Fp16));
            calls.push(c);
            calls.push(call(s, 1, None, 0, 0, &[0], 2.0 + s as f64));
            tools.push(((s, 1), 3.0));
        }
        let arrivals: Vec<(u32, f64)> = (0..200).map(|s| (s, 0.0)).collect();
        let pool = vec![a100.clone(), spec::device("L4").unwrap()];
        let lb = compute(&calls, &times(&arrivals, &tools), &pool, 8).unwrap();
        let expect = load + 200.0 * 5000.0 * per_token * NOISE_MARGIN + 3.0;
        assert!((lb.models["Qwen3-14B"] - expect).abs() < 2e-3, "{} vs {expect}", lb.models["Qwen3-14B"]);
        assert_eq!(lb.model_s, lb.models["Qwen3-14B"]);
        assert!(lb.model_s > lb.work_s && lb.model_s > lb.critical_path_s, "{lb:?}");
        assert_eq!(lb.makespan_s, lb.model_s);
    }
}
