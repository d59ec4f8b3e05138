//! Helpers shared by the integration tests: process-table scans and unique names.

#![allow(dead_code)]

use std::time::{SystemTime, UNIX_EPOCH};

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
