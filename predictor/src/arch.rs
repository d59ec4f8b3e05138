//! Architecture configs of dense decoder-only transformers, in the one shape the operator
//! graph is built from.
//!
//! Two sources feed an [`Architecture`]: the Switchyard catalogue ([`crate::spec::ModelArch`],
//! parsed from Hugging Face `config.json` files) and Vidur's `model_configs/<org>/<model>.yml`
//! files, so a user can add a model to a profiling directory without touching code. This module
//! holds shapes only, never costs; it must not depend on the estimators.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::PredictorError;
use crate::spec::ModelArch;

/// Normalization layer type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NormKind {
    RmsNorm,
    LayerNorm,
}

/// The shape facts of a dense decoder-only transformer that the operator graph needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Architecture {
    /// Model name, e.g. `Qwen3-8B` or `meta-llama/Llama-2-7b-hf`.
    pub name: String,
    pub num_layers: u64,
    pub hidden_size: u64,
    pub num_q_heads: u64,
    pub num_kv_heads: u64,
    pub head_dim: u64,
    /// Width of the MLP hidden layer (one half of a gated MLP's up projection).
    pub intermediate_size: u64,
    pub vocab_size: u64,
    /// Gated MLP (SwiGLU: gate and up projections fused, then `act(gate) * up`).
    pub gated_mlp: bool,
    pub norm: NormKind,
    /// `true`: sequential attention then MLP, each behind its own norm (Llama). `false`:
    /// attention and MLP read the same normed input in parallel (phi-2, GPT-J).
    pub post_attention_norm: bool,
    /// Per-head RMSNorm of q and k (Qwen3).
    pub qk_norm: bool,
    /// Fraction of each head's dimensions that rotary embedding rotates (phi-2: 0.4).
    pub rotary_fraction: f64,
    /// Bias vectors on the q/k/v projection.
    pub qkv_bias: bool,
    /// Bias vectors on the other linear layers.
    pub linear_bias: bool,
    /// Input embedding and LM head share one matrix.
    pub tied_embeddings: bool,
}

impl From<&ModelArch> for Architecture {
    fn from(m: &ModelArch) -> Self {
        Architecture {
            name: m.name.clone(),
            num_layers: m.num_hidden_layers,
            hidden_size: m.hidden_size,
            num_q_heads: m.num_attention_heads,
            num_kv_heads: m.num_key_value_heads,
            head_dim: m.head_dim,
            intermediate_size: m.intermediate_size,
            vocab_size: m.vocab_size,
            gated_mlp: true,
            norm: NormKind::RmsNorm,
            post_attention_norm: true,
            qk_norm: m.qk_norm,
            rotary_fraction: 1.0,
            qkv_bias: false,
            linear_bias: false,
            tied_embeddings: m.tie_word_embeddings,
        }
    }
}

/// The fields of a Vidur `model_configs/*.yml` file that shape the graph.
#[derive(Deserialize)]
struct VidurModelConfig {
    num_layers: u64,
    num_q_heads: u64,
    num_kv_heads: u64,
    embedding_dim: u64,
    mlp_hidden_dim: u64,
    vocab_size: u64,
    #[serde(default = "yes")]
    use_gated_mlp: bool,
    #[serde(default)]
    use_bias: bool,
    #[serde(default)]
    use_qkv_bias: bool,
    #[serde(default)]
    norm: Option<String>,
    #[serde(default = "yes")]
    post_attn_norm: bool,
    #[serde(default)]
    partial_rotary_factor: Option<f64>,
    #[serde(default)]
    head_dim: Option<u64>,
    #[serde(default)]
    qk_norm: bool,
    #[serde(default)]
    tie_word_embeddings: bool,
}

fn yes() -> bool {
    true
}

impl Architecture {
    /// Parse a Vidur model config (`model_configs/<org>/<model>.yml`). `name` is the model's
    /// name (`<org>/<model>`); `path` names the file in errors.
    pub fn from_vidur_yaml(name: &str, path: &Path, yaml: &str) -> Result<Self, PredictorError> {
        let bad = |message: String| PredictorError::BadConfig {
            path: path.to_path_buf(),
            message,
        };
        let cfg: VidurModelConfig = serde_saphyr::from_str(yaml).map_err(|e| bad(e.to_string()))?;
        if cfg.num_layers == 0 || cfg.num_q_heads == 0 || cfg.embedding_dim == 0 {
            return Err(bad(
                "num_layers, num_q_heads and embedding_dim must be positive".into(),
            ));
        }
        if cfg.num_kv_heads == 0 || !cfg.num_q_heads.is_multiple_of(cfg.num_kv_heads) {
            return Err(bad(format!(
                "num_kv_heads {} must divide num_q_heads {}",
                cfg.num_kv_heads, cfg.num_q_heads
            )));
        }
        let norm = match cfg.norm.as_deref() {
            None | Some("rms_norm") => NormKind::RmsNorm,
            Some("layer_norm") => NormKind::LayerNorm,
            Some(other) => {
                return Err(bad(format!(
                    "field `norm`: unknown value `{other}` (expected rms_norm or layer_norm)"
                )));
            }
        };
        let rotary_fraction = cfg.partial_rotary_factor.unwrap_or(1.0);
        if !(rotary_fraction > 0.0 && rotary_fraction <= 1.0) {
            return Err(bad(format!(
                "field `partial_rotary_factor`: {rotary_fraction} is not in (0, 1]"
            )));
        }
        Ok(Architecture {
            name: name.to_string(),
            num_layers: cfg.num_layers,
            hidden_size: cfg.embedding_dim,
            num_q_heads: cfg.num_q_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim.unwrap_or(cfg.embedding_dim / cfg.num_q_heads),
            intermediate_size: cfg.mlp_hidden_dim,
            vocab_size: cfg.vocab_size,
            gated_mlp: cfg.use_gated_mlp,
            norm,
            post_attention_norm: cfg.post_attn_norm,
            qk_norm: cfg.qk_norm,
            rotary_fraction,
            qkv_bias: cfg.use_qkv_bias || cfg.use_bias,
            linear_bias: cfg.use_bias,
            tied_embeddings: cfg.tie_word_embeddings,
        })
    }

    /// Width of the query projection output.
    pub fn q_width(&self) -> u64 {
        self.num_q_heads * self.head_dim
    }

    /// Width of one of the key / value projection outputs.
    pub fn kv_width(&self) -> u64 {
        self.num_kv_heads * self.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA2_7B: &str = "num_layers: 32\nnum_q_heads: 32\nnum_kv_heads: 32\nembedding_dim: 4096\n\
        mlp_hidden_dim: 11008\nuse_gated_mlp: true\nuse_bias: false\nuse_qkv_bias: false\n\
        norm: rms_norm\npost_attn_norm: true\nvocab_size: 32768\n";

    #[test]
    fn vidur_yaml_parses_llama() {
        let a = Architecture::from_vidur_yaml(
            "meta-llama/Llama-2-7b-hf",
            Path::new("x.yml"),
            LLAMA2_7B,
        )
        .unwrap();
        assert_eq!(a.head_dim, 128);
        assert_eq!(a.q_width(), 4096);
        assert!(a.gated_mlp && a.post_attention_norm);
        assert_eq!(a.norm, NormKind::RmsNorm);
    }

    #[test]
    fn vidur_yaml_errors_name_the_file_and_field() {
        let err = Architecture::from_vidur_yaml("m", Path::new("cfg/m.yml"), "num_layers: 2\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cfg/m.yml"), "{err}");
        let bad_norm = LLAMA2_7B.replace("rms_norm", "batch_norm");
        let err = Architecture::from_vidur_yaml("m", Path::new("m.yml"), &bad_norm)
            .unwrap_err()
            .to_string();
        assert!(err.contains("norm") && err.contains("batch_norm"), "{err}");
    }

    #[test]
    fn catalogue_models_convert() {
        let m = crate::spec::model("Qwen3-8B").unwrap();
        let a = Architecture::from(&m);
        assert!(a.qk_norm);
        assert_eq!(a.kv_width(), m.kv_width());
    }
}
