//! What both shells do when an activation becomes ready or near-ready: render a ready
//! activation (tool inputs; or the prompt, its token count as a Qwen3 vLLM server counts the
//! chat request (`tokens::encode_chat`: the chat template's tokens around the content) and
//! its prefix-block hashes (the template's prefix leads the first block),
//! the responder's output and the planner's [`WorkItem`]), list newly near-ready activations as
//! the planner's [`NearReadyItem`]s, turn a finished tool call into the session's output, its
//! trace detail and its sandbox note, and score a finished session under its workflow's metric.
//!
//! Pure functions of their arguments and the seeds: no clock, no I/O, no randomness beyond the
//! seeded responders, so both shells hand the planner the same items. Must not depend on `sim`
//! or `live`, on engines, or on the emulator crate.

use std::collections::BTreeSet;
use std::sync::Arc;

use switchyard_tools::{ToolCall, ToolOutcome};

use super::graph_info::{self, NodeFacts, NodeInfo};
use super::{BLOCK_SIZE, DeploymentMap, ShellError};
use crate::ids::ActivationId;
use crate::planner::{DeploymentInfo, NearReadyItem, PriorContext, WorkItem};
use crate::responder::{self, ResponderRequest};
use crate::session::{ActivationState, Session};
use crate::tokens;
use crate::values::{NodeOutput, derive_seed};
use crate::workflow::{ACTION_PREFIX, AgentNode, AgentTools, FINAL_VERDICT, MetricKind, MetricTerm, NodeKind, tool_call_verdict};

/// A ready LLM activation's request: the rendered prompt, its tokens and the responder output.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedLlm {
    pub prompt: String,
    pub prompt_tokens: u32,
    /// Prefix-cache block hashes of the prompt (vLLM block size [`BLOCK_SIZE`]).
    pub prefix_hashes: Vec<u64>,
    /// The responder's output: the answer an emulated engine returns for this call;
    /// `output_tokens` counts every generated token, the reasoning trace included.
    pub output: NodeOutput,
    pub max_output_tokens: u32,
    /// Qwen3 thinking mode for this call (`enable_thinking`), and the reasoning trace's
    /// length in tokens (0 when off), generated before the answer.
    pub enable_thinking: bool,
    pub thinking_tokens: u32,
}

impl PreparedLlm {
    /// What an emulated engine generates for this call: the reasoning trace (thinking mode),
    /// then the answer, as Qwen3 writes them (`<think>…</think>` before the content).
    pub fn emulated_completion(&self) -> String {
        if self.enable_thinking {
            format!("{}{}", responder::reasoning_trace(self.thinking_tokens), self.output.text)
        } else {
            self.output.text.clone()
        }
    }
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
    pub node_info: &'a NodeFacts,
}

/// Render what ready activation `a` of `session` (of workflow index `workflow`) needs: tool
/// inputs (the tool activation is marked running), or the prompt, its tokens and the
/// responder's output (seeded by (seed, workflow, session, node, round), so both shells get the
/// same output).
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
            // The prompt is sent as one user message; vLLM tokenises it inside Qwen3's chat
            // template, so the template's tokens count and lead the hashed prefix blocks.
            let enable_thinking = agent.thinking_tokens.is_some();
            let ids = tokens::encode_chat_mode(&segments, enable_thinking);
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
                responder: agent.responder_for(round),
                node: &node.id,
                model: &info.model,
                input: session.input(),
                prompt: &prompt,
                upstream: &upstream,
                length: agent.output_tokens,
                max_output_tokens: agent.max_output_tokens,
                seed: derive_seed(ctx.seed, &[&wf_name, &a.session.0.to_string(), &node.id, &round.to_string()]),
                role: agent.role.as_deref(),
                schema: agent.output.as_ref().map(|o| &o.schema),
                verdict_field: agent.output.as_ref().and_then(|o| o.verdict.as_deref()),
            };
            let mut output = match responder::respond(&req) {
                Ok(o) => o,
                Err(e) => return Ok(Ready::Fail(format!("{}: responder: {e}", node.id))),
            };
            if let Some(tools) = &agent.tools {
                let turns_seed = derive_seed(ctx.seed, &[&wf_name, &a.session.0.to_string(), &node.id, "turns"]);
                output = emulated_turn(session, a.index, agent, tools, turns_seed, req.seed, output);
            }
            // Thinking mode: a reasoning trace precedes the answer; vLLM's `max_tokens` caps
            // the trace and the answer together.
            let thinking_tokens = match agent.thinking_tokens {
                Some(dist) => {
                    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(derive_seed(req.seed, &["thinking"]));
                    dist.sample(&mut rng, agent.max_output_tokens).min(agent.max_output_tokens.saturating_sub(output.output_tokens))
                }
                None => 0,
            };
            output.output_tokens += thinking_tokens;
            let prompt_tokens = ids.len() as u32;
            // The node is held to its own deployment's `max_context`, whatever else the run
            // declares of the model: the shared replica is served with the largest context any
            // workflow asks of it, but a node may never use more than its file declared.
            let (context, declared_by) = match session.spec().deployments.get(&agent.deployment) {
                Some(d) => (d.max_context.min(info.max_model_len), d.name.as_str()),
                None => (info.max_model_len, agent.deployment.as_str()),
            };
            if prompt_tokens as u64 + output.output_tokens as u64 > context as u64 {
                return Ok(Ready::Fail(format!(
                    "{}: prompt of {prompt_tokens} tokens + {} output tokens exceeds deployment `{declared_by}`'s max_context {context}",
                    node.id, output.output_tokens
                )));
            }
            let prefix_hashes = tokens::block_hashes(&ids, BLOCK_SIZE as usize);
            let node_index = session.activation(a.index).map(|x| x.node).unwrap_or(0);
            // A later turn of an agent with tools starts with its previous turn's context.
            let prior_context = match (&agent.tools, session.activation(a.index)) {
                (Some(_), Some(act)) => previous_turn(session, act.node, act.round).map(|(index, segments, _)| {
                    let cached = cached_prompt(&segments, enable_thinking);
                    PriorContext {
                        activation: ActivationId { session: a.session, index },
                        tokens: whole_blocks(common_prefix(&ids, &cached)),
                    }
                }),
                _ => None,
            };
            let Some(info) = ctx.node_info.of(workflow, session.spec()) else {
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
                chain_rest: graph_info::chain_rest(&spec, info, session, node_index),
                remaining_path_tokens: info[node_index].remaining_path_tokens,
                further_round_tokens: graph_info::further_round_tokens(info, node_index, round),
                prior_context,
            };
            let prepared = PreparedLlm {
                prompt,
                prompt_tokens,
                prefix_hashes,
                output,
                max_output_tokens: agent.max_output_tokens,
                enable_thinking,
                thinking_tokens,
            };
            Ok(Ready::Llm { item, prepared, node: node.id.clone() })
        }
    }
}

/// The emulated answer of one turn of an agent with tools, from the responder's `drawn` answer
/// (documented in `workflows/README.md`, *Agents with tools*): the emulated agent takes `T`
/// turns, drawn once per session and node from its `turns` (seed `turns_seed`) and capped by
/// `max_turns`; a turn before the `T`-th calls a tool — its only tool, or one drawn with the
/// turn's `seed` — by ending its answer with `Action: NAME`; the `T`-th turn is the final
/// answer. A turn after a tool run with verdict `pass` is the final answer at once, and hands
/// in the answer that passed (without its action line).
fn emulated_turn(
    session: &Session,
    index: u32,
    agent: &AgentNode,
    tools: &AgentTools,
    turns_seed: u64,
    seed: u64,
    drawn: NodeOutput,
) -> NodeOutput {
    use rand::{Rng, SeedableRng};
    let Some(act) = session.activation(index) else { return drawn };
    let output_of = |node: usize, round: u32| session.activation(session.activation_for(node, round)?)?.output.as_ref();
    if let Some(prev) = act.round.checked_sub(1) {
        let passed = tools.tools.iter().any(|t| output_of(t.node, prev).is_some_and(|o| o.verdict.as_deref() == Some("pass")));
        if passed && let Some(answer) = output_of(act.node, prev) {
            let text = tools.answer_of(&answer.text).to_string();
            let output_tokens = (tokens::count(&text) as u32).clamp(1, agent.max_output_tokens);
            return NodeOutput { verdict: Some(FINAL_VERDICT.into()), value: answer.value.clone(), output_tokens, text };
        }
    }
    let turns = tools.turns.sample(&mut rand_chacha::ChaCha8Rng::seed_from_u64(turns_seed), tools.max_turns);
    if act.round + 1 >= turns.min(tools.max_turns) || tools.tools.is_empty() {
        return NodeOutput { verdict: Some(FINAL_VERDICT.into()), ..drawn };
    }
    let k = match tools.tools.len() {
        1 => 0,
        n => rand_chacha::ChaCha8Rng::seed_from_u64(derive_seed(seed, &["tool"])).random_range(0..n),
    };
    let name = &tools.tools[k].name;
    let action = format!("\n{ACTION_PREFIX}{name}");
    let output_tokens = (drawn.output_tokens + tokens::count(&action) as u32).min(agent.max_output_tokens);
    NodeOutput { text: format!("{}{action}", drawn.text), verdict: Some(tool_call_verdict(name)), value: drawn.value, output_tokens }
}

/// Tokens a tool's observation is assumed to add to the next turn's prompt, for a near-ready
/// turn's prompt bound (the bound graph_info gives a tool's output).
const OBSERVATION_BOUND_TOKENS: u32 = 256;

/// How many times a structured agent's call is sent again when a real model's answer does not
/// satisfy the node's schema (so at most `1 + MAX_SCHEMA_RETRIES` calls), before the session
/// fails naming the violation.
pub const MAX_SCHEMA_RETRIES: u32 = 2;

/// Why a real model's answer to a structured agent was rejected by [`model_output`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// No JSON value could be found in the answer's text.
    #[error("the answer holds no JSON value")]
    NoJson,
    /// The JSON value found violates the node's output schema.
    #[error("the answer does not satisfy the output schema: {0}")]
    Schema(crate::schema::SchemaError),
}

/// The session's output of an LLM call that returned `text` (`output_tokens` generated) for an
/// activation of `agent` whose emulated answer is `emulated`. The emulated engine returns the
/// responder's text: its verdict and value are kept. A real model's own text is taken as it
/// is — for a structured output, the JSON found in it must satisfy the schema (its `verdict`
/// property becomes the verdict); `Err` names the violation.
pub fn model_output(agent: &AgentNode, emulated: &NodeOutput, text: String, output_tokens: u32) -> Result<NodeOutput, AnswerError> {
    // A thinking model's reasoning is not its answer (vLLM's reasoning parser returns it
    // apart; without one it leads the content).
    let text = match responder::strip_reasoning(&text) {
        Some(answer) => answer.to_string(),
        None => text,
    };
    if text == emulated.text {
        return Ok(emulated.clone());
    }
    let Some(structured) = &agent.output else {
        // An agent with tools: a last line `Action: NAME` calls that tool, else the answer is final.
        let verdict = agent.tools.as_ref().map(|t| match t.called_in(&text) {
            Some(tool) => tool_call_verdict(&tool.name),
            None => FINAL_VERDICT.to_string(),
        });
        return Ok(NodeOutput { text, verdict, value: serde_json::Value::Null, output_tokens });
    };
    let Some(value) = crate::schema::extract_json(&text) else {
        return Err(AnswerError::NoJson);
    };
    structured.schema.check(&value).map_err(AnswerError::Schema)?;
    let verdict = structured.verdict.as_deref().and_then(|f| crate::schema::verdict_of(&value, f));
    Ok(NodeOutput { text, verdict, value, output_tokens })
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
        let (mut prompt_bound, _) = graph_info::prompt_bound(session.spec(), node_info, session, act.node, &[]);
        // A later turn of an agent with tools: the previous turn's prompt and answer, the
        // template's generation suffix, and the observation to come.
        let mut prior_context = None;
        let thinking = agent.thinking_tokens.is_some();
        if agent.tools.is_some()
            && let Some((index, mut segments, answer)) = previous_turn(session, act.node, act.round)
        {
            let cached = cached_prompt(&segments, thinking);
            prior_context = Some(PriorContext {
                activation: ActivationId { session: s, index },
                tokens: whole_blocks(cached.len()),
            });
            segments.push(answer);
            let known = tokens::encode_chat_mode(&segments, thinking).len() as u32;
            prompt_bound = known.saturating_add(OBSERVATION_BOUND_TOKENS);
        }
        items.push(NearReadyItem {
            activation: a,
            workflow,
            deployment,
            node: act.node as u32,
            waits_for,
            prompt_bound,
            max_output_tokens: agent.max_output_tokens,
            prior_context,
            chain_prev: graph_info::chain_prev_activation(node_info, session, a),
            chain_rest: graph_info::chain_rest(session.spec(), node_info, session, act.node),
        });
    }
    items
}

/// The previous turn of an agent with tools whose next turn is round `round` of `node`: its
/// activation index, its prompt's segments and its answer. The next turn's prompt is those
/// segments, the answer and the observation, in one user message. `None` for a first turn or a
/// turn without an answer.
fn previous_turn(session: &Session, node: usize, round: u32) -> Option<(u32, Vec<String>, String)> {
    let prev = session.activation_for(node, round.checked_sub(1)?)?;
    let answer = session.activation(prev)?.output.as_ref()?.text.clone();
    let segments = session.render_prompt(prev).ok()?;
    Some((prev, segments, answer))
}

/// The tokens of a prompt of `segments` that a later prompt extending its content can find in
/// the engine's prefix cache: the prompt without the chat template's generation suffix. The
/// engine computed [prompt, suffix, answer]; the next turn's prompt is [prompt, answer,
/// observation, suffix], so the answer's blocks (behind the suffix) never match.
fn cached_prompt(segments: &[String], thinking: bool) -> Vec<u32> {
    let mut ids = tokens::encode_chat_mode(segments, thinking);
    let suffix = tokens::count(&tokens::chat_generation_suffix(thinking));
    ids.truncate(ids.len().saturating_sub(suffix));
    ids
}

/// Length of the longest common prefix of two token sequences.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// `tokens` rounded down to whole KV blocks (prefix caching shares only full blocks).
pub fn whole_blocks(tokens: usize) -> u32 {
    u32::try_from(tokens / BLOCK_SIZE as usize * BLOCK_SIZE as usize).unwrap_or(u32::MAX)
}

/// A tool outcome's sandbox note as a run's notes keep it: without the per-run uid, which
/// differs between calls (the rest says what the sandbox got).
pub fn sandbox_note(outcome: &ToolOutcome) -> Option<String> {
    let note = outcome.sandbox_note.as_deref()?;
    Some(note.split("; ").filter(|p| !p.starts_with("uid:")).collect::<Vec<_>>().join("; "))
}

/// What a finished tool call hands its session: the tool's text, verdict and value.
pub fn tool_output(outcome: ToolOutcome) -> NodeOutput {
    NodeOutput { text: outcome.text, verdict: outcome.verdict, value: outcome.value, output_tokens: 0 }
}

/// The trace's detail of a finished tool call: its verdict, and for a failed call the cause
/// (`fail: timeout`).
pub fn tool_trace_detail(outcome: &ToolOutcome) -> Option<String> {
    match (&outcome.verdict, &outcome.failure) {
        (Some(verdict), Some(failure)) => Some(format!("{verdict}: {}", failure.cause.name())),
        (None, Some(failure)) => Some(format!("failed: {}", failure.cause.name())),
        (verdict, None) => verdict.clone(),
    }
}

/// The session's score under its workflow's metric: the weighted mean of its terms (GSM8K
/// exact answer, MBPP tests pass, QMSum ROUGE-L F1, a verdict among the passing ones), each
/// read from the first of its nodes that has an output (0 when none has); `None` when the
/// workflow has no metric.
pub fn session_score(session: &Session) -> Option<f64> {
    let m = session.spec().metric.as_ref()?;
    Some(m.terms.iter().zip(m.shares()).map(|(t, share)| share * term_score(session, t)).sum())
}

/// The score of a routed session under its workflow's own `verifier:` term (e.g. an LLM
/// judge's verdict), when it declares one; `None` otherwise (the metric is the verifier).
pub fn verifier_score(session: &Session) -> Option<f64> {
    session.spec().verifier.as_ref().map(|t| term_score(session, t))
}

/// One term's score in [0, 1], read from the first of its nodes that has an output.
fn term_score(session: &Session, t: &MetricTerm) -> f64 {
    let spec = session.spec();
    let reference = t
        .reference
        .as_ref()
        .and_then(|r| session.input().get(r))
        .map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_default();
    let output = t.nodes.iter().find_map(|n| session.latest_output(spec.node_index(n)?));
    match (t.kind, output) {
        (_, None) => 0.0,
        (MetricKind::Gsm8kExact, Some(o)) => responder::gsm8k_exact(o, &reference),
        (MetricKind::TestsPass, Some(o)) => responder::tests_pass(o),
        (MetricKind::RougeL, Some(o)) => responder::rouge_l_f1(&o.text, &reference),
        (MetricKind::Verdict, Some(o)) => {
            if o.verdict.as_ref().is_some_and(|v| t.pass.contains(v)) { 1.0 } else { 0.0 }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::tests::bundled_workflows as workflows;
    use crate::exec::{deployment_table, load_records, node_infos};
    use crate::ids::SessionId;

    #[test]
    fn real_answers_to_structured_agents_are_checked_against_the_schema() {
        let wf = crate::workflow::parse_workflow(
            "t.yaml",
            "name: t\ndeployments:\n  d: {model: Qwen3-8B, max_context: 4096, max_output_tokens: 256}\nnodes:\n  - id: review\n    deployment: d\n    prompt: Review.\n    output:\n      schema: {type: object, properties: {approved: {type: boolean}}, required: [approved]}\n      verdict: approved\n",
            std::path::Path::new("."),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let NodeKind::Agent(agent) = &wf.nodes[0].kind else { panic!("not an agent") };
        let emulated = NodeOutput { text: "{\"approved\":true}".into(), verdict: Some("true".into()), ..NodeOutput::default() };
        assert_eq!(model_output(agent, &emulated, emulated.text.clone(), 5), Ok(emulated.clone()));
        let real = model_output(agent, &emulated, "Sure:\n```json\n{\"approved\": false}\n```".into(), 9);
        assert_eq!(real.as_ref().map(|o| o.verdict.as_deref()), Ok(Some("false")));
        assert_eq!(real.map(|o| o.output_tokens), Ok(9));
        assert!(model_output(agent, &emulated, "{\"approved\": \"yes\"}".into(), 5).is_err_and(|e| e.to_string().contains("approved")));
        assert!(model_output(agent, &emulated, "I approve.".into(), 5).is_err_and(|e| e.to_string().contains("no JSON")));
        // The messages the session's failure and its log carry.
        assert_eq!(model_output(agent, &emulated, "I approve.".into(), 5).map_err(|e| e.to_string()), Err("the answer holds no JSON value".to_string()));
        let violation = model_output(agent, &emulated, "{}".into(), 5).map_err(|e| e.to_string());
        assert!(violation.as_ref().is_err_and(|e| e.starts_with("the answer does not satisfy the output schema: ")), "{violation:?}");
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
        // Segment-wise BPE (as both shells count) is within a few tokens of the whole chat
        // prompt's, template included.
        let whole = tokens::count(&tokens::chat_prompt(&p1.prompt)) as i64;
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
    fn a_node_is_held_to_its_own_deployments_context_whatever_else_the_run_declares() {
        let parse = |name: &str, yaml: &str| {
            Arc::new(crate::workflow::parse_workflow(name, yaml, std::path::Path::new(".")).unwrap_or_else(|e| panic!("{e}")))
        };
        let small = parse(
            "small.yaml",
            "name: small\ndeployments:\n  q4: {model: Qwen3-4B, dtype: fp16, max_context: 1024, max_output_tokens: 128}\nnodes:\n  - {id: map, deployment: q4, prompt: \"Summarize: {{input.text}}\"}\n",
        );
        // Another workflow of the run serves the same model with a larger context.
        let big = parse(
            "big.yaml",
            "name: big\ndeployments:\n  q4: {model: Qwen3-4B, dtype: fp16, max_context: 16384, max_output_tokens: 128}\nnodes:\n  - {id: a, deployment: q4, prompt: hi}\n",
        );
        let mut record = crate::values::Record::new();
        record.insert("text".into(), serde_json::json!(" word".repeat(2000)));
        let first = |wfs: Vec<Arc<crate::workflow::WorkflowSpec>>| {
            let (table, of) = deployment_table(&wfs, 8).unwrap();
            let info = node_infos(&wfs, &of);
            let ctx = PrepareContext { seed: 1, deployments: &table, deployment_of: &of, node_info: &info };
            let mut s = Session::new(SessionId(0), Arc::clone(&wfs[0]), record.clone()).unwrap();
            let a = s.ready()[0];
            match prepare(&ctx, &mut s, 0, a, 0.0).unwrap() {
                Ready::Fail(reason) => reason,
                _ => "ran".to_string(),
            }
        };
        let alone = first(vec![Arc::clone(&small)]);
        assert!(alone.starts_with("map: prompt of ") && alone.ends_with("exceeds deployment `q4`'s max_context 1024"), "{alone}");
        // The replica is shared and served at 16,384 tokens, but `map` still gets its own 1,024.
        let (table, _) = deployment_table(&[Arc::clone(&small), Arc::clone(&big)], 8).unwrap();
        assert_eq!(table.iter().map(|d| d.max_model_len).collect::<Vec<_>>(), [16384]);
        assert_eq!(first(vec![small, big]), alone);
    }

    #[test]
    fn an_agent_with_tools_grows_one_prefix_and_ends_within_its_turns() {
        let yaml = "name: r\ndeployments:\n  d: {model: Qwen3-8B, max_context: 8192, max_output_tokens: 256}\nnodes:\n  - id: fixer\n    deployment: d\n    prompt: Fix it.\n    output_tokens: {mean: 60, cv: 0.3}\n    tools:\n      - name: run_tests\n        tool: python_tests\n        inputs: {code: \"{{fixer}}\", tests: [\"assert f() == 1\"]}\n    max_turns: 5\n    turns: {mean: 4, cv: 0.5}\n";
        let wf = Arc::new(crate::workflow::parse_workflow("r.yaml", yaml, std::path::Path::new(".")).unwrap_or_else(|e| panic!("{e}")));
        let wfs = vec![Arc::clone(&wf)];
        let (table, of) = deployment_table(&wfs, 8).unwrap();
        let info = node_infos(&wfs, &of);
        // Every turn and tool call of one session; the tool's verdict is `observed`.
        let drive = |seed: u64, observed: &str| -> Vec<(PreparedLlm, Option<PriorContext>, u32)> {
            let ctx = PrepareContext { seed, deployments: &table, deployment_of: &of, node_info: &info };
            let mut s = Session::new(SessionId(0), Arc::clone(&wf), crate::values::Record::default()).unwrap();
            let mut turns = Vec::new();
            while let Some(a) = s.ready().first().copied() {
                match prepare(&ctx, &mut s, 0, a, 0.0).unwrap() {
                    Ready::Llm { prepared, item, .. } => {
                        s.mark_running(a.index).unwrap();
                        s.complete(a.index, prepared.output.clone()).unwrap();
                        turns.push((prepared, item.prior_context, a.index));
                    }
                    Ready::Tool { call, .. } => {
                        assert_eq!(call.inputs["code"], serde_json::json!(turns.last().map(|t| t.0.output.text.clone())));
                        let o = NodeOutput { text: "0/1 tests passed".into(), verdict: Some(observed.into()), ..NodeOutput::default() };
                        s.complete(a.index, o).unwrap();
                    }
                    Ready::Fail(e) => panic!("{e}"),
                }
            }
            assert!(s.is_finished());
            turns
        };
        let mut counts = BTreeSet::new();
        for seed in 0..24 {
            let turns = drive(seed, "fail");
            assert!((1..=5).contains(&turns.len()));
            counts.insert(turns.len());
            let (last, calls) = turns.split_last().unwrap();
            let last = &last.0;
            assert_eq!(last.output.verdict.as_deref(), Some("final"));
            assert!(!last.output.text.contains("Action: "));
            assert_eq!(turns[0].1, None, "a first turn has no earlier context");
            for (k, (t, _, index)) in calls.iter().enumerate() {
                assert_eq!(t.output.verdict.as_deref(), Some("tool:run_tests"));
                assert!(t.output.text.ends_with("\nAction: run_tests"));
                // The next turn extends this one: same text, then its answer; same KV blocks but
                // the last (the chat template's end shares the block).
                let (next, prior, _) = &turns[k + 1];
                assert!(next.prompt.starts_with(&format!("{}{}", t.prompt, t.output.text)));
                assert!(next.prompt_tokens > t.prompt_tokens);
                let shared = t.prefix_hashes.len() - 1;
                assert_eq!(next.prefix_hashes[..shared], t.prefix_hashes[..shared]);
                // Its cache credit names this turn and covers, in whole blocks, the blocks the two
                // prompts share (this turn's prompt up to the template's generation suffix; the
                // answer came after the suffix, so its blocks do not match).
                let prior = prior.unwrap_or_else(|| panic!("turn {} has no prior context", k + 1));
                assert_eq!(prior.activation, ActivationId { session: SessionId(0), index: *index });
                assert_eq!(prior.tokens % BLOCK_SIZE, 0);
                let same = next.prefix_hashes.iter().zip(&t.prefix_hashes).take_while(|(a, b)| a == b).count() as u32;
                assert_eq!(prior.tokens / BLOCK_SIZE, same, "{prior:?}: {same} blocks really match");
            }
        }
        assert!(counts.len() >= 3, "the number of turns is drawn: {counts:?}");
        assert_eq!(drive(7, "fail"), drive(7, "fail"));
        // A passing tool run ends the turns at once with the answer that passed.
        for seed in 0..8 {
            let turns = drive(seed, "pass");
            assert!(turns.len() <= 2);
            if let [(first, ..), (last, ..)] = turns.as_slice() {
                assert_eq!(format!("{}\nAction: run_tests", last.output.text), first.output.text);
            }
        }
    }

    #[test]
    fn a_real_model_calls_a_tool_with_its_last_action_line() {
        let yaml = "name: r\ndeployments:\n  d: {model: Qwen3-8B, max_context: 8192, max_output_tokens: 256}\nnodes:\n  - id: a\n    deployment: d\n    prompt: Go.\n    tools: [{name: vote, tool: majority_vote, inputs: {candidates: [\"{{a}}\"]}}]\n    max_turns: 3\n";
        let wf = crate::workflow::parse_workflow("r.yaml", yaml, std::path::Path::new(".")).unwrap_or_else(|e| panic!("{e}"));
        let NodeKind::Agent(agent) = &wf.nodes[0].kind else { panic!("an agent") };
        let emulated = NodeOutput::default();
        let verdict = |text: &str| model_output(agent, &emulated, text.into(), 5).map(|o| o.verdict);
        assert_eq!(verdict("Thinking.\n  Action: vote  \n"), Ok(Some("tool:vote".into())));
        assert_eq!(verdict("Action: deploy"), Ok(Some("final".into())));
        assert_eq!(verdict("The answer is 4."), Ok(Some("final".into())));
    }

    #[test]
    fn thinking_mode_generates_a_trace_that_is_not_the_answer() {
        let yaml = |thinking: &str| {
            format!(
                "name: t\ndeployments:\n  d: {{model: Qwen3-8B, max_context: 8192, max_output_tokens: 2048}}\nnodes:\n  - id: solve\n    deployment: d\n    prompt: Solve it.\n    output_tokens: {{mean: 100, cv: 0.2}}\n{thinking}"
            )
        };
        let prepared = |thinking: &str| {
            let wf = Arc::new(crate::workflow::parse_workflow("t.yaml", &yaml(thinking), std::path::Path::new(".")).unwrap_or_else(|e| panic!("{e}")));
            let wfs = vec![Arc::clone(&wf)];
            let (table, of) = deployment_table(&wfs, 8).unwrap();
            let info = node_infos(&wfs, &of);
            let ctx = PrepareContext { seed: 11, deployments: &table, deployment_of: &of, node_info: &info };
            let mut s = Session::new(SessionId(0), wf, crate::values::Record::default()).unwrap();
            let a = s.ready()[0];
            match prepare(&ctx, &mut s, 0, a, 0.0).unwrap() {
                Ready::Llm { item, prepared, .. } => (item, prepared),
                _ => panic!("an agent"),
            }
        };
        let (off_item, off) = prepared("");
        let (on_item, on) = prepared("    thinking_tokens: {mean: 1500, cv: 0.5}\n");
        assert!(!off.enable_thinking && off.thinking_tokens == 0);
        assert!(on.enable_thinking && on.thinking_tokens > 0);
        // The answer is the same draw; the trace adds generated tokens, within max_tokens.
        assert_eq!(on.output.text, off.output.text);
        assert_eq!(on.output.output_tokens, off.output.output_tokens + on.thinking_tokens);
        assert!(on.output.output_tokens <= 2048);
        // Thinking on drops the template's empty `<think>\n\n</think>\n\n` (4 tokens).
        assert_eq!(on_item.prompt_tokens + 4, off_item.prompt_tokens);
        // What an emulated engine returns leads with the trace; the session keeps the answer.
        let completion = on.emulated_completion();
        assert!(completion.starts_with("<think>\n") && completion.ends_with(&on.output.text));
        // Within the call's generated tokens, so an engine's `max_tokens` never cuts the answer.
        let generated = tokens::count(&completion);
        assert!(generated <= on.output.output_tokens as usize && generated + 2 >= on.output.output_tokens as usize, "{generated} vs {}", on.output.output_tokens);
        let wf = crate::workflow::parse_workflow("t.yaml", &yaml("    thinking_tokens: {mean: 1500}\n"), std::path::Path::new(".")).unwrap();
        let NodeKind::Agent(agent) = &wf.nodes[0].kind else { panic!("not an agent") };
        let kept = model_output(agent, &on.output, completion, on.output.output_tokens);
        assert_eq!(kept, Ok(on.output.clone()));
    }
}
