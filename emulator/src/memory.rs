//! The serving configuration of a deployment and the memory plan of its replica: weights +
//! engine overhead + KV cache, the rest of `gpu_memory_utilization × device memory`, in blocks
//! of `block_size` tokens — the way vLLM 0.10 sizes its KV cache after its start-up profile run
//! (V1 `vllm/v1/worker/gpu_worker.py` `determine_available_memory`, V0
//! `vllm/worker/worker.py` `determine_num_available_blocks`, both through
//! `vllm.utils.memory_profiling`):
//!
//! `kv = gpu_memory_utilization × total − (weights + torch peak increase of the profile run +
//! non-torch increase since the worker's start-up snapshot)`.
//!
//! Two things the engine holds are *not* subtracted there. The CUDA context exists before the
//! start-up snapshot (`init_device` takes it after `set_device`), so it is outside the
//! baseline the increases are measured from; and the CUDA graphs are captured in
//! `compile_or_warm_up_model`, after `initialize_from_config` allocated the KV cache, so
//! `memory_profiling` "does not consider CUDAGraph memory size" (vLLM's own comment, which
//! suggests `--kv-cache-memory` to fit them). Both live in the `1 − gpu_memory_utilization`
//! headroom: [`MemoryPlan::outside_budget_bytes`].
//!
//! A tensor-parallel replica (`ServingConfig::tensor_parallel` = t GPUs of one node) runs this
//! rule on each of its GPUs, which are alike: each holds its shard of the weights
//! ([`weight_bytes_per_gpu`]) and `num_kv_heads / t` KV heads of every block, so the engine's
//! logical blocks (what the scheduler allocates) span all t GPUs and number
//! `per-GPU KV memory / per-GPU block bytes`. Every byte figure of the plan is per GPU;
//! [`MemoryPlan::gpus`] says how many GPUs hold it.
//!
//! Depends on the spec sheets and, in the crate, on `error` and `lifecycle` (the engine
//! generation behind vLLM's per-GPU defaults). The constants below are assumptions with sources; the
//! predictor must not read them.

use serde::{Deserialize, Serialize};
use switchyard_predictor::spec::{DeviceSpec, Dtype, ModelArch};

use crate::error::EmulatorError;

const MIB: u64 = 1 << 20;

/// The CUDA context and NCCL buffers of an engine process. Field anchors §1.1: `/sleep` frees
/// neither, "a few hundred MiB per process per GPU". Assumed 512 MiB.
pub(crate) const CUDA_CONTEXT_BYTES: u64 = 512 * MIB;

/// Memory the start-up profile run sees outside PyTorch's allocator (cuBLAS / attention
/// workspaces). vLLM logs report 0.16 GiB (PR #12126, H100), 0.20 GiB (PR #14447), 0.33 GiB
/// (issue #14452) and 1.79 GiB (PR #10511, older accounting). Assumed 256 MiB.
pub(crate) const NON_TORCH_BYTES: u64 = 256 * MIB;

/// Memory of the captured CUDA graphs (vLLM V1 captures ~67 batch sizes). Logs report
/// 0.21 GiB for 35 V0 shapes (PR #11349) and 0.36 GiB estimated (vLLM 0.27 log in
/// gpustack/runner PR #251). Assumed 512 MiB. Captured after the KV cache is allocated, so it
/// is not part of the KV budget (see the module doc).
pub(crate) const CUDA_GRAPH_BYTES: u64 = 512 * MIB;

/// The sampler's profile run materialises fp32 logits for `max_num_seqs` sequences and about
/// two more tensors of the same size (probabilities, log-probabilities). Assumed factor 3.
const SAMPLER_TENSORS: u64 = 3;

/// The most GPUs a tensor-parallel replica spans: one node's (DGX A100 / H100: 8).
pub const MAX_TENSOR_PARALLEL: u32 = 8;

fn one() -> u32 {
    1
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

/// The configuration a deployment is served with (the vLLM flags that shape cost and memory).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServingConfig {
    pub dtype: Dtype,
    pub max_model_len: u32,
    pub gpu_memory_utilization: f64,
    pub max_num_seqs: u32,
    pub max_num_batched_tokens: u32,
    pub block_size: u32,
    pub enable_prefix_caching: bool,
    /// Chunked prefill (vLLM V1 always; V0 only beyond 32k contexts). Off, the scheduler runs
    /// V0's `_schedule_default`: whole prefills first, a prefill step holds no decode.
    #[serde(default = "chunked_by_default")]
    pub enable_chunked_prefill: bool,
    /// `--tensor-parallel-size`: the replica spans this many identical GPUs of one node (a
    /// power of two up to [`MAX_TENSOR_PARALLEL`] dividing the model's attention and KV heads).
    /// 1 when absent, and not written when 1, so configurations without it read and write as
    /// before.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub tensor_parallel: u32,
    /// `--kv-cache-dtype`: the KV cache's format when it differs from the weights' (`None`:
    /// the weights' format; not written then). vLLM's `auto` keeps an FP8 checkpoint's cache
    /// in its 16-bit activation dtype: `Some(Bf16)` with `dtype: Fp8`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_dtype: Option<Dtype>,
}

fn chunked_by_default() -> bool {
    true
}

impl ServingConfig {
    /// vLLM 0.10 defaults for online serving: 256 sequences, 8,192 batched tokens with chunked
    /// prefill, blocks of 16 tokens, prefix caching on, 90 % of device memory.
    pub fn vllm_defaults(dtype: Dtype, max_model_len: u32) -> Self {
        ServingConfig {
            dtype,
            max_model_len,
            gpu_memory_utilization: 0.9,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            block_size: 16,
            enable_prefix_caching: true,
            enable_chunked_prefill: true,
            tensor_parallel: 1,
            kv_cache_dtype: None,
        }
    }

    /// The KV cache's format ([`ServingConfig::kv_cache_dtype`], else the weights').
    pub fn kv_dtype(&self) -> Dtype {
        self.kv_cache_dtype.unwrap_or(self.dtype)
    }

    /// vLLM 0.10.2's defaults for `vllm serve` on `device` (field anchors §9; vLLM's
    /// `EngineArgs` usage-context defaults): the V1 engine batches 2,048 tokens and 256
    /// sequences per step on A100 / A40 / L4-class GPUs and 8,192 / 1,024 only on non-A100 GPUs
    /// with at least 70 GiB; the V0 engine (Volta) runs without chunked prefill for contexts up
    /// to 32k — its step budget is then `max(max_model_len, 2048)` — and with prefix caching
    /// off. The caller may still override `max_num_seqs` (`--max-num-seqs`).
    pub fn vllm_defaults_on(device: &DeviceSpec, dtype: Dtype, max_model_len: u32) -> Self {
        let mut c = Self::vllm_defaults(dtype, max_model_len);
        match crate::lifecycle::EngineGeneration::on(device) {
            crate::lifecycle::EngineGeneration::V0 => {
                c.enable_chunked_prefill = max_model_len > 32_768;
                c.max_num_batched_tokens = if c.enable_chunked_prefill { 2048 } else { max_model_len.max(2048) };
                c.enable_prefix_caching = false;
            }
            crate::lifecycle::EngineGeneration::V1 => {
                let big = device.memory_bytes >= 70 * (1 << 30) && !device.name.starts_with("A100");
                c.max_num_batched_tokens = if big { 8192 } else { 2048 };
                c.max_num_seqs = if big { 1024 } else { 256 };
            }
        }
        c
    }

    /// The checks vLLM makes on these flags at start-up.
    pub fn validate(&self, device: &DeviceSpec, model: &ModelArch) -> Result<(), EmulatorError> {
        let bad = |field, value: String, reason| {
            Err(EmulatorError::InvalidConfig {
                field,
                value,
                reason,
            })
        };
        let u = self.gpu_memory_utilization;
        if !(u > 0.0 && u <= 1.0) {
            return bad("gpu_memory_utilization", u.to_string(), "must be in (0, 1]");
        }
        if self.block_size == 0 {
            return bad("block_size", "0".into(), "must be positive");
        }
        if self.max_num_seqs == 0 {
            return bad("max_num_seqs", "0".into(), "must be positive");
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return bad(
                "max_num_batched_tokens",
                self.max_num_batched_tokens.to_string(),
                "must be at least max_num_seqs",
            );
        }
        if self.max_model_len == 0 {
            return bad("max_model_len", "0".into(), "must be positive");
        }
        if !self.enable_chunked_prefill && self.max_num_batched_tokens < self.max_model_len {
            // vLLM: "max_num_batched_tokens ... is smaller than max_model_len ... Please
            // increase max_num_batched_tokens or decrease max_model_len" (SchedulerConfig).
            return bad(
                "max_num_batched_tokens",
                self.max_num_batched_tokens.to_string(),
                "must be at least max_model_len without chunked prefill",
            );
        }
        if self.kv_cache_dtype == Some(Dtype::Fp32) {
            return bad("kv_cache_dtype", "fp32".into(), "vLLM keeps the KV cache in 16 or 8 bits");
        }
        if model.linear_attention.is_some() && self.tensor_parallel > 1 {
            return bad(
                "tensor_parallel",
                self.tensor_parallel.to_string(),
                "tensor parallelism of a hybrid (linear-attention) model is not modelled",
            );
        }
        if u64::from(self.max_model_len) > model.max_position_embeddings {
            return bad(
                "max_model_len",
                self.max_model_len.to_string(),
                "exceeds the model's max_position_embeddings",
            );
        }
        let tp = self.tensor_parallel;
        if tp == 0 || !tp.is_power_of_two() || tp > MAX_TENSOR_PARALLEL {
            return bad("tensor_parallel", tp.to_string(), "must be 1, 2, 4 or 8 (GPUs of one node)");
        }
        let t = u64::from(tp);
        if !model.num_attention_heads.is_multiple_of(t) || !model.num_key_value_heads.is_multiple_of(t) {
            // vLLM: "Total number of attention heads must be divisible by tensor parallel
            // size"; with fewer KV heads than GPUs it would replicate them, not modelled here.
            return bad("tensor_parallel", tp.to_string(), "must divide the model's attention heads and KV heads");
        }
        if (self.dtype == Dtype::Bf16 || self.kv_cache_dtype == Some(Dtype::Bf16)) && !device.supports_bf16 {
            return Err(EmulatorError::UnsupportedDtype {
                device: device.name.clone(),
                dtype: "bf16".into(),
            });
        }
        Ok(())
    }
}

/// Where a replica's device memory goes, on each of its GPUs (one unless tensor parallel).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryPlan {
    /// `gpu_memory_utilization × device memory`: what the replica may claim on each GPU.
    pub budget_bytes: u64,
    /// The weights on each GPU: `ModelArch::param_bytes(dtype)` on one GPU, the shard
    /// ([`weight_bytes_per_gpu`]) under tensor parallelism.
    pub weight_bytes: u64,
    /// What vLLM subtracts from the budget besides the weights: non-torch memory + activation
    /// peak of the profile run.
    pub overhead_bytes: u64,
    /// The activation peak part of `overhead_bytes`.
    pub activation_peak_bytes: u64,
    /// The KV cache actually allocated on each GPU (`kv_blocks × kv_block_bytes`).
    pub kv_bytes: u64,
    /// The engine's blocks: logical blocks spanning all of the replica's GPUs.
    pub kv_blocks: u32,
    /// Bytes one GPU holds of one block of `block_size` tokens: all layers, K and V, its
    /// `num_kv_heads / gpus` heads.
    pub kv_block_bytes: u64,
    /// Held by the engine but outside the budget: the CUDA context (created before vLLM's
    /// start-up memory snapshot) and the CUDA graphs (captured after the KV cache is
    /// allocated). They use the `1 − gpu_memory_utilization` headroom.
    pub outside_budget_bytes: u64,
    /// `weight_bytes + overhead_bytes + kv_bytes + outside_budget_bytes`: the device memory
    /// held while loading, awake or in transition.
    pub total_claim_bytes: u64,
    /// Held while asleep: what sleep mode does not release (CUDA context, NCCL and workspace
    /// buffers, CUDA-graph pool). Field anchors §1.1 report 2–10 % of the device for
    /// generative models.
    pub asleep_bytes: u64,
    /// GPUs the replica spans (`ServingConfig::tensor_parallel`), each holding the figures
    /// above. 1 when absent, and not written when 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub tensor_parallel: u32,
}

impl MemoryPlan {
    /// Plans `model` served with `config` on `device`, refusing (as vLLM does) when weights
    /// and overhead leave no room for the KV cache or the KV cache cannot hold one
    /// `max_model_len` sequence.
    pub fn new(
        device: &DeviceSpec,
        model: &ModelArch,
        config: &ServingConfig,
    ) -> Result<Self, EmulatorError> {
        config.validate(device, model)?;
        let budget_bytes =
            (config.gpu_memory_utilization * device.memory_bytes as f64).floor() as u64;
        // vLLM's `init_device`: the free memory after the CUDA context exists must cover the
        // requested share ("Free memory on device ... is less than desired GPU memory
        // utilization").
        if budget_bytes > device.memory_bytes.saturating_sub(CUDA_CONTEXT_BYTES) {
            return Err(EmulatorError::InvalidConfig {
                field: "gpu_memory_utilization",
                value: config.gpu_memory_utilization.to_string(),
                reason: "asks for more than the device's free memory once the CUDA context exists",
            });
        }
        let tp = config.tensor_parallel;
        let weight_bytes = weight_bytes_per_gpu(model, config.dtype, tp);
        let activation_peak_bytes = activation_peak_bytes(model, config);
        let overhead_bytes = NON_TORCH_BYTES + activation_peak_bytes;
        let outside_budget_bytes = CUDA_CONTEXT_BYTES + CUDA_GRAPH_BYTES;
        let available = budget_bytes
            .checked_sub(weight_bytes + overhead_bytes)
            .filter(|&a| a > 0)
            .ok_or_else(|| EmulatorError::InsufficientMemory {
                model: model.name.clone(),
                device: device.name.clone(),
                weight_bytes,
                overhead_bytes,
                budget_bytes,
            })?;
        let kv_block_bytes = kv_bytes_per_token_per_gpu(model, config.kv_dtype(), tp) * u64::from(config.block_size);
        let kv_blocks = u32::try_from(available / kv_block_bytes.max(1)).unwrap_or(u32::MAX);
        let kv_tokens = u64::from(kv_blocks) * u64::from(config.block_size);
        if kv_tokens < u64::from(config.max_model_len) {
            return Err(EmulatorError::KvCacheTooSmall {
                model: model.name.clone(),
                device: device.name.clone(),
                kv_tokens,
                max_model_len: config.max_model_len,
            });
        }
        let kv_bytes = u64::from(kv_blocks) * kv_block_bytes;
        Ok(MemoryPlan {
            budget_bytes,
            weight_bytes,
            overhead_bytes,
            activation_peak_bytes,
            kv_bytes,
            kv_blocks,
            kv_block_bytes,
            outside_budget_bytes,
            total_claim_bytes: weight_bytes + overhead_bytes + kv_bytes + outside_budget_bytes,
            asleep_bytes: CUDA_CONTEXT_BYTES + NON_TORCH_BYTES + CUDA_GRAPH_BYTES,
            tensor_parallel: tp,
        })
    }

    /// GPUs the replica occupies, each holding this plan's per-GPU figures.
    pub fn gpus(&self) -> u32 {
        self.tensor_parallel.max(1)
    }

    /// Device memory the whole replica claims while loading or awake: `total_claim_bytes` on
    /// each of its [`gpus`](Self::gpus).
    pub fn replica_claim_bytes(&self) -> u64 {
        self.total_claim_bytes * u64::from(self.gpus())
    }

    /// What a replica of `model` served with `config` needs on any device, by the same rule as
    /// [`MemoryPlan::new`]: weights, engine overhead, and the KV cache of one `max_model_len`
    /// sequence (whole blocks) — on each of its `config.tensor_parallel` GPUs. A device fits
    /// when its `gpu_memory_utilization` share is at least `total_bytes()` (and it computes in
    /// the dtype).
    pub fn requirement(model: &ModelArch, config: &ServingConfig) -> MemoryRequirement {
        let block = u64::from(config.block_size.max(1));
        let blocks = u64::from(config.max_model_len).div_ceil(block);
        let tp = config.tensor_parallel;
        MemoryRequirement {
            weight_bytes: weight_bytes_per_gpu(model, config.dtype, tp),
            overhead_bytes: NON_TORCH_BYTES + activation_peak_bytes(model, config),
            kv_bytes: blocks * block * kv_bytes_per_token_per_gpu(model, config.kv_dtype(), tp),
        }
    }

    /// Tokens the KV cache holds.
    pub fn kv_tokens(&self, block_size: u32) -> u64 {
        u64::from(self.kv_blocks) * u64::from(block_size)
    }
}

/// The memory a replica needs at the least inside its `gpu_memory_utilization` share, on each
/// of its GPUs (see [`MemoryPlan::requirement`]); the CUDA context and graphs come on top, in
/// the headroom.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryRequirement {
    pub weight_bytes: u64,
    pub overhead_bytes: u64,
    /// KV cache of one `max_model_len` sequence.
    pub kv_bytes: u64,
}

impl MemoryRequirement {
    pub fn total_bytes(&self) -> u64 {
        self.weight_bytes + self.overhead_bytes + self.kv_bytes
    }
}

/// The weight bytes each GPU of a `tp`-way tensor-parallel replica holds, as vLLM shards a
/// dense decoder: the q / k / v / o and MLP matrices split by `tp`, the embedding and the LM
/// head split by vocabulary rows (`VocabParallelEmbedding`, `ParallelLMHead`; tied embeddings
/// counted once, as in `ModelArch::param_count`), the norms whole on every GPU. vLLM's log in
/// PR #10511 shows Llama-3-8B at 14.96 GiB on one GPU and 7.48 GiB per GPU at TP = 2. At
/// `tp` = 1, `ModelArch::param_bytes`.
pub fn weight_bytes_per_gpu(model: &ModelArch, dtype: Dtype, tp: u32) -> u64 {
    let t = u64::from(tp.max(1));
    if t == 1 {
        return model.param_bytes(dtype);
    }
    let h = model.hidden_size;
    let (q, kv) = (model.q_width() / t, model.kv_width() / t);
    let linear = h * q + 2 * h * kv + q * h + 3 * h * model.intermediate_size.div_ceil(t);
    let vocab_rows = model.vocab_size.div_ceil(t);
    let embed = vocab_rows * h * if model.tie_word_embeddings { 1 } else { 2 };
    let params = embed + model.num_hidden_layers * (linear + model.layer_norm_params()) + h;
    params * dtype.bytes()
}

/// KV-cache bytes per token on each GPU of a `tp`-way replica (`num_kv_heads / tp` heads).
fn kv_bytes_per_token_per_gpu(model: &ModelArch, dtype: Dtype, tp: u32) -> u64 {
    model.kv_bytes_per_token(dtype) / u64::from(tp.max(1))
}

/// Activation peak of vLLM's profile run: one forward pass over `max_num_batched_tokens`
/// tokens, whose largest live set is in the MLP (residual and normed hidden states, the fused
/// gate/up output of width `2 × intermediate` and the activation output), plus the sampler's
/// fp32 logits for `max_num_seqs` sequences. Checked against vLLM's log for Llama-3-8B at
/// 8,192 tokens and 256 sequences (PR #10511: 1.26 GiB): this formula gives 1.15 GiB.
///
/// The same on each GPU of a tensor-parallel replica, not sharded: the same log reports
/// 1.26 GiB at TP = 2 as at TP = 1 (the V1 engine gathers the whole logits on every rank for
/// its sampler, and the unsharded hidden states and buffers hold the peak). Likewise the
/// non-torch memory stays [`NON_TORCH_BYTES`] per GPU: the TP communicators are created after
/// vLLM's start-up snapshot, so they are part of what it measures, and a 4-worker log reports
/// 0.20 GiB in all (vLLM PR #14447; an NCCL group holds 52–100 MB, vLLM PR #18242).
fn activation_peak_bytes(model: &ModelArch, config: &ServingConfig) -> u64 {
    let act_bytes = config.dtype.bytes().max(2);
    let tokens = u64::from(config.max_num_batched_tokens);
    let forward = tokens * (2 * model.hidden_size + 3 * model.intermediate_size) * act_bytes;
    let sampler = u64::from(config.max_num_seqs) * model.vocab_size * 4 * SAMPLER_TENSORS;
    forward + sampler
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_predictor::spec::{device, model};

    /// The requirement is the plan's own rule: a device fits exactly when its share covers it.
    #[test]
    fn requirement_decides_like_the_plan() {
        for m in ["Qwen3-0.6B", "Qwen3-8B", "Qwen3-14B", "Qwen3-32B"] {
            let m = model(m).unwrap();
            for d in ["V100-32GB", "A100-40GB", "A100-80GB", "H100-80GB"] {
                let d = device(d).unwrap();
                for len in [2048, 8192, 40_960] {
                    let cfg = ServingConfig::vllm_defaults(Dtype::Fp16, len);
                    let need = MemoryPlan::requirement(&m, &cfg).total_bytes();
                    let budget = (cfg.gpu_memory_utilization * d.memory_bytes as f64).floor() as u64;
                    assert_eq!(MemoryPlan::new(&d, &m, &cfg).is_ok(), need <= budget, "{} on {} at {len}", m.name, d.name);
                }
            }
        }
    }

    #[test]
    fn per_device_defaults_are_vllms() {
        let a100 = device("A100-40GB").unwrap();
        let c = ServingConfig::vllm_defaults_on(&a100, Dtype::Bf16, 8192);
        assert_eq!((c.max_num_batched_tokens, c.max_num_seqs, c.enable_prefix_caching), (2048, 256, true));
        let h100 = device("H100-80GB").unwrap();
        let c = ServingConfig::vllm_defaults_on(&h100, Dtype::Bf16, 8192);
        assert_eq!((c.max_num_batched_tokens, c.max_num_seqs), (8192, 1024));
        let a100_80 = device("A100-80GB").unwrap();
        assert_eq!(ServingConfig::vllm_defaults_on(&a100_80, Dtype::Bf16, 8192).max_num_batched_tokens, 2048);
        let v100 = device("V100-32GB").unwrap();
        let c = ServingConfig::vllm_defaults_on(&v100, Dtype::Fp16, 8192);
        assert_eq!((c.max_num_batched_tokens, c.enable_prefix_caching, c.enable_chunked_prefill), (8192, false, false));
        let c = ServingConfig::vllm_defaults_on(&v100, Dtype::Fp16, 40_960);
        assert_eq!((c.max_num_batched_tokens, c.enable_chunked_prefill), (2048, true));
        assert_eq!(ServingConfig::vllm_defaults_on(&v100, Dtype::Fp16, 1024).max_num_batched_tokens, 2048);
    }

    #[test]
    fn qwen3_8b_on_a100_40gb_by_hand() {
        let d = device("A100-40GB").unwrap();
        let m = model("Qwen3-8B").unwrap();
        let cfg = ServingConfig::vllm_defaults(Dtype::Bf16, 32_768);
        let plan = MemoryPlan::new(&d, &m, &cfg).unwrap();
        // 0.9 × 40 GiB = 38,654,705,664 B.
        assert_eq!(plan.budget_bytes, 38_654_705_664);
        assert_eq!(plan.weight_bytes, m.param_count() * 2);
        // Profile run: 8,192 × (2·4,096 + 3·12,288) × 2 B = 738,197,504 B of MLP activations,
        // plus 256 × 151,936 × 4 B × 3 = 466,747,392 B of sampler logits.
        assert_eq!(plan.activation_peak_bytes, 738_197_504 + 466_747_392);
        // + 256 MiB non-torch; the 512 MiB context and 512 MiB of CUDA graphs are outside.
        assert_eq!(plan.overhead_bytes, 1_204_944_896 + 268_435_456);
        assert_eq!(plan.outside_budget_bytes, 1_073_741_824);
        // A block: 16 tokens × 147,456 B (36 layers × 2 × 8 heads × 128 × 2 B).
        assert_eq!(plan.kv_block_bytes, 2_359_296);
        let avail = 38_654_705_664 - plan.weight_bytes - plan.overhead_bytes;
        assert_eq!(u64::from(plan.kv_blocks), avail / 2_359_296);
        assert_eq!(plan.kv_bytes, u64::from(plan.kv_blocks) * 2_359_296);
        assert_eq!(
            plan.total_claim_bytes,
            plan.weight_bytes + plan.overhead_bytes + plan.kv_bytes + plan.outside_budget_bytes
        );
        let inside = plan.total_claim_bytes - plan.outside_budget_bytes;
        assert!(inside <= plan.budget_bytes);
        assert!(plan.budget_bytes - inside < plan.kv_block_bytes);
        assert!(plan.total_claim_bytes <= d.memory_bytes);
        // About 20.6 GiB of KV: ~8,800 blocks, ~141k tokens.
        assert!(
            (8_600..9_000).contains(&plan.kv_blocks),
            "{}",
            plan.kv_blocks
        );
        assert_eq!(plan.asleep_bytes, 1_342_177_280);
    }

    /// vLLM 0.10.2 starts Qwen3-14B in fp16 at `--max-model-len 40960` on an A100-40GB: with
    /// its defaults there (2,048 batched tokens, 256 sequences, 0.9 utilisation) 27.5 GiB of
    /// weights and 0.9 GiB of profile-run activations and non-torch memory leave 7.6 GiB of
    /// KV (49,600 tokens) for the 6.25 GiB of one 40,960-token sequence. Subtracting the CUDA
    /// context and graphs too (what the emulator did before) left 43,040 tokens, and with an
    /// 8,192-token profile run 38,128: refused.
    #[test]
    fn qwen3_14b_at_40k_fits_an_a100_40gb_like_vllm() {
        let d = device("A100-40GB").unwrap();
        let m = model("Qwen3-14B").unwrap();
        for cfg in [ServingConfig::vllm_defaults_on(&d, Dtype::Fp16, 40_960), ServingConfig::vllm_defaults(Dtype::Fp16, 40_960)] {
            let plan = MemoryPlan::new(&d, &m, &cfg).unwrap();
            // vLLM's rule, by hand: 0.9 × total − (weights + torch peak + non-torch).
            let budget = (0.9 * d.memory_bytes as f64).floor() as u64;
            let kv = budget - plan.weight_bytes - plan.activation_peak_bytes - NON_TORCH_BYTES;
            assert_eq!(u64::from(plan.kv_blocks), kv / plan.kv_block_bytes);
            assert!(plan.kv_tokens(cfg.block_size) >= 40_960, "{}", plan.kv_tokens(cfg.block_size));
            // The context and graphs are held on top, in the 10 % headroom.
            assert!(plan.total_claim_bytes <= d.memory_bytes);
            assert_eq!(plan.total_claim_bytes - plan.outside_budget_bytes, plan.weight_bytes + plan.overhead_bytes + plan.kv_bytes);
        }
        let plan = MemoryPlan::new(&d, &m, &ServingConfig::vllm_defaults_on(&d, Dtype::Fp16, 40_960)).unwrap();
        assert_eq!(plan.kv_tokens(16), 49_600);
    }

    /// The KV capacity table of CALIBRATION.md: tokens per replica in fp16 with vLLM 0.10.2's
    /// defaults on each device, at the paper workflows' `max_model_len` of 8,192 (on V100 the
    /// V0 engine then profiles 8,192 batched tokens, on A100 the V1 engine 2,048).
    #[test]
    fn kv_capacity_table() {
        let rows: [(&str, &str, Option<u64>); 10] = [
            ("Qwen3-0.6B", "V100-32GB", Some(251_216)),
            ("Qwen3-1.7B", "V100-32GB", Some(230_000)),
            ("Qwen3-4B", "V100-32GB", Some(146_352)),
            ("Qwen3-8B", "V100-32GB", Some(88_624)),
            ("Qwen3-14B", "V100-32GB", None),
            ("Qwen3-0.6B", "A100-40GB", Some(319_824)),
            ("Qwen3-1.7B", "A100-40GB", Some(299_808)),
            ("Qwen3-4B", "A100-40GB", Some(201_632)),
            ("Qwen3-8B", "A100-40GB", Some(144_800)),
            ("Qwen3-14B", "A100-40GB", Some(49_600)),
        ];
        for (m, d, want) in rows {
            let (m, d) = (model(m).unwrap(), device(d).unwrap());
            let cfg = ServingConfig::vllm_defaults_on(&d, Dtype::Fp16, 8192);
            let got = MemoryPlan::new(&d, &m, &cfg).map(|p| p.kv_tokens(cfg.block_size)).ok();
            assert_eq!(got, want, "{} on {}", m.name, d.name);
        }
    }

    #[test]
    fn the_requested_share_must_be_free_after_the_cuda_context() {
        let d = device("A100-40GB").unwrap();
        let m = model("Qwen3-0.6B").unwrap();
        let cfg = ServingConfig { gpu_memory_utilization: 1.0, ..ServingConfig::vllm_defaults(Dtype::Bf16, 4096) };
        let err = MemoryPlan::new(&d, &m, &cfg).unwrap_err();
        assert!(matches!(err, EmulatorError::InvalidConfig { field: "gpu_memory_utilization", .. }), "{err}");
        let cfg = ServingConfig { gpu_memory_utilization: 0.98, ..cfg };
        assert!(MemoryPlan::new(&d, &m, &cfg).is_ok());
    }

    #[test]
    fn a_model_that_does_not_fit_is_refused() {
        let d = device("L4").unwrap();
        let m = model("Qwen3-32B").unwrap();
        let err =
            MemoryPlan::new(&d, &m, &ServingConfig::vllm_defaults(Dtype::Bf16, 4096)).unwrap_err();
        assert!(
            matches!(err, EmulatorError::InsufficientMemory { .. }),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("no available memory for the cache blocks")
        );
    }

    #[test]
    fn a_kv_cache_smaller_than_one_sequence_is_refused() {
        // Qwen3-8B (15.3 GiB of weights, 2.4 GiB of overhead) on a 24 GiB L4 leaves ~4 GiB of
        // KV, ~29k tokens at 144 KiB per token: a 40,960-token max_model_len cannot fit.
        let d = device("L4").unwrap();
        let m = model("Qwen3-8B").unwrap();
        let err = MemoryPlan::new(&d, &m, &ServingConfig::vllm_defaults(Dtype::Bf16, 40_960))
            .unwrap_err();
        match err {
            EmulatorError::KvCacheTooSmall {
                kv_tokens,
                max_model_len,
                ..
            } => {
                assert!(kv_tokens < u64::from(max_model_len));
            }
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn bf16_on_v100_is_refused_fp16_is_served() {
        let d = device("V100-32GB").unwrap();
        let m = model("Qwen3-1.7B").unwrap();
        let err =
            MemoryPlan::new(&d, &m, &ServingConfig::vllm_defaults(Dtype::Bf16, 4096)).unwrap_err();
        assert!(matches!(err, EmulatorError::UnsupportedDtype { .. }));
        assert!(MemoryPlan::new(&d, &m, &ServingConfig::vllm_defaults(Dtype::Fp16, 4096)).is_ok());
        // A BF16 cache beside fp16 weights is refused there too; an FP8 one is served.
        let bf16_cache = ServingConfig { kv_cache_dtype: Some(Dtype::Bf16), ..ServingConfig::vllm_defaults(Dtype::Fp16, 4096) };
        assert!(matches!(MemoryPlan::new(&d, &m, &bf16_cache).unwrap_err(), EmulatorError::UnsupportedDtype { .. }));
        let fp8_cache = ServingConfig { kv_cache_dtype: Some(Dtype::Fp8), ..ServingConfig::vllm_defaults(Dtype::Fp16, 4096) };
        let (half, whole) = (MemoryPlan::new(&d, &m, &fp8_cache).unwrap(), MemoryPlan::new(&d, &m, &ServingConfig::vllm_defaults(Dtype::Fp16, 4096)).unwrap());
        assert!(half.kv_blocks > whole.kv_blocks * 19 / 10, "{} vs {}", half.kv_blocks, whole.kv_blocks);
    }

    #[test]
    fn bad_flags_name_the_field() {
        let d = device("A100-40GB").unwrap();
        let m = model("Qwen3-0.6B").unwrap();
        let base = ServingConfig::vllm_defaults(Dtype::Bf16, 4096);
        let cases: Vec<(ServingConfig, &str)> = vec![
            (
                ServingConfig {
                    gpu_memory_utilization: 1.5,
                    ..base.clone()
                },
                "gpu_memory_utilization",
            ),
            (
                ServingConfig {
                    gpu_memory_utilization: f64::NAN,
                    ..base.clone()
                },
                "gpu_memory_utilization",
            ),
            (
                ServingConfig {
                    block_size: 0,
                    ..base.clone()
                },
                "block_size",
            ),
            (
                ServingConfig {
                    max_num_seqs: 0,
                    ..base.clone()
                },
                "max_num_seqs",
            ),
            (
                ServingConfig {
                    max_num_batched_tokens: 100,
                    ..base.clone()
                },
                "max_num_batched_tokens",
            ),
            (
                ServingConfig {
                    max_model_len: 1_000_000,
                    ..base.clone()
                },
                "max_model_len",
            ),
        ];
        for (cfg, field) in cases {
            let err = MemoryPlan::new(&d, &m, &cfg).unwrap_err();
            assert!(
                matches!(err, EmulatorError::InvalidConfig { field: f, .. } if f == field),
                "{err}"
            );
        }
    }

    /// TP = 2 halves the weights each GPU holds (the norms stay whole on both) and the bytes a
    /// GPU holds of each block (half the KV heads), so the replica's logical blocks more than
    /// double; budget and overhead per GPU stay those of one GPU.
    #[test]
    fn tensor_parallel_2_halves_the_weights_and_grows_the_kv() {
        let d = device("A100-40GB").unwrap();
        let m = model("Qwen3-8B").unwrap();
        let one = ServingConfig::vllm_defaults_on(&d, Dtype::Bf16, 32_768);
        let two = ServingConfig { tensor_parallel: 2, ..one.clone() };
        let (p1, p2) = (MemoryPlan::new(&d, &m, &one).unwrap(), MemoryPlan::new(&d, &m, &two).unwrap());
        assert_eq!(p1.weight_bytes, m.param_bytes(Dtype::Bf16));
        let replicated = (m.num_hidden_layers * m.layer_norm_params() + m.hidden_size) * 2;
        assert_eq!(2 * p2.weight_bytes, p1.weight_bytes + replicated);
        assert_eq!(2 * p2.kv_block_bytes, p1.kv_block_bytes);
        assert_eq!(
            (p2.budget_bytes, p2.overhead_bytes, p2.outside_budget_bytes),
            (p1.budget_bytes, p1.overhead_bytes, p1.outside_budget_bytes)
        );
        assert_eq!(
            u64::from(p2.kv_blocks),
            (p2.budget_bytes - p2.weight_bytes - p2.overhead_bytes) / p2.kv_block_bytes
        );
        assert!(p2.kv_blocks > 2 * p1.kv_blocks, "{} vs {}", p2.kv_blocks, p1.kv_blocks);
        assert_eq!((p1.gpus(), p2.gpus()), (1, 2));
        assert_eq!(p1.replica_claim_bytes(), p1.total_claim_bytes);
        assert_eq!(p2.replica_claim_bytes(), 2 * p2.total_claim_bytes);
        assert_eq!(p2.asleep_bytes, p1.asleep_bytes);
        // The requirement per GPU follows the same rule.
        let need = MemoryPlan::requirement(&m, &two);
        assert_eq!(need.weight_bytes, p2.weight_bytes);
        assert_eq!(need.kv_bytes, MemoryPlan::requirement(&m, &one).kv_bytes / 2);
        // Every catalogue model, every TP degree: the weights per GPU shrink as 1/t (up to the
        // replicated norms and the rounding of the vocabulary rows).
        for m in switchyard_predictor::spec::model_catalogue() {
            for tp in [2u32, 4, 8] {
                let w = weight_bytes_per_gpu(&m, Dtype::Bf16, tp) as f64;
                let share = m.param_bytes(Dtype::Bf16) as f64 / f64::from(tp);
                assert!(w >= share && w < share * 1.001, "{} at TP {tp}: {w} vs {share}", m.name);
            }
        }
    }

    /// The requirement is the plan's own rule under tensor parallelism too.
    #[test]
    fn requirement_decides_like_the_plan_at_every_tp() {
        for m in ["Qwen3-8B", "Qwen3-14B", "Qwen3-32B"] {
            let m = model(m).unwrap();
            for d in ["V100-32GB", "A100-40GB", "L4", "H100-80GB"] {
                let d = device(d).unwrap();
                for tp in [2u32, 4, 8] {
                    for len in [8192, 40_960] {
                        let cfg =
                            ServingConfig { tensor_parallel: tp, ..ServingConfig::vllm_defaults(Dtype::Fp16, len) };
                        let need = MemoryPlan::requirement(&m, &cfg).total_bytes();
                        let budget = (cfg.gpu_memory_utilization * d.memory_bytes as f64).floor() as u64;
                        assert_eq!(
                            MemoryPlan::new(&d, &m, &cfg).is_ok(),
                            need <= budget,
                            "{} on {} x{tp} at {len}",
                            m.name,
                            d.name
                        );
                    }
                }
            }
        }
    }

    /// Qwen3-32B in bf16 (65.5 GB of weights) leaves one H100-80GB 31,360 tokens of KV, so
    /// vLLM refuses even `--max-model-len 32768` there; on two (`-tp 2`, H100 defaults: 8,192
    /// batched tokens, 1,024 sequences) each GPU holds 30.5 GiB of weights, 3.3 GiB of
    /// profile-run overhead and 38.2 GiB of KV: 19,543 blocks, 312,688 tokens, 7.6 sequences of
    /// 40,960 tokens.
    #[test]
    fn qwen3_32b_starts_on_two_h100s_at_its_full_context() {
        let d = device("H100-80GB").unwrap();
        let m = model("Qwen3-32B").unwrap();
        let one = ServingConfig::vllm_defaults_on(&d, Dtype::Bf16, 32_768);
        match MemoryPlan::new(&d, &m, &one).unwrap_err() {
            EmulatorError::KvCacheTooSmall { kv_tokens, .. } => assert_eq!(kv_tokens, 31_360),
            other => panic!("unexpected {other}"),
        }
        let two = ServingConfig { tensor_parallel: 2, ..ServingConfig::vllm_defaults_on(&d, Dtype::Bf16, 40_960) };
        let plan = MemoryPlan::new(&d, &m, &two).unwrap();
        assert_eq!(plan.kv_blocks, 19_543);
        assert_eq!(plan.kv_tokens(two.block_size), 312_688);
        assert_eq!(plan.kv_block_bytes, 16 * 64 * 2 * 4 * 128 * 2);
        assert!(plan.total_claim_bytes <= d.memory_bytes);
        assert_eq!(plan.replica_claim_bytes(), 2 * plan.total_claim_bytes);
    }

    #[test]
    fn an_invalid_tensor_parallel_degree_is_refused() {
        let d = device("H100-80GB").unwrap();
        let m = model("Qwen3-8B").unwrap();
        let refused = |m: &ModelArch, tp: u32| {
            let cfg = ServingConfig { tensor_parallel: tp, ..ServingConfig::vllm_defaults(Dtype::Bf16, 8192) };
            matches!(MemoryPlan::new(&d, m, &cfg), Err(EmulatorError::InvalidConfig { field: "tensor_parallel", .. }))
        };
        for tp in [0, 3, 6, 16] {
            assert!(refused(&m, tp), "TP {tp}");
        }
        for tp in [1, 2, 4, 8] {
            assert!(!refused(&m, tp), "TP {tp}");
        }
        // Four KV heads cannot be split over eight GPUs.
        let four_kv = ModelArch { num_key_value_heads: 4, ..m.clone() };
        assert!(refused(&four_kv, 8));
        assert!(!refused(&four_kv, 4));
        let err = ServingConfig { tensor_parallel: 3, ..ServingConfig::vllm_defaults(Dtype::Bf16, 8192) }
            .validate(&d, &m)
            .unwrap_err();
        assert!(err.to_string().contains("tensor_parallel = 3"), "{err}");
    }

    #[test]
    fn more_utilization_gives_more_kv_and_nothing_else() {
        let d = device("A100-80GB").unwrap();
        let m = model("Qwen3-4B").unwrap();
        let lo = MemoryPlan::new(&d, &m, &ServingConfig::vllm_defaults(Dtype::Bf16, 8192)).unwrap();
        let hi = MemoryPlan::new(
            &d,
            &m,
            &ServingConfig {
                gpu_memory_utilization: 0.95,
                ..ServingConfig::vllm_defaults(Dtype::Bf16, 8192)
            },
        )
        .unwrap();
        assert!(hi.kv_blocks > lo.kv_blocks);
        assert_eq!(
            (hi.weight_bytes, hi.overhead_bytes),
            (lo.weight_bytes, lo.overhead_bytes)
        );
    }
}
