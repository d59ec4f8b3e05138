//! Typed errors of the emulated replica: configuration and memory-plan refusals (the ones
//! vLLM raises at start-up), illegal lifecycle transitions and rejected requests.
//! Depends only on the replica's state type ([`crate::state`]).

use thiserror::Error;

use crate::state::ReplicaState;

/// Everything the emulator refuses, with enough context to say why.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum EmulatorError {
    /// A serving-configuration field is out of its domain.
    #[error("invalid serving configuration: {field} = {value}: {reason}")]
    InvalidConfig {
        field: &'static str,
        value: String,
        reason: &'static str,
    },

    /// The device cannot compute in the requested dtype (vLLM: "Bfloat16 is only supported on
    /// GPUs with compute capability of at least 8.0").
    #[error("{device} does not support {dtype}; serve it in fp16")]
    UnsupportedDtype { device: String, dtype: String },

    /// Weights plus engine overhead exceed the memory the replica may claim (vLLM: "No
    /// available memory for the cache blocks").
    #[error(
        "{model} on {device}: weights ({weight_bytes} B) + engine overhead ({overhead_bytes} B) \
         exceed gpu_memory_utilization x device memory ({budget_bytes} B): no available memory \
         for the cache blocks"
    )]
    InsufficientMemory {
        model: String,
        device: String,
        weight_bytes: u64,
        overhead_bytes: u64,
        budget_bytes: u64,
    },

    /// The KV cache cannot hold one `max_model_len` sequence (vLLM refuses to start).
    #[error(
        "{model} on {device}: the KV cache holds {kv_tokens} tokens, fewer than one \
         max_model_len = {max_model_len} sequence; lower max_model_len or raise \
         gpu_memory_utilization"
    )]
    KvCacheTooSmall {
        model: String,
        device: String,
        kv_tokens: u64,
        max_model_len: u32,
    },

    /// A lifecycle action or a request arrived in a state that does not allow it.
    #[error("cannot {action} while the replica is {state}")]
    IllegalTransition {
        action: &'static str,
        state: ReplicaState,
    },

    /// A lifecycle action needs an idle replica, but requests are still in flight.
    #[error("cannot {action}: {in_flight} request(s) in flight")]
    Busy {
        action: &'static str,
        in_flight: usize,
    },

    /// vLLM knows sleep levels 1 (offload weights) and 2 (discard weights).
    #[error("sleep level must be 1 or 2, got {0}")]
    InvalidSleepLevel(u8),

    /// A submitted request is malformed or cannot fit the deployment.
    #[error("request {id} rejected: {reason}")]
    InvalidRequest { id: u64, reason: String },

    /// A request with this id is already queued or running.
    #[error("request {0} is already in flight")]
    DuplicateRequest(u64),
}
