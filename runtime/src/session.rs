//! The session model: one run of a workflow over one input record (paper 003 §3.2, the
//! resolved portion L_t^w of a workflow).
//!
//! Activations (one execution of a node; each loop round is a new activation) are created
//! only once their branch is determined: a node guarded by `when` gets an activation when
//! the predecessor it tests has completed and the test holds; a loop's next round exists only
//! once the previous round's `continue_when` node completed with a continuing verdict; a node
//! after a loop exists only once the loop's last round is known. A created activation is
//! `Pending` until its predecessors complete, then `Ready`; the shell marks it `Running` and
//! completes it with its output.
//!
//! An agent with tools takes turns: turn k is round k of its own loop (`AGENT.turns`), a turn
//! that calls a tool (verdict `tool:NAME`) is followed by an activation of that tool step, and
//! the next turn waits for it; a later turn's prompt is the previous turn's + its answer + the
//! observation. A turn naming no declared tool, and the last turn, are the final answer.
//!
//! Skipping: a node is skipped (gets no activation) when its `when` condition is false, or
//! when every one of its predecessors was skipped; a join with at least one completed
//! predecessor still runs (final validation runs whether or not a repair happened). A skip is
//! decided only after the node's other active predecessors completed, so every activation
//! starts after all of its ancestors finished.
//!
//! Pure state machine over a shared [`WorkflowSpec`]: no I/O, no clock, no randomness. It must
//! not depend on the planner, the simulator or any engine.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value as Json;
use thiserror::Error;

use crate::ids::{ActivationId, SessionId};
use crate::values::{NodeOutput, Record};
use crate::workflow::template::{MAX_RENDERED_BYTES, RenderError, Resolve, Source};
use crate::workflow::{NodeKind, NodeSpec, WorkflowSpec, node_templates};

/// Life cycle of an activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActivationState {
    /// Created (its branch is determined) but some predecessor has not completed.
    Pending,
    /// Every predecessor completed; not yet started.
    Ready,
    /// Started by the shell.
    Running,
    /// Finished with an output.
    Completed,
}

/// One execution of a node.
#[derive(Debug, Clone, PartialEq)]
pub struct Activation {
    pub id: ActivationId,
    /// Index into the workflow's `nodes`.
    pub node: usize,
    /// 0 for the first execution; loop rounds count up from 0.
    pub round: u32,
    pub state: ActivationState,
    /// Indices of the activations it waits for, ascending.
    pub predecessors: Vec<u32>,
    pub output: Option<NodeOutput>,
}

#[derive(Debug, Error, PartialEq)]
pub enum SessionError {
    #[error(
        "session {session}: the input record lacks field `{field}`, which workflow `{workflow}` reads"
    )]
    MissingInput {
        session: SessionId,
        workflow: String,
        field: String,
    },
    #[error("session {session}: no activation a{index}")]
    UnknownActivation { session: SessionId, index: u32 },
    #[error("session {session}: activation a{index} (`{node}`) is {state:?}, expected {expected}")]
    WrongState {
        session: SessionId,
        index: u32,
        node: String,
        state: ActivationState,
        expected: &'static str,
    },
    #[error("session {session}: activation a{index} (`{node}`) is not {expected} node")]
    WrongKind {
        session: SessionId,
        index: u32,
        node: String,
        expected: &'static str,
    },
    #[error(
        "session {session}: activation a{index} (`{node}`): `{{{{{reference}}}}}` has no value yet"
    )]
    Unresolved {
        session: SessionId,
        index: u32,
        node: String,
        reference: String,
    },
    #[error(
        "session {session}: activation a{index} (`{node}`): its rendered text passes {limit} bytes, longer than any model context takes"
    )]
    RenderedTooLong {
        session: SessionId,
        index: u32,
        node: String,
        limit: usize,
    },
    #[error("session {session} has failed: {reason}")]
    Failed { session: SessionId, reason: String },
}

/// How a (node, round) instance was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resolution {
    Active(u32),
    Skipped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LoopProgress {
    /// Highest round opened so far.
    round: u32,
    /// The last round, once known (the round where `continue_when` failed, or `max_rounds - 1`).
    final_round: Option<u32>,
}

/// One run of a workflow over one input record.
#[derive(Debug, Clone)]
pub struct Session {
    id: SessionId,
    spec: Arc<WorkflowSpec>,
    input: Record,
    activations: Vec<Activation>,
    resolved: BTreeMap<(usize, u32), Resolution>,
    /// The (node, round) instances of the rounds opened so far that are not decided yet, as
    /// (position in the topological order, round): the order [`Self::advance`] decides them in.
    /// Only this frontier is visited, so an event costs what is open, not the session's history.
    unresolved: BTreeSet<(u32, u32)>,
    /// Activations not completed (pending, ready or running), ascending.
    open: BTreeSet<u32>,
    /// Pending activations, ascending.
    pending: BTreeSet<u32>,
    loops: Vec<LoopProgress>,
    /// Per node: the latest completed activation.
    latest: Vec<Option<u32>>,
    failure: Option<String>,
}

/// The session as the templates of one activation see it (its loop round, for `.prev` and
/// `loop.round`).
struct View<'a> {
    session: &'a Session,
    round: u32,
}

impl Resolve for View<'_> {
    fn input(&self, field: &str) -> Option<&Json> {
        self.session.input.get(field)
    }
    fn output(&self, node: &str) -> Option<&NodeOutput> {
        self.session.latest_output(self.session.spec.node_index(node)?)
    }
    fn previous(&self, node: &str) -> Option<&NodeOutput> {
        let n = self.session.spec.node_index(node)?;
        let index = self.session.activation_for(n, self.round.checked_sub(1)?)?;
        self.session.activation(index)?.output.as_ref()
    }
    fn round(&self) -> Option<u32> {
        Some(self.round)
    }
}

impl Session {
    /// Start a session; the activations whose branch is already determined are created
    /// (nodes without predecessors are `Ready`).
    pub fn new(
        id: SessionId,
        spec: Arc<WorkflowSpec>,
        input: Record,
    ) -> Result<Self, SessionError> {
        if let Some(field) = spec
            .input_fields()
            .into_iter()
            .find(|f| !input.contains_key(f))
        {
            return Err(SessionError::MissingInput {
                session: id,
                workflow: spec.name.clone(),
                field,
            });
        }
        let loops = spec
            .loops
            .iter()
            .map(|l| LoopProgress {
                round: 0,
                final_round: (l.max_rounds <= 1).then_some(0),
            })
            .collect();
        let n = spec.nodes.len();
        let unresolved = (0..n as u32).map(|pos| (pos, 0)).collect();
        let mut s = Session {
            id,
            spec,
            input,
            activations: Vec::new(),
            resolved: BTreeMap::new(),
            unresolved,
            open: BTreeSet::new(),
            pending: BTreeSet::new(),
            loops,
            latest: vec![None; n],
            failure: None,
        };
        s.advance();
        Ok(s)
    }

    pub fn id(&self) -> SessionId {
        self.id
    }

    pub fn spec(&self) -> &Arc<WorkflowSpec> {
        &self.spec
    }

    pub fn input(&self) -> &Record {
        &self.input
    }

    /// Every activation created so far, in creation order (index = `ActivationId::index`).
    pub fn activations(&self) -> &[Activation] {
        &self.activations
    }

    pub fn activation(&self, index: u32) -> Option<&Activation> {
        self.activations.get(index as usize)
    }

    pub fn node_of(&self, index: u32) -> Option<&NodeSpec> {
        self.spec.nodes.get(self.activation(index)?.node)
    }

    /// Ready activations not yet started, in creation order.
    pub fn ready(&self) -> Vec<ActivationId> {
        self.with_state(|a| a.state == ActivationState::Ready)
    }

    /// Pending activations whose predecessors are all completed or running, with at least one
    /// running (the near-ready set N_t of paper 003 §3.2).
    pub fn near_ready(&self) -> Vec<ActivationId> {
        self.with_state(|a| {
            a.state == ActivationState::Pending
                && a.predecessors.iter().all(|&p| {
                    matches!(
                        self.state_of(p),
                        Some(ActivationState::Completed | ActivationState::Running)
                    )
                })
                && a.predecessors
                    .iter()
                    .any(|&p| self.state_of(p) == Some(ActivationState::Running))
        })
    }

    /// Ready → Running.
    pub fn mark_running(&mut self, index: u32) -> Result<(), SessionError> {
        self.check_alive()?;
        self.expect_state(index, ActivationState::Ready, "Ready")?;
        self.activations[index as usize].state = ActivationState::Running;
        Ok(())
    }

    /// Running → Ready: the shell gives an activation back (replica crash, OOM, preemption);
    /// nothing it produced is kept.
    pub fn requeue(&mut self, index: u32) -> Result<(), SessionError> {
        self.check_alive()?;
        self.expect_state(index, ActivationState::Running, "Running")?;
        self.activations[index as usize].state = ActivationState::Ready;
        Ok(())
    }

    /// The agent prompt as segments (static text and inserted values, in order); their
    /// concatenation is the full prompt. A later turn of an agent with tools is the previous
    /// turn's segments followed by that turn's answer and the observation of the tool it called
    /// (`workflow::observation_text`), so each turn's prompt extends the one before.
    pub fn render_prompt(&self, index: u32) -> Result<Vec<String>, SessionError> {
        let node = self.node_checked(index)?;
        let NodeKind::Agent(agent) = &node.kind else {
            return Err(self.wrong_kind(index, "an agent"));
        };
        let round = self.activations[index as usize].round;
        if let Some(tools) = &agent.tools {
            // The first turn's prompt is the template's; a turn's template values are all
            // upstream of the agent, so they do not change between turns.
            let Some(prev) = round.checked_sub(1) else {
                return agent
                    .prompt
                    .render_segments(&View { session: self, round: 0 })
                    .map_err(|e| self.render_error(index, e));
            };
            let node_index = self.activations[index as usize].node;
            let turn = self.activation_for(node_index, prev);
            let answer = turn.and_then(|t| self.activation(t)?.output.as_ref());
            let observed = tools.tools.iter().find_map(|t| {
                let out = self.activation(self.activation_for(t.node, prev)?)?.output.as_ref()?;
                Some(crate::workflow::observation_text(&t.name, &out.text))
            });
            let (Some(turn), Some(answer), Some(observed)) = (turn, answer, observed) else {
                return Err(self.unresolved(index, format!("{}.turn{prev}", node.id)));
            };
            let mut segments = self.render_prompt(turn)?;
            let length: usize = segments.iter().map(String::len).sum::<usize>() + answer.text.len() + observed.len();
            if length > MAX_RENDERED_BYTES {
                return Err(self.render_error(index, RenderError::TooLong));
            }
            segments.push(answer.text.clone());
            segments.push(observed);
            return Ok(segments);
        }
        agent
            .prompt_for(round)
            .render_segments(&View { session: self, round })
            .map_err(|e| self.render_error(index, e))
    }

    /// The tool inputs as JSON values (a template that is exactly one reference yields the
    /// referenced value itself, so list inputs stay lists).
    pub fn render_tool_inputs(&self, index: u32) -> Result<BTreeMap<String, Json>, SessionError> {
        let node = self.node_checked(index)?;
        let NodeKind::Tool(tool) = &node.kind else {
            return Err(self.wrong_kind(index, "a tool"));
        };
        let view = View { session: self, round: self.activations[index as usize].round };
        tool.inputs
            .iter()
            .map(|(k, t)| {
                Ok((
                    k.clone(),
                    t.render_value(&view)
                        .map_err(|e| self.render_error(index, e))?,
                ))
            })
            .collect()
    }

    /// `(node id, output)` of the completed predecessors of an activation, then of any further
    /// completed activations its templates read (e.g. the code a repair step revises), each
    /// once, in that order.
    pub fn upstream(&self, index: u32) -> Vec<(&str, &NodeOutput)> {
        let Some(a) = self.activation(index) else {
            return Vec::new();
        };
        let mut order: Vec<u32> = a.predecessors.clone();
        for t in node_templates(&self.spec.nodes[a.node]) {
            for r in t.references() {
                for s in &r.sources {
                    let found = match s {
                        Source::Input(f) => self.input.contains_key(f).then_some(None),
                        Source::Round | Source::Literal(_) => Some(None),
                        Source::Output(n) | Source::Verdict(n) => self
                            .spec
                            .node_index(n)
                            .and_then(|ni| self.latest[ni])
                            .map(Some),
                        Source::Previous(n) => self
                            .spec
                            .node_index(n)
                            .zip(a.round.checked_sub(1))
                            .and_then(|(ni, r)| self.activation_for(ni, r))
                            .map(Some),
                    };
                    if let Some(found) = found {
                        order.extend(found);
                        break;
                    }
                }
            }
        }
        let mut seen = BTreeSet::new();
        order
            .into_iter()
            .filter(|i| seen.insert(*i))
            .filter_map(|i| {
                let act = self.activation(i)?;
                Some((self.spec.nodes[act.node].id.as_str(), act.output.as_ref()?))
            })
            .collect()
    }

    /// Running → Completed with `output`; returns the activations that became Ready (newly
    /// created ones included), in creation order.
    pub fn complete(
        &mut self,
        index: u32,
        output: NodeOutput,
    ) -> Result<Vec<ActivationId>, SessionError> {
        self.check_alive()?;
        self.expect_state(index, ActivationState::Running, "Running")?;
        let mut output = output;
        let a = &self.activations[index as usize];
        if let NodeKind::Agent(agent) = &self.spec.nodes[a.node].kind
            && let Some(tools) = &agent.tools
        {
            // A turn calls a declared tool, or it is the final answer; so is the last turn's.
            let calls = tools.called_by(output.verdict.as_deref()).is_some()
                && a.round + 1 < tools.max_turns;
            if !calls {
                output.verdict = Some(crate::workflow::FINAL_VERDICT.to_string());
            }
        }
        let a = &mut self.activations[index as usize];
        a.state = ActivationState::Completed;
        a.output = Some(output);
        let node = a.node;
        self.open.remove(&index);
        self.latest[node] = Some(index);
        let mut newly = self.advance();
        newly.sort_unstable();
        newly.dedup();
        Ok(newly
            .into_iter()
            .map(|i| ActivationId {
                session: self.id,
                index: i,
            })
            .collect())
    }

    /// Mark the session failed (e.g. a tool could not be run); it is then finished, without a
    /// final output, and refuses further transitions.
    pub fn fail(&mut self, reason: impl Into<String>) {
        if self.failure.is_none() {
            self.failure = Some(reason.into());
        }
    }

    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// True once nothing more can run: every activation completed and every branch and loop
    /// resolved (or the session failed).
    pub fn is_finished(&self) -> bool {
        if self.failure.is_some() {
            return true;
        }
        self.open.is_empty() && self.unresolved.is_empty() && self.loops.iter().all(|l| l.final_round.is_some())
    }

    /// The final answer: the latest output of the metric's (first term's) first node that has
    /// one, or else of the last sink (in topological order) that produced one.
    pub fn final_output(&self) -> Option<&NodeOutput> {
        if let Some(m) = &self.spec.metric {
            return m
                .answer_nodes()
                .iter()
                .find_map(|n| self.latest_output(self.spec.node_index(n)?));
        }
        let sinks = self.spec.sinks();
        self.spec
            .topological_order()
            .iter()
            .rev()
            .filter(|n| sinks.contains(n))
            .find_map(|&n| self.latest_output(n))
    }

    /// The latest completed output of a node.
    pub fn latest_output(&self, node: usize) -> Option<&NodeOutput> {
        self.activation(self.latest.get(node).copied().flatten()?)?
            .output
            .as_ref()
    }

    /// `(node, round)` pairs decided as skipped, ascending.
    pub fn skipped(&self) -> Vec<(usize, u32)> {
        self.resolved
            .iter()
            .filter(|(_, r)| **r == Resolution::Skipped)
            .map(|(k, _)| *k)
            .collect()
    }

    /// The activation of `node` in `round`, if one was created.
    pub fn activation_for(&self, node: usize, round: u32) -> Option<u32> {
        match self.resolved.get(&(node, round)) {
            Some(Resolution::Active(i)) => Some(*i),
            _ => None,
        }
    }

    /// Rounds opened so far by a loop (1 after start; at most its `max_rounds`).
    pub fn loop_rounds(&self, loop_index: usize) -> Option<u32> {
        self.loops.get(loop_index).map(|l| l.round + 1)
    }

    /// The activations not completed yet (pending, ready or running), in creation order: the
    /// session's frontier, however long its history.
    pub fn open_activations(&self) -> impl Iterator<Item = &Activation> {
        self.open.iter().filter_map(|&i| self.activations.get(i as usize))
    }

    /// Check the frontier this session keeps against its definition, found the slow way (every
    /// activation, every opened round): the activations not completed, the pending ones, and
    /// the undecided (node, round) instances of the rounds opened. For tests.
    #[doc(hidden)]
    pub fn check_bookkeeping(&self) -> Result<(), String> {
        let open: BTreeSet<u32> =
            self.activations.iter().filter(|a| a.state != ActivationState::Completed).map(|a| a.id.index).collect();
        if open != self.open {
            return Err(format!("open {:?}, kept {:?}", open, self.open));
        }
        let pending: BTreeSet<u32> =
            self.activations.iter().filter(|a| a.state == ActivationState::Pending).map(|a| a.id.index).collect();
        if pending != self.pending {
            return Err(format!("pending {:?}, kept {:?}", pending, self.pending));
        }
        let mut unresolved = BTreeSet::new();
        for (pos, &n) in self.spec.topological_order().iter().enumerate() {
            let last = self.spec.nodes[n].loop_index.map_or(0, |l| self.loops[l].round);
            unresolved.extend((0..=last).filter(|&r| !self.resolved.contains_key(&(n, r))).map(|r| (pos as u32, r)));
        }
        if unresolved != self.unresolved {
            return Err(format!("unresolved {:?}, kept {:?}", unresolved, self.unresolved));
        }
        Ok(())
    }

    // ---- internals ----

    /// The activations not completed that satisfy `pred`, in creation order (only completed
    /// ones are never asked for, so the open set is all there is to look at).
    fn with_state(&self, pred: impl Fn(&Activation) -> bool) -> Vec<ActivationId> {
        if self.failure.is_some() {
            return Vec::new();
        }
        self.open_activations().filter(|a| pred(a)).map(|a| a.id).collect()
    }

    fn state_of(&self, index: u32) -> Option<ActivationState> {
        self.activation(index).map(|a| a.state)
    }

    fn check_alive(&self) -> Result<(), SessionError> {
        match &self.failure {
            Some(reason) => Err(SessionError::Failed {
                session: self.id,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn node_checked(&self, index: u32) -> Result<&NodeSpec, SessionError> {
        self.node_of(index).ok_or(SessionError::UnknownActivation {
            session: self.id,
            index,
        })
    }

    fn node_name(&self, index: u32) -> String {
        self.node_of(index)
            .map(|n| n.id.clone())
            .unwrap_or_default()
    }

    fn expect_state(
        &self,
        index: u32,
        want: ActivationState,
        expected: &'static str,
    ) -> Result<(), SessionError> {
        let a = self
            .activation(index)
            .ok_or(SessionError::UnknownActivation {
                session: self.id,
                index,
            })?;
        if a.state != want {
            return Err(SessionError::WrongState {
                session: self.id,
                index,
                node: self.node_name(index),
                state: a.state,
                expected,
            });
        }
        Ok(())
    }

    fn wrong_kind(&self, index: u32, expected: &'static str) -> SessionError {
        SessionError::WrongKind {
            session: self.id,
            index,
            node: self.node_name(index),
            expected,
        }
    }

    fn render_error(&self, index: u32, e: RenderError) -> SessionError {
        match e {
            RenderError::Unresolved(u) => self.unresolved(index, u.reference),
            RenderError::TooLong => SessionError::RenderedTooLong {
                session: self.id,
                index,
                node: self.node_name(index),
                limit: MAX_RENDERED_BYTES,
            },
        }
    }

    fn unresolved(&self, index: u32, reference: String) -> SessionError {
        SessionError::Unresolved {
            session: self.id,
            index,
            node: self.node_name(index),
            reference,
        }
    }

    fn is_completed(&self, index: u32) -> bool {
        self.state_of(index) == Some(ActivationState::Completed)
    }

    /// Run to a fixpoint: promote Pending → Ready, decide every decidable (node, round), move
    /// loops on. Returns the indices that became Ready.
    fn advance(&mut self) -> Vec<u32> {
        let mut newly = Vec::new();
        if self.failure.is_some() {
            return newly;
        }
        let spec = Arc::clone(&self.spec);
        let topo = spec.topological_order();
        loop {
            let mut changed = false;
            let promoted: Vec<u32> = self
                .pending
                .iter()
                .copied()
                .filter(|&i| self.activations[i as usize].predecessors.iter().all(|&p| self.is_completed(p)))
                .collect();
            for i in promoted {
                self.activations[i as usize].state = ActivationState::Ready;
                self.pending.remove(&i);
                newly.push(i);
                changed = true;
            }
            // The undecided instances in topological order, rounds ascending within a node.
            let frontier: Vec<(u32, u32)> = self.unresolved.iter().copied().collect();
            for (pos, r) in frontier {
                let n = topo[pos as usize];
                if let Some(res) = self.try_resolve(n, r) {
                    self.resolved.insert((n, r), res);
                    self.unresolved.remove(&(pos, r));
                    if let Resolution::Active(i) = res
                        && self.state_of(i) == Some(ActivationState::Ready)
                    {
                        newly.push(i);
                    }
                    changed = true;
                }
            }
            for (li, l) in spec.loops.iter().enumerate() {
                let p = self.loops[li];
                if p.final_round.is_some() {
                    continue;
                }
                let decision = match self.resolved.get(&(l.continue_when.node, p.round)) {
                    Some(Resolution::Skipped) => Some(false),
                    Some(Resolution::Active(i)) if self.is_completed(*i) => {
                        let verdict = self.activations[*i as usize]
                            .output
                            .as_ref()
                            .and_then(|o| o.verdict.as_deref());
                        Some(l.continue_when.holds(verdict) && p.round + 1 < l.max_rounds)
                    }
                    _ => None,
                };
                match decision {
                    Some(true) => {
                        let round = p.round + 1;
                        self.loops[li] = LoopProgress {
                            round,
                            final_round: (round + 1 >= l.max_rounds).then_some(round),
                        };
                        // The loop's nodes get the new round to decide.
                        for (pos, &n) in topo.iter().enumerate() {
                            if spec.nodes[n].loop_index == Some(li) {
                                self.unresolved.insert((pos as u32, round));
                            }
                        }
                        changed = true;
                    }
                    Some(false) => {
                        self.loops[li].final_round = Some(p.round);
                        changed = true;
                    }
                    None => {}
                }
            }
            if !changed {
                return newly;
            }
        }
    }

    /// Decide (node, round) if its branch is determined: `None` while it is not.
    fn try_resolve(&mut self, n: usize, r: u32) -> Option<Resolution> {
        let spec = Arc::clone(&self.spec);
        let node = &spec.nodes[n];
        let mut insts: Vec<(usize, u32)> = Vec::with_capacity(node.after.len() + 1);
        for &p in &node.after {
            let round = match (spec.nodes[p].loop_index, node.loop_index) {
                (Some(lp), Some(ln)) if lp == ln => r,
                (Some(lp), _) => self.loops[lp].final_round?,
                (None, _) => 0,
            };
            insts.push((p, round));
        }
        if let Some(li) = node.loop_index
            && r > 0
            && spec.loops[li].entries.contains(&n)
        {
            insts.extend(spec.loops[li].back_from.iter().map(|&b| (b, r - 1)));
        }
        let mut res = Vec::with_capacity(insts.len());
        for inst in &insts {
            res.push(*self.resolved.get(inst)?);
        }
        let mut active: Vec<u32> = res
            .iter()
            .filter_map(|x| match x {
                Resolution::Active(i) => Some(*i),
                Resolution::Skipped => None,
            })
            .collect();
        active.sort_unstable();
        active.dedup();
        let all_done = active.iter().all(|&i| self.is_completed(i));
        let skip = || {
            if all_done {
                Some(Resolution::Skipped)
            } else {
                None
            }
        };
        if !insts.is_empty() && active.is_empty() {
            return Some(Resolution::Skipped);
        }
        if let Some(cond) = &node.when {
            let at = node.after.iter().position(|&p| p == cond.node)?;
            match res[at] {
                Resolution::Skipped => return skip(),
                Resolution::Active(i) => {
                    if !self.is_completed(i) {
                        return None;
                    }
                    let verdict = self.activations[i as usize]
                        .output
                        .as_ref()
                        .and_then(|o| o.verdict.as_deref());
                    if !cond.holds(verdict) {
                        return skip();
                    }
                }
            }
        }
        let index = self.activations.len() as u32;
        self.open.insert(index);
        if !all_done {
            self.pending.insert(index);
        }
        self.activations.push(Activation {
            id: ActivationId {
                session: self.id,
                index,
            },
            node: n,
            round: r,
            state: if all_done {
                ActivationState::Ready
            } else {
                ActivationState::Pending
            },
            predecessors: active,
            output: None,
        });
        Some(Resolution::Active(index))
    }
}
