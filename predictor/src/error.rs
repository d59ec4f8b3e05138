//! The crate's error type. Every failure a user can cause (a bad directory, a malformed CSV or
//! YAML file, an unknown estimator name, a model or device missing from the data) is a
//! [`PredictorError`] that names the file, line or field at fault. Depends on nothing but
//! `thiserror` and the spec errors.

use std::path::PathBuf;

use thiserror::Error;

use crate::spec::SpecError;

/// Errors of the predictor library.
#[derive(Debug, Error)]
pub enum PredictorError {
    /// A file or directory could not be read.
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A YAML config (model or device) is malformed or lacks a field.
    #[error("{path}: {message}")]
    BadConfig { path: PathBuf, message: String },
    /// A profiling CSV is malformed: a missing column, an unparsable number.
    #[error("{path}, line {line}: {message}")]
    BadCsv {
        path: PathBuf,
        line: u64,
        message: String,
    },
    /// A count column of a profiling CSV (token count, tensor-parallel degree, heads, batch
    /// size …) holds a value that is not a whole number in the column's range; it used to be
    /// truncated or saturated into an integer silently.
    #[error("{path}, line {line}: column `{column}`: {value} is not a whole number from {min} to {max}")]
    BadCount {
        path: PathBuf,
        line: u64,
        column: String,
        value: f64,
        min: u64,
        max: u64,
    },
    /// A directory does not follow the Vidur profiling layout or holds no measurements.
    #[error("{path}: {message}")]
    BadLayout { path: PathBuf, message: String },
    /// A spec-sheet lookup failed.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// `estimator(name)` got a name it does not know.
    #[error("unknown estimator `{0}` (known: formula, gbdt, graph)")]
    UnknownEstimator(String),
    /// A learner got no training data (e.g. every measurement was held out).
    #[error("cannot train {estimator}: {message}")]
    Training { estimator: String, message: String },
    /// A profile-table request that cannot be served (empty bucket grid, nothing to build).
    #[error("profile table: {0}")]
    ProfileTable(String),
}
