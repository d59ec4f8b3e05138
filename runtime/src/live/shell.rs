//! The live shell: runs a trace of sessions on the live runtime — the same planner core as the
//! simulator, driven by actors on tokio on wall-clock time — and returns the same
//! [`RunReport`](crate::report::RunReport) as the simulator (times in wall-clock seconds).
//!
//! [`run`] builds what both shells share (deployment table, node facts, dataset records, the
//! seeded arrival trace, the planner with its policy), starts the planner actor (which starts
//! the tool executors, and replica and session actors as the run unfolds), releases sessions at
//! their arrival times (trace time / `speed`), waits until every session has ended (or the
//! deadline passed), then reclaims every replica and builds the report.
//!
//! It depends on the actors, the planner core and `exec`; engines come from the
//! caller's [`EngineFactory`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::Actor;
use thiserror::Error;

use super::actors::{Clock, EngineFactory, NoteSink, PlannerMsg, RetryPolicy, RunContext, ToolsHandle};
use super::planner_actor::{PlannerActor, PlannerArgs, Progress, ReportMeta};
use crate::exec::{self, RunConfig, ShellError, arrivals};

/// What a run returns is the planner actor's reply to `Shutdown`, so it is the actor vocabulary's.
pub use super::actors::{FaultCounters, LiveOutput};

/// A live run: the shared run configuration plus what only wall-clock execution needs.
#[derive(Clone)]
pub struct LiveConfig {
    /// Workflows, sessions, arrival process, seeds, pool, policy, predictor, tool workers and
    /// batch limit, exactly as for a simulation.
    pub run: RunConfig,
    /// Device seconds per wall second: 1 on real GPUs; the `--speed` of `switchyard emulate`
    /// engines otherwise. Arrival times of the trace are divided by it, and the planner core
    /// sees wall time multiplied by it.
    pub speed: f64,
    pub retry: RetryPolicy,
    /// How often replica actors scrape their engine's telemetry (`None`: never).
    pub telemetry_every: Option<Duration>,
    /// Fail whatever is still open when this much wall time has passed (`None`: no limit).
    pub deadline: Option<Duration>,
    /// Ask engines to stream their answers.
    pub stream: bool,
    /// Watchdog period of the planner actor (stranded-unit detection).
    pub tick: Duration,
    /// Set (e.g. by a Ctrl-C handler) to stop the run: what is open fails as `interrupted`, as
    /// at the deadline, and the report is marked `interrupted` (`None`: never).
    pub interrupt: Option<Arc<AtomicBool>>,
    /// Where notes (the first engine error of each kind, lost replicas, …) go as they
    /// happen; they are in [`LiveOutput::notes`] as well (`None`: only there).
    pub on_note: Option<NoteSink>,
    /// Record the run's events in [`LiveOutput::trace`] (the simulator's `--trace` schema).
    pub keep_trace: bool,
    /// A served runtime's front door: end a program after this long without a call in flight.
    pub program_idle: Duration,
    /// A served runtime keeps the reports (status, final output) of at most this many ended
    /// sessions; older ones are forgotten (their status reads `unknown`), so memory does not
    /// grow with the sessions served.
    pub keep_ended: usize,
    /// A served runtime keeps at most about twice this many GPU-timeline segments per device;
    /// older ones are folded into the GPU-time partition its report reads.
    pub timeline_segments: usize,
    /// A served runtime's front door keeps at most this many keyed programs open; a call that
    /// would open one more is refused (the server answers 429).
    pub max_programs: usize,
    /// A served runtime's front door: the answer limit of a chat call that sets no `max_tokens`
    /// (`serve --default-max-tokens`; vLLM's generation-config `max_new_tokens`), capped by
    /// what the context leaves after the prompt. `None`: the context's rest, vLLM's default —
    /// under `joint` such a call then reserves KV for all of it.
    pub front_door_max_tokens: Option<u32>,
}

impl LiveConfig {
    /// Defaults: real time (speed 1), [`RetryPolicy::default`], telemetry
    /// every second, no deadline, no streaming, a 100 ms watchdog.
    pub fn new(run: RunConfig) -> Self {
        LiveConfig {
            run,
            speed: 1.0,
            retry: RetryPolicy::default(),
            telemetry_every: Some(Duration::from_secs(1)),
            deadline: None,
            stream: false,
            tick: Duration::from_millis(100),
            interrupt: None,
            on_note: None,
            keep_trace: false,
            program_idle: Duration::from_secs(300),
            keep_ended: 100_000,
            timeline_segments: 4_096,
            max_programs: 10_000,
            front_door_max_tokens: None,
        }
    }
}

/// Errors that prevent a live run from starting or finishing.
#[derive(Debug, Error)]
pub enum LiveError {
    #[error(transparent)]
    Setup(#[from] ShellError),
    #[error("cannot start the planner actor: {0}")]
    Spawn(String),
    #[error("the planner actor stopped before the run finished: {0}")]
    PlannerGone(String),
    #[error("{reason} (after {sessions_ended} of {sessions_total} sessions ended){}", faults.line().map(|l| format!("; {l}")).unwrap_or_default())]
    Stopped { reason: String, sessions_ended: usize, sessions_total: usize, faults: FaultCounters },
}

/// Run `cfg` on the live runtime with engines from `factory`. `progress(ended, total)` is called
/// as sessions end. Must be called inside a tokio runtime (multi-threaded: tools run on the
/// blocking pool).
pub async fn run(cfg: &LiveConfig, factory: Arc<dyn EngineFactory>, progress: Option<Progress>) -> Result<LiveOutput, LiveError> {
    let rc = &cfg.run;
    let (deployments, deployment_of) = exec::deployment_table(&rc.workflows, rc.max_num_seqs)?;
    let node_info = exec::node_infos(&rc.workflows, &deployment_of);
    let records = exec::load_records(&rc.workflows)?;
    let mut planner = exec::build_planner(&rc.pool, &deployments, &rc.policy, rc.options, &rc.predictor, rc.substrate)?;
    if let Some(setup) = exec::routing::routing_setup(&rc.workflows, &records, &deployments, &deployment_of, &rc.pool, &rc.routing)? {
        planner.set_routing(setup).map_err(exec::ShellError::from)?;
    }
    let sizes: Vec<usize> = records.iter().map(|r| r.len()).collect();
    let trace = arrivals::trace_per_workflow(&rc.arrivals_of(), &rc.sessions_of(), &sizes, rc.seed);
    let total = trace.len();
    let ctx = run_context(cfg, rc.workflows.clone(), deployments, deployment_of, node_info);
    let clock = ctx.clock;
    let mut args = planner_args(cfg, Arc::clone(&ctx), planner, factory, rc.arrival.to_string());
    args.trace = trace.clone();
    args.records = records;
    args.keep_trace = cfg.keep_trace;
    args.progress = progress;
    let (planner, handle) =
        Actor::spawn(None, PlannerActor, args).await.map_err(|e| LiveError::Spawn(e.to_string()))?;

    // Release sessions at their arrival times.
    let arrivals_task = {
        let planner = planner.clone();
        tokio::spawn(async move {
            for (i, e) in trace.iter().enumerate() {
                tokio::time::sleep_until(clock.instant_of(e.at).into()).await;
                if planner.send_message(PlannerMsg::Arrive(i)).is_err() {
                    return;
                }
            }
        })
    };

    let wait = planner.call(PlannerMsg::WaitDone, None);
    let deadline = async {
        match cfg.deadline {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let interrupted = async {
        match &cfg.interrupt {
            Some(flag) => {
                while !flag.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            None => std::future::pending().await,
        }
    };
    enum Waited<T> {
        Done(T),
        Deadline,
        Interrupted,
    }
    let waited = tokio::select! {
        r = wait => Waited::Done(r),
        () = deadline => Waited::Deadline,
        () = interrupted => Waited::Interrupted,
    };
    let mut stopped: Option<String> = None;
    let mut was_interrupted = false;
    let early = match waited {
        Waited::Done(Ok(CallResult::Success(Ok(())))) => None,
        Waited::Done(Ok(CallResult::Success(Err(reason)))) => {
            stopped = Some(reason);
            None
        }
        Waited::Done(Ok(_)) | Waited::Done(Err(_)) => {
            arrivals_task.abort();
            return Err(LiveError::PlannerGone("no answer to the wait for the end of the run".into()));
        }
        Waited::Deadline => {
            Some(format!("the run's deadline of {:.1} s passed", cfg.deadline.unwrap_or_default().as_secs_f64()))
        }
        Waited::Interrupted => {
            was_interrupted = true;
            Some(exec::INTERRUPTED.to_string())
        }
    };
    if let Some(reason) = early {
        // Deadline or interrupt: fail what is open, give sessions a moment to report, then stop.
        arrivals_task.abort();
        let _ = planner.send_message(PlannerMsg::Abort(reason));
        let _ = tokio::time::timeout(Duration::from_secs(5), planner.call(PlannerMsg::WaitDone, None)).await;
    }
    arrivals_task.abort();
    let out = match planner.call(PlannerMsg::Shutdown, Some(Duration::from_secs(120))).await {
        Ok(CallResult::Success(out)) => *out,
        _ => return Err(LiveError::PlannerGone("no answer to the shutdown".into())),
    };
    let mut out = out;
    out.report.interrupted = was_interrupted;
    let _ = handle.await;
    if let Some(reason) = stopped {
        return Err(LiveError::Stopped {
            reason,
            sessions_ended: out.report.sessions_completed + out.report.sessions_failed,
            sessions_total: total,
            faults: out.faults,
        });
    }
    Ok(out)
}

/// What every actor of a run on `cfg` reads, with the clock started now.
pub(super) fn run_context(
    cfg: &LiveConfig,
    workflows: Vec<Arc<crate::workflow::WorkflowSpec>>,
    deployments: Vec<crate::planner::DeploymentInfo>,
    deployment_of: exec::DeploymentMap,
    node_info: exec::graph_info::NodeFacts,
) -> Arc<RunContext> {
    Arc::new(RunContext {
        workflows,
        seed: cfg.run.seed,
        deployments,
        deployment_of,
        node_info,
        clock: Clock::start(cfg.speed),
        retry: cfg.retry,
        stream: cfg.stream,
        tools: ToolsHandle::default(),
        routing: cfg.run.routing.clone(),
        front_door_max_tokens: cfg.front_door_max_tokens,
    })
}

/// The planner actor's arguments for `cfg`: no trace, no records, no trace lines kept, no
/// progress callback, none of a served runtime's parts — the caller sets what its shell uses.
pub(super) fn planner_args(
    cfg: &LiveConfig,
    ctx: Arc<RunContext>,
    planner: crate::planner::Planner,
    factory: Arc<dyn EngineFactory>,
    arrival: String,
) -> PlannerArgs {
    let rc = &cfg.run;
    PlannerArgs {
        ctx,
        planner,
        factory,
        devices: rc.pool.devices.clone(),
        trace: Vec::new(),
        records: Vec::new(),
        meta: ReportMeta {
            policy: rc.policy.clone(),
            seed: rc.seed,
            noise_seed: rc.noise_seed,
            arrival,
            pool: rc.pool.name.clone(),
        },
        telemetry_every: cfg.telemetry_every,
        tool_workers: rc.tool_workers,
        tick: cfg.tick,
        on_note: cfg.on_note.clone(),
        keep_trace: false,
        progress: None,
        events: None,
        front_door: None,
        metrics: None,
        keep_ended: None,
        timeline_segments: None,
        max_programs: None,
    }
}

/// [`run`] on a runtime of its own (multi-threaded, two workers plus tokio's blocking pool for
/// tools), for callers that have none: the CLI and tests outside this crate.
pub fn run_blocking(cfg: &LiveConfig, factory: Arc<dyn EngineFactory>, progress: Option<Progress>) -> Result<LiveOutput, LiveError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("switchyard-live")
        .build()
        .map_err(|e| LiveError::Spawn(format!("tokio runtime: {e}")))?;
    runtime.block_on(run(cfg, factory, progress))
}
