//! The WebAssembly backend of the [`Sandbox`] seam, on wasmtime.
//!
//! Owns the process-wide engine, the compiled-module cache, the WASI preview 1 command runner
//! ([`WasmSandbox`]) and the runner of import-free compute modules ([`run_compute`]). Must not
//! depend on the tools built on it, the runtime or any model code.
//!
//! Confinement of a guest:
//!
//! * **time** — epoch interruption: one engine-wide ticker thread increments the epoch every
//!   [`EPOCH_TICK`]; at each tick a running guest checks the wall-clock deadline of its job and
//!   traps (`interrupt`) once it has passed. WASI calls run asynchronously under a
//!   `tokio::time::timeout` with the same deadline, so a guest blocked in a host call (a
//!   `sleep`) is cut as well. Either way the outcome has `timed_out` and
//!   [`LimitHit::WallTime`]: a timeout is a result, never a crash.
//! * **memory** — a [`wasmtime::ResourceLimiter`] refuses any linear memory beyond the job's
//!   `address_space_bytes` (the guest sees a failed `memory.grow`, e.g. Python's
//!   `MemoryError`) and bounds instances, tables, memories and table elements; a refusal is
//!   reported as [`LimitHit::Memory`].
//! * **filesystem** — WASI preview 1 with exactly the pre-opened directories the job is given:
//!   a fresh private work directory at [`GUEST_WORK_DIR`] (read-write, removed afterwards) and
//!   the sandbox's read-only directories. Any other path (`/etc/passwd`, `/tmp/x`) resolves to no
//!   pre-open and fails with `ENOTCAPABLE`/`ENOENT` inside the guest.
//! * **network** — none: preview 1 has no socket creation and no socket is pre-opened.
//! * **environment** — only `HOME` and `TMPDIR` (the work directory) and `LANG`; stdin is
//!   empty; stdout and stderr are captured up to `max_output_bytes` each, the rest is dropped
//!   (the guest never sees an error for it) and the truncation reported.
//! * **randomness** — the guest's random bytes are a deterministic function of the job (module,
//!   arguments and files), so a run is reproducible (e.g. Python's hash seed and `random`).
//! * **processes** — a guest is one thread of the caller: it cannot fork, so the process and
//!   CPU limits of a job are moot; CPU time is at most the wall time.
//! * **not enforced** — a file-size limit: writes into the work directory are bounded only by
//!   the wall-clock limit (noted in every outcome).
//!
//! Modules are compiled once per process: a cache keyed by the SHA-256 of the module holds the
//! compiled [`Module`] (and, for command modules, the linked [`InstancePre`]); concurrent first
//! uses wait for one compilation. Compiled code of large module *files* (at least
//! [`DISK_CACHE_MIN_BYTES`]) is also kept on disk under [`cache_home`]`/wasm-cache`, so later
//! processes skip Cranelift (about 20 s for CPython here; loading takes 0.2 s).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::io;
use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use wasmtime::{
    Config, Engine, Instance, InstancePre, Linker, Module, ResourceLimiter, Store, StoreLimits, StoreLimitsBuilder,
    Trap, UpdateDeadline,
};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{Deterministic, FsPerms, I32Exit, WasiCtxBuilder};

use super::{Isolation, LimitHit, Sandbox, SandboxError, SandboxJob, SandboxOutcome, Termination, validate};

/// Guest path at which a job's private work directory is pre-opened.
pub const GUEST_WORK_DIR: &str = "/work";

/// Interval of the epoch ticker: a guest notices its deadline at most this late (plus the time
/// to reach the next loop header or function entry, where Cranelift places epoch checks).
/// Assumption: 10 ms, a hundredth of the shortest timeouts the tools declare (1 s).
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Environment variable naming Switchyard's data directory (see [`cache_home`]).
pub const HOME_ENV: &str = "SWITCHYARD_HOME";

/// Native stack for WebAssembly frames (wasmtime's default is 512 KiB). CPython's recursion
/// runs its C frames on this stack; 8 MiB matches the usual main-thread stack of Linux
/// (`ulimit -s`), so deep-but-legal recursion behaves as it does natively. An overflow traps.
pub const MAX_WASM_STACK: usize = 8 << 20;

/// Limits on the non-memory resources of one store (instances, tables, memories, table
/// elements). Assumptions: generous for a single-module guest (CPython's one table has about
/// 10⁴ entries), small enough that a hostile module cannot make the host allocate without bound.
const MAX_INSTANCES: usize = 4;
const MAX_TABLES: usize = 16;
const MAX_MEMORIES: usize = 4;
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// Smallest module file whose compiled code is kept on disk. Assumption: below 1 MiB Cranelift
/// takes milliseconds (test modules, small tools), so caching would only litter the directory;
/// CPython (26 MB) takes about 20 s here.
pub const DISK_CACHE_MIN_BYTES: usize = 1 << 20;

/// Bytes a guest may hand to a captured stream per write permit (WASI asks before each write).
const WRITE_PERMIT: usize = 1 << 20;

/// Length of the deterministic byte cycle a guest draws its random numbers from. Assumption:
/// 4 KiB covers CPython's start-up draws (hash seed 24 bytes, `random` seeding 2.5 KiB) without
/// repetition.
const RANDOM_CYCLE_BYTES: usize = 4096;

/// SHA-256 of a module (its binary, or its text for WAT modules).
pub type ModuleHash = [u8; 32];

/// Lower-case hexadecimal of a hash.
pub fn hex(hash: &[u8]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> ModuleHash {
    Sha256::digest(bytes).into()
}

// ---------------------------------------------------------------------------------------------
// Engine

static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();

/// The process-wide engine (epoch interruption on, [`MAX_WASM_STACK`]), created on first use
/// together with its epoch ticker thread.
pub fn engine() -> Result<&'static Engine, SandboxError> {
    match ENGINE.get_or_init(build_engine) {
        Ok(engine) => Ok(engine),
        Err(reason) => Err(SandboxError::WasmEngine(reason.clone())),
    }
}

fn build_engine() -> Result<Engine, String> {
    let mut config = Config::new();
    config
        .epoch_interruption(true)
        .max_wasm_stack(MAX_WASM_STACK)
        // Async calls run on a fiber whose stack must hold the wasm stack plus host frames.
        .async_stack_size(MAX_WASM_STACK + (2 << 20));
    let engine = Engine::new(&config).map_err(|e| format!("{e:#}"))?;
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("switchyard-wasm-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => return,
                }
            }
        })
        .map_err(|e| format!("cannot start the epoch ticker: {e}"))?;
    Ok(engine)
}

// ---------------------------------------------------------------------------------------------
// Module cache

/// How often the cache compiled, loaded from disk, or answered from memory (process totals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Modules compiled by Cranelift.
    pub compiled: u64,
    /// Modules loaded from compiled code on disk.
    pub loaded_from_disk: u64,
    /// Requests answered by a module already in memory.
    pub hits: u64,
    /// Failures to write compiled code to disk (the module still works).
    pub disk_write_failures: u64,
}

static COMPILED: AtomicU64 = AtomicU64::new(0);
static LOADED_FROM_DISK: AtomicU64 = AtomicU64::new(0);
static HITS: AtomicU64 = AtomicU64::new(0);
static DISK_WRITE_FAILURES: AtomicU64 = AtomicU64::new(0);

/// The cache counters so far.
pub fn cache_stats() -> CacheStats {
    CacheStats {
        compiled: COMPILED.load(Ordering::Relaxed),
        loaded_from_disk: LOADED_FROM_DISK.load(Ordering::Relaxed),
        hits: HITS.load(Ordering::Relaxed),
        disk_write_failures: DISK_WRITE_FAILURES.load(Ordering::Relaxed),
    }
}

type ModuleCell = Arc<OnceLock<Result<Module, String>>>;

/// Compiled modules by hash; a cell is filled once, other users of the same hash wait for it.
static MODULES: Mutex<BTreeMap<ModuleHash, ModuleCell>> = Mutex::new(BTreeMap::new());

/// (path, length, modification time) of module files already hashed, so a file is read and
/// hashed once per process while it stays unchanged.
type FileKey = (PathBuf, u64, Option<SystemTime>);
static FILES: Mutex<BTreeMap<FileKey, ModuleHash>> = Mutex::new(BTreeMap::new());

/// Command modules linked against WASI, by hash.
static COMMANDS: Mutex<BTreeMap<ModuleHash, InstancePre<CommandState>>> = Mutex::new(BTreeMap::new());

/// A lock that survives a panic of another holder (the maps stay consistent: every insertion
/// is a single call).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A compiled module and the hash it is cached under.
#[derive(Clone)]
pub struct LoadedModule {
    /// The compiled module.
    pub module: Module,
    /// SHA-256 of the module file (or text).
    pub sha256: ModuleHash,
    /// A name for messages (the file path, or the name given for a WAT module).
    pub name: String,
}

impl std::fmt::Debug for LoadedModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModule").field("name", &self.name).field("sha256", &hex(&self.sha256)).finish()
    }
}

fn cached(hash: ModuleHash, name: &str, build: impl FnOnce() -> Result<Module, String>) -> Result<LoadedModule, SandboxError> {
    let cell = lock(&MODULES).entry(hash).or_default().clone();
    let mut built_here = false;
    let result = cell.get_or_init(|| {
        built_here = true;
        build()
    });
    if !built_here {
        HITS.fetch_add(1, Ordering::Relaxed);
    }
    match result {
        Ok(module) => Ok(LoadedModule { module: module.clone(), sha256: hash, name: name.to_string() }),
        Err(reason) => Err(SandboxError::WasmCompile { module: name.to_string(), reason: reason.clone() }),
    }
}

/// The module in the WebAssembly file at `path`, compiled once per process (and loaded from the
/// disk cache when an earlier process compiled it).
pub fn module_from_file(path: &Path) -> Result<LoadedModule, SandboxError> {
    let engine = engine()?;
    let read_error = |source| SandboxError::ModuleRead { path: path.display().to_string(), source };
    let meta = std::fs::metadata(path).map_err(read_error)?;
    let key: FileKey = (path.to_path_buf(), meta.len(), meta.modified().ok());
    let known = lock(&FILES).get(&key).copied();
    let (hash, bytes) = match known {
        Some(hash) => (hash, None),
        None => {
            let bytes = std::fs::read(path).map_err(read_error)?;
            let hash = sha256(&bytes);
            lock(&FILES).insert(key, hash);
            (hash, Some(bytes))
        }
    };
    let name = path.display().to_string();
    cached(hash, &name, || {
        let bytes = match bytes {
            Some(bytes) => bytes,
            None => std::fs::read(path).map_err(|e| format!("cannot read {name}: {e}"))?,
        };
        // The file may have changed between hashing and this read: compile only what was hashed.
        if sha256(&bytes) != hash {
            return Err(format!("{name} changed while it was being loaded"));
        }
        load_or_compile(engine, &bytes, hash)
    })
}

/// The module in WebAssembly text `wat` (e.g. a tool shipped with the project), compiled once
/// per process.
pub fn module_from_wat(name: &str, wat: &str) -> Result<LoadedModule, SandboxError> {
    let engine = engine()?;
    cached(sha256(wat.as_bytes()), name, || {
        COMPILED.fetch_add(1, Ordering::Relaxed);
        Module::new(engine, wat).map_err(|e| format!("{e:#}"))
    })
}

/// Switchyard's data directory: `$SWITCHYARD_HOME`, else `$HOME/.cache/switchyard`.
pub fn cache_home() -> Option<PathBuf> {
    if let Some(home) = std::env::var_os(HOME_ENV).filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(home));
    }
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|home| PathBuf::from(home).join(".cache").join("switchyard"))
}

/// Where compiled code of `hash` lives on disk for this engine (its configuration and
/// wasmtime's version are part of the name, so an incompatible artifact is never picked).
fn disk_cache_path(engine: &Engine, hash: ModuleHash) -> Option<PathBuf> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let dir = cache_home()?.join("wasm-cache");
    Some(dir.join(format!("{}-{:016x}.cwasm", hex(&hash), hasher.finish())))
}

fn load_or_compile(engine: &Engine, bytes: &[u8], hash: ModuleHash) -> Result<Module, String> {
    let cache_path = if bytes.len() >= DISK_CACHE_MIN_BYTES { disk_cache_path(engine, hash) } else { None };
    if let Some(module) = cache_path.as_deref().and_then(|path| load_precompiled(engine, path)) {
        LOADED_FROM_DISK.fetch_add(1, Ordering::Relaxed);
        return Ok(module);
    }
    COMPILED.fetch_add(1, Ordering::Relaxed);
    let module = Module::new(engine, bytes).map_err(|e| format!("{e:#}"))?;
    if let Some(path) = cache_path
        && store_precompiled(&module, &path).is_err()
    {
        DISK_WRITE_FAILURES.fetch_add(1, Ordering::Relaxed);
    }
    Ok(module)
}

/// Compiled code from the disk cache, if present and intact. The artifact is accepted only when
/// its SHA-256 matches the checksum written next to it (a truncated or corrupted file is
/// recompiled, never executed).
fn load_precompiled(engine: &Engine, path: &Path) -> Option<Module> {
    let expected = std::fs::read_to_string(path.with_extension("cwasm.sha256")).ok()?;
    let bytes = std::fs::read(path).ok()?;
    if hex(&sha256(&bytes)) != expected.trim() {
        return None;
    }
    // SAFETY: `deserialize` requires bytes produced by `Module::serialize` of a compatible
    // engine. The file is ours: written by `store_precompiled` below into Switchyard's private
    // cache directory under a name that includes the engine's compatibility hash, renamed into
    // place only when complete, and checked against its recorded SHA-256 just above; wasmtime
    // also checks its header for the version and configuration. Someone able to replace both
    // files could equally replace this program.
    unsafe { Module::deserialize(engine, &bytes) }.ok()
}

fn store_precompiled(module: &Module, path: &Path) -> io::Result<()> {
    let bytes = module.serialize().map_err(|e| io::Error::other(format!("{e:#}")))?;
    let dir = path.parent().ok_or_else(|| io::Error::other("cache path has no parent"))?;
    std::fs::create_dir_all(dir)?;
    let tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::fs::write(tmp.path(), &bytes)?;
    let sum = tempfile::NamedTempFile::new_in(dir)?;
    std::fs::write(sum.path(), hex(&sha256(&bytes)))?;
    // Checksum first: a reader that finds the artifact finds its checksum.
    sum.persist(path.with_extension("cwasm.sha256")).map_err(|e| e.error)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Resource limiter

/// The resource limiter of a store: [`StoreLimits`] for counts and table sizes, plus a linear
/// memory limit that records refusals and the largest memory granted.
pub struct MemoryLimiter {
    limits: StoreLimits,
    memory_bytes: usize,
    /// Largest linear memory granted, in bytes.
    pub peak_bytes: usize,
    /// A memory growth was refused because of the limit.
    pub denied: bool,
}

impl MemoryLimiter {
    /// A limiter allowing `memory_bytes` per linear memory.
    pub fn new(memory_bytes: u64) -> Self {
        let memory_bytes = usize::try_from(memory_bytes).unwrap_or(usize::MAX);
        let limits = StoreLimitsBuilder::new()
            .memory_size(memory_bytes)
            .table_elements(MAX_TABLE_ELEMENTS)
            .instances(MAX_INSTANCES)
            .tables(MAX_TABLES)
            .memories(MAX_MEMORIES)
            .build();
        Self { limits, memory_bytes, peak_bytes: 0, denied: false }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let granted = self.limits.memory_growing(current, desired, maximum)?;
        if granted {
            self.peak_bytes = self.peak_bytes.max(desired);
        } else if desired > self.memory_bytes {
            self.denied = true;
        }
        Ok(granted)
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.limits.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

/// Makes `store` trap with [`Trap::Interrupt`] at the first epoch tick after `deadline`.
fn arm_deadline<T: 'static>(store: &mut Store<T>, deadline: Instant) {
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        Ok(if Instant::now() >= deadline { UpdateDeadline::Interrupt } else { UpdateDeadline::Continue(1) })
    });
}

fn is_interrupt(error: &wasmtime::Error) -> bool {
    error.downcast_ref::<Trap>() == Some(&Trap::Interrupt)
}

// ---------------------------------------------------------------------------------------------
// Captured output

/// A guest's stdout or stderr: the first `cap` bytes are kept, the rest dropped and flagged.
/// Writes never fail, so a guest behaves as it would with a pipe that is read to the end.
#[derive(Clone)]
pub struct CappedOutput {
    inner: Arc<Mutex<Captured>>,
}

struct Captured {
    kept: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl CappedOutput {
    /// An empty capture keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Self { inner: Arc::new(Mutex::new(Captured { kept: Vec::new(), cap, truncated: false })) }
    }

    fn push(&self, bytes: &[u8]) {
        let mut captured = lock(&self.inner);
        let room = captured.cap.saturating_sub(captured.kept.len());
        if bytes.len() > room {
            captured.truncated = true;
        }
        captured.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// The kept bytes (lossy UTF-8) and whether anything was dropped.
    pub fn contents(&self) -> (String, bool) {
        let captured = lock(&self.inner);
        (String::from_utf8_lossy(&captured.kept).into_owned(), captured.truncated)
    }
}

impl IsTerminal for CappedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for CappedOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

impl tokio::io::AsyncWrite for CappedOutput {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

// ---------------------------------------------------------------------------------------------
// WASI command runner

/// Store state of a WASI command run.
pub struct CommandState {
    wasi: WasiP1Ctx,
    limiter: MemoryLimiter,
}

/// Runs WASI preview 1 command modules (`_start`): the job's `program` is the module file, its
/// `args` follow the module's file stem as `argv[0]`, its files are placed in the work
/// directory, pre-opened at [`GUEST_WORK_DIR`]. See the module documentation for the limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WasmSandbox {
    /// Host directories pre-opened read-only, as (host path, guest path).
    pub read_only_dirs: Vec<(PathBuf, String)>,
}

impl WasmSandbox {
    /// A sandbox pre-opening only each job's work directory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a host directory the guest may read (not write) at `guest_path`.
    pub fn with_read_only_dir(mut self, host_path: impl Into<PathBuf>, guest_path: impl Into<String>) -> Self {
        self.read_only_dirs.push((host_path.into(), guest_path.into()));
        self
    }
}

impl Sandbox for WasmSandbox {
    fn name(&self) -> &'static str {
        "wasm"
    }

    fn run(&self, job: &SandboxJob) -> Result<SandboxOutcome, SandboxError> {
        validate(job)?;
        let loaded = module_from_file(&job.program)?;
        run_command(self, &loaded, job)
    }

    fn describe(&self, outcome: &SandboxOutcome) -> String {
        let mut parts = vec![
            format!("wasmtime {}, WASI preview 1", wasmtime_version()),
            "network: none (no sockets)".to_string(),
            if self.read_only_dirs.is_empty() {
                "filesystem: work dir only".to_string()
            } else {
                let dirs: Vec<&str> = self.read_only_dirs.iter().map(|(_, guest)| guest.as_str()).collect();
                format!("filesystem: work dir + read-only {}", dirs.join(", "))
            },
            "processes: none (one guest thread)".to_string(),
        ];
        parts.extend(outcome.isolation.notes.iter().cloned());
        parts.join("; ")
    }
}

/// The wasmtime version this crate is built against (pinned in its manifest).
pub fn wasmtime_version() -> &'static str {
    "48.0.8"
}

/// Notes every wasm outcome carries: limits of a process that have no wasm counterpart.
const COMMAND_NOTES: [&str; 1] = ["no file-size limit (writes bounded by the wall-clock limit)"];

/// The linked (not yet instantiated) command module, cached per module.
fn command_pre(loaded: &LoadedModule) -> Result<InstancePre<CommandState>, SandboxError> {
    if let Some(pre) = lock(&COMMANDS).get(&loaded.sha256) {
        return Ok(pre.clone());
    }
    let failed = |e: wasmtime::Error| SandboxError::WasmInstantiate { module: loaded.name.clone(), reason: format!("{e:#}") };
    let mut linker: Linker<CommandState> = Linker::new(engine()?);
    wasmtime_wasi::p1::add_to_linker_async(&mut linker, |state| &mut state.wasi).map_err(failed)?;
    let pre = linker.instantiate_pre(&loaded.module).map_err(failed)?;
    lock(&COMMANDS).insert(loaded.sha256, pre.clone());
    Ok(pre)
}

/// The guest's random bytes: a SHA-256 counter-mode stream keyed by everything the job is.
fn random_cycle(loaded: &LoadedModule, job: &SandboxJob) -> Vec<u8> {
    let mut seed = Sha256::new();
    seed.update(loaded.sha256);
    for arg in &job.args {
        seed.update((arg.len() as u64).to_le_bytes());
        seed.update(arg.as_bytes());
    }
    for (name, contents) in &job.files {
        seed.update((name.len() as u64).to_le_bytes());
        seed.update(name.as_bytes());
        seed.update((contents.len() as u64).to_le_bytes());
        seed.update(contents);
    }
    let seed: [u8; 32] = seed.finalize().into();
    let mut bytes = Vec::with_capacity(RANDOM_CYCLE_BYTES);
    let mut counter: u64 = 0;
    while bytes.len() < RANDOM_CYCLE_BYTES {
        let mut block = Sha256::new();
        block.update(seed);
        block.update(counter.to_le_bytes());
        bytes.extend_from_slice(&block.finalize());
        counter += 1;
    }
    bytes
}

/// CPU time of the calling thread, in seconds.
fn thread_cpu_seconds() -> f64 {
    // SAFETY: timespec is plain data; clock_gettime only writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to `ts`.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

thread_local! {
    /// This thread's executor for guest calls (created on first use, reused by later calls so
    /// its blocking pool's threads are too).
    static EXECUTOR: OnceCell<Result<tokio::runtime::Runtime, String>> = const { OnceCell::new() };
}

/// Runs `future` to completion on this thread's single-thread executor (with timers). When the
/// caller is itself inside a tokio runtime, which cannot block, a scoped thread does it.
fn block_on<F: std::future::Future + Send>(future: F) -> Result<F::Output, SandboxError>
where
    F::Output: Send,
{
    let run = move || {
        EXECUTOR.with(|cell| {
            let executor = cell.get_or_init(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .map_err(|e| format!("cannot start the async executor: {e}"))
            });
            match executor {
                Ok(runtime) => Ok(runtime.block_on(future)),
                Err(reason) => Err(SandboxError::WasmEngine(reason.clone())),
            }
        })
    };
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|scope| {
            scope
                .spawn(run)
                .join()
                .unwrap_or_else(|_| Err(SandboxError::WasmEngine("the wasm executor thread panicked".into())))
        })
    } else {
        run()
    }
}

/// How the guest's part of a command run ended.
enum Ended {
    /// Instantiation failed (e.g. its initial memory exceeds the limit).
    NotStarted(wasmtime::Error),
    /// `_start` returned or trapped.
    Ran(wasmtime::Result<()>),
    /// The deadline passed while the guest waited in a host call.
    DeadlineInHostCall,
}

/// Runs a validated `job` whose program is `loaded`.
fn run_command(sandbox: &WasmSandbox, loaded: &LoadedModule, job: &SandboxJob) -> Result<SandboxOutcome, SandboxError> {
    let limits = &job.limits;
    let pre = command_pre(loaded)?;

    let work = tempfile::Builder::new().prefix("switchyard-wasm-").tempdir().map_err(SandboxError::WorkDir)?;
    let work_path = work.path().to_path_buf();
    std::fs::set_permissions(&work_path, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .map_err(SandboxError::WorkDir)?;
    for (name, contents) in &job.files {
        std::fs::write(work_path.join(name), contents)
            .map_err(|source| SandboxError::WriteFile { name: name.clone(), source })?;
    }

    let stdout = CappedOutput::new(limits.max_output_bytes);
    let stderr = CappedOutput::new(limits.max_output_bytes);
    let argv0 = job.program.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "module".into());
    let mut argv = vec![argv0];
    argv.extend(job.args.iter().cloned());
    let random = random_cycle(loaded, job);
    let mut insecure_seed = [0u8; 16];
    insecure_seed.copy_from_slice(&random[..16]);

    let instantiate_error =
        |e: wasmtime::Error| SandboxError::WasmInstantiate { module: loaded.name.clone(), reason: format!("{e:#}") };
    let mut wasi = WasiCtxBuilder::new();
    wasi.args(&argv)
        .env("HOME", GUEST_WORK_DIR)
        .env("TMPDIR", GUEST_WORK_DIR)
        .env("LANG", "C.UTF-8")
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        // Left off on purpose: with it on, wasmtime-wasi serves a relative sleep with
        // `std::thread::sleep`, which no deadline can cut. (File operations then run on the
        // executor's blocking pool.) Must precede the pre-opens.
        .allow_blocking_current_thread(false)
        .secure_random(Deterministic::new(random.clone()))
        .insecure_random(Deterministic::new(random))
        .insecure_random_seed(u128::from_le_bytes(insecure_seed));
    wasi.preopened_dir(&work_path, GUEST_WORK_DIR, FsPerms::ReadWrite).map_err(instantiate_error)?;
    for (host, guest) in &sandbox.read_only_dirs {
        wasi.preopened_dir(host, guest, FsPerms::ReadOnly).map_err(instantiate_error)?;
    }
    let state = CommandState { wasi: wasi.build_p1(), limiter: MemoryLimiter::new(limits.address_space_bytes) };
    let mut store = Store::new(engine()?, state);
    store.limiter(|state| &mut state.limiter);

    let started = Instant::now();
    let deadline = started + limits.wall_time;
    arm_deadline(&mut store, deadline);
    let cpu_before = thread_cpu_seconds();
    let ended = {
        let store = &mut store;
        let pre = &pre;
        block_on(async move {
            let guest = async {
                let instance = match pre.instantiate_async(&mut *store).await {
                    Ok(instance) => instance,
                    Err(e) => return Ended::NotStarted(e),
                };
                let start = match instance.get_typed_func::<(), ()>(&mut *store, "_start") {
                    Ok(start) => start,
                    Err(e) => return Ended::NotStarted(e),
                };
                Ended::Ran(start.call_async(&mut *store, ()).await)
            };
            tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), guest)
                .await
                .unwrap_or(Ended::DeadlineInHostCall)
        })?
    };
    let wall_seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = (thread_cpu_seconds() - cpu_before).max(0.0);
    let limiter = &store.data().limiter;
    let (memory_denied, peak_bytes) = (limiter.denied, limiter.peak_bytes);

    let mut timed_out = false;
    let (termination, trap) = match ended {
        Ended::Ran(Ok(())) => (Termination::Exited(0), None),
        Ended::Ran(Err(e)) => match e.downcast_ref::<I32Exit>() {
            Some(exit) => (Termination::Exited(exit.0), None),
            None if is_interrupt(&e) => {
                timed_out = true;
                (Termination::Trapped, Some("wall-clock limit reached (epoch deadline)".to_string()))
            }
            None => (Termination::Trapped, Some(format!("{e:#}"))),
        },
        Ended::DeadlineInHostCall => {
            timed_out = true;
            (Termination::Trapped, Some("wall-clock limit reached during a host call".to_string()))
        }
        Ended::NotStarted(e) if memory_denied => (Termination::Trapped, Some(format!("cannot start: {e:#}"))),
        Ended::NotStarted(e) if is_interrupt(&e) => {
            timed_out = true;
            (Termination::Trapped, Some("wall-clock limit reached while starting".to_string()))
        }
        Ended::NotStarted(e) => return Err(instantiate_error(e)),
    };
    drop(store);

    let (stdout, stdout_truncated) = stdout.contents();
    let (stderr, stderr_truncated) = stderr.contents();
    let mut limits_hit = Vec::new();
    if timed_out {
        limits_hit.push(LimitHit::WallTime);
    }
    if stdout_truncated || stderr_truncated {
        limits_hit.push(LimitHit::Output);
    }
    if memory_denied {
        limits_hit.push(LimitHit::Memory);
    }
    let cleanup_error = work.close().err().map(|e| e.to_string());
    Ok(SandboxOutcome {
        termination,
        timed_out,
        limits_hit,
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
        wall_seconds,
        cpu_seconds,
        max_rss_bytes: peak_bytes as u64,
        pid: 0,
        work_dir: work_path,
        cleanup_error,
        isolation: Isolation {
            network_isolated: true,
            read_only_root: true,
            sandbox_uid: None,
            user_namespace: false,
            process_limit_per_run: true,
            notes: COMMAND_NOTES.iter().map(|n| n.to_string()).collect(),
            ..Isolation::default()
        },
        trap,
    })
}

// ---------------------------------------------------------------------------------------------
// Compute modules

/// How a [`run_compute`] call ended when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComputeEnd<R> {
    /// The body finished with this value.
    Done(R),
    /// The wall-clock limit stopped the guest.
    TimedOut,
}

/// Instantiates an import-free module in a fresh store (linear memory limited to
/// `memory_bytes`, deadline `wall_time` from now) and runs `body` on it synchronously. The body
/// writes inputs into the guest's memory, calls its exports and reads the results; a memory
/// growth it asks for goes through the same limiter. A trap other than the deadline, or an
/// error of the body, is a [`SandboxError::WasmInstantiate`] naming the module.
pub fn run_compute<R>(
    loaded: &LoadedModule,
    memory_bytes: u64,
    wall_time: Duration,
    body: impl FnOnce(&mut Store<MemoryLimiter>, &Instance) -> wasmtime::Result<R>,
) -> Result<ComputeEnd<R>, SandboxError> {
    let mut store = Store::new(engine()?, MemoryLimiter::new(memory_bytes));
    store.limiter(|limiter| limiter);
    arm_deadline(&mut store, Instant::now() + wall_time);
    let result = Instance::new(&mut store, &loaded.module, &[]).and_then(|instance| body(&mut store, &instance));
    match result {
        Ok(value) => Ok(ComputeEnd::Done(value)),
        Err(e) if is_interrupt(&e) => Ok(ComputeEnd::TimedOut),
        Err(e) => Err(SandboxError::WasmInstantiate { module: loaded.name.clone(), reason: format!("{e:#}") }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPIN: &str = r#"(module (func (export "spin") (loop $l (br $l))))"#;
    const GROW: &str = r#"(module (memory (export "memory") 1)
        (func (export "grow") (param i32) (result i32) (memory.grow (local.get 0))))"#;

    #[test]
    fn hex_and_sha256_match_known_vectors() {
        assert_eq!(hex(&[0x00, 0xab, 0x0f]), "00ab0f");
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        assert_eq!(hex(&sha256(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn capped_output_keeps_the_head_and_flags_the_rest() {
        let out = CappedOutput::new(5);
        out.push(b"abc");
        assert_eq!(out.contents(), ("abc".to_string(), false));
        out.push(b"defg");
        assert_eq!(out.contents(), ("abcde".to_string(), true));
        out.push(b"h");
        assert_eq!(out.contents(), ("abcde".to_string(), true));
    }

    #[test]
    fn limiter_refuses_growth_beyond_the_limit_and_records_it() {
        let mut limiter = MemoryLimiter::new(2 * 65_536);
        assert!(limiter.memory_growing(0, 65_536, None).expect("no error"));
        assert!(limiter.memory_growing(65_536, 2 * 65_536, None).expect("no error"));
        assert!(!limiter.denied);
        assert!(!limiter.memory_growing(2 * 65_536, 3 * 65_536, None).expect("no error"));
        assert!(limiter.denied);
        assert_eq!(limiter.peak_bytes, 2 * 65_536);
    }

    #[test]
    fn wat_modules_compile_once() {
        let first = module_from_wat("grow", GROW).expect("compiles");
        let before = cache_stats();
        let second = module_from_wat("grow again", GROW).expect("cached");
        assert_eq!(first.sha256, second.sha256);
        assert_eq!(cache_stats().compiled, before.compiled, "no second compilation");
        assert!(cache_stats().hits > before.hits);
        assert!(matches!(module_from_wat("broken", "(module (func"), Err(SandboxError::WasmCompile { .. })));
    }

    #[test]
    fn compiled_code_round_trips_through_the_disk_cache_and_corruption_is_refused() {
        let engine = engine().expect("engine");
        let module = Module::new(engine, GROW).expect("compiles");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("grow.cwasm");
        store_precompiled(&module, &path).expect("stored");
        let loaded = load_precompiled(engine, &path).expect("loads");
        assert!(loaded.get_export("grow").is_some());
        // One flipped byte: the checksum no longer matches and the artifact is not executed.
        let mut bytes = std::fs::read(&path).expect("read");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        assert!(load_precompiled(engine, &path).is_none());
        // Without its checksum file it is not trusted either.
        store_precompiled(&module, &path).expect("stored again");
        std::fs::remove_file(path.with_extension("cwasm.sha256")).expect("remove");
        assert!(load_precompiled(engine, &path).is_none());
    }

    #[test]
    fn an_endless_loop_stops_at_the_deadline() {
        let module = module_from_wat("spin", SPIN).expect("compiles");
        let started = Instant::now();
        let end = run_compute(&module, 1 << 20, Duration::from_millis(200), |store, instance| {
            instance.get_typed_func::<(), ()>(&mut *store, "spin")?.call(&mut *store, ())
        })
        .expect("runs");
        let waited = started.elapsed();
        assert_eq!(end, ComputeEnd::TimedOut);
        assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(2), "{waited:?}");
    }

    #[test]
    fn memory_growth_is_bounded_by_the_limiter() {
        let module = module_from_wat("grow", GROW).expect("compiles");
        let end = run_compute(&module, 4 * 65_536, Duration::from_secs(5), |store, instance| {
            let grow = instance.get_typed_func::<i32, i32>(&mut *store, "grow")?;
            let within = grow.call(&mut *store, 3)?;
            let beyond = grow.call(&mut *store, 1)?;
            Ok((within, beyond, store.data().denied, store.data().peak_bytes))
        })
        .expect("runs");
        // 1 initial page + 3 = the 4-page limit; one more is refused (memory.grow returns -1).
        assert_eq!(end, ComputeEnd::Done((1, -1, true, 4 * 65_536)));
    }
}
