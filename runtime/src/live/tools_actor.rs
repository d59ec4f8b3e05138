//! The tool executors: one actor that accepts tool calls from session actors and runs each on
//! tokio's blocking pool (`spawn_blocking(run_tool)`), at most `workers` at a time.
//!
//! A tool whose code fails or times out is an *outcome* (verdict `fail`), decided by
//! `switchyard_tools`; a call that cannot run is an error string for the session. An executor
//! that crashes (the tool panics) is reported to the planner as `ToolCrashed` and the call is
//! retried up to `RetryPolicy::tool_attempts` times before the session fails with the reason.
//! Depends on the tools crate and the actor messages only.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use switchyard_tools::run_tool;
use tokio::sync::Semaphore;
use tracing::Instrument;

use super::actors::{PlannerMsg, SessionMsg, ToolMsg};

/// The tool-executor pool actor.
pub struct ToolsActor;

pub struct ToolsArgs {
    /// Tool calls that may run at once.
    pub workers: usize,
    /// Attempts per call whose executor crashed.
    pub attempts: u32,
    pub planner: ActorRef<PlannerMsg>,
}

pub struct ToolsState {
    slots: Arc<Semaphore>,
    attempts: u32,
    planner: ActorRef<PlannerMsg>,
}

impl Actor for ToolsActor {
    type Msg = ToolMsg;
    type State = ToolsState;
    type Arguments = ToolsArgs;

    async fn pre_start(&self, _myself: ActorRef<ToolMsg>, args: ToolsArgs) -> Result<ToolsState, ActorProcessingErr> {
        Ok(ToolsState {
            slots: Arc::new(Semaphore::new(args.workers.max(1))),
            attempts: args.attempts.max(1),
            planner: args.planner,
        })
    }

    async fn handle(&self, _myself: ActorRef<ToolMsg>, msg: ToolMsg, state: &mut ToolsState) -> Result<(), ActorProcessingErr> {
        let ToolMsg::Run { activation, call, reply } = msg;
        let slots = Arc::clone(&state.slots);
        let planner = state.planner.clone();
        let attempts = state.attempts;
        let span = tracing::info_span!("tool", activation = %activation, tool = %call.tool);
        tokio::spawn(
            async move {
                let mut last = String::new();
                for attempt in 1..=attempts {
                    let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
                        last = "the tool executor pool was closed".into();
                        break;
                    };
                    let job = call.clone();
                    let joined = tokio::task::spawn_blocking(move || run_tool(&job)).await;
                    drop(permit);
                    match joined {
                        Ok(Ok(outcome)) => {
                            tracing::debug!(verdict = ?outcome.verdict, wall_s = outcome.wall_seconds, "tool done");
                            let _ = reply.send_message(SessionMsg::ToolDone { activation, result: Ok(outcome) });
                            return;
                        }
                        Ok(Err(e)) => {
                            let _ = reply.send_message(SessionMsg::ToolDone { activation, result: Err(e.to_string()) });
                            return;
                        }
                        Err(e) => {
                            last = format!("tool executor crashed: {e}");
                            tracing::warn!(attempt, "{last}");
                            let _ = planner.send_message(PlannerMsg::ToolCrashed { activation, reason: last.clone() });
                        }
                    }
                }
                let reason = format!("{last} (after {attempts} attempt(s))");
                let _ = reply.send_message(SessionMsg::ToolDone { activation, result: Err(reason) });
            }
            .instrument(span),
        );
        Ok(())
    }
}
