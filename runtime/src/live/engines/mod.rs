//! The engines behind the [`Engine`](crate::live::engine::Engine) trait, and the factory that
//! builds one per replica from a pool file's `engine:` mapping ([`EngineSpec`]).
//!
//! - [`http::HttpEngine`] — one vLLM-compatible base URL over HTTP (reqwest): completions with
//!   usage and measured TTFT, sleep mode, `/metrics` telemetry. The `emulated` and `vllm`
//!   engines talk through it. No hidden retries: retrying is the replica actor's decision.
//! - [`vllm::VllmEngine`] — a managed child process (`vllm serve …`, or `switchyard emulate …`
//!   for the `emulated` kind and in tests) from a command template, in its own process group;
//!   health-wait, crash detection, restart, and a clean shutdown with no orphans; every child
//!   is forked by one spawner thread with `PR_SET_PDEATHSIG(SIGKILL)` and recorded in the
//!   [`registry`].
//! - [`openai::OpenAiEngine`] — a fixed OpenAI-compatible endpoint (the HTTP engine built as a
//!   fixed endpoint: chat API by default, completions with `api: completions`); no lifecycle
//!   control, no loads or GPU time counted for it.
//! - [`metrics`] — a parser of the Prometheus text format that keeps `vllm:*` names.
//! - [`registry`] — pidfiles of the managed engine children (process group, start times,
//!   owner), and the sweep that kills what a killed Switchyard left running.
//!
//! Engines do I/O and decide nothing; they must not depend on the planner, the simulator or
//! the actors.
//!
//! A pool file carries an [`EngineSpec`] per device group:
//! ```yaml
//! devices:
//!   - kind: A100-40GB
//!     engine: { kind: emulated, speed: 50 }                 # a managed `switchyard emulate`
//!   - kind: V100-32GB
//!     count: 2
//!     engine:
//!       kind: vllm                                          # a managed `vllm serve`
//!       models: { Qwen3-8B: Qwen/Qwen3-8B }                 # what {model} expands to
//!       env: { HF_HOME: /data/hf }
//!   - kind: H100-80GB
//!     engine: { kind: openai, base_url: "http://10.0.0.5:8000/v1", api_key_env: VLLM_KEY }
//! ```

pub mod http;
pub mod metrics;
pub mod openai;
pub mod registry;
pub mod vllm;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_predictor::spec::Dtype;
use thiserror::Error;

use crate::live::engine::Engine;

pub use http::{HttpEngine, HttpOptions};
pub use metrics::MetricsSnapshot;
pub use openai::OpenAiEngine;
pub use vllm::{ManagedCommand, VllmEngine, process_group_members};

/// vLLM's default command (field anchors §1.1: sleep mode needs `--enable-sleep-mode` and
/// `VLLM_SERVER_DEV_MODE=1`; `docs/features/sleep_mode.md`; `--enable-prompt-tokens-details`
/// makes the usage report `prompt_tokens_details.cached_tokens`, the prefix-cache hits;
/// `--enable-auto-tool-choice --tool-call-parser hermes` is function calling as Qwen's own
/// documentation serves Qwen3 — the front door passes a client's `tools` on, and without the
/// flags vLLM refuses `tool_choice: "auto"`).
pub const DEFAULT_VLLM_COMMAND: &str = "vllm serve {model} --served-model-name {served} \
     --host {host} --port {port} --gpu-memory-utilization {util} --max-model-len {max_len} \
     --max-num-seqs {max_num_seqs} --dtype {dtype} --enable-sleep-mode \
     --enable-prompt-tokens-details --enable-auto-tool-choice --tool-call-parser hermes";

/// The `emulated` kind's default command: `switchyard emulate` on the same flags. A program
/// named `switchyard` resolves to [`LaunchParams::switchyard_exe`] when that is set.
pub const DEFAULT_EMULATE_COMMAND: &str = "switchyard emulate --device {device} --model {model} \
     --served-model-name {served} --host {host} --port {port} --dtype {dtype} \
     --max-model-len {max_len} --gpu-memory-utilization {util} --max-num-seqs {max_num_seqs} \
     --noise-seed {noise_seed} --speed {speed} --enable-auto-tool-choice --tool-call-parser hermes";

/// The placeholders a command template and its `env` values may use.
pub const PLACEHOLDERS: [&str; 12] = [
    "model",
    "served",
    "host",
    "port",
    "util",
    "max_len",
    "max_num_seqs",
    "dtype",
    "gpu",
    "device",
    "noise_seed",
    "speed",
];

/// Which engine serves a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// A `switchyard emulate` server: managed child process (default), or a running one at
    /// `base_url`.
    Emulated,
    /// A managed `vllm serve` child process (or any command speaking vLLM's API).
    Vllm,
    /// A fixed OpenAI-compatible endpoint at `base_url`; no lifecycle control.
    Openai,
}

/// Which OpenAI endpoint requests go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApiFlavor {
    /// `POST /v1/completions` with the prompt rendered in Qwen3's chat template
    /// (`tokens::chat_prompt`; token counts match the simulator's).
    #[default]
    Completions,
    /// `POST /v1/chat/completions` with the prompt as one user message, thinking disabled
    /// (`chat_template_kwargs.enable_thinking = false`; token counts match the simulator's).
    Chat,
}

/// A command template: one line split on whitespace (no shell quoting), or a list of
/// arguments (for arguments with spaces).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CommandTemplate {
    Line(String),
    Args(Vec<String>),
}

impl CommandTemplate {
    /// The template's words.
    pub fn words(&self) -> Vec<String> {
        match self {
            CommandTemplate::Line(l) => l.split_whitespace().map(str::to_string).collect(),
            CommandTemplate::Args(a) => a.clone(),
        }
    }
}

/// A pool file's `engine:` mapping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSpec {
    pub kind: EngineKind,
    /// Command template (`vllm`, `emulated`); defaults: [`DEFAULT_VLLM_COMMAND`],
    /// [`DEFAULT_EMULATE_COMMAND`].
    #[serde(default)]
    pub command: Option<CommandTemplate>,
    /// Extra environment of the child (values may use placeholders). The `vllm` kind always
    /// sets `CUDA_VISIBLE_DEVICES={gpu}` and `VLLM_SERVER_DEV_MODE=1` unless given here.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Physical GPU ordinals on this host of the group's devices, in order (`{gpu}`, and the
    /// `vllm` kind's `CUDA_VISIBLE_DEVICES`): as many as the group's `count`, distinct, not
    /// negative, and inside an inherited `CUDA_VISIBLE_DEVICES` mask. Default: the device's
    /// index in its group (0, 1, …), through the inherited mask when one is set. Needed when
    /// two groups of managed `vllm` engines share this host.
    #[serde(default)]
    pub gpus: Option<Vec<i64>>,
    /// Fixed endpoint (`openai`: required, e.g. `http://host:8000/v1`; `emulated`: optional, a
    /// running `switchyard emulate` at `http://host:port`).
    #[serde(default)]
    pub base_url: Option<String>,
    /// API key sent as `Authorization: Bearer …`.
    #[serde(default)]
    pub api_key: Option<String>,
    /// Name of an environment variable holding the API key (read when the engine is built).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Extra HTTP headers on every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Completions (default for `vllm` / `emulated`) or chat (default for `openai`).
    #[serde(default)]
    pub api: Option<ApiFlavor>,
    /// Catalogue model name → what the server loads / is asked for (`{model}`; e.g.
    /// `Qwen3-8B: Qwen/Qwen3-8B`). Unlisted models: for a `vllm` engine, a `Qwen3-*` name maps
    /// to its Hugging Face id `Qwen/Qwen3-*`; otherwise (the `emulated` kind, a `vllm` kind
    /// whose command runs `switchyard`, other names) a name maps to itself.
    #[serde(default)]
    pub models: BTreeMap<String, String>,
    /// `emulated`: virtual seconds per wall second for `{speed}` (default 1).
    #[serde(default)]
    pub speed: Option<f64>,
    /// Host the child binds and is reached at (default `127.0.0.1`).
    #[serde(default)]
    pub host: Option<String>,
    /// Seconds to wait for `/health` after a start (default 900: vLLM cold starts with
    /// `torch.compile` and CUDA graphs take 35 s to several minutes, field anchors §0.2).
    #[serde(default)]
    pub health_timeout_s: Option<f64>,
    /// Seconds one HTTP call may take at most (default 600); the planner gives each call a
    /// shorter deadline from its predicted duration.
    #[serde(default)]
    pub request_timeout_s: Option<f64>,
    /// Seconds a call may make no progress (no answer, no stream chunk) before the server is
    /// probed; a server that does not answer the probe is taken as dead (default 30).
    #[serde(default)]
    pub stall_timeout_s: Option<f64>,
    /// Seconds between SIGTERM and SIGKILL at shutdown (default 30).
    #[serde(default)]
    pub shutdown_grace_s: Option<f64>,
}

/// Default `health_timeout_s`.
pub const DEFAULT_HEALTH_TIMEOUT_S: f64 = 900.0;
/// Default `request_timeout_s`.
pub const DEFAULT_REQUEST_TIMEOUT_S: f64 = 600.0;
/// Default `stall_timeout_s`.
pub const DEFAULT_STALL_TIMEOUT_S: f64 = 30.0;
/// Default `shutdown_grace_s`.
pub const DEFAULT_SHUTDOWN_GRACE_S: f64 = 30.0;
/// The longest `*_timeout_s` / `shutdown_grace_s` a pool may set: one day (vLLM's slowest
/// cold starts take minutes; a longer wait is a typo, and `Instant + Duration` past what the
/// clock can hold panics).
pub const MAX_ENGINE_SECONDS: f64 = 86_400.0;
/// The speeds (virtual seconds per wall second) an engine's `speed` may take: those of
/// `switchyard emulate --speed`, from a thousandth to a million. Outside it the runtime's
/// clock maps virtual times to wall instants past what `Instant` can hold (a speed of 1e-300)
/// or to nothing measurable.
pub use crate::live::server::SPEED_RANGE;

/// Why `speed` is refused: not a number in [`SPEED_RANGE`] (`None`: accepted).
pub fn speed_problem(speed: f64) -> Option<String> {
    (!SPEED_RANGE.contains(&speed)).then(|| {
        format!(
            "{speed} is not a number from {} to {} (virtual seconds per wall second)",
            SPEED_RANGE.start(),
            SPEED_RANGE.end()
        )
    })
}

/// `Instant::now() + wait`, saturating: a wait past what the clock can hold is a deadline
/// about 30 years ahead (as tokio's far future), never a panic.
pub fn deadline_after(wait: Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);
    now.checked_add(wait.min(FAR))
        .or_else(|| now.checked_add(Duration::from_secs(86_400)))
        .unwrap_or(now)
}

impl EngineSpec {
    /// A spec of `kind` with every option at its default.
    pub fn new(kind: EngineKind) -> Self {
        EngineSpec {
            kind,
            command: None,
            env: BTreeMap::new(),
            gpus: None,
            base_url: None,
            api_key: None,
            api_key_env: None,
            headers: BTreeMap::new(),
            api: None,
            models: BTreeMap::new(),
            speed: None,
            host: None,
            health_timeout_s: None,
            request_timeout_s: None,
            stall_timeout_s: None,
            shutdown_grace_s: None,
        }
    }

    /// What `{model}` expands to for a catalogue model: the `models:` entry; else, for a
    /// `vllm` engine that really is vLLM, the Hugging Face id of a Qwen3 model
    /// (`Qwen3-8B` → `Qwen/Qwen3-8B`); else the catalogue name.
    pub fn model_id(&self, catalogue_model: &str) -> String {
        if let Some(m) = self.models.get(catalogue_model) {
            return m.clone();
        }
        if self.kind == EngineKind::Vllm
            && !self.runs_emulator()
            && catalogue_model.starts_with("Qwen3-")
        {
            return format!("Qwen/{catalogue_model}");
        }
        catalogue_model.to_string()
    }

    /// Whether the managed child is Switchyard's own emulator: the `emulated` kind, or a
    /// command whose program is `switchyard` (the emulator standing in for vLLM). It takes
    /// catalogue model names and uses no GPU.
    pub fn runs_emulator(&self) -> bool {
        self.kind == EngineKind::Emulated
            || self.template().words().first().is_some_and(|p| {
                Path::new(p).file_name().is_some_and(|n| n == "switchyard")
            })
    }

    /// Whether this engine's child is placed on a GPU by its ordinal: a managed `vllm` engine
    /// that is not the emulator and gets the default `CUDA_VISIBLE_DEVICES={gpu}`, or any
    /// managed engine whose command or environment uses `{gpu}`.
    pub fn places_on_gpu(&self) -> bool {
        if self.kind == EngineKind::Openai
            || (self.kind == EngineKind::Emulated && self.base_url.is_some())
        {
            return false;
        }
        let uses = self.template().words().iter().any(|w| w.contains("{gpu}"))
            || self.env.values().any(|v| v.contains("{gpu}"));
        uses || (self.kind == EngineKind::Vllm
            && !self.runs_emulator()
            && !self.env.contains_key("CUDA_VISIBLE_DEVICES"))
    }

    /// The model name requests must carry: the catalogue name where the command passes
    /// `--served-model-name {served}`; otherwise what the server loaded (`{model}`), which is
    /// what vLLM serves under by default; for `openai`, the mapped model id.
    pub fn served_model(&self, catalogue_model: &str) -> String {
        match self.kind {
            EngineKind::Openai => self.model_id(catalogue_model),
            EngineKind::Emulated | EngineKind::Vllm => {
                // The server is told the catalogue name (`--served-model-name {served}`, or
                // through its environment): requests carry that name.
                let uses_served = self
                    .template()
                    .words()
                    .iter()
                    .chain(self.env.values())
                    .any(|w| w.contains("{served}"));
                if uses_served || (self.base_url.is_some() && self.kind == EngineKind::Emulated) {
                    catalogue_model.to_string()
                } else {
                    self.model_id(catalogue_model)
                }
            }
        }
    }

    /// The command template in force.
    pub fn template(&self) -> CommandTemplate {
        match (&self.command, self.kind) {
            (Some(c), _) => c.clone(),
            (None, EngineKind::Emulated) => CommandTemplate::Line(DEFAULT_EMULATE_COMMAND.into()),
            (None, _) => CommandTemplate::Line(DEFAULT_VLLM_COMMAND.into()),
        }
    }

    fn seconds(
        field: &'static str,
        value: Option<f64>,
        default: f64,
    ) -> Result<Duration, EngineSpecError> {
        let v = value.unwrap_or(default);
        if v > MAX_ENGINE_SECONDS {
            return Err(EngineSpecError::Invalid {
                field,
                reason: format!("{v} s is more than one day ({MAX_ENGINE_SECONDS} s)"),
            });
        }
        Duration::try_from_secs_f64(v)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or(EngineSpecError::Invalid {
                field,
                reason: format!("{v} is not a positive number of seconds"),
            })
    }

    fn api_key(&self) -> Result<Option<String>, EngineSpecError> {
        match (&self.api_key, &self.api_key_env) {
            (Some(k), _) => Ok(Some(k.clone())),
            (None, Some(var)) => {
                std::env::var(var)
                    .map(Some)
                    .map_err(|_| EngineSpecError::Invalid {
                        field: "api_key_env",
                        reason: format!("environment variable `{var}` is not set"),
                    })
            }
            (None, None) => Ok(None),
        }
    }

    /// The HTTP options shared by the engines.
    pub fn http_options(&self, default_api: ApiFlavor) -> Result<HttpOptions, EngineSpecError> {
        Ok(HttpOptions {
            api: self.api.unwrap_or(default_api),
            request_timeout: Self::seconds(
                "request_timeout_s",
                self.request_timeout_s,
                DEFAULT_REQUEST_TIMEOUT_S,
            )?,
            health_timeout: Self::seconds(
                "health_timeout_s",
                self.health_timeout_s,
                DEFAULT_HEALTH_TIMEOUT_S,
            )?,
            stall_timeout: Self::seconds(
                "stall_timeout_s",
                self.stall_timeout_s,
                DEFAULT_STALL_TIMEOUT_S,
            )?,
            api_key: self.api_key()?,
            headers: self.headers.clone(),
        })
    }
}

/// What a replica's engine is started for (filled by the live shell from the deployment and
/// the device).
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchParams {
    /// Catalogue model name (`Qwen3-8B`).
    pub model: String,
    /// Device catalogue name (`A100-40GB`), for `{device}`.
    pub device_kind: String,
    /// The device's physical GPU ordinal on this host (`{gpu}`; the `vllm` kind's
    /// `CUDA_VISIBLE_DEVICES`), resolved by the live factory from the group's `gpus:`, the
    /// device's index in its group and the inherited `CUDA_VISIBLE_DEVICES` mask.
    pub gpu: u32,
    pub dtype: Dtype,
    pub max_model_len: u32,
    pub gpu_memory_utilization: f64,
    pub max_num_seqs: u32,
    /// Seed of the emulated engine noise (`{noise_seed}`).
    pub noise_seed: u64,
    /// Where the `switchyard` binary is (a template's program `switchyard` resolves to it);
    /// the CLI passes `std::env::current_exe()`.
    pub switchyard_exe: Option<PathBuf>,
}

/// vLLM's `--dtype` spelling.
pub fn vllm_dtype(d: Dtype) -> &'static str {
    match d {
        Dtype::Fp16 => "float16",
        Dtype::Bf16 => "bfloat16",
        Dtype::Fp32 => "float32",
        // vLLM serves FP8 through `--quantization fp8` on top of a 16-bit activation dtype.
        Dtype::Fp8 => "auto",
    }
}

/// Why an engine could not be built from its spec.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum EngineSpecError {
    #[error("engine.{field}: required for kind `{kind}`")]
    Missing {
        field: &'static str,
        kind: &'static str,
    },
    #[error("engine.{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("engine.command: unknown placeholder `{{{0}}}` (known: {known})", known = PLACEHOLDERS.join(", "))]
    UnknownPlaceholder(String),
}

/// Builds the engine of one replica.
pub fn engine_for(
    spec: &EngineSpec,
    launch: &LaunchParams,
) -> Result<Box<dyn Engine>, EngineSpecError> {
    // The runtime's clock runs at the pool's speed whatever serves it: a speed of 0, below 0,
    // not a number or outside SPEED_RANGE is refused for every kind (it was checked only where
    // a command takes it). A `--speed N` written into the command sets the clock too.
    if let Some(speed) = spec.speed {
        if !(speed.is_finite() && speed > 0.0) {
            return Err(EngineSpecError::Invalid { field: "speed", reason: format!("{speed} is not a positive number") });
        }
        if let Some(reason) = speed_problem(speed) {
            return Err(EngineSpecError::Invalid { field: "speed", reason });
        }
    }
    if spec.kind != EngineKind::Openai {
        let words = spec.template().words();
        let written = words.windows(2).filter(|w| w[0] == "--speed").filter_map(|w| w[1].parse::<f64>().ok());
        if let Some(reason) = written.filter(|s| s.is_finite() && *s > 0.0).find_map(speed_problem) {
            return Err(EngineSpecError::Invalid { field: "command", reason: format!("--speed {reason}") });
        }
    }
    match spec.kind {
        EngineKind::Openai => {
            let base = spec.base_url.clone().ok_or(EngineSpecError::Missing {
                field: "base_url",
                kind: "openai",
            })?;
            let options = spec.http_options(ApiFlavor::Chat)?;
            let engine = OpenAiEngine::new(&base, &spec.served_model(&launch.model), options)
                .map_err(|e| EngineSpecError::Invalid {
                    field: "base_url",
                    reason: e.to_string(),
                })?;
            Ok(Box::new(engine))
        }
        EngineKind::Emulated if spec.base_url.is_some() => {
            let base = spec.base_url.clone().unwrap_or_default();
            let options = spec.http_options(ApiFlavor::Completions)?;
            let engine = HttpEngine::new(
                "emulated",
                &base,
                &spec.served_model(&launch.model),
                options,
            )
            .map_err(|e| EngineSpecError::Invalid {
                field: "base_url",
                reason: e.to_string(),
            })?;
            Ok(Box::new(engine))
        }
        EngineKind::Emulated | EngineKind::Vllm => {
            let command = ManagedCommand::from_spec(spec, launch)?;
            let options = spec.http_options(ApiFlavor::Completions)?;
            let kind = if spec.kind == EngineKind::Emulated {
                "emulated"
            } else {
                "vllm"
            };
            let grace = EngineSpec::seconds(
                "shutdown_grace_s",
                spec.shutdown_grace_s,
                DEFAULT_SHUTDOWN_GRACE_S,
            )?;
            Ok(Box::new(VllmEngine::new(
                kind,
                command,
                &spec.served_model(&launch.model),
                options,
                grace,
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> LaunchParams {
        LaunchParams {
            model: "Qwen3-8B".into(),
            device_kind: "A100-40GB".into(),
            gpu: 3,
            dtype: Dtype::Fp16,
            max_model_len: 8192,
            gpu_memory_utilization: 0.9,
            max_num_seqs: 256,
            noise_seed: 7,
            switchyard_exe: Some(PathBuf::from("/opt/bin/switchyard")),
        }
    }

    #[test]
    fn pool_yaml_engine_mappings_parse() {
        let s: EngineSpec = serde_saphyr::from_str(
            "{ kind: vllm, command: \"switchyard emulate --device {device} --model {model} --port {port} --speed 50\" }",
        )
        .unwrap();
        assert_eq!(s.kind, EngineKind::Vllm);
        assert_eq!(s.template().words().len(), 10);
        let s: EngineSpec = serde_saphyr::from_str(
            "{ kind: openai, base_url: \"http://h:1/v1\", api_key: k, headers: { X-A: b }, models: { Qwen3-8B: Qwen/Qwen3-8B } }",
        )
        .unwrap();
        assert_eq!(s.served_model("Qwen3-8B"), "Qwen/Qwen3-8B");
        let s: EngineSpec =
            serde_saphyr::from_str("{ kind: emulated, command: [a, \"b c\", \"{port}\"] }")
                .unwrap();
        assert_eq!(s.template().words(), ["a", "b c", "{port}"]);
        assert!(serde_saphyr::from_str::<EngineSpec>("{ kind: gpu }").is_err());
        assert!(serde_saphyr::from_str::<EngineSpec>("{ kind: vllm, prot: 3 }").is_err());
    }

    #[test]
    fn the_bundled_live_pool_builds_engines() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../workflows/pools/live-emulated.yaml");
        let pool: crate::live::pool::LivePoolSpec<EngineSpec> =
            crate::live::pool::LivePoolSpec::load(&path).unwrap();
        for (spec, device) in pool.engines().unwrap().iter().zip(&pool.pool.devices) {
            let launch = LaunchParams {
                device_kind: device.name.clone(),
                ..launch()
            };
            let argv = ManagedCommand::from_spec(spec, &launch).unwrap().argv(4242);
            assert_eq!(argv[0], "/opt/bin/switchyard");
            assert!(
                argv.windows(2)
                    .any(|w| w == ["--device", device.name.as_str()]),
                "{argv:?}"
            );
            assert!(argv.windows(2).any(|w| w == ["--port", "4242"]), "{argv:?}");
            assert_eq!(spec.served_model("Qwen3-8B"), "Qwen3-8B");
            assert_eq!(
                engine_for(spec, &launch).map(|e| e.kind()).ok(),
                Some("vllm")
            );
        }
    }

    #[test]
    fn served_model_follows_the_template() {
        let mut s = EngineSpec::new(EngineKind::Vllm);
        s.models.insert("Qwen3-8B".into(), "Qwen/Qwen3-8B".into());
        // The default template passes --served-model-name {served}.
        assert_eq!(s.served_model("Qwen3-8B"), "Qwen3-8B");
        assert_eq!(s.model_id("Qwen3-8B"), "Qwen/Qwen3-8B");
        s.command = Some(CommandTemplate::Line(
            "vllm serve {model} --port {port}".into(),
        ));
        assert_eq!(s.served_model("Qwen3-8B"), "Qwen/Qwen3-8B");
        // A server told its name through the environment serves that name.
        s.env.insert("SERVED_NAME".into(), "{served}".into());
        assert_eq!(s.served_model("Qwen3-8B"), "Qwen3-8B");
    }

    #[test]
    fn factory_checks_required_fields_and_placeholders() {
        let e = engine_for(&EngineSpec::new(EngineKind::Openai), &launch()).err();
        assert_eq!(
            e,
            Some(EngineSpecError::Missing {
                field: "base_url",
                kind: "openai"
            })
        );
        let mut s = EngineSpec::new(EngineKind::Vllm);
        s.command = Some(CommandTemplate::Line(
            "vllm serve {modle} --port {port}".into(),
        ));
        assert_eq!(
            engine_for(&s, &launch()).err(),
            Some(EngineSpecError::UnknownPlaceholder("modle".into()))
        );
        let mut s = EngineSpec::new(EngineKind::Vllm);
        s.request_timeout_s = Some(-1.0);
        assert!(matches!(
            engine_for(&s, &launch()),
            Err(EngineSpecError::Invalid {
                field: "request_timeout_s",
                ..
            })
        ));
        let mut s = EngineSpec::new(EngineKind::Openai);
        s.base_url = Some("http://127.0.0.1:9/v1".into());
        s.api_key_env = Some("SWITCHYARD_TEST_SURELY_UNSET_VAR".into());
        assert!(matches!(
            engine_for(&s, &launch()),
            Err(EngineSpecError::Invalid {
                field: "api_key_env",
                ..
            })
        ));
        // A speed that is no positive number, for every kind (a fixed endpoint's too: the
        // runtime's clock runs at it).
        for speed in [0.0, -5.0, f64::NAN] {
            let mut s = EngineSpec::new(EngineKind::Openai);
            s.base_url = Some("http://127.0.0.1:9/v1".into());
            s.speed = Some(speed);
            assert!(matches!(engine_for(&s, &launch()), Err(EngineSpecError::Invalid { field: "speed", .. })), "{speed}");
        }
        let kinds: Vec<&str> = [EngineKind::Emulated, EngineKind::Vllm]
            .into_iter()
            .map(|k| {
                engine_for(&EngineSpec::new(k), &launch())
                    .map(|e| e.kind())
                    .unwrap_or("error")
            })
            .collect();
        assert_eq!(kinds, ["emulated", "vllm"]);
    }

    #[test]
    fn out_of_range_seconds_and_speeds_are_refused_naming_the_pool_file_and_field() {
        use crate::live::factory::PoolEngines;
        use crate::live::pool::LivePoolSpec;
        // Each of these was accepted; the timeouts then panicked at `Instant::now() + t` (health
        // wait) and the speeds in the clocks' `Instant + Duration`.
        for (field, engine) in [
            ("health_timeout_s", "{ kind: vllm, command: \"x {port}\", health_timeout_s: 1e19 }"),
            ("health_timeout_s", "{ kind: emulated, health_timeout_s: 86401 }"),
            ("request_timeout_s", "{ kind: openai, base_url: \"http://127.0.0.1:9/v1\", request_timeout_s: 1e18 }"),
            ("stall_timeout_s", "{ kind: emulated, stall_timeout_s: 1e10 }"),
            ("shutdown_grace_s", "{ kind: vllm, command: \"x {port}\", shutdown_grace_s: 1e19 }"),
            ("speed", "{ kind: emulated, speed: 1e-300 }"),
            ("speed", "{ kind: openai, base_url: \"http://127.0.0.1:9/v1\", speed: 1e7 }"),
            ("command", "{ kind: vllm, command: \"switchyard emulate --port {port} --speed 1e-300\" }"),
        ] {
            let text = format!("name: t\ndevices:\n  - {{ kind: A40, engine: {engine} }}\n");
            let pool = LivePoolSpec::<EngineSpec>::parse(Path::new("p.yaml"), &text).unwrap();
            let err = PoolEngines::with_mask(&pool, 0, None, None).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.starts_with(&format!("p.yaml: devices[0].engine.{field}: ")), "{engine}: {err}");
        }
        // The bounds themselves are accepted.
        for engine in [
            "{ kind: emulated, health_timeout_s: 86400, speed: 0.001 }",
            "{ kind: emulated, speed: 1000000 }",
        ] {
            let text = format!("name: t\ndevices:\n  - {{ kind: A40, engine: {engine} }}\n");
            let pool = LivePoolSpec::<EngineSpec>::parse(Path::new("p.yaml"), &text).unwrap();
            assert!(PoolEngines::with_mask(&pool, 0, None, None).is_ok(), "{engine}");
        }
    }

    #[test]
    fn deadlines_past_what_the_clock_holds_saturate() {
        let year = Duration::from_secs(86_400 * 365);
        let now = std::time::Instant::now();
        assert!(deadline_after(Duration::MAX) > now + year);
        assert!(deadline_after(Duration::from_secs_f64(1e19)) > now + year);
        let soon = deadline_after(Duration::from_secs(2));
        assert!(soon >= now + Duration::from_secs(2) && soon < now + Duration::from_secs(60));
    }

    #[test]
    fn vllm_loads_qwen3_by_its_hugging_face_id_unless_the_pool_says_otherwise() {
        let mut s = EngineSpec::new(EngineKind::Vllm);
        assert_eq!(s.model_id("Qwen3-8B"), "Qwen/Qwen3-8B");
        assert_eq!(s.model_id("Qwen3-0.6B"), "Qwen/Qwen3-0.6B");
        assert_eq!(s.model_id("Llama-3-8B"), "Llama-3-8B");
        let argv = ManagedCommand::from_spec(&s, &launch()).unwrap().argv(1);
        assert_eq!(argv[..3], ["vllm", "serve", "Qwen/Qwen3-8B"]);
        // The server is still asked for the catalogue name it serves under.
        assert_eq!(s.served_model("Qwen3-8B"), "Qwen3-8B");
        s.models.insert("Qwen3-8B".into(), "/models/qwen3-8b-awq".into());
        assert_eq!(s.model_id("Qwen3-8B"), "/models/qwen3-8b-awq");
        // The emulator takes catalogue names, as the `emulated` kind or a `switchyard` command.
        assert_eq!(EngineSpec::new(EngineKind::Emulated).model_id("Qwen3-8B"), "Qwen3-8B");
        let mut e = EngineSpec::new(EngineKind::Vllm);
        e.command = Some(CommandTemplate::Line("/opt/bin/switchyard emulate --model {model} --port {port}".into()));
        assert_eq!(e.model_id("Qwen3-8B"), "Qwen3-8B");
        assert_eq!(e.served_model("Qwen3-8B"), "Qwen3-8B");
    }

    #[test]
    fn the_default_vllm_command_reports_cached_prompt_tokens_and_parses_tool_calls() {
        let argv = ManagedCommand::from_spec(&EngineSpec::new(EngineKind::Vllm), &launch())
            .unwrap()
            .argv(8000);
        assert!(argv.iter().any(|a| a == "--enable-prompt-tokens-details"), "{argv:?}");
        assert!(argv.iter().any(|a| a == "--enable-sleep-mode"), "{argv:?}");
        let parser = argv.iter().position(|a| a == "--tool-call-parser");
        assert!(argv.iter().any(|a| a == "--enable-auto-tool-choice") && parser.is_some_and(|i| argv[i + 1] == "hermes"), "{argv:?}");
    }

    #[test]
    fn gpus_parse_and_decide_placement() {
        let s: EngineSpec = serde_saphyr::from_str("{ kind: vllm, gpus: [4, 5] }").unwrap();
        assert_eq!(s.gpus, Some(vec![4, 5]));
        assert!(s.places_on_gpu());
        let c = ManagedCommand::from_spec(&s, &launch()).unwrap();
        assert_eq!(c.env(1)["CUDA_VISIBLE_DEVICES"], "3", "{{gpu}} is the launch's ordinal");
        let mut e = EngineSpec::new(EngineKind::Vllm);
        e.env.insert("CUDA_VISIBLE_DEVICES".into(), "1,2".into());
        assert!(!e.places_on_gpu());
        e.env.insert("CUDA_VISIBLE_DEVICES".into(), "{gpu}".into());
        assert!(e.places_on_gpu());
        assert!(!EngineSpec::new(EngineKind::Emulated).places_on_gpu());
        assert!(!EngineSpec::new(EngineKind::Openai).places_on_gpu());
    }

    #[test]
    fn vllm_dtype_names() {
        assert_eq!(vllm_dtype(Dtype::Fp16), "float16");
        assert_eq!(vllm_dtype(Dtype::Bf16), "bfloat16");
        assert_eq!(vllm_dtype(Dtype::Fp32), "float32");
    }
}
