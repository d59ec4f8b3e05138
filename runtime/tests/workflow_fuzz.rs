//! Robustness: mutated versions of the three shipped workflow files (random byte edits,
//! deletions and duplications) never make the loader panic; it returns a workflow or an error
//! whose position lies inside the text.

use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use switchyard_runtime::ids::SessionId;
use switchyard_runtime::session::Session;
use switchyard_runtime::values::Record;
use switchyard_runtime::workflow::{WorkflowError, parse_workflow};

fn workflows_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows")
}

#[derive(Debug, Clone)]
enum Edit {
    /// Overwrite one byte.
    Set(usize, u8),
    /// Delete `len` bytes.
    Delete(usize, usize),
    /// Duplicate `len` bytes in place (a repeated line, key or bracket).
    Duplicate(usize, usize),
    /// Insert one byte.
    Insert(usize, u8),
}

fn edit() -> impl Strategy<Value = Edit> {
    // Bias replacement bytes towards YAML's structural characters.
    let byte = prop_oneof![
        prop::sample::select(b":-[]{}|>&*!#'\"\n ,0123456789".to_vec()),
        any::<u8>(),
    ];
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(p, b)| Edit::Set(p, b)),
        (any::<usize>(), 1usize..40).prop_map(|(p, l)| Edit::Delete(p, l)),
        (any::<usize>(), 1usize..200).prop_map(|(p, l)| Edit::Duplicate(p, l)),
        (any::<usize>(), byte).prop_map(|(p, b)| Edit::Insert(p, b)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for e in edits {
        let n = bytes.len().max(1);
        match *e {
            Edit::Set(p, b) => {
                if let Some(x) = bytes.get_mut(p % n) {
                    *x = b;
                }
            }
            Edit::Delete(p, l) => {
                let start = p % n;
                let end = (start + l).min(bytes.len());
                bytes.drain(start.min(end)..end);
            }
            Edit::Duplicate(p, l) => {
                let start = p % n;
                let end = (start + l).min(bytes.len());
                let chunk: Vec<u8> = bytes
                    .get(start..end)
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default();
                bytes.splice(end..end, chunk);
            }
            Edit::Insert(p, b) => bytes.insert(p % (bytes.len() + 1), b),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn mutated_workflows_never_panic(which in 0usize..3, edits in prop::collection::vec(edit(), 1..6)) {
        let name = ["gsm8k.yaml", "mbpp.yaml", "qmsum.yaml"][which];
        let dir = workflows_dir();
        let original = std::fs::read_to_string(dir.join(name)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let text = apply(&original, &edits);
        match parse_workflow(name, &text, &dir) {
            Ok(spec) => {
                // A mutant that still validates must also start sessions without panicking.
                let mut input = Record::new();
                for f in spec.input_fields() {
                    input.insert(f, serde_json::json!("x"));
                }
                if let Ok(s) = Session::new(SessionId(0), Arc::new(spec), input) {
                    for a in s.ready() {
                        let _ = s.render_prompt(a.index);
                        let _ = s.render_tool_inputs(a.index);
                    }
                }
            }
            Err(e) => {
                // One problem or several, each located in the file.
                let all = e.all();
                prop_assert!(!all.is_empty());
                for one in all {
                    let WorkflowError::Invalid { file, line, column, .. } = one else {
                        return Err(TestCaseError::fail(format!("unexpected error kind: {one}")));
                    };
                    prop_assert_eq!(file, name);
                    prop_assert!(*line >= 1 && *column >= 1);
                    prop_assert!(*line as usize <= text.lines().count() + 1, "line {} beyond the text", line);
                }
            }
        }
    }
}
