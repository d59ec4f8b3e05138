//! switchyard-predictor: device, model and request features, cached profile tables, and the
//! estimators of run time, peak memory and load time (paper 003, §3.3, Eq. 1).
//!
//! Owns spec sheets ([`spec`]) and everything that *estimates*. It must not depend on the
//! runtime or on the emulator: the emulator is the ground truth the estimators are judged
//! against, so no estimate may read it (and the emulator must not read the estimators).
//!
//! # Pieces
//!
//! - Features. [`arch::Architecture`] (from a catalogue `ModelArch` or a Vidur model YAML) and
//!   [`graph::Deployment`] (architecture + dtype + TP degree) build an
//!   [`graph::OperatorGraph`]: embedding, per layer norms / QKV projection / rotary / attention /
//!   output projection / residual adds / gated MLP up, activation, down, then final norm and LM
//!   head; each node with its operator type, shape, parameter bytes and [`graph::OpCost`]
//!   (FLOPs, bytes) for a [`request::ForwardPass`], each edge with the tensor it carries. A
//!   request is a [`request::Request`] (batch, input and output lengths); a device is a
//!   [`spec::DeviceSpec`] (dense fp16 FLOP/s, memory, bandwidth, host link).
//! - Estimators behind one trait, [`estimators::Predict`]
//!   (`predict(graph, request, device) → (T_run, M_peak, T_load)`), selectable by name with
//!   [`estimators::estimator`]: `formula` (LLMFit-style size and bandwidth), `gbdt` (boosted
//!   trees on scalar features) and `graph` (per-operator boosted trees on roofline-normalized
//!   times, combined along the graph). All three train on measured operator timings in Vidur's
//!   layout ([`data`]); the shipped copy is compiled in ([`data::ProfileData::shipped`]; its
//!   source is [`data::default_train_dir`]) and [`data::DATA_DIR_ENV`] names another one.
//! - Whole activations: [`activation::ActivationSample`] (measured by a caller — the runtime's
//!   `bench predictor` runs them on the emulator) and the fits on them: the formula's
//!   efficiencies, the GBDT's per-target ensembles, the graph estimator's target heads.
//! - Operator-timing evaluation: [`eval::run`] (leave-one-model-out, leave-one-device-out, or a
//!   user's test directory) with WAPE, ordering and window fit ([`metrics`]).
//! - The scheduling path: [`profile::ProfileTable`] materializes `C_κ` for
//!   `κ = (deployment, device, batch, input, output)` buckets and `C_load(d, g)` ahead of time;
//!   [`feedback::OutputHistory`] picks the timing output length (recent p90 per logical node)
//!   and [`feedback::AdmissionMargins`] gives `M_adm = M_peak + ε_M + ρ(t)` (the runtime's
//!   planner reads profile tables; it keeps its own output history and does not use either
//!   feedback type today).
//!
//! # Use on the scheduling path
//!
//! ```no_run
//! use switchyard_predictor::arch::Architecture;
//! use switchyard_predictor::estimators::estimator;
//! use switchyard_predictor::feedback::{AdmissionMargins, MarginPolicy, OutputHistory};
//! use switchyard_predictor::graph::Deployment;
//! use switchyard_predictor::profile::{Buckets, ProfileTable};
//! use switchyard_predictor::spec::{self, Dtype};
//!
//! # fn main() -> Result<(), switchyard_predictor::PredictorError> {
//! // Ahead of time (planner start-up): train, then materialize the table.
//! let predictor = estimator("graph")?;
//! let deployments = vec![Deployment::new(Architecture::from(&spec::model("Qwen3-8B")?), Dtype::Bf16)];
//! let devices = vec![spec::device("A100-40GB")?, spec::device("L4")?];
//! let table = ProfileTable::build(predictor.as_ref(), &deployments, &devices, Buckets::default())?;
//! let mut margins = AdmissionMargins::new(&table, MarginPolicy::default());
//! let mut history: OutputHistory<u32> = OutputHistory::default();
//! let (Some(d), Some(g)) = (table.deployment("Qwen3-8B/bf16"), table.device("L4")) else {
//!     return Ok(());
//! };
//!
//! // On the scheduling path: array reads only.
//! let node = 7; // the logical workflow node, interned by the caller
//! let limit = 1024; // its configured output limit
//! let timing = table.key(d, g, 4, 900, history.timing_output_tokens(&node, limit));
//! let run_s = timing.map(|k| table.run_time(k));
//! let admission = table.key(d, g, 4, 900, limit);
//! let reserve = admission.map(|k| margins.admission_bytes(&table, k));
//! let load_s = table.load_time(d, g);
//!
//! // On events: a completion refines timing; an OOM raises the admission margin.
//! history.record(node, 230);
//! if let Some(k) = admission {
//!     margins.record_oom(&table, k, None);
//! }
//! # let _ = (run_s, reserve, load_s);
//! # Ok(())
//! # }
//! ```
//!
//! # What is and is not measured
//!
//! The training data (Vidur's profiles) measures the non-attention operators of a layer on
//! A100 and H100 for eight models and TP 1–8. Attention kernels are measured for one shape
//! only, load time and peak memory not at all: those parts are analytic models with
//! documented constants ([`estimators::attention`], [`estimators::lifecycle`]), and their
//! error can be judged only against the emulator.

pub mod activation;
pub mod arch;
pub mod boost;
pub mod data;
pub mod error;
pub mod estimators;
pub mod eval;
pub mod feedback;
pub mod graph;
pub mod measured;
pub mod metrics;
pub mod profile;
pub mod request;
pub mod spec;

pub use error::PredictorError;
pub use spec::{DeviceSpec, Dtype, ModelArch, SpecError};
