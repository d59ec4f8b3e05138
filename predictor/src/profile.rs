//! Cached profiles on the scheduling path (paper 003 §3.3, "Cached profiles and runtime
//! feedback").
//!
//! Offline, an estimator fills a [`ProfileTable`]: run time and peak memory `C_κ` for every
//! bucket `κ = (deployment d, device g, batch b, input length ℓ_in, output length ℓ_out)`, and
//! the load time `C_load(d, g)`. Bucket values are upper bounds; each cell is predicted at its
//! bounds, so a lookup never underestimates within its bucket. At run time the scheduler only
//! reads the table: [`ProfileTable::key`] picks the smallest bucket covering each value (three
//! binary searches over a dozen integers) and the getters are array reads, well under 1 µs
//! (see `benches/lookup.rs`). No estimator runs on the scheduling path.
//!
//! Which output length to look up is the caller's policy, supported by
//! [`crate::feedback::OutputHistory`]: timing uses the empirical 90th percentile of recent
//! completions of the same logical node (the configured limit until there is history);
//! admission always uses the configured limit, plus the margins of
//! [`crate::feedback::AdmissionMargins`].
//!
//! Depends on the estimators only while building; lookups touch nothing but this table.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::PredictorError;
use crate::estimators::{Predict, decode_time};
use crate::graph::{Coverage, Deployment, OperatorGraph};
use crate::request::{ForwardPass, Request};
use crate::spec::DeviceSpec;

/// Bucket upper bounds per dimension, ascending.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Buckets {
    pub batch: Vec<u32>,
    pub input: Vec<u32>,
    pub output: Vec<u32>,
}

impl Default for Buckets {
    /// Powers of two: batch 1–32, input 128–32,768 tokens, output 16–8,192 tokens (Qwen3's
    /// native context is 32,768 tokens).
    fn default() -> Self {
        Buckets {
            batch: vec![1, 2, 4, 8, 16, 32],
            input: (7..=15).map(|p| 1u32 << p).collect(),
            output: (4..=13).map(|p| 1u32 << p).collect(),
        }
    }
}

impl Buckets {
    fn check(&self) -> Result<(), PredictorError> {
        for (name, v) in [
            ("batch", &self.batch),
            ("input", &self.input),
            ("output", &self.output),
        ] {
            if v.is_empty() || v[0] == 0 || v.windows(2).any(|w| w[0] >= w[1]) {
                return Err(PredictorError::ProfileTable(format!(
                    "{name} buckets must be positive and strictly ascending, got {v:?}"
                )));
            }
        }
        Ok(())
    }

    fn cells(&self) -> usize {
        self.batch.len() * self.input.len() * self.output.len()
    }
}

/// Index of a deployment in a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeploymentIndex(pub u16);

/// Index of a device type in a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceIndex(pub u16);

/// A resolved bucket `κ`: the flat index of its cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProfileKey(pub u32);

/// The materialized profiles of a set of deployments on a set of device types.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileTable {
    estimator: String,
    deployments: Vec<String>,
    devices: Vec<String>,
    buckets: Buckets,
    /// Per cell (`[d][g][b][in][out]`): run time, seconds.
    run_s: Vec<f64>,
    /// Per cell: peak bytes (weights + KV + activations).
    peak_bytes: Vec<u64>,
    /// Per cell: the activation's own share of the peak (KV + activations).
    request_bytes: Vec<u64>,
    /// Per (d, g): load time, seconds.
    load_s: Vec<f64>,
    /// Per d: weight bytes.
    weights_bytes: Vec<u64>,
    /// Per g: device memory, bytes.
    device_memory: Vec<u64>,
}

/// Smallest bucket covering `value`.
#[inline]
fn bucket(bounds: &[u32], value: u32) -> Option<usize> {
    let i = bounds.partition_point(|&b| b < value);
    (i < bounds.len()).then_some(i)
}

impl ProfileTable {
    /// Materialize the profiles of `deployments` on `devices` with `predictor`.
    pub fn build(
        predictor: &dyn Predict,
        deployments: &[Deployment],
        devices: &[DeviceSpec],
        buckets: Buckets,
    ) -> Result<Self, PredictorError> {
        buckets.check()?;
        if deployments.is_empty() || devices.is_empty() {
            return Err(PredictorError::ProfileTable(
                "no deployment or no device to profile".into(),
            ));
        }
        if deployments.len() > usize::from(u16::MAX) || devices.len() > usize::from(u16::MAX) {
            return Err(PredictorError::ProfileTable(
                "too many deployments or devices".into(),
            ));
        }
        let cells = deployments.len() * devices.len() * buckets.cells();
        if cells > u32::MAX as usize {
            return Err(PredictorError::ProfileTable(format!(
                "{cells} cells is too many"
            )));
        }
        let mut t = ProfileTable {
            estimator: predictor.name().to_string(),
            deployments: deployments.iter().map(Deployment::name).collect(),
            devices: devices.iter().map(|d| d.name.clone()).collect(),
            buckets,
            run_s: Vec::with_capacity(cells),
            peak_bytes: Vec::with_capacity(cells),
            request_bytes: Vec::with_capacity(cells),
            load_s: Vec::with_capacity(deployments.len() * devices.len()),
            weights_bytes: Vec::with_capacity(deployments.len()),
            device_memory: devices.iter().map(|d| d.memory_bytes).collect(),
        };
        for deployment in deployments {
            let graph = OperatorGraph::build(deployment);
            t.weights_bytes.push(graph.param_bytes());
            for device in devices {
                t.load_s.push(predictor.load_time(&graph, device));
                // Passes repeat across cells (every output bucket decodes from the same
                // prompt); price each once.
                let mut passes: BTreeMap<ForwardPass, f64> = BTreeMap::new();
                let mut pass_time = |p: &ForwardPass| {
                    *passes
                        .entry(*p)
                        .or_insert_with(|| predictor.pass_time(&graph, p, device, Coverage::Full))
                };
                for &b in &t.buckets.batch {
                    for &i in &t.buckets.input {
                        for &o in &t.buckets.output {
                            let request = Request::new(b, i, o);
                            let prefill = pass_time(&request.prefill());
                            let run = prefill + decode_time(&request, &mut pass_time);
                            let (w, kv, act) = predictor.memory(&graph, &request, device);
                            t.run_s.push(run);
                            t.peak_bytes.push((w + kv + act).ceil() as u64);
                            t.request_bytes.push((kv + act).ceil() as u64);
                        }
                    }
                }
            }
        }
        Ok(t)
    }

    /// The estimator that filled the table.
    pub fn estimator(&self) -> &str {
        &self.estimator
    }

    pub fn buckets(&self) -> &Buckets {
        &self.buckets
    }

    /// Deployment names (`Deployment::name`), in index order.
    pub fn deployments(&self) -> &[String] {
        &self.deployments
    }

    /// Device names, in index order.
    pub fn devices(&self) -> &[String] {
        &self.devices
    }

    /// The index of a deployment by name (resolve once, off the scheduling path).
    pub fn deployment(&self, name: &str) -> Option<DeploymentIndex> {
        self.deployments
            .iter()
            .position(|d| d == name)
            .map(|i| DeploymentIndex(i as u16))
    }

    /// The index of a device type by name (resolve once, off the scheduling path).
    pub fn device(&self, name: &str) -> Option<DeviceIndex> {
        self.devices
            .iter()
            .position(|d| d == name)
            .map(|i| DeviceIndex(i as u16))
    }

    /// `κ` for a request: the smallest batch, input and output buckets covering `batch`,
    /// `input_tokens` and `output_tokens`. `None` when an index is out of range or a value
    /// exceeds the largest bucket.
    #[inline]
    pub fn key(
        &self,
        d: DeploymentIndex,
        g: DeviceIndex,
        batch: u32,
        input_tokens: u32,
        output_tokens: u32,
    ) -> Option<ProfileKey> {
        let (d, g) = (usize::from(d.0), usize::from(g.0));
        if d >= self.deployments.len() || g >= self.devices.len() {
            return None;
        }
        let bb = &self.buckets;
        let b = bucket(&bb.batch, batch.max(1))?;
        let i = bucket(&bb.input, input_tokens.max(1))?;
        let o = bucket(&bb.output, output_tokens.max(1))?;
        let cell = (((d * self.devices.len() + g) * bb.batch.len() + b) * bb.input.len() + i)
            * bb.output.len()
            + o;
        Some(ProfileKey(cell as u32))
    }

    /// Predicted run time of the bucket, seconds.
    #[inline]
    pub fn run_time(&self, key: ProfileKey) -> f64 {
        self.run_s
            .get(key.0 as usize)
            .copied()
            .unwrap_or(f64::INFINITY)
    }

    /// Predicted peak memory of a replica serving the bucket, bytes (weights included).
    #[inline]
    pub fn peak_bytes(&self, key: ProfileKey) -> u64 {
        self.peak_bytes
            .get(key.0 as usize)
            .copied()
            .unwrap_or(u64::MAX)
    }

    /// The activation's own share of the peak (KV cache + activations), bytes.
    #[inline]
    pub fn request_bytes(&self, key: ProfileKey) -> u64 {
        self.request_bytes
            .get(key.0 as usize)
            .copied()
            .unwrap_or(u64::MAX)
    }

    /// The device index of a key.
    #[inline]
    pub fn key_device(&self, key: ProfileKey) -> DeviceIndex {
        let per_device = self.buckets.cells();
        DeviceIndex(((key.0 as usize / per_device) % self.devices.len()) as u16)
    }

    /// Whether the bucket's peak fits the device's memory.
    #[inline]
    pub fn fits(&self, key: ProfileKey) -> bool {
        let g = usize::from(self.key_device(key).0);
        self.device_memory
            .get(g)
            .is_some_and(|&m| self.peak_bytes(key) <= m)
    }

    /// `C_load(d, g)`, seconds.
    #[inline]
    pub fn load_time(&self, d: DeploymentIndex, g: DeviceIndex) -> f64 {
        let i = usize::from(d.0) * self.devices.len() + usize::from(g.0);
        self.load_s.get(i).copied().unwrap_or(f64::INFINITY)
    }

    /// Weight bytes of a deployment.
    #[inline]
    pub fn weights_bytes(&self, d: DeploymentIndex) -> u64 {
        self.weights_bytes
            .get(usize::from(d.0))
            .copied()
            .unwrap_or(u64::MAX)
    }

    /// Number of cells (`|κ|`).
    pub fn len(&self) -> usize {
        self.run_s.len()
    }

    pub fn is_empty(&self) -> bool {
        self.run_s.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Architecture;
    use crate::estimators::formula::Formula;
    use crate::spec::{self, Dtype};
    use proptest::prelude::*;

    fn small_table() -> (ProfileTable, Vec<Deployment>, Vec<DeviceSpec>) {
        let deployments: Vec<Deployment> = ["Qwen3-0.6B", "Qwen3-8B"]
            .iter()
            .map(|m| Deployment::new(Architecture::from(&spec::model(m).unwrap()), Dtype::Bf16))
            .collect();
        let devices = vec![
            spec::device("A100-40GB").unwrap(),
            spec::device("L4").unwrap(),
        ];
        let buckets = Buckets {
            batch: vec![1, 4],
            input: vec![256, 1024, 4096],
            output: vec![64, 512],
        };
        let t = ProfileTable::build(&Formula::default(), &deployments, &devices, buckets).unwrap();
        (t, deployments, devices)
    }

    #[test]
    fn lookups_pick_the_smallest_covering_bucket_and_match_the_estimator() {
        let (t, deployments, devices) = small_table();
        assert_eq!(t.len(), 2 * 2 * 2 * 3 * 2);
        let d = t.deployment("Qwen3-8B/bf16").unwrap();
        let g = t.device("L4").unwrap();
        // 300 input tokens → the 1024 bucket; 100 output tokens → the 512 bucket; batch 3 → 4.
        let key = t.key(d, g, 3, 300, 100).unwrap();
        assert_eq!(key, t.key(d, g, 4, 1024, 512).unwrap());
        let graph = OperatorGraph::build(&deployments[1]);
        let expect = Formula::default().run_time(&graph, &Request::new(4, 1024, 512), &devices[1]);
        assert!((t.run_time(key) - expect).abs() <= 1e-12 * expect);
        assert_eq!(t.key_device(key), g);
        // Beyond the largest bucket: no key.
        assert_eq!(t.key(d, g, 1, 5000, 1), None);
        assert_eq!(t.key(d, g, 5, 1, 1), None);
        assert_eq!(t.key(d, DeviceIndex(9), 1, 1, 1), None);
    }

    #[test]
    fn memory_and_load_profiles() {
        let (t, _, _) = small_table();
        let d = t.deployment("Qwen3-8B/bf16").unwrap();
        let l4 = t.device("L4").unwrap();
        let a100 = t.device("A100-40GB").unwrap();
        let key = t.key(d, l4, 1, 256, 64).unwrap();
        assert_eq!(t.peak_bytes(key) - t.request_bytes(key), t.weights_bytes(d));
        // 16.4 GB of weights and a short request fit a 24 GiB L4.
        assert!(t.fits(key));
        // Qwen3-8B with 4 × (4,096 + 512) tokens of KV (2.7 GB) still fits.
        assert!(t.fits(t.key(d, l4, 4, 4096, 512).unwrap()));
        assert!(t.load_time(d, l4) > 0.0 && t.load_time(d, a100) > 0.0);
    }

    #[test]
    fn bad_buckets_are_rejected() {
        let d = vec![Deployment::new(
            Architecture::from(&spec::model("Qwen3-0.6B").unwrap()),
            Dtype::Bf16,
        )];
        let g = vec![spec::device("L4").unwrap()];
        let b = Buckets {
            batch: vec![2, 1],
            ..Buckets::default()
        };
        assert!(ProfileTable::build(&Formula::default(), &d, &g, b).is_err());
        assert!(ProfileTable::build(&Formula::default(), &[], &g, Buckets::default()).is_err());
    }

    proptest! {
        /// A covering bucket never underestimates: run time and peak grow with every value.
        #[test]
        fn lookups_are_monotone(b in 1u32..=4, i in 1u32..=4096, o in 1u32..=512, db in 0u32..3, di in 0u32..3000, dout in 0u32..400) {
            let (t, _, _) = small_table();
            let d = DeploymentIndex(1);
            let g = DeviceIndex(0);
            let small = t.key(d, g, b, i, o).unwrap();
            if let Some(big) = t.key(d, g, b + db, i + di, o + dout) {
                prop_assert!(t.run_time(big) >= t.run_time(small));
                prop_assert!(t.peak_bytes(big) >= t.peak_bytes(small));
            }
        }
    }
}
