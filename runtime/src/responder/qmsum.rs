//! QMSum responders: `qmsum.summarize` and `qmsum.aggregate`, extractive query-focused
//! summaries of the requested length.
//!
//! # Where the source text is found (contract with the workflow prompts)
//!
//! A *marker line* is a prompt line whose trimmed text starts, case-insensitively, with a
//! marker phrase immediately followed by `:`; anything after the colon on that line is already
//! content. Source markers:
//!
//! - `Transcript:` (also `Meeting transcript:`) — meeting text, usually `speaker: content` lines;
//! - `Previous summary:` (also `Summary so far:`) — the running summary of a rolling chain; its
//!   sentences get a carry-over bonus, so a rolling summary keeps what it had;
//! - `Summary:`, `Summaries:`, or `Summary <label>:` with a short label (`Summary 1:`,
//!   `Summary A:`) — summaries to merge.
//!
//! A source section runs to the next marker line. Non-source markers end a section and are not
//! summarized: `Query:`, `Question:`, `Task:`, `Instruction(s):`, `Answer:`, `Output:`, and a
//! line that is exactly `---` or `END`. Put instructions before the source sections or after an
//! end marker. Without any source marker, the whole prompt is the source.
//!
//! `qmsum.aggregate` summarizes the texts of its upstream outputs (the summaries it merges);
//! with no non-empty upstream output it falls back to the prompt's source sections.
//!
//! # Ranking
//!
//! Sentences (meeting fillers like `{vocalsound}` removed, fewer than [`MIN_WORDS`] words
//! dropped) are scored by content-word overlap with the query (`input["query"]`), centrality
//! (how frequent their words are in the whole source — this carries general queries such as
//! "Summarize the whole meeting"), and a small lead bias; the best ones are emitted in source
//! order until the target length. This is our own simple baseline in the spirit of the
//! "locate, then summarize" pipeline of the QMSum paper (Zhong et al., NAACL 2021, §4).
//!
//! Measured (`runtime/tests/responder_measure.rs`): the nine-call pipeline of
//! `workflows/qmsum.yaml` over the 35 test meetings (general query 0) ends with a mean
//! ROUGE-L F1 of 0.136 against the reference summaries (unstemmed, whole-text LCS: extractive
//! sentences against abstractive references); all 315 calls take ~2 s in a debug build.
//!
//! Depends on `super::{fit, text}`; never reads files.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::json;

use super::fit::fit_marked;
use super::text::{content_words, split_sentences};
use super::{ResponderError, ResponderRequest};
use crate::tokens;
use crate::memo::FastHasher;

/// Sentences with fewer words are back-channel ("Okay.", "Yeah, sure.") and never extracted.
pub const MIN_WORDS: usize = 6;

/// Weights of the ranking terms: query overlap (per √words), centrality, lead bias, carry-over
/// of a previous summary, speaker named in the query. Chosen by hand so that query overlap dominates, centrality decides
/// general queries, and position only breaks near-ties.
const W_QUERY: f64 = 1.0;
const W_CENTRALITY: f64 = 0.5;
const W_POSITION: f64 = 0.1;
const W_CARRY: f64 = 0.15;
/// Bonus for a sentence spoken by someone the query names ("What did Barry Hughes think …").
const W_SPEAKER: f64 = 0.3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Section {
    Transcript,
    Previous,
    Summaries,
}

/// Classify a marker line: `Some(Some(section))` for a source marker, `Some(None)` for an end
/// marker, `None` for an ordinary line. Also returns the content after the colon.
fn marker(line: &str) -> Option<(Option<Section>, &str)> {
    let t = line.trim();
    if t == "---" || t == "END" {
        return Some((None, ""));
    }
    let colon = t.find(':')?;
    let label = t[..colon].trim().to_lowercase();
    let rest = &t[colon + 1..];
    let section = match label.as_str() {
        "transcript" | "meeting transcript" => Some(Section::Transcript),
        "previous summary" | "summary so far" => Some(Section::Previous),
        "summary" | "summaries" => Some(Section::Summaries),
        "query" | "question" | "task" | "instruction" | "instructions" | "answer" | "output" => None,
        l => {
            let short_label = l.strip_prefix("summary ").is_some_and(|x| {
                !x.is_empty() && x.len() <= 12 && x.chars().all(|c| c.is_alphanumeric() || c == ' ')
            });
            if short_label {
                Some(Section::Summaries)
            } else {
                return None;
            }
        }
    };
    Some((section, rest))
}

/// The source sections of a prompt, in order; the whole prompt when it has no source marker.
fn sections(prompt: &str) -> Vec<(Section, String)> {
    let mut out: Vec<(Section, String)> = Vec::new();
    let mut current: Option<(Section, String)> = None;
    for line in prompt.lines() {
        match marker(line) {
            Some((kind, rest)) => {
                if let Some(done) = current.take() {
                    out.push(done);
                }
                current = kind.map(|k| (k, format!("{}\n", rest.trim())));
            }
            None => {
                if let Some((_, body)) = current.as_mut() {
                    body.push_str(line);
                    body.push('\n');
                }
            }
        }
    }
    if let Some(done) = current.take() {
        out.push(done);
    }
    if out.is_empty() {
        out.push((Section::Transcript, prompt.to_string()));
    }
    out
}

/// Remove transcript markup such as `{vocalsound}` or `{disfmarker}` and collapse blanks.
fn clean(sentence: &str) -> String {
    let mut s = String::with_capacity(sentence.len());
    let mut depth = 0usize;
    for c in sentence.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth > 0 => depth -= 1,
            _ if depth == 0 => s.push(c),
            _ => {}
        }
    }
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// One sentence of a source section as the ranking sees it: what depends on the section's
/// text alone (not on the other sections or the query), so it is computed once per recurring
/// section ([`section_sentences`]).
struct Sentence {
    /// The speaker of the turn the sentence comes from, when the line had a `speaker:` prefix.
    speaker: Option<String>,
    /// The sentence, markup removed, without the speaker prefix.
    text: String,
    words: BTreeSet<String>,
    /// `text` lower-cased: a sentence seen before under this key is dropped.
    key: String,
    /// Content words of the speaker's name (empty without a speaker).
    speaker_words: BTreeSet<String>,
    /// Tokens of [`Sentence::attributed`], counted when first needed (a transcript sentence
    /// is ranked again by every session of its meeting).
    attributed_tokens: OnceLock<usize>,
}

struct Candidate {
    sentence: Arc<Sentence>,
    carry: bool,
}

impl std::ops::Deref for Candidate {
    type Target = Sentence;
    fn deref(&self) -> &Sentence {
        &self.sentence
    }
}

impl Sentence {
    /// The sentence as emitted, with its speaker when it has one.
    fn attributed(&self) -> String {
        match &self.speaker {
            Some(sp) => format!("{sp}: {}", self.text),
            None => self.text.clone(),
        }
    }

    /// `tokens::count` of [`Sentence::attributed`].
    fn attributed_tokens(&self) -> usize {
        *self.attributed_tokens.get_or_init(|| tokens::count(&self.attributed()))
    }
}

/// Split a transcript line `speaker: content` into its speaker and content. A speaker is at
/// most [`MAX_SPEAKER_WORDS`] words before the first colon (`Barry Hughes`, `Professor E`).
fn speaker_turn(line: &str) -> (Option<&str>, &str) {
    if let Some(colon) = line.find(':') {
        let who = line[..colon].trim();
        let words = who.split_whitespace().count();
        if (1..=MAX_SPEAKER_WORDS).contains(&words) && !who.contains(['.', '?', '!', '"']) {
            return (Some(who), &line[colon + 1..]);
        }
    }
    (None, line)
}

/// Longest speaker label recognised in a transcript line, in words.
const MAX_SPEAKER_WORDS: usize = 5;

/// Sentence candidates of the sources, in source order; a sentence seen before (two summaries
/// that share a sentence, a summary repeating the transcript) is kept once, at its first place.
fn candidates(sources: &[(Section, String)]) -> Vec<Candidate> {
    let mut out = Vec::new();
    // Only asked for membership, never iterated: its order cannot reach the output.
    let mut seen: HashSet<&str, BuildHasherDefault<FastHasher>> = HashSet::default();
    let sections: Vec<(Section, Arc<Vec<Arc<Sentence>>>)> =
        sources.iter().map(|(section, body)| (*section, section_sentences(*section, body))).collect();
    for (section, sentences) in &sections {
        for sentence in sentences.iter() {
            if seen.insert(sentence.key.as_str()) {
                out.push(Candidate { sentence: Arc::clone(sentence), carry: *section == Section::Previous });
            }
        }
    }
    out
}

/// Most transcript sections whose sentences are kept (a meeting has six parts; the test split
/// has 35 meetings).
const SECTION_CACHE_LIMIT: usize = 256;

/// The rankable sentences of one source section, in order (see [`candidates`]); cached for
/// transcript sections, which recur across the sessions of a meeting, while summaries are
/// drawn per session and rarely do.
fn section_sentences(section: Section, body: &str) -> Arc<Vec<Arc<Sentence>>> {
    // Keyed by the body's digest ([`tokens::content_key`]), not a copy of it: a transcript
    // section is tens of kilobytes, and comparing it to a kept copy cost more than the hash.
    static CACHE: OnceLock<Mutex<HashMap<u128, Arc<Vec<Arc<Sentence>>>, BuildHasherDefault<FastHasher>>>> =
        OnceLock::new();
    if section != Section::Transcript {
        return Arc::new(split_section(section, body));
    }
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::default()));
    let key = tokens::content_key(body);
    if let Some(hit) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return hit;
    }
    let sentences = Arc::new(split_section(section, body));
    if let Ok(mut c) = cache.lock() {
        if c.len() >= SECTION_CACHE_LIMIT {
            c.clear();
        }
        c.insert(key, Arc::clone(&sentences));
    }
    sentences
}

/// The sentences of a section with at least [`MIN_WORDS`] words and a content word, in order.
fn split_section(section: Section, body: &str) -> Vec<Arc<Sentence>> {
    let mut out = Vec::new();
    for line in body.lines() {
        // A transcript line is one turn; a summary paragraph may hold several turns, each
        // sentence starting with its speaker when the speaker changes.
        let (first, content) = speaker_turn(line);
        let mut speaker: Option<String> = first.map(String::from);
        for raw in split_sentences(content) {
            let raw = if section == Section::Transcript {
                raw
            } else {
                let (sp, rest) = speaker_turn(&raw);
                match sp {
                    Some(sp) => {
                        speaker = Some(sp.to_string());
                        rest.to_string()
                    }
                    None => raw,
                }
            };
            let text = clean(&raw);
            if text.split_whitespace().count() < MIN_WORDS {
                continue;
            }
            let words = content_words(&text);
            if words.is_empty() {
                continue;
            }
            out.push(Arc::new(Sentence {
                speaker_words: speaker.as_deref().map(content_words).unwrap_or_default(),
                speaker: speaker.clone(),
                key: text.to_lowercase(),
                text,
                words,
                attributed_tokens: OnceLock::new(),
            }));
        }
    }
    out
}

/// Scores of the candidates for `query` (see the module doc). Centrality is MEAD's centroid
/// score (Radev et al., *Centroid-based summarization of multiple documents*, IP&M 2004):
/// the summed tf·idf weight of a sentence's words among the source's [`CENTROID_WORDS`]
/// highest-weighted words (idf over the source's sentences), scaled to [0, 1].
fn scores(cands: &[Candidate], query: &BTreeSet<String>) -> Vec<f64> {
    // Hash maps, only looked up: the weights are sorted by (weight, word), a total order, so
    // the order the map yields them in cannot reach the result.
    let mut df: HashMap<&str, u32, BuildHasherDefault<FastHasher>> = HashMap::default();
    for c in cands {
        for w in &c.words {
            *df.entry(w.as_str()).or_insert(0) += 1;
        }
    }
    let n = cands.len().max(1) as f64;
    let mut weights: Vec<(&str, f64)> =
        df.iter().map(|(w, d)| (*w, f64::from(*d) * (n / f64::from(*d)).ln())).filter(|(_, x)| *x > 0.0).collect();
    weights.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    weights.truncate(CENTROID_WORDS);
    let centroid: HashMap<&str, f64, BuildHasherDefault<FastHasher>> = weights.into_iter().collect();
    let raw: Vec<f64> = cands.iter().map(|c| c.words.iter().filter_map(|w| centroid.get(w.as_str())).sum()).collect();
    let max_raw = raw.iter().copied().fold(0.0, f64::max);
    cands
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let len = c.words.len() as f64;
            let overlap = c.words.intersection(query).count() as f64;
            let centrality = if max_raw > 0.0 { raw[i] / max_raw } else { 0.0 };
            let position = 1.0 - i as f64 / n;
            let by_named_speaker = c.speaker.is_some() && !c.speaker_words.is_disjoint(query);
            W_QUERY * overlap / len.sqrt()
                + W_CENTRALITY * centrality
                + W_POSITION * position
                + if c.carry { W_CARRY } else { 0.0 }
                + if by_named_speaker { W_SPEAKER } else { 0.0 }
        })
        .collect()
}

/// How many of the source's highest tf·idf words form the centroid.
const CENTROID_WORDS: usize = 40;

/// Sentences a summarizer adds when the source is used up and the drawn length is not reached
/// (an extractive summary cannot be longer than its source, a model's output can): a wrap-up
/// built from the source's highest tf·idf content words and its speakers, rotating through
/// the keywords so that it does not repeat itself verbatim.
fn closing_lines(cands: &[Candidate], query: &str) -> Vec<String> {
    let speaker_words: BTreeSet<&String> = cands.iter().flat_map(|c| c.speaker_words.iter()).collect();
    // Only looked up until its words are sorted by (weight, word), a total order.
    let mut df: HashMap<&str, u32, BuildHasherDefault<FastHasher>> = HashMap::default();
    for c in cands {
        for w in &c.words {
            if w.chars().count() >= 4 && w.chars().all(char::is_alphabetic) && !speaker_words.contains(w) {
                *df.entry(w.as_str()).or_insert(0) += 1;
            }
        }
    }
    let n = cands.len().max(1) as f64;
    let mut ranked: Vec<(&str, f64)> = df.into_iter().map(|(w, d)| (w, f64::from(d) * (n / f64::from(d)).ln())).collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    let keywords: Vec<&str> = ranked.iter().take(12).map(|(w, _)| *w).collect();
    let mut speakers: Vec<&str> = Vec::new();
    for c in cands {
        if let Some(sp) = c.speaker.as_deref()
            && !speakers.contains(&sp)
        {
            speakers.push(sp);
        }
    }
    // The wrap-up is its own paragraph, so that a later stage does not attribute it to the
    // speaker of the last extracted sentence.
    let mut lines = vec![format!("\nIn answer to the query \"{}\", the points above are the ones that matter most.", query.trim())];
    if !speakers.is_empty() {
        let shown: Vec<&str> = speakers.iter().take(4).copied().collect();
        lines.push(format!(" The main contributions came from {}.", shown.join(", ")));
    }
    for k in keywords.chunks(3) {
        match k {
            [a, b, c] => lines.push(format!(" The discussion also touched on {a}, {b} and {c}.")),
            [a, b] => lines.push(format!(" Further points concerned {a} and {b}.")),
            [a] => lines.push(format!(" Some time was spent on {a}.")),
            _ => {}
        }
    }
    lines.push(" No decision beyond the points above was recorded.".to_string());
    lines
}

/// What [`extract`] computes from the sources and the query alone (not the target length):
/// the candidates, their ranking and the closing lines.
struct Ranked {
    cands: Vec<Candidate>,
    /// Candidate indices, best first.
    order: Vec<usize>,
    closing: Vec<String>,
}

/// Most rankings kept. Only rankings of pure transcript sources are kept: those recur (every
/// session of a meeting starts its lanes on the same transcript pieces), sources that hold a
/// drawn summary rarely do.
const RANKED_CACHE_LIMIT: usize = 512;

/// A 128-bit XXH3 digest of the sources and the query (each text with its length, so no two
/// different lists run together into the same bytes); see [`tokens::content_key`].
fn ranked_key(sources: &[(Section, String)], query: &str) -> u128 {
    let mut h = xxhash_rust::xxh3::Xxh3Default::new();
    for (_, body) in sources {
        h.update(&(body.len() as u64).to_le_bytes());
        h.update(body.as_bytes());
    }
    h.update(&(query.len() as u64).to_le_bytes());
    h.update(query.as_bytes());
    h.digest128()
}

/// The ranking of `sources` for `query`, cached by a digest of their full content when they
/// are all transcript.
fn ranked(sources: &[(Section, String)], query: &str) -> Arc<Ranked> {
    static CACHE: OnceLock<Mutex<HashMap<u128, Arc<Ranked>, BuildHasherDefault<FastHasher>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::default()));
    let cacheable = sources.iter().all(|(section, _)| *section == Section::Transcript);
    let key: Option<u128> = cacheable.then(|| ranked_key(sources, query));
    if let Some(k) = &key
        && let Some(hit) = cache.lock().ok().and_then(|c| c.get(k).cloned())
    {
        return hit;
    }
    let cands = candidates(sources);
    let q = content_words(query);
    let s = scores(&cands, &q);
    let mut order: Vec<usize> = (0..cands.len()).collect();
    order.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
    let closing = closing_lines(&cands, query);
    let ranked = Arc::new(Ranked { cands, order, closing });
    if let (Some(k), Ok(mut c)) = (key, cache.lock()) {
        if c.len() >= RANKED_CACHE_LIMIT {
            c.clear();
        }
        c.insert(k, Arc::clone(&ranked));
    }
    ranked
}

/// Extract a summary of `sources` for `query` with close to `target` tokens.
fn extract(sources: &[(Section, String)], query: &str, target: usize) -> (String, serde_json::Value) {
    let ranked = ranked(sources, query);
    let Ranked { cands, order, closing } = &*ranked;
    // Greedy selection by rank within the token budget, emitted in source order.
    let mut chosen = Vec::new();
    let mut used = 0usize;
    for &i in order {
        if target.saturating_sub(used) < 3 {
            break;
        }
        let n = cands[i].attributed_tokens() + 1;
        if used + n <= target {
            chosen.push(i);
            used += n;
        }
    }
    chosen.sort_unstable();
    let mut is_chosen = vec![false; cands.len()];
    for &i in &chosen {
        is_chosen[i] = true;
    }
    let rest: Vec<usize> = order.iter().copied().filter(|&i| !is_chosen[i]).collect();
    let mut last_speaker: Option<&str> = None;
    let text = fit_marked("", "", target, "…", &mut |i| {
        let sep = if i == 0 { "" } else { " " };
        let next = chosen.get(i).or_else(|| rest.get(i - chosen.len()));
        if let Some(&c) = next {
            // Name the speaker when it changes.
            let speaker = cands[c].speaker.as_deref();
            let same = i > 0 && speaker.is_some() && speaker == last_speaker;
            last_speaker = speaker;
            if same { format!("{sep}{}", cands[c].text) } else { format!("{sep}{}", cands[c].attributed()) }
        } else {
            closing[(i - chosen.len() - rest.len()) % closing.len()].clone()
        }
    });
    let text = text.trim_start().to_string();
    (text, json!({ "extracted_sentences": chosen.len(), "source_sentences": cands.len() }))
}

/// `qmsum.summarize`: an extractive summary of the prompt's source sections for
/// `input.query`.
pub(crate) fn summarize(req: &ResponderRequest, target: usize) -> Result<(String, serde_json::Value), ResponderError> {
    let query = req.str_field("query")?;
    Ok(extract(&sections(req.prompt), query, target))
}

/// `qmsum.aggregate`: an extractive summary of the upstream summaries for `input.query`.
pub(crate) fn aggregate(req: &ResponderRequest, target: usize) -> Result<(String, serde_json::Value), ResponderError> {
    let query = req.str_field("query")?;
    let upstream: Vec<(Section, String)> = req
        .upstream
        .iter()
        .filter(|(_, o)| !o.text.trim().is_empty())
        .map(|(_, o)| (Section::Summaries, o.text.clone()))
        .collect();
    let sources = if upstream.is_empty() { sections(req.prompt) } else { upstream };
    Ok(extract(&sources, query, target))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMPT: &str = "You summarize meetings.\nQuery: What did the group decide about the remote control battery?\nPrevious summary:\nThe group agreed the remote control needs a rechargeable battery.\nTranscript:\nProject Manager: Okay.\nIndustrial Designer: The battery should be rechargeable because users hate replacing batteries. It also saves cost.\nMarketing: Fashion matters more than anything else for young customers today.\nUser Interface: We could put the battery charger in the base station of the remote control.\n---\nWrite the summary now, focusing on the query above.";

    #[test]
    fn sections_follow_the_markers() {
        let s = sections(PROMPT);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].0, Section::Previous);
        assert!(s[0].1.contains("rechargeable battery"));
        assert_eq!(s[1].0, Section::Transcript);
        assert!(s[1].1.contains("base station"));
        assert!(!s[1].1.contains("Write the summary"));
        assert!(!s[1].1.contains("Query"));
        let plain = sections("no markers here. at all.");
        assert_eq!(plain.len(), 1);
        assert_eq!(marker("Summary 2:").map(|m| m.0), Some(Some(Section::Summaries)));
        assert_eq!(marker("Industrial Designer: hi"), None);
    }

    #[test]
    fn cleaning_drops_markup() {
        assert_eq!(clean("Um {vocalsound} I think {disfmarker}  so."), "Um I think so.");
    }

    #[test]
    fn query_relevant_sentences_win_and_come_in_source_order() {
        let query = "What did the group decide about the remote control battery?";
        let cands = candidates(&sections(PROMPT));
        let s = scores(&cands, &content_words(query));
        let lowest = s.iter().enumerate().min_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i).unwrap_or(0);
        assert!(cands[lowest].text.starts_with("Fashion"), "{}", cands[lowest].text);
        assert!(cands.iter().all(|c| c.text != "Okay."));
        let (text, _) = extract(&sections(PROMPT), query, 60);
        assert!(text.contains("rechargeable battery"), "{text}");
        assert!(text.contains("base station"), "{text}");
        assert!(text.contains("Industrial Designer: The battery should be rechargeable"), "{text}");
        let a = text.find("rechargeable battery").unwrap_or(usize::MAX);
        let b = text.find("base station").unwrap_or(0);
        assert!(a < b);
        assert!(tokens::count(&text) <= 60);
    }

    #[test]
    fn speakers_are_split_off_turns_and_summary_sentences() {
        assert_eq!(speaker_turn("Barry Hughes: Perfectly happy."), (Some("Barry Hughes"), " Perfectly happy."));
        assert_eq!(speaker_turn("The reason is simple, really, in my view: cost."), (None, "The reason is simple, really, in my view: cost."));
        let src = vec![(Section::Summaries, "Barry Hughes: The defence makes things unclear for parents. He wants clearer guidance for everyone. Suzy Davies AM: The public interest test is critical here.".to_string())];
        let c = candidates(&src);
        let who: Vec<Option<&str>> = c.iter().map(|c| c.speaker.as_deref()).collect();
        assert_eq!(who, vec![Some("Barry Hughes"), Some("Barry Hughes"), Some("Suzy Davies AM")]);
        assert!(c[2].text.starts_with("The public interest"));
        let twice = vec![src[0].clone(), src[0].clone()];
        assert_eq!(candidates(&twice).len(), 3);
    }
}
