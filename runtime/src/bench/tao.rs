//! `switchyard bench tao`: paper 000's evaluation on the emulated pool — Table 1's shape (TAO
//! against round-robin, cache-aware, Dynamo-like and ThunderAgent-like scheduling on two
//! workloads × three worker counts × two pools), Table 4's ablations, Table 8's tool-delay
//! scaling, and Figure 4's running-request series as SVG. Every scheduler runs on the same
//! trace, the same emulated replicas and the same engine-noise seed.
//!
//! Must not depend on the live shell.

use std::fmt::Write as _;

use serde::Serialize;

use crate::agentic::{AgentTrace, AgentWorkload, generate};
use crate::planner::admission::{SchedulerKind, TaoOptions};
use switchyard_predictor::spec::Dtype;

use crate::sim::agentic::{AgentPoolSpec, AgentReplicaSpec, AgentRunConfig, AgentRunReport, AgentSimError, run_agents};

/// The paper's relative improvements of TAO over the best baseline per metric (Table 1,
/// Qwen3-32B on 4 nodes × 2×H100): (workload, workers, latency %, TTFT %, decode %).
pub const PAPER_TABLE1_QWEN: [(&str, usize, f64, f64, f64); 6] = [
    ("swe-lite", 96, 11.4, 10.9, -5.1),
    ("swe-lite", 128, 1.2, 0.2, 0.8),
    ("swe-lite", 160, -0.2, 10.2, 6.7),
    ("swe-verified", 96, 8.3, 29.9, 7.8),
    ("swe-verified", 128, -2.5, 12.9, 4.0),
    ("swe-verified", 160, 9.0, 18.5, 4.7),
];

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct TaoBenchConfig {
    pub sessions: usize,
    pub workers: Vec<usize>,
    pub workloads: Vec<AgentWorkload>,
    pub pools: Vec<AgentPoolSpec>,
    pub trace_seed: u64,
    pub noise_seed: u64,
    pub plan_latency_s: f64,
    pub tao: TaoOptions,
    /// Run Table 4's ablations and Table 8's delay scaling (on the first pool, SWE-Lite).
    pub ablations: bool,
    pub ablation_workers: usize,
}

/// Paper 000's Qwen testbed: 4 replicas of Qwen3-32B, each TP2 on two H100-80GB.
pub fn pool_qwen32b_tp2x4() -> AgentPoolSpec {
    AgentPoolSpec {
        name: "4x Qwen3-32B TP2 on H100-80GB".into(),
        replicas: (0..4)
            .map(|_| AgentReplicaSpec {
                model: "Qwen3-32B".into(),
                device: "H100-80GB".into(),
                tensor_parallel: 2,
                max_model_len: 40_960,
                dtype: Dtype::Bf16,
                request_state_tokens: 0,
                kv_cache_dtype: None,
            })
            .collect(),
    }
}

/// A second pool: 4 replicas of Qwen3-14B, one A100-80GB each.
pub fn pool_qwen14b_a100x4() -> AgentPoolSpec {
    AgentPoolSpec {
        name: "4x Qwen3-14B on A100-80GB".into(),
        replicas: (0..4)
            .map(|_| AgentReplicaSpec {
                model: "Qwen3-14B".into(),
                device: "A100-80GB".into(),
                tensor_parallel: 1,
                max_model_len: 40_960,
                dtype: Dtype::Bf16,
                request_state_tokens: 0,
                kv_cache_dtype: None,
            })
            .collect(),
    }
}

impl TaoBenchConfig {
    pub fn paper() -> Self {
        TaoBenchConfig {
            sessions: 300,
            workers: vec![96, 128, 160],
            workloads: vec![AgentWorkload::SweLite, AgentWorkload::SweVerified],
            pools: vec![pool_qwen32b_tp2x4(), pool_qwen14b_a100x4()],
            trace_seed: 42,
            noise_seed: 0,
            plan_latency_s: 0.002,
            tao: TaoOptions::default(),
            ablations: true,
            ablation_workers: 128,
        }
    }

    /// Whether this runs paper 000's Table 1 grid — both pools, both workloads, 96, 128 and 160
    /// workers: the 12 settings its "10 of 12" goal counts.
    pub fn is_paper_grid(&self) -> bool {
        let paper = Self::paper();
        self.workers == paper.workers
            && self.workloads == paper.workloads
            && self.pools.iter().map(|p| &p.name).eq(paper.pools.iter().map(|p| &p.name))
    }

    /// A small configuration for tests.
    pub fn quick() -> Self {
        TaoBenchConfig {
            sessions: 24,
            workers: vec![16],
            workloads: vec![AgentWorkload::SweLite],
            pools: vec![pool_qwen14b_a100x4()],
            ablations: false,
            ablation_workers: 16,
            ..Self::paper()
        }
    }
}

/// One setting: every scheduler on one (pool, workload, workers).
#[derive(Debug, Clone, Serialize)]
pub struct TaoSetting {
    pub pool: String,
    pub workload: String,
    pub workers: usize,
    pub runs: Vec<AgentRunReport>,
    /// TAO's relative improvement over the best baseline per metric (positive = better):
    /// latency, TTFT, decode throughput.
    pub rel_latency_pct: f64,
    pub rel_ttft_pct: f64,
    pub rel_decode_pct: f64,
}

impl TaoSetting {
    /// TAO at least as good as the best baseline on latency, TTFT and decode throughput.
    pub fn tao_best_on_all(&self) -> bool {
        self.rel_latency_pct >= 0.0 && self.rel_ttft_pct >= 0.0 && self.rel_decode_pct >= 0.0
    }
}

/// One ablation or delay-scaling row.
#[derive(Debug, Clone, Serialize)]
pub struct TaoVariant {
    pub name: String,
    pub tool_scale: f64,
    pub run: AgentRunReport,
}

#[derive(Debug, Clone, Serialize)]
pub struct TaoBenchReport {
    pub config: TaoBenchConfig,
    pub settings: Vec<TaoSetting>,
    pub ablations: Vec<TaoVariant>,
    pub delay_scaling: Vec<TaoVariant>,
    /// Settings where TAO is at least as good as the best baseline on all three metrics.
    pub settings_tao_best: usize,
    /// Settings where TAO has the lowest mean TTFT.
    pub settings_tao_best_ttft: usize,
}

fn run_one(
    trace: &AgentTrace,
    pool: &AgentPoolSpec,
    cfg: &TaoBenchConfig,
    scheduler: SchedulerKind,
    workers: usize,
    tao: TaoOptions,
) -> Result<AgentRunReport, AgentSimError> {
    let run = AgentRunConfig {
        workers,
        scheduler,
        tao,
        noise_seed: cfg.noise_seed,
        plan_latency_s: cfg.plan_latency_s,
        // Paper 000 does not say; the proxy as it ships.
        thunder_acting_decay: false,
    };
    run_agents(trace, pool, &run)
}

/// Relative improvement of `tao` over `best` (positive = TAO better), lower-is-better metric.
fn gain_lower(tao: f64, best: f64) -> f64 {
    if best > 0.0 { (best - tao) / best * 100.0 } else { 0.0 }
}

fn gain_higher(tao: f64, best: f64) -> f64 {
    if best > 0.0 { (tao - best) / best * 100.0 } else { 0.0 }
}

/// Runs the bench; `progress` is told each finished run's label.
pub fn run_tao_bench(cfg: &TaoBenchConfig, mut progress: impl FnMut(&str)) -> Result<TaoBenchReport, AgentSimError> {
    let mut settings = Vec::new();
    for pool in &cfg.pools {
        for &workload in &cfg.workloads {
            let trace = generate(workload, cfg.sessions, cfg.trace_seed);
            for &workers in &cfg.workers {
                let mut runs = Vec::new();
                for kind in SchedulerKind::ALL {
                    runs.push(run_one(&trace, pool, cfg, kind, workers, cfg.tao)?);
                    progress(&format!("{} {} {workers} {}", pool.name, workload.name(), kind.name()));
                }
                let tao = runs.iter().find(|r| r.scheduler == SchedulerKind::Tao.name()).cloned();
                let base: Vec<&AgentRunReport> =
                    runs.iter().filter(|r| r.scheduler != SchedulerKind::Tao.name()).collect();
                let best_lat = base.iter().map(|r| r.mean_latency_s).fold(f64::INFINITY, f64::min);
                let best_ttft = base.iter().map(|r| r.mean_ttft_s).fold(f64::INFINITY, f64::min);
                let best_dec = base.iter().map(|r| r.decode_tps).fold(0.0, f64::max);
                let (rl, rt, rd) = tao
                    .map(|t| {
                        (
                            gain_lower(t.mean_latency_s, best_lat),
                            gain_lower(t.mean_ttft_s, best_ttft),
                            gain_higher(t.decode_tps, best_dec),
                        )
                    })
                    .unwrap_or_default();
                settings.push(TaoSetting {
                    pool: pool.name.clone(),
                    workload: workload.name().into(),
                    workers,
                    runs,
                    rel_latency_pct: rl,
                    rel_ttft_pct: rt,
                    rel_decode_pct: rd,
                });
            }
        }
    }
    let mut ablations = Vec::new();
    let mut delay_scaling = Vec::new();
    if cfg.ablations
        && let Some(pool) = cfg.pools.first()
    {
        let trace = generate(AgentWorkload::SweLite, cfg.sessions, cfg.trace_seed);
        let w = cfg.ablation_workers;
        let full = cfg.tao;
        let variants: [(&str, TaoOptions); 6] = [
            ("TAO", full),
            ("w/o cache value", TaoOptions { cache_credit: false, ..full }),
            ("w/o readiness", TaoOptions { readiness: false, ..full }),
            ("w/o cache value & readiness", TaoOptions { cache_credit: false, readiness: false, ..full }),
            ("w/o session evaluation (ThunderAgent order)", TaoOptions { token_order_only: true, ..full }),
            ("w/o decision making (BFD)", TaoOptions { bfd: true, ..full }),
        ];
        for (name, opts) in variants {
            let run = run_one(&trace, pool, cfg, SchedulerKind::Tao, w, opts)?;
            progress(&format!("ablation {name}"));
            ablations.push(TaoVariant { name: name.into(), tool_scale: 0.0, run });
        }
        for scale in [1.0, 2.0, 4.0] {
            let scaled = trace.with_extra_delay(scale, cfg.trace_seed);
            for (name, opts) in [("TAO w/o readiness", TaoOptions { readiness: false, ..full }), ("TAO", full)] {
                let run = run_one(&scaled, pool, cfg, SchedulerKind::Tao, w, opts)?;
                progress(&format!("delay x{scale} {name}"));
                delay_scaling.push(TaoVariant { name: name.into(), tool_scale: scale, run });
            }
        }
    }
    let settings_tao_best = settings.iter().filter(|s| s.tao_best_on_all()).count();
    let settings_tao_best_ttft = settings.iter().filter(|s| s.rel_ttft_pct > 0.0).count();
    Ok(TaoBenchReport {
        config: cfg.clone(),
        settings,
        ablations,
        delay_scaling,
        settings_tao_best,
        settings_tao_best_ttft,
    })
}

/// The report as Markdown (`bench-report/tao.md`).
pub fn markdown(r: &TaoBenchReport, command: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Paper 000 (TAO) on the emulated pool\n");
    let _ = writeln!(
        md,
        "Produced by `{command}`. {} sessions per run, trace seed {}, engine-noise seed {}, modeled solve latency {} ms, capacity quantum Δ = {} tokens, state budget {}.\n",
        r.config.sessions,
        r.config.trace_seed,
        r.config.noise_seed,
        r.config.plan_latency_s * 1000.0,
        r.config.tao.quantum,
        r.config.tao.state_budget
    );
    // The paper's goal is stated for its grid of 12 settings only.
    let goal = if r.config.is_paper_grid() { " (goal: 10 of 12)" } else { "" };
    let _ = writeln!(
        md,
        "TAO at least as good as the best baseline on latency, TTFT and decode throughput in **{} of {}** settings{goal}; lowest TTFT in **{} of {}** (goal: all).\n",
        r.settings_tao_best,
        r.settings.len(),
        r.settings_tao_best_ttft,
        r.settings.len()
    );
    for s in &r.settings {
        let _ = writeln!(md, "## {} · {} · {} workers\n", s.pool, s.workload, s.workers);
        let _ = writeln!(
            md,
            "| scheduler | latency (s) | TTFT (s) | p90 TTFT (s) | decode (tok/s) | cache hit | tool end → first token (s) | pause wait (s) | preemptions |"
        );
        let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        for run in &s.runs {
            let _ = writeln!(
                md,
                "| {} | {:.1} | {:.3} | {:.3} | {:.1} | {:.1} % | {:.3} | {:.2} | {} |",
                run.scheduler,
                run.mean_latency_s,
                run.mean_ttft_s,
                run.p90_ttft_s,
                run.decode_tps,
                run.cache_hit_rate * 100.0,
                run.tool_end_to_first_token_s,
                run.pause_wait_s,
                run.preemptions
            );
        }
        let paper = PAPER_TABLE1_QWEN.iter().find(|p| p.0 == s.workload && p.1 == s.workers);
        let _ = writeln!(
            md,
            "\nTAO vs the best baseline: latency {:+.1} %, TTFT {:+.1} %, decode {:+.1} %{}\n",
            s.rel_latency_pct,
            s.rel_ttft_pct,
            s.rel_decode_pct,
            paper
                .map(|p| format!(" (paper, Qwen3-32B TP2×4: {:+.1} / {:+.1} / {:+.1} %)", p.2, p.3, p.4))
                .unwrap_or_default()
        );
    }
    if !r.ablations.is_empty() {
        let _ = writeln!(
            md,
            "## Component ablations (Table 4's shape; {} workers, SWE-Lite, first pool)\n",
            r.config.ablation_workers
        );
        let _ = writeln!(
            md,
            "| configuration | decode (tok/s) | hit | TTFT (s) | tool end → first (s) | pause (s) | latency (s) |"
        );
        let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
        for v in &r.ablations {
            let run = &v.run;
            let _ = writeln!(
                md,
                "| {} | {:.1} | {:.2} % | {:.3} | {:.3} | {:.2} | {:.1} |",
                v.name,
                run.decode_tps,
                run.cache_hit_rate * 100.0,
                run.mean_ttft_s,
                run.tool_end_to_first_token_s,
                run.pause_wait_s,
                run.mean_latency_s
            );
        }
        let _ = writeln!(md);
    }
    if !r.delay_scaling.is_empty() {
        let _ = writeln!(md, "## Tool-delay scaling (Table 8's shape: each session's tools + scale × U(1, 5) s)\n");
        let _ = writeln!(md, "| scale | arm | makespan (s) | mean E2E (s) | readiness MAE (s) | within 0.5 s |");
        let _ = writeln!(md, "| ---: | --- | ---: | ---: | ---: | ---: |");
        for v in &r.delay_scaling {
            let _ = writeln!(
                md,
                "| {} | {} | {:.1} | {:.1} | {} | {} |",
                v.tool_scale,
                v.name,
                v.run.makespan_s,
                v.run.mean_latency_s,
                v.run.readiness_mae_s.map_or_else(|| "–".to_string(), |e| format!("{e:.3}")),
                v.run.readiness_within_half_s.map_or_else(|| "–".to_string(), |w| format!("{:.1} %", w * 100.0))
            );
        }
        let _ = writeln!(md);
    }
    if let Some(t) = r.settings.iter().flat_map(|s| s.runs.iter()).find(|x| x.scheduler == "tao") {
        let p = &t.planner;
        let _ = writeln!(md, "## Planner outcomes (Table 9's shape; first setting's TAO run)\n");
        let _ = writeln!(
            md,
            "submissions {}, applications {} ({} nonempty), BFD fallbacks {}, discarded {}, partial {}; mean candidates {:.1}, mean DP states explored per solve {:.0} (max {}; over every layer and restart of a solve, while the state budget bounds each layer), mean plan age {:.1} ms. Solve time: `cargo bench -p switchyard-runtime --bench tao_dp`.\n",
            p.submissions,
            p.applications,
            p.nonempty_applications,
            p.fallbacks,
            p.discarded,
            p.partial,
            p.candidates_mean,
            p.states_mean,
            p.states_max,
            p.plan_age_mean_s * 1000.0
        );
    }
    md
}

/// Why [`running_svg`] drew no chart.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// The report holds nothing to draw.
    #[error("the report has no setting")]
    Empty,
    /// Plotters failed to draw (its message).
    #[error("{0}")]
    Draw(String),
}

/// Figure 4's shape: requests running or queued in the engines over time, one line per
/// scheduler, for the setting with the most workers on the first pool and workload.
pub fn running_svg(r: &TaoBenchReport) -> Result<String, ChartError> {
    use plotters::prelude::*;
    let Some(setting) = r
        .settings
        .iter()
        .filter(|s| {
            Some(&s.pool) == r.settings.first().map(|f| &f.pool)
                && Some(&s.workload) == r.settings.first().map(|f| &f.workload)
        })
        .max_by_key(|s| s.workers)
    else {
        return Err(ChartError::Empty);
    };
    let s = |e: &dyn std::fmt::Display| ChartError::Draw(e.to_string());
    let step = crate::sim::agentic::SERIES_STEP_S;
    let xmax = setting.runs.iter().map(|run| run.running_series.len()).max().unwrap_or(1).max(1) as f64 * step;
    let ymax =
        setting.runs.iter().flat_map(|run| run.running_series.iter()).copied().max().unwrap_or(1).max(1) as f64 * 1.15;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| s(&e))?;
        let title = format!("Running requests · {} · {} · {} workers", setting.pool, setting.workload, setting.workers);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 15))
            .margin(10)
            .x_label_area_size(32)
            .y_label_area_size(48)
            .build_cartesian_2d(0.0..xmax, 0.0..ymax)
            .map_err(|e| s(&e))?;
        chart
            .configure_mesh()
            .x_desc("seconds since the first request")
            .y_desc("requests in the engines")
            .draw()
            .map_err(|e| s(&e))?;
        for (k, run) in setting.runs.iter().enumerate() {
            let color = crate::report::timeline::PALETTE[k % crate::report::timeline::PALETTE.len()];
            let label = format!("{} ({:.0} s)", run.scheduler, run.makespan_s);
            chart
                .draw_series(LineSeries::new(
                    run.running_series.iter().enumerate().map(|(t, &v)| (t as f64 * step, f64::from(v))),
                    color.stroke_width(2),
                ))
                .map_err(|e| s(&e))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| s(&e))?;
        root.present().map_err(|e| s(&e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_report(config: TaoBenchConfig) -> TaoBenchReport {
        TaoBenchReport {
            config,
            settings: Vec::new(),
            ablations: Vec::new(),
            delay_scaling: Vec::new(),
            settings_tao_best: 0,
            settings_tao_best_ttft: 0,
        }
    }

    /// "(goal: 10 of 12)" is paper 000's goal for its grid: stated for the default grid only,
    /// not for another `--workers` list or `--quick`.
    #[test]
    fn the_ten_of_twelve_goal_is_stated_for_the_paper_grid_only() {
        let goal = "settings (goal: 10 of 12); lowest TTFT";
        assert!(markdown(&empty_report(TaoBenchConfig::paper()), "c").contains(goal));
        let mut other = TaoBenchConfig::paper();
        other.workers = vec![96, 96];
        let md = markdown(&empty_report(other), "c");
        assert!(!md.contains("10 of 12") && md.contains("settings; lowest TTFT in **0 of 0** (goal: all)"), "{md}");
        let mut quick = TaoBenchConfig::paper();
        quick.pools.truncate(1);
        quick.workloads.truncate(1);
        assert!(!markdown(&empty_report(quick), "c").contains("10 of 12"));
        assert!(!markdown(&empty_report(TaoBenchConfig::quick()), "c").contains("10 of 12"));
    }
}
