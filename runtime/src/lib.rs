//! switchyard-runtime: the workflow model, the pure planner core and its policies, the two
//! shells that drive it (the deterministic simulator and the live runtime) and what they share,
//! and the reports.
//!
//! Module map (see ARCHITECTURE.md):
//! - `workflow` — YAML schema, parsing with positions, validation, dataset binding, petgraph DAG.
//! - `session` — one run of a workflow: activations instantiated as branches resolve.
//! - `responder` — emulated LLM outputs per workload, and accuracy scoring.
//! - `schema` — the JSON-Schema subset of agents' structured outputs: check and draw.
//! - `tokens` — Qwen3 tokenizer counts, Qwen3's chat template and prefix-block hashes.
//! - `memo` — the bounded two-generation memo behind the process-wide caches.
//! - `ids` — session, activation, replica and device identifiers.
//! - `values` — records, node outputs, length distributions, seed derivation.
//! - `agentic` — agent-session traces (paper 000): their format, generator and checks.
//! - `planner` — the pure core `Planner::handle_all(events, now) -> commands` and its policies.
//! - `exec` — what both shells share: run configuration, arrival trace, pool files, setting a
//!   run up, preparing activations, records and the one report builder.
//! - `sim` — the discrete-event simulator shell on virtual time (event queue, emulated replicas).
//! - `live` — the live shell: actors on tokio and wall-clock time, engines, `switchyard emulate`.
//! - `serve` — `switchyard serve`: the REST API, the OpenAI-compatible front door, the journal's
//!   restart path.
//! - `report` — run metrics, JSON, terminal tables' data and SVG timelines.
//! - `lower_bound` — an offline lower bound on a trace's makespan (analysis only).
//! - `bench` — the paper's evaluation (`switchyard bench`): runs, aggregation, report, charts.
//!
//! The planner core must not depend on `exec`, `sim`, `live`, `bench` or `lower_bound`, on the
//! emulator or tools crates, on the clock, on randomness or on I/O. `exec` must not depend on `sim` or `live`; `live` must not depend on `sim`.

pub mod agentic;
pub mod bench;
pub mod exec;
pub mod ids;
pub mod live;
pub mod lower_bound;
pub mod memo;
pub mod planner;
pub mod report;
pub mod responder;
pub mod schema;
pub mod session;
pub mod serve;
pub mod sim;
pub mod tokens;
pub mod values;
pub mod workflow;
