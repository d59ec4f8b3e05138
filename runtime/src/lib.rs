//! switchyard-runtime: the workflow model, the pure planner core and its policies, the
//! deterministic simulator shell, and the reports.
//!
//! Module map (see ARCHITECTURE.md):
//! - `workflow` — YAML schema, parsing with positions, validation, dataset binding, petgraph DAG.
//! - `session` — one run of a workflow: activations instantiated as branches resolve.
//! - `responder` — emulated LLM outputs per workload, and accuracy scoring.
//! - `tokens` — real BPE token counts and prefix-block hashes.
//! - `planner` — the pure core `Planner::handle(event, now) -> commands` and its policies.
//! - `sim` — the discrete-event simulator shell on virtual time, arrivals, pools.
//! - `report` — run metrics, JSON, terminal tables' data and SVG timelines.
//! - `shell_common` — what both shells do identically around the core (prepare, report).
//! - `lower_bound` — an offline lower bound on a trace's makespan (analysis only).
//! - `bench` — the paper's evaluation (`switchyard bench`): runs, aggregation, report, charts.
//!
//! The planner core must not depend on `sim`, on the emulator crate, on the clock or on I/O.

pub mod bench;
pub mod ids;
pub mod live;
pub mod lower_bound;
pub mod planner;
pub mod report;
pub mod responder;
pub mod session;
pub mod shell_common;
pub mod sim;
pub mod tokens;
pub mod values;
pub mod workflow;
