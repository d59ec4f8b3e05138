//! A tool of your own in a workflow: `word_count` counts the words of a draft and says whether
//! it is `short` or `long`; the workflow drafts an answer, counts it, and only a long draft is
//! condensed. Runs in process on the emulated pool.
//!
//! `cargo build && cargo run --example custom_tool`

use std::sync::Arc;

use switchyard::{Runtime, SessionStatus, ToolCall, ToolOutcome, ToolSpec, register_tool};

const WORKFLOW: &str = r#"
name: draft-count-condense
deployments:
  small: {model: Qwen3-0.6B, dtype: fp16, max_context: 2048, max_output_tokens: 96}
nodes:
  - id: draft
    role: Writer
    goal: A draft answer.
    deployment: small
    output_tokens: {mean: 60, cv: 0.2}
    prompt: "Answer: {{input.question}}"
  - id: count
    tool: word_count
    after: draft
    inputs:
      text: "{{draft}}"
  - id: condense
    role: Editor
    goal: The draft in one sentence.
    deployment: small
    after: count
    when: {node: count, verdict: long}
    output_tokens: {mean: 20, cv: 0.2}
    prompt: "Condense: {{draft}}"
"#;

/// The tool: words of `text`; `long` above 20.
fn word_count(call: &ToolCall) -> Result<ToolOutcome, String> {
    let text = call.inputs.get("text").and_then(|v| v.as_str()).ok_or("input `text` must be a string")?;
    let words = text.split_whitespace().count();
    Ok(ToolOutcome {
        text: format!("{words} words"),
        verdict: Some(if words > 20 { "long" } else { "short" }.to_string()),
        value: serde_json::json!({ "words": words }),
        ..ToolOutcome::default()
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    register_tool(
        ToolSpec {
            name: "word_count".into(),
            required: vec!["text".into()],
            optional: vec![],
            verdicts: vec!["short".into(), "long".into()],
            modeled_duration_s: 0.001,
        },
        Arc::new(word_count),
    )?;
    let rt = Runtime::builder("workflows/pools/live-emulated.yaml").workflow("tests/fixtures/tiny_chain.yaml").start().await?;
    let name = rt.register("draft-count-condense.yaml", WORKFLOW).await?;
    let inputs = ["What is a scheduler?", "Why batch LLM calls?"]
        .iter()
        .map(|q| [("question".to_string(), serde_json::json!(q))].into_iter().collect())
        .collect();
    let sessions = rt.run(&name, inputs).await?;
    for (id, status) in sessions.iter().zip(rt.wait(&sessions).await?) {
        match status {
            SessionStatus::Completed { output, .. } => {
                println!("session {id}: {}", output.map(|o| o.text).unwrap_or_default())
            }
            other => anyhow::bail!("session {id} did not complete: {other:?}"),
        }
    }
    let out = rt.shutdown().await?;
    println!("tool calls: {}; sessions completed: {}", out.report.tool_calls, out.report.sessions_completed);
    Ok(())
}
