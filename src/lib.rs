//! Switchyard as a library: run multi-agent LLM workflows on a GPU pool from your own program.
//!
//! Two ways in:
//!
//! * **Simulate** a workload on the embedded emulated pool (virtual time, deterministic):
//!   [`simulate`] with a [`RunConfig`] — what `switchyard run` does.
//! * **Run live** in process: [`Runtime`] starts the live runtime (the planner core, one actor
//!   per session and per GPU replica, the engines a live pool file names — `switchyard
//!   emulate` children on a machine without GPUs, `vllm serve` or any OpenAI-compatible server
//!   otherwise); register workflows, start sessions, wait for their answers, call models
//!   through the front door — what `switchyard serve` exposes over HTTP.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use switchyard::Runtime;
//! let rt = Runtime::builder("workflows/pools/live-emulated.yaml")
//!     .workflow("tests/fixtures/tiny_chain.yaml")
//!     .start()
//!     .await?;
//! let sessions = rt.run("tiny-chain", vec![Default::default(); 2]).await?;
//! for status in rt.wait(&sessions).await? {
//!     println!("{status:?}");
//! }
//! rt.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! Tools: besides the built-in, sandboxed tools (`python_tests`, `majority_vote`), a program
//! plugs in its own with [`register_tool`] before it loads the workflows that name them (its
//! inputs, verdicts and modeled duration in a [`ToolSpec`]; the code a [`CustomTool`], e.g. a
//! closure). A custom tool is the program's own trusted code: it runs in process, unsandboxed,
//! and must be a function of its call. `examples/custom_tool.rs` shows one.
//!
//! The crate re-exports the runtime's types it uses; everything else is
//! `switchyard_runtime`'s (this facade adds no behaviour of its own). It must not depend on
//! the CLI's modules.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use switchyard_runtime::exec::{Arrival, PoolSpec, RunConfig};
pub use switchyard_runtime::ids::SessionId;
pub use switchyard_runtime::live::engine::{Completion, TokenSink};
pub use switchyard_runtime::live::program_actor::ProgramRequest;
pub use switchyard_runtime::live::{LiveConfig, LiveOutput, Service, ServiceError, SessionStatus};
pub use switchyard_runtime::planner::{JointOptions, Reclaim, Substrate};
pub use switchyard_runtime::report::RunReport;
pub use switchyard_runtime::sim::{SimOutput, simulate};
pub use switchyard_runtime::values::{NodeOutput, Record};
pub use switchyard_runtime::workflow::{WorkflowError, WorkflowSpec, load_workflow, parse_workflow};
pub use switchyard_tools::custom::{CustomTool, ToolSpec, register as register_tool};
pub use switchyard_tools::{ToolCall, ToolError, ToolOutcome};

use switchyard_runtime::live::engines::EngineSpec;
use switchyard_runtime::live::{LivePoolSpec, PoolEngines};

/// Why the runtime could not start or answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Workflow(#[from] WorkflowError),
    #[error("{path}: {message}")]
    Pool { path: String, message: String },
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error("live runtime: {0}")]
    Live(String),
    #[error("no workflow named `{0}` is registered")]
    UnknownWorkflow(String),
}

/// How to start a [`Runtime`]: the live pool file, the workflows served from the start (their
/// deployments are the served deployment table), and the planner's policy.
#[derive(Debug, Clone)]
pub struct RuntimeBuilder {
    pool: PathBuf,
    workflows: Vec<PathBuf>,
    policy: String,
    predictor: String,
    seed: u64,
    noise_seed: u64,
    sleep: bool,
    stream: bool,
    switchyard_exe: Option<PathBuf>,
}

impl RuntimeBuilder {
    /// Serve this workflow file from the start (repeatable).
    pub fn workflow(mut self, path: impl Into<PathBuf>) -> Self {
        self.workflows.push(path.into());
        self
    }

    /// The scheduling policy: `joint` (default), `parrot` or `kairos`.
    pub fn policy(mut self, policy: &str) -> Self {
        self.policy = policy.to_string();
        self
    }

    /// The planner's estimates: `graph` (default), `gbdt`, `formula` or `oracle`.
    pub fn predictor(mut self, predictor: &str) -> Self {
        self.predictor = predictor.to_string();
        self
    }

    /// Seeds of the emulated outputs and of the engines' timing noise.
    pub fn seeds(mut self, seed: u64, noise_seed: u64) -> Self {
        self.seed = seed;
        self.noise_seed = noise_seed;
        self
    }

    /// Reclaim idle replicas by vLLM sleep mode instead of unloading them.
    pub fn sleep(mut self, on: bool) -> Self {
        self.sleep = on;
        self
    }

    /// Ask the engines for streamed answers (default on).
    pub fn stream(mut self, on: bool) -> Self {
        self.stream = on;
        self
    }

    /// The `switchyard` binary that engine command templates starting with `switchyard` run
    /// (default: `switchyard` next to this program, else the one on the `PATH`).
    pub fn switchyard_exe(mut self, path: impl Into<PathBuf>) -> Self {
        self.switchyard_exe = Some(path.into());
        self
    }

    /// Load the workflows and the pool, start the engines' factory and the runtime. Must be
    /// called inside a multi-threaded tokio runtime.
    pub async fn start(self) -> Result<Runtime, Error> {
        let mut workflows = Vec::new();
        let mut texts = Vec::new();
        for p in &self.workflows {
            workflows.push(Arc::new(load_workflow(p)?));
            texts.push(std::fs::read_to_string(p).map_err(|source| Error::Read { path: p.display().to_string(), source })?);
        }
        let pool_err = |message: String| Error::Pool { path: self.pool.display().to_string(), message };
        let pool: LivePoolSpec<EngineSpec> = LivePoolSpec::load(&self.pool).map_err(|e| pool_err(e.to_string()))?;
        let mut run = RunConfig::served(workflows.clone(), pool.pool.clone());
        run.seed = self.seed;
        run.noise_seed = self.noise_seed;
        run.policy = self.policy.clone();
        run.predictor = self.predictor.clone();
        run.substrate.reclaim = if self.sleep { Reclaim::Sleep } else { Reclaim::Unload };
        let exe = self.switchyard_exe.clone().or_else(default_switchyard_exe);
        let engines = PoolEngines::new(&pool, self.noise_seed, exe).map_err(|e| pool_err(e.to_string()))?;
        let speed = engines.speed().map_err(|e| pool_err(e.to_string()))?;
        let mut cfg = LiveConfig::new(run);
        cfg.speed = speed;
        cfg.stream = self.stream;
        let service = Service::start(&cfg, Arc::new(engines)).await.map_err(|e| Error::Live(e.to_string()))?;
        let names = workflows.iter().enumerate().map(|(i, w)| (w.name.clone(), i as u32)).collect();
        Ok(Runtime {
            service: Arc::new(service),
            names: std::sync::Mutex::new(names),
            startup: workflows.into_iter().zip(texts).collect(),
        })
    }
}

/// `switchyard` next to the running program (or its parent directory: cargo puts examples in
/// `target/<profile>/examples/`), if it is there.
fn default_switchyard_exe() -> Option<PathBuf> {
    let me = std::env::current_exe().ok()?;
    let dir = me.parent()?;
    [dir.join("switchyard"), dir.parent()?.join("switchyard")].into_iter().find(|p| p.is_file())
}

/// The live runtime, in process. Every method takes `&self`; share it behind an `Arc`.
pub struct Runtime {
    service: Arc<Service>,
    names: std::sync::Mutex<BTreeMap<String, u32>>,
    startup: Vec<(Arc<WorkflowSpec>, String)>,
}

impl Runtime {
    /// Start describing a runtime on the live pool file `pool` (e.g.
    /// `workflows/pools/live-emulated.yaml`: `switchyard emulate` children, no GPU needed).
    pub fn builder(pool: impl AsRef<Path>) -> RuntimeBuilder {
        RuntimeBuilder {
            pool: pool.as_ref().to_path_buf(),
            workflows: Vec::new(),
            policy: "joint".into(),
            predictor: "graph".into(),
            seed: 42,
            noise_seed: 0,
            sleep: false,
            stream: true,
            switchyard_exe: None,
        }
    }

    /// The service underneath (what `switchyard serve`'s HTTP API drives).
    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }

    /// The workflows the runtime started with, with their YAML text.
    pub fn startup_workflows(&self) -> &[(Arc<WorkflowSpec>, String)] {
        &self.startup
    }

    /// Register a workflow given as YAML text (`source` names it in errors). Its deployments
    /// must be among the served ones.
    pub async fn register(&self, source: &str, yaml: &str) -> Result<String, Error> {
        let spec = parse_workflow(source, yaml, Path::new("."))?;
        let name = spec.name.clone();
        let index = self.service.register(spec).await?;
        self.lock_names().insert(name.clone(), index);
        Ok(name)
    }

    /// Start one session of workflow `name` per input record; answers their ids.
    pub async fn run(&self, name: &str, inputs: Vec<Record>) -> Result<Vec<SessionId>, Error> {
        let index = self.lock_names().get(name).copied().ok_or_else(|| Error::UnknownWorkflow(name.to_string()))?;
        Ok(self.service.submit(index, inputs).await?)
    }

    /// Where these sessions stand.
    pub async fn status(&self, sessions: &[SessionId]) -> Result<Vec<SessionStatus>, Error> {
        Ok(self.service.status(sessions.to_vec()).await?)
    }

    /// Wait until every one of these sessions ended; answers their final status.
    pub async fn wait(&self, sessions: &[SessionId]) -> Result<Vec<SessionStatus>, Error> {
        loop {
            let status = self.status(sessions).await?;
            if !status.iter().any(|s| matches!(s, SessionStatus::Running)) {
                return Ok(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One call through the front door: `model` (a served model) answers `request` for the
    /// program `program` (`None`: a program of this call alone). Pieces of the answer go to
    /// `sink` as they arrive.
    pub async fn call(&self, program: Option<&str>, model: &str, request: ProgramRequest, sink: TokenSink) -> Result<Completion, Error> {
        let rx = self.service.call(program.map(str::to_string), model, request, sink)?;
        match rx.await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(reason)) => Err(Error::Live(reason)),
            Err(_) => Err(Error::Live("the runtime dropped the call".into())),
        }
    }

    /// Fail what is still open, reclaim every engine, and answer the report of everything the
    /// runtime ran.
    pub async fn shutdown(&self) -> Result<LiveOutput, Error> {
        self.service.shutdown("the runtime was shut down").await.map_err(|e| Error::Live(e.to_string()))
    }

    fn lock_names(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u32>> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }
}
