//! Live pool files: the simulator's pool YAML plus, per device group, the engine that serves
//! its replicas.
//!
//! ```yaml
//! name: live-emulated
//! devices:
//!   - kind: A100-40GB
//!     count: 1
//!     engine: { kind: vllm, command: "switchyard emulate --device {device} --model {model} --port {port} --speed 50" }
//! ```
//! The `engine` mapping is parsed into the caller's type `E` (the engines' `EngineSpec`), so
//! this parser does not depend on any engine. Errors name the file, and the line and column or
//! the device group. Depends on the spec catalogue, serde and the shared `exec::PoolSpec`.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::DeserializeOwned;
use switchyard_predictor::spec;
use thiserror::Error;

use crate::exec::PoolSpec;

/// Why a live pool file was rejected.
#[derive(Debug, Error)]
pub enum LivePoolError {
    #[error("{path}: cannot read: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}:{column}: {message}")]
    Parse { path: PathBuf, line: u64, column: u64, message: String },
    #[error("{path}: devices[{index}].kind: {message}")]
    Device { path: PathBuf, index: usize, message: String },
    #[error("{path}: devices: the pool has no GPU")]
    Empty { path: PathBuf },
    #[error("{path}: devices[{index}].count: the pool would hold {total} GPUs; at most {max} are supported", max = crate::exec::pool::MAX_POOL_DEVICES)]
    TooManyDevices { path: PathBuf, index: usize, total: u64 },
    #[error("{path}: devices[{index}].engine: required to run live (which engine serves this device?)")]
    MissingEngine { path: PathBuf, index: usize },
    #[error("{path}: devices[{index}].engine.{field}: {message}")]
    Engine { path: PathBuf, index: usize, field: &'static str, message: String },
    #[error("{path}: the pool file is {size} bytes, more than the limit of {limit} bytes (1 MiB); is this the right file?")]
    TooLarge { path: PathBuf, size: u64, limit: u64 },
    /// The file's devices and nodes, as the simulator's pool parser reads them.
    #[error("{0}")]
    Pool(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(bound = "E: DeserializeOwned")]
struct PoolFile<E> {
    // The name, description and nodes are read by [`PoolSpec::parse`]; listed here so that
    // the file's other fields are still checked.
    #[allow(dead_code)]
    name: String,
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    devices: Vec<DeviceGroup<E>>,
    /// Host memory per node, as in the simulator's pool file (read by [`PoolSpec::parse`]).
    #[serde(default)]
    #[allow(dead_code)]
    nodes: std::collections::BTreeMap<String, serde::de::IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(bound = "E: DeserializeOwned")]
struct DeviceGroup<E> {
    kind: String,
    #[serde(default = "one")]
    count: u32,
    /// The group's host, as in the simulator's pool file (read by [`PoolSpec::parse`]).
    #[serde(default)]
    #[allow(dead_code)]
    node: Option<String>,
    #[serde(default = "Option::default")]
    engine: Option<E>,
}

fn one() -> u32 {
    1
}

/// One device of a live pool.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveDevice<E> {
    /// Index of the device group in the file.
    pub group: usize,
    /// Position of the device within its group (0..count), e.g. for `CUDA_VISIBLE_DEVICES`.
    pub ordinal: u32,
    pub engine: Option<E>,
}

/// A live pool: the planner's [`PoolSpec`] and, per device (same order), its engine.
#[derive(Debug, Clone)]
pub struct LivePoolSpec<E> {
    pub path: PathBuf,
    pub pool: PoolSpec,
    pub devices: Vec<LiveDevice<E>>,
}

impl<E: DeserializeOwned + Clone> LivePoolSpec<E> {
    /// Read and validate a live pool file.
    pub fn load(path: &Path) -> Result<Self, LivePoolError> {
        let text = crate::exec::pool::read_bounded(path, crate::exec::pool::MAX_POOL_FILE_BYTES).map_err(|e| match e {
            crate::exec::pool::Bounded::Io(source) => LivePoolError::Read { path: path.to_path_buf(), source },
            crate::exec::pool::Bounded::TooLarge(size) => LivePoolError::TooLarge {
                path: path.to_path_buf(),
                size,
                limit: crate::exec::pool::MAX_POOL_FILE_BYTES,
            },
        })?;
        Self::parse(path, &text)
    }

    /// Parse live pool YAML; `path` names the source in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Self, LivePoolError> {
        // The devices and their hosts as the simulator reads the same file (`node`, `nodes`:
        // the host memory level-1 sleepers use), with its positioned errors; then the engines.
        let pool = PoolSpec::parse(path, text).map_err(|e| LivePoolError::Pool(e.to_string()))?;
        let file: PoolFile<E> = serde_saphyr::from_str(text).map_err(|e| {
            let (line, column, message) = crate::exec::pool::parse_error(text, &e);
            LivePoolError::Parse { path: path.to_path_buf(), line, column, message }
        })?;
        let mut specs = Vec::new();
        let mut devices = Vec::new();
        let mut total = 0u64;
        for (index, group) in file.devices.iter().enumerate() {
            total = crate::exec::pool::add_devices(total, group.count).ok_or_else(|| LivePoolError::TooManyDevices {
                path: path.to_path_buf(),
                index,
                total: total + u64::from(group.count),
            })?;
            let d = spec::device(&group.kind).map_err(|e| LivePoolError::Device {
                path: path.to_path_buf(),
                index,
                message: e.to_string(),
            })?;
            for ordinal in 0..group.count {
                specs.push(d.clone());
                devices.push(LiveDevice { group: index, ordinal, engine: group.engine.clone() });
            }
        }
        if specs.is_empty() {
            return Err(LivePoolError::Empty { path: path.to_path_buf() });
        }
        debug_assert_eq!(pool.devices.len(), specs.len());
        Ok(LivePoolSpec { path: path.to_path_buf(), pool, devices })
    }

    /// The engine of every device, or the first group that names none.
    pub fn engines(&self) -> Result<Vec<E>, LivePoolError> {
        self.devices
            .iter()
            .map(|d| {
                d.engine
                    .clone()
                    .ok_or(LivePoolError::MissingEngine { path: self.path.clone(), index: d.group })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Eng {
        kind: String,
        #[serde(default)]
        command: Option<String>,
    }

    #[test]
    fn groups_expand_in_order_with_their_engines() {
        let p: LivePoolSpec<Eng> = LivePoolSpec::parse(
            Path::new("p.yaml"),
            "name: t\ndevices:\n  - { kind: A100-40GB, engine: { kind: vllm, command: \"x {port}\" } }\n  - { kind: l4, count: 2, engine: { kind: openai } }\n",
        )
        .unwrap();
        let names: Vec<_> = p.pool.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["A100-40GB", "L4", "L4"]);
        let e = p.engines().unwrap();
        assert_eq!(e[0], Eng { kind: "vllm".into(), command: Some("x {port}".into()) });
        assert_eq!(e[2].kind, "openai");
        assert_eq!((p.devices[2].group, p.devices[2].ordinal), (1, 1));
    }

    #[test]
    fn one_file_serves_the_simulator_and_the_live_runtime() {
        // Nodes and their host memory (what level-1 sleepers use) in a live pool; the
        // simulator's parser reads the same file for its devices, leaving the engines.
        let text = "name: t\nnodes:\n  big: { host_memory_gib: 64 }\ndevices:\n  - { kind: A100-40GB, node: big, engine: { kind: openai } }\n  - { kind: A40, engine: { kind: openai } }\n";
        let p: LivePoolSpec<Eng> = LivePoolSpec::parse(Path::new("p.yaml"), text).unwrap();
        assert_eq!(p.pool.node_of, vec![0, 1]);
        assert_eq!(p.pool.nodes[0].host_memory_bytes, 64 << 30);
        let sim = PoolSpec::parse(Path::new("p.yaml"), text).unwrap();
        assert_eq!(sim.devices.len(), 2);
        // A simulator's pool file (with `node`) run live: the missing engine is named.
        let p: LivePoolSpec<Eng> =
            LivePoolSpec::parse(Path::new("p.yaml"), "name: t\ndevices:\n  - { kind: A40, count: 2, node: n }\n").unwrap();
        assert!(p.engines().unwrap_err().to_string().starts_with("p.yaml: devices[0].engine: required to run live"));
    }

    #[test]
    fn errors_name_the_file_and_the_place() {
        let missing: LivePoolSpec<Eng> =
            LivePoolSpec::parse(Path::new("p.yaml"), "name: t\ndevices:\n  - { kind: A40 }\n").unwrap();
        let e = missing.engines().unwrap_err().to_string();
        assert!(e.starts_with("p.yaml: devices[0].engine"), "{e}");
        let e = LivePoolSpec::<Eng>::parse(Path::new("p.yaml"), "name: t\ndevices:\n  - { kind: A40, engine: { kind: vllm, port: 3 } }\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.yaml:3:"), "{e}");
        let e = LivePoolSpec::<Eng>::parse(Path::new("p.yaml"), "name: t\ndevices:\n  - { kind: B300 }\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.yaml:3:13: devices[0].kind"), "{e}");
        assert!(LivePoolSpec::<Eng>::parse(Path::new("p.yaml"), "name: t\ndevices: []\n").is_err());
        // An engine's own field: the line, column and field path, the parser's message once.
        let e = LivePoolSpec::<Eng>::parse(Path::new("p.yaml"), "name: t\ndevices:\n  - { kind: A40, engine: { kind: vllm, port: 3 } }\n")
            .unwrap_err()
            .to_string();
        assert_eq!(e.matches("line").count(), 0, "{e}");
    }

    #[test]
    fn the_bundled_live_pool_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows/pools/live-emulated.yaml");
        let p: LivePoolSpec<serde_json::Value> = LivePoolSpec::load(&path).unwrap();
        let engines = p.engines().unwrap();
        assert_eq!(engines.len(), p.pool.devices.len());
        for e in engines {
            let cmd = e["command"].as_str().unwrap_or_default();
            assert!(cmd.contains("emulate") && cmd.contains("{port}") && cmd.contains("{model}"), "{cmd}");
        }
    }
}
