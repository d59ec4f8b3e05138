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
//! pool file too, ignoring its engines. Depends on the spec
//! catalogue and serde only, never on `sim` or `live`.

use std::path::{Path, PathBuf};

use serde::Deserialize;
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

    /// `:LINE:COLUMN` of the value at `path` (map keys and sequence indices), or "".
    fn at(&self, path: &[PathStep<'_>]) -> String {
        use crate::workflow::yaml::Value;
        let Some(mut node) = self.0.as_ref() else { return String::new() };
        for step in path {
            let next = match (step, &node.value) {
                (PathStep::Key(k), Value::Map(entries)) => entries.iter().find(|(key, _)| key.name == *k).map(|(_, v)| v),
                (PathStep::Index(i), Value::Seq(items)) => items.get(*i),
                _ => None,
            };
            match next {
                Some(n) => node = n,
                None => return String::new(),
            }
        }
        format!(":{}:{}", node.pos.line, node.pos.column)
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

enum PathStep<'a> {
    Key(&'a str),
    Index(usize),
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolFile {
    name: String,
    #[serde(default)]
    description: Option<String>,
    devices: Vec<DeviceGroup>,
    #[serde(default)]
    nodes: std::collections::BTreeMap<String, NodeEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeEntry {
    #[serde(default)]
    host_memory_gib: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceGroup {
    kind: String,
    #[serde(default = "one")]
    count: u32,
    #[serde(default)]
    node: Option<String>,
    /// A live pool file's engine (`live::pool`): the simulator reads such a file for its
    /// devices and nodes and leaves the engines to `--live`.
    #[serde(default)]
    #[allow(dead_code)]
    engine: Option<serde::de::IgnoredAny>,
}

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

fn one() -> u32 {
    1
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

    /// Parse pool YAML; `path` names the source in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Self, PoolError> {
        let file: PoolFile = serde_saphyr::from_str(text).map_err(|e| {
            let (line, column, message) = parse_error(text, &e);
            PoolError::Parse { path: path.to_path_buf(), line, column, message }
        })?;
        let positions = Positions::of(text);
        let mut devices = Vec::new();
        let mut node_names: Vec<String> = Vec::new();
        let mut node_of = Vec::new();
        let mut total = 0u64;
        for (index, group) in file.devices.iter().enumerate() {
            total = add_devices(total, group.count).ok_or_else(|| PoolError::TooManyDevices {
                path: path.to_path_buf(),
                at: positions.at(&[PathStep::Key("devices"), PathStep::Index(index), PathStep::Key("count")]),
                index,
                total: total + u64::from(group.count),
            })?;
            let d = spec::device(&group.kind).map_err(|e| PoolError::Device {
                path: path.to_path_buf(),
                at: positions.at(&[PathStep::Key("devices"), PathStep::Index(index), PathStep::Key("kind")]),
                index,
                message: e.to_string(),
            })?;
            let name = group.node.clone().unwrap_or_else(|| DEFAULT_NODE.to_string());
            let node = match node_names.iter().position(|n| *n == name) {
                Some(i) => i,
                None => {
                    node_names.push(name);
                    node_names.len() - 1
                }
            };
            for _ in 0..group.count {
                devices.push(d.clone());
                node_of.push(node);
            }
        }
        if devices.is_empty() {
            return Err(PoolError::Empty { path: path.to_path_buf(), at: positions.at(&[PathStep::Key("devices")]) });
        }
        for name in file.nodes.keys() {
            if !node_names.contains(name) {
                return Err(PoolError::Node {
                    path: path.to_path_buf(),
                    at: positions.at(&[PathStep::Key("nodes"), PathStep::Key(name)]),
                    node: name.clone(),
                    message: format!("no device group names node `{name}`"),
                });
            }
        }
        let mut nodes = Vec::new();
        for (i, name) in node_names.iter().enumerate() {
            let gpu: u64 = devices.iter().zip(&node_of).filter(|(_, n)| **n == i).map(|(d, _)| d.memory_bytes).sum();
            let host_memory_bytes = match file.nodes.get(name).and_then(|n| n.host_memory_gib) {
                Some(gib) if gib.is_finite() && gib >= 0.0 => (gib * (1u64 << 30) as f64) as u64,
                Some(gib) => {
                    return Err(PoolError::Node {
                        path: path.to_path_buf(),
                        at: positions.at(&[PathStep::Key("nodes"), PathStep::Key(name), PathStep::Key("host_memory_gib")]),
                        node: name.clone(),
                        message: format!("host_memory_gib must be a non-negative number of GiB (got {gib})"),
                    });
                }
                None => (gpu as f64 * DEFAULT_HOST_MEMORY_PER_GPU_MEMORY) as u64,
            };
            nodes.push(HostNode { name: name.clone(), host_memory_bytes });
        }
        Ok(PoolSpec { name: file.name, description: file.description, devices, nodes, node_of })
    }
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
        assert_eq!(e.to_string(), "p.yaml:3:25: devices[0].count: invalid u32");
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
