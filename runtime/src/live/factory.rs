//! The engine factory of a live pool file: each device's `engine:` mapping
//! ([`EngineSpec`]) becomes one engine per replica through `engines::engine_for`, launched for
//! the replica's deployment on that device.
//!
//! Glue only: it maps the planner's deployment and device facts onto the engines'
//! [`LaunchParams`]; it decides nothing and must not depend on the actors' state.

use std::path::PathBuf;
use std::sync::Arc;

use super::actors::{EngineFactory, EngineHandle, EngineTarget};
use super::engine::EngineError;
use super::engines::{EngineKind, EngineSpec, LaunchParams, engine_for};
use super::pool::{LivePoolError, LivePoolSpec};
use crate::values::derive_seed;

/// Engines for the devices of a live pool.
pub struct PoolEngines {
    /// Per device (pool order).
    specs: Vec<EngineSpec>,
    /// Engine timing-noise seed; each replica derives its own as the simulator does.
    noise_seed: u64,
    /// Where the `switchyard` binary is (a command template's program `switchyard`).
    switchyard_exe: Option<PathBuf>,
}

impl PoolEngines {
    /// Every device of `pool` must name its engine.
    pub fn new(pool: &LivePoolSpec<EngineSpec>, noise_seed: u64, switchyard_exe: Option<PathBuf>) -> Result<Self, LivePoolError> {
        Ok(PoolEngines { specs: pool.engines()?, noise_seed, switchyard_exe })
    }

    /// The device seconds per wall second of the pool's engines: the common `speed` of its
    /// emulated engines (1 for real ones). Engines that disagree are an error, since one run
    /// has one clock.
    pub fn speed(&self) -> Result<f64, String> {
        let speeds: Vec<f64> = self.specs.iter().map(engine_speed).collect();
        let first = speeds.first().copied().unwrap_or(1.0);
        if speeds.iter().any(|s| (s - first).abs() > 1e-9) {
            return Err(format!("the pool's engines run at different speeds ({speeds:?}); one run has one clock"));
        }
        Ok(first)
    }
}

/// An engine's speed: its `speed` field, or a `--speed N` written into its command template.
fn engine_speed(spec: &EngineSpec) -> f64 {
    if let Some(s) = spec.speed {
        return s;
    }
    if spec.kind == EngineKind::Openai {
        return 1.0;
    }
    let words = spec.template().words();
    words
        .windows(2)
        .find(|w| w[0] == "--speed")
        .and_then(|w| w[1].parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(1.0)
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
            gpu: target.device.0,
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
        let engines = PoolEngines::new(&pool, 0, Some(PathBuf::from("/bin/true"))).unwrap();
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
    fn speeds_come_from_the_field_or_the_command() {
        let mut a = EngineSpec::new(EngineKind::Vllm);
        assert_eq!(engine_speed(&a), 1.0);
        a.command = Some(super::super::engines::CommandTemplate::Line("x --port {port} --speed 20".into()));
        assert_eq!(engine_speed(&a), 20.0);
        a.speed = Some(5.0);
        assert_eq!(engine_speed(&a), 5.0);
        let b = EngineSpec::new(EngineKind::Openai);
        let mixed = PoolEngines { specs: vec![a, b], noise_seed: 0, switchyard_exe: None };
        assert!(mixed.speed().is_err());
    }
}
