//! What both shells need to run routed workflows (paper 002, ORACLE; the decisions are the
//! planner core's, `planner::routing`): the router's setup from the run's workflows and
//! datasets, a session's first request (what the router embeds), its route as deployment
//! identities, and its verdict under the verifier the router selected.
//!
//! - **Verifiers** are the workflows' metric kinds (`gsm8k_exact`, `tests_pass`, `rouge_l`,
//!   `verdict`), or a workflow's own `verifier:` term — [`LLM_JUDGE`] when it reads an agent
//!   node's verdict: an LLM judge, a model call the planner schedules like any other; the
//!   router's classifier learns them from [`EXEMPLARS_PER_VERIFIER`] exemplar
//!   requests of each workflow in the run that has a one-term metric (Appendix B.3's k = 5): the
//!   rendered first prompt of its first records.
//! - **The request** a program is classified and routed by is its first agent prompt, rendered
//!   from its input exactly as the engine will receive it (never the dataset's reference
//!   fields, which would leak the answer into the routing features).
//! - **The verdict** lands when the session ends: the selected verifier applied to the
//!   session's result. The right verifier confirms success by the workflow's own metric (ROUGE-L
//!   at least [`ROUGE_SUCCESS`]); a verifier of another task type cannot, so it reports failure
//!   — the cost of a wrong classification is wrong feedback, as with a single verifier in §5.
//! - **Cost** is compute ([`call_cost`]: billions of parameter-tokens, summed over the program's
//!   calls); the reward is success − a·cost/scale ([`RoutingConfig`]; a = 0 by default).
//!
//! Depends on the workflow model, sessions and `planner::routing`; never on `sim` or `live`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::ids::SessionId;
use crate::planner::routing::{RouterOptions, RoutingSetup};
use crate::planner::{DeploymentId, DeploymentInfo, Planner};
use crate::report::RouteStats;
use crate::session::Session;
use crate::values::Record;
use crate::workflow::{MetricKind, NodeKind, WorkflowSpec};

use super::{DeploymentMap, PoolSpec, ShellError};

/// Exemplar requests per verifier (Appendix B.3: k = 5).
pub const EXEMPLARS_PER_VERIFIER: usize = 5;

/// A QMSum-style answer counts as a success at this ROUGE-L F1 (assumption: the shipped QMSum
/// answers score 0.10–0.20 on average in the emulator; 0.2 separates the better ones). The
/// emulated QMSum judge uses the same threshold.
pub const ROUGE_SUCCESS: f64 = crate::responder::judge::QMSUM_PASS;

/// The ledgers' prior peak context c₀ (tokens; five pseudo-observations, then the finished
/// programs' peaks take over) and prior program run time D₀ (seconds).
pub const PRIOR_PEAK_TOKENS: f64 = 2_048.0;
pub const PRIOR_RUN_S: f64 = 60.0;

/// How a run routes its routed workflows.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingConfig {
    /// The reward's cost weight a (Appendix B.4: r = success − a·cost/scale); 0 = success only.
    pub cost_weight: f64,
    /// The reward's cost scale, in [`call_cost`]'s units (the paper: the stream's mean cost per
    /// task of its largest model); used only when `cost_weight` > 0.
    pub cost_scale: f64,
    /// §5.3's single-verifier feedback: every program's verdict comes from this verifier,
    /// whatever its task type (the classifier still infers the type for the learner's context,
    /// as the family one-hot of Appendix B.4). `None`: adaptive verification, the verifier
    /// the classifier selects.
    pub single_verifier: Option<String>,
    /// DISC may move a program to another member of its route by the divert rule (off: admission
    /// only, the ablation of Fig. 7(a)).
    pub reassign: bool,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        RoutingConfig { cost_weight: 0.0, cost_scale: 1.0, single_verifier: None, reassign: true }
    }
}

/// The compute cost of one LLM call in billions of parameter-tokens: the tokens the engine
/// computed (the prompt less its cached prefix, plus the output) × the model's parameters. A
/// forward pass costs ≈ 2·N FLOPs per token (Kaplan et al. 2020), so this is proportional to
/// the call's compute on any device — the price of a model on a private pool, where no API
/// price list applies. 0 for a model outside the catalogue.
pub fn call_cost(model: &str, prompt_tokens: u32, cached_prompt_tokens: u32, output_tokens: u32) -> f64 {
    let Ok(arch) = switchyard_predictor::spec::model(model) else { return 0.0 };
    let tokens = f64::from(prompt_tokens.saturating_sub(cached_prompt_tokens)) + f64::from(output_tokens);
    tokens * arch.param_count() as f64 / 1e9
}

/// The verifier name of a metric kind.
pub fn verifier_name(kind: MetricKind) -> &'static str {
    kind.name()
}

/// The verifier name of an LLM judge: a workflow's `verifier:` term that reads an agent's
/// verdict (paper 002's LLM-as-a-judge; the judge is a node, a model call scheduled like any
/// other).
pub const LLM_JUDGE: &str = "llm_judge";

/// The verifier a workflow's sessions are judged by: its `verifier:` term when it declares one
/// ([`LLM_JUDGE`] when that reads an agent's verdict), else its metric's kind when the metric
/// has one term.
pub fn workflow_verifier(spec: &WorkflowSpec) -> Option<&'static str> {
    if let Some(term) = &spec.verifier {
        let on_agent = term
            .nodes
            .iter()
            .filter_map(|n| spec.node_index(n).and_then(|i| spec.nodes.get(i)))
            .any(|n| matches!(n.kind, NodeKind::Agent(_)));
        return Some(if term.kind == MetricKind::Verdict && on_agent { LLM_JUDGE } else { verifier_name(term.kind) });
    }
    match spec.metric.as_ref()?.terms.as_slice() {
        [one] => Some(verifier_name(one.kind)),
        _ => None,
    }
}

/// The route of workflow `w` as deployment identities, if it is routed.
pub fn route_of(
    w: u32,
    spec: &WorkflowSpec,
    deployment_of: &DeploymentMap,
) -> Result<Option<Vec<DeploymentId>>, ShellError> {
    let Some(route) = spec.route() else { return Ok(None) };
    route
        .iter()
        .map(|name| {
            deployment_of.get(&(w, name.clone())).copied().ok_or_else(|| {
                ShellError::Internal(format!("route member `{name}` of `{}` has no deployment", spec.name))
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The route member (deployment name of workflow `w`) that deployment `d` is.
pub fn member_name(w: u32, spec: &WorkflowSpec, deployment_of: &DeploymentMap, d: DeploymentId) -> Option<String> {
    spec.route()?.iter().find(|name| deployment_of.get(&(w, (*name).clone())) == Some(&d)).cloned()
}

/// A program's first request: the first ready agent activation's prompt, rendered from the
/// session's input (empty when the session starts with a tool).
pub fn first_request(session: &Session) -> String {
    session
        .ready()
        .into_iter()
        .filter(|a| session.node_of(a.index).is_some_and(|n| matches!(n.kind, NodeKind::Agent(_))))
        .find_map(|a| session.render_prompt(a.index).ok())
        .map(|segments| segments.concat())
        .unwrap_or_default()
}

/// The router's setup for a run, `None` when no workflow is routed. Arms: every deployment in
/// some route; capacity: the KV tokens one replica of it holds on the pool's largest device;
/// exemplars: [`EXEMPLARS_PER_VERIFIER`] first requests of each workflow with a verifier.
pub fn routing_setup(
    workflows: &[Arc<WorkflowSpec>],
    records: &[Arc<Vec<Record>>],
    deployments: &[DeploymentInfo],
    deployment_of: &DeploymentMap,
    pool: &PoolSpec,
    config: &RoutingConfig,
) -> Result<Option<RoutingSetup>, ShellError> {
    let mut arms: Vec<DeploymentId> = Vec::new();
    for (w, spec) in workflows.iter().enumerate() {
        for d in route_of(w as u32, spec, deployment_of)?.unwrap_or_default() {
            if !arms.contains(&d) {
                arms.push(d);
            }
        }
    }
    if arms.is_empty() {
        return Ok(None);
    }
    arms.sort();
    let largest = pool.devices.iter().map(|d| d.memory_bytes).max().unwrap_or(0);
    let mut capacity_tokens = Vec::with_capacity(arms.len());
    for d in &arms {
        let info = deployments.get(d.0 as usize).ok_or_else(|| ShellError::Internal(format!("no deployment {d:?}")))?;
        let budget = info.gpu_memory_utilization * largest as f64 - info.weight_bytes as f64;
        capacity_tokens.push((budget / info.kv_bytes_per_token.max(1) as f64).max(1.0) as u64);
    }
    let mut exemplars = Vec::new();
    for (w, spec) in workflows.iter().enumerate() {
        let Some(verifier) = workflow_verifier(spec) else { continue };
        let recs = records.get(w).map(|r| r.as_slice()).unwrap_or_default();
        let mut texts: Vec<String> = Vec::new();
        for record in recs {
            if texts.len() == EXEMPLARS_PER_VERIFIER {
                break;
            }
            let Ok(session) = Session::new(SessionId(0), Arc::clone(spec), record.clone()) else { continue };
            let text = first_request(&session);
            if !text.is_empty() && !texts.contains(&text) {
                texts.push(text);
            }
        }
        for text in texts {
            // One request text cannot teach the classifier two verifiers: it would confirm one
            // workflow's programs with the other's verifier (e.g. a judged and an exact-answer
            // routing of the same solver in one run).
            if let Some((other, _)) = exemplars.iter().find(|(v, t)| *t == text && v != verifier) {
                return Err(ShellError::Workflow {
                    workflow: spec.name.clone(),
                    message: format!(
                        "{}: metric: its first request is also that of a workflow verified by `{other}` in this run; the router cannot tell which verifier (`{verifier}` or `{other}`) a program needs — run them apart",
                        spec.path.display()
                    ),
                });
            }
            exemplars.push((verifier.to_string(), text));
        }
    }
    if exemplars.is_empty() {
        let routed = workflows.iter().find(|w| w.route().is_some());
        return Err(ShellError::Workflow {
            workflow: routed.map(|w| w.name.clone()).unwrap_or_default(),
            message: format!(
                "{}: metric: a routed run needs at least one workflow with a one-term metric (its verifier) and a dataset",
                routed.map(|w| w.path.display().to_string()).unwrap_or_default()
            ),
        });
    }
    let prior_peak_tokens = vec![PRIOR_PEAK_TOKENS; arms.len()];
    Ok(Some(RoutingSetup {
        arms,
        capacity_tokens,
        prior_peak_tokens,
        prior_run_s: PRIOR_RUN_S,
        exemplars,
        options: RouterOptions {
            cost_weight: config.cost_weight,
            cost_scale: config.cost_scale,
            reassign: config.reassign,
            ..RouterOptions::default()
        },
    }))
}

/// A routed session's row, kept by a shell: the workflow, the model it was bound to, whether
/// DISC diverted it or its ledger gated it, the verifier the classifier selected, its verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteRow {
    pub workflow: u32,
    pub model: String,
    pub diverted: bool,
    pub gated: bool,
    pub verifier: String,
    /// The verifier whose verdict teaches the learner: `verifier`, or the run's single
    /// verifier ([`RoutingConfig::single_verifier`]).
    pub feedback: String,
    /// The program's compute cost so far ([`call_cost`] summed over its calls).
    pub cost: f64,
    /// Its score under the workflow's own `verifier:` term, set by the simulator when it
    /// completes (`exec::verifier_score`; `None` when the metric is the verifier; the live shell
    /// reads it from the session's result instead).
    pub verifier_score: Option<f64>,
}

/// A routed program as its run closed it (kept by the simulator for offline replays of the
/// router's learner, `bench::oracle_replay`): the task it was bound by, the model it ran on, its
/// compute cost.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramRecord {
    pub session: u32,
    pub workflow: u32,
    /// Its first request ([`first_request`]): what the router embedded.
    pub task: String,
    pub model: String,
    /// [`call_cost`] summed over its calls.
    pub cost: f64,
    /// Its score under the workflow's `verifier:` term, when it declares one and it completed.
    pub verifier_score: Option<f64>,
}

/// Bound workflows, one per (workflow, route member), made once and shared by the sessions.
pub type BoundSpecs = BTreeMap<(u32, String), Arc<WorkflowSpec>>;

/// The run's facts [`bind_session`] reads.
pub struct BindContext<'a> {
    pub deployment_of: &'a DeploymentMap,
    pub deployments: &'a [DeploymentInfo],
    pub config: &'a RoutingConfig,
}

/// A new session of workflow `w`: when the workflow is routed, the planner's router binds it
/// by its first request and the session is remade on the workflow bound to the chosen member
/// (its row returned); otherwise it is returned as it is. `keep`: a deployment the session was
/// bound to before (a durable session resumed after a restart, its binding journaled): when it
/// is a member of the route the session is bound to it again (the learner records it as its
/// decision); otherwise the router chooses.
pub fn bind_session(
    planner: &mut Planner,
    ctx: &BindContext<'_>,
    bound: &mut BoundSpecs,
    w: u32,
    session: Session,
    keep: Option<DeploymentId>,
    now: f64,
) -> Result<(Session, Option<RouteRow>), ShellError> {
    let BindContext { deployment_of, deployments, config } = *ctx;
    let spec = Arc::clone(session.spec());
    let Some(route) = route_of(w, &spec, deployment_of)? else { return Ok((session, None)) };
    let id = session.id();
    let request = first_request(&session);
    let tokens = crate::tokens::count_chat(&request) as u64;
    let record = match keep.filter(|d| route.contains(d)) {
        Some(d) => planner.bind_program_to(id, d, &request, tokens, now)?,
        None => planner.bind_program(id, &route, &request, tokens, now)?,
    };
    // From here an error must release the binding (its ledger place would block the model).
    let release = |planner: &mut Planner, e: ShellError| {
        let _ = planner.program_abandoned(id, now);
        e
    };
    let Some(member) = member_name(w, &spec, deployment_of, record.deployment) else {
        return Err(release(
            planner,
            ShellError::Internal(format!("{id}: bound to {:?}, outside its route", record.deployment)),
        ));
    };
    let row = RouteRow {
        workflow: w,
        model: deployments.get(record.deployment.0 as usize).map(|d| d.model.clone()).unwrap_or_default(),
        diverted: record.deployment != record.chosen,
        gated: planner.state().is_gated(id),
        feedback: config.single_verifier.clone().unwrap_or_else(|| record.verifier.clone()),
        cost: 0.0,
        verifier: record.verifier,
        verifier_score: None,
    };
    let spec_bound = Arc::clone(bound.entry((w, member.clone())).or_insert_with(|| Arc::new(spec.bound_to(&member))));
    let input = session.input().clone();
    let session = match Session::new(id, spec_bound, input) {
        Ok(s) => s,
        Err(e) => return Err(release(planner, ShellError::Internal(format!("{id}: the bound workflow: {e}")))),
    };
    Ok((session, Some(row)))
}

/// A shell's book of routed sessions: each row while its session is open, folded into the
/// per-(workflow, model) counts when it closes — so a long-running server keeps only the rows
/// of the sessions in flight.
#[derive(Debug, Clone, Default)]
pub struct RouteBook {
    open: BTreeMap<SessionId, RouteRow>,
    closed: BTreeMap<(u32, String), RouteStats>,
}

impl RouteBook {
    pub fn open(&mut self, id: SessionId, row: RouteRow) {
        self.open.insert(id, row);
    }

    pub fn get(&self, id: SessionId) -> Option<&RouteRow> {
        self.open.get(&id)
    }

    pub fn contains(&self, id: SessionId) -> bool {
        self.open.contains_key(&id)
    }

    /// Record the completed session `id`'s score under its workflow's `verifier:` term.
    pub fn set_verifier_score(&mut self, id: SessionId, score: Option<f64>) {
        if let Some(row) = self.open.get_mut(&id) {
            row.verifier_score = score;
        }
    }

    /// Charge a finished call of session `id` (a no-op for a session that is not routed).
    pub fn charge(
        &mut self,
        id: SessionId,
        model: &str,
        prompt_tokens: u32,
        cached_prompt_tokens: u32,
        output_tokens: u32,
    ) {
        if let Some(row) = self.open.get_mut(&id) {
            row.cost += call_cost(model, prompt_tokens, cached_prompt_tokens, output_tokens);
        }
    }

    /// Close session `id`'s row with its verdict (`None`: it failed, never verified), counting
    /// it for its workflow (whose verifier is `own_verifier`) and model.
    pub fn close(&mut self, id: SessionId, verdict: Option<f64>, own_verifier: Option<&str>) {
        let Some(row) = self.open.remove(&id) else { return };
        let st = self.closed.entry((row.workflow, row.model.clone())).or_default();
        count(st, &row, own_verifier);
        if let Some(v) = verdict {
            st.verdicts += 1;
            st.successes += u64::from(v >= 1.0);
        }
    }

    /// The report's routing section: per workflow name and model, closed rows and open ones.
    pub fn report(&self, workflows: &[Arc<WorkflowSpec>]) -> BTreeMap<String, BTreeMap<String, RouteStats>> {
        let name = |w: u32| workflows.get(w as usize).map(|s| s.name.clone());
        let mut out: BTreeMap<String, BTreeMap<String, RouteStats>> = BTreeMap::new();
        for ((w, model), st) in &self.closed {
            let Some(n) = name(*w) else { continue };
            let slot = out.entry(n).or_default().entry(model.clone()).or_default();
            add(slot, st);
        }
        for row in self.open.values() {
            let Some(spec) = workflows.get(row.workflow as usize) else { continue };
            let slot = out.entry(spec.name.clone()).or_default().entry(row.model.clone()).or_default();
            count(slot, row, workflow_verifier(spec));
        }
        out
    }
}

fn count(st: &mut RouteStats, row: &RouteRow, own_verifier: Option<&str>) {
    st.programs += 1;
    st.cost += row.cost;
    st.diverted += u64::from(row.diverted);
    st.gated += u64::from(row.gated);
    st.right_verifier += u64::from(own_verifier == Some(row.feedback.as_str()));
}

fn add(to: &mut RouteStats, st: &RouteStats) {
    to.programs += st.programs;
    to.cost += st.cost;
    to.diverted += st.diverted;
    to.gated += st.gated;
    to.verdicts += st.verdicts;
    to.successes += st.successes;
    to.right_verifier += st.right_verifier;
}

/// A completed session's score under its workflow's verifier: its `verifier:` term's score
/// (`verifier_score`, from `exec::verifier_score`) when the workflow declares one — `None`
/// then when it is missing, never the metric's in its place — else its metric's (`score`).
pub fn verifier_input(spec: &WorkflowSpec, score: Option<f64>, verifier_score: Option<f64>) -> Option<f64> {
    if spec.verifier.is_some() { verifier_score } else { score }
}

/// The verdict of a finished routed session under verifier `verifier`: 1.0 when it is the
/// workflow's own verifier and the session's score passes it, else 0.0. `score` is the
/// session's score under that verifier: its `verifier:` term's when the workflow declares one
/// (`exec::verifier_score`), else its metric's.
pub fn verdict(spec: &WorkflowSpec, score: Option<f64>, verifier: &str) -> f64 {
    if workflow_verifier(spec) != Some(verifier) {
        return 0.0;
    }
    let score = score.unwrap_or(0.0);
    let pass = if verifier == verifier_name(MetricKind::RougeL) { score >= ROUGE_SUCCESS } else { score >= 1.0 - 1e-9 };
    if pass { 1.0 } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::tests::bundled_workflows;

    #[test]
    fn the_setup_takes_the_routed_members_and_the_runs_reward_and_divert_settings() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let routed = Arc::new(crate::workflow::load_workflow(&root.join("workflows/gsm8k-routed.yaml")).unwrap());
        let wfs = vec![routed, bundled_workflows()[1].clone()];
        let records = crate::exec::load_records(&wfs).unwrap();
        let (deployments, of) = crate::exec::deployment_table(&wfs, 256).unwrap();
        let pool = PoolSpec::load(&root.join("workflows/pools/paper.yaml")).unwrap();
        let config = RoutingConfig { cost_weight: 0.5, cost_scale: 300.0, single_verifier: None, reassign: false };
        let setup = routing_setup(&wfs, &records, &deployments, &of, &pool, &config).unwrap().unwrap();
        assert_eq!(setup.arms, route_of(0, &wfs[0], &of).unwrap().unwrap(), "the arms are the route's members");
        assert!(setup.capacity_tokens.iter().all(|&c| c > 10_000), "{:?}", setup.capacity_tokens);
        assert_eq!((setup.options.cost_weight, setup.options.cost_scale, setup.options.reassign), (0.5, 300.0, false));
        let verifiers: std::collections::BTreeSet<&str> = setup.exemplars.iter().map(|(v, _)| v.as_str()).collect();
        assert_eq!(
            verifiers,
            ["gsm8k_exact", "tests_pass"].into_iter().collect(),
            "a verifier per workflow with a metric"
        );
        assert_eq!(setup.exemplars.len(), 2 * EXEMPLARS_PER_VERIFIER);
        // No routed workflow: no router.
        assert!(routing_setup(&wfs[1..], &records[1..], &deployments, &of, &pool, &config).unwrap().is_none());
    }

    #[test]
    fn a_calls_compute_cost_is_its_computed_tokens_times_the_parameters() {
        let params = |m: &str| switchyard_predictor::spec::model(m).unwrap().param_count() as f64 / 1e9;
        // 1,000 prompt tokens of which 600 cached, 50 out: 450 tokens computed.
        assert!((call_cost("Qwen3-8B", 1_000, 600, 50) - 450.0 * params("Qwen3-8B")).abs() < 1e-9);
        let ratio = call_cost("Qwen3-8B", 100, 0, 100) / call_cost("Qwen3-0.6B", 100, 0, 100);
        assert!((ratio - params("Qwen3-8B") / params("Qwen3-0.6B")).abs() < 1e-9 && ratio > 5.0, "{ratio}");
        assert_eq!(call_cost("no-such-model", 100, 0, 100), 0.0);
        let mut book = RouteBook::default();
        let row = RouteRow {
            workflow: 0,
            model: "Qwen3-8B".into(),
            diverted: false,
            gated: false,
            verifier: "v".into(),
            feedback: "v".into(),
            cost: 0.0,
            verifier_score: None,
        };
        book.open(SessionId(1), row);
        book.charge(SessionId(1), "Qwen3-8B", 10, 0, 10);
        book.charge(SessionId(2), "Qwen3-8B", 10, 0, 10);
        assert!(
            (book.get(SessionId(1)).unwrap().cost - call_cost("Qwen3-8B", 10, 0, 10)).abs() < 1e-12,
            "only the routed session pays"
        );
        book.close(SessionId(1), Some(1.0), Some("v"));
        book.charge(SessionId(1), "Qwen3-8B", 10, 0, 10);
        let wfs = bundled_workflows();
        let report = book.report(&wfs);
        let st = report[&wfs[0].name]["Qwen3-8B"];
        assert_eq!((st.programs, st.verdicts, st.successes, st.right_verifier), (1, 1, 1, 1));
        assert!((st.cost - call_cost("Qwen3-8B", 10, 0, 10)).abs() < 1e-12, "a charge after the close is not counted");
    }

    #[test]
    fn an_llm_judges_verdict_teaches_the_router_and_the_metric_still_scores_the_answer() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let spec = Arc::new(crate::workflow::load_workflow(&root.join("workflows/gsm8k-judged.yaml")).unwrap());
        assert_eq!(workflow_verifier(&spec), Some(LLM_JUDGE));
        let records = crate::exec::load_records(std::slice::from_ref(&spec)).unwrap();
        let record = records[0][0].clone();
        let answer = record["answer"].as_str().unwrap().to_string();
        // The solver answers right; the judge (wrongly) rejects it, then (rightly) accepts it.
        for (judge_says, taught) in [("false", 0.0), ("true", 1.0)] {
            let mut session = Session::new(SessionId(0), Arc::clone(&spec), record.clone()).unwrap();
            let solve = session.ready()[0].index;
            session.mark_running(solve).unwrap();
            let right = crate::values::NodeOutput { text: answer.clone(), ..Default::default() };
            let next = session.complete(solve, right).unwrap();
            assert_eq!(next.len(), 1, "the judge runs after the solver, as a call of its own");
            let judge = next[0].index;
            session.mark_running(judge).unwrap();
            let verdict_out = crate::values::NodeOutput {
                text: format!("{{\"correct\": {judge_says}, \"reason\": \"checked\"}}"),
                verdict: Some(judge_says.into()),
                ..Default::default()
            };
            session.complete(judge, verdict_out).unwrap();
            assert!(session.is_finished());
            assert_eq!(crate::exec::session_score(&session), Some(1.0), "the metric scores the answer itself");
            let judged = crate::exec::verifier_score(&session);
            assert_eq!(judged, Some(taught));
            assert_eq!(verdict(&spec, judged, LLM_JUDGE), taught, "the learner is taught the judge's verdict");
            assert_eq!(verdict(&spec, judged, "gsm8k_exact"), 0.0, "another verifier cannot confirm");
        }
        // A judged and an exact-answer routing of the same solver cannot share a run: their
        // first requests are the same text, and the classifier could not tell their verifiers.
        let exact = Arc::new(crate::workflow::load_workflow(&root.join("workflows/gsm8k-routed.yaml")).unwrap());
        let both = vec![exact, Arc::clone(&spec)];
        let records = crate::exec::load_records(&both).unwrap();
        let (deployments, of) = crate::exec::deployment_table(&both, 256).unwrap();
        let pool = PoolSpec::load(&root.join("workflows/pools/paper.yaml")).unwrap();
        let e = routing_setup(&both, &records, &deployments, &of, &pool, &RoutingConfig::default()).unwrap_err();
        assert!(e.to_string().contains("cannot tell which verifier"), "{e}");
        // Without a `verifier:` term the metric is the verifier and nothing else is scored.
        let plain = bundled_workflows().into_iter().find(|w| w.name == "gsm8k").unwrap();
        let session = Session::new(SessionId(0), plain, records[1][0].clone()).unwrap();
        assert_eq!(crate::exec::verifier_score(&session), None);
    }

    #[test]
    fn exemplars_are_first_requests_and_verdicts_need_the_right_verifier() {
        let wfs = bundled_workflows();
        let gsm8k = wfs.iter().find(|w| w.name == "gsm8k").unwrap();
        assert_eq!(workflow_verifier(gsm8k), Some("gsm8k_exact"));
        assert_eq!(verdict(gsm8k, Some(1.0), "gsm8k_exact"), 1.0);
        assert_eq!(verdict(gsm8k, Some(0.0), "gsm8k_exact"), 0.0);
        assert_eq!(verdict(gsm8k, Some(1.0), "rouge_l"), 0.0, "a verifier of another task type cannot confirm");
        let qmsum = wfs.iter().find(|w| w.name == "qmsum").unwrap();
        assert_eq!(verdict(qmsum, Some(0.25), "rouge_l"), 1.0);
        assert_eq!(verdict(qmsum, Some(0.15), "rouge_l"), 0.0);
        let records = crate::exec::load_records(&wfs).unwrap();
        let session = Session::new(SessionId(0), Arc::clone(gsm8k), records[0][0].clone()).unwrap();
        let request = first_request(&session);
        let question = records[0][0]["question"].as_str().unwrap();
        assert!(request.contains(question), "the first request is the rendered prompt");
        let answer = records[0][0]["answer"].as_str().unwrap();
        let number = answer.rsplit("####").next().unwrap().trim();
        assert!(!request.contains(&format!("#### {number}")), "and never the reference's answer");
        assert!(answer.lines().count() > 1 && !request.contains(answer.lines().next().unwrap()), "nor its reasoning");
    }
}
