//! The planner's view of the pool (snapshot S_t of paper 003 §3.2): devices, deployment
//! identities, replicas with their phase, memory claim and leases, and the queue of ready
//! units. Policies read it and change it only through `issue_*`, which check the invariants.
//!
//! Pure data and bookkeeping; no I/O, no clock.
//!
//! Part of the pure core: must not depend on anything outside `planner` but `crate::ids` and the
//! predictor crate (the core's rule, checked by `runtime/tests/module_boundaries.rs`).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use switchyard_predictor::{DeviceSpec, Dtype};
use thiserror::Error;

use super::memory::{self, Occupancy};
use super::{Command, DeploymentId, Event};
use crate::ids::{ActivationId, DeviceId, ReplicaId, SessionId};

/// What one prefetch check found for one near-ready deployment at one planning tick (paper 003
/// §3.5: prefetch a near-ready model into capacity no ready work can use, when its release
/// approaches its load time plus the dispatch slack).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefetchOutcome {
    /// A load or wake was issued.
    Issued,
    /// The model already had a replica (awake, loading or waking).
    Resident,
    /// No device had room without reclaiming a model with ready or near-ready work.
    NoCapacity,
    /// Its release was further away than its load time plus the dispatch slack.
    NotTimely,
    /// Timely and with room, but the state refused the lifecycle action (victims already
    /// unloaded or put to sleep stay so).
    Refused,
}

/// Counts of [`PrefetchOutcome`]s over a run: one per near-ready deployment per planning tick
/// that reached the prefetch step, so a model resident for many ticks counts many times.
/// Reported as `RunReport.prefetch`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PrefetchChecks {
    pub issued: u64,
    pub resident: u64,
    pub no_capacity: u64,
    pub not_timely: u64,
    pub refused: u64,
}

/// What became of the units that have a fusible successor (Eq. 3: the next node of their
/// chain runs on the same deployment), counted at each dispatch of such a unit (a unit the live
/// runtime dispatches again after losing its replica counts again), under a
/// policy that fuses: its chain ran *fused* (its grant passes to the successor, Eq. 4), or was
/// *over the context* (Eq. 8's first cut ruled it out: the chain's envelope I_adm + O_adm from
/// this link on passes the deployment's L_max, so the link ran as a unit of its own). Reported
/// as `RunReport.fusion`; all zero for a policy that does not fuse.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FusionChecks {
    pub fused: u64,
    pub over_context: u64,
}

/// What TAO's admission (paper 000, under `joint`) did: *solves*, the exact DPs run over one
/// deployment's ready units and returning turns at a tick (none where nothing has cache credit
/// and everything fits), of them *fallbacks* to best-fit-decreasing (the state budget ran out);
/// *granted*, the ready units its plans admitted, of them *granted_on_cache* where their earlier
/// context is cached (cache credit > 0 on the replica the plan chose); and *held_for_returning*,
/// the capacity holds committed for a turn whose tool is about to return, on the replica that
/// caches its context. Reported as `RunReport.tao_admission`; all zero for a policy without it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TaoChecks {
    pub solves: u64,
    pub fallbacks: u64,
    pub granted: u64,
    pub granted_on_cache: u64,
    pub held_for_returning: u64,
}

/// A decision that would break an invariant, or an event that contradicts the view.
#[derive(Debug, Error, PartialEq)]
pub enum PlanError {
    #[error("unknown policy `{0}` (known: {1})")]
    UnknownPolicy(String, String),
    #[error("replica {0} is leased by {1} unit(s) and cannot be reclaimed")]
    Leased(ReplicaId, usize),
    #[error("replica {0} is not awake")]
    NotAwake(ReplicaId),
    #[error("unknown replica {0}")]
    UnknownReplica(ReplicaId),
    #[error("unit {0} is not in the ready queue")]
    NotQueued(ActivationId),
    #[error("unit {0} needs deployment {1:?} but replica {2} serves {3:?}")]
    WrongDeployment(ActivationId, DeploymentId, ReplicaId, DeploymentId),
    #[error("replica {0} is at its batch limit")]
    BatchFull(ReplicaId),
    #[error("deployment {0:?} does not fit device {1}: needs {2} bytes, {3} free")]
    NoMemory(DeploymentId, DeviceId, u64, u64),
    #[error("deployment {0:?} is not eligible on device {1}")]
    Ineligible(DeploymentId, DeviceId),
    #[error("event for unit {0} that holds no lease on replica {1}")]
    NoLease(ActivationId, ReplicaId),
    #[error("replica {0} is not asleep")]
    NotAsleep(ReplicaId),
    #[error("routing: {0}")]
    Routing(String),
}

/// One GPU of the pool as the planner sees it.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceInfo {
    pub id: DeviceId,
    pub spec: DeviceSpec,
}

/// Engine memory the planner reserves beyond weights and KV when it judges whether a
/// deployment can be served on a device: CUDA context, activations of the profile run and
/// CUDA graphs. A planner-side assumption (vLLM typically needs 1–3 GiB here), deliberately
/// independent of the emulator's own constants.
pub const PLANNER_ENGINE_RESERVE_BYTES: u64 = 2 << 30;

/// Device memory a sleeping replica keeps (CUDA context, NCCL buffers, CUDA graphs, allocator
/// pools): a planner-side assumption inside the 1–5 GiB real vLLM sleepers keep (field anchors
/// §1.1: `/sleep` frees neither the CUDA context nor the NCCL buffers).
pub const PLANNER_ASLEEP_BYTES: u64 = 2 << 30;

/// Seconds the planner expects an engine to take from an unload request until its device
/// memory is free: vLLM's own bound on the engine-core exit (vllm#31252: the API server waits
/// 5 s for it). A planner-side assumption; the shells report the real end.
pub const PLANNER_TEARDOWN_S: f64 = 5.0;

/// Weight reads from the page cache the planner assumes for a level-2 wake, bytes/s (the low
/// end of the 3.5–5 GB/s measured for vLLM safetensors loads, field anchors §9).
pub const PLANNER_PAGE_CACHE_BYTES_PER_S: f64 = 3.5e9;

/// Fixed part of a sleep or wake the planner assumes, seconds (the vLLM sleep-mode blog
/// measured 0.25–0.9 s wakes for a 0.6B model, almost all of it fixed).
pub const PLANNER_SLEEP_WAKE_FIXED_S: f64 = 0.5;

/// vLLM sleep-mode level 1: the weights are copied to host memory (a wake copies them back).
pub const SLEEP_LEVEL_OFFLOAD: u8 = 1;
/// Level 2: the weights are dropped (a wake re-reads them from the page cache).
pub const SLEEP_LEVEL_DISCARD: u8 = 2;

/// The planner's estimate of a sleep (`level` 1 copies the weights over the host link).
pub fn sleep_estimate_s(weight_bytes: u64, device: &DeviceSpec, level: u8) -> f64 {
    match level {
        SLEEP_LEVEL_OFFLOAD => weight_bytes as f64 / device.host_link_bandwidth.max(1.0) + PLANNER_SLEEP_WAKE_FIXED_S,
        _ => PLANNER_SLEEP_WAKE_FIXED_S,
    }
}

/// The planner's estimate of a wake from `level`.
pub fn wake_estimate_s(weight_bytes: u64, device: &DeviceSpec, level: u8) -> f64 {
    let link = device.host_link_bandwidth.max(1.0);
    let bandwidth = if level == SLEEP_LEVEL_OFFLOAD { link } else { link.min(PLANNER_PAGE_CACHE_BYTES_PER_S) };
    weight_bytes as f64 / bandwidth + PLANNER_SLEEP_WAKE_FIXED_S
}

/// A deployment identity d: model, dtype and serving configuration.
#[derive(Debug, Clone, Serialize)]
pub struct DeploymentInfo {
    pub id: DeploymentId,
    /// Catalogue model name.
    pub model: String,
    pub dtype: Dtype,
    /// Longest sequence the replica must serve (vLLM `--max-model-len`).
    pub max_model_len: u32,
    /// Fraction of device memory a replica claims (vLLM `--gpu-memory-utilization`).
    pub gpu_memory_utilization: f64,
    pub weight_bytes: u64,
    pub kv_bytes_per_token: u64,
    /// Batch limit B_q (vLLM `--max-num-seqs`).
    pub max_num_seqs: u32,
}

impl DeploymentInfo {
    /// The deployment of `model` at `dtype` with vLLM's default 90 % memory claim.
    pub fn of_model(id: DeploymentId, model: &switchyard_predictor::ModelArch, dtype: Dtype, max_model_len: u32, max_num_seqs: u32) -> Self {
        DeploymentInfo {
            id,
            model: model.name.clone(),
            dtype,
            max_model_len,
            gpu_memory_utilization: 0.9,
            weight_bytes: model.param_bytes(dtype),
            kv_bytes_per_token: model.kv_bytes_per_token(dtype),
            max_num_seqs,
        }
    }

    /// Memory a replica of this deployment claims on `device`.
    pub fn claim_bytes(&self, device: &DeviceInfo) -> u64 {
        (self.gpu_memory_utilization.clamp(0.0, 1.0) * device.spec.memory_bytes as f64) as u64
    }

    /// Whether weights, the engine reserve and one full-length sequence of KV fit the claim.
    pub fn fits(&self, device: &DeviceInfo) -> bool {
        let need = self.weight_bytes
            + PLANNER_ENGINE_RESERVE_BYTES
            + self.kv_bytes_per_token * self.max_model_len as u64;
        need <= self.claim_bytes(device)
    }
}

/// A ready LLM unit waiting for a grant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkItem {
    pub activation: ActivationId,
    /// Index of the workflow in the run's workflow list.
    pub workflow: u32,
    pub deployment: DeploymentId,
    pub prompt_tokens: u32,
    pub max_output_tokens: u32,
    /// When the unit became ready.
    pub ready_at: f64,
    /// Index of the logical node in its workflow (output-length history is kept per node).
    pub node: u32,
    /// Fused-chain links (Eq. 3), set by the shell from the workflow graph: the previous
    /// activation of this unit's chain, and whether a fused successor follows.
    pub chain_prev: Option<ActivationId>,
    pub chain_next: bool,
    /// Admission envelope of the rest of the chain from this activation on (Eq. 4):
    /// (I_adm, O_adm) in tokens; equals (prompt, max output) for an unfused unit.
    pub envelope: (u32, u32),
    /// The links of its fused chain after this one, in order (empty for an unfused unit or a
    /// chain's last link): what Eq. 4's summed run time adds to this unit's own.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub chain_rest: Vec<ChainLink>,
    /// Expected generation work (tokens, answers and thinking) on the longest path from this
    /// node to the end of its workflow, this node included, with one pass of each loop: the
    /// remaining critical path, for workflow-aware priorities.
    pub remaining_path_tokens: u32,
    /// What the worst case of the loops adds to [`Self::remaining_path_tokens`]: the expected
    /// generation work of every round this activation's loop may still run after the current
    /// one, and of every further round of the loops its path enters later (0 where no loop
    /// lies ahead): the remaining path's upper bound less its one-pass value.
    pub further_round_tokens: u32,
    /// The earlier call of its session whose context this prompt starts with, if any (an
    /// agent's previous turn, a program's previous call): its cache credit.
    pub prior_context: Option<PriorContext>,
}

/// A later link of a unit's fused chain (Eq. 3), as the timeline times it (Eq. 4: the chain
/// runs for the sum of its links' run times on one replica). Set by the shell from the graph.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainLink {
    /// Index of the link's logical node (its output-length history is kept per node).
    pub node: u32,
    /// Its prompt's tokens known before the chain runs: template text, session inputs and
    /// outputs of nodes outside the chain (at their limits), without the chain's own outputs.
    pub fixed_prompt: u32,
    pub max_output_tokens: u32,
    /// The earlier links whose outputs its prompt reads, as positions in the chain from the
    /// unit on: 0 is the unit itself, k the k-th entry of its `chain_rest`.
    pub reads: Vec<u32>,
}

/// What an earlier LLM call of the same session left in its engine's prefix cache that a unit's
/// prompt starts with (an agent's previous turn and its answer; a front-door program's previous
/// call). The replica that ran it may still hold those blocks: paper 000's KV-cache credit,
/// decayed with the time since (Eq. 4). Set by the shell, which knows both prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PriorContext {
    /// The earlier call.
    pub activation: ActivationId,
    /// Leading tokens of this unit's prompt, in whole KV blocks, that equal what the earlier
    /// call's engine computed (its prompt and answer).
    pub tokens: u32,
}

/// A unit whose predecessors are all completed or running, at least one running
/// (the near-ready set N_t of paper 003 §3.2). Its branch, model and prompt prefix are known.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NearReadyItem {
    pub activation: ActivationId,
    pub workflow: u32,
    pub deployment: DeploymentId,
    pub node: u32,
    /// Activations it waits for (LLM or tool).
    pub waits_for: Vec<ActivationId>,
    pub prompt_bound: u32,
    pub max_output_tokens: u32,
    /// The earlier call of its session whose context its prompt will start with (see
    /// [`PriorContext`]); its tokens are a bound, known before the prompt is.
    pub prior_context: Option<PriorContext>,
    /// The activation before it in its fused chain (its only predecessor, running), as
    /// [`WorkItem::chain_prev`]: the chain's time already counts this link (Eq. 4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain_prev: Option<ActivationId>,
    /// The later links of its fused chain, as [`WorkItem::chain_rest`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub chain_rest: Vec<ChainLink>,
}

/// A unit or tool call in progress, as the committed timeline knows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunningUnit {
    pub replica: Option<ReplicaId>,
    pub started: f64,
    /// Predicted duration when known (tools: the shell's modeled duration; LLM units: filled
    /// by the policy that dispatched them).
    pub predicted_s: Option<f64>,
    pub workflow: u32,
    pub node: u32,
    /// Tokens of KV the unit may hold on its replica: its admission envelope (prompt bound +
    /// output limit, Eq. 4); 0 for tools.
    pub kv_tokens: u64,
}

/// Lifecycle phase of a replica in the planner's view.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum ReplicaPhase {
    /// A cold load was issued at `since` (it starts once the device's earlier transitions end).
    Loading { since: f64 },
    /// A sleeping replica is being woken; the planner expects it awake at `since + expected_s`.
    Waking { since: f64, expected_s: f64 },
    Awake,
}

/// A replica in vLLM sleep mode (or falling asleep): not servable until woken, holding
/// [`PLANNER_ASLEEP_BYTES`] of device memory and, at level 1, its weights in host memory.
#[derive(Debug, Clone, Serialize)]
pub struct AsleepReplica {
    pub id: ReplicaId,
    pub deployment: DeploymentId,
    pub device: DeviceId,
    /// 1 (weights offloaded to host memory) or 2 (weights dropped).
    pub level: u8,
    /// When the sleep was issued.
    pub since: f64,
    /// Whether the shell reported the sleep complete.
    pub settled: bool,
    /// The claim it will hold again once awake.
    pub claim_bytes: u64,
    /// Host memory its weights hold (level 1), else 0.
    pub host_bytes: u64,
}

/// How the substrate reclaims an idle replica (the same for every policy of a run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub enum Reclaim {
    /// Unload it: the engine exits (paper 003's substrate).
    #[default]
    Unload,
    /// Put it to sleep (vLLM sleep mode): level 1 where the node's host memory holds the
    /// weights, else level 2; a later load of the same deployment on that device wakes it.
    /// Sleepers are unloaded, oldest first, when a load needs their memory.
    Sleep,
}

/// One replica as the planner sees it.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaView {
    pub id: ReplicaId,
    pub deployment: DeploymentId,
    pub device: DeviceId,
    pub phase: ReplicaPhase,
    pub claim_bytes: u64,
    /// Units admitted and not yet finished: while non-empty the replica may not be reclaimed.
    pub leases: BTreeSet<ActivationId>,
    /// Last time a unit was admitted or finished, or the load completed.
    pub last_used: f64,
}

impl ReplicaView {
    pub fn is_idle(&self) -> bool {
        self.phase == ReplicaPhase::Awake && self.leases.is_empty()
    }
}

/// How many mean gaps between a workflow's arrivals may pass after its last arrival before it
/// no longer counts as arriving ([`PlannerState::arrival_outlook`]): a Poisson stream goes
/// that long without an arrival e^−3 ≈ 5 % of the time.
pub const ARRIVAL_OUTLOOK_GAPS: f64 = 10.0;

/// One workflow's arrivals as the planner has seen them.
#[derive(Debug, Clone)]
struct ArrivalStream {
    first: f64,
    last: f64,
    count: u32,
    /// Deployments its sessions can call (the union of their first outlooks).
    calls: BTreeSet<DeploymentId>,
}

impl ArrivalStream {
    fn still_arriving(&self, now: f64) -> bool {
        if self.count < 2 {
            return false;
        }
        let mean_gap = (self.last - self.first) / f64::from(self.count - 1);
        now - self.last <= ARRIVAL_OUTLOOK_GAPS * mean_gap
    }
}

/// The planner's snapshot of the pool and the ready queue.
#[derive(Debug, Clone)]
pub struct PlannerState {
    devices: Vec<DeviceInfo>,
    deployments: Vec<DeploymentInfo>,
    replicas: BTreeMap<ReplicaId, ReplicaView>,
    queue: Vec<WorkItem>,
    /// Routed programs that DISC's ledger has not admitted yet, with the units they made ready
    /// meanwhile (kept out of [`Self::queue`], so no policy can dispatch them).
    gated: BTreeMap<SessionId, Vec<WorkItem>>,
    infeasible: BTreeSet<(DeploymentId, DeviceId)>,
    near_ready: BTreeMap<ActivationId, NearReadyItem>,
    /// What each session in flight can still call ([`Event::SessionOutlook`]), and per
    /// deployment how many sessions can.
    outlook: BTreeMap<SessionId, Vec<DeploymentId>>,
    successors: BTreeMap<DeploymentId, u32>,
    /// Per workflow: its arrivals so far and what a new session of it can call
    /// ([`Self::arrival_outlook`]); sessions arrived whose first outlook has not come yet.
    arrivals: BTreeMap<u32, ArrivalStream>,
    arrived_unseen: BTreeMap<SessionId, u32>,
    running: BTreeMap<ActivationId, RunningUnit>,
    /// Fused-chain holds: a finished chain link keeps its lease on the replica until its
    /// successor is admitted there (one grant for the whole chain).
    holds: BTreeMap<ActivationId, ReplicaId>,
    /// Whether the policy fuses chains (holds leases across links).
    fusion: bool,
    chain_next: BTreeSet<ActivationId>,
    next_replica: u32,
    loads: u64,
    /// What the policy's near-ready prefetch checks found ([`Self::count_prefetch_check`]).
    prefetch_checks: PrefetchChecks,
    fusion_checks: FusionChecks,
    tao_checks: TaoChecks,
    evictions: u64,
    /// Replicas in sleep mode (or falling asleep), by id.
    asleep: BTreeMap<ReplicaId, AsleepReplica>,
    /// Replicas being torn down: the device and the issue time (their memory is released when
    /// the shell reports `ReplicaUnloaded`; loads on the device start after that).
    tearing_down: BTreeMap<ReplicaId, (DeviceId, f64)>,
    /// When each device's last issued memory-releasing transition (teardown, sleep) is
    /// expected to end: a load or wake there starts no earlier.
    released_at: BTreeMap<DeviceId, f64>,
    reclaim: Reclaim,
    /// Node (host) of each device, by device index, and each node's host memory in bytes.
    node_of: Vec<usize>,
    host_memory: Vec<u64>,
    sleeps: u64,
    wakes: u64,
}

impl PlannerState {
    pub fn new(devices: Vec<DeviceInfo>, deployments: Vec<DeploymentInfo>) -> Self {
        PlannerState {
            devices,
            deployments,
            replicas: BTreeMap::new(),
            queue: Vec::new(),
            gated: BTreeMap::new(),
            infeasible: BTreeSet::new(),
            near_ready: BTreeMap::new(),
            outlook: BTreeMap::new(),
            successors: BTreeMap::new(),
            arrivals: BTreeMap::new(),
            arrived_unseen: BTreeMap::new(),
            running: BTreeMap::new(),
            holds: BTreeMap::new(),
            asleep: BTreeMap::new(),
            tearing_down: BTreeMap::new(),
            released_at: BTreeMap::new(),
            reclaim: Reclaim::Unload,
            node_of: Vec::new(),
            host_memory: Vec::new(),
            sleeps: 0,
            wakes: 0,
            fusion: false,
            chain_next: BTreeSet::new(),
            next_replica: 0,
            loads: 0,
            prefetch_checks: PrefetchChecks::default(),
            fusion_checks: FusionChecks::default(),
            tao_checks: TaoChecks::default(),
            evictions: 0,
        }
    }

    /// Turn chain fusion on: finished links with a fused successor keep their lease.
    pub fn set_fusion(&mut self, on: bool) {
        self.fusion = on;
    }

    /// How idle replicas are reclaimed (a substrate setting).
    pub fn set_reclaim(&mut self, reclaim: Reclaim) {
        self.reclaim = reclaim;
    }

    pub fn reclaim(&self) -> Reclaim {
        self.reclaim
    }

    /// The hosts: `node_of[device index]` names each device's node; `host_memory[node]` is
    /// that node's host memory in bytes (level-1 sleepers keep their weights there). Without
    /// it, no node has room for a level-1 sleeper.
    pub fn set_hosts(&mut self, node_of: Vec<usize>, host_memory: Vec<u64>) {
        self.node_of = node_of;
        self.host_memory = host_memory;
    }

    /// Replicas in sleep mode or falling asleep, in id order.
    pub fn asleep(&self) -> impl Iterator<Item = &AsleepReplica> {
        self.asleep.values()
    }

    /// Replicas being torn down on `device`.
    pub fn tearing_down_on(&self, device: DeviceId) -> usize {
        self.tearing_down.values().filter(|(g, _)| *g == device).count()
    }

    pub fn sleeps(&self) -> u64 {
        self.sleeps
    }

    pub fn wakes(&self) -> u64 {
        self.wakes
    }

    /// Host memory free on `device`'s node for level-1 sleepers, bytes.
    pub fn host_free_bytes(&self, device: DeviceId) -> u64 {
        let Some(&node) = self.node_of.get(device.0 as usize) else { return 0 };
        let cap = self.host_memory.get(node).copied().unwrap_or(0);
        let used: u64 = self
            .asleep
            .values()
            .filter(|a| self.node_of.get(a.device.0 as usize) == Some(&node))
            .map(|a| a.host_bytes)
            .sum();
        cap.saturating_sub(used)
    }

    /// Device memory held by sleepers on `device` (all of it reclaimable by unloading them).
    pub fn asleep_bytes_on(&self, device: DeviceId) -> u64 {
        self.asleep.values().filter(|a| a.device == device).count() as u64 * PLANNER_ASLEEP_BYTES
    }

    pub fn fusion(&self) -> bool {
        self.fusion
    }

    /// Near-ready units N_t.
    ///
    /// A program its ledger has not admitted shows none: no forecast of its units may stage a
    /// model for it. Its forecasts are kept, and show once it is admitted (as its held ready
    /// units join the queue then).
    pub fn near_ready(&self) -> impl Iterator<Item = &NearReadyItem> {
        self.near_ready.values().filter(|n| !self.gated.contains_key(&n.activation.session))
    }

    /// Sessions in flight that can still call deployment `d` (from their frontier on, through
    /// their workflow graph: [`Event::SessionOutlook`]).
    pub fn successor_sessions(&self, d: DeploymentId) -> u32 {
        self.successors.get(&d).copied().unwrap_or(0)
    }

    /// Whether a workflow whose sessions call `d` is still arriving at `now`: at least two of its
    /// sessions arrived, and the time since its last arrival is at most
    /// [`ARRIVAL_OUTLOOK_GAPS`] of its mean gap between arrivals. Its next session is then
    /// expected within about one mean gap (the arrivals observed are all the planner knows of
    /// the future: a Poisson stream's next arrival is one mean gap away whenever it is asked),
    /// and it will call `d` — successor demand one arrival ahead of the sessions in flight. A
    /// burst (every session at once) stops arriving at its last session.
    pub fn arrival_outlook(&self, d: DeploymentId, now: f64) -> bool {
        self.arrivals.values().any(|a| a.calls.contains(&d) && a.still_arriving(now))
    }

    /// Replace session `s`'s outlook (`None`: it ended), keeping the per-deployment counts.
    fn set_outlook(&mut self, s: SessionId, deployments: Option<Vec<DeploymentId>>) {
        for d in self.outlook.remove(&s).unwrap_or_default() {
            if let Some(n) = self.successors.get_mut(&d) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.successors.remove(&d);
                }
            }
        }
        if let Some(mut ds) = deployments {
            ds.sort_unstable();
            ds.dedup();
            for &d in &ds {
                *self.successors.entry(d).or_default() += 1;
            }
            self.outlook.insert(s, ds);
        }
    }

    /// Units and tool calls in progress.
    pub fn running(&self) -> &BTreeMap<ActivationId, RunningUnit> {
        &self.running
    }

    /// Set the predicted duration of a running unit (policies record their estimate).
    pub fn set_predicted(&mut self, activation: ActivationId, seconds: f64) {
        if let Some(r) = self.running.get_mut(&activation) {
            r.predicted_s = Some(seconds);
        }
    }

    /// Whether `w` starts (or continues) a fused chain under a policy that fuses: it has a
    /// later link and its chain's envelope I_adm + O_adm (Eq. 4) fits the deployment's context.
    /// Eq. 8 gives a fused unit whose envelope passes L_max no feasible device, so the
    /// Constructor's chain is not fused there: its links run as units of their own (each fits
    /// alone), and a later link whose own rest of the chain fits may start a shorter one.
    pub fn fused(&self, w: &WorkItem) -> bool {
        let envelope = u64::from(w.envelope.0) + u64::from(w.envelope.1);
        self.fusion
            && w.chain_next
            && self.deployment(w.deployment).is_some_and(|d| envelope <= u64::from(d.max_model_len))
    }

    /// The admission envelope (I, O) of `w`: its chain's (Eq. 4) when it runs fused, else its
    /// own prompt and output limit — under a policy that does not fuse, or when Eq. 8 ruled its
    /// chain out, a link holds only its own sequence.
    pub fn admission_envelope(&self, w: &WorkItem) -> (u32, u32) {
        if self.fused(w) { w.envelope } else { (w.prompt_tokens, w.max_output_tokens) }
    }

    /// KV tokens a unit may hold on its replica: its admission envelope (Eq. 4), at most its
    /// deployment's context L_max (a single unit whose prompt bound plus output limit passes
    /// it still runs — vLLM serves it within the context — and one sequence never holds more).
    pub fn envelope_tokens(&self, w: &WorkItem) -> u64 {
        let (i, o) = self.admission_envelope(w);
        let envelope = u64::from(i) + u64::from(o);
        self.deployment(w.deployment).map_or(envelope, |d| envelope.min(u64::from(d.max_model_len)))
    }

    /// The replica holding a lease for the fused successor of `prev`, if any.
    pub fn hold_of(&self, prev: ActivationId) -> Option<ReplicaId> {
        self.holds.get(&prev).copied()
    }

    pub fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    pub fn deployments(&self) -> &[DeploymentInfo] {
        &self.deployments
    }

    pub fn deployment(&self, id: DeploymentId) -> Option<&DeploymentInfo> {
        self.deployments.get(id.0 as usize)
    }

    pub fn device(&self, id: DeviceId) -> Option<&DeviceInfo> {
        self.devices.get(id.0 as usize)
    }

    /// Release a hold whose successor went elsewhere (or will not come).
    pub fn release_hold(&mut self, prev: ActivationId, now: f64) {
        if let Some(rid) = self.holds.remove(&prev)
            && let Some(r) = self.replicas.get_mut(&rid)
        {
            r.leases.remove(&prev);
            r.last_used = now;
        }
    }

    pub fn replicas(&self) -> impl Iterator<Item = &ReplicaView> {
        self.replicas.values()
    }

    pub fn replica(&self, id: ReplicaId) -> Option<&ReplicaView> {
        self.replicas.get(&id)
    }

    /// Ready units in the order they became ready.
    pub fn queue(&self) -> &[WorkItem] {
        &self.queue
    }

    /// Hold `session`'s units out of the queue until [`Self::ungate`] (a routed program DISC's
    /// ledger has not admitted).
    pub fn gate(&mut self, session: SessionId) {
        self.gated.entry(session).or_default();
    }

    /// Admit a gated session: the units it made ready meanwhile join the queue, in order.
    pub fn ungate(&mut self, session: SessionId) {
        if let Some(held) = self.gated.remove(&session) {
            self.queue.extend(held);
        }
    }

    /// Whether `session` waits for admission.
    pub fn is_gated(&self, session: SessionId) -> bool {
        self.gated.contains_key(&session)
    }


    pub fn loads(&self) -> u64 {
        self.loads
    }

    /// What the near-ready prefetch checks of the run found (all zero for a policy that does
    /// not prefetch).
    pub fn prefetch_checks(&self) -> PrefetchChecks {
        self.prefetch_checks
    }

    /// What became of the run's units with a fusible successor (all zero unless the policy
    /// fuses).
    pub fn fusion_checks(&self) -> FusionChecks {
        self.fusion_checks
    }

    /// What TAO's admission did in the run (all zero unless the policy admits by it).
    pub fn tao_checks(&self) -> TaoChecks {
        self.tao_checks
    }

    /// The counters of TAO's admission, for the policy that runs it (the state only counts).
    pub fn tao_checks_mut(&mut self) -> &mut TaoChecks {
        &mut self.tao_checks
    }

    /// Record the outcome of one near-ready prefetch check (the policy knows why it loads; the
    /// state only counts).
    pub fn count_prefetch_check(&mut self, outcome: PrefetchOutcome) {
        let c = &mut self.prefetch_checks;
        match outcome {
            PrefetchOutcome::Issued => c.issued += 1,
            PrefetchOutcome::Resident => c.resident += 1,
            PrefetchOutcome::NoCapacity => c.no_capacity += 1,
            PrefetchOutcome::NotTimely => c.not_timely += 1,
            PrefetchOutcome::Refused => c.refused += 1,
        }
    }

    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Replicas of `deployment`, in id order.
    pub fn replicas_of(&self, deployment: DeploymentId) -> impl Iterator<Item = &ReplicaView> {
        self.replicas.values().filter(move |r| r.deployment == deployment)
    }

    /// Replicas placed on `device`, in id order.
    pub fn replicas_on(&self, device: DeviceId) -> impl Iterator<Item = &ReplicaView> {
        self.replicas.values().filter(move |r| r.device == device)
    }

    /// Device memory claimed by replicas (resident, loading or waking) and kept by sleepers.
    /// Replicas being torn down or falling asleep hold more until their transition ends, but a
    /// load or wake on the device starts only after that (the shells sequence them), so it is
    /// what the device holds when the next load starts.
    pub fn used_bytes(&self, device: DeviceId) -> u64 {
        self.replicas_on(device).map(|r| r.claim_bytes).sum::<u64>() + self.asleep_bytes_on(device)
    }

    pub fn free_bytes(&self, device: DeviceId) -> u64 {
        let cap = self.device(device).map(|d| d.spec.memory_bytes).unwrap_or(0);
        cap.saturating_sub(self.used_bytes(device))
    }

    /// Whether `deployment` can ever be served on `device` (memory fit, no failed load).
    pub fn eligible(&self, deployment: DeploymentId, device: DeviceId) -> bool {
        match (self.deployment(deployment), self.device(device)) {
            (Some(d), Some(g)) => d.fits(g) && !self.infeasible.contains(&(deployment, device)),
            _ => false,
        }
    }

    /// Fold an event into the view.
    pub fn observe(&mut self, event: Event, now: f64) -> Result<(), PlanError> {
        match event {
            Event::UnitReady(item) => {
                self.near_ready.remove(&item.activation);
                match self.gated.get_mut(&item.activation.session) {
                    Some(held) => held.push(item),
                    None => self.queue.push(item),
                }
            }
            Event::UnitNearReady(item) => {
                self.near_ready.insert(item.activation, item);
            }
            Event::UnitWithdrawn { activation } => {
                self.queue.retain(|w| w.activation != activation);
                if let Some(held) = self.gated.get_mut(&activation.session) {
                    held.retain(|w| w.activation != activation);
                }
                self.near_ready.remove(&activation);
            }
            Event::UnitFinished { activation, replica, .. } => {
                self.running.remove(&activation);
                let hold = self.fusion && self.chain_next.remove(&activation);
                let r = self.replicas.get_mut(&replica).ok_or(PlanError::UnknownReplica(replica))?;
                if !r.leases.contains(&activation) {
                    return Err(PlanError::NoLease(activation, replica));
                }
                if hold {
                    // Keep the grant for the fused successor.
                    self.holds.insert(activation, replica);
                } else {
                    r.leases.remove(&activation);
                }
                r.last_used = now;
            }
            Event::ToolStarted { activation, predicted_s, workflow, node } => {
                self.running.insert(activation, RunningUnit {
                    replica: None,
                    started: now,
                    predicted_s: Some(predicted_s),
                    workflow,
                    node,
                    kv_tokens: 0,
                });
            }
            Event::ToolFinished { activation } => {
                self.running.remove(&activation);
            }
            Event::SessionOutlook { session, deployments } => {
                // A session's first outlook is its whole graph: what its workflow's next
                // session will call too.
                if let Some(w) = self.arrived_unseen.remove(&session)
                    && let Some(a) = self.arrivals.get_mut(&w)
                {
                    a.calls.extend(deployments.iter().copied());
                }
                self.set_outlook(session, Some(deployments));
            }
            Event::SessionEnded { session } => {
                self.arrived_unseen.remove(&session);
                self.set_outlook(session, None);
                // Release holds of a session that will not continue its chain, and forget its
                // near-ready units.
                let stale: Vec<ActivationId> =
                    self.holds.keys().filter(|a| a.session == session).copied().collect();
                for a in stale {
                    if let Some(rid) = self.holds.remove(&a)
                        && let Some(r) = self.replicas.get_mut(&rid)
                    {
                        r.leases.remove(&a);
                        r.last_used = now;
                    }
                }
                self.near_ready.retain(|a, _| a.session != session);
                self.queue.retain(|w| w.activation.session != session);
                self.gated.remove(&session);
                self.chain_next.retain(|a| a.session != session);
                // Its tool runs end with it: their answers go to a session that no longer
                // exists, so no `ToolFinished` follows (a unit on a replica holds a lease and
                // ends with its call: `UnitFinished`).
                self.running.retain(|a, u| a.session != session || u.replica.is_some());
            }
            Event::ReplicaLoaded { replica } => {
                let r = self.replicas.get_mut(&replica).ok_or(PlanError::UnknownReplica(replica))?;
                r.phase = ReplicaPhase::Awake;
                r.last_used = now;
            }
            Event::ReplicaAsleep { replica } => {
                // A sleeper woken (or unloaded) before the report came is no longer here.
                if let Some(a) = self.asleep.get_mut(&replica) {
                    a.settled = true;
                }
            }
            Event::ReplicaUnloaded { replica } => {
                // A shell that could not put a replica to sleep unloads it and says so.
                self.tearing_down.remove(&replica);
                self.asleep.remove(&replica);
            }
            Event::ReplicaLoadFailed { replica, .. } => {
                let r = self.replicas.remove(&replica).ok_or(PlanError::UnknownReplica(replica))?;
                self.infeasible.insert((r.deployment, r.device));
            }
            Event::SessionArrived { session, workflow } => {
                let a = self.arrivals.entry(workflow).or_insert(ArrivalStream {
                    first: now,
                    last: now,
                    count: 0,
                    calls: BTreeSet::new(),
                });
                a.last = now;
                a.count += 1;
                self.arrived_unseen.insert(session, workflow);
            }
        }
        Ok(())
    }

    /// Grant: admit queued unit `activation` to `replica`.
    pub fn issue_dispatch(
        &mut self,
        activation: ActivationId,
        replica: ReplicaId,
        now: f64,
        out: &mut Vec<Command>,
    ) -> Result<(), PlanError> {
        let pos = self
            .queue
            .iter()
            .position(|w| w.activation == activation)
            .ok_or(PlanError::NotQueued(activation))?;
        let deployment = self.queue[pos].deployment;
        let chain_prev = self.queue[pos].chain_prev;
        let limit = self.deployment(deployment).map(|d| d.max_num_seqs).unwrap_or(0) as usize;
        // A fused successor takes over its chain's held lease on the same replica.
        let held = chain_prev.filter(|p| self.holds.get(p) == Some(&replica));
        let r = self.replicas.get_mut(&replica).ok_or(PlanError::UnknownReplica(replica))?;
        if r.deployment != deployment {
            return Err(PlanError::WrongDeployment(activation, deployment, replica, r.deployment));
        }
        if r.phase != ReplicaPhase::Awake {
            return Err(PlanError::NotAwake(replica));
        }
        if held.is_none() && r.leases.len() >= limit {
            return Err(PlanError::BatchFull(replica));
        }
        if let Some(p) = held {
            r.leases.remove(&p);
            self.holds.remove(&p);
        }
        r.leases.insert(activation);
        r.last_used = now;
        let item = self.queue.remove(pos);
        if self.fused(&item) {
            self.chain_next.insert(activation);
            self.fusion_checks.fused += 1;
        } else if self.fusion && item.chain_next {
            self.fusion_checks.over_context += 1;
        }
        self.running.insert(activation, RunningUnit {
            replica: Some(replica),
            started: now,
            predicted_s: None,
            workflow: item.workflow,
            node: item.node,
            kv_tokens: self.envelope_tokens(&item),
        });
        out.push(Command::Dispatch { activation, replica });
        // A fused successor admitted elsewhere leaves its chain's hold with nothing to take it
        // over: release it, or the held replica stays leased (unreclaimable) for good.
        if let Some(p) = chain_prev.filter(|p| self.holds.get(p).is_some_and(|rid| *rid != replica)) {
            self.release_hold(p, now);
        }
        Ok(())
    }

    /// Start loading `deployment` on `device` as a new replica.
    pub fn issue_load(
        &mut self,
        deployment: DeploymentId,
        device: DeviceId,
        now: f64,
        out: &mut Vec<Command>,
    ) -> Result<ReplicaId, PlanError> {
        if !self.eligible(deployment, device) {
            return Err(PlanError::Ineligible(deployment, device));
        }
        let (Some(d), Some(g)) = (self.deployment(deployment), self.device(device)) else {
            return Err(PlanError::Ineligible(deployment, device));
        };
        let claim = d.claim_bytes(g);
        let weight_bytes = d.weight_bytes;
        let capacity = g.spec.memory_bytes;
        let spec = g.spec.clone();
        // A sleeper of this deployment on the device is woken instead of loading anew.
        let sleeper = self.asleep.values().find(|a| a.deployment == deployment && a.device == device).map(|a| (a.id, a.level));
        let start = self.released_at.get(&device).copied().unwrap_or(now).max(now);
        // Eq. 11 over the device's predicted transitions: from the load's start every replica
        // holds its claim and every other sleeper its remainder (reclaimed victims left the
        // view when their unload or sleep was issued; the load starts after those end).
        loop {
            let mut occupancy: Vec<Occupancy> = self
                .replicas_on(device)
                .map(|r| Occupancy { from: start, until: f64::INFINITY, bytes: r.claim_bytes })
                .collect();
            occupancy.extend(
                self.asleep
                    .values()
                    .filter(|a| a.device == device && Some(a.id) != sleeper.map(|s| s.0))
                    .map(|_| Occupancy { from: start, until: f64::INFINITY, bytes: PLANNER_ASLEEP_BYTES }),
            );
            if memory::feasible(capacity, &occupancy, Occupancy { from: start, until: f64::INFINITY, bytes: claim }) {
                break;
            }
            // Sleepers are the first to go, oldest first.
            let oldest = self
                .asleep
                .values()
                .filter(|a| a.device == device && Some(a.id) != sleeper.map(|s| s.0))
                .min_by(|a, b| a.since.total_cmp(&b.since).then(a.id.cmp(&b.id)))
                .map(|a| a.id);
            match oldest {
                Some(victim) => self.issue_unload(victim, now, out)?,
                None => return Err(PlanError::NoMemory(deployment, device, claim, self.free_bytes(device))),
            }
        }
        let start = self.released_at.get(&device).copied().unwrap_or(now).max(now);
        if let Some((id, level)) = sleeper {
            self.asleep.remove(&id);
            let expected_s = wake_estimate_s(weight_bytes, &spec, level);
            self.replicas.insert(
                id,
                ReplicaView {
                    id,
                    deployment,
                    device,
                    phase: ReplicaPhase::Waking { since: start, expected_s },
                    claim_bytes: claim,
                    leases: BTreeSet::new(),
                    last_used: now,
                },
            );
            self.wakes += 1;
            out.push(Command::Wake { replica: id });
            return Ok(id);
        }
        let id = ReplicaId(self.next_replica);
        self.next_replica += 1;
        self.replicas.insert(
            id,
            ReplicaView {
                id,
                deployment,
                device,
                phase: ReplicaPhase::Loading { since: start },
                claim_bytes: claim,
                leases: BTreeSet::new(),
                last_used: now,
            },
        );
        self.loads += 1;
        out.push(Command::Load { replica: id, deployment, device });
        Ok(id)
    }

    /// Unload an idle replica or a sleeper: the engine is torn down and its memory is free
    /// when the shell reports `ReplicaUnloaded` (a load on the device starts after that).
    /// Refused while it holds a lease or is still loading or waking.
    pub fn issue_unload(&mut self, replica: ReplicaId, now: f64, out: &mut Vec<Command>) -> Result<(), PlanError> {
        let device = if let Some(a) = self.asleep.remove(&replica) {
            a.device
        } else {
            let device = self.reclaimable(replica)?.device;
            self.replicas.remove(&replica);
            device
        };
        self.tearing_down.insert(replica, (device, now));
        self.released_after(device, now + PLANNER_TEARDOWN_S);
        self.evictions += 1;
        out.push(Command::Unload { replica });
        Ok(())
    }

    /// Reclaim an idle replica the substrate's way ([`Reclaim`]): unload it, or put it to
    /// sleep — level 1 when its node's host memory has room for the weights, else level 2.
    pub fn issue_reclaim(&mut self, replica: ReplicaId, now: f64, out: &mut Vec<Command>) -> Result<(), PlanError> {
        if self.reclaim == Reclaim::Unload || self.asleep.contains_key(&replica) {
            return self.issue_unload(replica, now, out);
        }
        self.issue_sleep(replica, now, out)
    }

    /// The sleep level an idle replica on `device` would get: 1 when its node's host memory
    /// has room for the weights, else 2.
    pub fn sleep_level(&self, deployment: DeploymentId, device: DeviceId) -> u8 {
        let weight_bytes = self.deployment(deployment).map(|d| d.weight_bytes).unwrap_or(0);
        if self.host_free_bytes(device) >= weight_bytes { SLEEP_LEVEL_OFFLOAD } else { SLEEP_LEVEL_DISCARD }
    }

    /// Put an idle replica to sleep (level as [`PlannerState::sleep_level`]), whatever the
    /// substrate's reclaim rule: a policy that prices sleep against unloading decides itself.
    /// Refused while it holds a lease or is still loading or waking.
    pub fn issue_sleep(&mut self, replica: ReplicaId, now: f64, out: &mut Vec<Command>) -> Result<(), PlanError> {
        let r = self.reclaimable(replica)?;
        let (deployment, device, claim_bytes) = (r.deployment, r.device, r.claim_bytes);
        let weight_bytes = self.deployment(deployment).map(|d| d.weight_bytes).unwrap_or(0);
        let level = self.sleep_level(deployment, device);
        let took = self.device(device).map(|g| sleep_estimate_s(weight_bytes, &g.spec, level)).unwrap_or(0.0);
        self.replicas.remove(&replica);
        self.asleep.insert(replica, AsleepReplica {
            id: replica,
            deployment,
            device,
            level,
            since: now,
            settled: false,
            claim_bytes,
            host_bytes: if level == SLEEP_LEVEL_OFFLOAD { weight_bytes } else { 0 },
        });
        self.released_after(device, now + took);
        self.sleeps += 1;
        out.push(Command::Sleep { replica, level });
        Ok(())
    }

    /// An awake replica without a lease: the only kind that may be unloaded or put to sleep.
    fn reclaimable(&self, replica: ReplicaId) -> Result<&ReplicaView, PlanError> {
        let r = self.replicas.get(&replica).ok_or(PlanError::UnknownReplica(replica))?;
        if !r.leases.is_empty() {
            return Err(PlanError::Leased(replica, r.leases.len()));
        }
        if r.phase != ReplicaPhase::Awake {
            return Err(PlanError::NotAwake(replica));
        }
        Ok(r)
    }

    fn released_after(&mut self, device: DeviceId, at: f64) {
        let e = self.released_at.entry(device).or_insert(at);
        *e = e.max(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SessionId;
    use switchyard_predictor::spec;

    fn state() -> PlannerState {
        let devices = vec![DeviceInfo { id: DeviceId(0), spec: spec::device("A100-40GB").unwrap() }];
        let m = spec::model("Qwen3-8B").unwrap();
        let deployments = vec![DeploymentInfo {
            id: DeploymentId(0),
            model: m.name.clone(),
            dtype: Dtype::Bf16,
            max_model_len: 8192,
            gpu_memory_utilization: 0.9,
            weight_bytes: m.param_bytes(Dtype::Bf16),
            kv_bytes_per_token: m.kv_bytes_per_token(Dtype::Bf16),
            max_num_seqs: 2,
        }];
        PlannerState::new(devices, deployments)
    }

    fn item(i: u32) -> WorkItem {
        WorkItem {
            activation: ActivationId { session: SessionId(i), index: 0 },
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

    #[test]
    fn a_leased_replica_is_never_reclaimed() {
        let mut s = state();
        let mut out = Vec::new();
        let r = s.issue_load(DeploymentId(0), DeviceId(0), 0.0, &mut out).unwrap();
        s.observe(Event::ReplicaLoaded { replica: r }, 1.0).unwrap();
        s.observe(Event::UnitReady(item(1)), 1.0).unwrap();
        s.issue_dispatch(item(1).activation, r, 1.0, &mut out).unwrap();
        assert_eq!(s.issue_unload(r, 2.0, &mut out), Err(PlanError::Leased(r, 1)));
        s.observe(
            Event::UnitFinished { activation: item(1).activation, replica: r, output_tokens: 5 },
            2.0,
        )
        .unwrap();
        s.issue_unload(r, 2.0, &mut out).unwrap();
        assert_eq!(s.evictions(), 1);
    }

    #[test]
    fn a_session_that_ends_during_a_tool_run_leaves_nothing_running() {
        // Its tool's answer goes to a session that no longer exists: no `ToolFinished` comes,
        // and a unit left "running" would keep the shells' stranded-unit watch off for good.
        let mut s = state();
        let mut out = Vec::new();
        let r = s.issue_load(DeploymentId(0), DeviceId(0), 0.0, &mut out).unwrap();
        s.observe(Event::ReplicaLoaded { replica: r }, 1.0).unwrap();
        let tool = ActivationId { session: SessionId(1), index: 1 };
        s.observe(Event::ToolStarted { activation: tool, predicted_s: 4.0, workflow: 0, node: 1 }, 1.0).unwrap();
        s.observe(Event::UnitReady(item(2)), 1.0).unwrap();
        s.issue_dispatch(item(2).activation, r, 1.0, &mut out).unwrap();
        s.observe(Event::SessionEnded { session: SessionId(1) }, 2.0).unwrap();
        assert!(!s.running().contains_key(&tool));
        // Another session's call on a replica runs on.
        s.observe(Event::SessionEnded { session: SessionId(3) }, 2.0).unwrap();
        assert!(s.running().contains_key(&item(2).activation));
    }

    #[test]
    fn loads_never_overcommit_and_dispatch_waits_for_the_load() {
        let mut s = state();
        let mut out = Vec::new();
        let r = s.issue_load(DeploymentId(0), DeviceId(0), 0.0, &mut out).unwrap();
        // A second 0.9-utilisation replica does not fit next to the first.
        assert!(matches!(
            s.issue_load(DeploymentId(0), DeviceId(0), 0.0, &mut out),
            Err(PlanError::NoMemory(..))
        ));
        s.observe(Event::UnitReady(item(1)), 0.0).unwrap();
        assert_eq!(s.issue_dispatch(item(1).activation, r, 0.0, &mut out), Err(PlanError::NotAwake(r)));
    }

    #[test]
    fn the_batch_limit_is_enforced() {
        let mut s = state();
        let mut out = Vec::new();
        let r = s.issue_load(DeploymentId(0), DeviceId(0), 0.0, &mut out).unwrap();
        s.observe(Event::ReplicaLoaded { replica: r }, 1.0).unwrap();
        for i in 0..3 {
            s.observe(Event::UnitReady(item(i)), 1.0).unwrap();
        }
        s.issue_dispatch(item(0).activation, r, 1.0, &mut out).unwrap();
        s.issue_dispatch(item(1).activation, r, 1.0, &mut out).unwrap();
        assert_eq!(s.issue_dispatch(item(2).activation, r, 1.0, &mut out), Err(PlanError::BatchFull(r)));
        assert_eq!(s.queue().len(), 1);
    }

    #[test]
    fn a_withdrawn_unit_leaves_the_queue_and_a_gated_session() {
        let mut s = state();
        let mut out = Vec::new();
        for i in 0..3 {
            s.observe(Event::UnitReady(item(i)), 1.0).unwrap();
        }
        s.gate(SessionId(7));
        let mut gated = item(7);
        s.observe(Event::UnitReady(gated.clone()), 1.0).unwrap();
        gated.activation.index = 1;
        s.observe(Event::UnitReady(gated.clone()), 1.0).unwrap();
        s.observe(Event::UnitWithdrawn { activation: item(1).activation }, 2.0).unwrap();
        s.observe(Event::UnitWithdrawn { activation: item(7).activation }, 2.0).unwrap();
        let queued: Vec<SessionId> = s.queue().iter().map(|w| w.activation.session).collect();
        assert_eq!(queued, [SessionId(0), SessionId(2)]);
        s.ungate(SessionId(7));
        assert_eq!(s.queue().last().map(|w| w.activation), Some(gated.activation), "only the other unit of the gated session is left");
        assert_eq!(s.queue().len(), 3);
        // A withdrawn unit cannot be dispatched.
        let r = s.issue_load(DeploymentId(0), DeviceId(0), 2.0, &mut out).unwrap();
        s.observe(Event::ReplicaLoaded { replica: r }, 3.0).unwrap();
        assert_eq!(s.issue_dispatch(item(1).activation, r, 3.0, &mut out), Err(PlanError::NotQueued(item(1).activation)));
    }

    #[test]
    fn a_failed_load_makes_the_pair_ineligible() {
        let mut s = state();
        let mut out = Vec::new();
        let r = s.issue_load(DeploymentId(0), DeviceId(0), 0.0, &mut out).unwrap();
        s.observe(Event::ReplicaLoadFailed { replica: r, reason: "no KV".into() }, 1.0).unwrap();
        assert!(!s.eligible(DeploymentId(0), DeviceId(0)));
        assert_eq!(s.free_bytes(DeviceId(0)), 40 << 30);
    }

    #[test]
    fn a_fused_successor_admitted_elsewhere_releases_its_chains_hold() {
        // Two devices, one replica each; link 1 of a chain finishes on replica A (its lease is
        // held for link 2), link 2 is admitted on replica B: A must become reclaimable.
        let mut s = state();
        let devices = vec![
            DeviceInfo { id: DeviceId(0), spec: spec::device("A100-40GB").unwrap() },
            DeviceInfo { id: DeviceId(1), spec: spec::device("A100-40GB").unwrap() },
        ];
        s = PlannerState::new(devices, s.deployments.clone());
        s.set_fusion(true);
        let mut out = Vec::new();
        let a = s.issue_load(DeploymentId(0), DeviceId(0), 0.0, &mut out).unwrap();
        let b = s.issue_load(DeploymentId(0), DeviceId(1), 0.0, &mut out).unwrap();
        s.observe(Event::ReplicaLoaded { replica: a }, 1.0).unwrap();
        s.observe(Event::ReplicaLoaded { replica: b }, 1.0).unwrap();
        let first = WorkItem { chain_next: true, ..item(1) };
        let second = WorkItem {
            activation: ActivationId { session: SessionId(1), index: 1 },
            chain_prev: Some(first.activation),
            ..item(1)
        };
        s.observe(Event::UnitReady(first.clone()), 1.0).unwrap();
        s.issue_dispatch(first.activation, a, 1.0, &mut out).unwrap();
        s.observe(Event::UnitFinished { activation: first.activation, replica: a, output_tokens: 5 }, 2.0).unwrap();
        assert_eq!(s.hold_of(first.activation), Some(a));
        assert!(s.issue_unload(a, 3.0, &mut out).is_err(), "held for the successor");
        s.observe(Event::UnitReady(second.clone()), 2.0).unwrap();
        s.issue_dispatch(second.activation, b, 2.0, &mut out).unwrap();
        assert_eq!(s.hold_of(first.activation), None);
        assert!(s.replica(a).is_some_and(|r| r.leases.is_empty()));
        s.issue_unload(a, 3.0, &mut out).unwrap();
    }

    #[test]
    fn each_dispatched_chain_link_counts_as_fused_or_over_the_context() {
        let run = |fusion: bool| {
            let mut s = state();
            s.set_fusion(fusion);
            let mut out = Vec::new();
            let r = s.issue_load(DeploymentId(0), DeviceId(0), 0.0, &mut out).unwrap();
            s.observe(Event::ReplicaLoaded { replica: r }, 1.0).unwrap();
            // A chain whose envelope fits the 8,192-token context, one past it (Eq. 8), and a
            // unit without a fusible successor.
            let fits = WorkItem { chain_next: true, envelope: (4000, 4000), ..item(1) };
            let over = WorkItem { chain_next: true, envelope: (8000, 4000), ..item(2) };
            for w in [fits, over, item(3)] {
                s.observe(Event::UnitReady(w.clone()), 1.0).unwrap();
                s.issue_dispatch(w.activation, r, 1.0, &mut out).unwrap();
                s.observe(Event::UnitFinished { activation: w.activation, replica: r, output_tokens: 5 }, 2.0).unwrap();
            }
            s.fusion_checks()
        };
        assert_eq!(run(true), FusionChecks { fused: 1, over_context: 1 });
        assert_eq!(run(false), FusionChecks::default(), "a policy that does not fuse counts nothing");
    }

    const GIB: u64 = 1 << 30;

    /// One A100-40GB and one deployment per model in `models` (claim 36 GiB each).
    fn state_of(models: &[&str]) -> PlannerState {
        let devices = vec![DeviceInfo { id: DeviceId(0), spec: spec::device("A100-40GB").unwrap() }];
        let deployments = models
            .iter()
            .enumerate()
            .map(|(i, name)| DeploymentInfo::of_model(DeploymentId(i as u32), &spec::model(name).unwrap(), Dtype::Bf16, 8192, 2))
            .collect();
        PlannerState::new(devices, deployments)
    }

    fn awake(s: &mut PlannerState, d: u32, now: f64, out: &mut Vec<Command>) -> ReplicaId {
        let r = s.issue_load(DeploymentId(d), DeviceId(0), now, out).unwrap();
        s.observe(Event::ReplicaLoaded { replica: r }, now + 1.0).unwrap();
        r
    }

    #[test]
    fn a_load_after_an_unload_starts_when_the_teardown_is_expected_to_end() {
        let mut s = state();
        let mut out = Vec::new();
        let r = awake(&mut s, 0, 0.0, &mut out);
        s.issue_unload(r, 10.0, &mut out).unwrap();
        assert_eq!(out.last(), Some(&Command::Unload { replica: r }));
        assert_eq!(s.tearing_down_on(DeviceId(0)), 1);
        assert!(s.replica(r).is_none(), "an unloading replica serves nothing");
        let again = s.issue_load(DeploymentId(0), DeviceId(0), 11.0, &mut out).unwrap();
        assert_eq!(s.replica(again).map(|v| v.phase), Some(ReplicaPhase::Loading { since: 10.0 + PLANNER_TEARDOWN_S }));
        s.observe(Event::ReplicaUnloaded { replica: r }, 15.0).unwrap();
        assert_eq!(s.tearing_down_on(DeviceId(0)), 0);
    }

    #[test]
    fn reclaim_by_sleep_keeps_a_remainder_and_a_later_load_wakes_the_sleeper() {
        let mut s = state();
        s.set_reclaim(Reclaim::Sleep);
        s.set_hosts(vec![0], vec![64 * GIB]);
        let weights = s.deployment(DeploymentId(0)).unwrap().weight_bytes;
        let mut out = Vec::new();
        let r = awake(&mut s, 0, 0.0, &mut out);
        s.issue_reclaim(r, 5.0, &mut out).unwrap();
        assert_eq!(out.last(), Some(&Command::Sleep { replica: r, level: SLEEP_LEVEL_OFFLOAD }));
        assert!(s.replica(r).is_none(), "a sleeper serves nothing");
        assert_eq!(s.used_bytes(DeviceId(0)), PLANNER_ASLEEP_BYTES);
        assert_eq!(s.host_free_bytes(DeviceId(0)), 64 * GIB - weights, "level 1 keeps the weights in host memory");
        s.observe(Event::ReplicaAsleep { replica: r }, 6.0).unwrap();
        let woken = s.issue_load(DeploymentId(0), DeviceId(0), 20.0, &mut out).unwrap();
        assert_eq!(woken, r, "the sleeper is woken, not a new replica loaded");
        assert_eq!(out.last(), Some(&Command::Wake { replica: r }));
        assert!(matches!(s.replica(r).map(|v| v.phase), Some(ReplicaPhase::Waking { .. })));
        assert_eq!(s.host_free_bytes(DeviceId(0)), 64 * GIB);
        s.observe(Event::ReplicaLoaded { replica: r }, 21.0).unwrap();
        assert!(s.replica(r).is_some_and(|v| v.is_idle()));
        assert_eq!((s.loads(), s.sleeps(), s.wakes(), s.evictions()), (1, 1, 1, 0));
    }

    #[test]
    fn without_room_in_host_memory_the_sleep_is_level_two() {
        let mut s = state();
        s.set_reclaim(Reclaim::Sleep);
        s.set_hosts(vec![0], vec![GIB]);
        let mut out = Vec::new();
        let r = awake(&mut s, 0, 0.0, &mut out);
        s.issue_reclaim(r, 5.0, &mut out).unwrap();
        assert_eq!(out.last(), Some(&Command::Sleep { replica: r, level: SLEEP_LEVEL_DISCARD }));
        assert_eq!(s.host_free_bytes(DeviceId(0)), GIB);
    }

    #[test]
    fn a_leased_replica_is_never_put_to_sleep_and_a_sleeper_that_cannot_sleep_is_forgotten() {
        let mut s = state();
        s.set_reclaim(Reclaim::Sleep);
        let mut out = Vec::new();
        let r = awake(&mut s, 0, 0.0, &mut out);
        s.observe(Event::UnitReady(item(1)), 1.0).unwrap();
        s.issue_dispatch(item(1).activation, r, 1.0, &mut out).unwrap();
        assert_eq!(s.issue_reclaim(r, 2.0, &mut out), Err(PlanError::Leased(r, 1)));
        s.observe(Event::UnitFinished { activation: item(1).activation, replica: r, output_tokens: 5 }, 3.0).unwrap();
        s.issue_reclaim(r, 3.0, &mut out).unwrap();
        // The shell's engine could not sleep and unloaded it instead.
        s.observe(Event::ReplicaUnloaded { replica: r }, 4.0).unwrap();
        assert_eq!(s.asleep().count(), 0);
        assert_eq!(s.used_bytes(DeviceId(0)), 0);
    }

    #[test]
    fn a_load_unloads_sleepers_oldest_first_when_it_needs_their_memory() {
        // 36 GiB claims on a 40 GiB device: one awake replica and two 2 GiB sleepers fit,
        // three sleepers do not.
        let mut s = state_of(&["Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B"]);
        s.set_reclaim(Reclaim::Sleep);
        s.set_hosts(vec![0], vec![256 * GIB]);
        let mut out = Vec::new();
        let mut sleepers = Vec::new();
        for d in 0..3 {
            let r = awake(&mut s, d, 10.0 * d as f64, &mut out);
            s.issue_reclaim(r, 10.0 * d as f64 + 5.0, &mut out).unwrap();
            sleepers.push(r);
        }
        assert_eq!(s.asleep().count(), 3);
        out.clear();
        let r = s.issue_load(DeploymentId(3), DeviceId(0), 40.0, &mut out).unwrap();
        assert_eq!(out, vec![Command::Unload { replica: sleepers[0] }, Command::Load { replica: r, deployment: DeploymentId(3), device: DeviceId(0) }]);
        assert!(s.used_bytes(DeviceId(0)) <= spec::device("A100-40GB").unwrap().memory_bytes);
        assert_eq!(s.asleep().map(|a| a.id).collect::<Vec<_>>(), sleepers[1..].to_vec());
    }

    #[test]
    fn outlooks_count_the_sessions_that_can_still_call_a_deployment() {
        let mut s = state();
        let (a, b) = (DeploymentId(0), DeploymentId(1));
        s.observe(Event::SessionOutlook { session: SessionId(1), deployments: vec![b, a, a] }, 0.0).unwrap();
        s.observe(Event::SessionOutlook { session: SessionId(2), deployments: vec![a] }, 0.0).unwrap();
        assert_eq!((s.successor_sessions(a), s.successor_sessions(b)), (2, 1));
        // A new outlook replaces the session's old one; an ended session counts no more.
        s.observe(Event::SessionOutlook { session: SessionId(1), deployments: vec![b] }, 1.0).unwrap();
        assert_eq!((s.successor_sessions(a), s.successor_sessions(b)), (1, 1));
        s.observe(Event::SessionEnded { session: SessionId(2) }, 2.0).unwrap();
        s.observe(Event::SessionEnded { session: SessionId(1) }, 2.0).unwrap();
        assert_eq!((s.successor_sessions(a), s.successor_sessions(b)), (0, 0));
    }
}
