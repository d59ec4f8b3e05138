//! A YAML document as a tree that keeps the line and column of every key and value, parsed
//! once with serde-saphyr's `Spanned`, and small typed accessors over it that report errors
//! with file, position and field path.
//!
//! Knows nothing about the workflow schema; depends only on `error`.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use super::error::{ErrorKind, WorkflowError};

/// A 1-based source position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: u64,
    pub column: u64,
}

impl Pos {
    fn of<T>(s: &Spanned<T>) -> Pos {
        Pos {
            line: s.referenced.line().max(1),
            column: s.referenced.column().max(1),
        }
    }
}

/// A YAML value with its position.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub value: Value,
    pub pos: Pos,
}

/// A mapping key with its position.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    pub name: String,
    pub pos: Pos,
}

/// YAML values as the loader sees them (after the parser's scalar typing).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

impl Value {
    /// Short description used in "expected X, found Y" messages.
    pub fn describe(&self) -> String {
        match self {
            Value::Null => "nothing (null)".into(),
            Value::Bool(b) => format!("boolean `{b}`"),
            Value::Int(i) => format!("integer `{i}`"),
            Value::Float(x) => format!("number `{x}`"),
            Value::Str(s) => {
                let short: String = s.chars().take(40).collect();
                if short.len() < s.len() {
                    format!("string `{short}…`")
                } else {
                    format!("string `{short}`")
                }
            }
            Value::Seq(_) => "a list".into(),
            Value::Map(_) => "a mapping".into(),
        }
    }
}

/// The raw tree as deserialized; converted into [`Node`] right away so that no serde-saphyr
/// type leaks past this module.
enum Raw {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<Raw>>),
    Map(Vec<(Spanned<String>, Spanned<Raw>)>),
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = Raw;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Raw, D::Error> {
        d.deserialize_any(RawVisitor)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Raw, E> {
        Ok(Raw::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Raw, E> {
        Ok(Raw::Int(v as i128))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Raw, E> {
        Ok(Raw::Int(v as i128))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Raw, E> {
        Ok(Raw::Int(v))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Raw, E> {
        Ok(i128::try_from(v)
            .map(Raw::Int)
            .unwrap_or(Raw::Float(v as f64)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Raw, E> {
        Ok(Raw::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Raw, E> {
        Ok(Raw::Str(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Raw, E> {
        Ok(Raw::Str(v))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Raw, E> {
        Ok(Raw::Str(String::from_utf8_lossy(v).into_owned()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Raw>>()? {
            items.push(item);
        }
        Ok(Raw::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<String>>()? {
            let value = map.next_value::<Spanned<Raw>>()?;
            entries.push((key, value));
        }
        Ok(Raw::Map(entries))
    }
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawVisitor)
    }
}

fn convert(raw: Spanned<Raw>) -> Node {
    let pos = Pos::of(&raw);
    let value = match raw.value {
        Raw::Null => Value::Null,
        Raw::Bool(b) => Value::Bool(b),
        Raw::Int(i) => Value::Int(i),
        Raw::Float(x) => Value::Float(x),
        Raw::Str(s) => Value::Str(s),
        Raw::Seq(items) => Value::Seq(items.into_iter().map(convert).collect()),
        Raw::Map(entries) => Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| {
                    let kp = Pos::of(&k);
                    (
                        Key {
                            name: k.value,
                            pos: kp,
                        },
                        convert(v),
                    )
                })
                .collect(),
        ),
    };
    Node { value, pos }
}

/// Parse YAML text into a positioned tree. Syntax errors (and inputs over the parser's
/// budget: nesting depth 64, 250k nodes, alias amplification) carry the parser's position.
pub fn parse(file: &str, text: &str) -> Result<Node, WorkflowError> {
    parse_with(file, text, serde_saphyr::Options::default())
}

/// [`parse`] with YAML 1.2's booleans only (`true`/`false`): `n`, `yes` or `off` stay text, as a
/// typed reader of a name would read them (a pool file's `node: n`).
pub fn parse_strict_booleans(file: &str, text: &str) -> Result<Node, WorkflowError> {
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    parse_with(file, text, options)
}

fn parse_with(file: &str, text: &str, options: serde_saphyr::Options) -> Result<Node, WorkflowError> {
    match serde_saphyr::from_str_with_options::<Spanned<Raw>>(text, options) {
        Ok(raw) => Ok(convert(raw)),
        Err(e) => {
            let (line, column) = e
                .location()
                .map(|l| (l.line().max(1), l.column().max(1)))
                .unwrap_or((1, 1));
            let mut message = e.without_snippet().to_string();
            // The parser repeats the position in its message; we print it once, up front.
            let suffix = format!(" at line {line}, column {column}");
            if let Some(stripped) = message.strip_suffix(&suffix) {
                message = stripped.to_string();
            }
            let prefix = format!("line {line} column {column}: ");
            if let Some(idx) = message.find(&prefix) {
                message = message[idx + prefix.len()..].to_string();
            }
            // The parser places a tab where the token it was scanning began (a plain scalar on
            // the line before, say): point at the tab itself.
            let (line, column) = match first_tab(text, line).filter(|_| message.contains("tab")) {
                Some(at) => {
                    message.push_str(" (YAML indents with spaces, never tabs)");
                    at
                }
                None => (line, column),
            };
            Err(WorkflowError::Invalid {
                file: file.to_string(),
                line,
                column,
                field: field_at(text, line).unwrap_or_else(|| "(document)".into()),
                kind: ErrorKind::Syntax,
                message: format!("not valid YAML: {message}"),
            })
        }
    }
}

/// The 1-based `(line, column)` of the first tab on `line` or after it.
fn first_tab(text: &str, line: u64) -> Option<(u64, u64)> {
    let start = usize::try_from(line).ok()?.checked_sub(1)?;
    text.lines().enumerate().skip(start).find_map(|(i, l)| {
        let at = l.chars().position(|c| c == '\t')?;
        Some((i as u64 + 1, at as u64 + 1))
    })
}

/// The field path of the key on 1-based `line`, read from the text's indentation (the parser
/// refused the document, so there is no tree): the keys of the enclosing block mappings and
/// sequence items named by their `id:` (else by their index), e.g. `nodes.generate.output_tokens`
/// for a duplicate key or a `.nan` there. Block scalars' text is not read as keys; compact
/// sequences (`- ` at the parent key's column) are understood. `None` when the line holds no
/// key (then the error names the document).
fn field_at(text: &str, line: u64) -> Option<String> {
    let target = usize::try_from(line).ok()?.checked_sub(1)?;
    let lines = outline(text);
    let here = lines.get(target)?.as_ref()?;
    // A line without a key (a flow collection's continuation, a flow item) is named by where
    // it sits.
    let mut parts: Vec<String> = here.key.clone().into_iter().collect();
    // Where the walk up stands: inside a mapping whose keys are at this column, or inside a
    // sequence whose dashes are at this column.
    #[derive(Clone, Copy)]
    enum At {
        Key(usize),
        Seq(usize),
    }
    let mut at = match here.dash {
        Some(d) => {
            parts.push(item_label(&lines, target, d));
            At::Seq(d)
        }
        None => At::Key(here.column),
    };
    for k in (0..target).rev() {
        let Some(l) = &lines[k] else { continue };
        match (at, l.dash) {
            // The item whose mapping holds our key (the key on its dash line, or its parent).
            (At::Key(c), Some(d)) if d < c && l.column <= c => {
                if l.column < c {
                    parts.extend(l.key.clone());
                }
                parts.push(item_label(&lines, k, d));
                at = At::Seq(d);
            }
            (At::Key(c), None) if l.column < c => {
                parts.extend(l.key.clone());
                at = At::Key(l.column);
            }
            // The key that holds our sequence: at a smaller column, or at the dashes' own
            // column (a compact sequence); an item line's key when sequences nest.
            (At::Seq(d), None) if l.column <= d => {
                parts.extend(l.key.clone());
                at = At::Key(l.column);
            }
            (At::Seq(d), Some(e)) if e < d && l.column <= d => {
                parts.extend(l.key.clone());
                parts.push(item_label(&lines, k, e));
                at = At::Seq(e);
            }
            _ => {}
        }
        if matches!(at, At::Key(0)) {
            break;
        }
    }
    if parts.is_empty() {
        return None;
    }
    parts.reverse();
    Some(parts.join("."))
}

/// One line of a block-style YAML text as [`field_at`] reads it.
struct OutlineLine {
    /// Column of the key (or of the item's content when there is no key).
    column: usize,
    /// Column of the `-` when the line starts a sequence item.
    dash: Option<usize>,
    key: Option<String>,
    /// The scalar after `key:`, without a trailing comment.
    value: String,
}

/// The text's lines (by `str::lines`) as keys and items; `None` for blank lines, comments and
/// the text of block scalars (`|`, `>`).
fn outline(text: &str) -> Vec<Option<OutlineLine>> {
    let mut out = Vec::new();
    // Column of the key whose block scalar is being read.
    let mut block: Option<usize> = None;
    for l in text.strip_prefix('\u{feff}').unwrap_or(text).lines() {
        let body = l.trim_start();
        let indent = l.len() - body.len();
        if let Some(b) = block {
            if body.is_empty() || indent > b {
                out.push(None);
                continue;
            }
            block = None;
        }
        if body.is_empty() || body.starts_with('#') {
            out.push(None);
            continue;
        }
        let (dash, rest) = match body.strip_prefix('-') {
            Some(r) if r.is_empty() || r.starts_with([' ', '\t']) => (Some(indent), r.trim_start()),
            _ => (None, body),
        };
        let column = l.len() - rest.len();
        // `key:` then a space, a tab or the end of the line; not inside a flow collection.
        let end = rest
            .find(": ")
            .or_else(|| rest.find(":\t"))
            .or_else(|| rest.strip_suffix(':').map(str::len))
            .filter(|_| !rest.starts_with(['{', '[']));
        let (key, value) = match end {
            Some(e) => {
                let key = rest[..e].trim().trim_matches(|c| c == '"' || c == '\'');
                let value = rest[e + 1..].trim();
                let value = [" #", "\t#"].iter().filter_map(|m| value.find(m)).min().map_or(value, |h| value[..h].trim_end());
                ((!key.is_empty()).then(|| key.to_string()), value.to_string())
            }
            None => (None, String::new()),
        };
        let block_value = |v: &str| v.starts_with('|') || v.starts_with('>');
        if (key.is_some() && block_value(&value)) || (key.is_none() && dash.is_some() && block_value(rest)) {
            block = Some(column);
        }
        out.push(Some(OutlineLine { column, dash, key, value }));
    }
    out
}

/// The sequence item whose `-` is on line `at` at column `dash`: its `id:` (on that line or
/// among the item's keys below), else its index among the items of its sequence.
fn item_label(lines: &[Option<OutlineLine>], at: usize, dash: usize) -> String {
    let unquote = |v: &str| v.trim_matches(|c| c == '"' || c == '\'').to_string();
    // The column of the item's own keys: its dash line's key, else (a bare `-`) the first line
    // below it.
    let mut own = lines[at].as_ref().filter(|l| l.key.is_some()).map(|l| l.column);
    for (k, l) in lines.iter().enumerate().skip(at) {
        let Some(l) = l else { continue };
        if k > at && (l.dash.is_some_and(|d| d <= dash) || (l.dash.is_none() && l.column <= dash)) {
            break;
        }
        if k > at && own.is_none() {
            own = Some(l.column);
        }
        if l.key.as_deref() == Some("id") && (k == at || (l.dash.is_none() && Some(l.column) == own)) {
            return unquote(&l.value);
        }
    }
    let earlier = lines[..at]
        .iter()
        .rev()
        .flatten()
        .take_while(|l| l.dash.map_or(l.column > dash, |d| d >= dash))
        .filter(|l| l.dash == Some(dash))
        .count();
    earlier.to_string()
}

/// Builds positioned errors for one file.
#[derive(Debug, Clone, Copy)]
pub struct Ctx<'a> {
    pub file: &'a str,
}

impl Ctx<'_> {
    pub fn err(
        &self,
        pos: Pos,
        field: &str,
        kind: ErrorKind,
        message: impl Into<String>,
    ) -> WorkflowError {
        WorkflowError::Invalid {
            file: self.file.to_string(),
            line: pos.line,
            column: pos.column,
            field: field.to_string(),
            kind,
            message: message.into(),
        }
    }

    fn bad_type(&self, node: &Node, field: &str, expected: &str) -> WorkflowError {
        self.err(
            node.pos,
            field,
            ErrorKind::BadType,
            format!("expected {expected}, found {}", node.value.describe()),
        )
    }

    /// View `node` as a mapping and check that it only has `allowed` keys (every unknown key is
    /// reported, together).
    pub fn map<'n>(
        &self,
        node: &'n Node,
        field: &str,
        allowed: &[&str],
    ) -> Result<MapView<'n>, WorkflowError> {
        let mut unknown = Vec::new();
        let view = self.map_all(node, field, allowed, &mut unknown)?;
        if unknown.is_empty() { Ok(view) } else { Err(WorkflowError::many(unknown)) }
    }

    /// View `node` as a mapping; each key outside `allowed` is pushed on `errors` (with the
    /// closest allowed key as a hint) and the view is returned anyway, so that the known keys'
    /// own problems are found too. Only a value that is not a mapping is an error here.
    pub fn map_all<'n>(
        &self,
        node: &'n Node,
        field: &str,
        allowed: &[&str],
        errors: &mut Vec<WorkflowError>,
    ) -> Result<MapView<'n>, WorkflowError> {
        let Value::Map(entries) = &node.value else {
            return Err(self.bad_type(node, field, "a mapping"));
        };
        for (k, _) in entries {
            if !allowed.contains(&k.name.as_str()) {
                let hint = if field.is_empty() && k.name == "devices" {
                    // A pool file given where a workflow belongs.
                    " (a pool file? pass it with `--pool FILE`)".to_string()
                } else {
                    closest(&k.name, allowed).map(|c| format!(" (did you mean `{c}`?)")).unwrap_or_default()
                };
                errors.push(self.err(
                    k.pos,
                    &join_path(field, &k.name),
                    ErrorKind::UnknownField,
                    format!(
                        "unknown field `{}`{hint}; expected one of: {}",
                        k.name,
                        allowed.join(", ")
                    ),
                ));
            }
        }
        Ok(MapView {
            entries,
            pos: node.pos,
        })
    }

    /// View `node` as a mapping with free-form keys (e.g. `deployments:`).
    pub fn entries<'n>(
        &self,
        node: &'n Node,
        field: &str,
    ) -> Result<&'n [(Key, Node)], WorkflowError> {
        match &node.value {
            Value::Map(entries) => Ok(entries),
            _ => Err(self.bad_type(node, field, "a mapping")),
        }
    }

    pub fn seq<'n>(&self, node: &'n Node, field: &str) -> Result<&'n [Node], WorkflowError> {
        match &node.value {
            Value::Seq(items) => Ok(items),
            _ => Err(self.bad_type(node, field, "a list")),
        }
    }

    /// A string; plain scalars the parser typed as numbers or booleans are accepted as their
    /// text (so `model: 8` is the string "8", which then fails the catalogue lookup clearly).
    pub fn string(&self, node: &Node, field: &str) -> Result<String, WorkflowError> {
        match &node.value {
            Value::Str(s) => Ok(s.clone()),
            Value::Int(i) => Ok(i.to_string()),
            Value::Float(x) => Ok(x.to_string()),
            Value::Bool(b) => Ok(b.to_string()),
            _ => Err(self.bad_type(node, field, "a string")),
        }
    }

    /// A non-empty identifier made of ASCII letters, digits, `_` and `-` (and `.` when
    /// `allow_dot`), not starting with a digit or `-`.
    pub fn ident(
        &self,
        node: &Node,
        field: &str,
        allow_dot: bool,
    ) -> Result<String, WorkflowError> {
        let s = self.string(node, field)?;
        if !is_ident(&s, allow_dot) {
            return Err(self.err(
                node.pos,
                field,
                ErrorKind::BadType,
                format!(
                    "`{s}` is not a valid name (letters, digits, `_`{} and `-`, not starting with a digit or `-`)",
                    if allow_dot { ", `.`" } else { "" }
                ),
            ));
        }
        Ok(s)
    }

    /// A list of strings; a single string is accepted as a one-element list.
    pub fn string_list(
        &self,
        node: &Node,
        field: &str,
    ) -> Result<Vec<(String, Pos)>, WorkflowError> {
        match &node.value {
            Value::Seq(items) => items
                .iter()
                .enumerate()
                .map(|(i, n)| Ok((self.string(n, &format!("{field}[{i}]"))?, n.pos)))
                .collect(),
            _ => Ok(vec![(self.string(node, field)?, node.pos)]),
        }
    }

    pub fn u32(&self, node: &Node, field: &str) -> Result<u32, WorkflowError> {
        match &node.value {
            Value::Int(i) if *i >= 0 && *i <= u32::MAX as i128 => Ok(*i as u32),
            Value::Int(_) => Err(self.err(
                node.pos,
                field,
                ErrorKind::BadType,
                format!(
                    "expected a non-negative integer below 2^32, found {}",
                    node.value.describe()
                ),
            )),
            _ => Err(self.bad_type(node, field, "a non-negative integer")),
        }
    }

    /// A finite number (integers accepted).
    pub fn f64(&self, node: &Node, field: &str) -> Result<f64, WorkflowError> {
        match &node.value {
            Value::Int(i) => Ok(*i as f64),
            Value::Float(x) if x.is_finite() => Ok(*x),
            _ => Err(self.bad_type(node, field, "a finite number")),
        }
    }
}

/// The value as JSON (positions dropped; integers beyond `i64` become floats).
pub fn to_json(node: &Node) -> serde_json::Value {
    use serde_json::Value as J;
    match &node.value {
        Value::Null => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => match i64::try_from(*i) {
            Ok(x) => J::from(x),
            Err(_) => serde_json::Number::from_f64(*i as f64).map(J::Number).unwrap_or(J::Null),
        },
        Value::Float(x) => serde_json::Number::from_f64(*x).map(J::Number).unwrap_or(J::Null),
        Value::Str(s) => J::String(s.clone()),
        Value::Seq(items) => J::Array(items.iter().map(to_json).collect()),
        Value::Map(entries) => J::Object(entries.iter().map(|(k, v)| (k.name.clone(), to_json(v))).collect()),
    }
}

/// A checked mapping.
#[derive(Debug, Clone, Copy)]
pub struct MapView<'n> {
    pub entries: &'n [(Key, Node)],
    pub pos: Pos,
}

impl<'n> MapView<'n> {
    pub fn get(&self, key: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|(k, _)| k.name == key)
            .map(|(_, v)| v)
    }

    pub fn key_pos(&self, key: &str) -> Option<Pos> {
        self.entries
            .iter()
            .find(|(k, _)| k.name == key)
            .map(|(k, _)| k.pos)
    }

    pub fn required(
        &self,
        ctx: &Ctx<'_>,
        field: &str,
        key: &str,
    ) -> Result<&'n Node, WorkflowError> {
        self.get(key).ok_or_else(|| {
            ctx.err(
                self.pos,
                &join_path(field, key),
                ErrorKind::MissingField,
                format!("missing required field `{key}`"),
            )
        })
    }
}

/// `a.b` (or `b` when `a` is empty).
pub fn join_path(parent: &str, child: &str) -> String {
    if parent.is_empty() {
        child.to_string()
    } else {
        format!("{parent}.{child}")
    }
}

pub fn is_ident(s: &str, allow_dot: bool) -> bool {
    let mut chars = s.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    (first.is_ascii_alphabetic() || first == '_')
        && chars
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || (allow_dot && c == '.'))
}

/// The candidate closest to `word` by edit distance, if it is plausibly a typo of it.
pub fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (edit_distance(word, c), *c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over characters.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let sub = prev[j - 1] + usize::from(a[i - 1] != b[j - 1]);
            cur[j] = sub.min(prev[j] + 1).min(cur[j - 1] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_positions_of_keys_and_values() {
        let doc = parse("t.yaml", "name: x\nnodes:\n  - id: a\n    after: [b, c]\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let Value::Map(top) = &doc.value else {
            panic!("not a map")
        };
        assert_eq!(top[1].0.name, "nodes");
        assert_eq!(top[1].0.pos, Pos { line: 2, column: 1 });
        let Value::Seq(nodes) = &top[1].1.value else {
            panic!("not a seq")
        };
        let Value::Map(node) = &nodes[0].value else {
            panic!("not a map")
        };
        assert_eq!(node[1].0.pos, Pos { line: 4, column: 5 });
        let Value::Seq(after) = &node[1].1.value else {
            panic!("not a seq")
        };
        assert_eq!(
            after[1].pos,
            Pos {
                line: 4,
                column: 16
            }
        );
        assert_eq!(after[1].value, Value::Str("c".into()));
    }

    #[test]
    fn syntax_errors_carry_the_parser_position() {
        let e = parse("t.yaml", "name: x\nnodes: [a, \n")
            .err()
            .unwrap_or_else(|| panic!("parsed"));
        assert_eq!(e.kind(), Some(ErrorKind::Syntax));
        assert_eq!(e.position(), Some((2, 8)));
        assert!(
            e.to_string()
                .starts_with("t.yaml:2:8: nodes: not valid YAML: unclosed bracket"),
            "{e}"
        );
        let dup = parse("t.yaml", "a: 1\na: 2\n")
            .err()
            .unwrap_or_else(|| panic!("parsed"));
        assert_eq!(dup.position(), Some((2, 1)));
        assert_eq!(dup.field(), Some("a"), "{dup}");
    }

    #[test]
    fn syntax_errors_name_the_field_from_the_indentation() {
        let text = "name: x\nnodes:\n  - id: gen\n    deployment: d\n    output_tokens: {mean: 5}\n    output_tokens: {mean: 6}\n  - id: other\n    after: [gen]\n";
        let e = parse("t.yaml", text).err().unwrap_or_else(|| panic!("parsed"));
        assert_eq!(e.position().map(|p| p.0), Some(6), "{e}");
        assert_eq!(e.field(), Some("nodes.gen.output_tokens"), "{e}");
        // An item without `id:` is named by its index.
        let text = "deployments:\n  d: {model: m}\nlist:\n  - a: 1\n  - a: 2\n    a: 3\n";
        let e = parse("t.yaml", text).err().unwrap_or_else(|| panic!("parsed"));
        assert_eq!(e.field(), Some("list.1.a"), "{e}");
        // A line without a key names the document.
        let e = parse("t.yaml", "name: x\nnodes: [a, \n").err().unwrap_or_else(|| panic!("parsed"));
        assert_eq!(e.field(), Some("nodes"), "{e}");
    }

    #[test]
    fn field_paths_follow_common_yaml_styles() {
        let at = |text: &str, line: u64| field_at(text, line);
        // A compact sequence (dashes at the parent key's column).
        let c = "name: x\nnodes:\n- id: gen\n  deployment: d\n  output_tokens: {mean: 5}\n";
        assert_eq!(at(c, 5).as_deref(), Some("nodes.gen.output_tokens"));
        // Indices count the items of their own sequence only.
        let c = "name: x\nfoo:\n- a: 1\n- a: 2\nnodes:\n- deployment: d\n- deployment: d\n  deployment: e\n";
        assert_eq!(at(c, 8).as_deref(), Some("nodes.1.deployment"));
        // A comment after the id; an item whose mapping starts on the next line.
        let c = "name: x\nnodes:\n  - id: gen   # the generator\n    a: 1\n";
        assert_eq!(at(c, 4).as_deref(), Some("nodes.gen.a"));
        let c = "name: x\nnodes:\n  -\n    id: gen\n    a: 1\n";
        assert_eq!(at(c, 5).as_deref(), Some("nodes.gen.a"));
        // A block scalar's text is no key; the key after it is found.
        let c = "name: x\nnodes:\n  - id: gen\n    prompt: >\n      foo: bar\n      baz: 1\n    after: [a]\n";
        assert_eq!(at(c, 6), None);
        assert_eq!(at(c, 7).as_deref(), Some("nodes.gen.after"));
        // Nested mappings under an item, and a key on the item's dash line.
        let c = "nodes:\n  - id: gen\n    output_tokens:\n      mean: 5\n  - id: b\n";
        assert_eq!(at(c, 4).as_deref(), Some("nodes.gen.output_tokens.mean"));
        assert_eq!(at(c, 5).as_deref(), Some("nodes.b.id"));
        // A byte-order mark, a tab after the colon, a key with a space.
        assert_eq!(at("\u{feff}deployments:\n  a: {model: m}\n", 2).as_deref(), Some("deployments.a"));
        assert_eq!(at("nodes:\n  - id: gen\n    tool:\tt\n", 3).as_deref(), Some("nodes.gen.tool"));
        assert_eq!(at("dataset:\n  fields:\n    my field: x\n", 3).as_deref(), Some("dataset.fields.my field"));
        // A flow collection's continuation line is named by its parent; a flow item by its index.
        let c = "nodes:\n  - id: a\n    inputs:\n      xs: [1,\n        .nan]\n";
        assert_eq!(at(c, 5).as_deref(), Some("nodes.a.inputs.xs"));
        assert_eq!(at("nodes:\n  - {id: a, tool: t, tool: u}\n", 2).as_deref(), Some("nodes.0"));
    }

    #[test]
    fn scalars_are_typed() {
        let doc = parse("t.yaml", "a: 5\nb: 0.5\nc: '5'\nd: true\ne:\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let Value::Map(m) = &doc.value else {
            panic!("not a map")
        };
        let vals: Vec<&Value> = m.iter().map(|(_, v)| &v.value).collect();
        assert_eq!(
            vals,
            vec![
                &Value::Int(5),
                &Value::Float(0.5),
                &Value::Str("5".into()),
                &Value::Bool(true),
                &Value::Null
            ]
        );
    }

    #[test]
    fn typos_find_their_closest_field() {
        assert_eq!(
            closest("deploymnet", &["deployment", "prompt", "after"]),
            Some("deployment")
        );
        assert_eq!(closest("zzz", &["deployment", "prompt"]), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
