//! `switchyard emulate`: serve ONE emulated replica over HTTP with vLLM's API surface
//! (`switchyard_runtime::live::server`). Parses the flags — named like `vllm serve`'s where
//! they mean the same — and runs the server until SIGINT/SIGTERM. CLI edge only: all
//! behaviour lives in the runtime crate.
//!
//! Must not depend on the planner, the shells or the binary's other modules: `live::server` is
//! all it uses.

use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result};
use clap::Args;
use switchyard_runtime::live::server::{self, EmulateConfig};

/// Serve one emulated GPU replica over HTTP with vLLM's API (completions, sleep mode, /metrics).
#[derive(Debug, Args)]
pub struct EmulateArgs {
    /// Device kind from the catalogue (e.g. A100-40GB, V100-32GB).
    #[arg(long)]
    pub device: String,
    /// Model from the catalogue (e.g. Qwen3-8B).
    #[arg(long)]
    pub model: String,
    /// Weights and KV dtype: fp16|bf16|fp32|fp8, or vLLM's float16|bfloat16|float32.
    #[arg(long, default_value = "fp16")]
    pub dtype: String,
    /// vLLM --max-model-len (default: the model's context length).
    #[arg(long)]
    pub max_model_len: Option<u32>,
    /// vLLM --gpu-memory-utilization.
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// vLLM --max-num-seqs.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: u32,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to bind (0 picks a free one; the address is printed on stderr).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Emulated seconds per wall-clock second (100 = a hundred times faster than the device), from
    /// 0.001 to 1000000.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Seed of the engine's timing noise.
    #[arg(long, default_value_t = 0)]
    pub noise_seed: u64,
    /// vLLM --served-model-name (default: the model name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Fault injection: fraction of completion requests answered with HTTP 500.
    #[arg(long, default_value_t = 0.0)]
    pub fail_rate: f64,
    /// Fault injection: fraction answered 200 with an unparsable body.
    #[arg(long, default_value_t = 0.0)]
    pub garbage_rate: f64,
    /// Seed of the fault draws.
    #[arg(long, default_value_t = 0)]
    pub fault_seed: u64,
    /// Accepted for command-line compatibility with `vllm serve`; sleep mode is always on.
    #[arg(long)]
    pub enable_sleep_mode: bool,
    /// Accepted for command-line compatibility with `vllm serve`: tool calling is always on, as
    /// vLLM serves Qwen3 with `--enable-auto-tool-choice --tool-call-parser hermes`.
    #[arg(long)]
    pub enable_auto_tool_choice: bool,
    /// vLLM's tool-call parser: only `hermes` (Qwen3's `<tool_call>` format, the one the
    /// emulated model writes) is emulated.
    #[arg(long, value_parser = ["hermes"])]
    pub tool_call_parser: Option<String>,
}

/// Runs `switchyard emulate` until interrupted.
pub fn run(args: EmulateArgs) -> Result<()> {
    let dtype = server::parse_dtype(&args.dtype).map_err(anyhow::Error::msg)?;
    let config = EmulateConfig {
        device: args.device,
        model: args.model,
        dtype,
        max_model_len: args.max_model_len,
        gpu_memory_utilization: args.gpu_memory_utilization,
        max_num_seqs: args.max_num_seqs,
        speed: args.speed,
        noise_seed: args.noise_seed,
        served_model_name: args.served_model_name,
        fail_rate: args.fail_rate,
        garbage_rate: args.garbage_rate,
        fault_seed: args.fault_seed,
    };
    let what = format!(
        "{} on {} at {}x",
        config.served_name(),
        config.device,
        config.speed
    );
    let addr = SocketAddr::new(args.host, args.port);
    server::run_blocking(config, addr, |bound| {
        eprintln!("switchyard emulate: {what}, listening on http://{bound}");
    })
    .with_context(|| format!("switchyard emulate on {addr}"))
}
