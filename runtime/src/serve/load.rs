//! `switchyard bench front-door`: what the front door costs and whether it holds under load,
//! measured side by side on one emulated engine.
//!
//! Set-up (one process): a `switchyard emulate` server (Qwen3-0.6B on an A100-80GB at
//! `speed`×) in process, and a served runtime whose pool is that server as a fixed OpenAI
//! endpoint, with its REST API and front door on a loopback port (no token). The same load
//! is sent
//! * **direct**: to the emulate server's `/v1/chat/completions`;
//! * **front door**: to the runtime's `/v1/chat/completions` (each program its own
//!   `X-Session-ID`), which the planner schedules onto the same server.
//!
//! Load: `programs` concurrent programs, each `calls` sequential streamed calls of
//! `max_tokens` tokens (the last marked `X-Program-Done`); the latency of a call is from
//! sending it to reading `[DONE]`. Rounds alternate direct and front door in ABBA order (direct
//! first in even rounds, front door first in odd ones) so drift hits both alike. The added latency is front door minus
//! direct at the same percentile — the runtime's overhead (parsing, tokenizing the prompt, the
//! planner's tick, the actors' hops, re-streaming) plus any difference in how the engine
//! batched the two loads. Two arrival patterns, each measured both ways:
//! * **steady**: the programs' first calls are spread evenly over one call's duration under the
//!   load (the burst pattern's direct median), so that calls start and end all the time rather
//!   than in waves — what a pool serving that many agents sees;
//! * **burst**: every program sends its first call at the same instant (the worst case: the
//!   front door's per-call work for all of them queues on the cores before any reaches the
//!   engine, and the engine sees them arrive over several of its steps instead of one).
//!
//! Before the measured rounds, one unmeasured burst per path fills the connection pools.
//!
//! At `speed` 1 the engine keeps a real GPU's pace and the cores are not the bottleneck; at a
//! higher speed the same load saturates the cores and measures throughput instead.
//!
//! Soak: `soak` programs at once through the front door, one streamed call of `soak_tokens`
//! tokens each (the program's last: `X-Program-Done`); a stream counts as whole when it ends with `[DONE]` after exactly
//! `soak_tokens` content pieces. The process's resident memory is sampled (engine, runtime and
//! clients together: they share the process).
//!
//! Depends on `crate::live` (service, emulate server) and this module's router; must not
//! depend on the simulator.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use serde_json::json;
use thiserror::Error;

use super::{ApiConfig, router, serve_until};
use crate::exec::RunConfig;
use crate::live::engines::EngineSpec;
use crate::live::server::{EmulateConfig, EmulateServer};
use crate::live::server::ServeError;
use crate::live::{LiveConfig, LiveError, LivePoolError, LivePoolSpec, PoolEngines, Service};
use crate::workflow::{WorkflowError, parse_workflow};

/// Why the front-door measurement was refused or could not be made.
#[derive(Debug, Error)]
pub enum LoadError {
    /// A count of [`LoadOptions`] (`programs`, `calls`, `rounds`, `max_tokens`) is 0.
    #[error("{name} must be at least 1")]
    Zero { name: &'static str },
    /// A soak of empty streams.
    #[error("soak_tokens must be at least 1 when soak is not 0")]
    EmptySoak,
    /// A pace that is not a positive finite number.
    #[error("speed must be positive and finite (got {0})")]
    Speed(f64),
    /// The in-process emulated engine did not start.
    #[error(transparent)]
    Engine(#[from] ServeError),
    /// The benchmark's own workflow was refused.
    #[error(transparent)]
    Workflow(#[from] WorkflowError),
    /// The benchmark's pool was refused.
    #[error(transparent)]
    Pool(#[from] LivePoolError),
    /// The served runtime did not start.
    #[error(transparent)]
    Service(#[from] LiveError),
    /// The HTTP client could not be built.
    #[error(transparent)]
    Http(#[from] reqwest::Error),
    /// The front door's listener could not be bound or read.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A call before the measured rounds (`what`: which) failed.
    #[error("{what}: {message}")]
    Call { what: &'static str, message: String },
    /// Calls of the unmeasured warm-up burst to `url` failed.
    #[error("{failed} warm-up calls to {url} failed")]
    WarmUp { failed: usize, url: String },
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub programs: usize,
    pub calls: usize,
    pub max_tokens: u32,
    pub rounds: usize,
    pub soak: usize,
    pub soak_tokens: u32,
    pub speed: f64,
}

impl LoadOptions {
    /// Refuse a measurement that could not measure anything: no programs, calls, rounds or
    /// tokens, a soak of empty streams, or a pace that is not a positive finite number.
    pub fn check(&self) -> Result<(), LoadError> {
        for (name, value) in [("programs", self.programs), ("calls", self.calls), ("rounds", self.rounds), ("max_tokens", self.max_tokens as usize)] {
            if value == 0 {
                return Err(LoadError::Zero { name });
            }
        }
        if self.soak > 0 && self.soak_tokens == 0 {
            return Err(LoadError::EmptySoak);
        }
        if !(self.speed > 0.0 && self.speed.is_finite()) {
            return Err(LoadError::Speed(self.speed));
        }
        Ok(())
    }
}

/// Seconds as a `Duration`; zero for a NaN, negative or unrepresentable value (a measurement
/// with no calls has a NaN p50), never a panic.
fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or_default()
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { programs: 100, calls: 5, max_tokens: 64, rounds: 2, soak: 1000, soak_tokens: 256, speed: 1.0 }
    }
}

/// Latency percentiles of one side, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    pub calls: usize,
    pub failed: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub calls_per_s: f64,
}

/// One arrival pattern, measured directly and through the front door.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The programs' first calls are spread evenly over this many seconds (0: all at once).
    pub spread_s: f64,
    pub direct: Side,
    pub front_door: Side,
    /// Front door minus direct, at p50 and p99 (ms).
    pub added_p50_ms: f64,
    pub added_p99_ms: f64,
}

impl Comparison {
    fn new(spread_s: f64, direct: Side, front_door: Side) -> Self {
        Comparison {
            spread_s,
            added_p50_ms: front_door.p50_ms - direct.p50_ms,
            added_p99_ms: front_door.p99_ms - direct.p99_ms,
            direct,
            front_door,
        }
    }
}

/// The measurement.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    pub programs: usize,
    pub calls_per_program: usize,
    pub max_tokens: u32,
    pub speed: f64,
    /// One call alone, direct (ms).
    pub single_call_ms: f64,
    pub steady: Comparison,
    pub burst: Comparison,
    pub soak_programs: usize,
    pub soak_tokens: u32,
    pub soak_whole_streams: usize,
    pub soak_wall_s: f64,
    pub rss_before_mib: f64,
    pub rss_peak_mib: f64,
    pub rss_after_mib: f64,
}

const MODEL: &str = "Qwen3-0.6B";

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()))
        .map_or(0.0, |kib| kib / 1024.0)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One streamed call; `Ok((latency, content pieces))` when it ended with `[DONE]`.
async fn call(http: &reqwest::Client, url: &str, program: Option<&str>, max_tokens: u32) -> Result<(Duration, usize), String> {
    call_as(http, url, program, max_tokens, false).await
}

/// [`call`], saying whether it is the program's last (`X-Program-Done`).
async fn call_as(http: &reqwest::Client, url: &str, program: Option<&str>, max_tokens: u32, last: bool) -> Result<(Duration, usize), String> {
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about agent workflows."}],
        "max_tokens": max_tokens,
        "stream": true,
    });
    let started = Instant::now();
    let mut req = http.post(url).json(&body);
    if let Some(p) = program {
        req = req.header("X-Session-ID", p);
    }
    if last {
        req = req.header("X-Program-Done", "true");
    }
    let resp = req.send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    while let Some(chunk) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.map_err(|e| e.to_string())?));
    }
    let latency = started.elapsed();
    if !text.contains("data: [DONE]") {
        return Err("the stream ended without [DONE]".into());
    }
    let pieces = text.matches("\"content\":\"").count();
    Ok((latency, pieces))
}

/// `programs` programs × `calls` sequential calls of `max_tokens` tokens against `url`, the
/// programs' first calls spread evenly over `spread_s` seconds; latencies in ms, failures, wall
/// seconds.
async fn load(http: &reqwest::Client, url: &str, tag: &str, (programs, calls, max_tokens, spread_s): (usize, usize, u32, f64)) -> (Vec<f64>, usize, f64) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..programs)
        .map(|p| {
            let http = http.clone();
            let url = url.to_string();
            let program = format!("{tag}-{p}");
            let offset = secs(spread_s * p as f64 / programs.max(1) as f64);
            tokio::spawn(async move {
                tokio::time::sleep(offset).await;
                let mut out = Vec::new();
                let mut failed = 0;
                for c in 0..calls {
                    match call_as(&http, &url, Some(&program), max_tokens, c + 1 == calls).await {
                        Ok((d, _)) => out.push(d.as_secs_f64() * 1e3),
                        Err(_) => failed += 1,
                    }
                }
                (out, failed)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut failed = 0;
    for t in tasks {
        if let Ok((l, f)) = t.await {
            all.extend(l);
            failed += f;
        }
    }
    (all, failed, started.elapsed().as_secs_f64())
}

fn side(mut lat: Vec<f64>, failed: usize, wall: f64) -> Side {
    lat.sort_by(f64::total_cmp);
    Side {
        calls: lat.len(),
        failed,
        p50_ms: percentile(&lat, 0.5),
        p90_ms: percentile(&lat, 0.9),
        p99_ms: percentile(&lat, 0.99),
        calls_per_s: if wall > 0.0 { lat.len() as f64 / wall } else { 0.0 },
    }
}

/// Run the measurement (inside a multi-threaded tokio runtime).
pub async fn front_door_bench(opts: &LoadOptions) -> Result<LoadReport, LoadError> {
    opts.check()?;
    let engine = EmulateServer::start(
        EmulateConfig {
            device: "A100-80GB".into(),
            model: MODEL.into(),
            dtype: switchyard_predictor::spec::Dtype::Fp16,
            max_model_len: Some(4096),
            gpu_memory_utilization: 0.9,
            max_num_seqs: 1024,
            speed: opts.speed,
            noise_seed: 0,
            served_model_name: None,
            fail_rate: 0.0,
            garbage_rate: 0.0,
            fault_seed: 0,
        },
        std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await?;
    let direct_base = engine.base_url();
    let http = reqwest::Client::builder().pool_max_idle_per_host(2048).build()?;
    // Wait for the emulated start-up load (tens of emulated seconds: up to 5 minutes of wall
    // time at real pace).
    for _ in 0..6_000 {
        if http.get(format!("{direct_base}/health")).send().await.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let workflow = parse_workflow(
        "front-door-bench",
        "name: bench\ndeployments:\n  m: {model: Qwen3-0.6B, dtype: fp16, max_context: 4096, max_output_tokens: 1024}\nnodes:\n  - id: a\n    deployment: m\n    prompt: hi\n",
        Path::new("."),
    )?;
    let pool_text = format!(
        "name: bench\ndevices:\n  - kind: A100-80GB\n    count: 1\n    engine: {{ kind: openai, base_url: \"{direct_base}/v1\", request_timeout_s: 600, models: {{ {MODEL}: {MODEL} }} }}\n"
    );
    let pool: LivePoolSpec<EngineSpec> = LivePoolSpec::parse(Path::new("bench-pool.yaml"), &pool_text)?;
    let mut run = RunConfig::served(vec![Arc::new(workflow)], pool.pool.clone());
    run.tool_workers = 1;
    run.max_num_seqs = 1024;
    let engines = PoolEngines::new(&pool, 0, None)?;
    let mut cfg = LiveConfig::new(run);
    cfg.speed = opts.speed;
    cfg.stream = true;
    cfg.telemetry_every = None;
    let service = Arc::new(Service::start(&cfg, Arc::new(engines)).await?);
    let app = router(Arc::clone(&service), ApiConfig { token: None, ..ApiConfig::default() }, Vec::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let front_base = format!("http://{}", listener.local_addr()?);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_until(listener, app, async move {
        let _ = stop_rx.await;
    }));

    let direct_url = format!("{direct_base}/v1/chat/completions");
    let front_url = format!("{front_base}/v1/chat/completions");
    // Warm both paths (the front door's first call loads the replica).
    call(&http, &front_url, Some("warm"), 8).await.map_err(|message| LoadError::Call { what: "warm-up through the front door", message })?;
    call(&http, &direct_url, None, 8).await.map_err(|message| LoadError::Call { what: "warm-up direct", message })?;

    let (single, _) = call(&http, &direct_url, None, opts.max_tokens).await.map_err(|message| LoadError::Call { what: "a single direct call", message })?;
    let single_call_ms = single.as_secs_f64() * 1e3;
    let compare = |pattern: &'static str, spread_s: f64| {
        let (http, direct_url, front_url) = (&http, &direct_url, &front_url);
        async move {
            let (mut dl, mut df, mut dw) = (Vec::new(), 0, 0.0);
            let (mut fl, mut ff, mut fw) = (Vec::new(), 0, 0.0);
            for r in 0..opts.rounds {
                let shape = (opts.programs, opts.calls, opts.max_tokens, spread_s);
                for direct in if r % 2 == 0 { [true, false] } else { [false, true] } {
                    if direct {
                        let (l, f, w) = load(http, direct_url, &format!("{pattern}-d{r}"), shape).await;
                        dl.extend(l);
                        df += f;
                        dw += w;
                    } else {
                        let (l, f, w) = load(http, front_url, &format!("{pattern}-f{r}"), shape).await;
                        fl.extend(l);
                        ff += f;
                        fw += w;
                    }
                }
            }
            Comparison::new(spread_s, side(dl, df, dw), side(fl, ff, fw))
        }
    };
    // One unmeasured burst per path first: connection pools filled (client → front door, front
    // door → engine, client → engine), as a server that has been running has them.
    for url in [&direct_url, &front_url] {
        let (_, failed, _) = load(&http, url, "warm", (opts.programs, 1, opts.max_tokens, 0.0)).await;
        if failed > 0 {
            return Err(LoadError::WarmUp { failed, url: url.clone() });
        }
    }
    let burst = compare("burst", 0.0).await;
    let steady_spread_s = burst.direct.p50_ms / 1e3;
    let steady = compare("steady", if steady_spread_s.is_finite() { steady_spread_s } else { 0.0 }).await;

    // Soak.
    let rss_before = rss_mib();
    let sampling = Arc::new(AtomicBool::new(true));
    let peak = {
        let sampling = Arc::clone(&sampling);
        tokio::spawn(async move {
            let mut peak = 0.0f64;
            while sampling.load(Ordering::Relaxed) {
                peak = peak.max(rss_mib());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            peak
        })
    };
    let started = Instant::now();
    let tasks: Vec<_> = (0..opts.soak)
        .map(|p| {
            let http = http.clone();
            let url = front_url.clone();
            let tokens = opts.soak_tokens;
            tokio::spawn(async move {
                let program = format!("soak-{p}");
                matches!(call_as(&http, &url, Some(&program), tokens, true).await, Ok((_, n)) if n == tokens as usize)
            })
        })
        .collect();
    let mut whole = 0;
    for t in tasks {
        if t.await.unwrap_or(false) {
            whole += 1;
        }
    }
    let soak_wall_s = started.elapsed().as_secs_f64();
    sampling.store(false, Ordering::Relaxed);
    let rss_peak = peak.await.unwrap_or(0.0);
    let _ = stop_tx.send(());
    let _ = server.await;
    let _ = service.shutdown("the benchmark ended").await;
    let _ = engine.shutdown().await;
    let rss_after = rss_mib();
    Ok(LoadReport {
        programs: opts.programs,
        calls_per_program: opts.calls,
        max_tokens: opts.max_tokens,
        speed: opts.speed,
        single_call_ms,
        steady,
        burst,
        soak_programs: opts.soak,
        soak_tokens: opts.soak_tokens,
        soak_whole_streams: whole,
        soak_wall_s,
        rss_before_mib: rss_before,
        rss_peak_mib: rss_peak,
        rss_after_mib: rss_after,
    })
}

impl LoadReport {
    /// The report as Markdown.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "Front door vs direct: {} programs × {} streamed calls of {} tokens, emulated Qwen3-0.6B on A100-80GB at {}× \
             (one call alone: {:.1} ms)\n\n\
             | arrivals | path | calls | failed | p50 ms | p90 ms | p99 ms | calls/s |\n\
             | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
            self.programs, self.calls_per_program, self.max_tokens, self.speed, self.single_call_ms
        );
        let patterns = [("steady", &self.steady), ("burst", &self.burst)];
        for (name, c) in patterns {
            for (path, s) in [("direct", &c.direct), ("front door", &c.front_door)] {
                out.push_str(&format!(
                    "| {name} | {path} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
                    s.calls, s.failed, s.p50_ms, s.p90_ms, s.p99_ms, s.calls_per_s
                ));
            }
        }
        out.push('\n');
        for (name, c) in patterns {
            out.push_str(&format!(
                "added by the front door, {name} (first calls spread over {:.2} s): p50 {:+.2} ms, p99 {:+.2} ms\n",
                c.spread_s, c.added_p50_ms, c.added_p99_ms
            ));
        }
        if self.soak_programs == 0 {
            out.push_str("\nsoak: not run (--soak 0)\n");
            return out;
        }
        out.push_str(&format!(
            "\nsoak: {} concurrent programs × {} tokens: {} of {} streams whole in {:.1} s; RSS (whole process) {:.0} MiB before, {:.0} MiB peak, {:.0} MiB after\n",
            self.soak_programs,
            self.soak_tokens,
            self.soak_whole_streams,
            self.soak_programs,
            self.soak_wall_s,
            self.rss_before_mib,
            self.rss_peak_mib,
            self.rss_after_mib
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_or_nan_measurement_gives_no_duration_panic() {
        assert_eq!(secs(f64::NAN), Duration::ZERO);
        assert_eq!(secs(-1.0), Duration::ZERO);
        assert_eq!(secs(f64::INFINITY), Duration::ZERO);
        assert_eq!(secs(0.25), Duration::from_millis(250));
        let empty = side(Vec::new(), 0, 0.0);
        assert!(empty.p50_ms.is_nan() && empty.calls == 0);
    }

    #[test]
    fn a_measurement_of_nothing_is_refused_before_it_starts() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        for (opts, needle) in [
            (LoadOptions { calls: 0, soak: 0, programs: 2, speed: 50.0, ..Default::default() }, "calls"),
            (LoadOptions { programs: 0, ..Default::default() }, "programs"),
            (LoadOptions { rounds: 0, ..Default::default() }, "rounds"),
            (LoadOptions { speed: f64::NAN, ..Default::default() }, "speed"),
        ] {
            let err = rt.block_on(front_door_bench(&opts)).expect_err("refused");
            assert!(err.to_string().contains(needle), "{err}");
        }
        let message = |o: LoadOptions| o.check().map_err(|e| e.to_string());
        assert_eq!(message(LoadOptions { max_tokens: 0, ..Default::default() }), Err("max_tokens must be at least 1".into()));
        assert_eq!(message(LoadOptions { soak_tokens: 0, ..Default::default() }), Err("soak_tokens must be at least 1 when soak is not 0".into()));
        assert_eq!(message(LoadOptions { speed: -1.0, ..Default::default() }), Err("speed must be positive and finite (got -1)".into()));
    }
}
