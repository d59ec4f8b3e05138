//! The MBPP fixtures of the `python_tests` tool's integration tests, the same whatever sandbox
//! runs the tool: task 2, the call built from JSON inputs and a sample of the shipped dataset.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use switchyard_tools::{ToolCall, ToolOutcome};

/// MBPP task 2 (sanitized MBPP, CC BY 4.0, Austin et al. 2021): reference code and tests.
pub const MBPP_2_CODE: &str = "def similar_elements(test_tup1, test_tup2):\n  res = tuple(set(test_tup1) & set(test_tup2))\n  return (res) ";
pub const MBPP_2_TESTS: [&str; 3] = [
    "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
    "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
    "assert set(similar_elements((11, 12, 14, 13),(17, 15, 14, 13))) == set((13, 14))",
];

/// The shipped sanitized MBPP dataset.
pub const DATASET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../workflows/datasets/mbpp/sanitized-mbpp.json");

/// A `python_tests` call with `inputs`, a JSON object.
pub fn call(inputs: Value) -> ToolCall {
    let inputs: BTreeMap<String, Value> = serde_json::from_value(inputs).expect("object");
    ToolCall { tool: "python_tests".into(), inputs, timeout_s: None }
}

/// Runs the reference solution of every 40th problem of [`DATASET`] (a spread of 11 tasks,
/// including ones with `import math`) through `run` and checks that each passes; skipped with
/// a note where the dataset is not present.
pub fn reference_sample_passes(run: impl Fn(Value) -> ToolOutcome) {
    let Ok(text) = std::fs::read_to_string(DATASET) else {
        eprintln!("note: {DATASET} not present; skipping the dataset sample");
        return;
    };
    let problems: Vec<Value> = serde_json::from_str(&text).expect("MBPP JSON");
    for problem in problems.iter().step_by(40) {
        let out = run(json!({
            "code": problem["code"], "tests": problem["test_list"], "imports": problem["test_imports"]
        }));
        assert_eq!(out.verdict.as_deref(), Some("pass"), "task {}: {}", problem["task_id"], out.text);
    }
}
