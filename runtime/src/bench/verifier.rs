//! `switchyard bench verifier`: ORACLE's verifier selection (paper 002 §4.2.1, Appendix B.3) on
//! held-out tasks from the shipped datasets, and the cost of the router's per-request work.
//!
//! Tasks and their verifiers: GSM8K questions → `exact_answer`, MBPP task statements →
//! `tests_pass`, QMSum queries (specific and general) → `rouge`. Two mixes:
//! - **plain**: the texts as the datasets have them. A keyword separates them (297 of MBPP's 427
//!   statements begin "Write a function", 124 "Write a python function"), so this mix says
//!   little about the classifier;
//! - **confusable**: the cues a keyword rule would use are removed — MBPP's "Write a (python)
//!   function to" lead-in, the words `python`, `function`, `list`, `string`, `tuple`, `array`,
//!   `dictionary`; GSM8K's numbers; QMSum's `meeting`, `discuss`/`discussed`/`discussion`,
//!   `summarize`/`summarise` — and every task is cut to its last sentence (GSM8K's question, not
//!   its story). What is left are short imperative or interrogative clauses about quantities
//!   and things, which overlap across the three.
//!
//! Per repetition (seeded), k = 5 exemplars per verifier are drawn, the IDF is fitted on them,
//! and every other task of the mix is classified by nearest prototype; accuracy is the share
//! classified to its own verifier. Also timed (wall clock, this process, nothing asserted): the
//! embedding of a request's first 4 KiB, and a routing decision given the embedding — the
//! context (verifier + 16 principal components) and the LinUCB index of three models.
//!
//! Depends on the router's parts in `planner::routing` (embedding, LinUCB, router) and reads the
//! dataset files; must not depend on the simulator, the shells (`exec`, `sim`, `live`), the
//! emulator or the rest of `bench`: it measures the router's parts alone, outside any run.

use std::path::Path;
use std::time::Instant;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use crate::planner::routing::embed::{COMPONENTS, EXEMPLARS, Pca, VerifierSelector, Vocabulary};
use crate::planner::routing::linucb::{ALPHA_UCB, LinUcb};
use crate::planner::routing::router::{Router, learner_context};

/// The verifiers of the shipped datasets, in report order.
pub const VERIFIERS: [&str; 3] = ["exact_answer", "tests_pass", "rouge"];

/// What can go wrong reading the datasets.
#[derive(Debug, thiserror::Error)]
pub enum VerifierBenchError {
    #[error("{path}: {reason}")]
    Dataset { path: String, reason: String },
    #[error("the routing learner: {0}")]
    Learner(String),
}

/// One labelled task.
#[derive(Debug, Clone)]
pub struct Task {
    pub verifier: usize,
    pub text: String,
}

/// Read the shipped datasets under `datasets` (the repository's `workflows/datasets`).
pub fn load_tasks(datasets: &Path) -> Result<Vec<Task>, VerifierBenchError> {
    let read = |rel: &str| {
        let path = datasets.join(rel);
        std::fs::read_to_string(&path)
            .map_err(|e| VerifierBenchError::Dataset { path: path.display().to_string(), reason: e.to_string() })
    };
    let bad = |rel: &str, reason: String| VerifierBenchError::Dataset { path: datasets.join(rel).display().to_string(), reason };
    let mut tasks = Vec::new();
    for (n, line) in read("gsm8k/test.jsonl")?.lines().enumerate() {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad("gsm8k/test.jsonl", format!("line {}: {e}", n + 1)))?;
        if let Some(q) = v.get("question").and_then(|q| q.as_str()) {
            tasks.push(Task { verifier: 0, text: q.to_string() });
        }
    }
    let mbpp: serde_json::Value = serde_json::from_str(&read("mbpp/sanitized-mbpp.json")?)
        .map_err(|e| bad("mbpp/sanitized-mbpp.json", e.to_string()))?;
    for t in mbpp.as_array().into_iter().flatten() {
        if let Some(p) = t.get("prompt").and_then(|p| p.as_str()) {
            tasks.push(Task { verifier: 1, text: p.to_string() });
        }
    }
    for (n, line) in read("qmsum/test.jsonl")?.lines().enumerate() {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad("qmsum/test.jsonl", format!("line {}: {e}", n + 1)))?;
        for list in ["specific_query_list", "general_query_list"] {
            for q in v.get(list).and_then(|l| l.as_array()).into_iter().flatten() {
                if let Some(text) = q.get("query").and_then(|t| t.as_str()) {
                    tasks.push(Task { verifier: 2, text: text.to_string() });
                }
            }
        }
    }
    Ok(tasks)
}

/// The confusable form of a task (see the module's doc): cues removed, last sentence kept.
pub fn confusable(text: &str) -> String {
    let sentences: Vec<&str> = text.split_inclusive(['.', '?', '!']).map(str::trim).filter(|s| !s.is_empty()).collect();
    let last = sentences.last().copied().unwrap_or(text);
    let mut s = last.to_string();
    for lead in ["Write a python function to ", "Write a function to ", "Write a python function that ", "Write a function that "] {
        if let Some(rest) = s.strip_prefix(lead) {
            s = rest.to_string();
        }
    }
    const CUES: [&str; 13] = [
        "python", "function", "list", "string", "tuple", "array", "dictionary", "meeting", "discuss", "discussed",
        "discussion", "summarize", "summarise",
    ];
    s.split_whitespace()
        .filter(|w| {
            let bare: String = w.chars().filter(|c| c.is_alphanumeric()).collect::<String>().to_lowercase();
            !CUES.contains(&bare.as_str()) && !bare.chars().any(|c| c.is_ascii_digit())
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The tasks with duplicate texts removed (the first kept): a held-out task must not be a copy
/// of an exemplar (27 of QMSum's 281 queries read "Summarize the whole meeting.", and cutting
/// GSM8K to its question repeats some).
fn distinct(tasks: Vec<Task>) -> Vec<Task> {
    let mut seen = std::collections::BTreeSet::new();
    tasks.into_iter().filter(|t| seen.insert(t.text.to_lowercase())).collect()
}

/// One mix's result over the repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct MixResult {
    pub mix: String,
    pub tasks_per_verifier: [usize; 3],
    /// Accuracy per repetition.
    pub accuracy: Vec<f64>,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    /// confusion[true][predicted], summed over the repetitions.
    pub confusion: [[u64; 3]; 3],
    /// Per verifier: the share of its held-out tasks classified to it (from `confusion`), and
    /// their mean (each verifier weighs the same, whatever its task count).
    pub by_verifier: [f64; 3],
    pub macro_mean: f64,
}

/// Wall-clock costs per request (µs), this process.
#[derive(Debug, Clone, Serialize)]
pub struct Costs {
    pub embed_p50_us: f64,
    pub embed_p99_us: f64,
    pub route_p50_us: f64,
    pub route_p99_us: f64,
    pub requests: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifierReport {
    pub seed: u64,
    pub repetitions: usize,
    pub exemplars: usize,
    pub mixes: Vec<MixResult>,
    pub costs: Costs,
}

fn classify_mix(name: &str, tasks: &[Task], seed: u64, repetitions: usize) -> MixResult {
    let mut by: [Vec<&Task>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for t in tasks {
        by[t.verifier].push(t);
    }
    let mut accuracy = Vec::with_capacity(repetitions);
    let mut confusion = [[0u64; 3]; 3];
    for r in 0..repetitions {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed.wrapping_add(r as u64));
        let mut exemplars: Vec<(&str, &str)> = Vec::new();
        let mut held: Vec<&Task> = Vec::new();
        for (v, group) in by.iter().enumerate() {
            let mut g = group.clone();
            g.shuffle(&mut rng);
            let k = EXEMPLARS.min(g.len());
            exemplars.extend(g[..k].iter().map(|t| (VERIFIERS[v], t.text.as_str())));
            held.extend_from_slice(&g[k..]);
        }
        let texts: Vec<&str> = exemplars.iter().map(|e| e.1).collect();
        let vocab = Vocabulary::fit(&texts);
        let sel = VerifierSelector::fit(&vocab, &exemplars);
        let mut right = 0usize;
        for t in &held {
            let picked = sel.select(&vocab.embed(&t.text)).map(|p| p.0).unwrap_or(VERIFIERS[0]);
            let p = VERIFIERS.iter().position(|v| *v == picked).unwrap_or(0);
            confusion[t.verifier][p] += 1;
            right += usize::from(p == t.verifier);
        }
        accuracy.push(right as f64 / held.len().max(1) as f64);
    }
    let mean = accuracy.iter().sum::<f64>() / accuracy.len().max(1) as f64;
    let min = accuracy.iter().copied().fold(f64::INFINITY, f64::min);
    let max = accuracy.iter().copied().fold(0.0, f64::max);
    let mut by_verifier = [0.0; 3];
    for (v, row) in confusion.iter().enumerate() {
        let n: u64 = row.iter().sum();
        by_verifier[v] = if n > 0 { row[v] as f64 / n as f64 } else { 0.0 };
    }
    let macro_mean = by_verifier.iter().sum::<f64>() / 3.0;
    MixResult {
        mix: name.into(),
        tasks_per_verifier: [by[0].len(), by[1].len(), by[2].len()],
        accuracy,
        mean,
        min,
        max,
        confusion,
        by_verifier,
        macro_mean,
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let k = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[k]
}

/// Time the embedding and a routing decision over `tasks` (the plain texts).
fn costs(tasks: &[Task], seed: u64) -> Result<Costs, VerifierBenchError> {
    let texts: Vec<&str> = tasks.iter().map(|t| t.text.as_str()).collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut sample: Vec<&str> = texts.clone();
    sample.shuffle(&mut rng);
    sample.truncate(2_000);
    let vocab = Vocabulary::fit(&sample);
    let points: Vec<_> = sample.iter().take(500).map(|t| vocab.embed(t)).collect();
    let pca = Pca::fit(&points, COMPONENTS);
    let exemplars: Vec<(&str, &str)> = VERIFIERS.iter().enumerate().flat_map(|(v, name)| {
        tasks.iter().filter(move |t| t.verifier == v).take(EXEMPLARS).map(move |t| (*name, t.text.as_str()))
    }).collect();
    let sel = VerifierSelector::fit(&vocab, &exemplars);
    let dim = Router::context_dim(VERIFIERS.len(), pca.len());
    let mut learner =
        LinUcb::new(3, dim, ALPHA_UCB, true).map_err(|e| VerifierBenchError::Learner(e.to_string()))?;
    let mut embed_us = Vec::with_capacity(sample.len());
    let mut route_us = Vec::with_capacity(sample.len());
    for (p, t) in sample.iter().enumerate() {
        let start = Instant::now();
        let e = vocab.embed(t);
        embed_us.push(start.elapsed().as_secs_f64() * 1e6);
        let start = Instant::now();
        let (_, x) = learner_context(&sel, &pca, &e);
        let decided = learner.decide(p as u64, &x);
        route_us.push(start.elapsed().as_secs_f64() * 1e6);
        if decided.is_ok() {
            let _ = learner.land(p as u64, if p % 3 == 0 { 1.0 } else { 0.0 });
        }
    }
    Ok(Costs {
        embed_p50_us: percentile(&mut embed_us.clone(), 0.5),
        embed_p99_us: percentile(&mut embed_us, 0.99),
        route_p50_us: percentile(&mut route_us.clone(), 0.5),
        route_p99_us: percentile(&mut route_us, 0.99),
        requests: sample.len(),
    })
}

/// Run the bench on the datasets under `datasets`.
pub fn run(datasets: &Path, seed: u64, repetitions: usize) -> Result<VerifierReport, VerifierBenchError> {
    let tasks = load_tasks(datasets)?;
    let hard: Vec<Task> = tasks
        .iter()
        .map(|t| Task { verifier: t.verifier, text: confusable(&t.text) })
        .filter(|t| !t.text.trim().is_empty())
        .collect();
    let mixes = vec![
        classify_mix("plain", &distinct(tasks.clone()), seed, repetitions),
        classify_mix("confusable", &distinct(hard), seed, repetitions),
    ];
    Ok(VerifierReport { seed, repetitions, exemplars: EXEMPLARS, mixes, costs: costs(&tasks, seed)? })
}

impl VerifierReport {
    /// The report in Markdown, headed by the command that made it.
    pub fn markdown(&self, command: &str) -> String {
        let mut out = format!(
            "# Verifier selection (paper 002, Appendix B.3)\n\n`{command}` — nearest prototype over k = {} exemplars per verifier, hashed word/bigram TF-IDF (no neural embedding), {} seeded repetitions (seed {}). Paper: 97–99 % on held-out tasks with bge-m3.\n\n",
            self.exemplars, self.repetitions, self.seed
        );
        out.push_str("Distinct texts only (a held-out task is never a copy of an exemplar). Accuracy: over all held-out tasks (mean, min, max over the repetitions); per verifier; and their unweighted mean (GSM8K has most of the tasks).\n\n");
        out.push_str("| mix | tasks (exact_answer / tests_pass / rouge) | accuracy mean | min | max | exact_answer | tests_pass | rouge | per-verifier mean |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
        for m in &self.mixes {
            out.push_str(&format!(
                "| {} | {} / {} / {} | {:.1} % | {:.1} % | {:.1} % | {:.1} % | {:.1} % | {:.1} % | {:.1} % |\n",
                m.mix,
                m.tasks_per_verifier[0],
                m.tasks_per_verifier[1],
                m.tasks_per_verifier[2],
                100.0 * m.mean,
                100.0 * m.min,
                100.0 * m.max,
                100.0 * m.by_verifier[0],
                100.0 * m.by_verifier[1],
                100.0 * m.by_verifier[2],
                100.0 * m.macro_mean
            ));
        }
        for m in &self.mixes {
            out.push_str(&format!("\nConfusion, {} (rows: true verifier, columns: chosen; summed over repetitions)\n\n| | exact_answer | tests_pass | rouge |\n|---|---:|---:|---:|\n", m.mix));
            for (v, row) in m.confusion.iter().enumerate() {
                out.push_str(&format!("| {} | {} | {} | {} |\n", VERIFIERS[v], row[0], row[1], row[2]));
            }
        }
        let c = &self.costs;
        out.push_str(&format!(
            "\nPer request (wall clock, this process, {} requests): embedding of the first 4 KiB p50 {:.1} µs, p99 {:.1} µs; routing decision given the embedding (verifier, context with 16 principal components, LinUCB over 3 models, the pending decision recorded) p50 {:.1} µs, p99 {:.1} µs.\n",
            c.requests, c.embed_p50_us, c.embed_p99_us, c.route_p50_us, c.route_p99_us
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_confusable_form_drops_the_cues_and_keeps_the_last_sentence() {
        assert_eq!(confusable("Write a python function to reverse a given string."), "reverse a given");
        assert_eq!(
            confusable("Tom has 5 apples. He buys 3 more. How many apples does Tom have?"),
            "How many apples does Tom have?"
        );
        assert_eq!(confusable("Summarize the whole meeting."), "the whole");
    }
}
