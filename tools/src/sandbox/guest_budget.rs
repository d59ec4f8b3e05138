//! A process-wide budget for WebAssembly guests, which all run inside Switchyard's own process.
//!
//! Each guest's limits (`address_space_bytes` of linear memory, `max_work_bytes` of work area —
//! a tmpfs is memory too — and `max_open_files` host descriptors) bound that guest alone; a
//! caller that runs many at once (`--tool-workers` up to 1,024) could otherwise hold many times
//! the machine's memory or run the process out of descriptors, where every guest and
//! Switchyard itself would fail. Before a guest starts, it reserves its whole bound here and
//! waits until the reservation fits beside the guests already running; it releases it when it
//! ends ([`Reservation`] drops). The wait comes before the guest's clocks start, so a queued
//! guest's outcome is the one it would have had alone: verdicts stay a function of the call.
//!
//! The budget, set once, is half the memory Switchyard may use — `MemTotal` in `/proc/meminfo`,
//! or the cgroup's `memory.max` (v2) or `memory.limit_in_bytes` (v1) where that is lower, as in
//! a container — and half the process's `RLIMIT_NOFILE`, whose soft limit is first raised to its
//! hard limit (the common soft default of 1,024 would admit one Python guest at a time: each
//! reserves its 256 open files; programs Switchyard starts inherit the raised soft limit, and the
//! process sandbox sets its own). A single reservation larger than the whole budget is admitted
//! when no other guest runs, so it is not refused. Admission is not first come first served: a
//! large reservation may wait while smaller ones keep fitting. A caller that runs guests nobody
//! waits for yet (the simulator's prefetched tool calls) marks them [`in_background`]: a
//! background reservation is not admitted while a foreground one waits, so a call a session
//! needs now is queued behind at most the guests already running.
//!
//! Must not depend on anything outside this crate's sandbox module.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

thread_local! {
    /// Whether this thread's guests run in the background (see [`in_background`]).
    static BACKGROUND: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` with this thread's guest reservations in the background: they wait while any
/// reservation outside the background waits. Restored when `f` returns.
pub fn in_background<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            BACKGROUND.with(|b| b.set(self.0));
        }
    }
    let _restore = Restore(BACKGROUND.with(|b| b.replace(true)));
    f()
}

/// What one guest holds while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Demand {
    /// Bytes of memory: linear memory and work area.
    pub memory_bytes: u64,
    /// Host descriptors: its open files and pre-opens.
    pub descriptors: u64,
}

#[derive(Debug, Default)]
struct InUse {
    demand: Demand,
    guests: usize,
    /// Foreground reservations waiting: background ones yield to them.
    foreground_waiting: usize,
}

/// Reservations of running guests against a fixed capacity.
#[derive(Debug)]
pub struct GuestBudget {
    capacity: Demand,
    in_use: Mutex<InUse>,
    freed: Condvar,
}

/// A guest's share of the budget, returned when dropped.
#[derive(Debug)]
pub struct Reservation<'a> {
    budget: &'a GuestBudget,
    demand: Demand,
}

impl GuestBudget {
    pub fn new(capacity: Demand) -> Self {
        Self { capacity, in_use: Mutex::new(InUse::default()), freed: Condvar::new() }
    }

    /// The process's budget (see the module documentation).
    pub fn process() -> &'static GuestBudget {
        static BUDGET: OnceLock<GuestBudget> = OnceLock::new();
        BUDGET.get_or_init(|| {
            GuestBudget::new(Demand { memory_bytes: usable_memory_bytes() / 2, descriptors: raise_nofile_limit() / 2 })
        })
    }

    #[cfg(test)]
    pub fn capacity(&self) -> Demand {
        self.capacity
    }

    fn lock(&self) -> MutexGuard<'_, InUse> {
        self.in_use.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fits(&self, in_use: &InUse, d: Demand) -> bool {
        in_use.guests == 0
            || (in_use.demand.memory_bytes.saturating_add(d.memory_bytes) <= self.capacity.memory_bytes
                && in_use.demand.descriptors.saturating_add(d.descriptors) <= self.capacity.descriptors)
    }

    /// Reserve `demand`, waiting while it does not fit beside the running guests (and, on a
    /// thread [`in_background`], while a foreground reservation waits).
    pub fn reserve(&self, demand: Demand) -> Reservation<'_> {
        let background = BACKGROUND.with(Cell::get);
        let mut in_use = self.lock();
        if background {
            while !self.fits(&in_use, demand) || in_use.foreground_waiting > 0 {
                in_use = self.freed.wait(in_use).unwrap_or_else(|p| p.into_inner());
            }
        } else if !self.fits(&in_use, demand) {
            in_use.foreground_waiting += 1;
            while !self.fits(&in_use, demand) {
                in_use = self.freed.wait(in_use).unwrap_or_else(|p| p.into_inner());
            }
            in_use.foreground_waiting -= 1;
            if in_use.foreground_waiting == 0 {
                // Background reservations waiting on it may go now (what fits of them).
                self.freed.notify_all();
            }
        }
        self.take(&mut in_use, demand);
        Reservation { budget: self, demand }
    }

    #[cfg(test)]
    /// Reserve `demand` if it fits now.
    pub fn try_reserve(&self, demand: Demand) -> Option<Reservation<'_>> {
        let mut in_use = self.lock();
        if !self.fits(&in_use, demand) {
            return None;
        }
        self.take(&mut in_use, demand);
        Some(Reservation { budget: self, demand })
    }

    fn take(&self, in_use: &mut InUse, d: Demand) {
        in_use.demand.memory_bytes = in_use.demand.memory_bytes.saturating_add(d.memory_bytes);
        in_use.demand.descriptors = in_use.demand.descriptors.saturating_add(d.descriptors);
        in_use.guests += 1;
    }

    #[cfg(test)]
    /// What running guests hold now, and how many they are.
    pub fn in_use(&self) -> (Demand, usize) {
        let in_use = self.lock();
        (in_use.demand, in_use.guests)
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut in_use = self.budget.lock();
        in_use.demand.memory_bytes = in_use.demand.memory_bytes.saturating_sub(self.demand.memory_bytes);
        in_use.demand.descriptors = in_use.demand.descriptors.saturating_sub(self.demand.descriptors);
        in_use.guests = in_use.guests.saturating_sub(1);
        drop(in_use);
        self.budget.freed.notify_all();
    }
}

/// The memory this process may use: `MemTotal` from `/proc/meminfo` (4 GiB where it cannot be
/// read), or its cgroup's limit where one is set and lower.
fn usable_memory_bytes() -> u64 {
    const FALLBACK: u64 = 4 << 30;
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| mem_total_of(&t)).unwrap_or(FALLBACK);
    let cgroup = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter_map(|t| cgroup_limit_of(&t))
        .min();
    cgroup.map_or(total, |c| c.min(total))
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn mem_total_of(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb.saturating_mul(1024))
}

/// A cgroup memory limit file's value in bytes: `None` for `max` (v2's no limit) or text that
/// is not a number (v1's "no limit" is a huge number, which the minimum with `MemTotal` ignores).
fn cgroup_limit_of(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|&b| b > 0)
}

/// Raise this process's soft `RLIMIT_NOFILE` to its hard limit and return it (1,024 where it
/// cannot be read; the soft limit where it cannot be raised).
fn raise_nofile_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 || limit.rlim_cur == 0 {
        return 1024;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: setrlimit reads the struct it is given; raising a soft limit to the hard one
        // is always allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return raised.rlim_cur;
        }
    }
    limit.rlim_cur
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn d(memory_bytes: u64, descriptors: u64) -> Demand {
        Demand { memory_bytes, descriptors }
    }

    #[test]
    fn reservations_fit_the_budget_and_come_back_when_dropped() {
        let b = GuestBudget::new(d(1000, 10));
        let first = b.try_reserve(d(600, 4)).expect("fits");
        assert!(b.try_reserve(d(600, 4)).is_none(), "memory over the budget");
        let second = b.try_reserve(d(400, 4)).expect("fits exactly");
        assert!(b.try_reserve(d(0, 3)).is_none(), "descriptors over the budget");
        assert_eq!(b.in_use(), (d(1000, 8), 2));
        drop(first);
        assert_eq!(b.in_use(), (d(400, 4), 1));
        drop(second);
        assert_eq!(b.in_use(), (d(0, 0), 0));
    }

    #[test]
    fn a_guest_larger_than_the_budget_runs_alone() {
        let b = GuestBudget::new(d(100, 10));
        let big = b.try_reserve(d(1000, 1)).expect("alone, it may run");
        assert!(b.try_reserve(d(1, 1)).is_none());
        drop(big);
        assert!(b.try_reserve(d(1, 1)).is_some());
    }

    /// Sixteen threads each hold a reservation of a quarter of the budget: never more than
    /// four run at once, and every one runs.
    #[test]
    fn waiting_guests_run_as_reservations_end() {
        let b = Arc::new(GuestBudget::new(d(4 << 20, 1000)));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let (b, running, most, done) = (Arc::clone(&b), Arc::clone(&running), Arc::clone(&most), Arc::clone(&done));
                std::thread::spawn(move || {
                    let _r = b.reserve(d(1 << 20, 1));
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    running.fetch_sub(1, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert_eq!(done.load(Ordering::SeqCst), 16);
        assert!(most.load(Ordering::SeqCst) <= 4, "{}", most.load(Ordering::SeqCst));
        assert_eq!(b.in_use(), (d(0, 0), 0));
    }

    #[test]
    fn memory_limits_are_read_from_meminfo_and_cgroup_files() {
        assert_eq!(mem_total_of("MemTotal:       24683772 kB\nMemFree: 1 kB\n"), Some(24_683_772 * 1024));
        assert_eq!(mem_total_of("MemFree: 1 kB\n"), None);
        assert_eq!(cgroup_limit_of("max\n"), None);
        assert_eq!(cgroup_limit_of("2147483648\n"), Some(2 << 30));
        assert_eq!(cgroup_limit_of("9223372036854771712\n"), Some(9_223_372_036_854_771_712));
    }

    /// A background reservation is not admitted while a foreground one waits, even where it
    /// would fit: when the running guest ends, the foreground one goes first.
    #[test]
    fn a_foreground_reservation_goes_before_waiting_background_ones() {
        let b = Arc::new(GuestBudget::new(d(10, 10)));
        let running = b.try_reserve(d(8, 1)).expect("fits");
        let order = Arc::new(Mutex::new(Vec::new()));
        let spawn = |name: &'static str, demand: Demand, background: bool| {
            let (b, order) = (Arc::clone(&b), Arc::clone(&order));
            std::thread::spawn(move || {
                let take = || {
                    let _r = b.reserve(demand);
                    order.lock().expect("order").push(name);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                };
                if background { in_background(take) } else { take() }
            })
        };
        let foreground = spawn("foreground", d(5, 1), false);
        // Wait until the foreground reservation is waiting.
        while b.lock().foreground_waiting == 0 {
            std::thread::yield_now();
        }
        // This one fits beside the running guest (8 + 2 <= 10), but a foreground one waits.
        let background = spawn("background", d(2, 1), true);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(order.lock().expect("order").is_empty(), "{:?}", order.lock().expect("order"));
        drop(running);
        foreground.join().expect("thread");
        background.join().expect("thread");
        assert_eq!(*order.lock().expect("order"), ["foreground", "background"]);
        assert!(!BACKGROUND.with(Cell::get), "restored");
    }

    #[test]
    fn the_process_budget_is_read_from_the_machine() {
        let c = GuestBudget::process().capacity();
        assert!(c.memory_bytes > 0 && c.descriptors > 0, "{c:?}");
    }
}
