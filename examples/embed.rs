//! Switchyard in process: start the live runtime on the emulated pool (three `switchyard
//! emulate` children: no GPU needed), register a workflow written inline, run sessions of it,
//! print their answers, then send one call through the front door and print its tokens as
//! they arrive.
//!
//! `cargo build && cargo run --example embed` (the pool's engines run the `switchyard` binary
//! next to this example).

use std::io::Write;

use switchyard::{ProgramRequest, Runtime, SessionStatus, TokenSink};

/// A two-agent team: a planner drafts steps, a writer turns them into a paragraph.
const TEAM: &str = r#"
name: plan-and-write
description: a planner and a writer on one small model
deployments:
  small: {model: Qwen3-0.6B, dtype: fp16, max_context: 2048, max_output_tokens: 64}
nodes:
  - id: plan
    role: Planner
    goal: Three steps to answer the question.
    deployment: small
    output_tokens: {mean: 32, cv: 0.2}
    prompt: "Plan an answer to: {{input.question}}"
  - id: write
    role: Writer
    goal: One paragraph that follows the plan.
    deployment: small
    after: plan
    output_tokens: {mean: 48, cv: 0.2}
    prompt: "Follow this plan: {{plan}}"
"#;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let rt = Runtime::builder("workflows/pools/live-emulated.yaml")
        .workflow("tests/fixtures/tiny_chain.yaml") // serves Qwen3-0.6B
        .start()
        .await?;
    let name = rt.register("plan-and-write.yaml", TEAM).await?;
    let questions = ["Why do agents call tools?", "What is a KV cache?"];
    let inputs = questions
        .iter()
        .map(|q| [("question".to_string(), serde_json::json!(q))].into_iter().collect())
        .collect();
    let sessions = rt.run(&name, inputs).await?;
    for (id, status) in sessions.iter().zip(rt.wait(&sessions).await?) {
        match status {
            SessionStatus::Completed { output, .. } => {
                println!("session {id} completed: {}", output.map(|o| o.text).unwrap_or_default())
            }
            other => anyhow::bail!("session {id} did not complete: {other:?}"),
        }
    }

    // The front door, in process: one streamed call of an external program.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let printer = tokio::spawn(async move {
        let mut pieces = 0;
        while let Some(piece) = rx.recv().await {
            print!("{piece}");
            let _ = std::io::stdout().flush();
            pieces += 1;
        }
        pieces
    });
    let request = ProgramRequest {
        messages: Some(vec![serde_json::json!({"role": "user", "content": "Say hello"})]),
        prompt: None,
        max_tokens: 16,
        enable_thinking: false,
        program_done: true,
        next_model: None,
        step: None,
        ..Default::default()
    };
    let answer = rt.call(Some("example-agent"), "Qwen3-0.6B", request, TokenSink::new(tx)).await?;
    let out = rt.shutdown().await?;
    let pieces = printer.await?;
    println!();
    println!(
        "front door: {} tokens in {pieces} pieces; runtime: {} sessions completed, {} failed",
        answer.output_tokens, out.report.sessions_completed, out.report.sessions_failed
    );
    Ok(())
}
