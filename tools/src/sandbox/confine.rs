//! The confinement a sandboxed child applies to itself between `fork` and `exec`.
//!
//! Owns the child-side plan ([`ChildPlan`], everything allocated before the fork, including the
//! private root's layout from [`plan_view`]), the system calls that carry it out
//! ([`confine_child`]) and the report the child sends back so the parent knows which
//! confinements the kernel granted ([`ChildReport`]). Everything the child runs is restricted
//! to async-signal-safe system calls on memory prepared before the fork: no allocation, no
//! locks, no Rust I/O objects. Must not depend on anything outside this crate's sandbox module.
//!
//! Two processes come out of one spawn. The spawned child **S** (whose pid the parent tracks):
//! 1. `setsid()`: a session and process group of its own, no controlling terminal (so
//!    `/dev/tty` and `TIOCSTI` cannot reach the caller's terminal);
//! 2. `PR_SET_PDEATHSIG = SIGKILL` (dies with the spawning thread), no core dumps
//!    (`RLIMIT_CORE` 1, which stops piped dumps too), `oom_score_adj` 1000 (the OOM killer's
//!    first choice);
//! 3. namespaces: as root one `unshare` each of `CLONE_NEWPID`, `CLONE_NEWIPC`,
//!    `CLONE_NEWNET`, `CLONE_NEWNS`; otherwise one `unshare(CLONE_NEWUSER | …)` with an
//!    identity uid/gid map (a refused map leaves the child unmapped in namespaces that exist,
//!    where no private root can be built: it counts as a refused private root);
//! 4. with a PID namespace, the namespace's init (pid 1) is started with `clone(CLONE_VM)` on a
//!    stack prepared before the fork, and it starts the program's process **G** (pid 2) with
//!    `clone(CLONE_VM | CLONE_VFORK)`; neither copies S's page tables (S is a copy of the
//!    caller, whose memory may be large: a sandboxed `/bin/true` from a caller with 100 MiB
//!    resident costs 5 ms this way, 17 ms with two more forks). The init reaps every process of
//!    the namespace; when G ends, it passes G's wait status to S through a pipe and exits, and
//!    the kernel kills every process left in the namespace (a double-forked `setsid` daemon
//!    included). S holds no other descriptor, waits for init and dies the way G died, so the
//!    parent's `wait` sees G's status. (G is not pid 1 because pid 1 ignores signals it has no
//!    handler for, such as the `SIGXFSZ` of `RLIMIT_FSIZE`.) A failure in G before `execve` is
//!    sent to the parent as an errno on the report pipe. Without a PID namespace, S itself goes
//!    on as G.
//!
//! G then:
//! 5. in the new mount namespace, builds the private root: a small tmpfs mounted over
//!    [`ROOT_MOUNT_POINT`] (visible only in this namespace), the directories, symbolic links
//!    and read-only, `nosuid`, `nodev` bind mounts of [`plan_view`], `/dev/{null,zero,random,
//!    urandom}`, a fresh `/proc` (only with a PID namespace, so it shows this run's processes
//!    alone), `/tmp -> work`, and a size- and inode-limited tmpfs at `/work` holding the job's
//!    files, then the declared paths under `/tmp` or `/work`, inside it; the root tmpfs is
//!    made read-only, `pivot_root` moves into it and the host's tree
//!    is detached. Without a mount namespace, a host work directory with Switchyard's marker
//!    (see [`super::residue`]) instead;
//! 6. `chdir` into the work directory;
//! 7. rlimits: CPU, address space, processes, file size, open files;
//! 8. identity: clear the ambient capability set and empty the bounding set, drop supplementary
//!    groups, gid and uid (raw system calls, so glibc's all-threads `setxid` machinery is never
//!    involved), clear the effective, permitted and inheritable sets (`capset`: the program
//!    starts with no capability, also where it keeps uid 0 or owns a user namespace), then
//!    `PR_SET_NO_NEW_PRIVS` and `PR_SET_PDEATHSIG = SIGKILL` again (the uid change clears it);
//! 9. every descriptor above stderr marked close-on-exec (one `close_range`; where the kernel
//!    lacks its flag, each up to the highest open, which S read from its own table right after
//!    the fork); the report written to the parent;
//! 10. the seccomp filter ([`super::filter`]) installed, then `execve` of the program.
//!
//! Steps 3 and the `/proc` mount are best effort (reported), except that a private root the
//! policy requires fails the spawn without its namespaces; every other step is mandatory: if
//! one fails, the spawn fails rather than run untrusted code with weaker limits than asked.

use std::collections::{BTreeMap, BTreeSet};
use std::cell::UnsafeCell;
use std::ffi::{CStr, CString, c_char};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::filter::SyscallFilter;
use super::{Isolation, IsolationPolicy, SandboxError};

/// Where the private root's tmpfs is mounted inside the child's own mount namespace before
/// `pivot_root`. Any directory that every Linux system has and that never holds a program or
/// library a job could declare works: the mount hides it only inside that namespace.
pub(super) const ROOT_MOUNT_POINT: &str = "/sys";
/// [`ROOT_MOUNT_POINT`] as a C string, and the private root's `/proc` under it.
const ROOT_MOUNT_POINT_C: &CStr = c"/sys";
const ROOT_PROC_C: &CStr = c"/sys/proc";

/// Guest path of the work directory in the private root.
pub const PRIVATE_WORK_DIR: &str = "/work";

/// Bytes of the private root's own tmpfs (directories, links and mount points only).
const ROOT_TMPFS_OPTIONS: &CStr = c"size=1m,nr_inodes=4096,mode=0755";

/// Device nodes bound into the private root's `/dev` (read-write; they hold no data).
const DEVICES: [&str; 4] = ["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"];

/// Which identity the child takes.
#[derive(Debug)]
pub(super) enum Identity {
    /// Caller is root: become this unprivileged uid/gid.
    DropTo { uid: u32, gid: u32 },
    /// Caller is not root: enter a new user namespace with these identity maps (lines for
    /// `/proc/self/uid_map` and `/proc/self/gid_map`).
    UserNamespace { uid_map: CString, gid_map: CString },
    /// Keep the caller's identity.
    Keep,
}

/// One step of building the private root, with paths already prefixed by
/// [`ROOT_MOUNT_POINT`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ViewOp {
    /// `mkdir(path, 0755)` (an existing directory is fine).
    Dir(CString),
    /// `symlink(target, link)`.
    Symlink { link: CString, target: CString },
    /// Bind-mount a host directory read-only.
    BindDir { source: CString, target: CString },
    /// Bind-mount a host file read-only (or read-write for a device node).
    BindFile { source: CString, target: CString, writable: bool },
    /// Mount the work directory's tmpfs (at [`WorkPlan::private_mount`]) and write the job's
    /// files into it. The ops after it place declared paths under `/tmp` and `/work` inside
    /// the work directory (the program's `/tmp` is a link to it).
    WorkArea,
}

/// A NUL-terminated array of pointers into owned C strings, for `execve`.
pub(super) struct CStringArray {
    _strings: Vec<CString>,
    pointers: Vec<*const c_char>,
}

// SAFETY: the pointers point into the heap buffers of `_strings`, which the struct owns and
// never mutates; moving the struct (to another thread, or into the forked child's copy of
// memory) moves the `CString`s without moving their buffers.
unsafe impl Send for CStringArray {}
// SAFETY: shared access only reads the pointers and the strings.
unsafe impl Sync for CStringArray {}

impl CStringArray {
    pub(super) fn new(strings: Vec<CString>) -> Self {
        let mut pointers: Vec<*const c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        pointers.push(std::ptr::null());
        Self { _strings: strings, pointers }
    }

    fn as_ptr(&self) -> *const *const c_char {
        self.pointers.as_ptr()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.pointers.len() - 1
    }
}

impl std::fmt::Debug for CStringArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self._strings.iter()).finish()
    }
}

/// Memory for the stack of a process started with `clone(CLONE_VM)`, allocated before the
/// fork.
pub(super) struct CloneStack(Vec<UnsafeCell<u8>>);

// SAFETY: the memory is only ever written by the process that runs on it after the fork (the
// parent's copy is never touched); the struct itself only hands out its top address.
unsafe impl Send for CloneStack {}
// SAFETY: as above.
unsafe impl Sync for CloneStack {}

impl CloneStack {
    pub(super) fn new(bytes: usize) -> Self {
        Self((0..bytes).map(|_| UnsafeCell::new(0)).collect())
    }

    /// The highest address of the stack, 16-byte aligned (stacks grow down on every Linux
    /// architecture Rust supports but HP-PA).
    fn top(&self) -> *mut libc::c_void {
        let end = self.0.as_ptr().wrapping_add(self.0.len()) as usize;
        (end & !15) as *mut libc::c_void
    }
}

impl std::fmt::Debug for CloneStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CloneStack({} bytes)", self.0.len())
    }
}

/// Stack of the PID namespace's init (it only waits and reaps) and of the program's process
/// until `execve` (the confinement's frames are small; the filter is installed from memory
/// prepared before the fork).
pub(super) const INIT_STACK_BYTES: usize = 64 * 1024;
pub(super) const PROGRAM_STACK_BYTES: usize = 256 * 1024;

/// The work directory in each mode, with the job's files.
#[derive(Debug)]
pub(super) struct WorkPlan {
    /// `ROOT_MOUNT_POINT/work`, where the work tmpfs is mounted before `pivot_root`.
    pub private_mount: CString,
    /// Mount options of the work tmpfs (size, inodes, mode, owner).
    pub tmpfs_options: CString,
    /// Files under `private_mount`, with their contents.
    pub private_files: Vec<(CString, Vec<u8>)>,
    /// The host directory used without a mount namespace (created by the child).
    pub host_dir: CString,
    /// The marker written into `host_dir` first.
    pub host_marker: (CString, Vec<u8>),
    /// Files under `host_dir` (same contents as `private_files`, by index).
    pub host_files: Vec<CString>,
}

/// Everything the child needs, prepared (allocated) before the fork.
#[derive(Debug)]
pub(super) struct ChildPlan {
    pub identity: Identity,
    pub isolate_network: bool,
    pub private_root: bool,
    pub view: Vec<ViewOp>,
    pub work: WorkPlan,
    pub cpu_seconds: u64,
    pub address_space_bytes: u64,
    pub max_processes: u64,
    pub max_file_bytes: u64,
    pub max_open_files: u64,
    /// The program, its `argv`, and the environment for each mode.
    pub program: CString,
    pub argv: CStringArray,
    pub env_private: CStringArray,
    pub env_host: CStringArray,
    pub filter: SyscallFilter,
    /// The caller's pid, to notice a parent that died before `PR_SET_PDEATHSIG` took effect.
    pub parent_pid: libc::pid_t,
    /// Write end of the report pipe (close-on-exec).
    pub report_fd: RawFd,
    /// Fail the spawn when the kernel refuses the namespaces of the private root (the report,
    /// flagged [`ISOLATION_REFUSED`], says which), instead of running on the host filesystem.
    pub require_private_root: bool,
    /// Stacks of the namespace's init and of the program's process (see [`confine_child`]).
    pub init_stack: CloneStack,
    pub program_stack: CloneStack,
}

const NETWORK_NAMESPACE: u32 = 1;
const MOUNT_NAMESPACE: u32 = 1 << 1;
const PRIVATE_ROOT: u32 = 1 << 2;
const USER_NAMESPACE: u32 = 1 << 3;
const UID_DROPPED: u32 = 1 << 4;
const PID_NAMESPACE: u32 = 1 << 5;
const IPC_NAMESPACE: u32 = 1 << 6;
const PROC_MOUNTED: u32 = 1 << 7;
const NEW_SESSION: u32 = 1 << 8;
const SECCOMP: u32 = 1 << 9;
const HOST_WORK_DIR: u32 = 1 << 10;
const PROC_HIDES_PIDS: u32 = 1 << 11;
/// The private root was required and the kernel refused its namespaces: the spawn failed.
const ISOLATION_REFUSED: u32 = 1 << 12;
/// The user namespace exists, but the write of this file of its identity map failed (its errno
/// is `user_namespace_errno`): the child is the overflow uid there, and no private root can be
/// built (a tmpfs refuses new files to an unmapped uid).
const SETGROUPS_REFUSED: u32 = 1 << 13;
const UID_MAP_REFUSED: u32 = 1 << 14;
const GID_MAP_REFUSED: u32 = 1 << 15;
/// The effective, permitted, inheritable and ambient capability sets were cleared.
const CAPABILITIES_CLEARED: u32 = 1 << 16;
/// The capability bounding set was emptied (it needs `CAP_SETPCAP`, which root and the owner of
/// a fresh user namespace have): no `execve` can give the program a capability back.
const BOUNDING_SET_EMPTIED: u32 = 1 << 17;

/// What the child managed to do, sent to the parent through a pipe before `exec`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ChildReport {
    /// Bit set of the confinements applied.
    pub flags: u32,
    /// errno of a failed network-namespace `unshare` (0 = none).
    pub network_errno: i32,
    /// errno of a failed mount-namespace `unshare` (0 = none).
    pub mount_errno: i32,
    /// errno of a failed user-namespace `unshare` or, with a flag of [`ID_MAP_REFUSED`], of a
    /// failed write of its identity map (0 = none).
    pub user_namespace_errno: i32,
    /// errno of a failed PID-namespace `unshare` (0 = none).
    pub pid_errno: i32,
    /// errno of a failed IPC-namespace `unshare` (0 = none).
    pub ipc_errno: i32,
    /// errno of a failed `/proc` mount in the private root (0 = none).
    pub proc_errno: i32,
}

const REPORT_LEN: usize = std::mem::size_of::<ChildReport>();

/// Tags of the messages on the report pipe (each message is written in one `write` of less than
/// `PIPE_BUF` bytes, so the two writers never interleave).
const INIT_TAG: u8 = b'I';
const REPORT_TAG: u8 = b'R';
/// The program's process failed before `execve`: an errno follows.
const ERROR_TAG: u8 = b'E';

/// What the report pipe carried.
#[derive(Debug, Default)]
pub(super) struct PipeMessages {
    pub report: Option<ChildReport>,
    pub init: Option<libc::pid_t>,
    /// errno of a confinement step or of `execve` that failed in the program's process.
    pub error: Option<i32>,
}

impl ChildReport {
    fn words(&self) -> [u32; 7] {
        [
            self.flags,
            self.network_errno as u32,
            self.mount_errno as u32,
            self.user_namespace_errno as u32,
            self.pid_errno as u32,
            self.ipc_errno as u32,
            self.proc_errno as u32,
        ]
    }

    fn to_bytes(self) -> [u8; REPORT_LEN] {
        let mut out = [0u8; REPORT_LEN];
        for (i, word) in self.words().iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
        }
        out
    }

    fn from_bytes(bytes: &[u8; REPORT_LEN]) -> Self {
        let word = |i: usize| u32::from_ne_bytes([bytes[i * 4], bytes[i * 4 + 1], bytes[i * 4 + 2], bytes[i * 4 + 3]]);
        Self {
            flags: word(0),
            network_errno: word(1) as i32,
            mount_errno: word(2) as i32,
            user_namespace_errno: word(3) as i32,
            pid_errno: word(4) as i32,
            ipc_errno: word(5) as i32,
            proc_errno: word(6) as i32,
        }
    }

    /// Reads the messages of the report pipe (after the parent closed its write end) until it
    /// closes: the host pid of the PID namespace's init, sent by S (tag [`INIT_TAG`]), the
    /// report, sent by the program's process before `exec` (tag [`REPORT_TAG`]), and the errno
    /// of a failure in that process before `exec` (tag [`ERROR_TAG`]). Each is `None` when it
    /// was not (completely) sent.
    pub(super) fn read_from(mut pipe: File) -> PipeMessages {
        let mut bytes = Vec::with_capacity(2 * (REPORT_LEN + 1));
        let mut buf = [0u8; 64];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
            if bytes.len() > 4 * REPORT_LEN {
                break;
            }
        }
        let mut messages = PipeMessages::default();
        let mut rest = &bytes[..];
        let word = |b: &[u8]| [b[0], b[1], b[2], b[3]];
        while let Some((&tag, body)) = rest.split_first() {
            match tag {
                INIT_TAG if body.len() >= 4 => {
                    messages.init = Some(libc::pid_t::from_ne_bytes(word(body)));
                    rest = &body[4..];
                }
                ERROR_TAG if body.len() >= 4 => {
                    messages.error = Some(i32::from_ne_bytes(word(body)));
                    rest = &body[4..];
                }
                REPORT_TAG if body.len() >= REPORT_LEN => {
                    let mut fixed = [0u8; REPORT_LEN];
                    fixed.copy_from_slice(&body[..REPORT_LEN]);
                    messages.report = Some(Self::from_bytes(&fixed));
                    rest = &body[REPORT_LEN..];
                }
                _ => break,
            }
        }
        messages
    }

    fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }

    /// The child refused to run without the private root the policy requires.
    pub(super) fn refused_isolation(&self) -> bool {
        self.has(ISOLATION_REFUSED)
    }

    /// The file of the user namespace's identity map whose write failed, if one did.
    fn refused_id_map(&self) -> Option<&'static str> {
        [(SETGROUPS_REFUSED, "/proc/self/setgroups"), (UID_MAP_REFUSED, "/proc/self/uid_map"), (GID_MAP_REFUSED, "/proc/self/gid_map")]
            .into_iter()
            .find(|&(flag, _)| self.has(flag))
            .map(|(_, file)| file)
    }

    /// What the kernel refused, for [`Self::refused_isolation`]: the user namespace (not root),
    /// the write of its identity map, or the mount namespace, with its error.
    pub(super) fn refusal(&self) -> String {
        let text = |errno: i32| io::Error::from_raw_os_error(errno).to_string();
        if let Some(file) = self.refused_id_map() {
            format!("the kernel refused the user namespace's identity map, writing {file}: {}", text(self.user_namespace_errno))
        } else if self.user_namespace_errno != 0 {
            format!("the kernel refused a user namespace: {}", text(self.user_namespace_errno))
        } else {
            format!("the kernel refused a mount namespace: {}", text(if self.mount_errno != 0 { self.mount_errno } else { libc::EPERM }))
        }
    }

    /// The child used a host work directory (no private root).
    pub(super) fn used_host_work_dir(&self) -> bool {
        self.has(HOST_WORK_DIR)
    }
}

/// Turns the child's report into the [`Isolation`] the run really got, with a note for each
/// confinement the policy asked for but the run lacks.
pub(super) fn isolation_from(
    report: Option<ChildReport>,
    policy: IsolationPolicy,
    is_root: bool,
    planned_uid: Option<u32>,
) -> Isolation {
    let mut notes = Vec::new();
    let report = report.unwrap_or_else(|| {
        notes.push("the child sent no confinement report; assuming no namespaces".to_string());
        ChildReport::default()
    });
    let sandbox_uid = if report.has(UID_DROPPED) { planned_uid } else { None };
    let errno_text = |errno: i32| io::Error::from_raw_os_error(errno).to_string();
    let why = |errno: i32| if errno != 0 { errno_text(errno) } else { "not attempted".to_string() };
    let id_map = report.refused_id_map();
    if let Some(file) = id_map {
        notes.push(format!(
            "user namespace without an identity map (writing {file}: {}): the program runs as the overflow uid \
             in its namespaces, and no private root could be built",
            errno_text(report.user_namespace_errno)
        ));
    } else if report.user_namespace_errno != 0 {
        notes.push(format!(
            "no user namespace ({}), so no network, mount, PID or IPC namespace either",
            errno_text(report.user_namespace_errno)
        ));
    }
    if policy.network && !report.has(NETWORK_NAMESPACE) {
        notes.push(format!(
            "network namespace unavailable ({}): the child shares the host network (sockets are still refused by the seccomp filter)",
            why(report.network_errno)
        ));
    }
    if policy.private_root && !report.has(PRIVATE_ROOT) {
        let reason = match id_map {
            Some(_) => "the user namespace has no identity map".to_string(),
            None => why(report.mount_errno),
        };
        notes.push(format!(
            "private root unavailable ({reason}): the child sees the host filesystem with its uid's permissions and works in a marked host directory"
        ));
    }
    if !report.has(PID_NAMESPACE) {
        notes.push(format!(
            "PID namespace unavailable ({}): processes that leave the process group are found by uid only",
            why(report.pid_errno)
        ));
    }
    if !report.has(IPC_NAMESPACE) {
        notes.push(format!(
            "IPC namespace unavailable ({}): System V IPC is refused by the seccomp filter only",
            why(report.ipc_errno)
        ));
    }
    if report.has(PRIVATE_ROOT) && !report.has(PROC_MOUNTED) && report.has(PID_NAMESPACE) {
        notes.push(format!("no /proc in the private root ({})", errno_text(report.proc_errno)));
    }
    if report.has(PROC_MOUNTED) && !report.has(PROC_HIDES_PIDS) {
        notes.push(
            "/proc without hidepid (the kernel refused the remount): the program can read the namespace \
             init's command line"
                .to_string(),
        );
    }
    if is_root && sandbox_uid.is_none() {
        notes.push(if report.has(CAPABILITIES_CLEARED) {
            "ran as root (uid 0, no capabilities): RLIMIT_NPROC does not apply to uid 0, and the program may \
             change what root owns wherever it can see it"
                .to_string()
        } else {
            "ran as root: RLIMIT_NPROC does not apply to uid 0 and the child keeps root's capabilities".to_string()
        });
    }
    if report.has(SECCOMP) && !report.has(BOUNDING_SET_EMPTIED) {
        notes.push(
            "capability bounding set not emptied (no CAP_SETPCAP); the program's own capability sets are empty"
                .to_string(),
        );
    }
    if !is_root && !report.has(PID_NAMESPACE) {
        notes.push(
            "not root: RLIMIT_NPROC counts all processes of the caller's uid, and a process that \
             calls setsid() survives the process-group kill (its CPU rlimit still bounds it)"
                .to_string(),
        );
    }
    Isolation {
        network_isolated: report.has(NETWORK_NAMESPACE),
        read_only_root: report.has(PRIVATE_ROOT),
        sandbox_uid,
        user_namespace: report.has(USER_NAMESPACE),
        process_limit_per_run: sandbox_uid.is_some() || report.has(PID_NAMESPACE),
        private_root: report.has(PRIVATE_ROOT),
        pid_namespace: report.has(PID_NAMESPACE),
        ipc_namespace: report.has(IPC_NAMESPACE),
        seccomp: report.has(SECCOMP),
        new_session: report.has(NEW_SESSION),
        no_capabilities: report.has(CAPABILITIES_CLEARED) && report.has(BOUNDING_SET_EMPTIED),
        notes,
    }
}

// ---------------------------------------------------------------------------------------------
// Planning the private root (before the fork)

/// Hops through symbolic links allowed while resolving one declared path (as the kernel's 40).
const MAX_LINK_HOPS: usize = 40;

/// The names of the private work directory in the private root: `/work` itself and `/tmp`, a
/// link to it.
const WORK_AREA_NAMES: [&str; 2] = [PRIVATE_WORK_DIR, "/tmp"];

/// Where host path `path` lies in the work directory when it is under one of its names
/// ([`WORK_AREA_NAMES`]): the rest of the path, relative to the work directory.
fn in_work_area(path: &Path) -> Option<&Path> {
    WORK_AREA_NAMES.iter().find_map(|name| path.strip_prefix(name).ok())
}

/// The layout of the private root for `paths`: for each declared path, every directory and
/// symbolic link on the way to it (links are recreated and followed, so `/bin -> usr/bin`
/// works as on the host) and a read-only bind mount of what it finally names. A path inside an
/// already bound directory is covered by it; a declared path that does not exist is skipped.
/// The device nodes of [`DEVICES`] are always added.
///
/// A path under `/tmp` or `/work` (a temporary directory, a checkout) is placed inside the
/// work directory, after its tmpfs is mounted ([`ViewOp::WorkArea`]): the program's `/tmp` is
/// a link to `/work`, so both still reach the work directory and the path is at its own name.
/// Refused ([`SandboxError::PathConflict`]): a path that would replace the work directory
/// itself (`/tmp`, `/work`, or a link there on the host), and a `/tmp/X` and a `/work/X` that
/// would meet at the same place.
pub(super) fn plan_view(paths: &[PathBuf]) -> Result<Vec<ViewOp>, SandboxError> {
    let mut view = ViewPlan::default();
    for path in paths {
        if !path.is_absolute() {
            return Err(SandboxError::InvalidPath(path.display().to_string()));
        }
        view.declared = path.clone();
        view.add(path, 0);
    }
    if let Some(conflict) = view.conflicts.first() {
        return Err(SandboxError::PathConflict(conflict.clone()));
    }
    view.into_ops()
}

/// The top-level names that the declared paths take in the work directory (`X` of `/tmp/X`
/// or `/work/X`): a job file of the same name would meet them.
pub(super) fn work_area_names(view: &[ViewOp]) -> BTreeSet<std::ffi::OsString> {
    let work = Path::new(ROOT_MOUNT_POINT).join(PRIVATE_WORK_DIR.trim_start_matches('/'));
    let placed = |path: &CString| {
        let path = Path::new(std::ffi::OsStr::from_bytes(path.as_bytes()));
        path.strip_prefix(&work).ok()?.components().next().map(|c| c.as_os_str().to_os_string())
    };
    view.iter()
        .skip_while(|op| **op != ViewOp::WorkArea)
        .filter_map(|op| match op {
            ViewOp::Dir(path) => placed(path),
            ViewOp::Symlink { link, .. } => placed(link),
            ViewOp::BindDir { target, .. } | ViewOp::BindFile { target, .. } => placed(target),
            ViewOp::WorkArea => None,
        })
        .collect()
}

#[derive(Default)]
struct ViewPlan {
    dirs: BTreeSet<PathBuf>,
    links: BTreeMap<PathBuf, PathBuf>,
    bind_dirs: BTreeSet<PathBuf>,
    bind_files: BTreeSet<PathBuf>,
    /// The declared path being added (for the messages of `conflicts`).
    declared: PathBuf,
    /// Declared paths that would replace the work directory.
    conflicts: Vec<String>,
}

impl ViewPlan {
    fn covered(&self, path: &Path) -> bool {
        path.ancestors().any(|a| self.bind_dirs.contains(a)) || self.bind_files.contains(path)
    }

    /// Notes a conflict when a link or bind would be at one of the work directory's names.
    fn check_placement(&mut self, path: &Path) {
        if WORK_AREA_NAMES.iter().any(|name| path == Path::new(name)) {
            self.conflicts.push(format!(
                "the declared path {} would replace {}, the program's private work directory (its /tmp is a link to /work): declare paths inside it instead",
                self.declared.display(),
                path.display()
            ));
        }
    }

    fn add(&mut self, path: &Path, hops: usize) {
        if hops > MAX_LINK_HOPS {
            return;
        }
        let parts: Vec<Component<'_>> = path.components().collect();
        let mut current = PathBuf::from("/");
        for (i, part) in parts.iter().enumerate() {
            let next = match part {
                Component::RootDir | Component::CurDir | Component::Prefix(_) => continue,
                Component::ParentDir => {
                    current.pop();
                    continue;
                }
                Component::Normal(name) => current.join(name),
            };
            let rest: PathBuf = parts[i + 1..].iter().collect();
            if self.covered(&next) {
                // Inside a bound directory: present as on the host, unless a link there points
                // outside what is bound.
                if let Ok(real) = std::fs::canonicalize(next.join(&rest))
                    && !self.covered(&real)
                {
                    self.add(&real, hops + 1);
                }
                return;
            }
            let Ok(meta) = std::fs::symlink_metadata(&next) else { return };
            if meta.file_type().is_symlink() {
                let Ok(target) = std::fs::read_link(&next) else { return };
                self.check_placement(&next);
                self.links.insert(next.clone(), target.clone());
                let resolved = if target.is_absolute() { target } else { current.join(target) };
                self.add(&resolved.join(rest), hops + 1);
                return;
            }
            let last = parts[i + 1..].iter().all(|c| matches!(c, Component::CurDir));
            if last {
                if meta.is_dir() || meta.is_file() {
                    self.check_placement(&next);
                }
                if meta.is_dir() {
                    self.bind_dirs.insert(next);
                } else if meta.is_file() {
                    self.bind_files.insert(next);
                }
                return;
            }
            if !meta.is_dir() {
                return;
            }
            self.dirs.insert(next.clone());
            current = next;
        }
    }

    fn into_ops(self) -> Result<Vec<ViewOp>, SandboxError> {
        let root = Path::new(ROOT_MOUNT_POINT);
        let work = root.join(PRIVATE_WORK_DIR.trim_start_matches('/'));
        // A path under /tmp or /work goes into the work directory; any other at its own name.
        let inside = |p: &Path| match in_work_area(p) {
            Some(rest) => work.join(rest),
            None => root.join(p.strip_prefix("/").unwrap_or(p)),
        };
        let c = |p: &Path| cstring_path(p);
        let mut dirs: BTreeSet<PathBuf> = self.dirs.clone();
        // Mount points of directory binds, and the parents of file binds and links.
        dirs.extend(self.bind_dirs.iter().cloned());
        for p in self.bind_files.iter().chain(self.links.keys()) {
            if let Some(parent) = p.parent() {
                dirs.extend(parent.ancestors().filter(|a| *a != Path::new("/")).map(Path::to_path_buf));
            }
        }
        dirs.insert(PathBuf::from("/dev"));
        dirs.insert(PathBuf::from("/proc"));
        // The work directory's own names are made by the link and the tmpfs mount.
        dirs.retain(|d| in_work_area(d).is_none_or(|rest| !rest.as_os_str().is_empty()));
        self.check_aliases(&dirs)?;

        // Everything outside the work directory, then its tmpfs, then what goes inside it.
        let mut ops = Vec::new();
        for in_work in [false, true] {
            let here = |p: &&PathBuf| in_work_area(p).is_some() == in_work;
            if in_work {
                ops.push(ViewOp::WorkArea);
            }
            for dir in dirs.iter().filter(here) {
                // A directory that is also a recreated link stays a link.
                if !self.links.contains_key(dir) && !self.bind_files.contains(dir) {
                    ops.push(ViewOp::Dir(c(&inside(dir))?));
                }
            }
            for (link, target) in self.links.iter().filter(|(link, _)| here(link)) {
                ops.push(ViewOp::Symlink { link: c(&inside(link))?, target: c(target)? });
            }
            if !in_work {
                ops.push(ViewOp::Symlink { link: c(&root.join("tmp"))?, target: c(Path::new("work"))? });
                ops.push(ViewOp::Symlink { link: c(&inside(Path::new("/dev/fd")))?, target: c(Path::new("/proc/self/fd"))? });
            }
            // Outer binds first; a bind nested in a bound directory is dropped (already visible).
            for dir in self.bind_dirs.iter().filter(here) {
                let nested = dir.ancestors().skip(1).any(|a| self.bind_dirs.contains(a));
                if !nested {
                    ops.push(ViewOp::BindDir { source: c(dir)?, target: c(&inside(dir))? });
                }
            }
            for file in self.bind_files.iter().filter(here) {
                let nested = file.ancestors().skip(1).any(|a| self.bind_dirs.contains(a));
                if !nested {
                    ops.push(ViewOp::BindFile { source: c(file)?, target: c(&inside(file))?, writable: false });
                }
            }
            if !in_work {
                for device in DEVICES {
                    let path = Path::new(device);
                    if path.exists() {
                        ops.push(ViewOp::BindFile { source: c(path)?, target: c(&inside(path))?, writable: true });
                    }
                }
            }
        }
        Ok(ops)
    }

    /// Refuses a `/tmp/X` and a `/work/X` that would meet in the work directory (where `/tmp` is
    /// `/work`): a link or bind of one side at, or above, anything of the other side. Two
    /// directories on the way to other paths merge harmlessly.
    fn check_aliases(&self, dirs: &BTreeSet<PathBuf>) -> Result<(), SandboxError> {
        let placed: Vec<(&Path, &Path, bool)> = dirs
            .iter()
            .map(|d| (d, false))
            .chain(self.links.keys().chain(&self.bind_dirs).chain(&self.bind_files).map(|p| (p, true)))
            .filter_map(|(host, whole)| {
                let rest = in_work_area(host)?;
                (!rest.as_os_str().is_empty()).then_some((host.as_path(), rest, whole))
            })
            .collect();
        for &(host, rest, whole) in &placed {
            for &(other, other_rest, _) in &placed {
                let other_side = in_work_area(other).is_some() && host.components().nth(1) != other.components().nth(1);
                if whole && other_side && other_rest.starts_with(rest) {
                    return Err(SandboxError::PathConflict(format!(
                        "the declared paths reach {} and {}, which would meet at {} in the sandbox (its /tmp is a link to /work)",
                        host.display(),
                        other.display(),
                        Path::new(PRIVATE_WORK_DIR).join(other_rest).display()
                    )));
                }
            }
        }
        Ok(())
    }
}

pub(super) fn cstring_path(path: &Path) -> Result<CString, SandboxError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| SandboxError::NulByte(path.display().to_string()))
}

// ---------------------------------------------------------------------------------------------
// System calls (after the fork)

/// `struct mount_attr` of `<linux/mount.h>` (`MOUNT_ATTR_SIZE_VER0` = 32 bytes).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `MOUNT_ATTR_RDONLY`, `MOUNT_ATTR_NOSUID`, `MOUNT_ATTR_NODEV`, `MOUNT_ATTR_NOEXEC` of
/// `<linux/mount.h>`.
const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
const MOUNT_ATTR_NOEXEC: u64 = 0x0000_0008;

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL)
}

/// Whether the kernel has `mount_setattr` (Linux 5.12), the only way to make a recursive bind
/// read-only all the way down: probed with arguments it refuses (`EBADF`/`EINVAL`), `ENOSYS`
/// where it is missing. Async-signal-safe.
fn has_mount_setattr() -> bool {
    // SAFETY: an invalid descriptor and null pointers: the kernel validates and refuses them.
    let rc = unsafe { libc::syscall(libc::SYS_mount_setattr, -1, std::ptr::null::<c_char>(), 0, std::ptr::null::<MountAttr>(), 0) };
    !(rc < 0 && errno() == libc::ENOSYS)
}

/// Sets mount attributes on the mount at `path` (and below it with `recursive`); falls back to
/// a bind remount (one mount, read-only and `nosuid`/`nodev`) on kernels without
/// `mount_setattr` — which is why a directory is bound recursively only where that call exists
/// (see [`ViewOp::BindDir`] in `confine_child`).
///
/// # Safety
/// `path` must be a valid C string; async-signal-safe.
unsafe fn restrict_mount(path: &CStr, set: u64, recursive: bool) -> Result<(), i32> {
    let attr = MountAttr { attr_set: set, attr_clr: 0, propagation: 0, userns_fd: 0 };
    let flags = if recursive { libc::AT_RECURSIVE as libc::c_uint } else { 0 };
    // SAFETY: valid C string; `attr` is a valid struct of the declared size.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    if errno() != libc::ENOSYS {
        return Err(errno());
    }
    let mut ms = libc::MS_BIND | libc::MS_REMOUNT;
    if set & MOUNT_ATTR_RDONLY != 0 {
        ms |= libc::MS_RDONLY;
    }
    if set & MOUNT_ATTR_NOSUID != 0 {
        ms |= libc::MS_NOSUID;
    }
    if set & MOUNT_ATTR_NODEV != 0 {
        ms |= libc::MS_NODEV;
    }
    if set & MOUNT_ATTR_NOEXEC != 0 {
        ms |= libc::MS_NOEXEC;
    }
    // SAFETY: valid C string and null pointers where the kernel accepts them.
    if unsafe { libc::mount(std::ptr::null(), path.as_ptr(), std::ptr::null(), ms, std::ptr::null()) } != 0 {
        return Err(errno());
    }
    Ok(())
}

/// `mkdir(path, mode)`, where an existing entry is fine.
///
/// # Safety
/// Async-signal-safe; valid C string.
unsafe fn make_dir(path: &CStr, mode: libc::mode_t) -> Result<(), i32> {
    // SAFETY: valid C string.
    if unsafe { libc::mkdir(path.as_ptr(), mode) } != 0 && errno() != libc::EEXIST {
        return Err(errno());
    }
    Ok(())
}

/// Creates `path` with `contents` (exclusively), owned by `owner` when given.
///
/// # Safety
/// Async-signal-safe; valid C string and buffer.
unsafe fn create_file(path: &CStr, contents: &[u8], mode: libc::mode_t, owner: Option<(u32, u32)>) -> Result<(), i32> {
    // SAFETY: valid C string and buffer; the descriptor is closed on every path.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, mode);
        if fd < 0 {
            return Err(errno());
        }
        let mut written = 0;
        while written < contents.len() {
            let n = libc::write(fd, contents[written..].as_ptr().cast(), contents.len() - written);
            if n < 0 {
                if errno() == libc::EINTR {
                    continue;
                }
                let e = errno();
                libc::close(fd);
                return Err(e);
            }
            written += n as usize;
        }
        if let Some((uid, gid)) = owner
            && libc::fchown(fd, uid, gid) != 0
        {
            let e = errno();
            libc::close(fd);
            return Err(e);
        }
        libc::close(fd);
    }
    Ok(())
}

/// Writes `contents` to the existing file at `path` with raw system calls.
///
/// # Safety
/// Async-signal-safe; valid C strings.
unsafe fn write_file(path: &CStr, contents: &[u8]) -> Result<(), i32> {
    // SAFETY: valid C string and buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(errno());
        }
        let written = libc::write(fd, contents.as_ptr().cast(), contents.len());
        let result = if written == contents.len() as isize { Ok(()) } else { Err(errno()) };
        libc::close(fd);
        result
    }
}

/// Step 5: the private root. Returns the errno of the first failure.
///
/// # Safety
/// Only in the child between fork and exec, inside a new mount namespace.
unsafe fn build_private_root(plan: &ChildPlan, owner: Option<(u32, u32)>, report: &mut ChildReport) -> Result<(), i32> {
    let null = std::ptr::null();
    let root_c = ROOT_MOUNT_POINT_C;
    // SAFETY: valid C strings and null pointers where the kernel accepts them; every buffer
    // was prepared before the fork and is owned by `plan`.
    unsafe {
        if libc::mount(null, c"/".as_ptr(), null, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) != 0 {
            return Err(errno());
        }
        if libc::mount(
            c"tmpfs".as_ptr(),
            root_c.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            ROOT_TMPFS_OPTIONS.as_ptr().cast(),
        ) != 0
        {
            return Err(errno());
        }
        for op in &plan.view {
            match op {
                ViewOp::Dir(path) => make_dir(path, 0o755)?,
                ViewOp::Symlink { link, target } => {
                    if libc::symlink(target.as_ptr(), link.as_ptr()) != 0 && errno() != libc::EEXIST {
                        return Err(errno());
                    }
                }
                ViewOp::BindDir { source, target } => {
                    make_dir(target, 0o755)?;
                    // Before Linux 5.12 a bind remount makes only the top mount read-only: the
                    // mounts below a recursive bind would stay writable, so they are left out
                    // (bound without `MS_REC`, they show as empty directories).
                    let recursive = has_mount_setattr();
                    let flags = if recursive { libc::MS_BIND | libc::MS_REC } else { libc::MS_BIND };
                    if libc::mount(source.as_ptr(), target.as_ptr(), null, flags, std::ptr::null()) != 0 {
                        return Err(errno());
                    }
                    restrict_mount(target, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, recursive)?;
                }
                ViewOp::BindFile { source, target, writable } => {
                    let fd = libc::open(target.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC, 0o644);
                    if fd < 0 {
                        return Err(errno());
                    }
                    libc::close(fd);
                    if libc::mount(source.as_ptr(), target.as_ptr(), null, libc::MS_BIND, std::ptr::null()) != 0 {
                        return Err(errno());
                    }
                    let set = if *writable {
                        MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC
                    } else {
                        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
                    };
                    restrict_mount(target, set, false)?;
                }
                ViewOp::WorkArea => {
                    // The work directory: a tmpfs of its own, limited in bytes and entries.
                    make_dir(&plan.work.private_mount, 0o700)?;
                    if libc::mount(
                        c"tmpfs".as_ptr(),
                        plan.work.private_mount.as_ptr(),
                        c"tmpfs".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV,
                        plan.work.tmpfs_options.as_ptr().cast(),
                    ) != 0
                    {
                        return Err(errno());
                    }
                    for (path, contents) in &plan.work.private_files {
                        create_file(path, contents, 0o644, owner)?;
                    }
                }
            }
        }
        // A fresh /proc shows only this PID namespace; without one it would show the host's.
        // Then remounted `hidepid=2`: only the processes the program may trace, so not the
        // namespace's init (a copy of the caller, whose command line every /proc would otherwise
        // show). A remount, because before Linux 5.8 a namespace's proc superblock exists from
        // its first process on and a mount reuses it without reading options (it would succeed
        // and hide nothing); a remount parses them on every kernel. Refused: noted.
        if report.has(PID_NAMESPACE) {
            let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
            if libc::mount(c"proc".as_ptr(), ROOT_PROC_C.as_ptr(), c"proc".as_ptr(), flags, std::ptr::null()) == 0 {
                report.flags |= PROC_MOUNTED;
                if libc::mount(
                    std::ptr::null(),
                    ROOT_PROC_C.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REMOUNT | flags,
                    c"hidepid=2".as_ptr().cast(),
                ) == 0
                {
                    report.flags |= PROC_HIDES_PIDS;
                }
            } else {
                report.proc_errno = errno();
            }
        }
        // Enter the new root and detach the host's tree.
        if libc::chdir(root_c.as_ptr()) != 0 {
            return Err(errno());
        }
        if libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) != 0 {
            return Err(errno());
        }
        if libc::umount2(c".".as_ptr(), libc::MNT_DETACH) != 0 {
            return Err(errno());
        }
        if libc::chdir(c"/".as_ptr()) != 0 {
            return Err(errno());
        }
        restrict_mount(c"/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, false)?;
    }
    Ok(())
}

/// Step 5 without a mount namespace: the marked host work directory with the job's files.
///
/// # Safety
/// Async-signal-safe; only in the child.
unsafe fn build_host_work_dir(plan: &ChildPlan, owner: Option<(u32, u32)>) -> Result<(), i32> {
    let work = &plan.work;
    // SAFETY: valid C strings prepared before the fork.
    unsafe {
        if libc::mkdir(work.host_dir.as_ptr(), 0o700) != 0 {
            return Err(errno());
        }
        create_file(&work.host_marker.0, &work.host_marker.1, 0o600, None)?;
        for (path, (_, contents)) in work.host_files.iter().zip(&work.private_files) {
            create_file(path, contents, 0o644, owner)?;
        }
        if let Some((uid, gid)) = owner
            && libc::chown(work.host_dir.as_ptr(), uid, gid) != 0
        {
            return Err(errno());
        }
    }
    Ok(())
}

/// Sets `resource` to `value` (soft) and `hard` (hard), both clamped to the current hard limit
/// so an unprivileged caller never fails by asking for more than it has.
///
/// # Safety
/// Async-signal-safe.
unsafe fn set_limit(resource: RlimitResource, value: u64, hard: u64) -> io::Result<()> {
    // SAFETY: plain-data structs passed by valid pointers.
    unsafe {
        let mut current = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(resource, &mut current) != 0 {
            return Err(io::Error::last_os_error());
        }
        let max = current.rlim_max;
        let wanted = libc::rlimit { rlim_cur: value.min(max).min(hard), rlim_max: hard.min(max) };
        if libc::setrlimit(resource, &wanted) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
type RlimitResource = libc::__rlimit_resource_t;
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
type RlimitResource = libc::c_int;

fn os_error(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// Ends the calling process the way `status` (a wait status) says: the same exit code, or the
/// same signal raised on itself (so the parent's `wait` sees what the program's did).
///
/// # Safety
/// Async-signal-safe; never returns. Not for pid 1 of a namespace, which cannot signal itself.
unsafe fn mirror(status: libc::c_int) -> ! {
    // SAFETY: raw, async-signal-safe system calls; the signal set is plain data.
    unsafe {
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        let sig = libc::WTERMSIG(status);
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), sig);
        libc::_exit(128 + sig);
    }
}

/// Closes every descriptor but `keep` (`close_range`; on kernels before 5.9, which lack it, one
/// `close` per descriptor up to `highest`, the highest the caller had open, plus 64 for the
/// few the child opened itself, which take the lowest free numbers).
///
/// # Safety
/// Async-signal-safe.
unsafe fn close_all_but(keep: RawFd, highest: RawFd) {
    // SAFETY: close_range and close only close descriptors of this process.
    unsafe {
        let below = keep <= 0 || libc::syscall(libc::SYS_close_range, 0 as libc::c_uint, (keep - 1) as libc::c_uint, 0 as libc::c_uint) == 0;
        let above = libc::syscall(libc::SYS_close_range, (keep + 1) as libc::c_uint, libc::c_uint::MAX, 0 as libc::c_uint) == 0;
        if !(below && above) {
            for fd in (0..=highest.max(keep).saturating_add(64)).filter(|&fd| fd != keep) {
                libc::close(fd);
            }
        }
    }
}

/// The life of S once the namespace's init runs: hold only the status pipe, wait for init,
/// and end as the program ended (its wait status comes through the pipe; without one, as init
/// ended). `wait4` adds the waited-for descendants' resource usage to S's, so the parent's
/// accounting covers the program.
///
/// # Safety
/// Only in S after the fork of init; never returns.
unsafe fn supervise_init(init: libc::pid_t, status_read: RawFd, report_fd: RawFd, highest_fd: RawFd) -> ! {
    // SAFETY: raw, async-signal-safe system calls on plain data.
    unsafe {
        // The parent watches init's exit to know the whole namespace is gone.
        let mut message = [INIT_TAG, 0, 0, 0, 0];
        message[1..].copy_from_slice(&init.to_ne_bytes());
        libc::write(report_fd, message.as_ptr().cast(), message.len());
        close_all_but(status_read, highest_fd);
        // `errno` is not read here: the init and the program's process share this memory, and
        // with it the thread-local errno, until the program's `execve`.
        let mut status: libc::c_int = 0;
        let mut failures = 0;
        loop {
            let rc = libc::waitpid(init, &mut status, libc::__WALL);
            if rc == init {
                break;
            }
            failures += 1;
            if failures > 1000 {
                libc::_exit(125);
            }
        }
        let mut program_status = [0u8; 4];
        if libc::read(status_read, program_status.as_mut_ptr().cast(), 4) == 4 {
            status = libc::c_int::from_ne_bytes(program_status);
        }
        mirror(status);
    }
}

/// The life of the namespace's init (pid 1) once the program runs: reap every process of the
/// namespace (orphans are re-parented to it), and when the program itself ends, hand its wait
/// status to S and exit — which makes the kernel kill whatever is left in the namespace.
///
/// # Safety
/// Only in init after the fork of the program; never returns.
unsafe fn run_init(program: libc::pid_t, status_write: RawFd, highest_fd: RawFd) -> ! {
    // SAFETY: raw, async-signal-safe system calls on plain data.
    unsafe {
        close_all_but(status_write, highest_fd);
        loop {
            let mut status: libc::c_int = 0;
            let rc = libc::waitpid(-1, &mut status, 0);
            if rc == program {
                let bytes = status.to_ne_bytes();
                libc::write(status_write, bytes.as_ptr().cast(), bytes.len());
                libc::_exit(0);
            }
            if rc < 0 && errno() != libc::EINTR {
                libc::_exit(125);
            }
        }
    }
}

/// Applies the plan in the child. See the module documentation for the steps and which ones
/// are mandatory. Returns only on failure (success ends in `execve`).
///
/// # Safety
/// Must only run in a freshly forked child before `exec` (as a `pre_exec` hook): it changes the
/// calling process's session, namespaces, limits and identity, and may fork.
pub(super) unsafe fn confine_child(plan: &ChildPlan) -> io::Result<()> {
    let mut report = ChildReport::default();
    let zero = 0 as libc::c_ulong;
    // SAFETY: every call below is a raw, async-signal-safe system call on memory that was
    // allocated before the fork and stays valid (it is owned by `plan`).
    unsafe {
        // Where `close_range(CLOSE_RANGE_CLOEXEC)` is missing (Linux < 5.11), descriptors are
        // marked or closed one by one up to the highest open: read here, after the fork, from
        // this process's own table (a copy of the caller's at the fork, which no other thread
        // of the caller can add to any more) while the host's /proc is still in view.
        let highest_fd = if close_range_marks_close_on_exec() { 0 } else { highest_open_fd() };

        // 1–2. Session, death signal, no core dumps.
        if libc::setsid() < 0 {
            return Err(io::Error::last_os_error());
        }
        report.flags |= NEW_SESSION;
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, zero, zero, zero);
        if libc::getppid() != plan.parent_pid {
            libc::_exit(126);
        }
        // 1, not 0: a limit of 0 stops file dumps only, while a piped `core_pattern` (apport,
        // systemd-coredump) still runs its root helper on the process's memory; the kernel
        // refuses both at exactly 1 (`do_coredump`), and 1 byte is less than any core file.
        set_limit(libc::RLIMIT_CORE, 1, 1)?;
        // Under memory pressure the kernel's OOM killer takes the sandbox first, never the
        // caller (a child inherits its parent's score). Raising it needs no privilege; best
        // effort where `/proc` is missing.
        let oom = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if oom >= 0 {
            libc::write(oom, b"1000".as_ptr().cast(), 4);
            libc::close(oom);
        }

        // 3. Namespaces.
        let mut mount_namespace = false;
        match &plan.identity {
            Identity::UserNamespace { uid_map, gid_map } => {
                let mut flags = libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWIPC;
                if plan.isolate_network {
                    flags |= libc::CLONE_NEWNET;
                }
                if plan.private_root {
                    flags |= libc::CLONE_NEWNS;
                }
                if libc::unshare(flags) == 0 {
                    report.flags |= USER_NAMESPACE | PID_NAMESPACE | IPC_NAMESPACE;
                    if plan.isolate_network {
                        report.flags |= NETWORK_NAMESPACE;
                    }
                    // The namespaces exist whatever happens next. Without the identity map the
                    // child is the overflow uid in them, and a tmpfs refuses it new files, so
                    // there is no private root: refused below unless the policy allows that.
                    let mapped = write_file(c"/proc/self/setgroups", b"deny")
                        .map_err(|e| (e, SETGROUPS_REFUSED))
                        .and_then(|()| write_file(c"/proc/self/uid_map", uid_map.as_bytes()).map_err(|e| (e, UID_MAP_REFUSED)))
                        .and_then(|()| write_file(c"/proc/self/gid_map", gid_map.as_bytes()).map_err(|e| (e, GID_MAP_REFUSED)));
                    match mapped {
                        Ok(()) => mount_namespace = plan.private_root,
                        Err((e, step)) => {
                            report.user_namespace_errno = e;
                            report.flags |= step;
                        }
                    }
                } else {
                    report.user_namespace_errno = errno();
                }
            }
            Identity::DropTo { .. } | Identity::Keep => {
                if libc::unshare(libc::CLONE_NEWPID) == 0 {
                    report.flags |= PID_NAMESPACE;
                } else {
                    report.pid_errno = errno();
                }
                if libc::unshare(libc::CLONE_NEWIPC) == 0 {
                    report.flags |= IPC_NAMESPACE;
                } else {
                    report.ipc_errno = errno();
                }
                if plan.isolate_network {
                    if libc::unshare(libc::CLONE_NEWNET) == 0 {
                        report.flags |= NETWORK_NAMESPACE;
                    } else {
                        report.network_errno = errno();
                    }
                }
                if plan.private_root {
                    if libc::unshare(libc::CLONE_NEWNS) == 0 {
                        mount_namespace = true;
                    } else {
                        report.mount_errno = errno();
                    }
                }
            }
        }

        // Without the mount namespace (or, not root, the user namespace it needs, with its
        // identity map) there is no private root: hostile code would see the host filesystem.
        // Unless the policy allows that, nothing runs; the report tells the parent why.
        if plan.require_private_root && !mount_namespace {
            report.flags |= ISOLATION_REFUSED;
            let mut message = [REPORT_TAG; REPORT_LEN + 1];
            message[1..].copy_from_slice(&report.to_bytes());
            libc::write(plan.report_fd, message.as_ptr().cast(), message.len());
            let errno = [report.user_namespace_errno, report.mount_errno].into_iter().find(|&e| e != 0).unwrap_or(libc::EPERM);
            return Err(io::Error::from_raw_os_error(errno));
        }

        // 4. With a PID namespace: S starts the namespace's init, which starts the program's
        //    process (not pid 1 itself, so signals such as SIGXFSZ keep their default effect
        //    on it). Both are `clone(CLONE_VM)`s on stacks prepared before the fork, so neither
        //    copies the page tables of S (a copy of the caller, whose memory may be large); the
        //    program's process is also `CLONE_VFORK`, so the init waits until it has exec'd.
        if report.has(PID_NAMESPACE) {
            let mut pipe = [0 as libc::c_int; 2];
            if libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return Err(io::Error::last_os_error());
            }
            let start = ProgramStart { plan, report, mount_namespace, status_read: pipe[0], status_write: pipe[1], highest_fd };
            let arg = &start as *const ProgramStart<'_> as *mut libc::c_void;
            let init = libc::clone(init_main, plan.init_stack.top(), libc::CLONE_VM | libc::SIGCHLD, arg);
            if init < 0 {
                return Err(io::Error::last_os_error());
            }
            // `start` stays valid: S never returns from here.
            supervise_init(init, pipe[0], plan.report_fd, highest_fd);
        }
        confine_program(plan, report, mount_namespace, highest_fd)
    }
}

/// What the namespace's init and the program's process read from S's stack frame (which
/// outlives them: S never returns from [`confine_child`] once they exist).
struct ProgramStart<'a> {
    plan: &'a ChildPlan,
    report: ChildReport,
    mount_namespace: bool,
    status_read: RawFd,
    status_write: RawFd,
    /// The highest descriptor S had open after the fork (0 where `close_range` marks them all).
    highest_fd: RawFd,
}

/// Sets every signal disposition back to the default. The namespace's init is a copy of the
/// caller that never execs, so it would keep the caller's signal handlers (std's, an async
/// runtime's SIGTERM/SIGINT ones) — and a namespace's init receives from inside its namespace
/// only the signals it has a handler for: with the defaults, a guest's `kill(1, …)` is dropped by
/// the kernel and runs none of the caller's code. Done before the program's process exists, so
/// no guest can signal init while it still has them (and the program inherits no `SIG_IGN`).
///
/// The kernel's own call, since the C library refuses its two reserved signals (its thread
/// cancellation and set*id broadcasts, which a single-threaded init never uses). An all-zero
/// `struct sigaction` is SIG_DFL with no flags and an empty mask in every architecture's layout
/// (24 or 32 bytes); SIGKILL and SIGSTOP refuse the change (EINVAL). 64 is Linux's highest
/// signal.
///
/// # Safety
/// Only in the namespace's init, before it starts the program.
unsafe fn reset_signal_dispositions() {
    let default = [0u64; 4];
    for sig in 1..=64 {
        // SAFETY: the kernel reads 8 bytes of mask from a zeroed buffer we own; no old action.
        unsafe {
            libc::syscall(libc::SYS_rt_sigaction, sig, default.as_ptr(), std::ptr::null_mut::<u64>(), 8usize);
        }
    }
}

/// The namespace's init (pid 1): resets its signal dispositions, starts the program's process,
/// then reaps (see [`run_init`]).
extern "C" fn init_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points to the `ProgramStart` in S's frame, valid for our whole life; only
    // raw, async-signal-safe system calls follow.
    unsafe {
        reset_signal_dispositions();
        let start = enter(arg, |start| start.status_read);
        let program = libc::clone(
            program_main,
            start.plan.program_stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            arg,
        );
        if program < 0 {
            report_error(start.plan.report_fd, errno());
            libc::_exit(127);
        }
        run_init(program, start.status_write, start.highest_fd);
    }
}

/// The program's process: confines itself and execs the program; on failure, reports the errno
/// to the parent (std's own error pipe is out of reach here) and exits.
extern "C" fn program_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: as in `init_main`; the init is suspended (`CLONE_VFORK`) until we exec or exit.
    unsafe {
        let start = enter(arg, |start| start.status_write);
        let failure = confine_program(start.plan, start.report, start.mount_namespace, start.highest_fd);
        let code = failure.err().and_then(|e| e.raw_os_error()).unwrap_or(libc::EINVAL);
        report_error(start.plan.report_fd, code);
        libc::_exit(127);
    }
}

/// The first steps of a process started by `clone` with a [`ProgramStart`]: close the end of
/// the status pipe it does not use and die with its parent.
///
/// # Safety
/// `arg` must point to a live `ProgramStart`; async-signal-safe.
unsafe fn enter<'a>(arg: *mut libc::c_void, unused_end: impl Fn(&ProgramStart<'a>) -> RawFd) -> &'a ProgramStart<'a> {
    // SAFETY: forwarded from the caller.
    unsafe {
        let start = &*(arg as *const ProgramStart<'a>);
        let zero = 0 as libc::c_ulong;
        libc::close(unused_end(start));
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, zero, zero, zero);
        start
    }
}

/// Sends `errno` as an [`ERROR_TAG`] message.
///
/// # Safety
/// Async-signal-safe.
unsafe fn report_error(report_fd: RawFd, errno: i32) {
    let mut message = [ERROR_TAG, 0, 0, 0, 0];
    message[1..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: a write of a local buffer.
    unsafe {
        libc::write(report_fd, message.as_ptr().cast(), message.len());
    }
}

/// Steps 5–10 in the program's process. Returns only on failure (success ends in `execve`).
///
/// # Safety
/// Only in the program's process before `exec`.
unsafe fn confine_program(plan: &ChildPlan, mut report: ChildReport, mount_namespace: bool, highest_fd: RawFd) -> io::Result<()> {
    let zero = 0 as libc::c_ulong;
    // SAFETY: every call below is a raw, async-signal-safe system call on memory that was
    // allocated before the fork and stays valid (it is owned by `plan`).
    unsafe {
        // 5. The file system the program sees.
        let owner = match plan.identity {
            Identity::DropTo { uid, gid } => Some((uid, gid)),
            _ => None,
        };
        let private = if mount_namespace {
            report.flags |= MOUNT_NAMESPACE;
            build_private_root(plan, owner, &mut report).map_err(os_error)?;
            report.flags |= PRIVATE_ROOT;
            true
        } else {
            build_host_work_dir(plan, owner).map_err(os_error)?;
            report.flags |= HOST_WORK_DIR;
            false
        };

        // 6. Working directory.
        let work_dir: &CStr = if private { c"/work" } else { &plan.work.host_dir };
        if libc::chdir(work_dir.as_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }

        // 7. Resource limits.
        set_limit(libc::RLIMIT_CPU, plan.cpu_seconds, plan.cpu_seconds.saturating_add(1))?;
        set_limit(libc::RLIMIT_AS, plan.address_space_bytes, plan.address_space_bytes)?;
        set_limit(libc::RLIMIT_NPROC, plan.max_processes, plan.max_processes)?;
        set_limit(libc::RLIMIT_FSIZE, plan.max_file_bytes, plan.max_file_bytes)?;
        set_limit(libc::RLIMIT_NOFILE, plan.max_open_files, plan.max_open_files)?;
        // Nothing the program inherits lets it outrank the host: no real-time scheduling
        // (SCHED_FIFO would starve the machine), no raised nice priority, no locked memory
        // (pages out of the kernel's reach).
        set_limit(libc::RLIMIT_RTPRIO, 0, 0)?;
        set_limit(libc::RLIMIT_NICE, 0, 0)?;
        set_limit(libc::RLIMIT_MEMLOCK, 0, 0)?;

        // 8. Identity, and no capability left. The ambient set goes first (EINVAL before Linux
        // 4.3, where there is none), then the bounding set, while CAP_SETPCAP is still held:
        // with it empty, no `execve` gives a capability back, not even to uid 0.
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, zero, zero, zero);
        if empty_bounding_set() {
            report.flags |= BOUNDING_SET_EMPTIED;
        }
        if let Identity::DropTo { uid, gid } = plan.identity {
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
            {
                return Err(io::Error::last_os_error());
            }
            report.flags |= UID_DROPPED;
        }
        clear_capabilities()?;
        report.flags |= CAPABILITIES_CLEARED;
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, zero, zero, zero) != 0 {
            return Err(io::Error::last_os_error());
        }
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, zero, zero, zero);

        // 9. Descriptors and report (sent before the filter, which the report cannot fail).
        // A descriptor the caller inherited without close-on-exec (a make jobserver pipe, a
        // wrapper's fd 3) must not reach the program, also on kernels without the flag.
        if libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC) != 0 {
            mark_close_on_exec(3, highest_fd.saturating_add(64));
        }
        report.flags |= SECCOMP;
        let mut message = [REPORT_TAG; REPORT_LEN + 1];
        message[1..].copy_from_slice(&report.to_bytes());
        libc::write(plan.report_fd, message.as_ptr().cast(), message.len());

        // 10. Filter, then the program.
        plan.filter.install()?;
        let env = if private { &plan.env_private } else { &plan.env_host };
        libc::execve(plan.program.as_ptr(), plan.argv.as_ptr(), env.as_ptr());
    }
    Err(io::Error::last_os_error())
}

/// Drop every capability from the bounding set, up to the last one the kernel knows. False when
/// the kernel refused a drop (no `CAP_SETPCAP`: a caller that is neither root with it nor in a
/// user namespace of its own); nothing allocates (async-signal-safe). A failed drop is told
/// from the end of the capability numbers by `PR_CAPBSET_READ` (−1 only for a number the kernel
/// does not know), not by `errno`: this process shares its memory, `errno` included, with the
/// one that started it (`CLONE_VM`), which runs meanwhile.
///
/// # Safety
/// Changes only this process's capability bounding set.
unsafe fn empty_bounding_set() -> bool {
    let zero = 0 as libc::c_ulong;
    for cap in 0..64 as libc::c_ulong {
        // SAFETY: a prctl on plain integers.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, zero, zero, zero) } != 0 {
            // SAFETY: as above.
            return cap > 0 && unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap, zero, zero, zero) } < 0;
        }
    }
    true
}

/// `capset` version 3's header and one of its two data words (`linux/capability.h`).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Clear this thread's effective, permitted and inheritable capability sets (which clears the
/// ambient set too). Always allowed: a process may give up what it has.
///
/// # Safety
/// Changes only this thread's capabilities.
unsafe fn clear_capabilities() -> io::Result<()> {
    let header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let data = [CapData { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: capset reads the header and two data words, all alive on this stack.
    if unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Mark descriptors `first..=last` close-on-exec, each one that is open (async-signal-safe:
/// `fcntl` only).
///
/// # Safety
/// Changes only descriptor flags of this process; call where no other code relies on a
/// descriptor in the range staying open across `exec`.
pub(super) unsafe fn mark_close_on_exec(first: RawFd, last: RawFd) {
    for fd in first..=last {
        // SAFETY: F_GETFD / F_SETFD on a number that may not be open: EBADF, nothing else.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// Whether the kernel marks descriptors close-on-exec with `close_range` (Linux 5.11): probed
/// on an empty range at the top of the descriptor space, which it accepts and leaves alone
/// (`EINVAL` before 5.11, `ENOSYS` before 5.9). Async-signal-safe.
fn close_range_marks_close_on_exec() -> bool {
    let top = libc::c_uint::MAX;
    // SAFETY: a range no descriptor is in; the flag only marks.
    unsafe { libc::syscall(libc::SYS_close_range, top, top, libc::CLOSE_RANGE_CLOEXEC) == 0 }
}

/// The highest descriptor number this process has open: read from `/proc/self/fd` with raw
/// `open`/`getdents64`/`close` into a buffer on the stack, so it is async-signal-safe (no
/// allocation, no lock: safe after the fork of a multithreaded caller); where `/proc` is
/// missing, below the soft `RLIMIT_NOFILE` (at most 2^20).
///
/// # Safety
/// Async-signal-safe; opens (and closes) one descriptor.
pub(super) unsafe fn highest_open_fd() -> RawFd {
    // SAFETY: raw system calls on a local buffer; the descriptor is closed on every path.
    unsafe {
        let dir = libc::open(c"/proc/self/fd".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC);
        if dir >= 0 {
            let mut buf = [0u8; 4096];
            let mut highest: RawFd = dir;
            let listed = loop {
                let n = libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len());
                if n <= 0 {
                    break n == 0;
                }
                // `struct linux_dirent64`: ino (8), off (8), reclen (2), type (1), name (NUL-ended).
                let mut at = 0usize;
                while at + 19 < n as usize {
                    let reclen = usize::from(u16::from_ne_bytes([buf[at + 16], buf[at + 17]]));
                    // A record holds its 19-byte header and a name: anything shorter (never
                    // from the kernel) ends the listing rather than slicing backwards.
                    if reclen < 20 || at + reclen > n as usize {
                        break;
                    }
                    let name = buf[at + 19..at + reclen].split(|&b| b == 0).next().unwrap_or(&[]);
                    if !name.is_empty() && name.iter().all(u8::is_ascii_digit) && name.len() < 10 {
                        let fd = name.iter().fold(0 as RawFd, |fd, &d| fd * 10 + RawFd::from(d - b'0'));
                        highest = highest.max(fd);
                    }
                    at += reclen;
                }
            };
            libc::close(dir);
            if listed {
                return highest;
            }
        }
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        let got = libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        if got == 0 { RawFd::try_from(limit.rlim_cur.min(1 << 20)).unwrap_or(1 << 20) } else { 1 << 20 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_setattr_is_found_where_the_kernel_has_it() {
        // Linux 5.12 or later (where this project's CI runs): the probe must not take the
        // non-recursive fallback there.
        // SAFETY: utsname is plain data; uname fills it.
        let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::uname(&mut uts) }, 0);
        let release: String = uts.release.iter().take_while(|&&c| c != 0).map(|&c| c as u8 as char).collect();
        let mut parts = release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse::<u32>().ok());
        let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        if version >= (5, 12) {
            assert!(has_mount_setattr(), "kernel {release}");
        }
    }

    #[test]
    fn the_close_on_exec_fallback_marks_every_open_descriptor_in_range() {
        // A pipe without close-on-exec, as a caller may inherit one.
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe writes two descriptors into the array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let cloexec = |fd: RawFd| unsafe { libc::fcntl(fd, libc::F_GETFD) } & libc::FD_CLOEXEC != 0;
        // And a copy far above every other descriptor (dup2 leaves it without the flag).
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit fills the struct it is given.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
        let high = RawFd::try_from(limit.rlim_cur.saturating_sub(1).min(900)).expect("a number");
        // SAFETY: dup2 onto a number this test binary does not use otherwise.
        assert_eq!(unsafe { libc::dup2(fds[0], high) }, high);
        assert!(!cloexec(fds[0]) && !cloexec(fds[1]) && !cloexec(high));
        // SAFETY: opens and closes one descriptor of the test's own.
        let highest = unsafe { highest_open_fd() };
        assert!(highest >= high.max(fds[1]), "{highest} < {high}");
        // SAFETY: only flags change; the test owns the pipe.
        unsafe { mark_close_on_exec(fds[0], highest) };
        assert!(cloexec(fds[0]) && cloexec(fds[1]) && cloexec(high));
        // SAFETY: the test's own descriptors.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
            libc::close(high);
        }
    }

    #[test]
    fn report_round_trips_through_bytes() {
        let report = ChildReport {
            flags: NETWORK_NAMESPACE | UID_DROPPED | PID_NAMESPACE,
            network_errno: 0,
            mount_errno: 1,
            user_namespace_errno: 38,
            pid_errno: 0,
            ipc_errno: 22,
            proc_errno: 13,
        };
        assert_eq!(ChildReport::from_bytes(&report.to_bytes()), report);
    }

    /// What a run as root with every confinement granted reports.
    const EVERY_CONFINEMENT: u32 = NETWORK_NAMESPACE
        | MOUNT_NAMESPACE
        | PRIVATE_ROOT
        | UID_DROPPED
        | PID_NAMESPACE
        | IPC_NAMESPACE
        | PROC_MOUNTED
        | PROC_HIDES_PIDS
        | SECCOMP
        | NEW_SESSION
        | CAPABILITIES_CLEARED
        | BOUNDING_SET_EMPTIED;

    #[test]
    fn missing_confinements_are_noted() {
        let policy = IsolationPolicy::default();
        let report = ChildReport {
            flags: UID_DROPPED
                | PID_NAMESPACE
                | IPC_NAMESPACE
                | SECCOMP
                | NEW_SESSION
                | HOST_WORK_DIR
                | CAPABILITIES_CLEARED
                | BOUNDING_SET_EMPTIED,
            network_errno: libc::EPERM,
            mount_errno: libc::ENOSYS,
            ..ChildReport::default()
        };
        let isolation = isolation_from(Some(report), policy, true, Some(7));
        assert!(!isolation.network_isolated);
        assert!(!isolation.private_root);
        assert_eq!(isolation.sandbox_uid, Some(7));
        assert!(isolation.process_limit_per_run);
        assert_eq!(isolation.notes.len(), 2, "{:?}", isolation.notes);
        assert!(isolation.notes[0].contains("network namespace unavailable"));
        assert!(isolation.notes[1].contains("private root unavailable"));
        assert!(!isolation.is_complete());
    }

    #[test]
    fn complete_report_has_no_notes() {
        let report = ChildReport {
            flags: EVERY_CONFINEMENT,
            ..ChildReport::default()
        };
        let isolation = isolation_from(Some(report), IsolationPolicy::default(), true, Some(9));
        assert!(isolation.is_complete(), "{:?}", isolation.notes);
        assert!(isolation.pid_namespace && isolation.ipc_namespace && isolation.seccomp && isolation.new_session);
        assert!(isolation.no_capabilities);
        assert!(isolation.summary().contains("network: isolated"));
        assert!(isolation.summary().contains("capabilities: none"));
    }

    #[test]
    fn a_bounding_set_left_full_is_noted_and_not_called_no_capabilities() {
        let report = ChildReport {
            flags: (EVERY_CONFINEMENT & !UID_DROPPED & !BOUNDING_SET_EMPTIED) | USER_NAMESPACE,
            ..ChildReport::default()
        };
        let isolation = isolation_from(Some(report), IsolationPolicy::default(), false, None);
        assert!(!isolation.no_capabilities);
        assert_eq!(isolation.notes.len(), 1, "{:?}", isolation.notes);
        assert!(isolation.notes[0].contains("bounding set not emptied"), "{:?}", isolation.notes);
        assert!(isolation.summary().contains("capabilities: SOME MAY REMAIN"));
        // Root without CAP_SETPCAP, keeping uid 0: its own sets are empty, which the notes say
        // (and none says it keeps root's capabilities).
        let policy = IsolationPolicy { drop_privileges: false, ..IsolationPolicy::default() };
        let isolation = isolation_from(Some(report), policy, true, None);
        assert!(isolation.notes.iter().any(|n| n.contains("ran as root (uid 0, no capabilities)")), "{:?}", isolation.notes);
        assert!(!isolation.notes.iter().any(|n| n.contains("keeps root's capabilities")), "{:?}", isolation.notes);
    }

    #[test]
    fn root_without_uid_drop_is_flagged() {
        let policy = IsolationPolicy { drop_privileges: false, ..IsolationPolicy::default() };
        let report = ChildReport { flags: NETWORK_NAMESPACE | PRIVATE_ROOT | PID_NAMESPACE | IPC_NAMESPACE, ..ChildReport::default() };
        let isolation = isolation_from(Some(report), policy, true, None);
        assert!(isolation.notes.iter().any(|n| n.contains("RLIMIT_NPROC does not apply to uid 0")));
        assert!(isolation.notes.iter().any(|n| n.contains("keeps root's capabilities")), "{:?}", isolation.notes);
        let without = ChildReport { flags: report.flags | CAPABILITIES_CLEARED | BOUNDING_SET_EMPTIED, ..report };
        let isolation = isolation_from(Some(without), policy, true, None);
        assert!(isolation.notes.iter().any(|n| n.contains("ran as root (uid 0, no capabilities)")), "{:?}", isolation.notes);
        assert!(isolation_from(None, policy, true, None).notes[0].contains("no confinement report"));
    }

    /// Where host path `h` is in the root tmpfs before `pivot_root`: under the work directory
    /// for a path under `/tmp` or `/work` (where temporary directories usually are).
    fn guest(h: &Path) -> String {
        match in_work_area(h) {
            Some(rest) => format!("{ROOT_MOUNT_POINT}{PRIVATE_WORK_DIR}/{}", rest.display()),
            None => format!("{ROOT_MOUNT_POINT}{}", h.display()),
        }
    }

    fn ops_text(ops: &[ViewOp]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                ViewOp::Dir(p) => format!("dir {}", p.to_string_lossy()),
                ViewOp::Symlink { link, target } => {
                    format!("link {} -> {}", link.to_string_lossy(), target.to_string_lossy())
                }
                ViewOp::BindDir { source, target } => {
                    format!("bind-dir {} at {}", source.to_string_lossy(), target.to_string_lossy())
                }
                ViewOp::BindFile { source, target, writable } => format!(
                    "bind-file {} at {}{}",
                    source.to_string_lossy(),
                    target.to_string_lossy(),
                    if *writable { " rw" } else { "" }
                ),
                ViewOp::WorkArea => "work area".to_string(),
            })
            .collect()
    }

    #[test]
    fn view_recreates_links_and_binds_what_they_name() {
        let host = tempfile::tempdir().expect("tempdir");
        let h = host.path();
        std::fs::create_dir_all(h.join("usr/lib/python")).expect("mkdir");
        std::fs::create_dir_all(h.join("usr/bin")).expect("mkdir");
        std::fs::write(h.join("usr/bin/python3.11"), b"elf").expect("write");
        std::os::unix::fs::symlink("python3.11", h.join("usr/bin/python3")).expect("link");
        std::os::unix::fs::symlink("usr/lib", h.join("lib")).expect("link");
        std::fs::write(h.join("secret"), b"no").expect("write");

        let ops = plan_view(&[h.join("usr/bin/python3"), h.join("lib/python"), h.join("missing")]).expect("plans");
        let text = ops_text(&ops);
        let root = ROOT_MOUNT_POINT;
        let (hs, g) = (h.display().to_string(), guest(h));
        assert!(text.contains(&format!("link {g}/usr/bin/python3 -> python3.11")), "{text:#?}");
        assert!(text.contains(&format!("link {g}/lib -> usr/lib")), "{text:#?}");
        assert!(text.contains(&format!("bind-file {hs}/usr/bin/python3.11 at {g}/usr/bin/python3.11")), "{text:#?}");
        assert!(text.contains(&format!("bind-dir {hs}/usr/lib/python at {g}/usr/lib/python")), "{text:#?}");
        assert!(!text.iter().any(|t| t.contains("secret") || t.contains("missing")), "{text:#?}");
        assert!(text.contains(&format!("link {root}/tmp -> work")));
        assert!(text.iter().any(|t| t.starts_with("bind-file /dev/null at") && t.ends_with(" rw")));
        // Directories come before what is placed in them.
        let first_bind = text.iter().position(|t| t.starts_with("bind") && t.contains(&hs)).expect("a bind");
        assert!(text[..first_bind].iter().any(|t| t == &format!("dir {g}/usr/bin")), "{text:#?}");
    }

    #[test]
    fn paths_under_tmp_are_placed_in_the_work_directory_after_its_tmpfs() {
        let host = tempfile::tempdir_in("/tmp").expect("tempdir under /tmp");
        let h = host.path();
        std::fs::create_dir_all(h.join("repo/src")).expect("mkdir");
        std::fs::write(h.join("notes.txt"), b"n").expect("write");
        let ops = plan_view(&[PathBuf::from("/usr"), h.join("repo/src"), h.join("notes.txt")]).expect("plans");
        let text = ops_text(&ops);
        let root = ROOT_MOUNT_POINT;
        let rel = h.strip_prefix("/tmp").expect("under /tmp").display().to_string();
        // /tmp stays the link to the work directory: no directory is made in its place.
        assert!(text.contains(&format!("link {root}/tmp -> work")), "{text:#?}");
        assert!(!text.iter().any(|t| t == &format!("dir {root}/tmp") || t.starts_with(&format!("dir {root}/tmp/"))), "{text:#?}");
        let area = text.iter().position(|t| t == "work area").expect("the work area op");
        assert_eq!(text.iter().filter(|t| *t == "work area").count(), 1);
        for placed in [
            format!("dir {root}/work/{rel}/repo"),
            format!("bind-dir {}/repo/src at {root}/work/{rel}/repo/src", h.display()),
            format!("bind-file {}/notes.txt at {root}/work/{rel}/notes.txt", h.display()),
        ] {
            let at = text.iter().position(|t| *t == placed).unwrap_or_else(|| panic!("{placed}: {text:#?}"));
            assert!(at > area, "{placed} before the work directory's tmpfs: {text:#?}");
        }
        assert!(text[..area].contains(&format!("bind-dir /usr at {root}/usr")), "{text:#?}");
        let top = rel.trim_start_matches('/').split('/').next().expect("a name").to_string();
        assert_eq!(work_area_names(&ops), [std::ffi::OsString::from(top)].into_iter().collect());
        assert!(work_area_names(&plan_view(&[PathBuf::from("/usr")]).expect("plans")).is_empty());
    }

    #[test]
    fn paths_that_would_replace_or_alias_in_the_work_directory_are_refused() {
        let refused = |result: Result<Vec<ViewOp>, SandboxError>| match result {
            Err(SandboxError::PathConflict(why)) => why,
            other => panic!("not refused: {other:?}"),
        };
        let why = refused(plan_view(&[PathBuf::from("/usr"), PathBuf::from("/tmp")]));
        assert!(why.contains("declared path /tmp would replace /tmp"), "{why}");
        // /tmp/a and /work/a/b meet at /work/a/b (the host need not have them: planned by hand).
        let plan = |binds: &[&str]| ViewPlan { bind_dirs: binds.iter().map(PathBuf::from).collect(), ..ViewPlan::default() };
        let why = refused(plan(&["/tmp/a", "/work/a/b"]).into_ops());
        assert!(why.contains("/tmp/a and /work/a/b") && why.contains("meet at /work/a/b"), "{why}");
        refused(plan(&["/work/a", "/tmp/a"]).into_ops());
        // Siblings under a directory of the same name merge.
        let text = ops_text(&plan(&["/tmp/a/x", "/work/a/y"]).into_ops().expect("plans"));
        let root = ROOT_MOUNT_POINT;
        assert!(text.contains(&format!("bind-dir /tmp/a/x at {root}/work/a/x")), "{text:#?}");
        assert!(text.contains(&format!("bind-dir /work/a/y at {root}/work/a/y")), "{text:#?}");
    }

    #[test]
    fn view_drops_binds_nested_in_bound_directories() {
        let host = tempfile::tempdir().expect("tempdir");
        let h = host.path();
        std::fs::create_dir_all(h.join("usr/lib/x")).expect("mkdir");
        let ops = plan_view(&[h.join("usr/lib/x"), h.join("usr")]).expect("plans");
        let binds: Vec<String> = ops_text(&ops).into_iter().filter(|t| t.starts_with("bind-dir")).collect();
        assert_eq!(binds, [format!("bind-dir {}/usr at {}/usr", h.display(), guest(h))]);
        assert!(matches!(plan_view(&[PathBuf::from("relative")]), Err(SandboxError::InvalidPath(_))));
    }

    #[test]
    fn exec_arrays_are_null_terminated() {
        let array = CStringArray::new(vec![c"a".to_owned(), c"bc".to_owned()]);
        assert_eq!(array.len(), 2);
        // SAFETY: the array holds three pointers, the last one null.
        unsafe {
            assert_eq!(CStr::from_ptr(*array.as_ptr()), c"a");
            assert!((*array.as_ptr().add(2)).is_null());
        }
    }
}
