//! The live runtime: ractor actors on tokio driving the same pure planner core on wall-clock
//! time (planner, session, replica and tool-executor actors), the engines (`emulated` and
//! `vllm` over HTTP with managed child processes, `openai` endpoints), and the `switchyard
//! emulate` server. It must not depend on the simulator shell (`sim`): what both shells share is
//! `crate::exec`'s (`runtime/tests/module_boundaries.rs` checks).

pub mod engine;
pub mod engines;
pub mod server;
pub mod actors;
pub mod agents;
pub mod factory;
pub mod journal;
pub mod metrics;
pub mod planner_actor;
pub mod pool;
pub mod program_actor;
pub mod replica_actor;
pub mod service;
pub mod session_actor;
pub mod shell;
pub mod tools_actor;

pub use actors::{
    CallTiming, EngineFactory, EngineHandle, EngineTarget, FaultCounters, LiveOutput, NoteSink, ProgramBinding, RetryPolicy,
    ServiceError, SessionResult, SessionStatus,
};
pub use service::{ROUTER_MODEL, ServedModel, Service};
pub use factory::PoolEngines;
pub use pool::{LivePoolError, LivePoolSpec};
pub use planner_actor::Progress;
pub use shell::{LiveConfig, LiveError, run, run_blocking};
