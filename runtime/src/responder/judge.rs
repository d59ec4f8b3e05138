//! `gsm8k.judge`, `qmsum.judge`: an LLM judge (paper 002's LLM-as-a-judge verifier) as an
//! emulated agent. The judge reads the answer of its first predecessor, decides whether it is
//! right, and answers with the node's structured output, whose boolean `verdict` property is its
//! decision. No model runs: the decision is the truth — the workflow metric's own check of that
//! answer against the record's reference (GSM8K's exact final answer; QMSum's ROUGE-L F1 at
//! least [`QMSUM_PASS`]) — flipped with probability [`LLM_JUDGE_ERROR`], a draw from the
//! request's seed, so that a judge is wrong as often as published judges disagree with people.
//!
//! Depends on `super::generic` (the structured answer's shape and length), the scorers and
//! `crate::schema`; never on the workflow model or the shells.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{ResponderError, ResponderRequest, generic, gsm8k_exact, rouge_l_f1};

/// Probability that an LLM judge's verdict is wrong. Zheng et al. 2023 (*Judging LLM-as-a-Judge
/// with MT-Bench and Chatbot Arena*, NeurIPS Datasets and Benchmarks) measured GPT-4 as a judge
/// agreeing with human experts on 85 % of the non-tied MT-Bench pairs. An assumption for the
/// emulated judges (a small local model judging may err more).
pub const LLM_JUDGE_ERROR: f64 = 0.15;

/// A QMSum answer is right, for its judge, at this ROUGE-L F1 against the reference summary
/// (assumption: the emulated QMSum answers score 0.10–0.20 on average; 0.2 separates the better
/// ones). The router's ROUGE-L verifier uses the same threshold.
pub const QMSUM_PASS: f64 = 0.2;

/// What a judge checks the answer against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Task {
    Gsm8k,
    Qmsum,
}

/// The judge's output: `(text, value, verdict)`, the verdict `"true"` or `"false"`.
pub(crate) fn judge(
    req: &ResponderRequest,
    rng: &mut ChaCha8Rng,
    target: usize,
    task: Task,
) -> Result<(String, serde_json::Value, Option<String>), ResponderError> {
    let reference = req.str_field("answer")?;
    let Some(field) = req.verdict_field.filter(|_| req.schema.is_some()) else {
        return Err(req.bad_field(
            "output",
            "a judge answers with a structured `output` whose boolean `verdict` property is its decision".into(),
        ));
    };
    // The answer judged: the first predecessor with an output (none: nothing is right).
    let truth = req.upstream.iter().find(|(_, o)| !o.text.is_empty()).is_some_and(|(_, answer)| match task {
        Task::Gsm8k => gsm8k_exact(answer, reference) >= 1.0,
        Task::Qmsum => rouge_l_f1(&answer.text, reference) >= QMSUM_PASS,
    });
    let wrong = rng.random_bool(LLM_JUDGE_ERROR);
    let decision = truth != wrong;
    // The answer's shape and length as any structured agent's, with the decision in it; the
    // schema's smallest answer when the decision would push it past the cap (the loader checks
    // that the smallest fits; a request with a tighter cap gets it cut, as a length cap would).
    let decide = |mut value: serde_json::Value| -> Result<serde_json::Value, ResponderError> {
        match value.as_object_mut() {
            Some(object) => {
                object.insert(field.to_string(), serde_json::Value::Bool(decision));
                Ok(value)
            }
            None => Err(req.bad_field("output", "a judge's output schema must be an object".into())),
        }
    };
    let (_, drawn, _) = generic::respond(req, rng, target)?;
    let mut value = decide(drawn)?;
    let cap = req.max_output_tokens as usize;
    if crate::tokens::count(&value.to_string()) > cap
        && let Some(schema) = req.schema
    {
        value = decide(schema.smallest())?;
    }
    let text = value.to_string();
    let text = if crate::tokens::count(&text) > cap { super::fit::truncate_tokens(&text, cap) } else { text };
    Ok((text, value, Some(decision.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::OutputSchema;
    use crate::values::{LengthDist, NodeOutput, Record};

    fn schema() -> OutputSchema {
        let json = serde_json::json!({
            "type": "object",
            "properties": {"correct": {"type": "boolean"}, "reason": {"type": "string"}},
            "required": ["correct", "reason"]
        });
        OutputSchema::from_json(&json).unwrap()
    }

    fn verdicts(responder: &str, answer: &str, reference: &str) -> (usize, usize) {
        let schema = schema();
        let mut input = Record::new();
        input.insert("answer".into(), serde_json::Value::String(reference.into()));
        let judged = NodeOutput { text: answer.into(), ..NodeOutput::default() };
        let upstream = [("solve", &judged)];
        let (mut yes, n) = (0, 2_000);
        for seed in 0..n as u64 {
            let req = ResponderRequest {
                responder,
                node: "judge",
                model: "Qwen3-8B",
                input: &input,
                prompt: "Is this answer right?",
                upstream: &upstream,
                length: LengthDist { mean: 60.0, cv: 0.3 },
                max_output_tokens: 256,
                seed,
                role: None,
                schema: Some(&schema),
                verdict_field: Some("correct"),
            };
            let out = crate::responder::respond(&req).unwrap();
            let value: serde_json::Value = serde_json::from_str(&out.text).unwrap();
            assert_eq!(value["correct"].as_bool().map(|b| b.to_string()), out.verdict, "the verdict is the property");
            assert!(value["reason"].is_string() && out.output_tokens <= 256);
            yes += usize::from(out.verdict.as_deref() == Some("true"));
        }
        (yes, n)
    }

    /// Within four standard deviations of `p` over `n` draws.
    fn near(count: usize, n: usize, p: f64) -> bool {
        let sd = (p * (1.0 - p) / n as f64).sqrt();
        (count as f64 / n as f64 - p).abs() < 4.0 * sd
    }

    #[test]
    fn a_judge_confirms_a_right_answer_except_at_its_error_rate() {
        let reference = "She has 3 + 4 = 7 apples.\n#### 7";
        let (yes, n) = verdicts("gsm8k.judge", "3 + 4 = 7\n#### 7", reference);
        assert!(near(yes, n, 1.0 - LLM_JUDGE_ERROR), "{yes} of {n}");
        let (yes, n) = verdicts("gsm8k.judge", "3 + 4 = 8\n#### 8", reference);
        assert!(near(yes, n, LLM_JUDGE_ERROR), "a wrong answer is confirmed only by mistake: {yes} of {n}");
    }

    #[test]
    fn a_qmsum_judge_passes_answers_close_to_the_reference() {
        let reference = "The group agreed to use a rubber case and a simple remote with fewer buttons.";
        let (yes, n) = verdicts("qmsum.judge", reference, reference);
        assert!(near(yes, n, 1.0 - LLM_JUDGE_ERROR), "{yes} of {n}");
        let (yes, n) = verdicts("qmsum.judge", "Nothing of note happened today at all.", reference);
        assert!(near(yes, n, LLM_JUDGE_ERROR), "{yes} of {n}");
    }

    #[test]
    fn a_judge_without_a_structured_verdict_is_refused() {
        let mut input = Record::new();
        input.insert("answer".into(), serde_json::Value::String("#### 7".into()));
        let req = ResponderRequest {
            responder: "gsm8k.judge",
            node: "judge",
            model: "Qwen3-8B",
            input: &input,
            prompt: "p",
            upstream: &[],
            length: LengthDist { mean: 60.0, cv: 0.3 },
            max_output_tokens: 256,
            seed: 1,
            role: None,
            schema: None,
            verdict_field: None,
        };
        let err = crate::responder::respond(&req).unwrap_err();
        assert!(err.to_string().contains("structured `output`"), "{err}");
    }
}
