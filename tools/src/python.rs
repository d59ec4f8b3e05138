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
//! Each candidate also declares what the process sandbox's private root must hold for it
//! ([`read_only_paths`]): asked once, outside the sandbox (the interpreter is trusted, the code
//! it will run is not), for its executable, its standard library and the directories of every
//! shared object it maps after importing the usual extension modules, plus the ELF program
//! interpreter (`/lib64/ld-linux-x86-64.so.2`) and the loader cache.
//!
//! Must not depend on the runtime.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
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

static INTERPRETER: OnceLock<Interpreter> = OnceLock::new();

/// When discovery last found no interpreter that runs in the sandbox.
static LAST_MISS: Mutex<Option<std::time::Instant>> = Mutex::new(None);

/// Why the last probe could not run any interpreter: the sandbox refused to run without the
/// isolation it requires ([`crate::sandbox::SandboxError::IsolationRefused`]); `None` otherwise.
static REFUSED: Mutex<Option<String>> = Mutex::new(None);

/// Why no interpreter runs in the sandbox when the sandbox itself refused to run one (the
/// kernel refused its namespaces), so a caller can say that rather than "no python3".
pub fn isolation_refused() -> Option<String> {
    REFUSED.lock().ok().and_then(|r| r.clone())
}

/// How long a failed discovery stands before the next call probes again: a probe can fail for a
/// passing reason (the sandbox uid's process count momentarily at its limit), and a failure
/// cached for the process's life would leave the tool without its interpreter until a restart.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// The interpreter the tools use, discovered once per process (a failed discovery is retried
/// after [`RETRY_AFTER`]); `None` when no candidate runs.
pub fn interpreter() -> Option<&'static Interpreter> {
    if let Some(found) = INTERPRETER.get() {
        return Some(found);
    }
    let recent_miss = || LAST_MISS.lock().is_ok_and(|m| m.is_some_and(|t| t.elapsed() < RETRY_AFTER));
    if recent_miss() {
        return None;
    }
    match discover() {
        Some(found) => Some(INTERPRETER.get_or_init(|| found)),
        None => {
            if let Ok(mut m) = LAST_MISS.lock() {
                *m = Some(std::time::Instant::now());
            }
            None
        }
    }
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

/// Asks the interpreter (outside the sandbox) which files it needs: printed one per line.
const NEEDS_SCRIPT: &str = r#"
import os, sys, sysconfig
for name in ("math", "_ctypes", "_decimal", "_json", "_hashlib", "_ssl", "zlib", "_bz2", "_lzma",
             "_sqlite3", "pyexpat", "_datetime", "_random", "_heapq", "_bisect", "array", "select",
             "unicodedata", "_struct", "binascii", "_posixsubprocess", "readline", "_curses"):
    try:
        __import__(name)
    except BaseException:
        pass
exe = os.path.realpath(sys.executable)
paths = {exe}
for key in ("stdlib", "platstdlib"):
    paths.add(os.path.realpath(sysconfig.get_paths()[key]))
with open("/proc/self/maps") as maps:
    for line in maps:
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/"):
            mapped = os.path.realpath(fields[5].strip())
            # The executable is bound as a file: its directory (a venv's bin, a home directory
            # holding a custom build) is not the sandbox's to read.
            if mapped != exe:
                paths.add(os.path.dirname(mapped))
for path in sorted(paths):
    print(path)
"#;

/// What the interpreter at `python` needs to read inside the process sandbox's private root
/// (see the module documentation); cached per path. Empty when the interpreter cannot be asked.
pub fn read_only_paths(python: &Path) -> Vec<PathBuf> {
    static CACHE: Mutex<BTreeMap<PathBuf, Vec<PathBuf>>> = Mutex::new(BTreeMap::new());
    let lock = || CACHE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(paths) = lock().get(python) {
        return paths.clone();
    }
    let paths = ask_needs(python);
    lock().insert(python.to_path_buf(), paths.clone());
    paths
}

fn ask_needs(python: &Path) -> Vec<PathBuf> {
    let Ok(output) = Command::new(python)
        .args(["-I", "-S", "-B", "-c", NEEDS_SCRIPT])
        .env_clear()
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    if !output.status.success() {
        return Vec::new();
    }
    let mut paths: Vec<PathBuf> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .collect();
    // The path the sandbox will exec (maybe a link to the real executable), its ELF program
    // interpreter at the path the kernel opens, and the loader's cache.
    paths.push(python.to_path_buf());
    if let Some(interp) = std::fs::canonicalize(python).ok().and_then(|real| elf_interpreter(&real)) {
        paths.push(interp);
    }
    let cache = PathBuf::from("/etc/ld.so.cache");
    if cache.is_file() {
        paths.push(cache);
    }
    paths.sort();
    paths.dedup();
    paths
}

/// The `PT_INTERP` path of a 64-bit little-endian ELF executable (`None` for anything else).
pub fn elf_interpreter(executable: &Path) -> Option<PathBuf> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(executable).ok()?;
    let mut header = [0u8; 64];
    file.read_exact(&mut header).ok()?;
    // Magic, ELFCLASS64, ELFDATA2LSB.
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], i: usize| u16::from_le_bytes([b[i], b[i + 1]]) as u64;
    let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
    let (phoff, phentsize, phnum) = (u64_at(&header, 32), u16_at(&header, 54), u16_at(&header, 56));
    if phentsize < 56 || phnum > 256 {
        return None;
    }
    for i in 0..phnum {
        let mut entry = [0u8; 56];
        file.seek(SeekFrom::Start(phoff.checked_add(i * phentsize)?)).ok()?;
        file.read_exact(&mut entry).ok()?;
        const PT_INTERP: u32 = 3;
        if u32::from_le_bytes([entry[0], entry[1], entry[2], entry[3]]) != PT_INTERP {
            continue;
        }
        let (offset, size) = (u64_at(&entry, 8), u64_at(&entry, 32));
        if size == 0 || size > 4096 {
            return None;
        }
        let mut name = vec![0u8; size as usize];
        file.seek(SeekFrom::Start(offset)).ok()?;
        file.read_exact(&mut name).ok()?;
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        let path = PathBuf::from(String::from_utf8_lossy(&name[..end]).into_owned());
        return path.is_absolute().then_some(path);
    }
    None
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
        read_only_paths: read_only_paths(path),
        allow_children: false,
    };
    let outcome = match sandbox.run(&job) {
        Ok(outcome) => outcome,
        Err(e @ crate::sandbox::SandboxError::IsolationRefused(_)) => {
            if let Ok(mut r) = REFUSED.lock() {
                *r = Some(e.to_string());
            }
            return None;
        }
        Err(_) => return None,
    };
    if let Ok(mut r) = REFUSED.lock() {
        *r = None;
    }
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
