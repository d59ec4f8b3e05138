//! One actor per GPU replica: it drives its [`Engine`](super::engine::Engine) through load (or
//! wake of a parked engine), serving, sleep or unload; submits the requests the planner granted
//! (each on its own task, so the engine batches them), and reports `Loaded`, `Finished`,
//! `CallFailed`, `Restarted`, `ReplicaLost`, `Parked` and telemetry to the planner actor.
//!
//! Faults: a bad answer (HTTP 5xx, garbage) is retried with exponential backoff up to
//! `RetryPolicy::max_attempts`, then the call fails with the reason; an unreachable engine is
//! restarted in place (unload, load) up to `RetryPolicy::max_restarts` times and its calls are
//! sent again to the new incarnation; past that the replica reports itself lost and stops, and
//! the planner moves its calls to another replica. A rejected request fails at once. Each call
//! is answered at most once: answers from an old engine incarnation for a call already retried
//! are dropped by request id.
//!
//! It decides nothing about placement; it depends on the `Engine` trait and the actor messages.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::concurrency::JoinHandle;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{Instrument, Span};

use super::actors::{EngineHandle, PlannerMsg, ReplicaMsg, RetryPolicy};
use super::engine::{Engine, EngineError, LlmRequest};
use crate::ids::{ActivationId, DeviceId, ReplicaId};
use crate::planner::DeploymentId;

/// The replica actor.
pub struct ReplicaActor;

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
}

struct InFlight {
    activation: ActivationId,
    request: LlmRequest,
    /// Attempts that got a bad answer.
    bad_answers: u32,
    /// Attempts made so far (any outcome).
    attempts: u32,
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
    span: Span,
}

impl ReplicaState {
    fn engine(&self) -> Arc<dyn Engine> {
        Arc::clone(&self.handle.engine)
    }

    /// Send request `id` to the engine on its own task; the answer comes back as `Done`.
    fn launch(&mut self, myself: &ActorRef<ReplicaMsg>, id: u64) {
        let Some(f) = self.requests.get_mut(&id) else { return };
        f.attempts += 1;
        let request = f.request.clone();
        let engine = Arc::clone(&self.handle.engine);
        let generation = self.generation;
        let me = myself.clone();
        let span = tracing::debug_span!(parent: &self.span, "call", request = id, activation = %f.activation, attempt = f.attempts);
        tokio::spawn(
            async move {
                let result = engine.submit(request).await;
                let _ = me.send_message(ReplicaMsg::Done { id, generation, result });
            }
            .instrument(span),
        );
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
        while self.restarts < self.retry.max_restarts {
            self.restarts += 1;
            tokio::time::sleep(self.retry.backoff_after(self.restarts)).await;
            tracing::warn!(restart = self.restarts, "engine unreachable: restarting the replica");
            let _ = engine.unload().await;
            match engine.load().await {
                Ok(()) => {
                    self.generation += 1;
                    let _ = self.planner.send_message(PlannerMsg::Restarted { replica: self.replica });
                    return true;
                }
                Err(e) => tracing::warn!(error = %e, "restart failed"),
            }
        }
        false
    }

    /// Give the replica up: the planner requeues its calls elsewhere.
    async fn lose(&mut self, myself: &ActorRef<ReplicaMsg>, reason: String) {
        tracing::error!(%reason, "replica lost");
        self.stop_telemetry();
        self.requests.clear();
        let _ = self.planner.send_message(PlannerMsg::ReplicaLost { replica: self.replica, reason: reason.clone() });
        let _ = self.engine().unload().await;
        myself.stop(Some(reason));
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
            span,
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

async fn handle(myself: ActorRef<ReplicaMsg>, msg: ReplicaMsg, state: &mut ReplicaState) {
    match msg {
        ReplicaMsg::Start(mut ticket) => {
            ticket.wait().await;
            let engine = state.engine();
            let mut result = if state.wake { engine.wake().await } else { engine.load().await };
            if let (true, Err(e)) = (state.wake, &result) {
                tracing::warn!(error = %e, "wake failed: loading instead");
            }
            // A start can fail for good (the server refuses the configuration) or because the
            // process died meanwhile; both are retried a bounded number of times.
            let mut retries = u32::from(state.wake && result.is_err());
            let mut attempts = 0;
            while result.is_err() && attempts < state.retry.max_restarts {
                attempts += 1;
                if let Err(e) = &result {
                    tracing::warn!(error = %e, attempt = attempts, "start failed: starting again");
                }
                tokio::time::sleep(state.retry.backoff_after(attempts)).await;
                let _ = engine.unload().await;
                result = engine.load().await;
                retries += 1;
            }
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
            let id = request.id;
            state.requests.insert(id, InFlight { activation, request, bad_answers: 0, attempts: 0 });
            state.launch(&myself, id);
        }
        ReplicaMsg::Retry { id } => state.launch(&myself, id),
        ReplicaMsg::Done { id, generation, result } => {
            let Some(f) = state.requests.get_mut(&id) else { return };
            match result {
                Ok(completion) => {
                    let attempts = f.attempts;
                    let activation = f.activation;
                    state.requests.remove(&id);
                    let _ = state.planner.send_message(PlannerMsg::Finished {
                        replica: state.replica,
                        activation,
                        completion,
                        attempts,
                    });
                }
                Err(EngineError::BadResponse(reason)) => {
                    f.bad_answers += 1;
                    let n = f.bad_answers;
                    if n >= state.retry.max_attempts {
                        let (activation, attempts) = (f.activation, f.attempts);
                        state.requests.remove(&id);
                        let reason = format!("the engine answered badly {n} times; last: {reason}");
                        tracing::warn!(%activation, %reason, "call failed");
                        let _ = state.planner.send_message(PlannerMsg::CallFailed { replica: state.replica, activation, reason, attempts });
                    } else {
                        let delay = state.retry.backoff_after(n);
                        tracing::debug!(request = id, attempt = n, ?delay, %reason, "bad answer: retrying");
                        myself.send_after(delay, move || ReplicaMsg::Retry { id });
                    }
                }
                Err(EngineError::Unreachable(reason)) => {
                    if generation < state.generation {
                        // Sent to an incarnation that has since been replaced: send it again.
                        state.launch(&myself, id);
                    } else if state.restart().await {
                        state.launch(&myself, id);
                    } else {
                        let reason = format!("engine unreachable ({reason}) and {} restart(s) did not bring it back", state.restarts);
                        state.lose(&myself, reason).await;
                    }
                }
                Err(e) => {
                    let (activation, attempts) = (f.activation, f.attempts);
                    state.requests.remove(&id);
                    let _ = state.planner.send_message(PlannerMsg::CallFailed {
                        replica: state.replica,
                        activation,
                        reason: e.to_string(),
                        attempts,
                    });
                }
            }
        }
        ReplicaMsg::Reclaim { sleep, mut ticket } => {
            state.stop_telemetry();
            ticket.wait().await;
            let engine = state.engine();
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
                let _ = state.planner.send_message(PlannerMsg::Parked { replica: state.replica, engine: state.handle.clone() });
            } else {
                if let Err(e) = engine.unload().await {
                    tracing::warn!(error = %e, "unload failed");
                }
                tracing::info!("reclaimed: unloaded");
                let _ = state.planner.send_message(PlannerMsg::Unloaded { replica: state.replica });
            }
            ticket.finish();
            if !state.requests.is_empty() {
                // The planner never reclaims a leased replica; if calls are here anyway, they
                // must not be lost.
                state.requests.clear();
                let _ = state.planner.send_message(PlannerMsg::ReplicaLost {
                    replica: state.replica,
                    reason: "reclaimed with calls in flight".into(),
                });
            }
            myself.stop(None);
        }
        ReplicaMsg::Stop(reply) => {
            state.stop_telemetry();
            if let Err(e) = state.engine().unload().await {
                tracing::warn!(error = %e, "unload at shutdown failed");
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
                Err(e) => tracing::debug!(error = %e, "telemetry unavailable"),
            }
        }
    }
}
