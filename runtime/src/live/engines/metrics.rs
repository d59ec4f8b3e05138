//! A small parser of the Prometheus text exposition format (version 0.0.4, and the OpenMetrics
//! text that `prometheus-client` writes), for scraping vLLM's `/metrics`.
//!
//! Why our own: `prometheus-parse` rejects metric names containing `:`, so it silently drops
//! every `vllm:*` metric (`/work/shared/CRATES.md`). The grammar handled here is the text
//! format's (<https://prometheus.io/docs/instrumenting/exposition_formats/>): `# HELP`,
//! `# TYPE` and other comment lines are skipped; a sample is
//! `name[{label="value",...}] value [timestamp]`, names match `[a-zA-Z_:][a-zA-Z0-9_:]*`, label
//! values escape `\\`, `\"` and `\n`, values may be `NaN`, `+Inf` or `-Inf`, and an OpenMetrics
//! exemplar (` # {...} v`) after the value is ignored.
//!
//! The vLLM names the live runtime reads are listed in vLLM's "Production Metrics" page
//! (<https://docs.vllm.ai/en/stable/usage/metrics/>, `vllm/v1/metrics/loggers.py`):
//! `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
//! (the deprecated `vllm:gpu_cache_usage_perc` as fallback, field anchors §0.3),
//! `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits` (counters, exposed with the
//! `_total` suffix by Python's `prometheus_client`) and the
//! `vllm:time_to_first_token_seconds` histogram.
//!
//! Pure parsing: no I/O, no dependency on the rest of the crate but the telemetry type.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::live::engine::EngineTelemetry;

/// `vllm:num_requests_running` (gauge).
pub const RUNNING: &str = "vllm:num_requests_running";
/// `vllm:num_requests_waiting` (gauge).
pub const WAITING: &str = "vllm:num_requests_waiting";
/// `vllm:kv_cache_usage_perc` (gauge, 0..1).
pub const KV_CACHE_USAGE: &str = "vllm:kv_cache_usage_perc";
/// The name before vLLM PR #18354; scraped when the new one is absent.
pub const KV_CACHE_USAGE_DEPRECATED: &str = "vllm:gpu_cache_usage_perc";
/// `vllm:prefix_cache_queries` (counter, tokens).
pub const PREFIX_CACHE_QUERIES: &str = "vllm:prefix_cache_queries";
/// `vllm:prefix_cache_hits` (counter, tokens).
pub const PREFIX_CACHE_HITS: &str = "vllm:prefix_cache_hits";
/// `vllm:cache_config_info` (info gauge; its labels are vLLM's `CacheConfig.metrics_info()`,
/// among them `num_gpu_blocks` and `block_size`).
pub const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";
/// `vllm:time_to_first_token_seconds` (histogram).
pub const TIME_TO_FIRST_TOKEN: &str = "vllm:time_to_first_token_seconds";

/// Why a scrape could not be parsed.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("metrics line {line}: {message}")]
pub struct MetricsParseError {
    /// 1-based line number.
    pub line: usize,
    pub message: String,
}

/// One sample: a name, its labels and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// The cumulative buckets of one histogram, summed over its label sets (`le` excluded).
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound, cumulative count)`, ascending; the last bound is `+Inf`.
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

/// A parsed scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsSnapshot {
    samples: Vec<Sample>,
}

impl MetricsSnapshot {
    /// Parse a text exposition.
    pub fn parse(text: &str) -> Result<Self, MetricsParseError> {
        let mut samples = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            samples.push(parse_sample(line).map_err(|message| MetricsParseError {
                line: i + 1,
                message,
            })?);
        }
        Ok(MetricsSnapshot { samples })
    }

    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// The samples named exactly `name`.
    pub fn samples_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// The sum of `name` over its label sets (e.g. over vLLM's data-parallel `engine` label);
    /// `None` when no sample has this name.
    pub fn sum(&self, name: &str) -> Option<f64> {
        let mut found = false;
        let mut total = 0.0;
        for s in self.samples_named(name) {
            found = true;
            total += s.value;
        }
        found.then_some(total)
    }

    /// The mean of `name` over its label sets (for ratios such as KV-cache usage).
    pub fn mean(&self, name: &str) -> Option<f64> {
        let values: Vec<f64> = self.samples_named(name).map(|s| s.value).collect();
        if values.is_empty() {
            return None;
        }
        Some(values.iter().sum::<f64>() / values.len() as f64)
    }

    /// A counter by its base name: the exposed `name_total` (Python's `prometheus_client` and
    /// `prometheus-client` both append `_total`), else a bare `name`.
    pub fn counter(&self, name: &str) -> Option<f64> {
        self.sum(&format!("{name}_total"))
            .or_else(|| self.sum(name))
    }

    /// A histogram by its base name, summed over label sets.
    pub fn histogram(&self, name: &str) -> Option<HistogramSnapshot> {
        let bucket_name = format!("{name}_bucket");
        let mut buckets: BTreeMap<OrderedBound, f64> = BTreeMap::new();
        for s in self.samples_named(&bucket_name) {
            let le = s.labels.get("le")?;
            let bound = parse_value(le).ok()?;
            *buckets.entry(OrderedBound(bound)).or_insert(0.0) += s.value;
        }
        let count = self.sum(&format!("{name}_count"))?;
        let sum = self.sum(&format!("{name}_sum")).unwrap_or(0.0);
        Some(HistogramSnapshot {
            buckets: buckets.into_iter().map(|(b, c)| (b.0, c)).collect(),
            sum,
            count,
        })
    }

    /// The engine telemetry the replica actor reports, from vLLM's names. Absent gauges read
    /// as 0; `sleeping` is not in `/metrics` (it comes from `GET /is_sleeping`) and is false.
    pub fn telemetry(&self) -> EngineTelemetry {
        EngineTelemetry {
            running: self.sum(RUNNING).unwrap_or(0.0),
            waiting: self.sum(WAITING).unwrap_or(0.0),
            kv_cache_usage: self
                .mean(KV_CACHE_USAGE)
                .or_else(|| self.mean(KV_CACHE_USAGE_DEPRECATED))
                .unwrap_or(0.0),
            prefix_cache_queries: self.counter(PREFIX_CACHE_QUERIES).unwrap_or(0.0),
            prefix_cache_hits: self.counter(PREFIX_CACHE_HITS).unwrap_or(0.0),
            sleeping: false,
            kv_capacity_tokens: self.kv_capacity_tokens(),
        }
    }

    /// The KV cache's capacity in tokens from `vllm:cache_config_info`'s labels, summed over
    /// its label sets (one per data-parallel engine); `None` without the gauge or with a label
    /// missing or unreadable (vLLM writes `None` for blocks not yet profiled).
    pub fn kv_capacity_tokens(&self) -> Option<f64> {
        let mut total = None;
        for s in self.samples_named(CACHE_CONFIG_INFO) {
            let blocks: f64 = s.labels.get("num_gpu_blocks")?.parse().ok()?;
            let block_size: f64 = s.labels.get("block_size")?.parse().ok()?;
            *total.get_or_insert(0.0) += blocks * block_size;
        }
        total.filter(|t: &f64| t.is_finite() && *t > 0.0)
    }
}

/// An `f64` bucket bound ordered by `total_cmp`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct OrderedBound(f64);

impl Eq for OrderedBound {}

impl PartialOrd for OrderedBound {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrderedBound {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// A sample value: a float, `NaN`, `+Inf`, `-Inf` (case-insensitive, as Go's parser).
fn parse_value(text: &str) -> Result<f64, String> {
    match text.to_ascii_lowercase().as_str() {
        "nan" => Ok(f64::NAN),
        "+inf" | "inf" => Ok(f64::INFINITY),
        "-inf" => Ok(f64::NEG_INFINITY),
        _ => text
            .parse::<f64>()
            .map_err(|_| format!("`{text}` is not a sample value")),
    }
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let mut chars = line.char_indices().peekable();
    match chars.peek() {
        Some(&(_, c)) if is_name_start(c) => {}
        _ => return Err(format!("`{line}` does not start with a metric name")),
    }
    let mut name_end = line.len();
    while let Some(&(i, c)) = chars.peek() {
        if is_name_char(c) {
            chars.next();
        } else {
            name_end = i;
            break;
        }
    }
    let name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, remainder) = parse_labels(after)?;
        labels = parsed;
        rest = remainder;
    }
    // An OpenMetrics exemplar follows " # ".
    let rest = match rest.find(" # ") {
        Some(i) => &rest[..i],
        None => rest,
    };
    let mut fields = rest.split_whitespace();
    let value = fields
        .next()
        .ok_or_else(|| format!("sample `{name}` has no value"))
        .and_then(parse_value)?;
    if let Some(ts) = fields.next() {
        ts.parse::<f64>()
            .map_err(|_| format!("sample `{name}`: `{ts}` is not a timestamp"))?;
    }
    if let Some(extra) = fields.next() {
        return Err(format!(
            "sample `{name}`: unexpected `{extra}` after the timestamp"
        ));
    }
    Ok(Sample {
        name,
        labels,
        value,
    })
}

/// Parses `name="value",...}` (the opening brace already consumed); returns the labels and the
/// text after the closing brace.
fn parse_labels(text: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    loop {
        while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b',') {
            i += 1;
        }
        if i >= bytes.len() {
            return Err("unterminated label set".into());
        }
        if bytes[i] == b'}' {
            return Ok((labels, &text[i + 1..]));
        }
        let start = i;
        while i < bytes.len() && is_name_char(bytes[i] as char) {
            i += 1;
        }
        if start == i {
            return Err(format!("bad label name at `{}`", &text[start..]));
        }
        let key = text[start..i].to_string();
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        if i >= bytes.len() || bytes[i] != b'=' {
            return Err(format!("label `{key}` has no `=`"));
        }
        i += 1;
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        if i >= bytes.len() || bytes[i] != b'"' {
            return Err(format!("label `{key}`: value is not quoted"));
        }
        i += 1;
        let mut value = String::new();
        let mut closed = false;
        // Walk chars (values may be UTF-8) from byte offset i.
        let mut iter = text[i..].char_indices();
        while let Some((off, c)) = iter.next() {
            match c {
                '\\' => match iter.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, other)) => {
                        value.push('\\');
                        value.push(other);
                    }
                    None => return Err(format!("label `{key}`: dangling escape")),
                },
                '"' => {
                    i += off + 1;
                    closed = true;
                    break;
                }
                other => value.push(other),
            }
        }
        if !closed {
            return Err(format!("label `{key}`: unterminated value"));
        }
        labels.insert(key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An excerpt in the shape of vLLM's own `/metrics` (Python `prometheus_client`, text 0.0.4).
    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-0.6B"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-0.6B"} 0.75
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 1024.0
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="Qwen/Qwen3-0.6B"} 1.7e9
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 512.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="Qwen/Qwen3-0.6B"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="Qwen/Qwen3-0.6B"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-0.6B"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-0.6B"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-0.6B"} 7.5
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="1000"} 1.0
"#;

    #[test]
    fn reads_vllm_names_with_colons() {
        let m = MetricsSnapshot::parse(VLLM).unwrap();
        assert_eq!(m.sum(RUNNING), Some(5.0));
        assert_eq!(m.sum(WAITING), Some(7.0));
        assert_eq!(m.mean(KV_CACHE_USAGE), Some(0.5));
        assert_eq!(m.counter(PREFIX_CACHE_QUERIES), Some(1024.0));
        assert_eq!(m.counter(PREFIX_CACHE_HITS), Some(512.0));
        let t = m.telemetry();
        assert_eq!(t.kv_capacity_tokens, Some(32_000.0), "two engines of 1,000 blocks of 16");
        // Unprofiled blocks (`None`) or no gauge: unknown.
        let unprofiled = MetricsSnapshot::parse(r#"vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0"#).unwrap();
        assert_eq!(unprofiled.kv_capacity_tokens(), None);
        assert_eq!(MetricsSnapshot::parse("vllm:num_requests_running 1").unwrap().kv_capacity_tokens(), None);
        assert_eq!(t.running, 5.0);
        assert_eq!(t.waiting, 7.0);
        assert_eq!(t.kv_cache_usage, 0.5);
        assert_eq!(t.prefix_cache_hits, 512.0);
        assert!(!t.sleeping);
    }

    #[test]
    fn reads_a_histogram() {
        let m = MetricsSnapshot::parse(VLLM).unwrap();
        let h = m.histogram(TIME_TO_FIRST_TOKEN).unwrap();
        assert_eq!(h.count, 4.0);
        assert_eq!(h.sum, 7.5);
        assert_eq!(
            h.buckets,
            vec![(0.1, 1.0), (1.0, 3.0), (f64::INFINITY, 4.0)]
        );
        assert!(m.histogram("vllm:absent").is_none());
    }

    #[test]
    fn falls_back_to_the_deprecated_kv_name_and_bare_counters() {
        let m = MetricsSnapshot::parse("vllm:gpu_cache_usage_perc 0.4\nvllm:prefix_cache_hits 9\n")
            .unwrap();
        let t = m.telemetry();
        assert_eq!(t.kv_cache_usage, 0.4);
        assert_eq!(t.prefix_cache_hits, 9.0);
        assert_eq!(t.running, 0.0);
    }

    #[test]
    fn openmetrics_exemplars_timestamps_and_eof() {
        let text = "# TYPE a counter\na_total{x=\"1\"} 3 1700000000\n\
                    b_bucket{le=\"0.5\"} 2 # {trace_id=\"abc\"} 0.3\n# EOF\n";
        let m = MetricsSnapshot::parse(text).unwrap();
        assert_eq!(m.counter("a"), Some(3.0));
        assert_eq!(m.sum("b_bucket"), Some(2.0));
    }

    #[test]
    fn label_escapes_and_special_values() {
        let m = MetricsSnapshot::parse(
            "m{path=\"C:\\\\x\",q=\"say \\\"hi\\\"\",nl=\"a\\nb\",}\tNaN\nn -Inf\no +Inf\n",
        )
        .unwrap();
        let s = &m.samples()[0];
        assert_eq!(s.labels["path"], "C:\\x");
        assert_eq!(s.labels["q"], "say \"hi\"");
        assert_eq!(s.labels["nl"], "a\nb");
        assert!(s.value.is_nan());
        assert_eq!(m.sum("n"), Some(f64::NEG_INFINITY));
        assert_eq!(m.sum("o"), Some(f64::INFINITY));
    }

    #[test]
    fn rejects_garbage_with_the_line_number() {
        let e = MetricsSnapshot::parse("ok 1\n<html>oops</html>\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(MetricsSnapshot::parse("m{a=\"1\" 2\n").is_err());
        assert!(MetricsSnapshot::parse("m{a=1} 2\n").is_err());
        assert!(MetricsSnapshot::parse("m one\n").is_err());
        assert!(MetricsSnapshot::parse("m\n").is_err());
        assert!(MetricsSnapshot::parse("m 1 2 3\n").is_err());
    }

    proptest! {
        /// Whatever labels and values are written in the format, they read back.
        #[test]
        fn round_trips_written_samples(
            name in "[a-z_:][a-z0-9_:]{0,20}",
            labels in prop::collection::btree_map("[a-z_][a-z0-9_]{0,8}", "[ -~]{0,12}", 0..4),
            value in -1e12f64..1e12,
        ) {
            let body: Vec<String> = labels
                .iter()
                .map(|(k, v)| {
                    let escaped = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                    format!("{k}=\"{escaped}\"")
                })
                .collect();
            let line = if body.is_empty() {
                format!("{name} {value}\n")
            } else {
                format!("{name}{{{}}} {value}\n", body.join(","))
            };
            let m = MetricsSnapshot::parse(&line).unwrap();
            prop_assert_eq!(m.samples().len(), 1);
            prop_assert_eq!(&m.samples()[0].name, &name);
            prop_assert_eq!(&m.samples()[0].labels, &labels);
            prop_assert_eq!(m.samples()[0].value, value);
        }
    }
}
