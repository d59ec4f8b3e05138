//! GPU-time accounting: each device's time over the run window is partitioned into
//! *loading* (a replica's weights are being loaded), *generation* (an engine iteration runs),
//! *idle resident* (weights occupy the GPU but nothing runs) and *other* (everything else: an
//! empty GPU, or lifecycle work other than loading). Precedence when they overlap on one
//! device: loading > generation > idle resident. The four parts sum to the window length
//! exactly, so a pool's breakdown sums to GPUs × makespan.
//!
//! Each elementary interval is also charged to the deployment responsible for it (the lowest
//! deployment id among those active in the winning category), which lets a report attribute
//! shared lifecycle time to workflows by their share of each model's generation time
//! (paper 003 §4.3).
//!
//! Must not depend on anything of the crate outside `report`: no shell, planner or engine (it
//! partitions the segments it is handed).

use std::collections::BTreeMap;

use serde::Serialize;

use super::round3;

/// What a device was doing during a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum SegmentKind {
    Loading,
    Generating,
    /// A replica is resident (loaded, awake); idle where no `Generating` overlaps.
    Resident,
    /// A replica is in vLLM sleep mode (or falling asleep). Not part of the GPU-time partition
    /// (a GPU holding only sleepers is *other*); the timeline marks it.
    Asleep,
}

/// One interval of a device's activity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Segment {
    pub start: f64,
    pub end: f64,
    pub kind: SegmentKind,
    /// Deployment id of the replica involved.
    pub deployment: u32,
}

/// Everything recorded for one device.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeviceTimeline {
    pub name: String,
    pub segments: Vec<Segment>,
    /// The partition of the time already folded out of `segments` by
    /// [`DeviceTimeline::fold_until`] (a long-running server's timeline stays bounded); `None`
    /// while nothing was folded. Charts draw only `segments`.
    #[serde(skip)]
    pub folded: Option<Folded>,
}

/// What [`DeviceTimeline::fold_until`] took out of a timeline: the partition of `[from, until]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Folded {
    pub from: f64,
    pub until: f64,
    pub seconds: BTreeMap<(Category, Option<u32>), f64>,
}

impl DeviceTimeline {
    /// An empty timeline for device `name`.
    pub fn new(name: impl Into<String>) -> Self {
        DeviceTimeline { name: name.into(), segments: Vec::new(), folded: None }
    }

    /// Where to fold a timeline that holds more than twice `kept` segments so that about
    /// `kept` remain: the end of the segment `kept` places before the last (not before `from`);
    /// `None` while it holds no more than that. (Both shells bound their timelines with it.)
    pub fn fold_cut(&self, kept: usize, from: f64) -> Option<f64> {
        let kept = kept.max(1);
        let n = self.segments.len();
        (n > kept.saturating_mul(2)).then(|| self.segments[n - kept - 1].end.max(from))
    }

    /// Partition `[from, cut]` into [`Self::folded`] and keep only what lies after `cut`:
    /// segments that end by `cut` are dropped, those that straddle it restart at it. A later fold
    /// continues from the previous one's end (`from` is then ignored). Intervals the caller still
    /// holds open (a replica loading, generating or resident, whose segment is pushed only when
    /// it closes) must be passed in `open` as segments ending at `cut`, and restarted at `cut` by
    /// the caller: then [`Self::partition`] over a window that starts at `from` (and ends after
    /// the last cut) is the same as without the fold.
    pub fn fold_until(&mut self, from: f64, cut: f64, open: &[Segment]) {
        let from = self.folded.as_ref().map_or(from, |f| f.until);
        if cut <= from {
            return;
        }
        let mut past: Vec<Segment> = self.segments.iter().filter(|s| s.start < cut).copied().collect();
        past.extend_from_slice(open);
        let parts = partition(&past, from, cut);
        let folded = self.folded.get_or_insert_with(|| Folded { from, until: from, seconds: BTreeMap::new() });
        for (key, secs) in parts {
            *folded.seconds.entry(key).or_insert(0.0) += secs;
        }
        folded.until = cut;
        self.segments.retain(|s| s.end > cut);
        for s in &mut self.segments {
            s.start = s.start.max(cut);
        }
    }

    /// Seconds per (category, responsible deployment) over `[t0, t1]`: what was folded (which
    /// must lie inside the window) plus the partition of the segments after it.
    pub fn partition(&self, t0: f64, t1: f64) -> BTreeMap<(Category, Option<u32>), f64> {
        let Some(f) = &self.folded else { return partition(&self.segments, t0, t1) };
        let mut out = f.seconds.clone();
        for (key, secs) in partition(&self.segments, t0.max(f.until), t1) {
            *out.entry(key).or_insert(0.0) += secs;
        }
        out
    }
}

/// GPU seconds split by category.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct GpuBreakdown {
    pub generation: f64,
    pub idle_resident: f64,
    pub loading: f64,
    pub other: f64,
}

impl GpuBreakdown {
    pub fn total(&self) -> f64 {
        self.generation + self.idle_resident + self.loading + self.other
    }

    pub fn scaled(&self, k: f64) -> Self {
        GpuBreakdown {
            generation: self.generation * k,
            idle_resident: self.idle_resident * k,
            loading: self.loading * k,
            other: self.other * k,
        }
    }

    pub fn add(&mut self, o: &GpuBreakdown) {
        self.generation += o.generation;
        self.idle_resident += o.idle_resident;
        self.loading += o.loading;
        self.other += o.other;
    }

    pub fn rounded(&self) -> Self {
        GpuBreakdown {
            generation: round3(self.generation),
            idle_resident: round3(self.idle_resident),
            loading: round3(self.loading),
            other: round3(self.other),
        }
    }
}

/// Category of an elementary interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    Loading,
    Generation,
    IdleResident,
    Other,
}

/// Seconds per (category, responsible deployment) for one device over `[t0, t1]`.
/// `Other` intervals carry no deployment.
pub fn partition(segments: &[Segment], t0: f64, t1: f64) -> BTreeMap<(Category, Option<u32>), f64> {
    let mut out = BTreeMap::new();
    sweep(segments, t0, t1, |a, b, cat, dep| *out.entry((cat, dep)).or_insert(0.0) += b - a);
    out
}

/// Visit the elementary intervals `[a, b)` of `[t0, t1]` in time order with their category and
/// responsible deployment. O(n log n) in the number of segments.
pub fn sweep(
    segments: &[Segment],
    t0: f64,
    t1: f64,
    mut visit: impl FnMut(f64, f64, Category, Option<u32>),
) {
    if t1 <= t0 {
        return;
    }
    // Sweep over clipped segment boundaries.
    let mut events: Vec<(f64, i32, SegmentKind, u32)> = Vec::with_capacity(segments.len() * 2);
    for s in segments.iter().filter(|s| s.kind != SegmentKind::Asleep) {
        let (a, b) = (s.start.max(t0), s.end.min(t1));
        if b > a {
            events.push((a, 1, s.kind, s.deployment));
            events.push((b, -1, s.kind, s.deployment));
        }
    }
    events.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
    let mut active: [BTreeMap<u32, i32>; 3] = Default::default();
    let slot = |k: SegmentKind| match k {
        SegmentKind::Loading => 0,
        SegmentKind::Generating => 1,
        SegmentKind::Resident | SegmentKind::Asleep => 2,
    };
    let mut t = t0;
    let mut i = 0;
    loop {
        let next = if i < events.len() { events[i].0 } else { t1 };
        if next > t {
            let winner = active.iter().position(|m| !m.is_empty());
            let key = match winner {
                Some(0) => (Category::Loading, active[0].keys().next().copied()),
                Some(1) => (Category::Generation, active[1].keys().next().copied()),
                Some(_) => (Category::IdleResident, active[2].keys().next().copied()),
                None => (Category::Other, None),
            };
            visit(t, next, key.0, key.1);
            t = next;
        }
        if i >= events.len() {
            break;
        }
        let (_, delta, kind, dep) = events[i];
        let m = &mut active[slot(kind)];
        let c = m.entry(dep).or_insert(0);
        *c += delta;
        if *c <= 0 {
            m.remove(&dep);
        }
        i += 1;
    }
}

/// Sum a partition into a breakdown.
pub fn breakdown(parts: &BTreeMap<(Category, Option<u32>), f64>) -> GpuBreakdown {
    let mut b = GpuBreakdown::default();
    for ((cat, _), secs) in parts {
        match cat {
            Category::Loading => b.loading += secs,
            Category::Generation => b.generation += secs,
            Category::IdleResident => b.idle_resident += secs,
            Category::Other => b.other += secs,
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(start: f64, end: f64, kind: SegmentKind, deployment: u32) -> Segment {
        Segment { start, end, kind, deployment }
    }

    #[test]
    fn partition_by_hand() {
        // Load 0–10, resident 10–50, iterations 12–20 and 30–35, then empty until 60.
        let s = [
            seg(0.0, 10.0, SegmentKind::Loading, 1),
            seg(10.0, 50.0, SegmentKind::Resident, 1),
            seg(12.0, 20.0, SegmentKind::Generating, 1),
            seg(30.0, 35.0, SegmentKind::Generating, 1),
        ];
        let b = breakdown(&partition(&s, 0.0, 60.0));
        assert_eq!(b.loading, 10.0);
        assert_eq!(b.generation, 13.0);
        assert_eq!(b.idle_resident, 27.0);
        assert_eq!(b.other, 10.0);
        assert_eq!(b.total(), 60.0);
    }

    #[test]
    fn folding_keeps_the_partition_and_bounds_the_segments() {
        // Resident 0–100 (still open at the folds), iterations every 10 s, a load 42–47.
        let mut all: Vec<Segment> = (0..10).map(|i| seg(i as f64 * 10.0 + 1.0, i as f64 * 10.0 + 4.0, SegmentKind::Generating, 1)).collect();
        all.push(seg(42.0, 47.0, SegmentKind::Loading, 2));
        let whole = {
            let mut s = all.clone();
            s.push(seg(5.0, 100.0, SegmentKind::Resident, 1));
            partition(&s, 2.0, 110.0)
        };
        let mut tl = DeviceTimeline::new("A100-80GB");
        tl.segments = all;
        // The caller's open resident interval starts at 5 and restarts at each cut.
        let mut open_since = 5.0;
        for cut in [33.5, 44.0, 61.0] {
            tl.fold_until(2.0, cut, &[seg(open_since, cut, SegmentKind::Resident, 1)]);
            open_since = cut;
        }
        assert!(tl.segments.iter().all(|s| s.start >= 61.0), "{:?}", tl.segments);
        assert_eq!(tl.segments.len(), 4);
        tl.segments.push(seg(open_since, 100.0, SegmentKind::Resident, 1));
        let folded = tl.partition(2.0, 110.0);
        assert_eq!(folded.keys().collect::<Vec<_>>(), whole.keys().collect::<Vec<_>>());
        for (k, v) in &whole {
            assert!((folded[k] - v).abs() < 1e-9, "{k:?}: {} vs {v}", folded[k]);
        }
        // A cut at or before the last one folds nothing more.
        let before = tl.folded.clone();
        tl.fold_until(0.0, 50.0, &[]);
        assert_eq!(tl.folded, before);
    }

    #[test]
    fn the_fold_cut_keeps_about_the_asked_number_of_segments() {
        let mut tl = DeviceTimeline::new("A100-80GB");
        tl.segments = (0..6).map(|i| seg(i as f64 * 10.0, i as f64 * 10.0 + 5.0, SegmentKind::Generating, 1)).collect();
        assert_eq!(tl.fold_cut(3, 0.0), None, "six segments are not more than twice three");
        assert_eq!(tl.fold_cut(2, 0.0), Some(35.0), "the end of the third from the last");
        assert_eq!(tl.fold_cut(2, 40.0), Some(40.0), "never before the window's start");
        assert_eq!(tl.fold_cut(0, 0.0), Some(45.0), "at least one kept");
    }

    #[test]
    fn loading_wins_over_a_coresident_replica_and_the_window_clips() {
        let s = [
            seg(0.0, 100.0, SegmentKind::Resident, 0),
            seg(20.0, 30.0, SegmentKind::Loading, 2),
            seg(25.0, 40.0, SegmentKind::Generating, 0),
        ];
        let parts = partition(&s, 10.0, 50.0);
        assert_eq!(parts[&(Category::Loading, Some(2))], 10.0);
        assert_eq!(parts[&(Category::Generation, Some(0))], 10.0);
        assert_eq!(parts[&(Category::IdleResident, Some(0))], 20.0);
        assert_eq!(breakdown(&parts).total(), 40.0);
    }
}
