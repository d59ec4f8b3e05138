//! A persistent, content-addressed store of sandboxed tool outcomes for the simulator: the
//! process-wide memo's second level, on disk, so that a run repeated (the same benchmark, the
//! same scale measurement, the next seed of a sweep) does not run the same candidate programs
//! again. Off unless a shell opens one (`switchyard run --tool-cache DIR`).
//!
//! An outcome is kept only for a call whose result is a function of what it computes
//! (`switchyard_tools::canonical_key`: today `python_tests`, the sandboxed test runs), under
//! the SHA-256 of that key and of the **identity** of what computed it: the executable's own
//! bytes (every sandbox rule, verdict rule and the pinned CPython-on-WASI build's hash are in
//! them), the sandbox backend asked for, the host interpreter it may fall back to (path and
//! version), the effective uid (root and other users get different isolation) and the kernel
//! release (what the sandbox can enforce). Another build, another interpreter or another
//! kernel finds nothing of this one's. A file names its key in full and is used only when that
//! matches, so neither a collision nor a truncated file can answer for another call.
//!
//! What is not kept: a call that failed to run (no outcome), a run stopped by the wall-clock
//! backstop rather than its CPU budget (the backstop fires only on a machine that leaves the
//! run less than half a core, a verdict of that moment and not of the program), and an outcome
//! that another sandbox or interpreter computed than the identity names (CPython on WASI that
//! failed to load, so the process sandbox ran the call).
//!
//! Trust: whoever can write the directory decides verdicts. So it is the user's own (created
//! mode 0700; refused when it or its `v1` is a link, owned by another user or writable by group
//! or others, or when a directory above it is writable by others without the sticky bit or
//! owned by someone but root or the user), and the store refuses to open where the sandboxed
//! code itself could reach it: with `SWITCHYARD_SANDBOX_WEAKER=1` where the process sandbox may
//! run, a candidate runs as the user on the host's files. Not covered by the identity: the CPU
//! model (a CPU-budget timeout is a property of the program on this machine) and isolation a
//! container grants beyond the kernel's. Only the simulator reads it; the live runtime and the
//! server never do. Writes go to a temporary file renamed into place, so concurrent runs sharing
//! a directory each see whole files; a file that cannot be read or parsed is a miss.
//!
//! Depends on the tools crate's types and nothing else of the simulator.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use switchyard_tools::{ToolFailureCause, ToolOutcome};
use thiserror::Error;

/// The layout and identity scheme; a change to either is a new subdirectory.
const FORMAT: &str = "v1";

/// Why a store could not be opened.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("tool cache {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("tool cache {path}: {reason}; it decides verdicts, so it must be yours alone")]
    Untrusted { path: String, reason: String },
}

/// One stored outcome: the key it answers (checked on read) and the outcome.
#[derive(Serialize, Deserialize)]
struct Entry {
    key: String,
    outcome: ToolOutcome,
}

/// Reads and writes of one store.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StoreTally {
    pub read: u64,
    pub written: u64,
}

/// What computes the outcomes a store keeps: a description (hashed into every address) and the
/// sandbox — with, for the process sandbox, the interpreter's version — an outcome must report
/// to be kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub description: Vec<u8>,
    /// `wasm` or `process` (`ToolOutcome::value["sandbox"]`).
    pub sandbox: &'static str,
    /// The process sandbox's interpreter version (`value["interpreter"]`); `None`: none known,
    /// so nothing the process sandbox computes is kept.
    pub interpreter: Option<String>,
}

/// An opened store (see the module doc).
#[derive(Debug)]
pub struct OutcomeStore {
    /// `DIR/v1`.
    root: PathBuf,
    /// SHA-256 of the identity's description.
    identity: [u8; 32],
    sandbox: &'static str,
    interpreter: Option<String>,
    read: AtomicU64,
    written: AtomicU64,
}

/// Whether `path` is a directory (not a link) that the euid owns and only it can write.
fn private_dir(path: &Path) -> Result<(), String> {
    let meta = fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_dir() {
        return Err("not a directory (a link is not followed)".into());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid {
        return Err(format!("owned by uid {}, not {euid}", meta.uid()));
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return Err(format!("writable by group or others (mode {:o})", meta.permissions().mode() & 0o777));
    }
    Ok(())
}

/// Whether no one but root and the euid can replace `path` by renaming something above it (the
/// rule of ssh's StrictModes): every directory above it owned by root or the euid, and not
/// writable by group or others unless sticky (as `/tmp` is).
fn trusted_ancestors(path: &Path) -> Result<(), String> {
    let real = fs::canonicalize(path).map_err(|e| e.to_string())?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    for above in real.ancestors().skip(1) {
        let meta = fs::metadata(above).map_err(|e| format!("{}: {e}", above.display()))?;
        let mode = meta.permissions().mode();
        if meta.uid() != 0 && meta.uid() != euid {
            return Err(format!("{} above it is owned by uid {}", above.display(), meta.uid()));
        }
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(format!("{} above it is writable by others without the sticky bit (mode {:o})", above.display(), mode & 0o7777));
        }
    }
    Ok(())
}

impl OutcomeStore {
    /// Opens (creating it) the store under `dir` for outcomes computed by `identity`
    /// ([`process_identity`] for this process).
    pub fn open(dir: &Path, identity: &Identity) -> Result<Self, StoreError> {
        let io = |e: std::io::Error| StoreError::Io { path: dir.display().to_string(), source: e };
        let untrusted = |reason: String| StoreError::Untrusted { path: dir.display().to_string(), reason };
        fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io)?;
        private_dir(dir).map_err(untrusted)?;
        trusted_ancestors(dir).map_err(untrusted)?;
        let root = dir.join(FORMAT);
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&root).map_err(io)?;
        private_dir(&root).map_err(|e| untrusted(format!("{FORMAT}: {e}")))?;
        Ok(OutcomeStore {
            root,
            identity: Sha256::digest(&identity.description).into(),
            sandbox: identity.sandbox,
            interpreter: identity.interpreter.clone(),
            read: AtomicU64::new(0),
            written: AtomicU64::new(0),
        })
    }

    /// Whether `outcome` came from the sandbox (and interpreter) the identity names.
    fn computed_as_named(&self, outcome: &ToolOutcome) -> bool {
        let field = |name: &str| outcome.value.get(name).and_then(serde_json::Value::as_str);
        field("sandbox") == Some(self.sandbox)
            && (self.sandbox != "process" || (self.interpreter.is_some() && field("interpreter") == self.interpreter.as_deref()))
    }

    /// Where the outcome of `key` lives: `v1/ab/cdef…` from SHA-256(identity, key).
    fn path_of(&self, key: &str) -> PathBuf {
        let mut h = Sha256::new();
        h.update(self.identity);
        h.update(key.as_bytes());
        let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        self.root.join(&hex[..2]).join(&hex[2..])
    }

    /// The stored outcome of `key`, when there is a whole one that names this key.
    pub fn get(&self, key: &str) -> Option<ToolOutcome> {
        let bytes = fs::read(self.path_of(key)).ok()?;
        let entry: Entry = serde_json::from_slice(&bytes).ok()?;
        if entry.key != key {
            return None;
        }
        self.read.fetch_add(1, Ordering::Relaxed);
        Some(entry.outcome)
    }

    /// Stores the outcome of `key` run with a time limit of `timeout_s` (when [`storable`]).
    /// Best effort: a write that fails leaves the store as it was.
    pub fn put(&self, key: &str, outcome: &ToolOutcome, timeout_s: f64) {
        if !storable(outcome, timeout_s) || !self.computed_as_named(outcome) {
            return;
        }
        let path = self.path_of(key);
        let Some(dir) = path.parent() else { return };
        if fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).is_err() || private_dir(dir).is_err() {
            return;
        }
        let Ok(bytes) = serde_json::to_vec(&Entry { key: key.to_string(), outcome: outcome.clone() }) else { return };
        let written = tempfile::NamedTempFile::new_in(dir).and_then(|mut f| {
            f.write_all(&bytes)?;
            f.as_file().set_permissions(fs::Permissions::from_mode(0o600))?;
            f.persist(&path).map_err(|e| e.error)?;
            Ok(())
        });
        if written.is_ok() {
            self.written.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Outcomes read and written so far.
    pub fn tally(&self) -> StoreTally {
        StoreTally { read: self.read.load(Ordering::Relaxed), written: self.written.load(Ordering::Relaxed) }
    }
}

/// Whether an outcome is the program's and not the moment's: everything but a timeout that the
/// wall-clock backstop (at 2 × the limit + 1 s) rather than the CPU budget ended — named in the
/// outcome's `limits_hit`, and, to be safe, any timeout that took twice its limit.
pub fn storable(outcome: &ToolOutcome, timeout_s: f64) -> bool {
    let backstop = outcome
        .value
        .get("limits_hit")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|hits| hits.iter().any(|h| h.as_str() == Some("wall_time")));
    let timed_out = outcome.failure.as_ref().is_some_and(|f| f.cause == ToolFailureCause::Timeout);
    !backstop && !(timed_out && outcome.wall_seconds >= 2.0 * timeout_s)
}

/// What computes this process's tool outcomes (see the module doc): the executable's bytes, the
/// sandbox backend asked for, whether the pinned CPython-on-WASI build is installed (checked by
/// its hash, without compiling it), the host interpreter where the process sandbox runs the
/// calls, the effective uid, the kernel release and `SWITCHYARD_SANDBOX_WEAKER`. An error where
/// the store must not be used: the process sandbox may run candidates with weaker isolation
/// (as the user, on the host's files, where they could write the store).
pub fn process_identity() -> Result<Identity, std::io::Error> {
    use switchyard_tools::python_tests::{BACKEND_ENV, Backend};
    use switchyard_tools::sandbox::WEAKER_ENV;
    let exe = std::env::current_exe()?;
    let mut h = Sha256::new();
    std::io::copy(&mut fs::File::open(&exe)?, &mut h)?;
    let mut id = Vec::new();
    id.extend_from_slice(&h.finalize());
    let asked = std::env::var(BACKEND_ENV).unwrap_or_default();
    let backend = Backend::parse(&asked).unwrap_or(Backend::Auto);
    let wasm = backend != Backend::Process
        && switchyard_tools::python_wasm_path().is_some_and(|p| switchyard_tools::python_wasm::verify_python_wasm(&p).is_ok());
    let weaker = std::env::var(WEAKER_ENV).unwrap_or_default();
    let (sandbox, interpreter) = match (backend, wasm) {
        (Backend::Wasm, _) | (Backend::Auto, true) => ("wasm", None),
        _ => {
            if weaker == "1" {
                return Err(std::io::Error::other(format!(
                    "{WEAKER_ENV}=1 may run candidates in the process sandbox as you, on this machine's files, where they could write the cache"
                )));
            }
            ("process", switchyard_tools::python::interpreter())
        }
    };
    let interpreter_line = interpreter.map(|i| format!("{} {}", i.path.display(), i.version)).unwrap_or_default();
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let parts = [asked, format!("wasm pinned: {wasm}"), interpreter_line, euid.to_string(), kernel.trim().to_string(), weaker];
    for part in parts {
        id.push(0);
        id.extend_from_slice(part.as_bytes());
    }
    Ok(Identity { description: id, sandbox, interpreter: interpreter.map(|i| i.version.clone()) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_tools::ToolFailure;

    fn wasm_id(description: &[u8]) -> Identity {
        Identity { description: description.to_vec(), sandbox: "wasm", interpreter: None }
    }

    fn outcome(verdict: &str) -> ToolOutcome {
        ToolOutcome {
            text: format!("1/1 tests {verdict}"),
            verdict: Some(verdict.into()),
            value: serde_json::json!({"passed": 1, "sandbox": "wasm", "interpreter": "3.12.0", "limits_hit": []}),
            modeled_duration_s: 0.25,
            wall_seconds: 0.08,
            sandbox_note: None,
            failure: None,
            checks: Default::default(),
        }
    }

    fn timeout(wall_seconds: f64) -> ToolOutcome {
        ToolOutcome {
            verdict: Some("fail".into()),
            failure: Some(ToolFailure { cause: ToolFailureCause::Timeout, detail: "10 s".into() }),
            wall_seconds,
            ..outcome("fail")
        }
    }

    #[test]
    fn an_outcome_comes_back_for_its_key_and_identity_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = OutcomeStore::open(dir.path(), &wasm_id(b"build A")).expect("open");
        assert!(store.get("k1").is_none());
        store.put("k1", &outcome("pass"), 10.0);
        assert_eq!(store.get("k1"), Some(outcome("pass")));
        assert!(store.get("k2").is_none(), "another key");
        assert_eq!(store.tally(), StoreTally { read: 1, written: 1 });
        let other = OutcomeStore::open(dir.path(), &wasm_id(b"build B")).expect("open");
        assert!(other.get("k1").is_none(), "another identity finds nothing");
        let again = OutcomeStore::open(dir.path(), &wasm_id(b"build A")).expect("open");
        assert_eq!(again.get("k1"), Some(outcome("pass")), "a later process of the same build");
    }

    #[test]
    fn a_file_that_names_another_key_or_is_cut_short_is_a_miss() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = OutcomeStore::open(dir.path(), &wasm_id(b"id")).expect("open");
        store.put("k1", &outcome("pass"), 10.0);
        let path = store.path_of("k1");
        let text = fs::read_to_string(&path).expect("read");
        fs::write(&path, text.replace("\"key\":\"k1\"", "\"key\":\"k9\"")).expect("write");
        assert!(store.get("k1").is_none(), "names another key");
        fs::write(&path, &text[..text.len() / 2]).expect("write");
        assert!(store.get("k1").is_none(), "cut short");
        fs::write(&path, text).expect("write");
        assert_eq!(store.get("k1"), Some(outcome("pass")));
    }

    #[test]
    fn a_timeout_is_kept_only_when_the_cpu_budget_ended_it() {
        assert!(storable(&timeout(10.4), 10.0), "the CPU budget: the program's own");
        assert!(!storable(&timeout(21.0), 10.0), "the wall-clock backstop: the machine's moment");
        assert!(storable(&outcome("pass"), 10.0));
        let dir = tempfile::tempdir().expect("tempdir");
        let store = OutcomeStore::open(dir.path(), &wasm_id(b"id")).expect("open");
        store.put("slow", &timeout(21.0), 10.0);
        assert!(store.get("slow").is_none());
        let mut named = timeout(10.4);
        named.value["limits_hit"] = serde_json::json!(["wall_time"]);
        assert!(!storable(&named, 10.0), "the backstop, as the outcome names it");
        assert_eq!(store.tally().written, 0);
    }

    #[test]
    fn an_outcome_another_sandbox_or_interpreter_computed_is_not_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = OutcomeStore::open(dir.path(), &wasm_id(b"id")).expect("open");
        let mut fell_back = outcome("pass");
        fell_back.value["sandbox"] = serde_json::json!("process");
        store.put("k", &fell_back, 10.0);
        assert!(store.get("k").is_none(), "CPython on WASI named, the process sandbox ran it");
        let process = |interpreter: Option<&str>| Identity {
            description: b"id".to_vec(),
            sandbox: "process",
            interpreter: interpreter.map(String::from),
        };
        let unknown = OutcomeStore::open(dir.path(), &process(None)).expect("open");
        unknown.put("k", &fell_back, 10.0);
        assert!(unknown.get("k").is_none(), "no interpreter known: nothing of the process sandbox is kept");
        let other = OutcomeStore::open(dir.path(), &process(Some("3.11.2"))).expect("open");
        other.put("k", &fell_back, 10.0);
        assert!(other.get("k").is_none(), "another interpreter's outcome");
        let same = OutcomeStore::open(dir.path(), &process(Some("3.12.0"))).expect("open");
        same.put("k", &fell_back, 10.0);
        assert_eq!(same.get("k"), Some(fell_back));
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shared = dir.path().join("shared");
        fs::create_dir(&shared).expect("mkdir");
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).expect("chmod");
        let err = OutcomeStore::open(&shared, &wasm_id(b"id")).expect_err("refused");
        assert!(err.to_string().contains("writable by group or others"), "{err}");
        let link = dir.path().join("link");
        let own = dir.path().join("own");
        std::os::unix::fs::symlink(&own, &link).expect("symlink");
        fs::create_dir(&own).expect("mkdir");
        fs::set_permissions(&own, fs::Permissions::from_mode(0o700)).expect("chmod");
        let err = OutcomeStore::open(&link, &wasm_id(b"id")).expect_err("a link is not followed");
        assert!(err.to_string().contains("not a directory"), "{err}");
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // Root can give a directory away: one owned by another user is refused too.
            let theirs = dir.path().join("theirs");
            fs::create_dir(&theirs).expect("mkdir");
            fs::set_permissions(&theirs, fs::Permissions::from_mode(0o700)).expect("chmod");
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
            let err = OutcomeStore::open(&theirs, &wasm_id(b"id")).expect_err("refused");
            assert!(err.to_string().contains("owned by uid 65534"), "{err}");
        }
        fs::create_dir(dir.path().join("elsewhere")).expect("mkdir");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), own.join("v1")).expect("symlink");
        let err = OutcomeStore::open(&own, &wasm_id(b"id")).expect_err("a linked v1 is refused");
        assert!(err.to_string().contains("v1: not a directory"), "{err}");
        let open_parent = dir.path().join("open");
        fs::create_dir(&open_parent).expect("mkdir");
        fs::set_permissions(&open_parent, fs::Permissions::from_mode(0o777)).expect("chmod");
        let err = OutcomeStore::open(&open_parent.join("cache"), &wasm_id(b"id")).expect_err("refused");
        assert!(err.to_string().contains("writable by others without the sticky bit"), "{err}");
        fs::set_permissions(&open_parent, fs::Permissions::from_mode(0o1777)).expect("chmod");
        OutcomeStore::open(&open_parent.join("cache"), &wasm_id(b"id")).expect("a sticky parent, as /tmp");
        let fresh = dir.path().join("fresh/cache");
        OutcomeStore::open(&fresh, &wasm_id(b"id")).expect("created");
        assert_eq!(fs::metadata(&fresh).expect("meta").permissions().mode() & 0o777, 0o700);
    }
}
