//! switchyard-predictor: device, model and request features, cached profile tables, and the
//! estimators of run time, peak memory and load time (paper 003, §3.3).
//!
//! Owns spec sheets (`spec`) and everything that *estimates*. It must not depend on the
//! runtime or on the emulator: the emulator is the ground truth the estimators are judged
//! against, so no estimate may read it.

pub mod spec;

pub use spec::{Dtype, DeviceSpec, ModelArch, SpecError};
