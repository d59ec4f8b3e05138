//! Gradient-boosted regression trees (squared loss), the learner behind the `gbdt` baseline
//! and the per-operator-class time models of the `graph` estimator.
//!
//! A small histogram learner in the LightGBM style (Ke et al., 2017): features are cut into at
//! most [`BoostParams::bins`] quantile bins once, each tree grows depth-first, the histogram of
//! the larger child is the parent's minus the smaller child's, and leaves are shrunk by an L2
//! term. It is deterministic (no row or feature sampling, ties broken by feature then bin
//! order), single-threaded, and fast enough in an unoptimized build to train the evaluation's
//! folds in seconds. Written here rather than taken from crates.io because the Rust GBDT
//! crates available either sample with an unseeded thread RNG (`gbdt` 0.1) or carry no
//! license and a thread pool (`forust-ml`); determinism is a project rule.
//!
//! Generic numeric code: it knows nothing of operators or devices.

use serde::{Deserialize, Serialize};

/// Hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BoostParams {
    pub trees: usize,
    pub max_depth: usize,
    pub learning_rate: f64,
    /// Fewest training rows in a leaf.
    pub min_leaf: usize,
    /// L2 regularization of leaf values.
    pub lambda: f64,
    /// Most bins per feature (≤ 256).
    pub bins: usize,
}

impl Default for BoostParams {
    fn default() -> Self {
        BoostParams {
            trees: 120,
            max_depth: 5,
            learning_rate: 0.1,
            min_leaf: 8,
            lambda: 1.0,
            bins: 64,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum Node {
    Split {
        feature: u16,
        threshold: f64,
        left: u32,
        right: u32,
    },
    Leaf(f64),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Tree {
    nodes: Vec<Node>,
}

impl Tree {
    fn predict(&self, x: &[f64]) -> f64 {
        let mut i = 0usize;
        loop {
            match self.nodes.get(i) {
                Some(Node::Split {
                    feature,
                    threshold,
                    left,
                    right,
                }) => {
                    let v = x.get(*feature as usize).copied().unwrap_or(0.0);
                    i = if v <= *threshold { *left } else { *right } as usize;
                }
                Some(Node::Leaf(v)) => return *v,
                None => return 0.0,
            }
        }
    }
}

/// A trained ensemble.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BoostedTrees {
    features: usize,
    base: f64,
    learning_rate: f64,
    trees: Vec<Tree>,
}

/// Why training could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FitError {
    NoRows,
    ShapeMismatch,
    NotFinite,
}

impl std::fmt::Display for FitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FitError::NoRows => write!(f, "no training rows"),
            FitError::ShapeMismatch => write!(f, "feature matrix and targets disagree in length"),
            FitError::NotFinite => write!(f, "a feature or target is not finite"),
        }
    }
}

/// Per-feature cut points; bin `b` holds values `v` with `cuts[b-1] < v <= cuts[b]`. Cuts lie
/// midway between distinct neighbouring values: between every pair when there are at most
/// `bins` distinct values, else where the running count crosses the next `n / bins` quantile,
/// so that a feature with few distinct values (a layer count) is still fully splittable.
fn cut_points(values: &mut [f64], bins: usize) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    // Distinct values with the count of rows up to and including each.
    let mut distinct: Vec<(f64, usize)> = Vec::new();
    for (i, &v) in values.iter().enumerate() {
        match distinct.last_mut() {
            Some(last) if last.0 == v => last.1 = i + 1,
            _ => distinct.push((v, i + 1)),
        }
    }
    let mut cuts = Vec::new();
    let mut next_quantile = 1;
    for pair in distinct.windows(2) {
        let (lo, seen) = pair[0];
        let hi = pair[1].0;
        if distinct.len() <= bins || seen * bins >= next_quantile * n {
            cuts.push(0.5 * (lo + hi));
            while next_quantile * n <= seen * bins {
                next_quantile += 1;
            }
        }
    }
    cuts
}

fn bin_of(cuts: &[f64], v: f64) -> u8 {
    cuts.partition_point(|&c| c < v) as u8
}

/// Training state. Bins are stored column-major (`binned[f * n + row]`) and histograms flat
/// (`[f * width + bin]`), which keeps the inner loops to plain slice walks.
struct Trainer<'a> {
    n: usize,
    features: usize,
    /// Histogram slots per feature (most cuts + 1).
    width: usize,
    binned: Vec<u8>,
    cuts: &'a [Vec<f64>],
    params: BoostParams,
}

/// Gradient sums and row counts per (feature, bin).
struct Hist {
    grad: Vec<f64>,
    count: Vec<u32>,
}

impl Trainer<'_> {
    fn histogram(&self, rows: &[u32], grad: &[f64]) -> Hist {
        let mut h = Hist {
            grad: vec![0.0; self.features * self.width],
            count: vec![0; self.features * self.width],
        };
        for f in 0..self.features {
            let col = &self.binned[f * self.n..(f + 1) * self.n];
            let hg = &mut h.grad[f * self.width..(f + 1) * self.width];
            let hc = &mut h.count[f * self.width..(f + 1) * self.width];
            for &r in rows {
                let b = col[r as usize] as usize;
                hg[b] += grad[r as usize];
                hc[b] += 1;
            }
        }
        h
    }

    /// Best (feature, bin) split of a node, if any beats not splitting.
    fn best_split(&self, hist: &Hist, sum: f64, count: u32) -> Option<(usize, usize)> {
        let lambda = self.params.lambda;
        let min_leaf = self.params.min_leaf as u32;
        let parent = sum * sum / (f64::from(count) + lambda);
        let mut best: Option<(f64, usize, usize)> = None;
        for f in 0..self.features {
            let (mut gl, mut nl) = (0.0, 0u32);
            for b in 0..self.cuts[f].len() {
                gl += hist.grad[f * self.width + b];
                nl += hist.count[f * self.width + b];
                let nr = count - nl;
                if nl < min_leaf || nr < min_leaf {
                    continue;
                }
                let gr = sum - gl;
                let gain = gl * gl / (f64::from(nl) + lambda) + gr * gr / (f64::from(nr) + lambda)
                    - parent;
                if gain > 1e-12 && best.is_none_or(|(bg, _, _)| gain > bg) {
                    best = Some((gain, f, b));
                }
            }
        }
        best.map(|(_, f, b)| (f, b))
    }

    /// Grow the subtree of `rows` (whose histogram is `hist`), adding its leaves' shrunk values
    /// to `pred` as it goes. Returns the subtree's root index.
    fn grow(
        &self,
        nodes: &mut Vec<Node>,
        rows: &mut [u32],
        hist: Hist,
        grad: &[f64],
        pred: &mut [f64],
        depth: usize,
    ) -> u32 {
        let id = nodes.len() as u32;
        let count = rows.len() as u32;
        let sum: f64 = hist.grad[..self.width].iter().sum();
        let split = if depth >= self.params.max_depth || rows.len() < 2 * self.params.min_leaf {
            None
        } else {
            self.best_split(&hist, sum, count)
        };
        let Some((f, b)) = split else {
            let leaf = sum / (f64::from(count) + self.params.lambda);
            nodes.push(Node::Leaf(leaf));
            for &r in rows.iter() {
                pred[r as usize] += self.params.learning_rate * leaf;
            }
            return id;
        };
        nodes.push(Node::Leaf(0.0));
        // Partition rows: bins ≤ b go left.
        let col = &self.binned[f * self.n..(f + 1) * self.n];
        let mut split = 0;
        for i in 0..rows.len() {
            if col[rows[i] as usize] as usize <= b {
                rows.swap(i, split);
                split += 1;
            }
        }
        let (left_rows, right_rows) = rows.split_at_mut(split);
        let small_is_left = left_rows.len() <= right_rows.len();
        let small_hist = self.histogram(if small_is_left { left_rows } else { right_rows }, grad);
        let large_hist = Hist {
            grad: hist
                .grad
                .iter()
                .zip(&small_hist.grad)
                .map(|(p, s)| p - s)
                .collect(),
            count: hist
                .count
                .iter()
                .zip(&small_hist.count)
                .map(|(p, s)| p - s)
                .collect(),
        };
        let (lh, rh) = if small_is_left {
            (small_hist, large_hist)
        } else {
            (large_hist, small_hist)
        };
        let left = self.grow(nodes, left_rows, lh, grad, pred, depth + 1);
        let right = self.grow(nodes, right_rows, rh, grad, pred, depth + 1);
        nodes[id as usize] = Node::Split {
            feature: f as u16,
            threshold: self.cuts[f][b],
            left,
            right,
        };
        id
    }
}

impl BoostedTrees {
    /// Fit `y ≈ f(x)` where `x` is row-major with `features` columns.
    pub fn fit(
        x: &[f64],
        features: usize,
        y: &[f64],
        params: BoostParams,
    ) -> Result<Self, FitError> {
        let n = y.len();
        if n == 0 || features == 0 {
            return Err(FitError::NoRows);
        }
        if x.len() != n * features {
            return Err(FitError::ShapeMismatch);
        }
        if x.iter().chain(y).any(|v| !v.is_finite()) {
            return Err(FitError::NotFinite);
        }
        let bins = params.bins.clamp(2, 256);
        let cuts: Vec<Vec<f64>> = (0..features)
            .map(|f| {
                let mut col: Vec<f64> = (0..n).map(|r| x[r * features + f]).collect();
                cut_points(&mut col, bins)
            })
            .collect();
        let mut binned = Vec::with_capacity(features * n);
        for (f, c) in cuts.iter().enumerate() {
            binned.extend((0..n).map(|r| bin_of(c, x[r * features + f])));
        }
        let base = y.iter().sum::<f64>() / n as f64;
        let mut pred = vec![base; n];
        let trainer = Trainer {
            n,
            features,
            width: cuts.iter().map(Vec::len).max().unwrap_or(0) + 1,
            binned,
            cuts: &cuts,
            params,
        };
        let mut trees = Vec::with_capacity(params.trees);
        let mut grad = vec![0.0; n];
        let mut rows: Vec<u32> = (0..n as u32).collect();
        for _ in 0..params.trees {
            for i in 0..n {
                grad[i] = y[i] - pred[i];
            }
            let hist = trainer.histogram(&rows, &grad);
            let mut nodes = Vec::new();
            trainer.grow(&mut nodes, &mut rows, hist, &grad, &mut pred, 0);
            trees.push(Tree { nodes });
        }
        Ok(BoostedTrees {
            features,
            base,
            learning_rate: params.learning_rate,
            trees,
        })
    }

    /// Predict one row (missing trailing features read as 0).
    pub fn predict(&self, x: &[f64]) -> f64 {
        self.base + self.learning_rate * self.trees.iter().map(|t| t.predict(x)).sum::<f64>()
    }

    /// Number of features the model was trained on.
    pub fn features(&self) -> usize {
        self.features
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn learns_a_step_and_a_slope() {
        let mut x = Vec::new();
        let mut y = Vec::new();
        for i in 0..400 {
            let a = i as f64 / 400.0;
            let b = ((i * 7) % 400) as f64 / 400.0;
            x.extend([a, b]);
            y.push(if a > 0.5 { 3.0 } else { 1.0 } + 2.0 * b);
        }
        let m = BoostedTrees::fit(&x, 2, &y, BoostParams::default()).unwrap();
        let mse: f64 = (0..400)
            .map(|i| (m.predict(&x[2 * i..2 * i + 2]) - y[i]).powi(2))
            .sum::<f64>()
            / 400.0;
        assert!(mse < 0.01, "{mse}");
        assert!((m.predict(&[0.9, 0.25]) - 3.5).abs() < 0.15);
        assert!((m.predict(&[0.1, 0.25]) - 1.5).abs() < 0.15);
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(
            BoostedTrees::fit(&[], 1, &[], BoostParams::default()),
            Err(FitError::NoRows)
        );
        assert_eq!(
            BoostedTrees::fit(&[1.0, 2.0], 1, &[1.0], BoostParams::default()),
            Err(FitError::ShapeMismatch)
        );
        assert_eq!(
            BoostedTrees::fit(&[f64::NAN], 1, &[1.0], BoostParams::default()),
            Err(FitError::NotFinite)
        );
    }

    #[test]
    fn few_distinct_values_get_every_cut() {
        // 10,000 rows of four values in unequal blocks: every boundary must be cut.
        let mut v: Vec<f64> = (0..10_000)
            .map(|i| [1.0, 2.0, 4.0, 8.0][(i * i / 7) % 4])
            .collect();
        assert_eq!(cut_points(&mut v, 64), vec![1.5, 3.0, 6.0]);
        // Many distinct values: at most `bins - 1` cuts.
        let mut w: Vec<f64> = (0..10_000).map(f64::from).collect();
        let cuts = cut_points(&mut w, 64);
        assert!(cuts.len() <= 63 && cuts.len() >= 60, "{}", cuts.len());
    }

    #[test]
    fn cut_points_separate_distinct_values_only() {
        let mut v = vec![1.0, 1.0, 1.0, 2.0, 2.0, 3.0];
        let cuts = cut_points(&mut v, 64);
        assert_eq!(cuts, vec![1.5, 2.5]);
        assert_eq!(bin_of(&cuts, 1.0), 0);
        assert_eq!(bin_of(&cuts, 2.0), 1);
        assert_eq!(bin_of(&cuts, 3.0), 2);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        /// Every boosting step moves each leaf a fraction of the way to its optimum, so the
        /// training error never exceeds that of the constant (mean) model.
        #[test]
        fn training_error_never_exceeds_the_variance(ys in proptest::collection::vec(-5.0f64..5.0, 20..60)) {
            let x: Vec<f64> = (0..ys.len()).map(|i| ((i * 13) % 17) as f64).collect();
            let m = BoostedTrees::fit(&x, 1, &ys, BoostParams { trees: 30, ..BoostParams::default() }).unwrap();
            let mean = ys.iter().sum::<f64>() / ys.len() as f64;
            let var: f64 = ys.iter().map(|y| (y - mean).powi(2)).sum();
            let sse: f64 = ys.iter().enumerate().map(|(i, y)| (m.predict(&[x[i]]) - y).powi(2)).sum();
            prop_assert!(sse <= var + 1e-9, "{} > {}", sse, var);
        }

        /// Training is deterministic.
        #[test]
        fn same_data_same_model(ys in proptest::collection::vec(-5.0f64..5.0, 20..40)) {
            let x: Vec<f64> = (0..ys.len()).map(|i| (i * 3 % 7) as f64).collect();
            let p = BoostParams { trees: 10, ..BoostParams::default() };
            prop_assert_eq!(BoostedTrees::fit(&x, 1, &ys, p).unwrap(), BoostedTrees::fit(&x, 1, &ys, p).unwrap());
        }
    }
}
