//! The workflow model: the YAML schema (documented in `workflows/README.md`), parsing with
//! positions, validation, the dataset binding and the static template graph (a petgraph
//! `DiGraph` of `after` edges plus the back edges of declared loops).
//!
//! A [`WorkflowSpec`] is immutable once loaded and shared (`Arc`) by every session of the
//! workflow. This module owns *what* a workflow is; it must not depend on sessions, the
//! planner, the simulator or any engine (of the responders it reads their names and the inputs each needs, of the tools their names,
//! inputs, and the custom tools' specs and verdicts). It reads files only in [`load_workflow`] and
//! [`WorkflowSpec::load_records`].

mod dataset;
mod error;
mod load;
pub mod template;
pub(crate) mod yaml;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use petgraph::Direction;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;
use switchyard_predictor::Dtype;

pub use dataset::{DatasetBinding, DatasetFormat, ExtractError, FieldSource, JoinSpec};
pub use error::{ErrorKind, WorkflowError};
pub use template::{Filter, Reference, Segment, Source, Template, TemplateBody, TemplateError};

use crate::schema::OutputSchema;
use crate::values::{LengthDist, Record};

/// The emulated responders a node may name: the responder module's list, the one source of truth.
pub const RESPONDERS: &[&str] = crate::responder::RESPONDERS;

/// The built-in tools a node may name: the tools crate's list.
pub const TOOLS: &[&str] = switchyard_tools::TOOLS;

/// The inputs each tool takes: `(tool, required, optional)` (see `switchyard_tools::run_tool`;
/// a test checks that every tool of [`TOOLS`] is listed).
pub const TOOL_INPUTS: &[(&str, &[&str], &[&str])] = &[
    ("python_tests", &["code", "tests"], &["imports"]),
    ("majority_vote", &["candidates"], &["extract"]),
    ("shell", &["command"], &["reads", "timeout_s"]),
];

/// The verdicts each tool gives (`python_tests`: all checks pass or not; `majority_vote`:
/// `switchyard_tools::majority_vote::VoteVerdict`), for checking branch conditions at load
/// time (a test checks the list against the tools).
pub const TOOL_VERDICTS: &[(&str, &[&str])] = &[
    ("python_tests", &["pass", "fail"]),
    ("majority_vote", &["majority", "plurality", "tie", "no_answer"]),
    ("shell", &["pass", "fail"]),
];

/// A deployment: a catalogue model with one serving configuration. Nodes naming the same
/// deployment may share a replica (and be fused into one unit).
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentSpec {
    pub name: String,
    /// Catalogue model name, canonical spelling (e.g. `Qwen3-8B`).
    pub model: String,
    pub dtype: Dtype,
    /// vLLM `--max-model-len`: prompt plus output, in tokens.
    pub max_context: u32,
    /// Upper bound on any node's output limit on this deployment.
    pub max_output_tokens: u32,
    /// vLLM `--gpu-memory-utilization` (fraction of the device's memory).
    pub gpu_memory_utilization: f64,
    /// `(line, column)` of the deployment's key in the workflow file (for later checks'
    /// errors, e.g. "fits no device of the pool").
    pub declared_at: (u64, u64),
}

/// One node of the workflow template.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    pub id: String,
    pub description: Option<String>,
    pub kind: NodeKind,
    /// Static predecessors (`after:`), as indices into [`WorkflowSpec::nodes`], in file order.
    pub after: Vec<usize>,
    /// Branch condition on one of the `after` predecessors; the node is skipped when false.
    pub when: Option<Condition>,
    /// Index into [`WorkflowSpec::loops`] of the loop whose body holds this node.
    pub loop_index: Option<usize>,
    /// For the tool step of an agent with tools (a node the loader adds, id `AGENT.TOOL`): the
    /// agent's index. `None` for the nodes of the file.
    pub tool_of: Option<usize>,
}

// An agent node is larger than a tool node; a workflow holds a handful of nodes, built once.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    Agent(AgentNode),
    Tool(ToolNode),
}

/// An LLM call: a generic agent (a role with a goal, answered on the emulated pool by the
/// `generic` responder) or one of the benchmark pipelines' responders.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentNode {
    /// The deployment the node runs on; for a routed node, its route's first member until a
    /// session is bound ([`WorkflowSpec::bound_to`]).
    pub deployment: String,
    /// A routed node (`deployment: {route: [...]}`): the deployments ORACLE's router chooses
    /// among, once per session (every routed node of a workflow declares the same route).
    pub route: Option<Vec<String>>,
    /// The agent's role (`role:`), if declared; it opens the prompt.
    pub role: Option<String>,
    /// The full prompt template: the role / goal / instructions preamble, the `prompt:` text,
    /// and for a structured output the instruction to answer with JSON of its schema.
    pub prompt: Template,
    /// Output limit of this node (≤ the deployment's).
    pub max_output_tokens: u32,
    /// The output-length distribution of this node (declared, or [`default_output_tokens`]).
    pub output_tokens: LengthDist,
    /// Qwen3 thinking mode (`thinking_tokens:`): the call is sent with `enable_thinking` and the
    /// model writes a reasoning trace of this length before its answer. The trace is generated
    /// (decode time, KV cache, `max_output_tokens` counts it, as vLLM's `max_tokens` does) but
    /// is not the node's output: successors, verdicts and metrics see the answer only, as with
    /// vLLM's `qwen3` reasoning parser (`reasoning_content` apart from `content`). `None`:
    /// thinking disabled (the chat template's empty `<think></think>` block).
    pub thinking_tokens: Option<LengthDist>,
    /// Name of the emulated responder (one of [`RESPONDERS`]; `generic` unless declared).
    pub responder: String,
    /// How the node runs in the rounds after the first of its loop (`next_rounds:`), e.g. a
    /// coder that repairs instead of writing from scratch.
    pub next_rounds: Option<RoundVariant>,
    /// A structured answer (`output:`): JSON satisfying a schema, optionally carrying the
    /// verdict that branch conditions test.
    pub output: Option<StructuredOutput>,
    /// The tools the agent may call (`tools:`, `max_turns:`): a ReAct loop of model turns and
    /// tool calls (see [`AgentTools`]). `None`: one call.
    pub tools: Option<AgentTools>,
}

impl AgentNode {
    /// The prompt of an activation in loop round `round` (0-based).
    pub fn prompt_for(&self, round: u32) -> &Template {
        match &self.next_rounds {
            Some(v) if round > 0 => &v.prompt,
            _ => &self.prompt,
        }
    }

    /// The responder of an activation in loop round `round` (0-based).
    pub fn responder_for(&self, round: u32) -> &str {
        match &self.next_rounds {
            Some(v) if round > 0 => &v.responder,
            _ => &self.responder,
        }
    }
}

/// An agent with tools: a ReAct loop. Each model turn is an activation of the agent (turn k
/// is round k of the agent's own loop, [`LoopSpec::agent`]); a turn whose answer ends with a
/// line `Action: NAME` ([`ACTION_PREFIX`]) calls that tool (verdict `tool:NAME`), whose run is
/// an activation of the tool step node `AGENT.NAME`; its text is the observation. The next
/// turn's prompt is the previous turn's prompt + its answer + the observation
/// ([`observation_text`]), so every turn extends the one before (one growing prefix). An
/// answer without an action line is the final answer (verdict [`FINAL_VERDICT`]), and so is
/// the answer of turn `max_turns`, whatever it says.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentTools {
    /// In declaration order.
    pub tools: Vec<AgentTool>,
    /// At least 1, at most [`MAX_TURNS`]: model turns, so at most `max_turns - 1` tool calls.
    pub max_turns: u32,
    /// The emulated agent's number of model turns (`turns:`, drawn once per session and
    /// capped by `max_turns`); default [`default_turns`].
    pub turns: LengthDist,
}

/// One tool an agent may call.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentTool {
    /// The name the agent calls it by (`Action: NAME`).
    pub name: String,
    pub description: Option<String>,
    /// Index into [`WorkflowSpec::nodes`] of its tool step node (`AGENT.NAME`).
    pub node: usize,
}

/// Upper bound of `max_turns`.
pub const MAX_TURNS: u32 = 64;

/// How an agent's answer calls a tool: a line `Action: NAME`.
pub const ACTION_PREFIX: &str = "Action: ";

/// The verdict of an agent turn that gave its final answer.
pub const FINAL_VERDICT: &str = "final";

/// The verdict of an agent turn that calls tool `name`.
pub fn tool_call_verdict(name: &str) -> String {
    format!("tool:{name}")
}

/// The default of `turns:`: a log-normal with mean `(max_turns + 1) / 2` turns and cv 0.5. A
/// stated default, not a measurement.
pub fn default_turns(max_turns: u32) -> LengthDist {
    LengthDist { mean: (f64::from(max_turns) + 1.0) / 2.0, cv: 0.5 }
}

/// What a turn's prompt gains after the agent's answer: the observation of tool `name`.
pub fn observation_text(name: &str, observation: &str) -> String {
    format!("\nObservation from `{name}`:\n{}\n", observation.trim_end())
}

impl AgentTools {
    /// The tool an answer calls: the last line `Action: NAME` naming one of the tools.
    pub fn called_in(&self, text: &str) -> Option<&AgentTool> {
        text.lines()
            .rev()
            .filter_map(|l| l.trim().strip_prefix(ACTION_PREFIX.trim_end()))
            .find_map(|name| self.tools.iter().find(|t| t.name == name.trim()))
    }

    /// An answer without its last line when that line calls a tool: what the agent handed in.
    pub fn answer_of<'t>(&self, text: &'t str) -> &'t str {
        match text.rsplit_once('\n') {
            Some((head, last)) if self.called_in(last).is_some() => head,
            _ => text,
        }
    }

    /// The tool a turn's verdict calls (`tool:NAME`).
    pub fn called_by(&self, verdict: Option<&str>) -> Option<&AgentTool> {
        let name = verdict?.strip_prefix("tool:")?;
        self.tools.iter().find(|t| t.name == name)
    }
}

/// The prompt and responder of an agent node in the rounds after the first of its loop.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundVariant {
    pub prompt: Template,
    pub responder: String,
}

/// A structured answer: the schema the answer satisfies, and the top-level property (a
/// boolean or a string enum) whose value is the node's verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct StructuredOutput {
    pub schema: OutputSchema,
    pub verdict: Option<String>,
}

/// The output-length distribution of an agent node that declares none: a log-normal with mean
/// `min(256, max_output_tokens / 2)` tokens and cv 0.5. A stated default, not a measurement:
/// declare `output_tokens` from what the role really writes.
pub fn default_output_tokens(max_output_tokens: u32) -> LengthDist {
    LengthDist { mean: f64::from(max_output_tokens / 2).clamp(1.0, 256.0), cv: 0.5 }
}

/// A tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolNode {
    /// One of [`TOOLS`].
    pub tool: String,
    pub inputs: BTreeMap<String, Template>,
    pub timeout_s: Option<f64>,
}

/// `{node, verdict}`: holds when the node's latest output has one of `verdicts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// Index into [`WorkflowSpec::nodes`].
    pub node: usize,
    pub verdicts: Vec<String>,
}

impl Condition {
    pub fn holds(&self, verdict: Option<&str>) -> bool {
        verdict.is_some_and(|v| self.verdicts.iter().any(|w| w == v))
    }
}

/// A declared, bounded loop. Round 0 of the body runs like any other part of the graph; after
/// a round, if `continue_when` holds on that round's output of its node and fewer than
/// `max_rounds` rounds ran, the body runs again: the entry nodes of the new round depend on
/// the previous round's `continue_when.node` activation (the implicit back edge).
#[derive(Debug, Clone, PartialEq)]
pub struct LoopSpec {
    pub id: String,
    pub description: Option<String>,
    /// Body nodes (indices), in file order.
    pub body: Vec<usize>,
    /// Body nodes without a predecessor inside the body.
    pub entries: Vec<usize>,
    pub continue_when: Condition,
    /// At least 1: the body runs at most this many times.
    pub max_rounds: u32,
    /// The body nodes whose previous-round activations the entries of a new round wait for:
    /// `[continue_when.node]` for a declared loop; an agent's tool steps for its turns.
    pub back_from: Vec<usize>,
    /// For the loop of an agent's turns (added by the loader, id `AGENT.turns`): the agent.
    pub agent: Option<usize>,
}

/// Edge kinds of the static template graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeKind {
    /// `after:` — the target waits for the source.
    After,
    /// The implicit back edge of a loop, from its `continue_when` node (an agent's turns: from
    /// each tool step) to an entry.
    LoopBack { loop_index: usize },
}

/// How one metric term scores a finished session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// The final answer after `####` matches the reference's.
    Gsm8kExact,
    /// The node (a `python_tests` tool) reports verdict `pass`.
    TestsPass,
    /// ROUGE-L F1 of the node's text against the reference.
    RougeL,
    /// The node's verdict is one of the term's `pass` verdicts (e.g. a reviewer's approval).
    Verdict,
}

impl MetricKind {
    /// The kind's name in a workflow file (`metric: {kind: …}`) and in reports.
    pub fn name(self) -> &'static str {
        match self {
            MetricKind::Gsm8kExact => "gsm8k_exact",
            MetricKind::TestsPass => "tests_pass",
            MetricKind::RougeL => "rouge_l",
            MetricKind::Verdict => "verdict",
        }
    }
}

/// One term of a workflow's score.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricTerm {
    pub kind: MetricKind,
    /// The nodes whose output is scored: the first of them that has one (like `{{a | b}}`).
    pub nodes: Vec<String>,
    /// Input field holding the reference (`gsm8k_exact`, `rouge_l`).
    pub reference: Option<String>,
    /// The verdicts that score 1 (`verdict` terms).
    pub pass: Vec<String>,
    /// Weight of the term in the workflow's score (default 1).
    pub weight: f64,
}

/// How a finished session is scored: the weighted mean of its terms, each in [0, 1].
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSpec {
    pub terms: Vec<MetricTerm>,
}

impl MetricSpec {
    /// The metric as a report names it: `TestsPass`, or `0.5 TestsPass + 0.5 Verdict`.
    pub fn label(&self) -> String {
        match self.terms.as_slice() {
            [one] => one.kind.name().to_string(),
            terms => terms
                .iter()
                .zip(self.shares())
                .map(|(t, share)| format!("{} {}", (share * 1000.0).round() / 1000.0, t.kind.name()))
                .collect::<Vec<_>>()
                .join(" + "),
        }
    }

    /// Each term's share of the score, summing to 1: its weight over the total, computed on the
    /// weights relative to the largest so that valid weights near `f64::MAX` do not overflow
    /// the sum (which scored every session NaN).
    pub fn shares(&self) -> Vec<f64> {
        let top = self.terms.iter().map(|t| t.weight).fold(0.0f64, f64::max);
        if !(top > 0.0 && top.is_finite()) {
            return vec![0.0; self.terms.len()];
        }
        let relative: Vec<f64> = self.terms.iter().map(|t| t.weight / top).collect();
        let total: f64 = relative.iter().sum();
        relative.iter().map(|r| r / total).collect()
    }

    /// The node whose output is the session's final answer: the first term's first node.
    pub fn answer_nodes(&self) -> &[String] {
        self.terms.first().map(|t| t.nodes.as_slice()).unwrap_or(&[])
    }
}

/// A loaded, validated workflow.
#[derive(Debug, Clone)]
pub struct WorkflowSpec {
    pub name: String,
    pub description: Option<String>,
    /// The workflow file (as given to the loader).
    pub path: PathBuf,
    pub deployments: BTreeMap<String, DeploymentSpec>,
    pub nodes: Vec<NodeSpec>,
    pub loops: Vec<LoopSpec>,
    pub dataset: Option<DatasetBinding>,
    pub metric: Option<MetricSpec>,
    /// `verifier:` the term whose verdict teaches a routed workflow's router (paper 002), when
    /// it is not the metric's single term: e.g. an LLM judge node's verdict. `None`: the metric.
    pub verifier: Option<MetricTerm>,
    /// The route member a routed session's copy of the workflow is bound to ([`Self::bound_to`]);
    /// `None` for the workflow as loaded.
    bound: Option<String>,
    graph: DiGraph<usize, EdgeKind>,
    index: BTreeMap<String, usize>,
    topo: Vec<usize>,
    /// `(line, column)` of the top-level `name` value (for later checks' errors).
    name_at: (u64, u64),
    /// Where each template of the file was written: its node, field path, `(line, column)` and
    /// which of the node's templates it is (for later checks' errors).
    template_sites: Vec<TemplateSite>,
    /// The dataset's records once read ([`Self::load_records`]): a run checks them before it
    /// starts and then runs on them, reading and parsing the file once. Copies of the spec
    /// (a routed session's [`Self::bound_to`]) share them.
    records: std::sync::OnceLock<Arc<Vec<Record>>>,
}

/// Where one template of a workflow file was written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TemplateSite {
    pub(crate) node: usize,
    pub(crate) field: String,
    pub(crate) at: (u64, u64),
    pub(crate) template: TemplateOf,
}

/// Which of a node's templates a [`TemplateSite`] is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TemplateOf {
    Prompt,
    NextRoundsPrompt,
    Input(String),
}

/// A field of a workflow file whose templates read something a run cannot give, placed like the
/// loader's errors: `FILE:LINE:COLUMN: FIELD: …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceSite {
    pub line: u64,
    pub column: u64,
    /// Dotted field path, e.g. `nodes.draft.prompt`.
    pub field: String,
    /// The references there, as written (`{{input.question}}`), sorted.
    pub references: Vec<String>,
}

/// Largest workflow file the loader reads (a workflow with long prompts is tens of KiB).
pub const MAX_WORKFLOW_BYTES: u64 = 4 << 20;
/// Most nodes a workflow may declare (agent teams have tens; the graph checks grow with the
/// square of the count, so a limit keeps a hostile file from taking gigabytes).
pub const MAX_NODES: usize = 2_000;
/// Most rounds a loop may run (`max_rounds`): a bound a run reaches, unlike u32::MAX.
pub const MAX_LOOP_ROUNDS: u32 = 10_000;
/// Most activations a workflow's loops may create in one session (each loop's body nodes ×
/// `max_rounds`, summed): each holds its output while the session runs, so 2,000 nodes ×
/// 10,000 rounds would be 20 million per session.
pub const MAX_LOOP_ACTIVATIONS: u64 = 100_000;

/// Read and validate a workflow file. Relative dataset paths resolve against its directory.
/// A file over [`MAX_WORKFLOW_BYTES`] is refused before it is read, and a stream that is not a
/// regular file (a pipe, `/dev/zero`) is read only up to that many bytes.
pub fn load_workflow(path: &Path) -> Result<WorkflowSpec, WorkflowError> {
    use std::io::Read;
    let file = path.display().to_string();
    let read_err = |source| WorkflowError::Read { file: file.clone(), source };
    let too_large = |what: String| WorkflowError::Invalid {
        file: file.clone(),
        line: 1,
        column: 1,
        field: "(document)".into(),
        kind: ErrorKind::TooLarge,
        message: format!("{what}; workflow files are read up to {MAX_WORKFLOW_BYTES} bytes"),
    };
    let size = std::fs::metadata(path).map_err(read_err)?.len();
    if size > MAX_WORKFLOW_BYTES {
        return Err(too_large(format!("the file is {size} bytes")));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path).map_err(read_err)?.take(MAX_WORKFLOW_BYTES + 1).read_to_end(&mut bytes).map_err(read_err)?;
    if bytes.len() as u64 > MAX_WORKFLOW_BYTES {
        return Err(too_large("the stream is longer".into()));
    }
    let text = crate::values::utf8_text(bytes).map_err(read_err)?;
    let base = path.parent().unwrap_or_else(|| Path::new("."));
    parse_workflow(&file, &text, base)
}

/// Whether the workflow text names a dataset (a top-level `dataset:` key), read without
/// parsing the workflow — which would look for the dataset file on this machine's disk. False
/// for text that is not a YAML mapping (the parse then says what is wrong).
pub fn names_dataset(text: &str) -> bool {
    match yaml::parse("request", text) {
        Ok(yaml::Node { value: yaml::Value::Map(entries), .. }) => entries.iter().any(|(k, _)| k.name == "dataset"),
        _ => false,
    }
}

/// The id (or, without one, the index) of a step in the text that lets the `shell` tool read
/// host paths — a mapping anywhere in the document with `tool: shell` and `inputs.reads` —
/// found without loading the workflow, which would look each path up on disk (a server refusing
/// such steps must not reveal which of its files exist). `None` when there is none, or when the
/// text is no YAML (the loader reports that).
pub fn names_shell_reads(text: &str) -> Option<String> {
    fn walk(node: &yaml::Node, index: Option<usize>) -> Option<String> {
        match &node.value {
            yaml::Value::Map(entries) => {
                let get = |k: &str| entries.iter().find(|(key, _)| key.name == k).map(|(_, v)| &v.value);
                // An agent's tool is named by `tool`, or by its `name` when `tool` is absent.
                let is_shell = match (get("tool"), get("name")) {
                    (Some(yaml::Value::Str(t)), _) | (None, Some(yaml::Value::Str(t))) => t == switchyard_tools::shell::NAME,
                    _ => false,
                };
                let reads = matches!(get("inputs"), Some(yaml::Value::Map(inputs)) if inputs.iter().any(|(k, _)| k.name == "reads"));
                if is_shell && reads {
                    return Some(match get("id").or(get("name")) {
                        Some(yaml::Value::Str(id)) => id.clone(),
                        _ => index.map_or_else(|| "?".to_string(), |i| i.to_string()),
                    });
                }
                entries.iter().find_map(|(_, v)| walk(v, None))
            }
            yaml::Value::Seq(items) => items.iter().enumerate().find_map(|(i, v)| walk(v, Some(i))),
            _ => None,
        }
    }
    walk(&yaml::parse("request", text).ok()?, None)
}

/// Parse and validate workflow text. `source_name` names the file in errors (and becomes
/// [`WorkflowSpec::path`]); `base_dir` is where relative dataset paths resolve.
pub fn parse_workflow(
    source_name: &str,
    text: &str,
    base_dir: &Path,
) -> Result<WorkflowSpec, WorkflowError> {
    load::build(source_name, text, base_dir)
}

impl WorkflowSpec {
    /// Read the dataset and map each record to the input fields. Errors name the record index
    /// and the field. A workflow without a dataset (its nodes need no input, which loading
    /// checked) has one empty record: every session runs the same prompts. The file is read
    /// on the first call only; later calls share those records (a failed read is not kept:
    /// the next call reads again).
    pub fn load_records(&self) -> Result<Arc<Vec<Record>>, WorkflowError> {
        if let Some(records) = self.records.get() {
            return Ok(Arc::clone(records));
        }
        let records = Arc::new(match &self.dataset {
            Some(d) => d.load_records()?,
            None => vec![Record::new()],
        });
        Ok(Arc::clone(self.records.get_or_init(|| records)))
    }

    pub fn node(&self, id: &str) -> Option<&NodeSpec> {
        self.index.get(id).map(|&i| &self.nodes[i])
    }

    /// The route of a routed workflow (its routed nodes all declare it), if it has one.
    pub fn route(&self) -> Option<&[String]> {
        self.nodes.iter().find_map(|n| match &n.kind {
            NodeKind::Agent(a) => a.route.as_deref(),
            NodeKind::Tool(_) => None,
        })
    }

    /// The workflow as a session bound to route member `deployment` runs it: every routed node
    /// on that deployment. The route stays on the nodes (it says what was chosen among).
    pub fn bound_to(&self, deployment: &str) -> WorkflowSpec {
        let mut spec = self.clone();
        spec.bound = Some(deployment.to_string());
        for n in &mut spec.nodes {
            if let NodeKind::Agent(a) = &mut n.kind
                && a.route.as_ref().is_some_and(|r| r.iter().any(|m| m == deployment))
            {
                a.deployment = deployment.to_string();
            }
        }
        spec
    }

    /// The route member this copy is bound to (a routed session's workflow), if any: its
    /// routed nodes then run on that deployment, known statically.
    pub fn bound_member(&self) -> Option<&str> {
        self.bound.as_deref()
    }

    pub fn node_index(&self, id: &str) -> Option<usize> {
        self.index.get(id).copied()
    }

    /// The deployment an agent node runs on (`None` for tools and bad indices).
    pub fn deployment_of(&self, node: usize) -> Option<&DeploymentSpec> {
        match &self.nodes.get(node)?.kind {
            NodeKind::Agent(a) => self.deployments.get(&a.deployment),
            NodeKind::Tool(_) => None,
        }
    }

    /// The static template graph: node weights are indices into [`Self::nodes`] (and equal
    /// the graph's own node indices); edges are `after` edges and loop back edges.
    pub fn graph(&self) -> &DiGraph<usize, EdgeKind> {
        &self.graph
    }

    /// Static predecessors (`after`) of a node.
    pub fn predecessors(&self, node: usize) -> &[usize] {
        self.nodes
            .get(node)
            .map(|n| n.after.as_slice())
            .unwrap_or(&[])
    }

    /// Static successors of a node along `after` edges (loop back edges excluded), ascending.
    pub fn successors(&self, node: usize) -> Vec<usize> {
        if node >= self.nodes.len() {
            return Vec::new();
        }
        let mut out: Vec<usize> = self
            .graph
            .edges_directed(NodeIndex::new(node), Direction::Outgoing)
            .filter(|e| *e.weight() == EdgeKind::After)
            .map(|e| e.target().index())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Nodes in a topological order of the `after` edges (ties by file order).
    pub fn topological_order(&self) -> &[usize] {
        &self.topo
    }

    /// Nodes without successors along `after` edges, in file order (an agent's tool steps are
    /// inside its turns, never a sink).
    pub fn sinks(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].tool_of.is_none() && self.successors(i).is_empty())
            .collect()
    }

    /// The loop whose body holds `node`.
    pub fn loop_of(&self, node: usize) -> Option<&LoopSpec> {
        self.nodes
            .get(node)?
            .loop_index
            .and_then(|l| self.loops.get(l))
    }

    /// Every `{{…}}` reference of every node's templates.
    fn references(&self) -> impl Iterator<Item = &Reference> {
        self.nodes.iter().flat_map(|n| node_templates(n).into_iter()).flat_map(|t| t.references().into_iter())
    }

    /// References that read nothing but input fields (`{{input.X}}`, no `?`, `default` or other
    /// source after it), as written, sorted: without inputs (a workflow without a dataset, run
    /// from the command line) they can never resolve, and every session reaching them fails.
    pub fn input_only_references(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .references()
            .filter(|r| r.sources.iter().all(|s| matches!(s, Source::Input(_))))
            .map(|r| format!("{{{{{}}}}}", r.text))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// [`Self::input_only_references`] by where they are written: one site per template field
    /// (in file order) holding at least one.
    pub fn input_only_reference_sites(&self) -> Vec<ReferenceSite> {
        let mut out: Vec<ReferenceSite> = Vec::new();
        for site in &self.template_sites {
            let Some(node) = self.nodes.get(site.node) else { continue };
            let template = match (&site.template, &node.kind) {
                (TemplateOf::Prompt, NodeKind::Agent(a)) => Some(&a.prompt),
                (TemplateOf::NextRoundsPrompt, NodeKind::Agent(a)) => a.next_rounds.as_ref().map(|v| &v.prompt),
                (TemplateOf::Input(k), NodeKind::Tool(t)) => t.inputs.get(k),
                _ => None,
            };
            let Some(template) = template else { continue };
            let mut references: Vec<String> = template
                .references()
                .into_iter()
                .filter(|r| r.sources.iter().all(|s| matches!(s, Source::Input(_))))
                .map(|r| format!("{{{{{}}}}}", r.text))
                .collect();
            references.sort();
            references.dedup();
            if !references.is_empty() {
                out.push(ReferenceSite { line: site.at.0, column: site.at.1, field: site.field.clone(), references });
            }
        }
        out.sort_by_key(|s| (s.line, s.column));
        out
    }

    /// `(line, column)` of the workflow's `name` in its file.
    pub fn name_declared_at(&self) -> (u64, u64) {
        self.name_at
    }

    /// Input fields the templates read (`{{input.X}}`), sorted.
    pub fn input_fields(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .references()
            .flat_map(|r| r.sources.iter())
            .filter_map(|s| match s {
                Source::Input(f) => Some(f.clone()),
                _ => None,
            })
            .collect();
        if let Some(m) = &self.metric {
            out.extend(m.terms.iter().filter_map(|t| t.reference.clone()));
        }
        out.sort();
        out.dedup();
        out
    }
}

/// The templates of a node (the prompt and the later rounds' prompt, or the tool inputs in
/// name order).
pub fn node_templates(n: &NodeSpec) -> Vec<&Template> {
    match &n.kind {
        NodeKind::Agent(a) => std::iter::once(&a.prompt).chain(a.next_rounds.as_ref().map(|v| &v.prompt)).collect(),
        NodeKind::Tool(t) => t.inputs.values().collect(),
    }
}
