//! The journal's rules, one test each, and a property test of random operation sequences
//! (with reopenings between them) against a model of the rules.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::json;

use super::*;

fn run(id: &str) -> RunRecord {
    RunRecord {
        run_id: id.to_string(),
        workflow: "wf".to_string(),
        workflow_yaml: "name: wf\n".to_string(),
        sessions: 3,
        created_at_unix_ms: 1_700_000_000_000,
        drawn_from: None,
    }
}

fn fresh() -> (tempfile::TempDir, Journal) {
    let dir = tempfile::tempdir().expect("tempdir");
    let j = Journal::open(&dir.path().join("state")).expect("open");
    (dir, j)
}

fn with_session(j: &Journal, session: u64) {
    j.record_run(&run("r1")).expect("run");
    j.record_session("r1", session, &json!({"q": session})).expect("session");
}

#[test]
fn open_creates_the_file_and_a_reopen_keeps_everything() {
    let (dir, j) = fresh();
    assert!(j.path().ends_with(FILE_NAME) && j.path().exists());
    with_session(&j, 7);
    assert_eq!(j.intend(7, "a#0", ActivationKind::Llm, "d").expect("intend"), Attempt(1));
    j.complete(7, "a#0", &json!("out")).expect("complete");
    drop(j);
    let j = Journal::open(&dir.path().join("state")).expect("reopen");
    assert_eq!(j.runs().expect("runs"), vec![run("r1")]);
    assert_eq!(j.run("r1").expect("run"), Some(run("r1")));
    assert_eq!(j.run("nope").expect("run"), None);
    let s = j.session(7).expect("session").expect("recorded");
    assert_eq!((s.run_id.as_str(), s.inputs, s.outcome), ("r1", json!({"q": 7}), None));
    assert_eq!(
        j.activation(7, "a#0").expect("activation"),
        Some(ActivationState::Completed(CompletedActivation {
            key: "a#0".into(),
            kind: ActivationKind::Llm,
            attempts: 1,
            result: json!("out")
        }))
    );
}

#[test]
fn the_journal_and_its_directory_are_their_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
    let (dir, j) = fresh();
    let state = dir.path().join("state");
    assert_eq!((mode(&state), mode(j.path())), (0o700, 0o600));
    // A journal left world-readable (by an older version, or by hand) is tightened at open.
    let path = j.path().to_path_buf();
    drop(j);
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
    let j = Journal::open(&state).expect("reopen");
    assert_eq!(mode(j.path()), 0o600);
}

#[test]
fn a_state_directory_or_journal_another_user_could_read_or_swap_is_refused() {
    use std::os::unix::fs::{PermissionsExt, symlink};
    let refused = |state: &Path, what: &str| match Journal::open(state) {
        Err(e @ JournalError::NotPrivate { .. }) => assert!(e.to_string().contains(what), "{e}"),
        other => panic!("{}: expected a refusal naming {what:?}, got {other:?}", state.display()),
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // A directory other users may write in: they could swap the file.
    let open = dir.path().join("open");
    fs::create_dir(&open).expect("mkdir");
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).expect("chmod");
    refused(&open, "other users may write in it");
    assert!(!open.join(FILE_NAME).exists(), "nothing is created in a refused directory");
    // A journal path that is a link (to a file the server would then write through).
    let linked = dir.path().join("linked");
    fs::create_dir(&linked).expect("mkdir");
    fs::write(dir.path().join("elsewhere"), b"").expect("write");
    symlink(dir.path().join("elsewhere"), linked.join(FILE_NAME)).expect("symlink");
    refused(&linked, "not a regular file");
    // Another user's directory, and another user's file in ours (chown needs root; skipped
    // otherwise).
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let theirs = dir.path().join("theirs");
        fs::create_dir(&theirs).expect("mkdir");
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
        refused(&theirs, "belongs to uid 65534");
        let planted = dir.path().join("planted");
        fs::create_dir(&planted).expect("mkdir");
        fs::write(planted.join(FILE_NAME), b"").expect("write");
        std::os::unix::fs::chown(planted.join(FILE_NAME), Some(65534), Some(65534)).expect("chown");
        refused(&planted, "belongs to uid 65534");
    }
}

#[test]
fn a_run_recorded_again_is_a_no_op_and_a_different_one_is_refused() {
    let (_d, j) = fresh();
    j.record_run(&run("r1")).expect("first");
    j.record_run(&run("r1")).expect("same again");
    let other = RunRecord { sessions: 4, ..run("r1") };
    assert!(matches!(j.record_run(&other), Err(JournalError::RunConflict { run_id }) if run_id == "r1"));
    assert_eq!(j.run("r1").expect("run"), Some(run("r1")));
    assert!(matches!(j.record_run(&run("")), Err(JournalError::InvalidKey { .. })));
}

#[test]
fn a_runs_dataset_draw_is_kept_and_older_rows_read_without_one() {
    let (_d, j) = fresh();
    let drawn = RunRecord { drawn_from: Some(7), ..run("r1") };
    j.record_run(&drawn).expect("record");
    assert_eq!(j.run("r1").expect("run"), Some(drawn));
    // A row written before the field existed reads as a run with inputs given.
    let old: RunRow = decode(|| "old row".into(), r#"{"workflow":"wf","workflow_yaml":"name: wf\n","sessions":3,"created_at_unix_ms":5}"#)
        .expect("old row");
    assert_eq!(old.drawn_from, None);
    // And a run with inputs writes no field at all (rows stay as they were).
    let text = encode(|| "row".into(), &old).expect("encode");
    assert!(!text.contains("drawn_from"), "{text}");
}

#[test]
fn a_sessions_end_time_is_kept_and_older_rows_read_without_one() {
    let (_d, j) = fresh();
    with_session(&j, 1);
    let before = unix_ms_now();
    j.finish_session(1, &SessionOutcome::Completed { output: json!("done") }).expect("finish");
    let ends = j.session_ends_of_runs(&BTreeSet::from(["r1".to_string()])).expect("ends");
    let at = ends["r1"][0].finished_at_unix_ms.expect("an end time");
    assert!(at >= before && at <= unix_ms_now(), "{at} not in [{before}, now]");
    // A row finished before the field existed reads with no time (and an unfinished row
    // writes none: rows stay as they were).
    let old: SessionRow = decode(|| "old row".into(), r#"{"run_id":"r1","inputs":{},"outcome":{"outcome":"cancelled"},"finished_seq":4}"#)
        .expect("old row");
    assert_eq!((old.outcome, old.finished_at_unix_ms), (Some(SessionOutcome::Cancelled), None));
    let open = SessionRow { run_id: "r1".into(), inputs: json!({}), outcome: None, finished_seq: None, finished_at_unix_ms: None };
    let text = encode(|| "row".into(), &open).expect("encode");
    assert!(!text.contains("finished_at"), "{text}");
}

#[test]
fn sessions_need_their_run_and_cannot_change() {
    let (_d, j) = fresh();
    assert!(matches!(j.record_session("r1", 1, &json!(1)), Err(JournalError::UnknownRun(r)) if r == "r1"));
    j.record_run(&run("r1")).expect("run");
    j.record_run(&run("r2")).expect("run");
    j.record_session("r1", 1, &json!(1)).expect("session");
    j.record_session("r1", 1, &json!(1)).expect("same again");
    assert!(matches!(j.record_session("r1", 1, &json!(2)), Err(JournalError::SessionConflict { session: 1, .. })));
    assert!(matches!(j.record_session("r2", 1, &json!(1)), Err(JournalError::SessionConflict { .. })));
    assert_eq!(j.session(1).expect("session").map(|s| s.inputs), Some(json!(1)));
}

#[test]
fn a_run_and_its_sessions_are_recorded_whole_or_not_at_all() {
    let (_d, j) = fresh();
    let sessions = |ns: &[u64]| ns.iter().map(|&n| (n, json!({"q": n}))).collect::<Vec<_>>();
    j.record_run_with_sessions(&run("r1"), sessions(&[1, 2, 3])).expect("record");
    j.record_run_with_sessions(&run("r1"), sessions(&[1, 2, 3])).expect("the same again");
    assert_eq!(j.stats().expect("stats").sessions, 3);
    assert_eq!(j.unfinished().expect("unfinished").len(), 3);
    // A session already recorded with other inputs: refused, and nothing of run r2 is written.
    let mut clash = sessions(&[4]);
    clash.push((2, json!({"q": "other"})));
    assert!(matches!(j.record_run_with_sessions(&run("r2"), clash), Err(JournalError::SessionConflict { session: 2, .. })));
    assert!(j.run("r2").expect("run").is_none());
    assert!(j.session(4).expect("session").is_none());
    assert_eq!(j.stats().expect("stats").sessions, 3);
    // Ended sessions by run, in one scan.
    j.record_run_with_sessions(&run("r3"), sessions(&[7])).expect("r3");
    let failed = SessionOutcome::Failed { reason: "x".into() };
    j.finish_session(2, &failed).expect("finish");
    j.finish_session(7, &failed).expect("finish");
    let counts = j.ended_counts_by_run().expect("counts");
    assert_eq!(counts.into_iter().collect::<Vec<_>>(), [("r1".to_string(), 1), ("r3".to_string(), 1)]);
    let all: BTreeSet<String> = ["r1", "r2", "r3"].map(String::from).into();
    let by_run = j.session_outcomes_of_runs(&all).expect("by run");
    assert_eq!(by_run.keys().collect::<Vec<_>>(), ["r1", "r3"]);
    assert_eq!((by_run["r1"][0].0, by_run["r3"][0].0, by_run["r1"].len()), (2, 7, 1));
    // Only the runs asked for are read back.
    let only_r3 = j.session_outcomes_of_runs(&BTreeSet::from(["r3".to_string()])).expect("r3 only");
    assert_eq!(only_r3.keys().collect::<Vec<_>>(), ["r3"]);
}

#[test]
fn an_attempt_never_sent_is_taken_back_and_a_result_is_never_touched() {
    let (_d, j) = fresh();
    with_session(&j, 1);
    // Intended, withdrawn (a graceful stop before any replica took it), any number of times:
    // each later intent is a first attempt again.
    for _ in 0..3 {
        assert_eq!(j.intend(1, "n#0", ActivationKind::Llm, "d").expect("intend"), Attempt(1));
        j.withdraw(1, "n#0").expect("withdraw");
    }
    // Withdrawing more than was intended, or an activation never intended, changes nothing.
    j.withdraw(1, "n#0").expect("again");
    j.withdraw(1, "m#0").expect("never intended");
    assert_eq!(j.intend(1, "n#0", ActivationKind::Llm, "d").expect("intend"), Attempt(1));
    assert_eq!(j.intend(1, "n#0", ActivationKind::Llm, "d").expect("sent again"), Attempt(2));
    // A completed activation keeps its result and its count.
    j.complete(1, "n#0", &json!("out")).expect("complete");
    j.withdraw(1, "n#0").expect("withdraw after the result");
    assert!(matches!(j.activation(1, "n#0").expect("activation"), Some(ActivationState::Completed(_))));
}

#[test]
fn attempts_count_to_two_and_a_third_intent_is_refused() {
    let (_d, j) = fresh();
    with_session(&j, 1);
    assert_eq!(j.intend(1, "n#0", ActivationKind::Llm, "d").expect("first"), Attempt(1));
    // The process died while it ran: the restarted one intends it again.
    let second = j.intend(1, "n#0", ActivationKind::Llm, "d").expect("second");
    assert_eq!(second, Attempt(2));
    assert!(second.is_retry() && !Attempt(1).is_retry());
    match j.intend(1, "n#0", ActivationKind::Llm, "d") {
        Err(JournalError::AttemptsExhausted { session: 1, key, attempts: 2 }) => assert_eq!(key, "n#0"),
        other => panic!("third intent: {other:?}"),
    }
    // Still in flight at attempt 2, and it may still complete.
    assert!(matches!(
        j.activation(1, "n#0").expect("activation"),
        Some(ActivationState::InFlight(InFlightActivation { attempt: 2, .. }))
    ));
    j.complete(1, "n#0", &json!(5)).expect("complete");
    assert_eq!(j.stats().expect("stats").retried_activations, 1);
}

#[test]
fn a_second_result_is_refused_and_the_first_stays() {
    let (_d, j) = fresh();
    with_session(&j, 1);
    j.intend(1, "t#0", ActivationKind::Tool, "d").expect("intend");
    j.complete(1, "t#0", &json!({"ok": true})).expect("first result");
    assert!(matches!(
        j.complete(1, "t#0", &json!({"ok": false})),
        Err(JournalError::AlreadyCompleted { session: 1, .. })
    ));
    match j.activation(1, "t#0").expect("activation") {
        Some(ActivationState::Completed(c)) => {
            assert_eq!((c.kind, c.result), (ActivationKind::Tool, json!({"ok": true})));
        }
        other => panic!("{other:?}"),
    }
    // A completed activation is never sent again.
    assert!(matches!(
        j.intend(1, "t#0", ActivationKind::Tool, "d"),
        Err(JournalError::AlreadyCompleted { session: 1, .. })
    ));
}

#[test]
fn a_result_needs_its_intent_and_an_intent_its_request() {
    let (_d, j) = fresh();
    with_session(&j, 1);
    assert!(matches!(j.complete(1, "n#0", &json!(1)), Err(JournalError::NotIntended { session: 1, .. })));
    assert_eq!(j.activation(1, "n#0").expect("activation"), None);
    j.intend(1, "n#0", ActivationKind::Llm, "abc").expect("intend");
    assert!(matches!(
        j.intend(1, "n#0", ActivationKind::Llm, "other"),
        Err(JournalError::IntentMismatch { recorded_digest, .. }) if recorded_digest == "abc"
    ));
    assert!(matches!(
        j.intend(1, "n#0", ActivationKind::Tool, "abc"),
        Err(JournalError::IntentMismatch { recorded_kind: ActivationKind::Llm, .. })
    ));
    // The refusals did not count as attempts.
    assert_eq!(j.intend(1, "n#0", ActivationKind::Llm, "abc").expect("retry"), Attempt(2));
    assert!(matches!(j.intend(1, "", ActivationKind::Llm, "abc"), Err(JournalError::InvalidKey { .. })));
    let long = "k".repeat(MAX_KEY_LEN + 1);
    assert!(matches!(j.intend(1, &long, ActivationKind::Llm, "abc"), Err(JournalError::InvalidKey { .. })));
}

#[test]
fn a_session_finishes_once_and_then_takes_no_activation() {
    let (_d, j) = fresh();
    with_session(&j, 1);
    assert!(matches!(j.finish_session(2, &SessionOutcome::Cancelled), Err(JournalError::UnknownSession(2))));
    assert!(matches!(j.intend(2, "n#0", ActivationKind::Llm, "d"), Err(JournalError::UnknownSession(2))));
    j.intend(1, "n#0", ActivationKind::Llm, "d").expect("intend");
    let done = SessionOutcome::Completed { output: json!("answer") };
    j.finish_session(1, &done).expect("finish");
    match j.finish_session(1, &SessionOutcome::Failed { reason: "late".into() }) {
        Err(JournalError::AlreadyFinished { session: 1, recorded }) => assert_eq!(recorded, done),
        other => panic!("second finish: {other:?}"),
    }
    assert!(matches!(j.complete(1, "n#0", &json!(1)), Err(JournalError::SessionFinished { session: 1, .. })));
    assert!(matches!(
        j.intend(1, "m#0", ActivationKind::Tool, "d"),
        Err(JournalError::SessionFinished { session: 1, .. })
    ));
    assert_eq!(j.session_outcomes().expect("outcomes"), BTreeMap::from([(1, done)]));
    assert!(j.unfinished().expect("unfinished").is_empty());
}

#[test]
fn a_routed_program_is_recorded_while_it_is_open() {
    let (dir, j) = fresh();
    assert_eq!(j.routed_program("p").expect("read"), None);
    j.open_routed_program("p", &json!({"model": "Qwen3-8B", "session": 1})).expect("open");
    // A later program under the key replaces it; the earlier one's end leaves the later record.
    j.open_routed_program("p", &json!({"model": "Qwen3-1.7B", "session": 2})).expect("open again");
    j.end_routed_program("p", 1, None).expect("the earlier program ends");
    assert_eq!(j.routed_program("p").expect("read"), Some(json!({"model": "Qwen3-1.7B", "session": 2})));
    j.open_routed_program("q", &json!({"model": "Qwen3-0.6B", "session": 3})).expect("open");
    j.end_routed_program("q", 3, None).expect("end");
    j.end_routed_program("never-opened", 4, None).expect("ending nothing is a no-op");
    drop(j);
    // What a restart finds: the programs open at the crash.
    let j = Journal::open(&dir.path().join("state")).expect("reopen");
    assert_eq!(j.routed_program("p").expect("read"), Some(json!({"model": "Qwen3-1.7B", "session": 2})));
    assert_eq!(j.routed_program("q").expect("read"), None);
    assert_eq!(j.routed_programs().expect("list"), vec![("p".to_string(), json!({"model": "Qwen3-1.7B", "session": 2}))]);
    assert!(matches!(j.open_routed_program("", &json!({})), Err(JournalError::InvalidKey { .. })));
}

#[test]
fn a_program_awaiting_its_verdict_is_recorded_until_the_verdict_lands() {
    let (dir, j) = fresh();
    let awaiting = |session: u64| json!({"session": session, "model": "Qwen3-8B", "context": [1.0, 0.5], "cost": 2.0});
    j.open_routed_program("p", &json!({"model": "Qwen3-8B", "session": 1})).expect("open");
    // Its end removes the open record and records the awaited verdict in one transaction.
    j.end_routed_program("p", 1, Some(&awaiting(1))).expect("end");
    assert_eq!(j.routed_program("p").expect("read"), None);
    for (key, session) in [("q", 2), ("r", 3)] {
        j.open_routed_program(key, &json!({"model": "Qwen3-8B", "session": session})).expect("open");
        j.end_routed_program(key, session, Some(&awaiting(session))).expect("end");
    }
    // A later program under "q" ended too: its record replaces the earlier one's, and the
    // earlier one's give-up leaves it.
    j.open_routed_program("q", &json!({"model": "Qwen3-8B", "session": 4})).expect("open");
    j.end_routed_program("q", 4, Some(&awaiting(4))).expect("end");
    j.forget_awaited("q", 2).expect("not ours");
    j.forget_awaited("never", 9).expect("forgetting nothing is a no-op");
    // A landed verdict's outcome and the end of its wait are one transaction.
    j.record_learned(&json!({"reward": 1.0}), Some(("r", 3))).expect("landed");
    assert_eq!(j.learned().expect("learned").len(), 1);
    // A program that ends after a later one took its key (its open record is the later one's)
    // awaits nothing: it was given up.
    j.open_routed_program("s", &json!({"model": "Qwen3-8B", "session": 5})).expect("open");
    j.open_routed_program("s", &json!({"model": "Qwen3-8B", "session": 6})).expect("a later program under the key");
    j.end_routed_program("s", 5, Some(&awaiting(5))).expect("the earlier one ends");
    // A new program under a key gives up the verdict its earlier program awaited.
    j.open_routed_program("t", &json!({"model": "Qwen3-8B", "session": 7})).expect("open");
    j.end_routed_program("t", 7, Some(&awaiting(7))).expect("end");
    j.open_routed_program("t", &json!({"model": "Qwen3-8B", "session": 8})).expect("a new program under the key");
    drop(j);
    let j = Journal::open(&dir.path().join("state")).expect("reopen");
    assert_eq!(j.awaited_verdicts().expect("list"), vec![("p".to_string(), awaiting(1)), ("q".to_string(), awaiting(4))]);
    assert!(matches!(j.forget_awaited("", 1), Err(JournalError::InvalidKey { .. })));
    // Only the restored ones are kept.
    j.keep_awaited(&["q".to_string()].into_iter().collect()).expect("keep");
    assert_eq!(j.awaited_verdicts().expect("list"), vec![("q".to_string(), awaiting(4))]);
}

#[test]
fn what_the_ledgers_learned_is_recorded_and_replaced() {
    let (dir, j) = fresh();
    assert!(j.ledgers().expect("read").is_empty());
    let state = |n: u64| json!({"model": "Qwen3-8B", "capacity_tokens": 1000, "seq": n});
    j.record_ledgers(&[("Qwen3-8B/Fp16".into(), state(1)), ("Qwen3-0.6B/Fp16".into(), state(2))]).expect("record");
    j.record_ledgers(&[("Qwen3-8B/Fp16".into(), state(3))]).expect("replace one");
    // A write that reaches the journal late never puts an older state over a newer one.
    j.record_ledgers(&[("Qwen3-8B/Fp16".into(), state(2)), ("Qwen3-0.6B/Fp16".into(), state(2))]).expect("late");
    drop(j);
    let j = Journal::open(&dir.path().join("state")).expect("reopen");
    assert_eq!(j.ledgers().expect("read"), vec![("Qwen3-0.6B/Fp16".to_string(), state(2)), ("Qwen3-8B/Fp16".to_string(), state(3))]);
}

#[test]
fn a_sessions_route_is_recorded_and_kept() {
    let (dir, j) = fresh();
    assert_eq!(j.session_route(7).expect("read"), None);
    j.record_session_route(7, &json!({"model": "Qwen3-0.6B"})).expect("bind");
    // Bound afresh later (its model left the pool): the newer record replaces it.
    let first = json!({"model": "Qwen3-8B", "dtype": "Fp16"});
    j.record_session_route(7, &first).expect("rebind");
    assert_eq!(j.session_route(7).expect("read"), Some(first.clone()));
    drop(j);
    let j = Journal::open(&dir.path().join("state")).expect("reopen");
    assert_eq!(j.session_route(7).expect("read"), Some(first));
    assert_eq!(j.session_route(8).expect("read"), None);
}

#[test]
fn learned_outcomes_come_back_in_the_order_they_landed() {
    let (dir, j) = fresh();
    assert_eq!(j.learned().expect("read"), Vec::<Value>::new());
    // Written concurrently from several threads, each append lands after every earlier one.
    let j = std::sync::Arc::new(j);
    for n in 0..3 {
        j.record_learned(&json!({"model": "Qwen3-8B", "context": [1.0, n], "reward": 1.0}), None).expect("record");
    }
    let writers: Vec<_> = (3..9)
        .map(|n| {
            let j = std::sync::Arc::clone(&j);
            std::thread::spawn(move || j.record_learned(&json!({"n": n}), None).expect("record"))
        })
        .collect();
    writers.into_iter().for_each(|w| w.join().expect("writer"));
    let Ok(j) = std::sync::Arc::try_unwrap(j) else { panic!("one owner left") };
    drop(j);
    let j = Journal::open(&dir.path().join("state")).expect("reopen");
    let learned = j.learned().expect("read");
    assert_eq!(learned.len(), 9);
    assert_eq!(learned[..3], [0, 1, 2].map(|n| json!({"model": "Qwen3-8B", "context": [1.0, n], "reward": 1.0})));
    let mut later: Vec<u64> = learned[3..].iter().map(|v| v["n"].as_u64().expect("n")).collect();
    later.sort_unstable();
    assert_eq!(later, (3..9).collect::<Vec<u64>>(), "none lost or overwritten");
    // Bounded: past the limit the oldest go.
    for n in 9..12 {
        j.record_learned_within(&json!({"n": n}), None, 5).expect("record");
    }
    let kept: Vec<Value> = j.learned().expect("read");
    assert_eq!(kept.len(), 5);
    assert_eq!(kept[2..], [json!({"n": 9}), json!({"n": 10}), json!({"n": 11})]);
}

#[test]
fn recovery_lists_unfinished_sessions_with_results_in_completion_order() {
    let (dir, j) = fresh();
    j.record_run(&run("r1")).expect("run");
    for s in [3, 1, 2] {
        j.record_session("r1", s, &json!({"s": s})).expect("session");
    }
    // Session 1: b completes before a; c in flight at attempt 1, d at attempt 2.
    j.intend(1, "a#0", ActivationKind::Llm, "da").expect("a");
    j.intend(1, "b#0", ActivationKind::Tool, "db").expect("b");
    j.complete(1, "b#0", &json!("B")).expect("b done");
    j.complete(1, "a#0", &json!("A")).expect("a done");
    j.intend(1, "d#0", ActivationKind::Llm, "dd").expect("d");
    j.intend(1, "c#0", ActivationKind::Llm, "dc").expect("c");
    j.intend(1, "d#0", ActivationKind::Llm, "dd").expect("d again");
    // Session 2 finished (its activation sorts right after session 1's and must not leak into
    // them); session 3 has nothing yet.
    j.intend(2, "a#0", ActivationKind::Llm, "x").expect("2a");
    j.finish_session(2, &SessionOutcome::Failed { reason: "r".into() }).expect("finish 2");
    drop(j);
    let j = Journal::open(&dir.path().join("state")).expect("reopen");
    let u = j.unfinished().expect("unfinished");
    assert_eq!(u.iter().map(|s| s.session).collect::<Vec<_>>(), vec![1, 3]);
    assert_eq!(j.last_session().expect("last"), Some(3));
    let s1 = &u[0];
    assert_eq!((s1.run_id.as_str(), &s1.inputs), ("r1", &json!({"s": 1})));
    assert_eq!(
        s1.completed.iter().map(|c| (c.key.as_str(), c.kind, c.result.clone())).collect::<Vec<_>>(),
        vec![("b#0", ActivationKind::Tool, json!("B")), ("a#0", ActivationKind::Llm, json!("A"))]
    );
    assert_eq!(
        s1.in_flight,
        vec![
            InFlightActivation {
                key: "d#0".into(),
                kind: ActivationKind::Llm,
                attempt: 2,
                request_digest: "dd".into()
            },
            InFlightActivation {
                key: "c#0".into(),
                kind: ActivationKind::Llm,
                attempt: 1,
                request_digest: "dc".into()
            },
        ]
    );
    assert!(u[1].completed.is_empty() && u[1].in_flight.is_empty());
    assert_eq!(
        j.stats().expect("stats"),
        JournalStats {
            runs: 1,
            sessions: 3,
            finished_sessions: 1,
            completed_activations: 2,
            in_flight_activations: 3,
            retried_activations: 1,
        }
    );
}

#[test]
fn the_last_session_number_has_its_own_activations() {
    let (_d, j) = fresh();
    with_session(&j, u64::MAX);
    j.intend(u64::MAX, "a#0", ActivationKind::Llm, "d").expect("intend");
    let u = j.unfinished().expect("unfinished");
    assert_eq!(u.len(), 1);
    assert_eq!(u[0].in_flight.len(), 1);
}

#[test]
fn a_file_of_another_schema_version_is_refused() {
    let (dir, j) = fresh();
    with_session(&j, 1);
    let path = j.path().to_path_buf();
    drop(j);
    {
        let db = Database::create(&path).expect("raw open");
        let txn = db.begin_write().expect("txn");
        txn.open_table(META).expect("meta").insert(META_SCHEMA, 99).expect("insert");
        txn.commit().expect("commit");
    }
    match Journal::open(&dir.path().join("state")) {
        Err(e @ JournalError::IncompatibleSchema { found: 99, expected: SCHEMA_VERSION, .. }) => {
            assert!(e.to_string().contains("schema version 99"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_redb_file_that_is_no_journal_and_a_file_that_is_no_redb_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let other = dir.path().join("other");
    fs::create_dir_all(&other).expect("dir");
    {
        let db = Database::create(other.join(FILE_NAME)).expect("raw");
        let txn = db.begin_write().expect("txn");
        let t: TableDefinition<&str, &str> = TableDefinition::new("something_else");
        txn.open_table(t).expect("table").insert("k", "v").expect("insert");
        txn.commit().expect("commit");
    }
    assert!(
        matches!(Journal::open(&other), Err(JournalError::NotAJournal { tables, .. }) if tables == ["something_else"])
    );
    let garbage = dir.path().join("garbage");
    fs::create_dir_all(&garbage).expect("dir");
    fs::write(garbage.join(FILE_NAME), vec![0x5a; 10_000]).expect("write");
    assert!(matches!(Journal::open(&garbage), Err(JournalError::Storage(_))));
    // A state "directory" that is a file.
    let file = dir.path().join("file");
    fs::write(&file, b"x").expect("write");
    assert!(matches!(Journal::open(&file), Err(JournalError::Io { .. })));
}

#[test]
fn a_journal_is_open_once() {
    let (dir, _j) = fresh();
    assert!(matches!(Journal::open(&dir.path().join("state")), Err(JournalError::InUse { .. })));
}

#[test]
fn the_journal_is_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Journal>();
    let (_d, j) = fresh();
    j.record_run(&run("r1")).expect("run");
    let j = std::sync::Arc::new(j);
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let j = j.clone();
            std::thread::spawn(move || -> Result<(), JournalError> {
                j.record_session("r1", t, &json!(t))?;
                for n in 0..5 {
                    let key = activation_key("n", n);
                    j.intend(t, &key, ActivationKind::Llm, "d")?;
                    j.complete(t, &key, &json!(n))?;
                }
                j.finish_session(t, &SessionOutcome::Completed { output: json!(t) })
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread").expect("journal calls");
    }
    let s = j.stats().expect("stats");
    assert_eq!((s.sessions, s.finished_sessions, s.completed_activations), (4, 4, 20));
}

#[test]
fn racing_writes_of_one_group_commit_record_one_result_and_one_finish() {
    let (_d, j) = fresh();
    with_session(&j, 1);
    j.intend(1, "n#0", ActivationKind::Llm, "d").expect("intend");
    let j = std::sync::Arc::new(j);
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
    let handles: Vec<_> = (0..8u64)
        .map(|t| {
            let (j, barrier) = (j.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let result = j.complete(1, "n#0", &json!(t)).map(|_| t);
                // Other sessions' writes share the batches; refusals must not spoil them.
                j.record_session("r1", 100 + t, &json!(t)).expect("another session");
                result
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("thread")).collect();
    let winners: Vec<u64> = results.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    assert!(results.iter().filter(|r| r.is_err()).all(|r| matches!(r, Err(JournalError::AlreadyCompleted { .. }))));
    match j.activation(1, "n#0").expect("activation") {
        Some(ActivationState::Completed(c)) => assert_eq!(c.result, json!(winners[0])),
        other => panic!("{other:?}"),
    }
    assert_eq!(j.stats().expect("stats").sessions, 9);
}

// ----- property test: random operations against a model of the rules -----

/// `prop_assert!` that `$got` matches the pattern (a refusal), showing it when not.
macro_rules! refused {
    ($got:expr, $($pat:tt)+) => {{
        let got = &$got;
        prop_assert!(matches!(got, $($pat)+), "unexpected {:?}", got);
    }};
}

#[derive(Debug, Clone)]
enum Op {
    Session(u64),
    Intend(u64, u8, bool),
    Complete(u64, u8, u8),
    Finish(u64, u8),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0..4u64).prop_map(Op::Session),
        4 => (0..4u64, 0..3u8, any::<bool>()).prop_map(|(s, k, t)| Op::Intend(s, k, t)),
        3 => (0..4u64, 0..3u8, 0..3u8).prop_map(|(s, k, v)| Op::Complete(s, k, v)),
        1 => (0..4u64, 0..3u8).prop_map(|(s, v)| Op::Finish(s, v)),
        1 => Just(Op::Reopen),
    ]
}

#[derive(Default)]
struct Model {
    sessions: BTreeMap<u64, Option<SessionOutcome>>,
    /// (session, key) → (kind, attempts, result).
    acts: BTreeMap<(u64, String), (ActivationKind, u32, Option<Value>)>,
}

fn outcome(v: u8) -> SessionOutcome {
    match v {
        0 => SessionOutcome::Completed { output: json!(v) },
        1 => SessionOutcome::Failed { reason: "x".into() },
        _ => SessionOutcome::Cancelled,
    }
}

fn kind(tool: bool) -> ActivationKind {
    if tool { ActivationKind::Tool } else { ActivationKind::Llm }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever the sequence: every call is accepted or refused exactly as the rules say, a
    /// refusal changes nothing, and after every reopening the journal holds what the accepted
    /// calls wrote — one outcome per finished session, one result per completed activation.
    #[test]
    fn random_operations_keep_the_rules(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let mut j = Journal::open(&state).expect("open");
        j.record_run(&run("r")).expect("run");
        let mut m = Model::default();
        for op in ops {
            match op {
                Op::Session(s) => {
                    j.record_session("r", s, &json!(s)).expect("session");
                    m.sessions.entry(s).or_insert(None);
                }
                Op::Intend(s, k, tool) => {
                    let key = activation_key("n", k.into());
                    // The digest is a function of the key: a restart sends the same request.
                    let got = j.intend(s, &key, kind(tool), &key);
                    let finished = m.sessions.get(&s);
                    let slot = m.acts.get_mut(&(s, key.clone()));
                    match (finished, slot) {
                        (None, _) => refused!(got, Err(JournalError::UnknownSession(_))),
                        (Some(Some(_)), _) => refused!(got, Err(JournalError::SessionFinished { .. })),
                        (Some(None), None) => {
                            prop_assert_eq!(got.expect("first intent"), Attempt(1));
                            m.acts.insert((s, key), (kind(tool), 1, None));
                        }
                        (Some(None), Some((_, _, Some(_)))) =>
                            refused!(got, Err(JournalError::AlreadyCompleted { .. })),
                        (Some(None), Some((k0, _, None))) if *k0 != kind(tool) =>
                            refused!(got, Err(JournalError::IntentMismatch { .. })),
                        (Some(None), Some((_, a, None))) if *a >= MAX_ATTEMPTS =>
                            refused!(got, Err(JournalError::AttemptsExhausted { .. })),
                        (Some(None), Some((_, a, None))) => {
                            *a += 1;
                            prop_assert_eq!(got.expect("second intent"), Attempt(*a));
                        }
                    }
                }
                Op::Complete(s, k, v) => {
                    let key = activation_key("n", k.into());
                    let got = j.complete(s, &key, &json!(v));
                    let finished = m.sessions.get(&s);
                    let slot = m.acts.get_mut(&(s, key));
                    match (finished, slot) {
                        (None, _) => refused!(got, Err(JournalError::UnknownSession(_))),
                        (Some(Some(_)), _) => refused!(got, Err(JournalError::SessionFinished { .. })),
                        (Some(None), None) => refused!(got, Err(JournalError::NotIntended { .. })),
                        (Some(None), Some((_, _, Some(_)))) =>
                            refused!(got, Err(JournalError::AlreadyCompleted { .. })),
                        (Some(None), Some((_, _, r @ None))) => {
                            got.expect("result");
                            *r = Some(json!(v));
                        }
                    }
                }
                Op::Finish(s, v) => {
                    let got = j.finish_session(s, &outcome(v));
                    match m.sessions.get_mut(&s) {
                        None => refused!(got, Err(JournalError::UnknownSession(_))),
                        Some(Some(first)) => refused!(got, Err(JournalError::AlreadyFinished { recorded, .. }) if recorded == first),
                        Some(o @ None) => {
                            got.expect("finish");
                            *o = Some(outcome(v));
                        }
                    }
                }
                Op::Reopen => {
                    drop(j);
                    j = Journal::open(&state).expect("reopen");
                }
            }
        }
        drop(j);
        let j = Journal::open(&state).expect("final reopen");
        // Outcomes: exactly the model's finished sessions.
        let want: BTreeMap<u64, SessionOutcome> =
            m.sessions.iter().filter_map(|(s, o)| o.clone().map(|o| (*s, o))).collect();
        prop_assert_eq!(j.session_outcomes().expect("outcomes"), want);
        // Recovery: exactly the model's open sessions, each with its activations.
        let u = j.unfinished().expect("unfinished");
        let open: Vec<u64> = m.sessions.iter().filter(|(_, o)| o.is_none()).map(|(s, _)| *s).collect();
        prop_assert_eq!(u.iter().map(|s| s.session).collect::<Vec<_>>(), open);
        for s in &u {
            let mut done: Vec<(String, u32, Value)> =
                s.completed.iter().map(|c| (c.key.clone(), c.attempts, c.result.clone())).collect();
            done.sort_by(|a, b| a.0.cmp(&b.0));
            let mut flying: Vec<(String, u32)> = s.in_flight.iter().map(|i| (i.key.clone(), i.attempt)).collect();
            flying.sort();
            let mut want_done = Vec::new();
            let mut want_flying = Vec::new();
            for ((ms, key), (_, a, r)) in &m.acts {
                if *ms != s.session {
                    continue;
                }
                match r {
                    Some(v) => want_done.push((key.clone(), *a, v.clone())),
                    None => want_flying.push((key.clone(), *a)),
                }
            }
            prop_assert_eq!(done, want_done);
            prop_assert_eq!(flying, want_flying);
        }
        let stats = j.stats().expect("stats");
        prop_assert_eq!(stats.completed_activations, m.acts.values().filter(|a| a.2.is_some()).count() as u64);
    }
}

#[test]
fn workflows_registered_over_the_api_are_kept_once_by_name() {
    let (dir, j) = fresh();
    j.record_workflow("echo", "name: echo\n").expect("record");
    j.record_workflow("echo", "name: echo\n").expect("the same text again is a no-op");
    assert!(matches!(j.record_workflow("echo", "name: echo # v2\n"), Err(JournalError::WorkflowConflict { .. })));
    assert!(matches!(j.record_workflow("", "x"), Err(JournalError::InvalidKey { .. })));
    j.record_workflow("another", "name: another\n").expect("record");
    drop(j);
    let j = Journal::open(&dir.path().join("state")).expect("reopen");
    assert_eq!(
        j.workflows().expect("workflows"),
        vec![("another".to_string(), "name: another\n".to_string()), ("echo".to_string(), "name: echo\n".to_string())]
    );
}

#[test]
fn a_journal_without_the_workflows_table_opens_with_none() {
    // Journals written before the table existed: opening one creates it empty.
    let (dir, j) = fresh();
    let txn = j.db.begin_write().expect("write");
    assert!(txn.delete_table(WORKFLOWS).expect("delete"));
    txn.commit().expect("commit");
    drop(j);
    let j = Journal::open(&dir.path().join("state")).expect("reopen");
    assert_eq!(j.workflows().expect("workflows"), Vec::new());
    j.record_workflow("echo", "name: echo\n").expect("record");
}

/// A learned outcome's context is what a restarted learner relearns from: it must come back
/// bit for bit, not to within an ulp (serde_json's `float_roundtrip` parsing; its default
/// parser may round a 17-digit float to a neighbour).
#[test]
fn learned_contexts_come_back_bit_for_bit() {
    use rand::{Rng, SeedableRng};
    let (dir, j) = fresh();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let context: Vec<f64> = (0..4000).map(|i| rng.random_range(-1.0..1.0) * 10f64.powi(i % 9 - 4)).collect();
    j.record_learned(&json!({"model": "Qwen3-8B", "context": context, "reward": 0.1 + 0.2}), None).expect("record");
    drop(j);
    let j = Journal::open(&dir.path().join("state")).expect("reopen");
    let learned = j.learned().expect("read");
    let back: Vec<f64> = learned[0]["context"].as_array().expect("context").iter().map(|v| v.as_f64().expect("a number")).collect();
    let differ = context.iter().zip(&back).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert_eq!((back.len(), differ), (context.len(), 0), "every context entry the same f64");
    assert_eq!(learned[0]["reward"].as_f64().map(f64::to_bits), Some((0.1f64 + 0.2).to_bits()));
}

/// Earlier versions wrote a row per front-door program key into `program_bindings` and never
/// read it: opening such a journal drops the table (and what it held).
#[test]
fn an_earlier_journals_program_bindings_are_dropped_at_open() {
    let (dir, j) = fresh();
    with_session(&j, 3);
    let path = j.path().to_path_buf();
    drop(j);
    {
        let db = redb::Database::open(&path).expect("redb");
        let txn = db.begin_write().expect("write");
        txn.open_table(RETIRED_BINDINGS).expect("table").insert("agent-7", r#"{"model":"Qwen3-0.6B"}"#).expect("row");
        txn.commit().expect("commit");
    }
    let j = Journal::open(&dir.path().join("state")).expect("reopen");
    assert!(j.session(3).expect("session").is_some(), "the rest is kept");
    drop(j);
    let db = redb::Database::open(&path).expect("redb");
    let txn = db.begin_read().expect("read");
    let tables: Vec<String> = txn.list_tables().expect("tables").map(|t| t.name().to_string()).collect();
    assert!(!tables.iter().any(|t| t == "program_bindings"), "{tables:?}");
}

/// A restart reads every run's head; the workflow texts (up to a request body each) stay in the
/// journal until a run that needs its text asks for it.
#[test]
fn run_heads_are_the_runs_without_their_texts() {
    let (_d, j) = fresh();
    let big = RunRecord { run_id: "r2".into(), workflow_yaml: format!("name: wf\n# {}\n", "x".repeat(1 << 20)), drawn_from: Some(4), ..run("r2") };
    j.record_run(&run("r1")).expect("r1");
    j.record_run(&big).expect("r2");
    let heads = j.run_heads().expect("heads");
    let want: Vec<(String, String, u32, u64, Option<u64>)> = j
        .runs()
        .expect("runs")
        .into_iter()
        .map(|r| (r.run_id, r.workflow, r.sessions, r.created_at_unix_ms, r.drawn_from))
        .collect();
    let got: Vec<(String, String, u32, u64, Option<u64>)> =
        heads.into_iter().map(|h| (h.run_id, h.workflow, h.sessions, h.created_at_unix_ms, h.drawn_from)).collect();
    assert_eq!(got, want);
    assert_eq!(j.run("r2").expect("read").map(|r| r.workflow_yaml.len()), Some(big.workflow_yaml.len()));
}

/// A few damaged bytes in a B-tree page made the restore panic inside redb (a reviewer's
/// `dd` of 4 KiB of noise at 4, 8 and 12 KiB); [`Journal::open`] now checks every page first
/// and refuses the file, naming it, with no panic. Every damaged page, wherever it is, is
/// caught the same way: the check reads them all.
#[test]
fn a_damaged_journal_is_refused_naming_the_file_not_a_panic() {
    use std::io::{Seek, SeekFrom, Write};
    let mut refused = 0;
    for offset in [4096u64, 8192, 12288] {
        let (dir, j) = fresh();
        for s in 0..200 {
            with_session(&j, s);
            j.intend(s, "a#0", ActivationKind::Llm, "d").expect("intend");
            j.complete(s, "a#0", &json!("an answer long enough to fill pages ".repeat(8))).expect("complete");
        }
        let path = j.path().to_path_buf();
        drop(j);
        let mut f = fs::OpenOptions::new().write(true).open(&path).expect("open");
        f.seek(SeekFrom::Start(offset)).expect("seek");
        // Deterministic noise (xorshift).
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ offset;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        f.write_all(&noise).expect("write");
        drop(f);
        match Journal::open(&dir.path().join("state")) {
            Err(e @ JournalError::Damaged { .. }) => {
                assert!(e.to_string().contains(&path.display().to_string()), "{e}");
                refused += 1;
            }
            // The damage hit a free page (the check passed: nothing of the journal is there),
            // or redb repaired the file (said in a note): either way everything reads.
            Ok(j) => {
                assert!(j.notes().iter().all(|n| n.contains("repaired")), "offset {offset}: {:?}", j.notes());
                j.runs().expect("runs read");
                for s in 0..200 {
                    j.session(s).expect("sessions read");
                    j.activation(s, "a#0").expect("activations read");
                }
            }
            Err(other) => panic!("offset {offset}: {other}"),
        }
    }
    assert!(refused > 0, "no damage was refused");
}

/// An empty `journal.redb` (truncated by hand, or a crash right after it was created) opens as
/// a new journal, and says so: its history is gone, and the operator should know.
#[test]
fn an_empty_journal_file_opens_as_a_new_one_with_a_note() {
    let (dir, j) = fresh();
    assert!(j.notes().is_empty());
    with_session(&j, 1);
    let path = j.path().to_path_buf();
    drop(j);
    fs::OpenOptions::new().write(true).truncate(true).open(&path).expect("truncate");
    let j = Journal::open(&dir.path().join("state")).expect("reopen");
    assert!(j.notes().iter().any(|n| n.contains("empty file")), "{:?}", j.notes());
    assert!(j.runs().expect("runs").is_empty());
}
