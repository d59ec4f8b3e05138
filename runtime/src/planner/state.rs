//! The planner's view of the pool (snapshot S_t of paper 003 §3.2): devices, deployment
//! identities, replicas with their phase, memory claim and leases, and the queue of ready
//! units. Policies read it and change it only through `issue_*`, which check the invariants.
//!
//! Pure data and bookkeeping; no I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use switchyard_predictor::{DeviceSpec, Dtype};
use thiserror::Error;

use super::memory::{self, Occupancy};
use super::{Command, DeploymentId, Event};
use crate::ids::{ActivationId, DeviceId, ReplicaId};

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
    /// Expected generation work (tokens) on the longest path from this node to the end of
    /// its workflow, this node included: the remaining critical path, for workflow-aware
    /// priorities.
    pub remaining_path_tokens: u32,
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
    Loading { since: f64 },
    Awake,
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

/// The planner's snapshot of the pool and the ready queue.
#[derive(Debug, Clone)]
pub struct PlannerState {
    devices: Vec<DeviceInfo>,
    deployments: Vec<DeploymentInfo>,
    replicas: BTreeMap<ReplicaId, ReplicaView>,
    queue: Vec<WorkItem>,
    infeasible: BTreeSet<(DeploymentId, DeviceId)>,
    near_ready: BTreeMap<ActivationId, NearReadyItem>,
    running: BTreeMap<ActivationId, RunningUnit>,
    /// Fused-chain holds: a finished chain link keeps its lease on the replica until its
    /// successor is admitted there (one grant for the whole chain).
    holds: BTreeMap<ActivationId, ReplicaId>,
    /// Whether the policy fuses chains (holds leases across links).
    fusion: bool,
    chain_next: BTreeSet<ActivationId>,
    next_replica: u32,
    loads: u64,
    evictions: u64,
}

impl PlannerState {
    pub fn new(devices: Vec<DeviceInfo>, deployments: Vec<DeploymentInfo>) -> Self {
        PlannerState {
            devices,
            deployments,
            replicas: BTreeMap::new(),
            queue: Vec::new(),
            infeasible: BTreeSet::new(),
            near_ready: BTreeMap::new(),
            running: BTreeMap::new(),
            holds: BTreeMap::new(),
            fusion: false,
            chain_next: BTreeSet::new(),
            next_replica: 0,
            loads: 0,
            evictions: 0,
        }
    }

    /// Turn chain fusion on: finished links with a fused successor keep their lease.
    pub fn set_fusion(&mut self, on: bool) {
        self.fusion = on;
    }

    pub fn fusion(&self) -> bool {
        self.fusion
    }

    /// Near-ready units N_t.
    pub fn near_ready(&self) -> impl Iterator<Item = &NearReadyItem> {
        self.near_ready.values()
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
        if let Some(rid) = self.holds.remove(&prev) {
            if let Some(r) = self.replicas.get_mut(&rid) {
                r.leases.remove(&prev);
                r.last_used = now;
            }
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

    pub fn loads(&self) -> u64 {
        self.loads
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

    /// Device memory claimed by replicas (resident or loading).
    pub fn used_bytes(&self, device: DeviceId) -> u64 {
        self.replicas_on(device).map(|r| r.claim_bytes).sum()
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
                self.queue.push(item);
            }
            Event::UnitNearReady(item) => {
                self.near_ready.insert(item.activation, item);
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
            Event::SessionEnded { session } => {
                // Release holds of a session that will not continue its chain, and forget its
                // near-ready units.
                let stale: Vec<ActivationId> =
                    self.holds.keys().filter(|a| a.session == session).copied().collect();
                for a in stale {
                    if let Some(rid) = self.holds.remove(&a) {
                        if let Some(r) = self.replicas.get_mut(&rid) {
                            r.leases.remove(&a);
                            r.last_used = now;
                        }
                    }
                }
                self.near_ready.retain(|a, _| a.session != session);
                self.queue.retain(|w| w.activation.session != session);
                self.chain_next.retain(|a| a.session != session);
            }
            Event::ReplicaLoaded { replica } => {
                let r = self.replicas.get_mut(&replica).ok_or(PlanError::UnknownReplica(replica))?;
                r.phase = ReplicaPhase::Awake;
                r.last_used = now;
            }
            Event::ReplicaLoadFailed { replica, .. } => {
                let r = self.replicas.remove(&replica).ok_or(PlanError::UnknownReplica(replica))?;
                self.infeasible.insert((r.deployment, r.device));
            }
            Event::SessionArrived { .. } => {}
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
        if item.chain_next {
            self.chain_next.insert(activation);
        }
        self.running.insert(activation, RunningUnit {
            replica: Some(replica),
            started: now,
            predicted_s: None,
            workflow: item.workflow,
            node: item.node,
            kv_tokens: u64::from(item.envelope.0) + u64::from(item.envelope.1),
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
        let capacity = g.spec.memory_bytes;
        // Eq. 11 over the device's predicted transitions: every replica holds its claim from
        // now on (reclaimed victims were removed from the view when their unload was issued).
        let occupancy: Vec<Occupancy> = self
            .replicas_on(device)
            .map(|r| Occupancy { from: now, until: f64::INFINITY, bytes: r.claim_bytes })
            .collect();
        if !memory::feasible(capacity, &occupancy, Occupancy { from: now, until: f64::INFINITY, bytes: claim }) {
            return Err(PlanError::NoMemory(deployment, device, claim, self.free_bytes(device)));
        }
        let id = ReplicaId(self.next_replica);
        self.next_replica += 1;
        self.replicas.insert(
            id,
            ReplicaView {
                id,
                deployment,
                device,
                phase: ReplicaPhase::Loading { since: now },
                claim_bytes: claim,
                leases: BTreeSet::new(),
                last_used: now,
            },
        );
        self.loads += 1;
        out.push(Command::Load { replica: id, deployment, device });
        Ok(id)
    }

    /// Reclaim an idle replica. Refused while it holds a lease or is still loading.
    pub fn issue_unload(&mut self, replica: ReplicaId, out: &mut Vec<Command>) -> Result<(), PlanError> {
        let r = self.replicas.get(&replica).ok_or(PlanError::UnknownReplica(replica))?;
        if !r.leases.is_empty() {
            return Err(PlanError::Leased(replica, r.leases.len()));
        }
        if r.phase != ReplicaPhase::Awake {
            return Err(PlanError::NotAwake(replica));
        }
        self.replicas.remove(&replica);
        self.evictions += 1;
        out.push(Command::Unload { replica });
        Ok(())
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
        assert_eq!(s.issue_unload(r, &mut out), Err(PlanError::Leased(r, 1)));
        s.observe(
            Event::UnitFinished { activation: item(1).activation, replica: r, output_tokens: 5 },
            2.0,
        )
        .unwrap();
        s.issue_unload(r, &mut out).unwrap();
        assert_eq!(s.evictions(), 1);
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
        assert!(s.issue_unload(a, &mut out).is_err(), "held for the successor");
        s.observe(Event::UnitReady(second.clone()), 2.0).unwrap();
        s.issue_dispatch(second.activation, b, 2.0, &mut out).unwrap();
        assert_eq!(s.hold_of(first.activation), None);
        assert!(s.replica(a).is_some_and(|r| r.leases.is_empty()));
        s.issue_unload(a, &mut out).unwrap();
    }
}
