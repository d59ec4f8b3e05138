//! Statistical checks of the emulated accuracies: over many seeds, GSM8K solvers are right at
//! their model's configured rate (scored with the real metric), independently of each other,
//! and MBPP generations are the reference at the configured pass@1. Tolerances are wide (well
//! over three standard deviations) so the checks are about the mechanism, not luck.

use serde_json::{json, Value};
use switchyard_runtime::responder::models::{gsm8k_accuracy, mbpp_accuracy, QWEN3_BASE_ACCURACY};
use switchyard_runtime::responder::{gsm8k_exact, respond, ResponderRequest};
use switchyard_runtime::values::{derive_seed, LengthDist, NodeOutput, Record};

/// GSM8K test records 1 and 2 (Cobbe et al., 2021), verbatim.
fn records() -> Vec<Record> {
    [
        json!({"question": "Janet’s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' market?", "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day at the farmer’s market.\n#### 18"}),
        json!({"question": "A robe takes 2 bolts of blue fiber and half that much white fiber.  How many bolts in total does it take?", "answer": "It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo the total amount of fabric is 2+1=<<2+1=3>>3 bolts of fabric\n#### 3"}),
    ]
    .into_iter()
    .map(|v| serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}")))
    .collect()
}

fn solve(model: &str, input: &Record, seed: u64) -> NodeOutput {
    respond(&ResponderRequest {
        responder: "gsm8k.solve",
        node: "solve",
        model,
        input,
        prompt: "Solve the problem.",
        upstream: &[],
        // Long enough that no final answer is cut off: the rate is the model's alone.
        length: LengthDist { mean: 300.0, cv: 0.2 },
        max_output_tokens: 1024,
        seed,
        role: None,
        schema: None,
        verdict_field: None,
    })
    .unwrap_or_else(|e| panic!("respond: {e}"))
}

fn reference(input: &Record) -> &str {
    input.get("answer").and_then(Value::as_str).unwrap_or_default()
}

#[test]
fn gsm8k_solvers_are_right_at_their_models_rate() {
    let rs = records();
    let n = 600u64;
    for &(model, p, _) in QWEN3_BASE_ACCURACY {
        let mut right = 0.0;
        for i in 0..n {
            let input = &rs[(i % 2) as usize];
            let seed = derive_seed(7, &["session", &i.to_string(), model]);
            right += gsm8k_exact(&solve(model, input, seed), reference(input));
        }
        let rate = right / n as f64;
        let sd = (p * (1.0 - p) / n as f64).sqrt();
        assert!((rate - p).abs() < 4.0 * sd + 0.005, "{model}: {rate:.3} vs {p}");
    }
}

#[test]
fn gsm8k_solvers_with_different_seeds_are_independent() {
    let rs = records();
    let input = &rs[0];
    let (a, b) = ("Qwen3-0.6B", "Qwen3-1.7B");
    let n = 1500u64;
    let mut both = 0.0;
    for i in 0..n {
        let s = i.to_string();
        let ra = gsm8k_exact(&solve(a, input, derive_seed(1, &[&s, "solve_a"])), reference(input));
        let rb = gsm8k_exact(&solve(b, input, derive_seed(1, &[&s, "solve_b"])), reference(input));
        both += ra * rb;
    }
    let p = gsm8k_accuracy(a).unwrap_or(0.0) * gsm8k_accuracy(b).unwrap_or(0.0);
    let rate = both / n as f64;
    let sd = (p * (1.0 - p) / n as f64).sqrt();
    assert!((rate - p).abs() < 4.0 * sd, "joint {rate:.3} vs product {p:.3}");
}

#[test]
fn mbpp_generations_are_right_at_their_models_pass_rate() {
    let input: Record = serde_json::from_value(json!({
        "code": "def square_perimeter(a):\n  perimeter=4*a\n  return perimeter",
        "test_list": ["assert square_perimeter(10)==40"]
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    let n = 600u64;
    for model in ["Qwen3-0.6B", "Qwen3-8B"] {
        let p = mbpp_accuracy(model).unwrap_or(0.0);
        let mut right = 0;
        for seed in 0..n {
            let out = respond(&ResponderRequest {
                responder: "mbpp.generate",
                node: "generate",
                model,
                input: &input,
                prompt: "Write it.",
                upstream: &[],
                length: LengthDist { mean: 150.0, cv: 0.3 },
                max_output_tokens: 512,
                seed,
                role: None,
                schema: None,
                verdict_field: None,
            })
            .unwrap_or_else(|e| panic!("respond: {e}"));
            if switchyard_runtime::responder::extract_code(&out.text) == input["code"].as_str().unwrap_or_default() {
                right += 1;
            }
        }
        let rate = f64::from(right) / n as f64;
        let sd = (p * (1.0 - p) / n as f64).sqrt();
        assert!((rate - p).abs() < 4.0 * sd, "{model}: {rate:.3} vs {p}");
    }
}
