//! Integration tests of the WebAssembly sandbox with small WASI command modules written in WAT
//! (no python needed): each asserts that a denial happens and how it is reported.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use switchyard_tools::sandbox::residue;
use switchyard_tools::sandbox::wasm::{cache_stats, module_from_file};
use switchyard_tools::sandbox::{
    LimitHit, Sandbox, SandboxError, SandboxJob, SandboxLimits, SandboxOutcome, Termination, WasmSandbox,
};

/// WASI errno `ENOTCAPABLE` (wasi_snapshot_preview1).
const ENOTCAPABLE: i32 = 76;
/// WASI errno `EPERM`.
const EPERM: i32 = 63;
/// WASI errno `ENOENT`.
const ENOENT: i32 = 44;

/// Imports shared by the test modules, and one page of memory.
const PRELUDE: &str = r#"
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $env_sizes (param i32 i32) (result i32)))
  (memory (export "memory") 1)
"#;

/// Writes a WAT module (WASI command) to a fresh file and returns its path; the directory
/// lives as long as the returned guard.
fn module(body: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("guest.wat");
    std::fs::write(&path, format!("(module {PRELUDE} {body})")).expect("write module");
    (dir, path)
}

fn job(program: &Path, limits: SandboxLimits) -> SandboxJob {
    SandboxJob {
        program: program.to_path_buf(),
        args: vec![],
        files: vec![],
        limits,
        read_only_paths: vec![],
        allow_children: false,
    }
}

/// `wall_ms` of wall-clock time and as much CPU time (whole seconds, at least 1): the wall clock
/// is the limit these tests mean.
fn limits(wall_ms: u64) -> SandboxLimits {
    SandboxLimits { wall_time: Duration::from_millis(wall_ms), cpu_seconds: wall_ms.div_ceil(1000).max(1), ..SandboxLimits::default() }
}

fn run(body: &str, limits: SandboxLimits) -> SandboxOutcome {
    let (_dir, path) = module(body);
    WasmSandbox::new().run(&job(&path, limits)).expect("the sandbox runs the module")
}

/// A `_start` that opens `path` relative to the first pre-open (fd 3, the work directory) with
/// `oflags` and `rights`, then (with the write right) writes one byte, and exits with the first
/// errno (0 on success).
fn open_module(path: &str, oflags: i32, rights: i64) -> String {
    let write = if rights & RIGHT_FD_WRITE != 0 { "" } else { "(call $exit (i32.const 0))" };
    let escaped: String = path.bytes().map(|b| format!("\\{b:02x}")).collect();
    format!(
        r#"(data (i32.const 64) "{escaped}")
        (data (i32.const 16) "x")
        (func (export "_start") (local $errno i32)
          (local.set $errno (call $open (i32.const 3) (i32.const 0) (i32.const 64) (i32.const {len})
            (i32.const {oflags}) (i64.const {rights}) (i64.const 0) (i32.const 0) (i32.const 8)))
          (if (local.get $errno) (then (call $exit (local.get $errno))))
          {write}
          ;; iovec {{ptr 16, len 1}} at 0
          (i32.store (i32.const 0) (i32.const 16))
          (i32.store (i32.const 4) (i32.const 1))
          (call $exit (call $write (i32.load (i32.const 8)) (i32.const 0) (i32.const 1) (i32.const 12))))"#,
        len = path.len()
    )
}

/// `oflags` bit `O_CREAT` and the rights `fd_read` / `fd_write` (wasi_snapshot_preview1).
const O_CREAT: i32 = 1;
const RIGHT_FD_READ: i64 = 1 << 1;
const RIGHT_FD_WRITE: i64 = 1 << 6;

#[test]
fn an_infinite_loop_is_stopped_at_the_deadline() {
    let out = run(r#"(func (export "_start") (loop $l (br $l)))"#, limits(300));
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.termination, Termination::Trapped);
    assert_eq!(out.limits_hit, [LimitHit::WallTime]);
    assert!(out.wall_seconds >= 0.3 && out.wall_seconds < 2.0, "{}", out.wall_seconds);
    assert!(out.ending().contains("wall-clock limit"), "{}", out.ending());
    assert!(!out.work_dir.exists(), "work dir removed");
}

#[test]
fn a_busy_guest_is_stopped_at_its_cpu_budget_before_the_wall_clock_limit() {
    let limits = SandboxLimits { cpu_seconds: 1, wall_time: Duration::from_secs(30), ..SandboxLimits::default() };
    let out = run(r#"(func (export "_start") (loop $l (br $l)))"#, limits);
    assert!(!out.timed_out, "{out:?}");
    assert_eq!(out.termination, Termination::Trapped);
    assert_eq!(out.limits_hit, [LimitHit::CpuTime]);
    assert!(out.cpu_seconds >= 1.0, "the guest thread's CPU clock: {}", out.cpu_seconds);
    assert!(out.wall_seconds < 20.0, "{}", out.wall_seconds);
    assert!(out.ending().contains("CPU time limit"), "{}", out.ending());
}

#[test]
fn a_guest_sleeping_in_a_host_call_is_cut_at_the_deadline() {
    // poll_oneoff with one relative clock subscription of 60 s (subscription at 0: userdata,
    // tag 0 = clock at 8, clock id 1 = monotonic at 16, timeout in ns at 24).
    let body = r#"(func (export "_start")
        (i32.store8 (i32.const 8) (i32.const 0))
        (i32.store (i32.const 16) (i32.const 1))
        (i64.store (i32.const 24) (i64.const 60000000000))
        (drop (call $poll (i32.const 0) (i32.const 128) (i32.const 1) (i32.const 256)))
        (call $exit (i32.const 0)))"#;
    let out = run(body, limits(300));
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.termination, Termination::Trapped);
    assert!(out.wall_seconds < 2.0, "{}", out.wall_seconds);
}

#[test]
fn a_memory_bomb_is_refused_by_the_limiter() {
    // Grows 1 MiB at a time until memory.grow fails, then exits 3.
    let body = r#"(func (export "_start")
        (loop $more
          (br_if $more (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
        (call $exit (i32.const 3)))"#;
    let limit = 32u64 << 20;
    let out = run(body, SandboxLimits { address_space_bytes: limit, ..limits(10_000) });
    assert_eq!(out.termination, Termination::Exited(3), "{out:?}");
    assert!(out.limits_hit.contains(&LimitHit::Memory));
    assert!(out.max_rss_bytes <= limit && out.max_rss_bytes >= limit - (1 << 20), "{}", out.max_rss_bytes);
    assert!(!out.timed_out);

    // A module whose initial memory already exceeds the limit never starts.
    let (_dir, path) = module("");
    std::fs::write(&path, r#"(module (memory (export "memory") 1024) (func (export "_start")))"#).expect("write");
    let out = WasmSandbox::new()
        .run(&job(&path, SandboxLimits { address_space_bytes: 1 << 20, ..limits(5_000) }))
        .expect("an outcome, not an error");
    assert_eq!(out.termination, Termination::Trapped);
    assert!(out.limits_hit.contains(&LimitHit::Memory), "{out:?}");
}

#[test]
fn files_outside_the_pre_opened_work_dir_cannot_be_read() {
    for path in ["/etc/passwd", "../../../../../../etc/passwd", "../"] {
        let out = run(&open_module(path, 0, RIGHT_FD_READ), limits(5_000));
        let Termination::Exited(errno) = out.termination else { panic!("{path}: {out:?}") };
        assert!([ENOTCAPABLE, EPERM, ENOENT].contains(&errno), "{path}: errno {errno}");
    }
}

#[test]
fn writing_outside_the_work_dir_is_denied_and_inside_works() {
    let name = common::unique("wasm-escape");
    // The work dir is a fresh directory in the system temp dir: `../name` would land there.
    let target = std::env::temp_dir().join(&name);
    let out = run(&open_module(&format!("../{name}"), O_CREAT, RIGHT_FD_WRITE), limits(5_000));
    let escaped = target.exists();
    let _ = std::fs::remove_file(&target);
    assert!(!escaped, "the guest created {}", target.display());
    assert!(matches!(out.termination, Termination::Exited(e) if e == ENOTCAPABLE || e == EPERM), "{out:?}");

    let out = run(&open_module("inside.txt", O_CREAT, RIGHT_FD_WRITE), limits(5_000));
    assert_eq!(out.termination, Termination::Exited(0), "{out:?}");
    assert!(!out.work_dir.exists(), "the work dir and what was written in it are removed");
}

#[test]
fn job_files_are_in_the_work_dir() {
    let (_dir, path) = module(&open_module("given.txt", 0, RIGHT_FD_READ));
    let mut present = job(&path, limits(5_000));
    present.files.push(("given.txt".into(), b"hello".to_vec()));
    let out = WasmSandbox::new().run(&present).expect("runs");
    assert_eq!(out.termination, Termination::Exited(0), "{out:?}");
    let out = WasmSandbox::new().run(&job(&path, limits(5_000))).expect("runs");
    assert_eq!(out.termination, Termination::Exited(ENOENT), "{out:?}");
}

#[test]
fn environment_holds_only_home_tmpdir_and_lang() {
    let body = r#"(func (export "_start")
        (drop (call $env_sizes (i32.const 0) (i32.const 4)))
        (call $exit (i32.load (i32.const 0))))"#;
    let out = run(body, limits(5_000));
    assert_eq!(out.termination, Termination::Exited(3), "{out:?}");
}

#[test]
fn output_is_captured_and_capped() {
    // Writes "y\n" 100 000 times to stdout and "e" once to stderr, then exits 0.
    let body = r#"(data (i32.const 16) "y\n")
      (data (i32.const 24) "e")
      (func (export "_start") (local $i i32)
        (i32.store (i32.const 0) (i32.const 16))
        (i32.store (i32.const 4) (i32.const 2))
        (loop $more
          (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br_if $more (i32.lt_u (local.get $i) (i32.const 100000))))
        (i32.store (i32.const 0) (i32.const 24))
        (i32.store (i32.const 4) (i32.const 1))
        (drop (call $write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))
        (call $exit (i32.const 0)))"#;
    let cap = 1000;
    let out = run(body, SandboxLimits { max_output_bytes: cap, ..limits(10_000) });
    assert_eq!(out.termination, Termination::Exited(0), "the guest never sees an error: {out:?}");
    assert_eq!(out.stdout.len(), cap);
    assert!(out.stdout.starts_with("y\ny\n"));
    assert!(out.stdout_truncated && !out.stderr_truncated);
    assert_eq!(out.stderr, "e");
    assert_eq!(out.limits_hit, [LimitHit::Output]);
}

#[test]
fn a_trap_is_an_outcome_with_its_message() {
    let out = run(r#"(func (export "_start") unreachable)"#, limits(5_000));
    assert_eq!(out.termination, Termination::Trapped);
    assert!(!out.timed_out);
    assert!(out.trap.as_deref().is_some_and(|t| t.contains("unreachable")), "{:?}", out.trap);
}

#[test]
fn a_module_file_is_compiled_once_per_process() {
    let (_dir, path) = module(r#"(func (export "_start") (call $exit (i32.const 7)))"#);
    let first = WasmSandbox::new().run(&job(&path, limits(5_000))).expect("runs");
    let compiled = cache_stats().compiled;
    let second = WasmSandbox::new().run(&job(&path, limits(5_000))).expect("runs");
    assert_eq!((first.termination, second.termination), (Termination::Exited(7), Termination::Exited(7)));
    assert_eq!(cache_stats().compiled, compiled, "the second run reused the compiled module");
    assert_eq!(module_from_file(&path).expect("cached").sha256, module_from_file(&path).expect("cached").sha256);
}

#[test]
fn broken_or_missing_modules_are_sandbox_errors() {
    let (_dir, path) = module("(func");
    assert!(matches!(WasmSandbox::new().run(&job(&path, limits(1_000))), Err(SandboxError::WasmCompile { .. })));
    let missing = PathBuf::from("/nonexistent/switchyard/guest.wasm");
    assert!(matches!(WasmSandbox::new().run(&job(&missing, limits(1_000))), Err(SandboxError::ModuleRead { .. })));
    // A module importing something WASI does not provide cannot be linked.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("importer.wat");
    std::fs::write(&path, r#"(module (import "env" "secret" (func)) (func (export "_start")))"#).expect("write");
    assert!(matches!(WasmSandbox::new().run(&job(&path, limits(1_000))), Err(SandboxError::WasmInstantiate { .. })));
}

// ---------------------------------------------------------------------------------------------
// Work-area attacks: descriptors, bytes, entries, and a kill in the middle of a run.

/// WASI errno values the guard answers with.
const EMFILE: u64 = 33;
const ENOSPC: u64 = 51;
const EFBIG: u64 = 22;
const ENOTSUP: u64 = 58;

/// Environment variable that turns [`victim_for_the_sigkill_test`] on in a child process:
/// `tmpfs` (the default sandbox) or `host` (a host work directory).
const VICTIM_ENV: &str = "SWITCHYARD_WASM_SIGKILL_VICTIM";
/// The module file the victim runs (written by the test, which removes it).
const VICTIM_MODULE_ENV: &str = "SWITCHYARD_WASM_SIGKILL_VICTIM_MODULE";

/// Marks the file the victim guest keeps open while it sleeps.
const VICTIM_FILE: &str = "victim-was-here.bin";

/// Serializes the tests that hold many descriptors or count this process's descriptors, so
/// that one's hundreds of descriptors do not show in another's count.
static FD_HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn fd_heavy() -> std::sync::MutexGuard<'static, ()> {
    FD_HEAVY.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Imports of the work-area test modules, `pages` of memory, and helpers: `$report` prints
/// four unsigned numbers and a newline to stdout; `$open` opens the `len` bytes at `name`
/// relative to the work directory (descriptor 3) with `oflags` and the read and write rights,
/// storing the descriptor at address 20. Scratch: 0..16 the output iovec, 16 nwritten, 20 the
/// opened descriptor, 64..128 a filestat, 256..512 the report text, 512.. names.
fn guard_prelude(pages: u32) -> String {
    format!(
        r#"
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_pwrite" (func $pwrite (param i32 i32 i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_renumber" (func $renumber (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_allocate" (func $allocate (param i32 i64 i64) (result i32)))
  (import "wasi_snapshot_preview1" "fd_filestat_get" (func $fstat (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_filestat_set_size" (func $set_size (param i32 i64) (result i32)))
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_create_directory" (func $mkdir (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_symlink" (func $symlink (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") {pages})
  (func $utoa (param $n i32) (param $at i32) (result i32)
    (local $len i32) (local $t i32) (local $i i32)
    (local.set $t (local.get $n))
    (local.set $len (i32.const 1))
    (block $counted (loop $count
      (br_if $counted (i32.lt_u (local.get $t) (i32.const 10)))
      (local.set $t (i32.div_u (local.get $t) (i32.const 10)))
      (local.set $len (i32.add (local.get $len) (i32.const 1)))
      (br $count)))
    (local.set $i (local.get $len))
    (local.set $t (local.get $n))
    (loop $digit
      (local.set $i (i32.sub (local.get $i) (i32.const 1)))
      (i32.store8 (i32.add (local.get $at) (local.get $i))
        (i32.add (i32.const 48) (i32.rem_u (local.get $t) (i32.const 10))))
      (local.set $t (i32.div_u (local.get $t) (i32.const 10)))
      (br_if $digit (local.get $i)))
    (i32.add (local.get $at) (local.get $len)))
  (func $report (param $a i32) (param $b i32) (param $c i32) (param $d i32)
    (local $end i32)
    (local.set $end (call $utoa (local.get $a) (i32.const 256)))
    (i32.store8 (local.get $end) (i32.const 32))
    (local.set $end (call $utoa (local.get $b) (i32.add (local.get $end) (i32.const 1))))
    (i32.store8 (local.get $end) (i32.const 32))
    (local.set $end (call $utoa (local.get $c) (i32.add (local.get $end) (i32.const 1))))
    (i32.store8 (local.get $end) (i32.const 32))
    (local.set $end (call $utoa (local.get $d) (i32.add (local.get $end) (i32.const 1))))
    (i32.store8 (local.get $end) (i32.const 10))
    (i32.store (i32.const 0) (i32.const 256))
    (i32.store (i32.const 4) (i32.sub (i32.add (local.get $end) (i32.const 1)) (i32.const 256)))
    (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16))))
  (func $open (param $name i32) (param $len i32) (param $oflags i32) (result i32)
    (call $path_open (i32.const 3) (i32.const 1) (local.get $name) (local.get $len) (local.get $oflags)
      (i64.const 66) (i64.const 0) (i32.const 0) (i32.const 20)))
"#
    )
}

/// Writes a work-area test module (WAT, WASI command) and returns its path with its guard.
fn guard_module(pages: u32, body: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("guard.wat");
    std::fs::write(&path, format!("(module {} {body})", guard_prelude(pages))).expect("write module");
    (dir, path)
}

/// The four numbers a module printed with `$report` (to stdout).
fn reported(out: &SandboxOutcome) -> [u64; 4] {
    four_numbers(&out.stdout, out)
}

fn four_numbers(text: &str, out: &SandboxOutcome) -> [u64; 4] {
    let numbers: Vec<u64> = text.split_whitespace().filter_map(|n| n.parse().ok()).collect();
    numbers.try_into().unwrap_or_else(|n| panic!("expected four numbers, got {n:?}: {out:?}"))
}

/// Descriptors this process has open.
fn own_fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// Opens `target.txt` 100 000 times without closing, counting successes and failures; then
/// closes the last one and opens once more. Reports (opened, failed, first errno, errno of the
/// open after the close).
const OPEN_BOMB: &str = r#"(data (i32.const 512) "target.txt")
  (func (export "_start") (local $i i32) (local $ok i32) (local $failed i32) (local $first i32)
    (local $e i32) (local $last i32)
    (loop $more
      (local.set $e (call $open (i32.const 512) (i32.const 10) (i32.const 0)))
      (if (local.get $e)
        (then
          (local.set $failed (i32.add (local.get $failed) (i32.const 1)))
          (if (i32.eqz (local.get $first)) (then (local.set $first (local.get $e)))))
        (else
          (local.set $ok (i32.add (local.get $ok) (i32.const 1)))
          (local.set $last (i32.load (i32.const 20)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $more (i32.lt_u (local.get $i) (i32.const 100000))))
    (drop (call $close (local.get $last)))
    (call $report (local.get $ok) (local.get $failed) (local.get $first)
      (call $open (i32.const 512) (i32.const 10) (i32.const 0)))
    (call $exit (i32.const 0)))"#;

#[test]
fn opening_one_file_100_000_times_stops_at_the_descriptor_limit() {
    let _heavy = fd_heavy();
    let (_dir, path) = guard_module(1, OPEN_BOMB);
    let mut bomb = job(&path, limits(60_000));
    bomb.files.push(("target.txt".into(), b"x".to_vec()));
    let limit = bomb.limits.max_open_files;
    assert_eq!(limit, 256, "the default");
    // Once on this thread first: its executor and the compiled module stay for the measured run.
    WasmSandbox::new().run(&bomb).expect("runs");

    let before = own_fd_count();
    let peak = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    let out = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(own_fd_count(), std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let out = WasmSandbox::new().run(&bomb).expect("runs");
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    });
    let after = own_fd_count();

    assert_eq!(out.termination, Termination::Exited(0), "{out:?}");
    assert_eq!(reported(&out), [limit, 100_000 - limit, EMFILE, 0], "opened, failed, first errno, reopen errno");
    assert!(out.limits_hit.contains(&LimitHit::OpenFiles), "{:?}", out.limits_hit);
    assert!(after.abs_diff(before) <= 4, "descriptors before {before}, after {after}");
    let peak = peak.into_inner();
    // The guest's 256, its work directory, and the sampler's own read of /proc/self/fd.
    assert!(peak <= before + limit as usize + 8, "peak {peak} with {before} before");
}

/// Writes 16 MiB files `f0`, `f1`, … until a write fails or does not write it all. Reports
/// (bytes written in all, errno that stopped it, the 16 MiB length as read back from its
/// iovec, size of `f0`).
const WRITE_BOMB: &str = r#"
  (func (export "_start") (local $i i32) (local $total i32) (local $e i32) (local $fd i32)
    (i32.store8 (i32.const 512) (i32.const 102))
    (i32.store (i32.const 32) (i32.const 65536))
    (i32.store (i32.const 36) (i32.const 16777216))
    (block $stop (loop $file
      (i32.store8 (i32.const 513) (i32.add (i32.const 48) (local.get $i)))
      (local.set $e (call $open (i32.const 512) (i32.const 2) (i32.const 1)))
      (br_if $stop (local.get $e))
      (local.set $fd (i32.load (i32.const 20)))
      (local.set $e (call $write (local.get $fd) (i32.const 32) (i32.const 1) (i32.const 16)))
      (br_if $stop (local.get $e))
      (local.set $total (i32.add (local.get $total) (i32.load (i32.const 16))))
      (drop (call $close (local.get $fd)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $file (i32.lt_u (local.get $i) (i32.const 10)))))
    (i32.store8 (i32.const 513) (i32.const 48))
    (drop (call $open (i32.const 512) (i32.const 2) (i32.const 0)))
    (drop (call $fstat (i32.load (i32.const 20)) (i32.const 64)))
    (call $report (local.get $total) (local.get $e) (i32.load (i32.const 36)) (i32.load (i32.const 96)))
    (call $exit (i32.const 0)))"#;

#[test]
fn writing_16_mib_files_in_a_loop_stops_at_the_work_area_size() {
    let _heavy = fd_heavy();
    let limit = 8u64 << 20;
    let (_dir, path) = guard_module(257, WRITE_BOMB);
    let bomb = job(&path, SandboxLimits { max_work_bytes: limit, ..limits(60_000) });
    for sandbox in [WasmSandbox::new(), WasmSandbox::new().with_host_work_dir()] {
        let out = sandbox.run(&bomb).expect("runs");
        assert_eq!(out.termination, Termination::Exited(0), "{out:?}");
        // The first write is cut to the 8 MiB left (a short write), the next one finds no room;
        // the guest's iovec is as it wrote it.
        assert_eq!(reported(&out), [limit, ENOSPC, 16 << 20, limit], "written, errno, iovec length, size of f0");
        assert!(out.limits_hit.contains(&LimitHit::WorkArea), "{:?}", out.limits_hit);
        assert!(!out.work_dir.exists());
    }
}

/// `fd_filestat_set_size` beyond the work area, within it, and `fd_allocate` of 1 GiB. Reports
/// the three errnos and 0.
const GROW_BOMB: &str = r#"(data (i32.const 512) "sparse")
  (func (export "_start") (local $fd i32)
    (drop (call $open (i32.const 512) (i32.const 6) (i32.const 1)))
    (local.set $fd (i32.load (i32.const 20)))
    (call $report
      (call $set_size (local.get $fd) (i64.const 8388609))
      (call $set_size (local.get $fd) (i64.const 8388608))
      (call $allocate (local.get $fd) (i64.const 0) (i64.const 1073741824))
      (i32.const 0))
    (call $exit (i32.const 0)))"#;

#[test]
fn files_cannot_grow_beyond_the_work_area_by_truncation_or_allocation() {
    let (_dir, path) = guard_module(1, GROW_BOMB);
    let out =
        WasmSandbox::new().run(&job(&path, SandboxLimits { max_work_bytes: 8 << 20, ..limits(10_000) })).expect("runs");
    // wasmtime-wasi 48 answers fd_allocate with ENOTSUP without touching the file; a pinned
    // upgrade that implements it must be guarded as well.
    assert_eq!(reported(&out), [EFBIG, 0, ENOTSUP, 0], "{out:?}");
    assert!(out.limits_hit.contains(&LimitHit::WorkArea));
}

/// Opens a work-area file, moves it onto descriptor 1 (stdout) with `fd_renumber` and writes
/// 100 bytes there twice. Reports (renumber errno, bytes of the first write, errno of the
/// second, 0).
const RENUMBER_BOMB: &str = r#"(data (i32.const 512) "moved")
  (func (export "_start") (local $e1 i32) (local $n1 i32) (local $e2 i32)
    (drop (call $open (i32.const 512) (i32.const 5) (i32.const 1)))
    (local.set $e1 (call $renumber (i32.load (i32.const 20)) (i32.const 1)))
    (i32.store (i32.const 32) (i32.const 1024))
    (i32.store (i32.const 36) (i32.const 100))
    (drop (call $write (i32.const 1) (i32.const 32) (i32.const 1) (i32.const 16)))
    (local.set $n1 (i32.load (i32.const 16)))
    (local.set $e2 (call $write (i32.const 1) (i32.const 32) (i32.const 1) (i32.const 16)))
    ;; Descriptor 1 is the file now: report through stderr, moved there.
    (drop (call $renumber (i32.const 2) (i32.const 1)))
    (call $report (local.get $e1) (local.get $n1) (local.get $e2) (i32.const 0))
    (call $exit (i32.const 0)))"#;

#[test]
fn renumbering_a_file_onto_stdout_does_not_escape_the_bytes_bound() {
    let (_dir, path) = guard_module(1, RENUMBER_BOMB);
    let out =
        WasmSandbox::new().run(&job(&path, SandboxLimits { max_work_bytes: 50, ..limits(10_000) })).expect("runs");
    // The report went to stderr's stream (renumbered onto descriptor 1); nothing of the file's
    // 50 bytes reached the captured stdout.
    assert_eq!(four_numbers(&out.stderr, &out), [0, 50, ENOSPC, 0], "{out:?}");
    assert_eq!(out.stdout, "");
    assert!(out.limits_hit.contains(&LimitHit::WorkArea));
}

/// Writes one byte at every 4 KiB of a sparse file with `fd_pwrite` (100 000 times at most)
/// until a write fails: each allocates a whole block for one counted byte. Reports (writes that
/// succeeded, errno that stopped them, 0, 0).
const SPARSE_BOMB: &str = r#"(data (i32.const 512) "sparse")
  (func (export "_start") (local $i i32) (local $e i32) (local $fd i32)
    (drop (call $open (i32.const 512) (i32.const 6) (i32.const 1)))
    (local.set $fd (i32.load (i32.const 20)))
    (i32.store (i32.const 32) (i32.const 1024))
    (i32.store (i32.const 36) (i32.const 1))
    (block $stop (loop $more
      (local.set $e (call $pwrite (local.get $fd) (i32.const 32) (i32.const 1)
        (i64.mul (i64.extend_i32_u (local.get $i)) (i64.const 4096)) (i32.const 16)))
      (br_if $stop (local.get $e))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $more (i32.lt_u (local.get $i) (i32.const 100000)))))
    (call $report (local.get $i) (local.get $e) (i32.const 0) (i32.const 0))
    (call $exit (i32.const 0)))"#;

#[test]
fn sparse_writes_cannot_allocate_more_than_the_work_area() {
    let limit = 4u64 << 20;
    let (_dir, path) = guard_module(1, SPARSE_BOMB);
    let bomb = job(&path, SandboxLimits { max_work_bytes: limit, max_work_entries: 16, ..limits(60_000) });
    for sandbox in [WasmSandbox::new(), WasmSandbox::new().with_host_work_dir()] {
        let out = sandbox.run(&bomb).expect("runs");
        let [blocks, errno, _, _] = reported(&out);
        // 4 MiB and a page per entry (the tmpfs size, and the usage a host directory may reach),
        // plus on a host directory the writes between two measurements of its usage.
        let allowed = (limit + 32 * 4096) / 4096 + 256 + 16;
        assert!(blocks <= allowed, "{blocks} blocks allocated, at most {allowed} allowed: {out:?}");
        assert!(blocks * 4096 >= limit, "stopped early, at {blocks} blocks");
        assert_eq!(errno, ENOSPC, "{out:?}");
        assert!(out.limits_hit.contains(&LimitHit::WorkArea), "{:?}", out.limits_hit);
    }
}

/// Creates empty files `e0`, `e1`, … (100 000 at most, `O_CREAT` as C's `fopen` does) until
/// one fails; then tries a directory and reopens `e0` with `O_CREAT`. Reports (files created,
/// errno that stopped it, mkdir errno, errno of the reopen).
const ENTRY_BOMB: &str = r#"(data (i32.const 600) "dir")
  (func (export "_start") (local $i i32) (local $e i32) (local $end i32)
    (i32.store8 (i32.const 512) (i32.const 101))
    (block $stop (loop $more
      (local.set $end (call $utoa (local.get $i) (i32.const 513)))
      (local.set $e (call $open (i32.const 512) (i32.sub (local.get $end) (i32.const 512)) (i32.const 1)))
      (br_if $stop (local.get $e))
      (drop (call $close (i32.load (i32.const 20))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $more (i32.lt_u (local.get $i) (i32.const 100000)))))
    (i32.store8 (i32.const 513) (i32.const 48))
    (call $report (local.get $i) (local.get $e)
      (call $mkdir (i32.const 3) (i32.const 600) (i32.const 3))
      (call $open (i32.const 512) (i32.const 2) (i32.const 1)))
    (call $exit (i32.const 0)))"#;

#[test]
fn creating_100_000_files_stops_at_the_entry_limit() {
    let _heavy = fd_heavy();
    let (_dir, path) = guard_module(1, ENTRY_BOMB);
    let bomb = job(&path, limits(60_000));
    let limit = bomb.limits.max_work_entries;
    assert_eq!(limit, 1024, "the default");
    for sandbox in [WasmSandbox::new(), WasmSandbox::new().with_host_work_dir()] {
        let out = sandbox.run(&bomb).expect("runs");
        assert_eq!(out.termination, Termination::Exited(0), "{out:?}");
        // Reopening an existing file with O_CREAT creates nothing and is not refused.
        assert_eq!(reported(&out), [limit, ENOSPC, ENOSPC, 0], "created, errno, mkdir, reopen");
        assert!(out.limits_hit.contains(&LimitHit::WorkArea), "{:?}", out.limits_hit);
        assert!(!out.work_dir.exists());
    }
}

#[test]
fn creating_a_file_that_exists_is_not_counted_and_keeps_open_semantics() {
    // A job file opened with O_CREAT | O_TRUNC 2 000 times (twice the entry limit), and the
    // work directory itself opened with O_CREAT: EISDIR, as without the guard.
    let body = r#"(data (i32.const 512) "given.txt")
      (data (i32.const 600) ".")
      (func (export "_start") (local $i i32) (local $e i32)
        (block $stop (loop $more
          (local.set $e (call $open (i32.const 512) (i32.const 9) (i32.const 9)))
          (br_if $stop (local.get $e))
          (drop (call $close (i32.load (i32.const 20))))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br_if $more (i32.lt_u (local.get $i) (i32.const 2000)))))
        (call $report (local.get $i) (local.get $e) (call $open (i32.const 600) (i32.const 1) (i32.const 1)) (i32.const 0))
        (call $exit (i32.const 0)))"#;
    let (_dir, path) = guard_module(1, body);
    let mut given = job(&path, limits(30_000));
    given.files.push(("given.txt".into(), b"contents".to_vec()));
    let out = WasmSandbox::new().run(&given).expect("runs");
    const EISDIR: u64 = 31;
    assert_eq!(reported(&out), [2000, 0, EISDIR, 0], "{out:?}");
    assert!(out.limits_hit.is_empty(), "{:?}", out.limits_hit);
}

#[test]
fn the_outcome_says_where_the_work_dir_was() {
    let (_dir, path) = module(r#"(func (export "_start") (call $exit (i32.const 0)))"#);
    let host = WasmSandbox::new().with_host_work_dir();
    let out = host.run(&job(&path, limits(5_000))).expect("runs");
    assert!(
        out.isolation.notes.iter().any(|n| n.starts_with("work dir: a host directory")),
        "{:?}",
        out.isolation.notes
    );
    assert!(host.describe(&out).contains("work dir: host directory"), "{}", host.describe(&out));
    assert!(!out.work_dir.exists());

    let sandbox = WasmSandbox::new();
    let out = sandbox.run(&job(&path, limits(5_000))).expect("runs");
    let described = sandbox.describe(&out);
    if described.contains("work dir: private tmpfs") {
        assert!(!out.work_dir.exists(), "a private tmpfs is never visible on the host");
    } else {
        eprintln!("note: no private tmpfs here: {described}");
        assert!(
            described.contains("work dir: host directory") && described.contains("no private tmpfs: "),
            "{described}"
        );
    }
}

/// `switchyard-work-*` directories under the temp dir whose marker names `pid`.
fn marked_work_dirs_of(pid: u32) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return Vec::new() };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(residue::WORK_DIR_PREFIX))
        .filter(|e| {
            std::fs::read_to_string(e.path().join(residue::MARKER_FILE))
                .is_ok_and(|m| m.lines().nth(1).and_then(|l| l.split_whitespace().next()) == Some(&pid.to_string()))
        })
        .map(|e| e.path())
        .collect()
}

/// The descriptor of `pid` whose target ends in [`VICTIM_FILE`], as `/proc/<pid>/fd/<n>`.
fn victim_fd(pid: u32) -> Option<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|fd| std::fs::read_link(fd).is_ok_and(|target| target.to_string_lossy().ends_with(VICTIM_FILE)))
}

/// Whether the file behind a `/proc/<pid>/fd/<n>` link is on a tmpfs.
fn on_tmpfs(fd_link: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(fd_link.as_os_str().as_bytes()) else { return false };
    // SAFETY: statfs is plain data that statfs(2) fills; `path` is NUL-terminated.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers for the duration of the call.
    let rc = unsafe { libc::statfs(path.as_ptr(), &mut stat) };
    rc == 0 && stat.f_type == libc::TMPFS_MAGIC
}

/// The victim's guest: writes 1 MiB into the work directory, keeps the file open and sleeps
/// for a minute.
fn victim_body() -> String {
    format!(
        r#"(data (i32.const 512) "{VICTIM_FILE}")
        (func (export "_start")
          (drop (call $open (i32.const 512) (i32.const {len}) (i32.const 1)))
          (i32.store (i32.const 32) (i32.const 65536))
          (i32.store (i32.const 36) (i32.const 1048576))
          (drop (call $write (i32.load (i32.const 20)) (i32.const 32) (i32.const 1) (i32.const 16)))
          ;; poll_oneoff: one relative monotonic clock subscription of 60 s at 128.
          (i32.store8 (i32.const 136) (i32.const 0))
          (i32.store (i32.const 144) (i32.const 1))
          (i64.store (i32.const 152) (i64.const 60000000000))
          (drop (call $poll (i32.const 128) (i32.const 192) (i32.const 1) (i32.const 240)))
          (call $exit (i32.const 0)))"#,
        len = VICTIM_FILE.len()
    )
}

/// In a child started by [`a_killed_run_leaves_no_work_dir_behind`] (with [`VICTIM_ENV`] set),
/// runs the guest of [`victim_body`], whose module file the test wrote and named in
/// [`VICTIM_MODULE_ENV`] (the victim is killed, so a directory of its own would never be
/// removed); does nothing otherwise.
#[test]
fn victim_for_the_sigkill_test() {
    let Ok(mode) = std::env::var(VICTIM_ENV) else { return };
    let path = PathBuf::from(std::env::var_os(VICTIM_MODULE_ENV).expect("the victim's module"));
    let sandbox = if mode == "host" { WasmSandbox::new().with_host_work_dir() } else { WasmSandbox::new() };
    let out = sandbox.run(&job(&path, limits(120_000))).expect("runs");
    panic!("the victim was meant to be killed, but its run ended: {out:?}");
}

/// Starts this test binary as a victim in `mode`, waits until its guest has written its file,
/// kills it with SIGKILL and returns (its pid, whether the file was on a tmpfs, the marked host
/// directories it had).
fn kill_a_victim(mode: &str) -> (u32, bool, Vec<PathBuf>) {
    let exe = std::env::current_exe().expect("test binary");
    // Written here, where the guard outlives the victim and removes it.
    let (_module_dir, module) = guard_module(17, &victim_body());
    let mut child = std::process::Command::new(exe)
        .args(["--exact", "victim_for_the_sigkill_test", "--nocapture", "--test-threads=1"])
        .env(VICTIM_ENV, mode)
        .env(VICTIM_MODULE_ENV, &module)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the victim");
    let pid = child.id();
    let waited = std::time::Instant::now();
    let fd = loop {
        if let Some(fd) = victim_fd(pid) {
            break fd;
        }
        if waited.elapsed() > Duration::from_secs(60) || child.try_wait().ok().flatten().is_some() {
            let _ = child.kill();
            let out = child.wait_with_output().expect("victim output");
            panic!("the victim's guest never opened its file: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let tmpfs = on_tmpfs(&fd);
    let dirs = marked_work_dirs_of(pid);
    // SAFETY: kill takes a pid and a signal; `pid` is our unreaped child.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
    let status = child.wait().expect("reap the victim");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    (pid, tmpfs, dirs)
}

#[test]
fn a_killed_run_leaves_no_work_dir_behind() {
    // Default sandbox: a private tmpfs where the kernel allows one, else a host directory.
    let (pid, tmpfs, dirs) = kill_a_victim("tmpfs");
    if dirs.is_empty() {
        assert!(tmpfs, "no host directory, so the work dir was the private tmpfs");
        assert!(marked_work_dirs_of(pid).is_empty());
        let leftover: Vec<_> = std::fs::read_dir(std::env::temp_dir())
            .expect("temp dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&format!("{}{pid}-", residue::WORK_DIR_PREFIX)))
            .collect();
        assert!(leftover.is_empty(), "{leftover:?}");
    } else {
        eprintln!("note: the victim fell back to a host work directory (no private tmpfs here)");
        assert!(!common::is_root() || !tmpfs, "a host dir, not the tmpfs");
    }

    // A host work directory stays after the kill, until the startup sweep removes it.
    let (pid, _, dirs) = kill_a_victim("host");
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(dirs[0].join("work").join(VICTIM_FILE).exists(), "the victim's file is there until the sweep");
    let report = residue::sweep_stale_work_dirs(&std::env::temp_dir());
    assert!(report.removed.contains(&dirs[0]), "{report:?}");
    assert!(!dirs[0].exists() && marked_work_dirs_of(pid).is_empty());
}

// ---------------------------------------------------------------------------------------------
// The same attacks from CPython (skipped without python.wasm).

/// A job running `code` in the installed CPython, or `None` with a note.
fn python_job(code: &str, limits: SandboxLimits) -> Option<SandboxJob> {
    let Some(python) = switchyard_tools::python_wasm_path() else {
        eprintln!("note: skipping the CPython variant: python.wasm is not installed");
        return None;
    };
    Some(SandboxJob {
        program: python,
        args: vec!["-c".into(), code.into()],
        files: vec![("target.txt".into(), b"x".to_vec())],
        limits,
        read_only_paths: vec![],
        allow_children: false,
    })
}

#[test]
fn cpython_opening_a_file_100_000_times_gets_emfile_at_the_limit() {
    let _heavy = fd_heavy();
    let code = "import errno\nfs = []\nerr = None\ntry:\n    for i in range(100000):\n        fs.append(open('/work/target.txt'))\nexcept OSError as e:\n    err = errno.errorcode.get(e.errno)\nprint(len(fs), err)\n";
    let Some(bomb) = python_job(code, limits(60_000)) else { return };
    WasmSandbox::new().run(&bomb).expect("warm-up");
    let before = own_fd_count();
    let out = WasmSandbox::new().run(&bomb).expect("runs");
    let after = own_fd_count();
    assert_eq!(out.termination, Termination::Exited(0), "{out:?}");
    let mut words = out.stdout.split_whitespace();
    let opened: u64 = words.next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{out:?}"));
    assert_eq!(words.next(), Some("EMFILE"), "{out:?}");
    // CPython keeps none of its own descriptors open at this point.
    assert_eq!(opened, bomb.limits.max_open_files, "{out:?}");
    assert!(out.limits_hit.contains(&LimitHit::OpenFiles));
    assert!(after.abs_diff(before) <= 4, "descriptors before {before}, after {after}");
}

#[test]
fn cpython_writing_16_mib_chunks_gets_enospc_at_the_work_area_size() {
    let limit = 8u64 << 20;
    let code = "import errno, os\ntotal = 0\nerr = None\ntry:\n    for i in range(10):\n        with open(f'/work/f{i}', 'wb') as f:\n            total += f.write(bytes(16 << 20))\nexcept OSError as e:\n    err = errno.errorcode.get(e.errno)\nsizes = sum(os.path.getsize(f'/work/{n}') for n in os.listdir('/work') if n.startswith('f'))\nprint(total, err, sizes)\n";
    let Some(bomb) =
        python_job(code, SandboxLimits { max_work_bytes: limit, address_space_bytes: 256 << 20, ..limits(60_000) })
    else {
        return;
    };
    let out = WasmSandbox::new().run(&bomb).expect("runs");
    assert_eq!(out.termination, Termination::Exited(0), "{out:?}");
    let words: Vec<&str> = out.stdout.split_whitespace().collect();
    // The buffered writer's write raised after the short write: `total` was never added to.
    assert_eq!(words.get(1).copied(), Some("ENOSPC"), "{out:?}");
    assert_eq!(words.get(2).and_then(|n| n.parse::<u64>().ok()), Some(limit), "bytes on disk: {out:?}");
    assert!(out.limits_hit.contains(&LimitHit::WorkArea));
}
