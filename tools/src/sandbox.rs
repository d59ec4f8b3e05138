//! Sandboxes that run untrusted tool code, behind the [`Sandbox`] trait.
//!
//! Owns the job description ([`SandboxJob`], [`SandboxLimits`]), the outcome
//! ([`SandboxOutcome`]) and the two backends: OS processes ([`ProcessSandbox`], below) and
//! WebAssembly modules on wasmtime ([`wasm::WasmSandbox`], see [`wasm`]). A job names a
//! program, its arguments and the files to place in a private work directory, which maps onto
//! both a process (`program args…` in that directory) and a WASI command module (the module file
//! as program, the directory pre-opened at [`wasm::GUEST_WORK_DIR`]).
//!
//! The process backend is Linux-only. It confines a child as follows (the `confine` submodule
//! has the exact order of the system calls, [`filter`] the seccomp rules, [`Isolation`] what a
//! given run really got, and `tools/SECURITY.md` the threat model and the attack tests):
//!
//! * **session and namespaces** — the child calls `setsid()` (no controlling terminal), then
//!   enters new PID, IPC, network and mount namespaces (as root one `unshare` each; otherwise
//!   inside a new user namespace). With a PID namespace the program runs under an init of
//!   Switchyard's that ends the namespace, and so every process in it, when the program ends; the
//!   parent waits for that end (through init's pidfd) before a run returns.
//! * **private root** — an empty tmpfs root holding only the job's
//!   [`SandboxJob::read_only_paths`] (bound read-only, `nosuid`, `nodev`), minimal `/dev`, a
//!   `/proc` of the PID namespace, and the work directory `/work` (also `/tmp`): a tmpfs limited
//!   to [`SandboxLimits::max_work_bytes`] and [`SandboxLimits::max_work_entries`], holding the
//!   job's files, freed with the namespace (a declared path under `/tmp` or `/work` is bound
//!   inside it, at its own name). Without a mount namespace the work directory is a marked
//!   host directory ([`residue`]) and the host filesystem is visible (noted).
//! * **seccomp** ([`filter`]) — kernel attack surface kills the program (`SIGSYS`); terminal
//!   injection, sockets and System V IPC are refused; for jobs with
//!   [`SandboxJob::allow_children`] false, so are new processes.
//! * **rlimits** set before `exec`: CPU seconds (soft limit → `SIGXCPU`, hard limit one second
//!   later → `SIGKILL`), address space (`RLIMIT_AS`), processes (`RLIMIT_NPROC`), file size
//!   (`RLIMIT_FSIZE`), open descriptors (`RLIMIT_NOFILE`), core dumps off.
//! * **identity** — `RLIMIT_NPROC` counts the processes of the child's *real uid* and is not
//!   enforced at all for uid 0, and we run as root here. So when the caller is root the child
//!   drops to a fresh unprivileged uid/gid of its own (allocated per run from
//!   [`SANDBOX_UID_BASE`]), with no supplementary groups and `PR_SET_NO_NEW_PRIVS`. Without a
//!   PID namespace, a helper that takes the same uid sends `kill(-1, SIGKILL)` after the run,
//!   which reaches every process of that uid (with one, the namespace's end does that). When the
//!   caller is not root the child keeps the caller's uid inside a user namespace (mapped to
//!   itself; where the kernel refuses the map, the spawn fails as for a refused private root).
//! * **wall-clock limit** — at the limit the child's process group gets `SIGKILL`, and so does
//!   the PID namespace's init. The group is killed while the main process is still an unreaped
//!   zombie (`waitid(WNOWAIT)`), so its id cannot have been recycled.
//! * **death of the caller** — every process of the sandbox has `PR_SET_PDEATHSIG = SIGKILL`
//!   towards its parent; the spawning thread supervises the run to its end, so this fires only
//!   when the caller itself dies, and the namespace dies with it.
//! * **environment** cleared except `PATH`, `HOME`, `TMPDIR`, `LANG`; stdin is `/dev/null`
//!   (reads see end-of-file); stdout and stderr are captured up to a byte cap each (the rest is
//!   drained and dropped so the child never blocks on a full pipe).
//!
//! Must not depend on the runtime, the planner or any model code.

mod confine;
pub mod filter;
pub mod guest_budget;
pub mod residue;
pub mod wasm;

pub use confine::PRIVATE_WORK_DIR;
pub use wasm::WasmSandbox;

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use confine::{CStringArray, ChildPlan, ChildReport, Identity, WorkPlan};
use filter::SyscallFilter;

/// First uid (and gid) handed to sandboxed children when the caller is root.
///
/// Each run gets `SANDBOX_UID_BASE + (offset + run counter) mod SANDBOX_UID_SPAN`, where the
/// offset is drawn once per process from the kernel's random source (`getrandom`). One process
/// reuses a uid only after [`SANDBOX_UID_SPAN`] runs; two processes on one kernel (e.g. two
/// containers, each switchyard its namespace's pid 1, sharing the host's uids) collide only when
/// their offsets fall within the runs either has made: for processes of n runs each, a chance of
/// about 2n / 3 · 10⁹ per pair. (A uid derived from the pid collided for every pair of
/// containers.) Reuse matters where the init process does not reap orphans (as on this machine:
/// zombies of killed grandchildren keep counting toward their uid's `RLIMIT_NPROC`), and a
/// shared uid would share that count and the uid sweep. Assumed free: far above the ranges that
/// distributions (< 60 000) and `/etc/subuid` (100 000 + 65 536·k) hand out.
pub const SANDBOX_UID_BASE: u32 = 1_000_000_000;

/// How many uids from [`SANDBOX_UID_BASE`] runs may take: the highest is 3,999,999,999, below
/// the 32-bit limit (4,294,967,295 is `(uid_t) -1`, "no change", to the set*id calls).
pub const SANDBOX_UID_SPAN: u32 = 3_000_000_000;

/// Grace period for pipes to reach end-of-file once every sandboxed process is dead.
///
/// Only a process that escaped both the group kill and the uid sweep (possible only when the
/// caller is not root) can hold a pipe open longer; the run then ends without waiting for it.
const PIPE_GRACE: Duration = Duration::from_millis(200);

/// Reads of 16 KiB per pipe per wake-up of the supervisor (1 MiB), bounding the time between
/// two deadline checks when the child writes without pause.
const DRAIN_READS_PER_WAKEUP: usize = 64;

/// Poll interval used only when `pidfd_open` is unavailable (Linux < 5.3).
const EXIT_POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Resource limits for one sandboxed run.
///
/// The WebAssembly backend reads `wall_time` as its epoch deadline, `cpu_seconds` as the budget
/// of the guest thread's CPU clock (checked at each epoch tick), `address_space_bytes` as the
/// limit of each linear memory, `max_output_bytes` as its capture caps, and enforces
/// `max_work_bytes`, `max_work_entries` and `max_open_files` in its WASI layer; a guest is one
/// thread and cannot start processes, so `max_processes` is moot there, and it has no per-file
/// size limit, only the work area's (see [`wasm`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxLimits {
    /// Wall-clock limit; the process group is killed when it expires.
    pub wall_time: Duration,
    /// CPU seconds: the `RLIMIT_CPU` soft limit of a process (`SIGXCPU`; the hard limit is one
    /// second more), the guest thread's CPU clock in WebAssembly.
    pub cpu_seconds: u64,
    /// `RLIMIT_AS`: bytes of virtual address space per process.
    pub address_space_bytes: u64,
    /// `RLIMIT_NPROC`: processes (and threads) of the sandbox uid, the first one included.
    pub max_processes: u64,
    /// `RLIMIT_FSIZE`: largest file the child may write, in bytes.
    pub max_file_bytes: u64,
    /// Bytes kept from each of stdout and stderr; the rest is read and dropped.
    pub max_output_bytes: usize,
    /// Size of the work area: total bytes the run may store in its work directory (a tmpfs of
    /// this size in the process sandbox; counted bytes written in the WebAssembly one).
    pub max_work_bytes: u64,
    /// Files and directories the run may create in its work directory (tmpfs inodes; entries
    /// created through WASI).
    pub max_work_entries: u64,
    /// Descriptors the run may hold open at once (`RLIMIT_NOFILE`; guest file descriptors).
    pub max_open_files: u64,
}

impl Default for SandboxLimits {
    /// The limits the `python_tests` tool runs under: 5 s wall, 5 s CPU, 512 MiB of address
    /// space and 10 processes (from the tool's specification), 16 MiB files, a 64 MiB work area
    /// of at most 1,024 entries, 256 open descriptors and 64 KiB of each output stream (our
    /// assumptions: far above what a unit-test run writes or opens, small enough that a runaway
    /// writer cannot fill the disk, the caller's fd table or its memory).
    fn default() -> Self {
        Self {
            wall_time: Duration::from_secs(5),
            cpu_seconds: 5,
            address_space_bytes: 512 * 1024 * 1024,
            max_processes: 10,
            max_file_bytes: 16 * 1024 * 1024,
            max_output_bytes: 64 * 1024,
            max_work_bytes: 64 * 1024 * 1024,
            max_work_entries: 1024,
            max_open_files: 256,
        }
    }
}

/// One program to run in a sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxJob {
    /// The executable; an absolute path is recommended (the child's `PATH` is
    /// `/usr/local/bin:/usr/bin:/bin`).
    pub program: PathBuf,
    /// Arguments after the program name.
    pub args: Vec<String>,
    /// Files written into the private work directory before the start: (plain file name,
    /// contents). Names may not contain `/` and may not be `.` or `..`.
    pub files: Vec<(String, Vec<u8>)>,
    /// Limits for this run.
    pub limits: SandboxLimits,
    /// Host paths (files or directories) the program needs to read, bound read-only at the
    /// same paths into the process sandbox's otherwise empty private root; everything else of
    /// the host is absent there. [`system_paths`] is the operating system's programs and
    /// libraries. A path under `/tmp` or `/work` is bound inside the work directory (the
    /// program's `/tmp` is a link to `/work`), its directories there counting against
    /// [`SandboxLimits::max_work_entries`]; `/tmp` or `/work` itself, a `/tmp/X` with a
    /// `/work/X`, or a job file with the name such a path takes there is refused
    /// ([`SandboxError::PathConflict`]). Ignored by the WebAssembly backend (whose guests see only the work directory
    /// and the sandbox's own read-only directories).
    pub read_only_paths: Vec<PathBuf>,
    /// Whether the program may start processes. When false, the process sandbox's seccomp
    /// filter refuses `fork`, `vfork` and any `clone` that does not create a thread, so the
    /// whole tree is one process (its threads share one address-space limit).
    pub allow_children: bool,
}

impl SandboxJob {
    /// A job running `program args…` with no files, the default limits, the operating system's
    /// [`system_paths`] readable, and child processes allowed.
    pub fn new(program: impl Into<PathBuf>, args: Vec<String>) -> Self {
        Self {
            program: program.into(),
            args,
            files: Vec::new(),
            limits: SandboxLimits::default(),
            read_only_paths: system_paths(),
            allow_children: true,
        }
    }
}

/// The operating system's programs and libraries, for jobs that run ordinary commands:
/// `/usr`, `/bin`, `/sbin`, `/lib`, `/lib32`, `/lib64`, `/libx32` (those that exist; a symbolic
/// link such as a merged-`/usr` `/bin -> usr/bin` is recreated as a link) and the dynamic
/// loader's cache `/etc/ld.so.cache`. Not `/etc` otherwise (no `passwd`), not `/home`, `/root`,
/// `/tmp`, `/var`, `/srv`, `/opt`, `/mnt` or the caller's working tree.
pub fn system_paths() -> Vec<PathBuf> {
    ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache"]
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.symlink_metadata().is_ok())
        .collect()
}

/// Which confinements a [`ProcessSandbox`] attempts. Every one defaults to on; a confinement
/// the kernel refuses is skipped and reported in [`Isolation`], never silently assumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IsolationPolicy {
    /// Put the child in a new, empty network namespace.
    pub network: bool,
    /// Give the child a private root (new mount namespace): only the job's read-only paths,
    /// minimal `/dev`, its own `/proc` and a size-limited tmpfs work directory.
    pub private_root: bool,
    /// When the caller is root, run the child under a fresh unprivileged uid.
    pub drop_privileges: bool,
    /// When the kernel refuses the namespaces a private root needs (a container without
    /// `CAP_SYS_ADMIN`, a host without unprivileged user namespaces), run anyway on the host
    /// filesystem, noted in the outcome. Off by default: the spawn fails
    /// ([`SandboxError::IsolationRefused`]) rather than let hostile code read the datasets'
    /// hidden tests or write where the caller's uid may. On with
    /// `SWITCHYARD_SANDBOX_WEAKER=1` ([`WEAKER_ENV`]).
    pub weaker_if_refused: bool,
}

/// Environment variable that lets the process sandbox run without a private root where the
/// kernel refuses one ([`IsolationPolicy::weaker_if_refused`]): `1` to allow.
pub const WEAKER_ENV: &str = "SWITCHYARD_SANDBOX_WEAKER";

impl Default for IsolationPolicy {
    /// Every confinement, a private root required unless [`WEAKER_ENV`] is `1`.
    fn default() -> Self {
        static WEAKER: OnceLock<bool> = OnceLock::new();
        let weaker_if_refused = *WEAKER.get_or_init(|| std::env::var(WEAKER_ENV).is_ok_and(|v| v == "1"));
        Self { network: true, private_root: true, drop_privileges: true, weaker_if_refused }
    }
}

/// What confinement a run really got (the kernel may refuse namespaces).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Isolation {
    /// The child ran in its own network namespace without usable interfaces.
    pub network_isolated: bool,
    /// Every mount but the work directory was read-only for the child.
    pub read_only_root: bool,
    /// The unprivileged uid the child ran as, when it was dropped from root.
    pub sandbox_uid: Option<u32>,
    /// The child ran inside a new user namespace (caller not root).
    pub user_namespace: bool,
    /// `RLIMIT_NPROC` bounds this run alone (true only with a dropped, per-run uid).
    pub process_limit_per_run: bool,
    /// The child saw only a private root: the declared read-only paths, a fresh tmpfs work
    /// directory at `/work`, minimal `/dev` and (with a PID namespace) its own `/proc`.
    #[serde(default)]
    pub private_root: bool,
    /// The program ran as pid 1 of a new PID namespace: its whole tree dies with it.
    #[serde(default)]
    pub pid_namespace: bool,
    /// The program ran in a new IPC namespace (no host System V IPC or POSIX message queues).
    #[serde(default)]
    pub ipc_namespace: bool,
    /// The seccomp filter ([`filter`]) was installed.
    #[serde(default)]
    pub seccomp: bool,
    /// The program ran in a session of its own, without a controlling terminal.
    #[serde(default)]
    pub new_session: bool,
    /// The program started with no capability at all. A process: its effective, permitted,
    /// inheritable and ambient sets cleared and its bounding set emptied (so no `execve` gives
    /// one back, not even to uid 0). A WebAssembly guest: always, since it makes no system call
    /// of its own (it holds what WASI gives it, whatever Switchyard's own capabilities).
    #[serde(default)]
    pub no_capabilities: bool,
    /// Human-readable notes on every confinement that was skipped or weakened, and why.
    pub notes: Vec<String>,
}

impl Isolation {
    /// A one-line summary, e.g. `network: isolated; filesystem: private root (declared paths
    /// read-only, tmpfs work dir); processes: own PID namespace; …`.
    pub fn summary(&self) -> String {
        let mut parts = vec![
            format!("network: {}", if self.network_isolated { "isolated" } else { "HOST NETWORK" }),
            format!(
                "filesystem: {}",
                if self.private_root {
                    "private root (declared paths read-only, tmpfs work dir)"
                } else if self.read_only_root {
                    "read-only except work dir"
                } else {
                    "HOST FILESYSTEM (writable where permissions allow)"
                }
            ),
            format!("processes: {}", if self.pid_namespace { "own PID namespace" } else { "host PID namespace" }),
            format!("IPC: {}", if self.ipc_namespace { "isolated" } else { "host" }),
            format!("seccomp: {}", if self.seccomp { "on" } else { "OFF" }),
            format!("terminal: {}", if self.new_session { "none (own session)" } else { "CALLER'S" }),
            format!("capabilities: {}", if self.no_capabilities { "none" } else { "SOME MAY REMAIN" }),
            match self.sandbox_uid {
                Some(uid) => format!("uid: {uid} (dropped from root)"),
                None if self.user_namespace => "uid: caller's, in a user namespace".to_string(),
                None => "uid: caller's".to_string(),
            },
            format!(
                "process limit: {}",
                if self.process_limit_per_run { "per run" } else { "counts all processes of the caller's uid" }
            ),
        ];
        parts.extend(self.notes.iter().cloned());
        parts.join("; ")
    }

    /// True when every confinement the policy asked for was applied.
    pub fn is_complete(&self) -> bool {
        self.notes.is_empty()
    }
}

/// How the sandboxed main process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Termination {
    /// Normal exit with this status.
    Exited(i32),
    /// Killed by this signal number.
    Signaled(i32),
    /// A WebAssembly guest stopped by a trap: a fault of its own (unreachable code, an
    /// out-of-bounds access, a stack overflow) or the sandbox's deadline. The trap message is in
    /// [`SandboxOutcome::trap`].
    Trapped,
}

impl Termination {
    /// `exit status 1`, `killed by signal 9 (SIGKILL)`.
    pub fn describe(&self) -> String {
        match *self {
            Termination::Exited(code) => format!("exit status {code}"),
            Termination::Signaled(sig) => match signal_name(sig) {
                Some(name) => format!("killed by signal {sig} ({name})"),
                None => format!("killed by signal {sig}"),
            },
            Termination::Trapped => "trapped".to_string(),
        }
    }

    /// True for `Exited(0)`.
    pub fn success(&self) -> bool {
        *self == Termination::Exited(0)
    }
}

/// A limit that a run ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LimitHit {
    /// The wall-clock limit expired and the group was killed.
    WallTime,
    /// The CPU-time rlimit killed the process (`SIGXCPU`, or `SIGKILL` at the hard limit).
    CpuTime,
    /// A write beyond `RLIMIT_FSIZE` raised `SIGXFSZ` and it was fatal.
    FileSize,
    /// stdout or stderr exceeded the output cap and was truncated.
    Output,
    /// A WebAssembly guest asked for more linear memory than its limit and was refused (the
    /// guest sees a failed `memory.grow`, e.g. Python's `MemoryError`).
    Memory,
    /// The work area was full (`max_work_bytes` or `max_work_entries`): the program saw
    /// `ENOSPC` (tmpfs) or `EFBIG`/`ENOSPC` (WASI).
    WorkArea,
    /// The program tried to hold more than `max_open_files` descriptors open.
    OpenFiles,
    /// The seccomp filter killed the program for a forbidden system call (`SIGSYS`).
    Syscall,
}

/// Everything observed about one sandboxed run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxOutcome {
    /// How the main process ended.
    pub termination: Termination,
    /// The wall-clock limit expired.
    pub timed_out: bool,
    /// Limits the run ran into, in [`LimitHit`] order.
    pub limits_hit: Vec<LimitHit>,
    /// Captured stdout (lossy UTF-8), at most `max_output_bytes`.
    pub stdout: String,
    /// Captured stderr (lossy UTF-8), at most `max_output_bytes`.
    pub stderr: String,
    /// stdout was longer than the cap.
    pub stdout_truncated: bool,
    /// stderr was longer than the cap.
    pub stderr_truncated: bool,
    /// From just before the spawn until the main process ended.
    pub wall_seconds: f64,
    /// User + system CPU time of the main process and the children it waited for.
    pub cpu_seconds: f64,
    /// Peak resident set size of the main process, in bytes (for a WebAssembly guest: the
    /// largest linear memory it was granted).
    pub max_rss_bytes: u64,
    /// Process id of the main process, which is also its process-group id (0 for a WebAssembly
    /// guest, which runs on a thread of the caller).
    pub pid: u32,
    /// The private work directory (already removed when the outcome is returned).
    pub work_dir: PathBuf,
    /// Set when the work directory could not be removed.
    pub cleanup_error: Option<String>,
    /// What confinement the run really got.
    pub isolation: Isolation,
    /// The trap that stopped a WebAssembly guest (with [`Termination::Trapped`]).
    #[serde(default)]
    pub trap: Option<String>,
}

impl SandboxOutcome {
    /// How the run ended, in words: the trap message for a trapped guest, else
    /// [`Termination::describe`].
    pub fn ending(&self) -> String {
        match (&self.termination, &self.trap) {
            (Termination::Trapped, Some(trap)) => format!("trapped: {trap}"),
            (termination, _) => termination.describe(),
        }
    }
}

/// Failures of the sandbox itself (never of the sandboxed program, which end in an outcome).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The private work directory could not be created or prepared.
    #[error("cannot prepare the sandbox work directory: {0}")]
    WorkDir(#[source] io::Error),
    /// A job file name that is not a plain file name.
    #[error("invalid sandbox file name {0:?}: must be a plain file name")]
    InvalidFileName(String),
    /// A job file could not be written into the work directory.
    #[error("cannot write {name} into the sandbox work directory: {source}")]
    WriteFile {
        /// File name inside the work directory.
        name: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A path or argument contained a NUL byte.
    #[error("{0} contains a NUL byte")]
    NulByte(String),
    /// A read-only path that is not absolute.
    #[error("sandbox read-only path {0:?} must be absolute")]
    InvalidPath(String),
    /// Declared read-only paths (or a job file) that would meet the work directory in the
    /// private root: a path that would replace `/tmp` or `/work` itself, a `/tmp/X` and a
    /// `/work/X` (the same place there: `/tmp` is a link to `/work`), or a job file named like
    /// a declared path's place in the work directory.
    #[error("sandbox paths conflict: {0}")]
    PathConflict(String),
    /// The seccomp filter could not be built.
    #[error("{0}")]
    Filter(String),
    /// Limits that cannot be applied (zero or non-finite wall time, zero processes).
    #[error("invalid sandbox limits: {0}")]
    InvalidLimits(String),
    /// The kernel refused the namespaces the private root needs, and the policy does not run
    /// without one ([`IsolationPolicy::weaker_if_refused`]); nothing ran.
    #[error(
        "the sandbox cannot isolate the program ({0}); nothing ran. Run where namespaces are allowed, or set {WEAKER_ENV}=1 to run it on the host filesystem"
    )]
    IsolationRefused(String),
    /// The child could not be started (fork, confinement before exec, or exec failed).
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program that was to run.
        program: String,
        /// The error reported by the spawn.
        #[source]
        source: io::Error,
    },
    /// Waiting for or reading from the child failed.
    #[error("lost track of the sandboxed process: {0}")]
    Wait(#[source] io::Error),
    /// The WebAssembly engine could not be created (or its async executor could not start).
    #[error("WebAssembly engine unavailable: {0}")]
    WasmEngine(String),
    /// A WebAssembly module file could not be read.
    #[error("cannot read WebAssembly module {path}: {source}")]
    ModuleRead {
        /// The module file.
        path: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A WebAssembly module did not compile (invalid binary or text).
    #[error("cannot compile WebAssembly module {module}: {reason}")]
    WasmCompile {
        /// Module name or path.
        module: String,
        /// The compiler's message.
        reason: String,
    },
    /// A WebAssembly module could not be linked or instantiated (missing imports or exports,
    /// pre-opened directories that cannot be opened).
    #[error("cannot instantiate WebAssembly module {module}: {reason}")]
    WasmInstantiate {
        /// Module name or path.
        module: String,
        /// What failed.
        reason: String,
    },
}

/// A backend that runs a [`SandboxJob`] to completion.
pub trait Sandbox: Send + Sync {
    /// A short backend name for notes and reports (`process`, `wasm`).
    fn name(&self) -> &'static str;
    /// Runs the job; returns an outcome whatever the program does, and an error only when the
    /// sandbox itself fails.
    fn run(&self, job: &SandboxJob) -> Result<SandboxOutcome, SandboxError>;
    /// What confinement `outcome` (a run of this sandbox) had, in one line for notes and
    /// reports. Defaults to [`Isolation::summary`].
    fn describe(&self, outcome: &SandboxOutcome) -> String {
        outcome.isolation.summary()
    }
}

/// Runs jobs as confined OS processes (Linux). See the module documentation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessSandbox {
    /// Which confinements to attempt.
    pub policy: IsolationPolicy,
}

impl ProcessSandbox {
    /// A sandbox with every confinement attempted.
    pub fn new() -> Self {
        Self::default()
    }

    /// A sandbox with the given policy.
    pub fn with_policy(policy: IsolationPolicy) -> Self {
        Self { policy }
    }
}

impl Sandbox for ProcessSandbox {
    fn name(&self) -> &'static str {
        "process"
    }

    fn run(&self, job: &SandboxJob) -> Result<SandboxOutcome, SandboxError> {
        run_process(self.policy, job)
    }
}

/// Per-process counter for [`allocate_uid`].
static RUN_COUNTER: AtomicU32 = AtomicU32::new(0);

/// The uid for the next run when dropping from root (see [`SANDBOX_UID_BASE`]).
fn allocate_uid() -> u32 {
    static OFFSET: OnceLock<u32> = OnceLock::new();
    let offset = *OFFSET.get_or_init(uid_offset);
    uid_for(offset, RUN_COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// The uid of run `run` of a process whose offset is `offset`: always in
/// `[SANDBOX_UID_BASE, SANDBOX_UID_BASE + SANDBOX_UID_SPAN)`.
fn uid_for(offset: u32, run: u32) -> u32 {
    let span = u64::from(SANDBOX_UID_SPAN);
    // The remainder is below the span, a u32.
    SANDBOX_UID_BASE + ((u64::from(offset) + u64::from(run)) % span) as u32
}

/// This process's uid offset: 4 bytes of `getrandom`, reduced to the span. Should the call
/// fail (no `getrandom`, Linux < 3.17), the pid mixed with the clock's nanoseconds.
fn uid_offset() -> u32 {
    let mut bytes = [0u8; 4];
    // SAFETY: the buffer is valid for 4 bytes of writes; flags 0 (the urandom source, blocking
    // only until the pool is first initialised).
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    let raw = if got == 4 {
        u32::from_ne_bytes(bytes)
    } else {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        std::process::id().wrapping_mul(2_654_435_761) ^ nanos
    };
    raw % SANDBOX_UID_SPAN
}

pub(crate) fn validate(job: &SandboxJob) -> Result<(), SandboxError> {
    let limits = &job.limits;
    if limits.wall_time.is_zero() {
        return Err(SandboxError::InvalidLimits("wall time must be positive".into()));
    }
    if limits.max_processes == 0 {
        return Err(SandboxError::InvalidLimits("at least one process must be allowed".into()));
    }
    if limits.cpu_seconds == 0 {
        return Err(SandboxError::InvalidLimits("CPU time must be at least one second".into()));
    }
    for (name, _) in &job.files {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
            return Err(SandboxError::InvalidFileName(name.clone()));
        }
    }
    Ok(())
}

fn cstring(bytes: &[u8], what: &str) -> Result<CString, SandboxError> {
    CString::new(bytes).map_err(|_| SandboxError::NulByte(what.to_string()))
}

/// An `O_CLOEXEC` pipe: (read end, write end).
fn cloexec_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, with integer arguments only.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A pollable descriptor that becomes readable when `pid` exits, if the kernel has pidfds.
fn pidfd_open(pid: libc::pid_t) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the syscall returned a fresh descriptor that we now own.
    Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A descriptor of the PID namespace's init (host pid `init`), which spawned child `s` started:
/// `None` unless the process now holding that pid is still `s`'s child. The init may have ended
/// and been reaped by `s` already (a program that exits at once), and its pid taken by an
/// unrelated process, which `await_namespace_end` would then kill; `s` is this process's
/// unreaped child, so its pid is not reused, and no process but the init is ever its child.
/// The parent is read after the descriptor is open and the process checked alive after the
/// read, so the read was of the process the descriptor holds.
fn init_pidfd(init: libc::pid_t, s: libc::pid_t) -> Option<OwnedFd> {
    let fd = pidfd_open(init)?;
    let stat = std::fs::read_to_string(format!("/proc/{init}/stat")).ok()?;
    // `pid (comm) state ppid …`: the command may hold spaces and parentheses, so split after
    // its last `)`.
    let ppid: libc::pid_t = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: pidfd_send_signal with signal 0 on our own descriptor only checks the process.
    let alive = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd.as_raw_fd(), 0, std::ptr::null::<libc::siginfo_t>(), 0) } == 0;
    (ppid == s && alive).then_some(fd)
}

/// Longest wait for a killed PID namespace to finish dying.
const NAMESPACE_END_GRACE: Duration = Duration::from_secs(5);

/// Kills the namespace's init through its pidfd and waits until it has exited, which means
/// every process of its namespace has; false when that takes longer than
/// [`NAMESPACE_END_GRACE`].
fn await_namespace_end(init: &OwnedFd) -> bool {
    // SAFETY: pidfd_send_signal on our own descriptor with no siginfo.
    unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, init.as_raw_fd(), libc::SIGKILL, std::ptr::null::<libc::siginfo_t>(), 0);
    }
    let deadline = Instant::now() + NAMESPACE_END_GRACE;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        match poll_fds(&[Some(init.as_raw_fd())], deadline - now) {
            Ok(ready) if ready[0] => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
}

/// Whether `pid` has exited, without reaping it (`waitid(WNOHANG | WNOWAIT)`).
fn has_exited(pid: libc::pid_t) -> io::Result<bool> {
    // SAFETY: siginfo_t is plain data; waitid fills it for our own child.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: valid pointer to `info`; `pid` is our unreaped child.
        let rc = unsafe {
            libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT)
        };
        if rc == 0 {
            // SAFETY: after a successful waitid, si_pid is valid to read; 0 means "not yet".
            return Ok(unsafe { info.si_pid() } != 0);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Reaps `pid`, returning its wait status and resource usage.
fn reap(pid: libc::pid_t) -> io::Result<(libc::c_int, libc::rusage)> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: valid pointers; `pid` is our child.
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if rc == pid {
            return Ok((status, usage));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Sends `SIGKILL` to the process group `pgid` (errors such as "no such group" are ignored).
fn kill_group(pgid: libc::pid_t) {
    // SAFETY: kill with a negative pid signals a process group; no memory is involved.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
}

/// Kills every process owned by `uid`: a forked helper takes that uid and calls
/// `kill(-1, SIGKILL)`, which reaches exactly the processes it may signal (same uid), never the
/// caller (root) and never itself. Used only with a per-run uid (caller is root).
fn kill_uid(uid: u32) {
    // SAFETY: in the child we only make raw system calls and `_exit`, which are
    // async-signal-safe, as required after fork in a multi-threaded process.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            if libc::syscall(libc::SYS_setresgid, uid, uid, uid) == 0
                && libc::syscall(libc::SYS_setresuid, uid, uid, uid) == 0
            {
                libc::kill(-1, libc::SIGKILL);
            }
            libc::_exit(0);
        }
        if pid > 0 {
            let mut status = 0;
            while libc::waitpid(pid, &mut status, 0) < 0 && *libc::__errno_location() == libc::EINTR {}
        }
    }
}

/// Human names of the signals a sandboxed run typically dies of.
pub fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

/// A capped capture of one output pipe.
struct Capture {
    fd: Option<File>,
    kept: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl Capture {
    fn new(fd: OwnedFd, cap: usize) -> io::Result<Self> {
        set_nonblocking(fd.as_raw_fd())?;
        Ok(Self { fd: Some(File::from(fd)), kept: Vec::new(), cap, truncated: false })
    }

    fn raw(&self) -> Option<RawFd> {
        self.fd.as_ref().map(|f| f.as_raw_fd())
    }

    /// Reads what is available, at most [`DRAIN_READS_PER_WAKEUP`] buffers so a writer that
    /// never pauses cannot keep the supervisor from its deadline; closes the capture at
    /// end-of-file.
    fn drain(&mut self) -> io::Result<()> {
        let mut buf = [0u8; 16 * 1024];
        for _ in 0..DRAIN_READS_PER_WAKEUP {
            let Some(file) = self.fd.as_mut() else { break };
            match file.read(&mut buf) {
                Ok(0) => self.fd = None,
                Ok(n) => {
                    let room = self.cap.saturating_sub(self.kept.len());
                    if n > room {
                        self.truncated = true;
                    }
                    self.kept.extend_from_slice(&buf[..n.min(room)]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.kept).into_owned()
    }
}

/// Waits for readiness on the given descriptors (`None` entries are skipped) for at most
/// `timeout`; returns which of them are readable or hung up.
fn poll_fds(fds: &[Option<RawFd>], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut pollfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd { fd: fd.unwrap_or(-1), events: libc::POLLIN, revents: 0 })
        .collect();
    let millis = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // A sub-millisecond remainder must not become a busy loop of zero-timeout polls.
    let millis = if millis == 0 && !timeout.is_zero() { 1 } else { millis };
    // SAFETY: `pollfds` is a valid array; negative fds are ignored by poll.
    let rc = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, millis) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(err);
    }
    Ok(pollfds.iter().map(|p| p.fd >= 0 && p.revents != 0).collect())
}

fn run_process(policy: IsolationPolicy, job: &SandboxJob) -> Result<SandboxOutcome, SandboxError> {
    validate(job)?;
    let limits = &job.limits;
    // SAFETY: geteuid/getegid cannot fail.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let is_root = euid == 0;

    let identity = if is_root && policy.drop_privileges {
        let uid = allocate_uid();
        Identity::DropTo { uid, gid: uid }
    } else if !is_root {
        Identity::UserNamespace {
            uid_map: cstring(format!("{euid} {euid} 1").as_bytes(), "uid map")?,
            gid_map: cstring(format!("{egid} {egid} 1").as_bytes(), "gid map")?,
        }
    } else {
        Identity::Keep
    };
    let sandbox_uid = match identity {
        Identity::DropTo { uid, .. } => Some(uid),
        _ => None,
    };

    let work = work_plan(job, sandbox_uid)?;
    let host_work_dir = PathBuf::from(std::ffi::OsStr::from_bytes(work.host_dir.as_bytes()));
    let (report_read, report_write) = cloexec_pipe().map_err(SandboxError::WorkDir)?;
    let program = cstring(job.program.as_os_str().as_bytes(), "program path")?;
    let mut argv = vec![program.clone()];
    for arg in &job.args {
        argv.push(cstring(arg.as_bytes(), "argument")?);
    }
    let environment = |work_dir: &[u8]| -> Result<CStringArray, SandboxError> {
        let mut env = vec![cstring(b"PATH=/usr/local/bin:/usr/bin:/bin", "PATH")?, cstring(b"LANG=C.UTF-8", "LANG")?];
        for name in ["HOME", "TMPDIR"] {
            let mut entry = format!("{name}=").into_bytes();
            entry.extend_from_slice(work_dir);
            env.push(cstring(&entry, "work directory")?);
        }
        Ok(CStringArray::new(env))
    };
    let view = if policy.private_root { cached_view(&job.read_only_paths)? } else { Vec::new() };
    let placed = confine::work_area_names(&view);
    if let Some((name, _)) = job.files.iter().find(|(name, _)| placed.contains(std::ffi::OsStr::new(name))) {
        return Err(SandboxError::PathConflict(format!(
            "the job file {name} and a declared path under /tmp or /work would both be {PRIVATE_WORK_DIR}/{name} in the sandbox"
        )));
    }
    let plan = ChildPlan {
        identity,
        isolate_network: policy.network,
        private_root: policy.private_root,
        view,
        cpu_seconds: limits.cpu_seconds,
        address_space_bytes: limits.address_space_bytes,
        max_processes: limits.max_processes,
        max_file_bytes: limits.max_file_bytes,
        max_open_files: limits.max_open_files,
        env_private: environment(PRIVATE_WORK_DIR.as_bytes())?,
        env_host: environment(work.host_dir.as_bytes())?,
        work,
        program,
        argv: CStringArray::new(argv),
        filter: cached_filter(job.allow_children)?,
        // SAFETY: getpid cannot fail.
        parent_pid: unsafe { libc::getpid() },
        report_fd: report_write.as_raw_fd(),
        require_private_root: policy.private_root && !policy.weaker_if_refused,
        init_stack: confine::CloneStack::new(confine::INIT_STACK_BYTES),
        program_stack: confine::CloneStack::new(confine::PROGRAM_STACK_BYTES),
    };

    // `program` is only the name std reports in errors: the child execs `plan.program` itself.
    let mut command = Command::new(&job.program);
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: `confine_child` only makes async-signal-safe system calls on memory prepared
    // before the fork (see its documentation), and ends in `execve` or an error.
    unsafe {
        command.pre_exec(move || confine::confine_child(&plan));
    }

    let started = Instant::now();
    let spawned = command.spawn();
    drop(report_write);
    let mut child = match spawned {
        Ok(child) => child,
        Err(source) => {
            // The child may have created the host work directory before failing.
            let _ = std::fs::remove_dir_all(&host_work_dir);
            // A refused private root the policy requires: the child says so in its report.
            let report = ChildReport::read_from(File::from(report_read)).report;
            if let Some(refused) = report.filter(|r| r.refused_isolation()) {
                return Err(SandboxError::IsolationRefused(refused.refusal()));
            }
            return Err(SandboxError::Spawn { program: job.program.display().to_string(), source });
        }
    };
    let pid = child.id() as libc::pid_t;

    let messages = ChildReport::read_from(File::from(report_read));
    let (report, init_pid) = (messages.report, messages.init);
    if let Some(errno) = messages.error {
        // The program's process failed to confine itself or to exec: nothing ran. The init's
        // descriptor is taken while `pid` lives, before the kill ends it and frees its pid.
        let init = init_pid.and_then(|init| init_pidfd(init, pid));
        kill_group(pid);
        let _ = reap(pid);
        if let Some(init) = init {
            await_namespace_end(&init);
        }
        if used_host_dir_of(report) {
            let _ = std::fs::remove_dir_all(&host_work_dir);
        }
        return Err(SandboxError::Spawn {
            program: job.program.display().to_string(),
            source: io::Error::from_raw_os_error(errno),
        });
    }
    // A descriptor of the namespace's init, taken while it runs (it lives until the program
    // ends), so its exit — which the kernel completes only once every process of the namespace
    // is gone — can be awaited without any risk of a recycled pid.
    let init = init_pid.and_then(|init| init_pidfd(init, pid));
    let used_host_dir = used_host_dir_of(report);
    let isolation = confine::isolation_from(report, policy, is_root, sandbox_uid);

    // With a PID namespace its end kills every process of the run, which `await_namespace_end`
    // waits for; the uid sweep is then redundant, and it is not free: each sweep forks this
    // process, whose page tables grow with its memory.
    let uid_sweep = if init.is_some() { None } else { sandbox_uid };
    let captured = supervise(&mut child, pid, uid_sweep, limits, started);
    let mut notes_after = Vec::new();
    // Whatever happened while supervising, make sure nothing of the run survives.
    kill_group(pid);
    if let Some(uid) = uid_sweep {
        kill_uid(uid);
    }
    let reaped = reap(pid);
    if let Some(init) = &init
        && !await_namespace_end(init)
    {
        notes_after.push("the PID namespace was still shutting down when the run ended".to_string());
    }
    let (stdout, stderr, timed_out, wall_seconds, mut notes) = captured.map_err(SandboxError::Wait)?;
    notes.append(&mut notes_after);
    let (status, usage) = reaped.map_err(SandboxError::Wait)?;

    let termination = if libc::WIFSIGNALED(status) {
        Termination::Signaled(libc::WTERMSIG(status))
    } else {
        Termination::Exited(libc::WEXITSTATUS(status))
    };
    let cpu_seconds = timeval_seconds(usage.ru_utime) + timeval_seconds(usage.ru_stime);
    let mut limits_hit = Vec::new();
    if timed_out {
        limits_hit.push(LimitHit::WallTime);
    }
    let cpu_killed = match termination {
        Termination::Signaled(libc::SIGXCPU) => true,
        Termination::Signaled(libc::SIGKILL) => !timed_out && cpu_seconds + 0.05 >= limits.cpu_seconds as f64,
        _ => false,
    };
    if cpu_killed {
        limits_hit.push(LimitHit::CpuTime);
    }
    if termination == Termination::Signaled(libc::SIGXFSZ) {
        limits_hit.push(LimitHit::FileSize);
    }
    if stdout.truncated || stderr.truncated {
        limits_hit.push(LimitHit::Output);
    }
    if termination == Termination::Signaled(libc::SIGSYS) {
        limits_hit.push(LimitHit::Syscall);
    }

    // A private root's work directory died with its mount namespace; a host one is removed.
    let (work_dir, cleanup_error) = if used_host_dir {
        let error = match std::fs::remove_dir_all(&host_work_dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Some(e.to_string()),
            _ => None,
        };
        (host_work_dir, error)
    } else {
        (PathBuf::from(PRIVATE_WORK_DIR), None)
    };
    let mut isolation = isolation;
    isolation.notes.append(&mut notes);
    Ok(SandboxOutcome {
        termination,
        timed_out,
        limits_hit,
        stdout: stdout.text(),
        stderr: stderr.text(),
        stdout_truncated: stdout.truncated,
        stderr_truncated: stderr.truncated,
        wall_seconds,
        cpu_seconds,
        // ru_maxrss is in KiB on Linux.
        max_rss_bytes: (usage.ru_maxrss.max(0) as u64) * 1024,
        pid: pid as u32,
        work_dir,
        cleanup_error,
        isolation,
        trap: None,
    })
}

/// The seccomp filter for jobs with or without children, compiled once per process.
fn cached_filter(allow_children: bool) -> Result<SyscallFilter, SandboxError> {
    static FILTERS: [OnceLock<Result<SyscallFilter, String>>; 2] = [OnceLock::new(), OnceLock::new()];
    FILTERS[usize::from(allow_children)]
        .get_or_init(|| SyscallFilter::new(allow_children).map_err(|e| e.to_string()))
        .clone()
        .map_err(SandboxError::Filter)
}

/// The private root's layout for a list of read-only paths, planned once per process and list
/// (the paths a tool declares, such as an interpreter's, do not change while it runs).
fn cached_view(paths: &[PathBuf]) -> Result<Vec<confine::ViewOp>, SandboxError> {
    static VIEWS: Mutex<BTreeMap<Vec<PathBuf>, Vec<confine::ViewOp>>> = Mutex::new(BTreeMap::new());
    let lock = || VIEWS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(view) = lock().get(paths) {
        return Ok(view.clone());
    }
    let view = confine::plan_view(paths)?;
    lock().insert(paths.to_vec(), view.clone());
    Ok(view)
}

/// Whether a run used a host work directory (assumed when the child sent no report).
fn used_host_dir_of(report: Option<ChildReport>) -> bool {
    report.is_none_or(|r| r.used_host_work_dir())
}

/// Counter making host work directory names unique within this process.
static WORK_DIR_COUNTER: AtomicU32 = AtomicU32::new(0);

/// The work directory of a job in both modes: the tmpfs of the private root (size and entries
/// from the limits, owned by the sandbox uid) and the marked host directory used without a
/// mount namespace (named here, created by the child).
fn work_plan(job: &SandboxJob, sandbox_uid: Option<u32>) -> Result<WorkPlan, SandboxError> {
    let limits = &job.limits;
    residue::sweep_once();
    let root = std::path::Path::new(confine::ROOT_MOUNT_POINT);
    let private_mount = root.join(PRIVATE_WORK_DIR.trim_start_matches('/'));
    let unique = WORK_DIR_COUNTER.fetch_add(1, Ordering::Relaxed);
    // Nanoseconds make the name hard to guess for another local user who might pre-create it
    // (the child's mkdir fails then, and so does the spawn: never a shared directory).
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let host_dir = std::env::temp_dir().join(format!("{}{}-{unique}-{nanos:09}", residue::WORK_DIR_PREFIX, std::process::id()));
    let mut tmpfs_options = format!("size={},nr_inodes={},mode=0700", limits.max_work_bytes.max(4096), limits.max_work_entries.max(1) + 1);
    if let Some(uid) = sandbox_uid {
        tmpfs_options.push_str(&format!(",uid={uid},gid={uid}"));
    }
    let mut private_files = Vec::new();
    let mut host_files = Vec::new();
    for (name, contents) in &job.files {
        private_files.push((confine::cstring_path(&private_mount.join(name))?, contents.clone()));
        host_files.push(confine::cstring_path(&host_dir.join(name))?);
    }
    Ok(WorkPlan {
        private_mount: confine::cstring_path(&private_mount)?,
        tmpfs_options: cstring(tmpfs_options.as_bytes(), "tmpfs options")?,
        private_files,
        host_marker: (
            confine::cstring_path(&host_dir.join(residue::MARKER_FILE))?,
            residue::marker_contents().into_bytes(),
        ),
        host_dir: confine::cstring_path(&host_dir)?,
        host_files,
    })
}

fn timeval_seconds(tv: libc::timeval) -> f64 {
    tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6
}

type Supervised = (Capture, Capture, bool, f64, Vec<String>);

/// Captures output until the main process exits (or the wall limit kills it) and every pipe
/// is closed. Kills the group (and uid) at the limit and again as soon as the main process has
/// exited, while it is still an unreaped zombie.
fn supervise(
    child: &mut std::process::Child,
    pid: libc::pid_t,
    sandbox_uid: Option<u32>,
    limits: &SandboxLimits,
    started: Instant,
) -> io::Result<Supervised> {
    let deadline = started + limits.wall_time;
    let missing = || io::Error::other("child pipe missing");
    let mut out = Capture::new(child.stdout.take().ok_or_else(missing)?.into(), limits.max_output_bytes)?;
    let mut err = Capture::new(child.stderr.take().ok_or_else(missing)?.into(), limits.max_output_bytes)?;
    let pidfd = pidfd_open(pid);
    let mut timed_out = false;
    let mut exited_at: Option<Instant> = None;
    let mut notes = Vec::new();

    loop {
        if exited_at.is_none() && has_exited(pid)? {
            let now = Instant::now();
            exited_at = Some(now);
            kill_group(pid);
            if let Some(uid) = sandbox_uid {
                kill_uid(uid);
            }
        }
        let now = Instant::now();
        if exited_at.is_none() && !timed_out && now >= deadline {
            timed_out = true;
            kill_group(pid);
            if let Some(uid) = sandbox_uid {
                kill_uid(uid);
            }
        }
        if let Some(exit) = exited_at {
            if out.fd.is_none() && err.fd.is_none() {
                break;
            }
            if now >= exit + PIPE_GRACE {
                notes.push(
                    "an escaped process still held the output pipes open when the run ended".to_string(),
                );
                break;
            }
        }
        let wait = match exited_at {
            Some(exit) => (exit + PIPE_GRACE).saturating_duration_since(now),
            None if timed_out => EXIT_POLL_INTERVAL,
            None => deadline.saturating_duration_since(now),
        };
        let wait = if pidfd.is_none() && exited_at.is_none() { wait.min(EXIT_POLL_INTERVAL) } else { wait };
        let exit_fd = if exited_at.is_none() { pidfd.as_ref().map(|fd| fd.as_raw_fd()) } else { None };
        let ready = poll_fds(&[out.raw(), err.raw(), exit_fd], wait)?;
        if ready[0] {
            out.drain()?;
        }
        if ready[1] {
            err.drain()?;
        }
    }
    let end = exited_at.unwrap_or_else(Instant::now);
    let wall_seconds = end.duration_since(started).as_secs_f64();
    Ok((out, err, timed_out, wall_seconds, notes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn an_init_descriptor_is_taken_only_from_the_expected_parents_child() {
        // A child of this process stands in for the namespace's init, this process for S.
        let mut child = std::process::Command::new("/bin/sleep").arg("10").spawn().expect("sleep");
        let pid = child.id() as libc::pid_t;
        // SAFETY: getpid cannot fail.
        let me = unsafe { libc::getpid() };
        assert!(init_pidfd(pid, me).is_some(), "our own child");
        assert!(init_pidfd(pid, me + 1).is_none(), "a process whose parent is not S (a recycled pid)");
        let _ = child.kill();
        let _ = child.wait();
        assert!(init_pidfd(pid, me).is_none(), "an ended process");
    }

    #[test]
    fn run_uids_stay_in_the_sandbox_range_and_wrap_inside_it() {
        let last = SANDBOX_UID_BASE + (SANDBOX_UID_SPAN - 1);
        assert_eq!(uid_for(0, 0), SANDBOX_UID_BASE);
        assert_eq!(uid_for(SANDBOX_UID_SPAN - 1, 0), last);
        // Past the end of the span the next run wraps to its start, never above it.
        assert_eq!(uid_for(SANDBOX_UID_SPAN - 1, 1), SANDBOX_UID_BASE);
        assert_eq!(uid_for(SANDBOX_UID_SPAN - 1, u32::MAX), SANDBOX_UID_BASE + (u32::MAX - 1) % SANDBOX_UID_SPAN);
        assert!(last < u32::MAX, "(uid_t) -1 means 'no change' to setresuid");
        // Consecutive runs of one process get consecutive, distinct uids.
        assert_eq!(uid_for(17, 5) + 1, uid_for(17, 6));
    }

    #[test]
    fn the_offset_comes_from_the_random_source_not_the_pid() {
        // Two draws in one process (what two processes with the same pid would each make) agree
        // only by chance: 1 in 3 · 10⁹ per pair, so 8 draws all equal means no randomness.
        let draws: BTreeSet<u32> = (0..8).map(|_| uid_offset()).collect();
        assert!(draws.len() > 1, "every offset equal: {draws:?}");
        assert!(draws.iter().all(|&o| o < SANDBOX_UID_SPAN));
        let uid = allocate_uid();
        assert!((SANDBOX_UID_BASE..SANDBOX_UID_BASE + SANDBOX_UID_SPAN).contains(&uid));
    }
}
