//! The module dependency rules of ARCHITECTURE.md ("runtime/ modules"), checked on the source:
//! the live shell does not import the simulator, the shared execution layer (`exec`) imports
//! neither shell, the simulator does not import the live shell, and the planner core imports no
//! shell, no shared layer, no emulator and no tools. A rule is broken by any path into a
//! forbidden module in code (comments are skipped): `crate::sim::…`, `super::sim` (at any
//! depth), `switchyard_runtime::sim`, or `sim` inside a `crate::{…}` / `super::{…}` group.

use std::fs;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `path` (a directory, or one file).
fn rust_files(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut out = Vec::new();
    let mut dirs = vec![path.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = entry.expect("directory entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The source without comment lines (`//`, `//!`, `///`), so docs may name the rules.
fn code_of(text: &str) -> String {
    text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

fn ident_at(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The first identifier of every top-level item of the `{…}` group that `s` starts with.
fn group_heads(s: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect_head = true;
    for (i, c) in s.char_indices() {
        match c {
            '{' => {
                depth += 1;
                if depth == 1 {
                    expect_head = true;
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => expect_head = true,
            c if depth == 1 && expect_head && (c.is_alphabetic() || c == '_') => {
                heads.push(ident_at(&s[i..]).to_string());
                expect_head = false;
            }
            _ => {}
        }
    }
    heads
}

/// Paths in `code` that lead into one of the `forbidden` modules of this crate (or crates).
fn violations(code: &str, forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for root in ["crate::", "super::", "switchyard_runtime::"] {
        let mut from = 0;
        while let Some(k) = code[from..].find(root) {
            let start = from + k;
            from = start + root.len();
            // Not the tail of a longer path (`a::super::`) or name (`my_crate::`).
            let boundary =
                code[..start].chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
            if !boundary {
                continue;
            }
            let mut rest = &code[from..];
            while let Some(r) = rest.strip_prefix("super::") {
                rest = r;
            }
            let heads = if rest.starts_with('{') { group_heads(rest) } else { vec![ident_at(rest).to_string()] };
            for h in heads {
                if forbidden.contains(&h.as_str()) {
                    let line = code[..start].matches('\n').count() + 1;
                    let text = code.lines().nth(line - 1).unwrap_or("").trim();
                    found.push(format!("`{h}` via `{text}`"));
                }
            }
        }
    }
    for krate in forbidden.iter().filter(|f| f.starts_with("switchyard_")) {
        for l in code.lines().filter(|l| l.contains(krate)) {
            found.push(format!("`{krate}` via `{}`", l.trim()));
        }
    }
    found
}

/// Assert that no file of `module` (relative to `runtime/src`) reaches a `forbidden` module.
fn check(module: &str, forbidden: &[&str]) {
    check_except(module, &[], forbidden);
}

/// [`check`], skipping the files named in `except` (relative to `runtime/src`).
fn check_except(module: &str, except: &[&str], forbidden: &[&str]) {
    let files: Vec<PathBuf> =
        rust_files(&src().join(module)).into_iter().filter(|f| !except.iter().any(|e| f.ends_with(e))).collect();
    assert!(!files.is_empty(), "no source files under runtime/src/{module}");
    let mut broken = Vec::new();
    for f in &files {
        let text = fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for v in violations(&code_of(&text), forbidden) {
            broken.push(format!("{}: {v}", f.strip_prefix(src()).unwrap_or(f).display()));
        }
    }
    assert!(broken.is_empty(), "runtime/src/{module} must not depend on {forbidden:?}:\n{}", broken.join("\n"));
}

#[test]
fn the_live_shell_does_not_import_the_simulator() {
    // `bench` and `lower_bound` drive or read the simulator, so they are off limits too.
    check("live", &["sim", "bench", "lower_bound"]);
}

#[test]
fn the_shared_execution_layer_imports_neither_shell() {
    check("exec", &["sim", "live", "bench", "lower_bound", "serve"]);
}

#[test]
fn the_serve_api_runs_on_the_live_shell_only() {
    check("serve", &["sim", "bench", "lower_bound"]);
    // and the live shell does not know the HTTP API built on it
    check("live", &["serve"]);
}

#[test]
fn only_the_oracle_estimates_of_exec_read_the_emulator() {
    // The emulator is the ground truth: nothing shared by the shells plans with its constants
    // except the explicitly labelled `oracle` estimates. The pre-run check asks the engine's
    // own start-up rule (does this deployment fit this device at all), which plans nothing.
    check_except("exec", &["exec/oracle.rs", "exec/preflight.rs"], &["switchyard_emulator"]);
}

#[test]
fn the_simulator_does_not_import_the_live_shell() {
    check("sim", &["live", "bench", "lower_bound"]);
}

#[test]
fn the_planner_core_imports_no_shell_emulator_or_tools() {
    check("planner", &["exec", "sim", "live", "bench", "lower_bound", "switchyard_emulator", "switchyard_tools"]);
}

#[test]
fn the_agent_workload_is_pure_data() {
    // The trace format and its generators feed both the simulator and the CLI; they decide
    // nothing and must not reach the planner, the shells or the emulator.
    check(
        "agentic",
        &["planner", "exec", "sim", "live", "serve", "bench", "lower_bound", "switchyard_emulator", "switchyard_tools"],
    );
}

#[test]
fn the_checker_sees_every_spelling_of_an_import() {
    let bad = [
        "use crate::sim::CallRecord;",
        "use crate::sim;",
        "use super::super::sim::PoolSpec;",
        "let x = crate::sim::simulate(&c, &mut |_, _| {});",
        "use crate::{ids::SessionId, sim::TraceEntry};",
        "use crate::{\n    exec,\n    sim::{self, SimConfig},\n};",
        "use switchyard_runtime::sim::PoolSpec;",
    ];
    for b in bad {
        assert_eq!(violations(&code_of(b), &["sim"]).len(), 1, "not caught: {b}");
    }
    let fine = [
        "//! It must not depend on `crate::sim`.",
        "    /// as the simulator does (`crate::sim::Sim`)",
        "use crate::exec::{self, CallRecord, arrivals};",
        "use crate::simulation_free::X;",
        "use super::shell::LiveOutput;",
        "let my_crate::sim = 1;",
    ];
    for f in fine {
        assert!(violations(&code_of(f), &["sim"]).is_empty(), "false alarm: {f}");
    }
    let emu = "use switchyard_emulator::EmulatedReplica;";
    assert_eq!(violations(emu, &["switchyard_emulator"]).len(), 1);
}

/// What would make the planner core impure: files, clocks, randomness, process-global state.
/// (A policy's own memo of a pure function, e.g. `estimates::Cached`, is instance state and
/// allowed.)
const IMPURE: &[&str] =
    &["std::fs", "std::time", "std::env", "Instant::", "SystemTime", "OnceLock", "LazyLock", "thread_local!", "static mut", "rand::"];

/// The impure constructs `code` uses.
fn impurities(code: &str) -> Vec<String> {
    let mut found: Vec<String> = IMPURE
        .iter()
        .filter_map(|p| code.lines().find(|l| l.contains(p)).map(|l| format!("`{p}` in `{}`", l.trim())))
        .collect();
    // A `static` item other than a plain constant table (`static NAME: &[…]`) is global state.
    for l in code.lines().filter(|l| l.trim_start().starts_with("static ") || l.contains(" static ")) {
        if !l.contains("&'static") && !l.contains(": &[") {
            found.push(format!("`static` in `{}`", l.trim()));
        }
    }
    found
}

#[test]
fn the_planner_core_reads_no_file_and_holds_no_global_state() {
    let mut broken = Vec::new();
    for f in rust_files(&src().join("planner")) {
        let text = fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for v in impurities(&code_of(&text)) {
            broken.push(format!("{}: {v}", f.strip_prefix(src()).unwrap_or(&f).display()));
        }
    }
    assert!(broken.is_empty(), "runtime/src/planner must stay pure:\n{}", broken.join("\n"));
    // The checker itself sees what it must.
    for bad in ["static CACHE: OnceLock<Mutex<u8>> = OnceLock::new();", "let t = std::fs::read(p);", "let n = Instant::now();"] {
        assert!(!impurities(bad).is_empty(), "not caught: {bad}");
    }
    assert!(impurities("pub fn name(&self) -> &'static str {").is_empty());
}
