//! `switchyard bench`: the command-line edge of [`switchyard_runtime::bench`]. Parses the
//! arguments, loads the workflows and the pool, runs the bench with a progress bar, writes the
//! markdown report, the JSON and the SVG charts, and prints a summary (or the JSON).
//! Errors are `anyhow` here, as everywhere in the binary.
//!
//! Must not depend on the simulator, the live shell or the emulator directly (it reaches them
//! only through `switchyard_runtime::bench` and, for `bench front-door`, `serve::load`), nor on
//! the library facade `src/lib.rs`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use indicatif::{ProgressBar, ProgressStyle};
use switchyard_runtime::bench::{self, BenchConfig, BenchReport, VariantKind, motivation, predictor_eval};
use switchyard_runtime::exec::PoolSpec;
use switchyard_runtime::workflow::{WorkflowSpec, load_workflow};

/// Arguments of `switchyard bench`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// A separate experiment instead of paper 003's Figures 5–7.
    #[command(subcommand)]
    pub experiment: Option<Experiment>,
    /// Workflow YAML files.
    #[arg(default_values = ["workflows/gsm8k.yaml", "workflows/mbpp.yaml", "workflows/qmsum.yaml"])]
    pub workflows: Vec<PathBuf>,
    /// Directory for report.md, bench.json and the SVG charts.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Print the report as JSON on stdout instead of a summary table.
    #[arg(long)]
    pub json: bool,
    /// Sessions per workflow.
    #[arg(long, default_value_t = 60)]
    pub sessions: usize,
    /// Repetitions per configuration (engine-noise seeds 0..R; default 5); the report gives
    /// means. Refused with `--quick`, which runs one.
    #[arg(long)]
    pub repetitions: Option<u64>,
    /// Pool file (as given); default `workflows/pools/paper.yaml`, looked up as for `run`.
    #[arg(long)]
    pub pool: Option<PathBuf>,
    /// One repetition, burst arrivals only (a smoke run); refused with `--repetitions`.
    #[arg(long)]
    pub quick: bool,
    /// Seed of the arrival trace and of the emulated outputs.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Predictor every run plans with.
    #[arg(long, default_value = "graph")]
    pub predictor: String,
    /// Predictor substitutions of the joint policy (comma-separated), one row each.
    #[arg(long, value_delimiter = ',', default_value = "gbdt,formula")]
    pub predictors: Vec<String>,
    /// Simulations run at once (at least 1).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
}

/// Experiments with their own command.
#[derive(Subcommand, Debug)]
pub enum Experiment {
    /// Paper 003 §2.2: QMSum with a concurrent MBPP repair workflow on 1× A100-40GB + 2×
    /// V100-32GB under the request-level baselines; GPU-time breakdown and re-acquire wait
    /// beside the paper's Figures 1(b) and 2.
    Motivation(MotivationArgs),
    /// Paper 003 §4.4 / Table 1: the estimators on whole activations run on the emulator
    /// (random, unseen-model and unseen-device splits), plus the operator-timing evaluation;
    /// writes predictor.md and predictor.json.
    Predictor(PredictorArgs),
    /// `switchyard serve`'s front door against calling the engine directly, side by side on
    /// one emulated engine (added latency at p50/p99), and a soak of concurrent streaming
    /// programs (whole streams, resident memory).
    FrontDoor(FrontDoorArgs),
    /// Paper 000 (TAO): agent sessions under TAO and its baselines (round-robin, cache-aware,
    /// Dynamo-like, ThunderAgent-like) on two workloads × three worker counts × two pools
    /// (Table 1's shape), TAO's ablations (Table 4) and tool-delay scaling (Table 8); writes
    /// tao.md, tao.json and tao-running.svg.
    Tao(TaoArgs),
    /// Paper 002 (ORACLE), Appendix B.3: verifier selection by nearest prototype (k = 5
    /// exemplars per verifier, hashed TF-IDF) on held-out GSM8K / MBPP / QMSum tasks, as they
    /// are and with their keyword cues removed; plus the embedding's and a routing decision's
    /// cost per request. Writes verifier.md and verifier.json.
    Verifier(VerifierArgs),
    /// Paper 002 (ORACLE) §5.3: adaptive vs single-verifier feedback for routed programs
    /// (`gsm8k-routed` + `mbpp-routed` in the simulator, paired by session over seeds).
    /// Writes oracle.md, oracle.json and oracle.svg, then oracle-programs.*.
    Oracle(OracleArgs),
}

/// Arguments of `switchyard bench oracle`.
#[derive(Args, Debug)]
pub struct OracleArgs {
    /// Sessions per workflow per run.
    #[arg(long, default_value_t = 120)]
    pub sessions: usize,
    /// Poisson arrivals per workflow, sessions per second.
    #[arg(long, default_value_t = 0.5)]
    pub rate: f64,
    /// Trace seeds 1..=N (one paired comparison each).
    #[arg(long, default_value_t = 5)]
    pub seeds: u64,
    /// Programs per cell of the concurrency experiments (oracle-programs.md).
    #[arg(long, default_value_t = 108)]
    pub programs: usize,
    /// Plan seeds 1..=N of the concurrency experiments.
    #[arg(long, default_value_t = 2)]
    pub program_seeds: u64,
    /// Run only the concurrency experiments (oracle-programs.*), not the feedback comparison.
    #[arg(long, conflicts_with = "only_feedback")]
    pub only_programs: bool,
    /// Run only the feedback comparison (oracle.*: accuracy against cost, the steady state, the
    /// regret), not the concurrency experiments.
    #[arg(long)]
    pub only_feedback: bool,
    /// Directory for oracle.md / oracle.json / oracle.svg and oracle-programs.md / .json / .svg.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Print the JSON on stdout instead of the Markdown.
    #[arg(long)]
    pub json: bool,
}

/// Run `switchyard bench oracle`.
fn oracle(args: OracleArgs) -> Result<()> {
    if !args.only_programs && (args.seeds == 0 || args.sessions == 0 || !(args.rate > 0.0 && args.rate.is_finite())) {
        anyhow::bail!("--seeds and --sessions must be at least 1 and --rate positive");
    }
    if !args.only_feedback && (args.programs == 0 || args.program_seeds == 0) {
        anyhow::bail!("--programs and --program-seeds must be at least 1");
    }
    // Each experiment writes its own files; stdout gets both Markdown sections, or one JSON
    // document holding both reports.
    let command = oracle_command(&args);
    let mut printed = serde_json::Map::new();
    printed.insert("command".into(), command.clone().into());
    let mut md_out = String::new();
    if !args.only_programs {
        let cfg = bench::oracle::OracleBenchConfig { root: ".".into(), sessions: args.sessions, rate: args.rate, seeds: (1..=args.seeds).collect() };
        let report = bench::oracle::run(&cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
        let md = report.markdown();
        let json = serde_json::json!({ "command": command, "report": report });
        write_files(&args.out, "oracle", &md, &json)?;
        let svg = report.replay.frontier_svg().map_err(|e| anyhow::anyhow!("{e}"))?;
        write_out_file(&args.out.join("oracle.svg"), svg)?;
        printed.insert("feedback".into(), json["report"].clone());
        md_out.push_str(&md);
    }
    if args.only_feedback {
        return print_oracle(args.json, printed, &md_out);
    }
    let cfg = bench::oracle_programs::ProgramsBenchConfig {
        programs: args.programs,
        seeds: (1..=args.program_seeds).collect(),
        ..Default::default()
    };
    let report = bench::oracle_programs::run_programs_bench(&cfg, |label| eprintln!("{label}"))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let svg = bench::oracle_programs::programs_svg(&report).map_err(|e| anyhow::anyhow!("{e}"))?;
    create_out_dir(&args.out)?;
    write_out_file(&args.out.join("oracle-programs.svg"), svg)?;
    let md = format!(
        "# Paper 002 (ORACLE): routed programs\n\nProduced by `{command}`.\n\n![program throughput, feedback modes, β sweep](oracle-programs.svg)\n\n{}",
        report.markdown()
    );
    let json = serde_json::json!({ "command": command, "report": report });
    write_files(&args.out, "oracle-programs", &md, &json)?;
    printed.insert("programs".into(), json["report"].clone());
    md_out.push_str(&md);
    print_oracle(args.json, printed, &md_out)
}

/// The command line `bench oracle` records in its outputs: the flags that differ from their
/// defaults, as `bench verifier` and `bench predictor` record theirs (not `--out`, `--json`).
fn oracle_command(args: &OracleArgs) -> String {
    let mut command = String::from("switchyard bench oracle");
    if args.sessions != 120 {
        command.push_str(&format!(" --sessions {}", args.sessions));
    }
    if args.rate != 0.5 {
        command.push_str(&format!(" --rate {}", args.rate));
    }
    if args.seeds != 5 {
        command.push_str(&format!(" --seeds {}", args.seeds));
    }
    if args.programs != 108 {
        command.push_str(&format!(" --programs {}", args.programs));
    }
    if args.program_seeds != 2 {
        command.push_str(&format!(" --program-seeds {}", args.program_seeds));
    }
    if args.only_programs {
        command.push_str(" --only-programs");
    }
    if args.only_feedback {
        command.push_str(" --only-feedback");
    }
    command
}

/// `bench oracle`'s stdout: one JSON document holding the experiments that ran, or their
/// Markdown.
fn print_oracle(json: bool, printed: serde_json::Map<String, serde_json::Value>, md: &str) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&serde_json::Value::Object(printed))?);
    } else {
        print!("{md}");
    }
    Ok(())
}

/// Arguments of `switchyard bench verifier`.
#[derive(Args, Debug)]
pub struct VerifierArgs {
    /// Seed of the exemplar draws (repetition r uses seed + r).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Repetitions (exemplar draws).
    #[arg(long, default_value_t = 20)]
    pub repetitions: usize,
    /// The datasets' directory.
    #[arg(long, default_value = "workflows/datasets")]
    pub datasets: PathBuf,
    /// Directory for verifier.md and verifier.json.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Print the JSON on stdout instead of the Markdown.
    #[arg(long)]
    pub json: bool,
}

/// Run `switchyard bench verifier`.
fn verifier(args: VerifierArgs) -> Result<()> {
    if args.repetitions == 0 {
        anyhow::bail!("--repetitions must be at least 1");
    }
    let report = bench::verifier::run(&args.datasets, args.seed, args.repetitions).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut command = String::from("switchyard bench verifier");
    if args.seed != 42 {
        command.push_str(&format!(" --seed {}", args.seed));
    }
    if args.repetitions != 20 {
        command.push_str(&format!(" --repetitions {}", args.repetitions));
    }
    let md = report.markdown(&command);
    let json = serde_json::json!({ "command": command, "report": report });
    write_and_print(&args.out, "verifier", &md, &json, args.json)
}

/// Arguments of `switchyard bench tao`.
#[derive(Args, Debug)]
pub struct TaoArgs {
    /// Sessions per run (the paper's 300 SWE-bench Lite tasks).
    #[arg(long, default_value_t = 300)]
    pub sessions: usize,
    /// Concurrent workers (closed loop), comma-separated, each at most 100000 and none twice.
    #[arg(long, value_delimiter = ',', default_value = "96,128,160", conflicts_with = "write_trace")]
    pub workers: Vec<usize>,
    /// Trace seed of the generated workloads.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Skip the ablations and the tool-delay scaling.
    #[arg(long, conflicts_with = "write_trace")]
    pub no_ablations: bool,
    /// Only the first pool and the first workload (a quick look).
    #[arg(long, conflicts_with = "write_trace")]
    pub quick: bool,
    /// Write the generated trace of `--workload` (`--sessions` sessions, trace seed `--seed`;
    /// JSONL, the `run --trace-replay` format) to this file and stop; the bench's own flags are
    /// refused with it. `run --trace-replay`'s pools hold 40,960 tokens per call
    /// (max_model_len), which every `swe-lite` and `swe-verified` session fits (they end by
    /// 33,024); `swe-verified-thinking` sessions run up to 65,536, so the replay refuses most
    /// of its traces (a note says how many sessions do not fit).
    #[arg(long)]
    pub write_trace: Option<PathBuf>,
    /// With `--write-trace` only (refused without it): `swe-lite`, `swe-verified`, or `swe-verified-thinking` (paper 002's
    /// programs: each turn's reasoning, which the conversation drops; simulated only; the
    /// larger model's version — the 9B runs them continued, `agentic::generate_with_steps`).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(["swe-lite", "swe-verified", "swe-verified-thinking"]))]
    pub workload: Option<String>,
    /// Directory for tao.md, tao.json and the SVG chart.
    #[arg(long, default_value = "bench-out", conflicts_with = "write_trace")]
    pub out: PathBuf,
    /// Print the report as JSON on stdout.
    #[arg(long, conflicts_with = "write_trace")]
    pub json: bool,
}

/// Most concurrent workers of one `bench tao` setting (as many as `--sessions` may be).
const MAX_TAO_WORKERS: usize = 100_000;

/// Arguments of `switchyard bench front-door`.
#[derive(Args, Debug)]
pub struct FrontDoorArgs {
    /// Concurrent programs of the side-by-side comparison.
    #[arg(long, default_value_t = 100)]
    pub programs: usize,
    /// Sequential streamed calls per program and round.
    #[arg(long, default_value_t = 5)]
    pub calls: usize,
    /// Tokens per call.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
    /// Rounds (each: direct, then front door).
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Concurrent streaming programs of the soak (0: no soak).
    #[arg(long, default_value_t = 1000)]
    pub soak: usize,
    /// Tokens per soak stream.
    #[arg(long, default_value_t = 256)]
    pub soak_tokens: u32,
    /// Emulated seconds per wall second (1: a real GPU's pace; higher saturates the cores and
    /// measures throughput instead of overhead).
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    pub json: bool,
}

fn front_door(a: FrontDoorArgs) -> Result<()> {
    for (flag, value) in [("--programs", a.programs), ("--calls", a.calls), ("--rounds", a.rounds), ("--max-tokens", a.max_tokens as usize)] {
        if value == 0 {
            bail!("{flag} must be at least 1 (got 0)");
        }
    }
    if a.soak > 0 && a.soak_tokens == 0 {
        bail!("--soak-tokens must be at least 1 when --soak is not 0");
    }
    if !(a.speed > 0.0 && a.speed.is_finite()) {
        bail!("--speed must be a positive, finite number (got {})", a.speed);
    }
    let opts = switchyard_runtime::serve::load::LoadOptions {
        programs: a.programs,
        calls: a.calls,
        max_tokens: a.max_tokens,
        rounds: a.rounds,
        soak: a.soak,
        soak_tokens: a.soak_tokens,
        speed: a.speed,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let report = runtime
        .block_on(switchyard_runtime::serve::load::front_door_bench(&opts))
        .map_err(|e| anyhow::anyhow!("bench front-door: {e}"))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.markdown());
    }
    Ok(())
}

/// Arguments of `switchyard bench predictor`.
#[derive(Args, Debug)]
pub struct PredictorArgs {
    /// Seed of the activation draws and the engines' noise.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Activations per (model, device) pair.
    #[arg(long, default_value_t = 24)]
    pub per_pair: usize,
    /// Directory for predictor.md and predictor.json.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Print the JSON on stdout instead of the Markdown.
    #[arg(long)]
    pub json: bool,
}

/// Run `switchyard bench predictor`.
fn predictor(args: PredictorArgs) -> Result<()> {
    let cfg = predictor_eval::PredictorEvalConfig { seed: args.seed, per_pair: args.per_pair, ..Default::default() };
    let report = predictor_eval::run(&cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut command = String::from("switchyard bench predictor");
    if args.seed != 42 {
        command.push_str(&format!(" --seed {}", args.seed));
    }
    if args.per_pair != 24 {
        command.push_str(&format!(" --per-pair {}", args.per_pair));
    }
    let md = report.to_markdown(&command);
    let json = serde_json::json!({
        "command": command,
        "config": report.config,
        "pairs": report.pairs,
        "skipped_pairs": report.skipped_pairs,
        "rows": report.rows,
        "fold_rows": report.fold_rows,
        "operator_timings": report.operator_timings.as_ref().map(|r| r.to_json()),
    });
    write_and_print(&args.out, "predictor", &md, &json, args.json)
}

/// Arguments of `switchyard bench motivation`.
#[derive(Args, Debug)]
pub struct MotivationArgs {
    /// QMSum sessions per repetition (the paper's 10; three repetitions make its 30).
    #[arg(long, default_value_t = 10)]
    pub sessions: usize,
    /// Concurrent MBPP repair sessions per repetition (the paper does not state it; the default
    /// is fitted on the baselines' GPU time, see emulator/CALIBRATION.md).
    #[arg(long, default_value_t = motivation::MBPP_SESSIONS)]
    pub mbpp_sessions: usize,
    /// Repetitions (engine-noise seeds 0..R); GPU time is summed over them, as the paper's.
    #[arg(long, default_value_t = 3)]
    pub repetitions: u64,
    /// How each repetition's sessions arrive: `burst` or `poisson:RATE` (sessions per second,
    /// per workflow).
    #[arg(long, default_value_t = motivation::ARRIVAL)]
    pub arrival: switchyard_runtime::exec::Arrival,
    /// How the MBPP sessions arrive, where it differs from `--arrival`.
    #[arg(long)]
    pub mbpp_arrival: Option<switchyard_runtime::exec::Arrival>,
    /// Rerun one draw of sessions in every repetition (engine noise only), instead of drawing
    /// each repetition's meetings and tasks anew (trace seed SEED + r, the default).
    #[arg(long)]
    pub same_sessions: bool,
    /// Pool file; default `workflows/pools/small.yaml`.
    #[arg(long, default_value = "workflows/pools/small.yaml")]
    pub pool: PathBuf,
    /// Directory for motivation.md and motivation.json.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write each run's event trace (as `switchyard run --trace` writes it) to
    /// DIR/POLICY-rep-N.jsonl.
    #[arg(long, value_name = "DIR")]
    pub trace_dir: Option<PathBuf>,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    #[arg(long, default_value = "graph")]
    pub predictor: String,
}

/// Run `switchyard bench motivation`.
fn motivation(args: MotivationArgs) -> Result<()> {
    if args.sessions == 0 || args.repetitions == 0 {
        bail!("--sessions and --repetitions must be at least 1 (got {} and {})", args.sessions, args.repetitions);
    }
    let max = switchyard_runtime::exec::preflight::MAX_SESSIONS;
    if args.sessions > max || args.mbpp_sessions > max {
        bail!("--sessions and --mbpp-sessions must be at most {max} (got {} and {})", args.sessions, args.mbpp_sessions);
    }
    let wf = |name: &str| -> Result<Arc<WorkflowSpec>> {
        let path = args.pool.parent().and_then(|p| p.parent()).map(|d| d.join(name)).unwrap_or_else(|| PathBuf::from(name));
        let path = if path.is_file() { path } else { PathBuf::from("workflows").join(name) };
        Ok(Arc::new(load_workflow(&path).map_err(|e| anyhow::anyhow!("{e}"))?))
    };
    let pool = PoolSpec::load(&args.pool).map_err(|e| anyhow::anyhow!("{e}"))?;
    let cfg = motivation::MotivationConfig {
        qmsum: wf("qmsum.yaml")?,
        mbpp: wf("mbpp.yaml")?,
        pool,
        sessions: args.sessions,
        mbpp_sessions: args.mbpp_sessions,
        repetitions: args.repetitions,
        arrival: args.arrival,
        seed: args.seed,
        predictor: args.predictor.clone(),
        substrate: Default::default(),
        trace_dir: args.trace_dir.clone(),
        mbpp_arrival: args.mbpp_arrival,
        redraw: !args.same_sessions,
    };
    let report = motivation::run(&cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
    let md = motivation::to_markdown(&report);
    write_and_print(&args.out, "motivation", &md, &report, args.json)
}

fn tao(args: TaoArgs) -> Result<()> {
    use switchyard_runtime::bench::tao;
    if args.sessions == 0 || args.workers.is_empty() || args.workers.contains(&0) {
        bail!("--sessions and every --workers value must be at least 1");
    }
    if args.sessions > 100_000 {
        bail!("--sessions must be at most 100000 (got {})", args.sessions);
    }
    if let Some(w) = args.workers.iter().find(|&&w| w > MAX_TAO_WORKERS) {
        bail!("--workers: every value must be at most {MAX_TAO_WORKERS} (got {w})");
    }
    if let Some((i, w)) = args.workers.iter().enumerate().find(|(i, w)| args.workers[..*i].contains(w)) {
        bail!("--workers: {w} is given twice (value {} of {}); each worker count is one setting", i + 1, args.workers.len());
    }
    if args.workload.is_some() && args.write_trace.is_none() {
        bail!("--workload only chooses the trace `--write-trace` writes; the bench runs its own workloads (swe-lite only with --quick)");
    }
    if let Some(path) = &args.write_trace {
        let name = args.workload.as_deref().unwrap_or("swe-lite");
        let workload = switchyard_runtime::agentic::AgentWorkload::parse(name).ok_or_else(|| anyhow::anyhow!("unknown workload `{name}`"))?;
        let trace = switchyard_runtime::agentic::generate(workload, args.sessions, args.seed);
        std::fs::write(path, switchyard_runtime::agentic::to_jsonl(&trace))
            .with_context(|| format!("--write-trace: cannot write {}", path.display()))?;
        eprintln!("wrote {} sessions ({} turns) to {}", trace.sessions.len(), trace.turns(), path.display());
        // The replay's pools: a session one of their calls cannot hold makes it refuse the file.
        let max_len = [tao::pool_qwen32b_tp2x4(), tao::pool_qwen14b_a100x4()]
            .iter()
            .flat_map(|p| p.replicas.iter().map(|r| r.max_model_len))
            .min()
            .unwrap_or(0);
        let too_long = trace.sessions.iter().filter(|s| s.peak_call_tokens() > max_len).count();
        if too_long > 0 {
            eprintln!(
                "note: {too_long} of {} sessions need more than {max_len} tokens in a call, the max_model_len of `run --trace-replay`'s pools: the replay refuses this trace",
                trace.sessions.len()
            );
        }
        return Ok(());
    }
    let mut cfg = tao::TaoBenchConfig::paper();
    cfg.sessions = args.sessions;
    cfg.workers = args.workers.clone();
    cfg.trace_seed = args.seed;
    cfg.ablations = !args.no_ablations;
    cfg.ablation_workers = args.workers[args.workers.len() / 2];
    if args.quick {
        cfg.pools.truncate(1);
        cfg.workloads.truncate(1);
    }
    // An `--out` that cannot be a directory is an error now, not after the whole bench.
    create_out_dir(&args.out)?;
    let runs = cfg.pools.len() * cfg.workloads.len() * cfg.workers.len() * 5 + if cfg.ablations { 12 } else { 0 };
    let bar = ProgressBar::new(runs as u64);
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}") {
        bar.set_style(style);
    }
    let report = tao::run_tao_bench(&cfg, |label| {
        bar.set_message(label.to_string());
        bar.inc(1);
    })
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    bar.finish_and_clear();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let md = tao::markdown(&report, &command);
    write_out_file(&args.out.join("tao-running.svg"), tao::running_svg(&report).map_err(|e| anyhow::anyhow!("{e}"))?)?;
    write_and_print(&args.out, "tao", &md, &report, args.json)
}

/// Write `NAME.md` and `NAME.json` into `out` (created if missing) and print the JSON (`json`)
/// or the Markdown on stdout: the tail every `switchyard bench EXPERIMENT` shares.
/// Writes `<name>.md` and `<name>.json` under `out`; answers the JSON text.
fn write_files<T: serde::Serialize>(out: &Path, name: &str, md: &str, report: &T) -> Result<String> {
    let text = serde_json::to_string_pretty(report)?;
    create_out_dir(out)?;
    write_out_file(&out.join(format!("{name}.md")), md)?;
    write_out_file(&out.join(format!("{name}.json")), &text)?;
    Ok(text)
}

/// Creates the `--out` directory (and its parents); the error names it.
fn create_out_dir(out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("--out: cannot create the directory {}", out.display()))
}

/// Writes one output file; the error names it.
fn write_out_file(path: &Path, contents: impl AsRef<[u8]>) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))
}

fn write_and_print<T: serde::Serialize>(out: &Path, name: &str, md: &str, report: &T, json: bool) -> Result<()> {
    let text = write_files(out, name, md, report)?;
    if json {
        println!("{text}");
    } else {
        print!("{md}");
    }
    Ok(())
}

fn load_workflows(paths: &[PathBuf]) -> Result<Vec<Arc<WorkflowSpec>>> {
    let mut out: Vec<Arc<WorkflowSpec>> = Vec::new();
    for p in paths {
        // The error already names file, line, column and field.
        let spec = load_workflow(p).map_err(|e| anyhow::anyhow!("{e}"))?;
        if out.iter().any(|w| w.name == spec.name) {
            bail!("{}: workflow name `{}` is used twice in this bench", p.display(), spec.name);
        }
        out.push(Arc::new(spec));
    }
    Ok(out)
}

/// Run `switchyard bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    match args.experiment {
        Some(Experiment::Motivation(m)) => return motivation(m),
        Some(Experiment::Predictor(p)) => return predictor(p),
        Some(Experiment::FrontDoor(f)) => return front_door(f),
        Some(Experiment::Tao(t)) => return tao(t),
        Some(Experiment::Verifier(v)) => return verifier(v),
        Some(Experiment::Oracle(o)) => return oracle(o),
        None => {}
    }
    if args.workers == 0 {
        bail!("--workers must be at least 1 (got 0)");
    }
    if args.quick && args.repetitions.is_some() {
        bail!("--quick runs one repetition; drop --repetitions, or drop --quick to run {}", args.repetitions.unwrap_or(0));
    }
    let unknown: Vec<String> = std::iter::once(("--predictor", &args.predictor))
        .chain(args.predictors.iter().map(|p| ("--predictors", p)))
        .filter_map(|(flag, p)| crate::unknown_predictor(flag, p))
        .collect();
    if !unknown.is_empty() {
        anyhow::bail!("{}", unknown.join("\n"));
    }
    let workflows = load_workflows(&args.workflows)?;
    let pool_path = crate::pool_path::resolve(args.pool.as_deref(), args.workflows.first().map(PathBuf::as_path))?;
    let pool = PoolSpec::load(&pool_path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut cfg = BenchConfig::paper(workflows, pool);
    cfg.sessions = args.sessions;
    cfg.repetitions = args.repetitions.unwrap_or(5);
    cfg.seed = args.seed;
    cfg.predictor = args.predictor.clone();
    cfg.predictors = args.predictors.clone();
    cfg.workers = args.workers;
    if args.quick {
        cfg = cfg.quick();
    }
    let bar = if args.json { ProgressBar::hidden() } else { ProgressBar::new(0) };
    bar.set_style(
        ProgressStyle::with_template("{spinner} simulations {pos}/{len} [{bar:30}] {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let started = std::time::Instant::now();
    let report = bench::run_bench(&cfg, &|done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    bar.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();
    let mut files = bench::write_outputs(&report, &args.out).map_err(|e| anyhow::anyhow!("{e}"))?;
    files.extend(bench::write_timelines(&cfg, &args.out).map_err(|e| anyhow::anyhow!("{e}"))?);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_summary(&report, wall);
        for f in &files {
            println!("wrote {}", f.display());
        }
    }
    Ok(())
}

fn print_summary(r: &BenchReport, wall: f64) {
    let s = &r.setup;
    println!(
        "bench · pool {} ({} GPUs) · {} sessions per workflow × {} workflows · {} repetition(s) · {} simulations in {:.1} s wall",
        s.pool,
        s.gpus,
        s.sessions_per_workflow,
        s.workflows.len(),
        s.repetitions,
        s.simulations,
        wall
    );
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    let mut header = vec!["variant".to_string()];
    for a in &s.arrivals {
        header.extend([format!("{a} makespan s"), "p95 s".into(), "×LB".into()]);
    }
    t.set_header(header);
    let mut seen: Vec<&str> = Vec::new();
    for run in &r.runs {
        if seen.contains(&run.variant.as_str()) {
            continue;
        }
        seen.push(&run.variant);
        let mut row = vec![match run.kind {
            VariantKind::Policy => run.variant.clone(),
            _ => format!("  {}", run.variant),
        }];
        for a in &s.arrivals {
            match r.row(&run.variant, a) {
                Some(x) => row.extend([
                    format!("{:.1}", x.makespan_s),
                    if x.latency_s.is_known() { format!("{:.1}", x.latency_s.p95) } else { "-".to_string() },
                    format!("{:.2}", x.ratio_to_lower_bound),
                ]),
                None => row.extend(["-".to_string(), "-".to_string(), "-".to_string()]),
            }
        }
        t.add_row(row);
    }
    let mut bound = vec!["lower bound".to_string()];
    for a in &s.arrivals {
        bound.extend([
            r.lower_bound_s.get(a).map(|b| format!("{b:.1}")).unwrap_or_else(|| "-".into()),
            String::new(),
            "1.00".into(),
        ]);
    }
    t.add_row(bound);
    println!("{t}");
}
