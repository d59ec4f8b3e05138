//! The engine factory of a live pool file: each device's `engine:` mapping
//! ([`EngineSpec`]) becomes one engine per replica through `engines::engine_for`, launched for
//! the replica's deployment on that device.
//!
//! Glue only: it maps the planner's deployment and device facts onto the engines'
//! [`LaunchParams`], including each device's physical GPU ordinal on this host (the group's
//! `gpus:`, else its index in the group, through an inherited `CUDA_VISIBLE_DEVICES` mask);
//! and, once per live run, it sweeps the engine registry for what a killed earlier run left
//! ([`registry::sweep_orphans`]). It decides nothing and must not depend on the actors' state.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::actors::{EngineFactory, EngineHandle, EngineTarget};
use super::engine::EngineError;
use super::engines::{EngineKind, EngineSpec, EngineSpecError, LaunchParams, engine_for, registry};
use super::pool::{LivePoolError, LivePoolSpec};
use crate::values::derive_seed;

/// The engines of a pool run at different speeds ([`PoolEngines::speed`]): one run has one
/// clock.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the pool's engines run at different speeds ({speeds:?}); one run has one clock")]
pub struct MixedSpeeds {
    /// Each device's speed, in pool order.
    pub speeds: Vec<f64>,
}

/// Engines for the devices of a live pool.
pub struct PoolEngines {
    /// Per device (pool order).
    specs: Vec<EngineSpec>,
    /// Per device: its physical GPU ordinal on this host (`{gpu}`).
    gpus: Vec<u32>,
    /// Engine timing-noise seed; each replica derives its own as the simulator does.
    noise_seed: u64,
    /// Where the `switchyard` binary is (a command template's program `switchyard`).
    switchyard_exe: Option<PathBuf>,
    /// What the registry sweep at construction did, for the run's notes.
    sweep_notes: Vec<String>,
}

impl PoolEngines {
    /// Every device of `pool` must name its engine; GPU ordinals are resolved against this
    /// process's `CUDA_VISIBLE_DEVICES`. When the pool manages engine processes, the engine
    /// registry is swept first: process groups a killed earlier Switchyard left are killed
    /// ([`PoolEngines::sweep_notes`] says which).
    pub fn new(pool: &LivePoolSpec<EngineSpec>, noise_seed: u64, switchyard_exe: Option<PathBuf>) -> Result<Self, LivePoolError> {
        let mask = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let mut engines = Self::with_mask(pool, noise_seed, switchyard_exe, mask.as_deref())?;
        if engines.specs.iter().any(manages_processes) {
            engines.sweep_notes = sweep_notes(&registry::default_dir());
        }
        Ok(engines)
    }

    /// [`PoolEngines::new`] with the inherited `CUDA_VISIBLE_DEVICES` given (`None`: unset),
    /// and no registry sweep.
    pub fn with_mask(
        pool: &LivePoolSpec<EngineSpec>,
        noise_seed: u64,
        switchyard_exe: Option<PathBuf>,
        mask: Option<&str>,
    ) -> Result<Self, LivePoolError> {
        let specs = pool.engines()?;
        check_specs(pool, &specs)?;
        let gpus = physical_gpus(pool, &specs, mask)?;
        Ok(PoolEngines { specs, gpus, noise_seed, switchyard_exe, sweep_notes: Vec::new() })
    }

    /// One line per orphaned engine the registry sweep killed or could not handle, and per
    /// problem with the registry itself (empty when there was nothing to do).
    pub fn sweep_notes(&self) -> &[String] {
        &self.sweep_notes
    }

    /// The device seconds per wall second of the pool's engines: the common `speed` of its
    /// emulated engines (1 for real ones). Engines that disagree are an error, since one run
    /// has one clock.
    pub fn speed(&self) -> Result<f64, MixedSpeeds> {
        let speeds: Vec<f64> = self.specs.iter().map(engine_speed).collect();
        let first = speeds.first().copied().unwrap_or(1.0);
        if speeds.iter().any(|s| (s - first).abs() > 1e-9) {
            return Err(MixedSpeeds { speeds });
        }
        Ok(first)
    }
}

/// Every group's engine built once, up front, for a stand-in launch (nothing is started): what
/// does not depend on the deployment — a missing `base_url`, an unknown command placeholder, a
/// command without `{port}`, a bad timeout or speed, an `api_key_env` that is not set — is an
/// error naming the pool file and the field before the run starts, not a replica that "could
/// not be placed" once it is under way.
fn check_specs(pool: &LivePoolSpec<EngineSpec>, specs: &[EngineSpec]) -> Result<(), LivePoolError> {
    let mut checked = std::collections::BTreeSet::new();
    for (d, spec) in pool.devices.iter().zip(specs) {
        if !checked.insert(d.group) {
            continue;
        }
        let launch = LaunchParams {
            model: "Qwen3-0.6B".into(),
            device_kind: String::new(),
            gpu: d.ordinal,
            dtype: switchyard_predictor::spec::Dtype::Bf16,
            max_model_len: 2048,
            gpu_memory_utilization: 0.9,
            max_num_seqs: 1,
            noise_seed: 0,
            switchyard_exe: None,
        };
        if let Err(e) = engine_for(spec, &launch) {
            let field = match &e {
                EngineSpecError::Missing { field, .. } | EngineSpecError::Invalid { field, .. } => *field,
                EngineSpecError::UnknownPlaceholder(_) => "command",
            };
            let message = e.to_string();
            let message = message.strip_prefix(&format!("engine.{field}: ")).unwrap_or(&message).to_string();
            return Err(LivePoolError::Engine { path: pool.path.clone(), index: d.group, field, message });
        }
        if spec.speed.is_none()
            && spec.kind != EngineKind::Openai
            && let Err(message) = command_speed(spec)
        {
            return Err(LivePoolError::Engine { path: pool.path.clone(), index: d.group, field: "command", message });
        }
    }
    Ok(())
}

/// Whether the engine is a child process this run starts.
fn manages_processes(spec: &EngineSpec) -> bool {
    match spec.kind {
        EngineKind::Vllm => true,
        EngineKind::Emulated => spec.base_url.is_none(),
        EngineKind::Openai => false,
    }
}

/// Runs the registry sweep and words its outcome.
fn sweep_notes(dir: &std::path::Path) -> Vec<String> {
    match registry::sweep_orphans(dir) {
        Err(e) => vec![format!("engine registry not swept: {e}")],
        Ok(orphans) => orphans
            .into_iter()
            .filter(|o| !o.killed.is_empty() || o.problem.is_some())
            .map(|o| {
                let mut line = format!(
                    "killed processes {:?} of engine `{}` (process group {}) left by Switchyard pid {}",
                    o.killed, o.entry.command, o.entry.pgid, o.entry.owner_pid
                );
                if let Some(p) = o.problem {
                    line.push_str(&format!("; {p}"));
                }
                line
            })
            .collect(),
    }
}

/// The physical GPU ordinal of every device of `pool` (same order as `specs`): the group's
/// `gpus:` entry, else the device's index in its group mapped through the inherited
/// `CUDA_VISIBLE_DEVICES` `mask` (its i-th entry) when one is set. `gpus:` lists are checked
/// (as many as the group's count, distinct, not negative, inside the mask); the mask and
/// collisions between groups only matter to engines placed by their ordinal
/// ([`EngineSpec::places_on_gpu`]); for the others the ordinal is informational.
fn physical_gpus(pool: &LivePoolSpec<EngineSpec>, specs: &[EngineSpec], mask: Option<&str>) -> Result<Vec<u32>, LivePoolError> {
    let err = |index: usize, message: String| LivePoolError::Engine { path: pool.path.clone(), index, field: "gpus", message };
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for d in &pool.devices {
        *counts.entry(d.group).or_default() += 1;
    }
    let mask_entries: Option<Vec<&str>> =
        mask.map(|m| m.split(',').map(str::trim).filter(|e| !e.is_empty()).collect());
    let mask_text = mask.unwrap_or_default();
    let mut out = Vec::with_capacity(specs.len());
    // Physical ordinal → the group that placed a device on it.
    let mut taken: BTreeMap<u32, usize> = BTreeMap::new();
    for (d, spec) in pool.devices.iter().zip(specs) {
        let explicit = match &spec.gpus {
            None => None,
            Some(list) => {
                let count = counts.get(&d.group).copied().unwrap_or(0);
                if list.len() != count {
                    return Err(err(d.group, format!("{} ordinals for a group of {count} devices", list.len())));
                }
                if let Some(bad) = list.iter().find(|g| u32::try_from(**g).is_err()) {
                    return Err(err(d.group, format!("{bad} is not a GPU ordinal (0, 1, …)")));
                }
                let mut seen = std::collections::BTreeSet::new();
                if let Some(dup) = list.iter().find(|g| !seen.insert(**g)) {
                    return Err(err(d.group, format!("GPU {dup} is listed twice")));
                }
                list.get(d.ordinal as usize).and_then(|g| u32::try_from(*g).ok())
            }
        };
        let places = spec.places_on_gpu();
        let gpu = match (explicit, &mask_entries) {
            (Some(g), None) => g,
            (None, None) => d.ordinal,
            (Some(g), Some(m)) => {
                if places && !m.iter().any(|e| e.parse::<u32>().ok() == Some(g)) {
                    return Err(err(
                        d.group,
                        format!("GPU {g} is not in the inherited CUDA_VISIBLE_DEVICES=`{mask_text}`"),
                    ));
                }
                g
            }
            (None, Some(m)) => match m.get(d.ordinal as usize).map(|e| e.parse::<u32>()) {
                Some(Ok(g)) => g,
                _ if !places => d.ordinal,
                Some(Err(_)) => {
                    return Err(err(
                        d.group,
                        format!(
                            "the inherited CUDA_VISIBLE_DEVICES=`{mask_text}` names GPUs by something else than their ordinal; \
                             list the group's ordinals here or set engine.env.CUDA_VISIBLE_DEVICES"
                        ),
                    ));
                }
                None => {
                    return Err(err(
                        d.group,
                        format!(
                            "device {} of this group has no GPU in the inherited CUDA_VISIBLE_DEVICES=`{mask_text}` ({} listed); \
                             list the group's ordinals here or widen the mask",
                            d.ordinal,
                            m.len()
                        ),
                    ));
                }
            },
        };
        if places {
            if let Some(&other) = taken.get(&gpu)
                && other != d.group
            {
                return Err(err(
                    d.group,
                    format!("GPU {gpu} is also a device of devices[{other}]; groups on one host need distinct `gpus:`"),
                ));
            }
            taken.insert(gpu, d.group);
        }
        out.push(gpu);
    }
    Ok(out)
}

/// An engine's speed: its `speed` field, or a `--speed N` written into its command template.
fn engine_speed(spec: &EngineSpec) -> f64 {
    if let Some(s) = spec.speed {
        return s;
    }
    if spec.kind == EngineKind::Openai {
        return 1.0;
    }
    command_speed(spec).ok().flatten().unwrap_or(1.0)
}

/// The `--speed` an engine command passes (`--speed 20` or `--speed=20`), if any; an error
/// words a value that is not a positive number (checked with the pool, before the run starts).
fn command_speed(spec: &EngineSpec) -> Result<Option<f64>, String> {
    let words = spec.template().words();
    let value = words.iter().enumerate().find_map(|(i, w)| {
        if w == "--speed" {
            Some(words.get(i + 1).map(String::as_str).unwrap_or(""))
        } else {
            w.strip_prefix("--speed=")
        }
    });
    // `{speed}` is the `speed` field's value (checked with the field; default 1).
    let Some(value) = value.filter(|v| *v != "{speed}") else { return Ok(None) };
    match value.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 => Ok(Some(s)),
        _ => Err(format!("`--speed` in the command must be a positive number of device seconds per wall second, got `{value}`")),
    }
}

impl EngineFactory for PoolEngines {
    fn create(&self, target: &EngineTarget<'_>) -> Result<EngineHandle, EngineError> {
        let Some(spec) = self.specs.get(target.device.0 as usize) else {
            return Err(EngineError::Lifecycle(format!("the pool has no engine for {}", target.device)));
        };
        let d = target.deployment;
        let launch = LaunchParams {
            model: d.model.clone(),
            device_kind: target.device_spec.name.clone(),
            gpu: self.gpus.get(target.device.0 as usize).copied().unwrap_or(target.device.0),
            dtype: d.dtype,
            max_model_len: d.max_model_len,
            gpu_memory_utilization: d.gpu_memory_utilization,
            max_num_seqs: d.max_num_seqs,
            noise_seed: derive_seed(self.noise_seed, &["replica", &target.replica.0.to_string()]),
            switchyard_exe: self.switchyard_exe.clone(),
        };
        let engine = engine_for(spec, &launch).map_err(|e| EngineError::Lifecycle(e.to_string()))?;
        Ok(EngineHandle { engine: Arc::from(engine), served_model: spec.served_model(&d.model) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_bundled_live_pool_makes_managed_emulators_at_one_speed() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows/pools/live-emulated.yaml");
        let pool: LivePoolSpec<EngineSpec> = LivePoolSpec::load(&path).unwrap();
        let engines = PoolEngines::with_mask(&pool, 0, Some(PathBuf::from("/bin/true")), None).unwrap();
        assert_eq!(engines.speed(), Ok(50.0));
        let dep = crate::exec::deployment_table(
            &[std::sync::Arc::new(
                crate::workflow::load_workflow(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows/qmsum.yaml")).unwrap(),
            )],
            256,
        )
        .unwrap()
        .0;
        let target = EngineTarget {
            replica: crate::ids::ReplicaId(4),
            device: crate::ids::DeviceId(1),
            device_spec: &pool.pool.devices[1],
            deployment: &dep[0],
        };
        let h = engines.create(&target).unwrap();
        assert_eq!(h.engine.kind(), "vllm");
        assert_eq!(h.served_model, dep[0].model);
    }

    #[test]
    fn engine_settings_are_checked_before_the_run_naming_the_group_and_field() {
        let check = |groups: &str| {
            let text = format!("name: t\ndevices:\n{groups}");
            let pool: LivePoolSpec<EngineSpec> = LivePoolSpec::parse(Path::new("p.yaml"), &text).unwrap();
            PoolEngines::with_mask(&pool, 0, None, None).err().map(|e| e.to_string())
        };
        let good = "  - {kind: A100-40GB, engine: {kind: emulated}}\n";
        assert_eq!(check(good), None);
        let e = check(&format!("{good}  - {{kind: A40, engine: {{kind: emulated, command: [switchyard, emulate, \"{{nonsense}}\", \"{{port}}\"]}}}}\n"));
        assert!(e.as_deref().is_some_and(|e| e.starts_with("p.yaml: devices[1].engine.command: unknown placeholder `{nonsense}`")), "{e:?}");
        let e = check("  - {kind: A40, engine: {kind: vllm, command: [vllm, serve, \"{model}\"]}}\n");
        assert!(e.as_deref().is_some_and(|e| e.contains("devices[0].engine.command: the command must pass {port}")), "{e:?}");
        let e = check("  - {kind: A40, engine: {kind: openai}}\n");
        assert!(e.as_deref().is_some_and(|e| e.contains("devices[0].engine.base_url: required for kind `openai`")), "{e:?}");
        // A speed the emulator would refuse is the pool's error, not a clock of 1.
        for bad in ["--speed fast", "--speed=0", "--speed -3", "--speed"] {
            let e = check(&format!("  - {{kind: A40, engine: {{kind: emulated, command: \"switchyard emulate --port {{port}} {bad}\"}}}}\n"));
            assert!(e.as_deref().is_some_and(|e| e.contains("devices[0].engine.command: `--speed` in the command must be a positive number")), "{bad}: {e:?}");
        }
        assert_eq!(check("  - {kind: A40, engine: {kind: emulated, command: \"switchyard emulate --port {port} --speed=20\"}}\n"), None);
    }

    /// The GPU ordinals of a pool whose `devices:` are `groups`, and the
    /// `CUDA_VISIBLE_DEVICES` each device's child gets.
    fn placed(groups: &str, mask: Option<&str>) -> Result<(Vec<u32>, Vec<String>), String> {
        let text = format!("name: t\ndevices:\n{groups}");
        let pool: LivePoolSpec<EngineSpec> = LivePoolSpec::parse(Path::new("p.yaml"), &text).map_err(|e| e.to_string())?;
        let engines = PoolEngines::with_mask(&pool, 0, None, mask).map_err(|e| e.to_string())?;
        let env = engines
            .specs
            .iter()
            .zip(&engines.gpus)
            .map(|(spec, &gpu)| {
                let launch = LaunchParams {
                    model: "Qwen3-8B".into(),
                    device_kind: "A100-40GB".into(),
                    gpu,
                    dtype: switchyard_predictor::spec::Dtype::Fp16,
                    max_model_len: 4096,
                    gpu_memory_utilization: 0.9,
                    max_num_seqs: 8,
                    noise_seed: 0,
                    switchyard_exe: None,
                };
                let cmd = super::super::engines::ManagedCommand::from_spec(spec, &launch).unwrap();
                cmd.env(1).get("CUDA_VISIBLE_DEVICES").cloned().unwrap_or_default()
            })
            .collect();
        Ok((engines.gpus.clone(), env))
    }

    const VLLM2: &str = "  - { kind: A100-40GB, count: 2, engine: { kind: vllm } }\n";

    #[test]
    fn gpus_default_to_the_index_in_the_group() {
        assert_eq!(placed(VLLM2, None), Ok((vec![0, 1], vec!["0".into(), "1".into()])));
    }

    #[test]
    fn an_inherited_mask_maps_the_index_to_its_entry() {
        assert_eq!(placed(VLLM2, Some("2,3")), Ok((vec![2, 3], vec!["2".into(), "3".into()])));
        let e = placed(VLLM2, Some("5")).unwrap_err();
        assert!(e.starts_with("p.yaml: devices[0].engine.gpus:") && e.contains("CUDA_VISIBLE_DEVICES=`5`"), "{e}");
        let e = placed(VLLM2, Some("GPU-aa,GPU-bb")).unwrap_err();
        assert!(e.contains("devices[0].engine.gpus") && e.contains("ordinal"), "{e}");
    }

    #[test]
    fn explicit_gpus_are_used_checked_and_must_lie_in_the_mask() {
        let g = "  - { kind: A100-40GB, count: 2, engine: { kind: vllm, gpus: [4, 5] } }\n";
        assert_eq!(placed(g, None), Ok((vec![4, 5], vec!["4".into(), "5".into()])));
        assert_eq!(placed(g, Some("4,5,6")).map(|p| p.0), Ok(vec![4, 5]));
        let e = placed(g, Some("2,3")).unwrap_err();
        assert!(e.starts_with("p.yaml: devices[0].engine.gpus: GPU 4 is not in the inherited CUDA_VISIBLE_DEVICES=`2,3`"), "{e}");
        for (list, why) in [("[4]", "1 ordinals for a group of 2"), ("[4, -1]", "-1 is not a GPU ordinal"), ("[3, 3]", "GPU 3 is listed twice")] {
            let g = format!("  - {{ kind: A100-40GB, count: 2, engine: {{ kind: vllm, gpus: {list} }} }}\n");
            let e = placed(&g, None).unwrap_err();
            assert!(e.starts_with("p.yaml: devices[0].engine.gpus: ") && e.contains(why), "{e}");
        }
    }

    #[test]
    fn groups_on_one_host_need_distinct_gpus() {
        let two = format!("{VLLM2}  - {{ kind: L4, engine: {{ kind: vllm }} }}\n");
        let e = placed(&two, None).unwrap_err();
        assert!(e.starts_with("p.yaml: devices[1].engine.gpus: GPU 0 is also a device of devices[0]"), "{e}");
        let two = format!("{VLLM2}  - {{ kind: L4, engine: {{ kind: vllm, gpus: [2] }} }}\n");
        assert_eq!(placed(&two, None).map(|p| p.0), Ok(vec![0, 1, 2]));
    }

    #[test]
    fn an_explicit_env_wins_and_emulators_need_no_gpu() {
        let g = "  - { kind: A100-40GB, count: 2, engine: { kind: vllm, env: { CUDA_VISIBLE_DEVICES: \"7\" } } }\n";
        // The mask does not matter: the pool says where the children go.
        assert_eq!(placed(g, Some("0")).map(|p| p.1), Ok(vec!["7".into(), "7".into()]));
        // The bundled pool's emulators (a `switchyard` command) share ordinals and ignore masks.
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows/pools/live-emulated.yaml");
        let pool: LivePoolSpec<EngineSpec> = LivePoolSpec::load(&path).unwrap();
        let engines = PoolEngines::with_mask(&pool, 0, None, Some("0")).unwrap();
        assert_eq!(engines.gpus, vec![0, 0, 1]);
    }

    #[test]
    fn speeds_come_from_the_field_or_the_command() {
        let mut a = EngineSpec::new(EngineKind::Vllm);
        assert_eq!(engine_speed(&a), 1.0);
        a.command = Some(super::super::engines::CommandTemplate::Line("x --port {port} --speed 20".into()));
        assert_eq!(engine_speed(&a), 20.0);
        a.command = Some(super::super::engines::CommandTemplate::Line("x --port {port} --speed=12.5".into()));
        assert_eq!(engine_speed(&a), 12.5);
        a.speed = Some(5.0);
        assert_eq!(engine_speed(&a), 5.0);
        let b = EngineSpec::new(EngineKind::Openai);
        let mixed = PoolEngines { specs: vec![a, b], gpus: vec![0, 1], noise_seed: 0, switchyard_exe: None, sweep_notes: Vec::new() };
        assert!(mixed.speed().is_err());
        assert_eq!(
            mixed.speed().map_err(|e| e.to_string()),
            Err("the pool's engines run at different speeds ([5.0, 1.0]); one run has one clock".to_string())
        );
    }
}
