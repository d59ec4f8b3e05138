//! End-to-end tests of authoring a workflow as a user would: the shipped agent team written
//! with generic agents runs under every policy, deterministically; and the bad cases a new user
//! hits are refused before any session starts, each with a non-zero exit and a message naming
//! the file, line and field (or node, model and memory), all of them at once.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn switchyard_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the switchyard binary runs")
}

fn switchyard(args: &[&str]) -> Output {
    switchyard_in(&root(), args)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn team_json(policy: &str) -> (String, serde_json::Value) {
    let out = switchyard(&[
        "run", "workflows/team.yaml", "--sessions", "4", "--pool", "workflows/pools/small.yaml", "--policy", policy,
        "--json",
    ]);
    assert!(out.status.success(), "{policy}: {}", stderr(&out));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let json = serde_json::from_str(&text).expect("one JSON object");
    (text, json)
}

#[test]
fn the_generic_agent_team_runs_under_every_policy_deterministically() {
    for policy in ["joint", "parrot", "kairos"] {
        let (a, json) = team_json(policy);
        assert_eq!(json["sessions_completed"], 4, "{policy}: {json}");
        assert_eq!(json["sessions_failed"], 0, "{policy}");
        let w = &json["workflows"]["team"];
        assert_eq!(w["metric"], "tests_pass");
        let acc = w["accuracy"].as_f64().unwrap_or(-1.0);
        assert!((0.0..=1.0).contains(&acc), "{policy}: {acc}");
        // Nine agent activations at least per session (planner, 3 researchers, synthesizer,
        // coder, reviewer; follow-up when rejected) and one test per coder round.
        assert!(json["llm_calls"].as_u64().unwrap_or(0) >= 4 * 7, "{json}");
        assert!(json["tool_calls"].as_u64().unwrap_or(0) >= 4, "{json}");
        if policy == "joint" {
            let (b, _) = team_json(policy);
            assert_eq!(a, b, "same seed, same bytes");
        }
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("switchyard-authoring-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A QMSum responder without the `query` field it needs, and a Qwen3-14B deployment on a pool
/// of V100s: both reported, with their places, by `validate` and by `run`, before any session.
#[test]
fn bad_workflows_are_refused_before_any_session_with_every_problem() {
    let dir = tempdir("bad");
    let data = root().join("workflows/datasets/mbpp/sanitized-mbpp.json");
    let wf = write(
        &dir,
        "four.yaml",
        &format!(
            "name: four
deployments:
  big: {{model: Qwen3-14B, dtype: fp16, max_context: 8192, max_output_tokens: 256}}
  small: {{model: Qwen3-4B, dtype: fp16, max_context: 8192, max_output_tokens: 256}}
dataset:
  file: {}
  fields: {{prompt: prompt, code: code}}
nodes:
  - id: planner
    role: Planner
    deployment: big
    prompt: \"Plan: {{{{input.prompt}}}}\"
  - id: merge
    deployment: small
    responder: qmsum.aggregate
    after: planner
    prompt: \"Merge {{{{planner}}}}\"
",
            data.display()
        ),
    );
    let pool = write(&dir, "v100.yaml", "name: v100\ndevices:\n  - {kind: V100-32GB, count: 2}\n");
    let wf_s = wf.to_str().unwrap_or_default();
    let pool_s = pool.to_str().unwrap_or_default();

    // The input need is the loader's: validate and run both refuse.
    for args in [vec!["validate", wf_s, "--pool", pool_s], vec!["run", wf_s, "--pool", pool_s, "--json"]] {
        let out = switchyard_in(&dir, &args);
        assert!(!out.status.success(), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}: no report, no session: {}", String::from_utf8_lossy(&out.stdout));
        let e = stderr(&out);
        assert!(
            e.contains(&format!("{wf_s}:15:5: nodes.merge.responder: responder `qmsum.aggregate` needs input field `query`")),
            "{e}"
        );
    }

    // Without the bad responder, the pool check names the node, model and memory.
    let fixed = std::fs::read_to_string(&wf).unwrap_or_default().replace("    responder: qmsum.aggregate\n", "");
    std::fs::write(&wf, fixed).expect("write");
    for args in [
        vec!["validate", wf_s, "--pool", pool_s],
        vec!["run", wf_s, "--pool", pool_s, "--sessions", "0", "--max-num-seqs", "0", "--json"],
    ] {
        let out = switchyard_in(&dir, &args);
        assert!(!out.status.success(), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        let e = stderr(&out);
        assert!(
            e.contains(&format!("{wf_s}:3:3: deployments.big: Qwen3-14B (fp16, max_context 8192, used by node planner) fits no device of pool `v100`")),
            "{e}"
        );
        assert!(e.contains("GiB weights") && e.contains("V100-32GB 28.8 GiB"), "{e}");
        assert!(!e.contains("deployments.small"), "{e}");
        if args[0] == "run" {
            assert!(e.contains("--sessions: 0 is out of range"), "{e}");
            assert!(e.contains("--max-num-seqs: 0 is out of range"), "{e}");
        }
    }

    // On a pool where it fits, the same file validates and runs.
    let out = switchyard_in(&dir, &["validate", wf_s, "--pool", root().join("workflows/pools/small.yaml").to_str().unwrap_or_default()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("every deployment fits a device of pool"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn several_problems_in_several_files_are_reported_together() {
    let dir = tempdir("many");
    let a = write(
        &dir,
        "a.yaml",
        "name: a
deployments:
  d: {model: Qwen3-8B, max_context: 4096, max_output_tokens: 8192}
  e: {model: Qwen3-9B, max_context: 4096, max_output_tokens: 256}
nodes:
  - {id: plan, deployment: d, prompt: hi}
  - {id: act, deployment: nowhere, prompt: \"{{plan?}}\", after: plan}
",
    );
    let b = write(&dir, "b.yaml", "name: b\ndeployments: {}\nnodes: []\n");
    let out = switchyard_in(&dir, &["validate", a.to_str().unwrap_or_default(), b.to_str().unwrap_or_default()]);
    assert!(!out.status.success());
    let e = stderr(&out);
    // `run` reports its flags' problems with the files'.
    let run = switchyard_in(&dir, &["run", a.to_str().unwrap_or_default(), "--sessions", "0", "--json"]);
    assert!(!run.status.success() && run.stdout.is_empty());
    let r = stderr(&run);
    assert!(r.contains("--sessions: 0 is out of range") && r.contains("deployments.e.model: unknown model"), "{r}");
    for want in [
        "a.yaml:3:62: deployments.d.max_output_tokens: max_output_tokens 8192 must be at least 1 and below max_context 4096",
        "a.yaml:4:14: deployments.e.model: unknown model `Qwen3-9B`",
        "a.yaml:7:27: nodes.act.deployment: unknown deployment `nowhere`",
        "b.yaml:2:14: deployments: declare at least one deployment",
        "b.yaml:3:8: nodes: a workflow needs at least one node",
    ] {
        assert!(e.contains(want), "missing `{want}` in:\n{e}");
    }
    // x's deployment `d` is declared (its entry is wrong): not reported again as unknown.
    assert!(!e.contains("unknown deployment `d`"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_oversized_workflow_file_is_refused_before_it_is_read() {
    let dir = tempdir("big");
    let big = dir.join("big.yaml");
    let f = std::fs::File::create(&big).expect("create");
    f.set_len(50 << 20).expect("sparse 50 MiB");
    let out = switchyard_in(&dir, &["validate", big.to_str().unwrap_or_default()]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(e.contains("the file is 52428800 bytes; workflow files are read up to 4194304 bytes"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn input_fields_without_a_dataset_are_refused_before_a_run() {
    let dir = tempdir("noinput");
    let tiny = std::fs::read_to_string(root().join("tests/fixtures/tiny_chain.yaml")).expect("fixture");
    let (first, rest) = tiny.split_once("prompt: ").expect("a prompt");
    let needs = format!("{first}prompt: \"Q: {{{{input.question}}}}\"\n{}", rest.split_once('\n').map(|x| x.1).unwrap_or(""));
    let path = dir.join("needs.yaml");
    std::fs::write(&path, &needs).expect("write");
    for cmd in [&["validate"][..], &["run", "--sessions", "1"][..]] {
        let mut args = cmd.to_vec();
        args.push(path.to_str().unwrap_or_default());
        let out = switchyard_in(&dir, &args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let e = stderr(&out);
        // Placed like every other problem: file, line, column and field.
        let want = format!("{}:16:13: nodes.draft.prompt: {{{{input.question}}}} read(s) input fields but the workflow has no dataset", path.display());
        assert!(e.contains(&want), "missing `{want}` in:\n{e}");
    }
    // Optional, it is fine: every session gets the empty text.
    std::fs::write(&path, needs.replace("{{input.question}}", "{{input.question?}}")).expect("write");
    let out = switchyard_in(&dir, &["validate", path.to_str().unwrap_or_default()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Qwen3-4B map over a QMSum transcript part, declared with a 4,096-token context: its long
/// prompts fail at run time. Beside a workflow that declares Qwen3-4B at 16,384 tokens (the
/// replica is shared, and served at the larger context), exactly the same sessions fail.
#[test]
fn a_nodes_context_is_its_own_deployments_whatever_else_runs() {
    let dir = tempdir("context");
    let data = root().join("workflows/datasets/qmsum/test.jsonl");
    let small = write(
        &dir,
        "small.yaml",
        &format!(
            "name: small
deployments:
  q4: {{model: Qwen3-4B, dtype: fp16, max_context: 4096, max_output_tokens: 1024}}
dataset:
  file: {}
  format: jsonl
  fields:
    query: general_query_list.0.query
    transcript: {{path: meeting_transcripts, join: \"{{speaker}}: {{content}}\"}}
nodes:
  - id: map
    deployment: q4
    responder: qmsum.summarize
    output_tokens: {{mean: 200, cv: 0.3}}
    prompt: \"Summarize for {{{{input.query}}}}: {{{{input.transcript | part 1 of 4}}}}\"
",
            data.display()
        ),
    );
    let big = write(
        &dir,
        "big.yaml",
        "name: big\ndeployments:\n  q4: {model: Qwen3-4B, dtype: fp16, max_context: 16384, max_output_tokens: 512}\nnodes:\n  - {id: a, deployment: q4, prompt: hi}\n",
    );
    let pool = root().join("workflows/pools/small.yaml");
    let run = |files: &[&Path]| -> (u64, Vec<String>) {
        let mut args = vec!["run".to_string()];
        args.extend(files.iter().map(|f| f.display().to_string()));
        args.extend(["--sessions", "5", "--json", "--allow-failures", "--pool"].map(String::from));
        args.push(pool.display().to_string());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = switchyard_in(&dir, &args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        let failed = json["workflows"]["small"]["sessions_failed"].as_u64().unwrap_or(u64::MAX);
        // `sN: map: …`, without the session's number (numbered across the run's workflows).
        let mut reasons: Vec<String> = json["failures"]
            .as_array()
            .map(|a| a.iter().filter_map(|f| f.as_str()?.split_once(": ").map(|x| x.1.to_string())).collect())
            .unwrap_or_default();
        reasons.sort();
        (failed, reasons)
    };
    let alone = run(&[&small]);
    assert!(alone.0 > 0, "some transcript parts pass 4,096 tokens: {alone:?}");
    assert!(alone.1.iter().all(|r| r.starts_with("map: prompt of ") && r.ends_with("exceeds deployment `q4`'s max_context 4096")), "{alone:?}");
    assert_eq!(run(&[&small, &big]), alone, "the same failures beside a larger-context workflow");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_workflow_name_used_twice_is_placed_at_the_second_files_name() {
    let dir = tempdir("twice");
    let text = "name: same\ndeployments:\n  d: {model: Qwen3-0.6B, dtype: fp16, max_context: 2048, max_output_tokens: 64}\nnodes:\n  - {id: a, deployment: d, prompt: hi}\n";
    let a = write(&dir, "a.yaml", text);
    let b = write(&dir, "b.yaml", &format!("# the same workflow again\n{text}"));
    let out = switchyard_in(&dir, &["validate", a.to_str().unwrap_or_default(), b.to_str().unwrap_or_default()]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    let want = format!("{}:2:7: name: workflow name `same` is used twice in this run (also by {})", b.display(), a.display());
    assert!(e.contains(&want), "missing `{want}` in:\n{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Tool calls that failed (here: every shell check timed out) are named under the text
/// report's table, by cause, not only in `--json`'s `tools.failures_by_cause`.
#[test]
fn failed_tool_calls_are_counted_in_the_text_report() {
    let dir = tempdir("tooltimeout");
    let wf = write(
        &dir,
        "slow.yaml",
        "name: slow
deployments:
  d: {model: Qwen3-0.6B, dtype: fp16, max_context: 2048, max_output_tokens: 64}
nodes:
  - {id: a, deployment: d, prompt: hi}
  - id: check
    tool: shell
    after: a
    timeout_s: 1
    inputs: {command: \"sleep 5\"}
",
    );
    let pool = root().join("workflows/pools/small.yaml");
    let out = switchyard_in(&dir, &["run", wf.to_str().unwrap_or_default(), "--sessions", "2", "--pool", pool.to_str().unwrap_or_default()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("tool calls not passed: 2 of 2 (timeout 2)"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
