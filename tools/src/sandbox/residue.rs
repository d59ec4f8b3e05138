//! Host work directories that a sandbox leaves on disk, and the sweep that removes those of
//! killed runs.
//!
//! Owns the marker file that only Switchyard writes into a work directory it creates on the
//! host ([`create_work_dir`]), and [`sweep_stale_work_dirs`], which removes every such
//! directory whose owning process is gone. A directory is removed only when all of these hold:
//! its name starts with [`WORK_DIR_PREFIX`], it is a real directory (not a symbolic link) owned
//! by the sweeping process's effective uid (or, when that is root, by a per-run sandbox uid of
//! [`super::SANDBOX_UID_BASE`] and above), it holds a marker file whose first line is
//! [`MARKER_MAGIC`], and the process named in the marker (pid *and* its start time, so a
//! recycled pid does not count as alive) no longer exists. Never anybody else's files.
//!
//! A directory handed to a sandbox uid belongs to the program that ran there, which may delete
//! the marker and write one of its own naming a process that lives on (pid 1), to keep its
//! files after a crash. Only root can have written the real marker (before the hand-over), so
//! when root sweeps a sandbox uid's directory, a marker that root does not own — or none — does
//! not protect it: the directory is removed (at worst the tampering run's own).
//!
//! The process sandbox normally needs no host directory at all (its work directory is a tmpfs
//! in the child's private mount namespace, which the kernel frees with the namespace); the
//! WebAssembly sandbox and the process sandbox without a mount namespace do. Must not depend on
//! anything outside the sandbox module.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Prefix of every host work directory a sandbox creates (`switchyard-work-…`).
pub const WORK_DIR_PREFIX: &str = "switchyard-work-";

/// Name of the marker file inside a host work directory.
pub const MARKER_FILE: &str = ".switchyard-owner";

/// First line of a marker; the second is `<pid> <start time in clock ticks since boot>`.
pub const MARKER_MAGIC: &str = "switchyard sandbox work directory v1";

/// The marker text for the current process.
pub fn marker_contents() -> String {
    let pid = std::process::id();
    let start = process_start_time(pid).unwrap_or(0);
    format!("{MARKER_MAGIC}\n{pid} {start}\n")
}

/// Start time of `pid` (field 22 of `/proc/<pid>/stat`, clock ticks since boot), if it exists.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces: split after it.
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 on; the start time is field 22, i.e. index 19 here.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// Creates a private (mode 0700) host work directory under the system temporary directory,
/// with the marker of this process inside, removed when the returned guard drops. The marker
/// is written first, so a directory never exists without it for longer than one `mkdir`.
pub fn create_work_dir() -> io::Result<tempfile::TempDir> {
    sweep_once();
    let dir = tempfile::Builder::new().prefix(WORK_DIR_PREFIX).tempdir()?;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700))?;
    let mut marker = fs::OpenOptions::new().write(true).create_new(true).mode_0600().open(dir.path().join(MARKER_FILE))?;
    marker.write_all(marker_contents().as_bytes())?;
    Ok(dir)
}

/// `OpenOptions::mode(0o600)` without importing the extension trait at every call site.
trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::mode(self, 0o600)
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Directories of dead owners that were removed.
    pub removed: Vec<PathBuf>,
    /// Directories of dead owners that could not be removed, with the error.
    pub failed: Vec<(PathBuf, String)>,
}

/// Runs [`sweep_stale_work_dirs`] on the system temporary directory once per process (the
/// first time a sandbox creates a host work directory, or when the CLI starts).
pub fn sweep_once() -> &'static SweepReport {
    static SWEPT: OnceLock<SweepReport> = OnceLock::new();
    SWEPT.get_or_init(|| sweep_stale_work_dirs(&std::env::temp_dir()))
}

/// Removes the work directories under `root` whose owning process is gone (see the module
/// documentation for the exact conditions). Unreadable entries are skipped.
pub fn sweep_stale_work_dirs(root: &Path) -> SweepReport {
    let mut report = SweepReport::default();
    let Ok(entries) = fs::read_dir(root) else { return report };
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(WORK_DIR_PREFIX) {
            continue;
        }
        let path = entry.path();
        // symlink_metadata: a link named like ours is never followed or removed.
        let Ok(meta) = fs::symlink_metadata(&path) else { continue };
        // Ours, or (when root) handed to a per-run sandbox uid by the process sandbox.
        let owned = meta.uid() == euid || (euid == 0 && meta.uid() >= super::SANDBOX_UID_BASE);
        if !meta.is_dir() || !owned {
            continue;
        }
        let handed_over = euid == 0 && meta.uid() >= super::SANDBOX_UID_BASE;
        let kept = match read_marker(&path) {
            // A sandbox uid's directory: only root's marker speaks for it (see the module doc).
            Some((owner, marker_uid)) if !handed_over || marker_uid == 0 => owner_alive(owner),
            Some(_) => false,
            // Unmarked: not known to be ours, unless it was handed to a sandbox uid.
            None => !handed_over,
        };
        if kept {
            continue;
        }
        match fs::remove_dir_all(&path) {
            Ok(()) => report.removed.push(path),
            Err(e) => report.failed.push((path, e.to_string())),
        }
    }
    report
}

/// Bytes a marker may have: it is two short lines.
const MAX_MARKER_BYTES: u64 = 4096;

/// ((pid, start time), owner uid of the marker file) from the marker of `dir`, when it is one
/// of ours. The directory (without following a link) and then the marker in it (without
/// following a link, without blocking) are opened once and everything is read from those
/// descriptors, at most [`MAX_MARKER_BYTES`]: a program that owns the directory cannot show the
/// check one file and the read another (a link swapped in between), stall the sweep on a FIFO
/// or feed it `/dev/zero`.
fn read_marker(dir: &Path) -> Option<((u32, u64), u32)> {
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::fs::OpenOptionsExt;
    let dir = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .ok()?;
    let name = std::ffi::CString::new(MARKER_FILE).ok()?;
    // SAFETY: openat on a descriptor this function owns and a NUL-terminated name; the result,
    // when valid, is a fresh descriptor that the File below takes over.
    let fd = unsafe {
        libc::openat(dir.as_raw_fd(), name.as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let marker = unsafe { fs::File::from_raw_fd(fd) };
    let meta = marker.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_MARKER_BYTES {
        return None;
    }
    let mut text = String::new();
    marker.take(MAX_MARKER_BYTES + 1).read_to_string(&mut text).ok()?;
    let mut lines = text.lines();
    if lines.next()? != MARKER_MAGIC {
        return None;
    }
    let mut fields = lines.next()?.split_whitespace();
    let pid = fields.next()?.parse().ok()?;
    let start = fields.next()?.parse().ok()?;
    Some(((pid, start), meta.uid()))
}

/// Whether the process that wrote a marker still runs: same pid and same start time.
fn owner_alive((pid, start): (u32, u64)) -> bool {
    match process_start_time(pid) {
        Some(now) => start == 0 || now == start,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_dir(root: &Path, name: &str, marker: Option<&str>) -> PathBuf {
        let dir = root.join(name);
        fs::create_dir(&dir).expect("mkdir");
        fs::write(dir.join("payload"), vec![0u8; 1024]).expect("payload");
        if let Some(marker) = marker {
            fs::write(dir.join(MARKER_FILE), marker).expect("marker");
        }
        dir
    }

    #[test]
    fn own_start_time_is_readable() {
        assert!(process_start_time(std::process::id()).is_some_and(|t| t > 0));
        assert_eq!(read_marker_text(&marker_contents()).map(|m| m.0.0), Some(std::process::id()));
    }

    fn read_marker_text(text: &str) -> Option<((u32, u64), u32)> {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = fake_dir(root.path(), "m", Some(text));
        read_marker(&dir)
    }

    #[test]
    fn sweep_removes_only_marked_directories_of_dead_owners() {
        let root = tempfile::tempdir().expect("tempdir");
        // A pid that cannot exist (above pid_max's 2^22 ceiling).
        let dead = format!("{MARKER_MAGIC}\n{} 12345\n", 1u32 << 23);
        let dead_dir = fake_dir(root.path(), &format!("{WORK_DIR_PREFIX}dead"), Some(&dead));
        let live_dir = fake_dir(root.path(), &format!("{WORK_DIR_PREFIX}live"), Some(&marker_contents()));
        let recycled = format!("{MARKER_MAGIC}\n{} 1\n", std::process::id());
        let recycled_dir = fake_dir(root.path(), &format!("{WORK_DIR_PREFIX}recycled"), Some(&recycled));
        let unmarked = fake_dir(root.path(), &format!("{WORK_DIR_PREFIX}unmarked"), None);
        let forged = fake_dir(root.path(), &format!("{WORK_DIR_PREFIX}forged"), Some("not ours\n1 1\n"));
        let other_name = fake_dir(root.path(), "someone-elses", Some(&dead));
        let target = fake_dir(root.path(), "link-target", None);
        std::os::unix::fs::symlink(&target, root.path().join(format!("{WORK_DIR_PREFIX}link"))).expect("symlink");

        let report = sweep_stale_work_dirs(root.path());
        let mut removed = report.removed.clone();
        removed.sort();
        let mut expected = vec![dead_dir.clone(), recycled_dir.clone()];
        expected.sort();
        assert_eq!(removed, expected, "{report:?}");
        assert!(report.failed.is_empty());
        assert!(!dead_dir.exists() && !recycled_dir.exists());
        for kept in [&live_dir, &unmarked, &forged, &other_name, &target] {
            assert!(kept.join("payload").exists(), "{} must be kept", kept.display());
        }
    }

    /// As root: a directory handed to a sandbox uid is kept for root's marker of a live owner
    /// only; a marker its program wrote (owned by the sandbox uid, naming a live process), or
    /// none, does not keep it.
    #[test]
    fn a_marker_forged_by_the_sandboxed_program_does_not_keep_its_directory() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let uid = super::super::SANDBOX_UID_BASE + 4321;
        let root = tempfile::tempdir().expect("tempdir");
        let hand_over = |dir: &Path, marker_too: bool| {
            std::os::unix::fs::chown(dir, Some(uid), Some(uid)).expect("chown");
            if marker_too {
                std::os::unix::fs::chown(dir.join(MARKER_FILE), Some(uid), Some(uid)).expect("chown marker");
            }
        };
        let live = marker_contents();
        let genuine = fake_dir(root.path(), &format!("{WORK_DIR_PREFIX}genuine"), Some(&live));
        hand_over(&genuine, false);
        let forged = fake_dir(root.path(), &format!("{WORK_DIR_PREFIX}forged"), Some(&live));
        hand_over(&forged, true);
        let unmarked = fake_dir(root.path(), &format!("{WORK_DIR_PREFIX}unmarked"), None);
        hand_over(&unmarked, false);
        let report = sweep_stale_work_dirs(root.path());
        let mut removed = report.removed.clone();
        removed.sort();
        let mut expected = vec![forged.clone(), unmarked.clone()];
        expected.sort();
        assert_eq!(removed, expected, "{report:?}");
        assert!(genuine.join("payload").exists());
    }

    /// A marker that is a link (to a forged marker elsewhere), a FIFO (which would block a read)
    /// or endless (`/dev/zero` behind a link), or a directory that is a link to a marked one, is
    /// no marker: read at once, as nothing.
    #[test]
    fn a_marker_is_read_from_the_file_itself_without_blocking() {
        let root = tempfile::tempdir().expect("tempdir");
        let forged = root.path().join("forged-marker");
        fs::write(&forged, marker_contents()).expect("forged");
        let linked = fake_dir(root.path(), "linked", None);
        std::os::unix::fs::symlink(&forged, linked.join(MARKER_FILE)).expect("symlink");
        let zero = fake_dir(root.path(), "zero", None);
        std::os::unix::fs::symlink("/dev/zero", zero.join(MARKER_FILE)).expect("symlink");
        let fifo = fake_dir(root.path(), "fifo", None);
        let path = std::ffi::CString::new(fifo.join(MARKER_FILE).into_os_string().into_encoded_bytes()).expect("path");
        // SAFETY: mkfifo on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        let genuine = fake_dir(root.path(), "genuine", Some(&marker_contents()));
        assert!(read_marker(&genuine).is_some());
        let linked_dir = root.path().join("linked-dir");
        std::os::unix::fs::symlink(&genuine, &linked_dir).expect("symlink");
        let (tx, rx) = std::sync::mpsc::channel();
        let dirs = [linked, zero, fifo, linked_dir];
        std::thread::spawn(move || {
            let _ = tx.send(dirs.iter().map(|d| read_marker(d)).collect::<Vec<_>>());
        });
        let read = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("the reads return at once");
        assert_eq!(read, vec![None; 4]);
    }

    #[test]
    fn created_work_dirs_are_private_marked_and_kept_while_the_owner_lives() {
        let dir = create_work_dir().expect("work dir");
        let meta = fs::metadata(dir.path()).expect("meta");
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        assert_eq!(read_marker(dir.path()).map(|m| m.0.0), Some(std::process::id()));
        let report = sweep_stale_work_dirs(dir.path().parent().expect("parent"));
        assert!(!report.removed.contains(&dir.path().to_path_buf()));
        assert!(dir.path().exists());
    }
}
