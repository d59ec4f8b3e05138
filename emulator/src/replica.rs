//! One emulated replica: a deployment on one GPU, or on the `tp` GPUs of one node under tensor
//! parallelism (one engine: one scheduler, one pool of logical KV blocks spanning the GPUs,
//! each iteration costed on one GPU's shard plus its all-reduces), with vLLM's lifecycle
//! (Cold → Loading → Awake ⇄ Sleeping → Asleep → Waking → Awake; Unload → Cold) and a vLLM
//! V1-like continuous-batching scheduler.
//!
//! Scheduling, per iteration (vLLM V1 `Scheduler.schedule`, FCFS policy):
//! 1. running requests first, in admission order: each gets its remaining prefill (chunked by
//!    the `max_num_batched_tokens` budget) or one decode token; when a request needs a KV
//!    block and none is free, the most recently admitted running request is preempted — its
//!    blocks freed, its computed tokens discarded, and it returns to the head of the waiting
//!    queue to be recomputed later (V1 recompute preemption);
//! 2. then, if nothing was preempted, waiting requests in FCFS order while the token budget,
//!    `max_num_seqs` and the free KV blocks allow; a request's leading prompt blocks whose
//!    hashes are cached skip prefill (automatic prefix caching; at least one token is always
//!    computed). Admission stops at the first request that does not fit (head-of-line).
//!
//! Without chunked prefill (the V0 engine vLLM 0.10 runs on Volta, contexts ≤ 32k) the step is
//! V0's `Scheduler._schedule_default` instead: waiting requests first, each prefilled whole,
//! FCFS while the token budget, `max_num_seqs` and a 1 % free-block watermark allow; a step
//! that admitted a prefill holds no decode; otherwise all running requests decode, preempting
//! the most recently admitted by recompute when a block is missing.
//!
//! Per-request state (off by default): [`EmulatedReplica::set_request_state_tokens`] makes each
//! admitted request hold a fixed number of blocks beyond its tokens, taken at its admission and
//! returned at its end or preemption — the recurrent state a hybrid-attention model's
//! linear-attention layers keep per running request, which vLLM's hybrid cache manager
//! allocates from the same pool. A hybrid model (Qwen3.5: `ModelArch::linear_attention`) holds
//! its own from its config (`ModelArch::request_state_tokens`), and its prefix-cache hits are
//! whole pages of `ModelArch::hybrid_page_tokens` (vLLM's `align` mode); a dense-attention
//! engine (every Qwen3 model) holds none unless a counterfactual state is set.
//!
//! A request is a sequence of `prompt + generated` tokens; an iteration computes some of the
//! not-yet-computed ones, and when it reaches the end of the sequence the model samples one
//! more token. The same rule covers prefill chunks, decodes and recomputation after
//! preemption. Iteration time comes from [`crate::cost`], times a log-normal engine noise
//! drawn from a ChaCha8 stream seeded by the caller.
//!
//! Decode runs: while every running request decodes, nothing waits and the free blocks cover
//! the growth, each next step's batch is known (the same requests, each context one token
//! longer), so [`EmulatedReplica::extend_decode_run`] plans those steps ahead — their times
//! drawn from a clone of the noise stream — and they are applied in closed form when the
//! caller reaches the run's end, or cut back to the step in progress by a submit or
//! [`EmulatedReplica::catch_up`]: the same result as stepping, bit for bit, for one round
//! trip per run instead of one per token.
//!
//! Time is passed in by the caller; nothing here reads a clock or does I/O. Depends on the
//! cost model, the memory plan, the lifecycle durations, the block pool and the state type
//! ([`crate::state::ReplicaState`], re-exported here) of this crate.

use std::collections::{HashSet, VecDeque};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal};
use serde::{Deserialize, Serialize};
use switchyard_predictor::spec::{DeviceSpec, ModelArch};

use crate::cost::{BatchSummary, CostModel, IterationCost};
use crate::error::EmulatorError;
use crate::kv::BlockPool;
use crate::lifecycle::{SleepLevel, WeightSource, load_time_of, sleep_time_of, teardown_time, wake_time_of};
use crate::memory::{MemoryPlan, ServingConfig};
pub use crate::state::ReplicaState;

/// Standard deviation of the log of the per-iteration engine noise. Vidur's kernel profiles
/// show a per-operator std/mean of ~1 % (median over the TP = 1 linear ops; IQR 0.6–1.7 %);
/// a whole iteration adds host-side jitter (Python scheduling, allocator, launch queues).
/// Assumed 3 %.
pub const ITERATION_NOISE_SIGMA: f64 = 0.03;

/// vLLM V0's block-manager watermark (`CacheConfig`/`SelfAttnBlockSpaceManager`,
/// `watermark=0.01`): admission leaves 1 % of the blocks free for running requests' decodes.
const V0_WATERMARK: f64 = 0.01;

/// Relative tolerance when the caller completes a transition at the time it was given.
const TIME_EPS: f64 = 1e-9;

/// A request as the engine sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineRequest {
    /// Unique among the requests in flight on this replica.
    pub id: u64,
    pub prompt_tokens: u32,
    /// One chained hash per full `block_size`-token block of the prompt, like vLLM's block
    /// hashes: equal hashes at position `i` mean equal prompts up to the end of block `i`.
    /// May cover fewer blocks than the prompt has (the rest is then never cached).
    pub prefix_hashes: Vec<u64>,
    /// The same chain continued over the generated tokens: the hashes of the full blocks of
    /// `prompt + output` tokens from block `prompt_tokens / block_size` on, so that the
    /// blocks the request fills with generated tokens are cached as they complete (vLLM
    /// hashes every full block of `all_token_ids` and caches it once its KV is computed) and
    /// a successor whose prompt starts with this prompt and output hits them. Empty when the
    /// caller does not know the output tokens (then only prompt blocks are cached). Needs
    /// `prefix_hashes` to cover every full prompt block.
    #[serde(default)]
    pub generated_hashes: Vec<u64>,
    /// Tokens to generate (the response length, decided by the caller), at least 1.
    pub output_tokens: u32,
}

/// What an iteration (or a preemption at batch formation) produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum EngineEvent {
    /// The request's first output token was sampled.
    FirstToken { id: u64, at: f64 },
    /// The request generated all its tokens and left the engine.
    Finished {
        id: u64,
        at: f64,
        prompt_tokens: u32,
        /// Prompt tokens served from the prefix cache at the request's first admission.
        cached_prompt_tokens: u32,
        output_tokens: u32,
    },
    /// The request lost its KV blocks to make room; it will be recomputed.
    Preempted { id: u64, at: f64 },
}

/// The replica's gauges and counters, named after vLLM's `/metrics` (anchors §1.3). Counters
/// are cumulative over the replica's lifetime, across loads and sleeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Telemetry {
    /// `vllm:num_requests_running`.
    pub running: usize,
    /// `vllm:num_requests_waiting` (preempted requests included).
    pub waiting: usize,
    /// `running + waiting`.
    pub in_flight: usize,
    /// `vllm:kv_cache_usage_perc`, 0..1: blocks referenced by requests over all blocks.
    pub kv_usage: f64,
    pub kv_blocks_in_use: u32,
    pub kv_blocks_total: u32,
    /// `vllm:prefix_cache_queries` (tokens looked up at admission).
    pub prefix_cache_queries: u64,
    /// `vllm:prefix_cache_hits` (tokens found cached).
    pub prefix_cache_hits: u64,
    /// Cached prefix blocks evicted to make room (LRU).
    pub kv_evictions: u64,
    /// `vllm:num_preemptions_total`.
    pub preemptions: u64,
    /// Sum of iteration times, seconds.
    pub busy_seconds: f64,
    pub iterations: u64,
    /// `vllm:generation_tokens_total`.
    pub generated_tokens: u64,
    /// Tokens run as prefill chunks (prompts and recomputation after preemption; prefix-cache
    /// hits excluded; decodes not counted).
    pub prefill_tokens: u64,
    pub finished_requests: u64,
    /// Sum over requests of the time from submission to first admission, seconds.
    pub queue_seconds: f64,
}

/// One request inside the engine.
#[derive(Debug)]
struct Sequence {
    id: u64,
    prompt_tokens: u32,
    output_tokens: u32,
    /// The chained hashes of the request's full blocks: prompt blocks, then the blocks its
    /// generated tokens complete (when the caller supplied them).
    hashes: Vec<u64>,
    submitted_at: f64,
    generated: u32,
    /// Tokens whose KV is in the cache.
    num_computed: u32,
    /// Tokens scheduled in the current iteration.
    scheduled: u32,
    blocks: Vec<u32>,
    /// Blocks of the fixed per-request state ([`EmulatedReplica::set_request_state_tokens`]),
    /// held while the request is admitted.
    state: Vec<u32>,
    /// Leading blocks already registered in the prefix cache (or hit from it).
    hashed_blocks: u32,
    cached_prompt_tokens: Option<u32>,
    /// When the request was first scheduled (admitted into a batch).
    first_scheduled_at: Option<f64>,
    first_token_sent: bool,
    done: bool,
}

impl Sequence {
    fn seq_len(&self) -> u32 {
        self.prompt_tokens + self.generated
    }
}

#[derive(Debug, Clone, Copy)]
struct Iteration {
    end: f64,
}

#[derive(Debug, Default, Clone)]
struct Counters {
    queries: u64,
    hits: u64,
    preemptions: u64,
    busy: f64,
    iterations: u64,
    generated: u64,
    prefill: u64,
    finished: u64,
    queue: f64,
}

/// Decode steps planned ahead of the iteration in progress
/// ([`EmulatedReplica::extend_decode_run`]): while every running request decodes, nothing waits
/// and no step can run out of KV blocks, the batch of each next step is known — the same
/// requests, each context one token longer — and so is its duration, up to the noise drawn
/// from the replica's stream. The steps are applied when the caller reaches them.
#[derive(Debug)]
struct DecodeRun {
    /// Duration and end time of each planned step, in order; step `k` starts when step `k - 1`
    /// ends (step 0 is the iteration in progress).
    steps: Vec<(f64, f64)>,
    /// The noise stream after the draws of every planned step.
    rng_after: ChaCha8Rng,
}

/// A vLLM-like replica of one deployment on one GPU, or on `ServingConfig::tensor_parallel`
/// GPUs of one node.
#[derive(Debug)]
pub struct EmulatedReplica {
    device: DeviceSpec,
    model: ModelArch,
    config: ServingConfig,
    plan: MemoryPlan,
    cost: IterationCost,
    state: ReplicaState,
    sleep_level: Option<SleepLevel>,
    pool: BlockPool,
    seqs: Vec<Option<Sequence>>,
    free_slots: Vec<usize>,
    ids: HashSet<u64>,
    waiting: VecDeque<usize>,
    running: Vec<usize>,
    iteration: Option<Iteration>,
    /// Decode steps planned after the iteration in progress, not yet applied.
    run: Option<DecodeRun>,
    pending: Vec<EngineEvent>,
    /// The requests that sampled a token in the last [`EmulatedReplica::finish_iteration`]'s
    /// batch step (not those of a planned decode run).
    sampled: Vec<u64>,
    rng: ChaCha8Rng,
    noise: LogNormal<f64>,
    counters: Counters,
    /// Blocks each admitted request holds beyond its tokens (0: a dense-attention engine).
    state_blocks: u32,
    /// Prefix-cache hits count in multiples of this many blocks: 1 for a dense model; for a
    /// hybrid one the blocks of its aligned page (vLLM's `align` mode caches the recurrent state
    /// only at the boundaries of its enlarged attention blocks, so a prefix resumes there).
    hit_align_blocks: u32,
}

impl EmulatedReplica {
    /// A cold replica of `model` on `device` served with `config`; fails when vLLM would
    /// refuse to start (see [`MemoryPlan::new`]). `noise_seed` seeds the engine noise.
    pub fn new(
        device: DeviceSpec,
        model: ModelArch,
        config: ServingConfig,
        noise_seed: u64,
    ) -> Result<Self, EmulatorError> {
        let plan = MemoryPlan::new(&device, &model, &config)?;
        let cost = IterationCost::new(
            CostModel::for_arch_tp(&device, &model, config.dtype, config.tensor_parallel).with_kv_dtype(config.kv_dtype()),
        );
        let sigma = ITERATION_NOISE_SIGMA;
        let noise = LogNormal::new(-sigma * sigma / 2.0, sigma).map_err(|_| {
            EmulatorError::InvalidConfig {
                field: "noise sigma",
                value: sigma.to_string(),
                reason: "must be finite and non-negative",
            }
        })?;
        // A hybrid model's linear-attention state, in whole blocks of its KV cache.
        let state_tokens = model.request_state_tokens(config.dtype, config.kv_dtype());
        let state_blocks = blocks_for(u32::try_from(state_tokens).unwrap_or(u32::MAX), config.block_size);
        let hit_align_blocks = u32::try_from(model.hybrid_page_tokens(config.dtype, config.kv_dtype()))
            .unwrap_or(u32::MAX)
            .div_ceil(config.block_size.max(1))
            .max(1);
        if u64::from(blocks_for(config.max_model_len, config.block_size)) + u64::from(state_blocks)
            > u64::from(plan.kv_blocks)
        {
            return Err(EmulatorError::InvalidConfig {
                field: "max_model_len",
                value: config.max_model_len.to_string(),
                reason: "a max_model_len sequence and the model's per-request state do not fit the KV cache",
            });
        }
        Ok(EmulatedReplica {
            pool: BlockPool::new(plan.kv_blocks),
            device,
            model,
            config,
            plan,
            cost,
            state: ReplicaState::Cold,
            sleep_level: None,
            seqs: Vec::new(),
            free_slots: Vec::new(),
            ids: HashSet::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            iteration: None,
            run: None,
            pending: Vec::new(),
            sampled: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(noise_seed),
            noise,
            counters: Counters::default(),
            state_blocks,
            hit_align_blocks,
        })
    }

    /// Makes every admitted request hold `tokens` token-equivalents of KV (whole blocks)
    /// beyond its own tokens, for as long as it is admitted: the fixed recurrent state of a
    /// hybrid-attention model's linear-attention layers, which vLLM's hybrid cache manager
    /// allocates per running request whatever its length — a counterfactual on a dense model,
    /// whose KV is otherwise exactly its tokens (0, the default). A hybrid model's replica
    /// holds its own state from the start (`ModelArch::request_state_tokens`, in the serving
    /// dtype's KV tokens) and refuses this setting. Refused while requests are in flight, and when
    /// one `max_model_len` sequence with its state would not fit the cache (vLLM refuses to
    /// start such an engine).
    pub fn set_request_state_tokens(&mut self, tokens: u32) -> Result<(), EmulatorError> {
        let state = blocks_for(tokens, self.config.block_size);
        if self.model.linear_attention.is_some() {
            return Err(EmulatorError::InvalidConfig {
                field: "request_state_tokens",
                value: tokens.to_string(),
                reason: "a hybrid model's per-request state is its own (from its config)",
            });
        }
        if self.in_flight() > 0 {
            return Err(EmulatorError::InvalidConfig {
                field: "request_state_tokens",
                value: tokens.to_string(),
                reason: "cannot change while requests are in flight",
            });
        }
        if u64::from(blocks_for(self.config.max_model_len, self.config.block_size)) + u64::from(state)
            > u64::from(self.plan.kv_blocks)
        {
            return Err(EmulatorError::InvalidConfig {
                field: "request_state_tokens",
                value: tokens.to_string(),
                reason: "a max_model_len sequence and its state do not fit the KV cache",
            });
        }
        self.state_blocks = state;
        Ok(())
    }

    /// Tokens whose KV the running requests hold (their computed tokens; the per-request state
    /// excluded): with [`Telemetry::kv_blocks_in_use`] an observer can estimate that state.
    pub fn running_context_tokens(&self) -> u64 {
        self.running.iter().filter_map(|&s| self.seqs[s].as_ref()).map(|s| u64::from(s.num_computed + s.scheduled)).sum()
    }

    pub fn memory_plan(&self) -> &MemoryPlan {
        &self.plan
    }

    pub fn config(&self) -> &ServingConfig {
        &self.config
    }

    pub fn model(&self) -> &ModelArch {
        &self.model
    }

    /// GPUs the replica occupies (`ServingConfig::tensor_parallel`): each holds
    /// [`device_memory_in_use`](Self::device_memory_in_use).
    pub fn gpus(&self) -> u32 {
        self.plan.gpus()
    }

    pub fn state(&self) -> ReplicaState {
        self.state
    }

    /// Cold → Loading, weights from the page cache. Returns the time the load completes.
    pub fn begin_load(&mut self, now: f64) -> Result<f64, EmulatorError> {
        self.begin_load_from(now, WeightSource::PageCache)
    }

    /// Cold → Loading, weights read from `source`. Returns the time the load completes.
    pub fn begin_load_from(&mut self, now: f64, source: WeightSource) -> Result<f64, EmulatorError> {
        if self.state != ReplicaState::Cold {
            return Err(EmulatorError::IllegalTransition {
                action: "load",
                state: self.state,
            });
        }
        let until = now + load_time_of(&self.device, self.plan.weight_bytes, source);
        self.state = ReplicaState::Loading { until };
        Ok(until)
    }

    /// Awake → Sleeping (level 1 offloads the weights to host memory, level 2 discards them;
    /// both discard the KV cache and the prefix cache). Only with no request in flight.
    /// Returns the time the replica is asleep.
    pub fn begin_sleep(&mut self, level: u8, now: f64) -> Result<f64, EmulatorError> {
        let level = SleepLevel::try_from(level)?;
        self.require_idle_awake("sleep")?;
        let until = now + sleep_time_of(&self.device, self.plan.weight_bytes, level);
        self.pool.reset();
        self.sleep_level = Some(level);
        self.state = ReplicaState::Sleeping { until };
        Ok(until)
    }

    /// Asleep → Waking. Returns the time the replica is awake again.
    pub fn begin_wake(&mut self, now: f64) -> Result<f64, EmulatorError> {
        let (ReplicaState::Asleep, Some(level)) = (self.state, self.sleep_level) else {
            return Err(EmulatorError::IllegalTransition {
                action: "wake",
                state: self.state,
            });
        };
        let until = now + wake_time_of(&self.device, self.plan.weight_bytes, level);
        self.state = ReplicaState::Waking { until };
        Ok(until)
    }

    /// Completes the pending transition (Loading → Awake, Sleeping → Asleep, Waking → Awake,
    /// TearingDown → Cold) if `now` has reached its completion time; the caller calls it at
    /// the time the `begin_*` call returned. Returns whether a transition completed.
    pub fn finish_transition(&mut self, now: f64) -> bool {
        let (until, next) = match self.state {
            ReplicaState::Loading { until } | ReplicaState::Waking { until } => {
                (until, ReplicaState::Awake)
            }
            ReplicaState::Sleeping { until } => (until, ReplicaState::Asleep),
            ReplicaState::TearingDown { until } => (until, ReplicaState::Cold),
            ReplicaState::Cold | ReplicaState::Awake | ReplicaState::Asleep => return false,
        };
        if now < until - TIME_EPS * until.abs().max(1.0) {
            return false;
        }
        if next != ReplicaState::Asleep {
            self.sleep_level = None;
        }
        self.state = next;
        true
    }

    /// Awake (idle) or Asleep → TearingDown: the engine process starts to exit; its memory
    /// stays held until the teardown completes ([`teardown_time`]), then it is Cold. Returns
    /// the time the device memory is free.
    pub fn begin_unload(&mut self, now: f64) -> Result<f64, EmulatorError> {
        match self.state {
            ReplicaState::Awake => self.require_idle_awake("unload")?,
            ReplicaState::Asleep => {}
            state => return Err(EmulatorError::IllegalTransition { action: "unload", state }),
        }
        self.pool.reset();
        let until = now + teardown_time();
        self.state = ReplicaState::TearingDown { until };
        Ok(until)
    }

    /// Awake (idle) or Asleep → Cold at once: the engine is gone (a live engine's own exit
    /// takes its real time; the simulator uses [`Self::begin_unload`]).
    pub fn unload(&mut self) -> Result<(), EmulatorError> {
        match self.state {
            ReplicaState::Awake => self.require_idle_awake("unload")?,
            ReplicaState::Asleep => {}
            state => {
                return Err(EmulatorError::IllegalTransition {
                    action: "unload",
                    state,
                });
            }
        }
        self.pool.reset();
        self.sleep_level = None;
        self.state = ReplicaState::Cold;
        Ok(())
    }

    fn require_idle_awake(&self, action: &'static str) -> Result<(), EmulatorError> {
        if self.state != ReplicaState::Awake {
            return Err(EmulatorError::IllegalTransition {
                action,
                state: self.state,
            });
        }
        if self.in_flight() > 0 || self.iteration.is_some() {
            return Err(EmulatorError::Busy {
                action,
                in_flight: self.in_flight(),
            });
        }
        Ok(())
    }

    /// Queues a request (FCFS). Only while Awake. Rejects what vLLM rejects: an empty prompt,
    /// no tokens to generate, or `prompt + output > max_model_len`.
    pub fn submit(&mut self, req: EngineRequest, now: f64) -> Result<(), EmulatorError> {
        self.catch_up(now);
        if self.state != ReplicaState::Awake {
            return Err(EmulatorError::IllegalTransition {
                action: "submit a request",
                state: self.state,
            });
        }
        let reject = |reason: String| Err(EmulatorError::InvalidRequest { id: req.id, reason });
        if req.prompt_tokens == 0 {
            return reject("the prompt is empty".into());
        }
        if req.output_tokens == 0 {
            return reject("output_tokens must be at least 1".into());
        }
        let total = u64::from(req.prompt_tokens) + u64::from(req.output_tokens);
        if total > u64::from(self.config.max_model_len) {
            return reject(format!(
                "prompt ({}) + output ({}) tokens exceed max_model_len = {}",
                req.prompt_tokens, req.output_tokens, self.config.max_model_len
            ));
        }
        let full_blocks = req.prompt_tokens / self.config.block_size;
        if req.prefix_hashes.len() > full_blocks as usize {
            return reject(format!(
                "{} prefix hashes for a prompt of {} full {}-token blocks",
                req.prefix_hashes.len(),
                full_blocks,
                self.config.block_size
            ));
        }
        if !req.generated_hashes.is_empty() {
            if req.prefix_hashes.len() != full_blocks as usize {
                return reject(format!(
                    "generated hashes continue a chain of {} prefix hashes, but the prompt has {} full blocks",
                    req.prefix_hashes.len(),
                    full_blocks
                ));
            }
            let max = (req.prompt_tokens + req.output_tokens) / self.config.block_size - full_blocks;
            if req.generated_hashes.len() > max as usize {
                return reject(format!(
                    "{} generated hashes for {} blocks completed by the output",
                    req.generated_hashes.len(),
                    max
                ));
            }
        }
        if self.ids.contains(&req.id) {
            return Err(EmulatorError::DuplicateRequest(req.id));
        }
        let mut hashes = req.prefix_hashes;
        hashes.extend_from_slice(&req.generated_hashes);
        self.ids.insert(req.id);
        let seq = Sequence {
            id: req.id,
            prompt_tokens: req.prompt_tokens,
            output_tokens: req.output_tokens,
            hashes,
            submitted_at: now,
            generated: 0,
            num_computed: 0,
            scheduled: 0,
            blocks: Vec::new(),
            state: Vec::new(),
            hashed_blocks: 0,
            cached_prompt_tokens: None,
            first_scheduled_at: None,
            first_token_sent: false,
            done: false,
        };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.seqs[slot] = Some(seq);
                slot
            }
            None => {
                self.seqs.push(Some(seq));
                self.seqs.len() - 1
            }
        };
        self.waiting.push_back(slot);
        Ok(())
    }

    /// Removes a request from the engine, as vLLM's `abort_request` does when a client goes
    /// away: it leaves the waiting queue or the running batch at `now`, its KV blocks are
    /// released (full prompt blocks stay in the prefix cache, reusable until evicted), and no
    /// event of it is reported any more. An iteration in progress keeps its duration (its
    /// batch was already launched); the request simply takes no part in its results. Decode
    /// steps planned ahead are applied up to `now` and the rest dropped, as
    /// [`catch_up`](Self::catch_up) does. Returns false for an id not in flight.
    pub fn abort(&mut self, id: u64, now: f64) -> bool {
        if !self.ids.contains(&id) {
            return false;
        }
        self.catch_up(now);
        let Some(slot) = self
            .seqs
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.id == id && !s.done))
        else {
            return false;
        };
        self.running.retain(|&s| s != slot);
        self.waiting.retain(|&s| s != slot);
        if let Some(seq) = self.seqs[slot].take() {
            for &b in seq.blocks.iter().rev().chain(seq.state.iter().rev()) {
                self.pool.release(b);
            }
            self.ids.remove(&seq.id);
        }
        self.free_slots.push(slot);
        self.pending.retain(|e| match e {
            EngineEvent::FirstToken { id: e, .. }
            | EngineEvent::Finished { id: e, .. }
            | EngineEvent::Preempted { id: e, .. } => *e != id,
        });
        true
    }

    /// When the request in flight `id` was first admitted into a batch (the start of the
    /// iteration that first scheduled it; vLLM's `scheduled_ts`), `None` while it still waits
    /// for its first admission or is not in flight.
    pub fn first_scheduled_at(&self, id: u64) -> Option<f64> {
        self.seqs
            .iter()
            .flatten()
            .find(|s| s.id == id)
            .and_then(|s| s.first_scheduled_at)
    }

    /// The requests that sampled a token in the last [`Self::finish_iteration`]'s batch step, in
    /// batch order (a decode run planned with [`Self::extend_decode_run`] is not listed): a
    /// server streaming tokens counts exactly these — not a decode a prefill-only step (vLLM
    /// V0's) left out, nor a request still recomputing after a preemption.
    pub fn sampled(&self) -> &[u64] {
        &self.sampled
    }

    /// The running batch's requests with the time each was first admitted (vLLM's
    /// `scheduled_ts`), in admission order: a server reads each request's queueing time here
    /// once it starts running.
    pub fn running_admissions(&self) -> impl Iterator<Item = (u64, f64)> + '_ {
        self.running
            .iter()
            .filter_map(|&slot| self.seqs[slot].as_ref())
            .filter_map(|s| s.first_scheduled_at.map(|at| (s.id, at)))
    }

    pub fn in_iteration(&self) -> bool {
        self.iteration.is_some()
    }

    /// The end time of the iteration in progress — with decode steps planned after it
    /// ([`extend_decode_run`](Self::extend_decode_run)), the end of the last of them.
    pub fn iteration_end(&self) -> Option<f64> {
        match &self.run {
            Some(run) => run.steps.last().map(|s| s.1),
            None => self.iteration.map(|it| it.end),
        }
    }

    /// Requests queued or running.
    pub fn in_flight(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    /// If awake, idle and with work, forms the next batch and returns the time the iteration
    /// ends; the caller then calls [`finish_iteration`](Self::finish_iteration) at that time.
    /// With chunked prefill (vLLM V1, and V0 beyond 32k contexts) a step mixes decodes and
    /// prefill chunks; without it (the V0 engine on Volta, `_schedule_default`) a step is
    /// either all prefills or all decodes.
    pub fn start_iteration(&mut self, now: f64) -> Option<f64> {
        if self.state != ReplicaState::Awake || self.iteration.is_some() || self.in_flight() == 0 {
            return None;
        }
        let batch = if self.config.enable_chunked_prefill {
            self.schedule_chunked(now)
        } else {
            self.schedule_prefill_first(now)
        };
        if batch.is_empty() {
            return None;
        }
        let dt = self.cost.iteration_time(&batch) * self.noise.sample(&mut self.rng);
        self.counters.busy += dt;
        self.counters.iterations += 1;
        self.counters.prefill += batch.prefill_tokens;
        let end = now + dt;
        self.iteration = Some(Iteration { end });
        Some(end)
    }

    /// Whether finishing the iteration in progress would produce no event: nothing was
    /// preempted when its batch formed, and no scheduled request samples its first token or
    /// its last. False when no iteration is in progress.
    pub fn finish_is_quiet(&self) -> bool {
        if self.iteration.is_none() || !self.pending.is_empty() {
            return false;
        }
        self.running.iter().all(|&slot| {
            let Some(seq) = self.seqs[slot].as_ref() else {
                return true;
            };
            seq.scheduled == 0
                || seq.num_computed + seq.scheduled < seq.seq_len()
                || (seq.first_token_sent && seq.generated + 1 < seq.output_tokens)
        })
    }

    /// Plans up to `max_steps` decode steps after the iteration in progress and returns the
    /// end of the last one (the new [`iteration_end`](Self::iteration_end)); `None` when
    /// nothing can be planned. Possible only while the step in progress is a decode of every
    /// running request, finishing it produces no event, nothing waits, and the free KV blocks
    /// cover every planned step's growth (the prefix-cache registrations of generated blocks
    /// the steps fill are applied with them, in stepping's order): then
    /// each next step decodes the same requests, and until one of them samples its last
    /// token nothing observable happens. The plan stops at that step (whose finish reports
    /// it) or earlier.
    ///
    /// The result is exactly that of stepping — [`finish_iteration`](Self::finish_iteration)
    /// at each end, [`start_iteration`](Self::start_iteration) at once — whatever the caller
    /// does next: `finish_iteration` at the run's end applies every planned step and finishes
    /// the last one; [`submit`](Self::submit) before it applies the steps that started by then
    /// (the request joins the next step, as it would) and drops the rest, so `iteration_end`
    /// moves back to the end of the step in progress; [`catch_up`](Self::catch_up) does the
    /// same without a request. [`telemetry`](Self::telemetry) and
    /// [`in_flight`](Self::in_flight) see the replica as of the steps applied.
    pub fn extend_decode_run(&mut self, max_steps: usize) -> Option<f64> {
        if self.run.is_some() || max_steps == 0 || !self.waiting.is_empty() || !self.finish_is_quiet() {
            return None;
        }
        let it = self.iteration?;
        let bs = self.config.block_size;
        // Per running request: tokens computed once the step in progress finishes, blocks held.
        let mut contexts = Vec::with_capacity(self.running.len());
        let mut quiet_steps = usize::MAX;
        for &slot in &self.running {
            let seq = self.seqs[slot].as_ref()?;
            // A decode: one token scheduled, the last one of the sequence.
            if seq.scheduled != 1 || seq.num_computed + 1 != seq.seq_len() {
                return None;
            }
            // The step in progress samples token `generated + 1`; planned step k samples token
            // `generated + 1 + k`, the last one at k = output - generated - 1.
            let last = seq.output_tokens.saturating_sub(seq.generated + 1) as usize;
            quiet_steps = quiet_steps.min(last);
            contexts.push((seq.num_computed + 1, seq.blocks.len() as u32));
        }
        if contexts.is_empty() {
            return None;
        }
        // Blocks the planned steps 1..=k allocate (step k computes position context + k - 1,
        // so it needs blocks for context + k tokens); none may be missing (no preemption).
        let new_blocks = |k: usize| -> u64 {
            contexts
                .iter()
                .map(|&(c, held)| u64::from(blocks_for(c + k as u32, bs).saturating_sub(held)))
                .sum()
        };
        let free = u64::from(self.pool.free());
        let (mut lo, mut hi) = (0usize, quiet_steps.min(max_steps));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if new_blocks(mid) <= free {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let planned = lo;
        if planned == 0 {
            return None;
        }
        let b = contexts.len() as u32;
        // Keys and values read by step k's decodes: Σ (context + k - 1 + 1) = base + k·b.
        let base: u64 = contexts.iter().map(|&(c, _)| u64::from(c)).sum();
        let mut rng = self.rng.clone();
        let mut steps = Vec::with_capacity(planned);
        let mut end = it.end;
        // Every step computes b tokens over b sequences: those terms of its time are shared.
        let terms = self.cost.terms(u64::from(b), b);
        for k in 1..=planned as u64 {
            let batch = BatchSummary {
                requests: b,
                tokens: u64::from(b),
                prefill_pairs: 0.0,
                prefill_kv_tokens: 0,
                prefill_tokens: 0,
                decode_requests: b,
                decode_kv_tokens: base + k * u64::from(b),
            };
            let dt = self.cost.with_terms(terms, &batch) * self.noise.sample(&mut rng);
            end += dt;
            steps.push((dt, end));
        }
        self.run = Some(DecodeRun { steps, rng_after: rng });
        Some(end)
    }

    /// Applies the planned decode steps that have started by `now` (see
    /// [`extend_decode_run`](Self::extend_decode_run)) and drops the others: afterwards the
    /// iteration in progress is the one stepping would have in progress at `now`. A no-op
    /// without planned steps. Returns the new [`iteration_end`](Self::iteration_end).
    pub fn catch_up(&mut self, now: f64) -> Option<f64> {
        if let Some(run) = self.run.take() {
            let first_end = self.iteration.map_or(f64::INFINITY, |it| it.end);
            // Step k ≥ 1 starts when step k - 1 ends.
            let started = if first_end > now {
                0
            } else {
                1 + run.steps[..run.steps.len() - 1].partition_point(|s| s.1 <= now)
            };
            self.apply_decode_steps(&run, started);
        }
        self.iteration_end()
    }

    /// Applies the first `n` steps of `run`: what `finish_iteration` (no event) and
    /// `start_iteration` (the same decodes) would do at each step, in closed form — every
    /// running request computes and samples `n` tokens — with the blocks the steps open
    /// allocated in the order stepping allocates them (by step, then in running order).
    fn apply_decode_steps(&mut self, run: &DecodeRun, n: usize) {
        if n == 0 {
            return;
        }
        let bs = self.config.block_size;
        let caching = self.config.enable_prefix_caching;
        let steps = n as u32;
        // What stepping does to the block pool, as (step, position in `running`, action) in
        // stepping's order — by step, then in running order, a request's growth before its
        // registration. Planned step k computes position `c + k - 1` (c: tokens computed once
        // the step in progress finishes), so it needs more than the `held` blocks from
        // k = held·bs − c + 1 on, then every bs steps; and with prefix caching it registers
        // what it filled at the first step where a hashed block not yet registered is full
        // (step 1 when one already is), then at every step that fills a block, while hashed
        // blocks remain. Every action is known before any is applied (neither a growth nor a
        // registration moves another's step), so they are listed, packed into one integer each
        // (step, position, action: its order is stepping's) and sorted.
        const GROW: u64 = 0;
        const REGISTER: u64 = 1;
        // (A position takes 31 bits: the running queue is bounded by `max_num_seqs`, a u32 far
        // below 2^31 in any engine configuration.)
        debug_assert!(self.running.len() < 1 << 31);
        let pack = |step: u32, pos: usize, action: u64| (u64::from(step) << 32) | ((pos as u64) << 1) | action;
        let mut actions: Vec<u64> = Vec::new();
        let mut computed_before = Vec::with_capacity(self.running.len());
        for (pos, &slot) in self.running.iter().enumerate() {
            let Some(seq) = self.seqs[slot].as_mut() else {
                computed_before.push(0);
                continue;
            };
            let c = seq.num_computed + seq.scheduled;
            computed_before.push(c);
            let mut grow = (seq.blocks.len() as u32 * bs + 1).saturating_sub(c).max(1);
            while grow <= steps {
                actions.push(pack(grow, pos, GROW));
                grow += bs;
            }
            let hashes = seq.hashes.len() as u32;
            if caching && seq.hashed_blocks < hashes {
                let mut due = ((seq.hashed_blocks + 1) * bs).saturating_sub(c).max(1);
                // A step registers the blocks full after it, up to the last hashed one.
                while due <= steps && (c + due) / bs > seq.hashed_blocks {
                    actions.push(pack(due, pos, REGISTER));
                    if (c + due) / bs >= hashes {
                        break;
                    }
                    due = ((c + due) / bs + 1) * bs - c;
                }
            }
            seq.num_computed += steps;
            seq.generated += steps;
            self.counters.generated += u64::from(steps);
        }
        actions.sort_unstable();
        for key in actions {
            let (step, pos, action) = ((key >> 32) as u32, ((key & 0xffff_ffff) >> 1) as usize, key & 1);
            let Some(seq) = self.running.get(pos).and_then(|&slot| self.seqs[slot].as_mut()) else {
                continue;
            };
            if action == GROW {
                if let Some(b) = self.pool.allocate() {
                    seq.blocks.push(b);
                }
            } else {
                // What step `step`'s schedule registers, after its growth.
                register_blocks_filled_by(&mut self.pool, seq, computed_before[pos] + step, bs);
            }
        }
        for &(dt, end) in &run.steps[..n] {
            self.counters.busy += dt;
            self.iteration = Some(Iteration { end });
        }
        self.counters.iterations += n as u64;
        if n == run.steps.len() {
            self.rng = run.rng_after.clone();
        } else {
            for _ in 0..n {
                self.noise.sample(&mut self.rng);
            }
        }
    }

    /// vLLM V1's `Scheduler.schedule` (FCFS): running requests first (decodes and the rest of
    /// chunked prefills), then waiting requests into the remaining token budget.
    fn schedule_chunked(&mut self, now: f64) -> BatchSummary {
        let mut budget = self.config.max_num_batched_tokens;
        let mut batch = BatchSummary::default();
        let mut preempted = false;

        // 1. Running requests, in admission order.
        self.schedule_running(&mut budget, now, &mut batch, &mut preempted);

        // 2. Waiting requests, FCFS, unless this step preempted (V1 admits nothing then) —
        // except when the batch would otherwise be empty.
        if !preempted || batch.is_empty() {
            while budget > 0 && self.running.len() < self.config.max_num_seqs as usize {
                let Some(tokens) = self.admit_front(budget, 0, true, now, &mut batch) else {
                    break;
                };
                budget -= tokens;
            }
        }
        batch
    }

    /// vLLM V0's `Scheduler._schedule_default` (no chunked prefill): waiting requests are
    /// admitted first, FCFS, each with its whole uncomputed sequence (prompt, plus the tokens
    /// generated before a recompute preemption), while the token budget, `max_num_seqs` and
    /// the block manager's watermark allow (`can_allocate`: 1 % of the blocks stay free); a
    /// step that admitted a prefill runs only prefills ("Don't schedule decodes if prefills
    /// are scheduled"). Otherwise every running request decodes one token, and when a decode
    /// needs a block and none is free the most recently admitted running request is
    /// preempted by recompute (`_schedule_running`, `PreemptionMode.RECOMPUTE` for a
    /// single-sequence group) and goes back to the head of the waiting queue.
    fn schedule_prefill_first(&mut self, now: f64) -> BatchSummary {
        let mut budget = self.config.max_num_batched_tokens;
        let mut batch = BatchSummary::default();
        let watermark = (f64::from(self.pool.total()) * V0_WATERMARK).floor() as u32;

        while self.running.len() < self.config.max_num_seqs as usize {
            // The watermark keeps decodes of running requests from being starved of blocks;
            // with nothing running it would only block the queue for ever.
            let reserve = if self.running.is_empty() && batch.is_empty() { 0 } else { watermark };
            let Some(tokens) = self.admit_front(budget, reserve, false, now, &mut batch) else {
                break;
            };
            budget -= tokens;
        }
        if !batch.is_empty() {
            return batch;
        }

        let mut preempted = false;
        self.schedule_running(&mut budget, now, &mut batch, &mut preempted);
        batch
    }

    /// Both engines' pass over the running requests, in admission order: each gets the rest
    /// of its uncomputed sequence within `budget` (a decode: one token), growing its blocks or
    /// preempting the most recent request (`preempted` set); stops at the first that cannot.
    fn schedule_running(&mut self, budget: &mut u32, now: f64, batch: &mut BatchSummary, preempted: &mut bool) {
        let bs = self.config.block_size;
        let caching = self.config.enable_prefix_caching;
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let slot = self.running[i];
            let Some(seq) = self.seqs[slot].as_ref() else {
                break;
            };
            let context = seq.num_computed;
            let tokens = (seq.seq_len() - context).min(*budget);
            if !self.grow_or_preempt(slot, context + tokens, now, preempted) {
                break;
            }
            let Some(seq) = self.seqs[slot].as_mut() else {
                break;
            };
            seq.scheduled = tokens;
            if caching {
                register_full_blocks(&mut self.pool, seq, bs);
            }
            *budget -= tokens;
            batch.add_chunk(tokens, context);
            i += 1;
        }
    }

    /// Gives the running request in `slot` the blocks for `tokens` tokens, preempting the most
    /// recently admitted running requests while none is free. Returns false when the request
    /// preempted itself (then nothing more of the running queue is scheduled).
    fn grow_or_preempt(&mut self, slot: usize, tokens: u32, now: f64, preempted: &mut bool) -> bool {
        let bs = self.config.block_size;
        let Some(seq) = self.seqs[slot].as_ref() else {
            return false;
        };
        let need = blocks_for(tokens, bs).saturating_sub(seq.blocks.len() as u32);
        while self.pool.free() < need {
            let Some(&victim) = self.running.last() else {
                break;
            };
            self.preempt(victim, now);
            *preempted = true;
            if victim == slot {
                return false;
            }
        }
        let Some(seq) = self.seqs[slot].as_mut() else {
            return false;
        };
        for _ in 0..need {
            if let Some(b) = self.pool.allocate() {
                seq.blocks.push(b);
            }
        }
        true
    }

    /// Admits the head of the waiting queue into the batch if it fits: its cached leading
    /// blocks (prefix caching) are taken, the rest of its sequence — cut to `budget` when
    /// `chunk`, else whole — is scheduled, and `reserve` blocks must stay free after its
    /// allocation. Returns the tokens scheduled, or `None` when it does not fit (admission is
    /// head-of-line).
    fn admit_front(&mut self, budget: u32, reserve: u32, chunk: bool, now: f64, batch: &mut BatchSummary) -> Option<u32> {
        if budget == 0 {
            return None;
        }
        let bs = self.config.block_size;
        let caching = self.config.enable_prefix_caching;
        let &slot = self.waiting.front()?;
        let seq = self.seqs[slot].as_mut()?;
        let seq_len = seq.seq_len();
        let state_need = if seq.state.is_empty() { self.state_blocks } else { 0 };
        // The best case first: every cacheable block a hit that holds no free block (the
        // blocks to allocate only fall as hits rise). A head that cannot fit even then is
        // refused without walking its hashes — a head blocked for memory is retried every
        // step, and a long context has thousands of blocks.
        let best_hits = if caching {
            let h = (((seq_len - 1) / bs) as usize).min(seq.hashes.len()) as u32;
            h - h % self.hit_align_blocks
        } else {
            0
        };
        let best_rest = seq_len - best_hits * bs;
        if !chunk && best_rest > budget {
            return None;
        }
        let best_need = blocks_for(best_hits * bs + best_rest.min(budget), bs) - best_hits;
        if self.pool.free() < best_need.saturating_add(state_need).saturating_add(reserve) {
            return None;
        }
        let (hit_blocks, hit_free) = if caching {
            let max_hit = ((seq_len - 1) / bs) as usize;
            let mut hits = 0u32;
            let mut free = 0u32;
            // Free blocks among the hits up to the last aligned boundary passed.
            let mut free_aligned = 0u32;
            for &h in seq.hashes.iter().take(max_hit) {
                let Some(b) = self.pool.lookup(h) else { break };
                hits += 1;
                free += u32::from(self.pool.is_free(b));
                if hits.is_multiple_of(self.hit_align_blocks) {
                    free_aligned = free;
                }
            }
            // A hybrid model resumes only from a state kept at an aligned page boundary (a
            // dense one's pages are single blocks: every hit counts).
            (hits - hits % self.hit_align_blocks, free_aligned)
        } else {
            (0, 0)
        };
        let hit_tokens = hit_blocks * bs;
        let rest = seq_len - hit_tokens;
        if !chunk && rest > budget {
            return None;
        }
        let tokens = rest.min(budget);
        let need = blocks_for(hit_tokens + tokens, bs) - hit_blocks;
        if self.pool.free().saturating_sub(hit_free) < need.saturating_add(state_need).saturating_add(reserve) {
            return None;
        }
        self.waiting.pop_front();
        for &h in seq.hashes.iter().take(hit_blocks as usize) {
            if let Some(b) = self.pool.lookup(h) {
                self.pool.touch(b);
                seq.blocks.push(b);
            }
        }
        for _ in 0..need {
            if let Some(b) = self.pool.allocate() {
                seq.blocks.push(b);
            }
        }
        for _ in 0..state_need {
            if let Some(b) = self.pool.allocate() {
                seq.state.push(b);
            }
        }
        seq.num_computed = hit_tokens;
        seq.hashed_blocks = hit_blocks;
        seq.scheduled = tokens;
        if seq.cached_prompt_tokens.is_none() {
            seq.cached_prompt_tokens = Some(hit_tokens.min(seq.prompt_tokens));
            seq.first_scheduled_at = Some(now);
            self.counters.queue += (now - seq.submitted_at).max(0.0);
        }
        if caching {
            self.counters.queries += u64::from(seq_len);
            self.counters.hits += u64::from(hit_tokens);
            register_full_blocks(&mut self.pool, seq, bs);
        }
        batch.add_chunk(tokens, hit_tokens);
        self.running.push(slot);
        Some(tokens)
    }

    /// Frees a running request's blocks and sends it back to the head of the waiting queue.
    fn preempt(&mut self, slot: usize, now: f64) {
        if let Some(pos) = self.running.iter().rposition(|&s| s == slot) {
            self.running.remove(pos);
        }
        let Some(seq) = self.seqs[slot].as_mut() else {
            return;
        };
        for &b in seq.blocks.iter().rev().chain(seq.state.iter().rev()) {
            self.pool.release(b);
        }
        seq.blocks.clear();
        seq.state.clear();
        seq.num_computed = 0;
        seq.hashed_blocks = 0;
        seq.scheduled = 0;
        self.waiting.push_front(slot);
        self.counters.preemptions += 1;
        self.pending.push(EngineEvent::Preempted {
            id: seq.id,
            at: now,
        });
    }

    /// Applies the iteration's progress at `now` (its end time): computed tokens enter the KV
    /// cache, sequences that reached their end sample a token, finished requests leave and
    /// free their blocks (cached prompt blocks stay reusable until evicted). Returns the
    /// events in order: preemptions made when the batch was formed, then first tokens and
    /// completions in batch order. Empty if no iteration was in progress.
    pub fn finish_iteration(&mut self, now: f64) -> Vec<EngineEvent> {
        self.sampled.clear();
        if let Some(run) = self.run.take() {
            let n = run.steps.len();
            self.apply_decode_steps(&run, n);
        }
        if self.iteration.take().is_none() {
            return Vec::new();
        }
        let mut events = std::mem::take(&mut self.pending);
        let mut any_done = false;
        for &slot in &self.running {
            let Some(seq) = self.seqs[slot].as_mut() else {
                continue;
            };
            if seq.scheduled == 0 {
                continue;
            }
            seq.num_computed += seq.scheduled;
            seq.scheduled = 0;
            if seq.num_computed < seq.seq_len() {
                continue;
            }
            self.sampled.push(seq.id);
            seq.generated += 1;
            self.counters.generated += 1;
            if !seq.first_token_sent {
                seq.first_token_sent = true;
                events.push(EngineEvent::FirstToken {
                    id: seq.id,
                    at: now,
                });
            }
            if seq.generated >= seq.output_tokens {
                seq.done = true;
                any_done = true;
                for &b in seq.blocks.iter().rev().chain(seq.state.iter().rev()) {
                    self.pool.release(b);
                }
                seq.blocks.clear();
                seq.state.clear();
                self.counters.finished += 1;
                events.push(EngineEvent::Finished {
                    id: seq.id,
                    at: now,
                    prompt_tokens: seq.prompt_tokens,
                    cached_prompt_tokens: seq.cached_prompt_tokens.unwrap_or(0),
                    output_tokens: seq.generated,
                });
            }
        }
        if any_done {
            let (seqs, free_slots, ids) = (&mut self.seqs, &mut self.free_slots, &mut self.ids);
            self.running.retain(|&slot| {
                let done = seqs[slot].as_ref().is_none_or(|s| s.done);
                if done {
                    if let Some(seq) = seqs[slot].take() {
                        ids.remove(&seq.id);
                    }
                    free_slots.push(slot);
                }
                !done
            });
        }
        events
    }

    pub fn telemetry(&self) -> Telemetry {
        let c = &self.counters;
        let total = self.pool.total();
        Telemetry {
            running: self.running.len(),
            waiting: self.waiting.len(),
            in_flight: self.in_flight(),
            kv_usage: if total == 0 {
                0.0
            } else {
                f64::from(self.pool.in_use()) / f64::from(total)
            },
            kv_blocks_in_use: self.pool.in_use(),
            kv_blocks_total: total,
            prefix_cache_queries: c.queries,
            prefix_cache_hits: c.hits,
            kv_evictions: self.pool.evictions(),
            preemptions: c.preemptions,
            busy_seconds: c.busy,
            iterations: c.iterations,
            generated_tokens: c.generated,
            prefill_tokens: c.prefill,
            finished_requests: c.finished,
            queue_seconds: c.queue,
        }
    }

    /// Device memory held in the current state, on each of the replica's [`gpus`](Self::gpus)
    /// (a tensor-parallel replica holds this much on every one of its GPUs; on one GPU, all of
    /// it): nothing when cold, the whole claim while loading, awake, tearing down or in a
    /// sleep/wake transition, and what sleep mode cannot release ([`MemoryPlan::asleep_bytes`])
    /// when asleep.
    pub fn device_memory_in_use(&self) -> u64 {
        match self.state {
            ReplicaState::Cold => 0,
            ReplicaState::Asleep => self.plan.asleep_bytes,
            // Tearing down from sleep holds what the sleeping engine held.
            ReplicaState::TearingDown { .. } if self.sleep_level.is_some() => self.plan.asleep_bytes,
            ReplicaState::TearingDown { .. }
            | ReplicaState::Loading { .. }
            | ReplicaState::Awake
            | ReplicaState::Sleeping { .. }
            | ReplicaState::Waking { .. } => self.plan.total_claim_bytes,
        }
    }
}

/// Blocks needed to hold `tokens` tokens.
fn blocks_for(tokens: u32, block_size: u32) -> u32 {
    tokens.div_ceil(block_size)
}

/// Registers the sequence's blocks (prompt, and generated ones when their hashes are known)
/// that become full with this iteration's tokens.
fn register_full_blocks(pool: &mut BlockPool, seq: &mut Sequence, block_size: u32) {
    register_blocks_filled_by(pool, seq, seq.num_computed + seq.scheduled, block_size);
}

/// Registers the sequence's hashed blocks not yet registered that `tokens` computed tokens
/// fill (a planned decode run calls it with the tokens as of each of its steps).
fn register_blocks_filled_by(pool: &mut BlockPool, seq: &mut Sequence, tokens: u32, block_size: u32) {
    let full = (tokens / block_size).min(seq.hashes.len() as u32);
    for b in seq.hashed_blocks..full {
        let (Some(&block), Some(&hash)) = (
            seq.blocks.get(b as usize),
            seq.hashes.get(b as usize),
        ) else {
            break;
        };
        pool.register(block, hash);
    }
    seq.hashed_blocks = seq.hashed_blocks.max(full);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use switchyard_predictor::spec::{Dtype, device, model};

    /// A 4 GiB test device: Qwen3-0.6B leaves a KV cache of a few hundred blocks, so
    /// modest request mixes overflow it.
    fn tiny_device() -> DeviceSpec {
        DeviceSpec {
            name: "test-4GiB".into(),
            dense_fp16_flops: 100e12,
            memory_bandwidth: 1e12,
            memory_bytes: 4 << 30,
            host_link_bandwidth: 16e9,
            supports_bf16: true,
            source: "unit test".into(),
        }
    }

    /// The tiny device as a Volta part: the V0 engine, no chunked prefill, no prefix caching.
    fn awake_tiny_v0(seed: u64, max_num_seqs: u32) -> EmulatedReplica {
        let d = DeviceSpec { supports_bf16: false, ..tiny_device() };
        let cfg = ServingConfig {
            max_num_seqs,
            gpu_memory_utilization: 0.85,
            ..ServingConfig::vllm_defaults_on(&d, Dtype::Fp16, 4096)
        };
        assert!(!cfg.enable_chunked_prefill);
        let mut r = EmulatedReplica::new(d, model("Qwen3-0.6B").unwrap(), cfg, seed).unwrap();
        let t = r.begin_load(0.0).unwrap();
        assert!(r.finish_transition(t));
        r
    }

    fn awake_tiny(seed: u64, max_num_seqs: u32) -> EmulatedReplica {
        // 0.85: vLLM refuses to request more than the memory free once the CUDA context
        // (512 MiB here) exists, and 0.9 × 4 GiB would be.
        let cfg = ServingConfig {
            max_num_seqs,
            gpu_memory_utilization: 0.85,
            ..ServingConfig::vllm_defaults(Dtype::Bf16, 4096)
        };
        let mut r =
            EmulatedReplica::new(tiny_device(), model("Qwen3-0.6B").unwrap(), cfg, seed).unwrap();
        let t = r.begin_load(0.0).unwrap();
        assert!(r.finish_transition(t));
        r
    }

    impl EmulatedReplica {
        /// Structural invariants of the scheduler and the block pool.
        fn check_invariants(&self) {
            let bs = self.config.block_size;
            let mut referenced = HashSet::new();
            assert!(self.running.len() <= self.config.max_num_seqs as usize);
            for &slot in &self.running {
                let s = self.seqs[slot]
                    .as_ref()
                    .expect("running slot holds a sequence");
                assert!(!s.done);
                assert!(s.num_computed + s.scheduled <= s.seq_len());
                assert!(s.blocks.len() as u32 >= blocks_for(s.num_computed + s.scheduled, bs));
                assert!(s.generated < s.output_tokens);
                assert_eq!(s.state.len() as u32, self.state_blocks, "a running request holds the state");
                for &b in s.blocks.iter().chain(&s.state) {
                    assert!(
                        !self.pool.is_free(b),
                        "block {b} of a running request is in the free queue"
                    );
                    referenced.insert(b);
                }
            }
            for &slot in &self.waiting {
                let s = self.seqs[slot]
                    .as_ref()
                    .expect("waiting slot holds a sequence");
                assert!(s.blocks.is_empty() && s.state.is_empty() && s.num_computed == 0);
            }
            assert_eq!(
                referenced.len() as u32,
                self.pool.in_use(),
                "blocks in use = blocks referenced"
            );
            assert!(self.pool.in_use() <= self.pool.total());
            assert_eq!(self.ids.len(), self.in_flight());
            if !self.config.enable_chunked_prefill {
                let (decodes, prefills) = self.scheduled_kinds();
                assert!(decodes == 0 || prefills == 0, "V0 step mixes {decodes} decodes and {prefills} prefills");
            }
        }

        /// Scheduled decodes and prefills of the step in progress.
        fn scheduled_kinds(&self) -> (usize, usize) {
            let (mut decodes, mut prefills) = (0, 0);
            for s in self.running.iter().filter_map(|&slot| self.seqs[slot].as_ref()) {
                if s.scheduled == 0 {
                    continue;
                }
                if s.scheduled == 1 && s.generated > 0 && s.num_computed + 1 == s.seq_len() {
                    decodes += 1;
                } else {
                    prefills += 1;
                }
            }
            (decodes, prefills)
        }
    }

    fn step(r: &mut EmulatedReplica, now: f64) -> (f64, Vec<EngineEvent>) {
        let end = r.start_iteration(now).expect("work to do");
        (end, r.finish_iteration(end))
    }

    /// V0 without chunked prefill (vLLM `Scheduler._schedule_default`): a newly arrived prompt
    /// runs alone before the running request decodes again; V1 mixes the two in one step.
    #[test]
    fn v0_runs_prefills_before_decodes_v1_mixes_them() {
        let m = model("Qwen3-0.6B").unwrap();
        for (name, mixes) in [("V100-32GB", false), ("A100-40GB", true)] {
            let d = switchyard_predictor::spec::device(name).unwrap();
            let cfg = ServingConfig::vllm_defaults_on(&d, Dtype::Fp16, 8192);
            assert_eq!(cfg.enable_chunked_prefill, mixes);
            let mut r = EmulatedReplica::new(d, m.clone(), cfg, 1).unwrap();
            let t = r.begin_load(0.0).unwrap();
            assert!(r.finish_transition(t));
            let req = |id, prompt| EngineRequest { id, prompt_tokens: prompt, prefix_hashes: Vec::new(), generated_hashes: Vec::new(), output_tokens: 10 };
            r.submit(req(1, 100), t).unwrap();
            let (t, ev) = step(&mut r, t);
            assert!(matches!(ev[..], [EngineEvent::FirstToken { id: 1, .. }]));
            r.submit(req(2, 3000), t).unwrap();
            r.start_iteration(t).unwrap();
            let (decodes, prefills) = r.scheduled_kinds();
            assert_eq!(prefills, 1, "{name}");
            assert_eq!(decodes, usize::from(mixes), "{name}");
            r.check_invariants();
        }
    }

    /// A hybrid-attention engine's per-request state: each admitted request holds its blocks
    /// beyond its tokens while it runs (an observer sees them as usage above the running
    /// contexts), they return to the pool when it finishes, and with them fewer requests run
    /// at once.
    #[test]
    fn a_per_request_state_is_held_while_admitted_and_crowds_the_cache() {
        let run = |state_tokens: u32| {
            let mut r = awake_tiny(5, 64);
            r.set_request_state_tokens(state_tokens).unwrap();
            let total = r.memory_plan().kv_blocks;
            // Requests whose tokens alone fit the cache together.
            let n = (total / (blocks_for(1100, 16) + 2)).min(8) as u64;
            for id in 0..n {
                let req = EngineRequest { id, prompt_tokens: 1000, prefix_hashes: Vec::new(), generated_hashes: Vec::new(), output_tokens: 100 };
                r.submit(req, 0.0).unwrap();
            }
            let mut now = 0.0;
            let mut max_excess = 0u64;
            let mut max_running = 0usize;
            while let Some(end) = r.start_iteration(now) {
                r.check_invariants();
                let t = r.telemetry();
                max_running = max_running.max(t.running);
                if t.running > 0 && t.preemptions == 0 {
                    let used = u64::from(t.kv_blocks_in_use) * 16;
                    let ctx = r.running_context_tokens();
                    max_excess = max_excess.max((used - ctx) / t.running as u64);
                }
                now = end;
                r.finish_iteration(now);
            }
            let t = r.telemetry();
            assert_eq!(t.kv_blocks_in_use, 0, "every block returned");
            (max_running, max_excess, total, n)
        };
        let (dense_running, dense_excess, total, n) = run(0);
        assert_eq!(dense_running as u64, n, "the dense engine runs every request at once");
        assert!(dense_excess < 16, "a dense request holds its tokens' blocks only: {dense_excess}");
        // A state that leaves room for about half the requests at once.
        let state = (total / n as u32) * 16;
        let (hybrid_running, hybrid_excess, _, _) = run(state);
        assert!(hybrid_excess >= u64::from(state), "{hybrid_excess} < {state}");
        assert!(hybrid_running < dense_running, "{hybrid_running} vs {dense_running}");
        // Refused: a state that leaves no room for one max_model_len sequence, and any change
        // while requests are in flight.
        let mut r = awake_tiny(5, 64);
        let total = r.memory_plan().kv_blocks;
        assert!(r.set_request_state_tokens(total * 16).is_err());
        r.submit(EngineRequest { id: 1, prompt_tokens: 10, prefix_hashes: Vec::new(), generated_hashes: Vec::new(), output_tokens: 5 }, 0.0).unwrap();
        assert!(r.set_request_state_tokens(16).is_err());
    }

    /// A hybrid model's replica holds its config's state per running request from the start
    /// (Qwen3.5-9B in BF16: 1,572 tokens of its KV cache, 99 blocks of 16) and refuses a
    /// counterfactual one.
    #[test]
    fn a_hybrid_model_holds_its_own_state_per_running_request() {
        let m = model("Qwen3.5-9B").unwrap();
        let cfg = ServingConfig::vllm_defaults_on(&device("H100-80GB").unwrap(), Dtype::Bf16, 32768);
        let mut r = EmulatedReplica::new(device("H100-80GB").unwrap(), m, cfg, 1).unwrap();
        let t = r.begin_load(0.0).unwrap();
        assert!(r.finish_transition(t));
        assert!(r.set_request_state_tokens(16).is_err());
        for id in 0..3 {
            let req = EngineRequest { id, prompt_tokens: 1000, prefix_hashes: Vec::new(), generated_hashes: Vec::new(), output_tokens: 50 };
            r.submit(req, 0.0).unwrap();
        }
        let end = r.start_iteration(0.0).unwrap();
        r.check_invariants();
        let t = r.telemetry();
        assert_eq!(t.running, 3);
        let per_request = blocks_for(1000, 16) + blocks_for(1572, 16);
        assert_eq!(t.kv_blocks_in_use, 3 * per_request, "prompt blocks plus 99 state blocks each");
        let mut now = end;
        r.finish_iteration(now);
        while let Some(end) = r.start_iteration(now) {
            now = end;
            r.finish_iteration(now);
        }
        assert_eq!(r.telemetry().kv_blocks_in_use, 0);
        // Prefix caching resumes at the last 528-token page (33 blocks) the cached prefix
        // covers: a 1,200-token prompt cached, then one sharing its 75 full blocks hits 66
        // of them, 1,056 tokens (a dense model would hit all 75).
        let hashes: Vec<u64> = (0..75).collect();
        let first = EngineRequest { id: 10, prompt_tokens: 1200, prefix_hashes: hashes.clone(), generated_hashes: Vec::new(), output_tokens: 5 };
        let mut longer = hashes;
        longer.extend(1000..1050);
        let second = EngineRequest { id: 11, prompt_tokens: 2000, prefix_hashes: longer, generated_hashes: Vec::new(), output_tokens: 5 };
        let mut hits = Vec::new();
        for req in [first, second] {
            let before = r.telemetry().prefix_cache_hits;
            r.submit(req, now).unwrap();
            while let Some(end) = r.start_iteration(now) {
                now = end;
                r.finish_iteration(now);
            }
            hits.push(r.telemetry().prefix_cache_hits - before);
        }
        assert_eq!(hits, vec![0, 66 * 16]);
        // Tensor parallelism of a hybrid model is refused with its field.
        let tp2 = ServingConfig {
            tensor_parallel: 2,
            ..ServingConfig::vllm_defaults_on(&device("H100-80GB").unwrap(), Dtype::Bf16, 32768)
        };
        let err = EmulatedReplica::new(device("H100-80GB").unwrap(), model("Qwen3.5-9B").unwrap(), tp2, 1).err().unwrap();
        assert!(err.to_string().contains("tensor_parallel"), "{err}");
    }

    /// V0 preempts a decoding request by recompute when a decode needs a block and none is
    /// free; the victim (the most recently admitted) is recomputed later as a prefill of its
    /// prompt and the tokens it had generated, and still finishes with all its tokens.
    #[test]
    fn v0_preempts_decodes_by_recompute_when_kv_runs_out() {
        let mut r = awake_tiny_v0(3, 64);
        let total = r.memory_plan().kv_blocks;
        // Five 3,000-token prompts fit the cache (188 blocks each), their 4,000-token
        // sequences (250 blocks each) do not.
        let n = 5u32;
        assert!(n * 188 < total && n * 250 > total, "{total} blocks");
        for id in 0..u64::from(n) {
            r.submit(EngineRequest { id, prompt_tokens: 3000, prefix_hashes: Vec::new(), generated_hashes: Vec::new(), output_tokens: 1000 }, 0.0).unwrap();
        }
        let mut now = 0.0;
        let mut preempted = Vec::new();
        let mut finished = 0;
        while let Some(end) = r.start_iteration(now) {
            r.check_invariants();
            now = end;
            for e in r.finish_iteration(now) {
                match e {
                    EngineEvent::Preempted { id, .. } => preempted.push(id),
                    EngineEvent::Finished { .. } => finished += 1,
                    EngineEvent::FirstToken { .. } => {}
                }
            }
        }
        assert_eq!(finished, n);
        assert!(!preempted.is_empty(), "the cache of {total} blocks overflowed");
        assert_eq!(r.telemetry().preemptions, preempted.len() as u64);
    }

    /// A request arriving at a time.
    type Arrival = (f64, EngineRequest);

    /// Drives a replica through `arrivals` the plain way — finish each iteration at its end,
    /// start the next at once, submit each request at its time (an iteration ending at that
    /// very time first) — or, with `plan = Some(max)`, planning up to `max` decode steps ahead
    /// after every start ([`EmulatedReplica::extend_decode_run`]) and catching up at the times
    /// in `observe` as an observer would. Returns every event with its time's bits, the calls
    /// to `finish_iteration`, and the final telemetry.
    /// A replica's prefix-cache state: each block's hash and the free queue's order.
    type CacheState = (Vec<Option<u64>>, Vec<u32>);

    fn drive(mut r: EmulatedReplica, arrivals: &[Arrival], plan: Option<usize>, observe: &[f64]) -> (Vec<(u64, EngineEvent)>, u64, Telemetry, CacheState) {
        let mut log = Vec::new();
        let (mut next, mut next_obs) = (0, 0);
        let mut finishes = 0u64;
        let extend = |r: &mut EmulatedReplica| {
            if let Some(max) = plan
                && let Some(end) = r.extend_decode_run(max)
            {
                assert_eq!(r.iteration_end(), Some(end));
            }
        };
        loop {
            let arrival = arrivals.get(next).map(|a| a.0).unwrap_or(f64::INFINITY);
            let obs = observe.get(next_obs).copied().unwrap_or(f64::INFINITY);
            match r.iteration_end() {
                Some(end) if end <= arrival && end <= obs => {
                    let predicted_quiet = r.finish_is_quiet();
                    let events = r.finish_iteration(end);
                    finishes += 1;
                    if plan.is_none() {
                        assert_eq!(predicted_quiet, events.is_empty(), "finish_is_quiet at {end}: {events:?}");
                    }
                    log.extend(events.into_iter().map(|e| (end.to_bits(), e)));
                    if r.start_iteration(end).is_some() {
                        extend(&mut r);
                    }
                }
                _ if obs <= arrival && obs.is_finite() => {
                    next_obs += 1;
                    if plan.is_some() {
                        let before = r.telemetry().iterations;
                        let end = r.catch_up(obs);
                        assert_eq!(end, r.iteration_end());
                        assert!(end.is_none_or(|e| e > obs), "the step in progress at {obs} ends after it");
                        assert!(r.telemetry().iterations >= before);
                    }
                }
                _ if next < arrivals.len() => {
                    let (at, req) = arrivals[next].clone();
                    next += 1;
                    r.submit(req, at).unwrap();
                    if !r.in_iteration() && r.start_iteration(at).is_some() {
                        extend(&mut r);
                    }
                }
                _ => break,
            }
        }
        (log, finishes, r.telemetry(), r.pool.cache_state())
    }

    /// A request decoding alone needs one round trip for its whole decode, not one per token.
    #[test]
    fn a_lone_decode_is_planned_in_one_run() {
        let req = EngineRequest { id: 7, prompt_tokens: 300, prefix_hashes: Vec::new(), generated_hashes: Vec::new(), output_tokens: 2000 };
        let arrivals = [(0.0, req)];
        let (plain, plain_finishes, plain_t, _) = drive(awake_tiny(5, 8), &arrivals, None, &[]);
        let (planned, planned_finishes, planned_t, _) = drive(awake_tiny(5, 8), &arrivals, Some(100_000), &[]);
        assert_eq!(plain, planned);
        assert_eq!(plain_t, planned_t);
        assert_eq!(plain_finishes, 2000);
        // The prefill (first token), then one run from the second token's decode to the last.
        assert_eq!(planned_finishes, 2);
        assert_eq!(planned_t.iterations, 2000);
    }

    /// So is one whose output blocks are hashed (the simulator hashes every request's): the
    /// run registers each block its tokens fill, at the step stepping would.
    #[test]
    fn a_lone_decode_with_hashed_output_blocks_is_planned_in_one_run() {
        let generated_hashes: Vec<u64> = (300 / 16..2300 / 16).map(|b| 0xA5 << 32 | b).collect();
        let req = EngineRequest { id: 7, prompt_tokens: 300, prefix_hashes: (0..300 / 16).collect(), generated_hashes, output_tokens: 2000 };
        let arrivals = [(0.0, req)];
        let (plain, plain_finishes, plain_t, plain_cache) = drive(awake_tiny(5, 8), &arrivals, None, &[]);
        let (planned, planned_finishes, planned_t, planned_cache) = drive(awake_tiny(5, 8), &arrivals, Some(100_000), &[]);
        assert_eq!(plain, planned);
        assert_eq!(plain_t, planned_t);
        assert_eq!(plain_cache, planned_cache);
        assert_eq!(plain_cache.0.iter().filter(|h| h.is_some()).count(), 2300 / 16, "every full block registered");
        assert_eq!(plain_finishes, 2000);
        assert_eq!(planned_finishes, 2);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(80))]

        /// Planning decode steps ahead changes nothing: the same events at the same times (bit
        /// for bit) and the same counters as stepping, on both engines, with prefix sharing,
        /// KV pressure, preemptions, requests arriving mid-run, observers catching up and
        /// runs of any length.
        #[test]
        fn planned_decode_runs_are_exactly_stepping(
            reqs in prop::collection::vec((1u32..1500, 1u32..400, 0u8..3, 0.0f64..0.5), 1..24),
            observe in prop::collection::vec(0.0f64..30.0, 0..12),
            seed in any::<u64>(),
            max_num_seqs in 2u32..48,
            v0 in any::<bool>(),
            max_steps in prop::sample::select(vec![1usize, 3, 17, 1 << 20]),
            generated in any::<bool>(),
        ) {
            let make = || if v0 { awake_tiny_v0(seed, max_num_seqs) } else { awake_tiny(seed, max_num_seqs) };
            let mut at = 0.0;
            let arrivals: Vec<Arrival> = reqs
                .iter()
                .enumerate()
                .map(|(i, &(prompt, output, prefix, gap))| {
                    at += gap;
                    let hashes = (0..u64::from(prompt / 16)).map(|b| u64::from(prefix) << 32 | b).collect();
                    // Generated blocks hashed too: the simulator's chains are the request's own;
                    // every other request here shares its prefix family's, so registrations
                    // collide (the first holder wins) and their order within a step matters.
                    let owner = if i % 2 == 0 { 2000 + u64::from(prefix) } else { 1000 + i as u64 };
                    let generated_hashes = if generated {
                        (u64::from(prompt / 16)..u64::from((prompt + output) / 16)).map(|b| owner << 32 | b).collect()
                    } else {
                        Vec::new()
                    };
                    (at, EngineRequest { id: i as u64, prompt_tokens: prompt, prefix_hashes: hashes, generated_hashes, output_tokens: output })
                })
                .collect();
            let mut observe = observe;
            observe.sort_by(f64::total_cmp);
            let (plain_log, _, plain_t, plain_cache) = drive(make(), &arrivals, None, &[]);
            let (planned_log, _, planned_t, planned_cache) = drive(make(), &arrivals, Some(max_steps), &observe);
            prop_assert_eq!(&plain_log, &planned_log);
            prop_assert_eq!(plain_cache, planned_cache);
            prop_assert_eq!(plain_t.busy_seconds.to_bits(), planned_t.busy_seconds.to_bits());
            prop_assert_eq!(plain_t, planned_t);
            prop_assert_eq!(plain_log.iter().filter(|e| matches!(e.1, EngineEvent::Finished { .. })).count(), reqs.len());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        #[test]
        fn every_request_finishes_once_under_kv_pressure(
            reqs in prop::collection::vec((1u32..1800, 1u32..250, 0u8..4, 0u32..3), 1..28),
            seed in any::<u64>(),
            max_num_seqs in 2u32..64,
            v0 in any::<bool>(),
            state in prop::sample::select(vec![0u32, 100, 1000]),
        ) {
            let mut r = if v0 { awake_tiny_v0(seed, max_num_seqs) } else { awake_tiny(seed, max_num_seqs) };
            // A hybrid engine's per-request state too (checked by `check_invariants` at every step).
            r.set_request_state_tokens(state).unwrap();
            let total_blocks = r.memory_plan().kv_blocks;
            // Requests arrive in groups: `gap` iterations after the previous one.
            let mut now = 0.0;
            let mut pending: VecDeque<(EngineRequest, u32)> = reqs
                .iter()
                .enumerate()
                .map(|(i, &(prompt, output, prefix, gap))| {
                    // Prompts of the same `prefix` family share their leading blocks.
                    let blocks = (prompt / 16) as u64;
                    let hashes = (0..blocks).map(|b| u64::from(prefix) << 32 | b).collect();
                    (EngineRequest { id: i as u64, prompt_tokens: prompt, prefix_hashes: hashes, generated_hashes: Vec::new(), output_tokens: output }, gap)
                })
                .collect();
            let mut finished = std::collections::BTreeMap::new();
            let mut first = HashSet::new();
            let mut guard = 0;
            loop {
                while let Some((_, gap)) = pending.front() {
                    if *gap > 0 {
                        pending.front_mut().unwrap().1 -= 1;
                        break;
                    }
                    let (req, _) = pending.pop_front().unwrap();
                    r.submit(req, now).unwrap();
                }
                r.check_invariants();
                match r.start_iteration(now) {
                    Some(end) => {
                        prop_assert!(end > now);
                        r.check_invariants();
                        now = end;
                        for e in r.finish_iteration(now) {
                            match e {
                                EngineEvent::FirstToken { id, .. } => prop_assert!(first.insert(id), "two first tokens for {id}"),
                                EngineEvent::Finished { id, output_tokens, cached_prompt_tokens, prompt_tokens, .. } => {
                                    prop_assert!(first.contains(&id));
                                    prop_assert!(cached_prompt_tokens < prompt_tokens);
                                    prop_assert!(finished.insert(id, output_tokens).is_none(), "{id} finished twice");
                                }
                                EngineEvent::Preempted { id, .. } => prop_assert!(!finished.contains_key(&id)),
                            }
                        }
                        let t = r.telemetry();
                        prop_assert!(t.kv_blocks_in_use <= total_blocks);
                    }
                    None if pending.is_empty() => break,
                    None => {}
                }
                guard += 1;
                prop_assert!(guard < 200_000, "no progress");
            }
            prop_assert_eq!(finished.len(), reqs.len());
            for (i, &(_, output, _, _)) in reqs.iter().enumerate() {
                prop_assert_eq!(finished.get(&(i as u64)), Some(&output));
            }
            let t = r.telemetry();
            prop_assert_eq!(t.in_flight, 0);
            prop_assert_eq!(t.kv_blocks_in_use, 0);
            prop_assert_eq!(t.generated_tokens, reqs.iter().map(|r| u64::from(r.1)).sum::<u64>());
            prop_assert_eq!(t.finished_requests, reqs.len() as u64);
        }
    }

    fn plain(id: u64, prompt: u32, output: u32) -> EngineRequest {
        EngineRequest { id, prompt_tokens: prompt, prefix_hashes: Vec::new(), generated_hashes: Vec::new(), output_tokens: output }
    }

    /// vLLM's abort on a client disconnect: the request leaves the batch, frees its blocks
    /// and reports nothing more; the other request runs on to its end.
    #[test]
    fn an_aborted_request_leaves_the_batch_and_frees_its_blocks() {
        let mut r = awake_tiny(3, 8);
        r.submit(plain(1, 300, 50), 0.0).unwrap();
        r.submit(plain(2, 200, 20), 0.0).unwrap();
        let mut now = 0.0;
        for _ in 0..5 {
            let (end, _) = step(&mut r, now);
            now = end;
        }
        assert_eq!(r.telemetry().running, 2);
        let before = r.telemetry().kv_blocks_in_use;
        assert!(r.first_scheduled_at(1).is_some_and(|t| t == 0.0));
        assert_eq!(r.running_admissions().map(|(id, _)| id).collect::<Vec<_>>(), vec![1, 2]);
        // Mid-iteration: the step in progress keeps its end, request 1 takes no part in it.
        let end = r.start_iteration(now).unwrap();
        assert!(r.abort(1, now));
        r.check_invariants();
        let t = r.telemetry();
        assert_eq!((t.running, t.in_flight), (1, 1));
        assert!(t.kv_blocks_in_use < before);
        assert!(!r.abort(1, now), "not in flight any more");
        assert!(!r.abort(99, now));
        assert_eq!(r.first_scheduled_at(1), None);
        let mut events = r.finish_iteration(end);
        now = end;
        while let Some(end) = r.start_iteration(now) {
            events.extend(r.finish_iteration(end));
            now = end;
            r.check_invariants();
        }
        assert!(events.iter().all(|e| !matches!(e, EngineEvent::FirstToken { id: 1, .. } | EngineEvent::Finished { id: 1, .. })));
        assert!(events.iter().any(|e| matches!(e, EngineEvent::Finished { id: 2, output_tokens: 20, .. })));
        let t = r.telemetry();
        assert_eq!((t.in_flight, t.kv_blocks_in_use), (0, 0));
        // The id may be used again.
        r.submit(plain(1, 10, 1), now).unwrap();
    }

    #[test]
    fn aborting_a_waiting_request_or_inside_a_planned_decode_run() {
        let mut r = awake_tiny(5, 1);
        r.submit(plain(1, 100, 200), 0.0).unwrap();
        r.submit(plain(2, 100, 5), 0.0).unwrap();
        let (mut now, _) = step(&mut r, 0.0);
        assert_eq!(r.telemetry().waiting, 1);
        assert!(r.abort(2, now));
        assert_eq!(r.telemetry().waiting, 0);
        r.check_invariants();
        // A planned decode run is cut at the abort: the replica is as stepping leaves it.
        let end = r.start_iteration(now).unwrap();
        let planned = r.extend_decode_run(50).expect("a quiet decode run");
        assert!(planned > end);
        let mid = end + (planned - end) / 2.0;
        assert!(r.abort(1, mid));
        r.check_invariants();
        assert_eq!(r.telemetry().kv_blocks_in_use, 0);
        assert!(r.iteration_end().is_some_and(|e| e <= mid + 1.0));
        now = r.iteration_end().unwrap_or(now);
        assert!(r.finish_iteration(now).is_empty());
        assert_eq!(r.start_iteration(now), None);
    }
}
