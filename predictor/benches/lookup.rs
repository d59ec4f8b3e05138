//! The scheduling-path lookups of paper 003 §3.3 must cost a few array reads (< 1 µs):
//! `cargo bench -p switchyard-predictor --bench lookup`.
//!
//! The table holds the six Qwen3 models (bf16) on the seven catalogued GPUs with the default
//! buckets, filled by the trained `graph` estimator.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use switchyard_predictor::arch::Architecture;
use switchyard_predictor::estimators::estimator;
use switchyard_predictor::feedback::{AdmissionMargins, MarginPolicy, OutputHistory};
use switchyard_predictor::graph::Deployment;
use switchyard_predictor::profile::{Buckets, ProfileTable};
use switchyard_predictor::spec::{self, Dtype};

fn lookups(c: &mut Criterion) {
    let predictor = estimator("graph").expect("the shipped data trains the graph estimator");
    let deployments: Vec<Deployment> = spec::model_catalogue()
        .iter()
        .map(|m| Deployment::new(Architecture::from(m), Dtype::Bf16))
        .collect();
    let devices = spec::device_catalogue();
    let built = std::time::Instant::now();
    let table = ProfileTable::build(
        predictor.as_ref(),
        &deployments,
        &devices,
        Buckets::default(),
    )
    .expect("catalogue deployments build");
    eprintln!("built {} cells in {:?}", table.len(), built.elapsed());
    let margins = AdmissionMargins::new(&table, MarginPolicy::default());
    let mut history: OutputHistory<u32> = OutputHistory::default();
    for (i, out) in [180u32, 220, 150, 400, 90, 260, 310, 170]
        .iter()
        .enumerate()
    {
        history.record(i as u32 % 4, *out);
    }
    let d = table
        .deployment("Qwen3-8B/bf16")
        .expect("deployment in table");
    let g = table.device("A100-40GB").expect("device in table");

    c.bench_function("timing lookup (p90 history → κ → run time)", |b| {
        let mut prompt = 100u32;
        b.iter(|| {
            prompt = (prompt * 7 + 13) % 30_000 + 1;
            let out = history.timing_output_tokens(&(prompt % 4), 1024);
            let key = table.key(d, g, 1 + prompt % 32, prompt, out);
            black_box(key.map(|k| table.run_time(k)))
        })
    });
    c.bench_function(
        "admission lookup (limit → κ → M_peak + ε + ρ)",
        |b| {
            let mut prompt = 100u32;
            b.iter(|| {
                prompt = (prompt * 7 + 13) % 30_000 + 1;
                let key = table.key(d, g, 1 + prompt % 32, prompt, 1024);
                black_box(key.map(|k| (margins.admission_bytes(&table, k), table.fits(k))))
            })
        },
    );
    c.bench_function("load lookup (C_load)", |b| {
        b.iter(|| black_box(table.load_time(black_box(d), black_box(g))))
    });
}

criterion_group!(benches, lookups);
criterion_main!(benches);
