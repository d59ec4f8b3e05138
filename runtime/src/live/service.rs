//! A served live runtime: the planner actor started once, with no trace, to which clients
//! register workflows and submit sessions while it runs (`switchyard serve`, the library's
//! in-process runtime). Everything below the planner actor is the live shell's: the same
//! planner core, session, replica and tool actors, engines and fault policy as `run --live`.
//!
//! What is fixed at start: the pool, the policy and predictor, and the **served deployment
//! table** — the deployments of the workflows the service starts with (the planner's profile
//! tables are built for them). A workflow registered later must map every deployment onto a
//! served one (same model and dtype, a `max_context` no longer than the served one); otherwise
//! registration is refused, naming what is served.
//!
//! Events: every line the live shell would write to `--trace` (arrivals, ready units,
//! dispatches, first tokens, finishes, tool calls, loads, sleeps, unloads, session ends) is
//! published on a broadcast channel ([`Service::subscribe`]); a subscriber that lags loses the
//! oldest lines, the runtime never waits for it.
//!
//! Depends on the live shell's actors and `exec`; must not depend on the simulator or on any
//! HTTP layer (the REST API is `crate::serve`'s).

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use tokio::sync::{broadcast, oneshot};
use tokio::task::JoinHandle;

use super::actors::{Clock, DurableSession, EngineFactory, LiveOutput, PlannerMsg, ProgramRequest, SHUTTING_DOWN, SessionStatus};
use super::engine::{Completion, TokenSink};
use super::metrics::RuntimeMetrics;
use super::planner_actor::PlannerActor;
use super::shell::{LiveConfig, LiveError, planner_args, run_context};
use crate::exec::{self, TraceLine};
use crate::ids::SessionId;
use crate::planner::{DeploymentId, DeploymentInfo};
use crate::values::Record;
use crate::workflow::{WorkflowError, WorkflowSpec, parse_workflow};

/// The planner actor answers with these too, so they are the actor vocabulary's.
pub use super::actors::{ProgramBinding, ServiceError};

/// Lines of the event stream kept for subscribers that fall behind.
const EVENT_BUFFER: usize = 4096;

/// How long a query of the planner actor may wait for its answer. Requests that change what
/// runs (register, submit) wait for theirs however long it takes: once delivered they take
/// effect, so a timeout would tell the client "failed" about sessions that start anyway. A
/// planner that stops drops the request's reply port, which answers them at once.
const ASK_TIMEOUT: Duration = Duration::from_secs(30);

/// The `model` a front-door call names to be routed (paper 002, ORACLE): the program is bound
/// at its first such call to one of the router's models by the planner core's router, and every
/// later call of the program that names it runs on that model. Listed by `/v1/models` when the
/// runtime has a router (it was started with a routed workflow).
pub const ROUTER_MODEL: &str = "switchyard-router";

/// A running service. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Service {
    planner: ActorRef<PlannerMsg>,
    handle: std::sync::Mutex<Option<JoinHandle<()>>>,
    events: broadcast::Sender<TraceLine>,
    /// The dataset records of the workflows the service started with (by workflow index), for
    /// sessions submitted without inputs.
    datasets: Vec<Arc<Vec<Record>>>,
    clock: Clock,
    /// The served deployments' models, for the front door's `model` field.
    served: Vec<ServedModel>,
    /// The router's models (`None` without a router), for [`ROUTER_MODEL`] calls.
    routed: Option<Vec<DeploymentId>>,
    metrics: Arc<RuntimeMetrics>,
    /// Set when [`Self::shutdown`] begins: calls from then on are refused as unavailable (503),
    /// never scheduled.
    stopping: std::sync::atomic::AtomicBool,
}

impl Service {
    /// Start the runtime for `cfg` (its workflows define the served deployment table and are
    /// registered as workflows 0, 1, …; its session counts, arrival process and deadline are
    /// not used) with engines from `factory`. Must be called inside a multi-threaded tokio
    /// runtime.
    pub async fn start(cfg: &LiveConfig, factory: Arc<dyn EngineFactory>) -> Result<Service, LiveError> {
        let rc = &cfg.run;
        let (deployments, _) = exec::deployment_table(&rc.workflows, rc.max_num_seqs)?;
        // The front door's workflow comes last: one node per served deployment.
        let front_door = Arc::new(front_door_workflow(&deployments).map_err(|e| LiveError::Spawn(format!("front door: {e}")))?);
        let mut workflows = rc.workflows.clone();
        workflows.push(Arc::clone(&front_door));
        let front_door_index = u32::try_from(workflows.len() - 1).map_err(|_| LiveError::Spawn("too many workflows".into()))?;
        let (deployments, deployment_of) = exec::deployment_table(&workflows, rc.max_num_seqs)?;
        let node_info = exec::node_infos(&workflows, &deployment_of);
        let datasets: Vec<Arc<Vec<Record>>> = exec::load_records(&rc.workflows)?;
        let served: Vec<ServedModel> = deployments
            .iter()
            .map(|d| ServedModel {
                model: d.model.clone(),
                deployment: d.id,
                context: d.max_model_len,
                default_max_tokens: cfg.front_door_max_tokens.unwrap_or(u32::MAX),
            })
            .collect();
        let mut planner = exec::build_planner(&rc.pool, &deployments, &rc.policy, rc.options, &rc.predictor, rc.substrate)?;
        if let Some(setup) = exec::routing::routing_setup(&rc.workflows, &datasets, &deployments, &deployment_of, &rc.pool, &rc.routing)? {
            planner.set_routing(setup).map_err(exec::ShellError::from)?;
        }
        let routed = planner.routing().map(|r| r.members().to_vec());
        let ctx = run_context(cfg, workflows, deployments, deployment_of, node_info);
        let clock = ctx.clock;
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let metrics = Arc::new(RuntimeMetrics::new());
        let mut args = planner_args(cfg, ctx, planner, factory, "served".into());
        args.records = vec![Arc::new(Vec::new()); rc.workflows.len() + 1];
        args.events = Some(events.clone());
        args.front_door = Some((front_door_index, cfg.program_idle));
        args.metrics = Some(Arc::clone(&metrics));
        args.keep_ended = Some(cfg.keep_ended.max(1));
        args.timeline_segments = Some(cfg.timeline_segments.max(1));
        args.max_programs = Some(cfg.max_programs);
        let (planner, handle) =
            Actor::spawn(None, PlannerActor, args).await.map_err(|e| LiveError::Spawn(e.to_string()))?;
        Ok(Service { planner, handle: std::sync::Mutex::new(Some(handle)), events, datasets, clock, served, routed, metrics, stopping: Default::default() })
    }

    /// Seconds since the service started (the time base of events and session ends).
    pub fn wall(&self) -> f64 {
        self.clock.wall()
    }

    /// Add a workflow; answers its index. Refused when a deployment is not served.
    pub async fn register(&self, spec: WorkflowSpec) -> Result<u32, ServiceError> {
        let spec = Arc::new(spec);
        let r = self.ask_until_answered(|reply| PlannerMsg::Register { spec, reply }).await?;
        r.map_err(|e| refused(e, ServiceError::NotServed))
    }

    /// Start one session of workflow `workflow` per input, now; answers their ids.
    pub async fn submit(&self, workflow: u32, inputs: Vec<Record>) -> Result<Vec<SessionId>, ServiceError> {
        self.submit_durable(workflow, inputs.into_iter().map(|r| (r, None)).collect()).await
    }

    /// [`Self::submit`] of sessions that journal their progress (those with a
    /// [`DurableSession`]) and replay what their journal already holds.
    pub async fn submit_durable(&self, workflow: u32, inputs: Vec<(Record, Option<DurableSession>)>) -> Result<Vec<SessionId>, ServiceError> {
        let r = self.ask_until_answered(|reply| PlannerMsg::Submit { workflow, inputs, reply }).await?;
        r.map_err(|e| refused(e, ServiceError::BadRequest))
    }

    /// The dataset records of start-up workflow `workflow` (`None` for a workflow registered
    /// later, which has no dataset on this machine).
    pub fn dataset(&self, workflow: u32) -> Option<Arc<Vec<Record>>> {
        self.datasets.get(workflow as usize).cloned()
    }

    /// Where these sessions stand, in order.
    pub async fn status(&self, sessions: Vec<SessionId>) -> Result<Vec<SessionStatus>, ServiceError> {
        self.ask(|reply| PlannerMsg::Status { sessions, reply }).await
    }

    /// End these sessions, if still open, as failed with `reason`.
    pub fn cancel(&self, sessions: Vec<SessionId>, reason: String) -> Result<(), ServiceError> {
        self.planner
            .send_message(PlannerMsg::Cancel { sessions, reason })
            .map_err(|e| ServiceError::Unavailable(e.to_string()))
    }

    /// The runtime's own metrics (`GET /metrics`).
    pub fn metrics(&self) -> &Arc<RuntimeMetrics> {
        &self.metrics
    }

    /// The served models (the front door's `/v1/models`), and [`ROUTER_MODEL`] last when the
    /// runtime has a router.
    pub fn models(&self) -> Vec<String> {
        let mut models: Vec<String> = self.served.iter().map(|s| s.model.clone()).collect();
        if self.routed.is_some() {
            models.push(ROUTER_MODEL.to_string());
        }
        models
    }

    /// Whether `model` names the router ([`ROUTER_MODEL`], any case) and the runtime has one.
    pub fn is_router_model(&self, model: &str) -> bool {
        self.routed.is_some() && model.eq_ignore_ascii_case(ROUTER_MODEL)
    }

    /// What a routed call may use: the smallest context of the router's models (a program may
    /// be bound to any of them), as a [`ServedModel`] named after the router (its deployment:
    /// the router's first). `None` without a router.
    pub fn routed_model(&self) -> Option<ServedModel> {
        let routed = self.routed.as_ref()?;
        let members = || self.served.iter().filter(|s| routed.contains(&s.deployment));
        Some(ServedModel {
            model: ROUTER_MODEL.to_string(),
            deployment: *routed.first()?,
            context: members().map(|s| s.context).min()?,
            default_max_tokens: members().map(|s| s.default_max_tokens).min()?,
        })
    }

    /// The served deployment of `model` (`Qwen3-8B`, any case, or its Hugging Face id
    /// `Qwen/Qwen3-8B`).
    pub fn deployment_of_model(&self, model: &str) -> Option<DeploymentId> {
        self.served_model(model).map(|s| s.deployment)
    }

    /// The served deployment of `model`, its context length and its default output limit.
    pub fn served_model(&self, model: &str) -> Option<&ServedModel> {
        let name = model.rsplit('/').next().unwrap_or(model);
        self.served.iter().find(|s| s.model.eq_ignore_ascii_case(name))
    }

    /// The front door: schedule one call of external program `program` (`None`: a program of
    /// this one call) on the served deployment of `model`. The answer's text goes to `sink` as
    /// it arrives; the returned receiver gets the whole answer (or why there is none). When
    /// `sink`'s receiver is dropped, the call is abandoned upstream.
    pub fn call(
        &self,
        program: Option<String>,
        model: &str,
        request: ProgramRequest,
        sink: TokenSink,
    ) -> Result<oneshot::Receiver<Result<Completion, String>>, ServiceError> {
        self.send_call(program, model, request, sink, None)
    }

    /// [`Self::call`], and a receiver told as soon as the call is handed to its program, or why
    /// it is refused (the runtime stops, `max_programs` are open): the answer's status is known
    /// then, before any of its text.
    #[allow(clippy::type_complexity)]
    pub fn call_admitted(
        &self,
        program: Option<String>,
        model: &str,
        request: ProgramRequest,
        sink: TokenSink,
    ) -> Result<(oneshot::Receiver<Result<(), String>>, oneshot::Receiver<Result<Completion, String>>), ServiceError> {
        let (accepted, accepted_rx) = oneshot::channel();
        let done = self.send_call(program, model, request, sink, Some(accepted))?;
        Ok((accepted_rx, done))
    }

    fn send_call(
        &self,
        program: Option<String>,
        model: &str,
        request: ProgramRequest,
        sink: TokenSink,
        accepted: Option<oneshot::Sender<Result<(), String>>>,
    ) -> Result<oneshot::Receiver<Result<Completion, String>>, ServiceError> {
        self.refuse_when_stopping()?;
        let deployment = self.deployment_of_model(model).ok_or_else(|| {
            ServiceError::NotServed(format!("the model `{model}` is not served here; served: {}", self.models().join(", ")))
        })?;
        // An unknown next model is only a hint that cannot be used.
        let next = request.next_model.as_deref().and_then(|m| self.deployment_of_model(m));
        let (reply, rx) = oneshot::channel();
        self.planner
            .send_message(PlannerMsg::ProgramCall { program, deployment, next, request, sink, reply, accepted })
            .map_err(|e| ServiceError::Unavailable(e.to_string()))?;
        Ok(rx)
    }

    /// Whether [`Self::shutdown`] has begun (the server's `/health` then answers 503).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Refuse a front-door call once the service is stopping (the planner would refuse it too,
    /// but as an answer to the call, after its response began).
    fn refuse_when_stopping(&self) -> Result<(), ServiceError> {
        if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ServiceError::Unavailable(SHUTTING_DOWN.into()));
        }
        Ok(())
    }

    /// Record routed front-door programs in `journal` while they are open (`serve --state`): a
    /// program open at a crash is bound to the same model again after the restart.
    pub fn set_program_journal(&self, journal: Arc<super::journal::Journal>) -> Result<(), ServiceError> {
        self.planner.send_message(PlannerMsg::ProgramJournal(journal)).map_err(|e| ServiceError::Unavailable(e.to_string()))
    }

    /// The front door, routed: one call of external program `program` that names
    /// [`ROUTER_MODEL`]. At the program's first such call the planner core's router binds it
    /// (its verifier from the call's text, its model by the learner, DISC's divert and the
    /// model's ledger; with a program journal, a program the journal recorded as open — it was
    /// at a crash — is bound to its recorded model again); the call and every later routed call
    /// of the program run on the bound model. The first receiver gets the binding (recorded in
    /// the journal first, if there is one) before the call is scheduled, the second the answer.
    #[allow(clippy::type_complexity)]
    pub fn call_routed(
        &self,
        program: Option<String>,
        request: ProgramRequest,
        sink: TokenSink,
    ) -> Result<(oneshot::Receiver<Result<ProgramBinding, String>>, oneshot::Receiver<Result<Completion, String>>), ServiceError>
    {
        self.refuse_when_stopping()?;
        if self.routed.is_none() {
            return Err(ServiceError::NotServed(format!(
                "`{ROUTER_MODEL}` needs a router: start the runtime with a routed workflow (`--workflow FILE` with a `route:` node)"
            )));
        }
        let next = request.next_model.as_deref().and_then(|m| self.deployment_of_model(m));
        let next_routed = request.next_model.as_deref().is_some_and(|m| self.is_router_model(m));
        let (reply, rx) = oneshot::channel();
        let (bound, bound_rx) = oneshot::channel();
        let route = super::actors::ProgramRoute { next_routed, bound };
        self.planner
            .send_message(PlannerMsg::RoutedProgramCall { program, route, next, request, sink, reply })
            .map_err(|e| ServiceError::Unavailable(e.to_string()))?;
        Ok((bound_rx, rx))
    }

    /// The verdict of routed front-door program `program` (its grader's success, 0–1): the
    /// router's learner learns from it (paper 002's delayed feedback); answers the reward.
    /// Refused for a program the runtime does not know as routed (or whose verdict landed
    /// already), and for one still open (its last call has not returned).
    pub async fn program_verdict(&self, program: String, success: f64) -> Result<f64, ServiceError> {
        self.ask(|reply| PlannerMsg::ProgramVerdict { program, success, reply }).await?
    }

    /// The run's events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<TraceLine> {
        self.events.subscribe()
    }

    /// Fail what is open with `reason`, reclaim every replica and stop; answers the report of
    /// everything the service ran.
    pub async fn shutdown(&self, reason: &str) -> Result<LiveOutput, LiveError> {
        self.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.planner.send_message(PlannerMsg::Abort(reason.to_string()));
        let _ = tokio::time::timeout(Duration::from_secs(5), self.planner.call(PlannerMsg::WaitDone, None)).await;
        let out = match self.planner.call(PlannerMsg::Shutdown, Some(Duration::from_secs(120))).await {
            Ok(CallResult::Success(out)) => *out,
            _ => return Err(LiveError::PlannerGone("no answer to the shutdown".into())),
        };
        let handle = self.handle.lock().ok().and_then(|mut h| h.take());
        if let Some(h) = handle {
            let _ = h.await;
        }
        Ok(out)
    }

    async fn ask<T: Send + 'static>(
        &self,
        msg: impl FnOnce(ractor::RpcReplyPort<T>) -> PlannerMsg,
    ) -> Result<T, ServiceError> {
        self.ask_within(msg, Some(ASK_TIMEOUT)).await
    }

    /// [`Self::ask`] without a timeout, for requests that take effect once delivered.
    async fn ask_until_answered<T: Send + 'static>(
        &self,
        msg: impl FnOnce(ractor::RpcReplyPort<T>) -> PlannerMsg,
    ) -> Result<T, ServiceError> {
        self.ask_within(msg, None).await
    }

    async fn ask_within<T: Send + 'static>(
        &self,
        msg: impl FnOnce(ractor::RpcReplyPort<T>) -> PlannerMsg,
        timeout: Option<Duration>,
    ) -> Result<T, ServiceError> {
        match self.planner.call(msg, timeout).await {
            Ok(CallResult::Success(v)) => Ok(v),
            Ok(CallResult::Timeout) => Err(ServiceError::Unavailable("the planner did not answer in time".into())),
            Ok(CallResult::SenderError) => Err(ServiceError::Unavailable("the planner dropped the request".into())),
            Err(e) => {
                tracing::debug!(error = %e, "the planner actor is gone");
                Err(ServiceError::Unavailable("the runtime has stopped".into()))
            }
        }
    }
}

/// A refusal of the planner as the service's error: `otherwise`, unless the runtime is stopping.
fn refused(message: String, otherwise: fn(String) -> ServiceError) -> ServiceError {
    if message == SHUTTING_DOWN { ServiceError::Unavailable(message) } else { otherwise(message) }
}

/// Name of the front door's workflow in reports.
pub const FRONT_DOOR_WORKFLOW: &str = "front-door";

/// A served model, as the front door sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedModel {
    /// Catalogue name (`Qwen3-8B`).
    pub model: String,
    pub deployment: DeploymentId,
    /// The served context (prompt plus answer, tokens): a call gets at most what is left of it
    /// after its prompt, as vLLM answers.
    pub context: u32,
    /// The answer's limit of a chat call that sets no `max_tokens`
    /// ([`super::LiveConfig::front_door_max_tokens`]); `u32::MAX`: the context's rest.
    pub default_max_tokens: u32,
}

/// The front door's workflow: one node per served deployment (node i serves deployment i, in
/// the table's order), each a single call whose prompt the client sends. It only gives the
/// planner and the report a workflow to file front-door calls under.
fn front_door_workflow(deployments: &[DeploymentInfo]) -> Result<WorkflowSpec, WorkflowError> {
    let mut text = format!(
        "name: {FRONT_DOOR_WORKFLOW}\ndescription: calls of external agent programs through the OpenAI-compatible front door\ndeployments:\n"
    );
    for d in deployments {
        let dtype = format!("{:?}", d.dtype).to_lowercase();
        text.push_str(&format!(
            "  d{}: {{model: {}, dtype: {dtype}, max_context: {}, max_output_tokens: {}}}\n",
            d.id.0,
            d.model,
            d.max_model_len,
            (d.max_model_len / 2).max(1)
        ));
    }
    text.push_str("nodes:\n");
    for d in deployments {
        text.push_str(&format!("  - id: d{0}\n    deployment: d{0}\n    prompt: \"a call of an external program\"\n", d.id.0));
    }
    parse_workflow(FRONT_DOOR_WORKFLOW, &text, std::path::Path::new("/nonexistent"))
}
