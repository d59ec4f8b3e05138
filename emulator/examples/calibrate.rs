//! Offline calibration of the emulator's cost model against Vidur's measured profiles.
//!
//! `cargo run -p switchyard-emulator --example calibrate`
//!
//! Fits, per device class (A100, H100), the efficiency constants of the cost model by least
//! squares on the log of predicted / measured time (Nelder–Mead over log-parameters):
//! the four linear ops jointly (mfu, its half-ramp tokens, mbu, smooth-max exponent, launch), each element-wise op
//! separately (mbu, launch), attention on the one legacy A100 shape, and the CPU overhead by
//! ordinary least squares. Prints the constants as Rust to paste into `src/cost.rs`, and the
//! WAPE / MAPE tables for `CALIBRATION.md`.
//!
//! Then tensor parallelism (alone: `--example calibrate -- tp`): the TP = 2, 4, 8 rows of the
//! same `mlp.csv` profiles predicted with the TP = 1 constants on the sharded shape (no refit),
//! the all-reduce interpolation knots from `emulator/data/vidur-profiling` and their error, and
//! the CPU overhead refitted on the TP = 2 and TP = 4 rows of `cpu_overheads.csv`.

#[path = "../tests/support/vidur.rs"]
mod vidur;

use switchyard_emulator::cost::{AllReduce, CostModel, Efficiency, KernelEff, ModelShape, OpTimes};
use switchyard_predictor::spec::{DeviceSpec, Dtype};
use vidur::{ErrorStats, LINEAR_OPS, MlpRow, OPS, Res, error_stats, layer_pair, op_value};

/// The TP degrees of Vidur's compute and network profiles.
const TP_DEGREES: [u32; 3] = [2, 4, 8];

/// Minimises `f` from `x0` with the Nelder–Mead simplex method.
fn nelder_mead(f: &dyn Fn(&[f64]) -> f64, x0: &[f64], step: f64, iters: usize) -> Vec<f64> {
    let n = x0.len();
    let mut simplex: Vec<Vec<f64>> = vec![x0.to_vec()];
    for i in 0..n {
        let mut x = x0.to_vec();
        x[i] += step;
        simplex.push(x);
    }
    let mut values: Vec<f64> = simplex.iter().map(|x| f(x)).collect();
    for _ in 0..iters {
        let mut order: Vec<usize> = (0..=n).collect();
        order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
        simplex = order.iter().map(|&i| simplex[i].clone()).collect();
        values = order.iter().map(|&i| values[i]).collect();
        let centroid: Vec<f64> = (0..n)
            .map(|j| simplex[..n].iter().map(|x| x[j]).sum::<f64>() / n as f64)
            .collect();
        let along = |t: f64| -> Vec<f64> {
            (0..n)
                .map(|j| centroid[j] + t * (simplex[n][j] - centroid[j]))
                .collect()
        };
        let reflected = along(-1.0);
        let fr = f(&reflected);
        if fr < values[0] {
            let expanded = along(-2.0);
            let fe = f(&expanded);
            if fe < fr {
                simplex[n] = expanded;
                values[n] = fe;
            } else {
                simplex[n] = reflected;
                values[n] = fr;
            }
        } else if fr < values[n - 1] {
            simplex[n] = reflected;
            values[n] = fr;
        } else {
            let contracted = along(0.5);
            let fc = f(&contracted);
            if fc < values[n] {
                simplex[n] = contracted;
                values[n] = fc;
            } else {
                for i in 1..=n {
                    simplex[i] = (0..n)
                        .map(|j| simplex[0][j] + 0.5 * (simplex[i][j] - simplex[0][j]))
                        .collect();
                    values[i] = f(&simplex[i]);
                }
            }
        }
    }
    let best = (0..=n)
        .min_by(|&a, &b| values[a].total_cmp(&values[b]))
        .unwrap_or(0);
    simplex[best].clone()
}

fn sq_log_err(pred: f64, meas: f64) -> f64 {
    if meas <= 0.0 || pred <= 0.0 {
        return 0.0;
    }
    let d = (pred / meas).ln();
    d * d
}

/// The starting point, and the container of the fitted values.
fn initial() -> Efficiency {
    let k = |mbu, launch_s| KernelEff { mbu, launch_s };
    Efficiency {
        linear_mfu: 0.7,
        linear_mfu_half_tokens: 50.0,
        linear_mbu: 0.8,
        linear_sharpness: 4.0,
        linear_launch_s: 4e-6,
        norm: k(0.3, 3e-6),
        rope: k(0.45, 4e-6),
        act: k(0.5, 6e-6),
        add: k(0.9, 2e-6),
        emb: k(0.15, 3e-6),
        attn_prefill_mfu: 0.19,
        attn_mbu: 0.8,
        attn_launch_s: 1.2e-5,
    }
}

fn model_for(dev: &DeviceSpec, shape: ModelShape, eff: Efficiency) -> CostModel {
    CostModel::with_efficiency(dev, shape, Dtype::Fp16, eff)
}

/// The cost model one profile row is predicted with: its whole shape sharded by its TP degree.
fn model_for_row(dev: &DeviceSpec, row: &MlpRow, eff: Efficiency) -> CostModel {
    CostModel::with_efficiency_tp(dev, row.shape, Dtype::Fp16, eff, row.tp)
}

fn fit_linear(dev: &DeviceSpec, rows: &[MlpRow], eff: &mut Efficiency) {
    let objective = |x: &[f64]| {
        let e = Efficiency {
            linear_mfu: x[0].exp(),
            linear_mbu: x[1].exp(),
            linear_sharpness: x[2].exp(),
            linear_launch_s: x[3].exp(),
            linear_mfu_half_tokens: x[4].exp(),
            ..*eff
        };
        let mut sum = 0.0;
        for r in rows {
            let t = model_for(dev, r.shape, e).op_times(r.num_tokens);
            for op in LINEAR_OPS {
                if let Some(&m) = r.ops.get(op) {
                    sum += sq_log_err(op_value(&t, op), m);
                }
            }
        }
        sum
    };
    let x0 = [
        eff.linear_mfu.ln(),
        eff.linear_mbu.ln(),
        eff.linear_sharpness.ln(),
        eff.linear_launch_s.ln(),
        eff.linear_mfu_half_tokens.ln(),
    ];
    let x = nelder_mead(&objective, &x0, 0.3, 600);
    eff.linear_mfu = x[0].exp();
    eff.linear_mbu = x[1].exp();
    eff.linear_sharpness = x[2].exp();
    eff.linear_launch_s = x[3].exp();
    eff.linear_mfu_half_tokens = x[4].exp();
}

fn fit_kernel(
    dev: &DeviceSpec,
    rows: &[MlpRow],
    eff: &Efficiency,
    ops: &[&str],
    set: fn(&mut Efficiency, KernelEff),
    get: fn(&Efficiency) -> KernelEff,
) -> KernelEff {
    let objective = |x: &[f64]| {
        let mut e = *eff;
        set(
            &mut e,
            KernelEff {
                mbu: x[0].exp(),
                launch_s: x[1].exp(),
            },
        );
        let mut sum = 0.0;
        for r in rows {
            let t = model_for(dev, r.shape, e).op_times(r.num_tokens);
            for &op in ops {
                if let Some(&m) = r.ops.get(op) {
                    sum += sq_log_err(op_value(&t, op), m);
                }
            }
        }
        sum
    };
    let k0 = get(eff);
    let x = nelder_mead(&objective, &[k0.mbu.ln(), k0.launch_s.ln()], 0.3, 200);
    KernelEff {
        mbu: x[0].exp(),
        launch_s: x[1].exp(),
    }
}

fn fit_attention(dev: &DeviceSpec, rows: &[vidur::AttnRow], eff: &mut Efficiency) {
    let shape = vidur::legacy_attention_shape();
    let objective = |x: &[f64]| {
        let e = Efficiency {
            attn_prefill_mfu: x[0].exp(),
            attn_mbu: x[1].exp(),
            attn_launch_s: x[2].exp(),
            ..*eff
        };
        let c = model_for(dev, shape, e);
        rows.iter()
            .map(|r| sq_log_err(c.attention_time(&r.batch), r.time_s))
            .sum::<f64>()
    };
    let x0 = [
        eff.attn_prefill_mfu.ln(),
        eff.attn_mbu.ln(),
        eff.attn_launch_s.ln(),
    ];
    let x = nelder_mead(&objective, &x0, 0.3, 300);
    eff.attn_prefill_mfu = x[0].exp();
    eff.attn_mbu = x[1].exp();
    eff.attn_launch_s = x[2].exp();
}

fn report_mlp(dev: &DeviceSpec, rows: &[MlpRow], eff: Efficiency) {
    let models: Vec<CostModel> = rows.iter().map(|r| model_for_row(dev, r, eff)).collect();
    let times: Vec<OpTimes> = rows
        .iter()
        .zip(&models)
        .map(|(r, c)| c.op_times(r.num_tokens))
        .collect();
    println!("| op | rows | WAPE | MAPE |");
    println!("| --- | ---: | ---: | ---: |");
    for op in OPS {
        let s = error_stats(
            rows.iter()
                .zip(&times)
                .filter_map(|(r, t)| r.ops.get(op).map(|&m| (op_value(t, op), m))),
        );
        println!(
            "| {op} | {} | {:.1} % | {:.1} % |",
            s.n,
            100.0 * s.wape,
            100.0 * s.mape
        );
    }
    let layer = |small: bool| -> ErrorStats {
        error_stats(
            rows.iter()
                .zip(&times)
                .filter(|(r, _)| !small || r.num_tokens <= 256)
                .map(|(r, t)| layer_pair(r, t)),
        )
    };
    let marks = [1u64, 16, 64, 128, 256, 512, 1024, 4096];
    println!();
    println!("predicted / measured layer time, by num_tokens:\n");
    println!("| model | {} |", marks.map(|n| n.to_string()).join(" | "));
    println!("| --- |{}", " ---: |".repeat(marks.len()));
    let mut names: Vec<&str> = rows.iter().map(|r| r.model.as_str()).collect();
    names.dedup();
    for name in names {
        let cells: Vec<String> = marks
            .iter()
            .map(|&n| {
                rows.iter()
                    .zip(&times)
                    .find(|(r, _)| r.model == name && r.num_tokens == n)
                    .map(|(r, t)| {
                        let (p, m) = layer_pair(r, t);
                        format!("{:.2}", p / m)
                    })
                    .unwrap_or_else(|| "–".into())
            })
            .collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    println!();
    let all = layer(false);
    let small = layer(true);
    println!(
        "| **layer total** (all ops but emb) | {} | **{:.1} %** | {:.1} % |",
        all.n,
        100.0 * all.wape,
        100.0 * all.mape
    );
    println!(
        "| layer total, num_tokens ≤ 256 | {} | {:.1} % | {:.1} % |",
        small.n,
        100.0 * small.wape,
        100.0 * small.mape
    );
}

fn print_eff(name: &str, e: &Efficiency) {
    let k = |k: KernelEff| {
        format!(
            "KernelEff {{ mbu: {:.3}, launch_s: {:.2e} }}",
            k.mbu, k.launch_s
        )
    };
    println!("const {name}: Efficiency = Efficiency {{");
    println!("    linear_mfu: {:.3},", e.linear_mfu);
    println!(
        "    linear_mfu_half_tokens: {:.1},",
        e.linear_mfu_half_tokens
    );
    println!("    linear_mbu: {:.3},", e.linear_mbu);
    println!("    linear_sharpness: {:.2},", e.linear_sharpness);
    println!("    linear_launch_s: {:.2e},", e.linear_launch_s);
    println!("    norm: {},", k(e.norm));
    println!("    rope: {},", k(e.rope));
    println!("    act: {},", k(e.act));
    println!("    add: {},", k(e.add));
    println!("    emb: {},", k(e.emb));
    println!("    attn_prefill_mfu: {:.3},", e.attn_prefill_mfu);
    println!("    attn_mbu: {:.3},", e.attn_mbu);
    println!("    attn_launch_s: {:.2e},", e.attn_launch_s);
    println!("}};");
}

/// The tensor-parallel part: TP rows of the compute profiles, all-reduce knots, CPU overhead.
fn tensor_parallel() -> Res<()> {
    for vd in ["a100", "h100"] {
        let dev = vidur::device_spec(vd)?;
        // The constants the emulator serves `dev` with (the op times do not involve the
        // attention constants, where the two differ).
        let eff = Efficiency::fitted_for(&dev);
        for tp in TP_DEGREES {
            let rows = vidur::load_mlp_tp(vd, tp)?;
            let mut models: Vec<&str> = rows.iter().map(|r| r.model.as_str()).collect();
            models.dedup();
            println!(
                "\n## {vd} ({}), TP = {tp}: {} rows, {} models ({})\n",
                dev.name,
                rows.len(),
                models.len(),
                models.join(", ")
            );
            report_mlp(&dev, &rows, eff);
        }
    }

    println!("\n## all-reduce knots (bytes, seconds)\n");
    for node in ["h100_dgx", "a100_dgx"] {
        println!("const {}_ALL_REDUCE: [(u32, Knots); 3] = [", node.to_ascii_uppercase());
        for tp in TP_DEGREES {
            let rows = vidur::load_all_reduce(node, tp)?;
            let knots = vidur::all_reduce_knots(&rows);
            let cells: Vec<String> = knots.iter().map(|(b, t)| format!("({b:.1}, {t:.4e})")).collect();
            println!("    ({tp}, &[{}]),", cells.join(", "));
        }
        println!("];");
    }
    println!("\n| node | workers | rows | WAPE | MAPE | rows ≥ 1 MiB | WAPE | MAPE |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for node in ["h100_dgx", "a100_dgx"] {
        for tp in TP_DEGREES {
            let rows = vidur::load_all_reduce(node, tp)?;
            let knots = vidur::all_reduce_knots(&rows);
            let ar = AllReduce::Profile { node: "derived", knots: Box::leak(knots.into_boxed_slice()) };
            let all = error_stats(rows.iter().map(|r| (ar.time(r.bytes), r.time_s)));
            let big = error_stats(
                rows.iter().filter(|r| r.bytes >= f64::from(1u32 << 20)).map(|r| (ar.time(r.bytes), r.time_s)),
            );
            println!(
                "| {node} | {tp} | {} | {:.1} % | {:.1} % | {} | {:.1} % | {:.1} % |",
                all.n,
                100.0 * all.wape,
                100.0 * all.mape,
                big.n,
                100.0 * big.wape,
                100.0 * big.mape
            );
        }
    }

    println!("\n## CPU overhead at TP > 1\n");
    let mut consts = Vec::new();
    for tp in [2u32, 4] {
        let rows = vidur::load_cpu_overheads_tp(tp)?;
        let (base, slope) = vidur::fit_cpu_overhead(&rows);
        let s = error_stats(rows.iter().map(|r| (base + slope * f64::from(r.batch_size), r.time_s)));
        println!(
            "TP {tp}: {} rows, base {:.3} ms, per sequence {:.4} ms, WAPE {:.1} %, MAPE {:.1} %",
            s.n,
            base * 1e3,
            slope * 1e3,
            100.0 * s.wape,
            100.0 * s.mape
        );
        consts.push(format!("({tp}, {base:.4e}, {slope:.4e})"));
    }
    println!("const CPU_OVERHEAD_TP: [(u32, f64, f64); 2] = [{}];", consts.join(", "));
    Ok(())
}

fn main() -> Res<()> {
    if std::env::args().nth(1).as_deref() == Some("tp") {
        return tensor_parallel();
    }
    let mut fitted = Vec::new();
    let a100 = vidur::device_spec("a100")?;
    let attention = vidur::load_legacy_attention()?;
    let mut attn_eff = None;
    for vd in ["a100", "h100"] {
        let dev = vidur::device_spec(vd)?;
        let rows = vidur::load_mlp(vd)?;
        let mut eff = initial();
        fit_linear(&dev, &rows, &mut eff);
        eff.norm = fit_kernel(
            &dev,
            &rows,
            &eff,
            &["input_layernorm", "post_attention_layernorm"],
            |e, k| e.norm = k,
            |e| e.norm,
        );
        eff.rope = fit_kernel(
            &dev,
            &rows,
            &eff,
            &["attn_rope"],
            |e, k| e.rope = k,
            |e| e.rope,
        );
        eff.act = fit_kernel(&dev, &rows, &eff, &["mlp_act"], |e, k| e.act = k, |e| e.act);
        eff.add = fit_kernel(&dev, &rows, &eff, &["add"], |e, k| e.add = k, |e| e.add);
        eff.emb = fit_kernel(&dev, &rows, &eff, &["emb"], |e, k| e.emb = k, |e| e.emb);
        if vd == "a100" {
            fit_attention(&a100, &attention, &mut eff);
            attn_eff = Some((eff.attn_prefill_mfu, eff.attn_mbu, eff.attn_launch_s));
        } else if let Some((mfu, mbu, launch)) = attn_eff {
            // No H100 attention profile: reuse the A100 fractions of peak.
            eff.attn_prefill_mfu = mfu;
            eff.attn_mbu = mbu;
            eff.attn_launch_s = launch;
        }
        println!("\n## {vd} ({}), {} TP=1 rows\n", dev.name, rows.len());
        report_mlp(&dev, &rows, eff);
        fitted.push((vd, eff));
    }

    println!("\n## attention, legacy A100 shape (32 q / 4 kv heads of 128 per GPU)\n");
    if let Some((_, eff)) = fitted.first() {
        let c =
            CostModel::with_efficiency(&a100, vidur::legacy_attention_shape(), Dtype::Fp16, *eff);
        for prefill in [true, false] {
            let s = error_stats(
                attention
                    .iter()
                    .filter(|r| r.prefill == prefill)
                    .map(|r| (c.attention_time(&r.batch), r.time_s)),
            );
            println!(
                "| {} | {} | {:.1} % | {:.1} % |",
                if prefill { "prefill" } else { "decode" },
                s.n,
                100.0 * s.wape,
                100.0 * s.mape
            );
        }
    }

    let cpu = vidur::load_cpu_overheads()?;
    let n = cpu.len() as f64;
    let (mx, my) = (
        cpu.iter().map(|r| f64::from(r.batch_size)).sum::<f64>() / n,
        cpu.iter().map(|r| r.time_s).sum::<f64>() / n,
    );
    let sxy: f64 = cpu
        .iter()
        .map(|r| (f64::from(r.batch_size) - mx) * (r.time_s - my))
        .sum();
    let sxx: f64 = cpu
        .iter()
        .map(|r| (f64::from(r.batch_size) - mx).powi(2))
        .sum();
    let slope = sxy / sxx;
    let base = my - slope * mx;
    let s = error_stats(
        cpu.iter()
            .map(|r| (base + slope * f64::from(r.batch_size), r.time_s)),
    );
    println!("\n## CPU overhead (TP=1 rows: {})\n", s.n);
    println!("const CPU_OVERHEAD_BASE_S: f64 = {base:.4e};");
    println!("const CPU_OVERHEAD_PER_SEQ_S: f64 = {slope:.4e};");
    println!("WAPE {:.1} %, MAPE {:.1} %", 100.0 * s.wape, 100.0 * s.mape);

    println!("\n## constants\n");
    for (vd, eff) in &fitted {
        print_eff(if *vd == "a100" { "AMPERE" } else { "HOPPER" }, eff);
    }
    tensor_parallel()
}
