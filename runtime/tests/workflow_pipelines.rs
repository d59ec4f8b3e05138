//! The shipped pipelines run end to end through the session model over their real datasets,
//! with worst-case outputs (every agent writes its full output limit, every test fails): every
//! prompt fits its deployment's context, tool inputs have the types the tools expect, and the
//! graphs have the shape paper 003 §4.1 describes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use switchyard_runtime::ids::SessionId;
use switchyard_runtime::session::Session;
use switchyard_runtime::tokens;
use switchyard_runtime::values::NodeOutput;
use switchyard_runtime::workflow::{MetricKind, NodeKind, WorkflowSpec, load_workflow};

fn shipped(name: &str) -> Arc<WorkflowSpec> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../workflows")
        .join(name);
    Arc::new(load_workflow(&path).unwrap_or_else(|e| panic!("{e}")))
}

/// A text of exactly `n` tokens.
fn text_of(n: usize) -> String {
    let t = tokens::truncate(&" word".repeat(n + 8), n);
    assert_eq!(tokens::count(&t), n);
    t
}

/// The longest answer a node gives in practice: the 99.9th percentile of its answer-length
/// distribution (log-normal, see `LengthDist::sample`), within its output limit. The reasoning
/// trace of a thinking node is not part of the answer, so it never reaches a successor's
/// prompt; the limit caps trace and answer together.
fn worst_answer_tokens(a: &switchyard_runtime::workflow::AgentNode) -> u32 {
    let d = a.output_tokens;
    let sigma2 = (1.0 + d.cv * d.cv).ln();
    let mu = d.mean.ln() - sigma2 / 2.0;
    let p999 = (mu + 3.09 * sigma2.sqrt()).exp().ceil();
    (p999 as u32).clamp(13, a.max_output_tokens)
}

/// Drive one session to the end with worst-case outputs; returns the largest
/// `prompt tokens + max_output_tokens - max_context` margin seen (≤ 0 means it fits) and the
/// number of activations.
fn drive_worst_case(
    spec: &Arc<WorkflowSpec>,
    index: usize,
    record: switchyard_runtime::values::Record,
) -> (i64, usize) {
    let mut s = Session::new(SessionId(index as u32), Arc::clone(spec), record)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut worst = i64::MIN;
    let mut steps = 0;
    while let Some(id) = s.ready().first().copied() {
        steps += 1;
        assert!(steps < 100, "session does not finish");
        s.mark_running(id.index).unwrap_or_else(|e| panic!("{e}"));
        let node = s
            .node_of(id.index)
            .cloned()
            .unwrap_or_else(|| panic!("no node"));
        let out = match &node.kind {
            NodeKind::Agent(a) => {
                let segments = s
                    .render_prompt(id.index)
                    .unwrap_or_else(|e| panic!("{e}"));
                let dep = &spec.deployments[&a.deployment];
                // As the runtime counts a call's prompt: in Qwen3's chat template.
                let prompt_tokens = tokens::encode_chat(&segments).len();
                let need = prompt_tokens as i64 + i64::from(a.max_output_tokens);
                worst = worst.max(need - i64::from(dep.max_context));
                let body = text_of(worst_answer_tokens(a) as usize - 12);
                NodeOutput {
                    text: format!("```python\n{body}\n```"),
                    output_tokens: a.max_output_tokens,
                    ..Default::default()
                }
            }
            NodeKind::Tool(t) => {
                let inputs = s
                    .render_tool_inputs(id.index)
                    .unwrap_or_else(|e| panic!("{e}"));
                check_tool_inputs(&t.tool, &inputs);
                let verdict = if t.tool == "python_tests" {
                    "fail"
                } else {
                    "majority"
                };
                NodeOutput {
                    text: "0/1 tests passed; first failure: assert f(1) == 2 -> AssertionError"
                        .into(),
                    verdict: Some(verdict.into()),
                    ..Default::default()
                }
            }
        };
        s.complete(id.index, out).unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(s.is_finished(), "session {index} stuck");
    assert!(s.final_output().is_some());
    (worst, s.activations().len())
}

fn check_tool_inputs(tool: &str, inputs: &BTreeMap<String, serde_json::Value>) {
    match tool {
        "python_tests" => {
            assert!(inputs["code"].is_string());
            let tests = inputs["tests"]
                .as_array()
                .unwrap_or_else(|| panic!("tests is not a list"));
            assert!(
                !tests.is_empty()
                    && tests
                        .iter()
                        .all(|t| t.as_str().is_some_and(|s| s.starts_with("assert")))
            );
            assert!(inputs["imports"].is_array());
        }
        "majority_vote" => {
            let c = inputs["candidates"]
                .as_array()
                .unwrap_or_else(|| panic!("candidates is not a list"));
            assert_eq!(c.len(), 5);
            assert!(c.iter().all(|x| x.as_str().is_some_and(|s| !s.is_empty())));
        }
        other => panic!("unexpected tool {other}"),
    }
}

#[test]
fn every_qmsum_prompt_fits_its_context() {
    let spec = shipped("qmsum.yaml");
    let mut worst = i64::MIN;
    for (i, r) in spec
        .load_records()
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .cloned()
        .enumerate()
    {
        let (w, n) = drive_worst_case(&spec, i, r);
        assert_eq!(n, 9);
        worst = worst.max(w);
    }
    println!("qmsum: worst prompt + max output - max_context = {worst} tokens");
    assert!(worst <= 0, "a QMSum prompt overflows by {worst} tokens");
}

#[test]
fn every_mbpp_session_fits_and_runs_three_repair_rounds_at_worst() {
    let spec = shipped("mbpp.yaml");
    let mut worst = i64::MIN;
    for (i, r) in spec
        .load_records()
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .cloned()
        .enumerate()
    {
        let (w, n) = drive_worst_case(&spec, i, r);
        // generate, test, 3 × (diagnose, review, repair, retest), validate
        assert_eq!(n, 2 + 3 * 4 + 1);
        worst = worst.max(w);
    }
    println!("mbpp: worst prompt + max output - max_context = {worst} tokens");
    assert!(worst <= 0);
}

#[test]
fn gsm8k_sessions_fit() {
    let spec = shipped("gsm8k.yaml");
    let mut worst = i64::MIN;
    // Every 7th problem keeps the test quick; the prompt is dominated by the five candidates.
    for (i, r) in spec
        .load_records()
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .cloned()
        .enumerate()
        .step_by(7)
    {
        let (w, n) = drive_worst_case(&spec, i, r);
        assert_eq!(n, 7);
        worst = worst.max(w);
    }
    println!("gsm8k: worst prompt + max output - max_context = {worst} tokens");
    assert!(worst <= 0);
}

#[test]
fn shapes_match_the_paper() {
    let g = shipped("gsm8k.yaml");
    let vote = g.node_index("vote").unwrap_or_else(|| panic!("no vote"));
    assert_eq!(g.predecessors(vote).len(), 5);
    let models: std::collections::BTreeSet<&str> = g.nodes[..5]
        .iter()
        .filter_map(|n| match &n.kind {
            NodeKind::Agent(a) => Some(g.deployments[&a.deployment].model.as_str()),
            NodeKind::Tool(_) => None,
        })
        .collect();
    assert_eq!(models.len(), 5, "five heterogeneous solvers");
    assert_eq!(
        g.metric.as_ref().and_then(|m| m.terms.first()).map(|t| t.kind),
        Some(MetricKind::Gsm8kExact)
    );

    let m = shipped("mbpp.yaml");
    let deployments: std::collections::BTreeSet<&str> = m
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            NodeKind::Agent(a) => Some(a.deployment.as_str()),
            NodeKind::Tool(_) => None,
        })
        .collect();
    assert_eq!(deployments.len(), 4, "four model deployments");
    assert_eq!(m.loops.len(), 1);
    assert_eq!(m.loops[0].max_rounds, 3);
    let repair = m
        .node_index("repair")
        .unwrap_or_else(|| panic!("no repair"));
    assert!(m.predecessors(repair).len() >= 2, "repair is multi-parent");

    // QMSum: six of nine calls have a same-model successor that is their only successor and
    // whose only predecessor they are (fusible, paper 003 Eq. 3).
    let q = shipped("qmsum.yaml");
    assert_eq!(q.nodes.len(), 9);
    let fusible = (0..q.nodes.len())
        .filter(|&u| {
            let succ = q.successors(u);
            succ.len() == 1
                && q.predecessors(succ[0]) == [u]
                && q.deployment_of(u).map(|d| &d.name) == q.deployment_of(succ[0]).map(|d| &d.name)
        })
        .count();
    assert_eq!(fusible, 6);
}
