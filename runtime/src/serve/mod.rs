//! `switchyard serve`'s REST API over a [`Service`] (the live runtime, started once): register
//! and validate workflows, start runs (sessions of a workflow with inputs), read a run's status
//! and outputs, stream its events (SSE), cancel it. The API is described by the OpenAPI
//! document served at `/openapi.json` ([`OPENAPI`], kept true by a test that compares it with
//! the router).
//!
//! Security: every `/v1/*` route needs `Authorization: Bearer <token>` when the server has a
//! token (compared in constant time; 401 otherwise, with `WWW-Authenticate`); bodies over
//! [`ApiConfig::max_body_bytes`] get 413; malformed bodies 400, invalid workflows 422 with each
//! problem's file, line, column and field. A workflow registered over HTTP may not name a
//! dataset (a dataset is a path on the server's disk: a client could make the server read any
//! file); its sessions take their inputs from the request. Only `/health`, `/openapi.json` and
//! `/metrics` answer without a token.
//!
//! Errors have OpenAI's shape, `{"error": {"message", "type", "param", "code"}}` with the HTTP
//! status as `code`; a workflow's validation errors add `"errors": [{file, line, column, field,
//! kind, message}, …]`.
//!
//! The front door (OpenAI-compatible completions keyed by program) is [`front_door`]'s.
//!
//! Depends on `crate::live` (the service), the workflow loader, `crate::exec`'s trace lines and
//! the tools crate's names; must not depend on the simulator.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::Stream;
use serde::Deserialize;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::sync::broadcast::error::RecvError;

use crate::ids::SessionId;
use crate::live::actors::{DurableSession, off_the_reactor};
use crate::live::journal::{Journal, RunRecord, SessionOutcome};
use crate::live::{Service, ServiceError, SessionStatus};
use crate::values::Record;
use crate::workflow::{NodeKind, WorkflowError, parse_workflow};

mod front_door;
pub mod load;

/// The OpenAPI 3.1 document of this API (served at `/openapi.json`).
pub const OPENAPI: &str = include_str!("openapi.json");

/// Limits and credentials of the API.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// The bearer token every `/v1/*` request must carry (`None`: no authentication — the CLI
    /// allows that only on a loopback address).
    pub token: Option<String>,
    /// Largest request body (413 above it).
    pub max_body_bytes: usize,
    /// Most sessions one run may start.
    pub max_sessions_per_run: usize,
    /// Runs kept before the oldest runs whose sessions were all forgotten (past
    /// `--keep-ended`) are dropped from `/v1/runs` (`--keep-runs`).
    pub keep_runs: usize,
    /// Ended sessions a restart reads back from the journal at most, over the ended runs it
    /// restores (`--keep-ended`, the bound the runtime keeps on remembered outcomes): the newest
    /// ended runs are restored while their ended sessions fit, the older ones stay in the
    /// journal only. Runs with unfinished sessions are always restored.
    pub keep_ended: usize,
    /// Most workflows registered at once (`--max-workflows`): a new registration past it gets
    /// 429. A workflow is never unregistered, so without a bound a client could grow the
    /// server's memory (and, with `--state`, the journal a restart replays) without end.
    pub max_workflows: usize,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig { token: None, max_body_bytes: 4 << 20, max_sessions_per_run: 10_000, keep_runs: 1000, keep_ended: 100_000, max_workflows: 1000 }
    }
}

/// A registered workflow.
struct WorkflowEntry {
    index: u32,
    text: String,
    description: String,
    inputs: Vec<String>,
    nodes: Vec<String>,
    /// Registered at start with its dataset: sessions may be drawn from it.
    has_dataset: bool,
}

/// A run: sessions of one workflow started by one request.
///
/// A session's id as the API shows it (`s{n}`, in a run's status and as the `session` of its
/// events) is its *public number*: with `--state` its number in the journal — given once per
/// journal, never again, and the same after any number of restarts — else the runtime's own
/// session id (a server without a journal has no restarts to survive).
struct RunEntry {
    workflow: String,
    /// Its sessions running (or run) in this process: (public number, the runtime's id).
    sessions: Vec<(u64, SessionId)>,
    /// Its sessions that ended before this process started (a journal's).
    ended_before: Vec<EndedBefore>,
    /// When it was started, Unix seconds (with `--state`, the time its journal records).
    created_at: f64,
    cancelled: bool,
}

/// A session of a run that ended before this process started, as its journal recorded it.
#[derive(Clone)]
struct EndedBefore {
    /// Its public number ([`RunEntry`]).
    number: u64,
    /// Its outcome (the times in it mean nothing: `at` is its end).
    status: SessionStatus,
    /// When it ended, Unix seconds; `None` when the journal did not record it (a journal
    /// written by an earlier build).
    at: Option<f64>,
}

struct Api {
    service: Arc<Service>,
    config: ApiConfig,
    workflows: Mutex<BTreeMap<String, WorkflowEntry>>,
    runs: Mutex<BTreeMap<String, RunEntry>>,
    next_run: AtomicU64,
    /// When the runtime's clock ([`Service::wall`]) was 0, Unix milliseconds: the API gives every
    /// time as Unix seconds, so that a run's times read the same after a restart.
    clock_zero_unix_ms: f64,
    /// The run the last pruning pass looked at last ([`prune_forgotten_runs`]).
    prune_cursor: Mutex<Option<String>>,
    /// Sessions drawn from each start-up workflow's dataset so far (the next record to use).
    drawn: Mutex<BTreeMap<u32, usize>>,
    /// The journal of durable sessions (`--state`), and the next session number in it.
    journal: Option<Arc<Journal>>,
    next_number: AtomicU64,
    /// Held by a registration from its name check to its insert, so that two registrations of
    /// one name cannot both pass the check (the loser would be answered 201 and dropped).
    registering: tokio::sync::Mutex<()>,
}

impl Api {
    /// A time on the runtime's clock (seconds since it started) as Unix seconds, to the
    /// millisecond.
    fn unix_seconds(&self, wall: f64) -> f64 {
        (self.clock_zero_unix_ms + wall * 1000.0).round() / 1000.0
    }
}

/// The wall clock, Unix milliseconds.
fn unix_ms_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An API error: an HTTP status and OpenAI's error body.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    param: Option<String>,
    details: Option<Value>,
    /// Seconds for a `Retry-After` header (a refusal that a later retry may pass).
    retry_after_s: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, kind, message: message.into(), param: None, details: None, retry_after_s: None }
    }

    fn bad_request(message: impl Into<String>, param: &str) -> Self {
        ApiError { param: Some(param.to_string()), ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message) }
    }

    fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.status.as_u16(),
        }});
        if let (Some(d), Some(obj)) = (self.details, body.get_mut("error").and_then(Value::as_object_mut)) {
            obj.insert("errors".into(), d);
        }
        let mut resp = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        if let Some(s) = self.retry_after_s {
            resp.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(s));
        }
        resp
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::NotServed(m) => Self::new(StatusCode::UNPROCESSABLE_ENTITY, "not_served_error", m),
            ServiceError::BadRequest(m) => Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", m),
            ServiceError::Unavailable(m) => Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", m),
            ServiceError::NotFound(m) => Self::new(StatusCode::NOT_FOUND, "not_found_error", m),
            ServiceError::Conflict(m) => Self::new(StatusCode::CONFLICT, "conflict_error", m),
        }
    }
}

/// A JSON body, with axum's rejections turned into this API's 400 / 413 / 415.
struct JsonBody<T>(T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(JsonBody(v)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

/// A body axum could not read or parse: 413 over the size limit, 415 for a wrong content
/// type, 400 for anything malformed (axum says 422 for well-formed JSON of the wrong shape;
/// to a client both are a bad request).
fn rejection(status: StatusCode, text: String) -> ApiError {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(status, "request_too_large", text),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(status, "invalid_request_error", text),
        _ => ApiError::bad_request(text, "body"),
    }
}

fn json_rejection(r: JsonRejection) -> ApiError {
    rejection(r.status(), r.body_text())
}

/// The router of the API over `service`.
/// `startup` are the workflows the service started with: (index, spec, YAML text).
pub fn router(service: Arc<Service>, config: ApiConfig, startup: Vec<(u32, Arc<crate::workflow::WorkflowSpec>, String)>) -> Router {
    routes(api_state(service, config, startup, None))
}

/// [`router`] over a journal of durable sessions (`switchyard serve --state DIR`): every run
/// and session is journaled before it starts, and the runs the journal holds come back — their
/// workflows registered again, their ended sessions with their recorded outcomes, their
/// unfinished sessions resumed (completed activations replayed from the journal, never run
/// again; an activation in flight at the crash sent once more).
pub async fn durable_router(
    service: Arc<Service>,
    config: ApiConfig,
    startup: Vec<(u32, Arc<crate::workflow::WorkflowSpec>, String)>,
    journal: Arc<Journal>,
) -> Result<(Router, Restored), String> {
    service.set_program_journal(Arc::clone(&journal)).map_err(|e| e.to_string())?;
    let api = api_state(service, config, startup, Some(Arc::clone(&journal)));
    let restored = restore(&api, &journal).await?;
    Ok((routes(api), restored))
}

/// What a restart found in its journal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    /// Workflows registered over the API and registered again from the journal.
    pub workflows: usize,
    pub runs: usize,
    /// Of those, runs that had ended and were not read back: past [`ApiConfig::keep_runs`] such
    /// runs, or past [`ApiConfig::keep_ended`] of their ended sessions, the oldest stay in the
    /// journal only.
    pub runs_left_in_journal: usize,
    pub ended_sessions: usize,
    pub resumed_sessions: usize,
    /// Workflows registered over the API whose journaled text no longer loads on this server
    /// (say, its pool changed) and that no unfinished session needs: not registered, with why.
    pub workflows_skipped: Vec<String>,
}

fn api_state(
    service: Arc<Service>,
    config: ApiConfig,
    startup: Vec<(u32, Arc<crate::workflow::WorkflowSpec>, String)>,
    journal: Option<Arc<Journal>>,
) -> Arc<Api> {
    let mut workflows = BTreeMap::new();
    for (index, spec, text) in startup {
        workflows.insert(spec.name.clone(), entry(index, &spec, text));
    }
    let clock_zero_unix_ms = unix_ms_now() as f64 - service.wall() * 1000.0;
    Arc::new(Api {
        service,
        config,
        workflows: Mutex::new(workflows),
        runs: Mutex::new(BTreeMap::new()),
        next_run: AtomicU64::new(1),
        clock_zero_unix_ms,
        prune_cursor: Mutex::new(None),
        drawn: Mutex::new(BTreeMap::new()),
        journal,
        next_number: AtomicU64::new(1),
        registering: tokio::sync::Mutex::new(()),
    })
}

/// A session's end as the journal recorded it.
fn ended_before(end: crate::live::journal::SessionEnd) -> EndedBefore {
    let status = match end.outcome {
        SessionOutcome::Completed { output } => {
            SessionStatus::Completed { output: serde_json::from_value(output).ok(), score: None, finished_at: 0.0 }
        }
        SessionOutcome::Failed { reason } => SessionStatus::Failed { reason, at: 0.0 },
        SessionOutcome::Cancelled => SessionStatus::Failed { reason: "cancelled (before a restart)".into(), at: 0.0 },
    };
    EndedBefore { number: end.session, status, at: end.finished_at_unix_ms.map(|ms| ms as f64 / 1000.0) }
}

/// Rebuild the runs a journal holds and resume their unfinished sessions.
async fn restore(api: &Arc<Api>, journal: &Arc<Journal>) -> Result<Restored, String> {
    let j = |e: crate::live::journal::JournalError| format!("journal: {e}");
    let runs = journal.run_heads().map_err(j)?;
    let mut unfinished = journal.unfinished().map_err(j)?;
    let cancelled = journal.cancelled_runs().map_err(j)?;
    // A cancelled run's unfinished sessions (the server stopped before they ended) end as
    // cancelled now; they are never resumed.
    let (stopped, open_ones): (Vec<_>, Vec<_>) = unfinished.into_iter().partition(|u| cancelled.contains(&u.run_id));
    unfinished = open_ones;
    for u in &stopped {
        match journal.finish_session(u.session, &SessionOutcome::Cancelled) {
            Ok(()) | Err(crate::live::journal::JournalError::AlreadyFinished { .. }) => {}
            Err(e) => return Err(j(e)),
        }
    }
    let next = journal.last_session().map_err(j)?.map_or(1, |n| n + 1);
    api.next_number.store(next, Ordering::Relaxed);
    // Ended runs beyond `keep_runs`, or whose ended sessions would take the sessions read back
    // past `keep_ended`, oldest first, are left in the journal: a restart does not grow the
    // server's memory with every run (and every outcome) it ever served.
    let open: BTreeSet<&str> = unfinished.iter().map(|u| u.run_id.as_str()).collect();
    let ended_counts = journal.ended_counts_by_run().map_err(j)?;
    let mut ended: Vec<&str> = runs.iter().map(|r| r.run_id.as_str()).filter(|id| !open.contains(id)).collect();
    ended.sort_by(|a, b| run_order(b).cmp(&run_order(a)));
    let mut kept_sessions = 0usize;
    let mut kept_runs = 0usize;
    let mut left: BTreeSet<String> = BTreeSet::new();
    for id in ended {
        let n = ended_counts.get(id).copied().unwrap_or(0);
        if left.is_empty() && kept_runs < api.config.keep_runs && kept_sessions + n <= api.config.keep_ended {
            kept_runs += 1;
            kept_sessions += n;
        } else {
            left.insert(id.to_string());
        }
    }
    // Ended sessions of the runs read back, in one scan of the journal.
    let wanted: BTreeSet<String> = runs.iter().map(|r| r.run_id.clone()).filter(|id| !left.contains(id)).collect();
    let mut ended_by_run: BTreeMap<String, Vec<EndedBefore>> = journal
        .session_ends_of_runs(&wanted)
        .map_err(j)?
        .into_iter()
        .map(|(run, ends)| (run, ends.into_iter().map(ended_before).collect()))
        .collect();
    let mut restored = Restored { runs: runs.len(), ..Restored::default() };
    // Dataset draws go on where the journaled runs left them (a start-up workflow's index is
    // known before any run is restored; the others have no dataset).
    {
        let workflows = lock(&api.workflows);
        let mut drawn = lock(&api.drawn);
        for run in &runs {
            if let (Some(from), Some(w)) = (run.drawn_from, workflows.get(&run.workflow)) {
                let end = usize::try_from(from.saturating_add(u64::from(run.sessions))).unwrap_or(usize::MAX);
                let next = drawn.entry(w.index).or_insert(0);
                *next = (*next).max(end);
            }
        }
    }
    // Workflows registered over the API, whether or not a run used them.
    for (name, text) in journal.workflows().map_err(j)? {
        // A name the server was started with keeps its start-up file (as for runs).
        if lock(&api.workflows).contains_key(&name) {
            continue;
        }
        // One that no longer loads is skipped (a run that needs it fails the start below).
        let spec = match parse_workflow(&name, &text, std::path::Path::new("/nonexistent")) {
            Ok(spec) => spec,
            Err(e) => {
                restored.workflows_skipped.push(format!("`{name}`: its journaled text no longer loads: {e}"));
                continue;
            }
        };
        let e_inputs = entry(0, &spec, String::new());
        match api.service.register(spec).await {
            Ok(index) => {
                lock(&api.workflows).insert(name, WorkflowEntry { index, text, ..e_inputs });
                restored.workflows += 1;
            }
            Err(e) => restored.workflows_skipped.push(format!("`{name}`: {e}")),
        }
    }
    restored.runs_left_in_journal = left.len();
    let mut max_run = 0;
    // First every run with unfinished sessions gets its workflow — registered at start under
    // that name, else registered again from the journaled text — and only when all have one
    // does any session resume: a start that fails on a later run must not have resumed an
    // earlier one (each resume journals another attempt of the calls it sends). An ended run
    // needs no workflow: it shows its recorded outcomes.
    let mut index_of: BTreeMap<&str, u32> = BTreeMap::new();
    for run in runs.iter().filter(|r| open.contains(r.run_id.as_str())) {
        let known = lock(&api.workflows).get(&run.workflow).map(|w| w.index);
        let index = match known {
            Some(i) => i,
            None => {
                let text = journal
                    .run(&run.run_id)
                    .map_err(j)?
                    .map(|r| r.workflow_yaml)
                    .ok_or_else(|| format!("run {}: its record went missing from the journal", run.run_id))?;
                let spec = parse_workflow(&run.workflow, &text, std::path::Path::new("/nonexistent"))
                    .map_err(|e| format!("run {}: its journaled workflow no longer loads: {e}", run.run_id))?;
                let e_inputs = entry(0, &spec, String::new());
                let index = api.service.register(spec).await.map_err(|e| format!("run {}: {e}", run.run_id))?;
                lock(&api.workflows).insert(run.workflow.clone(), WorkflowEntry { index, text, ..e_inputs });
                index
            }
        };
        index_of.insert(run.run_id.as_str(), index);
    }
    for run in &runs {
        if let Some(n) = run.run_id.strip_prefix("run-").and_then(|n| n.parse::<u64>().ok()) {
            max_run = max_run.max(n);
        }
        if left.contains(&run.run_id) {
            continue;
        }
        let index = index_of.get(run.run_id.as_str()).copied();
        let ended_before = ended_by_run.remove(&run.run_id).unwrap_or_default();
        let mut resume = Vec::new();
        let mut numbers = Vec::new();
        for u in unfinished.iter().filter(|u| u.run_id == run.run_id) {
            let input: Record = match &u.inputs {
                Value::Object(m) => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                _ => Record::new(),
            };
            let replay = u.completed.iter().map(|c| (c.key.clone(), c.result.clone())).collect();
            resume.push((input, Some(DurableSession { journal: Arc::clone(journal), number: u.session, replay, route: None })));
            numbers.push(u.session);
        }
        restored.ended_sessions += ended_before.len();
        restored.resumed_sessions += resume.len();
        // A resumed session keeps its journal number: the id its client was given.
        let sessions = match (index, resume.is_empty()) {
            (Some(index), false) => {
                let ids = api.service.submit_durable(index, resume).await.map_err(|e| e.to_string())?;
                numbers.into_iter().zip(ids).collect()
            }
            _ => Vec::new(),
        };
        // As the run's client was told: the journaled time, in Unix seconds.
        let created_at = run.created_at_unix_ms as f64 / 1000.0;
        lock(&api.runs).insert(
            run.run_id.clone(),
            RunEntry { workflow: run.workflow.clone(), sessions, ended_before, created_at, cancelled: cancelled.contains(&run.run_id) },
        );
    }
    api.next_run.store(max_run + 1, Ordering::Relaxed);
    Ok(restored)
}

fn routes(api: Arc<Api>) -> Router {
    let limit = api.config.max_body_bytes;
    let v1 = Router::new()
        .route("/v1/workflows", get(list_workflows).post(register_workflow))
        .route("/v1/workflows/{name}", get(get_workflow))
        .route("/v1/runs", get(list_runs).post(start_run))
        .route("/v1/runs/{id}", get(get_run))
        .route("/v1/runs/{id}/events", get(run_events))
        .route("/v1/runs/{id}/cancel", post(cancel_run))
        .route("/v1/chat/completions", post(front_door::chat_completions))
        .route("/v1/completions", post(front_door::completions))
        .route("/v1/models", get(front_door::models))
        .route("/v1/programs/{key}/verdict", post(front_door::program_verdict))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&api), authenticate));
    Router::new()
        .route("/health", get(health))
        .route("/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .merge(v1)
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", "method not allowed on this route")
        })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(api)
}

/// Serve `app` on `listener` until `shutdown` completes (then finish the requests in flight).
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Streams are many small writes: without TCP_NODELAY, Nagle's algorithm holds each one
    // until the client's delayed ACK (~40 ms per call, measured by `bench front-door`).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
        }
    });
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

fn entry(index: u32, spec: &crate::workflow::WorkflowSpec, text: String) -> WorkflowEntry {
    WorkflowEntry {
        index,
        text,
        description: spec.description.clone().unwrap_or_default(),
        inputs: spec.input_fields(),
        nodes: spec.nodes.iter().map(|n| n.id.clone()).collect(),
        has_dataset: spec.dataset.is_some(),
    }
}

/// The runtime's own metrics, Prometheus text format (no token: like vLLM's `/metrics`, it
/// says how busy the pool is, nothing about what it computes).
async fn metrics(State(api): State<Arc<Api>>) -> Response {
    let text = api.service.metrics().encode();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// `GET /health`: 200 `{"status": "ok"}` while the server takes work, 503
/// `{"status": "shutting_down"}` once it began to stop (as every call that would start work is
/// then refused with 503), so that a load balancer stops sending it requests.
async fn health(State(api): State<Arc<Api>>) -> Response {
    if api.service.is_stopping() {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "shutting_down"}))).into_response();
    }
    Json(json!({"status": "ok"})).into_response()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// Bearer-token check of every `/v1/*` request.
/// The credentials of an `Authorization: Bearer …` value; the scheme is case-insensitive (RFC
/// 7235 §2.1).
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, credentials) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| credentials.trim())
}

/// Whether `host` (a `Host` header's value, or an origin's host with its port) names this
/// machine's loopback interface: `localhost`, `127.0.0.0/8` or `[::1]`, with any port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or("", |(inside, _)| inside),
        None => host.rsplit_once(':').map_or(host, |(name, port)| if port.bytes().all(|b| b.is_ascii_digit()) { name } else { host }),
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Without a token (`--no-auth`, loopback only) a web page the user visits could still reach the
/// server: by a cross-site request (the browser sends its `Origin`) or by DNS rebinding (the
/// page's own name resolves to 127.0.0.1, and the browser sends that name as `Host`). So a
/// token-less server answers only requests whose `Host` is a loopback name and whose `Origin`,
/// if any, is one too; the reason when it refuses.
/// `authority` is the request URI's (HTTP/2 carries the host there, not in `Host`).
fn foreign_browser_request(headers: &HeaderMap, authority: Option<&str>) -> Option<&'static str> {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).or(authority);
    if !host.is_some_and(is_loopback_host) {
        return Some("without a token this server answers only requests to a loopback host (`Host: 127.0.0.1:PORT` or `localhost:PORT`)");
    }
    let origin = headers.get(header::ORIGIN).map(|v| v.to_str().unwrap_or(""));
    let origin_is_local = |o: &str| {
        o.split_once("://").is_some_and(|(scheme, rest)| {
            matches!(scheme, "http" | "https") && is_loopback_host(rest.split('/').next().unwrap_or(""))
        })
    };
    if origin.is_some_and(|o| !origin_is_local(o)) {
        return Some("without a token this server refuses cross-origin requests from web pages");
    }
    None
}

async fn authenticate(State(api): State<Arc<Api>>, headers: HeaderMap, req: Request, next: Next) -> Response {
    if api.config.token.is_none()
        && let Some(why) = foreign_browser_request(&headers, req.uri().authority().map(|a| a.as_str()))
    {
        return ApiError::new(StatusCode::FORBIDDEN, "authentication_error", why).into_response();
    }
    if let Some(token) = &api.config.token {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_credentials);
        let ok = match given {
            // Lengths may differ; `ct_eq` on slices of different lengths is false in constant
            // time for the given length, which leaks only the length, not the token.
            Some(g) => bool::from(g.as_bytes().ct_eq(token.as_bytes())),
            None => false,
        };
        if !ok {
            let msg = if given.is_none() { "missing bearer token" } else { "invalid bearer token" };
            return ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", msg).into_response();
        }
    }
    next.run(req).await
}

fn workflow_json(name: &str, w: &WorkflowEntry) -> Value {
    json!({
        "name": name,
        "index": w.index,
        "description": w.description,
        "inputs": w.inputs,
        "nodes": w.nodes,
        "dataset": w.has_dataset,
    })
}

async fn list_workflows(State(api): State<Arc<Api>>) -> Json<Value> {
    let wfs = lock(&api.workflows);
    Json(json!({ "workflows": wfs.iter().map(|(n, w)| workflow_json(n, w)).collect::<Vec<_>>() }))
}

async fn get_workflow(State(api): State<Arc<Api>>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let wfs = lock(&api.workflows);
    let w = wfs.get(&name).ok_or_else(|| ApiError::not_found(format!("no workflow named `{name}`")))?;
    let mut v = workflow_json(&name, w);
    if let Some(o) = v.as_object_mut() {
        o.insert("yaml".into(), Value::String(w.text.clone()));
    }
    Ok(Json(v))
}

/// The body of `POST /v1/workflows`: the YAML text itself (any text content type), or JSON
/// `{"yaml": "...", "validate_only": bool}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisterBody {
    yaml: String,
    #[serde(default)]
    validate_only: bool,
}

async fn register_workflow(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|r| rejection(r.status(), r.body_text()))?;
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/json"));
    let (text, validate_only) = if is_json {
        let b: RegisterBody = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("the body is not a registration: {e}"), "body"))?;
        (b.yaml, b.validate_only)
    } else {
        let t = String::from_utf8(body.to_vec()).map_err(|_| ApiError::bad_request("the body is not UTF-8 text", "body"))?;
        (t, false)
    };
    // Refused before the workflow is parsed: parsing looks for the dataset file, and whether it
    // exists on the server's disk is not the client's to learn.
    if crate::workflow::names_dataset(&text) {
        return Err(ApiError {
            param: Some("dataset".into()),
            ..ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_workflow",
                "a workflow registered over the API may not name a dataset (it is a path on the server's disk); \
                 pass each session's inputs when starting a run, or start the server with the workflow file",
            )
        });
    }
    // For the same reason a `shell` step may not declare host paths to read: the server's files
    // are not the client's (the sandbox binds each declared path read-only, and its uid can read
    // whatever on the host is world-readable). Refused before parsing too, which looks each path
    // up on disk; checked again on the parsed steps.
    let refuse_reads = |node: &str| ApiError {
        param: Some(format!("nodes.{node}.inputs.reads")),
        ..ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_workflow",
            format!(
                "a workflow registered over the API may not let `shell` read host paths (`{node}` declares `reads`: \
                 paths on the server's disk); start the server with the workflow file to grant them"
            ),
        )
    };
    if let Some(node) = crate::workflow::names_shell_reads(&text) {
        return Err(refuse_reads(&node));
    }
    let spec = parse_workflow("request", &text, std::path::Path::new("/nonexistent")).map_err(workflow_errors)?;
    let shell_reads = spec.nodes.iter().find(|n| {
        matches!(&n.kind, NodeKind::Tool(t) if t.tool == switchyard_tools::shell::NAME && t.inputs.contains_key("reads"))
    });
    if let Some(node) = shell_reads {
        return Err(refuse_reads(&node.id));
    }
    let name = spec.name.clone();
    if name.len() > crate::live::journal::MAX_KEY_LEN {
        return Err(ApiError {
            param: Some("name".into()),
            ..ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_workflow",
                format!("a workflow name may be at most {} bytes", crate::live::journal::MAX_KEY_LEN),
            )
        });
    }
    // With `--state`, a registration is journaled so that a restart registers it again
    // (idempotent: an identical registration journals nothing new).
    let journal_it = |name: &str, text: &str| -> Result<(), ApiError> {
        let Some(journal) = (!validate_only).then_some(api.journal.as_ref()).flatten() else { return Ok(()) };
        let j = Arc::clone(journal);
        off_the_reactor(|| j.record_workflow(name, text))
            .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "journal_error", e.to_string()))
    };
    let _registering = api.registering.lock().await;
    {
        let existing = lock(&api.workflows).get(&name).map(|e| (e.text == text, workflow_json(&name, e)));
        if let Some((same, json)) = existing {
            if same {
                journal_it(&name, &text)?;
                return Ok((StatusCode::OK, Json(json)).into_response());
            }
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict_error",
                format!("a different workflow named `{name}` is already registered"),
            ));
        }
    }
    let registered = lock(&api.workflows).len();
    if !validate_only && registered >= api.config.max_workflows {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "{registered} workflows are registered, this server's limit (`--max-workflows`); \
                 a workflow is never unregistered: reuse a registered one, or restart the server with a higher limit"
            ),
        ));
    }
    if validate_only {
        let e = entry(u32::MAX, &spec, text);
        let mut v = workflow_json(&name, &e);
        if let Some(o) = v.as_object_mut() {
            o.remove("index");
            o.insert("valid".into(), Value::Bool(true));
        }
        return Ok((StatusCode::OK, Json(v)).into_response());
    }
    // A journaled workflow of this name that a restart skipped (its text no longer loads) keeps
    // its name: refused before the planner registers anything, so a refusal leaves no trace.
    if let Some(journal) = &api.journal {
        let j = Arc::clone(journal);
        let recorded = off_the_reactor(|| j.workflow(&name))
            .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "journal_error", e.to_string()))?;
        if recorded.is_some_and(|t| t != text) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict_error",
                format!("a different workflow named `{name}` is recorded in this server's journal (from before a restart)"),
            ));
        }
    }
    let e_inputs = entry(0, &spec, String::new());
    let index = api.service.register(spec).await?;
    journal_it(&name, &text)?;
    let e = WorkflowEntry { index, text, ..e_inputs };
    let v = workflow_json(&name, &e);
    lock(&api.workflows).insert(name, e);
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

/// A workflow's validation errors as a 422 with each problem's position and field.
fn workflow_errors(e: WorkflowError) -> ApiError {
    let details: Vec<Value> = e
        .all()
        .into_iter()
        .map(|p| match p {
            WorkflowError::Invalid { file, line, column, field, kind, message } => json!({
                "file": file, "line": line, "column": column, "field": field,
                "kind": kind.to_string(), "message": message,
            }),
            other => json!({ "message": other.to_string() }),
        })
        .collect();
    ApiError {
        param: e.field().map(str::to_string),
        details: Some(Value::Array(details)),
        ..ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_workflow", e.to_string())
    }
}

/// The body of `POST /v1/runs`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunBody {
    workflow: String,
    /// One session per input object.
    #[serde(default)]
    inputs: Option<Vec<Record>>,
    /// Or this many sessions drawn from the workflow's dataset (start-up workflows only).
    #[serde(default)]
    sessions: Option<usize>,
}

async fn start_run(State(api): State<Arc<Api>>, JsonBody(body): JsonBody<RunBody>) -> Result<Response, ApiError> {
    let (index, needed, has_dataset) = {
        let wfs = lock(&api.workflows);
        let w = wfs
            .get(&body.workflow)
            .ok_or_else(|| ApiError { param: Some("workflow".into()), ..ApiError::not_found(format!("no workflow named `{}`", body.workflow)) })?;
        (w.index, w.inputs.clone(), w.has_dataset)
    };
    let max = api.config.max_sessions_per_run;
    // Where a dataset draw started (journaled with the run, so a restart draws on from there).
    let mut drawn_from: Option<u64> = None;
    let inputs: Vec<Record> = match (body.inputs, body.sessions) {
        (Some(_), Some(_)) => return Err(ApiError::bad_request("give `inputs` or `sessions`, not both", "sessions")),
        (Some(inputs), None) => {
            if inputs.is_empty() || inputs.len() > max {
                return Err(ApiError::bad_request(format!("`inputs` must hold 1 to {max} objects"), "inputs"));
            }
            for (i, rec) in inputs.iter().enumerate() {
                if let Some(missing) = needed.iter().find(|f| !rec.contains_key(*f)) {
                    return Err(ApiError::bad_request(
                        format!("inputs[{i}] lacks `{missing}` (the workflow reads: {})", needed.join(", ")),
                        &format!("inputs[{i}].{missing}"),
                    ));
                }
            }
            inputs
        }
        (None, n) => {
            let n = n.unwrap_or(1);
            if n == 0 || n > max {
                return Err(ApiError::bad_request(format!("`sessions` must be 1 to {max}"), "sessions"));
            }
            // A workflow that reads no input runs on empty records (as `run` does without a
            // dataset); one that does needs its start-up dataset.
            let data = if has_dataset { api.service.dataset(index) } else { None }
                .or_else(|| needed.is_empty().then(|| Arc::new(vec![Record::new()])));
            let Some(data) = data.filter(|d| !d.is_empty()) else {
                return Err(ApiError::bad_request(
                    format!("workflow `{}` has no dataset here: pass `inputs` (it reads: {})", body.workflow, needed.join(", ")),
                    "inputs",
                ));
            };
            let mut drawn = lock(&api.drawn);
            let next = drawn.entry(index).or_insert(0);
            // Saturating: a cursor restored from a damaged journal cannot overflow here.
            let start = *next % data.len();
            let out = (0..n).map(|k| data[(start + k) % data.len()].clone()).collect();
            drawn_from = Some(*next as u64);
            *next = next.saturating_add(n);
            out
        }
    };
    let id = format!("run-{}", api.next_run.fetch_add(1, Ordering::Relaxed));
    // One time for the answer, the status and the journal: the same before and after a restart.
    let created_at_unix_ms = unix_ms_now();
    let sessions: Vec<(u64, SessionId)> = match &api.journal {
        None => api.service.submit(index, inputs).await?.into_iter().map(|s| (u64::from(s.0), s)).collect(),
        Some(journal) => {
            // Journaled before anything starts: a crash from here on resumes the run.
            let text = lock(&api.workflows).get(&body.workflow).map(|w| w.text.clone()).unwrap_or_default();
            let unavailable = |e: crate::live::journal::JournalError| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "journal_error", e.to_string());
            let record = RunRecord {
                run_id: id.clone(),
                workflow: body.workflow.clone(),
                workflow_yaml: text,
                sessions: u32::try_from(inputs.len()).unwrap_or(u32::MAX),
                created_at_unix_ms,
                drawn_from,
            };
            let j = Arc::clone(journal);
            // The run and all its sessions in one transaction (one fsync): a crash leaves the
            // whole run or none of it, never part of a run its client was not told about.
            let numbers: Vec<u64> = inputs.iter().map(|_| api.next_number.fetch_add(1, Ordering::Relaxed)).collect();
            let rows: Vec<(u64, Value)> = numbers
                .iter()
                .zip(&inputs)
                .map(|(&n, input)| (n, Value::Object(input.iter().map(|(k, v)| (k.clone(), v.clone())).collect())))
                .collect();
            off_the_reactor(|| j.record_run_with_sessions(&record, rows)).map_err(unavailable)?;
            // A run the client is told failed must not resume at the next start: its sessions
            // are finished as failed when they cannot start.
            let never_started = |numbers: &[u64], why: &str| {
                let outcome = SessionOutcome::Failed { reason: format!("not started: {why}") };
                for &n in numbers {
                    if let Err(e) = off_the_reactor(|| j.finish_session(n, &outcome)) {
                        tracing::warn!(session = n, error = %e, "cannot record a session that never started");
                    }
                }
            };
            let durable: Vec<_> = inputs
                .into_iter()
                .zip(&numbers)
                .map(|(input, &number)| (input, Some(DurableSession { journal: Arc::clone(&j), number, replay: BTreeMap::new(), route: None })))
                .collect();
            match api.service.submit_durable(index, durable).await {
                // Each session's id is its journal number, which no other session of this
                // journal has, before or after a restart.
                Ok(sessions) => numbers.iter().copied().zip(sessions).collect(),
                Err(e) => {
                    let e = ApiError::from(e);
                    never_started(&numbers, &e.message);
                    return Err(e);
                }
            }
        }
    };
    let created_at = created_at_unix_ms as f64 / 1000.0;
    let v = json!({
        "id": id,
        "workflow": body.workflow,
        "sessions": sessions.iter().map(|(n, _)| public_id(*n)).collect::<Vec<_>>(),
        "created_at": created_at,
    });
    lock(&api.runs).insert(id, RunEntry { workflow: body.workflow, sessions, ended_before: Vec::new(), created_at, cancelled: false });
    prune_forgotten_runs(&api).await;
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

/// A failure's reason as an API client sees it (the front door's answers, a run's sessions and
/// its event stream): the pool's engine addresses (`request 12 to
/// http://10.0.0.7:8000/v1/chat/completions: …`) are the operator's, not the client's, so every
/// URL in it reads `<engine>`. The whole reason stays in the server's log.
pub(crate) fn public_reason(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len());
    let mut rest = reason;
    while let Some(at) = rest.find("http://").into_iter().chain(rest.find("https://")).min() {
        out.push_str(&rest[..at]);
        out.push_str("<engine>");
        let tail = &rest[at..];
        let end = tail.find(|c: char| c.is_whitespace() || c == ',' || c == ')' || c == '"' || c == '\'').unwrap_or(tail.len());
        // A trailing `:` ends the URL's sentence (`…/completions: the stream …`), not the URL.
        let end = if tail[..end].ends_with(':') { end - 1 } else { end };
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// A session's id as the API shows it, from its public number ([`RunEntry`]).
fn public_id(number: u64) -> String {
    format!("s{number}")
}

/// The public number of an id [`public_id`] wrote.
fn public_number(id: &str) -> Option<u64> {
    id.strip_prefix('s').and_then(|n| n.parse().ok())
}

/// A session's status as the API shows it; `at` is when it ended (Unix seconds: `finished_at`
/// or `failed_at`, `null` when unknown), the time in `s` is not read.
fn session_json(number: u64, s: &SessionStatus, at: Option<f64>) -> Value {
    let id = public_id(number);
    match s {
        SessionStatus::Unknown => json!({"id": id, "state": "unknown"}),
        SessionStatus::Running => json!({"id": id, "state": "running"}),
        SessionStatus::Completed { output, score, .. } => json!({
            "id": id, "state": "completed", "finished_at": at,
            "score": score, "output": output,
        }),
        SessionStatus::Failed { reason, .. } => json!({
            "id": id, "state": "failed", "failed_at": at, "reason": public_reason(reason),
        }),
        SessionStatus::Interrupted { reason, .. } => json!({
            "id": id, "state": "interrupted", "interrupted_at": at, "reason": public_reason(reason),
        }),
    }
}

/// When a session the runtime knows ended, on the runtime's clock.
fn ended_at(s: &SessionStatus) -> Option<f64> {
    match s {
        SessionStatus::Completed { finished_at, .. } => Some(*finished_at),
        SessionStatus::Failed { at, .. } | SessionStatus::Interrupted { at, .. } => Some(*at),
        SessionStatus::Unknown | SessionStatus::Running => None,
    }
}

/// `running` while any session runs; else `completed` when all completed, `cancelled` after a
/// cancel, `interrupted` when the server's stop ended some (with `--state` they resume at the
/// next start), `failed` when one failed, and `ended` when the rest completed but the outcome
/// of some was forgotten (a session of a run that the runtime no longer knows has ended: past
/// `--keep-ended` it reads `unknown`).
fn run_state(statuses: &[SessionStatus], cancelled: bool) -> &'static str {
    if statuses.iter().any(|s| matches!(s, SessionStatus::Running)) {
        "running"
    } else if statuses.iter().all(|s| matches!(s, SessionStatus::Completed { .. })) {
        "completed"
    } else if cancelled {
        "cancelled"
    } else if statuses.iter().any(|s| matches!(s, SessionStatus::Interrupted { .. })) {
        "interrupted"
    } else if statuses.iter().any(|s| matches!(s, SessionStatus::Failed { .. })) {
        "failed"
    } else {
        "ended"
    }
}

async fn run_json(api: &Api, id: &str) -> Result<Value, ApiError> {
    let (workflow, sessions, ended_before, created_at, cancelled) = {
        let runs = lock(&api.runs);
        let r = runs.get(id).ok_or_else(|| ApiError::not_found(format!("no run `{id}`")))?;
        (r.workflow.clone(), r.sessions.clone(), r.ended_before.clone(), r.created_at, r.cancelled)
    };
    let live = api.service.status(sessions.iter().map(|(_, s)| *s).collect()).await?;
    let mut statuses = live.clone();
    statuses.extend(ended_before.iter().map(|e| e.status.clone()));
    let mut listed: Vec<Value> =
        sessions.iter().zip(&live).map(|((n, _), s)| session_json(*n, s, ended_at(s).map(|t| api.unix_seconds(t)))).collect();
    listed.extend(ended_before.iter().map(|e| session_json(e.number, &e.status, e.at)));
    let count = |f: fn(&SessionStatus) -> bool| statuses.iter().filter(|s| f(s)).count();
    Ok(json!({
        "id": id,
        "workflow": workflow,
        "state": run_state(&statuses, cancelled),
        "created_at": created_at,
        "counts": {
            "sessions": statuses.len(),
            "running": count(|s| matches!(s, SessionStatus::Running)),
            "completed": count(|s| matches!(s, SessionStatus::Completed { .. })),
            "failed": count(|s| matches!(s, SessionStatus::Failed { .. })),
            "interrupted": count(|s| matches!(s, SessionStatus::Interrupted { .. })),
            "unknown": count(|s| matches!(s, SessionStatus::Unknown)),
        },
        "sessions": listed,
    }))
}

async fn get_run(State(api): State<Arc<Api>>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(run_json(&api, &id).await?))
}

/// Runs a `GET /v1/runs` page holds by default, and at most.
const RUNS_PAGE: usize = 100;
const RUNS_PAGE_MAX: usize = 1000;

/// The order of run ids: `run-N` by N (then any other id by its text).
fn run_order(id: &str) -> (u64, &str) {
    (id.strip_prefix("run-").and_then(|n| n.parse().ok()).unwrap_or(u64::MAX), id)
}

/// `GET /v1/runs[?limit=N&after=ID]`: the runs this server knows, oldest first, a page at a
/// time (`limit` 1–1000, default 100); `next` is the `after` of the next page, `null` on the
/// last one. `after` must be a run id (`run-N`; the run itself may be gone), else 400: a
/// malformed cursor is the client's error, not an empty page.
async fn list_runs(State(api): State<Arc<Api>>, axum::extract::Query(query): axum::extract::Query<BTreeMap<String, String>>) -> Result<Json<Value>, ApiError> {
    let limit = match query.get("limit") {
        None => RUNS_PAGE,
        Some(l) => l.parse::<usize>().ok().filter(|n| (1..=RUNS_PAGE_MAX).contains(n)).ok_or_else(|| {
            ApiError::bad_request(format!("`limit` must be an integer from 1 to {RUNS_PAGE_MAX}"), "limit")
        })?,
    };
    let after = query.get("after");
    if let Some(a) = after
        && a.strip_prefix("run-").and_then(|n| n.parse::<u64>().ok()).is_none()
    {
        return Err(ApiError::bad_request(format!("`after` must be a run id (`run-N`, a page's `next`), not `{a}`"), "after"));
    }
    let runs = lock(&api.runs);
    let mut ids: Vec<&String> = runs.keys().filter(|id| after.is_none_or(|a| run_order(id) > run_order(a))).collect();
    ids.sort_by(|a, b| run_order(a).cmp(&run_order(b)));
    let more = ids.len() > limit;
    ids.truncate(limit);
    let list: Vec<Value> = ids
        .iter()
        .filter_map(|id| runs.get(*id).map(|r| (id, r)))
        .map(|(id, r)| json!({"id": id, "workflow": r.workflow, "sessions": r.sessions.len() + r.ended_before.len(), "created_at": r.created_at}))
        .collect();
    let next = if more { ids.last().map(|id| json!(id)) } else { None };
    Ok(Json(json!({ "runs": list, "next": next.unwrap_or(Value::Null) })))
}

/// Oldest runs examined per pruning pass.
const RUNS_PRUNED_PER_PASS: usize = 16;

/// Past [`ApiConfig::keep_runs`] runs, starting one forgets the oldest runs that have nothing
/// left to tell: every session of theirs ended and was forgotten past `--keep-ended` (each
/// reads `unknown`). This bounds the runs' memory by the sessions the runtime remembers; a run
/// still running, or with a session whose outcome is known, is kept.
async fn prune_forgotten_runs(api: &Api) {
    // Each pass looks at the next few candidates after where the last one stopped (wrapping
    // around), so runs that cannot go — still running, restored from the journal with known
    // outcomes, a session whose outcome is remembered — never block the ones behind them.
    let candidates: Vec<(String, Vec<SessionId>)> = {
        let runs = lock(&api.runs);
        if runs.len() <= api.config.keep_runs {
            return;
        }
        let mut ids: Vec<&String> = runs.iter().filter(|(_, r)| r.ended_before.is_empty()).map(|(id, _)| id).collect();
        ids.sort_by(|a, b| run_order(a).cmp(&run_order(b)));
        let cursor = lock(&api.prune_cursor).clone();
        let start = cursor.as_deref().map_or(0, |c| ids.partition_point(|id| run_order(id) <= run_order(c)));
        let picked: Vec<(String, Vec<SessionId>)> = ids
            .iter()
            .cycle()
            .skip(start)
            .take(RUNS_PRUNED_PER_PASS.min(ids.len()))
            .filter_map(|id| runs.get(*id).map(|r| ((*id).clone(), r.sessions.iter().map(|(_, s)| *s).collect())))
            .collect();
        *lock(&api.prune_cursor) = picked.last().map(|(id, _)| id.clone());
        picked
    };
    for (id, sessions) in candidates {
        let Ok(statuses) = api.service.status(sessions).await else { return };
        if statuses.iter().all(|s| matches!(s, SessionStatus::Unknown)) {
            let mut runs = lock(&api.runs);
            runs.remove(&id);
            if runs.len() <= api.config.keep_runs {
                return;
            }
        }
    }
}

/// `POST /v1/runs/{id}/cancel`: 202 while the run has a session running (its open sessions
/// fail as cancelled); 409 naming its state once it ended, and nothing changes (a completed or
/// failed run stays so; a run that ends between this check and the cancel may still read
/// `cancelled` if one of its sessions failed).
async fn cancel_run(State(api): State<Arc<Api>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let status = run_json(&api, &id).await?;
    let state = status.get("state").and_then(Value::as_str).unwrap_or("unknown");
    if state != "running" {
        return Err(ApiError {
            param: Some("id".into()),
            ..ApiError::new(
                StatusCode::CONFLICT,
                "conflict_error",
                format!("run `{id}` has already ended ({state}): there is nothing to cancel"),
            )
        });
    }
    // Journaled before the sessions are told: a crash after the 202 does not resume them.
    if let Some(journal) = &api.journal {
        let (j, run) = (Arc::clone(journal), id.clone());
        off_the_reactor(|| j.cancel_run(&run))
            .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "journal_error", e.to_string()))?;
    }
    let sessions = {
        let mut runs = lock(&api.runs);
        let r = runs.get_mut(&id).ok_or_else(|| ApiError::not_found(format!("no run `{id}`")))?;
        r.cancelled = true;
        r.sessions.iter().map(|(_, s)| *s).collect()
    };
    api.service.cancel(sessions, format!("cancelled by a client (run {id})"))?;
    Ok((StatusCode::ACCEPTED, Json(json!({"id": id, "cancelling": true}))).into_response())
}

/// `GET /v1/runs/{id}/events`: the run's events as server-sent events, one per line of the
/// live trace (`event:` the trace event's name, `data:` the line as JSON): its sessions'
/// events and the pool's lifecycle events (loads, sleeps, unloads). Ends with a `run_end`
/// event carrying the run's status once every session ended.
async fn run_events(
    State(api): State<Arc<Api>>,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    // Subscribe before reading the status: an end between the two is then seen twice, never
    // missed.
    let rx = api.service.subscribe();
    let first = run_json(&api, &id).await?;
    // The runtime's ids of its sessions running here, to their public numbers (what the
    // events' `session` fields name), and the public numbers of all its sessions.
    let (live, all): (BTreeMap<u32, u64>, BTreeSet<u64>) = lock(&api.runs)
        .get(&id)
        .map(|r| {
            let live = r.sessions.iter().map(|(n, s)| (s.0, *n)).collect();
            let all = r.sessions.iter().map(|(n, _)| *n).chain(r.ended_before.iter().map(|e| e.number)).collect();
            (live, all)
        })
        .unwrap_or_default();
    let interrupted = first.pointer("/counts/interrupted").and_then(Value::as_u64).is_some_and(|n| n > 0);
    let ended = ended_set(first);
    Ok(Sse::new(stream_from(rx, api, id, live, all, (ended, interrupted))).keep_alive(KeepAlive::default()))
}

/// The public numbers of the sessions a run status (`run_json`) shows as ended.
fn ended_set(first: Value) -> BTreeSet<u64> {
    first
        .get("sessions")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                // A run's `unknown` session has ended: its outcome was forgotten.
                .filter(|s| {
                    s.get("state").and_then(Value::as_str).is_some_and(|st| matches!(st, "completed" | "failed" | "interrupted" | "unknown"))
                })
                .filter_map(|s| s.get("id").and_then(Value::as_str).and_then(public_number))
                .collect()
        })
        .unwrap_or_default()
}

/// The run's event stream: the trace lines of its sessions running here (`live`: the runtime's
/// id → public number, which the line's `session` is rewritten to) and of the pool, until every
/// session of `sessions` (public numbers) has ended — those the status read first showed ended,
/// and whether one of them was interrupted, are given.
fn stream_from(
    rx: tokio::sync::broadcast::Receiver<crate::exec::TraceLine>,
    api: Arc<Api>,
    id: String,
    live: BTreeMap<u32, u64>,
    sessions: BTreeSet<u64>,
    (ended, interrupted): (BTreeSet<u64>, bool),
) -> impl Stream<Item = Result<Event, Infallible>> {
    struct St {
        rx: tokio::sync::broadcast::Receiver<crate::exec::TraceLine>,
        api: Arc<Api>,
        id: String,
        live: BTreeMap<u32, u64>,
        sessions: BTreeSet<u64>,
        ended: BTreeSet<u64>,
        done: bool,
        /// A `session_interrupted` line went by.
        interrupted: bool,
    }
    let st = St { rx, api, id, live, sessions, ended, done: false, interrupted };
    futures::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        if st.ended.len() >= st.sessions.len() {
            st.done = true;
            // A stopping server's planner no longer answers: the run's end is the stop's.
            let status = match run_json(&st.api, &st.id).await {
                Ok(status) => status,
                Err(_) if st.api.service.is_stopping() && st.interrupted => json!({
                    "id": st.id,
                    "state": "interrupted",
                    "detail": "the server stopped before the run ended (with --state its open sessions resume at the next start)",
                }),
                Err(e) => json!({"error": e.message}),
            };
            return Some((Ok(Event::default().event("run_end").data(status.to_string())), st));
        }
        loop {
            match st.rx.recv().await {
                Ok(line) => {
                    let session = match line.session {
                        Some(s) => match st.live.get(&s) {
                            Some(n) => Some(*n),
                            None => continue,
                        },
                        None => None,
                    };
                    if matches!(line.event, "session_done" | "session_failed" | "session_interrupted")
                        && let Some(n) = session
                    {
                        st.ended.insert(n);
                        st.interrupted |= line.event == "session_interrupted";
                    }
                    let line = crate::exec::TraceLine { detail: line.detail.as_deref().map(public_reason), ..line };
                    let mut data = serde_json::to_value(&line).unwrap_or_default();
                    if let (Some(n), Some(obj)) = (session, data.as_object_mut()) {
                        obj.insert("session".into(), json!(n));
                    }
                    return Some((Ok(Event::default().event(line.event).data(data.to_string())), st));
                }
                Err(RecvError::Lagged(n)) => {
                    // Lost lines may include session ends: re-read the status.
                    if let Ok(v) = run_json(&st.api, &st.id).await {
                        st.ended.extend(ended_set(v));
                    }
                    return Some((Ok(Event::default().event("lagged").data(json!({"lost": n}).to_string())), st));
                }
                Err(RecvError::Closed) => {
                    st.done = true;
                    return Some((Ok(Event::default().event("closed").data("{}")), st));
                }
            }
        }
    })
}

/// Every route of the API as (method, path), as [`router`] builds it: the OpenAPI document
/// must describe exactly these (tested).
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/health"),
    ("get", "/openapi.json"),
    ("get", "/metrics"),
    ("get", "/v1/workflows"),
    ("post", "/v1/workflows"),
    ("get", "/v1/workflows/{name}"),
    ("get", "/v1/runs"),
    ("post", "/v1/runs"),
    ("get", "/v1/runs/{id}"),
    ("get", "/v1/runs/{id}/events"),
    ("post", "/v1/runs/{id}/cancel"),
    ("post", "/v1/chat/completions"),
    ("post", "/v1/completions"),
    ("get", "/v1/models"),
    ("post", "/v1/programs/{key}/verdict"),
];

#[cfg(test)]
mod tests {
    #[test]
    fn a_failed_sessions_reason_names_no_engine_address() {
        let failed = crate::live::SessionStatus::Failed {
            reason: "call failed: request 3 to http://10.0.0.7:8000/v1/completions: HTTP 500 (boom)".into(),
            at: 1.0,
        };
        let v = super::session_json(4, &failed, Some(1.0));
        assert_eq!(v["reason"], "call failed: request 3 to <engine>: HTTP 500 (boom)", "{v}");
    }

    #[test]
    fn a_token_less_server_answers_only_loopback_hosts_and_origins() {
        use axum::http::{HeaderMap, HeaderValue, header};
        let headers = |host: Option<&'static str>, origin: Option<&'static str>| {
            let mut h = HeaderMap::new();
            if let Some(v) = host {
                h.insert(header::HOST, HeaderValue::from_static(v));
            }
            if let Some(v) = origin {
                h.insert(header::ORIGIN, HeaderValue::from_static(v));
            }
            h
        };
        for host in ["127.0.0.1:8080", "localhost:8080", "LOCALHOST", "[::1]:8080", "127.0.0.2", "localhost"] {
            assert_eq!(super::foreign_browser_request(&headers(Some(host), None), None), None, "{host}");
        }
        for origin in ["http://localhost:3000", "http://127.0.0.1:8080", "https://[::1]"] {
            assert_eq!(super::foreign_browser_request(&headers(Some("127.0.0.1:8080"), Some(origin)), None), None, "{origin}");
        }
        // DNS rebinding: a page's own name resolving to 127.0.0.1.
        for host in ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", "localhost.evil.example:80", "[::2]:80", "10.0.0.1"] {
            assert!(super::foreign_browser_request(&headers(Some(host), None), None).is_some(), "{host}");
        }
        // A cross-site request from a page (the browser names it in `Origin`).
        for origin in ["http://evil.example", "null", "http://127.0.0.1.evil.example", "file://"] {
            assert!(super::foreign_browser_request(&headers(Some("127.0.0.1:8080"), Some(origin)), None).is_some(), "{origin}");
        }
        // No `Host` (HTTP/2 puts it in the URI's authority).
        assert_eq!(super::foreign_browser_request(&headers(None, None), Some("127.0.0.1:8080")), None);
        assert!(super::foreign_browser_request(&headers(None, None), None).is_some());
    }

    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_nothing_else_is_a_token() {
        for ok in ["Bearer tok", "bearer tok", "BEARER  tok ", " Bearer tok"] {
            assert_eq!(bearer_credentials(ok), Some("tok"), "{ok:?}");
        }
        for bad in ["Basic tok", "Bearertok", "tok", "", "Bearer"] {
            assert_eq!(bearer_credentials(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_openapi_document_describes_exactly_the_routes() {
        let doc: Value = serde_json::from_str(OPENAPI).expect("the OpenAPI document is JSON");
        let paths = doc.get("paths").and_then(Value::as_object).expect("paths");
        let mut documented = BTreeSet::new();
        for (path, ops) in paths {
            for method in ops.as_object().expect("operations").keys() {
                documented.insert((method.clone(), path.clone()));
            }
        }
        let routes: BTreeSet<(String, String)> = ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
        assert_eq!(documented, routes);
    }

    #[test]
    fn a_run_is_running_until_every_session_ended() {
        let done = SessionStatus::Completed { output: None, score: None, finished_at: 1.0 };
        let failed = SessionStatus::Failed { reason: "x".into(), at: 1.0 };
        assert_eq!(run_state(&[done.clone(), SessionStatus::Running], false), "running");
        assert_eq!(run_state(&[done.clone(), done.clone()], false), "completed");
        assert_eq!(run_state(&[done.clone(), failed.clone()], false), "failed");
        assert_eq!(run_state(&[done, failed], true), "cancelled");
    }

    #[test]
    fn errors_have_openais_shape_with_an_integer_code() {
        let resp = ApiError::bad_request("bad", "inputs").into_response();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let unauthorized = ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", "no").into_response();
        assert_eq!(unauthorized.headers().get(header::WWW_AUTHENTICATE).map(|v| v.as_bytes()), Some(&b"Bearer"[..]));
    }
}
