//! Helpers shared by the integration tests: process-table scans, unique names, `/bin/sh` and
//! python3 jobs, the MBPP fixtures of the `python_tests` tool's tests ([`mbpp`]) and helper
//! processes whose kernel refuses chosen system calls ([`helper`]).

#![allow(dead_code)]

pub mod helper;
pub mod mbpp;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use switchyard_tools::python;
use switchyard_tools::sandbox::{SandboxJob, SandboxLimits};

/// (pid, process group, state) of every live process, read from `/proc/*/stat`.
fn stat_entries() -> Vec<(u32, u32, char, u32)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else { continue };
        // The command name is in parentheses and may contain spaces: parse after the last ')'.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let state = fields.first().and_then(|s| s.chars().next()).unwrap_or('?');
        let pgrp = fields.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|u| u.parse().ok())
            .unwrap_or(u32::MAX);
        out.push((pid, pgrp, state, uid));
    }
    out
}

/// Live (non-zombie) processes whose process group is `pgid`.
pub fn live_in_group(pgid: u32) -> Vec<u32> {
    stat_entries().into_iter().filter(|&(_, g, s, _)| g == pgid && s != 'Z' && s != 'X').map(|e| e.0).collect()
}

/// Live (non-zombie) processes owned by `uid`.
pub fn live_of_uid(uid: u32) -> Vec<u32> {
    stat_entries().into_iter().filter(|&(_, _, s, u)| u == uid && s != 'Z' && s != 'X').map(|e| e.0).collect()
}

/// A name no other test run uses.
pub fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// True when the tests run as root (several confinements differ then).
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `/bin/sh -c SCRIPT` under `limits`, with the operating system's programs readable and
/// children allowed.
pub fn sh(script: &str, limits: SandboxLimits) -> SandboxJob {
    SandboxJob {
        program: PathBuf::from("/bin/sh"),
        args: vec!["-c".into(), script.into()],
        files: vec![],
        limits,
        read_only_paths: switchyard_tools::sandbox::system_paths(),
        allow_children: true,
    }
}

/// The host's python3 running `script` (`-I -S -B -c`) under [`quick`] limits, with its own
/// files readable and no children.
pub fn python_job(python: &python::Interpreter, script: &str) -> SandboxJob {
    SandboxJob {
        program: python.path.clone(),
        args: vec!["-I".into(), "-S".into(), "-B".into(), "-c".into(), script.into()],
        files: vec![],
        limits: quick(),
        read_only_paths: python::read_only_paths(&python.path),
        allow_children: false,
    }
}

/// The default limits with a 10 s wall-clock limit (room for a loaded machine).
pub fn quick() -> SandboxLimits {
    SandboxLimits { wall_time: Duration::from_secs(10), ..SandboxLimits::default() }
}
