//! Prompt and tool-input templates: `{{input.FIELD}}`, `{{NODE}}`, `{{NODE.verdict}}`, the
//! previous loop round's `{{NODE.prev}}`, the round number `{{loop.round}}`, first-available
//! fallbacks `{{repair | generate}}`, optional references (`{{tester?}}`, or a literal
//! fallback `{{tester.verdict | default: "none"}}`) and two filters, `part I of N` and
//! `take N`. Parsing happens once at load time; rendering is a pure function of a
//! [`Resolve`] view of the session (inputs and the latest completed outputs).
//!
//! Depends only on `values` (for [`NodeOutput`]), `tokens` (token-count filters) and the
//! workflow's own `yaml` positions; it must not know about sessions or the scheduler.

use std::fmt;

use serde_json::Value as Json;

use crate::values::NodeOutput;

/// A parsed template. Prompts are always text; a tool input may also be a YAML list of
/// templates, which renders to a JSON list.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    /// The template as written (for a list: the element sources joined with `, `).
    pub source: String,
    pub body: TemplateBody,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TemplateBody {
    /// Static text interleaved with references.
    Text(Vec<Segment>),
    /// A list of templates (tool inputs only): renders to a JSON array.
    List(Vec<Template>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Segment {
    Text(String),
    Ref(Reference),
}

/// One `{{ ... }}`: the first available of `sources`, then `filters` in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    /// The text between the braces, trimmed.
    pub text: String,
    pub sources: Vec<Source>,
    pub filters: Vec<Filter>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `input.FIELD`: a field of the session's mapped dataset record.
    Input(String),
    /// `NODE` or `NODE.text`: the text of the latest completed activation of NODE.
    Output(String),
    /// `NODE.verdict`: the verdict of the latest completed activation of NODE (empty when that
    /// activation has no verdict).
    Verdict(String),
    /// `NODE.prev`: the text of NODE's activation in the previous round of its loop (no value
    /// in the first round).
    Previous(String),
    /// `loop.round`: the 1-based round of the rendering activation's loop.
    Round,
    /// `default: "TEXT"` (and the `?` suffix, for `""`): a literal, always available.
    Literal(String),
}

impl Source {
    /// The node this source reads, if any.
    pub fn node(&self) -> Option<&str> {
        match self {
            Source::Input(_) | Source::Round | Source::Literal(_) => None,
            Source::Output(n) | Source::Verdict(n) | Source::Previous(n) => Some(n),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// `part I of N`: the I-th (1-based) of N nearly equal, contiguous parts of the text,
    /// split at line boundaries, balanced by characters.
    Part { index: u32, of: u32 },
    /// `take N`: the first N elements of a list (the first N lines of a text).
    Take(usize),
}

/// A template that does not parse; `offset` is the byte offset in the template text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    pub offset: usize,
    pub message: String,
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at character {})", self.message, self.offset + 1)
    }
}

impl std::error::Error for TemplateError {}

/// What rendering needs from a session.
pub trait Resolve {
    /// A field of the mapped input record.
    fn input(&self, field: &str) -> Option<&Json>;
    /// The output of the latest completed activation of `node`.
    fn output(&self, node: &str) -> Option<&NodeOutput>;
    /// The output of `node`'s activation in the previous round of the rendering activation's
    /// loop.
    fn previous(&self, _node: &str) -> Option<&NodeOutput> {
        None
    }
    /// The 0-based loop round of the rendering activation.
    fn round(&self) -> Option<u32> {
        None
    }
}

/// A reference none of whose sources is available yet (or an input field that is absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    pub reference: String,
}

/// Longest text one rendering may produce: no model context takes more (262,144 positions, the
/// most of any model in the catalogue — a test checks — × [`crate::tokens::MAX_TOKEN_BYTES`],
/// Qwen3's longest token). A template's inserted
/// values are the inputs and outputs of a run, so without a bound a workflow that repeats a
/// large reference many times would make one prompt of gigabytes before its length is checked.
pub const MAX_RENDERED_BYTES: usize = 262_144 * crate::tokens::MAX_TOKEN_BYTES;

/// Why a template did not render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderError {
    /// A reference none of whose sources is available yet.
    Unresolved(Unresolved),
    /// The rendered text would be longer than [`MAX_RENDERED_BYTES`] (rendering stops there).
    TooLong,
}

impl From<Unresolved> for RenderError {
    fn from(u: Unresolved) -> Self {
        RenderError::Unresolved(u)
    }
}

impl Template {
    /// Parse a text template.
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        Ok(Template {
            source: text.to_string(),
            body: TemplateBody::Text(parse_segments(text)?),
        })
    }

    /// A list of text templates (tool inputs).
    pub fn list(items: Vec<Template>) -> Template {
        let source = items
            .iter()
            .map(|t| t.source.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        Template {
            source,
            body: TemplateBody::List(items),
        }
    }

    /// Every reference, in order (list elements included).
    pub fn references(&self) -> Vec<&Reference> {
        let mut out = Vec::new();
        collect_refs(self, &mut out);
        out
    }

    /// The static text (all literal segments, concatenated): the part of a prompt known
    /// before any value is inserted.
    pub fn static_text(&self) -> String {
        match &self.body {
            TemplateBody::Text(segs) => segs
                .iter()
                .filter_map(|s| match s {
                    Segment::Text(t) => Some(t.as_str()),
                    Segment::Ref(_) => None,
                })
                .collect(),
            TemplateBody::List(items) => items.iter().map(Template::static_text).collect(),
        }
    }

    /// The reference if the template is exactly one `{{...}}` (surrounding whitespace allowed).
    pub fn single_reference(&self) -> Option<&Reference> {
        let TemplateBody::Text(segs) = &self.body else {
            return None;
        };
        let mut found = None;
        for s in segs {
            match s {
                Segment::Text(t) if t.trim().is_empty() => {}
                Segment::Text(_) => return None,
                Segment::Ref(r) if found.is_none() => found = Some(r),
                Segment::Ref(_) => return None,
            }
        }
        found
    }

    /// Render as text segments: each literal and each inserted value is one segment, so that
    /// `segments.concat()` is the full text. A list template renders one line per element.
    /// The text is at most [`MAX_RENDERED_BYTES`] long, else [`RenderError::TooLong`].
    pub fn render_segments(&self, r: &dyn Resolve) -> Result<Vec<String>, RenderError> {
        let mut out = Vec::new();
        let mut budget = MAX_RENDERED_BYTES;
        self.render_into(r, &mut out, &mut budget)?;
        Ok(out)
    }

    /// Append the rendered segments to `out`, each taken from `budget` (bytes left).
    fn render_into(&self, r: &dyn Resolve, out: &mut Vec<String>, budget: &mut usize) -> Result<(), RenderError> {
        fn push(segment: String, out: &mut Vec<String>, budget: &mut usize) -> Result<(), RenderError> {
            *budget = budget.checked_sub(segment.len()).ok_or(RenderError::TooLong)?;
            out.push(segment);
            Ok(())
        }
        match &self.body {
            TemplateBody::Text(segs) => {
                for s in segs {
                    let segment = match s {
                        Segment::Text(t) => t.clone(),
                        Segment::Ref(rf) => json_to_text(&rf.resolve(r)?),
                    };
                    push(segment, out, budget)?;
                }
            }
            TemplateBody::List(items) => {
                for (i, t) in items.iter().enumerate() {
                    if i > 0 {
                        push("\n".to_string(), out, budget)?;
                    }
                    t.render_into(r, out, budget)?;
                }
            }
        }
        Ok(())
    }

    /// Render as a JSON value (tool inputs): a template that is exactly one reference yields
    /// the referenced value itself (a list input stays a list); other text templates yield a
    /// string; a list template yields an array. At most [`MAX_RENDERED_BYTES`] of text in all
    /// (a value counts as its JSON text), else [`RenderError::TooLong`].
    pub fn render_value(&self, r: &dyn Resolve) -> Result<Json, RenderError> {
        let mut budget = MAX_RENDERED_BYTES;
        self.value_within(r, &mut budget)
    }

    fn value_within(&self, r: &dyn Resolve, budget: &mut usize) -> Result<Json, RenderError> {
        if let TemplateBody::List(items) = &self.body {
            return items
                .iter()
                .map(|t| t.value_within(r, budget))
                .collect::<Result<Vec<_>, _>>()
                .map(Json::Array);
        }
        if let Some(rf) = self.single_reference() {
            let value = rf.resolve(r)?;
            *budget = budget.checked_sub(json_text_len(&value)).ok_or(RenderError::TooLong)?;
            return Ok(value);
        }
        let mut out = Vec::new();
        self.render_into(r, &mut out, budget)?;
        Ok(Json::String(out.concat()))
    }
}

/// About the length of `v`'s JSON text (strings by their bytes, without escapes), counted
/// without writing it.
fn json_text_len(v: &Json) -> usize {
    match v {
        Json::String(s) => s.len() + 2,
        Json::Array(items) => items.iter().map(json_text_len).fold(2 + items.len(), usize::saturating_add),
        Json::Object(map) => map.iter().map(|(k, v)| k.len() + 4 + json_text_len(v)).fold(2, usize::saturating_add),
        Json::Null | Json::Bool(_) | Json::Number(_) => 8,
    }
}

fn collect_refs<'a>(t: &'a Template, out: &mut Vec<&'a Reference>) {
    match &t.body {
        TemplateBody::Text(segs) => out.extend(segs.iter().filter_map(|s| match s {
            Segment::Ref(r) => Some(r),
            Segment::Text(_) => None,
        })),
        TemplateBody::List(items) => items.iter().for_each(|i| collect_refs(i, out)),
    }
}

impl Reference {
    /// The first available source's value, with the filters applied.
    pub fn resolve(&self, r: &dyn Resolve) -> Result<Json, Unresolved> {
        let mut value = None;
        for s in &self.sources {
            value = match s {
                Source::Input(f) => r.input(f).cloned(),
                Source::Output(n) => r.output(n).map(|o| Json::String(o.text.clone())),
                Source::Verdict(n) => r
                    .output(n)
                    .map(|o| Json::String(o.verdict.clone().unwrap_or_default())),
                Source::Previous(n) => r.previous(n).map(|o| Json::String(o.text.clone())),
                Source::Round => r.round().map(|k| Json::from(k + 1)),
                Source::Literal(t) => Some(Json::String(t.clone())),
            };
            if value.is_some() {
                break;
            }
        }
        let mut value = value.ok_or_else(|| Unresolved {
            reference: self.text.clone(),
        })?;
        for f in &self.filters {
            value = apply_filter(*f, value);
        }
        Ok(value)
    }
}

fn apply_filter(f: Filter, value: Json) -> Json {
    match f {
        Filter::Part { index, of } => {
            Json::String(split_part(&json_to_text(&value), index, of).to_string())
        }
        Filter::Take(n) => match value {
            Json::Array(items) => Json::Array(items.into_iter().take(n).collect()),
            other => {
                let text = json_to_text(&other);
                Json::String(text.lines().take(n).collect::<Vec<_>>().join("\n"))
            }
        },
    }
}

/// How a JSON value reads inside a prompt: strings as themselves, lists one element per line,
/// null as nothing, everything else as compact JSON.
pub fn json_to_text(v: &Json) -> String {
    match v {
        Json::Null => String::new(),
        Json::String(s) => s.clone(),
        Json::Array(items) => items
            .iter()
            .map(json_to_text)
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

/// The `index`-th (1-based) of `of` contiguous parts of `text`, cut at line boundaries so
/// that the parts are nearly equal in characters: a line goes to the part its middle
/// character falls into. Every line lands in exactly one part, in order; a part may be empty
/// when the text has fewer lines than parts. The returned part has no trailing newline.
pub fn split_part(text: &str, index: u32, of: u32) -> &str {
    if of == 0 || index == 0 || index > of || text.is_empty() {
        return "";
    }
    let total: usize = text.chars().count();
    let want = (index - 1) as u128;
    let n = of as u128;
    let (mut start, mut end) = (None, 0usize);
    let mut chars_before = 0usize;
    let mut byte = 0usize;
    for line in text.split_inclusive('\n') {
        let len = line.chars().count();
        // The part of the line's middle character: floor((chars_before + (len - 1)/2) * n /
        // total), in integers (len ≥ 1: split_inclusive yields no empty line).
        let part =
            (((2 * chars_before + len - 1) as u128 * n) / (2 * total.max(1) as u128)).min(n - 1);
        if part == want {
            start.get_or_insert(byte);
            end = byte + line.len();
        } else if part > want {
            break;
        }
        chars_before += len;
        byte += line.len();
    }
    match start {
        Some(s) => text[s..end].trim_end_matches('\n'),
        None => "",
    }
}

fn parse_segments(text: &str) -> Result<Vec<Segment>, TemplateError> {
    let mut segs = Vec::new();
    let mut rest = text;
    let mut offset = 0usize;
    while let Some(open) = rest.find("{{") {
        if open > 0 {
            segs.push(Segment::Text(rest[..open].to_string()));
        }
        let after_open = &rest[open + 2..];
        let Some(close) = after_open.find("}}") else {
            return Err(TemplateError {
                offset: offset + open,
                message: "`{{` is never closed by `}}`".into(),
            });
        };
        let inner = &after_open[..close];
        if let Some(nested) = inner.find("{{") {
            return Err(TemplateError {
                offset: offset + open + 2 + nested,
                message: "`{{` inside a reference (references do not nest)".into(),
            });
        }
        segs.push(Segment::Ref(parse_reference(inner, offset + open)?));
        let consumed = open + 2 + close + 2;
        rest = &rest[consumed..];
        offset += consumed;
    }
    if !rest.is_empty() {
        segs.push(Segment::Text(rest.to_string()));
    }
    Ok(segs)
}

/// Split a reference's text at `|`, except inside a double-quoted literal.
fn split_items(inner: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0usize, false, false);
    for (i, c) in inner.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '|' if !quoted => {
                items.push(inner[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if quoted {
        return Err("a `\"` literal is never closed".into());
    }
    items.push(inner[start..].trim());
    Ok(items)
}

/// `default: "TEXT"` (the colon is optional): the literal, with `\"` and `\\` unescaped.
fn parse_default(item: &str) -> Option<Result<String, String>> {
    let rest = item.strip_prefix("default")?;
    if !rest.starts_with(|c: char| c == ':' || c.is_whitespace()) {
        return None; // a node id such as `default` or `defaults`
    }
    let rest = rest.trim_start();
    let rest = rest.strip_prefix(':').unwrap_or(rest).trim();
    let Some(body) = rest.strip_prefix('"').and_then(|r| r.strip_suffix('"')) else {
        return Some(Err(format!("`{item}`: expected `default: \"TEXT\"`")));
    };
    let mut out = String::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(n @ ('"' | '\\')) => out.push(n),
                Some('n') => out.push('\n'),
                Some(n) => return Some(Err(format!("`\\{n}` is not an escape (use \\\" \\\\ \\n)"))),
                None => return Some(Err("a literal ends in `\\`".into())),
            }
        } else {
            out.push(c);
        }
    }
    Some(Ok(out))
}

fn parse_reference(inner: &str, offset: usize) -> Result<Reference, TemplateError> {
    let text = inner.trim().to_string();
    let err = |message: String| TemplateError { offset, message };
    let mut sources = Vec::new();
    let mut filters = Vec::new();
    let mut closed = false;
    for item in split_items(inner).map_err(|m| err(format!("`{{{{{text}}}}}`: {m}")))? {
        if item.is_empty() {
            return Err(err(format!("empty item in `{{{{{text}}}}}`")));
        }
        let literal = match parse_default(item) {
            Some(l) => Some(l.map_err(|m| err(format!("`{{{{{text}}}}}`: {m}")))?),
            None => None,
        };
        if literal.is_none()
            && let Some(f) = parse_filter(item).map_err(|m| err(format!("`{{{{{text}}}}}`: {m}")))?
        {
            filters.push(f);
            continue;
        }
        if !filters.is_empty() {
            return Err(err(format!(
                "`{{{{{text}}}}}`: `{item}` comes after a filter; list every source before the filters"
            )));
        }
        if closed {
            return Err(err(format!(
                "`{{{{{text}}}}}`: `{item}` can never be used: the source before it always has a value (put `?` or `default` last)"
            )));
        }
        if let Some(l) = literal {
            sources.push(Source::Literal(l));
            closed = true;
            continue;
        }
        let (item, optional) = match item.strip_suffix('?') {
            Some(i) => (i.trim_end(), true),
            None => (item, false),
        };
        sources.push(parse_source(item).map_err(|m| err(format!("`{{{{{text}}}}}`: {m}")))?);
        if optional {
            sources.push(Source::Literal(String::new()));
            closed = true;
        }
    }
    if sources.iter().all(|s| matches!(s, Source::Literal(_))) {
        return Err(err(format!(
            "`{{{{{text}}}}}` names no source (input.FIELD, NODE, NODE.verdict, NODE.prev or loop.round)"
        )));
    }
    Ok(Reference {
        text,
        sources,
        filters,
    })
}

/// The filters a reference may end with, as messages name them.
pub const FILTERS: &str = "`part I of N`, `take N`; and to give a value when no source has one, `?` or `default: \"TEXT\"`";

fn parse_filter(item: &str) -> Result<Option<Filter>, String> {
    let words: Vec<&str> = item.split_whitespace().collect();
    match words.as_slice() {
        ["part", i, "of", n] => {
            let (Ok(index), Ok(of)) = (i.parse::<u32>(), n.parse::<u32>()) else {
                return Err(format!(
                    "`{item}`: expected `part I of N` with whole numbers"
                ));
            };
            if of == 0 || index == 0 || index > of {
                return Err(format!("`{item}`: need 1 ≤ I ≤ N"));
            }
            Ok(Some(Filter::Part { index, of }))
        }
        ["take", n] => match n.parse::<usize>() {
            Ok(k) if k > 0 => Ok(Some(Filter::Take(k))),
            _ => Err(format!("`{item}`: expected `take N` with N ≥ 1")),
        },
        ["part", ..] | ["take", ..] if words.len() > 1 => Err(format!(
            "`{item}` is not a filter (filters: `part I of N`, `take N`)"
        )),
        _ if words.len() > 1 => Err(format!("`{item}` is not a source or a filter (filters: {FILTERS})")),
        _ => Ok(None),
    }
}

fn parse_source(item: &str) -> Result<Source, String> {
    if let Some(field) = item.strip_prefix("input.") {
        if field.is_empty() || field.contains(char::is_whitespace) {
            return Err(format!("`{item}`: expected `input.FIELD`"));
        }
        return Ok(Source::Input(field.to_string()));
    }
    if item == "input" {
        return Err("`input` needs a field: `input.FIELD`".into());
    }
    if item == "loop.round" {
        return Ok(Source::Round);
    }
    if item == "loop" || item.starts_with("loop.") {
        return Err(format!("`{item}`: the loop's value is `loop.round`"));
    }
    let (node, attr) = match item.split_once('.') {
        Some((n, a)) => (n, Some(a)),
        None => (item, None),
    };
    if !super::yaml::is_ident(node, false) {
        return Err(format!("`{node}` is not a node id"));
    }
    match attr {
        None | Some("text") => Ok(Source::Output(node.to_string())),
        Some("verdict") => Ok(Source::Verdict(node.to_string())),
        Some("prev") => Ok(Source::Previous(node.to_string())),
        Some(other) => Err(format!(
            "`{node}.{other}`: a node reference reads `.text`, `.verdict` or `.prev`"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    struct Fake {
        inputs: BTreeMap<String, Json>,
        outputs: BTreeMap<String, NodeOutput>,
    }

    impl Resolve for Fake {
        fn input(&self, field: &str) -> Option<&Json> {
            self.inputs.get(field)
        }
        fn output(&self, node: &str) -> Option<&NodeOutput> {
            self.outputs.get(node)
        }
    }

    fn fake() -> Fake {
        let mut inputs = BTreeMap::new();
        inputs.insert("question".into(), Json::String("How many?".into()));
        inputs.insert(
            "tests".into(),
            serde_json::json!(["assert f(1) == 2", "assert f(2) == 3"]),
        );
        let mut outputs = BTreeMap::new();
        outputs.insert(
            "test".into(),
            NodeOutput {
                text: "1/2 passed".into(),
                verdict: Some("fail".into()),
                ..Default::default()
            },
        );
        outputs.insert(
            "generate".into(),
            NodeOutput {
                text: "def f(x): return x".into(),
                ..Default::default()
            },
        );
        Fake { inputs, outputs }
    }

    fn parse(t: &str) -> Template {
        Template::parse(t).unwrap_or_else(|e| panic!("{t}: {e}"))
    }

    #[test]
    fn parses_sources_fallbacks_and_filters() {
        let t = parse(
            "Q: {{input.question}}\nCode: {{ repair | generate }}\n{{test.verdict}}{{input.t | part 2 of 3 | take 4}}",
        );
        let refs = t.references();
        assert_eq!(refs.len(), 4);
        assert_eq!(refs[0].sources, vec![Source::Input("question".into())]);
        assert_eq!(
            refs[1].sources,
            vec![
                Source::Output("repair".into()),
                Source::Output("generate".into())
            ]
        );
        assert_eq!(refs[2].sources, vec![Source::Verdict("test".into())]);
        assert_eq!(
            refs[3].filters,
            vec![Filter::Part { index: 2, of: 3 }, Filter::Take(4)]
        );
        assert_eq!(t.static_text(), "Q: \nCode: \n");
    }

    #[test]
    fn rejects_malformed_references_with_offsets() {
        let e = Template::parse("abc {{input.x")
            .err()
            .unwrap_or_else(|| panic!("parsed"));
        assert_eq!(e.offset, 4);
        assert!(Template::parse("{{}}").is_err());
        assert!(Template::parse("{{ a | }}").is_err());
        assert!(Template::parse("{{input}}").is_err());
        assert!(Template::parse("{{a.value}}").is_err());
        assert!(Template::parse("{{a | part 3 of 2}}").is_err());
        assert!(Template::parse("{{a | part 1 of 2 | b}}").is_err());
        assert!(Template::parse("{{ 9lives }}").is_err());
        assert!(Template::parse("{{a | take 0}}").is_err());
        // A lone `}}` or single braces are text.
        assert_eq!(parse("x }} {y}").references().len(), 0);
    }

    /// No model of the catalogue takes a context longer than [`MAX_RENDERED_BYTES`] can hold.
    #[test]
    fn the_render_limit_covers_every_context() {
        use switchyard_predictor::spec::{hybrid_catalogue, model_catalogue};
        let most = model_catalogue().iter().chain(&hybrid_catalogue()).map(|m| m.max_position_embeddings).max();
        assert_eq!(most, Some((MAX_RENDERED_BYTES / crate::tokens::MAX_TOKEN_BYTES) as u64));
    }

    /// A template that repeats a large value stops at [`MAX_RENDERED_BYTES`] instead of
    /// building the whole text (here 40 × 1 MiB; a registered workflow could ask for gigabytes).
    #[test]
    fn rendering_stops_at_the_byte_limit() {
        let mut f = fake();
        f.inputs.insert("big".into(), Json::String("x".repeat(1 << 20)));
        let too_long = |r: Result<Json, RenderError>| matches!(r, Err(RenderError::TooLong));
        let many = parse(&"{{input.big}}".repeat(40));
        assert!(matches!(many.render_segments(&f), Err(RenderError::TooLong)));
        assert!(too_long(many.render_value(&f)));
        // A list of tool inputs shares one budget: two items within it alone, not together; the
        // same with single references, each the value itself.
        let list = Template::list(vec![parse(&"{{input.big}}".repeat(16)), parse(&"{{input.big}}".repeat(17))]);
        assert!(too_long(list.render_value(&f)));
        let singles = Template::list((0..33).map(|_| parse("{{input.big}}")).collect());
        assert!(too_long(singles.render_value(&f)));
        let fewer = Template::list((0..31).map(|_| parse("{{input.big}}")).collect());
        assert!(fewer.render_value(&f).is_ok_and(|v| v.as_array().is_some_and(|a| a.len() == 31)));
        // At the limit exactly it renders.
        let fits = parse(&"{{input.big}}".repeat(MAX_RENDERED_BYTES >> 20));
        assert_eq!(fits.render_segments(&f).map(|s| s.concat().len()), Ok(MAX_RENDERED_BYTES));
    }

    #[test]
    fn renders_text_with_fallbacks() {
        let f = fake();
        let t = parse("Code:\n{{repair | generate}}\nVerdict: {{test.verdict}}");
        let segs = t.render_segments(&f).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            segs,
            vec!["Code:\n", "def f(x): return x", "\nVerdict: ", "fail"]
        );
        let missing = parse("{{repair}}").render_segments(&f);
        assert_eq!(
            missing,
            Err(RenderError::Unresolved(Unresolved {
                reference: "repair".into()
            }))
        );
        // Lists read one element per line inside text.
        assert_eq!(
            parse("{{input.tests}}")
                .render_segments(&f)
                .map(|s| s.concat()),
            Ok("assert f(1) == 2\nassert f(2) == 3".into())
        );
    }

    #[test]
    fn a_single_reference_yields_the_value_itself() {
        let f = fake();
        assert_eq!(
            parse("{{input.tests}}").render_value(&f),
            Ok(serde_json::json!(["assert f(1) == 2", "assert f(2) == 3"]))
        );
        assert_eq!(
            parse(" {{input.tests | take 1}} ").render_value(&f),
            Ok(serde_json::json!(["assert f(1) == 2"]))
        );
        assert_eq!(
            parse("tests: {{input.tests}}").render_value(&f),
            Ok(Json::String(
                "tests: assert f(1) == 2\nassert f(2) == 3".into()
            ))
        );
        let list = Template::list(vec![parse("{{generate}}"), parse("{{test}}")]);
        assert_eq!(
            list.render_value(&f),
            Ok(serde_json::json!(["def f(x): return x", "1/2 passed"]))
        );
    }

    #[test]
    fn parts_are_contiguous_and_balanced() {
        let text: String = (0..60)
            .map(|i| format!("speaker {i}: {}\n", "word ".repeat(i % 7 + 1)))
            .collect();
        let parts: Vec<&str> = (1..=6).map(|i| split_part(&text, i, 6)).collect();
        assert_eq!(parts.join("\n") + "\n", text);
        let total = text.chars().count();
        let longest_line = text
            .lines()
            .map(|l| l.chars().count() + 1)
            .max()
            .unwrap_or(0);
        for p in &parts {
            let n = p.chars().count() + 1;
            assert!(
                n.abs_diff(total / 6) <= longest_line,
                "part of {n} chars vs {}",
                total / 6
            );
        }
        // Halves made of thirds: part 1..3 of 6 is the first half split again.
        let half = [parts[0], parts[1], parts[2]].join("\n");
        assert_eq!(split_part(&text, 1, 2), half);
        assert_eq!(split_part("one line", 2, 2), "");
        assert_eq!(split_part("one line", 1, 2), "one line");
        assert_eq!(split_part("", 1, 1), "");
    }

    #[test]
    fn optional_references_defaults_previous_rounds_and_round_numbers() {
        let f = fake();
        assert_eq!(parse("[{{repair?}}]").render_segments(&f).map(|s| s.concat()), Ok("[]".into()));
        assert_eq!(parse("{{test.verdict?}}").render_segments(&f).map(|s| s.concat()), Ok("fail".into()));
        let d = parse(r#"{{tester.verdict | default: "none | yet"}}"#);
        assert_eq!(d.references()[0].sources[1], Source::Literal("none | yet".into()));
        assert_eq!(d.render_segments(&f).map(|s| s.concat()), Ok("none | yet".into()));
        assert_eq!(parse(r#"{{a | default "x\"y"}}"#).references()[0].sources[1], Source::Literal("x\"y".into()));
        // A node may be called `default`; `defaults` is a node too.
        assert_eq!(parse("{{defaults}}").references()[0].sources, vec![Source::Output("defaults".into())]);
        assert_eq!(parse("{{coder.prev?}}").references()[0].sources[0], Source::Previous("coder".into()));
        assert_eq!(parse("round {{loop.round}}").references()[0].sources, vec![Source::Round]);
        // Without a session's round or previous round, they have no value.
        assert!(parse("{{loop.round}}").render_segments(&f).is_err());
        assert_eq!(parse("{{coder.prev?}}").render_segments(&f).map(|s| s.concat()), Ok(String::new()));
        for bad in ["{{a? | b}}", r#"{{default: "x" | b}}"#, r#"{{a | default: x}}"#, r#"{{a | default: "x}}"#, "{{loop.x}}", r#"{{default: "x"}}"#] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn take_on_text_keeps_leading_lines() {
        assert_eq!(
            apply_filter(Filter::Take(2), Json::String("a\nb\nc".into())),
            Json::String("a\nb".into())
        );
    }
}
