//! switchyard-tools: the built-in tools of Switchyard workflows and the sandboxes they run in.
//!
//! Tools are workflow nodes that run code, not models. This crate owns
//! * the tool interface the simulator and the live runtime call: [`ToolCall`] →
//!   [`run_tool`] → [`ToolOutcome`], plus the deterministic [`modeled_duration_s`] that enters
//!   virtual time;
//! * the sandboxes ([`sandbox`]): the [`sandbox::Sandbox`] trait, the Linux process backend
//!   (time limit with process-group kill, rlimits, a fresh unprivileged uid when root, network
//!   and read-only-filesystem namespaces where the kernel allows, private work directory,
//!   cleared environment, capped output) and the WebAssembly backend on wasmtime
//!   ([`sandbox::wasm`]: epoch deadline, memory limiter, WASI preview 1 with only a private work
//!   directory pre-opened, capped output, modules compiled once per process);
//! * the CPython-on-WASI runtime ([`python_wasm`]): pinned identity, installation with pip,
//!   location;
//! * the built-in tools: [`python_tests`] (candidate code against unit tests, in CPython on
//!   WASI when that runtime is installed, else in the process sandbox), [`majority_vote`]
//!   (answers extracted in Rust, the vote itself in a WebAssembly module authored in WAT) and
//!   [`shell`] (an agent's command line by `/bin/sh -c` in the process sandbox, with only the
//!   system paths and the paths the workflow declares readable).
//!
//! It must not depend on the runtime, the planner, the predictor or the emulator: the runtime
//! depends on it, never the reverse. Linux only (namespaces, rlimits, pidfds).

pub mod custom;
pub mod majority_vote;
pub mod python;
pub mod python_tests;
pub mod python_wasm;
pub mod shell;
pub mod trusted_asserts;
pub mod sandbox;

pub use python_wasm::{install_python_wasm, python_wasm_path};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Names of the built-in tools.
pub const TOOLS: &[&str] = &[python_tests::NAME, majority_vote::NAME, shell::NAME];

/// One invocation of a tool by a workflow node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Tool name, one of [`TOOLS`].
    pub tool: String,
    /// Named inputs (see each tool's module for its fields).
    pub inputs: BTreeMap<String, serde_json::Value>,
    /// Time limit from the node, in seconds (for `python_tests` CPU time with a wall-clock
    /// backstop; for `shell` wall time); a tool's own `timeout_s` input wins.
    pub timeout_s: Option<f64>,
}

/// What a tool returned.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolOutcome {
    /// Human-readable result, fed to later nodes (e.g. `1/3 tests passed; first failure: …`).
    pub text: String,
    /// Branch label (`pass`/`fail`, `majority`/`plurality`/`tie`/`no_answer`).
    pub verdict: Option<String>,
    /// Structured result.
    pub value: serde_json::Value,
    /// Deterministic duration for virtual time (see [`modeled_duration_s`]); a run stopped by
    /// its wall or CPU limit is modeled as lasting exactly that limit.
    pub modeled_duration_s: f64,
    /// What the call really took on this machine.
    pub wall_seconds: f64,
    /// What the sandbox could and could not enforce (`None` for in-process tools).
    pub sandbox_note: Option<String>,
    /// Why the call failed, when it did (verdict `fail` of a test tool): the first cause the
    /// sandbox or the tool observed. `None` for a call that passed or has no pass/fail.
    #[serde(default)]
    pub failure: Option<ToolFailure>,
    /// How the verdict's checks were computed (test tools; zero for the others).
    #[serde(default)]
    pub checks: VerdictChecks,
}

/// Where a test tool's checks were decided: outside the sandbox, from values the sandboxed code
/// returned as data and expectations it never saw, or inside it (asserts that could not be
/// split, whose outcome the sandboxed code could forge).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictChecks {
    /// Checks compared outside the sandbox.
    pub outside: u32,
    /// Checks whose pass or fail the sandboxed code reported itself.
    pub untrusted: u32,
}

/// Why a tool call failed, as far as the sandbox and the tool can observe it, most specific
/// first: a limit that stopped the program outranks the test failure it caused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolFailureCause {
    /// The time limit expired; the program's whole process tree was killed. For `python_tests`
    /// either of its clocks (the CPU budget or the wall-clock backstop); for `shell` the wall
    /// clock.
    Timeout,
    /// The CPU-time limit killed the program (a tool whose limit is wall time, `shell`).
    CpuTime,
    /// The seccomp filter killed the program for a forbidden system call (`SIGSYS`).
    Syscall,
    /// The memory limit refused an allocation (`MemoryError`, a refused `memory.grow`).
    Memory,
    /// The work area was full: its byte or entry limit (`ENOSPC`).
    WorkArea,
    /// A file grew past the file-size limit (`SIGXFSZ`, `EFBIG`).
    FileSize,
    /// The program tried to hold more descriptors open than allowed (`EMFILE`).
    OpenFiles,
    /// The program's output exceeded its cap, so its result could not be read whole.
    OutputTooLarge,
    /// The program died of another signal, or a WebAssembly trap.
    Crashed,
    /// The program exited before finishing (a non-zero status, or `exit` from the code).
    Exited,
    /// An import line or the candidate code itself raised.
    CodeError,
    /// The code ran but at least one test failed.
    TestsFailed,
}

impl ToolFailureCause {
    /// The snake-case name used in reports and traces (`timeout`, `tests_failed`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::CpuTime => "cpu_time",
            Self::Syscall => "syscall",
            Self::Memory => "memory",
            Self::WorkArea => "work_area",
            Self::FileSize => "file_size",
            Self::OpenFiles => "open_files",
            Self::OutputTooLarge => "output_too_large",
            Self::Crashed => "crashed",
            Self::Exited => "exited",
            Self::CodeError => "code_error",
            Self::TestsFailed => "tests_failed",
        }
    }
}

/// A failed tool call's cause and, in words, what was observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolFailure {
    /// The cause.
    pub cause: ToolFailureCause,
    /// What was observed (`timed out after 5 s`, `first failure: assert f(2) == 4 -> got 5`).
    pub detail: String,
}

/// Errors of a tool call: bad inputs, unknown tools, and failures to run at all. A tool whose
/// code fails, times out or crashes is *not* an error but an outcome with verdict `fail`.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// No built-in tool has this name.
    #[error("unknown tool `{tool}` (known tools: {known})")]
    UnknownTool {
        /// The requested name.
        tool: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// A required input field is absent.
    #[error("tool `{tool}`: missing input `{field}`")]
    MissingInput {
        /// Tool name.
        tool: &'static str,
        /// Field name.
        field: &'static str,
    },
    /// An input field has the wrong type or value.
    #[error("tool `{tool}`: input `{field}` {problem}")]
    InvalidInput {
        /// Tool name.
        tool: &'static str,
        /// Field name.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The tool cannot run on this machine (e.g. no usable python3).
    #[error("tool `{tool}` is unavailable: {reason}")]
    Unavailable {
        /// Tool name.
        tool: &'static str,
        /// Why.
        reason: String,
    },
    /// Installing the CPython-on-WASI runtime failed at `step` (download, unpack, verify, copy).
    #[error("installing python.wasm failed at {step}: {reason}")]
    Install {
        /// The step that failed.
        step: &'static str,
        /// Why.
        reason: String,
    },
    /// A custom tool ([`custom`]) refused its registration or failed a call.
    #[error("tool `{tool}`: {message}")]
    Custom {
        /// Tool name.
        tool: String,
        /// What happened.
        message: String,
    },
    /// The sandbox could not start or follow the program.
    #[error("tool `{tool}`: {source}")]
    Sandbox {
        /// Tool name.
        tool: &'static str,
        /// The sandbox failure.
        #[source]
        source: sandbox::SandboxError,
    },
}

/// Runs a built-in tool to completion.
pub fn run_tool(call: &ToolCall) -> Result<ToolOutcome, ToolError> {
    match call.tool.as_str() {
        python_tests::NAME => python_tests::run(call),
        majority_vote::NAME => majority_vote::run(call),
        shell::NAME => shell::run(call),
        other => custom::run(call)
            .unwrap_or_else(|| Err(ToolError::UnknownTool { tool: other.to_string(), known: custom::all_names().join(", ") })),
    }
}

/// A key that identifies what a call computes, for memoising outcomes: two calls with the
/// same key give the same outcome (on one backend). For `python_tests` it is the job the tool
/// runs — the code *extracted* from its fenced block, the tests, the imports, the timeout — so
/// calls whose inputs differ only in the prose around the code share it; `None` when the
/// inputs cannot be read or for other tools (the caller keys on the call as it is).
pub fn canonical_key(call: &ToolCall) -> Option<String> {
    match call.tool.as_str() {
        python_tests::NAME => {
            let job = python_tests::PythonTests::from_call(call).ok()?;
            serde_json::to_string(&(NAME_PREFIX_PYTHON_TESTS, &job.code, &job.tests, &job.imports, job.timeout_s.to_bits())).ok()
        }
        _ => None,
    }
}

const NAME_PREFIX_PYTHON_TESTS: &str = "python_tests/job";

/// The deterministic duration of a call for virtual time, from its inputs alone.
///
/// `python_tests`: start-up + per-test + per-KiB-of-source + per-import terms measured on this
/// machine (constants and medians in [`python_tests`]), capped at the call's timeout.
/// `majority_vote`: [`majority_vote::MODELED_DURATION_S`]. `shell`: start-up plus the command
/// line's `sleep`s ([`shell::sleep_seconds`]), capped at the timeout. Calls whose inputs cannot be read
/// (or unknown tools) get the start-up term alone; [`run_tool`] rejects them anyway.
pub fn modeled_duration_s(call: &ToolCall) -> f64 {
    match call.tool.as_str() {
        python_tests::NAME => python_tests::PythonTests::from_call(call)
            .map(|job| job.modeled_duration_s())
            .unwrap_or(python_tests::MODEL_STARTUP_S),
        majority_vote::NAME => majority_vote::MODELED_DURATION_S,
        shell::NAME => shell::ShellJob::from_call(call).map_or(shell::MODEL_STARTUP_S, |job| job.modeled_duration_s()),
        other => custom::spec(other).map_or(python_tests::MODEL_STARTUP_S, |s| s.modeled_duration_s),
    }
}

/// True when a python3 interpreter runs inside the sandbox here (probed once per process).
pub fn python3_available() -> bool {
    python::interpreter().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(code: &str, tests: &[&str]) -> ToolCall {
        ToolCall {
            tool: python_tests::NAME.into(),
            inputs: [
                ("code".to_string(), serde_json::json!(code)),
                ("tests".to_string(), serde_json::json!(tests)),
            ]
            .into_iter()
            .collect(),
            timeout_s: Some(5.0),
        }
    }

    #[test]
    fn the_canonical_key_is_the_job_not_the_prose_around_the_code() {
        let a = call("Here you go:\n```python\ndef f(x):\n    return x\n```\nIt returns x.", &["assert f(1) == 1"]);
        let b = call("```python\ndef f(x):\n    return x\n```\nThis defines f, which is the identity.", &["assert f(1) == 1"]);
        let other_code = call("```python\ndef f(x):\n    return x + 1\n```", &["assert f(1) == 1"]);
        let other_tests = call("```python\ndef f(x):\n    return x\n```", &["assert f(2) == 2"]);
        let key = |c: &ToolCall| canonical_key(c).expect("a readable call has a key");
        assert_eq!(key(&a), key(&b));
        assert_ne!(key(&a), key(&other_code));
        assert_ne!(key(&a), key(&other_tests));
        let mut slower = a.clone();
        slower.timeout_s = Some(10.0);
        assert_ne!(key(&a), key(&slower), "the timeout is part of the job");
        let unreadable = ToolCall { inputs: BTreeMap::new(), ..a.clone() };
        assert_eq!(canonical_key(&unreadable), None);
        let vote = ToolCall { tool: majority_vote::NAME.into(), ..a };
        assert_eq!(canonical_key(&vote), None);
    }
}
