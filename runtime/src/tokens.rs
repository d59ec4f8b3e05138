//! Token counting, Qwen3's chat template and prefix-block hashing with Qwen3's own tokenizer:
//! the byte-level BPE of `runtime/data/qwen3-tokenizer/tokenizer.json` (151,643 vocabulary
//! entries and 26 added tokens, NFC-normalised input), loaded offline with Hugging Face's
//! `tokenizers` crate, so counts are the ones a Qwen3 vLLM server reports.
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
//! Encodings are cached by content so that a transcript shared by many prompts is encoded once.
//! A prompt is encoded segment by segment (static template text, inputs, predecessor outputs)
//! and the ids concatenated; this differs from encoding the joined string only at segment
//! boundaries (at most a token or two each). Special tokens (`<|im_start|>`, …) in a text are
//! recognised, as vLLM does when it tokenises a rendered prompt.
//!
//! Depends on nothing else in the crate.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock};

use tokenizers::Tokenizer;

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

/// The tokenizer failed to load.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TokenizerError {
    #[error("the Qwen3 tokenizer embedded from {path} failed to load: {reason}")]
    Load { path: &'static str, reason: String },
}

/// The loaded tokenizer and, per token id, the bytes it stands for.
struct Qwen3 {
    tokenizer: Tokenizer,
    /// Bytes of each id (byte-level BPE tokens mapped back through GPT-2's byte alphabet;
    /// added tokens as their content).
    bytes: Vec<Box<[u8]>>,
    /// The id of each single-byte token (the fallback encoding).
    byte_ids: [u32; 256],
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

fn load() -> Result<Qwen3, TokenizerError> {
    load_from(TOKENIZER_JSON)
}

fn load_from(json: &[u8]) -> Result<Qwen3, TokenizerError> {
    let err = |reason: String| TokenizerError::Load { path: TOKENIZER_PATH, reason };
    let tokenizer = Tokenizer::from_bytes(json).map_err(|e| err(e.to_string()))?;
    let alphabet = byte_alphabet();
    let mut char_byte: HashMap<char, u8> = HashMap::with_capacity(256);
    for (b, c) in alphabet.iter().enumerate() {
        char_byte.insert(*c, b as u8);
    }
    let added = tokenizer.get_added_tokens_decoder();
    let n = tokenizer.get_vocab_size(true) as u32;
    let mut bytes = Vec::with_capacity(n as usize);
    for id in 0..n {
        let b: Box<[u8]> = if let Some(t) = added.get(&id) {
            t.content.as_bytes().into()
        } else {
            match tokenizer.id_to_token(id) {
                Some(tok) => {
                    let mut v = Vec::with_capacity(tok.len());
                    for c in tok.chars() {
                        match char_byte.get(&c) {
                            Some(b) => v.push(*b),
                            None => return Err(err(format!("token {id} ({tok:?}) is not byte-level"))),
                        }
                    }
                    v.into()
                }
                None => Box::default(),
            }
        };
        bytes.push(b);
    }
    let mut byte_ids = [0u32; 256];
    for (b, c) in alphabet.iter().enumerate() {
        match tokenizer.token_to_id(&c.to_string()) {
            Some(id) => byte_ids[b] = id,
            None => return Err(err(format!("no token for byte {b:#04x}"))),
        }
    }
    Ok(Qwen3 { tokenizer, bytes, byte_ids })
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

fn encode_uncached(t: &Qwen3, text: &str) -> Arc<[u32]> {
    match t.tokenizer.encode_fast(text, false) {
        Ok(enc) => enc.get_ids().into(),
        Err(e) => {
            // Not expected for a byte-level BPE; keep the run going with a decodable upper
            // bound (one token per byte) and say so.
            tracing::warn!("tokenizer failed on a {}-byte text ({e}); counting its bytes", text.len());
            text.bytes().map(|b| t.byte_ids[b as usize]).collect()
        }
    }
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

fn decode_bytes(ids: &[u32]) -> Vec<u8> {
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

#[cfg(test)]
mod tests {
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
