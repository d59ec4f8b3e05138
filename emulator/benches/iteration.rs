//! CPU cost of one engine iteration (`start_iteration` + `finish_iteration`): a 64-sequence
//! decode batch, and a mixed batch with a prefill chunk. The simulator pushes ~400k generated
//! tokens through the emulator per experiment, so an iteration must stay well under 10 µs.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use switchyard_emulator::{Dtype, EmulatedReplica, EngineRequest, ServingConfig};
use switchyard_predictor::spec::{device, model};

/// An awake Qwen3-8B replica on an H100 with `batch` requests past their prefill.
fn decoding_replica(batch: u64, output_tokens: u32) -> (EmulatedReplica, f64) {
    let cfg = ServingConfig::vllm_defaults(Dtype::Bf16, 32_768);
    let mut r = EmulatedReplica::new(
        device("H100-80GB").unwrap(),
        model("Qwen3-8B").unwrap(),
        cfg,
        1,
    )
    .unwrap();
    let mut now = r.begin_load(0.0).unwrap();
    r.finish_transition(now);
    for id in 0..batch {
        let hashes = (0..32).map(|b| id << 32 | b).collect();
        r.submit(
            EngineRequest {
                id,
                prompt_tokens: 512,
                prefix_hashes: hashes,
                generated_hashes: Vec::new(),
                output_tokens,
            },
            now,
        )
        .unwrap();
    }
    while r.telemetry().generated_tokens < batch {
        now = r.start_iteration(now).unwrap();
        r.finish_iteration(now);
    }
    (r, now)
}

/// Times `iters` iterations, rebuilding the replica whenever its requests run out.
fn time_iterations(
    iters: u64,
    batch: u64,
    extra: impl Fn(&mut EmulatedReplica, f64, u64),
) -> Duration {
    const OUTPUT: u32 = 20_000;
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let (mut r, mut now) = decoding_replica(batch, OUTPUT);
        let n = left.min(u64::from(OUTPUT) - 2);
        let start = Instant::now();
        for i in 0..n {
            extra(&mut r, now, i);
            let Some(end) = r.start_iteration(now) else {
                break;
            };
            now = end;
            black_box(r.finish_iteration(now));
        }
        total += start.elapsed();
        left -= n;
    }
    total
}

fn bench(c: &mut Criterion) {
    c.bench_function("decode iteration, 64 sequences", |b| {
        b.iter_custom(|iters| time_iterations(iters, 64, |_, _, _| {}))
    });
    c.bench_function(
        "mixed iteration, 63 decodes + a 256-token prefill every 8th",
        |b| {
            b.iter_custom(|iters| {
                time_iterations(iters, 63, |r, now, i| {
                    if i % 8 == 0 {
                        let id = 1_000_000 + i;
                        let req = EngineRequest {
                            id,
                            prompt_tokens: 256,
                            prefix_hashes: vec![],
                            generated_hashes: Vec::new(),
                            output_tokens: 1,
                        };
                        let _ = r.submit(req, now);
                    }
                })
            })
        },
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
