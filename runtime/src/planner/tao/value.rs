//! TAO session evaluation (paper 000 §3.2–3.4, Appendix A): what one agent session is worth on
//! one replica, as the lexicographic triplet v_{i,b} = (k_{i,b}, r_i, t_i) of Eq. 2.
//!
//! Owns: the evaluation constants; the time-aware KV-cache credit k_{i,b}(t) (Eq. 4); the
//! historical tool-duration estimator D̂_f (Eq. 8, [`ToolHistory`]) and the remaining-time
//! estimate d̂_i(t) (Eq. 5); tool-return readiness r_i(t) (Eq. 6, [`readiness`]) of a session's
//! outstanding [`ToolCall`]; the [`Value`] triplet and the plan [`Objective`] (the componentwise
//! sum of the embedded values u_{i,b} of Eq. 7).
//!
//! Must not depend on: the decision side ([`super::dp`]), any shell, the emulator or the tools
//! crate. No I/O, no clock (`now` is always an argument), no randomness: every function here is a
//! pure function of its inputs, so the same snapshot always evaluates to the same values.

use std::collections::BTreeMap;

use super::TaoError;

/// h of Eq. 4: cache credit halves every 10 s after its observation.
pub const HALF_LIFE_S: f64 = 10.0;
/// H of Eq. 6: a session is ready if its tool is predicted to return within one second.
pub const HORIZON_S: f64 = 1.0;
/// g_i(t) of Eq. 6: a prediction is valid only if refreshed within the last 30 s.
pub const FRESHNESS_S: f64 = 30.0;
/// The predictor's duration when neither tool-specific nor global history exists (Appendix A).
pub const DEFAULT_TOOL_S: f64 = 5.0;
/// δ of Eq. 8.
pub const MARGIN_DELTA: f64 = 0.2;
/// The overdue-probe period of Eq. 6 (b_i(t)): an overdue call (z_i(t) ≤ t, no observed
/// completion) is ready for one horizon H at the moment it becomes overdue and then again for one
/// horizon H every `PROBE_PERIOD_S`, i.e. b_i(t) = 1[(t − z_i) mod PROBE_PERIOD_S < H]. Overdue
/// sessions thus get temporary probe opportunities instead of staying ready forever (§3.4). The
/// paper names the mechanism but not its period; 10 s (one half-life h) is our choice.
pub const PROBE_PERIOD_S: f64 = 10.0;

/// The decayed cache credit k_{i,b}(t) = k⁰_{i,b} · 2^(−τ/h), τ = max(0, t − t_obs) (Eq. 4),
/// rounded to the nearest token (ties away from zero). `observed_tokens` is k⁰, the cached-token
/// count observed on the replica at `observed_at`.
///
/// Degenerate inputs are given a meaning rather than an error: an observation from the future
/// counts as fresh (τ clips at 0); a `NaN` time means no usable evidence (credit 0); a half-life
/// that is not positive decays instantly (full credit only at τ = 0); an infinite one never decays.
pub fn decayed_credit(observed_tokens: u64, observed_at: f64, now: f64, half_life_s: f64) -> u64 {
    let age = now - observed_at;
    if age.is_nan() || half_life_s.is_nan() {
        return 0;
    }
    let tau = age.max(0.0);
    if tau == 0.0 {
        return observed_tokens;
    }
    if half_life_s <= 0.0 {
        return 0;
    }
    let credit = (observed_tokens as f64 * (-tau / half_life_s).exp2()).round();
    // `as` saturates; the decay factor is ≤ 1, so this never exceeds the observation.
    (credit as u64).min(observed_tokens)
}

/// The remaining-duration estimate d̂_i(t) = max{0, D̂ − e_i(t)} of Eq. 5, for an estimated
/// duration D̂ and an elapsed time e_i(t).
pub fn remaining_s(duration_s: f64, elapsed_s: f64) -> f64 {
    (duration_s - elapsed_s).max(0.0)
}

/// Summary statistics of completed tool-call durations: count n, mean d̄, sample variance s²
/// (Welford's update), and the observed range R = max − min (Appendix A).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DurationStats {
    count: u64,
    mean: f64,
    /// Σ (x − mean)², maintained by Welford's update.
    m2: f64,
    min: f64,
    max: f64,
}

impl DurationStats {
    /// Add one completed duration. The caller ([`ToolHistory::observe`]) has checked that it is
    /// finite and non-negative.
    fn push(&mut self, d: f64) {
        if self.count == 0 {
            self.min = d;
            self.max = d;
        } else {
            self.min = self.min.min(d);
            self.max = self.max.max(d);
        }
        self.count += 1;
        let delta = d - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (d - self.mean);
    }

    /// n_f, the number of completed calls summarised.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// d̄_f, the mean duration (0 when empty).
    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// s²_f, the sample variance (divisor n − 1; 0 for fewer than two samples).
    pub fn variance(&self) -> f64 {
        if self.count < 2 { 0.0 } else { (self.m2 / (self.count - 1) as f64).max(0.0) }
    }

    /// R_f = max − min, the observed duration range (0 when empty).
    pub fn range(&self) -> f64 {
        if self.count == 0 { 0.0 } else { self.max - self.min }
    }

    /// D̂_f of Eq. 8: d̄ for n = 1, and for n ≥ 2 the finite-sample upper estimate
    /// d̄ + √(2 s² ln(3/δ) / n) + 3 R ln(3/δ) / n; `None` without history.
    pub fn upper_estimate(&self, delta: f64) -> Option<f64> {
        match self.count {
            0 => None,
            1 => Some(self.mean),
            n => {
                let n = n as f64;
                let log = (3.0 / delta).ln();
                Some(self.mean + (2.0 * self.variance() * log / n).sqrt() + 3.0 * self.range() * log / n)
            }
        }
    }
}

/// Where a duration estimate came from, in the predictor's order of preference (Appendix A).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EstimateSource {
    /// The history of this structured tool name f.
    Tool,
    /// The global history of completed calls (the tool's own history is empty).
    Global,
    /// No history at all: [`DEFAULT_TOOL_S`].
    Default,
}

/// A duration estimate D̂ and its source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DurationEstimate {
    pub duration_s: f64,
    pub source: EstimateSource,
}

/// Completed-call duration statistics keyed by structured tool name, plus the global statistics
/// over all tools (Appendix A). A `BTreeMap`, so that nothing depends on hash order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolHistory {
    per_tool: BTreeMap<String, DurationStats>,
    global: DurationStats,
}

impl ToolHistory {
    pub fn new() -> Self {
        Self::default()
    }

    /// Record one completed call of `tool` that took `duration_s` seconds.
    pub fn observe(&mut self, tool: &str, duration_s: f64) -> Result<(), TaoError> {
        if !duration_s.is_finite() || duration_s < 0.0 {
            return Err(TaoError::InvalidDuration { tool: tool.to_string(), duration_s });
        }
        match self.per_tool.get_mut(tool) {
            Some(s) => s.push(duration_s),
            None => {
                let mut s = DurationStats::default();
                s.push(duration_s);
                self.per_tool.insert(tool.to_string(), s);
            }
        }
        self.global.push(duration_s);
        Ok(())
    }

    /// The statistics of one tool, if it has completed at least once.
    pub fn tool(&self, tool: &str) -> Option<&DurationStats> {
        self.per_tool.get(tool)
    }

    /// The statistics over all completed calls.
    pub fn global(&self) -> &DurationStats {
        &self.global
    }

    /// D̂ for a call of `tool` (Eq. 8): the tool-specific history first, then the global history,
    /// then the five-second default.
    pub fn estimate(&self, tool: &str) -> DurationEstimate {
        if let Some(d) = self.per_tool.get(tool).and_then(|s| s.upper_estimate(MARGIN_DELTA)) {
            return DurationEstimate { duration_s: d, source: EstimateSource::Tool };
        }
        if let Some(d) = self.global.upper_estimate(MARGIN_DELTA) {
            return DurationEstimate { duration_s: d, source: EstimateSource::Global };
        }
        DurationEstimate { duration_s: DEFAULT_TOOL_S, source: EstimateSource::Default }
    }
}

/// A published prediction of when a tool call completes: the predicted completion time and the
/// time it was made (its timestamp for the freshness check g_i of Eq. 6).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    pub completion_at: f64,
    pub made_at: f64,
    pub source: EstimateSource,
}

/// The outstanding tool call of a session waiting in the pool P.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The structured tool name f.
    pub tool: String,
    pub started_at: f64,
    /// An exposed return deadline: a tool's own timing hint, or `started_at + N` for a parsed
    /// `sleep N` (direct timing evidence, §3.4).
    pub deadline: Option<f64>,
    /// When the call's completion was observed (o_i = 1).
    pub completed_at: Option<f64>,
    /// The predictor's last published prediction; `None` until one is made.
    pub prediction: Option<Prediction>,
}

impl ToolCall {
    pub fn new(tool: impl Into<String>, started_at: f64) -> Self {
        Self { tool: tool.into(), started_at, deadline: None, completed_at: None, prediction: None }
    }

    /// Add an exposed return deadline (absolute time); with several, the earliest counts.
    pub fn with_deadline(mut self, at: f64) -> Self {
        if !at.is_nan() {
            self.deadline = Some(self.deadline.map_or(at, |d| d.min(at)));
        }
        self
    }

    /// Add the deadline of a `sleep N` the call runs: `started_at + N`.
    pub fn with_sleep(self, seconds: f64) -> Self {
        let at = self.started_at + seconds;
        self.with_deadline(at)
    }

    /// Add the deadline of the first `sleep` in a shell command line, if it has one
    /// ([`parse_sleep_s`]).
    pub fn with_command(self, command: &str) -> Self {
        match parse_sleep_s(command) {
            Some(s) => self.with_sleep(s),
            None => self,
        }
    }

    /// e_i(t), the elapsed time of the call (0 before it starts).
    pub fn elapsed_s(&self, now: f64) -> f64 {
        (now - self.started_at).max(0.0)
    }

    /// The remaining time until the call returns: 0 once completed; with an exposed deadline,
    /// the time left until it (direct timing evidence takes precedence); otherwise Eq. 5 on the
    /// history estimate, max{0, D̂_f − e_i(t)}.
    pub fn remaining_s(&self, history: &ToolHistory, now: f64) -> f64 {
        if self.completed_at.is_some() {
            return 0.0;
        }
        if let Some(d) = self.deadline {
            return (d - now).max(0.0);
        }
        remaining_s(history.estimate(&self.tool).duration_s, self.elapsed_s(now))
    }

    /// The history prediction the predictor would publish at `now`: completion at
    /// t + d̂_i(t) = max(t, started_at + D̂_f), made at t.
    pub fn predict(&self, history: &ToolHistory, now: f64) -> Prediction {
        let est = history.estimate(&self.tool);
        let completion_at = now + remaining_s(est.duration_s, self.elapsed_s(now));
        Prediction { completion_at, made_at: now, source: est.source }
    }

    /// Publish [`ToolCall::predict`]'s prediction on the call.
    pub fn refresh(&mut self, history: &ToolHistory, now: f64) {
        self.prediction = Some(self.predict(history, now));
    }
}

/// The seconds of the first `sleep` command in a shell command line: `sleep 5`, `sleep 0.5`,
/// `/bin/sleep 2s; make`, `sleep 1m 30s` (GNU sleep sums its arguments; suffixes s, m, h, d).
/// `None` if there is no `sleep` with a finite, non-negative duration.
pub fn parse_sleep_s(command: &str) -> Option<f64> {
    let tokens: Vec<&str> =
        command.split(|c: char| c.is_whitespace() || ";&|()`".contains(c)).filter(|t| !t.is_empty()).collect();
    for (i, t) in tokens.iter().enumerate() {
        if *t != "sleep" && !t.ends_with("/sleep") {
            continue;
        }
        let mut total = 0.0;
        let mut any = false;
        for arg in &tokens[i + 1..] {
            match parse_duration(arg) {
                Some(s) => {
                    total += s;
                    any = true;
                }
                None => break,
            }
        }
        if any && total.is_finite() {
            return Some(total);
        }
    }
    None
}

/// One `sleep` argument: a non-negative decimal number with an optional unit suffix.
fn parse_duration(arg: &str) -> Option<f64> {
    let (num, unit) = match arg.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&arg[..i], c),
        _ => (arg, 's'),
    };
    if num.is_empty() || !num.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    let x: f64 = num.parse().ok()?;
    let scale = match unit {
        's' => 1.0,
        'm' => 60.0,
        'h' => 3600.0,
        'd' => 86_400.0,
        _ => return None,
    };
    Some(x * scale)
}

/// The overdue-probe indicator b_i(t) of Eq. 6 for a call overdue by `overdue_s` = t − z_i ≥ 0:
/// ready for one horizon H at the start of every probe period ([`PROBE_PERIOD_S`]).
pub fn overdue_probe(overdue_s: f64) -> bool {
    overdue_s >= 0.0 && overdue_s % PROBE_PERIOD_S < HORIZON_S
}

/// Tool-return readiness r_i(t) of Eq. 6 for a session whose outstanding tool call is `call`:
///
/// - observed completion (o_i = 1) → ready; it takes precedence over prediction checks;
/// - z_i(t) = the earlier of the predicted completion and the exposed return deadline, an
///   unavailable one counting as +∞. The prediction is the call's published one, or, if none
///   has been published, the history prediction made at `now` ([`ToolCall::predict`]);
/// - a_i(t), an established candidate with an eligible prediction source: the call has started
///   (started_at ≤ t) and has direct timing evidence (a deadline) or a history-based prediction
///   (tool-specific or global). The five-second default carries no evidence about this call: it
///   serves the remaining-time estimate but makes no session ready;
/// - g_i(t), a valid timestamp refreshed within [`FRESHNESS_S`]: the prediction was made at most
///   30 s ago (and not in the future). An exposed deadline is a fact, not a refreshed estimate,
///   so it is always valid;
/// - overdue (z_i ≤ t): r = a_i · b_i(t) ([`overdue_probe`]); otherwise r = a_i g_i 1[z_i ≤ t + H].
pub fn readiness(call: &ToolCall, history: &ToolHistory, now: f64) -> bool {
    if call.completed_at.is_some() {
        return true;
    }
    // Not started yet (or a NaN time): not an established candidate.
    if call.started_at.partial_cmp(&now).is_none_or(|o| o == std::cmp::Ordering::Greater) {
        return false;
    }
    let prediction = call.prediction.unwrap_or_else(|| call.predict(history, now));
    let predicted = prediction.source != EstimateSource::Default;
    let deadline = call.deadline.unwrap_or(f64::INFINITY);
    let from_prediction = if predicted { prediction.completion_at } else { f64::INFINITY };
    let eligible = predicted || call.deadline.is_some();
    if !eligible {
        return false;
    }
    let (z, valid) = if deadline <= from_prediction {
        (deadline, true)
    } else {
        let age = now - prediction.made_at;
        (from_prediction, (0.0..=FRESHNESS_S).contains(&age))
    };
    if z <= now {
        return overdue_probe(now - z);
    }
    valid && z <= now + HORIZON_S
}

/// The assignment value v_{i,b} = (k_{i,b}, r_i, t_i) of Eq. 2: decayed cache credit on the
/// replica, binary readiness, token count. Compared lexicographically (the derived order follows
/// the field order) — never as a weighted sum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Value {
    pub credit: u64,
    pub ready: bool,
    pub tokens: u64,
}

/// The plan objective Σ u_{i,b} of Eq. 7: the componentwise sums of the embedded values
/// u_{i,b} = (k_{i,b}, r_i, t_i, 1) of the admitted assignments, compared lexicographically
/// (credit, then ready count, then tokens, then the number admitted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Objective {
    pub credit_sum: u64,
    pub ready_count: u64,
    pub token_sum: u64,
    pub admitted_count: u64,
}

impl Objective {
    pub const ZERO: Objective = Objective { credit_sum: 0, ready_count: 0, token_sum: 0, admitted_count: 0 };

    /// u_{i,b}: one admitted assignment of value `v`.
    pub fn embed(v: Value) -> Self {
        Objective { credit_sum: v.credit, ready_count: u64::from(v.ready), token_sum: v.tokens, admitted_count: 1 }
    }

    /// This objective plus one more admitted assignment of value `v` (saturating; the solver
    /// checks its input's sums against its exact range first).
    pub fn plus(self, v: Value) -> Self {
        Objective {
            credit_sum: self.credit_sum.saturating_add(v.credit),
            ready_count: self.ready_count.saturating_add(u64::from(v.ready)),
            token_sum: self.token_sum.saturating_add(v.tokens),
            admitted_count: self.admitted_count.saturating_add(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_halves_every_half_life_and_rounds_to_nearest() {
        assert_eq!(decayed_credit(1000, 0.0, 0.0, HALF_LIFE_S), 1000);
        assert_eq!(decayed_credit(1000, 0.0, 10.0, HALF_LIFE_S), 500);
        assert_eq!(decayed_credit(1000, 0.0, 20.0, HALF_LIFE_S), 250);
        // 1000 · 2^(−0.5) = 707.107 → 707; 3 · 2^(−1) = 1.5 → 2 (ties away from zero).
        assert_eq!(decayed_credit(1000, 0.0, 5.0, HALF_LIFE_S), 707);
        assert_eq!(decayed_credit(3, 0.0, 10.0, HALF_LIFE_S), 2);
        // τ clips at 0 for an observation stamped after `now`.
        assert_eq!(decayed_credit(1000, 12.0, 10.0, HALF_LIFE_S), 1000);
        assert_eq!(decayed_credit(1000, f64::NAN, 10.0, HALF_LIFE_S), 0);
        assert_eq!(decayed_credit(1000, 0.0, 1.0, 0.0), 0);
        assert_eq!(decayed_credit(u64::MAX, 0.0, 0.5, f64::INFINITY), u64::MAX);
    }

    #[test]
    fn welford_statistics_match_a_direct_computation() {
        let xs = [2.0, 4.0, 4.0, 5.0, 9.5];
        let mut s = DurationStats::default();
        for x in xs {
            s.push(x);
        }
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
        assert_eq!(s.count(), 5);
        assert!((s.mean() - mean).abs() < 1e-12);
        assert!((s.variance() - var).abs() < 1e-12);
        assert_eq!(s.range(), 7.5);
    }

    #[test]
    fn eq8_matches_a_hand_computation() {
        // Durations 1, 2, 3 s: n = 3, d̄ = 2, s² = 1, R = 2, δ = 0.2, ln(3/δ) = ln 15 = 2.708050.
        // D̂ = 2 + √(2·1·2.708050/3) + 3·2·2.708050/3 = 2 + 1.343639 + 5.416100 = 8.759740.
        let mut h = ToolHistory::new();
        for d in [1.0, 2.0, 3.0] {
            h.observe("bash", d).unwrap();
        }
        let e = h.estimate("bash");
        assert_eq!(e.source, EstimateSource::Tool);
        assert!((e.duration_s - 8.759740).abs() < 1e-6, "{}", e.duration_s);
        // n = 1: the mean itself.
        h.observe("edit", 0.25).unwrap();
        assert_eq!(h.estimate("edit"), DurationEstimate { duration_s: 0.25, source: EstimateSource::Tool });
        // An unseen tool falls back to the global history of all four calls:
        // d̄ = 1.5625, s² = 1.4322917, R = 2.75, n = 4:
        // 1.5625 + √(2·1.4322917·2.708050/4) + 3·2.75·2.708050/4 = 1.5625 + 1.392609 + 5.585354.
        let g = h.estimate("pytest");
        assert_eq!(g.source, EstimateSource::Global);
        assert!((g.duration_s - 8.540462).abs() < 1e-6, "{}", g.duration_s);
        // No history at all: the five-second default.
        let e = ToolHistory::new().estimate("bash");
        assert_eq!(e, DurationEstimate { duration_s: DEFAULT_TOOL_S, source: EstimateSource::Default });
    }

    #[test]
    fn bad_durations_are_typed_errors() {
        let mut h = ToolHistory::new();
        assert!(matches!(h.observe("x", -1.0), Err(TaoError::InvalidDuration { .. })));
        assert!(matches!(h.observe("x", f64::NAN), Err(TaoError::InvalidDuration { .. })));
        assert_eq!(h.global().count(), 0);
    }

    #[test]
    fn remaining_time_clips_at_zero() {
        assert_eq!(remaining_s(5.0, 2.0), 3.0);
        assert_eq!(remaining_s(5.0, 7.0), 0.0);
        let h = ToolHistory::new();
        let c = ToolCall::new("bash", 10.0);
        assert_eq!(c.remaining_s(&h, 12.0), 3.0);
        assert_eq!(c.clone().with_sleep(1.0).remaining_s(&h, 12.0), 0.0);
    }

    #[test]
    fn sleep_commands_are_parsed() {
        assert_eq!(parse_sleep_s("sleep 5"), Some(5.0));
        assert_eq!(parse_sleep_s("cd /x && sleep 0.5; make"), Some(0.5));
        assert_eq!(parse_sleep_s("/bin/sleep 2s"), Some(2.0));
        assert_eq!(parse_sleep_s("sleep 1m 30s"), Some(90.0));
        assert_eq!(parse_sleep_s("sleep infinity"), None);
        assert_eq!(parse_sleep_s("echo sleepy 3"), None);
        let c = ToolCall::new("bash", 100.0).with_command("sleep 3 && ls");
        assert_eq!(c.deadline, Some(103.0));
    }

    #[test]
    fn readiness_follows_eq6() {
        let mut h = ToolHistory::new();
        // Without history or deadline there is no eligible prediction source.
        let c = ToolCall::new("bash", 0.0);
        assert!(!readiness(&c, &h, 4.5));
        // Observed completion takes precedence.
        let done = ToolCall { completed_at: Some(1.0), ..c.clone() };
        assert!(readiness(&done, &h, 1.0));
        // A deadline 3 s after the start: ready within H before it, then overdue probes.
        let d = c.clone().with_sleep(3.0);
        assert!(!readiness(&d, &h, 1.5));
        assert!(readiness(&d, &h, 2.0));
        assert!(readiness(&d, &h, 3.5)); // overdue by 0.5 s < H
        assert!(!readiness(&d, &h, 5.0)); // overdue, between probes
        assert!(readiness(&d, &h, 13.2)); // the next probe window
        assert!(!readiness(&d, &h, 14.5));
        // A history prediction: D̂ = 2 s (one sample) → z = 2.
        h.observe("bash", 2.0).unwrap();
        assert!(!readiness(&c, &h, 0.5));
        assert!(readiness(&c, &h, 1.2));
        // A published prediction goes stale after 30 s without refresh.
        let mut long = ToolCall::new("bash", 0.0);
        long.prediction = Some(Prediction { completion_at: 60.0, made_at: 0.0, source: EstimateSource::Tool });
        assert!(!readiness(&long, &h, 59.5));
        long.prediction = Some(Prediction { completion_at: 60.0, made_at: 40.0, source: EstimateSource::Tool });
        assert!(readiness(&long, &h, 59.5));
        // A call that has not started is not a candidate.
        assert!(!readiness(&ToolCall::new("bash", 10.0).with_sleep(0.5), &h, 9.8));
    }

    #[test]
    fn values_compare_lexicographically() {
        let a = Value { credit: 1, ready: false, tokens: 0 };
        let b = Value { credit: 0, ready: true, tokens: 1_000_000 };
        assert!(a > b);
        let c = Value { credit: 0, ready: false, tokens: 1_000_000 };
        assert!(b > c);
        let one = Objective::ZERO.plus(a);
        let two = Objective::ZERO.plus(b).plus(c);
        assert!(one > two);
        assert_eq!(two.admitted_count, 2);
        assert_eq!(Objective::embed(b), Objective::ZERO.plus(b));
    }
}
