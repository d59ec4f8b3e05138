//! Spec sheets: model architectures (from published `config.json` files) and GPU devices.
//!
//! This module owns *data*, not estimates: parameter bytes and KV bytes per token are derived
//! from a model's architecture config, and device figures come from vendor datasheets. Both the
//! emulator (ground truth) and the estimators read these facts; neither may put a cost model
//! here. It depends on nothing but serde.

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

/// The architecture fields of a dense decoder-only transformer (Qwen3 / Llama family),
/// as published in its Hugging Face `config.json`.
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
}

impl ModelArch {
    /// Parse a Hugging Face `config.json`. `source_name` names the file in errors.
    pub fn from_hf_config(name: &str, source_name: &str, json: &str) -> Result<Self, SpecError> {
        let cfg: HfConfig = serde_json::from_str(json).map_err(|e| SpecError::BadModelConfig {
            source_name: source_name.to_string(),
            message: format!("line {} column {}: {e}", e.line(), e.column()),
        })?;
        if cfg.num_attention_heads == 0 || cfg.hidden_size == 0 || cfg.num_hidden_layers == 0 {
            return Err(SpecError::BadModelConfig {
                source_name: source_name.to_string(),
                message: "hidden_size, num_hidden_layers and num_attention_heads must be positive"
                    .into(),
            });
        }
        let head_dim = cfg.head_dim.unwrap_or(cfg.hidden_size / cfg.num_attention_heads);
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
            qk_norm: cfg.model_type.as_deref() == Some("qwen3"),
        })
    }

    /// Width of the query projection output (`num_attention_heads × head_dim`).
    pub fn q_width(&self) -> u64 {
        self.num_attention_heads * self.head_dim
    }

    /// Width of one of the key / value projection outputs (`num_key_value_heads × head_dim`).
    pub fn kv_width(&self) -> u64 {
        self.num_key_value_heads * self.head_dim
    }

    /// Parameters of the matrix multiplies of one decoder layer (q, k, v, o and the gated MLP).
    pub fn layer_linear_params(&self) -> u64 {
        let h = self.hidden_size;
        let attn = h * self.q_width() + 2 * h * self.kv_width() + self.q_width() * h;
        let mlp = 3 * h * self.intermediate_size;
        attn + mlp
    }

    /// Parameters of the norms of one decoder layer.
    pub fn layer_norm_params(&self) -> u64 {
        2 * self.hidden_size + if self.qk_norm { 2 * self.head_dim } else { 0 }
    }

    /// Total parameter count (tied embeddings counted once).
    pub fn param_count(&self) -> u64 {
        let embed = self.vocab_size * self.hidden_size;
        let lm_head = if self.tie_word_embeddings { 0 } else { embed };
        let layers = self.num_hidden_layers * (self.layer_linear_params() + self.layer_norm_params());
        embed + lm_head + layers + self.hidden_size
    }

    /// Weight bytes in `dtype`.
    pub fn param_bytes(&self, dtype: Dtype) -> u64 {
        self.param_count() * dtype.bytes()
    }

    /// KV-cache bytes per token: 2 (K and V) × layers × kv heads × head_dim × dtype bytes.
    pub fn kv_bytes_per_token(&self, dtype: Dtype) -> u64 {
        2 * self.num_hidden_layers * self.kv_width() * dtype.bytes()
    }

    /// FLOPs of all matrix multiplies per token in a forward pass, LM head included
    /// (2 FLOPs per multiply-accumulate). Attention score / value products are excluded:
    /// they depend on the context length.
    pub fn linear_flops_per_token(&self) -> u64 {
        2 * (self.num_hidden_layers * self.layer_linear_params() + self.vocab_size * self.hidden_size)
    }
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
    QWEN3_CONFIGS
        .iter()
        .filter_map(|(name, json)| {
            ModelArch::from_hf_config(name, &format!("predictor/data/qwen3/{name}.json"), json).ok()
        })
        .collect()
}

/// Look a model up by catalogue name (case-insensitive).
pub fn model(name: &str) -> Result<ModelArch, SpecError> {
    let all = model_catalogue();
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
