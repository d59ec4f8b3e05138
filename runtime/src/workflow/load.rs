//! From positioned YAML to a validated [`WorkflowSpec`]: schema conversion, reference
//! resolution, the acyclicity check (cycles must be declared loops), loop well-formedness,
//! template visibility and the "context can never fit" check. Every independent problem of a
//! file is collected (an unknown key, one field, one node or one loop hides no other; what
//! depends on a part that did not read waits for it); the checks that need every node run once
//! every node reads, and then all together.
//!
//! Pure apart from file-system checks: the dataset file exists (`is_file`, `exists`) and each
//! shell node's declared `reads:` path is what it claims (`switchyard_tools::shell::checked_read`,
//! a `symlink_metadata`); it also reads the process-wide registry of custom tools.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use petgraph::graph::{DiGraph, NodeIndex};
use switchyard_predictor::Dtype;

use super::dataset::{DatasetBinding, DatasetFormat, FieldSource, JoinSpec};
use super::error::{ErrorKind, WorkflowError};
use super::template::{Segment, Source, Template, TemplateBody};
use super::yaml::{self, Ctx, Key, MapView, Node, Pos, Value, closest, join_path};
use super::{
    AgentNode, AgentTool, AgentTools, Condition, DeploymentSpec, EdgeKind, LoopSpec, MAX_TURNS, MetricKind,
    MetricSpec, MetricTerm, NodeKind, NodeSpec, RESPONDERS, RoundVariant, StructuredOutput, TOOL_INPUTS,
    TOOL_VERDICTS, TemplateOf, TemplateSite, ToolNode, WorkflowSpec, default_output_tokens, default_turns,
    tool_call_verdict,
};
use crate::responder::GENERIC;
use crate::schema::{MAX_SMALLEST_ANSWER_BYTES, OutputSchema};
use crate::values::LengthDist;

const TOP_KEYS: &[&str] = &[
    "name",
    "description",
    "deployments",
    "dataset",
    "metric",
    "verifier",
    "nodes",
    "loops",
];
const DEPLOYMENT_KEYS: &[&str] = &[
    "model",
    "dtype",
    "max_context",
    "max_output_tokens",
    "gpu_memory_utilization",
];
const AGENT_KEYS: &[&str] = &[
    "deployment",
    "responder",
    "role",
    "goal",
    "instructions",
    "prompt",
    "next_rounds",
    "max_output_tokens",
    "output_tokens",
    "thinking_tokens",
    "output",
    "tools",
    "max_turns",
    "turns",
];
/// Keys of one entry of an agent's `tools:` (a bare string is `{name: STRING}`).
const AGENT_TOOL_KEYS: &[&str] = &["name", "tool", "description", "inputs", "timeout_s"];
const TOOL_KEYS: &[&str] = &["tool", "inputs", "timeout_s"];
const COMMON_NODE_KEYS: &[&str] = &["id", "description", "after", "when"];
const LOOP_KEYS: &[&str] = &["id", "description", "body", "continue_when", "max_rounds"];
const DATASET_KEYS: &[&str] = &["file", "format", "fields"];
const METRIC_KEYS: &[&str] = &["kind", "node", "reference", "pass", "weight"];

/// Default `gpu_memory_utilization`, vLLM's own default (`vllm serve --help`, EngineArgs).
const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// Where things were written, for errors raised after conversion.
struct NodeLocs {
    pos: Pos,
    after: Vec<Pos>,
    after_key: Option<Pos>,
    prompt: Option<Pos>,
    /// `next_rounds:` and its prompt.
    next_rounds: Option<Pos>,
    next_prompt: Option<Pos>,
    /// `when:` (its `verdict` entry).
    when_verdict: Option<Pos>,
    inputs: BTreeMap<String, Pos>,
    /// The field path of a node the loader adds (an agent's tool step:
    /// `nodes.AGENT.tools.NAME`); `None`: `nodes.ID`.
    path: Option<String>,
    /// An agent's tools, each to become a tool step node after the file's nodes.
    tools: Vec<(ToolNode, NodeLocs)>,
}

impl NodeLocs {
    fn at(pos: Pos) -> NodeLocs {
        NodeLocs {
            pos,
            after: Vec::new(),
            after_key: None,
            prompt: None,
            next_rounds: None,
            next_prompt: None,
            when_verdict: None,
            inputs: BTreeMap::new(),
            path: None,
            tools: Vec::new(),
        }
    }
}

pub(super) fn build(
    file: &str,
    text: &str,
    base_dir: &Path,
) -> Result<WorkflowSpec, WorkflowError> {
    let ctx = Ctx { file };
    let doc = yaml::parse(file, text)?;
    // Independent problems are all reported together: an unknown key does not hide its
    // mapping's other problems, nor one node the next's. The graph checks that need every node
    // (what templates reference, cycles, the loops' shape, verdicts) run once every node reads
    // without a problem, unknown keys included.
    let mut errors: Vec<WorkflowError> = Vec::new();
    let pool_file = matches!(&doc.value, Value::Map(e) if e.iter().any(|(k, _)| k.name == "devices") && !e.iter().any(|(k, _)| k.name == "nodes"));
    let top = if pool_file {
        // A pool file given where a workflow belongs: that hint alone, not what a workflow lacks.
        ctx.map(&doc, "", TOP_KEYS)?
    } else {
        ctx.map_all(&doc, "", TOP_KEYS, &mut errors)?
    };
    // An unknown key may be a misspelt `loops` or `metric`: the graph checks wait for it.
    let mut graph_ready = errors.is_empty();
    let name_node = keep(&mut errors, top.required(&ctx, "", "name"));
    let name_at = name_node.map_or((doc.pos.line, doc.pos.column), |n| (n.pos.line, n.pos.column));
    let name = name_node.and_then(|n| keep(&mut errors, ctx.ident(n, "name", true))).unwrap_or_default();
    let description = top.get("description").and_then(|d| keep(&mut errors, ctx.string(d, "description")));
    let deployments_node = top.required(&ctx, "", "deployments");
    // Names declared, even those whose entry is wrong: a node naming one of them is not
    // reported again as naming an unknown deployment (`None`: `deployments` is there but not a
    // mapping, so no name can be checked; absent, it declares none and every name is unknown).
    let declared: Option<BTreeSet<String>> = match deployments_node.as_ref().map(|d| &d.value) {
        Ok(Value::Map(entries)) => Some(entries.iter().map(|(k, _)| k.name.clone()).collect()),
        Ok(_) => None,
        Err(_) => Some(BTreeSet::new()),
    };
    let deployments = keep(&mut errors, deployments_node.and_then(|d| deployments(&ctx, d))).unwrap_or_default();
    let mut dataset = top.get("dataset").and_then(|d| keep(&mut errors, dataset(&ctx, d, base_dir)));
    // A dataset that is declared but wrong maps unknown fields: checks against its fields wait.
    let dataset_failed = top.get("dataset").is_some() && dataset.is_none();

    // Nodes: ids first (so references can point forward), then each node.
    let nodes_node = match top.required(&ctx, "", "nodes") {
        Ok(n) => n,
        Err(e) => {
            errors.push(e);
            return Err(gathered(errors));
        }
    };
    let raw_nodes = match ctx.seq(nodes_node, "nodes") {
        Ok(n) => n,
        Err(e) => {
            errors.push(e);
            return Err(gathered(errors));
        }
    };
    if raw_nodes.is_empty() {
        errors.push(ctx.err(
            nodes_node.pos,
            "nodes",
            ErrorKind::MissingField,
            "a workflow needs at least one node",
        ));
        return Err(gathered(errors));
    }
    if raw_nodes.len() > super::MAX_NODES {
        errors.push(ctx.err(
            nodes_node.pos,
            "nodes",
            ErrorKind::TooLarge,
            format!("{} nodes; a workflow has at most {}", raw_nodes.len(), super::MAX_NODES),
        ));
        return Err(gathered(errors));
    }
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    let mut maps = Vec::with_capacity(raw_nodes.len());
    // Nodes with a key the schema does not know: checked, but they hold the graph checks back
    // (a misspelt `after` would read as a missing edge).
    let mut unknown_keys: BTreeSet<usize> = BTreeSet::new();
    for (i, n) in raw_nodes.iter().enumerate() {
        let mut unknown = Vec::new();
        match node_header(&ctx, i, n, &index, &mut unknown) {
            Ok((id, m)) => {
                if !unknown.is_empty() {
                    unknown_keys.insert(maps.len());
                }
                index.insert(id.clone(), maps.len());
                maps.push((id, m));
            }
            Err(e) => errors.push(e),
        }
        errors.extend(unknown);
    }
    let ids: Vec<&str> = maps.iter().map(|(id, _)| id.as_str()).collect();

    // Every node whose header reads is checked, whatever the others' problems (a node whose
    // id does not read cannot be referred to, and is left out).
    let parsed: Vec<Option<(NodeSpec, NodeLocs)>> = maps
        .iter()
        .map(|(id, m)| keep(&mut errors, node(&ctx, id, m, &index, &ids, &deployments, declared.as_ref())))
        .collect();
    graph_ready &= maps.len() == raw_nodes.len() && unknown_keys.is_empty() && parsed.iter().all(Option::is_some);
    if !graph_ready {
        // The checks of single nodes and of the metric on what parsed; the graph checks wait.
        let ok: Vec<(&NodeSpec, &NodeLocs, &MapView<'_>)> = parsed
            .iter()
            .zip(&maps)
            .filter_map(|(p, (_, m))| p.as_ref().map(|(n, l)| (n, l, m)))
            .collect();
        let mut some_nodes: Vec<NodeSpec> = ok.iter().map(|(n, _, _)| (*n).clone()).collect();
        let some_locs: Vec<&NodeLocs> = ok.iter().map(|(_, l, _)| *l).collect();
        errors.extend(check_context_fits(&ctx, &some_nodes, &some_locs, &deployments));
        errors.extend(check_one_route(&ctx, &some_nodes, &some_locs));
        if !dataset_failed {
            errors.extend(check_input_needs(&ctx, ok.iter().map(|(n, _, m)| (*n, *m)), dataset.as_ref()));
        }
        let by_index: Vec<Option<&NodeSpec>> = parsed.iter().map(|p| p.as_ref().map(|(n, _)| n)).collect();
        if let Some(m) = top.get("metric") {
            keep(&mut errors, metric(&ctx, m, &index, &ids, &by_index, dataset.as_ref()));
        }
        if let Some(v) = top.get("verifier") {
            keep(&mut errors, verifier(&ctx, v, &index, &ids, &by_index, dataset.as_ref()));
        }
        // With every node read (some with unknown keys), the loops' own fields are checked too.
        if ok.len() == raw_nodes.len()
            && let Some(l) = top.get("loops")
        {
            loops(&ctx, l, &index, &ids, &mut some_nodes, &mut Vec::new(), &mut BTreeSet::new(), &mut errors);
        }
        return Err(gathered(errors));
    }
    let (mut nodes, mut locs): (Vec<NodeSpec>, Vec<NodeLocs>) = parsed.into_iter().flatten().unzip();
    let file_nodes = nodes.len();
    add_tool_steps(&mut nodes, &mut locs);
    // The agents' tool steps are nodes too: the limit holds for the graph a session runs.
    if nodes.len() > super::MAX_NODES {
        errors.push(ctx.err(
            nodes_node.pos,
            "nodes",
            ErrorKind::TooLarge,
            format!(
                "{file_nodes} nodes and {} agent tool steps; a workflow has at most {} in all",
                nodes.len() - file_nodes,
                super::MAX_NODES
            ),
        ));
        return Err(gathered(errors));
    }

    let mut conditions: Vec<(String, Pos, Condition)> = nodes
        .iter()
        .zip(&locs)
        .filter_map(|(n, l)| Some((format!("nodes.{}.when.verdict", n.id), l.when_verdict?, n.when.clone()?)))
        .collect();
    // Nodes named by a loop that did not parse: their rounds are unknown, so the checks that
    // depend on them (templates, next_rounds) leave them alone until the loop is fixed.
    let mut broken: BTreeSet<usize> = BTreeSet::new();
    let (mut loops, loop_positions) = match top.get("loops") {
        Some(l) => loops(&ctx, l, &index, &ids, &mut nodes, &mut conditions, &mut broken, &mut errors),
        None => (Vec::new(), Vec::new()),
    };
    let declared_loops = loops.len();
    add_turn_loops(&mut nodes, &mut loops, file_nodes);
    // The agents' turn loops count against the activations one session may create, with the
    // declared loops (whose own check counted only themselves).
    let activations: u64 = loops.iter().map(|l| u64::from(l.max_rounds).saturating_mul(l.body.len() as u64)).sum();
    if loops.len() > declared_loops && activations > super::MAX_LOOP_ACTIVATIONS {
        let turns: Vec<String> = loops[declared_loops..]
            .iter()
            .map(|l| format!("`{}` {} turns × {} nodes", l.id, l.max_rounds, l.body.len()))
            .collect();
        errors.push(ctx.err(
            nodes_node.pos,
            "nodes",
            ErrorKind::TooLarge,
            format!(
                "the loops may create {activations} activations in a session ({}, with the declared loops'); at most {}",
                turns.join(", "),
                super::MAX_LOOP_ACTIVATIONS
            ),
        ));
    }

    // A cycle is reported with everything else: the checks below read the graph as it is.
    let topo = keep(&mut errors, topological_order(&ctx, &nodes, &locs));
    errors.extend(check_loops(&ctx, &loop_positions, &nodes, &mut loops));

    let mut graph: DiGraph<usize, EdgeKind> = DiGraph::with_capacity(nodes.len(), nodes.len() * 2);
    for i in 0..nodes.len() {
        graph.add_node(i);
    }
    for (i, n) in nodes.iter().enumerate() {
        for &p in &n.after {
            graph.add_edge(NodeIndex::new(p), NodeIndex::new(i), EdgeKind::After);
        }
    }
    for (li, l) in loops.iter().enumerate() {
        for &b in &l.back_from {
            for &e in &l.entries {
                graph.add_edge(NodeIndex::new(b), NodeIndex::new(e), EdgeKind::LoopBack { loop_index: li });
            }
        }
    }

    let loc_refs: Vec<&NodeLocs> = locs.iter().collect();
    errors.extend(check_template_visibility(&ctx, &nodes, &locs, dataset.as_ref(), topo.as_deref(), &broken));
    errors.extend(check_context_fits(&ctx, &nodes, &loc_refs, &deployments));
    errors.extend(check_one_route(&ctx, &nodes, &loc_refs));
    errors.extend(check_next_rounds(&ctx, &nodes, &locs, &broken));
    errors.extend(check_verdicts(&ctx, &nodes, &conditions));
    if !dataset_failed {
        errors.extend(check_input_needs(&ctx, nodes.iter().zip(maps.iter().map(|(_, m)| m)), dataset.as_ref()));
    }
    // What the responders read as text must be text in every record (checked when the records
    // are loaded: before a run starts, and by `validate`).
    if let Some(d) = dataset.as_mut() {
        for node in &nodes {
            let NodeKind::Agent(a) = &node.kind else { continue };
            let responders = std::iter::once(a.responder.as_str()).chain(a.next_rounds.as_ref().map(|v| v.responder.as_str()));
            for responder in responders {
                d.text_fields.extend(crate::responder::input_needs(responder).iter().map(|n| n.to_string()));
            }
        }
    }

    let by_index: Vec<Option<&NodeSpec>> = nodes.iter().map(Some).collect();
    let metric = top
        .get("metric")
        .and_then(|m| keep(&mut errors, metric(&ctx, m, &index, &ids, &by_index, dataset.as_ref())));
    let verifier = top
        .get("verifier")
        .and_then(|v| keep(&mut errors, verifier(&ctx, v, &index, &ids, &by_index, dataset.as_ref())));
    let topo = match topo {
        Some(topo) if errors.is_empty() => topo,
        _ => return Err(gathered(errors)),
    };
    // Tool steps are found by id (`AGENT.NAME`), but no reference in the file can name one.
    for (i, n) in nodes.iter().enumerate().skip(file_nodes) {
        index.insert(n.id.clone(), i);
    }
    let template_sites = template_sites(&nodes, &locs);

    Ok(WorkflowSpec {
        name,
        description,
        path: file.into(),
        deployments,
        nodes,
        loops,
        dataset,
        metric,
        verifier,
        bound: None,
        graph,
        index,
        topo,
        name_at,
        template_sites,
        records: Default::default(),
    })
}

/// A problem kept with the others: the value when there was none.
fn keep<T>(errors: &mut Vec<WorkflowError>, result: Result<T, WorkflowError>) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(e) => {
            errors.push(e);
            None
        }
    }
}

/// Every problem of the file, as one error: flattened and sorted by position, without a
/// "missing required field `X`" that an unknown key beside it already explains ("did you mean
/// `X`?").
fn gathered(errors: Vec<WorkflowError>) -> WorkflowError {
    let list = match WorkflowError::many(errors) {
        WorkflowError::Many(list) => list,
        one => return one,
    };
    let parent = |field: &str| field.rsplit_once('.').map_or(String::new(), |(p, _)| p.to_string());
    let mut typos: BTreeSet<(String, String)> = BTreeSet::new();
    for e in &list {
        if let WorkflowError::Invalid { kind: ErrorKind::UnknownField, field, message, .. } = e
            && let Some(rest) = message.split_once("(did you mean `").map(|x| x.1)
            && let Some((meant, _)) = rest.split_once("`?)")
        {
            typos.insert((parent(field), meant.to_string()));
        }
    }
    let explained = |e: &WorkflowError| match e {
        WorkflowError::Invalid { kind: ErrorKind::MissingField, field, .. } => {
            let key = field.rsplit_once('.').map_or(field.as_str(), |(_, k)| k);
            typos.contains(&(parent(field), key.to_string()))
        }
        _ => false,
    };
    WorkflowError::many(list.into_iter().filter(|e| !explained(e)).collect())
}

/// The problems of one part, as one error (flattened and sorted by [`WorkflowError::many`]
/// when the file's problems are gathered).
fn all_of(errors: Vec<WorkflowError>) -> WorkflowError {
    WorkflowError::Many(errors)
}

/// Where each template of the file is, with the field path the loader's errors use.
fn template_sites(nodes: &[NodeSpec], locs: &[NodeLocs]) -> Vec<TemplateSite> {
    let mut out = Vec::new();
    for (i, (n, l)) in nodes.iter().zip(locs).enumerate() {
        let at = |p: Option<Pos>| {
            let p = p.unwrap_or(l.pos);
            (p.line, p.column)
        };
        match &n.kind {
            NodeKind::Agent(a) => {
                out.push(TemplateSite { node: i, field: format!("nodes.{}.prompt", n.id), at: at(l.prompt), template: TemplateOf::Prompt });
                if a.next_rounds.is_some() {
                    out.push(TemplateSite {
                        node: i,
                        field: format!("nodes.{}.next_rounds.prompt", n.id),
                        at: at(l.next_prompt),
                        template: TemplateOf::NextRoundsPrompt,
                    });
                }
            }
            NodeKind::Tool(t) => {
                for k in t.inputs.keys() {
                    let field = match &l.path {
                        Some(path) => format!("{path}.inputs.{k}"),
                        None => format!("nodes.{}.inputs.{k}", n.id),
                    };
                    out.push(TemplateSite { node: i, field, at: at(l.inputs.get(k).copied()), template: TemplateOf::Input(k.clone()) });
                }
            }
        }
    }
    out
}

/// A node's id and its mapping (keys checked), named by its id in error paths as soon as it
/// has a readable one.
fn node_header<'n>(
    ctx: &Ctx<'_>,
    i: usize,
    n: &'n Node,
    index: &BTreeMap<String, usize>,
    errors: &mut Vec<WorkflowError>,
) -> Result<(String, MapView<'n>), WorkflowError> {
    let field = match &n.value {
        Value::Map(entries) => match entries
            .iter()
            .find(|(k, _)| k.name == "id")
            .map(|(_, v)| &v.value)
        {
            Some(Value::Str(id)) if yaml::is_ident(id, false) => format!("nodes.{id}"),
            _ => format!("nodes[{i}]"),
        },
        _ => format!("nodes[{i}]"),
    };
    let mut allowed: Vec<&str> = COMMON_NODE_KEYS.to_vec();
    allowed.extend_from_slice(AGENT_KEYS);
    allowed.extend_from_slice(TOOL_KEYS);
    // An unknown key is reported, and the node's other keys are still checked.
    let m = ctx.map_all(n, &field, &allowed, errors)?;
    let id_node = m.required(ctx, &field, "id")?;
    let id = ctx.ident(id_node, &format!("{field}.id"), false)?;
    if id == "input" || id == "loop" {
        return Err(ctx.err(
            id_node.pos,
            &format!("{field}.id"),
            ErrorKind::BadType,
            format!("`{id}` is reserved (`{{{{input.FIELD}}}}`, `{{{{loop.round}}}}`)"),
        ));
    }
    if let Some(&first) = index.get(&id) {
        return Err(ctx.err(
            id_node.pos,
            &format!("nodes.{id}.id"),
            ErrorKind::DuplicateId,
            format!("duplicate node id `{id}` (first declared as node {first})"),
        ));
    }
    Ok((id, m))
}

fn deployments(
    ctx: &Ctx<'_>,
    node: &Node,
) -> Result<BTreeMap<String, DeploymentSpec>, WorkflowError> {
    let entries = ctx.entries(node, "deployments")?;
    if entries.is_empty() {
        return Err(ctx.err(
            node.pos,
            "deployments",
            ErrorKind::MissingField,
            "declare at least one deployment",
        ));
    }
    let mut out = BTreeMap::new();
    let mut errors = Vec::new();
    for (key, value) in entries {
        match deployment(ctx, key, value) {
            Ok(d) => {
                out.insert(key.name.clone(), d);
            }
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        return Err(WorkflowError::many(errors));
    }
    Ok(out)
}

fn deployment(ctx: &Ctx<'_>, key: &Key, value: &Node) -> Result<DeploymentSpec, WorkflowError> {
    let field = format!("deployments.{}", key.name);
    let f = |k: &str| format!("{field}.{k}");
    let mut errors = Vec::new();
    if !yaml::is_ident(&key.name, true) {
        errors.push(ctx.err(
            key.pos,
            &field,
            ErrorKind::BadType,
            format!("`{}` is not a valid deployment name", key.name),
        ));
    }
    let m = ctx.map_all(value, &field, DEPLOYMENT_KEYS, &mut errors)?;
    let model_node = keep(&mut errors, m.required(ctx, &field, "model"));
    let arch = model_node.and_then(|model_node| {
        let model_name = keep(&mut errors, ctx.string(model_node, &f("model")))?;
        let arch = keep(
            &mut errors,
            switchyard_predictor::spec::model(&model_name)
                .map_err(|e| ctx.err(model_node.pos, &f("model"), ErrorKind::UnknownModel, e.to_string())),
        )?;
        if arch.linear_attention.is_some() {
            // The planner's predictor and the responders know dense models only; the hybrid
            // catalogue serves the agent-program experiments (`bench oracle`).
            errors.push(ctx.err(
                model_node.pos,
                &f("model"),
                ErrorKind::UnknownModel,
                format!(
                    "`{model_name}` is a hybrid (linear-attention) model: workflows deploy the dense Qwen3 models \
                     only (the predictor does not model Gated DeltaNet layers)"
                ),
            ));
            return None;
        }
        Some(arch)
    });
    let dtype = match m.get("dtype") {
        None => Some(Dtype::Bf16),
        Some(d) => match keep(&mut errors, ctx.string(d, &f("dtype"))).as_deref() {
            Some("bf16") => Some(Dtype::Bf16),
            Some("fp16") => Some(Dtype::Fp16),
            Some(other) => {
                errors.push(ctx.err(d.pos, &f("dtype"), ErrorKind::BadType, format!("dtype `{other}`: expected `bf16` or `fp16`")));
                None
            }
            None => None,
        },
    };
    let ctx_node = keep(&mut errors, m.required(ctx, &field, "max_context"));
    let max_context = ctx_node.and_then(|n| keep(&mut errors, ctx.u32(n, &f("max_context"))));
    let max_context = match (max_context, ctx_node, &arch) {
        (Some(c), Some(n), Some(arch)) if c == 0 || u64::from(c) > arch.max_position_embeddings => {
            errors.push(ctx.err(
                n.pos,
                &f("max_context"),
                ErrorKind::BadType,
                format!("max_context {c} must be between 1 and {}'s {} positions", arch.name, arch.max_position_embeddings),
            ));
            None
        }
        (Some(0), Some(n), None) => {
            errors.push(ctx.err(n.pos, &f("max_context"), ErrorKind::BadType, "max_context 0 must be at least 1"));
            None
        }
        (c, ..) => c,
    };
    let out_node = keep(&mut errors, m.required(ctx, &field, "max_output_tokens"));
    let max_output_tokens = out_node.and_then(|n| keep(&mut errors, ctx.u32(n, &f("max_output_tokens"))));
    if let (Some(o), Some(n)) = (max_output_tokens, out_node)
        && (o == 0 || max_context.is_some_and(|c| o >= c))
    {
        let message = match max_context {
            Some(c) => format!("max_output_tokens {o} must be at least 1 and below max_context {c}"),
            None => format!("max_output_tokens {o} must be at least 1"),
        };
        errors.push(ctx.err(n.pos, &f("max_output_tokens"), ErrorKind::OutputLimit, message));
    }
    let gpu_memory_utilization = match m.get("gpu_memory_utilization") {
        None => Some(DEFAULT_GPU_MEMORY_UTILIZATION),
        Some(g) => match keep(&mut errors, ctx.f64(g, &f("gpu_memory_utilization"))) {
            Some(x) if x > 0.0 && x <= 1.0 => Some(x),
            Some(x) => {
                errors.push(ctx.err(g.pos, &f("gpu_memory_utilization"), ErrorKind::BadType, format!("{x} is not a fraction in (0, 1]")));
                None
            }
            None => None,
        },
    };
    match (arch, dtype, max_context, max_output_tokens, gpu_memory_utilization) {
        (Some(arch), Some(dtype), Some(max_context), Some(max_output_tokens), Some(gpu_memory_utilization)) if errors.is_empty() => {
            Ok(DeploymentSpec {
                name: key.name.clone(),
                model: arch.name.clone(),
                dtype,
                max_context,
                max_output_tokens,
                gpu_memory_utilization,
                declared_at: (key.pos.line, key.pos.column),
            })
        }
        _ => Err(all_of(errors)),
    }
}

fn dataset(ctx: &Ctx<'_>, node: &Node, base_dir: &Path) -> Result<DatasetBinding, WorkflowError> {
    let mut errors = Vec::new();
    let m = ctx.map_all(node, "dataset", DATASET_KEYS, &mut errors)?;
    let file_node = keep(&mut errors, m.required(ctx, "dataset", "file"));
    let file_as_written = file_node.and_then(|n| keep(&mut errors, ctx.string(n, "dataset.file")));
    let format = match m.get("format") {
        Some(f) => match keep(&mut errors, ctx.string(f, "dataset.format")).as_deref() {
            Some("json") => Some(DatasetFormat::Json),
            Some("jsonl") => Some(DatasetFormat::Jsonl),
            Some(other) => {
                errors.push(ctx.err(f.pos, "dataset.format", ErrorKind::BadType, format!("format `{other}`: expected `json` or `jsonl`")));
                None
            }
            None => None,
        },
        None => match file_as_written.as_deref() {
            Some(f) if f.ends_with(".jsonl") => Some(DatasetFormat::Jsonl),
            Some(f) if f.ends_with(".json") => Some(DatasetFormat::Json),
            Some(_) => {
                errors.push(ctx.err(
                    m.pos,
                    "dataset.format",
                    ErrorKind::MissingField,
                    "cannot tell the format from the file name: add `format: json` or `format: jsonl`",
                ));
                None
            }
            None => None,
        },
    };
    let file = file_as_written.as_ref().map(|f| base_dir.join(f));
    if let (Some(file), Some(written), Some(n)) = (&file, &file_as_written, file_node)
        && !file.is_file()
    {
        let why = if file.exists() { "is not a regular file" } else { "not found" };
        errors.push(ctx.err(
            n.pos,
            "dataset.file",
            ErrorKind::Dataset,
            format!("dataset file `{written}` {why} (looked at `{}`)", file.display()),
        ));
    }
    let mut fields = BTreeMap::new();
    let fields_node = keep(&mut errors, m.required(ctx, "dataset", "fields"));
    if let Some(fields_node) = fields_node
        && let Some(entries) = keep(&mut errors, ctx.entries(fields_node, "dataset.fields"))
    {
        for (key, value) in entries {
            match dataset_field(ctx, key, value) {
                Ok(source) => {
                    fields.insert(key.name.clone(), source);
                }
                Err(e) => errors.push(e),
            }
        }
        if entries.is_empty() {
            errors.push(ctx.err(fields_node.pos, "dataset.fields", ErrorKind::MissingField, "map at least one input field"));
        }
    }
    match (file_as_written, file, format, file_node) {
        (Some(written), Some(file), Some(format), Some(file_node)) if errors.is_empty() => {
            Ok(DatasetBinding::new(ctx.file, written, file, format, fields, file_node.pos))
        }
        _ => Err(all_of(errors)),
    }
}

/// One entry of `dataset.fields`: a dotted path, or `{path, join, separator}`.
fn dataset_field(ctx: &Ctx<'_>, key: &Key, value: &Node) -> Result<FieldSource, WorkflowError> {
    let field = format!("dataset.fields.{}", key.name);
    if !yaml::is_ident(&key.name, false) {
        return Err(ctx.err(
            key.pos,
            &field,
            ErrorKind::BadType,
            format!("`{}` is not a valid input field name", key.name),
        ));
    }
    let (path, join, pos) = match &value.value {
        Value::Map(_) => {
            let fm = ctx.map(value, &field, &["path", "join", "separator"])?;
            let p = fm.required(ctx, &field, "path")?;
            let path = ctx.string(p, &format!("{field}.path"))?;
            let join = match fm.get("join") {
                None => None,
                Some(j) => Some(JoinSpec {
                    pattern: ctx.string(j, &format!("{field}.join"))?,
                    separator: match fm.get("separator") {
                        Some(s) => ctx.string(s, &format!("{field}.separator"))?,
                        None => "\n".into(),
                    },
                }),
            };
            if join.is_none() && fm.get("separator").is_some() {
                return Err(ctx.err(
                    fm.pos,
                    &format!("{field}.separator"),
                    ErrorKind::MissingField,
                    "`separator` needs a `join` pattern",
                ));
            }
            (path, join, p.pos)
        }
        _ => (ctx.string(value, &field)?, None, value.pos),
    };
    if path.is_empty() || path.split('.').any(str::is_empty) {
        return Err(ctx.err(
            pos,
            &field,
            ErrorKind::BadType,
            format!("`{path}` is not a dotted path like `a.0.b`"),
        ));
    }
    Ok(FieldSource::new(path, join, pos))
}

fn resolve_id(
    ctx: &Ctx<'_>,
    name: &str,
    pos: Pos,
    field: &str,
    index: &BTreeMap<String, usize>,
    ids: &[&str],
) -> Result<usize, WorkflowError> {
    index.get(name).copied().ok_or_else(|| {
        let hint = closest(name, ids)
            .map(|c| format!(" (did you mean `{c}`?)"))
            .unwrap_or_default();
        ctx.err(
            pos,
            field,
            ErrorKind::UnknownReference,
            format!("unknown node `{name}`{hint}"),
        )
    })
}

fn condition(
    ctx: &Ctx<'_>,
    node: &Node,
    field: &str,
    index: &BTreeMap<String, usize>,
    ids: &[&str],
) -> Result<(Condition, Pos, Pos), WorkflowError> {
    let m = ctx.map(node, field, &["node", "verdict"])?;
    let n = m.required(ctx, field, "node")?;
    let name = ctx.string(n, &format!("{field}.node"))?;
    let target = resolve_id(ctx, &name, n.pos, &format!("{field}.node"), index, ids)?;
    let v = m.required(ctx, field, "verdict")?;
    let verdicts: Vec<String> = ctx
        .string_list(v, &format!("{field}.verdict"))?
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    if verdicts.is_empty() || verdicts.iter().any(String::is_empty) {
        return Err(ctx.err(
            v.pos,
            &format!("{field}.verdict"),
            ErrorKind::BadType,
            "name at least one non-empty verdict",
        ));
    }
    Ok((
        Condition {
            node: target,
            verdicts,
        },
        n.pos,
        v.pos,
    ))
}

fn node(
    ctx: &Ctx<'_>,
    id: &str,
    m: &MapView<'_>,
    index: &BTreeMap<String, usize>,
    ids: &[&str],
    deployments: &BTreeMap<String, DeploymentSpec>,
    declared: Option<&BTreeSet<String>>,
) -> Result<(NodeSpec, NodeLocs), WorkflowError> {
    let field = format!("nodes.{id}");
    let f = |k: &str| join_path(&field, k);
    let mut errors = Vec::new();
    let description = m.get("description").and_then(|d| keep(&mut errors, ctx.string(d, &f("description"))));
    let mut loc = NodeLocs { after_key: m.key_pos("after"), ..NodeLocs::at(m.pos) };

    let mut after = Vec::new();
    if let Some(a) = m.get("after")
        && let Some(names) = keep(&mut errors, ctx.string_list(a, &f("after")))
    {
        for (name, pos) in names {
            let Some(p) = keep(&mut errors, resolve_id(ctx, &name, pos, &f("after"), index, ids)) else { continue };
            if name == id {
                errors.push(ctx.err(
                    pos,
                    &f("after"),
                    ErrorKind::Cycle,
                    format!("node `{id}` cannot come after itself (declare a loop to repeat it)"),
                ));
                continue;
            }
            if !after.contains(&p) {
                after.push(p);
                loc.after.push(pos);
            }
        }
    }
    let when = match m.get("when") {
        None => None,
        Some(w) => match keep(&mut errors, condition(ctx, w, &f("when"), index, ids)) {
            Some((c, pos, vpos)) => {
                loc.when_verdict = Some(vpos);
                if !after.contains(&c.node) {
                    errors.push(ctx.err(
                        pos,
                        &f("when.node"),
                        ErrorKind::UnknownReference,
                        format!("a branch is chosen by a predecessor's result, but `{}` is not in this node's `after`", ids[c.node]),
                    ));
                }
                Some(c)
            }
            None => None,
        },
    };

    let is_tool = m.get("tool").is_some();
    let agent_key = AGENT_KEYS.iter().find(|k| m.get(k).is_some());
    let kind = if is_tool {
        if let Some(k) = agent_key {
            let pos = m.key_pos(k).unwrap_or(m.pos);
            // Which of the two was meant is not known: that is the node's problem, alone.
            errors.push(ctx.err(
                pos,
                &f(k),
                ErrorKind::UnknownField,
                format!("`{k}` belongs to agent nodes, and `{id}` is a tool node"),
            ));
            None
        } else {
            keep(&mut errors, tool_node(ctx, &field, m, &mut loc)).map(NodeKind::Tool)
        }
    } else if agent_key.is_some() {
        if let Some(k) = TOOL_KEYS.iter().find(|k| m.get(k).is_some()) {
            let pos = m.key_pos(k).unwrap_or(m.pos);
            errors.push(ctx.err(
                pos,
                &f(k),
                ErrorKind::UnknownField,
                format!("`{k}` belongs to tool nodes, and `{id}` is an agent node"),
            ));
            None
        } else {
            keep(&mut errors, agent_node(ctx, &field, m, deployments, declared, &mut loc)).map(NodeKind::Agent)
        }
    } else {
        errors.push(ctx.err(
            m.pos,
            &field,
            ErrorKind::MissingField,
            "a node needs `deployment` (an agent) or `tool` (a tool)",
        ));
        None
    };
    match kind {
        Some(kind) if errors.is_empty() => Ok((
            NodeSpec {
                id: id.to_string(),
                description,
                kind,
                after,
                when,
                loop_index: None,
                tool_of: None,
            },
            loc,
        )),
        _ => Err(all_of(errors)),
    }
}

/// Each agent's tools become tool step nodes `AGENT.NAME` after the file's nodes: after the
/// agent, run when its turn calls them (verdict `tool:NAME`).
fn add_tool_steps(nodes: &mut Vec<NodeSpec>, locs: &mut Vec<NodeLocs>) {
    for a in 0..nodes.len() {
        for (k, (tool, loc)) in std::mem::take(&mut locs[a].tools).into_iter().enumerate() {
            let step = nodes.len();
            let agent_id = nodes[a].id.clone();
            let NodeKind::Agent(agent) = &mut nodes[a].kind else { continue };
            let Some(t) = agent.tools.as_mut().and_then(|t| t.tools.get_mut(k)) else { continue };
            t.node = step;
            let (name, description) = (t.name.clone(), t.description.clone());
            nodes.push(NodeSpec {
                id: format!("{agent_id}.{name}"),
                description,
                kind: NodeKind::Tool(tool),
                after: vec![a],
                when: Some(Condition { node: a, verdicts: vec![tool_call_verdict(&name)] }),
                loop_index: None,
                tool_of: Some(a),
            });
            locs.push(loc);
        }
    }
}

/// The loop of each agent's turns (id `AGENT.turns`): body the agent and its tool steps, a new
/// turn while a turn calls a tool, waiting for that tool's run, at most `max_turns` turns.
fn add_turn_loops(nodes: &mut [NodeSpec], loops: &mut Vec<LoopSpec>, file_nodes: usize) {
    for a in 0..file_nodes {
        let NodeKind::Agent(agent) = &nodes[a].kind else { continue };
        let Some(t) = &agent.tools else { continue };
        let steps: Vec<usize> = t.tools.iter().map(|x| x.node).collect();
        let li = loops.len();
        loops.push(LoopSpec {
            id: format!("{}.turns", nodes[a].id),
            description: None,
            body: std::iter::once(a).chain(steps.iter().copied()).collect(),
            entries: vec![a],
            continue_when: Condition { node: a, verdicts: t.tools.iter().map(|x| tool_call_verdict(&x.name)).collect() },
            max_rounds: t.max_turns,
            back_from: steps,
            agent: Some(a),
        });
        for &b in &loops[li].body {
            nodes[b].loop_index = Some(li);
        }
    }
}

fn agent_node(
    ctx: &Ctx<'_>,
    field: &str,
    m: &MapView<'_>,
    deployments: &BTreeMap<String, DeploymentSpec>,
    declared: Option<&BTreeSet<String>>,
    loc: &mut NodeLocs,
) -> Result<AgentNode, WorkflowError> {
    let f = |k: &str| join_path(field, k);
    // Each field is checked whatever the others' problems; a field whose check needs another
    // (the output limit needs the deployment) is checked against what is known.
    let mut errors: Vec<WorkflowError> = Vec::new();
    let members = keep(&mut errors, m.required(ctx, field, "deployment").and_then(|dn| deployment_choice(ctx, dn, &f("deployment"))));
    let (route, deployment, dep) = match members {
        None => (None, String::new(), None),
        Some((route, members)) => {
            let mut known = true;
            for (name, pos, at) in &members {
                if deployments.contains_key(name) {
                    continue;
                }
                known = false;
                if declared.is_none_or(|d| d.contains(name)) {
                    // The deployment's own entry (or `deployments`) is wrong and already reported.
                    errors.push(WorkflowError::Many(Vec::new()));
                    continue;
                }
                let names: Vec<&str> = deployments.keys().map(String::as_str).collect();
                let hint = closest(name, &names).map(|c| format!(" (did you mean `{c}`?)")).unwrap_or_default();
                errors.push(ctx.err(*pos, at, ErrorKind::UnknownReference, format!("unknown deployment `{name}`{hint}")));
            }
            // The node's limits hold on every member: the smallest output limit and context.
            let dep = if known {
                members.iter().filter_map(|(n, _, _)| deployments.get(n)).min_by_key(|d| (d.max_output_tokens, d.max_context))
            } else {
                None
            };
            (route, members.first().map(|m| m.0.clone()).unwrap_or_default(), dep)
        }
    };
    let responder = match m.get("responder") {
        Some(rn) => keep(&mut errors, responder_name(ctx, rn, &f("responder"))),
        None => Some(GENERIC.to_string()),
    };
    let [role, goal, instructions] =
        ["role", "goal", "instructions"].map(|k| m.get(k).and_then(|n| keep(&mut errors, ctx.string(n, &f(k)))));
    let output = m.get("output").and_then(|o| keep(&mut errors, structured_output(ctx, o, &f("output"))));
    if let Some(responder) = &responder
        && crate::responder::is_judge(responder)
        && (m.get("output").is_none() || output.is_some())
    {
        let boolean = output
            .as_ref()
            .and_then(|o| o.schema.property(o.verdict.as_deref()?))
            .is_some_and(|p| matches!(p, OutputSchema::Boolean));
        if !boolean {
            errors.push(ctx.err(
                m.key_pos("output").or(m.key_pos("responder")).unwrap_or(m.pos),
                &f("output"),
                ErrorKind::BadType,
                format!("responder `{responder}` is a judge: it answers with a structured `output` whose `verdict` names a boolean property (its decision)"),
            ));
        }
    }
    let tools = match m.get("tools") {
        Some(tn) => keep(&mut errors, agent_tools(ctx, field, m, tn, loc)),
        None => {
            if let Some(k) = ["max_turns", "turns"].into_iter().find(|k| m.get(k).is_some()) {
                errors.push(ctx.err(
                    m.key_pos(k).unwrap_or(m.pos),
                    &f(k),
                    ErrorKind::MissingField,
                    format!("`{k}` bounds an agent's tool loop: declare the `tools` it may call"),
                ));
            }
            None
        }
    };
    if m.get("tools").is_some() {
        if let Some(pos) = m.key_pos("output") {
            errors.push(ctx.err(
                pos,
                &f("output"),
                ErrorKind::BadType,
                "an agent with `tools` answers in free text (a last line `Action: NAME` calls a tool): a structured `output` is not supported with `tools`",
            ));
        }
        if let Some(pos) = m.key_pos("next_rounds") {
            errors.push(ctx.err(
                pos,
                &f("next_rounds"),
                ErrorKind::BadLoop,
                "an agent with `tools` has turns, not loop rounds: each turn's prompt is the previous one's + its answer + the observation, and its `responder` answers every turn",
            ));
        }
    }
    let tools_tail = tools.as_ref().map(tools_instruction);
    let pn = keep(&mut errors, m.required(ctx, field, "prompt"));
    if let Some(pn) = pn {
        loc.prompt = Some(pn.pos);
    }
    let prompt = pn.and_then(|pn| {
        keep(
            &mut errors,
            agent_prompt(
                ctx,
                pn,
                &f("prompt"),
                role.as_deref(),
                goal.as_deref(),
                instructions.as_deref(),
                output.as_ref(),
                tools_tail.as_deref(),
            ),
        )
    });
    let next_rounds = match m.get("next_rounds") {
        None => None,
        Some(v) => {
            let vf = f("next_rounds");
            loc.next_rounds = Some(v.pos);
            match ctx.map_all(v, &vf, &["prompt", "responder"], &mut errors) {
                Err(e) => {
                    errors.push(e);
                    None
                }
                Ok(vm) => {
                    let vp = keep(&mut errors, vm.required(ctx, &vf, "prompt"));
                    if let Some(vp) = vp {
                        loc.next_prompt = Some(vp.pos);
                    }
                    let prompt = vp.and_then(|vp| {
                        keep(
                            &mut errors,
                            agent_prompt(
                                ctx,
                                vp,
                                &join_path(&vf, "prompt"),
                                role.as_deref(),
                                goal.as_deref(),
                                instructions.as_deref(),
                                output.as_ref(),
                                None,
                            ),
                        )
                    });
                    let later = match vm.get("responder") {
                        Some(rn) => keep(&mut errors, responder_name(ctx, rn, &join_path(&vf, "responder"))),
                        None => responder.clone(),
                    };
                    prompt.zip(later).map(|(prompt, responder)| RoundVariant { prompt, responder })
                }
            }
        }
    };
    // The output limit; where it is wrong, the deployment's stands in for the checks after it.
    let max_output_tokens = match m.get("max_output_tokens") {
        None => dep.map(|d| d.max_output_tokens),
        Some(n) => match keep(&mut errors, ctx.u32(n, &f("max_output_tokens"))) {
            Some(v) if v != 0 && dep.is_none_or(|d| v <= d.max_output_tokens) => Some(v),
            Some(v) => {
                let message = match dep {
                    Some(d) => format!("max_output_tokens {v} must be between 1 and deployment `{}`'s max_output_tokens {}", d.name, d.max_output_tokens),
                    None => format!("max_output_tokens {v} must be at least 1"),
                };
                errors.push(ctx.err(n.pos, &f("max_output_tokens"), ErrorKind::OutputLimit, message));
                dep.map(|d| d.max_output_tokens)
            }
            None => dep.map(|d| d.max_output_tokens),
        },
    };
    if let (Some(o), Some(limit)) = (&output, max_output_tokens) {
        // Sizes measured before anything is built: a smallest answer, or one the minimum
        // lengths alone force, past MAX_SMALLEST_ANSWER_BYTES is refused as it is (building and
        // tokenizing it could take gigabytes); only then is the smallest answer tokenized.
        let bytes = o.schema.smallest_json_bytes();
        let padded = o.schema.largest_padded_json_bytes();
        let problem = if bytes > MAX_SMALLEST_ANSWER_BYTES {
            Some(format!("the schema's smallest answer is {bytes} bytes of JSON, above the {MAX_SMALLEST_ANSWER_BYTES} an answer may take"))
        } else if padded > MAX_SMALLEST_ANSWER_BYTES {
            Some(format!(
                "an answer this schema allows takes up to {padded} bytes of JSON by its minimum lengths alone (arrays at their most items), above the {MAX_SMALLEST_ANSWER_BYTES} an answer may take: lower maxItems or minLength"
            ))
        } else {
            let smallest = crate::tokens::count(&o.schema.smallest().to_string()) as u32;
            (smallest > limit).then(|| format!("the schema's smallest answer is {smallest} tokens, above max_output_tokens {limit}"))
        };
        if let Some(message) = problem {
            errors.push(ctx.err(m.key_pos("output").unwrap_or(m.pos), &f("output.schema"), ErrorKind::OutputLimit, message));
        }
    }
    // Without a known limit the distributions' means are checked against none.
    let limit = max_output_tokens.unwrap_or(u32::MAX);
    let default_cv = default_output_tokens(limit).cv;
    let output_tokens = match m.get("output_tokens") {
        None => Some(default_output_tokens(limit)),
        Some(on) => keep(&mut errors, length_dist(ctx, on, &f("output_tokens"), default_cv, (limit, "max_output_tokens"))),
    };
    let thinking_tokens = match m.get("thinking_tokens") {
        None => Some(None),
        Some(tn) => keep(&mut errors, length_dist(ctx, tn, &f("thinking_tokens"), default_cv, (limit, "max_output_tokens"))).map(Some),
    };
    match (responder, prompt, max_output_tokens, output_tokens, thinking_tokens) {
        (Some(responder), Some(prompt), Some(max_output_tokens), Some(output_tokens), Some(thinking_tokens)) if errors.is_empty() => {
            Ok(AgentNode {
                deployment,
                route,
                role,
                prompt,
                max_output_tokens,
                output_tokens,
                thinking_tokens,
                responder,
                next_rounds,
                output,
                tools,
            })
        }
        _ => Err(all_of(errors)),
    }
}

/// `deployment: NAME`, or a routed choice `deployment: {route: [NAME, ...]}` that ORACLE's
/// router binds per session (the first member is what static analysis plans with): the route,
/// if any, and each member with its position and field path.
#[allow(clippy::type_complexity)]
fn deployment_choice(
    ctx: &Ctx<'_>,
    dn: &Node,
    fd: &str,
) -> Result<(Option<Vec<String>>, Vec<(String, Pos, String)>), WorkflowError> {
    match &dn.value {
        Value::Map(_) => {
            let rm = ctx.map(dn, fd, &["route"])?;
            let rf = join_path(fd, "route");
            let rn = rm.required(ctx, fd, "route")?;
            let items = ctx.seq(rn, &rf)?;
            if items.is_empty() {
                return Err(ctx.err(rn.pos, &rf, ErrorKind::BadType, "a route needs at least one deployment"));
            }
            let mut members: Vec<(String, Pos, String)> = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let name = ctx.string(item, &format!("{rf}[{i}]"))?;
                if members.iter().any(|(n, _, _)| *n == name) {
                    return Err(ctx.err(item.pos, &format!("{rf}[{i}]"), ErrorKind::DuplicateId, format!("deployment `{name}` is twice in the route")));
                }
                members.push((name, item.pos, format!("{rf}[{i}]")));
            }
            Ok((Some(members.iter().map(|(n, _, _)| n.clone()).collect::<Vec<_>>()), members))
        }
        _ => Ok((None, vec![(ctx.string(dn, fd)?, dn.pos, fd.to_string())])),
    }
}

/// `tools:` (each a tool the agent may call: `{name, tool, description, inputs, timeout_s}`,
/// `tool` defaulting to `name`; a bare string is `{name: STRING}`), `max_turns:` (required)
/// and `turns:`. The tools' step nodes are pushed on `loc.tools`; their indices are set when
/// they are added.
fn agent_tools(
    ctx: &Ctx<'_>,
    field: &str,
    m: &MapView<'_>,
    tn: &Node,
    loc: &mut NodeLocs,
) -> Result<AgentTools, WorkflowError> {
    let f = |k: &str| join_path(field, k);
    let mut errors = Vec::new();
    let items = ctx.seq(tn, &f("tools"))?;
    if items.is_empty() {
        errors.push(ctx.err(tn.pos, &f("tools"), ErrorKind::MissingField, "list at least one tool the agent may call"));
    }
    let mut tools: Vec<AgentTool> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if let Some((tool, node, tloc)) = keep(&mut errors, agent_tool(ctx, &f("tools"), i, item, &mut names)) {
            tools.push(tool);
            loc.tools.push((node, tloc));
        }
    }
    let max_turns = match m.get("max_turns") {
        None => {
            errors.push(ctx.err(
                m.pos,
                &f("max_turns"),
                ErrorKind::BadLoop,
                format!("an agent with tools needs a bound: add `max_turns` (its model turns, 1 to {MAX_TURNS})"),
            ));
            None
        }
        Some(n) => match keep(&mut errors, ctx.u32(n, &f("max_turns"))) {
            Some(v) if v == 0 || v > MAX_TURNS => {
                errors.push(ctx.err(n.pos, &f("max_turns"), ErrorKind::BadLoop, format!("max_turns {v} must be between 1 and {MAX_TURNS}")));
                None
            }
            v => v,
        },
    };
    let bound = max_turns.unwrap_or(MAX_TURNS);
    let turns = match m.get("turns") {
        None => Some(default_turns(bound)),
        Some(n) => keep(&mut errors, length_dist(ctx, n, &f("turns"), default_turns(bound).cv, (bound, "max_turns"))),
    };
    match (max_turns, turns) {
        (Some(max_turns), Some(turns)) if errors.is_empty() => Ok(AgentTools { tools, max_turns, turns }),
        _ => Err(all_of(errors)),
    }
}

/// One entry of an agent's `tools:` (`names`: the tools declared before it, this one's added).
fn agent_tool(
    ctx: &Ctx<'_>,
    tools_field: &str,
    i: usize,
    item: &Node,
    names: &mut Vec<String>,
) -> Result<(AgentTool, ToolNode, NodeLocs), WorkflowError> {
    let at = format!("{tools_field}[{i}]");
    let mut errors = Vec::new();
    let (em, name_node) = match &item.value {
        Value::Str(_) => (MapView { entries: &[], pos: item.pos }, item),
        _ => {
            let em = ctx.map_all(item, &at, AGENT_TOOL_KEYS, &mut errors)?;
            match em.required(ctx, &at, "name") {
                Ok(nn) => (em, nn),
                Err(e) => {
                    errors.push(e);
                    return Err(all_of(errors));
                }
            }
        }
    };
    let name = match ctx.string(name_node, &join_path(&at, "name")) {
        Ok(n) => n,
        Err(e) => {
            errors.push(e);
            return Err(all_of(errors));
        }
    };
    if !yaml::is_ident(&name, false) {
        errors.push(ctx.err(
            name_node.pos,
            &join_path(&at, "name"),
            ErrorKind::BadType,
            format!("`{name}` is not a valid tool name (letters, digits, `_`, `-`)"),
        ));
        return Err(all_of(errors));
    }
    let ef = format!("{tools_field}.{name}");
    if names.contains(&name) {
        errors.push(ctx.err(
            name_node.pos,
            &join_path(&ef, "name"),
            ErrorKind::DuplicateId,
            format!("the agent declares tool `{name}` twice"),
        ));
    }
    names.push(name.clone());
    let (tool_node, tool_field) = match em.get("tool") {
        Some(t) => (t, join_path(&ef, "tool")),
        None if em.entries.is_empty() => (item, ef.clone()),
        None => (name_node, join_path(&ef, "name")),
    };
    let mut tloc = NodeLocs { path: Some(ef.clone()), ..NodeLocs::at(item.pos) };
    let node = keep(&mut errors, tool_spec(ctx, &ef, &em, tool_node, &tool_field, false, &mut tloc));
    let description = em.get("description").and_then(|d| keep(&mut errors, ctx.string(d, &join_path(&ef, "description"))));
    match node {
        Some(node) if errors.is_empty() => Ok((AgentTool { name, description, node: usize::MAX }, node, tloc)),
        _ => Err(all_of(errors)),
    }
}

/// What the prompt of an agent with tools ends with: the tools and how to call them.
fn tools_instruction(t: &AgentTools) -> String {
    let mut out = String::from("\n\nYou can call these tools:");
    for tool in &t.tools {
        match &tool.description {
            Some(d) => out.push_str(&format!("\n- `{}`: {}", tool.name, d.trim())),
            None => out.push_str(&format!("\n- `{}`", tool.name)),
        }
    }
    out.push_str(&format!(
        "\nTo call one, end your answer with a line `{}NAME`; its result comes back as an observation. An answer without such a line is your final answer.",
        super::ACTION_PREFIX
    ));
    out
}

/// Largest coefficient of variation a length distribution may state: the log-normal's σ² is
/// ln(1 + cv²), and far beyond this every draw is 0 or the limit (cv 1e300 overflowed to NaN).
pub const MAX_LENGTH_CV: f64 = 10.0;

/// A `{mean, cv}` length distribution (`output_tokens:`, `thinking_tokens:` in tokens, `turns:`
/// in turns): the mean at least 1 and at most `limit` (every draw is cut at the limit, so a
/// larger mean describes nothing the run can produce), the coefficient of variation in
/// [0, [`MAX_LENGTH_CV`]] (`default_cv` when absent).
fn length_dist(
    ctx: &Ctx<'_>,
    node: &Node,
    field: &str,
    default_cv: f64,
    limit: (u32, &str),
) -> Result<LengthDist, WorkflowError> {
    let mut errors = Vec::new();
    let om = ctx.map_all(node, field, &["mean", "cv"], &mut errors)?;
    let mean_node = keep(&mut errors, om.required(ctx, field, "mean"));
    let mean = mean_node.and_then(|n| keep(&mut errors, ctx.f64(n, &format!("{field}.mean"))));
    let cv = match om.get("cv") {
        Some(cv_node) => match keep(&mut errors, ctx.f64(cv_node, &format!("{field}.cv"))) {
            Some(cv) if !(0.0..=MAX_LENGTH_CV).contains(&cv) => {
                errors.push(ctx.err(
                    cv_node.pos,
                    &format!("{field}.cv"),
                    ErrorKind::BadType,
                    format!("cv {} must be between 0 and {MAX_LENGTH_CV}", show_number(cv)),
                ));
                None
            }
            cv => cv,
        },
        None => Some(default_cv),
    };
    let (limit, limit_name) = limit;
    if let (Some(mean), Some(n)) = (mean, mean_node)
        && !(1.0..=f64::from(limit.max(1))).contains(&mean)
    {
        errors.push(ctx.err(
            n.pos,
            &format!("{field}.mean"),
            ErrorKind::BadType,
            format!("mean {} must be between 1 and {limit_name} ({limit})", show_number(mean)),
        ));
    }
    match (mean, cv) {
        (Some(mean), Some(cv)) if errors.is_empty() => Ok(LengthDist { mean, cv }),
        _ => Err(all_of(errors)),
    }
}

/// A number as a reader wants it in a message: as written when short, in scientific notation
/// when huge or tiny (1e300 is not printed as 301 digits).
fn show_number(x: f64) -> String {
    if x != 0.0 && !(1e-6..1e9).contains(&x.abs()) { format!("{x:e}") } else { format!("{x}") }
}

fn responder_name(ctx: &Ctx<'_>, rn: &Node, field: &str) -> Result<String, WorkflowError> {
    let responder = ctx.string(rn, field)?;
    if !RESPONDERS.contains(&responder.as_str()) {
        let hint = closest(&responder, RESPONDERS)
            .map(|c| format!(" (did you mean `{c}`?)"))
            .unwrap_or_default();
        return Err(ctx.err(
            rn.pos,
            field,
            ErrorKind::UnknownResponder,
            format!(
                "unknown responder `{responder}`{hint}; known: {}",
                RESPONDERS.join(", ")
            ),
        ));
    }
    Ok(responder)
}

/// `output: {schema: …, verdict: FIELD}`.
fn structured_output(ctx: &Ctx<'_>, node: &Node, field: &str) -> Result<StructuredOutput, WorkflowError> {
    let mut errors = Vec::new();
    let om = ctx.map_all(node, field, &["schema", "verdict"], &mut errors)?;
    let schema = keep(&mut errors, om.required(ctx, field, "schema")).and_then(|sn| {
        keep(
            &mut errors,
            OutputSchema::from_json(&yaml::to_json(sn)).map_err(|e| {
                let path = if e.path.is_empty() { format!("{field}.schema") } else { format!("{field}.schema.{}", e.path) };
                ctx.err(sn.pos, &path, ErrorKind::BadType, e.message)
            }),
        )
    });
    let verdict = match om.get("verdict") {
        None => None,
        Some(vn) => {
            let name = keep(&mut errors, ctx.string(vn, &join_path(field, "verdict")));
            // Checked against the schema when the schema reads.
            if let (Some(name), Some(schema)) = (&name, &schema) {
                let problem = match schema.property(name) {
                    None => Some(format!("`{name}` is not a top-level property of the schema")),
                    Some(_) if !schema.is_required(name) => Some(format!("`{name}` must be in the schema's `required` list (a verdict needs a value)")),
                    Some(p) if p.verdict_values().is_none() => {
                        Some(format!("`{name}` must be a boolean or a string `enum` so that its values can be named in `when`"))
                    }
                    Some(_) => None,
                };
                if let Some(message) = problem {
                    errors.push(ctx.err(vn.pos, &join_path(field, "verdict"), ErrorKind::BadType, message));
                }
            }
            name
        }
    };
    match schema {
        Some(schema) if errors.is_empty() => Ok(StructuredOutput { schema, verdict }),
        _ => Err(all_of(errors)),
    }
}

/// The prompt an agent sends: its role, goal and instructions, the `prompt:` template, and for
/// a structured output the instruction to answer with JSON of its schema (for an agent with
/// tools, the tools and how to call them).
#[allow(clippy::too_many_arguments)]
fn agent_prompt(
    ctx: &Ctx<'_>,
    pn: &Node,
    field: &str,
    role: Option<&str>,
    goal: Option<&str>,
    instructions: Option<&str>,
    output: Option<&StructuredOutput>,
    tools: Option<&str>,
) -> Result<Template, WorkflowError> {
    let text = ctx.string(pn, field)?;
    let body = Template::parse(&text).map_err(|e| ctx.err(pn.pos, field, ErrorKind::Template, e.to_string()))?;
    let mut head = String::new();
    if let Some(r) = role {
        head.push_str(&format!("You are {}.\n", r.trim().trim_end_matches('.')));
    }
    if let Some(g) = goal {
        head.push_str(&format!("Your goal: {}\n", g.trim()));
    }
    if let Some(i) = instructions {
        head.push_str(i.trim_end());
        head.push('\n');
    }
    if !head.is_empty() {
        head.push('\n');
    }
    let tail = output
        .map(|o| format!("\n\nAnswer with only a JSON value that satisfies this JSON Schema:\n{}", o.schema.to_json()))
        .or(tools.map(str::to_string));
    if head.is_empty() && tail.is_none() {
        return Ok(body);
    }
    let TemplateBody::Text(segments) = body.body else {
        return Ok(body);
    };
    let mut all = Vec::with_capacity(segments.len() + 2);
    if !head.is_empty() {
        all.push(Segment::Text(head.clone()));
    }
    all.extend(segments);
    if let Some(t) = &tail {
        all.push(Segment::Text(t.clone()));
    }
    Ok(Template { source: format!("{head}{text}{}", tail.unwrap_or_default()), body: TemplateBody::Text(all) })
}

fn tool_node(
    ctx: &Ctx<'_>,
    field: &str,
    m: &MapView<'_>,
    loc: &mut NodeLocs,
) -> Result<ToolNode, WorkflowError> {
    let tn = m.required(ctx, field, "tool")?;
    tool_spec(ctx, field, m, tn, &join_path(field, "tool"), true, loc)
}

/// A tool call's spec: the tool named by `tn` (a built-in or a registered custom tool), its
/// `inputs` (required in a tool node; in an agent's tool entry absent means none) and
/// `timeout_s`, read from `m`.
fn tool_spec(
    ctx: &Ctx<'_>,
    field: &str,
    m: &MapView<'_>,
    tn: &Node,
    tool_field: &str,
    inputs_required: bool,
    loc: &mut NodeLocs,
) -> Result<ToolNode, WorkflowError> {
    let f = |k: &str| join_path(field, k);
    let mut errors = Vec::new();
    let timeout_s = match m.get("timeout_s") {
        None => Some(None),
        Some(t) => match keep(&mut errors, ctx.f64(t, &f("timeout_s"))) {
            Some(v) if v <= 0.0 => {
                errors.push(ctx.err(t.pos, &f("timeout_s"), ErrorKind::BadType, format!("timeout_s {v} must be positive")));
                None
            }
            v => v.map(Some),
        },
    };
    let Some(tool) = keep(&mut errors, ctx.string(tn, tool_field)) else { return Err(all_of(errors)) };
    // A built-in tool, else a custom one the embedding program registered.
    let io: Option<(Vec<String>, Vec<String>)> = TOOL_INPUTS
        .iter()
        .find(|(t, _, _)| *t == tool)
        .map(|(_, r, o)| (r.iter().map(|s| s.to_string()).collect(), o.iter().map(|s| s.to_string()).collect()))
        .or_else(|| switchyard_tools::custom::spec(&tool).map(|s| (s.required, s.optional)));
    let Some((required, optional)) = io else {
        let known = switchyard_tools::custom::all_names();
        let known_refs: Vec<&str> = known.iter().map(String::as_str).collect();
        let hint = closest(&tool, &known_refs)
            .map(|c| format!(" (did you mean `{c}`?)"))
            .unwrap_or_default();
        errors.push(ctx.err(
            tn.pos,
            tool_field,
            ErrorKind::UnknownTool,
            format!("unknown tool `{tool}`{hint}; known: {}", known.join(", ")),
        ));
        return Err(all_of(errors));
    };
    let in_node = if inputs_required { keep(&mut errors, m.required(ctx, field, "inputs")) } else { m.get("inputs") };
    let mut allowed: Vec<&str> = required.iter().map(String::as_str).collect();
    allowed.extend(optional.iter().map(String::as_str));
    // Inputs the tool does not take are reported (each with the closest it does), the rest read.
    // (Which inputs are missing is known once `inputs` reads as a mapping, or is rightly absent.)
    let mut inputs_known = in_node.is_some() || !inputs_required;
    let entries: &[(Key, Node)] = match in_node {
        Some(n) => match ctx.map_all(n, &f("inputs"), &allowed, &mut errors) {
            Ok(view) => view.entries,
            Err(e) => {
                errors.push(e);
                inputs_known = false;
                &[]
            }
        },
        None => &[],
    };
    let mut inputs = BTreeMap::new();
    for (Key { name, .. }, v) in entries {
        if !allowed.contains(&name.as_str()) {
            continue;
        }
        let vf = f(&format!("inputs.{name}"));
        let input = || -> Result<Template, WorkflowError> {
            let parse_one = |n: &Node, fld: &str| -> Result<Template, WorkflowError> {
                let s = ctx.string(n, fld)?;
                Template::parse(&s).map_err(|e| ctx.err(n.pos, fld, ErrorKind::Template, e.to_string()))
            };
            let t = match &v.value {
                Value::Seq(items) => Template::list(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, n)| parse_one(n, &format!("{vf}[{i}]")))
                        .collect::<Result<Vec<_>, _>>()?,
                ),
                _ => parse_one(v, &vf)?,
            };
            // What the shell tool may read is the workflow's declaration, never a model's answer.
            if tool == switchyard_tools::shell::NAME && name == "reads" && !t.references().is_empty() {
                return Err(ctx.err(
                    v.pos,
                    &vf,
                    ErrorKind::Template,
                    "the paths `shell` may read must be written literally, not rendered from references",
                ));
            }
            if tool == switchyard_tools::shell::NAME && name == "reads" {
                let items: Vec<(&Node, String)> = match &v.value {
                    Value::Seq(items) => items.iter().enumerate().map(|(i, n)| (n, format!("{vf}[{i}]"))).collect(),
                    _ => vec![(v, vf.clone())],
                };
                for (n, fld) in items {
                    let path = ctx.string(n, &fld)?;
                    if let Err(why) = switchyard_tools::shell::checked_read(&path) {
                        return Err(ctx.err(n.pos, &fld, ErrorKind::BadType, why.to_string()));
                    }
                }
            }
            Ok(t)
        };
        if let Some(t) = keep(&mut errors, input()) {
            loc.inputs.insert(name.clone(), v.pos);
            inputs.insert(name.clone(), t);
        }
    }
    for r in &required {
        if inputs_known && !entries.iter().any(|(k, _)| k.name == *r) {
            errors.push(ctx.err(
                in_node.map_or(m.pos, |n| n.pos),
                &f(&format!("inputs.{r}")),
                ErrorKind::MissingField,
                format!("tool `{tool}` needs input `{r}`"),
            ));
        }
    }
    match timeout_s {
        Some(timeout_s) if errors.is_empty() => Ok(ToolNode { tool, inputs, timeout_s }),
        _ => Err(all_of(errors)),
    }
}

/// The declared loops that read, with the position of each in the file; every problem of each
/// loop is pushed on `errors`, and the nodes a loop that does not read names go in `broken`.
#[allow(clippy::too_many_arguments)]
fn loops(
    ctx: &Ctx<'_>,
    node: &Node,
    index: &BTreeMap<String, usize>,
    ids: &[&str],
    nodes: &mut [NodeSpec],
    conditions: &mut Vec<(String, Pos, Condition)>,
    broken: &mut BTreeSet<usize>,
    errors: &mut Vec<WorkflowError>,
) -> (Vec<LoopSpec>, Vec<Pos>) {
    let mut out: Vec<LoopSpec> = Vec::new();
    let mut positions = Vec::new();
    let Some(items) = keep(errors, ctx.seq(node, "loops")) else { return (out, positions) };
    let mut seen_ids: BTreeSet<String> = BTreeSet::new();
    for (li, l) in items.iter().enumerate() {
        let mut problems = Vec::new();
        // Named by its id as soon as it has a readable one (as nodes are).
        let field0 = match &l.value {
            Value::Map(entries) => match entries.iter().find(|(k, _)| k.name == "id").map(|(_, v)| &v.value) {
                Some(Value::Str(id)) if yaml::is_ident(id, false) => format!("loops.{id}"),
                _ => format!("loops[{li}]"),
            },
            _ => format!("loops[{li}]"),
        };
        let m = match ctx.map_all(l, &field0, LOOP_KEYS, &mut problems) {
            Ok(m) => m,
            Err(e) => {
                errors.extend(problems);
                errors.push(e);
                continue;
            }
        };
        let id = keep(&mut problems, m.required(ctx, &field0, "id"))
            .and_then(|idn| keep(&mut problems, ctx.ident(idn, &format!("{field0}.id"), false)).map(|id| (id, idn.pos)));
        let field = id.as_ref().map_or(field0.clone(), |(id, _)| format!("loops.{id}"));
        if let Some((id, pos)) = &id
            && !seen_ids.insert(id.clone())
        {
            problems.push(ctx.err(*pos, &format!("{field}.id"), ErrorKind::DuplicateId, format!("duplicate loop id `{id}`")));
        }
        let description = m.get("description").and_then(|d| keep(&mut problems, ctx.string(d, &format!("{field}.description"))));
        let mut body: Vec<usize> = Vec::new();
        let before_body = problems.len();
        let bn = keep(&mut problems, m.required(ctx, &field, "body"));
        if let Some(bn) = bn
            && let Some(names) = keep(&mut problems, ctx.string_list(bn, &format!("{field}.body")))
        {
            for (name, pos) in names {
                let Some(n) = keep(&mut problems, resolve_id(ctx, &name, pos, &format!("{field}.body"), index, ids)) else { continue };
                if matches!(&nodes[n].kind, NodeKind::Agent(a) if a.tools.is_some()) {
                    problems.push(ctx.err(
                        pos,
                        &format!("{field}.body"),
                        ErrorKind::BadLoop,
                        format!("`{name}` calls tools: its turns are a loop of their own, and loops do not nest"),
                    ));
                    continue;
                }
                if body.contains(&n) {
                    problems.push(ctx.err(pos, &format!("{field}.body"), ErrorKind::BadLoop, format!("`{name}` is listed twice")));
                    continue;
                }
                if let Some(other) = nodes[n].loop_index {
                    problems.push(ctx.err(
                        pos,
                        &format!("{field}.body"),
                        ErrorKind::BadLoop,
                        format!("`{name}` is already in loop `{}` (loops may not nest or overlap)", out[other].id),
                    ));
                    continue;
                }
                body.push(n);
            }
            if body.is_empty() && problems.is_empty() {
                problems.push(ctx.err(bn.pos, &format!("{field}.body"), ErrorKind::BadLoop, "a loop body needs at least one node"));
            }
        }
        body.sort_unstable();
        // Whether the continue node is in the body is known once every body entry reads.
        let body_read = problems.len() == before_body;
        let continue_when = keep(&mut problems, m.required(ctx, &field, "continue_when"))
            .and_then(|cn| keep(&mut problems, condition(ctx, cn, &format!("{field}.continue_when"), index, ids)));
        if let Some((c, cpos, vpos)) = &continue_when {
            conditions.push((format!("{field}.continue_when.verdict"), *vpos, c.clone()));
            if body_read && !body.contains(&c.node) {
                problems.push(ctx.err(
                    *cpos,
                    &format!("{field}.continue_when.node"),
                    ErrorKind::BadLoop,
                    format!("`{}` is not in the loop body", ids[c.node]),
                ));
            }
        }
        let max_rounds = match m.get("max_rounds") {
            None => {
                problems.push(ctx.err(
                    m.pos,
                    &format!("{field}.max_rounds"),
                    ErrorKind::BadLoop,
                    "a loop needs a bound: add `max_rounds` (at least 1)",
                ));
                None
            }
            Some(r) => match keep(&mut problems, ctx.u32(r, &format!("{field}.max_rounds"))) {
                Some(v) if v == 0 || v > super::MAX_LOOP_ROUNDS => {
                    problems.push(ctx.err(
                        r.pos,
                        &format!("{field}.max_rounds"),
                        ErrorKind::BadLoop,
                        format!("max_rounds {v} must be between 1 and {}", super::MAX_LOOP_ROUNDS),
                    ));
                    None
                }
                Some(v) => {
                    // Over all the workflow's loops: what one session may create.
                    let activations = u64::from(v) * body.len() as u64;
                    let earlier: u64 = out.iter().map(|l| u64::from(l.max_rounds) * l.body.len() as u64).sum();
                    if earlier + activations > super::MAX_LOOP_ACTIVATIONS {
                        let others = if earlier > 0 { format!(" (with the {earlier} of the loops before it)") } else { String::new() };
                        problems.push(ctx.err(
                            r.pos,
                            &format!("{field}.max_rounds"),
                            ErrorKind::BadLoop,
                            format!(
                                "max_rounds {v} × {} body nodes is {activations} activations a session may create{others}; at most {} in all",
                                body.len(),
                                super::MAX_LOOP_ACTIVATIONS
                            ),
                        ));
                    }
                    Some(v)
                }
                None => None,
            },
        };
        match (id, continue_when, max_rounds) {
            (Some((id, _)), Some((continue_when, ..)), Some(max_rounds)) if problems.is_empty() => {
                for &b in &body {
                    nodes[b].loop_index = Some(out.len());
                }
                positions.push(l.pos);
                out.push(LoopSpec {
                    id,
                    description,
                    body,
                    entries: Vec::new(),
                    back_from: vec![continue_when.node],
                    continue_when,
                    max_rounds,
                    agent: None,
                });
            }
            _ => {
                broken.extend(body);
                errors.extend(problems);
            }
        }
    }
    (out, positions)
}

/// Kahn's algorithm, smallest file index first; a leftover means a cycle, which is named.
fn topological_order(
    ctx: &Ctx<'_>,
    nodes: &[NodeSpec],
    locs: &[NodeLocs],
) -> Result<Vec<usize>, WorkflowError> {
    let n = nodes.len();
    let mut indegree: Vec<usize> = nodes.iter().map(|x| x.after.len()).collect();
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, x) in nodes.iter().enumerate() {
        for &p in &x.after {
            succ[p].push(i);
        }
    }
    let mut ready: BTreeSet<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &s in &succ[i] {
            indegree[s] -= 1;
            if indegree[s] == 0 {
                ready.insert(s);
            }
        }
    }
    if order.len() == n {
        return Ok(order);
    }
    // Every leftover node has a leftover predecessor: walk predecessors until one repeats.
    let Some(start) = (0..n).find(|&i| indegree[i] > 0) else {
        return Ok(order);
    };
    let mut path = vec![start];
    let mut cur = start;
    let cycle = loop {
        let Some(&p) = nodes[cur].after.iter().find(|&&p| indegree[p] > 0) else {
            break vec![start];
        };
        if let Some(at) = path.iter().position(|&x| x == p) {
            let mut c: Vec<usize> = path[at..].to_vec();
            c.reverse(); // now in edge direction: c[0] → c[1] → …
            break c;
        }
        path.push(p);
        cur = p;
    };
    // Report at the first node (in file order) of the cycle, on its `after` entry naming its
    // predecessor in the cycle.
    let k = (0..cycle.len()).min_by_key(|&k| cycle[k]).unwrap_or(0);
    let node = cycle[k];
    let pred = cycle[(k + cycle.len() - 1) % cycle.len()];
    let pos = nodes[node]
        .after
        .iter()
        .position(|&p| p == pred)
        .and_then(|j| locs[node].after.get(j).copied())
        .or(locs[node].after_key)
        .unwrap_or(locs[node].pos);
    let mut names: Vec<&str> = (0..cycle.len())
        .map(|j| nodes[cycle[(k + j) % cycle.len()]].id.as_str())
        .collect();
    names.push(&nodes[node].id);
    Err(ctx.err(
        pos,
        &format!("nodes.{}.after", nodes[node].id),
        ErrorKind::Cycle,
        format!(
            "cycle {} is not a declared loop (repeat work with a `loops:` entry: body, continue_when, max_rounds)",
            names.join(" → ")
        ),
    ))
}

/// Entries, convexity and "every body node leads to the continue node": the first problem of
/// each loop (`positions`: where each of the declared loops is).
fn check_loops(
    ctx: &Ctx<'_>,
    positions: &[Pos],
    nodes: &[NodeSpec],
    loops: &mut [LoopSpec],
) -> Vec<WorkflowError> {
    let n = nodes.len();
    // descendants along `after` edges
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, x) in nodes.iter().enumerate() {
        for &p in &x.after {
            succ[p].push(i);
        }
    }
    let reach = |from: usize| -> Vec<bool> {
        let mut seen = vec![false; n];
        let mut stack = vec![from];
        while let Some(v) = stack.pop() {
            for &s in &succ[v] {
                if !seen[s] {
                    seen[s] = true;
                    stack.push(s);
                }
            }
        }
        seen
    };
    let mut errors = Vec::new();
    'each: for (li, l) in loops.iter_mut().enumerate() {
        if l.agent.is_some() {
            // An agent's turns: built well-formed by the loader.
            continue;
        }
        let pos = positions.get(li).copied().unwrap_or_default();
        let field = format!("loops.{}.body", l.id);
        let in_body = |x: usize| nodes[x].loop_index == Some(li);
        l.entries = l
            .body
            .iter()
            .copied()
            .filter(|&b| !nodes[b].after.iter().any(|&p| in_body(p)))
            .collect();
        let reaches: Vec<Vec<bool>> = l.body.iter().map(|&b| reach(b)).collect();
        for (bi, &b) in l.body.iter().enumerate() {
            if b != l.continue_when.node && !reaches[bi][l.continue_when.node] {
                errors.push(ctx.err(
                    pos,
                    &field,
                    ErrorKind::BadLoop,
                    format!(
                        "body node `{}` does not lead to `{}` (the continue_when node); every body node must come before it",
                        nodes[b].id, nodes[l.continue_when.node].id
                    ),
                ));
                continue 'each;
            }
            for &p in &nodes[b].after {
                if in_body(p) {
                    continue;
                }
                if let Some((oi, _)) = l.body.iter().enumerate().find(|(oi, _)| reaches[*oi][p]) {
                    errors.push(ctx.err(
                        pos,
                        &field,
                        ErrorKind::BadLoop,
                        format!(
                            "`{}` runs between body nodes `{}` and `{}` but is not in the body",
                            nodes[p].id, nodes[l.body[oi]].id, nodes[b].id
                        ),
                    ));
                    continue 'each;
                }
            }
        }
    }
    errors
}

/// Every node a template reads must be upstream of the node (or in its loop, for an earlier
/// round's value), every reference must have at least one source that is certain to be
/// upstream, an input or a literal, and input fields must be mapped by the dataset.
fn check_template_visibility(
    ctx: &Ctx<'_>,
    nodes: &[NodeSpec],
    locs: &[NodeLocs],
    dataset: Option<&DatasetBinding>,
    topo: Option<&[usize]>,
    broken: &BTreeSet<usize>,
) -> Vec<WorkflowError> {
    let n = nodes.len();
    // ancestors[i]: strict ancestors of i along `after`, computed in topological order; with a
    // cycle (reported apart), by a walk back from each node.
    let mut ancestors: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    match topo {
        Some(topo) => {
            for &i in topo {
                let mut acc = BTreeSet::new();
                for &p in &nodes[i].after {
                    acc.insert(p);
                    acc.extend(ancestors[p].iter().copied());
                }
                ancestors[i] = acc;
            }
        }
        None => {
            for (i, acc) in ancestors.iter_mut().enumerate() {
                let mut stack: Vec<usize> = nodes[i].after.clone();
                while let Some(p) = stack.pop() {
                    if acc.insert(p) {
                        stack.extend(nodes[p].after.iter().copied());
                    }
                }
            }
        }
    }
    let ids: BTreeMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, x)| (x.id.as_str(), i))
        .collect();
    let id_list: Vec<&str> = nodes.iter().map(|x| x.id.as_str()).collect();
    let mut errors = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        if broken.contains(&i) {
            // Named by a loop that does not read: its rounds are not known yet.
            continue;
        }
        // An agent with tools renders its prompt once, for its first turn: it has no rounds.
        let node_loop = match &node.kind {
            NodeKind::Agent(a) if a.tools.is_some() => None,
            _ => node.loop_index,
        };
        let templates: Vec<(String, Pos, &Template, bool)> = match &node.kind {
            NodeKind::Agent(a) => {
                let mut t = vec![(
                    format!("nodes.{}.prompt", node.id),
                    locs[i].prompt.unwrap_or(locs[i].pos),
                    &a.prompt,
                    false,
                )];
                if let Some(v) = &a.next_rounds {
                    t.push((
                        format!("nodes.{}.next_rounds.prompt", node.id),
                        locs[i].next_prompt.unwrap_or(locs[i].pos),
                        &v.prompt,
                        true,
                    ));
                }
                t
            }
            NodeKind::Tool(t) => t
                .inputs
                .iter()
                .map(|(k, v)| {
                    (
                        match &locs[i].path {
                            Some(path) => format!("{path}.inputs.{k}"),
                            None => format!("nodes.{}.inputs.{k}", node.id),
                        },
                        locs[i].inputs.get(k).copied().unwrap_or(locs[i].pos),
                        v,
                        false,
                    )
                })
                .collect(),
        };
        for (field, pos, t, later_round) in templates {
            for r in t.references() {
                let mut certain = false;
                let fail = |message: String| ctx.err(pos, &field, ErrorKind::UnknownReference, message);
                for (k, s) in r.sources.iter().enumerate() {
                    match s {
                        Source::Input(f) => {
                            if let Some(d) = dataset
                                && !d.fields.contains_key(f)
                            {
                                let names: Vec<&str> =
                                    d.fields.keys().map(String::as_str).collect();
                                let hint = closest(f, &names)
                                    .map(|c| format!(" (did you mean `{c}`?)"))
                                    .unwrap_or_default();
                                errors.push(fail(format!("`{{{{{}}}}}` reads input field `{f}`, which the dataset does not map{hint}", r.text)));
                            }
                            certain = true;
                        }
                        Source::Literal(_) => certain = true,
                        Source::Round => {
                            if node_loop.is_none() {
                                errors.push(fail(format!("`{{{{{}}}}}`: `{}` is in no loop, so it has no round", r.text, node.id)));
                            }
                            certain = true;
                        }
                        Source::Output(name) | Source::Verdict(name) | Source::Previous(name) => {
                            let Some(&j) = ids.get(name.as_str()) else {
                                let hint = closest(name, &id_list)
                                    .map(|c| format!(" (did you mean `{c}`?)"))
                                    .unwrap_or_default();
                                // After `|`, a word that is no node may be meant as a filter.
                                let filters = if k > 0 && matches!(s, Source::Output(_)) {
                                    format!(
                                        "; after `|` comes another source or a filter, and `{name}` is neither (filters: {})",
                                        super::template::FILTERS
                                    )
                                } else {
                                    String::new()
                                };
                                errors.push(fail(format!("`{{{{{}}}}}`: unknown node `{name}`{hint}{filters}", r.text)));
                                certain = true;
                                continue;
                            };
                            let same_loop = node_loop.is_some() && nodes[j].loop_index == node_loop;
                            if matches!(s, Source::Previous(_)) {
                                if !same_loop {
                                    errors.push(fail(format!("`{{{{{}}}}}`: `.prev` reads the previous round of a node in the same loop, and `{name}` is not in `{}`'s loop", r.text, node.id)));
                                    certain = true;
                                }
                                // Round 1 has no previous round; a later round's does, unless
                                // the node can be skipped.
                                certain |= later_round && nodes[j].when.is_none();
                                continue;
                            }
                            let upstream = ancestors[i].contains(&j);
                            if !upstream && !same_loop {
                                errors.push(fail(format!("`{{{{{}}}}}` reads node `{name}`, which is not upstream of `{}` (add it to `after`, directly or through a predecessor)", r.text, node.id)));
                                certain = true;
                                continue;
                            }
                            // In the rounds after the first, every node of the loop has run.
                            certain |= upstream || (later_round && same_loop);
                        }
                    }
                }
                if !certain {
                    errors.push(fail(format!(
                        "`{{{{{}}}}}` has no value in the loop's first round: make it optional (`{{{{{}?}}}}`, or `| default: \"…\"`) or add a fallback that is upstream, e.g. `{{{{{} | NODE}}}}`",
                        r.text, r.text, r.text
                    )));
                }
            }
        }
    }
    errors
}

/// An agent whose static prompt text alone plus its output limit exceeds the deployment's
/// context can never run.
fn check_context_fits(
    ctx: &Ctx<'_>,
    nodes: &[NodeSpec],
    locs: &[&NodeLocs],
    deployments: &BTreeMap<String, DeploymentSpec>,
) -> Vec<WorkflowError> {
    let mut errors = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let NodeKind::Agent(a) = &node.kind else {
            continue;
        };
        // A routed node must fit on each member of its route: the smallest context decides.
        let members = a.route.as_deref().unwrap_or(std::slice::from_ref(&a.deployment));
        let Some(dep) = members.iter().filter_map(|m| deployments.get(m)).min_by_key(|d| d.max_context) else {
            continue;
        };
        let prompts = std::iter::once((&a.prompt, "prompt", locs[i].prompt))
            .chain(a.next_rounds.as_ref().map(|v| (&v.prompt, "next_rounds.prompt", locs[i].next_prompt)));
        for (prompt, key, pos) in prompts {
            // Sent as one chat message: the template's tokens count too.
            let static_tokens = crate::tokens::count_chat(&prompt.static_text()) as u64;
            if static_tokens + u64::from(a.max_output_tokens) > u64::from(dep.max_context) {
                errors.push(ctx.err(
                    pos.unwrap_or(locs[i].pos),
                    &format!("nodes.{}.{key}", node.id),
                    ErrorKind::ContextNeverFits,
                    format!(
                        "the prompt's static text alone is {static_tokens} tokens (in the chat template); with max_output_tokens {} it exceeds deployment `{}`'s max_context {}",
                        a.max_output_tokens, dep.name, dep.max_context
                    ),
                ));
            }
        }
    }
    errors
}

/// A workflow is routed as one program (paper 002: a program is bound to one model): every
/// routed node declares the same route.
fn check_one_route(ctx: &Ctx<'_>, nodes: &[NodeSpec], locs: &[&NodeLocs]) -> Vec<WorkflowError> {
    let routed = nodes.iter().zip(locs).filter_map(|(n, l)| match &n.kind {
        NodeKind::Agent(a) => a.route.as_ref().map(|r| (n, l, r)),
        NodeKind::Tool(_) => None,
    });
    let mut first: Option<(&str, &Vec<String>)> = None;
    let mut errors = Vec::new();
    for (n, l, route) in routed {
        match first {
            None => first = Some((&n.id, route)),
            Some((id, r)) if r != route => errors.push(ctx.err(
                l.pos,
                &format!("nodes.{}.deployment.route", n.id),
                ErrorKind::BadType,
                format!("route [{}] differs from node `{id}`'s [{}]: a workflow's routed nodes share one route (the session is bound to one model)", route.join(", "), r.join(", ")),
            )),
            Some(_) => {}
        }
    }
    errors
}

/// `next_rounds` only means something inside a loop (a node named by a loop that does not read
/// is left alone).
fn check_next_rounds(ctx: &Ctx<'_>, nodes: &[NodeSpec], locs: &[NodeLocs], broken: &BTreeSet<usize>) -> Vec<WorkflowError> {
    nodes
        .iter()
        .zip(locs)
        .enumerate()
        .filter(|(i, _)| !broken.contains(i))
        .map(|(_, x)| x)
        .filter(|(n, _)| n.loop_index.is_none() && matches!(&n.kind, NodeKind::Agent(a) if a.next_rounds.is_some()))
        .map(|(n, l)| {
            ctx.err(
                l.next_rounds.unwrap_or(l.pos),
                &format!("nodes.{}.next_rounds", n.id),
                ErrorKind::BadLoop,
                format!("`{}` is in no loop, so it has no later rounds (list it in a loop's `body`)", n.id),
            )
        })
        .collect()
}

/// The verdicts a node can produce (`None` when it has none, or when they are open).
fn verdicts_of(node: &NodeSpec) -> Result<Option<Vec<String>>, String> {
    match &node.kind {
        NodeKind::Tool(t) => Ok(TOOL_VERDICTS
            .iter()
            .find(|(name, _)| *name == t.tool)
            .map(|(_, v)| v.iter().map(|s| s.to_string()).collect())
            .or_else(|| switchyard_tools::custom::spec(&t.tool).map(|s| s.verdicts))),
        NodeKind::Agent(a) => match a.output.as_ref().and_then(|o| Some((o, o.verdict.as_deref()?))) {
            Some((o, field)) => Ok(o.schema.property(field).and_then(|p| p.verdict_values())),
            None => Err(format!(
                "agent `{}` gives no verdict: declare a structured `output` with a `verdict` property (a boolean or a string enum)",
                node.id
            )),
        },
    }
}

/// A branch or loop condition can only name verdicts its node can produce.
fn check_verdicts(ctx: &Ctx<'_>, nodes: &[NodeSpec], conditions: &[(String, Pos, Condition)]) -> Vec<WorkflowError> {
    let mut errors = Vec::new();
    for (field, pos, c) in conditions {
        let node = &nodes[c.node];
        match verdicts_of(node) {
            Err(message) => errors.push(ctx.err(*pos, field, ErrorKind::UnknownReference, message)),
            Ok(Some(values)) => {
                for v in &c.verdicts {
                    if !values.contains(v) {
                        errors.push(ctx.err(
                            *pos,
                            field,
                            ErrorKind::UnknownReference,
                            format!("`{}` never gives the verdict `{v}` (its verdicts: {})", node.id, values.join(", ")),
                        ));
                    }
                }
            }
            Ok(None) => {}
        }
    }
    errors
}

/// Every responder's input needs are mapped by the dataset (or, without a dataset, there are
/// none).
fn check_input_needs<'a, 'n: 'a>(
    ctx: &Ctx<'_>,
    nodes: impl IntoIterator<Item = (&'a NodeSpec, &'a MapView<'n>)>,
    dataset: Option<&DatasetBinding>,
) -> Vec<WorkflowError> {
    let mut errors = Vec::new();
    for (node, m) in nodes {
        let NodeKind::Agent(a) = &node.kind else { continue };
        let variants = std::iter::once((a.responder.as_str(), "responder"))
            .chain(a.next_rounds.as_ref().map(|v| (v.responder.as_str(), "next_rounds.responder")));
        for (responder, key) in variants {
            for need in crate::responder::input_needs(responder) {
                let missing = match dataset {
                    Some(d) => !d.fields.contains_key(*need),
                    None => true,
                };
                if missing {
                    let pos = m.key_pos("responder").or(m.key_pos("next_rounds")).unwrap_or(m.pos);
                    let mapped = match dataset {
                        Some(d) => format!("the dataset maps {}", d.fields.keys().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")),
                        None => "this workflow declares no dataset".to_string(),
                    };
                    errors.push(ctx.err(
                        pos,
                        &format!("nodes.{}.{key}", node.id),
                        ErrorKind::MissingInput,
                        format!("responder `{responder}` needs input field `{need}`, and {mapped} (map it under `dataset.fields`, or use the `generic` responder)"),
                    ));
                }
            }
        }
    }
    errors
}

/// `metric:` one term (a mapping) or a weighted list of terms. `nodes` by index (`None`: a node
/// that did not parse, whose kind is not checked against the term).
fn metric(
    ctx: &Ctx<'_>,
    node: &Node,
    index: &BTreeMap<String, usize>,
    ids: &[&str],
    nodes: &[Option<&NodeSpec>],
    dataset: Option<&DatasetBinding>,
) -> Result<MetricSpec, WorkflowError> {
    let terms = match &node.value {
        Value::Seq(items) => {
            if items.is_empty() {
                return Err(ctx.err(node.pos, "metric", ErrorKind::MissingField, "a metric list needs at least one term"));
            }
            let mut terms = Vec::new();
            let mut errors = Vec::new();
            for (i, item) in items.iter().enumerate() {
                match metric_term(ctx, item, &format!("metric[{i}]"), index, ids, nodes, dataset) {
                    Ok(t) => terms.push(t),
                    Err(e) => errors.push(e),
                }
            }
            if !errors.is_empty() {
                return Err(all_of(errors));
            }
            terms
        }
        _ => vec![metric_term(ctx, node, "metric", index, ids, nodes, dataset)?],
    };
    Ok(MetricSpec { terms })
}

/// `verifier:` the one term whose verdict teaches a routed workflow's router (paper 002's
/// verifier), when it is not the metric — e.g. an LLM judge node's verdict. Only a workflow
/// that routes a node has a router to teach.
fn verifier(
    ctx: &Ctx<'_>,
    node: &Node,
    index: &BTreeMap<String, usize>,
    ids: &[&str],
    nodes: &[Option<&NodeSpec>],
    dataset: Option<&DatasetBinding>,
) -> Result<MetricTerm, WorkflowError> {
    let mut errors = Vec::new();
    let routed = nodes.iter().flatten().any(|n| matches!(&n.kind, NodeKind::Agent(a) if a.route.is_some()));
    // (Whether a node that did not parse is routed is not known: then nothing is said.)
    if !routed && nodes.iter().all(Option::is_some) {
        errors.push(ctx.err(
            node.pos,
            "verifier",
            ErrorKind::BadType,
            "a `verifier` teaches the router of a routed workflow, and no node here has `deployment: {route: [...]}`",
        ));
    }
    if let Value::Map(entries) = &node.value
        && let Some((_, weight)) = entries.iter().find(|(k, _)| k.name == "weight")
    {
        errors.push(ctx.err(weight.pos, "verifier.weight", ErrorKind::UnknownField, "a verifier is one term: it has no weight"));
    }
    match metric_term(ctx, node, "verifier", index, ids, nodes, dataset) {
        Ok(term) if errors.is_empty() => Ok(term),
        Ok(_) => Err(all_of(errors)),
        Err(e) => {
            errors.push(e);
            Err(all_of(errors))
        }
    }
}

fn metric_term(
    ctx: &Ctx<'_>,
    node: &Node,
    field: &str,
    index: &BTreeMap<String, usize>,
    ids: &[&str],
    nodes: &[Option<&NodeSpec>],
    dataset: Option<&DatasetBinding>,
) -> Result<MetricTerm, WorkflowError> {
    let f = |k: &str| join_path(field, k);
    let mut errors = Vec::new();
    let m = ctx.map_all(node, field, METRIC_KEYS, &mut errors)?;
    let kn = keep(&mut errors, m.required(ctx, field, "kind"));
    let kind = match kn.and_then(|kn| keep(&mut errors, ctx.string(kn, &f("kind"))).map(|k| (kn, k))) {
        None => None,
        Some((_, k)) if k == "gsm8k_exact" => Some(MetricKind::Gsm8kExact),
        Some((_, k)) if k == "tests_pass" => Some(MetricKind::TestsPass),
        Some((_, k)) if k == "rouge_l" => Some(MetricKind::RougeL),
        Some((_, k)) if k == "verdict" => Some(MetricKind::Verdict),
        Some((kn, other)) => {
            let kinds = ["gsm8k_exact", "tests_pass", "rouge_l", "verdict"];
            let hint = closest(&other, &kinds).map(|c| format!(" (did you mean `{c}`?)")).unwrap_or_default();
            errors.push(ctx.err(
                kn.pos,
                &f("kind"),
                ErrorKind::BadType,
                format!("metric kind `{other}`{hint}: expected gsm8k_exact, tests_pass, rouge_l or verdict"),
            ));
            None
        }
    };
    let nn = keep(&mut errors, m.required(ctx, field, "node"));
    let mut targets = Vec::new();
    let mut target_nodes = Vec::new();
    if let Some(nn) = nn
        && let Some(names) = keep(&mut errors, ctx.string_list(nn, &f("node")))
    {
        if names.is_empty() {
            errors.push(ctx.err(nn.pos, &f("node"), ErrorKind::MissingField, "name at least one node"));
        }
        for (name, pos) in names {
            let Some(target) = keep(&mut errors, resolve_id(ctx, &name, pos, &f("node"), index, ids)) else { continue };
            let spec = nodes.get(target).copied().flatten();
            if kind == Some(MetricKind::TestsPass)
                && let Some(spec) = spec
                && !matches!(&spec.kind, NodeKind::Tool(t) if t.tool == "python_tests")
            {
                errors.push(ctx.err(
                    pos,
                    &f("node"),
                    ErrorKind::BadType,
                    format!("tests_pass scores a `python_tests` tool node, and `{name}` is not one"),
                ));
            }
            if kind == Some(MetricKind::Verdict)
                && let Some(spec) = spec
                && let Err(message) = verdicts_of(spec)
            {
                errors.push(ctx.err(pos, &f("node"), ErrorKind::BadType, message));
            }
            target_nodes.extend(spec);
            targets.push(name);
        }
    }
    let reference = match m.get("reference") {
        None if matches!(kind, Some(MetricKind::Gsm8kExact | MetricKind::RougeL)) => {
            let name = kind.map(|k| k.name()).unwrap_or_default();
            errors.push(ctx.err(m.pos, &f("reference"), ErrorKind::MissingField, format!("a `{name}` term compares with an input field: add `reference`")));
            None
        }
        None => None,
        Some(rn) => {
            let reference = keep(&mut errors, ctx.string(rn, &f("reference")));
            if let (Some(reference), Some(d)) = (&reference, dataset)
                && !d.fields.contains_key(reference)
            {
                errors.push(ctx.err(
                    rn.pos,
                    &f("reference"),
                    ErrorKind::UnknownReference,
                    format!("input field `{reference}` is not mapped by the dataset"),
                ));
            }
            reference
        }
    };
    let pass = match m.get("pass") {
        Some(p) if kind == Some(MetricKind::Verdict) => {
            let list = match keep(&mut errors, ctx.string_list(p, &f("pass"))) {
                Some(list) if list.is_empty() => {
                    errors.push(ctx.err(p.pos, &f("pass"), ErrorKind::MissingField, "name at least one verdict that scores 1"));
                    list
                }
                list => list.unwrap_or_default(),
            };
            // Each listed verdict must be one the scored nodes can give (where that is known),
            // or the term scores 0 for every session without a word.
            'verdicts: for (v, pos) in &list {
                for t in &target_nodes {
                    if let Ok(Some(known)) = verdicts_of(t)
                        && !known.contains(v)
                    {
                        errors.push(ctx.err(
                            *pos,
                            &f("pass"),
                            ErrorKind::BadType,
                            format!("`{v}` is not a verdict `{}` gives (its verdicts: {})", t.id, known.join(", ")),
                        ));
                        continue 'verdicts;
                    }
                }
            }
            list.into_iter().map(|(s, _)| s).collect()
        }
        // With a kind that does not read, whether `pass` belongs is not known.
        Some(_) if kind.is_none() => Vec::new(),
        Some(p) => {
            errors.push(ctx.err(p.pos, &f("pass"), ErrorKind::UnknownField, "`pass` belongs to `verdict` terms"));
            Vec::new()
        }
        None if kind == Some(MetricKind::Verdict) => {
            errors.push(ctx.err(m.pos, &f("pass"), ErrorKind::MissingField, "a `verdict` term needs `pass`: the verdicts that score 1"));
            Vec::new()
        }
        None => Vec::new(),
    };
    let weight = match m.get("weight") {
        None => Some(1.0),
        Some(w) => match keep(&mut errors, ctx.f64(w, &f("weight"))) {
            Some(v) if v <= 0.0 => {
                errors.push(ctx.err(w.pos, &f("weight"), ErrorKind::BadType, format!("weight {v} must be positive")));
                None
            }
            v => v,
        },
    };
    match (kind, weight) {
        (Some(kind), Some(weight)) if errors.is_empty() && !targets.is_empty() => {
            Ok(MetricTerm { kind, nodes: targets, reference, pass, weight })
        }
        _ => Err(all_of(errors)),
    }
}
