//! The live runtime's own Prometheus metrics (a served runtime's `GET /metrics`, in the text
//! exposition format, Prometheus naming conventions, prefix `switchyard_`): sessions by state,
//! the planner's queue of ready units, replicas by lifecycle state, the planning latency of one
//! tick (the core's `handle_all`, measured by the shell around it), lifecycle actions by kind,
//! the tokens engines computed for attempts that gave no used answer, the front door's
//! requests by endpoint and status, ORACLE's routed front-door programs (bound per model,
//! verdicts landed, programs given up without one) and DISC's ledger per routed model.
//!
//! Written by the planner actor (gauges set at each tick, counters as actions are issued) and
//! by the HTTP layer (front-door requests); read by the scrape. Depends on prometheus-client
//! only; must not depend on the planner's internals or on HTTP.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Bucket bounds of the planning latency, in seconds (10 µs … 1 s).
pub const PLANNING_BUCKETS: [f64; 11] = [1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 1e-1, 1.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabel {
    pub action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LedgerLabel {
    pub model: String,
    pub dtype: String,
    pub stat: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabel {
    pub endpoint: String,
    pub status: String,
}

/// The metrics and their registry.
pub struct RuntimeMetrics {
    /// `switchyard_sessions{state="running|completed|failed"}`.
    pub sessions: Family<StateLabel, Gauge>,
    /// `switchyard_queue_depth`: ready units waiting for a replica.
    pub queue_depth: Gauge,
    /// `switchyard_replicas{state="loading|awake|asleep"}`.
    pub replicas: Family<StateLabel, Gauge>,
    /// `switchyard_planning_latency_seconds`: one planning tick of the core.
    pub planning_latency: Histogram,
    /// `switchyard_lifecycle_actions_total{action="load|wake|sleep|unload"}`.
    pub lifecycle_actions: Family<ActionLabel, Counter>,
    /// `switchyard_front_door_requests_total{endpoint, status}`.
    pub front_door_requests: Family<RequestLabel, Counter>,
    /// `switchyard_wasted_tokens_total{kind="prompt|output"}`: what failed, retried or aborted
    /// attempts had cost the engines (`report::WastedWork`).
    pub wasted_tokens: Family<KindLabel, Counter>,
    /// `switchyard_routed_programs_total{model}`: programs the router bound, by model — routed
    /// front-door programs and sessions of routed workflows (a resumed durable session counts
    /// again in the process that resumes it).
    pub routed_programs: Family<ModelLabel, Counter>,
    /// `switchyard_program_verdicts_total{kind="landed|given_up"}`: verdicts of routed
    /// front-door programs that reached the learner, and programs given up without one.
    pub program_verdicts: Family<KindLabel, Counter>,
    /// `switchyard_disc_ledger{model, dtype, stat}`: each routed deployment's DISC ledger — `peak_tokens`
    /// (ĉ), `run_seconds` (D̂), `allowance_tokens` (δ̂), `reserved_tokens`, `admitted`, `queued`.
    pub disc_ledger: Family<LedgerLabel, Gauge<f64, AtomicU64>>,
    registry: Mutex<Registry>,
}

impl Default for RuntimeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RuntimeMetrics {
    pub fn new() -> Self {
        let sessions = Family::<StateLabel, Gauge>::default();
        let queue_depth = Gauge::default();
        let replicas = Family::<StateLabel, Gauge>::default();
        let planning_latency = Histogram::new(PLANNING_BUCKETS);
        let lifecycle_actions = Family::<ActionLabel, Counter>::default();
        let front_door_requests = Family::<RequestLabel, Counter>::default();
        let wasted_tokens = Family::<KindLabel, Counter>::default();
        let routed_programs = Family::<ModelLabel, Counter>::default();
        let program_verdicts = Family::<KindLabel, Counter>::default();
        let disc_ledger = Family::<LedgerLabel, Gauge<f64, AtomicU64>>::default();
        let mut r = Registry::with_prefix("switchyard");
        r.register("sessions", "Sessions (and front-door programs) by state", sessions.clone());
        r.register("queue_depth", "Ready units waiting for a replica", queue_depth.clone());
        r.register("replicas", "Replicas by lifecycle state", replicas.clone());
        r.register_with_unit(
            "planning_latency",
            "Wall time of one planning tick of the planner core",
            prometheus_client::registry::Unit::Seconds,
            planning_latency.clone(),
        );
        r.register("lifecycle_actions", "Lifecycle actions issued, by kind", lifecycle_actions.clone());
        r.register("front_door_requests", "Front-door requests, by endpoint and status", front_door_requests.clone());
        r.register(
            "wasted_tokens",
            "Tokens engines computed for call attempts that failed, were retried or were aborted",
            wasted_tokens.clone(),
        );
        r.register(
            "routed_programs",
            "Programs the router bound (front-door programs and sessions of routed workflows), by model",
            routed_programs.clone(),
        );
        r.register(
            "program_verdicts",
            "Verdicts of routed front-door programs: landed (the learner learned) or given up",
            program_verdicts.clone(),
        );
        r.register(
            "disc_ledger",
            "Each routed model's DISC reservation ledger: peak_tokens, run_seconds, allowance_tokens, reserved_tokens, admitted, queued",
            disc_ledger.clone(),
        );
        RuntimeMetrics {
            disc_ledger,
            sessions,
            queue_depth,
            replicas,
            planning_latency,
            lifecycle_actions,
            front_door_requests,
            wasted_tokens,
            routed_programs,
            program_verdicts,
            registry: Mutex::new(r),
        }
    }

    /// Set a state gauge of a family.
    pub fn set_state(family: &Family<StateLabel, Gauge>, state: &str, value: i64) {
        family.get_or_create(&StateLabel { state: state.to_string() }).set(value);
    }

    /// Set one statistic of the DISC ledger of `model` at `dtype`.
    pub fn ledger(&self, model: &str, dtype: &str, stat: &str, value: f64) {
        let label = LedgerLabel { model: model.to_string(), dtype: dtype.to_string(), stat: stat.to_string() };
        self.disc_ledger.get_or_create(&label).set(value);
    }

    /// Count a lifecycle action.
    pub fn action(&self, action: &str) {
        self.lifecycle_actions.get_or_create(&ActionLabel { action: action.to_string() }).inc();
    }

    /// Count the tokens of attempts whose work was thrown away.
    pub fn wasted(&self, prompt_tokens: u64, output_tokens: u64) {
        for (kind, n) in [("prompt", prompt_tokens), ("output", output_tokens)] {
            if n > 0 {
                self.wasted_tokens.get_or_create(&KindLabel { kind: kind.to_string() }).inc_by(n);
            }
        }
    }

    /// Count a program the router bound to `model` (a front-door program or a session of a
    /// routed workflow, counted when bound even if it then fails to start).
    pub fn routed(&self, model: &str) {
        self.routed_programs.get_or_create(&ModelLabel { model: model.to_string() }).inc();
    }

    /// Count a routed program's verdict: `landed` or `given_up`.
    pub fn verdict(&self, outcome: &str) {
        self.program_verdicts.get_or_create(&KindLabel { kind: outcome.to_string() }).inc();
    }

    /// Count a front-door request.
    pub fn front_door(&self, endpoint: &str, status: u16) {
        self.front_door_requests
            .get_or_create(&RequestLabel { endpoint: endpoint.to_string(), status: status.to_string() })
            .inc();
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &r);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_exposed_with_prometheus_names() {
        let m = RuntimeMetrics::new();
        RuntimeMetrics::set_state(&m.sessions, "running", 3);
        RuntimeMetrics::set_state(&m.replicas, "awake", 2);
        m.queue_depth.set(5);
        m.planning_latency.observe(2e-4);
        m.action("load");
        m.front_door("/v1/chat/completions", 200);
        m.routed("Qwen3-8B");
        m.verdict("landed");
        let text = m.encode();
        for line in [
            "switchyard_sessions{state=\"running\"} 3",
            "switchyard_queue_depth 5",
            "switchyard_replicas{state=\"awake\"} 2",
            "switchyard_planning_latency_seconds_count 1",
            "switchyard_lifecycle_actions_total{action=\"load\"} 1",
            "switchyard_front_door_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1",
            "# TYPE switchyard_planning_latency_seconds histogram",
            "switchyard_routed_programs_total{model=\"Qwen3-8B\"} 1",
            "switchyard_program_verdicts_total{kind=\"landed\"} 1",
        ] {
            assert!(text.contains(line), "missing `{line}` in:\n{text}");
        }
    }
}
