//! Durations of the replica's lifecycle transitions: a cold load (weights from storage plus
//! engine start-up), sleep (vLLM sleep mode level 1 offloads the weights to host memory,
//! level 2 discards them; both discard the KV cache) and wake (weights back over the host link,
//! or re-read from storage for level 2, without the process start-up).
//!
//! Depends only on the spec sheets. These are ground-truth constants of the emulated world;
//! the predictor must not read them.

use serde::{Deserialize, Serialize};
use switchyard_predictor::spec::{DeviceSpec, Dtype, ModelArch};

use crate::error::EmulatorError;

/// Sequential read bandwidth of the model store, bytes/s: an NVMe-class local disk (PCIe 3.0
/// ×4 SSDs read ~2–3.5 GB/s). Assumed 2 GB/s; a hot page cache is faster, a network store
/// slower. Weights stream storage → host → device, so the slower of this and the host link
/// bounds a load.
pub const STORAGE_READ_BANDWIDTH: f64 = 2e9;

/// Engine start-up besides reading weights, seconds: process start and imports (~5 s),
/// `torch.compile` with a warm compile cache (~7 s: vLLM issue #20264 reports 7.5 s, PR #17122
/// 6.4 s of Dynamo transform), the memory-profiling run and KV allocation (~1 s) and CUDA-graph
/// capture (~7 s: 14 s for 35 V0 shapes in PR #11349, 17 s in #20264). Field anchors §1.6 put
/// whole cold starts at 35 s – 5 min; with weights this gives 25–45 s for 0.6B–32B models,
/// the warm-cache end of that range.
pub const ENGINE_STARTUP_S: f64 = 20.0;

/// Fixed part of entering sleep (stop scheduling, free the KV cache, allocator bookkeeping).
/// Assumed 0.2 s.
pub const SLEEP_FIXED_S: f64 = 0.2;

/// Fixed part of waking (re-map memory, re-allocate the KV cache, a one-token warm-up). The
/// vLLM blog draft of 2025-10-03 (field anchors §1.1) reports wake at ~0.1–0.4 s plus a
/// 1-token warm-up; assumed 0.5 s.
pub const WAKE_FIXED_S: f64 = 0.5;

/// vLLM sleep-mode level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SleepLevel {
    /// Level 1: weights offloaded to host memory, KV cache discarded.
    OffloadWeights,
    /// Level 2: weights and KV cache discarded.
    DiscardWeights,
}

impl TryFrom<u8> for SleepLevel {
    type Error = EmulatorError;

    fn try_from(level: u8) -> Result<Self, Self::Error> {
        match level {
            1 => Ok(SleepLevel::OffloadWeights),
            2 => Ok(SleepLevel::DiscardWeights),
            other => Err(EmulatorError::InvalidSleepLevel(other)),
        }
    }
}

/// Seconds to read the weights from storage onto the device.
fn weights_from_storage(device: &DeviceSpec, weight_bytes: f64) -> f64 {
    weight_bytes / STORAGE_READ_BANDWIDTH.min(device.host_link_bandwidth)
}

/// Seconds of a cold load: weight bytes over `min(storage, host link)` plus engine start-up.
pub fn load_time(device: &DeviceSpec, model: &ModelArch, dtype: Dtype) -> f64 {
    weights_from_storage(device, model.param_bytes(dtype) as f64) + ENGINE_STARTUP_S
}

/// Seconds to enter sleep: level 1 copies the weights to host memory over the host link.
pub fn sleep_time(device: &DeviceSpec, model: &ModelArch, dtype: Dtype, level: SleepLevel) -> f64 {
    match level {
        SleepLevel::OffloadWeights => {
            model.param_bytes(dtype) as f64 / device.host_link_bandwidth + SLEEP_FIXED_S
        }
        SleepLevel::DiscardWeights => SLEEP_FIXED_S,
    }
}

/// Seconds to wake: weights back over the host link (level 1) or re-read from storage
/// (level 2), plus the fixed wake cost; no process start-up either way.
pub fn wake_time(device: &DeviceSpec, model: &ModelArch, dtype: Dtype, level: SleepLevel) -> f64 {
    let bytes = model.param_bytes(dtype) as f64;
    let transfer = match level {
        SleepLevel::OffloadWeights => bytes / device.host_link_bandwidth,
        SleepLevel::DiscardWeights => weights_from_storage(device, bytes),
    };
    transfer + WAKE_FIXED_S
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_predictor::spec::{device, model};

    #[test]
    fn load_time_by_hand() {
        // Qwen3-8B bf16 on an A100-40GB: 2 × param_count bytes over min(2 GB/s, 32 GB/s).
        let m = model("Qwen3-8B").unwrap();
        let d = device("A100-40GB").unwrap();
        let bytes = m.param_count() as f64 * 2.0;
        assert!((load_time(&d, &m, Dtype::Bf16) - (bytes / 2e9 + 20.0)).abs() < 1e-9);
        // ~16.4 GB → ~28.2 s.
        assert!((28.0..28.5).contains(&load_time(&d, &m, Dtype::Bf16)));
    }

    #[test]
    fn sleep_and_wake_by_hand() {
        let m = model("Qwen3-8B").unwrap();
        let d = device("A100-40GB").unwrap();
        let bytes = m.param_count() as f64 * 2.0;
        let l1 = SleepLevel::OffloadWeights;
        let l2 = SleepLevel::DiscardWeights;
        assert!((sleep_time(&d, &m, Dtype::Bf16, l1) - (bytes / 32e9 + 0.2)).abs() < 1e-9);
        assert_eq!(sleep_time(&d, &m, Dtype::Bf16, l2), 0.2);
        assert!((wake_time(&d, &m, Dtype::Bf16, l1) - (bytes / 32e9 + 0.5)).abs() < 1e-9);
        assert!((wake_time(&d, &m, Dtype::Bf16, l2) - (bytes / 2e9 + 0.5)).abs() < 1e-9);
    }

    #[test]
    fn waking_beats_reloading_by_the_reported_margin() {
        // vLLM blog (anchors §0.2): sleep/wake is 18–200× faster than a reload.
        for name in ["Qwen3-0.6B", "Qwen3-8B", "Qwen3-32B"] {
            let m = model(name).unwrap();
            let d = device("H100-80GB").unwrap();
            let ratio = load_time(&d, &m, Dtype::Bf16)
                / wake_time(&d, &m, Dtype::Bf16, SleepLevel::OffloadWeights);
            assert!(ratio > 10.0, "{name}: {ratio}");
            assert!(
                wake_time(&d, &m, Dtype::Bf16, SleepLevel::DiscardWeights)
                    < load_time(&d, &m, Dtype::Bf16)
            );
        }
    }

    #[test]
    fn sleep_levels_parse() {
        assert_eq!(SleepLevel::try_from(1).unwrap(), SleepLevel::OffloadWeights);
        assert_eq!(SleepLevel::try_from(2).unwrap(), SleepLevel::DiscardWeights);
        assert_eq!(
            SleepLevel::try_from(3).unwrap_err(),
            EmulatorError::InvalidSleepLevel(3)
        );
    }
}
