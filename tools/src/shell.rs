//! The `shell` tool: a shell command line an agent asked for (`ls`, `grep -n x file`, `sleep 3`,
//! `make test`), run by `/bin/sh -c` in the process sandbox.
//!
//! Inputs: `command` (the command line, required, at most [`MAX_COMMAND_BYTES`]), `reads` (the
//! host files and directories the command may read: absolute paths, each bound read-only at
//! the same path into the sandbox's otherwise empty private root beside the operating system's
//! programs and libraries — nothing else of the host is there), `timeout_s` (default
//! [`DEFAULT_TIMEOUT_S`], at most [`MAX_TIMEOUT_S`]). The command line is untrusted (a model
//! wrote it); `reads` is the workflow's declaration of what the tool needs, literal in the
//! workflow (the runtime's workflow loader refuses template references there).
//!
//! What the sandbox guarantees (those the kernel grants; the outcome's `sandbox_note` says which
//! it got): no network, a fresh unprivileged uid, an empty root with only the system paths and
//! the declared reads bound read-only, a private writable work directory (64 MiB, removed after
//! the run), the wall-clock limit with the whole process group killed, CPU, memory, process,
//! file-size and open-file limits, capped output. Verdict `pass` when the command exits with
//! status 0, else `fail` with the cause (exit status, timeout, limit, signal); computed here,
//! outside the sandbox, from how the process ended — nothing the command prints decides it.
//!
//! Modeled duration (the simulator's virtual time): the command's `sleep` arguments summed
//! (GNU `sleep` semantics, suffixes s, m, h, d) plus [`MODEL_STARTUP_S`], capped at the
//! timeout; any other work is not modeled. Must not depend on the runtime.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::sandbox::{LimitHit, ProcessSandbox, Sandbox, SandboxJob, SandboxLimits, Termination, system_paths};
use crate::{ToolCall, ToolError, ToolFailure, ToolFailureCause, ToolOutcome};

/// Tool name.
pub const NAME: &str = "shell";

/// Wall-clock limit when neither the input nor the call gives one.
pub const DEFAULT_TIMEOUT_S: f64 = 60.0;

/// Largest accepted timeout (mini-SWE-agent's default command timeout is 60 s; ten minutes is a
/// generous ceiling for one build or test command).
pub const MAX_TIMEOUT_S: f64 = 600.0;

/// Longest accepted command line, in bytes.
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;

/// Most paths a call may declare in `reads`.
pub const MAX_READS: usize = 64;

/// Bytes of stdout, then stderr, kept in the observation text (after its status line).
pub const MAX_TEXT_BYTES: usize = 4096;

/// Modeled start-up of one call: the sandbox (≈ 1.6 ms measured for `/bin/true` by the
/// `python_tests` calibration) and `/bin/sh`.
pub const MODEL_STARTUP_S: f64 = 0.003;

/// A `shell` call's inputs, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ShellJob {
    pub command: String,
    pub reads: Vec<PathBuf>,
    pub timeout_s: f64,
}

impl ShellJob {
    /// Read and check a call's inputs.
    pub fn from_call(call: &ToolCall) -> Result<Self, ToolError> {
        let invalid = |field: &'static str, problem: String| ToolError::InvalidInput { tool: NAME, field, problem };
        let command = match call.inputs.get("command") {
            None => return Err(ToolError::MissingInput { tool: NAME, field: "command" }),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => return Err(invalid("command", format!("must be a string, not {other}"))),
        };
        if command.trim().is_empty() {
            return Err(invalid("command", "is empty".into()));
        }
        if command.len() > MAX_COMMAND_BYTES {
            return Err(invalid("command", format!("is {} bytes, more than {MAX_COMMAND_BYTES}", command.len())));
        }
        if command.contains('\0') {
            return Err(invalid("command", "contains a NUL byte".into()));
        }
        let reads = match call.inputs.get("reads") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Array(items)) => {
                if items.len() > MAX_READS {
                    return Err(invalid("reads", format!("lists {} paths, more than {MAX_READS}", items.len())));
                }
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    let Some(s) = item.as_str() else {
                        return Err(invalid("reads", format!("must list path strings, not {item}")));
                    };
                    out.push(checked_read(s).map_err(|p| invalid("reads", p.to_string()))?);
                }
                out
            }
            Some(other) => return Err(invalid("reads", format!("must be a list of absolute paths, not {other}"))),
        };
        let timeout_s = match call.inputs.get("timeout_s") {
            // A workflow's inputs are rendered templates: a literal `30` arrives as "30".
            Some(v) => v
                .as_f64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse::<f64>().ok()))
                .ok_or_else(|| invalid("timeout_s", format!("must be a number, not {v}")))?,
            None => call.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S),
        };
        if !(timeout_s > 0.0 && timeout_s <= MAX_TIMEOUT_S) {
            return Err(invalid("timeout_s", format!("must be in (0, {MAX_TIMEOUT_S}] seconds, not {timeout_s}")));
        }
        Ok(ShellJob { command, reads, timeout_s })
    }

    /// The deterministic duration for virtual time: start-up plus the command's sleeps, capped
    /// at the timeout.
    pub fn modeled_duration_s(&self) -> f64 {
        (MODEL_STARTUP_S + sleep_seconds(&self.command)).min(self.timeout_s)
    }

    /// The sandbox limits of this call: the timeout as wall limit and CPU limit (rounded up),
    /// 1 GiB of address space and 64 processes (a shell pipeline and a build), the rest as the
    /// sandbox's defaults.
    pub fn limits(&self) -> SandboxLimits {
        SandboxLimits {
            wall_time: Duration::from_secs_f64(self.timeout_s),
            cpu_seconds: self.timeout_s.ceil() as u64,
            address_space_bytes: 1 << 30,
            max_processes: 64,
            ..SandboxLimits::default()
        }
    }

    /// The sandbox job: `/bin/sh -c COMMAND` with the system paths and the declared reads.
    pub fn sandbox_job(&self) -> SandboxJob {
        let mut read_only_paths = system_paths();
        for p in &self.reads {
            if !read_only_paths.contains(p) {
                read_only_paths.push(p.clone());
            }
        }
        SandboxJob {
            program: PathBuf::from("/bin/sh"),
            args: vec!["-c".into(), self.command.clone()],
            files: Vec::new(),
            limits: self.limits(),
            read_only_paths,
            allow_children: true,
        }
    }
}

/// Why a declared read path was refused ([`checked_read`]); each names the path as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadPathError {
    /// A relative path.
    #[error("path `{0}` is not absolute")]
    NotAbsolute(String),
    /// A path with a `..` component.
    #[error("path `{0}` contains `..`")]
    ParentDir(String),
    /// `/work` or `/tmp` itself: the program's work directory in the sandbox.
    #[error("path `{0}` is the program's own work directory in the sandbox (`/work`, and `/tmp` links to it): declare a path inside it")]
    WorkDir(String),
    /// Nothing at this path on the host.
    #[error("path `{0}` does not exist on this host")]
    Missing(String),
}

/// A declared read path, checked: absolute, no `..`, not the program's own work directory
/// (`/work`, or `/tmp`, a link to it, in the process sandbox's private root: a path *under*
/// either is bound inside it), existing on the host. The workflow loader checks every literal
/// `reads` entry with it too, so that a bad path is the file's error (with its line and field)
/// rather than every session's.
pub fn checked_read(s: &str) -> Result<PathBuf, ReadPathError> {
    let p = Path::new(s);
    if !p.is_absolute() {
        return Err(ReadPathError::NotAbsolute(s.to_string()));
    }
    if p.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(ReadPathError::ParentDir(s.to_string()));
    }
    let normal: PathBuf = p.components().filter(|c| !matches!(c, Component::CurDir)).collect();
    if [Path::new(crate::sandbox::PRIVATE_WORK_DIR), Path::new("/tmp")].contains(&normal.as_path()) {
        return Err(ReadPathError::WorkDir(s.to_string()));
    }
    if p.symlink_metadata().is_err() {
        return Err(ReadPathError::Missing(s.to_string()));
    }
    Ok(p.to_path_buf())
}

/// Seconds the `sleep` commands of a command line ask for, summed: each `sleep` (or a path
/// ending in `/sleep`) followed by durations — a number with an optional suffix `s`, `m`, `h`
/// or `d`, as GNU `sleep` sums its arguments. Anything else counts 0.
pub fn sleep_seconds(command: &str) -> f64 {
    let words: Vec<&str> =
        command.split(|c: char| c.is_whitespace() || ";&|()`".contains(c)).filter(|w| !w.is_empty()).collect();
    let mut total = 0.0;
    let mut i = 0;
    while i < words.len() {
        if words[i] == "sleep" || words[i].ends_with("/sleep") {
            i += 1;
            while let Some(s) = words.get(i).and_then(|w| duration_word(w)) {
                total += s;
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    total
}

fn duration_word(w: &str) -> Option<f64> {
    let (number, scale) = match w.char_indices().last()? {
        (k, 's') => (&w[..k], 1.0),
        (k, 'm') => (&w[..k], 60.0),
        (k, 'h') => (&w[..k], 3600.0),
        (k, 'd') => (&w[..k], 86_400.0),
        _ => (w, 1.0),
    };
    let v: f64 = number.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v * scale)
}

/// The first `max` bytes of `s`, cut at a character boundary.
fn head(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Run a `shell` call in the process sandbox.
pub fn run(call: &ToolCall) -> Result<ToolOutcome, ToolError> {
    let job = ShellJob::from_call(call)?;
    run_in(&ProcessSandbox::new(), &job)
}

/// Run `job` in `sandbox`.
pub fn run_in(sandbox: &dyn Sandbox, job: &ShellJob) -> Result<ToolOutcome, ToolError> {
    let outcome = sandbox.run(&job.sandbox_job()).map_err(|source| ToolError::Sandbox { tool: NAME, source })?;
    let failure = if outcome.timed_out {
        Some((ToolFailureCause::Timeout, format!("timed out after {} s", job.timeout_s)))
    } else if outcome.limits_hit.contains(&LimitHit::CpuTime) {
        Some((ToolFailureCause::CpuTime, "the CPU-time limit killed it".to_string()))
    } else if outcome.limits_hit.contains(&LimitHit::Syscall) {
        Some((ToolFailureCause::Syscall, "killed for a forbidden system call".to_string()))
    } else if outcome.limits_hit.contains(&LimitHit::FileSize) {
        Some((ToolFailureCause::FileSize, "a file grew past the size limit".to_string()))
    } else {
        match outcome.termination {
            Termination::Exited(0) => None,
            Termination::Exited(code) => Some((ToolFailureCause::Exited, format!("exit status {code}"))),
            _ => Some((ToolFailureCause::Crashed, outcome.ending())),
        }
    };
    let status = match &failure {
        None => "exit status 0".to_string(),
        Some((_, detail)) => detail.clone(),
    };
    let mut text = format!("{status}\n{}", head(&outcome.stdout, MAX_TEXT_BYTES));
    if !outcome.stderr.is_empty() && text.len() < MAX_TEXT_BYTES {
        let room = MAX_TEXT_BYTES - text.len();
        text.push_str(&format!("\nstderr:\n{}", head(&outcome.stderr, room)));
    }
    let exit_code = match outcome.termination {
        Termination::Exited(code) => Some(code),
        _ => None,
    };
    Ok(ToolOutcome {
        text,
        verdict: Some(if failure.is_none() { "pass" } else { "fail" }.to_string()),
        value: json!({
            "exit_code": exit_code,
            "stdout": outcome.stdout,
            "stderr": outcome.stderr,
            "stdout_truncated": outcome.stdout_truncated,
            "stderr_truncated": outcome.stderr_truncated,
        }),
        modeled_duration_s: job.modeled_duration_s(),
        wall_seconds: outcome.wall_seconds,
        sandbox_note: Some(format!("{} sandbox: {}", sandbox.name(), sandbox.describe(&outcome))),
        failure: failure.map(|(cause, detail)| ToolFailure { cause, detail }),
        checks: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(inputs: serde_json::Value) -> ToolCall {
        let inputs = inputs.as_object().cloned().unwrap_or_default().into_iter().collect();
        ToolCall { tool: NAME.into(), inputs, timeout_s: None }
    }

    #[test]
    fn sleeps_are_summed_as_gnu_sleep_does() {
        assert_eq!(sleep_seconds("sleep 3"), 3.0);
        assert_eq!(sleep_seconds("cd /x && sleep 1m 30s; make"), 90.0);
        assert_eq!(sleep_seconds("/bin/sleep 0.5|cat; sleep 2"), 2.5);
        assert_eq!(sleep_seconds("echo sleep; sleep forever"), 0.0);
        assert_eq!(sleep_seconds("ls -la"), 0.0);
        let job = ShellJob::from_call(&call(json!({"command": "sleep 2", "timeout_s": 1.5}))).unwrap();
        assert_eq!(job.modeled_duration_s(), 1.5, "capped at the timeout");
        let job = ShellJob::from_call(&call(json!({"command": "sleep 5", "timeout_s": "2.5"}))).unwrap();
        assert_eq!(job.timeout_s, 2.5, "a rendered template's number");
        let job = ShellJob::from_call(&call(json!({"command": "sleep 2"}))).unwrap();
        assert!((job.modeled_duration_s() - 2.003).abs() < 1e-12);
    }

    #[test]
    fn bad_inputs_are_refused_with_the_field() {
        let err = |v: serde_json::Value| ShellJob::from_call(&call(v)).unwrap_err().to_string();
        assert!(err(json!({})).contains("missing input `command`"));
        assert!(err(json!({"command": " "})).contains("`command` is empty"));
        assert!(err(json!({"command": 3})).contains("must be a string"));
        assert!(err(json!({"command": "ls", "reads": ["relative/path"]})).contains("not absolute"));
        assert!(err(json!({"command": "ls", "reads": ["/usr/../etc"]})).contains("contains `..`"));
        assert!(err(json!({"command": "ls", "reads": ["/no/such/path/anywhere"]})).contains("does not exist"));
        assert!(err(json!({"command": "ls", "reads": "/etc"})).contains("list of absolute paths"));
        for own in ["/tmp", "/work", "/tmp/", "/work/./"] {
            assert!(err(json!({"command": "ls", "reads": [own]})).contains("own work directory"), "{own}");
        }
        assert!(err(json!({"command": "ls", "timeout_s": 0})).contains("timeout_s"));
        assert!(err(json!({"command": "ls", "timeout_s": 601})).contains("timeout_s"));
        let long = "x".repeat(MAX_COMMAND_BYTES + 1);
        assert!(err(json!({ "command": long })).contains("bytes, more than"));
        // The whole message, as the workflow loader reports it too.
        assert_eq!(
            err(json!({"command": "ls", "reads": ["/no/such/path/anywhere"]})),
            "tool `shell`: input `reads` path `/no/such/path/anywhere` does not exist on this host"
        );
        assert_eq!(checked_read("rel").map_err(|e| e.to_string()), Err("path `rel` is not absolute".to_string()));
    }
}
