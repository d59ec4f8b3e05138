//! The execution layer both shells share. DESIGN.md's loop ends "commit the executable prefix
//! ──▶ shell executes ──▶ events": the simulator and the live runtime are two ways of
//! *executing* the planner's commands (virtual time on emulated replicas, wall-clock time on
//! actors and engines). `exec` is everything about executing a run that does not depend on how
//! time passes or where the engines are, so neither shell owns it:
//!
//! - the run's configuration ([`RunConfig`]), its pool file ([`pool`]) and its seeded arrival
//!   trace ([`arrivals`]);
//! - setting a run up ([`setup`]: deployment table, node facts from [`graph_info`], dataset
//!   records, the planner with its policy and predictor, the [`oracle`] estimates);
//! - what happens when an activation becomes ready ([`activation`]: prompt, tokens with
//!   prefix-block hashes of [`BLOCK_SIZE`], responder output, near-ready items, scoring);
//! - what routed workflows need ([`routing`]: the router's setup, a program's first request, its
//!   verdict under the selected verifier);
//! - the state of an agent session (paper 000) and the views TAO's scheduler reads of it
//!   ([`agent_session`]), kept alike by the simulator's agent loop and the live coordinator;
//! - what a shell records ([`CallRecord`], [`TraceLine`], [`record`]'s [`SessionRecord`] and
//!   [`Counters`]) and the one report builder, [`build_report`].
//!
//! Must not depend on `sim` or `live` (both depend on it; `runtime/tests/module_boundaries.rs`
//! checks), on engines, on a clock or on randomness beyond the seeded trace and responders. Only
//! the labelled [`oracle`] estimates and [`preflight`] (the emulated engine's own memory rule,
//! that every deployment fits a device) read the emulator crate (checked too).

pub mod activation;
pub mod agent_session;
pub mod arrivals;
pub mod graph_info;
pub mod oracle;
pub mod pool;
pub mod preflight;
pub mod profiles;
pub mod record;
pub mod routing;
pub mod setup;

use std::sync::Arc;

use serde::Serialize;
use switchyard_predictor::Dtype;
use thiserror::Error;

use crate::ids::ActivationId;
use crate::planner::{JointOptions, PlanError, Substrate};
use crate::session::Session;
use crate::workflow::WorkflowSpec;

pub use activation::{
    AnswerError, MAX_SCHEMA_RETRIES, PrepareContext, PreparedLlm, Ready, common_prefix, model_output, near_ready_items, prepare, sandbox_note, session_score, tool_output, verifier_score,
    tool_trace_detail, whole_blocks,
};
pub use arrivals::{Arrival, TraceEntry};
pub use pool::{PoolError, PoolSpec};
pub use record::{Counters, INTERRUPTED, ReportInput, SessionRecord, SessionTally, TokenWork, build_report};
pub use setup::{DeploymentMap, build_planner, deployment_names, deployment_table, load_records, node_infos};

/// Prefix-cache block size (vLLM's default `--block-size`).
pub const BLOCK_SIZE: u32 = 16;

/// Errors that stop a run before or outside any one session.
#[derive(Debug, Error)]
pub enum ShellError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("workflow {workflow}: {message}")]
    Workflow { workflow: String, message: String },
    #[error("workflow {workflow}: deployment `{deployment}`: {message}")]
    Deployment { workflow: String, deployment: String, message: String },
    #[error("predictor: {0}")]
    Predictor(String),
    #[error("internal: {0}")]
    Internal(String),
}

/// Everything a run needs, whichever shell executes it.
#[derive(Clone)]
pub struct RunConfig {
    pub workflows: Vec<Arc<WorkflowSpec>>,
    /// Sessions per workflow.
    pub sessions: usize,
    pub arrival: Arrival,
    /// Trace and responder seed.
    pub seed: u64,
    /// Engine timing-noise seed (repetitions vary it, keeping the trace).
    pub noise_seed: u64,
    pub pool: PoolSpec,
    pub policy: String,
    /// Mechanisms of the joint policy (ablations switch them off).
    pub options: JointOptions,
    /// Estimates the policy plans with: `oracle` (the emulator's own costs, reference only).
    pub predictor: String,
    /// Threads that execute tool calls.
    pub tool_workers: usize,
    /// vLLM `--max-num-seqs`.
    pub max_num_seqs: u32,
    /// The serving substrate every policy shares (replica cap, reactive scale-out).
    pub substrate: Substrate,
    /// Sessions of each workflow, in `workflows` order, where they differ (e.g. paper 003
    /// §2.2's QMSum sessions beside a different number of MBPP sessions); empty: `sessions`
    /// each.
    pub session_counts: Vec<usize>,
    /// Seconds between a call's finish and its output reaching the session, so that the
    /// successors become ready that much later: the agent framework's time to take the reply,
    /// render the next prompt and submit it ([`FRAMEWORK_HANDOFF_S`] by default). The replica
    /// the call ran on is free in between — a request-level substrate may give it away.
    pub handoff_s: f64,
    /// How routed workflows are routed (paper 002); the default learns every verifier.
    pub routing: routing::RoutingConfig,
    /// Arrival process of each workflow, in `workflows` order, where they differ (e.g. paper
    /// 003 §2.2's QMSum burst beside MBPP sessions arriving over the run); empty: `arrival`
    /// for each.
    pub workflow_arrivals: Vec<Arrival>,
}

/// The agent framework's per-call handoff time: 38 ms, LangGraph's median orchestration
/// overhead over a direct call in MAFBench (CoDS-GCS/MAFBench,
/// `single_agent/framework_overhead`: 60.22 ms against 22.13 ms p50; CrewAI 30 ms).
pub const FRAMEWORK_HANDOFF_S: f64 = 0.038;

impl RunConfig {
    /// The configuration of a served runtime (`live::Service`): `workflows` define the served
    /// deployment table; sessions arrive when clients submit them, so the trace fields are
    /// unused (one burst session each). Policy `joint` with its defaults, the `graph`
    /// predictor, the default substrate, 2 tool workers, vLLM's default batch limit (256), no
    /// framework handoff (the framework is the client). Callers change what they need.
    pub fn served(workflows: Vec<Arc<WorkflowSpec>>, pool: PoolSpec) -> RunConfig {
        RunConfig {
            workflows,
            sessions: 1,
            arrival: Arrival::Burst,
            seed: 42,
            noise_seed: 0,
            pool,
            policy: "joint".into(),
            options: JointOptions::default(),
            predictor: "graph".into(),
            tool_workers: 2,
            max_num_seqs: 256,
            substrate: Substrate::default(),
            session_counts: Vec::new(),
            workflow_arrivals: Vec::new(),
            handoff_s: 0.0,
            routing: Default::default(),
        }
    }

    /// Arrival process of each workflow ([`RunConfig::workflow_arrivals`], else `arrival` each).
    pub fn arrivals_of(&self) -> Vec<Arrival> {
        (0..self.workflows.len()).map(|w| self.workflow_arrivals.get(w).copied().unwrap_or(self.arrival)).collect()
    }

    /// Sessions of each workflow ([`RunConfig::session_counts`], else `sessions` each).
    pub fn sessions_of(&self) -> Vec<usize> {
        if self.session_counts.is_empty() {
            vec![self.sessions; self.workflows.len()]
        } else {
            self.workflows.iter().enumerate().map(|(w, _)| self.session_counts.get(w).copied().unwrap_or(self.sessions)).collect()
        }
    }
}

/// One line of the optional JSONL trace.
#[derive(Debug, Clone, Serialize)]
pub struct TraceLine {
    pub t: f64,
    pub event: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activation: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The `detail` of a trace's `finish` line, the same in every shell: what the call generated
/// and the prompt it read (of which the prefix cache held `cached`), so that a trace alone tells
/// a long generation from a long wait.
pub fn finish_detail(output_tokens: u32, prompt_tokens: u32, cached_prompt_tokens: u32) -> String {
    format!("{output_tokens} tokens; prompt {prompt_tokens} ({cached_prompt_tokens} cached)")
}

/// One completed activation (LLM call or tool call), for offline analysis such as the
/// makespan lower bound (`crate::lower_bound`) and the live-vs-simulator comparisons.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallRecord {
    pub session: u32,
    /// Index of the workflow in the run's list.
    pub workflow: u32,
    pub activation: u32,
    /// Index of the logical node in its workflow.
    pub node: u32,
    /// Catalogue model and dtype of the deployment; `None` for a tool call.
    pub model: Option<(String, Dtype)>,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// Activation indices (same session) this one waited for.
    pub predecessors: Vec<u32>,
    pub finished_at: f64,
}

impl CallRecord {
    /// The record of activation `a` of `session` (of workflow index `workflow`), finished at
    /// `finished_at` on the shell's clock; `None` when the session has no such activation.
    pub fn of(
        session: &Session,
        workflow: u32,
        a: ActivationId,
        model: Option<(String, Dtype)>,
        prompt_tokens: u32,
        output_tokens: u32,
        finished_at: f64,
    ) -> Option<Self> {
        let act = session.activation(a.index)?;
        Some(CallRecord {
            session: a.session.0,
            workflow,
            activation: a.index,
            node: act.node as u32,
            model,
            prompt_tokens,
            output_tokens,
            predecessors: act.predecessors.clone(),
            finished_at,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use crate::workflow::{WorkflowSpec, load_workflow};

    /// The bundled GSM8K, MBPP and QMSum workflows.
    pub(crate) fn bundled_workflows() -> Vec<Arc<WorkflowSpec>> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows");
        ["gsm8k.yaml", "mbpp.yaml", "qmsum.yaml"]
            .iter()
            .map(|f| Arc::new(load_workflow(&root.join(f)).expect("bundled workflow")))
            .collect()
    }
}
