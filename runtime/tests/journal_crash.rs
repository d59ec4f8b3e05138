//! The journal under `kill -9` (`runtime/src/live/journal.rs`): a writer process journals
//! hundreds of sessions from four threads (run, sessions, each activation's intent and result,
//! finishes) and prints an `ack` line after every call that returned; the test kills it with
//! SIGKILL mid-way, eight times, restarting it on the same directory each time (the restarted
//! writer resumes exactly as a server would: it replays completed activations, intends in-flight
//! ones again and fails those that exhausted their attempts), then lets a last one finish.
//!
//! After every kill the test reopens the journal and asserts that it passes redb's integrity
//! check, that every acknowledged write is there, and that it holds at most one unacknowledged
//! write per writer thread (the call in progress at the kill). At the end: every session finished
//! exactly once, completed activations were never sent again, an activation in flight at a kill
//! was sent again at most once, and no result was recorded twice.
//!
//! The writer is this test binary itself, re-executed with `SWITCHYARD_JOURNAL_CRASH_WRITER` set
//! (the `writer` test does nothing without it). To make the rare paths certain rather than
//! likely, the first writer parks one thread forever right after an intent (so that activation
//! is in flight at the kill) and the second parks the first thread that re-sends an activation
//! (so a third intent is refused after the next kill and the session fails).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_runtime::live::journal::{
    ActivationKind, ActivationState, Journal, JournalError, RunRecord, SessionOutcome, activation_key,
};

const WRITER_ENV: &str = "SWITCHYARD_JOURNAL_CRASH_WRITER";
/// Park the thread that makes this (global, 1-based) intent, after its ack.
const HANG_AFTER_INTENT_ENV: &str = "SWITCHYARD_JOURNAL_CRASH_HANG_AFTER_INTENT";
/// Park the first thread that gets attempt 2, after its ack.
const HANG_ON_RETRY_ENV: &str = "SWITCHYARD_JOURNAL_CRASH_HANG_ON_RETRY";

const SESSIONS: u64 = 300;
const THREADS: u64 = 4;
const RUN: &str = "crash-run";
const NODES: [(&str, ActivationKind); 3] =
    [("plan", ActivationKind::Llm), ("code", ActivationKind::Llm), ("test", ActivationKind::Tool)];

fn run_record() -> RunRecord {
    RunRecord {
        run_id: RUN.into(),
        workflow: "plan-code-test".into(),
        workflow_yaml: "name: plan-code-test\n".into(),
        sessions: SESSIONS as u32,
        created_at_unix_ms: 1_764_633_600_000,
        drawn_from: None,
    }
}

fn inputs(s: u64) -> Value {
    json!({"question": s})
}

fn digest(s: u64, key: &str) -> String {
    format!("{s}/{key}")
}

fn result(s: u64, node: usize) -> Value {
    json!({"session": s, "node": NODES[node].0, "value": s * 10 + node as u64})
}

fn output(s: u64) -> Value {
    json!(3 * s * 10 + 3)
}

// ----- the writer (child process) -----

struct Writer {
    journal: Journal,
    out: Mutex<std::io::Stdout>,
    intents: AtomicU64,
    hang_after_intent: Option<u64>,
    hang_on_retry: bool,
    retry_parked: AtomicBool,
}

impl Writer {
    fn ack(&self, line: String) {
        // A poisoned lock means another thread panicked: the process is failing anyway.
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(out, "ack {line}").expect("write ack");
        out.flush().expect("flush ack");
    }

    fn park(&self) -> ! {
        self.ack("parked - - -".into());
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }

    /// Drive session `s` to its end, skipping the activations completed already.
    fn drive(&self, s: u64, done: &BTreeSet<String>) -> Result<(), JournalError> {
        let j = &self.journal;
        for (i, (node, kind)) in NODES.iter().enumerate() {
            let key = activation_key(node, 0);
            if done.contains(&key) {
                continue;
            }
            let attempt = match j.intend(s, &key, *kind, &digest(s, &key)) {
                Ok(a) => a,
                Err(JournalError::AttemptsExhausted { attempts, .. }) => {
                    let reason = format!("{key}: sent {attempts} times without a result");
                    j.finish_session(s, &SessionOutcome::Failed { reason })?;
                    self.ack(format!("finish {s} - failed"));
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            self.ack(format!("intend {s} {key} {}", attempt.0));
            let n = self.intents.fetch_add(1, Ordering::SeqCst) + 1;
            if self.hang_after_intent == Some(n) {
                self.park();
            }
            if attempt.is_retry() && self.hang_on_retry && !self.retry_parked.swap(true, Ordering::SeqCst) {
                self.park();
            }
            // The call itself.
            std::thread::sleep(Duration::from_micros(200));
            j.complete(s, &key, &result(s, i))?;
            self.ack(format!("complete {s} {key} -"));
        }
        j.finish_session(s, &SessionOutcome::Completed { output: output(s) })?;
        self.ack(format!("finish {s} - completed"));
        Ok(())
    }

    fn thread(&self, t: u64, unfinished: &BTreeMap<u64, BTreeSet<String>>) -> Result<(), JournalError> {
        for (s, done) in unfinished.range(..).filter(|(s, _)| *s % THREADS == t) {
            self.drive(*s, done)?;
        }
        for s in (t..SESSIONS).step_by(THREADS as usize) {
            if self.journal.session(s)?.is_some() {
                continue;
            }
            self.journal.record_session(RUN, s, &inputs(s))?;
            self.ack(format!("session {s} - -"));
            self.drive(s, &BTreeSet::new())?;
        }
        Ok(())
    }
}

/// The writer's entry point: a no-op unless the crash test started this process.
#[test]
fn writer() {
    let Ok(dir) = std::env::var(WRITER_ENV) else { return };
    let journal = Journal::open(Path::new(&dir)).expect("writer: open journal");
    journal.record_run(&run_record()).expect("writer: record run");
    let w = Writer {
        journal,
        out: Mutex::new(std::io::stdout()),
        intents: AtomicU64::new(0),
        hang_after_intent: std::env::var(HANG_AFTER_INTENT_ENV).ok().and_then(|v| v.parse().ok()),
        hang_on_retry: std::env::var(HANG_ON_RETRY_ENV).is_ok(),
        retry_parked: AtomicBool::new(false),
    };
    w.ack("run - - -".into());
    // Resume: what a restarted server does with `Journal::unfinished`.
    let unfinished: BTreeMap<u64, BTreeSet<String>> = w
        .journal
        .unfinished()
        .expect("writer: unfinished")
        .into_iter()
        .map(|u| {
            assert_eq!((u.run_id.as_str(), &u.inputs), (RUN, &inputs(u.session)), "recovered session");
            (u.session, u.completed.into_iter().map(|c| c.key).collect())
        })
        .collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (w, unfinished) = (&w, &unfinished);
                scope.spawn(move || w.thread(t, unfinished))
            })
            .collect();
        for h in handles {
            h.join().expect("writer thread panicked").expect("writer: journal call failed");
        }
    });
}

// ----- the test (parent process) -----

/// What the writers acknowledged, over all their lives.
#[derive(Default)]
struct Acks {
    sessions: BTreeSet<u64>,
    /// (session, key) → the attempts acknowledged, in order.
    intents: BTreeMap<(u64, String), Vec<u32>>,
    /// (session, key) → how many results were acknowledged.
    completes: BTreeMap<(u64, String), u32>,
    /// session → the outcomes acknowledged ("completed" / "failed").
    finishes: BTreeMap<u64, Vec<String>>,
    lines: usize,
}

impl Acks {
    fn add(&mut self, line: &str) {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 5, "ack line {line:?}");
        let s: u64 = if f[2] == "-" { 0 } else { f[2].parse().expect("session number") };
        let key = f[3].to_string();
        match f[1] {
            "run" | "parked" => {}
            "session" => {
                assert!(self.sessions.insert(s), "session {s} recorded twice");
            }
            "intend" => self.intents.entry((s, key)).or_default().push(f[4].parse().expect("attempt")),
            "complete" => *self.completes.entry((s, key)).or_default() += 1,
            "finish" => self.finishes.entry(s).or_default().push(f[4].to_string()),
            other => panic!("unknown ack {other:?}"),
        }
        self.lines += 1;
    }
}

/// Start a writer on `dir`; SIGKILL it once `kill_after` more ack lines arrived (never when
/// `None`). Returns whether it was killed.
fn writer_life(dir: &Path, acks: &mut Acks, kill_after: Option<usize>, env: &[(&str, &str)]) -> bool {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new(exe);
    cmd.args(["writer", "--exact", "--nocapture", "--test-threads=1"])
        .env(WRITER_ENV, dir)
        .env_remove(HANG_AFTER_INTENT_ENV)
        .env_remove(HANG_ON_RETRY_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn writer");
    let stdout = child.stdout.take().expect("writer stdout");
    let mut seen = 0;
    let mut killed = false;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read writer stdout");
        let Some(ack) = line.strip_prefix("ack ") else { continue };
        acks.add(&format!("ack {ack}"));
        seen += 1;
        if !killed && kill_after == Some(seen) {
            // Child::kill is SIGKILL: no destructor, no flush, no unlock of anything.
            child.kill().expect("SIGKILL writer");
            killed = true;
        }
        // The lines already in the pipe when it died are acknowledged writes too: read to EOF.
    }
    let status = child.wait().expect("wait writer");
    if killed {
        assert_eq!(status.signal(), Some(libc::SIGKILL), "writer status {status:?}");
    } else {
        assert!(status.success(), "writer failed: {status:?}");
    }
    killed
}

/// Every acknowledged write is in the journal, and at most one unacknowledged one per thread and
/// kill so far (the calls in progress at each kill, committed or not before it).
fn check_after_kill(j: &Journal, acks: &Acks, round: usize, kills: u64) {
    let mut unacked: u64 = 0;
    let stats = j.stats().expect("stats");
    for s in &acks.sessions {
        let e = j.session(*s).expect("session").unwrap_or_else(|| panic!("round {round}: acked session {s} lost"));
        assert_eq!((e.run_id.as_str(), e.inputs), (RUN, inputs(*s)));
    }
    unacked += stats.sessions - acks.sessions.len() as u64;
    let mut attempts_in_journal = 0u64;
    for ((s, key), attempts) in &acks.intents {
        let acked = *attempts.iter().max().expect("one attempt at least");
        let recorded = match j.activation(*s, key).expect("activation") {
            Some(ActivationState::InFlight(i)) => i.attempt,
            Some(ActivationState::Completed(c)) => c.attempts,
            None => panic!("round {round}: acked intent {s}/{key} lost"),
        };
        assert!(recorded >= acked, "round {round}: {s}/{key} has {recorded} attempts, {acked} acked");
        attempts_in_journal += u64::from(recorded - acked);
    }
    // Intents the journal has and no ack mentions at all.
    for u in j.unfinished().expect("unfinished") {
        for i in &u.in_flight {
            if !acks.intents.contains_key(&(u.session, i.key.clone())) {
                attempts_in_journal += u64::from(i.attempt);
            }
        }
    }
    unacked += attempts_in_journal;
    for ((s, key), n) in &acks.completes {
        assert_eq!(*n, 1, "round {round}: {s}/{key} completed {n} times");
        let node = NODES.iter().position(|(name, _)| activation_key(name, 0) == *key).expect("node");
        match j.activation(*s, key).expect("activation") {
            Some(ActivationState::Completed(c)) => assert_eq!(c.result, result(*s, node)),
            other => panic!("round {round}: acked result {s}/{key} lost: {other:?}"),
        }
    }
    unacked += stats.completed_activations - acks.completes.len() as u64;
    let outcomes = j.session_outcomes().expect("outcomes");
    for (s, f) in &acks.finishes {
        assert_eq!(f.len(), 1, "round {round}: session {s} finished {f:?}");
        match (outcomes.get(s), f[0].as_str()) {
            (Some(SessionOutcome::Completed { output: o }), "completed") => assert_eq!(*o, output(*s)),
            (Some(SessionOutcome::Failed { .. }), "failed") => {}
            (other, acked) => panic!("round {round}: session {s} acked {acked}, journal has {other:?}"),
        }
    }
    unacked += outcomes.len() as u64 - acks.finishes.len() as u64;
    assert!(
        unacked <= THREADS * kills,
        "round {round}: {unacked} writes in the journal were never acknowledged ({kills} kills)"
    );
    eprintln!(
        "round {round}: {} acks; journal: {} sessions, {} finished, {} results, {} in flight, {} retried; \
         {unacked} unacknowledged writes",
        acks.lines,
        stats.sessions,
        stats.finished_sessions,
        stats.completed_activations,
        stats.in_flight_activations,
        stats.retried_activations
    );
}

#[test]
fn kill_9_under_load_loses_no_acknowledged_write_and_every_session_finishes_once() {
    if std::env::var(WRITER_ENV).is_ok() {
        return; // a writer process runs `writer` only
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("state");
    let mut acks = Acks::default();
    // Where each writer dies: after so many ack lines (it runs a little further before the
    // signal lands), with the parking that makes the rare paths certain in the first two.
    let lives: [(usize, &[(&str, &str)]); 8] = [
        (350, &[(HANG_AFTER_INTENT_ENV, "40")]),
        (300, &[(HANG_ON_RETRY_ENV, "1")]),
        (450, &[]),
        (37, &[]),
        (113, &[]),
        (201, &[]),
        (59, &[]),
        (150, &[]),
    ];
    for (round, (kill_after, env)) in lives.iter().enumerate() {
        let killed = writer_life(&dir, &mut acks, Some(*kill_after), env);
        assert!(killed, "round {round}: the writer finished before the kill; give it more work");
        let mut j = Journal::open(&dir).expect("the journal opens after kill -9");
        assert!(j.check_integrity().expect("integrity check"), "round {round}: redb had to repair the file");
        check_after_kill(&j, &acks, round, round as u64 + 1);
    }
    assert!(!writer_life(&dir, &mut acks, None, &[]), "the last writer runs to its end");

    let mut j = Journal::open(&dir).expect("final open");
    assert!(j.check_integrity().expect("integrity check"));
    check_after_kill(&j, &acks, lives.len(), lives.len() as u64);
    // Every session finished exactly once: one outcome each, nothing unfinished.
    let outcomes = j.session_outcomes().expect("outcomes");
    assert_eq!(outcomes.keys().copied().collect::<Vec<_>>(), (0..SESSIONS).collect::<Vec<_>>());
    assert!(j.unfinished().expect("unfinished").is_empty());
    let stats = j.stats().expect("stats");
    assert_eq!((stats.runs, stats.sessions, stats.finished_sessions), (1, SESSIONS, SESSIONS));
    let mut failed = 0;
    for (s, outcome) in &outcomes {
        match outcome {
            SessionOutcome::Completed { output: o } => {
                assert_eq!(*o, output(*s));
                for (i, (node, kind)) in NODES.iter().enumerate() {
                    match j.activation(*s, &activation_key(node, 0)).expect("activation") {
                        Some(ActivationState::Completed(c)) => {
                            assert_eq!((c.kind, &c.result), (*kind, &result(*s, i)));
                            assert!(c.attempts <= 2);
                        }
                        other => panic!("completed session {s}: {node} is {other:?}"),
                    }
                }
            }
            SessionOutcome::Failed { reason } => {
                failed += 1;
                let key = reason.split(':').next().expect("key in reason");
                assert!(
                    matches!(
                        j.activation(*s, key).expect("activation"),
                        Some(ActivationState::InFlight(i)) if i.attempt == 2
                    ),
                    "session {s} failed ({reason}) but {key} is not in flight at attempt 2"
                );
            }
            SessionOutcome::Cancelled => panic!("session {s} cancelled"),
        }
    }
    // Over all the writers' lives: a completed activation was never sent again, an activation was
    // sent at most twice (1, then 2 after a kill), and no result was recorded twice.
    for ((s, key), attempts) in &acks.intents {
        assert!(attempts == &[1] || attempts == &[2] || attempts == &[1, 2], "{s}/{key} attempts {attempts:?}");
    }
    assert!(acks.completes.values().all(|n| *n == 1));
    // The parked threads made both rare paths happen.
    assert!(stats.retried_activations >= 2, "retried: {}", stats.retried_activations);
    assert!(failed >= 1, "no session exhausted its attempts");
    eprintln!("{} sessions: {} completed, {failed} failed (attempts exhausted)", SESSIONS, SESSIONS - failed);
}
