//! The top-level examples, run as a user runs them: `examples/embed.rs` (in process),
//! `examples/custom_tool.rs` (a tool of the program's own, branched on),
//! `examples/serve_client.rs` (REST + SSE against `switchyard serve`), and the Python examples
//! (`examples/python/`: a LangGraph graph, a LangGraph ReAct agent and an OpenAI Agents SDK agent
//! whose calls go through the front door, the last two calling a function tool). `cargo test` builds the Rust examples next to the binary
//! (`target/<profile>/examples/`). The Python examples need their packages
//! (`examples/python/requirements.txt`), which `.ci/run` installs into
//! `target/pyenv-examples` (or `SWITCHYARD_EXAMPLES_PYTHON` names an interpreter that has
//! them); under `CI=true` a missing interpreter fails the test, elsewhere it is skipped with a
//! note.

mod support;

use std::path::PathBuf;
use std::process::Command;

use support::serve::{BIN, Server, TOKEN, repo};

/// A Rust example's binary, built by `cargo test` beside the `switchyard` binary.
fn example(name: &str) -> PathBuf {
    let bin = PathBuf::from(BIN);
    bin.parent().map(|d| d.join("examples").join(name)).unwrap_or_else(|| PathBuf::from(name))
}

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn the_embed_example_runs_sessions_and_a_front_door_call_in_process() {
    let out = Command::new(example("embed")).current_dir(repo()).output().expect("run examples/embed");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(t.matches("completed: [emulated output of node `write`").count(), 2, "{t}");
    assert!(t.contains("front door: 16 tokens in 16 pieces"), "{t}");
    assert!(t.contains("3 sessions completed, 0 failed"), "{t}");
}

#[test]
fn the_custom_tool_example_branches_on_its_own_tools_verdict() {
    let out = Command::new(example("custom_tool")).current_dir(repo()).output().expect("run examples/custom_tool");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    // Both drafts are long (60 tokens ≫ 20 words), so both sessions end with the condensed answer.
    assert_eq!(t.matches("emulated output of node `condense`").count(), 2, "{t}");
    assert!(t.contains("tool calls: 2; sessions completed: 2"), "{t}");
}

/// The Python interpreter with the examples' packages, if there is one.
fn examples_python() -> Option<PathBuf> {
    let p = std::env::var_os("SWITCHYARD_EXAMPLES_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/pyenv-examples/bin/python"));
    let ok = Command::new(&p)
        .args(["-c", "import langgraph, langchain_openai, agents"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(p)
}

#[test]
fn the_client_examples_drive_switchyard_serve() {
    let server = Server::start(
        &repo().join("workflows/pools/live-emulated.yaml"),
        &[&repo().join("tests/fixtures/tiny_chain.yaml")],
    );
    let out = Command::new(example("serve_client"))
        .env("SWITCHYARD_URL", &server.base)
        .env("SWITCHYARD_API_TOKEN", TOKEN)
        .output()
        .expect("run examples/serve_client");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("\"completed\""), "{t}");
    assert!(t.contains("event finish"), "{t}");

    let Some(python) = examples_python() else {
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "the Python examples' packages are not installed (see .ci/run)");
        eprintln!("skipped: no Python with the examples' packages (examples/python/requirements.txt)");
        return;
    };
    for script in ["langgraph_agent.py", "langgraph_react.py", "openai_agents.py"] {
        let out = Command::new(&python)
            .arg(repo().join("examples/python").join(script))
            .args(["--url", &server.base])
            .env("SWITCHYARD_API_TOKEN", TOKEN)
            .output()
            .expect("run the Python example");
        let t = text(&out);
        assert!(out.status.success(), "{script}: {t}");
        match script {
            "langgraph_agent.py" => assert!(t.contains("streamed pieces"), "{t}"),
            // The model called the agent's function tool through the front door, once.
            _ => assert!(t.contains("tool calls: 1 ("), "{t}"),
        }
        eprintln!("{script}: {t}");
    }
}
