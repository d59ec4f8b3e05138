//! Routed agent programs in the agent-session simulator (paper 002 §5.2–5.3): the program layer
//! that [`super::agentic`] runs when its pool holds replicas of several models.
//!
//! Each session of the trace is a *program*. When a worker slot takes one, ORACLE's router (the
//! core's [`Router`]: LinUCB over the program's context, DISC's ledger and divert rule) binds it
//! to a model; the program then waits for that model's admission rule — none (stock vLLM and
//! ThunderAgent's proxy), DISC's reservation ledger, or a static per-model cap — and every
//! request it makes goes to a replica of its model, placed by the run's scheduler among that
//! model's replicas. When its last call returns, its reservation is released (its peak context
//! and run time teach the ledger), its slot is free and its verifier runs for a modeled
//! [`ProgramRouting::verifier_s`]; the verdict then updates the learner. How slots and
//! verdicts relate is the [`Feedback`] mode of §5.3: delayed feedback (the slot is free at once,
//! one shared learner), batch-synchronous dispatch (the next batch starts when every program of
//! the batch is verified) or independent per-slot learners.
//!
//! The trace carries token counts, not task texts: the learner's context is the bias and the
//! task-type indicator (one type, a SWE-bench-like program), so the router learns each model's
//! mean reward. Whether a program succeeds is a property of the task and the model: task `i`
//! has a difficulty u_i, uniform in [0, 1) from the outcome seed, and succeeds on model m when
//! u_i < p_m ([`RoutedArm::success`]) — a task the smaller model solves, the larger solves too.
//!
//! Owns no I/O and no clock: the simulator hands it times. Must not depend on the live shell.

use std::collections::VecDeque;

use serde::Serialize;

use crate::agentic::mix;
use crate::planner::routing::{
    ALPHA_UCB, Ledger, LinUcb, Pca, Router, RouterError, RouterOptions, VerifierSelector, Vocabulary,
};

/// The task text every program presents to the router (the trace has none; see the module doc).
const TASK_TEXT: &str = "resolve the repository issue and submit a patch";
/// The verifier of that task type (the SWE-bench harness's tests).
const VERIFIER: &str = "swe_tests";

/// One model the router may bind a program to.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoutedArm {
    /// The model's name (replicas of the pool name it).
    pub model: String,
    /// Share of tasks a program on this model resolves.
    pub success: f64,
    /// DISC's calibration prior of the peak context c₀, tokens.
    pub prior_peak_tokens: f64,
    /// DISC's calibration prior of a program's run time D₀, seconds.
    pub prior_run_s: f64,
}

/// When a bound program may start on its model.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProgramAdmission {
    /// At once (stock vLLM; ThunderAgent's proxy, which pauses programs itself).
    Immediate,
    /// DISC's reservation ledger, strictly FIFO per model (with the router's divert rule when
    /// [`RouterOptions::reassign`] is on).
    Disc,
    /// At most this many programs at once per arm, FIFO (paper 002's static cap).
    StaticCap(Vec<usize>),
}

/// How feedback reaches the learner and when a slot takes its next program (§5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Feedback {
    /// ORACLE: a slot takes its next program as soon as its program finishes; verdicts update
    /// one shared learner whenever they land.
    Delayed,
    /// The next batch of programs starts when every program of the batch is finished and
    /// verified.
    BatchSynchronous,
    /// One learner per slot; each sees only its own slot's verdicts.
    Independent,
}

impl Feedback {
    pub fn name(self) -> &'static str {
        match self {
            Feedback::Delayed => "delayed",
            Feedback::BatchSynchronous => "batch-synchronous",
            Feedback::Independent => "independent",
        }
    }
}

/// The program layer's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramRouting {
    pub arms: Vec<RoutedArm>,
    pub admission: ProgramAdmission,
    pub options: RouterOptions,
    pub feedback: Feedback,
    /// Modeled time from a program's end to its verdict (the verifier's run) when the verifier
    /// is the task's harness.
    pub verifier_s: f64,
    /// An LLM judge instead of the harness: its verdict comes from a model call on the pool.
    pub judge: Option<Judge>,
    /// Seeds the tasks' difficulties.
    pub outcome_seed: u64,
    /// Verified outcomes every learner knows before the run's first program (empty: a cold
    /// learner). Each is learned as a decision with its verdict ([`Router::learn`]).
    pub prior: Vec<PriorOutcome>,
}

/// One outcome a learner is told before the run: a program ran on arm `arm` and its verifier
/// said `success` at `cost` (e.g. the calibration passes, each model alone on a trace that is
/// never evaluated).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PriorOutcome {
    pub arm: usize,
    pub success: f64,
    pub cost: f64,
}

/// Task `i`'s difficulty under `outcome_seed`, uniform in [0, 1): the task resolves on a model
/// whose success rate exceeds it (the module doc).
pub fn task_difficulty(outcome_seed: u64, i: usize) -> f64 {
    (mix(outcome_seed, i as u64) >> 11) as f64 / (1u64 << 53) as f64
}

/// An LLM judge as the verifier (paper 002 §4.2.1's LLM-as-a-judge): one call per finished
/// program on a replica of `model`, submitted to that replica's engine like any other request
/// (it competes for the batch and the KV cache); its verdict is the truth, flipped with
/// probability `error` (a deterministic draw per program).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judge {
    /// One of the routed models (it must have a replica).
    pub model: String,
    /// The judge's prompt: its rubric and the program's transcript, at most this many tokens
    /// (fewer when the transcript is shorter).
    pub prompt_tokens: u32,
    /// Its answer: a short rationale and the verdict.
    pub output_tokens: u32,
    /// Probability that a verdict is wrong.
    pub error: f64,
}

/// What the program layer refuses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProgramRoutingError {
    #[error("routing needs at least one arm")]
    NoArms,
    #[error("arm {0}: success must be within [0, 1]")]
    Success(String),
    #[error("replica {index} serves {model}, which is not one of the routed models")]
    UnroutedReplica { index: usize, model: String },
    #[error("model {0} has no replica in the pool")]
    NoReplica(String),
    #[error("a static cap needs one positive limit per arm")]
    Cap,
    #[error("a prior outcome names no arm, or its success is outside [0, 1] or its cost not finite")]
    Prior,
    #[error("independent per-slot learners run without admission control")]
    IndependentAdmission,
    #[error("reassignment (the divert rule) needs DISC's ledgers as the admission rule")]
    ReassignWithoutLedger,
    #[error("the verifier time must be finite and non-negative")]
    VerifierTime,
    #[error(
        "the judge must be one of the routed models, with a non-empty prompt and answer and an error rate within [0, 1]"
    )]
    Judge,
    #[error(transparent)]
    Router(#[from] RouterError),
}

/// Per arm, what the run measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ArmReport {
    pub model: String,
    /// Programs that ran on it.
    pub programs: u64,
    /// Of those, programs DISC diverted to it from the learner's choice.
    pub diverted_in: u64,
    pub resolved: u64,
    /// Prompt tokens served from the prefix cache over its prompt tokens.
    pub cache_hit_rate: f64,
    pub preemptions: u64,
    /// Programs admitted at once, averaged over the time a program waited for this arm's
    /// admission (0 when none ever waited).
    pub admitted_while_waiting: f64,
    /// The highest KV-cache usage of its replicas (sampled each second), 0–1.
    pub kv_usage_peak: f64,
    /// When one of its replicas' KV cache first was full (usage ≥ 95 %), seconds into the run.
    pub kv_full_at_s: Option<f64>,
}

/// One program's timeline, for tests and analysis (not serialized: the bench's JSON stays
/// small).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProgramRow {
    pub arm: usize,
    pub slot: usize,
    /// The learner (index among the run's learners) that bound it.
    pub learner: usize,
    pub batch: u64,
    pub bound_at: f64,
    pub admitted_at: Option<f64>,
    /// When its first request went to a replica.
    pub started_at: Option<f64>,
    pub finished_at: Option<f64>,
    pub verified_at: Option<f64>,
    pub resolved: bool,
}

/// What a routed run measured (beside the scheduler's [`super::agentic::AgentRunReport`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoutedRunReport {
    pub admission: String,
    pub feedback: String,
    pub programs: u64,
    pub resolved: u64,
    /// First program bound to last program finished.
    pub makespan_s: f64,
    pub programs_per_hour: f64,
    pub resolved_per_hour: f64,
    /// Mean time from binding to admission (the ledger's or the cap's queue; 0 without
    /// admission control).
    pub mean_admission_wait_s: f64,
    /// Mean time from binding to the first request's dispatch to a replica: the admission wait
    /// plus any hold of the scheduler (ThunderAgent's proxy holds new programs while its queue
    /// is busy) — comparable across every system.
    pub mean_start_wait_s: f64,
    /// Mean time from a request being ready to its last token.
    pub mean_call_latency_s: f64,
    /// `harness` or `judge:<model>`.
    pub verifier: String,
    /// Verdicts that landed, and how many of them were wrong (a judge's errors).
    pub verdicts: u64,
    pub wrong_verdicts: u64,
    /// Calls of DISC-admitted programs held back by the 95 % per-call ceiling (each hold until
    /// a call on that replica ends).
    pub ceiling_holds: u64,
    pub arms: Vec<ArmReport>,
    /// DISC's learned per-request allowance δ̂ per arm at the end of the run (tokens).
    pub allowance_tokens: Vec<f64>,
    #[serde(skip)]
    pub rows: Vec<ProgramRow>,
}

#[derive(Debug, Clone, Default)]
struct Program {
    bound: bool,
    /// DISC moved it from the learner's choice.
    diverted: bool,
    arm: usize,
    router: usize,
    slot: usize,
    batch: u64,
    bound_at: f64,
    admitted_at: Option<f64>,
    started_at: Option<f64>,
    finished_at: Option<f64>,
    verified_at: Option<f64>,
    cost: f64,
}

/// The program layer's state during a run.
pub(crate) struct RoutingLayer {
    cfg: ProgramRouting,
    routers: Vec<Router>,
    /// Replica index → arm.
    pub replica_arm: Vec<usize>,
    programs: Vec<Program>,
    cap_queue: Vec<VecDeque<usize>>,
    cap_running: Vec<usize>,
    batch: u64,
    // Measurements.
    first_bound: Option<f64>,
    last_finished: f64,
    call_latency_sum: f64,
    calls: u64,
    prompt: Vec<u64>,
    cached: Vec<u64>,
    /// Per arm: ∫ admitted dt and ∫ dt over the time some program waited for its admission.
    waiting: Vec<(f64, f64)>,
    /// Per arm, since `waiting_since`: whether a program waits, and how many are admitted.
    waiting_state: Vec<(bool, usize)>,
    waiting_since: f64,
    judge_arm: Option<usize>,
    verdicts: u64,
    wrong_verdicts: u64,
    /// Calls held back by the per-call ceiling ([`RoutedRunReport::ceiling_holds`]).
    pub ceiling_holds: u64,
}

fn router(
    arms: &[RoutedArm],
    capacity_tokens: &[u64],
    options: RouterOptions,
    prior: &[PriorOutcome],
) -> Result<Router, ProgramRoutingError> {
    let vocabulary = Vocabulary::fit(&[TASK_TEXT]);
    let pca = Pca::fit(&[vocabulary.embed(TASK_TEXT)], 0);
    let selector = VerifierSelector::fit(&vocabulary, &[(VERIFIER, TASK_TEXT)]);
    let learner =
        LinUcb::new(arms.len(), Router::context_dim(1, pca.len()), ALPHA_UCB, true).map_err(RouterError::from)?;
    let mut ledgers = Vec::with_capacity(arms.len());
    for (a, &cap) in arms.iter().zip(capacity_tokens) {
        ledgers.push(Ledger::new(cap, a.prior_peak_tokens, a.prior_run_s, options.disc).map_err(RouterError::from)?);
    }
    let mut router = Router::new(vocabulary, pca, selector, learner, ledgers, options)?;
    for o in prior {
        if o.arm >= arms.len() || !(0.0..=1.0).contains(&o.success) || !o.cost.is_finite() {
            return Err(ProgramRoutingError::Prior);
        }
        router.learn(o.arm, TASK_TEXT, o.success, o.cost)?;
    }
    Ok(router)
}

impl RoutingLayer {
    /// The layer over replicas serving `replica_models` (with `replica_kv_tokens` of KV each)
    /// for `programs` programs run by `slots` worker slots.
    pub fn new(
        cfg: ProgramRouting,
        replica_models: &[&str],
        replica_kv_tokens: &[u64],
        programs: usize,
        slots: usize,
    ) -> Result<Self, ProgramRoutingError> {
        if cfg.arms.is_empty() {
            return Err(ProgramRoutingError::NoArms);
        }
        if let Some(a) = cfg.arms.iter().find(|a| !(0.0..=1.0).contains(&a.success)) {
            return Err(ProgramRoutingError::Success(a.model.clone()));
        }
        if !cfg.verifier_s.is_finite() || cfg.verifier_s < 0.0 {
            return Err(ProgramRoutingError::VerifierTime);
        }
        let mut replica_arm = Vec::with_capacity(replica_models.len());
        for (index, m) in replica_models.iter().enumerate() {
            let arm = cfg
                .arms
                .iter()
                .position(|a| a.model == *m)
                .ok_or_else(|| ProgramRoutingError::UnroutedReplica { index, model: m.to_string() })?;
            replica_arm.push(arm);
        }
        let mut capacity = vec![0u64; cfg.arms.len()];
        for (r, &arm) in replica_arm.iter().enumerate() {
            capacity[arm] += replica_kv_tokens.get(r).copied().unwrap_or(0);
        }
        if let Some(m) = capacity.iter().position(|&c| c == 0) {
            return Err(ProgramRoutingError::NoReplica(cfg.arms[m].model.clone()));
        }
        if let ProgramAdmission::StaticCap(caps) = &cfg.admission
            && (caps.len() != cfg.arms.len() || caps.contains(&0))
        {
            return Err(ProgramRoutingError::Cap);
        }
        let learners = match cfg.feedback {
            Feedback::Independent => {
                if cfg.admission != ProgramAdmission::Immediate {
                    return Err(ProgramRoutingError::IndependentAdmission);
                }
                slots.max(1)
            }
            Feedback::Delayed | Feedback::BatchSynchronous => 1,
        };
        let judge_arm = match &cfg.judge {
            None => None,
            Some(j) => {
                let arm = cfg.arms.iter().position(|a| a.model == j.model).ok_or(ProgramRoutingError::Judge)?;
                if j.prompt_tokens == 0 || j.output_tokens == 0 || !(0.0..=1.0).contains(&j.error) {
                    return Err(ProgramRoutingError::Judge);
                }
                Some(arm)
            }
        };
        if cfg.options.reassign && cfg.admission != ProgramAdmission::Disc {
            return Err(ProgramRoutingError::ReassignWithoutLedger);
        }
        let routers = (0..learners).map(|_| router(&cfg.arms, &capacity, cfg.options, &cfg.prior)).collect::<Result<_, _>>()?;
        let n = cfg.arms.len();
        Ok(RoutingLayer {
            cfg,
            routers,
            replica_arm,
            programs: vec![Program::default(); programs],
            cap_queue: vec![VecDeque::new(); n],
            cap_running: vec![0; n],
            batch: 0,
            first_bound: None,
            last_finished: 0.0,
            call_latency_sum: 0.0,
            calls: 0,
            prompt: vec![0; n],
            cached: vec![0; n],
            waiting: vec![(0.0, 0.0); n],
            waiting_state: vec![(false, 0); n],
            waiting_since: 0.0,
            judge_arm,
            verdicts: 0,
            wrong_verdicts: 0,
            ceiling_holds: 0,
        })
    }

    pub fn feedback(&self) -> Feedback {
        self.cfg.feedback
    }

    pub fn arms(&self) -> usize {
        self.cfg.arms.len()
    }

    /// Whether a program's calls pass DISC's 95 % per-call ceiling before they go to an
    /// engine (paper 002 B.2: "a 95% ceiling per call remains as the hard limit").
    pub fn per_call_ceiling(&self) -> Option<f64> {
        (self.cfg.admission == ProgramAdmission::Disc).then_some(self.cfg.options.disc.call_ceiling)
    }

    pub fn arm_of(&self, program: usize) -> usize {
        self.programs[program].arm
    }

    /// Whether a program of the current batch is unfinished or unverified.
    pub fn batch_open(&self) -> bool {
        self.programs.iter().any(|p| p.bound && p.batch == self.batch && p.verified_at.is_none())
    }

    /// Starts a new batch (batch-synchronous dispatch).
    pub fn next_batch(&mut self) {
        self.batch += 1;
    }

    /// Binds program `i` in `slot` (its first request is `tokens` long); answers the programs
    /// (session indices) admitted now, this one included when it starts at once.
    pub fn bind(&mut self, i: usize, slot: usize, tokens: u64, now: f64) -> Result<Vec<usize>, ProgramRoutingError> {
        let r = if self.routers.len() > 1 { slot % self.routers.len() } else { 0 };
        // Ties between equal selection indices (an untrained learner) go to the first model
        // listed: the list is rotated by program so that no model is favoured by its position.
        let n = self.cfg.arms.len();
        let order: Vec<usize> = (0..n).map(|k| (i + k) % n).collect();
        self.accumulate_waiting(now);
        let b = self.routers[r].bind(i as u64, TASK_TEXT, tokens, &order)?.clone();
        self.first_bound.get_or_insert(now);
        self.programs[i] = Program {
            bound: true,
            diverted: b.model != b.chosen,
            arm: b.model,
            router: r,
            slot,
            batch: self.batch,
            bound_at: now,
            ..Program::default()
        };
        let mut admitted = Vec::new();
        match &self.cfg.admission {
            ProgramAdmission::Immediate => {
                self.routers[r].admit();
                admitted.push(i);
            }
            ProgramAdmission::Disc => {
                admitted.extend(self.routers[r].admit().into_iter().map(|(p, _)| p as usize));
            }
            ProgramAdmission::StaticCap(caps) => {
                self.routers[r].admit();
                let arm = b.model;
                if self.cap_running[arm] < caps[arm] && self.cap_queue[arm].is_empty() {
                    self.cap_running[arm] += 1;
                    admitted.push(i);
                } else {
                    self.cap_queue[arm].push_back(i);
                }
            }
        }
        for &p in &admitted {
            self.programs[p].admitted_at = Some(now);
        }
        self.snapshot_waiting();
        Ok(admitted)
    }

    /// Adds the time since the last change of admission state to each arm's waiting integral
    /// (the static cap's calibration: paper 002 rounds DISC's mean admitted counts during
    /// admission waiting).
    fn accumulate_waiting(&mut self, now: f64) {
        let dt = (now - self.waiting_since).max(0.0);
        for (acc, &(waiting, admitted)) in self.waiting.iter_mut().zip(&self.waiting_state) {
            if waiting {
                acc.0 += admitted as f64 * dt;
                acc.1 += dt;
            }
        }
        self.waiting_since = now;
    }

    /// Records each arm's admission state after a change.
    fn snapshot_waiting(&mut self) {
        for arm in 0..self.cfg.arms.len() {
            self.waiting_state[arm] = match &self.cfg.admission {
                ProgramAdmission::Disc => {
                    self.routers[0].ledger(arm).map_or((false, 0), |l| (l.queued() > 0, l.admitted()))
                }
                ProgramAdmission::StaticCap(_) => (!self.cap_queue[arm].is_empty(), self.cap_running[arm]),
                ProgramAdmission::Immediate => (false, 0),
            };
        }
    }

    /// An engine usage observation of `arm`'s replicas (DISC only: the ledger's allowance).
    pub fn observe_usage(&mut self, arm: usize, used_tokens: u64, context_tokens: u64, running: u32) {
        if self.cfg.admission == ProgramAdmission::Disc {
            self.routers[0].observe_usage(arm, used_tokens, context_tokens, running, 1);
        }
    }

    /// DISC's learned per-request allowance δ̂ per arm (0 without the ledger).
    pub fn allowances(&self) -> Vec<f64> {
        (0..self.cfg.arms.len()).map(|m| self.routers[0].ledger(m).map_or(0.0, Ledger::allowance)).collect()
    }

    /// Program `i`'s first request went to a replica now.
    pub fn started(&mut self, i: usize, now: f64) {
        self.programs[i].started_at.get_or_insert(now);
    }

    /// One call of program `i` finished on `arm`: its latency and tokens.
    pub fn call_finished(&mut self, i: usize, latency_s: f64, prompt: u32, cached: u32, output: u32) {
        let arm = self.programs[i].arm;
        self.call_latency_sum += latency_s;
        self.calls += 1;
        self.prompt[arm] += u64::from(prompt);
        self.cached[arm] += u64::from(cached);
        self.programs[i].cost += crate::exec::routing::call_cost(&self.cfg.arms[arm].model, prompt, cached, output);
    }

    /// Program `i` ended (its last call returned at `now` with `peak_tokens` of context): its
    /// reservation is released; answers the programs admitted now.
    pub fn finished(&mut self, i: usize, peak_tokens: u64, now: f64) -> Result<Vec<usize>, ProgramRoutingError> {
        self.last_finished = self.last_finished.max(now);
        self.accumulate_waiting(now);
        let p = &mut self.programs[i];
        p.finished_at = Some(now);
        let (r, arm) = (p.router, p.arm);
        let run_s = now - p.admitted_at.unwrap_or(p.bound_at);
        self.routers[r].finished(i as u64, peak_tokens, run_s)?;
        let mut admitted = Vec::new();
        match &self.cfg.admission {
            ProgramAdmission::Immediate => {
                self.routers[r].admit();
            }
            ProgramAdmission::Disc => {
                admitted.extend(self.routers[r].admit().into_iter().map(|(p, _)| p as usize));
            }
            ProgramAdmission::StaticCap(_) => {
                self.routers[r].admit();
                self.cap_running[arm] = self.cap_running[arm].saturating_sub(1);
                if let Some(next) = self.cap_queue[arm].pop_front() {
                    self.cap_running[arm] += 1;
                    admitted.push(next);
                }
            }
        }
        for &p in &admitted {
            self.programs[p].admitted_at = Some(now);
        }
        self.snapshot_waiting();
        Ok(admitted)
    }

    /// Whether program `i` resolves its task on the model it ran on.
    pub fn success(&self, i: usize) -> bool {
        task_difficulty(self.cfg.outcome_seed, i) < self.cfg.arms[self.programs[i].arm].success
    }

    /// The judge and the arm whose replicas run it, when an LLM judge is the verifier.
    pub fn judge(&self) -> Option<(&Judge, usize)> {
        Some((self.cfg.judge.as_ref()?, self.judge_arm?))
    }

    /// Program `i`'s verdict landed (at `now`): the learner updates. A judge's verdict is wrong
    /// with its error probability.
    pub fn verdict(&mut self, i: usize, now: f64) -> Result<(), ProgramRoutingError> {
        let truth = self.success(i);
        let wrong = self.cfg.judge.as_ref().is_some_and(|j| {
            let u = (mix(self.cfg.outcome_seed ^ 0x06a7_d6e5, i as u64) >> 11) as f64 / (1u64 << 53) as f64;
            u < j.error
        });
        self.verdicts += 1;
        self.wrong_verdicts += u64::from(wrong);
        let success = if truth != wrong { 1.0 } else { 0.0 };
        let p = &mut self.programs[i];
        p.verified_at = Some(now);
        let (r, cost) = (p.router, p.cost);
        self.routers[r].verdict(i as u64, success, cost)?;
        Ok(())
    }

    pub fn verifier_s(&self) -> f64 {
        self.cfg.verifier_s
    }

    pub fn slot_of(&self, i: usize) -> usize {
        self.programs[i].slot
    }

    /// The run's report; `preemptions` per replica.
    /// The run's report; per replica, `preemptions` and `kv` (peak usage, when first full).
    pub fn report(&self, preemptions: &[u64], kv: &[(f64, Option<f64>)]) -> RoutedRunReport {
        let mut arms: Vec<ArmReport> = self
            .cfg
            .arms
            .iter()
            .enumerate()
            .map(|(m, a)| ArmReport {
                model: a.model.clone(),
                cache_hit_rate: if self.prompt[m] > 0 { self.cached[m] as f64 / self.prompt[m] as f64 } else { 0.0 },
                admitted_while_waiting: if self.waiting[m].1 > 0.0 {
                    self.waiting[m].0 / self.waiting[m].1
                } else {
                    0.0
                },
                ..ArmReport::default()
            })
            .collect();
        for (r, &arm) in self.replica_arm.iter().enumerate() {
            arms[arm].preemptions += preemptions.get(r).copied().unwrap_or(0);
            if let Some(&(peak, full_at)) = kv.get(r) {
                arms[arm].kv_usage_peak = arms[arm].kv_usage_peak.max(peak);
                arms[arm].kv_full_at_s = match (arms[arm].kv_full_at_s, full_at) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        let mut resolved = 0u64;
        let mut programs = 0u64;
        let mut wait_sum = 0.0;
        let mut waits = 0u64;
        let mut start_sum = 0.0;
        let mut starts = 0u64;
        for (i, p) in self.programs.iter().enumerate() {
            if p.finished_at.is_none() {
                continue;
            }
            programs += 1;
            arms[p.arm].programs += 1;
            arms[p.arm].diverted_in += u64::from(p.diverted);
            if self.success(i) {
                resolved += 1;
                arms[p.arm].resolved += 1;
            }
            if let Some(a) = p.admitted_at {
                wait_sum += a - p.bound_at;
                waits += 1;
            }
            if let Some(a) = p.started_at {
                start_sum += a - p.bound_at;
                starts += 1;
            }
        }
        let rows = self
            .programs
            .iter()
            .enumerate()
            .filter(|(_, p)| p.bound)
            .map(|(i, p)| ProgramRow {
                arm: p.arm,
                slot: p.slot,
                learner: p.router,
                batch: p.batch,
                bound_at: p.bound_at,
                admitted_at: p.admitted_at,
                started_at: p.started_at,
                finished_at: p.finished_at,
                verified_at: p.verified_at,
                resolved: self.success(i),
            })
            .collect();
        let makespan = self.last_finished - self.first_bound.unwrap_or(0.0);
        let per_hour = |x: u64| if makespan > 0.0 { x as f64 * 3600.0 / makespan } else { 0.0 };
        RoutedRunReport {
            admission: match &self.cfg.admission {
                ProgramAdmission::Immediate => "none".into(),
                ProgramAdmission::Disc if self.cfg.options.reassign => "disc".into(),
                ProgramAdmission::Disc => "disc-admission-only".into(),
                ProgramAdmission::StaticCap(c) => {
                    format!("static-cap {}", c.iter().map(usize::to_string).collect::<Vec<_>>().join("/"))
                }
            },
            feedback: self.cfg.feedback.name().into(),
            programs,
            resolved,
            makespan_s: makespan,
            programs_per_hour: per_hour(programs),
            resolved_per_hour: per_hour(resolved),
            mean_admission_wait_s: if waits > 0 { wait_sum / waits as f64 } else { 0.0 },
            mean_start_wait_s: if starts > 0 { start_sum / starts as f64 } else { 0.0 },
            mean_call_latency_s: if self.calls > 0 { self.call_latency_sum / self.calls as f64 } else { 0.0 },
            verifier: self.cfg.judge.as_ref().map_or_else(|| "harness".to_string(), |j| format!("judge:{}", j.model)),
            verdicts: self.verdicts,
            wrong_verdicts: self.wrong_verdicts,
            ceiling_holds: self.ceiling_holds,
            arms,
            allowance_tokens: if self.cfg.admission == ProgramAdmission::Disc { self.allowances() } else { Vec::new() },
            rows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(p_large: f64, p_small: f64) -> RoutingLayer {
        let arm = |model: &str, success| RoutedArm {
            model: model.into(),
            success,
            prior_peak_tokens: 1_000.0,
            prior_run_s: 10.0,
        };
        let cfg = ProgramRouting {
            arms: vec![arm("big", p_large), arm("small", p_small)],
            admission: ProgramAdmission::Immediate,
            options: RouterOptions { reassign: false, ..RouterOptions::default() },
            feedback: Feedback::Delayed,
            verifier_s: 0.0,
            judge: None,
            outcome_seed: 11,
            prior: Vec::new(),
        };
        RoutingLayer::new(cfg, &["big", "small"], &[100_000, 100_000], 2_000, 4).unwrap()
    }

    #[test]
    fn a_task_the_smaller_model_resolves_the_larger_resolves_too() {
        let mut l = layer(0.7, 0.44);
        let (mut big, mut small, mut both) = (0, 0, 0);
        for i in 0..2_000 {
            l.programs[i].arm = 0;
            let on_big = l.success(i);
            l.programs[i].arm = 1;
            let on_small = l.success(i);
            assert!(!on_small || on_big, "task {i}");
            big += usize::from(on_big);
            small += usize::from(on_small);
            both += usize::from(on_big && on_small);
        }
        // The rates are the configured ones (2,000 draws: ±3 points is beyond 3 σ).
        assert!((big as f64 / 2_000.0 - 0.7).abs() < 0.035, "{big}");
        assert!((small as f64 / 2_000.0 - 0.44).abs() < 0.035, "{small}");
        assert_eq!(both, small);
    }

    #[test]
    fn the_waiting_average_is_time_weighted() {
        let mut l = layer(0.5, 0.5);
        l.waiting_state = vec![(true, 1), (false, 0)];
        l.waiting_since = 0.0;
        l.accumulate_waiting(10.0);
        l.waiting_state = vec![(true, 3), (false, 2)];
        l.accumulate_waiting(20.0);
        // (1·10 + 3·10) / 20 on the first arm; the second never waited.
        assert_eq!(l.waiting[0], (40.0, 20.0));
        assert_eq!(l.waiting[1], (0.0, 0.0));
    }
}
