//! Finding a CPython 3 interpreter that works *inside* the sandbox.
//!
//! Owns interpreter discovery and its process-wide cache. A `python3` on the caller's `PATH`
//! is often not usable as is: pyenv's `python3` is a shell shim that needs the caller's
//! environment (the sandbox clears it), and its real interpreter may live under a directory the
//! sandbox's unprivileged uid cannot enter (`/root` is mode 0700 here). So every candidate is
//! probed by running it in the same [`ProcessSandbox`] the tools use, and the first that
//! answers is kept for the life of the process. Candidates, in order:
//!
//! 1. `$SWITCHYARD_PYTHON`, when set;
//! 2. the real executable behind `python3` on `PATH` (asked for `sys.executable`);
//! 3. that `python3` itself;
//! 4. `/usr/bin/python3`, `/usr/local/bin/python3`, `/bin/python3`.
//!
//! Must not depend on the runtime.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::sandbox::{ProcessSandbox, Sandbox, SandboxJob, SandboxLimits};

/// Environment variable naming the interpreter to try first.
pub const PYTHON_ENV: &str = "SWITCHYARD_PYTHON";

/// The flags every sandboxed run passes: isolated mode (no user site, no `PYTHON*` variables,
/// no script directory on `sys.path`), no `site` import, no `.pyc` writing.
pub const PYTHON_FLAGS: [&str; 3] = ["-I", "-S", "-B"];

/// A CPython interpreter that was seen to run inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    /// Absolute path of the executable.
    pub path: PathBuf,
    /// `major.minor.micro` as reported by the interpreter.
    pub version: String,
}

static INTERPRETER: OnceLock<Option<Interpreter>> = OnceLock::new();

/// The interpreter the tools use, discovered once per process; `None` when no candidate runs.
pub fn interpreter() -> Option<&'static Interpreter> {
    INTERPRETER.get_or_init(discover).as_ref()
}

fn discover() -> Option<Interpreter> {
    let sandbox = ProcessSandbox::new();
    candidates().into_iter().find_map(|path| probe(&sandbox, &path))
}

/// Candidate paths in preference order, without duplicates.
fn candidates() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    let mut push = |path: PathBuf| {
        if path.is_file() && !found.contains(&path) {
            found.push(path);
        }
    };
    if let Some(explicit) = std::env::var_os(PYTHON_ENV) {
        push(PathBuf::from(explicit));
    }
    if let Some(on_path) = which("python3") {
        if let Some(real) = real_executable(&on_path) {
            push(real);
        }
        push(on_path);
    }
    for fixed in ["/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"] {
        push(PathBuf::from(fixed));
    }
    found
}

/// The first executable file called `name` on the caller's `PATH`.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| candidate.is_file())
}

/// Asks `python3` (with the caller's environment, so shims work) for `sys.executable`.
fn real_executable(python: &Path) -> Option<PathBuf> {
    let output = Command::new(python)
        .args(["-I", "-S", "-c", "import sys; sys.stdout.write(sys.executable)"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let path = PathBuf::from(text.trim());
    (output.status.success() && path.is_absolute()).then_some(path)
}

/// Runs `python -I -S -B -c …` in the sandbox; returns the interpreter if it reports a
/// Python 3 version.
fn probe(sandbox: &ProcessSandbox, path: &Path) -> Option<Interpreter> {
    let mut args: Vec<String> = PYTHON_FLAGS.iter().map(|s| s.to_string()).collect();
    args.push("-c".into());
    args.push("import sys; sys.stdout.write('%d.%d.%d' % sys.version_info[:3])".into());
    let job = SandboxJob {
        program: path.to_path_buf(),
        args,
        files: Vec::new(),
        // A cold first start can be slow on a loaded machine; the probe runs once.
        limits: SandboxLimits { wall_time: Duration::from_secs(20), ..SandboxLimits::default() },
    };
    let outcome = sandbox.run(&job).ok()?;
    let version = outcome.stdout.trim().to_string();
    (outcome.termination.success() && version.starts_with("3.")).then(|| Interpreter { path: path.to_path_buf(), version })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_existing_distinct_files() {
        let list = candidates();
        for (i, path) in list.iter().enumerate() {
            assert!(path.is_file(), "{}", path.display());
            assert!(!list[..i].contains(path), "duplicate {}", path.display());
        }
    }

    #[test]
    fn discovered_interpreter_is_python3_and_cached() {
        let Some(first) = interpreter() else {
            eprintln!("note: no python3 usable in the sandbox here; skipping");
            return;
        };
        assert!(first.version.starts_with("3."), "{}", first.version);
        assert!(first.path.is_absolute());
        // The cache hands back the very same value.
        assert!(std::ptr::eq(first, interpreter().expect("cached")));
    }
}
