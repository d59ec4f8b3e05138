//! Reading measured GPU profiles in Vidur's directory layout.
//!
//! ```text
//! DIR/model_configs/<org>/<model>.yml             model shapes (Vidur fields; see `arch`)
//! DIR/device_configs/<device>.yml                 fp16_tflops, total_memory_gb
//!                                                 [, memory_bandwidth_gbps, host_link_gbps]
//! DIR/profiling/compute/<device>/<org>/<model>/mlp.csv        per-operator timings (ms)
//! DIR/profiling/compute/<device>/<org>/<model>/attention.csv  attention timings (optional)
//! DIR/legacy/<device>/attention.csv                           older attention format (optional)
//! ```
//!
//! Vidur's device configs carry no memory bandwidth; `memory_bandwidth_gbps` and
//! `host_link_gbps` are Switchyard's extension. When they are absent the device is matched to
//! the spec-sheet catalogue ([`crate::spec::device_catalogue`]) by name and memory size, so a
//! user adding a GPU either names a catalogued one or writes the two fields.
//!
//! The copy shipped with the crate is compiled into it ([`ProfileData::shipped`]; `build.rs`
//! keeps only the columns read here), so a binary moved away from the source tree still has
//! it; [`DATA_DIR_ENV`] names another directory instead.
//!
//! This module reads files and checks them; it computes no estimate. It must not depend on
//! the estimators, the measured sets or the evaluation (they read it), nor on the emulator
//! or the runtime.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::arch::Architecture;
use crate::error::PredictorError;
use crate::graph::ProfiledOp;
use crate::spec::{self, DeviceSpec, ModelArch};

/// One measured configuration: the non-attention operators of one decoder layer (and the
/// embedding) of `model` on `device`, for one tensor-parallel degree and token count.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredPass {
    pub model: String,
    pub device: String,
    pub tensor_parallel: u32,
    pub tokens: u32,
    /// Median time of each profiled operator, milliseconds; `None` where the CSV has no
    /// column for it (phi-2 has no post-attention norm).
    pub op_ms: [Option<f64>; ProfiledOp::ALL.len()],
}

/// One measured attention kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionSample {
    pub device: String,
    pub q_heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub tensor_parallel: u32,
    pub is_prefill: bool,
    /// Sequences in the batch (decode) or 1 (prefill).
    pub batch_size: u32,
    /// New tokens of the prefill chunk (0 for decode).
    pub chunk: u32,
    /// Tokens already cached per sequence.
    pub kv_cache: u32,
    pub time_ms: f64,
}

/// Everything a profiling directory holds.
#[derive(Debug, Clone, Default)]
pub struct ProfileData {
    pub root: PathBuf,
    /// Model name (`<org>/<model>`) → architecture.
    pub models: BTreeMap<String, Architecture>,
    /// Device name (the `device_configs` file stem, e.g. `a100`) → spec sheet.
    pub devices: BTreeMap<String, DeviceSpec>,
    pub passes: Vec<MeasuredPass>,
    pub attention: Vec<AttentionSample>,
}

#[derive(Deserialize)]
struct VidurDeviceConfig {
    fp16_tflops: f64,
    total_memory_gb: f64,
    #[serde(default)]
    memory_bandwidth_gbps: Option<f64>,
    #[serde(default)]
    host_link_gbps: Option<f64>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PredictorError + '_ {
    move |source| PredictorError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The last component of `path` as UTF-8 (empty when it has none or is not UTF-8).
fn file_name(path: &Path) -> &str {
    path.file_name()
        .and_then(|s| s.to_str())
        .unwrap_or_default()
}

/// The directory of measurements in the source tree (`predictor/data/vidur-profiling`). It
/// exists only where the crate was built; a running program uses [`ProfileData::shipped`],
/// which has the same data compiled in.
pub fn default_train_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join("vidur-profiling")
}

/// Environment variable naming a profiling directory that replaces the shipped data for the
/// default estimators ([`ProfileData::default_source`]).
pub const DATA_DIR_ENV: &str = "SWITCHYARD_PREDICTOR_DATA";

/// The root shown in paths of the compiled-in copy (it names no file on disk).
pub const SHIPPED_ROOT: &str = "(built-in)/predictor/data/vidur-profiling";

mod shipped {
    include!(concat!(env!("OUT_DIR"), "/vidur_profiling.rs"));
}

/// Where the files of a profiling tree come from: a directory on disk, or the copy compiled
/// into the crate. [`ProfileData::load_from`] walks either the same way.
trait Tree {
    fn is_dir(&self, path: &Path) -> bool;
    fn is_file(&self, path: &Path) -> bool;
    /// The entries of `dir`, sorted.
    fn entries(&self, dir: &Path) -> Result<Vec<PathBuf>, PredictorError>;
    fn read(&self, path: &Path) -> Result<Cow<'static, [u8]>, PredictorError>;
    fn read_string(&self, path: &Path) -> Result<String, PredictorError> {
        String::from_utf8(self.read(path)?.into_owned()).map_err(|e| PredictorError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })
    }
}

struct Disk;

impl Tree for Disk {
    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }
    fn is_file(&self, path: &Path) -> bool {
        path.is_file()
    }
    fn entries(&self, dir: &Path) -> Result<Vec<PathBuf>, PredictorError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir).map_err(io(dir))? {
            out.push(entry.map_err(io(dir))?.path());
        }
        out.sort();
        Ok(out)
    }
    fn read(&self, path: &Path) -> Result<Cow<'static, [u8]>, PredictorError> {
        fs::read(path).map(Cow::Owned).map_err(io(path))
    }
}

/// The compiled-in files under [`SHIPPED_ROOT`]; directories are implied by the file paths.
struct Shipped {
    files: BTreeMap<PathBuf, &'static [u8]>,
    dirs: BTreeMap<PathBuf, BTreeSet<PathBuf>>,
}

impl Shipped {
    fn new(root: &Path) -> Self {
        let mut files = BTreeMap::new();
        let mut dirs: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
        for (rel, bytes) in shipped::EMBEDDED_FILES {
            let path = rel.split('/').fold(root.to_path_buf(), |p, c| p.join(c));
            let mut child = path.clone();
            while let Some(parent) = child.parent() {
                let parent = parent.to_path_buf();
                dirs.entry(parent.clone()).or_default().insert(child);
                if parent == root {
                    break;
                }
                child = parent;
            }
            files.insert(path, *bytes);
        }
        Shipped { files, dirs }
    }
}

impl Tree for Shipped {
    fn is_dir(&self, path: &Path) -> bool {
        self.dirs.contains_key(path)
    }
    fn is_file(&self, path: &Path) -> bool {
        self.files.contains_key(path)
    }
    fn entries(&self, dir: &Path) -> Result<Vec<PathBuf>, PredictorError> {
        match self.dirs.get(dir) {
            Some(children) => Ok(children.iter().cloned().collect()),
            None => Err(PredictorError::BadLayout {
                path: dir.to_path_buf(),
                message: "no such directory in the built-in data".into(),
            }),
        }
    }
    fn read(&self, path: &Path) -> Result<Cow<'static, [u8]>, PredictorError> {
        match self.files.get(path) {
            Some(bytes) => Ok(Cow::Borrowed(bytes)),
            None => Err(PredictorError::BadLayout {
                path: path.to_path_buf(),
                message: "no such file in the built-in data".into(),
            }),
        }
    }
}

/// Parse a device config; fields the file lacks come from the catalogue entry with the same
/// name prefix and the closest memory size.
pub fn parse_device(name: &str, path: &Path, yaml: &str) -> Result<DeviceSpec, PredictorError> {
    let bad = |message: String| PredictorError::BadConfig {
        path: path.to_path_buf(),
        message,
    };
    let cfg: VidurDeviceConfig = serde_saphyr::from_str(yaml).map_err(|e| bad(e.to_string()))?;
    let positive = |v: f64| v.is_finite() && v > 0.0;
    for (field, value) in [
        ("fp16_tflops", Some(cfg.fp16_tflops)),
        ("total_memory_gb", Some(cfg.total_memory_gb)),
        ("memory_bandwidth_gbps", cfg.memory_bandwidth_gbps),
        ("host_link_gbps", cfg.host_link_gbps),
    ] {
        if let Some(v) = value.filter(|&v| !positive(v)) {
            return Err(bad(format!("`{field}` must be a finite number > 0, got {v}")));
        }
    }
    let memory_bytes = (cfg.total_memory_gb * (1u64 << 30) as f64) as u64;
    let catalogued = spec::device_catalogue()
        .into_iter()
        .filter(|d| {
            let lower = d.name.to_ascii_lowercase();
            lower == name.to_ascii_lowercase()
                || lower.starts_with(&format!("{}-", name.to_ascii_lowercase()))
        })
        .min_by(|a, b| {
            let da = (a.memory_bytes as f64 - memory_bytes as f64).abs();
            let db = (b.memory_bytes as f64 - memory_bytes as f64).abs();
            da.total_cmp(&db)
        });
    let (bandwidth, link, bf16, source) = match (cfg.memory_bandwidth_gbps, &catalogued) {
        (Some(bw), _) => (
            bw * 1e9,
            cfg.host_link_gbps
                .map(|l| l * 1e9)
                .or(catalogued.as_ref().map(|c| c.host_link_bandwidth))
                .unwrap_or(DEFAULT_HOST_LINK_BYTES_PER_S),
            catalogued.as_ref().is_none_or(|c| c.supports_bf16),
            format!("{}", path.display()),
        ),
        (None, Some(c)) => (
            c.memory_bandwidth,
            cfg.host_link_gbps
                .map(|l| l * 1e9)
                .unwrap_or(c.host_link_bandwidth),
            c.supports_bf16,
            format!(
                "{} (bandwidth from catalogue entry {})",
                path.display(),
                c.name
            ),
        ),
        (None, None) => {
            return Err(bad(format!(
                "no `memory_bandwidth_gbps` field and `{name}` matches no catalogued device ({})",
                spec::device_catalogue()
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    };
    Ok(DeviceSpec {
        name: name.to_string(),
        dense_fp16_flops: cfg.fp16_tflops * 1e12,
        memory_bandwidth: bandwidth,
        memory_bytes,
        host_link_bandwidth: link,
        supports_bf16: bf16,
        source,
    })
}

/// Host link assumed for a device that names neither a link nor a catalogued part:
/// PCIe 4.0 ×16, 32 GB/s one direction (PCI-SIG specification).
pub const DEFAULT_HOST_LINK_BYTES_PER_S: f64 = 32e9;

struct Columns {
    tokens: usize,
    tp: usize,
    ops: [Option<usize>; ProfiledOp::ALL.len()],
}

fn parse_f64(path: &Path, line: u64, field: &str, text: &str) -> Result<f64, PredictorError> {
    text.trim()
        .parse::<f64>()
        .map_err(|e| PredictorError::BadCsv {
            path: path.to_path_buf(),
            line,
            message: format!("column `{field}`: `{text}` is not a number ({e})"),
        })
}

/// `value` of `column` as a whole number in `min..=max`, else [`PredictorError::BadCount`].
fn count(
    path: &Path,
    line: u64,
    column: &str,
    value: f64,
    min: u64,
    max: u64,
) -> Result<u64, PredictorError> {
    // Comparing in f64: every bound used here (at most u32::MAX) is exact.
    if value.fract() == 0.0 && value >= min as f64 && value <= max as f64 {
        Ok(value as u64)
    } else {
        Err(PredictorError::BadCount {
            path: path.to_path_buf(),
            line,
            column: column.to_string(),
            value,
            min,
            max,
        })
    }
}

/// [`count`] into a `u32` (`max` at most `u32::MAX`).
fn count_u32(path: &Path, line: u64, column: &str, value: f64, min: u32) -> Result<u32, PredictorError> {
    count(path, line, column, value, u64::from(min), u64::from(u32::MAX)).map(|v| v as u32)
}

/// Read one `mlp.csv`. Rows repeated for the same (tokens, TP) are averaged.
pub fn read_mlp_csv(
    path: &Path,
    model: &str,
    device: &str,
) -> Result<Vec<MeasuredPass>, PredictorError> {
    parse_mlp_csv(path, &Disk.read(path)?, model, device)
}

/// [`read_mlp_csv`] of the bytes of `path`.
fn parse_mlp_csv(
    path: &Path,
    bytes: &[u8],
    model: &str,
    device: &str,
) -> Result<Vec<MeasuredPass>, PredictorError> {
    let mut reader = csv::Reader::from_reader(bytes);
    let headers = reader
        .headers()
        .map_err(|e| PredictorError::BadCsv {
            path: path.to_path_buf(),
            line: 1,
            message: e.to_string(),
        })?
        .clone();
    let find = |name: &str| headers.iter().position(|h| h == name);
    let need = |name: &str| {
        find(name).ok_or_else(|| PredictorError::BadCsv {
            path: path.to_path_buf(),
            line: 1,
            message: format!("missing column `{name}`"),
        })
    };
    let mut cols = Columns {
        tokens: need("num_tokens")?,
        tp: need("num_tensor_parallel_workers")?,
        ops: [None; ProfiledOp::ALL.len()],
    };
    for op in ProfiledOp::ALL {
        cols.ops[op.index()] = find(&format!("time_stats.{}.median", op.column()));
    }
    if cols.ops.iter().all(Option::is_none) {
        return Err(PredictorError::BadCsv {
            path: path.to_path_buf(),
            line: 1,
            message: "no `time_stats.<operator>.median` column".into(),
        });
    }
    // (tokens, tp) → (sum of each op, count)
    let mut acc: BTreeMap<(u32, u32), ([f64; ProfiledOp::ALL.len()], u32)> = BTreeMap::new();
    for (i, record) in reader.records().enumerate() {
        let line = i as u64 + 2;
        let record = record.map_err(|e| PredictorError::BadCsv {
            path: path.to_path_buf(),
            line,
            message: e.to_string(),
        })?;
        let get = |idx: usize, field: &str| -> Result<f64, PredictorError> {
            parse_f64(path, line, field, record.get(idx).unwrap_or(""))
        };
        let tokens = count_u32(path, line, "num_tokens", get(cols.tokens, "num_tokens")?, 1)?;
        let tp = count_u32(
            path,
            line,
            "num_tensor_parallel_workers",
            get(cols.tp, "num_tensor_parallel_workers")?,
            1,
        )?;
        let slot = acc
            .entry((tokens, tp))
            .or_insert(([0.0; ProfiledOp::ALL.len()], 0));
        for op in ProfiledOp::ALL {
            if let Some(idx) = cols.ops[op.index()] {
                let field = format!("time_stats.{}.median", op.column());
                let ms = get(idx, &field)?;
                if !(ms.is_finite() && ms >= 0.0) {
                    return Err(PredictorError::BadCsv {
                        path: path.to_path_buf(),
                        line,
                        message: format!("column `{field}`: {ms} is not a time"),
                    });
                }
                slot.0[op.index()] += ms;
            }
        }
        slot.1 += 1;
    }
    Ok(acc
        .into_iter()
        .map(|((tokens, tp), (sums, count))| {
            let mut op_ms = [None; ProfiledOp::ALL.len()];
            for op in ProfiledOp::ALL {
                if cols.ops[op.index()].is_some() {
                    op_ms[op.index()] = Some(sums[op.index()] / f64::from(count));
                }
            }
            MeasuredPass {
                model: model.to_string(),
                device: device.to_string(),
                tensor_parallel: tp,
                tokens,
                op_ms,
            }
        })
        .collect())
}

/// Read an attention CSV (Vidur's legacy or current format: both carry `n_embd`, `n_q_head`,
/// `n_kv_head`, `num_tensor_parallel_workers`, `batch_size`, `prefill_chunk_size`,
/// `kv_cache_size`, `is_prefill` and `time_stats.attn_{prefill,decode}.median`).
pub fn read_attention_csv(
    path: &Path,
    device: &str,
) -> Result<Vec<AttentionSample>, PredictorError> {
    parse_attention_csv(path, &Disk.read(path)?, device)
}

/// [`read_attention_csv`] of the bytes of `path`.
fn parse_attention_csv(
    path: &Path,
    bytes: &[u8],
    device: &str,
) -> Result<Vec<AttentionSample>, PredictorError> {
    let csv_err = |line: u64, message: String| PredictorError::BadCsv {
        path: path.to_path_buf(),
        line,
        message,
    };
    let mut reader = csv::Reader::from_reader(bytes);
    let headers = reader
        .headers()
        .map_err(|e| csv_err(1, e.to_string()))?
        .clone();
    let col = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| csv_err(1, format!("missing column `{name}`")))
    };
    let (embd, qh, kvh, tp, bs, chunk, kv, pre) = (
        col("n_embd")?,
        col("n_q_head")?,
        col("n_kv_head")?,
        col("num_tensor_parallel_workers")?,
        col("batch_size")?,
        col("prefill_chunk_size")?,
        col("kv_cache_size")?,
        col("is_prefill")?,
    );
    let (t_pre, t_dec) = (
        col("time_stats.attn_prefill.median")?,
        col("time_stats.attn_decode.median")?,
    );
    let mut out = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let line = i as u64 + 2;
        let record = record.map_err(|e| csv_err(line, e.to_string()))?;
        let field = |idx: usize| record.get(idx).unwrap_or("");
        let num = |idx: usize, name: &str| parse_f64(path, line, name, field(idx));
        let is_prefill = match field(pre).trim() {
            "True" | "true" | "1" => true,
            "False" | "false" | "0" => false,
            other => return Err(csv_err(line, format!("column `is_prefill`: `{other}`"))),
        };
        let time_ms = num(
            if is_prefill { t_pre } else { t_dec },
            "time_stats.attn_*.median",
        )?;
        if !(time_ms.is_finite() && time_ms >= 0.0) {
            return Err(csv_err(line, format!("column `time_stats.attn_*.median`: {time_ms} is not a time")));
        }
        // Counts are whole numbers; a 0 TP degree or batch reads as 1, as it always did.
        let whole = |idx: usize, name: &str, min: u32| count_u32(path, line, name, num(idx, name)?, min);
        let q_heads = u64::from(whole(qh, "n_q_head", 1)?);
        let n_embd = u64::from(whole(embd, "n_embd", 0)?);
        if n_embd < q_heads {
            return Err(csv_err(line, "column `n_embd`: smaller than `n_q_head` (a head of no dimensions)".into()));
        }
        out.push(AttentionSample {
            device: device.to_string(),
            q_heads,
            kv_heads: u64::from(whole(kvh, "n_kv_head", 0)?),
            head_dim: n_embd / q_heads,
            tensor_parallel: whole(tp, "num_tensor_parallel_workers", 0)?.max(1),
            is_prefill,
            batch_size: whole(bs, "batch_size", 0)?.max(1),
            chunk: whole(chunk, "prefill_chunk_size", 0)?,
            kv_cache: whole(kv, "kv_cache_size", 0)?,
            time_ms,
        });
    }
    Ok(out)
}

fn read_model_config(
    tree: &dyn Tree,
    root: &Path,
    model: &str,
) -> Result<Architecture, PredictorError> {
    let yml = root.join("model_configs").join(format!("{model}.yml"));
    let json = root.join("model_configs").join(format!("{model}.json"));
    if tree.is_file(&yml) {
        let text = tree.read_string(&yml)?;
        Architecture::from_vidur_yaml(model, &yml, &text)
    } else if tree.is_file(&json) {
        let text = tree.read_string(&json)?;
        let arch = ModelArch::from_hf_config(model, &json.display().to_string(), &text)?;
        if arch.linear_attention.is_some() {
            // The operator graph is a dense decoder's: a hybrid's Gated DeltaNet layers would
            // be predicted as attention layers.
            return Err(PredictorError::BadLayout {
                path: json,
                message: format!("`{model}` is a hybrid (linear-attention) model; the predictor models dense decoders"),
            });
        }
        Ok(Architecture::from(&arch))
    } else {
        Err(PredictorError::BadLayout {
            path: yml,
            message: format!("measurements of `{model}` exist but its model config does not"),
        })
    }
}

impl ProfileData {
    /// Load a profiling directory. Every model and device with measurements must have a
    /// config; configs without measurements are loaded too (they can be predicted).
    pub fn load(root: &Path) -> Result<Self, PredictorError> {
        Self::load_from(&Disk, root)
    }

    /// The measurements shipped with the crate, from the copy compiled into it (the same
    /// numbers as [`ProfileData::load`] of [`default_train_dir`]; no file is read). Paths in
    /// errors and in [`ProfileData::root`] start with [`SHIPPED_ROOT`].
    pub fn shipped() -> Result<Self, PredictorError> {
        let root = Path::new(SHIPPED_ROOT);
        Self::load_from(&Shipped::new(root), root)
    }

    /// The data the default estimators train on: the directory named by `override_dir` (the
    /// value of [`DATA_DIR_ENV`]) when it is set and not empty, else [`ProfileData::shipped`].
    pub fn default_source(override_dir: Option<&std::ffi::OsStr>) -> Result<Self, PredictorError> {
        match override_dir.filter(|d| !d.is_empty()) {
            None => Self::shipped(),
            Some(dir) => {
                let dir = Path::new(dir);
                if !dir.is_dir() {
                    return Err(PredictorError::BadLayout {
                        path: dir.to_path_buf(),
                        message: format!(
                            "{DATA_DIR_ENV} names this profiling directory, which does not exist \
                             or is not a directory (unset it to use the built-in data)"
                        ),
                    });
                }
                Self::load(dir)
            }
        }
    }

    fn load_from(tree: &dyn Tree, root: &Path) -> Result<Self, PredictorError> {
        if !tree.is_dir(root) {
            return Err(PredictorError::BadLayout {
                path: root.to_path_buf(),
                message: "not a directory".into(),
            });
        }
        let mut data = ProfileData {
            root: root.to_path_buf(),
            ..ProfileData::default()
        };
        let dev_dir = root.join("device_configs");
        if tree.is_dir(&dev_dir) {
            for path in tree.entries(&dev_dir)? {
                if path.extension().and_then(|e| e.to_str()) != Some("yml") {
                    continue;
                }
                let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
                    continue;
                };
                let text = tree.read_string(&path)?;
                data.devices
                    .insert(name.to_string(), parse_device(name, &path, &text)?);
            }
        }
        let compute = root.join("profiling").join("compute");
        if tree.is_dir(&compute) {
            for dev_path in tree.entries(&compute)? {
                if !tree.is_dir(&dev_path) {
                    continue;
                }
                let device = file_name(&dev_path).to_string();
                if !data.devices.contains_key(&device) {
                    return Err(PredictorError::BadLayout {
                        path: dev_dir.join(format!("{device}.yml")),
                        message: format!(
                            "measurements on `{device}` exist but its device config does not"
                        ),
                    });
                }
                for org_path in tree.entries(&dev_path)? {
                    if !tree.is_dir(&org_path) {
                        continue;
                    }
                    for model_path in tree.entries(&org_path)? {
                        let mlp = model_path.join("mlp.csv");
                        let attn = model_path.join("attention.csv");
                        if !tree.is_file(&mlp) && !tree.is_file(&attn) {
                            continue;
                        }
                        let org = file_name(&org_path);
                        let leaf = file_name(&model_path);
                        let model = format!("{org}/{leaf}");
                        if !data.models.contains_key(&model) {
                            let arch = read_model_config(tree, root, &model)?;
                            data.models.insert(model.clone(), arch);
                        }
                        if tree.is_file(&mlp) {
                            let bytes = tree.read(&mlp)?;
                            data.passes.extend(parse_mlp_csv(&mlp, &bytes, &model, &device)?);
                        }
                        if tree.is_file(&attn) {
                            let bytes = tree.read(&attn)?;
                            data.attention.extend(parse_attention_csv(&attn, &bytes, &device)?);
                        }
                    }
                }
            }
        }
        let legacy = root.join("legacy");
        if tree.is_dir(&legacy) {
            for dev_path in tree.entries(&legacy)? {
                let attn = dev_path.join("attention.csv");
                let device = file_name(&dev_path);
                if tree.is_file(&attn) && data.devices.contains_key(device) {
                    let bytes = tree.read(&attn)?;
                    data.attention.extend(parse_attention_csv(&attn, &bytes, device)?);
                }
            }
        }
        // Models with a config but no measurements can still be predicted.
        let cfg_dir = root.join("model_configs");
        if tree.is_dir(&cfg_dir) {
            for org_path in tree.entries(&cfg_dir)? {
                if !tree.is_dir(&org_path) {
                    continue;
                }
                for path in tree.entries(&org_path)? {
                    let ext = path.extension().and_then(|e| e.to_str());
                    if ext != Some("yml") && ext != Some("json") {
                        continue;
                    }
                    let org = file_name(&org_path);
                    let stem = path
                        .file_stem()
                        .and_then(|s| s.to_str())
                        .unwrap_or_default();
                    let model = format!("{org}/{stem}");
                    // A config that does not parse is an error only when it is measured.
                    if let std::collections::btree_map::Entry::Vacant(slot) =
                        data.models.entry(model.clone())
                        && let Ok(arch) = read_model_config(tree, root, &model)
                    {
                        slot.insert(arch);
                    }
                }
            }
        }
        if data.passes.is_empty() {
            return Err(PredictorError::BadLayout {
                path: compute,
                message: "no `profiling/compute/<device>/<org>/<model>/mlp.csv` measurements"
                    .into(),
            });
        }
        Ok(data)
    }

    /// Models with measurements, sorted.
    pub fn measured_models(&self) -> Vec<String> {
        let mut v: Vec<String> = self.passes.iter().map(|p| p.model.clone()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Devices with measurements, sorted.
    pub fn measured_devices(&self) -> Vec<String> {
        let mut v: Vec<String> = self.passes.iter().map(|p| p.device.clone()).collect();
        v.sort();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_bandwidth_comes_from_the_catalogue() {
        let d = parse_device(
            "a100",
            Path::new("a100.yml"),
            "fp16_tflops: 312\ntotal_memory_gb: 80\n",
        )
        .unwrap();
        assert_eq!(d.memory_bandwidth, 2039e9);
        let d = parse_device(
            "h100",
            Path::new("h100.yml"),
            "fp16_tflops: 1000\ntotal_memory_gb: 80\n",
        )
        .unwrap();
        assert_eq!(d.memory_bandwidth, 3350e9);
        assert_eq!(d.dense_fp16_flops, 1000e12);
    }

    #[test]
    fn unknown_device_needs_a_bandwidth_field() {
        let err = parse_device(
            "mi300x",
            Path::new("d/mi300x.yml"),
            "fp16_tflops: 1307\ntotal_memory_gb: 192\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("memory_bandwidth_gbps") && err.contains("d/mi300x.yml"),
            "{err}"
        );
        let d = parse_device(
            "mi300x",
            Path::new("mi300x.yml"),
            "fp16_tflops: 1307\ntotal_memory_gb: 192\nmemory_bandwidth_gbps: 5300\n",
        )
        .unwrap();
        assert_eq!(d.memory_bandwidth, 5300e9);
        assert_eq!(d.host_link_bandwidth, DEFAULT_HOST_LINK_BYTES_PER_S);
    }

    #[test]
    fn device_numbers_must_be_finite_and_positive() {
        for (field, value) in [
            ("memory_bandwidth_gbps", "-1"),
            ("memory_bandwidth_gbps", "0"),
            ("memory_bandwidth_gbps", ".inf"),
            ("host_link_gbps", ".nan"),
            ("fp16_tflops", ".inf"),
        ] {
            let mut fields = vec![("fp16_tflops", "312"), ("total_memory_gb", "80"), ("memory_bandwidth_gbps", "2000")];
            fields.retain(|(f, _)| *f != field);
            fields.push((field, value));
            let yaml: String = fields.iter().map(|(f, v)| format!("{f}: {v}\n")).collect();
            let err = parse_device("a100", Path::new("d/a100.yml"), &yaml).map(|_| ()).unwrap_err().to_string();
            assert!(err.contains(field) && err.contains("d/a100.yml") && err.contains("finite number > 0"), "{field}: {value}: {err}");
        }
    }

    #[test]
    fn attention_times_must_be_finite_and_heads_have_dimensions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attention.csv");
        let header = "n_embd,n_q_head,n_kv_head,num_tensor_parallel_workers,batch_size,prefill_chunk_size,kv_cache_size,is_prefill,time_stats.attn_prefill.median,time_stats.attn_decode.median\n";
        let good = "4096,32,8,1,1,0,1024,False,0.1,0.05\n";
        for (row, needle) in [("4096,32,8,1,1,0,1024,False,0.1,inf\n", "is not a time"), ("16,32,8,1,1,0,1024,False,0.1,0.05\n", "n_embd")] {
            std::fs::write(&path, format!("{header}{good}{row}")).unwrap();
            let err = read_attention_csv(&path, "a100").map(|_| ()).unwrap_err().to_string();
            assert!(err.contains(needle) && err.contains("attention.csv") && err.contains('3'), "{err}");
        }
        std::fs::write(&path, format!("{header}{good}")).unwrap();
        assert_eq!(read_attention_csv(&path, "a100").map(|v| v.len()).ok(), Some(1));
    }

    #[test]
    fn mlp_csv_errors_name_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mlp.csv");
        fs::write(
            &path,
            "time_stats.add.median,num_tokens,num_tensor_parallel_workers\n0.1,4,1\nabc,8,1\n",
        )
        .unwrap();
        let err = read_mlp_csv(&path, "m", "d").unwrap_err().to_string();
        assert!(err.contains("line 3") && err.contains("abc"), "{err}");
    }

    #[test]
    fn counts_that_are_not_whole_numbers_in_range_are_errors_naming_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mlp.csv");
        // Each was truncated or saturated into a u32: 4.5 tokens read as 4, 1e10 as u32::MAX.
        for (row, column) in [
            ("0.1,4.5,1", "num_tokens"),
            ("0.1,1e10,1", "num_tokens"),
            ("0.1,0,1", "num_tokens"),
            ("0.1,8,2.5", "num_tensor_parallel_workers"),
            ("0.1,8,-1", "num_tensor_parallel_workers"),
        ] {
            fs::write(&path, format!("time_stats.add.median,num_tokens,num_tensor_parallel_workers\n0.1,4,1\n{row}\n")).unwrap();
            let err = read_mlp_csv(&path, "m", "d").unwrap_err();
            assert!(
                matches!(&err, PredictorError::BadCount { line: 3, column: c, .. } if c == column),
                "{row}: {err:?}"
            );
            let text = err.to_string();
            assert!(text.contains("mlp.csv") && text.contains("line 3") && text.contains("whole number"), "{text}");
        }
        let path = dir.path().join("attention.csv");
        let header = "n_embd,n_q_head,n_kv_head,num_tensor_parallel_workers,batch_size,prefill_chunk_size,kv_cache_size,is_prefill,time_stats.attn_prefill.median,time_stats.attn_decode.median\n";
        for (row, column) in [
            ("4096,32.5,8,1,1,0,1024,False,0.1,0.05", "n_q_head"),
            ("4096,32,8,1,1,0,5e9,False,0.1,0.05", "kv_cache_size"),
            ("4096,32,8,1,1.5,0,1024,False,0.1,0.05", "batch_size"),
        ] {
            fs::write(&path, format!("{header}{row}\n")).unwrap();
            let err = read_attention_csv(&path, "a100").unwrap_err();
            assert!(
                matches!(&err, PredictorError::BadCount { line: 2, column: c, .. } if c == column),
                "{row}: {err:?}"
            );
        }
    }

    #[test]
    fn duplicate_rows_are_averaged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mlp.csv");
        fs::write(
            &path,
            "time_stats.add.median,num_tokens,num_tensor_parallel_workers\n0.1,4,1\n0.3,4,1\n0.5,8,1\n",
        )
        .unwrap();
        let rows = read_mlp_csv(&path, "m", "d").unwrap();
        assert_eq!(rows.len(), 2);
        let add = rows[0].op_ms[ProfiledOp::Add.index()].unwrap();
        assert!((add - 0.2).abs() < 1e-12);
        assert_eq!(rows[0].op_ms[ProfiledOp::Emb.index()], None);
    }

    #[test]
    fn embedded_data_is_the_source_tree() {
        // build.rs keeps only the columns the readers use: every parsed number is the same.
        let disk = ProfileData::load(&default_train_dir()).unwrap();
        let built_in = ProfileData::shipped().unwrap();
        assert_eq!(built_in.root, Path::new(SHIPPED_ROOT));
        assert!(!built_in.root.exists());
        assert_eq!(built_in.passes, disk.passes);
        assert_eq!(built_in.attention, disk.attention);
        assert_eq!(
            built_in.models.keys().collect::<Vec<_>>(),
            disk.models.keys().collect::<Vec<_>>()
        );
        assert_eq!(
            built_in.devices.keys().collect::<Vec<_>>(),
            disk.devices.keys().collect::<Vec<_>>()
        );
        for (name, dev) in &disk.devices {
            let b = &built_in.devices[name];
            assert_eq!(
                (b.dense_fp16_flops, b.memory_bandwidth, b.memory_bytes, b.host_link_bandwidth, b.supports_bf16),
                (dev.dense_fp16_flops, dev.memory_bandwidth, dev.memory_bytes, dev.host_link_bandwidth, dev.supports_bf16),
                "{name}"
            );
        }
        for (name, arch) in &disk.models {
            assert_eq!(format!("{:?}", built_in.models[name]), format!("{arch:?}"), "{name}");
        }
    }

    #[test]
    fn shipped_data_loads() {
        let data = ProfileData::load(&crate::data::default_train_dir()).unwrap();
        assert_eq!(
            data.measured_devices(),
            vec!["a100".to_string(), "h100".to_string()]
        );
        assert_eq!(data.measured_models().len(), 8);
        assert!(data.passes.len() > 14_000, "{}", data.passes.len());
        assert!(!data.attention.is_empty());
        assert!(data.models["microsoft/phi-2"].rotary_fraction < 1.0);
    }
}
