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
//! start a call *before* it is issued ([`ToolPool::prefetch`]): when an LLM unit's output is
//! known (the emulated answer is drawn when the unit is prepared, long before it completes in
//! virtual time), the tool calls that its completion would make ready are rendered on a copy
//! of the session and queued behind the calls already issued. The issued call later finds the
//! prefetched run (running, finished or still queued) under the same key and joins it; a
//! prefetch that never becomes a call only costs its run. A join of a call that no worker has
//! started runs it on the joining thread, so the event loop never waits idle behind a queue.
//!
//! Must not depend on the planner, `exec` or the live shell: it runs tool calls, whoever asks.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

use switchyard_tools::{ToolCall, ToolError, ToolOutcome, run_tool};

use crate::memo::Memo;

/// Bytes (roughly: keys and outcome texts) each generation of the process-wide memo keeps.
const MEMO_BYTES: usize = 4 << 20;

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
        return Some(format!("{}\u{0}job\u{0}{backend}\u{0}{job}", call.tool));
    }
    let inputs = serde_json::to_string(&call.inputs).ok()?;
    Some(format!("{}\u{0}{:?}\u{0}{backend}\u{0}{inputs}", call.tool, call.timeout_s))
}

fn memo_get(key: &str) -> Option<ToolOutcome> {
    lock(memo()).get(key).cloned()
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
    }
    Ok(outcome)
}

/// One run of a call, shared by everyone who asked for it.
struct Slot {
    call: ToolCall,
    key: Option<String>,
    state: Mutex<SlotState>,
    done: Condvar,
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

    /// Run the call (the caller claimed it) and publish the result.
    fn run(&self, shared: &Shared) {
        let result = run_memoised(&self.call, self.key.as_deref()).map_err(|e| e.to_string());
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
    closing: bool,
}

#[derive(Default)]
struct Shared {
    queues: Mutex<Queues>,
    work: Condvar,
    /// Runs not finished yet, by memo key.
    table: Mutex<HashMap<String, Arc<Slot>>>,
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

    /// The run for `call`: the one already known under its key, else a new one, queued as
    /// issued or as prefetched. `Err(Some(outcome))` when the memo has the outcome already,
    /// `Err(None)` when a prefetch is not queued.
    fn find_or_queue(&self, call: ToolCall, prefetch: bool) -> Result<Arc<Slot>, Option<ToolOutcome>> {
        let key = memo_key(&call);
        let mut table = lock(&self.shared.table);
        if let Some(k) = &key {
            if let Some(slot) = table.get(k) {
                let slot = Arc::clone(slot);
                if !prefetch && matches!(*lock(&slot.state), SlotState::Queued) {
                    // Issued now: ahead of the other prefetches (the stale queue entry is
                    // skipped by whoever pops it second).
                    lock(&self.shared.queues).issued.push_back(Arc::clone(&slot));
                    drop(table);
                    self.shared.work.notify_one();
                }
                return Ok(slot);
            }
            if let Some(hit) = memo_get(k) {
                return Err(Some(hit));
            }
        }
        let slot = Arc::new(Slot { call, key: key.clone(), state: Mutex::new(SlotState::Queued), done: Condvar::new() });
        {
            let mut q = lock(&self.shared.queues);
            if prefetch {
                if q.closing || q.prefetched.len() >= PREFETCH_LIMIT || key.is_none() {
                    return Err(None);
                }
                q.prefetched.push_back(Arc::clone(&slot));
            } else {
                q.issued.push_back(Arc::clone(&slot));
            }
        }
        if let Some(k) = key {
            table.insert(k, Arc::clone(&slot));
        }
        drop(table);
        self.shared.work.notify_one();
        Ok(slot)
    }

    /// Queue a call; the result is collected with [`ToolJob::join`].
    pub fn submit(&self, call: ToolCall) -> ToolJob {
        match self.find_or_queue(call, false) {
            Ok(slot) => ToolJob(JobState::Slot(slot, Arc::clone(&self.shared))),
            Err(Some(hit)) => ToolJob(JobState::Ready(Ok(hit))),
            Err(None) => ToolJob(JobState::Ready(Err("tool call could not be queued".into()))),
        }
    }

    /// Start `call` early, as a hint: a later [`ToolPool::submit`] of an identical call joins
    /// this run. Calls already known are not queued again.
    pub fn prefetch(&self, call: ToolCall) {
        let _ = self.find_or_queue(call, true);
    }
}

fn worker(shared: &Shared) {
    loop {
        let slot = {
            let mut q = lock(&shared.queues);
            loop {
                if let Some(s) = q.issued.pop_front() {
                    break s;
                }
                if !q.closing {
                    if let Some(s) = q.prefetched.pop_front() {
                        break s;
                    }
                } else {
                    return;
                }
                q = shared.work.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        if slot.claim() {
            slot.run(shared);
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

    #[test]
    fn prefetched_issued_and_stolen_runs_equal_a_direct_run() {
        let calls: Vec<ToolCall> =
            (0..40).map(|i| vote(&[&format!("pool-test {i}"), "pool-test b", &format!("pool-test {i}")])).collect();
        let pool = ToolPool::new(2);
        // Prefetch every other call, then issue all (some joined while queued, some running,
        // some done), plus an issued call nobody prefetched.
        for c in calls.iter().step_by(2) {
            pool.prefetch(c.clone());
        }
        let jobs: Vec<ToolJob> = calls.iter().map(|c| pool.submit(c.clone())).collect();
        for (c, job) in calls.iter().zip(jobs) {
            let direct = ToolOutcome { wall_seconds: 0.0, ..run_tool(c).expect("direct run") };
            assert_eq!(ToolOutcome { wall_seconds: 0.0, ..job.join().expect("pooled run") }, direct);
        }
        // A prefetch nobody issues is dropped with the pool, without blocking it.
        pool.prefetch(vote(&["pool-test never issued"]));
        drop(pool);
        // A call that fails is an error for its job, prefetched or not.
        let pool = ToolPool::new(1);
        let bad = ToolCall { tool: "majority_vote".into(), inputs: Default::default(), timeout_s: None };
        pool.prefetch(bad.clone());
        assert!(pool.submit(bad).join().is_err());
    }
}
