//! What a shell derives once per workflow from its static graph for the planner: fused chains
//! (Eq. 3, via `planner::fusion`), remaining critical-path work, and per-activation prompt
//! bounds and chain envelopes (Eq. 4). Shared by both shells; pure. Depends on the workflow
//! model, sessions, tokens and `planner::fusion`, never on `sim` or `live`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::ids::ActivationId;
use crate::planner::{ChainLink, DeploymentId};
use crate::planner::fusion::{LogicalEdge, LogicalNode, envelope, fusible_chains};
use crate::session::Session;
use crate::tokens;
use crate::workflow::{Filter, NodeKind, Segment, Source, TemplateBody, WorkflowSpec};

/// The node facts of a run: each workflow's as loaded, and a routed workflow's once more per
/// member of its route (what its sessions plan with once bound: routed nodes fused and forecast
/// near-ready like fixed ones). Looked up by a session's own spec, which says its binding.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    workflows: Vec<Vec<NodeInfo>>,
    bound: Vec<BTreeMap<String, Vec<NodeInfo>>>,
}

impl NodeFacts {
    /// Facts of `workflows` (index = workflow index); `deployment_of(w, name)` maps workflow
    /// `w`'s deployment names to identities.
    pub fn new(
        workflows: &[Arc<WorkflowSpec>],
        deployment_of: impl Fn(u32, &str) -> Option<DeploymentId>,
    ) -> NodeFacts {
        let mut facts = NodeFacts::default();
        for spec in workflows {
            facts.push(spec, &deployment_of);
        }
        facts
    }

    /// Add the facts of the next workflow (index = the number already held).
    pub fn push(&mut self, spec: &WorkflowSpec, deployment_of: impl Fn(u32, &str) -> Option<DeploymentId>) {
        let w = self.workflows.len() as u32;
        self.workflows.push(workflow_info(spec, |name| deployment_of(w, name)));
        let members = spec.route().unwrap_or(&[]);
        let bound = members
            .iter()
            .map(|m| (m.clone(), workflow_info(&spec.bound_to(m), |name| deployment_of(w, name))))
            .collect();
        self.bound.push(bound);
    }

    /// The facts a session of workflow `workflow` plans with, given the session's own spec
    /// (the bound copy for a routed session once its router bound it).
    pub fn of(&self, workflow: u32, spec: &WorkflowSpec) -> Option<&[NodeInfo]> {
        let w = workflow as usize;
        match spec.bound_member() {
            Some(member) => self.bound.get(w)?.get(member).map(Vec::as_slice),
            None => self.workflows.get(w).map(Vec::as_slice),
        }
    }
}

/// Static facts about one node.
#[derive(Debug, Clone, Default)]
pub struct NodeInfo {
    pub deployment: Option<DeploymentId>,
    /// The node's fused chain (node indices in order), when it belongs to one.
    pub chain: Option<Vec<usize>>,
    pub chain_prev: Option<usize>,
    pub chain_next: Option<usize>,
    /// Expected generated tokens (answers and thinking) on the longest path from here to a sink,
    /// this node included, with one pass of each loop; [`further_round_tokens`] gives the
    /// rounds a loop may still run.
    pub remaining_path_tokens: u32,
    /// The deployments a session can still call from this node on (its own, its successors',
    /// and its loop's whole body while another round may run), sorted: the session's outlook.
    pub reachable: Vec<DeploymentId>,
    pub output_limit: u32,
    /// For a node in a loop's body: the loop's most rounds and the expected generated tokens of
    /// one whole round (the longest path through the body), so that an activation in round k
    /// can count the rounds that may still follow ([`further_round_tokens`]).
    pub loop_rounds: Option<(u32, u32)>,
    /// The longest path from here in the worst case of the loops ahead: like
    /// `remaining_path_tokens`, but a loop entered from outside its body runs all its rounds
    /// (this node's own loop counts its current round only).
    pub worst_path_tokens: u32,
}

/// What the worst case of the loops adds to the one-pass remaining path of an activation of
/// `node` in round `round` (0-based): every round its own loop may still run after this one,
/// and every further round of the loops its path enters later; 0 where no loop lies ahead.
pub fn further_round_tokens(info: &[NodeInfo], node: usize, round: u32) -> u32 {
    let Some(n) = info.get(node) else { return 0 };
    let own = n
        .loop_rounds
        .map_or(0, |(max, per_round)| max.saturating_sub(round.saturating_add(1)).saturating_mul(per_round));
    n.worst_path_tokens.saturating_sub(n.remaining_path_tokens).saturating_add(own)
}

/// Per-node facts of a workflow; `deployment_of(name)` maps its deployment names to identities.
pub fn workflow_info(
    spec: &WorkflowSpec,
    deployment_of: impl Fn(&str) -> Option<DeploymentId>,
) -> Vec<NodeInfo> {
    let n = spec.nodes.len();
    let mut info: Vec<NodeInfo> = vec![NodeInfo::default(); n];
    let mut logical = Vec::with_capacity(n);
    let mut mean_tokens = vec![0u32; n];
    for (i, node) in spec.nodes.iter().enumerate() {
        let (deployment, limit) = match &node.kind {
            NodeKind::Agent(a) => {
                // Everything the call decodes: its answer and, in thinking mode, the reasoning
                // before it (dropped from the conversation, but generated all the same), at
                // most the output limit that caps both.
                let thinking = a.thinking_tokens.as_ref().map_or(0.0, |t| t.mean);
                let mean = (a.output_tokens.mean + thinking).round().max(0.0) as u32;
                mean_tokens[i] = mean.min(a.max_output_tokens);
                // A routed node's deployment is known once its session is bound (the spec is then
                // the bound copy, `WorkflowSpec::bound_to`); on the workflow as loaded it has none,
                // so it is neither fused nor forecast near-ready there.
                let deployment = if a.route.is_some() && spec.bound_member().is_none() {
                    None
                } else {
                    deployment_of(&a.deployment)
                };
                (deployment, a.max_output_tokens)
            }
            NodeKind::Tool(_) => (None, 0),
        };
        info[i].deployment = deployment;
        info[i].output_limit = limit;
        logical.push(LogicalNode {
            is_agent: matches!(node.kind, NodeKind::Agent(_)),
            deployment: deployment.map(|d| d.0),
            prompt_bound: 0,
            output_limit: limit,
        });
    }
    let mut edges = Vec::new();
    for (to, node) in spec.nodes.iter().enumerate() {
        for &from in &node.after {
            edges.push(LogicalEdge { from, to, conditional: node.when.is_some() });
        }
    }
    for chain in fusible_chains(&logical, &edges) {
        for (k, &v) in chain.iter().enumerate() {
            info[v].chain = Some(chain.clone());
            info[v].chain_prev = k.checked_sub(1).map(|p| chain[p]);
            info[v].chain_next = chain.get(k + 1).copied();
        }
    }
    // Remaining critical path, in reverse topological order.
    for &v in spec.topological_order().iter().rev() {
        let tail = spec.successors(v).iter().map(|&s| info[s].remaining_path_tokens).max().unwrap_or(0);
        info[v].remaining_path_tokens = mean_tokens[v].saturating_add(tail);
    }
    // One round of each loop: the longest path through its body.
    // Per loop entry: its loop and what the loop's further rounds add to a path entering it.
    let mut entry_extra: Vec<Option<(usize, u32)>> = vec![None; n];
    for (k, l) in spec.loops.iter().enumerate() {
        let mut within: BTreeMap<usize, u32> = BTreeMap::new();
        for &v in spec.topological_order().iter().rev().filter(|v| l.body.contains(v)) {
            let tail = spec.successors(v).iter().filter_map(|s| within.get(s)).max().copied().unwrap_or(0);
            within.insert(v, mean_tokens[v].saturating_add(tail));
        }
        let per_round = within.values().max().copied().unwrap_or(0);
        for &b in &l.body {
            info[b].loop_rounds = Some((l.max_rounds, per_round));
        }
        for &e in &l.entries {
            entry_extra[e] = Some((k, l.max_rounds.saturating_sub(1).saturating_mul(per_round)));
        }
    }
    // The worst case of the loops ahead: entering a loop from outside its body adds its further
    // rounds.
    for &v in spec.topological_order().iter().rev() {
        let own_loop = spec.nodes[v].loop_index;
        let tail = spec
            .successors(v)
            .iter()
            .map(|&s| {
                let entering = entry_extra[s].filter(|&(k, _)| own_loop != Some(k)).map_or(0, |(_, extra)| extra);
                info[s].worst_path_tokens.saturating_add(entering)
            })
            .max()
            .unwrap_or(0);
        info[v].worst_path_tokens = mean_tokens[v].saturating_add(tail);
    }
    // Reachable deployments, in reverse topological order: a loop's body may run again, so a
    // body node reaches every deployment of its loop's body.
    let body_deployments: Vec<Vec<DeploymentId>> = spec
        .loops
        .iter()
        .map(|l| l.body.iter().filter_map(|&b| info[b].deployment).collect())
        .collect();
    for &v in spec.topological_order().iter().rev() {
        let mut reach: Vec<DeploymentId> = info[v].deployment.into_iter().collect();
        for s in spec.successors(v) {
            reach.extend_from_slice(&info[s].reachable);
        }
        if let Some(body) = spec.nodes[v].loop_index.and_then(|l| body_deployments.get(l)) {
            reach.extend_from_slice(body);
        }
        reach.sort_unstable();
        reach.dedup();
        info[v].reachable = reach;
    }
    info
}

/// What `session` can still call: the deployments reachable from its frontier (its ready and
/// running activations), sorted — the planner's [`crate::planner::Event::SessionOutlook`].
pub fn outlook(session: &Session, info: &[NodeInfo]) -> Vec<DeploymentId> {
    use crate::session::ActivationState;
    let mut out: Vec<DeploymentId> = session
        .open_activations()
        .filter(|a| matches!(a.state, ActivationState::Ready | ActivationState::Running))
        .filter_map(|a| info.get(a.node))
        .flat_map(|n| n.reachable.iter().copied())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Token bound of an agent node's prompt in `session`: the chat template's tokens, static text
/// and input fields counted exactly (a `part I of N` filter takes 1/N), referenced outputs at
/// their producers' output limits, except references to nodes in `internal` (chain positions), returned separately
/// as the positions consumed.
pub fn prompt_bound(
    spec: &WorkflowSpec,
    info: &[NodeInfo],
    session: &Session,
    node: usize,
    internal: &[usize],
) -> (u32, Vec<usize>) {
    let NodeKind::Agent(agent) = &spec.nodes[node].kind else { return (0, Vec::new()) };
    let TemplateBody::Text(segments) = &agent.prompt.body else { return (0, Vec::new()) };
    // The chat template's tokens around the content (see `tokens::encode_chat`).
    let mut total: u64 = tokens::chat_overhead() as u64;
    let mut consumed = Vec::new();
    for seg in segments {
        match seg {
            Segment::Text(t) => total += tokens::count(t) as u64,
            Segment::Ref(r) => {
                let fraction: f64 = r
                    .filters
                    .iter()
                    .map(|f| match f {
                        Filter::Part { of, .. } => 1.0 / (*of).max(1) as f64,
                        Filter::Take(_) => 1.0,
                    })
                    .product();
                match r.sources.first() {
                    Some(Source::Input(field)) => {
                        let n = match session.input().get(field) {
                            Some(serde_json::Value::String(s)) => tokens::count(s),
                            Some(other) => tokens::count(&other.to_string()),
                            None => 0,
                        };
                        total += (n as f64 * fraction).ceil() as u64;
                    }
                    Some(Source::Output(name) | Source::Previous(name)) => {
                        if let Some(j) = spec.node_index(name) {
                            if let Some(pos) = internal.iter().position(|&x| x == j) {
                                consumed.push(pos);
                            } else {
                                let limit = if info[j].output_limit > 0 { info[j].output_limit } else { 256 };
                                total += (limit as f64 * fraction).ceil() as u64;
                            }
                        }
                    }
                    Some(Source::Verdict(_) | Source::Round) => total += 2,
                    Some(Source::Literal(t)) => total += tokens::count(t) as u64,
                    None => {}
                }
            }
        }
    }
    (total.min(u32::MAX as u64) as u32, consumed)
}

/// Admission envelope (Eq. 4) of the rest of `node`'s chain from `node` on, given the actual
/// prompt tokens of `node` itself. For an unfused node: (prompt, its output limit).
pub fn chain_envelope(
    spec: &WorkflowSpec,
    info: &[NodeInfo],
    session: &Session,
    node: usize,
    prompt_tokens: u32,
) -> (u32, u32) {
    let Some(chain) = &info[node].chain else { return (prompt_tokens, info[node].output_limit) };
    let start = chain.iter().position(|&v| v == node).unwrap_or(0);
    let rest = &chain[start..];
    let mut links = Vec::with_capacity(rest.len());
    let mut consumes = Vec::with_capacity(rest.len());
    for (k, &v) in rest.iter().enumerate() {
        let (p, c) = if k == 0 { (prompt_tokens, Vec::new()) } else { prompt_bound(spec, info, session, v, rest) };
        links.push(LogicalNode {
            is_agent: true,
            deployment: info[v].deployment.map(|d| d.0),
            prompt_bound: p,
            output_limit: info[v].output_limit,
        });
        consumes.push(c);
    }
    envelope(&links, &consumes)
}

/// The links of `node`'s fused chain after `node` (empty when it is unfused or the chain's
/// last link), each with its fixed prompt bound and the chain positions it reads (0: `node`).
pub fn chain_rest(spec: &WorkflowSpec, info: &[NodeInfo], session: &Session, node: usize) -> Vec<ChainLink> {
    let Some(chain) = &info[node].chain else { return Vec::new() };
    let start = chain.iter().position(|&v| v == node).unwrap_or(0);
    let rest = &chain[start..];
    rest.iter()
        .skip(1)
        .map(|&v| {
            let (fixed_prompt, reads) = prompt_bound(spec, info, session, v, rest);
            ChainLink {
                node: v as u32,
                fixed_prompt,
                max_output_tokens: info[v].output_limit,
                reads: reads.into_iter().map(|k| k as u32).collect(),
            }
        })
        .collect()
}

/// The activation of `session` that precedes `a` in its fused chain (same round).
pub fn chain_prev_activation(info: &[NodeInfo], session: &Session, a: ActivationId) -> Option<ActivationId> {
    let act = session.activation(a.index)?;
    let prev = info.get(act.node)?.chain_prev?;
    let index = session.activation_for(prev, act.round)?;
    Some(ActivationId { session: a.session, index })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::workflow::parse_workflow;

    /// write (100 + 400 thinking) → [fix (50 + 150 thinking) → check (tool)] × at most 3 rounds
    /// → report (100 + 1,000 thinking, capped by its 1,024-token limit).
    const LOOPED: &str = r#"name: t
deployments:
  small: {model: Qwen3-0.6B, max_context: 4096, max_output_tokens: 1024}
nodes:
  - id: write
    deployment: small
    responder: generic
    output_tokens: {mean: 100, cv: 0.3}
    thinking_tokens: {mean: 400, cv: 0.3}
    prompt: "Write it"
  - id: fix
    deployment: small
    responder: generic
    after: [write]
    output_tokens: {mean: 50, cv: 0.3}
    thinking_tokens: {mean: 150, cv: 0.3}
    prompt: "Fix {{fix | write}}"
  - id: check
    tool: python_tests
    after: [fix]
    inputs: {code: "{{fix}}", tests: "assert True"}
  - id: report
    deployment: small
    responder: generic
    after: [check]
    output_tokens: {mean: 100, cv: 0.3}
    thinking_tokens: {mean: 1000, cv: 0.3}
    prompt: "Report {{check}}"
loops:
  - id: again
    body: [fix, check]
    continue_when: {node: check, verdict: fail}
    max_rounds: 3
"#;

    #[test]
    fn the_remaining_path_counts_thinking_and_the_rounds_a_loop_may_still_run() {
        let spec = parse_workflow("t.yaml", LOOPED, Path::new(".")).unwrap_or_else(|e| panic!("{e}"));
        let info = workflow_info(&spec, |_| Some(DeploymentId(0)));
        let (write, fix, check, report) = (0, 1, 2, 3);
        // One pass: thinking and answers are both generated, at most the output limit.
        assert_eq!(info[report].remaining_path_tokens, 1024);
        assert_eq!(info[fix].remaining_path_tokens, 200 + 1024);
        assert_eq!(info[write].remaining_path_tokens, 500 + 200 + 1024);
        assert_eq!(info[fix].loop_rounds, Some((3, 200)));
        assert_eq!(info[check].loop_rounds, Some((3, 200)));
        assert_eq!(info[write].loop_rounds, None);
        // In round k (0-based) of three, 2 − k further rounds of 200 tokens may follow.
        assert_eq!(further_round_tokens(&info, fix, 0), 2 * 200);
        assert_eq!(further_round_tokens(&info, fix, 1), 200);
        assert_eq!(further_round_tokens(&info, fix, 2), 0);
        assert_eq!(further_round_tokens(&info, check, 0), 2 * 200);
        assert_eq!(further_round_tokens(&info, fix, 7), 0);
        assert_eq!(further_round_tokens(&info, fix, u32::MAX), 0);
        // Before the loop, its path may run all three rounds: never less than what its
        // successor in the loop's first round counts.
        assert_eq!(further_round_tokens(&info, write, 0), 2 * 200);
        assert_eq!(
            info[write].remaining_path_tokens + further_round_tokens(&info, write, 0),
            500 + info[fix].remaining_path_tokens + further_round_tokens(&info, fix, 0)
        );
        // After the loop nothing is added.
        assert_eq!(further_round_tokens(&info, report, 0), 0);
        assert_eq!(further_round_tokens(&info, 99, 0), 0);
    }
}
