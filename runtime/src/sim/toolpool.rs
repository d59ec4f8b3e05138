//! A small pool of worker threads that executes tool calls for the simulator.
//!
//! Tool durations enter virtual time as *modeled* values (`switchyard_tools::modeled_duration_s`)
//! so the simulation stays deterministic; the real execution (a sandboxed python3 process for
//! `python_tests`) runs here in parallel with the event loop and is joined when the tool's
//! virtual completion event is processed. Results depend only on the call, never on timing.
//!
//! Because a tool's outcome is a function of its call (inputs, timeout and sandbox backend),
//! outcomes are memoised for the life of the process: a benchmark that replays one trace under
//! many policies runs each distinct candidate program once.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use switchyard_tools::{ToolCall, ToolError, ToolOutcome, run_tool};

type Job = (ToolCall, Sender<Result<ToolOutcome, ToolError>>);

/// Most outcomes kept in the process-wide memo.
const MEMO_LIMIT: usize = 50_000;

fn memo() -> &'static Mutex<HashMap<String, ToolOutcome>> {
    static MEMO: OnceLock<Mutex<HashMap<String, ToolOutcome>>> = OnceLock::new();
    MEMO.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The memo key: the call and the sandbox backend that will run it.
fn memo_key(call: &ToolCall) -> Option<String> {
    let backend = std::env::var("SWITCHYARD_PYTHON_SANDBOX").unwrap_or_default();
    let inputs = serde_json::to_string(&call.inputs).ok()?;
    Some(format!("{}\u{0}{:?}\u{0}{backend}\u{0}{inputs}", call.tool, call.timeout_s))
}

/// Run a call, through the memo.
fn run_memoised(call: &ToolCall) -> Result<ToolOutcome, ToolError> {
    let key = memo_key(call);
    if let Some(k) = &key {
        if let Some(hit) = memo().lock().ok().and_then(|m| m.get(k).cloned()) {
            return Ok(hit);
        }
    }
    let outcome = run_tool(call)?;
    if let (Some(k), Ok(mut m)) = (key, memo().lock()) {
        if m.len() >= MEMO_LIMIT {
            m.clear();
        }
        m.insert(k, outcome.clone());
    }
    Ok(outcome)
}

/// Handle to a submitted tool call.
pub struct ToolJob(Receiver<Result<ToolOutcome, ToolError>>);

impl ToolJob {
    /// Block until the call finished. A worker that died is reported as an error string.
    pub fn join(self) -> Result<ToolOutcome, String> {
        match self.0.recv() {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("tool worker stopped before returning a result".to_string()),
        }
    }
}

/// Fixed-size worker pool.
pub struct ToolPool {
    tx: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

impl ToolPool {
    pub fn new(workers: usize) -> Self {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let workers = (0..workers.max(1))
            .map(|_| {
                let rx = Arc::clone(&rx);
                std::thread::spawn(move || {
                    loop {
                        let job = match rx.lock() {
                            Ok(guard) => guard.recv(),
                            Err(_) => return,
                        };
                        let Ok((call, reply)) = job else { return };
                        let _ = reply.send(run_memoised(&call));
                    }
                })
            })
            .collect();
        ToolPool { tx: Some(tx), workers }
    }

    /// Queue a call; the result is collected with [`ToolJob::join`].
    pub fn submit(&self, call: ToolCall) -> ToolJob {
        let (reply, rx) = channel();
        if let Some(tx) = &self.tx {
            if let Err(err) = tx.send((call, reply)) {
                // All workers are gone: answer inline so no job is ever lost.
                let (call, reply) = err.0;
                let _ = reply.send(run_memoised(&call));
            }
        }
        ToolJob(rx)
    }
}

impl Drop for ToolPool {
    fn drop(&mut self) {
        self.tx.take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
