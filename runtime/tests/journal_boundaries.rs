//! The journal's dependency rule (ARCHITECTURE.md, `live/journal.rs`): it must not depend on the
//! planner, the simulator or the actors. It is stricter in fact — it uses nothing of this crate —
//! and this test keeps it so: no code line of `runtime/src/live/journal.rs` or
//! `runtime/src/live/journal/` names a path into the crate (`crate::`, `super::` beyond the
//! tests' `use super::*;` of the journal itself, the emulator's or the tools' crate). Comments may name anything.

use std::fs;
use std::path::Path;

#[test]
fn the_journal_uses_nothing_of_the_crate() {
    let live = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/live");
    let mut files = vec![live.join("journal.rs")];
    for entry in fs::read_dir(live.join("journal")).expect("runtime/src/live/journal/") {
        let p = entry.expect("directory entry").path();
        if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
    let mut broken = Vec::new();
    for f in &files {
        let text = fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") || code == "use super::*;" {
                continue;
            }
            let paths = ["crate::", "super::", "switchyard_runtime", "switchyard_emulator", "switchyard_tools"];
            if paths.iter().any(|p| code.contains(p)) {
                broken.push(format!("{}:{}: {}", f.display(), n + 1, code));
            }
        }
    }
    assert!(files.len() >= 2, "the journal's files: {files:?}");
    assert!(broken.is_empty(), "the journal must not depend on the rest of the crate:\n{}", broken.join("\n"));
}
