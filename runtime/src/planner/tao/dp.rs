//! TAO decision making (paper 000 §3.5, Appendix B.1): the exact capacity-state dynamic program
//! of Eq. 7 / Algorithm 1 that jointly selects waiting agent sessions and places them on
//! replicas, maximising the lexicographic sum of the embedded values u_{i,b} = (k, r, t, 1) over
//! the feasible set X of Eq. 1, quantized by Δ.
//!
//! Owns: the solver ([`Solver`], [`SolveOptions`]). The snapshot and plan types, input validation
//! and quantization (w̄ = ⌈w/Δ⌉, C̄ = ⌊C/Δ⌋) are [`super::problem`]'s, shared with the fallback
//! ([`super::bfd`]) and re-exported here, so `dp::Problem` and the rest keep working.
//! Must not depend on: any shell, the emulator, the tools crate; no I/O, clock or randomness. The
//! solver's hash table is only probed, never iterated: states live in vectors in the order they
//! were first reached, so every tie is broken the same way on every run.
//!
//! How the exact DP is made fast (each step keeps exactness on the quantized problem; the
//! property tests in `runtime/tests/tao_dp.rs` compare against brute force with each switched
//! off and on):
//! - **Sparse states.** D_j holds only reachable states: (residual quantized capacity per
//!   replica, packed into one u64 key) → best objective, deduplicated through an open-addressing
//!   table keyed by that u64, with per-layer predecessor records for backtracking.
//! - **Packed objective.** The four sums (credit, ready, tokens, count) are bit fields of one
//!   u128 (48/16/48/16 bits). Inputs are checked so that no field can carry into the next, so
//!   integer addition is componentwise addition and integer order is exactly the lexicographic
//!   order of Eq. 7 — a vector comparison in one instruction, not a weighted sum.
//! - **Cache-equivalent grouping** (§3.5, "cache-equivalent nodes can be grouped"): replicas on
//!   which every candidate has the same eligibility and credit are interchangeable, so a state
//!   keeps their residuals sorted (a multiset): permutations of one packing collapse into one
//!   state. The physical replicas are recovered after backtracking.
//! - **Bound pruning** (branch and bound inside the DP). A state is dropped when even an
//!   optimistic completion by the remaining candidates cannot reach an incumbent plan's
//!   objective, so no optimal plan is lost. The bound on a completion is, per group, the exact
//!   0/1 knapsack of the remaining candidates' credit on the group's pooled residual, followed by
//!   the 0/1 knapsack of their (ready, tokens, count) on the total residual (valid because a
//!   completion with less credit is smaller whatever follows it). Both are tables precomputed
//!   per layer in O(n·ΣC̄). (A third relaxation, Σ over replicas of the knapsack of u on each
//!   replica's own residual, removed only a few states on the benches and cost more time than it
//!   saved, so it is not used.) The incumbent starts as a credit-first greedy plan (per
//!   group, the credit knapsack's set; then a value-ordered best fit) and rises with every state
//!   reached. Because credit comes first in the order, states that waste capacity a cache-credit
//!   session needs die at once, which is what keeps the state count small under load.
//! - **Restart with a beam incumbent.** When the greedy incumbent is weak (typically when no
//!   session has cache credit, so plans differ only in readiness and tokens), the first run is
//!   stopped once a layer exceeds [`RESTART_STATES`]; a beam run (the same DP keeping the
//!   [`BEAM_WIDTH`] states of highest bound per layer, not exact) finds a near-optimal plan,
//!   whose objective becomes the incumbent of a second, exact run. Every state any run reaches
//!   is a feasible plan, so the incumbent only rises.
//! - **Budget.** If a layer of the exact run would hold more than `state_budget` live states,
//!   the solve stops and the best-fit-decreasing plan ([`super::bfd`]) is returned, flagged
//!   `fallback`.
//!
//! Ties are broken deterministically: candidates are processed by best value u descending, then
//! input position; from each state the skip comes first, then the eligible groups in replica
//! order and their member positions in ascending residual; a state keeps the first path that
//! reached it unless a later one is strictly better, and the first best final state wins.

use super::TaoError;
use super::bfd;
use super::problem::{build_plan, quantize_capacity, quantize_weight, validate};
use super::value::Objective;

pub use super::problem::{Assignment, Candidate, DEFAULT_QUANTUM, MAX_CANDIDATES, Plan, Problem, VALUE_LIMIT};

/// A default bound on the live states of one DP layer. The predecessor records of an exact run
/// take 6 bytes per state and layer, so a solve's memory is at most about 6 × budget × candidates
/// bytes (≈ 63 MB at 160 candidates; the benches' instances use a few kilobytes).
pub const DEFAULT_STATE_BUDGET: usize = 1 << 16;
/// If a layer of the first, greedily bounded run exceeds this many states, the solver runs a
/// beam of [`BEAM_WIDTH`] states per layer to find a stronger incumbent and solves again.
pub const RESTART_STATES: usize = 1 << 10;
/// States per layer of the incumbent-finding beam run.
pub const BEAM_WIDTH: usize = 32;
/// Above this many table cells ((layers) × (pooled capacity)), the solver skips bound pruning
/// rather than allocate large tables; the DP stays exact, only slower (and may hit the budget).
const BOUND_CELLS_LIMIT: usize = 1 << 20;

/// Solver switches. Every setting is exact; they change only how much work a solve takes (the
/// defaults are the fast ones; the others exist to test and measure them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SolveOptions {
    /// Collapse cache-equivalent replicas into sorted-residual groups.
    pub grouping: bool,
    /// Drop states whose optimistic completion cannot reach the incumbent.
    pub bound_pruning: bool,
    /// With bound pruning: the layer size at which the first run gives up on the greedy
    /// incumbent and a beam run looks for a better one before the exact run.
    pub restart_states: usize,
    /// States per layer of that beam run.
    pub beam_width: usize,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions { grouping: true, bound_pruning: true, restart_states: RESTART_STATES, beam_width: BEAM_WIDTH }
    }
}

/// Solve one snapshot with a fresh [`Solver`] and the default options.
pub fn solve(problem: &Problem) -> Result<Plan, TaoError> {
    Solver::new().solve(problem)
}

/// The packed embedding u = (credit, ready, tokens, count) in one u128 (see the module doc).
fn pack(credit: u64, ready: bool, tokens: u64, count: u64) -> u128 {
    (u128::from(credit) << 80) | (u128::from(ready) << 64) | (u128::from(tokens) << 16) | u128::from(count)
}

fn unpack(p: u128) -> Objective {
    Objective {
        credit_sum: (p >> 80) as u64,
        ready_count: ((p >> 64) & 0xFFFF) as u64,
        token_sum: ((p >> 16) & 0xFFFF_FFFF_FFFF) as u64,
        admitted_count: (p & 0xFFFF) as u64,
    }
}

/// A set of cache-equivalent replicas: one aggregate capacity dimension of the DP. Its members'
/// residuals occupy `members.len()` consecutive fields of the state key, kept in ascending order.
#[derive(Debug, Clone)]
struct Group {
    /// Physical replica indices, ascending.
    members: Vec<usize>,
    /// Bit offset of the group's first field in the state key.
    shift: u32,
    /// Bits per field.
    width: u32,
    /// Σ C̄ of the members (the pooled capacity of the credit bound).
    cap: u64,
    /// Offset of this group's credit-bound row within a layer, if any candidate has credit here.
    kc_off: Option<usize>,
    /// Index of the group's first member position among all positions (key order).
    first_pos: usize,
}

impl Group {
    fn mask(&self) -> u64 {
        if self.width == 64 { u64::MAX } else { (1u64 << self.width) - 1 }
    }
    fn field(&self, key: u64, p: usize) -> u64 {
        (key >> (self.shift + p as u32 * self.width)) & self.mask()
    }
}

/// One eligible group of an item, with its packed value u and credit.
#[derive(Debug, Clone, Copy)]
struct Opt {
    group: usize,
    value: u128,
    credit: u64,
}

/// A candidate that fits somewhere, in processing order.
#[derive(Debug, Clone)]
struct Item {
    /// Index into `Problem::candidates`.
    cand: usize,
    /// w̄.
    wq: u64,
    /// Its options in `Prepared::opts`.
    opts: std::ops::Range<usize>,
    /// Its value without credit, packed (0, r, t, 1).
    base: u128,
}

/// The quantized, grouped instance the DP runs on.
#[derive(Debug, Clone)]
struct Prepared {
    items: Vec<Item>,
    opts: Vec<Opt>,
    groups: Vec<Group>,
    /// C̄_b of every replica.
    cap_q: Vec<u64>,
    /// The initial state D_0's key.
    key0: u64,
    /// Σ of the groups' pooled capacities.
    total_cap: u64,
    /// Stride of one layer of the credit-bound table.
    kc_stride: usize,
    /// Candidates with w̄ = 0 and their replica: they consume no quantized capacity and every
    /// u_{i,b} ≥ (0, 0, 0, 1) > 0, so an optimal plan admits each of them on its best eligible
    /// replica (highest credit, then lowest index) without entering the DP.
    free: Vec<(usize, usize)>,
    /// Σ of the free candidates' packed values.
    free_value: u128,
}

/// Quantize, group and order the candidates. `None` if the state does not pack into 64 bits
/// (a state space that large exceeds any useful budget: the caller falls back).
fn prepare(problem: &Problem, grouping: bool) -> Option<Prepared> {
    let q = problem.quantum;
    let cap_q: Vec<u64> = problem.capacities.iter().map(|&c| quantize_capacity(c, q)).collect();
    let m = cap_q.len();
    // Cache-equivalence: the replicas' columns of (candidate, credit) eligibility.
    let mut column: Vec<Vec<(usize, u64)>> = vec![Vec::new(); m];
    if grouping {
        for (i, c) in problem.candidates.iter().enumerate() {
            for &(b, k) in &c.options {
                column[b].push((i, k));
            }
        }
    }
    let mut group_of = vec![usize::MAX; m];
    let mut groups: Vec<Group> = Vec::new();
    for b in 0..m {
        if cap_q[b] == 0 || group_of[b] != usize::MAX {
            continue;
        }
        let g = groups.len();
        let mut members = vec![b];
        group_of[b] = g;
        if grouping {
            for b2 in b + 1..m {
                if cap_q[b2] > 0 && group_of[b2] == usize::MAX && column[b2] == column[b] {
                    group_of[b2] = g;
                    members.push(b2);
                }
            }
        }
        groups.push(Group { members, shift: 0, width: 0, cap: 0, kc_off: None, first_pos: 0 });
    }
    // Lay the groups' fields out in the key.
    let mut shift = 0u32;
    let mut key0 = 0u64;
    let mut total_cap = 0u64;
    let mut positions = 0usize;
    for g in &mut groups {
        g.first_pos = positions;
        positions += g.members.len();
        let max = g.members.iter().map(|&b| cap_q[b]).max().unwrap_or(0);
        g.width = 64 - max.leading_zeros();
        g.shift = shift;
        let bits = g.width.checked_mul(g.members.len() as u32)?;
        shift = shift.checked_add(bits).filter(|&s| s <= 64)?;
        let mut caps: Vec<u64> = g.members.iter().map(|&b| cap_q[b]).collect();
        caps.sort_unstable();
        for (p, c) in caps.iter().enumerate() {
            key0 |= c << (g.shift + p as u32 * g.width);
        }
        g.cap = caps.iter().sum();
        total_cap += g.cap;
    }
    // Items: candidates with at least one eligible group where they fit some member.
    let mut items = Vec::new();
    let mut opts = Vec::new();
    let (mut free, mut free_value) = (Vec::new(), 0u128);
    for (i, c) in problem.candidates.iter().enumerate() {
        let wq = quantize_weight(c.weight, q);
        if wq == 0 {
            let best = c.options.iter().copied().max_by_key(|&(b, k)| (k, std::cmp::Reverse(b)));
            if let Some((b, k)) = best {
                free.push((i, b));
                free_value += pack(k, c.ready, c.tokens, 1);
            }
            continue;
        }
        let start = opts.len();
        for &(b, k) in &c.options {
            let g = group_of[b];
            if g == usize::MAX || opts[start..].iter().any(|o: &Opt| o.group == g) {
                continue;
            }
            if groups[g].members.iter().any(|&m| cap_q[m] >= wq) {
                opts.push(Opt { group: g, value: pack(k, c.ready, c.tokens, 1), credit: k });
            }
        }
        if opts.len() == start {
            continue;
        }
        opts[start..].sort_unstable_by_key(|o| o.group);
        items.push(Item { cand: i, wq, opts: start..opts.len(), base: pack(0, c.ready, c.tokens, 1) });
    }
    // Processing order: best value u descending (credit first), then input order.
    items.sort_by_cached_key(|it| {
        let best = opts[it.opts.clone()].iter().map(|o: &Opt| o.value).max().unwrap_or(0);
        (std::cmp::Reverse(best), it.cand)
    });
    // Rows of the credit bound: only groups where some candidate has credit.
    let mut kc_stride = 0usize;
    for (g, grp) in groups.iter_mut().enumerate() {
        if opts.iter().any(|o| o.group == g && o.credit > 0) {
            grp.kc_off = Some(kc_stride);
            kc_stride = kc_stride.saturating_add((grp.cap as usize).saturating_add(1));
        }
    }
    Some(Prepared { items, opts, groups, cap_q, key0, total_cap, kc_stride, free, free_value })
}

/// One slot of the solver's open-addressing table: a state key and its index in the layer being
/// built, valid only if `stamp` is the current layer's.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    key: u64,
    stamp: u32,
    idx: u32,
}

const SKIP: u16 = 0;

/// The layers D_j of one DP run: the current and next layer's states (keys and packed
/// objectives, in the order first reached), the open-addressing table that deduplicates the
/// next layer, and every layer's predecessor records.
#[derive(Debug, Default)]
struct Layers {
    table: Vec<Slot>,
    stamp: u32,
    cur_keys: Vec<u64>,
    cur_obj: Vec<u128>,
    next_keys: Vec<u64>,
    next_obj: Vec<u128>,
    /// Predecessor index in the previous layer and choice, for every state of every layer.
    rec_pred: Vec<u32>,
    rec_choice: Vec<u16>,
    /// Where each layer's records start.
    layer_off: Vec<usize>,
}

impl Layers {
    /// Reset to D_0 = {key0 ↦ 0}.
    fn start(&mut self, key0: u64) {
        self.cur_keys.clear();
        self.cur_obj.clear();
        self.cur_keys.push(key0);
        self.cur_obj.push(0);
        self.rec_pred.clear();
        self.rec_choice.clear();
        self.layer_off.clear();
        self.layer_off.push(0);
        self.rec_pred.push(0);
        self.rec_choice.push(SKIP);
    }

    /// Begin the next layer, with room in the table for `entries` states.
    fn begin(&mut self, entries: usize) {
        let want = entries.max(4).saturating_mul(2).checked_next_power_of_two().unwrap_or(1 << 62);
        if want > self.table.len() {
            self.table = vec![Slot::default(); want];
            self.stamp = 0;
        }
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.table.iter_mut().for_each(|s| s.stamp = 0);
            self.stamp = 1;
        }
        self.next_keys.clear();
        self.next_obj.clear();
        self.layer_off.push(self.rec_pred.len());
    }

    /// Make the layer just built the current one.
    fn finish(&mut self) {
        std::mem::swap(&mut self.cur_keys, &mut self.next_keys);
        std::mem::swap(&mut self.cur_obj, &mut self.next_obj);
    }

    /// Store state `key` with objective `obj` in the layer being built, or improve it; record
    /// its predecessor `pred` and `choice`. A later path replaces an earlier one only if strictly
    /// better, so ties keep the first path in iteration order. Raises the incumbent `lb`.
    #[inline]
    fn insert(&mut self, key: u64, obj: u128, pred: usize, choice: u16, lb: &mut u128) {
        let bits = self.table.len().trailing_zeros();
        let mask = self.table.len() - 1;
        let base = self.layer_off[self.layer_off.len() - 1];
        let mut h = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize;
        loop {
            let slot = &mut self.table[h];
            if slot.stamp != self.stamp {
                *slot = Slot { key, stamp: self.stamp, idx: self.next_keys.len() as u32 };
                self.next_keys.push(key);
                self.next_obj.push(obj);
                self.rec_pred.push(pred as u32);
                self.rec_choice.push(choice);
                break;
            }
            if slot.key == key {
                let idx = slot.idx as usize;
                if obj > self.next_obj[idx] {
                    self.next_obj[idx] = obj;
                    self.rec_pred[base + idx] = pred as u32;
                    self.rec_choice[base + idx] = choice;
                }
                break;
            }
            h = (h + 1) & mask;
        }
        if obj > *lb {
            *lb = obj;
        }
    }
}

/// The DP solver. Holds scratch buffers so that repeated solves (one per scheduling decision)
/// allocate nothing once warm; a `Solver` carries no state from one solve to the next.
#[derive(Debug, Default)]
pub struct Solver {
    layers: Layers,
    /// Credit bound: per layer j, per credited group, K_j(c) for c = 0..=pooled capacity.
    kc: Vec<u64>,
    /// (ready, tokens, count) bound: per layer j, V_j(c) for c = 0..=total capacity.
    vt: Vec<u128>,
    /// Scratch for a beam run's ranking.
    ranked: Vec<(std::cmp::Reverse<u128>, std::cmp::Reverse<u128>, u32)>,
}

/// A DP run stopped because a layer exceeded its state budget.
#[derive(Debug)]
struct BudgetExceeded;

impl Solver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Solve with the default options.
    pub fn solve(&mut self, problem: &Problem) -> Result<Plan, TaoError> {
        self.solve_with(problem, SolveOptions::default())
    }

    /// Solve `problem` exactly (on the quantized instance), or fall back to best-fit-decreasing
    /// when the state budget is exceeded.
    pub fn solve_with(&mut self, problem: &Problem, options: SolveOptions) -> Result<Plan, TaoError> {
        validate(problem)?;
        let Some(prep) = prepare(problem, options.grouping) else {
            return bfd::plan_unchecked(problem, 0);
        };
        let n = prep.items.len();
        let cells = (prep.total_cap as usize).saturating_add(1).saturating_add(prep.kc_stride);
        let bounded = options.bound_pruning && (n + 1).saturating_mul(cells) <= BOUND_CELLS_LIMIT;
        let lb = if bounded {
            self.build_bounds(&prep);
            incumbent(&prep, &self.kc)
        } else {
            0
        };
        let budget = problem.state_budget;
        let mut lb = lb;
        let mut explored = 0usize;
        // First try with the greedy incumbent. If a layer grows past `RESTART_STATES`, the
        // incumbent is too weak to prune: find a better one with a beam run, then solve again.
        // Every state any run reaches is a feasible plan, so each run raises `lb` for the next.
        let restart = bounded && budget > options.restart_states;
        let first_budget = if restart { options.restart_states } else { budget };
        let mut result = self.run(&prep, first_budget, bounded, &mut lb, usize::MAX, &mut explored);
        if result.is_err() && restart {
            // Its outcome is only the incumbent it leaves in `lb`.
            let _ = self.run(&prep, usize::MAX, bounded, &mut lb, options.beam_width.max(1), &mut explored);
            result = self.run(&prep, budget, bounded, &mut lb, usize::MAX, &mut explored);
        }
        match result {
            Ok(Some(best)) => {
                let mut chosen = self.backtrack(&prep, best);
                chosen.extend_from_slice(&prep.free);
                let plan = build_plan(problem, &chosen, false, explored);
                debug_assert_eq!(plan.objective, unpack(self.layers.cur_obj[best] + prep.free_value));
                Ok(plan)
            }
            // An exact run keeps the optimal path (its bound never falls below the incumbent),
            // so its last layer is never empty; fall back rather than trust that blindly.
            Ok(None) | Err(BudgetExceeded) => bfd::plan_unchecked(problem, explored),
        }
    }

    /// Precompute the per-layer bounds on what candidates j.. can still add (see module doc):
    /// layer j of each table is layer j+1 plus candidate j's 0/1-knapsack step.
    fn build_bounds(&mut self, prep: &Prepared) {
        let n = prep.items.len();
        let ks = prep.kc_stride;
        let vs = prep.total_cap as usize + 1;
        self.kc.clear();
        self.kc.resize((n + 1) * ks, 0);
        self.vt.clear();
        self.vt.resize((n + 1) * vs, 0);
        for j in (0..n).rev() {
            let it = &prep.items[j];
            let wq = it.wq as usize;
            // K: candidate j's credit on each credited group, on the group's pooled capacity.
            let (lo, hi) = self.kc.split_at_mut((j + 1) * ks);
            let (row, next) = (&mut lo[j * ks..], &hi[..ks]);
            row.copy_from_slice(next);
            for o in &prep.opts[it.opts.clone()] {
                let g = &prep.groups[o.group];
                if let (Some(off), true) = (g.kc_off, o.credit > 0) {
                    for c in (wq..=g.cap as usize).rev() {
                        let take = next[off + c - wq] + o.credit;
                        if take > row[off + c] {
                            row[off + c] = take;
                        }
                    }
                }
            }
            // V: candidate j's (ready, tokens, count) on the total capacity.
            let (lo, hi) = self.vt.split_at_mut((j + 1) * vs);
            let (row, next) = (&mut lo[j * vs..], &hi[..vs]);
            row.copy_from_slice(next);
            for c in (wq..vs).rev() {
                let take = next[c - wq] + it.base;
                if take > row[c] {
                    row[c] = take;
                }
            }
        }
    }

    /// Algorithm 1's layer loop: the index of the best final state (`None` if no state
    /// survived, which only a beam run can cause). Adds |D_j| of every layer to `explored` and
    /// raises the incumbent `lb` to the best objective reached.
    ///
    /// With `beam` < ∞ it is not exact: each layer keeps only its `beam` states of highest bound
    /// (then objective, then first reached). Such a run serves only to raise `lb`; its
    /// predecessor records are not consistent and must not be backtracked.
    fn run(
        &mut self,
        prep: &Prepared,
        budget: usize,
        bounded: bool,
        lb: &mut u128,
        beam: usize,
        explored: &mut usize,
    ) -> Result<Option<usize>, BudgetExceeded> {
        let n = prep.items.len();
        let Solver { layers, kc, vt, ranked } = self;
        layers.start(prep.key0);
        *explored += 1;
        let ks = prep.kc_stride;
        let vs = prep.total_cap as usize + 1;
        let mut pooled = vec![0u64; prep.groups.len()];
        // The residual of every member position (groups in key order, positions ascending).
        let mut res = [0u64; 64];
        for j in 0..n {
            let it = &prep.items[j];
            let opts = &prep.opts[it.opts.clone()];
            let branching: usize = 1 + opts.iter().map(|o| prep.groups[o.group].members.len()).sum::<usize>();
            // At most this many states can be inserted before the budget check stops the layer
            // (the check runs after each option, which inserts at most one state per member).
            layers.begin(layers.cur_keys.len().saturating_mul(branching).min(budget.saturating_add(65)));
            // Bounds on what candidates j+1.. can still add: the rows of layer j+1.
            let layer = j + 1;
            let kc_row = if bounded { &kc[layer * ks..(layer + 1) * ks] } else { &[][..] };
            let vt_row = if bounded { &vt[layer * vs..(layer + 1) * vs] } else { &[][..] };
            let wq = it.wq;
            for si in 0..layers.cur_keys.len() {
                let key = layers.cur_keys[si];
                let obj = layers.cur_obj[si];
                // Decode the residuals; the bound on any completion (module doc) is the
                // per-group credit knapsack on the pooled residual, then the (ready, tokens,
                // count) knapsack on the total residual.
                let (mut csum, mut rsum, mut f) = (0u64, 0u64, 0usize);
                for (g, grp) in prep.groups.iter().enumerate() {
                    let mut r = 0;
                    for p in 0..grp.members.len() {
                        res[f] = grp.field(key, p);
                        r += res[f];
                        f += 1;
                    }
                    pooled[g] = r;
                    rsum += r;
                    if let (true, Some(off)) = (bounded, grp.kc_off) {
                        csum += kc_row[off + r as usize];
                    }
                }
                let keep = !bounded || obj + (u128::from(csum) << 80) + vt_row[rsum as usize] >= *lb;
                // Skip candidate j.
                if keep {
                    layers.insert(key, obj, si, SKIP, lb);
                    if layers.next_keys.len() > budget {
                        *explored += layers.next_keys.len();
                        return Err(BudgetExceeded);
                    }
                }
                // Assign candidate j to one eligible group, at one member position of it.
                for (k, o) in opts.iter().enumerate() {
                    let grp = &prep.groups[o.group];
                    let nobj = obj + o.value;
                    if bounded {
                        let r = pooled[o.group];
                        if r < wq {
                            continue;
                        }
                        let mut c2 = csum;
                        if let Some(off) = grp.kc_off {
                            c2 = c2 - kc_row[off + r as usize] + kc_row[off + (r - wq) as usize];
                        }
                        if nobj + (u128::from(c2) << 80) + vt_row[(rsum - wq) as usize] < *lb {
                            continue;
                        }
                    }
                    let first = grp.first_pos;
                    let size = grp.members.len();
                    let choice_base = ((k as u16) + 1) << 8;
                    for p in 0..size {
                        let rp = res[first + p];
                        // Equal residuals are interchangeable: place into the first of them.
                        if rp < wq || (p > 0 && rp == res[first + p - 1]) {
                            continue;
                        }
                        let nkey = if size == 1 {
                            key - (wq << grp.shift)
                        } else {
                            place_in_group(key, grp, &res[first..first + size], p, wq)
                        };
                        layers.insert(nkey, nobj, si, choice_base | p as u16, lb);
                    }
                    if layers.next_keys.len() > budget {
                        *explored += layers.next_keys.len();
                        return Err(BudgetExceeded);
                    }
                }
            }
            if layers.next_keys.len() > beam {
                // Rank by (bound, objective, first reached): a total order, so the kept set does
                // not depend on the selection algorithm.
                ranked.clear();
                for (i, (&key, &obj)) in layers.next_keys.iter().zip(&layers.next_obj).enumerate() {
                    let (mut csum, mut rsum) = (0u64, 0u64);
                    for grp in &prep.groups {
                        let r: u64 = (0..grp.members.len()).map(|p| grp.field(key, p)).sum();
                        rsum += r;
                        if let (true, Some(off)) = (bounded, grp.kc_off) {
                            csum += kc_row[off + r as usize];
                        }
                    }
                    let ub = if bounded { obj + (u128::from(csum) << 80) + vt_row[rsum as usize] } else { obj };
                    ranked.push((std::cmp::Reverse(ub), std::cmp::Reverse(obj), i as u32));
                }
                ranked.select_nth_unstable(beam);
                ranked.truncate(beam);
                ranked.sort_unstable_by_key(|r| r.2);
                for (slot, r) in ranked.iter().enumerate() {
                    layers.next_keys[slot] = layers.next_keys[r.2 as usize];
                    layers.next_obj[slot] = layers.next_obj[r.2 as usize];
                }
                layers.next_keys.truncate(beam);
                layers.next_obj.truncate(beam);
            }
            *explored += layers.next_keys.len();
            layers.finish();
        }
        // The best final state; the first one reached wins a tie.
        let mut best: Option<usize> = None;
        for (i, &o) in layers.cur_obj.iter().enumerate() {
            if best.is_none_or(|b| o > layers.cur_obj[b]) {
                best = Some(i);
            }
        }
        Ok(best)
    }

    /// Walk the predecessor records back from final state `best` and map every placement onto a
    /// physical replica: `(candidate index, replica)` pairs.
    fn backtrack(&self, prep: &Prepared, best: usize) -> Vec<(usize, usize)> {
        let n = prep.items.len();
        let l = &self.layers;
        let mut placements = Vec::new();
        let mut idx = best;
        for layer in (1..=n).rev() {
            let at = l.layer_off[layer] + idx;
            let choice = l.rec_choice[at];
            if choice != SKIP {
                let k = (choice >> 8) as usize - 1;
                let p = (choice & 0xFF) as usize;
                placements.push((layer - 1, k, p));
            }
            idx = l.rec_pred[at] as usize;
        }
        placements.reverse();
        // Replay the canonical (sorted) residuals forward alongside the physical ones: the
        // position a placement chose holds a residual value that some member replica has now.
        let mut canon: Vec<Vec<u64>> = prep
            .groups
            .iter()
            .map(|g| {
                let mut v: Vec<u64> = g.members.iter().map(|&b| prep.cap_q[b]).collect();
                v.sort_unstable();
                v
            })
            .collect();
        let mut phys = prep.cap_q.clone();
        let mut chosen = Vec::with_capacity(placements.len());
        for (j, k, p) in placements {
            let it = &prep.items[j];
            let o = prep.opts[it.opts.start + k];
            let g = &prep.groups[o.group];
            let v = &mut canon[o.group];
            let r = v[p];
            let b = g.members.iter().copied().find(|&b| phys[b] == r).unwrap_or(g.members[0]);
            debug_assert_eq!(phys[b], r);
            phys[b] -= it.wq;
            v[p] -= it.wq;
            v.sort_unstable();
            chosen.push((it.cand, b));
        }
        chosen
    }
}

/// The key after placing w̄ into position `p` of `grp` (whose current fields are `fields`),
/// with the group's fields re-sorted ascending.
fn place_in_group(key: u64, grp: &Group, fields: &[u64], p: usize, wq: u64) -> u64 {
    let mut f = [0u64; 64];
    let size = fields.len();
    f[..size].copy_from_slice(fields);
    f[p] -= wq;
    let mut i = p;
    while i > 0 && f[i - 1] > f[i] {
        f.swap(i - 1, i);
        i -= 1;
    }
    let bits = grp.width * size as u32;
    let clear = if bits == 64 { u64::MAX } else { ((1u64 << bits) - 1) << grp.shift };
    let mut out = key & !clear;
    for (q, v) in f[..size].iter().enumerate() {
        out |= v << (grp.shift + q as u32 * grp.width);
    }
    out
}

/// The incumbent for bound pruning: a credit-first greedy plan's packed objective. Per credited
/// group, the credit knapsack's optimal set (backtracked from the bound table's first layer) is
/// placed best-fit on the group's members; every other item then goes, in processing order, to
/// the eligible replica where its value is highest (ties: smallest residual that fits, then
/// lowest index). Any feasible plan would do; a good one prunes more.
fn incumbent(prep: &Prepared, kc: &[u64]) -> u128 {
    let n = prep.items.len();
    let ks = prep.kc_stride;
    let mut phys = prep.cap_q.clone();
    let mut taken = vec![false; n];
    let mut obj = 0u128;
    for (g, grp) in prep.groups.iter().enumerate() {
        let Some(off) = grp.kc_off else { continue };
        let mut c = grp.cap as usize;
        for j in 0..n {
            if kc[j * ks + off + c] == kc[(j + 1) * ks + off + c] {
                continue;
            }
            let it = &prep.items[j];
            let Some(o) = prep.opts[it.opts.clone()].iter().find(|o| o.group == g) else { continue };
            c -= it.wq as usize;
            if taken[j] {
                continue;
            }
            let fit = grp.members.iter().copied().filter(|&b| phys[b] >= it.wq).min_by_key(|&b| (phys[b], b));
            if let Some(b) = fit {
                phys[b] -= it.wq;
                taken[j] = true;
                obj += o.value;
            }
        }
    }
    for (j, it) in prep.items.iter().enumerate() {
        if taken[j] {
            continue;
        }
        let mut best: Option<(u128, u64, usize)> = None;
        for o in &prep.opts[it.opts.clone()] {
            for &b in &prep.groups[o.group].members {
                if phys[b] < it.wq {
                    continue;
                }
                let better = match best {
                    None => true,
                    Some((v, r, bb)) => o.value > v || (o.value == v && (phys[b], b) < (r, bb)),
                };
                if better {
                    best = Some((o.value, phys[b], b));
                }
            }
        }
        if let Some((v, _, b)) = best {
            phys[b] -= it.wq;
            obj += v;
        }
    }
    obj
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(session: u64, weight: u64, ready: bool, tokens: u64, options: &[(usize, u64)]) -> Candidate {
        Candidate { session, signature: session * 7, weight, ready, tokens, options: options.to_vec() }
    }

    #[test]
    fn packing_is_lexicographic() {
        let a = pack(1, false, 0, 1);
        let b = pack(0, true, (1 << 48) - 1, 1);
        assert!(a > b);
        assert_eq!(
            unpack(a + b),
            Objective { credit_sum: 1, ready_count: 1, token_sum: (1 << 48) - 1, admitted_count: 2 }
        );
    }

    #[test]
    fn credit_outranks_tokens_and_joint_placement_beats_greedy() {
        // Two replicas of 4 quanta. Session 1 (3 quanta) has credit on replica 0; session 2
        // (3 quanta) has more tokens and credit on replica 0 too but less of it; session 3 (1
        // quantum) is ready. Best: 1 → 0 (credit 100), 2 → 1 (no credit), 3 → 0.
        let p = Problem {
            candidates: vec![
                cand(1, 3, false, 10, &[(0, 100), (1, 0)]),
                cand(2, 3, false, 50, &[(0, 60), (1, 0)]),
                cand(3, 1, true, 5, &[(0, 0), (1, 0)]),
            ],
            capacities: vec![4, 4],
            quantum: 1,
            state_budget: 1000,
        };
        let plan = solve(&p).unwrap();
        assert!(!plan.fallback);
        assert_eq!(plan.objective, Objective { credit_sum: 100, ready_count: 1, token_sum: 65, admitted_count: 3 });
        let at: Vec<(u64, usize)> = plan.assignments.iter().map(|a| (a.session, a.replica)).collect();
        assert_eq!(at, vec![(1, 0), (3, 0), (2, 1)]);
    }

    #[test]
    fn grouped_replicas_map_back_to_physical_ones() {
        // Three equivalent replicas with different capacities: grouping sorts their residuals,
        // and the plan must still respect each physical capacity.
        let all = [(0, 0), (1, 0), (2, 0)];
        let p = Problem {
            candidates: (0..6).map(|i| cand(i, 1 + i % 3, i % 2 == 0, 10 + i, &all)).collect(),
            capacities: vec![2, 5, 3],
            quantum: 1,
            state_budget: 10_000,
        };
        let plan = solve(&p).unwrap();
        let mut used = [0u64; 3];
        for a in &plan.assignments {
            used[a.replica] += a.weight;
        }
        assert!(used.iter().zip(&p.capacities).all(|(u, c)| u <= c), "{used:?}");
        let flat = Solver::new()
            .solve_with(&p, SolveOptions { grouping: false, bound_pruning: false, ..SolveOptions::default() })
            .unwrap();
        assert_eq!(plan.objective, flat.objective);
    }

    #[test]
    fn the_budget_falls_back_to_bfd() {
        let all = [(0, 0), (1, 0)];
        let p = Problem {
            candidates: (0..8).map(|i| cand(i, 1 + i % 4, false, 100 + i, &all)).collect(),
            capacities: vec![9, 7],
            quantum: 1,
            state_budget: 2,
        };
        let plan = Solver::new()
            .solve_with(&p, SolveOptions { grouping: false, bound_pruning: false, ..SolveOptions::default() })
            .unwrap();
        assert!(plan.fallback);
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        let mut p = Problem {
            candidates: vec![cand(1, 1, false, 1, &[(0, 0)])],
            capacities: vec![4],
            quantum: 0,
            state_budget: 9,
        };
        assert_eq!(solve(&p), Err(TaoError::ZeroQuantum));
        p.quantum = 1;
        p.candidates.push(cand(1, 1, false, 1, &[(0, 0)]));
        assert_eq!(solve(&p), Err(TaoError::DuplicateSession(1)));
        p.candidates[1] = cand(2, 1, false, 1, &[(3, 0)]);
        assert!(matches!(solve(&p), Err(TaoError::UnknownReplica { replica: 3, .. })));
        p.candidates[1] = cand(2, 1, false, 1, &[(0, 0), (0, 5)]);
        assert!(matches!(solve(&p), Err(TaoError::DuplicateOption { replica: 0, .. })));
        p.candidates[1] = cand(2, 1, false, 1 << 48, &[(0, 0)]);
        assert!(matches!(solve(&p), Err(TaoError::ValueRange { what: "tokens", .. })));
    }

    #[test]
    fn quantization_rounds_weights_up_and_capacities_down() {
        // Δ = 2048: a 2,049-token session needs 2 quanta; 4,095 tokens of room is 1 quantum.
        let p = Problem {
            candidates: vec![cand(1, 2049, false, 1, &[(0, 0)]), cand(2, 2048, false, 1, &[(0, 0)])],
            capacities: vec![4095],
            quantum: 2048,
            state_budget: 100,
        };
        let plan = solve(&p).unwrap();
        assert_eq!(plan.assignments.len(), 1);
        assert_eq!(plan.assignments[0].session, 2);
    }
}
