//! Spec sheets: model architectures (from published `config.json` files) and GPU devices.
//!
//! This module owns *data*, not estimates: parameter bytes and KV bytes per token are derived
//! from a model's architecture config, and device figures come from vendor datasheets. Both the
//! emulator (ground truth) and the estimators read these facts; neither may put a cost model
//! here. It depends on nothing but serde and thiserror.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Errors raised while reading a spec.
#[derive(Debug, Error)]
pub enum SpecError {
    #[error("model config {source_name}: {message}")]
    BadModelConfig { source_name: String, message: String },
    #[error("unknown model `{0}` (known: {1})")]
    UnknownModel(String, String),
    #[error("unknown device `{0}` (known: {1})")]
    UnknownDevice(String, String),
}

/// Numeric format of weights and KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Bf16,
    Fp16,
    Fp32,
    Fp8,
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Bf16 | Dtype::Fp16 => 2,
            Dtype::Fp32 => 4,
            Dtype::Fp8 => 1,
        }
    }
}

/// The architecture fields of a decoder-only transformer as published in its Hugging Face
/// `config.json`: a dense one (Qwen3 / Llama family), or a hybrid one (Qwen3.5) whose layers
/// are mostly Gated DeltaNet linear attention with a full-attention layer every few
/// ([`LinearAttention`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelArch {
    /// Catalogue name, e.g. `Qwen3-8B`.
    pub name: String,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    pub num_key_value_heads: u64,
    pub head_dim: u64,
    pub vocab_size: u64,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: u64,
    /// Qwen3 applies RMSNorm to q and k per head (`q_norm`, `k_norm`).
    pub qk_norm: bool,
    /// The full-attention layers gate their output (`attn_output_gate`, Qwen3.5): the query
    /// projection emits the query and a gate of the same width.
    #[serde(default)]
    pub attn_output_gate: bool,
    /// The linear-attention layers of a hybrid model; `None` for a dense one.
    #[serde(default)]
    pub linear_attention: Option<LinearAttention>,
}

/// The Gated DeltaNet layers of a hybrid model (Qwen3.5, after Qwen3-Next): each keeps, per
/// sequence, a fixed recurrent state of `value heads × key_head_dim × value_head_dim` (in
/// `mamba_ssm_dtype`) and a causal-convolution window of `kernel − 1` inputs (in the model's
/// dtype) instead of a KV cache that grows with the context. Field names as in the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinearAttention {
    /// Layers of this kind (`layer_types` entries `linear_attention`).
    pub num_layers: u64,
    pub num_key_heads: u64,
    pub num_value_heads: u64,
    pub key_head_dim: u64,
    pub value_head_dim: u64,
    pub conv_kernel_dim: u64,
    /// Bytes per element of the recurrent state (`mamba_ssm_dtype`: float32 in Qwen3.5).
    pub state_dtype_bytes: u64,
}

impl LinearAttention {
    /// Width of the query (= key) projection output, `num_key_heads × key_head_dim`.
    pub fn key_width(&self) -> u64 {
        self.num_key_heads * self.key_head_dim
    }

    /// Width of the value projection output, `num_value_heads × value_head_dim`.
    pub fn value_width(&self) -> u64 {
        self.num_value_heads * self.value_head_dim
    }

    /// Channels of the causal convolution (q, k and v concatenated).
    pub fn conv_dim(&self) -> u64 {
        2 * self.key_width() + self.value_width()
    }

    /// Parameters of the matrix multiplies of one layer's token mixer: the fused q/k/v/z
    /// projection (`in_proj_qkvz`, z the output gate of value width), the per-head β and
    /// decay projections (`in_proj_ba`) and the output projection.
    pub fn mixer_linear_params(&self, hidden: u64) -> u64 {
        hidden * (2 * self.key_width() + 2 * self.value_width()) + hidden * 2 * self.num_value_heads
            + self.value_width() * hidden
    }

    /// The small parameters of one layer's token mixer: convolution weights, per-head decay
    /// (`A_log`) and `dt_bias`, the gated RMSNorm over a value head.
    pub fn mixer_other_params(&self) -> u64 {
        self.conv_dim() * self.conv_kernel_dim + 2 * self.num_value_heads + self.value_head_dim
    }

    /// Bytes of one sequence's state in one layer: the recurrent state in
    /// `state_dtype_bytes`, the convolution window in the activations' dtype (bf16 for an
    /// FP8 checkpoint, whose activations are not quantized).
    pub fn state_bytes_per_layer(&self, dtype: Dtype) -> u64 {
        let activation_bytes = if dtype == Dtype::Fp8 { 2 } else { dtype.bytes() };
        self.num_value_heads * self.key_head_dim * self.value_head_dim * self.state_dtype_bytes
            + self.conv_dim() * self.conv_kernel_dim.saturating_sub(1) * activation_bytes
    }
}

#[derive(Deserialize)]
struct HfConfig {
    hidden_size: u64,
    intermediate_size: u64,
    num_hidden_layers: u64,
    num_attention_heads: u64,
    num_key_value_heads: Option<u64>,
    head_dim: Option<u64>,
    vocab_size: u64,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    max_position_embeddings: Option<u64>,
    #[serde(default)]
    model_type: Option<String>,
    #[serde(default)]
    attn_output_gate: bool,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    full_attention_interval: Option<u64>,
    #[serde(default)]
    linear_num_key_heads: Option<u64>,
    #[serde(default)]
    linear_num_value_heads: Option<u64>,
    #[serde(default)]
    linear_key_head_dim: Option<u64>,
    #[serde(default)]
    linear_value_head_dim: Option<u64>,
    #[serde(default)]
    linear_conv_kernel_dim: Option<u64>,
    #[serde(default)]
    mamba_ssm_dtype: Option<String>,
    #[serde(default)]
    num_experts: Option<u64>,
}


impl ModelArch {
    /// Parse a Hugging Face `config.json`. `source_name` names the file in errors.
    pub fn from_hf_config(name: &str, source_name: &str, json: &str) -> Result<Self, SpecError> {
        let bad = |message: String| SpecError::BadModelConfig { source_name: source_name.to_string(), message };
        // Parsed as a value first so that a syntax error keeps its line and column.
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| bad(format!("line {} column {}: {e}", e.line(), e.column())))?;
        // A multimodal checkpoint's config keeps the language model's fields under
        // `text_config`.
        let text = match value {
            serde_json::Value::Object(mut top) => match top.remove("text_config") {
                Some(text) => text,
                None => serde_json::Value::Object(top),
            },
            other => other,
        };
        let cfg: HfConfig = serde_json::from_value(text).map_err(|e| bad(e.to_string()))?;
        if cfg.num_attention_heads == 0 || cfg.hidden_size == 0 || cfg.num_hidden_layers == 0 {
            return Err(SpecError::BadModelConfig {
                source_name: source_name.to_string(),
                message: "hidden_size, num_hidden_layers and num_attention_heads must be positive"
                    .into(),
            });
        }
        if cfg.num_experts.is_some_and(|n| n > 0) {
            return Err(bad("num_experts: mixture-of-experts models are not modelled".into()));
        }
        let head_dim = cfg.head_dim.unwrap_or(cfg.hidden_size / cfg.num_attention_heads);
        let linear_attention = linear_attention(&cfg).map_err(bad)?;
        let qk_norm = matches!(cfg.model_type.as_deref(), Some("qwen3" | "qwen3_5" | "qwen3_5_text" | "qwen3_next"));
        Ok(ModelArch {
            name: name.to_string(),
            hidden_size: cfg.hidden_size,
            intermediate_size: cfg.intermediate_size,
            num_hidden_layers: cfg.num_hidden_layers,
            num_attention_heads: cfg.num_attention_heads,
            num_key_value_heads: cfg.num_key_value_heads.unwrap_or(cfg.num_attention_heads),
            head_dim,
            vocab_size: cfg.vocab_size,
            tie_word_embeddings: cfg.tie_word_embeddings,
            max_position_embeddings: cfg.max_position_embeddings.unwrap_or(4096),
            qk_norm,
            attn_output_gate: cfg.attn_output_gate,
            linear_attention,
        })
    }

    /// Layers with full (softmax) attention and a KV cache: all of a dense model's.
    pub fn attention_layers(&self) -> u64 {
        self.num_hidden_layers.saturating_sub(self.linear_attention.map_or(0, |l| l.num_layers))
    }

    /// Width of the query projection's output: the query, and as much again for the output
    /// gate where the model has one.
    pub fn q_proj_width(&self) -> u64 {
        self.q_width() * if self.attn_output_gate { 2 } else { 1 }
    }

    /// Width of the query projection output (`num_attention_heads × head_dim`).
    pub fn q_width(&self) -> u64 {
        self.num_attention_heads * self.head_dim
    }

    /// Width of one of the key / value projection outputs (`num_key_value_heads × head_dim`).
    pub fn kv_width(&self) -> u64 {
        self.num_key_value_heads * self.head_dim
    }

    /// Parameters of the matrix multiplies of one full-attention decoder layer (q — with its
    /// gate where the model has one —, k, v, o and the gated MLP).
    pub fn layer_linear_params(&self) -> u64 {
        let h = self.hidden_size;
        let attn = h * self.q_proj_width() + 2 * h * self.kv_width() + self.q_width() * h;
        attn + self.mlp_params()
    }

    /// Parameters of one layer's gated MLP (up, gate, down).
    pub fn mlp_params(&self) -> u64 {
        3 * self.hidden_size * self.intermediate_size
    }

    /// Parameters of the norms of one full-attention decoder layer.
    pub fn layer_norm_params(&self) -> u64 {
        2 * self.hidden_size + if self.qk_norm { 2 * self.head_dim } else { 0 }
    }

    /// Parameters of the matrix multiplies of all decoder layers.
    pub fn all_layers_linear_params(&self) -> u64 {
        let linear = self.linear_attention.map_or(0, |l| l.num_layers * (l.mixer_linear_params(self.hidden_size) + self.mlp_params()));
        self.attention_layers() * self.layer_linear_params() + linear
    }

    /// Total parameter count (tied embeddings counted once).
    pub fn param_count(&self) -> u64 {
        let embed = self.vocab_size * self.hidden_size;
        let lm_head = if self.tie_word_embeddings { 0 } else { embed };
        let layers = self.attention_layers() * (self.layer_linear_params() + self.layer_norm_params());
        let linear = self.linear_attention.map_or(0, |l| {
            l.num_layers * (l.mixer_linear_params(self.hidden_size) + self.mlp_params() + l.mixer_other_params() + 2 * self.hidden_size)
        });
        embed + lm_head + layers + linear + self.hidden_size
    }

    /// Weight bytes in `dtype`.
    pub fn param_bytes(&self, dtype: Dtype) -> u64 {
        self.param_count() * dtype.bytes()
    }

    /// KV-cache bytes per token: 2 (K and V) × full-attention layers × kv heads × head_dim ×
    /// dtype bytes.
    pub fn kv_bytes_per_token(&self, dtype: Dtype) -> u64 {
        2 * self.attention_layers() * self.kv_width() * dtype.bytes()
    }

    /// Bytes of state each running sequence holds whatever its length: the linear-attention
    /// layers' recurrent and convolution state (0 for a dense model). vLLM's hybrid cache
    /// manager allocates it from the same pool as the KV cache.
    pub fn request_state_bytes(&self, dtype: Dtype) -> u64 {
        self.linear_attention.map_or(0, |l| l.num_layers * l.state_bytes_per_layer(dtype))
    }

    /// [`request_state_bytes`](Self::request_state_bytes) of a model served in `dtype`, in
    /// tokens of its `kv_dtype` KV cache (rounded up).
    pub fn request_state_tokens(&self, dtype: Dtype, kv_dtype: Dtype) -> u64 {
        self.request_state_bytes(dtype).div_ceil(self.kv_bytes_per_token(kv_dtype).max(1))
    }

    /// A hybrid model's page in tokens (0 for a dense model): vLLM's hybrid cache manager
    /// enlarges the attention block until one layer's page of it holds one layer's state
    /// (a multiple of 16 tokens), and in its prefix-caching `align` mode keeps states only at
    /// those block boundaries. Qwen3.6-27B with a BF16 cache: 784 tokens; Qwen3.5-9B: 528.
    pub fn hybrid_page_tokens(&self, dtype: Dtype, kv_dtype: Dtype) -> u64 {
        let Some(l) = self.linear_attention else { return 0 };
        let per_token_per_layer = 2 * self.kv_width() * kv_dtype.bytes();
        16 * l.state_bytes_per_layer(dtype).div_ceil(16 * per_token_per_layer.max(1))
    }

    /// FLOPs of all matrix multiplies per token in a forward pass, LM head included
    /// (2 FLOPs per multiply-accumulate). Attention score / value products are excluded:
    /// they depend on the context length.
    pub fn linear_flops_per_token(&self) -> u64 {
        2 * (self.all_layers_linear_params() + self.vocab_size * self.hidden_size)
    }
}

/// The linear-attention layers a config describes: from `layer_types`, else every layer but
/// each `full_attention_interval`-th; `None` when it has neither.
fn linear_attention(cfg: &HfConfig) -> Result<Option<LinearAttention>, String> {
    let num_layers = match (&cfg.layer_types, cfg.full_attention_interval) {
        (Some(types), _) => {
            if types.len() as u64 != cfg.num_hidden_layers {
                return Err(format!(
                    "layer_types lists {} layers, num_hidden_layers is {}",
                    types.len(),
                    cfg.num_hidden_layers
                ));
            }
            if let Some(t) = types.iter().find(|t| *t != "linear_attention" && *t != "full_attention") {
                return Err(format!("layer_types: unknown layer type `{t}`"));
            }
            types.iter().filter(|t| *t == "linear_attention").count() as u64
        }
        (None, Some(0)) => return Err("full_attention_interval must be positive".into()),
        (None, Some(k)) => cfg.num_hidden_layers - cfg.num_hidden_layers / k,
        (None, None) => 0,
    };
    if num_layers == 0 {
        return Ok(None);
    }
    if num_layers == cfg.num_hidden_layers {
        return Err("a hybrid model needs at least one full_attention layer".into());
    }
    let field = |v: Option<u64>, name: &str| match v {
        Some(v) if v > 0 => Ok(v),
        _ => Err(format!("{name} must be a positive integer in a model with linear_attention layers")),
    };
    let state_dtype_bytes = match cfg.mamba_ssm_dtype.as_deref() {
        // vLLM's `auto`: the model's activation dtype (bf16).
        None => 2,
        Some("float32") => 4,
        Some("bfloat16" | "float16") => 2,
        Some(other) => return Err(format!("mamba_ssm_dtype: unknown dtype `{other}`")),
    };
    Ok(Some(LinearAttention {
        num_layers,
        num_key_heads: field(cfg.linear_num_key_heads, "linear_num_key_heads")?,
        num_value_heads: field(cfg.linear_num_value_heads, "linear_num_value_heads")?,
        key_head_dim: field(cfg.linear_key_head_dim, "linear_key_head_dim")?,
        value_head_dim: field(cfg.linear_value_head_dim, "linear_value_head_dim")?,
        conv_kernel_dim: field(cfg.linear_conv_kernel_dim, "linear_conv_kernel_dim")?,
        state_dtype_bytes,
    }))
}

/// One kind of GPU, from its vendor datasheet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceSpec {
    /// Catalogue name, e.g. `A100-40GB`.
    pub name: String,
    /// Dense (no sparsity) fp16/bf16 tensor-core throughput, FLOP/s.
    pub dense_fp16_flops: f64,
    /// HBM (or GDDR) bandwidth, bytes/s.
    pub memory_bandwidth: f64,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    /// Host-to-device link bandwidth (PCIe generation × 16 lanes, one direction), bytes/s.
    pub host_link_bandwidth: f64,
    /// Whether the device computes in bf16 (V100 does not: vLLM serves it in fp16).
    pub supports_bf16: bool,
    /// Where the figures come from.
    pub source: String,
}

const GB: f64 = 1e9;
const GIB: u64 = 1 << 30;

fn dev(
    name: &str,
    tflops: f64,
    bw_gbs: f64,
    mem_gib: u64,
    link_gbs: f64,
    bf16: bool,
    source: &str,
) -> DeviceSpec {
    DeviceSpec {
        name: name.to_string(),
        dense_fp16_flops: tflops * 1e12,
        memory_bandwidth: bw_gbs * GB,
        memory_bytes: mem_gib * GIB,
        host_link_bandwidth: link_gbs * GB,
        supports_bf16: bf16,
        source: source.to_string(),
    }
}

/// The built-in device catalogue. Memory sizes are the marketed GB read as GiB-class parts
/// (a "40GB" A100 reports 40 GiB to CUDA, the H200 141 GB = 131 GiB is rounded to 141 GB).
pub fn device_catalogue() -> Vec<DeviceSpec> {
    vec![
        dev("V100-32GB", 125.0, 900.0, 32, 16.0, false, "NVIDIA V100 datasheet (SXM2): 125 TFLOPS tensor fp16, 900 GB/s HBM2; PCIe 3.0 x16"),
        dev("A100-40GB", 312.0, 1555.0, 40, 32.0, true, "NVIDIA A100 datasheet (SXM4 40GB): 312 TFLOPS bf16 dense, 1,555 GB/s HBM2; PCIe 4.0 x16"),
        dev("A100-80GB", 312.0, 2039.0, 80, 32.0, true, "NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOPS bf16 dense, 2,039 GB/s HBM2e; PCIe 4.0 x16"),
        dev("A40", 149.7, 696.0, 48, 32.0, true, "NVIDIA A40 datasheet: 149.7 TFLOPS fp16/bf16 tensor dense, 696 GB/s GDDR6; PCIe 4.0 x16"),
        dev("L4", 121.0, 300.0, 24, 32.0, true, "NVIDIA L4 datasheet: 121 TFLOPS fp16/bf16 tensor dense (242 sparse), 300 GB/s GDDR6; PCIe 4.0 x16"),
        dev("H100-80GB", 989.0, 3350.0, 80, 64.0, true, "NVIDIA H100 datasheet (SXM5): 989 TFLOPS bf16 dense, 3.35 TB/s HBM3; PCIe 5.0 x16"),
        DeviceSpec {
            memory_bytes: 141_000_000_000,
            ..dev("H200-141GB", 989.0, 4800.0, 0, 64.0, true, "NVIDIA H200 datasheet (SXM): 989 TFLOPS bf16 dense, 4.8 TB/s HBM3e, 141 GB; PCIe 5.0 x16")
        },
    ]
}

/// Look a device up by catalogue name (case-insensitive).
pub fn device(name: &str) -> Result<DeviceSpec, SpecError> {
    let all = device_catalogue();
    all.iter()
        .find(|d| d.name.eq_ignore_ascii_case(name))
        .cloned()
        .ok_or_else(|| {
            SpecError::UnknownDevice(
                name.to_string(),
                all.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", "),
            )
        })
}

const QWEN3_CONFIGS: [(&str, &str); 6] = [
    ("Qwen3-0.6B", include_str!("../data/qwen3/Qwen3-0.6B.json")),
    ("Qwen3-1.7B", include_str!("../data/qwen3/Qwen3-1.7B.json")),
    ("Qwen3-4B", include_str!("../data/qwen3/Qwen3-4B.json")),
    ("Qwen3-8B", include_str!("../data/qwen3/Qwen3-8B.json")),
    ("Qwen3-14B", include_str!("../data/qwen3/Qwen3-14B.json")),
    ("Qwen3-32B", include_str!("../data/qwen3/Qwen3-32B.json")),
];

/// The built-in model catalogue: the Qwen3 dense models, parsed from their published configs.
pub fn model_catalogue() -> Vec<ModelArch> {
    parse_configs(&QWEN3_CONFIGS, "qwen3")
}

/// The shipped configs of one data directory, parsed (a shipped config that does not parse is
/// caught by the catalogue tests, which count them).
fn parse_configs(configs: &[(&str, &str)], dir: &str) -> Vec<ModelArch> {
    configs
        .iter()
        .filter_map(|(name, json)| ModelArch::from_hf_config(name, &format!("predictor/data/{dir}/{name}.json"), json).ok())
        .collect()
}

const HYBRID_CONFIGS: [(&str, &str); 2] = [
    ("Qwen3.5-9B", include_str!("../data/qwen3.5/Qwen3.5-9B.json")),
    ("Qwen3.6-27B", include_str!("../data/qwen3.5/Qwen3.6-27B.json")),
];

/// The hybrid-attention models (Qwen3.5 family: Gated DeltaNet layers with a full-attention
/// layer every fourth), parsed from their configs' language-model fields
/// (`predictor/data/qwen3.5/SOURCE.md`). Kept apart from [`model_catalogue`], the models the
/// shipped workflows and responders cover; [`model`] finds both.
pub fn hybrid_catalogue() -> Vec<ModelArch> {
    parse_configs(&HYBRID_CONFIGS, "qwen3.5")
}

/// Look a model up by catalogue name (case-insensitive), dense or hybrid.
pub fn model(name: &str) -> Result<ModelArch, SpecError> {
    let mut all = model_catalogue();
    all.extend(hybrid_catalogue());
    all.iter()
        .find(|m| m.name.eq_ignore_ascii_case(name))
        .cloned()
        .ok_or_else(|| {
            SpecError::UnknownModel(
                name.to_string(),
                all.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_config_parses() {
        assert_eq!(model_catalogue().len(), QWEN3_CONFIGS.len());
    }

    #[test]
    fn parameter_counts_match_the_published_sizes() {
        // Published sizes (Qwen3 technical report): 0.6B, 1.7B, 4.0B, 8.2B, 14.8B, 32.8B.
        let expect = [
            ("Qwen3-0.6B", 0.60e9),
            ("Qwen3-1.7B", 1.72e9),
            ("Qwen3-4B", 4.02e9),
            ("Qwen3-8B", 8.19e9),
            ("Qwen3-14B", 14.77e9),
            ("Qwen3-32B", 32.76e9),
        ];
        for (name, params) in expect {
            let m = model(name).unwrap();
            let got = m.param_count() as f64;
            assert!((got - params).abs() / params < 0.01, "{name}: {got} vs {params}");
        }
    }

    #[test]
    fn hybrid_configs_parse_to_the_published_sizes() {
        assert_eq!(hybrid_catalogue().len(), HYBRID_CONFIGS.len());
        // Language model only (the vision tower and the MTP layer are not served here),
        // within 1 % of the published 9B (8.95 B text) and 27B.
        for (name, params) in [("Qwen3.5-9B", 8.95e9), ("Qwen3.6-27B", 27.0e9)] {
            let m = model(name).unwrap();
            let got = m.param_count() as f64;
            assert!((got - params).abs() / params < 0.01, "{name}: {got} vs {params}");
        }
        // Exactly, by hand (Qwen3.5-9B): embeddings and LM head 2 × 248,320 × 4,096; 8 attention
        // layers of q+gate 4,096 × 8,192, k and v 4,096 × 1,024 each, o 4,096 × 4,096, MLP
        // 3 × 4,096 × 12,288, norms 2 × 4,096 + 2 × 256; 24 Gated DeltaNet layers of
        // in_proj_qkvz 4,096 × 12,288, in_proj_ba 4,096 × 64, out_proj 4,096 × 4,096, the same
        // MLP, conv 8,192 × 4, A_log and dt_bias 2 × 32, gated norm 128, norms 2 × 4,096; the
        // final norm 4,096.
        let mlp = 3 * 4_096 * 12_288;
        let attention = 4_096 * 8_192 + 2 * 4_096 * 1_024 + 4_096 * 4_096 + mlp + 2 * 4_096 + 2 * 256;
        let delta_net = 4_096 * 12_288 + 4_096 * 64 + 4_096 * 4_096 + mlp + 8_192 * 4 + 64 + 128 + 2 * 4_096;
        let expect: u64 = 2 * 248_320 * 4_096 + 8 * attention + 24 * delta_net + 4_096;
        assert_eq!(model("Qwen3.5-9B").unwrap().param_count(), expect);
    }

    #[test]
    fn hybrid_state_and_kv_by_hand() {
        // Qwen3.5-9B: 8 of 32 layers attend: KV 2 × 8 × 4 heads × 256 × 2 bytes = 32,768 per
        // token. 24 Gated DeltaNet layers hold 32 × 128 × 128 fp32 state and a window of 3 ×
        // (2 × 16 × 128 + 32 × 128) bf16 inputs: 24 × (2,097,152 + 49,152) = 51,511,296 bytes,
        // 1,572 tokens of KV.
        let m = model("Qwen3.5-9B").unwrap();
        assert_eq!(m.attention_layers(), 8);
        assert_eq!(m.kv_bytes_per_token(Dtype::Bf16), 32_768);
        assert_eq!(m.request_state_bytes(Dtype::Bf16), 51_511_296);
        assert_eq!(m.request_state_tokens(Dtype::Bf16, Dtype::Bf16), 1_572);
        // One layer's state (2,146,304 bytes) over 16 × 4,096 bytes per attention-layer token:
        // 33 rows of 16, a 528-token page.
        assert_eq!(m.hybrid_page_tokens(Dtype::Bf16, Dtype::Bf16), 528);
        // Qwen3.6-27B with an FP8 cache: 16 of 64 layers attend, 2 × 16 × 4 × 256 × 1 = 32,768
        // bytes per token; 48 layers × (48 × 128 × 128 × 4 + 3 × (4,096 + 6,144) × 2 — the
        // window in bf16 activations) = 153,944,064 bytes, 4,698 tokens.
        let m = model("Qwen3.6-27B").unwrap();
        assert_eq!(m.attention_layers(), 16);
        assert_eq!(m.kv_bytes_per_token(Dtype::Fp8), 32_768);
        assert_eq!(m.request_state_bytes(Dtype::Fp8), 153_944_064);
        assert_eq!(m.request_state_tokens(Dtype::Fp8, Dtype::Fp8), 4_698);
        // FP8 weights with vLLM's default BF16 cache: 65,536 bytes per token, 2,349 tokens;
        // its page 16 × ⌈3,207,168 / (16 × 4,096)⌉ = 784 tokens.
        assert_eq!(m.request_state_tokens(Dtype::Fp8, Dtype::Bf16), 2_349);
        assert_eq!(m.hybrid_page_tokens(Dtype::Fp8, Dtype::Bf16), 784);
        assert_eq!(model("Qwen3-8B").unwrap().hybrid_page_tokens(Dtype::Bf16, Dtype::Bf16), 0);
        // A dense model holds none.
        assert_eq!(model("Qwen3-8B").unwrap().request_state_bytes(Dtype::Bf16), 0);
    }

    #[test]
    fn bad_hybrid_configs_say_which_field() {
        let cfg = |extra: &str| {
            format!(
                r#"{{"text_config": {{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                "num_attention_heads": 2, "vocab_size": 10 {extra}}}}}"#
            )
        };
        let err = |extra: &str| ModelArch::from_hf_config("x", "x.json", &cfg(extra)).unwrap_err().to_string();
        assert!(err(r#", "full_attention_interval": 2"#).contains("linear_num_key_heads"));
        assert!(err(r#", "layer_types": ["linear_attention"]"#).contains("layer_types lists 1"));
        let all_linear = r#", "layer_types": ["linear_attention", "linear_attention", "linear_attention", "linear_attention"]"#;
        assert!(err(all_linear).contains("at least one full_attention"));
        assert!(err(r#", "layer_types": ["a", "b", "c", "d"]"#).contains("unknown layer type"));
        assert!(err(r#", "num_experts": 8"#).contains("num_experts"));
        // A schema error inside text_config names the field.
        let missing = ModelArch::from_hf_config("x", "x.json", r#"{"text_config": {"hidden_size": 64}}"#).unwrap_err();
        assert!(missing.to_string().contains("intermediate_size"), "{missing}");
        // Nested under text_config and without linear layers: a dense model.
        let dense = ModelArch::from_hf_config("x", "x.json", &cfg("")).unwrap();
        assert_eq!(dense.linear_attention, None);
    }

    #[test]
    fn kv_bytes_per_token_by_hand() {
        // Qwen3-8B: 2 × 36 layers × 8 kv heads × 128 × 2 bytes = 147,456.
        assert_eq!(model("Qwen3-8B").unwrap().kv_bytes_per_token(Dtype::Bf16), 147_456);
        // Qwen3-0.6B: 2 × 28 × 8 × 128 × 2 = 114,688.
        assert_eq!(model("qwen3-0.6b").unwrap().kv_bytes_per_token(Dtype::Bf16), 114_688);
    }

    #[test]
    fn unknown_names_list_the_catalogue() {
        let err = device("B200").unwrap_err().to_string();
        assert!(err.contains("A100-40GB"), "{err}");
        assert!(model("Llama").is_err());
    }

    #[test]
    fn bad_config_names_the_file() {
        let err = ModelArch::from_hf_config("x", "x.json", "{ \"hidden_size\": ").unwrap_err();
        assert!(err.to_string().contains("x.json"));
    }
}
