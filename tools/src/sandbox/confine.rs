//! The confinement a sandboxed child applies to itself between `fork` and `exec`.
//!
//! Owns the child-side plan ([`ChildPlan`]), the system calls that carry it out
//! ([`confine_child`]) and the report the child sends back so the parent knows which
//! confinements the kernel granted ([`ChildReport`]). Everything the child runs is restricted
//! to async-signal-safe system calls on memory prepared before the fork: no allocation, no
//! locks, no Rust I/O objects. Must not depend on anything outside this crate's sandbox module.
//!
//! Order (each step needs the privileges the next one gives up):
//! 1. namespaces: as root `unshare(CLONE_NEWNET)` and `unshare(CLONE_NEWNS)`; otherwise one
//!    `unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS)` followed by an identity uid/gid map
//!    (`setgroups` denied first, as the kernel requires for unprivileged gid maps);
//! 2. in the new mount namespace: all mounts private (so nothing propagates to the host), the
//!    work directory bind-mounted onto itself, every mount read-only recursively, then the
//!    work directory's bind mount writable again;
//! 3. `chdir` into the work directory (after the bind mount, so the cwd is the writable one);
//! 4. rlimits: CPU, address space, processes, file size, core size 0;
//! 5. identity: drop supplementary groups, gid and uid (raw system calls, so glibc's
//!    all-threads `setxid` machinery is never involved), then `PR_SET_NO_NEW_PRIVS` and
//!    `PR_SET_PDEATHSIG = SIGKILL` (set after the uid change, which would clear it);
//! 6. every descriptor above stderr marked close-on-exec; the report written to the parent.
//!
//! Steps 1–2 are best effort (reported); steps 3–5 are mandatory: if one fails, the spawn fails
//! rather than run untrusted code with weaker limits than asked for.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::RawFd;

use super::{Isolation, IsolationPolicy};

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

/// Everything the child needs, prepared (allocated) before the fork.
#[derive(Debug)]
pub(super) struct ChildPlan {
    pub work_dir: CString,
    pub identity: Identity,
    pub isolate_network: bool,
    pub read_only_root: bool,
    pub cpu_seconds: u64,
    pub address_space_bytes: u64,
    pub max_processes: u64,
    pub max_file_bytes: u64,
    /// Write end of the report pipe (close-on-exec).
    pub report_fd: RawFd,
}

const NETWORK_NAMESPACE: u32 = 1;
const MOUNT_NAMESPACE: u32 = 1 << 1;
const READ_ONLY_ROOT: u32 = 1 << 2;
const USER_NAMESPACE: u32 = 1 << 3;
const UID_DROPPED: u32 = 1 << 4;

/// What the child managed to do, sent to the parent through a pipe before `exec`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ChildReport {
    /// Bit set of the confinements applied.
    pub flags: u32,
    /// errno of a failed network-namespace `unshare` (0 = none).
    pub network_errno: i32,
    /// errno of a failed mount-namespace `unshare` or read-only remount (0 = none).
    pub mount_errno: i32,
    /// errno of a failed user-namespace `unshare` or identity map (0 = none).
    pub user_namespace_errno: i32,
}

const REPORT_LEN: usize = std::mem::size_of::<ChildReport>();

impl ChildReport {
    fn to_bytes(self) -> [u8; REPORT_LEN] {
        let mut out = [0u8; REPORT_LEN];
        out[0..4].copy_from_slice(&self.flags.to_ne_bytes());
        out[4..8].copy_from_slice(&self.network_errno.to_ne_bytes());
        out[8..12].copy_from_slice(&self.mount_errno.to_ne_bytes());
        out[12..16].copy_from_slice(&self.user_namespace_errno.to_ne_bytes());
        out
    }

    fn from_bytes(bytes: &[u8; REPORT_LEN]) -> Self {
        let word = |i: usize| [bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]];
        Self {
            flags: u32::from_ne_bytes(word(0)),
            network_errno: i32::from_ne_bytes(word(4)),
            mount_errno: i32::from_ne_bytes(word(8)),
            user_namespace_errno: i32::from_ne_bytes(word(12)),
        }
    }

    /// Reads the report from the pipe's read end (after the parent closed its write end).
    /// `None` when the child wrote no complete report.
    pub(super) fn read_from(mut pipe: File) -> Option<Self> {
        let mut bytes = [0u8; REPORT_LEN];
        let mut filled = 0;
        while filled < REPORT_LEN {
            match pipe.read(&mut bytes[filled..]) {
                Ok(0) => return None,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        Some(Self::from_bytes(&bytes))
    }

    fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
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
    if report.user_namespace_errno != 0 {
        notes.push(format!(
            "no user namespace ({}), so no network or mount namespace either",
            errno_text(report.user_namespace_errno)
        ));
    }
    if policy.network && !report.has(NETWORK_NAMESPACE) {
        let why = if report.network_errno != 0 { errno_text(report.network_errno) } else { "not attempted".into() };
        notes.push(format!("network namespace unavailable ({why}): the child shares the host network"));
    }
    if policy.read_only_root && !report.has(READ_ONLY_ROOT) {
        let why = if report.mount_errno != 0 { errno_text(report.mount_errno) } else { "not attempted".into() };
        notes.push(format!(
            "read-only root unavailable ({why}): the child can write wherever its uid may, e.g. /tmp"
        ));
    }
    if is_root && sandbox_uid.is_none() {
        notes.push(
            "ran as root: RLIMIT_NPROC does not apply to uid 0 and the child keeps root's capabilities"
                .to_string(),
        );
    }
    if !is_root {
        notes.push(
            "not root: RLIMIT_NPROC counts all processes of the caller's uid, and a process that \
             calls setsid() survives the process-group kill (its CPU rlimit still bounds it)"
                .to_string(),
        );
    }
    Isolation {
        network_isolated: report.has(NETWORK_NAMESPACE),
        read_only_root: report.has(READ_ONLY_ROOT),
        sandbox_uid,
        user_namespace: report.has(USER_NAMESPACE),
        process_limit_per_run: sandbox_uid.is_some(),
        notes,
    }
}

/// `struct mount_attr` of `<linux/mount.h>` (`MOUNT_ATTR_SIZE_VER0` = 32 bytes).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `MOUNT_ATTR_RDONLY` of `<linux/mount.h>`.
const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL)
}

/// `mount_setattr(AT_FDCWD, path, flags, attr)`.
///
/// # Safety
/// `path` must be a valid C string; async-signal-safe.
unsafe fn mount_setattr(path: &CStr, flags: libc::c_uint, attr: &MountAttr) -> libc::c_long {
    // SAFETY: forwarded from the caller; `attr` is a valid struct of the declared size.
    unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    }
}

/// Step 2: every mount read-only except a bind mount of the work directory. Returns the errno
/// of the first failure.
///
/// # Safety
/// Only in the child between fork and exec, inside a new mount namespace.
unsafe fn make_root_read_only(work_dir: &CString) -> Result<(), i32> {
    let null = std::ptr::null();
    // SAFETY: valid C strings and null pointers where the kernel accepts them.
    unsafe {
        if libc::mount(null, c"/".as_ptr(), null, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) != 0 {
            return Err(errno());
        }
        if libc::mount(work_dir.as_ptr(), work_dir.as_ptr(), null, libc::MS_BIND, std::ptr::null()) != 0 {
            return Err(errno());
        }
        let read_only = MountAttr { attr_set: MOUNT_ATTR_RDONLY, attr_clr: 0, propagation: 0, userns_fd: 0 };
        if mount_setattr(c"/", libc::AT_RECURSIVE as libc::c_uint, &read_only) != 0 {
            return Err(errno());
        }
        let writable = MountAttr { attr_set: 0, attr_clr: MOUNT_ATTR_RDONLY, propagation: 0, userns_fd: 0 };
        if mount_setattr(work_dir, 0, &writable) != 0 {
            return Err(errno());
        }
    }
    Ok(())
}

/// Writes `contents` to the file at `path` with raw system calls.
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

/// Applies the plan in the child. See the module documentation for the order and which steps
/// are mandatory.
///
/// # Safety
/// Must only run in a freshly forked child before `exec` (as a `pre_exec` hook): it changes the
/// calling process's namespaces, limits and identity.
pub(super) unsafe fn confine_child(plan: &ChildPlan) -> io::Result<()> {
    let mut report = ChildReport::default();
    // SAFETY: every call below is a raw, async-signal-safe system call on memory that was
    // allocated before the fork and stays valid (it is owned by `plan`).
    unsafe {
        // 1. Namespaces.
        let mut mount_namespace = false;
        match &plan.identity {
            Identity::UserNamespace { uid_map, gid_map } => {
                let mut flags = libc::CLONE_NEWUSER;
                if plan.isolate_network {
                    flags |= libc::CLONE_NEWNET;
                }
                if plan.read_only_root {
                    flags |= libc::CLONE_NEWNS;
                }
                if libc::unshare(flags) == 0 {
                    report.flags |= USER_NAMESPACE;
                    let mapped = write_file(c"/proc/self/setgroups", b"deny")
                        .and_then(|()| write_file(c"/proc/self/uid_map", uid_map.as_bytes()))
                        .and_then(|()| write_file(c"/proc/self/gid_map", gid_map.as_bytes()));
                    if let Err(e) = mapped {
                        report.user_namespace_errno = e;
                    }
                    if plan.isolate_network {
                        report.flags |= NETWORK_NAMESPACE;
                    }
                    mount_namespace = plan.read_only_root;
                } else {
                    report.user_namespace_errno = errno();
                }
            }
            Identity::DropTo { .. } | Identity::Keep => {
                if plan.isolate_network {
                    if libc::unshare(libc::CLONE_NEWNET) == 0 {
                        report.flags |= NETWORK_NAMESPACE;
                    } else {
                        report.network_errno = errno();
                    }
                }
                if plan.read_only_root {
                    if libc::unshare(libc::CLONE_NEWNS) == 0 {
                        mount_namespace = true;
                    } else {
                        report.mount_errno = errno();
                    }
                }
            }
        }

        // 2. Read-only root.
        if mount_namespace {
            report.flags |= MOUNT_NAMESPACE;
            match make_root_read_only(&plan.work_dir) {
                Ok(()) => report.flags |= READ_ONLY_ROOT,
                Err(e) => report.mount_errno = e,
            }
        }

        // 3. Working directory.
        if libc::chdir(plan.work_dir.as_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }

        // 4. Resource limits.
        set_limit(libc::RLIMIT_CPU, plan.cpu_seconds, plan.cpu_seconds.saturating_add(1))?;
        set_limit(libc::RLIMIT_AS, plan.address_space_bytes, plan.address_space_bytes)?;
        set_limit(libc::RLIMIT_NPROC, plan.max_processes, plan.max_processes)?;
        set_limit(libc::RLIMIT_FSIZE, plan.max_file_bytes, plan.max_file_bytes)?;
        set_limit(libc::RLIMIT_CORE, 0, 0)?;

        // 5. Identity.
        if let Identity::DropTo { uid, gid } = plan.identity {
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
            {
                return Err(io::Error::last_os_error());
            }
            report.flags |= UID_DROPPED;
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong) != 0 {
            return Err(io::Error::last_os_error());
        }
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong);

        // 6. Descriptors and report.
        libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC);
        let bytes = report.to_bytes();
        libc::write(plan.report_fd, bytes.as_ptr().cast(), bytes.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_round_trips_through_bytes() {
        let report =
            ChildReport { flags: NETWORK_NAMESPACE | UID_DROPPED, network_errno: 0, mount_errno: 1, user_namespace_errno: 38 };
        assert_eq!(ChildReport::from_bytes(&report.to_bytes()), report);
    }

    #[test]
    fn missing_confinements_are_noted() {
        let policy = IsolationPolicy::default();
        let report = ChildReport { flags: UID_DROPPED, network_errno: libc::EPERM, mount_errno: libc::ENOSYS, user_namespace_errno: 0 };
        let isolation = isolation_from(Some(report), policy, true, Some(7));
        assert!(!isolation.network_isolated);
        assert!(!isolation.read_only_root);
        assert_eq!(isolation.sandbox_uid, Some(7));
        assert!(isolation.process_limit_per_run);
        assert_eq!(isolation.notes.len(), 2, "{:?}", isolation.notes);
        assert!(isolation.notes[0].contains("network namespace unavailable"));
        assert!(isolation.notes[1].contains("read-only root unavailable"));
        assert!(!isolation.is_complete());
    }

    #[test]
    fn complete_report_has_no_notes() {
        let report = ChildReport {
            flags: NETWORK_NAMESPACE | MOUNT_NAMESPACE | READ_ONLY_ROOT | UID_DROPPED,
            ..ChildReport::default()
        };
        let isolation = isolation_from(Some(report), IsolationPolicy::default(), true, Some(9));
        assert!(isolation.is_complete(), "{:?}", isolation.notes);
        assert!(isolation.summary().contains("network: isolated"));
    }

    #[test]
    fn root_without_uid_drop_is_flagged() {
        let policy = IsolationPolicy { drop_privileges: false, ..IsolationPolicy::default() };
        let report = ChildReport { flags: NETWORK_NAMESPACE | READ_ONLY_ROOT, ..ChildReport::default() };
        let isolation = isolation_from(Some(report), policy, true, None);
        assert!(isolation.notes.iter().any(|n| n.contains("RLIMIT_NPROC does not apply to uid 0")));
        assert!(isolation_from(None, policy, true, None).notes[0].contains("no confinement report"));
    }
}
