//! Prints what the emulated world costs for the catalogue's Qwen3 models on each catalogue
//! device: memory plan, load / wake times, and iteration times of typical batches.
//!
//! `cargo run -p switchyard-emulator --example cost_table`

use switchyard_emulator::cost::{BatchSummary, CostModel};
use switchyard_emulator::{Dtype, MemoryPlan, ServingConfig, SleepLevel, load_time, wake_time};
use switchyard_predictor::spec::{device_catalogue, model_catalogue};

fn main() {
    println!(
        "| device | model | KV tokens | load s | wake L1 s | decode b=1 ms | decode b=64 ctx 2k ms | prefill 2,048 ms |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for d in device_catalogue() {
        let dtype = if d.supports_bf16 {
            Dtype::Bf16
        } else {
            Dtype::Fp16
        };
        for m in model_catalogue() {
            let cfg = ServingConfig::vllm_defaults(dtype, 8192);
            let kv = match MemoryPlan::new(&d, &m, &cfg) {
                Ok(plan) => plan.kv_tokens(cfg.block_size).to_string(),
                Err(_) => {
                    println!("| {} | {} | does not fit | | | | | |", d.name, m.name);
                    continue;
                }
            };
            let c = CostModel::for_arch(&d, &m, dtype);
            let mut one = BatchSummary::default();
            one.add_decode(500);
            let mut many = BatchSummary::default();
            for _ in 0..64 {
                many.add_decode(2048);
            }
            let mut prefill = BatchSummary::default();
            prefill.add_chunk(2048, 0);
            println!(
                "| {} | {} | {} | {:.1} | {:.2} | {:.1} | {:.1} | {:.1} |",
                d.name,
                m.name,
                kv,
                load_time(&d, &m, dtype),
                wake_time(&d, &m, dtype, SleepLevel::OffloadWeights),
                1e3 * c.iteration_time(&one),
                1e3 * c.iteration_time(&many),
                1e3 * c.iteration_time(&prefill),
            );
        }
    }
}
