//! switchyard-predictor: device, model and request features, cached profile tables, and the
//! estimators of run time, peak memory and load time (paper 003, §3.3).
//!
//! Owns spec sheets (`spec`) and everything that *estimates*. It must not depend on the
//! runtime or on the emulator: the emulator is the ground truth the estimators are judged
//! against, so no estimate may read it.

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
