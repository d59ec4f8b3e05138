//! Attack tests: hostile candidate code sent through the real `python_tests` tool, in every
//! sandbox this machine has (the process sandbox with the host's python3, and CPython on WASI
//! when `python.wasm` is installed), each asserting that the attack is denied — by what the
//! payload itself observed *and* by checking the host from outside.
//!
//! The rows of the security review (tools/SECURITY.md): terminal injection with `TIOCSTI`,
//! host unix sockets, host System V shared memory, reading host files, a forged verdict,
//! residue after `kill -9` of the caller, disk fill, descriptor exhaustion. Tests that need a
//! controlling terminal or a caller to kill re-run this test binary as a child process (see
//! [`child_process_entry`]).

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_tools::python_tests::{self, Backend};
use switchyard_tools::sandbox::{ProcessSandbox, Sandbox, SandboxJob, SandboxLimits, residue};
use switchyard_tools::{ToolCall, ToolOutcome};

/// Environment variable that turns a re-run of this binary into an attack's victim process.
const CHILD_ROLE: &str = "SWITCHYARD_ATTACK_CHILD";

/// The sandboxes available here, by name.
fn backends() -> Vec<(&'static str, Backend)> {
    let mut out = Vec::new();
    if switchyard_tools::python3_available() {
        out.push(("process", Backend::Process));
    }
    if python_tests::wasm_runtime().is_ok() {
        out.push(("wasm", Backend::Wasm));
    }
    if out.is_empty() {
        eprintln!("note: neither python3 nor python.wasm is usable here; attack tests skipped");
    }
    out
}

fn call(code: &str, tests: &[&str], timeout_s: f64) -> ToolCall {
    let inputs: BTreeMap<String, Value> = serde_json::from_value(json!({
        "code": code, "tests": tests, "timeout_s": timeout_s,
    }))
    .expect("object");
    ToolCall { tool: python_tests::NAME.into(), inputs, timeout_s: None }
}

fn attack(backend: Backend, code: &str, tests: &[&str], timeout_s: f64) -> ToolOutcome {
    python_tests::run_with(&call(code, tests, timeout_s), backend).expect("the tool runs")
}

/// The payload's own verdict: it returns `'denied'` when every attempt failed.
fn assert_denied(name: &str, out: &ToolOutcome) {
    assert_eq!(out.verdict.as_deref(), Some("pass"), "{name}: the payload saw an escape: {}", out.text);
}

// ---------------------------------------------------------------------------------------------
// Terminal injection

const TIOCSTI_PAYLOAD: &str = r#"
import os
def attack():
    try:
        import fcntl, termios
    except ImportError:
        return 'denied'
    hits = []
    try:
        fd = os.open('/dev/tty', os.O_RDWR)
    except OSError:
        fd = None
    for target in ([fd] if fd is not None else []) + [0, 1, 2]:
        for byte in b'id\n':
            try:
                fcntl.ioctl(target, termios.TIOCSTI, bytes([byte]))
                hits.append(target)
            except OSError:
                pass
    return 'denied' if not hits else 'escaped %r' % hits
"#;

/// Opens a pseudo-terminal pair in raw mode: (master, slave).
fn open_pty() -> (OwnedFd, OwnedFd) {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills two descriptors; null name/termios/winsize are allowed.
    let rc = unsafe {
        libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null())
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: openpty returned two fresh descriptors that we now own.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    // SAFETY: termios is plain data; tcgetattr/tcsetattr on our own descriptor.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        assert_eq!(libc::tcgetattr(slave.as_raw_fd(), &mut t), 0);
        libc::cfmakeraw(&mut t);
        assert_eq!(libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &t), 0);
    }
    (master, slave)
}

/// Bytes waiting in the terminal's input queue, read without blocking from the slave side.
fn pending_input(slave: &OwnedFd) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 256];
    // SAFETY: fcntl and read on our own descriptor with a valid buffer.
    unsafe {
        let flags = libc::fcntl(slave.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(slave.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        loop {
            let n = libc::read(slave.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                break;
            }
            out.extend_from_slice(&buf[..n as usize]);
        }
    }
    out
}

#[test]
fn tiocsti_cannot_inject_into_the_callers_terminal() {
    if !switchyard_tools::python3_available() {
        eprintln!("note: no python3 for the process sandbox; skipped");
        return;
    }
    let (master, slave) = open_pty();
    // Control: the detection works (root may inject into any terminal, the kernel permitting).
    // SAFETY: ioctl with a pointer to one byte.
    let control = unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCSTI, c"z".as_ptr()) } == 0;
    if control {
        assert_eq!(pending_input(&slave), b"z", "the control injection must be readable");
    } else {
        eprintln!("note: TIOCSTI is refused to this test itself ({}); checking the sandbox anyway", std::io::Error::last_os_error());
    }

    // The victim: this binary, with the terminal as its controlling terminal and stdio,
    // running the payload through the process sandbox.
    let stdio = |fd: &OwnedFd| Stdio::from(fd.try_clone().expect("dup"));
    let mut child = Command::new(std::env::current_exe().expect("test binary"));
    child
        .args(["--exact", "child_process_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD_ROLE, "tiocsti")
        .stdin(stdio(&slave))
        .stdout(stdio(&slave))
        .stderr(stdio(&slave));
    // SAFETY: setsid and ioctl are async-signal-safe; fd 0 is the terminal at this point.
    unsafe {
        child.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = child.status().expect("victim runs");
    // What the victim printed (its verdict line), from the master side.
    let mut printed = Vec::new();
    // SAFETY: fcntl on our own descriptor.
    unsafe {
        let flags = libc::fcntl(master.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(master.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    let _ = std::fs::File::from(master.try_clone().expect("dup")).read_to_end(&mut printed);
    let printed = String::from_utf8_lossy(&printed);
    assert!(status.success(), "victim failed: {printed}");
    assert!(printed.contains("tiocsti verdict: pass"), "{printed}");
    assert_eq!(pending_input(&slave), b"", "bytes were injected into the caller's terminal");
}

// ---------------------------------------------------------------------------------------------
// Host unix sockets

#[test]
fn host_unix_sockets_are_unreachable() {
    let dir = tempfile::Builder::new().prefix("attack-unix-").tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).expect("chmod");
    let path = dir.path().join("listener.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o777)).expect("chmod");
    listener.set_nonblocking(true).expect("nonblocking");
    let code = format!(
        r#"
def attack():
    try:
        import socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect({path:?})
        s.sendall(b'stolen')
        return 'escaped'
    except BaseException as e:
        return 'denied'
"#,
        path = path.display().to_string()
    );
    for (name, backend) in backends() {
        let out = attack(backend, &code, &["assert attack() == 'denied'"], 10.0);
        assert_denied(name, &out);
        assert!(listener.accept().is_err(), "{name}: the host listener got a connection");
    }
}

// ---------------------------------------------------------------------------------------------
// Host System V shared memory

/// Lines of `/proc/sysvipc/shm` (header excluded): the host's segments.
fn host_segments() -> usize {
    std::fs::read_to_string("/proc/sysvipc/shm").map(|t| t.lines().count().saturating_sub(1)).unwrap_or(0)
}

#[test]
fn host_shared_memory_is_unreachable_and_nothing_is_left() {
    // A host segment with a secret, under a key the payload knows.
    let key = 0x5357_0000 + (std::process::id() as i32 & 0xffff);
    // SAFETY: plain System V calls; the segment is removed at the end of the test.
    let id = unsafe { libc::shmget(key, 4096, libc::IPC_CREAT | 0o666) };
    assert!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
    // SAFETY: attach, write a secret, detach.
    unsafe {
        let at = libc::shmat(id, std::ptr::null(), 0);
        assert_ne!(at as isize, -1);
        std::ptr::copy_nonoverlapping(b"host-secret".as_ptr(), at.cast::<u8>(), 11);
        libc::shmdt(at);
    }
    let before = host_segments();
    let code = format!(
        r#"
def attack():
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
    except BaseException:
        return 'denied'
    libc.shmat.restype = ctypes.c_void_p
    hits = []
    seg = libc.shmget({key}, 0, 0)
    if seg >= 0:
        at = libc.shmat(seg, None, 0)
        if at not in (None, ctypes.c_void_p(-1).value):
            hits.append(ctypes.string_at(at, 11))
    for _ in range(3):
        if libc.shmget(0, 200 * 1024 * 1024, 0o1000 | 0o600) >= 0:
            hits.append('created')
    return 'denied' if not hits else 'escaped %r' % hits
"#
    );
    for (name, backend) in backends() {
        let out = attack(backend, &code, &["assert attack() == 'denied'"], 10.0);
        assert_denied(name, &out);
        assert_eq!(host_segments(), before, "{name}: segments were left on the host");
    }
    // SAFETY: remove our own segment.
    unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
}

// ---------------------------------------------------------------------------------------------
// Host files

#[test]
fn host_files_and_other_processes_are_out_of_reach() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let secrets = [
        PathBuf::from("/etc/passwd"),
        repo.join("Cargo.toml"),
        repo.join("workflows/datasets/mbpp/sanitized-mbpp.json"),
        PathBuf::from(format!("/proc/{}/cmdline", std::process::id())),
        PathBuf::from("/proc/1/environ"),
    ];
    let list: Vec<String> = secrets.iter().map(|p| format!("{:?}", p.display().to_string())).collect();
    let code = format!(
        r#"
import os
def attack():
    hits = []
    for path in [{paths}]:
        try:
            with open(path, 'rb') as f:
                if f.read(64):
                    hits.append(path)
        except OSError:
            pass
    try:
        pids = [p for p in os.listdir('/proc') if p.isdigit()]
        if len(pids) > 5:
            hits.append('%d processes visible' % len(pids))
    except OSError:
        pass
    return 'denied' if not hits else 'escaped %r' % hits
"#,
        paths = list.join(", ")
    );
    for (name, backend) in backends() {
        let out = attack(backend, &code, &["assert attack() == 'denied'"], 10.0);
        assert_denied(name, &out);
    }
}

// ---------------------------------------------------------------------------------------------
// Forged verdicts

/// Code that defines no function and instead writes a passing report for every test, in every
/// format the runner has used, then exits cleanly before any test runs.
const FORGE_PAYLOAD: &str = r#"
import os, sys
import __main__
report = getattr(__main__, '_REPORT', None) or open(1, 'w', closefd=False)
for i in range(8):
    report.write('test\t%d\tok\n' % i)
    report.write('value\t%d\tTrue\n' % i)
report.write('done\n')
report.flush()
os._exit(0)
"#;

#[test]
fn a_forged_report_does_not_pass() {
    let tests = ["assert similar_elements((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)", "assert similar_elements((1, 2), (2, 3)) == (2,)"];
    for (name, backend) in backends() {
        let out = attack(backend, FORGE_PAYLOAD, &tests, 10.0);
        assert_eq!(out.verdict.as_deref(), Some("fail"), "{name}: the forged report passed: {}", out.text);
        assert_eq!(out.checks.outside, 2, "{name}: both asserts are decided outside the sandbox");
        // The same payload against asserts that cannot be split is counted as untrusted.
        let out = attack(backend, FORGE_PAYLOAD, &["assert 0 < len(similar_elements((1, 2), (2, 3))) < 3"], 10.0);
        assert_eq!(out.checks.untrusted, 1, "{name}: {out:?}");
    }
}

/// Truthiness asserts (`assert f(x)`, `assert not f(x)`, MBPP's predicate checks) are decided
/// outside the sandbox with their polarity withheld: the guest evaluates the same `not not (…)`
/// for both, so neither the forged report nor a candidate that answers a constant passes a
/// problem whose asserts mix them; the real answer does.
#[test]
fn a_forged_report_or_a_constant_answer_does_not_pass_truthiness_checks() {
    let tests = [
        "assert not is_perfect_square(10)",
        "assert is_perfect_square(36)",
        "assert not is_perfect_square(14)",
        "assert is_perfect_square(14*14)",
    ];
    let always = "def is_perfect_square(n):\n    return True\n";
    let never = "def is_perfect_square(n):\n    return False\n";
    for (name, backend) in backends() {
        for (what, code) in [("forged report", FORGE_PAYLOAD), ("always true", always), ("always false", never)] {
            let out = attack(backend, code, &tests, 10.0);
            assert_eq!(out.verdict.as_deref(), Some("fail"), "{name}, {what}: passed: {}", out.text);
            assert_eq!((out.checks.outside, out.checks.untrusted), (4, 0), "{name}, {what}: {out:?}");
        }
        // The real answer passes, and a truthy value that is not a bool counts as true.
        let solved = "def is_perfect_square(n):\n    r = int(n ** 0.5)\n    return [1] if r * r == n else []\n";
        let out = attack(backend, solved, &tests, 10.0);
        assert_eq!(out.verdict.as_deref(), Some("pass"), "{name}: {}", out.text);
    }
}

/// A tolerance assert (`math.isclose`, MBPP's floating-point checks) cannot be passed by
/// replacing `math.isclose` in the guest, nor by the forged report: its formula is applied
/// outside the sandbox to the value the candidate computed.
#[test]
fn a_replaced_math_isclose_or_a_forged_report_does_not_pass_a_tolerance_check() {
    let tests = [
        "assert math.isclose(volume_sphere(10), 4188.790204786391, rel_tol=0.001)",
        "assert math.isclose(volume_sphere(25), 65449.84694978735, rel_tol=0.001)",
    ];
    let replaced = "import math\nmath.isclose = lambda *a, **k: True\ndef volume_sphere(r):\n    return 0\n";
    for (name, backend) in backends() {
        for (what, code) in [("replaced isclose", replaced), ("forged report", FORGE_PAYLOAD)] {
            let out = attack(backend, code, &tests, 10.0);
            assert_eq!(out.verdict.as_deref(), Some("fail"), "{name}, {what}: passed: {}", out.text);
            assert_eq!((out.checks.outside, out.checks.untrusted), (2, 0), "{name}, {what}: {out:?}");
        }
        // The real answer passes.
        let solved = "import math\ndef volume_sphere(r):\n    return 4 / 3 * math.pi * r ** 3\n";
        let out = attack(backend, solved, &tests, 10.0);
        assert_eq!(out.verdict.as_deref(), Some("pass"), "{name}: {}", out.text);
    }
}

// ---------------------------------------------------------------------------------------------
// Disk and descriptors

#[test]
fn one_call_cannot_fill_the_disk() {
    let limit = SandboxLimits::default().max_work_bytes;
    let code = format!(
        r#"
import errno
def attack():
    written = 0
    try:
        for i in range(10000):
            with open('fill%d.bin' % i, 'wb') as f:
                for _ in range(16):
                    f.write(b'x' * (1024 * 1024))
                    written += 1024 * 1024
    except OSError as e:
        # Stopped by a limit (no space, file too large, quota), after writing something.
        if e.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) or written == 0:
            return 'unexpected: %r after %d bytes' % (e, written)
    return 'denied' if written <= {limit} else 'escaped: %d bytes' % written
"#
    );
    for (name, backend) in backends() {
        let out = attack(backend, &code, &["assert attack() == 'denied'"], 30.0);
        assert_denied(name, &out);
    }
}

#[test]
fn one_call_cannot_exhaust_descriptors() {
    let limit = SandboxLimits::default().max_open_files;
    let fds_before = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
    let code = format!(
        r#"
import errno
def attack():
    kept = []
    try:
        for _ in range(100000):
            kept.append(open('probe.txt', 'a'))
    except OSError as e:
        # Stopped by the descriptor limit, after opening some.
        if e.errno not in (errno.EMFILE, errno.ENFILE) or not kept:
            return 'unexpected: %r after %d' % (e, len(kept))
    return 'denied' if len(kept) <= {limit} else 'escaped: %d open' % len(kept)
"#
    );
    for (name, backend) in backends() {
        let out = attack(backend, &code, &["assert attack() == 'denied'"], 30.0);
        assert_denied(name, &out);
    }
    let fds_after = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
    assert!(fds_after <= fds_before + 16, "this process's descriptors grew from {fds_before} to {fds_after}");
}

// ---------------------------------------------------------------------------------------------
// kill -9 of the caller

/// Pids of every live process whose chain of parents reaches `ancestor`.
fn descendants(ancestor: u32) -> Vec<u32> {
    let parents: BTreeMap<u32, u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_string_lossy().parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let rest = &stat[stat.rfind(')')? + 2..];
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            if state == "Z" || state == "X" {
                return None;
            }
            Some((pid, fields.next()?.parse().ok()?))
        })
        .collect();
    parents
        .keys()
        .copied()
        .filter(|&pid| {
            let mut cur = pid;
            for _ in 0..64 {
                match parents.get(&cur) {
                    Some(&p) if p == ancestor => return true,
                    Some(&p) if p > 1 => cur = p,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 2..].starts_with(['Z', 'X'])))
        .is_some_and(|zombie| !zombie)
}

#[test]
fn nothing_survives_a_kill_of_the_caller() {
    let mut roles = vec!["daemon"];
    for (name, _) in backends() {
        roles.push(if name == "process" { "python-process" } else { "python-wasm" });
    }
    for role in roles {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "child_process_entry", "--nocapture", "--test-threads=1"])
            .env(CHILD_ROLE, role)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("victim starts");
        let victim = child.id();
        // Wait until the victim reports that its tool call is under way.
        let mut stdout = child.stdout.take().expect("stdout");
        let mut seen = String::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut buf = [0u8; 256];
        while !seen.contains("tool call started") && Instant::now() < deadline {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
        assert!(seen.contains("tool call started"), "{role}: victim never started: {seen}");
        // Let the payload spawn, fill and sleep.
        std::thread::sleep(Duration::from_millis(1500));
        let tree = descendants(victim);
        // SAFETY: kill our own child.
        unsafe { libc::kill(victim as i32, libc::SIGKILL) };
        let _ = child.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut survivors: Vec<u32> = tree.iter().copied().filter(|&p| alive(p)).collect();
        while !survivors.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            survivors.retain(|&p| alive(p));
        }
        assert!(survivors.is_empty(), "{role}: processes {survivors:?} of the killed caller survived");
        let daemons: Vec<u32> = all_pids().into_iter().filter(|&p| cmdline(p).contains("313.71")).collect();
        assert!(daemons.is_empty(), "{role}: the setsid daemon survived: {daemons:?}");
        // Work directories: none on the host (private tmpfs), or swept at the next start.
        let left = |root: &Path| -> Vec<PathBuf> {
            std::fs::read_dir(root)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(residue::WORK_DIR_PREFIX))
                        && std::fs::read_to_string(p.join(residue::MARKER_FILE))
                            .is_ok_and(|m| m.lines().nth(1).is_some_and(|l| l.starts_with(&format!("{victim} "))))
                })
                .collect()
        };
        let tmp = std::env::temp_dir();
        let before_sweep = left(&tmp);
        residue::sweep_stale_work_dirs(&tmp);
        let after_sweep = left(&tmp);
        assert!(after_sweep.is_empty(), "{role}: work dirs of the killed caller remain: {after_sweep:?}");
        eprintln!("{role}: {} tree processes killed; {} work dirs needed the sweep", tree.len(), before_sweep.len());
    }
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect()
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline")).map(|b| String::from_utf8_lossy(&b).replace('\0', " ")).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Victim processes

/// Entry point of the victim processes the tests above start: does nothing unless
/// [`CHILD_ROLE`] is set, in which case it performs that role and exits.
#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var(CHILD_ROLE) else { return };
    match role.as_str() {
        "tiocsti" => {
            let out = attack(Backend::Process, TIOCSTI_PAYLOAD, &["assert attack() == 'denied'"], 10.0);
            println!("tiocsti verdict: {} ({})", out.verdict.unwrap_or_default(), out.text);
        }
        "daemon" => {
            // A generic job that may start processes: a setsid'd, double-forked daemon and a
            // long sleep, killed with the caller.
            let job = SandboxJob::new(
                "/bin/sh",
                vec!["-c".into(), "(setsid sleep 313.71 > /dev/null 2>&1 < /dev/null &); sleep 313.72".into()],
            );
            let job = SandboxJob { limits: SandboxLimits { wall_time: Duration::from_secs(600), cpu_seconds: 600, ..SandboxLimits::default() }, ..job };
            println!("tool call started");
            let _ = ProcessSandbox::new().run(&job);
        }
        "python-process" | "python-wasm" => {
            let backend = if role == "python-process" { Backend::Process } else { Backend::Wasm };
            let code = "import time\ndef attack():\n    try:\n        with open('big.bin', 'wb') as f:\n            for _ in range(48):\n                f.write(b'x' * (1024 * 1024))\n    except OSError:\n        pass\n    time.sleep(300)\n";
            println!("tool call started");
            let _ = attack(backend, code, &["attack()"], 600.0);
        }
        other => panic!("unknown role {other}"),
    }
    std::process::exit(0);
}
