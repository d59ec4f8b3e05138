//! Propagate (paper 003 §3.5, Eq. 7, 10, 11): the predicted timeline of one planning tick.
//!
//! Each replica — resident, loading, waking, or one a lifecycle action would create — is a
//! [`Lane`]: the time from which it serves (the end of its load or wake, the lifecycle
//! predecessor of Eq. 7), its KV capacity and batch limit B_q, and the KV reservations of the
//! units on it with their predicted finishes. Units are placed in ranked order: a unit starts at
//! the earliest time after its release r̂ (Eq. 2), the lane's availability and the start of the
//! unit placed before it on that lane (the ranked order orients every conflict on a replica,
//! Eq. 10), at which its reservation fits beside the reservations still held and a batch slot
//! is free (Eq. 11 and B_q, checked at every predicted finish, the only times memory frees); it
//! finishes after its predicted run time at the batch it joins (Eq. 7). The joint policy commits
//! the prefix — units whose predicted start is now on an awake replica — keeps the rest queued
//! (re-ranked at the next event), derives near-ready releases from the finishes (Eq. 2), and
//! prices loads and scale-out by the completions the timeline predicts with and without them.
//!
//! Pure and self-contained: run times come from the caller (it owns the estimates); no I/O,
//! no clock, no global state. Must not depend on the planner state or any shell.

use crate::ids::{DeviceId, ReplicaId};

/// Where and when a placed unit runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slot {
    pub start: f64,
    pub finish: f64,
    /// Units running on the lane once it has started, itself included.
    pub batch: u32,
}

/// One replica on the timeline.
#[derive(Debug, Clone)]
pub struct Lane {
    /// The replica (`None`: one a candidate lifecycle action would create).
    pub replica: Option<ReplicaId>,
    pub device: DeviceId,
    /// When the replica serves: now when awake, else the end of its load or wake.
    pub ready_at: f64,
    kv_capacity: u64,
    max_seqs: u32,
    /// (finish, KV bytes) of the units that may still hold memory, ascending by finish.
    active: Vec<(f64, u64)>,
    /// Sum of `active`'s bytes.
    used: u64,
    /// Start of the unit placed last (later units on this lane start no earlier).
    cursor: f64,
}

impl Lane {
    pub fn new(replica: Option<ReplicaId>, device: DeviceId, ready_at: f64, kv_capacity: u64, max_seqs: u32) -> Lane {
        Lane {
            replica,
            device,
            ready_at,
            kv_capacity,
            max_seqs,
            active: Vec::new(),
            used: 0,
            cursor: f64::NEG_INFINITY,
        }
    }

    /// A unit already admitted: it holds `kv` bytes until `finish`.
    pub fn seed(&mut self, finish: f64, kv: u64) {
        let at = self.active.partition_point(|a| a.0 <= finish);
        self.active.insert(at, (finish, kv));
        self.used += kv;
    }

    /// Take back a reservation [`Lane::seed`] placed (`finish` and `kv` as given there): a
    /// held chain's, when its successor takes it over and is seeded in its place.
    pub fn unseed(&mut self, finish: f64, kv: u64) {
        if let Some(at) = self.active.iter().position(|a| a.0 == finish && a.1 == kv) {
            self.active.remove(at);
            self.used -= kv;
        }
    }

    /// Predicted finish of the last unit on the lane (`None` when it holds none).
    pub fn last_finish(&self) -> Option<f64> {
        self.active.last().map(|a| a.0)
    }

    /// Units on the lane (admitted or placed) that have not finished by `t`.
    pub fn running_at(&self, t: f64) -> usize {
        self.active.len() - self.active.partition_point(|a| a.0 <= t)
    }

    /// Earliest start at or after `release` of a unit reserving `kv` bytes; `None` when it can
    /// never fit this lane (a reservation above the replica's KV capacity, or no batch slot).
    pub fn earliest_start(&self, release: f64, kv: u64) -> Option<f64> {
        if kv > self.kv_capacity || self.max_seqs == 0 {
            return None;
        }
        let mut t = release.max(self.ready_at).max(self.cursor);
        let mut done = self.active.partition_point(|a| a.0 <= t);
        let mut used = self.used - self.active[..done].iter().map(|a| a.1).sum::<u64>();
        // Memory frees only when a unit finishes: walk the finishes until the unit fits.
        while used + kv > self.kv_capacity || self.active.len() - done >= self.max_seqs as usize {
            let (finish, _) = *self.active.get(done)?;
            t = t.max(finish);
            while done < self.active.len() && self.active[done].0 <= t {
                used -= self.active[done].1;
                done += 1;
            }
        }
        Some(t)
    }

    /// Where a unit would run without placing it: `run(batch)` is its predicted run time at
    /// the batch it would join.
    pub fn probe(&self, release: f64, kv: u64, run: impl FnOnce(u32) -> f64) -> Option<Slot> {
        let start = self.earliest_start(release, kv)?;
        let batch = self.running_at(start) as u32 + 1;
        Some(Slot { start, finish: start + run(batch).max(0.0), batch })
    }

    /// Place a unit: as [`Lane::probe`], then [`Lane::commit`].
    pub fn place(&mut self, release: f64, kv: u64, run: impl FnOnce(u32) -> f64) -> Option<Slot> {
        let slot = self.probe(release, kv, run)?;
        self.commit(slot, kv);
        Some(slot)
    }

    /// Hold a unit's reservation of `kv` bytes from `slot` (what [`Lane::probe`] returned on
    /// this lane, unchanged since) until it finishes. Units finished by its start leave the lane
    /// (no later unit starts earlier).
    pub fn commit(&mut self, slot: Slot, kv: u64) {
        let done = self.active.partition_point(|a| a.0 <= slot.start);
        self.used -= self.active.drain(..done).map(|a| a.1).sum::<u64>();
        self.seed(slot.finish, kv);
        self.cursor = slot.start;
    }
}

/// Place `units` (release, KV bytes, run time at a batch) in order over `lanes`, each on the
/// lane where it finishes earliest (ties: the earlier lane); returns each unit's slot and lane
/// index (`None` where no lane can ever hold it).
pub fn place_all<U>(
    lanes: &mut [Lane],
    units: &[U],
    release: impl Fn(&U) -> f64,
    kv: impl Fn(&U, &Lane) -> u64,
    run: impl Fn(&U, DeviceId, u32) -> f64,
) -> Vec<Option<(usize, Slot)>> {
    units
        .iter()
        .map(|u| {
            let r = release(u);
            let (i, slot, bytes) = lanes
                .iter()
                .enumerate()
                .filter_map(|(i, l)| {
                    let bytes = kv(u, l);
                    l.probe(r, bytes, |b| run(u, l.device, b)).map(|s| (i, s, bytes))
                })
                .min_by(|a, b| a.1.finish.total_cmp(&b.1.finish).then(a.0.cmp(&b.0)))?;
            lanes[i].commit(slot, bytes);
            Some((i, slot))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lane(cap: u64, seqs: u32) -> Lane {
        Lane::new(Some(ReplicaId(0)), DeviceId(0), 0.0, cap, seqs)
    }

    #[test]
    fn an_unseeded_reservation_frees_its_memory() {
        // A held reservation with no known finish blocks the lane until it is taken back.
        let mut l = lane(10, 8);
        l.seed(f64::INFINITY, 6);
        assert_eq!(l.earliest_start(0.0, 6), Some(f64::INFINITY));
        l.unseed(f64::INFINITY, 5);
        assert_eq!(l.earliest_start(0.0, 6), Some(f64::INFINITY), "no such entry: nothing taken back");
        l.unseed(f64::INFINITY, 6);
        assert_eq!((l.earliest_start(0.0, 6), l.running_at(0.0)), (Some(0.0), 0));
    }

    #[test]
    fn a_unit_waits_for_the_memory_it_needs() {
        // Capacity 10: two units of 6 cannot overlap; the second starts when the first ends.
        let mut l = lane(10, 8);
        let a = l.place(0.0, 6, |_| 5.0).unwrap();
        let b = l.place(0.0, 6, |_| 5.0).unwrap();
        assert_eq!((a.start, a.finish, a.batch), (0.0, 5.0, 1));
        assert_eq!((b.start, b.finish, b.batch), (5.0, 10.0, 1));
        // Two units of 4 share the replica: both start at once, the second in a batch of two.
        let mut l = lane(10, 8);
        l.place(0.0, 4, |_| 5.0).unwrap();
        let c = l.place(0.0, 4, |b| 5.0 * b as f64).unwrap();
        assert_eq!((c.start, c.batch, c.finish), (0.0, 2, 10.0));
    }

    #[test]
    fn the_batch_limit_and_availability_bound_the_start() {
        let mut l = Lane::new(None, DeviceId(0), 30.0, 100, 1);
        let a = l.place(0.0, 1, |_| 2.0).unwrap();
        assert_eq!(a.start, 30.0, "a unit never starts before its replica is loaded");
        let b = l.place(0.0, 1, |_| 2.0).unwrap();
        assert_eq!(b.start, 32.0, "one batch slot: the second waits for the first");
        assert!(l.probe(0.0, 101, |_| 1.0).is_none(), "more than the capacity never fits");
    }

    #[test]
    fn ranked_order_orients_conflicts() {
        // A large unit that must wait is not overtaken on its lane by a smaller later one.
        let mut l = lane(10, 8);
        l.place(0.0, 8, |_| 10.0).unwrap();
        let big = l.place(0.0, 8, |_| 1.0).unwrap();
        let small = l.place(0.0, 1, |_| 1.0).unwrap();
        assert_eq!(big.start, 10.0);
        assert!(small.start >= big.start);
    }

    #[test]
    fn place_all_spreads_over_the_lanes_that_finish_earlier() {
        let mut lanes = vec![lane(10, 8), Lane::new(Some(ReplicaId(1)), DeviceId(1), 3.0, 10, 8)];
        // Four units of 6: lane 0 runs one at a time (5 s each); lane 1 is ready at 3 s.
        let slots = place_all(&mut lanes, &[6u64, 6, 6, 6], |_| 0.0, |u, _| *u, |_, _, _| 5.0);
        let on: Vec<usize> = slots.iter().map(|s| s.unwrap().0).collect();
        assert_eq!(on, vec![0, 1, 0, 1]);
        let finish = slots.iter().map(|s| s.unwrap().1.finish).fold(0.0, f64::max);
        assert_eq!(finish, 13.0);
    }

    proptest! {
        /// Eq. 11 on the lane: at every predicted start (memory only grows there) the KV
        /// reserved never exceeds the capacity and the running units never exceed B_q, even
        /// when the admitted units alone held more; every unit starts after its release and
        /// after the lane is ready (its lifecycle action precedes it).
        #[test]
        fn no_predicted_transition_exceeds_the_lane(
            cap in 1u64..100,
            seqs in 1u32..6,
            ready in 0.0..20.0f64,
            seeded in prop::collection::vec((0.0..30.0f64, 1u64..40), 0..6),
            units in prop::collection::vec((0.0..50.0f64, 1u64..120, 0.1..20.0f64), 1..30),
        ) {
            let mut l = Lane::new(None, DeviceId(0), ready, cap, seqs);
            let mut intervals: Vec<(f64, f64, u64)> = Vec::new();
            for (finish, kv) in seeded.iter().filter(|s| s.1 <= cap).take(seqs as usize) {
                l.seed(*finish, *kv);
                intervals.push((f64::NEG_INFINITY, *finish, *kv));
            }
            for (release, kv, run) in units {
                match l.place(release, kv, |_| run) {
                    Some(s) => {
                        prop_assert!(s.start >= release && s.start >= ready);
                        prop_assert!(kv <= cap);
                        intervals.push((s.start, s.finish, kv));
                    }
                    None => prop_assert!(kv > cap),
                }
            }
            let placed: Vec<&(f64, f64, u64)> = intervals.iter().filter(|i| i.0.is_finite()).collect();
            for p in &placed {
                let t = p.0;
                let live: Vec<&(f64, f64, u64)> = intervals.iter().filter(|i| i.0 <= t && t < i.1).collect();
                let kv: u64 = live.iter().map(|i| i.2).sum();
                prop_assert!(kv <= cap, "kv {kv} over {cap} at {t}");
                prop_assert!(live.len() <= seqs as usize, "{} running over {seqs} at {t}", live.len());
            }
        }
    }
}
