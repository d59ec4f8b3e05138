//! The `python_tests` tool: run candidate Python code against assert-style unit tests.
//!
//! Owns input parsing, code extraction from fenced LLM output, the runner script, the parsing
//! of its report, the verdict and the choice of sandbox ([`Backend`]). The code runs, one
//! interpreter per call,
//! * in CPython 3.12 compiled to WASI ([`crate::python_wasm`]) under the [`WasmSandbox`] when
//!   that runtime is installed: `python -I -S -B /work/job.py`, 512 MiB of linear memory, the
//!   timeout checked at epoch ticks, only the work directory visible, no sockets;
//! * otherwise in the host's python3 under the [`ProcessSandbox`] (`python3 -I -S -B job.py`,
//!   512 MiB of address space, 10 processes, the timeout as `RLIMIT_CPU`), and the outcome's
//!   `sandbox_note` says that this is a fallback and why. The note is the same on every call, so a report that
//!   collects distinct notes (the simulator's) states it once.
//!
//! `SWITCHYARD_PYTHON_SANDBOX=auto|wasm|process` overrides the choice. Must not depend on the
//! runtime.
//!
//! The runner executes the import lines, then the code, then each test separately in one
//! shared namespace, and reports every step on its own line through its own writer on the
//! original stdout (the candidate's prints go to stderr: in a process the descriptors are
//! swapped with `dup2`; in WASI, which has no `dup`, `sys.stdout` is pointed at stderr), so they
//! cannot be confused with the report unless the code deliberately writes to that descriptor —
//! the report is a convenience for honest code, not a security boundary; the verdict's safety
//! comes from the sandbox. Report lines, tab-separated:
//! `import|code|test <index> ok` or `… fail <ExceptionType> <escaped message>`, then `done`.
//! A forked copy of the runner (process sandbox only) exits silently instead of reporting.
//!
//! The timeout is CPU time (see [`PythonTests::limits`]): a verdict must not depend on how
//! loaded the machine is, and a run that computes for its whole budget is stopped at the same
//! point of its work however many other runs share the cores (on a loaded machine a wall-clock
//! limit cut a candidate that needs ~6 s of a 10 s budget). The wall clock only backstops runs
//! that wait instead of computing (a `sleep`). Both stops read `timed out after X s` (X the
//! timeout) and are modeled as lasting X; the value's `limits_hit` says which clock it was.
//!
//! Verdict `pass` only when the imports and the code ran and every test passed; otherwise
//! `fail` with a reason: the first failure (`assert f(2) == 4 -> AssertionError`), a failing
//! import or code (`SyntaxError: …`), `timed out after X s` (either clock), or the interpreter
//! dying (a signal, or a WebAssembly trap). Never an error of the caller: only bad inputs, no
//! usable interpreter and sandbox failures are [`ToolError`]s.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::majority_vote::kind;
use crate::python::{PYTHON_FLAGS, interpreter};
use crate::python_wasm::{PYTHON_WASM_VERSION, default_install_path, is_pinned_runtime, python_wasm_path};
use crate::sandbox::wasm::{GUEST_WORK_DIR, module_from_file};
use crate::sandbox::{
    LimitHit, ProcessSandbox, Sandbox, SandboxJob, SandboxLimits, SandboxOutcome, Termination, WasmSandbox,
};
use crate::trusted_asserts::{CompareOp, GUEST_LITERAL_PY, PyValue, SplitAssert, compare, parse_literal, split_assert};
use crate::{ToolCall, ToolError, ToolFailure, ToolFailureCause, ToolOutcome, VerdictChecks};

/// Tool name.
pub const NAME: &str = "python_tests";

/// Wall-clock limit when neither the input nor the call gives one.
pub const DEFAULT_TIMEOUT_S: f64 = 5.0;

/// Largest accepted `timeout_s` (assumption: a unit-test run longer than ten minutes is a
/// workflow bug, and a limit this size still lets the caller finish).
pub const MAX_TIMEOUT_S: f64 = 600.0;

/// The wall-clock backstop of a run, as a multiple of its timeout (plus
/// [`WALL_BACKSTOP_SLACK_S`]). Assumption: 2 × leaves a computing run its whole CPU budget on a
/// machine whose cores are shared by two busy runs, and bounds one that only waits.
pub const WALL_BACKSTOP_FACTOR: f64 = 2.0;

/// Seconds added to the wall-clock backstop (interpreter start-up and sandbox set-up, which count
/// on the wall clock; assumption: 1 s covers them under load with room).
pub const WALL_BACKSTOP_SLACK_S: f64 = 1.0;

/// Longest result text, in bytes (the "about 1 KB" of the tool's specification).
pub const MAX_TEXT_BYTES: usize = 1024;

/// Longest tail of the candidate's own output kept in the value, in bytes.
const MAX_OUTPUT_TAIL_BYTES: usize = 2048;

// Duration model for virtual time, calibrated with `cargo run -p switchyard-tools --example
// tool_durations 40` on the 2-core development VM (Python 3.11.2 at /usr/bin/python3, full process
// sandbox, other builds running, so medians of 40 runs over several sessions). Medians of the
// whole tool call, in ms, from four sessions:
//
// | case                              | runs of 40       |
// |-----------------------------------|------------------|
// | 1 trivial test                    | 19.8 20.0 20.1 24.2 |
// | 8 trivial tests                   | 22.3 22.8 20.3 28.0 |
// | 32 trivial tests                  | 23.1 17.0 24.3 25.3 |
// | 16 KiB of function definitions    | 35.1 28.7 30.9 41.0 |
// | 64 KiB of function definitions    | 61.8 59.1 55.9 60.9 |
// | 1 test + `import math`            | 26.0 20.7 20.7 21.7 |
//
// Of the start-up, the sandbox itself (namespaces, rlimits, uid, work dir, group and uid kill)
// costs about 1.6 ms (median of `/bin/true` runs); the rest is the interpreter.
// The 427 MBPP reference solutions all pass, at a median of 24 ms per call.
//
// Re-measured after the private root, PID/IPC namespaces and seccomp filter (release build, idle
// 2-core VM, 40 runs, `tool_durations 40`): the sandbox costs 2.9 ms per `/bin/true`; whole calls
// fit start-up 21.6 ms, per test 0.0 ms, per KiB 0.53 ms; the 427 references all pass at a median
// of 18.6 ms per call (model/measured total 0.77, median relative error 15 %). Within the spread
// above, so the constants stay.

/// Modeled duration, part 1: interpreter start-up plus the sandbox and the runner's fixed work
/// (the one-test medians above, ≈ 20 ms).
pub const MODEL_STARTUP_S: f64 = 0.020;
/// Modeled duration, part 2: each test (compile, exec, one report line). The slope over 1, 8
/// and 32 tests is within the noise (−0.13 … +0.14 ms); 0.1 ms is its upper end.
pub const MODEL_PER_TEST_S: f64 = 0.000_1;
/// Modeled duration, part 3: each KiB of code and test source (compilation); least-squares
/// slope over 0, 16 and 64 KiB: 0.55 – 0.58 ms per KiB.
pub const MODEL_PER_KIB_S: f64 = 0.000_55;
/// Modeled duration, part 4: each import line (`import math`: 0.6 – 0.7 ms in the quieter
/// sessions; heavier modules cost more, which the model deliberately ignores).
pub const MODEL_PER_IMPORT_S: f64 = 0.000_6;

/// Start of the runner in a process: the report gets a duplicate of fd 1, fd 1 becomes stderr,
/// and a forked copy is recognised by its pid.
const PROCESS_PROLOGUE: &str = r#"
import os as _os
_PID = _os.getpid()
_REPORT = open(_os.dup(1), "w", encoding="utf-8", errors="replace")
_os.dup2(2, 1)

def _forked():
    return _os.getpid() != _PID
"#;

/// Start of the runner in WASI (no `dup`, no `fork`): the report writes to fd 1 through its own
/// file object, the candidate's `sys.stdout` is stderr, and relative paths resolve in the work
/// directory (as in a process, whose cwd it is).
const WASM_PROLOGUE: &str = r#"
import os as _os
import sys as _sys
_REPORT = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
_sys.stdout = _sys.stderr
try:
    _os.chdir("/work")
except OSError:
    pass

def _forked():
    return False
"#;

/// The runner executed by the interpreter; the inputs (literals) and a prologue precede it.
const RUNNER: &str = r#"
def _emit(kind, index, error):
    if _forked():
        _os._exit(0)
    if error is None:
        _REPORT.write("%s\t%d\tok\n" % (kind, index))
    else:
        name = "BaseException"
        message = ""
        try:
            name = type(error).__name__
            message = str(error)
        except BaseException:
            message = "<unprintable message>"
        message = message[:600].replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
        _REPORT.write("%s\t%d\tfail\t%s\t%s\n" % (kind, index, name, message))
    _REPORT.flush()

def _run(kind, index, source, filename, namespace):
    try:
        exec(compile(source, filename, "exec"), namespace)
    except BaseException as error:
        _emit(kind, index, error)
        return False
    _emit(kind, index, None)
    return True

def _value(index, source, namespace):
    try:
        # The value as a Python literal in ASCII (trusted_asserts::GUEST_LITERAL_PY); a value
        # that is not one (a user object) raises, which fails the check.
        text = __switchyard_literal(eval(compile(source, "<test %d>" % index, "eval"), namespace))
    except BaseException as error:
        _emit("test", index, error)
        return
    if _forked():
        _os._exit(0)
    if len(text) > _MAX_REPR:
        text = "\x00too long"
    text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
    _REPORT.write("value\t%d\t%s\n" % (index, text))
    _REPORT.flush()

def _main():
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    for index, line in enumerate(_IMPORTS):
        if not _run("import", index, line, "<import %d>" % index, namespace):
            return
    if not _run("code", 0, _CODE, "<candidate>", namespace):
        return
    for index, (kind, source) in enumerate(_TESTS):
        if kind == "value":
            _value(index, source, namespace)
        else:
            _run("test", index, source, "<test %d>" % index, namespace)

_main()
if not _forked():
    _REPORT.write("done\n")
    _REPORT.flush()
"#;

/// How one test is checked.
#[derive(Debug, Clone)]
pub enum Check {
    /// Outside the sandbox: the sandbox evaluates `expression` and returns its `repr` as data;
    /// [`trusted_asserts::compare`] decides against `expected`, which never enters the sandbox.
    Value {
        /// The candidate-side expression.
        expression: String,
        /// The expected value.
        expected: PyValue,
        /// The comparison.
        op: CompareOp,
    },
    /// Inside the sandbox: the statement runs whole and the sandboxed code reports whether it
    /// raised, so the outcome is untrusted.
    Statement {
        /// Why it could not be split ([`SplitAssert::Untrusted`]).
        reason: String,
    },
}

impl Check {
    /// The check of one test statement.
    pub fn of(test: &str) -> Self {
        match split_assert(test) {
            SplitAssert::Compare { expression, expected, op } => Check::Value { expression, expected, op },
            SplitAssert::Untrusted { reason } => Check::Statement { reason },
        }
    }

    /// True for a check decided outside the sandbox.
    pub fn is_outside(&self) -> bool {
        matches!(self, Check::Value { .. })
    }
}

/// Longest `repr` of a value the runner reports (characters); a longer one fails its check.
pub const MAX_VALUE_REPR_CHARS: usize = 8192;

/// Parsed inputs of one call.
#[derive(Debug, Clone)]
pub struct PythonTests {
    /// The code to test (already extracted from a fenced block when there was one).
    pub code: String,
    /// One assert statement (or any statement) per test.
    pub tests: Vec<String>,
    /// How each test is checked (by index).
    pub checks: Vec<Check>,
    /// Import lines run before the code.
    pub imports: Vec<String>,
    /// Time limit in seconds: CPU time, with a looser wall-clock backstop ([`Self::limits`]).
    pub timeout_s: f64,
}

impl PythonTests {
    /// Reads the inputs of `call`: `code` (string), `tests` (non-empty list of strings),
    /// `imports` (list of strings, optional), `timeout_s` (number, optional). The timeout is
    /// the input's when given, else the call's, else [`DEFAULT_TIMEOUT_S`].
    pub fn from_call(call: &ToolCall) -> Result<Self, ToolError> {
        let code = match call.inputs.get("code") {
            Some(Value::String(s)) => extract_code(s).to_string(),
            Some(other) => return Err(invalid("code", format!("must be a string, got {}", kind(other)))),
            None => return Err(ToolError::MissingInput { tool: NAME, field: "code" }),
        };
        let tests = string_list(call.inputs.get("tests"), "tests")?
            .ok_or(ToolError::MissingInput { tool: NAME, field: "tests" })?;
        if tests.is_empty() {
            return Err(invalid("tests", "must contain at least one test".into()));
        }
        let imports = string_list(call.inputs.get("imports"), "imports")?.unwrap_or_default();
        let timeout_s = match call.inputs.get("timeout_s") {
            None | Some(Value::Null) => call.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S),
            Some(Value::Number(n)) => n.as_f64().unwrap_or(f64::NAN),
            Some(other) => return Err(invalid("timeout_s", format!("must be a number, got {}", kind(other)))),
        };
        if !(timeout_s.is_finite() && timeout_s > 0.0 && timeout_s <= MAX_TIMEOUT_S) {
            return Err(invalid("timeout_s", format!("must be in (0, {MAX_TIMEOUT_S}] seconds, got {timeout_s}")));
        }
        let checks = tests.iter().map(|t| Check::of(t)).collect();
        Ok(Self { code, tests, checks, imports, timeout_s })
    }

    /// Checks decided outside the sandbox and inside it.
    pub fn verdict_checks(&self) -> VerdictChecks {
        let outside = self.checks.iter().filter(|c| c.is_outside()).count() as u32;
        VerdictChecks { outside, untrusted: self.checks.len() as u32 - outside }
    }

    /// The deterministic duration model (see the `MODEL_*` constants), capped at the timeout.
    pub fn modeled_duration_s(&self) -> f64 {
        let source_bytes = self.code.len() + self.tests.iter().map(String::len).sum::<usize>();
        let modeled = MODEL_STARTUP_S
            + MODEL_PER_TEST_S * self.tests.len() as f64
            + MODEL_PER_KIB_S * source_bytes as f64 / 1024.0
            + MODEL_PER_IMPORT_S * self.imports.len() as f64;
        modeled.min(self.timeout_s)
    }

    /// The Python source of `job.py` for the process sandbox: the inputs as literals, followed
    /// by the runner.
    pub fn runner_script(&self) -> String {
        self.script_with(PROCESS_PROLOGUE)
    }

    /// The Python source of `job.py` for CPython on WASI (its prologue reports without `dup`).
    pub fn wasm_runner_script(&self) -> String {
        self.script_with(WASM_PROLOGUE)
    }

    fn script_with(&self, prologue: &str) -> String {
        // A JSON string literal is a valid Python string literal (serde_json emits only
        // escapes Python shares: \" \\ \n \r \t \b \f \uXXXX), and so are lists of them.
        // Only the candidate side of a split assert enters the script; its expected value
        // stays here.
        let steps: Vec<Value> = self
            .checks
            .iter()
            .zip(&self.tests)
            .map(|(check, test)| match check {
                Check::Value { expression, .. } => json!(["value", expression]),
                Check::Statement { .. } => json!(["exec", test]),
            })
            .collect();
        format!(
            "_IMPORTS = {}\n_CODE = {}\n_TESTS = {}\n_MAX_REPR = {MAX_VALUE_REPR_CHARS}\n{prologue}{GUEST_LITERAL_PY}{RUNNER}",
            Value::from(self.imports.clone()),
            Value::from(self.code.clone()),
            Value::from(steps)
        )
    }

    /// The limits of a run: the timeout as CPU limit, rounded up to whole seconds (the unit of
    /// `RLIMIT_CPU`; a job given 20 s may spend them computing, as MBPP task 123's reference
    /// needs about 6 s of CPU), and a wall-clock backstop of [`WALL_BACKSTOP_FACTOR`] times the
    /// timeout plus [`WALL_BACKSTOP_SLACK_S`] for a run that waits instead of computing; the rest
    /// from [`SandboxLimits::default`]. The split is a contest judge's (IOI's `isolate`: `--time`
    /// CPU, a looser `--wall-time`): a busy run meets the CPU limit at the same point of its
    /// work on an idle or a loaded machine, where a wall limit cut it earlier under load.
    pub fn limits(&self) -> SandboxLimits {
        SandboxLimits {
            wall_time: Duration::from_secs_f64(self.timeout_s * WALL_BACKSTOP_FACTOR + WALL_BACKSTOP_SLACK_S),
            cpu_seconds: self.cpu_limit_s(),
            ..SandboxLimits::default()
        }
    }

    /// The CPU limit in whole seconds: the timeout rounded up, at least 1.
    fn cpu_limit_s(&self) -> u64 {
        (self.timeout_s.ceil() as u64).max(1)
    }
}

fn invalid(field: &'static str, problem: String) -> ToolError {
    ToolError::InvalidInput { tool: NAME, field, problem }
}

fn string_list(value: Option<&Value>, field: &'static str) -> Result<Option<Vec<String>>, ToolError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(s.clone()),
                other => Err(invalid(field, format!("entry {i} must be a string, got {}", kind(other)))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(invalid(field, format!("must be a list of strings, got {}", kind(other)))),
    }
}

/// The code inside the first ```` ```python ```` (or ```` ```py ````/```` ```python3 ````) fenced
/// block of `text`, up to the closing fence or the end; `text` itself when there is no such
/// block.
pub fn extract_code(text: &str) -> &str {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        let start = offset + line.len();
        offset = start;
        let Some(tag) = trimmed.strip_prefix("```") else { continue };
        if !matches!(tag.trim().to_ascii_lowercase().as_str(), "python" | "py" | "python3") {
            continue;
        }
        let body = &text[start..];
        let mut end = 0;
        for inner in body.split_inclusive('\n') {
            if inner.trim_start().starts_with("```") {
                return &body[..end];
            }
            end += inner.len();
        }
        return body;
    }
    text
}

/// Outcome of one step of the runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFailure {
    /// Exception type name, e.g. `AssertionError`.
    pub exception: String,
    /// Exception message (may be empty).
    pub message: String,
}

impl StepFailure {
    /// `AssertionError` or `NameError: name 'f' is not defined`.
    pub fn describe(&self) -> String {
        if self.message.is_empty() { self.exception.clone() } else { format!("{}: {}", self.exception, self.message) }
    }
}

/// What the runner reported; `None` entries never ran (or their report was lost).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunnerReport {
    /// Per import line.
    pub imports: Vec<Option<Result<(), StepFailure>>>,
    /// The code.
    pub code: Option<Result<(), StepFailure>>,
    /// Per test: its outcome, for a value check decided here from the reported value.
    pub tests: Vec<Option<Result<(), StepFailure>>>,
    /// The runner reached its end.
    pub done: bool,
}

/// Parses the runner's report lines and decides the value checks; unknown or malformed lines,
/// and lines of the wrong kind for a test (`ok` for a value check, a value for a statement),
/// are ignored; the first line about a step counts.
pub fn parse_report(stdout: &str, imports: usize, checks: &[Check]) -> RunnerReport {
    let mut report =
        RunnerReport { imports: vec![None; imports], code: None, tests: vec![None; checks.len()], done: false };
    for line in stdout.lines() {
        if line == "done" {
            report.done = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("value\t") {
            let Some((index, text)) = rest.split_once('\t') else { continue };
            let Some(index) = index.parse::<usize>().ok() else { continue };
            if let (Some(Check::Value { expected, op, .. }), Some(slot @ None)) = (checks.get(index), report.tests.get_mut(index)) {
                *slot = Some(decide(&unescape(text), expected, *op));
            }
            continue;
        }
        let fields: Vec<&str> = line.splitn(5, '\t').collect();
        let (Some(&phase), Some(index), Some(&status)) =
            (fields.first(), fields.get(1).and_then(|i| i.parse::<usize>().ok()), fields.get(2))
        else {
            continue;
        };
        let result = match status {
            "ok" => Ok(()),
            "fail" => Err(StepFailure {
                exception: fields.get(3).unwrap_or(&"Exception").to_string(),
                message: unescape(fields.get(4).unwrap_or(&"")),
            }),
            _ => continue,
        };
        let slot = match phase {
            "import" => report.imports.get_mut(index),
            "code" if index == 0 => Some(&mut report.code),
            // A value check passes only by its value; the guest may still report that
            // evaluating the expression raised (a failure it could always cause anyway).
            "test" if matches!(checks.get(index), Some(Check::Statement { .. })) || result.is_err() => {
                report.tests.get_mut(index)
            }
            _ => None,
        };
        if let Some(slot @ None) = slot {
            *slot = Some(result);
        }
    }
    report
}

/// The outcome of a value check: the reported `repr` parsed as a Python literal and compared
/// with the expectation, here, outside the sandbox.
fn decide(reported: &str, expected: &PyValue, op: CompareOp) -> Result<(), StepFailure> {
    let fail = |message: String| Err(StepFailure { exception: "AssertionError".into(), message });
    if reported.starts_with('\0') {
        return fail(format!("value longer than {MAX_VALUE_REPR_CHARS} characters"));
    }
    match parse_literal(reported) {
        Ok(got) if compare(op, &got, expected) => Ok(()),
        Ok(got) => fail(format!("got {}", clip(&got.to_string(), 200))),
        Err(_) => fail(format!("value is not a literal: {}", clip(reported, 200))),
    }
}

/// Reverses the runner's escaping of `\\`, `\n`, `\t`.
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// `text` cut to at most `max` bytes on a character boundary, with `…` when cut.
fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The last `max` bytes of `text`, on a character boundary.
fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

fn seconds(s: f64) -> String {
    format!("{}", (s * 1000.0).round() / 1000.0)
}

/// The verdict of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// `pass` or `fail`.
    pub passed: bool,
    /// Tests that passed.
    pub tests_passed: usize,
    /// Why it failed (`None` on pass).
    pub reason: Option<String>,
    /// `k/n tests passed[; reason]`, at most [`MAX_TEXT_BYTES`].
    pub text: String,
}

/// Judges a run from the runner's report and the sandbox outcome.
pub fn judge(job: &PythonTests, report: &RunnerReport, outcome: &SandboxOutcome) -> Judgement {
    let total = job.tests.len();
    let tests_passed = report.tests.iter().filter(|t| matches!(t, Some(Ok(())))).count();
    let first_test_failure = report.tests.iter().enumerate().find_map(|(i, t)| match t {
        Some(Err(f)) => Some(format!("first failure: {} -> {}", clip(job.tests[i].trim(), 240), clip(&f.describe(), 300))),
        _ => None,
    });
    let import_failure = report.imports.iter().enumerate().find_map(|(i, t)| match t {
        Some(Err(f)) => Some(format!("import failed: {} -> {}", clip(job.imports[i].trim(), 120), clip(&f.describe(), 300))),
        _ => None,
    });
    let code_failure = match &report.code {
        Some(Err(f)) => Some(format!("code failed: {}", clip(&f.describe(), 400))),
        _ => None,
    };
    // Either stop is the timeout, and reads the same: which clock stopped a run depends on the
    // load (a busy run meets the wall-clock backstop first only on a machine so loaded that it
    // got under half a core), and the text enters successors' prompts. `limits_hit` says which.
    let stopped = if outcome.timed_out || outcome.limits_hit.contains(&LimitHit::CpuTime) {
        Some(format!("timed out after {} s", seconds(job.timeout_s)))
    } else if !report.done {
        Some(format!("interpreter stopped before finishing ({})", outcome.ending()))
    } else {
        None
    };
    let passed = stopped.is_none()
        && report.done
        && report.imports.iter().all(|s| matches!(s, Some(Ok(()))))
        && matches!(report.code, Some(Ok(())))
        && tests_passed == total;
    let reason = if passed {
        None
    } else {
        // A stop (timeout, CPU limit, crash) comes first: it is why the remaining steps have no
        // result. A failure reported before the stop is added after it.
        let earlier = import_failure.or(code_failure).or(first_test_failure);
        Some(match (stopped, earlier) {
            (Some(stop), Some(earlier)) => format!("{stop}; {earlier}"),
            (Some(stop), None) => stop,
            (None, Some(earlier)) => earlier,
            (None, None) => format!("no test result ({})", outcome.ending()),
        })
    };
    let text = match &reason {
        None => format!("{tests_passed}/{total} tests passed"),
        Some(reason) => clip(&format!("{tests_passed}/{total} tests passed; {reason}"), MAX_TEXT_BYTES),
    };
    Judgement { passed, tests_passed, reason, text }
}

fn limit_name(limit: LimitHit) -> &'static str {
    match limit {
        LimitHit::WallTime => "wall_time",
        LimitHit::CpuTime => "cpu_time",
        LimitHit::FileSize => "file_size",
        LimitHit::Output => "output",
        LimitHit::Memory => "memory",
        LimitHit::WorkArea => "work_area",
        LimitHit::OpenFiles => "open_files",
        LimitHit::Syscall => "syscall",
    }
}

/// Environment variable overriding the choice of sandbox: `auto` (default), `wasm`, `process`.
pub const BACKEND_ENV: &str = "SWITCHYARD_PYTHON_SANDBOX";

/// Which sandbox runs the candidate code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// CPython on WASI when its runtime is installed and loads, else the process sandbox.
    Auto,
    /// CPython on WASI only; a call fails with [`ToolError::Unavailable`] without the runtime.
    Wasm,
    /// The host's python3 in the process sandbox.
    Process,
}

impl Backend {
    /// Parses `auto`, `wasm` or `process`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "auto" => Some(Self::Auto),
            "wasm" => Some(Self::Wasm),
            "process" => Some(Self::Process),
            _ => None,
        }
    }

    /// The backend [`BACKEND_ENV`] asks for ([`Backend::Auto`] when unset or empty).
    pub fn from_env() -> Result<Self, ToolError> {
        match std::env::var(BACKEND_ENV) {
            Err(_) => Ok(Self::Auto),
            Ok(value) if value.is_empty() => Ok(Self::Auto),
            Ok(value) => Self::parse(&value).ok_or_else(|| ToolError::Unavailable {
                tool: NAME,
                reason: format!("{BACKEND_ENV}={value:?} is not one of auto, wasm, process"),
            }),
        }
    }
}

/// Why the CPython-on-WASI runtime cannot be used ([`wasm_runtime`]).
#[derive(Debug, thiserror::Error)]
pub enum WasmRuntimeError {
    /// No `python.wasm` at the install path (`place`, as shown).
    #[error("python.wasm is not installed at {place} (install it with `cargo run -p switchyard-tools --example install_python_wasm`)")]
    NotInstalled { place: String },
    /// The file could not be read or compiled.
    #[error(transparent)]
    Load(#[from] crate::sandbox::SandboxError),
    /// The file is not the pinned build.
    #[error("{} does not match the pinned SHA-256; reinstall it", .path.display())]
    NotPinned { path: PathBuf },
}

/// The installed CPython-on-WASI runtime, loaded (compiled once per process) and checked against
/// its pinned hash; otherwise why it cannot be used.
pub fn wasm_runtime() -> Result<PathBuf, WasmRuntimeError> {
    let Some(path) = python_wasm_path() else {
        let place = default_install_path()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "$SWITCHYARD_HOME (unset, and no $HOME)".into());
        return Err(WasmRuntimeError::NotInstalled { place });
    };
    let loaded = module_from_file(&path)?;
    if !is_pinned_runtime(&loaded.sha256) {
        return Err(WasmRuntimeError::NotPinned { path });
    }
    Ok(path)
}

/// Runs the tool with the sandbox [`Backend::from_env`] selects.
pub fn run(call: &ToolCall) -> Result<ToolOutcome, ToolError> {
    run_with(call, Backend::from_env()?)
}

/// Runs the tool with the given backend.
pub fn run_with(call: &ToolCall, backend: Backend) -> Result<ToolOutcome, ToolError> {
    let job = PythonTests::from_call(call)?;
    let fallback_reason = match backend {
        Backend::Process => None,
        Backend::Wasm | Backend::Auto => match wasm_runtime() {
            Ok(python_wasm) => return run_in_wasm(&WasmSandbox::new(), &python_wasm, &job),
            Err(reason) if backend == Backend::Wasm => return Err(ToolError::Unavailable { tool: NAME, reason: reason.to_string() }),
            Err(reason) => Some(reason.to_string()),
        },
    };
    let python = interpreter().ok_or_else(|| {
        // The sandbox refusing to run without its isolation is the reason to give, not the
        // interpreter.
        let none = crate::python::isolation_refused().unwrap_or_else(|| "no python3 interpreter runs inside the sandbox on this machine".into());
        ToolError::Unavailable {
            tool: NAME,
            reason: match &fallback_reason {
                Some(reason) => format!("{reason}, and in the process sandbox: {none}"),
                None => none,
            },
        }
    })?;
    let mut outcome = run_in(&ProcessSandbox::new(), &python.path, &python.version, &job)?;
    if let (Some(reason), Some(note)) = (fallback_reason, outcome.sandbox_note.as_mut()) {
        *note = format!("python_tests fell back to the process sandbox: {reason}; {note}");
    }
    Ok(outcome)
}

/// Runs `job` with the given (process-like) sandbox and interpreter: `python -I -S -B job.py`
/// in the work directory.
pub fn run_in(
    sandbox: &dyn Sandbox,
    python: &Path,
    python_version: &str,
    job: &PythonTests,
) -> Result<ToolOutcome, ToolError> {
    let mut args: Vec<String> = PYTHON_FLAGS.iter().map(|s| s.to_string()).collect();
    args.push("job.py".into());
    let sandbox_job = SandboxJob {
        program: python.to_path_buf(),
        args,
        files: vec![("job.py".to_string(), job.runner_script().into_bytes())],
        limits: job.limits(),
        read_only_paths: crate::python::read_only_paths(python),
        allow_children: false,
    };
    run_job(sandbox, &sandbox_job, python_version, job)
}

/// Runs `job` in CPython on WASI (`python_wasm`, the module file) under `sandbox`:
/// `python -I -S -B /work/job.py`, with the job's timeout as deadline and its address-space
/// limit as the linear-memory limit.
pub fn run_in_wasm(sandbox: &WasmSandbox, python_wasm: &Path, job: &PythonTests) -> Result<ToolOutcome, ToolError> {
    let mut args: Vec<String> = PYTHON_FLAGS.iter().map(|s| s.to_string()).collect();
    args.push(format!("{GUEST_WORK_DIR}/job.py"));
    let sandbox_job = SandboxJob {
        program: python_wasm.to_path_buf(),
        args,
        files: vec![("job.py".to_string(), job.wasm_runner_script().into_bytes())],
        limits: job.limits(),
        read_only_paths: Vec::new(),
        allow_children: false,
    };
    run_job(sandbox, &sandbox_job, PYTHON_WASM_VERSION, job)
}

fn run_job(
    sandbox: &dyn Sandbox,
    sandbox_job: &SandboxJob,
    python_version: &str,
    job: &PythonTests,
) -> Result<ToolOutcome, ToolError> {
    let started = Instant::now();
    let outcome = sandbox.run(sandbox_job).map_err(|source| ToolError::Sandbox { tool: NAME, source })?;
    let report = parse_report(&outcome.stdout, job.imports.len(), &job.checks);
    let judgement = judge(job, &report, &outcome);

    let tests: Vec<Value> = job
        .tests
        .iter()
        .zip(&report.tests)
        .zip(&job.checks)
        .map(|((test, result), check)| {
            json!({
                "test": test,
                "ran": result.is_some(),
                "passed": matches!(result, Some(Ok(()))),
                "error": match result { Some(Err(f)) => Some(f.describe()), _ => None },
                "checked": if check.is_outside() { "outside_sandbox" } else { "untrusted" },
            })
        })
        .collect();
    let memory = report
        .imports
        .iter()
        .chain(std::iter::once(&report.code))
        .chain(&report.tests)
        .any(|s| matches!(s, Some(Err(f)) if f.exception == "MemoryError"));
    let mut limits: Vec<&str> = outcome.limits_hit.iter().map(|&l| limit_name(l)).collect();
    if memory && !limits.contains(&"memory") {
        limits.push("memory");
    }
    // Virtual time must not depend on how fast or loaded this machine was: a run stopped by
    // either clock is modeled as lasting exactly the timeout, any other run by the model.
    let modeled = if outcome.timed_out || outcome.limits_hit.contains(&LimitHit::CpuTime) {
        job.timeout_s
    } else {
        job.modeled_duration_s()
    };
    let failure = failure_of(&report, &outcome, &judgement);
    let checks = job.verdict_checks();
    let value = json!({
        "passed": judgement.tests_passed,
        "total": job.tests.len(),
        "failure": failure.as_ref().map(|f| json!({"cause": f.cause.name(), "detail": f.detail})),
        "checks_outside_sandbox": checks.outside,
        "checks_untrusted": checks.untrusted,
        "tests": tests,
        "reason": judgement.reason,
        "timed_out": outcome.timed_out || outcome.limits_hit.contains(&LimitHit::CpuTime),
        "limits_hit": limits,
        "termination": outcome.ending(),
        "output": tail(&outcome.stderr, MAX_OUTPUT_TAIL_BYTES),
        "interpreter": python_version,
        "sandbox": sandbox.name(),
    });
    Ok(ToolOutcome {
        text: judgement.text,
        verdict: Some(if judgement.passed { "pass" } else { "fail" }.to_string()),
        value,
        modeled_duration_s: modeled,
        wall_seconds: started.elapsed().as_secs_f64(),
        sandbox_note: Some(format!("{} sandbox: {}", sandbox.name(), sandbox.describe(&outcome))),
        failure,
        checks,
    })
}

/// Which limit an `OSError` message names, by its error text (the same in a Linux process and
/// in WASI, whose errno numbers differ): work area full, file too large, or out of
/// descriptors. Informational only: the guest writes these messages, and they never decide a
/// verdict.
fn os_error_limit(failure: &StepFailure) -> Option<ToolFailureCause> {
    let message = failure.message.as_str();
    if !message.starts_with("[Errno ") {
        return None;
    }
    if message.contains("No space left on device") || message.contains("Disk quota exceeded") {
        Some(ToolFailureCause::WorkArea)
    } else if message.contains("File too large") {
        Some(ToolFailureCause::FileSize)
    } else if message.contains("Too many open files") || message.contains("No file descriptors available") {
        Some(ToolFailureCause::OpenFiles)
    } else {
        None
    }
}

/// The cause of a failed run (`None` when it passed), most specific first: what stopped the
/// interpreter, then a limit the code ran into, then a failing import or code, then the tests.
pub fn failure_of(report: &RunnerReport, outcome: &SandboxOutcome, judgement: &Judgement) -> Option<ToolFailure> {
    if judgement.passed {
        return None;
    }
    let steps: Vec<&StepFailure> = report
        .imports
        .iter()
        .chain(std::iter::once(&report.code))
        .chain(&report.tests)
        .filter_map(|s| match s {
            Some(Err(f)) => Some(f),
            _ => None,
        })
        .collect();
    let raised = |exception: &str| steps.iter().any(|f| f.exception == exception);
    let os_limit = |cause: ToolFailureCause| steps.iter().any(|f| os_error_limit(f) == Some(cause));
    let hit = |limit: LimitHit| outcome.limits_hit.contains(&limit);
    let stopped = !report.done;
    // The timeout is a CPU budget with a wall-clock backstop: either stop is this tool's timeout.
    let cause = if outcome.timed_out || hit(LimitHit::CpuTime) {
        ToolFailureCause::Timeout
    } else if hit(LimitHit::Syscall) {
        ToolFailureCause::Syscall
    } else if hit(LimitHit::Memory) || raised("MemoryError") {
        ToolFailureCause::Memory
    } else if hit(LimitHit::WorkArea) || os_limit(ToolFailureCause::WorkArea) {
        ToolFailureCause::WorkArea
    } else if hit(LimitHit::FileSize) || os_limit(ToolFailureCause::FileSize) {
        ToolFailureCause::FileSize
    } else if hit(LimitHit::OpenFiles) || os_limit(ToolFailureCause::OpenFiles) {
        ToolFailureCause::OpenFiles
    } else if stopped && outcome.stdout_truncated {
        ToolFailureCause::OutputTooLarge
    } else if stopped && matches!(outcome.termination, Termination::Signaled(_) | Termination::Trapped) {
        ToolFailureCause::Crashed
    } else if stopped {
        ToolFailureCause::Exited
    } else if report.imports.iter().chain(std::iter::once(&report.code)).any(|s| matches!(s, Some(Err(_)))) {
        ToolFailureCause::CodeError
    } else {
        ToolFailureCause::TestsFailed
    };
    let detail = judgement.reason.clone().unwrap_or_else(|| judgement.text.clone());
    Some(ToolFailure { cause, detail })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{Isolation, Termination};
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    fn call(inputs: Value) -> ToolCall {
        let inputs: BTreeMap<String, Value> = serde_json::from_value(inputs).expect("object");
        ToolCall { tool: NAME.into(), inputs, timeout_s: None }
    }

    fn job(tests: &[&str]) -> PythonTests {
        PythonTests {
            code: "def f(x):\n    return 2 * x\n".into(),
            tests: tests.iter().map(|t| t.to_string()).collect(),
            checks: tests.iter().map(|t| Check::of(t)).collect(),
            imports: vec![],
            timeout_s: 5.0,
        }
    }

    fn checks(tests: &[&str]) -> Vec<Check> {
        tests.iter().map(|t| Check::of(t)).collect()
    }

    fn outcome(stdout: &str, termination: Termination, timed_out: bool, limits_hit: Vec<LimitHit>) -> SandboxOutcome {
        SandboxOutcome {
            termination,
            timed_out,
            limits_hit,
            stdout: stdout.into(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            wall_seconds: 0.1,
            cpu_seconds: 0.05,
            max_rss_bytes: 0,
            pid: 1,
            work_dir: PathBuf::from("/nonexistent"),
            cleanup_error: None,
            isolation: Isolation::default(),
            trap: None,
        }
    }

    #[test]
    fn fenced_python_block_is_extracted() {
        let text = "Here you go:\n```python\ndef f(x):\n    return x\n```\nand an explanation";
        assert_eq!(extract_code(text), "def f(x):\n    return x\n");
        assert_eq!(extract_code("```py\nx = 1\n"), "x = 1\n", "an unclosed block runs to the end");
        assert_eq!(extract_code("```\nplain fence\n```\n```Python\ny = 2\n```"), "y = 2\n");
        assert_eq!(extract_code("x = 1  # no fence"), "x = 1  # no fence");
    }

    #[test]
    fn inputs_are_read_and_validated() {
        let parsed = PythonTests::from_call(&call(json!({
            "code": "```python\ndef f(): return 1\n```", "tests": ["assert f() == 1"], "imports": ["import math"]
        })))
        .expect("valid");
        assert_eq!(parsed.code, "def f(): return 1\n");
        assert_eq!(parsed.imports, ["import math"]);
        assert_eq!(parsed.timeout_s, DEFAULT_TIMEOUT_S);

        let mut with_call_timeout = call(json!({"code": "", "tests": ["pass"]}));
        with_call_timeout.timeout_s = Some(2.0);
        assert_eq!(PythonTests::from_call(&with_call_timeout).expect("valid").timeout_s, 2.0);
        with_call_timeout.inputs.insert("timeout_s".into(), json!(0.5));
        assert_eq!(PythonTests::from_call(&with_call_timeout).expect("valid").timeout_s, 0.5, "input wins");

        let err = |v: Value| PythonTests::from_call(&call(v)).expect_err("invalid");
        assert!(matches!(err(json!({"tests": ["pass"]})), ToolError::MissingInput { field: "code", .. }));
        assert!(matches!(err(json!({"code": "x"})), ToolError::MissingInput { field: "tests", .. }));
        assert!(matches!(err(json!({"code": 3, "tests": ["pass"]})), ToolError::InvalidInput { field: "code", .. }));
        assert!(matches!(err(json!({"code": "", "tests": []})), ToolError::InvalidInput { field: "tests", .. }));
        assert!(matches!(err(json!({"code": "", "tests": [1]})), ToolError::InvalidInput { field: "tests", .. }));
        assert!(matches!(
            err(json!({"code": "", "tests": ["pass"], "imports": "import os"})),
            ToolError::InvalidInput { field: "imports", .. }
        ));
        assert!(matches!(
            err(json!({"code": "", "tests": ["pass"], "timeout_s": -1})),
            ToolError::InvalidInput { field: "timeout_s", .. }
        ));
        assert!(matches!(
            err(json!({"code": "", "tests": ["pass"], "timeout_s": "5"})),
            ToolError::InvalidInput { field: "timeout_s", .. }
        ));
    }

    #[test]
    fn report_lines_are_parsed() {
        // Tests 0-2 are statements (untrusted), 3-4 value checks decided here.
        let tests = ["pass", "raise AssertionError", "x = 1", "assert f(1) == 2", "assert f(2) == 5"];
        let stdout = "import\t0\tok\ncode\t0\tok\ntest\t0\tok\ntest\t1\tfail\tAssertionError\t\n\
                      test\t2\tfail\tValueError\tbad\\tvalue\\nline two \\\\ end\ngarbage line\ntest\t9\tok\n\
                      value\t3\t2\nvalue\t4\t4\ndone\n";
        let report = parse_report(stdout, 1, &checks(&tests));
        assert_eq!(report.imports, [Some(Ok(()))]);
        assert_eq!(report.code, Some(Ok(())));
        assert_eq!(report.tests[0], Some(Ok(())));
        assert_eq!(
            report.tests[1],
            Some(Err(StepFailure { exception: "AssertionError".into(), message: String::new() }))
        );
        assert_eq!(
            report.tests[2],
            Some(Err(StepFailure { exception: "ValueError".into(), message: "bad\tvalue\nline two \\ end".into() }))
        );
        assert_eq!(report.tests[3], Some(Ok(())), "2 == 2, decided outside");
        assert_eq!(report.tests[4], Some(Err(StepFailure { exception: "AssertionError".into(), message: "got 4".into() })));
        assert!(report.done);
        assert!(!parse_report("test\t0\tok\n", 0, &checks(&["pass"])).done);
    }

    #[test]
    fn the_guest_cannot_claim_a_value_check() {
        let tests = ["assert f(1) == 2", "assert f(2) == [1, (2.5, 'x')]"];
        // Today's forge: report every test as passed and finish.
        let forged = "code\t0\tok\ntest\t0\tok\ntest\t1\tok\ndone\n";
        let report = parse_report(forged, 0, &checks(&tests));
        assert_eq!(report.tests, [None, None], "ok lines do not count for value checks");
        // Values are compared with Python semantics; the first line about a test counts.
        let values = "value\t0\t2.0\nvalue\t0\t3\nvalue\t1\t[1, (2.5, 'x')]\ndone\n";
        let report = parse_report(values, 0, &checks(&tests));
        assert_eq!(report.tests, [Some(Ok(())), Some(Ok(()))]);
        // A value that is no literal (a user object's repr, if a guest sent one) fails.
        let object = "value\t0\t<__main__.Forge object at 0x7f>\n";
        let report = parse_report(object, 0, &checks(&tests));
        assert!(matches!(&report.tests[0], Some(Err(f)) if f.message.starts_with("value is not a literal")), "{report:?}");
        // The expectation never enters the script.
        let script = job(&tests).runner_script();
        assert!(script.contains(r#"["value","f(2)"]"#), "{script}");
        assert!(!script.contains("2.5"), "{script}");
    }

    #[test]
    fn judgement_names_the_first_failed_assert() {
        let job = job(&["assert f(1) == 2", "assert f(2) == 5", "assert f(3) == 7"]);
        let stdout = "code\t0\tok\nvalue\t0\t2\nvalue\t1\t4\nvalue\t2\t6\ndone\n";
        let report = parse_report(stdout, 0, &job.checks);
        let j = judge(&job, &report, &outcome(stdout, Termination::Exited(0), false, vec![]));
        assert!(!j.passed);
        assert_eq!(j.tests_passed, 1);
        assert_eq!(j.text, "1/3 tests passed; first failure: assert f(2) == 5 -> AssertionError: got 4");
        let failure = failure_of(&report, &outcome(stdout, Termination::Exited(0), false, vec![]), &j).expect("failed");
        assert_eq!(failure.cause, ToolFailureCause::TestsFailed);
        assert_eq!(job.verdict_checks(), VerdictChecks { outside: 3, untrusted: 0 });
    }

    #[test]
    fn judgement_passes_only_complete_runs() {
        let job = job(&["assert f(1) == 2"]);
        let ok = "code\t0\tok\nvalue\t0\t2\ndone\n";
        let j = judge(&job, &parse_report(ok, 0, &job.checks), &outcome(ok, Termination::Exited(0), false, vec![]));
        assert!(j.passed);
        assert_eq!(j.text, "1/1 tests passed");
        assert_eq!(j.reason, None);

        // All tests reported but the runner never finished (killed afterwards): not a pass.
        let cut = "code\t0\tok\nvalue\t0\t2\n";
        let killed = outcome(cut, Termination::Signaled(9), false, vec![]);
        let report = parse_report(cut, 0, &job.checks);
        let j = judge(&job, &report, &killed);
        assert!(!j.passed);
        assert_eq!(
            j.text,
            "1/1 tests passed; interpreter stopped before finishing (killed by signal 9 (SIGKILL))"
        );
        assert_eq!(failure_of(&report, &killed, &j).map(|f| f.cause), Some(ToolFailureCause::Crashed));
        let filtered = outcome(cut, Termination::Signaled(libc::SIGSYS), false, vec![LimitHit::Syscall]);
        let j = judge(&job, &report, &filtered);
        assert_eq!(failure_of(&report, &filtered, &j).map(|f| f.cause), Some(ToolFailureCause::Syscall));
    }

    #[test]
    fn judgement_of_timeouts_and_code_errors() {
        let job = job(&["assert f(1) == 2", "assert f(2) == 4"]);
        let partial = "code\t0\tok\nvalue\t0\t2\n";
        // A busy run meets the CPU limit (the timeout, 5 s here): `timed out after 5 s`.
        let spent = outcome(partial, Termination::Signaled(libc::SIGXCPU), false, vec![LimitHit::CpuTime]);
        let report = parse_report(partial, 0, &job.checks);
        let j = judge(&job, &report, &spent);
        assert!(!j.passed);
        assert_eq!(j.reason.as_deref(), Some("timed out after 5 s"));
        assert_eq!(j.text, "1/2 tests passed; timed out after 5 s");
        assert_eq!(
            failure_of(&report, &spent, &j).map(|f| (f.cause, f.detail)),
            Some((ToolFailureCause::Timeout, "timed out after 5 s".to_string()))
        );
        // A waiting one meets the wall-clock backstop, 2 × 5 + 1 s: the same timeout.
        let waited = outcome(partial, Termination::Signaled(9), true, vec![LimitHit::WallTime]);
        let j = judge(&job, &report, &waited);
        assert_eq!(j.reason.as_deref(), Some("timed out after 5 s"));
        assert_eq!(failure_of(&report, &waited, &j).map(|f| f.cause), Some(ToolFailureCause::Timeout));

        let syntax = "code\t0\tfail\tSyntaxError\tinvalid syntax (<candidate>, line 1)\ndone\n";
        let syntax_report = parse_report(syntax, 0, &job.checks);
        let clean = outcome(syntax, Termination::Exited(0), false, vec![]);
        let j = judge(&job, &syntax_report, &clean);
        assert_eq!(j.text, "0/2 tests passed; code failed: SyntaxError: invalid syntax (<candidate>, line 1)");
        assert_eq!(failure_of(&syntax_report, &clean, &j).map(|f| f.cause), Some(ToolFailureCause::CodeError));
        let full = "code\t0\tok\ntest\t0\tfail\tOSError\t[Errno 28] No space left on device\ndone\n";
        let full_report = parse_report(full, 0, &job.checks);
        let j = judge(&job, &full_report, &clean);
        assert_eq!(failure_of(&full_report, &clean, &j).map(|f| f.cause), Some(ToolFailureCause::WorkArea));

    }

    #[test]
    fn the_timeout_is_a_cpu_budget_with_a_looser_wall_clock_backstop() {
        let mut job = job(&["assert f(1) == 2"]);
        job.timeout_s = 10.0;
        let limits = job.limits();
        assert_eq!((limits.cpu_seconds, limits.wall_time), (10, Duration::from_secs(21)));
        job.timeout_s = 0.5;
        let limits = job.limits();
        assert_eq!((limits.cpu_seconds, limits.wall_time), (1, Duration::from_secs(2)), "RLIMIT_CPU counts whole seconds");
    }

    #[test]
    fn result_text_is_capped() {
        let long_test = format!("assert f(1) == {}", "9".repeat(5000));
        let job = job(&[long_test.as_str()]);
        let msg = "x".repeat(5000);
        let stdout = format!("code\t0\tok\ntest\t0\tfail\tAssertionError\t{msg}\ndone\n");
        let j = judge(&job, &parse_report(&stdout, 0, &job.checks), &outcome(&stdout, Termination::Exited(0), false, vec![]));
        assert!(j.text.len() <= MAX_TEXT_BYTES, "{}", j.text.len());
        assert!(j.text.starts_with("0/1 tests passed; first failure: assert f(1) == 999"));
        assert_eq!(clip("héllo", 3), "…");
        assert_eq!(clip("héllo", 5), "h…");
        assert_eq!(tail("héllo", 4), "llo");
    }

    #[test]
    fn runner_script_embeds_inputs_as_literals() {
        let mut job = job(&["assert s.startswith('a\"b\\\\c')"]);
        job.code = "s = 'a\"b\\\\c'\n# naïve ✓ \u{1}\n".into();
        let script = job.runner_script();
        assert!(script.starts_with("_IMPORTS = []\n_CODE = \"s = 'a\\\"b\\\\\\\\c'\\n# naïve ✓ \\u0001\\n\"\n"), "{script}");
        // A truthiness assert travels as the value check `not not (…)` (its polarity stays here).
        assert!(script.contains("_TESTS = [[\"value\",\"not not (s.startswith('a\\\"b\\\\\\\\c'))\"]]"), "{script}");
        // The guest cannot tell a truthiness assert's polarity: the script is the same bytes.
        assert_eq!(self::job(&["assert f(1)"]).runner_script(), self::job(&["assert not f(1)"]).runner_script());
        // An assert that cannot be split runs whole.
        let script = self::job(&["assert 0 < len(s) < 9"]).runner_script();
        assert!(script.contains("_TESTS = [[\"exec\",\"assert 0 < len(s) < 9\"]]"), "{script}");
    }

    #[test]
    fn modeled_duration_is_deterministic_monotone_and_capped() {
        let small = job(&["assert f(1) == 2"]);
        let mut more_tests = small.clone();
        more_tests.tests = vec!["assert f(1) == 2".into(); 10];
        let mut more_code = small.clone();
        more_code.code = "x = 1\n".repeat(2000);
        let mut with_import = small.clone();
        with_import.imports = vec!["import math".into()];
        let base = small.modeled_duration_s();
        assert_eq!(base, small.clone().modeled_duration_s());
        assert!(base >= MODEL_STARTUP_S);
        assert!(more_tests.modeled_duration_s() > base);
        assert!(more_code.modeled_duration_s() > base);
        assert!(with_import.modeled_duration_s() > base);
        let mut tiny_timeout = more_code.clone();
        tiny_timeout.timeout_s = 0.001;
        assert_eq!(tiny_timeout.modeled_duration_s(), 0.001);
    }
}
