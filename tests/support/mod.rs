//! Helpers shared by the root package's integration tests.

pub mod fault_proxy;
pub mod live_cli;
pub mod serve;
