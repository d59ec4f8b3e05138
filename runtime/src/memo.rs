//! A memo of bounded size for the process-wide caches of pure functions (token encodings,
//! tool outcomes): two generations of a hash map under a cost budget. Entries go into the
//! current generation; when its cost would pass the budget it becomes the previous one (the
//! older previous generation is dropped) and a new one starts; both answer lookups. So memory
//! stays within about twice the budget however long a run is, and what was used within the
//! last generation or two stays cached (an entry dropped with its generation is computed
//! again when next needed).
//!
//! Only looked up and inserted, never iterated, so neither its order nor its hash function can
//! leak into results (the hash is a fast multiplicative one, [`FastHasher`]; nothing here needs
//! resistance to chosen keys); what it returns is what the memoised function would compute.
//! Depends on nothing else in the crate.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// A word-at-a-time multiplicative hash (FxHash's mixing step).
#[derive(Debug, Default, Clone, Copy)]
pub struct FastHasher(u64);

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

type Table<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// Two generations of memoised values (see the module doc).
#[derive(Debug)]
pub struct Memo<K, V> {
    current: Table<K, V>,
    previous: Table<K, V>,
    /// Cost of the entries of `current`.
    used: usize,
    budget: usize,
}

impl<K: Hash + Eq, V> Memo<K, V> {
    /// An empty memo whose generations hold up to `budget` of cost each.
    pub fn new(budget: usize) -> Self {
        Memo { current: Table::default(), previous: Table::default(), used: 0, budget }
    }

    /// The value memoised under `key`, if it is still kept.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.current.get(key).or_else(|| self.previous.get(key))
    }

    /// Memoise `value` under `key`; `cost` is what it counts against the budget (its bytes,
    /// roughly).
    pub fn insert(&mut self, key: K, value: V, cost: usize) {
        if self.used.saturating_add(cost) > self.budget && !self.current.is_empty() {
            self.previous = std::mem::take(&mut self.current);
            self.used = 0;
        }
        self.used = self.used.saturating_add(cost);
        self.current.insert(key, value);
    }

    /// Entries kept (both generations).
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_two_generations_within_the_budget() {
        let mut m: Memo<u32, u32> = Memo::new(10);
        for k in 0..5 {
            m.insert(k, k * 10, 2);
        }
        // 0..5 fill the first generation (cost 10); 5 starts the second.
        m.insert(5, 50, 2);
        assert_eq!(m.len(), 6);
        assert_eq!(m.get(&0), Some(&0), "the previous generation still answers");
        for k in 6..20 {
            m.insert(k, k * 10, 2);
        }
        assert!(m.len() <= 10, "{}", m.len());
        assert_eq!(m.get(&1), None, "dropped with its generation");
        assert_eq!(m.get(&19), Some(&190));
        assert_eq!(m.get(&14), Some(&140));
    }

    #[test]
    fn keys_borrow_and_hash_like_their_owned_form() {
        let mut m: Memo<Box<[u8]>, usize> = Memo::new(1 << 20);
        let words = ["", "a", "abcdefgh", "abcdefghi", "a much longer piece of text, past two words"];
        for (i, w) in words.iter().enumerate() {
            m.insert(w.as_bytes().into(), i, w.len() + 1);
        }
        for (i, w) in words.iter().enumerate() {
            assert_eq!(m.get(w.as_bytes()), Some(&i), "{w:?}");
        }
        assert_eq!(m.get(b"abcdefg".as_slice()), None);
    }
}
