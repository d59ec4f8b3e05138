//! TAO's joint selection-and-placement DP (paper 000 §3.5, Algorithm 1) on snapshots shaped like
//! the paper's Qwen3-32B sweep (Appendix I reports 1.59 ms mean, 3.68 ms p95 at 160 workers on
//! four TP2 replicas). Run with `cargo bench -p switchyard-runtime --bench tao_dp`.
//!
//! The instance (a deterministic LCG, no `rand`): replicas of Qwen3-32B with TP2 on 2×H100-80GB.
//! Its KV cache costs 64 layers × 8 KV heads × 128 dims × 2 (K, V) × 2 bytes = 256 KiB a token
//! (128 KiB per GPU); the emulator gives such a replica 312,688 tokens of KV
//! (emulator/CALIBRATION.md). Under load the replicas are mostly full: each one's residual
//! admission capacity is uniform in 0–60,000 tokens (at most a fifth of its KV). Waiting agent
//! sessions carry 5,000–30,000-token contexts; the admission weight is the context less a
//! 1,500-token shared system prompt plus the 512-token reserve. Half of them have a cached prefix
//! on one replica (70–100 % of the context, observed 0–40 s ago, decayed by Eq. 4); the rest have
//! none. 30 % are ready. Every session is eligible on every replica. Δ = 2,048 tokens.
//!
//! Besides criterion's estimate on one fixed instance per shape (40×4, 160×4, 160×8), a timing
//! loop solves 1,000 different instances (seeds) per row and prints mean, p50, p95 and p99 solve
//! time (one reused `Solver`; wall clock, and the thread's CPU time, which leaves out preemption
//! on a shared machine), the states explored and how often the budget forced the
//! best-fit-decreasing fallback. Two extra 160×4 rows vary the share of sessions with cached
//! prefixes: 0 % (a cold start, the DP's hardest case: only readiness and tokens separate plans)
//! and 100 %.

use std::hint::black_box;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use switchyard_runtime::planner::tao::dp::{DEFAULT_QUANTUM, Problem, SolveOptions, Solver};
use switchyard_runtime::planner::tao::{Candidate, HALF_LIFE_S, decayed_credit};

/// The live-state budget per DP layer the bench solves under.
const STATE_BUDGET: usize = 1 << 16;
const RESIDUAL_MAX: u64 = 60_000;
const SHARED_PROMPT: u64 = 1_500;
const RESERVE: u64 = 512;

/// Knuth's MMIX LCG; the high bits are good enough for instance generation.
struct Lcg(u64);

impl Lcg {
    fn new(seed: u64) -> Self {
        let mut l = Lcg(seed ^ 0x5DEE_CE66_D1CE_4E5B);
        l.next();
        l
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 11
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        self.next() as f64 / (1u64 << 53) as f64
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + (self.unit() * (hi - lo + 1) as f64) as u64
    }
}

fn instance(candidates: usize, replicas: usize, seed: u64) -> Problem {
    instance_with(candidates, replicas, seed, 0.5)
}

/// [`instance`] with a share `cached` of the sessions holding a cached prefix (0.5 in the paper's
/// setting; 0 is a cold start, where only readiness and tokens separate plans).
fn instance_with(candidates: usize, replicas: usize, seed: u64, cached: f64) -> Problem {
    let mut g = Lcg::new(seed.wrapping_mul(0x9E37_79B9).wrapping_add((candidates * 31 + replicas) as u64));
    let capacities = (0..replicas).map(|_| g.range(0, RESIDUAL_MAX)).collect();
    let now = 1_000.0;
    let candidates = (0..candidates as u64)
        .map(|session| {
            let tokens = g.range(5_000, 30_000);
            let weight = tokens - SHARED_PROMPT + RESERVE;
            let ready = g.unit() < 0.3;
            let cached_on = if g.unit() < cached { Some(g.range(0, replicas as u64 - 1) as usize) } else { None };
            let observed = (tokens as f64 * (0.7 + 0.3 * g.unit())) as u64;
            let age = 40.0 * g.unit();
            let options = (0..replicas)
                .map(|b| {
                    let credit =
                        if cached_on == Some(b) { decayed_credit(observed, now - age, now, HALF_LIFE_S) } else { 0 };
                    (b, credit)
                })
                .collect();
            Candidate {
                session,
                signature: session.wrapping_mul(0x2545_F491_4F6C_DD1D),
                weight,
                ready,
                tokens,
                options,
            }
        })
        .collect();
    Problem { candidates, capacities, quantum: DEFAULT_QUANTUM, state_budget: STATE_BUDGET }
}

const SHAPES: [(usize, usize); 3] = [(40, 4), (160, 4), (160, 8)];

/// This thread's CPU time in seconds: unlike the wall clock, it does not count the time the
/// thread was preempted, which on a shared machine dominates the tail of a 50 µs solve.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Mean, p50, p95 and p99 of milliseconds (sorts `xs`).
fn summary(xs: &mut [f64]) -> String {
    xs.sort_by(f64::total_cmp);
    let at = |q: usize| xs[(xs.len() * q).div_ceil(100) - 1];
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    format!("mean {mean:.4} ms, p50 {:.4}, p95 {:.4}, p99 {:.4}, max {:.4}", at(50), at(95), at(99), at(100))
}

/// Solve-time distribution over many instances of each row, with states and fallbacks.
fn timing_loop() {
    let solves = 1_000u64;
    eprintln!(
        "\nTAO DP, Δ = {DEFAULT_QUANTUM} tokens, budget {STATE_BUDGET} live states per layer, {solves} instances per row \
         (wall clock, and this thread's CPU time, which excludes preemption):"
    );
    let rows: Vec<(usize, usize, f64)> =
        SHAPES.iter().map(|&(n, m)| (n, m, 0.5)).chain([(160, 4, 0.0), (160, 4, 1.0)]).collect();
    for (n, m, cached) in rows {
        let problems: Vec<Problem> = (0..solves).map(|s| instance_with(n, m, s, cached)).collect();
        let mut solver = Solver::new();
        // Warm the solver's buffers.
        for p in problems.iter().take(20) {
            black_box(solver.solve(p).expect("valid instance"));
        }
        let (mut wall, mut cpu) = (Vec::with_capacity(problems.len()), Vec::with_capacity(problems.len()));
        let (mut states, mut max_states, mut slowest, mut fallbacks) = (0usize, 0usize, 0usize, 0usize);
        for (seed, p) in problems.iter().enumerate() {
            let (t, c) = (Instant::now(), thread_cpu_s());
            let plan = solver.solve(black_box(p)).expect("valid instance");
            cpu.push((thread_cpu_s() - c) * 1e3);
            wall.push(t.elapsed().as_secs_f64() * 1e3);
            states += plan.states_explored;
            if plan.states_explored > max_states {
                (max_states, slowest) = (plan.states_explored, seed);
            }
            fallbacks += usize::from(plan.fallback);
        }
        eprintln!(
            "  {n:>3} candidates × {m} replicas, {:>3.0} % cached: states explored mean {:.0}, max {max_states} \
             (seed {slowest}); fallback {fallbacks}/{solves}\n      wall: {}\n      cpu:  {}",
            cached * 100.0,
            states as f64 / solves as f64,
            summary(&mut wall),
            summary(&mut cpu),
        );
        // What bound pruning saves: the same instances without it (states only).
        if n <= 40 {
            let off = SolveOptions { bound_pruning: false, ..SolveOptions::default() };
            let (mut s_off, mut fb_off) = (0usize, 0usize);
            for p in problems.iter().take(100) {
                let plan = solver.solve_with(p, off).expect("valid instance");
                s_off += plan.states_explored;
                fb_off += usize::from(plan.fallback);
            }
            eprintln!(
                "      without bound pruning (first 100 instances): states explored mean {:.0}; fallback {fb_off}/100",
                s_off as f64 / 100.0
            );
        }
    }
}

fn bench(c: &mut Criterion) {
    timing_loop();
    let mut group = c.benchmark_group("tao_dp");
    for (n, m) in SHAPES {
        let p = instance(n, m, 1);
        let mut solver = Solver::new();
        let plan = solver.solve(&p).expect("valid instance");
        eprintln!(
            "  seed 1, {n}×{m}: capacities {:?}, {} admitted, objective {:?}, states {}, fallback {}",
            p.capacities,
            plan.assignments.len(),
            plan.objective,
            plan.states_explored,
            plan.fallback
        );
        group.bench_function(BenchmarkId::new("solve", format!("{n}x{m}")), |b| {
            b.iter(|| solver.solve(black_box(&p)).expect("valid instance"))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50);
    targets = bench
}
criterion_main!(benches);
