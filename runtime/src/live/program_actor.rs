//! One actor per external program of the front door (an agent framework's run, keyed by its
//! session id): it speaks the session actor's protocol to the planner actor, so the planner
//! core schedules a program's calls like any session's units, on the same replicas. Each call
//! the client sends becomes one ready unit of the program's session (activation 0, 1, …) of
//! the front-door workflow (one node per served deployment); its answer goes back to the HTTP
//! handler that is waiting for it, its text streamed through the request's
//! [`TokenSink`](super::engine::TokenSink) by the engine as it arrives.
//!
//! A program ends when a call says it is the last (`program_done`), or when it has been idle
//! (no call in flight) for its idle timeout; a failed call fails only that call. The planner
//! actor frees the program's key first in both cases — at the last call, or when it agrees to
//! an idle end because it has sent the program no call since (`PlannerMsg::ProgramIdle`) — so
//! a call with that key reaches a live program or starts a new one, never one that is ending. What the
//! client does between an answer and its next call is the program's tool time: the planner is
//! told a tool of the program runs (`ToolStarted`, predicted as the mean of its earlier gaps),
//! and that it finished when the next call arrives — unless the call offered tools (function
//! calling) and the answer made no call: the agent's turn is over, and no tool of it runs.
//!
//! It decides nothing about placement and never talks to an engine. Must not depend on the
//! HTTP layer (`crate::serve`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;

use super::actors::{CallTiming, PendingCall, PlannerMsg, RunContext, SHUTTING_DOWN, SessionMsg, SessionReport, SessionResult};
use super::engine::{Completion, LlmRequest};
use crate::exec::{self, SessionRecord};
use crate::ids::{ActivationId, SessionId};
use crate::planner::{DeploymentId, NearReadyItem, PriorContext, WorkItem};
use crate::tokens;

/// A front-door call travels in the actor messages, so its types are the actor vocabulary's.
pub use super::actors::{ProgramCall, ProgramRequest};

/// The program actor.
pub struct ProgramActor;

pub struct ProgramArgs {
    pub ctx: Arc<RunContext>,
    pub session: SessionId,
    /// The front-door workflow's index.
    pub workflow: u32,
    pub planner: ActorRef<PlannerMsg>,
    /// Wall-clock arrival (seconds since the runtime started).
    pub arrived: f64,
    /// End the program after this long without a call in flight.
    pub idle_timeout: Duration,
}

struct Waiting {
    item: WorkItem,
    next: Option<DeploymentId>,
    call: PendingCall,
    reply: oneshot::Sender<Result<Completion, String>>,
    done_after: bool,
    ready_at: f64,
    granted_at: Option<f64>,
}

pub struct ProgramState {
    args: ProgramArgs,
    next_index: u32,
    waiting: BTreeMap<ActivationId, Waiting>,
    timings: Vec<CallTiming>,
    /// Bumped by every call: an idle check of an older generation is stale.
    generation: u64,
    ended: bool,
    /// The runtime's stop ended it ([`SessionReport::interrupted`]).
    interrupted: bool,
    /// The tool gap in progress — the client's own time between an answer and its next call —
    /// as the planner knows it: a tool unit of the program (id, node, wall start).
    gap: Option<(ActivationId, u32, f64)>,
    /// Gaps so far (sum of their lengths, count), for the next one's predicted length.
    gaps: (f64, u32),
    /// The latest call's activation and prompt tokens: the next call's prompt usually starts
    /// with them (a conversation grows), which is its cache credit on the replica that ran it.
    last_prompt: Option<(ActivationId, Arc<[u32]>)>,
    /// Output tokens of the program's answered calls: (sum, count), for the next call's rank.
    answered: (u64, u32),
}

/// The predicted length of a program's first tool gap, before any was seen (TAO's default
/// tool-return estimate, paper 000 §3).
pub const DEFAULT_GAP_S: f64 = 5.0;

/// Tokens a hinted next call's prompt may add to the previous prompt and answer (a tool's
/// observation, the next instruction) in its near-ready prompt bound.
pub const NEXT_PROMPT_SLACK: u32 = 512;

/// What the planner's rank takes as a front-door call's remaining path: the program's mean
/// answer so far, at most this call's limit; 0 (unknown: first come first served within its
/// level) for a program's first call. A program's remaining work is unknown to the front door,
/// and the client's `max_tokens` must not be it: a client would move its calls ahead (joint
/// ranks the longest remaining path first) or behind (Kairos, the shortest) by asking for a
/// larger limit.
fn expected_answer_tokens((sum, count): (u64, u32), max: u32) -> u32 {
    if count == 0 {
        return 0;
    }
    u32::try_from(sum / u64::from(count)).unwrap_or(u32::MAX).min(max)
}

/// Most call timings one program's report keeps (its first calls').
const MAX_TIMINGS: usize = 1024;

/// Tool gaps take activation indices from here up (calls count from 0).
const GAP_INDEX_BASE: u32 = 1 << 31;

impl Actor for ProgramActor {
    type Msg = SessionMsg;
    type State = ProgramState;
    type Arguments = ProgramArgs;

    async fn pre_start(&self, _myself: ActorRef<SessionMsg>, args: ProgramArgs) -> Result<ProgramState, ActorProcessingErr> {
        Ok(ProgramState {
            args,
            next_index: 0,
            waiting: BTreeMap::new(),
            timings: Vec::new(),
            generation: 0,
            ended: false,
            interrupted: false,
            gap: None,
            gaps: (0.0, 0),
            last_prompt: None,
            answered: (0, 0),
        })
    }

    async fn handle(&self, myself: ActorRef<SessionMsg>, msg: SessionMsg, state: &mut ProgramState) -> Result<(), ActorProcessingErr> {
        match msg {
            SessionMsg::Call(call) => state.on_call(*call),
            SessionMsg::Dispatched { activation, .. } => {
                let wall = state.args.ctx.clock.wall();
                if let Some(w) = state.waiting.get_mut(&activation) {
                    w.granted_at = Some(wall);
                }
            }
            SessionMsg::LlmDone { activation, completion, .. } => state.on_done(&myself, activation, completion),
            SessionMsg::LlmFailed { activation, reason } => state.on_failed(&myself, activation, reason),
            SessionMsg::Requeue { activation } => {
                let streamed = state.waiting.get(&activation).is_some_and(|w| w.call.request.sink.delivered());
                if streamed {
                    // Its replica was lost after part of the answer reached the client: answered
                    // as failed rather than run again (the client would get two answers' text).
                    let reason = "the replica was lost after part of the answer had reached the caller";
                    state.on_failed(&myself, activation, reason.to_string());
                } else if let Some(w) = state.waiting.get(&activation) {
                    let _ = state.args.planner.send_message(PlannerMsg::UnitReady { item: w.item.clone(), call: w.call.clone() });
                }
            }
            // Idle for its timeout: the planner decides whether it ends, since a call may be on
            // its way (the planner sends calls; ending here could drop one).
            SessionMsg::Idle(generation) => {
                if generation == state.generation && state.waiting.is_empty() && !state.ended {
                    let idle = PlannerMsg::ProgramIdle { session: state.args.session, calls: state.generation };
                    let _ = state.args.planner.send_message(idle);
                }
            }
            SessionMsg::EndIdle(generation) => {
                if generation == state.generation && state.waiting.is_empty() {
                    state.end(&myself, None);
                }
            }
            SessionMsg::Fail(reason) | SessionMsg::Cancel(reason) => state.end(&myself, Some(reason)),
            // Only a stopping runtime abandons a program: its calls are answered as such (the
            // server's 503), not as an engine's failure.
            SessionMsg::Abandon(reason) => {
                let shutting_down = SHUTTING_DOWN;
                state.interrupted = true;
                state.end(&myself, Some(format!("{shutting_down}: {reason}")))
            }
            SessionMsg::Start | SessionMsg::ToolDone { .. } => {}
        }
        Ok(())
    }
}

impl ProgramState {
    fn on_call(&mut self, call: ProgramCall) {
        if self.ended {
            let _ = call.reply.send(Err("the program has ended".into()));
            return;
        }
        self.generation += 1;
        self.close_gap();
        let ctx = &self.args.ctx;
        let r = &call.request;
        let thinking = r.enable_thinking;
        let (prompt, raw) = r.rendered_prompt();
        let ids = tokens::encode(&prompt);
        let prompt_tokens = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        let activation = ActivationId { session: self.args.session, index: self.next_index };
        self.next_index += 1;
        // As vLLM's OpenAI server does with a limit past the served context: what is left of it.
        // A call without a limit of its own (`u32::MAX`) gets the front door's default, if set.
        let context = ctx.deployments.get(call.deployment.0 as usize).map_or(u32::MAX, |d| d.max_model_len);
        let rest = context.saturating_sub(prompt_tokens);
        let no_limit = r.max_tokens == u32::MAX;
        let limit = if no_limit { ctx.front_door_max_tokens.unwrap_or(u32::MAX) } else { r.max_tokens };
        let max = limit.min(rest).max(1);
        let item = WorkItem {
            activation,
            workflow: self.args.workflow,
            deployment: call.deployment,
            prompt_tokens,
            max_output_tokens: max,
            ready_at: ctx.clock.now(),
            node: call.node,
            chain_prev: None,
            chain_next: false,
            envelope: (prompt_tokens, max),
            chain_rest: Vec::new(),
            remaining_path_tokens: expected_answer_tokens(self.answered, max),
            further_round_tokens: 0,
            prior_context: self.last_prompt.as_ref().map(|(a, prev)| PriorContext {
                activation: *a,
                tokens: exec::whole_blocks(exec::common_prefix(&ids, prev)),
            }),
        };
        self.last_prompt = Some((activation, Arc::clone(&ids)));
        let request = LlmRequest {
            id: 0,
            model: String::new(),
            prompt,
            prompt_tokens,
            max_tokens: max,
            // No limit of the client's own (`u32::MAX`) and no default below the context's rest:
            // the server applies its default, the room this `max` plans with (our count of the
            // prompt may be a token off the server's, and a limit one token past its room is
            // refused).
            server_default_limit: no_limit && limit >= rest,
            emulated_output: None,
            enable_thinking: thinking,
            stream: true,
            deadline_s: None,
            messages: r.messages.clone().filter(|_| !raw),
            raw_prompt: raw,
            tools: if raw { Vec::new() } else { r.tools.clone() },
            tool_choice: r.tool_choice.clone().filter(|_| !raw),
            parallel_tool_calls: r.parallel_tool_calls.filter(|_| !raw),
            stop: r.stop.clone(),
            response_format: r.response_format.clone(),
            sink: call.sink,
            meter: Default::default(),
        };
        // What the planner expects the answer to cost: the client's limit (the front door
        // knows no workload distribution).
        let pending = PendingCall { request, expected_output_tokens: max };
        let _ = self.args.planner.send_message(PlannerMsg::UnitReady { item: item.clone(), call: pending.clone() });
        let wall = ctx.clock.wall();
        self.waiting.insert(
            activation,
            Waiting { item, next: call.next, call: pending, reply: call.reply, done_after: r.program_done, ready_at: wall, granted_at: None },
        );
    }

    /// A call failed: its client is answered with `reason`; a program whose last call it was
    /// ends failed.
    fn on_failed(&mut self, myself: &ActorRef<SessionMsg>, activation: ActivationId, reason: String) {
        if let Some(w) = self.waiting.remove(&activation) {
            let _ = w.reply.send(Err(reason.clone()));
            if w.done_after {
                self.end(myself, Some(reason));
                return;
            }
        }
        self.arm_idle(myself);
    }

    fn on_done(&mut self, myself: &ActorRef<SessionMsg>, activation: ActivationId, completion: Completion) {
        let Some(w) = self.waiting.remove(&activation) else { return };
        let wall = self.args.ctx.clock.wall();
        // A program may live for any number of calls: its report keeps the first
        // `MAX_TIMINGS` calls' timings, not a record per call for ever.
        if self.timings.len() < MAX_TIMINGS {
            self.timings.push(CallTiming {
                activation,
                total_s: wall - w.ready_at,
                grant_s: w.granted_at.unwrap_or(wall) - w.ready_at,
                engine_s: completion.latency_s,
            });
        }
        let output_tokens = completion.output_tokens;
        self.answered = (self.answered.0 + u64::from(output_tokens), self.answered.1.saturating_add(1));
        if w.done_after {
            // The end reaches the planner before the client has its answer, so whatever the
            // client does next (a verdict for the program, a new program under its key) finds
            // the program ended.
            self.end(myself, None);
            let _ = w.reply.send(Ok(completion));
        } else {
            // A client that offers tools (function calling) and got an answer without a call
            // has ended its agent's turn: no tool of it runs, and its next call — if any —
            // waits on a person or another program, not on a tool's return. The planner is told
            // of no tool (TAO holds no capacity for it, nothing is near-ready behind it), and the
            // gap is no sample of the program's tool time.
            let turn_over = !w.call.request.tools.is_empty() && completion.tool_calls.is_empty();
            let _ = w.reply.send(Ok(completion));
            if self.waiting.is_empty() && !turn_over {
                self.open_gap(w.item.node);
                if let (Some(next), Some((gap, _, _))) = (w.next, self.gap) {
                    // The next call, near-ready behind the client's tool gap: its model is
                    // known, its prompt about this one plus this answer.
                    let item = NearReadyItem {
                        activation: ActivationId { session: self.args.session, index: self.next_index },
                        workflow: self.args.workflow,
                        deployment: next,
                        node: next.0,
                        waits_for: vec![gap],
                        prompt_bound: w.item.prompt_tokens.saturating_add(output_tokens).saturating_add(NEXT_PROMPT_SLACK),
                        max_output_tokens: w.item.max_output_tokens,
                        // The next prompt repeats this one up to the generation prompt.
                        prior_context: Some(PriorContext {
                            activation,
                            tokens: exec::whole_blocks(
                                (w.item.prompt_tokens as usize).saturating_sub(tokens::count(&tokens::chat_generation_suffix(false))),
                            ),
                        }),
                        chain_prev: None,
                        chain_rest: Vec::new(),
                    };
                    let _ = self.args.planner.send_message(PlannerMsg::NearReady(item));
                }
            }
            self.arm_idle(myself);
        }
    }

    /// The program is between calls: tell the planner a tool of the program runs (its
    /// predicted length: the mean of the program's earlier gaps, else [`DEFAULT_GAP_S`]).
    fn open_gap(&mut self, node: u32) {
        if self.gap.is_some() {
            return;
        }
        let (sum, count) = self.gaps;
        let index = GAP_INDEX_BASE.saturating_add(count.min(u32::MAX - GAP_INDEX_BASE));
        let activation = ActivationId { session: self.args.session, index };
        let predicted_s = if count == 0 { DEFAULT_GAP_S } else { sum / f64::from(count) };
        let workflow = self.args.workflow;
        let _ = self.args.planner.send_message(PlannerMsg::ToolStarted { activation, predicted_s, workflow, node });
        self.gap = Some((activation, node, self.args.ctx.clock.wall()));
    }

    /// The program called again (or ended): its tool gap is over.
    fn close_gap(&mut self) {
        if let Some((activation, _, since)) = self.gap.take() {
            let gap = (self.args.ctx.clock.wall() - since).max(0.0);
            self.gaps = (self.gaps.0 + gap, self.gaps.1.saturating_add(1));
            let _ = self.args.planner.send_message(PlannerMsg::ToolFinished { activation });
        }
    }

    /// Check for idleness after the idle timeout (stale if a call arrives meanwhile).
    fn arm_idle(&mut self, myself: &ActorRef<SessionMsg>) {
        if self.waiting.is_empty() {
            let generation = self.generation;
            myself.send_after(self.args.idle_timeout, move || SessionMsg::Idle(generation));
        }
    }

    /// Report the end to the planner (once) and stop; calls still waiting get `failed`.
    fn end(&mut self, myself: &ActorRef<SessionMsg>, failed: Option<String>) {
        if self.ended {
            return;
        }
        self.ended = true;
        self.close_gap();
        for (_, w) in std::mem::take(&mut self.waiting) {
            let _ = w.reply.send(Err(failed.clone().unwrap_or_else(|| "the program ended".into())));
        }
        let wall = self.args.ctx.clock.wall();
        let completed = failed.is_none();
        let session = self.args.session;
        let workflow = self.args.workflow;
        let report = SessionReport {
            record: SessionRecord {
                session,
                workflow,
                arrived: self.args.arrived,
                finished: completed.then_some(wall),
                failed_at: (!completed).then_some(wall),
                failed: failed.clone(),
                score: None,
                tools: Default::default(),
            },
            result: SessionResult {
                session,
                workflow,
                record: 0,
                // The answers went to the client as they came; no API reads them again, so an
                // ended program keeps none (a served runtime keeps up to `--keep-ended` ends).
                final_output: None,
                score: None,
                verifier_score: None,
                failed,
            },
            calls: Vec::new(),
            timings: std::mem::take(&mut self.timings),
            interrupted: self.interrupted,
        };
        let _ = self.args.planner.send_message(PlannerMsg::SessionEnded(Box::new(report)));
        myself.stop(None);
    }
}

#[cfg(test)]
mod tests {
    use super::expected_answer_tokens;

    #[test]
    fn a_calls_rank_follows_the_programs_answers_not_the_clients_limit() {
        // First calls rank alike whatever limit the client asks for.
        assert_eq!(expected_answer_tokens((0, 0), 512), expected_answer_tokens((0, 0), 32_768));
        // Then the program's mean answer, whatever the limit above it.
        assert_eq!(expected_answer_tokens((900, 3), 512), 300);
        assert_eq!(expected_answer_tokens((900, 3), 32_768), 300);
        // At most this call's limit.
        assert_eq!(expected_answer_tokens((9_000, 3), 1_000), 1_000);
    }
}
