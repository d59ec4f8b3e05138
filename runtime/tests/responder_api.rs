//! The responder API as the simulator uses it: determinism, output lengths, errors, and the
//! behaviour of each workload's responders on real dataset records.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use switchyard_runtime::responder::{
    extract_code, extract_gsm8k_answer, is_judge, respond, ResponderError, ResponderRequest, RESPONDERS,
};
use switchyard_runtime::schema::OutputSchema;
use switchyard_runtime::tokens;
use switchyard_runtime::values::{LengthDist, NodeOutput, Record};

fn record(v: Value) -> Record {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("record: {e}"))
}

/// GSM8K test record 3 (Cobbe et al., 2021), verbatim.
fn gsm8k_record() -> Record {
    record(json!({
        "question": "Josh decides to try flipping a house.  He buys a house for $80,000 and then puts in $50,000 in repairs.  This increased the value of the house by 150%.  How much profit did he make?",
        "answer": "The cost of the house and repairs came out to 80,000+50,000=$<<80000+50000=130000>>130,000\nHe increased the value of the house by 80,000*1.5=<<80000*1.5=120000>>120,000\nSo the new value of the house is 120,000+80,000=$<<120000+80000=200000>>200,000\nSo he made a profit of 200,000-130,000=$<<200000-130000=70000>>70,000\n#### 70000"
    }))
}

/// Sanitized MBPP task 57 (Austin et al., 2021), verbatim.
fn mbpp_record() -> Record {
    record(json!({
        "task_id": 57,
        "prompt": "Write a python function to find the largest number that can be formed with the given list of digits.",
        "code": "def find_Max_Num(arr) : \n    n = len(arr)\n    arr.sort(reverse = True) \n    num = arr[0] \n    for i in range(1,n) : \n        num = num * 10 + arr[i] \n    return num ",
        "test_imports": [],
        "test_list": ["assert find_Max_Num([1,2,3]) == 321", "assert find_Max_Num([4,5,6,1]) == 6541", "assert find_Max_Num([1,2,3,9]) == 9321"]
    }))
}

/// The opening turns of QMSum test meeting 1 (Zhong et al., 2021), shortened.
const TRANSCRIPT: &str = "Lynne Neagle AM: Good afternoon, everyone. Welcome to the Children, Young People and Education Committee. Item 2 this afternoon is our eleventh evidence session on the Children (Abolition of Defence of Reasonable Punishment) (Wales) Bill. I'm very pleased to welcome Barry Hughes, who is Chief Crown Prosecutor for Wales.\nBarry Hughes: Perfectly happy.\nSian Gwenllian AM: I would like to start just by looking in general at how the law currently stands, and specifically in terms of reasonable punishment, how does that protect children.\nBarry Hughes: We have a range of offences created by the criminal law, going back to the Offences Against the Person Act 1861. In respect of children in particular, section 58 of the Children Act 2004 makes it a defence for a person accused of assaulting a child to argue that it was reasonable punishment. That defence is not available for an offence involving an adult. In that regard, it could be argued that children have fewer rights than adults.\nSian Gwenllian AM: We have heard evidence that this proposed law would provide a much clearer legal framework for parents and professionals. Does the CPS have a view on that?\nBarry Hughes: I think it will make things clearer. When it comes to prosecuting, things are rarely black and white; there are multiple shades of grey in between. Removing that defence does make life clearer.";

fn qmsum_record() -> Record {
    record(json!({
        "query": "What did Barry Hughes think about the law on reasonable punishment and prosecutions?",
        "answer": "Barry Hughes said the defence of reasonable punishment means children have fewer rights than adults, and removing it would make the law clearer.",
        "transcript": TRANSCRIPT
    }))
}

fn qmsum_prompt() -> String {
    format!("Summarize the meeting part below for the query.\nQuery: What did Barry Hughes think about the law on reasonable punishment and prosecutions?\nTranscript:\n{TRANSCRIPT}\n---\nWrite the summary.")
}

struct Case {
    responder: &'static str,
    model: &'static str,
    input: Record,
    prompt: String,
    upstream: Vec<(String, NodeOutput)>,
}

fn vote(answer: &str, votes: Value, verdict: &str) -> NodeOutput {
    NodeOutput {
        text: format!("Majority answer: {answer}"),
        verdict: Some(verdict.into()),
        value: json!({ "answer": answer, "votes": votes }),
        output_tokens: 0,
    }
}

fn failing_test() -> NodeOutput {
    NodeOutput {
        text: "1/3 tests passed; first failure: assert find_Max_Num([4,5,6,1]) == 6541 -> AssertionError".into(),
        verdict: Some("fail".into()),
        value: Value::Null,
        output_tokens: 0,
    }
}

fn wrong_code() -> NodeOutput {
    let text = "```python\ndef find_Max_Num(arr) : \n    n = len(arr)\n    arr.sort(reverse = True) \n    num = arr[0] \n    for i in range(1,n) : \n        num = num * 10 - arr[i] \n    return num \n```\nDone.";
    NodeOutput { text: text.into(), verdict: None, value: Value::Null, output_tokens: tokens::count(text) as u32 }
}

fn cases() -> Vec<Case> {
    let summary = NodeOutput {
        text: "Barry Hughes said children have fewer rights than adults under the reasonable punishment defence. He thought removing the defence makes things clearer.".into(),
        ..NodeOutput::default()
    };
    vec![
        Case { responder: "gsm8k.solve", model: "Qwen3-4B", input: gsm8k_record(), prompt: "Solve.".into(), upstream: vec![] },
        Case {
            responder: "gsm8k.refine",
            model: "Qwen3-8B",
            input: gsm8k_record(),
            prompt: "Refine.".into(),
            upstream: vec![("vote".into(), vote("200000", json!({"200000": 2, "70000": 2, "69999": 1}), "tie"))],
        },
        Case {
            responder: "gsm8k.judge",
            model: "Qwen3-8B",
            input: gsm8k_record(),
            prompt: "Is this solution right?".into(),
            upstream: vec![("solve".into(), NodeOutput { text: "80,000 + 50,000 = 130,000 ...\n#### 70000".into(), ..NodeOutput::default() })],
        },
        Case { responder: "mbpp.generate", model: "Qwen3-1.7B", input: mbpp_record(), prompt: "Write it.".into(), upstream: vec![] },
        Case {
            responder: "mbpp.diagnose",
            model: "Qwen3-4B",
            input: mbpp_record(),
            prompt: "Diagnose.".into(),
            upstream: vec![("generate".into(), wrong_code()), ("test".into(), failing_test())],
        },
        Case {
            responder: "mbpp.review",
            model: "Qwen3-8B",
            input: mbpp_record(),
            prompt: "Review.".into(),
            upstream: vec![("generate".into(), wrong_code()), ("test".into(), failing_test())],
        },
        Case {
            responder: "mbpp.repair",
            model: "Qwen3-14B",
            input: mbpp_record(),
            prompt: "Repair.".into(),
            upstream: vec![("generate".into(), wrong_code()), ("test".into(), failing_test())],
        },
        Case { responder: "qmsum.summarize", model: "Qwen3-4B", input: qmsum_record(), prompt: qmsum_prompt(), upstream: vec![] },
        Case {
            responder: "qmsum.aggregate",
            model: "Qwen3-8B",
            input: qmsum_record(),
            prompt: "Merge the summaries.".into(),
            upstream: vec![("lane_a".into(), summary.clone()), ("lane_b".into(), summary.clone())],
        },
        Case {
            responder: "qmsum.judge",
            model: "Qwen3-8B",
            input: qmsum_record(),
            prompt: "Does this summary answer the query?".into(),
            upstream: vec![("answer".into(), summary)],
        },
        Case { responder: "generic", model: "Qwen3-14B", input: Record::new(), prompt: "Plan the work.".into(), upstream: vec![] },
    ]
}

fn run(case: &Case, length: LengthDist, cap: u32, seed: u64) -> Result<NodeOutput, ResponderError> {
    let upstream: Vec<(&str, &NodeOutput)> = case.upstream.iter().map(|(n, o)| (n.as_str(), o)).collect();
    // A judge answers with a structured verdict (the loader requires one).
    let schema = is_judge(case.responder).then(|| {
        let json = json!({"type": "object", "properties": {"correct": {"type": "boolean"}, "reason": {"type": "string"}}, "required": ["correct", "reason"]});
        OutputSchema::from_json(&json).unwrap_or_else(|e| panic!("schema: {e}"))
    });
    respond(&ResponderRequest {
        responder: case.responder,
        node: "node",
        model: case.model,
        input: &case.input,
        prompt: &case.prompt,
        upstream: &upstream,
        length,
        max_output_tokens: cap,
        seed,
        role: None,
        schema: schema.as_ref(),
        verdict_field: schema.as_ref().map(|_| "correct"),
    })
}

/// The target `respond` draws first from the request's RNG.
fn target(length: LengthDist, cap: u32, seed: u64) -> usize {
    length.sample(&mut ChaCha8Rng::seed_from_u64(seed), cap) as usize
}

fn ok(r: Result<NodeOutput, ResponderError>) -> NodeOutput {
    r.unwrap_or_else(|e| panic!("respond: {e}"))
}

#[test]
fn every_responder_is_covered() {
    let names: Vec<&str> = cases().iter().map(|c| c.responder).collect();
    assert_eq!(names, RESPONDERS);
}

/// `input_needs` is what the loader checks before a run: each listed field is really needed
/// (its absence is a typed error naming it), and with them all present the responder answers.
#[test]
fn input_needs_are_exactly_checked() {
    for case in cases() {
        let length = LengthDist { mean: 50.0, cv: 0.0 };
        ok(run(&case, length, 128, 1));
        for need in switchyard_runtime::responder::input_needs(case.responder) {
            let mut input = case.input.clone();
            input.remove(*need);
            let c = Case { input, prompt: case.prompt.clone(), upstream: case.upstream.clone(), ..case };
            match run(&c, length, 128, 1) {
                Err(ResponderError::MissingField { field, .. }) => assert_eq!(field, *need),
                other => panic!("{} without `{need}`: {other:?}", c.responder),
            }
        }
    }
}

#[test]
fn responses_are_pure_functions_of_the_request() {
    let length = LengthDist { mean: 200.0, cv: 0.5 };
    for case in cases() {
        for seed in 0..15 {
            let a = ok(run(&case, length, 512, seed));
            let b = ok(run(&case, length, 512, seed));
            assert_eq!(a, b, "{} seed {seed}", case.responder);
        }
        let texts: std::collections::BTreeSet<String> =
            (0..15).map(|s| ok(run(&case, length, 512, s)).text).collect();
        assert!(texts.len() > 1, "{}: the seed changes nothing", case.responder);
    }
}

#[test]
fn lengths_follow_the_target_and_never_exceed_the_cap() {
    let length = LengthDist { mean: 250.0, cv: 0.6 };
    for case in cases() {
        for (cap, seeds) in [(512u32, 0..25u64), (300, 100..110), (40, 200..205), (1, 300..302)] {
            for seed in seeds {
                let out = ok(run(&case, length, cap, seed));
                let t = target(length, cap, seed);
                let n = tokens::count(&out.text);
                assert_eq!(out.output_tokens as usize, n, "{}", case.responder);
                if is_judge(case.responder) {
                    // A structured answer's length follows the target only roughly; never the cap.
                    assert!(n <= cap as usize, "{} seed {seed}: {n} tokens, cap {cap}", case.responder);
                    continue;
                }
                assert!(n <= cap as usize && n <= t, "{} seed {seed}: {n} tokens, target {t}, cap {cap}", case.responder);
                assert!(n + 4 >= t, "{} seed {seed}: {n} tokens, far below target {t}\n{}", case.responder, out.text);
            }
        }
    }
}

#[test]
fn bad_requests_get_typed_errors_naming_the_problem() {
    let c = cases().remove(0);
    let length = LengthDist { mean: 100.0, cv: 0.0 };
    let mut missing = c.input.clone();
    missing.remove("question");
    let m = Case { input: missing, ..cases().remove(0) };
    match run(&m, length, 100, 1) {
        Err(ResponderError::MissingField { field, .. }) => assert_eq!(field, "question"),
        other => panic!("{other:?}"),
    }
    let mut typed = c.input.clone();
    typed.insert("answer".into(), json!(18));
    let t = Case { input: typed, ..cases().remove(0) };
    let err = run(&t, length, 100, 1).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("`answer`") && err.contains("must be a string"), "{err}");
    let u = Case { model: "gpt-4o", ..cases().remove(0) };
    assert!(matches!(run(&u, length, 100, 1), Err(ResponderError::UnknownModel { .. })));
    assert!(matches!(run(&c, length, 0, 1), Err(ResponderError::ZeroOutputCap { .. })));
    let x = Case { responder: "gsm8k.sovle", ..cases().remove(0) };
    assert!(matches!(run(&x, length, 100, 1), Err(ResponderError::UnknownResponder { .. })));
    let q = Case { input: record(json!({"transcript": "x"})), ..cases().remove(7) };
    match run(&q, length, 100, 1) {
        Err(ResponderError::MissingField { field, .. }) => assert_eq!(field, "query"),
        other => panic!("{other:?}"),
    }
    let mut bad_tests = mbpp_record();
    bad_tests.insert("test_list".into(), json!("assert f()"));
    let b = Case { input: bad_tests, ..cases().remove(3) };
    assert!(matches!(run(&b, length, 100, 1), Err(ResponderError::BadField { .. })));
}

#[test]
fn gsm8k_solutions_end_in_their_answer_and_use_the_dataset_steps() {
    let c = &cases()[0];
    let length = LengthDist { mean: 300.0, cv: 0.0 };
    let mut right = 0;
    for seed in 0..40 {
        let out = ok(run(c, length, 512, seed));
        let last = out.text.lines().last().unwrap_or("");
        assert!(last.starts_with("#### "), "{}", out.text);
        assert!(!out.text.contains("<<"), "calculator annotations must be stripped");
        assert_eq!(extract_gsm8k_answer(&out.text), out.value["answer"].as_str().map(String::from));
        if out.value["intended_correct"] == json!(true) {
            right += 1;
            assert_eq!(last, "#### 70000");
            assert!(out.text.contains("So he made a profit of 200,000-130,000=$70,000"));
        } else {
            assert_ne!(last, "#### 70000");
        }
    }
    assert!(right > 0 && right < 40);
}

#[test]
fn a_short_target_cuts_off_the_final_answer() {
    let c = &cases()[0];
    let out = ok(run(c, LengthDist { mean: 20.0, cv: 0.0 }, 512, 3));
    assert_eq!(out.output_tokens, 20);
    assert!(!out.text.contains("####"));
}

#[test]
fn refine_keeps_a_majority_and_reports_its_rule() {
    let mut c = cases().remove(1);
    c.upstream = vec![("vote".into(), vote("69999", json!({"69999": 3, "70000": 2}), "majority"))];
    for seed in 0..20 {
        let out = ok(run(&c, LengthDist { mean: 300.0, cv: 0.0 }, 512, seed));
        assert_eq!(out.value["rule"], json!("kept_majority"));
        assert_eq!(extract_gsm8k_answer(&out.text).as_deref(), Some("69999"));
        assert!(out.text.contains("69999 (3 votes)"), "{}", out.text);
    }
}

#[test]
fn refine_without_a_majority_rederives_or_keeps_the_plurality() {
    let c = &cases()[1];
    let mut rules = std::collections::BTreeMap::new();
    for seed in 0..300 {
        let out = ok(run(c, LengthDist { mean: 300.0, cv: 0.0 }, 512, seed));
        let rule = out.value["rule"].as_str().unwrap_or("").to_string();
        let answer = extract_gsm8k_answer(&out.text);
        match rule.as_str() {
            "rederived" => assert_eq!(answer.as_deref(), Some("70000")),
            "kept_plurality" => assert_eq!(answer.as_deref(), Some("200000"), "the vote's answer is kept"),
            other => panic!("unexpected rule {other}"),
        }
        *rules.entry(rule).or_insert(0u32) += 1;
    }
    // Qwen3-8B re-derives with probability 0.8984.
    let re = f64::from(rules.get("rederived").copied().unwrap_or(0)) / 300.0;
    assert!((re - 0.8984).abs() < 0.06, "{re}");
}

#[test]
fn refine_falls_back_on_the_strongest_solver() {
    let mut c = cases().remove(1);
    let solver = |a: &str, model: &str| NodeOutput {
        text: format!("work\n#### {a}"),
        value: json!({"answer": a, "model": model}),
        ..NodeOutput::default()
    };
    c.upstream.push(("solve_0_6b".into(), solver("200000", "Qwen3-0.6B")));
    c.upstream.push(("solve_14b".into(), solver("69999", "Qwen3-14B")));
    c.upstream.push(("solve_4b".into(), solver("70000", "Qwen3-4B")));
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..200 {
        let out = ok(run(&c, LengthDist { mean: 300.0, cv: 0.0 }, 512, seed));
        let answer = extract_gsm8k_answer(&out.text);
        match out.value["rule"].as_str() {
            Some("rederived") => assert_eq!(answer.as_deref(), Some("70000")),
            Some("strongest_solver") => assert_eq!(answer.as_deref(), Some("69999")),
            other => panic!("unexpected rule {other:?}"),
        }
        seen.insert(out.value["rule"].to_string());
    }
    assert_eq!(seen.len(), 2);
}

#[test]
fn solver_outputs_name_their_model() {
    let out = ok(run(&cases()[0], LengthDist { mean: 100.0, cv: 0.0 }, 512, 1));
    assert_eq!(out.value["model"], json!("Qwen3-4B"));
}

#[test]
fn refine_counts_solver_outputs_when_no_vote_is_upstream() {
    let mut c = cases().remove(1);
    let solver = |a: &str| NodeOutput { text: format!("work\n#### {a}"), ..NodeOutput::default() };
    c.upstream = vec![("s1".into(), solver("5")), ("s2".into(), solver("5")), ("s3".into(), solver("7"))];
    let out = ok(run(&c, LengthDist { mean: 300.0, cv: 0.0 }, 512, 1));
    assert_eq!(out.value["rule"], json!("kept_majority"));
    assert_eq!(extract_gsm8k_answer(&out.text).as_deref(), Some("5"));
}

#[test]
fn generated_code_is_the_reference_or_a_mutant_in_a_python_fence() {
    let c = &cases()[3];
    let reference = c.input["code"].as_str().unwrap_or_default();
    let (mut right, mut wrong) = (0, 0);
    for seed in 0..60 {
        let out = ok(run(c, LengthDist { mean: 150.0, cv: 0.3 }, 512, seed));
        assert!(out.text.starts_with("```python\n"), "{}", out.text);
        let code = extract_code(&out.text);
        if out.value["intended_correct"] == json!(true) {
            right += 1;
            assert_eq!(code, reference);
        } else {
            wrong += 1;
            assert_ne!(code, reference);
            assert!(out.value["mutation"].is_string());
        }
    }
    assert!(right > 10 && wrong > 10, "{right} right, {wrong} wrong");
}

#[test]
fn diagnosis_and_review_cite_the_failure_and_a_line() {
    let cs = cases();
    for c in [&cs[4], &cs[5]] {
        let mut localized = 0;
        for seed in 0..40 {
            let out = ok(run(c, LengthDist { mean: 200.0, cv: 0.0 }, 512, seed));
            assert!(out.text.contains("first failure: assert find_Max_Num([4,5,6,1]) == 6541"), "{}", out.text);
            let cited = out.value["cited_line"].as_str().unwrap_or_default().to_string();
            assert!(out.text.contains(&format!("`{cited}`")), "{}", out.text);
            if cited == "num = num * 10 - arr[i]" {
                localized += 1;
            }
        }
        assert!(localized > 10 && localized < 40, "{}: {localized}", c.responder);
    }
}

#[test]
fn repair_fixes_with_its_repair_probability() {
    let c = &cases()[6];
    let reference = c.input["code"].as_str().unwrap_or_default();
    let n = 400;
    let fixed = (0..n).filter(|&s| extract_code(&ok(run(c, LengthDist { mean: 200.0, cv: 0.2 }, 512, s)).text) == reference).count();
    let rate = fixed as f64 / n as f64;
    // Qwen3-14B: 0.45 × 0.734 = 0.33.
    assert!((rate - 0.45 * 0.734).abs() < 0.07, "{rate}");
}

#[test]
fn summaries_extract_query_relevant_transcript_sentences() {
    let c = &cases()[7];
    let out = ok(run(c, LengthDist { mean: 60.0, cv: 0.0 }, 512, 1));
    assert!(out.text.contains("reasonable punishment"), "{}", out.text);
    assert!(!out.text.contains("Write the summary"), "{}", out.text);
    assert!(!out.text.contains("Perfectly happy"), "{}", out.text);
    // Every sentence comes from the transcript.
    let long = ok(run(c, LengthDist { mean: 120.0, cv: 0.0 }, 512, 1));
    for s in long.text.split(". ").filter(|s| s.len() > 20).take(4) {
        // A sentence may carry its speaker's name, as the transcript line does.
        let body = s.split_once(": ").map_or(s, |(_, b)| b);
        assert!(TRANSCRIPT.contains(body.trim_end_matches('.')), "not extracted: {s}");
    }
    let agg = &cases()[8];
    let out = ok(run(agg, LengthDist { mean: 25.0, cv: 0.0 }, 512, 1));
    assert!(out.text.starts_with("Barry Hughes said children have fewer rights"), "{}", out.text);
}

