//! Model routing that learns from verified outcomes (paper 002, ORACLE): the pure core.
//!
//! - [`linucb`]: the learner — LinUCB (α_UCB = 0.6) with delayed feedback: a program's decision
//!   counts in the confidence width from the moment it is made (the pending term, Appendix E.9),
//!   its verdict updates the estimate when it lands, in arrival order (§4.2.2); routing never
//!   waits on a verdict. The reward prices cost against success (Appendix B.4).
//! - [`disc`]: DISC, the dispatch scheduler (§4.3, Appendix B.2, C.1) — a reservation ledger per
//!   model (expected peak KV footprint max(tokens, ĉ) + δ̂, strictly FIFO admission within 85 %
//!   of the KV pool, a 95 % per-call ceiling), the wait forecast w = (q + 1)·D / max(K, 1), and
//!   the divert rule at the program boundary.
//! - [`embed`]: the request's offline embedding (hashed word/bigram TF-IDF of its first 4 KiB,
//!   PCA to the 16 components of the router's context) and the nearest-prototype verifier
//!   selector over k = 5 exemplars per verifier (Appendix B.3).
//!
//! - [`router`]: the program-ID table composing them — at a program's first request the
//!   verifier (task type), the learner's choice of model, DISC's one-time divert, the model's
//!   ledger; the verdict lands later and updates the learner.
//! - [`programs`]: the router as the planner core holds it — arms are the run's routed
//!   deployments, a program is bound within its workflow's route, the ledgers' admissions gate
//!   the programs' units in the planner's queue.
//!
//! Everything here is a pure function of its arguments and its own state: no I/O, no clock (time
//! is an argument), no randomness, no global state, `BTreeMap`s where order could matter. It must
//! not depend on the shells (`exec`, `sim`, `live`), `bench`, the emulator crate or the tools
//! crate.

pub mod disc;
pub mod embed;
pub mod linucb;
pub mod programs;
pub mod router;

pub use disc::{DiscConfig, Ledger, LedgerError, LedgerLearned, divert};
pub use embed::{Pca, SparseVec, VerifierSelector, Vocabulary};
pub use linucb::{ALPHA_UCB, Decision, LinUcb, LinUcbError, reward};
pub use programs::{LearnedOutcome, RouteRecord, RoutedPrograms, RoutingSetup, router_features};
pub use router::{Binding, Router, RouterError, RouterOptions, learner_context};
