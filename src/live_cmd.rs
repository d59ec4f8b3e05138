//! `switchyard run --live`: the same sessions as `switchyard run`, on the live runtime (actors on
//! tokio, wall-clock time) against the engines a live pool file names per device — for the
//! bundled `workflows/pools/live-emulated.yaml`, `switchyard emulate` child processes this
//! binary starts itself through the `vllm` engine's command template.
//!
//! CLI glue only (errors are `anyhow` here): it reads the live pool file, takes the clock's
//! speed from the pool's engines, and hands everything to `switchyard_runtime::live`.
//!
//! Must not depend on the binary's other modules (`crate::…`: `tests/live_e2e.rs` includes this
//! file on its own) nor on the simulator.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use switchyard_runtime::exec::{PoolSpec, RunConfig};
use switchyard_runtime::live::engines::EngineSpec;
use switchyard_runtime::live::{self, LiveConfig, LiveOutput, LivePoolSpec, PoolEngines, Progress};

/// What a live run needs beyond the simulator's flags.
#[derive(Clone, Default)]
pub struct LiveOptions {
    /// Fail whatever is still open after this many wall seconds.
    pub deadline_s: Option<f64>,
    /// Ask engines to stream their answers.
    pub stream: bool,
    /// The `switchyard` binary that command templates starting with `switchyard` run
    /// (`None`: this executable).
    pub switchyard_exe: Option<PathBuf>,
    /// Where notes go as they happen (`None`: only in the output).
    pub on_note: Option<live::NoteSink>,
    /// Record the run's events (`--trace`).
    pub keep_trace: bool,
}

/// The planner's view of a live pool file (its devices, without the engines), for building the
/// [`RunConfig`] that [`run_live`] takes.
pub fn pool_spec(path: &Path) -> Result<PoolSpec> {
    let pool: LivePoolSpec<EngineSpec> = LivePoolSpec::load(path).map_err(|e| anyhow!("{e}"))?;
    // Every device needs its engine to run live: said now, before the run starts.
    pool.engines().map_err(|e| anyhow!("{e}"))?;
    Ok(pool.pool)
}

/// Run `run` (whose pool is replaced by the live pool file's) on the live runtime.
/// `progress(ended, total)` is called as sessions end.
#[allow(dead_code)] // used by tests/live_e2e.rs, which includes this file
pub fn run_live(run: RunConfig, pool_path: &Path, options: &LiveOptions, progress: Option<Progress>) -> Result<LiveOutput> {
    run_live_interruptible(run, pool_path, options, progress, None)
}

/// [`run_live`] that stops when `interrupt` is set (Ctrl-C): what is open fails as
/// `interrupted`, as at a deadline, and the report says `interrupted: true`.
#[allow(dead_code)] // tests/live_e2e.rs includes this file and calls only `run_live`
pub fn run_live_interruptible(
    run: RunConfig,
    pool_path: &Path,
    options: &LiveOptions,
    progress: Option<Progress>,
    interrupt: Option<Arc<AtomicBool>>,
) -> Result<LiveOutput> {
    prepare_live(run, pool_path, options, interrupt)?.run(progress)
}

/// A live run made ready to start: the pool file's engines built (and engines an earlier run
/// left behind swept), the clock's speed read from their commands, the deadline checked —
/// every error the pool file and the flags can cause, found before the run shows progress.
pub struct PreparedLive {
    cfg: LiveConfig,
    engines: PoolEngines,
}

/// Prepare `run` (whose pool is replaced by the live pool file's) for the live runtime; see
/// [`PreparedLive`].
pub fn prepare_live(
    mut run: RunConfig,
    pool_path: &Path,
    options: &LiveOptions,
    interrupt: Option<Arc<AtomicBool>>,
) -> Result<PreparedLive> {
    let pool: LivePoolSpec<EngineSpec> = LivePoolSpec::load(pool_path).map_err(|e| anyhow!("{e}"))?;
    let exe = match &options.switchyard_exe {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("cannot locate the switchyard binary")?,
    };
    let engines = PoolEngines::new(&pool, run.noise_seed, Some(exe)).map_err(|e| anyhow!("{e}"))?;
    // Engines a killed earlier run left behind (the registry's sweep, done by `PoolEngines::new`).
    for n in engines.sweep_notes() {
        match &options.on_note {
            Some(sink) => sink(n),
            None => eprintln!("note: {n}"),
        }
    }
    let speed = engines.speed().map_err(|e| anyhow!("{}: {e}", pool_path.display()))?;
    run.pool = pool.pool;
    let mut cfg = LiveConfig::new(run);
    cfg.speed = speed;
    cfg.stream = options.stream;
    cfg.interrupt = interrupt;
    cfg.on_note = options.on_note.clone();
    cfg.keep_trace = options.keep_trace;
    if let Some(s) = options.deadline_s {
        let d = Duration::try_from_secs_f64(s)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| anyhow!("--deadline: {s} is not a positive number of seconds"))?;
        cfg.deadline = Some(d);
    }
    Ok(PreparedLive { cfg, engines })
}

impl PreparedLive {
    /// Run it. `progress(ended, total)` is called as sessions end.
    pub fn run(self, progress: Option<Progress>) -> Result<LiveOutput> {
        live::run_blocking(&self.cfg, Arc::new(self.engines), progress).map_err(|e| anyhow!("live run: {e}"))
    }
}
