//! Measures the cost of the built-in tools on this machine and prints the medians behind the
//! `MODEL_*` constants of `switchyard_tools::python_tests` and the majority-vote constant.
//!
//! Run: `cargo run -p switchyard-tools --example tool_durations [runs]` (default 20 runs per case).
//! Then checks the model against reference solutions of the MBPP dataset, when present, and,
//! when the CPython-on-WASI runtime is installed, measures the same calls in the wasm sandbox.
//! The model constants describe the process sandbox (the fallback every machine has), so
//! virtual time does not depend on whether the wasm runtime is installed.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::{Value, json};
use switchyard_tools::python_tests::{
    self, Backend, MODEL_PER_IMPORT_S, MODEL_PER_KIB_S, MODEL_PER_TEST_S, MODEL_STARTUP_S, PythonTests,
};
use switchyard_tools::sandbox::{IsolationPolicy, ProcessSandbox, Sandbox, SandboxJob, SandboxLimits};
use switchyard_tools::{ToolCall, majority_vote, modeled_duration_s, python3_available, run_tool};

fn call(tool: &str, inputs: Value) -> ToolCall {
    let inputs: BTreeMap<String, Value> = serde_json::from_value(inputs).unwrap_or_default();
    ToolCall { tool: tool.into(), inputs, timeout_s: None }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 { xs[n / 2] } else { (xs[n / 2 - 1] + xs[n / 2]) / 2.0 }
}

/// Median wall time of `runs` calls in the process sandbox (after one warm-up call).
fn measure(call: &ToolCall, runs: usize) -> f64 {
    measure_with(call, runs, Backend::Process)
}

/// Median wall time of `runs` calls with `backend` (after one warm-up call).
fn measure_with(call: &ToolCall, runs: usize, backend: Backend) -> f64 {
    let check = python_tests::run_with(call, backend);
    match &check {
        Ok(out) if out.verdict.as_deref() == Some("pass") => {}
        other => eprintln!("warning: calibration case did not pass: {other:?}"),
    }
    median((0..runs).filter_map(|_| python_tests::run_with(call, backend).ok().map(|o| o.wall_seconds)).collect())
}

/// Least-squares slope of y over x.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    sxy / sxx
}

fn tests_case(n: usize) -> ToolCall {
    let tests: Vec<String> = (0..n).map(|i| format!("assert f({i}) == {}", 2 * i)).collect();
    call("python_tests", json!({"code": "def f(x):\n    return 2 * x\n", "tests": tests}))
}

fn code_case(kib: usize) -> (ToolCall, f64) {
    let mut code = String::from("def f(x):\n    return 2 * x\n");
    let mut i = 0;
    while code.len() < kib * 1024 {
        code.push_str(&format!("def g{i}(a, b):\n    c = a * {i} + b\n    return [c, a, b, {i}]\n"));
        i += 1;
    }
    let bytes = code.len() + "assert f(1) == 2".len();
    (call("python_tests", json!({"code": code, "tests": ["assert f(1) == 2"]})), bytes as f64 / 1024.0)
}

fn main() {
    let runs: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);

    let vote = call("majority_vote", json!({"candidates": ["#### 18", "#### 17", "x 18", "#### 18.00", "no"]}));
    let vote_median = median((0..1000).filter_map(|_| run_tool(&vote).ok().map(|o| o.wall_seconds)).collect());
    let candidates: Vec<Option<String>> =
        ["#### 18", "#### 17", "x 18", "#### 18.00", "no"].iter().map(|c| Some(c.to_string())).collect();
    let reference_median = median(
        (0..1000)
            .map(|_| {
                let started = Instant::now();
                std::hint::black_box(majority_vote::vote(&candidates, majority_vote::Extract::Gsm8k));
                started.elapsed().as_secs_f64()
            })
            .collect(),
    );
    println!(
        "majority_vote: median {:.1} µs per tool call over 1000 calls (vote in the wasm sandbox); \
         in-process reference vote {:.1} µs",
        vote_median * 1e6,
        reference_median * 1e6
    );

    println!("process sandbox overhead: medians of {runs} runs of /bin/true");
    for (label, policy) in [
        ("full isolation", IsolationPolicy::default()),
        ("no network namespace", IsolationPolicy { network: false, ..IsolationPolicy::default() }),
        ("no mount namespace", IsolationPolicy { private_root: false, ..IsolationPolicy::default() }),
        ("rlimits + uid only", IsolationPolicy { network: false, private_root: false, ..IsolationPolicy::default() }),
    ] {
        let sandbox = ProcessSandbox::with_policy(policy);
        let job = SandboxJob {
            program: "/bin/true".into(),
            args: vec![],
            files: vec![],
            limits: SandboxLimits::default(),
            read_only_paths: switchyard_tools::sandbox::system_paths(),
            allow_children: false,
        };
        let m = median((0..runs).filter_map(|_| sandbox.run(&job).ok().map(|o| o.wall_seconds)).collect());
        println!("  {label:<22} {:>7.2} ms", m * 1e3);
    }

    // Forking copies the caller's page tables, so a sandboxed call costs more from a caller with
    // more memory resident: measure the whole call from this process with ballast touched.
    println!("process sandbox, whole call of /bin/true by caller resident memory: medians of {runs} runs");
    let job = SandboxJob::new("/bin/true", vec![]);
    let sandbox = ProcessSandbox::new();
    for ballast_mib in [0usize, 100, 300] {
        let ballast = vec![1u8; ballast_mib << 20];
        let m = median(
            (0..runs)
                .filter_map(|_| {
                    let started = std::time::Instant::now();
                    sandbox.run(&job).ok().map(|_| started.elapsed().as_secs_f64())
                })
                .collect(),
        );
        let touched: usize = ballast.iter().step_by(4096).map(|&b| usize::from(b)).sum();
        println!("  {ballast_mib:>4} MiB resident ({touched} pages)  {:>7.2} ms", m * 1e3);
    }

    if !python3_available() {
        println!("python3 is not usable in the sandbox here; nothing more to measure");
        return;
    }
    println!("python_tests: medians of {runs} runs each (wall time of the whole tool call)");
    let mut test_points = Vec::new();
    for n in [1usize, 8, 32] {
        let m = measure(&tests_case(n), runs);
        println!("  {n:>3} trivial tests          {:>7.2} ms", m * 1e3);
        test_points.push((n as f64, m));
    }
    let mut code_points = Vec::new();
    for kib in [0usize, 16, 64] {
        let (c, size) = code_case(kib);
        let m = measure(&c, runs);
        println!("  {size:>6.1} KiB of source      {:>7.2} ms", m * 1e3);
        code_points.push((size, m));
    }
    let import_case = call(
        "python_tests",
        json!({"code": "def f(x):\n    return 2 * x\n", "tests": ["assert f(0) == 0"], "imports": ["import math"]}),
    );
    let with_import = measure(&import_case, runs);
    println!("  1 test + `import math`     {:>7.2} ms", with_import * 1e3);

    let per_test = slope(&test_points);
    let per_kib = slope(&code_points);
    let one_test = test_points[0].1;
    let one_test_kib = code_points[0].0;
    let startup = one_test - per_test - per_kib * one_test_kib;
    let per_import = (with_import - one_test).max(0.0);
    println!("fitted: startup {:.4} s, per test {:.6} s, per KiB {:.6} s, per import {:.5} s", startup, per_test, per_kib, per_import);
    println!(
        "in use: startup {MODEL_STARTUP_S:.4} s, per test {MODEL_PER_TEST_S:.6} s, per KiB {MODEL_PER_KIB_S:.6} s, per import {MODEL_PER_IMPORT_S:.5} s"
    );

    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../workflows/datasets/mbpp/sanitized-mbpp.json");
    let Ok(text) = std::fs::read_to_string(path) else { return };
    let Ok(problems) = serde_json::from_str::<Vec<Value>>(&text) else { return };
    let (mut passed, mut errors, mut total, mut measured_sum, mut modeled_sum) = (0, Vec::new(), 0, 0.0, 0.0);
    let mut measured_all = Vec::new();
    let started = Instant::now();
    for p in &problems {
        let c = call("python_tests", json!({"code": p["code"], "tests": p["test_list"], "imports": p["test_imports"]}));
        let Ok(out) = python_tests::run_with(&c, Backend::Process) else { continue };
        total += 1;
        if out.verdict.as_deref() == Some("pass") {
            passed += 1;
        } else {
            println!("  reference solution of task {} failed: {}", p["task_id"], out.text);
        }
        let modeled = modeled_duration_s(&c);
        debug_assert_eq!(Some(modeled), PythonTests::from_call(&c).ok().map(|j| j.modeled_duration_s()));
        errors.push((out.wall_seconds - modeled).abs() / out.wall_seconds);
        measured_sum += out.wall_seconds;
        measured_all.push(out.wall_seconds);
        modeled_sum += modeled;
    }
    println!(
        "MBPP reference solutions: {passed}/{total} pass; {:.1} s for all; measured mean {:.2} ms, median {:.2} ms per call; \
         modeled/measured total {:.3}; median relative error {:.1} %",
        started.elapsed().as_secs_f64(),
        measured_sum / total as f64 * 1e3,
        median(measured_all) * 1e3,
        modeled_sum / measured_sum,
        median(errors) * 100.0
    );

    compare_wasm(&problems, runs);
}

/// The same calls in CPython on WASI, when its runtime is installed.
fn compare_wasm(problems: &[Value], runs: usize) {
    if let Err(reason) = python_tests::wasm_runtime() {
        println!("wasm sandbox: not measured ({reason})");
        return;
    }
    println!("python_tests in the wasm sandbox vs the process sandbox: medians of {runs} runs");
    for n in [1usize, 32] {
        let wasm = measure_with(&tests_case(n), runs, Backend::Wasm);
        let process = measure(&tests_case(n), runs);
        println!("  {n:>3} trivial tests   wasm {:>8.2} ms   process {:>7.2} ms", wasm * 1e3, process * 1e3);
    }
    let (mut passed, mut total, mut wall) = (0, 0, Vec::new());
    let started = Instant::now();
    for p in problems {
        let c = call("python_tests", json!({"code": p["code"], "tests": p["test_list"], "imports": p["test_imports"]}));
        let Ok(out) = python_tests::run_with(&c, Backend::Wasm) else { continue };
        total += 1;
        if out.verdict.as_deref() == Some("pass") {
            passed += 1;
        } else {
            println!("  wasm: reference solution of task {} failed: {}", p["task_id"], out.text);
        }
        wall.push(out.wall_seconds);
    }
    println!(
        "MBPP reference solutions in wasm: {passed}/{total} pass; {:.1} s for all; median {:.2} ms per call",
        started.elapsed().as_secs_f64(),
        median(wall) * 1e3
    );
}
