//! `switchyard`: the command-line edge. Parses arguments, loads files, runs the simulator or the
//! evaluations, and prints tables / JSON / SVG. Errors are `anyhow` here and only here.
//!
//! Must not depend on the library facade (`src/lib.rs`, `switchyard::…`) nor on the emulator
//! crate: the binary uses `switchyard_runtime` (and the predictor's evaluation, the tools' residue
//! sweep) directly.

mod bench_cmd;
mod emulate_cmd;
mod live_cmd;
mod pool_path;
mod progress;
mod serve_cmd;

/// Per-thread heaps: the live runtime allocates per streamed token on every worker thread.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use switchyard_runtime::exec::{self, Arrival, PoolSpec, RunConfig};
use switchyard_runtime::planner::{JointOptions, POLICIES, Reclaim, Substrate};
use switchyard_runtime::report::{RunReport, timeline};
use switchyard_runtime::sim::{self, Flow};
use switchyard_runtime::workflow::{WorkflowSpec, load_workflow};

#[derive(Parser)]
#[command(name = "switchyard", version, about = "Plan and run multi-agent LLM workflows on small heterogeneous GPU pools")]
struct Cli {
    /// Log lines (from `RUST_LOG`, e.g. `RUST_LOG=info` or `switchyard_runtime=debug`) on
    /// stderr as `text` or one JSON object per line (`json`). Nothing is logged without
    /// `RUST_LOG`.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run sessions of one or more workflows on the embedded emulated pool (virtual time).
    Run(RunArgs),
    /// Parse and validate workflow files; print a summary of each.
    Validate {
        #[arg(required = true)]
        workflows: Vec<PathBuf>,
        /// Pool file the deployments must fit (default: the run's default pool, when found).
        #[arg(long)]
        pool: Option<PathBuf>,
    },
    /// The Predictor: evaluate its estimators (Table 1 of paper 003).
    #[command(subcommand)]
    Predictor(PredictorCommand),
    /// Reproduce paper 003's evaluation (Figures 5–7) on the emulated pool.
    Bench(bench_cmd::BenchArgs),
    /// Serve one emulated replica over HTTP with vLLM's API (sleep mode, /metrics).
    Emulate(emulate_cmd::EmulateArgs),
    /// Serve workflows over a REST API on the live runtime (register, run, follow, cancel).
    Serve(serve_cmd::ServeArgs),
}

#[derive(Subcommand)]
enum PredictorCommand {
    /// Train every estimator and judge it on held-out models and devices (or on `--test`), on
    /// measured operator timings; whole activations: `switchyard bench predictor`.
    Eval {
        /// Training measurements in the Vidur profiling layout (default: the shipped ones,
        /// compiled into the binary).
        #[arg(long)]
        train: Option<PathBuf>,
        /// Test measurements in the same layout (default: leave-one-out splits of `--train`).
        #[arg(long)]
        test: Option<PathBuf>,
        /// Print JSON rows instead of a markdown table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct RunArgs {
    /// Workflow YAML files.
    #[arg(required_unless_present = "trace_replay")]
    workflows: Vec<PathBuf>,
    /// Replay the agent sessions of a JSONL trace (paper 000; format in
    /// `workflows/traces/README.md`) on an agent pool under `--scheduler`, instead of workflows.
    #[arg(long, conflicts_with_all = ["workflows", "live"])]
    trace_replay: Option<PathBuf>,
    /// With `--trace-replay`: the scheduler.
    #[arg(long, default_value = "tao", value_parser = clap::builder::PossibleValuesParser::new(["tao", "thunderagent", "dynamo", "vllm-rr", "vllm-ca"]))]
    scheduler: String,
    /// With `--trace-replay`: concurrent workers (closed loop).
    #[arg(long, default_value_t = 32)]
    workers: usize,
    /// With `--trace-replay --scheduler thunderagent`: the proxy's 2^−t decay of acting
    /// programs' tokens when it resumes paused ones (its `--use-acting-token-decay`, off as it
    /// ships; paper 002 ran it on).
    #[arg(long)]
    acting_decay: bool,
    /// With `--trace-replay`: the pool, `qwen32b-tp2x4` (4× Qwen3-32B TP2 on H100-80GB) or
    /// `qwen14b-a100x4` (4× Qwen3-14B on A100-80GB).
    #[arg(long, default_value = "qwen32b-tp2x4", value_parser = clap::builder::PossibleValuesParser::new(["qwen32b-tp2x4", "qwen14b-a100x4"]))]
    agent_pool: String,
    /// Sessions per workflow.
    #[arg(long, default_value_t = 60, conflicts_with = "trace_replay")]
    sessions: usize,
    /// `burst` (all at t = 0) or `poisson:RATE` (sessions per second, per workflow).
    #[arg(long, default_value = "burst", conflicts_with = "trace_replay")]
    arrival: Arrival,
    /// Seed of the arrival trace and of the emulated outputs.
    #[arg(long, default_value_t = 42, conflicts_with = "trace_replay")]
    seed: u64,
    /// Seed of the engines' timing noise (repetitions vary it).
    #[arg(long, default_value_t = 0)]
    noise_seed: u64,
    /// Pool file (relative paths are taken as given). Default: `workflows/pools/paper.yaml`,
    /// looked up in the current directory, then as `pools/paper.yaml` next to the first
    /// workflow file, then under the repository root above that workflow file.
    #[arg(long, conflicts_with = "trace_replay")]
    pool: Option<PathBuf>,
    /// Exit 0 even when sessions failed (the report still counts them).
    #[arg(long)]
    allow_failures: bool,
    /// Scheduling policy (workflows; `--trace-replay` runs under `--scheduler`).
    #[arg(long, default_value = "joint", conflicts_with = "trace_replay", value_parser = clap::builder::PossibleValuesParser::new(POLICIES))]
    policy: String,
    /// Ablation: do not fuse same-deployment chains (joint only).
    #[arg(long)]
    no_fusion: bool,
    /// Ablation: never prefetch for near-ready work (joint only).
    #[arg(long)]
    no_prefetch: bool,
    /// Ablation: each workflow plans its own model lifecycle (joint only).
    #[arg(long)]
    per_workflow_lifecycle: bool,
    /// Ablation (joint only): admit ready units onto resident replicas first-fit in rank order
    /// instead of by TAO's dynamic program over cache credit, tool-return readiness and tokens.
    #[arg(long)]
    no_tao_admission: bool,
    /// Variant (joint only): a departure from Eq. 12 — among lifecycle bindings whose predicted
    /// completion is within 10 % of the best, take the least capable device.
    #[arg(long)]
    resource_order: bool,
    /// Variant (joint only): a departure from paper 003 §3.3 — admit against the KV of each
    /// node's recent P90 output instead of its configured output limit (the engine preempts
    /// if outputs run longer, as under the baselines).
    #[arg(long)]
    history_admission: bool,
    /// Ablation (joint only): no drain-to-reclaim — by default, when the model that finishes
    /// last finds no device, a busy redundant copy of a more flexible model on a device it can
    /// use stops taking new units and is reclaimed once its admitted units finish.
    #[arg(long)]
    no_drain: bool,
    /// Ablation (joint only): no graph outlook — by default, while sessions in flight can still
    /// reach a model in their workflow graphs, a scale-out never reclaims its last replica, nor
    /// any replica of it when it is more constrained than the model scaling out; with this flag
    /// only ready and near-ready work protects a replica
    #[arg(long)]
    no_outlook: bool,
    /// Ablation (joint only): the graph outlook counts only sessions in flight — by default,
    /// while a workflow's sessions keep arriving (its last arrival at most three mean gaps
    /// ago), the models its next session will call count as called too
    #[arg(long)]
    no_arrival_outlook: bool,
    /// Ablation (joint only): rank ready units first come first served within a priority level;
    /// by default the unit whose session has the longest remaining critical path (expected
    /// tokens still to generate, further loop rounds counted) goes first
    #[arg(long)]
    fifo_rank: bool,
    /// Ablation (joint only): with `--sleep`, never put a replica to sleep (unload it); by
    /// default joint sleeps a replica it reclaims when its model has predicted next use and a
    /// sleep plus a wake costs less than a teardown plus a cold load.
    #[arg(long)]
    no_sleep: bool,
    /// Estimates the planner uses: `graph` (our Predictor), `gbdt`, `formula`, or `oracle`
    /// (the emulator's own costs; reference only).
    #[arg(long, default_value = "graph", conflicts_with = "trace_replay")]
    predictor: String,
    /// Print one JSON object instead of tables (progress lines still go to stderr).
    #[arg(long)]
    json: bool,
    /// Write every event of the run as JSON lines (the simulator's, or with `--live` the live
    /// runtime's, in the same schema; live times are wall seconds).
    #[arg(long, conflicts_with = "trace_replay")]
    trace: Option<PathBuf>,
    /// Draw the GPU timeline as SVG.
    #[arg(long, conflicts_with = "trace_replay")]
    timeline: Option<PathBuf>,
    /// Threads that execute tool calls.
    #[arg(long, default_value_t = 2, conflicts_with = "trace_replay")]
    tool_workers: usize,
    /// Keep the outcomes of sandboxed tool calls (MBPP's test runs) in this directory, and take
    /// them from it when a later run makes the same call: a repeated run does not run the same
    /// candidate programs again (the same report bytes). Content-addressed by the call and by
    /// what computes it (this executable, the sandbox backend, the interpreter, the uid, the
    /// kernel); the directory must be yours alone (created 0700). Simulator only.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["trace_replay", "live"])]
    tool_cache: Option<PathBuf>,
    /// Batch limit per replica (vLLM --max-num-seqs).
    #[arg(long, default_value_t = 256, conflicts_with = "trace_replay")]
    max_num_seqs: u32,
    /// Substrate: most replicas of one model, for every policy (default: the pool is the limit).
    #[arg(long, conflicts_with = "trace_replay")]
    replica_cap: Option<usize>,
    /// Substrate: reactive scale-out adds a replica when more than this many units per replica
    /// could not run at once (every policy's substrate; see README "What each policy may do").
    #[arg(long, default_value_t = 1.0, conflicts_with = "trace_replay")]
    scale_out_waiting: f64,
    /// Substrate: … for at least this many seconds (Ray Serve's default upscale_delay_s).
    #[arg(long, default_value_t = switchyard_runtime::planner::substrate::RAY_SERVE_UPSCALE_DELAY_S, conflicts_with = "trace_replay")]
    upscale_delay: f64,
    /// Substrate: reclaim idle replicas by vLLM sleep mode instead of unloading them (level 1
    /// where the node's host memory holds the weights, else level 2); a later load of the same
    /// model on that GPU wakes it. Every policy's substrate; off by default (paper 003's).
    #[arg(long, conflicts_with = "trace_replay")]
    sleep: bool,
    /// Seconds the agent framework takes to hand a finished call's output to the next call
    /// (simulator; MAFBench's LangGraph overhead by default). The replica is free meanwhile.
    #[arg(long, default_value_t = switchyard_runtime::exec::FRAMEWORK_HANDOFF_S, conflicts_with = "trace_replay")]
    handoff_delay: f64,
    /// Routed workflows (paper 002): judge every program by this verifier (`gsm8k_exact`,
    /// `tests_pass`, `rouge_l`, `verdict`) instead of the one its request classifies to — the
    /// single-verifier comparison.
    #[arg(long, value_name = "VERIFIER", conflicts_with = "trace_replay")]
    single_verifier: Option<String>,
    /// Routed workflows: the reward's cost weight a (r = success − a·cost/scale; cost = the
    /// program's compute in billions of parameter-tokens).
    #[arg(long, default_value_t = 0.0, conflicts_with = "trace_replay")]
    cost_weight: f64,
    /// Routed workflows: the reward's cost scale (e.g. the largest model's mean cost per program).
    #[arg(long, default_value_t = 1.0, conflicts_with = "trace_replay")]
    cost_scale: f64,
    /// Routed workflows: DISC never moves a program to another member of its route (admission
    /// only; the ablation of paper 002's Fig. 7(a)).
    #[arg(long, conflicts_with = "trace_replay")]
    no_divert: bool,
    /// Run on the live runtime (actors on wall-clock time) against the engines the pool file
    /// names, e.g. `--pool workflows/pools/live-emulated.yaml`; times are wall seconds.
    #[arg(long)]
    live: bool,
    /// With `--live`: fail whatever is still open after this many wall seconds.
    // `conflicts_with` as well as `requires`: clap waives `--live`'s requirement when
    // `--trace-replay` (which conflicts with `--live`) is given, so without it these flags
    // would be accepted there and ignored.
    #[arg(long, requires = "live", conflicts_with = "trace_replay")]
    deadline: Option<f64>,
    /// With `--live`: ask the engines for whole answers instead of streams (streaming is the
    /// default: a stalled server is noticed between chunks).
    #[arg(long, requires = "live", conflicts_with = "trace_replay")]
    no_stream: bool,
}

/// GPU-timeline segments a simulated run keeps per device (about twice this many at most)
/// when no `--timeline` is drawn: older ones are folded into the report's GPU-time partition.
/// A device gets a few segments per busy period, so only long runs ever fold.
const TIMELINE_SEGMENTS: usize = 4096;

/// Exit status of a run that completed with failed sessions (without `--allow-failures`);
/// 1 is an error that stopped the command, 2 a usage error (clap), 130 Ctrl-C.
const EXIT_SESSIONS_FAILED: u8 = 3;

/// How a `run` ended, when it produced a report.
enum RunEnd {
    /// Every session completed, or `--allow-failures`.
    Ok,
    /// This many sessions failed.
    SessionsFailed(usize),
    /// Ctrl-C: the report is partial.
    Interrupted,
}

/// The tracing subscriber: `RUST_LOG` filters (nothing without it), stderr, text or JSON.
fn init_logging(format: &str) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = if format == "json" { fmt.json().boxed() } else { fmt.boxed() };
    let registry = tracing_subscriber::registry().with(filter).with(fmt);
    #[cfg(feature = "otlp")]
    let registry = registry.with(otlp::layer());
    let _ = registry.try_init();
}

/// OpenTelemetry export of the runtime's spans (feature `otlp`): when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set, spans go to that collector over OTLP/HTTP (protobuf),
/// batched; service name `switchyard`. Without the variable, nothing is exported.
#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::Layer;

    pub fn layer<S>() -> Option<Box<dyn Layer<S> + Send + Sync>>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT")?;
        let exporter = match opentelemetry_otlp::SpanExporter::builder().with_http().build() {
            Ok(e) => e,
            Err(e) => {
                eprintln!("note: OTLP export is off: {e}");
                return None;
            }
        };
        let resource = opentelemetry_sdk::Resource::builder().with_service_name("switchyard").build();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("switchyard");
        let _ = PROVIDER.set(provider.clone());
        opentelemetry::global::set_tracer_provider(provider);
        Some(tracing_opentelemetry::layer().with_tracer(tracer).boxed())
    }

    /// The provider, kept to flush its batch at exit.
    static PROVIDER: std::sync::OnceLock<opentelemetry_sdk::trace::SdkTracerProvider> = std::sync::OnceLock::new();

    /// Flush and stop the exporter (spans still batched are sent).
    pub fn shutdown() {
        if let Some(p) = PROVIDER.get()
            && let Err(e) = p.shutdown()
        {
            eprintln!("note: OTLP export did not flush: {e}");
        }
    }
}

/// The routing flags of `run`, checked before any work starts.
fn routing_config(args: &RunArgs) -> Result<switchyard_runtime::exec::routing::RoutingConfig> {
    const VERIFIERS: [&str; 4] = ["gsm8k_exact", "tests_pass", "rouge_l", "verdict"];
    if let Some(v) = &args.single_verifier
        && !VERIFIERS.contains(&v.as_str())
    {
        anyhow::bail!("--single-verifier: unknown verifier `{v}` (known: {})", VERIFIERS.join(", "));
    }
    if !(args.cost_weight.is_finite() && args.cost_weight >= 0.0) {
        anyhow::bail!("--cost-weight must be a finite number ≥ 0 (got {})", args.cost_weight);
    }
    if !(args.cost_scale.is_finite() && args.cost_scale > 0.0) {
        anyhow::bail!("--cost-scale must be a finite number > 0 (got {})", args.cost_scale);
    }
    Ok(switchyard_runtime::exec::routing::RoutingConfig {
        cost_weight: args.cost_weight,
        cost_scale: args.cost_scale,
        single_verifier: args.single_verifier.clone(),
        reassign: !args.no_divert,
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log_format);
    // Every command but the predictor's evaluations counts tokens: load the tokenizer now, so
    // a defect is one clear error before any work starts.
    let needs_tokens = match &cli.command {
        Command::Predictor(_) => false,
        Command::Bench(b) => !matches!(b.experiment, Some(bench_cmd::Experiment::Predictor(_))),
        _ => true,
    };
    if needs_tokens
        && let Err(e) = switchyard_runtime::tokens::check()
    {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Run(args) => run(args),
        Command::Validate { workflows, pool } => validate(&workflows, pool.as_deref()).map(|()| RunEnd::Ok),
        Command::Predictor(PredictorCommand::Eval { train, test, json }) => {
            predictor_eval(train, test, json).map(|()| RunEnd::Ok)
        }
        Command::Bench(args) => bench_cmd::run(args).map(|()| RunEnd::Ok),
        Command::Emulate(args) => emulate_cmd::run(args).map(|()| RunEnd::Ok),
        Command::Serve(args) => serve_cmd::run(args).map(|()| RunEnd::Ok),
    };
    // Spans still batched for the collector go out before the process ends.
    #[cfg(feature = "otlp")]
    otlp::shutdown();
    match result {
        Ok(RunEnd::Ok) => ExitCode::SUCCESS,
        Ok(RunEnd::SessionsFailed(n)) => {
            eprintln!(
                "error: {n} session(s) failed (see `failures` in the report); pass --allow-failures to exit 0 anyway"
            );
            ExitCode::from(EXIT_SESSIONS_FAILED)
        }
        Ok(RunEnd::Interrupted) => ExitCode::from(progress::EXIT_INTERRUPTED),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Load every workflow file; the problems of all files are reported together (each already
/// names file, line, column and field).
fn load_all(paths: &[PathBuf]) -> Result<Vec<Arc<WorkflowSpec>>> {
    let mut out: Vec<Arc<WorkflowSpec>> = Vec::new();
    // The files that loaded, by name (a name used twice is refused, naming both files).
    let mut names: Vec<(String, &Path)> = Vec::new();
    let mut problems = Vec::new();
    for p in paths {
        match load_workflow(p) {
            Ok(spec) => {
                let mut ok = true;
                if let Some((_, first)) = names.iter().find(|(n, _)| *n == spec.name) {
                    let (line, column) = spec.name_declared_at();
                    problems.push(format!(
                        "{}:{line}:{column}: name: workflow name `{}` is used twice in this run (also by {})",
                        p.display(),
                        spec.name,
                        first.display()
                    ));
                    ok = false;
                } else {
                    names.push((spec.name.clone(), p.as_path()));
                }
                // The command line has no per-session inputs: without a dataset a reference that
                // reads only input fields fails every session that reaches it.
                if spec.dataset.is_none() {
                    for site in spec.input_only_reference_sites() {
                        problems.push(format!(
                            "{}:{}:{}: {}: {} read(s) input fields but the workflow has no dataset, so `switchyard run` has no inputs to give: add a `dataset:` that maps them, write `?` or `default` after them, or serve the workflow and pass inputs per session",
                            p.display(),
                            site.line,
                            site.column,
                            site.field,
                            site.references.join(", ")
                        ));
                        ok = false;
                    }
                }
                if ok {
                    out.push(Arc::new(spec));
                }
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(out)
}

/// The checks before any session starts: the workflows against the pool and the run's numbers
/// ([`exec::preflight`]); every problem at once.
fn preflight(cfg: &RunConfig, live: bool) -> Result<()> {
    // A live pool's engines decide for themselves when they load (a fixed endpoint serves
    // whatever it serves); the emulated pool is decided by the emulated engine's own rule.
    let rule = if live { exec::preflight::FitRule::None } else { exec::preflight::FitRule::EmulatedEngine };
    exec::preflight::check(cfg, rule).map_err(|e| anyhow::anyhow!("{e}"))
}

/// A routed run's router is built from its workflows together (their verifiers and first
/// requests): build it once as the run would, so that `validate` and `run` refuse the same
/// runs, before anything starts.
fn check_routing(cfg: &RunConfig) -> Result<()> {
    if cfg.workflows.iter().any(|w| w.route().is_some()) {
        let (deployments, deployment_of) = exec::deployment_table(&cfg.workflows, cfg.max_num_seqs).map_err(|e| anyhow::anyhow!("{e}"))?;
        let records = exec::load_records(&cfg.workflows).map_err(|e| anyhow::anyhow!("{e}"))?;
        exec::routing::routing_setup(&cfg.workflows, &records, &deployments, &deployment_of, &cfg.pool, &cfg.routing)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}

fn validate(paths: &[PathBuf], pool: Option<&Path>) -> Result<()> {
    let workflows = load_all(paths)?;
    // The deployments are checked against the pool given, or the default one when it is found.
    let pool_path = match pool_path::resolve(pool, paths.first().map(PathBuf::as_path)) {
        Ok(p) => Some(p),
        Err(_) if pool.is_none() => None,
        Err(e) => return Err(e),
    };
    match &pool_path {
        Some(p) => {
            // A live pool file (devices with their engines) is read for its devices too.
            let pool = PoolSpec::load(p).map_err(|e| anyhow::anyhow!("{e}"))?;
            let cfg = RunConfig {
                workflows: workflows.clone(),
                sessions: 1,
                arrival: Arrival::Burst,
                seed: 0,
                noise_seed: 0,
                pool,
                policy: "joint".into(),
                options: JointOptions::default(),
                predictor: "formula".into(),
                tool_workers: 1,
                max_num_seqs: 256,
                substrate: Default::default(),
                session_counts: Vec::new(),
                workflow_arrivals: Vec::new(),
                handoff_s: switchyard_runtime::exec::FRAMEWORK_HANDOFF_S,
                routing: Default::default(),
            };
            preflight(&cfg, false)?;
            check_routing(&cfg)?;
        }
        None => eprintln!("note: no pool file found (pass --pool FILE): deployments were not checked against a pool"),
    }
    for w in workflows {
        let records = w.load_records().map_err(|e| anyhow::anyhow!("{e}"))?;
        let dataset = match &w.dataset {
            Some(_) => format!("{} dataset records", records.len()),
            None => "no dataset (every session runs the same inputs)".to_string(),
        };
        println!(
            "{}: ok — workflow `{}`, {} nodes, {} deployments, {dataset}",
            w.path.display(),
            w.name,
            w.nodes.len(),
            w.deployments.len(),
        );
    }
    if let Some(p) = pool_path {
        println!("every deployment fits a device of pool {}", p.display());
    }
    Ok(())
}

fn predictor_eval(train: Option<PathBuf>, test: Option<PathBuf>, json: bool) -> Result<()> {
    // Operator timings only; whole activations against the emulator: `switchyard bench predictor`.
    // Without --train: the shipped measurements, compiled into the binary.
    let report = match train {
        Some(train) => switchyard_predictor::eval::run(&train, test.as_deref()),
        None => switchyard_predictor::data::ProfileData::shipped()
            .and_then(|data| switchyard_predictor::eval::run_on(data, test.as_deref())),
    }
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.to_markdown());
    }
    Ok(())
}

/// Ablation and variant flags that only `joint` reads, set with another policy (they would
/// silently change nothing), and `--no-sleep` without the sleeping substrate.
fn joint_flag_problems(args: &RunArgs) -> Vec<String> {
    let mut problems = Vec::new();
    let joint_only = [
        ("--no-fusion", args.no_fusion),
        ("--no-prefetch", args.no_prefetch),
        ("--per-workflow-lifecycle", args.per_workflow_lifecycle),
        ("--no-tao-admission", args.no_tao_admission),
        ("--resource-order", args.resource_order),
        ("--history-admission", args.history_admission),
        ("--no-drain", args.no_drain),
        ("--no-outlook", args.no_outlook),
        ("--no-arrival-outlook", args.no_arrival_outlook),
        ("--fifo-rank", args.fifo_rank),
        ("--no-sleep", args.no_sleep),
    ];
    if args.trace_replay.is_some() {
        for (flag, set) in joint_only {
            if set {
                problems.push(format!("{flag}: not read with --trace-replay (agent sessions run under --scheduler)"));
            }
        }
    } else if args.policy != "joint" {
        for (flag, set) in joint_only {
            if set {
                problems.push(format!("{flag}: applies to --policy joint only (this run: --policy {})", args.policy));
            }
        }
    } else if args.no_sleep && !args.sleep {
        problems.push("--no-sleep: needs --sleep (without it no policy sleeps a replica)".to_string());
    }
    if args.trace_replay.is_none() {
        // Read only by `--trace-replay` (set to anything but their defaults, they would change
        // nothing silently).
        for (flag, set) in [
            ("--scheduler", args.scheduler != "tao"),
            ("--workers", args.workers != 32),
            ("--agent-pool", args.agent_pool != "qwen32b-tp2x4"),
            ("--acting-decay", args.acting_decay),
        ] {
            if set {
                problems.push(format!("{flag}: applies to --trace-replay only"));
            }
        }
    } else if args.acting_decay && args.scheduler != "thunderagent" {
        problems.push(format!("--acting-decay: applies to --scheduler thunderagent only (this run: {})", args.scheduler));
    }
    if let Some(p) = unknown_predictor("--predictor", &args.predictor) {
        problems.push(p);
    }
    problems
}

/// `FLAG NAME` that names no predictor (checked before any work starts).
pub(crate) fn unknown_predictor(flag: &str, name: &str) -> Option<String> {
    let known = exec::profiles::PREDICTORS;
    (!known.contains(&name) && name != "oracle")
        .then(|| format!("{flag}: unknown predictor `{name}` (known: {}, oracle)", known.join(", ")))
}

fn run(args: RunArgs) -> Result<RunEnd> {
    let mut policy_flags = joint_flag_problems(&args);
    if !policy_flags.is_empty() {
        // Reported with every other problem of the flags and files, all at once.
        if args.trace_replay.is_none() {
            policy_flags.extend(exec::preflight::flag_problems(args.sessions, args.max_num_seqs, args.tool_workers, args.arrival));
            if let Err(e) = load_all(&args.workflows) {
                policy_flags.push(e.to_string());
            }
        }
        bail!("{}", policy_flags.join("\n"));
    }
    if let Some(trace) = &args.trace_replay {
        return replay(trace, &args);
    }
    // Bad flags and bad files are reported together (with sound files, by `preflight` below,
    // which also checks the files against the pool).
    let workflows = match load_all(&args.workflows) {
        Ok(w) => w,
        Err(e) => {
            let flags = exec::preflight::flag_problems(args.sessions, args.max_num_seqs, args.tool_workers, args.arrival);
            bail!("{}", flags.into_iter().chain(std::iter::once(format!("{e}"))).collect::<Vec<_>>().join("\n"))
        }
    };
    // Remove what a killed earlier run's tool sandboxes left on this machine (only work
    // directories carrying Switchyard's marker whose owning process is gone).
    let swept = switchyard_tools::sandbox::residue::sweep_once();
    for (path, error) in &swept.failed {
        eprintln!("note: cannot remove the stale tool work directory {}: {error}", path.display());
    }
    let pool_path = pool_path::resolve(args.pool.as_deref(), args.workflows.first().map(PathBuf::as_path))?;
    let pool = if args.live {
        live_cmd::pool_spec(&pool_path)?
    } else {
        PoolSpec::load(&pool_path).map_err(|e| anyhow::anyhow!("{e}"))?
    };
    let mut cfg = RunConfig {
        workflows,
        sessions: args.sessions,
        arrival: args.arrival,
        seed: args.seed,
        noise_seed: args.noise_seed,
        pool,
        policy: args.policy.clone(),
        options: JointOptions {
            fusion: !args.no_fusion,
            prefetch: !args.no_prefetch,
            shared_lifecycle: !args.per_workflow_lifecycle,
            resource_order: args.resource_order,
            history_admission: args.history_admission,
            sleep: !args.no_sleep,
            tao_admission: !args.no_tao_admission,
            drain: !args.no_drain,
            outlook: !args.no_outlook,
            arrival_outlook: !args.no_arrival_outlook,
            critical_path_rank: !args.fifo_rank,
        },
        predictor: args.predictor.clone(),
        tool_workers: args.tool_workers,
        max_num_seqs: args.max_num_seqs,
        substrate: Substrate {
            replica_cap: args.replica_cap,
            scale_out_waiting: args.scale_out_waiting,
            upscale_delay_s: args.upscale_delay,
            reclaim: if args.sleep { Reclaim::Sleep } else { Reclaim::Unload },
        },
        session_counts: Vec::new(),
        workflow_arrivals: Vec::new(),
        handoff_s: args.handoff_delay,
        routing: Default::default(),
    };
    // Bad flags are reported together: the routing flags' problems with the run's.
    let routing = routing_config(&args);
    match (preflight(&cfg, args.live), routing) {
        (Err(run), Err(routing)) => anyhow::bail!("{run}\n{routing}"),
        (Err(e), Ok(_)) | (Ok(()), Err(e)) => return Err(e),
        (Ok(()), Ok(routing)) => cfg.routing = routing,
    }
    check_routing(&cfg)?;
    // The datasets too (their records, a field a responder reads as text): an error now, before
    // an output file is truncated or a session starts.
    switchyard_runtime::exec::load_records(&cfg.workflows).map_err(|e| anyhow::anyhow!("{e}"))?;
    // The output files are created before the run: a path that cannot be written is an error
    // now, not after the whole run (which would end without its report).
    let trace_file = match &args.trace {
        Some(path) => Some(std::fs::File::create(path).with_context(|| format!("--trace: cannot create {}", path.display()))?),
        None => None,
    };
    if let Some(path) = &args.timeline {
        std::fs::File::create(path).with_context(|| format!("--timeline: cannot create {}", path.display()))?;
    }
    if let Some(dir) = &args.tool_cache {
        let identity = sim::outcome_store::process_identity().context("--tool-cache")?;
        let store = sim::outcome_store::OutcomeStore::open(dir, &identity).map_err(|e| anyhow::anyhow!("--tool-cache: {e}"))?;
        sim::use_outcome_store(store);
    }
    let total = args.sessions * cfg.workflows.len();
    let interrupt = progress::on_ctrl_c()?;
    // Deployment names for the timeline's labels (the live branch takes the config).
    let deployment_names = switchyard_runtime::exec::deployment_names(&cfg.workflows, cfg.max_num_seqs)?;
    // A live run's pool engines and flags are checked before the progress line shows.
    let live = if args.live {
        // Notes (the first engine error of each kind, lost replicas) are printed as they happen.
        let on_note: switchyard_runtime::live::NoteSink = Arc::new(|line: &str| eprintln!("note: {line}"));
        let options = live_cmd::LiveOptions {
            deadline_s: args.deadline,
            stream: !args.no_stream,
            switchyard_exe: None,
            on_note: Some(on_note),
            keep_trace: args.trace.is_some(),
        };
        Some(live_cmd::prepare_live(cfg.clone(), &pool_path, &options, Some(Arc::clone(&interrupt)))?)
    } else {
        None
    };
    let reporter = Arc::new(progress::Reporter::new(total, args.json));
    reporter.update(progress::Point { done: 0, total, ..Default::default() });
    reporter.heartbeat();
    let started = std::time::Instant::now();
    let (report, trace, timelines, window, notes) = if let Some(live) = live {
        let r = Arc::clone(&reporter);
        let progress: switchyard_runtime::live::Progress =
            Arc::new(move |done, total| r.update(progress::Point { done, total, ..Default::default() }));
        let out = live.run(Some(progress))?;
        // The notes went out as they happened; the run's faults, counted, once at its end.
        if let Some(line) = out.faults.line() {
            eprintln!("{line}");
        }
        (out.report, out.trace, out.timelines, out.window, Vec::new())
    } else {
        // The trace is kept only when it is written, the whole GPU timeline only when it is
        // drawn; the per-call and per-session records are not used here (the report's tally
        // counts each session as it ends), so memory grows with the sessions in flight.
        let opts = sim::SimOptions {
            keep_trace: args.trace.is_some(),
            keep_calls: false,
            keep_sessions: false,
            timeline_segments: if args.timeline.is_some() { None } else { Some(TIMELINE_SEGMENTS) },
            record_planner: false,
        };
        // The simulator calls back at every tick; the progress line shows a session ending at
        // once and otherwise the state of one tick in 64 (reading the clock at every tick cost
        // ~3 % of a large run).
        let mut ticks = 0u64;
        let mut last_done = usize::MAX;
        let mut last = None;
        let out = sim::simulate_opts(&cfg, opts, &mut |p| {
            ticks += 1;
            let point = progress::Point {
                done: p.sessions_done,
                total: p.sessions_total,
                virtual_s: Some(p.now_s),
                events: Some(p.events),
            };
            if p.sessions_done != last_done || ticks % 64 == 0 {
                last_done = p.sessions_done;
                reporter.update(point);
                last = None;
            } else {
                last = Some(point);
            }
            if interrupt.load(Ordering::SeqCst) { Flow::Interrupt } else { Flow::Continue }
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        // The final line shows the last tick, fed or not.
        if let Some(point) = last {
            reporter.update(point);
        }
        (out.report, out.trace, out.timelines, out.window, out.notes)
    };
    let outcome = if report.interrupted { "interrupted" } else { "done" };
    reporter.finish(outcome, report.sessions_failed);
    let wall = started.elapsed().as_secs_f64();
    struct Out {
        report: RunReport,
        trace: Vec<exec::TraceLine>,
        timelines: Vec<switchyard_runtime::report::DeviceTimeline>,
        window: (f64, f64),
        notes: Vec<String>,
    }
    let out = Out { report, trace, timelines, window, notes };
    for note in &out.notes {
        eprintln!("note: {note}");
    }
    if let (Some(dir), Some(tally)) = (&args.tool_cache, sim::outcome_store_tally()) {
        eprintln!("tool cache {}: {} outcomes read, {} written", dir.display(), tally.read, tally.written);
    }
    if let Some(file) = trace_file {
        let mut f = std::io::BufWriter::new(file);
        for line in &out.trace {
            serde_json::to_writer(&mut f, line)?;
            f.write_all(b"\n")?;
        }
        f.flush()?;
    }
    if let Some(path) = &args.timeline {
        let title = format!(
            "{} on {} ({} GPUs), {}: makespan {:.1} s",
            out.report.policy, out.report.pool, out.report.gpus, out.report.arrival, out.report.makespan_s
        );
        timeline::write_svg(path, &title, &out.timelines, &deployment_names, out.window.0, out.window.1)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out.report)?);
    } else {
        print_tables(&out.report, wall);
    }
    let r = &out.report;
    if r.interrupted {
        eprintln!(
            "interrupted: partial report; {} of {} sessions completed, {} counted as failed (open ones as `interrupted`)",
            r.sessions_completed, r.sessions_total, r.sessions_failed
        );
        return Ok(RunEnd::Interrupted);
    }
    if r.sessions_failed > 0 && !args.allow_failures {
        return Ok(RunEnd::SessionsFailed(r.sessions_failed));
    }
    Ok(RunEnd::Ok)
}

/// `switchyard run --trace-replay FILE`: agent sessions from a trace on an agent pool.
fn replay(path: &Path, args: &RunArgs) -> Result<RunEnd> {
    use switchyard_runtime::bench::tao;
    use switchyard_runtime::planner::admission::{SchedulerKind, TaoOptions};
    use switchyard_runtime::sim::agentic::{AgentRunConfig, run_agents};
    if args.workers == 0 {
        bail!("--workers must be at least 1");
    }
    let limit = switchyard_runtime::agentic::MAX_TRACE_FILE_BYTES;
    let text = exec::pool::read_bounded(path, limit).map_err(|e| match e {
        exec::pool::Bounded::Io(e) => anyhow::anyhow!("cannot read {}: {e}", path.display()),
        exec::pool::Bounded::TooLarge(size) => {
            anyhow::anyhow!("{}: {size} bytes, more than the {limit}-byte limit of a trace", path.display())
        }
    })?;
    let scheduler = SchedulerKind::ALL
        .into_iter()
        .find(|k| k.name() == args.scheduler)
        .ok_or_else(|| anyhow::anyhow!("unknown scheduler `{}`", args.scheduler))?;
    let pool = if args.agent_pool == "qwen14b-a100x4" { tao::pool_qwen14b_a100x4() } else { tao::pool_qwen32b_tp2x4() };
    let max_len = pool.replicas.iter().map(|r| r.max_model_len).min().unwrap_or(0);
    // The file's problems and the turns the pool cannot hold, all at once.
    let trace = switchyard_runtime::agentic::parse_trace_for_pool(&path.display().to_string(), &text, max_len)?;
    let cfg = AgentRunConfig {
        workers: args.workers,
        scheduler,
        tao: TaoOptions::default(),
        noise_seed: args.noise_seed,
        plan_latency_s: 0.002,
        thunder_acting_decay: args.acting_decay,
    };
    let report = run_agents(&trace, &pool, &cfg)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED);
        t.set_header(["scheduler", "sessions", "makespan (s)", "latency (s)", "TTFT (s)", "decode (tok/s)", "cache hit", "tool end → first (s)"]);
        t.add_row([
            report.scheduler.clone(),
            report.sessions.to_string(),
            format!("{:.1}", report.makespan_s),
            format!("{:.1}", report.mean_latency_s),
            format!("{:.3}", report.mean_ttft_s),
            format!("{:.1}", report.decode_tps),
            format!("{:.1} %", report.cache_hit_rate * 100.0),
            format!("{:.3}", report.tool_end_to_first_token_s),
        ]);
        println!("{} on {}, {} workers\n{t}", path.display(), pool.name, args.workers);
    }
    Ok(RunEnd::Ok)
}

fn print_tables(r: &RunReport, wall: f64) {
    println!(
        "policy {} · pool {} ({} GPUs) · arrival {} · seed {} · {} of {} sessions completed ({} failed) · {:.2} s wall",
        r.policy, r.pool, r.gpus, r.arrival, r.seed, r.sessions_completed, r.sessions_total, r.sessions_failed, wall
    );
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "workflow", "done", "failed", "makespan s", "p50 s", "p95 s", "p99 s", "GPU-s/session",
        "gen", "idle", "load", "other", "accuracy",
    ]);
    let row = |name: &str,
               done: usize,
               failed: usize,
               makespan: f64,
               lat: &switchyard_runtime::report::Percentiles,
               g: &switchyard_runtime::report::GpuBreakdown,
               acc: Option<f64>| {
        vec![
            name.to_string(),
            done.to_string(),
            failed.to_string(),
            format!("{makespan:.1}"),
            // With no completed session there is no latency to show.
            if lat.is_known() { format!("{:.1}", lat.p50) } else { "-".to_string() },
            if lat.is_known() { format!("{:.1}", lat.p95) } else { "-".to_string() },
            if lat.is_known() { format!("{:.1}", lat.p99) } else { "-".to_string() },
            // Per completed session: with none completed there is no such figure (the pool's
            // GPU time is on the line below the table).
            if done == 0 { "-".to_string() } else { format!("{:.1}", g.total()) },
            format!("{:.1}", g.generation),
            format!("{:.1}", g.idle_resident),
            format!("{:.1}", g.loading),
            format!("{:.1}", g.other),
            acc.map(|a| format!("{a:.3}")).unwrap_or_else(|| "-".into()),
        ]
    };
    for (name, w) in &r.workflows {
        t.add_row(row(
            name,
            w.sessions_completed,
            w.sessions_failed,
            w.makespan_s,
            &w.latency_s,
            &w.gpu_seconds_per_session,
            w.accuracy,
        ));
    }
    t.add_row(row(
        "overall",
        r.sessions_completed,
        r.sessions_failed,
        r.makespan_s,
        &r.latency_s,
        &r.gpu_seconds_per_session,
        None,
    ));
    println!("{t}");
    let g = &r.gpu_seconds_total;
    println!(
        "GPU time of the pool over the makespan: {:.1} GPU-s (generation {:.1}, idle resident {:.1}, loading {:.1}, other {:.1}); the gen/idle/load/other columns are per completed session",
        g.total(), g.generation, g.idle_resident, g.loading, g.other
    );
    if r.fixed_endpoint_gpus > 0 {
        println!(
            "{} device(s) were fixed endpoints (engine kind `openai`): their GPU time and residency are not ours to see, so they count no loads and read as empty (other)",
            r.fixed_endpoint_gpus
        );
    }
    println!(
        "loads {} · evictions {} · sleeps {} · wakes {} · LLM calls {} · tool calls {} · prompt tokens {} ({} from prefix cache) · generated tokens {} · preemptions {}",
        r.loads, r.evictions, r.sleeps, r.wakes, r.llm_calls, r.tool_calls, r.prompt_tokens, r.cached_prompt_tokens, r.generated_tokens, r.preemptions
    );
    // Tool calls that failed (a timeout, a crash, failing tests …) are otherwise only in --json.
    if let Some(line) = r.tools.failed_line(r.tool_calls) {
        println!("{line}");
    }
    // TAO's admission under joint (paper 000), otherwise only in --json.
    let tao = &r.tao_admission;
    if tao.solves > 0 {
        println!(
            "TAO admission: {} DP solves ({} fell back to best-fit decreasing) · {} units granted, {} on a replica caching their context · {} holds for returning tool turns",
            tao.solves, tao.fallbacks, tao.granted, tao.granted_on_cache, tao.held_for_returning
        );
    }
    if !r.wasted.is_empty() {
        let w = &r.wasted;
        println!(
            "wasted engine work: {} call attempt(s) failed, were retried or were aborted after their first token ({} prompt tokens, {} streamed output tokens; not in the counts above)",
            w.attempts, w.prompt_tokens, w.output_tokens
        );
    }
    if !r.routing.is_empty() {
        // ORACLE's routing: which model each routed workflow's programs were bound to.
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED);
        t.set_header(vec!["routed workflow", "model", "programs", "diverted", "gated", "verdicts", "successes", "right verifier", "cost (G param-tokens)"]);
        for (workflow, models) in &r.routing {
            for (model, s) in models {
                t.add_row(vec![
                    workflow.clone(),
                    model.clone(),
                    s.programs.to_string(),
                    s.diverted.to_string(),
                    s.gated.to_string(),
                    s.verdicts.to_string(),
                    s.successes.to_string(),
                    s.right_verifier.to_string(),
                    format!("{:.0}", s.cost),
                ]);
            }
        }
        println!("{t}");
    }
    for f in &r.failures {
        println!("failed: {f}");
    }
    if r.sessions_failed > r.failures.len() {
        println!("… and {} more failed sessions", r.sessions_failed - r.failures.len());
    }
    if r.interrupted {
        println!("interrupted: this is a partial report");
    }
}
