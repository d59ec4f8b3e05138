//! Runtime feedback into cached lookups (paper 003 §3.3): which output bucket timing uses, and
//! the memory reserved for admission.
//!
//! - [`OutputHistory`]: per logical workflow node, the output lengths of its recent
//!   completions and their empirical 90th percentile. Timing looks up the smallest output
//!   bucket covering that percentile, or the node's configured limit while it has no history.
//! - [`AdmissionMargins`]: `M_adm(κ, t) = M_peak(κ) + ε_M + ρ_κ(t)`, where admission always
//!   uses the bucket of the configured output limit, `ε_M` covers unmodeled variation and
//!   `ρ_κ` rises after an observed out-of-memory event. Nothing lowers `ρ_κ`: timing history
//!   refines completion estimates but never the memory reserved for feasibility.
//!
//! Not on the runtime's scheduling path today: no runtime code imports either (the joint
//! planner keeps its own p90 history, and reserves at the configured output limit with no ε_M
//! and no OOM margin; ARCHITECTURE.md says so). Both are updated on events (a completion, an
//! OOM), off the lookup path; reading them is a
//! map lookup or an array read. No estimator runs here: outside its tests this module must
//! not depend on the estimators, the training data (`data`, `measured`) or the evaluation,
//! nor on the emulator or the runtime.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::profile::{ProfileKey, ProfileTable};

/// Completions remembered per node. The paper says "recent completions" without a number;
/// 32 keeps the 90th percentile meaningful (the 29th of 32) while following drift within a
/// few dozen activations. An assumption, configurable with [`OutputHistory::with_window`].
pub const DEFAULT_HISTORY_WINDOW: usize = 32;

/// Recent output lengths per logical node `K`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputHistory<K: Ord> {
    window: usize,
    nodes: BTreeMap<K, NodeHistory>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct NodeHistory {
    recent: VecDeque<u32>,
    p90: u32,
}

/// Empirical 90th percentile (nearest rank: the `⌈0.9 n⌉`-th smallest).
pub fn percentile_90(values: &[u32]) -> Option<u32> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = (9 * v.len()).div_ceil(10);
    v.get(rank.saturating_sub(1)).copied()
}

impl<K: Ord> Default for OutputHistory<K> {
    fn default() -> Self {
        Self::with_window(DEFAULT_HISTORY_WINDOW)
    }
}

impl<K: Ord> OutputHistory<K> {
    /// A history remembering the last `window` (at least 1) completions per node.
    pub fn with_window(window: usize) -> Self {
        OutputHistory {
            window: window.max(1),
            nodes: BTreeMap::new(),
        }
    }

    /// Record a completion of `node` that produced `output_tokens`.
    pub fn record(&mut self, node: K, output_tokens: u32) {
        let window = self.window;
        let h = self.nodes.entry(node).or_insert_with(|| NodeHistory {
            recent: VecDeque::with_capacity(window),
            p90: 0,
        });
        if h.recent.len() == window {
            h.recent.pop_front();
        }
        h.recent.push_back(output_tokens);
        let (a, b) = h.recent.as_slices();
        let all: Vec<u32> = a.iter().chain(b).copied().collect();
        h.p90 = percentile_90(&all).unwrap_or(output_tokens);
    }

    /// The 90th percentile of `node`'s recent outputs, if it has any.
    pub fn p90(&self, node: &K) -> Option<u32> {
        self.nodes.get(node).map(|h| h.p90)
    }

    /// The output length timing should look up: the recent 90th percentile, capped by the
    /// configured limit, or the limit itself while there is no history.
    pub fn timing_output_tokens(&self, node: &K, configured_limit: u32) -> u32 {
        self.p90(node)
            .map_or(configured_limit, |p| p.min(configured_limit))
    }
}

/// How `ε_M` and the raises of `ρ` are sized. No measured peak-memory data exists to fit them
/// (see the crate docs), so the defaults are assumptions: `ε_M` is 5 % of the activation's
/// own predicted share (KV + activations) but at least 256 MiB, about a CUDA context and
/// cuBLAS workspace; an OOM raises `ρ` by the observed overshoot, and by at least 10 % of
/// the predicted peak.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MarginPolicy {
    pub epsilon_fraction: f64,
    pub epsilon_min_bytes: u64,
    pub oom_step_fraction: f64,
}

impl Default for MarginPolicy {
    fn default() -> Self {
        MarginPolicy {
            epsilon_fraction: 0.05,
            epsilon_min_bytes: 256 << 20,
            oom_step_fraction: 0.10,
        }
    }
}

/// `ρ_κ` for every cell of one [`ProfileTable`], and `ε_M`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdmissionMargins {
    policy: MarginPolicy,
    rho: Vec<u64>,
}

impl AdmissionMargins {
    /// Zero `ρ` for every cell of `table`.
    pub fn new(table: &ProfileTable, policy: MarginPolicy) -> Self {
        AdmissionMargins {
            policy,
            rho: vec![0; table.len()],
        }
    }

    /// `ε_M` of a cell.
    #[inline]
    pub fn epsilon(&self, table: &ProfileTable, key: ProfileKey) -> u64 {
        let share = table.request_bytes(key) as f64 * self.policy.epsilon_fraction;
        (share as u64).max(self.policy.epsilon_min_bytes)
    }

    /// `ρ_κ(t)`.
    #[inline]
    pub fn rho(&self, key: ProfileKey) -> u64 {
        self.rho.get(key.0 as usize).copied().unwrap_or(0)
    }

    /// `M_adm(κ, t) = M_peak(κ) + ε_M + ρ_κ(t)`, bytes. `key` must be the bucket of the
    /// configured output limit.
    #[inline]
    pub fn admission_bytes(&self, table: &ProfileTable, key: ProfileKey) -> u64 {
        table
            .peak_bytes(key)
            .saturating_add(self.epsilon(table, key))
            .saturating_add(self.rho(key))
    }

    /// An out-of-memory event was observed while serving bucket `key`; `observed_peak` is
    /// the memory in use when it failed, if known. Raises `ρ_κ` by the overshoot past the
    /// current reservation, and by at least the policy's step. Returns the new `ρ_κ`.
    pub fn record_oom(
        &mut self,
        table: &ProfileTable,
        key: ProfileKey,
        observed_peak: Option<u64>,
    ) -> u64 {
        let step = (table.peak_bytes(key) as f64 * self.policy.oom_step_fraction) as u64;
        let overshoot = observed_peak
            .map(|m| m.saturating_sub(self.admission_bytes(table, key)))
            .unwrap_or(0);
        let raise = step.max(overshoot).max(1);
        match self.rho.get_mut(key.0 as usize) {
            Some(r) => {
                *r = r.saturating_add(raise);
                *r
            }
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Architecture;
    use crate::estimators::formula::Formula;
    use crate::graph::Deployment;
    use crate::profile::Buckets;
    use crate::spec::{self, Dtype};
    use proptest::prelude::*;

    #[test]
    fn p90_by_hand() {
        assert_eq!(percentile_90(&[]), None);
        assert_eq!(percentile_90(&[7]), Some(7));
        // 10 values 1..=10: the 9th smallest.
        assert_eq!(percentile_90(&(1..=10).collect::<Vec<_>>()), Some(9));
        // 11 values: ⌈9.9⌉ = 10th smallest.
        assert_eq!(percentile_90(&(1..=11).collect::<Vec<_>>()), Some(10));
    }

    #[test]
    fn timing_falls_back_to_the_limit_then_follows_history() {
        let mut h: OutputHistory<&str> = OutputHistory::with_window(4);
        assert_eq!(h.timing_output_tokens(&"solve", 512), 512);
        for out in [100, 120, 90, 300] {
            h.record("solve", out);
        }
        assert_eq!(h.timing_output_tokens(&"solve", 512), 300);
        // The window forgets the 300.
        for out in [100, 100, 100, 100] {
            h.record("solve", out);
        }
        assert_eq!(h.p90(&"solve"), Some(100));
        // Never above the configured limit.
        h.record("solve", 9000);
        assert_eq!(h.timing_output_tokens(&"solve", 512), 512);
        assert_eq!(h.timing_output_tokens(&"other", 64), 64);
    }

    fn table() -> ProfileTable {
        let d = vec![Deployment::new(
            Architecture::from(&spec::model("Qwen3-1.7B").unwrap()),
            Dtype::Bf16,
        )];
        let g = vec![spec::device("L4").unwrap()];
        let b = Buckets {
            batch: vec![1, 8],
            input: vec![512, 2048],
            output: vec![128, 1024],
        };
        ProfileTable::build(&Formula::default(), &d, &g, b).unwrap()
    }

    #[test]
    fn admission_adds_epsilon_and_rho() {
        let t = table();
        let key = t
            .key(
                crate::profile::DeploymentIndex(0),
                crate::profile::DeviceIndex(0),
                8,
                2048,
                1024,
            )
            .unwrap();
        let mut m = AdmissionMargins::new(&t, MarginPolicy::default());
        let base = m.admission_bytes(&t, key);
        assert_eq!(base, t.peak_bytes(key) + m.epsilon(&t, key));
        assert!(m.epsilon(&t, key) >= 256 << 20);
        // An OOM 1 GiB past the reservation raises ρ by that much.
        let rho = m.record_oom(&t, key, Some(base + (1 << 30)));
        assert_eq!(rho, 1 << 30);
        assert_eq!(m.admission_bytes(&t, key), base + (1 << 30));
        // An OOM with no reading raises by the 10 % step.
        let before = m.rho(key);
        m.record_oom(&t, key, None);
        assert_eq!(m.rho(key) - before, t.peak_bytes(key) / 10);
    }

    proptest! {
        /// ρ never decreases, whatever sequence of OOM events arrives.
        #[test]
        fn rho_is_monotone(events in proptest::collection::vec(proptest::option::of(0u64..(64u64 << 30)), 1..20)) {
            let t = table();
            let key = crate::profile::ProfileKey(0);
            let mut m = AdmissionMargins::new(&t, MarginPolicy::default());
            let mut last = m.admission_bytes(&t, key);
            for e in events {
                m.record_oom(&t, key, e);
                let now = m.admission_bytes(&t, key);
                prop_assert!(now > last);
                last = now;
            }
        }

        /// The timing output never exceeds the limit, and equals it without history.
        #[test]
        fn timing_output_is_capped(outs in proptest::collection::vec(0u32..10_000, 0..50), limit in 1u32..8192) {
            let mut h: OutputHistory<u32> = OutputHistory::default();
            prop_assert_eq!(h.timing_output_tokens(&1, limit), limit);
            for o in &outs { h.record(1, *o); }
            prop_assert!(h.timing_output_tokens(&1, limit) <= limit);
        }
    }
}
