//! Compiles the shipped profiling data (`data/vidur-profiling`) into the crate, so that a
//! binary moved away from the source tree (`cargo install`, a container) still has the
//! measurements its default estimators train on.
//!
//! Every file the loader in `src/data.rs` reads is embedded: the device and model configs as
//! they are, and every `mlp.csv` / `attention.csv` reduced to the columns the loader reads
//! (each `*.median` time and the shape columns in `KEEP`), the rows and the text of every kept
//! field unchanged, so the parsed numbers are the same as from the files on disk (the unit
//! test `embedded_data_is_the_source_tree` in `src/data.rs` compares the two). Other files
//! (LICENSE, SOURCE.md, `cpu_overheads.csv`) are not read by the loader and are left out.
//!
//! Writes `$OUT_DIR/vidur_profiling.rs`: `EMBEDDED_FILES: &[(&str, &[u8])]`, the path of each
//! file relative to `data/vidur-profiling` (with `/` separators) and its bytes.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

/// Non-time columns the CSV readers look up (`read_mlp_csv`, `read_attention_csv`).
const KEEP: [&str; 9] = [
    "num_tokens",
    "num_tensor_parallel_workers",
    "n_embd",
    "n_q_head",
    "n_kv_head",
    "batch_size",
    "prefill_chunk_size",
    "kv_cache_size",
    "is_prefill",
];

/// Why the build script failed: cargo prints it and stops the build.
type BuildError = String;

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), BuildError> {
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", dir.display());
    let mut entries: Vec<PathBuf> =
        fs::read_dir(dir).map_err(cannot)?.map(|e| e.map(|e| e.path()).map_err(cannot)).collect::<Result<_, _>>()?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            walk(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// `text` with only the columns the loader reads. Vidur's CSVs quote nothing; a quote would
/// make splitting on commas wrong, so it stops the build instead. CRLF line ends (a checkout
/// that converts them) are read as LF.
fn project(path: &Path, text: &str) -> Result<String, BuildError> {
    let text = text.replace("\r\n", "\n");
    if text.contains('"') || text.contains('\r') {
        return Err(format!("{}: quoted fields or a lone CR; build.rs splits plain CSV only", path.display()));
    }
    let mut lines = text.split('\n');
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let keep: Vec<usize> = header
        .iter()
        .enumerate()
        .filter(|(_, name)| name.ends_with(".median") || KEEP.contains(name))
        .map(|(i, _)| i)
        .collect();
    let pick = |line: &str| -> String {
        if line.is_empty() {
            return String::new();
        }
        let fields: Vec<&str> = line.split(',').collect();
        // A short row keeps its length: the reader reports it, as it would from the file.
        keep.iter()
            .filter_map(|&i| fields.get(i).copied())
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut out = pick(&header.join(","));
    for line in lines {
        out.push('\n');
        out.push_str(&pick(line));
    }
    Ok(out)
}

fn main() -> Result<(), BuildError> {
    let var = |name: &str| std::env::var_os(name).map(PathBuf::from).ok_or_else(|| format!("cargo did not set {name}"));
    let root = var("CARGO_MANIFEST_DIR")?.join("data").join("vidur-profiling");
    let out_dir = var("OUT_DIR")?;
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", root.display());

    let mut files = Vec::new();
    walk(&root, &mut files)?;
    let mut table = String::from("pub static EMBEDDED_FILES: &[(&str, &[u8])] = &[\n");
    for (n, path) in files.iter().enumerate() {
        let rel = path.strip_prefix(&root).map_err(|e| format!("{}: {e}", path.display()))?;
        let rel_str = rel
            .components()
            .map(|c| c.as_os_str().to_str().map(str::to_string).ok_or_else(|| format!("{}: not UTF-8", path.display())))
            .collect::<Result<Vec<String>, _>>()?
            .join("/");
        let name = rel_str.rsplit('/').next().unwrap_or_default();
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default();
        let source = if name == "mlp.csv" || name == "attention.csv" {
            let text = fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let projected = out_dir.join(format!("vidur-{n}.csv"));
            fs::write(&projected, project(path, &text)?)
                .map_err(|e| format!("cannot write {}: {e}", projected.display()))?;
            projected
        } else if ext == "yml" || ext == "json" {
            path.clone()
        } else {
            continue;
        };
        // Writing to a String cannot fail.
        let _ = writeln!(table, "    ({rel_str:?}, include_bytes!({:?})),", source.display().to_string());
    }
    table.push_str("];\n");
    let target = out_dir.join("vidur_profiling.rs");
    fs::write(&target, table).map_err(|e| format!("cannot write {}: {e}", target.display()))
}
