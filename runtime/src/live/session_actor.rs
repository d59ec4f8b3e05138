//! One actor per session: it owns the [`Session`] state machine (activations instantiated as
//! branches resolve), renders prompts from predecessor outputs and computes the responder's
//! output exactly as the simulator does (the shared `exec::prepare`, seeded by (seed, workflow,
//! session, node, round)), hands LLM units to the planner actor, runs tool nodes through the
//! tool executors, reports near-ready units, and reports its end to the planner exactly once.
//!
//! It decides nothing about placement (that is the planner core's) and never talks to an
//! engine. Each session and each activation has its own `tracing` span.
//!
//! Must not depend on the simulator or on any engine implementation (`engines/`): it sees only
//! the `Engine` interface's request and answer types; calls reach a replica through the planner.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use switchyard_tools::modeled_duration_s;
use tracing::Span;

use super::actors::{
    off_the_reactor, CallTiming, DurableSession, PendingCall, PlannerMsg, RunContext, SessionMsg, SessionReport, SessionResult, ToolMsg,
};
use super::journal::{self, ActivationKind, JournalError, SessionOutcome};
use super::engine::{Completion, LlmRequest};
use crate::exec::{self, CallRecord, PrepareContext, PreparedLlm, Ready, SessionRecord};
use crate::ids::{ActivationId, ReplicaId};
use crate::planner::DeploymentId;
use crate::session::Session;
use crate::workflow::NodeKind;
use crate::values::NodeOutput;

/// The session actor.
pub struct SessionActor;

pub struct SessionArgs {
    pub ctx: Arc<RunContext>,
    pub session: Session,
    /// Index of the workflow in the run's list.
    pub workflow: u32,
    /// Index of the dataset record.
    pub record: usize,
    pub planner: ActorRef<PlannerMsg>,
    /// Wall-clock arrival (seconds since the run started).
    pub arrived: f64,
    /// The session's journal (`switchyard serve --state`): intents and results of its
    /// activations, results to replay, its outcome.
    pub durable: Option<DurableSession>,
}

pub struct SessionState {
    ctx: Arc<RunContext>,
    session: Session,
    workflow: u32,
    record: usize,
    planner: ActorRef<PlannerMsg>,
    arrived: f64,
    near_sent: BTreeSet<ActivationId>,
    /// The outlook last told the planner ([`PlannerMsg::Outlook`]).
    outlook_sent: Option<Vec<DeploymentId>>,
    /// Prepared LLM calls, until they complete.
    prepared: BTreeMap<ActivationId, PreparedLlm>,
    /// Calls sent again per activation.
    schema_retries: BTreeMap<ActivationId, u32>,
    spans: BTreeMap<ActivationId, Span>,
    calls: Vec<CallRecord>,
    /// Running tool calls: the calling node's name and the tool's name.
    tool_nodes: BTreeMap<ActivationId, (String, String)>,
    /// What the finished tool calls reported.
    tools: crate::report::SessionToolLog,
    /// Wall time each LLM unit was handed to the planner, and learned of its grant.
    ready_at: BTreeMap<ActivationId, (f64, Option<f64>)>,
    timings: Vec<CallTiming>,
    ended: bool,
    span: Span,
    durable: Option<DurableSession>,
    /// Activations whose intent this process journaled (one intent per process lifetime).
    intended: BTreeSet<ActivationId>,
    /// Ending because the runtime stops: the journal keeps the session unfinished.
    abandoned: bool,
    /// Ending because a client cancelled it (journaled as `cancelled`).
    cancelled: bool,
}

impl Actor for SessionActor {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(&self, _myself: ActorRef<SessionMsg>, args: SessionArgs) -> Result<SessionState, ActorProcessingErr> {
        let name = args.session.spec().name.clone();
        let span = tracing::info_span!(parent: None, "session", session = %args.session.id(), workflow = %name);
        Ok(SessionState {
            ctx: args.ctx,
            session: args.session,
            workflow: args.workflow,
            record: args.record,
            planner: args.planner,
            arrived: args.arrived,
            near_sent: BTreeSet::new(),
            outlook_sent: None,
            prepared: BTreeMap::new(),
            schema_retries: BTreeMap::new(),
            spans: BTreeMap::new(),
            calls: Vec::new(),
            tool_nodes: BTreeMap::new(),
            tools: Default::default(),
            ready_at: BTreeMap::new(),
            timings: Vec::new(),
            ended: false,
            span,
            durable: args.durable,
            intended: BTreeSet::new(),
            abandoned: false,
            cancelled: false,
        })
    }

    async fn handle(&self, myself: ActorRef<SessionMsg>, msg: SessionMsg, state: &mut SessionState) -> Result<(), ActorProcessingErr> {
        let span = state.span.clone();
        let _entered = span.enter();
        match msg {
            SessionMsg::Start => {
                state.journal_route();
                for a in state.session.ready() {
                    state.on_ready(&myself, a);
                }
                state.check_finished(&myself);
            }
            SessionMsg::Dispatched { activation, replica } => {
                if state.ended {
                    return Ok(());
                }
                if let Err(e) = state.session.mark_running(activation.index) {
                    state.fail(&myself, format!("internal: {e}"));
                    return Ok(());
                }
                tracing::debug!(parent: state.span_of(activation), %replica, "dispatched");
                let wall = state.ctx.clock.wall();
                if let Some(t) = state.ready_at.get_mut(&activation) {
                    t.1 = Some(wall);
                }
                state.report_near_ready();
            }
            SessionMsg::LlmDone { activation, replica, completion } => state.on_llm_done(&myself, activation, replica, completion),
            // Front-door messages are for program actors.
            SessionMsg::Call(call) => {
                let _ = call.reply.send(Err("internal: a front-door call reached a workflow session".into()));
            }
            SessionMsg::Idle(_) | SessionMsg::EndIdle(_) => {}
            SessionMsg::LlmFailed { activation, reason } => {
                let node = state.session.node_of(activation.index).map(|n| n.id.clone()).unwrap_or_default();
                state.fail(&myself, format!("{node}: {reason}"));
            }
            SessionMsg::Requeue { activation } => {
                if state.ended {
                    return Ok(());
                }
                tracing::info!(parent: state.span_of(activation), "requeued after its replica was lost");
                state.prepared.remove(&activation);
                match state.session.requeue(activation.index) {
                    Ok(()) => state.on_ready(&myself, activation),
                    Err(e) => state.fail(&myself, format!("internal: {e}")),
                }
            }
            SessionMsg::ToolDone { activation, result } => state.on_tool_done(&myself, activation, result),
            SessionMsg::Fail(reason) => state.fail(&myself, reason),
            SessionMsg::Cancel(reason) => {
                state.cancelled = true;
                state.fail(&myself, reason);
            }
            SessionMsg::Abandon(reason) => {
                state.abandoned = true;
                state.withdraw_unsent();
                // The stop's (or the deadline's, or Ctrl-C's) reason; a journaled session says
                // it resumes.
                let reason = if state.durable.is_some() {
                    format!("{reason}: interrupted; the journal keeps the session open, and the next start on the same state directory resumes it")
                } else {
                    reason
                };
                state.fail(&myself, reason);
            }
        }
        Ok(())
    }
}

impl SessionState {
    fn span_of(&self, a: ActivationId) -> &Span {
        self.spans.get(&a).unwrap_or(&self.span)
    }

    /// An activation became ready: run a tool, or prepare an LLM request and hand the unit to
    /// the planner.
    fn on_ready(&mut self, myself: &ActorRef<SessionMsg>, a: ActivationId) {
        if self.ended {
            return;
        }
        // A result the journal already holds is replayed, never run again.
        if let Some(recorded) = self.replayed(a) {
            return match recorded {
                Ok(output) => match self.session.mark_running(a.index) {
                    Ok(()) => self.complete_as(myself, a, output, false),
                    Err(e) => self.fail(myself, format!("internal: {e}")),
                },
                Err(e) => self.fail(myself, e),
            };
        }
        let ctx = Arc::clone(&self.ctx);
        let pctx = PrepareContext {
            seed: ctx.seed,
            deployments: &ctx.deployments,
            deployment_of: &ctx.deployment_of,
            node_info: &ctx.node_info,
        };
        let now = ctx.clock.now();
        let (session, workflow) = (&mut self.session, self.workflow);
        let ready = match off_the_reactor(|| exec::prepare(&pctx, session, workflow, a, now)) {
            Ok(r) => r,
            Err(e) => return self.fail(myself, e.to_string()),
        };
        match ready {
            Ready::Tool { call, node, workflow, node_index } => {
                let span = tracing::info_span!(parent: &self.span, "activation", activation = %a, node = %node);
                tracing::debug!(parent: &span, tool = %call.tool, "tool start");
                self.spans.insert(a, span);
                let digest = serde_json::to_string(&call.inputs).unwrap_or_default();
                if !self.intend(myself, a, ActivationKind::Tool, &digest) {
                    return;
                }
                let predicted_s = modeled_duration_s(&call);
                self.tool_nodes.insert(a, (node.clone(), call.tool.clone()));
                let _ = self.planner.send_message(PlannerMsg::ToolStarted { activation: a, predicted_s, workflow, node: node_index });
                let sent = match ctx.tools.get() {
                    Some(tools) => tools.send_message(ToolMsg::Run { activation: a, call, reply: myself.clone() }).is_ok(),
                    None => false,
                };
                if !sent {
                    let _ = self.planner.send_message(PlannerMsg::ToolFinished { activation: a });
                    return self.fail(myself, format!("{node}: the tool executors are not running"));
                }
                self.report_near_ready();
            }
            Ready::Llm { item, prepared, node } => {
                if !self.intend(myself, a, ActivationKind::Llm, &prepared.prompt) {
                    return;
                }
                let span = tracing::info_span!(parent: &self.span, "activation", activation = %a, node = %node);
                tracing::debug!(parent: &span, prompt_tokens = prepared.prompt_tokens, "ready");
                self.spans.insert(a, span);
                let request = LlmRequest {
                    id: 0,
                    model: String::new(),
                    prompt: prepared.prompt.clone(),
                    prompt_tokens: prepared.prompt_tokens,
                    max_tokens: prepared.max_output_tokens.max(1),
                    server_default_limit: false,
                    emulated_output: Some(prepared.emulated_completion()),
                    enable_thinking: prepared.enable_thinking,
                    stream: ctx.stream,
                    deadline_s: None,
messages: None,
raw_prompt: false,
tools: Vec::new(),
tool_choice: None,
parallel_tool_calls: None,
stop: Vec::new(),
response_format: None,
sink: Default::default(),
meter: Default::default(),
                };
                let call = PendingCall { request, expected_output_tokens: prepared.output.output_tokens.max(1) };
                self.prepared.insert(a, prepared);
                self.ready_at.insert(a, (ctx.clock.wall(), None));
                let _ = self.planner.send_message(PlannerMsg::UnitReady { item, call });
            }
            Ready::Fail(reason) => self.fail(myself, reason),
        }
    }

    fn on_llm_done(&mut self, myself: &ActorRef<SessionMsg>, a: ActivationId, replica: ReplicaId, c: Completion) {
        if self.ended {
            return;
        }
        let Some(prepared) = self.prepared.remove(&a) else {
            return self.fail(myself, format!("internal: completion of unprepared unit {a}"));
        };
        tracing::debug!(parent: self.span_of(a), %replica, output_tokens = c.output_tokens, cached = c.cached_prompt_tokens, latency_s = c.latency_s, "llm done");
        if let Some((t0, granted)) = self.ready_at.remove(&a) {
            let wall = self.ctx.clock.wall();
            self.timings.push(CallTiming {
                activation: a,
                total_s: wall - t0,
                grant_s: granted.unwrap_or(wall) - t0,
                engine_s: c.latency_s,
            });
        }
        // An emulated engine returns the responder's text: keep the responder's verdict and
        // value with it. A real model's own text is taken as it is, and a structured agent's
        // answer must satisfy its schema: the call is sent again a bounded number of times.
        let agent = self
            .session
            .activation(a.index)
            .and_then(|act| match &self.session.spec().nodes[act.node].kind {
                NodeKind::Agent(agent) => Some(agent.clone()),
                NodeKind::Tool(_) => None,
            });
        let output = match &agent {
            Some(agent) => exec::model_output(agent, &prepared.output, c.text, c.output_tokens),
            None => Ok(NodeOutput { text: c.text, verdict: None, value: serde_json::Value::Null, output_tokens: c.output_tokens }),
        };
        let output = match output {
            Ok(o) => o,
            Err(violation) => {
                let tokens = c.output_tokens.max(1);
                let node = self.session.node_of(a.index).map(|n| n.id.clone()).unwrap_or_default();
                self.record_call(a, self.deployment_of(a), prepared.prompt_tokens, tokens);
                let tries = {
                    let t = self.schema_retries.entry(a).or_insert(0);
                    *t += 1;
                    *t
                };
                if tries > exec::MAX_SCHEMA_RETRIES {
                    return self.fail(myself, format!("{node}: {violation} (after {tries} calls)"));
                }
                tracing::warn!(parent: self.span_of(a), %node, %violation, "structured answer rejected; asking again");
                // The same request again (prepared anew: the same prompt and emulated answer).
                return match self.session.requeue(a.index) {
                    Ok(()) => self.on_ready(myself, a),
                    Err(e) => self.fail(myself, format!("internal: {e}")),
                };
            }
        };
        self.record_call(a, self.deployment_of(a), prepared.prompt_tokens, output.output_tokens.max(1));
        self.complete(myself, a, output);
    }

    fn on_tool_done(&mut self, myself: &ActorRef<SessionMsg>, a: ActivationId, result: Result<switchyard_tools::ToolOutcome, String>) {
        let _ = self.planner.send_message(PlannerMsg::ToolFinished { activation: a });
        if self.ended {
            return;
        }
        match result {
            Ok(o) => {
                if let Some(note) = exec::sandbox_note(&o) {
                    let _ = self.planner.send_message(PlannerMsg::Note(note));
                }
                tracing::debug!(parent: self.span_of(a), detail = ?exec::tool_trace_detail(&o), "tool done");
                if let Some((node, tool)) = self.tool_nodes.remove(&a) {
                    self.tools.record(a.session.0, &node, &tool, &o);
                }
                self.record_call(a, None, 0, 0);
                self.complete(myself, a, exec::tool_output(o));
            }
            Err(e) => self.fail(myself, format!("tool: {e}")),
        }
    }

    /// The (model, dtype) an LLM activation runs on: its node's deployment in the session's own
    /// workflow (for a routed session, the workflow bound to its model).
    fn deployment_of(&self, a: ActivationId) -> Option<(String, switchyard_predictor::Dtype)> {
        let act = self.session.activation(a.index)?;
        let NodeKind::Agent(agent) = &self.session.spec().nodes.get(act.node)?.kind else { return None };
        let d = self.ctx.deployment_of.get(&(self.workflow, agent.deployment.clone()))?;
        self.ctx.deployments.get(d.0 as usize).map(|d| (d.model.clone(), d.dtype))
    }

    fn record_call(&mut self, a: ActivationId, model: Option<(String, switchyard_predictor::Dtype)>, prompt: u32, output: u32) {
        let at = self.ctx.clock.wall();
        self.calls.extend(CallRecord::of(&self.session, self.workflow, a, model, prompt, output, at));
    }

    fn complete(&mut self, myself: &ActorRef<SessionMsg>, a: ActivationId, output: NodeOutput) {
        self.complete_as(myself, a, output, true);
    }

    /// A routed session bound afresh records its binding before any of its calls is intended,
    /// so that a restart binds it to the same model (best effort: a failed write is logged,
    /// and a restart routes the session afresh).
    fn journal_route(&mut self) {
        let Some(d) = &mut self.durable else { return };
        let Some(route) = d.route.take() else { return };
        let (j, n) = (Arc::clone(&d.journal), d.number);
        if let Err(e) = off_the_reactor(|| j.record_session_route(n, &route)) {
            tracing::warn!(parent: &self.span, error = %e, "journal: the session's route is not recorded; a restart routes it afresh");
        }
    }

    /// The journal key of activation `a`: its node and round, stable across restarts.
    fn journal_key(&self, a: ActivationId) -> Option<String> {
        let act = self.session.activation(a.index)?;
        let node = self.session.spec().nodes.get(act.node)?;
        Some(journal::activation_key(&node.id, act.round))
    }

    /// The journal's recorded result of `a`, if the session is journaled and has one.
    fn replayed(&self, a: ActivationId) -> Option<Result<NodeOutput, String>> {
        let d = self.durable.as_ref()?;
        let key = self.journal_key(a)?;
        let v = d.replay.get(&key)?;
        Some(serde_json::from_value(v.clone()).map_err(|e| format!("journal: the recorded result of {key} cannot be read: {e}")))
    }

    /// Journal the intent of `a` before it is sent (once per process). False when the journal
    /// refuses — e.g. it was in flight at two crashes already — and the session failed.
    fn intend(&mut self, myself: &ActorRef<SessionMsg>, a: ActivationId, kind: ActivationKind, content: &str) -> bool {
        let Some(d) = &self.durable else { return true };
        if !self.intended.insert(a) {
            return true;
        }
        let Some(key) = self.journal_key(a) else { return true };
        let (j, n, digest) = (Arc::clone(&d.journal), d.number, journal::content_digest(content));
        match off_the_reactor(|| j.intend(n, &key, kind, &digest)) {
            Ok(attempt) => {
                if attempt.is_retry() {
                    tracing::info!(parent: &self.span, %key, attempt = attempt.0, "sent again: it was in flight when the server stopped");
                }
                true
            }
            Err(e) => {
                self.fail(myself, format!("journal: {e}"));
                false
            }
        }
    }

    /// The server is stopping and this session resumes at the next start: the LLM calls it
    /// journaled as intended but that no replica was given yet (no `Dispatched`) were never
    /// sent, so their attempts are taken back — routine restarts must not use up the attempts
    /// of calls that never reached an engine. (A dispatch whose `Dispatched` is still on its
    /// way is taken back too: at worst such a call is sent once more than the bound.)
    fn withdraw_unsent(&mut self) {
        let Some(d) = &self.durable else { return };
        let unsent: Vec<ActivationId> = self.ready_at.iter().filter(|(_, t)| t.1.is_none()).map(|(a, _)| *a).collect();
        for a in unsent {
            if !self.intended.contains(&a) {
                continue;
            }
            let Some(key) = self.journal_key(a) else { continue };
            let (j, n) = (Arc::clone(&d.journal), d.number);
            if let Err(e) = off_the_reactor(|| j.withdraw(n, &key)) {
                tracing::warn!(parent: &self.span, %key, error = %e, "journal: the unsent call's attempt stays counted");
            }
        }
    }

    fn complete_as(&mut self, myself: &ActorRef<SessionMsg>, a: ActivationId, output: NodeOutput, journal: bool) {
        if let (true, Some(d), Some(key)) = (journal, &self.durable, self.journal_key(a)) {
            let (j, n) = (Arc::clone(&d.journal), d.number);
            let value = serde_json::to_value(&output).unwrap_or(serde_json::Value::Null);
            match off_the_reactor(|| j.complete(n, &key, &value)) {
                Ok(()) | Err(JournalError::AlreadyCompleted { .. }) => {}
                Err(e) => return self.fail(myself, format!("journal: {e}")),
            }
        }
        self.spans.remove(&a);
        let ready = match self.session.complete(a.index, output) {
            Ok(r) => r,
            Err(e) => return self.fail(myself, e.to_string()),
        };
        for r in ready {
            self.on_ready(myself, r);
        }
        self.report_near_ready();
        self.check_finished(myself);
    }

    /// Tell the planner about activations that became near-ready.
    fn report_near_ready(&mut self) {
        if self.ended {
            return;
        }
        let Some(info) = self.ctx.node_info.of(self.workflow, self.session.spec()) else { return };
        let items = off_the_reactor(|| exec::near_ready_items(&self.session, self.workflow, info, &self.near_sent));
        for item in items {
            self.near_sent.insert(item.activation);
            let _ = self.planner.send_message(PlannerMsg::NearReady(item));
        }
        let outlook = exec::graph_info::outlook(&self.session, info);
        if self.outlook_sent.as_ref() != Some(&outlook) {
            self.outlook_sent = Some(outlook.clone());
            let _ = self.planner.send_message(PlannerMsg::Outlook { session: self.session.id(), deployments: outlook });
        }
    }

    fn check_finished(&mut self, myself: &ActorRef<SessionMsg>) {
        if !self.ended && self.session.is_finished() {
            self.end(myself, None);
        }
    }

    fn fail(&mut self, myself: &ActorRef<SessionMsg>, reason: String) {
        if self.ended {
            return;
        }
        self.session.fail(reason.clone());
        self.end(myself, Some(reason));
    }

    /// Report the end to the planner (once) and stop.
    fn end(&mut self, myself: &ActorRef<SessionMsg>, failed: Option<String>) {
        self.ended = true;
        self.prepared.clear();
        self.spans.clear();
        let completed = failed.is_none();
        let score = if completed { off_the_reactor(|| exec::session_score(&self.session)) } else { None };
        let verifier_score = if completed { off_the_reactor(|| exec::verifier_score(&self.session)) } else { None };
        match &failed {
            None => tracing::info!(score = ?score, "session completed"),
            Some(r) => tracing::warn!(reason = %r, "session failed"),
        }
        let report = SessionReport {
            record: SessionRecord {
                session: self.session.id(),
                workflow: self.workflow,
                arrived: self.arrived,
                finished: completed.then(|| self.ctx.clock.wall()),
                failed_at: (!completed).then(|| self.ctx.clock.wall()),
                failed: failed.clone(),
                score,
                tools: std::mem::take(&mut self.tools),
            },
            result: SessionResult {
                session: self.session.id(),
                workflow: self.workflow,
                record: self.record,
                final_output: if completed { self.session.final_output().cloned() } else { None },
                score,
                verifier_score,
                failed,
            },
            calls: std::mem::take(&mut self.calls),
            timings: std::mem::take(&mut self.timings),
            interrupted: self.abandoned,
        };
        if let (Some(d), false) = (&self.durable, self.abandoned) {
            let outcome = match (&report.result.failed, &report.result.final_output) {
                (None, out) => SessionOutcome::Completed { output: serde_json::to_value(out).unwrap_or(serde_json::Value::Null) },
                (Some(_), _) if self.cancelled => SessionOutcome::Cancelled,
                (Some(r), _) => SessionOutcome::Failed { reason: r.clone() },
            };
            let (j, n) = (Arc::clone(&d.journal), d.number);
            // A failed write leaves the session open in the journal: a restart resumes it like
            // any session open at a crash (recorded results replayed, a call without a result
            // sent at most once more) and records its end then; this process reports the end
            // it saw.
            if let Err(e) = off_the_reactor(|| j.finish_session(n, &outcome)) {
                tracing::error!(session = n, error = %e, "the journal did not record the session's end; a restart will replay it to its end");
            }
        }
        let _ = self.planner.send_message(PlannerMsg::SessionEnded(Box::new(report)));
        myself.stop(None);
    }
}
