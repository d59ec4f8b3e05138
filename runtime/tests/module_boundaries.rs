//! The module dependency rules of ARCHITECTURE.md ("runtime/ modules"), checked on the source:
//! the live shell does not import the simulator, the shared execution layer (`exec`) imports
//! neither shell, the simulator does not import the live shell, the planner core imports no
//! shell, no shared layer, no emulator and no tools and stays pure, and no module imports a
//! sibling that imports it back (the cycle check at the end). A rule is broken by any path into a
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

/// What would make the planner core impure: files and other I/O (sockets, child processes, the
/// console, logging), the async runtime, clocks, randomness, process-global state. (A policy's
/// own memo of a pure function, e.g. `estimates::Cached`, is instance state and allowed.)
const IMPURE: &[&str] = &[
    "std::fs",
    "std::io",
    "std::net",
    "std::process",
    "std::time",
    "std::env",
    "Instant::",
    "SystemTime",
    "OnceLock",
    "LazyLock",
    "thread_local!",
    "static mut",
    "rand::",
    "print!",
    "println!",
    "eprint!",
    "eprintln!",
    "dbg!",
    "tracing::",
    "tokio::",
];

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
    for bad in [
        "static CACHE: OnceLock<Mutex<u8>> = OnceLock::new();",
        "let t = std::fs::read(p);",
        "let n = Instant::now();",
        "let mut out = std::io::stdout();",
        "let s = std::net::TcpStream::connect(a);",
        "std::process::Command::new(\"vllm\").spawn();",
        "println!(\"{plan:?}\");",
        "eprintln!(\"fallback\");",
        "tracing::debug!(states, \"solved\");",
        "tokio::spawn(solve);",
    ] {
        assert!(!impurities(bad).is_empty(), "not caught: {bad}");
    }
    assert!(impurities("pub fn name(&self) -> &'static str {").is_empty());
}

// ---------------------------------------------------------------------------------------------
// No import cycles between sibling modules.
//
// Granularity: the graph's nodes are modules (`a/b.rs` or `a/b/mod.rs` is `a::b`; `lib.rs` is the
// crate root). A path `crate::a::b::…` or `super::…` in code (comments, string literals and
// `#[cfg(test)] mod …` blocks or files are skipped) is a dependency on the deepest existing module
// it names. A dependency of `x::p::q` on `x::r::s` is an edge between the siblings `x::p` and
// `x::r` (the children of the deepest common ancestor): that is the level at which "A uses B while
// B uses A" is a cycle. A module using its own descendants (a `mod.rs` declaring or re-exporting
// its children) or its ancestors is not an edge. A name reached through an ancestor
// (`use super::Foo`, `crate::live::Foo` from inside `live`) is followed to where the ancestor
// imports it from (`pub use service::Foo` in `live/mod.rs` makes it an edge to `live::service`);
// an item the ancestor defines itself is a dependency on the ancestor, not an edge. Re-exports
// of a sibling are not followed: importing `B::Foo` depends on `B`, whatever `B` re-exports.
// (Inline non-test `mod x { … }` blocks and glob re-exports are not modelled: the runtime has
// none; the self-test below pins what is.)
// ---------------------------------------------------------------------------------------------

use std::collections::{BTreeMap, BTreeSet};

/// `text` with comments, string literals and character literals blanked (newlines kept, so byte
/// offsets and line numbers still match the file).
fn blank_non_code(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut out = String::with_capacity(text.len());
    // Push `n` blanks for `c[i..i + n]`, keeping each char's UTF-8 width so offsets match.
    let push_blank = |out: &mut String, ch: char| {
        for _ in 0..ch.len_utf8() {
            out.push(blank(ch));
        }
    };
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                push_blank(&mut out, c[i]);
                i += 1;
            }
            continue;
        }
        if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    push_blank(&mut out, c[i]);
                    i += 1;
                }
            }
            continue;
        }
        let starts_word = i == 0 || !ident(c[i - 1]);
        // Raw strings: r"…", r#"…"#, br"…".
        if starts_word && (c[i] == 'r' || (c[i] == 'b' && next == Some('r'))) {
            let mut j = i + if c[i] == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) == Some(&'"') {
                for &ch in &c[i..=j] {
                    out.push(ch);
                }
                i = j + 1;
                while i < c.len() {
                    if c[i] == '"' && (1..=hashes).all(|h| c.get(i + h) == Some(&'#')) {
                        break;
                    }
                    push_blank(&mut out, c[i]);
                    i += 1;
                }
                for &ch in c.iter().skip(i).take(hashes + 1) {
                    out.push(ch);
                }
                i += hashes + 1;
                continue;
            }
        }
        if c[i] == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' && i + 1 < c.len() {
                    push_blank(&mut out, c[i]);
                    i += 1;
                }
                push_blank(&mut out, c[i]);
                i += 1;
            }
            if i < c.len() {
                out.push('"');
                i += 1;
            }
            continue;
        }
        if c[i] == '\'' {
            // A character literal ('x', '\n', '\'', '\u{..}'), else a lifetime or label.
            let end = if next == Some('\\') {
                (i + 3..c.len()).find(|&j| c[j] == '\'')
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            if let Some(end) = end {
                out.push('\'');
                for &ch in &c[i + 1..end] {
                    push_blank(&mut out, ch);
                }
                out.push('\'');
                i = end + 1;
                continue;
            }
        }
        out.push(c[i]);
        i += 1;
    }
    out
}

/// `code` (already blanked) with its `#[cfg(test)] mod name { … }` blocks blanked, and the names
/// of its `#[cfg(test)] mod name;` declarations (test modules in files of their own).
fn without_test_modules(code: &str) -> (String, Vec<String>) {
    const ATTR: &str = "#[cfg(test)]";
    let bytes = code.as_bytes();
    let mut out = bytes.to_vec();
    let mut test_files = Vec::new();
    let mut from = 0;
    while let Some(k) = code[from..].find(ATTR) {
        let at = from + k;
        from = at + ATTR.len();
        let mut i = from;
        let skip_ws = |i: &mut usize| {
            while *i < bytes.len() && bytes[*i].is_ascii_whitespace() {
                *i += 1;
            }
        };
        // Further attributes on the same item.
        loop {
            skip_ws(&mut i);
            if !code[i..].starts_with("#[") {
                break;
            }
            let mut depth = 0;
            while i < bytes.len() {
                match bytes[i] {
                    b'[' => depth += 1,
                    b']' => {
                        depth -= 1;
                        if depth == 0 {
                            i += 1;
                            break;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        for vis in ["pub(crate) ", "pub(super) ", "pub "] {
            if code[i..].starts_with(vis) {
                i += vis.len();
                skip_ws(&mut i);
            }
        }
        let Some(rest) = code[i..].strip_prefix("mod ") else { continue };
        let name_at = i + 4 + (rest.len() - rest.trim_start().len());
        let name = ident_at(&code[name_at..]).to_string();
        let mut j = name_at + name.len();
        skip_ws(&mut j);
        let end = match bytes.get(j) {
            Some(b';') => {
                test_files.push(name);
                j + 1
            }
            Some(b'{') => {
                let mut depth = 0;
                let mut e = j;
                while e < bytes.len() {
                    match bytes[e] {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    e += 1;
                }
                e + 1
            }
            _ => continue,
        };
        for b in &mut out[at..end.min(bytes.len())] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
        from = end.min(bytes.len());
    }
    (String::from_utf8(out).expect("blanking keeps UTF-8"), test_files)
}

/// One leaf of a path tree: its segments as written, the name it binds (`as` alias or last
/// segment) and the byte offset of its last segment.
struct Leaf {
    segs: Vec<String>,
    name: String,
    at: usize,
}

/// The path tree starting at `code[*i..]` (`a::b`, `a::{b, c::d as e, self}`, `a::*`), each
/// leaf prefixed with `prefix`. Inside a `{…}` group whitespace is allowed; at the top level the
/// path ends at the first character that continues no path (`(`, `<`, ` `, `;`, …).
fn path_tree(code: &str, i: &mut usize, prefix: &[String], in_group: bool, out: &mut Vec<Leaf>) {
    let bytes = code.as_bytes();
    let skip_ws = |i: &mut usize| {
        while *i < bytes.len() && bytes[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    let mut segs = prefix.to_vec();
    loop {
        if in_group {
            skip_ws(i);
        }
        match bytes.get(*i) {
            Some(b'{') => {
                *i += 1;
                loop {
                    skip_ws(i);
                    match bytes.get(*i) {
                        None => return,
                        Some(b'}') => {
                            *i += 1;
                            return;
                        }
                        Some(b',') => *i += 1,
                        _ => {
                            let before = *i;
                            path_tree(code, i, &segs, true, out);
                            if *i == before {
                                *i += 1; // not a path: step over it
                            }
                        }
                    }
                }
            }
            Some(b'*') => {
                *i += 1;
                let at = *i - 1;
                segs.push("*".into());
                out.push(Leaf { segs, name: "*".into(), at });
                return;
            }
            _ => {}
        }
        let at = *i;
        let id = ident_at(&code[at..]);
        if id.is_empty() {
            return;
        }
        *i += id.len();
        // `self` in a group names the group's own prefix.
        if !(id == "self" && in_group && segs.len() == prefix.len() && !segs.is_empty()) {
            segs.push(id.to_string());
        }
        if code[*i..].starts_with("::") {
            *i += 2;
            continue;
        }
        let mut name = segs.last().cloned().unwrap_or_default();
        let mut j = *i;
        skip_ws(&mut j);
        if let Some(r) = code[j..].strip_prefix("as ") {
            let alias = ident_at(r.trim_start());
            if !alias.is_empty() {
                name = alias.to_string();
                *i = j + 3 + (r.len() - r.trim_start().len()) + alias.len();
            }
        }
        out.push(Leaf { segs, name, at });
        return;
    }
}

/// One module of the crate: its path (`["live", "actors"]`), file and code (blanked).
struct Module {
    file: String,
    code: String,
}

/// The crate's modules and what each imports by name (`use` items, any visibility), from
/// `(path relative to src, text)` pairs.
struct Crate {
    modules: BTreeMap<Vec<String>, Module>,
    /// Per module: bound name → absolute path (crate-relative segments).
    imports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
}

/// Sibling edges `(from, to)` and where the code makes each (`file:line`).
type Edges = BTreeMap<(Vec<String>, Vec<String>), Vec<String>>;

/// A strongly connected set of siblings and the edges inside it.
type Cycle = (Vec<Vec<String>>, Edges);

/// A dependency of one module on another, where the code names it.
#[derive(Debug, Clone)]
struct Dep {
    from: Vec<String>,
    to: Vec<String>,
    at: String,
}

fn module_path(file: &str) -> Vec<String> {
    let file = file.strip_suffix(".rs").unwrap_or(file);
    let mut segs: Vec<String> = file.split('/').map(str::to_string).collect();
    if matches!(segs.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        segs.pop();
    }
    segs
}

fn line_of(code: &str, at: usize) -> usize {
    code[..at].matches('\n').count() + 1
}

impl Crate {
    fn new(files: &[(String, String)]) -> Crate {
        let mut modules = BTreeMap::new();
        let mut test_modules = BTreeSet::new();
        for (file, text) in files {
            let (code, tests) = without_test_modules(&blank_non_code(text));
            let path = module_path(file);
            for t in tests {
                let mut p = path.clone();
                p.push(t);
                test_modules.insert(p);
            }
            modules.insert(path, Module { file: file.clone(), code });
        }
        modules.retain(|p, _| !test_modules.iter().any(|t| p.starts_with(t)));
        let mut krate = Crate { modules, imports: BTreeMap::new() };
        let imports = krate.modules.iter().map(|(p, m)| (p.clone(), krate.use_items(p, &m.code))).collect();
        krate.imports = imports;
        krate
    }

    /// `segs` as written in module `from`, made absolute; `None` for another crate's path.
    fn absolute(&self, from: &[String], segs: &[String]) -> Option<Vec<String>> {
        let (mut base, mut rest) = match segs.first().map(String::as_str) {
            Some("crate") => (Vec::new(), &segs[1..]),
            Some("self") => (from.to_vec(), &segs[1..]),
            Some("super") => (from.to_vec(), segs),
            Some(head) => {
                let mut child = from.to_vec();
                child.push(head.to_string());
                if !self.modules.contains_key(&child) {
                    return None;
                }
                (from.to_vec(), segs)
            }
            None => return None,
        };
        while rest.first().is_some_and(|s| s == "super") {
            base.pop()?;
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The names that `use` items of module `from` bind, with the absolute paths they name.
    fn use_items(&self, from: &[String], code: &str) -> BTreeMap<String, Vec<String>> {
        let mut names = BTreeMap::new();
        let mut k = 0;
        while let Some(d) = code[k..].find("use ") {
            let at = k + d;
            k = at + 4;
            if code[..at].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let mut i = k + (code[k..].len() - code[k..].trim_start().len());
            let mut leaves = Vec::new();
            path_tree(code, &mut i, &[], false, &mut leaves);
            for l in leaves {
                if l.name != "*"
                    && let Some(abs) = self.absolute(from, &l.segs)
                {
                    names.insert(l.name, abs);
                }
            }
        }
        names
    }

    /// The module an absolute path leads to from module `from`: its deepest existing module,
    /// following names imported by an ancestor of `from` (or `from` itself) to their source.
    fn resolve(&self, from: &[String], path: &[String], hops: usize) -> Vec<String> {
        let mut k = path.len();
        while k > 0 && !self.modules.contains_key(&path[..k]) {
            k -= 1;
        }
        let m = &path[..k];
        if k < path.len()
            && hops < 16
            && from.starts_with(m)
            && let Some(target) = self.imports.get(m).and_then(|n| n.get(&path[k]))
        {
            let mut t = target.clone();
            t.extend(path[k + 1..].iter().cloned());
            return self.resolve(from, &t, hops + 1);
        }
        m.to_vec()
    }

    /// Every `crate::…` / `super::…` path in the code of each module, resolved.
    fn deps(&self) -> Vec<Dep> {
        let mut deps = Vec::new();
        for (from, m) in &self.modules {
            let code = &m.code;
            for root in ["crate::", "super::"] {
                let mut k = 0;
                while let Some(d) = code[k..].find(root) {
                    let at = k + d;
                    k = at + root.len();
                    let prev = code[..at].chars().next_back();
                    if prev.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '$') {
                        continue;
                    }
                    let mut i = at;
                    let mut leaves = Vec::new();
                    path_tree(code, &mut i, &[], false, &mut leaves);
                    for l in leaves {
                        let Some(abs) = self.absolute(from, &l.segs) else { continue };
                        let to = self.resolve(from, &abs, 0);
                        deps.push(Dep { from: from.clone(), to, at: format!("{}:{}", m.file, line_of(code, l.at)) });
                    }
                }
            }
        }
        deps
    }

    /// The dependencies as edges between siblings: `(from sibling, to sibling) → where`.
    fn sibling_edges(&self) -> Edges {
        let mut edges = Edges::new();
        for d in self.deps() {
            let common = d.from.iter().zip(&d.to).take_while(|(a, b)| a == b).count();
            if common == d.from.len() || common == d.to.len() {
                continue; // a module and its own ancestor or descendant
            }
            let key = (d.from[..=common].to_vec(), d.to[..=common].to_vec());
            let at = edges.entry(key).or_default();
            if !at.contains(&d.at) {
                at.push(d.at);
            }
        }
        edges
    }

    /// The import cycles: every strongly connected set of two or more siblings, with the edges
    /// inside it.
    fn cycles(&self) -> Vec<Cycle> {
        let edges = self.sibling_edges();
        let mut next: BTreeMap<&Vec<String>, Vec<&Vec<String>>> = BTreeMap::new();
        for (a, b) in edges.keys() {
            next.entry(a).or_default().push(b);
        }
        let reach = |start: &Vec<String>| {
            let mut seen = BTreeSet::new();
            let mut todo = vec![start];
            while let Some(n) = todo.pop() {
                for &m in next.get(n).into_iter().flatten() {
                    if seen.insert(m.clone()) {
                        todo.push(m);
                    }
                }
            }
            seen
        };
        let reached: BTreeMap<&Vec<String>, BTreeSet<Vec<String>>> = next.keys().map(|&n| (n, reach(n))).collect();
        let mut done = BTreeSet::new();
        let mut out = Vec::new();
        for (&n, r) in &reached {
            if done.contains(n) || !r.contains(n) {
                continue;
            }
            let scc: Vec<Vec<String>> =
                r.iter().filter(|m| reached.get(m).is_some_and(|rm| rm.contains(n))).cloned().collect();
            done.extend(scc.iter().cloned());
            let inner = edges
                .iter()
                .filter(|((a, b), _)| scc.contains(a) && scc.contains(b))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            out.push((scc, inner));
        }
        out
    }
}

fn crate_files(root: &Path) -> Vec<(String, String)> {
    rust_files(root)
        .into_iter()
        .map(|f| {
            let text = fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            (f.strip_prefix(root).expect("under src").to_string_lossy().replace('\\', "/"), text)
        })
        .collect()
}

fn name(path: &[String]) -> String {
    if path.is_empty() { "crate".to_string() } else { path.join("::") }
}

/// The cycles of `krate`, one paragraph each: the modules, then every edge with where it is.
fn cycle_report(krate: &Crate) -> Vec<String> {
    krate
        .cycles()
        .into_iter()
        .map(|(scc, edges)| {
            let mods: Vec<String> = scc.iter().map(|m| name(m)).collect();
            let lines: Vec<String> =
                edges.iter().map(|((a, b), at)| format!("  {} -> {}: {}", name(a), name(b), at.join(", "))).collect();
            format!("cycle among {}:\n{}", mods.join(", "), lines.join("\n"))
        })
        .collect()
}

#[test]
fn no_import_cycles_between_sibling_modules() {
    let krate = Crate::new(&crate_files(&src()));
    assert!(krate.modules.len() > 50, "only {} modules found under runtime/src", krate.modules.len());
    let report = cycle_report(&krate);
    assert!(
        report.is_empty(),
        "import cycles in runtime/src (a module uses a sibling that uses it back, directly or through a loop; \
         move what both need into a leaf module):\n{}",
        report.join("\n")
    );
}

#[test]
fn the_cycle_checker_sees_what_it_must() {
    let files = |fs: &[(&str, &str)]| fs.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect::<Vec<_>>();
    let tree = [
        ("lib.rs", "pub mod a;\npub mod b;\npub fn root() {}\n"),
        // A parent re-exporting and using its children is no edge; `helper` is its own item.
        ("a/mod.rs", "pub mod x;\npub mod y;\npub mod z;\npub use y::Thing;\npub fn helper() { x::f(); }\n"),
        // Through the parent's re-export to `a::y`; the parent's own `helper` and the root are no edge.
        ("a/x.rs", "use super::{Thing, helper};\nuse crate::root;\npub fn f() {}\n"),
        // Back to `a::x` from a group spread over lines: a cycle {a::x, a::y}.
        ("a/y.rs", "pub struct Thing;\nuse super::{\n    z,\n    x::f as g,\n};\n"),
        // Comments, strings, character literals and test modules name nothing.
        (
            "a/z.rs",
            "// use super::x;\n/* crate::a::y */ const S: &str = \"super::x\";\nconst C: char = '{';\n\
             #[cfg(test)]\nmod tests {\n    use super::super::x;\n}\n#[cfg(test)]\nmod more;\n",
        ),
        ("a/z/more.rs", "use crate::a::x;\n"),
        // Across levels: `b` uses `a::x` (an edge b -> a at the top), `a::z` does not use `b`.
        ("b.rs", "pub fn g() { crate::a::x::f() }\n"),
    ];
    let krate = Crate::new(&files(&tree));
    let edges: Vec<String> =
        krate.sibling_edges().into_iter().map(|((a, b), at)| format!("{} -> {} {}", name(&a), name(&b), at.join(","))).collect();
    assert_eq!(edges, ["a::x -> a::y a/x.rs:1", "a::y -> a::x a/y.rs:4", "a::y -> a::z a/y.rs:3", "b -> a b.rs:1"]);
    let report = cycle_report(&krate);
    assert_eq!(report, ["cycle among a::x, a::y:\n  a::x -> a::y: a/x.rs:1\n  a::y -> a::x: a/y.rs:4"]);
    // A loop through three siblings is one cycle; `super::super` climbs two levels.
    let ring = [
        ("lib.rs", "mod p;\nmod q;\nmod r;\n"),
        ("p.rs", "use crate::q::A;\n"),
        ("q/mod.rs", "mod inner;\n"),
        ("q/inner.rs", "fn f() { super::super::r::g() }\n"),
        ("r.rs", "type T = crate::p::P;\n"),
    ];
    let report = cycle_report(&Crate::new(&files(&ring)));
    assert_eq!(report, ["cycle among p, q, r:\n  p -> q: p.rs:1\n  q -> r: q/inner.rs:1\n  r -> p: r.rs:1"]);
}
