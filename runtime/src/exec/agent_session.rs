//! The state of an agent session (paper 000, TAO) that both shells of agent sessions keep — the
//! simulator's agent loop (`sim::agentic`) and the live coordinator (`live::agents`) — and the
//! views of it the pure schedulers read: TAO's waiting pool ([`AgentSession::pool_view`]), the
//! replica loads with holds taken out ([`without_holds`]), the live state a plan is revalidated
//! against ([`revalidation_state`]), and the steps of applying a revalidated plan — every hold
//! released ([`release_holds`]), then each selected session resumed if it can be
//! ([`AgentSession::can_resume`]) or held ([`AgentSession::hold`]). The shells advance it on their own events (virtual or wall
//! time); it holds no clock and does no I/O, so the two shells cannot drift apart in what a
//! scheduler sees.
//!
//! Must not depend on `sim`, `live` or `bench` (both shells depend on it).

use crate::planner::admission::{CacheObservation, PoolSession, ReplicaLoad, residual_capacities};
use crate::planner::tao::{LiveSession, LiveState, ToolCall};

/// Where a session is in its closed loop of model turns and tool calls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AgentPhase {
    NotStarted,
    /// A routed program bound to its model, waiting for that model's admission (the
    /// simulator's routed runs only).
    Admitting,
    /// Between turns: its tool runs (`returned` false) or its next request waits.
    Pooled {
        returned: bool,
    },
    /// Admitted onto a replica while its tool still runs: the request goes there on return.
    Held {
        replica: usize,
    },
    Running {
        replica: usize,
    },
    Done,
}

/// One agent session's scheduling state, with what its shell keeps besides in `shell`.
#[derive(Debug, Clone)]
pub struct AgentSession<X> {
    pub phase: AgentPhase,
    /// The turn it is on (its next or running model call).
    pub turn: usize,
    /// Changes whenever the session moves on (a turn dispatched or finished): a plan made for
    /// an older signature is stale (TAO, Appendix B.2).
    pub signature: u64,
    pub started_at: f64,
    /// When its next request became ready (arrival or tool return).
    pub ready_at: f64,
    /// When it last entered the pool.
    pub paused_at: f64,
    /// The tool call it waits on (`None` before its first turn).
    pub call: Option<ToolCall>,
    /// When its current tool call returned (`None` while it runs, or with no call).
    pub tool_returned_at: Option<f64>,
    /// The latest cached-token observation per replica it ran on.
    pub cache: Vec<CacheObservation>,
    /// Admission weight it holds on its replica while held or running.
    pub weight: u64,
    /// Per replica, the conversation tokens a router's index saw there.
    pub indexed: Vec<(usize, u64)>,
    /// The shell's own state of the session.
    pub shell: X,
}

impl<X> AgentSession<X> {
    /// A session that has not started.
    pub fn new(shell: X) -> Self {
        AgentSession {
            phase: AgentPhase::NotStarted,
            turn: 0,
            signature: 0,
            started_at: 0.0,
            ready_at: 0.0,
            paused_at: 0.0,
            call: None,
            tool_returned_at: None,
            cache: Vec::new(),
            weight: 0,
            indexed: Vec::new(),
            shell,
        }
    }

    /// Whether TAO may place it: between turns, pooled or held.
    pub fn in_pool(&self) -> bool {
        matches!(self.phase, AgentPhase::Pooled { .. } | AgentPhase::Held { .. })
    }

    /// Whether its next request can be sent now: a pooled session whose tool returned, a held
    /// one whose tool returned, anything else (a new session has no tool to wait for).
    pub fn returned(&self) -> bool {
        match self.phase {
            AgentPhase::Pooled { returned } => returned,
            AgentPhase::Held { .. } => self.tool_returned_at.is_some(),
            _ => true,
        }
    }

    /// Whether a plan that selects it may dispatch it at once (its tool returned, or it has
    /// none) rather than hold it on the replica.
    pub fn can_resume(&self) -> bool {
        self.tool_returned_at.is_some() || self.call.is_none()
    }

    /// Holds it on `replica` with admission weight `weight` (its tool still runs): the shell
    /// adds the weight to the replica's admitted total.
    pub fn hold(&mut self, replica: usize, weight: u64) {
        self.weight = weight;
        self.phase = AgentPhase::Held { replica };
    }

    /// The session as TAO's pool sees it: `tokens` its next prompt, `shared_tokens` the
    /// prefix it shares with every session (the system prompt).
    pub fn pool_view(&self, session: usize, tokens: u64, shared_tokens: u64) -> PoolSession {
        PoolSession {
            session: session as u64,
            signature: self.signature,
            tokens,
            call: self.call.clone(),
            returned: self.returned(),
            shared_tokens,
            cache: self.cache.clone(),
            since: self.paused_at,
        }
    }
}

/// `loads` with the admission weight of held sessions taken out: a plan re-decides every hold,
/// so it sees the capacity running sessions leave.
pub fn without_holds<'a, X: 'a>(
    mut loads: Vec<ReplicaLoad>,
    sessions: impl IntoIterator<Item = &'a AgentSession<X>>,
) -> Vec<ReplicaLoad> {
    for st in sessions {
        if let AgentPhase::Held { replica } = st.phase
            && let Some(load) = loads.get_mut(replica)
        {
            load.admitted_tokens = load.admitted_tokens.saturating_sub(st.weight);
        }
    }
    loads
}

/// Sends every held session among `which` (indices into `sessions`) back to the pool (its tool
/// still running) and returns, per hold, the replica and the admission weight released, for the
/// shell to take off that replica's admitted total: a revalidated plan re-decides every hold.
pub fn release_holds<X>(sessions: &mut [AgentSession<X>], which: impl IntoIterator<Item = usize>) -> Vec<(usize, u64)> {
    let mut released = Vec::new();
    for i in which {
        let Some(st) = sessions.get_mut(i) else { continue };
        if let AgentPhase::Held { replica } = st.phase {
            released.push((replica, st.weight));
            st.weight = 0;
            st.phase = AgentPhase::Pooled { returned: false };
        }
    }
    released
}

/// The live state a TAO plan is revalidated against (Appendix B.2): each of `candidates` still
/// between turns, with its current signature and every one of `replicas` eligible, and the
/// capacities `loads` leave at `safe_fraction` (the shell passes [`without_holds`]' loads: the
/// plan replaces the holds).
pub fn revalidation_state<'a, X: 'a>(
    candidates: impl IntoIterator<Item = (usize, &'a AgentSession<X>)>,
    replicas: usize,
    loads: &[ReplicaLoad],
    safe_fraction: f64,
) -> LiveState {
    let all: Vec<usize> = (0..replicas).collect();
    let sessions = candidates
        .into_iter()
        .filter(|(_, st)| st.in_pool())
        .map(|(i, st)| (i as u64, LiveSession { signature: st.signature, eligible: all.clone() }))
        .collect();
    LiveState { sessions, capacities: residual_capacities(loads, safe_fraction) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(admitted: u64) -> ReplicaLoad {
        ReplicaLoad { kv_tokens: 1_000, admitted_tokens: admitted, shared_tokens: 0, requests: 0, active_blocks: 0 }
    }

    #[test]
    fn readiness_follows_the_phase_and_the_tool() {
        let mut s = AgentSession::new(());
        assert!(s.returned() && s.can_resume(), "a new session waits for no tool");
        s.call = Some(ToolCall { tool: "bash".into(), started_at: 1.0, deadline: None, completed_at: None, prediction: None });
        s.phase = AgentPhase::Pooled { returned: false };
        assert!(!s.returned() && !s.can_resume() && s.in_pool());
        s.phase = AgentPhase::Held { replica: 1 };
        assert!(!s.returned() && s.in_pool());
        s.tool_returned_at = Some(3.0);
        assert!(s.returned() && s.can_resume());
        s.phase = AgentPhase::Running { replica: 1 };
        assert!(!s.in_pool());
        let view = s.pool_view(4, 120, 20);
        assert_eq!((view.session, view.tokens, view.shared_tokens, view.returned), (4, 120, 20, true));
    }

    #[test]
    fn holds_leave_the_loads_running_sessions_hold() {
        let mut held = AgentSession::new(());
        held.phase = AgentPhase::Held { replica: 1 };
        held.weight = 300;
        let mut running = AgentSession::new(());
        running.phase = AgentPhase::Running { replica: 1 };
        running.weight = 200;
        let loads = without_holds(vec![load(0), load(500)], [&held, &running]);
        assert_eq!(loads.iter().map(|l| l.admitted_tokens).collect::<Vec<_>>(), vec![0, 200]);
        // A hold on a replica the loads do not list is ignored, not a panic.
        held.phase = AgentPhase::Held { replica: 9 };
        assert_eq!(without_holds(vec![load(5)], [&held])[0].admitted_tokens, 5);
    }

    #[test]
    fn applying_a_plan_releases_every_hold_then_holds_anew() {
        let mut sessions: Vec<AgentSession<()>> = (0..3).map(|_| AgentSession::new(())).collect();
        sessions[0].hold(1, 300);
        sessions[1].phase = AgentPhase::Running { replica: 0 };
        sessions[1].weight = 100;
        sessions[2].hold(0, 50);
        sessions[2].signature = 9;
        let live = revalidation_state(sessions.iter().enumerate(), 2, &[load(0), load(0)], 1.0);
        assert_eq!(live.sessions.keys().copied().collect::<Vec<_>>(), vec![0, 2], "the running session is not a candidate");
        assert_eq!(live.sessions[&2].signature, 9);
        assert_eq!(live.sessions[&2].eligible, vec![0, 1]);
        assert_eq!(release_holds(&mut sessions, 0..3), vec![(1, 300), (0, 50)]);
        assert!(sessions.iter().all(|s| !matches!(s.phase, AgentPhase::Held { .. })));
        assert_eq!((sessions[0].weight, sessions[0].phase), (0, AgentPhase::Pooled { returned: false }));
        assert_eq!(sessions[1].weight, 100, "a running session keeps its weight");
        assert!(release_holds(&mut sessions, 0..3).is_empty());
    }
}
