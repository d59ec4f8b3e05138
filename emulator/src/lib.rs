//! switchyard-emulator: the emulated GPU replica — a vLLM-like engine serving one deployment
//! on one GPU, or tensor-parallel on several GPUs of one node. It is the embedded default
//! engine and the *ground truth* of the simulator.
//!
//! Module map:
//! - [`cost`] — the time of one continuous-batching iteration on a device (per-operator
//!   rooflines calibrated against Vidur's measured A100 / H100 profiles, see `CALIBRATION.md`;
//!   under tensor parallelism one GPU's shard plus the measured all-reduces), and
//!   [`IterationCost`], the same with its per-batch-size terms memoised (same bits).
//! - [`memory`] — the replica's memory plan: weights + engine overhead + KV-cache blocks,
//!   sized the way vLLM's start-up profile run sizes them (per GPU of a tensor-parallel replica).
//! - [`lifecycle`] — load, sleep and wake durations (storage, host link, engine start-up).
//! - [`kv`] — the paged KV-cache block pool with hash-identified prefix caching and LRU eviction.
//! - [`replica`] — the replica state machine (Cold → Loading → Awake ⇄ Asleep) and its FCFS
//!   continuous-batching scheduler: vLLM V1's (chunked prefill, prefix caching of prompt and
//!   generated blocks, recompute preemption) or, without chunked prefill, V0's prefill-first
//!   `_schedule_default` (the engine vLLM 0.10 runs on Volta); decode runs planned ahead while
//!   the batch does not change (`extend_decode_run`), exactly equal to stepping.
//! - [`state`] — the replica's lifecycle state (a leaf; [`replica`] re-exports it).
//! - [`error`] — the typed errors.
//!
//! Dependencies: only the `spec` module of `switchyard-predictor` (model architectures, device
//! datasheets, dtypes). It must NOT use any estimator of the predictor — prediction error has
//! to be real — and nothing else in the workspace may read its cost constants for planning.
//! No I/O and no clock: time is an `f64` of seconds passed in by the caller, and every random
//! draw comes from a ChaCha8 stream seeded by the caller.

pub mod cost;
pub mod error;
pub mod kv;
pub mod lifecycle;
pub mod memory;
pub mod replica;
pub mod state;

pub use cost::{
    AllReduce, AttentionKernel, BatchShape, BatchSummary, CostModel, IterationCost, ModelShape, PrefillChunk,
    iteration_time,
};
pub use error::EmulatorError;
pub use lifecycle::{
    EngineGeneration, SleepLevel, WeightSource, load_time, load_time_from, load_time_of, sleep_time, sleep_time_of,
    teardown_time, wake_time, wake_time_of,
};
pub use memory::{MAX_TENSOR_PARALLEL, MemoryPlan, MemoryRequirement, ServingConfig, weight_bytes_per_gpu};
pub use replica::{EmulatedReplica, EngineEvent, EngineRequest, Telemetry};
pub use state::ReplicaState;
pub use switchyard_predictor::spec::{DeviceSpec, Dtype, ModelArch};
