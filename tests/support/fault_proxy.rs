//! A fault-injecting HTTP proxy for the live runtime's fault tests: it forwards every request
//! to an upstream OpenAI-compatible server (a `switchyard emulate` in process, or a real
//! third-party server) and, on the completion endpoints (`/v1/completions`,
//! `/v1/chat/completions`), injects the fault it is set to. It records the completion request
//! bodies it saw, so a test can check what reached the server. Loopback only; it runs on its
//! own tokio runtime and stops when dropped.

#![allow(dead_code)] // each test file uses a different part of it

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// What the proxy does to completion calls (everything else is forwarded as is).
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Forward.
    None,
    /// Answer every request (all paths) with this status and an OpenAI error body.
    Everything { status: u16 },
    /// Answer the next `times` completion calls with `status` (and `Retry-After` seconds),
    /// then forward.
    Status { status: u16, retry_after: Option<f64>, times: usize },
    /// Start a 200 answer, then cut the body: the client sees the connection drop.
    Drop,
    /// Never answer completion calls.
    Stall,
}

struct ProxyState {
    upstream: String,
    fault: Mutex<Fault>,
    hide_version: bool,
    client: reqwest::Client,
    completion_calls: AtomicUsize,
    injected: AtomicUsize,
    bodies: Mutex<Vec<String>>,
}

pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl FaultProxy {
    /// A proxy in front of `upstream` (`http://host:port`, the server root). With
    /// `hide_version`, `/version` answers 404, as on a server that is not `switchyard emulate`.
    pub fn start(upstream: &str, fault: Fault, hide_version: bool) -> FaultProxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("proxy runtime");
        let state = Arc::new(ProxyState {
            upstream: upstream.trim_end_matches('/').to_string(),
            fault: Mutex::new(fault),
            hide_version,
            client: reqwest::Client::builder().no_proxy().build().expect("client"),
            completion_calls: AtomicUsize::new(0),
            injected: AtomicUsize::new(0),
            bodies: Mutex::new(Vec::new()),
        });
        let app = Router::new().fallback(forward).with_state(Arc::clone(&state));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        runtime.spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FaultProxy { addr, state, runtime: Some(runtime) }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_fault(&self, fault: Fault) {
        *self.state.fault.lock().expect("fault") = fault;
    }

    /// Completion calls that reached the proxy.
    pub fn completion_calls(&self) -> usize {
        self.state.completion_calls.load(Ordering::SeqCst)
    }

    /// Completion calls answered with an injected fault.
    pub fn injected(&self) -> usize {
        self.state.injected.load(Ordering::SeqCst)
    }

    /// The completion request bodies seen.
    pub fn bodies(&self) -> Vec<String> {
        self.state.bodies.lock().expect("bodies").clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

fn error_body(status: StatusCode) -> String {
    serde_json::json!({"error": {"message": format!("injected {status}"), "type": "injected", "code": status.as_u16()}})
        .to_string()
}

async fn forward(State(state): State<Arc<ProxyState>>, request: Request) -> Response {
    let path = request.uri().path().to_string();
    let query = request.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
    let method = request.method().clone();
    let headers = request.headers().clone();
    let body = match axum::body::to_bytes(request.into_body(), 64 << 20).await {
        Ok(b) => b,
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    let fault = state.fault.lock().map(|f| f.clone()).unwrap_or(Fault::None);
    if let Fault::Everything { status } = fault {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (status, error_body(status)).into_response();
    }
    if state.hide_version && path == "/version" {
        return (StatusCode::NOT_FOUND, "{\"detail\":\"Not Found\"}").into_response();
    }
    if path.ends_with("/completions") {
        state.completion_calls.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut b) = state.bodies.lock() {
            b.push(String::from_utf8_lossy(&body).into_owned());
        }
        match fault {
            Fault::Status { status, retry_after, times } if times > 0 => {
                if let Ok(mut f) = state.fault.lock() {
                    *f = Fault::Status { status, retry_after, times: times - 1 };
                }
                state.injected.fetch_add(1, Ordering::SeqCst);
                let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                let mut r = (status, error_body(status)).into_response();
                if let Some(s) = retry_after
                    && let Ok(v) = HeaderValue::from_str(&s.to_string())
                {
                    r.headers_mut().insert("retry-after", v);
                }
                return r;
            }
            Fault::Drop => {
                state.injected.fetch_add(1, Ordering::SeqCst);
                let cut = futures::stream::iter([
                    Ok::<Bytes, std::io::Error>(Bytes::from_static(b"{\"choices\": [")),
                    Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "injected drop")),
                ]);
                return Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "application/json")
                    .body(Body::from_stream(cut))
                    .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
            }
            Fault::Stall => {
                state.injected.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
            }
            _ => {}
        }
    }
    let url = format!("{}{}{}", state.upstream, path, query);
    let mut upstream = state.client.request(method, url).body(body);
    for (name, value) in headers.iter() {
        if name != "host" && name != "content-length" {
            upstream = upstream.header(name, value);
        }
    }
    match upstream.send().await {
        Ok(r) => {
            let mut out = Response::builder().status(r.status());
            for (name, value) in r.headers() {
                if name != "content-length" && name != "transfer-encoding" {
                    out = out.header(name, value);
                }
            }
            out.body(Body::from_stream(r.bytes_stream()))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
        }
        Err(e) => (StatusCode::BAD_GATEWAY, format!("upstream: {e}")).into_response(),
    }
}
