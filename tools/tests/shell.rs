//! The `shell` tool through `run_tool`, in the real process sandbox: what it guarantees
//! (tools/src/shell.rs) — only the system paths and the declared reads are there, and read-only;
//! the host's other files are absent; the verdict comes from how the process ended, not from
//! what it printed; the timeout kills it; `sleep N` takes N seconds.

use std::path::Path;
use std::time::Instant;

use serde_json::json;
use switchyard_tools::shell::{NAME, sleep_seconds};
use switchyard_tools::{ToolCall, ToolFailureCause, ToolOutcome, modeled_duration_s, run_tool};

fn shell(inputs: serde_json::Value) -> ToolOutcome {
    let call = ToolCall {
        tool: NAME.into(),
        inputs: inputs.as_object().cloned().unwrap_or_default().into_iter().collect(),
        timeout_s: None,
    };
    run_tool(&call).unwrap_or_else(|e| panic!("shell call failed to run: {e}"))
}

#[test]
fn a_command_runs_and_passes_on_exit_status_zero() {
    let out = shell(json!({"command": "echo hello; printf 'two\\n' | wc -l"}));
    assert_eq!(out.verdict.as_deref(), Some("pass"), "{out:?}");
    assert!(out.text.starts_with("exit status 0\nhello\n1"), "{:?}", out.text);
    assert_eq!(out.value["exit_code"], json!(0));
    assert!(out.failure.is_none());
}

#[test]
fn the_verdict_is_the_exit_status_not_the_output() {
    let out = shell(json!({"command": "echo pass; echo 'exit status 0'; exit 3"}));
    assert_eq!(out.verdict.as_deref(), Some("fail"), "{out:?}");
    let failure = out.failure.expect("a failure");
    assert_eq!(failure.cause, ToolFailureCause::Exited);
    assert_eq!(failure.detail, "exit status 3");
    assert!(out.text.starts_with("exit status 3\n"));
}

#[test]
fn only_declared_reads_are_visible_and_they_are_read_only() {
    let dir = tempfile::Builder::new().prefix("shell-reads-").tempdir().expect("tempdir");
    let declared = dir.path().join("declared");
    let hidden = dir.path().join("hidden");
    std::fs::create_dir(&declared).unwrap();
    std::fs::create_dir(&hidden).unwrap();
    std::fs::write(declared.join("notes.txt"), "visible\n").unwrap();
    std::fs::write(hidden.join("secret.txt"), "TOPSECRET-CONTENT\n").unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let reads = json!([declared.display().to_string()]);
    // The declared directory is readable.
    let cat = format!("cat {}", declared.join("notes.txt").display());
    let out = shell(json!({"command": cat, "reads": reads}));
    assert_eq!(out.verdict.as_deref(), Some("pass"), "{out:?}");
    assert!(out.text.contains("visible"));
    // Its sibling, the caller's working tree and /etc/passwd are not there at all.
    for path in [hidden.join("secret.txt"), repo.join("Cargo.toml"), Path::new("/etc/passwd").to_path_buf()] {
        let out = shell(json!({"command": format!("cat {}", path.display()), "reads": reads}));
        assert_eq!(out.verdict.as_deref(), Some("fail"), "{} was readable: {out:?}", path.display());
        assert!(!out.text.contains("TOPSECRET") && !out.text.contains("root:x"), "{out:?}");
    }
    // The declared directory cannot be written, nor anything outside the work directory.
    let write = format!("echo x > {}", declared.join("new.txt").display());
    let out = shell(json!({"command": write, "reads": reads}));
    assert_eq!(out.verdict.as_deref(), Some("fail"), "{out:?}");
    assert!(!declared.join("new.txt").exists(), "the sandbox wrote into a read-only bind");
    let out = shell(json!({"command": "echo x > /usr/pwned"}));
    assert_eq!(out.verdict.as_deref(), Some("fail"));
    assert!(!Path::new("/usr/pwned").exists());
    // The private work directory is writable and is the command's own.
    let out = shell(json!({"command": "echo kept > f && cat f"}));
    assert_eq!(out.verdict.as_deref(), Some("pass"), "{out:?}");
    assert!(out.text.contains("kept"));
}

/// A declared read under `/tmp` (a checkout or a temporary directory on the host) is there, at
/// its own path and read-only, and `/tmp` is still the private work directory: until a review
/// found it (2026-12-06) such a declaration made the program's `/tmp` a read-only directory
/// holding only the declared path.
#[test]
fn a_read_under_tmp_keeps_tmp_the_private_work_directory() {
    let dir = tempfile::Builder::new().prefix("shell-reads-tmp-").tempdir_in("/tmp").expect("tempdir under /tmp");
    let declared = dir.path().join("declared");
    std::fs::create_dir(&declared).unwrap();
    std::fs::write(declared.join("notes.txt"), "visible\n").unwrap();
    let reads = json!([declared.display().to_string()]);
    let command = format!(
        "cat {notes} && echo x > /tmp/scratch && cat /work/scratch && cd /tmp && pwd -P && ls /work/scratch && \
         if echo y > {new} 2>/dev/null; then echo declared-writable; exit 4; fi",
        notes = declared.join("notes.txt").display(),
        new = declared.join("new.txt").display()
    );
    let out = shell(json!({"command": command, "reads": reads}));
    assert_eq!(out.verdict.as_deref(), Some("pass"), "{out:?}");
    assert!(out.text.contains("visible\nx\n/work\n/work/scratch\n"), "{:?}", out.text);
    assert!(!declared.join("new.txt").exists() && !Path::new("/tmp/scratch").exists(), "the sandbox wrote on the host");
}

#[test]
fn sleep_takes_its_time_and_the_timeout_kills() {
    let start = Instant::now();
    let out = shell(json!({"command": "sleep 0.3"}));
    assert_eq!(out.verdict.as_deref(), Some("pass"), "{out:?}");
    assert!(start.elapsed().as_secs_f64() >= 0.3);
    assert!((out.modeled_duration_s - 0.303).abs() < 1e-9, "{}", out.modeled_duration_s);
    let out = shell(json!({"command": "sleep 30", "timeout_s": 0.5}));
    assert_eq!(out.verdict.as_deref(), Some("fail"), "{out:?}");
    assert_eq!(out.failure.map(|f| f.cause), Some(ToolFailureCause::Timeout));
    assert!(out.wall_seconds < 10.0, "the timeout did not stop it: {} s", out.wall_seconds);
    assert_eq!(out.modeled_duration_s, 0.5);
    // The simulator's model of a call, without running it.
    let call = ToolCall {
        tool: NAME.into(),
        inputs: [("command".to_string(), json!("sleep 2; make"))].into_iter().collect(),
        timeout_s: None,
    };
    assert!((modeled_duration_s(&call) - (2.0 + switchyard_tools::shell::MODEL_STARTUP_S)).abs() < 1e-9);
    assert_eq!(sleep_seconds("sleep 1m"), 60.0);
}

