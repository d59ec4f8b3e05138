//! The pidfile registry of managed engine processes, and the sweep of orphans a killed
//! Switchyard left behind.
//!
//! Every managed engine child (`vllm serve …`, `switchyard emulate …`) is recorded when it
//! starts, as one small JSON file in a per-user directory ([`default_dir`]: the environment
//! variable `SWITCHYARD_ENGINE_REGISTRY`, else `$XDG_RUNTIME_DIR/switchyard/engines`, else
//! `/tmp/switchyard-$UID/engines`; created `0700`, refused when another user owns it or it is
//! a symbolic link). An [`Entry`] names the child's process group, the child's start time
//! (`/proc/PID/stat` field 22, clock ticks since boot: a reused PID has another), the owner
//! Switchyard's PID and start time, and a tag the child (and every process it forks) carries
//! in its environment ([`TAG_ENV`]). The entry is removed when the engine is unloaded.
//!
//! [`sweep_orphans`] (once, when a live run starts) handles the entries whose owner is dead
//! (PID gone or start time differs): if the recorded child still runs (same start time) its
//! process group gets SIGTERM, then SIGKILL after a short grace; if the child is gone, the
//! processes of its group that still carry the entry's tag (workers a vLLM server forked) get
//! the same; a process whose start time or tag does not match is never signalled. The entry is
//! removed. Entries of a live owner are never touched.
//!
//! This is the safety net behind `PR_SET_PDEATHSIG` (which covers only the direct child); the
//! engines' own `unload` remains the normal path. Linux only (`/proc`). Depends on std, libc,
//! serde and thiserror; it must not depend on the engines, the planner or the actors.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Environment variable overriding the registry directory (tests, unusual setups).
pub const REGISTRY_ENV: &str = "SWITCHYARD_ENGINE_REGISTRY";
/// Environment variable every managed engine child carries: its entry's tag.
pub const TAG_ENV: &str = "SWITCHYARD_ENGINE_TAG";
/// Seconds between SIGTERM and SIGKILL of an orphaned group in [`sweep_orphans`].
pub const SWEEP_GRACE: Duration = Duration::from_secs(3);
/// Entry files end with this.
const SUFFIX: &str = ".json";
/// Longest entry file read (they are about 200 bytes).
const MAX_ENTRY_BYTES: u64 = 64 * 1024;

/// Why the registry could not be used.
#[derive(Debug, Error)]
pub enum RegistryError {
    #[error("engine registry {path}: {context}: {source}")]
    Io {
        path: PathBuf,
        context: &'static str,
        source: std::io::Error,
    },
    #[error("engine registry {path}: {reason}; refusing to use it")]
    Insecure { path: PathBuf, reason: String },
    #[error("cannot read this process's start time from /proc/self/stat")]
    NoStartTime,
}

/// Why one entry file of the registry could not be read ([`entries`]).
#[derive(Debug, Error)]
pub enum EntryError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("not a regular file")]
    NotAFile,
    #[error("{0} bytes is too large for an entry")]
    TooLarge(u64),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// One managed engine child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Process group id (= the child's PID: it leads its own group).
    pub pgid: i32,
    /// The child's start time (`/proc/PID/stat` field 22).
    pub child_start: u64,
    /// The Switchyard process that started it.
    pub owner_pid: i32,
    /// The owner's start time.
    pub owner_start: u64,
    /// The value of [`TAG_ENV`] in the child's environment.
    pub tag: String,
    /// The command line, for messages.
    pub command: String,
}

/// What the sweep did with one entry of a dead owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub entry: Entry,
    /// The processes signalled (empty: nothing of the entry ran any more; the entry was only
    /// removed).
    pub killed: Vec<i32>,
    /// A process that was signalled but still ran after SIGKILL (or an entry that could not be
    /// removed), for a note.
    pub problem: Option<String>,
}

/// The registry directory: [`REGISTRY_ENV`], else `$XDG_RUNTIME_DIR/switchyard/engines`, else
/// `/tmp/switchyard-$UID/engines`. Not created here.
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(REGISTRY_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Path::new(&d).join("switchyard").join("engines");
    }
    // SAFETY: getuid(2) has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/switchyard-{uid}/engines"))
}

fn io_err(path: &Path, context: &'static str) -> impl FnOnce(std::io::Error) -> RegistryError {
    let path = path.to_path_buf();
    move |source| RegistryError::Io {
        path,
        context,
        source,
    }
}

/// Creates `dir` and its missing parents with mode 0700 and checks every directory this
/// call created, and `dir` itself, is ours, a real directory and closed to others.
pub fn ensure_dir(dir: &Path) -> Result<(), RegistryError> {
    // Create parent by parent so that each new one gets 0700 and each is checked.
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(p) = cur {
        match std::fs::symlink_metadata(p) {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                missing.push(p);
                cur = p.parent();
            }
            Err(e) => return Err(io_err(p, "cannot inspect")(e)),
        }
    }
    for p in missing.iter().rev() {
        match std::fs::DirBuilder::new().mode(0o700).create(p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(p, "cannot create")(e)),
        }
        check_private(p)?;
    }
    check_private(dir)?;
    // A parent another (non-root) user owns could swap the directory under us
    // (`/tmp/switchyard-$UID` made by someone else).
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        let meta = std::fs::metadata(parent).map_err(io_err(parent, "cannot inspect"))?;
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me && meta.uid() != 0 {
            return Err(RegistryError::Insecure {
                path: parent.to_path_buf(),
                reason: format!("it is owned by uid {}, not {me}", meta.uid()),
            });
        }
    }
    Ok(())
}

/// `path` must be a directory (not a link) owned by this user and not writable by others.
fn check_private(path: &Path) -> Result<(), RegistryError> {
    let meta = std::fs::symlink_metadata(path).map_err(io_err(path, "cannot inspect"))?;
    let insecure = |reason: String| RegistryError::Insecure {
        path: path.to_path_buf(),
        reason,
    };
    if meta.file_type().is_symlink() {
        return Err(insecure("it is a symbolic link".into()));
    }
    if !meta.is_dir() {
        return Err(insecure("it is not a directory".into()));
    }
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(insecure(format!("it is owned by uid {}, not {me}", meta.uid())));
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return Err(insecure(format!(
            "it is writable by others (mode {:o})",
            meta.permissions().mode() & 0o777
        )));
    }
    Ok(())
}

/// Field 22 of `/proc/PID/stat` (the start time in clock ticks since boot), and the state
/// (field 3), or `None` when there is no such process.
fn stat_of(pid: i32) -> Option<(char, u64)> {
    if pid <= 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

/// `pid (comm) state ppid …`: comm may hold spaces and parentheses, so split after the last
/// `)`; field 3 is then the first word and field 22 the twentieth.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// The start time of process `pid` (`/proc/PID/stat` field 22), or `None` if it is gone.
/// A zombie still has one.
pub fn start_time(pid: i32) -> Option<u64> {
    stat_of(pid).map(|(_, s)| s)
}

/// This process's PID and start time (read once).
pub fn this_process() -> Result<(i32, u64), RegistryError> {
    static ME: OnceLock<Option<u64>> = OnceLock::new();
    let pid = i32::try_from(std::process::id()).map_err(|_| RegistryError::NoStartTime)?;
    let start = ME
        .get_or_init(|| {
            std::fs::read_to_string("/proc/self/stat")
                .ok()
                .and_then(|s| parse_stat(&s))
                .map(|(_, s)| s)
        })
        .ok_or(RegistryError::NoStartTime)?;
    Ok((pid, start))
}

/// A fresh tag for a child about to start: unique for this process's life and across
/// processes (PID and start time in it).
pub fn new_tag() -> Result<String, RegistryError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let (pid, start) = this_process()?;
    Ok(format!(
        "{pid}-{start}-{}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

fn entry_path(dir: &Path, pgid: i32, child_start: u64) -> PathBuf {
    dir.join(format!("engine-{pgid}-{child_start}{SUFFIX}"))
}

impl Entry {
    /// The entry of a child just started by this process (its start time read now).
    pub fn for_child(
        pgid: i32,
        tag: String,
        command: String,
    ) -> Result<Option<Entry>, RegistryError> {
        let (owner_pid, owner_start) = this_process()?;
        Ok(start_time(pgid).map(|child_start| Entry {
            pgid,
            child_start,
            owner_pid,
            owner_start,
            tag,
            command,
        }))
    }
}

/// Records `entry` in `dir` (created if needed): written to a hidden temporary file, then
/// renamed, so a reader never sees half an entry. Returns the entry's path.
pub fn record(dir: &Path, entry: &Entry) -> Result<PathBuf, RegistryError> {
    ensure_dir(dir)?;
    let path = entry_path(dir, entry.pgid, entry.child_start);
    let tmp = dir.join(format!(
        ".engine-{}-{}.tmp",
        entry.pgid, entry.child_start
    ));
    let body = serde_json::to_vec(entry).map_err(|e| RegistryError::Io {
        path: path.clone(),
        context: "cannot encode the entry",
        source: std::io::Error::other(e),
    })?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(io_err(&tmp, "cannot create"))?;
    f.write_all(&body).map_err(io_err(&tmp, "cannot write"))?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(io_err(&path, "cannot rename into place"))?;
    Ok(path)
}

/// Removes the entry of `pgid` started at `child_start` (absent is fine).
pub fn remove(dir: &Path, pgid: i32, child_start: u64) -> Result<(), RegistryError> {
    let path = entry_path(dir, pgid, child_start);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(&path, "cannot remove")(e)),
    }
}

/// The entries in `dir` with their paths; an unreadable or unparsable entry file comes back
/// as `Err` with its path (a missing directory is an empty registry).
#[allow(clippy::type_complexity)]
pub fn entries(dir: &Path) -> Result<Vec<(PathBuf, Result<Entry, EntryError>)>, RegistryError> {
    let read = match std::fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(dir, "cannot list")(e)),
    };
    let mut out = Vec::new();
    for item in read {
        let item = item.map_err(io_err(dir, "cannot list"))?;
        let name = item.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with("engine-") && name.ends_with(SUFFIX)) {
            continue;
        }
        let path = item.path();
        out.push((path.clone(), read_entry(&path)));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn read_entry(path: &Path) -> Result<Entry, EntryError> {
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.is_file() {
        return Err(EntryError::NotAFile);
    }
    if meta.len() > MAX_ENTRY_BYTES {
        return Err(EntryError::TooLarge(meta.len()));
    }
    let text = std::fs::read(path)?;
    Ok(serde_json::from_slice(&text)?)
}

/// Whether the entry's owner still runs (same PID and start time).
fn owner_alive(e: &Entry) -> bool {
    stat_of(e.owner_pid).is_some_and(|(state, start)| start == e.owner_start && state != 'Z')
}

/// The live processes of group `pgid` (zombies excluded).
fn group_members(pgid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for item in dir.flatten() {
        let Some(pid) = item
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let (Some(state), Some(pgrp)) = (f.first(), f.get(2)) else {
            continue;
        };
        if pgrp.parse::<i32>().ok() == Some(pgid) && *state != "Z" && *state != "X" {
            out.push(pid);
        }
    }
    out
}

/// Whether process `pid`'s initial environment holds `TAG_ENV=tag`.
fn carries_tag(pid: i32, tag: &str) -> bool {
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let want = format!("{TAG_ENV}={tag}");
    env.split(|b| *b == 0).any(|kv| kv == want.as_bytes())
}

/// The processes of an orphaned entry that may be signalled: the whole group when its leader
/// is the recorded child (same start time), else the group's members carrying the entry's tag.
/// `None` for the group (signal `-pgid`), `Some(pids)` for single processes.
fn targets(e: &Entry) -> Option<Vec<i32>> {
    match stat_of(e.pgid) {
        Some((state, start)) if start == e.child_start && state != 'Z' => None,
        _ => Some(
            group_members(e.pgid)
                .into_iter()
                .filter(|&pid| carries_tag(pid, &e.tag))
                .collect(),
        ),
    }
}

fn send(pid: i32, signal: libc::c_int) {
    if pid == 0 || pid == -1 || pid == 1 {
        return;
    }
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; 0, -1 and 1
    // (this group, every process, init) are excluded above.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Which of `pids` (or of the group) still run and still are the entry's.
fn still_running(e: &Entry, singles: &Option<Vec<i32>>) -> Vec<i32> {
    match singles {
        None => {
            if stat_of(e.pgid).is_some_and(|(s, st)| st == e.child_start && s != 'Z') {
                let mut m = group_members(e.pgid);
                if m.is_empty() {
                    m.push(e.pgid);
                }
                m
            } else {
                group_members(e.pgid)
                    .into_iter()
                    .filter(|&p| carries_tag(p, &e.tag))
                    .collect()
            }
        }
        Some(pids) => pids
            .iter()
            .copied()
            .filter(|&p| stat_of(p).is_some_and(|(s, _)| s != 'Z') && carries_tag(p, &e.tag))
            .collect(),
    }
}

/// SIGTERM, up to `grace` for them to go, then SIGKILL; returns what was signalled and what
/// survived.
fn terminate(e: &Entry, grace: Duration) -> (Vec<i32>, Vec<i32>) {
    let singles = targets(e);
    let signalled: Vec<i32> = match &singles {
        None => {
            let mut m = group_members(e.pgid);
            if !m.contains(&e.pgid) {
                m.push(e.pgid);
            }
            m.sort_unstable();
            m
        }
        Some(p) => p.clone(),
    };
    if signalled.is_empty() {
        return (Vec::new(), Vec::new());
    }
    // Without the leader, each pid is signalled only while it still is the entry's (its tag
    // checked just before): a worker that exited during the grace may have its pid taken by an
    // unrelated process by the time SIGKILL goes out.
    let signal_all = |sig| match &singles {
        None => send(-e.pgid, sig),
        Some(_) => still_running(e, &singles).into_iter().for_each(|p| send(p, sig)),
    };
    signal_all(libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && !still_running(e, &singles).is_empty() {
        std::thread::sleep(Duration::from_millis(20));
    }
    if !still_running(e, &singles).is_empty() {
        signal_all(libc::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline && !still_running(e, &singles).is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    (signalled, still_running(e, &singles))
}

/// Kills what the entries of dead owners in `dir` left running (SIGTERM, SIGKILL after
/// [`SWEEP_GRACE`]) and removes those entries; entries of live owners are left alone. A
/// missing directory is an empty registry.
pub fn sweep_orphans(dir: &Path) -> Result<Vec<Orphan>, RegistryError> {
    sweep_orphans_with(dir, SWEEP_GRACE)
}

/// [`sweep_orphans`] with its grace period given.
pub fn sweep_orphans_with(dir: &Path, grace: Duration) -> Result<Vec<Orphan>, RegistryError> {
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(Vec::new());
    }
    check_private(dir)?;
    let mut out = Vec::new();
    for (path, entry) in entries(dir)? {
        let entry = match entry {
            Ok(e) => e,
            Err(why) => {
                // Entries are renamed into place whole: an unreadable one is debris.
                tracing::warn!(path = %path.display(), %why, "removing an unreadable engine registry entry");
                let _ = std::fs::remove_file(&path);
                continue;
            }
        };
        if owner_alive(&entry) {
            continue;
        }
        let (killed, survivors) = terminate(&entry, grace);
        let mut problem = (!survivors.is_empty())
            .then(|| format!("processes {survivors:?} survived SIGKILL"));
        if survivors.is_empty()
            && let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            problem = Some(format!("cannot remove {}: {e}", path.display()));
        }
        out.push(Orphan {
            entry,
            killed,
            problem,
        });
    }
    Ok(out)
}

/// Sends SIGKILL to every running engine group this process recorded in `dir` and removes
/// their entries: the last step of an immediate exit (a second Ctrl-C), which covers the
/// processes a server forked, which `PR_SET_PDEATHSIG` does not. Best effort, never blocks
/// on a process; returns the groups signalled.
pub fn kill_own(dir: &Path) -> Vec<i32> {
    let Ok((pid, start)) = this_process() else {
        return Vec::new();
    };
    let Ok(list) = entries(dir) else {
        return Vec::new();
    };
    let mut out = BTreeSet::new();
    for (path, entry) in list {
        let Ok(e) = entry else { continue };
        if e.owner_pid != pid || e.owner_start != start {
            continue;
        }
        if start_time(e.pgid) == Some(e.child_start) {
            send(-e.pgid, libc::SIGKILL);
            out.insert(e.pgid);
        }
        let _ = std::fs::remove_file(&path);
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command};

    /// A `sleep` in its own process group, with a tag in its environment.
    fn sleeper(tag: &str) -> Child {
        Command::new("sleep")
            .arg("60")
            .env(TAG_ENV, tag)
            .process_group(0)
            .spawn()
            .expect("spawn sleep")
    }

    fn running(child: &mut Child) -> bool {
        matches!(child.try_wait(), Ok(None))
    }

    /// Whether `child` ends within a few seconds (reaped here).
    fn ends(child: &mut Child) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !running(child) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The PID and start time of a process that has exited and been reaped.
    fn dead_owner() -> (i32, u64) {
        let mut c = Command::new("true").spawn().expect("spawn true");
        let pid = c.id() as i32;
        let start = start_time(pid).unwrap_or(1);
        c.wait().expect("wait");
        (pid, start)
    }

    fn entry_of(child: &Child, tag: &str, owner: (i32, u64)) -> Entry {
        let pgid = child.id() as i32;
        Entry {
            pgid,
            child_start: start_time(pgid).expect("child start time"),
            owner_pid: owner.0,
            owner_start: owner.1,
            tag: tag.into(),
            command: "sleep 60".into(),
        }
    }

    fn registry() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("a").join("engines");
        (tmp, dir)
    }

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        let mut fields = vec!["S".to_string()];
        fields.extend((4..=21).map(|i| i.to_string()));
        fields.push("123456".into());
        fields.push("0".into());
        let line = format!("42 (a) b (c) {}", fields.join(" "));
        assert_eq!(parse_stat(&line), Some(('S', 123456)));
        assert_eq!(parse_stat("42 (x) S 1"), None);
        let (pid, start) = this_process().unwrap();
        assert_eq!(start_time(pid), Some(start));
    }

    #[test]
    fn the_directory_is_created_private_and_foreign_ones_are_refused() {
        let (_tmp, dir) = registry();
        ensure_dir(&dir).unwrap();
        for d in [dir.as_path(), dir.parent().unwrap()] {
            let mode = std::fs::metadata(d).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", d.display());
        }
        let link = dir.parent().unwrap().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(matches!(ensure_dir(&link), Err(RegistryError::Insecure { .. })));
        let open = dir.parent().unwrap().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(ensure_dir(&open), Err(RegistryError::Insecure { .. })));
    }

    #[test]
    fn an_orphan_of_a_dead_owner_is_killed_and_its_entry_removed() {
        let (_tmp, dir) = registry();
        let mut child = sleeper("t-dead");
        let e = entry_of(&child, "t-dead", dead_owner());
        let path = record(&dir, &e).unwrap();
        assert!(path.exists());
        let swept = sweep_orphans_with(&dir, Duration::from_secs(2)).unwrap();
        assert_eq!(swept.len(), 1, "{swept:?}");
        assert_eq!(swept[0].killed, vec![e.pgid]);
        assert_eq!(swept[0].problem, None);
        assert!(ends(&mut child), "the orphan survived the sweep");
        assert!(!path.exists());
        // An owner whose PID lives but with another start time is dead too.
        let mut child = sleeper("t-reused-owner");
        let (me, my_start) = this_process().unwrap();
        let e = entry_of(&child, "t-reused-owner", (me, my_start + 1));
        record(&dir, &e).unwrap();
        let swept = sweep_orphans_with(&dir, Duration::from_secs(2)).unwrap();
        assert_eq!(swept.len(), 1);
        assert!(ends(&mut child));
    }

    #[test]
    fn an_entry_of_a_live_owner_is_left_alone() {
        let (_tmp, dir) = registry();
        let mut child = sleeper("t-live");
        let e = entry_of(&child, "t-live", this_process().unwrap());
        let path = record(&dir, &e).unwrap();
        let swept = sweep_orphans_with(&dir, Duration::from_millis(200)).unwrap();
        assert!(swept.is_empty(), "{swept:?}");
        std::thread::sleep(Duration::from_millis(100));
        assert!(running(&mut child), "the live owner's engine was killed");
        assert!(path.exists());
        // This owner's own immediate exit kills it.
        assert_eq!(kill_own(&dir), vec![e.pgid]);
        assert!(ends(&mut child));
        assert!(!path.exists());
    }

    #[test]
    fn a_reused_pid_is_not_killed_only_the_entry_removed() {
        let (_tmp, dir) = registry();
        let mut child = sleeper("other");
        // The recorded child started at another time (its PID was reused by this `sleep`),
        // and the `sleep` carries another tag.
        let mut e = entry_of(&child, "t-recorded", dead_owner());
        e.child_start -= 1;
        let path = record(&dir, &e).unwrap();
        let swept = sweep_orphans_with(&dir, Duration::from_millis(200)).unwrap();
        assert_eq!(swept.len(), 1);
        assert!(swept[0].killed.is_empty(), "{swept:?}");
        assert!(!path.exists(), "the stale entry stays");
        std::thread::sleep(Duration::from_millis(100));
        assert!(running(&mut child), "a process with another start time was killed");
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn tagged_members_of_a_dead_leaders_group_are_killed() {
        let (_tmp, dir) = registry();
        // `sh` leads a group, forks a tagged `sleep` into it and exits: the leader is gone,
        // the worker stays, as when PR_SET_PDEATHSIG killed a vLLM server but not its workers.
        let mut sh = Command::new("/bin/sh")
            .args(["-c", "sleep 60 >/dev/null 2>&1 & echo $!"])
            .env(TAG_ENV, "t-workers")
            .process_group(0)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pgid = sh.id() as i32;
        let e = Entry {
            pgid,
            child_start: start_time(pgid).unwrap(),
            owner_pid: dead_owner().0,
            owner_start: 1,
            tag: "t-workers".into(),
            command: "sh".into(),
        };
        let mut out = String::new();
        std::io::Read::read_to_string(sh.stdout.as_mut().unwrap(), &mut out).unwrap();
        sh.wait().unwrap();
        let worker: i32 = out.trim().parse().unwrap();
        assert_eq!(group_members(pgid), vec![worker]);
        record(&dir, &e).unwrap();
        let swept = sweep_orphans_with(&dir, Duration::from_secs(2)).unwrap();
        assert_eq!(swept[0].killed, vec![worker]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !group_members(pgid).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(group_members(pgid).is_empty(), "the worker survived");
    }

    #[test]
    fn unreadable_entries_are_removed_and_a_missing_registry_is_empty() {
        let (_tmp, dir) = registry();
        assert!(sweep_orphans(&dir).unwrap().is_empty());
        ensure_dir(&dir).unwrap();
        let junk = dir.join("engine-1-2.json");
        std::fs::write(&junk, "{ not json").unwrap();
        let other = dir.join("notes.txt");
        std::fs::write(&other, "x").unwrap();
        assert!(sweep_orphans(&dir).unwrap().is_empty());
        assert!(!junk.exists());
        assert!(other.exists(), "files that are not entries are left alone");
        remove(&dir, 5, 6).unwrap();
    }
}
