//! `kairos`: the workflow-aware baseline, in the style of Kairos (Chen et al., arXiv
//! 2508.06948) as paper 003 evaluates it on the shared serving substrate
//! ([`super::substrate`]).
//!
//! What is implemented, following the paper and its public code (`Chen-Jin-yuan/Kairos`,
//! `framework/balancer/`: `balancer.py`, `memory_predictor.py`):
//!
//! - **Workflow-aware priority.** Ready units are served shortest remaining workflow first:
//!   ascending [`WorkItem::remaining_path_tokens`], the expected generation work (answers and
//!   thinking) on the longest path from the unit's node to the end of its workflow (the node
//!   included, one pass of a loop: Kairos's profiles give an expected remaining latency, not
//!   the worst case of every round a loop may still run), across all workflows; ties
//!   first-come first-served (ready time, then activation id).
//! - **Memory-aware dispatch across instances.** For the unit at the head of its deployment's
//!   queue, every awake replica of the deployment with a free batch slot (B_q) is a candidate
//!   when its reserved KV plus the unit's fits its KV capacity; the unit goes to the candidate
//!   with the **lowest predicted memory use after admission** (the balancer sorts the feasible
//!   instances by predicted peak tokens and takes the smallest), so requests spread over
//!   instances by memory. A unit reserves its admission envelope (prompt bound + output limit,
//!   Eq. 4 of paper 003) × `kv_bytes_per_token` for its lifetime; a replica's KV capacity is its
//!   claim minus the weights minus the planner's engine reserve.
//! - **Head-of-line per deployment.** The balancer dispatches only the head of its priority
//!   queue and waits while no instance can take it; here each deployment's queue waits on its
//!   own head, so lower-priority units of the same model do not overtake it, while other
//!   models' units proceed (in Kairos's testbed every model is resident; on a shared pool with
//!   loading, one global head would stall every model behind a load).
//! - **Lifecycle is the substrate's**: load on demand, LRU reclaim of idle replicas, reactive
//!   request-level scale-out under the shared replica cap. No prefetch, no fusion.
//!
//! Where it differs from the paper's system:
//! - Kairos profiles agents online and ranks by *predicted remaining latency*; we rank by the
//!   remaining critical-path *tokens* the workflow graph gives statically (latency is roughly
//!   proportional to generated tokens on one model, not across models and devices).
//! - Kairos's memory predictor sums each request's growing footprint (prompt + decode slope ×
//!   elapsed time) over 0.1 s slots of its predicted duration and corrects the sum by the
//!   engine's reported KV usage; we reserve each unit's peak (the whole envelope) from admission
//!   to completion, the conservative end of the same rule, and see no engine telemetry.
//! - A unit whose envelope exceeds an *empty* replica's KV capacity is still admitted there
//!   (the engine preempts under real KV pressure) so it cannot starve.
//!
//! Pure: depends only on the planner state and the shared substrate (`super::substrate`); no
//! I/O, no clock, no randomness.
//!
//! Part of the pure core: must not depend on anything outside `planner` but `crate::ids` and the
//! predictor crate (the core's rule, checked by `runtime/tests/module_boundaries.rs`).

use std::collections::{BTreeMap, BTreeSet};

use super::substrate::{ScaleOut, Substrate, kv_capacity_bytes, load_on_demand};
use super::{Command, DeploymentId, Event, PlannerState, Policy, ReplicaPhase, ReplicaView, WorkItem};
use crate::ids::{ActivationId, ReplicaId};

/// The Kairos-style baseline policy.
#[derive(Debug, Default)]
pub struct Kairos {
    /// KV bytes reserved by each admitted unit, until it finishes.
    reserved: BTreeMap<ActivationId, u64>,
    substrate: Substrate,
    scale_out: ScaleOut,
}

impl Kairos {
    pub fn new(substrate: Substrate) -> Self {
        Kairos { reserved: BTreeMap::new(), substrate, scale_out: ScaleOut::default() }
    }

    /// KV bytes `w` reserves: its admission envelope (I_adm + O_adm) × KV bytes per token.
    pub fn kv_demand(state: &PlannerState, w: &WorkItem) -> u64 {
        let per_token = state.deployment(w.deployment).map(|d| d.kv_bytes_per_token).unwrap_or(0);
        (u64::from(w.envelope.0) + u64::from(w.envelope.1)).saturating_mul(per_token)
    }

    /// KV capacity of a replica as the planner sees it: claim − weights − engine reserve
    /// (the substrate's rule, [`kv_capacity_bytes`]).
    pub fn kv_capacity(state: &PlannerState, r: &ReplicaView) -> u64 {
        kv_capacity_bytes(state, r)
    }

    /// KV bytes reserved on `r` by the units it holds leases for.
    pub fn kv_reserved(&self, r: &ReplicaView) -> u64 {
        r.leases.iter().filter_map(|a| self.reserved.get(a)).sum()
    }

    /// Among the awake replicas of `w`'s deployment with a batch slot and room for `w`'s KV
    /// envelope, the one whose KV use after admitting `w` is the smallest fraction of its
    /// capacity (ties: lower id).
    fn least_memory(&self, state: &PlannerState, w: &WorkItem) -> Option<ReplicaId> {
        let limit = state.deployment(w.deployment)?.max_num_seqs as usize;
        let demand = Self::kv_demand(state, w);
        state
            .replicas_of(w.deployment)
            .filter(|r| r.phase == ReplicaPhase::Awake && r.leases.len() < limit)
            .filter_map(|r| {
                let capacity = Self::kv_capacity(state, r);
                let after = self.kv_reserved(r) + demand;
                (r.leases.is_empty() || after <= capacity).then(|| (after as f64 / capacity.max(1) as f64, r.id))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, id)| id)
    }
}

/// Shortest remaining critical-path work first, then FIFO.
fn priority_order(queue: &[WorkItem]) -> Vec<WorkItem> {
    let mut order = queue.to_vec();
    order.sort_by(|a, b| {
        a.remaining_path_tokens
            .cmp(&b.remaining_path_tokens)
            .then(a.ready_at.total_cmp(&b.ready_at))
            .then(a.activation.cmp(&b.activation))
    });
    order
}

impl Policy for Kairos {
    fn name(&self) -> &'static str {
        "kairos"
    }

    fn observe(&mut self, event: &Event, _state: &PlannerState, _now: f64) {
        match event {
            Event::UnitFinished { activation, .. } => {
                self.reserved.remove(activation);
            }
            Event::SessionEnded { session } => self.reserved.retain(|a, _| a.session != *session),
            _ => {}
        }
    }

    fn plan(&mut self, state: &mut PlannerState, now: f64, out: &mut Vec<Command>) {
        // Deployments whose head unit could not be placed: their later units wait behind it.
        let mut blocked: BTreeSet<DeploymentId> = BTreeSet::new();
        for w in priority_order(state.queue()) {
            if blocked.contains(&w.deployment) {
                continue;
            }
            if let Some(replica) = self.least_memory(state, &w) {
                if state.issue_dispatch(w.activation, replica, now, out).is_ok() {
                    self.reserved.insert(w.activation, Self::kv_demand(state, &w));
                }
                continue;
            }
            blocked.insert(w.deployment);
            if state.replicas_of(w.deployment).next().is_none() {
                load_on_demand(state, w.deployment, now, out);
            }
        }
        self.scale_out.plan(state, &self.substrate, now, out);
    }

    fn next_wakeup(&self, now: f64) -> Option<f64> {
        self.scale_out.next_wakeup(&self.substrate, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{DeviceId, SessionId};
    use crate::planner::{DeploymentId, DeploymentInfo, DeviceInfo, Planner};
    use switchyard_predictor::{Dtype, spec};

    fn deployments(max_num_seqs: u32) -> Vec<DeploymentInfo> {
        ["Qwen3-4B", "Qwen3-8B", "Qwen3-1.7B"]
            .iter()
            .enumerate()
            .map(|(i, name)| DeploymentInfo::of_model(DeploymentId(i as u32), &spec::model(name).unwrap(), Dtype::Fp16, 8192, max_num_seqs))
            .collect()
    }

    fn devices() -> Vec<DeviceInfo> {
        vec![
            DeviceInfo { id: DeviceId(0), spec: spec::device("V100-32GB").unwrap() },
            DeviceInfo { id: DeviceId(1), spec: spec::device("A100-40GB").unwrap() },
        ]
    }

    fn unit(s: u32, d: u32, at: f64, path: u32, envelope: (u32, u32)) -> WorkItem {
        WorkItem {
            activation: ActivationId { session: SessionId(s), index: 0 },
            workflow: 0,
            deployment: DeploymentId(d),
            prompt_tokens: envelope.0,
            max_output_tokens: envelope.1,
            ready_at: at,
            node: 0,
            chain_prev: None,
            chain_next: false,
            envelope,
            remaining_path_tokens: path,
            further_round_tokens: 0,
            prior_context: None,
            chain_rest: Vec::new(),
        }
    }

    fn dispatched(cmds: &[Command]) -> Vec<(u32, u32)> {
        cmds.iter()
            .filter_map(|c| match c {
                Command::Dispatch { activation, replica } => Some((activation.session.0, replica.0)),
                _ => None,
            })
            .collect()
    }

    /// A state with one awake replica of deployment 0 on device 1, batch limit `seqs`.
    fn awake(seqs: u32) -> (PlannerState, ReplicaId) {
        let mut s = PlannerState::new(devices(), deployments(seqs));
        let r = s.issue_load(DeploymentId(0), DeviceId(1), 0.0, &mut Vec::new()).unwrap();
        s.observe(Event::ReplicaLoaded { replica: r }, 1.0).unwrap();
        (s, r)
    }

    #[test]
    fn shortest_remaining_critical_path_goes_first() {
        let (mut s, r) = awake(1);
        // Session 1 became ready first but has far more work left on its path.
        s.observe(Event::UnitReady(unit(1, 0, 1.0, 5000, (100, 100))), 1.0).unwrap();
        s.observe(Event::UnitReady(unit(2, 0, 2.0, 300, (100, 100))), 2.0).unwrap();
        let mut k = Kairos::default();
        let mut out = Vec::new();
        k.plan(&mut s, 2.0, &mut out);
        assert_eq!(dispatched(&out), vec![(2, r.0)]);
        assert_eq!(s.queue().len(), 1);
        assert_eq!(s.queue()[0].activation.session, SessionId(1));
    }

    #[test]
    fn equal_remaining_work_is_served_first_come_first_served() {
        let (mut s, r) = awake(1);
        s.observe(Event::UnitReady(unit(7, 0, 3.0, 300, (100, 100))), 3.0).unwrap();
        s.observe(Event::UnitReady(unit(4, 0, 1.0, 300, (100, 100))), 3.0).unwrap();
        let mut out = Vec::new();
        Kairos::default().plan(&mut s, 3.0, &mut out);
        assert_eq!(dispatched(&out), vec![(4, r.0)]);
    }

    #[test]
    fn kv_envelopes_must_fit_and_the_deployments_head_blocks_later_units() {
        let (mut s, r) = awake(64);
        let rv = s.replica(r).unwrap().clone();
        let cap = Kairos::kv_capacity(&s, &rv);
        let per_token = deployments(64)[0].kv_bytes_per_token;
        // Hand check of the capacity: 0.9 × 40 GiB − fp16 weights − 2 GiB reserve.
        let weights = spec::model("Qwen3-4B").unwrap().param_bytes(Dtype::Fp16);
        assert_eq!(cap, (0.9 * (40u64 << 30) as f64) as u64 - weights - (2 << 30));
        // Units sized to 60 % of the capacity: two do not fit together.
        let big = ((0.6 * cap as f64) / per_token as f64) as u32;
        s.observe(Event::UnitReady(unit(1, 0, 1.0, 100, (big - 500, 500))), 1.0).unwrap();
        s.observe(Event::UnitReady(unit(2, 0, 1.0, 200, (big - 500, 500))), 1.0).unwrap();
        // A small one with a longer path: it would fit, but waits behind the blocked big one of
        // the same model (the balancer dispatches the head of its priority queue only).
        s.observe(Event::UnitReady(unit(3, 0, 1.0, 900, (1000, 500))), 1.0).unwrap();
        let mut k = Kairos::default();
        let mut out = Vec::new();
        k.plan(&mut s, 1.0, &mut out);
        assert_eq!(dispatched(&out), vec![(1, r.0)]);
        let reserved = k.kv_reserved(s.replica(r).unwrap());
        assert_eq!(reserved, u64::from(big) * per_token);
        assert!(reserved <= cap);
        // When the first big unit finishes, its reservation is released and the second fits.
        let a1 = ActivationId { session: SessionId(1), index: 0 };
        let ev = Event::UnitFinished { activation: a1, replica: r, output_tokens: 10 };
        s.observe(ev.clone(), 5.0).unwrap();
        k.observe(&ev, &s, 5.0);
        let mut out = Vec::new();
        k.plan(&mut s, 5.0, &mut out);
        assert_eq!(dispatched(&out), vec![(2, r.0), (3, r.0)]);
    }

    fn two_replicas(max_num_seqs: u32) -> (PlannerState, ReplicaId, ReplicaId) {
        let mut s = PlannerState::new(devices(), deployments(max_num_seqs));
        let mut sink = Vec::new();
        let r0 = s.issue_load(DeploymentId(0), DeviceId(0), 0.0, &mut sink).unwrap();
        let r1 = s.issue_load(DeploymentId(0), DeviceId(1), 0.0, &mut sink).unwrap();
        for r in [r0, r1] {
            s.observe(Event::ReplicaLoaded { replica: r }, 1.0).unwrap();
        }
        (s, r0, r1)
    }

    #[test]
    fn dispatch_takes_the_replica_with_the_least_memory_in_use_and_respects_the_batch_limit() {
        let (mut s, r0, r1) = two_replicas(1);
        for i in 0..3 {
            s.observe(Event::UnitReady(unit(i, 0, 1.0, 100 + i, (100, 100))), 1.0).unwrap();
        }
        let mut out = Vec::new();
        Kairos::default().plan(&mut s, 1.0, &mut out);
        // The A100 replica (r1) has the larger KV capacity, so the first unit's share of it is
        // smaller; the second goes to the V100 replica; unit 2 waits (one sequence each). No
        // load is issued since replicas exist.
        assert_eq!(dispatched(&out), vec![(0, r1.0), (1, r0.0)]);
        assert_eq!(out.len(), 2);
        assert_eq!(s.queue().len(), 1);
    }

    #[test]
    fn requests_spread_over_instances_by_memory() {
        let (mut s, r0, r1) = two_replicas(64);
        for i in 0..8 {
            s.observe(Event::UnitReady(unit(i, 0, 1.0, 100, (4000, 1000))), 1.0).unwrap();
        }
        let mut k = Kairos::default();
        let mut out = Vec::new();
        k.plan(&mut s, 1.0, &mut out);
        let on = |r: ReplicaId| dispatched(&out).iter().filter(|(_, x)| *x == r.0).count();
        assert_eq!(on(r0) + on(r1), 8);
        // Both instances take work, in proportion to their KV capacity (never all on one).
        assert!(on(r0) >= 2 && on(r1) >= 2, "r0 {} r1 {}", on(r0), on(r1));
        assert!(on(r1) >= on(r0), "the larger cache takes at least as many");
        // After admission the two caches are within one unit's share of each other.
        let share = |r: ReplicaId| {
            let v = s.replica(r).unwrap();
            k.kv_reserved(v) as f64 / Kairos::kv_capacity(&s, v) as f64
        };
        let unit_share = Kairos::kv_demand(&s, &unit(0, 0, 1.0, 100, (4000, 1000))) as f64
            / Kairos::kv_capacity(&s, s.replica(r0).unwrap()) as f64;
        assert!((share(r0) - share(r1)).abs() <= unit_share + 1e-9, "{} vs {}", share(r0), share(r1));
    }

    #[test]
    fn an_oversized_unit_is_admitted_to_an_empty_replica_rather_than_starving() {
        let (mut s, r) = awake(8);
        s.observe(Event::UnitReady(unit(1, 0, 1.0, 100, (8_000_000, 512))), 1.0).unwrap();
        let mut out = Vec::new();
        Kairos::default().plan(&mut s, 1.0, &mut out);
        assert_eq!(dispatched(&out), vec![(1, r.0)]);
    }

    #[test]
    fn loads_on_demand_in_priority_order_and_evicts_lru_idle_replicas() {
        let mut s = PlannerState::new(devices(), deployments(8));
        let mut k = Kairos::default();
        // Both deployments wait at the same event: the one with less remaining work is loaded
        // first, so it gets the fastest device (FIFO would have picked deployment 1).
        s.observe(Event::UnitReady(unit(0, 1, 0.0, 900, (10, 10))), 0.0).unwrap();
        s.observe(Event::UnitReady(unit(1, 0, 0.0, 100, (10, 10))), 0.0).unwrap();
        let mut out = Vec::new();
        k.plan(&mut s, 0.0, &mut out);
        assert_eq!(
            out,
            vec![
                Command::Load { replica: ReplicaId(0), deployment: DeploymentId(0), device: DeviceId(1) },
                Command::Load { replica: ReplicaId(1), deployment: DeploymentId(1), device: DeviceId(0) },
            ]
        );
        s.observe(Event::ReplicaLoaded { replica: ReplicaId(0) }, 1.0).unwrap();
        s.observe(Event::ReplicaLoaded { replica: ReplicaId(1) }, 2.0).unwrap();
        let mut out = Vec::new();
        k.plan(&mut s, 2.0, &mut out);
        assert_eq!(dispatched(&out), vec![(1, 0), (0, 1)]);
        let a0 = ActivationId { session: SessionId(0), index: 0 };
        let a1 = ActivationId { session: SessionId(1), index: 0 };
        for (a, r, t) in [(a0, ReplicaId(1), 3.0), (a1, ReplicaId(0), 4.0)] {
            let ev = Event::UnitFinished { activation: a, replica: r, output_tokens: 1 };
            s.observe(ev.clone(), t).unwrap();
            k.observe(&ev, &s, t);
        }
        assert!(k.reserved.is_empty());
        // A third deployment: the least recently used idle replica (1, on device 0) is evicted.
        s.observe(Event::UnitReady(unit(2, 2, 5.0, 50, (10, 10))), 5.0).unwrap();
        let mut out = Vec::new();
        k.plan(&mut s, 5.0, &mut out);
        assert_eq!(
            out,
            vec![
                Command::Unload { replica: ReplicaId(1) },
                Command::Load { replica: ReplicaId(2), deployment: DeploymentId(2), device: DeviceId(0) }
            ]
        );
    }

    #[test]
    fn never_evicts_a_leased_replica() {
        let mut p = Planner::new(devices(), deployments(8), Box::new(Kairos::default()));
        p.handle(Event::UnitReady(unit(0, 0, 0.0, 10, (10, 10))), 0.0).unwrap();
        p.handle(Event::UnitReady(unit(1, 1, 0.0, 20, (10, 10))), 0.0).unwrap();
        p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 1.0).unwrap();
        p.handle(Event::ReplicaLoaded { replica: ReplicaId(1) }, 1.0).unwrap();
        let cmds = p.handle(Event::UnitReady(unit(2, 2, 2.0, 1, (10, 10))), 2.0).unwrap();
        assert!(cmds.is_empty(), "{cmds:?}");
        assert_eq!(p.state().queue().len(), 1);
    }
}
