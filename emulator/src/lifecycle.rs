//! Durations of the replica's lifecycle transitions: a cold load (weights from the node's page
//! cache or from disk, plus engine start-up), teardown (the engine process exits and frees the
//! device), sleep (vLLM sleep mode level 1 offloads the
//! weights to host memory, level 2 discards them; both discard the KV cache) and wake (weights
//! back over the host link, or re-read for level 2, without the process start-up).
//!
//! Every constant is taken from a published vLLM measurement or a datasheet (cited at each;
//! `emulator/CALIBRATION.md` lists them with the comparison the tests make). The reference
//! engine is paper 003's vLLM 0.10.2: the V1 engine on compute capability ≥ 8.0 (A100, A40, L4,
//! H100, H200), the V0 engine on Volta (V100), which vLLM ≤ 0.10 selects below 8.0
//! (`_is_v1_supported_oracle`).
//!
//! A tensor-parallel replica's GPUs move their weight shards in parallel, each process over
//! its own GPU's host link, so its durations are those of one GPU's shard (the `*_of`
//! functions take the weight bytes per GPU; the others a whole model on one GPU). The start-up
//! is the single-GPU one. From disk this assumes the node's storage serves the shards' readers
//! at the per-reader bandwidth (optimistic for one NVMe disk read by several GPUs).
//!
//! Depends on the spec sheets and, in the crate, on `error` alone. These are ground-truth constants of the emulated world;
//! the predictor must not read them.

use serde::{Deserialize, Serialize};
use switchyard_predictor::spec::{DeviceSpec, Dtype, ModelArch};

use crate::error::EmulatorError;

/// Sequential read bandwidth of the model store when the weights are not in the node's page
/// cache, bytes/s: an NVMe-class local disk (PCIe 3.0 ×4 SSDs read ~2–3.5 GB/s; the low end
/// assumed). A network store is slower.
pub const DISK_READ_BANDWIDTH: f64 = 2e9;

/// Weight reads from a warm page cache, bytes/s: 3.5–5 GB/s measured for safetensors loads in
/// vLLM (field anchors §9; vllm#20264 reads 3.4 GiB in 0.69 s ≈ 5.3 GB/s). Midpoint 4.25 GB/s.
pub const PAGE_CACHE_READ_BANDWIDTH: f64 = 4.25e9;

/// Start-up of a V1 engine besides reading the weights, seconds, until it serves: the vLLM
/// sleep-mode blog (2025-10-26, vLLM 0.11) measured Qwen3-0.6B cold starts of 36–39 s on an
/// A100, whose weights (1.2 GB) read in ~0.3 s from the page cache; vllm#20264 itemises 34 s
/// of engine initialisation (7.5 s cached `torch.compile`, 17 s CUDA-graph capture) after the
/// API server's own start. 37.0 s puts Qwen3-0.6B on an A100 at 37.3 s, inside the blog's band.
pub const V1_ENGINE_STARTUP_S: f64 = 37.0;

/// `torch.compile` of the V1 engine with a warm compile cache, seconds (vllm#20264: 7.5 s).
/// The V0 engine does not compile.
pub const V1_TORCH_COMPILE_S: f64 = 7.5;

/// CUDA-graph capture, V1 (~67 batch sizes) versus V0 (35 sizes), seconds: 17 s in vllm#20264
/// (V1) and 14 s for 35 V0 shapes in vllm PR #11349.
pub const V1_GRAPH_CAPTURE_S: f64 = 17.0;
pub const V0_GRAPH_CAPTURE_S: f64 = 14.0;

/// Fixed part of entering sleep (stop scheduling, free the KV cache, allocator bookkeeping).
/// Assumed 0.2 s (no published figure; the blog reports sleep as 18–200× faster than a reload).
pub const SLEEP_FIXED_S: f64 = 0.2;

/// Fixed part of a level-1 wake (re-map memory, re-allocate the KV cache), seconds: the blog
/// measured 0.25–0.28 s for Qwen3-0.6B on an A100, of which ~0.05 s is the 1.2 GB copy.
pub const WAKE_FIXED_S: f64 = 0.2;

/// Fixed part of a level-2 wake (`wake_up?tags=weights`, `collective_rpc reload_weights`,
/// `wake_up?tags=kv_cache`), seconds: the blog measured 0.78–0.91 s for Qwen3-0.6B on an A100,
/// of which ~0.28 s is re-reading 1.2 GB from the page cache.
pub const WAKE_L2_FIXED_S: f64 = 0.55;

/// Share of the host link's nominal bandwidth a pinned weight copy achieves: fitted to the
/// blog's level-1 wakes (0.82 s for an 8 GB model, 2.87 s for 61 GB, on PCIe 4.0 hosts):
/// 0.7 gives 0.56 s and 2.92 s (−32 %, +2 %).
pub const HOST_LINK_EFFICIENCY: f64 = 0.7;

/// Seconds from an unload request until the device memory is free: the API server asks the
/// engine-core process to exit (it stops its busy loop, frees the KV cache and the weights,
/// destroys the CUDA context) and waits for it. Assumed 5.0 s: vLLM's own bound on that wait —
/// the API server gives the engine core a fixed 5-second shutdown timeout before terminating it
/// (vllm#31252, vLLM 0.13), and the one published timing, with a KV connector's cleanup
/// added, is 6.5 s there. No measurement without a connector is published; the planner does
/// not read this constant.
pub const ENGINE_TEARDOWN_S: f64 = 5.0;

/// Seconds to tear a replica down and release its device memory.
pub fn teardown_time() -> f64 {
    ENGINE_TEARDOWN_S
}

/// Which vLLM engine serves on a device (paper 003's vLLM 0.10.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EngineGeneration {
    /// Compute capability ≥ 8.0: FlashAttention, prefix caching and chunked prefill on.
    V1,
    /// Volta (compute capability 7.0): the V0 engine, prefix caching off by default, chunked
    /// prefill off for contexts ≤ 32k.
    V0,
}

impl EngineGeneration {
    /// The engine vLLM 0.10 runs on `device`. Every catalogue GPU without bf16 is Volta.
    pub fn on(device: &DeviceSpec) -> EngineGeneration {
        if device.supports_bf16 { EngineGeneration::V1 } else { EngineGeneration::V0 }
    }

    /// Start-up besides the weight read, seconds.
    pub fn startup_s(self) -> f64 {
        match self {
            EngineGeneration::V1 => V1_ENGINE_STARTUP_S,
            EngineGeneration::V0 => V1_ENGINE_STARTUP_S - V1_TORCH_COMPILE_S - (V1_GRAPH_CAPTURE_S - V0_GRAPH_CAPTURE_S),
        }
    }
}

/// Where a load reads the weights from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WeightSource {
    /// The node read this model recently: its files are in the page cache.
    PageCache,
    /// First read on this node: from disk.
    Disk,
}

impl WeightSource {
    fn bandwidth(self) -> f64 {
        match self {
            WeightSource::PageCache => PAGE_CACHE_READ_BANDWIDTH,
            WeightSource::Disk => DISK_READ_BANDWIDTH,
        }
    }
}

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

/// The host link a pinned weight copy really achieves, bytes/s.
fn host_copy_bandwidth(device: &DeviceSpec) -> f64 {
    device.host_link_bandwidth * HOST_LINK_EFFICIENCY
}

/// Seconds to read the weights from `source` onto the device (the slower of the read and the
/// host link bounds it).
fn weights_from(device: &DeviceSpec, weight_bytes: f64, source: WeightSource) -> f64 {
    weight_bytes / source.bandwidth().min(host_copy_bandwidth(device))
}

/// Seconds of a cold load from `source`: the weight read plus the engine's start-up.
pub fn load_time_from(device: &DeviceSpec, model: &ModelArch, dtype: Dtype, source: WeightSource) -> f64 {
    load_time_of(device, model.param_bytes(dtype), source)
}

/// Seconds of a cold load from `source` of a replica whose GPUs each hold `weight_bytes`
/// (`MemoryPlan::weight_bytes`: the whole model on one GPU, a shard under tensor
/// parallelism, read by the GPUs in parallel), plus the engine's start-up.
pub fn load_time_of(device: &DeviceSpec, weight_bytes: u64, source: WeightSource) -> f64 {
    weights_from(device, weight_bytes as f64, source) + EngineGeneration::on(device).startup_s()
}

/// Seconds of a cold load with the weights in the page cache (the usual case once a model has
/// been read on the node).
pub fn load_time(device: &DeviceSpec, model: &ModelArch, dtype: Dtype) -> f64 {
    load_time_from(device, model, dtype, WeightSource::PageCache)
}

/// Seconds to enter sleep: level 1 copies the weights to host memory over the host link.
pub fn sleep_time(device: &DeviceSpec, model: &ModelArch, dtype: Dtype, level: SleepLevel) -> f64 {
    sleep_time_of(device, model.param_bytes(dtype), level)
}

/// [`sleep_time`] of a replica whose GPUs each hold `weight_bytes` (offloaded in parallel).
pub fn sleep_time_of(device: &DeviceSpec, weight_bytes: u64, level: SleepLevel) -> f64 {
    match level {
        SleepLevel::OffloadWeights => weight_bytes as f64 / host_copy_bandwidth(device) + SLEEP_FIXED_S,
        SleepLevel::DiscardWeights => SLEEP_FIXED_S,
    }
}

/// Seconds to wake: weights back over the host link (level 1) or re-read from the page cache
/// (level 2), plus the fixed wake cost; no process start-up either way.
pub fn wake_time(device: &DeviceSpec, model: &ModelArch, dtype: Dtype, level: SleepLevel) -> f64 {
    wake_time_of(device, model.param_bytes(dtype), level)
}

/// [`wake_time`] of a replica whose GPUs each hold `weight_bytes` (restored in parallel).
pub fn wake_time_of(device: &DeviceSpec, weight_bytes: u64, level: SleepLevel) -> f64 {
    let bytes = weight_bytes as f64;
    match level {
        SleepLevel::OffloadWeights => bytes / host_copy_bandwidth(device) + WAKE_FIXED_S,
        SleepLevel::DiscardWeights => weights_from(device, bytes, WeightSource::PageCache) + WAKE_L2_FIXED_S,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_predictor::spec::{device, model};

    /// The published measurements each constant comes from, as bands the emulator must land in.
    #[test]
    fn cold_starts_match_the_published_measurements() {
        let a100 = device("A100-40GB").unwrap();
        let small = model("Qwen3-0.6B").unwrap();
        // vLLM sleep-mode blog (2025-10-26): Qwen3-0.6B cold start 36–39 s on an A100.
        let t = load_time(&a100, &small, Dtype::Bf16);
        assert!((36.0..=39.0).contains(&t), "{t}");
        // From disk the same load is slower by the read-bandwidth ratio only.
        let bytes = small.param_bytes(Dtype::Bf16) as f64;
        let disk = load_time_from(&a100, &small, Dtype::Bf16, WeightSource::Disk);
        assert!((disk - t - (bytes / 2e9 - bytes / 4.25e9)).abs() < 1e-9);
        // vllm#20264: a 3.4 GiB model's weights read in 0.69 s from the page cache (±25 %).
        let read = 3.4 * (1u64 << 30) as f64 / PAGE_CACHE_READ_BANDWIDTH;
        assert!((read - 0.69).abs() / 0.69 < 0.25, "{read}");
        // The V0 engine (V100) neither compiles nor captures as many graphs.
        let v100 = device("V100-32GB").unwrap();
        assert_eq!(EngineGeneration::on(&v100), EngineGeneration::V0);
        assert_eq!(EngineGeneration::on(&a100), EngineGeneration::V1);
        assert!((EngineGeneration::V0.startup_s() - 26.5).abs() < 1e-9);
    }

    #[test]
    fn wakes_match_the_published_measurements() {
        let a100 = device("A100-40GB").unwrap();
        let small = model("Qwen3-0.6B").unwrap();
        let l1 = wake_time(&a100, &small, Dtype::Bf16, SleepLevel::OffloadWeights);
        // Blog: level-1 wake 0.25–0.28 s, level-2 0.78–0.91 s for Qwen3-0.6B on an A100.
        assert!((0.22..=0.30).contains(&l1), "{l1}");
        let l2 = wake_time(&a100, &small, Dtype::Bf16, SleepLevel::DiscardWeights);
        assert!((0.78..=0.91).contains(&l2), "{l2}");
        // Blog: 0.82 s for an 8 GB model and 2.87 s for 61 GB (A100-class PCIe 4.0 hosts); the
        // fit is within 35 %.
        let eight = 8e9 / (a100.host_link_bandwidth * HOST_LINK_EFFICIENCY) + WAKE_FIXED_S;
        let sixty_one = 61e9 / (a100.host_link_bandwidth * HOST_LINK_EFFICIENCY) + WAKE_FIXED_S;
        assert!((eight - 0.82).abs() / 0.82 < 0.35, "{eight}");
        assert!((sixty_one - 2.87).abs() / 2.87 < 0.35, "{sixty_one}");
    }

    #[test]
    fn sleep_by_hand() {
        let m = model("Qwen3-8B").unwrap();
        let d = device("A100-40GB").unwrap();
        let bytes = m.param_count() as f64 * 2.0;
        assert!((sleep_time(&d, &m, Dtype::Bf16, SleepLevel::OffloadWeights) - (bytes / (32e9 * 0.7) + 0.2)).abs() < 1e-9);
        assert_eq!(sleep_time(&d, &m, Dtype::Bf16, SleepLevel::DiscardWeights), 0.2);
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

    /// The byte-based durations of tensor-parallel replicas: a whole model's bytes give the
    /// single-GPU durations to the bit, a shard's less.
    #[test]
    fn durations_of_a_shard() {
        let d = device("H100-80GB").unwrap();
        let m = model("Qwen3-32B").unwrap();
        let bytes = m.param_bytes(Dtype::Bf16);
        for source in [WeightSource::PageCache, WeightSource::Disk] {
            assert_eq!(
                load_time_of(&d, bytes, source).to_bits(),
                load_time_from(&d, &m, Dtype::Bf16, source).to_bits()
            );
            assert!(load_time_of(&d, bytes / 2, source) < load_time_from(&d, &m, Dtype::Bf16, source));
        }
        for level in [SleepLevel::OffloadWeights, SleepLevel::DiscardWeights] {
            assert_eq!(sleep_time_of(&d, bytes, level).to_bits(), sleep_time(&d, &m, Dtype::Bf16, level).to_bits());
            assert_eq!(wake_time_of(&d, bytes, level).to_bits(), wake_time(&d, &m, Dtype::Bf16, level).to_bits());
        }
        // Each GPU reads its half from the page cache: 32.8 GB at 4.25 GB/s + 37 s of start-up.
        let half = load_time_of(&d, bytes / 2, WeightSource::PageCache);
        assert!((half - (bytes as f64 / 2.0 / 4.25e9 + 37.0)).abs() < 1e-6, "{half}");
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
