//! Journal cost (`runtime/src/live/journal.rs`): what durable sessions add per activation. Every
//! call returns once its redb write transaction is committed and `fsync`ed (a lone caller gets
//! one transaction per call; concurrent callers share group commits), on a tempdir (this
//! machine: ext4 on a virtual disk), so the numbers are dominated by the disk's flush latency.
//!
//! - `activation/llm`: one LLM activation = intent before the call + result after (two durable
//!   commits), with a ~1 KiB JSON result;
//! - `activation/tool`: the same for a tool call with a small verdict;
//! - `intent` and `result` alone;
//! - `activation/llm_8_threads`: eight callers journaling LLM activations at once, so their
//!   writes share group commits (time per activation);
//! - `session/3_activations`: a session's whole journal life: record, three activations, finish.
//!
//! Run with `cargo bench -p switchyard-runtime --bench journal` (add
//! `-- --warm-up-time 1 --measurement-time 5` for a quick look).
//! The numbers measured here are in `runtime/src/live/journal.rs`'s module doc ("Cost").

use std::cell::Cell;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use switchyard_runtime::live::journal::{ActivationKind, Journal, RunRecord, SessionOutcome, activation_key};

fn journal() -> (tempfile::TempDir, Journal) {
    let dir = tempfile::tempdir().expect("tempdir");
    let j = Journal::open(dir.path()).expect("open journal");
    j.record_run(&RunRecord {
        run_id: "bench".into(),
        workflow: "wf".into(),
        workflow_yaml: "name: wf\n".into(),
        sessions: 1,
        created_at_unix_ms: 0,
        drawn_from: None,
    })
    .expect("run");
    (dir, j)
}

fn bench(c: &mut Criterion) {
    let (_dir, j) = journal();
    let llm_result = json!({
        "text": "x".repeat(900),
        "prompt_tokens": 812,
        "completion_tokens": 211,
        "finish_reason": "stop",
    });
    let tool_result = json!({"verdict": "pass", "stdout": "ok", "duration_s": 0.12});
    // One session per 10,000 activations keeps sessions realistic in size; keys never repeat.
    let counter = Cell::new(0u64);
    let next = |j: &Journal| {
        let n = counter.get();
        counter.set(n + 1);
        let session = n / 10_000;
        if n.is_multiple_of(10_000) {
            j.record_session("bench", session, &json!({"q": session})).expect("session");
        }
        (session, activation_key("node", (n % 10_000) as u32))
    };

    let group_calls = Cell::new(0u64);
    let mut g = c.benchmark_group("activation");
    g.bench_function("llm", |b| {
        b.iter(|| {
            let (s, key) = next(&j);
            j.intend(s, &key, ActivationKind::Llm, "0123456789abcdef").expect("intend");
            j.complete(s, &key, &llm_result).expect("complete");
        })
    });
    g.bench_function("tool", |b| {
        b.iter(|| {
            let (s, key) = next(&j);
            j.intend(s, &key, ActivationKind::Tool, "0123456789abcdef").expect("intend");
            j.complete(s, &key, &tool_result).expect("complete");
        })
    });
    // Eight callers at once (sessions running concurrently in a server): the committer groups
    // their writes into one transaction and one fsync; the time is per activation.
    g.bench_function("llm_8_threads", |b| {
        b.iter_custom(|iters| {
            let per_thread = iters.div_ceil(8);
            let first = group_calls.get();
            group_calls.set(first + 1);
            let start = std::time::Instant::now();
            std::thread::scope(|scope| {
                for t in 0..8u64 {
                    let (j, llm_result) = (&j, &llm_result);
                    scope.spawn(move || {
                        let s = 2_000_000 + first * 8 + t;
                        j.record_session("bench", s, &json!({"q": s})).expect("session");
                        for n in 0..per_thread {
                            let key = activation_key("node", n as u32);
                            j.intend(s, &key, ActivationKind::Llm, "0123456789abcdef").expect("intend");
                            j.complete(s, &key, llm_result).expect("complete");
                        }
                    });
                }
            });
            start.elapsed().mul_f64(iters as f64 / (8 * per_thread) as f64)
        })
    });
    g.finish();

    c.bench_function("intent", |b| {
        b.iter(|| {
            let (s, key) = next(&j);
            j.intend(s, &key, ActivationKind::Llm, "0123456789abcdef").expect("intend");
        })
    });
    // Results for intents made outside the timed part.
    c.bench_function("result", |b| {
        b.iter_batched(
            || {
                let (s, key) = next(&j);
                j.intend(s, &key, ActivationKind::Llm, "0123456789abcdef").expect("intend");
                (s, key)
            },
            |(s, key)| j.complete(s, &key, &llm_result).expect("complete"),
            criterion::BatchSize::SmallInput,
        )
    });

    let sessions = Cell::new(1_000_000u64);
    c.bench_function("session/3_activations", |b| {
        b.iter(|| {
            let s = sessions.get();
            sessions.set(s + 1);
            j.record_session("bench", s, &json!({"q": s})).expect("session");
            for (i, node) in ["plan", "code", "test"].iter().enumerate() {
                let key = activation_key(node, 0);
                let kind = if i == 2 { ActivationKind::Tool } else { ActivationKind::Llm };
                j.intend(s, &key, kind, "0123456789abcdef").expect("intend");
                j.complete(s, &key, if i == 2 { &tool_result } else { &llm_result }).expect("complete");
            }
            j.finish_session(s, &SessionOutcome::Completed { output: json!("done") }).expect("finish");
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
