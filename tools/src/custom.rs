//! Tools a program plugs in (the library's custom tools): a name, the inputs a workflow node
//! must and may pass, the verdicts it can give (for branch conditions, checked at load time),
//! its modeled duration (the simulator's virtual time), and the code that runs it.
//!
//! A custom tool is the embedding program's own, trusted code: it runs in process, unsandboxed,
//! and decides its own verdict — unlike the built-in tools, which run untrusted model output in
//! a sandbox and compute verdicts outside it. It must be a function of its call (the simulator
//! memoises outcomes by call and may run a call ahead of time). Names of built-in tools cannot
//! be taken, and a name is registered once per process.
//!
//! The registry is process-wide (workflows are validated and run wherever the process loads
//! them); it is read by the workflow loader, [`crate::run_tool`] and
//! [`crate::modeled_duration_s`]. Depends on nothing else of ours.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, RwLock};

use crate::{ToolCall, ToolError, ToolOutcome};

/// What a workflow may pass to a custom tool and what it gives back.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    /// Inputs a node must pass.
    pub required: Vec<String>,
    /// Inputs a node may pass.
    pub optional: Vec<String>,
    /// Verdicts the tool can give (branch conditions may test these); empty: none.
    pub verdicts: Vec<String>,
    /// Seconds a call lasts in virtual time (the simulator's; the live runtime measures).
    pub modeled_duration_s: f64,
}

/// The code of a custom tool.
pub trait CustomTool: Send + Sync {
    /// Run one call (its inputs are the node's rendered templates).
    fn run(&self, call: &ToolCall) -> Result<ToolOutcome, String>;
}

impl<F: Fn(&ToolCall) -> Result<ToolOutcome, String> + Send + Sync> CustomTool for F {
    fn run(&self, call: &ToolCall) -> Result<ToolOutcome, String> {
        self(call)
    }
}

type Registry = RwLock<BTreeMap<String, (ToolSpec, Arc<dyn CustomTool>)>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(BTreeMap::new()))
}

/// Register a custom tool. Refused: a built-in tool's name, a name registered already, a name
/// that is not `[a-z][a-z0-9_]*`, a negative or non-finite modeled duration.
pub fn register(spec: ToolSpec, tool: Arc<dyn CustomTool>) -> Result<(), ToolError> {
    let bad = |reason: &str| ToolError::Custom { tool: spec.name.clone(), message: reason.to_string() };
    let mut chars = spec.name.chars();
    let well_formed = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !well_formed {
        return Err(bad("a tool name is a lowercase identifier ([a-z][a-z0-9_]*)"));
    }
    if crate::TOOLS.contains(&spec.name.as_str()) {
        return Err(bad("that is a built-in tool's name"));
    }
    if !spec.modeled_duration_s.is_finite() || spec.modeled_duration_s < 0.0 {
        return Err(bad("the modeled duration must be a non-negative number of seconds"));
    }
    let mut r = registry().write().unwrap_or_else(|p| p.into_inner());
    if r.contains_key(&spec.name) {
        return Err(bad("a tool of that name is registered already"));
    }
    r.insert(spec.name.clone(), (spec, tool));
    Ok(())
}

/// The spec of custom tool `name`, if one is registered.
pub fn spec(name: &str) -> Option<ToolSpec> {
    registry().read().unwrap_or_else(|p| p.into_inner()).get(name).map(|(s, _)| s.clone())
}

/// Every tool a node may name: the built-in ones, then the custom ones.
pub fn all_names() -> Vec<String> {
    let mut out: Vec<String> = crate::TOOLS.iter().map(|s| s.to_string()).collect();
    out.extend(registry().read().unwrap_or_else(|p| p.into_inner()).keys().cloned());
    out
}

/// Run `call` if it names a custom tool (`None` otherwise). Its outcome's modeled duration
/// is the spec's.
pub(crate) fn run(call: &ToolCall) -> Option<Result<ToolOutcome, ToolError>> {
    let (spec, tool) = registry().read().unwrap_or_else(|p| p.into_inner()).get(&call.tool).cloned()?;
    let started = std::time::Instant::now();
    Some(
        tool.run(call)
            .map(|o| ToolOutcome { modeled_duration_s: spec.modeled_duration_s, wall_seconds: started.elapsed().as_secs_f64(), ..o })
            .map_err(|message| ToolError::Custom { tool: spec.name.clone(), message }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> ToolSpec {
        ToolSpec { name: name.into(), required: vec!["x".into()], optional: vec![], verdicts: vec![], modeled_duration_s: 0.1 }
    }

    fn echo() -> Arc<dyn CustomTool> {
        Arc::new(|call: &ToolCall| {
            Ok(ToolOutcome { text: call.inputs.get("x").map(|v| v.to_string()).unwrap_or_default(), ..ToolOutcome::default() })
        })
    }

    #[test]
    fn registered_tools_run_and_names_are_checked() {
        register(spec("custom_echo_test"), echo()).expect("registers");
        assert!(register(spec("custom_echo_test"), echo()).is_err(), "twice");
        assert!(register(spec("python_tests"), echo()).is_err(), "a built-in name");
        assert!(register(spec("Bad-Name"), echo()).is_err());
        assert!(register(ToolSpec { modeled_duration_s: f64::NAN, ..spec("custom_nan_test") }, echo()).is_err());
        let call = ToolCall {
            tool: "custom_echo_test".into(),
            inputs: [("x".to_string(), serde_json::json!("hi"))].into_iter().collect(),
            timeout_s: None,
        };
        let out = crate::run_tool(&call).expect("runs");
        assert_eq!((out.text.as_str(), out.modeled_duration_s), ("\"hi\"", 0.1));
        assert_eq!(crate::modeled_duration_s(&call), 0.1);
        assert!(all_names().contains(&"custom_echo_test".to_string()));
    }
}
