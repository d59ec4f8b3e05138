//! Token counting, Qwen3's chat template and prefix-block hashing with Qwen3's own tokenizer:
//! the byte-level BPE of `runtime/data/qwen3-tokenizer/tokenizer.json` (151,643 vocabulary
//! entries and 26 added tokens, NFC-normalised input), so counts are the ones a Qwen3 vLLM
//! server reports.
//!
//! The pipeline is Hugging Face `tokenizers`' for this file, re-implemented for speed (the
//! crate's fancy-regex pre-tokenizer and offset bookkeeping were most of a simulation's time):
//! split off added tokens (leftmost-longest, on the raw text), NFC-normalise the rest, split it
//! with a hand-written matcher of the file's pre-tokenizer regex (its `\p{L}`, `\p{N}` and `\s`
//! classes taken from `regex-syntax`, the tables the regex engines use), map bytes through
//! GPT-2's alphabet and apply the merges by rank (lowest rank first, leftmost on ties, as
//! `tokenizers`' `Word::merge_all`). Loading checks that the file's normalizer, pre-tokenizer
//! and model are the ones implemented here. `tokenizers` itself is the reference of the tests
//! (every dataset text the bundled workflows use, and adversarial strings), not a dependency.
//!
//! The file is embedded in the binary (`include_bytes!`): a moved binary or a `switchyard
//! emulate` child process counts the same, and there is no file to miss at run time. It is
//! parsed once, on first use; [`check`] parses it eagerly so a broken build fails at startup
//! with a [`TokenizerError`] rather than deep in a run.
//!
//! Chat requests: vLLM's chat completions render Qwen3's `chat_template`; for one user message
//! with the generation prompt and thinking disabled that is
//! `<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n`
//! ([`chat_prompt`], [`encode_chat`]); with thinking enabled (`enable_thinking`, the template's
//! default, for agents that declare `thinking_tokens`) the empty `<think></think>` block is
//! absent ([`chat_prompt_mode`], [`encode_chat_mode`]), so a thinking-off count is an upper
//! bound of either (what the loader's context checks use).
//!
//! Encodings are cached by content so that a transcript shared by many prompts is encoded once
//! (in a [`crate::memo::Memo`] of bounded size).
//! A prompt is encoded segment by segment (static template text, inputs, predecessor outputs)
//! and the ids concatenated; this differs from encoding the joined string only at segment
//! boundaries (at most a token or two each). Special tokens (`<|im_start|>`, …) in a text are
//! recognised, as vLLM does when it tokenises a rendered prompt.
//!
//! Depends on nothing else in the crate but `memo` (the bounded caches of encodings and
//! pre-tokens).

use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

use serde::Deserialize;
use unicode_normalization_alignments::{IsNormalized, UnicodeNormalization, is_nfc_quick};

use crate::memo::Memo;

/// Where the embedded tokenizer comes from (repository path), for error messages.
pub const TOKENIZER_PATH: &str = "runtime/data/qwen3-tokenizer/tokenizer.json";

static TOKENIZER_JSON: &[u8] =
    include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/data/qwen3-tokenizer/tokenizer.json"));


/// Qwen3's chat-template text before a user message's content.
pub const CHAT_USER_PREFIX: &str = "<|im_start|>user\n";
/// After the last message: end of turn and the generation prompt (`add_generation_prompt`).
const CHAT_GENERATION: &str = "<|im_end|>\n<|im_start|>assistant\n";
/// What the template adds after the generation prompt when `enable_thinking` is false.
const EMPTY_THINK: &str = "<think>\n\n</think>\n\n";

/// The pre-tokenizer's split pattern this module implements (Qwen2/Qwen3's), `Isolated`.
const SPLIT_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The tokenizer failed to load.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TokenizerError {
    #[error("the Qwen3 tokenizer embedded from {path} failed to load: {reason}")]
    Load { path: &'static str, reason: String },
}

/// A fast hasher for the merge table's (id, id) keys (FxHash's multiply-rotate).
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type PairMap = HashMap<(u32, u32), (u32, u32), BuildHasherDefault<PairHasher>>;

/// Character classes of the split pattern, from `regex-syntax` (sorted, disjoint ranges).
struct Classes {
    letter: Vec<(char, char)>,
    number: Vec<(char, char)>,
    space: Vec<(char, char)>,
    /// `(?i:x)` for each letter of the contractions: the characters that match it.
    folds: Vec<(char, Vec<(char, char)>)>,
}

fn class_ranges(pattern: &str) -> Result<Vec<(char, char)>, String> {
    use regex_syntax::hir::{Class, HirKind};
    let hir = regex_syntax::Parser::new().parse(pattern).map_err(|e| e.to_string())?;
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => Ok(c.ranges().iter().map(|r| (r.start(), r.end())).collect()),
        other => Err(format!("{pattern} is not a Unicode class: {other:?}")),
    }
}

fn in_ranges(ranges: &[(char, char)], c: char) -> bool {
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// Class of a character for the split pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cls {
    /// `\p{L}`.
    Letter,
    /// `\p{N}`.
    Number,
    /// `\r` or `\n` (also `\s`).
    Newline,
    /// `\s` other than `\r`, `\n`.
    Space,
    /// Anything else (`[^\s\p{L}\p{N}]`).
    Other,
}

impl Classes {
    fn load() -> Result<Self, String> {
        let folds = "strevmld"
            .chars()
            .map(|c| Ok((c, class_ranges(&format!("(?i:[{c}])"))?)))
            .collect::<Result<_, String>>()?;
        Ok(Classes {
            letter: class_ranges(r"\p{L}")?,
            number: class_ranges(r"\p{N}")?,
            space: class_ranges(r"\s")?,
            folds,
        })
    }

    /// Whether `x` matches `letter` case-insensitively (`(?i)`, Unicode simple case folding).
    fn folds_to(&self, x: Option<char>, letter: char) -> bool {
        let Some(x) = x else { return false };
        self.folds.iter().find(|(l, _)| *l == letter).is_some_and(|(_, ranges)| in_ranges(ranges, x))
    }

    #[inline]
    fn of(&self, c: char) -> Cls {
        if c.is_ascii() {
            return match c as u8 {
                b'a'..=b'z' | b'A'..=b'Z' => Cls::Letter,
                b'0'..=b'9' => Cls::Number,
                b'\r' | b'\n' => Cls::Newline,
                b'\t' | 0x0b | 0x0c | b' ' => Cls::Space,
                _ => Cls::Other,
            };
        }
        if in_ranges(&self.letter, c) {
            Cls::Letter
        } else if in_ranges(&self.number, c) {
            Cls::Number
        } else if in_ranges(&self.space, c) {
            Cls::Space
        } else {
            Cls::Other
        }
    }
}

/// The loaded tokenizer.
struct Qwen3 {
    /// Merges: (left id, right id) → (rank, merged id).
    merges: PairMap,
    /// Bytes of each id (byte-level BPE tokens mapped back through GPT-2's byte alphabet;
    /// added tokens as their content).
    bytes: Vec<Box<[u8]>>,
    /// The id of each single-byte token (the BPE's initial symbols).
    byte_ids: [u32; 256],
    /// Added tokens (content, id), all matched on the raw text.
    added: Vec<(String, u32)>,
    classes: Classes,
}

/// GPT-2's byte-level alphabet: the printable character standing for each byte.
fn byte_alphabet() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0u32..256 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let c = if printable {
            b
        } else {
            extra += 1;
            255 + extra
        };
        out[b as usize] = char::from_u32(c).unwrap_or('\0');
    }
    out
}

#[derive(Deserialize)]
struct RawFile<'a> {
    added_tokens: Vec<RawAdded>,
    normalizer: serde_json::Value,
    pre_tokenizer: serde_json::Value,
    #[serde(borrow)]
    model: RawModel<'a>,
}

#[derive(Deserialize)]
struct RawAdded {
    id: u32,
    content: String,
    #[serde(default)]
    single_word: bool,
    #[serde(default)]
    lstrip: bool,
    #[serde(default)]
    rstrip: bool,
    #[serde(default)]
    normalized: bool,
}

/// A string of the file, borrowed when it has no escapes.
type Text<'a> = std::borrow::Cow<'a, str>;

type StrMap<'a> = HashMap<Text<'a>, u32, BuildHasherDefault<PairHasher>>;

#[derive(Deserialize)]
struct RawModel<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    dropout: Option<f64>,
    #[serde(default)]
    continuing_subword_prefix: Option<String>,
    #[serde(default)]
    end_of_word_suffix: Option<String>,
    #[serde(default)]
    byte_fallback: bool,
    #[serde(default)]
    ignore_merges: bool,
    #[serde(borrow)]
    vocab: StrMap<'a>,
    #[serde(borrow)]
    merges: Vec<RawMerge<'a>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawMerge<'a> {
    Pair(#[serde(borrow)] Text<'a>, #[serde(borrow)] Text<'a>),
    Joined(#[serde(borrow)] Text<'a>),
}

fn load() -> Result<Qwen3, TokenizerError> {
    load_from(TOKENIZER_JSON)
}

fn load_from(json: &[u8]) -> Result<Qwen3, TokenizerError> {
    let err = |reason: String| TokenizerError::Load { path: TOKENIZER_PATH, reason };
    let raw: RawFile = serde_json::from_slice(json).map_err(|e| err(e.to_string()))?;
    // Only the configuration implemented below is accepted.
    if raw.normalizer != serde_json::json!({"type": "NFC"}) {
        return Err(err(format!("normalizer {} is not NFC", raw.normalizer)));
    }
    let expected_pre = serde_json::json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": SPLIT_PATTERN}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]});
    if raw.pre_tokenizer != expected_pre {
        return Err(err(format!("pre-tokenizer {} is not Qwen3's", raw.pre_tokenizer)));
    }
    let m = &raw.model;
    let plain = m.kind == "BPE"
        && m.dropout.is_none()
        && m.continuing_subword_prefix.as_deref().unwrap_or("").is_empty()
        && m.end_of_word_suffix.as_deref().unwrap_or("").is_empty()
        && !m.byte_fallback
        && !m.ignore_merges;
    if !plain {
        return Err(err("the model is not a plain byte-level BPE".into()));
    }
    if let Some(a) = raw.added_tokens.iter().find(|a| a.single_word || a.lstrip || a.rstrip || a.normalized) {
        return Err(err(format!("added token {:?} has options this tokenizer does not implement", a.content)));
    }
    let alphabet = byte_alphabet();
    let mut char_byte: HashMap<char, u8> = HashMap::with_capacity(256);
    for (b, c) in alphabet.iter().enumerate() {
        char_byte.insert(*c, b as u8);
    }
    let n = m.vocab.values().copied().chain(raw.added_tokens.iter().map(|a| a.id)).max().map_or(0, |x| x + 1);
    let mut bytes: Vec<Box<[u8]>> = vec![Box::default(); n as usize];
    for (tok, &id) in &m.vocab {
        let mut v = Vec::with_capacity(tok.len());
        for c in tok.chars() {
            match char_byte.get(&c) {
                Some(b) => v.push(*b),
                None => return Err(err(format!("token {id} ({tok:?}) is not byte-level"))),
            }
        }
        bytes[id as usize] = v.into();
    }
    for a in &raw.added_tokens {
        bytes[a.id as usize] = a.content.as_bytes().into();
    }
    let mut byte_ids = [0u32; 256];
    for (b, c) in alphabet.iter().enumerate() {
        match m.vocab.get(c.to_string().as_str()) {
            Some(&id) => byte_ids[b] = id,
            None => return Err(err(format!("no token for byte {b:#04x}"))),
        }
    }
    let mut merges = PairMap::with_capacity_and_hasher(m.merges.len(), Default::default());
    let mut joined = String::new();
    for (rank, merge) in m.merges.iter().enumerate() {
        let (a, b) = match merge {
            RawMerge::Pair(a, b) => (a.as_ref(), b.as_ref()),
            RawMerge::Joined(s) => s.split_once(' ').ok_or_else(|| err(format!("merge {s:?} is not a pair")))?,
        };
        let id = |t: &str| m.vocab.get(t).copied().ok_or_else(|| err(format!("merge token {t:?} is not in the vocabulary")));
        joined.clear();
        joined.push_str(a);
        joined.push_str(b);
        let new_id = id(&joined)?;
        // Later duplicates win, as in `tokenizers` (the map is collected in order).
        merges.insert((id(a)?, id(b)?), (rank as u32, new_id));
    }
    let added = raw.added_tokens.iter().map(|a| (a.content.clone(), a.id)).collect();
    let classes = Classes::load().map_err(err)?;
    Ok(Qwen3 { merges, bytes, byte_ids, added, classes })
}

fn qwen3() -> Result<&'static Qwen3, TokenizerError> {
    static QWEN3: OnceLock<Result<Qwen3, TokenizerError>> = OnceLock::new();
    QWEN3.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn tok() -> &'static Qwen3 {
    match qwen3() {
        Ok(t) => t,
        // The file is compiled in and `check` runs at every CLI start and in the tests: a
        // failure here is a build defect, not something input can cause.
        Err(e) => panic!("{e}"),
    }
}

/// Load the tokenizer now; call at startup so a defect is an error, not a panic mid-run.
pub fn check() -> Result<(), TokenizerError> {
    qwen3().map(|_| ())
}

/// One entry of the merge queue: lowest rank first, then leftmost (`tokenizers`' `Merge`).
#[derive(PartialEq, Eq)]
struct Merge {
    pos: usize,
    rank: u32,
    new_id: u32,
}

impl Ord for Merge {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.rank.cmp(&self.rank).then_with(|| other.pos.cmp(&self.pos))
    }
}

impl PartialOrd for Merge {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: isize,
    next: isize,
    /// 0 once merged into its left neighbour.
    len: usize,
}

impl Qwen3 {
    /// The BPE of one pre-token (its bytes), appended to `out`: `tokenizers`' `Word::merge_all`.
    fn bpe(&self, piece: &[u8], out: &mut Vec<u32>) {
        if piece.len() == 1 {
            out.push(self.byte_ids[piece[0] as usize]);
            return;
        }
        let n = piece.len();
        let mut symbols: Vec<Symbol> = piece
            .iter()
            .enumerate()
            .map(|(i, &b)| Symbol {
                id: self.byte_ids[b as usize],
                prev: i as isize - 1,
                next: if i + 1 < n { i as isize + 1 } else { -1 },
                len: 1,
            })
            .collect();
        let mut queue: BinaryHeap<Merge> = symbols
            .windows(2)
            .enumerate()
            .filter_map(|(pos, w)| self.merges.get(&(w[0].id, w[1].id)).map(|&(rank, new_id)| Merge { pos, rank, new_id }))
            .collect();
        while let Some(top) = queue.pop() {
            if symbols[top.pos].len == 0 || symbols[top.pos].next == -1 {
                continue;
            }
            let next_pos = symbols[top.pos].next as usize;
            let right = symbols[next_pos];
            if self.merges.get(&(symbols[top.pos].id, right.id)).is_none_or(|&(_, id)| id != top.new_id) {
                continue;
            }
            symbols[top.pos].id = top.new_id;
            symbols[top.pos].len += right.len;
            symbols[top.pos].next = right.next;
            symbols[next_pos].len = 0;
            if right.next > -1 && (right.next as usize) < n {
                symbols[right.next as usize].prev = top.pos as isize;
            }
            let current = symbols[top.pos];
            if current.prev >= 0 {
                let prev = current.prev as usize;
                if let Some(&(rank, new_id)) = self.merges.get(&(symbols[prev].id, current.id)) {
                    queue.push(Merge { pos: prev, rank, new_id });
                }
            }
            if current.next >= 0 && (current.next as usize) < n
                && let Some(&(rank, new_id)) = self.merges.get(&(current.id, symbols[current.next as usize].id))
            {
                queue.push(Merge { pos: top.pos, rank, new_id });
            }
        }
        out.extend(symbols.iter().filter(|s| s.len != 0).map(|s| s.id));
    }

    /// Length in bytes of the pre-token starting at byte `i` of `s` (the split pattern's
    /// leftmost-first match there; every character is matched by some alternative).
    fn pre_token_len(&self, s: &str, i: usize) -> usize {
        let rest = &s[i..];
        let mut chars = rest.char_indices();
        let Some((_, c)) = chars.next() else { return 0 };
        let c_len = c.len_utf8();
        let cls = self.classes.of(c);
        let next = rest[c_len..].chars().next();
        // (?i:'s|'t|'re|'ve|'m|'ll|'d) — with Unicode simple case folding (`ſ` matches `s`).
        if c == '\'' {
            let after = &rest[1..];
            let mut it = after.chars();
            let first = it.next();
            let second = it.next();
            let folds = |x: Option<char>, letter: char| self.classes.folds_to(x, letter);
            for one in ['s', 't', 'm', 'd'] {
                if folds(first, one) {
                    return 1 + first.map_or(0, char::len_utf8);
                }
            }
            for (a, b) in [('r', 'e'), ('v', 'e'), ('l', 'l')] {
                if folds(first, a) && folds(second, b) {
                    return 1 + first.map_or(0, char::len_utf8) + second.map_or(0, char::len_utf8);
                }
            }
        }
        let letters_from = |from: usize| -> usize {
            // Length of the run of letters starting at byte `from` of `rest`.
            rest[from..].char_indices().find(|&(_, x)| self.classes.of(x) != Cls::Letter).map_or(rest.len() - from, |(j, _)| j)
        };
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if cls == Cls::Letter {
            return letters_from(0);
        }
        if matches!(cls, Cls::Space | Cls::Other) && next.is_some_and(|x| self.classes.of(x) == Cls::Letter) {
            return c_len + letters_from(c_len);
        }
        // \p{N}
        if cls == Cls::Number {
            return c_len;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let others_from = |from: usize| -> usize {
            let run = rest[from..].char_indices().find(|&(_, x)| self.classes.of(x) != Cls::Other).map_or(rest.len() - from, |(j, _)| j);
            let end = from + run;
            let newlines = rest.as_bytes()[end..].iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
            run + newlines
        };
        if cls == Cls::Other {
            return others_from(0);
        }
        if c == ' ' && next.is_some_and(|x| self.classes.of(x) == Cls::Other) {
            return 1 + others_from(1);
        }
        // Whitespace: the run starting here.
        let mut run_end = rest.len();
        let mut last_newline_end = None;
        let mut last_char_start = 0;
        for (j, x) in rest.char_indices() {
            match self.classes.of(x) {
                Cls::Newline => last_newline_end = Some(j + 1),
                Cls::Space => {}
                _ => {
                    run_end = j;
                    break;
                }
            }
            last_char_start = j;
        }
        // \s*[\r\n]+ — up to the run's last newline.
        if let Some(end) = last_newline_end {
            return end;
        }
        // \s+(?!\S) — the whole run at the end of the text, else all but its last character;
        // \s+ — a single whitespace character before a non-space.
        if run_end == rest.len() || last_char_start == 0 { run_end } else { last_char_start }
    }

    /// Encode text without added tokens: NFC, pre-tokenize, BPE (pieces through `cache`).
    fn encode_plain(&self, text: &str, cache: &mut PieceCache, out: &mut Vec<u32>) {
        let normalized;
        let text = if text.is_ascii() || is_nfc_quick(text.chars()) == IsNormalized::Yes {
            text
        } else {
            normalized = text.nfc().map(|(c, _)| c).collect::<String>();
            normalized.as_str()
        };
        let mut i = 0;
        while i < text.len() {
            let len = self.pre_token_len(text, i).max(1);
            let piece = &text.as_bytes()[i..i + len];
            if piece.len() == 1 {
                out.push(self.byte_ids[piece[0] as usize]);
            } else if let Some(ids) = cache.get(piece) {
                out.extend_from_slice(ids);
            } else {
                let start = out.len();
                self.bpe(piece, out);
                let ids: Box<[u32]> = out[start..].into();
                let cost = piece.len() + 4 * ids.len() + ENTRY_OVERHEAD;
                cache.insert(piece.into(), ids, cost);
            }
            i += len;
        }
    }

    /// Encode `text`: added tokens split off (leftmost-longest), the rest [`Qwen3::encode_plain`].
    fn encode(&self, text: &str, cache: &mut PieceCache) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 4);
        let bytes = text.as_bytes();
        let mut plain_start = 0;
        let mut i = 0;
        // Every added token starts with `<`.
        while let Some(off) = bytes[i..].iter().position(|&b| b == b'<') {
            let at = i + off;
            let best = self
                .added
                .iter()
                .filter(|(content, _)| bytes[at..].starts_with(content.as_bytes()))
                .max_by_key(|(content, _)| content.len());
            match best {
                Some((content, id)) => {
                    if plain_start < at {
                        self.encode_plain(&text[plain_start..at], cache, &mut out);
                    }
                    out.push(*id);
                    i = at + content.len();
                    plain_start = i;
                }
                None => i = at + 1,
            }
        }
        if plain_start < text.len() {
            self.encode_plain(&text[plain_start..], cache, &mut out);
        }
        out
    }
}

/// Bytes (roughly) each generation of the piece cache keeps: the pre-tokens of the texts seen
/// recur (words, numbers), so this holds the working vocabulary of a run.
const PIECE_CACHE_BYTES: usize = 4 << 20;

/// Bytes (roughly) each generation of the encoding cache keeps. Encodings are reused soon
/// after they are made (a prompt counted and hashed, a summary refitted), so a run's memory
/// need not grow with its length to keep them.
const ENCODING_CACHE_BYTES: usize = 8 << 20;

/// Cost counted per cache entry beyond its data (table slot, allocation headers).
const ENTRY_OVERHEAD: usize = 64;

type PieceCache = Memo<Box<[u8]>, Box<[u32]>>;

fn piece_cache() -> &'static Mutex<PieceCache> {
    static PIECES: OnceLock<Mutex<PieceCache>> = OnceLock::new();
    PIECES.get_or_init(|| Mutex::new(Memo::new(PIECE_CACHE_BYTES)))
}

type Cache = Mutex<Memo<u128, Arc<[u32]>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(Memo::new(ENCODING_CACHE_BYTES)))
}

/// A 128-bit digest of `text` (XXH3): the key of the caches of functions of long texts, which
/// keep no copy of the text they answer for. Two distinct texts share a key with probability
/// about 2⁻¹²⁸ per pair. XXH3 is not a cryptographic hash, and the front door counts served
/// prompts through this cache: a client able to craft a text with another's key would have its
/// count stand for the other's (a known limitation: with SHA-256 here, one run of 10,000
/// gsm8k+qmsum sessions took 64.6 s against 52.4–56.1 s).
pub(crate) fn content_key(text: &str) -> u128 {
    xxhash_rust::xxh3::xxh3_128(text.as_bytes())
}

fn encode_uncached(t: &Qwen3, text: &str) -> Arc<[u32]> {
    let mut pieces = piece_cache().lock().unwrap_or_else(|p| p.into_inner());
    t.encode(text, &mut pieces).into()
}

/// Encode `text` into token ids (cached by content).
pub fn encode(text: &str) -> Arc<[u32]> {
    if text.is_empty() {
        return Arc::from(Vec::new());
    }
    let key = content_key(text);
    if let Ok(guard) = cache().lock()
        && let Some(ids) = guard.get(&key)
    {
        return Arc::clone(ids);
    }
    let ids = encode_uncached(tok(), text);
    if let Ok(mut guard) = cache().lock() {
        guard.insert(key, Arc::clone(&ids), 4 * ids.len() + ENTRY_OVERHEAD);
    }
    ids
}

/// The most bytes one token stands for (Qwen3's longest, a run of 128 spaces; tested against
/// the vocabulary): a text of `n` bytes has at least `n / MAX_TOKEN_BYTES` tokens, so a text
/// too long for a context is known before it is tokenized.
pub const MAX_TOKEN_BYTES: usize = 128;

/// Whether `id` is a token of the vocabulary (one that decodes to text).
pub fn is_token(id: u32) -> bool {
    tok().bytes.get(id as usize).is_some_and(|b| !b.is_empty())
}

/// Number of tokens of `text`.
pub fn count(text: &str) -> usize {
    encode(text).len()
}

pub(crate) fn decode_bytes(ids: &[u32]) -> Vec<u8> {
    let t = tok();
    let mut out = Vec::with_capacity(ids.len() * 4);
    for &id in ids {
        if let Some(b) = t.bytes.get(id as usize) {
            out.extend_from_slice(b);
        }
    }
    out
}

/// Decode token ids back into text (special tokens kept as their text; unknown ids skipped);
/// bytes that do not form valid UTF-8 (a character split across tokens at either end) become
/// U+FFFD.
pub fn decode(ids: &[u32]) -> String {
    String::from_utf8_lossy(&decode_bytes(ids)).into_owned()
}

/// Keep at most `max_tokens` tokens of `text`, cut back to the last whole character.
pub fn truncate(text: &str, max_tokens: usize) -> String {
    let ids = encode(text);
    if ids.len() <= max_tokens {
        return text.to_string();
    }
    let bytes = decode_bytes(&ids[..max_tokens]);
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

/// Qwen3's generation prompt after the last message: `<|im_end|>\n<|im_start|>assistant\n`,
/// then the empty thinking block when `enable_thinking` is false.
pub fn chat_generation_suffix(enable_thinking: bool) -> String {
    if enable_thinking { CHAT_GENERATION.to_string() } else { format!("{CHAT_GENERATION}{EMPTY_THINK}") }
}

/// The text vLLM tokenises for a chat request of one user message `content` (thinking off,
/// generation prompt added).
pub fn chat_prompt(content: &str) -> String {
    chat_prompt_mode(content, false)
}

/// [`chat_prompt`] with `enable_thinking` as given.
pub fn chat_prompt_mode(content: &str, enable_thinking: bool) -> String {
    format!("{CHAT_USER_PREFIX}{content}{}", chat_generation_suffix(enable_thinking))
}

/// One message of a conversation as Qwen3's chat template reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatTurn {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    pub content: String,
    /// An assistant turn's tool calls.
    pub tool_calls: Vec<TurnToolCall>,
}

/// A tool call of an assistant turn: the function's name and its arguments as the OpenAI API
/// carries them (JSON text).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnToolCall {
    pub name: String,
    pub arguments: String,
}

/// Qwen3's chat template (`tokenizer_config.json`'s `chat_template`, without tool
/// definitions) over plain-text messages; [`chat_template_with_tools`] with no tools and no
/// tool calls:
///
/// - consecutive `tool` messages are one user turn of `<tool_response>` blocks;
/// - an assistant turn's reasoning (`<think>…</think>` in its content) is dropped when the turn
///   comes before the last user query (a user message that is not only a tool response), and
///   kept, re-rendered as `<think>\n{reasoning}\n</think>\n\n{answer}`, after it — so a
///   multi-turn prompt does not grow by the reasoning of earlier turns, and its prefix changes
///   from the first such turn on, as a real vLLM sees it;
/// - the generation prompt (`add_generation_prompt`) opens an assistant turn, with an empty
///   thinking block when `enable_thinking` is false.
pub fn chat_template(messages: &[(&str, &str)], enable_thinking: bool, add_generation_prompt: bool) -> String {
    let turns: Vec<ChatTurn> =
        messages.iter().map(|(role, content)| ChatTurn { role: (*role).into(), content: (*content).into(), tool_calls: Vec::new() }).collect();
    chat_template_with_tools(&turns, &[], enable_thinking, add_generation_prompt)
}

/// Qwen3's whole chat template, tools included, as vLLM 0.10 renders it for a chat request:
///
/// - with `tools` (the request's tool definitions, `{"type": "function", "function": {…}}`,
///   each rendered as vLLM passes it to the template: `render_tool`), a system turn opens the prompt: the first message's content when it
///   is a system message, then the `# Tools` block listing each definition as JSON within
///   `<tools></tools>` and the instruction to answer calls in `<tool_call></tool_call>`;
/// - an assistant turn's tool calls follow its content as `<tool_call>\n{"name": …,
///   "arguments": …}\n</tool_call>` blocks (vLLM parses the arguments' JSON text before
///   rendering, so they are re-serialised; text that is not JSON is kept as it is);
/// - the rest as [`chat_template`] says.
///
/// JSON is written as the template's `tojson` (Python's `json.dumps`: `", "` and `": "`
/// separators, non-ASCII kept); object keys come in serde_json's order (sorted), where Python
/// keeps the client's — a schema whose keys are not in alphabetical order may count a token
/// or two apart from vLLM's.
pub fn chat_template_with_tools(
    messages: &[ChatTurn],
    tools: &[serde_json::Value],
    enable_thinking: bool,
    add_generation_prompt: bool,
) -> String {
    let is_tool_response = |c: &str| c.starts_with("<tool_response>") && c.ends_with("</tool_response>");
    let last_query = messages
        .iter()
        .rposition(|m| m.role == "user" && !is_tool_response(&m.content))
        .unwrap_or(messages.len().saturating_sub(1));
    let mut out = String::new();
    let mut skip_first = false;
    if !tools.is_empty() {
        out.push_str("<|im_start|>system\n");
        if let Some(first) = messages.first().filter(|m| m.role == "system") {
            out.push_str(&first.content);
            out.push_str("\n\n");
            skip_first = true;
        }
        out.push_str("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        for tool in tools {
            out.push('\n');
            render_tool(tool, &mut out);
        }
        out.push_str("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
    }
    for (i, m) in messages.iter().enumerate() {
        if i == 0 && skip_first {
            continue;
        }
        match m.role.as_str() {
            "tool" => {
                if i == 0 || messages[i - 1].role != "tool" {
                    out.push_str("<|im_start|>user");
                }
                out.push_str("\n<tool_response>\n");
                out.push_str(&m.content);
                out.push_str("\n</tool_response>");
                if i + 1 == messages.len() || messages[i + 1].role != "tool" {
                    out.push_str("<|im_end|>\n");
                }
            }
            "assistant" => {
                let content = m.content.as_str();
                // The template's split: the answer after the last `</think>`, the reasoning
                // before the first one (after its `<think>`).
                let (reasoning, answer) = match content.split_once("</think>") {
                    Some((before, _)) => {
                        let answer = content.rsplit("</think>").next().unwrap_or("").trim_start_matches('\n');
                        let reasoning = before.trim_end_matches('\n').rsplit("<think>").next().unwrap_or("").trim_start_matches('\n');
                        (reasoning, answer)
                    }
                    None => ("", content),
                };
                out.push_str("<|im_start|>assistant\n");
                if i > last_query && (i + 1 == messages.len() || !reasoning.is_empty()) {
                    out.push_str("<think>\n");
                    out.push_str(reasoning.trim_matches('\n'));
                    out.push_str("\n</think>\n\n");
                    out.push_str(answer.trim_start_matches('\n'));
                } else {
                    out.push_str(answer);
                }
                for (k, call) in m.tool_calls.iter().enumerate() {
                    if k > 0 || !answer.is_empty() {
                        out.push('\n');
                    }
                    out.push_str("<tool_call>\n{\"name\": \"");
                    out.push_str(&call.name);
                    out.push_str("\", \"arguments\": ");
                    match serde_json::from_str::<serde_json::Value>(&call.arguments) {
                        Ok(args) => write_python_json(&args, &mut out),
                        Err(_) => out.push_str(&call.arguments),
                    }
                    out.push_str("}\n</tool_call>");
                }
                out.push_str("<|im_end|>\n");
            }
            r => {
                out.push_str("<|im_start|>");
                out.push_str(r);
                out.push('\n');
                out.push_str(&m.content);
                out.push_str("<|im_end|>\n");
            }
        }
    }
    if add_generation_prompt {
        out.push_str(CHAT_GENERATION.trim_start_matches("<|im_end|>\n"));
        if !enable_thinking {
            out.push_str(EMPTY_THINK);
        }
    }
    out
}

/// A tool definition as vLLM 0.10 hands it to the chat template (`ChatCompletionToolsParam`'s
/// `model_dump()`): `{"type": "function", "function": {"name", "description", "parameters",
/// …}}` in that order, an absent description or parameters as `null`, any further fields of
/// the function after them.
fn render_tool(tool: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    let empty = serde_json::Map::new();
    let function = tool.get("function").and_then(Value::as_object).unwrap_or(&empty);
    out.push_str("{\"type\": \"function\", \"function\": {");
    let declared = ["name", "description", "parameters"];
    for (i, key) in declared.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&format!("\"{key}\": "));
        write_python_json(function.get(*key).unwrap_or(&Value::Null), out);
    }
    for (k, v) in function.iter().filter(|(k, _)| !declared.contains(&k.as_str())) {
        out.push_str(", ");
        out.push_str(&Value::String(k.clone()).to_string());
        out.push_str(": ");
        write_python_json(v, out);
    }
    out.push_str("}}");
}

/// Python's `json.dumps(value, ensure_ascii=False)` (the chat template's `tojson`): `", "`
/// between items, `": "` after keys; strings escaped as Python escapes them (the same set as
/// serde_json: quote, backslash, `\n`-style and `\u00XX` control characters), keys in
/// serde_json's (sorted) order.
pub fn python_json(v: &serde_json::Value) -> String {
    let mut out = String::new();
    write_python_json(v, &mut out);
    out
}

fn write_python_json(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_json(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_python_json(v, out);
            }
            out.push('}');
        }
        Value::Number(n) => {
            // Python writes a float's exponent with a sign (`1e+20`); serde_json writes `1e20`.
            let s = n.to_string();
            match s.split_once('e') {
                Some((m, e)) if !e.starts_with('-') && !e.starts_with('+') => {
                    out.push_str(m);
                    out.push_str("e+");
                    out.push_str(e);
                }
                _ => out.push_str(&s),
            }
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The prompt tokens of a chat request of one user message whose content is `segments`
/// concatenated, as vLLM counts them (thinking off; [`encode_chat_mode`]). The template's prefix is
/// encoded with the first segment (exactly as in the rendered string: `\n` may merge with
/// leading newlines of the content) and its suffix starts with a special token, so only the
/// boundaries between content segments can differ from encoding [`chat_prompt`] whole.
pub fn encode_chat<S: AsRef<str>>(segments: &[S]) -> Vec<u32> {
    encode_chat_mode(segments, false)
}

/// [`encode_chat`] with `enable_thinking` as given (on: no empty thinking block, 4 tokens fewer).
pub fn encode_chat_mode<S: AsRef<str>>(segments: &[S], enable_thinking: bool) -> Vec<u32> {
    let (first, rest) = match segments.split_first() {
        Some((f, r)) => (f.as_ref(), r),
        None => ("", &[][..]),
    };
    let mut out = encode(&format!("{CHAT_USER_PREFIX}{first}")).to_vec();
    for s in rest {
        out.extend_from_slice(&encode(s.as_ref()));
    }
    out.extend_from_slice(&encode(&chat_generation_suffix(enable_thinking)));
    out
}

/// Tokens the chat template adds around a user message's content (thinking off: the larger).
pub fn chat_overhead() -> usize {
    count(CHAT_USER_PREFIX) + count(&chat_generation_suffix(false))
}

/// Prompt tokens of a chat request of one user message `content` ([`encode_chat`]).
pub fn count_chat(content: &str) -> usize {
    encode_chat(&[content]).len()
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

/// Prefix-cache hashes of the `blocks` blocks a request completes with its own output, chained
/// after its prompt's [`block_hashes`] (`prompt_hashes`, which cover every full prompt block) as
/// vLLM's V1 engine hashes a block once its generated tokens fill it. `key` names the request:
/// a Qwen3 completion never becomes a later prompt's prefix (the chat template drops the
/// reasoning, and re-renders an answer after different tokens than it was generated after), so
/// only the request itself — recomputed after a preemption — can hit these blocks.
pub fn generated_block_hashes(prompt_hashes: &[u64], key: u64, blocks: u32) -> Vec<u64> {
    let mut parent = prompt_hashes.last().copied().unwrap_or(0x5157_4954_4348_5944);
    (0..blocks)
        .map(|block| {
            let mut h = DefaultHasher::new();
            parent.hash(&mut h);
            (u64::MAX, key, block).hash(&mut h);
            parent = h.finish();
            parent
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn generated_blocks_chain_after_the_prompt_and_are_the_requests_own() {
        let prompt = super::block_hashes(&[7; 40], 16);
        let a = super::generated_block_hashes(&prompt, 1, 3);
        assert_eq!(a.len(), 3);
        assert_eq!(a, super::generated_block_hashes(&prompt, 1, 3), "deterministic");
        assert_eq!(a[..2], super::generated_block_hashes(&prompt, 1, 2)[..], "a prefix of the longer chain");
        let b = super::generated_block_hashes(&prompt, 2, 3);
        assert!(a.iter().all(|h| !b.contains(h) && !prompt.contains(h)), "another request's blocks are its own");
        let other_prompt = super::block_hashes(&[8; 40], 16);
        assert_ne!(a[0], super::generated_block_hashes(&other_prompt, 1, 1)[0], "chained after the prompt");
    }

    #[test]
    fn no_token_stands_for_more_than_max_token_bytes() {
        let longest = tok().bytes.iter().map(|b| b.len()).max();
        assert_eq!(longest, Some(MAX_TOKEN_BYTES));
        let added = tok().added.iter().map(|(text, _)| text.len()).max().unwrap_or(0);
        assert!(added <= MAX_TOKEN_BYTES, "special tokens: {added}");
    }

    #[test]
    fn a_conversation_of_one_user_message_renders_like_the_one_message_template() {
        assert_eq!(chat_template(&[("user", "hi")], false, true), chat_prompt_mode("hi", false));
        assert_eq!(chat_template(&[("user", "hi")], true, true), chat_prompt_mode("hi", true));
        let two = chat_template(&[("system", "be brief"), ("user", "hi"), ("tool", "42")], true, true);
        assert!(two.starts_with("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"), "{two}");
        assert!(two.contains("<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"), "{two}");
    }

    /// Tool definitions and assistant tool calls render as Qwen3's template renders them under
    /// vLLM (the expected strings are the template itself, rendered with jinja2 as
    /// `transformers` does — `trim_blocks`, `lstrip_blocks`, `tojson` as `json.dumps` — with
    /// the arguments parsed as vLLM parses them and each tool as vLLM's `model_dump()`).
    #[test]
    fn tools_and_tool_calls_render_as_the_template_does() {
        let tools = vec![
            serde_json::json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, °C",
                "parameters": {"properties": {"city": {"description": "the city", "type": "string"}, "days": {"type": "integer"}},
                    "required": ["city"], "type": "object"}, "strict": true}}),
            serde_json::json!({"type": "function", "function": {"name": "now"}}),
        ];
        let turn = |role: &str, content: &str, calls: &[(&str, &str)]| ChatTurn {
            role: role.into(),
            content: content.into(),
            tool_calls: calls.iter().map(|(n, a)| TurnToolCall { name: (*n).into(), arguments: (*a).into() }).collect(),
        };
        let messages = [
            turn("system", "Be brief.", &[]),
            turn("user", "Weather in Paris?", &[]),
            turn("assistant", "", &[("get_weather", r#"{"city":"Paris","days":2}"#), ("now", "{}")]),
            turn("tool", r#"{"temp": 21}"#, &[]),
            turn("tool", "12:00", &[]),
        ];
        let want = "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a city, \u{b0}C\", \"parameters\": {\"properties\": {\"city\": {\"description\": \"the city\", \"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}, \"required\": [\"city\"], \"type\": \"object\"}, \"strict\": true}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": null, \"parameters\": null}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(chat_template_with_tools(&messages, &tools, true, true), want);
        let messages = [turn("user", "hi", &[]), turn("assistant", "Let me check.", &[("now", "{}")]), turn("tool", "12:00", &[])];
        let want = "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": null, \"parameters\": null}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nLet me check.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
        assert_eq!(chat_template_with_tools(&messages, &tools[1..], false, true), want);
        // Without tools and tool calls it is the plain template.
        let plain = [turn("system", "s", &[]), turn("user", "u", &[])];
        assert_eq!(chat_template_with_tools(&plain, &[], true, true), chat_template(&[("system", "s"), ("user", "u")], true, true));
    }

    /// Qwen3's template: an earlier assistant turn's reasoning is dropped before the last user
    /// query and kept after it; consecutive tool results are one user turn.
    #[test]
    fn the_template_drops_earlier_reasoning_and_groups_tool_results() {
        let answer = "<think>\nlong reasoning here\n</think>\n\nHello!";
        let p = chat_template(&[("user", "Hi"), ("assistant", answer), ("user", "again")], true, true);
        assert_eq!(p, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n");
        // After the last query (an agent's tool loop), the reasoning stays.
        let p = chat_template(&[("user", "Hi"), ("assistant", answer), ("tool", "a"), ("tool", "b")], false, true);
        assert!(p.contains("<|im_start|>assistant\n<think>\nlong reasoning here\n</think>\n\nHello!<|im_end|>\n"), "{p}");
        assert!(p.contains("<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response><|im_end|>\n"), "{p}");
        assert!(p.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{p}");
        // Without the generation prompt, the conversation only.
        assert!(chat_template(&[("user", "Hi")], true, false).ends_with("Hi<|im_end|>\n"));
    }

    use super::*;

    #[test]
    fn the_embedded_tokenizer_loads() {
        check().expect("tokenizer");
        // 151,643 BPE entries + 26 added tokens.
        assert_eq!(tok().bytes.len(), 151_669);
        // A damaged file is an error naming it, not a panic.
        let Err(e) = load_from(b"{\"model\": 1}") else { panic!("a damaged tokenizer loaded") };
        assert!(e.to_string().contains(TOKENIZER_PATH), "{e}");
    }

    #[test]
    fn counts_are_qwen3_counts() {
        assert_eq!(count(""), 0);
        // Vocabulary ids read by hand from tokenizer.json's `model.vocab`:
        // "Hello" 9707, "Ġworld" 1879 (Ġ = a leading space), "hello" 14990, "Ċ" 198 (a newline).
        assert_eq!(&*encode("Hello"), &[9707]);
        assert_eq!(&*encode("Hello world"), &[9707, 1879]);
        assert_eq!(&*encode("hello\n"), &[14990, 198]);
        // Reference ids from the tokenizer on fixed strings: digits are split one by one
        // (`\p{N}` in the pre-tokenizer), unlike o200k_base's groups of three.
        assert_eq!(&*encode("12345"), &[16, 17, 18, 19, 20]);
        // "Jan" "et" "Ġsells" "Ġ" "1" "6" "Ġ-" "Ġ" "3" … "Ġduck" "Ġeggs" "Ġa" "Ġday" ".": a space
        // before a digit is its own token.
        assert_eq!(
            &*encode("Janet sells 16 - 3 - 4 = 9 duck eggs a day."),
            &[18_315, 295, 30_778, 220, 16, 21, 481, 220, 18, 481, 220, 19, 284, 220, 24, 35_985, 18_805, 264, 1899, 13]
        );
        // "def" "Ġadd" "(a" "," "Ġb" "):Ċ" "ĠĠĠ" "Ġreturn" "Ġa" "Ġ+" "Ġb" "Ċ": the last space of an
        // indent joins the word after it (`\s+(?!\S)`, the look-ahead fancy-regex runs).
        assert_eq!(
            &*encode("def add(a, b):\n    return a + b\n"),
            &[750, 912, 2877, 11, 293, 982, 262, 470, 264, 488, 293, 198]
        );
        // Special tokens in a text are single tokens, as in a rendered prompt.
        assert_eq!(&*encode("<|im_start|>user\n"), &[151_644, 872, 198]);
        assert_eq!(&*encode("<think>\n\n</think>\n\n"), &[151_667, 271, 151_668, 271]);
        // "the" then 49 × (" quick" " brown" " fox" " the"), " quick" " brown" " fox", and the
        // trailing " ".
        let text = "the quick brown fox ".repeat(50);
        assert_eq!(count(&text), 201);
    }

    #[test]
    fn the_chat_template_overhead_is_what_it_renders() {
        // <|im_start|> user \n  …  <|im_end|> \n <|im_start|> assistant \n <think> \n\n </think> \n\n
        assert_eq!(
            &*encode(&chat_generation_suffix(false)),
            &[151_645, 198, 151_644, 77_091, 198, 151_667, 271, 151_668, 271]
        );
        assert_eq!(&*encode(&chat_generation_suffix(true)), &[151_645, 198, 151_644, 77_091, 198]);
        assert_eq!(chat_overhead(), 12);
        let content = "Solve the following grade-school math problem.\n\nQuestion: 2 + 2?";
        let ids = encode_chat(&[content]);
        assert_eq!(ids.len(), count(content) + 12);
        assert_eq!(ids, encode(&chat_prompt(content)).to_vec());
        assert_eq!(decode(&ids), chat_prompt(content));
        // Segments: the template prefix leads the first block, so every call's blocks share it.
        let parts = ["Summarize the meeting.\n", "Transcript: ", "um yeah {vocalsound} so"];
        let ids = encode_chat(&parts);
        assert_eq!(&ids[..3], &[151_644, 872, 198]);
        // Segment by segment differs from the whole rendered string only at the two inner
        // boundaries (here "Transcript: " + "um" is "Transcript" ":" " " "um", not " um").
        let whole = count(&chat_prompt(&parts.concat()));
        assert!(ids.len().abs_diff(whole) < parts.len(), "{} vs {whole}", ids.len());
        assert_eq!(decode(&ids), chat_prompt(&parts.concat()));
        assert_eq!(encode_chat::<&str>(&[]).len(), 12);
    }

    #[test]
    fn round_trip_and_truncate() {
        let text = "Janet sells 16 - 3 - 4 = 9 duck eggs a day.";
        assert_eq!(decode(&encode(text)), text);
        for unicode in [
            "会议讨论了遥控器的电池问题。",
            "Grüße aus Köln — naïve café, ½ × π ≈ 1.57 🙂👩‍💻",
            "Привет, мир! こんにちは世界 안녕하세요 مرحبا",
            "  tabs\tand\r\nnewlines\n\n\nend ",
        ] {
            assert_eq!(decode(&encode(unicode)), unicode);
        }
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

    /// Hugging Face `tokenizers` on the same file: the reference this module re-implements.
    fn reference() -> &'static tokenizers::Tokenizer {
        static REFERENCE: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
        REFERENCE.get_or_init(|| tokenizers::Tokenizer::from_bytes(TOKENIZER_JSON).expect("reference tokenizer"))
    }

    fn assert_same(text: &str) {
        let expected = reference().encode_fast(text, false).expect("reference encoding");
        let ours = tok().encode(text, &mut PieceCache::new(PIECE_CACHE_BYTES));
        if ours != expected.get_ids() {
            let at = ours.iter().zip(expected.get_ids()).position(|(a, b)| a != b).unwrap_or(ours.len().min(expected.len()));
            let from = at.saturating_sub(3);
            panic!(
                "{} bytes {:?}…: differ at token {at}: ours {:?} ({:?}), reference {:?} ({:?})",
                text.len(),
                text.chars().take(60).collect::<String>(),
                &ours[from..(at + 3).min(ours.len())],
                decode(&ours[from..(at + 3).min(ours.len())]),
                &expected.get_ids()[from..(at + 3).min(expected.len())],
                decode(&expected.get_ids()[from..(at + 3).min(expected.len())]),
            );
        }
        assert_eq!(&*encode(text), expected.get_ids(), "cached path");
    }

    fn strings(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::String(s) => out.push(s.clone()),
            serde_json::Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
            serde_json::Value::Object(map) => map.values().for_each(|v| strings(v, out)),
            _ => {}
        }
    }

    #[test]
    fn equals_the_reference_on_every_dataset_text_and_workflow() {
        let workflows = crate::exec::tests::bundled_workflows();
        let records = crate::exec::load_records(&workflows).expect("records");
        let mut texts = Vec::new();
        for record in records.iter().flat_map(|r| r.iter()) {
            for value in record.values() {
                strings(value, &mut texts);
            }
        }
        assert!(texts.len() > 1000, "{} texts", texts.len());
        // The workflow files (prompt templates), whole and line by line.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows");
        for f in ["gsm8k.yaml", "mbpp.yaml", "qmsum.yaml", "team.yaml"] {
            let yaml = std::fs::read_to_string(root.join(f)).expect("workflow file");
            texts.extend(yaml.lines().map(str::to_string));
            texts.push(yaml);
        }
        for text in &texts {
            assert_same(text);
            assert_same(&chat_prompt(text));
        }
    }

    #[test]
    fn equals_the_reference_on_adversarial_strings() {
        let fixed = [
            "", " ", "  ", "\n", "\r\n", " \n ", "\n\n  x", "a  \n\t b", "x\u{a0}y", "x \u{a0}y", "\u{3000}漢字",
            "   \t\t  ", "end   ", "a\u{2028}b\u{2029}c\u{85}d\u{b}e\u{c}f", "1234567890", " 12 345", "x² ½ ⅔ Ⅻ ٣٤ ௰",
            "I'm you're we've they'll he'd it's don't", "I'M YOU'RE WE'VE THEY'LL HE'D IT'S DON'T", "'s's's", "''s",
            "'ſ 'ſo 'K 'Kelvin 'ß 'İ", "cafe\u{301} cafe\u{301}s e\u{301}\u{301}", "Å Å Å ﬁ ｆｕｌｌ",
            "<|im_start|>user\nhi<|im_end|>", "<|im_start|<|im_end|>>", "<think></think><think>", "<|endoftext|x",
            "<tool_call>{\"a\": 1}</tool_call>", "a<|im_start|>b", "<<|im_end|>", "<|fim_prefix|><|fim_middle|>",
            "def f(x):\n    return x\n\n\n\tif x:\n\t\tpass\n", "    \n    \n", "x = [1, 2]  # comment\r\n",
            "!!!???...,,,;;;", " !!!\n\n", "(a)", " (a)", "\t(a)", "a...b", "...\n\nb", "a—b–c", "\"quoted\"",
            "🙂👩‍💻 🇩🇪 e\u{200d}", "Привет, мир! こんにちは世界 안녕하세요 مرحبا עברית", "ÀÉÎÕÜ àéîõü",
            "\u{feff}bom", "\u{0}\u{1}\u{1f}\u{7f}", "a\u{1c}b\u{1d}c\u{1e}d\u{1f}e", "{vocalsound} um {disfmarker}",
        ];
        for text in fixed {
            assert_same(text);
        }
        // Long runs (whitespace, digits, letters without spaces, punctuation).
        for n in [1, 2, 3, 17, 300] {
            for unit in [" ", "\n", "\t", " \n", "7", "ab", "漢", "!", "'s", "é"] {
                assert_same(&unit.repeat(n));
                assert_same(&format!("x{}y", unit.repeat(n)));
            }
        }
        // Random strings over an alphabet of the pattern's edge characters.
        let alphabet: Vec<&str> = vec![
            " ", "  ", "\n", "\r", "\t", "\u{a0}", "\u{3000}", "a", "Z", "é", "e\u{301}", "漢", "ſ", "K", "'", "s", "t",
            "re", "LL", "d", "1", "٣", "½", ".", ",", "(", "-", "_", "<", ">", "|", "<|im_end|>", "<think>", "🙂",
            "\u{200d}", "ß", "İ", "\u{85}", "\u{2028}",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..3000 {
            let len = (next() % 24) as usize;
            let text: String = (0..len).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect();
            assert_same(&text);
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
