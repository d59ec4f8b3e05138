//! End-to-end tests of what `switchyard run` tells: its exit status when sessions fail (and
//! `--allow-failures`), accuracy with failures counted, progress on stderr when stderr is not a
//! terminal, the default `--pool` found from another directory, input-size limits, and Ctrl-C
//! giving a partial report with exit status 130. Workloads are a few sessions (the Ctrl-C one
//! is long on purpose, and interrupted within a second or two).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A one-node GSM8K-style workflow on Qwen3-0.6B with a 512-token context, over four records
/// of which two have a question far longer than the context: those two sessions fail at run
/// time ("exceeds deployment `small`'s max_context"), the other two complete. A burst of 4 sessions draws every
/// record once, whatever the seed. Returns the workflow's path.
fn failing_workflow(dir: &Path) -> PathBuf {
    let long_q: String = std::iter::once("Compute the total.".to_string())
        .chain((0..400).map(|i| format!("item{i} costs {i} dollars;")))
        .collect::<Vec<_>>()
        .join(" ");
    let records = [
        serde_json::json!({"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}),
        serde_json::json!({"question": long_q, "answer": "#### 1"}),
        serde_json::json!({"question": "What is 4 + 4?", "answer": "4 + 4 = 8\n#### 8"}),
        serde_json::json!({"question": long_q, "answer": "#### 2"}),
    ];
    let lines: Vec<String> = records.iter().map(|r| r.to_string()).collect();
    std::fs::write(dir.join("data.jsonl"), lines.join("\n") + "\n").expect("dataset");
    let path = dir.join("tiny.yaml");
    std::fs::write(
        &path,
        r#"name: tiny
deployments:
  small: {model: Qwen3-0.6B, dtype: fp16, max_context: 512, max_output_tokens: 64}
dataset:
  file: data.jsonl
  format: jsonl
  fields:
    question: question
    answer: answer
metric: {kind: gsm8k_exact, node: solve, reference: answer}
nodes:
  - id: solve
    deployment: small
    responder: gsm8k.solve
    max_output_tokens: 64
    output_tokens: {mean: 40, cv: 0.3}
    prompt: |
      Solve: {{input.question}}
"#,
    )
    .expect("workflow");
    path
}

fn small_pool() -> String {
    root().join("workflows/pools/small.yaml").display().to_string()
}

fn run_failing(extra: &[&str]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let wf = failing_workflow(dir.path());
    let wf = wf.display().to_string();
    let pool = small_pool();
    let mut args = vec!["run", wf.as_str(), "--sessions", "4", "--pool", pool.as_str(), "--json"];
    args.extend(extra);
    (switchyard_in(dir.path(), &args), dir)
}

fn json_of(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is one JSON object ({e}): {}\nstderr: {}", text(&out.stdout), text(&out.stderr)))
}

#[test]
fn failed_sessions_make_the_run_exit_non_zero_and_count_in_accuracy() {
    let (out, _dir) = run_failing(&[]);
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stderr).contains("2 session(s) failed") && text(&out.stderr).contains("--allow-failures"));
    let json = json_of(&out);
    assert_eq!((json["sessions_total"].as_u64(), json["sessions_completed"].as_u64(), json["sessions_failed"].as_u64()),
        (Some(4), Some(2), Some(2)), "{json}");
    assert_eq!(json["interrupted"], false);
    let failures = json["failures"].as_array().expect("failures");
    assert_eq!(failures.len(), 2);
    assert!(failures.iter().all(|f| f.as_str().is_some_and(|f| f.contains("exceeds deployment `small`'s max_context 512"))), "{failures:?}");
    // Accuracy is over all four sessions: at most the two completed ones can score.
    let w = &json["workflows"]["tiny"];
    assert_eq!((w["sessions_completed"].as_u64(), w["sessions_failed"].as_u64()), (Some(2), Some(2)));
    let acc = w["accuracy"].as_f64().expect("accuracy");
    let quarters = acc * 4.0;
    assert!((quarters - quarters.round()).abs() < 1e-9 && quarters.round() <= 2.0, "accuracy {acc} is not k/4 with k ≤ 2");
    // The pool's GPU time partitions gpus × makespan, and is not zero.
    let makespan = json["makespan_s"].as_f64().expect("makespan");
    assert!(makespan > 0.0);
    let g = &json["gpu_seconds_total"];
    let sum: f64 = ["generation", "idle_resident", "loading", "other"].iter().map(|k| g[*k].as_f64().unwrap_or(0.0)).sum();
    let expect = json["gpus"].as_f64().unwrap_or(0.0) * makespan;
    assert!(sum > 0.0 && (sum - expect).abs() < 0.01 * expect.max(1.0), "{sum} vs {expect}");
}

#[test]
fn allow_failures_exits_zero_with_the_same_report() {
    let (strict, _a) = run_failing(&[]);
    let (allowed, _b) = run_failing(&["--allow-failures"]);
    assert_eq!(allowed.status.code(), Some(0), "stderr: {}", text(&allowed.stderr));
    assert_eq!(json_of(&allowed), json_of(&strict));
}

#[test]
fn progress_goes_to_stderr_when_it_is_not_a_terminal() {
    // With --json: stdout stays the JSON alone.
    let (out, _dir) = run_failing(&["--allow-failures"]);
    let err = text(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("progress [")).collect();
    assert!(lines.len() >= 2, "a first and a final line: {err}");
    let last = lines.last().copied().unwrap_or_default();
    assert!(last.contains("done: sessions 4/4 ended") && last.contains("virtual time") && last.contains("events/s"), "{last}");
    assert!(last.contains("2 failed"), "{last}");
    json_of(&out);
    // Without --json, stdout piped: tables on stdout, progress still on stderr.
    let dir = tempfile::tempdir().expect("temp dir");
    let wf = failing_workflow(dir.path()).display().to_string();
    let pool = small_pool();
    let out = switchyard_in(dir.path(), &["run", &wf, "--sessions", "4", "--pool", &pool, "--allow-failures"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("progress ["), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains("progress ["));
    assert!(text(&out.stdout).contains("GPU time of the pool"), "{}", text(&out.stdout));
}

#[test]
fn the_default_pool_is_found_from_another_directory() {
    let elsewhere = tempfile::tempdir().expect("temp dir");
    let wf = root().join("workflows/gsm8k.yaml").display().to_string();
    let out = switchyard_in(elsewhere.path(), &["run", &wf, "--sessions", "1", "--json"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(json_of(&out)["pool"], "paper");

    // A workflow with no pool anywhere near it: the error lists where it looked.
    let wf = failing_workflow(elsewhere.path()).display().to_string();
    let out = switchyard_in(elsewhere.path(), &["run", &wf, "--sessions", "1"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("looked in") && err.contains("pools/paper.yaml") && err.contains("--pool FILE"), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn too_large_dataset_and_pool_files_are_refused_with_their_size() {
    let dir = tempfile::tempdir().expect("temp dir");
    let wf = failing_workflow(dir.path()).display().to_string();
    // Sparse files: the sizes are checked before anything is read.
    let huge = 300u64 << 20;
    std::fs::File::create(dir.path().join("data.jsonl")).and_then(|f| f.set_len(huge)).expect("sparse dataset");
    let pool = small_pool();
    let out = switchyard_in(dir.path(), &["run", &wf, "--sessions", "1", "--pool", &pool]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("data.jsonl") && err.contains(&huge.to_string()) && err.contains("256 MiB"), "{err}");

    let wf = failing_workflow(dir.path()).display().to_string();
    let big_pool = dir.path().join("big-pool.yaml");
    std::fs::File::create(&big_pool).and_then(|f| f.set_len(2 << 20)).expect("sparse pool");
    let out = switchyard_in(dir.path(), &["run", &wf, "--sessions", "1", "--pool", "big-pool.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("big-pool.yaml") && err.contains(&(2u64 << 20).to_string()) && err.contains("1 MiB"), "{err}");
}

#[test]
fn sigint_stops_a_long_run_with_a_partial_report_and_exit_130() {
    let wf = root().join("workflows/gsm8k.yaml").display().to_string();
    let pool = small_pool();
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["run", &wf, "--sessions", "3000", "--pool", &pool, "--json"])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the switchyard binary runs");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let stderr = child.stderr.take().expect("stderr");
    let mut err_lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let started = Instant::now();
    loop {
        let line = err_lines.next().and_then(Result::ok).unwrap_or_else(|| panic!("no progress line: {seen:?}"));
        let first = line.starts_with("progress [");
        seen.push(line);
        if first {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "{seen:?}");
    }
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) with a pid we spawned and still own (not yet waited for).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let rest: Vec<String> = err_lines.map_while(Result::ok).collect();
    let status = child.wait().expect("wait");
    let out = reader.join().expect("stdout reader");
    assert_eq!(status.code(), Some(130), "stderr: {seen:?} {rest:?}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("partial JSON report ({e}): {out}"));
    assert_eq!(json["interrupted"], true);
    let total = json["sessions_total"].as_u64().unwrap_or(0);
    let done = json["sessions_completed"].as_u64().unwrap_or(0);
    let failed = json["sessions_failed"].as_u64().unwrap_or(0);
    assert_eq!(total, 3000);
    assert_eq!(done + failed, total);
    assert!(failed > 0, "the run was cut short: {json}");
    let failures = json["failures"].as_array().expect("failures");
    assert!(failures.iter().any(|f| f.as_str().is_some_and(|f| f.ends_with(": interrupted"))), "{failures:?}");
    assert!(rest.iter().any(|l| l.starts_with("progress [") && l.contains("interrupted: sessions")), "{rest:?}");
}
