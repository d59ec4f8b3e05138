//! Token counting and prefix-block hashing with a real BPE tokenizer (tiktoken's `o200k_base`,
//! whose ranks ship inside the `tiktoken-rs` crate: nothing is downloaded at run time).
//!
//! Qwen3's own tokenizer is a different BPE; `o200k_base` is a close stand-in for English text
//! and code (both are byte-level BPEs with ~150–200k merges). Encodings are cached by content
//! so that a transcript shared by many prompts is encoded once. A prompt is encoded segment by
//! segment (static template text, inputs, predecessor outputs) and the ids concatenated; this
//! differs from encoding the joined string only at segment boundaries (at most one token each).
//!
//! Depends on nothing else in the crate.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

use tiktoken_rs::CoreBPE;

fn bpe() -> &'static CoreBPE {
    static BPE: OnceLock<CoreBPE> = OnceLock::new();
    BPE.get_or_init(|| match tiktoken_rs::o200k_base() {
        Ok(b) => b,
        // The ranks are compiled into the crate; failing to parse them is a build defect.
        Err(e) => panic!("tiktoken o200k_base ranks failed to load: {e}"),
    })
}

type Cache = Mutex<HashMap<u64, Arc<[u32]>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

fn content_key(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// Encode `text` into token ids (cached by content).
pub fn encode(text: &str) -> Arc<[u32]> {
    if text.is_empty() {
        return Arc::from(Vec::new());
    }
    let key = content_key(text);
    if let Ok(guard) = cache().lock() {
        if let Some(ids) = guard.get(&key) {
            return Arc::clone(ids);
        }
    }
    let ids: Arc<[u32]> = bpe().encode_ordinary(text).into_iter().collect();
    if let Ok(mut guard) = cache().lock() {
        // Bound the cache: a long run of distinct texts must not grow memory without limit.
        if guard.len() > 200_000 {
            guard.clear();
        }
        guard.insert(key, Arc::clone(&ids));
    }
    ids
}

/// Number of tokens of `text`.
pub fn count(text: &str) -> usize {
    encode(text).len()
}

/// Decode token ids back into text; bytes that do not form valid UTF-8 (a character split
/// across tokens at either end) become U+FFFD.
pub fn decode(ids: &[u32]) -> String {
    match bpe().decode_bytes(ids) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(_) => String::new(),
    }
}

/// Keep at most `max_tokens` tokens of `text`, cut back to the last whole character.
pub fn truncate(text: &str, max_tokens: usize) -> String {
    let ids = encode(text);
    if ids.len() <= max_tokens {
        return text.to_string();
    }
    let Ok(bytes) = bpe().decode_bytes(&ids[..max_tokens]) else { return String::new() };
    match std::str::from_utf8(&bytes) {
        Ok(s) => s.to_string(),
        Err(e) => String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned(),
    }
}

/// Encode a prompt given as segments; ids are concatenated in order.
pub fn encode_segments<S: AsRef<str>>(segments: &[S]) -> Vec<u32> {
    let mut out = Vec::new();
    for s in segments {
        out.extend_from_slice(&encode(s.as_ref()));
    }
    out
}

/// Hash chain over full blocks of `block_size` tokens, as vLLM's automatic prefix caching
/// keys its KV blocks: block i's hash covers every token of blocks 0..=i. A trailing partial
/// block has no hash (it cannot be shared).
pub fn block_hashes(ids: &[u32], block_size: usize) -> Vec<u64> {
    let block_size = block_size.max(1);
    let mut out = Vec::with_capacity(ids.len() / block_size);
    let mut parent: u64 = 0x5157_4954_4348_5944; // arbitrary non-zero root
    for block in ids.chunks_exact(block_size) {
        let mut h = DefaultHasher::new();
        parent.hash(&mut h);
        block.hash(&mut h);
        parent = h.finish();
        out.push(parent);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_real_bpe_counts() {
        assert_eq!(count(""), 0);
        assert_eq!(count("hello"), 1);
        // A repeated word is far fewer tokens than characters.
        let text = "the quick brown fox ".repeat(50);
        let n = count(&text);
        assert!(n >= 150 && n <= 250, "{n}");
    }

    #[test]
    fn round_trip_and_truncate() {
        let text = "Janet sells 16 - 3 - 4 = 9 duck eggs a day.";
        assert_eq!(decode(&encode(text)), text);
        let t = truncate(text, 3);
        assert_eq!(count(&t), 3);
        assert!(text.starts_with(&t));
        // A cut inside a multi-byte character keeps the whole characters before it.
        let cjk = "会议讨论了遥控器的电池问题。".repeat(3);
        for n in 1..count(&cjk) {
            let t = truncate(&cjk, n);
            assert!(cjk.starts_with(&t), "{n}: {t:?}");
            assert!(count(&t) <= n);
        }
    }

    #[test]
    fn block_hashes_share_a_prefix_and_diverge_after() {
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[40] = 999;
        let ha = block_hashes(&a, 16);
        let hb = block_hashes(&b, 16);
        assert_eq!(ha.len(), 4);
        assert_eq!(ha[..2], hb[..2]);
        assert_ne!(ha[2], hb[2]);
        assert_ne!(ha[3], hb[3]);
        assert_eq!(block_hashes(&a[..15], 16).len(), 0);
    }
}
