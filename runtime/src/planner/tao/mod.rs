//! TAO (paper 000): agentic session evaluation followed by an exact dynamic program for the joint
//! selection and placement of waiting agent sessions on replicas ("nodes" in the paper).
//!
//! Owns the pure core of the method, in the paper's two halves:
//! - [`value`]: session evaluation (§3.2–3.4, Appendix A) — the decayed KV-cache credit k_{i,b}
//!   (Eq. 4), the tool-duration estimator (Eq. 8) with the remaining time (Eq. 5), binary
//!   tool-return readiness r_i (Eq. 6), and the lexicographic value v_{i,b} = (k, r, t) (Eq. 2)
//!   with its embedding u_{i,b} into the plan objective (Eq. 7);
//! - [`dp`]: decision making (§3.5, Appendix B) — the capacity-state dynamic program of Eq. 7 /
//!   Algorithm 1 on a frozen snapshot ([`problem`]: the snapshot and plan types, validation and
//!   quantization, a leaf shared by both solvers), its best-fit-decreasing fallback ([`bfd`]) when
//!   the state budget is exhausted, and live-state revalidation before a plan is applied
//!   ([`revalidate`](mod@revalidate), Appendix B.2).
//!
//! Everything here is a pure function of its arguments: no I/O, no clock (time is always an
//! argument), no randomness, no global state, and no decision that depends on hash-map iteration
//! order (maps are `BTreeMap`s; the solver's hash table is only ever probed, never iterated).
//! It must not depend on the shells (`exec`, `sim`, `live`), `bench`, the emulator crate or the
//! tools crate; the caller builds [`problem::Problem`]s from its own view of the pool.

pub mod bfd;
pub mod dp;
pub mod problem;
pub mod revalidate;
pub mod value;

pub use bfd::best_fit_decreasing;
pub use dp::{SolveOptions, Solver, solve};
pub use problem::{Assignment, Candidate, Plan, Problem};
pub use revalidate::{Applied, DiscardReason, LiveSession, LiveState, revalidate};
pub use value::{
    DEFAULT_TOOL_S, DurationEstimate, DurationStats, EstimateSource, FRESHNESS_S, HALF_LIFE_S, HORIZON_S, MARGIN_DELTA,
    Objective, PROBE_PERIOD_S, Prediction, ToolCall, ToolHistory, Value, decayed_credit, readiness,
};

use thiserror::Error;

/// What can be wrong with the input of TAO's evaluation or solver.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum TaoError {
    /// Δ = 0 would make every quantized weight w̄ = ⌈w/Δ⌉ undefined.
    #[error("the capacity quantum Δ must be positive")]
    ZeroQuantum,
    /// Each waiting session is one candidate of the snapshot.
    #[error("session {0} appears more than once among the candidates")]
    DuplicateSession(u64),
    /// An eligible assignment (i, b) ∈ E names a replica outside the snapshot.
    #[error("session {session} names replica {replica}, but the snapshot has {replicas} replica(s)")]
    UnknownReplica { session: u64, replica: usize, replicas: usize },
    /// An eligible assignment is listed twice, possibly with two different credits.
    #[error("session {session} lists replica {replica} more than once")]
    DuplicateOption { session: u64, replica: usize },
    /// The solver counts admissions and ready sessions in 16-bit fields.
    #[error("{count} candidates exceed the solver's limit of {limit}")]
    TooManyCandidates { count: usize, limit: usize },
    /// The solver sums credits and tokens in 48-bit fields (2.8·10¹⁴ tokens).
    #[error("the candidates' summed {what} ({sum}) exceeds the solver's exact range ({limit})")]
    ValueRange { what: &'static str, sum: u128, limit: u64 },
    /// A completed tool call reported a duration that is negative or not a number.
    #[error("tool `{tool}`: duration {duration_s} s is not a finite, non-negative number")]
    InvalidDuration { tool: String, duration_s: f64 },
}
