//! Temporary measurement (to be deleted).
use serde_json::Value;
use switchyard_runtime::responder::{respond, rouge_l_f1, ResponderRequest};
use switchyard_runtime::values::{LengthDist, NodeOutput, Record};

fn parts(t: &str, n: usize) -> Vec<String> {
    let lines: Vec<&str> = t.lines().collect();
    let total: usize = t.len();
    let mut out = vec![String::new(); n];
    let mut acc = 0;
    for l in lines {
        let k = ((acc * n) / total.max(1)).min(n - 1);
        out[k].push_str(l);
        out[k].push('\n');
        acc += l.len() + 1;
    }
    out
}

fn call(resp: &str, model: &str, input: &Record, prompt: &str, up: &[(&str, &NodeOutput)], mean: f64, seed: u64) -> NodeOutput {
    respond(&ResponderRequest { responder: resp, node: "n", model, input, prompt, upstream: up,
        length: LengthDist { mean, cv: 0.3 }, max_output_tokens: 512, seed }).unwrap()
}

#[test]
#[ignore]
fn scratch_qmsum() {
    let path = std::env::var("QMSUM").unwrap();
    let text = std::fs::read_to_string(path).unwrap();
    let mut scores = vec![];
    let mut from_new = vec![];
    let t0 = std::time::Instant::now();
    for (mi, line) in text.lines().enumerate() {
        let m: Value = serde_json::from_str(line).unwrap();
        let transcript: String = m["meeting_transcripts"].as_array().unwrap().iter()
            .map(|t| format!("{}: {}", t["speaker"].as_str().unwrap(), t["content"].as_str().unwrap())).collect::<Vec<_>>().join("\n");
        let q = &m["general_query_list"][0];
        let mut input = Record::new();
        input.insert("query".into(), q["query"].clone());
        input.insert("answer".into(), q["answer"].clone());
        let ps = parts(&transcript, 6);
        let query = q["query"].as_str().unwrap();
        let mut lanes = vec![];
        for lane in 0..2 {
            let mut prev: Option<NodeOutput> = None;
            for st in 0..3 {
                let part = &ps[lane * 3 + st];
                let prompt = match &prev {
                    None => format!("Summarize.\nQuery: {query}\nTranscript:\n{part}\n---\nWrite."),
                    Some(p) => format!("Update.\nQuery: {query}\nPrevious summary:\n{}\nTranscript:\n{part}\n---\nUpdated summary:", p.text),
                };
                let out = call("qmsum.summarize", "Qwen3-4B", &input, &prompt, &[], 250.0, (mi * 100 + lane * 10 + st) as u64);
                if let Some(p) = &prev {
                    let kept = p.text.split(". ").filter(|s| out.text.contains(*s)).count();
                    let total = out.text.split(". ").count();
                    from_new.push(1.0 - kept as f64 / total as f64);
                }
                prev = Some(out);
            }
            lanes.push(prev.unwrap());
        }
        let up = [("a", &lanes[0]), ("b", &lanes[1])];
        let merge = call("qmsum.aggregate", "Qwen3-8B", &input, "m", &up, 300.0, mi as u64 * 7 + 1);
        let refine = call("qmsum.aggregate", "Qwen3-8B", &input, "r", &[("m", &merge)], 300.0, mi as u64 * 7 + 2);
        let answer = call("qmsum.aggregate", "Qwen3-8B", &input, "a", &[("r", &refine)], 200.0, mi as u64 * 7 + 3);
        let r = rouge_l_f1(&answer.text, q["answer"].as_str().unwrap());
        if mi == 0 { eprintln!("ANSWER: {}\nREF: {}", answer.text, q["answer"]); }
        scores.push(r);
    }
    eprintln!("elapsed {:?}", t0.elapsed());
    eprintln!("mean rouge-L {:.4} over {}", scores.iter().sum::<f64>() / scores.len() as f64, scores.len());
    eprintln!("mean share of new sentences in rolling stages {:.3}", from_new.iter().sum::<f64>() / from_new.len() as f64);
}
