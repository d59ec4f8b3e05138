//! MBPP responders against a real Python interpreter: the reference solutions pass their
//! asserts, and the mutants `mbpp.generate` writes instead actually fail them. Skipped (with a
//! message) when `python3` is not installed.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchyard_runtime::responder::{extract_code, respond, ResponderRequest};
use switchyard_runtime::values::{LengthDist, Record};

fn python3_available() -> bool {
    Command::new("python3").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Run `imports + code + asserts` in a fresh interpreter; true when every assert held. A run
/// longer than `limit` (a mutant that loops forever) counts as a failure.
fn passes(code: &str, imports: &[String], tests: &[String], limit: Duration) -> bool {
    let mut script = tempfile::NamedTempFile::new().unwrap_or_else(|e| panic!("temp file: {e}"));
    let body = format!("{}\n{}\n{}\n", imports.join("\n"), code, tests.join("\n"));
    script.write_all(body.as_bytes()).unwrap_or_else(|e| panic!("write: {e}"));
    let mut child = Command::new("python3")
        .args(["-I", "-S", "-B"])
        .arg(script.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn python3: {e}"));
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.success(),
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("wait: {e}"),
        }
    }
}

struct Task {
    record: Record,
    code: String,
    imports: Vec<String>,
    tests: Vec<String>,
}

fn task(v: Value) -> Task {
    let record: Record = serde_json::from_value(v).unwrap_or_else(|e| panic!("record: {e}"));
    let strings = |k: &str| -> Vec<String> {
        record.get(k).and_then(Value::as_array).map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect()).unwrap_or_default()
    };
    Task {
        code: record.get("code").and_then(Value::as_str).unwrap_or_default().to_string(),
        imports: strings("test_imports"),
        tests: strings("test_list"),
        record,
    }
}

/// A few tasks copied verbatim from sanitized MBPP (Austin et al., 2021; task ids 2, 3, 17, 57,
/// 62, 70, 160, 230, 600).
fn tasks() -> Vec<Task> {
    [
        json!({"task_id": 2, "prompt": "Write a function to find the shared elements from the given two lists.", "code": "def similar_elements(test_tup1, test_tup2):\n  res = tuple(set(test_tup1) & set(test_tup2))\n  return (res) ", "test_imports": [], "test_list": ["assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))", "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))", "assert set(similar_elements((11, 12, 14, 13),(17, 15, 14, 13))) == set((13, 14))"]}),
        json!({"task_id": 3, "prompt": "Write a python function to identify non-prime numbers.", "code": "import math\ndef is_not_prime(n):\n    result = False\n    for i in range(2,int(math.sqrt(n)) + 1):\n        if n % i == 0:\n            result = True\n    return result", "test_imports": [], "test_list": ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True", "assert is_not_prime(35) == True", "assert is_not_prime(37) == False"]}),
        json!({"task_id": 17, "prompt": "Write a function that returns the perimeter of a square given its side length as input.", "code": "def square_perimeter(a):\n  perimeter=4*a\n  return perimeter", "test_imports": [], "test_list": ["assert square_perimeter(10)==40", "assert square_perimeter(5)==20", "assert square_perimeter(4)==16"]}),
        json!({"task_id": 57, "prompt": "Write a python function to find the largest number that can be formed with the given list of digits.", "code": "def find_Max_Num(arr) : \n    n = len(arr)\n    arr.sort(reverse = True) \n    num = arr[0] \n    for i in range(1,n) : \n        num = num * 10 + arr[i] \n    return num ", "test_imports": [], "test_list": ["assert find_Max_Num([1,2,3]) == 321", "assert find_Max_Num([4,5,6,1]) == 6541", "assert find_Max_Num([1,2,3,9]) == 9321"]}),
        json!({"task_id": 62, "prompt": "Write a python function to find smallest number in a list.", "code": "def smallest_num(xs):\n  return min(xs)\n", "test_imports": [], "test_list": ["assert smallest_num([10, 20, 1, 45, 99]) == 1", "assert smallest_num([1, 2, 3]) == 1", "assert smallest_num([45, 46, 50, 60]) == 45"]}),
        json!({"task_id": 70, "prompt": "Write a function to find whether all the given tuples have equal length or not.", "code": "def find_equal_tuple(Input):\n  k = 0 if not Input else len(Input[0])\n  flag = 1\n  for tuple in Input:\n    if len(tuple) != k:\n      flag = 0\n      break\n  return flag\ndef get_equal(Input):\n  return find_equal_tuple(Input) == 1", "test_imports": [], "test_list": ["assert get_equal([(11, 22, 33), (44, 55, 66)]) == True", "assert get_equal([(1, 2, 3), (4, 5, 6, 7)]) == False", "assert get_equal([(1, 2), (3, 4)]) == True"]}),
        json!({"task_id": 160, "prompt": "Write a function that returns integers x and y that satisfy ax + by = n as a tuple, or return None if no solution exists.", "code": "def find_solution(a, b, n):\n\ti = 0\n\twhile i * a <= n:\n\t\tif (n - (i * a)) % b == 0: \n\t\t\treturn (i, (n - (i * a)) // b)\n\t\ti = i + 1\n\treturn None", "test_imports": [], "test_list": ["assert find_solution(2, 3, 7) == (2, 1)", "assert find_solution(4, 2, 7) == None", "assert find_solution(1, 13, 17) == (4, 1)"]}),
        json!({"task_id": 230, "prompt": "Write a function that takes in a string and character, replaces blank spaces in the string with the character, and returns the string.", "code": "def replace_blank(str1,char):\n str2 = str1.replace(' ', char)\n return str2", "test_imports": [], "test_list": ["assert replace_blank(\"hello people\",'@')==(\"hello@people\")", "assert replace_blank(\"python program language\",'$')==(\"python$program$language\")", "assert replace_blank(\"blank space\",\"-\")==(\"blank-space\")"]}),
        json!({"task_id": 600, "prompt": "Write a python function to check whether the given number is even or not.", "code": "def is_Even(n) : \n    if (n^1 == n+1) :\n        return True; \n    else :\n        return False; ", "test_imports": [], "test_list": ["assert is_Even(1) == False", "assert is_Even(2) == True", "assert is_Even(3) == False"]}),
    ]
    .into_iter()
    .map(task)
    .collect()
}

/// The wrong programs `mbpp.generate` writes for `record` over `seeds` (Qwen3-0.6B, the model
/// that errs most), one per wrong draw, with the mutation operator of each.
fn mutants(record: &Record, seeds: std::ops::Range<u64>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for seed in seeds {
        let req = ResponderRequest {
            responder: "mbpp.generate",
            node: "generate",
            model: "Qwen3-0.6B",
            input: record,
            prompt: "Write the function.",
            upstream: &[],
            length: LengthDist { mean: 400.0, cv: 0.0 },
            max_output_tokens: 1024,
            seed,
            role: None,
            schema: None,
            verdict_field: None,
        };
        let out_node = respond(&req).unwrap_or_else(|e| panic!("respond: {e}"));
        if out_node.value["intended_correct"] == json!(false) {
            let op = out_node.value["mutation"].as_str().unwrap_or("?").to_string();
            out.push((extract_code(&out_node.text), op));
        }
    }
    out
}

#[test]
fn references_pass_and_mutants_fail_their_asserts() {
    if !python3_available() {
        eprintln!("python3 not found: skipping the execution check of MBPP mutants");
        return;
    }
    let limit = Duration::from_secs(5);
    let mut total = 0;
    let mut killed = 0;
    let mut survivors = BTreeMap::new();
    for t in tasks() {
        assert!(passes(&t.code, &t.imports, &t.tests, limit), "reference of {:?} fails", t.record.get("task_id"));
        let ms = mutants(&t.record, 0..60);
        assert!(!ms.is_empty(), "no mutant for {:?}", t.record.get("task_id"));
        let mut verdicts: BTreeMap<String, bool> = BTreeMap::new();
        for (code, op) in &ms {
            assert_ne!(code.trim(), t.code.trim());
            let passed = *verdicts.entry(code.clone()).or_insert_with(|| passes(code, &t.imports, &t.tests, limit));
            total += 1;
            if passed {
                survivors.insert(code.clone(), format!("task {:?} [{op}]", t.record.get("task_id")));
            } else {
                killed += 1;
            }
        }
    }
    // Per wrong draw, not per distinct program: this is the chance that a "wrong" generation
    // really fails. A few mutants survive MBPP's weak asserts (as EvalPlus showed real wrong
    // programs do), so the bar is high but not 1.
    let rate = killed as f64 / total as f64;
    eprintln!("{killed}/{total} wrong draws fail their tests ({rate:.3})");
    let list: Vec<String> = survivors.iter().map(|(c, t)| format!("{t}:\n{c}")).collect();
    assert!(rate >= 0.85, "only {killed}/{total} wrong draws fail; survivors:\n{}", list.join("\n---\n"));
}

/// Whole-dataset measurement (slow: one interpreter per mutant). Run with
/// `MBPP_JSON=path/to/sanitized-mbpp.json cargo test -p switchyard-runtime --test
/// responder_mbpp_python -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_mutant_kill_rate_on_the_dataset() {
    let path = std::env::var("MBPP_JSON")
        .unwrap_or_else(|_| format!("{}/../workflows/datasets/mbpp/sanitized-mbpp.json", env!("CARGO_MANIFEST_DIR")));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let data: Vec<Value> = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let limit = Duration::from_secs(5);
    let mut per_op: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    let mut no_mutant = 0;
    for v in data {
        let t = task(v);
        if !passes(&t.code, &t.imports, &t.tests, limit) {
            continue;
        }
        let ms = mutants(&t.record, 0..12);
        if ms.is_empty() {
            no_mutant += 1;
        }
        let mut verdicts: BTreeMap<String, bool> = BTreeMap::new();
        for (code, op) in ms {
            let passed = *verdicts.entry(code.clone()).or_insert_with(|| passes(&code, &t.imports, &t.tests, limit));
            let e = per_op.entry(op).or_insert((0, 0));
            e.1 += 1;
            if !passed {
                e.0 += 1;
            }
        }
    }
    let (k, n) = per_op.values().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    for (op, (k, n)) in &per_op {
        eprintln!("{op:>16}: {k}/{n} killed ({:.3})", *k as f64 / *n as f64);
    }
    eprintln!("all: {k}/{n} killed ({:.3}); tasks without a mutant: {no_mutant}", k as f64 / n as f64);
}
