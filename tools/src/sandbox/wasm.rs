//! The WebAssembly backend of the [`Sandbox`] seam, on wasmtime.
//!
//! Owns the process-wide engine, the compiled-module cache, the WASI preview 1 command runner
//! ([`WasmSandbox`]) and the runner of import-free compute modules ([`run_compute`]). Must not
//! depend on the tools built on it, the runtime or any model code.
//!
//! Confinement of a guest:
//!
//! * **time** — epoch interruption: one engine-wide ticker thread increments the epoch every
//!   [`EPOCH_TICK`]; at each tick a running guest checks its job's two limits and traps
//!   (`interrupt`) once one has passed:
//!   * *CPU time*: `cpu_seconds` of the CPU clock of the thread that runs the guest (its
//!     instantiation included; the executor is single-threaded, so the guest's fiber never
//!     leaves that thread), the counterpart of a process's `RLIMIT_CPU` — the outcome has
//!     [`LimitHit::CpuTime`]. This is the limit a busy guest meets, at the same point of its
//!     work on an idle or a loaded machine (as long as the guest gets enough of a core to reach
//!     it before the wall clock). The CPU of WASI file operations, which run on the executor's
//!     blocking pool, is not counted: their volume is bounded by the work area, and a guest that
//!     spends its time in host calls meets the wall clock;
//!   * *wall clock*: the job's `wall_time` deadline. WASI calls run asynchronously under a
//!     `tokio::time::timeout` with the same deadline, so a guest blocked in a host call (a
//!     `sleep`) is cut as well — the outcome has `timed_out` and [`LimitHit::WallTime`].
//!
//!   Either way a stop is a result, never a crash.
//! * **memory** — a [`wasmtime::ResourceLimiter`] refuses any linear memory beyond the job's
//!   `address_space_bytes` (the guest sees a failed `memory.grow`, e.g. Python's
//!   `MemoryError`) and bounds instances, tables, memories and table elements; a refusal is
//!   reported as [`LimitHit::Memory`].
//! * **filesystem** — WASI preview 1 with exactly the pre-opened directories the job is given:
//!   a fresh private work directory at [`GUEST_WORK_DIR`] (read-write, descriptor 3) and the
//!   sandbox's read-only directories. Any other path (`/etc/passwd`, `/tmp/x`) resolves to no
//!   pre-open and fails with `ENOTCAPABLE`/`ENOENT` inside the guest.
//! * **work area** — enforced in the WASI layer, whatever the work directory is on: the
//!   module links against guarded versions of `path_open`, `fd_close`, `fd_renumber`,
//!   `fd_write`, `fd_pwrite`, `fd_filestat_set_size`, `path_create_directory`, `path_symlink`
//!   and `path_link`, which check and count, then call wasmtime-wasi's own function (through a
//!   small shim instance that exports the guest's memory, where wasmtime-wasi looks for it):
//!   * *open files*: at most `max_open_files` descriptors returned by `path_open` open at once
//!     (stdio, three in-memory streams, and the pre-opens are not counted; each counted one is
//!     one host descriptor, so the host holds at most that many plus the pre-opens); one more
//!     is refused with `EMFILE` before any host call, [`LimitHit::OpenFiles`];
//!   * *bytes*: at most `max_work_bytes` written by `fd_write`/`fd_pwrite` to anything but the
//!     stdio streams, cumulatively (overwriting counts again); the lengths in the guest's ciovec
//!     array are read before the call, a write that does not fit is cut to what is left (a
//!     short write; the guest's array is restored afterwards) and one with nothing left is
//!     refused with `ENOSPC`; `fd_filestat_set_size` beyond `max_work_bytes` is `EFBIG`
//!     (within it, it only leaves a hole); `fd_allocate` is `ENOTSUP` in wasmtime-wasi 48 and
//!     allocates nothing; [`LimitHit::WorkArea`];
//!   * *entries*: at most `max_work_entries` files, directories and links created,
//!     cumulatively (an `O_CREAT` open of an existing file creates nothing and is not counted:
//!     see `guarded_path_open`); one more is `ENOSPC`, [`LimitHit::WorkArea`].
//!
//!   A host answer of `ENOSPC`/`EDQUOT`/`EFBIG` (the tmpfs below is full) is reported as
//!   [`LimitHit::WorkArea`] too, `EMFILE`/`ENFILE` as [`LimitHit::OpenFiles`]. The store's WASI
//!   resource table is capped at `max_open_files` + `RESOURCE_TABLE_SLACK` (4,096) entries as well
//!   (a guest beyond it traps).
//! * **work directory** — where the kernel allows it (root or `CAP_SYS_ADMIN`), a tmpfs that exists
//!   only in the private mount namespace of a short-lived helper thread (`unshare(CLONE_NEWNS)`,
//!   `/` made recursively private, the tmpfs mounted over the temp dir's path there, sized by
//!   `work_area_size` (`max_work_bytes` + the job's files + a page per entry for rounding),
//!   `nr_inodes` the entry bound plus the job's files plus 16, mode 0700): the thread writes the
//!   job's files, pre-opens the directory and exits; no other thread or process ever sees the
//!   mount, the pre-opened descriptor keeps it usable, and the kernel frees it when the store
//!   closes that descriptor — or when the process dies, even by `SIGKILL`, so nothing is left
//!   behind. Otherwise (the kernel refuses, or [`WasmSandbox::host_work_dir`]) a marked host
//!   directory from [`residue::create_work_dir`] (the guest sees its subdirectory `work`, not the
//!   marker), removed after the run and by the startup sweep after a crash; its real disk usage is
//!   measured every 256 writes and held to that same size (sparse writes allocate more than they
//!   count), and the outcome carries a note saying why there was no tmpfs.
//! * **network** — none: preview 1 has no socket creation and no socket is pre-opened.
//! * **environment** — only `HOME` and `TMPDIR` (the work directory) and `LANG`; stdin is
//!   empty; stdout and stderr are captured up to `max_output_bytes` each, the rest is dropped
//!   (the guest never sees an error for it) and the truncation reported.
//! * **randomness** — the guest's random bytes are a deterministic function of the job (module,
//!   arguments and files), so a run is reproducible (e.g. Python's hash seed and `random`).
//! * **processes** — a guest is one thread of the caller: it cannot fork, so the process limit
//!   of a job is moot.
//! * **all guests together** — before it starts, a guest reserves its memory (linear memory and
//!   work area) and descriptors against a process-wide budget (half the machine's memory, half
//!   the soft `RLIMIT_NOFILE`) and waits until they fit beside the running guests
//!   ([`super::guest_budget`]), so many guests at once cannot take the process down; the wait
//!   precedes its clocks, so it changes no outcome.
//! * **weaker than a process** — no per-file size limit (`max_file_bytes`): one file can take
//!   the whole work area (noted in every outcome).
//!
//! Modules are compiled once per process: a cache keyed by the SHA-256 of the module holds the
//! compiled [`Module`] (and, for command modules, the [`InstancePre`] linked against the guarded
//! WASI, which finds each store's originals in the store, so one link serves every run); concurrent
//! first uses wait for one compilation. Compiled code of large module *files* (at least
//! [`DISK_CACHE_MIN_BYTES`]) is also kept on disk under [`cache_home`]`/wasm-cache`, so later
//! processes skip Cranelift (about 20 s for CPython here; loading takes 0.2 s).

use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::hash::{Hash, Hasher};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use wasmtime::{
    Caller, Config, Engine, Extern, Func, Instance, InstancePre, Linker, Memory, Module, ResourceLimiter, Store,
    StoreLimits, StoreLimitsBuilder, Trap, TypedFunc, UpdateDeadline, WasmParams,
};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{Deterministic, FsPerms, I32Exit, WasiCtxBuilder, WasiView};

use super::guest_budget::{Demand, GuestBudget};
use super::{
    Isolation, LimitHit, Sandbox, SandboxError, SandboxJob, SandboxLimits, SandboxOutcome, Termination, residue,
    validate,
};

/// Host descriptors a command guest holds beyond its open files and read-only pre-opens,
/// reserved with them ([`GuestBudget`]): the work directory and the helper thread's transient ones.
const GUEST_DESCRIPTOR_SLACK: u64 = 8;

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

fn cached(
    hash: ModuleHash,
    name: &str,
    build: impl FnOnce() -> Result<Module, String>,
) -> Result<LoadedModule, SandboxError> {
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

/// A guest's CPU-time budget: the CPU clock of the thread that runs it, from `start`, may reach
/// `limit` seconds; `hit` records that it was this budget, not the wall clock, that stopped it.
struct CpuBudget {
    start: f64,
    limit: f64,
    hit: Arc<AtomicBool>,
}

/// Makes `store` trap with [`Trap::Interrupt`] at the first epoch tick after `deadline`, or,
/// with a `cpu` budget, after the running thread has spent it. The callback runs on the thread
/// executing the guest, so its CPU clock is the guest's.
fn arm_deadline<T: 'static>(store: &mut Store<T>, deadline: Instant, cpu: Option<CpuBudget>) {
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        if Instant::now() >= deadline {
            return Ok(UpdateDeadline::Interrupt);
        }
        if let Some(budget) = &cpu
            && thread_cpu_seconds() - budget.start >= budget.limit
        {
            budget.hit.store(true, Ordering::Relaxed);
            return Ok(UpdateDeadline::Interrupt);
        }
        Ok(UpdateDeadline::Continue(1))
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
// Work-area guard (the WASI layer)

/// The WASI module whose functions the guard shadows.
const WASI_MODULE: &str = "wasi_snapshot_preview1";

/// WASI errno values (`wasi_snapshot_preview1` `errno`) that the guard returns or recognizes.
const ERRNO_SUCCESS: i32 = 0;
const ERRNO_DQUOT: i32 = 19;
const ERRNO_FBIG: i32 = 22;
const ERRNO_INVAL: i32 = 28;
const ERRNO_MFILE: i32 = 33;
const ERRNO_NFILE: i32 = 41;
const ERRNO_NOENT: i32 = 44;
const ERRNO_NOSPC: i32 = 51;

/// `oflags` bits of `path_open`: create, must be a directory, exclusive.
const OFLAGS_CREAT: i32 = 1;
const OFLAGS_DIRECTORY: i32 = 2;
const OFLAGS_EXCL: i32 = 4;

/// The `fd_write` right (`rights` bit 6).
const RIGHTS_FD_WRITE: i64 = 1 << 6;

/// Most ciovecs one write to a work-area file may pass: wasi-libc's `IOV_MAX` (and Linux's);
/// more is `EINVAL`, as `writev` answers. Bounds the guard's scan of the array.
const IOV_MAX: u32 = 1024;

/// Entries of the store's WASI resource table beyond `max_open_files` (stdio streams,
/// pre-opens, the transient pollables of one `poll_oneoff`, directory streams). Defence in
/// depth only: the guard already bounds descriptors; were some path to open more, the guest
/// would trap at this many instead of exhausting the host. Assumption: 4,096 is far above what
/// any legitimate call keeps at once.
const RESOURCE_TABLE_SLACK: u64 = 4096;

/// Counted writes between two measurements of a host work directory's real disk usage (see
/// [`WorkGuard::check_host_usage`]). Assumption: 256 writes allocate at most a few MiB beyond
/// what they count (a block per write, plus metadata), and a walk of at most
/// `max_work_entries` entries every 256 writes costs the guest little.
const USAGE_CHECK_WRITES: u32 = 256;

/// Per-store state of the work-area bounds, updated by the guarded WASI functions.
///
/// Counted descriptors are the ones `path_open` returned (files and directories, each holding
/// one host descriptor) and that are still open; stdio (three in-memory streams, no host
/// descriptor) and the pre-opened directories are not counted. Bytes are the bytes `fd_write`
/// and `fd_pwrite` wrote to anything but the stdio streams, cumulatively (overwriting counts
/// again, deleting gives nothing back). Entries are the files, directories, symbolic links and
/// hard links created, cumulatively as well.
struct WorkGuard {
    max_open_files: u64,
    max_work_bytes: u64,
    max_work_entries: u64,
    /// wasmtime-wasi's implementations in this store, which the guards call.
    originals: Option<Originals>,
    /// Guest descriptors returned by `path_open` that are still open.
    opened: BTreeSet<u32>,
    /// Guest descriptors that are stdio streams (writes to them are captured, not stored).
    streams: BTreeSet<u32>,
    /// Bytes written to work-area files so far.
    bytes_written: u64,
    /// Files, directories and links created so far.
    entries_created: u64,
    /// A write, truncation or creation was refused or cut short: the work area was full.
    work_area_full: bool,
    /// An open was refused because `max_open_files` descriptors were open.
    open_files_refused: bool,
    /// A host work directory (not a private tmpfs) and the real disk usage it may reach.
    host_dir: Option<(PathBuf, u64)>,
    /// Counted writes since its usage was last measured.
    writes_unchecked: u32,
}

impl WorkGuard {
    fn new(limits: &SandboxLimits) -> Self {
        Self {
            max_open_files: limits.max_open_files,
            max_work_bytes: limits.max_work_bytes,
            max_work_entries: limits.max_work_entries,
            originals: None,
            opened: BTreeSet::new(),
            streams: BTreeSet::from([0, 1, 2]),
            bytes_written: 0,
            entries_created: 0,
            work_area_full: false,
            open_files_refused: false,
            host_dir: None,
            writes_unchecked: 0,
        }
    }

    /// Counts a successful write of `written` bytes.
    fn wrote(&mut self, written: u64) {
        self.bytes_written = self.bytes_written.saturating_add(written);
        self.writes_unchecked = self.writes_unchecked.saturating_add(1);
        if self.writes_unchecked >= USAGE_CHECK_WRITES {
            self.writes_unchecked = 0;
            self.check_host_usage();
        }
    }

    /// On a host work directory, counted bytes can understate the disk space used: each write
    /// at a new place of a sparse file allocates a whole block for as little as one byte. So
    /// its real usage (allocated blocks of everything in it) is measured every
    /// [`USAGE_CHECK_WRITES`] writes and, beyond what the private tmpfs would have allowed
    /// ([`work_area_size`]), the work area counts as full. (On the tmpfs the kernel enforces
    /// that size itself.)
    fn check_host_usage(&mut self) {
        if let Some((dir, allowed)) = &self.host_dir
            && disk_usage(dir) > *allowed
        {
            self.bytes_written = self.max_work_bytes;
            self.work_area_full = true;
        }
    }

    fn originals(&self) -> wasmtime::Result<&Originals> {
        self.originals.as_ref().ok_or_else(|| wasmtime::Error::msg("the work-area guard of this store is not set up"))
    }

    /// `None` when one more descriptor may be opened, else the errno refusing it (`EMFILE`).
    fn admit_open(&mut self) -> Option<i32> {
        if self.opened.len() as u64 >= self.max_open_files {
            self.open_files_refused = true;
            return Some(ERRNO_MFILE);
        }
        None
    }

    /// `None` when one more entry may be created, else the errno refusing it (`ENOSPC`).
    fn admit_entry(&mut self) -> Option<i32> {
        if self.entries_created >= self.max_work_entries {
            self.work_area_full = true;
            return Some(ERRNO_NOSPC);
        }
        None
    }

    /// `None` when a file may be resized to `size`, else the errno refusing it (`EFBIG`): no
    /// file may be longer than the whole work area. (wasmtime-wasi's `ftruncate` leaves a hole,
    /// so growth within that bound costs no space.)
    fn admit_size(&mut self, fd: u32, size: i64) -> Option<i32> {
        match u64::try_from(size) {
            Ok(size) if size > self.max_work_bytes && !self.streams.contains(&fd) => {
                self.work_area_full = true;
                Some(ERRNO_FBIG)
            }
            _ => None,
        }
    }

    /// Records what a delegated call returned: the host's own "full" answers count as limits
    /// too (the private tmpfs is full, or the host is out of descriptors).
    fn observe(&mut self, errno: i32) {
        match errno {
            ERRNO_NOSPC | ERRNO_DQUOT | ERRNO_FBIG => self.work_area_full = true,
            ERRNO_MFILE | ERRNO_NFILE => self.open_files_refused = true,
            _ => {}
        }
    }

    fn created(&mut self, errno: i32) {
        if errno == ERRNO_SUCCESS {
            self.entries_created = self.entries_created.saturating_add(1);
        }
        self.observe(errno);
    }

    fn opened(&mut self, fd: u32) {
        self.streams.remove(&fd);
        self.opened.insert(fd);
    }

    fn closed(&mut self, fd: u32) {
        self.opened.remove(&fd);
        self.streams.remove(&fd);
    }

    /// `fd_renumber(from, to)` succeeded: `to` was closed and `from` now lives at `to`.
    fn renumbered(&mut self, from: u32, to: u32) {
        if from == to {
            return;
        }
        self.closed(to);
        if self.opened.remove(&from) {
            self.opened.insert(to);
        }
        if self.streams.remove(&from) {
            self.streams.insert(to);
        }
    }

    fn remaining_bytes(&self) -> u64 {
        self.max_work_bytes.saturating_sub(self.bytes_written)
    }
}

/// The guarded functions: name and parameter types in `wasi_snapshot_preview1.witx`; each
/// returns an errno (`i32`).
const GUARDED_FUNCS: [(&str, &str); 9] = [
    ("path_open", "i32 i32 i32 i32 i32 i64 i64 i32 i32"),
    ("fd_close", "i32"),
    ("fd_renumber", "i32 i32"),
    ("fd_write", "i32 i32 i32 i32"),
    ("fd_pwrite", "i32 i32 i32 i64 i32"),
    ("fd_filestat_set_size", "i32 i64"),
    ("path_create_directory", "i32 i32 i32"),
    ("path_symlink", "i32 i32 i32 i32 i32"),
    ("path_link", "i32 i32 i32 i32 i32 i32 i32"),
];

/// Text of the shim through which a guard calls wasmtime-wasi's function: it imports the
/// guest's memory and the original functions and exports both. wasmtime-wasi finds the memory
/// it reads and writes as the *calling instance's* export `memory`, and a function called
/// directly from the host has no calling instance; called from the shim it has one, whose
/// `memory` is the guest's.
fn shim_wat() -> String {
    let mut imports = String::from("(import \"guest\" \"memory\" (memory 0))\n");
    let mut exports = String::from("(export \"memory\" (memory 0))\n");
    for (index, (name, params)) in GUARDED_FUNCS.iter().enumerate() {
        imports.push_str(&format!("(import \"{WASI_MODULE}\" \"{name}\" (func (param {params}) (result i32)))\n"));
        let gets: String = (0..params.split_whitespace().count()).map(|i| format!("(local.get {i})")).collect();
        exports.push_str(&format!("(func (export \"{name}\") (param {params}) (result i32) (call {index} {gets}))\n"));
    }
    format!("(module\n{imports}{exports})")
}

/// The compiled shim (see [`shim_wat`]), once per process.
fn shim_module() -> Result<LoadedModule, SandboxError> {
    static WAT: OnceLock<String> = OnceLock::new();
    module_from_wat("switchyard-wasi-guard-shim", WAT.get_or_init(shim_wat))
}

/// Parameters of `path_open` and `path_link`.
type PathOpenParams = (i32, i32, i32, i32, i32, i64, i64, i32, i32);
type PathLinkParams = (i32, i32, i32, i32, i32, i32, i32);

/// The functions the guards delegate to, in one store.
#[derive(Clone)]
struct Originals {
    path_open: TypedFunc<PathOpenParams, i32>,
    fd_close: TypedFunc<i32, i32>,
    fd_renumber: TypedFunc<(i32, i32), i32>,
    fd_write: TypedFunc<(i32, i32, i32, i32), i32>,
    fd_pwrite: TypedFunc<(i32, i32, i32, i64, i32), i32>,
    fd_filestat_set_size: TypedFunc<(i32, i64), i32>,
    path_create_directory: TypedFunc<(i32, i32, i32), i32>,
    path_symlink: TypedFunc<(i32, i32, i32, i32, i32), i32>,
    path_link: TypedFunc<PathLinkParams, i32>,
}

impl Originals {
    /// wasmtime-wasi's functions behind a shim instance that exports the guest's `memory`
    /// (when the guest exports one; without it wasmtime-wasi's functions are used directly and
    /// fail, as they would unguarded, with "missing required memory export"). Set up right
    /// after the guest is instantiated: a guarded call from the guest's own `start` function,
    /// before that, traps (WASI commands start at `_start`, which runs after).
    async fn set_up(
        plain: &Linker<CommandState>,
        store: &mut Store<CommandState>,
        guest: &Instance,
    ) -> wasmtime::Result<Self> {
        let mut originals = Vec::with_capacity(GUARDED_FUNCS.len());
        for (name, _) in GUARDED_FUNCS {
            originals.push(plain.get(&mut *store, WASI_MODULE, name)?);
        }
        let Some(memory) = guest.get_memory(&mut *store, "memory") else {
            let funcs: BTreeMap<&str, Func> = GUARDED_FUNCS
                .iter()
                .zip(originals)
                .filter_map(|((name, _), original)| Some((*name, original.into_func()?)))
                .collect();
            return Self::from_lookup(&*store, |name| funcs.get(name).copied());
        };
        let shim = shim_module().map_err(|e| wasmtime::Error::msg(e.to_string()))?;
        let mut imports = vec![Extern::Memory(memory)];
        imports.extend(originals);
        let shim = Instance::new_async(&mut *store, &shim.module, &imports).await?;
        let funcs: BTreeMap<&str, Func> =
            GUARDED_FUNCS.iter().filter_map(|(name, _)| Some((*name, shim.get_func(&mut *store, name)?))).collect();
        Self::from_lookup(&*store, |name| funcs.get(name).copied())
    }

    /// Type-checks the functions `lookup` finds against `wasi_snapshot_preview1`'s signatures.
    fn from_lookup(store: &Store<CommandState>, lookup: impl Fn(&str) -> Option<Func>) -> wasmtime::Result<Self> {
        let get =
            |name: &str| lookup(name).ok_or_else(|| wasmtime::Error::msg(format!("{WASI_MODULE}::{name} is missing")));
        Ok(Self {
            path_open: get("path_open")?.typed(store)?,
            fd_close: get("fd_close")?.typed(store)?,
            fd_renumber: get("fd_renumber")?.typed(store)?,
            fd_write: get("fd_write")?.typed(store)?,
            fd_pwrite: get("fd_pwrite")?.typed(store)?,
            fd_filestat_set_size: get("fd_filestat_set_size")?.typed(store)?,
            path_create_directory: get("path_create_directory")?.typed(store)?,
            path_symlink: get("path_symlink")?.typed(store)?,
            path_link: get("path_link")?.typed(store)?,
        })
    }
}

/// The linkers of command modules, built once per process.
struct CommandLinkers {
    /// WASI preview 1 as wasmtime-wasi defines it: where each store's [`Originals`] come from.
    plain: Linker<CommandState>,
    /// The same with the guarded functions shadowing wasmtime-wasi's: what modules link to.
    guarded: Linker<CommandState>,
}

static LINKERS: OnceLock<Result<CommandLinkers, String>> = OnceLock::new();

fn linkers() -> Result<&'static CommandLinkers, SandboxError> {
    let engine = engine()?;
    match LINKERS.get_or_init(|| build_linkers(engine).map_err(|e| format!("cannot link WASI: {e:#}"))) {
        Ok(linkers) => Ok(linkers),
        Err(reason) => Err(SandboxError::WasmEngine(reason.clone())),
    }
}

fn build_linkers(engine: &Engine) -> wasmtime::Result<CommandLinkers> {
    let mut plain: Linker<CommandState> = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_async(&mut plain, |state| &mut state.wasi)?;
    let mut guarded = plain.clone();
    guarded.allow_shadowing(true);
    define_guards(&mut guarded)?;
    guarded.allow_shadowing(false);
    Ok(CommandLinkers { plain, guarded })
}

/// Defines the guarded functions in `linker` (which must allow shadowing), each with the
/// signature of the `wasi_snapshot_preview1` function it replaces.
fn define_guards(linker: &mut Linker<CommandState>) -> wasmtime::Result<()> {
    type Ctx<'a> = Caller<'a, CommandState>;
    linker.func_wrap_async(
        WASI_MODULE,
        "path_open",
        |mut caller: Ctx<'_>,
         (dirfd, dirflags, path, path_len, oflags, rights_base, rights_inheriting, fdflags, opened): PathOpenParams| {
            let args = OpenArgs { dirfd, dirflags, path, path_len, oflags, rights_base, rights_inheriting, fdflags, opened };
            Box::new(async move { guarded_path_open(&mut caller, args).await })
        },
    )?;
    linker.func_wrap_async(WASI_MODULE, "fd_close", |mut caller: Ctx<'_>, (fd,): (i32,)| {
        Box::new(async move { guarded_close(&mut caller, fd).await })
    })?;
    linker.func_wrap_async(WASI_MODULE, "fd_renumber", |mut caller: Ctx<'_>, (from, to): (i32, i32)| {
        Box::new(async move { guarded_renumber(&mut caller, from, to).await })
    })?;
    linker.func_wrap_async(
        WASI_MODULE,
        "fd_write",
        |mut caller: Ctx<'_>, (fd, iovs, iovs_len, nwritten): (i32, i32, i32, i32)| {
            Box::new(async move {
                guarded_write(&mut caller, WriteArgs { fd, iovs, iovs_len, offset: None, nwritten }).await
            })
        },
    )?;
    linker.func_wrap_async(
        WASI_MODULE,
        "fd_pwrite",
        |mut caller: Ctx<'_>, (fd, iovs, iovs_len, offset, nwritten): (i32, i32, i32, i64, i32)| {
            Box::new(async move {
                guarded_write(&mut caller, WriteArgs { fd, iovs, iovs_len, offset: Some(offset), nwritten }).await
            })
        },
    )?;
    linker.func_wrap_async(WASI_MODULE, "fd_filestat_set_size", |mut caller: Ctx<'_>, (fd, size): (i32, i64)| {
        Box::new(async move { guarded_set_size(&mut caller, fd, size).await })
    })?;
    linker.func_wrap_async(WASI_MODULE, "path_create_directory", |mut caller: Ctx<'_>, params: (i32, i32, i32)| {
        Box::new(async move {
            let original = caller.data().guard.originals().map(|o| o.path_create_directory.clone());
            guarded_create(&mut caller, original, params).await
        })
    })?;
    linker.func_wrap_async(WASI_MODULE, "path_symlink", |mut caller: Ctx<'_>, params: (i32, i32, i32, i32, i32)| {
        Box::new(async move {
            let original = caller.data().guard.originals().map(|o| o.path_symlink.clone());
            guarded_create(&mut caller, original, params).await
        })
    })?;
    linker.func_wrap_async(WASI_MODULE, "path_link", |mut caller: Ctx<'_>, params: PathLinkParams| {
        Box::new(async move {
            let original = caller.data().guard.originals().map(|o| o.path_link.clone());
            guarded_create(&mut caller, original, params).await
        })
    })?;
    Ok(())
}

/// The guest's exported linear memory (`memory`, which WASI requires), if any.
fn guest_memory(caller: &mut Caller<'_, CommandState>) -> Option<Memory> {
    caller.get_export("memory").and_then(Extern::into_memory)
}

/// The little-endian `u32` at guest address `at`, if it lies within `data`.
fn read_u32(data: &[u8], at: u64) -> Option<u32> {
    let start = usize::try_from(at).ok()?;
    let bytes = data.get(start..start.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// Stores `value` little-endian at guest address `at`; false when it does not lie within `data`.
fn write_u32(data: &mut [u8], at: u64, value: u32) -> bool {
    let Ok(start) = usize::try_from(at) else { return false };
    let Some(end) = start.checked_add(4) else { return false };
    match data.get_mut(start..end) {
        Some(bytes) => {
            bytes.copy_from_slice(&value.to_le_bytes());
            true
        }
        None => false,
    }
}

/// Bytes allocated on disk to everything under `root` (not following symbolic links); entries
/// that vanish or cannot be read count nothing.
fn disk_usage(root: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else { continue };
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    total
}

/// Arguments of `path_open` (in `wasi_snapshot_preview1.witx` order).
#[derive(Clone, Copy)]
struct OpenArgs {
    dirfd: i32,
    dirflags: i32,
    path: i32,
    path_len: i32,
    oflags: i32,
    rights_base: i64,
    rights_inheriting: i64,
    fdflags: i32,
    /// Guest address where the new descriptor is stored.
    opened: i32,
}

impl OpenArgs {
    fn params(self) -> PathOpenParams {
        let Self { dirfd, dirflags, path, path_len, oflags, rights_base, rights_inheriting, fdflags, opened } = self;
        (dirfd, dirflags, path, path_len, oflags, rights_base, rights_inheriting, fdflags, opened)
    }
}

/// `path_open` under the descriptor and entry bounds.
///
/// An open that may create (`O_CREAT` without `O_DIRECTORY`, which wasmtime-wasi refuses with
/// `O_CREAT`) must not create beyond the entry bound, but an open of an existing file creates
/// nothing and must not count. Without `O_EXCL` the guard therefore first opens without
/// `O_CREAT` but with the write right (which `O_CREAT` implies in wasmtime-wasi, so an existing
/// path — a directory included — gives the same result or error as the original call would);
/// only `ENOENT` (nothing there, or a dangling symbolic link) leads to the creating call, which
/// counts when it succeeds. The guest is one thread and nothing else writes its work
/// directory, so nothing can appear between the two calls.
async fn guarded_path_open(caller: &mut Caller<'_, CommandState>, args: OpenArgs) -> wasmtime::Result<i32> {
    let original = caller.data().guard.originals()?.path_open.clone();
    if let Some(errno) = caller.data_mut().guard.admit_open() {
        return Ok(errno);
    }
    let may_create = args.oflags & OFLAGS_CREAT != 0 && args.oflags & OFLAGS_DIRECTORY == 0;
    let errno = if !may_create {
        original.call_async(&mut *caller, args.params()).await?
    } else {
        let mut errno = ERRNO_NOENT;
        if args.oflags & OFLAGS_EXCL == 0 {
            let existing = OpenArgs {
                oflags: args.oflags & !OFLAGS_CREAT,
                rights_base: args.rights_base | RIGHTS_FD_WRITE,
                ..args
            };
            errno = original.call_async(&mut *caller, existing.params()).await?;
        }
        if errno == ERRNO_NOENT {
            if let Some(refused) = caller.data_mut().guard.admit_entry() {
                return Ok(refused);
            }
            errno = original.call_async(&mut *caller, args.params()).await?;
            caller.data_mut().guard.created(errno);
        }
        errno
    };
    if errno == ERRNO_SUCCESS {
        // wasmtime-wasi has just stored the new descriptor there, so the read cannot fail.
        let fd = guest_memory(caller).and_then(|memory| read_u32(memory.data(&*caller), args.opened as u32 as u64));
        match fd {
            Some(fd) => caller.data_mut().guard.opened(fd),
            None => return Err(wasmtime::Error::msg("path_open stored its descriptor out of bounds")),
        }
    }
    caller.data_mut().guard.observe(errno);
    Ok(errno)
}

async fn guarded_close(caller: &mut Caller<'_, CommandState>, fd: i32) -> wasmtime::Result<i32> {
    let original = caller.data().guard.originals()?.fd_close.clone();
    let errno = original.call_async(&mut *caller, fd).await?;
    if errno == ERRNO_SUCCESS {
        caller.data_mut().guard.closed(fd as u32);
    }
    Ok(errno)
}

async fn guarded_renumber(caller: &mut Caller<'_, CommandState>, from: i32, to: i32) -> wasmtime::Result<i32> {
    let original = caller.data().guard.originals()?.fd_renumber.clone();
    let errno = original.call_async(&mut *caller, (from, to)).await?;
    if errno == ERRNO_SUCCESS {
        caller.data_mut().guard.renumbered(from as u32, to as u32);
    }
    Ok(errno)
}

/// `fd_filestat_set_size` (`ftruncate`): no file longer than the work area.
async fn guarded_set_size(caller: &mut Caller<'_, CommandState>, fd: i32, size: i64) -> wasmtime::Result<i32> {
    let original = caller.data().guard.originals()?.fd_filestat_set_size.clone();
    if let Some(errno) = caller.data_mut().guard.admit_size(fd as u32, size) {
        return Ok(errno);
    }
    let errno = original.call_async(&mut *caller, (fd, size)).await?;
    caller.data_mut().guard.observe(errno);
    Ok(errno)
}

/// A call that creates one directory entry (`path_create_directory`, `path_symlink`,
/// `path_link`), under the entry bound.
async fn guarded_create<P>(
    caller: &mut Caller<'_, CommandState>,
    original: wasmtime::Result<TypedFunc<P, i32>>,
    params: P,
) -> wasmtime::Result<i32>
where
    P: WasmParams + Sync,
{
    let original = original?;
    if let Some(errno) = caller.data_mut().guard.admit_entry() {
        return Ok(errno);
    }
    let errno = original.call_async(&mut *caller, params).await?;
    caller.data_mut().guard.created(errno);
    Ok(errno)
}

/// Arguments of `fd_write` (`offset: None`) and `fd_pwrite`.
#[derive(Clone, Copy)]
struct WriteArgs {
    fd: i32,
    /// Guest address of the ciovec array: (u32 buffer address, u32 length) pairs.
    iovs: i32,
    iovs_len: i32,
    offset: Option<i64>,
    /// Guest address where the number of bytes written is stored.
    nwritten: i32,
}

/// A ciovec length the guard shortened for one call, to be put back afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Clip {
    /// Guest address of the length field.
    at: u64,
    /// The guest's length.
    len: u32,
    /// The length the call saw.
    kept: u32,
}

/// What the guard does with one write.
#[derive(Debug, PartialEq, Eq)]
enum WritePlan {
    /// Not a work-area write (a stdio stream, or a guest without memory, which the original
    /// call fails): call through, count nothing.
    Untracked,
    /// Answer this errno without calling.
    Refused(i32),
    /// Call through with these lengths shortened, count `nwritten`.
    Counted { requested: u64, clips: Vec<Clip> },
}

/// Plans a write of the ciovec array at `iovs` (`iovs_len` entries in `data`) with `remaining`
/// bytes left in the work area: within the budget it passes unchanged; beyond it the lengths
/// are cut so that their sum is exactly the budget (a short write, as `write` on a nearly full
/// file system does), and with no budget left it is refused with `ENOSPC`. Entries outside
/// memory end the scan (the original call fails on them before writing them).
fn plan_write(data: &mut [u8], iovs: u32, iovs_len: u32, remaining: u64) -> WritePlan {
    if iovs_len > IOV_MAX {
        return WritePlan::Refused(ERRNO_INVAL);
    }
    let mut lengths = Vec::with_capacity(iovs_len as usize);
    for i in 0..u64::from(iovs_len) {
        let at = u64::from(iovs) + 8 * i + 4;
        let Some(len) = read_u32(data, at) else { break };
        lengths.push((at, len));
    }
    let requested: u64 = lengths.iter().map(|&(_, len)| u64::from(len)).sum();
    if requested <= remaining {
        return WritePlan::Counted { requested, clips: Vec::new() };
    }
    if remaining == 0 {
        return WritePlan::Refused(ERRNO_NOSPC);
    }
    let mut budget = remaining;
    let mut clips = Vec::new();
    for (at, len) in lengths {
        // At most `budget`, which is below u32::MAX whenever it is below `len`.
        let kept = u32::try_from(u64::from(len).min(budget)).unwrap_or(len);
        budget -= u64::from(kept);
        if kept != len && write_u32(data, at, kept) {
            clips.push(Clip { at, len, kept });
        }
    }
    WritePlan::Counted { requested: remaining, clips }
}

/// Puts back the lengths [`plan_write`] cut, except where the call itself stored something
/// there (e.g. `nwritten` aimed into the array).
fn restore_clips(data: &mut [u8], clips: &[Clip]) {
    for clip in clips {
        if read_u32(data, clip.at) == Some(clip.kept) {
            write_u32(data, clip.at, clip.len);
        }
    }
}

/// `fd_write` / `fd_pwrite` under the bytes bound (see [`plan_write`]).
async fn guarded_write(caller: &mut Caller<'_, CommandState>, args: WriteArgs) -> wasmtime::Result<i32> {
    let originals = caller.data().guard.originals()?;
    let (write, pwrite) = match args.offset {
        None => (Some(originals.fd_write.clone()), None),
        Some(_) => (None, Some(originals.fd_pwrite.clone())),
    };
    let memory = guest_memory(caller);
    let plan = match memory {
        Some(memory) if !caller.data().guard.streams.contains(&(args.fd as u32)) => {
            let remaining = caller.data().guard.remaining_bytes();
            plan_write(memory.data_mut(&mut *caller), args.iovs as u32, args.iovs_len as u32, remaining)
        }
        _ => WritePlan::Untracked,
    };
    let (requested, clips) = match plan {
        WritePlan::Refused(errno) => {
            caller.data_mut().guard.observe(errno);
            return Ok(errno);
        }
        WritePlan::Untracked => (None, Vec::new()),
        WritePlan::Counted { requested, clips } => (Some(requested), clips),
    };
    if !clips.is_empty() {
        caller.data_mut().guard.work_area_full = true;
    }
    let WriteArgs { fd, iovs, iovs_len, offset, nwritten } = args;
    let result = match (write, pwrite, offset) {
        (Some(write), _, _) => write.call_async(&mut *caller, (fd, iovs, iovs_len, nwritten)).await,
        (_, Some(pwrite), Some(offset)) => {
            pwrite.call_async(&mut *caller, (fd, iovs, iovs_len, offset, nwritten)).await
        }
        _ => Err(wasmtime::Error::msg("fd_write guard: inconsistent arguments")),
    };
    if let Some(memory) = memory
        && !clips.is_empty()
    {
        restore_clips(memory.data_mut(&mut *caller), &clips);
    }
    let errno = result?;
    if let Some(requested) = requested {
        if errno == ERRNO_SUCCESS {
            // Stored by the call just now; were it unreadable, count the most it could be.
            let written = memory
                .and_then(|memory| read_u32(memory.data(&*caller), nwritten as u32 as u64))
                .map_or(requested, u64::from);
            caller.data_mut().guard.wrote(written);
        }
        caller.data_mut().guard.observe(errno);
    }
    Ok(errno)
}

// ---------------------------------------------------------------------------------------------
// Work directory

/// Page size the private tmpfs accounts in (it rounds every file up to whole pages).
const TMPFS_PAGE: u64 = 4096;

/// Inodes of the private tmpfs beyond the entry bound and the job's files: its root, the work
/// directory and some slack, so that the WASI-layer bound, which says why, is met first.
const TMPFS_SPARE_INODES: u64 = 16;

/// The most disk (or tmpfs) space a run's work area may take: the guest's `max_work_bytes`,
/// plus the job's files, plus a page per entry and spare inode for the rounding of each file
/// up to whole pages (so the WASI-layer bounds, which say which limit was hit, are met first).
/// Never 0, which would mean "unlimited" to tmpfs.
fn work_area_size(job: &SandboxJob) -> u64 {
    let limits = &job.limits;
    let files = job.files.iter().fold(0u64, |sum, (_, contents)| {
        sum.saturating_add((contents.len() as u64).div_ceil(TMPFS_PAGE).saturating_mul(TMPFS_PAGE))
    });
    let rounding = limits.max_work_entries.saturating_add(TMPFS_SPARE_INODES).saturating_mul(TMPFS_PAGE);
    limits.max_work_bytes.saturating_add(files).saturating_add(rounding).max(TMPFS_PAGE)
}

/// Start of the note of a run whose work directory is a host directory.
const HOST_WORK_DIR_NOTE: &str = "work dir: a host directory";

/// Where a run's work directory lives.
enum WorkDir {
    /// A tmpfs mounted only in the mount namespace of a helper thread that has since exited:
    /// reachable only through the pre-opened descriptor, freed by the kernel when the store
    /// closes it, or when the process dies, however it dies.
    PrivateTmpfs,
    /// A marked host directory (from [`residue::create_work_dir`]): removed after the run, and
    /// by the next process's sweep when this one is killed first.
    Host(tempfile::TempDir),
}

/// Per-process counter naming the work directories inside private tmpfs mounts.
static TMPFS_RUNS: AtomicU64 = AtomicU64::new(0);

/// Creates the job's work directory with its files and pre-opens it in `wasi` at
/// [`GUEST_WORK_DIR`] (so it is the guest's descriptor 3): on a private tmpfs when the process
/// may mount one (root, or `CAP_SYS_ADMIN`) and `sandbox` allows it, else in a marked host
/// directory. Returns where it is, the path it has (on the host, or inside the helper thread's
/// namespace, where it existed), and the note of a fallback.
fn prepare_work_dir(
    sandbox: &WasmSandbox,
    wasi: &mut WasiCtxBuilder,
    job: &SandboxJob,
) -> Result<(WorkDir, PathBuf, Option<String>), SandboxError> {
    let refused = if sandbox.host_work_dir {
        "the sandbox asks for a host directory".to_string()
    } else {
        let name = format!(
            "{}{}-{}",
            residue::WORK_DIR_PREFIX,
            std::process::id(),
            TMPFS_RUNS.fetch_add(1, Ordering::Relaxed)
        );
        let mount_point = std::env::temp_dir();
        let path = mount_point.join(name);
        let attempt = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("switchyard-wasm-tmpfs".into())
                .spawn_scoped(scope, || in_private_tmpfs(wasi, job, &mount_point, &path))
                .map_err(SandboxError::WorkDir)?
                .join()
                .unwrap_or_else(|_| Err(SandboxError::WorkDir(io::Error::other("the work-directory thread panicked"))))
        })?;
        match attempt {
            Ok(()) => return Ok((WorkDir::PrivateTmpfs, path, None)),
            Err(reason) => reason,
        }
    };
    let dir = residue::create_work_dir().map_err(SandboxError::WorkDir)?;
    // The guest sees a subdirectory: the owner marker beside it stays out of its reach.
    let path = dir.path().join("work");
    fill_work_dir(wasi, job, &path)?;
    let note = format!(
        "{HOST_WORK_DIR_NOTE} (no private tmpfs: {refused}); removed after the run, or by the next \
         start's sweep if this process is killed"
    );
    Ok((WorkDir::Host(dir), path, Some(note)))
}

/// Creates `path` (mode 0700) with the job's files and pre-opens it at [`GUEST_WORK_DIR`].
fn fill_work_dir(wasi: &mut WasiCtxBuilder, job: &SandboxJob, path: &Path) -> Result<(), SandboxError> {
    std::fs::DirBuilder::new().mode(0o700).create(path).map_err(SandboxError::WorkDir)?;
    for (name, contents) in &job.files {
        std::fs::write(path.join(name), contents)
            .map_err(|source| SandboxError::WriteFile { name: name.clone(), source })?;
    }
    wasi.preopened_dir(path, GUEST_WORK_DIR, FsPerms::ReadWrite)
        .map_err(|e| SandboxError::WorkDir(io::Error::other(format!("cannot pre-open {}: {e:#}", path.display()))))?;
    Ok(())
}

/// Runs on a helper thread that exits afterwards: moves it into a mount namespace of its own
/// (`unshare(CLONE_NEWNS)`, which a thread of a multi-threaded process may do), makes every
/// mount there private (so nothing propagates back to the host), mounts a tmpfs sized for the
/// job over `mount_point` there, and creates and pre-opens `path` on it. The pre-open's
/// descriptor keeps the tmpfs alive and usable from any thread after the namespace is gone; no
/// other process or thread ever sees it. `Ok(Err(reason))`: the kernel refused (not root,
/// no `CAP_SYS_ADMIN`, seccomp), nothing was changed outside this thread.
fn in_private_tmpfs(
    wasi: &mut WasiCtxBuilder,
    job: &SandboxJob,
    mount_point: &Path,
    path: &Path,
) -> Result<Result<(), String>, SandboxError> {
    let limits = &job.limits;
    let size = work_area_size(job);
    let inodes = limits.max_work_entries.saturating_add(job.files.len() as u64).saturating_add(TMPFS_SPARE_INODES);
    let options = format!("size={size},nr_inodes={inodes},mode=0700");
    let (Ok(options), Ok(target)) = (CString::new(options), CString::new(mount_point.as_os_str().as_bytes())) else {
        return Ok(Err(format!("{} contains a NUL byte", mount_point.display())));
    };
    // SAFETY: unshare takes only flags; it changes the namespaces of this thread alone.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Ok(Err(format!("unshare(CLONE_NEWNS): {}", io::Error::last_os_error())));
    }
    // SAFETY: valid NUL-terminated strings and null pointers where mount(2) allows them; this
    // thread's mount namespace is its own since the unshare above.
    let private = unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    };
    if private != 0 {
        return Ok(Err(format!("making / private: {}", io::Error::last_os_error())));
    }
    // SAFETY: as above; `options` outlives the call.
    let mounted = unsafe {
        libc::mount(
            c"switchyard-work".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            options.as_ptr().cast(),
        )
    };
    if mounted != 0 {
        return Ok(Err(format!("mounting a tmpfs: {}", io::Error::last_os_error())));
    }
    fill_work_dir(wasi, job, path)?;
    Ok(Ok(()))
}

// ---------------------------------------------------------------------------------------------
// WASI command runner

/// Store state of a WASI command run.
pub struct CommandState {
    wasi: WasiP1Ctx,
    limiter: MemoryLimiter,
    guard: WorkGuard,
}

/// Runs WASI preview 1 command modules (`_start`): the job's `program` is the module file, its
/// `args` follow the module's file stem as `argv[0]`, its files are placed in the work
/// directory, pre-opened at [`GUEST_WORK_DIR`]. See the module documentation for the limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WasmSandbox {
    /// Host directories pre-opened read-only, as (host path, guest path).
    pub read_only_dirs: Vec<(PathBuf, String)>,
    /// Put every work directory in a marked host directory (swept after a crash) even where a
    /// private tmpfs could be mounted; for tests of that fallback. Off by default.
    pub host_work_dir: bool,
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

    /// The same sandbox with [`WasmSandbox::host_work_dir`] set.
    pub fn with_host_work_dir(mut self) -> Self {
        self.host_work_dir = true;
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
            "work area: bytes written, entries created and open files bounded in WASI".to_string(),
            if outcome.isolation.notes.iter().any(|n| n.starts_with(HOST_WORK_DIR_NOTE)) {
                "work dir: host directory".to_string()
            } else {
                "work dir: private tmpfs".to_string()
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

/// Notes every wasm outcome carries: limits of a process whose wasm counterpart is weaker.
const COMMAND_NOTES: [&str; 1] = ["file size: no per-file limit, only the work area's (max_work_bytes written in all)"];

/// The command module linked against the guarded WASI (not yet instantiated), cached per
/// module. The guards find the originals they call in the store, so one link serves all runs.
fn command_pre(linkers: &CommandLinkers, loaded: &LoadedModule) -> Result<InstancePre<CommandState>, SandboxError> {
    if let Some(pre) = lock(&COMMANDS).get(&loaded.sha256) {
        return Ok(pre.clone());
    }
    let failed =
        |e: wasmtime::Error| SandboxError::WasmInstantiate { module: loaded.name.clone(), reason: format!("{e:#}") };
    let pre = linkers.guarded.instantiate_pre(&loaded.module).map_err(failed)?;
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
/// caller is itself inside a tokio runtime, which cannot block, a scoped thread does it. Either
/// way one OS thread polls the future from start to end: a command run's CPU budget reads that
/// thread's CPU clock (a multi-thread executor would move the guest between threads).
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
    let linkers = linkers()?;
    let pre = command_pre(linkers, loaded)?;
    // The guest's whole bound, reserved against the process's budget before anything of it
    // exists (its work area, its descriptors, its clocks): held until this function returns.
    let _reservation = GuestBudget::process().reserve(Demand {
        memory_bytes: limits.address_space_bytes.saturating_add(work_area_size(job)),
        descriptors: limits.max_open_files.saturating_add(sandbox.read_only_dirs.len() as u64).saturating_add(GUEST_DESCRIPTOR_SLACK),
    });

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
    // First, so that the work directory is the guest's descriptor 3.
    let (work, work_path, work_note) = prepare_work_dir(sandbox, &mut wasi, job)?;
    for (host, guest) in &sandbox.read_only_dirs {
        wasi.preopened_dir(host, guest, FsPerms::ReadOnly).map_err(instantiate_error)?;
    }
    let mut wasi = wasi.build_p1();
    let table = wasi.ctx().table;
    let table_cap = limits.max_open_files.saturating_add(RESOURCE_TABLE_SLACK);
    if let Ok(cap) = usize::try_from(table_cap)
        && cap < table.max_capacity()
    {
        table.set_max_capacity(cap);
    }
    let mut guard = WorkGuard::new(limits);
    if matches!(work, WorkDir::Host(_)) {
        guard.host_dir = Some((work_path.clone(), work_area_size(job)));
    }
    let state = CommandState { wasi, limiter: MemoryLimiter::new(limits.address_space_bytes), guard };
    let mut store = Store::new(engine()?, state);
    store.limiter(|state| &mut state.limiter);

    let started = Instant::now();
    let deadline = started + limits.wall_time;
    let cpu_limit_hit = Arc::new(AtomicBool::new(false));
    let (ended, cpu_seconds) = {
        let store = &mut store;
        let pre = &pre;
        let hit = Arc::clone(&cpu_limit_hit);
        block_on(async move {
            // On the thread that runs the guest (`block_on` may use a thread of its own).
            let cpu_start = thread_cpu_seconds();
            arm_deadline(store, deadline, Some(CpuBudget { start: cpu_start, limit: limits.cpu_seconds as f64, hit }));
            let guest = async {
                let instance = match pre.instantiate_async(&mut *store).await {
                    Ok(instance) => instance,
                    Err(e) => return Ended::NotStarted(e),
                };
                match Originals::set_up(&linkers.plain, store, &instance).await {
                    Ok(originals) => store.data_mut().guard.originals = Some(originals),
                    Err(e) => return Ended::NotStarted(e),
                }
                let start = match instance.get_typed_func::<(), ()>(&mut *store, "_start") {
                    Ok(start) => start,
                    Err(e) => return Ended::NotStarted(e),
                };
                Ended::Ran(start.call_async(&mut *store, ()).await)
            };
            let ended = tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), guest)
                .await
                .unwrap_or(Ended::DeadlineInHostCall);
            (ended, (thread_cpu_seconds() - cpu_start).max(0.0))
        })?
    };
    let wall_seconds = started.elapsed().as_secs_f64();
    let cpu_limit_hit = cpu_limit_hit.load(Ordering::Relaxed);
    let limiter = &store.data().limiter;
    let (memory_denied, peak_bytes) = (limiter.denied, limiter.peak_bytes);
    let guard = &store.data().guard;
    let (work_area_full, open_files_refused) = (guard.work_area_full, guard.open_files_refused);

    let mut timed_out = false;
    // Whether the CPU budget's interrupt is what ended the run (not only that it fired).
    let mut cpu_stopped = false;
    let (termination, trap) = match ended {
        Ended::Ran(Ok(())) => (Termination::Exited(0), None),
        Ended::Ran(Err(e)) => match e.downcast_ref::<I32Exit>() {
            Some(exit) => (Termination::Exited(exit.0), None),
            None if is_interrupt(&e) && cpu_limit_hit => {
                cpu_stopped = true;
                (Termination::Trapped, Some("CPU time limit reached (epoch check)".to_string()))
            }
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
        Ended::NotStarted(e) if is_interrupt(&e) && cpu_limit_hit => {
            cpu_stopped = true;
            (Termination::Trapped, Some("CPU time limit reached while starting".to_string()))
        }
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
    if cpu_stopped {
        limits_hit.push(LimitHit::CpuTime);
    }
    if stdout_truncated || stderr_truncated {
        limits_hit.push(LimitHit::Output);
    }
    if memory_denied {
        limits_hit.push(LimitHit::Memory);
    }
    if work_area_full {
        limits_hit.push(LimitHit::WorkArea);
    }
    if open_files_refused {
        limits_hit.push(LimitHit::OpenFiles);
    }
    // The store, dropped above, held the last descriptor of a private tmpfs: the kernel has
    // freed it. A host directory is removed here.
    let cleanup_error = match work {
        WorkDir::PrivateTmpfs => None,
        WorkDir::Host(dir) => dir.close().err().map(|e| e.to_string()),
    };
    let mut notes: Vec<String> = COMMAND_NOTES.iter().map(|n| n.to_string()).collect();
    notes.extend(work_note);
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
            // A guest makes no system call of its own: it holds what WASI gives it, nothing else.
            no_capabilities: true,
            notes,
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
    let _reservation = GuestBudget::process().reserve(Demand { memory_bytes, descriptors: 0 });
    let mut store = Store::new(engine()?, MemoryLimiter::new(memory_bytes));
    store.limiter(|limiter| limiter);
    arm_deadline(&mut store, Instant::now() + wall_time, None);
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

    /// Guest memory with a ciovec array at 0: the given lengths (buffers at 1024).
    fn iovecs(lengths: &[u32]) -> Vec<u8> {
        let mut data = vec![0u8; 2048];
        for (i, len) in lengths.iter().enumerate() {
            data[8 * i..8 * i + 4].copy_from_slice(&1024u32.to_le_bytes());
            data[8 * i + 4..8 * i + 8].copy_from_slice(&len.to_le_bytes());
        }
        data
    }

    #[test]
    fn writes_within_the_budget_pass_unchanged() {
        let mut data = iovecs(&[10, 20]);
        let before = data.clone();
        assert_eq!(plan_write(&mut data, 0, 2, 30), WritePlan::Counted { requested: 30, clips: vec![] });
        assert_eq!(data, before);
        // Nothing left, nothing asked: a zero-length write is no write.
        assert_eq!(plan_write(&mut data, 0, 0, 0), WritePlan::Counted { requested: 0, clips: vec![] });
    }

    #[test]
    fn writes_beyond_the_budget_are_cut_to_it_and_restored() {
        let mut data = iovecs(&[10, 20, 5]);
        let before = data.clone();
        let plan = plan_write(&mut data, 0, 3, 15);
        let clips = vec![Clip { at: 12, len: 20, kept: 5 }, Clip { at: 20, len: 5, kept: 0 }];
        assert_eq!(plan, WritePlan::Counted { requested: 15, clips: clips.clone() });
        assert_eq!((read_u32(&data, 4), read_u32(&data, 12), read_u32(&data, 20)), (Some(10), Some(5), Some(0)));
        restore_clips(&mut data, &clips);
        assert_eq!(data, before);
        // A length the call overwrote (nwritten aimed at it) is left as the call stored it.
        let plan = plan_write(&mut data, 0, 3, 15);
        let WritePlan::Counted { clips, .. } = plan else { panic!("{plan:?}") };
        assert!(write_u32(&mut data, 12, 7));
        restore_clips(&mut data, &clips);
        assert_eq!((read_u32(&data, 12), read_u32(&data, 20)), (Some(7), Some(5)));
    }

    #[test]
    fn a_full_work_area_refuses_and_odd_arrays_are_safe() {
        let mut data = iovecs(&[1]);
        assert_eq!(plan_write(&mut data, 0, 1, 0), WritePlan::Refused(ERRNO_NOSPC));
        assert_eq!(plan_write(&mut data, 0, IOV_MAX + 1, 100), WritePlan::Refused(ERRNO_INVAL));
        // Entries beyond memory end the scan (the original call fails on them); an array that
        // starts beyond memory, or at the top of the address space, asks for nothing.
        assert_eq!(plan_write(&mut data, 2040, 4, 100), WritePlan::Counted { requested: 0, clips: vec![] });
        assert_eq!(plan_write(&mut data, u32::MAX - 3, 2, 100), WritePlan::Counted { requested: 0, clips: vec![] });
        assert_eq!(read_u32(&data, u64::MAX), None);
        assert!(!write_u32(&mut data, 2046, 1));
    }

    #[test]
    fn the_guard_follows_descriptors_through_close_and_renumber() {
        let limits =
            SandboxLimits { max_open_files: 2, max_work_entries: 1, max_work_bytes: 100, ..SandboxLimits::default() };
        let mut guard = WorkGuard::new(&limits);
        assert_eq!(guard.admit_open(), None);
        guard.opened(4);
        guard.opened(5);
        assert_eq!(guard.admit_open(), Some(ERRNO_MFILE));
        assert!(guard.open_files_refused);
        // A counted descriptor moved onto stdout: still counted, and no longer a stream.
        guard.renumbered(4, 1);
        assert_eq!((guard.opened.len(), guard.streams.contains(&1)), (2, false));
        // stderr moved onto a counted descriptor closes that one and is a stream there.
        guard.renumbered(2, 5);
        assert_eq!((guard.opened.len(), guard.streams.contains(&5)), (1, true));
        guard.closed(1);
        assert!(guard.opened.is_empty());
        // Entries and sizes.
        assert_eq!(guard.admit_entry(), None);
        guard.created(ERRNO_SUCCESS);
        assert_eq!(guard.admit_entry(), Some(ERRNO_NOSPC));
        assert_eq!(guard.admit_size(7, 101), Some(ERRNO_FBIG));
        assert_eq!((guard.admit_size(7, 100), guard.admit_size(7, -1)), (None, None));
    }

    #[test]
    fn the_guard_shim_compiles_and_the_work_area_is_never_unlimited() {
        let shim = shim_module().expect("the shim compiles");
        let imports: Vec<String> = shim.module.imports().map(|i| format!("{}::{}", i.module(), i.name())).collect();
        assert_eq!(imports.len(), GUARDED_FUNCS.len() + 1);
        assert_eq!(imports[0], "guest::memory");
        assert!(shim.module.get_export("memory").is_some() && shim.module.get_export("path_open").is_some());
        let mut job = SandboxJob::new("guest.wasm", vec![]);
        job.limits.max_work_bytes = 0;
        job.limits.max_work_entries = 0;
        assert!(work_area_size(&job) >= TMPFS_PAGE);
        job.files.push(("a".into(), vec![0; 5000]));
        assert_eq!(work_area_size(&job), 2 * TMPFS_PAGE + TMPFS_SPARE_INODES * TMPFS_PAGE);
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
    /// A running guest holds its bound in the process's budget, and gives it back when it ends
    /// (other tests' guests may run meanwhile: their reservations only add).
    #[test]
    fn a_running_guest_holds_its_memory_in_the_process_budget() {
        const BIG: u64 = 1 << 40;
        let module = module_from_wat("grow", GROW).expect("compiles");
        let end = run_compute(&module, BIG, Duration::from_secs(5), |_, _| Ok(GuestBudget::process().in_use()))
            .expect("runs");
        let ComputeEnd::Done((held, guests)) = end else { panic!("{end:?}") };
        assert!(held.memory_bytes >= BIG && guests >= 1, "{held:?} {guests}");
        // A terabyte is past any machine's budget: it ran alone, and it is gone now.
        assert!(GuestBudget::process().in_use().0.memory_bytes < BIG);
    }
}
