//! `joint`: online joint graph–schedule construction (paper 003 §3.4–3.5, Algorithm 1).
//!
//! At every event the policy sees the window — ready units F_t (the queue) and near-ready
//! units N_t — and the snapshot S_t, and builds the next executable prefix of a plan:
//!
//! 1. **RankReady**: ready units by priority-and-aging level k(u) (fused-chain continuations,
//!    then units waiting longer than the aging quantum, then the rest), FIFO within a level.
//! 2. **BestFeasibleBinding**: per unit, the accepting replica of its deployment (awake, batch
//!    slot B_q free, KV envelope of Eq. 4/8 within the replica's KV capacity) with the earliest
//!    predicted completion on the common timeline (Eq. 7); a loading replica counts as a binding
//!    that waits for its load. Units without a binding need a lifecycle action.
//! 3. **PlanReady**: lifecycle demand is coalesced per deployment across workflows (Figure 4:
//!    one Load serves the ready units of every workflow), ranked by ready work unlocked per
//!    second of loading. Each demand gets one binding: Load on a device with free memory, or
//!    Reclaim + Load (Eq. 5) of lease-free victims — redundant copies first, then distant next
//!    use relative to reload cost, LRU when there is no estimate — chosen by the Eq. 12 order
//!    restricted to this decision (completion of the unlocked work Ĉ_F, then lifecycle
//!    overhead H_life). Scale-out (another replica) only when no replica accepts and a new
//!    one finishes the unit earlier than the current queue, under the substrate's replica cap
//!    (none by default).
//! 4. **PlanPrefetch** with the capacity no ready unit can use (after PlanReady every ready
//!    unit is granted, covered by a load, or has no binding the pool can give now): stages a
//!    near-ready deployment without a replica when its predicted release (Eq. 2, from the
//!    committed timeline) is within its load time plus a dispatch slack, on free memory or by
//!    reclaiming replicas no ready or near-ready unit needs, so it never delays ready work.
//! 5. **Prefix**: only actions executable now are committed (grants to awake replicas, loads
//!    and reclaims); the rest is replanned at the next event.
//!
//! Memory feasibility (Eq. 11) is enforced by the planner state: a load's claim must fit the
//! device's free memory at the moment it starts, with reclaimed victims freed first.
//!
//! Ablations are options: no fusion, no prefetch, per-workflow lifecycle (each workflow
//! estimates reuse and loading benefit only over its own demand and its own loads, while
//! loaded replicas are still shared). Pure: estimates come through [`Estimates`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::estimates::Estimates;
use super::substrate::Substrate;
use super::{Command, DeploymentId, Event, PlannerState, Policy, ReplicaPhase, ReplicaView, WorkItem};
use crate::ids::{ActivationId, DeviceId, ReplicaId};

/// Which mechanisms are on (all on = the full system).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JointOptions {
    pub fusion: bool,
    pub prefetch: bool,
    /// Coalesce lifecycle demand across workflows (off = per-workflow lifecycle ablation).
    pub shared_lifecycle: bool,
    /// A departure from Eq. 12, off by default: among lifecycle bindings whose Ĉ_F is within
    /// [`NEAR_BEST`] of the best, take the least capable device (keeping faster GPUs free).
    pub resource_order: bool,
    /// A departure from §3.3, off by default: admit against the KV of the P90 output of the
    /// node's recent completions (the timing bucket) instead of its configured output limit,
    /// leaving the rest to the engine's own KV management (preemption), as the baselines do.
    pub history_admission: bool,
}

impl Default for JointOptions {
    fn default() -> Self {
        JointOptions { fusion: true, prefetch: true, shared_lifecycle: true, resource_order: false, history_admission: false }
    }
}

/// A unit waiting longer than this is promoted one priority level (aging).
pub const AGING_QUANTUM_S: f64 = 30.0;
/// Dispatch slack added to the load time when deciding whether a prefetch is timely.
pub const PREFETCH_SLACK_S: f64 = 5.0;
/// With [`JointOptions::resource_order`]: bindings whose predicted completion is within this
/// factor of the best are equivalent, and the least capable device among them is taken.
pub const NEAR_BEST: f64 = 1.10;
/// A scale-out must finish the waiting units by this factor of the current completion time.
pub const SCALE_OUT_GAIN: f64 = 0.95;
/// Recent output lengths kept per logical node for the timing bucket (P90).
const HISTORY: usize = 32;

/// The joint graph–schedule policy.
pub struct Joint {
    opts: JointOptions,
    est: Box<dyn Estimates>,
    /// The shared substrate's settings (the replica cap applies to this policy's scale-out).
    substrate: Substrate,
    /// Recent output lengths per (workflow, node).
    history: BTreeMap<(u32, u32), VecDeque<u32>>,
    /// KV reservation (bytes) of each admitted unit, per replica.
    kv: BTreeMap<ReplicaId, KvBook>,
    /// Workflow that triggered each load (per-workflow lifecycle ablation).
    load_owner: BTreeMap<ReplicaId, u32>,
    /// (workflow, node) of each admitted unit, to record its output length when it finishes.
    history_key: BTreeMap<ActivationId, (u32, u32)>,
    /// P90 of each non-empty history (kept in step with `history`).
    p90: BTreeMap<(u32, u32), u32>,
}

/// KV reservations of the units admitted to one replica, with their running sum (read per
/// unit and replica at every tick).
#[derive(Debug, Default)]
struct KvBook {
    per_unit: BTreeMap<ActivationId, u64>,
    total: u64,
}

impl KvBook {
    fn insert(&mut self, a: ActivationId, bytes: u64) {
        if let Some(old) = self.per_unit.insert(a, bytes) {
            self.total -= old;
        }
        self.total += bytes;
    }

    fn remove(&mut self, a: ActivationId) {
        if let Some(old) = self.per_unit.remove(&a) {
            self.total -= old;
        }
    }
}

/// P90 of recent output lengths: the ⌈0.9·n⌉-th smallest; `None` for an empty history.
fn p90_of(h: &VecDeque<u32>) -> Option<u32> {
    if h.is_empty() {
        return None;
    }
    let mut v: Vec<u32> = h.iter().copied().collect();
    v.sort_unstable();
    let k = ((0.9 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[k])
}

impl Joint {
    pub fn new(opts: JointOptions, est: Box<dyn Estimates>) -> Self {
        Joint {
            opts,
            est,
            substrate: Substrate::default(),
            history: BTreeMap::new(),
            kv: BTreeMap::new(),
            load_owner: BTreeMap::new(),
            history_key: BTreeMap::new(),
            p90: BTreeMap::new(),
        }
    }

    /// Plan on `substrate` (its replica cap bounds this policy's scale-out).
    pub fn with_substrate(mut self, substrate: Substrate) -> Self {
        self.substrate = substrate;
        self
    }

    /// Output tokens for timing: P90 of recent completions of the node, else its limit.
    /// The P90 is kept per node and recomputed only when the node's history changes
    /// ([`p90_of`]), not at every call (this is called per unit, replica and device per tick).
    fn timing_output(&self, w: &WorkItem) -> u32 {
        match self.p90.get(&(w.workflow, w.node)) {
            Some(&p) => p.min(w.max_output_tokens).max(1),
            None => w.max_output_tokens.max(1),
        }
    }

    /// KV bytes a unit reserves for admission: its envelope (Eq. 4) at the configured output
    /// limit, never the timing history (§3.3) — unless `history_admission`, where the output
    /// part is the timing output (P90 of recent completions, the limit without history).
    fn kv_reservation(&self, state: &PlannerState, w: &WorkItem) -> u64 {
        let per_token = state.deployment(w.deployment).map(|d| d.kv_bytes_per_token).unwrap_or(0);
        let output = if self.opts.history_admission { self.timing_output(w).min(w.envelope.1) } else { w.envelope.1 };
        (w.envelope.0 as u64 + output as u64) * per_token
    }

    /// KV capacity of a replica as the planner sees it.
    fn kv_capacity(state: &PlannerState, r: &ReplicaView) -> u64 {
        super::substrate::kv_capacity_bytes(state, r)
    }

    fn kv_in_use(&self, r: ReplicaId) -> u64 {
        self.kv.get(&r).map(|m| m.total).unwrap_or(0)
    }

    /// Predicted completion of `w` on replica `r` (Eq. 7: release, replica availability, run).
    fn completion_on(&self, state: &PlannerState, r: &ReplicaView, w: &WorkItem, now: f64) -> Option<f64> {
        let d = state.deployment(r.deployment)?;
        let g = state.device(r.device)?;
        let batch = r.leases.len() as u32 + 1;
        let run = self.est.run_time(d, g, batch, w.envelope.0.max(w.prompt_tokens), self.timing_output(w));
        let available = match r.phase {
            ReplicaPhase::Awake => now,
            ReplicaPhase::Loading { since } => (since + self.est.load_time(d, g)).max(now),
            ReplicaPhase::Waking { since, expected_s } => (since + expected_s).max(now),
        };
        Some(available + run)
    }

    /// Whether replica `r` accepts `w` now (awake, batch slot, KV envelope fits).
    fn accepts(&self, state: &PlannerState, r: &ReplicaView, w: &WorkItem) -> bool {
        if r.phase != ReplicaPhase::Awake {
            return false;
        }
        if let Some(p) = w.chain_prev {
            if state.hold_of(p) == Some(r.id) {
                return true; // the chain's own grant
            }
        }
        let limit = state.deployment(r.deployment).map(|d| d.max_num_seqs).unwrap_or(0) as usize;
        r.leases.len() < limit
            && self.kv_in_use(r.id) + self.kv_reservation(state, w) <= Self::kv_capacity(state, r)
    }

    /// Priority-and-aging level (lower is more urgent).
    fn level(&self, state: &PlannerState, w: &WorkItem, now: f64) -> u8 {
        if w.chain_prev.is_some_and(|p| state.hold_of(p).is_some()) {
            0
        } else if now - w.ready_at >= AGING_QUANTUM_S {
            1
        } else {
            2
        }
    }

    /// Whether a loading replica covers `w` (shared lifecycle: any; per-workflow: its own).
    fn covered_by_load(&self, r: &ReplicaView, w: &WorkItem) -> bool {
        matches!(r.phase, ReplicaPhase::Loading { .. } | ReplicaPhase::Waking { .. })
            && (self.opts.shared_lifecycle || self.load_owner.get(&r.id) == Some(&w.workflow))
    }

    fn grant(&mut self, state: &mut PlannerState, w: &WorkItem, r: ReplicaId, now: f64, out: &mut Vec<Command>) -> bool {
        let predicted = state
            .replica(r)
            .and_then(|rv| self.completion_on(state, rv, w, now))
            .map(|c| c - now);
        if state.issue_dispatch(w.activation, r, now, out).is_err() {
            return false;
        }
        if let Some(p) = predicted {
            state.set_predicted(w.activation, p);
        }
        let reservation = self.kv_reservation(state, w);
        self.kv.entry(r).or_default().insert(w.activation, reservation);
        true
    }

    /// Predicted release of a near-ready unit (Eq. 2): the latest predicted completion of
    /// what it waits for.
    fn release(state: &PlannerState, waits_for: &[ActivationId], now: f64) -> f64 {
        waits_for
            .iter()
            .map(|a| match state.running().get(a) {
                Some(r) => (r.started + r.predicted_s.unwrap_or(0.0)).max(now),
                None => now,
            })
            .fold(now, f64::max)
    }

    /// Demand on deployment `d` other than `exclude`: 0 = ready work, 1 = near-ready, 2 = none,
    /// with the earliest predicted release for near-ready.
    fn next_use(state: &PlannerState, d: DeploymentId, now: f64) -> (u8, f64) {
        if state.queue().iter().any(|w| w.deployment == d) {
            return (0, now);
        }
        let near = state
            .near_ready()
            .filter(|n| n.deployment == d)
            .map(|n| Self::release(state, &n.waits_for, now))
            .fold(f64::INFINITY, f64::min);
        if near.is_finite() { (1, near) } else { (2, f64::INFINITY) }
    }

    /// Lease-free victims on `device` in reclamation order: redundant copies first, then the
    /// most distant next use relative to reload cost, then least recently used.
    fn victims(&self, state: &PlannerState, device: DeviceId, now: f64, keep: &BTreeSet<DeploymentId>) -> Vec<(ReplicaId, u64, f64)> {
        let mut v: Vec<(u8, f64, f64, ReplicaId, u64, f64)> = state
            .replicas_on(device)
            .filter(|r| r.is_idle() && !keep.contains(&r.deployment))
            .filter_map(|r| {
                let d = state.deployment(r.deployment)?;
                let g = state.device(r.device)?;
                let copies = state.replicas_of(r.deployment).count();
                let reload = self.est.load_time(d, g).max(1e-3);
                let (kind, at) = Self::next_use(state, r.deployment, now);
                // A redundant copy costs no reload at all.
                let penalty = if copies > 1 {
                    0.0
                } else {
                    match kind {
                        0 => reload,
                        1 => reload * (reload / (at - now + reload)).min(1.0),
                        _ => 0.0,
                    }
                };
                let distance = if copies > 1 { f64::INFINITY } else { (at - now) / reload };
                Some((u8::from(copies <= 1), -distance, r.last_used, r.id, r.claim_bytes, penalty))
            })
            .collect();
        v.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then(a.1.total_cmp(&b.1))
                .then(a.2.total_cmp(&b.2))
                .then(a.3.cmp(&b.3))
        });
        v.into_iter().map(|x| (x.3, x.4, x.5)).collect()
    }

    /// Best lifecycle binding for deployment `d` serving `units`: (device, victims, Ĉ_F, H_life).
    /// `keep` lists deployments whose replicas must not be reclaimed.
    fn best_lifecycle(
        &self,
        state: &PlannerState,
        d: DeploymentId,
        units: &[WorkItem],
        now: f64,
        keep: &BTreeSet<DeploymentId>,
        reclaim: bool,
    ) -> Option<(DeviceId, Vec<ReplicaId>, f64, f64)> {
        let dep = state.deployment(d)?;
        // Other deployments with pending demand (ready or near-ready) and no replica yet: a
        // device that is the last free place for one of them is preserved for it (resource
        // ordering: a flexible unit must not block a constrained one, paper 003 §2.3).
        let pending: BTreeSet<DeploymentId> = state
            .queue()
            .iter()
            .map(|w| w.deployment)
            .chain(state.near_ready().map(|n| n.deployment))
            .filter(|&e| e != d && state.replicas_of(e).next().is_none())
            .collect();
        let free_for = |e: DeploymentId, except: DeviceId| {
            state
                .devices()
                .iter()
                .filter(|h| h.id != except && state.eligible(e, h.id))
                .filter(|h| state.deployment(e).is_some_and(|de| state.free_bytes(h.id) >= de.claim_bytes(h)))
                .count()
        };
        let mut candidates: Vec<(usize, DeviceId, Vec<ReplicaId>, f64, f64)> = Vec::new();
        for g in state.devices() {
            if !state.eligible(d, g.id) {
                continue;
            }
            let claim = dep.claim_bytes(g);
            let mut free = state.free_bytes(g.id);
            let mut chosen = Vec::new();
            let mut h_life = self.est.load_time(dep, g);
            if free < claim {
                if !reclaim {
                    continue;
                }
                for (victim, bytes, penalty) in self.victims(state, g.id, now, keep) {
                    if free >= claim {
                        break;
                    }
                    free += bytes;
                    chosen.push(victim);
                    h_life += penalty;
                }
                if free < claim {
                    continue;
                }
            }
            let blocking = pending.iter().filter(|&&e| state.eligible(e, g.id) && free_for(e, g.id) == 0).count();
            let batch = units.len().max(1) as u32;
            let run = units
                .iter()
                .map(|w| self.est.run_time(dep, g, batch, w.envelope.0.max(w.prompt_tokens), self.timing_output(w)))
                .fold(0.0, f64::max);
            let c_f = now + self.est.load_time(dep, g) + run;
            // Eq. 12 restricted to this decision: ready work kept coverable (no device taken
            // from a constrained demand), completion of the unlocked ready work Ĉ_F, then
            // lifecycle overhead H_life; device id breaks exact ties.
            candidates.push((blocking, g.id, chosen, c_f, h_life));
        }
        // Eq. 12 restricted to this decision, lexicographic: keep ready work coverable (take no
        // device that is a constrained demand's last), then the earliest completion Ĉ_F of the
        // unlocked work, then the least lifecycle overhead H_life; device id breaks exact ties.
        // With `resource_order` (a named departure), bindings within `NEAR_BEST` of the best
        // Ĉ_F are equivalent and the least capable device among them is taken.
        let min_blocking = candidates.iter().map(|c| c.0).min()?;
        candidates.retain(|c| c.0 == min_blocking);
        let best_c = candidates.iter().map(|c| c.3).fold(f64::INFINITY, f64::min);
        let flops = |g: DeviceId| state.device(g).map(|d| d.spec.dense_fp16_flops).unwrap_or(0.0);
        let resource_order = self.opts.resource_order;
        let best = candidates
            .into_iter()
            .filter(|c| !resource_order || c.3 - now <= (best_c - now) * NEAR_BEST)
            .min_by(|x, y| {
                let capability = if resource_order { flops(x.1).total_cmp(&flops(y.1)) } else { std::cmp::Ordering::Equal };
                capability.then(x.3.total_cmp(&y.3)).then(x.4.total_cmp(&y.4)).then(x.1.cmp(&y.1))
            });
        best.map(|(_, g, v, c, h)| (g, v, c, h))
    }

    fn issue_lifecycle(
        &mut self,
        state: &mut PlannerState,
        d: DeploymentId,
        device: DeviceId,
        victims: &[ReplicaId],
        owner: u32,
        now: f64,
        out: &mut Vec<Command>,
    ) -> bool {
        for v in victims {
            if state.issue_reclaim(*v, now, out).is_err() {
                return false;
            }
            self.kv.remove(v);
            self.load_owner.remove(v);
        }
        match state.issue_load(d, device, now, out) {
            Ok(r) => {
                self.load_owner.insert(r, owner);
                true
            }
            Err(_) => false,
        }
    }
}

impl Policy for Joint {
    fn name(&self) -> &'static str {
        match (self.opts.fusion, self.opts.prefetch, self.opts.shared_lifecycle) {
            (true, true, true) => "joint",
            (false, true, true) => "joint-no-fusion",
            (true, false, true) => "joint-no-prefetch",
            (true, true, false) => "joint-per-workflow-lifecycle",
            _ => "joint-ablated",
        }
    }

    fn fuses_chains(&self) -> bool {
        self.opts.fusion
    }

    fn observe(&mut self, event: &Event, _state: &PlannerState, _now: f64) {
        match event {
            Event::UnitFinished { activation, replica, output_tokens } => {
                if let Some(m) = self.kv.get_mut(replica) {
                    m.remove(*activation);
                }
                if let Some(key) = self.history_key.remove(activation) {
                    let h = self.history.entry(key).or_default();
                    h.push_back(*output_tokens);
                    while h.len() > HISTORY {
                        h.pop_front();
                    }
                    if let Some(p) = p90_of(h) {
                        self.p90.insert(key, p);
                    }
                }
            }
            Event::ReplicaLoadFailed { replica, .. } => {
                self.load_owner.remove(replica);
                self.kv.remove(replica);
            }
            _ => {}
        }
    }

    fn plan(&mut self, state: &mut PlannerState, now: f64, out: &mut Vec<Command>) {
        // 1. RankReady.
        let mut ranked: Vec<(u8, f64, WorkItem)> =
            state.queue().iter().map(|w| (self.level(state, w, now), w.ready_at, w.clone())).collect();
        ranked.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.activation.cmp(&b.2.activation)));

        // 2. BestFeasibleBinding per unit.
        let mut needs: BTreeMap<(DeploymentId, u32), Vec<(u8, WorkItem)>> = BTreeMap::new();
        let mut scale_out: BTreeMap<DeploymentId, Vec<WorkItem>> = BTreeMap::new();
        for (level, _, w) in ranked {
            let mut best: Option<(f64, ReplicaId, bool)> = None;
            let mut awake_exists = false;
            for r in state.replicas_of(w.deployment) {
                let accepting = self.accepts(state, r, &w);
                let waits = self.covered_by_load(r, &w);
                awake_exists |= r.phase == ReplicaPhase::Awake;
                if !(accepting || waits) {
                    continue;
                }
                if let Some(c) = self.completion_on(state, r, &w, now) {
                    if best.is_none_or(|(bc, ..)| c < bc) {
                        best = Some((c, r.id, accepting));
                    }
                }
            }
            match best {
                Some((_, r, true)) => {
                    if self.grant(state, &w, r, now, out) {
                        self.history_key.insert(w.activation, (w.workflow, w.node));
                    }
                }
                // Waits for a load under way, or for a slot: a scale-out candidate.
                Some((_, _, false)) => scale_out.entry(w.deployment).or_default().push(w),
                None if awake_exists => scale_out.entry(w.deployment).or_default().push(w),
                None => {
                    let key = (w.deployment, if self.opts.shared_lifecycle { 0 } else { w.workflow });
                    needs.entry(key).or_default().push((level, w));
                }
            }
        }

        // 3. PlanReady: coalesced demand, ranked by urgency then ready work per load second.
        let demands: Vec<((DeploymentId, u32), Vec<(u8, WorkItem)>)> = needs.into_iter().collect();
        // Value of a load: the predicted ready work (seconds of run time, on the fastest eligible
        // device, each unit alone) it unlocks per second of loading.
        let value = |state: &PlannerState, d: DeploymentId, units: &[(u8, WorkItem)]| {
            let Some(dep) = state.deployment(d) else { return 0.0 };
            let mut best = 0.0f64;
            for g in state.devices().iter().filter(|g| state.eligible(d, g.id)) {
                let work: f64 = units
                    .iter()
                    .map(|(_, w)| self.est.run_time(dep, g, 1, w.envelope.0.max(w.prompt_tokens), self.timing_output(w)))
                    .sum();
                best = best.max(work / self.est.load_time(dep, g).max(1e-3));
            }
            best
        };
        let mut ranked_demands: Vec<(u8, usize, f64, ((DeploymentId, u32), Vec<(u8, WorkItem)>))> = demands
            .into_iter()
            .map(|(key, units)| {
                let level = units.iter().map(|x| x.0).min().unwrap_or(u8::MAX);
                let eligible = state.devices().iter().filter(|g| state.eligible(key.0, g.id)).count();
                (level, eligible, value(state, key.0, &units), (key, units))
            })
            .collect();
        // Urgency first, then the most constrained deployment (fewest eligible devices), then
        // the most ready work unlocked per second of loading.
        ranked_demands.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(b.2.total_cmp(&a.2)).then(a.3.0.cmp(&b.3.0)));
        let demands: Vec<((DeploymentId, u32), Vec<(u8, WorkItem)>)> = ranked_demands.into_iter().map(|x| x.3).collect();
        // Deployments with ready demand are never reclaimed to make room for other demand.
        let mut keep: BTreeSet<DeploymentId> = state.queue().iter().map(|w| w.deployment).collect();
        let mut loaded: Vec<(DeploymentId, u32, Vec<WorkItem>, Vec<DeviceId>)> = Vec::new();
        for ((d, owner), units) in demands {
            let items: Vec<WorkItem> = units.into_iter().map(|(_, w)| w).collect();
            if let Some((g, victims, _, _)) = self.best_lifecycle(state, d, &items, now, &keep, true) {
                let owner = items.first().map(|w| w.workflow).unwrap_or(owner);
                if self.issue_lifecycle(state, d, g, &victims, owner, now, out) {
                    keep.insert(d);
                    loaded.push((d, owner, items, vec![g]));
                }
            }
        }
        // Scale-out: for every deployment with units that no replica accepts now (they wait for
        // a load or for a slot), add a replica on a free device — or one whose idle replicas
        // nothing in the window needs — while spreading
        // the waiting units over one more replica finishes them earlier (Ĉ_F of Eq. 12) by at
        // least 5 %, under the replica cap. Every demand above got its first replica first.
        for (_, _, items, _) in loaded {
            for w in items {
                scale_out.entry(w.deployment).or_default().push(w);
            }
        }
        for (d, items) in scale_out {
            loop {
                if !self.substrate.below_cap(state, d) {
                    break;
                }
                let Some(dep) = state.deployment(d) else { break };
                // Where each existing replica becomes available, and its current load.
                let mut slots: Vec<(f64, DeviceId, usize)> = state
                    .replicas_of(d)
                    .filter_map(|r| {
                        let g = state.device(r.device)?;
                        let at = match r.phase {
                            ReplicaPhase::Awake => now,
                            ReplicaPhase::Loading { since } => (since + self.est.load_time(dep, g)).max(now),
                            ReplicaPhase::Waking { since, expected_s } => (since + expected_s).max(now),
                        };
                        Some((at, r.device, r.leases.len()))
                    })
                    .collect();
                // Scale-out may reclaim only replicas that no ready or near-ready unit needs.
                let mut keep_all = keep.clone();
                keep_all.extend(state.near_ready().map(|n| n.deployment));
                keep_all.insert(d);
                let Some((g, victims, _, _)) = self.best_lifecycle(state, d, &items, now, &keep_all, true) else {
                    break;
                };
                let Some(dev) = state.device(g) else { break };
                // Work the replicas must absorb: the waiting units and the near-ready units of
                // the same deployment (the window's visible future demand).
                let near_n = state.near_ready().filter(|n| n.deployment == d).count();
                let c_f = |slots: &[(f64, DeviceId, usize)]| {
                    let per = (items.len() + near_n).div_ceil(slots.len().max(1));
                    slots
                        .iter()
                        .filter_map(|(at, g, busy)| {
                            let dev = state.device(*g)?;
                            let batch = (per + busy) as u32;
                            let run = items
                                .iter()
                                .map(|w| self.est.run_time(dep, dev, batch, w.envelope.0.max(w.prompt_tokens), self.timing_output(w)))
                                .fold(0.0, f64::max);
                            Some(at + run)
                        })
                        .fold(now, f64::max)
                };
                let current = c_f(&slots);
                slots.push((now + self.est.load_time(dep, dev), g, 0));
                let split = c_f(&slots);
                if !(split < now + (current - now) * SCALE_OUT_GAIN) {
                    break;
                }
                let owner = items.first().map(|w| w.workflow).unwrap_or(0);
                if !self.issue_lifecycle(state, d, g, &victims, owner, now, out) {
                    break;
                }
            }
        }

        // 4. PlanPrefetch with the capacity no ready unit can use: every ready unit has been
        // granted, covered by a load, or found no binding the pool can give it now, and the
        // deployments with ready or near-ready demand are kept resident below.
        if !self.opts.prefetch {
            return;
        }
        let mut near: BTreeMap<DeploymentId, (f64, u32)> = BTreeMap::new();
        for n in state.near_ready() {
            let r = Self::release(state, &n.waits_for, now);
            let e = near.entry(n.deployment).or_insert((f64::INFINITY, n.workflow));
            if r < e.0 {
                *e = (r, n.workflow);
            }
        }
        // Anything with ready or near-ready demand is kept resident.
        let mut keep: BTreeSet<DeploymentId> = state.queue().iter().map(|w| w.deployment).collect();
        keep.extend(near.keys().copied());
        let mut order: Vec<(DeploymentId, (f64, u32))> = near.into_iter().collect();
        order.sort_by(|a, b| a.1.0.total_cmp(&b.1.0).then(a.0.cmp(&b.0)));
        for (d, (release, owner)) in order {
            if state.replicas_of(d).next().is_some() {
                continue;
            }
            let Some((g, victims, _, _)) = self.best_lifecycle(state, d, &[], now, &keep, true) else { continue };
            let (Some(dep), Some(dev)) = (state.deployment(d), state.device(g)) else { continue };
            if release - now <= self.est.load_time(dep, dev) + PREFETCH_SLACK_S {
                self.issue_lifecycle(state, d, g, &victims, owner, now, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SessionId;
    use crate::planner::{DeploymentInfo, DeviceInfo, NearReadyItem, Planner};
    use switchyard_predictor::{Dtype, spec};

    /// Constant estimates: loads take 10 s, a request 1 s per 100 output tokens.
    struct Fixed;
    impl Estimates for Fixed {
        fn name(&self) -> &str {
            "fixed"
        }
        fn run_time(&self, _: &DeploymentInfo, _: &DeviceInfo, _: u32, _: u32, output: u32) -> f64 {
            output as f64 / 100.0
        }
        fn load_time(&self, _: &DeploymentInfo, _: &DeviceInfo) -> f64 {
            10.0
        }
    }

    /// Loads take 10 s; a request is 5 % slower on a V100 than on an A100.
    struct SlowerOnVolta;
    impl Estimates for SlowerOnVolta {
        fn name(&self) -> &str {
            "slower-on-volta"
        }
        fn run_time(&self, _: &DeploymentInfo, g: &DeviceInfo, _: u32, _: u32, output: u32) -> f64 {
            let slow = if g.spec.supports_bf16 { 1.0 } else { 1.05 };
            slow * output as f64
        }
        fn load_time(&self, _: &DeploymentInfo, _: &DeviceInfo) -> f64 {
            10.0
        }
    }

    fn planner(devices: &[&str], opts: JointOptions) -> Planner {
        planner_with(devices, opts, Box::new(Fixed))
    }

    fn planner_with(devices: &[&str], opts: JointOptions, est: Box<dyn Estimates>) -> Planner {
        let devices = devices
            .iter()
            .enumerate()
            .map(|(i, n)| DeviceInfo { id: DeviceId(i as u32), spec: spec::device(n).unwrap() })
            .collect();
        let deployments = ["Qwen3-4B", "Qwen3-8B", "Qwen3-1.7B"]
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let m = spec::model(name).unwrap();
                DeploymentInfo {
                    id: DeploymentId(i as u32),
                    model: m.name.clone(),
                    dtype: Dtype::Fp16,
                    max_model_len: 8192,
                    gpu_memory_utilization: 0.9,
                    weight_bytes: m.param_bytes(Dtype::Fp16),
                    kv_bytes_per_token: m.kv_bytes_per_token(Dtype::Fp16),
                    max_num_seqs: 64,
                }
            })
            .collect();
        Planner::new(devices, deployments, Box::new(Joint::new(opts, est)))
    }

    fn act(s: u32, i: u32) -> ActivationId {
        ActivationId { session: SessionId(s), index: i }
    }

    fn item(s: u32, i: u32, d: u32, workflow: u32) -> WorkItem {
        WorkItem {
            activation: act(s, i),
            workflow,
            deployment: DeploymentId(d),
            prompt_tokens: 500,
            max_output_tokens: 200,
            ready_at: 0.0,
            node: i,
            chain_prev: None,
            chain_next: false,
            envelope: (500, 200),
            remaining_path_tokens: 200,
        }
    }

    fn loads(cmds: &[Command]) -> usize {
        cmds.iter().filter(|c| matches!(c, Command::Load { .. })).count()
    }

    #[test]
    fn one_load_serves_ready_units_of_every_workflow() {
        let mut p = planner(&["A100-40GB", "A100-40GB"], JointOptions::default());
        let mut cmds = p.handle(Event::UnitReady(item(0, 0, 0, 0)), 0.0).unwrap();
        cmds.extend(p.handle(Event::UnitReady(item(1, 0, 0, 1)), 0.0).unwrap());
        assert_eq!(loads(&cmds), 1, "{cmds:?}");
        // The per-workflow ablation loads the deployment once per workflow.
        let mut p = planner(&["A100-40GB", "A100-40GB"], JointOptions { shared_lifecycle: false, ..Default::default() });
        let mut cmds = p.handle(Event::UnitReady(item(0, 0, 0, 0)), 0.0).unwrap();
        cmds.extend(p.handle(Event::UnitReady(item(1, 0, 0, 1)), 0.0).unwrap());
        assert_eq!(loads(&cmds), 2, "{cmds:?}");
    }

    #[test]
    fn reclaim_never_touches_a_leased_replica() {
        let mut p = planner(&["A100-40GB"], JointOptions::default());
        p.handle(Event::UnitReady(item(0, 0, 0, 0)), 0.0).unwrap();
        let cmds = p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
        assert!(matches!(cmds[0], Command::Dispatch { .. }));
        // Another deployment needs the only device, whose replica is leased: nothing happens.
        let cmds = p.handle(Event::UnitReady(item(1, 0, 1, 0)), 11.0).unwrap();
        assert!(cmds.is_empty(), "{cmds:?}");
        // Once the lease ends, the idle replica is reclaimed for the waiting unit.
        let cmds = p
            .handle(Event::UnitFinished { activation: act(0, 0), replica: ReplicaId(0), output_tokens: 100 }, 12.0)
            .unwrap();
        assert_eq!(cmds[0], Command::Unload { replica: ReplicaId(0) });
        assert!(matches!(cmds[1], Command::Load { deployment: DeploymentId(1), .. }));
    }

    #[test]
    fn a_fused_successor_keeps_the_chain_grant() {
        let mut p = planner(&["A100-40GB"], JointOptions::default());
        let mut head = item(0, 0, 0, 0);
        head.chain_next = true;
        p.handle(Event::UnitReady(head), 0.0).unwrap();
        p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
        // Other deployment's work arrives while the head runs.
        p.handle(Event::UnitReady(item(1, 0, 1, 0)), 10.5).unwrap();
        // The head finishes: its replica stays leased for the successor, so nothing is reclaimed.
        let cmds = p
            .handle(Event::UnitFinished { activation: act(0, 0), replica: ReplicaId(0), output_tokens: 100 }, 11.0)
            .unwrap();
        assert!(cmds.is_empty(), "{cmds:?}");
        let mut next = item(0, 1, 0, 0);
        next.chain_prev = Some(act(0, 0));
        let cmds = p.handle(Event::UnitReady(next), 11.0).unwrap();
        assert_eq!(cmds, vec![Command::Dispatch { activation: act(0, 1), replica: ReplicaId(0) }]);
        // Without fusion the same finish frees the replica and it is reclaimed at once.
        let mut p = planner(&["A100-40GB"], JointOptions { fusion: false, ..Default::default() });
        let mut head = item(0, 0, 0, 0);
        head.chain_next = true;
        p.handle(Event::UnitReady(head), 0.0).unwrap();
        p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
        p.handle(Event::UnitReady(item(1, 0, 1, 0)), 10.5).unwrap();
        let cmds = p
            .handle(Event::UnitFinished { activation: act(0, 0), replica: ReplicaId(0), output_tokens: 100 }, 11.0)
            .unwrap();
        assert_eq!(cmds[0], Command::Unload { replica: ReplicaId(0) });
    }

    fn near(s: u32, i: u32, d: u32, waits: ActivationId) -> NearReadyItem {
        NearReadyItem {
            activation: act(s, i),
            workflow: 0,
            deployment: DeploymentId(d),
            node: i,
            waits_for: vec![waits],
            prompt_bound: 500,
            max_output_tokens: 200,
        }
    }

    #[test]
    fn prefetch_stages_near_ready_work_on_capacity_no_ready_unit_can_use() {
        let mut p = planner(&["A100-40GB", "A100-40GB"], JointOptions::default());
        p.handle(Event::UnitReady(item(0, 0, 0, 0)), 0.0).unwrap();
        p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
        // The unit runs (predicted 2 s); its successor on deployment 1 is near-ready, released
        // in ~2 s, well within the 10 s load: a tick with no ready action prefetches it.
        let cmds = p.handle(Event::UnitNearReady(near(0, 1, 1, act(0, 0))), 10.0).unwrap();
        assert_eq!(loads(&cmds), 1, "{cmds:?}");
        assert!(matches!(cmds[0], Command::Load { deployment: DeploymentId(1), device: DeviceId(1), .. }));
        // With prefetch off, nothing is staged.
        let mut p = planner(&["A100-40GB", "A100-40GB"], JointOptions { prefetch: false, ..Default::default() });
        p.handle(Event::UnitReady(item(0, 0, 0, 0)), 0.0).unwrap();
        p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
        assert!(p.handle(Event::UnitNearReady(near(0, 1, 1, act(0, 0))), 10.0).unwrap().is_empty());
    }

    #[test]
    fn prefetch_never_delays_ready_work() {
        // One device. Ready work of deployment 0 waits for it; a near-ready unit of deployment 1
        // must not take the device.
        let mut p = planner(&["A100-40GB"], JointOptions::default());
        p.handle(Event::UnitReady(item(0, 0, 0, 0)), 0.0).unwrap();
        let cmds = p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
        assert_eq!(cmds.len(), 1);
        let cmds = p.handle(Event::UnitReady(item(1, 0, 2, 0)), 10.0).unwrap();
        assert!(cmds.is_empty());
        let cmds = p.handle(Event::UnitNearReady(near(0, 1, 1, act(0, 0))), 10.0).unwrap();
        assert!(cmds.is_empty(), "{cmds:?}");
        // When the device frees, the ready unit's deployment is loaded, not the prefetch.
        let cmds = p
            .handle(Event::UnitFinished { activation: act(0, 0), replica: ReplicaId(0), output_tokens: 100 }, 12.0)
            .unwrap();
        assert!(cmds.iter().all(|c| !matches!(c, Command::Load { deployment: DeploymentId(1), .. })), "{cmds:?}");
        assert!(cmds.iter().any(|c| matches!(c, Command::Load { deployment: DeploymentId(2), .. })), "{cmds:?}");
    }

    #[test]
    fn prefetch_fires_in_the_same_tick_as_a_grant() {
        // Two devices. A ready unit of deployment 0 is granted on device 0 at the tick its
        // near-ready successor on the absent deployment 1 appears: the free device 1 is of no
        // use to ready work, so the successor's model is staged there in that same tick.
        let mut p = planner(&["A100-40GB", "A100-40GB"], JointOptions::default());
        p.handle(Event::UnitReady(item(0, 0, 0, 0)), 0.0).unwrap();
        let cmds = p
            .handle_all(vec![Event::ReplicaLoaded { replica: ReplicaId(0) }, Event::UnitNearReady(near(0, 1, 1, act(0, 0)))], 10.0)
            .unwrap();
        assert!(cmds.iter().any(|c| matches!(c, Command::Dispatch { replica: ReplicaId(0), .. })), "{cmds:?}");
        assert!(
            cmds.iter().any(|c| matches!(c, Command::Load { deployment: DeploymentId(1), device: DeviceId(1), .. })),
            "{cmds:?}"
        );
    }

    #[test]
    fn eq_12_takes_the_earliest_completion_and_resource_order_is_a_named_departure() {
        // A load for one ready unit: the A100 finishes it at 210 s, the V100 at 220 s (within
        // 10 %). Eq. 12 as written takes the earlier completion; `resource_order` the V100.
        let cmds = |opts| {
            let mut p = planner_with(&["V100-32GB", "A100-40GB"], opts, Box::new(SlowerOnVolta));
            p.handle(Event::UnitReady(item(0, 0, 0, 0)), 0.0).unwrap()
        };
        let on = |c: &[Command]| match c.first() {
            Some(Command::Load { device, .. }) => *device,
            other => panic!("expected a load first: {other:?}"),
        };
        assert_eq!(on(&cmds(JointOptions::default())), DeviceId(1));
        assert_eq!(on(&cmds(JointOptions { resource_order: true, ..Default::default() })), DeviceId(0));
    }

    #[test]
    fn history_admission_admits_against_recent_outputs_instead_of_the_limit() {
        // Units that may write 60,000 tokens but whose node wrote 100 last time: §3.3 reserves
        // KV for the limit (a 4B replica on an A100 holds three such envelopes); the named
        // departure reserves for the recent P90 and admits all ten.
        let long = |s: u32| WorkItem { max_output_tokens: 60_000, envelope: (500, 60_000), node: 0, ..item(s, 0, 0, 0) };
        let admitted = |opts: JointOptions| {
            let mut p = planner(&["A100-40GB"], opts);
            p.handle(Event::UnitReady(item(0, 0, 0, 0)), 0.0).unwrap();
            p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
            p.handle(Event::UnitFinished { activation: act(0, 0), replica: ReplicaId(0), output_tokens: 100 }, 11.0).unwrap();
            let cmds = p.handle_all((1..=10).map(|s| Event::UnitReady(long(s))).collect(), 12.0).unwrap();
            cmds.iter().filter(|c| matches!(c, Command::Dispatch { .. })).count()
        };
        assert_eq!(admitted(JointOptions::default()), 3);
        assert_eq!(admitted(JointOptions { history_admission: true, ..Default::default() }), 10);
    }
}
