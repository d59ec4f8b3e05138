//! Where `--pool` points: a path given explicitly is used as given (relative to the current
//! directory); without one, the default `workflows/pools/paper.yaml` is looked up relative to
//! the current directory, then as `pools/paper.yaml` next to the first workflow file, then under
//! the repository root found by walking up from that workflow file (the first ancestor that
//! holds `workflows/pools/paper.yaml`). Not finding it is an error listing every place tried.
//!
//! Must not depend on the runtime or the binary's other modules: it resolves a path (it checks
//! which candidates are files and reads none).

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The default pool file, relative to the repository root.
pub const DEFAULT_POOL: &str = "workflows/pools/paper.yaml";

/// The pool file to read: `given` as given, or the default looked up as described above.
pub fn resolve(given: Option<&Path>, first_workflow: Option<&Path>) -> Result<PathBuf> {
    resolve_from(given, first_workflow, Path::new(""))
}

/// [`resolve`] with the current directory's candidate taken relative to `cwd` (tests).
fn resolve_from(given: Option<&Path>, first_workflow: Option<&Path>, cwd: &Path) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let (tried, walked) = candidates(first_workflow, cwd);
    if let Some(found) = tried.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    let mut list: Vec<String> = tried.iter().map(|p| format!("  {}", p.display())).collect();
    if let Some(dir) = walked {
        list.push(format!("  {DEFAULT_POOL} under {} and every directory above it", dir.display()));
    }
    bail!(
        "no --pool given and the default pool file `{DEFAULT_POOL}` was not found; looked in:\n{}\npass --pool FILE",
        list.join("\n")
    )
}

/// The places the default is looked for, in order, without duplicates; and, when the walk up
/// from the workflow's directory found nothing, that directory (for the error).
fn candidates(first_workflow: Option<&Path>, cwd: &Path) -> (Vec<PathBuf>, Option<PathBuf>) {
    let mut out = vec![cwd.join(DEFAULT_POOL)];
    let mut walked = None;
    if let Some(wf) = first_workflow {
        let dir = match wf.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        out.push(dir.join("pools").join("paper.yaml"));
        // The repository root: the first ancestor of the workflow's directory holding the default.
        let absolute = std::fs::canonicalize(&dir).unwrap_or(dir);
        match absolute.ancestors().map(|a| a.join(DEFAULT_POOL)).find(|p| p.is_file()) {
            Some(p) => out.push(p),
            None => walked = Some(absolute),
        }
    }
    let mut unique: Vec<PathBuf> = Vec::new();
    for p in out {
        if !unique.contains(&p) {
            unique.push(p);
        }
    }
    (unique, walked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_path_is_kept_as_given() {
        let p = resolve(Some(Path::new("rel/pool.yaml")), Some(Path::new("x/w.yaml"))).unwrap();
        assert_eq!(p, PathBuf::from("rel/pool.yaml"));
    }

    #[test]
    fn the_default_is_found_next_to_the_workflow_or_up_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let cwd = tempfile::tempdir().unwrap();
        let resolve = |g: Option<&Path>, w: Option<&Path>| resolve_from(g, w, cwd.path());
        std::fs::create_dir_all(root.join("workflows/pools")).unwrap();
        std::fs::write(root.join("workflows/pools/paper.yaml"), "x").unwrap();
        std::fs::create_dir_all(root.join("workflows/sub/deeper")).unwrap();
        // Next to the workflow: <wfdir>/pools/paper.yaml.
        let p = resolve(None, Some(&root.join("workflows/w.yaml"))).unwrap();
        assert!(p.ends_with("workflows/pools/paper.yaml") && p.is_file(), "{}", p.display());
        // Deeper: found by walking up to the root.
        let p = resolve(None, Some(&root.join("workflows/sub/deeper/w.yaml"))).unwrap();
        assert!(p.is_file(), "{}", p.display());
        // Nowhere: the error lists the places tried.
        let empty = tempfile::tempdir().unwrap();
        let e = resolve(None, Some(&empty.path().join("w.yaml"))).unwrap_err().to_string();
        assert!(e.contains("looked in") && e.contains("pools/paper.yaml") && e.contains("--pool"), "{e}");
        assert_eq!(e.lines().filter(|l| l.starts_with("  ")).count(), 3, "cwd, next to the workflow, the walk up: {e}");
    }
}
