//! From positioned YAML to a validated [`WorkflowSpec`]: schema conversion, reference
//! resolution, the acyclicity check (cycles must be declared loops), loop well-formedness,
//! template visibility and the "context can never fit" check.
//!
//! Pure apart from one `metadata` call that checks the dataset file exists.

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
    TOOL_VERDICTS, ToolNode, WorkflowSpec, default_output_tokens, default_turns, tool_call_verdict,
};
use crate::responder::GENERIC;
use crate::schema::OutputSchema;
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
    let top = ctx.map(&doc, "", TOP_KEYS)?;

    // Independent parts are checked one by one and their problems reported together; the
    // graph checks that need every node run once the nodes are sound.
    let mut errors: Vec<WorkflowError> = Vec::new();
    let name = ctx
        .ident(top.required(&ctx, "", "name")?, "name", true)
        .map_err(|e| errors.push(e))
        .unwrap_or_default();
    let description = top
        .get("description")
        .map(|d| ctx.string(d, "description"))
        .transpose()
        .map_err(|e| errors.push(e))
        .unwrap_or_default();
    let deployments_node = top.required(&ctx, "", "deployments");
    // Names declared, even those whose entry is wrong: a node naming one of them is not
    // reported again as naming an unknown deployment.
    let declared: BTreeSet<String> = match deployments_node.as_ref().map(|d| &d.value) {
        Ok(Value::Map(entries)) => entries.iter().map(|(k, _)| k.name.clone()).collect(),
        _ => BTreeSet::new(),
    };
    let deployments = deployments_node
        .and_then(|d| deployments(&ctx, d))
        .map_err(|e| errors.push(e))
        .unwrap_or_default();
    let mut dataset = top
        .get("dataset")
        .map(|d| dataset(&ctx, d, base_dir))
        .transpose()
        .map_err(|e| errors.push(e))
        .unwrap_or_default();

    // Nodes: ids first (so references can point forward), then each node.
    let nodes_node = match top.required(&ctx, "", "nodes") {
        Ok(n) => n,
        Err(e) => {
            errors.push(e);
            return Err(WorkflowError::many(errors));
        }
    };
    let raw_nodes = match ctx.seq(nodes_node, "nodes") {
        Ok(n) => n,
        Err(e) => {
            errors.push(e);
            return Err(WorkflowError::many(errors));
        }
    };
    if raw_nodes.is_empty() {
        errors.push(ctx.err(
            nodes_node.pos,
            "nodes",
            ErrorKind::MissingField,
            "a workflow needs at least one node",
        ));
        return Err(WorkflowError::many(errors));
    }
    if raw_nodes.len() > super::MAX_NODES {
        errors.push(ctx.err(
            nodes_node.pos,
            "nodes",
            ErrorKind::TooLarge,
            format!("{} nodes; a workflow has at most {}", raw_nodes.len(), super::MAX_NODES),
        ));
        return Err(WorkflowError::many(errors));
    }
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    let mut maps = Vec::with_capacity(raw_nodes.len());
    for (i, n) in raw_nodes.iter().enumerate() {
        match node_header(&ctx, i, n, &index) {
            Ok((id, m)) => {
                index.insert(id.clone(), maps.len());
                maps.push((id, m));
            }
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() && maps.len() < raw_nodes.len() {
        // Node indices would shift: stop before cross-references are resolved.
        return Err(WorkflowError::many(errors));
    }
    let ids: Vec<&str> = maps.iter().map(|(id, _)| id.as_str()).collect();

    let mut nodes = Vec::with_capacity(maps.len());
    let mut locs = Vec::with_capacity(maps.len());
    for (id, m) in &maps {
        match node(&ctx, id, m, &index, &ids, &deployments, &declared) {
            Ok((node, loc)) => {
                nodes.push(node);
                locs.push(loc);
            }
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        return Err(WorkflowError::many(errors));
    }
    let file_nodes = nodes.len();
    add_tool_steps(&mut nodes, &mut locs);

    let mut conditions: Vec<(String, Pos, Condition)> = nodes
        .iter()
        .zip(&locs)
        .filter_map(|(n, l)| Some((format!("nodes.{}.when.verdict", n.id), l.when_verdict?, n.when.clone()?)))
        .collect();
    let mut loops = match top.get("loops") {
        Some(l) => loops(&ctx, l, &index, &ids, &mut nodes, &mut conditions)?,
        None => Vec::new(),
    };
    add_turn_loops(&mut nodes, &mut loops, file_nodes);

    let topo = topological_order(&ctx, &nodes, &locs)?;
    check_loops(&ctx, top.get("loops"), &nodes, &mut loops)?;

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

    errors.extend(check_template_visibility(&ctx, &nodes, &locs, dataset.as_ref(), &topo));
    errors.extend(check_context_fits(&ctx, &nodes, &locs, &deployments));
    errors.extend(check_one_route(&ctx, &nodes, &locs));
    errors.extend(check_next_rounds(&ctx, &nodes, &locs));
    errors.extend(check_verdicts(&ctx, &nodes, &conditions));
    errors.extend(check_input_needs(&ctx, &nodes, &maps, dataset.as_ref()));
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

    let metric = top
        .get("metric")
        .map(|m| metric(&ctx, m, &index, &ids, &nodes, dataset.as_ref()))
        .transpose()
        .map_err(|e| errors.push(e))
        .unwrap_or_default();
    let verifier = top
        .get("verifier")
        .map(|v| verifier(&ctx, v, &index, &ids, &nodes, dataset.as_ref()))
        .transpose()
        .map_err(|e| errors.push(e))
        .unwrap_or_default();
    if !errors.is_empty() {
        return Err(WorkflowError::many(errors));
    }
    // Tool steps are found by id (`AGENT.NAME`), but no reference in the file can name one.
    for (i, n) in nodes.iter().enumerate().skip(file_nodes) {
        index.insert(n.id.clone(), i);
    }

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
        records: Default::default(),
    })
}

/// A node's id and its mapping (keys checked), named by its id in error paths as soon as it
/// has a readable one.
fn node_header<'n>(
    ctx: &Ctx<'_>,
    i: usize,
    n: &'n Node,
    index: &BTreeMap<String, usize>,
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
    let m = ctx.map(n, &field, &allowed)?;
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
    {
        let field = format!("deployments.{}", key.name);
        if !yaml::is_ident(&key.name, true) {
            return Err(ctx.err(
                key.pos,
                &field,
                ErrorKind::BadType,
                format!("`{}` is not a valid deployment name", key.name),
            ));
        }
        let m = ctx.map(value, &field, DEPLOYMENT_KEYS)?;
        let model_node = m.required(ctx, &field, "model")?;
        let model_name = ctx.string(model_node, &format!("{field}.model"))?;
        let arch = switchyard_predictor::spec::model(&model_name).map_err(|e| {
            ctx.err(
                model_node.pos,
                &format!("{field}.model"),
                ErrorKind::UnknownModel,
                e.to_string(),
            )
        })?;
        if arch.linear_attention.is_some() {
            // The planner's predictor and the responders know dense models only; the hybrid
            // catalogue serves the agent-program experiments (`bench oracle`).
            return Err(ctx.err(
                model_node.pos,
                &format!("{field}.model"),
                ErrorKind::UnknownModel,
                format!(
                    "`{model_name}` is a hybrid (linear-attention) model: workflows deploy the dense Qwen3 models \
                     only (the predictor does not model Gated DeltaNet layers)"
                ),
            ));
        }
        let dtype = match m.get("dtype") {
            None => Dtype::Bf16,
            Some(d) => match ctx.string(d, &format!("{field}.dtype"))?.as_str() {
                "bf16" => Dtype::Bf16,
                "fp16" => Dtype::Fp16,
                other => {
                    return Err(ctx.err(
                        d.pos,
                        &format!("{field}.dtype"),
                        ErrorKind::BadType,
                        format!("dtype `{other}`: expected `bf16` or `fp16`"),
                    ));
                }
            },
        };
        let ctx_node = m.required(ctx, &field, "max_context")?;
        let max_context = ctx.u32(ctx_node, &format!("{field}.max_context"))?;
        if max_context == 0 || u64::from(max_context) > arch.max_position_embeddings {
            return Err(ctx.err(
                ctx_node.pos,
                &format!("{field}.max_context"),
                ErrorKind::BadType,
                format!(
                    "max_context {max_context} must be between 1 and {}'s {} positions",
                    arch.name, arch.max_position_embeddings
                ),
            ));
        }
        let out_node = m.required(ctx, &field, "max_output_tokens")?;
        let max_output_tokens = ctx.u32(out_node, &format!("{field}.max_output_tokens"))?;
        if max_output_tokens == 0 || max_output_tokens >= max_context {
            return Err(ctx.err(
                out_node.pos,
                &format!("{field}.max_output_tokens"),
                ErrorKind::OutputLimit,
                format!("max_output_tokens {max_output_tokens} must be at least 1 and below max_context {max_context}"),
            ));
        }
        let gpu_memory_utilization = match m.get("gpu_memory_utilization") {
            None => DEFAULT_GPU_MEMORY_UTILIZATION,
            Some(g) => {
                let f = ctx.f64(g, &format!("{field}.gpu_memory_utilization"))?;
                if !(f > 0.0 && f <= 1.0) {
                    return Err(ctx.err(
                        g.pos,
                        &format!("{field}.gpu_memory_utilization"),
                        ErrorKind::BadType,
                        format!("{f} is not a fraction in (0, 1]"),
                    ));
                }
                f
            }
        };
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
}

fn dataset(ctx: &Ctx<'_>, node: &Node, base_dir: &Path) -> Result<DatasetBinding, WorkflowError> {
    let m = ctx.map(node, "dataset", DATASET_KEYS)?;
    let file_node = m.required(ctx, "dataset", "file")?;
    let file_as_written = ctx.string(file_node, "dataset.file")?;
    let file = base_dir.join(&file_as_written);
    let format = match m.get("format") {
        Some(f) => match ctx.string(f, "dataset.format")?.as_str() {
            "json" => DatasetFormat::Json,
            "jsonl" => DatasetFormat::Jsonl,
            other => {
                return Err(ctx.err(
                    f.pos,
                    "dataset.format",
                    ErrorKind::BadType,
                    format!("format `{other}`: expected `json` or `jsonl`"),
                ));
            }
        },
        None if file_as_written.ends_with(".jsonl") => DatasetFormat::Jsonl,
        None if file_as_written.ends_with(".json") => DatasetFormat::Json,
        None => {
            return Err(ctx.err(
                m.pos,
                "dataset.format",
                ErrorKind::MissingField,
                "cannot tell the format from the file name: add `format: json` or `format: jsonl`",
            ));
        }
    };
    if !file.is_file() {
        let why = if file.exists() { "is not a regular file" } else { "not found" };
        return Err(ctx.err(
            file_node.pos,
            "dataset.file",
            ErrorKind::Dataset,
            format!("dataset file `{file_as_written}` {why} (looked at `{}`)", file.display()),
        ));
    }
    let fields_node = m.required(ctx, "dataset", "fields")?;
    let mut fields = BTreeMap::new();
    for (key, value) in ctx.entries(fields_node, "dataset.fields")? {
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
        fields.insert(key.name.clone(), FieldSource::new(path, join, pos));
    }
    if fields.is_empty() {
        return Err(ctx.err(
            fields_node.pos,
            "dataset.fields",
            ErrorKind::MissingField,
            "map at least one input field",
        ));
    }
    Ok(DatasetBinding::new(
        ctx.file,
        file_as_written,
        file,
        format,
        fields,
        file_node.pos,
    ))
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
    declared: &BTreeSet<String>,
) -> Result<(NodeSpec, NodeLocs), WorkflowError> {
    let field = format!("nodes.{id}");
    let f = |k: &str| join_path(&field, k);
    let description = m
        .get("description")
        .map(|d| ctx.string(d, &f("description")))
        .transpose()?;
    let mut loc = NodeLocs { after_key: m.key_pos("after"), ..NodeLocs::at(m.pos) };

    let mut after = Vec::new();
    if let Some(a) = m.get("after") {
        for (name, pos) in ctx.string_list(a, &f("after"))? {
            let p = resolve_id(ctx, &name, pos, &f("after"), index, ids)?;
            if name == id {
                return Err(ctx.err(
                    pos,
                    &f("after"),
                    ErrorKind::Cycle,
                    format!("node `{id}` cannot come after itself (declare a loop to repeat it)"),
                ));
            }
            if !after.contains(&p) {
                after.push(p);
                loc.after.push(pos);
            }
        }
    }
    let when = match m.get("when") {
        None => None,
        Some(w) => {
            let (c, pos, vpos) = condition(ctx, w, &f("when"), index, ids)?;
            loc.when_verdict = Some(vpos);
            if !after.contains(&c.node) {
                return Err(ctx.err(
                    pos,
                    &f("when.node"),
                    ErrorKind::UnknownReference,
                    format!("a branch is chosen by a predecessor's result, but `{}` is not in this node's `after`", ids[c.node]),
                ));
            }
            Some(c)
        }
    };

    let is_tool = m.get("tool").is_some();
    let agent_key = AGENT_KEYS.iter().find(|k| m.get(k).is_some());
    let kind = if is_tool {
        if let Some(k) = agent_key {
            let pos = m.key_pos(k).unwrap_or(m.pos);
            return Err(ctx.err(
                pos,
                &f(k),
                ErrorKind::UnknownField,
                format!("`{k}` belongs to agent nodes, and `{id}` is a tool node"),
            ));
        }
        NodeKind::Tool(tool_node(ctx, &field, m, &mut loc)?)
    } else if agent_key.is_some() {
        if let Some(k) = TOOL_KEYS.iter().find(|k| m.get(k).is_some()) {
            let pos = m.key_pos(k).unwrap_or(m.pos);
            return Err(ctx.err(
                pos,
                &f(k),
                ErrorKind::UnknownField,
                format!("`{k}` belongs to tool nodes, and `{id}` is an agent node"),
            ));
        }
        NodeKind::Agent(agent_node(ctx, &field, m, deployments, declared, &mut loc)?)
    } else {
        return Err(ctx.err(
            m.pos,
            &field,
            ErrorKind::MissingField,
            "a node needs `deployment` (an agent) or `tool` (a tool)",
        ));
    };
    Ok((
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
    ))
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
    declared: &BTreeSet<String>,
    loc: &mut NodeLocs,
) -> Result<AgentNode, WorkflowError> {
    let f = |k: &str| join_path(field, k);
    let dn = m.required(ctx, field, "deployment")?;
    // `deployment: NAME`, or a routed choice `deployment: {route: [NAME, ...]}` that ORACLE's
    // router binds per session (the first member is what static analysis plans with).
    let (route, members) = match &dn.value {
        Value::Map(_) => {
            let rm = ctx.map(dn, &f("deployment"), &["route"])?;
            let rf = join_path(&f("deployment"), "route");
            let rn = rm.required(ctx, &f("deployment"), "route")?;
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
            (Some(members.iter().map(|(n, _, _)| n.clone()).collect::<Vec<_>>()), members)
        }
        _ => (None, vec![(ctx.string(dn, &f("deployment"))?, dn.pos, f("deployment"))]),
    };
    for (name, pos, at) in &members {
        if deployments.contains_key(name) {
            continue;
        }
        if declared.contains(name) {
            // The deployment's own entry is wrong and already reported.
            return Err(WorkflowError::Many(Vec::new()));
        }
        let names: Vec<&str> = deployments.keys().map(String::as_str).collect();
        let hint = closest(name, &names).map(|c| format!(" (did you mean `{c}`?)")).unwrap_or_default();
        return Err(ctx.err(*pos, at, ErrorKind::UnknownReference, format!("unknown deployment `{name}`{hint}")));
    }
    let deployment = members[0].0.clone();
    // The node's limits hold on every member: the smallest output limit and context.
    let Some(dep) = members.iter().filter_map(|(n, _, _)| deployments.get(n)).min_by_key(|d| (d.max_output_tokens, d.max_context)) else {
        return Err(WorkflowError::Many(Vec::new()));
    };
    let responder = match m.get("responder") {
        Some(rn) => responder_name(ctx, rn, &f("responder"))?,
        None => GENERIC.to_string(),
    };
    let text_of = |k: &str| -> Result<Option<String>, WorkflowError> {
        m.get(k).map(|n| ctx.string(n, &f(k))).transpose()
    };
    let role = text_of("role")?;
    let goal = text_of("goal")?;
    let instructions = text_of("instructions")?;
    let output = match m.get("output") {
        Some(o) => Some(structured_output(ctx, o, &f("output"))?),
        None => None,
    };
    if crate::responder::is_judge(&responder) {
        let boolean = output
            .as_ref()
            .and_then(|o| o.schema.property(o.verdict.as_deref()?))
            .is_some_and(|p| matches!(p, OutputSchema::Boolean));
        if !boolean {
            return Err(ctx.err(
                m.key_pos("output").or(m.key_pos("responder")).unwrap_or(m.pos),
                &f("output"),
                ErrorKind::BadType,
                format!("responder `{responder}` is a judge: it answers with a structured `output` whose `verdict` names a boolean property (its decision)"),
            ));
        }
    }
    let tools = match m.get("tools") {
        Some(tn) => Some(agent_tools(ctx, field, m, tn, loc)?),
        None => {
            if let Some(k) = ["max_turns", "turns"].into_iter().find(|k| m.get(k).is_some()) {
                return Err(ctx.err(
                    m.key_pos(k).unwrap_or(m.pos),
                    &f(k),
                    ErrorKind::MissingField,
                    format!("`{k}` bounds an agent's tool loop: declare the `tools` it may call"),
                ));
            }
            None
        }
    };
    if tools.is_some() {
        if let Some(pos) = m.key_pos("output") {
            return Err(ctx.err(
                pos,
                &f("output"),
                ErrorKind::BadType,
                "an agent with `tools` answers in free text (a last line `Action: NAME` calls a tool): a structured `output` is not supported with `tools`",
            ));
        }
        if let Some(pos) = m.key_pos("next_rounds") {
            return Err(ctx.err(
                pos,
                &f("next_rounds"),
                ErrorKind::BadLoop,
                "an agent with `tools` has turns, not loop rounds: each turn's prompt is the previous one's + its answer + the observation, and its `responder` answers every turn",
            ));
        }
    }
    let pn = m.required(ctx, field, "prompt")?;
    loc.prompt = Some(pn.pos);
    let tools_tail = tools.as_ref().map(tools_instruction);
    let prompt = agent_prompt(
        ctx,
        pn,
        &f("prompt"),
        role.as_deref(),
        goal.as_deref(),
        instructions.as_deref(),
        output.as_ref(),
        tools_tail.as_deref(),
    )?;
    let next_rounds = match m.get("next_rounds") {
        None => None,
        Some(v) => {
            let vf = f("next_rounds");
            let vm = ctx.map(v, &vf, &["prompt", "responder"])?;
            let vp = vm.required(ctx, &vf, "prompt")?;
            loc.next_prompt = Some(vp.pos);
            loc.next_rounds = Some(v.pos);
            let prompt = agent_prompt(
                ctx,
                vp,
                &join_path(&vf, "prompt"),
                role.as_deref(),
                goal.as_deref(),
                instructions.as_deref(),
                output.as_ref(),
                None,
            )?;
            let responder = match vm.get("responder") {
                Some(rn) => responder_name(ctx, rn, &join_path(&vf, "responder"))?,
                None => responder.clone(),
            };
            Some(RoundVariant { prompt, responder })
        }
    };
    let max_output_tokens = match m.get("max_output_tokens") {
        None => dep.max_output_tokens,
        Some(n) => {
            let v = ctx.u32(n, &f("max_output_tokens"))?;
            if v == 0 || v > dep.max_output_tokens {
                return Err(ctx.err(
                    n.pos,
                    &f("max_output_tokens"),
                    ErrorKind::OutputLimit,
                    format!("max_output_tokens {v} must be between 1 and deployment `{}`'s max_output_tokens {}", dep.name, dep.max_output_tokens),
                ));
            }
            v
        }
    };
    if let Some(o) = &output {
        let smallest = crate::tokens::count(&o.schema.smallest().to_string()) as u32;
        if smallest > max_output_tokens {
            return Err(ctx.err(
                m.key_pos("output").unwrap_or(m.pos),
                &f("output.schema"),
                ErrorKind::OutputLimit,
                format!("the schema's smallest answer is {smallest} tokens, above max_output_tokens {max_output_tokens}"),
            ));
        }
    }
    let output_tokens = match m.get("output_tokens") {
        None => default_output_tokens(max_output_tokens),
        Some(on) => length_dist(
            ctx,
            on,
            &f("output_tokens"),
            default_output_tokens(max_output_tokens).cv,
            (max_output_tokens, "max_output_tokens"),
        )?,
    };
    let thinking_tokens = match m.get("thinking_tokens") {
        None => None,
        Some(tn) => Some(length_dist(
            ctx,
            tn,
            &f("thinking_tokens"),
            default_output_tokens(max_output_tokens).cv,
            (max_output_tokens, "max_output_tokens"),
        )?),
    };
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
    let items = ctx.seq(tn, &f("tools"))?;
    if items.is_empty() {
        return Err(ctx.err(tn.pos, &f("tools"), ErrorKind::MissingField, "list at least one tool the agent may call"));
    }
    let mut tools: Vec<AgentTool> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("{}[{i}]", f("tools"));
        let (em, name_node) = match &item.value {
            Value::Str(_) => (MapView { entries: &[], pos: item.pos }, item),
            _ => {
                let em = ctx.map(item, &at, AGENT_TOOL_KEYS)?;
                let nn = em.required(ctx, &at, "name")?;
                (em, nn)
            }
        };
        let name = ctx.string(name_node, &join_path(&at, "name"))?;
        if !yaml::is_ident(&name, false) {
            return Err(ctx.err(
                name_node.pos,
                &join_path(&at, "name"),
                ErrorKind::BadType,
                format!("`{name}` is not a valid tool name (letters, digits, `_`, `-`)"),
            ));
        }
        let ef = format!("{}.{name}", f("tools"));
        if tools.iter().any(|t| t.name == name) {
            return Err(ctx.err(
                name_node.pos,
                &join_path(&ef, "name"),
                ErrorKind::DuplicateId,
                format!("the agent declares tool `{name}` twice"),
            ));
        }
        let (tool_node, tool_field) = match em.get("tool") {
            Some(t) => (t, join_path(&ef, "tool")),
            None if em.entries.is_empty() => (item, ef.clone()),
            None => (name_node, join_path(&ef, "name")),
        };
        let mut tloc = NodeLocs { path: Some(ef.clone()), ..NodeLocs::at(item.pos) };
        let node = tool_spec(ctx, &ef, &em, tool_node, &tool_field, false, &mut tloc)?;
        let description = em.get("description").map(|d| ctx.string(d, &join_path(&ef, "description"))).transpose()?;
        tools.push(AgentTool { name, description, node: usize::MAX });
        loc.tools.push((node, tloc));
    }
    let max_turns = match m.get("max_turns") {
        None => {
            return Err(ctx.err(
                m.pos,
                &f("max_turns"),
                ErrorKind::BadLoop,
                format!("an agent with tools needs a bound: add `max_turns` (its model turns, 1 to {MAX_TURNS})"),
            ));
        }
        Some(n) => {
            let v = ctx.u32(n, &f("max_turns"))?;
            if v == 0 || v > MAX_TURNS {
                return Err(ctx.err(
                    n.pos,
                    &f("max_turns"),
                    ErrorKind::BadLoop,
                    format!("max_turns {v} must be between 1 and {MAX_TURNS}"),
                ));
            }
            v
        }
    };
    let turns = match m.get("turns") {
        None => default_turns(max_turns),
        Some(n) => length_dist(ctx, n, &f("turns"), default_turns(max_turns).cv, (max_turns, "max_turns"))?,
    };
    Ok(AgentTools { tools, max_turns, turns })
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
    let om = ctx.map(node, field, &["mean", "cv"])?;
    let mean_node = om.required(ctx, field, "mean")?;
    let mean = ctx.f64(mean_node, &format!("{field}.mean"))?;
    let cv = match om.get("cv") {
        Some(cv_node) => {
            let cv = ctx.f64(cv_node, &format!("{field}.cv"))?;
            if !(0.0..=MAX_LENGTH_CV).contains(&cv) {
                return Err(ctx.err(
                    cv_node.pos,
                    &format!("{field}.cv"),
                    ErrorKind::BadType,
                    format!("cv {} must be between 0 and {MAX_LENGTH_CV}", show_number(cv)),
                ));
            }
            cv
        }
        None => default_cv,
    };
    let (limit, limit_name) = limit;
    if !(1.0..=f64::from(limit.max(1))).contains(&mean) {
        return Err(ctx.err(
            mean_node.pos,
            &format!("{field}.mean"),
            ErrorKind::BadType,
            format!("mean {} must be between 1 and {limit_name} ({limit})", show_number(mean)),
        ));
    }
    Ok(LengthDist { mean, cv })
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
    let om = ctx.map(node, field, &["schema", "verdict"])?;
    let sn = om.required(ctx, field, "schema")?;
    let schema = OutputSchema::from_json(&yaml::to_json(sn)).map_err(|e| {
        let path = if e.path.is_empty() { format!("{field}.schema") } else { format!("{field}.schema.{}", e.path) };
        ctx.err(sn.pos, &path, ErrorKind::BadType, e.message)
    })?;
    let verdict = match om.get("verdict") {
        None => None,
        Some(vn) => {
            let name = ctx.string(vn, &join_path(field, "verdict"))?;
            let problem = match schema.property(&name) {
                None => Some(format!("`{name}` is not a top-level property of the schema")),
                Some(_) if !schema.is_required(&name) => Some(format!("`{name}` must be in the schema's `required` list (a verdict needs a value)")),
                Some(p) if p.verdict_values().is_none() => {
                    Some(format!("`{name}` must be a boolean or a string `enum` so that its values can be named in `when`"))
                }
                Some(_) => None,
            };
            if let Some(message) = problem {
                return Err(ctx.err(vn.pos, &join_path(field, "verdict"), ErrorKind::BadType, message));
            }
            Some(name)
        }
    };
    Ok(StructuredOutput { schema, verdict })
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
    let tool = ctx.string(tn, tool_field)?;
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
        return Err(ctx.err(
            tn.pos,
            tool_field,
            ErrorKind::UnknownTool,
            format!("unknown tool `{tool}`{hint}; known: {}", known.join(", ")),
        ));
    };
    let in_node = if inputs_required { Some(m.required(ctx, field, "inputs")?) } else { m.get("inputs") };
    let mut allowed: Vec<&str> = required.iter().map(String::as_str).collect();
    allowed.extend(optional.iter().map(String::as_str));
    let entries = match in_node {
        Some(n) => ctx.map(n, &f("inputs"), &allowed)?.entries,
        None => &[],
    };
    let mut inputs = BTreeMap::new();
    for (Key { name, .. }, v) in entries {
        let vf = f(&format!("inputs.{name}"));
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
                    return Err(ctx.err(n.pos, &fld, ErrorKind::BadType, why));
                }
            }
        }
        loc.inputs.insert(name.clone(), v.pos);
        inputs.insert(name.clone(), t);
    }
    for r in &required {
        if !inputs.contains_key(r) {
            return Err(ctx.err(
                in_node.map_or(m.pos, |n| n.pos),
                &f(&format!("inputs.{r}")),
                ErrorKind::MissingField,
                format!("tool `{tool}` needs input `{r}`"),
            ));
        }
    }
    let timeout_s = match m.get("timeout_s") {
        None => None,
        Some(t) => {
            let v = ctx.f64(t, &f("timeout_s"))?;
            if v <= 0.0 {
                return Err(ctx.err(
                    t.pos,
                    &f("timeout_s"),
                    ErrorKind::BadType,
                    format!("timeout_s {v} must be positive"),
                ));
            }
            Some(v)
        }
    };
    Ok(ToolNode {
        tool,
        inputs,
        timeout_s,
    })
}

fn loops(
    ctx: &Ctx<'_>,
    node: &Node,
    index: &BTreeMap<String, usize>,
    ids: &[&str],
    nodes: &mut [NodeSpec],
    conditions: &mut Vec<(String, Pos, Condition)>,
) -> Result<Vec<LoopSpec>, WorkflowError> {
    let mut out: Vec<LoopSpec> = Vec::new();
    for (li, l) in ctx.seq(node, "loops")?.iter().enumerate() {
        let field0 = format!("loops[{li}]");
        let m = ctx.map(l, &field0, LOOP_KEYS)?;
        let idn = m.required(ctx, &field0, "id")?;
        let id = ctx.ident(idn, &format!("{field0}.id"), false)?;
        let field = format!("loops.{id}");
        if out.iter().any(|o| o.id == id) {
            return Err(ctx.err(
                idn.pos,
                &format!("{field}.id"),
                ErrorKind::DuplicateId,
                format!("duplicate loop id `{id}`"),
            ));
        }
        let description = m
            .get("description")
            .map(|d| ctx.string(d, &format!("{field}.description")))
            .transpose()?;
        let bn = m.required(ctx, &field, "body")?;
        let mut body = Vec::new();
        for (name, pos) in ctx.string_list(bn, &format!("{field}.body"))? {
            let n = resolve_id(ctx, &name, pos, &format!("{field}.body"), index, ids)?;
            if matches!(&nodes[n].kind, NodeKind::Agent(a) if a.tools.is_some()) {
                return Err(ctx.err(
                    pos,
                    &format!("{field}.body"),
                    ErrorKind::BadLoop,
                    format!("`{name}` calls tools: its turns are a loop of their own, and loops do not nest"),
                ));
            }
            if let Some(other) = nodes[n].loop_index {
                let msg = if other == out.len() {
                    format!("`{name}` is listed twice")
                } else {
                    format!(
                        "`{name}` is already in loop `{}` (loops may not nest or overlap)",
                        out[other].id
                    )
                };
                return Err(ctx.err(pos, &format!("{field}.body"), ErrorKind::BadLoop, msg));
            }
            nodes[n].loop_index = Some(out.len());
            body.push(n);
        }
        if body.is_empty() {
            return Err(ctx.err(
                bn.pos,
                &format!("{field}.body"),
                ErrorKind::BadLoop,
                "a loop body needs at least one node",
            ));
        }
        body.sort_unstable();
        let cn = m.required(ctx, &field, "continue_when")?;
        let (continue_when, cpos, vpos) =
            condition(ctx, cn, &format!("{field}.continue_when"), index, ids)?;
        conditions.push((format!("{field}.continue_when.verdict"), vpos, continue_when.clone()));
        if !body.contains(&continue_when.node) {
            return Err(ctx.err(
                cpos,
                &format!("{field}.continue_when.node"),
                ErrorKind::BadLoop,
                format!("`{}` is not in the loop body", ids[continue_when.node]),
            ));
        }
        let max_rounds = match m.get("max_rounds") {
            None => {
                return Err(ctx.err(
                    m.pos,
                    &format!("{field}.max_rounds"),
                    ErrorKind::BadLoop,
                    "a loop needs a bound: add `max_rounds` (at least 1)",
                ));
            }
            Some(r) => {
                let v = ctx.u32(r, &format!("{field}.max_rounds"))?;
                if v == 0 || v > super::MAX_LOOP_ROUNDS {
                    return Err(ctx.err(
                        r.pos,
                        &format!("{field}.max_rounds"),
                        ErrorKind::BadLoop,
                        format!("max_rounds {v} must be between 1 and {}", super::MAX_LOOP_ROUNDS),
                    ));
                }
                // Over all the workflow's loops: what one session may create.
                let activations = u64::from(v) * body.len() as u64;
                let earlier: u64 = out.iter().map(|l| u64::from(l.max_rounds) * l.body.len() as u64).sum();
                if earlier + activations > super::MAX_LOOP_ACTIVATIONS {
                    let others = if earlier > 0 { format!(" (with the {earlier} of the loops before it)") } else { String::new() };
                    return Err(ctx.err(
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
                v
            }
        };
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
    Ok(out)
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

/// Entries, convexity and "every body node leads to the continue node".
fn check_loops(
    ctx: &Ctx<'_>,
    loops_node: Option<&Node>,
    nodes: &[NodeSpec],
    loops: &mut [LoopSpec],
) -> Result<(), WorkflowError> {
    let positions: Vec<Pos> = match loops_node.map(|n| &n.value) {
        Some(Value::Seq(items)) => items.iter().map(|i| i.pos).collect(),
        _ => Vec::new(),
    };
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
    for (li, l) in loops.iter_mut().enumerate() {
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
                return Err(ctx.err(
                    pos,
                    &field,
                    ErrorKind::BadLoop,
                    format!(
                        "body node `{}` does not lead to `{}` (the continue_when node); every body node must come before it",
                        nodes[b].id, nodes[l.continue_when.node].id
                    ),
                ));
            }
            for &p in &nodes[b].after {
                if in_body(p) {
                    continue;
                }
                if let Some((oi, _)) = l.body.iter().enumerate().find(|(oi, _)| reaches[*oi][p]) {
                    return Err(ctx.err(
                        pos,
                        &field,
                        ErrorKind::BadLoop,
                        format!(
                            "`{}` runs between body nodes `{}` and `{}` but is not in the body",
                            nodes[p].id, nodes[l.body[oi]].id, nodes[b].id
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Every node a template reads must be upstream of the node (or in its loop, for an earlier
/// round's value), every reference must have at least one source that is certain to be
/// upstream, an input or a literal, and input fields must be mapped by the dataset.
fn check_template_visibility(
    ctx: &Ctx<'_>,
    nodes: &[NodeSpec],
    locs: &[NodeLocs],
    dataset: Option<&DatasetBinding>,
    topo: &[usize],
) -> Vec<WorkflowError> {
    let n = nodes.len();
    // ancestors[i]: strict ancestors of i along `after`, computed in topological order.
    let mut ancestors: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    for &i in topo {
        let mut acc = BTreeSet::new();
        for &p in &nodes[i].after {
            acc.insert(p);
            acc.extend(ancestors[p].iter().copied());
        }
        ancestors[i] = acc;
    }
    let ids: BTreeMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, x)| (x.id.as_str(), i))
        .collect();
    let id_list: Vec<&str> = nodes.iter().map(|x| x.id.as_str()).collect();
    let mut errors = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
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
                for s in &r.sources {
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
                                errors.push(fail(format!("`{{{{{}}}}}`: unknown node `{name}`{hint}", r.text)));
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
    locs: &[NodeLocs],
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
fn check_one_route(ctx: &Ctx<'_>, nodes: &[NodeSpec], locs: &[NodeLocs]) -> Vec<WorkflowError> {
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

/// `next_rounds` only means something inside a loop.
fn check_next_rounds(ctx: &Ctx<'_>, nodes: &[NodeSpec], locs: &[NodeLocs]) -> Vec<WorkflowError> {
    nodes
        .iter()
        .zip(locs)
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
fn check_input_needs(
    ctx: &Ctx<'_>,
    nodes: &[NodeSpec],
    maps: &[(String, MapView<'_>)],
    dataset: Option<&DatasetBinding>,
) -> Vec<WorkflowError> {
    let mut errors = Vec::new();
    for (node, (_, m)) in nodes.iter().zip(maps) {
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

/// `metric:` one term (a mapping) or a weighted list of terms.
fn metric(
    ctx: &Ctx<'_>,
    node: &Node,
    index: &BTreeMap<String, usize>,
    ids: &[&str],
    nodes: &[NodeSpec],
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
                return Err(WorkflowError::many(errors));
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
    nodes: &[NodeSpec],
    dataset: Option<&DatasetBinding>,
) -> Result<MetricTerm, WorkflowError> {
    let routed = nodes.iter().any(|n| matches!(&n.kind, NodeKind::Agent(a) if a.route.is_some()));
    if !routed {
        return Err(ctx.err(
            node.pos,
            "verifier",
            ErrorKind::BadType,
            "a `verifier` teaches the router of a routed workflow, and no node here has `deployment: {route: [...]}`",
        ));
    }
    if let Some(weight) = ctx.map(node, "verifier", METRIC_KEYS)?.get("weight") {
        return Err(ctx.err(weight.pos, "verifier.weight", ErrorKind::UnknownField, "a verifier is one term: it has no weight"));
    }
    metric_term(ctx, node, "verifier", index, ids, nodes, dataset)
}

fn metric_term(
    ctx: &Ctx<'_>,
    node: &Node,
    field: &str,
    index: &BTreeMap<String, usize>,
    ids: &[&str],
    nodes: &[NodeSpec],
    dataset: Option<&DatasetBinding>,
) -> Result<MetricTerm, WorkflowError> {
    let f = |k: &str| join_path(field, k);
    let m = ctx.map(node, field, METRIC_KEYS)?;
    let kn = m.required(ctx, field, "kind")?;
    let kind = match ctx.string(kn, &f("kind"))?.as_str() {
        "gsm8k_exact" => MetricKind::Gsm8kExact,
        "tests_pass" => MetricKind::TestsPass,
        "rouge_l" => MetricKind::RougeL,
        "verdict" => MetricKind::Verdict,
        other => {
            return Err(ctx.err(
                kn.pos,
                &f("kind"),
                ErrorKind::BadType,
                format!("metric kind `{other}`: expected gsm8k_exact, tests_pass, rouge_l or verdict"),
            ));
        }
    };
    let nn = m.required(ctx, field, "node")?;
    let mut targets = Vec::new();
    let mut target_nodes = Vec::new();
    for (name, pos) in ctx.string_list(nn, &f("node"))? {
        let target = resolve_id(ctx, &name, pos, &f("node"), index, ids)?;
        target_nodes.push(target);
        if kind == MetricKind::TestsPass
            && !matches!(&nodes[target].kind, NodeKind::Tool(t) if t.tool == "python_tests")
        {
            return Err(ctx.err(
                pos,
                &f("node"),
                ErrorKind::BadType,
                format!("tests_pass scores a `python_tests` tool node, and `{name}` is not one"),
            ));
        }
        if kind == MetricKind::Verdict
            && let Err(message) = verdicts_of(&nodes[target])
        {
            return Err(ctx.err(pos, &f("node"), ErrorKind::BadType, message));
        }
        targets.push(name);
    }
    if targets.is_empty() {
        return Err(ctx.err(nn.pos, &f("node"), ErrorKind::MissingField, "name at least one node"));
    }
    let reference = match m.get("reference") {
        None if matches!(kind, MetricKind::Gsm8kExact | MetricKind::RougeL) => {
            return Err(ctx.err(m.pos, &f("reference"), ErrorKind::MissingField, format!("a `{}` term compares with an input field: add `reference`", kind.name())));
        }
        None => None,
        Some(rn) => {
            let reference = ctx.string(rn, &f("reference"))?;
            if let Some(d) = dataset
                && !d.fields.contains_key(&reference)
            {
                return Err(ctx.err(
                    rn.pos,
                    &f("reference"),
                    ErrorKind::UnknownReference,
                    format!("input field `{reference}` is not mapped by the dataset"),
                ));
            }
            Some(reference)
        }
    };
    let pass = match m.get("pass") {
        Some(p) if kind == MetricKind::Verdict => {
            let list = ctx.string_list(p, &f("pass"))?;
            if list.is_empty() {
                return Err(ctx.err(p.pos, &f("pass"), ErrorKind::MissingField, "name at least one verdict that scores 1"));
            }
            // Each listed verdict must be one the scored nodes can give (where that is known),
            // or the term scores 0 for every session without a word.
            for (v, pos) in &list {
                for &t in &target_nodes {
                    if let Ok(Some(known)) = verdicts_of(&nodes[t])
                        && !known.contains(v)
                    {
                        return Err(ctx.err(
                            *pos,
                            &f("pass"),
                            ErrorKind::BadType,
                            format!("`{v}` is not a verdict `{}` gives (its verdicts: {})", nodes[t].id, known.join(", ")),
                        ));
                    }
                }
            }
            list.into_iter().map(|(s, _)| s).collect()
        }
        Some(p) => return Err(ctx.err(p.pos, &f("pass"), ErrorKind::UnknownField, "`pass` belongs to `verdict` terms")),
        None if kind == MetricKind::Verdict => {
            return Err(ctx.err(m.pos, &f("pass"), ErrorKind::MissingField, "a `verdict` term needs `pass`: the verdicts that score 1"));
        }
        None => Vec::new(),
    };
    let weight = match m.get("weight") {
        None => 1.0,
        Some(w) => {
            let v = ctx.f64(w, &f("weight"))?;
            if v <= 0.0 {
                return Err(ctx.err(w.pos, &f("weight"), ErrorKind::BadType, format!("weight {v} must be positive")));
            }
            v
        }
    };
    Ok(MetricTerm { kind, nodes: targets, reference, pass, weight })
}
