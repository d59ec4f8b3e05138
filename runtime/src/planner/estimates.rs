//! The planner's view of the Predictor: run time and load time of a deployment on a device.
//!
//! The planner core only sees this trait; shells inject an implementation (cached predictor
//! profiles, or — for reference only — the emulator's own costs, the `oracle`). Lookups must be
//! cheap: they run on the scheduling path.
//!
//! Part of the pure core: must not depend on anything outside `planner` but `crate::ids` and the
//! predictor crate (the core's rule, checked by `runtime/tests/module_boundaries.rs`).

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

use std::collections::HashMap;
use std::sync::Mutex;

/// Bucket boundaries of cached profiles (paper 003 §3.3, κ = (d, g, b, ℓ_in, ℓ_out)): a
/// lookup rounds each request dimension *up* to its bucket, so the estimate covers the request.
pub fn bucket_batch(b: u32) -> u32 {
    b.max(1).next_power_of_two()
}

/// Input-length bucket: 128-token steps to 2,048, then 512-token steps.
pub fn bucket_input(n: u32) -> u32 {
    if n <= 2048 { n.max(1).div_ceil(128) * 128 } else { n.div_ceil(512) * 512 }
}

/// Output-length bucket: 32-token steps to 512, then 128-token steps.
pub fn bucket_output(n: u32) -> u32 {
    if n <= 512 { n.max(1).div_ceil(32) * 32 } else { n.div_ceil(128) * 128 }
}

type Key = (u32, u32, u32, u32, u32);

/// Memoises an estimator at bucket granularity, so the scheduling path does table lookups
/// after the first query of a bucket. Deterministic: the cached value is a pure function of
/// the bucket.
pub struct Cached<E: Estimates> {
    inner: E,
    run: Mutex<HashMap<Key, f64>>,
    load: Mutex<HashMap<(u32, u32), f64>>,
}

impl<E: Estimates> Cached<E> {
    pub fn new(inner: E) -> Self {
        Cached { inner, run: Mutex::new(HashMap::new()), load: Mutex::new(HashMap::new()) }
    }
}

impl<E: Estimates> Estimates for Cached<E> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn run_time(&self, d: &DeploymentInfo, g: &DeviceInfo, batch: u32, input: u32, output: u32) -> f64 {
        let (b, i, o) = (bucket_batch(batch), bucket_input(input), bucket_output(output));
        let key = (d.id.0, g.id.0, b, i, o);
        if let Ok(map) = self.run.lock()
            && let Some(v) = map.get(&key)
        {
            return *v;
        }
        let v = self.inner.run_time(d, g, b, i, o);
        if let Ok(mut map) = self.run.lock() {
            map.insert(key, v);
        }
        v
    }

    fn load_time(&self, d: &DeploymentInfo, g: &DeviceInfo) -> f64 {
        let key = (d.id.0, g.id.0);
        if let Ok(map) = self.load.lock()
            && let Some(v) = map.get(&key)
        {
            return *v;
        }
        let v = self.inner.load_time(d, g);
        if let Ok(mut map) = self.load.lock() {
            map.insert(key, v);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_up_and_are_monotone() {
        assert_eq!(bucket_batch(0), 1);
        assert_eq!(bucket_batch(5), 8);
        assert_eq!(bucket_input(1), 128);
        assert_eq!(bucket_input(129), 256);
        assert_eq!(bucket_input(2049), 2560);
        assert_eq!(bucket_output(33), 64);
        assert_eq!(bucket_output(513), 640);
        let mut last = 0;
        for n in 1..10_000 {
            let b = bucket_input(n);
            assert!(b >= n && b >= last);
            last = b;
        }
    }
}
