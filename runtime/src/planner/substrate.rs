//! The serving substrate every policy shares (paper 003 §4.1: "All five configurations use the
//! same vLLM execution, placement, batching, and model-loading substrate"): what any
//! request-level serving stack does without knowing the workflow.
//!
//! - **Load on demand**: a deployment with ready work and no replica is loaded on the eligible
//!   device with free memory and the highest compute throughput ([`load_on_demand`]).
//! - **Lease-safe reclaim**: when no device has room, least-recently-used *idle* replicas
//!   (awake, no lease) are reclaimed on the device where that frees enough memory with the
//!   oldest victims; a replica holding a lease is never touched (the planner state refuses).
//!   Reclaiming unloads (the engine is torn down; its memory is free when the shell says so)
//!   or, with [`super::Reclaim::Sleep`], puts the replica to sleep (vLLM sleep mode, level 1
//!   where the node's host memory holds the weights, else level 2): a later load of that
//!   deployment wakes it on its device in seconds, and sleepers are unloaded, oldest first,
//!   when a load needs their memory ([`PlannerState::issue_load`]).
//! - **Reactive, request-level scale-out** ([`reactive_scale_out`]): the rule of a standard
//!   autoscaler (Ray Serve's `target_ongoing_requests`, Knative's target concurrency) with the
//!   target set to what a replica can really hold — a deployment whose outstanding units
//!   (queued in the planner plus admitted) exceed the concurrent capacity of its replicas
//!   (loading ones included) by more than [`Substrate::scale_out_waiting`] units per replica
//!   gets one more replica, on a free device or one with reclaimable idle replicas, once the
//!   condition has held for [`Substrate::upscale_delay_s`] (Ray Serve's `upscale_delay_s`,
//!   default 30 s, so that a momentary burst does not start a load that outlasts it; the policy
//!   asks the shell for a planning pass when the delay runs out, [`ScaleOut::next_wakeup`], as
//!   an autoscaler's control loop would act then), at most
//!   one per deployment per planning tick, up to [`Substrate::replica_cap`] (none by default:
//!   the pool is the limit). A replica's concurrent capacity is its KV capacity over the mean
//!   admission envelope (prompt + output limit) of the deployment's outstanding units, capped
//!   by `max_num_seqs` — the units beyond it would wait in vLLM's scheduler queue
//!   (`vllm:num_requests_waiting`), which is what such autoscalers scale on.
//!
//! What is *not* here, because it is a policy's mechanism: near-ready forecasts, prefetch,
//! fusion, workflow-aware ordering, cross-workflow lifecycle planning, predicted-completion
//! scale-out (the joint policy's own). The replica cap is shared by every policy.
//!
//! Pure: depends only on the planner state.
//!
//! Part of the pure core: must not depend on anything outside `planner` but `crate::ids` and the
//! predictor crate (the core's rule, checked by `runtime/tests/module_boundaries.rs`).

use std::collections::BTreeMap;

use super::state::PLANNER_ENGINE_RESERVE_BYTES;
use super::{Command, DeploymentId, PlannerState, ReplicaView};
use crate::ids::{DeviceId, ReplicaId};

/// The substrate's settings, the same for every policy of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Substrate {
    /// Most replicas of one deployment (`None`: the pool is the only limit).
    pub replica_cap: Option<usize>,
    /// Reactive scale-out fires when the units a deployment's replicas cannot run at once
    /// exceed this many per replica (0: any waiting unit)…
    pub scale_out_waiting: f64,
    /// …for at least this long (seconds).
    pub upscale_delay_s: f64,
    /// How idle replicas are reclaimed: unloaded (default, paper 003's substrate) or put to
    /// sleep.
    pub reclaim: super::Reclaim,
}

/// Ray Serve's default `upscale_delay_s` (`ray.serve.config.AutoscalingConfig`): how long the
/// load must stay above target before a replica is added.
pub const RAY_SERVE_UPSCALE_DELAY_S: f64 = 30.0;

impl Default for Substrate {
    /// No replica cap; scale out when more than one unit per replica has waited for 30 s.
    fn default() -> Self {
        Substrate {
            replica_cap: None,
            scale_out_waiting: 1.0,
            upscale_delay_s: RAY_SERVE_UPSCALE_DELAY_S,
            reclaim: super::Reclaim::Unload,
        }
    }
}

impl Substrate {
    /// Whether `deployment` may get another replica under the cap.
    pub fn below_cap(&self, state: &PlannerState, deployment: DeploymentId) -> bool {
        self.replica_cap.is_none_or(|cap| state.replicas_of(deployment).count() < cap)
    }
}

/// KV capacity of a replica as the planner sees it: its claim minus the weights minus the
/// planner's engine reserve (bytes).
pub fn kv_capacity_bytes(state: &PlannerState, r: &ReplicaView) -> u64 {
    let weights = state.deployment(r.deployment).map(|d| d.weight_bytes).unwrap_or(0);
    kv_capacity_of(weights, r.claim_bytes)
}

/// KV capacity of a replica whose weights take `weight_bytes` of a `claim_bytes` claim: the
/// claim minus the weights minus the planner's engine reserve (bytes).
pub fn kv_capacity_of(weight_bytes: u64, claim_bytes: u64) -> u64 {
    claim_bytes.saturating_sub(weight_bytes.saturating_add(PLANNER_ENGINE_RESERVE_BYTES))
}

/// Outstanding units of each deployment (queued in the planner plus admitted to a replica)
/// and the sum of their admission envelopes in tokens.
pub fn outstanding(state: &PlannerState) -> BTreeMap<DeploymentId, (usize, u64)> {
    let mut out: BTreeMap<DeploymentId, (usize, u64)> = BTreeMap::new();
    for w in state.queue() {
        let e = out.entry(w.deployment).or_default();
        e.0 += 1;
        e.1 += state.envelope_tokens(w);
    }
    for r in state.replicas() {
        for a in &r.leases {
            let Some(u) = state.running().get(a) else { continue }; // a held chain lease
            let e = out.entry(r.deployment).or_default();
            e.0 += 1;
            e.1 += u.kv_tokens;
        }
    }
    out
}

/// How many units of `mean_envelope` tokens replica `r` runs at once.
fn concurrent_capacity(state: &PlannerState, r: &ReplicaView, mean_envelope: u64) -> usize {
    let Some(d) = state.deployment(r.deployment) else { return 0 };
    let per_unit = mean_envelope.max(1).saturating_mul(d.kv_bytes_per_token.max(1));
    ((kv_capacity_bytes(state, r) / per_unit) as usize).clamp(1, d.max_num_seqs.max(1) as usize)
}

/// The reactive scale-out rule with its memory: since when each deployment has been over
/// its target. Owned by a policy (the planner core is pure: time comes in as `now`).
#[derive(Debug, Clone, Default)]
pub struct ScaleOut {
    over_since: BTreeMap<DeploymentId, f64>,
}

impl ScaleOut {
    /// Add at most one replica to each deployment whose outstanding units have exceeded its
    /// replicas' concurrent capacity by more than `substrate.scale_out_waiting` per replica for
    /// `substrate.upscale_delay_s`. Deployments without a replica are left to
    /// [`load_on_demand`]. Returns the replicas started.
    pub fn plan(&mut self, state: &mut PlannerState, substrate: &Substrate, now: f64, out: &mut Vec<Command>) -> Vec<ReplicaId> {
        let mut started = Vec::new();
        let mut over = BTreeMap::new();
        for (d, (units, envelope_tokens)) in outstanding(state) {
            let mean = envelope_tokens / units.max(1) as u64;
            let (replicas, capacity) =
                state.replicas_of(d).fold((0usize, 0usize), |(n, c), r| (n + 1, c + concurrent_capacity(state, r, mean)));
            if replicas == 0 {
                continue;
            }
            let waiting = units.saturating_sub(capacity);
            if (waiting as f64) <= substrate.scale_out_waiting * replicas as f64 {
                continue;
            }
            let since = self.over_since.get(&d).copied().unwrap_or(now);
            over.insert(d, since);
            // The same expression as `next_wakeup`'s: planned at that time, the delay has run
            // out (`now - since` can round below the delay when `now` is `since + delay`).
            if now < since + substrate.upscale_delay_s || !substrate.below_cap(state, d) {
                continue;
            }
            if let Some(r) = load_on_demand(state, d, now, out) {
                started.push(r);
                // The new replica's capacity counts from now on: wait again before the next.
                over.insert(d, now);
            }
        }
        self.over_since = over;
        started
    }

    /// When the first deployment now over its target will have been so for the upscale delay:
    /// the time a planning pass may scale it out though no event comes (`None` when none is
    /// over, or when that time has passed: it is then waiting for a device, which only an event
    /// can free).
    pub fn next_wakeup(&self, substrate: &Substrate, now: f64) -> Option<f64> {
        self.over_since.values().map(|since| since + substrate.upscale_delay_s).filter(|&t| t > now).min_by(f64::total_cmp)
    }
}

/// Load `deployment` somewhere, evicting LRU idle replicas if memory is needed.
/// Returns the new replica, or `None` when nothing can be freed now.
pub fn load_on_demand(state: &mut PlannerState, deployment: DeploymentId, now: f64, out: &mut Vec<Command>) -> Option<ReplicaId> {
    let d = state.deployment(deployment)?.clone();
    let mut eligible: Vec<DeviceId> = state.devices().iter().filter(|g| state.eligible(deployment, g.id)).map(|g| g.id).collect();
    // A device where the deployment sleeps first (a wake is seconds, a load tens of seconds),
    // then the fastest; ties by id.
    let sleeps_on = |g: DeviceId| state.asleep().any(|a| a.deployment == deployment && a.device == g);
    eligible.sort_by(|a, b| {
        let fa = state.device(*a).map(|g| g.spec.dense_fp16_flops).unwrap_or(0.0);
        let fb = state.device(*b).map(|g| g.spec.dense_fp16_flops).unwrap_or(0.0);
        sleeps_on(*b).cmp(&sleeps_on(*a)).then(fb.total_cmp(&fa)).then(a.cmp(b))
    });
    // Sleepers' memory is always reclaimable: the load unloads them, oldest first, as needed.
    for &g in &eligible {
        let claim = state.device(g).map(|dev| d.claim_bytes(dev)).unwrap_or(u64::MAX);
        if state.free_bytes(g) + state.asleep_bytes_on(g) >= claim {
            return state.issue_load(deployment, g, now, out).ok();
        }
    }
    // Evict: for each device, the LRU idle victims that free enough; pick the device whose
    // newest needed victim is the least recently used.
    // A device where the deployment sleeps wins (a wake saves a cold start; `false` sorts
    // first), then the one whose newest victim is the least recently used.
    let mut best: Option<((bool, f64), DeviceId, Vec<ReplicaId>)> = None;
    for &g in &eligible {
        let no_sleeper = !state.asleep().any(|a| a.deployment == deployment && a.device == g);
        let Some(dev) = state.device(g) else { continue };
        let claim = d.claim_bytes(dev);
        // Never a copy of the deployment being loaded: unloading it to load the same model on
        // the same device again only costs a teardown and a cold start (the reactive scale-out
        // of a packing policy, which leaves its newest copies idle, did exactly that).
        let mut idle: Vec<_> = state.replicas_on(g).filter(|r| r.is_idle() && r.deployment != deployment).collect();
        idle.sort_by(|a, b| a.last_used.total_cmp(&b.last_used).then(a.id.cmp(&b.id)));
        let mut free = state.free_bytes(g) + state.asleep_bytes_on(g);
        let mut victims = Vec::new();
        let mut newest = f64::NEG_INFINITY;
        for r in idle {
            if free >= claim {
                break;
            }
            free += r.claim_bytes;
            newest = newest.max(r.last_used);
            victims.push(r.id);
        }
        let key = (no_sleeper, newest);
        if free >= claim && best.as_ref().is_none_or(|(k, ..)| (!key.0 && k.0) || (key.0 == k.0 && key.1 < k.1)) {
            best = Some((key, g, victims));
        }
    }
    let (_, g, victims) = best?;
    for v in victims {
        if state.issue_reclaim(v, now, out).is_err() {
            return None;
        }
    }
    state.issue_load(deployment, g, now, out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{ActivationId, SessionId};
    use crate::planner::{DeploymentInfo, DeviceInfo, Event, WorkItem};
    use switchyard_predictor::{Dtype, spec};

    fn state(max_num_seqs: u32) -> PlannerState {
        let devices = (0..3).map(|i| DeviceInfo { id: DeviceId(i), spec: spec::device("A100-40GB").unwrap() }).collect();
        let m = spec::model("Qwen3-0.6B").unwrap();
        let d = DeploymentInfo {
            id: DeploymentId(0),
            model: m.name.clone(),
            dtype: Dtype::Bf16,
            max_model_len: 8192,
            gpu_memory_utilization: 0.9,
            weight_bytes: m.param_bytes(Dtype::Bf16),
            kv_bytes_per_token: m.kv_bytes_per_token(Dtype::Bf16),
            max_num_seqs,
        };
        PlannerState::new(devices, vec![d])
    }

    fn unit(s: u32) -> WorkItem {
        WorkItem {
            activation: ActivationId { session: SessionId(s), index: 0 },
            workflow: 0,
            deployment: DeploymentId(0),
            prompt_tokens: 100,
            max_output_tokens: 100,
            ready_at: 0.0,
            node: 0,
            chain_prev: None,
            chain_next: false,
            envelope: (100, 100),
            remaining_path_tokens: 100,
            further_round_tokens: 0,
            prior_context: None,
            chain_rest: Vec::new(),
        }
    }

    /// One awake replica holding two units (its batch limit), four more queued.
    fn busy() -> (PlannerState, ReplicaId) {
        let mut s = state(2);
        let mut sink = Vec::new();
        let r = s.issue_load(DeploymentId(0), DeviceId(0), 0.0, &mut sink).unwrap();
        s.observe(Event::ReplicaLoaded { replica: r }, 0.0).unwrap();
        for i in 0..6 {
            s.observe(Event::UnitReady(unit(i)), 1.0).unwrap();
        }
        for i in 0..2 {
            s.issue_dispatch(unit(i).activation, r, 1.0, &mut sink).unwrap();
        }
        (s, r)
    }

    fn loads(out: &[Command]) -> usize {
        out.iter().filter(|c| matches!(c, Command::Load { .. })).count()
    }

    #[test]
    fn a_load_never_evicts_an_idle_copy_of_its_own_model() {
        // Every device holds an idle replica of the deployment: nothing to gain by unloading
        // one to load the same model there again.
        let mut s = state(2);
        let mut sink = Vec::new();
        for g in 0..3 {
            let r = s.issue_load(DeploymentId(0), DeviceId(g), 0.0, &mut sink).unwrap();
            s.observe(Event::ReplicaLoaded { replica: r }, 0.0).unwrap();
        }
        let mut out = Vec::new();
        assert_eq!(load_on_demand(&mut s, DeploymentId(0), 10.0, &mut out), None);
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(s.replicas_of(DeploymentId(0)).count(), 3);
    }

    #[test]
    fn outstanding_units_count_the_queue_and_the_leases() {
        let (s, _) = busy();
        assert_eq!(outstanding(&s).get(&DeploymentId(0)), Some(&(6, 6 * 200)));
    }

    #[test]
    fn scale_out_waits_for_the_upscale_delay_then_adds_one_replica_at_a_time() {
        let (mut s, _) = busy();
        let sub = Substrate::default();
        let mut rule = ScaleOut::default();
        let mut out = Vec::new();
        // Four units wait beyond the replica's two slots: over target from t = 1.
        rule.plan(&mut s, &sub, 1.0, &mut out);
        rule.plan(&mut s, &sub, 30.0, &mut out);
        assert_eq!(loads(&out), 0, "29 s over target is not yet 30 s");
        rule.plan(&mut s, &sub, 31.0, &mut out);
        assert_eq!(loads(&out), 1);
        // With the loading replica counted (4 slots for 6 units: 2 wait, 1 per replica), the
        // target is met: no further replica, however long it stays so.
        rule.plan(&mut s, &sub, 100.0, &mut out);
        assert_eq!(loads(&out), 1);
        assert_eq!(s.replicas_of(DeploymentId(0)).count(), 2);
    }

    #[test]
    fn the_rule_asks_to_plan_when_its_delay_runs_out() {
        let (mut s, _) = busy();
        let sub = Substrate::default();
        let mut rule = ScaleOut::default();
        let mut out = Vec::new();
        assert_eq!(rule.next_wakeup(&sub, 0.0), None, "nothing over target yet");
        // Over target from t = 1: the delay runs out at 31, whatever events come before.
        rule.plan(&mut s, &sub, 1.0, &mut out);
        assert_eq!(rule.next_wakeup(&sub, 1.0), Some(31.0));
        rule.plan(&mut s, &sub, 12.5, &mut out);
        assert_eq!(rule.next_wakeup(&sub, 12.5), Some(31.0), "an event in between does not move it");
        rule.plan(&mut s, &sub, 31.0, &mut out);
        assert_eq!(loads(&out), 1, "planned at the wake-up, it scales out then");
        // After a scale-out the delay starts again; at its end, with the new replica counted,
        // the target is met: nothing is started and nothing waits any more.
        assert_eq!(rule.next_wakeup(&sub, 31.0), Some(61.0));
        rule.plan(&mut s, &sub, 61.0, &mut out);
        assert_eq!(loads(&out), 1);
        assert_eq!(rule.next_wakeup(&sub, 61.0), None);
    }

    #[test]
    fn a_wake_up_at_an_inexact_time_still_scales_out() {
        // 233.819 + 30 is 263.81899999999996, and that minus 233.819 is 29.99999999999997:
        // planned exactly at the wake-up time the rule must see its delay as run out, or the
        // wake-up is lost.
        let since = 233.819;
        assert!((since + RAY_SERVE_UPSCALE_DELAY_S) - since < RAY_SERVE_UPSCALE_DELAY_S);
        let (mut s, _) = busy();
        let sub = Substrate::default();
        let mut rule = ScaleOut::default();
        let mut out = Vec::new();
        rule.plan(&mut s, &sub, since, &mut out);
        let t = rule.next_wakeup(&sub, since).expect("a wake-up");
        rule.plan(&mut s, &sub, t, &mut out);
        assert_eq!(loads(&out), 1, "scaled out at the wake-up {t}");
    }

    #[test]
    fn the_replica_cap_and_the_threshold_are_shared_settings() {
        let (mut s, _) = busy();
        let mut out = Vec::new();
        let capped = Substrate { replica_cap: Some(1), ..Substrate::default() };
        let mut rule = ScaleOut::default();
        rule.plan(&mut s, &capped, 1.0, &mut out);
        rule.plan(&mut s, &capped, 100.0, &mut out);
        assert_eq!(loads(&out), 0, "capped at one replica");
        let lenient = Substrate { scale_out_waiting: 4.0, ..Substrate::default() };
        let mut rule = ScaleOut::default();
        rule.plan(&mut s, &lenient, 1.0, &mut out);
        rule.plan(&mut s, &lenient, 100.0, &mut out);
        assert_eq!(loads(&out), 0, "4 waiting is not above 4 per replica");
    }

    #[test]
    fn a_dip_below_target_restarts_the_delay() {
        let (mut s, r) = busy();
        let sub = Substrate::default();
        let mut rule = ScaleOut::default();
        let mut out = Vec::new();
        rule.plan(&mut s, &sub, 1.0, &mut out);
        // Three queued units leave (their session ended): 3 outstanding, 1 waiting.
        for i in 3..6 {
            s.observe(Event::SessionEnded { session: SessionId(i) }, 20.0).unwrap();
        }
        rule.plan(&mut s, &sub, 20.0, &mut out);
        s.observe(Event::UnitReady(unit(9)), 25.0).unwrap();
        s.observe(Event::UnitReady(unit(10)), 25.0).unwrap();
        rule.plan(&mut s, &sub, 25.0, &mut out);
        rule.plan(&mut s, &sub, 40.0, &mut out);
        assert_eq!(loads(&out), 0, "over target again only since t = 25");
        rule.plan(&mut s, &sub, 55.0, &mut out);
        assert_eq!(loads(&out), 1);
        assert!(s.replica(r).is_some_and(|v| v.leases.len() == 2), "the busy replica is untouched");
    }
}
