//! Loading and validating workflows: the three shipped pipelines with their datasets, and one
//! test per error kind asserting the reported position and field path.

use std::path::{Path, PathBuf};

use switchyard_runtime::workflow::{
    ErrorKind, MetricKind, NodeKind, WorkflowError, WorkflowSpec, load_workflow, parse_workflow,
};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn shipped(name: &str) -> WorkflowSpec {
    let path = repo().join("workflows").join(name);
    load_workflow(&path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_three_pipelines_load_with_their_datasets() {
    for (file, records) in [("gsm8k.yaml", 1319), ("mbpp.yaml", 427), ("qmsum.yaml", 35)] {
        let spec = shipped(file);
        let recs = spec.load_records().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(recs.len(), records, "{file}");
        for f in spec.input_fields() {
            assert!(recs.iter().all(|r| r.contains_key(&f)), "{file}: {f}");
        }
    }
}

const BASE: &str = r#"name: t
deployments:
  small: {model: Qwen3-0.6B, max_context: 2048, max_output_tokens: 256}
nodes:
  - id: a
    deployment: small
    responder: generic
    output_tokens: {mean: 100, cv: 0.3}
    prompt: "Q: {{input.q}}"
  - id: b
    tool: python_tests
    after: [a]
    inputs: {code: "{{a}}", tests: "{{input.tests}}"}
"#;

fn parse(text: &str) -> Result<WorkflowSpec, WorkflowError> {
    parse_workflow("t.yaml", text, Path::new("."))
}

fn err(text: &str) -> WorkflowError {
    match parse(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e,
    }
}

#[track_caller]
fn assert_at(e: &WorkflowError, kind: ErrorKind, line: u64, column: u64, field: &str) {
    assert_eq!(e.kind(), Some(kind), "{e}");
    assert_eq!(e.position(), Some((line, column)), "{e}");
    assert_eq!(e.field(), Some(field), "{e}");
    assert!(
        e.to_string()
            .starts_with(&format!("t.yaml:{line}:{column}: {field}: ")),
        "{e}"
    );
}

/// `e` lists (among others) a problem of `kind` at `line`:`column` in `field`.
#[track_caller]
fn assert_has(e: &WorkflowError, kind: ErrorKind, line: u64, column: u64, field: &str) {
    assert!(
        e.all().iter().any(|p| p.kind() == Some(kind) && p.position() == Some((line, column)) && p.field() == Some(field)),
        "no {kind} at {line}:{column} in {field}:\n{e}"
    );
}

#[test]
fn the_base_workflow_is_valid() {
    let spec = parse(BASE).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec.nodes.len(), 2);
    assert_eq!(spec.successors(0), vec![1]);
    assert_eq!(spec.topological_order(), &[0, 1]);
    assert_eq!(
        spec.input_fields(),
        vec!["q".to_string(), "tests".to_string()]
    );
    let NodeKind::Agent(a) = &spec.nodes[0].kind else {
        panic!("not an agent")
    };
    assert_eq!(
        a.max_output_tokens, 256,
        "defaults to the deployment's limit"
    );
    assert_eq!(spec.deployments["small"].gpu_memory_utilization, 0.9);
    assert_eq!(spec.graph().edge_count(), 1);
}

#[test]
fn unknown_node_reference() {
    let e = err(&BASE.replace("after: [a]", "after: [aa]"));
    assert_at(&e, ErrorKind::UnknownReference, 12, 13, "nodes.b.after");
    assert!(
        e.to_string()
            .contains("unknown node `aa` (did you mean `a`?)"),
        "{e}"
    );
}

#[test]
fn without_a_deployments_section_every_node_names_an_unknown_deployment() {
    let e = err("name: bad\nnodes:\n  - id: a\n    deployment: nope\n    prompt: hi\n");
    assert_has(&e, ErrorKind::MissingField, 1, 1, "deployments");
    assert_has(&e, ErrorKind::UnknownReference, 4, 17, "nodes.a.deployment");
    // A `deployments` that is not a mapping cannot say which names exist: not guessed.
    let e = err("name: bad\ndeployments: [x]\nnodes:\n  - id: a\n    deployment: nope\n    prompt: hi\n");
    assert!(!e.all().iter().any(|p| p.field() == Some("nodes.a.deployment")), "{e}");
}

#[test]
fn unknown_deployment_model_responder_and_tool() {
    let e = err(&BASE.replace("deployment: small", "deployment: smal"));
    assert_at(&e, ErrorKind::UnknownReference, 6, 17, "nodes.a.deployment");
    assert!(e.to_string().contains("did you mean `small`"), "{e}");
    let e = err(&BASE.replace("Qwen3-0.6B", "Qwen3-7B"));
    assert_at(
        &e,
        ErrorKind::UnknownModel,
        3,
        18,
        "deployments.small.model",
    );
    // A hybrid model of the catalogue: known, but not deployable in a workflow.
    let e = err(&BASE.replace("Qwen3-0.6B", "Qwen3.5-9B"));
    assert_at(&e, ErrorKind::UnknownModel, 3, 18, "deployments.small.model");
    assert!(e.to_string().contains("hybrid"), "{e}");
    let e = err(&BASE.replace("generic", "gsm8k.solver"));
    assert_at(&e, ErrorKind::UnknownResponder, 7, 16, "nodes.a.responder");
    assert!(e.to_string().contains("did you mean `gsm8k.solve`"), "{e}");
    let e = err(&BASE.replace("tool: python_tests", "tool: pytest"));
    assert_at(&e, ErrorKind::UnknownTool, 11, 11, "nodes.b.tool");
    let e = err(&BASE.replace("tests: \"{{input.tests}}\"", "tset: \"{{input.tests}}\""));
    assert_has(&e, ErrorKind::UnknownField, 13, 29, "nodes.b.inputs.tset");
    // … and, the input not being there, that the tool needs it.
    assert_has(&e, ErrorKind::MissingField, 13, 13, "nodes.b.inputs.tests");
}

#[test]
fn duplicate_ids() {
    let e = err(&BASE.replace("  - id: b", "  - id: a"));
    assert_at(&e, ErrorKind::DuplicateId, 10, 9, "nodes.a.id");
}

#[test]
fn a_cycle_outside_a_loop_is_named() {
    let text = BASE.replace(
        "    prompt: \"Q: {{input.q}}\"",
        "    after: [b]\n    prompt: \"Q: {{input.q}}\"",
    );
    let e = err(&text);
    assert_at(&e, ErrorKind::Cycle, 9, 13, "nodes.a.after");
    assert!(
        e.to_string()
            .contains("cycle a → b → a is not a declared loop"),
        "{e}"
    );
    let e = err(&BASE.replace("after: [a]", "after: [b]"));
    assert_at(&e, ErrorKind::Cycle, 12, 13, "nodes.b.after");
}

const LOOPED: &str = r#"name: t
deployments:
  small: {model: Qwen3-0.6B, max_context: 2048, max_output_tokens: 256}
nodes:
  - id: gen
    deployment: small
    responder: generic
    output_tokens: {mean: 100, cv: 0.3}
    prompt: "Write {{input.q}}"
  - id: fix
    deployment: small
    responder: generic
    after: [gen]
    output_tokens: {mean: 100, cv: 0.3}
    prompt: "Fix {{fix | gen}}"
  - id: check
    tool: python_tests
    after: [fix]
    inputs: {code: "{{fix}}", tests: "{{input.tests}}"}
loops:
  - id: again
    body: [fix, check]
    continue_when: {node: check, verdict: fail}
    max_rounds: 2
"#;

#[test]
fn loops_need_a_bound() {
    let spec = parse(LOOPED).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec.loops[0].entries, vec![1]);
    assert_eq!(spec.loop_of(2).map(|l| l.id.as_str()), Some("again"));
    assert_eq!(
        spec.graph().edge_count(),
        3,
        "two after edges and one back edge"
    );
    let e = err(&LOOPED.replace("    max_rounds: 2\n", ""));
    assert_at(&e, ErrorKind::BadLoop, 21, 5, "loops.again.max_rounds");
    let e = err(&LOOPED.replace("max_rounds: 2", "max_rounds: 0"));
    assert_at(&e, ErrorKind::BadLoop, 24, 17, "loops.again.max_rounds");
    // Rounds × body nodes bound the activations a session holds: 10 nodes × 10,000 rounds is
    // the most, one node more is refused at the loop's `max_rounds`.
    let chain = |n: usize| {
        let mut y = String::from("name: t\ndeployments:\n  small: {model: Qwen3-0.6B, max_context: 2048, max_output_tokens: 256}\nnodes:\n");
        for i in 0..n {
            let after = if i == 0 { String::new() } else { format!("    after: [n{}]\n", i - 1) };
            y += &format!("  - id: n{i}\n    deployment: small\n{after}    output: {{schema: {{type: object, properties: {{ok: {{type: boolean}}}}, required: [ok]}}, verdict: ok}}\n    prompt: \"step {i}\"\n");
        }
        let body: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
        y + &format!("loops:\n  - id: l\n    body: [{}]\n    continue_when: {{node: n{}, verdict: false}}\n    max_rounds: 10000\n", body.join(", "), n - 1)
    };
    parse(&chain(10)).unwrap_or_else(|e| panic!("{e}"));
    let e = err(&chain(11));
    assert!(e.to_string().contains("loops.l.max_rounds") && e.to_string().contains("110000 activations"), "{e}");
    // Summed over the loops: two loops of 6 nodes × 10,000 rounds are refused at the second.
    let mut two = chain(12).replace("body: [n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11]", "body: [n0, n1, n2, n3, n4, n5]");
    two = two.replace("continue_when: {node: n11, verdict: false}", "continue_when: {node: n5, verdict: false}");
    two += "  - id: m\n    body: [n6, n7, n8, n9, n10, n11]\n    continue_when: {node: n11, verdict: false}\n    max_rounds: 10000\n";
    let e = err(&two);
    assert!(e.to_string().contains("loops.m.max_rounds") && e.to_string().contains("with the 60000 of the loops before it"), "{e}");
    let e = err(&LOOPED.replace("continue_when: {node: check", "continue_when: {node: gen"));
    assert_at(
        &e,
        ErrorKind::BadLoop,
        23,
        27,
        "loops.again.continue_when.node",
    );
    // A loop value read without an upstream fallback has no value in round 0.
    let e = err(&LOOPED.replace("{{fix | gen}}", "{{fix}}"));
    assert_at(&e, ErrorKind::UnknownReference, 15, 13, "nodes.fix.prompt");
}

#[test]
fn bad_types_carry_the_value_position() {
    let e = err(&BASE.replace("{mean: 100, cv: 0.3}", "{mean: many, cv: 0.3}"));
    assert_at(&e, ErrorKind::BadType, 8, 27, "nodes.a.output_tokens.mean");
    assert!(
        e.to_string()
            .contains("expected a finite number, found string `many`"),
        "{e}"
    );
    let e = err(&BASE.replace("max_context: 2048", "max_context: -5"));
    assert_at(
        &e,
        ErrorKind::BadType,
        3,
        43,
        "deployments.small.max_context",
    );
    let e = err(&BASE.replace("after: [a]", "after: {a: 1}"));
    assert_at(&e, ErrorKind::BadType, 12, 12, "nodes.b.after");
}

#[test]
fn length_distributions_stay_inside_their_limits() {
    // A mean above max_output_tokens (256 here) describes nothing the run can produce.
    let e = err(&BASE.replace("{mean: 100, cv: 0.3}", "{mean: 1e300, cv: 0.3}"));
    assert_at(&e, ErrorKind::BadType, 8, 27, "nodes.a.output_tokens.mean");
    assert!(
        e.to_string()
            .contains("mean 1e300 must be between 1 and max_output_tokens (256)"),
        "{e}"
    );
    let e = err(&BASE.replace("{mean: 100, cv: 0.3}", "{mean: 100, cv: 1e300}"));
    assert_at(&e, ErrorKind::BadType, 8, 36, "nodes.a.output_tokens.cv");
    assert!(e.to_string().contains("cv 1e300 must be between 0 and 10"), "{e}");
    assert!(parse(&BASE.replace("{mean: 100, cv: 0.3}", "{mean: 256, cv: 10}")).is_ok());
}

#[test]
fn output_limit_above_the_deployment() {
    let text = BASE.replace(
        "    output_tokens: {mean: 100",
        "    max_output_tokens: 300\n    output_tokens: {mean: 100",
    );
    let e = err(&text);
    assert_at(
        &e,
        ErrorKind::OutputLimit,
        8,
        24,
        "nodes.a.max_output_tokens",
    );
}

#[test]
fn a_context_that_can_never_fit() {
    let long = "Think carefully about every word of this instruction. ".repeat(200);
    let e = err(&BASE.replace("\"Q: {{input.q}}\"", &format!("\"{long}{{{{input.q}}}}\"")));
    assert_at(&e, ErrorKind::ContextNeverFits, 9, 13, "nodes.a.prompt");
    assert!(e.to_string().contains("max_context 2048"), "{e}");
}

#[test]
fn syntax_errors_and_unknown_fields() {
    let e = err(&BASE.replace("after: [a]", "after: [a"));
    assert_eq!(e.kind(), Some(ErrorKind::Syntax));
    // The field at the position the parser stopped at (it noticed the open bracket a line later).
    assert_eq!(e.field(), Some("nodes.b.inputs"), "{e}");
    let e = err(&BASE.replace(
        "    responder: generic",
        "    responder: generic\n    temprature: 0.7",
    ));
    assert_at(&e, ErrorKind::UnknownField, 8, 5, "nodes.a.temprature");
    let e = err(&BASE.replace(
        "    responder: generic",
        "    responder: generic\n    tool: majority_vote",
    ));
    assert_eq!(e.kind(), Some(ErrorKind::UnknownField), "{e}");
}

#[test]
fn templates_are_checked() {
    let e = err(&BASE.replace("{{input.q}}", "{{input.q"));
    assert_at(&e, ErrorKind::Template, 9, 13, "nodes.a.prompt");
    // `b` reads a node that is not upstream of it.
    let text = BASE.replace("code: \"{{a}}\"", "code: \"{{c}}\"")
        + r#"  - id: c
    deployment: small
    responder: generic
    output_tokens: {mean: 100, cv: 0.3}
    prompt: "x"
"#;
    let e = err(&text);
    assert_at(
        &e,
        ErrorKind::UnknownReference,
        13,
        20,
        "nodes.b.inputs.code",
    );
    assert!(e.to_string().contains("not upstream of `b`"), "{e}");
    // A condition must test a predecessor.
    let text = BASE.replace(
        "    after: [a]\n",
        "    after: [a]\n    when: {node: b, verdict: fail}\n",
    );
    let e = err(&text);
    assert_at(&e, ErrorKind::UnknownReference, 13, 18, "nodes.b.when.node");
}

fn with_dataset(dir: &Path, fields: &str) -> String {
    BASE.replace(
        "nodes:\n",
        &format!("dataset:\n  file: data.jsonl\n  fields:\n{fields}nodes:\n"),
    )
    .replace("name: t", &format!("name: t\n# dir {}", dir.display()))
}

#[test]
fn dataset_file_missing_and_records_missing_fields() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let fields = "    q: question\n    tests: checks.list\n";
    let text = with_dataset(dir.path(), fields);
    let e = parse_workflow("t.yaml", &text, dir.path())
        .err()
        .unwrap_or_else(|| panic!("accepted"));
    assert_at(&e, ErrorKind::Dataset, 6, 9, "dataset.file");
    // A directory (or a device) by that name is there, but is no dataset.
    std::fs::create_dir(dir.path().join("data.jsonl")).unwrap_or_else(|e| panic!("{e}"));
    let d = parse_workflow("t.yaml", &text, dir.path()).err().unwrap_or_else(|| panic!("accepted"));
    assert!(d.to_string().contains("dataset file `data.jsonl` is not a regular file"), "{d}");
    std::fs::remove_dir(dir.path().join("data.jsonl")).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        e.to_string()
            .contains("dataset file `data.jsonl` not found"),
        "{e}"
    );

    std::fs::write(
        dir.path().join("data.jsonl"),
        "{\"question\": \"1+1?\", \"checks\": {\"list\": [\"assert True\"]}}\n\n{\"question\": \"2+2?\", \"checks\": {}}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let spec = parse_workflow("t.yaml", &text, dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let e = spec
        .load_records()
        .err()
        .unwrap_or_else(|| panic!("accepted"));
    assert_at(&e, ErrorKind::Dataset, 9, 12, "dataset.fields.tests");
    assert!(
        e.to_string().contains("record 1 (line 3)")
            && e.to_string().contains("`checks` has no field `list`"),
        "{e}"
    );
    // A failed read is not kept: the same spec reads the corrected file; a good read is kept
    // and shared, so a run that checked its records before starting does not read them again.
    std::fs::write(
        dir.path().join("data.jsonl"),
        "{\"question\": \"1+1?\", \"checks\": {\"list\": [\"assert True\"]}}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let records = spec.load_records().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(records.len(), 1);
    std::fs::write(dir.path().join("data.jsonl"), "{\"question\": \"changed\", \"checks\": {}}\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let again = spec.load_records().unwrap_or_else(|e| panic!("read again: {e}"));
    assert!(std::sync::Arc::ptr_eq(&records, &again), "read once");
    assert!(std::sync::Arc::ptr_eq(&records, &spec.bound_to("x").load_records().unwrap_or_else(|e| panic!("{e}"))));

    // Templates may only read mapped input fields.
    let e = parse_workflow(
        "t.yaml",
        &with_dataset(dir.path(), "    q: question\n"),
        dir.path(),
    )
    .err()
    .unwrap_or_else(|| panic!("accepted"));
    assert_eq!(e.kind(), Some(ErrorKind::UnknownReference), "{e}");
    assert!(e.to_string().contains("input field `tests`"), "{e}");
}

#[test]
fn metric_checks() {
    let text = BASE.to_string() + "metric: {kind: tests_pass, node: a, reference: q}\n";
    let e = err(&text);
    assert_at(&e, ErrorKind::BadType, 14, 34, "metric.node");
    let text = BASE.to_string() + "metric: {kind: tests_pass, node: b, reference: tests}\n";
    let spec = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec.metric.and_then(|m| m.terms.first().map(|t| t.kind)), Some(MetricKind::TestsPass));
}

#[test]
fn fixtures_report_file_line_column_and_field() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let cases = [
        (
            "bad_unknown_ref.yaml",
            ErrorKind::UnknownReference,
            "nodes.review.after",
            "unknown node `diagnos` (did you mean `diagnose`?)",
        ),
        (
            "bad_cycle.yaml",
            ErrorKind::Cycle,
            "nodes.draft.after",
            "cycle draft → critique → revise → draft is not a declared loop",
        ),
        (
            "bad_type.yaml",
            ErrorKind::BadType,
            "nodes.solve.max_output_tokens",
            "expected a non-negative integer, found string `a lot`",
        ),
    ];
    for (file, kind, field, message) in cases {
        let path = dir.join(file);
        let e = load_workflow(&path)
            .err()
            .unwrap_or_else(|| panic!("{file} accepted"));
        assert_eq!(e.kind(), Some(kind), "{e}");
        assert_eq!(e.field(), Some(field), "{e}");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
        // The comment on line 2 of each fixture states the expected `file:line:column: field: message`.
        let expected = text
            .lines()
            .nth(1)
            .and_then(|l| l.strip_prefix("# Expected: "))
            .unwrap_or_else(|| panic!("{file}: no Expected line"));
        let (line, column) = e.position().unwrap_or_else(|| panic!("no position"));
        assert!(
            expected.starts_with(&format!("{file}:{line}:{column}: {field}: ")),
            "{file}: got {line}:{column}, fixture says {expected}"
        );
        assert!(
            e.to_string().starts_with(&path.display().to_string()),
            "{e}"
        );
        assert!(e.to_string().contains(message), "{e}");
    }
}

#[test]
fn every_tool_has_its_inputs_declared() {
    use switchyard_runtime::workflow::{RESPONDERS, TOOL_INPUTS, TOOLS};
    for t in TOOLS {
        assert!(
            TOOL_INPUTS
                .iter()
                .any(|(name, required, _)| name == t && !required.is_empty()),
            "{t}"
        );
    }
    assert_eq!(TOOL_INPUTS.len(), TOOLS.len());
    assert_eq!(RESPONDERS.len(), 11);
}

#[test]
fn missing_fields_point_at_their_mapping() {
    let e = err(&BASE.replace("    deployment: small\n", ""));
    assert_at(&e, ErrorKind::MissingField, 5, 5, "nodes.a.deployment");
    // A benchmark responder's input needs are checked before any session runs.
    let e = err(&BASE.replace("responder: generic", "responder: gsm8k.solve"));
    assert_at(&e, ErrorKind::MissingInput, 7, 5, "nodes.a.responder");
    assert_eq!(e.all().len(), 2, "question and answer: {e}");
    assert!(e.to_string().contains("needs input field `question`, and this workflow declares no dataset"), "{e}");
    let e = err(&BASE.replace("    tool: python_tests\n", ""));
    assert_at(&e, ErrorKind::MissingField, 10, 5, "nodes.b");
    let e = err(&BASE.replace("name: t\n", ""));
    assert_at(&e, ErrorKind::MissingField, 1, 1, "name");
}

// ---- generic agents ----

const TEAM: &str = r#"name: t
deployments:
  d: {model: Qwen3-8B, max_context: 4096, max_output_tokens: 512}
nodes:
  - id: coder
    role: Python programmer
    goal: Code that passes the tests.
    deployment: d
    prompt: "Write {{input.q}}"
    next_rounds:
      prompt: "Round {{loop.round}}: fix {{coder}} given {{check}}; before: {{coder.prev?}}"
  - id: check
    deployment: d
    after: coder
    prompt: "Check {{coder}}"
    output:
      schema:
        type: object
        properties:
          ok: {type: boolean}
          level: {enum: [low, high]}
        required: [ok, level]
      verdict: ok
  - id: report
    deployment: d
    after: check
    when: {node: check, verdict: false}
    prompt: "Report {{check}} ({{check.verdict | default: \"none\"}})"
loops:
  - id: l
    body: [coder, check]
    continue_when: {node: check, verdict: false}
    max_rounds: 3
"#;

/// A schema within the per-keyword limits whose smallest answer is about a gigabyte (a
/// thousand items of eight strings of 100,000 characters) is refused by its measured size,
/// without being built (found by review: `POST /v1/workflows` built and tokenized it, ~1.6 GB
/// per request, before refusing it).
#[test]
fn a_gigabyte_smallest_answer_is_refused_by_its_size() {
    let huge = "      schema:\n        type: object\n        properties:\n          ok: {type: boolean}\n          a: {type: array, minItems: 1000, items: {type: array, minItems: 8, items: {type: string, minLength: 100000}}}\n        required: [ok, a]\n";
    let text = TEAM.replacen(
        "      schema:\n        type: object\n        properties:\n          ok: {type: boolean}\n          level: {enum: [low, high]}\n        required: [ok, level]\n",
        huge,
        1,
    );
    assert_ne!(text, TEAM);
    let e = err(&text);
    assert_has(&e, ErrorKind::OutputLimit, 16, 5, "nodes.check.output.schema");
    assert!(e.to_string().contains("smallest answer is 800026018 bytes of JSON, above the 1048576"), "{e}");
    // Optional items: the smallest answer is `{"ok":false,"a":[]}`, but a draw may hold a thousand
    // strings padded to 100,000 characters each (a review's schema: minutes of padding and
    // gigabytes of tokenizer state per activation) — refused by that bound.
    let optional = text.replace("minItems: 1000, items: {type: array, minItems: 8,", "maxItems: 1000, items: {type: array, maxItems: 8,");
    assert_ne!(optional, text);
    let e = err(&optional);
    assert_has(&e, ErrorKind::OutputLimit, 16, 5, "nodes.check.output.schema");
    assert!(e.to_string().contains("takes up to 800026018 bytes of JSON by its minimum lengths alone"), "{e}");
    // The same shape at sizes a model writes loads.
    parse(&optional.replace("minLength: 100000", "minLength: 100").replace("maxItems: 1000", "maxItems: 10")).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn generic_agents_load_with_their_defaults_preamble_and_schema_instruction() {
    let spec = parse(TEAM).unwrap_or_else(|e| panic!("{e}"));
    let NodeKind::Agent(coder) = &spec.node("coder").unwrap().kind else { panic!() };
    assert_eq!(coder.responder, "generic");
    assert_eq!(coder.output_tokens.mean, 256.0, "default: min(256, limit / 2)");
    assert_eq!(coder.output_tokens.cv, 0.5);
    let text = coder.prompt.static_text();
    assert!(text.starts_with("You are Python programmer.\nYour goal: Code that passes the tests.\n\nWrite "), "{text}");
    let later = coder.prompt_for(1).static_text();
    assert!(later.starts_with("You are Python programmer.") && later.contains("Round "), "{later}");
    assert_eq!(coder.prompt_for(0), &coder.prompt);
    let NodeKind::Agent(check) = &spec.node("check").unwrap().kind else { panic!() };
    assert!(check.prompt.static_text().contains("Answer with only a JSON value that satisfies this JSON Schema:\n{"));
    assert_eq!(check.output.as_ref().and_then(|o| o.verdict.as_deref()), Some("ok"));
}

#[test]
fn conditions_on_agents_need_a_verdict_they_can_give() {
    // A verdict value the schema cannot produce.
    let e = err(&TEAM.replace("when: {node: check, verdict: false}", "when: {node: check, verdict: maybe}"));
    assert_eq!(e.all().len(), 2, "the `when` and the loop's `continue_when`: {e}");
    assert_at(e.all()[0], ErrorKind::UnknownReference, 27, 34, "nodes.report.when.verdict");
    assert!(e.to_string().contains("`check` never gives the verdict `maybe` (its verdicts: true, false)"), "{e}");
    // An agent without a structured verdict cannot decide a branch.
    let e = err(&TEAM.replace("      verdict: ok\n", ""));
    assert!(e.to_string().contains("agent `check` gives no verdict"), "{e}");
    assert_eq!(e.all().len(), 2, "the `when` and the loop's `continue_when`: {e}");
    // The verdict property must be a required boolean or enum.
    let e = err(&TEAM.replace("verdict: ok\n", "verdict: level2\n"));
    assert!(e.to_string().contains("nodes.check.output.verdict: `level2` is not a top-level property"), "{e}");
    let e = err(&TEAM.replace("required: [ok, level]", "required: [level]"));
    assert!(e.to_string().contains("must be in the schema's `required` list"), "{e}");
    // Schemas outside the subset are named by their path.
    let e = err(&TEAM.replace("level: {enum: [low, high]}", "level: {type: string, pattern: x}"));
    assert!(e.to_string().contains("nodes.check.output.schema.properties.level.pattern: `pattern` is not in the supported schema subset"), "{e}");
    // A tool's verdicts are known too.
    let e = err(&format!("{BASE}  - id: c\n    deployment: small\n    after: b\n    when: {{node: b, verdict: passed}}\n    prompt: x\n"));
    assert!(e.to_string().contains("`b` never gives the verdict `passed` (its verdicts: pass, fail)"), "{e}");
}

#[test]
fn round_references_and_next_rounds_belong_to_loops() {
    let outside = TEAM.replace("    body: [coder, check]", "    body: [check]");
    let e = err(&outside);
    let text = e.to_string();
    assert!(text.contains("nodes.coder.next_rounds: `coder` is in no loop"), "{text}");
    assert!(text.contains("`{{loop.round}}`: `coder` is in no loop"), "{text}");
    assert!(text.contains("`.prev` reads the previous round of a node in the same loop"), "{text}");
    // In the first round, `{{check}}` has no value: the first prompt may not read it bare.
    let e = err(&TEAM.replace("prompt: \"Write {{input.q}}\"", "prompt: \"Write {{input.q}} {{check}}\""));
    assert!(e.to_string().contains("has no value in the loop's first round: make it optional"), "{e}");
    parse(&TEAM.replace("prompt: \"Write {{input.q}}\"", "prompt: \"Write {{input.q}} {{check?}}\"")).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn metrics_may_score_several_nodes_with_weights() {
    let with = |m: &str| format!("{TEAM}metric: {m}\n");
    let spec = parse(&with("[{kind: verdict, node: check, pass: [\"true\"], weight: 3}, {kind: verdict, node: [check], pass: [\"false\"]}]"))
        .unwrap_or_else(|e| panic!("{e}"));
    let m = spec.metric.unwrap();
    assert_eq!(m.terms.len(), 2);
    assert_eq!(m.terms[1].nodes, vec!["check".to_string()]);
    assert_eq!(m.label(), "0.75 verdict + 0.25 verdict");
    assert_eq!(m.shares(), vec![0.75, 0.25]);
    // Weights near f64::MAX are valid and still share the score (their sum overflowed: every
    // session scored NaN, reported as 0).
    let huge = parse(&with("[{kind: verdict, node: check, pass: [\"true\"], weight: 1e308}, {kind: verdict, node: [check], pass: [\"false\"], weight: 1e308}]"))
        .unwrap_or_else(|e| panic!("{e}"));
    let huge = huge.metric.unwrap();
    assert_eq!(huge.shares(), vec![0.5, 0.5]);
    assert_eq!(huge.label(), "0.5 verdict + 0.5 verdict");
    let e = err(&with("{kind: verdict, node: check}"));
    assert!(e.to_string().contains("a `verdict` term needs `pass`"), "{e}");
    let e = err(&with("{kind: verdict, node: coder, pass: [x]}"));
    assert!(e.to_string().contains("agent `coder` gives no verdict"), "{e}");
    let e = err(&with("{kind: rouge_l, node: coder}"));
    assert!(e.to_string().contains("add `reference`"), "{e}");
    let e = err(&with("{kind: tests_pass, node: check, weight: 0}"));
    assert!(e.to_string().contains("tests_pass scores a `python_tests` tool node"), "{e}");
}

const REACT: &str = r#"name: t
deployments:
  small: {model: Qwen3-0.6B, max_context: 4096, max_output_tokens: 256}
nodes:
  - id: fixer
    deployment: small
    role: software engineer
    prompt: "Fix the failing test in {{input.repo}}."
    tools:
      - name: run_tests
        tool: python_tests
        inputs: {code: "{{fixer}}", tests: "{{input.tests}}"}
        timeout_s: 5
    max_turns: 8
  - id: check
    tool: python_tests
    after: fixer
    inputs: {code: "{{fixer}}", tests: "{{input.tests}}"}
"#;

#[test]
fn an_agent_with_tools_gets_tool_steps_and_a_loop_of_turns() {
    let spec = parse(REACT).unwrap_or_else(|e| panic!("{e}"));
    // The file's two nodes, then the agent's tool step.
    let ids: Vec<&str> = spec.nodes.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(ids, ["fixer", "check", "fixer.run_tests"]);
    let step = &spec.nodes[2];
    assert_eq!((step.after.as_slice(), step.tool_of, step.loop_index), (&[0][..], Some(0), Some(0)));
    assert_eq!(step.when.as_ref().map(|c| (c.node, c.verdicts.clone())), Some((0, vec!["tool:run_tests".to_string()])));
    let NodeKind::Tool(t) = &step.kind else { panic!("a tool step") };
    assert_eq!((t.tool.as_str(), t.timeout_s), ("python_tests", Some(5.0)));
    let NodeKind::Agent(a) = &spec.nodes[0].kind else { panic!("an agent") };
    let tools = a.tools.as_ref().expect("tools");
    assert_eq!((tools.max_turns, tools.tools.len(), tools.tools[0].node), (8, 1, 2));
    assert_eq!(tools.turns, switchyard_runtime::workflow::default_turns(8));
    // The prompt ends with the tools and the protocol.
    let prompt = a.prompt.static_text();
    assert!(prompt.starts_with("You are software engineer.\n\nFix the failing test in "), "{prompt}");
    assert!(prompt.contains("- `run_tests`") && prompt.ends_with("An answer without such a line is your final answer."), "{prompt}");
    // The loop of its turns: entry the agent, back edges from the tool step, bound max_turns.
    let l = &spec.loops[0];
    assert_eq!((l.id.as_str(), l.body.as_slice(), l.entries.as_slice(), l.back_from.as_slice()), ("fixer.turns", &[0, 2][..], &[0][..], &[2][..]));
    assert_eq!((l.max_rounds, l.agent, spec.nodes[0].loop_index), (8, Some(0), Some(0)));
    // The step is found by id but is never a sink; `check` waits for the agent's last turn.
    assert_eq!(spec.node_index("fixer.run_tests"), Some(2));
    assert_eq!(spec.sinks(), vec![1]);
    assert_eq!(spec.successors(0), vec![1, 2]);
    assert_eq!(spec.input_fields(), vec!["repo".to_string(), "tests".to_string()]);

    // Several tools, a bare name, descriptions and a `turns` distribution.
    let two = REACT.replace(
        "        timeout_s: 5\n",
        "        timeout_s: 5\n      - name: vote\n        tool: majority_vote\n        description: counts the answers\n        inputs: {candidates: [\"{{fixer}}\", \"{{input.repo}}\"]}\n",
    ).replace("    max_turns: 8\n", "    max_turns: 3\n    turns: {mean: 2}\n");
    let spec = parse(&two).unwrap_or_else(|e| panic!("{e}"));
    let NodeKind::Agent(a) = &spec.nodes[0].kind else { panic!("an agent") };
    let tools = a.tools.as_ref().expect("tools");
    assert_eq!(tools.turns, switchyard_runtime::values::LengthDist { mean: 2.0, cv: 0.5 });
    assert!(a.prompt.static_text().contains("- `vote`: counts the answers"));
    assert_eq!(spec.loops[0].back_from, vec![2, 3]);
    assert_eq!(spec.loops[0].continue_when.verdicts, vec!["tool:run_tests".to_string(), "tool:vote".to_string()]);
}

#[test]
fn the_shipped_react_workflow_loads() {
    let spec = shipped("react.yaml");
    assert!(spec.node("coder.run_tests").is_some());
    assert_eq!(spec.sinks(), vec![spec.node_index("validate").unwrap()]);
    assert!(spec.load_records().unwrap_or_else(|e| panic!("{e}")).len() > 400);
}

#[test]
fn bad_agent_tools_are_named_with_their_position() {
    let e = err(&REACT.replace("tool: python_tests\n        inputs", "tool: pyhton_tests\n        inputs"));
    assert_at(&e, ErrorKind::UnknownTool, 11, 15, "nodes.fixer.tools.run_tests.tool");
    assert!(e.to_string().contains("unknown tool `pyhton_tests` (did you mean `python_tests`?)"), "{e}");

    // A bare name is the tool.
    let bare = REACT.replace(
        "      - name: run_tests\n        tool: python_tests\n        inputs: {code: \"{{fixer}}\", tests: \"{{input.tests}}\"}\n        timeout_s: 5\n",
        "      - run_test\n",
    );
    let e = err(&bare);
    assert_at(&e, ErrorKind::UnknownTool, 10, 9, "nodes.fixer.tools.run_test");
    let e = err(&bare.replace("run_test\n", "python_tests\n"));
    assert_at(&e, ErrorKind::MissingField, 10, 9, "nodes.fixer.tools.python_tests.inputs.code");
    assert!(e.to_string().contains("tool `python_tests` needs input `code`"), "{e}");

    for bad in ["0", "65", "1000"] {
        let e = err(&REACT.replace("max_turns: 8", &format!("max_turns: {bad}")));
        assert_at(&e, ErrorKind::BadLoop, 14, 16, "nodes.fixer.max_turns");
        assert!(e.to_string().ends_with(&format!("max_turns {bad} must be between 1 and 64")), "{e}");
    }
    let e = err(&REACT.replace("max_turns: 8", "max_turns: -1"));
    assert_eq!((e.kind(), e.position(), e.field()), (Some(ErrorKind::BadType), Some((14, 16)), Some("nodes.fixer.max_turns")));
    let e = err(&REACT.replace("    max_turns: 8\n", ""));
    assert_at(&e, ErrorKind::BadLoop, 5, 5, "nodes.fixer.max_turns");
    assert!(e.to_string().contains("an agent with tools needs a bound: add `max_turns`"), "{e}");

    // `max_turns` and `turns` belong to an agent with tools; `tools` to agents.
    let no_tools = "name: t\ndeployments:\n  small: {model: Qwen3-0.6B, max_context: 4096, max_output_tokens: 256}\nnodes:\n  - id: a\n    deployment: small\n    prompt: Hi.\n    max_turns: 3\n";
    let e = err(no_tools);
    assert_at(&e, ErrorKind::MissingField, 8, 5, "nodes.a.max_turns");
    assert!(e.to_string().ends_with("`max_turns` bounds an agent's tool loop: declare the `tools` it may call"), "{e}");
    let e = err(&no_tools.replace("max_turns: 3", "turns: {mean: 2}"));
    assert_at(&e, ErrorKind::MissingField, 8, 5, "nodes.a.turns");
    let e = err(&REACT.replace("    after: fixer\n", "    after: fixer\n    tools: [run_tests]\n"));
    assert_at(&e, ErrorKind::UnknownField, 18, 5, "nodes.check.tools");
    assert!(e.to_string().ends_with("`tools` belongs to agent nodes, and `check` is a tool node"), "{e}");

    // An empty list, a name twice, a bad name, an unknown key.
    let e = err(&REACT.replace(
        "    tools:\n      - name: run_tests\n        tool: python_tests\n        inputs: {code: \"{{fixer}}\", tests: \"{{input.tests}}\"}\n        timeout_s: 5\n",
        "    tools: []\n",
    ));
    assert_at(&e, ErrorKind::MissingField, 9, 12, "nodes.fixer.tools");
    let twice = REACT.replace("        timeout_s: 5\n", "        timeout_s: 5\n      - name: run_tests\n        tool: majority_vote\n");
    let e = err(&twice);
    assert_has(&e, ErrorKind::DuplicateId, 14, 15, "nodes.fixer.tools.run_tests.name");
    let e = err(&REACT.replace("name: run_tests", "name: run tests"));
    assert_at(&e, ErrorKind::BadType, 10, 15, "nodes.fixer.tools[0].name");
    let e = err(&REACT.replace("        timeout_s: 5\n", "        timeout: 5\n"));
    assert_eq!((e.kind(), e.field()), (Some(ErrorKind::UnknownField), Some("nodes.fixer.tools[0].timeout")), "{e}");

    // A tool input is a template checked like a tool node's.
    let e = err(&REACT.replacen("code: \"{{fixer}}\", tests", "code: \"{{fixr}}\", tests", 1));
    assert_at(&e, ErrorKind::UnknownReference, 12, 24, "nodes.fixer.tools.run_tests.inputs.code");
    assert!(e.to_string().contains("unknown node `fixr` (did you mean `fixer`?)"), "{e}");

    // No structured output, no next_rounds, not in a declared loop.
    let e = err(&REACT.replace("    max_turns: 8\n", "    max_turns: 8\n    output:\n      schema: {type: object, properties: {ok: {type: boolean}}, required: [ok]}\n"));
    assert_at(&e, ErrorKind::BadType, 15, 5, "nodes.fixer.output");
    let e = err(&REACT.replace("    max_turns: 8\n", "    max_turns: 8\n    next_rounds: {prompt: Again.}\n"));
    assert_at(&e, ErrorKind::BadLoop, 15, 5, "nodes.fixer.next_rounds");
    let looped = format!("{REACT}loops:\n  - id: l\n    body: [fixer, check]\n    continue_when: {{node: check, verdict: fail}}\n    max_rounds: 2\n");
    let e = err(&looped);
    assert_at(&e, ErrorKind::BadLoop, 21, 12, "loops.l.body");
    assert!(e.to_string().ends_with("`fixer` calls tools: its turns are a loop of their own, and loops do not nest"), "{e}");

    // Its prompt is the first turn's: no own output, no rounds.
    let e = err(&REACT.replace("Fix the failing test in {{input.repo}}.", "Fix {{input.repo}}. Before: {{fixer?}}"));
    assert_at(&e, ErrorKind::UnknownReference, 8, 13, "nodes.fixer.prompt");
    assert!(e.to_string().contains("which is not upstream of `fixer`"), "{e}");
    let e = err(&REACT.replace("Fix the failing test in {{input.repo}}.", "Turn {{loop.round}}: fix {{input.repo}}."));
    assert_at(&e, ErrorKind::UnknownReference, 8, 13, "nodes.fixer.prompt");
    assert!(e.to_string().contains("`fixer` is in no loop"), "{e}");

    // A tool step cannot be named in the file.
    let e = err(&REACT.replace("    after: fixer\n", "    after: fixer.run_tests\n"));
    assert_eq!((e.kind(), e.field()), (Some(ErrorKind::UnknownReference), Some("nodes.check.after")), "{e}");
}

#[test]
fn the_shell_tool_reads_only_literal_paths() {
    let with = |reads: &str| {
        BASE.replace("tool: python_tests", "tool: shell")
            .replace("inputs: {code: \"{{a}}\", tests: \"{{input.tests}}\"}", &format!("inputs: {{command: \"ls\", reads: {reads}}}"))
    };
    assert!(parse(&with("[\"/usr/share\"]")).is_ok());
    let e = err(&with("[\"{{a}}\"]"));
    assert_eq!(e.kind(), Some(ErrorKind::Template), "{e}");
    assert_eq!(e.field(), Some("nodes.b.inputs.reads"), "{e}");
    assert!(e.to_string().contains("written literally"), "{e}");
    // A literal path the tool would refuse is the file's error, at its entry, not every
    // session's at run time: relative, with `..`, or absent on this host.
    // Or the program's own work directory in the sandbox (`/tmp` links to `/work` there).
    for (reads, why) in [("[\"/usr/share\", \"etc/passwd\"]", "is not absolute"), ("[\"/usr/../etc\"]", "contains `..`"), ("[\"/nonexistent/file\"]", "does not exist on this host"), ("[\"/tmp\"]", "own work directory")] {
        let e = err(&with(reads));
        assert_eq!(e.kind(), Some(ErrorKind::BadType), "{e}");
        let field = if reads.contains("etc/passwd") { "nodes.b.inputs.reads[1]" } else { "nodes.b.inputs.reads[0]" };
        assert_eq!(e.field(), Some(field), "{e}");
        assert!(e.to_string().contains(why), "{e}");
    }
}

#[test]
fn a_shell_step_that_reads_host_paths_is_found_without_loading_the_workflow() {
    use switchyard_runtime::workflow::names_shell_reads;
    let with = |reads: &str| {
        BASE.replace("tool: python_tests", "tool: shell")
            .replace("inputs: {code: \"{{a}}\", tests: \"{{input.tests}}\"}", &format!("inputs: {{command: \"ls\", reads: {reads}}}"))
    };
    // Found whether the path exists or not (the loader would tell the two apart).
    assert_eq!(names_shell_reads(&with("[\"/usr/share\"]")).as_deref(), Some("b"));
    assert_eq!(names_shell_reads(&with("[\"/nonexistent/file\"]")).as_deref(), Some("b"));
    assert_eq!(names_shell_reads(&BASE.replace("tool: python_tests", "tool: shell")), None);
    assert_eq!(names_shell_reads(BASE), None);
    // An agent's tool, named by `tool` or by its `name` alone.
    for tool in ["{name: look, tool: shell, inputs: {command: ls, reads: [/etc]}}", "{name: shell, inputs: {reads: [/etc]}}"] {
        let agent = REACT.replace("    tools:\n", &format!("    tools:\n      - {tool}\n"));
        assert!(agent.contains(tool), "REACT's `tools:` list moved");
        assert!(names_shell_reads(&agent).is_some(), "{tool}");
    }
    assert_eq!(names_shell_reads("not: [yaml"), None);
}

/// BASE with a second deployment and node `a` routed between the two (paper 002).
fn routed(route: &str) -> String {
    BASE.replace(
        "  small: {model: Qwen3-0.6B, max_context: 2048, max_output_tokens: 256}\n",
        "  small: {model: Qwen3-0.6B, max_context: 2048, max_output_tokens: 256}\n  large: {model: Qwen3-8B, max_context: 2048, max_output_tokens: 128}\n",
    )
    .replace("    deployment: small\n", &format!("    deployment: {route}\n"))
}

#[test]
fn a_routed_node_names_its_choices_and_each_bad_route_is_placed() {
    let spec = parse(&routed("{route: [small, large]}")).expect("a valid route");
    assert_eq!(spec.route(), Some(&["small".to_string(), "large".to_string()][..]));
    let crate_agent = |s: &WorkflowSpec| match &s.nodes[0].kind {
        switchyard_runtime::workflow::NodeKind::Agent(a) => (a.deployment.clone(), a.max_output_tokens),
        _ => unreachable!(),
    };
    // Static analysis plans with the first member; the node's limit holds on every member.
    assert_eq!(crate_agent(&spec), ("small".to_string(), 128));
    assert_eq!(crate_agent(&spec.bound_to("large")).0, "large");
    assert_eq!(spec.bound_to("large").route(), spec.route(), "the bound workflow still says what it chose among");

    let e = err(&routed("{route: [small, larg]}"));
    assert_at(&e, ErrorKind::UnknownReference, 7, 33, "nodes.a.deployment.route[1]");
    assert!(e.to_string().contains("did you mean `large`"), "{e}");
    let e = err(&routed("{route: []}"));
    assert_at(&e, ErrorKind::BadType, 7, 25, "nodes.a.deployment.route");
    let e = err(&routed("{route: [small, small]}"));
    assert_at(&e, ErrorKind::DuplicateId, 7, 33, "nodes.a.deployment.route[1]");
    let e = err(&routed("{rout: [small]}"));
    assert_at(&e, ErrorKind::UnknownField, 7, 18, "nodes.a.deployment.rout");
    // A workflow is routed as one program: its routed nodes share one route.
    let two = routed("{route: [small, large]}").replace(
        "  - id: b\n",
        "  - id: c\n    deployment: {route: [large, small]}\n    after: [a]\n    prompt: \"again\"\n  - id: b\n",
    );
    let e = err(&two);
    assert_eq!(e.kind(), Some(ErrorKind::BadType), "{e}");
    assert_eq!(e.field(), Some("nodes.c.deployment.route"), "{e}");
    assert!(e.to_string().contains("share one route"), "{e}");
}

/// The shipped judged workflow's text, parsed where its dataset path resolves.
fn judged(text: &str) -> Result<WorkflowSpec, WorkflowError> {
    parse_workflow("t.yaml", text, &repo().join("workflows"))
}

#[test]
fn an_llm_judge_node_is_a_routed_workflows_verifier_and_each_misuse_is_placed() {
    let text = std::fs::read_to_string(repo().join("workflows/gsm8k-judged.yaml")).unwrap();
    let spec = judged(&text).unwrap_or_else(|e| panic!("{e}"));
    let verifier = spec.verifier.as_ref().expect("a verifier term");
    assert_eq!((verifier.kind, verifier.nodes.as_slice()), (MetricKind::Verdict, &["judge".to_string()][..]));
    assert_eq!(spec.metric.as_ref().unwrap().terms[0].kind, MetricKind::Gsm8kExact, "the metric stays the exact answer");
    let line_of = |t: &str, needle: &str| t.lines().position(|l| l.starts_with(needle)).unwrap() as u64 + 1;

    // A verifier teaches a router: a workflow without a route has none.
    let unrouted = text.replace("deployment: {route: [qwen3-0.6b, qwen3-1.7b, qwen3-8b]}", "deployment: qwen3-8b");
    let e = judged(&unrouted).unwrap_err();
    assert_at(&e, ErrorKind::BadType, line_of(&unrouted, "verifier:"), 11, "verifier");
    assert!(e.to_string().contains("no node here has `deployment: {route"), "{e}");
    // One term, no weight.
    let weighted = text.replace("pass: [\"true\"]}", "pass: [\"true\"], weight: 2}");
    let e = judged(&weighted).unwrap_err();
    assert_eq!((e.kind(), e.field()), (Some(ErrorKind::UnknownField), Some("verifier.weight")), "{e}");
    // A judge answers with a boolean verdict.
    let unstructured = text.replace("correct: {type: boolean}", "correct: {type: string, enum: [right, wrong]}");
    let e = judged(&unstructured).unwrap_err();
    assert!(e.to_string().contains("is a judge"), "{e}");
    assert!(e.to_string().contains("t.yaml:"), "the error names the file and line: {e}");
    // A verifier naming a node that does not exist.
    let e = judged(&text.replace("node: judge, pass", "node: judg, pass")).unwrap_err();
    assert_eq!((e.kind(), e.field()), (Some(ErrorKind::UnknownReference), Some("verifier.node")), "{e}");
}

#[test]
fn hostile_sizes_are_refused_at_load() {
    // A loop bound a run would never reach.
    let e = err(&LOOPED.replace("max_rounds: 2", "max_rounds: 1000000000"));
    assert_at(&e, ErrorKind::BadLoop, 24, 17, "loops.again.max_rounds");
    // More nodes than a workflow may have (the graph checks grow with their square).
    let mut text = String::from("name: t\ndeployments:\n  small: {model: Qwen3-0.6B, max_context: 2048, max_output_tokens: 256}\nnodes:\n");
    for i in 0..=switchyard_runtime::workflow::MAX_NODES {
        text.push_str(&format!("  - {{id: n{i}, deployment: small, responder: generic, prompt: hi}}\n"));
    }
    let e = err(&text);
    assert!(e.to_string().contains("nodes: 2001 nodes; a workflow has at most 2000"), "{e}");
    // A stream is read only up to the file limit.
    let e = load_workflow(Path::new("/dev/zero")).unwrap_err();
    assert!(e.to_string().contains("workflow files are read up to 4194304 bytes"), "{e}");
}

/// An agent's tools become nodes (its tool steps): the node limit holds for them too (a review
/// found a file of few nodes and thousands of tools accepted).
#[test]
fn an_agents_tool_steps_count_against_the_node_limit() {
    let tools = |n: usize| {
        (0..n).map(|k| format!("      - {{name: t{k}, tool: python_tests, inputs: {{code: \"x\", tests: \"assert 1\"}}}}\n")).collect::<String>()
    };
    let workflow = |file_nodes: usize, n_tools: usize| {
        let mut y = String::from("name: t\ndeployments:\n  big: {model: Qwen3-0.6B, max_context: 40960, max_output_tokens: 256}\nnodes:\n");
        y.push_str(&format!("  - id: fixer\n    deployment: big\n    prompt: fix\n    max_turns: 1\n    tools:\n{}", tools(n_tools)));
        for i in 1..file_nodes {
            y.push_str(&format!("  - {{id: n{i}, deployment: big, responder: generic, prompt: hi}}\n"));
        }
        y
    };
    let max = switchyard_runtime::workflow::MAX_NODES;
    parse(&workflow(max / 2, max / 2)).unwrap_or_else(|e| panic!("{e}"));
    let e = err(&workflow(max / 2, max / 2 + 1));
    assert_has(&e, ErrorKind::TooLarge, 5, 3, "nodes");
    assert!(e.to_string().contains("1000 nodes and 1001 agent tool steps; a workflow has at most 2000 in all"), "{e}");
}

/// The agents' turn loops count against the activations a session may create, with the
/// declared loops (each declared loop's check counted only the declared ones).
#[test]
fn an_agents_turns_count_against_the_activation_limit() {
    let agent = |id: &str, n: usize| {
        let tools: String = (0..n)
            .map(|k| format!("      - {{name: t{k}, tool: python_tests, inputs: {{code: \"x\", tests: \"assert 1\"}}}}\n"))
            .collect();
        format!("  - id: {id}\n    deployment: big\n    prompt: fix\n    max_turns: 64\n    tools:\n{tools}")
    };
    let with_agents = |rounds: u32| {
        TEAM.replacen("deployments:\n", "deployments:\n  big: {model: Qwen3-0.6B, max_context: 40960, max_output_tokens: 256}\n", 1)
            .replacen("loops:\n", &format!("{}{}loops:\n", agent("a1", 700), agent("a2", 700)), 1)
            .replacen("max_rounds: 3", &format!("max_rounds: {rounds}"), 1)
    };
    // 2 × 701 × 64 = 89,728 turn activations; the declared loop's 2 nodes × 5,000 rounds fit
    // with them, × 10,000 rounds do not.
    parse(&with_agents(5_000)).unwrap_or_else(|e| panic!("{e}"));
    let e = err(&with_agents(10_000));
    assert!(e.all().iter().any(|p| p.kind() == Some(ErrorKind::TooLarge) && p.field() == Some("nodes")), "{e}");
    assert!(e.to_string().contains("the loops may create 109728 activations in a session (`a1.turns` 64 turns × 701 nodes, `a2.turns` 64 turns × 701 nodes"), "{e}");
}

#[test]
fn a_verdict_metric_passes_only_verdicts_its_nodes_give() {
    let with = |m: &str| format!("{TEAM}metric: {m}\n");
    let e = err(&with("{kind: verdict, node: check, pass: [maybe]}"));
    assert!(e.to_string().contains("`maybe` is not a verdict `check` gives (its verdicts: "), "{e}");
    let e = err(&with("{kind: verdict, node: check, pass: []}"));
    assert!(e.to_string().contains("name at least one verdict that scores 1"), "{e}");
}

/// A field a responder reads as text must be text in every record: refused when the records
/// are loaded (by `validate`, and before a run starts), naming the record, its line and the
/// field — it was accepted, and failed only the sessions that drew that record, mid-run.
#[test]
fn dataset_fields_read_as_text_must_be_strings() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows/gsm8k.yaml")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir_all(dir.path().join("datasets/gsm8k")).unwrap_or_else(|e| panic!("{e}"));
    let data = dir.path().join("datasets/gsm8k/test.jsonl");
    std::fs::write(&data, "{\"question\": \"1+1?\", \"answer\": \"2\\n#### 2\"}\n{\"question\": 123, \"answer\": \"#### 5\"}\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let spec = parse_workflow("gsm8k.yaml", &text, dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let e = spec.load_records().err().unwrap_or_else(|| panic!("accepted"));
    let msg = e.to_string();
    assert!(
        msg.contains("dataset.fields.question") && msg.contains("record 1 (line 2)") && msg.contains("must be a string") && msg.contains("found a number"),
        "{msg}"
    );
    std::fs::write(&data, "{\"question\": \"1+1?\", \"answer\": \"2\\n#### 2\"}\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec.load_records().map(|r| r.len()).ok(), Some(1));
    // A byte that is not UTF-8 is named by line and column (a fresh spec: one keeps the records
    // it read).
    std::fs::write(&data, b"{\"question\": \"1+1?\", \"answer\": \"#### 2\"}\n{\"question\": \"caf\xe9\"}\n").unwrap_or_else(|e| panic!("{e}"));
    let spec = parse_workflow("gsm8k.yaml", &text, dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let e = spec.load_records().err().unwrap_or_else(|| panic!("accepted")).to_string();
    assert!(e.contains("not UTF-8 text: line 2, column 18"), "{e}");
}

/// One unknown key hides none of the file's other problems: each node's every field problem,
/// and the metric's, come in one report (a review's file: a `rol:` typo hid three others).
#[test]
fn an_unknown_key_hides_no_other_problem_of_the_file() {
    let text = r#"name: t
deployments:
  d: {model: Qwen3-0.6B, max_context: 2048, max_output_tokens: 256}
nodes:
  - id: a
    deployment: d
    prompt: hi
    max_output_tokens: 0
    output_tokens: {mean: 10, cv: -1}
  - id: b
    rol: Critic
    deployment: d
    after: a
    prompt: "{{a}}"
metric: {kind: verdic, node: b, pass: [x]}
"#;
    let e = err(text);
    assert_has(&e, ErrorKind::OutputLimit, 8, 24, "nodes.a.max_output_tokens");
    assert_has(&e, ErrorKind::BadType, 9, 35, "nodes.a.output_tokens.cv");
    assert_has(&e, ErrorKind::UnknownField, 11, 5, "nodes.b.rol");
    assert_has(&e, ErrorKind::BadType, 15, 16, "metric.kind");
    assert_eq!(e.all().len(), 4, "{e}");
    assert!(e.to_string().contains("did you mean `verdict`"), "{e}");
    // A deployment's problems, all of them.
    let e = err(&text.replace("{model: Qwen3-0.6B, max_context: 2048, max_output_tokens: 256}", "{model: Qwen3-9B, max_context: 0, max_output_tokens: 256, gpu: 1}"));
    assert_has(&e, ErrorKind::UnknownModel, 3, 14, "deployments.d.model");
    assert_has(&e, ErrorKind::BadType, 3, 37, "deployments.d.max_context");
    assert_has(&e, ErrorKind::UnknownField, 3, 64, "deployments.d.gpu");
    // A typo's "did you mean" says what is missing: no second message for the missing key.
    let e = err(&text.replace("    prompt: hi\n", "    promt: hi\n"));
    assert_has(&e, ErrorKind::UnknownField, 7, 5, "nodes.a.promt");
    assert!(!e.to_string().contains("missing required field `prompt`"), "{e}");
}

/// A cycle, or a loop that does not read, hides no template problem and no other loop's.
#[test]
fn a_cycle_hides_no_template_or_loop_problem() {
    let text = r#"name: t
deployments:
  d: {model: Qwen3-0.6B, max_context: 2048, max_output_tokens: 256}
nodes:
  - {id: a, deployment: d, after: b, prompt: "x"}
  - {id: b, deployment: d, after: a, prompt: "{{aa}}"}
  - {id: c, deployment: d, prompt: "{{a}} {{b}}"}
  - {id: t, tool: python_tests, after: c, inputs: {code: "{{c}}", tests: "[]"}}
  - {id: e, deployment: d, prompt: "{{a}}"}
loops:
  - {id: l, body: [c, t], continue_when: {node: t, verdict: fail}, max_rounds: 0}
"#;
    let e = err(text);
    assert_has(&e, ErrorKind::Cycle, 5, 35, "nodes.a.after");
    assert_has(&e, ErrorKind::UnknownReference, 6, 46, "nodes.b.prompt");
    assert_has(&e, ErrorKind::BadLoop, 11, 80, "loops.l.max_rounds");
    assert!(e.to_string().contains("unknown node `aa` (did you mean `a`?)"), "{e}");
    // `e` reads `a`, which is not upstream of it: found on the cyclic graph too.
    assert_has(&e, ErrorKind::UnknownReference, 9, 36, "nodes.e.prompt");
    // The loop's nodes wait for the loop: `c` reading `a` and `b` is not reported yet.
    assert!(!e.to_string().contains("nodes.c.prompt"), "{e}");
}

#[test]
fn a_word_after_a_bar_that_is_no_node_names_the_filters() {
    let e = err(&BASE.replace("prompt: \"Q: {{input.q}}\"", "prompt: \"Q: {{input.q | upper}}\""));
    assert_at(&e, ErrorKind::UnknownReference, 9, 13, "nodes.a.prompt");
    let text = e.to_string();
    assert!(text.contains("unknown node `upper`") && text.contains("`part I of N`, `take N`"), "{e}");
    // The first source is a node, not a filter: no such hint there.
    let e = err(&BASE.replace("prompt: \"Q: {{input.q}}\"", "prompt: \"Q: {{upper}}\""));
    assert!(!e.to_string().contains("`take N`"), "{e}");
}

#[test]
fn a_tab_is_placed_where_it_is() {
    let e = err(&BASE.replace("  - id: b\n", "\t- id: b\n"));
    assert_eq!(e.kind(), Some(ErrorKind::Syntax), "{e}");
    assert_eq!(e.position(), Some((10, 1)), "{e}");
    assert!(e.to_string().contains("tab"), "{e}");
}
