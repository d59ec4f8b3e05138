//! The operator data-flow graph of a model deployment (paper 003 §3.3, `G_m` of Eq. 1).
//!
//! A deployment (architecture + dtype + tensor-parallel degree) becomes a graph of operators:
//! the embedding, then per decoder layer the norms, the fused QKV projection, rotary embedding,
//! attention, the output projection, residual adds, the (gated) MLP up projection, its
//! activation and the down projection; then the final norm and the LM head. Each node carries
//! its operator type, its shape (GEMM `k × n`, element widths, heads), its parameter bytes,
//! whether it repeats per layer, and the Vidur profile column that measures it, if any. Each edge
//! carries the activation tensor a producer hands to a consumer. Instantiating a node for a
//! [`ForwardPass`] gives its FLOPs and bytes ([`OpCost`]).
//!
//! The graph holds shapes and work counts only. Turning work into time is the estimators' job
//! ([`crate::estimators`]); this module must not depend on them.

use serde::{Deserialize, Serialize};

use crate::arch::{Architecture, NormKind};
use crate::request::ForwardPass;
use crate::spec::Dtype;

/// Operator classes. The graph estimator learns one time model per class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum OpKind {
    Embedding,
    Norm,
    Gemm,
    Rotary,
    Attention,
    Activation,
    ResidualAdd,
}

impl OpKind {
    pub const ALL: [OpKind; 7] = [
        OpKind::Embedding,
        OpKind::Norm,
        OpKind::Gemm,
        OpKind::Rotary,
        OpKind::Attention,
        OpKind::Activation,
        OpKind::ResidualAdd,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Embedding => "embedding",
            OpKind::Norm => "norm",
            OpKind::Gemm => "gemm",
            OpKind::Rotary => "rotary",
            OpKind::Attention => "attention",
            OpKind::Activation => "activation",
            OpKind::ResidualAdd => "residual_add",
        }
    }
}

/// The operators Vidur profiles in `mlp.csv` (`time_stats.<column>.median`, milliseconds,
/// one decoder layer of one tensor-parallel shard). Attention kernels, the final norm and the
/// LM head are not among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ProfiledOp {
    Emb,
    InputLayernorm,
    AttnPreProj,
    AttnRope,
    AttnPostProj,
    PostAttentionLayernorm,
    MlpUpProj,
    MlpAct,
    MlpDownProj,
    Add,
}

impl ProfiledOp {
    pub const ALL: [ProfiledOp; 10] = [
        ProfiledOp::Emb,
        ProfiledOp::InputLayernorm,
        ProfiledOp::AttnPreProj,
        ProfiledOp::AttnRope,
        ProfiledOp::AttnPostProj,
        ProfiledOp::PostAttentionLayernorm,
        ProfiledOp::MlpUpProj,
        ProfiledOp::MlpAct,
        ProfiledOp::MlpDownProj,
        ProfiledOp::Add,
    ];

    /// The Vidur column stem.
    pub fn column(self) -> &'static str {
        match self {
            ProfiledOp::Emb => "emb",
            ProfiledOp::InputLayernorm => "input_layernorm",
            ProfiledOp::AttnPreProj => "attn_pre_proj",
            ProfiledOp::AttnRope => "attn_rope",
            ProfiledOp::AttnPostProj => "attn_post_proj",
            ProfiledOp::PostAttentionLayernorm => "post_attention_layernorm",
            ProfiledOp::MlpUpProj => "mlp_up_proj",
            ProfiledOp::MlpAct => "mlp_act",
            ProfiledOp::MlpDownProj => "mlp_down_proj",
            ProfiledOp::Add => "add",
        }
    }

    /// Index into [`ProfiledOp::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Whether a node runs once per forward pass or once per decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Repeat {
    Once,
    PerLayer,
}

/// What a node's rows are: every token of the pass, or only each sequence's last token
/// (vLLM computes logits only at the positions it samples).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rows {
    Tokens,
    Sequences,
}

/// An operator's shape, per row (token or sequence), on one tensor-parallel shard.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum OpShape {
    /// `(rows × k) · (k × n)`.
    Gemm { k: u64, n: u64 },
    /// Gather of one `width`-wide row per token from a table.
    Embedding { width: u64 },
    /// Normalization of `groups` vectors of `width` per row.
    Norm { width: u64, groups: u64 },
    /// An elementwise map over `width` elements per row, reading `inputs` and writing
    /// `outputs` tensors of that width.
    Elementwise {
        width: u64,
        inputs: u64,
        outputs: u64,
        flops_per_element: u64,
    },
    /// Scaled-dot-product attention over the KV cache (heads local to the shard).
    Attention {
        q_heads: u64,
        kv_heads: u64,
        head_dim: u64,
    },
}

/// One operator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpNode {
    pub name: String,
    pub kind: OpKind,
    pub repeat: Repeat,
    pub rows: Rows,
    pub shape: OpShape,
    /// Weight bytes this node holds on its shard.
    pub param_bytes: u64,
    /// Elements per row of the node's output tensor.
    pub output_width: u64,
    /// The measured operator, where Vidur profiles one.
    pub profiled: Option<ProfiledOp>,
}

/// A tensor dependency: `from`'s output feeds `to`. Nodes are stored in a topological order,
/// so `from < to` always.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
}

/// Which nodes a time estimate covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Coverage {
    /// Every operator of the forward pass.
    Full,
    /// Only the operators Vidur's `mlp.csv` measures (what the evaluation can judge).
    Profiled,
    /// The operators it does not measure (attention, q/k norms, final norm, LM head).
    Unprofiled,
}

impl Coverage {
    pub fn includes(self, node: &OpNode) -> bool {
        match self {
            Coverage::Full => true,
            Coverage::Profiled => node.profiled.is_some(),
            Coverage::Unprofiled => node.profiled.is_none(),
        }
    }
}

/// A servable configuration of a model: the paper's deployment `d` (model + serving config).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deployment {
    pub arch: Architecture,
    pub dtype: Dtype,
    /// Tensor-parallel degree (Switchyard serves every replica on one GPU: 1).
    pub tensor_parallel: u32,
}

impl Deployment {
    pub fn new(arch: Architecture, dtype: Dtype) -> Self {
        Deployment {
            arch,
            dtype,
            tensor_parallel: 1,
        }
    }

    /// A stable name, e.g. `Qwen3-8B/bf16` or `Qwen3-8B/bf16/tp2`.
    pub fn name(&self) -> String {
        let dtype = match self.dtype {
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
            Dtype::Fp32 => "fp32",
            Dtype::Fp8 => "fp8",
        };
        if self.tensor_parallel > 1 {
            format!("{}/{dtype}/tp{}", self.arch.name, self.tensor_parallel)
        } else {
            format!("{}/{dtype}", self.arch.name)
        }
    }
}

/// Work of one node instance in one forward pass (per shard).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OpCost {
    /// Rows processed (tokens or sequences).
    pub rows: f64,
    /// Floating-point operations.
    pub flops: f64,
    /// Bytes moved to and from device memory (inputs, weights, outputs).
    pub bytes: f64,
    /// Inner dimension (GEMM `k`, element width otherwise).
    pub k: f64,
    /// Output dimension (GEMM `n`, element width otherwise).
    pub n: f64,
}

/// The operator graph of one deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperatorGraph {
    pub deployment: Deployment,
    pub nodes: Vec<OpNode>,
    pub edges: Vec<Edge>,
}

/// Flops per element assumed for the elementwise operators (counting multiply, add,
/// exponent and reciprocal as one each). These only matter where an operator is compute
/// bound, which elementwise operators on GPUs never are; they are order-of-magnitude counts.
const ROTARY_FLOPS_PER_ELEMENT: u64 = 3;
const SILU_AND_MUL_FLOPS_PER_ELEMENT: u64 = 5;
const GELU_FLOPS_PER_ELEMENT: u64 = 8;
const RMS_NORM_FLOPS_PER_ELEMENT: f64 = 4.0;
const LAYER_NORM_FLOPS_PER_ELEMENT: f64 = 7.0;

struct Builder {
    nodes: Vec<OpNode>,
    edges: Vec<Edge>,
}

impl Builder {
    #[allow(clippy::too_many_arguments)]
    fn node(
        &mut self,
        name: &str,
        kind: OpKind,
        repeat: Repeat,
        shape: OpShape,
        param_bytes: u64,
        output_width: u64,
        profiled: Option<ProfiledOp>,
        inputs: &[usize],
    ) -> usize {
        let id = self.nodes.len();
        self.nodes.push(OpNode {
            name: name.to_string(),
            kind,
            repeat,
            rows: Rows::Tokens,
            shape,
            param_bytes,
            output_width,
            profiled,
        });
        for &from in inputs {
            self.edges.push(Edge { from, to: id });
        }
        id
    }
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b.max(1))
}

impl OperatorGraph {
    /// Build the graph of a deployment. Heads, the MLP width and the vocabulary are split over
    /// `tensor_parallel` shards (key/value heads are replicated when fewer than shards), as
    /// Megatron-style tensor parallelism in vLLM does; the graph is one shard's.
    pub fn build(deployment: &Deployment) -> Self {
        let a = &deployment.arch;
        let e = deployment.dtype.bytes();
        let t = u64::from(deployment.tensor_parallel.max(1));
        let h = a.hidden_size;
        let q_heads = ceil_div(a.num_q_heads, t);
        let kv_heads = ceil_div(a.num_kv_heads, t);
        let hd = a.head_dim;
        let q_w = q_heads * hd;
        let kv_w = kv_heads * hd;
        let inter = ceil_div(a.intermediate_size, t);
        let vocab = ceil_div(a.vocab_size, t);
        let norm_params = match a.norm {
            NormKind::RmsNorm => h * e,
            NormKind::LayerNorm => 2 * h * e,
        };
        let bias = |n: u64, on: bool| if on { n * e } else { 0 };
        let norm = OpShape::Norm {
            width: h,
            groups: 1,
        };
        use OpKind as K;
        use ProfiledOp as P;
        use Repeat::{Once, PerLayer};
        let mut b = Builder {
            nodes: Vec::new(),
            edges: Vec::new(),
        };

        let emb = b.node(
            "embedding",
            K::Embedding,
            Once,
            OpShape::Embedding { width: h },
            vocab * h * e,
            h,
            Some(P::Emb),
            &[],
        );
        // One decoder layer; its input is the previous layer's output (the embedding here).
        let x = emb;
        let ln1 = b.node(
            "input_norm",
            K::Norm,
            PerLayer,
            norm,
            norm_params,
            h,
            Some(P::InputLayernorm),
            &[x],
        );
        let qkv_n = q_w + 2 * kv_w;
        let qkv = b.node(
            "qkv_proj",
            K::Gemm,
            PerLayer,
            OpShape::Gemm { k: h, n: qkv_n },
            h * qkv_n * e + bias(qkv_n, a.qkv_bias),
            qkv_n,
            Some(P::AttnPreProj),
            &[ln1],
        );
        let rope_inputs = if a.qk_norm {
            // Per-head norms of q and of k (one `head_dim` weight vector each).
            let mut head_norm = |name: &str, heads: u64| {
                b.node(
                    name,
                    K::Norm,
                    PerLayer,
                    OpShape::Norm {
                        width: hd,
                        groups: heads,
                    },
                    hd * e,
                    heads * hd,
                    None,
                    &[qkv],
                )
            };
            vec![head_norm("q_norm", q_heads), head_norm("k_norm", kv_heads)]
        } else {
            vec![qkv]
        };
        let rope = b.node(
            "rotary",
            K::Rotary,
            PerLayer,
            rotary_shape(q_heads + kv_heads, hd, a.rotary_fraction),
            0,
            q_w + kv_w,
            Some(P::AttnRope),
            &rope_inputs,
        );
        // Attention reads q and k (rotated) and v (straight from the projection).
        let attn = b.node(
            "attention",
            K::Attention,
            PerLayer,
            OpShape::Attention {
                q_heads,
                kv_heads,
                head_dim: hd,
            },
            0,
            q_w,
            None,
            &[rope, qkv],
        );
        let o = b.node(
            "o_proj",
            K::Gemm,
            PerLayer,
            OpShape::Gemm { k: q_w, n: h },
            q_w * h * e + bias(h, a.linear_bias),
            h,
            Some(P::AttnPostProj),
            &[attn],
        );
        let residual_add = |b: &mut Builder, name: &str, inputs: &[usize]| {
            let add = OpShape::Elementwise {
                width: h,
                inputs: 2,
                outputs: 1,
                flops_per_element: 1,
            };
            b.node(
                name,
                K::ResidualAdd,
                PerLayer,
                add,
                0,
                h,
                Some(P::Add),
                inputs,
            )
        };
        let up_n = if a.gated_mlp { 2 * inter } else { inter };
        // SiLU-and-mul reads the gate and up halves; a plain GELU reads one tensor.
        let act_shape = OpShape::Elementwise {
            width: inter,
            inputs: if a.gated_mlp { 2 } else { 1 },
            outputs: 1,
            flops_per_element: if a.gated_mlp {
                SILU_AND_MUL_FLOPS_PER_ELEMENT
            } else {
                GELU_FLOPS_PER_ELEMENT
            },
        };
        let mlp = |b: &mut Builder, input: usize| {
            let up = b.node(
                "mlp_up_proj",
                K::Gemm,
                PerLayer,
                OpShape::Gemm { k: h, n: up_n },
                h * up_n * e + bias(up_n, a.linear_bias),
                up_n,
                Some(P::MlpUpProj),
                &[input],
            );
            let act = b.node(
                "mlp_act",
                K::Activation,
                PerLayer,
                act_shape,
                0,
                inter,
                Some(P::MlpAct),
                &[up],
            );
            b.node(
                "mlp_down_proj",
                K::Gemm,
                PerLayer,
                OpShape::Gemm { k: inter, n: h },
                inter * h * e + bias(h, a.linear_bias),
                h,
                Some(P::MlpDownProj),
                &[act],
            )
        };
        // The two blocks add the same residuals; they differ in where the MLP reads and so in
        // the order the nodes run.
        let layer_out = if a.post_attention_norm {
            let add1 = residual_add(&mut b, "residual_add_attn", &[x, o]);
            let ln2 = b.node(
                "post_attention_norm",
                K::Norm,
                PerLayer,
                norm,
                norm_params,
                h,
                Some(P::PostAttentionLayernorm),
                &[add1],
            );
            let down = mlp(&mut b, ln2);
            residual_add(&mut b, "residual_add_mlp", &[add1, down])
        } else {
            // Parallel block: x + attn(ln(x)) + mlp(ln(x)).
            let down = mlp(&mut b, ln1);
            let add1 = residual_add(&mut b, "residual_add_attn", &[x, o]);
            residual_add(&mut b, "residual_add_mlp", &[add1, down])
        };
        let final_norm = b.node(
            "final_norm",
            K::Norm,
            Once,
            norm,
            norm_params,
            h,
            None,
            &[layer_out],
        );
        let head_params = if a.tied_embeddings { 0 } else { h * vocab * e };
        let lm_head = b.node(
            "lm_head",
            K::Gemm,
            Once,
            OpShape::Gemm { k: h, n: vocab },
            head_params,
            vocab,
            None,
            &[final_norm],
        );
        // vLLM computes logits only at the positions it samples: one row per sequence.
        b.nodes[lm_head].rows = Rows::Sequences;
        OperatorGraph {
            deployment: deployment.clone(),
            nodes: b.nodes,
            edges: b.edges,
        }
    }

    /// Number of decoder layers (the repetition count of `PerLayer` nodes).
    pub fn layers(&self) -> u64 {
        self.deployment.arch.num_layers
    }

    /// How many times a node runs per forward pass.
    pub fn repetitions(&self, node: &OpNode) -> u64 {
        match node.repeat {
            Repeat::Once => 1,
            Repeat::PerLayer => self.layers(),
        }
    }

    /// Weight bytes of the whole shard.
    pub fn param_bytes(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| n.param_bytes * self.repetitions(n))
            .sum()
    }

    /// Number of weight tensors (nodes with parameters, counted per layer); a loader pays a
    /// per-tensor cost for each.
    pub fn weight_tensors(&self) -> u64 {
        self.nodes
            .iter()
            .filter(|n| n.param_bytes > 0)
            .map(|n| self.repetitions(n))
            .sum()
    }

    /// KV-cache bytes per token on this shard (K and V of every layer).
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| match n.shape {
                OpShape::Attention {
                    kv_heads, head_dim, ..
                } => 2 * kv_heads * head_dim * self.deployment.dtype.bytes() * self.repetitions(n),
                _ => 0,
            })
            .sum()
    }

    fn rows(node: &OpNode, pass: &ForwardPass) -> f64 {
        match node.rows {
            Rows::Tokens => pass.tokens() as f64,
            Rows::Sequences => f64::from(pass.sequences),
        }
    }

    /// The work of one execution of `node` in `pass`.
    pub fn cost(&self, node: &OpNode, pass: &ForwardPass) -> OpCost {
        let e = self.deployment.dtype.bytes() as f64;
        let m = Self::rows(node, pass);
        match node.shape {
            OpShape::Gemm { k, n } => {
                let (k, n) = (k as f64, n as f64);
                OpCost {
                    rows: m,
                    flops: 2.0 * m * k * n,
                    bytes: e * (m * k + m * n) + node.param_bytes as f64,
                    k,
                    n,
                }
            }
            OpShape::Embedding { width } => {
                let w = width as f64;
                // Read the gathered rows and write them out, plus 4-byte token ids.
                OpCost {
                    rows: m,
                    flops: 0.0,
                    bytes: 2.0 * e * m * w + 4.0 * m,
                    k: w,
                    n: w,
                }
            }
            OpShape::Norm { width, groups } => {
                let elements = m * (width * groups) as f64;
                let per = match self.deployment.arch.norm {
                    NormKind::RmsNorm => RMS_NORM_FLOPS_PER_ELEMENT,
                    NormKind::LayerNorm => LAYER_NORM_FLOPS_PER_ELEMENT,
                };
                OpCost {
                    rows: m,
                    flops: per * elements,
                    bytes: 2.0 * e * elements + node.param_bytes as f64,
                    k: width as f64,
                    n: (width * groups) as f64,
                }
            }
            OpShape::Elementwise {
                width,
                inputs,
                outputs,
                flops_per_element,
            } => {
                let elements = m * width as f64;
                OpCost {
                    rows: m,
                    flops: flops_per_element as f64 * elements,
                    bytes: e * (inputs + outputs) as f64 * elements,
                    k: width as f64,
                    n: width as f64,
                }
            }
            OpShape::Attention {
                q_heads,
                kv_heads,
                head_dim,
            } => attention_cost(q_heads, kv_heads, head_dim, self.deployment.dtype, pass),
        }
    }

    /// Bytes of node `i`'s output tensor in `pass`.
    fn output_bytes(&self, i: usize, pass: &ForwardPass) -> f64 {
        let node = &self.nodes[i];
        Self::rows(node, pass) * node.output_width as f64 * self.deployment.dtype.bytes() as f64
    }

    /// Bytes an edge carries in `pass` (the producer's output tensor).
    pub fn edge_bytes(&self, edge: &Edge, pass: &ForwardPass) -> f64 {
        self.output_bytes(edge.from, pass)
    }

    /// Peak bytes of live activation tensors while executing the nodes in their stored
    /// (topological) order: a node's output lives until its last consumer has run. Layers run
    /// one after another, so one layer's peak is the stack's peak. The LM head's logits are
    /// kept in fp32 for sampling.
    pub fn activation_peak_bytes(&self, pass: &ForwardPass) -> f64 {
        let n = self.nodes.len();
        let mut last_use: Vec<usize> = (0..n).collect();
        for edge in &self.edges {
            if edge.to > last_use[edge.from] {
                last_use[edge.from] = edge.to;
            }
        }
        let mut peak: f64 = 0.0;
        for step in 0..n {
            let live: f64 = (0..=step)
                .filter(|&i| last_use[i] >= step)
                .map(|i| {
                    let bytes = self.output_bytes(i, pass);
                    // The per-sequence node is the LM head: its logits are fp32.
                    if self.nodes[i].rows == Rows::Sequences {
                        bytes * 4.0 / self.deployment.dtype.bytes() as f64
                    } else {
                        bytes
                    }
                })
                .sum();
            peak = peak.max(live);
        }
        peak
    }

    /// Combine per-node times (`node_times[i]` for one execution of node `i`; nodes outside
    /// `coverage` are skipped) into the time of one forward pass.
    ///
    /// The once-nodes before and after the layer stack are in series with it, so the pass
    /// takes `once-part + layers × layer-part`. Within each part the length is the critical
    /// path through the data-flow edges, but no shorter than the total work spread over
    /// [`KERNEL_STREAMS`] streams: vLLM launches a layer's kernels on one CUDA stream, so the
    /// kernels of parallel branches (phi-2's attention and MLP) run one after another.
    pub fn combine(&self, node_times: &[f64], coverage: Coverage) -> f64 {
        let part = |repeat: Repeat| {
            let mut finish = vec![0.0_f64; self.nodes.len()];
            let mut total = 0.0;
            let mut critical: f64 = 0.0;
            for (i, node) in self.nodes.iter().enumerate() {
                if node.repeat != repeat || !coverage.includes(node) {
                    continue;
                }
                let t = node_times.get(i).copied().unwrap_or(0.0);
                let ready = self
                    .edges
                    .iter()
                    .filter(|e| e.to == i && self.nodes[e.from].repeat == repeat)
                    .map(|e| finish[e.from])
                    .fold(0.0, f64::max);
                finish[i] = ready + t;
                critical = critical.max(finish[i]);
                total += t;
            }
            critical.max(total / KERNEL_STREAMS as f64)
        };
        part(Repeat::Once) + self.layers() as f64 * part(Repeat::PerLayer)
    }
}

/// The work of scaled-dot-product attention with `q_heads` / `kv_heads` heads of `head_dim`
/// (local to one shard) in `pass`: QK^T and PV, causal within the new tokens (each new token
/// attends to the cached context and on average half of the new tokens); bytes read Q, write
/// O, read K and V of context and new tokens, and write the new K and V into the cache.
pub fn attention_cost(
    q_heads: u64,
    kv_heads: u64,
    head_dim: u64,
    dtype: Dtype,
    pass: &ForwardPass,
) -> OpCost {
    let e = dtype.bytes() as f64;
    let s = f64::from(pass.sequences);
    let q = f64::from(pass.query_tokens);
    let c = f64::from(pass.context_tokens);
    let (qh, kvh, d) = (q_heads as f64, kv_heads as f64, head_dim as f64);
    let attended = c + (q + 1.0) / 2.0;
    OpCost {
        rows: s * q,
        flops: 4.0 * s * qh * d * q * attended,
        bytes: e * s * (2.0 * q * qh * d + (c + q) * 2.0 * kvh * d + q * 2.0 * kvh * d),
        k: c + q,
        n: qh * d,
    }
}

impl OperatorGraph {
    /// The measured time of one forward pass over the profiled operators, assembled on this
    /// graph from per-operator measurements in milliseconds (`op_ms[ProfiledOp::index()]`).
    /// `None` when a profiled node's operator was not measured.
    pub fn measured_seconds(&self, op_ms: &[Option<f64>]) -> Option<f64> {
        let mut times = vec![0.0; self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate() {
            if let Some(op) = node.profiled {
                times[i] = op_ms.get(op.index()).copied().flatten()? / 1000.0;
            }
        }
        Some(self.combine(&times, Coverage::Profiled))
    }
}

/// Concurrent kernel streams of one engine iteration. vLLM runs a forward pass on a single
/// CUDA stream (its model runner issues kernels in program order), so it is 1.
pub const KERNEL_STREAMS: usize = 1;

fn rotary_shape(heads: u64, head_dim: u64, fraction: f64) -> OpShape {
    let rotated = ((head_dim as f64 * fraction).round() as u64).max(1);
    OpShape::Elementwise {
        width: heads * rotated,
        inputs: 1,
        outputs: 1,
        flops_per_element: ROTARY_FLOPS_PER_ELEMENT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{self, Dtype};

    fn qwen(name: &str) -> OperatorGraph {
        let arch = Architecture::from(&spec::model(name).unwrap());
        OperatorGraph::build(&Deployment::new(arch, Dtype::Bf16))
    }

    #[test]
    fn graph_parameters_match_the_spec_sheet() {
        for m in spec::model_catalogue() {
            let g = OperatorGraph::build(&Deployment::new(Architecture::from(&m), Dtype::Bf16));
            assert_eq!(g.param_bytes(), m.param_bytes(Dtype::Bf16), "{}", m.name);
            assert_eq!(
                g.kv_bytes_per_token(),
                m.kv_bytes_per_token(Dtype::Bf16),
                "{}",
                m.name
            );
        }
    }

    #[test]
    fn gemm_flops_by_hand() {
        // Qwen3-8B qkv_proj: k = 4096, n = 32·128 + 2·8·128 = 6144; 10 tokens → 2·10·4096·6144.
        let g = qwen("Qwen3-8B");
        let node = g.nodes.iter().find(|n| n.name == "qkv_proj").unwrap();
        let c = g.cost(node, &ForwardPass::prefill(1, 10));
        assert_eq!(c.flops, 2.0 * 10.0 * 4096.0 * 6144.0);
        // Weights dominate the bytes of a one-token GEMM.
        let c1 = g.cost(node, &ForwardPass::decode(1, 10));
        assert_eq!(c1.bytes, 2.0 * (4096.0 + 6144.0) + (4096 * 6144 * 2) as f64);
    }

    #[test]
    fn linear_flops_match_the_spec_sheet() {
        let m = spec::model("Qwen3-4B").unwrap();
        let g = qwen("Qwen3-4B");
        let pass = ForwardPass::prefill(1, 1);
        let gemm: f64 = g
            .nodes
            .iter()
            .filter(|n| n.kind == OpKind::Gemm)
            .map(|n| g.cost(n, &pass).flops * g.repetitions(n) as f64)
            .sum();
        assert_eq!(gemm, m.linear_flops_per_token() as f64);
    }

    #[test]
    fn attention_decode_reads_the_whole_cache() {
        let g = qwen("Qwen3-8B");
        let node = g
            .nodes
            .iter()
            .find(|n| n.kind == OpKind::Attention)
            .unwrap();
        let c = g.cost(node, &ForwardPass::decode(1, 999));
        // KV of 1000 tokens of one layer = 1000 · 2 · 8 · 128 · 2 bytes, plus q/o and the write.
        let kv = 1000.0 * 2.0 * 8.0 * 128.0 * 2.0;
        assert!(c.bytes >= kv && c.bytes < kv * 1.02, "{}", c.bytes);
    }

    #[test]
    fn edges_are_topological_and_every_node_is_reachable() {
        for name in ["Qwen3-0.6B", "Qwen3-32B"] {
            let g = qwen(name);
            assert!(g.edges.iter().all(|e| e.from < e.to));
            for i in 1..g.nodes.len() {
                assert!(
                    g.edges.iter().any(|e| e.to == i),
                    "{} has no input",
                    g.nodes[i].name
                );
            }
        }
    }

    #[test]
    fn combine_sums_a_chain_and_repeats_layers() {
        let g = qwen("Qwen3-0.6B");
        let times = vec![1.0; g.nodes.len()];
        let once = g.nodes.iter().filter(|n| n.repeat == Repeat::Once).count() as f64;
        let per = g
            .nodes
            .iter()
            .filter(|n| n.repeat == Repeat::PerLayer)
            .count() as f64;
        assert_eq!(
            g.combine(&times, Coverage::Full),
            once + g.layers() as f64 * per
        );
        let profiled_per = g
            .nodes
            .iter()
            .filter(|n| n.repeat == Repeat::PerLayer && n.profiled.is_some())
            .count() as f64;
        assert_eq!(
            g.combine(&times, Coverage::Profiled),
            1.0 + g.layers() as f64 * profiled_per
        );
    }

    #[test]
    fn tensor_parallel_shards_the_weights() {
        let arch = Architecture::from(&spec::model("Qwen3-8B").unwrap());
        let one = OperatorGraph::build(&Deployment::new(arch.clone(), Dtype::Bf16));
        let mut d = Deployment::new(arch, Dtype::Bf16);
        d.tensor_parallel = 2;
        let two = OperatorGraph::build(&d);
        let ratio = one.param_bytes() as f64 / two.param_bytes() as f64;
        assert!((ratio - 2.0).abs() < 0.01, "{ratio}");
    }

    #[test]
    fn activation_peak_grows_with_tokens() {
        let g = qwen("Qwen3-8B");
        let small = g.activation_peak_bytes(&ForwardPass::prefill(1, 16));
        let big = g.activation_peak_bytes(&ForwardPass::prefill(1, 1024));
        assert!(big > 32.0 * small, "{small} {big}");
        // The gated MLP's up projection (2 × 12288 wide) is the largest tensor of a layer.
        assert!(big >= 1024.0 * 2.0 * 12288.0 * 2.0);
    }
}
