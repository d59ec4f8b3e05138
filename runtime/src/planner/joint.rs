//! `joint`: online joint graph–schedule construction (paper 003 §3.4–3.5, Algorithm 1).
//!
//! At every event the policy sees the window — ready units F_t (the queue) and near-ready
//! units N_t — and the snapshot S_t, and builds the next executable prefix of a plan:
//!
//! 1. **RankReady**: ready units by priority-and-aging level k(u) (fused-chain continuations,
//!    then units waiting longer than the aging quantum, then the rest); within a level the
//!    longest remaining critical path of the unit's session first, then FIFO. (The fresh
//!    level's units are then admitted by TAO's DP, which takes this order only as its
//!    tie-break; see step 2.)
//! 2. **BestFeasibleBinding on the timeline** ([`super::timeline`], Propagate: Eq. 7, 10, 11):
//!    every replica is a lane seeded with the reservations of its admitted units until their
//!    predicted finish (a unit past it: at its output limit; a fused chain's link: at its
//!    chain's end); each unit, in ranked order, is placed on the lane of its deployment where
//!    it finishes earliest — after its release, the replica's load or wake, and the start of the
//!    unit ranked before it there, once its KV envelope (Eq. 4, at most the context L_max, Eq. 8)
//!    fits beside the reservations still held and a batch slot B_q is free. A unit is timed at
//!    its observed prompt and its node's recent outputs (§3.3); a fused chain's link for itself
//!    and the chain's later links (Eq. 4's summed run time). The **prefix** — units whose
//!    predicted start is now on an awake replica — is granted; the rest stay queued, re-ranked
//!    at the next event. The placements give near-ready units their predicted release (Eq. 2:
//!    the finish of the link they wait for). Units with no lane need a lifecycle action.
//! 3. **PlanReady**: lifecycle demand is coalesced per deployment across workflows (Figure 4:
//!    one Load serves the ready units of every workflow), ranked by urgency, constraint (fewest
//!    eligible devices) and ready work unlocked per second of loading. Each demand gets one
//!    binding: Load on a device with free memory, or Reclaim + Load (Eq. 5) of lease-free victims
//!    — redundant copies first, then distant next use relative to reload cost, LRU when there is
//!    no estimate — chosen by Eq. 12 lexicographically: keep other ready work coverable (no
//!    device that a more constrained deployment with demand can use, or that is a replica-less
//!    demand's last free place: resource ordering, §2.3), then the plan's latest completion Ĉ_F
//!    (the demand's work on the new replica's lane, bounded below by the work already placed
//!    this tick), then lifecycle overhead H_life. Eq. 12's −P_N is not in this key: bindings
//!    come before PlanPrefetch, which uses only capacity no ready unit can use (README, "Eq. 12
//!    as the code applies it"). **Scale-out** on the timeline: the deployment
//!    that finishes last gets another replica while that brings its Ĉ_F forward by at least
//!    1 − [`SCALE_OUT_GAIN`], one at a time, under the substrate's replica cap (none by default).
//!    It may reclaim idle replicas nothing in the window needs — except the last replica of a
//!    deployment that sessions in flight can still reach in their graphs, and any replica of
//!    one more constrained than the deployment scaling out (the *outlook*, successor demand;
//!    while a workflow's sessions keep arriving, what its next session will call counts too:
//!    [`PlannerState::arrival_outlook`]) —
//!    and idle *redundant copies* of a
//!    model that still has work when that model, one copy fewer, still finishes before the new
//!    completion (the plan's Ĉ_F falls; "preferring redundant copies", §3.5).
//! 4. **PlanPrefetch** with the capacity no ready unit can use (after PlanReady every ready
//!    unit is granted, placed behind a queue or a load, or has no binding the pool can give
//!    now): stages a near-ready deployment without a replica when its predicted release is
//!    within its load time plus a dispatch slack, on free memory or by reclaiming replicas no
//!    ready or near-ready unit needs, so it never delays ready work. A prefetch not yet timely
//!    asks the shell for a planning pass when it becomes so ([`Policy::next_wakeup`]).
//!
//! Memory feasibility (Eq. 11) holds twice: on each lane (KV reservations at every predicted
//! start) and in the planner state (a load's claim must fit the device's free memory when it
//! starts, after its victims' teardown).
//!
//! Ablations are options: no fusion, no prefetch, per-workflow lifecycle (each workflow
//! estimates reuse and loading benefit only over its own demand and its own loads, while
//! loaded replicas are still shared). Pure: estimates come through [`Estimates`].
//!
//! Part of the pure core: must not depend on anything outside `planner` but `crate::ids` and the
//! predictor crate (the core's rule, checked by `runtime/tests/module_boundaries.rs`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use super::estimates::Estimates;
use super::fusion::{self, LogicalNode};
use super::state::{PLANNER_TEARDOWN_S, sleep_estimate_s, wake_estimate_s};
use super::substrate::Substrate;
use super::tao::{self, Solver, ToolCall, ToolHistory};
use super::timeline::{Lane, Slot, place_all};
use super::{
    ChainLink, Command, DeploymentId, DeploymentInfo, DeviceInfo, Event, NearReadyItem, PlannerState, Policy, PrefetchOutcome,
    PriorContext, Reclaim, ReplicaPhase, ReplicaView, WorkItem,
};
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
    /// Three-state lifecycle where the substrate can sleep (`--sleep`): a reclaimed replica
    /// sleeps instead of being unloaded when its model has predicted next use in the window and
    /// sleeping then waking costs less than tearing down then reloading (off = `--no-sleep`:
    /// always unload). Without the substrate's sleep nothing sleeps (paper 003's substrate).
    pub sleep: bool,
    /// TAO's admission (paper 000) of the ready units onto resident replicas: an exact DP over
    /// decayed cache credit, tool-return readiness and token footprint
    /// ([`Joint::tao_admit`]); off (`--no-tao-admission`): ranked first-fit on the timeline.
    pub tao_admission: bool,
    /// Drain-to-reclaim, our reading of a reclaim on the committed timeline (Eq. 7 and 10: a
    /// reclamation starts after the units leased on its victim, and nothing is placed on the
    /// victim after it): when the deployment that finishes last can gain no replica on a free
    /// or idle device, a busy redundant copy of a more flexible deployment (eligible on more
    /// devices; resource ordering, §2.3) on a device it can use stops taking new units. It
    /// becomes lease-free at its units' predicted finish, and the scale-out then reclaims it
    /// like any idle redundant copy, for whichever deployment gains most at that time. Taken
    /// only when Eq. 12 over the plan gains: the last deployment's Ĉ_F falls by 1 −
    /// [`SCALE_OUT_GAIN`] with that device after the drain, teardown and load, and the donor,
    /// one copy fewer, still finishes first. On in the full policy; `--no-drain` is its ablation.
    pub drain: bool,
    /// The graph outlook of the sessions in flight ([`PlannerState::successor_sessions`]) as
    /// successor demand against the scale-out, even when nothing in the window needs a model
    /// now: while some session in flight can still call a deployment, a scale-out never
    /// reclaims its last replica, nor any replica of it when it is more constrained than the
    /// deployment scaling out (eligible on fewer devices; paper 003 §2.3: "placing a flexible
    /// activation on the only high-capacity GPU blocks a constrained successor"). Off
    /// (`--no-outlook`): only the ready and near-ready window protects replicas from a
    /// scale-out. (Protecting every replica of every deployment sessions will call, or pricing
    /// the victims' reloads into the scale-out's gain, was measured and not kept: both cost
    /// 5–9 % makespan under Poisson 0.15.)
    pub outlook: bool,
    /// The outlook one arrival ahead ([`PlannerState::arrival_outlook`]): while a workflow's
    /// sessions keep arriving, the deployments a new session of it will call count as called
    /// by the outlook above, though no session in flight may call them any more. Off
    /// (`--no-arrival-outlook`): only sessions in flight count.
    pub arrival_outlook: bool,
    /// RankReady's order within a priority-and-aging level: the unit whose session has the
    /// longest remaining critical path first — [`WorkItem::remaining_path_tokens`] plus
    /// [`WorkItem::further_round_tokens`], the expected tokens (answers and thinking) still to
    /// generate on the longest path to the workflow's end, counting every round a loop may
    /// still run (an upper bound) — then first come first served. Paper
    /// 003 leaves the priority map k_t open; this is the classic list-scheduling priority for
    /// makespan (highest level first). Off (`--fifo-rank`): first come first served within a
    /// level. It orders the fused continuations and the aged units, which bind in this order;
    /// the fresh units are admitted by TAO's DP, for which the order only breaks ties. A unit
    /// that has waited [`STARVATION_S`] goes before the other aged units whatever its path, so
    /// that a short session cannot starve under sustained overload (no unit of full joint's
    /// bench runs waits that long; tiers at 200 and 300 s were measured and cost the burst
    /// 873.8 / 841.8 s against 767.4 s).
    pub critical_path_rank: bool,
}

impl Default for JointOptions {
    fn default() -> Self {
        JointOptions {
            fusion: true,
            prefetch: true,
            shared_lifecycle: true,
            resource_order: false,
            history_admission: false,
            sleep: true,
            tao_admission: true,
            drain: true,
            outlook: true,
            arrival_outlook: true,
            critical_path_rank: true,
        }
    }
}

/// A unit waiting longer than this is promoted one priority level (aging).
pub const AGING_QUANTUM_S: f64 = 30.0;
/// A unit waiting longer than this goes before every other aged unit, first come first served,
/// whatever its remaining path: the critical-path rank must not starve a short session under
/// sustained overload (no unit of full joint's bench runs waits this long).
pub const STARVATION_S: f64 = 20.0 * AGING_QUANTUM_S;
/// Dispatch slack added to the load time when deciding whether a prefetch is timely.
pub const PREFETCH_SLACK_S: f64 = 5.0;
/// With [`JointOptions::resource_order`]: bindings whose predicted completion is within this
/// factor of the best are equivalent, and the least capable device among them is taken.
pub const NEAR_BEST: f64 = 1.10;
/// A scale-out must finish the waiting units by this factor of the current completion time.
pub const SCALE_OUT_GAIN: f64 = 0.95;
/// Recent output lengths kept per logical node for the timing bucket (P90).
const HISTORY: usize = 32;
/// TAO admission's capacity quantum Δ, tokens: a workflow unit's KV envelope is a few thousand
/// tokens, a replica's free KV tens to hundreds of thousands (`bench tao` uses 2,048 for
/// sessions of 10–60k tokens).
pub const TAO_QUANTUM_TOKENS: u64 = 512;
/// Live DP states per layer before TAO admission falls back to best-fit decreasing.
pub const TAO_STATE_BUDGET: usize = 1 << 16;

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
    /// Finished fused-chain links whose chain still holds its replica: their reservation stays
    /// in that replica's book until the successor takes it over there, or the hold ends (Eq. 4:
    /// the chain's envelope governs one admission for all its links).
    held_kv: BTreeMap<ActivationId, ReplicaId>,
    /// Workflow that triggered each load (per-workflow lifecycle ablation).
    load_owner: BTreeMap<ReplicaId, u32>,
    /// (workflow, node) of each admitted unit, to record its output length when it finishes.
    history_key: BTreeMap<ActivationId, (u32, u32)>,
    /// P90 of each non-empty history (kept in step with `history`).
    p90: BTreeMap<(u32, u32), u32>,
    /// What the timeline keeps of each granted unit until it finishes — or, for a fused
    /// chain's link whose chain holds its replica, until the successor takes the hold over.
    granted: BTreeMap<ActivationId, Granted>,
    /// Predicted finish of every unit placed on this tick's timeline, its own link's (the
    /// release of what waits for it, Eq. 2; rebuilt each tick).
    finish_of: BTreeMap<ActivationId, f64>,
    /// Latest predicted finish of the ready work placed on each deployment's lanes this tick.
    latest_of: BTreeMap<DeploymentId, f64>,
    /// Where each finished LLM call ran and when it finished: the replica that may still hold
    /// its context (the cache credit of the units whose prompts start with it).
    ran_on: BTreeMap<ActivationId, (ReplicaId, f64)>,
    /// When each awake replica last became awake (a load or a wake): a context computed before
    /// is gone (a sleep or a teardown drops the prefix cache).
    awake_since: BTreeMap<ReplicaId, f64>,
    /// Tool durations per (workflow, node): TAO's estimator with its Appendix A margin.
    tool_history: ToolHistory,
    /// Tool calls in progress.
    tool_calls: BTreeMap<ActivationId, ToolCall>,
    /// TAO admission's solver (its tables are reused between solves).
    solver: Solver,
    /// Replicas draining for another deployment ([`JointOptions::drain`]): they take no new
    /// unit (a fused chain keeps its own grant) until the scale-out reclaims them.
    draining: BTreeMap<ReplicaId, DeploymentId>,
    /// When the last planning pass found a prefetch not timely yet: the earliest time one
    /// becomes timely ([`Policy::next_wakeup`]).
    prefetch_due: Option<f64>,
}

/// A granted unit as the timeline keeps it (Eq. 7 with Eq. 4's chain sum).
#[derive(Debug, Clone, Copy)]
struct Granted {
    /// Its prompt's tokens, its output limit and the batch it joined: a unit running past its
    /// prediction is predicted again at the limit.
    input: u32,
    limit: u32,
    batch: u32,
    /// Whether it runs fused with later links (its near-ready successor is timed with it).
    fused: bool,
    /// Predicted run time of the later links of its fused chain on its replica (0 unfused).
    chain_tail_s: f64,
    /// When it finished, for a link whose chain still holds its replica.
    finished_at: Option<f64>,
}

/// A TAO admission candidate: a ready unit, or a near-ready unit whose tool is about to return.
enum Candidate<'a> {
    Ready(&'a WorkItem),
    Returning(NearReadyItem),
}

/// A unit as the timeline places it: release (Eq. 2), KV reservation (bytes, Eq. 4/8), the
/// input and output lengths its own run time is predicted for (§3.3: the observed prompt, the
/// output history), and those of the later links of its fused chain, whose run times add to
/// its own (Eq. 4; `None` when unfused).
#[derive(Debug, Clone)]
struct Need {
    activation: ActivationId,
    release: f64,
    kv: u64,
    input: u32,
    output: u32,
    chain_rest: Option<Arc<[(u32, u32)]>>,
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

/// Eq. 4's admission envelope of a near-ready unit and the later links of its chain (its own
/// prompt bound and output limit when it has none).
fn near_envelope(n: &NearReadyItem) -> (u32, u32) {
    let own = LogicalNode { is_agent: true, deployment: None, prompt_bound: n.prompt_bound, output_limit: n.max_output_tokens };
    let links: Vec<LogicalNode> = std::iter::once(own)
        .chain(n.chain_rest.iter().map(|l| LogicalNode {
            is_agent: true,
            deployment: None,
            prompt_bound: l.fixed_prompt,
            output_limit: l.max_output_tokens,
        }))
        .collect();
    let consumes: Vec<Vec<usize>> = std::iter::once(Vec::new())
        .chain(n.chain_rest.iter().map(|l| l.reads.iter().map(|&k| k as usize).collect()))
        .collect();
    fusion::envelope(&links, &consumes)
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
            held_kv: BTreeMap::new(),
            load_owner: BTreeMap::new(),
            history_key: BTreeMap::new(),
            p90: BTreeMap::new(),
            granted: BTreeMap::new(),
            finish_of: BTreeMap::new(),
            latest_of: BTreeMap::new(),
            ran_on: BTreeMap::new(),
            awake_since: BTreeMap::new(),
            tool_history: ToolHistory::new(),
            tool_calls: BTreeMap::new(),
            solver: Solver::new(),
            draining: BTreeMap::new(),
            prefetch_due: None,
        }
    }

    /// Decayed KV-cache credit k·2^(−τ/h) (paper 000 Eq. 4) of a unit with `prior` context on
    /// replica `r`: the context's tokens if the call that computed them ran on `r` and `r` has
    /// stayed awake since, decayed by the time since that call finished; else 0.
    fn credit(&self, prior: Option<PriorContext>, r: ReplicaId, now: f64) -> u64 {
        let Some(p) = prior else { return 0 };
        match (self.ran_on.get(&p.activation), self.awake_since.get(&r)) {
            (Some(&(ran, at)), Some(&since)) if ran == r && since <= at => {
                tao::decayed_credit(u64::from(p.tokens), at, now, tao::HALF_LIFE_S)
            }
            _ => 0,
        }
    }

    /// Whether a near-ready unit waits only on tool calls TAO predicts to return within the
    /// horizon H (Eq. 6, on the (workflow, node) history; the default estimate makes no
    /// session ready) and none of them is overdue: a call that has outlived its prediction gets
    /// no hold (the core has no timer to release one; the next event replans).
    fn returning(&self, n: &NearReadyItem, now: f64) -> bool {
        !n.waits_for.is_empty()
            && n.waits_for.iter().all(|a| {
                self.tool_calls.get(a).is_some_and(|c| {
                    c.remaining_s(&self.tool_history, now) > 0.0 && tao::readiness(c, &self.tool_history, now)
                })
            })
    }

    /// TAO's admission (paper 000 §3.5, Eq. 7) of ready units onto the awake replicas of their
    /// deployment. Per deployment, the candidates are `units` (ready, in rank order) and the
    /// near-ready units whose tool calls are predicted to return within H (not overdue), eligible
    /// only on the replicas that hold their context (credit > 0); each replica offers
    /// its free KV (capacity less the reservations of its admitted units) in tokens. The exact
    /// capacity-state DP chooses which candidates take that capacity now and where, maximising
    /// the lexicographic sum of (decayed cache credit on the replica, readiness, token count) —
    /// never a weighted sum. Ready units it admits are granted on their lanes (where the lane
    /// also has a batch slot now); a returning unit it admits holds its reservation on the lane
    /// for this tick, so no ready unit of lower value takes the place the session will want a
    /// moment later. A deployment whose candidates all fit and hold no credit anywhere is left
    /// to the timeline (the DP would only break ties). Returns the units it granted.
    fn tao_admit(
        &mut self,
        state: &mut PlannerState,
        units: &[WorkItem],
        lanes: &mut BTreeMap<DeploymentId, Vec<Lane>>,
        now: f64,
        out: &mut Vec<Command>,
    ) -> BTreeSet<ActivationId> {
        let mut granted = BTreeSet::new();
        let deployments: BTreeSet<DeploymentId> = units.iter().map(|w| w.deployment).collect();
        for d in deployments {
            let Some(dep) = state.deployment(d).cloned() else { continue };
            let per_token = dep.kv_bytes_per_token.max(1);
            let replicas: Vec<(ReplicaId, u64)> = state
                .replicas_of(d)
                .filter(|r| {
                    r.phase == ReplicaPhase::Awake
                        && (r.leases.len() as u64) < u64::from(dep.max_num_seqs)
                        && !self.draining.contains_key(&r.id)
                })
                .map(|r| (r.id, Self::kv_capacity(state, r).saturating_sub(self.kv_in_use(r.id)) / per_token))
                .collect();
            if replicas.is_empty() {
                continue;
            }
            let mut pool: Vec<Candidate<'_>> =
                units.iter().filter(|w| w.deployment == d).map(Candidate::Ready).collect();
            pool.extend(
                state
                    .near_ready()
                    .filter(|n| n.deployment == d && self.returning(n, now))
                    .map(|n| Candidate::Returning(n.clone())),
            );
            let needs: Vec<Need> = pool
                .iter()
                .map(|c| match c {
                    Candidate::Ready(w) => self.need_of(state, w, now),
                    Candidate::Returning(n) => self.near_need(state, n, now),
                })
                .collect();
            let candidates: Vec<tao::Candidate> = pool
                .iter()
                .zip(&needs)
                .enumerate()
                .map(|(i, (c, need))| {
                    let (tokens, prior) = match c {
                        Candidate::Ready(w) => (w.prompt_tokens, w.prior_context),
                        Candidate::Returning(n) => (n.prompt_bound, n.prior_context),
                    };
                    let mut options: Vec<(usize, u64)> =
                        replicas.iter().enumerate().map(|(b, (r, _))| (b, self.credit(prior, *r, now))).collect();
                    // A returning turn may hold capacity only where its context is cached: that
                    // is what the hold protects (elsewhere it would only delay ready work).
                    if matches!(c, Candidate::Returning(_)) {
                        options.retain(|o| o.1 > 0);
                    }
                    tao::Candidate {
                        session: i as u64,
                        signature: 0,
                        weight: need.kv.div_ceil(per_token),
                        ready: true,
                        tokens: u64::from(tokens),
                        options,
                    }
                })
                .collect();
            let any_credit = candidates.iter().any(|c| c.options.iter().any(|o| o.1 > 0));
            let demand: u64 = candidates.iter().map(|c| c.weight).sum();
            let free: u64 = replicas.iter().map(|r| r.1).sum();
            if !any_credit && demand <= free {
                continue;
            }
            let problem = tao::Problem {
                candidates,
                capacities: replicas.iter().map(|r| r.1).collect(),
                quantum: TAO_QUANTUM_TOKENS,
                state_budget: TAO_STATE_BUDGET,
            };
            let Ok(plan) = self.solver.solve(&problem) else { continue };
            let plan = super::admission::balance_ties(&problem, plan);
            let tally = state.tao_checks_mut();
            tally.solves += 1;
            tally.fallbacks += u64::from(plan.fallback);
            for a in &plan.assignments {
                let k = a.session as usize;
                let (Some(c), Some(need), Some(&(r, _))) = (pool.get(k), needs.get(k), replicas.get(a.replica)) else {
                    continue;
                };
                let Some(lane) = lanes.get_mut(&d).and_then(|ls| ls.iter_mut().find(|l| l.replica == Some(r))) else {
                    continue;
                };
                let device = lane.device;
                match c {
                    Candidate::Ready(w) => {
                        let Some(slot) = lane.probe(now, need.kv, |b| self.run_on(state, &dep, device, b, need)) else {
                            continue;
                        };
                        let fits = slot.start <= now && state.replica(r).is_some_and(|rv| self.accepts(state, rv, w));
                        let link = self.slot_link(state, d, r, slot, need);
                        let tail = (slot.finish - slot.start - link).max(0.0);
                        if fits && self.grant(state, w, need, r, link, tail, now, out) {
                            lane.commit(slot, need.kv);
                            self.placed(w.activation, d, slot.start + link, slot.finish);
                            granted.insert(w.activation);
                            let cached = problem.candidates.get(k).is_some_and(|c| {
                                c.options.iter().any(|&(b, credit)| b == a.replica && credit > 0)
                            });
                            let tally = state.tao_checks_mut();
                            tally.granted += 1;
                            tally.granted_on_cache += u64::from(cached);
                        }
                    }
                    Candidate::Returning(_) => {
                        if let Some(slot) = lane.probe(now, need.kv, |b| self.run_on(state, &dep, device, b, need))
                            && slot.start <= now
                        {
                            lane.commit(slot, need.kv);
                            state.tao_checks_mut().held_for_returning += 1;
                        }
                    }
                }
            }
        }
        granted
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
        self.timing_output_of(w.workflow, w.node, w.max_output_tokens)
    }

    fn timing_output_of(&self, workflow: u32, node: u32, limit: u32) -> u32 {
        match self.p90.get(&(workflow, node)) {
            Some(&p) => p.min(limit).max(1),
            None => limit.max(1),
        }
    }

    /// KV bytes a unit reserves for admission: its envelope (Eq. 4 for a fused chain, else its
    /// own prompt) at the configured output limit, never the timing history (§3.3) — unless
    /// `history_admission`, where the output part is the timing output (P90 of recent
    /// completions, the limit without history) — and never more than the deployment's context
    /// L_max ([`PlannerState::envelope_tokens`]).
    fn kv_reservation(&self, state: &PlannerState, w: &WorkItem) -> u64 {
        let Some(d) = state.deployment(w.deployment) else { return 0 };
        let (input, limit) = state.admission_envelope(w);
        let output = if self.opts.history_admission { self.timing_output(w).min(limit) } else { limit };
        let tokens = (u64::from(input) + u64::from(output)).min(u64::from(d.max_model_len));
        tokens * d.kv_bytes_per_token
    }

    /// Input and output tokens of the later links of a fused chain whose first link (the unit)
    /// is timed for `first_output` tokens: each link's fixed prompt plus the timing outputs of
    /// the earlier links it reads (Eq. 4 with §3.3's timing). `None` when unfused or fusion is
    /// off (then every link is its own unit).
    fn chain_timing(&self, workflow: u32, first_output: u32, rest: &[ChainLink]) -> Option<Arc<[(u32, u32)]>> {
        if !self.opts.fusion || rest.is_empty() {
            return None;
        }
        let mut outputs = Vec::with_capacity(rest.len() + 1);
        outputs.push(first_output);
        let mut links = Vec::with_capacity(rest.len());
        for l in rest {
            let read: u32 = l.reads.iter().filter_map(|&k| outputs.get(k as usize)).fold(0u32, |a, &o| a.saturating_add(o));
            let output = self.timing_output_of(workflow, l.node, l.max_output_tokens);
            outputs.push(output);
            links.push((l.fixed_prompt.saturating_add(read), output));
        }
        Some(links.into())
    }

    /// KV capacity of a replica as the planner sees it.
    fn kv_capacity(state: &PlannerState, r: &ReplicaView) -> u64 {
        super::substrate::kv_capacity_bytes(state, r)
    }

    fn kv_in_use(&self, r: ReplicaId) -> u64 {
        self.kv.get(&r).map(|m| m.total).unwrap_or(0)
    }

    /// What the timeline needs of a ready unit released at `release`: timed at its observed
    /// prompt (§3.3), and for a fused chain's link with the links after it (Eq. 4).
    fn need_of(&self, state: &PlannerState, w: &WorkItem, release: f64) -> Need {
        let output = self.timing_output(w);
        Need {
            activation: w.activation,
            release,
            kv: self.kv_reservation(state, w),
            input: w.prompt_tokens,
            output,
            chain_rest: if state.fused(w) { self.chain_timing(w.workflow, output, &w.chain_rest) } else { None },
        }
    }

    /// What the timeline needs of a near-ready unit: its prompt bound and output limit, timed
    /// like a ready unit of the same node, released at its predicted release (Eq. 2).
    fn near_need(&self, state: &PlannerState, n: &NearReadyItem, release: f64) -> Need {
        let w = WorkItem {
            activation: n.activation,
            workflow: n.workflow,
            deployment: n.deployment,
            prompt_tokens: n.prompt_bound,
            max_output_tokens: n.max_output_tokens,
            ready_at: release,
            node: n.node,
            chain_prev: None,
            chain_next: !n.chain_rest.is_empty(),
            envelope: near_envelope(n),
            chain_rest: n.chain_rest.clone(),
            remaining_path_tokens: 0,
            further_round_tokens: 0,
            prior_context: None,
        };
        self.need_of(state, &w, release)
    }

    /// A replica's lane (Eq. 7's lifecycle predecessor is its load or wake), seeded with the
    /// reservations of the units admitted to it until their predicted finish — a fused chain's
    /// link until the end of its chain (Eq. 4), a finished link whose chain holds the replica
    /// until its successors have run — so the lane frees nothing [`Joint::accepts`] still
    /// counts.
    fn lane_of(&self, state: &PlannerState, r: &ReplicaView, now: f64) -> Option<Lane> {
        let d = state.deployment(r.deployment)?;
        let g = state.device(r.device)?;
        let ready_at = match r.phase {
            ReplicaPhase::Awake => now,
            ReplicaPhase::Loading { since } => (since + self.est.load_time(d, g)).max(now),
            ReplicaPhase::Waking { since, expected_s } => (since + expected_s).max(now),
        };
        let mut lane = Lane::new(Some(r.id), r.device, ready_at, Self::kv_capacity(state, r), d.max_num_seqs);
        if let Some(book) = self.kv.get(&r.id) {
            for (a, bytes) in &book.per_unit {
                lane.seed(self.booked_finish(state, *a, r, now), *bytes);
            }
        }
        Some(lane)
    }

    /// Predicted end of a booked reservation on replica `r`: a running unit's predicted finish
    /// plus its chain's later links (Eq. 4); a held link's finish plus the same. A unit running
    /// past its prediction (the P90 of its node's outputs) is predicted again at its output
    /// limit, and past that at least one decode step from now: it still holds its memory.
    fn booked_finish(&self, state: &PlannerState, a: ActivationId, r: &ReplicaView, now: f64) -> f64 {
        let held = self.held_kv.get(&a) == Some(&r.id);
        match self.predicted_finish(state, a, r, now) {
            Some((link, tail)) => link + tail,
            // A hold this policy did not grant lasts until the successor takes it over.
            None if held => f64::INFINITY,
            None => now,
        }
    }

    /// A granted unit's predicted finish on replica `r`: its own link's (as predicted at the
    /// grant) and the run time its chain's later links add. A unit running past the prediction
    /// is predicted at its output limit, and past that at least one decode step from now; a
    /// finished link whose chain holds `r` keeps its reservation until the chain's predicted
    /// end, or until its successor takes the hold over when that end has passed. `None` for a
    /// unit this policy does not know.
    fn predicted_finish(&self, state: &PlannerState, a: ActivationId, r: &ReplicaView, now: f64) -> Option<(f64, f64)> {
        let g = self.granted.get(&a)?;
        let tail = g.chain_tail_s;
        if let Some(f) = g.finished_at {
            // The successor has not taken the hold over yet: past the chain's predicted end
            // (or with no later link known) it holds the memory until it does.
            let end = if f + tail > now { f + tail } else { f64::INFINITY };
            return Some((f, end - f));
        }
        let u = state.running().get(&a)?;
        let link = u.started + u.predicted_s.unwrap_or(0.0);
        if link > now {
            return Some((link, tail));
        }
        let (d, dev) = (state.deployment(r.deployment)?, state.device(r.device)?);
        let at_limit = self.est.run_time(d, dev, g.batch, g.input, g.limit);
        let step = at_limit / f64::from(g.limit.max(1));
        Some(((u.started + at_limit).max(now + step), tail))
    }

    /// When a replica of `d` that a lifecycle action starts now on `g` would serve: after the
    /// teardown of its victims or of the device's earlier reclaims (the shells sequence them),
    /// then a wake of a sleeper of `d` there, else a load.
    fn lifecycle_ready_at(
        &self,
        state: &PlannerState,
        d: &DeploymentInfo,
        g: &DeviceInfo,
        victims: &[ReplicaId],
        now: f64,
    ) -> f64 {
        let start = if victims.is_empty() && state.tearing_down_on(g.id) == 0 { now } else { now + PLANNER_TEARDOWN_S };
        let prepare = state
            .asleep()
            .find(|a| a.deployment == d.id && a.device == g.id)
            .map_or_else(|| self.est.load_time(d, g), |a| wake_estimate_s(d.weight_bytes, &g.spec, a.level));
        start + prepare
    }

    /// The lane of a replica of `d` that does not exist yet, serving from `ready_at`.
    fn new_lane(d: &DeploymentInfo, g: &DeviceInfo, ready_at: f64) -> Lane {
        Lane::new(
            None,
            g.id,
            ready_at,
            super::substrate::kv_capacity_of(d.weight_bytes, d.claim_bytes(g)),
            d.max_num_seqs,
        )
    }

    /// Ĉ_F of `needs` on `lanes` (copied): the latest predicted finish once each is placed, in
    /// order, where it finishes earliest; `now` when none can be placed.
    fn completion(&self, state: &PlannerState, d: DeploymentId, lanes: &[Lane], needs: &[Need], now: f64) -> f64 {
        let Some(dep) = state.deployment(d) else {
            return f64::INFINITY;
        };
        let mut lanes = lanes.to_vec();
        let slots =
            place_all(&mut lanes, needs, |n| n.release, |n, _| n.kv, |n, g, b| self.run_on(state, dep, g, b, n));
        if slots.iter().any(Option::is_none) {
            return f64::INFINITY;
        }
        slots.iter().flatten().map(|(_, s)| s.finish).fold(now, f64::max)
    }

    /// Predicted run time of `n` on `device` in a batch of `batch`: its own link's, plus the
    /// later links' of its fused chain (Eq. 4: the chain keeps its replica for all of them).
    fn run_on(&self, state: &PlannerState, dep: &DeploymentInfo, device: DeviceId, batch: u32, n: &Need) -> f64 {
        let Some(g) = state.device(device) else { return f64::INFINITY };
        let rest: f64 = n.chain_rest.iter().flat_map(|r| r.iter()).map(|&(i, o)| self.est.run_time(dep, g, batch, i, o)).sum();
        self.est.run_time(dep, g, batch, n.input, n.output) + rest
    }

    /// Predicted run time of `n`'s own link alone (what its successors wait for, Eq. 2).
    fn link_run(&self, state: &PlannerState, dep: &DeploymentInfo, device: DeviceId, batch: u32, n: &Need) -> f64 {
        state.device(device).map_or(f64::INFINITY, |g| self.est.run_time(dep, g, batch, n.input, n.output))
    }

    /// Whether replica `r` accepts `w` now (awake, batch slot, KV envelope fits).
    fn accepts(&self, state: &PlannerState, r: &ReplicaView, w: &WorkItem) -> bool {
        if r.phase != ReplicaPhase::Awake {
            return false;
        }
        if let Some(p) = w.chain_prev
            && state.hold_of(p) == Some(r.id)
        {
            return true; // the chain's own grant
        }
        if self.draining.contains_key(&r.id) {
            return false;
        }
        let limit = state.deployment(r.deployment).map(|d| d.max_num_seqs).unwrap_or(0) as usize;
        r.leases.len() < limit && self.kv_in_use(r.id) + self.kv_reservation(state, w) <= Self::kv_capacity(state, r)
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

    /// Commit a grant (the plan's executable prefix): `w` runs on `r` from now, its own link
    /// for `link_s` and its fused chain's later links for `chain_tail_s` more (Eq. 4).
    #[allow(clippy::too_many_arguments)]
    fn grant(
        &mut self,
        state: &mut PlannerState,
        w: &WorkItem,
        need: &Need,
        r: ReplicaId,
        link_s: f64,
        chain_tail_s: f64,
        now: f64,
        out: &mut Vec<Command>,
    ) -> bool {
        if state.issue_dispatch(w.activation, r, now, out).is_err() {
            return false;
        }
        state.set_predicted(w.activation, link_s);
        // A fused successor takes its chain's reservation over (on the held replica), or the
        // chain's hold ended with this grant elsewhere: either way the link's entry goes.
        if let Some(p) = w.chain_prev
            && let Some(held_on) = self.held_kv.remove(&p)
        {
            self.granted.remove(&p);
            if let Some(book) = self.kv.get_mut(&held_on) {
                book.remove(p);
            }
        }
        let reservation = self.kv_reservation(state, w);
        self.kv.entry(r).or_default().insert(w.activation, reservation);
        self.history_key.insert(w.activation, (w.workflow, w.node));
        let batch = state.replica(r).map_or(1, |rv| rv.leases.len().max(1) as u32);
        self.granted.insert(w.activation, Granted {
            input: need.input,
            limit: w.max_output_tokens,
            batch,
            fused: need.chain_rest.is_some(),
            chain_tail_s,
            finished_at: None,
        });
        true
    }

    /// Own-link run time of `need` at `slot`'s batch on replica `r`'s device.
    fn slot_link(&self, state: &PlannerState, d: DeploymentId, r: ReplicaId, slot: Slot, need: &Need) -> f64 {
        match (state.deployment(d), state.replica(r)) {
            (Some(dep), Some(rv)) => self.link_run(state, dep, rv.device, slot.batch, need),
            _ => slot.finish - slot.start,
        }
    }

    /// Whether reclaiming idle replica `v` by sleep costs less than unloading it (the
    /// three-state lifecycle: awake, asleep, cold). Only where the substrate can sleep and the
    /// option is on. With predicted next use of its model in the window (ready or near-ready
    /// work), sleeping costs the sleep plus a wake, unloading the teardown plus a cold reload;
    /// without, unloading costs the teardown and sleeping a sleep now and the same teardown
    /// when its memory is needed, so the replica is unloaded.
    fn sleep_pays(&self, state: &PlannerState, v: ReplicaId, now: f64) -> bool {
        if !self.opts.sleep || state.reclaim() != Reclaim::Sleep {
            return false;
        }
        let Some(r) = state.replica(v) else { return false };
        let (Some(d), Some(g)) = (state.deployment(r.deployment), state.device(r.device)) else { return false };
        if self.next_use(state, r.deployment, now).0 > 1 {
            return false;
        }
        let level = state.sleep_level(r.deployment, r.device);
        let asleep = sleep_estimate_s(d.weight_bytes, &g.spec, level) + wake_estimate_s(d.weight_bytes, &g.spec, level);
        let cold = PLANNER_TEARDOWN_S + self.est.load_time(d, g);
        asleep < cold
    }

    /// Record a unit's place on this tick's timeline: its own link's finish (what waits for
    /// it is released then, Eq. 2) and its chain's (the deployment's work ends then).
    fn placed(&mut self, a: ActivationId, d: DeploymentId, link_finish: f64, finish: f64) {
        self.finish_of.insert(a, link_finish);
        let latest = self.latest_of.entry(d).or_insert(finish);
        *latest = latest.max(finish);
    }

    /// Predicted release of a near-ready unit (Eq. 2): the latest predicted completion of what
    /// it waits for — on the timeline for units placed this tick, else from the dispatch.
    fn release(&self, state: &PlannerState, waits_for: &[ActivationId], now: f64) -> f64 {
        waits_for
            .iter()
            .map(|a| match (self.finish_of.get(a), state.running().get(a)) {
                (Some(f), _) => f.max(now),
                (None, Some(r)) => {
                    let granted = r.replica.and_then(|id| state.replica(id)).and_then(|rv| self.predicted_finish(state, *a, rv, now));
                    granted.map_or(r.started + r.predicted_s.unwrap_or(0.0), |(link, _)| link).max(now)
                }
                (None, None) => now,
            })
            .fold(now, f64::max)
    }

    /// Demand on deployment `d` other than `exclude`: 0 = ready work, 1 = near-ready, 2 = none,
    /// with the earliest predicted release for near-ready.
    fn next_use(&self, state: &PlannerState, d: DeploymentId, now: f64) -> (u8, f64) {
        if state.queue().iter().any(|w| w.deployment == d) {
            return (0, now);
        }
        let near = state
            .near_ready()
            .filter(|n| n.deployment == d)
            .map(|n| self.release(state, &n.waits_for, now))
            .fold(f64::INFINITY, f64::min);
        if near.is_finite() { (1, near) } else { (2, f64::INFINITY) }
    }

    /// Lease-free victims on `device` in reclamation order: redundant copies first, then the
    /// most distant next use relative to reload cost, then least recently used.
    fn victims(
        &self,
        state: &PlannerState,
        device: DeviceId,
        now: f64,
        keep: &BTreeSet<DeploymentId>,
        spare: &BTreeSet<DeploymentId>,
    ) -> Vec<(ReplicaId, u64, f64)> {
        let redundant = |d: DeploymentId| state.replicas_of(d).count() > 1;
        let mut v: Vec<(u8, f64, f64, ReplicaId, u64, f64)> = state
            .replicas_on(device)
            .filter(|r| {
                r.is_idle()
                    && (!keep.contains(&r.deployment) || (spare.contains(&r.deployment) && redundant(r.deployment)))
            })
            .filter_map(|r| {
                let d = state.deployment(r.deployment)?;
                let g = state.device(r.device)?;
                let copies = state.replicas_of(r.deployment).count();
                let reload = self.est.load_time(d, g).max(1e-3);
                let (kind, at) = self.next_use(state, r.deployment, now);
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
        v.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.total_cmp(&b.2)).then(a.3.cmp(&b.3)));
        v.into_iter().map(|x| (x.3, x.4, x.5)).collect()
    }

    /// The busy redundant copy whose device, once its admitted units finish (lease-safe), torn
    /// down and loaded with `d`, brings `d`'s Ĉ_F furthest forward — by at least 1 −
    /// [`SCALE_OUT_GAIN`] from `current` — while its own deployment, one copy fewer, still
    /// finishes by then (Eq. 12 over the plan). `needs_of` gives a deployment's ready and
    /// near-ready work.
    #[allow(clippy::too_many_arguments)]
    fn drain_candidate(
        &self,
        state: &PlannerState,
        base: &BTreeMap<DeploymentId, Vec<Lane>>,
        d: DeploymentId,
        all: &[Need],
        current: f64,
        needs_of: impl Fn(DeploymentId) -> Vec<Need>,
        now: f64,
    ) -> Option<ReplicaId> {
        let dep = state.deployment(d)?;
        let eligible_count = |e: DeploymentId| state.devices().iter().filter(|h| state.eligible(e, h.id)).count();
        let own_eligible = eligible_count(d);
        let mut best: Option<(f64, ReplicaId)> = None;
        for g in state.devices().iter().filter(|g| state.eligible(d, g.id)) {
            for r in state.replicas_on(g.id) {
                if r.deployment == d || r.phase != ReplicaPhase::Awake || r.is_idle() {
                    continue;
                }
                // Only a more flexible model gives way (resource ordering, §2.3).
                if eligible_count(r.deployment) <= own_eligible {
                    continue;
                }
                let stays = state
                    .replicas_of(r.deployment)
                    .filter(|o| o.id != r.id && !self.draining.contains_key(&o.id))
                    .count();
                if stays == 0 || state.free_bytes(g.id) + r.claim_bytes < dep.claim_bytes(g) {
                    continue;
                }
                let Some(own) = base.get(&r.deployment) else { continue };
                let Some(lane) = own.iter().find(|l| l.replica == Some(r.id)) else { continue };
                let drained = lane.last_finish().unwrap_or(now).max(now);
                let ready = drained + PLANNER_TEARDOWN_S + self.est.load_time(dep, g);
                let mut with = base.get(&d).cloned().unwrap_or_default();
                with.push(Self::new_lane(dep, g, ready));
                let split = self.completion(state, d, &with, all, now);
                if !(split < now + (current - now) * SCALE_OUT_GAIN) || best.is_some_and(|(b, _)| b <= split) {
                    continue;
                }
                let rest: Vec<Lane> = own.iter().filter(|l| l.replica != Some(r.id)).cloned().collect();
                if self.completion(state, r.deployment, &rest, &needs_of(r.deployment), now) <= split {
                    best = Some((split, r.id));
                }
            }
        }
        best.map(|b| b.1)
    }

    /// Best lifecycle binding for deployment `d` serving `units`: (device, victims, Ĉ_F, H_life).
    /// `keep` lists deployments whose replicas must not be reclaimed.
    fn best_lifecycle(
        &self,
        state: &PlannerState,
        d: DeploymentId,
        needs: &[Need],
        now: f64,
        keep: &BTreeSet<DeploymentId>,
        spare: &BTreeSet<DeploymentId>,
        reclaim: bool,
    ) -> Option<(DeviceId, Vec<ReplicaId>, f64, f64)> {
        let dep = state.deployment(d)?;
        // Resource ordering (paper 003 §2.3: "placing a flexible activation on the only
        // high-capacity GPU blocks a constrained successor"): a device is *blocking* for this
        // demand when another deployment with ready or near-ready work is eligible there and
        // is more constrained (eligible on fewer devices), or has no replica and this device is
        // its last free place. Keeping that work coverable is Eq. 12's first concern.
        let eligible_count = |e: DeploymentId| state.devices().iter().filter(|h| state.eligible(e, h.id)).count();
        let own_eligible = eligible_count(d);
        let demanded: BTreeSet<DeploymentId> = state
            .queue()
            .iter()
            .map(|w| w.deployment)
            .chain(state.near_ready().map(|n| n.deployment))
            .filter(|&e| e != d)
            .collect();
        let constrained: Vec<DeploymentId> =
            demanded.iter().copied().filter(|&e| eligible_count(e) < own_eligible).collect();
        let pending: Vec<DeploymentId> =
            demanded.iter().copied().filter(|&e| state.replicas_of(e).next().is_none()).collect();
        let free_for = |e: DeploymentId, except: DeviceId| {
            state
                .devices()
                .iter()
                .filter(|h| h.id != except && state.eligible(e, h.id))
                .filter(|h| state.deployment(e).is_some_and(|de| state.free_bytes(h.id) >= de.claim_bytes(h)))
                .count()
        };
        let blocking_on = |g: DeviceId| {
            constrained.iter().filter(|&&e| state.eligible(e, g)).count()
                + pending
                    .iter()
                    .filter(|&&e| !constrained.contains(&e) && state.eligible(e, g) && free_for(e, g) == 0)
                    .count()
        };
        // Eq. 12's Ĉ_F is the latest completion of the plan's ready work: what is already placed
        // on other deployments' lanes this tick bounds it from below, so bindings that finish
        // this demand before it tie on Ĉ_F and are told apart by H_life.
        let placed_elsewhere =
            self.latest_of.iter().filter(|(e, _)| **e != d).map(|(_, f)| *f).fold(f64::NEG_INFINITY, f64::max);
        let mut candidates: Vec<(usize, DeviceId, Vec<ReplicaId>, f64, f64)> = Vec::new();
        for g in state.devices() {
            if !state.eligible(d, g.id) {
                continue;
            }
            let claim = dep.claim_bytes(g);
            let mut free = state.free_bytes(g.id);
            let mut chosen = Vec::new();
            let mut reload_cost = 0.0;
            if free < claim {
                if !reclaim {
                    continue;
                }
                for (victim, bytes, penalty) in self.victims(state, g.id, now, keep, spare) {
                    if free >= claim {
                        break;
                    }
                    free += bytes;
                    chosen.push(victim);
                    reload_cost += penalty;
                }
                if free < claim {
                    continue;
                }
            }
            let blocking = blocking_on(g.id);
            // H_life: the ready work's wait for this binding — a wake or a load, after any
            // teardown it waits for — plus the reloads its reclaims will cost.
            let ready_at = self.lifecycle_ready_at(state, dep, g, &chosen, now);
            let h_life = (ready_at - now) + reload_cost;
            // Ĉ_F of the unlocked work on the new replica's lane (its waves under the KV
            // capacity and batch limit of that device included).
            let lane = Self::new_lane(dep, g, ready_at);
            let own = self.completion(state, d, std::slice::from_ref(&lane), needs, lane.ready_at);
            let c_f = own.max(placed_elsewhere);
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
                let capability =
                    if resource_order { flops(x.1).total_cmp(&flops(y.1)) } else { std::cmp::Ordering::Equal };
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
    ) -> Option<ReplicaId> {
        for v in victims {
            if self.sleep_pays(state, *v, now) {
                state.issue_sleep(*v, now, out).ok()?;
            } else {
                state.issue_unload(*v, now, out).ok()?;
            }
            self.kv.remove(v);
            self.load_owner.remove(v);
        }
        let r = state.issue_load(d, device, now, out).ok()?;
        self.load_owner.insert(r, owner);
        Some(r)
    }
}

impl Policy for Joint {
    fn name(&self) -> &'static str {
        match (self.opts.fusion, self.opts.prefetch, self.opts.shared_lifecycle, self.opts.tao_admission) {
            (true, true, true, true) => "joint",
            (false, true, true, true) => "joint-no-fusion",
            (true, false, true, true) => "joint-no-prefetch",
            (true, true, false, true) => "joint-per-workflow-lifecycle",
            (true, true, true, false) => "joint-no-tao-admission",
            _ => "joint-ablated",
        }
    }

    fn fuses_chains(&self) -> bool {
        self.opts.fusion
    }

    /// When a prefetch the last pass found not timely yet becomes timely (its predicted
    /// release within the load time plus the dispatch slack, Alg. 1's PlanPrefetch).
    fn next_wakeup(&self, now: f64) -> Option<f64> {
        self.prefetch_due.filter(|&t| t > now)
    }

    fn observe(&mut self, event: &Event, state: &PlannerState, now: f64) {
        // Reservations of chain links whose hold ended (the session ended, the replica went).
        if !self.held_kv.is_empty() {
            let (kv, granted) = (&mut self.kv, &mut self.granted);
            self.held_kv.retain(|a, r| {
                let holds = state.hold_of(*a) == Some(*r);
                if !holds {
                    granted.remove(a);
                    if let Some(book) = kv.get_mut(r) {
                        book.remove(*a);
                    }
                }
                holds
            });
        }
        match event {
            Event::UnitFinished { activation, replica, output_tokens } => {
                if state.hold_of(*activation) == Some(*replica) {
                    self.held_kv.insert(*activation, *replica);
                    if let Some(g) = self.granted.get_mut(activation) {
                        g.finished_at = Some(now);
                    }
                } else {
                    self.granted.remove(activation);
                    if let Some(m) = self.kv.get_mut(replica) {
                        m.remove(*activation);
                    }
                }
                self.ran_on.insert(*activation, (*replica, now));
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
                self.awake_since.remove(replica);
            }
            Event::ReplicaLoaded { replica } => {
                self.awake_since.insert(*replica, now);
            }
            Event::ReplicaAsleep { replica } | Event::ReplicaUnloaded { replica } => {
                self.awake_since.remove(replica);
            }
            Event::ToolStarted { activation, workflow, node, .. } => {
                self.tool_calls.insert(*activation, ToolCall::new(format!("{workflow}/{node}"), now));
            }
            Event::ToolFinished { activation } => {
                if let Some(call) = self.tool_calls.remove(activation) {
                    // A duration from this clock is finite and non-negative: nothing to refuse.
                    let _ = self.tool_history.observe(&call.tool, call.elapsed_s(now));
                }
            }
            Event::SessionEnded { session } => {
                let first = ActivationId { session: *session, index: 0 };
                let last = ActivationId { session: *session, index: u32::MAX };
                let gone: Vec<ActivationId> = self.ran_on.range(first..=last).map(|(a, _)| *a).collect();
                for a in gone {
                    self.ran_on.remove(&a);
                }
                self.tool_calls.retain(|a, _| a.session != *session);
                self.granted.retain(|a, _| a.session != *session);
            }
            _ => {}
        }
    }

    fn plan(&mut self, state: &mut PlannerState, now: f64, out: &mut Vec<Command>) {
        // A drain lasts while its replica exists, its target still has ready work and another
        // copy of its own deployment keeps serving.
        if !self.draining.is_empty() {
            let queued: BTreeSet<DeploymentId> = state.queue().iter().map(|w| w.deployment).collect();
            let marks: Vec<(ReplicaId, DeploymentId)> = self.draining.iter().map(|(r, d)| (*r, *d)).collect();
            for (r, d) in marks {
                let keep = state.replica(r).is_some_and(|rv| {
                    queued.contains(&d)
                        && state.replicas_of(rv.deployment).any(|o| o.id != r && !self.draining.contains_key(&o.id))
                });
                if !keep {
                    self.draining.remove(&r);
                }
            }
        }
        self.prefetch_due = None;
        // Propagate's lanes: every replica, seeded with the units admitted to it.
        let mut lanes: BTreeMap<DeploymentId, Vec<Lane>> = BTreeMap::new();
        for r in state.replicas() {
            if let Some(l) = self.lane_of(state, r, now) {
                lanes.entry(r.deployment).or_default().push(l);
            }
        }
        // The lanes before this tick's placements, for pricing scale-out.
        let mut base = lanes.clone();
        self.finish_of.clear();
        self.latest_of.clear();

        // 1. RankReady.
        let mut ranked: Vec<(u8, f64, WorkItem)> =
            state.queue().iter().map(|w| (self.level(state, w, now), w.ready_at, w.clone())).collect();
        // Within a level, the longest remaining critical path first (when `critical_path_rank`),
        // then first come first served.
        let critical = self.opts.critical_path_rank;
        let starved = |w: &WorkItem| now - w.ready_at >= STARVATION_S;
        let path = |w: &WorkItem| {
            if critical && !starved(w) { w.remaining_path_tokens.saturating_add(w.further_round_tokens) } else { 0 }
        };
        ranked.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then(starved(&b.2).cmp(&starved(&a.2)))
                .then(path(&b.2).cmp(&path(&a.2)))
                .then(a.1.total_cmp(&b.1))
                .then(a.2.activation.cmp(&b.2.activation))
        });

        // 2. BestFeasibleBinding per unit on the timeline (Eq. 7, 10, 11): the lane of its
        // deployment where it finishes earliest. Units that start now on an awake replica are
        // the executable prefix and are granted; the others keep their place in the queue.
        let mut needs: BTreeMap<(DeploymentId, u32), Vec<(u8, WorkItem)>> = BTreeMap::new();
        // Ready work of each deployment in ranked order, and the deployments whose ready work
        // waits (for a load, a wake or capacity): scale-out candidates.
        let mut ready_needs: BTreeMap<DeploymentId, Vec<Need>> = BTreeMap::new();
        let mut waiting: BTreeSet<DeploymentId> = BTreeSet::new();
        // Fused continuations and aged units (levels 0 and 1) bind first; then TAO admission
        // decides which of the rest take the resident replicas' free capacity now.
        let urgent = ranked.partition_point(|x| x.0 < 2);
        let rest: Vec<WorkItem> = ranked[urgent..].iter().map(|x| x.2.clone()).collect();
        let mut admitted: BTreeSet<ActivationId> = BTreeSet::new();
        for (k, (level, _, w)) in ranked.into_iter().enumerate() {
            if k == urgent && self.opts.tao_admission {
                admitted = self.tao_admit(state, &rest, &mut lanes, now, out);
            }
            let d = w.deployment;
            let need = self.need_of(state, &w, now);
            if admitted.contains(&w.activation) {
                ready_needs.entry(d).or_default().push(need);
                continue;
            }
            // A fused successor takes its chain's grant on the held replica.
            if let Some((p, held)) = w.chain_prev.and_then(|p| Some((p, state.hold_of(p)?))) {
                let accepted = state.replica(held).is_some_and(|r| self.accepts(state, r, &w));
                let booked = state.replica(held).map(|r| self.booked_finish(state, p, r, now));
                let lane = lanes.get_mut(&d).and_then(|ls| ls.iter_mut().find(|l| l.replica == Some(held)));
                if let (true, Some(lane), Some(dep), Some(booked)) = (accepted, lane, state.deployment(d), booked) {
                    // The chain's own grant: it starts now, in the batch running there, and
                    // takes the chain's held reservation over.
                    if let Some(&bytes) = self.kv.get(&held).and_then(|b| b.per_unit.get(&p)) {
                        lane.unseed(booked, bytes);
                    }
                    let batch = lane.running_at(now) as u32 + 1;
                    let link = self.link_run(state, dep, lane.device, batch, &need);
                    let finish = now + self.run_on(state, dep, lane.device, batch, &need);
                    lane.seed(finish, need.kv);
                    self.placed(w.activation, d, now + link, finish);
                    self.grant(state, &w, &need, held, link, finish - now - link, now, out);
                    ready_needs.entry(d).or_default().push(need);
                    continue;
                }
            }
            let Some(dep) = state.deployment(d) else {
                continue;
            };
            let dep_lanes = lanes.entry(d).or_default();
            let mut best: Option<(usize, Slot)> = None;
            let mut awake_exists = false;
            for (i, lane) in dep_lanes.iter().enumerate() {
                let Some(r) = lane.replica.and_then(|id| state.replica(id)) else {
                    continue;
                };
                if self.draining.contains_key(&r.id) {
                    continue;
                }
                awake_exists |= r.phase == ReplicaPhase::Awake;
                if r.phase != ReplicaPhase::Awake && !self.covered_by_load(r, &w) {
                    continue;
                }
                let device = lane.device;
                if let Some(slot) = lane.probe(need.release, need.kv, |b| self.run_on(state, dep, device, b, &need))
                    && best.is_none_or(|(_, s)| slot.finish < s.finish)
                {
                    best = Some((i, slot));
                }
            }
            match best {
                Some((i, slot)) => {
                    let lane = &mut dep_lanes[i];
                    lane.commit(slot, need.kv);
                    let link = self.link_run(state, dep, lane.device, slot.batch, &need);
                    self.placed(w.activation, d, slot.start + link, slot.finish);
                    let replica = lane.replica;
                    let now_on_awake = slot.start <= now
                        && replica.and_then(|id| state.replica(id)).is_some_and(|r| self.accepts(state, r, &w));
                    let tail = (slot.finish - slot.start - link).max(0.0);
                    let granted = match (now_on_awake, replica) {
                        (true, Some(r)) => self.grant(state, &w, &need, r, link, tail, now, out),
                        _ => false,
                    };
                    if !granted {
                        waiting.insert(d);
                    }
                    ready_needs.entry(d).or_default().push(need);
                }
                // Replicas exist but none can ever hold it (its reservation exceeds their KV):
                // only another replica helps.
                None if awake_exists => {
                    ready_needs.entry(d).or_default().push(need);
                    waiting.insert(d);
                }
                None => {
                    let key = (d, if self.opts.shared_lifecycle { 0 } else { w.workflow });
                    needs.entry(key).or_default().push((level, w));
                }
            }
        }

        // 3. PlanReady: coalesced demand, ranked by urgency then ready work per load second.
        let demands: Vec<((DeploymentId, u32), Vec<(u8, WorkItem)>)> = needs.into_iter().collect();
        // Value of a load: the predicted ready work (seconds of run time, on the fastest eligible
        // device, each unit alone) it unlocks per second of loading.
        let value = |state: &PlannerState, d: DeploymentId, units: &[(u8, WorkItem)]| {
            let Some(dep) = state.deployment(d) else {
                return 0.0;
            };
            let mut best = 0.0f64;
            let needs: Vec<Need> = units.iter().map(|(_, w)| self.need_of(state, w, now)).collect();
            for g in state.devices().iter().filter(|g| state.eligible(d, g.id)) {
                let work: f64 = needs.iter().map(|n| self.run_on(state, dep, g.id, 1, n)).sum();
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
        ranked_demands
            .sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(b.2.total_cmp(&a.2)).then(a.3.0.cmp(&b.3.0)));
        // Deployments with ready demand are never reclaimed to make room for other demand.
        let mut keep: BTreeSet<DeploymentId> = state.queue().iter().map(|w| w.deployment).collect();
        for (_, _, _, ((d, owner), units)) in ranked_demands {
            let demand: Vec<Need> = units.iter().map(|(_, w)| self.need_of(state, w, now)).collect();
            let Some((g, victims, _, _)) = self.best_lifecycle(state, d, &demand, now, &keep, &BTreeSet::new(), true)
            else {
                ready_needs.entry(d).or_default().extend(demand);
                continue;
            };
            let owner = units.first().map(|(_, w)| w.workflow).unwrap_or(owner);
            let Some(r) = self.issue_lifecycle(state, d, g, &victims, owner, now, out) else {
                continue;
            };
            keep.insert(d);
            waiting.insert(d);
            // The new replica's lane, with the demand it was loaded for placed on it.
            let Some(mut lane) = state.replica(r).and_then(|rv| self.lane_of(state, rv, now)) else {
                continue;
            };
            base.entry(d).or_default().push(lane.clone());
            if let Some(dep) = state.deployment(d) {
                let device = lane.device;
                for n in &demand {
                    if let Some(slot) = lane.place(n.release, n.kv, |b| self.run_on(state, dep, device, b, n)) {
                        let link = self.link_run(state, dep, device, slot.batch, n);
                        self.placed(n.activation, d, slot.start + link, slot.finish);
                    }
                }
            }
            lanes.entry(d).or_default().push(lane);
            ready_needs.entry(d).or_default().extend(demand);
        }

        // Scale-out on the timeline: a deployment whose ready work waits gets another replica
        // when the work's predicted latest completion Ĉ_F (Eq. 12) with it is earlier by at least
        // 1 − SCALE_OUT_GAIN. Replicas go first to the deployment that finishes last (the plan's
        // Ĉ_F is the latest completion over all ready work), one at a time, until none gains,
        // under the substrate's replica cap. Near-ready units of the deployment are placed at
        // their predicted releases (the window's visible demand) — except a fused chain's next
        // link, which its running predecessor's reservation already times (Eq. 4). Scale-out
        // may reclaim only replicas no ready or near-ready unit needs.
        let near_of = |this: &Self, state: &PlannerState, d: DeploymentId| -> Vec<Need> {
            state
                .near_ready()
                .filter(|n| {
                    n.deployment == d
                        && !n.chain_prev.is_some_and(|p| this.granted.get(&p).is_some_and(|g| g.fused))
                })
                .map(|n| this.near_need(state, n, this.release(state, &n.waits_for, now)))
                .collect()
        };
        let mut keep_all = keep.clone();
        keep_all.extend(state.near_ready().map(|n| n.deployment));
        // Successor demand (the outlook): deployments sessions in flight will still call, with
        // how many devices each is eligible on.
        // (Only needed when some deployment's work waits: the scale-out below.)
        let eligible_count: BTreeMap<DeploymentId, usize> = if waiting.is_empty() {
            BTreeMap::new()
        } else {
            state
                .deployments()
                .iter()
                .map(|x| (x.id, state.devices().iter().filter(|h| state.eligible(x.id, h.id)).count()))
                .collect()
        };
        let called: Vec<(DeploymentId, usize)> = if self.opts.outlook {
            eligible_count
                .iter()
                .filter(|(e, _)| state.successor_sessions(**e) > 0 || (self.opts.arrival_outlook && state.arrival_outlook(**e, now)))
                .map(|(e, n)| (*e, *n))
                .collect()
        } else {
            Vec::new()
        };
        let mut demand: BTreeMap<DeploymentId, (Vec<Need>, f64)> = BTreeMap::new();
        for d in waiting {
            let mut all = ready_needs.remove(&d).unwrap_or_default();
            all.extend(near_of(self, state, d));
            let current = self.completion(state, d, base.get(&d).map_or(&[][..], |v| &v[..]), &all, now);
            demand.insert(d, (all, current));
        }
        // A drained replica that is idle now is lease-free: the scale-out below may reclaim it
        // like any idle redundant copy, for whichever deployment gains most now.
        if self.opts.drain {
            self.draining.retain(|id, _| state.replica(*id).is_some_and(|r| !r.is_idle()));
        }
        loop {
            // (current Ĉ_F, Ĉ_F with the new replica, deployment, device, victims)
            let mut pick: Option<(f64, f64, DeploymentId, DeviceId, Vec<ReplicaId>)> = None;
            for (&d, (all, current)) in &demand {
                if !self.substrate.below_cap(state, d) {
                    continue;
                }
                let mut keep_d = keep_all.clone();
                keep_d.insert(d);
                // Successor demand (the outlook): a deployment that sessions will still call
                // keeps its last replica, and a more constrained one keeps every replica, against
                // a scale-out — an optional gain must not force a reload that the graph already
                // shows coming (resource ordering, §2.3, for the constrained one's few devices).
                let own = eligible_count.get(&d).copied().unwrap_or(0);
                keep_d.extend(
                    called.iter().filter(|(e, n)| *n < own || state.replicas_of(*e).count() <= 1).map(|(e, _)| *e),
                );
                // Redundant copies of other deployments with demand may go too, when the plan's
                // Ĉ_F still falls: checked below against the victim's own completion.
                let mut spare = keep_all.clone();
                spare.remove(&d);
                let Some((g, victims, _, _)) = self.best_lifecycle(state, d, all, now, &keep_d, &spare, true) else {
                    continue;
                };
                let (Some(dep), Some(dev)) = (state.deployment(d), state.device(g)) else {
                    continue;
                };
                let mut with = base.get(&d).cloned().unwrap_or_default();
                with.push(Self::new_lane(dep, dev, self.lifecycle_ready_at(state, dep, dev, &victims, now)));
                let split = self.completion(state, d, &with, all, now);
                if !(split < now + (current - now) * SCALE_OUT_GAIN) {
                    continue;
                }
                // Eq. 12 over the plan: a deployment that gives up a copy must still finish by
                // the new completion of the one that gains it.
                let mut taken: BTreeMap<DeploymentId, Vec<ReplicaId>> = BTreeMap::new();
                for v in &victims {
                    if let Some(r) = state.replica(*v).filter(|r| spare.contains(&r.deployment)) {
                        taken.entry(r.deployment).or_default().push(*v);
                    }
                }
                let still_first = taken.iter().all(|(e, gone)| {
                    let lanes: Vec<Lane> = base
                        .get(e)
                        .map(|ls| {
                            ls.iter().filter(|l| l.replica.is_none_or(|id| !gone.contains(&id))).cloned().collect()
                        })
                        .unwrap_or_default();
                    let needs = match demand.get(e) {
                        Some((all, _)) => all.clone(),
                        None => {
                            let mut n = ready_needs.get(e).cloned().unwrap_or_default();
                            n.extend(near_of(self, state, *e));
                            n
                        }
                    };
                    self.completion(state, *e, &lanes, &needs, now) <= split
                });
                if !still_first {
                    continue;
                }
                let better = pick.as_ref().is_none_or(|p| current.total_cmp(&p.0).then(p.1.total_cmp(&split)).is_gt());
                if better {
                    pick = Some((*current, split, d, g, victims));
                }
            }
            let Some((_, _, d, g, victims)) = pick else {
                break;
            };
            let owner = state.queue().iter().find(|w| w.deployment == d).map_or(0, |w| w.workflow);
            let Some(r) = self.issue_lifecycle(state, d, g, &victims, owner, now, out) else {
                break;
            };
            if let Some(lane) = state.replica(r).and_then(|rv| self.lane_of(state, rv, now)) {
                base.entry(d).or_default().push(lane);
            }
            // The reclaimed replicas leave their deployments' lanes; the deployments whose lanes
            // changed are priced again.
            let mut changed: BTreeSet<DeploymentId> = BTreeSet::from([d]);
            for (e, lanes) in base.iter_mut() {
                let before = lanes.len();
                lanes.retain(|l| l.replica.is_none_or(|id| !victims.contains(&id)));
                if lanes.len() != before {
                    changed.insert(*e);
                }
            }
            for e in changed {
                if let Some((all, current)) = demand.get_mut(&e) {
                    *current = self.completion(state, e, base.get(&e).map_or(&[][..], |v| &v[..]), all, now);
                }
            }
        }

        // Drain-to-reclaim (`JointOptions::drain`), after the scale-out: if the deployment that
        // finishes last found no device, a busy redundant copy on a device it is eligible for
        // stops taking units, when Eq. 12 over the plan gains once it has drained.
        if self.opts.drain {
            let targets: BTreeSet<DeploymentId> = self.draining.values().copied().collect();
            let last = demand
                .iter()
                .filter(|(d, _)| self.substrate.below_cap(state, **d) && !targets.contains(d))
                .max_by(|a, b| a.1.1.total_cmp(&b.1.1).then(b.0.cmp(a.0)))
                .map(|(d, (all, current))| (*d, all.clone(), *current));
            if let Some((d, all, current)) = last {
                let needs_of = |e: DeploymentId| match demand.get(&e) {
                    Some((a, _)) => a.clone(),
                    None => {
                        let mut n = ready_needs.get(&e).cloned().unwrap_or_default();
                        n.extend(near_of(self, state, e));
                        n
                    }
                };
                if let Some(r) = self.drain_candidate(state, &base, d, &all, current, needs_of, now) {
                    self.draining.insert(r, d);
                }
            }
        }

        // 4. PlanPrefetch with the capacity no ready unit can use: every ready unit has been
        // granted, placed behind a replica's queue or a load, or found no binding the pool can
        // give it now, and the deployments with ready or near-ready demand are kept resident.
        if !self.opts.prefetch {
            return;
        }
        let mut near: BTreeMap<DeploymentId, (f64, u32)> = BTreeMap::new();
        for n in state.near_ready() {
            let r = self.release(state, &n.waits_for, now);
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
                state.count_prefetch_check(PrefetchOutcome::Resident);
                continue;
            }
            let Some((g, victims, _, _)) = self.best_lifecycle(state, d, &[], now, &keep, &BTreeSet::new(), true)
            else {
                state.count_prefetch_check(PrefetchOutcome::NoCapacity);
                continue;
            };
            let (Some(dep), Some(dev)) = (state.deployment(d), state.device(g)) else {
                continue;
            };
            let lead = self.lifecycle_ready_at(state, dep, dev, &victims, now) - now + PREFETCH_SLACK_S;
            let outcome = if release - now > lead {
                // Timely once the release is within the lead: plan again then, whatever comes.
                let due = release - lead;
                self.prefetch_due = Some(self.prefetch_due.map_or(due, |t| t.min(due)));
                PrefetchOutcome::NotTimely
            } else if self.issue_lifecycle(state, d, g, &victims, owner, now, out).is_some() {
                PrefetchOutcome::Issued
            } else {
                PrefetchOutcome::Refused
            };
            state.count_prefetch_check(outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SessionId;
    use crate::planner::{DeploymentInfo, DeviceInfo, NearReadyItem, Planner, TaoChecks};
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
        planner_in_context(devices, opts, est, 8192)
    }

    /// Deployments served with a context of `max_model_len` tokens (Eq. 8 caps reservations).
    fn planner_in_context(devices: &[&str], opts: JointOptions, est: Box<dyn Estimates>, max_model_len: u32) -> Planner {
        let devices = devices
            .iter()
            .enumerate()
            .map(|(i, n)| DeviceInfo { id: DeviceId(i as u32), spec: spec::device(n).unwrap() })
            .collect();
        let deployments = ["Qwen3-4B", "Qwen3-8B", "Qwen3-1.7B", "Qwen3-14B"]
            .iter()
            .enumerate()
            .map(|(i, name)| DeploymentInfo::of_model(DeploymentId(i as u32), &spec::model(name).unwrap(), Dtype::Fp16, max_model_len, 64))
            .collect();
        Planner::new(devices, deployments, Box::new(Joint::new(opts, est)))
    }

    /// Deployments served with a 65,536-token context, for 60,000-token envelopes.
    fn long_context(devices: &[&str], opts: JointOptions) -> Planner {
        planner_in_context(devices, opts, Box::new(Fixed), 65_536)
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
            chain_rest: Vec::new(),
            remaining_path_tokens: 200,
            further_round_tokens: 0,
            prior_context: None,
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
        let mut p =
            planner(&["A100-40GB", "A100-40GB"], JointOptions { shared_lifecycle: false, ..Default::default() });
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

    #[test]
    fn a_chains_reservation_stays_booked_between_its_links() {
        // A 4B replica on an A100 holds three 60,000-token envelopes. A fused chain's head and
        // two others fill it; when the head finishes, its chain keeps the replica for the
        // successor and the chain's envelope stays reserved (Eq. 4: one admission for the
        // chain), so newcomers wait — before, the head's reservation was freed, a newcomer
        // took it, and the successor came in over the KV capacity.
        let long = |s: u32, i: u32| WorkItem { max_output_tokens: 60_000, envelope: (500, 60_000), ..item(s, i, 0, 0) };
        let dispatched = |cmds: &[Command]| -> Vec<ActivationId> {
            cmds.iter().filter_map(|c| if let Command::Dispatch { activation, .. } = c { Some(*activation) } else { None }).collect()
        };
        let mut p = long_context(&["A100-40GB"], JointOptions::default());
        let head = WorkItem { chain_next: true, ..long(0, 0) };
        p.handle_all(vec![Event::UnitReady(head), Event::UnitReady(long(1, 0)), Event::UnitReady(long(2, 0))], 0.0).unwrap();
        let cmds = p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
        assert_eq!(dispatched(&cmds).len(), 3, "{cmds:?}");
        let cmds = p
            .handle_all(
                vec![
                    Event::UnitFinished { activation: act(0, 0), replica: ReplicaId(0), output_tokens: 100 },
                    Event::UnitReady(long(3, 0)),
                    Event::UnitReady(long(4, 0)),
                ],
                20.0,
            )
            .unwrap();
        assert!(dispatched(&cmds).is_empty(), "the held chain's envelope is still reserved: {cmds:?}");
        let next = WorkItem { chain_prev: Some(act(0, 0)), ..long(0, 1) };
        let cmds = p.handle(Event::UnitReady(next), 21.0).unwrap();
        assert_eq!(dispatched(&cmds), vec![act(0, 1)], "the successor takes the chain's reservation over");
        // A unit that finishes frees its envelope for exactly one newcomer.
        let cmds = p.handle(Event::UnitFinished { activation: act(1, 0), replica: ReplicaId(0), output_tokens: 100 }, 30.0).unwrap();
        assert_eq!(dispatched(&cmds).len(), 1, "{cmds:?}");
    }

    #[test]
    fn a_held_chains_reservation_is_not_free_on_the_predicted_timeline_either() {
        // Two 4B replicas on A100s, three 60,000-token envelopes each. The chain's head
        // finishes on one (which its chain keeps) as a unit finishes on the other: a newcomer
        // must go to the other at once. Before, the timeline took the held reservation as free
        // now, placed the newcomer on the held replica, where the admission check refused it,
        // and it waited though the other replica had room.
        let long = |s: u32, i: u32| WorkItem { max_output_tokens: 60_000, envelope: (500, 60_000), ..item(s, i, 0, 0) };
        let mut p = long_context(&["A100-40GB", "A100-40GB"], JointOptions::default());
        let head = WorkItem { chain_next: true, ..long(0, 0) };
        let mut ready = vec![Event::UnitReady(head)];
        ready.extend((1..6).map(|s| Event::UnitReady(long(s, 0))));
        let cmds = p.handle_all(ready, 0.0).unwrap();
        assert_eq!(loads(&cmds), 2, "{cmds:?}");
        let cmds = p.handle_all(vec![Event::ReplicaLoaded { replica: ReplicaId(0) }, Event::ReplicaLoaded { replica: ReplicaId(1) }], 10.0).unwrap();
        let placed: Vec<(ActivationId, ReplicaId)> =
            cmds.iter().filter_map(|c| if let Command::Dispatch { activation, replica } = c { Some((*activation, *replica)) } else { None }).collect();
        assert_eq!(placed.len(), 6, "{cmds:?}");
        let held = placed.iter().find(|(a, _)| *a == act(0, 0)).map(|(_, r)| *r).unwrap();
        let (other_unit, other) = *placed.iter().find(|(_, r)| *r != held).unwrap();
        let cmds = p
            .handle_all(
                vec![
                    Event::UnitFinished { activation: act(0, 0), replica: held, output_tokens: 100 },
                    Event::UnitFinished { activation: other_unit, replica: other, output_tokens: 100 },
                    Event::UnitReady(long(9, 0)),
                ],
                20.0,
            )
            .unwrap();
        assert_eq!(cmds, vec![Command::Dispatch { activation: act(9, 0), replica: other }], "held on {held}");
    }

    /// Input-aware estimates: a link runs (input + output) / 100 s; loads take 10 s.
    struct ByTokens;
    impl Estimates for ByTokens {
        fn name(&self) -> &str {
            "by-tokens"
        }
        fn run_time(&self, _: &DeploymentInfo, _: &DeviceInfo, _: u32, input: u32, output: u32) -> f64 {
            f64::from(input + output) / 100.0
        }
        fn load_time(&self, _: &DeploymentInfo, _: &DeviceInfo) -> f64 {
            10.0
        }
    }

    #[test]
    fn a_fused_chain_is_timed_for_the_sum_of_its_links_at_the_observed_prompt() {
        // A head with a 1,000-token prompt (envelope 2,000: its later links' prompts at their
        // producers' limits) and two later links: the second reads the head's output, the third
        // both earlier outputs. No history: each link is timed at its limit (§3.3).
        let p = planner(&["A100-40GB"], JointOptions::default());
        let link = |node: u32, fixed: u32, limit: u32, reads: Vec<u32>| ChainLink {
            node,
            fixed_prompt: fixed,
            max_output_tokens: limit,
            reads,
        };
        let head = WorkItem {
            prompt_tokens: 1000,
            max_output_tokens: 300,
            envelope: (2000, 500),
            chain_next: true,
            chain_rest: vec![link(1, 200, 400, vec![0]), link(2, 100, 500, vec![0, 1])],
            ..item(0, 0, 0, 0)
        };
        let joint = Joint::new(JointOptions::default(), Box::new(ByTokens));
        let (state, dep) = (p.state(), p.state().deployment(DeploymentId(0)).unwrap());
        let need = joint.need_of(state, &head, 0.0);
        // Own link: the observed 1,000-token prompt, not the envelope's 9,000.
        assert_eq!(joint.link_run(state, dep, DeviceId(0), 1, &need), (1000.0 + 300.0) / 100.0);
        // Eq. 4: + (200 + 300 read, 400 out) + (100 + 300 + 400 read, 500 out).
        let links = [1300.0, 900.0, 1300.0].iter().sum::<f64>() / 100.0;
        assert_eq!(joint.run_on(state, dep, DeviceId(0), 1, &need), links);
        // A chain whose envelope passes the 8,192-token context is not fused (Eq. 8 with Eq. 4):
        // its head is timed for itself alone, like every link without fusion.
        let wide = WorkItem { envelope: (9000, 500), ..head.clone() };
        assert_eq!(joint.run_on(state, dep, DeviceId(0), 1, &joint.need_of(state, &wide, 0.0)), 13.0);
        let unfused = planner(&["A100-40GB"], JointOptions { fusion: false, ..Default::default() });
        assert!(!unfused.state().fused(&head), "a policy without fusion fuses nothing");
    }

    #[test]
    fn a_reservation_never_passes_the_context() {
        // Eq. 8 on the 8,192-token context: a fused chain's head reserves its chain's envelope
        // (Eq. 4) when that fits; a chain whose envelope passes the context is not fused and its
        // head reserves its own prompt and limit; a single unit whose prompt bound and limit pass
        // the context reserves the context (one sequence never holds more).
        let p = planner(&["A100-40GB"], JointOptions::default());
        let state = p.state();
        let per_token = state.deployment(DeploymentId(0)).unwrap().kv_bytes_per_token;
        let joint = Joint::new(JointOptions::default(), Box::new(Fixed));
        let head = |envelope| WorkItem { chain_next: true, envelope, ..item(0, 0, 0, 0) };
        assert!(state.fused(&head((6000, 500))));
        assert_eq!(joint.kv_reservation(state, &head((6000, 500))), 6500 * per_token);
        assert!(!state.fused(&head((9000, 500))));
        assert_eq!(joint.kv_reservation(state, &head((9000, 500))), 700 * per_token);
        let single = WorkItem { prompt_tokens: 8000, max_output_tokens: 500, envelope: (8000, 500), ..item(1, 0, 0, 0) };
        assert_eq!(joint.kv_reservation(state, &single), 8192 * per_token);
        assert_eq!(state.envelope_tokens(&single), 8192, "the substrate counts it the same");
    }

    #[test]
    fn a_unit_running_past_its_prediction_still_holds_its_memory_on_the_timeline() {
        // Two 4B replicas on A100s, three 60,000-token envelopes each; five units run, three on
        // one replica. Long past their predicted finish (600 s) they still run: a newcomer goes
        // to the replica with room. Before, the timeline took overdue units as finished now,
        // could place the newcomer on the full replica, where the admission check refused it,
        // and it waited though the other replica had room.
        let long = |s: u32| WorkItem { max_output_tokens: 60_000, envelope: (500, 60_000), ..item(s, 0, 0, 0) };
        let mut p = long_context(&["A100-40GB", "A100-40GB"], JointOptions::default());
        let cmds = p.handle_all((0..5).map(|s| Event::UnitReady(long(s))).collect(), 0.0).unwrap();
        assert_eq!(loads(&cmds), 2, "{cmds:?}");
        let loaded = vec![Event::ReplicaLoaded { replica: ReplicaId(0) }, Event::ReplicaLoaded { replica: ReplicaId(1) }];
        let cmds = p.handle_all(loaded, 10.0).unwrap();
        let placed = dispatches(&cmds);
        assert_eq!(placed.len(), 5, "{cmds:?}");
        let on = |r: u32| placed.iter().filter(|(_, q)| *q == ReplicaId(r)).count();
        let roomy = if on(0) < on(1) { ReplicaId(0) } else { ReplicaId(1) };
        let cmds = p.handle(Event::UnitReady(long(9)), 2000.0).unwrap();
        assert_eq!(cmds, vec![Command::Dispatch { activation: act(9, 0), replica: roomy }]);
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
            prior_context: None,
            chain_prev: None,
            chain_rest: Vec::new(),
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
        assert_eq!(p.state().prefetch_checks().issued, 1);
        // The next tick finds the model resident (loading counts as resident).
        p.handle(Event::UnitNearReady(near(0, 2, 1, act(0, 0))), 10.5).unwrap();
        let checks = p.state().prefetch_checks();
        assert_eq!((checks.issued, checks.no_capacity, checks.not_timely), (1, 0, 0));
        assert!(checks.resident >= 1, "{checks:?}");
        // With prefetch off, nothing is staged and nothing is checked.
        let mut p = planner(&["A100-40GB", "A100-40GB"], JointOptions { prefetch: false, ..Default::default() });
        p.handle(Event::UnitReady(item(0, 0, 0, 0)), 0.0).unwrap();
        p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
        assert!(p.handle(Event::UnitNearReady(near(0, 1, 1, act(0, 0))), 10.0).unwrap().is_empty());
        assert_eq!(p.state().prefetch_checks(), Default::default());
    }

    #[test]
    fn a_prefetch_waits_until_the_release_is_within_the_load_time() {
        // The near-ready unit waits on a unit predicted to run 100 s (10,000 output tokens):
        // its release is far beyond the 10 s load plus slack, so the check finds it not yet
        // timely and stages nothing.
        let mut p = planner(&["A100-40GB", "A100-40GB"], JointOptions::default());
        let mut long = item(0, 0, 0, 0);
        long.max_output_tokens = 10_000;
        p.handle(Event::UnitReady(long), 0.0).unwrap();
        p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
        let cmds = p.handle(Event::UnitNearReady(near(0, 1, 1, act(0, 0))), 10.0).unwrap();
        assert_eq!(loads(&cmds), 0, "{cmds:?}");
        let checks = p.state().prefetch_checks();
        assert_eq!((checks.issued, checks.not_timely), (0, 1), "{checks:?}");
        // It asks to plan again when the release (110 s) is within the load plus the slack
        // (15 s), and then stages the deployment though no event came.
        assert_eq!(p.next_wakeup(10.0), Some(110.0 - 10.0 - PREFETCH_SLACK_S));
        let cmds = p.handle_all(Vec::new(), 95.0).unwrap();
        assert_eq!(loads(&cmds), 1, "{cmds:?}");
        assert_eq!(p.next_wakeup(95.0), None);
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
        // The check saw the absent model and found no capacity to stage it in.
        let checks = p.state().prefetch_checks();
        assert_eq!((checks.issued, checks.no_capacity), (0, 1), "{checks:?}");
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
            .handle_all(
                vec![Event::ReplicaLoaded { replica: ReplicaId(0) }, Event::UnitNearReady(near(0, 1, 1, act(0, 0)))],
                10.0,
            )
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
        let long =
            |s: u32| WorkItem { max_output_tokens: 60_000, envelope: (500, 60_000), node: 0, ..item(s, 0, 0, 0) };
        let admitted = |opts: JointOptions| {
            let mut p = long_context(&["A100-40GB"], opts);
            p.handle(Event::UnitReady(item(0, 0, 0, 0)), 0.0).unwrap();
            p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
            p.handle(Event::UnitFinished { activation: act(0, 0), replica: ReplicaId(0), output_tokens: 100 }, 11.0)
                .unwrap();
            let cmds = p.handle_all((1..=10).map(|s| Event::UnitReady(long(s))).collect(), 12.0).unwrap();
            cmds.iter().filter(|c| matches!(c, Command::Dispatch { .. })).count()
        };
        assert_eq!(admitted(JointOptions::default()), 3);
        assert_eq!(admitted(JointOptions { history_admission: true, ..Default::default() }), 10);
    }

    #[test]
    fn a_flexible_deployment_leaves_the_constrained_ones_device_alone() {
        // Qwen3-14B (deployment 3) fits only the A100s; Qwen3-4B fits everywhere and runs 5 %
        // faster on an A100. With 14B work waiting, the 4B load takes the V100 (resource
        // ordering, paper 003 §2.3) and the second A100 stays free for the 14B.
        let mut p =
            planner_with(&["A100-40GB", "V100-32GB", "A100-40GB"], JointOptions::default(), Box::new(SlowerOnVolta));
        let mut events: Vec<Event> = (0..8).map(|s| Event::UnitReady(item(s, 0, 3, 0))).collect();
        events.push(Event::UnitReady(item(100, 0, 0, 1)));
        let cmds = p.handle_all(events, 0.0).unwrap();
        let placed = |d: u32| {
            cmds.iter()
                .filter_map(|c| match c {
                    Command::Load { deployment, device, .. } if deployment.0 == d => Some(device.0),
                    _ => None,
                })
                .collect::<Vec<u32>>()
        };
        assert_eq!(placed(0), vec![1], "{cmds:?}");
        assert!(placed(3).iter().all(|g| *g != 1) && placed(3).contains(&0), "{cmds:?}");
        // Without the 14B work, the 4B takes the faster A100.
        let mut p =
            planner_with(&["A100-40GB", "V100-32GB", "A100-40GB"], JointOptions::default(), Box::new(SlowerOnVolta));
        let cmds = p.handle(Event::UnitReady(item(100, 0, 0, 1)), 0.0).unwrap();
        assert!(matches!(cmds[0], Command::Load { device: DeviceId(0), .. }), "{cmds:?}");
    }

    #[test]
    fn lifecycle_overhead_counts_the_teardown_a_binding_waits_for() {
        // Eq. 12's H_life is the ready work's wait for the binding plus the reloads its reclaims
        // cost: on a device holding an idle Qwen3-14B replica that nothing needs, a Qwen3-8B
        // load waits for its teardown and then loads (10 s here); on an empty device it only
        // loads. (It was the load alone for every binding, so when Ĉ_F tied — floored by other
        // deployments' later work — the device id chose, and an idle replica could be unloaded
        // while another device stood empty.)
        let mut p = planner(&["A100-40GB", "A100-40GB"], JointOptions::default());
        p.handle(Event::UnitReady(item(0, 0, 3, 0)), 0.0).unwrap();
        p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
        p.handle(Event::UnitFinished { activation: act(0, 0), replica: ReplicaId(0), output_tokens: 100 }, 12.0).unwrap();
        let joint = Joint::new(JointOptions::default(), Box::new(Fixed));
        let none = BTreeSet::new();
        let h_life = |state: &PlannerState| joint.best_lifecycle(state, DeploymentId(1), &[], 12.0, &none, &none, true);
        let (g, victims, _, h) = h_life(p.state()).expect("a binding");
        assert_eq!((g, victims.is_empty(), h), (DeviceId(1), true, 10.0), "the empty device, a load alone");
        // With only the 14B's device: its teardown, then the load.
        let mut p = planner(&["A100-40GB"], JointOptions::default());
        p.handle(Event::UnitReady(item(0, 0, 3, 0)), 0.0).unwrap();
        p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
        p.handle(Event::UnitFinished { activation: act(0, 0), replica: ReplicaId(0), output_tokens: 100 }, 12.0).unwrap();
        let (g, victims, _, h) = h_life(p.state()).expect("a binding");
        assert_eq!((g, victims), (DeviceId(0), vec![ReplicaId(0)]));
        assert_eq!(h, PLANNER_TEARDOWN_S + 10.0);
    }

    #[test]
    fn scale_out_sees_the_waves_a_replica_must_run_and_grants_only_what_fits_now() {
        // Units whose 8,192-token envelope lets one 8B replica on an A100 hold only a few at a
        // time: the timeline shows them running in waves, so a second replica is loaded at once
        // although each unit alone would run no faster there.
        let long = |s: u32| WorkItem { max_output_tokens: 8192, envelope: (500, 8192), ..item(s, 0, 1, 0) };
        let mut p = planner(&["A100-40GB", "A100-40GB"], JointOptions::default());
        let cmds = p.handle_all((0..40).map(|s| Event::UnitReady(long(s))).collect(), 0.0).unwrap();
        assert_eq!(loads(&cmds), 2, "{cmds:?}");
        // When the first replica is up, only the units whose reservations fit are granted; the
        // rest stay queued for the next event.
        let cmds = p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
        let granted = cmds.iter().filter(|c| matches!(c, Command::Dispatch { .. })).count();
        let r = p.state().replica(ReplicaId(0)).unwrap();
        // Each reserves its envelope of 500 + 8,192 tokens, capped at the 8,192-token context
        // (Eq. 8: one sequence never holds more).
        let per_unit = 8192 * p.state().deployment(DeploymentId(1)).unwrap().kv_bytes_per_token;
        let capacity = crate::planner::substrate::kv_capacity_bytes(p.state(), r);
        assert_eq!(granted as u64, capacity / per_unit, "{cmds:?}");
        assert!(granted > 0 && granted < 40);
        assert_eq!(p.state().queue().len(), 40 - granted);
    }

    #[test]
    fn a_reclaimed_replica_sleeps_when_its_model_is_needed_again_and_is_unloaded_otherwise() {
        // One A100 holds a Qwen3-4B replica whose unit has finished; a Qwen3-8B unit needs the
        // device. On the substrate that can sleep, the 4B sleeps when a near-ready 4B unit is in
        // the window (a sleep and a wake cost less than a teardown and a reload) and is unloaded
        // when nothing needs it; with `sleep` off (`--no-sleep`) it is always unloaded.
        let reclaim = |opts: JointOptions, near_ready: bool| {
            let mut p = planner(&["A100-40GB"], opts);
            p.set_substrate_lifecycle(Reclaim::Sleep, vec![0], vec![1 << 40]);
            p.handle(Event::UnitReady(item(0, 0, 0, 0)), 0.0).unwrap();
            p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
            let mut events =
                vec![Event::UnitFinished { activation: act(0, 0), replica: ReplicaId(0), output_tokens: 100 }];
            if near_ready {
                events.push(Event::UnitNearReady(near(1, 1, 0, act(9, 9))));
            }
            events.push(Event::UnitReady(item(2, 0, 1, 0)));
            let cmds = p.handle_all(events, 12.0).unwrap();
            match cmds.first() {
                Some(Command::Sleep { replica: ReplicaId(0), level: 1 }) => "sleep",
                Some(Command::Unload { replica: ReplicaId(0) }) => "unload",
                other => panic!("expected a reclaim first: {other:?} in {cmds:?}"),
            }
        };
        assert_eq!(reclaim(JointOptions::default(), true), "sleep");
        assert_eq!(reclaim(JointOptions::default(), false), "unload");
        assert_eq!(reclaim(JointOptions { sleep: false, ..Default::default() }, true), "unload");
    }

    #[test]
    fn scale_out_takes_a_redundant_copy_of_a_needed_model_when_the_plan_finishes_earlier() {
        // Three A100s. Forty long Qwen3-4B units get two replicas (one would run them in two
        // waves); they finish and both copies idle while a 4B unit is near-ready. Then forty long
        // Qwen3-14B units arrive: a 14B replica loads on the free A100, and scale-out reclaims one
        // redundant 4B copy for a second 14B replica (the 4B's near-ready unit still finishes long
        // before the 14B work), never the last copy.
        let long = |s: u32, d: u32| WorkItem { max_output_tokens: 8192, envelope: (500, 8192), ..item(s, 0, d, 0) };
        let mut p = planner(&["A100-40GB", "A100-40GB", "A100-40GB"], JointOptions::default());
        let cmds = p.handle_all((0..40).map(|s| Event::UnitReady(long(s, 0))).collect(), 0.0).unwrap();
        assert_eq!(loads(&cmds), 2, "{cmds:?}");
        let cmds = p
            .handle_all(
                vec![Event::ReplicaLoaded { replica: ReplicaId(0) }, Event::ReplicaLoaded { replica: ReplicaId(1) }],
                10.0,
            )
            .unwrap();
        let granted: Vec<(ActivationId, ReplicaId)> = cmds
            .iter()
            .filter_map(|c| match c {
                Command::Dispatch { activation, replica } => Some((*activation, *replica)),
                _ => None,
            })
            .collect();
        assert_eq!(granted.len(), 40, "{cmds:?}");
        let mut done: Vec<Event> = granted
            .iter()
            .map(|(a, r)| Event::UnitFinished { activation: *a, replica: *r, output_tokens: 8000 })
            .collect();
        done.push(Event::UnitNearReady(near(50, 1, 0, act(99, 99))));
        p.handle_all(done, 92.0).unwrap();
        let cmds = p.handle_all((100..140).map(|s| Event::UnitReady(long(s, 3))).collect(), 100.0).unwrap();
        let unloads = cmds.iter().filter(|c| matches!(c, Command::Unload { .. })).count();
        let loads_14b = cmds.iter().filter(|c| matches!(c, Command::Load { deployment: DeploymentId(3), .. })).count();
        assert_eq!((loads_14b, unloads), (2, 1), "{cmds:?}");
        assert_eq!(p.state().replicas_of(DeploymentId(0)).count(), 1, "the last 4B copy stays");
    }

    /// One replica of deployment `idle` on device 0 ran its unit and idles (nothing in the window
    /// needs it); a session's outlook names it when `called`; sessions of a workflow that calls
    /// it arrive (and end at once) at the times `arrivals`, all before 10 s; then 200 long units
    /// of `burst` arrive. Whether the burst's scale-out reclaims the idle replica.
    fn scale_out_reclaims_idle_after(
        devices: &[&str],
        idle: u32,
        burst: u32,
        opts: JointOptions,
        called: bool,
        arrivals: &[f64],
    ) -> bool {
        let long = |s: u32| WorkItem { max_output_tokens: 8192, envelope: (500, 8192), ..item(s, 0, burst, 0) };
        let mut p = planner_with(devices, opts, Box::new(SlowerOnVolta));
        p.handle(Event::UnitReady(item(0, 0, idle, 0)), 0.0).unwrap();
        for (i, &t) in arrivals.iter().enumerate() {
            let session = SessionId(50 + i as u32);
            let events = vec![
                Event::SessionArrived { session, workflow: 5 },
                Event::SessionOutlook { session, deployments: vec![DeploymentId(idle)] },
                Event::SessionEnded { session },
            ];
            p.handle_all(events, t).unwrap();
        }
        let cmds = p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 10.0).unwrap();
        assert!(cmds.iter().any(|c| matches!(c, Command::Dispatch { .. })), "{cmds:?}");
        let mut events = vec![Event::UnitFinished { activation: act(0, 0), replica: ReplicaId(0), output_tokens: 100 }];
        if called {
            events.push(Event::SessionOutlook { session: SessionId(7), deployments: vec![DeploymentId(idle)] });
        }
        p.handle_all(events, 12.0).unwrap();
        assert_eq!(p.state().successor_sessions(DeploymentId(idle)), u32::from(called));
        let cmds = p.handle_all((100..300).map(|s| Event::UnitReady(long(s))).collect(), 20.0).unwrap();
        cmds.iter().any(|c| matches!(c, Command::Unload { replica: ReplicaId(0) }))
    }

    fn scale_out_reclaims_idle(devices: &[&str], idle: u32, burst: u32, opts: JointOptions, called: bool) -> bool {
        scale_out_reclaims_idle_after(devices, idle, burst, opts, called, &[])
    }

    #[test]
    fn scale_out_keeps_an_idle_constrained_replica_that_sessions_will_still_call() {
        // Two A100s and a V100: a Qwen3-14B replica (A100s only) idles; long Qwen3-4B units (any
        // device) arrive. The 4B's scale-out may take the 14B's A100 unless a session can still
        // call the 14B and the outlook is on (the 14B has more than its last copy's protection:
        // it is more constrained than the 4B).
        let devices = ["A100-40GB", "A100-40GB", "V100-32GB"];
        let run = |opts, called| scale_out_reclaims_idle(&devices, 3, 0, opts, called);
        assert!(!run(JointOptions::default(), true), "the 14B that a session will call stays");
        assert!(run(JointOptions::default(), false), "no session will call it: the scale-out takes it");
        assert!(run(JointOptions { outlook: false, ..Default::default() }, true), "--no-outlook: only the window counts");
    }

    #[test]
    fn scale_out_keeps_the_last_replica_of_a_model_that_sessions_will_still_call() {
        // Two A100s: the only Qwen3-4B replica idles; long Qwen3-8B units (eligible on the same
        // devices) arrive.
        let devices = ["A100-40GB", "A100-40GB"];
        let run = |opts, called| scale_out_reclaims_idle(&devices, 0, 1, opts, called);
        assert!(!run(JointOptions::default(), true), "the last 4B copy that a session will call stays");
        assert!(run(JointOptions::default(), false), "no session will call it: the scale-out takes it");
        assert!(run(JointOptions { outlook: false, ..Default::default() }, true), "--no-outlook: only the window counts");
    }

    #[test]
    fn scale_out_keeps_the_last_replica_of_a_model_that_arriving_sessions_will_call() {
        // As above, with no session in flight calling the idle 4B: sessions of a workflow that
        // calls it arrived at 1, 5 and 9 s (a mean gap of 4 s), so at 20 s its next session is
        // still expected. Arrivals that stopped (three at 9.0–9.5 s: ten mean gaps of 0.25 s
        // passed) and a burst (three at 9 s) protect nothing; neither does one arrival.
        let devices = ["A100-40GB", "A100-40GB"];
        let run = |opts, arrivals: &[f64]| scale_out_reclaims_idle_after(&devices, 0, 1, opts, false, arrivals);
        assert!(!run(JointOptions::default(), &[1.0, 5.0, 9.0]), "the workflow still arrives: its 4B stays");
        assert!(run(JointOptions::default(), &[9.0, 9.25, 9.5]), "its arrivals stopped");
        assert!(run(JointOptions::default(), &[9.0, 9.0, 9.0]), "a burst is over once it arrived");
        assert!(run(JointOptions::default(), &[9.0]), "one arrival gives no rate");
        let off = JointOptions { arrival_outlook: false, ..Default::default() };
        assert!(run(off, &[1.0, 5.0, 9.0]), "--no-arrival-outlook: only sessions in flight count");
        let off = JointOptions { outlook: false, ..Default::default() };
        assert!(run(off, &[1.0, 5.0, 9.0]), "--no-outlook: neither counts");
    }

    #[test]
    fn drain_stops_feeding_a_busy_redundant_copy_and_reclaims_it_once_its_units_finish() {
        // Three A100s and a V100 (where the 4B fits and the 14B does not). Forty long Qwen3-4B
        // units get two replicas on A100s and run; sixty more 4B units queue behind them and forty
        // long Qwen3-14B units arrive: the 14B loads on the free A100 and can gain no other device
        // (both A100 4B copies are busy). With drain, one of them takes no new unit; when its
        // units finish it is reclaimed for a second 14B replica while the other copies serve the
        // 4B queue. Without drain both keep serving the 4B queue.
        let long = |s: u32, d: u32| WorkItem { max_output_tokens: 8192, envelope: (500, 8192), ..item(s, 0, d, 0) };
        let loads_of = |cmds: &[Command], d: u32| {
            cmds.iter()
                .filter(|c| matches!(c, Command::Load { deployment, .. } if *deployment == DeploymentId(d)))
                .count()
        };
        let unloads = |cmds: &[Command]| cmds.iter().filter(|c| matches!(c, Command::Unload { .. })).count();
        for drain in [false, true] {
            let devices = ["A100-40GB", "A100-40GB", "A100-40GB", "V100-32GB"];
            let mut p = planner(&devices, JointOptions { drain, ..Default::default() });
            let cmds = p.handle_all((0..40).map(|s| Event::UnitReady(long(s, 0))).collect(), 0.0).unwrap();
            assert_eq!(loads(&cmds), 2, "{cmds:?}");
            let loaded =
                vec![Event::ReplicaLoaded { replica: ReplicaId(0) }, Event::ReplicaLoaded { replica: ReplicaId(1) }];
            let mut running = dispatches(&p.handle_all(loaded, 10.0).unwrap());
            assert_eq!(running.len(), 40);
            let mut arrivals: Vec<Event> = (100..160).map(|s| Event::UnitReady(long(s, 0))).collect();
            arrivals.extend((200..240).map(|s| Event::UnitReady(long(s, 3))));
            let cmds = p.handle_all(arrivals, 20.0).unwrap();
            assert_eq!(loads_of(&cmds, 3), 1, "the 14B loads on the free A100: {cmds:?}");
            running.extend(dispatches(&cmds));
            let done = running
                .iter()
                .map(|(a, r)| Event::UnitFinished { activation: *a, replica: *r, output_tokens: 8000 })
                .collect();
            let cmds = p.handle_all(done, 92.0).unwrap();
            let fed = |r: u32| dispatches(&cmds).iter().filter(|g| g.1 == ReplicaId(r)).count();
            if drain {
                assert_eq!((fed(0), unloads(&cmds), loads_of(&cmds, 3)), (0, 1, 1), "{cmds:?}");
                assert!(fed(1) > 0, "the other 4B copy serves the queue: {cmds:?}");
                assert!(p.state().replica(ReplicaId(0)).is_none(), "the drained copy is reclaimed");
            } else {
                assert!(fed(0) > 0 && fed(1) > 0, "{cmds:?}");
                assert_eq!((unloads(&cmds), loads_of(&cmds, 3)), (0, 0), "{cmds:?}");
            }
        }
    }

    /// Forty long Qwen3-8B units on two A100s: two replicas, each full after its first wave at
    /// t = 10. Returns the planner and the grants.
    fn two_full_replicas(opts: JointOptions) -> (Planner, Vec<(ActivationId, ReplicaId)>) {
        let mut p = planner(&["A100-40GB", "A100-40GB"], opts);
        p.handle_all((0..40).map(|s| Event::UnitReady(long_unit(s, 0))).collect(), 0.0).unwrap();
        let cmds = p
            .handle_all(
                vec![Event::ReplicaLoaded { replica: ReplicaId(0) }, Event::ReplicaLoaded { replica: ReplicaId(1) }],
                10.0,
            )
            .unwrap();
        let granted = dispatches(&cmds);
        assert!(granted.len() < 40 && granted.iter().any(|g| g.1 == ReplicaId(1)), "{cmds:?}");
        (p, granted)
    }

    fn long_unit(s: u32, i: u32) -> WorkItem {
        WorkItem { max_output_tokens: 8192, envelope: (500, 8192), ..item(s, i, 1, 0) }
    }

    fn dispatches(cmds: &[Command]) -> Vec<(ActivationId, ReplicaId)> {
        cmds.iter()
            .filter_map(|c| match c {
                Command::Dispatch { activation, replica } => Some((*activation, *replica)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_session_with_the_longest_remaining_path_goes_first_within_a_level() {
        // Forty long 8B units of short sessions are queued at t = 0, then one of a session with
        // far more work ahead (e.g. a repair loop with rounds to go) at t = 1. The replica's KV
        // holds far fewer than forty; once it has loaded, all are aged alike, and the critical
        // path rank admits the late unit with the first; first come first served leaves it
        // queued behind the earlier ones.
        for critical in [true, false] {
            let mut p = planner(&["A100-40GB"], JointOptions { critical_path_rank: critical, ..Default::default() });
            p.handle_all((0..40).map(|s| Event::UnitReady(long_unit(s, 0))).collect(), 0.0).unwrap();
            let late = WorkItem { ready_at: 1.0, further_round_tokens: 50_000, ..long_unit(99, 0) };
            p.handle(Event::UnitReady(late.clone()), 1.0).unwrap();
            let cmds = dispatches(&p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 60.0).unwrap());
            assert!(!cmds.is_empty() && cmds.len() < 40, "{cmds:?}");
            let admitted = cmds.iter().any(|c| c.0 == late.activation);
            assert_eq!(admitted, critical, "critical path rank {critical}: {cmds:?}");
            // Among the others the order stays first come first served.
            let first: Vec<u32> = cmds.iter().filter(|c| c.0 != late.activation).map(|c| c.0.session.0).collect();
            assert_eq!(first, (0..first.len() as u32).collect::<Vec<_>>(), "{cmds:?}");
        }
    }

    #[test]
    fn a_unit_waiting_past_the_starvation_bound_goes_first_whatever_its_path() {
        // A short-path unit queued at t = 0, forty long-path units at `at` − 500 s; the replica
        // (KV for far fewer than forty) loads at `at`. Everything is aged; the long paths go
        // first until the short unit has waited STARVATION_S.
        let admitted_short = |at: f64| {
            let mut p = planner(&["A100-40GB"], JointOptions::default());
            let short = long_unit(99, 0);
            p.handle(Event::UnitReady(short.clone()), 0.0).unwrap();
            let long = (0..40)
                .map(|s| Event::UnitReady(WorkItem { ready_at: at - 500.0, further_round_tokens: 50_000, ..long_unit(s, 0) }))
                .collect();
            p.handle_all(long, at - 500.0).unwrap();
            let cmds = dispatches(&p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, at).unwrap());
            assert!(!cmds.is_empty() && cmds.len() < 40, "{cmds:?}");
            cmds.iter().any(|c| c.0 == short.activation)
        };
        assert!(!admitted_short(STARVATION_S - 10.0), "not yet starved: the long paths first");
        assert!(admitted_short(STARVATION_S + 10.0), "starved: first, whatever its path");
    }

    #[test]
    fn tao_admission_gives_freed_capacity_to_the_turn_whose_context_the_replica_holds() {
        // One unit finishes on each replica; the next turn of the session on replica 1 arrives,
        // behind older units queued without cache credit anywhere. TAO admission gives it the
        // slot on the replica that holds its context (credit first); first-fit in rank order
        // takes the two oldest units instead.
        for tao in [true, false] {
            let (mut p, granted) = two_full_replicas(JointOptions { tao_admission: tao, ..Default::default() });
            let on = |r: u32| granted.iter().find(|g| g.1 == ReplicaId(r)).copied().unwrap();
            let (a0, a1) = (on(0), on(1));
            let next = WorkItem {
                ready_at: 20.0,
                prior_context: Some(PriorContext { activation: a1.0, tokens: 4096 }),
                ..long_unit(a1.0.session.0, 1)
            };
            let events = vec![
                Event::UnitFinished { activation: a0.0, replica: a0.1, output_tokens: 8000 },
                Event::UnitFinished { activation: a1.0, replica: a1.1, output_tokens: 8000 },
                Event::UnitReady(next.clone()),
            ];
            let cmds = dispatches(&p.handle_all(events, 20.0).unwrap());
            assert_eq!(cmds.len(), 2, "{cmds:?}");
            let oldest: Vec<ActivationId> = p.state().queue().iter().map(|w| w.activation).collect();
            let tally = p.state().tao_checks();
            if tao {
                assert!(cmds.contains(&(next.activation, ReplicaId(1))), "{cmds:?}");
                // The report's counters: the turn was granted where its context is cached.
                assert!(tally.solves >= 1 && tally.fallbacks == 0, "{tally:?}");
                assert!(tally.granted >= 2 && tally.granted_on_cache >= 1, "{tally:?}");
            } else {
                assert!(!cmds.iter().any(|c| c.0 == next.activation), "{cmds:?}");
                assert!(oldest.contains(&next.activation));
                assert_eq!(tally, TaoChecks::default(), "no TAO admission, nothing counted");
            }
        }
    }

    #[test]
    fn tao_admission_holds_capacity_for_a_turn_whose_tool_is_about_to_return() {
        // A tool of node 7 took 2 s once. Session A's turn finished on replica r and its tool
        // started at t = 20: predicted back at 22, beyond the 1 s horizon, so the slot A freed
        // goes to a queued unit. At 21.5 another unit finishes on r: A's tool is now predicted
        // within H, and TAO holds the freed slot for A's next turn (it has credit there) instead
        // of granting a queued unit; when the tool returns, the turn is granted on r.
        for tao in [true, false] {
            let (mut p, granted) = two_full_replicas(JointOptions { tao_admission: tao, ..Default::default() });
            p.handle(Event::ToolStarted { activation: act(600, 1), predicted_s: 9.0, workflow: 0, node: 7 }, 10.5)
                .unwrap();
            p.handle(Event::ToolFinished { activation: act(600, 1) }, 12.5).unwrap();
            let r = granted[0].1;
            let on_r: Vec<ActivationId> = granted.iter().filter(|g| g.1 == r).map(|g| g.0).collect();
            let (a, b) = (on_r[0], on_r[1]);
            let tool = ActivationId { session: a.session, index: 1 };
            let next_turn = ActivationId { session: a.session, index: 2 };
            let prior = Some(PriorContext { activation: a, tokens: 4096 });
            let near_turn =
                NearReadyItem { max_output_tokens: 8192, prior_context: prior, ..near(a.session.0, 2, 1, tool) };
            let events = vec![
                Event::UnitFinished { activation: a, replica: r, output_tokens: 8000 },
                Event::ToolStarted { activation: tool, predicted_s: 2.0, workflow: 0, node: 7 },
                Event::UnitNearReady(near_turn),
            ];
            let cmds = dispatches(&p.handle_all(events, 20.0).unwrap());
            assert_eq!(cmds.len(), 1, "the slot A freed goes to a queued unit: {cmds:?}");
            let cmds = dispatches(
                &p.handle(Event::UnitFinished { activation: b, replica: r, output_tokens: 8000 }, 21.5).unwrap(),
            );
            if tao {
                assert!(cmds.is_empty(), "the slot is held for A's returning turn: {cmds:?}");
                assert!(p.state().tao_checks().held_for_returning >= 1, "{:?}", p.state().tao_checks());
                let turn = WorkItem { ready_at: 22.0, prior_context: prior, ..long_unit(a.session.0, 2) };
                let events = vec![Event::ToolFinished { activation: tool }, Event::UnitReady(turn)];
                let cmds = dispatches(&p.handle_all(events, 22.0).unwrap());
                assert_eq!(cmds, vec![(next_turn, r)]);
            } else {
                assert_eq!(cmds.len(), 1, "first-fit grants a queued unit: {cmds:?}");
                assert_ne!(cmds[0].0, next_turn);
            }
        }
    }

    #[test]
    fn cache_credit_decays_and_is_lost_with_the_replica_s_cache() {
        let devices: Vec<DeviceInfo> = vec![DeviceInfo { id: DeviceId(0), spec: spec::device("A100-40GB").unwrap() }];
        let state = PlannerState::new(devices, Vec::new());
        let mut j = Joint::new(JointOptions::default(), Box::new(Fixed));
        let r = ReplicaId(0);
        j.observe(&Event::ReplicaLoaded { replica: r }, &state, 5.0);
        j.observe(&Event::UnitFinished { activation: act(0, 0), replica: r, output_tokens: 10 }, &state, 10.0);
        let prior = Some(PriorContext { activation: act(0, 0), tokens: 4096 });
        assert_eq!(j.credit(prior, r, 10.0), 4096);
        assert_eq!(j.credit(prior, r, 20.0), 2048, "half-life h = 10 s");
        assert_eq!(j.credit(prior, ReplicaId(1), 10.0), 0, "no credit where it did not run");
        assert_eq!(j.credit(None, r, 10.0), 0);
        // A sleep drops the prefix cache: after the wake, the context is gone.
        j.observe(&Event::ReplicaAsleep { replica: r }, &state, 11.0);
        assert_eq!(j.credit(prior, r, 11.0), 0);
        j.observe(&Event::ReplicaLoaded { replica: r }, &state, 12.0);
        assert_eq!(j.credit(prior, r, 12.0), 0);
        // The session's end forgets it.
        j.observe(&Event::UnitFinished { activation: act(0, 1), replica: r, output_tokens: 10 }, &state, 13.0);
        let later = Some(PriorContext { activation: act(0, 1), tokens: 1024 });
        assert_eq!(j.credit(later, r, 13.0), 1024);
        j.observe(&Event::SessionEnded { session: SessionId(0) }, &state, 14.0);
        assert_eq!(j.credit(later, r, 14.0), 0);
    }
}
