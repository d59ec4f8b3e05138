//! What both shells (the simulator and the live runtime) do identically around the planner
//! core: the deployment table, per-workflow node facts, preparing a ready activation (prompt
//! rendering, real BPE token counts, the responder's output, the planner's [`WorkItem`]),
//! near-ready reporting, per-session accuracy, and building the [`RunReport`] from what a shell
//! recorded.
//!
//! Copied from `sim/mod.rs` (`deployment_table`, `prepare`, `report_near_ready`, `finish`) so
//! the live runtime computes exactly what the simulator computes; the lead dedupes the
//! simulator onto this module later. Pure functions over their arguments: no clock, no I/O
//! (except reading datasets in [`load_records`]), no randomness beyond the seeded responders.
//! Must not depend on `live`, on engines, or on the emulator crate.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;
use switchyard_predictor::{Dtype, spec};
use switchyard_tools::ToolCall;
use thiserror::Error;

use crate::ids::{ActivationId, SessionId};
use crate::planner::profiled::{PREDICTORS, ProfiledEstimates};
use crate::planner::{
    DeploymentId, DeploymentInfo, DeviceInfo, Estimates, JointOptions, NearReadyItem, PlanError,
    Planner, WorkItem, policy_by_name,
};
use crate::report::{
    DeviceTimeline, GpuBreakdown, Percentiles, RunReport, Segment, SegmentKind, WorkflowReport,
    gpu, round3,
};
use crate::responder::{self, ResponderRequest};
use crate::session::{ActivationState, Session};
use crate::sim::graph_info::{self, NodeInfo};
use crate::sim::{BLOCK_SIZE, oracle};
use crate::tokens;
use crate::values::{NodeOutput, Record, derive_seed};
use crate::workflow::{MetricKind, NodeKind, WorkflowSpec};

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

/// Deployment of each (workflow index, deployment name).
pub type DeploymentMap = BTreeMap<(u32, String), DeploymentId>;

/// Build the deployment table: one identity per (model, dtype) across all workflows, served with
/// the largest max context any workflow needs, so identical deployments share replicas.
pub fn deployment_table(
    workflows: &[Arc<WorkflowSpec>],
    max_num_seqs: u32,
) -> Result<(Vec<DeploymentInfo>, DeploymentMap), ShellError> {
    let mut by_key: BTreeMap<(String, Dtype), (u32, f64)> = BTreeMap::new();
    for wf in workflows {
        for d in wf.deployments.values() {
            let m = spec::model(&d.model).map_err(|e| ShellError::Deployment {
                workflow: wf.name.clone(),
                deployment: d.name.clone(),
                message: e.to_string(),
            })?;
            let e = by_key.entry((m.name.clone(), d.dtype)).or_insert((0, 0.0));
            e.0 = e.0.max(d.max_context);
            e.1 = e.1.max(d.gpu_memory_utilization);
        }
    }
    let mut table = Vec::new();
    let mut ids = BTreeMap::new();
    for (i, ((model, dtype), (max_len, util))) in by_key.iter().enumerate() {
        let m = spec::model(model).map_err(|e| ShellError::Internal(e.to_string()))?;
        table.push(DeploymentInfo {
            id: DeploymentId(i as u32),
            model: model.clone(),
            dtype: *dtype,
            max_model_len: *max_len,
            gpu_memory_utilization: *util,
            weight_bytes: m.param_bytes(*dtype),
            kv_bytes_per_token: m.kv_bytes_per_token(*dtype),
            max_num_seqs,
        });
        ids.insert((model.clone(), *dtype), DeploymentId(i as u32));
    }
    let mut deployment_of = BTreeMap::new();
    for (w, wf) in workflows.iter().enumerate() {
        for d in wf.deployments.values() {
            let m = spec::model(&d.model).map_err(|e| ShellError::Internal(e.to_string()))?;
            if let Some(id) = ids.get(&(m.name.clone(), d.dtype)) {
                deployment_of.insert((w as u32, d.name.clone()), *id);
            }
        }
    }
    Ok((table, deployment_of))
}

/// Static per-node facts of every workflow (fused chains, critical paths).
pub fn node_infos(workflows: &[Arc<WorkflowSpec>], deployment_of: &DeploymentMap) -> Vec<Vec<NodeInfo>> {
    workflows
        .iter()
        .enumerate()
        .map(|(w, wf)| {
            graph_info::workflow_info(wf, |name| deployment_of.get(&(w as u32, name.to_string())).copied())
        })
        .collect()
}

/// The planner with the named policy and predictor, as the simulator builds it.
pub fn build_planner(
    devices: &[switchyard_predictor::DeviceSpec],
    deployments: &[DeploymentInfo],
    policy: &str,
    options: JointOptions,
    predictor: &str,
) -> Result<Planner, ShellError> {
    let devices: Vec<DeviceInfo> = devices
        .iter()
        .enumerate()
        .map(|(i, s)| DeviceInfo { id: crate::ids::DeviceId(i as u32), spec: s.clone() })
        .collect();
    let estimates: Box<dyn Estimates> = match predictor {
        "oracle" => Box::new(crate::planner::estimates::Cached::new(oracle::OracleEstimates)),
        name if PREDICTORS.contains(&name) => Box::new(
            ProfiledEstimates::build(name, deployments, &devices).map_err(|e| ShellError::Predictor(e.to_string()))?,
        ),
        other => {
            return Err(ShellError::Predictor(format!(
                "unknown predictor `{other}` (known: {}, oracle)",
                PREDICTORS.join(", ")
            )));
        }
    };
    let policy = policy_by_name(policy, options, estimates)?;
    Ok(Planner::new(devices, deployments.to_vec(), policy))
}

/// Every workflow's dataset records (none may be empty).
pub fn load_records(workflows: &[Arc<WorkflowSpec>]) -> Result<Vec<Vec<Record>>, ShellError> {
    let mut records = Vec::new();
    for wf in workflows {
        let r = wf
            .load_records()
            .map_err(|e| ShellError::Workflow { workflow: wf.name.clone(), message: e.to_string() })?;
        if r.is_empty() {
            return Err(ShellError::Workflow {
                workflow: wf.name.clone(),
                message: "the dataset has no records".into(),
            });
        }
        records.push(r);
    }
    Ok(records)
}

/// A ready LLM activation's request: the rendered prompt, its tokens and the responder output.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedLlm {
    pub prompt: String,
    pub prompt_tokens: u32,
    /// Prefix-cache block hashes of the prompt (vLLM block size [`BLOCK_SIZE`]).
    pub prefix_hashes: Vec<u64>,
    /// The responder's output: what an emulated engine returns for this call.
    pub output: NodeOutput,
    pub max_output_tokens: u32,
}

/// What a ready activation needs, once rendered.
#[derive(Debug, Clone, PartialEq)]
pub enum Ready {
    Tool { call: ToolCall, node: String, workflow: u32, node_index: u32 },
    Llm { item: WorkItem, prepared: PreparedLlm, node: String },
    /// The session cannot continue (bad template, responder error, context overflow).
    Fail(String),
}

/// The run-wide facts [`prepare`] needs.
pub struct PrepareContext<'a> {
    /// Trace and responder seed.
    pub seed: u64,
    pub deployments: &'a [DeploymentInfo],
    pub deployment_of: &'a DeploymentMap,
    pub node_info: &'a [Vec<NodeInfo>],
}

/// Render what ready activation `a` of `session` (of workflow index `workflow`) needs: tool
/// inputs (the tool activation is marked running), or the prompt, its tokens and the
/// responder's output (seeded by (seed, workflow, session, node, round), as in the simulator).
pub fn prepare(
    ctx: &PrepareContext<'_>,
    session: &mut Session,
    workflow: u32,
    a: ActivationId,
    now: f64,
) -> Result<Ready, ShellError> {
    let Some(node) = session.node_of(a.index).cloned() else {
        return Err(ShellError::Internal(format!("activation {a} has no node")));
    };
    let round = session.activation(a.index).map(|x| x.round).unwrap_or(0);
    match &node.kind {
        NodeKind::Tool(tool) => {
            let inputs = match session.render_tool_inputs(a.index) {
                Ok(i) => i,
                Err(e) => return Ok(Ready::Fail(format!("{}: {e}", node.id))),
            };
            session.mark_running(a.index).map_err(|e| ShellError::Internal(e.to_string()))?;
            let call = ToolCall { tool: tool.tool.clone(), inputs, timeout_s: tool.timeout_s };
            let node_index = session.activation(a.index).map(|x| x.node as u32).unwrap_or(0);
            Ok(Ready::Tool { call, node: node.id.clone(), workflow, node_index })
        }
        NodeKind::Agent(agent) => {
            let segments = match session.render_prompt(a.index) {
                Ok(s) => s,
                Err(e) => return Ok(Ready::Fail(format!("{}: {e}", node.id))),
            };
            let ids = tokens::encode_segments(&segments);
            let prompt: String = segments.concat();
            let wf_name = session.spec().name.clone();
            let Some(deployment) = ctx.deployment_of.get(&(workflow, agent.deployment.clone())).copied() else {
                return Err(ShellError::Internal(format!("no deployment `{}`", agent.deployment)));
            };
            let Some(info) = ctx.deployments.get(deployment.0 as usize) else {
                return Err(ShellError::Internal(format!("no deployment {deployment:?}")));
            };
            let upstream = session.upstream(a.index);
            let req = ResponderRequest {
                responder: &agent.responder,
                node: &node.id,
                model: &info.model,
                input: session.input(),
                prompt: &prompt,
                upstream: &upstream,
                length: agent.output_tokens,
                max_output_tokens: agent.max_output_tokens,
                seed: derive_seed(ctx.seed, &[&wf_name, &a.session.0.to_string(), &node.id, &round.to_string()]),
            };
            let output = match responder::respond(&req) {
                Ok(o) => o,
                Err(e) => return Ok(Ready::Fail(format!("{}: responder: {e}", node.id))),
            };
            let prompt_tokens = ids.len() as u32;
            if prompt_tokens as u64 + output.output_tokens as u64 > info.max_model_len as u64 {
                return Ok(Ready::Fail(format!(
                    "{}: prompt of {prompt_tokens} tokens + {} output tokens exceeds max_model_len {}",
                    node.id, output.output_tokens, info.max_model_len
                )));
            }
            let prefix_hashes = tokens::block_hashes(&ids, BLOCK_SIZE as usize);
            let node_index = session.activation(a.index).map(|x| x.node).unwrap_or(0);
            let Some(info) = ctx.node_info.get(workflow as usize) else {
                return Err(ShellError::Internal(format!("no node facts for workflow {workflow}")));
            };
            let spec = Arc::clone(session.spec());
            let item = WorkItem {
                activation: a,
                workflow,
                deployment,
                prompt_tokens,
                max_output_tokens: agent.max_output_tokens,
                ready_at: now,
                node: node_index as u32,
                chain_prev: graph_info::chain_prev_activation(info, session, a),
                chain_next: info[node_index].chain_next.is_some(),
                envelope: graph_info::chain_envelope(&spec, info, session, node_index, prompt_tokens),
                remaining_path_tokens: info[node_index].remaining_path_tokens,
            };
            let prepared = PreparedLlm {
                prompt,
                prompt_tokens,
                prefix_hashes,
                output,
                max_output_tokens: agent.max_output_tokens,
            };
            Ok(Ready::Llm { item, prepared, node: node.id.clone() })
        }
    }
}

/// Activations of `session` that became near-ready (all predecessors completed or running, at
/// least one running) and are not in `sent`, as the planner's [`NearReadyItem`]s.
pub fn near_ready_items(
    session: &Session,
    workflow: u32,
    node_info: &[NodeInfo],
    sent: &BTreeSet<ActivationId>,
) -> Vec<NearReadyItem> {
    let s = session.id();
    let mut items = Vec::new();
    for a in session.near_ready() {
        if sent.contains(&a) {
            continue;
        }
        let Some(act) = session.activation(a.index) else { continue };
        let NodeKind::Agent(agent) = &session.spec().nodes[act.node].kind else { continue };
        let Some(deployment) = node_info.get(act.node).and_then(|n| n.deployment) else { continue };
        let waits_for = act
            .predecessors
            .iter()
            .filter(|&&p| session.activation(p).is_some_and(|x| x.state != ActivationState::Completed))
            .map(|&p| ActivationId { session: s, index: p })
            .collect();
        let (prompt_bound, _) = graph_info::prompt_bound(session.spec(), node_info, session, act.node, &[]);
        items.push(NearReadyItem {
            activation: a,
            workflow,
            deployment,
            node: act.node as u32,
            waits_for,
            prompt_bound,
            max_output_tokens: agent.max_output_tokens,
        });
    }
    items
}

/// The trace's detail of a finished tool call: its verdict, and for a failed call the cause
/// (`fail: timeout`).
pub fn tool_trace_detail(outcome: &switchyard_tools::ToolOutcome) -> Option<String> {
    match (&outcome.verdict, &outcome.failure) {
        (Some(verdict), Some(failure)) => Some(format!("{verdict}: {}", failure.cause.name())),
        (None, Some(failure)) => Some(format!("failed: {}", failure.cause.name())),
        (verdict, None) => verdict.clone(),
    }
}

/// The session's score under its workflow's metric (GSM8K exact answer, MBPP tests pass, QMSum
/// ROUGE-L F1), as the simulator's report computes it; `None` when the workflow has no metric.
pub fn session_score(session: &Session) -> Option<f64> {
    let m = session.spec().metric.as_ref()?;
    let reference = session
        .input()
        .get(&m.reference)
        .map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_default();
    Some(match (m.kind, session.final_output()) {
        (_, None) => 0.0,
        (MetricKind::Gsm8kExact, Some(o)) => responder::gsm8k_exact(o, &reference),
        (MetricKind::TestsPass, Some(o)) => responder::tests_pass(o),
        (MetricKind::RougeL, Some(o)) => responder::rouge_l_f1(&o.text, &reference),
    })
}

/// One session as a shell recorded it, for the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionRecord {
    pub session: SessionId,
    /// Index of the workflow in the run's list.
    pub workflow: u32,
    pub arrived: f64,
    pub finished: Option<f64>,
    pub failed: Option<String>,
    /// [`session_score`] at completion (`None` without a metric or when it did not complete).
    pub score: Option<f64>,
    /// What the session's tool calls reported.
    pub tools: crate::report::SessionToolLog,
}

/// Run-wide counters a shell keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Counters {
    pub llm_calls: u64,
    pub tool_calls: u64,
    pub generated_tokens: u64,
    pub prompt_tokens: u64,
    pub cached_prompt_tokens: u64,
    pub preemptions: u64,
}

/// Per-workflow token work per deployment, to attribute GPU time (paper 003 §4.3).
pub type TokenWork = BTreeMap<(DeploymentId, u32), f64>;

/// Everything [`build_report`] reads.
pub struct ReportInput<'a> {
    pub workflows: &'a [Arc<WorkflowSpec>],
    pub policy: &'a str,
    pub seed: u64,
    pub noise_seed: u64,
    pub arrival: String,
    pub pool: &'a str,
    pub gpus: usize,
    pub sessions: &'a [SessionRecord],
    /// Sessions that could not even be instantiated: (workflow, arrival, reason).
    pub start_failures: &'a [(u32, f64, String)],
    /// Per device; resident intervals still open must be given in `open_resident`.
    pub timelines: &'a mut Vec<DeviceTimeline>,
    /// Replicas still resident at the end: (device index, deployment, since).
    pub open_resident: &'a [(u32, DeploymentId, f64)],
    pub work: &'a TokenWork,
    pub counters: Counters,
    pub loads: u64,
    pub evictions: u64,
}

/// Build the run report exactly as the simulator does; returns it with its window
/// (first arrival, last completion).
pub fn build_report(input: ReportInput<'_>) -> (RunReport, (f64, f64)) {
    let runs = input.sessions;
    let t0 = runs.iter().map(|r| r.arrived).fold(f64::INFINITY, f64::min);
    let t0 = if t0.is_finite() { t0 } else { 0.0 };
    let t1 = runs.iter().filter_map(|r| r.finished).fold(t0, f64::max);
    for &(device, deployment, since) in input.open_resident {
        if let Some(tl) = input.timelines.get_mut(device as usize) {
            tl.segments.push(Segment {
                start: since,
                end: t1.max(since),
                kind: SegmentKind::Resident,
                deployment: deployment.0,
            });
        }
    }
    let mut total = GpuBreakdown::default();
    let mut by_dep: BTreeMap<Option<u32>, GpuBreakdown> = BTreeMap::new();
    for tl in input.timelines.iter() {
        for ((cat, dep), secs) in gpu::partition(&tl.segments, t0, t1) {
            let b = by_dep.entry(dep).or_default();
            let slot = match cat {
                gpu::Category::Loading => &mut b.loading,
                gpu::Category::Generation => &mut b.generation,
                gpu::Category::IdleResident => &mut b.idle_resident,
                gpu::Category::Other => &mut b.other,
            };
            *slot += secs;
        }
    }
    for b in by_dep.values() {
        total.add(b);
    }
    let nw = input.workflows.len();
    let mut dep_total: BTreeMap<u32, f64> = BTreeMap::new();
    let mut wf_total = vec![0.0; nw];
    for ((d, w), x) in input.work {
        *dep_total.entry(d.0).or_insert(0.0) += x;
        if let Some(t) = wf_total.get_mut(*w as usize) {
            *t += x;
        }
    }
    let all_work: f64 = wf_total.iter().sum();
    let mut wf_gpu = vec![GpuBreakdown::default(); nw];
    for (dep, b) in &by_dep {
        for (w, slot) in wf_gpu.iter_mut().enumerate() {
            let share = match dep {
                Some(d) => {
                    let dt = dep_total.get(d).copied().unwrap_or(0.0);
                    let x = input.work.get(&(DeploymentId(*d), w as u32)).copied().unwrap_or(0.0);
                    if dt > 0.0 { x / dt } else { 0.0 }
                }
                None => {
                    if all_work > 0.0 { wf_total[w] / all_work } else { 1.0 / nw as f64 }
                }
            };
            slot.add(&b.scaled(share));
        }
    }
    let completed: Vec<&SessionRecord> = runs.iter().filter(|r| r.finished.is_some()).collect();
    let latencies: Vec<f64> = completed.iter().filter_map(|r| r.finished.map(|f| f - r.arrived)).collect();
    let mut workflows = BTreeMap::new();
    for (w, wf) in input.workflows.iter().enumerate() {
        let mine: Vec<&SessionRecord> = runs.iter().filter(|r| r.workflow as usize == w).collect();
        let done: Vec<&&SessionRecord> = mine.iter().filter(|r| r.finished.is_some()).collect();
        let lat: Vec<f64> = done.iter().filter_map(|r| r.finished.map(|f| f - r.arrived)).collect();
        let first = mine.iter().map(|r| r.arrived).fold(f64::INFINITY, f64::min);
        let last = done.iter().filter_map(|r| r.finished).fold(f64::NEG_INFINITY, f64::max);
        let accuracy = wf.metric.as_ref().map(|_| {
            let scores: Vec<f64> = done.iter().map(|r| r.score.unwrap_or(0.0)).collect();
            if scores.is_empty() { 0.0 } else { round3(scores.iter().sum::<f64>() / scores.len() as f64) }
        });
        let n = done.len().max(1) as f64;
        workflows.insert(wf.name.clone(), WorkflowReport {
            sessions_completed: done.len(),
            sessions_failed: mine.len() - done.len()
                + input.start_failures.iter().filter(|f| f.0 as usize == w).count(),
            makespan_s: if last.is_finite() && first.is_finite() { round3(last - first) } else { 0.0 },
            latency_s: Percentiles::of(&lat),
            gpu_seconds_per_session: wf_gpu[w].scaled(1.0 / n).rounded(),
            accuracy,
            metric: wf.metric.as_ref().map(|m| format!("{:?}", m.kind)),
        });
    }
    let failures: Vec<String> = runs
        .iter()
        .filter_map(|r| r.failed.as_ref().map(|f| format!("{}: {f}", r.session)))
        .chain(input.start_failures.iter().map(|f| f.2.clone()))
        .take(20)
        .collect();
    let n_done = completed.len();
    let c = input.counters;
    let report = RunReport {
        policy: input.policy.to_string(),
        seed: input.seed,
        noise_seed: input.noise_seed,
        arrival: input.arrival,
        pool: input.pool.to_string(),
        gpus: input.gpus,
        sessions_total: runs.len() + input.start_failures.len(),
        sessions_completed: n_done,
        sessions_failed: runs.len() - n_done + input.start_failures.len(),
        makespan_s: round3(t1 - t0),
        latency_s: Percentiles::of(&latencies),
        gpu_seconds_per_session: total.scaled(1.0 / n_done.max(1) as f64).rounded(),
        gpu_seconds_total: total.rounded(),
        loads: input.loads,
        evictions: input.evictions,
        llm_calls: c.llm_calls,
        tool_calls: c.tool_calls,
        generated_tokens: c.generated_tokens,
        prompt_tokens: c.prompt_tokens,
        cached_prompt_tokens: c.cached_prompt_tokens,
        preemptions: c.preemptions,
        workflows,
        failures,
        tools: crate::report::ToolReport::collect(runs.iter().map(|r| (r.session.0, &r.tools))),
    };
    (report, (t0, t1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::load_workflow;
    use std::path::Path;

    fn workflows() -> Vec<Arc<WorkflowSpec>> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows");
        ["gsm8k.yaml", "mbpp.yaml", "qmsum.yaml"]
            .iter()
            .map(|f| Arc::new(load_workflow(&root.join(f)).expect("bundled workflow")))
            .collect()
    }

    #[test]
    fn identical_deployments_share_one_identity() {
        let wfs = workflows();
        let (table, of) = deployment_table(&wfs, 8).unwrap();
        // Every (workflow, deployment name) maps to an identity of the table, and identities are
        // unique per (model, dtype).
        let keys: BTreeSet<(String, Dtype)> = table.iter().map(|d| (d.model.clone(), d.dtype)).collect();
        assert_eq!(keys.len(), table.len());
        for (w, wf) in wfs.iter().enumerate() {
            for name in wf.deployments.keys() {
                let id = of[&(w as u32, name.clone())];
                assert!(table[id.0 as usize].max_model_len >= wf.deployments[name].max_context);
            }
        }
    }

    #[test]
    fn prepare_is_a_function_of_the_seed() {
        let wfs = workflows();
        let (table, of) = deployment_table(&wfs, 8).unwrap();
        let info = node_infos(&wfs, &of);
        let records = load_records(&wfs).unwrap();
        let ctx = PrepareContext { seed: 7, deployments: &table, deployment_of: &of, node_info: &info };
        let run = |seed: u64| {
            let ctx = PrepareContext { seed, ..ctx };
            let mut s = Session::new(SessionId(3), Arc::clone(&wfs[0]), records[0][0].clone()).unwrap();
            let a = s.ready()[0];
            match prepare(&ctx, &mut s, 0, a, 1.5).unwrap() {
                Ready::Llm { item, prepared, .. } => (item, prepared),
                _ => panic!("gsm8k starts with an agent"),
            }
        };
        let (i1, p1) = run(7);
        let (i2, p2) = run(7);
        assert_eq!((&i1, &p1), (&i2, &p2));
        // Segment-wise BPE (as the simulator counts) is within a few tokens of the whole text's.
        let whole = tokens::count(&p1.prompt) as i64;
        assert!((i64::from(i1.prompt_tokens) - whole).abs() <= whole / 10 + 1, "{} vs {whole}", i1.prompt_tokens);
        assert_eq!(i1.ready_at, 1.5);
        let mut other_outputs = 0;
        for seed in 8..16 {
            if run(seed).1.output != p1.output {
                other_outputs += 1;
            }
        }
        assert!(other_outputs > 0, "the responder output must depend on the seed");
    }

    #[test]
    fn report_counts_and_accuracy_follow_the_records() {
        let wfs = workflows();
        let sessions = vec![
            SessionRecord { session: SessionId(0), workflow: 0, arrived: 0.0, finished: Some(4.0), failed: None, score: Some(1.0), tools: Default::default() },
            SessionRecord { session: SessionId(1), workflow: 0, arrived: 1.0, finished: Some(3.0), failed: None, score: Some(0.0), tools: Default::default() },
            SessionRecord { session: SessionId(2), workflow: 1, arrived: 0.0, finished: None, failed: Some("boom".into()), score: None, tools: Default::default() },
        ];
        let mut timelines = vec![DeviceTimeline { name: "A40".into(), segments: vec![] }];
        let (r, window) = build_report(ReportInput {
            workflows: &wfs,
            policy: "joint",
            seed: 1,
            noise_seed: 0,
            arrival: "burst".into(),
            pool: "p",
            gpus: 1,
            sessions: &sessions,
            start_failures: &[],
            timelines: &mut timelines,
            open_resident: &[(0, DeploymentId(0), 1.0)],
            work: &TokenWork::new(),
            counters: Counters { llm_calls: 5, ..Counters::default() },
            loads: 1,
            evictions: 0,
        });
        assert_eq!(window, (0.0, 4.0));
        assert_eq!((r.sessions_total, r.sessions_completed, r.sessions_failed), (3, 2, 1));
        assert_eq!(r.makespan_s, 4.0);
        assert_eq!(r.workflows[&wfs[0].name].accuracy, Some(0.5));
        assert_eq!(r.failures, vec!["s2: boom".to_string()]);
        // One GPU over a 4 s window: 3 s resident (idle) + 1 s other.
        assert!((r.gpu_seconds_total.total() - 4.0).abs() < 1e-9);
        assert!((r.gpu_seconds_total.idle_resident - 3.0).abs() < 1e-9);
    }
}
