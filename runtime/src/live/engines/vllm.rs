//! `VllmEngine`: a replica as a managed child process — `vllm serve …` (kind `vllm`), or
//! `switchyard emulate …` (kind `emulated`, and the `vllm` kind in tests) — started from a
//! command template, reached through [`HttpEngine`].
//!
//! Lifecycle: `load` picks a free port (binding port 0 first), spawns the command in its own
//! process group (`process_group(0)`) with its environment (`CUDA_VISIBLE_DEVICES={gpu}`,
//! `VLLM_SERVER_DEV_MODE=1` for vLLM's sleep endpoints, field anchors §1.1; the registry's
//! tag), records it in the engine registry ([`super::registry`]), and polls `/health` until
//! 200, failing early with the child's last output if it exits. Another process (another
//! engine's child starting at the same time, another program) can take the port in the window
//! before the child binds it; its server then answers `/health` while the child starts. So an
//! answer counts only when every listening socket on the port belongs to the child's process
//! group (`/proc/net/tcp*` and the group's open files; with `SO_REUSEPORT` two servers can
//! share a port); a port found held outside the group (or a child that exited while it is) is
//! given up, the child stopped, and the start is made again on a fresh port ([`PORT_ATTEMPTS`]
//! in all). Where no listener can be seen (a remote host, another network namespace), the
//! answer is trusted as before. A command whose server listens outside the child's process
//! group in this namespace (e.g. `docker run -p`, through docker-proxy) is therefore refused:
//! the managed lifecycle stops an engine by its process group and could not stop such a server.
//!
//! One process-tree owner: every child is forked by one long-lived spawner thread and gets
//! `PR_SET_PDEATHSIG(SIGKILL)` before it execs (the signal follows the death of the forking
//! *thread*, so a tokio worker or blocking-pool thread, which may end before the process,
//! must not fork it); the child checks `getppid()` afterwards and gives up if the owner
//! already died. A `kill -9` of Switchyard thus takes its engine children with it; what they
//! forked themselves is the registry sweep's to find. `unload` sends SIGTERM to the whole group, SIGKILL after
//! the grace period, reaps the child and checks in `/proc` that no process of the group is
//! left (workers a vLLM server forks included). A child that exited on its own is detected at
//! the next call (`Unreachable`, with its exit status); its group is killed then. `restart`
//! is `unload` + `load`. `sleep`/`wake`/`submit`/`telemetry` go over HTTP. A clean unload
//! removes the child's registry entry.
//!
//! Linux only (process groups, signals, `prctl`, `/proc`). Depends on the HTTP engine, the
//! registry and libc; it must not depend on the planner or the actors.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

use super::http::{HttpEngine, HttpOptions};
use super::registry;
use super::{CommandTemplate, EngineKind, EngineSpec, EngineSpecError, LaunchParams, PLACEHOLDERS};
use crate::live::engine::{
    Completion, Engine, EngineError, EngineFuture, EngineTelemetry, LlmRequest,
};

/// Lines of the child's stdout/stderr kept for error messages.
const LOG_TAIL_LINES: usize = 60;
/// Longest line kept (vLLM can print very long config dumps).
const LOG_LINE_CHARS: usize = 2000;
/// How long `unload` waits for the group to vanish after SIGKILL.
const GROUP_EXIT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection error waits for a dying child to become reapable.
const CRASH_SETTLE: Duration = Duration::from_millis(200);
/// Starts made on fresh ports when another process took the port before the child bound it.
const PORT_ATTEMPTS: u32 = 3;

/// A command template with every placeholder but `{port}` resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagedCommand {
    words: Vec<String>,
    env: BTreeMap<String, String>,
    vars: BTreeMap<String, String>,
    host: String,
    switchyard_exe: Option<PathBuf>,
}

/// Calls `f` on every `{name}` placeholder (lower-case letters and `_`) in `text`; other
/// braces (e.g. JSON arguments) are left alone.
fn placeholders(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        match after.find('}') {
            Some(close)
                if close > 0
                    && after[..close]
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c == '_') =>
            {
                out.push(&after[..close]);
                rest = &after[close + 1..];
            }
            _ => rest = after,
        }
    }
    out
}

fn expand(text: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = text.to_string();
    for name in placeholders(text) {
        if let Some(v) = vars.get(name) {
            out = out.replace(&format!("{{{name}}}"), v);
        }
    }
    out
}

impl ManagedCommand {
    /// Checks the template's placeholders and fixes the launch variables.
    pub fn new(
        template: &CommandTemplate,
        env: BTreeMap<String, String>,
        vars: BTreeMap<String, String>,
        host: &str,
        switchyard_exe: Option<PathBuf>,
    ) -> Result<Self, EngineSpecError> {
        let words = template.words();
        if words.is_empty() {
            return Err(EngineSpecError::Invalid {
                field: "command",
                reason: "the command is empty".into(),
            });
        }
        for text in &words {
            for name in placeholders(text) {
                if !PLACEHOLDERS.contains(&name) {
                    return Err(EngineSpecError::UnknownPlaceholder(name.to_string()));
                }
            }
        }
        for text in env.values() {
            for name in placeholders(text) {
                if !PLACEHOLDERS.contains(&name) {
                    return Err(EngineSpecError::Invalid {
                        field: "env",
                        reason: format!("unknown placeholder `{{{name}}}` (known: {})", PLACEHOLDERS.join(", ")),
                    });
                }
            }
        }
        if !words.iter().any(|w| w.contains("{port}"))
            && !env.values().any(|v| v.contains("{port}"))
        {
            return Err(EngineSpecError::Invalid {
                field: "command",
                reason: "the command must pass {port} to the server".into(),
            });
        }
        Ok(ManagedCommand {
            words,
            env,
            vars,
            host: host.to_string(),
            switchyard_exe,
        })
    }

    /// The command of one replica from its pool entry.
    pub fn from_spec(spec: &EngineSpec, launch: &LaunchParams) -> Result<Self, EngineSpecError> {
        let host = spec.host.clone().unwrap_or_else(|| "127.0.0.1".into());
        let speed = spec.speed.unwrap_or(1.0);
        if !(speed.is_finite() && speed > 0.0) {
            return Err(EngineSpecError::Invalid {
                field: "speed",
                reason: format!("{speed} is not a positive number"),
            });
        }
        if let Some(reason) = super::speed_problem(speed) {
            return Err(EngineSpecError::Invalid { field: "speed", reason });
        }
        let vars: BTreeMap<String, String> = [
            ("model", spec.model_id(&launch.model)),
            ("served", launch.model.clone()),
            ("host", host.clone()),
            ("util", launch.gpu_memory_utilization.to_string()),
            ("max_len", launch.max_model_len.to_string()),
            ("max_num_seqs", launch.max_num_seqs.to_string()),
            ("dtype", super::vllm_dtype(launch.dtype).to_string()),
            ("gpu", launch.gpu.to_string()),
            ("device", launch.device_kind.clone()),
            ("noise_seed", launch.noise_seed.to_string()),
            ("speed", speed.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let mut env = BTreeMap::new();
        if spec.kind == EngineKind::Vllm {
            env.insert("CUDA_VISIBLE_DEVICES".to_string(), "{gpu}".to_string());
            env.insert("VLLM_SERVER_DEV_MODE".to_string(), "1".to_string());
        }
        env.extend(spec.env.clone());
        Self::new(
            &spec.template(),
            env,
            vars,
            &host,
            launch.switchyard_exe.clone(),
        )
    }

    fn vars_with_port(&self, port: u16) -> BTreeMap<String, String> {
        let mut vars = self.vars.clone();
        vars.insert("port".into(), port.to_string());
        vars
    }

    /// The program and arguments for `port` (a program `switchyard` resolves to the
    /// configured binary).
    pub fn argv(&self, port: u16) -> Vec<String> {
        let vars = self.vars_with_port(port);
        let mut argv: Vec<String> = self.words.iter().map(|w| expand(w, &vars)).collect();
        if let (Some(first), Some(exe)) = (argv.first_mut(), &self.switchyard_exe)
            && first == "switchyard"
        {
            *first = exe.to_string_lossy().into_owned();
        }
        argv
    }

    /// The child's extra environment for `port`.
    pub fn env(&self, port: u16) -> BTreeMap<String, String> {
        let vars = self.vars_with_port(port);
        self.env
            .iter()
            .map(|(k, v)| (k.clone(), expand(v, &vars)))
            .collect()
    }

    /// Where the server is reached (a wildcard bind address is reached on loopback).
    pub fn base_url(&self, port: u16) -> String {
        let host = match self.host.as_str() {
            "0.0.0.0" | "::" | "[::]" => "127.0.0.1",
            // An IPv6 literal is bracketed in a URL (`http://::1:8000` is no URL).
            h if h.contains(':') && !h.starts_with('[') => return format!("http://[{h}]:{port}"),
            h => h,
        };
        format!("http://{host}:{port}")
    }
}

/// The last lines a child printed.
#[derive(Debug, Default)]
struct LogTail {
    lines: VecDeque<String>,
}

impl LogTail {
    fn push(&mut self, line: String) {
        if self.lines.len() == LOG_TAIL_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    /// The lines, each made safe for the terminal a failure message is printed on (a child's
    /// escape sequences would otherwise act on the operator's terminal).
    fn text(&self) -> String {
        self.lines.iter().map(|line| super::http::terminal_safe(line)).collect::<Vec<_>>().join("\n")
    }
}

fn drain<R: AsyncRead + Unpin + Send + 'static>(reader: R, log: Arc<Mutex<LogTail>>) {
    tokio::spawn(async move {
        let mut reader = BufReader::new(reader);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            // A line is kept to its first `LOG_LINE_CHARS` characters: its rest, however long
            // (a child that prints without a newline), is read and dropped, never held.
            let mut line = (&mut reader).take(4 * LOG_LINE_CHARS as u64);
            let read = line.read_until(b'\n', &mut buf).await;
            if matches!(read, Ok(n) if n > 0) && !buf.ends_with(b"\n") {
                let mut rest = Vec::new();
                loop {
                    rest.clear();
                    match (&mut reader).take(64 << 10).read_until(b'\n', &mut rest).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) if rest.ends_with(b"\n") => break,
                        Ok(_) => {}
                    }
                }
            }
            match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line: String = String::from_utf8_lossy(&buf)
                        .trim_end()
                        .chars()
                        .take(LOG_LINE_CHARS)
                        .collect();
                    if let Ok(mut l) = log.lock() {
                        l.push(line);
                    }
                }
            }
        }
    });
}

/// Sends `signal` to every process of group `pgid` (errors such as ESRCH are ignored: the
/// group may already be gone).
fn signal_group(pgid: i32, signal: libc::c_int) {
    if pgid <= 1 {
        return;
    }
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; a negative pid
    // addresses the process group, and pgid > 1 never addresses "every process" (-1).
    unsafe {
        libc::kill(-pgid, signal);
    }
}

/// The live (not zombie) processes whose process group is `pgid`, from `/proc/*/stat`
/// (empty where `/proc` is absent).
pub fn process_group_members(pgid: i32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp …`; comm may contain spaces and parentheses.
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let (Some(state), Some(pgrp)) = (fields.first(), fields.get(2)) else {
            continue;
        };
        if pgrp.parse::<i32>().ok() == Some(pgid) && *state != "Z" && *state != "X" {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}

/// Who listens on a TCP port of this host, as far as `/proc` tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortHolder {
    /// A process of the child's process group.
    Group,
    /// Only processes outside the group.
    Other,
    /// Nobody visible here (a remote host, another network namespace), or it cannot be told.
    Unknown,
}

/// The inodes of the listening TCP sockets (IPv4 and IPv6) on `port` in this network
/// namespace, from `/proc/net/tcp` and `/proc/net/tcp6` (empty where they cannot be read).
fn listening_inodes(port: u16) -> Vec<u64> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        // `sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode …`, the
        // local address as `HEXADDR:HEXPORT`, state 0A = LISTEN.
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (fields.get(1), fields.get(3), fields.get(9)) else {
                continue;
            };
            let local_port = local.rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if *state == "0A"
                && local_port == Some(port)
                && let Ok(inode) = inode.parse::<u64>()
                && inode != 0
            {
                out.push(inode);
            }
        }
    }
    out
}

/// Whether the server listening on `port` is the child's (group `pgid`) alone or also, or only,
/// another process's: `Group` only when every listening socket on the port is the group's —
/// with `SO_REUSEPORT` (vLLM sets it) two servers can listen on one port and the kernel splits
/// connections between them.
fn port_holder(port: u16, pgid: i32) -> PortHolder {
    let mut listening = listening_inodes(port);
    if listening.is_empty() {
        return PortHolder::Unknown;
    }
    for pid in process_group_members(pgid) {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            // A member whose files cannot be read might hold the socket.
            return PortHolder::Unknown;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let inode = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse::<u64>().ok());
            if let Some(i) = inode {
                listening.retain(|l| *l != i);
            }
            if listening.is_empty() {
                return PortHolder::Group;
            }
        }
    }
    PortHolder::Other
}

/// How one start attempt ended, short of an error.
enum Started {
    Ready,
    /// Another process holds the port; the child is gone (why, for the log).
    PortTaken(String),
}

/// A command for the spawner thread, and where its child goes.
struct SpawnJob {
    command: Command,
    /// The runtime the child's reaping and pipes belong to.
    handle: tokio::runtime::Handle,
    reply: tokio::sync::oneshot::Sender<std::io::Result<Child>>,
}

/// The one thread that forks every engine child. It lives as long as the process, so the
/// children's `PR_SET_PDEATHSIG` fires only when the process dies (`None`: the thread could
/// not be started).
fn spawner() -> Option<&'static mpsc::Sender<SpawnJob>> {
    static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    SPAWNER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<SpawnJob>();
            std::thread::Builder::new()
                .name("switchyard-engine-spawner".into())
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        let SpawnJob {
                            mut command,
                            handle,
                            reply,
                        } = job;
                        let spawned = {
                            let _runtime = handle.enter();
                            command.spawn()
                        };
                        // The requester may have gone (cancelled start): the child is then
                        // dropped here and killed (`kill_on_drop`).
                        drop(reply.send(spawned));
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

/// Makes `command`'s child die with this process: `PR_SET_PDEATHSIG(SIGKILL)` in the child
/// before exec, then a check that the parent is still the one that forked it (if it died in
/// between, the signal was never going to come: fail the exec instead).
fn die_with_parent(command: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the hook runs in the forked child before exec; it only calls the
    // async-signal-safe prctl(2) and getppid(2) and builds errors without allocating.
    unsafe {
        command.pre_exec(move || {
            set_parent_death_signal()?;
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// `prctl(PR_SET_PDEATHSIG, SIGKILL)` for the calling process (async-signal-safe).
#[cfg(target_os = "linux")]
fn set_parent_death_signal() -> std::io::Result<()> {
    let zero: libc::c_ulong = 0;
    // SAFETY: prctl(2) with PR_SET_PDEATHSIG reads its second argument only; every argument is
    // passed as the unsigned long the kernel reads.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            zero,
            zero,
            zero,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// No parent-death signal outside Linux (the registry sweep remains).
#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal() -> std::io::Result<()> {
    Ok(())
}

/// Spawns `command` on the spawner thread, for the current tokio runtime.
async fn spawn_owned(mut command: Command) -> std::io::Result<Child> {
    die_with_parent(&mut command);
    let Some(spawner) = spawner() else {
        return Err(std::io::Error::other("cannot start the engine spawner thread"));
    };
    let handle = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = SpawnJob {
        command,
        handle,
        reply,
    };
    spawner
        .send(job)
        .map_err(|_| std::io::Error::other("the engine spawner thread is gone"))?;
    answer
        .await
        .map_err(|_| std::io::Error::other("the engine spawner thread dropped the request"))?
}

fn free_port(host: &str) -> Result<u16, EngineError> {
    let bind_host = match host {
        "localhost" => "127.0.0.1",
        h => h,
    };
    let listener = std::net::TcpListener::bind((bind_host, 0))
        .map_err(|e| EngineError::Lifecycle(format!("cannot find a free port on {host}: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| EngineError::Lifecycle(format!("cannot find a free port on {host}: {e}")))
}

#[derive(Debug)]
struct Running {
    child: Child,
    pgid: i32,
    /// The child's start time when it is recorded in the registry.
    recorded: Option<u64>,
    http: Arc<HttpEngine>,
    log: Arc<Mutex<LogTail>>,
    command_line: String,
}

impl Running {
    fn tail(&self) -> String {
        self.log.lock().map(|l| l.text()).unwrap_or_default()
    }
}

/// A managed vLLM-compatible server process.
#[derive(Debug)]
pub struct VllmEngine {
    kind: &'static str,
    command: ManagedCommand,
    model: String,
    options: HttpOptions,
    grace: Duration,
    /// Serialises load / unload / restart.
    lifecycle: tokio::sync::Mutex<()>,
    running: Mutex<Option<Running>>,
    /// Why the last child went away on its own (reported until the next load).
    crashed: Mutex<Option<String>>,
    /// The engine registry directory (`None`: children are not recorded).
    registry: Option<PathBuf>,
}

impl VllmEngine {
    /// `kind` is `vllm` or `emulated`; `model` is the name requests carry.
    pub fn new(
        kind: &'static str,
        command: ManagedCommand,
        model: &str,
        options: HttpOptions,
        grace: Duration,
    ) -> Self {
        VllmEngine {
            kind,
            command,
            model: model.to_string(),
            options,
            grace,
            lifecycle: tokio::sync::Mutex::new(()),
            running: Mutex::new(None),
            crashed: Mutex::new(None),
            registry: Some(registry::default_dir()),
        }
    }

    /// Records children in `dir` instead of [`registry::default_dir`] (`None`: nowhere).
    pub fn with_registry(mut self, dir: Option<PathBuf>) -> Self {
        self.registry = dir;
        self
    }

    /// Removes the registry entry of a child that is gone (or was just killed).
    fn forget(&self, r: &Running) {
        if let (Some(dir), Some(start)) = (&self.registry, r.recorded)
            && let Err(e) = registry::remove(dir, r.pgid, start)
        {
            tracing::warn!(kind = self.kind, pid = r.pgid, error = %e, "cannot remove the engine registry entry");
        }
    }

    /// Records a child just started; its start time when recorded. A registry that cannot be
    /// written costs the safety net of the sweep only, so it is a warning, not a failed start.
    fn remember(&self, pgid: i32, tag: Option<String>, command_line: &str) -> Option<u64> {
        let (dir, tag) = (self.registry.as_ref()?, tag?);
        let recorded = registry::Entry::for_child(pgid, tag, command_line.to_string())
            .and_then(|e| e.map(|e| registry::record(dir, &e).map(|_| e.child_start)).transpose());
        match recorded {
            Ok(start) => start,
            Err(e) => {
                tracing::warn!(kind = self.kind, pid = pgid, error = %e, "cannot record the engine process in the registry");
                None
            }
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Option<Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The child's pid (= its process group id) while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.running().as_ref().map(|r| r.pgid as u32)
    }

    /// The server's base URL while it runs.
    pub fn base_url(&self) -> Option<String> {
        self.running()
            .as_ref()
            .map(|r| r.http.base_url().to_string())
    }

    /// The child's last output lines.
    pub fn output_tail(&self) -> String {
        self.running()
            .as_ref()
            .map(Running::tail)
            .unwrap_or_default()
    }

    /// The HTTP engine of the live child, or why there is none. A child found exited is
    /// reaped, its group killed, and the exit recorded.
    fn live_http(&self) -> Result<Arc<HttpEngine>, EngineError> {
        let mut guard = self.running();
        let Some(r) = guard.as_mut() else {
            let why = self
                .crashed
                .lock()
                .ok()
                .and_then(|c| c.clone())
                .unwrap_or_else(|| format!("the {} process is not running", self.kind));
            return Err(EngineError::Unreachable(why));
        };
        match r.child.try_wait() {
            Ok(None) => Ok(Arc::clone(&r.http)),
            Ok(Some(status)) => {
                let why = format!(
                    "the {} process `{}` (pid {}) exited with {status}; last output:\n{}",
                    self.kind,
                    r.command_line,
                    r.pgid,
                    r.tail()
                );
                signal_group(r.pgid, libc::SIGKILL);
                self.forget(r);
                *guard = None;
                if let Ok(mut c) = self.crashed.lock() {
                    *c = Some(why.clone());
                }
                Err(EngineError::Unreachable(why))
            }
            Err(e) => Err(EngineError::Unreachable(format!(
                "cannot query the {} process: {e}",
                self.kind
            ))),
        }
    }

    /// A transport or server error becomes the crash report when the child has exited. A
    /// connection reset can arrive while the dying child is not yet reapable, so an
    /// `Unreachable` error looks again for up to [`CRASH_SETTLE`].
    async fn after_error(&self, e: EngineError) -> EngineError {
        let patience = match e {
            EngineError::Unreachable(_) => CRASH_SETTLE,
            EngineError::BadResponse(_) => Duration::ZERO,
            other => return other,
        };
        let deadline = Instant::now() + patience;
        loop {
            if let Err(crash) = self.live_http() {
                return crash;
            }
            if Instant::now() >= deadline {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Starts the process (if none runs) and waits until `/health` answers 200 from it; on a
    /// fresh port again when another process took the port first.
    pub async fn start(&self) -> Result<(), EngineError> {
        let _lifecycle = self.lifecycle.lock().await;
        if self.live_http().is_ok() {
            return Ok(());
        }
        let mut attempt = 1;
        loop {
            match self.start_once().await? {
                Started::Ready => return Ok(()),
                Started::PortTaken(why) if attempt < PORT_ATTEMPTS => {
                    tracing::warn!(kind = self.kind, attempt, reason = %why, "port taken: starting again on another port");
                    attempt += 1;
                }
                Started::PortTaken(why) => {
                    return Err(EngineError::Lifecycle(format!("{why} ({PORT_ATTEMPTS} ports tried)")));
                }
            }
        }
    }

    /// One start on a port of its own (the lifecycle lock held, no child running).
    async fn start_once(&self) -> Result<Started, EngineError> {
        let port = free_port(&self.command.host)?;
        let argv = self.command.argv(port);
        let command_line = argv.join(" ");
        let Some((program, args)) = argv.split_first() else {
            return Err(EngineError::Lifecycle("empty command".into()));
        };
        let http = Arc::new(HttpEngine::new(
            self.kind,
            &self.command.base_url(port),
            &self.model,
            self.options.clone(),
        )?);
        let tag = match registry::new_tag() {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(kind = self.kind, error = %e, "engine processes are not recorded");
                None
            }
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(self.command.env(port))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(t) = &tag {
            cmd.env(registry::TAG_ENV, t);
        }
        let mut child = spawn_owned(cmd)
            .await
            .map_err(|e| EngineError::Lifecycle(format!("cannot start `{command_line}`: {e}")))?;
        let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) else {
            return Err(EngineError::Lifecycle(format!(
                "`{command_line}` exited at once"
            )));
        };
        let recorded = self.remember(pid, tag, &command_line);
        let log = Arc::new(Mutex::new(LogTail::default()));
        if let Some(out) = child.stdout.take() {
            drain(out, Arc::clone(&log));
        }
        if let Some(err) = child.stderr.take() {
            drain(err, Arc::clone(&log));
        }
        *self.running() = Some(Running {
            child,
            pgid: pid,
            recorded,
            http: Arc::clone(&http),
            log,
            command_line: command_line.clone(),
        });
        if let Ok(mut c) = self.crashed.lock() {
            *c = None;
        }
        tracing::info!(kind = self.kind, pid, port, command = %command_line, "replica process started");

        let deadline = super::deadline_after(self.options.health_timeout);
        let mut pause = Duration::from_millis(10);
        let taken = |port: u16| {
            format!("port {port} is held by a process outside the `{}` child's process group", self.kind)
        };
        loop {
            if let Err(e) = self.live_http() {
                // A child that lost the race for its port exits (address in use).
                if port_holder(port, pid) == PortHolder::Other {
                    return Ok(Started::PortTaken(format!("{}: {e}", taken(port))));
                }
                return Err(EngineError::Lifecycle(format!("during start-up: {e}")));
            }
            if let Ok(true) = http.health().await {
                // Another process's server answering on the port is not the child's: its
                // model, version and calls are not ours (the child cannot bind the port).
                if port_holder(port, pid) == PortHolder::Other {
                    let _ = self.stop_locked().await;
                    return Ok(Started::PortTaken(format!("{} and answered `/health`", taken(port))));
                }
                // What the server is: its version (sleep calls), whether it is the emulator
                // (emulated outputs), that it serves the model, and its context length.
                if let Err(e) = http.inspect().await {
                    let _ = self.stop_locked().await;
                    return Err(e);
                }
                return Ok(Started::Ready);
            }
            if Instant::now() >= deadline {
                let tail = self.output_tail();
                let _ = self.stop_locked().await;
                return Err(EngineError::Lifecycle(format!(
                    "`{command_line}` not healthy after {:.1} s; last output:\n{tail}",
                    self.options.health_timeout.as_secs_f64()
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }

    /// Stops the process group (SIGTERM, SIGKILL after the grace period) and checks that no
    /// process of it is left. Idempotent.
    pub async fn stop(&self) -> Result<(), EngineError> {
        let _lifecycle = self.lifecycle.lock().await;
        self.stop_locked().await
    }

    async fn stop_locked(&self) -> Result<(), EngineError> {
        let taken = self.running().take();
        let Some(mut r) = taken else {
            return Ok(());
        };
        let pgid = r.pgid;
        // The caller may give up on this stop (a shutdown's timeout drops the future): the
        // group is then killed at once, rather than left running with no `Running` to find.
        let guard = KillGroupOnDrop(Some(pgid));
        signal_group(pgid, libc::SIGTERM);
        // A stopped process (SIGSTOP, a debugger) cannot act on SIGTERM until it runs again.
        signal_group(pgid, libc::SIGCONT);
        if tokio::time::timeout(self.grace, r.child.wait())
            .await
            .is_err()
        {
            signal_group(pgid, libc::SIGKILL);
            let _ = r.child.wait().await;
        }
        // Workers that outlive the leader (or ignore SIGTERM) go now.
        signal_group(pgid, libc::SIGKILL);
        let deadline = Instant::now() + GROUP_EXIT_TIMEOUT;
        loop {
            let left = process_group_members(pgid);
            if left.is_empty() {
                guard.disarm();
                self.forget(&r);
                tracing::info!(kind = self.kind, pid = pgid, "replica process stopped");
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(EngineError::Lifecycle(format!(
                    "processes {left:?} of group {pgid} survived SIGKILL"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stop, then start again (after a crash, or to recover a wedged server).
    pub async fn restart(&self) -> Result<(), EngineError> {
        self.stop().await?;
        self.start().await
    }
}

/// SIGKILLs a process group when dropped armed ([`VllmEngine::stop_locked`]'s stop cut short).
struct KillGroupOnDrop(Option<i32>);

impl KillGroupOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            signal_group(pgid, libc::SIGKILL);
        }
    }
}

impl Drop for VllmEngine {
    fn drop(&mut self) {
        // Never leave a group behind, even without an explicit unload (tokio reaps the
        // killed child in the background: `kill_on_drop`).
        if let Some(r) = self.running().as_ref() {
            signal_group(r.pgid, libc::SIGKILL);
            self.forget(r);
        }
    }
}

impl Engine for VllmEngine {
    fn kind(&self) -> &'static str {
        self.kind
    }

    /// Alive: the process runs and its server answers (`/health`, else its models list).
    fn probe(&self) -> EngineFuture<'_, ()> {
        Box::pin(async move {
            let http = self.live_http()?;
            http.probe_health().await
        })
    }

    fn endpoint(&self) -> String {
        match self.live_http() {
            Ok(http) => http.base_url().to_string(),
            Err(_) => format!("a managed `{}` engine", self.kind),
        }
    }

    fn load(&self) -> EngineFuture<'_, ()> {
        Box::pin(self.start())
    }

    fn sleep(&self, level: u8) -> EngineFuture<'_, ()> {
        Box::pin(async move {
            let http = self.live_http()?;
            match http.sleep_level(level).await {
                Ok(()) => Ok(()),
                Err(e) => Err(self.after_error(e).await),
            }
        })
    }

    fn wake(&self) -> EngineFuture<'_, ()> {
        Box::pin(async move {
            let http = self.live_http()?;
            match http.wake_up().await {
                Ok(()) => Ok(()),
                Err(e) => Err(self.after_error(e).await),
            }
        })
    }

    fn unload(&self) -> EngineFuture<'_, ()> {
        Box::pin(self.stop())
    }

    fn submit(&self, request: LlmRequest) -> EngineFuture<'_, Completion> {
        Box::pin(async move {
            let http = self.live_http()?;
            match http.complete(&request).await {
                Ok(c) => Ok(c),
                Err(e) => Err(self.after_error(e).await),
            }
        })
    }

    fn telemetry(&self) -> EngineFuture<'_, EngineTelemetry> {
        Box::pin(async move {
            let http = self.live_http()?;
            match http.scrape_telemetry().await {
                Ok(t) => Ok(t),
                Err(e) => Err(self.after_error(e).await),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_cut_short_kills_the_group() {
        use std::os::unix::process::CommandExt;
        // A leader and a worker in a group of their own, as a managed server runs.
        let mut leader = std::process::Command::new("/bin/sh")
            .args(["-c", "sleep 30 & wait"])
            .process_group(0)
            .spawn()
            .expect("sh");
        let pgid = leader.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(5);
        while process_group_members(pgid).len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(process_group_members(pgid).len() >= 2, "the worker started");
        let disarmed = KillGroupOnDrop(Some(pgid));
        disarmed.disarm();
        std::thread::sleep(Duration::from_millis(200));
        assert!(process_group_members(pgid).len() >= 2, "a disarmed guard kills nothing");
        drop(KillGroupOnDrop(Some(pgid)));
        let _ = leader.wait();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !process_group_members(pgid).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(process_group_members(pgid).is_empty(), "the worker went with the group");
    }

    fn vars() -> BTreeMap<String, String> {
        [("model", "Qwen/Qwen3-8B"), ("gpu", "2"), ("util", "0.9")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn base_urls_bracket_ipv6_hosts() {
        let url = |host: &str| {
            ManagedCommand::new(&CommandTemplate::Line("vllm serve --port {port}".into()), BTreeMap::new(), vars(), host, None)
                .expect("command")
                .base_url(8000)
        };
        assert_eq!(url("::1"), "http://[::1]:8000");
        assert_eq!(url("[::1]"), "http://[::1]:8000");
        assert_eq!(url("0.0.0.0"), "http://127.0.0.1:8000");
        assert_eq!(url("10.0.0.5"), "http://10.0.0.5:8000");
    }

    #[test]
    fn placeholders_skip_json_braces() {
        assert_eq!(placeholders("{model}-{port}"), ["model", "port"]);
        assert!(placeholders("{\"ttft\":[1,2]}").is_empty());
        assert!(placeholders("{}{ }{A}").is_empty());
        assert_eq!(placeholders("{{port}}"), ["port"]);
    }

    #[test]
    fn templates_expand_with_the_chosen_port() {
        let env: BTreeMap<String, String> =
            [("CUDA_VISIBLE_DEVICES".to_string(), "{gpu}".to_string())].into();
        let c = ManagedCommand::new(
            &CommandTemplate::Line("switchyard serve {model} --port {port} --x {\"a\":1}".into()),
            env,
            vars(),
            "0.0.0.0",
            Some(PathBuf::from("/bin/sy")),
        )
        .unwrap();
        assert_eq!(
            c.argv(8123),
            [
                "/bin/sy",
                "serve",
                "Qwen/Qwen3-8B",
                "--port",
                "8123",
                "--x",
                "{\"a\":1}"
            ]
        );
        assert_eq!(c.env(1)["CUDA_VISIBLE_DEVICES"], "2");
        assert_eq!(c.base_url(8123), "http://127.0.0.1:8123");
    }

    #[test]
    fn templates_are_checked() {
        let mk = |t: &str| {
            ManagedCommand::new(
                &CommandTemplate::Line(t.into()),
                BTreeMap::new(),
                vars(),
                "h",
                None,
            )
        };
        assert!(
            matches!(mk("vllm serve {modle} {port}"), Err(EngineSpecError::UnknownPlaceholder(p)) if p == "modle")
        );
        assert!(matches!(
            mk("vllm serve {model}"),
            Err(EngineSpecError::Invalid {
                field: "command",
                ..
            })
        ));
        assert!(matches!(mk("   "), Err(EngineSpecError::Invalid { .. })));
        // A placeholder in the environment is checked too, and named as the environment's.
        let env = BTreeMap::from([("X".to_string(), "{gpuu}".to_string())]);
        let e = ManagedCommand::new(&CommandTemplate::Line("vllm serve {port}".into()), env, vars(), "h", None);
        assert!(matches!(&e, Err(EngineSpecError::Invalid { field: "env", reason }) if reason.contains("`{gpuu}`")), "{e:?}");
        assert!(mk("vllm serve {model} --port {port}").is_ok());
    }

    #[test]
    fn this_process_group_is_visible_in_proc() {
        // SAFETY: getpgrp(2) has no preconditions.
        let pgid = unsafe { libc::getpgrp() };
        let members = process_group_members(pgid);
        assert!(members.contains(&std::process::id()), "{members:?}");
        assert!(process_group_members(i32::MAX).is_empty());
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let mut t = LogTail::default();
        for i in 0..(LOG_TAIL_LINES + 5) {
            t.push(i.to_string());
        }
        assert_eq!(t.lines.len(), LOG_TAIL_LINES);
        assert_eq!(t.lines.front().map(String::as_str), Some("5"));
    }

    /// A child's output reaches the terminal in failure messages: its escape sequences and
    /// bidi overrides go escaped, its lines stay lines.
    #[test]
    fn log_tail_text_is_safe_for_a_terminal() {
        let mut t = LogTail::default();
        t.push("\x1b]0;PWNED\x07\x1b[2Jcleared".into());
        t.push("ok \u{202e}txt.exe".into());
        assert_eq!(t.text(), "\\u{1b}]0;PWNED\\u{7}\\u{1b}[2Jcleared\nok \\u{202e}txt.exe");
    }
}
