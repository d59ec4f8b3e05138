//! The seccomp filter of the process sandbox: which system calls a sandboxed program may not
//! make, and what happens when it tries.
//!
//! Owns the rule lists and their compilation to BPF with `seccompiler` ([`SyscallFilter`],
//! built in the parent before the fork, installed by the child as its last step before
//! `execve`, so it binds the program and everything it starts). Must not depend on anything
//! outside this crate's sandbox module.
//!
//! Four programs from the rule lists and, on x86_64, the x32 guard, all installed (the kernel
//! runs every one and the most severe verdict wins: a kill over any error, an error over an
//! allow; no two error verdicts meet: the error lists share no call, but for `fcntl`, where the
//! deny list's command and the no-op list's are disjoint):
//!
//! * **kill** (`SECCOMP_RET_KILL_PROCESS`, the program dies of `SIGSYS`, reported as
//!   [`super::LimitHit::Syscall`]): kernel attack surface no test needs — `ptrace`,
//!   `process_vm_readv/writev`, `bpf`, `userfaultfd`, `perf_event_open`, `keyctl`, `add_key`,
//!   `request_key`, the mount family (`mount`, `umount2`, `pivot_root`, `chroot`, `open_tree`,
//!   `open_tree_attr`, `move_mount`, `fsopen`, `fsconfig`, `fsmount`, `fspick`,
//!   `mount_setattr`, `statmount`, `listmount`), namespace
//!   changes (`unshare`, `setns`, and `clone` with any `CLONE_NEW*` flag), `io_uring_*` (whose
//!   operations would bypass this filter), module and kexec loading, `iopl`/`ioperm`,
//!   `swapon`/`swapoff`, `reboot`, `acct`, `quotactl`, `name_to_handle_at`,
//!   `open_by_handle_at`, `lookup_dcookie`.
//! * **deny** (`EPERM`, the program sees an ordinary error): terminal injection
//!   (`ioctl(TIOCSTI)`, `ioctl(TIOCLINUX)`), every `socket` and `socketpair` (unix sockets
//!   included, which a network namespace does not cover), System V IPC (`shm*`, `msg*`,
//!   `sem*`) and POSIX message queues (`mq_*`: without an IPC namespace a queue outlives the
//!   run on the host), anonymous memory files (`memfd_create`, `memfd_secret`: their pages count against
//!   no rlimit — not `RLIMIT_AS`, each file only against `RLIMIT_FSIZE` — so 250 descriptors
//!   of 16 MiB files held 4 GiB of host memory), pipe buffers resized (`fcntl(F_SETPIPE_SZ)`:
//!   a pipe's buffer is kernel memory outside `RLIMIT_AS`, up to `pipe-max-size` (1 MiB) each
//!   and `pipe-user-pages-soft` (64 MiB of 4 KiB pages) per uid; at the 64 KiB default, and a
//!   pipe kept alive by one descriptor, a process's 256 descriptors hold at most 16 MiB — a job
//!   of several processes (the `shell` tool's up to 64) can still reach the per-uid limit with
//!   default pipes, which only a memory cgroup would bound), `vmsplice` (pages handed to a pipe
//!   by reference), and — for jobs that declare no children —
//!   `fork`, `vfork` and every `clone` without `CLONE_THREAD`.
//! * **enosys** (`ENOSYS`): `clone3`, whose flags live in memory a filter cannot read; libc
//!   falls back to `clone`, which the rules above can inspect.
//! * **no-op** (returns 0 without acting): file locks — `flock`, and `fcntl` with `F_SETLK`,
//!   `F_SETLKW`, `F_OFD_SETLK`, `F_OFD_SETLKW` — and leases (`fcntl` `F_SETLEASE`). A lock needs no write access, so a program
//!   could lock a host file bound read-only (a checkout's `target/.cargo-lock`, a sqlite
//!   database) and hold the host's own processes at "waiting for file lock" until its call
//!   ends; the filter cannot tell a host file's descriptor from a work file's, so every lock
//!   succeeds and holds nothing. (Locks between the processes of one run — a shell tool's
//!   children — therefore exclude nothing; a run's work directory is its own.)
//!
//! * **x32** (x86_64 only, `SECCOMP_RET_KILL_PROCESS`): a system call number with the x32 bit
//!   (`0x4000_0000`) set. seccompiler's programs check the architecture tag, which x32 calls
//!   share with x86_64, and then exact numbers, so on a kernel built with x32 support
//!   `syscall(0x4000_0000 | nr)` would reach every call the lists above name; a hand-written
//!   program, installed first, kills the caller instead.
//!
//! Everything else is allowed: the filter is a deny list on top of the namespaces, the private
//! root, the dropped uid and the rlimits, not the only wall.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

/// The x32 ABI's bit in a system call number (`__X32_SYSCALL_BIT`).
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// A program that kills the caller of any x86_64-tagged system call whose number has the x32
/// bit set, and allows everything else (the other programs decide): load the architecture; not
/// x86_64 → allow; load the number; at least the x32 bit → kill; else allow.
#[cfg(target_arch = "x86_64")]
fn x32_guard() -> BpfProgram {
    use seccompiler::sock_filter;
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    const RET_KILL_PROCESS: u32 = 0x8000_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;
    // Offsets in `struct seccomp_data`: `nr` at 0, `arch` at 4.
    let op = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        op(LD_W_ABS, 0, 0, 4),
        op(JEQ_K, 0, 3, AUDIT_ARCH_X86_64),
        op(LD_W_ABS, 0, 0, 0),
        op(JGE_K, 0, 1, X32_SYSCALL_BIT),
        op(RET_K, 0, 0, RET_KILL_PROCESS),
        op(RET_K, 0, 0, RET_ALLOW),
    ]
}

/// `TIOCSTI` of `<asm-generic/ioctls.h>`: push a byte into a terminal's input queue.
pub const TIOCSTI: u64 = 0x5412;
/// `TIOCLINUX` of `<asm-generic/ioctls.h>`: console selection and paste, among others.
pub const TIOCLINUX: u64 = 0x541C;

/// `CLONE_NEW*` flags of `<linux/sched.h>` that create namespaces.
const CLONE_NEW_FLAGS: [u64; 8] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    0x0000_0080, // CLONE_NEWTIME
];

/// The compiled filter programs of one job, ready to install after the fork.
#[derive(Debug, Clone)]
pub struct SyscallFilter {
    programs: Vec<BpfProgram>,
}

/// Building the filter failed (an unknown architecture, or a rule seccompiler rejects).
#[derive(Debug, thiserror::Error)]
#[error("cannot build the seccomp filter: {0}")]
pub struct FilterError(String);

fn arch() -> Result<TargetArch, FilterError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| FilterError(format!("{e:?}")))
}

fn condition(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, FilterError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value).map_err(|e| FilterError(e.to_string()))
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, FilterError> {
    SeccompRule::new(conditions).map_err(|e| FilterError(e.to_string()))
}

fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>, action: SeccompAction) -> Result<BpfProgram, FilterError> {
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, action, arch()?).map_err(|e| FilterError(e.to_string()))?;
    filter.try_into().map_err(|e: seccompiler::BackendError| FilterError(e.to_string()))
}

/// System calls that kill the program outright.
/// Mount-family calls newer than the `libc` crate's tables. Numbers from 424 on are the same
/// on every architecture (Linux 5.1's unified table): `statmount` and `listmount` (Linux 6.8)
/// and `open_tree_attr` (6.15, `open_tree` with mount attributes).
const SYS_STATMOUNT: i64 = 457;
const SYS_LISTMOUNT: i64 = 458;
const SYS_OPEN_TREE_ATTR: i64 = 467;

const KILLED: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_bpf,
    libc::SYS_userfaultfd,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    SYS_OPEN_TREE_ATTR,
    SYS_STATMOUNT,
    SYS_LISTMOUNT,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_name_to_handle_at,
    libc::SYS_open_by_handle_at,
    libc::SYS_lookup_dcookie,
];

/// `fcntl` commands that take or release a record lock (`<asm-generic/fcntl.h>`; the OFD
/// variants are Linux 3.15's open-file-description locks), and `F_SETLEASE` (1024): a read
/// lease needs only that the caller own the file — as a non-root caller's sandbox does, under
/// the caller's own uid — and stalls the host's next open for writing or truncate of it for
/// `lease-break-time` (45 s) each time.
const FCNTL_LOCK_COMMANDS: [u64; 5] = [libc::F_SETLK as u64, libc::F_SETLKW as u64, 37, 38, 1024];

/// `fcntl`'s `F_SETPIPE_SZ` (`F_LINUX_SPECIFIC_BASE + 7`), refused with `EPERM`.
const F_SETPIPE_SZ: u64 = libc::F_SETPIPE_SZ as u64;

/// System calls refused with `EPERM` whatever their arguments.
const DENIED: &[i64] = &[
    libc::SYS_socket,
    libc::SYS_socketpair,
    libc::SYS_shmget,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_shmdt,
    libc::SYS_msgget,
    libc::SYS_msgsnd,
    libc::SYS_msgrcv,
    libc::SYS_msgctl,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semctl,
    libc::SYS_semtimedop,
    libc::SYS_mq_open,
    libc::SYS_mq_unlink,
    libc::SYS_mq_timedsend,
    libc::SYS_mq_timedreceive,
    libc::SYS_mq_notify,
    libc::SYS_mq_getsetattr,
    libc::SYS_memfd_create,
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "riscv64"))]
    libc::SYS_memfd_secret,
    // Kernel memory no rlimit counts: each inotify instance queues 16,384 events of up to 512
    // bytes (128 instances per uid, and each run has a uid of its own: ~1 GiB a run); fanotify
    // likewise. AIO contexts draw on one system-wide quota (`fs.aio-max-nr`, 65,536): one
    // `io_setup(60000)` denies AIO to every other process on the host.
    #[cfg(target_arch = "x86_64")]
    libc::SYS_inotify_init,
    libc::SYS_inotify_init1,
    libc::SYS_fanotify_init,
    libc::SYS_io_setup,
    // Pages a program hands to a pipe by reference: a slot that references one page of a
    // transparent huge page may keep the whole 2 MiB alive after the program unmaps it, outside
    // `RLIMIT_AS` (a review's hypothesis, 2026-12-07, not measured). Nothing a test runs uses it
    // (CPython and coreutils copy with `write`/`splice`).
    libc::SYS_vmsplice,
];

impl SyscallFilter {
    /// The filter of a job; `allow_children` false adds the rules against new processes.
    pub fn new(allow_children: bool) -> Result<Self, FilterError> {
        // Kill: unconditional rules, plus clone with any namespace flag.
        let mut kill: BTreeMap<i64, Vec<SeccompRule>> = KILLED.iter().map(|&nr| (nr, Vec::new())).collect();
        let clone_flags_arg = clone_flags_arg();
        let namespace_clones = CLONE_NEW_FLAGS
            .iter()
            .map(|&flag| rule(vec![condition(clone_flags_arg, SeccompCmpOp::MaskedEq(flag), flag)?]))
            .collect::<Result<Vec<_>, _>>()?;
        kill.insert(libc::SYS_clone, namespace_clones);

        // Deny with EPERM.
        let mut deny: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|&nr| (nr, Vec::new())).collect();
        deny.insert(
            libc::SYS_ioctl,
            vec![
                rule(vec![condition(1, SeccompCmpOp::MaskedEq(0xffff_ffff), TIOCSTI)?])?,
                rule(vec![condition(1, SeccompCmpOp::MaskedEq(0xffff_ffff), TIOCLINUX)?])?,
            ],
        );
        deny.insert(libc::SYS_fcntl, vec![rule(vec![condition(1, SeccompCmpOp::MaskedEq(0xffff_ffff), F_SETPIPE_SZ)?])?]);
        if !allow_children {
            #[cfg(target_arch = "x86_64")]
            {
                deny.insert(libc::SYS_fork, Vec::new());
                deny.insert(libc::SYS_vfork, Vec::new());
            }
            let thread = libc::CLONE_THREAD as u64;
            deny.insert(libc::SYS_clone, vec![rule(vec![condition(clone_flags_arg, SeccompCmpOp::MaskedEq(thread), 0)?])?]);
        }

        let enosys: BTreeMap<i64, Vec<SeccompRule>> = [(libc::SYS_clone3, Vec::new())].into_iter().collect();

        // No-op: locks (see the module's note).
        let fcntl_locks = FCNTL_LOCK_COMMANDS
            .iter()
            .map(|&cmd| rule(vec![condition(1, SeccompCmpOp::MaskedEq(0xffff_ffff), cmd)?]))
            .collect::<Result<Vec<_>, _>>()?;
        let no_op: BTreeMap<i64, Vec<SeccompRule>> =
            [(libc::SYS_flock, Vec::new()), (libc::SYS_fcntl, fcntl_locks)].into_iter().collect();

        let mut programs = Vec::with_capacity(5);
        #[cfg(target_arch = "x86_64")]
        programs.push(x32_guard());
        programs.push(compile(kill, SeccompAction::KillProcess)?);
        programs.push(compile(deny, SeccompAction::Errno(libc::EPERM as u32))?);
        programs.push(compile(enosys, SeccompAction::Errno(libc::ENOSYS as u32))?);
        // `SECCOMP_RET_ERRNO` with 0: the call returns 0 and does nothing.
        programs.push(compile(no_op, SeccompAction::Errno(0))?);
        Ok(Self { programs })
    }

    /// Installs every program on the calling thread. Requires `PR_SET_NO_NEW_PRIVS` or
    /// `CAP_SYS_ADMIN` (the sandbox sets the former first).
    ///
    /// # Safety
    /// Async-signal-safe (one `prctl` and one `seccomp` system call per program on memory
    /// prepared before the fork); meant for a freshly forked child before `exec`.
    pub unsafe fn install(&self) -> std::io::Result<()> {
        for program in &self.programs {
            seccompiler::apply_filter(program).map_err(|e| match e {
                seccompiler::Error::Seccomp(io) | seccompiler::Error::Prctl(io) => io,
                _ => std::io::Error::from_raw_os_error(libc::EINVAL),
            })?;
        }
        Ok(())
    }
}

/// Index of `clone`'s flags argument: the first on every architecture Linux has, except that
/// s390 swaps the first two (not supported by seccompiler anyway).
const fn clone_flags_arg() -> u8 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile_for_this_architecture() {
        let with = SyscallFilter::new(true).expect("compiles");
        let without = SyscallFilter::new(false).expect("compiles");
        let guards = usize::from(cfg!(target_arch = "x86_64"));
        assert_eq!(with.programs.len(), 4 + guards);
        // The no-children variant has more rules, hence a longer deny program.
        assert!(without.programs[guards + 1].len() > with.programs[guards + 1].len());
    }

    /// The error programs (deny, enosys, no-op) name disjoint calls: between two `ERRNO`
    /// verdicts the kernel keeps the latest installed filter's, so a call in two lists would
    /// get the no-op's success instead of its refusal. `fcntl` is in two, on disjoint commands
    /// (the no-op's locks, the deny's `F_SETPIPE_SZ`), so no `fcntl` call meets both.
    #[test]
    fn no_call_gets_two_error_verdicts() {
        assert!(!FCNTL_LOCK_COMMANDS.contains(&F_SETPIPE_SZ));
        assert!(!DENIED.contains(&libc::SYS_fcntl) && !KILLED.contains(&libc::SYS_fcntl));
        let no_op = [libc::SYS_flock];
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut conditional = vec![libc::SYS_ioctl, libc::SYS_clone];
        #[cfg(target_arch = "x86_64")]
        conditional.extend([libc::SYS_fork, libc::SYS_vfork]);
        for nr in no_op.iter().chain(&[libc::SYS_clone3]) {
            assert!(!DENIED.contains(nr) && !conditional.contains(nr) && !KILLED.contains(nr), "{nr}");
        }
        assert!(!DENIED.contains(&libc::SYS_clone3) && !no_op.contains(&libc::SYS_clone3));
    }
}
