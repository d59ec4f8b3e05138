//! Dataset binding: which file feeds a workflow's sessions and how each raw record maps to the
//! session's input fields (dotted paths with numeric indices, and a `join` transform that
//! turns a list of objects into lines of text, e.g. a meeting transcript).
//!
//! Reads the dataset file only when asked ([`DatasetBinding::load_records`]); depends on
//! `values` and on the loader's `yaml` positions for error reporting, nothing else.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value as Json;
use thiserror::Error;

use super::error::{ErrorKind, WorkflowError};
use super::yaml::{Ctx, Pos};
use crate::values::Record;

/// How the dataset file is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatasetFormat {
    /// One JSON document whose top level is an array of records.
    Json,
    /// One JSON record per non-empty line.
    Jsonl,
}

/// Where one input field comes from in a raw record.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldSource {
    /// The dotted path as written, e.g. `general_query_list.0.query`.
    pub path: String,
    /// Path steps; a step indexes an array when the value there is an array, else it is a key.
    pub steps: Vec<String>,
    /// Optional transform of a list-valued field into text.
    pub join: Option<JoinSpec>,
    pos: Pos,
}

/// `join`: format every element of a list with `pattern` (`{key}` is replaced by the
/// element's field `key`, `{}` by the element itself) and join the results with `separator`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinSpec {
    pub pattern: String,
    pub separator: String,
}

/// The `dataset:` section of a workflow.
#[derive(Debug, Clone, PartialEq)]
pub struct DatasetBinding {
    /// The file as written in the YAML (relative to the YAML file).
    pub file_as_written: String,
    /// The file's path: the YAML file's directory joined with `file_as_written`.
    pub file: PathBuf,
    pub format: DatasetFormat,
    /// Input field name → where it comes from.
    pub fields: BTreeMap<String, FieldSource>,
    /// Input fields the workflow's responders read as text: a record whose value there is not
    /// a string is refused when the dataset is loaded, before any session starts.
    pub text_fields: std::collections::BTreeSet<String>,
    workflow_file: String,
    file_pos: Pos,
}

/// Why a field could not be extracted from a raw record ([`FieldSource::extract`]). `at` is the
/// dotted path walked so far (empty: the record itself).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ExtractError {
    /// A list has no element at `step`.
    #[error("{} is a list of {len} and has no element `{step}`", place(.at))]
    NoElement { at: String, len: usize, step: String },
    /// An object has no field `step`.
    #[error("{} has no field `{step}`", place(.at))]
    NoField { at: String, step: String },
    /// A scalar where the path goes on (`kind`: e.g. `a number`).
    #[error("{} is {kind}, not an object or a list", place(.at))]
    NotContainer { at: String, kind: &'static str },
    /// `join` applied to a value that is not a list.
    #[error("`join` needs a list, found {found}")]
    JoinNotList { found: &'static str },
    /// `join`'s pattern could not be applied to the list's element `index`.
    #[error("element {index}: {message}")]
    JoinElement { index: usize, message: String },
}

/// How an [`ExtractError`] names the place it stopped at.
fn place(at: &str) -> String {
    if at.is_empty() { "the record".to_string() } else { format!("`{at}`") }
}

impl FieldSource {
    pub(crate) fn new(path: String, join: Option<JoinSpec>, pos: Pos) -> Self {
        let steps = path.split('.').map(str::to_string).collect();
        FieldSource {
            path,
            steps,
            join,
            pos,
        }
    }

    /// Extract this field from a raw record; `Err` says why not.
    pub fn extract(&self, raw: &Json) -> Result<Json, ExtractError> {
        let mut cur = raw;
        for (depth, step) in self.steps.iter().enumerate() {
            let next = match cur {
                Json::Array(items) => step.parse::<usize>().ok().and_then(|i| items.get(i)),
                Json::Object(map) => map.get(step),
                _ => None,
            };
            cur = next.ok_or_else(|| {
                let at = self.steps[..depth].join(".");
                let step = step.clone();
                match cur {
                    Json::Array(items) => ExtractError::NoElement { at, len: items.len(), step },
                    Json::Object(_) => ExtractError::NoField { at, step },
                    other => ExtractError::NotContainer { at, kind: crate::values::json_kind(other) },
                }
            })?;
        }
        match &self.join {
            None => Ok(cur.clone()),
            Some(j) => j.apply(cur).map(Json::String),
        }
    }
}

impl JoinSpec {
    fn apply(&self, value: &Json) -> Result<String, ExtractError> {
        let Json::Array(items) = value else {
            return Err(ExtractError::JoinNotList { found: crate::values::json_kind(value) });
        };
        let mut lines = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            lines.push(
                format_element(&self.pattern, item).map_err(|message| ExtractError::JoinElement { index: i, message })?,
            );
        }
        Ok(lines.join(&self.separator))
    }
}

/// Substitute `{key}` / `{}` placeholders of `pattern` with the element's values.
fn format_element(pattern: &str, item: &Json) -> Result<String, String> {
    let mut out = String::with_capacity(pattern.len() + 64);
    let mut rest = pattern;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            out.push_str(&rest[open..]);
            rest = "";
            break;
        };
        let key = &after[..close];
        let value = if key.is_empty() {
            item
        } else {
            match item {
                Json::Object(map) => map
                    .get(key)
                    .ok_or_else(|| format!("has no field `{key}`"))?,
                other => {
                    return Err(format!(
                        "is {}, so `{{{key}}}` cannot be read",
                        crate::values::json_kind(other)
                    ));
                }
            }
        };
        match value {
            Json::String(s) => out.push_str(s),
            Json::Null => {}
            other => out.push_str(&other.to_string()),
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}


/// Largest dataset file read (256 MiB): checked before reading, so a wrong path to a huge file
/// fails at once with its size instead of exhausting memory.
pub const MAX_DATASET_FILE_BYTES: u64 = 256 << 20;

/// Read a dataset file of at most [`MAX_DATASET_FILE_BYTES`]: the size is checked before
/// reading and the read is bounded too. `Err` is the message (naming the file, its size and the
/// limit when it is too large).
fn read_dataset_text(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let too_large = |size: u64| {
        format!(
            "`{}` is {size} bytes ({:.1} MiB), more than the limit of {MAX_DATASET_FILE_BYTES} bytes (256 MiB) for a dataset file",
            path.display(),
            size as f64 / (1u64 << 20) as f64
        )
    };
    let cannot = |e: std::io::Error| format!("cannot read `{}`: {e}", path.display());
    let file = std::fs::File::open(path).map_err(cannot)?;
    let size = file.metadata().map_err(cannot)?.len();
    if size > MAX_DATASET_FILE_BYTES {
        return Err(too_large(size));
    }
    let mut bytes = Vec::new();
    let read = file.take(MAX_DATASET_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if read as u64 > MAX_DATASET_FILE_BYTES {
        return Err(too_large(read as u64));
    }
    crate::values::utf8_text(bytes).map_err(cannot)
}

impl DatasetBinding {
    pub(crate) fn new(
        workflow_file: &str,
        file_as_written: String,
        file: PathBuf,
        format: DatasetFormat,
        fields: BTreeMap<String, FieldSource>,
        file_pos: Pos,
    ) -> Self {
        DatasetBinding {
            file_as_written,
            file,
            format,
            fields,
            text_fields: Default::default(),
            workflow_file: workflow_file.to_string(),
            file_pos,
        }
    }

    fn err_at(&self, pos: Pos, field: &str, message: String) -> WorkflowError {
        Ctx {
            file: &self.workflow_file,
        }
        .err(pos, field, ErrorKind::Dataset, message)
    }

    /// Read the dataset file and map every record. Errors name the workflow position of the
    /// binding (`dataset.file` or `dataset.fields.NAME`), the record index and the field.
    pub fn load_records(&self) -> Result<Vec<Record>, WorkflowError> {
        let text = read_dataset_text(&self.file).map_err(|message| {
            self.err_at(self.file_pos, "dataset.file", message)
        })?;
        // (record, line in the file for JSONL)
        let raws: Vec<(Json, Option<usize>)> = match self.format {
            DatasetFormat::Json => match serde_json::from_str::<Vec<Json>>(&text) {
                Ok(v) => v.into_iter().map(|r| (r, None)).collect(),
                Err(e) => {
                    return Err(self.err_at(
                        self.file_pos,
                        "dataset.file",
                        format!(
                            "`{}` is not a JSON array of records ({}:{}: {e})",
                            self.file_as_written,
                            e.line(),
                            e.column()
                        ),
                    ));
                }
            },
            DatasetFormat::Jsonl => {
                let mut v = Vec::new();
                for (lineno, line) in text.lines().enumerate() {
                    if line.trim().is_empty() {
                        continue;
                    }
                    let rec = serde_json::from_str::<Json>(line).map_err(|e| {
                        self.err_at(
                            self.file_pos,
                            "dataset.file",
                            format!(
                                "`{}` line {}: not a JSON record: {e}",
                                self.file_as_written,
                                lineno + 1
                            ),
                        )
                    })?;
                    v.push((rec, Some(lineno + 1)));
                }
                v
            }
        };
        let mut records = Vec::with_capacity(raws.len());
        for (index, (raw, line)) in raws.into_iter().enumerate() {
            let at_line = line.map(|l| format!(" (line {l})")).unwrap_or_default();
            let mut rec = Record::new();
            for (name, src) in &self.fields {
                let value = src.extract(&raw).map_err(|why| {
                    self.err_at(
                        src.pos,
                        &format!("dataset.fields.{name}"),
                        format!(
                            "record {index}{at_line} of `{}` has no usable `{}` for input field `{name}`: {why}",
                            self.file_as_written, src.path
                        ),
                    )
                })?;
                if self.text_fields.contains(name) && !value.is_string() {
                    return Err(self.err_at(
                        src.pos,
                        &format!("dataset.fields.{name}"),
                        format!(
                            "record {index}{at_line} of `{}`: `{}` must be a string (input field `{name}` is read as text), found {}",
                            self.file_as_written,
                            src.path,
                            crate::values::json_kind(&value)
                        ),
                    ));
                }
                rec.insert(name.clone(), value);
            }
            records.push(rec);
        }
        if records.is_empty() {
            return Err(self.err_at(
                self.file_pos,
                "dataset.file",
                format!("`{}` holds no records", self.file_as_written),
            ));
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn src(path: &str, join: Option<JoinSpec>) -> FieldSource {
        FieldSource::new(path.into(), join, Pos::default())
    }

    #[test]
    fn dotted_paths_index_lists_and_objects() {
        let raw = json!({"general_query_list": [{"query": "Summarize", "answer": "A"}], "n": 3});
        assert_eq!(
            src("general_query_list.0.query", None).extract(&raw),
            Ok(json!("Summarize"))
        );
        assert_eq!(src("n", None).extract(&raw), Ok(json!(3)));
        let e = src("general_query_list.1.query", None)
            .extract(&raw)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("list of 1") && e.contains("`1`"), "{e}");
        let e = src("n.x", None).extract(&raw).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(e, "`n` is a number, not an object or a list");
        let e = src("general_query_list.1.query", None).extract(&raw).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("`general_query_list` is a list of 1 and has no element `1`"));
        let e = src("m", None).extract(&raw).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("the record has no field `m`"));
    }

    #[test]
    fn join_formats_each_element_on_its_own_line() {
        let raw = json!({"t": [{"speaker": "A", "content": "hi"}, {"speaker": "B", "content": "yo"}], "l": ["x", "y"]});
        let j = JoinSpec {
            pattern: "{speaker}: {content}".into(),
            separator: "\n".into(),
        };
        assert_eq!(
            src("t", Some(j.clone())).extract(&raw),
            Ok(json!("A: hi\nB: yo"))
        );
        let plain = JoinSpec {
            pattern: "- {}".into(),
            separator: "\n".into(),
        };
        assert_eq!(src("l", Some(plain)).extract(&raw), Ok(json!("- x\n- y")));
        let bad = JoinSpec {
            pattern: "{who}".into(),
            separator: "\n".into(),
        };
        let e = src("t", Some(bad)).extract(&raw).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("element 0") && e.contains("`who`"), "{e}");
        assert_eq!(e, "element 0: has no field `who`");
        let e = src("n", Some(j.clone())).extract(&json!({"n": 3})).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("`join` needs a list, found a number"));
        assert!(src("l.0", Some(j)).extract(&raw).is_err());
    }

    #[test]
    fn a_dataset_over_the_limit_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("huge.jsonl");
        // Sparse: only the size is looked at.
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(MAX_DATASET_FILE_BYTES + 1))
            .expect("sparse file");
        let binding = DatasetBinding::new(
            "w.yaml",
            "huge.jsonl".into(),
            file,
            DatasetFormat::Jsonl,
            BTreeMap::new(),
            Pos::default(),
        );
        let e = binding.load_records().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("dataset.file"), "{e}");
        assert!(e.contains("huge.jsonl") && e.contains(&(MAX_DATASET_FILE_BYTES + 1).to_string()), "{e}");
        assert!(e.contains("256 MiB"), "{e}");
    }
}
