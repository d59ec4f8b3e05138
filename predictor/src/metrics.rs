//! The fidelity metrics of paper 003 §4.4: WAPE, ordering accuracy and window fit.
//!
//! - WAPE: `Σ|predicted − measured| / Σ measured`.
//! - Ordering: over all pairs of configurations whose measurements differ, the fraction on
//!   which prediction and measurement agree about which is faster (a predicted tie counts as
//!   disagreement). Counted in `O(n log n)` with a Fenwick tree.
//! - Window fit: the fraction of configurations on which prediction and measurement agree
//!   whether it finishes within the window (the median measured run time of the set).
//!
//! Counts are returned as well as fractions so that folds can be pooled. Pure functions: this
//! module must not depend on any other module of the crate, the emulator or the runtime.

use serde::{Deserialize, Serialize};

/// Additive counts behind the three metrics, so folds can be pooled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Tally {
    pub configurations: u64,
    pub abs_error: f64,
    pub measured: f64,
    pub pairs: u64,
    pub pairs_agreeing: u64,
    pub window_agreeing: u64,
}

impl Tally {
    /// Score one set of predictions against its measurements; the window is the median of
    /// `measured`.
    pub fn score(predicted: &[f64], measured: &[f64]) -> Tally {
        let n = predicted.len().min(measured.len());
        let (predicted, measured) = (&predicted[..n], &measured[..n]);
        let window = median(measured);
        let (pairs_agreeing, pairs) = ordering_counts(predicted, measured);
        Tally {
            configurations: n as u64,
            abs_error: predicted
                .iter()
                .zip(measured)
                .map(|(p, m)| (p - m).abs())
                .sum(),
            measured: measured.iter().sum(),
            pairs,
            pairs_agreeing,
            window_agreeing: window_counts(predicted, measured, window),
        }
    }

    /// Pool two tallies.
    pub fn merge(&mut self, other: &Tally) {
        self.configurations += other.configurations;
        self.abs_error += other.abs_error;
        self.measured += other.measured;
        self.pairs += other.pairs;
        self.pairs_agreeing += other.pairs_agreeing;
        self.window_agreeing += other.window_agreeing;
    }

    pub fn wape(&self) -> f64 {
        if self.measured > 0.0 {
            self.abs_error / self.measured
        } else {
            0.0
        }
    }

    pub fn ordering(&self) -> f64 {
        if self.pairs > 0 {
            self.pairs_agreeing as f64 / self.pairs as f64
        } else {
            1.0
        }
    }

    pub fn window_fit(&self) -> f64 {
        if self.configurations > 0 {
            self.window_agreeing as f64 / self.configurations as f64
        } else {
            1.0
        }
    }
}

/// WAPE of `predicted` against `measured`.
pub fn wape(predicted: &[f64], measured: &[f64]) -> f64 {
    Tally::score(predicted, measured).wape()
}

/// Ordering accuracy of `predicted` against `measured`.
pub fn ordering_accuracy(predicted: &[f64], measured: &[f64]) -> f64 {
    Tally::score(predicted, measured).ordering()
}

/// Window-fit accuracy with an explicit `window`.
pub fn window_fit(predicted: &[f64], measured: &[f64], window: f64) -> f64 {
    let n = predicted.len().min(measured.len());
    if n == 0 {
        return 1.0;
    }
    window_counts(&predicted[..n], &measured[..n], window) as f64 / n as f64
}

/// Median (mean of the two middle values for an even count; 0 for none).
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

fn window_counts(predicted: &[f64], measured: &[f64], window: f64) -> u64 {
    predicted
        .iter()
        .zip(measured)
        .filter(|(p, m)| (**p <= window) == (**m <= window))
        .count() as u64
}

/// (agreeing pairs, comparable pairs).
fn ordering_counts(predicted: &[f64], measured: &[f64]) -> (u64, u64) {
    let n = predicted.len();
    let mut ranks: Vec<f64> = predicted.to_vec();
    ranks.sort_by(f64::total_cmp);
    ranks.dedup();
    let rank = |p: f64| ranks.partition_point(|&r| r < p);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| measured[a].total_cmp(&measured[b]));
    let mut tree = vec![0u64; ranks.len() + 1];
    let (mut agree, mut pairs, mut inserted) = (0u64, 0u64, 0u64);
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j < n && measured[order[j]] == measured[order[i]] {
            j += 1;
        }
        for &k in &order[i..j] {
            // Earlier (strictly faster measured) items predicted strictly faster.
            let mut idx = rank(predicted[k]);
            let mut below = 0;
            while idx > 0 {
                below += tree[idx];
                idx &= idx - 1;
            }
            agree += below;
            pairs += inserted;
        }
        for &k in &order[i..j] {
            let mut idx = rank(predicted[k]) + 1;
            while idx < tree.len() {
                tree[idx] += 1;
                idx += idx & idx.wrapping_neg();
            }
            inserted += 1;
        }
        i = j;
    }
    (agree, pairs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wape_by_hand() {
        assert!((wape(&[1.0, 3.0], &[2.0, 2.0]) - 0.5).abs() < 1e-12);
        assert_eq!(wape(&[5.0], &[5.0]), 0.0);
    }

    #[test]
    fn ordering_by_hand() {
        // Pairs: (a,b) agree, (a,c) disagree, (b,c) agree → 2/3.
        let m = [1.0, 2.0, 3.0];
        let p = [2.0, 1.5, 3.0];
        // a<b measured, predicted 2.0 > 1.5: disagree; a<c: 2<3 agree; b<c: agree.
        assert!((ordering_accuracy(&p, &m) - 2.0 / 3.0).abs() < 1e-12);
        // Measured ties are not comparable; predicted ties disagree.
        let (agree, pairs) = ordering_counts(&[1.0, 1.0, 2.0], &[1.0, 2.0, 2.0]);
        assert_eq!(pairs, 2);
        assert_eq!(agree, 1);
    }

    #[test]
    fn window_fit_by_hand() {
        assert_eq!(
            window_fit(&[1.0, 3.0, 1.0], &[1.0, 1.0, 3.0], 2.0),
            1.0 / 3.0
        );
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
    }

    fn brute(p: &[f64], m: &[f64]) -> (u64, u64) {
        let (mut a, mut n) = (0, 0);
        for i in 0..p.len() {
            for j in 0..p.len() {
                if m[i] < m[j] {
                    n += 1;
                    if p[i] < p[j] {
                        a += 1;
                    }
                }
            }
        }
        (a, n)
    }

    proptest! {
        #[test]
        fn fenwick_ordering_equals_brute_force(
            v in proptest::collection::vec((0u8..6, 0u8..6), 0..40)
        ) {
            let p: Vec<f64> = v.iter().map(|x| f64::from(x.0)).collect();
            let m: Vec<f64> = v.iter().map(|x| f64::from(x.1)).collect();
            prop_assert_eq!(ordering_counts(&p, &m), brute(&p, &m));
        }

        #[test]
        fn perfect_predictions_score_perfectly(m in proptest::collection::vec(0.001f64..10.0, 1..50)) {
            let t = Tally::score(&m, &m);
            prop_assert_eq!(t.wape(), 0.0);
            prop_assert_eq!(t.ordering(), 1.0);
            prop_assert_eq!(t.window_fit(), 1.0);
        }

        #[test]
        fn pooled_tallies_add_up(a in proptest::collection::vec(0.1f64..10.0, 1..20), b in proptest::collection::vec(0.1f64..10.0, 1..20)) {
            let pa: Vec<f64> = a.iter().map(|x| x * 1.1).collect();
            let pb: Vec<f64> = b.iter().map(|x| x * 0.9).collect();
            let mut t = Tally::score(&pa, &a);
            t.merge(&Tally::score(&pb, &b));
            prop_assert_eq!(t.configurations, (a.len() + b.len()) as u64);
            let err: f64 = pa.iter().zip(&a).chain(pb.iter().zip(&b)).map(|(p, m)| (p - m).abs()).sum();
            let sum: f64 = a.iter().chain(&b).sum();
            prop_assert!((t.wape() - err / sum).abs() < 1e-9);
        }
    }
}
