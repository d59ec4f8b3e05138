//! The paged KV-cache block pool with automatic prefix caching, after vLLM V1's
//! `BlockPool` / `FreeKVCacheBlockQueue`: blocks are reference counted; a full prompt block is
//! identified by a chained hash supplied by the caller; freed blocks keep their hash and join
//! the tail of one free queue, so later prompts with the same hash prefix reuse them, and an
//! allocation takes the queue's head — the least recently freed block — evicting its hash.
//!
//! Every operation is O(1) (the free queue is an intrusive doubly linked list over block ids)
//! except the prefix lookup, O(matched blocks), and the table's occasional sweep of evicted
//! entries (a pass over the table once its stale entries outnumber the live ones and 4,096).
//! Depends on nothing else in the crate.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasherDefault, Hasher};

/// The hasher of [`BlockPool`]'s prefix-cache table. Its keys are prefix hashes already, so a
/// SipHash round over them (the standard library's default, built to resist chosen keys, which
/// nothing here needs) only costs: one SplitMix64 finalizer spreads them over the table.
#[derive(Debug, Default, Clone, Copy)]
pub struct PrefixHasher(u64);

impl Hasher for PrefixHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = self.0.rotate_left(29) ^ i;
    }
}

const NIL: u32 = u32::MAX;

/// One KV block's state, kept together: an allocation, a release or a hit reads and writes
/// a block's count, hash and free-queue links at once (and its neighbours' links), so one
/// record per block keeps them on one cache line, where four parallel arrays spread them over four.
#[derive(Debug, Clone, Copy)]
struct Block {
    /// The prefix hash the block holds, if it is registered in `cached`: the truth of what is
    /// cached (an entry of `cached` counts only while its block still holds its hash).
    hash: Option<u64>,
    ref_count: u32,
    /// Free-queue neighbours (`NIL` at the ends and while the block is referenced).
    prev: u32,
    next: u32,
}

/// The KV blocks of one replica.
#[derive(Debug, Clone)]
pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    free_len: u32,
    /// Hash → the block holding it. Only looked up, never iterated, so its order cannot leak
    /// (nor its hasher's choice). An eviction leaves its entry behind (a table removal is a
    /// cache miss on a table of every replica's cached blocks, paid at most allocations once
    /// generated blocks are hashed too): such an entry is *stale* — its block holds another
    /// hash or none — and is ignored by [`lookup`](Self::lookup) and [`register`](Self::register),
    /// overwritten when its hash is registered again, and swept once the stale entries
    /// outnumber the live ones.
    cached: HashMap<u64, u32, BuildHasherDefault<PrefixHasher>>,
    /// Entries of `cached` whose block no longer holds their hash.
    stale: usize,
    evictions: u64,
    /// Sweeps so far (the unit tests check that theirs sweep).
    #[cfg(test)]
    sweeps: u32,
}

/// Stale table entries tolerated before a sweep, whatever the live count (a handful in the
/// unit tests, so that their short runs sweep many times).
#[cfg(not(test))]
const STALE_SLACK: usize = 4096;
#[cfg(test)]
const STALE_SLACK: usize = 8;

impl BlockPool {
    /// A pool of `blocks` free, empty blocks.
    pub fn new(blocks: u32) -> Self {
        let n = blocks as usize;
        let mut pool = BlockPool {
            blocks: vec![Block { hash: None, ref_count: 0, prev: NIL, next: NIL }; n],
            head: NIL,
            tail: NIL,
            free_len: 0,
            cached: HashMap::default(),
            stale: 0,
            evictions: 0,
            #[cfg(test)]
            sweeps: 0,
        };
        for b in 0..blocks {
            pool.push_tail(b);
        }
        pool
    }

    /// Empties the pool: every block free, no hash cached (sleep, unload).
    pub fn reset(&mut self) {
        *self = BlockPool::new(self.total());
    }

    pub fn total(&self) -> u32 {
        self.blocks.len() as u32
    }

    /// Blocks an allocation can take (free, whether or not they still hold a cached prefix).
    pub fn free(&self) -> u32 {
        self.free_len
    }

    /// Blocks referenced by at least one request.
    pub fn in_use(&self) -> u32 {
        self.total() - self.free_len
    }

    /// Cached blocks evicted so far to make room.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// The block caching `hash`, if any.
    pub fn lookup(&self, hash: u64) -> Option<u32> {
        self.cached.get(&hash).copied().filter(|&b| self.blocks[b as usize].hash == Some(hash))
    }

    /// Whether `block` sits in the free queue (reference count zero).
    pub fn is_free(&self, block: u32) -> bool {
        self.blocks[block as usize].ref_count == 0
    }

    /// Takes a reference on a cached block found by [`lookup`](Self::lookup), taking it out of
    /// the free queue if nobody held it.
    pub fn touch(&mut self, block: u32) {
        let i = block as usize;
        if self.blocks[i].ref_count == 0 {
            self.unlink(block);
        }
        self.blocks[i].ref_count += 1;
    }

    /// Allocates the least recently freed block, evicting the prefix it cached. `None` when
    /// no block is free.
    pub fn allocate(&mut self) -> Option<u32> {
        let block = self.head;
        if block == NIL {
            return None;
        }
        self.unlink(block);
        let i = block as usize;
        if self.blocks[i].hash.take().is_some() {
            // Its table entry is stale from now on (see `cached`).
            self.stale += 1;
            self.evictions += 1;
            if self.stale > STALE_SLACK && self.stale > self.cached.len() - self.stale {
                self.sweep();
            }
        }
        self.blocks[i].ref_count = 1;
        Some(block)
    }

    /// Drops one reference; at zero the block joins the free queue's tail, keeping its hash.
    pub fn release(&mut self, block: u32) {
        let i = block as usize;
        let b = &mut self.blocks[i];
        debug_assert!(b.ref_count > 0, "double free of block {block}");
        b.ref_count = b.ref_count.saturating_sub(1);
        if b.ref_count == 0 {
            self.push_tail(block);
        }
    }

    /// Registers `block` as holding the prefix `hash`. If another block already caches that
    /// hash (two requests computed the same prefix at once) the first one stays cached and
    /// this block remains private. Returns whether the block was registered.
    pub fn register(&mut self, block: u32, hash: u64) -> bool {
        if self.blocks[block as usize].hash.is_some() {
            return false;
        }
        match self.cached.entry(hash) {
            Entry::Occupied(mut e) => {
                if self.blocks[*e.get() as usize].hash == Some(hash) {
                    // A live holder: the first one stays cached.
                    return false;
                }
                // A stale entry of the same hash: overwritten.
                e.insert(block);
                self.stale -= 1;
            }
            Entry::Vacant(e) => {
                e.insert(block);
            }
        }
        self.blocks[block as usize].hash = Some(hash);
        true
    }

    /// Drops the stale entries of the table.
    fn sweep(&mut self) {
        let blocks = &self.blocks;
        self.cached.retain(|&h, &mut b| blocks[b as usize].hash == Some(h));
        self.stale = 0;
        #[cfg(test)]
        {
            self.sweeps += 1;
        }
    }

    /// Each block's registered prefix hash, and the free queue from head to tail: the state
    /// that decides later hits and evictions (tests compare two pools by it).
    #[cfg(test)]
    pub(crate) fn cache_state(&self) -> (Vec<Option<u64>>, Vec<u32>) {
        let mut free = Vec::with_capacity(self.free_len as usize);
        let mut b = self.head;
        while b != NIL {
            free.push(b);
            b = self.blocks[b as usize].next;
        }
        (self.blocks.iter().map(|b| b.hash).collect(), free)
    }

    fn push_tail(&mut self, block: u32) {
        let i = block as usize;
        self.blocks[i].prev = self.tail;
        self.blocks[i].next = NIL;
        if self.tail == NIL {
            self.head = block;
        } else {
            self.blocks[self.tail as usize].next = block;
        }
        self.tail = block;
        self.free_len += 1;
    }

    fn unlink(&mut self, block: u32) {
        let i = block as usize;
        let (p, n) = (self.blocks[i].prev, self.blocks[i].next);
        if p == NIL {
            self.head = n;
        } else {
            self.blocks[p as usize].next = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.blocks[n as usize].prev = p;
        }
        self.blocks[i].prev = NIL;
        self.blocks[i].next = NIL;
        self.free_len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_lru_and_evicts_hashes() {
        let mut pool = BlockPool::new(3);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert!(pool.register(a, 11));
        assert!(pool.register(b, 22));
        assert_eq!(pool.in_use(), 2);
        // Free b before a: b is the least recently freed after the never-used third block.
        pool.release(b);
        pool.release(a);
        assert_eq!(pool.free(), 3);
        assert_eq!(pool.lookup(11), Some(a));
        let c = pool.allocate().unwrap();
        assert!(c != a && c != b, "the never-used block goes first");
        let d = pool.allocate().unwrap();
        assert_eq!(d, b, "then the least recently freed");
        assert_eq!(pool.lookup(22), None, "its hash is evicted");
        assert_eq!(pool.evictions(), 1);
        assert_eq!(pool.lookup(11), Some(a));
        assert!(pool.allocate().is_some());
        assert!(pool.allocate().is_none());
    }

    #[test]
    fn touching_a_free_cached_block_takes_it_out_of_the_queue() {
        let mut pool = BlockPool::new(2);
        let a = pool.allocate().unwrap();
        pool.register(a, 7);
        pool.release(a);
        assert!(pool.is_free(a));
        pool.touch(a);
        assert!(!pool.is_free(a));
        assert_eq!(pool.free(), 1);
        let other = pool.allocate().unwrap();
        assert_ne!(other, a);
        assert!(pool.allocate().is_none());
        // Shared: two references, freed after both release.
        pool.touch(a);
        pool.release(a);
        assert!(!pool.is_free(a));
        pool.release(a);
        assert!(pool.is_free(a));
    }

    /// The pool as first written: every eviction removes its table entry at once.
    struct EagerPool {
        queue: Vec<u32>,
        refs: Vec<u32>,
        hash: Vec<Option<u64>>,
        cached: HashMap<u64, u32>,
        evictions: u64,
    }

    impl EagerPool {
        fn new(n: u32) -> Self {
            EagerPool { queue: (0..n).collect(), refs: vec![0; n as usize], hash: vec![None; n as usize], cached: HashMap::new(), evictions: 0 }
        }
        fn allocate(&mut self) -> Option<u32> {
            if self.queue.is_empty() {
                return None;
            }
            let b = self.queue.remove(0);
            if let Some(h) = self.hash[b as usize].take() {
                self.cached.remove(&h);
                self.evictions += 1;
            }
            self.refs[b as usize] = 1;
            Some(b)
        }
        fn release(&mut self, b: u32) {
            self.refs[b as usize] -= 1;
            if self.refs[b as usize] == 0 {
                self.queue.push(b);
            }
        }
        fn touch(&mut self, b: u32) {
            if self.refs[b as usize] == 0 {
                self.queue.retain(|&x| x != b);
            }
            self.refs[b as usize] += 1;
        }
        fn register(&mut self, b: u32, h: u64) -> bool {
            if self.cached.contains_key(&h) || self.hash[b as usize].is_some() {
                return false;
            }
            self.cached.insert(h, b);
            self.hash[b as usize] = Some(h);
            true
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(12))]

        /// Leaving evicted entries in the table (and sweeping them now and then) answers every
        /// lookup, registration and allocation as removing them at once does — over runs that
        /// sweep (checked), with hashes that come back after their eviction.
        #[test]
        fn stale_entries_change_no_answer(ops in proptest::collection::vec((0u8..4, 0u64..96), 2_000..20_000)) {
            let n = 24;
            let (mut lazy, mut eager) = (BlockPool::new(n), EagerPool::new(n));
            let mut held: Vec<u32> = Vec::new();
            for (op, x) in ops {
                match op {
                    0 => {
                        let (a, b) = (lazy.allocate(), eager.allocate());
                        proptest::prop_assert_eq!(a, b);
                        held.extend(a);
                    }
                    1 if !held.is_empty() => {
                        let b = held.swap_remove(x as usize % held.len());
                        lazy.release(b);
                        eager.release(b);
                    }
                    2 if !held.is_empty() => {
                        let b = held[x as usize % held.len()];
                        proptest::prop_assert_eq!(lazy.register(b, x), eager.register(b, x));
                    }
                    _ => {
                        let found = lazy.lookup(x);
                        proptest::prop_assert_eq!(found, eager.cached.get(&x).copied());
                        if let Some(b) = found {
                            lazy.touch(b);
                            eager.touch(b);
                            held.push(b);
                        }
                    }
                }
                proptest::prop_assert_eq!(lazy.evictions(), eager.evictions);
                proptest::prop_assert_eq!(lazy.free() as usize, eager.queue.len());
            }
            proptest::prop_assert!(lazy.sweeps > 0, "no sweep in {} stale entries", lazy.stale);
            // At most the live entries (one per block) and as many stale ones, or the slack.
            proptest::prop_assert!(lazy.cached.len() <= 2 * (n as usize).max(STALE_SLACK) + 1, "swept: {} entries", lazy.cached.len());
            for x in 0..96 {
                proptest::prop_assert_eq!(lazy.lookup(x), eager.cached.get(&x).copied());
            }
        }
    }

    #[test]
    fn duplicate_hashes_keep_the_first_block() {
        let mut pool = BlockPool::new(2);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert!(pool.register(a, 5));
        assert!(!pool.register(b, 5));
        assert_eq!(pool.lookup(5), Some(a));
        pool.reset();
        assert_eq!((pool.free(), pool.lookup(5)), (2, None));
    }
}
