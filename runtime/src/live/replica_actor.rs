//! One actor per GPU replica: it drives its [`Engine`](super::engine::Engine) through load (or
//! wake of a parked engine), serving, sleep or unload; submits the requests the planner granted
//! (each on its own task, so the engine batches them), and reports `Loaded`, `Finished`,
//! `CallFailed`, `Restarted`, `ReplicaLost`, `Parked`, `EngineFault` and telemetry to the
//! planner actor.
//!
//! Faults follow [`RetryPolicy`] kind by kind: a bad answer is retried with a jittered
//! exponential backoff; an overloaded server is asked again after its `Retry-After`; a call
//! past its deadline is sent once more, then fails (a slow request is not a dead replica); a
//! dropped connection is a dead replica only when the server also fails its health probe
//! (`Engine::probe`) — then it is restarted in place, with a growing pause, up to
//! `max_restarts` times, after which the replica reports itself lost and stops, and the planner
//! moves its calls to another replica; auth failures, rejected requests and misconfiguration
//! fail at once. Every failure is reported to the planner (`EngineFault`), which prints the
//! first of each kind as it happens. Each call is answered at most once: answers from an old
//! engine incarnation for a call already retried are dropped by request id.
//!
//! A call whose session ended while it ran (a client's cancel, a failed sibling) is aborted
//! at the planner's request: its task is dropped with its connection, which makes vLLM abort
//! the request, and its lease ends then rather than when the answer would have come.
//!
//! A reclaim while calls still run waits for them (up to `drain_timeout`) before the engine
//! sleeps or unloads: vLLM before 0.17 crashes when put to sleep with requests in flight.
//!
//! It decides nothing about placement; it depends on the `Engine` trait, the actor messages and
//! the planner's and report's plain types (`DeploymentId`, `WastedWork`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::concurrency::JoinHandle;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{Instrument, Span};

use super::actors::{EngineHandle, LifecycleTicket, PlannerMsg, ReplicaMsg, RetryPolicy};
use super::engine::{CallMeter, Engine, EngineError, LlmRequest};
use crate::ids::{ActivationId, DeviceId, ReplicaId};
use crate::planner::DeploymentId;
use crate::report::WastedWork;

/// The replica actor.
pub struct ReplicaActor;

/// One more bad attempt of a call (a bad answer, or a connection dropped by a live server):
/// retried after a jittered backoff until `max_attempts`, then failed with `why(n)`.
fn bad_answer(f: &mut InFlight, retry: &RetryPolicy, why: impl FnOnce(u32) -> String) -> Next {
    f.bad_answers += 1;
    let n = f.bad_answers;
    if n >= retry.max_attempts { Next::Fail(why(n)) } else { Next::Retry(retry.jittered(n, rand::random())) }
}

pub struct ReplicaArgs {
    pub replica: ReplicaId,
    pub device: DeviceId,
    pub deployment: DeploymentId,
    pub engine: EngineHandle,
    /// The engine is parked asleep: wake it instead of loading.
    pub wake: bool,
    pub planner: ActorRef<PlannerMsg>,
    pub retry: RetryPolicy,
    /// How often to poll the engine's telemetry (`None`: never).
    pub telemetry_every: Option<Duration>,
    /// Turns `true` when the runtime stops: a load still under way is cut short (the engine's
    /// process killed) rather than waited for — a vLLM start-up takes minutes, and this actor
    /// handles its `Stop` only after its `Start`.
    pub stopping: tokio::sync::watch::Receiver<bool>,
}

struct InFlight {
    activation: ActivationId,
    request: LlmRequest,
    /// Attempts that got a bad answer (or lost their connection to a live server).
    bad_answers: u32,
    /// Attempts answered "overloaded".
    overloads: u32,
    /// Attempts past their deadline.
    timeouts: u32,
    /// Attempts made so far (any outcome).
    attempts: u32,
    /// The task of the latest attempt: aborting it drops the request's connection (a no-op
    /// once the attempt has answered).
    task: Option<tokio::task::JoinHandle<()>>,
    /// Aborted at the planner's request, and its task not yet gone: the call still counts as
    /// in flight (a reclaim waits for it) until [`ReplicaMsg::Stopped`].
    aborting: bool,
    /// What its ended attempts had cost the engine (from the request's `CallMeter`).
    wasted: WastedWork,
}

impl InFlight {
    /// The attempt in progress ended without an answer the run uses: what it cost is wasted.
    fn attempt_wasted(&mut self) {
        let cost = self.request.meter.take();
        self.wasted.add_attempt(cost.prefilled, self.request.prompt_tokens, cost.output_tokens);
    }
}

pub struct ReplicaState {
    replica: ReplicaId,
    handle: EngineHandle,
    wake: bool,
    planner: ActorRef<PlannerMsg>,
    retry: RetryPolicy,
    telemetry_every: Option<Duration>,
    telemetry_timer: Option<JoinHandle<()>>,
    telemetry_busy: bool,
    /// Engine incarnation: bumped by every in-place restart.
    generation: u64,
    restarts: u32,
    requests: BTreeMap<u64, InFlight>,
    /// A reclaim waiting for the calls in flight to finish.
    draining: Option<(Option<u8>, LifecycleTicket)>,
    span: Span,
    stopping: tokio::sync::watch::Receiver<bool>,
}

/// What to do with a call whose attempt failed.
enum Next {
    /// Send it again after this pause.
    Retry(Duration),
    /// Fail it for good with this reason.
    Fail(String),
    /// The engine looks dead: restart it (or give the replica up).
    Restart(String),
    /// Send it again at once (an answer from an older incarnation).
    Resend,
}

impl ReplicaState {
    fn engine(&self) -> Arc<dyn Engine> {
        Arc::clone(&self.handle.engine)
    }

    fn fault(&self, error: &EngineError) {
        let _ = self.planner.send_message(PlannerMsg::EngineFault {
            replica: self.replica,
            endpoint: self.handle.engine.endpoint(),
            error: error.clone(),
        });
    }

    /// Send request `id` to the engine on its own task; the answer comes back as `Done`.
    fn launch(&mut self, myself: &ActorRef<ReplicaMsg>, id: u64) {
        let Some(f) = self.requests.get_mut(&id) else { return };
        if f.aborting {
            return;
        }
        f.attempts += 1;
        let request = f.request.clone();
        let engine = Arc::clone(&self.handle.engine);
        let generation = self.generation;
        let me = myself.clone();
        let span = tracing::debug_span!(parent: &self.span, "call", request = id, activation = %f.activation, attempt = f.attempts);
        let task = tokio::spawn(
            async move {
                let result = engine.submit(request).await;
                let _ = me.send_message(ReplicaMsg::Done { id, generation, result });
            }
            .instrument(span),
        );
        f.task = Some(task);
    }

    /// Stop the calls of `activations`: abort their attempts in flight (dropping an attempt's
    /// task drops its connection, so that the server aborts the request). Each call stays in
    /// flight until its task is gone ([`ReplicaMsg::Stopped`]), so that a reclaim waiting for
    /// the replica's calls waits for it too; then it is reported `Aborted`. A retry waiting for
    /// its pause sends nothing.
    fn abort(&mut self, myself: &ActorRef<ReplicaMsg>, activations: &[ActivationId]) {
        for (&id, f) in self.requests.iter_mut().filter(|(_, f)| activations.contains(&f.activation) && !f.aborting) {
            f.aborting = true;
            tracing::info!(activation = %f.activation, "call aborted: its session ended");
            let task = f.task.take();
            let me = myself.clone();
            tokio::spawn(async move {
                if let Some(task) = task {
                    task.abort();
                    let _ = task.await;
                }
                let _ = me.send_message(ReplicaMsg::Stopped { id });
            });
        }
    }

    /// An aborted call is over: report it.
    fn aborted(&mut self, id: u64) {
        if let Some(mut f) = self.requests.remove(&id) {
            f.attempt_wasted();
            let _ = self.planner.send_message(PlannerMsg::Aborted {
                replica: self.replica,
                activation: f.activation,
                attempts: f.attempts,
                wasted: f.wasted,
            });
        }
    }

    fn fail_call(&mut self, id: u64, reason: String) {
        let Some(f) = self.requests.remove(&id) else { return };
        tracing::warn!(activation = %f.activation, %reason, "call failed");
        let _ = self.planner.send_message(PlannerMsg::CallFailed {
            replica: self.replica,
            activation: f.activation,
            reason,
            attempts: f.attempts,
            wasted: f.wasted,
        });
    }

    /// The fault policy for one failed attempt of call `id`.
    async fn next_step(&mut self, id: u64, generation: u64, error: EngineError) -> Next {
        let retry = self.retry;
        let stale = generation < self.generation;
        let engine = self.engine();
        let Some(f) = self.requests.get_mut(&id) else { return Next::Fail(error.to_string()) };
        if f.request.sink.delivered() {
            // Part of the answer reached the caller: a new attempt would send its own text after it.
            return Next::Fail(format!("{error} after part of the answer had reached the caller (not retried)"));
        }
        match error {
            EngineError::BadResponse(reason) => {
                bad_answer(f, &retry, |n| format!("the engine answered badly {n} times; last: {reason}"))
            }
            EngineError::Overloaded { message, retry_after } => {
                f.overloads += 1;
                let n = f.overloads;
                if n > retry.max_overloads {
                    Next::Fail(format!("the server stayed overloaded through {n} attempts; last: {message}"))
                } else {
                    let pause = retry_after.unwrap_or_else(|| retry.jittered(n, rand::random()));
                    Next::Retry(pause.min(retry.max_backoff))
                }
            }
            EngineError::TimedOut(reason) => {
                f.timeouts += 1;
                let n = f.timeouts;
                if n >= retry.max_timeouts {
                    Next::Fail(format!("timed out {n} times (the server answers its health probe, the call is too slow); last: {reason}"))
                } else {
                    Next::Resend
                }
            }
            EngineError::Unreachable(_) if stale => Next::Resend,
            EngineError::Unreachable(reason) => {
                // A dead replica, or only this call's connection dropped? Ask the server.
                match engine.probe().await {
                    Ok(()) => bad_answer(f, &retry, |n| {
                        format!("the connection dropped {n} times while the server still answers its health probe; last: {reason}")
                    }),
                    Err(probe) => Next::Restart(format!("{reason} (health probe: {probe})")),
                }
            }
            other => Next::Fail(other.to_string()),
        }
    }

    fn stop_telemetry(&mut self) {
        if let Some(t) = self.telemetry_timer.take() {
            t.abort();
        }
    }

    /// Restart the engine in place. Returns false when the restart budget is spent or the
    /// engine would not come back.
    async fn restart(&mut self) -> bool {
        let engine = self.engine();
        let mut stopping = self.stopping.clone();
        while self.restarts < self.retry.max_restarts {
            self.restarts += 1;
            let pause = self.retry.restart_after(self.restarts);
            tracing::warn!(restart = self.restarts, ?pause, "engine unreachable: restarting the replica");
            // As a first start: the runtime's stop cuts the pause and the load short.
            let loaded = tokio::select! {
                loaded = async {
                    tokio::time::sleep(pause).await;
                    let _ = engine.unload().await;
                    engine.load().await
                } => Some(loaded),
                _ = stopping.wait_for(|stop| *stop) => None,
            };
            let Some(loaded) = loaded else {
                let _ = engine.unload().await;
                return false;
            };
            match loaded {
                Ok(()) => {
                    self.generation += 1;
                    let _ = self.planner.send_message(PlannerMsg::Restarted { replica: self.replica });
                    return true;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "restart failed");
                    self.fault(&e);
                    if !e.retryable() && !matches!(e, EngineError::Lifecycle(_)) {
                        return false;
                    }
                }
            }
        }
        false
    }

    /// Drop every call here (the planner runs them again elsewhere): their attempts in flight
    /// are aborted, so that none still streams into a caller's sink, and what all their
    /// attempts had cost is returned.
    fn give_up_calls(&mut self) -> WastedWork {
        let mut wasted = WastedWork::default();
        for (_, mut f) in std::mem::take(&mut self.requests) {
            if let Some(task) = f.task.take() {
                task.abort();
            }
            f.attempt_wasted();
            wasted.add(&f.wasted);
        }
        wasted
    }

    /// Give the replica up: the planner requeues its calls elsewhere.
    async fn lose(&mut self, myself: &ActorRef<ReplicaMsg>, reason: String) {
        tracing::error!(%reason, "replica lost");
        self.stop_telemetry();
        let wasted = self.give_up_calls();
        let _ = self.planner.send_message(PlannerMsg::ReplicaLost {
            replica: self.replica,
            actor: myself.get_id(),
            reason: reason.clone(),
            wasted,
        });
        let _ = self.engine().unload().await;
        myself.stop(Some(reason));
    }

    /// Sleep (park) or unload the engine, report it, and stop.
    async fn reclaim(&mut self, myself: &ActorRef<ReplicaMsg>, sleep: Option<u8>, mut ticket: LifecycleTicket) {
        self.stop_telemetry();
        ticket.wait().await;
        let engine = self.engine();
        let mut parked = false;
        if let Some(level) = sleep {
            match engine.sleep(level).await {
                Ok(()) => parked = true,
                Err(EngineError::Unsupported(_)) => {}
                Err(e) => tracing::warn!(error = %e, "sleep failed: unloading instead"),
            }
        }
        if parked {
            tracing::info!(?sleep, "reclaimed: asleep, parked for a later wake");
            let _ = self.planner.send_message(PlannerMsg::Parked { replica: self.replica, engine: self.handle.clone() });
        } else {
            match engine.unload().await {
                Ok(()) | Err(EngineError::Unsupported(_)) => {}
                Err(e) => tracing::warn!(error = %e, "unload failed"),
            }
            tracing::info!("reclaimed: unloaded");
            let _ = self.planner.send_message(PlannerMsg::Unloaded { replica: self.replica });
        }
        ticket.finish();
        if !self.requests.is_empty() {
            // Calls that outlived the drain must not be lost: the planner runs them again.
            let wasted = self.give_up_calls();
            let _ = self.planner.send_message(PlannerMsg::ReplicaLost {
                replica: self.replica,
                actor: myself.get_id(),
                reason: "reclaimed with calls in flight".into(),
                wasted,
            });
        }
        myself.stop(None);
    }

    /// A reclaim that waited for calls to drain: go on once none is left.
    async fn after_call(&mut self, myself: &ActorRef<ReplicaMsg>) {
        if self.requests.is_empty()
            && let Some((sleep, ticket)) = self.draining.take()
        {
            self.reclaim(myself, sleep, ticket).await;
        }
    }
}

impl Actor for ReplicaActor {
    type Msg = ReplicaMsg;
    type State = ReplicaState;
    type Arguments = ReplicaArgs;

    async fn pre_start(&self, _myself: ActorRef<ReplicaMsg>, args: ReplicaArgs) -> Result<ReplicaState, ActorProcessingErr> {
        let span = tracing::info_span!(
            parent: None,
            "replica",
            replica = %args.replica,
            device = %args.device,
            model = %args.engine.served_model,
            engine = args.engine.engine.kind()
        );
        Ok(ReplicaState {
            replica: args.replica,
            handle: args.engine,
            wake: args.wake,
            planner: args.planner,
            retry: args.retry,
            telemetry_every: args.telemetry_every,
            telemetry_timer: None,
            telemetry_busy: false,
            generation: 0,
            restarts: 0,
            requests: BTreeMap::new(),
            draining: None,
            span,
            stopping: args.stopping,
        })
    }

    async fn post_stop(&self, _myself: ActorRef<ReplicaMsg>, state: &mut ReplicaState) -> Result<(), ActorProcessingErr> {
        state.stop_telemetry();
        Ok(())
    }

    async fn handle(&self, myself: ActorRef<ReplicaMsg>, msg: ReplicaMsg, state: &mut ReplicaState) -> Result<(), ActorProcessingErr> {
        let span = state.span.clone();
        handle(myself, msg, state).instrument(span).await;
        Ok(())
    }
}

/// Waits for the device's lifecycle turn, then loads (or wakes) the engine: a sleeper that
/// cannot wake is loaded instead, and a start that failed because the process died is retried
/// a bounded number of times with a growing pause. The result, and the retries it took.
async fn start_engine(state: &mut ReplicaState, ticket: &mut LifecycleTicket) -> (Result<(), EngineError>, u32) {
    ticket.wait().await;
    let engine = state.engine();
    let mut result = if state.wake { engine.wake().await } else { engine.load().await };
    let mut retries = 0;
    if let (true, Err(e)) = (state.wake, &result) {
        // A sleeper that cannot wake (e.g. a server without `/collective_rpc` after a
        // level-2 sleep) is replaced by a fresh engine.
        tracing::warn!(error = %e, "wake failed: loading instead");
        state.fault(e);
        let _ = engine.unload().await;
        result = engine.load().await;
        retries = 1;
    }
    // A start can fail for good (the server refuses the configuration, the key, the model) or
    // because the process died meanwhile; only the latter is retried.
    let mut attempts = 0;
    while let Err(e) = &result {
        state.fault(e);
        let hopeless = matches!(e, EngineError::Auth(_) | EngineError::Misconfigured(_) | EngineError::Rejected(_) | EngineError::Invalid(_));
        if hopeless || attempts >= state.retry.max_restarts {
            break;
        }
        attempts += 1;
        tracing::warn!(error = %e, attempt = attempts, "start failed: starting again");
        tokio::time::sleep(state.retry.restart_after(attempts)).await;
        let _ = engine.unload().await;
        result = engine.load().await;
        retries += 1;
    }
    (result, retries)
}

async fn handle(myself: ActorRef<ReplicaMsg>, msg: ReplicaMsg, state: &mut ReplicaState) {
    match msg {
        ReplicaMsg::Start(mut ticket) => {
            let engine = state.engine();
            let mut stopping = state.stopping.clone();
            let (result, retries) = tokio::select! {
                started = start_engine(state, &mut ticket) => started,
                // The runtime stops (or its planner is gone) during the load: cut it short.
                _ = stopping.wait_for(|stop| *stop) => {
                    (Err(EngineError::Lifecycle("the runtime stopped during the load".into())), 0)
                }
            };
            if let Err(e) = &result {
                tracing::error!(error = %e, "load failed");
                let _ = engine.unload().await;
            } else if retries > 0 {
                let _ = state.planner.send_message(PlannerMsg::Restarted { replica: state.replica });
            }
            ticket.finish();
            let result = result.map_err(|e| e.to_string());
            let _ = state.planner.send_message(PlannerMsg::Loaded { replica: state.replica, result: result.clone() });
            if let Err(reason) = result {
                myself.stop(Some(format!("load failed: {reason}")));
                return;
            }
            tracing::info!(woke = state.wake, "replica awake");
            if let Some(every) = state.telemetry_every {
                // Once right away (a short run may end before the first tick), then periodically.
                let _ = myself.send_message(ReplicaMsg::PollTelemetry);
                state.telemetry_timer = Some(myself.send_interval(every, || ReplicaMsg::PollTelemetry));
            }
        }
        ReplicaMsg::Submit { activation, mut request } => {
            request.model = state.handle.served_model.clone();
            // A fresh meter: a call sent again after its replica was lost must not share one with
            // an attempt of the lost replica that may still be ending. It tells the planner when
            // an attempt's first token comes (the trace's `first_token`, at its time).
            let (planner, replica) = (state.planner.clone(), state.replica);
            request.meter = CallMeter::with_first_token_hook(move || {
                let _ = planner.send_message(PlannerMsg::FirstToken { replica, activation, at: std::time::Instant::now() });
            });
            let id = request.id;
            state.requests.insert(
                id,
                InFlight {
                    activation,
                    request,
                    bad_answers: 0,
                    overloads: 0,
                    timeouts: 0,
                    attempts: 0,
                    task: None,
                    aborting: false,
                    wasted: WastedWork::default(),
                },
            );
            state.launch(&myself, id);
        }
        ReplicaMsg::Retry { id } => state.launch(&myself, id),
        ReplicaMsg::Abort { activations } => state.abort(&myself, &activations),
        ReplicaMsg::Stopped { id } => {
            state.aborted(id);
            state.after_call(&myself).await;
        }
        ReplicaMsg::Done { id, generation, result } => {
            let Some(f) = state.requests.get_mut(&id) else { return };
            if f.aborting {
                // Answered before the abort took: the call is over all the same, and its answer
                // (whose counts the completion carries) goes unused.
                if let Ok(c) = &result {
                    f.request.meter.take();
                    f.wasted.add_attempt(true, c.prompt_tokens, u64::from(c.output_tokens));
                }
                state.aborted(id);
                state.after_call(&myself).await;
                return;
            }
            match result {
                Ok(completion) => {
                    if let Some(f) = state.requests.remove(&id) {
                        // The answering attempt's own cost is in the completion.
                        f.request.meter.take();
                        let _ = state.planner.send_message(PlannerMsg::Finished {
                            replica: state.replica,
                            activation: f.activation,
                            completion,
                            attempts: f.attempts,
                            wasted: f.wasted,
                        });
                    }
                }
                Err(error) => {
                    if let Some(f) = state.requests.get_mut(&id) {
                        f.attempt_wasted();
                    }
                    // A caller that went away is not a fault of the engine.
                    if generation >= state.generation && !matches!(error, EngineError::Cancelled(_)) {
                        state.fault(&error);
                    }
                    match state.next_step(id, generation, error).await {
                        Next::Retry(pause) => {
                            tracing::debug!(request = id, ?pause, "retrying the call");
                            myself.send_after(pause, move || ReplicaMsg::Retry { id });
                        }
                        Next::Resend => state.launch(&myself, id),
                        Next::Fail(reason) => state.fail_call(id, reason),
                        Next::Restart(reason) => {
                            if state.restart().await {
                                state.launch(&myself, id);
                            } else {
                                let reason = format!("engine unreachable ({reason}) and {} restart(s) did not bring it back", state.restarts);
                                state.lose(&myself, reason).await;
                                return;
                            }
                        }
                    }
                }
            }
            state.after_call(&myself).await;
        }
        ReplicaMsg::Reclaim { sleep, ticket } => {
            if state.requests.is_empty() {
                state.reclaim(&myself, sleep, ticket).await;
            } else {
                // The planner never reclaims a leased replica; if calls run here anyway, let
                // them finish first (vLLM < 0.17 crashes when slept with calls in flight).
                tracing::warn!(calls = state.requests.len(), "reclaim with calls in flight: draining first");
                state.draining = Some((sleep, ticket));
                myself.send_after(state.retry.drain_timeout, || ReplicaMsg::DrainTimeout);
            }
        }
        ReplicaMsg::DrainTimeout => {
            if let Some((sleep, ticket)) = state.draining.take() {
                tracing::warn!(calls = state.requests.len(), "calls did not drain in time: reclaiming now");
                state.reclaim(&myself, sleep, ticket).await;
            }
        }
        ReplicaMsg::Stop(reply) => {
            state.stop_telemetry();
            match state.engine().unload().await {
                Ok(()) | Err(EngineError::Unsupported(_)) => {}
                Err(e) => tracing::warn!(error = %e, "unload at shutdown failed"),
            }
            let _ = reply.send(());
            myself.stop(None);
        }
        ReplicaMsg::PollTelemetry => {
            if state.telemetry_busy {
                return;
            }
            state.telemetry_busy = true;
            let engine = state.engine();
            let me = myself.clone();
            tokio::spawn(async move {
                let r = engine.telemetry().await;
                let _ = me.send_message(ReplicaMsg::TelemetryDone(r));
            });
        }
        ReplicaMsg::TelemetryDone(result) => {
            state.telemetry_busy = false;
            match result {
                Ok(t) => {
                    tracing::trace!(running = t.running, waiting = t.waiting, kv = t.kv_cache_usage, "telemetry");
                    let _ = state.planner.send_message(PlannerMsg::Telemetry { replica: state.replica, telemetry: t });
                }
                Err(EngineError::Unsupported(reason)) => {
                    // No metrics here: stop asking (a fixed endpoint without `/metrics`).
                    tracing::debug!(%reason, "no telemetry: polling stopped");
                    state.stop_telemetry();
                }
                Err(e) => tracing::debug!(error = %e, "telemetry unavailable"),
            }
        }
    }
}
