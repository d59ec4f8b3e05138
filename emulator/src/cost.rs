//! The cost model: the time of one continuous-batching iteration of a vLLM-like engine, given
//! the batch (prefill chunks with the context cached before each, and decode sequences with
//! their context lengths), on one GPU or on the `tp` GPUs of one node of a tensor-parallel
//! replica.
//!
//! Form (per transformer layer, following Vidur's operator split):
//! - token-level linear ops (QKV projection, O projection, gated MLP up+gate, MLP down; the LM
//!   head once per iteration over the sampled sequences) as a roofline
//!   `smoothmax(flops / (peak × mfu(n)), bytes / (bw × mbu)) + launch`, where the weights are
//!   read once per iteration, `mfu(n) = mfu · n / (n + n½)` ramps with the tokens `n`, and
//!   `smoothmax(a, b) = (aᵖ + bᵖ)^(1/p)` rounds the knee between the bandwidth-bound (decode)
//!   and compute-bound (prefill) regimes;
//! - norms, rotary embedding, activation, residual add, embedding and KV-cache writes as
//!   bandwidth-bound element-wise kernels `bytes / (bw × mbu_op) + launch_op`;
//! - attention: prefill FLOPs (causal, `4 · q_width` per query–key pair) and decode KV bytes
//!   read (`2 · kv_width · dtype` per cached token) as rooflines;
//! - plus a per-iteration CPU overhead (schedule, prepare inputs, sampler, output processing)
//!   linear in the number of sequences in the batch.
//!
//! Tensor parallelism (`tp` > 1, Megatron-style as vLLM shards a dense decoder): every GPU runs
//! the same iteration on its shard ([`ModelShape::shard`]: q / k / v / o, MLP, LM head and
//! attention heads split by `tp`; norms, residual add and embedding width whole), with the
//! constants fitted at TP = 1, and waits for two all-reduces of the hidden activations per
//! layer (after the attention output projection and after the MLP), one after the
//! vocab-parallel embedding and an all-gather of the logits: [`AllReduce`], interpolated in
//! Vidur's measured NCCL profiles of the device's node (or a PCIe bandwidth model where none
//! exists). The CPU overhead is the one fitted at that TP. At `tp` = 1 none of this runs: the
//! same bits as before.
//!
//! The efficiency constants were fitted offline (`cargo run -p switchyard-emulator --example
//! calibrate`) against Vidur's measured per-operator profiles (`predictor/data/vidur-profiling`,
//! and `emulator/data/vidur-profiling` for the all-reduces) and are checked by
//! `tests/calibration.rs`; `CALIBRATION.md` reports the errors. Devices
//! without measurements reuse the constants of their closest measured class scaled by their
//! own datasheet FLOP/s and bandwidth — a roofline extrapolation.
//!
//! Hybrid models (Qwen3.5: [`LinearShape`]): the full-attention layers cost as above (their
//! query projection also emits the output gate); each Gated DeltaNet layer runs its
//! projections, causal convolution and gated norm as linear and element-wise kernels beside the
//! same MLP, and its recurrence as a roofline over the state it reads and writes — once per
//! decoding sequence per step, once per prefill chunk — at the attention kernels' fitted
//! efficiencies (an assumption: no profile of the flash-linear-attention kernels exists here).
//! Tensor parallelism of hybrid models is not modelled (refused by `ServingConfig::validate`).
//!
//! [`IterationCost`] is the same model with the terms that depend only on a batch's token and
//! sequence counts memoised (what a replica repeats step after step), with the same bits.
//!
//! This module is the emulator's private ground truth: the predictor must not call it or read
//! its constants. It depends on the spec sheets (`ModelArch`, `DeviceSpec`, `Dtype`) and, in the
//! crate, on `lifecycle` alone (the engine generation that picks the attention kernel).

use serde::{Deserialize, Serialize};
use switchyard_predictor::spec::{DeviceSpec, Dtype, ModelArch};

/// Tokens per chunk of the chunked Gated DeltaNet prefill kernel (flash-linear-attention's
/// `chunk_gated_delta_rule`, which vLLM runs for Qwen3.5: chunks of 64).
const GDN_CHUNK: f64 = 64.0;

/// The Gated DeltaNet layers of a hybrid model as the cost model sees them
/// ([`switchyard_predictor::spec::LinearAttention`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinearShape {
    pub layers: u64,
    /// `num_key_heads × key_head_dim` (q and k each).
    pub key_width: u64,
    /// `num_value_heads × value_head_dim` (v, the output gate z and the output each).
    pub value_width: u64,
    pub value_heads: u64,
    pub key_head_dim: u64,
    pub value_head_dim: u64,
    /// Bytes of one sequence's recurrent state plus convolution window in one layer (the
    /// window in 16-bit activations, whatever the weights' format).
    pub state_bytes: u64,
}

/// The shape of a decoder-only transformer as the cost model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelShape {
    pub num_layers: u64,
    pub hidden: u64,
    /// `num_attention_heads × head_dim`.
    pub q_width: u64,
    /// `num_key_value_heads × head_dim` (one of K or V).
    pub kv_width: u64,
    pub intermediate: u64,
    /// Gated MLP (SwiGLU: up and gate fused into one matrix of width `2 × intermediate`).
    pub gated_mlp: bool,
    pub vocab: u64,
    /// Per-head RMSNorm on q and k (Qwen3).
    pub qk_norm: bool,
    /// The query projection also emits an output gate of the query's width (Qwen3.5).
    #[serde(default)]
    pub attn_output_gate: bool,
    /// A hybrid model's linear-attention layers (`num_layers` counts them too); `None`:
    /// every layer attends.
    #[serde(default)]
    pub linear: Option<LinearShape>,
}

impl ModelShape {
    /// The shape of a catalogue model (Qwen3 / Llama family: gated MLP).
    pub fn from_arch(model: &ModelArch) -> Self {
        ModelShape {
            num_layers: model.num_hidden_layers,
            hidden: model.hidden_size,
            q_width: model.q_width(),
            kv_width: model.kv_width(),
            intermediate: model.intermediate_size,
            gated_mlp: true,
            vocab: model.vocab_size,
            qk_norm: model.qk_norm,
            attn_output_gate: model.attn_output_gate,
            linear: model.linear_attention.map(|l| LinearShape {
                layers: l.num_layers,
                key_width: l.key_width(),
                value_width: l.value_width(),
                value_heads: l.num_value_heads,
                key_head_dim: l.key_head_dim,
                value_head_dim: l.value_head_dim,
                state_bytes: l.state_bytes_per_layer(Dtype::Bf16),
            }),
        }
    }

    /// Layers with full attention (all of a dense model's).
    pub fn attention_layers(&self) -> u64 {
        self.num_layers.saturating_sub(self.linear.map_or(0, |l| l.layers))
    }

    /// What one GPU of a `tp`-way tensor-parallel replica computes, as vLLM shards a dense
    /// decoder (and as Vidur's profiler shards the operators it times): the QKV and gate/up
    /// projections are column-parallel (output width / `tp`), the O and down projections
    /// row-parallel (input width / `tp`), attention runs `heads / tp` query and KV heads, the
    /// LM head holds `vocab / tp` rows; the hidden width (norms, residual add, embedding
    /// output, all-reduced after each row-parallel layer) stays whole. The identity at
    /// `tp` ≤ 1. Head counts divisible by `tp` are checked by `ServingConfig::validate`; the
    /// intermediate and vocab widths round up (vLLM pads the vocab to a multiple of 64). A
    /// hybrid model's linear-attention layers are not sharded: `ServingConfig::validate`
    /// refuses tensor parallelism for them.
    pub fn shard(&self, tp: u32) -> ModelShape {
        let t = u64::from(tp.max(1));
        if t == 1 {
            return *self;
        }
        ModelShape {
            q_width: self.q_width / t,
            kv_width: self.kv_width / t,
            intermediate: self.intermediate.div_ceil(t),
            vocab: self.vocab.div_ceil(t),
            ..*self
        }
    }
}

/// Efficiency of one bandwidth-bound element-wise kernel: achieved fraction of the datasheet
/// bandwidth and a fixed per-launch time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct KernelEff {
    pub mbu: f64,
    pub launch_s: f64,
}

/// The efficiency constants of one device class. Fitted, not datasheet figures: they turn the
/// datasheet peaks into achieved times. Exposed so the offline calibration program can
/// evaluate candidates through the very code the emulator runs; planning code must not read
/// them (the predictor has its own, independent estimates).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Efficiency {
    /// Model FLOP utilisation of the linear ops in the compute-bound regime, at many tokens.
    pub linear_mfu: f64,
    /// Tokens at which the linear ops reach half of `linear_mfu`: the utilisation ramps as
    /// `linear_mfu · n / (n + half)` (small GEMMs fill few tiles and waves).
    pub linear_mfu_half_tokens: f64,
    /// Memory-bandwidth utilisation of the linear ops in the bandwidth-bound regime.
    pub linear_mbu: f64,
    /// Exponent `p` of the smooth maximum joining the two regimes (∞ would be a hard max).
    pub linear_sharpness: f64,
    /// Fixed time per linear kernel (launch, tail effects).
    pub linear_launch_s: f64,
    pub norm: KernelEff,
    pub rope: KernelEff,
    pub act: KernelEff,
    pub add: KernelEff,
    pub emb: KernelEff,
    /// FLOP utilisation of prefill attention (FlashAttention, causal).
    pub attn_prefill_mfu: f64,
    /// Bandwidth utilisation of attention when reading the KV cache (decode).
    pub attn_mbu: f64,
    /// Fixed time per attention kernel.
    pub attn_launch_s: f64,
}

/// Fitted against Vidur's `profiling/compute/a100/*/mlp.csv` (TP = 1, eight models, 2,478
/// rows; Vidur's `device_configs/a100.yml` says the profiled A100 has 80 GB, so the peaks used
/// in the fit are the A100-80GB datasheet's 312 TFLOP/s and 2,039 GB/s) and the legacy
/// `legacy/a100/attention.csv` (one shape). Produced by `examples/calibrate.rs`; errors in
/// `CALIBRATION.md`, re-checked by `tests/calibration.rs`.
///
/// Tensor parallelism keeps these constants, checked (not refitted) against the TP > 1 rows of
/// the same `mlp.csv` files, each predicted on its sharded shape ([`ModelShape::shard`]): TP = 2,
/// 2,217 rows (seven models; phi-2 has TP = 1 rows only), layer WAPE 1.9 % (≤ 256 tokens
/// 7.2 %), linear ops 2.8–7.3 %; TP = 4, 2,217 rows, layer 2.8 % (6.9 %), linear ops 3.2–7.0 %;
/// TP = 8, layer 2.4 %. The legacy attention profile is itself TP = 2 (64 q / 8 kv heads,
/// 32 / 4 per GPU): the attention fit is the sharded one.
const AMPERE: Efficiency = Efficiency {
    linear_mfu: 0.737,
    linear_mfu_half_tokens: 73.6,
    linear_mbu: 0.828,
    linear_sharpness: 6.54,
    linear_launch_s: 8.30e-6,
    norm: KernelEff {
        mbu: 0.367,
        launch_s: 3.49e-6,
    },
    rope: KernelEff {
        mbu: 0.465,
        launch_s: 3.69e-6,
    },
    act: KernelEff {
        mbu: 0.522,
        launch_s: 6.11e-6,
    },
    add: KernelEff {
        mbu: 0.922,
        launch_s: 1.89e-6,
    },
    emb: KernelEff {
        mbu: 0.149,
        launch_s: 3.47e-6,
    },
    attn_prefill_mfu: 0.255,
    attn_mbu: 0.771,
    attn_launch_s: 1.55e-5,
};

/// Fitted against Vidur's `profiling/compute/h100/*/mlp.csv` (TP = 1, six models, 1,566
/// rows) with the H100-80GB (SXM5) datasheet peaks, 989 TFLOP/s and 3.35 TB/s. No H100
/// attention profile exists in the copy: attention reuses the A100-fitted fractions of peak
/// here; the emulator serves prefill with FlashAttention-3's published efficiency instead
/// ([`AttentionKernel`]).
///
/// At TP > 1, checked against the TP > 1 rows of the same files on the sharded shapes: TP = 2,
/// 1,305 rows (five models), layer WAPE 3.8 % (≤ 256 tokens 6.9 %), linear ops 5.0–9.1 %;
/// TP = 4, 1,305 rows, layer 4.7 % (7.6 %), linear ops 6.3–13.5 % (MLP down projection);
/// TP = 8, layer 4.6 %.
const HOPPER: Efficiency = Efficiency {
    linear_mfu: 0.728,
    linear_mfu_half_tokens: 130.3,
    linear_mbu: 0.931,
    linear_sharpness: 7.11,
    linear_launch_s: 7.10e-6,
    norm: KernelEff {
        mbu: 0.412,
        launch_s: 3.09e-6,
    },
    rope: KernelEff {
        mbu: 0.510,
        launch_s: 3.20e-6,
    },
    act: KernelEff {
        mbu: 0.630,
        launch_s: 3.97e-6,
    },
    // Slightly above 1: the measured adds reach 0.95–1.07 of the datasheet bandwidth when part
    // of their operands is still in the 50 MB L2 from the previous kernel, so the HBM bytes
    // counted here overstate the traffic.
    add: KernelEff {
        mbu: 1.080,
        launch_s: 1.66e-6,
    },
    emb: KernelEff {
        mbu: 0.180,
        launch_s: 2.84e-6,
    },
    attn_prefill_mfu: 0.255,
    attn_mbu: 0.771,
    attn_launch_s: 1.55e-5,
};

/// Per-iteration CPU overhead of the engine (schedule + prepare inputs + sampler + output
/// processing), `base + per_seq × sequences`, least-squares fit to the TP = 1 rows (Llama-2-7B,
/// phi-2, batch 8–128) of Vidur's `legacy/a100/cpu_overheads.csv` (vLLM of 2024, whose V0
/// engine ran these steps serially with the GPU). It is host-side work, so every device class
/// uses it. Produced by `examples/calibrate.rs`.
const CPU_OVERHEAD_BASE_S: f64 = 8.1313e-4;
const CPU_OVERHEAD_PER_SEQ_S: f64 = 4.2314e-5;

/// The CPU overhead at TP > 1, `(tp, base, per_seq)`: least squares over the TP = 2 rows
/// (CodeLlama-34B, InternLM-20B, batch 8–128: 26 rows; WAPE 3.9 %) and the TP = 4 rows
/// (Llama-2-70B, Qwen-72B: 26 rows; WAPE 12.2 %, the two models' bases differ by 1.2 ms) of
/// the same `legacy/a100/cpu_overheads.csv` (the 2024 engine drove its TP workers over Ray:
/// 0.7–1.2 ms more base than at TP = 1). No TP = 8 rows exist: TP = 8 uses the TP = 4 fit.
/// Produced by `examples/calibrate.rs -- tp`.
const CPU_OVERHEAD_TP: [(u32, f64, f64); 2] = [(2, 1.4855e-3, 4.4925e-5), (4, 1.9860e-3, 3.7788e-5)];

/// A measured all-reduce profile: the interpolation knots `(message bytes, seconds)` of one
/// node type at one worker count.
type Knots = &'static [(f64, f64)];

/// Vidur's `profiling/network/h100_dgx/all_reduce.csv` (copied to `emulator/data/
/// vidur-profiling`; NCCL on a DGX H100, 8 × H100 SXM on NVSwitch), the intra-node rows
/// (`num_workers = devices_per_node`) at 2, 4 and 8 workers, 994 rows each (2 KiB – 64 MiB),
/// condensed by `examples/calibrate.rs -- tp` (`tests/support/vidur.rs` `all_reduce_knots`)
/// into the median size and median time of the rows within a factor √2 of each power of two
/// from 64 KiB to 64 MiB (all smaller rows join the first), made non-decreasing: below ~1 MiB
/// the measured times scatter between 7 and 45 µs around NCCL's latency floor. Interpolated
/// against the 994 rows: WAPE 2.9 / 1.8 / 2.2 % at 2 / 4 / 8 workers (rows ≥ 1 MiB: 1.7 /
/// 1.5 / 2.0 %); re-derived and checked by `tests/calibration.rs`. Vidur times NCCL without
/// CUDA graphs; vLLM's own custom all-reduce (messages ≤ 8 MiB on NVLink, inside CUDA graphs)
/// is faster at decode sizes, so small-batch steps at TP > 1 are pessimistic by up to ~30 µs
/// per all-reduce.
#[rustfmt::skip]
const H100_DGX_ALL_REDUCE: [(u32, Knots); 3] = [
    (2, &[
        (47104.0, 3.5500e-5), (141312.0, 3.5500e-5), (280576.0, 3.8000e-5), (559104.0, 4.1000e-5),
        (952320.0, 4.1000e-5), (2228224.0, 4.2000e-5), (4456448.0, 4.3000e-5), (8912896.0, 4.7000e-5),
        (15220736.0, 6.9000e-5), (35651584.0, 1.4100e-4), (57344000.0, 2.1500e-4),
    ]),
    (4, &[
        (47104.0, 3.8500e-5), (141312.0, 4.1000e-5), (280576.0, 4.1000e-5), (559104.0, 4.4000e-5),
        (952320.0, 4.4000e-5), (2228224.0, 4.4000e-5), (4456448.0, 4.5000e-5), (8912896.0, 6.2000e-5),
        (15220736.0, 8.7000e-5), (35651584.0, 1.7800e-4), (57344000.0, 2.7400e-4),
    ]),
    (8, &[
        (47104.0, 3.1000e-5), (141312.0, 3.1000e-5), (280576.0, 3.2000e-5), (559104.0, 3.2000e-5),
        (952320.0, 3.2000e-5), (2228224.0, 4.4000e-5), (4456448.0, 5.6000e-5), (8912896.0, 8.4000e-5),
        (15220736.0, 1.1100e-4), (35651584.0, 2.0700e-4), (57344000.0, 3.0350e-4),
    ]),
];

/// The same for `profiling/network/a100_dgx/all_reduce.csv` (DGX A100, NVSwitch): 994 intra-node
/// rows per worker count; WAPE 2.5 / 3.6 / 3.5 % at 2 / 4 / 8 workers (rows ≥ 1 MiB: 1.8 /
/// 2.7 / 2.9 %).
#[rustfmt::skip]
const A100_DGX_ALL_REDUCE: [(u32, Knots); 3] = [
    (2, &[
        (47104.0, 4.9500e-5), (141312.0, 5.1000e-5), (280576.0, 5.1000e-5), (559104.0, 5.4000e-5),
        (952320.0, 5.8000e-5), (2228224.0, 5.8000e-5), (4456448.0, 6.6000e-5), (8912896.0, 9.7000e-5),
        (15220736.0, 1.3350e-4), (35651584.0, 2.5400e-4), (57344000.0, 3.8200e-4),
    ]),
    (4, &[
        (47104.0, 2.1000e-5), (141312.0, 6.1000e-5), (280576.0, 6.2000e-5), (559104.0, 6.2000e-5),
        (952320.0, 6.3000e-5), (2228224.0, 6.3000e-5), (4456448.0, 9.0000e-5), (8912896.0, 1.3300e-4),
        (15220736.0, 1.9600e-4), (35651584.0, 3.3800e-4), (57344000.0, 5.1800e-4),
    ]),
    (8, &[
        (47104.0, 3.4500e-5), (141312.0, 5.5000e-5), (280576.0, 5.5000e-5), (559104.0, 5.5000e-5),
        (952320.0, 6.3000e-5), (2228224.0, 7.2000e-5), (4456448.0, 1.0100e-4), (8912896.0, 1.5800e-4),
        (15220736.0, 2.5050e-4), (35651584.0, 4.2000e-4), (57344000.0, 6.1700e-4),
    ]),
];

/// Share of the host link's nominal bandwidth a ring all-reduce achieves as its bus
/// bandwidth when the GPUs talk over PCIe: Vidur's `a100_pairwise_nvlink` profile (GPU pairs
/// bridged, the four GPUs otherwise on PCIe 4.0 ×16, 32 GB/s) reaches 24 GB/s of bus bandwidth
/// at 64 MiB with 4 workers (4.27 ms), 0.75 of nominal; taken 0.7, the host-copy efficiency of
/// `lifecycle::HOST_LINK_EFFICIENCY`.
const PCIE_ALL_REDUCE_EFFICIENCY: f64 = 0.7;

/// How long one all-reduce of the hidden activations takes across a replica's GPUs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AllReduce {
    /// One GPU: no collective.
    None,
    /// Interpolated in a measured profile (`node` names Vidur's folder): linear in the message
    /// size between knots, the first knot's time below it (NCCL's latency floor), and the
    /// last segment's slope beyond the last knot (bandwidth-bound).
    Profile { node: &'static str, knots: Knots },
    /// No profile for the device: `latency + 2 (t − 1) / t × bytes / bus_bandwidth`, a ring
    /// all-reduce over PCIe peer-to-peer (the catalogue has no NVLink figure): bus bandwidth
    /// `PCIE_ALL_REDUCE_EFFICIENCY` (0.7) × the host link, latency the first knot of the A100 DGX
    /// profile at the same worker count. Pessimistic for NVLink-bridged pairs (A40) and for
    /// DGX-1 V100s.
    Bandwidth { workers: u32, latency_s: f64, bus_bytes_per_s: f64 },
}

impl AllReduce {
    /// The all-reduce of a `tp`-way replica on `device`: the H100 DGX profile on Hopper parts
    /// (H100, H200: NVLink 4 on NVSwitch), the A100 DGX profile on A100s, the PCIe bandwidth
    /// model on every other device (V100, A40, L4: no network profile in the data).
    pub fn on(device: &DeviceSpec, tp: u32) -> AllReduce {
        if tp <= 1 {
            return AllReduce::None;
        }
        let pick = |table: &[(u32, Knots)]| table.iter().find(|(w, _)| *w == tp).map(|&(_, k)| k);
        let name = device.name.to_ascii_uppercase();
        let profile = if is_hopper(device) {
            pick(&H100_DGX_ALL_REDUCE).map(|k| ("h100_dgx", k))
        } else if name.contains("A100") {
            pick(&A100_DGX_ALL_REDUCE).map(|k| ("a100_dgx", k))
        } else {
            None
        };
        match profile {
            Some((node, knots)) if !knots.is_empty() => AllReduce::Profile { node, knots },
            _ => {
                // The latency floor of the nearest measured worker count at or below `tp`.
                let a100 = A100_DGX_ALL_REDUCE.iter().rev().find(|(w, _)| *w <= tp).unwrap_or(&A100_DGX_ALL_REDUCE[0]);
                let latency_s = a100.1.first().map_or(0.0, |&(_, t)| t);
                AllReduce::Bandwidth {
                    workers: tp,
                    latency_s,
                    bus_bytes_per_s: device.host_link_bandwidth * PCIE_ALL_REDUCE_EFFICIENCY,
                }
            }
        }
    }

    /// Seconds to all-reduce a message of `bytes` bytes.
    pub fn time(&self, bytes: f64) -> f64 {
        match *self {
            AllReduce::None => 0.0,
            AllReduce::Profile { knots, .. } => interpolate(knots, bytes),
            AllReduce::Bandwidth { workers, latency_s, bus_bytes_per_s } => {
                let t = f64::from(workers);
                latency_s + 2.0 * (t - 1.0) / t * bytes / bus_bytes_per_s
            }
        }
    }

    /// The measured node whose profile this is, if any.
    pub fn profile_node(&self) -> Option<&'static str> {
        match self {
            AllReduce::Profile { node, .. } => Some(node),
            _ => None,
        }
    }
}

/// Piecewise-linear interpolation in `knots` (sorted by size): flat below the first knot,
/// extended with the last segment's slope beyond the last.
fn interpolate(knots: &[(f64, f64)], x: f64) -> f64 {
    let Some(&(x0, y0)) = knots.first() else {
        return 0.0;
    };
    if x <= x0 || knots.len() == 1 {
        return y0;
    }
    let i = knots.partition_point(|&(k, _)| k <= x).clamp(1, knots.len() - 1);
    let ((xa, ya), (xb, yb)) = (knots[i - 1], knots[i]);
    ya + (yb - ya) * (x - xa) / (xb - xa)
}

/// The attention kernels vLLM 0.10.2 runs prefill with, by GPU generation
/// (`vllm/platforms/cuda.py` backend selection; `vllm/attention/utils/fa_utils.py`
/// `get_flash_attn_version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttentionKernel {
    /// The 2024 kernel of Vidur's `legacy/a100/attention.csv`, fitted (0.255 of peak on the
    /// causal pair count; it computed the whole `c · (p + c)` rectangle). Only the offline
    /// calibration uses it.
    Legacy2024Fit,
    /// FlashAttention-2 (vllm-flash-attn): the V1 `FLASH_ATTN` backend on Ampere / Ada.
    FlashAttention2,
    /// FlashAttention-3: what `get_flash_attn_version` picks on Hopper (compute capability 9).
    FlashAttention3,
    /// xformers' CUTLASS memory-efficient attention: the V0 `XFORMERS` backend vLLM falls back
    /// to on Volta ("Cannot use FlashAttention-2 backend for Volta and Turing GPUs").
    Xformers,
}

/// FlashAttention-2 forward on A100: "50–73 % of the theoretical maximum FLOPs/s" (Dao 2023,
/// arXiv 2307.08691, abstract and §4.1; up to 230 TFLOP/s of 312). The FLOP count there is the
/// causal half for causal runs, like the emulator's. The low half of the range is taken:
/// vLLM's prefill chunks are at most 2,048 tokens on A100 (the V1 default), where the paper's
/// causal, head-dim-128 curves sit at the low end, and the varlen/paged kernel adds work.
pub const FA2_PREFILL_MFU: f64 = 0.55;

/// FlashAttention-3 forward on H100: up to 740 TFLOP/s in fp16, "75 % utilization" (Shah et
/// al. 2024, arXiv 2407.08608, abstract); causal head-dim-128 runs of 1–2k tokens reach about
/// 0.5–0.65 of the 989 TFLOP/s. Taken 0.60.
pub const FA3_PREFILL_MFU: f64 = 0.60;

/// xformers (CUTLASS fMHA) forward on V100: no absolute figure is published. xformers PR #362
/// (the CUTLASS kernel) measured its fp16 forward on V100 at +25 % mean / −5 % median against
/// PyTorch's vanilla attention, which at head dim 128 runs the two GEMMs at ~55 % of the
/// 125 TFLOP/s and three passes of fp16 scores through the 900 GB/s HBM2: ≈ 0.25 of peak on
/// the full rectangle. The CUTLASS kernel skips masked tiles (causal pairs only): ≈ 0.30 of
/// peak on the causal count. An estimate with a range of 0.2–0.4.
pub const XFORMERS_V100_PREFILL_MFU: f64 = 0.30;

impl AttentionKernel {
    /// The kernel vLLM 0.10.2 runs prefill attention with on `device`: xformers under the V0
    /// engine (Volta), FlashAttention-3 on Hopper, FlashAttention-2 elsewhere.
    pub fn on(device: &DeviceSpec) -> AttentionKernel {
        if crate::lifecycle::EngineGeneration::on(device) == crate::lifecycle::EngineGeneration::V0 {
            AttentionKernel::Xformers
        } else if is_hopper(device) {
            AttentionKernel::FlashAttention3
        } else {
            AttentionKernel::FlashAttention2
        }
    }

    /// Achieved fraction of the dense fp16 tensor peak on causal prefill FLOPs.
    pub fn prefill_mfu(self) -> f64 {
        match self {
            AttentionKernel::Legacy2024Fit => AMPERE.attn_prefill_mfu,
            AttentionKernel::FlashAttention2 => FA2_PREFILL_MFU,
            AttentionKernel::FlashAttention3 => FA3_PREFILL_MFU,
            AttentionKernel::Xformers => XFORMERS_V100_PREFILL_MFU,
        }
    }
}

fn is_hopper(device: &DeviceSpec) -> bool {
    let name = device.name.to_ascii_uppercase();
    ["H100", "H200", "H800", "H20"].iter().any(|h| name.contains(h))
}

impl Efficiency {
    /// The constants the emulator serves `device` with: the fitted linear and element-wise
    /// constants of its class (the Hopper fit for Hopper parts, the Ampere fit for everything
    /// else, by roofline extrapolation for V100, A40, L4 and unknown devices) and the prefill
    /// attention efficiency of the kernel vLLM 0.10.2 runs there ([`AttentionKernel::on`]).
    pub(crate) fn calibrated_for(device: &DeviceSpec) -> Efficiency {
        let mut eff = Self::fitted_for(device);
        eff.attn_prefill_mfu = AttentionKernel::on(device).prefill_mfu();
        eff
    }

    /// The constants exactly as fitted to Vidur's profiles (the attention ones to the 2024
    /// legacy kernel): what `tests/calibration.rs` checks against the measurements.
    pub fn fitted_for(device: &DeviceSpec) -> Efficiency {
        if is_hopper(device) { HOPPER } else { AMPERE }
    }
}

/// Per-operator times of one transformer layer over `num_tokens` tokens, in seconds, named
/// after Vidur's operator columns; plus the two per-layer kernels Vidur does not list
/// separately (q/k norm of Qwen3, the KV-cache write).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct OpTimes {
    pub emb: f64,
    pub input_layernorm: f64,
    pub attn_pre_proj: f64,
    pub attn_rope: f64,
    pub attn_post_proj: f64,
    pub post_attention_layernorm: f64,
    pub mlp_up_proj: f64,
    pub mlp_act: f64,
    pub mlp_down_proj: f64,
    pub add: f64,
    pub qk_norm: f64,
    pub kv_cache_save: f64,
}

impl OpTimes {
    /// The per-layer kernels (everything but the embedding, which runs once per iteration).
    pub fn layer_sum(&self) -> f64 {
        self.input_layernorm
            + self.attn_pre_proj
            + self.qk_norm
            + self.attn_rope
            + self.kv_cache_save
            + self.attn_post_proj
            + self.post_attention_layernorm
            + self.mlp_up_proj
            + self.mlp_act
            + self.mlp_down_proj
            + self.add
    }
}

/// One prefill chunk of a batch: `tokens` new prompt tokens computed on top of
/// `cached_context` tokens already in the KV cache (prefix-cache hit or earlier chunks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefillChunk {
    pub tokens: u32,
    pub cached_context: u32,
}

/// The shape of one iteration's batch, as a list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchShape {
    pub prefills: Vec<PrefillChunk>,
    /// For each decoding sequence, the tokens already in its KV cache; its one new token
    /// attends to those and to itself.
    pub decode_contexts: Vec<u32>,
}

impl BatchShape {
    /// The sums the cost model needs.
    pub fn summary(&self) -> BatchSummary {
        let mut s = BatchSummary::default();
        for p in &self.prefills {
            s.add_chunk(p.tokens, p.cached_context);
        }
        for &c in &self.decode_contexts {
            s.add_decode(c);
        }
        s
    }
}

/// The sufficient statistics of a batch: what the replica accumulates while it forms a batch,
/// without building a list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchSummary {
    /// Sequences in the batch (each gets its logits computed).
    pub requests: u32,
    /// Tokens computed this iteration (prefill-chunk tokens plus one per decode).
    pub tokens: u64,
    /// Prefill query–key pairs: Σ over chunks of `c·p + c(c+1)/2`.
    pub prefill_pairs: f64,
    /// Keys/values read by prefill attention: Σ over chunks of `p + c`.
    pub prefill_kv_tokens: u64,
    /// Query tokens of prefill chunks.
    pub prefill_tokens: u64,
    pub decode_requests: u32,
    /// Keys/values read by decode attention: Σ over decodes of `context + 1`.
    pub decode_kv_tokens: u64,
}

impl BatchSummary {
    /// Adds one sequence computing `tokens` tokens on top of `cached_context` cached ones. A
    /// single token on top of a non-empty context is a decode; anything else a prefill chunk.
    pub fn add_chunk(&mut self, tokens: u32, cached_context: u32) {
        if tokens == 0 {
            return;
        }
        if tokens == 1 && cached_context > 0 {
            self.add_decode(cached_context);
            return;
        }
        let (c, p) = (f64::from(tokens), f64::from(cached_context));
        self.requests += 1;
        self.tokens += u64::from(tokens);
        self.prefill_tokens += u64::from(tokens);
        self.prefill_pairs += c * p + c * (c + 1.0) / 2.0;
        self.prefill_kv_tokens += u64::from(tokens) + u64::from(cached_context);
    }

    /// Adds one decoding sequence with `context` tokens already cached.
    pub fn add_decode(&mut self, context: u32) {
        self.requests += 1;
        self.tokens += 1;
        self.decode_requests += 1;
        self.decode_kv_tokens += u64::from(context) + 1;
    }

    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }
}

/// FP32 matmuls run on CUDA cores, not tensor cores: about 1/16 of the dense fp16 tensor peak
/// (A100 datasheet: 19.5 vs 312 TFLOP/s; H100 SXM: 67 vs 989). Fp8 weights are costed at the
/// fp16 peak (weight-only kernels on Ampere; conservative on Hopper, whose fp8 tensor cores
/// are twice as fast).
const FP32_PEAK_FRACTION: f64 = 1.0 / 16.0;

/// The cost model of one (device, model, dtype, tensor-parallel degree), with every per-call
/// constant precomputed so an iteration costs a few dozen floating-point operations.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// What one GPU computes: the model's shape sharded by `tp` ([`ModelShape::shard`]).
    shape: ModelShape,
    /// GPUs of the replica (1: no tensor parallelism).
    tp: u32,
    /// The collective after each row-parallel layer and the embedding (`None` at `tp` = 1).
    all_reduce: AllReduce,
    eff: Efficiency,
    /// Achievable peak FLOP/s in this dtype.
    peak: f64,
    /// Datasheet memory bandwidth, bytes/s.
    bw: f64,
    /// Bytes per weight element.
    wb: f64,
    /// Bytes per activation element (activations stay in 16-bit for fp8 weights).
    ab: f64,
    /// Bytes per KV-cache element.
    kvb: f64,
}

impl CostModel {
    /// The calibrated cost model of `shape` served in `dtype` on `device`.
    pub fn new(device: &DeviceSpec, shape: ModelShape, dtype: Dtype) -> Self {
        Self::with_efficiency(device, shape, dtype, Efficiency::calibrated_for(device))
    }

    /// The calibrated cost model of a catalogue model.
    pub fn for_arch(device: &DeviceSpec, model: &ModelArch, dtype: Dtype) -> Self {
        Self::new(device, ModelShape::from_arch(model), dtype)
    }

    /// The calibrated cost model of `shape` served in `dtype` on `tp` GPUs of `device`'s kind
    /// in one node (tensor parallel; `tp` = 1 is [`CostModel::new`]).
    pub fn tensor_parallel(device: &DeviceSpec, shape: ModelShape, dtype: Dtype, tp: u32) -> Self {
        Self::with_efficiency_tp(device, shape, dtype, Efficiency::calibrated_for(device), tp)
    }

    /// [`CostModel::tensor_parallel`] of a catalogue model.
    pub fn for_arch_tp(device: &DeviceSpec, model: &ModelArch, dtype: Dtype, tp: u32) -> Self {
        Self::tensor_parallel(device, ModelShape::from_arch(model), dtype, tp)
    }

    /// A cost model with explicit efficiency constants (used by the offline calibration).
    pub fn with_efficiency(
        device: &DeviceSpec,
        shape: ModelShape,
        dtype: Dtype,
        eff: Efficiency,
    ) -> Self {
        Self::with_efficiency_tp(device, shape, dtype, eff, 1)
    }

    /// A cost model with explicit efficiency constants on `tp` GPUs (`shape` is the whole
    /// model's; each GPU computes `shape.shard(tp)`).
    pub fn with_efficiency_tp(device: &DeviceSpec, shape: ModelShape, dtype: Dtype, eff: Efficiency, tp: u32) -> Self {
        let tp = tp.max(1);
        debug_assert!(tp == 1 || shape.linear.is_none(), "tensor parallelism of a hybrid model is not modelled");
        let peak = match dtype {
            Dtype::Fp32 => device.dense_fp16_flops * FP32_PEAK_FRACTION,
            Dtype::Bf16 | Dtype::Fp16 | Dtype::Fp8 => device.dense_fp16_flops,
        };
        let bytes = dtype.bytes() as f64;
        CostModel {
            shape: shape.shard(tp),
            tp,
            all_reduce: AllReduce::on(device, tp),
            eff,
            peak,
            bw: device.memory_bandwidth,
            wb: bytes,
            ab: bytes.max(2.0),
            kvb: bytes,
        }
    }

    /// The same model reading and writing its KV cache in `kv_dtype` (vLLM's
    /// `--kv-cache-dtype`; by default the weights' format).
    pub fn with_kv_dtype(mut self, kv_dtype: Dtype) -> Self {
        self.kvb = kv_dtype.bytes() as f64;
        self
    }

    /// The shape one GPU computes (the whole model's at `tp` = 1).
    pub fn shape(&self) -> &ModelShape {
        &self.shape
    }

    /// GPUs of the replica.
    pub fn tensor_parallel_degree(&self) -> u32 {
        self.tp
    }

    /// The all-reduce the replica's layers wait for.
    pub fn all_reduce(&self) -> &AllReduce {
        &self.all_reduce
    }

    /// Seconds of one all-reduce of the hidden activations of `tokens` tokens
    /// (`tokens × hidden × activation bytes`); zero at `tp` = 1.
    pub fn all_reduce_time(&self, tokens: u64) -> f64 {
        self.all_reduce.time(tokens as f64 * self.shape.hidden as f64 * self.ab)
    }

    /// One linear op `[tokens × k] · [k × n]`: a smoothed roofline plus a launch time.
    fn linear(&self, k: f64, n: f64, tokens: f64) -> f64 {
        // flops / (peak × mfu × t / (t + half)) = 2·k·n·(t + half) / (peak × mfu).
        let compute = 2.0 * k * n * (tokens + self.eff.linear_mfu_half_tokens)
            / (self.peak * self.eff.linear_mfu);
        let bytes = k * n * self.wb + tokens * (k + n) * self.ab;
        let memory = bytes / (self.bw * self.eff.linear_mbu);
        smooth_max(compute, memory, self.eff.linear_sharpness) + self.eff.linear_launch_s
    }

    /// One bandwidth-bound element-wise kernel moving `bytes`.
    fn elementwise(&self, bytes: f64, k: KernelEff) -> f64 {
        bytes / (self.bw * k.mbu) + k.launch_s
    }

    /// Per-operator times of one layer over `num_tokens` tokens (and the embedding).
    pub fn op_times(&self, num_tokens: u64) -> OpTimes {
        if num_tokens == 0 {
            return OpTimes::default();
        }
        let s = &self.shape;
        let n = num_tokens as f64;
        let (h, q, kv, i) = (
            s.hidden as f64,
            s.q_width as f64,
            s.kv_width as f64,
            s.intermediate as f64,
        );
        let ab = self.ab;
        let e = &self.eff;
        let norm = self.elementwise(2.0 * n * h * ab, e.norm);
        let up_width = if s.gated_mlp { 2.0 * i } else { i };
        let act_bytes = if s.gated_mlp {
            3.0 * n * i * ab
        } else {
            2.0 * n * i * ab
        };
        OpTimes {
            emb: self.elementwise(2.0 * n * h * ab, e.emb),
            input_layernorm: norm,
            attn_pre_proj: self.linear(h, if s.attn_output_gate { 2.0 * q } else { q } + 2.0 * kv, n),
            attn_rope: self.elementwise(2.0 * n * (q + kv) * ab, e.rope),
            attn_post_proj: self.linear(q, h, n),
            post_attention_layernorm: norm,
            mlp_up_proj: self.linear(h, up_width, n),
            mlp_act: self.elementwise(act_bytes, e.act),
            mlp_down_proj: self.linear(i, h, n),
            add: self.elementwise(3.0 * n * h * ab, e.add),
            qk_norm: if s.qk_norm {
                self.elementwise(2.0 * n * (q + kv) * ab, e.norm)
            } else {
                0.0
            },
            kv_cache_save: self.elementwise(2.0 * n * kv * (ab + self.kvb), e.rope),
        }
    }

    /// Attention time of one layer for the batch: a prefill roofline over the chunks'
    /// query–key pairs and a decode roofline over the KV bytes the decodes read.
    pub fn attention_time(&self, b: &BatchSummary) -> f64 {
        let s = &self.shape;
        let (q, kv) = (s.q_width as f64, s.kv_width as f64);
        let mut t = 0.0;
        if b.prefill_tokens > 0 {
            let flops = 4.0 * q * b.prefill_pairs;
            let bytes = b.prefill_kv_tokens as f64 * 2.0 * kv * self.kvb
                + b.prefill_tokens as f64 * 2.0 * q * self.ab;
            t += self.attention_kernel(flops, bytes);
        }
        if b.decode_requests > 0 {
            let flops = 4.0 * q * b.decode_kv_tokens as f64;
            let bytes = b.decode_kv_tokens as f64 * 2.0 * kv * self.kvb
                + f64::from(b.decode_requests) * 2.0 * q * self.ab;
            t += self.attention_kernel(flops, bytes);
        }
        t
    }

    /// The token-level kernels of one Gated DeltaNet layer over `num_tokens` tokens (0 for a
    /// dense model): the fused q/k/v/z and β/decay projections, the causal convolution (an
    /// element-wise pass over its channels), the L2 norms of q and k, the gated RMSNorm of the
    /// output, the output projection, and the layer's norms, gated MLP and residual adds
    /// exactly as in an attention layer (`ops`). The recurrence itself is
    /// [`recurrence_time`](Self::recurrence_time).
    fn linear_layer_sum(&self, ops: &OpTimes, num_tokens: u64) -> f64 {
        let (Some(l), true) = (self.shape.linear, num_tokens > 0) else {
            return 0.0;
        };
        let n = num_tokens as f64;
        let (h, kw, vw) = (self.shape.hidden as f64, l.key_width as f64, l.value_width as f64);
        let ab = self.ab;
        let e = &self.eff;
        let in_proj = self.linear(h, 2.0 * kw + 2.0 * vw + 2.0 * l.value_heads as f64, n);
        let conv = self.elementwise(2.0 * n * (2.0 * kw + vw) * ab, e.act);
        let qk_l2norm = self.elementwise(2.0 * n * 2.0 * kw * ab, e.norm);
        let gated_norm = self.elementwise(3.0 * n * vw * ab, e.norm);
        let out_proj = self.linear(vw, h, n);
        ops.input_layernorm
            + in_proj
            + conv
            + qk_l2norm
            + gated_norm
            + out_proj
            + ops.post_attention_layernorm
            + ops.mlp_up_proj
            + ops.mlp_act
            + ops.mlp_down_proj
            + ops.add
    }

    /// The gated delta rule of one Gated DeltaNet layer for the batch (0 for a dense model),
    /// as rooflines at the attention kernels' efficiencies (an assumption: no profile of these
    /// kernels exists here). A decode step reads and writes each sequence's whole state
    /// (`value_heads × key_head_dim × value_head_dim`, fp32 in Qwen3.5) and computes ≈ 6 FLOPs
    /// per state element (S·k, the rank-one update, S·q); a prefill chunk reads and writes the
    /// state once and computes, per token, the same state products plus the intra-chunk
    /// attention over chunks of 64 tokens (`2 · 64 · (dk + dv)` per value head).
    pub fn recurrence_time(&self, b: &BatchSummary) -> f64 {
        let Some(l) = self.shape.linear else {
            return 0.0;
        };
        let per_token_state = (l.value_heads * l.key_head_dim * l.value_head_dim) as f64;
        let mut t = 0.0;
        let prefills = b.requests.saturating_sub(b.decode_requests);
        if b.prefill_tokens > 0 {
            let tokens = b.prefill_tokens as f64;
            let flops = tokens
                * (6.0 * per_token_state
                    + l.value_heads as f64 * 2.0 * GDN_CHUNK * (l.key_head_dim + l.value_head_dim) as f64);
            let bytes = f64::from(prefills) * 2.0 * l.state_bytes as f64
                + tokens * (2.0 * l.key_width as f64 + 2.0 * l.value_width as f64) * self.ab;
            t += self.attention_kernel(flops, bytes);
        }
        if b.decode_requests > 0 {
            let seqs = f64::from(b.decode_requests);
            let flops = seqs * 6.0 * per_token_state;
            let bytes = seqs * (2.0 * l.state_bytes as f64 + (2.0 * l.key_width as f64 + 2.0 * l.value_width as f64) * self.ab);
            t += self.attention_kernel(flops, bytes);
        }
        t
    }

    /// One attention-class kernel (attention itself, the gated delta rule) moving `bytes` and
    /// computing `flops`: a smoothed roofline at the attention efficiencies plus a launch.
    fn attention_kernel(&self, flops: f64, bytes: f64) -> f64 {
        let e = &self.eff;
        smooth_max(flops / (self.peak * e.attn_prefill_mfu), bytes / (self.bw * e.attn_mbu), e.linear_sharpness)
            + e.attn_launch_s
    }

    /// Host-side engine overhead of one iteration over `requests` sequences (the fit of the
    /// replica's TP degree; TP = 8 takes TP = 4's).
    pub fn cpu_overhead(&self, requests: u32) -> f64 {
        if self.tp == 1 {
            return CPU_OVERHEAD_BASE_S + CPU_OVERHEAD_PER_SEQ_S * f64::from(requests);
        }
        let &(_, base, per_seq) =
            CPU_OVERHEAD_TP.iter().rev().find(|(t, _, _)| *t <= self.tp).unwrap_or(&CPU_OVERHEAD_TP[0]);
        base + per_seq * f64::from(requests)
    }

    /// The time of one iteration, noise-free: all layers, the embedding, the final norm, the
    /// LM head over the batch's sequences and the CPU overhead (at `tp` > 1: on one GPU's
    /// shard, plus two all-reduces per layer, one after the embedding and the logits'
    /// all-gather). Zero for an empty batch.
    pub fn iteration_time(&self, b: &BatchSummary) -> f64 {
        if b.is_empty() {
            return 0.0;
        }
        self.combine(self.token_terms(b.tokens), self.request_terms(b.requests), b)
    }

    /// The terms of an iteration that depend only on the tokens computed. At `tp` > 1 the
    /// all-reduces join them: two per layer, one after the vocab-parallel embedding.
    fn token_terms(&self, tokens: u64) -> TokenTerms {
        let ops = self.op_times(tokens);
        let mut terms = TokenTerms {
            layer_sum: ops.layer_sum(),
            linear_layer_sum: self.linear_layer_sum(&ops, tokens),
            emb: ops.emb,
            input_layernorm: ops.input_layernorm,
        };
        if self.tp > 1 {
            let all_reduce = self.all_reduce_time(tokens);
            terms.layer_sum += 2.0 * all_reduce;
            terms.emb += all_reduce;
        }
        terms
    }

    /// The terms of an iteration that depend only on the sequences in the batch. At `tp` > 1
    /// the LM head computes `vocab / tp` logits per sequence and the V1 engine all-gathers
    /// them on every rank for its sampler (vLLM's `Platform.use_all_gather`); costed as an
    /// all-reduce of half the gathered bytes, the same ring traffic per GPU.
    fn request_terms(&self, requests: u32) -> RequestTerms {
        let s = &self.shape;
        let mut terms = RequestTerms {
            lm_head: self.linear(s.hidden as f64, s.vocab as f64, f64::from(requests)),
            cpu: self.cpu_overhead(requests),
        };
        if self.tp > 1 {
            let gathered = f64::from(requests) * (s.vocab * u64::from(self.tp)) as f64 * self.ab;
            terms.lm_head += self.all_reduce.time(gathered / 2.0);
        }
        terms
    }

    /// [`iteration_time`](Self::iteration_time) from its precomputed terms, in the same order
    /// of floating-point operations (so with the same bits).
    fn combine(&self, t: TokenTerms, r: RequestTerms, b: &BatchSummary) -> f64 {
        let per_layer = t.layer_sum + self.attention_time(b);
        match self.shape.linear {
            None => self.shape.num_layers as f64 * per_layer + t.emb + t.input_layernorm + r.lm_head + r.cpu,
            Some(l) => {
                let per_linear_layer = t.linear_layer_sum + self.recurrence_time(b);
                self.shape.attention_layers() as f64 * per_layer
                    + l.layers as f64 * per_linear_layer
                    + t.emb
                    + t.input_layernorm
                    + r.lm_head
                    + r.cpu
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenTerms {
    layer_sum: f64,
    /// One Gated DeltaNet layer's token-level kernels (0 for a dense model).
    linear_layer_sum: f64,
    emb: f64,
    input_layernorm: f64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestTerms {
    lm_head: f64,
    cpu: f64,
}

/// Batches up to this many tokens (and sequences) have their terms memoised by
/// [`IterationCost`]: decode steps compute one token per sequence, so these are the batches a
/// replica repeats step after step.
const MEMO_LIMIT: usize = 1024;

/// A cost model with the terms that depend only on the batch's token and sequence counts
/// memoised (the per-operator rooflines and the LM head: ten `powf`s per iteration). The
/// attention term, which depends on the contexts, is computed every time. Gives exactly the
/// bits of [`CostModel::iteration_time`]; the memo grows on demand to at most
/// [`MEMO_LIMIT`] entries of each kind.
#[derive(Debug, Clone)]
pub struct IterationCost {
    model: CostModel,
    tokens: Vec<Option<TokenTerms>>,
    requests: Vec<Option<RequestTerms>>,
}

impl IterationCost {
    pub fn new(model: CostModel) -> Self {
        IterationCost { model, tokens: Vec::new(), requests: Vec::new() }
    }

    pub fn model(&self) -> &CostModel {
        &self.model
    }

    /// [`CostModel::iteration_time`], memoised.
    pub fn iteration_time(&mut self, b: &BatchSummary) -> f64 {
        if b.is_empty() {
            return 0.0;
        }
        let terms = self.terms(b.tokens, b.requests);
        self.model.combine(terms.0, terms.1, b)
    }

    /// The memoised terms of batches of `tokens` tokens over `requests` sequences, for
    /// [`with_terms`](Self::with_terms) (a caller costing many such batches in a row).
    pub(crate) fn terms(&mut self, tokens: u64, requests: u32) -> (TokenTerms, RequestTerms) {
        let model = &self.model;
        let t = memo(&mut self.tokens, tokens as usize, || model.token_terms(tokens));
        let r = memo(&mut self.requests, requests as usize, || model.request_terms(requests));
        (t, r)
    }

    /// [`iteration_time`](Self::iteration_time) of a non-empty batch `b` whose
    /// [`terms`](Self::terms) are `terms`.
    pub(crate) fn with_terms(&self, terms: (TokenTerms, RequestTerms), b: &BatchSummary) -> f64 {
        self.model.combine(terms.0, terms.1, b)
    }
}

/// The value memoised at `i` (computed and kept on first use), or computed when `i` is past
/// the memo's limit.
fn memo<T: Copy>(table: &mut Vec<Option<T>>, i: usize, compute: impl FnOnce() -> T) -> T {
    if i >= MEMO_LIMIT {
        return compute();
    }
    if table.len() <= i {
        table.resize(i + 1, None);
    }
    *table[i].get_or_insert_with(compute)
}

/// `(aᵖ + bᵖ)^(1/p)`, computed relative to the larger term so it cannot overflow.
fn smooth_max(a: f64, b: f64, p: f64) -> f64 {
    let (m, r) = if a >= b { (a, b) } else { (b, a) };
    if m <= 0.0 {
        return 0.0;
    }
    // The larger term over itself is exactly 1 (and 1ᵖ = 1): one `powf` fewer, same bits.
    m * (1.0 + (r / m).powf(p)).powf(1.0 / p)
}

/// The noise-free time of one iteration of `model` served in `dtype` on `device`.
pub fn iteration_time(
    device: &DeviceSpec,
    model: &ModelArch,
    dtype: Dtype,
    batch: &BatchShape,
) -> f64 {
    CostModel::for_arch(device, model, dtype).iteration_time(&batch.summary())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use switchyard_predictor::spec::{device, model};

    fn qwen8b_a100() -> CostModel {
        CostModel::for_arch(
            &device("A100-40GB").unwrap(),
            &model("Qwen3-8B").unwrap(),
            Dtype::Bf16,
        )
    }

    /// A hybrid model (Qwen3.5-9B on an H100): attention runs on 8 of its 32 layers, and a
    /// decode step of the other 24 is bound by reading and writing each sequence's 2.1 MB of
    /// state per layer — a term a dense model of its size does not have, linear in the
    /// sequences and independent of their contexts.
    #[test]
    fn a_hybrid_decode_step_moves_every_sequences_state() {
        let dev = device("H100-80GB").unwrap();
        let hybrid = CostModel::for_arch(&dev, &model("Qwen3.5-9B").unwrap(), Dtype::Bf16);
        let shape = *hybrid.shape();
        let l = shape.linear.unwrap();
        assert_eq!((shape.attention_layers(), l.layers), (8, 24));
        assert_eq!(l.state_bytes, 32 * 128 * 128 * 4 + 3 * (2 * 2048 + 4096) * 2);
        let decodes = |n: u32, ctx: u32| {
            let mut b = BatchSummary::default();
            for _ in 0..n {
                b.add_decode(ctx);
            }
            b
        };
        // By hand: 64 sequences × 2 × 2,146,304 bytes over the bandwidth at the attention
        // kernels' efficiency; the FLOPs (6 per state element) are far below their roofline.
        let e = Efficiency::calibrated_for(&dev);
        let b = decodes(64, 2000);
        let memory = 64.0 * (2.0 * l.state_bytes as f64 + (2.0 * 2048.0 + 2.0 * 4096.0) * 2.0) / (dev.memory_bandwidth * e.attn_mbu);
        let t = hybrid.recurrence_time(&b) - e.attn_launch_s;
        assert!(t >= memory && t <= memory * 2f64.powf(1.0 / e.linear_sharpness), "{t} vs {memory}");
        // Independent of the contexts; the attention layers' term is not.
        assert_eq!(hybrid.recurrence_time(&decodes(64, 100)), hybrid.recurrence_time(&decodes(64, 30000)));
        assert!(hybrid.iteration_time(&decodes(64, 30000)) > hybrid.iteration_time(&decodes(64, 100)));
        // A dense model has no such term; at long contexts its decode (36 attention layers of
        // 8 KV heads of 128) costs more than the hybrid's (8 of 4 × 256).
        let dense = CostModel::for_arch(&dev, &model("Qwen3-8B").unwrap(), Dtype::Bf16);
        assert_eq!(dense.recurrence_time(&b), 0.0);
        assert!(dense.iteration_time(&decodes(64, 30000)) > hybrid.iteration_time(&decodes(64, 30000)));
        // Prefill: one state read and write per chunk, the chunked kernel's FLOPs per token.
        let mut p = BatchSummary::default();
        p.add_chunk(4096, 0);
        assert!(hybrid.recurrence_time(&p) > 0.0);
        let memo = IterationCost::new(hybrid.clone()).iteration_time(&p);
        assert_eq!(memo.to_bits(), hybrid.iteration_time(&p).to_bits());
    }

    #[test]
    fn smooth_max_bounds() {
        assert_eq!(smooth_max(0.0, 0.0, 3.0), 0.0);
        let v = smooth_max(3.0, 4.0, 2.0);
        assert!((v - 5.0).abs() < 1e-12);
        // Always between max(a, b) and a + b.
        let v = smooth_max(1.0, 1e-9, 3.0);
        assert!((v - 1.0).abs() < 1e-9);
    }

    #[test]
    fn linear_op_by_hand() {
        // A 4096 × 4096 bf16 matrix for one token on an A100-40GB is bandwidth-bound:
        // bytes = 4096² × 2 + 1 × 8192 × 2 = 33,570,816; time ≈ bytes / (1,555e9 × mbu),
        // the compute term is ~1/300 of it, so the smooth max adds < 0.1 %.
        let c = qwen8b_a100();
        let bytes = 4096.0 * 4096.0 * 2.0 + 8192.0 * 2.0;
        let memory = bytes / (1555e9 * AMPERE.linear_mbu);
        let got = c.linear(4096.0, 4096.0, 1.0) - AMPERE.linear_launch_s;
        assert!((got - memory).abs() / memory < 1e-3, "{got} vs {memory}");
        // At 8,192 tokens it is compute-bound: flops / (peak × mfu(n)).
        let mfu = AMPERE.linear_mfu * 8192.0 / (8192.0 + AMPERE.linear_mfu_half_tokens);
        let compute = 2.0 * 8192.0 * 4096.0 * 4096.0 / (312e12 * mfu);
        let got = c.linear(4096.0, 4096.0, 8192.0) - AMPERE.linear_launch_s;
        assert!(got >= compute && got < compute * 1.05, "{got} vs {compute}");
    }

    #[test]
    fn elementwise_by_hand() {
        let c = qwen8b_a100();
        let ops = c.op_times(1000);
        // RMSNorm reads and writes 1000 × 4096 bf16 values.
        let want = 2.0 * 1000.0 * 4096.0 * 2.0 / (1555e9 * AMPERE.norm.mbu) + AMPERE.norm.launch_s;
        assert!((ops.input_layernorm - want).abs() < 1e-15);
        assert!(ops.qk_norm > 0.0, "Qwen3 has q/k norms");
    }

    #[test]
    fn prefill_attention_pairs_by_hand() {
        // A 4-token chunk on 10 cached tokens: 4·10 + 4·5/2 = 50 query–key pairs.
        let mut s = BatchSummary::default();
        s.add_chunk(4, 10);
        assert_eq!(s.prefill_pairs, 50.0);
        assert_eq!(s.prefill_kv_tokens, 14);
        assert_eq!(s.tokens, 4);
        // A single token on a context is a decode reading context + 1 keys.
        s.add_chunk(1, 99);
        assert_eq!(
            (s.decode_requests, s.decode_kv_tokens, s.requests, s.tokens),
            (1, 100, 2, 5)
        );
    }

    #[test]
    fn decode_attention_is_bandwidth_bound() {
        let c = qwen8b_a100();
        let mut s = BatchSummary::default();
        for _ in 0..64 {
            s.add_decode(2047);
        }
        // 64 × 2048 tokens × 2 × 1024 (8 kv heads × 128) × 2 bytes per layer.
        let bytes = 64.0 * 2048.0 * 2.0 * 1024.0 * 2.0 + 64.0 * 2.0 * 4096.0 * 2.0;
        let memory = bytes / (1555e9 * AMPERE.attn_mbu);
        let got = c.attention_time(&s) - AMPERE.attn_launch_s;
        assert!(got >= memory && got < memory * 1.1, "{got} vs {memory}");
    }

    #[test]
    fn cpu_overhead_is_linear_in_sequences() {
        let c = qwen8b_a100();
        let d = c.cpu_overhead(101) - c.cpu_overhead(1);
        assert!((d - 100.0 * CPU_OVERHEAD_PER_SEQ_S).abs() < 1e-12);
    }

    #[test]
    fn empty_batch_costs_nothing() {
        assert_eq!(qwen8b_a100().iteration_time(&BatchSummary::default()), 0.0);
    }

    #[test]
    fn faster_devices_are_faster() {
        let m = model("Qwen3-8B").unwrap();
        let mut b = BatchShape::default();
        b.prefills.push(PrefillChunk {
            tokens: 2048,
            cached_context: 0,
        });
        b.decode_contexts = vec![1000; 32];
        let t = |d: &str| iteration_time(&device(d).unwrap(), &m, Dtype::Bf16, &b);
        assert!(t("H100-80GB") < t("A100-80GB"));
        assert!(t("A100-80GB") <= t("A100-40GB"));
        assert!(t("A100-40GB") < t("L4"));
    }

    #[test]
    fn hopper_parts_get_the_hopper_fit() {
        assert_eq!(Efficiency::fitted_for(&device("H200-141GB").unwrap()), HOPPER);
        assert_eq!(Efficiency::fitted_for(&device("V100-32GB").unwrap()), AMPERE);
        let h200 = Efficiency::calibrated_for(&device("H200-141GB").unwrap());
        assert_eq!(h200, Efficiency { attn_prefill_mfu: FA3_PREFILL_MFU, ..HOPPER });
    }

    /// vLLM 0.10.2's prefill kernel per generation, and the achieved fraction of peak of a
    /// fresh 2,048-token causal prefill (compute-bound) within the published ranges:
    /// FlashAttention-2 50–73 % on A100 (Dao 2023), FlashAttention-3 up to 75 % on H100
    /// (Shah et al. 2024), xformers on V100 0.2–0.4 (estimate from xformers PR #362).
    #[test]
    fn prefill_attention_runs_at_the_kernels_published_efficiency() {
        let cases = [
            ("A100-40GB", AttentionKernel::FlashAttention2, 0.50, 0.73),
            ("A100-80GB", AttentionKernel::FlashAttention2, 0.50, 0.73),
            ("L4", AttentionKernel::FlashAttention2, 0.50, 0.73),
            ("H100-80GB", AttentionKernel::FlashAttention3, 0.50, 0.75),
            ("V100-32GB", AttentionKernel::Xformers, 0.20, 0.40),
        ];
        let m = model("Qwen3-8B").unwrap();
        for (name, kernel, lo, hi) in cases {
            let d = device(name).unwrap();
            assert_eq!(AttentionKernel::on(&d), kernel, "{name}");
            let c = CostModel::for_arch(&d, &m, Dtype::Fp16);
            let mut b = BatchSummary::default();
            b.add_chunk(2048, 0);
            let flops = 4.0 * c.shape().q_width as f64 * b.prefill_pairs;
            let t = c.attention_time(&b) - c.eff.attn_launch_s;
            let achieved = flops / t / d.dense_fp16_flops;
            assert!((lo..=hi).contains(&achieved), "{name}: {achieved:.3} of peak");
            assert!((achieved / kernel.prefill_mfu() - 1.0).abs() < 0.03, "{name}: compute-bound");
        }
        // The legacy fit is 2.2x slower than FlashAttention-2 on the same chunk.
        assert!((FA2_PREFILL_MFU / AttentionKernel::Legacy2024Fit.prefill_mfu() - 2.16).abs() < 0.01);
    }

    /// At TP = 1 the tensor-parallel constructor is the single-GPU model, to the bit.
    #[test]
    fn tensor_parallel_one_is_the_single_gpu_model() {
        for (d, m) in [("A100-40GB", "Qwen3-8B"), ("H100-80GB", "Qwen3-32B"), ("V100-32GB", "Qwen3-4B")] {
            let (d, m) = (device(d).unwrap(), model(m).unwrap());
            let one = CostModel::for_arch(&d, &m, Dtype::Fp16);
            let tp1 = CostModel::for_arch_tp(&d, &m, Dtype::Fp16, 1);
            assert_eq!(one, tp1);
            assert_eq!(*tp1.all_reduce(), AllReduce::None);
            let mut b = BatchSummary::default();
            b.add_chunk(1500, 300);
            for c in [10, 4000, 9000] {
                b.add_decode(c);
            }
            assert_eq!(one.iteration_time(&b).to_bits(), tp1.iteration_time(&b).to_bits());
        }
    }

    #[test]
    fn all_reduce_interpolates_its_profile() {
        let knots: &[(f64, f64)] = &[(1000.0, 1e-5), (3000.0, 3e-5), (5000.0, 4e-5)];
        assert_eq!(interpolate(knots, 10.0), 1e-5, "flat below the first knot");
        assert_eq!(interpolate(knots, 3000.0), 3e-5);
        assert!((interpolate(knots, 2000.0) - 2e-5).abs() < 1e-18);
        assert!((interpolate(knots, 4000.0) - 3.5e-5).abs() < 1e-18);
        assert!((interpolate(knots, 7000.0) - 5e-5).abs() < 1e-18, "the last slope beyond");

        // By device family; no collective on one GPU; PCIe where no profile exists.
        let h100 = AllReduce::on(&device("H100-80GB").unwrap(), 2);
        assert_eq!(h100.profile_node(), Some("h100_dgx"));
        assert_eq!(AllReduce::on(&device("H200-141GB").unwrap(), 4).profile_node(), Some("h100_dgx"));
        assert_eq!(AllReduce::on(&device("A100-40GB").unwrap(), 8).profile_node(), Some("a100_dgx"));
        assert_eq!(AllReduce::on(&device("A100-80GB").unwrap(), 1), AllReduce::None);
        let l4 = device("L4").unwrap();
        let pcie = AllReduce::on(&l4, 2);
        assert_eq!(pcie.profile_node(), None);
        let AllReduce::Bandwidth { latency_s, .. } = pcie else { panic!("{pcie:?}") };
        // Two workers: each sends and receives the message once over 0.7 × 32 GB/s.
        let want = latency_s + 64e6 / (0.7 * l4.host_link_bandwidth);
        assert!((pcie.time(64e6) - want).abs() < 1e-12);

        // 32 decode tokens of Qwen3-32B (32 × 5,120 × 2 B) on two H100s: between the knots
        // (280,576 B, 38 µs) and (559,104 B, 41 µs) of the measured profile.
        let want = 38e-6 + 3e-6 * (327_680.0 - 280_576.0) / (559_104.0 - 280_576.0);
        assert!((h100.time(327_680.0) - want).abs() < 1e-15);
        // Every profile is non-decreasing in the size, from bytes to gigabytes.
        for d in ["H100-80GB", "A100-80GB", "V100-32GB"] {
            for tp in [2, 4, 8] {
                let ar = AllReduce::on(&device(d).unwrap(), tp);
                let mut prev = 0.0;
                for k in 0..32 {
                    let t = ar.time(f64::from(1u32 << k));
                    assert!(t > 0.0 && t >= prev, "{d} x{tp} at 2^{k} B");
                    prev = t;
                }
            }
        }
    }

    /// A TP = 2 iteration is one GPU's shard of the work (the single-GPU model of the sharded
    /// shape) plus two all-reduces per layer, one after the embedding, the logits' all-gather
    /// and the TP = 2 CPU overhead; faster than one GPU, slower than half of it.
    #[test]
    fn tensor_parallel_is_a_shard_plus_collectives() {
        let d = device("H100-80GB").unwrap();
        let m = model("Qwen3-32B").unwrap();
        let tp2 = CostModel::for_arch_tp(&d, &m, Dtype::Bf16, 2);
        let s = tp2.shape();
        assert_eq!((s.hidden, s.q_width, s.kv_width, s.intermediate, s.vocab), (5120, 4096, 512, 12_800, 75_968));
        let shard = CostModel::new(&d, ModelShape::from_arch(&m).shard(2), Dtype::Bf16);
        let mut b = BatchSummary::default();
        for _ in 0..32 {
            b.add_decode(8192);
        }
        let all_reduce = tp2.all_reduce_time(32);
        assert_eq!(all_reduce, tp2.all_reduce().time(32.0 * 5120.0 * 2.0));
        let gather = tp2.all_reduce().time(32.0 * 151_936.0 * 2.0 / 2.0);
        let want = shard.iteration_time(&b) + (2.0 * 64.0 + 1.0) * all_reduce + gather + tp2.cpu_overhead(32)
            - shard.cpu_overhead(32);
        let got = tp2.iteration_time(&b);
        assert!((got - want).abs() < 1e-12 * want, "{got} vs {want}");
        let one = CostModel::for_arch(&d, &m, Dtype::Bf16).iteration_time(&b);
        assert!(got < 0.75 * one && got > 0.5 * one, "TP 2 {got} vs TP 1 {one}");
        // The CPU overhead grows with the workers; TP 8 has no rows and takes TP 4's fit.
        let cpu = |tp| CostModel::for_arch_tp(&d, &m, Dtype::Bf16, tp).cpu_overhead(32);
        assert!(cpu(1) < cpu(2) && cpu(2) < cpu(4));
        assert_eq!(cpu(8), cpu(4));
    }

    proptest! {
        /// The memoised cost gives exactly the bits of the direct one, whatever batches came
        /// before (memo hits and misses, and batches past the memo's limit).
        #[test]
        fn memoised_iteration_time_has_the_same_bits(
            batches in prop::collection::vec(
                (prop::collection::vec((1u32..3000, 0u32..20_000), 0..4), prop::collection::vec(1u32..30_000, 0..40)),
                1..30,
            ),
            dev in prop::sample::select(vec!["A100-40GB", "V100-32GB", "H100-80GB", "L4"]),
            name in prop::sample::select(vec!["Qwen3-0.6B", "Qwen3-8B", "Qwen3-14B"]),
        ) {
            let direct = CostModel::for_arch(&device(dev).unwrap(), &model(name).unwrap(), Dtype::Bf16);
            let mut memoised = IterationCost::new(direct.clone());
            // Each batch twice: the second time every memoised term is a hit.
            for (prefills, decodes) in batches.iter().chain(batches.iter()) {
                let shape = BatchShape {
                    prefills: prefills.iter().map(|&(tokens, cached_context)| PrefillChunk { tokens, cached_context }).collect(),
                    decode_contexts: decodes.clone(),
                };
                let b = shape.summary();
                prop_assert_eq!(memoised.iteration_time(&b).to_bits(), direct.iteration_time(&b).to_bits());
            }
        }

        #[test]
        fn iteration_time_is_monotone_in_tokens_and_context(
            chunk in 1u32..4096, extra in 1u32..4096, ctx in 0u32..32_000, more_ctx in 1u32..8000,
            decodes in 0usize..64,
        ) {
            let m = model("Qwen3-4B").unwrap();
            let d = device("A100-40GB").unwrap();
            let base = BatchShape {
                prefills: vec![PrefillChunk { tokens: chunk, cached_context: ctx }],
                decode_contexts: vec![ctx; decodes],
            };
            let t0 = iteration_time(&d, &m, Dtype::Bf16, &base);
            prop_assert!(t0 > 0.0);
            let mut more_tokens = base.clone();
            more_tokens.prefills[0].tokens += extra;
            prop_assert!(iteration_time(&d, &m, Dtype::Bf16, &more_tokens) > t0);
            let mut longer = base.clone();
            longer.prefills[0].cached_context += more_ctx;
            for c in &mut longer.decode_contexts { *c += more_ctx; }
            prop_assert!(iteration_time(&d, &m, Dtype::Bf16, &longer) > t0);
            let mut one_more = base.clone();
            one_more.decode_contexts.push(ctx);
            prop_assert!(iteration_time(&d, &m, Dtype::Bf16, &one_more) > t0);
        }
    }
}
