//! The replica's lifecycle state ([`ReplicaState`]: Cold → Loading → Awake ⇄ Sleeping →
//! Asleep → Waking → Awake; TearingDown → Cold), on its own so that the errors can name a
//! state without depending on the replica (`crate::replica` re-exports it). A leaf: depends on
//! nothing else in the crate.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The replica's lifecycle state. Transitional states carry their completion time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum ReplicaState {
    /// No engine process, no device memory.
    Cold,
    /// Reading weights and starting the engine.
    Loading { until: f64 },
    /// Serving.
    Awake,
    /// Entering sleep mode (offloading or discarding weights, freeing the KV cache).
    Sleeping { until: f64 },
    /// Process alive, weights off the device, KV cache freed.
    Asleep,
    /// Restoring weights and re-allocating the KV cache.
    Waking { until: f64 },
    /// The engine process is exiting; its device memory is released when it is gone.
    TearingDown { until: f64 },
}

impl fmt::Display for ReplicaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplicaState::Cold => write!(f, "cold"),
            ReplicaState::Loading { until } => write!(f, "loading (until {until:.3} s)"),
            ReplicaState::Awake => write!(f, "awake"),
            ReplicaState::Sleeping { until } => write!(f, "falling asleep (until {until:.3} s)"),
            ReplicaState::Asleep => write!(f, "asleep"),
            ReplicaState::Waking { until } => write!(f, "waking (until {until:.3} s)"),
            ReplicaState::TearingDown { until } => write!(f, "tearing down (until {until:.3} s)"),
        }
    }
}
