//! A small pool of worker threads that executes tool calls for the simulator.
//!
//! Tool durations enter virtual time as *modeled* values (`switchyard_tools::modeled_duration_s`)
//! so the simulation stays deterministic; the real execution (a sandboxed interpreter for
//! `python_tests`) runs here in parallel with the event loop and is joined when the tool's
//! virtual completion event is processed. Results depend only on the call, never on timing.
//!
//! Because a tool's outcome is a function of its call (inputs, timeout and sandbox backend),
//! outcomes are memoised for the life of the process: a benchmark that replays one trace under
//! many policies runs each distinct candidate program once. The same fact lets the simulator
//! start a call *before* it is issued ([`ToolPool::prefetch_chain`]): when an LLM unit's output is
//! known (the emulated answer is drawn when the unit is prepared, long before it completes in
//! virtual time), the tool calls that its completion would make ready are rendered on a copy
//! of the session and queued behind the calls already issued. The issued call later finds the
//! prefetched run (running, finished or still queued) under the same key and joins it; a
//! prefetch that never becomes a call only costs its run. A join of a call that no worker has
//! started runs it on the joining thread, so the event loop never waits idle behind a queue.
//! A prefetch may carry *followers* ([`Follower`]): calls to queue when it ends with a given
//! verdict (a final check after a passing test), so a second step of a session's tools runs
//! ahead too, and only on the branch its first step really takes (a follower of a program that
//! hangs is never started, which would cost a second timeout). A prefetch a worker runs before
//! anyone waits for it reserves its WebAssembly guest in the background of the process's guest
//! budget (`switchyard_tools::sandbox::guest_budget::in_background`), so where that budget is
//! full an issued call's guest is admitted first.
//!
//! Must not depend on the planner, `exec` or the live shell: it runs tool calls, whoever asks.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

use switchyard_tools::{ToolCall, ToolError, ToolOutcome, run_tool};

use super::outcome_store::{OutcomeStore, StoreTally};
use crate::memo::Memo;

/// Bytes (roughly: keys and outcome texts) each generation of the process-wide memo keeps:
/// enough that an outcome prefetched for a session thousands of arrivals ahead is still there
/// when the session issues its call (a GSM8K vote costs ~4.6 KB, an MBPP test ~1.5–1.8 KB).
const MEMO_BYTES: usize = 16 << 20;

/// Most prefetched calls queued and not yet started; more are dropped (they are only hints).
const PREFETCH_LIMIT: usize = 4096;

fn memo() -> &'static Mutex<Memo<String, ToolOutcome>> {
    static MEMO: OnceLock<Mutex<Memo<String, ToolOutcome>>> = OnceLock::new();
    MEMO.get_or_init(|| Mutex::new(Memo::new(MEMO_BYTES)))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The memo key: what the call computes (`switchyard_tools::canonical_key`: for
/// `python_tests`, the extracted code, tests, imports and timeout — not the prose around the
/// code, which differs from session to session) or else the call itself, and the sandbox
/// backend that will run it.
fn memo_key(call: &ToolCall) -> Option<String> {
    let backend = std::env::var("SWITCHYARD_PYTHON_SANDBOX").unwrap_or_default();
    if let Some(job) = switchyard_tools::canonical_key(call) {
        return Some(format!("{}{JOB_TAG}{backend}\u{0}{job}", call.tool));
    }
    let inputs = serde_json::to_string(&call.inputs).ok()?;
    Some(format!("{}\u{0}{:?}\u{0}{backend}\u{0}{inputs}", call.tool, call.timeout_s))
}

/// The persistent store behind the memo, when a shell opened one ([`use_outcome_store`]).
static STORE: OnceLock<OutcomeStore> = OnceLock::new();

/// Keep sandboxed outcomes in `store` too, for this process's life: the memo consults it on a
/// miss and writes every new storable outcome to it. The first store given stays (a process
/// runs one configuration); returns false when another was already in use.
pub fn use_outcome_store(store: OutcomeStore) -> bool {
    STORE.set(store).is_ok()
}

/// Reads and writes of the persistent store so far (`None` without one).
pub fn outcome_store_tally() -> Option<StoreTally> {
    STORE.get().map(OutcomeStore::tally)
}

/// The time limit a call that the store may keep runs under: a `python_tests` job's (the
/// calls [`switchyard_tools::canonical_key`] names); `None` for every other call, which the
/// store never sees.
fn durable_timeout(call: &ToolCall) -> Option<f64> {
    switchyard_tools::canonical_key(call)?;
    switchyard_tools::python_tests::PythonTests::from_call(call).ok().map(|job| job.timeout_s)
}

/// What follows the tool's name in the memo key of a call with a canonical key ([`memo_key`]);
/// only `python_tests` has one, and only its outcomes go to the store.
const JOB_TAG: &str = "\u{0}job\u{0}";

fn memo_get(key: &str) -> Option<ToolOutcome> {
    if let Some(hit) = lock(memo()).get(key).cloned() {
        return Some(hit);
    }
    // Only a durable call's key is ever written to the store: others are not looked up there.
    if key.strip_prefix(switchyard_tools::python_tests::NAME).is_none_or(|rest| !rest.starts_with(JOB_TAG)) {
        return None;
    }
    let stored = STORE.get()?.get(key)?;
    lock(memo()).insert(key.to_string(), stored.clone(), memo_cost(key, &stored));
    Some(stored)
}

/// What an outcome counts against the memo's budget: its key and texts, plus a fixed part.
fn memo_cost(key: &str, o: &ToolOutcome) -> usize {
    key.len() + o.text.len() + o.sandbox_note.as_ref().map_or(0, String::len) + 512
}

/// Run a call, through the memo.
fn run_memoised(call: &ToolCall, key: Option<&str>) -> Result<ToolOutcome, ToolError> {
    if let Some(hit) = key.and_then(memo_get) {
        return Ok(hit);
    }
    let outcome = run_tool(call)?;
    if let Some(k) = key {
        let cost = memo_cost(k, &outcome);
        lock(memo()).insert(k.to_string(), outcome.clone(), cost);
        if let (Some(store), Some(timeout_s)) = (STORE.get(), durable_timeout(call)) {
            store.put(k, &outcome, timeout_s);
        }
    }
    Ok(outcome)
}

/// Which verdicts of a call start a follower.
#[derive(Debug, Clone, PartialEq)]
pub enum VerdictMatch {
    /// Exactly this verdict.
    Is(String),
    /// Any verdict (or none) but these: the branch no condition names.
    NoneOf(Vec<String>),
}

impl VerdictMatch {
    pub fn holds(&self, verdict: Option<&str>) -> bool {
        match self {
            VerdictMatch::Is(v) => verdict == Some(v.as_str()),
            VerdictMatch::NoneOf(named) => !verdict.is_some_and(|v| named.iter().any(|n| n == v)),
        }
    }
}

/// How soon a queued call's outcome is wanted; workers take the most urgent first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Urgency {
    /// Issued: a session waits for it.
    Issued,
    /// Prefetched for a session in flight.
    Soon,
    /// Prefetched for a session that has not arrived yet.
    Ahead,
}

/// A call to prefetch once another call ends with a verdict that `when` matches.
#[derive(Debug, Clone, PartialEq)]
pub struct Follower {
    pub when: VerdictMatch,
    pub call: ToolCall,
}

/// A slot's followers, until its run ended; then the verdict it ended with (`Err` for a call
/// that failed to run: no follower of it starts).
#[derive(Default)]
struct Followers {
    waiting: Vec<(Follower, Urgency)>,
    ended: Option<Result<Option<String>, ()>>,
}

/// One run of a call, shared by everyone who asked for it.
struct Slot {
    call: ToolCall,
    key: Option<String>,
    state: Mutex<SlotState>,
    done: Condvar,
    followers: Mutex<Followers>,
    /// The most urgent queue the slot was put in (it may sit in less urgent ones too).
    queued: Mutex<Urgency>,
}

enum SlotState {
    Queued,
    Running,
    Done(Result<ToolOutcome, String>),
}

impl Slot {
    /// Queued → Running; false when someone else took it.
    fn claim(&self) -> bool {
        let mut s = lock(&self.state);
        if matches!(*s, SlotState::Queued) {
            *s = SlotState::Running;
            true
        } else {
            false
        }
    }

    /// Run the call (the caller claimed it) and publish the result, after queueing the
    /// followers its verdict starts.
    fn run(&self, shared: &Shared) {
        let result = run_memoised(&self.call, self.key.as_deref()).map_err(|e| e.to_string());
        let start = {
            let mut f = lock(&self.followers);
            f.ended = Some(result.as_ref().map(|o| o.verdict.clone()).map_err(|_| ()));
            std::mem::take(&mut f.waiting)
        };
        if let Ok(outcome) = &result {
            shared.start_followers(start, outcome.verdict.as_deref());
        }
        // The outcome is in the memo (when it succeeded) before the slot leaves the table, so a
        // later identical call finds one or the other.
        if let Some(k) = &self.key {
            let mut table = lock(&shared.table);
            if table.get(k).is_some_and(|s| std::ptr::eq(Arc::as_ptr(s), self)) {
                table.remove(k);
            }
        }
        *lock(&self.state) = SlotState::Done(result);
        self.done.notify_all();
    }

    fn wait(&self) -> Result<ToolOutcome, String> {
        let mut s = lock(&self.state);
        loop {
            if let SlotState::Done(r) = &*s {
                return r.clone();
            }
            s = self.done.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[derive(Default)]
struct Queues {
    /// Issued calls, in order.
    issued: VecDeque<Arc<Slot>>,
    /// Prefetched calls, in order; workers take them only when no issued call waits.
    prefetched: VecDeque<Arc<Slot>>,
    /// Calls prefetched for sessions not arrived yet, taken last.
    ahead: VecDeque<Arc<Slot>>,
    closing: bool,
}

impl Queues {
    /// The next slot for a worker: issued calls first, then prefetches for sessions in flight,
    /// then those for sessions not arrived yet (no prefetch once the pool is closing).
    fn next(&mut self) -> Option<Arc<Slot>> {
        if let Some(s) = self.issued.pop_front() {
            return Some(s);
        }
        if self.closing {
            return None;
        }
        self.prefetched.pop_front().or_else(|| self.ahead.pop_front())
    }
}

#[derive(Default)]
struct Shared {
    queues: Mutex<Queues>,
    work: Condvar,
    /// Runs not finished yet, by memo key.
    table: Mutex<HashMap<String, Arc<Slot>>>,
}

impl Shared {
    /// The run for `call`: the one already known under its key (queued again, more urgently,
    /// when it waits in a less urgent queue: the stale entry is skipped by whoever pops it
    /// second), else a new one, queued by `urgency`. `Err(Some(outcome))` when the memo has
    /// the outcome already, `Err(None)` when a prefetch is not queued.
    fn find_or_queue(&self, call: ToolCall, urgency: Urgency) -> Result<Arc<Slot>, Option<ToolOutcome>> {
        let key = memo_key(&call);
        let mut table = lock(&self.table);
        if let Some(k) = &key {
            if let Some(slot) = table.get(k) {
                let slot = Arc::clone(slot);
                let upgrade = {
                    let mut queued = lock(&slot.queued);
                    let upgrade = matches!(*lock(&slot.state), SlotState::Queued) && urgency < *queued;
                    if upgrade {
                        *queued = urgency;
                    }
                    upgrade
                };
                if upgrade {
                    let mut q = lock(&self.queues);
                    match urgency {
                        Urgency::Issued => q.issued.push_back(Arc::clone(&slot)),
                        Urgency::Soon | Urgency::Ahead => q.prefetched.push_back(Arc::clone(&slot)),
                    }
                    drop(q);
                    drop(table);
                    self.work.notify_one();
                }
                return Ok(slot);
            }
            if let Some(hit) = memo_get(k) {
                return Err(Some(hit));
            }
        }
        let slot = Arc::new(Slot {
            call,
            key: key.clone(),
            state: Mutex::new(SlotState::Queued),
            done: Condvar::new(),
            followers: Mutex::new(Followers::default()),
            queued: Mutex::new(urgency),
        });
        {
            let mut q = lock(&self.queues);
            let closing = q.closing;
            let queue = match urgency {
                Urgency::Issued => &mut q.issued,
                Urgency::Soon => &mut q.prefetched,
                Urgency::Ahead => &mut q.ahead,
            };
            if urgency != Urgency::Issued && (closing || queue.len() >= PREFETCH_LIMIT || key.is_none()) {
                return Err(None);
            }
            queue.push_back(Arc::clone(&slot));
        }
        if let Some(k) = key {
            table.insert(k, Arc::clone(&slot));
        }
        drop(table);
        self.work.notify_one();
        Ok(slot)
    }

    /// Prefetch, each as urgently as it says, the followers that `verdict` starts.
    fn start_followers(&self, followers: impl IntoIterator<Item = (Follower, Urgency)>, verdict: Option<&str>) {
        for (f, urgency) in followers {
            if f.when.holds(verdict) {
                self.prefetch_chain(f.call, Vec::new(), urgency);
            }
        }
    }

    /// Prefetch `call` (`urgency` `Soon` or `Ahead`), and `followers` once it ends (at once
    /// when its outcome is known), as urgently.
    fn prefetch_chain(&self, call: ToolCall, followers: Vec<Follower>, urgency: Urgency) {
        match self.find_or_queue(call, urgency.max(Urgency::Soon)) {
            Ok(slot) => {
                if followers.is_empty() {
                    return;
                }
                let followers = followers.into_iter().map(|f| (f, urgency));
                let mut f = lock(&slot.followers);
                match &f.ended {
                    None => f.waiting.extend(followers),
                    Some(Ok(verdict)) => {
                        let verdict = verdict.clone();
                        drop(f);
                        self.start_followers(followers, verdict.as_deref());
                    }
                    Some(Err(())) => {}
                }
            }
            Err(Some(outcome)) => self.start_followers(followers.into_iter().map(|f| (f, urgency)), outcome.verdict.as_deref()),
            Err(None) => {}
        }
    }
}

/// Handle to a submitted tool call.
pub struct ToolJob(JobState);

enum JobState {
    Ready(Result<ToolOutcome, String>),
    Slot(Arc<Slot>, Arc<Shared>),
}

impl ToolJob {
    /// Block until the call finished (running it here when no worker has started it). A worker
    /// that died is reported as an error string.
    pub fn join(self) -> Result<ToolOutcome, String> {
        match self.0 {
            JobState::Ready(r) => r,
            JobState::Slot(slot, shared) => {
                if slot.claim() {
                    slot.run(&shared);
                }
                slot.wait()
            }
        }
    }
}

/// Fixed-size worker pool.
pub struct ToolPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl ToolPool {
    pub fn new(workers: usize) -> Self {
        let shared = Arc::new(Shared::default());
        let workers = (0..workers.max(1))
            .filter_map(|_| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new().name("switchyard-tool".into()).spawn(move || worker(&shared)).ok()
            })
            .collect();
        ToolPool { shared, workers }
    }

    /// Queue a call; the result is collected with [`ToolJob::join`].
    pub fn submit(&self, call: ToolCall) -> ToolJob {
        match self.shared.find_or_queue(call, Urgency::Issued) {
            Ok(slot) => ToolJob(JobState::Slot(slot, Arc::clone(&self.shared))),
            Err(Some(hit)) => ToolJob(JobState::Ready(Ok(hit))),
            Err(None) => ToolJob(JobState::Ready(Err("tool call could not be queued".into()))),
        }
    }

    /// Start `call` early, as a hint: a later [`ToolPool::submit`] of an identical call joins
    /// this run (calls already known are not queued again); and when it ends, each of
    /// `followers` whose verdict match holds for its outcome, the same way.
    pub fn prefetch_chain(&self, call: ToolCall, followers: Vec<Follower>) {
        self.shared.prefetch_chain(call, followers, Urgency::Soon);
    }

    /// [`ToolPool::prefetch_chain`] for a session that has not arrived yet: workers take these
    /// calls only when nothing issued or prefetched for a session in flight waits.
    pub fn prefetch_ahead(&self, call: ToolCall, followers: Vec<Follower>) {
        self.shared.prefetch_chain(call, followers, Urgency::Ahead);
    }
}

fn worker(shared: &Shared) {
    loop {
        let slot = {
            let mut q = lock(&shared.queues);
            loop {
                if let Some(s) = q.next() {
                    break s;
                }
                if q.closing {
                    return;
                }
                q = shared.work.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        if slot.claim() {
            // A prefetch nobody waits for yet runs its guest in the background of the process's
            // guest budget, so an issued call's guest is admitted before it.
            if *lock(&slot.queued) == Urgency::Issued {
                slot.run(shared);
            } else {
                switchyard_tools::sandbox::guest_budget::in_background(|| slot.run(shared));
            }
        }
    }
}

impl Drop for ToolPool {
    fn drop(&mut self) {
        {
            let mut q = lock(&self.shared.queues);
            q.closing = true;
            // Prefetches nobody joined are dropped; issued calls still run (their jobs may be
            // joined by whoever holds them).
            q.prefetched.clear();
            q.ahead.clear();
        }
        self.shared.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(candidates: &[&str]) -> ToolCall {
        let mut inputs = std::collections::BTreeMap::new();
        inputs.insert("candidates".to_string(), serde_json::json!(candidates));
        ToolCall { tool: "majority_vote".into(), inputs, timeout_s: None }
    }

    /// Whether a run of `call` is known to the pool: queued, running, or its outcome memoised.
    fn known(pool: &ToolPool, call: &ToolCall) -> bool {
        let key = memo_key(call).expect("a keyed call");
        lock(&pool.shared.table).contains_key(&key) || memo_get(&key).is_some()
    }

    #[test]
    fn a_prefetch_starts_only_the_followers_its_verdict_matches() {
        assert!(VerdictMatch::Is("pass".into()).holds(Some("pass")));
        assert!(!VerdictMatch::Is("pass".into()).holds(None));
        let not_fail = VerdictMatch::NoneOf(vec!["fail".into()]);
        assert!(not_fail.holds(Some("pass")) && not_fail.holds(None) && !not_fail.holds(Some("fail")));

        // A vote with a majority: its `majority` follower is queued when it ends, its `tie`
        // follower never is; a follower of a call whose outcome is already memoised is matched
        // at once.
        let pool = ToolPool::new(1);
        let first = vote(&["chain-test: 7231", "chain-test: 7232", "chain-test: 7231"]);
        let on_majority = vote(&["chain-test majority"]);
        let on_tie = vote(&["chain-test tie"]);
        let followers = vec![
            Follower { when: VerdictMatch::Is("majority".into()), call: on_majority.clone() },
            Follower { when: VerdictMatch::Is("tie".into()), call: on_tie.clone() },
        ];
        pool.prefetch_chain(first.clone(), followers.clone());
        let outcome = pool.submit(first.clone()).join().expect("the vote");
        assert_eq!(outcome.verdict.as_deref(), Some("majority"));
        assert!(known(&pool, &on_majority), "the matching follower is queued before the join returns");
        assert!(!known(&pool, &on_tie), "the other branch's follower never starts");
        let again = vote(&["chain-test majority, memoised"]);
        pool.prefetch_chain(first, vec![Follower { when: VerdictMatch::Is("majority".into()), call: again.clone() }]);
        assert!(known(&pool, &again));
        assert!(!known(&pool, &on_tie));
    }

    #[test]
    fn workers_take_issued_calls_then_near_term_prefetches_then_the_lookahead() {
        // No worker: the queues are read as a worker would.
        let shared = Shared::default();
        let (ahead, soon, later) = (vote(&["order-test a"]), vote(&["order-test b"]), vote(&["order-test c"]));
        shared.prefetch_chain(ahead.clone(), Vec::new(), Urgency::Ahead);
        shared.prefetch_chain(later.clone(), Vec::new(), Urgency::Ahead);
        shared.prefetch_chain(soon.clone(), Vec::new(), Urgency::Soon);
        // `later`'s session arrives and issues it: it moves to the front.
        assert!(shared.find_or_queue(later.clone(), Urgency::Issued).is_ok());
        let mut order = Vec::new();
        while let Some(slot) = lock(&shared.queues).next() {
            if slot.claim() {
                order.push(slot.call.clone());
            }
        }
        assert_eq!(order, vec![later, soon, ahead], "issued, then soon, then ahead; the stale entry is skipped");
    }

    #[test]
    fn prefetched_issued_and_stolen_runs_equal_a_direct_run() {
        let calls: Vec<ToolCall> =
            (0..40).map(|i| vote(&[&format!("pool-test {i}"), "pool-test b", &format!("pool-test {i}")])).collect();
        let pool = ToolPool::new(2);
        // Prefetch every other call, then issue all (some joined while queued, some running,
        // some done), plus an issued call nobody prefetched.
        for c in calls.iter().step_by(2) {
            pool.prefetch_chain(c.clone(), Vec::new());
        }
        let jobs: Vec<ToolJob> = calls.iter().map(|c| pool.submit(c.clone())).collect();
        for (c, job) in calls.iter().zip(jobs) {
            let direct = ToolOutcome { wall_seconds: 0.0, ..run_tool(c).expect("direct run") };
            assert_eq!(ToolOutcome { wall_seconds: 0.0, ..job.join().expect("pooled run") }, direct);
        }
        // A prefetch nobody issues is dropped with the pool, without blocking it.
        pool.prefetch_chain(vote(&["pool-test never issued"]), Vec::new());
        drop(pool);
        // A call that fails is an error for its job, prefetched or not.
        let pool = ToolPool::new(1);
        let bad = ToolCall { tool: "majority_vote".into(), inputs: Default::default(), timeout_s: None };
        pool.prefetch_chain(bad.clone(), Vec::new());
        assert!(pool.submit(bad).join().is_err());
    }
}
