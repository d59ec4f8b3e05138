//! A client of `switchyard serve`'s REST API: register a workflow, start a run, follow its
//! events (server-sent events) to the end, print the answers.
//!
//! ```text
//! export SWITCHYARD_API_TOKEN=$(head -c 24 /dev/urandom | base64)
//! switchyard serve --pool workflows/pools/live-emulated.yaml --workflow tests/fixtures/tiny_chain.yaml &
//! cargo run --example serve_client            # SWITCHYARD_URL defaults to http://127.0.0.1:8080
//! ```

use anyhow::{Context, bail};
use futures::StreamExt;
use serde_json::{Value, json};

const WORKFLOW: &str = r#"
name: ask-and-check
deployments:
  small: {model: Qwen3-0.6B, dtype: fp16, max_context: 2048, max_output_tokens: 64}
nodes:
  - id: answer
    deployment: small
    output_tokens: {mean: 32, cv: 0.2}
    prompt: "Answer briefly: {{input.question}}"
  - id: check
    deployment: small
    after: answer
    output_tokens: {mean: 16, cv: 0.2}
    prompt: "Is this answer right? {{answer}}"
"#;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let base = std::env::var("SWITCHYARD_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let token = std::env::var("SWITCHYARD_API_TOKEN").context("set SWITCHYARD_API_TOKEN to the server's token")?;
    let http = reqwest::Client::new();
    let auth = format!("Bearer {token}");

    // Register (201), or find it registered already (200).
    let resp = http.post(format!("{base}/v1/workflows")).header("authorization", &auth).body(WORKFLOW).send().await?;
    let status = resp.status();
    let body: Value = resp.json().await?;
    if !status.is_success() {
        bail!("registration refused ({status}): {body}");
    }
    println!("registered `{}`; it reads {}", body["name"], body["inputs"]);

    // A run of two sessions.
    let run = json!({"workflow": "ask-and-check", "inputs": [{"question": "What is 2 + 2?"}, {"question": "Name a prime."}]});
    let resp = http.post(format!("{base}/v1/runs")).header("authorization", &auth).json(&run).send().await?;
    let body: Value = resp.json().await?;
    let id = body["id"].as_str().context("a run id")?.to_string();
    println!("run {id}: sessions {}", body["sessions"]);

    // Its events, until `run_end`.
    let resp = http.get(format!("{base}/v1/runs/{id}/events")).header("authorization", &auth).send().await?;
    let mut stream = resp.bytes_stream();
    let mut buffer = String::new();
    let mut end: Option<Value> = None;
    'read: while let Some(chunk) = stream.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(cut) = buffer.find("\n\n") {
            let event: String = buffer.drain(..cut + 2).collect();
            let name = event.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("message");
            let data = event.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or("{}");
            if name == "run_end" {
                end = Some(serde_json::from_str(data)?);
                break 'read;
            }
            println!("  event {name}: {data}");
        }
    }
    let end = end.context("the event stream ended without run_end")?;
    println!("run {id} {}", end["state"]);
    for s in end["sessions"].as_array().context("sessions")? {
        println!("  {} {}: {}", s["id"], s["state"], s.pointer("/output/text").and_then(Value::as_str).unwrap_or(""));
    }
    if end["state"] != "completed" {
        bail!("the run did not complete: {end}");
    }
    Ok(())
}
