//! End-to-end tests of the `switchyard` command line: the main job on a few sessions, its
//! determinism, its JSON schema and accounting, the SVG and trace outputs, and clear errors on
//! bad workflow files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn switchyard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("the switchyard binary runs")
}

const WORKFLOWS: [&str; 3] = ["workflows/gsm8k.yaml", "workflows/mbpp.yaml", "workflows/qmsum.yaml"];

fn run_json(extra: &[&str]) -> (String, serde_json::Value) {
    let mut args = vec!["run"];
    args.extend(WORKFLOWS);
    args.extend(["--sessions", "2", "--pool", "workflows/pools/small.yaml", "--json"]);
    args.extend(extra);
    let out = switchyard(&args);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8 JSON");
    let json: serde_json::Value = serde_json::from_str(&text).expect("one JSON object");
    (text, json)
}

#[test]
fn main_job_completes_is_deterministic_and_accounts_gpu_time() {
    let (a, json) = run_json(&[]);
    let (b, _) = run_json(&[]);
    assert_eq!(a, b, "same seed must give byte-identical JSON");

    for field in [
        "policy", "seed", "sessions_completed", "sessions_failed", "makespan_s", "latency_s",
        "gpu_seconds_per_session", "loads", "evictions", "workflows",
    ] {
        assert!(json.get(field).is_some(), "missing `{field}`");
    }
    assert_eq!(json["sessions_completed"], 6, "{json}");
    assert_eq!(json["sessions_failed"], 0);
    assert_eq!(json["policy"], "joint");
    for wf in ["gsm8k", "mbpp", "qmsum"] {
        let w = &json["workflows"][wf];
        assert_eq!(w["sessions_completed"], 2, "{wf}");
        let acc = w["accuracy"].as_f64().expect("accuracy");
        assert!((0.0..=1.0).contains(&acc), "{wf}: {acc}");
        for p in ["p50", "p95", "p99"] {
            assert!(w["latency_s"][p].as_f64().is_some());
        }
    }
    // The breakdown partitions the pool's time over the makespan.
    let g = &json["gpu_seconds_total"];
    let sum: f64 = ["generation", "idle_resident", "loading", "other"]
        .iter()
        .map(|k| g[*k].as_f64().expect("number"))
        .sum();
    let expect = json["gpus"].as_f64().unwrap() * json["makespan_s"].as_f64().unwrap();
    assert!((sum - expect).abs() < 0.01 * expect.max(1.0), "{sum} vs {expect}");
    assert!(json["loads"].as_u64().unwrap() >= 1);
}

#[test]
fn another_seed_gives_another_trace() {
    let (a, _) = run_json(&[]);
    let (b, _) = run_json(&["--seed", "43"]);
    assert_ne!(a, b);
}

#[test]
fn the_baseline_runs_and_writes_a_timeline_and_a_trace() {
    let dir = tempfile::tempdir().expect("temp dir");
    let svg = dir.path().join("t.svg");
    let trace = dir.path().join("t.jsonl");
    let (_, json) = run_json(&[
        "--policy",
        "parrot",
        "--timeline",
        svg.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(json["policy"], "parrot");
    assert_eq!(json["sessions_completed"], 6);
    let svg = std::fs::read_to_string(&svg).expect("svg written");
    assert!(svg.contains("<svg") && svg.contains("gpu0"), "timeline rows are labelled");
    let trace = std::fs::read_to_string(&trace).expect("trace written");
    let first: serde_json::Value = serde_json::from_str(trace.lines().next().unwrap()).unwrap();
    assert_eq!(first["event"], "arrival");
    assert!(trace.lines().any(|l| l.contains("\"dispatch\"")));
}

#[test]
fn the_table_output_names_every_workflow() {
    let mut args = vec!["run"];
    args.extend(WORKFLOWS);
    args.extend(["--sessions", "1", "--pool", "workflows/pools/small.yaml"]);
    let out = switchyard(&args);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for w in ["gsm8k", "mbpp", "qmsum", "overall"] {
        assert!(text.contains(w), "{text}");
    }
    assert!(!text.contains("routed workflow"), "no routing table without a routed workflow: {text}");
    // A routed run's table output shows where its programs went (as `--json`'s `routing`).
    let out = switchyard(&["run", "workflows/gsm8k-routed.yaml", "--sessions", "12", "--arrival", "poisson:0.5"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = text.lines().filter(|l| l.contains("gsm8k-routed") && l.contains("Qwen3-")).collect();
    assert!(text.contains("routed workflow") && !rows.is_empty(), "{text}");
}

fn assert_bad(file: &str, needle: &str) {
    let path = Path::new("runtime/tests/fixtures").join(file);
    let out = switchyard(&["run", path.to_str().unwrap(), "--sessions", "1"]);
    assert!(!out.status.success(), "{file} must be rejected");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(file), "error names the file: {err}");
    // file:line:column
    let after = err.split(file).nth(1).unwrap_or("");
    assert!(after.starts_with(':') && after[1..].chars().next().is_some_and(|c| c.is_ascii_digit()), "{err}");
    assert!(err.to_lowercase().contains(needle), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_workflows_give_clear_errors() {
    assert_bad("bad_unknown_ref.yaml", "unknown");
    assert_bad("bad_cycle.yaml", "cycle");
    assert_bad("bad_type.yaml", "");
}

#[test]
fn validate_refuses_what_run_would_refuse_for_a_routed_run() {
    // Each file alone is sound; together the router cannot tell their verifiers apart: `run`
    // refuses them, so `validate` must too, naming the file and the field.
    for cmd in ["validate", "run"] {
        let out = switchyard(&[cmd, "workflows/gsm8k-routed.yaml", "workflows/gsm8k-judged.yaml", "--pool", "workflows/pools/paper.yaml"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd}: {stderr}");
        assert!(stderr.contains("workflows/gsm8k-judged.yaml: metric: its first request is also that of a workflow verified by"), "{cmd}: {stderr}");
    }
}

#[test]
fn validate_accepts_the_shipped_workflows() {
    let mut args = vec!["validate"];
    args.extend(WORKFLOWS);
    args.push("workflows/team.yaml");
    let out = switchyard(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // One line per workflow, then the pool check against the default (paper) pool.
    assert_eq!(stdout.lines().count(), 5, "{stdout}");
    assert!(stdout.ends_with("every deployment fits a device of pool workflows/pools/paper.yaml\n"), "{stdout}");
}

#[test]
fn bad_arguments_are_rejected() {
    let out = switchyard(&["run", "workflows/gsm8k.yaml", "--arrival", "uniform"]);
    assert!(!out.status.success());
    let out = switchyard(&["run", "workflows/gsm8k.yaml", "--pool", "no/such/pool.yaml"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no/such/pool.yaml"));
    let out = switchyard(&["run", "workflows/gsm8k-routed.yaml", "--single-verifier", "exact"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown verifier `exact` (known: gsm8k_exact"));
    let out = switchyard(&["run", "workflows/gsm8k-routed.yaml", "--cost-weight=-1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cost-weight"));
    // An output path that cannot be written is refused before the run, not after it.
    for flag in ["--timeline", "--trace"] {
        let out = switchyard(&["run", "workflows/gsm8k.yaml", "--sessions", "60", flag, "/nonexistent/dir/out"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains(&format!("{flag}: cannot create /nonexistent/dir/out")), "{stderr}");
        assert!(!stderr.contains("progress"), "the run started: {stderr}");
    }
}

#[test]
fn bench_motivation_writes_the_breakdown_beside_the_paper() {
    let out = std::env::temp_dir().join(format!("switchyard-motivation-{}", std::process::id()));
    let o = switchyard(&["bench", "motivation", "--sessions", "2", "--repetitions", "1", "--out", out.to_str().unwrap_or_default(), "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let policies: Vec<&str> = json["policies"].as_array().into_iter().flatten().filter_map(|p| p["policy"].as_str()).collect();
    assert_eq!(policies, ["parrot", "kairos"]);
    for p in json["policies"].as_array().into_iter().flatten() {
        assert!(p["gpu"]["loading"].as_f64().unwrap_or(0.0) > 0.0, "{p}");
        assert_eq!(p["qmsum_sessions"], 2);
    }
    let md = std::fs::read_to_string(out.join("motivation.md")).expect("motivation.md");
    assert!(md.contains("/ 3052 (") && md.contains("Re-acquire wait"), "{md}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn trace_replay_runs_the_sample_and_names_bad_lines() {
    let out = switchyard(&[
        "run",
        "--trace-replay",
        "workflows/traces/swe-lite-sample.jsonl",
        "--workers",
        "8",
        "--agent-pool",
        "qwen14b-a100x4",
        "--json",
    ]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(json["sessions"], 20);
    assert_eq!(json["scheduler"], "tao");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"id\": \"a\", \"system_tokens\": 10, \"turns\": [{\"new_tokens\": 5, \"output_tokens\": 3}]}\n\
         {\"id\": \"b\", \"system_tokens\": 10, \"turns\": [{\"new_tokens\": 5, \"output_tokens\": 3, \"tool\": {\"name\": \"bash\", \"duration_s\": 1}}, {\"new_tokens\": 5, \"output_tokens\": 0}]}\n",
    )
    .unwrap();
    let out = switchyard(&["run", "--trace-replay", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.jsonl:2: turns[1].output_tokens: must be at least 1"), "{err}");
}

#[test]
fn the_react_agent_runs_its_tool_loop_to_the_end() {
    let args = ["run", "workflows/react.yaml", "--sessions", "3", "--pool", "workflows/pools/small.yaml", "--json"];
    let out = switchyard(&args);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(json["sessions_completed"], 3, "{json}");
    assert_eq!(json["sessions_failed"], 0);
    let w = &json["workflows"]["react"];
    assert_eq!(w["sessions_completed"], 3, "{json}");
    let acc = w["accuracy"].as_f64().expect("accuracy");
    assert!((0.0..=1.0).contains(&acc), "{acc}");
    assert_eq!(switchyard(&args).stdout, out.stdout, "same seed, byte-identical report");
}

#[test]
fn bench_verifier_classifies_held_out_tasks_and_times_a_routing_decision() {
    let dir = tempfile::Builder::new().prefix("bench-verifier-").tempdir().expect("tempdir");
    let out_dir = dir.path().to_str().expect("utf-8 path");
    let out = switchyard(&["bench", "verifier", "--repetitions", "2", "--out", out_dir, "--json"]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let mixes = json.pointer("/report/mixes").and_then(|m| m.as_array()).expect("mixes");
    assert_eq!(mixes.len(), 2);
    for m in mixes {
        let acc = m["mean"].as_f64().expect("mean accuracy");
        // Three verifiers: a selector no better than chance would sit near 1/3.
        assert!(acc > 0.5 && acc <= 1.0, "{m}");
        let held: u64 = m["confusion"].as_array().unwrap().iter().flat_map(|r| r.as_array().unwrap()).map(|x| x.as_u64().unwrap()).sum();
        let tasks: u64 = m["tasks_per_verifier"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).sum();
        assert_eq!(held, 2 * (tasks - 3 * 5), "every task but the exemplars, twice: {m}");
    }
    assert!(json.pointer("/report/costs/route_p50_us").and_then(|v| v.as_f64()).is_some_and(|v| v > 0.0));
    assert!(dir.path().join("verifier.md").exists());
    let bad = switchyard(&["bench", "verifier", "--datasets", "no/such/dir", "--out", out_dir]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no/such/dir/gsm8k/test.jsonl"), "{}", String::from_utf8_lossy(&bad.stderr));
}

#[test]
fn bench_oracle_programs_prints_one_json_document_and_writes_its_files() {
    let dir = tempfile::Builder::new().prefix("bench-oracle-programs-").tempdir().expect("tempdir");
    let out_dir = dir.path().to_str().expect("utf-8 path");
    let out = switchyard(&[
        "bench", "oracle", "--only-programs", "--programs", "8", "--program-seeds", "1", "--out", out_dir, "--json",
    ]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    // One JSON document on stdout, holding the program experiments (the feedback comparison
    // was skipped).
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert!(json.get("feedback").is_none());
    let admission = json.pointer("/programs/admission").and_then(|a| a.as_array()).expect("admission cells");
    assert!(!admission.is_empty());
    assert!(admission.iter().all(|c| c["runs"][0]["programs"] == 8), "every program ran");
    for f in ["oracle-programs.md", "oracle-programs.json", "oracle-programs.svg"] {
        assert!(dir.path().join(f).exists(), "{f}");
    }
    assert!(!dir.path().join("oracle.md").exists() && !dir.path().join("oracle.svg").exists());
    let bad = switchyard(&["bench", "oracle", "--only-programs", "--programs", "0", "--out", out_dir]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--programs"));
}

#[test]
fn bench_oracle_feedback_prints_one_json_document_and_writes_its_files() {
    let dir = tempfile::Builder::new().prefix("bench-oracle-feedback-").tempdir().expect("tempdir");
    let out_dir = dir.path().to_str().expect("utf-8 path");
    let out = switchyard(&["bench", "oracle", "--only-feedback", "--sessions", "3", "--seeds", "1", "--out", out_dir, "--json"]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert!(json.get("programs").is_none(), "the concurrency experiments were skipped");
    let regret = json.pointer("/feedback/replay/adaptive/0/regret_by_pass").and_then(|r| r.as_array()).expect("regret by pass");
    assert_eq!(regret.len(), 8, "one per pass");
    for f in ["oracle.md", "oracle.json", "oracle.svg"] {
        assert!(dir.path().join(f).exists(), "{f}");
    }
    assert!(!dir.path().join("oracle-programs.md").exists());
    let both = switchyard(&["bench", "oracle", "--only-feedback", "--only-programs", "--out", out_dir]);
    assert!(!both.status.success(), "the two are exclusive");
}

#[test]
fn joint_only_flags_are_refused_with_another_policy() {
    let out = switchyard(&["run", "workflows/gsm8k.yaml", "--sessions", "1", "--policy", "parrot", "--no-fusion"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--no-fusion: applies to --policy joint only (this run: --policy parrot)"), "{err}");
    let out = switchyard(&["run", "workflows/gsm8k.yaml", "--sessions", "1", "--no-sleep"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-sleep: needs --sleep"));
    let out = switchyard(&["run", "--trace-replay", "workflows/traces/swe-lite-sample.jsonl", "--no-prefetch"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-prefetch: not read with --trace-replay"));
    // Flags another mode reads, refused rather than silently ignored.
    for (args, needle) in [
        (&["run", "--trace-replay", "workflows/traces/swe-lite-sample.jsonl", "--policy", "parrot"][..], "cannot be used with '--policy"),
        (&["run", "workflows/gsm8k.yaml", "--sessions", "1", "--deadline", "5"][..], "--live"),
        (&["run", "workflows/gsm8k.yaml", "--sessions", "1", "--no-stream"][..], "--live"),
        (&["run", "workflows/gsm8k.yaml", "--sessions", "1", "--scheduler", "dynamo"][..], "--scheduler: applies to --trace-replay only"),
        (&["run", "workflows/gsm8k.yaml", "--sessions", "1", "--workers", "3"][..], "--workers: applies to --trace-replay only"),
    ] {
        let out = switchyard(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{args:?}: {err}");
    }
    // `--live`'s own flags with `--trace-replay` (which conflicts with `--live`): refused, not
    // accepted and ignored (clap waives a requirement that conflicts with a given flag).
    for extra in [&["--deadline", "1"][..], &["--deadline", "nan"], &["--no-stream"]] {
        let mut args = vec!["run", "--trace-replay", "workflows/traces/swe-lite-sample.jsonl"];
        args.extend(extra);
        let out = switchyard(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("cannot be used with") && err.contains(extra[0]) && err.contains("--trace-replay"), "{args:?}: {err}");
    }
}

/// A dataset record a responder cannot read is refused before the run touches anything: an
/// existing `--trace` file keeps its bytes, no session starts, `validate` refuses it too.
#[test]
fn a_bad_dataset_record_is_refused_before_the_run_touches_its_outputs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = std::fs::read_to_string(root().join("workflows/gsm8k.yaml")).expect("gsm8k.yaml");
    std::fs::write(dir.path().join("gsm8k.yaml"), text).expect("write");
    std::fs::create_dir_all(dir.path().join("datasets/gsm8k")).expect("mkdir");
    std::fs::write(
        dir.path().join("datasets/gsm8k/test.jsonl"),
        "{\"question\": \"1+1?\", \"answer\": \"#### 2\"}\n{\"question\": {\"q\": \"hi\"}, \"answer\": \"#### 5\"}\n",
    )
    .expect("write");
    let trace = dir.path().join("old-trace.jsonl");
    std::fs::write(&trace, "kept\n").expect("write");
    let wf = dir.path().join("gsm8k.yaml");
    let (wf, trace_arg) = (wf.to_str().expect("utf-8"), trace.to_str().expect("utf-8"));
    let out = switchyard(&["run", wf, "--sessions", "1", "--pool", "workflows/pools/paper.yaml", "--trace", trace_arg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("dataset.fields.question") && stderr.contains("must be a string") && stderr.contains("found an object"), "{stderr}");
    assert!(!stderr.contains("sessions 0/"), "no progress before the error: {stderr}");
    assert_eq!(std::fs::read_to_string(&trace).expect("trace"), "kept\n");
    let out = switchyard(&["validate", wf, "--pool", "workflows/pools/paper.yaml"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("must be a string"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A replayed trace whose turns the agent pool cannot hold is refused before the replay, every
/// such turn named by file, line and field (was: the first one, by session id only).
#[test]
fn trace_turns_past_the_pools_context_are_all_named_by_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("t.jsonl");
    std::fs::write(
        &trace,
        "{\"id\":\"ok\",\"system_tokens\":100,\"turns\":[{\"new_tokens\":10,\"output_tokens\":10}]}\n\
         # a comment line\n\
         {\"id\":\"big\",\"system_tokens\":50000,\"turns\":[{\"new_tokens\":10,\"output_tokens\":10}]}\n\
         {\"id\":\"later\",\"system_tokens\":100,\"turns\":[{\"new_tokens\":10,\"output_tokens\":10,\"tool\":{\"name\":\"bash\",\"duration_s\":0.1}},{\"new_tokens\":60000,\"output_tokens\":10}]}\n",
    )
    .expect("write");
    let out = switchyard(&["run", "--trace-replay", trace.to_str().expect("utf-8"), "--workers", "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("t.jsonl:3: turns[0]: session `big`"), "{stderr}");
    assert!(stderr.contains("t.jsonl:4: turns[1]: session `later`"), "{stderr}");
}

/// `switchyard bench`'s counts and rates out of range are refused before any work, exit 1,
/// naming the flag; `--workload` without `--write-trace` and `--quick` with `--repetitions`
/// are refused rather than silently ignored.
#[test]
fn bench_refuses_counts_and_flags_it_would_ignore() {
    let dir = tempfile::Builder::new().prefix("bench-refuses-").tempdir().expect("tempdir");
    let out_dir = dir.path().to_str().expect("utf-8 path");
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "front-door", "--calls", "0", "--soak", "0", "--programs", "2", "--speed", "50"], "--calls"),
        (&["bench", "front-door", "--programs", "0", "--soak", "0", "--speed", "50"], "--programs"),
        (&["bench", "front-door", "--rounds", "0", "--soak", "0", "--programs", "2", "--calls", "1", "--speed", "50"], "--rounds"),
        (&["bench", "front-door", "--speed", "0", "--soak", "0"], "--speed"),
        (&["bench", "front-door", "--speed", "NaN", "--soak", "0"], "--speed"),
        (&["bench", "front-door", "--max-tokens", "0", "--soak", "0"], "--max-tokens"),
        (&["bench", "front-door", "--soak", "2", "--soak-tokens", "0"], "--soak-tokens"),
        (&["bench", "workflows/gsm8k.yaml", "--quick", "--sessions", "1", "--workers", "0", "--out", out_dir], "--workers"),
        (&["bench", "workflows/gsm8k.yaml", "--quick", "--sessions", "1", "--repetitions", "3", "--out", out_dir], "--repetitions"),
        (&["bench", "tao", "--workload", "swe-verified", "--quick", "--sessions", "1", "--workers", "1", "--no-ablations", "--out", out_dir], "--workload"),
        (&["bench", "tao", "--quick", "--sessions", "1", "--workers", "2,2", "--no-ablations", "--out", out_dir], "--workers: 2 is given twice"),
        (&["bench", "tao", "--quick", "--sessions", "1", "--workers", "1,100001", "--no-ablations", "--out", out_dir], "--workers: every value must be at most 100000"),
    ];
    for (args, flag) in cases {
        let out = switchyard(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?} should name {flag}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// `bench tao --write-trace` only writes the trace: the bench's own flags are refused with it
/// (they were accepted and ignored); its help and a note say which traces the replay's pools
/// cannot hold; an output path that cannot be written is named in the error.
#[test]
fn bench_tao_write_trace_refuses_the_bench_flags_and_names_its_paths() {
    let dir = tempfile::Builder::new().prefix("bench-tao-write-trace-").tempdir().expect("tempdir");
    let trace = dir.path().join("t.jsonl");
    let trace_arg = trace.to_str().expect("utf-8 path");
    for extra in [&["--quick"][..], &["--workers", "8"], &["--no-ablations"], &["--out", "elsewhere"], &["--json"]] {
        let mut args = vec!["bench", "tao", "--write-trace", trace_arg, "--sessions", "2"];
        args.extend(extra);
        let out = switchyard(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("cannot be used with") && err.contains(extra[0]), "{args:?}: {err}");
    }
    assert!(!trace.exists(), "a refused command writes nothing");

    // The trace of a thinking workload: written, with a note that the replay refuses it.
    let out = switchyard(&["bench", "tao", "--write-trace", trace_arg, "--workload", "swe-verified-thinking", "--sessions", "20"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("sessions need more than 40960 tokens in a call") && err.contains("the replay refuses this trace"), "{err}");
    let replay = switchyard(&["run", "--trace-replay", trace_arg]);
    assert!(!replay.status.success() && String::from_utf8_lossy(&replay.stderr).contains("max_model_len 40960"));
    let out = switchyard(&["bench", "tao", "--write-trace", trace_arg, "--workload", "swe-verified", "--sessions", "20"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("note:"), "{err}");
    let help = String::from_utf8_lossy(&switchyard(&["bench", "tao", "--help"]).stdout).to_string();
    assert!(help.contains("40,960") && help.contains("65,536"), "{help}");

    // Paths that cannot be written, named.
    let missing = dir.path().join("missing").join("x.jsonl");
    let out = switchyard(&["bench", "tao", "--write-trace", missing.to_str().expect("utf-8"), "--sessions", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("--write-trace: cannot write {}", missing.display())), "{err}");
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").expect("write");
    let file_arg = file.to_str().expect("utf-8");
    for args in [
        &["bench", "tao", "--quick", "--sessions", "1", "--workers", "1", "--no-ablations", "--out", file_arg][..],
        &["bench", "verifier", "--repetitions", "1", "--out", file_arg],
    ] {
        let out = switchyard(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(&format!("--out: cannot create the directory {file_arg}")), "{args:?}: {err}");
    }
}

/// `bench oracle` records the flags it ran with, as `bench verifier` and `bench predictor` do.
#[test]
fn bench_oracle_records_its_flags() {
    let dir = tempfile::Builder::new().prefix("bench-oracle-command-").tempdir().expect("tempdir");
    let out_dir = dir.path().to_str().expect("utf-8 path");
    let out = switchyard(&["bench", "oracle", "--only-programs", "--programs", "4", "--program-seeds", "1", "--out", out_dir, "--json"]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let want = "switchyard bench oracle --programs 4 --program-seeds 1 --only-programs";
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(json["command"], want);
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("oracle-programs.json")).expect("oracle-programs.json")).expect("JSON");
    assert_eq!(file["command"], want);
    let md = std::fs::read_to_string(dir.path().join("oracle-programs.md")).expect("oracle-programs.md");
    assert!(md.contains(want), "{md}");
}

/// `(read, written)` from the line `--tool-cache` prints on stderr.
fn tool_cache_tally(out: &Output) -> (u64, u64) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().find(|l| l.starts_with("tool cache ")).unwrap_or_else(|| panic!("no tally line: {stderr}"));
    let number = |after: &str| -> u64 {
        let words: Vec<&str> = line.split([' ', ',', ':']).filter(|w| !w.is_empty()).collect();
        let at = words.iter().position(|w| *w == after).unwrap_or_else(|| panic!("{line}"));
        words[at - 1].parse().unwrap_or_else(|_| panic!("{line}"))
    };
    (number("outcomes"), number("written"))
}

#[test]
fn a_tool_cache_answers_a_repeated_run_with_the_same_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let cache_arg = cache.to_str().expect("utf-8 path");
    let args = ["run", "workflows/mbpp.yaml", "--sessions", "3", "--pool", "workflows/pools/small.yaml", "--json"];
    let with_cache: Vec<&str> = args.iter().copied().chain(["--tool-cache", cache_arg]).collect();
    let first = switchyard(&with_cache);
    assert!(first.status.success(), "stderr: {}", String::from_utf8_lossy(&first.stderr));
    let (read, written) = tool_cache_tally(&first);
    assert_eq!(read, 0, "an empty cache answers nothing");
    assert!(written > 0, "the test runs are kept");
    let second = switchyard(&with_cache);
    assert!(second.status.success(), "stderr: {}", String::from_utf8_lossy(&second.stderr));
    // Which prefetched calls a run gets to before it ends depends on timing, and a timeout on a
    // loaded machine may be left out once: the repeated run reads, and runs fewer programs.
    let (read_again, written_again) = tool_cache_tally(&second);
    assert!(read_again > 0, "the repeated run takes outcomes from the cache");
    assert!(written_again < written, "and runs fewer programs ({written_again} written, {written} before)");
    assert_eq!(first.stdout, second.stdout, "the same report bytes");
    let without = switchyard(&args);
    assert!(without.status.success());
    assert_eq!(first.stdout, without.stdout, "the cache changes no result");

    // A directory others may write is refused before any session runs.
    use std::os::unix::fs::PermissionsExt;
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let shared_args: Vec<&str> = args.iter().copied().chain(["--tool-cache", shared.to_str().expect("utf-8")]).collect();
    let refused = switchyard(&shared_args);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--tool-cache") && stderr.contains("writable by group or others"), "{stderr}");
    assert!(refused.stdout.is_empty(), "no report");
}
