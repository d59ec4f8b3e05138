//! Session bookkeeping cost (`runtime/src/session.rs`): what one activation's start and completion
//! cost the session model as its history grows. A two-node loop (`coder` → `check`, the check's
//! verdict continuing the loop) is driven to its last round, asking for the ready and near-ready
//! sets and whether the session finished at every step, as the simulator and the live runtime do:
//! `loop/R` runs a whole session of 2·R activations. Time per activation should not grow with R
//! (the session visits only its open frontier; before, every completion rescanned the history).
//!
//! Run with `cargo bench -p switchyard-runtime --bench session` (add
//! `-- --warm-up-time 1 --measurement-time 5` for a quick look).

use std::path::Path;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use switchyard_runtime::ids::SessionId;
use switchyard_runtime::session::Session;
use switchyard_runtime::values::{NodeOutput, Record};
use switchyard_runtime::workflow::{WorkflowSpec, parse_workflow};

fn looping(rounds: u32) -> Arc<WorkflowSpec> {
    let yaml = format!(
        r#"name: long-loop
deployments:
  d: {{model: Qwen3-8B, max_context: 4096, max_output_tokens: 512}}
nodes:
  - id: coder
    deployment: d
    prompt: "Write"
  - id: check
    deployment: d
    after: coder
    prompt: "Check"
    output:
      schema: {{type: object, properties: {{ok: {{type: boolean}}}}, required: [ok]}}
      verdict: ok
loops:
  - id: l
    body: [coder, check]
    continue_when: {{node: check, verdict: false}}
    max_rounds: {rounds}
"#
    );
    Arc::new(parse_workflow("long-loop.yaml", &yaml, Path::new(".")).expect("workflow"))
}

fn drive(spec: &Arc<WorkflowSpec>) -> usize {
    let mut s = Session::new(SessionId(1), Arc::clone(spec), Record::new()).expect("session");
    let mut n = 0;
    while let Some(a) = s.ready().first().copied() {
        s.mark_running(a.index).expect("running");
        std::hint::black_box(s.near_ready());
        let output = NodeOutput { text: "{\"ok\":false}".into(), verdict: Some("false".into()), ..Default::default() };
        std::hint::black_box(s.complete(a.index, output).expect("complete"));
        std::hint::black_box(s.is_finished());
        n += 1;
    }
    n
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("loop");
    for rounds in [100u32, 1_000, 10_000] {
        let spec = looping(rounds);
        g.throughput(Throughput::Elements(u64::from(rounds) * 2));
        g.bench_with_input(BenchmarkId::from_parameter(rounds), &spec, |b, spec| b.iter(|| drive(spec)));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
