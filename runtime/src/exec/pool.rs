//! Pool files: which GPUs the (emulated or live) pool has, in YAML.
//!
//! ```yaml
//! name: small
//! devices:
//!   - { kind: A100-40GB, count: 1 }
//!   - { kind: V100-32GB, count: 2 }
//! ```
//! Device kinds come from the catalogue in `switchyard_predictor::spec`. Devices live on
//! hosts (nodes) whose host memory holds the weights of level-1 sleepers (vLLM sleep mode):
//! a group may name its node, and `nodes` may give a node's host memory —
//!
//! ```yaml
//! nodes:
//!   a100-server: { host_memory_gib: 1024 }
//! devices:
//!   - { kind: A100-40GB, count: 4, node: a100-server }
//! ```
//! — groups without a node share one node, `host`; a node without `host_memory_gib` has twice
//! its GPUs' memory ([`DEFAULT_HOST_MEMORY_PER_GPU_MEMORY`]). The live pool file
//! (`live::pool`) extends this one with an engine per device group; this parser reads a live
//! pool file too, ignoring its engines. Every problem of a file is reported at once, each with
//! its line, column and field (an unknown key with the closest known one). Depends on the spec
//! catalogue and the workflow loader's positioned YAML reader only, never on `sim` or `live`.

use std::path::{Path, PathBuf};

use switchyard_predictor::{DeviceSpec, spec};
use thiserror::Error;

/// Why a pool file was rejected.
#[derive(Debug, Error)]
pub enum PoolError {
    #[error("{path}: cannot read: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// Not YAML, or a value of the wrong type or an unknown field (`message` names the field
    /// where the position shows it).
    #[error("{path}:{line}:{column}: {message}")]
    Parse { path: PathBuf, line: u64, column: u64, message: String },
    /// `at` is `:LINE:COLUMN` of the entry, or empty where it is not known.
    #[error("{path}{at}: devices[{index}].kind: {message}")]
    Device { path: PathBuf, at: String, index: usize, message: String },
    #[error("{path}{at}: devices: the pool has no GPU")]
    Empty { path: PathBuf, at: String },
    #[error("{path}{at}: devices[{index}].count: the pool would hold {total} GPUs; at most {max} are supported", max = MAX_POOL_DEVICES)]
    TooManyDevices { path: PathBuf, at: String, index: usize, total: u64 },
    #[error("{path}{at}: nodes.{node}: {message}")]
    Node { path: PathBuf, at: String, node: String, message: String },
    #[error("{path}: the pool file is {size} bytes, more than the limit of {limit} bytes (1 MiB); is this the right file?")]
    TooLarge { path: PathBuf, size: u64, limit: u64 },
    /// Several problems of one file, in file order (each one of the above).
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
    Many(Vec<PoolError>),
}

impl PoolError {
    /// Every problem: the list of a `Many`, else this one.
    pub fn all(&self) -> Vec<&PoolError> {
        match self {
            PoolError::Many(list) => list.iter().collect(),
            other => vec![other],
        }
    }
}

/// Most GPUs a pool may hold (the largest shipped pool has 256): a `count` is checked against
/// it before any device is built, so a typo of a few digits cannot exhaust the host's memory.
pub const MAX_POOL_DEVICES: u64 = 16_384;

/// The running GPU total after a group of `count` devices, or the group's error past
/// [`MAX_POOL_DEVICES`].
pub fn add_devices(total: u64, count: u32) -> Option<u64> {
    Some(total + u64::from(count)).filter(|t| *t <= MAX_POOL_DEVICES)
}

/// Where things are in a pool file, for its errors: the YAML tree with positions (the
/// workflow loader's parser). `None` where the text does not parse.
struct Positions(Option<crate::workflow::yaml::Node>);

impl Positions {
    fn of(text: &str) -> Self {
        Positions(crate::workflow::yaml::parse("", text).ok())
    }

    /// The field path (`devices[0].count`) of the value at `line`:`column`, if one starts there.
    fn field_at(&self, line: u64, column: u64) -> Option<String> {
        use crate::workflow::yaml::{Node, Value};
        fn walk(node: &Node, path: String, line: u64, column: u64) -> Option<String> {
            match &node.value {
                Value::Map(entries) => entries.iter().find_map(|(k, v)| {
                    let p = if path.is_empty() { k.name.clone() } else { format!("{path}.{}", k.name) };
                    if (k.pos.line, k.pos.column) == (line, column) { Some(p) } else { walk(v, p, line, column) }
                }),
                Value::Seq(items) => items.iter().enumerate().find_map(|(i, v)| walk(v, format!("{path}[{i}]"), line, column)),
                _ => ((node.pos.line, node.pos.column) == (line, column) && !path.is_empty()).then_some(path),
            }
        }
        walk(self.0.as_ref()?, String::new(), line, column)
    }
}

/// A serde error of a pool file as `(line, column, message)`: the parser's message once,
/// without its snippet or its repeated position, after the field at that position.
pub fn parse_error(text: &str, e: &serde_saphyr::Error) -> (u64, u64, String) {
    let (line, column) = e.location().map(|l| (l.line().max(1), l.column().max(1))).unwrap_or((1, 1));
    let mut message = e.without_snippet().to_string();
    let prefix = format!("line {line} column {column}: ");
    if let Some(i) = message.find(&prefix) {
        message = message[i + prefix.len()..].to_string();
    }
    if let Some(stripped) = message.strip_suffix(&format!(" at line {line}, column {column}")) {
        message = stripped.to_string();
    }
    match Positions::of(text).field_at(line, column) {
        Some(field) => (line, column, format!("{field}: {message}")),
        None => (line, column, message),
    }
}

/// Largest pool file read (a pool file is a few lines; this bounds what a wrong path costs).
pub const MAX_POOL_FILE_BYTES: u64 = 1 << 20;

/// Read a pool file (the simulator's or the live one) after checking its size against
/// [`MAX_POOL_FILE_BYTES`]; the read itself is bounded too, in case the file grows meanwhile.
pub fn read_pool_file(path: &Path) -> Result<String, PoolError> {
    read_bounded(path, MAX_POOL_FILE_BYTES)
        .map_err(|e| match e {
            Bounded::Io(source) => PoolError::Read { path: path.to_path_buf(), source },
            Bounded::TooLarge(size) => PoolError::TooLarge { path: path.to_path_buf(), size, limit: MAX_POOL_FILE_BYTES },
        })
}

/// Why [`read_bounded`] returned no text.
#[derive(Debug)]
pub enum Bounded {
    Io(std::io::Error),
    /// The file's size in bytes (at least the size seen when the read passed the limit).
    TooLarge(u64),
}

/// Read a UTF-8 text file of at most `limit` bytes: its size is checked before reading, and at
/// most `limit + 1` bytes are read.
pub fn read_bounded(path: &Path, limit: u64) -> Result<String, Bounded> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(Bounded::Io)?;
    let size = file.metadata().map_err(Bounded::Io)?.len();
    if size > limit {
        return Err(Bounded::TooLarge(size));
    }
    let mut bytes = Vec::new();
    let read = file.take(limit + 1).read_to_end(&mut bytes).map_err(Bounded::Io)?;
    if read as u64 > limit {
        return Err(Bounded::TooLarge(read as u64));
    }
    crate::values::utf8_text(bytes).map_err(Bounded::Io)
}

/// The keys of a pool file, of a device group and of a node entry (a live pool file's groups
/// also name their `engine`, which the live pool reads).
const POOL_KEYS: &[&str] = &["name", "description", "devices", "nodes"];
const GROUP_KEYS: &[&str] = &["kind", "count", "node", "engine"];
const NODE_KEYS: &[&str] = &["host_memory_gib"];

/// Host memory of a node without a stated size, per byte of its GPUs' memory: the lower of
/// NVIDIA's DGX-1 (8× V100-32GB, 512 GB: 2.0×) and DGX A100 (8× A100-40GB, 1 TB: 3.2×)
/// datasheet ratios.
pub const DEFAULT_HOST_MEMORY_PER_GPU_MEMORY: f64 = 2.0;

/// The node every device group without `node` belongs to.
pub const DEFAULT_NODE: &str = "host";

/// One host of the pool.
#[derive(Debug, Clone, PartialEq)]
pub struct HostNode {
    pub name: String,
    pub host_memory_bytes: u64,
}

/// A pool: an ordered list of GPUs (device ids are positions in this list).
#[derive(Debug, Clone)]
pub struct PoolSpec {
    pub name: String,
    pub description: Option<String>,
    pub devices: Vec<DeviceSpec>,
    /// The hosts, and the index in `nodes` of each device's host (same order as `devices`).
    pub nodes: Vec<HostNode>,
    pub node_of: Vec<usize>,
}

impl PoolSpec {
    /// A pool of `devices` on one host with the default host memory.
    pub fn on_one_host(name: String, description: Option<String>, devices: Vec<DeviceSpec>) -> Self {
        let gpu: u64 = devices.iter().map(|d| d.memory_bytes).sum();
        let nodes = vec![HostNode {
            name: DEFAULT_NODE.into(),
            host_memory_bytes: (gpu as f64 * DEFAULT_HOST_MEMORY_PER_GPU_MEMORY) as u64,
        }];
        let node_of = vec![0; devices.len()];
        PoolSpec { name, description, devices, nodes, node_of }
    }

    /// Read and validate a pool file.
    pub fn load(path: &Path) -> Result<Self, PoolError> {
        let text = read_pool_file(path)?;
        Self::parse(path, &text)
    }

    /// Parse pool YAML; `path` names the source in errors. Every problem of the file is
    /// reported, each with its line, column and field (a syntax error stops the reading).
    pub fn parse(path: &Path, text: &str) -> Result<Self, PoolError> {
        use crate::workflow::yaml::{self, Ctx, Value};
        use crate::workflow::WorkflowError;
        let file = path.display().to_string();
        let ctx = Ctx { file: &file };
        // The workflow reader's positioned errors, as this file's.
        let placed = |e: WorkflowError| -> Vec<PoolError> {
            e.all()
                .into_iter()
                .map(|e| match e {
                    WorkflowError::Invalid { line, column, field, message, .. } => PoolError::Parse {
                        path: path.to_path_buf(),
                        line: *line,
                        column: *column,
                        message: if field.is_empty() || field == "(document)" { message.clone() } else { format!("{field}: {message}") },
                    },
                    other => PoolError::Parse { path: path.to_path_buf(), line: 1, column: 1, message: other.to_string() },
                })
                .collect()
        };
        let doc = yaml::parse_strict_booleans(&file, text).map_err(|e| many(placed(e)))?;
        let mut read: Vec<WorkflowError> = Vec::new();
        let mut problems: Vec<PoolError> = Vec::new();
        let top = match ctx.map_all(&doc, "", POOL_KEYS, &mut read) {
            Ok(top) => top,
            Err(e) => return Err(many(placed(e))),
        };
        let name = top.required(&ctx, "", "name").and_then(|n| ctx.string(n, "name")).map_err(|e| read.push(e)).ok();
        let description = top.get("description").and_then(|d| ctx.string(d, "description").map_err(|e| read.push(e)).ok());

        // Device groups: each group's problems, every group.
        let mut devices = Vec::new();
        let mut node_names: Vec<String> = Vec::new();
        let mut node_of = Vec::new();
        let mut total = 0u64;
        let mut groups_read = true;
        // The nodes every group names, whether or not the rest of the group reads.
        let mut named: Vec<String> = Vec::new();
        let groups = top.required(&ctx, "", "devices").and_then(|d| ctx.seq(d, "devices")).map_err(|e| read.push(e)).ok();
        for (index, g) in groups.unwrap_or_default().iter().enumerate() {
            let field = format!("devices[{index}]");
            let before = read.len() + problems.len();
            let Ok(m) = ctx.map_all(g, &field, GROUP_KEYS, &mut read).map_err(|e| read.push(e)) else {
                groups_read = false;
                continue;
            };
            let kind = m.required(&ctx, &field, "kind").and_then(|k| Ok((k, ctx.string(k, &format!("{field}.kind"))?))).map_err(|e| read.push(e)).ok();
            let device = kind.and_then(|(k, kind)| {
                spec::device(&kind)
                    .map_err(|e| {
                        problems.push(PoolError::Device {
                            path: path.to_path_buf(),
                            at: format!(":{}:{}", k.pos.line, k.pos.column),
                            index,
                            message: e.to_string(),
                        })
                    })
                    .ok()
            });
            let count = match m.get("count") {
                None => Some(1),
                Some(c) => match ctx.u32(c, &format!("{field}.count")) {
                    Ok(n) => match add_devices(total, n) {
                        Some(t) => {
                            total = t;
                            Some(n)
                        }
                        None => {
                            problems.push(PoolError::TooManyDevices {
                                path: path.to_path_buf(),
                                at: format!(":{}:{}", c.pos.line, c.pos.column),
                                index,
                                total: total + u64::from(n),
                            });
                            None
                        }
                    },
                    Err(_) => {
                        read.push(ctx.err(
                            c.pos,
                            &format!("{field}.count"),
                            crate::workflow::ErrorKind::BadType,
                            format!("expected a whole number of GPUs (0 to {MAX_POOL_DEVICES}), found {}", c.value.describe()),
                        ));
                        None
                    }
                },
            };
            let node = match m.get("node") {
                None => Some(DEFAULT_NODE.to_string()),
                Some(n) => ctx.string(n, &format!("{field}.node")).map_err(|e| read.push(e)).ok(),
            };
            named.extend(node.clone());
            if read.len() + problems.len() > before {
                groups_read = false;
                continue;
            }
            let (Some(d), Some(count), Some(name)) = (device, count, node) else {
                groups_read = false;
                continue;
            };
            let node = match node_names.iter().position(|n| *n == name) {
                Some(i) => i,
                None => {
                    node_names.push(name);
                    node_names.len() - 1
                }
            };
            for _ in 0..count {
                devices.push(d.clone());
                node_of.push(node);
            }
        }
        if groups.is_some() && groups_read && devices.is_empty() {
            let at = top.get("devices").map(|d| format!(":{}:{}", d.pos.line, d.pos.column)).unwrap_or_default();
            problems.push(PoolError::Empty { path: path.to_path_buf(), at });
        }

        // Hosts: each entry's host memory, and that some group names it.
        let mut host_memory: Vec<(String, f64)> = Vec::new();
        if let Some(nodes) = top.get("nodes")
            && let Ok(entries) = ctx.entries(nodes, "nodes").map_err(|e| read.push(e))
        {
            for (key, value) in entries {
                let field = format!("nodes.{}", key.name);
                if !named.contains(&key.name) {
                    problems.push(PoolError::Node {
                        path: path.to_path_buf(),
                        at: format!(":{}:{}", value.pos.line, value.pos.column),
                        node: key.name.clone(),
                        message: format!("no device group names node `{}`", key.name),
                    });
                }
                if matches!(value.value, Value::Null) {
                    continue;
                }
                let Ok(m) = ctx.map_all(value, &field, NODE_KEYS, &mut read).map_err(|e| read.push(e)) else { continue };
                let Some(g) = m.get("host_memory_gib") else { continue };
                match ctx.f64(g, &format!("{field}.host_memory_gib")) {
                    Ok(gib) if gib >= 0.0 => host_memory.push((key.name.clone(), gib)),
                    Ok(gib) => problems.push(PoolError::Node {
                        path: path.to_path_buf(),
                        at: format!(":{}:{}", g.pos.line, g.pos.column),
                        node: key.name.clone(),
                        message: format!("host_memory_gib must be a non-negative number of GiB (got {gib})"),
                    }),
                    Err(e) => read.push(e),
                }
            }
        }
        for e in read {
            problems.extend(placed(e));
        }
        let Some(name) = name.filter(|_| problems.is_empty()) else {
            let position = |e: &PoolError| match e {
                PoolError::Parse { line, column, .. } => (*line, *column),
                PoolError::Device { at, .. } | PoolError::Empty { at, .. } | PoolError::TooManyDevices { at, .. } | PoolError::Node { at, .. } => {
                    let mut parts = at.trim_start_matches(':').split(':').map(|x| x.parse::<u64>().unwrap_or(0));
                    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
                }
                _ => (0, 0),
            };
            problems.sort_by_key(position);
            return Err(many(problems));
        };
        let mut nodes = Vec::new();
        for (i, node) in node_names.iter().enumerate() {
            let gpu: u64 = devices.iter().zip(&node_of).filter(|(_, n)| **n == i).map(|(d, _)| d.memory_bytes).sum();
            let host_memory_bytes = match host_memory.iter().find(|(n, _)| n == node) {
                Some((_, gib)) => (gib * (1u64 << 30) as f64) as u64,
                None => (gpu as f64 * DEFAULT_HOST_MEMORY_PER_GPU_MEMORY) as u64,
            };
            nodes.push(HostNode { name: node.clone(), host_memory_bytes });
        }
        Ok(PoolSpec { name, description, devices, nodes, node_of })
    }
}

/// One error for a list of them (the error itself when there is one).
fn many(mut problems: Vec<PoolError>) -> PoolError {
    if problems.len() == 1
        && let Some(one) = problems.pop()
    {
        return one;
    }
    PoolError::Many(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_live_on_named_nodes_with_their_host_memory() {
        let p = PoolSpec::parse(
            Path::new("p.yaml"),
            "name: t\nnodes:\n  big: { host_memory_gib: 1024 }\ndevices:\n  - { kind: A100-40GB, count: 2, node: big }\n  - { kind: V100-32GB, count: 1, node: small }\n  - { kind: V100-32GB }\n",
        )
        .unwrap();
        assert_eq!(p.node_of, vec![0, 0, 1, 2]);
        assert_eq!(p.nodes[0], HostNode { name: "big".into(), host_memory_bytes: 1024 << 30 });
        // Unsized nodes get twice their GPUs' memory; unnamed groups share `host`.
        assert_eq!(p.nodes[1].host_memory_bytes, 2 * p.devices[2].memory_bytes);
        assert_eq!(p.nodes[2].name, DEFAULT_NODE);
        let one = PoolSpec::on_one_host("x".into(), None, p.devices.clone());
        assert_eq!(one.node_of, vec![0; 4]);
    }

    #[test]
    fn a_huge_count_is_refused_before_any_device_is_built() {
        let e = PoolSpec::parse(Path::new("p.yaml"), "name: t\ndevices:\n  - { kind: A40, count: 2 }\n  - { kind: A40, count: 1000000000 }\n").unwrap_err();
        assert_eq!(e.to_string(), format!("p.yaml:4:25: devices[1].count: the pool would hold 1000000002 GPUs; at most {MAX_POOL_DEVICES} are supported"));
        assert!(PoolSpec::parse(Path::new("p.yaml"), "name: t\ndevices:\n  - { kind: A40, count: 256 }\n").is_ok());
    }

    #[test]
    fn bad_nodes_are_refused_with_their_name() {
        let e = PoolSpec::parse(Path::new("p.yaml"), "name: t\nnodes:\n  ghost: {}\ndevices:\n  - { kind: A40 }\n").unwrap_err();
        assert_eq!(e.to_string(), "p.yaml:3:10: nodes.ghost: no device group names node `ghost`");
        let e = PoolSpec::parse(
            Path::new("p.yaml"),
            "name: t\nnodes:\n  n: { host_memory_gib: -1 }\ndevices:\n  - { kind: A40, node: n }\n",
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("p.yaml:3:25: nodes.n: host_memory_gib must be a non-negative"), "{e}");
        // Each error names the line, column and field, the parser's included.
        let e = PoolSpec::parse(Path::new("p.yaml"), "name: t\ndevices:\n  - { kind: A40 }\n  - { kind: V100-16GB }\n").unwrap_err();
        assert!(e.to_string().starts_with("p.yaml:4:13: devices[1].kind: unknown device `V100-16GB`"), "{e}");
        let e = PoolSpec::parse(Path::new("p.yaml"), "name: t\ndevices:\n  - { kind: A40, count: two }\n").unwrap_err();
        assert_eq!(e.to_string(), "p.yaml:3:25: devices[0].count: expected a whole number of GPUs (0 to 16384), found string `two`");
    }

    #[test]
    fn every_problem_of_a_pool_file_is_listed_with_a_did_you_mean() {
        let text = "name: t\ndevice_count: 3\nnodes:\n  big: { host_memory_gb: 1024 }\ndevices:\n  - { kind: V100-32G, count: 2 }\n  - { kind: A40 }\n  - { kind: A40, cuont: 1 }\n  - { kind: A40, count: two }\n";
        let e = PoolSpec::parse(Path::new("p.yaml"), text).unwrap_err();
        let lines: Vec<String> = e.all().iter().map(|e| e.to_string()).collect();
        assert_eq!(lines.len(), 6, "{e}");
        assert!(lines[0].starts_with("p.yaml:2:1: device_count: unknown field `device_count`"), "{e}");
        assert!(lines[1].starts_with("p.yaml:4:8: nodes.big: no device group names node `big`"), "{e}");
        assert!(lines[2].starts_with("p.yaml:4:10: nodes.big.host_memory_gb: unknown field `host_memory_gb` (did you mean `host_memory_gib`?)"), "{e}");
        assert!(lines[3].starts_with("p.yaml:6:13: devices[0].kind: unknown device `V100-32G`"), "{e}");
        assert!(lines[4].starts_with("p.yaml:8:18: devices[2].cuont: unknown field `cuont` (did you mean `count`?)"), "{e}");
        assert_eq!(lines[5], "p.yaml:9:25: devices[3].count: expected a whole number of GPUs (0 to 16384), found string `two`");
    }

    #[test]
    fn parses_groups_in_order() {
        let p = PoolSpec::parse(
            Path::new("p.yaml"),
            "name: t\ndevices:\n  - { kind: A100-40GB, count: 1 }\n  - { kind: v100-32gb, count: 2 }\n",
        )
        .unwrap();
        let names: Vec<_> = p.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["A100-40GB", "V100-32GB", "V100-32GB"]);
    }

    #[test]
    fn errors_name_the_file_and_position() {
        let e = PoolSpec::parse(Path::new("p.yaml"), "name: t\ndevices:\n  - { kind: B300 }\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.yaml:3:13: devices[0].kind"), "{e}");
        let e = PoolSpec::parse(Path::new("p.yaml"), "name: t\ndevices:\n  - { kind: A40, count: x }\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.yaml:3:"), "{e}");
        assert!(PoolSpec::parse(Path::new("p.yaml"), "name: t\ndevices: []\n").is_err());
    }

    #[test]
    fn a_pool_file_over_the_limit_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.yaml");
        // Sparse: the size is checked, the bytes are never read.
        std::fs::File::create(&path).unwrap().set_len(MAX_POOL_FILE_BYTES + 1).unwrap();
        let e = PoolSpec::load(&path).unwrap_err().to_string();
        assert!(e.contains("huge.yaml") && e.contains(&(MAX_POOL_FILE_BYTES + 1).to_string()) && e.contains("1 MiB"), "{e}");
        let small = dir.path().join("ok.yaml");
        std::fs::write(&small, "name: t\ndevices:\n  - { kind: A40 }\n").unwrap();
        assert_eq!(PoolSpec::load(&small).unwrap().devices.len(), 1);
    }
}
