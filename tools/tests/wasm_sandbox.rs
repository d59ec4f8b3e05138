//! Integration tests of the WebAssembly sandbox with small WASI command modules written in WAT
//! (no python needed): each asserts that a denial happens and how it is reported.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

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
    SandboxJob { program: program.to_path_buf(), args: vec![], files: vec![], limits, read_only_paths: vec![], allow_children: false }
}

fn limits(wall_ms: u64) -> SandboxLimits {
    SandboxLimits { wall_time: Duration::from_millis(wall_ms), ..SandboxLimits::default() }
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
    let out = WasmSandbox::new().run(&job(&path, SandboxLimits { address_space_bytes: 1 << 20, ..limits(5_000) }))
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

/// Temporary: CPython start-up time under the sandbox (median of 10 runs of `-c pass`).
#[test]
#[ignore]
fn zz_bench_python_startup() {
    let Some(python) = switchyard_tools::python_wasm_path() else { eprintln!("no python.wasm"); return };
    let run = |args: &[&str]| {
        let job = SandboxJob {
            program: python.clone(),
            args: args.iter().map(|s| s.to_string()).collect(),
            files: vec![],
            limits: limits(30_000),
            read_only_paths: vec![],
            allow_children: false,
        };
        let started = std::time::Instant::now();
        let out = WasmSandbox::new().run(&job).expect("runs");
        assert_eq!(out.termination, Termination::Exited(0), "{out:?}");
        started.elapsed().as_secs_f64()
    };
    for (name, args) in [
        ("pass", vec!["-c", "pass"]),
        ("200 files", vec!["-c", "import os\nfor i in range(200):\n  open(f'/work/f{i}','w').write('x'*1000)\nprint(len(os.listdir('/work')))"]),
    ] {
        run(&args);
        let mut times: Vec<f64> = (0..10).map(|_| run(&args)).collect();
        times.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
        eprintln!("BENCH {name}: median {:.1} ms, min {:.1} ms, max {:.1} ms", times[5] * 1e3, times[0] * 1e3, times[9] * 1e3);
    }
}
