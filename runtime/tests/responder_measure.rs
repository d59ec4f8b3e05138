//! Whole-dataset measurements of the emulated responders (ignored by default: they read the
//! datasets under `workflows/datasets/`). Run with
//! `cargo test -p switchyard-runtime --test responder_measure -- --ignored --nocapture`.
//!
//! They print the numbers quoted in the responder module docs: how often a drawn length cuts
//! off a GSM8K final answer or an MBPP code block at the workflows' length distributions, and
//! the ROUGE-L F1 of the QMSum pipeline's final answers.

use serde_json::Value;
use switchyard_runtime::responder::{gsm8k_exact, respond, rouge_l_f1, ResponderRequest};
use switchyard_runtime::tokens;
use switchyard_runtime::values::{LengthDist, NodeOutput, Record};

fn dataset(rel: &str) -> String {
    let path = format!("{}/../workflows/datasets/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn call(responder: &str, model: &str, input: &Record, prompt: &str, upstream: &[(&str, &NodeOutput)], length: LengthDist, seed: u64) -> NodeOutput {
    respond(&ResponderRequest { responder, node: "n", model, input, prompt, upstream, length, max_output_tokens: 512, seed, role: None, schema: None, verdict_field: None })
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
#[ignore]
fn gsm8k_answers_cut_by_the_drawn_length() {
    let text = dataset("gsm8k/test.jsonl");
    let (mut n, mut cut, mut scored, mut intended) = (0usize, 0usize, 0.0, 0.0);
    for (i, line) in text.lines().enumerate() {
        let input: Record = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}"));
        // The solvers' distribution in workflows/gsm8k.yaml.
        let out = call("gsm8k.solve", "Qwen3-8B", &input, "Solve.", &[], LengthDist { mean: 200.0, cv: 0.4 }, i as u64);
        n += 1;
        cut += usize::from(!out.text.contains("####"));
        scored += gsm8k_exact(&out, input["answer"].as_str().unwrap_or_default());
        intended += f64::from(u8::from(out.value["intended_correct"] == Value::Bool(true)));
    }
    eprintln!("GSM8K Qwen3-8B, {n} problems: final line cut {cut}, scored {:.4}, intended {:.4}", scored / n as f64, intended / n as f64);
}

#[test]
#[ignore]
fn mbpp_code_cut_by_the_drawn_length() {
    let data: Vec<Value> = serde_json::from_str(&dataset("mbpp/sanitized-mbpp.json")).unwrap_or_else(|e| panic!("{e}"));
    let mut cut = 0;
    for (i, v) in data.iter().enumerate() {
        let input: Record = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}"));
        let out = call("mbpp.generate", "Qwen3-8B", &input, "Write it.", &[], LengthDist { mean: 150.0, cv: 0.5 }, i as u64);
        cut += usize::from(!out.text.contains("\n```"));
    }
    eprintln!("MBPP, {} tasks: code block cut {cut}", data.len());
}

/// Split `text` at line boundaries into `n` parts of nearly equal size in characters (what
/// the workflow's `part I of N` template helper does).
fn parts(text: &str, n: usize) -> Vec<String> {
    let total = text.len().max(1);
    let mut out = vec![String::new(); n];
    let mut seen = 0;
    for line in text.lines() {
        out[((seen * n) / total).min(n - 1)].push_str(&format!("{line}\n"));
        seen += line.len() + 1;
    }
    out
}

/// The nine-call QMSum pipeline of workflows/qmsum.yaml (two three-stage rolling lanes over
/// the halves of the meeting, then merge → refine → answer), scored with ROUGE-L F1.
#[test]
#[ignore]
fn qmsum_pipeline_rouge_l() {
    let text = dataset("qmsum/test.jsonl");
    let mut scores = Vec::new();
    let started = std::time::Instant::now();
    for (m, line) in text.lines().enumerate() {
        let meeting: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}"));
        let transcript: Vec<String> = meeting["meeting_transcripts"]
            .as_array()
            .map(|a| a.iter().map(|t| format!("{}: {}", t["speaker"].as_str().unwrap_or(""), t["content"].as_str().unwrap_or(""))).collect())
            .unwrap_or_default();
        let q = &meeting["general_query_list"][0];
        let query = q["query"].as_str().unwrap_or_default();
        let mut input = Record::new();
        input.insert("query".into(), q["query"].clone());
        let ps = parts(&transcript.join("\n"), 6);
        let stage = LengthDist { mean: 250.0, cv: 0.3 };
        let mut lanes = Vec::new();
        for lane in 0..2 {
            let mut prev: Option<NodeOutput> = None;
            for st in 0..3 {
                let part = &ps[lane * 3 + st];
                let prompt = match &prev {
                    None => format!("Summarize this part.\nQuery: {query}\nTranscript:\n{part}---\nWrite the summary."),
                    Some(p) => format!("Update the summary.\nQuery: {query}\nPrevious summary:\n{}\nTranscript:\n{part}---\nUpdated summary:", p.text),
                };
                prev = Some(call("qmsum.summarize", "Qwen3-4B", &input, &prompt, &[], stage, (m * 100 + lane * 10 + st) as u64));
            }
            lanes.extend(prev);
        }
        let up: Vec<(&str, &NodeOutput)> = lanes.iter().map(|o| ("lane", o)).collect();
        let merge = call("qmsum.aggregate", "Qwen3-8B", &input, "Merge.", &up, LengthDist { mean: 300.0, cv: 0.3 }, m as u64 * 7 + 1);
        let refine = call("qmsum.aggregate", "Qwen3-8B", &input, "Refine.", &[("merge", &merge)], LengthDist { mean: 300.0, cv: 0.3 }, m as u64 * 7 + 2);
        let answer = call("qmsum.aggregate", "Qwen3-8B", &input, "Answer.", &[("refine", &refine)], LengthDist { mean: 200.0, cv: 0.4 }, m as u64 * 7 + 3);
        assert!(answer.output_tokens as usize == tokens::count(&answer.text));
        scores.push(rouge_l_f1(&answer.text, q["answer"].as_str().unwrap_or_default()));
    }
    let mean = scores.iter().sum::<f64>() / scores.len().max(1) as f64;
    eprintln!("QMSum, {} meetings (general query 0): mean ROUGE-L F1 {mean:.4}; {:?} for all 9 x {} calls", scores.len(), started.elapsed(), scores.len());
}
