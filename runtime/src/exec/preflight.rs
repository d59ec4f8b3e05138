//! Checks before the first session starts (`switchyard validate` and `run` alike): the run's
//! numbers are in range, and every deployment fits at least one device of the pool with its
//! max context — decided by the engine's own start-up rule (the emulator's memory plan, as
//! `vllm serve` sizes its KV cache), not by the planner's estimates. Every problem is reported,
//! each naming the workflow file, line, column and field, or the flag.
//!
//! The workflow files themselves are checked by the loader (`workflow::load_workflow`); this
//! module needs the pool and the run's flags as well. Pure: no I/O. It reads the emulator's
//! memory rule (the only use of the emulator in `exec` besides the labelled `oracle`
//! estimates), because that rule is what an engine would answer at start-up.

use std::fmt;

use switchyard_emulator::{MemoryPlan, ServingConfig};
use switchyard_predictor::{Dtype, spec};

use super::RunConfig;
use super::arrivals::Arrival;
use crate::workflow::NodeKind;

/// Poisson arrival rates a run accepts, sessions per second per workflow (outside it the
/// trace's times lose all meaning: a rate of 1e-300 put arrivals 10^300 s apart).
pub const MIN_POISSON_RATE: f64 = 1e-6;
pub const MAX_POISSON_RATE: f64 = 1e6;

/// Most sessions one run may ask for (per workflow).
pub const MAX_SESSIONS: usize = 10_000_000;
/// The smallest per-step token budget of vLLM's per-device defaults (`max_num_batched_tokens`
/// 2,048 on A100 / A40 / L4 / V100-class GPUs), which vLLM requires to be ≥ `--max-num-seqs`.
const MAX_NUM_BATCHED_TOKENS: u32 = 2048;

const GIB: f64 = (1u64 << 30) as f64;

/// Everything found wrong, in order: flags first, then workflows in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreflightError {
    pub problems: Vec<String>,
}

impl fmt::Display for PreflightError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problems.join("\n"))
    }
}

impl std::error::Error for PreflightError {}

/// Which engine rule decides whether a deployment fits a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitRule {
    /// The emulated (vLLM-like) engine's memory plan: the simulator and `switchyard emulate`.
    EmulatedEngine,
    /// Not ours to decide (a fixed OpenAI-compatible endpoint serves whatever it serves).
    None,
}

/// Check `cfg` before any session starts.
pub fn check(cfg: &RunConfig, rule: FitRule) -> Result<(), PreflightError> {
    let mut problems = flag_problems(cfg.sessions, cfg.max_num_seqs, cfg.tool_workers, cfg.arrival);
    for (w, &n) in cfg.session_counts.iter().enumerate() {
        if n > MAX_SESSIONS {
            problems.push(format!("sessions of workflow {}: {n} is out of range (0 to {MAX_SESSIONS})", w + 1));
        }
    }
    if !(cfg.handoff_s.is_finite() && (0.0..=3600.0).contains(&cfg.handoff_s)) {
        problems.push(format!("--handoff-delay: {} must be a number of seconds from 0 to 3600", cfg.handoff_s));
    }
    let sub = &cfg.substrate;
    if sub.replica_cap == Some(0) {
        problems.push("--replica-cap: 0 leaves no replica for any model (at least 1)".into());
    }
    if !(sub.scale_out_waiting.is_finite() && sub.scale_out_waiting >= 0.0) {
        problems.push(format!("--scale-out-waiting: {} must be a number ≥ 0", sub.scale_out_waiting));
    }
    if !(sub.upscale_delay_s.is_finite() && sub.upscale_delay_s >= 0.0) {
        problems.push(format!("--upscale-delay: {} must be a number of seconds ≥ 0", sub.upscale_delay_s));
    }
    if cfg.pool.devices.is_empty() {
        problems.push(format!("pool `{}`: it has no GPU", cfg.pool.name));
    }
    if rule == FitRule::EmulatedEngine && !cfg.pool.devices.is_empty() {
        problems.extend(fit_problems(cfg));
    }
    if problems.is_empty() { Ok(()) } else { Err(PreflightError { problems }) }
}

/// The run's numbers out of range, each naming its flag (checkable before any file is read).
pub fn flag_problems(sessions: usize, max_num_seqs: u32, tool_workers: usize, arrival: Arrival) -> Vec<String> {
    let mut problems = Vec::new();
    if sessions == 0 || sessions > MAX_SESSIONS {
        problems.push(format!("--sessions: {sessions} is out of range (1 to {MAX_SESSIONS} per workflow)"));
    }
    if max_num_seqs == 0 || max_num_seqs > MAX_NUM_BATCHED_TOKENS {
        problems.push(format!(
            "--max-num-seqs: {max_num_seqs} is out of range (1 to {MAX_NUM_BATCHED_TOKENS}: vLLM requires max_num_batched_tokens {MAX_NUM_BATCHED_TOKENS} ≥ max_num_seqs)"
        ));
    }
    if tool_workers == 0 || tool_workers > 1024 {
        problems.push(format!("--tool-workers: {tool_workers} is out of range (1 to 1024)"));
    }
    if let Arrival::Poisson(r) = arrival
        && !(r.is_finite() && r > 0.0)
    {
        problems.push(format!("--arrival: Poisson rate {r} must be a positive number"));
    } else if let Arrival::Poisson(r) = arrival
        && !(MIN_POISSON_RATE..=MAX_POISSON_RATE).contains(&r)
    {
        problems.push(format!(
            "--arrival: Poisson rate {r:e} sessions/s is out of range ({MIN_POISSON_RATE} to {MAX_POISSON_RATE}; {MIN_POISSON_RATE} is one session every 11.6 days)"
        ));
    }
    problems
}

/// Each workflow deployment that fits no device of the pool. A deployment is served as its
/// cross-workflow identity (same model and dtype): with the largest `max_context` and
/// `gpu_memory_utilization` any workflow asks for, as the shells load it.
fn fit_problems(cfg: &RunConfig) -> Vec<String> {
    let max_num_seqs = cfg.max_num_seqs.clamp(1, MAX_NUM_BATCHED_TOKENS);
    // The identities exactly as the shells build them (an unknown model is the loader's error).
    let Ok((table, identity_of)) = super::setup::deployment_table(&cfg.workflows, max_num_seqs) else {
        return Vec::new();
    };
    let mut kinds: Vec<&spec::DeviceSpec> = Vec::new();
    for d in &cfg.pool.devices {
        if !kinds.iter().any(|k| k.name == d.name) {
            kinds.push(d);
        }
    }
    let mut problems = Vec::new();
    for (w, wf) in cfg.workflows.iter().enumerate() {
        for d in wf.deployments.values() {
            let Ok(model) = spec::model(&d.model) else { continue };
            let Some(info) = identity_of.get(&(w as u32, d.name.clone())).and_then(|id| table.get(id.0 as usize)) else {
                continue;
            };
            let (max_len, util) = (info.max_model_len, info.gpu_memory_utilization);
            let config_on = |k: &spec::DeviceSpec| {
                let mut config = ServingConfig::vllm_defaults_on(k, d.dtype, max_len);
                config.gpu_memory_utilization = util;
                config.max_num_seqs = max_num_seqs;
                config
            };
            if kinds.iter().any(|k| MemoryPlan::new(k, &model, &config_on(k)).is_ok()) {
                continue;
            }
            // The figures of the device kind that comes closest.
            let need = kinds
                .iter()
                .map(|k| MemoryPlan::requirement(&model, &config_on(k)))
                .min_by_key(|r| r.total_bytes())
                .unwrap_or_else(|| MemoryPlan::requirement(&model, &ServingConfig::vllm_defaults(d.dtype, max_len)));
            let offers = kinds
                .iter()
                .map(|k| {
                    let budget = util * k.memory_bytes as f64 / GIB;
                    if d.dtype == Dtype::Bf16 && !k.supports_bf16 {
                        format!("{} (no bf16: use `dtype: fp16`)", k.name)
                    } else {
                        format!("{} {budget:.1} GiB", k.name)
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
            let nodes: Vec<&str> = wf
                .nodes
                .iter()
                .filter(|n| {
                    matches!(&n.kind, NodeKind::Agent(a)
                        if a.deployment == d.name || a.route.as_ref().is_some_and(|r| r.contains(&d.name)))
                })
                .map(|n| n.id.as_str())
                .collect();
            let used_by = if nodes.is_empty() { "no node".to_string() } else { format!("node{} {}", if nodes.len() > 1 { "s" } else { "" }, nodes.join(", ")) };
            let context = if max_len > d.max_context {
                format!("max_context {max_len} (the largest any workflow of this run asks of {})", d.model)
            } else {
                format!("max_context {max_len}")
            };
            problems.push(format!(
                "{}:{}:{}: deployments.{}: {} ({}, {context}, used by {used_by}) fits no device of pool `{}`: it needs {:.1} GiB ({:.1} GiB weights + {:.1} GiB engine overhead + {:.1} GiB KV cache for one {max_len}-token sequence); at gpu_memory_utilization {util} the pool offers {offers}",
                wf.path.display(),
                d.declared_at.0,
                d.declared_at.1,
                d.name,
                d.model,
                match d.dtype { Dtype::Bf16 => "bf16", Dtype::Fp16 => "fp16", Dtype::Fp32 => "fp32", Dtype::Fp8 => "fp8" },
                cfg.pool.name,
                need.total_bytes() as f64 / GIB,
                need.weight_bytes as f64 / GIB,
                need.overhead_bytes as f64 / GIB,
                need.kv_bytes as f64 / GIB,
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::exec::PoolSpec;
    use crate::planner::JointOptions;
    use crate::workflow::parse_workflow;

    fn cfg(yaml: &str, pool: &[&str]) -> RunConfig {
        let wf = parse_workflow("team.yaml", yaml, Path::new(".")).unwrap_or_else(|e| panic!("{e}"));
        RunConfig {
            workflows: vec![Arc::new(wf)],
            sessions: 3,
            arrival: Arrival::Burst,
            seed: 1,
            noise_seed: 0,
            pool: PoolSpec::on_one_host(
                "test".into(),
                None,
                pool.iter().map(|d| spec::device(d).unwrap_or_else(|e| panic!("{e}"))).collect(),
            ),
            policy: "parrot".into(),
            options: JointOptions::default(),
            predictor: "formula".into(),
            tool_workers: 1,
            max_num_seqs: 256,
            substrate: Default::default(),
            session_counts: Vec::new(),
            workflow_arrivals: Vec::new(),
            handoff_s: crate::exec::FRAMEWORK_HANDOFF_S,
            routing: Default::default(),
        }
    }

    const BIG: &str = "name: t
deployments:
  small: {model: Qwen3-4B, dtype: fp16, max_context: 8192, max_output_tokens: 256}
  big: {model: Qwen3-14B, dtype: fp16, max_context: 8192, max_output_tokens: 256}
nodes:
  - {id: plan, deployment: big, prompt: plan it}
  - {id: act, deployment: small, prompt: do it, after: plan}
";

    #[test]
    fn a_model_that_fits_no_device_is_named_with_its_memory() {
        let e = check(&cfg(BIG, &["V100-32GB", "V100-32GB"]), FitRule::EmulatedEngine).err();
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.starts_with("team.yaml:4:3: deployments.big: Qwen3-14B (fp16, max_context 8192, used by node plan) fits no device of pool `test`"), "{text}");
        assert!(text.contains("GiB weights") && text.contains("V100-32GB 28.8 GiB"), "{text}");
        assert!(!text.contains("deployments.small"), "{text}");
        assert_eq!(check(&cfg(BIG, &["V100-32GB", "A100-40GB"]), FitRule::EmulatedEngine), Ok(()));
        assert_eq!(check(&cfg(BIG, &["V100-32GB"]), FitRule::None), Ok(()));
    }

    #[test]
    fn a_route_member_that_fits_no_device_is_named_with_the_routed_node() {
        let routed = BIG.replace("{id: plan, deployment: big, prompt: plan it}", "{id: plan, deployment: {route: [small, big]}, prompt: plan it}");
        let e = check(&cfg(&routed, &["V100-32GB", "V100-32GB"]), FitRule::EmulatedEngine).err();
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.starts_with("team.yaml:4:3: deployments.big: Qwen3-14B (fp16, max_context 8192, used by node plan) fits no device of pool `test`"), "{text}");
        assert_eq!(check(&cfg(&routed, &["V100-32GB", "A100-40GB"]), FitRule::EmulatedEngine), Ok(()));
    }

    #[test]
    fn every_bad_number_is_reported_at_once() {
        let mut c = cfg(BIG, &["A100-80GB"]);
        c.sessions = 0;
        c.max_num_seqs = 0;
        c.tool_workers = 0;
        let e = check(&c, FitRule::EmulatedEngine).err().map(|e| e.problems).unwrap_or_default();
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e[0].starts_with("--sessions: 0") && e[1].starts_with("--max-num-seqs: 0") && e[2].starts_with("--tool-workers: 0"));
        c.max_num_seqs = 9000;
        c.sessions = 1;
        c.tool_workers = 1;
        let e = check(&c, FitRule::EmulatedEngine).err().map(|e| e.problems).unwrap_or_default();
        assert_eq!(e.len(), 1, "{e:?}");
        c.max_num_seqs = 256;
        c.handoff_s = f64::NAN;
        let e = check(&c, FitRule::EmulatedEngine).err().map(|e| e.problems).unwrap_or_default();
        assert!(e.len() == 1 && e[0].starts_with("--handoff-delay: NaN"), "{e:?}");
        c.handoff_s = -1.0;
        assert!(check(&c, FitRule::EmulatedEngine).is_err());
        c.handoff_s = 0.0;
        assert_eq!(check(&c, FitRule::EmulatedEngine), Ok(()));
        c.session_counts = vec![MAX_SESSIONS + 1];
        let e = check(&c, FitRule::EmulatedEngine).err().map(|e| e.problems).unwrap_or_default();
        assert!(e.len() == 1 && e[0].starts_with("sessions of workflow 1:"), "{e:?}");
        c.session_counts = Vec::new();
        for (rate, ok) in [(1e-300, false), (1e-6, true), (0.15, true), (1e6, true), (1e7, false)] {
            c.arrival = Arrival::Poisson(rate);
            assert_eq!(check(&c, FitRule::EmulatedEngine).is_ok(), ok, "rate {rate}");
        }
    }

    #[test]
    fn bf16_on_volta_is_named() {
        let y = BIG.replace("Qwen3-4B, dtype: fp16", "Qwen3-4B, dtype: bf16");
        let text = check(&cfg(&y, &["V100-32GB"]), FitRule::EmulatedEngine).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("deployments.small") && text.contains("no bf16"), "{text}");
    }
}
