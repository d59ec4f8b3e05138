//! `switchyard serve`'s REST API and front door in process, as a client sees them over HTTP, on
//! fast fake engines: what a session's id is across restarts on one `--state` journal (a
//! restart here is a runtime stopped and a new one started on the same journal, which leaves
//! the stopped one's open sessions unfinished as a crash does), the times a run reports, the
//! front door's default answer limit, `/health` while the server stops, cancelling a run that
//! ended, the runs list's cursor and the `--max-programs` 429.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use switchyard_runtime::exec::{PoolSpec, RunConfig};
use switchyard_runtime::live::engine::{Completion, Engine, EngineError, EngineFuture, EngineTelemetry, LlmRequest};
use switchyard_runtime::live::journal::Journal;
use switchyard_runtime::live::{EngineFactory, EngineHandle, EngineTarget, LiveConfig, RetryPolicy, Service};
use switchyard_runtime::serve::{ApiConfig, Restored, durable_router, router, serve_until};
use switchyard_runtime::tokens;
use switchyard_runtime::workflow::{WorkflowSpec, load_workflow};

// ---------------------------------------------------------------------------------------------
// A fake engine: answers the request's emulated output (or a short text) after `delay`, and
// remembers each request's `max_tokens` (and whether it is the server's default); finds every request invalid while `reject` is set.

#[derive(Default)]
struct Seen {
    /// (prompt tokens, max_tokens, left to the server's default) of each request.
    max_tokens: Mutex<Vec<(u32, u32, bool)>>,
    reject: AtomicBool,
}

struct Fake {
    delay: Duration,
    seen: Arc<Seen>,
}

impl Engine for Fake {
    fn kind(&self) -> &'static str {
        "fake"
    }
    fn load(&self) -> EngineFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn sleep(&self, _level: u8) -> EngineFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn wake(&self) -> EngineFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn unload(&self) -> EngineFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn submit(&self, request: LlmRequest) -> EngineFuture<'_, Completion> {
        Box::pin(async move {
            if self.seen.reject.load(Ordering::SeqCst) {
                return Err(EngineError::Invalid("the test refuses every request".into()));
            }
            if let Ok(mut m) = self.seen.max_tokens.lock() {
                m.push((request.prompt_tokens, request.max_tokens, request.server_default_limit));
            }
            tokio::time::sleep(self.delay).await;
            let text = request.emulated_output.clone().unwrap_or_else(|| "a short answer".into());
            let output_tokens = (tokens::count(&text) as u32).clamp(1, request.max_tokens.max(1));
            Ok(Completion {
                prompt_tokens: request.prompt_tokens,
                cached_prompt_tokens: 0,
                output_tokens,
                text,
                ttft_s: 0.0,
                latency_s: self.delay.as_secs_f64(),
                ..Default::default()
            })
        })
    }
    fn telemetry(&self) -> EngineFuture<'_, EngineTelemetry> {
        Box::pin(async { Ok(EngineTelemetry::default()) })
    }
}

struct Factory {
    delay: Duration,
    seen: Arc<Seen>,
}

impl Factory {
    fn new(delay_ms: u64) -> Arc<Factory> {
        Arc::new(Factory { delay: Duration::from_millis(delay_ms), seen: Arc::default() })
    }
}

impl EngineFactory for Factory {
    fn create(&self, target: &EngineTarget<'_>) -> Result<EngineHandle, EngineError> {
        let engine = Fake { delay: self.delay, seen: Arc::clone(&self.seen) };
        Ok(EngineHandle { engine: Arc::new(engine), served_model: target.deployment.model.clone() })
    }
}

// ---------------------------------------------------------------------------------------------
// Set-up.

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The tiny chain fixture (two calls on Qwen3-0.6B, a 2,048-token context), its YAML text and a
/// served runtime's configuration for it on the small pool.
fn tiny_chain() -> (Arc<WorkflowSpec>, String, LiveConfig) {
    let path = repo().join("tests/fixtures/tiny_chain.yaml");
    let tiny = Arc::new(load_workflow(&path).expect("fixture"));
    let text = std::fs::read_to_string(&path).expect("fixture");
    let pool = PoolSpec::load(&repo().join("workflows/pools/small.yaml")).expect("bundled pool");
    let mut cfg = LiveConfig::new(RunConfig::served(vec![Arc::clone(&tiny)], pool));
    cfg.speed = 1000.0;
    cfg.retry = RetryPolicy { backoff: Duration::from_millis(2), ..RetryPolicy::default() };
    cfg.telemetry_every = Some(Duration::from_millis(20));
    cfg.tick = Duration::from_millis(20);
    (tiny, text, cfg)
}

/// The tiny chain's served configuration with a fresh journal (its directory lives as long as
/// the first value).
fn durable_tiny_chain() -> (tempfile::TempDir, Arc<Journal>, LiveConfig) {
    let dir = tempfile::tempdir().expect("tempdir");
    let journal = Arc::new(Journal::open(&dir.path().join("state")).expect("journal"));
    let (_, _, cfg) = tiny_chain();
    (dir, journal, cfg)
}

fn two_worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime")
}

async fn serve_on_loopback(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let root = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(serve_until(listener, app, std::future::pending()));
    root
}

/// A server without a journal: its service and root URL.
async fn serve(cfg: &LiveConfig, factory: Arc<Factory>, api: ApiConfig) -> (Arc<Service>, String) {
    let (tiny, text, _) = tiny_chain();
    let service = Arc::new(Service::start(cfg, factory).await.expect("service"));
    let app = router(Arc::clone(&service), api, vec![(0, tiny, text)]);
    (Arc::clone(&service), serve_on_loopback(app).await)
}

/// A server on `journal` (`--state`): its service, root URL and what it restored.
async fn serve_durably(cfg: &LiveConfig, factory: Arc<Factory>, journal: &Arc<Journal>) -> (Arc<Service>, String, Restored) {
    let (tiny, text, _) = tiny_chain();
    let service = Arc::new(Service::start(cfg, factory).await.expect("service"));
    let api = ApiConfig { token: None, ..ApiConfig::default() };
    let (app, restored) = durable_router(Arc::clone(&service), api, vec![(0, tiny, text)], Arc::clone(journal)).await.expect("router");
    (service, serve_on_loopback(app).await, restored)
}

async fn get(root: &str, path: &str) -> (u16, Value) {
    let resp = reqwest::get(format!("{root}{path}")).await.expect("get");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn post(root: &str, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new().post(format!("{root}{path}")).json(&body).send().await.expect("post");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Start a run of `n` tiny-chain sessions: its id and its sessions' ids.
async fn start_run(root: &str, n: usize) -> (String, Vec<String>) {
    let (s, v) = post(root, "/v1/runs", json!({"workflow": "tiny-chain", "sessions": n})).await;
    assert_eq!(s, 201, "{v}");
    (v["id"].as_str().expect("id").to_string(), session_ids(&v["sessions"]))
}

fn session_ids(list: &Value) -> Vec<String> {
    list.as_array().expect("sessions").iter().map(|s| s.as_str().or_else(|| s["id"].as_str()).expect("id").to_string()).collect()
}

/// Poll a run until it is no longer running (10 s at most): its status.
async fn ended(root: &str, run: &str) -> Value {
    let t0 = Instant::now();
    loop {
        let (s, v) = get(root, &format!("/v1/runs/{run}")).await;
        assert_eq!(s, 200, "{v}");
        if v["state"] != "running" || t0.elapsed() > Duration::from_secs(10) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn sorted(ids: &[String]) -> Vec<String> {
    let mut ids = ids.to_vec();
    ids.sort();
    ids
}

/// A run's event stream as text, read until its `run_end` (`within` at most).
async fn events_until_end(root: &str, run: &str, within: Duration) -> String {
    let resp = reqwest::get(format!("{root}/v1/runs/{run}/events")).await.expect("events");
    assert_eq!(resp.status().as_u16(), 200);
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    let _ = tokio::time::timeout(within, async {
        while let Some(Ok(chunk)) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if text.contains("event: run_end") && text.ends_with("\n\n") {
                break;
            }
        }
    })
    .await;
    text
}

/// The `session` fields of a run's event stream, read until its `run_end` (10 s at most).
async fn event_sessions(root: &str, run: &str) -> (BTreeSet<u64>, usize) {
    let text = events_until_end(root, run, Duration::from_secs(10)).await;
    assert!(text.contains("event: run_end"), "{text}");
    let sessions = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v.get("event").is_some())
        .filter_map(|v| v.get("session").and_then(Value::as_u64))
        .collect();
    (sessions, text.matches("event: session_done\n").count())
}

/// `sN` → N.
fn number(id: &str) -> u64 {
    id.strip_prefix('s').and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("a session id `sN`: {id}"))
}

// ---------------------------------------------------------------------------------------------
// Session ids across restarts.

/// A session keeps the id its client was given across restarts — ended and resumed sessions,
/// in the run's status and in its event stream — and no id is handed out twice on one journal.
/// (Each restarted runtime numbered its sessions from 0 again: a resumed session got another
/// id, an ended one `journal-N`, and a new run ids that earlier runs' sessions had.)
#[test]
fn a_sessions_id_survives_restarts_and_is_never_handed_out_again() {
    let (_dir, journal, cfg) = durable_tiny_chain();
    let rt = two_worker_runtime();
    rt.block_on(async {
        // First server: one run ends, another is in flight when it stops.
        let (service, root, _) = serve_durably(&cfg, Factory::new(300), &journal).await;
        let (done_run, done_ids) = start_run(&root, 2).await;
        assert_eq!(ended(&root, &done_run).await["state"], "completed");
        let (open_run, open_ids) = start_run(&root, 3).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        service.shutdown("the test stops it").await.expect("shutdown");
        let mut handed_out: Vec<String> = done_ids.iter().chain(&open_ids).cloned().collect();
        assert_eq!(handed_out.iter().collect::<BTreeSet<_>>().len(), 5, "{handed_out:?}");

        // Second server on the same journal: the open run resumes under its ids (its events
        // name them too), the ended one shows its ids, and a new run gets new ones.
        let (service, root, restored) = serve_durably(&cfg, Factory::new(150), &journal).await;
        assert_eq!((restored.ended_sessions, restored.resumed_sessions), (2, 3), "{restored:?}");
        let (_, v) = get(&root, &format!("/v1/runs/{done_run}")).await;
        assert_eq!(sorted(&session_ids(&v["sessions"])), sorted(&done_ids), "{v}");
        let (seen, _) = event_sessions(&root, &open_run).await;
        let open_numbers: BTreeSet<u64> = open_ids.iter().map(|i| number(i)).collect();
        assert!(!seen.is_empty() && seen.is_subset(&open_numbers), "events name {seen:?}, the run's sessions are {open_ids:?}");
        let v = ended(&root, &open_run).await;
        assert_eq!(v["state"], "completed", "{v}");
        assert_eq!(sorted(&session_ids(&v["sessions"])), sorted(&open_ids), "{v}");
        let (new_run, new_ids) = start_run(&root, 3).await;
        assert!(new_ids.iter().all(|i| !handed_out.contains(i)), "new {new_ids:?}, handed out before {handed_out:?}");
        handed_out.extend(new_ids.iter().cloned());
        assert_eq!(ended(&root, &new_run).await["state"], "completed");
        service.shutdown("the test stops it").await.expect("shutdown");

        // Third server: every run still shows the ids its client was given, and the next run
        // gets ids no earlier run had.
        let (service, root, _) = serve_durably(&cfg, Factory::new(1), &journal).await;
        for (run, ids) in [(&done_run, &done_ids), (&open_run, &open_ids), (&new_run, &new_ids)] {
            let (_, v) = get(&root, &format!("/v1/runs/{run}")).await;
            assert_eq!(sorted(&session_ids(&v["sessions"])), sorted(ids), "{v}");
        }
        let (_, later) = start_run(&root, 2).await;
        assert!(later.iter().all(|i| !handed_out.contains(i)), "new {later:?}, handed out before {handed_out:?}");
        service.shutdown("the test ends").await.expect("shutdown");
    });
}

/// A graceful stop of a durable server ends its open sessions as *interrupted*, not failed:
/// their events are `session_interrupted` with a reason saying they resume, the run's stream
/// ends with `run_end` `state: interrupted` (it carried the planner's refusal, "the planner
/// dropped the request"), the stop's output counts them apart — and the next start resumes
/// them. A client that believed "failed" would have run them again.
#[test]
fn a_stop_interrupts_journaled_sessions_and_they_resume() {
    let (_dir, journal, cfg) = durable_tiny_chain();
    let rt = two_worker_runtime();
    rt.block_on(async {
        let (service, root, _) = serve_durably(&cfg, Factory::new(300), &journal).await;
        let (run, ids) = start_run(&root, 3).await;
        let events = tokio::spawn({
            let (root, run) = (root.clone(), run.clone());
            async move { events_until_end(&root, &run, Duration::from_secs(20)).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let out = service.shutdown("the server stopped").await.expect("shutdown");
        let text = events.await.expect("the event reader");
        assert_eq!(out.interrupted, 3, "{:?}", out.sessions);
        assert_eq!(text.matches("event: session_interrupted\n").count(), 3, "{text}");
        assert!(!text.contains("event: session_failed"), "{text}");
        assert!(text.contains("resumes it"), "{text}");
        let end = text.split("event: run_end\ndata: ").nth(1).expect("run_end");
        assert!(end.contains("\"state\":\"interrupted\""), "{end}");

        let (service, root, restored) = serve_durably(&cfg, Factory::new(1), &journal).await;
        assert_eq!(restored.resumed_sessions, 3, "{restored:?}");
        let v = ended(&root, &run).await;
        assert_eq!(v["state"], "completed", "{v}");
        assert_eq!(sorted(&session_ids(&v["sessions"])), sorted(&ids));
        service.shutdown("the test ends").await.expect("shutdown");
    });
}

// ---------------------------------------------------------------------------------------------
// Times.

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// Each session's end time by id (`finished_at` or `failed_at`).
fn end_times(run: &Value) -> Vec<(String, Option<f64>)> {
    let mut out: Vec<(String, Option<f64>)> = run["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| (s["id"].as_str().unwrap_or("").to_string(), s.get("finished_at").or_else(|| s.get("failed_at")).and_then(Value::as_f64)))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A run's `created_at` and its sessions' `finished_at` / `failed_at` are Unix times, the same
/// after a restart as before it (the journal's; the ends within the moment between the
/// runtime's end and its journal write). They were seconds since the server started: after a
/// restart `created_at` was negative and every end `0.0`.
#[test]
fn a_runs_times_are_unix_seconds_and_survive_a_restart() {
    let (_dir, journal, cfg) = durable_tiny_chain();
    let rt = two_worker_runtime();
    rt.block_on(async {
        let factory = Factory::new(20);
        let seen = Arc::clone(&factory.seen);
        let (service, root, _) = serve_durably(&cfg, factory, &journal).await;
        let before_start = unix_now();
        let (s, started) = post(&root, "/v1/runs", json!({"workflow": "tiny-chain", "sessions": 2})).await;
        assert_eq!(s, 201, "{started}");
        let completed = started["id"].as_str().expect("id").to_string();
        let done = ended(&root, &completed).await;
        assert_eq!(done["state"], "completed", "{done}");
        seen.reject.store(true, Ordering::SeqCst);
        let (failed, _) = start_run(&root, 1).await;
        let failed_before = ended(&root, &failed).await;
        assert_eq!(failed_before["state"], "failed", "{failed_before}");
        let created = done["created_at"].as_f64().expect("created_at");
        assert_eq!(started["created_at"].as_f64(), Some(created), "the same in the answer and the status");
        assert!((created - before_start).abs() < 5.0, "a Unix time: {created} (now {before_start})");
        for (id, end) in end_times(&done).into_iter().chain(end_times(&failed_before)) {
            let end = end.unwrap_or_else(|| panic!("{id} has an end time"));
            assert!(end >= created && end <= unix_now() + 1.0, "{id} ended at {end}, created {created}");
        }
        let (_, listed) = get(&root, "/v1/runs").await;
        service.shutdown("the test stops it").await.expect("shutdown");

        let (service, root, _) = serve_durably(&cfg, Factory::new(1), &journal).await;
        for before in [&done, &failed_before] {
            let (_, after) = get(&root, &format!("/v1/runs/{}", before["id"].as_str().unwrap_or(""))).await;
            assert_eq!(after["created_at"], before["created_at"], "{after}");
            for ((id, b), (id2, a)) in end_times(before).into_iter().zip(end_times(&after)) {
                assert_eq!(id, id2);
                let (b, a) = (b.expect("before"), a.unwrap_or_else(|| panic!("{id} has its end time after a restart: {after}")));
                assert!((a - b).abs() < 1.0, "{id} ended at {b} before the restart, {a} after");
            }
        }
        let (_, listed_after) = get(&root, "/v1/runs").await;
        assert_eq!(listed_after["runs"], listed["runs"]);
        service.shutdown("the test ends").await.expect("shutdown");
    });
}

// ---------------------------------------------------------------------------------------------
// The front door's default answer limit.

/// A front-door chat call without `max_tokens` may answer up to what the served context leaves
/// after its prompt, as vLLM's chat completions do (`max_model_len` − prompt tokens), sent
/// upstream without a limit (the server counts that room); a completion without one gets vLLM's
/// (and OpenAI's) 16. With `serve --default-max-tokens N` such a chat call gets N, capped by the
/// context's rest — sent without a limit again where the rest is the smaller (our count of the
/// prompt may be a token off the server's) — and the client's own limit always wins.
#[test]
fn an_answer_without_max_tokens_gets_the_contexts_rest_or_the_servers_default() {
    let (_, _, cfg) = tiny_chain();
    let rt = two_worker_runtime();
    rt.block_on(async {
        let chat = json!({"model": "Qwen3-0.6B", "messages": [{"role": "user", "content": "Write at length."}]});
        let long = json!({"model": "Qwen3-0.6B", "messages": [{"role": "user", "content": "Write at length. ".repeat(40)}]});
        let mut limited = chat.clone();
        limited["max_tokens"] = json!(700);
        let completion = json!({"model": "Qwen3-0.6B", "prompt": "Once upon a time"});
        // (prompt tokens, max_tokens, left to the server) per call, on a server with `default`.
        let sent = |default: Option<u32>| {
            let (cfg, chat, long, limited, completion) = (&cfg, chat.clone(), long.clone(), limited.clone(), completion.clone());
            async move {
                let mut cfg = cfg.clone();
                cfg.front_door_max_tokens = default;
                let factory = Factory::new(1);
                let seen = Arc::clone(&factory.seen);
                let (service, root) = serve(&cfg, factory, ApiConfig { token: None, ..ApiConfig::default() }).await;
                for (path, body) in [("/v1/chat/completions", chat), ("/v1/chat/completions", long), ("/v1/chat/completions", limited), ("/v1/completions", completion)] {
                    let (s, v) = post(&root, path, body).await;
                    assert_eq!(s, 200, "{v}");
                }
                service.shutdown("the test ends").await.expect("shutdown");
                seen.max_tokens.lock().expect("seen").clone()
            }
        };
        // The tiny chain serves Qwen3-0.6B with a 2,048-token context.
        let vllm = sent(None).await;
        let rest = |i: usize| 2048 - vllm[i].0;
        assert_eq!(vllm.len(), 4, "{vllm:?}");
        assert_eq!((vllm[0].1, vllm[0].2), (rest(0), true), "{vllm:?}");
        assert_eq!((vllm[1].1, vllm[1].2), (rest(1), true), "{vllm:?}");
        assert_eq!((vllm[2].1, vllm[2].2, vllm[3].1, vllm[3].2), (700, false, 16, false), "{vllm:?}");
        // A default of 2,000: below the short prompt's rest (sent as the limit), above the long
        // prompt's (the rest, left to the server).
        let capped = sent(Some(2000)).await;
        assert!(rest(0) > 2000 && rest(1) < 2000, "{vllm:?}");
        assert_eq!((capped[0].1, capped[0].2), (2000, false), "{capped:?}");
        assert_eq!((capped[1].1, capped[1].2), (rest(1), true), "{capped:?}");
        assert_eq!((capped[2].1, capped[2].2, capped[3].1), (700, false, 16), "{capped:?}");
    });
}

/// A call the engine finds invalid (its 400: not retryable) is the client's 400 with the
/// engine's reason, once — not a 502, which OpenAI's clients send again.
#[test]
fn a_call_the_engine_refuses_is_a_400() {
    let (_, _, cfg) = tiny_chain();
    let rt = two_worker_runtime();
    rt.block_on(async {
        let factory = Factory::new(1);
        let seen = Arc::clone(&factory.seen);
        let (service, root) = serve(&cfg, factory, ApiConfig { token: None, ..ApiConfig::default() }).await;
        seen.reject.store(true, Ordering::SeqCst);
        let (s, v) = post(&root, "/v1/chat/completions", json!({"model": "Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}]})).await;
        assert_eq!((s, v.pointer("/error/type").and_then(Value::as_str)), (400, Some("invalid_request_error")), "{v}");
        assert!(v.pointer("/error/message").and_then(Value::as_str).is_some_and(|m| m.contains("the test refuses every request")), "{v}");
        service.shutdown("the test ends").await.expect("shutdown");
    });
}

// ---------------------------------------------------------------------------------------------
// Health while stopping.

/// `/health` answers 503 `shutting_down` once the server began to stop, as the calls that
/// would start work do (it answered 200 `ok` to the end).
#[test]
fn health_says_503_once_the_server_stops() {
    let (_, _, cfg) = tiny_chain();
    let rt = two_worker_runtime();
    rt.block_on(async {
        let (service, root) = serve(&cfg, Factory::new(1), ApiConfig { token: None, ..ApiConfig::default() }).await;
        assert_eq!(get(&root, "/health").await, (200, json!({"status": "ok"})));
        service.shutdown("the test stops it").await.expect("shutdown");
        assert_eq!(get(&root, "/health").await, (503, json!({"status": "shutting_down"})));
        let (s, _) = post(&root, "/v1/runs", json!({"workflow": "tiny-chain", "sessions": 1})).await;
        assert_eq!(s, 503, "a run is refused as well");
    });
}

// ---------------------------------------------------------------------------------------------
// Cancelling a run that ended.

/// A cancel of a run that has ended is refused with 409 naming its state, and changes nothing
/// (it answered 202, and a failed run then read `cancelled`, also after a restart: the cancel
/// was journaled).
#[test]
fn cancelling_an_ended_run_is_a_conflict_and_changes_nothing() {
    let (_dir, journal, cfg) = durable_tiny_chain();
    let rt = two_worker_runtime();
    rt.block_on(async {
        let factory = Factory::new(1);
        let seen = Arc::clone(&factory.seen);
        let (service, root, _) = serve_durably(&cfg, factory, &journal).await;
        let (completed, _) = start_run(&root, 1).await;
        assert_eq!(ended(&root, &completed).await["state"], "completed");
        seen.reject.store(true, Ordering::SeqCst);
        let (failed, _) = start_run(&root, 1).await;
        assert_eq!(ended(&root, &failed).await["state"], "failed");
        for (run, state) in [(&completed, "completed"), (&failed, "failed")] {
            let (s, v) = post(&root, &format!("/v1/runs/{run}/cancel"), json!({})).await;
            assert_eq!((s, v.pointer("/error/code").and_then(Value::as_u64)), (409, Some(409)), "{v}");
            let message = v.pointer("/error/message").and_then(Value::as_str).unwrap_or("");
            assert!(message.contains(state), "the run's state is named: {message}");
            assert_eq!(ended(&root, run).await["state"], state, "unchanged");
        }
        assert_eq!(post(&root, "/v1/runs/run-99/cancel", json!({})).await.0, 404);
        assert!(journal.cancelled_runs().expect("cancelled").is_empty(), "no cancel journaled");
        service.shutdown("the test ends").await.expect("shutdown");
    });
}

// ---------------------------------------------------------------------------------------------
// The runs list's cursor, and the programs limit's 429.

/// A malformed `after` is a 400 naming the parameter (it answered an empty page); a run id
/// past the last run is still an empty page.
#[test]
fn a_malformed_runs_cursor_is_a_bad_request() {
    let (_, _, cfg) = tiny_chain();
    let rt = two_worker_runtime();
    rt.block_on(async {
        let (service, root) = serve(&cfg, Factory::new(1), ApiConfig { token: None, ..ApiConfig::default() }).await;
        let (run, _) = start_run(&root, 1).await;
        let (s, v) = get(&root, "/v1/runs").await;
        assert_eq!((s, v["runs"][0]["id"].as_str()), (200, Some(run.as_str())), "{v}");
        for bad in ["zzz", "run-", "run-x", "run--1", "7"] {
            let (s, v) = get(&root, &format!("/v1/runs?after={bad}")).await;
            assert_eq!((s, v.pointer("/error/param").and_then(Value::as_str)), (400, Some("after")), "{bad}: {v}");
        }
        let (s, v) = get(&root, "/v1/runs?after=run-1000").await;
        assert_eq!((s, v["runs"].as_array().map(Vec::len)), (200, Some(0)), "{v}");
        service.shutdown("the test ends").await.expect("shutdown");
    });
}

/// A keyed program past `--max-programs` gets 429 with a `Retry-After` (a slot frees when any
/// program ends); it had none.
#[test]
fn the_programs_limit_429_says_when_to_retry() {
    let (_, _, mut cfg) = tiny_chain();
    cfg.max_programs = 1;
    let rt = two_worker_runtime();
    rt.block_on(async {
        let (service, root) = serve(&cfg, Factory::new(1), ApiConfig { token: None, ..ApiConfig::default() }).await;
        let client = reqwest::Client::new();
        let mut answers = Vec::new();
        for key in ["a", "b"] {
            let body = json!({"model": "Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
            let resp = client.post(format!("{root}/v1/chat/completions")).header("X-Session-ID", key).json(&body).send().await.expect("post");
            let retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
            answers.push((resp.status().as_u16(), retry_after));
        }
        assert_eq!(answers, [(200, None), (429, Some("1".to_string()))]);
        service.shutdown("the test ends").await.expect("shutdown");
    });
}
