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
use thiserror::Error;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::actors::{Clock, EngineFactory, PlannerMsg, RunContext, SessionStatus, ToolsHandle};
use super::planner_actor::{PlannerActor, PlannerArgs, ReportMeta};
use super::shell::{LiveConfig, LiveError, LiveOutput};
use crate::exec::{self, TraceLine};
use crate::ids::SessionId;
use crate::values::Record;
use crate::workflow::WorkflowSpec;

/// Lines of the event stream kept for subscribers that fall behind.
const EVENT_BUFFER: usize = 4096;

/// How long a request to the planner actor may wait for its answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a service request was refused.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ServiceError {
    /// The workflow cannot run on what this service serves (a deployment not in its table).
    #[error("{0}")]
    NotServed(String),
    /// The request names something that does not exist or is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The runtime stopped or did not answer.
    #[error("the runtime is not available: {0}")]
    Unavailable(String),
}

/// A running service. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Service {
    planner: ActorRef<PlannerMsg>,
    handle: std::sync::Mutex<Option<JoinHandle<()>>>,
    events: broadcast::Sender<TraceLine>,
    /// The dataset records of the workflows the service started with (by workflow index), for
    /// sessions submitted without inputs.
    datasets: Vec<Arc<Vec<Record>>>,
    clock: Clock,
}

impl Service {
    /// Start the runtime for `cfg` (its workflows define the served deployment table and are
    /// registered as workflows 0, 1, …; its session counts, arrival process and deadline are
    /// not used) with engines from `factory`. Must be called inside a multi-threaded tokio
    /// runtime.
    pub async fn start(cfg: &LiveConfig, factory: Arc<dyn EngineFactory>) -> Result<Service, LiveError> {
        let rc = &cfg.run;
        let (deployments, deployment_of) = exec::deployment_table(&rc.workflows, rc.max_num_seqs)?;
        let node_info = exec::node_infos(&rc.workflows, &deployment_of);
        let datasets: Vec<Arc<Vec<Record>>> = exec::load_records(&rc.workflows)?.into_iter().map(Arc::new).collect();
        let planner = exec::build_planner(&rc.pool, &deployments, &rc.policy, rc.options, &rc.predictor, rc.substrate)?;
        let clock = Clock::start(cfg.speed);
        let ctx = Arc::new(RunContext {
            workflows: rc.workflows.clone(),
            seed: rc.seed,
            deployments,
            deployment_of,
            node_info,
            clock,
            retry: cfg.retry,
            stream: cfg.stream,
            tools: ToolsHandle::default(),
        });
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let args = PlannerArgs {
            ctx,
            planner,
            factory,
            devices: rc.pool.devices.clone(),
            trace: Vec::new(),
            records: vec![Vec::new(); rc.workflows.len()],
            meta: ReportMeta {
                policy: rc.policy.clone(),
                seed: rc.seed,
                noise_seed: rc.noise_seed,
                arrival: "served".into(),
                pool: rc.pool.name.clone(),
            },
            telemetry_every: cfg.telemetry_every,
            tool_workers: rc.tool_workers,
            tick: cfg.tick,
            on_note: cfg.on_note.clone(),
            keep_trace: false,
            progress: None,
            events: Some(events.clone()),
        };
        let (planner, handle) =
            Actor::spawn(None, PlannerActor, args).await.map_err(|e| LiveError::Spawn(e.to_string()))?;
        Ok(Service { planner, handle: std::sync::Mutex::new(Some(handle)), events, datasets, clock })
    }

    /// Seconds since the service started (the time base of events and session ends).
    pub fn wall(&self) -> f64 {
        self.clock.wall()
    }

    /// Add a workflow; answers its index. Refused when a deployment is not served.
    pub async fn register(&self, spec: WorkflowSpec) -> Result<u32, ServiceError> {
        let spec = Arc::new(spec);
        let r = self.ask(|reply| PlannerMsg::Register { spec, reply }).await?;
        r.map_err(ServiceError::NotServed)
    }

    /// Start one session of workflow `workflow` per input, now; answers their ids.
    pub async fn submit(&self, workflow: u32, inputs: Vec<Record>) -> Result<Vec<SessionId>, ServiceError> {
        let r = self.ask(|reply| PlannerMsg::Submit { workflow, inputs, reply }).await?;
        r.map_err(ServiceError::BadRequest)
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

    /// The run's events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<TraceLine> {
        self.events.subscribe()
    }

    /// Fail what is open with `reason`, reclaim every replica and stop; answers the report of
    /// everything the service ran.
    pub async fn shutdown(&self, reason: &str) -> Result<LiveOutput, LiveError> {
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
        match self.planner.call(msg, Some(ASK_TIMEOUT)).await {
            Ok(CallResult::Success(v)) => Ok(v),
            Ok(CallResult::Timeout) => Err(ServiceError::Unavailable("the planner did not answer in time".into())),
            Ok(CallResult::SenderError) => Err(ServiceError::Unavailable("the planner dropped the request".into())),
            Err(e) => Err(ServiceError::Unavailable(e.to_string())),
        }
    }
}
