//! Running `switchyard serve` as a user would, for the serve and examples tests: the binary
//! on the bundled live-emulated pool (slowed down where a test needs time), its address read
//! from stderr, killed when dropped.

#![allow(dead_code)] // each test file uses a different part of it

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_switchyard");
pub const TOKEN: &str = "test-token-0123456789abcdef";

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The bundled live-emulated pool at a lower speed (5×), so that a load takes long enough to
/// cancel a run before its first call.
pub fn slow_pool(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("workflows/pools/live-emulated.yaml")).expect("pool");
    let path = dir.join("pool.yaml");
    std::fs::write(&path, text.replace("speed: 50", "speed: 5")).expect("write pool");
    path
}

/// A chain on Qwen3-8B with long answers (the cancel test's run).
pub const LONG_CHAIN: &str = "name: long-chain\ndeployments:\n  big: {model: Qwen3-8B, dtype: fp16, max_context: 4096, max_output_tokens: 3000}\n\
nodes:\n  - id: write\n    deployment: big\n    max_output_tokens: 3000\n    output_tokens: {mean: 2500, cv: 0.1}\n    prompt: Write at length.\n";

pub struct Server {
    pub child: Child,
    pub base: String,
}

impl Server {
    /// `switchyard serve` on the bundled pool slowed to 5× with the tiny chain and a chain of
    /// long answers on Qwen3-8B (`long-chain`).
    pub fn start_slow(dir: &Path) -> Server {
        let long = dir.join("long.yaml");
        std::fs::write(&long, LONG_CHAIN).expect("write workflow");
        let pool = slow_pool(dir);
        Self::start(&pool, &[&repo().join("tests/fixtures/tiny_chain.yaml"), &long])
    }

    /// `switchyard serve --pool POOL --workflow W…` with the test token, on a free port.
    pub fn start(pool: &Path, workflows: &[&Path]) -> Server {
        Self::start_with(pool, workflows, &[])
    }

    /// [`Server::start`] with more arguments.
    pub fn start_with(pool: &Path, workflows: &[&Path], extra: &[&std::ffi::OsStr]) -> Server {
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--pool"]).arg(pool);
        for w in workflows {
            cmd.arg("--workflow").arg(w);
        }
        cmd.args(extra);
        let mut child = cmd
            .current_dir(repo())
            .env("SWITCHYARD_API_TOKEN", TOKEN)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn switchyard serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[serve] {line}");
                if let Some(addr) = line.split("listening on ").nth(1) {
                    let _ = tx.send(addr.split_whitespace().next().unwrap_or("").to_string());
                }
            }
        });
        let base = rx.recv_timeout(Duration::from_secs(60)).expect("the server says where it listens");
        Server { child, base }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
