//! Cumulative memory feasibility (paper 003 Eq. 11): at every predicted transition boundary τ
//! on a device, resident and transitional model memory plus the memory of active requests must
//! stay within capacity. A load can fit the final state yet overflow while it runs, because the
//! old state (a replica still being reclaimed, its KV, engine buffers) and the incoming state
//! coexist until the old one is gone. Pure.
//!
//! Part of the pure core: must not depend on anything outside `planner` but `crate::ids` and the
//! predictor crate (the core's rule, checked by `runtime/tests/module_boundaries.rs`).

/// Memory held on a device over `[from, until)` (use `f64::INFINITY` for "until further notice").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Occupancy {
    pub from: f64,
    pub until: f64,
    pub bytes: u64,
}

/// Peak of the summed occupancy, evaluated at every boundary (Eq. 11's τ ∈ T_t).
pub fn peak(occupancy: &[Occupancy]) -> u64 {
    let mut taus: Vec<f64> = occupancy.iter().map(|o| o.from).collect();
    taus.sort_by(f64::total_cmp);
    taus.dedup();
    taus.iter()
        .map(|&t| occupancy.iter().filter(|o| o.from <= t && t < o.until).map(|o| o.bytes).sum::<u64>())
        .max()
        .unwrap_or(0)
}

/// Whether adding `new` to `current` keeps the device within `capacity` at every transition.
pub fn feasible(capacity: u64, current: &[Occupancy], new: Occupancy) -> bool {
    let mut all = current.to_vec();
    all.push(new);
    peak(&all) <= capacity
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_load_that_fits_at_the_end_but_not_during_the_transition_is_rejected() {
        // A 40 GiB device: a 30 GiB replica is being reclaimed and frees its memory at t = 5.
        let current = [Occupancy { from: 0.0, until: 5.0, bytes: 30 * GIB }];
        // A 30 GiB load starting now overlaps the victim's teardown: 60 GiB at t ∈ [0, 5).
        assert!(!feasible(40 * GIB, &current, Occupancy { from: 0.0, until: f64::INFINITY, bytes: 30 * GIB }));
        // The same load ordered after the reclamation fits.
        assert!(feasible(40 * GIB, &current, Occupancy { from: 5.0, until: f64::INFINITY, bytes: 30 * GIB }));
        // And the end state alone (the load without the victim) fits: only the transition fails.
        assert!(feasible(40 * GIB, &[], Occupancy { from: 0.0, until: f64::INFINITY, bytes: 30 * GIB }));
    }

    #[test]
    fn request_memory_counts_while_the_request_runs() {
        let current = [
            Occupancy { from: 0.0, until: f64::INFINITY, bytes: 20 * GIB }, // resident weights
            Occupancy { from: 2.0, until: 8.0, bytes: 10 * GIB },           // an active request's KV
        ];
        assert_eq!(peak(&current), 30 * GIB);
        assert!(!feasible(35 * GIB, &current, Occupancy { from: 7.0, until: 9.0, bytes: 6 * GIB }));
        assert!(feasible(35 * GIB, &current, Occupancy { from: 8.0, until: 9.0, bytes: 6 * GIB }));
    }
}
