//! Task embeddings and verifier selection for routing (paper 002 §4.2.1, §5.1, Appendix B.3),
//! offline and without a neural model.
//!
//! The paper embeds a program's initial request with bge-m3; here it must run with no network
//! and no GPU, in microseconds, so the embedding is lexical: **hashed TF-IDF** over the request's
//! first [`PREFIX_BYTES`] bytes — lower-cased word unigrams and word bigrams, each hashed (FNV-1a,
//! stable across platforms and Rust versions) into [`FEATURES`] buckets, sublinear term
//! frequency 1 + ln tf, smoothed IDF ln((1 + N)/(1 + df)) + 1 fitted on a corpus, L2-normalised.
//! Why this and not a small shipped embedding model: it needs no weights in the repository, no
//! inference runtime in the build, and its cost is a few microseconds per request; what it
//! cannot do is see paraphrase — two task types that share vocabulary are confusable to it in a
//! way they may not be to bge-m3 (the verifier-selection accuracy is measured, not assumed).
//!
//! - [`Vocabulary`]: the IDF weights, fitted on a corpus; [`Vocabulary::embed`] a request.
//! - [`Pca`]: the top principal components of a set of embeddings (power iteration with
//!   deflation on the covariance, never materialised: each step is sparse dot products); the
//!   router's context takes [`COMPONENTS`] = 16 of them (§5.1).
//! - [`VerifierSelector`]: the nearest-prototype classifier of Appendix B.3 — one prototype per
//!   verifier, the normalised mean of its k = 5 exemplars' embeddings; a request goes to the
//!   verifier whose prototype has the highest cosine similarity.
//!
//! Pure: deterministic functions of their inputs; no I/O, no randomness, no clock.
//!
//! Must not depend on anything outside `planner` (the core's rule).

use std::collections::BTreeMap;

/// Hash buckets of the embedding.
pub const FEATURES: usize = 1 << 14;
/// Bytes of a request the embedding reads (the head of its prompt, cut at a character boundary).
pub const PREFIX_BYTES: usize = 4096;
/// Principal components in the router's context (paper 002 §5.1).
pub const COMPONENTS: usize = 16;
/// Exemplars per verifier (Appendix B.3).
pub const EXEMPLARS: usize = 5;
/// Power-iteration steps per principal component.
const POWER_STEPS: usize = 60;

/// A sparse vector over the hash buckets: (bucket, value), buckets ascending and distinct.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SparseVec(pub Vec<(u32, f64)>);

impl SparseVec {
    /// Σ self_i · dense_i.
    pub fn dot_dense(&self, dense: &[f64]) -> f64 {
        self.0.iter().map(|&(i, v)| v * dense.get(i as usize).copied().unwrap_or(0.0)).sum()
    }

    /// Σ self_i · other_i (both sparse).
    pub fn dot(&self, other: &SparseVec) -> f64 {
        let (mut i, mut j, mut sum) = (0, 0, 0.0);
        while i < self.0.len() && j < other.0.len() {
            match self.0[i].0.cmp(&other.0[j].0) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
                std::cmp::Ordering::Equal => {
                    sum += self.0[i].1 * other.0[j].1;
                    i += 1;
                    j += 1;
                }
            }
        }
        sum
    }

    pub fn norm(&self) -> f64 {
        self.0.iter().map(|(_, v)| v * v).sum::<f64>().sqrt()
    }

    fn normalized(mut self) -> Self {
        let n = self.norm();
        if n > 0.0 {
            for (_, v) in &mut self.0 {
                *v /= n;
            }
        }
        self
    }
}

/// FNV-1a, 64 bit, over `parts` with a separator byte between them.
pub(crate) fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (k, part) in parts.iter().enumerate() {
        if k > 0 {
            h ^= 0x1f;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        for b in part.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The head of `text` the embedding reads.
pub fn prefix(text: &str) -> &str {
    if text.len() <= PREFIX_BYTES {
        return text;
    }
    let mut end = PREFIX_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Term counts of a request's prefix: lower-cased alphanumeric words and adjacent word pairs,
/// hashed into buckets.
pub fn term_counts(text: &str) -> BTreeMap<u32, u32> {
    let lower = prefix(text).to_lowercase();
    let words: Vec<&str> = lower.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).collect();
    let mut counts = BTreeMap::new();
    let bucket = |h: u64| (h % FEATURES as u64) as u32;
    for (k, w) in words.iter().enumerate() {
        *counts.entry(bucket(fnv1a(&["w", w]))).or_insert(0) += 1;
        if let Some(next) = words.get(k + 1) {
            *counts.entry(bucket(fnv1a(&["b", w, next]))).or_insert(0) += 1;
        }
    }
    counts
}

/// IDF weights over the hash buckets, fitted on a corpus.
#[derive(Debug, Clone, PartialEq)]
pub struct Vocabulary {
    idf: Vec<f64>,
    documents: usize,
}

impl Vocabulary {
    /// Smoothed IDF over `corpus`: ln((1 + N) / (1 + df)) + 1 per bucket.
    pub fn fit<S: AsRef<str>>(corpus: &[S]) -> Self {
        let mut df = vec![0u32; FEATURES];
        for doc in corpus {
            for b in term_counts(doc.as_ref()).keys() {
                df[*b as usize] += 1;
            }
        }
        let n = corpus.len() as f64;
        let idf = df.iter().map(|&d| ((1.0 + n) / (1.0 + f64::from(d))).ln() + 1.0).collect();
        Vocabulary { idf, documents: corpus.len() }
    }

    pub fn documents(&self) -> usize {
        self.documents
    }

    /// The IDF of a bucket.
    pub fn idf(&self, bucket: u32) -> f64 {
        self.idf.get(bucket as usize).copied().unwrap_or(1.0)
    }

    /// The request's embedding: (1 + ln tf)·idf per bucket, L2-normalised.
    pub fn embed(&self, text: &str) -> SparseVec {
        let v = term_counts(text).into_iter().map(|(b, tf)| (b, (1.0 + f64::from(tf).ln()) * self.idf(b))).collect();
        SparseVec(v).normalized()
    }
}

/// Principal components of a set of embeddings.
#[derive(Debug, Clone, PartialEq)]
pub struct Pca {
    mean: Vec<f64>,
    /// Orthonormal components, each dense over the buckets, by decreasing variance.
    components: Vec<Vec<f64>>,
    /// mean · component, per component.
    mean_projection: Vec<f64>,
    /// The variance along each component.
    pub variances: Vec<f64>,
}

impl Pca {
    /// The top `k` principal components of `points` (fewer if the points span fewer
    /// directions), by power iteration on the covariance with deflation. Deterministic: the
    /// start vector is fixed and each component's sign makes its largest entry positive.
    pub fn fit(points: &[SparseVec], k: usize) -> Self {
        let n = points.len().max(1) as f64;
        let mut mean = vec![0.0; FEATURES];
        for p in points {
            for &(i, v) in &p.0 {
                mean[i as usize] += v / n;
            }
        }
        // Buckets any point uses: the covariance is zero elsewhere.
        let mut used: Vec<usize> = points.iter().flat_map(|p| p.0.iter().map(|&(i, _)| i as usize)).collect();
        used.sort_unstable();
        used.dedup();
        let mut components: Vec<Vec<f64>> = Vec::new();
        let mut variances = Vec::new();
        for c in 0..k {
            let mut v = vec![0.0; FEATURES];
            for (r, &i) in used.iter().enumerate() {
                v[i] = 1.0 + ((r * 7 + c * 13) % 11) as f64 / 11.0;
            }
            let mut variance = 0.0;
            for _ in 0..POWER_STEPS {
                deflate(&mut v, &components);
                // C v = (1/N) Σ x (x·v) − μ (μ·v)
                let mut w = vec![0.0; FEATURES];
                for p in points {
                    let s = p.dot_dense(&v) / n;
                    for &(i, x) in &p.0 {
                        w[i as usize] += x * s;
                    }
                }
                let mu_v: f64 = used.iter().map(|&i| mean[i] * v[i]).sum();
                for &i in &used {
                    w[i] -= mean[i] * mu_v;
                }
                deflate(&mut w, &components);
                let norm = w.iter().map(|x| x * x).sum::<f64>().sqrt();
                let v_norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
                if norm <= 1e-12 || v_norm <= 0.0 {
                    variance = 0.0;
                    break;
                }
                variance = norm / v_norm;
                v = w.into_iter().map(|x| x / norm).collect();
            }
            if variance <= 1e-12 {
                break;
            }
            let (_, largest) =
                v.iter().enumerate().fold((0, 0.0f64), |acc, (i, &x)| if x.abs() > acc.1.abs() { (i, x) } else { acc });
            if largest < 0.0 {
                v.iter_mut().for_each(|x| *x = -*x);
            }
            components.push(v);
            variances.push(variance);
        }
        let mean_projection = components.iter().map(|c| c.iter().zip(&mean).map(|(a, b)| a * b).sum()).collect();
        Pca { mean, components, mean_projection, variances }
    }

    pub fn len(&self) -> usize {
        self.components.len()
    }

    pub fn is_empty(&self) -> bool {
        self.components.is_empty()
    }

    /// Coordinates of `v` − mean on the components.
    pub fn project(&self, v: &SparseVec) -> Vec<f64> {
        self.components.iter().zip(&self.mean_projection).map(|(c, m)| v.dot_dense(c) - m).collect()
    }

    /// The dense component `j` (for tests and reports).
    pub fn component(&self, j: usize) -> Option<&[f64]> {
        self.components.get(j).map(Vec::as_slice)
    }

    /// The fitted mean (for tests and reports).
    pub fn mean(&self) -> &[f64] {
        &self.mean
    }
}

/// v ← v − Σ (c·v) c over orthonormal `components`.
fn deflate(v: &mut [f64], components: &[Vec<f64>]) {
    for c in components {
        let d: f64 = c.iter().zip(v.iter()).map(|(a, b)| a * b).sum();
        for (x, y) in v.iter_mut().zip(c) {
            *x -= d * y;
        }
    }
}

/// The nearest-prototype verifier selector (Appendix B.3).
#[derive(Debug, Clone, PartialEq)]
pub struct VerifierSelector {
    /// (verifier, prototype) in the order verifiers first appear among the exemplars.
    prototypes: Vec<(String, SparseVec)>,
}

impl VerifierSelector {
    /// One prototype per verifier: the normalised mean of its exemplars' embeddings.
    pub fn fit<S: AsRef<str>>(vocabulary: &Vocabulary, exemplars: &[(S, S)]) -> Self {
        let mut order: Vec<String> = Vec::new();
        let mut sums: BTreeMap<String, BTreeMap<u32, f64>> = BTreeMap::new();
        for (verifier, text) in exemplars {
            let verifier = verifier.as_ref().to_string();
            if !order.contains(&verifier) {
                order.push(verifier.clone());
            }
            let sum = sums.entry(verifier).or_default();
            for (i, v) in vocabulary.embed(text.as_ref()).0 {
                *sum.entry(i).or_insert(0.0) += v;
            }
        }
        let prototypes = order
            .into_iter()
            .map(|v| {
                let sum = sums.remove(&v).unwrap_or_default();
                (v, SparseVec(sum.into_iter().collect()).normalized())
            })
            .collect();
        VerifierSelector { prototypes }
    }

    pub fn verifiers(&self) -> impl Iterator<Item = &str> {
        self.prototypes.iter().map(|(v, _)| v.as_str())
    }

    /// The verifier for an embedded request and its cosine similarity (the first on ties);
    /// `None` without prototypes.
    pub fn select(&self, embedding: &SparseVec) -> Option<(&str, f64)> {
        let mut best: Option<(&str, f64)> = None;
        for (v, p) in &self.prototypes {
            let s = p.dot(embedding);
            if best.is_none_or(|b| s > b.1) {
                best = Some((v.as_str(), s));
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idf_and_the_embedding_match_a_hand_computation() {
        let corpus = ["alpha beta", "alpha gamma", "delta"];
        let vocab = Vocabulary::fit(&corpus);
        let alpha = *term_counts("alpha").keys().next().unwrap();
        let delta = *term_counts("delta").keys().next().unwrap();
        // df(alpha) = 2, df(delta) = 1, N = 3.
        assert!((vocab.idf(alpha) - ((4.0f64 / 3.0).ln() + 1.0)).abs() < 1e-12);
        assert!((vocab.idf(delta) - (2.0f64.ln() + 1.0)).abs() < 1e-12);
        // "alpha alpha delta": alpha tf 2 → (1 + ln 2)·idf, delta tf 1 → idf, plus the two
        // bigram buckets (unseen: idf ln 4 + 1), normalised.
        let e = vocab.embed("alpha alpha delta");
        assert!((e.norm() - 1.0).abs() < 1e-12);
        let raw_alpha = (1.0 + 2f64.ln()) * vocab.idf(alpha);
        let raw_delta = vocab.idf(delta);
        let unseen = 4f64.ln() + 1.0;
        let norm = (raw_alpha.powi(2) + raw_delta.powi(2) + 2.0 * unseen.powi(2)).sqrt();
        let get = |b: u32| e.0.iter().find(|x| x.0 == b).map(|x| x.1).unwrap();
        assert!((get(alpha) - raw_alpha / norm).abs() < 1e-12);
        assert!((get(delta) - raw_delta / norm).abs() < 1e-12);
        // Case and punctuation do not matter; only the prefix is read.
        assert_eq!(vocab.embed("Alpha, ALPHA! delta."), e);
        let long = "alpha ".repeat(2000);
        assert_eq!(vocab.embed(&long), vocab.embed(&format!("{long} beta gamma delta")));
    }

    #[test]
    fn pca_finds_the_direction_of_largest_variance_first() {
        // Points spread widely along "a" vs "b" and narrowly along "c" vs "d".
        let vocab = Vocabulary::fit(&["a", "b", "c", "d"]);
        let bucket = |w: &str| *term_counts(w).keys().next().unwrap();
        let (a, b, c, d) = (bucket("a"), bucket("b"), bucket("c"), bucket("d"));
        let point = |x: f64, y: f64| {
            let mut v = vec![(a, 1.0 + x), (b, 1.0 - x), (c, 1.0 + y), (d, 1.0 - y)];
            v.sort_by_key(|p| p.0);
            SparseVec(v)
        };
        // A grid, so the two spreads are uncorrelated.
        let mut points = Vec::new();
        for x in [-1.0, -0.5, 0.0, 0.5, 1.0] {
            for y in [-0.1, 0.1] {
                points.push(point(x, y));
            }
        }
        let pca = Pca::fit(&points, 3);
        assert_eq!(pca.len(), 2, "two directions of variance: {:?}", pca.variances);
        let c0 = pca.component(0).unwrap();
        let s = std::f64::consts::FRAC_1_SQRT_2;
        assert!((c0[a as usize].abs() - s).abs() < 1e-6 && (c0[a as usize] + c0[b as usize]).abs() < 1e-9);
        let c1 = pca.component(1).unwrap();
        assert!((c1[c as usize].abs() - s).abs() < 1e-6);
        let dot: f64 = c0.iter().zip(c1).map(|(x, y)| x * y).sum();
        assert!(dot.abs() < 1e-9, "components are orthogonal");
        assert!(pca.variances[0] > pca.variances[1]);
        // The projection of a point is its centred coordinate along each component.
        let p = pca.project(&point(0.5, 0.0));
        assert!((p[0].abs() - 0.5 * 2.0 * s).abs() < 1e-6 && p[1].abs() < 1e-6, "{p:?}");
        // The sign convention: each component's largest entry is positive.
        let largest = c0.iter().fold(0.0f64, |m, &x| if x.abs() > m.abs() { x } else { m });
        assert!(largest > 0.0);
        // Deterministic.
        assert_eq!(Pca::fit(&points, 3), pca);
        let _ = vocab;
    }

    #[test]
    fn the_nearest_prototype_picks_the_verifier_of_the_task_type() {
        let exemplars: Vec<(&str, &str)> = vec![
            ("exact_answer", "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether?"),
            ("exact_answer", "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?"),
            ("exact_answer", "Betty is saving money for a new wallet which costs $100. How much more money does Betty need?"),
            ("exact_answer", "James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?"),
            ("exact_answer", "Albert buys 2 large pizzas and 2 small pizzas. How many pieces does he eat that day?"),
            ("tests_pass", "Write a python function to find the first repeated character in a given string."),
            ("tests_pass", "Write a function to reverse words separated by spaces in a given string."),
            ("tests_pass", "Write a python function to check whether the given number is a prime number."),
            ("tests_pass", "Write a function to find the maximum of a list of integers in python."),
            ("tests_pass", "Write a python function to count the number of set bits of a given number."),
            ("rouge", "Summarize the discussion of the project manager about the remote control design in the meeting."),
            ("rouge", "What did the committee say about the school budget in the meeting transcript?"),
            ("rouge", "Summarize the meeting: the team discussed the user interface and the marketing report."),
            ("rouge", "What was decided about the industrial design of the product in the meeting?"),
            ("rouge", "Summarize what the professor said about the speech recognition experiments in the meeting."),
        ];
        let texts: Vec<&str> = exemplars.iter().map(|e| e.1).collect();
        let vocab = Vocabulary::fit(&texts);
        let sel = VerifierSelector::fit(&vocab, &exemplars);
        assert_eq!(sel.verifiers().collect::<Vec<_>>(), ["exact_answer", "tests_pass", "rouge"]);
        let pick = |t: &str| sel.select(&vocab.embed(t)).unwrap().0.to_string();
        assert_eq!(pick("Write a python function to sort a list of tuples by their second element."), "tests_pass");
        assert_eq!(pick("Tom has 5 apples and buys 3 more. How many apples does Tom have?"), "exact_answer");
        assert_eq!(pick("Summarize what the marketing expert said about the remote in the meeting."), "rouge");
        assert!(VerifierSelector::fit(&vocab, &Vec::<(&str, &str)>::new()).select(&vocab.embed("x")).is_none());
    }
}
