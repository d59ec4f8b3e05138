//! ORACLE's routing decision (paper 002; the goal: median < 20 µs, p99 < 100 µs given
//! the request's embedding; the paper reports 0.56 ms median) and, separately, the embedding's
//! own cost on a bounded prefix of the prompt. Run with
//! `cargo bench -p switchyard-runtime --bench routing`.
//!
//! The router is the one `switchyard bench verifier` times, on synthetic requests (no dataset
//! read): a vocabulary and 16 principal components fitted on 300 generated task texts of three
//! kinds, five exemplars per verifier, a LinUCB learner over three models that has already made
//! and learned from 1,000 decisions. `decide` = the verifier, the context (bias, task type, the
//! 16 components) and the learner's choice with the decision recorded; the verdict is landed
//! outside the timed part.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use switchyard_runtime::planner::routing::embed::{COMPONENTS, Pca, SparseVec, VerifierSelector, Vocabulary};
use switchyard_runtime::planner::routing::learner_context;
use switchyard_runtime::planner::routing::linucb::{ALPHA_UCB, LinUcb};

const VERIFIERS: [&str; 3] = ["exact_answer", "tests_pass", "rouge"];
const NOUNS: [&str; 12] =
    ["apples", "numbers", "words", "tickets", "speakers", "budget", "characters", "pages", "students", "items", "design", "profits"];

/// Task text `k` of kind `kind` (0: a word problem, 1: a code task, 2: a meeting query).
fn task(kind: usize, k: usize) -> String {
    let a = NOUNS[k % NOUNS.len()];
    let b = NOUNS[(k * 7 + 3) % NOUNS.len()];
    match kind {
        0 => format!("Sam has {k} {a} and buys {} more {b}. How many {a} does Sam have now?", k % 9 + 2),
        1 => format!("Write a python function to count the {a} in a given list of {b}."),
        _ => format!("What did the group say about the {a} and the {b} in the meeting?"),
    }
}

fn setup() -> (Vocabulary, Pca, VerifierSelector, LinUcb, Vec<SparseVec>) {
    let texts: Vec<String> = (0..300).map(|k| task(k % 3, k)).collect();
    let vocab = Vocabulary::fit(&texts);
    let points: Vec<SparseVec> = texts.iter().map(|t| vocab.embed(t)).collect();
    let pca = Pca::fit(&points, COMPONENTS);
    let exemplars: Vec<(&str, &str)> = (0..15).map(|k| (VERIFIERS[k % 3], texts[k].as_str())).collect();
    let sel = VerifierSelector::fit(&vocab, &exemplars);
    let dim = switchyard_runtime::planner::routing::Router::context_dim(VERIFIERS.len(), pca.len());
    let mut learner = LinUcb::new(3, dim, ALPHA_UCB, true).expect("learner");
    for p in 0..1_000u64 {
        let x = context(&sel, &pca, &points[p as usize % points.len()]);
        let d = learner.decide(p, &x).expect("decide");
        learner.land(p, if d.arm == (p % 3) as usize { 1.0 } else { 0.0 }).expect("land");
    }
    (vocab, pca, sel, learner, points)
}

fn context(sel: &VerifierSelector, pca: &Pca, e: &SparseVec) -> Vec<f64> {
    learner_context(sel, pca, e).1
}

fn bench(c: &mut Criterion) {
    let (vocab, pca, sel, mut learner, points) = setup();
    let mut program = 1_000_000u64;
    let mut k = 0usize;
    c.bench_function("route/decide (given the embedding)", |b| {
        b.iter(|| {
            let e = &points[k % points.len()];
            k += 1;
            program += 1;
            let x = context(&sel, &pca, e);
            let d = learner.decide(program, black_box(&x)).expect("decide");
            let _ = learner.abandon(program);
            black_box(d.arm)
        })
    });
    let long = task(0, 5).repeat(200); // ≈ 16 KiB: the embedding reads only its first 4 KiB
    c.bench_function("route/embed (first 4 KiB)", |b| b.iter(|| black_box(vocab.embed(black_box(&long)))));
}

criterion_group!(benches, bench);
criterion_main!(benches);
