//! Durable sessions of `switchyard serve --state DIR`: the server is killed with SIGKILL while
//! hundreds of sessions are in flight on the emulated pool, started again on the same state
//! directory, and the run completes; the journal then shows every session completed exactly
//! once, no activation sent more than twice (once more only if it was in flight at the kill),
//! and nothing left in flight.

mod support;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::serve::{BIN, Server, TOKEN, slow_pool};
use switchyard_runtime::live::journal::{Journal, SessionOutcome};

/// Two long answers on Qwen3-0.6B: a session lasts seconds at 5×, so a kill lands mid-run.
const LONG_PAIR: &str = r#"
name: long-pair
deployments:
  small: {model: Qwen3-0.6B, dtype: fp16, max_context: 4096, max_output_tokens: 1200}
nodes:
  - id: draft
    deployment: small
    output_tokens: {mean: 600, cv: 0.3}
    prompt: Draft at length.
  - id: edit
    deployment: small
    after: draft
    output_tokens: {mean: 400, cv: 0.3}
    prompt: "Edit: {{draft}}"
"#;

const SESSIONS: usize = 300;

fn start(dir: &Path, state: &Path, workflow: &Path) -> Server {
    let pool = slow_pool(dir);
    Server::start_with(&pool, &[workflow], &["--state".as_ref(), state.as_os_str()])
}

async fn run_status(http: &reqwest::Client, server: &Server, run: &str) -> Value {
    let resp = http.get(server.url(&format!("/v1/runs/{run}"))).header("authorization", format!("Bearer {TOKEN}")).send().await.expect("status");
    resp.json().await.expect("json")
}

/// Poll a run until it is no longer running (or `within` has passed); its last status.
async fn run_until_ended(http: &reqwest::Client, server: &Server, run: &str, within: Duration) -> Value {
    let t0 = Instant::now();
    let mut v = json!(null);
    while t0.elapsed() < within {
        v = run_status(http, server, run).await;
        if v["state"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    v
}

/// A one-node workflow named `name` for registering over the API.
fn echo(name: &str) -> String {
    format!(
        "name: {name}\ndeployments:\n  small: {{model: Qwen3-0.6B, dtype: fp16, max_context: 4096, max_output_tokens: 64}}\nnodes:\n  - id: say\n    deployment: small\n    output_tokens: {{mean: 8, cv: 0.1}}\n    prompt: Say something.\n"
    )
}

/// A temporary directory with the state path in it and `LONG_PAIR` written as the workflow
/// file the servers start with.
fn state_dir() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let workflow = dir.path().join("long-pair.yaml");
    std::fs::write(&workflow, LONG_PAIR).expect("workflow");
    (dir, state, workflow)
}

/// Start a one-session run of `workflow`; its id.
async fn start_run(http: &reqwest::Client, server: &Server, workflow: &str) -> String {
    post_run(http, server, json!({"workflow": workflow, "sessions": 1})).await
}

/// `POST /v1/runs` with `body`, which must be answered 201; the run's id.
async fn post_run(http: &reqwest::Client, server: &Server, body: Value) -> String {
    let resp = http
        .post(server.url("/v1/runs"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .json(&body)
        .send()
        .await
        .expect("run");
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap_or_default());
    resp.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string()
}

/// Register a workflow's YAML text over the API.
async fn register(http: &reqwest::Client, server: &Server, yaml: &str) -> reqwest::Response {
    http.post(server.url("/v1/workflows"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/yaml")
        .body(yaml.to_string())
        .send()
        .await
        .expect("register")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_resumes_every_session_exactly_once() {
    let (dir, state, workflow) = state_dir();
    let http = reqwest::Client::new();
    let auth = format!("Bearer {TOKEN}");

    let mut first = start(dir.path(), &state, &workflow);
    let resp = http
        .post(first.url("/v1/runs"))
        .header("authorization", &auth)
        .json(&json!({"workflow": "long-pair", "sessions": SESSIONS}))
        .send()
        .await
        .expect("run");
    assert_eq!(resp.status().as_u16(), 201);
    let run = resp.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string();
    // A keyed front-door call is served beside the durable run (a program that is not routed
    // keeps nothing in the journal).
    let call = json!({"model": "Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    let resp = http.post(first.url("/v1/chat/completions")).header("authorization", &auth).header("X-Session-ID", "agent-7").json(&call).send().await.expect("call");
    assert_eq!(resp.status().as_u16(), 200);
    // Kill it once some sessions completed and most are still in flight.
    let t0 = Instant::now();
    let mut at_kill = json!(null);
    while t0.elapsed() < Duration::from_secs(120) {
        let v = run_status(&http, &first, &run).await;
        let done = v.pointer("/counts/completed").and_then(Value::as_u64).unwrap_or(0);
        if done >= 10 {
            at_kill = v["counts"].clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let running = at_kill.get("running").and_then(Value::as_u64).unwrap_or(0);
    assert!(running >= 100, "hundreds of sessions in flight at the kill: {at_kill}");
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(first.child.id() as libc::pid_t, libc::SIGKILL) }, 0);
    let _ = first.child.wait();
    drop(first);
    eprintln!("killed with {at_kill}");

    // Two starts on an address another process holds: each stops before resuming anything, so
    // neither counts as another attempt of the activations in flight at the kill (a session is
    // refused a third).
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("hold a port");
    let address = held.local_addr().expect("address").to_string();
    for _ in 0..2 {
        let out = std::process::Command::new(BIN)
            .args(["serve", "--listen", &address, "--pool"])
            .arg(slow_pool(dir.path()))
            .arg("--workflow")
            .arg(&workflow)
            .arg("--state")
            .arg(&state)
            .env("SWITCHYARD_API_TOKEN", TOKEN)
            .current_dir(support::serve::repo())
            .output()
            .expect("switchyard serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains("cannot listen"), "{stderr}");
        assert!(!stderr.contains("resumed"), "nothing resumes before the address is bound: {stderr}");
    }
    drop(held);

    // The same state directory: the run comes back and completes.
    let second = start(dir.path(), &state, &workflow);
    let v = run_until_ended(&http, &second, &run, Duration::from_secs(300)).await;
    assert_eq!(v["state"], "completed", "{}", v["counts"]);
    assert_eq!(v.pointer("/counts/completed").and_then(Value::as_u64), Some(SESSIONS as u64), "{}", v["counts"]);
    drop(second); // SIGKILL again: the journal is closed by the kernel; redb recovers it

    // The journal's own account.
    let journal = Journal::open(&state).expect("the journal opens after two kills");
    let outcomes = journal.session_outcomes().expect("outcomes");
    assert_eq!(outcomes.len(), SESSIONS, "every session finished once");
    assert!(outcomes.values().all(|o| matches!(o, SessionOutcome::Completed { .. })), "{outcomes:?}");
    let stats = journal.stats().expect("stats");
    assert_eq!(stats.sessions, SESSIONS as u64);
    assert_eq!(stats.finished_sessions, SESSIONS as u64);
    assert_eq!(stats.in_flight_activations, 0, "{stats:?}");
    assert_eq!(stats.completed_activations, 2 * SESSIONS as u64, "two activations per session, each recorded once: {stats:?}");
    assert!(stats.retried_activations <= running * 2, "only activations in flight at the kill were sent again: {stats:?}");
    eprintln!("journal after the restart: {stats:?}");
}

/// A workflow registered over the API with `--state` is registered again by a restart, even
/// when no run used it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_registered_over_the_api_survives_a_restart() {
    let echo_later = echo("echo-later");
    let (dir, state, workflow) = state_dir();
    let http = reqwest::Client::new();
    let auth = format!("Bearer {TOKEN}");
    let first = start(dir.path(), &state, &workflow);
    let resp = register(&http, &first, &echo_later).await;
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap_or_default());
    drop(first); // SIGKILL

    let second = start(dir.path(), &state, &workflow);
    let resp = http.get(second.url("/v1/workflows/echo-later")).header("authorization", &auth).send().await.expect("get");
    assert_eq!(resp.status(), 200, "the registration did not survive the restart");
    // A run of it completes on the restarted server.
    let run = start_run(&http, &second, "echo-later").await;
    let v = run_until_ended(&http, &second, &run, Duration::from_secs(120)).await;
    assert_eq!(v["state"], "completed", "{v}");
    // Registering the same text again is idempotent; another text under that name conflicts.
    assert_eq!(register(&http, &second, &echo_later).await.status(), 200);
    let other = echo_later.replace("Say something.", "Say something else.");
    assert_eq!(register(&http, &second, &other).await.status(), 409);
    // A name the journal could not key is refused before anything is registered.
    let long = echo_later.replace("name: echo-later", &format!("name: {}", "a".repeat(1100)));
    assert_eq!(register(&http, &second, &long).await.status(), 422);
    drop(second);
    let journal = Journal::open(&state).expect("journal");
    assert_eq!(journal.workflows().expect("workflows"), vec![("echo-later".to_string(), echo_later.clone())]);
}

/// Three completed runs of `sessions` sessions each of the registered one-node workflow, on a
/// server started with `args` and dropped afterwards; their ids, oldest first.
async fn three_ended_runs(http: &reqwest::Client, pool: &Path, workflow: &Path, args: &[&OsStr], sessions: usize) -> Vec<String> {
    let first = Server::start_with(pool, &[workflow], args);
    assert_eq!(register(http, &first, &echo("echo-few")).await.status(), 201);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let id = post_run(http, &first, json!({"workflow": "echo-few", "sessions": sessions})).await;
        assert_eq!(run_until_ended(http, &first, &id, Duration::from_secs(120)).await["state"], "completed");
        ids.push(id);
    }
    ids
}

/// `GET /v1/runs`: the whole answer and the listed run ids.
async fn listed_runs(http: &reqwest::Client, server: &Server) -> (Value, Vec<String>) {
    let auth = format!("Bearer {TOKEN}");
    let list: Value = http.get(server.url("/v1/runs")).header("authorization", &auth).send().await.expect("list").json().await.expect("json");
    let ids = list["runs"].as_array().expect("runs").iter().filter_map(|r| r["id"].as_str().map(String::from)).collect();
    (list, ids)
}

/// The status code of `GET /v1/runs/{id}`.
async fn run_status_code(http: &reqwest::Client, server: &Server, id: &str) -> reqwest::StatusCode {
    let auth = format!("Bearer {TOKEN}");
    http.get(server.url(&format!("/v1/runs/{id}"))).header("authorization", &auth).send().await.expect("run").status()
}

/// A restart reads back at most `--keep-runs` ended runs (the newest); older ones stay in the
/// journal only, so the server's memory does not grow with every run it ever served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reads_back_only_the_newest_ended_runs() {
    let (dir, state, workflow) = state_dir();
    let http = reqwest::Client::new();
    let pool = slow_pool(dir.path());
    let args = ["--state".as_ref(), state.as_os_str(), "--keep-runs".as_ref(), "1".as_ref()];
    let ids = three_ended_runs(&http, &pool, &workflow, &args, 1).await;
    let second = Server::start_with(&pool, &[&workflow], &args);
    let (list, listed) = listed_runs(&http, &second).await;
    assert_eq!(listed, vec![ids[2].clone()], "{list}");
    // Created by the first server: the Unix time its journal records, as before the restart.
    let created = list["runs"][0]["created_at"].as_f64().expect("created_at");
    assert_eq!(run_status_code(&http, &second, &ids[0]).await, 404);
    // The journal still holds every run.
    drop(second);
    let runs = Journal::open(&state).expect("journal").runs().expect("runs");
    assert_eq!(runs.len(), 3);
    let journaled = runs.iter().find(|r| r.run_id == ids[2]).map(|r| r.created_at_unix_ms as f64 / 1000.0);
    assert_eq!(Some(created), journaled, "{list}");
}

/// A restart reads back at most `--keep-ended` ended sessions over the ended runs it restores
/// (the newest runs whose sessions fit); older runs stay in the journal only, so a few large
/// runs cannot grow the restarted server's memory past the bound the runtime keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reads_back_at_most_keep_ended_ended_sessions() {
    let (dir, state, workflow) = state_dir();
    let http = reqwest::Client::new();
    let pool = slow_pool(dir.path());
    let args = ["--state".as_ref(), state.as_os_str(), "--keep-ended".as_ref(), "5".as_ref()];
    let ids = three_ended_runs(&http, &pool, &workflow, &args, 2).await;
    let second = Server::start_with(&pool, &[&workflow], &args);
    let (list, listed) = listed_runs(&http, &second).await;
    // The two newest runs' 4 sessions fit in 5; the oldest run's 2 more would not.
    assert_eq!(listed, vec![ids[1].clone(), ids[2].clone()], "{list}");
    let newest = run_status(&http, &second, &ids[2]).await;
    assert_eq!(newest["state"], "completed", "{newest}");
    assert_eq!(run_status_code(&http, &second, &ids[0]).await, 404);
    drop(second);
    assert_eq!(Journal::open(&state).expect("journal").runs().expect("runs").len(), 3);
}

/// Graceful stops (SIGTERM, as a deploy sends) while a run's calls still wait for a replica:
/// those calls were journaled as intended but never sent, and a stop takes their attempts
/// back, so any number of restarts leaves them their full bound (they were refused after two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_restarts_do_not_use_up_the_attempts_of_calls_never_sent() {
    let (dir, state, workflow) = state_dir();
    let http = reqwest::Client::new();
    let stop = |mut server: Server| {
        // SAFETY: a signal to our own child.
        assert_eq!(unsafe { libc::kill(server.child.id() as libc::pid_t, libc::SIGTERM) }, 0);
        let status = server.child.wait().expect("wait");
        assert!(status.code().is_some(), "a graceful stop exits on its own: {status:?}");
    };
    let first = start(dir.path(), &state, &workflow);
    let run = post_run(&http, &first, json!({"workflow": "long-pair", "sessions": 20})).await;
    // Stopped while the model still loads: every first call is journaled, none sent.
    stop(first);
    stop(start(dir.path(), &state, &workflow));
    let last = start(dir.path(), &state, &workflow);
    let v = run_until_ended(&http, &last, &run, Duration::from_secs(300)).await;
    assert_eq!((v["state"].as_str(), v.pointer("/counts/completed").and_then(Value::as_u64)), (Some("completed"), Some(20)), "{v}");
}

/// A restart no longer given a start-up workflow whose runs have all ended still starts: an
/// ended run shows its recorded outcomes and needs no workflow (such a run failed the start
/// before, and the state directory was unusable until the file was passed again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_the_workflow_of_an_ended_run_still_starts() {
    let (dir, state, workflow) = state_dir();
    let http = reqwest::Client::new();
    // A start-up workflow on a dataset file: its journaled text does not load on its own.
    let data = dir.path().join("data.jsonl");
    std::fs::write(&data, "{\"q\": \"one\"}\n{\"q\": \"two\"}\n").expect("data");
    let ds = dir.path().join("ds.yaml");
    let text = echo("ds").replace("prompt: Say something.", "prompt: \"Say {{input.q}}.\"")
        + &format!("dataset: {{file: {}, format: jsonl, fields: {{q: q}}}}\n", data.display());
    std::fs::write(&ds, text).expect("workflow");
    let pool = slow_pool(dir.path());
    let first = Server::start_with(&pool, &[&workflow, &ds], &["--state".as_ref(), state.as_os_str()]);
    let run = start_run(&http, &first, "ds").await;
    let v = run_until_ended(&http, &first, &run, Duration::from_secs(120)).await;
    assert_eq!(v["state"], "completed", "{v}");
    drop(first);
    std::fs::remove_file(&data).expect("the dataset goes away");
    let second = start(dir.path(), &state, &workflow);
    let v = run_status(&http, &second, &run).await;
    assert_eq!((v["state"].as_str(), v.pointer("/counts/completed").and_then(Value::as_u64)), (Some("completed"), Some(1)), "{v}");
}

/// `sessions: N` draws a start-up workflow's dataset records in order; a restart draws on where
/// the journaled runs left off instead of from the first record again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dataset_draws_go_on_across_a_restart() {
    let (dir, state, workflow) = state_dir();
    let http = reqwest::Client::new();
    let data = dir.path().join("data.jsonl");
    std::fs::write(&data, "{\"q\": \"a\"}\n{\"q\": \"b\"}\n{\"q\": \"c\"}\n{\"q\": \"d\"}\n").expect("data");
    let ds = dir.path().join("ds.yaml");
    let text = echo("ds").replace("prompt: Say something.", "prompt: \"Say {{input.q}}.\"")
        + &format!("dataset: {{file: {}, format: jsonl, fields: {{q: q}}}}\n", data.display());
    std::fs::write(&ds, text).expect("workflow");
    let pool = slow_pool(dir.path());
    let args = ["--state".as_ref(), state.as_os_str()];
    let first = Server::start_with(&pool, &[&workflow, &ds], &args);
    let one = post_run(&http, &first, json!({"workflow": "ds", "sessions": 2})).await;
    assert_eq!(run_until_ended(&http, &first, &one, Duration::from_secs(120)).await["state"], "completed");
    drop(first);
    let second = Server::start_with(&pool, &[&workflow, &ds], &args);
    let two = post_run(&http, &second, json!({"workflow": "ds", "sessions": 3})).await;
    assert_eq!(run_until_ended(&http, &second, &two, Duration::from_secs(120)).await["state"], "completed");
    drop(second);
    let journal = Journal::open(&state).expect("journal");
    let mut drawn: Vec<(String, String)> = Vec::new();
    for n in 1..=5 {
        let e = journal.session(n).expect("read").expect("journaled");
        drawn.push((e.run_id, e.inputs["q"].as_str().unwrap_or("?").to_string()));
    }
    let expected = [(&one, "a"), (&one, "b"), (&two, "c"), (&two, "d"), (&two, "a")];
    assert_eq!(drawn, expected.map(|(r, q)| (r.clone(), q.to_string())).to_vec());
}

/// A journaled session that cannot start at a restart (its start-up workflow now reads an
/// input field it lacks) is journaled as failed, not left to fail again at every restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_cannot_start_after_a_restart_is_journaled_as_failed() {
    let (dir, state, _) = state_dir();
    let http = reqwest::Client::new();
    let data = dir.path().join("data.jsonl");
    std::fs::write(&data, "{\"q\": \"a\", \"r\": \"b\"}\n").expect("data");
    let wf = dir.path().join("asks.yaml");
    let asks = |prompt: &str, fields: &str| {
        LONG_PAIR.replace("name: long-pair", "name: asks").replace("prompt: Draft at length.", prompt)
            + &format!("dataset: {{file: {}, format: jsonl, fields: {{{fields}}}}}\n", data.display())
    };
    std::fs::write(&wf, asks("prompt: \"Draft {{input.q}} at length.\"", "q: q")).expect("workflow");
    let first = start(dir.path(), &state, &wf);
    post_run(&http, &first, json!({"workflow": "asks", "sessions": 2})).await;
    drop(first); // SIGKILL: both sessions stay unfinished in the journal, their inputs `q` alone
    std::fs::write(&wf, asks("prompt: \"Draft {{input.q}} and {{input.r}} at length.\"", "q: q, r: r")).expect("workflow");
    drop(start(dir.path(), &state, &wf));
    let journal = Journal::open(&state).expect("journal");
    let outcomes = journal.session_outcomes().expect("outcomes");
    assert_eq!(outcomes.len(), 2, "{outcomes:?}");
    assert!(outcomes.values().all(|o| matches!(o, SessionOutcome::Failed { reason } if reason.starts_with("not started"))), "{outcomes:?}");
}

/// A cancel is journaled at run level before the sessions are told: after a `kill -9` right
/// behind the 202, the restart resumes none of the run's sessions and shows it cancelled (it
/// read `failed`, and sessions whose own end was not journaled yet ran again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_stays_cancelled_across_a_restart() {
    let (dir, state, workflow) = state_dir();
    let http = reqwest::Client::new();
    let auth = format!("Bearer {TOKEN}");
    let first = start(dir.path(), &state, &workflow);
    let run = post_run(&http, &first, json!({"workflow": "long-pair", "sessions": 5})).await;
    let resp = http.post(first.url(&format!("/v1/runs/{run}/cancel"))).header("authorization", &auth).send().await.expect("cancel");
    assert_eq!(resp.status().as_u16(), 202);
    drop(first); // SIGKILL right behind the 202
    let second = start(dir.path(), &state, &workflow);
    let v = run_status(&http, &second, &run).await;
    assert_eq!(v["state"], "cancelled", "{v}");
    assert_eq!(v.pointer("/counts/running").and_then(Value::as_u64).unwrap_or(0), 0, "nothing resumed: {v}");
    drop(second);
    let journal = Journal::open(&state).expect("journal");
    let outcomes = journal.session_outcomes().expect("outcomes");
    assert_eq!(outcomes.len(), 5, "every session ended: {outcomes:?}");
    assert!(outcomes.values().all(|o| !matches!(o, SessionOutcome::Completed { .. })), "{outcomes:?}");
}

/// A routed call (`model: switchyard-router`) of program `key`, its last when `done`: the model
/// it ran on.
async fn routed_model(http: &reqwest::Client, server: &Server, key: &str, done: bool) -> String {
    let resp = http
        .post(server.url("/v1/chat/completions"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("X-Session-ID", key)
        .header("X-Program-Done", if done { "true" } else { "false" })
        .json(&json!({"model": "switchyard-router", "messages": [{"role": "user", "content": "Tom has 5 apples and buys 3 more. How many apples does Tom have now?"}], "max_tokens": 8}))
        .send()
        .await
        .expect("routed call");
    assert_eq!(resp.status().as_u16(), 200);
    let model = resp.headers().get("x-switchyard-model").and_then(|v| v.to_str().ok()).expect("x-switchyard-model").to_string();
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["model"].as_str(), Some(model.as_str()));
    model
}

/// ORACLE's program table is durable: a routed front-door program open at a crash keeps the
/// model it was bound to. Before the kill, two programs with the same task go to different
/// models (the learner's pending decision on the first narrows its width, so it explores); a
/// fresh learner after the restart would send the second one's next call where the first went,
/// but the journal's record keeps it on its own model. A program that ended leaves no record:
/// a later program under its key is routed afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_programs_binding_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let routed = support::serve::repo().join("workflows/gsm8k-routed.yaml");
    let pool = support::serve::repo().join("workflows/pools/live-emulated.yaml");
    let http = reqwest::Client::new();
    let (first, second) = {
        let server = Server::start_with(&pool, &[&routed], &["--state".as_ref(), state.as_os_str()]);
        let first = routed_model(&http, &server, "k1", false).await;
        let second = routed_model(&http, &server, "k2", false).await;
        (first, second)
        // Dropped: SIGKILL.
    };
    assert_ne!(first, second, "the second program explores another model");
    let server = Server::start_with(&pool, &[&routed], &["--state".as_ref(), state.as_os_str()]);
    assert_eq!(routed_model(&http, &server, "k2", false).await, second, "k2 keeps its model after the restart");
    assert_eq!(routed_model(&http, &server, "k1", true).await, first);
    // k1 ended: its record goes (the planner records the end as the program's session ends).
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(server);
    let journal = Journal::open(&state).expect("journal");
    let open = journal.routed_program("k2").expect("read").expect("k2 is open in the journal");
    assert_eq!(open["model"].as_str(), Some(second.as_str()), "{open}");
    assert_eq!(journal.routed_program("k1").expect("read"), None, "k1 ended");
    // k1, kept across the first restart, ended in the second run: it awaits its verdict, on its
    // own model, and a third server takes that verdict.
    let awaited = journal.awaited_verdicts().expect("read");
    assert_eq!(awaited.iter().map(|(k, v)| (k.as_str(), v["model"].as_str())).collect::<Vec<_>>(), vec![("k1", Some(first.as_str()))]);
    drop(journal);
    let server = Server::start_with(&pool, &[&routed], &["--state".as_ref(), state.as_os_str()]);
    assert_eq!(verdict(&http, &server, "k1", 1.0).await, 200, "a kept program's verdict survives the next restart too");
}

/// `POST /v1/programs/{key}/verdict`: its status.
async fn verdict(http: &reqwest::Client, server: &Server, key: &str, success: f64) -> u16 {
    let url = server.url(&format!("/v1/programs/{key}/verdict"));
    let resp = http
        .post(url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .json(&json!({"success": success}))
        .send()
        .await
        .expect("verdict");
    resp.status().as_u16()
}

/// What the router's learner learned survives a restart: every landed verdict is journaled and
/// a restarted server teaches its learner the same. An untrained learner sends a first program
/// to the route's first model; taught that another model resolves the task and the rest do
/// not, the router sends programs there — and still does after a kill, while a server on a
/// fresh state directory starts untrained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_router_learned_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let routed = support::serve::repo().join("workflows/gsm8k-routed.yaml");
    let pool = support::serve::repo().join("workflows/pools/live-emulated.yaml");
    let http = reqwest::Client::new();
    let (untrained, target, verdicts) = {
        let server = Server::start_with(&pool, &[&routed], &["--state".as_ref(), state.as_os_str()]);
        // The first program goes to the untrained learner's first choice; the second, with the
        // first's decision pending, explores another model: that one is taught to be right.
        let untrained = routed_model(&http, &server, "a0", true).await;
        let target = routed_model(&http, &server, "a1", true).await;
        assert_ne!(untrained, target);
        let mut models = vec![untrained.clone(), target.clone()];
        for k in 2..14 {
            models.push(routed_model(&http, &server, &format!("a{k}"), true).await);
        }
        for (k, model) in models.iter().enumerate() {
            let success = if *model == target { 1.0 } else { 0.0 };
            assert_eq!(verdict(&http, &server, &format!("a{k}"), success).await, 200, "a{k}");
        }
        assert_eq!(routed_model(&http, &server, "probe-a", true).await, target, "taught: {models:?}");
        assert_eq!(verdict(&http, &server, "probe-a", 1.0).await, 200);
        // The outcomes are journaled beside the planner, not waited for: let the last land.
        tokio::time::sleep(Duration::from_millis(500)).await;
        (untrained, target, models.len() + 1)
        // Dropped: SIGKILL.
    };
    let server = Server::start_with(&pool, &[&routed], &["--state".as_ref(), state.as_os_str()]);
    assert_eq!(routed_model(&http, &server, "probe-b", true).await, target, "the restarted router relearned");
    drop(server);
    let journal = Journal::open(&state).expect("journal");
    let learned = journal.learned().expect("learned");
    assert_eq!(learned.len(), verdicts, "one row per landed verdict");
    assert!(
        learned.iter().all(|r| r["features"].is_u64() && r["context"].is_array() && r["model"].is_string() && r["dtype"].is_string()),
        "{learned:?}"
    );
    drop(journal);
    // A fresh state directory: untrained again.
    let fresh = dir.path().join("fresh");
    let server = Server::start_with(&pool, &[&routed], &["--state".as_ref(), fresh.as_os_str()]);
    assert_eq!(routed_model(&http, &server, "c0", true).await, untrained);
}

/// A verdict posted after a crash still teaches the router: routed programs that had ended and
/// awaited their verdicts at the kill are restored by the next server (their decisions pending
/// in its learner again), and each verdict lands there — 200, not 404 — as it would have before:
/// taught that one model resolves the task and the others do not, the restarted router sends the
/// next program there. A verdict lands once; a program that is given up (a later program took
/// its key after the restart) leaves no record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verdict_awaited_at_a_crash_lands_after_the_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let routed = support::serve::repo().join("workflows/gsm8k-routed.yaml");
    let pool = support::serve::repo().join("workflows/pools/live-emulated.yaml");
    let http = reqwest::Client::new();
    let (target, models) = {
        let server = Server::start_with(&pool, &[&routed], &["--state".as_ref(), state.as_os_str()]);
        let untrained = routed_model(&http, &server, "a0", true).await;
        let target = routed_model(&http, &server, "a1", true).await;
        assert_ne!(untrained, target, "the second program explores another model");
        let mut models = vec![untrained, target.clone()];
        for k in 2..14 {
            models.push(routed_model(&http, &server, &format!("a{k}"), true).await);
        }
        models.push(routed_model(&http, &server, "reused", true).await);
        // Every program has ended (its end is journaled as its session ends); no verdict yet.
        tokio::time::sleep(Duration::from_millis(500)).await;
        (target, models)
        // Dropped: SIGKILL.
    };
    {
        let journal = Journal::open(&state).expect("journal");
        assert_eq!(journal.awaited_verdicts().expect("read").len(), models.len(), "each ended program awaits its verdict");
    }
    let server = Server::start_with(&pool, &[&routed], &["--state".as_ref(), state.as_os_str()]);
    // A new program under a restored program's key gives the restored one up.
    routed_model(&http, &server, "reused", false).await;
    for (k, model) in models.iter().take(14).enumerate() {
        let success = if *model == target { 1.0 } else { 0.0 };
        assert_eq!(verdict(&http, &server, &format!("a{k}"), success).await, 200, "a{k} awaited its verdict across the kill");
    }
    assert_eq!(verdict(&http, &server, "a0", 1.0).await, 404, "a verdict lands once");
    assert_eq!(verdict(&http, &server, "never-routed", 1.0).await, 404);
    assert_eq!(verdict(&http, &server, "reused", 1.0).await, 409, "the key names the new program, still open");
    assert_eq!(routed_model(&http, &server, "probe", true).await, target, "the restored verdicts taught the learner: {models:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(server);
    let journal = Journal::open(&state).expect("journal");
    let awaited: Vec<String> = journal.awaited_verdicts().expect("read").into_iter().map(|(k, _)| k).collect();
    assert_eq!(awaited, vec!["probe".to_string()], "landed and given-up verdicts leave no record");
    assert_eq!(journal.learned().expect("learned").len(), 14, "each landed verdict is journaled as learned");
}

/// Per model and statistic, `switchyard_disc_ledger` of a server's `/metrics`.
async fn ledger_stats(http: &reqwest::Client, server: &Server) -> std::collections::BTreeMap<(String, String), f64> {
    let text = http.get(server.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    text.lines()
        .filter_map(|l| l.strip_prefix("switchyard_disc_ledger{"))
        .filter_map(|l| {
            let (labels, value) = l.split_once("} ")?;
            let label = |name: &str| labels.split(',').find_map(|kv| kv.strip_prefix(&format!("{name}=\""))?.strip_suffix('"').map(str::to_string));
            Some(((label("model")?, label("stat")?), value.trim().parse().ok()?))
        })
        .collect()
}

/// What DISC's ledgers learned survives a restart: the programs that finished taught the bound
/// models' ledgers their peak context and run time (ĉ and D̂ moved off their priors, as a fresh
/// server shows), and a restarted server's ledgers start from what was learned, not from the
/// priors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disc_ledgers_learning_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let routed = support::serve::repo().join("workflows/gsm8k-routed.yaml");
    let pool = support::serve::repo().join("workflows/pools/live-emulated.yaml");
    let http = reqwest::Client::new();
    let priors = {
        let fresh = dir.path().join("fresh");
        let server = Server::start_with(&pool, &[&routed], &["--state".as_ref(), fresh.as_os_str()]);
        routed_model(&http, &server, "warm", false).await;
        ledger_stats(&http, &server).await
    };
    let learned = {
        let server = Server::start_with(&pool, &[&routed], &["--state".as_ref(), state.as_os_str()]);
        for k in 0..6 {
            routed_model(&http, &server, &format!("l{k}"), true).await;
        }
        // The last program's end reaches the ledger, and its state the journal, beside the calls.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        ledger_stats(&http, &server).await
        // Dropped: SIGKILL.
    };
    let peak = |m: &std::collections::BTreeMap<(String, String), f64>, model: &str| m.get(&(model.to_string(), "peak_tokens".to_string())).copied();
    let moved: Vec<String> = learned
        .keys()
        .filter(|(_, stat)| stat == "peak_tokens")
        .map(|(model, _)| model.clone())
        .filter(|model| peak(&learned, model) != peak(&priors, model))
        .collect();
    assert!(!moved.is_empty(), "finished programs teach their ledgers: {learned:?} vs {priors:?}");
    let server = Server::start_with(&pool, &[&routed], &["--state".as_ref(), state.as_os_str()]);
    routed_model(&http, &server, "after", false).await;
    let restored = ledger_stats(&http, &server).await;
    for model in &moved {
        // (δ̂ is left out: the call after the restart may sample it.)
        for stat in ["peak_tokens", "run_seconds"] {
            let key = (model.clone(), stat.to_string());
            assert_eq!(restored.get(&key), learned.get(&key), "{model} {stat}: restored {restored:?}, learned {learned:?}");
        }
    }
}

/// Per model, `switchyard_routed_programs_total` of a server's `/metrics`.
async fn routed_counts(http: &reqwest::Client, server: &Server) -> std::collections::BTreeMap<String, u64> {
    let text = http.get(server.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    text.lines()
        .filter_map(|l| l.strip_prefix("switchyard_routed_programs_total{model=\""))
        .filter_map(|l| {
            let (model, rest) = l.split_once('"')?;
            Some((model.to_string(), rest.rsplit(' ').next()?.parse::<f64>().ok()? as u64))
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// A durable session of a routed workflow keeps its model across a restart: its binding is
/// journaled when it is first bound, and the resumed session is bound to it again — even though
/// the restarted router, which relearned meanwhile that another model is the right one, would
/// send every new program there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_routed_session_keeps_its_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    // gsm8k-routed with answers long enough (4,000 tokens at a fifth of the pool's speed) that
    // the sessions are still open at the kill.
    let text = std::fs::read_to_string(support::serve::repo().join("workflows/gsm8k-routed.yaml")).expect("workflow");
    let dataset = support::serve::repo().join("workflows/datasets/gsm8k/test.jsonl");
    let text = text
        .replace("max_output_tokens: 1024", "max_output_tokens: 4096")
        .replace("output_tokens: {mean: 200, cv: 0.4}", "output_tokens: {mean: 4000, cv: 0.01}")
        .replace("file: datasets/gsm8k/test.jsonl", &format!("file: {}", dataset.display()));
    assert!(text.contains("mean: 4000") && text.contains("max_output_tokens: 4096"), "the fixture changed");
    let routed = dir.path().join("gsm8k-routed.yaml");
    std::fs::write(&routed, text).expect("write workflow");
    let pool = slow_pool(dir.path());
    let http = reqwest::Client::new();
    let target = {
        let server = Server::start_with(&pool, &[&routed], &["--state".as_ref(), state.as_os_str()]);
        // Three sessions, bound at once: the untrained learner spreads them over the route.
        post_run(&http, &server, json!({"workflow": "gsm8k-routed", "sessions": 3})).await;
        // Then the front door teaches the same router that one model is right.
        let target = routed_model(&http, &server, "t0", true).await;
        let mut models = vec![target.clone()];
        for k in 1..12 {
            models.push(routed_model(&http, &server, &format!("t{k}"), true).await);
        }
        for (k, model) in models.iter().enumerate() {
            assert_eq!(verdict(&http, &server, &format!("t{k}"), if *model == target { 1.0 } else { 0.0 }).await, 200);
        }
        assert_eq!(routed_model(&http, &server, "probe", true).await, target, "taught: {models:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        target
        // Dropped: SIGKILL.
    };
    // The sessions still open at the kill, and the model each was bound to.
    let journal = Journal::open(&state).expect("journal");
    let mut recorded = std::collections::BTreeMap::<String, u64>::new();
    for u in journal.unfinished().expect("unfinished") {
        let b = journal.session_route(u.session).expect("read").expect("a bound session's route is journaled");
        *recorded.entry(b["model"].as_str().expect("model").to_string()).or_default() += 1;
    }
    drop(journal);
    assert_eq!(recorded.values().sum::<u64>(), 3, "all three sessions were open at the kill");
    assert!(recorded.keys().any(|m| *m != target), "some open session is on another model than {target}: {recorded:?}");
    let server = Server::start_with(&pool, &[&routed], &["--state".as_ref(), state.as_os_str()]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Every resumed session was bound again at the restart, each to its recorded model.
    assert_eq!(routed_counts(&http, &server).await, recorded);
    // A new program goes where the relearned router sends it.
    assert_eq!(routed_model(&http, &server, "after", true).await, target);
}
