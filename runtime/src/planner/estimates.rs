//! The planner's view of the Predictor: run time and load time of a deployment on a device.
//!
//! The planner core only sees this trait; shells inject an implementation (cached predictor
//! profiles, or — for reference only — the emulator's own costs, the `oracle`). Lookups must be
//! cheap: they run on the scheduling path.

use super::{DeploymentInfo, DeviceInfo};

/// Estimates the scheduler consumes (paper 003 Eq. 1, the run-time and load-time parts).
pub trait Estimates: Send {
    /// Name for reports (`graph`, `gbdt`, `formula`, `oracle`).
    fn name(&self) -> &str;
    /// Predicted seconds for one request of `input` prompt tokens and `output` generated tokens
    /// on a replica of `deployment` on `device` that serves `batch` sequences concurrently.
    fn run_time(&self, deployment: &DeploymentInfo, device: &DeviceInfo, batch: u32, input: u32, output: u32) -> f64;
    /// Predicted seconds to load `deployment` onto `device` (cold start).
    fn load_time(&self, deployment: &DeploymentInfo, device: &DeviceInfo) -> f64;
}
