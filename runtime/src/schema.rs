//! Structured outputs of agent nodes: the subset of JSON Schema a workflow may declare for an
//! answer (`output: {schema: …}`), checking an answer against it, and drawing a conforming
//! value deterministically from a seeded RNG (what an emulated model answers).
//!
//! The subset is the one structured-output engines accept for guided decoding (vLLM's
//! `response_format: json_schema`, OpenAI's strict mode): `type` (`object`, `array`, `string`,
//! `integer`, `number`, `boolean`), `properties`, `required`, `items`, `enum` (strings),
//! `minItems`/`maxItems`, `minLength`/`maxLength`, `minimum`/`maximum`, and the annotations
//! `description` / `title`; `additionalProperties` may only be `false` (objects are closed).
//! Anything else is refused when the workflow loads, so that every schema accepted here is one
//! this module can both check and satisfy.
//!
//! Plain data with pure helpers; depends only on `values` (for naming JSON kinds).

use rand::Rng;
use serde_json::{Map, Value as Json};

use crate::values::json_kind;

/// Longest array an emulated answer draws when the schema sets no `maxItems`.
const DEFAULT_MAX_ITEMS: u32 = 3;
/// Range an emulated integer / number is drawn from when the schema sets no bounds.
const DEFAULT_RANGE: (f64, f64) = (0.0, 100.0);
/// Largest `minItems` / `maxItems` and `minLength` / `maxLength` a schema may set, and most
/// values (objects, items, scalars) one answer of the schema may hold: an answer is something a
/// model writes within its output limit, and an emulated one is drawn whole.
pub const MAX_ITEMS: u32 = 1_000;
pub const MAX_LENGTH: u32 = 100_000;
pub const MAX_VALUES: u64 = 10_000;
/// Longest smallest answer (compact JSON, bytes) a schema may have: within the limits above a
/// smallest answer can still be about a gigabyte, which no output limit admits and which a
/// check must not build ([`OutputSchema::smallest_json_bytes`] measures it first).
pub const MAX_SMALLEST_ANSWER_BYTES: u64 = 1 << 20;
/// Drawn numbers stay within ±this, whatever the bounds (a draw over an infinite span is not
/// defined).
const DRAW_SPAN: f64 = 1e12;

/// A checked schema.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputSchema {
    /// A closed object: only `properties`; those in `required` must be present.
    Object { properties: Vec<(String, OutputSchema)>, required: Vec<String> },
    Array { items: Box<OutputSchema>, min_items: u32, max_items: Option<u32> },
    /// A string; with `choices`, one of them (`enum`).
    String { choices: Option<Vec<String>>, min_length: u32, max_length: Option<u32> },
    Integer { minimum: Option<i64>, maximum: Option<i64> },
    Number { minimum: Option<f64>, maximum: Option<f64> },
    Boolean,
}

/// A schema that is not in the supported subset: `path` is the JSON path inside the schema
/// (`properties.approved.type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() { write!(f, "{}", self.message) } else { write!(f, "{}: {}", self.path, self.message) }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

impl OutputSchema {
    /// Read a schema written as JSON (the loader converts the YAML mapping).
    pub fn from_json(v: &Json) -> Result<OutputSchema, SchemaError> {
        let schema = parse(v, "")?;
        let n = schema.max_values();
        if n > MAX_VALUES {
            return Err(err("", format!("an answer of this schema may hold {n} values; at most {MAX_VALUES} are accepted")));
        }
        Ok(schema)
    }

    /// Most values (objects, items and scalars) one answer may hold.
    fn max_values(&self) -> u64 {
        match self {
            OutputSchema::Object { properties, .. } => {
                properties.iter().fold(1u64, |n, (_, p)| n.saturating_add(p.max_values()))
            }
            OutputSchema::Array { items, min_items, max_items } => {
                let count = u64::from(max_items.unwrap_or((*min_items).max(DEFAULT_MAX_ITEMS)).max(*min_items));
                count.saturating_mul(items.max_values()).saturating_add(1)
            }
            _ => 1,
        }
    }

    /// The schema back as JSON Schema (what a prompt or an engine's guided decoding is given).
    pub fn to_json(&self) -> Json {
        let mut m = Map::new();
        match self {
            OutputSchema::Object { properties, required } => {
                m.insert("type".into(), "object".into());
                let props: Map<String, Json> = properties.iter().map(|(k, s)| (k.clone(), s.to_json())).collect();
                m.insert("properties".into(), Json::Object(props));
                m.insert("required".into(), required.iter().cloned().map(Json::String).collect());
                m.insert("additionalProperties".into(), false.into());
            }
            OutputSchema::Array { items, min_items, max_items } => {
                m.insert("type".into(), "array".into());
                m.insert("items".into(), items.to_json());
                if *min_items > 0 {
                    m.insert("minItems".into(), (*min_items).into());
                }
                if let Some(x) = max_items {
                    m.insert("maxItems".into(), (*x).into());
                }
            }
            OutputSchema::String { choices, min_length, max_length } => {
                m.insert("type".into(), "string".into());
                if let Some(c) = choices {
                    m.insert("enum".into(), c.iter().cloned().map(Json::String).collect());
                }
                if *min_length > 0 {
                    m.insert("minLength".into(), (*min_length).into());
                }
                if let Some(x) = max_length {
                    m.insert("maxLength".into(), (*x).into());
                }
            }
            OutputSchema::Integer { minimum, maximum } => {
                m.insert("type".into(), "integer".into());
                if let Some(x) = minimum {
                    m.insert("minimum".into(), (*x).into());
                }
                if let Some(x) = maximum {
                    m.insert("maximum".into(), (*x).into());
                }
            }
            OutputSchema::Number { minimum, maximum } => {
                m.insert("type".into(), "number".into());
                if let Some(x) = minimum {
                    m.insert("minimum".into(), (*x).into());
                }
                if let Some(x) = maximum {
                    m.insert("maximum".into(), (*x).into());
                }
            }
            OutputSchema::Boolean => {
                m.insert("type".into(), "boolean".into());
            }
        }
        Json::Object(m)
    }

    /// The schema of a top-level property (objects only).
    pub fn property(&self, name: &str) -> Option<&OutputSchema> {
        match self {
            OutputSchema::Object { properties, .. } => properties.iter().find(|(k, _)| k == name).map(|(_, s)| s),
            _ => None,
        }
    }

    /// Whether a top-level property must be present.
    pub fn is_required(&self, name: &str) -> bool {
        matches!(self, OutputSchema::Object { required, .. } if required.iter().any(|r| r == name))
    }

    /// The verdicts a property of this schema can produce when it decides a branch: a string
    /// enum's choices, `true`/`false` for a boolean; `None` when the values are open.
    pub fn verdict_values(&self) -> Option<Vec<String>> {
        match self {
            OutputSchema::String { choices: Some(c), .. } => Some(c.clone()),
            OutputSchema::Boolean => Some(vec!["true".into(), "false".into()]),
            _ => None,
        }
    }

    /// Check `v` against the schema; the error names the JSON path of the first violation.
    pub fn check(&self, v: &Json) -> Result<(), SchemaError> {
        check(self, v, "")
    }

    /// Draw a value that satisfies the schema. Free-text strings (no `enum`) get `text(n)`,
    /// asked for about `n` tokens (within the length bounds); `string_tokens` is what each
    /// free-text string is asked for.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R, string_tokens: usize, text: &mut dyn FnMut(usize) -> String) -> Json {
        match self {
            OutputSchema::Object { properties, required } => {
                let mut m = Map::new();
                for (k, s) in properties {
                    // Optional properties are present half the time.
                    if required.contains(k) || rng.random_bool(0.5) {
                        m.insert(k.clone(), s.sample(rng, string_tokens, text));
                    }
                }
                Json::Object(m)
            }
            OutputSchema::Array { items, min_items, max_items } => {
                let hi = max_items.unwrap_or((*min_items).max(DEFAULT_MAX_ITEMS)).max(*min_items);
                let n = rng.random_range(*min_items..=hi);
                Json::Array((0..n).map(|_| items.sample(rng, string_tokens, text)).collect())
            }
            OutputSchema::String { choices: Some(c), .. } => {
                let i = rng.random_range(0..c.len().max(1));
                Json::String(c.get(i).cloned().unwrap_or_default())
            }
            OutputSchema::String { choices: None, min_length, max_length } => {
                let mut s = text(string_tokens);
                if let Some(max) = max_length {
                    s = s.chars().take(*max as usize).collect::<String>().trim_end().to_string();
                }
                // Padded in one step (a push per missing character, each recounting the string,
                // was quadratic: minutes for a 100,000-character minimum).
                let have = s.chars().count();
                let want = *min_length as usize;
                if have < want {
                    s.extend(std::iter::repeat_n('.', want - have));
                }
                Json::String(s)
            }
            OutputSchema::Integer { minimum, maximum } => {
                let lo = minimum.unwrap_or(DEFAULT_RANGE.0 as i64);
                let hi = maximum.unwrap_or(lo.max(DEFAULT_RANGE.1 as i64)).max(lo);
                Json::from(rng.random_range(lo..=hi))
            }
            OutputSchema::Number { minimum, maximum } => {
                let lo = minimum.unwrap_or(DEFAULT_RANGE.0);
                let hi = maximum.unwrap_or(lo.max(DEFAULT_RANGE.1)).max(lo);
                // Draw within a finite window of the bounds (an infinite span has no uniform law).
                let (a, b) = (lo.max(-DRAW_SPAN).min(hi), hi.min(DRAW_SPAN).max(lo));
                let x = if b > a { rng.random_range(a..=b) } else { a };
                // Two decimals, kept inside the bounds.
                let x = ((x * 100.0).round() / 100.0).clamp(lo, hi);
                serde_json::Number::from_f64(x).map(Json::Number).unwrap_or(Json::Null)
            }
            OutputSchema::Boolean => Json::Bool(rng.random_bool(0.5)),
        }
    }

    /// The smallest answer: required properties only, minimum items, empty (or minimum-length)
    /// strings. Its serialized size bounds what an output limit must allow.
    pub fn smallest(&self) -> Json {
        match self {
            OutputSchema::Object { properties, required } => Json::Object(
                properties
                    .iter()
                    .filter(|(k, _)| required.contains(k))
                    .map(|(k, s)| (k.clone(), s.smallest()))
                    .collect(),
            ),
            OutputSchema::Array { items, min_items, .. } => Json::Array((0..*min_items).map(|_| items.smallest()).collect()),
            OutputSchema::String { choices: Some(c), .. } => {
                Json::String(c.iter().min_by_key(|s| s.len()).cloned().unwrap_or_default())
            }
            OutputSchema::String { min_length, .. } => Json::String(".".repeat(*min_length as usize)),
            OutputSchema::Integer { minimum, maximum } => Json::from(minimum.or(*maximum).unwrap_or(0)),
            OutputSchema::Number { minimum, maximum } => {
                serde_json::Number::from_f64(minimum.or(*maximum).unwrap_or(0.0)).map(Json::Number).unwrap_or(Json::Null)
            }
            OutputSchema::Boolean => Json::Bool(false),
        }
    }

    /// The length in bytes of [`Self::smallest`]'s compact JSON, computed without building it
    /// (saturating): the schema limits still admit a smallest answer of about a gigabyte (a
    /// thousand items of eight strings of 100,000 characters), which a check must not build.
    pub fn smallest_json_bytes(&self) -> u64 {
        let json_len = |v: &Json| v.to_string().len() as u64;
        match self {
            OutputSchema::Object { properties, required } => {
                let members: Vec<u64> = properties
                    .iter()
                    .filter(|(k, _)| required.contains(k))
                    .map(|(k, s)| json_len(&Json::String(k.clone())).saturating_add(1).saturating_add(s.smallest_json_bytes()))
                    .collect();
                let commas = members.len().saturating_sub(1) as u64;
                members.iter().fold(2u64.saturating_add(commas), |a, &m| a.saturating_add(m))
            }
            OutputSchema::Array { items, min_items, .. } => {
                let n = u64::from(*min_items);
                2u64.saturating_add(n.saturating_mul(items.smallest_json_bytes())).saturating_add(n.saturating_sub(1))
            }
            OutputSchema::String { choices: Some(_), .. }
            | OutputSchema::Integer { .. }
            | OutputSchema::Number { .. }
            | OutputSchema::Boolean => json_len(&self.smallest()),
            // Dots need no escaping: the quotes and the characters.
            OutputSchema::String { min_length, .. } => 2 + u64::from(*min_length),
        }
    }

    /// An upper bound, in bytes of compact JSON, on what the schema's minimum lengths alone force
    /// into a drawn answer: every property present, every array at its most items (`maxItems`,
    /// else the draw's default), every free-text string at its `minLength` (the text drawn into
    /// it is not counted), every `enum` at its longest choice, numbers at their widest (saturating).
    pub fn largest_padded_json_bytes(&self) -> u64 {
        let json_len = |v: &Json| v.to_string().len() as u64;
        match self {
            OutputSchema::Object { properties, .. } => {
                let commas = properties.len().saturating_sub(1) as u64;
                properties.iter().fold(2u64.saturating_add(commas), |a, (k, s)| {
                    a.saturating_add(json_len(&Json::String(k.clone())).saturating_add(1).saturating_add(s.largest_padded_json_bytes()))
                })
            }
            OutputSchema::Array { items, min_items, max_items } => {
                let n = u64::from(max_items.unwrap_or((*min_items).max(DEFAULT_MAX_ITEMS)).max(*min_items));
                2u64.saturating_add(n.saturating_mul(items.largest_padded_json_bytes())).saturating_add(n.saturating_sub(1))
            }
            OutputSchema::String { choices: Some(c), .. } => c.iter().map(|s| json_len(&Json::String(s.clone()))).max().unwrap_or(2),
            OutputSchema::String { min_length, .. } => 2 + u64::from(*min_length),
            // i64::MIN is 20 characters; a two-decimal f64 in JSON at most 24.
            OutputSchema::Integer { .. } => 20,
            OutputSchema::Number { .. } => 24,
            OutputSchema::Boolean => 5,
        }
    }

    /// How many free-text strings a drawn value holds at most (to share a length budget).
    pub fn free_text_slots(&self) -> usize {
        match self {
            OutputSchema::Object { properties, .. } => properties.iter().map(|(_, s)| s.free_text_slots()).sum(),
            OutputSchema::Array { items, min_items, max_items } => {
                items.free_text_slots() * max_items.unwrap_or((*min_items).max(DEFAULT_MAX_ITEMS)) as usize
            }
            OutputSchema::String { choices: None, .. } => 1,
            _ => 0,
        }
    }
}

/// The verdict a structured answer carries: the top-level property `field` as text (a string
/// as itself, a boolean as `true` / `false`, a number in JSON); `None` when absent.
pub fn verdict_of(value: &Json, field: &str) -> Option<String> {
    match value.get(field)? {
        Json::String(s) => Some(s.clone()),
        Json::Null => None,
        other => Some(other.to_string()),
    }
}

/// Find the JSON answer in a model's text: the whole text, else the body of a fenced code
/// block, else the span from the first `{` (or `[`) to the last matching bracket.
pub fn extract_json(text: &str) -> Option<Json> {
    let t = text.trim();
    if let Ok(v) = serde_json::from_str::<Json>(t) {
        return Some(v);
    }
    if let Some(start) = t.find("```") {
        let rest = &t[start + 3..];
        let body_start = rest.find('\n').map(|i| i + 1).unwrap_or(0);
        if let Some(end) = rest[body_start..].find("```")
            && let Ok(v) = serde_json::from_str::<Json>(rest[body_start..body_start + end].trim())
        {
            return Some(v);
        }
    }
    for (open, close) in [('{', '}'), ('[', ']')] {
        if let (Some(a), Some(b)) = (t.find(open), t.rfind(close))
            && a < b
            && let Ok(v) = serde_json::from_str::<Json>(&t[a..=b])
        {
            return Some(v);
        }
    }
    None
}

fn err(path: &str, message: impl Into<String>) -> SchemaError {
    SchemaError { path: path.to_string(), message: message.into() }
}

/// A count bounded by `max`.
fn as_count(v: &Json, path: &str, max: u32) -> Result<u32, SchemaError> {
    match v.as_u64() {
        Some(x) if x <= u64::from(max) => Ok(x as u32),
        Some(x) => Err(err(path, format!("{x} is above the largest accepted, {max}"))),
        None => Err(err(path, format!("expected a whole number ≥ 0, found {v}"))),
    }
}

fn parse(v: &Json, path: &str) -> Result<OutputSchema, SchemaError> {
    let Json::Object(m) = v else {
        return Err(err(path, format!("a schema is a mapping, found {v}")));
    };
    const KEYS: &[&str] = &[
        "type", "properties", "required", "items", "enum", "minItems", "maxItems", "minLength", "maxLength", "minimum",
        "maximum", "description", "title", "additionalProperties",
    ];
    for k in m.keys() {
        if !KEYS.contains(&k.as_str()) {
            return Err(err(&join(path, k), format!("`{k}` is not in the supported schema subset (keys: {})", KEYS.join(", "))));
        }
    }
    let ty = match m.get("type") {
        Some(Json::String(t)) => t.as_str(),
        Some(other) => return Err(err(&join(path, "type"), format!("expected one type name, found {other}"))),
        None if m.contains_key("enum") => "string",
        None => return Err(err(path, "a schema needs `type` (object, array, string, integer, number or boolean)")),
    };
    let allowed: &[&str] = match ty {
        "object" => &["properties", "required", "additionalProperties"],
        "array" => &["items", "minItems", "maxItems"],
        "string" => &["enum", "minLength", "maxLength"],
        "integer" | "number" => &["minimum", "maximum"],
        "boolean" => &[],
        other => {
            return Err(err(
                &join(path, "type"),
                format!("type `{other}`: expected object, array, string, integer, number or boolean"),
            ));
        }
    };
    for k in m.keys() {
        if !matches!(k.as_str(), "type" | "description" | "title") && !allowed.contains(&k.as_str()) {
            return Err(err(&join(path, k), format!("`{k}` does not apply to type `{ty}`")));
        }
    }
    Ok(match ty {
        "object" => {
            if let Some(a) = m.get("additionalProperties")
                && a != &Json::Bool(false)
            {
                return Err(err(&join(path, "additionalProperties"), "objects are closed: only `false` is accepted"));
            }
            let mut properties = Vec::new();
            match m.get("properties") {
                Some(Json::Object(props)) => {
                    for (k, s) in props {
                        properties.push((k.clone(), parse(s, &join(&join(path, "properties"), k))?));
                    }
                }
                Some(other) => return Err(err(&join(path, "properties"), format!("expected a mapping, found {other}"))),
                None => {}
            }
            if properties.is_empty() {
                return Err(err(path, "an object needs at least one property"));
            }
            let mut required = Vec::new();
            match m.get("required") {
                Some(Json::Array(items)) => {
                    for r in items {
                        let Some(name) = r.as_str() else {
                            return Err(err(&join(path, "required"), format!("expected property names, found {r}")));
                        };
                        if !properties.iter().any(|(k, _)| k == name) {
                            return Err(err(&join(path, "required"), format!("`{name}` is not one of the properties")));
                        }
                        required.push(name.to_string());
                    }
                }
                Some(other) => return Err(err(&join(path, "required"), format!("expected a list, found {other}"))),
                None => {}
            }
            OutputSchema::Object { properties, required }
        }
        "array" => {
            let items = m.get("items").ok_or_else(|| err(path, "an array needs `items`"))?;
            let items = Box::new(parse(items, &join(path, "items"))?);
            let min_items = m.get("minItems").map(|v| as_count(v, &join(path, "minItems"), MAX_ITEMS)).transpose()?.unwrap_or(0);
            let max_items = m.get("maxItems").map(|v| as_count(v, &join(path, "maxItems"), MAX_ITEMS)).transpose()?;
            if let Some(x) = max_items
                && x < min_items
            {
                return Err(err(&join(path, "maxItems"), format!("maxItems {x} is below minItems {min_items}")));
            }
            OutputSchema::Array { items, min_items, max_items }
        }
        "string" => {
            let choices = match m.get("enum") {
                None => None,
                Some(Json::Array(items)) if !items.is_empty() => Some(
                    items
                        .iter()
                        .map(|i| i.as_str().map(String::from).ok_or_else(|| err(&join(path, "enum"), format!("expected strings, found {i}"))))
                        .collect::<Result<Vec<_>, _>>()?,
                ),
                Some(other) => return Err(err(&join(path, "enum"), format!("expected a non-empty list of strings, found {other}"))),
            };
            let min_length = m.get("minLength").map(|v| as_count(v, &join(path, "minLength"), MAX_LENGTH)).transpose()?.unwrap_or(0);
            let max_length = m.get("maxLength").map(|v| as_count(v, &join(path, "maxLength"), MAX_LENGTH)).transpose()?;
            if let Some(x) = max_length
                && x < min_length
            {
                return Err(err(&join(path, "maxLength"), format!("maxLength {x} is below minLength {min_length}")));
            }
            if let (Some(c), true) = (&choices, min_length > 0 || max_length.is_some()) {
                let _ = c;
                return Err(err(path, "`enum` and length bounds together are not supported"));
            }
            OutputSchema::String { choices, min_length, max_length }
        }
        "integer" => {
            let bound = |k: &str| -> Result<Option<i64>, SchemaError> {
                m.get(k).map(|v| v.as_i64().ok_or_else(|| err(&join(path, k), format!("expected a whole number, found {v}")))).transpose()
            };
            let (minimum, maximum) = (bound("minimum")?, bound("maximum")?);
            if let (Some(a), Some(b)) = (minimum, maximum)
                && b < a
            {
                return Err(err(&join(path, "maximum"), format!("maximum {b} is below minimum {a}")));
            }
            OutputSchema::Integer { minimum, maximum }
        }
        "number" => {
            let bound = |k: &str| -> Result<Option<f64>, SchemaError> {
                m.get(k)
                    .map(|v| v.as_f64().filter(|x| x.is_finite()).ok_or_else(|| err(&join(path, k), format!("expected a number, found {v}"))))
                    .transpose()
            };
            let (minimum, maximum) = (bound("minimum")?, bound("maximum")?);
            if let (Some(a), Some(b)) = (minimum, maximum)
                && b < a
            {
                return Err(err(&join(path, "maximum"), format!("maximum {b} is below minimum {a}")));
            }
            OutputSchema::Number { minimum, maximum }
        }
        _ => OutputSchema::Boolean,
    })
}


fn check(s: &OutputSchema, v: &Json, path: &str) -> Result<(), SchemaError> {
    let here = if path.is_empty() { "the answer" } else { path };
    match (s, v) {
        (OutputSchema::Object { properties, required }, Json::Object(m)) => {
            for r in required {
                if !m.contains_key(r) {
                    return Err(err(path, format!("required property `{r}` is missing")));
                }
            }
            for (k, x) in m {
                let Some((_, ps)) = properties.iter().find(|(p, _)| p == k) else {
                    return Err(err(path, format!("property `{k}` is not in the schema")));
                };
                check(ps, x, &join(path, k))?;
            }
            Ok(())
        }
        (OutputSchema::Array { items, min_items, max_items }, Json::Array(xs)) => {
            let n = xs.len() as u64;
            if n < u64::from(*min_items) || max_items.is_some_and(|m| n > u64::from(m)) {
                return Err(err(path, format!("{here} has {n} items, outside [{min_items}, {}]", max_items.map(|m| m.to_string()).unwrap_or("∞".into()))));
            }
            for (i, x) in xs.iter().enumerate() {
                check(items, x, &join(path, &i.to_string()))?;
            }
            Ok(())
        }
        (OutputSchema::String { choices, min_length, max_length }, Json::String(t)) => {
            if let Some(c) = choices
                && !c.iter().any(|x| x == t)
            {
                return Err(err(path, format!("`{t}` is not one of {}", c.join(", "))));
            }
            let n = t.chars().count() as u64;
            if n < u64::from(*min_length) || max_length.is_some_and(|m| n > u64::from(m)) {
                return Err(err(path, format!("{here} has {n} characters, outside the allowed length")));
            }
            Ok(())
        }
        (OutputSchema::Integer { minimum, maximum }, Json::Number(x)) => {
            let Some(i) = x.as_i64() else {
                return Err(err(path, format!("{here} must be a whole number, found {x}")));
            };
            if minimum.is_some_and(|m| i < m) || maximum.is_some_and(|m| i > m) {
                return Err(err(path, format!("{i} is out of range")));
            }
            Ok(())
        }
        (OutputSchema::Number { minimum, maximum }, Json::Number(x)) => {
            let f = x.as_f64().unwrap_or(f64::NAN);
            if minimum.is_some_and(|m| f < m) || maximum.is_some_and(|m| f > m) {
                return Err(err(path, format!("{f} is out of range")));
            }
            Ok(())
        }
        (OutputSchema::Boolean, Json::Bool(_)) => Ok(()),
        (s, v) => {
            let want = match s {
                OutputSchema::Object { .. } => "an object",
                OutputSchema::Array { .. } => "a list",
                OutputSchema::String { .. } => "a string",
                OutputSchema::Integer { .. } => "a whole number",
                OutputSchema::Number { .. } => "a number",
                OutputSchema::Boolean => "a boolean",
            };
            Err(err(path, format!("{here} must be {want}, found {}", json_kind(v))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use serde_json::json;

    fn review() -> OutputSchema {
        OutputSchema::from_json(&json!({
            "type": "object",
            "properties": {
                "approved": {"type": "boolean"},
                "severity": {"enum": ["low", "high"]},
                "comments": {"type": "array", "items": {"type": "string", "maxLength": 80}, "maxItems": 4},
                "score": {"type": "integer", "minimum": 1, "maximum": 5},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1}
            },
            "required": ["approved", "comments"]
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn checks_answers_and_names_the_first_violation() {
        let s = review();
        assert_eq!(s.check(&json!({"approved": true, "comments": []})), Ok(()));
        let e = s.check(&json!({"comments": []})).err().map(|e| e.message);
        assert_eq!(e.as_deref(), Some("required property `approved` is missing"));
        let e = s.check(&json!({"approved": "yes", "comments": []})).err();
        assert_eq!(e.map(|e| e.path), Some("approved".to_string()));
        assert!(s.check(&json!({"approved": true, "comments": [], "extra": 1})).is_err());
        assert!(s.check(&json!({"approved": true, "comments": [], "score": 9})).is_err());
        assert!(s.check(&json!({"approved": true, "comments": [], "score": 2.5})).is_err());
        assert!(s.check(&json!({"approved": true, "comments": [], "severity": "mid"})).is_err());
        assert!(s.check(&json!({"approved": true, "comments": ["a", "b", "c", "d", "e"]})).is_err());
    }

    #[test]
    fn refuses_what_it_could_not_check_or_satisfy() {
        for bad in [
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "patternProperties": {}}),
            json!({"type": "string", "pattern": "^a"}),
            json!({"type": "null"}),
            json!({"type": "object"}),
            json!({"type": "array"}),
            json!({"type": "integer", "minimum": 5, "maximum": 1}),
            json!({"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["b"]}),
            json!({"type": "object", "properties": {"a": {"type": "boolean"}}, "additionalProperties": true}),
            json!({"type": "boolean", "minimum": 1}),
        ] {
            assert!(OutputSchema::from_json(&bad).is_err(), "{bad}");
        }
        let e = OutputSchema::from_json(&json!({"type": "object", "properties": {"a": {"type": "strin"}}})).err();
        assert_eq!(e.map(|e| e.path), Some("properties.a.type".to_string()));
    }

    /// A schema is author input: one that would make an answer (or its drawing) huge is refused
    /// when the workflow loads, and extreme number bounds still draw a value within them.
    #[test]
    fn schemas_that_would_make_huge_answers_are_refused() {
        let e = OutputSchema::from_json(&json!({"type": "array", "items": {"type": "boolean"}, "minItems": 4_000_000_000u64})).err();
        assert_eq!(e.map(|e| e.path), Some("minItems".to_string()));
        assert!(OutputSchema::from_json(&json!({"type": "string", "minLength": 4_000_000_000u64})).is_err());
        let nested = json!({"type": "array", "maxItems": 100, "items": {"type": "array", "maxItems": 101, "items": {"type": "boolean"}}});
        let e = OutputSchema::from_json(&nested).err().map(|e| e.message).unwrap_or_default();
        assert!(e.contains("at most 10000"), "{e}");
        let wide = OutputSchema::from_json(&json!({"type": "number", "minimum": -1e308, "maximum": 1e308})).unwrap_or_else(|e| panic!("{e}"));
        let v = wide.sample(&mut ChaCha8Rng::seed_from_u64(3), 1, &mut |_| String::new());
        assert_eq!(wide.check(&v), Ok(()));
        let high = OutputSchema::from_json(&json!({"type": "number", "minimum": 5e15, "maximum": 6e15})).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(high.check(&high.sample(&mut ChaCha8Rng::seed_from_u64(3), 1, &mut |_| String::new())), Ok(()));
    }

    #[test]
    fn round_trips_through_json_schema() {
        let s = review();
        assert_eq!(OutputSchema::from_json(&s.to_json()), Ok(s));
    }

    proptest! {
        #[test]
        fn drawn_values_satisfy_the_schema_and_depend_only_on_the_seed(seed in any::<u64>(), n in 0usize..40) {
            let s = review();
            let mut filler = |k: usize| "word ".repeat(k).trim_end().to_string();
            let a = s.sample(&mut ChaCha8Rng::seed_from_u64(seed), n, &mut filler);
            let b = s.sample(&mut ChaCha8Rng::seed_from_u64(seed), n, &mut filler);
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(s.check(&a), Ok(()));
            prop_assert_eq!(s.check(&s.smallest()), Ok(()));
        }
    }

    /// Schemas of the supported subset, nested up to three levels, with keys that need JSON
    /// escaping.
    fn any_schema() -> impl Strategy<Value = OutputSchema> {
        let leaf = prop_oneof![
            Just(OutputSchema::Boolean),
            (any::<Option<i64>>(), any::<Option<i64>>()).prop_map(|(minimum, maximum)| OutputSchema::Integer { minimum, maximum }),
            (proptest::option::of(-1e9f64..1e9), proptest::option::of(-1e9f64..1e9))
                .prop_map(|(minimum, maximum)| OutputSchema::Number { minimum, maximum }),
            (0u32..50).prop_map(|min_length| OutputSchema::String { choices: None, min_length, max_length: None }),
            proptest::collection::vec("[a-z\"\\\\é]{0,6}", 1..4)
                .prop_map(|c| OutputSchema::String { choices: Some(c), min_length: 0, max_length: None }),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                (inner.clone(), 0u32..4).prop_map(|(items, min_items)| OutputSchema::Array { items: Box::new(items), min_items, max_items: None }),
                proptest::collection::vec(("[a-z\"\\\\]{1,5}", inner, any::<bool>()), 0..4).prop_map(|props| {
                    let mut properties: Vec<(String, OutputSchema)> = Vec::new();
                    let mut required = Vec::new();
                    for (k, s, req) in props {
                        if properties.iter().all(|(p, _)| *p != k) {
                            if req {
                                required.push(k.clone());
                            }
                            properties.push((k, s));
                        }
                    }
                    OutputSchema::Object { properties, required }
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn the_smallest_answers_size_is_its_json_length(s in any_schema()) {
            prop_assert_eq!(s.smallest_json_bytes(), s.smallest().to_string().len() as u64);
        }

        #[test]
        fn a_drawn_answer_with_empty_texts_stays_within_the_padded_bound(s in any_schema(), seed in any::<u64>()) {
            let drawn = s.sample(&mut ChaCha8Rng::seed_from_u64(seed), 0, &mut |_| String::new());
            prop_assert!(drawn.to_string().len() as u64 <= s.largest_padded_json_bytes());
            prop_assert!(s.smallest_json_bytes() <= s.largest_padded_json_bytes());
        }
    }

    #[test]
    fn a_gigabyte_smallest_answer_is_measured_without_being_built() {
        let s = OutputSchema::from_json(&json!({"type": "object", "required": ["a"], "properties": {"a": {
            "type": "array", "minItems": 1000, "items": {"type": "array", "minItems": 8, "items": {"type": "string", "minLength": 100_000}}
        }}}))
        .unwrap_or_else(|e| panic!("{e}"));
        // {"a":[ 1000 × [ 8 × "…100000…" + 7 commas ] + 999 commas ]}
        let inner = 2 + 8 * 100_002 + 7;
        assert_eq!(s.smallest_json_bytes(), 6 + 2 + 1000 * inner + 999);
    }

    #[test]
    fn verdicts_and_json_in_model_text() {
        assert_eq!(verdict_of(&json!({"approved": false}), "approved").as_deref(), Some("false"));
        assert_eq!(verdict_of(&json!({"severity": "high"}), "severity").as_deref(), Some("high"));
        assert_eq!(verdict_of(&json!({}), "approved"), None);
        assert_eq!(extract_json("{\"a\": 1}"), Some(json!({"a": 1})));
        assert_eq!(extract_json("Sure!\n```json\n{\"a\": 1}\n```\nDone."), Some(json!({"a": 1})));
        assert_eq!(extract_json("Here: {\"a\": [1, 2]} ok"), Some(json!({"a": [1, 2]})));
        assert_eq!(extract_json("no json here"), None);
        assert_eq!(review().property("approved").and_then(|p| p.verdict_values()), Some(vec!["true".into(), "false".into()]));
    }
}
