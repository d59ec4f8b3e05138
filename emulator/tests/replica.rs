//! Behaviour of the emulated replica through its public API: lifecycle transitions, prefix
//! caching, chunked prefill, preemption, request validation, seeded determinism and tensor
//! parallelism.

use switchyard_emulator::{
    DeviceSpec, Dtype, EmulatedReplica, EmulatorError, EngineEvent, EngineRequest, ReplicaState,
    ServingConfig,
};
use switchyard_predictor::spec::{device, model};

fn awake(device_name: &str, model_name: &str, config: ServingConfig, seed: u64) -> EmulatedReplica {
    let mut r = EmulatedReplica::new(
        device(device_name).unwrap(),
        model(model_name).unwrap(),
        config,
        seed,
    )
    .unwrap();
    let t = r.begin_load(0.0).unwrap();
    assert!(r.finish_transition(t));
    r
}

fn request(id: u64, prompt_tokens: u32, output_tokens: u32, family: u64) -> EngineRequest {
    let hashes = (0..u64::from(prompt_tokens / 16))
        .map(|b| family.wrapping_mul(1_000_003) ^ b)
        .collect();
    EngineRequest {
        id,
        prompt_tokens,
        prefix_hashes: hashes,
        generated_hashes: Vec::new(),
        output_tokens,
    }
}

/// Runs iterations until the replica is idle; returns the events and the final time.
fn drain(r: &mut EmulatedReplica, mut now: f64) -> (Vec<EngineEvent>, f64) {
    let mut events = Vec::new();
    while let Some(end) = r.start_iteration(now) {
        assert!(r.in_iteration());
        assert_eq!(r.iteration_end(), Some(end));
        now = end;
        events.extend(r.finish_iteration(now));
    }
    (events, now)
}

fn first_token_at(events: &[EngineEvent], id: u64) -> f64 {
    events
        .iter()
        .find_map(|e| match e {
            EngineEvent::FirstToken { id: i, at } if *i == id => Some(*at),
            _ => None,
        })
        .unwrap_or(f64::NAN)
}

fn finished(events: &[EngineEvent]) -> Vec<(u64, u32, u32)> {
    events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Finished {
                id,
                cached_prompt_tokens,
                output_tokens,
                ..
            } => Some((*id, *cached_prompt_tokens, *output_tokens)),
            _ => None,
        })
        .collect()
}

#[test]
fn lifecycle_transitions_and_their_errors() {
    let d = device("A100-40GB").unwrap();
    let m = model("Qwen3-8B").unwrap();
    let mut r =
        EmulatedReplica::new(d, m, ServingConfig::vllm_defaults(Dtype::Bf16, 8192), 1).unwrap();
    let plan = r.memory_plan().clone();
    assert_eq!(r.state(), ReplicaState::Cold);
    assert_eq!(r.device_memory_in_use(), 0);
    let illegal = |e: EmulatorError| matches!(e, EmulatorError::IllegalTransition { .. });
    assert!(illegal(r.submit(request(1, 100, 5, 0), 0.0).unwrap_err()));
    assert!(illegal(r.begin_wake(0.0).unwrap_err()));
    assert!(illegal(r.begin_sleep(1, 0.0).unwrap_err()));
    assert!(illegal(r.unload().unwrap_err()));

    let until = r.begin_load(10.0).unwrap();
    assert!(
        (until
            - 10.0
            - switchyard_emulator::load_time(
                &device("A100-40GB").unwrap(),
                &model("Qwen3-8B").unwrap(),
                Dtype::Bf16
            ))
        .abs()
            < 1e-9
    );
    assert_eq!(r.state(), ReplicaState::Loading { until });
    assert_eq!(r.device_memory_in_use(), plan.total_claim_bytes);
    assert!(illegal(r.begin_load(11.0).unwrap_err()));
    assert!(illegal(r.submit(request(1, 100, 5, 0), 11.0).unwrap_err()));
    assert!(!r.finish_transition(until - 1.0), "too early");
    assert!(r.finish_transition(until));
    assert_eq!(r.state(), ReplicaState::Awake);
    assert!(!r.finish_transition(until + 1.0), "nothing pending");

    // Busy replicas neither sleep nor unload.
    r.submit(request(1, 100, 5, 0), until).unwrap();
    assert!(matches!(
        r.begin_sleep(1, until).unwrap_err(),
        EmulatorError::Busy { in_flight: 1, .. }
    ));
    assert!(matches!(
        r.unload().unwrap_err(),
        EmulatorError::Busy { .. }
    ));
    assert_eq!(
        r.begin_sleep(0, until).unwrap_err(),
        EmulatorError::InvalidSleepLevel(0)
    );
    let (_, now) = drain(&mut r, until);

    let asleep_at = r.begin_sleep(1, now).unwrap();
    assert!(asleep_at > now);
    assert!(matches!(r.state(), ReplicaState::Sleeping { .. }));
    assert!(illegal(r.submit(request(2, 100, 5, 0), now).unwrap_err()));
    assert!(
        illegal(r.begin_wake(now).unwrap_err()),
        "still falling asleep"
    );
    assert!(r.finish_transition(asleep_at));
    assert_eq!(r.state(), ReplicaState::Asleep);
    assert_eq!(r.device_memory_in_use(), plan.asleep_bytes);
    assert!(plan.asleep_bytes < plan.total_claim_bytes / 10);
    assert!(r.start_iteration(asleep_at).is_none());

    let awake_at = r.begin_wake(asleep_at).unwrap();
    assert!(matches!(r.state(), ReplicaState::Waking { .. }));
    assert_eq!(r.device_memory_in_use(), plan.total_claim_bytes);
    assert!(r.finish_transition(awake_at));
    assert_eq!(r.state(), ReplicaState::Awake);

    // Level 2 wakes by re-reading weights from storage: slower than level 1.
    let l2_asleep = r.begin_sleep(2, awake_at).unwrap();
    assert!(r.finish_transition(l2_asleep));
    let l2_awake = r.begin_wake(l2_asleep).unwrap();
    assert!(l2_awake - l2_asleep > awake_at - asleep_at);
    assert!(r.finish_transition(l2_awake));

    r.unload().unwrap();
    assert_eq!(r.state(), ReplicaState::Cold);
    assert_eq!(r.device_memory_in_use(), 0);
    // A cold replica loads again.
    assert!(r.begin_load(l2_awake).is_ok());
}

#[test]
fn an_asleep_replica_unloads() {
    let mut r = awake(
        "A100-40GB",
        "Qwen3-1.7B",
        ServingConfig::vllm_defaults(Dtype::Bf16, 4096),
        1,
    );
    let t = r.begin_sleep(1, 0.0).unwrap();
    assert!(r.finish_transition(t));
    r.unload().unwrap();
    assert_eq!(r.state(), ReplicaState::Cold);
}

#[test]
fn a_repeated_prompt_hits_the_prefix_cache_and_starts_sooner() {
    let mut r = awake(
        "A100-40GB",
        "Qwen3-8B",
        ServingConfig::vllm_defaults(Dtype::Bf16, 8192),
        3,
    );
    r.submit(request(1, 4000, 10, 42), 0.0).unwrap();
    let (ev1, t1) = drain(&mut r, 0.0);
    let ttft1 = first_token_at(&ev1, 1);
    r.submit(request(2, 4000, 10, 42), t1).unwrap();
    let (ev2, _) = drain(&mut r, t1);
    let ttft2 = first_token_at(&ev2, 2) - t1;
    assert!(ttft2 < ttft1 / 3.0, "cached TTFT {ttft2} vs cold {ttft1}");
    // 4,000 tokens = 250 full blocks, all cached; as in vLLM at least the last token is
    // computed, so the hit stops at the last full block before it: 249 × 16 = 3,984.
    assert_eq!(finished(&ev1), vec![(1, 0, 10)]);
    assert_eq!(finished(&ev2), vec![(2, 3984, 10)]);
    let t = r.telemetry();
    assert_eq!(t.prefix_cache_queries, 8000);
    assert_eq!(t.prefix_cache_hits, 3984);

    // A different prompt family shares nothing.
    r.submit(request(3, 4000, 10, 7), t1 + 10.0).unwrap();
    let (ev3, _) = drain(&mut r, t1 + 10.0);
    assert_eq!(finished(&ev3), vec![(3, 0, 10)]);
}

#[test]
fn sleeping_empties_the_prefix_cache() {
    let mut r = awake(
        "A100-40GB",
        "Qwen3-4B",
        ServingConfig::vllm_defaults(Dtype::Bf16, 8192),
        3,
    );
    r.submit(request(1, 2000, 4, 9), 0.0).unwrap();
    let (_, t) = drain(&mut r, 0.0);
    let asleep = r.begin_sleep(1, t).unwrap();
    r.finish_transition(asleep);
    let awake = r.begin_wake(asleep).unwrap();
    r.finish_transition(awake);
    r.submit(request(2, 2000, 4, 9), awake).unwrap();
    let (ev, _) = drain(&mut r, awake);
    assert_eq!(finished(&ev), vec![(2, 0, 4)]);
}

#[test]
fn prefix_caching_off_never_hits() {
    let cfg = ServingConfig {
        enable_prefix_caching: false,
        ..ServingConfig::vllm_defaults(Dtype::Bf16, 8192)
    };
    let mut r = awake("A100-40GB", "Qwen3-4B", cfg, 3);
    r.submit(request(1, 2000, 4, 9), 0.0).unwrap();
    let (_, t) = drain(&mut r, 0.0);
    r.submit(request(2, 2000, 4, 9), t).unwrap();
    let (ev, _) = drain(&mut r, t);
    assert_eq!(finished(&ev), vec![(2, 0, 4)]);
    assert_eq!(r.telemetry().prefix_cache_hits, 0);
}

#[test]
fn long_prompts_are_prefilled_in_chunks() {
    let cfg = ServingConfig {
        max_num_batched_tokens: 2048,
        ..ServingConfig::vllm_defaults(Dtype::Bf16, 16_384)
    };
    let mut r = awake("A100-40GB", "Qwen3-4B", cfg, 5);
    r.submit(request(1, 10_000, 3, 1), 0.0).unwrap();
    let (ev, _) = drain(&mut r, 0.0);
    let t = r.telemetry();
    // ceil(10,000 / 2,048) = 5 prefill iterations, then 2 decodes.
    assert_eq!(t.iterations, 7);
    assert_eq!(t.prefill_tokens, 10_000);
    assert_eq!(t.generated_tokens, 3);
    assert_eq!(finished(&ev), vec![(1, 0, 3)]);
}

#[test]
fn decodes_batch_together_and_respect_max_num_seqs() {
    let cfg = ServingConfig {
        max_num_seqs: 8,
        ..ServingConfig::vllm_defaults(Dtype::Bf16, 4096)
    };
    let mut r = awake("A100-40GB", "Qwen3-1.7B", cfg, 5);
    for id in 0..20 {
        r.submit(request(id, 100, 50, id), 0.0).unwrap();
    }
    let mut now = 0.0;
    let mut max_running = 0;
    while let Some(end) = r.start_iteration(now) {
        max_running = max_running.max(r.telemetry().running);
        now = end;
        r.finish_iteration(now);
    }
    assert_eq!(max_running, 8);
    let t = r.telemetry();
    assert_eq!(t.finished_requests, 20);
    // Batching: far fewer iterations than 20 × 50 sequential decodes.
    assert!(t.iterations < 200, "{}", t.iterations);
    assert!(t.queue_seconds > 0.0, "requests beyond the first 8 waited");
}

#[test]
fn kv_pressure_preempts_and_every_request_still_finishes_once() {
    // Qwen3-8B on an A100-40GB with 90 % utilisation holds ~133k tokens; 48 requests of
    // 2,000 + 2,000 tokens need ~192k at their peak.
    let mut r = awake(
        "A100-40GB",
        "Qwen3-8B",
        ServingConfig::vllm_defaults(Dtype::Bf16, 8192),
        11,
    );
    let total = r.memory_plan().kv_blocks;
    for id in 0..48 {
        r.submit(request(id, 2000, 2000, id), 0.0).unwrap();
    }
    let mut now = 0.0;
    let mut events = Vec::new();
    while let Some(end) = r.start_iteration(now) {
        now = end;
        events.extend(r.finish_iteration(now));
        assert!(r.telemetry().kv_blocks_in_use <= total);
    }
    let t = r.telemetry();
    assert!(t.preemptions > 0, "expected preemptions");
    let preempted = events
        .iter()
        .filter(|e| matches!(e, EngineEvent::Preempted { .. }))
        .count() as u64;
    assert_eq!(preempted, t.preemptions);
    let mut done = finished(&events);
    done.sort();
    assert_eq!(done.len(), 48);
    for (i, (id, _, out)) in done.iter().enumerate() {
        assert_eq!((*id, *out), (i as u64, 2000));
    }
    // Recomputation costs prefill work beyond the 96k prompt tokens.
    assert!(t.prefill_tokens > 96_000);
    assert_eq!(t.kv_blocks_in_use, 0);
}

#[test]
fn bad_requests_are_rejected_with_reasons() {
    let mut r = awake(
        "A100-40GB",
        "Qwen3-0.6B",
        ServingConfig::vllm_defaults(Dtype::Bf16, 1024),
        1,
    );
    let invalid = |e: EmulatorError| matches!(e, EmulatorError::InvalidRequest { .. });
    assert!(invalid(r.submit(request(1, 0, 5, 0), 0.0).unwrap_err()));
    assert!(invalid(r.submit(request(1, 10, 0, 0), 0.0).unwrap_err()));
    let err = r.submit(request(1, 1000, 25, 0), 0.0).unwrap_err();
    assert!(err.to_string().contains("max_model_len"), "{err}");
    let too_many = EngineRequest {
        id: 1,
        prompt_tokens: 40,
        prefix_hashes: vec![1, 2, 3],
        generated_hashes: Vec::new(),
        output_tokens: 1,
    };
    assert!(invalid(r.submit(too_many, 0.0).unwrap_err()));
    r.submit(request(1, 100, 5, 0), 0.0).unwrap();
    assert_eq!(
        r.submit(request(1, 100, 5, 0), 0.0).unwrap_err(),
        EmulatorError::DuplicateRequest(1)
    );
    assert_eq!(r.in_flight(), 1);
    // Once finished, the id may be reused.
    drain(&mut r, 0.0);
    r.submit(request(1, 100, 5, 0), 1.0).unwrap();
}

fn event_times(seed: u64) -> Vec<(u64, u64)> {
    let mut r = awake(
        "L4",
        "Qwen3-1.7B",
        ServingConfig::vllm_defaults(Dtype::Bf16, 8192),
        seed,
    );
    for id in 0..16 {
        r.submit(request(id, 300 + 50 * id as u32, 40, id % 3), 0.0)
            .unwrap();
    }
    let (events, _) = drain(&mut r, 0.0);
    events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Finished { id, at, .. } => Some((*id, at.to_bits())),
            _ => None,
        })
        .collect()
}

#[test]
fn same_seed_same_times_different_seed_different_times() {
    let a = event_times(7);
    assert_eq!(a.len(), 16);
    assert_eq!(a, event_times(7));
    let b = event_times(8);
    assert_ne!(a, b);
    // The noise is small: the makespans agree within a few percent.
    let end = |v: &[(u64, u64)]| {
        v.iter()
            .map(|&(_, t)| f64::from_bits(t))
            .fold(0.0, f64::max)
    };
    let (ea, eb) = (end(&a), end(&b));
    assert!((ea - eb).abs() / ea < 0.03, "{ea} vs {eb}");
}

#[test]
fn a_custom_device_without_bf16_is_refused_in_bf16() {
    let d = DeviceSpec {
        supports_bf16: false,
        ..device("A100-40GB").unwrap()
    };
    let err = EmulatedReplica::new(
        d,
        model("Qwen3-0.6B").unwrap(),
        ServingConfig::vllm_defaults(Dtype::Bf16, 4096),
        0,
    )
    .unwrap_err();
    assert!(matches!(err, EmulatorError::UnsupportedDtype { .. }));
}

/// vLLM V1 hashes every full block of a request's tokens, generated ones included, and
/// caches it once its KV is computed (`KVCacheManager.cache_blocks` over `all_token_ids`): a
/// successor whose prompt is the predecessor's prompt + output hits those blocks too. The
/// predecessor's 100-token prompt fills 6 blocks; with 60 generated tokens its 159 computed
/// tokens (the last sampled token's KV is never written) fill 9.
#[test]
fn generated_blocks_are_cached_for_a_successor() {
    let run = |with_generated: bool| {
        let d = device("A100-40GB").unwrap();
        let cfg = ServingConfig::vllm_defaults_on(&d, Dtype::Fp16, 8192);
        let mut r = awake("A100-40GB", "Qwen3-0.6B", cfg, 5);
        let t = 0.0;
        // The chain over the predecessor's 160 tokens: blocks 0–5 prompt, 6–9 completed by
        // the output; the successor's 300-token prompt continues it past block 9.
        let chain: Vec<u64> = (0..18).map(|b| 1000 + b).collect();
        let first = EngineRequest {
            id: 1,
            prompt_tokens: 100,
            prefix_hashes: chain[..6].to_vec(),
            generated_hashes: if with_generated { chain[6..10].to_vec() } else { Vec::new() },
            output_tokens: 60,
        };
        r.submit(first, t).unwrap();
        let mut now = t;
        while let Some(end) = r.start_iteration(now) {
            now = end;
            r.finish_iteration(now);
        }
        let second = EngineRequest {
            id: 2,
            prompt_tokens: 300,
            prefix_hashes: chain[..18].to_vec(),
            generated_hashes: Vec::new(),
            output_tokens: 5,
        };
        r.submit(second, now).unwrap();
        let mut cached = None;
        while let Some(end) = r.start_iteration(now) {
            now = end;
            for e in r.finish_iteration(now) {
                if let EngineEvent::Finished { id: 2, cached_prompt_tokens, .. } = e {
                    cached = Some(cached_prompt_tokens);
                }
            }
        }
        cached.expect("the successor finished")
    };
    assert_eq!(run(false), 6 * 16, "prompt blocks only");
    assert_eq!(run(true), 9 * 16, "prompt blocks and the three generated blocks completed");
}

#[test]
fn generated_hashes_must_continue_a_complete_prompt_chain() {
    let mut r = awake("A100-40GB", "Qwen3-0.6B", ServingConfig::vllm_defaults(Dtype::Bf16, 1024), 1);
    let bad = |prefix: usize, generated: usize| EngineRequest {
        id: 9,
        prompt_tokens: 40,
        prefix_hashes: (0..prefix as u64).collect(),
        generated_hashes: (100..100 + generated as u64).collect(),
        output_tokens: 30,
    };
    // 40 prompt tokens: 2 full blocks; 70 tokens: 4, so 2 completed by the output.
    assert!(matches!(r.submit(bad(1, 1), 0.0), Err(EmulatorError::InvalidRequest { .. })));
    assert!(matches!(r.submit(bad(2, 3), 0.0), Err(EmulatorError::InvalidRequest { .. })));
    r.submit(bad(2, 2), 0.0).unwrap();
}

/// An unload is a teardown: the device memory stays held for [`teardown_time`] (vLLM's engine
/// exit), from awake with the whole claim and from sleep with what sleep kept; then Cold.
#[test]
fn teardown_holds_memory_until_it_ends() {
    let d = device("A100-40GB").unwrap();
    let m = model("Qwen3-8B").unwrap();
    let mut r = EmulatedReplica::new(d, m, ServingConfig::vllm_defaults(Dtype::Bf16, 8192), 1).unwrap();
    let plan = r.memory_plan().clone();
    let illegal = |e: EmulatorError| matches!(e, EmulatorError::IllegalTransition { .. });
    assert!(illegal(r.begin_unload(0.0).unwrap_err()), "a cold replica has nothing to tear down");
    let loaded = r.begin_load(0.0).unwrap();
    assert!(illegal(r.begin_unload(1.0).unwrap_err()), "not while loading");
    r.finish_transition(loaded);
    let gone = r.begin_unload(loaded).unwrap();
    assert!((gone - loaded - switchyard_emulator::teardown_time()).abs() < 1e-9);
    assert_eq!(r.state(), ReplicaState::TearingDown { until: gone });
    assert_eq!(r.device_memory_in_use(), plan.total_claim_bytes);
    assert!(illegal(r.begin_load(gone - 1.0).unwrap_err()), "no reload before the teardown ends");
    assert!(!r.finish_transition(gone - 1.0));
    assert!(r.finish_transition(gone));
    assert_eq!(r.state(), ReplicaState::Cold);
    assert_eq!(r.device_memory_in_use(), 0);

    // From sleep: the teardown holds what the sleeper kept.
    let loaded = r.begin_load(gone).unwrap();
    r.finish_transition(loaded);
    let asleep = r.begin_sleep(1, loaded).unwrap();
    r.finish_transition(asleep);
    let gone = r.begin_unload(asleep).unwrap();
    assert_eq!(r.device_memory_in_use(), plan.asleep_bytes);
    assert!(r.finish_transition(gone));
    assert_eq!(r.device_memory_in_use(), 0);
    // A level-1 sleeper's later load is a fresh load (no leftover sleep level).
    let loaded = r.begin_load(gone).unwrap();
    assert!(r.finish_transition(loaded));
    assert!(illegal(r.begin_wake(loaded).unwrap_err()));
}

/// The scenario whose bits `tensor_parallel_one_changes_no_bit` pins.
fn pinned_scenario(cfg: ServingConfig) -> Vec<u64> {
    let d = device("A100-40GB").unwrap();
    let mut r = EmulatedReplica::new(d, model("Qwen3-4B").unwrap(), cfg, 7).unwrap();
    let mut bits = Vec::new();
    let t = r.begin_load(0.0).unwrap();
    bits.push(t.to_bits());
    assert!(r.finish_transition(t));
    for id in 0..6u64 {
        r.submit(request(id, 300 + 700 * id as u32, 20 + 15 * id as u32, id % 2), t).unwrap();
    }
    let (events, end) = drain(&mut r, t);
    bits.push(end.to_bits());
    bits.push(r.telemetry().busy_seconds.to_bits());
    bits.extend(events.iter().filter_map(|e| match e {
        EngineEvent::Finished { at, .. } => Some(at.to_bits()),
        _ => None,
    }));
    let asleep = r.begin_sleep(1, end).unwrap();
    bits.push(asleep.to_bits());
    assert!(r.finish_transition(asleep));
    bits.push(r.begin_wake(asleep).unwrap().to_bits());
    bits.push(r.memory_plan().kv_blocks.into());
    bits.push(r.device_memory_in_use());
    bits
}

/// Tensor parallelism left at 1 (absent or explicit) changes no bit of a replica's run: the
/// load, every finish time, the busy time, the sleep and wake, the blocks and the memory, as
/// computed before tensor parallelism existed (the bits below were recorded with that code).
#[test]
fn tensor_parallel_one_changes_no_bit() {
    let d = device("A100-40GB").unwrap();
    let defaults = ServingConfig::vllm_defaults_on(&d, Dtype::Bf16, 8192);
    assert_eq!(defaults.tensor_parallel, 1);
    let recorded: [u64; 13] = [
        4630670510052444400,
        4630864428503783944,
        4608884209615512387,
        4630743790718093369,
        4630767996547245809,
        4630793623006925694,
        4630818632868478964,
        4630841182518996706,
        4630864428503783944,
        4630943121720813981,
        4631021814937844018,
        12602,
        39726218240,
    ];
    assert_eq!(pinned_scenario(defaults.clone()), recorded);
    assert_eq!(pinned_scenario(ServingConfig { tensor_parallel: 1, ..defaults }), recorded);
}

/// A serving configuration written before tensor parallelism (no `tensor_parallel` field)
/// still reads, as one GPU.
#[test]
fn a_config_without_tensor_parallel_reads_as_one_gpu() {
    let header = "dtype,max_model_len,gpu_memory_utilization,max_num_seqs,max_num_batched_tokens,block_size";
    let text = format!("{header},enable_prefix_caching\nbf16,8192,0.9,256,8192,16,true\n");
    let mut rdr = csv::Reader::from_reader(text.as_bytes());
    let cfg: ServingConfig = rdr.deserialize().next().unwrap().unwrap();
    assert_eq!(cfg, ServingConfig::vllm_defaults(Dtype::Bf16, 8192));
    assert_eq!(cfg.tensor_parallel, 1);
}

/// A TP = 2 replica of Qwen3-14B on two A100-80GBs: it occupies two GPUs, holds the same claim
/// on each (half the weights, more KV), loads faster (each GPU reads its shard), and serves the
/// same requests sooner than the one-GPU replica, with the same tokens.
#[test]
fn a_tensor_parallel_replica_spans_its_gpus_and_serves_sooner() {
    let d = device("A100-80GB").unwrap();
    let m = model("Qwen3-14B").unwrap();
    let one = ServingConfig::vllm_defaults_on(&d, Dtype::Bf16, 16_384);
    let two = ServingConfig { tensor_parallel: 2, ..one.clone() };
    let mut r1 = EmulatedReplica::new(d.clone(), m.clone(), one, 3).unwrap();
    let mut r2 = EmulatedReplica::new(d.clone(), m.clone(), two, 3).unwrap();
    assert_eq!((r1.gpus(), r2.gpus()), (1, 2));
    let (p1, p2) = (r1.memory_plan().clone(), r2.memory_plan().clone());
    assert!(p2.weight_bytes < p1.weight_bytes / 2 + (1 << 20));
    assert!(p2.kv_blocks > 2 * p1.kv_blocks);
    assert_eq!(r2.telemetry().kv_blocks_total, p2.kv_blocks);
    assert_eq!(p2.replica_claim_bytes(), 2 * p2.total_claim_bytes);
    assert!(p2.total_claim_bytes <= d.memory_bytes);

    let (t1, t2) = (r1.begin_load(0.0).unwrap(), r2.begin_load(0.0).unwrap());
    let shard_read =
        switchyard_emulator::load_time_of(&d, p2.weight_bytes, switchyard_emulator::WeightSource::PageCache);
    assert_eq!(t2, shard_read);
    assert!(t2 < t1);
    // Per GPU: each of the two GPUs holds the whole per-GPU claim while loading and awake.
    assert_eq!(r2.device_memory_in_use(), p2.total_claim_bytes);
    assert!(r1.finish_transition(t1) && r2.finish_transition(t2));
    let start = t1.max(t2);
    for r in [&mut r1, &mut r2] {
        for id in 0..24 {
            r.submit(request(id, 1500, 200, id % 3), start).unwrap();
        }
    }
    let (e1, end1) = drain(&mut r1, start);
    let (e2, end2) = drain(&mut r2, start);
    assert_eq!(finished(&e1).len(), 24);
    let tokens = |e: &[EngineEvent]| {
        let mut f = finished(e);
        f.sort();
        f.iter().map(|&(id, _, out)| (id, out)).collect::<Vec<_>>()
    };
    assert_eq!(tokens(&e1), tokens(&e2));
    assert!(end2 - start < 0.9 * (end1 - start), "TP 2 {:.2} s vs TP 1 {:.2} s", end2 - start, end1 - start);
    // Asleep, each GPU keeps its remainder.
    let asleep = r2.begin_sleep(1, end2).unwrap();
    assert!(r2.finish_transition(asleep));
    assert_eq!(r2.device_memory_in_use(), p2.asleep_bytes);
}
