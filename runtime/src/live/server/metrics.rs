//! The emulate server's `/metrics`: vLLM V1's Prometheus families (`vllm/v1/metrics/loggers.py`,
//! `PrometheusStatLogger`, vLLM 0.10.2; `docs/usage/metrics.md`), with their names, types,
//! help texts, bucket bounds and the `model_name` / `engine` labels on every sample:
//!
//! - gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`,
//!   `vllm:kv_cache_usage_perc`, and the info gauge `vllm:cache_config_info` (always 1, the
//!   cache configuration in its labels);
//! - counters `vllm:prefix_cache_queries`, `vllm:prefix_cache_hits`, `vllm:num_preemptions`,
//!   `vllm:prompt_tokens`, `vllm:generation_tokens`, `vllm:request_success` (label
//!   `finished_reason` = `stop` | `length` | `abort`), each exposed with `_total`;
//! - histograms of counts `vllm:request_prompt_tokens`, `vllm:request_generation_tokens`,
//!   `vllm:request_max_num_generation_tokens`, `vllm:request_params_max_tokens` (1-2-5 buckets
//!   up to `max_model_len`), `vllm:request_params_n`, `vllm:iteration_tokens_total`;
//! - histograms of time `vllm:time_to_first_token_seconds`, `vllm:time_per_output_token_seconds`
//!   (0.10's name of the inter-token latency, still emitted beside its successor) and
//!   `vllm:inter_token_latency_seconds` (0.11+), `vllm:request_time_per_output_token_seconds`
//!   (0.11+: a request's mean), `vllm:e2e_request_latency_seconds`,
//!   `vllm:request_queue_time_seconds`, `vllm:request_inference_time_seconds`,
//!   `vllm:request_prefill_time_seconds`, `vllm:request_decode_time_seconds`.
//!
//! Times are emulated (virtual) seconds. `finished_reason="abort"` counts the requests the
//! engine ended with an abort (a sleep with `mode=abort`), whose clients get that finish
//! reason; a request whose client went away is aborted without an answer and, as in vLLM
//! 0.10.2 (`OutputProcessor.abort_requests` records no finished-request stats), not counted.
//! The deprecated aliases 0.10.2 still emits beside them, with the same values, are emitted
//! too: `vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_queries`,
//! `vllm:gpu_prefix_cache_hits` (tools that read only those got nothing). Not emitted: LoRA
//! and speculative-decoding families (nothing to report).
//!
//! Depends on the emulator's `Telemetry` and prometheus-client; must not depend on the driver
//! or the HTTP handlers (the scrape-time values come through a closure).

use std::borrow::Cow;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use switchyard_emulator::Telemetry;

/// vLLM's bucket bounds of `vllm:time_to_first_token_seconds`.
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// vLLM's bucket bounds of the per-token latencies (`vllm:time_per_output_token_seconds`,
/// `vllm:inter_token_latency_seconds`, `vllm:request_time_per_output_token_seconds`).
pub const TOKEN_LATENCY_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];

/// vLLM's `request_latency_buckets` (end-to-end, queue, inference, prefill and decode times).
pub const E2E_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM's buckets of `vllm:iteration_tokens_total`.
pub const ITERATION_TOKEN_BUCKETS: [f64; 13] = [
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

/// vLLM's buckets of `vllm:request_params_n`.
pub const N_BUCKETS: [f64; 5] = [1.0, 2.0, 5.0, 10.0, 20.0];

/// vLLM's `build_1_2_5_buckets(max)`: 1, 2, 5, 10, 20, 50, ... up to `max`.
pub fn buckets_1_2_5(max: u32) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1u64;
    loop {
        for m in [1u64, 2, 5] {
            let v = m * scale;
            if v > u64::from(max) {
                return out;
            }
            out.push(v as f64);
        }
        scale *= 10;
    }
}

/// The finish reasons vLLM V1 counts (`FinishReason`: stop, length, abort).
pub const FINISH_REASONS: [&str; 3] = ["stop", "length", "abort"];

type Labels = Vec<(String, String)>;

/// One request that left the engine, with its timestamps (virtual seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedRequest {
    pub finish_reason: &'static str,
    pub arrival: f64,
    pub scheduled: Option<f64>,
    pub first_token: Option<f64>,
    pub finished: f64,
    pub prompt_tokens: u32,
    pub generation_tokens: u32,
    /// `max_tokens` as the client set it.
    pub max_tokens: Option<u32>,
    pub n: u32,
    /// The first of its request's `n` samples: the per-request families (`n`, the most tokens
    /// a sample generated) are observed once per request, on it (the samples are identical).
    pub first_sample: bool,
}

/// The families the server observes as requests progress.
#[derive(Debug, Clone)]
pub struct Metrics {
    ttft: Histogram,
    tpot: Histogram,
    itl: Histogram,
    request_tpot: Histogram,
    e2e: Histogram,
    queue: Histogram,
    inference: Histogram,
    prefill: Histogram,
    decode: Histogram,
    request_prompt_tokens: Histogram,
    request_generation_tokens: Histogram,
    max_num_generation_tokens: Histogram,
    params_n: Histogram,
    params_max_tokens: Histogram,
    iteration_tokens: Histogram,
    prompt_tokens: Counter,
    success: Family<Labels, Counter>,
    cache_config: Family<Labels, Gauge>,
}

impl Metrics {
    pub fn new(max_model_len: u32) -> Self {
        let counts = || Histogram::new(buckets_1_2_5(max_model_len));
        let success = Family::<Labels, Counter>::default();
        for reason in FINISH_REASONS {
            let _ = success.get_or_create(&vec![("finished_reason".to_string(), reason.to_string())]);
        }
        Metrics {
            ttft: Histogram::new(TTFT_BUCKETS),
            tpot: Histogram::new(TOKEN_LATENCY_BUCKETS),
            itl: Histogram::new(TOKEN_LATENCY_BUCKETS),
            request_tpot: Histogram::new(TOKEN_LATENCY_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            queue: Histogram::new(E2E_BUCKETS),
            inference: Histogram::new(E2E_BUCKETS),
            prefill: Histogram::new(E2E_BUCKETS),
            decode: Histogram::new(E2E_BUCKETS),
            request_prompt_tokens: counts(),
            request_generation_tokens: counts(),
            max_num_generation_tokens: counts(),
            params_n: Histogram::new(N_BUCKETS),
            params_max_tokens: counts(),
            iteration_tokens: Histogram::new(ITERATION_TOKEN_BUCKETS),
            prompt_tokens: Counter::default(),
            success,
            cache_config: Family::default(),
        }
    }

    /// `vllm:cache_config_info`'s labels (the fields of vLLM's `CacheConfig.metrics_info()`
    /// the emulated engine has).
    pub fn set_cache_config(&self, info: &[(&str, String)]) {
        let labels: Labels = info.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        self.cache_config.get_or_create(&labels).set(1);
    }

    /// A request sampled its first token `ttft` seconds after its arrival.
    pub fn first_token(&self, ttft: f64, prompt_tokens: u32) {
        self.ttft.observe(ttft.max(0.0));
        self.prompt_tokens.inc_by(u64::from(prompt_tokens));
    }

    /// A decoding request sampled one more token `gap` seconds after its previous one.
    pub fn inter_token(&self, gap: f64) {
        self.tpot.observe(gap.max(0.0));
        self.itl.observe(gap.max(0.0));
    }

    /// An engine step computed `tokens` tokens (prefill chunks and sampled tokens).
    pub fn iteration(&self, tokens: u64) {
        if tokens > 0 {
            self.iteration_tokens.observe(tokens as f64);
        }
    }

    pub fn finished(&self, r: &FinishedRequest) {
        self.success
            .get_or_create(&vec![("finished_reason".to_string(), r.finish_reason.to_string())])
            .inc();
        self.e2e.observe((r.finished - r.arrival).max(0.0));
        let scheduled = r.scheduled.unwrap_or(r.finished);
        self.queue.observe((scheduled - r.arrival).max(0.0));
        self.inference.observe((r.finished - scheduled).max(0.0));
        let first = r.first_token.unwrap_or(r.finished);
        self.prefill.observe((first - scheduled).max(0.0));
        self.decode.observe((r.finished - first).max(0.0));
        if r.generation_tokens > 1 {
            self.request_tpot
                .observe((r.finished - first).max(0.0) / f64::from(r.generation_tokens - 1));
        }
        self.request_prompt_tokens.observe(f64::from(r.prompt_tokens));
        self.request_generation_tokens.observe(f64::from(r.generation_tokens));
        if r.first_sample {
            self.max_num_generation_tokens.observe(f64::from(r.generation_tokens));
            self.params_n.observe(f64::from(r.n));
            if let Some(max) = r.max_tokens {
                self.params_max_tokens.observe(f64::from(max));
            }
        }
    }

    /// The registry: these families plus the scrape-time ones read through `telemetry`
    /// (the replica's telemetry and the requests not yet submitted), every sample labelled
    /// `model_name` and `engine="0"`.
    pub fn registry(
        &self,
        served_name: &str,
        telemetry: Arc<dyn Fn() -> (Telemetry, usize) + Send + Sync>,
    ) -> Registry {
        let labels = [
            (Cow::Borrowed("model_name"), Cow::Owned(served_name.to_string())),
            (Cow::Borrowed("engine"), Cow::Borrowed("0")),
        ];
        let mut r = Registry::with_labels(labels.into_iter());
        r.register_collector(Box::new(ReplicaCollector { telemetry }));
        r.register("vllm:prompt_tokens", "Number of prefill tokens processed", self.prompt_tokens.clone());
        r.register("vllm:request_success", "Count of successfully processed requests", self.success.clone());
        r.register("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", self.cache_config.clone());
        let histograms = [
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds (emulated time)", &self.ttft),
            ("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds (emulated time; the inter-token latency, as vllm:inter_token_latency_seconds)", &self.tpot),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds (emulated time)", &self.itl),
            ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request (emulated time)", &self.request_tpot),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds (emulated time)", &self.e2e),
            ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request (emulated time)", &self.queue),
            ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request (emulated time)", &self.inference),
            ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request (emulated time)", &self.prefill),
            ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request (emulated time)", &self.decode),
            ("vllm:request_prompt_tokens", "Number of prefill tokens processed", &self.request_prompt_tokens),
            ("vllm:request_generation_tokens", "Number of generation tokens processed", &self.request_generation_tokens),
            ("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens", &self.max_num_generation_tokens),
            ("vllm:request_params_n", "Histogram of the n request parameter", &self.params_n),
            ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter", &self.params_max_tokens),
            ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step", &self.iteration_tokens),
        ];
        for (name, help, h) in histograms {
            r.register(name, help, h.clone());
        }
        r
    }
}

/// Scrape-time gauges and counters read from the replica's telemetry.
struct ReplicaCollector {
    telemetry: Arc<dyn Fn() -> (Telemetry, usize) + Send + Sync>,
}

impl std::fmt::Debug for ReplicaCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplicaCollector")
    }
}

impl Collector for ReplicaCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (t, queued) = (self.telemetry)();
        let gauges = [
            ("vllm:num_requests_running", "Number of requests in model execution batches", t.running as f64),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed", (t.waiting + queued) as f64),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage", t.kv_usage),
            (
                "vllm:gpu_cache_usage_perc",
                "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
                t.kv_usage,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            let metric_encoder = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric_encoder)?;
        }
        let counters = [
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens", t.prefix_cache_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens", t.prefix_cache_hits),
            (
                "vllm:gpu_prefix_cache_queries",
                "GPU prefix cache queries, in terms of number of queried tokens.DEPRECATED: Use vllm:prefix_cache_queries instead.",
                t.prefix_cache_queries,
            ),
            (
                "vllm:gpu_prefix_cache_hits",
                "GPU prefix cache hits, in terms of number of cached tokens.DEPRECATED: Use vllm:prefix_cache_hits instead.",
                t.prefix_cache_hits,
            ),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine", t.preemptions),
            ("vllm:generation_tokens", "Number of generation tokens processed", t.generated_tokens),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            let metric_encoder = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric_encoder)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_two_five_buckets_as_vllm_builds_them() {
        assert_eq!(buckets_1_2_5(100), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(buckets_1_2_5(40_960).last(), Some(&20_000.0));
    }
}
