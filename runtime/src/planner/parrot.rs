//! `parrot`: the request-level baseline, in the style of Parrot (Lin et al., OSDI'24) as the
//! papers evaluate it on the shared serving substrate ([`super::substrate`]).
//!
//! - Dependency-aware: a unit is queued only when its predecessors completed (the shell does
//!   that), and units are served first-come first-served in ready order.
//! - Placement packs: among awake replicas of the unit's deployment with a free batch slot, the
//!   one with the most units already admitted (Parrot's "less remaining capacity" rule).
//! - Lifecycle is the substrate's: load on demand, LRU reclaim of idle replicas, and reactive
//!   request-level scale-out under the shared replica cap.
//!
//! It never prefetches or fuses: each ready request re-queues and re-acquires.
//! Depends only on the planner state and the shared substrate (`super::substrate`).
//!
//! Part of the pure core: must not depend on anything outside `planner` but `crate::ids` and the
//! predictor crate (the core's rule, checked by `runtime/tests/module_boundaries.rs`).

use super::substrate::{ScaleOut, Substrate, load_on_demand};
use super::{Command, DeploymentId, PlannerState, Policy, ReplicaPhase};
use crate::ids::ReplicaId;

/// The Parrot-style baseline policy.
#[derive(Debug, Default)]
pub struct Parrot {
    substrate: Substrate,
    scale_out: ScaleOut,
}

impl Parrot {
    pub fn new(substrate: Substrate) -> Self {
        Parrot { substrate, scale_out: ScaleOut::default() }
    }
}

impl Policy for Parrot {
    fn name(&self) -> &'static str {
        "parrot"
    }

    fn plan(&mut self, state: &mut PlannerState, now: f64, out: &mut Vec<Command>) {
        let queued: Vec<_> = state.queue().iter().map(|w| (w.activation, w.deployment)).collect();
        for (activation, deployment) in queued {
            if let Some(replica) = pack_target(state, deployment) {
                // Cannot fail: the target is awake, serves the deployment and has a slot.
                let _ = state.issue_dispatch(activation, replica, now, out);
                continue;
            }
            let has_replica = state.replicas_of(deployment).next().is_some();
            if !has_replica {
                load_on_demand(state, deployment, now, out);
            }
        }
        self.scale_out.plan(state, &self.substrate, now, out);
    }

    fn next_wakeup(&self, now: f64) -> Option<f64> {
        self.scale_out.next_wakeup(&self.substrate, now)
    }
}

/// The awake replica of `deployment` with a free batch slot and the most admitted units.
pub(crate) fn pack_target(state: &PlannerState, deployment: DeploymentId) -> Option<ReplicaId> {
    let limit = state.deployment(deployment)?.max_num_seqs as usize;
    state
        .replicas_of(deployment)
        .filter(|r| r.phase == ReplicaPhase::Awake && r.leases.len() < limit)
        .max_by(|a, b| a.leases.len().cmp(&b.leases.len()).then(b.id.cmp(&a.id)))
        .map(|r| r.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{ActivationId, DeviceId, SessionId};
    use crate::planner::{DeploymentInfo, DeviceInfo, Event, Planner, WorkItem};
    use switchyard_predictor::{Dtype, spec};

    fn planner() -> Planner {
        let devices = vec![
            DeviceInfo { id: DeviceId(0), spec: spec::device("V100-32GB").unwrap() },
            DeviceInfo { id: DeviceId(1), spec: spec::device("A100-40GB").unwrap() },
        ];
        let deployments = ["Qwen3-4B", "Qwen3-8B", "Qwen3-1.7B"]
            .iter()
            .enumerate()
            .map(|(i, name)| DeploymentInfo::of_model(DeploymentId(i as u32), &spec::model(name).unwrap(), Dtype::Bf16, 8192, 8))
            .collect();
        Planner::new(devices, deployments, Box::new(Parrot::default()))
    }

    fn ready(s: u32, d: u32, at: f64) -> Event {
        Event::UnitReady(WorkItem {
            activation: ActivationId { session: SessionId(s), index: 0 },
            workflow: 0,
            deployment: DeploymentId(d),
            prompt_tokens: 10,
            max_output_tokens: 10,
            ready_at: at,
            node: 0,
            chain_prev: None,
            chain_next: false,
            envelope: (10, 10),
            remaining_path_tokens: 10,
            further_round_tokens: 0,
            prior_context: None,
            chain_rest: Vec::new(),
        })
    }

    #[test]
    fn loads_on_demand_on_the_fastest_free_device_then_dispatches() {
        let mut p = planner();
        let cmds = p.handle(ready(0, 0, 0.0), 0.0).unwrap();
        assert_eq!(
            cmds,
            vec![Command::Load { replica: ReplicaId(0), deployment: DeploymentId(0), device: DeviceId(1) }]
        );
        // A second unit of the same deployment waits for the load; no second load.
        assert!(p.handle(ready(1, 0, 0.0), 0.0).unwrap().is_empty());
        let cmds = p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 5.0).unwrap();
        assert_eq!(cmds.len(), 2);
        assert!(cmds.iter().all(|c| matches!(c, Command::Dispatch { replica: ReplicaId(0), .. })));
    }

    #[test]
    fn evicts_the_least_recently_used_idle_replica_when_memory_is_needed() {
        let mut p = planner();
        // Fill both devices with idle replicas of deployments 0 and 1.
        p.handle(ready(0, 0, 0.0), 0.0).unwrap(); // → device 1
        p.handle(ready(1, 1, 0.0), 0.0).unwrap(); // → device 0
        p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 1.0).unwrap();
        p.handle(Event::ReplicaLoaded { replica: ReplicaId(1) }, 2.0).unwrap();
        let a0 = ActivationId { session: SessionId(0), index: 0 };
        let a1 = ActivationId { session: SessionId(1), index: 0 };
        p.handle(Event::UnitFinished { activation: a1, replica: ReplicaId(1), output_tokens: 1 }, 3.0)
            .unwrap();
        p.handle(Event::UnitFinished { activation: a0, replica: ReplicaId(0), output_tokens: 1 }, 4.0)
            .unwrap();
        // Replica 1 (device 0) was used least recently: it is the victim.
        let cmds = p.handle(ready(2, 2, 5.0), 5.0).unwrap();
        assert_eq!(
            cmds,
            vec![
                Command::Unload { replica: ReplicaId(1) },
                Command::Load { replica: ReplicaId(2), deployment: DeploymentId(2), device: DeviceId(0) }
            ]
        );
    }

    #[test]
    fn never_evicts_a_busy_replica() {
        let mut p = planner();
        p.handle(ready(0, 0, 0.0), 0.0).unwrap();
        p.handle(ready(1, 1, 0.0), 0.0).unwrap();
        p.handle(Event::ReplicaLoaded { replica: ReplicaId(0) }, 1.0).unwrap();
        p.handle(Event::ReplicaLoaded { replica: ReplicaId(1) }, 1.0).unwrap();
        // Both replicas hold leases: the third deployment must wait.
        let cmds = p.handle(ready(2, 2, 2.0), 2.0).unwrap();
        assert!(cmds.is_empty(), "{cmds:?}");
        assert_eq!(p.state().queue().len(), 1);
    }
}
