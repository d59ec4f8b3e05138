//! The journal of durable sessions: what `switchyard serve --state DIR` writes so that a restart
//! on the same `DIR` resumes every unfinished session (issue 11, item 4).
//!
//! # What it owns
//!
//! One file, `DIR/journal.redb`, and the rules of what may be recorded in it:
//!
//! - **runs** ([`RunRecord`]: workflow name, its YAML, the number of sessions, creation time),
//!   keyed by run id; recording the same run again is a no-op, a different one under the same id
//!   is refused;
//! - **sessions** (run, inputs, and at most one [`SessionOutcome`] with the time it was
//!   recorded), keyed by a session number
//!   unique in the journal across runs ([`Journal::last_session`] tells a restarted server where
//!   to go on numbering); a second [`Journal::finish_session`] is refused, so no session ever
//!   ends twice;
//! - **activations** — one execution of a workflow node: an LLM call or a tool call — keyed by
//!   `(session, activation key)` where the key is unique in the session and stable across
//!   restarts ([`activation_key`]: `"{node}#{round}"`; a node that runs several times in one
//!   round needs more in its key). The kind ([`ActivationKind`]) tells LLM calls from tool calls,
//!   so tool results are journaled the same way. [`Journal::intend`] records the *intent* before
//!   the call is sent and returns its [`Attempt`]; [`Journal::complete`] records the *result* after it came back.
//!   A second result for the same key is refused and leaves the first untouched; an intent for a
//!   completed key is refused (completed activations are never re-run); an in-flight key may be
//!   intended once more after a crash (attempt 2) and a third intent is refused
//!   ([`JournalError::AttemptsExhausted`]) — the caller fails that activation instead;
//! - **routed front-door programs open now** ([`Journal::open_routed_program`],
//!   [`Journal::end_routed_program`]): a program the router bound, until it ends; read back after
//!   a restart ([`Journal::routed_program`]) so that a program open at the crash keeps its model;
//! - **routes of durable sessions** ([`Journal::record_session_route`],
//!   [`Journal::session_route`]): the deployment a routed workflow's session was bound to, so
//!   that a resumed session keeps it;
//! - **what the router learned** ([`Journal::record_learned`], [`Journal::learned`]): one row per
//!   landed verdict, the newest [`MAX_LEARNED`], relearned by a restarted server's router;
//! - **workflows registered over the API** ([`Journal::record_workflow`]): name → YAML text, so
//!   a restart registers them again whether or not a run used them; another text under a
//!   recorded name is refused;
//! - **recovery** ([`Journal::unfinished`]): every unfinished session with its run, inputs,
//!   completed activations (results in completion order) and in-flight intents; and the reads
//!   tests use to assert exactly-once completion ([`Journal::session_outcomes`],
//!   [`Journal::stats`]).
//!
//! It must not depend on the planner, the simulator or the actors: it stores keys and JSON
//! values the caller hands in and knows nothing of how sessions are driven. The server
//! integrates it (which calls to journal where, and how to replay recorded results).
//!
//! # Storage: redb, and why not SQLite
//!
//! [`redb`] 4.6: an embedded, pure-Rust, copy-on-write B-tree store in one file.
//!
//! - **Durability per commit.** Every mutating call is committed in a write transaction with
//!   [`redb::Durability::Immediate`] before it returns: redb writes the new tree and commit slot
//!   (checksummed) and `fsync`s before `commit` returns (redb's default one-phase commit with
//!   checksums: one `fsync` per commit). After a crash the newest commit slot whose checksum is
//!   valid is used, so a committed transaction survives `kill -9` (and power loss, as far as the
//!   disk honours `fsync`) and an uncommitted one leaves no trace: no torn records. SQLite in WAL
//!   mode with `synchronous=FULL` gives the same guarantee; nothing here needs more.
//! - **Build cost and no C dependency.** redb is one Rust crate depending only on `libc` (already
//!   in the tree): seconds to build, nothing to install. `rusqlite` needs either the system
//!   `libsqlite3` (plus `libsqlite3-dev` on every fresh CI machine, which `.ci/run` would have
//!   to install) or its `bundled` feature, which compiles SQLite's C amalgamation — slow on the
//!   2-core build machines.
//! - **Query needs.** Everything asked of the journal is a point lookup or a range scan by key
//!   (a session's activations are the key range `(session, ..)`), which a typed key-value store
//!   does directly; no SQL, joins or ad-hoc queries are needed. Records are JSON values (the
//!   caller's results and inputs are `serde_json::Value` already), so no schema migration tool
//!   is needed either: the file carries a schema version ([`SCHEMA_VERSION`]) and a build refuses
//!   a file of another version ([`JournalError::IncompatibleSchema`]).
//! - One process at a time: redb locks the file, so a second `serve` on the same `--state` is
//!   refused ([`JournalError::InUse`]).
//!
//! # Guarantees (and what is not guaranteed)
//!
//! - A call that **returned `Ok`** is on disk: `kill -9` of the process right after it never
//!   loses it. A call killed **before it returned** is either wholly recorded or not at all.
//! - A call that returned an error recorded nothing: a refusal (any variant but
//!   [`JournalError::Storage`], [`JournalError::Commit`], [`JournalError::Corrupt`],
//!   [`JournalError::Io`] and [`JournalError::Closed`]) because the rules forbid the write, the
//!   others because the transaction was not committed.
//! - No result is recorded twice and no session finishes twice: both are refused by the journal
//!   itself, whatever the caller does.
//! - An activation runs again **at most once** after crashes: [`MAX_ATTEMPTS`] intents per key.
//! - Not guaranteed: that a call the engine answered is not run again. A kill between the
//!   engine's answer and [`Journal::complete`] returning leaves the activation in flight; after
//!   the restart it is intended again (attempt 2) and sent again. A second kill during attempt 2
//!   exhausts it. Side effects of the call itself (a tool writing somewhere) are the tool's
//!   business: the journal records intents and results, it cannot make a call idempotent.
//! - Group commit: writes go to one committer thread, which runs every write waiting (up to
//!   256) in order in one transaction and commits it with one `fsync`, then answers each caller.
//!   Concurrent sessions therefore share flushes instead of queueing for one each; a lone caller
//!   pays one thread hand-off more. Each write checks its rules before it writes anything, so a
//!   refused write in a group leaves the others intact; a storage failure drops the whole group
//!   (every caller in it gets the error, nothing of it is recorded).
//! - What `kill -9` tests (`runtime/tests/journal_crash.rs`) can and cannot show: a killed
//!   process's written pages survive in the kernel, so they check atomicity, recovery, the
//!   exactly-once rules and the resume, not the `fsync` itself; that one is redb's
//!   (`Durability::Immediate`) and matters for power loss or a kernel crash.
//! - Calls block the calling thread until their group is on disk: from async code, call them
//!   through `tokio::task::spawn_blocking` (or `block_in_place`). [`Journal`] is `Send + Sync`;
//!   share it behind an `Arc`. Reads ([`Journal::unfinished`], [`Journal::activation`], …) see
//!   the last committed state and do not wait for the committer.
//!
//! # Cost
//!
//! Measured with `cargo bench -p switchyard-runtime --bench journal -- --warm-up-time 1
//! --measurement-time 5` (release; a tempdir on this machine's ext4 virtual disk, where a bare
//! 4 KiB write + `fsync` takes about 150 µs; two runs, while other builds shared the 2 cores, so
//! the spread is wide): criterion's median of each run.
//!
//! | operation | time |
//! | --- | --- |
//! | one LLM activation, one caller (intent + ~1 KiB result: two durable commits) | 0.74 / 0.76 ms |
//! | one tool activation, one caller (intent + small verdict) | 0.97 / 1.03 ms |
//! | one LLM activation, 8 callers at once (group commits), per activation | 0.19 / 0.26 ms |
//! | one intent alone / one result alone | 0.48–0.74 ms / 0.41–0.44 ms |
//! | a whole session: record, 3 activations, finish (8 commits) | 4.2 / 3.5 ms |
//!
//! So about 0.35–0.5 ms per durable commit and 0.7–1 ms per activation for a lone caller,
//! dominated by the flush; concurrent sessions share flushes, so the cost per activation falls
//! with load (3–4x less at 8 callers). Against LLM calls of hundreds of milliseconds to seconds
//! that is about 1 % or less. (The tool case runs after the LLM case, on a bigger file, and was
//! not cheaper despite its smaller result; not investigated.)

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

use redb::{
    Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
    TableHandle, WriteTransaction,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The journal's file inside the state directory.
pub const FILE_NAME: &str = "journal.redb";

/// The layout of the tables and records this build reads and writes. A file of another version
/// is refused at [`Journal::open`].
pub const SCHEMA_VERSION: u64 = 1;

/// Intents allowed per activation: the first run, and one more after a crash.
pub const MAX_ATTEMPTS: u32 = 2;

/// The most learned outcomes the journal keeps (the newest; a few hundred bytes each): what a
/// restart relearns is bounded however long the server ran.
pub const MAX_LEARNED: u64 = 10_000;

/// The longest activation key or program id accepted (bytes).
pub const MAX_KEY_LEN: usize = 1024;

/// `"schema_version"` → [`SCHEMA_VERSION`]; `"seq"` → the last sequence number handed out (the
/// order of intents, results and finishes).
const META: TableDefinition<&str, u64> = TableDefinition::new("switchyard_journal_meta");
/// run id → [`RunRow`] (JSON).
const RUNS: TableDefinition<&str, &str> = TableDefinition::new("runs");
/// session → [`SessionRow`] (JSON).
const SESSIONS: TableDefinition<u64, &str> = TableDefinition::new("sessions");
/// The sessions not finished yet (so recovery does not scan finished ones).
const OPEN: TableDefinition<u64, ()> = TableDefinition::new("open_sessions");
/// (session, activation key) → [`ActivationRow`] (JSON).
const ACTIVATIONS: TableDefinition<(u64, &str), &str> = TableDefinition::new("activations");
/// Earlier versions recorded every keyed front-door program's first model here (program id →
/// JSON), one row per key a client ever chose and read by nothing; opening a journal drops it.
const RETIRED_BINDINGS: TableDefinition<&str, &str> = TableDefinition::new("program_bindings");
/// Routed front-door programs open now: program key → its binding (JSON: model, verifier).
/// Written when the router binds a program, removed when the program ends, so what a restart
/// finds here were open at the crash (they keep their model); a later program under the same
/// key is routed afresh. (A table added after schema version 1: `check_or_init` creates it in
/// an older file, and an older build ignores it.)
const ROUTED: TableDefinition<&str, &str> = TableDefinition::new("routed_programs");
/// Routed front-door programs that ended and await their client's verdict: program key → what
/// the verdict teaches (JSON: session, model, dtype, verifier, the learner's context, the cost,
/// the router's features digest, when it ended). Written when the program ends (in the
/// transaction that removes its `routed_programs` record), removed when its verdict lands or
/// it is given up; a restart restores them, so a verdict posted after a crash still teaches
/// the router. (A table added after schema version 1.)
const AWAITED: TableDefinition<&str, &str> = TableDefinition::new("awaited_verdicts");
/// What each routed deployment's DISC ledger learned (ĉ, D̂, δ̂'s sums and counts): deployment
/// name (model and dtype) → JSON (model, dtype, the backend's KV capacity, the learned state),
/// rewritten as programs finish; a restart gives a ledger of the same deployment and capacity
/// its state back. (A table added after schema version 1.)
const LEDGERS: TableDefinition<&str, &str> = TableDefinition::new("ledger_stats");
/// workflow name → the YAML text it was registered with over the API (a table added after
/// schema 1 was fixed: opening an older journal creates it empty, nothing else changes).
const WORKFLOWS: TableDefinition<&str, &str> = TableDefinition::new("workflows");
/// Runs a client cancelled (run id → nothing): a restart resumes none of their sessions.
const CANCELLED: TableDefinition<&str, ()> = TableDefinition::new("cancelled_runs");
/// What the router's learner learned, in landing order: number → one landed verdict (JSON: the
/// digest of the router's features, the model, the context, the reward), the newest
/// [`MAX_LEARNED`] only. A restart teaches its learner these again. (A table added after
/// schema version 1, like `routed_programs`.)
const LEARNED: TableDefinition<u64, &str> = TableDefinition::new("learned_outcomes");
/// Durable sessions of routed workflows: session → the deployment the router bound it to
/// (JSON: model, dtype); a resumed session is bound to it again. (A table added after schema
/// version 1.)
const SESSION_ROUTES: TableDefinition<u64, &str> = TableDefinition::new("session_routes");

const META_SCHEMA: &str = "schema_version";
const META_SEQ: &str = "seq";

/// Why a journal call failed. Every variant but [`JournalError::Io`], [`JournalError::Storage`]
/// and [`JournalError::Corrupt`] is a *refusal*: nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("journal {} is open in another process (one `switchyard serve` per state directory)", path.display())]
    InUse { path: PathBuf },
    #[error(
        "refusing state directory {}: {why} (the journal holds every prompt and answer, and a server \
         restart registers the workflows it records)",
        path.display()
    )]
    NotPrivate { path: PathBuf, why: String },
    #[error(
        "journal {} has schema version {found}; this build reads version {expected} only (use the \
         Switchyard that wrote it, or start with a fresh state directory)",
        path.display()
    )]
    IncompatibleSchema { path: PathBuf, found: u64, expected: u64 },
    #[error("{} is not a Switchyard journal (it holds other tables: {tables:?})", path.display())]
    NotAJournal { path: PathBuf, tables: Vec<String> },
    #[error("journal storage: {0}")]
    Storage(#[from] redb::Error),
    #[error(
        "journal {} is damaged and cannot be repaired: {message} (move it aside to start with a fresh journal; its \
         sessions are then not resumed)",
        path.display()
    )]
    Damaged { path: PathBuf, message: String },
    #[error("journal commit failed; this write is not recorded: {message}")]
    Commit { message: String },
    #[error("the journal's committer thread is gone (it panicked or the journal is closing)")]
    Closed,
    #[error("journal record {what} cannot be read: {source}")]
    Corrupt { what: String, source: serde_json::Error },
    #[error("invalid {what} {value:?}: {why}")]
    InvalidKey { what: &'static str, value: String, why: &'static str },
    #[error("run {run_id:?} is already recorded with other contents")]
    RunConflict { run_id: String },
    #[error("workflow {name:?} is already recorded with another text")]
    WorkflowConflict { name: String },
    #[error("unknown run {0:?}")]
    UnknownRun(String),
    #[error("session {session} is already recorded with another run or other inputs (run {recorded_run:?})")]
    SessionConflict { session: u64, recorded_run: String },
    #[error("unknown session {0}")]
    UnknownSession(u64),
    #[error("session {session} already finished ({recorded}); a second finish is refused")]
    AlreadyFinished { session: u64, recorded: SessionOutcome },
    #[error("session {session} is finished ({recorded}); activation {key:?} is refused")]
    SessionFinished { session: u64, key: String, recorded: SessionOutcome },
    #[error("activation {key:?} of session {session} already has a result; it is never run or recorded again")]
    AlreadyCompleted { session: u64, key: String },
    #[error(
        "activation {key:?} of session {session} was already sent {attempts} times without a result; \
         an activation runs again at most once, so it fails"
    )]
    AttemptsExhausted { session: u64, key: String, attempts: u32 },
    #[error("activation {key:?} of session {session} has no recorded intent; record it before its result")]
    NotIntended { session: u64, key: String },
    #[error(
        "activation {key:?} of session {session} was intended as {recorded_kind} with request {recorded_digest:?}, \
         now as {kind} with request {digest:?}: the request is not the same"
    )]
    IntentMismatch {
        session: u64,
        key: String,
        recorded_kind: ActivationKind,
        recorded_digest: String,
        kind: ActivationKind,
        digest: String,
    },
}

macro_rules! storage_from {
    ($($t:ty),*) => {$(
        impl From<$t> for JournalError {
            fn from(e: $t) -> Self {
                JournalError::Storage(e.into())
            }
        }
    )*};
}
storage_from!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

/// One run as recorded: what the server needs to rebuild its sessions after a restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: String,
    pub workflow: String,
    pub workflow_yaml: String,
    pub sessions: u32,
    pub created_at_unix_ms: u64,
    /// For a run whose sessions were drawn from the workflow's dataset (`sessions: N`): the
    /// draw's position, counted from the server's first draw of that workflow, of its first
    /// session (its sessions took the next `sessions`), so a restart draws on from there
    /// instead of from the dataset's first record again. `None`: inputs were given.
    pub drawn_from: Option<u64>,
}

/// How a session ended; recorded once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum SessionOutcome {
    Completed { output: Value },
    Failed { reason: String },
    Cancelled,
}

impl fmt::Display for SessionOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionOutcome::Completed { .. } => f.write_str("completed"),
            SessionOutcome::Failed { reason } => write!(f, "failed: {reason}"),
            SessionOutcome::Cancelled => f.write_str("cancelled"),
        }
    }
}

/// What an activation executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActivationKind {
    /// A call to an LLM engine.
    Llm,
    /// A tool call.
    Tool,
}

impl fmt::Display for ActivationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ActivationKind::Llm => "an LLM call",
            ActivationKind::Tool => "a tool call",
        })
    }
}

/// The attempt an intent starts: 1 the first time, 2 when the activation was in flight at a
/// crash and is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Attempt(pub u32);

impl Attempt {
    /// Whether this send repeats one that may have reached the engine before a crash.
    pub fn is_retry(self) -> bool {
        self.0 > 1
    }
}

/// A digest of a request's content for [`Journal::intend`]: FNV-1a over its bytes, with its
/// length (stable across processes and builds; it depends on nothing but the content).
pub fn content_digest(content: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in content.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("fnv1a64:{h:016x}:{}", content.len())
}

/// The activation key stable across restarts: the node's name and the loop round.
pub fn activation_key(node: &str, round: u32) -> String {
    format!("{node}#{round}")
}

/// A completed activation as recovery hands it back.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletedActivation {
    pub key: String,
    pub kind: ActivationKind,
    /// The intents it took (1, or 2 when it was in flight at a crash).
    pub attempts: u32,
    pub result: Value,
}

/// An activation intended but without a result: it was in flight when the process died.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlightActivation {
    pub key: String,
    pub kind: ActivationKind,
    /// The attempt that was in flight; [`MAX_ATTEMPTS`] means a new intent will be refused.
    pub attempt: u32,
    pub request_digest: String,
}

/// The state of one activation.
#[derive(Debug, Clone, PartialEq)]
pub enum ActivationState {
    InFlight(InFlightActivation),
    Completed(CompletedActivation),
}

/// One session not finished yet, with what recovery needs to resume it.
#[derive(Debug, Clone, PartialEq)]
pub struct UnfinishedSession {
    pub run_id: String,
    pub session: u64,
    pub inputs: Value,
    /// In completion order.
    pub completed: Vec<CompletedActivation>,
    /// In intent order.
    pub in_flight: Vec<InFlightActivation>,
}

/// How and when one session ended ([`Journal::session_ends_of_runs`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionEnd {
    pub session: u64,
    pub outcome: SessionOutcome,
    /// When it was finished in the journal (Unix milliseconds); `None` for a session a build
    /// that did not record the time finished.
    pub finished_at_unix_ms: Option<u64>,
}

/// One session as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionEntry {
    pub run_id: String,
    pub session: u64,
    pub inputs: Value,
    pub outcome: Option<SessionOutcome>,
}

/// Counts over the whole journal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    pub runs: u64,
    pub sessions: u64,
    pub finished_sessions: u64,
    pub completed_activations: u64,
    pub in_flight_activations: u64,
    /// Activations intended twice (in flight at a crash), completed or not.
    pub retried_activations: u64,
}

/// A [`RunRecord`] without its workflow's text ([`Journal::run_heads`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RunHead {
    pub run_id: String,
    pub workflow: String,
    pub sessions: u32,
    pub created_at_unix_ms: u64,
    pub drawn_from: Option<u64>,
}

/// A [`RunRow`] read without its `workflow_yaml`.
#[derive(Debug, Deserialize)]
struct RunHeadRow {
    workflow: String,
    sessions: u32,
    created_at_unix_ms: u64,
    #[serde(default)]
    drawn_from: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct RunRow {
    workflow: String,
    workflow_yaml: String,
    sessions: u32,
    created_at_unix_ms: u64,
    /// Absent in rows written before it existed (read as `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    drawn_from: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SessionRow {
    run_id: String,
    inputs: Value,
    outcome: Option<SessionOutcome>,
    finished_seq: Option<u64>,
    /// When [`Journal::finish_session`] was called, Unix milliseconds. Absent in rows finished
    /// before it existed (read as `None`: the time is unknown), and in unfinished ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    finished_at_unix_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ActivationRow {
    kind: ActivationKind,
    request_digest: String,
    attempts: u32,
    intended_seq: u64,
    result: Option<Value>,
    completed_seq: Option<u64>,
}

impl ActivationRow {
    fn state(self, key: String) -> ActivationState {
        match self.result {
            Some(result) => ActivationState::Completed(CompletedActivation {
                key,
                kind: self.kind,
                attempts: self.attempts,
                result,
            }),
            None => ActivationState::InFlight(InFlightActivation {
                key,
                kind: self.kind,
                attempt: self.attempts,
                request_digest: self.request_digest,
            }),
        }
    }
}

fn encode<T: Serialize>(what: impl FnOnce() -> String, row: &T) -> Result<String, JournalError> {
    serde_json::to_string(row).map_err(|source| JournalError::Corrupt { what: what(), source })
}

fn decode<T: for<'de> Deserialize<'de>>(what: impl FnOnce() -> String, text: &str) -> Result<T, JournalError> {
    serde_json::from_str(text).map_err(|source| JournalError::Corrupt { what: what(), source })
}

/// Remove the awaited verdict under `key` if it is program `session`'s (inside a write).
fn forget_awaited_in(txn: &redb::WriteTransaction, key: &str, session: u64) -> Result<(), JournalError> {
    let mut awaited = txn.open_table(AWAITED)?;
    if recorded_by(&awaited, key, session, "verdict awaited by program")? {
        awaited.remove(key)?;
    }
    Ok(())
}

/// Whether the JSON row under `key` records `"session": session` (a later program under the key
/// may have replaced it; `what` names the row in errors).
fn recorded_by(table: &redb::Table<&str, &str>, key: &str, session: u64, what: &str) -> Result<bool, JournalError> {
    Ok(match table.get(key)? {
        Some(text) => {
            let v: Value = decode(|| format!("{what} {key:?}"), text.value())?;
            v.get("session").and_then(Value::as_u64) == Some(session)
        }
        None => false,
    })
}

fn check_key(what: &'static str, value: &str) -> Result<(), JournalError> {
    let why = if value.is_empty() {
        "empty"
    } else if value.len() > MAX_KEY_LEN {
        "longer than 1024 bytes"
    } else {
        return Ok(());
    };
    Err(JournalError::InvalidKey { what, value: value.chars().take(80).collect(), why })
}

/// The next sequence number (inside the caller's write transaction).
fn next_seq(txn: &WriteTransaction) -> Result<u64, JournalError> {
    let mut meta = txn.open_table(META)?;
    let seq = meta.get(META_SEQ)?.map(|g| g.value()).unwrap_or(0) + 1;
    meta.insert(META_SEQ, seq)?;
    Ok(seq)
}

/// The most writes one transaction carries (group commit).
const MAX_BATCH: usize = 256;

/// One write waiting for the committer: run it inside the batch's transaction.
trait Job: Send {
    fn run(self: Box<Self>, txn: &WriteTransaction) -> Box<dyn Done>;
    /// The batch could not even start: hand `message` back.
    fn fail(self: Box<Self>, message: &str);
}

/// A write that ran: hand its result back once the batch's commit is known.
trait Done: Send {
    /// Whether it failed in storage (the transaction may then hold part of it: the batch is not
    /// committed) rather than being refused (it wrote nothing).
    fn broke_storage(&self) -> bool;
    fn deliver(self: Box<Self>, commit: Result<(), &str>);
}

struct PendingWrite<R, F> {
    op: F,
    reply: mpsc::SyncSender<Result<R, JournalError>>,
}

struct RanWrite<R> {
    result: Result<R, JournalError>,
    reply: mpsc::SyncSender<Result<R, JournalError>>,
}

impl<R, F> Job for PendingWrite<R, F>
where
    R: Send + 'static,
    F: FnOnce(&WriteTransaction) -> Result<R, JournalError> + Send,
{
    fn run(self: Box<Self>, txn: &WriteTransaction) -> Box<dyn Done> {
        let PendingWrite { op, reply } = *self;
        Box::new(RanWrite { result: op(txn), reply })
    }

    fn fail(self: Box<Self>, message: &str) {
        // A caller that went away does not need its answer.
        let _ = self.reply.send(Err(JournalError::Commit { message: message.to_string() }));
    }
}

impl<R: Send> Done for RanWrite<R> {
    fn broke_storage(&self) -> bool {
        matches!(self.result, Err(JournalError::Storage(_) | JournalError::Corrupt { .. }))
    }

    fn deliver(self: Box<Self>, commit: Result<(), &str>) {
        let result = match (self.result, commit) {
            // A refusal stays a refusal whatever happened to the batch: it wrote nothing.
            (Err(e), _) => Err(e),
            (Ok(r), Ok(())) => Ok(r),
            (Ok(_), Err(message)) => Err(JournalError::Commit { message: message.to_string() }),
        };
        // A caller that went away does not need its answer.
        let _ = self.reply.send(result);
    }
}

/// The thread that commits: it takes every write waiting (up to [`MAX_BATCH`]), runs them in
/// order in one transaction, commits it durably once, then answers each caller.
fn committer(db: Arc<Database>, jobs: mpsc::Receiver<Box<dyn Job>>) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let txn = db.begin_write().map_err(redb::Error::from).and_then(|mut txn| {
            txn.set_durability(Durability::Immediate)?;
            Ok(txn)
        });
        let txn = match txn {
            Ok(txn) => txn,
            Err(e) => {
                let message = e.to_string();
                batch.into_iter().for_each(|job| job.fail(&message));
                continue;
            }
        };
        let ran: Vec<Box<dyn Done>> = batch.into_iter().map(|job| job.run(&txn)).collect();
        let commit = if let Some(broken) = ran.iter().position(|d| d.broke_storage()) {
            // Dropping the transaction aborts it: nothing of the batch is written.
            drop(txn);
            Err(format!("another write of the same group commit (number {broken}) failed in storage"))
        } else {
            txn.commit().map_err(|e| e.to_string())
        };
        for done in ran {
            done.deliver(commit.as_ref().map(|_| ()).map_err(String::as_str));
        }
    }
}

/// The durable journal of one state directory. See the module doc for the rules.
pub struct Journal {
    db: Arc<Database>,
    path: PathBuf,
    /// To the committer thread; `None` only while [`Journal::check_integrity`] runs or after
    /// drop.
    jobs: Option<mpsc::Sender<Box<dyn Job>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// See [`Journal::notes`].
    notes: Vec<String>,
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.stop_committer();
    }
}

impl fmt::Debug for Journal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Journal").field("path", &self.path).finish()
    }
}

impl Journal {
    /// Open the journal of state directory `dir`, creating the directory and `dir/journal.redb`
    /// when absent. A file another process holds open is refused ([`JournalError::InUse`]), a
    /// file of another schema version too ([`JournalError::IncompatibleSchema`]), and a redb
    /// file that is no journal ([`JournalError::NotAJournal`]). A journal left by a crash opens
    /// at its last committed transaction. The journal holds every prompt, input and answer, so
    /// a directory it creates is its owner's alone (0700) and the file is too (0600, tightened
    /// when an existing one is wider). A directory or file that is not the running user's, a
    /// directory other users may write (they could swap the file), or a journal path that is
    /// not a regular file (a link) is refused ([`JournalError::NotPrivate`]): another local
    /// user could otherwise read every answer, or plant workflows a restart would register.
    pub fn open(dir: &Path) -> Result<Journal, JournalError> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
        let io = |source| JournalError::Io { path: dir.to_path_buf(), source };
        fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io)?;
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        let refuse = |why: String| JournalError::NotPrivate { path: dir.to_path_buf(), why };
        let meta = fs::metadata(dir).map_err(io)?;
        if meta.uid() != me {
            return Err(refuse(format!("it belongs to uid {}, not to this user (uid {me})", meta.uid())));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(refuse(format!(
                "other users may write in it (mode {:o}); make it this user's alone (chmod 700)",
                meta.mode() & 0o777
            )));
        }
        let path = dir.join(FILE_NAME);
        let existing = match fs::symlink_metadata(&path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(JournalError::Io { path: path.clone(), source: e }),
        };
        let existed = existing.is_some();
        let empty = existing.as_ref().is_some_and(|m| m.len() == 0);
        let file_io = |source| JournalError::Io { path: path.clone(), source };
        if let Some(m) = existing {
            if !m.file_type().is_file() {
                return Err(refuse(format!("{FILE_NAME} is not a regular file (a link or another kind of file)")));
            }
            if m.uid() != me {
                return Err(refuse(format!("{FILE_NAME} belongs to uid {}, not to this user (uid {me})", m.uid())));
            }
            let mode = m.permissions().mode();
            if mode & 0o077 != 0 {
                fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o700)).map_err(file_io)?;
            }
        } else {
            fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).map_err(file_io)?;
        }
        // redb trusts its pages: a few damaged bytes in a B-tree page made it panic (in the
        // restore's reads; in a debug build already while opening). Opening and the check of
        // every page and checksum below run under `catch_unwind`, and a panic in either words
        // the same refusal as a damage the check reports.
        let damaged = |message: String| JournalError::Damaged { path: path.clone(), message };
        let unreadable = || damaged("its pages cannot be read (the storage library failed on them)".into());
        let mut db = std::panic::catch_unwind(|| Database::create(&path))
            .map_err(|_| unreadable())?
            .map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => JournalError::InUse { path: path.clone() },
                other => JournalError::from(other),
            })?;
        let mut notes = Vec::new();
        if empty {
            notes.push(format!("{} was an empty file: a new journal begins in it (nothing to restore)", path.display()));
        } else if existed {
            let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| db.check_integrity()));
            match checked {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => notes.push(format!(
                    "{} was damaged; redb repaired it by rolling back to its last valid commit (what was committed after it is lost)",
                    path.display()
                )),
                // Only a corruption is the file's: an I/O error (a full disk while redb writes a
                // repair, a read error) says nothing against the journal, and moving it aside
                // would lose its sessions.
                Ok(Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(m)))) => return Err(damaged(m)),
                Ok(Err(other)) => return Err(JournalError::from(other)),
                Err(_) => {
                    // Half through a repair, redb's own close could write or panic again: the
                    // process ends on this error, and the OS releases the file.
                    std::mem::forget(db);
                    return Err(unreadable());
                }
            }
        }
        if !existed {
            // The new file's directory entry must survive a crash too.
            fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        }
        let mut journal = Journal { db: Arc::new(db), path, jobs: None, thread: None, notes };
        journal.check_or_init()?;
        journal.start_committer()?;
        Ok(journal)
    }

    fn start_committer(&mut self) -> Result<(), JournalError> {
        let (tx, rx) = mpsc::channel();
        let db = self.db.clone();
        let thread = std::thread::Builder::new()
            .name("journal-commit".into())
            .spawn(move || committer(db, rx))
            .map_err(|source| JournalError::Io { path: self.path.clone(), source })?;
        self.jobs = Some(tx);
        self.thread = Some(thread);
        Ok(())
    }

    /// Close the channel (the committer finishes what is queued) and wait for the thread.
    fn stop_committer(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            // A committer that panicked has answered nobody since; nothing more to do here.
            let _ = thread.join();
        }
    }

    /// The journal's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What [`Journal::open`] found worth telling the operator: an empty file taken as a new
    /// journal, a damaged one redb repaired. Empty for a journal that opened as it was left.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Check every page and checksum of the file again (a full read; [`Journal::open`] runs the
    /// same check on every existing file before anything is read). `Ok(true)`: consistent; `Ok(false)`: it was not and redb
    /// repaired it (rolled back to the last valid commit); an error: it cannot be repaired. A
    /// crash never needs this: [`Journal::open`] recovers the last committed transaction itself.
    pub fn check_integrity(&mut self) -> Result<bool, JournalError> {
        self.stop_committer();
        let checked = match Arc::get_mut(&mut self.db) {
            Some(db) => db.check_integrity().map_err(JournalError::from),
            None => Err(JournalError::Commit { message: "the committer thread still holds the database".into() }),
        };
        self.start_committer()?;
        checked
    }

    fn check_or_init(&self) -> Result<(), JournalError> {
        let txn = self.db.begin_write()?;
        let tables: Vec<String> = txn.list_tables()?.map(|t| t.name().to_string()).collect();
        if tables.iter().any(|t| t == META.name()) {
            let found = txn.open_table(META)?.get(META_SCHEMA)?.map(|g| g.value());
            match found {
                Some(SCHEMA_VERSION) => {}
                Some(found) => {
                    return Err(JournalError::IncompatibleSchema {
                        path: self.path.clone(),
                        found,
                        expected: SCHEMA_VERSION,
                    });
                }
                None => return Err(JournalError::NotAJournal { path: self.path.clone(), tables }),
            }
        } else if !tables.is_empty() {
            return Err(JournalError::NotAJournal { path: self.path.clone(), tables });
        }
        // Fresh (or created by a process killed before this commit): make every table, so reads
        // never meet a missing one. Opening existing tables changes nothing.
        txn.open_table(META)?.insert(META_SCHEMA, SCHEMA_VERSION)?;
        txn.open_table(RUNS)?;
        txn.open_table(SESSIONS)?;
        txn.open_table(OPEN)?;
        txn.open_table(ACTIVATIONS)?;
        txn.delete_table(RETIRED_BINDINGS)?;
        txn.open_table(ROUTED)?;
        txn.open_table(AWAITED)?;
        txn.open_table(LEDGERS)?;
        txn.open_table(WORKFLOWS)?;
        txn.open_table(CANCELLED)?;
        txn.open_table(LEARNED)?;
        txn.open_table(SESSION_ROUTES)?;
        txn.commit()?;
        Ok(())
    }

    /// Run `f` in a durable write transaction and wait until it is committed (and `fsync`ed).
    /// `f` must check everything before it writes: when it returns an error it must have
    /// written nothing, because the transaction is shared with the other writes of its group
    /// commit. (A storage error part-way is the exception: then the whole group is dropped.)
    fn write<R, F>(&self, f: F) -> Result<R, JournalError>
    where
        R: Send + 'static,
        F: FnOnce(&WriteTransaction) -> Result<R, JournalError> + Send + 'static,
    {
        let (reply, answer) = mpsc::sync_channel(1);
        let jobs = self.jobs.as_ref().ok_or(JournalError::Closed)?;
        jobs.send(Box::new(PendingWrite { op: f, reply })).map_err(|_| JournalError::Closed)?;
        answer.recv().map_err(|_| JournalError::Closed)?
    }

    fn read(&self) -> Result<ReadTransaction, JournalError> {
        Ok(self.db.begin_read()?)
    }

    // ----- runs -----

    /// Record a run. Recording the same run again is a no-op (a restarted server may repeat
    /// it); a different run under a recorded id is refused.
    pub fn record_run(&self, run: &RunRecord) -> Result<(), JournalError> {
        self.record_run_with_sessions(run, Vec::new())
    }

    /// The run recorded under `run_id`.
    pub fn run(&self, run_id: &str) -> Result<Option<RunRecord>, JournalError> {
        let txn = self.read()?;
        let runs = txn.open_table(RUNS)?;
        let Some(text) = runs.get(run_id)? else { return Ok(None) };
        let row: RunRow = decode(|| format!("run {run_id:?}"), text.value())?;
        Ok(Some(run_record(run_id, row)))
    }

    /// Every recorded run, by id, without its workflow's text (a restart reads every run; the
    /// texts, up to a request body each, are read only for the runs that need them: [`Self::run`]).
    pub fn run_heads(&self) -> Result<Vec<RunHead>, JournalError> {
        // The text is skipped by the decoder (a field `RunHeadRow` does not have), not copied.
        self.scan_runs(|run_id, row: RunHeadRow| RunHead {
            run_id: run_id.to_string(),
            workflow: row.workflow,
            sessions: row.sessions,
            created_at_unix_ms: row.created_at_unix_ms,
            drawn_from: row.drawn_from,
        })
    }

    /// Every recorded run, by id, with its workflow's text.
    pub fn runs(&self) -> Result<Vec<RunRecord>, JournalError> {
        self.scan_runs(|run_id, row: RunRow| run_record(run_id, row))
    }

    /// Every row of the runs table decoded as `R`, by id, and mapped by `f`.
    fn scan_runs<R: serde::de::DeserializeOwned, T>(&self, f: impl Fn(&str, R) -> T) -> Result<Vec<T>, JournalError> {
        let txn = self.read()?;
        let runs = txn.open_table(RUNS)?;
        let mut out = Vec::new();
        for entry in runs.iter()? {
            let (id, text) = entry?;
            let row: R = decode(|| format!("run {:?}", id.value()), text.value())?;
            out.push(f(id.value(), row));
        }
        Ok(out)
    }

    // ----- workflows -----

    /// Record a workflow registered over the API with its YAML text, so a restart registers it
    /// again. The same text again is a no-op; another text under a recorded name is refused.
    pub fn record_workflow(&self, name: &str, yaml: &str) -> Result<(), JournalError> {
        check_key("workflow name", name)?;
        let (name, yaml) = (name.to_string(), yaml.to_string());
        self.write(move |txn| {
            let mut workflows = txn.open_table(WORKFLOWS)?;
            if let Some(old) = workflows.get(name.as_str())? {
                return if old.value() == yaml { Ok(()) } else { Err(JournalError::WorkflowConflict { name: name.clone() }) };
            }
            workflows.insert(name.as_str(), yaml.as_str())?;
            Ok(())
        })
    }

    /// The YAML text workflow `name` was recorded with, if it was.
    pub fn workflow(&self, name: &str) -> Result<Option<String>, JournalError> {
        let txn = self.read()?;
        let workflows = txn.open_table(WORKFLOWS)?;
        Ok(workflows.get(name)?.map(|t| t.value().to_string()))
    }

    /// Every workflow recorded with [`Journal::record_workflow`]: (name, YAML text), by name.
    pub fn workflows(&self) -> Result<Vec<(String, String)>, JournalError> {
        let txn = self.read()?;
        let workflows = txn.open_table(WORKFLOWS)?;
        let mut out = Vec::new();
        for entry in workflows.iter()? {
            let (name, text) = entry?;
            out.push((name.value().to_string(), text.value().to_string()));
        }
        Ok(out)
    }

    /// [`Self::record_run`] and [`Self::record_session`] of each of `sessions` (number, inputs)
    /// in one transaction: a crash leaves the whole run or none of it, never a run with some of
    /// its sessions that its client was never told about. Refused as those are, before anything
    /// is written.
    pub fn record_run_with_sessions(&self, run: &RunRecord, sessions: Vec<(u64, Value)>) -> Result<(), JournalError> {
        check_key("run id", &run.run_id)?;
        let row = RunRow {
            workflow: run.workflow.clone(),
            workflow_yaml: run.workflow_yaml.clone(),
            sessions: run.sessions,
            created_at_unix_ms: run.created_at_unix_ms,
            drawn_from: run.drawn_from,
        };
        let run_id = run.run_id.clone();
        self.write(move |txn| {
            let run_id = run_id.as_str();
            let mut runs = txn.open_table(RUNS)?;
            let run_known = match runs.get(run_id)? {
                Some(old) => {
                    let old: RunRow = decode(|| format!("run {run_id:?}"), old.value())?;
                    if old != row {
                        return Err(JournalError::RunConflict { run_id: run_id.to_string() });
                    }
                    true
                }
                None => false,
            };
            let mut table = txn.open_table(SESSIONS)?;
            let mut new = Vec::with_capacity(sessions.len());
            for (session, inputs) in sessions {
                if let Some(old) = table.get(session)? {
                    let old: SessionRow = decode(|| format!("session {session}"), old.value())?;
                    if old.run_id != run_id || old.inputs != inputs {
                        return Err(JournalError::SessionConflict { session, recorded_run: old.run_id });
                    }
                    continue;
                }
                let row = SessionRow { run_id: run_id.to_string(), inputs, outcome: None, finished_seq: None, finished_at_unix_ms: None };
                new.push((session, encode(|| format!("session {session}"), &row)?));
            }
            if !run_known {
                let text = encode(|| format!("run {run_id:?}"), &row)?;
                runs.insert(run_id, text.as_str())?;
            }
            let mut open = txn.open_table(OPEN)?;
            for (session, text) in new {
                table.insert(session, text.as_str())?;
                open.insert(session, ())?;
            }
            Ok(())
        })
    }

    /// Record that a client cancelled run `run_id` (before its sessions are told): a restart
    /// then finishes its unfinished sessions as cancelled instead of resuming them, and shows
    /// the run as cancelled. Cancelling again is a no-op; an unknown run is refused.
    pub fn cancel_run(&self, run_id: &str) -> Result<(), JournalError> {
        check_key("run id", run_id)?;
        let run_id = run_id.to_string();
        self.write(move |txn| {
            if txn.open_table(RUNS)?.get(run_id.as_str())?.is_none() {
                return Err(JournalError::UnknownRun(run_id));
            }
            txn.open_table(CANCELLED)?.insert(run_id.as_str(), ())?;
            Ok(())
        })
    }

    /// The runs a client cancelled.
    pub fn cancelled_runs(&self) -> Result<BTreeSet<String>, JournalError> {
        let txn = self.read()?;
        let table = txn.open_table(CANCELLED)?;
        let mut out = BTreeSet::new();
        for entry in table.iter()? {
            out.insert(entry?.0.value().to_string());
        }
        Ok(out)
    }

    // ----- sessions -----

    /// Record a session of a recorded run with its inputs. Recording it again with the same run
    /// and inputs is a no-op; with others it is refused.
    pub fn record_session(&self, run_id: &str, session: u64, inputs: &Value) -> Result<(), JournalError> {
        let (run_id, inputs) = (run_id.to_string(), inputs.clone());
        self.write(move |txn| {
            let (run_id, inputs) = (run_id.as_str(), &inputs);
            if txn.open_table(RUNS)?.get(run_id)?.is_none() {
                return Err(JournalError::UnknownRun(run_id.to_string()));
            }
            let mut sessions = txn.open_table(SESSIONS)?;
            if let Some(old) = sessions.get(session)? {
                let old: SessionRow = decode(|| format!("session {session}"), old.value())?;
                return if old.run_id == run_id && old.inputs == *inputs {
                    Ok(())
                } else {
                    Err(JournalError::SessionConflict { session, recorded_run: old.run_id })
                };
            }
            let row =
                SessionRow {
                    run_id: run_id.to_string(),
                    inputs: inputs.clone(),
                    outcome: None,
                    finished_seq: None,
                    finished_at_unix_ms: None,
                };
            let text = encode(|| format!("session {session}"), &row)?;
            sessions.insert(session, text.as_str())?;
            txn.open_table(OPEN)?.insert(session, ())?;
            Ok(())
        })
    }

    /// Record how a session ended, and when (now: the time of this call, in Unix
    /// milliseconds, [`SessionEnd::finished_at_unix_ms`]). A second finish is refused
    /// ([`JournalError::AlreadyFinished`], carrying the recorded outcome) and changes nothing.
    pub fn finish_session(&self, session: u64, outcome: &SessionOutcome) -> Result<(), JournalError> {
        let outcome = outcome.clone();
        let now_ms = unix_ms_now();
        self.write(move |txn| {
            let mut sessions = txn.open_table(SESSIONS)?;
            let mut row: SessionRow = match sessions.get(session)? {
                Some(text) => decode(|| format!("session {session}"), text.value())?,
                None => return Err(JournalError::UnknownSession(session)),
            };
            if let Some(recorded) = row.outcome {
                return Err(JournalError::AlreadyFinished { session, recorded });
            }
            let seq = next_seq(txn)?;
            row.outcome = Some(outcome);
            row.finished_seq = Some(seq);
            row.finished_at_unix_ms = Some(now_ms);
            let text = encode(|| format!("session {session}"), &row)?;
            sessions.insert(session, text.as_str())?;
            txn.open_table(OPEN)?.remove(session)?;
            Ok(())
        })
    }

    /// One recorded session.
    pub fn session(&self, session: u64) -> Result<Option<SessionEntry>, JournalError> {
        let txn = self.read()?;
        let sessions = txn.open_table(SESSIONS)?;
        let Some(text) = sessions.get(session)? else { return Ok(None) };
        let row: SessionRow = decode(|| format!("session {session}"), text.value())?;
        Ok(Some(SessionEntry { run_id: row.run_id, session, inputs: row.inputs, outcome: row.outcome }))
    }

    /// The highest session number recorded, so a restarted server numbers new sessions after it
    /// (session numbers are unique in the journal, across runs).
    pub fn last_session(&self) -> Result<Option<u64>, JournalError> {
        let txn = self.read()?;
        let sessions = txn.open_table(SESSIONS)?;
        Ok(sessions.last()?.map(|(s, _)| s.value()))
    }

    /// The outcome of every finished session, by session. A session appears here at most once
    /// by construction; tests compare it with the sessions they started.
    pub fn session_outcomes(&self) -> Result<BTreeMap<u64, SessionOutcome>, JournalError> {
        let txn = self.read()?;
        let sessions = txn.open_table(SESSIONS)?;
        let mut out = BTreeMap::new();
        for entry in sessions.iter()? {
            let (session, text) = entry?;
            let session = session.value();
            let row: SessionRow = decode(|| format!("session {session}"), text.value())?;
            if let Some(outcome) = row.outcome {
                out.insert(session, outcome);
            }
        }
        Ok(out)
    }

    /// The ended sessions of the runs in `runs`, grouped by run, in one scan (a restart reads
    /// this instead of one lookup per ended session): the other runs' outcomes are decoded one
    /// at a time and dropped, never held together (a restart reads back only the runs it keeps).
    pub fn session_outcomes_of_runs(
        &self,
        runs: &BTreeSet<String>,
    ) -> Result<BTreeMap<String, Vec<(u64, SessionOutcome)>>, JournalError> {
        Ok(self
            .session_ends_of_runs(runs)?
            .into_iter()
            .map(|(run, ends)| (run, ends.into_iter().map(|e| (e.session, e.outcome)).collect()))
            .collect())
    }

    /// [`Self::session_outcomes_of_runs`] with when each session ended.
    pub fn session_ends_of_runs(&self, runs: &BTreeSet<String>) -> Result<BTreeMap<String, Vec<SessionEnd>>, JournalError> {
        let txn = self.read()?;
        let sessions = txn.open_table(SESSIONS)?;
        let mut out: BTreeMap<String, Vec<SessionEnd>> = BTreeMap::new();
        for entry in sessions.iter()? {
            let (session, text) = entry?;
            let session = session.value();
            let row: SessionRow = decode(|| format!("session {session}"), text.value())?;
            if let Some(outcome) = row.outcome.filter(|_| runs.contains(&row.run_id)) {
                let end = SessionEnd { session, outcome, finished_at_unix_ms: row.finished_at_unix_ms };
                out.entry(row.run_id).or_default().push(end);
            }
        }
        Ok(out)
    }

    /// How many ended sessions each run has, in one scan (no outcome is kept).
    pub fn ended_counts_by_run(&self) -> Result<BTreeMap<String, usize>, JournalError> {
        let txn = self.read()?;
        let sessions = txn.open_table(SESSIONS)?;
        let mut out: BTreeMap<String, usize> = BTreeMap::new();
        for entry in sessions.iter()? {
            let (session, text) = entry?;
            let session = session.value();
            let row: SessionRow = decode(|| format!("session {session}"), text.value())?;
            if row.outcome.is_some() {
                *out.entry(row.run_id).or_default() += 1;
            }
        }
        Ok(out)
    }

    // ----- activations -----

    /// Record the intent to send activation `key` of `session` (an LLM or tool call whose request
    /// has digest `request_digest`), before it is sent; returns the attempt it starts.
    ///
    /// - first intent: attempt 1;
    /// - an intent for an activation in flight (intended, no result: the process died while it
    ///   ran): attempt 2, provided kind and digest are the ones recorded
    ///   ([`JournalError::IntentMismatch`] otherwise: the digest must depend on the request's
    ///   content only, never on the clock);
    /// - refused: a third intent ([`JournalError::AttemptsExhausted`]: fail the activation), a
    ///   completed activation ([`JournalError::AlreadyCompleted`]: use its recorded result), a
    ///   finished or unknown session.
    ///
    /// One intent per process lifetime: retries of a call inside one process (the replica
    /// actor's retry policy) belong to the same attempt.
    pub fn intend(
        &self,
        session: u64,
        key: &str,
        kind: ActivationKind,
        request_digest: &str,
    ) -> Result<Attempt, JournalError> {
        check_key("activation key", key)?;
        let (key, request_digest) = (key.to_string(), request_digest.to_string());
        self.write(move |txn| {
            let (key, request_digest) = (key.as_str(), request_digest.as_str());
            open_session(txn, session, key)?;
            let mut acts = txn.open_table(ACTIVATIONS)?;
            let old: Option<ActivationRow> = match acts.get((session, key))? {
                Some(text) => Some(decode(|| format!("activation {key:?} of session {session}"), text.value())?),
                None => None,
            };
            let row = match old {
                None => ActivationRow {
                    kind,
                    request_digest: request_digest.to_string(),
                    attempts: 1,
                    intended_seq: next_seq(txn)?,
                    result: None,
                    completed_seq: None,
                },
                Some(row) if row.result.is_some() => {
                    return Err(JournalError::AlreadyCompleted { session, key: key.to_string() });
                }
                Some(row) if row.kind != kind || row.request_digest != request_digest => {
                    return Err(JournalError::IntentMismatch {
                        session,
                        key: key.to_string(),
                        recorded_kind: row.kind,
                        recorded_digest: row.request_digest,
                        kind,
                        digest: request_digest.to_string(),
                    });
                }
                Some(row) if row.attempts >= MAX_ATTEMPTS => {
                    return Err(JournalError::AttemptsExhausted {
                        session,
                        key: key.to_string(),
                        attempts: row.attempts,
                    });
                }
                Some(row) => ActivationRow { attempts: row.attempts + 1, ..row },
            };
            let text = encode(|| format!("activation {key:?} of session {session}"), &row)?;
            acts.insert((session, key), text.as_str())?;
            Ok(Attempt(row.attempts))
        })
    }

    /// Take back one attempt of activation `key` of `session` that was intended but never sent
    /// (an LLM call still queued for a replica when the server stopped gracefully), so that a
    /// restart does not count it: at most the attempts actually sent count against
    /// [`MAX_ATTEMPTS`]. A completed activation, an unknown one, or one whose attempts are all
    /// taken back is left as it is; a finished or unknown session is refused.
    pub fn withdraw(&self, session: u64, key: &str) -> Result<(), JournalError> {
        check_key("activation key", key)?;
        let key = key.to_string();
        self.write(move |txn| {
            let key = key.as_str();
            open_session(txn, session, key)?;
            let mut acts = txn.open_table(ACTIVATIONS)?;
            let row: Option<ActivationRow> = match acts.get((session, key))? {
                Some(text) => Some(decode(|| format!("activation {key:?} of session {session}"), text.value())?),
                None => None,
            };
            if let Some(row) = row.filter(|r| r.result.is_none() && r.attempts > 0) {
                let row = ActivationRow { attempts: row.attempts - 1, ..row };
                let text = encode(|| format!("activation {key:?} of session {session}"), &row)?;
                acts.insert((session, key), text.as_str())?;
            }
            Ok(())
        })
    }

    /// Record the result of activation `key` of `session`, after it came back. Refused: a second
    /// result ([`JournalError::AlreadyCompleted`]; the first stays), a result without intent
    /// ([`JournalError::NotIntended`]), a finished or unknown session.
    pub fn complete(&self, session: u64, key: &str, result: &Value) -> Result<(), JournalError> {
        check_key("activation key", key)?;
        let (key, result) = (key.to_string(), result.clone());
        self.write(move |txn| {
            let key = key.as_str();
            open_session(txn, session, key)?;
            let mut acts = txn.open_table(ACTIVATIONS)?;
            let mut row: ActivationRow = match acts.get((session, key))? {
                Some(text) => decode(|| format!("activation {key:?} of session {session}"), text.value())?,
                None => return Err(JournalError::NotIntended { session, key: key.to_string() }),
            };
            if row.result.is_some() {
                return Err(JournalError::AlreadyCompleted { session, key: key.to_string() });
            }
            row.result = Some(result);
            row.completed_seq = Some(next_seq(txn)?);
            let text = encode(|| format!("activation {key:?} of session {session}"), &row)?;
            acts.insert((session, key), text.as_str())?;
            Ok(())
        })
    }

    /// The state of one activation (`None`: never intended).
    pub fn activation(&self, session: u64, key: &str) -> Result<Option<ActivationState>, JournalError> {
        let txn = self.read()?;
        let acts = txn.open_table(ACTIVATIONS)?;
        let Some(text) = acts.get((session, key))? else { return Ok(None) };
        let row: ActivationRow = decode(|| format!("activation {key:?} of session {session}"), text.value())?;
        Ok(Some(row.state(key.to_string())))
    }

    // ----- front-door programs -----

    /// Routed front-door program `key` is open, bound to `binding` (replacing what an earlier
    /// program under that key left, if anything: its open record, or its awaited verdict — a
    /// key names one program at a time, so the earlier one is given up).
    pub fn open_routed_program(&self, key: &str, binding: &Value) -> Result<(), JournalError> {
        check_key("program id", key)?;
        let text = encode(|| format!("routing of program {key:?}"), binding)?;
        let key = key.to_string();
        self.write(move |txn| {
            txn.open_table(ROUTED)?.insert(key.as_str(), text.as_str())?;
            txn.open_table(AWAITED)?.remove(key.as_str())?;
            Ok(())
        })
    }

    /// The routed front-door program under `key` that was recorded with `"session": session`
    /// ended: its record goes, so a later program under the key is routed afresh. A record a
    /// later program under the key wrote meanwhile (its `session` differs) stays. With
    /// `awaiting` (it ended well and awaits its verdict; it should carry `"session": session`),
    /// that is recorded under the key in the same transaction ([`Journal::awaited_verdicts`]) —
    /// only while the key's open record is this program's (a later program under the key has
    /// given this one up).
    pub fn end_routed_program(&self, key: &str, session: u64, awaiting: Option<&Value>) -> Result<(), JournalError> {
        check_key("program id", key)?;
        let awaiting = awaiting.map(|v| encode(|| format!("verdict awaited by program {key:?}"), v)).transpose()?;
        let key = key.to_string();
        self.write(move |txn| {
            let mut routed = txn.open_table(ROUTED)?;
            let ours = recorded_by(&routed, &key, session, "routing of program")?;
            if ours {
                routed.remove(key.as_str())?;
                if let Some(text) = &awaiting {
                    txn.open_table(AWAITED)?.insert(key.as_str(), text.as_str())?;
                }
            }
            Ok(())
        })
    }

    /// Every routed front-door program recorded as open (all were, at a crash), by key.
    pub fn routed_programs(&self) -> Result<Vec<(String, Value)>, JournalError> {
        self.json_rows(ROUTED, "routing of program")
    }

    /// Every row of a table of JSON values by string key, decoded (`what` names a row in errors).
    fn json_rows(&self, table: TableDefinition<&str, &str>, what: &str) -> Result<Vec<(String, Value)>, JournalError> {
        let txn = self.read()?;
        let table = txn.open_table(table)?;
        let mut out = Vec::new();
        for row in table.iter()? {
            let (key, text) = row?;
            let key = key.value().to_string();
            let value = decode(|| format!("{what} {key:?}"), text.value())?;
            out.push((key, value));
        }
        Ok(out)
    }

    /// Record what the DISC ledgers of some routed deployments have learned (name → state with a
    /// `"seq"`: the ledger's count of finished programs, which only grows), in one transaction.
    /// A recorded state with a higher `seq` stays: writes that reach the journal out of order
    /// never put an older state over a newer one.
    pub fn record_ledgers(&self, ledgers: &[(String, Value)]) -> Result<(), JournalError> {
        let seq = |v: &Value| v.get("seq").and_then(Value::as_u64).unwrap_or(0);
        let rows: Vec<(String, u64, String)> = ledgers
            .iter()
            .map(|(name, v)| Ok((name.clone(), seq(v), encode(|| format!("ledger of {name:?}"), v)?)))
            .collect::<Result<_, JournalError>>()?;
        self.write(move |txn| {
            let mut table = txn.open_table(LEDGERS)?;
            let mut newer = Vec::with_capacity(rows.len());
            for (name, n, _) in &rows {
                let recorded = match table.get(name.as_str())? {
                    Some(text) => seq(&decode::<Value>(|| format!("ledger of {name:?}"), text.value())?),
                    None => 0,
                };
                newer.push(*n >= recorded);
            }
            for ((name, _, text), newer) in rows.iter().zip(newer) {
                if newer {
                    table.insert(name.as_str(), text.as_str())?;
                }
            }
            Ok(())
        })
    }

    /// What the DISC ledgers learned, by deployment name, as last recorded.
    pub fn ledgers(&self) -> Result<Vec<(String, Value)>, JournalError> {
        self.json_rows(LEDGERS, "ledger of")
    }

    /// The routed front-door programs that ended and await their verdict, by key.
    pub fn awaited_verdicts(&self) -> Result<Vec<(String, Value)>, JournalError> {
        self.json_rows(AWAITED, "verdict awaited by program")
    }

    /// The verdict awaited by the program under `key` recorded with `"session": session` will not
    /// come (the program was given up): its record goes (one a later program under the key wrote
    /// stays).
    pub fn forget_awaited(&self, key: &str, session: u64) -> Result<(), JournalError> {
        check_key("program id", key)?;
        let key = key.to_string();
        self.write(move |txn| forget_awaited_in(txn, &key, session))
    }

    /// Keep only the awaited verdicts under `keys` (a restart restored those; the others can teach
    /// its router nothing), in one transaction.
    pub fn keep_awaited(&self, keys: &std::collections::BTreeSet<String>) -> Result<(), JournalError> {
        let keys = keys.clone();
        self.write(move |txn| {
            let mut awaited = txn.open_table(AWAITED)?;
            let mut gone = Vec::new();
            for row in awaited.iter()? {
                let (key, _) = row?;
                let key = key.value().to_string();
                if !keys.contains(&key) {
                    gone.push(key);
                }
            }
            for key in gone {
                awaited.remove(key.as_str())?;
            }
            Ok(())
        })
    }

    /// The binding of routed front-door program `key` if it is open (was, at a crash).
    pub fn routed_program(&self, key: &str) -> Result<Option<Value>, JournalError> {
        let txn = self.read()?;
        let routed = txn.open_table(ROUTED)?;
        let Some(text) = routed.get(key)? else { return Ok(None) };
        Ok(Some(decode(|| format!("routing of program {key:?}"), text.value())?))
    }

    /// Record that durable session `session` of a routed workflow is bound to `binding`,
    /// replacing an earlier record (written only when the router bound the session afresh: the
    /// first time, or when its recorded deployment is no longer one it may run on).
    pub fn record_session_route(&self, session: u64, binding: &Value) -> Result<(), JournalError> {
        let text = encode(|| format!("route of session {session}"), binding)?;
        self.write(move |txn| {
            txn.open_table(SESSION_ROUTES)?.insert(session, text.as_str())?;
            Ok(())
        })
    }

    /// The binding recorded for durable session `session`, if any.
    pub fn session_route(&self, session: u64) -> Result<Option<Value>, JournalError> {
        let txn = self.read()?;
        let routes = txn.open_table(SESSION_ROUTES)?;
        let Some(text) = routes.get(session)? else { return Ok(None) };
        Ok(Some(decode(|| format!("route of session {session}"), text.value())?))
    }

    /// Append what the router learned from one landed verdict (after every earlier one); past
    /// [`MAX_LEARNED`] the oldest goes. With `awaited` (key, session): the verdict was the one
    /// that program's record awaited, and the record goes in the same transaction, so that a
    /// restart never both relearns the outcome and restores the decision as still awaited.
    pub fn record_learned(&self, outcome: &Value, awaited: Option<(&str, u64)>) -> Result<(), JournalError> {
        self.record_learned_within(outcome, awaited, MAX_LEARNED)
    }

    fn record_learned_within(&self, outcome: &Value, awaited: Option<(&str, u64)>, keep: u64) -> Result<(), JournalError> {
        let text = encode(|| "a learned outcome".to_string(), outcome)?;
        if let Some((key, _)) = awaited {
            check_key("program id", key)?;
        }
        let awaited = awaited.map(|(k, s)| (k.to_string(), s));
        self.write(move |txn| {
            if let Some((key, session)) = &awaited {
                forget_awaited_in(txn, key, *session)?;
            }
            let mut learned = txn.open_table(LEARNED)?;
            let next = learned.last()?.map_or(0, |(k, _)| k.value() + 1);
            learned.insert(next, text.as_str())?;
            while learned.len()? > keep {
                learned.pop_first()?;
            }
            Ok(())
        })
    }

    /// The learned outcomes kept (the newest [`MAX_LEARNED`]), in the order the verdicts landed.
    pub fn learned(&self) -> Result<Vec<Value>, JournalError> {
        let txn = self.read()?;
        let learned = txn.open_table(LEARNED)?;
        let mut out = Vec::new();
        for row in learned.iter()? {
            let (n, text) = row?;
            let n = n.value();
            out.push(decode(|| format!("learned outcome {n}"), text.value())?);
        }
        Ok(out)
    }

    // ----- recovery -----

    /// Every unfinished session, by session number, with its run, inputs, completed activations
    /// (in completion order) and in-flight intents (in intent order). What a restarted server
    /// resumes: replay the completed results, intend the in-flight ones again (attempt 2, or fail
    /// them when [`MAX_ATTEMPTS`] is reached), then carry on.
    pub fn unfinished(&self) -> Result<Vec<UnfinishedSession>, JournalError> {
        let txn = self.read()?;
        let open = txn.open_table(OPEN)?;
        let sessions = txn.open_table(SESSIONS)?;
        let acts = txn.open_table(ACTIVATIONS)?;
        let mut out = Vec::new();
        for entry in open.iter()? {
            let session = entry?.0.value();
            let row: SessionRow = match sessions.get(session)? {
                Some(text) => decode(|| format!("session {session}"), text.value())?,
                None => return Err(JournalError::UnknownSession(session)),
            };
            let mut completed = Vec::new();
            let mut in_flight = Vec::new();
            for a in acts.range((session, "")..)? {
                let (k, text) = a?;
                let (s, key) = k.value();
                if s != session {
                    break;
                }
                let key = key.to_string();
                let act: ActivationRow = decode(|| format!("activation {key:?} of session {session}"), text.value())?;
                match (act.completed_seq, act.intended_seq) {
                    (Some(seq), _) => completed.push((seq, act.state(key))),
                    (None, seq) => in_flight.push((seq, act.state(key))),
                }
            }
            completed.sort_by_key(|(seq, _)| *seq);
            in_flight.sort_by_key(|(seq, _)| *seq);
            out.push(UnfinishedSession {
                run_id: row.run_id,
                session,
                inputs: row.inputs,
                completed: completed
                    .into_iter()
                    .filter_map(|(_, s)| match s {
                        ActivationState::Completed(c) => Some(c),
                        ActivationState::InFlight(_) => None,
                    })
                    .collect(),
                in_flight: in_flight
                    .into_iter()
                    .filter_map(|(_, s)| match s {
                        ActivationState::InFlight(i) => Some(i),
                        ActivationState::Completed(_) => None,
                    })
                    .collect(),
            });
        }
        Ok(out)
    }

    /// Counts over the whole journal (a full scan: for tests and reports, not the hot path).
    pub fn stats(&self) -> Result<JournalStats, JournalError> {
        let txn = self.read()?;
        let mut stats = JournalStats {
            runs: txn.open_table(RUNS)?.len()?,
            sessions: txn.open_table(SESSIONS)?.len()?,
            ..JournalStats::default()
        };
        stats.finished_sessions = stats.sessions - txn.open_table(OPEN)?.len()?;
        for entry in txn.open_table(ACTIVATIONS)?.iter()? {
            let (k, text) = entry?;
            let (session, key) = k.value();
            let act: ActivationRow = decode(|| format!("activation {key:?} of session {session}"), text.value())?;
            if act.result.is_some() {
                stats.completed_activations += 1;
            } else {
                stats.in_flight_activations += 1;
            }
            if act.attempts > 1 {
                stats.retried_activations += 1;
            }
        }
        Ok(stats)
    }
}

/// The wall clock in Unix milliseconds (0 on a clock before 1970).
fn unix_ms_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn run_record(run_id: &str, row: RunRow) -> RunRecord {
    RunRecord {
        run_id: run_id.to_string(),
        workflow: row.workflow,
        workflow_yaml: row.workflow_yaml,
        sessions: row.sessions,
        created_at_unix_ms: row.created_at_unix_ms,
        drawn_from: row.drawn_from,
    }
}

/// Refuse an activation write for an unknown or finished session.
fn open_session(txn: &WriteTransaction, session: u64, key: &str) -> Result<(), JournalError> {
    if txn.open_table(OPEN)?.get(session)?.is_some() {
        return Ok(());
    }
    let sessions = txn.open_table(SESSIONS)?;
    let Some(text) = sessions.get(session)? else { return Err(JournalError::UnknownSession(session)) };
    let row: SessionRow = decode(|| format!("session {session}"), text.value())?;
    match row.outcome {
        Some(recorded) => Err(JournalError::SessionFinished { session, key: key.to_string(), recorded }),
        // Recorded but not open: cannot happen through this API; treat as unknown rather than
        // write to it.
        None => Err(JournalError::UnknownSession(session)),
    }
}

#[cfg(test)]
mod tests;
