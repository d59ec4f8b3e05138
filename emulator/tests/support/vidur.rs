//! Readers for Vidur's measured profiles in `predictor/data/vidur-profiling` (per-operator
//! `mlp.csv`, the legacy A100 `attention.csv` and `cpu_overheads.csv`) and
//! `emulator/data/vidur-profiling` (NCCL `all_reduce.csv`), the all-reduce interpolation knots
//! derived from them, and the error metrics the calibration reports. Shared by
//! `tests/calibration.rs` and `examples/calibrate.rs`; test/tooling code, not part of the
//! library (which does no I/O).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::error::Error;
use std::fs;
use std::path::{Path, PathBuf};

use switchyard_emulator::cost::{BatchSummary, ModelShape, OpTimes};
use switchyard_predictor::spec::{DeviceSpec, device};

pub type Res<T> = Result<T, Box<dyn Error>>;

/// Vidur's token-level operator columns, in layer order.
pub const OPS: [&str; 10] = [
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
];

/// The linear (matmul) operators among [`OPS`].
pub const LINEAR_OPS: [&str; 4] = [
    "attn_pre_proj",
    "attn_post_proj",
    "mlp_up_proj",
    "mlp_down_proj",
];

/// The predicted time of a Vidur operator column.
pub fn op_value(t: &OpTimes, op: &str) -> f64 {
    match op {
        "emb" => t.emb,
        "input_layernorm" => t.input_layernorm,
        "attn_pre_proj" => t.attn_pre_proj,
        "attn_rope" => t.attn_rope,
        "attn_post_proj" => t.attn_post_proj,
        "post_attention_layernorm" => t.post_attention_layernorm,
        "mlp_up_proj" => t.mlp_up_proj,
        "mlp_act" => t.mlp_act,
        "mlp_down_proj" => t.mlp_down_proj,
        "add" => t.add,
        _ => f64::NAN,
    }
}

/// Predicted and measured time of one layer (every operator the row lists but the
/// embedding, which runs once per iteration, not per layer).
pub fn layer_pair(row: &MlpRow, t: &OpTimes) -> (f64, f64) {
    let meas: f64 = row
        .ops
        .iter()
        .filter(|(op, _)| **op != "emb")
        .map(|(_, m)| m)
        .sum();
    let pred: f64 = row
        .ops
        .keys()
        .filter(|op| **op != "emb")
        .map(|op| op_value(t, op))
        .sum();
    (pred, meas)
}

pub fn data_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../predictor/data/vidur-profiling")
}

/// The datasheet entry of a Vidur device folder. Vidur's `device_configs/a100.yml` gives the
/// profiled A100 80 GB of memory, hence the A100-80GB (2,039 GB/s) entry.
pub fn device_spec(vidur_device: &str) -> Res<DeviceSpec> {
    let name = match vidur_device {
        "a100" => "A100-80GB",
        "h100" => "H100-80GB",
        other => return Err(format!("no datasheet mapping for Vidur device `{other}`").into()),
    };
    Ok(device(name)?)
}

/// One row of an `mlp.csv`: median times (seconds) of the operators it lists, measured on one
/// GPU of a `tp`-way tensor-parallel group (Vidur's profiler shards the linear layers, rope
/// and activation by `tp`; norms, residual add and embedding width stay whole).
#[derive(Debug, Clone)]
pub struct MlpRow {
    pub model: String,
    /// The whole model's shape (the row's `n_head`, `n_kv_head`, ... are unsharded).
    pub shape: ModelShape,
    pub tp: u32,
    pub num_tokens: u64,
    pub ops: BTreeMap<&'static str, f64>,
}

/// Every TP = 1 row of `profiling/compute/<vidur_device>/<org>/<model>/mlp.csv`, models in
/// path order.
pub fn load_mlp(vidur_device: &str) -> Res<Vec<MlpRow>> {
    load_mlp_tp(vidur_device, 1)
}

/// Every row with `num_tensor_parallel_workers = tp` of the `mlp.csv` profiles of
/// `vidur_device`, models in path order.
pub fn load_mlp_tp(vidur_device: &str, tp: u32) -> Res<Vec<MlpRow>> {
    let tp_field = tp.to_string();
    let dir = data_root().join("profiling/compute").join(vidur_device);
    let mut files = Vec::new();
    for org in sorted_dir(&dir)? {
        for model in sorted_dir(&org)? {
            let f = model.join("mlp.csv");
            if f.is_file() {
                files.push(f);
            }
        }
    }
    if files.is_empty() {
        return Err(format!("no mlp.csv under {}", dir.display()).into());
    }
    let mut rows = Vec::new();
    for f in files {
        let model = f
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut rdr = csv::Reader::from_path(&f)?;
        let headers = rdr.headers()?.clone();
        let col = |name: &str| headers.iter().position(|h| h == name);
        let need =
            |name: &str| col(name).ok_or_else(|| format!("{}: no column {name}", f.display()));
        let (c_tp, c_n) = (need("num_tensor_parallel_workers")?, need("num_tokens")?);
        let (c_h, c_nh, c_kv) = (need("n_embd")?, need("n_head")?, need("n_kv_head")?);
        let (c_i, c_v, c_g) = (
            need("n_expanded_embd")?,
            need("vocab_size")?,
            need("use_gated_mlp")?,
        );
        let op_cols: Vec<(&'static str, usize)> = OPS
            .iter()
            .filter_map(|&op| col(&format!("time_stats.{op}.median")).map(|c| (op, c)))
            .collect();
        for rec in rdr.records() {
            let rec = rec?;
            let field = |c: usize| rec.get(c).unwrap_or("");
            if field(c_tp) != tp_field {
                continue;
            }
            let num = |c: usize| -> Res<u64> { Ok(field(c).parse::<u64>()?) };
            let (hidden, heads, kv_heads) = (num(c_h)?, num(c_nh)?, num(c_kv)?);
            let head_dim = hidden / heads.max(1);
            let shape = ModelShape {
                num_layers: 1,
                hidden,
                q_width: heads * head_dim,
                kv_width: kv_heads * head_dim,
                intermediate: num(c_i)?,
                gated_mlp: field(c_g).eq_ignore_ascii_case("true"),
                vocab: num(c_v)?,
                qk_norm: false,
                attn_output_gate: false,
                linear: None,
            };
            let mut ops = BTreeMap::new();
            for &(op, c) in &op_cols {
                if let Ok(ms) = field(c).parse::<f64>() {
                    ops.insert(op, ms * 1e-3);
                }
            }
            rows.push(MlpRow {
                model: model.clone(),
                shape,
                tp,
                num_tokens: num(c_n)?,
                ops,
            });
        }
    }
    Ok(rows)
}

fn sorted_dir(dir: &Path) -> Res<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    Ok(out)
}

/// One row of the legacy A100 attention profile, as a batch for the cost model.
#[derive(Debug, Clone)]
pub struct AttnRow {
    pub prefill: bool,
    pub batch: BatchSummary,
    /// Median kernel time, seconds.
    pub time_s: f64,
}

/// The attention shape profiled in `legacy/a100/attention.csv`: n_embd 8,192, 64 q heads and
/// 8 kv heads of 128 at TP = 2, i.e. 32 q heads and 4 kv heads per GPU.
pub fn legacy_attention_shape() -> ModelShape {
    ModelShape {
        num_layers: 1,
        hidden: 4096,
        q_width: 32 * 128,
        kv_width: 4 * 128,
        intermediate: 0,
        gated_mlp: true,
        vocab: 0,
        qk_norm: false,
        attn_output_gate: false,
        linear: None,
    }
}

pub fn load_legacy_attention() -> Res<Vec<AttnRow>> {
    let f = data_root().join("legacy/a100/attention.csv");
    let mut rdr = csv::Reader::from_path(&f)?;
    let headers = rdr.headers()?.clone();
    let col = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| format!("{}: no column {name}", f.display()))
    };
    let (c_pre, c_b, c_chunk, c_kv) = (
        col("is_prefill")?,
        col("batch_size")?,
        col("prefill_chunk_size")?,
        col("kv_cache_size")?,
    );
    let (c_tp, c_tq) = (
        col("time_stats.attn_prefill.median")?,
        col("time_stats.attn_decode.median")?,
    );
    let mut rows = Vec::new();
    for rec in rdr.records() {
        let rec = rec?;
        let field = |c: usize| rec.get(c).unwrap_or("");
        let prefill = field(c_pre) == "True";
        let batch_size: u32 = field(c_b).parse()?;
        let chunk: u32 = field(c_chunk).parse()?;
        let kv: u32 = field(c_kv).parse()?;
        let ms: f64 = field(if prefill { c_tp } else { c_tq }).parse()?;
        let mut batch = BatchSummary::default();
        for _ in 0..batch_size {
            if prefill {
                batch.add_chunk(chunk, kv);
            } else {
                // kv_cache_size counts the keys the decode reads.
                batch.add_decode(kv.saturating_sub(1));
            }
        }
        rows.push(AttnRow {
            prefill,
            batch,
            time_s: ms * 1e-3,
        });
    }
    Ok(rows)
}

/// One row of `legacy/a100/cpu_overheads.csv`: sequences in the batch and the per iteration
/// host time (schedule + prepare inputs + sampler + output processing, medians).
#[derive(Debug, Clone, Copy)]
pub struct CpuRow {
    pub batch_size: u32,
    pub time_s: f64,
}

/// The TP = 1 rows of `legacy/a100/cpu_overheads.csv`.
pub fn load_cpu_overheads() -> Res<Vec<CpuRow>> {
    load_cpu_overheads_tp(1)
}

/// The rows of `legacy/a100/cpu_overheads.csv` with `tensor_parallel_degree = tp`.
pub fn load_cpu_overheads_tp(tp: u32) -> Res<Vec<CpuRow>> {
    let tp_field = tp.to_string();
    let f = data_root().join("legacy/a100/cpu_overheads.csv");
    let mut rdr = csv::Reader::from_path(&f)?;
    let headers = rdr.headers()?.clone();
    let col = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| format!("{}: no column {name}", f.display()))
    };
    let parts = [
        col("schedule_median")?,
        col("prepare_inputs_e2e_median")?,
        col("sampler_e2e_median")?,
        col("process_model_outputs_median")?,
    ];
    let (c_tp, c_b) = (col("tensor_parallel_degree")?, col("batch_size")?);
    let mut rows = Vec::new();
    for rec in rdr.records() {
        let rec = rec?;
        let field = |c: usize| rec.get(c).unwrap_or("");
        if field(c_tp) != tp_field {
            continue;
        }
        let mut ms = 0.0;
        for &c in &parts {
            ms += field(c).parse::<f64>()?;
        }
        rows.push(CpuRow {
            batch_size: field(c_b).parse()?,
            time_s: ms * 1e-3,
        });
    }
    Ok(rows)
}

/// Least-squares line `time = base + per_seq × batch_size` through CPU-overhead rows.
pub fn fit_cpu_overhead(rows: &[CpuRow]) -> (f64, f64) {
    let n = rows.len() as f64;
    let mx = rows.iter().map(|r| f64::from(r.batch_size)).sum::<f64>() / n;
    let my = rows.iter().map(|r| r.time_s).sum::<f64>() / n;
    let sxy: f64 = rows.iter().map(|r| (f64::from(r.batch_size) - mx) * (r.time_s - my)).sum();
    let sxx: f64 = rows.iter().map(|r| (f64::from(r.batch_size) - mx).powi(2)).sum();
    let slope = sxy / sxx;
    (my - slope * mx, slope)
}

/// Where the copied network profiles live (`emulator/data/vidur-profiling`, MIT).
pub fn network_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/vidur-profiling")
}

/// One intra-node all-reduce measurement: message bytes and median time, seconds.
#[derive(Debug, Clone, Copy)]
pub struct AllReduceRow {
    pub bytes: f64,
    pub time_s: f64,
}

/// The all-reduce rows of `profiling/network/<node>/all_reduce.csv` among `workers` GPUs of
/// one node (`num_workers = devices_per_node = workers`, as Vidur's predictor filters them),
/// by size.
pub fn load_all_reduce(node: &str, workers: u32) -> Res<Vec<AllReduceRow>> {
    let f = network_root().join("profiling/network").join(node).join("all_reduce.csv");
    let mut rdr = csv::Reader::from_path(&f).map_err(|e| format!("{}: {e}", f.display()))?;
    let headers = rdr.headers()?.clone();
    let col =
        |name: &str| headers.iter().position(|h| h == name).ok_or_else(|| format!("{}: no column {name}", f.display()));
    let (c_t, c_w, c_s, c_c, c_d) = (
        col("time_stats.all_reduce.median")?,
        col("num_workers")?,
        col("size")?,
        col("collective")?,
        col("devices_per_node")?,
    );
    let w = workers.to_string();
    let mut rows = Vec::new();
    for rec in rdr.records() {
        let rec = rec?;
        let field = |c: usize| rec.get(c).unwrap_or("");
        if field(c_c) != "all_reduce" || field(c_w) != w || field(c_d) != w {
            continue;
        }
        rows.push(AllReduceRow { bytes: field(c_s).parse()?, time_s: field(c_t).parse::<f64>()? * 1e-3 });
    }
    rows.sort_by(|a, b| a.bytes.total_cmp(&b.bytes));
    Ok(rows)
}

/// The interpolation knots of an all-reduce profile: for each power of two `s` from 64 KiB to
/// 64 MiB, the rows with sizes in `[s/√2, s·√2)` (every smaller size joins the first window),
/// summarised by the median size and the median time; then made non-decreasing (a running
/// maximum), since a larger message never takes less time and the small-message times are
/// bimodal noise around NCCL's latency floor. `(bytes, seconds)` pairs.
pub fn all_reduce_knots(rows: &[AllReduceRow]) -> Vec<(f64, f64)> {
    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
    }
    let mut knots: Vec<(f64, f64)> = Vec::new();
    for k in 16..=26 {
        let s = f64::from(1u32 << k);
        let lo = if k == 16 { 0.0 } else { s / 2f64.sqrt() };
        let hi = s * 2f64.sqrt();
        let window: Vec<&AllReduceRow> = rows.iter().filter(|r| r.bytes >= lo && r.bytes < hi).collect();
        if window.is_empty() {
            continue;
        }
        let x = median(window.iter().map(|r| r.bytes).collect());
        let y = median(window.iter().map(|r| r.time_s).collect());
        let y = knots.last().map_or(y, |&(_, prev)| y.max(prev));
        knots.push((x, y));
    }
    knots
}

/// Weighted absolute percentage error `Σ|p − m| / Σ m` and mean absolute percentage error.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ErrorStats {
    pub n: usize,
    pub wape: f64,
    pub mape: f64,
}

pub fn error_stats(pairs: impl IntoIterator<Item = (f64, f64)>) -> ErrorStats {
    let (mut n, mut abs, mut total, mut rel) = (0usize, 0.0, 0.0, 0.0);
    for (pred, meas) in pairs {
        if meas <= 0.0 {
            continue;
        }
        n += 1;
        abs += (pred - meas).abs();
        total += meas;
        rel += (pred - meas).abs() / meas;
    }
    if n == 0 {
        return ErrorStats::default();
    }
    ErrorStats {
        n,
        wape: abs / total,
        mape: rel / n as f64,
    }
}
