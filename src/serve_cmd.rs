//! `switchyard serve`: the live runtime as a long-running service with a REST API
//! (`switchyard_runtime::serve`) over the engines a live pool file names. CLI edge only: it
//! reads the flags, the pool and the start-up workflows, the API token, starts the service and
//! serves until SIGINT/SIGTERM, then fails what is open and reclaims every engine.
//!
//! Must not depend on the simulator or the bench: it serves the live runtime only.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use switchyard_runtime::exec::RunConfig;
use switchyard_runtime::live::engines::EngineSpec;
use switchyard_runtime::live::journal::Journal;
use switchyard_runtime::live::{self, LiveConfig, LivePoolSpec, PoolEngines, Service};
use switchyard_runtime::planner::{POLICIES, Reclaim};
use switchyard_runtime::serve::{self, ApiConfig};

/// Environment variable holding the API's bearer token (when `--token-file` is not given).
pub const TOKEN_ENV: &str = "SWITCHYARD_API_TOKEN";

/// Serve workflows over a REST API on the live runtime.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Live pool file: the devices and the engine serving each (e.g.
    /// `workflows/pools/live-emulated.yaml`).
    #[arg(long)]
    pub pool: PathBuf,
    /// A workflow served from the start (repeatable). The deployments of these workflows are
    /// the served deployment table: workflows registered later must use them.
    #[arg(long = "workflow", required = true)]
    pub workflows: Vec<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// File holding the API's bearer token (default: the `SWITCHYARD_API_TOKEN` variable).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Serve without authentication (refused unless the address is a loopback one).
    #[arg(long)]
    pub no_auth: bool,
    /// Directory of the journal of durable sessions: every run, session, activation intent and
    /// result is recorded there, and a restart on the same directory resumes what was unfinished.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Keep the status and final output of at most this many ended sessions in memory (older
    /// ones read `unknown`; with `--state` the journal keeps every outcome, and a restart reads
    /// back at most this many, those of the newest ended runs).
    #[arg(long, default_value_t = 100_000)]
    pub keep_ended: usize,
    /// Past this many runs, the oldest runs whose sessions were all forgotten (`--keep-ended`)
    /// are dropped from `/v1/runs`.
    #[arg(long, default_value_t = 1000)]
    pub keep_runs: usize,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20, value_parser = at_least_one)]
    pub max_body_bytes: usize,
    /// Most workflows registered at once, those the server started with and those a journal
    /// restores included: a registration past it gets 429 (a workflow is never unregistered,
    /// and each holds its parsed graph and the planner's tables for it).
    #[arg(long, default_value_t = 1000, value_parser = at_least_one)]
    pub max_workflows: usize,
    /// Most front-door programs open at once (keyed by `X-Session-ID` or `program_id`; each
    /// holds an actor and its last prompt until it ends or idles out): a call that would open
    /// one more gets 429.
    #[arg(long, default_value_t = 10_000, value_parser = at_least_one)]
    pub max_programs: usize,
    /// Answer limit (tokens) of a front-door chat call that sets no `max_tokens`, capped by
    /// what the context leaves after its prompt (vLLM's generation-config `max_new_tokens`).
    /// Without it such a call may run to the context's end, vLLM's default — and under `joint`
    /// holds KV for all of it while it runs, so fewer calls share a replica.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..i64::from(u32::MAX)))]
    pub default_max_tokens: Option<u32>,
    /// Scheduling policy.
    #[arg(long, default_value = "joint", value_parser = clap::builder::PossibleValuesParser::new(POLICIES))]
    pub policy: String,
    /// Estimates the planner uses (`graph`, `gbdt`, `formula`, `oracle`).
    #[arg(long, default_value = "graph")]
    pub predictor: String,
    /// Seed of the emulated outputs.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Seed of the engines' timing noise.
    #[arg(long, default_value_t = 0)]
    pub noise_seed: u64,
    /// Threads that execute tool calls.
    #[arg(long, default_value_t = 2)]
    pub tool_workers: usize,
    /// Batch limit per replica (vLLM --max-num-seqs).
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: u32,
    /// Reclaim idle replicas by vLLM sleep mode instead of unloading them.
    #[arg(long)]
    pub sleep: bool,
    /// Ask the engines for whole answers instead of streams.
    #[arg(long)]
    pub no_stream: bool,
}

/// The API token: `--token-file`'s first line, else the environment; `None` only with
/// `--no-auth` on a loopback address.
fn token(args: &ServeArgs) -> Result<Option<String>> {
    let token = match &args.token_file {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("--token-file {}", p.display()))?;
            Some(text.lines().next().unwrap_or("").trim().to_string())
        }
        None => std::env::var(TOKEN_ENV).ok().map(|t| t.trim().to_string()),
    };
    match (token, args.no_auth) {
        (Some(_), true) => bail!("--no-auth with a token: choose one"),
        (Some(t), false) if t.len() < 16 => bail!("the API token must be at least 16 characters"),
        (Some(t), false) => Ok(Some(t)),
        (None, true) if args.listen.ip().is_loopback() => Ok(None),
        (None, true) => bail!("--no-auth is allowed only on a loopback address (not {})", args.listen),
        (None, false) => bail!("no API token: pass --token-file FILE or set {TOKEN_ENV} (or --no-auth on a loopback address)"),
    }
}

/// Runs `switchyard serve` until interrupted.
pub fn run(args: ServeArgs) -> Result<()> {
    let token = token(&args)?;
    let workflows = crate::load_all(&args.workflows)?;
    let texts: Vec<String> = args
        .workflows
        .iter()
        .map(|p| std::fs::read_to_string(p).with_context(|| p.display().to_string()))
        .collect::<Result<_>>()?;
    let pool: LivePoolSpec<EngineSpec> = LivePoolSpec::load(&args.pool).map_err(|e| anyhow!("{e}"))?;
    let mut run = RunConfig::served(workflows.clone(), pool.pool.clone());
    run.seed = args.seed;
    run.noise_seed = args.noise_seed;
    run.policy = args.policy.clone();
    run.predictor = args.predictor.clone();
    run.tool_workers = args.tool_workers;
    run.max_num_seqs = args.max_num_seqs;
    run.substrate.reclaim = if args.sleep { Reclaim::Sleep } else { Reclaim::Unload };
    crate::preflight(&run, true)?;
    let interrupt = crate::progress::on_ctrl_c_doing("stopping the server (with --state, open sessions resume at the next start)")?;
    let exe = std::env::current_exe().context("cannot locate the switchyard binary")?;
    let engines = PoolEngines::new(&pool, args.noise_seed, Some(exe)).map_err(|e| anyhow!("{e}"))?;
    for n in engines.sweep_notes() {
        eprintln!("note: {n}");
    }
    let speed = engines.speed().map_err(|e| anyhow!("{}: {e}", args.pool.display()))?;
    let mut cfg = LiveConfig::new(run);
    cfg.speed = speed;
    cfg.stream = !args.no_stream;
    cfg.keep_ended = args.keep_ended;
    cfg.max_programs = args.max_programs;
    cfg.front_door_max_tokens = args.default_max_tokens;
    let on_note: live::NoteSink = Arc::new(|line: &str| eprintln!("note: {line}"));
    cfg.on_note = Some(on_note);
    let api_config = ApiConfig { token, max_body_bytes: args.max_body_bytes, keep_runs: args.keep_runs, keep_ended: args.keep_ended.max(1), max_workflows: args.max_workflows, ..ApiConfig::default() };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("switchyard-serve")
        .build()
        .context("tokio runtime")?;
    let listen = args.listen;
    let state = args.state.clone();
    runtime.block_on(async move {
        // The address first: a start that cannot listen (the port is taken) must stop before the
        // journal's open sessions resume, or each failed start would count as another attempt of
        // every activation they had in flight.
        let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
        let service = Arc::new(Service::start(&cfg, Arc::new(engines)).await.map_err(|e| anyhow!("{e}"))?);
        let startup = workflows.iter().cloned().zip(texts).enumerate().map(|(i, (w, t))| (i as u32, w, t)).collect();
        let app = match &state {
            None => serve::router(Arc::clone(&service), api_config, startup),
            Some(dir) => {
                // `Journal::open` creates the directory, its owner's alone (0700).
                let journal = Arc::new(Journal::open(dir).map_err(|e| anyhow!("--state {}: {e}", dir.display()))?);
                for note in journal.notes() {
                    eprintln!("switchyard serve: note: {note}");
                }
                let (app, restored) = serve::durable_router(Arc::clone(&service), api_config, startup, journal)
                    .await
                    .map_err(|e| anyhow!("--state {}: {e}", dir.display()))?;
                if restored.runs > 0 || restored.workflows > 0 {
                    eprintln!(
                        "switchyard serve: journal {}: {} workflows registered again, {} runs ({} ended ones past --keep-runs left in the journal), {} sessions ended before, {} resumed",
                        dir.display(),
                        restored.workflows,
                        restored.runs,
                        restored.runs_left_in_journal,
                        restored.ended_sessions,
                        restored.resumed_sessions
                    );
                }
                for why in &restored.workflows_skipped {
                    eprintln!("switchyard serve: journal {}: workflow {why}; not registered again", dir.display());
                }
                app
            }
        };
        let bound = listener.local_addr().context("listening address")?;
        eprintln!("switchyard serve: listening on http://{bound} (policy {}, {} devices)", cfg.run.policy, cfg.run.pool.devices.len());
        // On SIGINT/SIGTERM: fail what is open and reclaim the engines first (event streams
        // then see their runs end), then stop accepting; connections still open 5 s later
        // are dropped.
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
        let svc = Arc::clone(&service);
        let stopper = tokio::spawn(async move {
            while !interrupt.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let out = svc.shutdown("the server stopped").await;
            let _ = stopped_tx.send(());
            out
        });
        let (drain_tx, drain_rx) = tokio::sync::oneshot::channel::<()>();
        let server = serve::serve_until(listener, app, async move {
            let _ = stopped_rx.await;
            let _ = drain_tx.send(());
        });
        let drained = async move {
            let _ = drain_rx.await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        };
        tokio::select! {
            r = server => r.context("serving")?,
            () = drained => {}
        }
        let out = stopper.await.map_err(|e| anyhow!("{e}"))?.map_err(|e| anyhow!("{e}"))?;
        let resumable = if state.is_some() { "; journaled sessions resume at the next start on this --state" } else { "" };
        eprintln!(
            "switchyard serve: stopped; {} sessions completed, {} failed, {} interrupted by the stop{resumable}",
            out.report.sessions_completed,
            out.report.sessions_failed.saturating_sub(out.interrupted),
            out.interrupted
        );
        anyhow::Ok(())
    })
}

/// A count flag that means nothing at 0 (no request body, no workflow, no program would fit).
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}
