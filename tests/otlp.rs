//! OTLP export (cargo feature `otlp`, off by default), end to end over the real binary:
//! `switchyard run --live` on the emulated pool with `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at
//! a local OTLP/HTTP sink. The sink must receive the runtime's spans: protobuf
//! `ExportTraceServiceRequest` bodies on `/v1/traces` naming the service, the `session` and
//! `activation` spans and their workflow. `.ci/run` runs it with `--features otlp`; without the
//! feature this file compiles to nothing.
#![cfg(feature = "otlp")]

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;

const EXE: &str = env!("CARGO_BIN_EXE_switchyard");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn a_live_run_exports_its_spans_to_an_otlp_collector() {
    let received: Arc<Mutex<Vec<Bytes>>> = Arc::default();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let addr = {
        let received = Arc::clone(&received);
        rt.block_on(async move {
            let app = Router::new().route(
                "/v1/traces",
                post(move |body: Bytes| {
                    let received = Arc::clone(&received);
                    async move {
                        received.lock().expect("sink").push(body);
                        // An empty `ExportTraceServiceResponse`: everything accepted.
                        ([("content-type", "application/x-protobuf")], Vec::<u8>::new())
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            tokio::spawn(async move { axum::serve(listener, app).await });
            addr
        })
    };
    let out = Command::new(EXE)
        .args(["run", "--live", "--json", "--sessions", "2", "--deadline", "120", "--pool"])
        .arg(repo().join("workflows/pools/live-emulated.yaml"))
        .arg(repo().join("tests/fixtures/tiny_chain.yaml"))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"))
        .env("RUST_LOG", "switchyard_runtime=info")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()
        .expect("run switchyard");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the run failed: {stderr}");
    assert!(!stderr.contains("OTLP export"), "the exporter complained: {stderr}");
    let bodies = received.lock().expect("sink").clone();
    assert!(!bodies.is_empty(), "no OTLP request reached the collector: {stderr}");
    let all: Vec<u8> = bodies.iter().flat_map(|b| b.iter().copied()).collect();
    for needle in ["session", "activation", "tiny-chain"] {
        assert!(contains(&all, needle), "`{needle}` is in no exported span ({} bytes in {} requests)", all.len(), bodies.len());
    }
    // The resource attribute as protobuf encodes it: KeyValue { key: "service.name", value:
    // AnyValue { string_value: "switchyard" } }.
    let mut service = b"\x0a\x0cservice.name\x12\x0c\x0a\x0a".to_vec();
    service.extend_from_slice(b"switchyard");
    assert!(all.windows(service.len()).any(|w| w == service.as_slice()), "the service name is not `switchyard`");
}
