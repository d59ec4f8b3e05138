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
    /// Modeled time from a program's end to its verdict (the verifier's run).
    pub verifier_s: f64,
    /// Seeds the tasks' difficulties.
    pub outcome_seed: u64,
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
    #[error("independent per-slot learners run without admission control")]
    IndependentAdmission,
    #[error("the verifier time must be finite and non-negative")]
    VerifierTime,
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
    /// Mean of programs admitted at once, sampled whenever one was waiting for this arm.
    pub admitted_while_waiting: f64,
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
    /// Mean time from binding to admission.
    pub mean_admission_wait_s: f64,
    /// Mean time from a request being ready to its last token.
    pub mean_call_latency_s: f64,
    pub arms: Vec<ArmReport>,
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
    finished: bool,
    verified: bool,
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
    waiting_samples: Vec<(f64, u64)>,
}

fn router(arms: &[RoutedArm], capacity_tokens: &[u64], options: RouterOptions) -> Result<Router, ProgramRoutingError> {
    let vocabulary = Vocabulary::fit(&[TASK_TEXT]);
    let pca = Pca::fit(&[vocabulary.embed(TASK_TEXT)], 0);
    let selector = VerifierSelector::fit(&vocabulary, &[(VERIFIER, TASK_TEXT)]);
    let learner =
        LinUcb::new(arms.len(), Router::context_dim(1, pca.len()), ALPHA_UCB, true).map_err(RouterError::from)?;
    let mut ledgers = Vec::with_capacity(arms.len());
    for (a, &cap) in arms.iter().zip(capacity_tokens) {
        ledgers.push(Ledger::new(cap, a.prior_peak_tokens, a.prior_run_s, options.disc).map_err(RouterError::from)?);
    }
    Ok(Router::new(vocabulary, pca, selector, learner, ledgers, options)?)
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
        let routers = (0..learners).map(|_| router(&cfg.arms, &capacity, cfg.options)).collect::<Result<_, _>>()?;
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
            waiting_samples: vec![(0.0, 0); n],
        })
    }

    pub fn feedback(&self) -> Feedback {
        self.cfg.feedback
    }

    pub fn arms(&self) -> usize {
        self.cfg.arms.len()
    }

    pub fn arm_of(&self, program: usize) -> usize {
        self.programs[program].arm
    }

    /// Whether a program of the current batch is unfinished or unverified.
    pub fn batch_open(&self) -> bool {
        self.programs.iter().any(|p| p.bound && p.batch == self.batch && !p.verified)
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
                self.sample_waiting();
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
                    self.sample_waiting();
                }
            }
        }
        for &p in &admitted {
            self.programs[p].admitted_at = Some(now);
        }
        Ok(admitted)
    }

    /// While a program waits for an arm, how many that arm has admitted (the static cap's
    /// calibration: paper 002 rounds DISC's mean admitted counts during admission waiting).
    fn sample_waiting(&mut self) {
        for arm in 0..self.cfg.arms.len() {
            let waiting = match &self.cfg.admission {
                ProgramAdmission::Disc => self.routers[0].ledger(arm).is_some_and(|l| l.queued() > 0),
                ProgramAdmission::StaticCap(_) => !self.cap_queue[arm].is_empty(),
                ProgramAdmission::Immediate => false,
            };
            if waiting {
                let running = match &self.cfg.admission {
                    ProgramAdmission::Disc => self.routers[0].ledger(arm).map_or(0, Ledger::admitted),
                    _ => self.cap_running[arm],
                };
                let s = &mut self.waiting_samples[arm];
                s.0 += running as f64;
                s.1 += 1;
            }
        }
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
        let p = &mut self.programs[i];
        p.finished = true;
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
        self.sample_waiting();
        Ok(admitted)
    }

    /// Whether program `i` resolves its task on the model it ran on.
    pub fn success(&self, i: usize) -> bool {
        let u = (mix(self.cfg.outcome_seed, i as u64) >> 11) as f64 / (1u64 << 53) as f64;
        u < self.cfg.arms[self.programs[i].arm].success
    }

    /// Program `i`'s verdict landed: the learner updates.
    pub fn verdict(&mut self, i: usize) -> Result<(), ProgramRoutingError> {
        let success = if self.success(i) { 1.0 } else { 0.0 };
        let p = &mut self.programs[i];
        p.verified = true;
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
    pub fn report(&self, preemptions: &[u64]) -> RoutedRunReport {
        let mut arms: Vec<ArmReport> = self
            .cfg
            .arms
            .iter()
            .enumerate()
            .map(|(m, a)| ArmReport {
                model: a.model.clone(),
                cache_hit_rate: if self.prompt[m] > 0 { self.cached[m] as f64 / self.prompt[m] as f64 } else { 0.0 },
                admitted_while_waiting: if self.waiting_samples[m].1 > 0 {
                    self.waiting_samples[m].0 / self.waiting_samples[m].1 as f64
                } else {
                    0.0
                },
                ..ArmReport::default()
            })
            .collect();
        for (r, &arm) in self.replica_arm.iter().enumerate() {
            arms[arm].preemptions += preemptions.get(r).copied().unwrap_or(0);
        }
        let mut resolved = 0u64;
        let mut programs = 0u64;
        let mut wait_sum = 0.0;
        let mut waits = 0u64;
        for (i, p) in self.programs.iter().enumerate() {
            if !p.finished {
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
        }
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
            mean_call_latency_s: if self.calls > 0 { self.call_latency_sum / self.calls as f64 } else { 0.0 },
            arms,
        }
    }
}
