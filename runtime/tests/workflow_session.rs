//! The session model: activations unfold as branches resolve, skips propagate, joins after an
//! optional branch still run, loop rounds are new activations bounded by `max_rounds`, and
//! misuse is an error, never a panic. Property test over random verdict sequences.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use switchyard_runtime::ids::{ActivationId, SessionId};
use switchyard_runtime::session::{ActivationState, Session, SessionError};
use switchyard_runtime::values::{NodeOutput, Record};
use switchyard_runtime::workflow::{WorkflowSpec, load_workflow, parse_workflow};

fn shipped(name: &str) -> Arc<WorkflowSpec> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../workflows")
        .join(name);
    Arc::new(load_workflow(&path).unwrap_or_else(|e| panic!("{e}")))
}

fn first_record(spec: &WorkflowSpec) -> Record {
    spec.load_records()
        .unwrap_or_else(|e| panic!("{e}"))[0]
        .clone()
}

fn out(text: &str, verdict: Option<&str>) -> NodeOutput {
    NodeOutput {
        text: text.into(),
        verdict: verdict.map(str::to_string),
        ..Default::default()
    }
}

fn idx(s: &Session, node: &str, round: u32) -> Option<u32> {
    s.activation_for(s.spec().node_index(node)?, round)
}

fn names(s: &Session, ids: &[ActivationId]) -> Vec<String> {
    ids.iter()
        .map(|a| {
            let act = s
                .activation(a.index)
                .unwrap_or_else(|| panic!("no activation"));
            format!("{}#{}", s.spec().nodes[act.node].id, act.round)
        })
        .collect()
}

/// Start and complete the ready activation of `node` (round = its latest), with `o`; the
/// session's kept frontier is checked against its definition after it.
fn run(s: &mut Session, node: &str, o: NodeOutput) -> Vec<String> {
    let n = s
        .spec()
        .node_index(node)
        .unwrap_or_else(|| panic!("no node {node}"));
    let i = s
        .ready()
        .into_iter()
        .find(|a| s.activation(a.index).map(|x| x.node) == Some(n))
        .unwrap_or_else(|| panic!("{node} is not ready; ready: {:?}", names(s, &s.ready())));
    s.mark_running(i.index).unwrap_or_else(|e| panic!("{e}"));
    let newly = s.complete(i.index, o).unwrap_or_else(|e| panic!("{e}"));
    s.check_bookkeeping().unwrap_or_else(|e| panic!("after {node}: {e}"));
    names(s, &newly)
}

#[test]
fn mbpp_passing_first_test_skips_the_repair_branch_but_validates() {
    let spec = shipped("mbpp.yaml");
    let mut s = Session::new(SessionId(1), Arc::clone(&spec), first_record(&spec))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names(&s, &s.ready()), vec!["generate#0"]);
    // The repair branch does not exist yet, and neither does the validation after the loop.
    assert_eq!(idx(&s, "diagnose", 0), None);
    assert_eq!(idx(&s, "validate", 0), None);
    assert_eq!(
        run(
            &mut s,
            "generate",
            out("```python\ndef f(): pass\n```", None)
        ),
        vec!["test#0"]
    );
    assert_eq!(
        run(&mut s, "test", out("1/1 tests passed", Some("pass"))),
        vec!["validate#0"]
    );
    let skipped: Vec<String> = s
        .skipped()
        .iter()
        .map(|(n, r)| format!("{}#{r}", spec.nodes[*n].id))
        .collect();
    assert_eq!(
        skipped,
        vec!["diagnose#0", "review#0", "repair#0", "retest#0"]
    );
    let v = idx(&s, "validate", 0).unwrap_or_else(|| panic!("no validate"));
    assert_eq!(
        s.activation(v).map(|a| a.predecessors.clone()),
        Some(vec![idx(&s, "test", 0).unwrap_or(99)])
    );
    let inputs = s.render_tool_inputs(v).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        inputs["code"],
        serde_json::json!("```python\ndef f(): pass\n```"),
        "falls back to the generated code"
    );
    assert_eq!(
        inputs["tests"],
        s.input()["test_list"],
        "all asserts, as a list"
    );
    run(&mut s, "validate", out("3/3 tests passed", Some("pass")));
    assert!(s.is_finished());
    assert_eq!(
        s.final_output().and_then(|o| o.verdict.as_deref()),
        Some("pass")
    );
    assert_eq!(s.activations().len(), 3);
}

#[test]
fn mbpp_repair_rounds_are_new_activations_bounded_by_max_rounds() {
    let spec = shipped("mbpp.yaml");
    let mut s = Session::new(SessionId(2), Arc::clone(&spec), first_record(&spec))
        .unwrap_or_else(|e| panic!("{e}"));
    run(&mut s, "generate", out("```python\ngen\n```", None));
    // The test is near-ready while nothing runs? No: generate completed, so it is ready.
    assert_eq!(names(&s, &s.ready()), vec!["test#0"]);
    let created = run(
        &mut s,
        "test",
        out("0/1 tests passed; first failure: A", Some("fail")),
    );
    assert_eq!(created, vec!["diagnose#0"]);
    // The rest of round 0 exists, pending; review is near-ready once diagnose runs.
    let d0 = idx(&s, "diagnose", 0).unwrap_or(99);
    assert!(idx(&s, "review", 0).is_some() && idx(&s, "retest", 0).is_some());
    assert!(s.near_ready().is_empty());
    s.mark_running(d0).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names(&s, &s.near_ready()), vec!["review#0"]);
    s.complete(d0, out("diagnosis 0", None))
        .unwrap_or_else(|e| panic!("{e}"));
    run(&mut s, "review", out("review 0", None));
    let r0 = idx(&s, "repair", 0).unwrap_or(99);
    let up: Vec<&str> = s.upstream(r0).iter().map(|(n, _)| *n).collect();
    assert_eq!(
        up,
        vec!["diagnose", "review", "generate", "test"],
        "preds, then the code and report it reads"
    );
    run(&mut s, "repair", out("```python\nrepair0\n```", None));
    assert_eq!(
        run(&mut s, "retest", out("0/1; first failure: B", Some("fail"))),
        vec!["diagnose#1"]
    );
    // Round 1 reads round 0's repair and re-test report.
    let d1 = idx(&s, "diagnose", 1).unwrap_or(99);
    let prompt = s
        .render_prompt(d1)
        .unwrap_or_else(|e| panic!("{e}"))
        .concat();
    assert!(
        prompt.contains("repair0")
            && prompt.contains("first failure: B")
            && !prompt.contains("gen\n"),
        "{prompt}"
    );
    let back = idx(&s, "retest", 0).unwrap_or(99);
    assert!(
        s.activation(d1)
            .is_some_and(|a| a.predecessors.contains(&back) && a.round == 1)
    );
    assert_eq!(
        idx(&s, "validate", 0),
        None,
        "the last round is not known yet"
    );
    for round in 1..3 {
        run(&mut s, "diagnose", out(&format!("diagnosis {round}"), None));
        run(&mut s, "review", out("review", None));
        run(
            &mut s,
            "repair",
            out(&format!("```python\nrepair{round}\n```"), None),
        );
        if round == 2 {
            // The third round is the last possible one: validation exists and is near-ready
            // while the last re-test runs.
            let rt = idx(&s, "retest", 2).unwrap_or(99);
            s.mark_running(rt).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(names(&s, &s.near_ready()), vec!["validate#0"]);
            let newly = s
                .complete(rt, out("still failing", Some("fail")))
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(names(&s, &newly), vec!["validate#0"]);
        } else {
            run(&mut s, "retest", out("still failing", Some("fail")));
        }
    }
    assert_eq!(s.loop_rounds(0), Some(3));
    assert_eq!(idx(&s, "diagnose", 3), None, "max_rounds bounds the loop");
    let v = idx(&s, "validate", 0).unwrap_or(99);
    assert_eq!(
        s.render_tool_inputs(v).map(|i| i["code"].clone()),
        Ok(serde_json::json!("```python\nrepair2\n```"))
    );
    run(&mut s, "validate", out("1/3", Some("fail")));
    assert!(s.is_finished());
    assert_eq!(s.activations().len(), 2 + 3 * 4 + 1);
}

#[test]
fn gsm8k_fork_join_and_near_ready_window() {
    let spec = shipped("gsm8k.yaml");
    let mut s = Session::new(SessionId(3), Arc::clone(&spec), first_record(&spec))
        .unwrap_or_else(|e| panic!("{e}"));
    let ready = s.ready();
    assert_eq!(ready.len(), 5);
    assert!(s.near_ready().is_empty());
    for a in &ready[..4] {
        s.mark_running(a.index).unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(s.near_ready().is_empty(), "one solver has not started");
    s.mark_running(ready[4].index)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names(&s, &s.near_ready()), vec!["vote#0"]);
    for (k, a) in ready.iter().enumerate() {
        let newly = s
            .complete(a.index, out(&format!("steps\n#### {}", 18 + k % 2), None))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(newly.len(), usize::from(k == 4));
    }
    let vote = idx(&s, "vote", 0).unwrap_or(99);
    let inputs = s.render_tool_inputs(vote).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(inputs["candidates"].as_array().map(Vec::len), Some(5));
    assert_eq!(inputs["extract"], serde_json::json!("gsm8k"));
    s.mark_running(vote).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names(&s, &s.near_ready()), vec!["refine#0"]);
    s.complete(
        vote,
        NodeOutput {
            text: "Majority answer: 18 (3 of 5 votes)".into(),
            verdict: Some("majority".into()),
            value: serde_json::json!({"answer": "18"}),
            output_tokens: 0,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let refine = idx(&s, "refine", 0).unwrap_or(99);
    assert_eq!(s.upstream(refine).len(), 6);
    let segs = s.render_prompt(refine).unwrap_or_else(|e| panic!("{e}"));
    assert!(segs.concat().contains("Vote: Majority answer: 18"));
    assert!(
        segs.concat()
            .contains(s.input()["question"].as_str().unwrap_or("?"))
    );
    assert!(
        segs.len() > 10,
        "static text and inserted values are separate segments"
    );
    run(&mut s, "refine", out("#### 18", None));
    assert!(s.is_finished());
    assert_eq!(s.final_output().map(|o| o.text.as_str()), Some("#### 18"));
}

#[test]
fn qmsum_lanes_read_their_parts_of_the_transcript() {
    let spec = shipped("qmsum.yaml");
    let s = Session::new(SessionId(4), Arc::clone(&spec), first_record(&spec))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names(&s, &s.ready()), vec!["lane_a_1#0", "lane_b_1#0"]);
    assert_eq!(
        s.activations().len(),
        9,
        "no branches: every activation exists from the start"
    );
    let a1 = s
        .render_prompt(idx(&s, "lane_a_1", 0).unwrap_or(99))
        .unwrap_or_else(|e| panic!("{e}"))
        .concat();
    let b1 = s
        .render_prompt(idx(&s, "lane_b_1", 0).unwrap_or(99))
        .unwrap_or_else(|e| panic!("{e}"))
        .concat();
    let transcript = s.input()["transcript"].as_str().unwrap_or("");
    let first_line = transcript.lines().next().unwrap_or("?");
    let last_line = transcript.lines().last().unwrap_or("?");
    assert!(a1.contains(first_line) && !b1.contains(first_line));
    assert!(!a1.contains(last_line));
    // Lane A, stage 2 cannot render before stage 1 produced its summary.
    let a2 = idx(&s, "lane_a_2", 0).unwrap_or(99);
    assert!(matches!(
        s.render_prompt(a2),
        Err(SessionError::Unresolved { .. })
    ));
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    let spec = shipped("gsm8k.yaml");
    let rec = first_record(&spec);
    let mut missing = rec.clone();
    missing.remove("question");
    assert!(matches!(
        Session::new(SessionId(5), Arc::clone(&spec), missing),
        Err(SessionError::MissingInput { .. })
    ));
    let mut s =
        Session::new(SessionId(5), Arc::clone(&spec), rec).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        s.complete(0, out("x", None)),
        Err(SessionError::WrongState {
            state: ActivationState::Ready,
            ..
        })
    ));
    assert!(matches!(
        s.complete(99, out("x", None)),
        Err(SessionError::UnknownActivation { .. })
    ));
    assert!(matches!(
        s.mark_running(5),
        Err(SessionError::WrongState {
            state: ActivationState::Pending,
            ..
        })
    ));
    assert!(matches!(
        s.render_tool_inputs(0),
        Err(SessionError::WrongKind { .. })
    ));
    assert!(matches!(
        s.render_prompt(5),
        Err(SessionError::WrongKind { .. })
    ));
    s.mark_running(0).unwrap_or_else(|e| panic!("{e}"));
    assert!(s.mark_running(0).is_err());
    s.requeue(0).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        s.activation(0).map(|a| a.state),
        Some(ActivationState::Ready)
    );
    s.mark_running(0).unwrap_or_else(|e| panic!("{e}"));
    s.complete(0, out("#### 1", None))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        s.complete(0, out("again", None)),
        Err(SessionError::WrongState {
            state: ActivationState::Completed,
            ..
        })
    ));
    s.fail("tool crashed");
    assert!(s.is_finished() && s.ready().is_empty());
    assert!(matches!(
        s.mark_running(1),
        Err(SessionError::Failed { .. })
    ));
}

/// A synthetic workflow with two exclusive branches, a join after them, a node that depends
/// only on one branch, and a loop whose bound is a parameter.
fn branchy(max_rounds: u32) -> Arc<WorkflowSpec> {
    let text = format!(
        r#"name: branchy
deployments:
  m: {{model: Qwen3-0.6B, max_context: 2048, max_output_tokens: 64}}
nodes:
  - {{id: gen, deployment: m, responder: generic, output_tokens: {{mean: 10, cv: 0}}, prompt: "{{{{input.q}}}}"}}
  - {{id: check, tool: python_tests, after: [gen], inputs: {{code: "{{{{gen}}}}", tests: "{{{{input.t}}}}"}}}}
  - {{id: good, deployment: m, responder: generic, after: [check], when: {{node: check, verdict: pass}}, output_tokens: {{mean: 10, cv: 0}}, prompt: "{{{{gen}}}}"}}
  - {{id: bad, deployment: m, responder: generic, after: [check], when: {{node: check, verdict: [fail]}}, output_tokens: {{mean: 10, cv: 0}}, prompt: "{{{{gen}}}}"}}
  - {{id: only_bad, deployment: m, responder: generic, after: [bad], output_tokens: {{mean: 10, cv: 0}}, prompt: "{{{{bad}}}}"}}
  - {{id: join, deployment: m, responder: generic, after: [good, only_bad], output_tokens: {{mean: 10, cv: 0}}, prompt: "{{{{good | only_bad}}}}"}}
  - {{id: fix, deployment: m, responder: generic, after: [join], output_tokens: {{mean: 10, cv: 0}}, prompt: "{{{{fix | gen}}}}", output: {{schema: {{type: object, properties: {{parity: {{enum: [odd, even]}}}}, required: [parity]}}, verdict: parity}}}}
  - {{id: recheck, tool: python_tests, after: [fix], inputs: {{code: "{{{{fix}}}}", tests: "{{{{input.t}}}}"}}}}
  - {{id: side, deployment: m, responder: generic, after: [fix], when: {{node: fix, verdict: odd}}, output_tokens: {{mean: 10, cv: 0}}, prompt: "{{{{fix}}}}"}}
  - {{id: last, tool: python_tests, after: [check, recheck, side], inputs: {{code: "{{{{fix | gen}}}}", tests: "{{{{input.t}}}}"}}}}
loops:
  - {{id: l, body: [fix, recheck], continue_when: {{node: recheck, verdict: fail}}, max_rounds: {max_rounds}}}
"#
    );
    Arc::new(
        parse_workflow("branchy.yaml", &text, Path::new(".")).unwrap_or_else(|e| panic!("{e}")),
    )
}

#[derive(Debug, Clone, Copy)]
enum Step {
    /// Start the k-th ready activation (modulo their number).
    Start(usize),
    /// Complete the k-th running activation with the next verdict of the sequence.
    Complete(usize),
}

fn steps() -> impl Strategy<Value = (Vec<Step>, Vec<Option<&'static str>>)> {
    // Weighted towards the verdicts the conditions test, so branches and loops are exercised.
    let verdict = prop_oneof![
        3 => Just(Some("fail")),
        2 => Just(Some("pass")),
        1 => Just(Some("error")),
        1 => Just(Some("odd")),
        1 => Just(None),
        1 => Just(Some("majority")),
        1 => Just(Some("tie")),
    ];
    (
        prop::collection::vec(
            prop_oneof![
                any::<usize>().prop_map(Step::Start),
                any::<usize>().prop_map(Step::Complete)
            ],
            0..120,
        ),
        prop::collection::vec(verdict, 1..40),
    )
}

/// Drive a session with `plan`, then to its end, taking completion verdicts cyclically from
/// `verdicts`; checks the invariants after every step.
fn drive(
    spec: Arc<WorkflowSpec>,
    input: Record,
    plan: &[Step],
    verdicts: &[Option<&'static str>],
) -> Result<(), TestCaseError> {
    let mut s = Session::new(SessionId(9), Arc::clone(&spec), input)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut completions: BTreeMap<u32, u32> = BTreeMap::new();
    let mut next_verdict = verdicts.iter().copied().cycle();
    let mut step = |s: &mut Session,
                    st: Step,
                    completions: &mut BTreeMap<u32, u32>|
     -> Result<(), TestCaseError> {
        match st {
            Step::Start(k) => {
                let ready = s.ready();
                if ready.is_empty() {
                    return Ok(());
                }
                let a = ready[k % ready.len()].index;
                let preds = s
                    .activation(a)
                    .map(|x| x.predecessors.clone())
                    .unwrap_or_default();
                for p in preds {
                    prop_assert_eq!(
                        s.activation(p).map(|x| x.state),
                        Some(ActivationState::Completed)
                    );
                }
                s.mark_running(a)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Step::Complete(k) => {
                let v = next_verdict.next().flatten();
                let running: Vec<u32> = s
                    .activations()
                    .iter()
                    .filter(|a| a.state == ActivationState::Running)
                    .map(|a| a.id.index)
                    .collect();
                if running.is_empty() {
                    // Completing an activation that is not running is refused.
                    for a in s
                        .activations()
                        .iter()
                        .map(|a| a.id.index)
                        .collect::<Vec<_>>()
                    {
                        prop_assert!(s.complete(a, out("x", v)).is_err());
                    }
                    return Ok(());
                }
                let a = running[k % running.len()];
                *completions.entry(a).or_default() += 1;
                let newly = s
                    .complete(a, out("out", v))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                for n in newly {
                    prop_assert_eq!(
                        s.activation(n.index).map(|x| x.state),
                        Some(ActivationState::Ready)
                    );
                }
            }
        }
        // The frontier the session keeps is its definition over the whole history, and the
        // ready and near-ready sets read from it are the ones a full scan finds.
        s.check_bookkeeping().map_err(TestCaseError::fail)?;
        prop_assert!(s.failure().is_none(), "this driver never fails a session");
        let state = |p: u32| s.activation(p).map(|x| x.state);
        let ready: Vec<u32> =
            s.activations().iter().filter(|a| a.state == ActivationState::Ready).map(|a| a.id.index).collect();
        prop_assert_eq!(s.ready().iter().map(|a| a.index).collect::<Vec<_>>(), ready);
        let near: Vec<u32> = s
            .activations()
            .iter()
            .filter(|a| {
                a.state == ActivationState::Pending
                    && a.predecessors.iter().all(|&p| matches!(state(p), Some(ActivationState::Completed | ActivationState::Running)))
                    && a.predecessors.iter().any(|&p| state(p) == Some(ActivationState::Running))
            })
            .map(|a| a.id.index)
            .collect();
        prop_assert_eq!(s.near_ready().iter().map(|a| a.index).collect::<Vec<_>>(), near);
        for a in s.near_ready() {
            let act = s
                .activation(a.index)
                .ok_or_else(|| TestCaseError::fail("no activation"))?;
            prop_assert_eq!(act.state, ActivationState::Pending);
            prop_assert!(
                act.predecessors
                    .iter()
                    .any(|&p| s.activation(p).map(|x| x.state) == Some(ActivationState::Running))
            );
        }
        Ok(())
    };
    for &st in plan {
        step(&mut s, st, &mut completions)?;
    }
    // Finish: start everything ready and complete everything running until nothing moves.
    for _ in 0..1000 {
        if s.is_finished() {
            break;
        }
        let st = if s.ready().is_empty() {
            Step::Complete(0)
        } else {
            Step::Start(0)
        };
        step(&mut s, st, &mut completions)?;
    }
    prop_assert!(s.is_finished(), "session did not finish");
    prop_assert!(
        completions.values().all(|&c| c == 1),
        "an activation completed twice"
    );
    prop_assert!(
        s.activations()
            .iter()
            .all(|a| a.state == ActivationState::Completed)
    );
    // Loop rounds never exceed max_rounds; other nodes run at most once; rounds count up.
    let mut per_node: BTreeMap<usize, u32> = BTreeMap::new();
    for a in s.activations() {
        prop_assert_eq!(a.round, per_node.get(&a.node).copied().unwrap_or(0));
        *per_node.entry(a.node).or_default() += 1;
    }
    for (n, count) in per_node {
        let bound = spec.loop_of(n).map(|l| l.max_rounds).unwrap_or(1);
        prop_assert!(
            count <= bound,
            "node {} ran {} times (bound {})",
            spec.nodes[n].id,
            count,
            bound
        );
    }
    prop_assert!(s.final_output().is_some());
    Ok(())
}

fn branchy_input() -> Record {
    let mut r = Record::new();
    r.insert("q".into(), serde_json::json!("write f"));
    r.insert("t".into(), serde_json::json!(["assert f() == 1"]));
    r
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_verdicts_always_finish_within_bounds((plan, verdicts) in steps(), rounds in 1u32..5) {
        drive(branchy(rounds), branchy_input(), &plan, &verdicts)?;
    }

    #[test]
    fn shipped_pipelines_finish_on_random_verdicts((plan, verdicts) in steps(), which in 0usize..3) {
        let spec = shipped(["gsm8k.yaml", "mbpp.yaml", "qmsum.yaml"][which]);
        // A small input record with every field the workflow reads.
        let mut r = Record::new();
        for f in spec.input_fields() {
            r.insert(f, serde_json::json!(["line one", "line two"]));
        }
        drive(spec, r, &plan, &verdicts)?;
    }
}

#[test]
fn joins_run_after_either_branch_and_single_branch_dependents_are_skipped() {
    let spec = branchy(2);
    let mut s = Session::new(SessionId(7), Arc::clone(&spec), branchy_input())
        .unwrap_or_else(|e| panic!("{e}"));
    run(&mut s, "gen", out("g", None));
    assert_eq!(
        run(&mut s, "check", out("ok", Some("pass"))),
        vec!["good#0"]
    );
    assert_eq!(run(&mut s, "good", out("fine", None)), vec!["join#0"]);
    let skipped: Vec<String> = s
        .skipped()
        .iter()
        .map(|(n, r)| format!("{}#{r}", spec.nodes[*n].id))
        .collect();
    assert_eq!(skipped, vec!["bad#0", "only_bad#0"]);
    let j = idx(&s, "join", 0).unwrap_or(99);
    assert_eq!(s.render_prompt(j).map(|p| p.concat()), Ok("fine".into()));
    run(&mut s, "join", out("j", None));
    run(&mut s, "fix", out("f0", Some("odd")));
    // `side` (after fix, outside the loop) reads the loop's last round: it does not exist
    // while another round may follow.
    assert_eq!(idx(&s, "side", 0), None);
    run(&mut s, "recheck", out("r", Some("fail")));
    assert_eq!(
        idx(&s, "fix", 1).map(|i| s.activation(i).map(|a| a.round)),
        Some(Some(1))
    );
    assert_eq!(
        s.render_prompt(idx(&s, "fix", 1).unwrap_or(99))
            .map(|p| p.concat().split("\n\nAnswer with only a JSON value").next().unwrap_or_default().to_string()),
        Ok("f0".into())
    );
    run(&mut s, "fix", out("f1", Some("odd")));
    // Round 1 is the last (max_rounds 2), so `side` is decided on fix#1 and `last` exists.
    assert!(idx(&s, "side", 0).is_some() && idx(&s, "last", 0).is_some());
    run(&mut s, "recheck", out("r", Some("fail")));
    run(&mut s, "side", out("s", None));
    let last = idx(&s, "last", 0).unwrap_or(99);
    let preds: Vec<String> = s
        .activation(last)
        .map(|a| {
            a.predecessors
                .iter()
                .map(|&p| {
                    let x = s.activation(p).unwrap_or_else(|| panic!("no pred"));
                    format!("{}#{}", spec.nodes[x.node].id, x.round)
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(preds, vec!["check#0", "recheck#1", "side#0"]);
    assert_eq!(
        s.render_tool_inputs(last).map(|i| i["code"].clone()),
        Ok(serde_json::json!("f1"))
    );
    run(&mut s, "last", out("done", Some("pass")));
    assert!(s.is_finished());
}

/// A coder and a check in a loop of `max_rounds`, the check's structured verdict `ok: false`
/// continuing it; later rounds' prompts read the round, the previous round and the check.
fn coder_check(max_rounds: u32) -> Arc<WorkflowSpec> {
    let yaml = format!(
        r#"name: t
deployments:
  d: {{model: Qwen3-8B, max_context: 4096, max_output_tokens: 512}}
nodes:
  - id: coder
    deployment: d
    prompt: "Write {{{{input.q}}}}. Last check: [{{{{check?}}}}]"
    next_rounds:
      prompt: "Round {{{{loop.round}}}}: fix {{{{coder}}}} given {{{{check}}}} ({{{{check.verdict}}}}); round before: {{{{coder.prev}}}}"
  - id: check
    deployment: d
    after: coder
    prompt: "Check {{{{coder}}}}"
    output:
      schema: {{type: object, properties: {{ok: {{type: boolean}}}}, required: [ok]}}
      verdict: ok
loops:
  - id: l
    body: [coder, check]
    continue_when: {{node: check, verdict: false}}
    max_rounds: {max_rounds}
"#
    );
    Arc::new(parse_workflow("t.yaml", &yaml, Path::new(".")).unwrap_or_else(|e| panic!("{e}")))
}

/// A loop's later rounds render their own prompt, with the round number, the previous round's
/// output and optional references; an agent's structured verdict decides the loop.
#[test]
fn later_rounds_see_their_round_and_the_previous_rounds_output() {
    let spec = coder_check(3);
    let mut input = Record::new();
    input.insert("q".into(), serde_json::json!("f"));
    let mut s = Session::new(SessionId(1), spec, input).unwrap_or_else(|e| panic!("{e}"));
    let out = |t: &str, v: Option<&str>| NodeOutput { text: t.into(), verdict: v.map(String::from), ..NodeOutput::default() };
    let run = |s: &mut Session, o: NodeOutput| -> String {
        let a = s.ready()[0].index;
        let prompt = s.render_prompt(a).map(|p| p.concat()).unwrap_or_else(|e| panic!("{e}"));
        s.mark_running(a).unwrap_or_else(|e| panic!("{e}"));
        s.complete(a, o).unwrap_or_else(|e| panic!("{e}"));
        prompt
    };
    assert_eq!(run(&mut s, out("v1", None)), "Write f. Last check: []");
    assert!(run(&mut s, out("{\"ok\":false}", Some("false"))).starts_with("Check v1"));
    assert_eq!(run(&mut s, out("v2", None)), "Round 2: fix v1 given {\"ok\":false} (false); round before: v1");
    run(&mut s, out("{\"ok\":false}", Some("false")));
    assert_eq!(run(&mut s, out("v3", None)), "Round 3: fix v2 given {\"ok\":false} (false); round before: v2");
    run(&mut s, out("{\"ok\":true}", Some("true")));
    assert!(s.is_finished(), "three rounds at most");
}

fn react(max_turns: u32) -> Arc<WorkflowSpec> {
    let text = format!(
        "name: r\ndeployments:\n  d: {{model: Qwen3-0.6B, max_context: 4096, max_output_tokens: 256}}\nnodes:\n  - id: fixer\n    deployment: d\n    role: software engineer\n    prompt: \"Fix {{{{input.repo}}}}.\"\n    tools:\n      - name: run_tests\n        tool: python_tests\n        inputs: {{code: \"{{{{fixer}}}}\", tests: \"{{{{input.tests}}}}\"}}\n      - name: vote\n        tool: majority_vote\n        inputs: {{candidates: [\"{{{{fixer}}}}\"]}}\n    max_turns: {max_turns}\n  - id: check\n    tool: python_tests\n    after: fixer\n    inputs: {{code: \"{{{{fixer}}}}\", tests: \"{{{{input.tests}}}}\"}}\n"
    );
    Arc::new(parse_workflow("r.yaml", &text, Path::new(".")).unwrap_or_else(|e| panic!("{e}")))
}

fn react_input() -> Record {
    let mut r = Record::new();
    r.insert("repo".into(), serde_json::json!("acme/widgets"));
    r.insert("tests".into(), serde_json::json!(["assert f() == 1"]));
    r
}

fn prompt_of(s: &Session, node: &str, round: u32) -> String {
    let i = idx(s, node, round).unwrap_or_else(|| panic!("no {node}#{round}"));
    s.render_prompt(i).unwrap_or_else(|e| panic!("{e}")).concat()
}

#[test]
fn an_agent_with_tools_takes_turns_with_tool_calls_between_them() {
    let spec = react(3);
    let mut s = Session::new(SessionId(4), Arc::clone(&spec), react_input()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names(&s, &s.ready()), vec!["fixer#0"]);
    let p0 = prompt_of(&s, "fixer", 0);
    assert!(p0.starts_with("You are software engineer.\n\nFix acme/widgets."), "{p0}");

    // Turn 0 calls `run_tests`: its tool step runs; the next turn waits for it.
    let a0 = "```python\ndef f(): return 0\n```\nAction: run_tests";
    assert_eq!(run(&mut s, "fixer", out(a0, Some("tool:run_tests"))), vec!["fixer.run_tests#0"]);
    assert_eq!(idx(&s, "fixer.vote", 0), None, "only the called tool runs");
    assert_eq!(idx(&s, "check", 0), None, "`check` waits for the last turn");
    let t0 = idx(&s, "fixer.run_tests", 0).unwrap();
    let inputs = s.render_tool_inputs(t0).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(inputs["code"], serde_json::json!(a0), "the tool reads the turn's answer");
    s.mark_running(t0).unwrap();
    assert_eq!(names(&s, &s.near_ready()), vec!["fixer#1"], "the next turn is near-ready while the tool runs");
    let newly = s.complete(t0, out("0/1 tests passed; first failure: assert f() == 1", Some("fail"))).unwrap();
    assert_eq!(names(&s, &newly), vec!["fixer#1"]);
    let t1 = idx(&s, "fixer", 1).unwrap();
    assert_eq!(s.activation(t1).unwrap().predecessors, vec![t0]);

    // The prompt grows: the previous prompt + its answer + the observation.
    let p1 = prompt_of(&s, "fixer", 1);
    assert_eq!(p1, format!("{p0}{a0}\nObservation from `run_tests`:\n0/1 tests passed; first failure: assert f() == 1\n"));

    // Turn 1 calls the other tool; turn 2 is the last: its tool call is taken as the final answer.
    let a1 = "Let me count.\nAction: vote";
    assert_eq!(run(&mut s, "fixer", out(a1, Some("tool:vote"))), vec!["fixer.vote#1"]);
    assert_eq!(run(&mut s, "fixer.vote", out("majority: 1", Some("majority"))), vec!["fixer#2"]);
    let p2 = prompt_of(&s, "fixer", 2);
    assert!(p2.starts_with(&format!("{p1}{a1}")) && p2.ends_with("Observation from `vote`:\nmajority: 1\n"), "{p2}");
    let a2 = "```python\ndef f(): return 1\n```\nAction: run_tests";
    assert_eq!(run(&mut s, "fixer", out(a2, Some("tool:run_tests"))), vec!["check#0"]);
    let last = idx(&s, "fixer", 2).unwrap();
    assert_eq!(s.activation(last).unwrap().output.as_ref().unwrap().verdict.as_deref(), Some("final"));
    assert_eq!(idx(&s, "fixer.run_tests", 2), None, "no tool call after the last turn");
    assert_eq!(s.loop_rounds(0), Some(3), "bounded by max_turns");
    let check = idx(&s, "check", 0).unwrap();
    assert_eq!(s.render_tool_inputs(check).unwrap()["code"], serde_json::json!(a2), "the check reads the final answer");
    assert!(!s.is_finished());
    run(&mut s, "check", out("1/1 tests passed", Some("pass")));
    assert!(s.is_finished());
}

#[test]
fn an_answer_without_a_tool_call_ends_the_turns() {
    let spec = react(8);
    let mut s = Session::new(SessionId(5), Arc::clone(&spec), react_input()).unwrap_or_else(|e| panic!("{e}"));
    run(&mut s, "fixer", out("code\nAction: run_tests", Some("tool:run_tests")));
    run(&mut s, "fixer.run_tests", out("1/1 tests passed", Some("pass")));
    // No verdict (or one naming no declared tool) is a final answer.
    assert_eq!(run(&mut s, "fixer", out("Done: code", Some("tool:deploy"))), vec!["check#0"]);
    assert_eq!(s.latest_output(0).map(|o| (o.text.as_str(), o.verdict.as_deref())), Some(("Done: code", Some("final"))));
    assert_eq!(s.loop_rounds(0), Some(2));
    run(&mut s, "check", out("1/1 tests passed", Some("pass")));
    assert!(s.is_finished());
    // Each of the 2 turns and the tool step resolved; the skipped tool steps are recorded.
    assert_eq!(s.activations().len(), 4);
    let skipped: Vec<String> = s.skipped().iter().map(|(n, r)| format!("{}#{r}", spec.nodes[*n].id)).collect();
    assert_eq!(skipped, ["fixer.run_tests#1", "fixer.vote#0", "fixer.vote#1"]);
}

/// A prompt that repeats a large input is refused once its text passes the longest any model
/// context takes, not built whole (a served workflow of 4 MiB could ask for gigabytes).
#[test]
fn a_prompt_past_any_context_is_refused_before_it_is_built() {
    let prompt = "{{input.x}}".repeat(40);
    let yaml = format!(
        "name: big\ndeployments:\n  d: {{model: Qwen3-0.6B, max_context: 4096, max_output_tokens: 256}}\nnodes:\n  - id: a\n    deployment: d\n    prompt: \"{prompt}\"\n"
    );
    let spec = Arc::new(parse_workflow("big.yaml", &yaml, Path::new(".")).unwrap_or_else(|e| panic!("{e}")));
    let mut input = Record::new();
    input.insert("x".into(), serde_json::json!("y".repeat(1 << 20)));
    let s = Session::new(SessionId(1), spec, input).unwrap_or_else(|e| panic!("{e}"));
    let a = s.ready()[0].index;
    match s.render_prompt(a) {
        Err(e @ SessionError::RenderedTooLong { .. }) => {
            assert!(e.to_string().contains("`a`") && e.to_string().contains("33554432 bytes"), "{e}")
        }
        Err(e) => panic!("another error: {e}"),
        Ok(segments) => panic!("rendered {} bytes", segments.iter().map(String::len).sum::<usize>()),
    }
}

/// A loop at the largest round count a workflow may declare (10,000 rounds of two nodes, 20,000
/// activations) runs to its end: each round's activations are created in order, only after the
/// round before finished, the ready set never holds more than the one unit due, and the session
/// finishes exactly when the last round's check completes. (Each completion visits only the
/// session's open frontier; when it rescanned the whole history, this took minutes.)
#[test]
fn a_ten_thousand_round_loop_unfolds_round_by_round_to_its_end() {
    let spec = coder_check(10_000);
    let mut input = Record::new();
    input.insert("q".into(), serde_json::json!("f"));
    let mut s = Session::new(SessionId(9), spec, input).unwrap_or_else(|e| panic!("{e}"));
    let verdict = out("{\"ok\":false}", Some("false"));
    for round in 0..10_000u32 {
        for (k, node) in ["coder", "check"].into_iter().enumerate() {
            let ready = s.ready();
            assert_eq!(ready.len(), 1, "round {round}: {:?}", names(&s, &ready));
            let a = ready[0].index;
            assert_eq!(a, round * 2 + k as u32, "creation order");
            assert_eq!(names(&s, &ready), [format!("{node}#{round}")]);
            assert_eq!(s.loop_rounds(0), Some(round + 1), "a round opens only after the one before");
            assert!(!s.is_finished());
            s.mark_running(a).unwrap_or_else(|e| panic!("{e}"));
            let o = if node == "check" { verdict.clone() } else { out("code", None) };
            let newly = s.complete(a, o).unwrap_or_else(|e| panic!("{e}"));
            let expect: Vec<String> = match (node, round) {
                ("coder", _) => vec![format!("check#{round}")],
                (_, 9_999) => vec![],
                _ => vec![format!("coder#{}", round + 1)],
            };
            assert_eq!(names(&s, &newly), expect);
        }
        if round % 1000 == 0 {
            s.check_bookkeeping().unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
    }
    s.check_bookkeeping().unwrap_or_else(|e| panic!("{e}"));
    assert!(s.is_finished());
    assert_eq!(s.activations().len(), 20_000);
    assert!(s.ready().is_empty() && s.near_ready().is_empty());
}
