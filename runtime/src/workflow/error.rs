//! The workflow loader's error: every problem found in a workflow file or its dataset is
//! reported with the file, the line and column of the offending YAML item, and its field path
//! (`nodes.review.after`), so that a user can jump straight to it.
//!
//! Plain data; depends on nothing else in the crate.

use std::fmt;

use thiserror::Error;

/// What went wrong, for callers (and tests) that branch on the kind of problem rather than on
/// the message text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The text is not YAML (or exceeds the parser's size / nesting budget).
    Syntax,
    /// A value has the wrong type or is out of range (e.g. a string where a count belongs).
    BadType,
    /// A required field is absent.
    MissingField,
    /// A field the schema does not know (usually a typo).
    UnknownField,
    /// A reference to a node, deployment, loop or input field that does not exist or is not
    /// visible from where it is used.
    UnknownReference,
    /// Two nodes (or loops) share an id.
    DuplicateId,
    /// The `after` edges form a cycle that is not expressed as a declared loop.
    Cycle,
    /// A loop without `max_rounds`, with `max_rounds: 0`, or with an ill-formed body.
    BadLoop,
    /// A responder name outside [`super::RESPONDERS`].
    UnknownResponder,
    /// A tool name outside [`super::TOOLS`], or a tool input that tool does not take.
    UnknownTool,
    /// An unknown catalogue model.
    UnknownModel,
    /// A node's `max_output_tokens` exceeds its deployment's.
    OutputLimit,
    /// An agent's static prompt text plus its output limit exceed the deployment's context.
    ContextNeverFits,
    /// A `{{...}}` template that does not parse.
    Template,
    /// The dataset file is missing or unreadable, or a record is not what the binding expects.
    Dataset,
    /// A responder or tool needs an input the workflow does not provide.
    MissingInput,
    /// The workflow file is larger than the loader reads.
    TooLarge,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorKind::Syntax => "syntax",
            ErrorKind::BadType => "bad type",
            ErrorKind::MissingField => "missing field",
            ErrorKind::UnknownField => "unknown field",
            ErrorKind::UnknownReference => "unknown reference",
            ErrorKind::DuplicateId => "duplicate id",
            ErrorKind::Cycle => "cycle",
            ErrorKind::BadLoop => "bad loop",
            ErrorKind::UnknownResponder => "unknown responder",
            ErrorKind::UnknownTool => "unknown tool",
            ErrorKind::UnknownModel => "unknown model",
            ErrorKind::OutputLimit => "output limit",
            ErrorKind::ContextNeverFits => "context never fits",
            ErrorKind::Template => "template",
            ErrorKind::Dataset => "dataset",
            ErrorKind::MissingInput => "missing input",
            ErrorKind::TooLarge => "too large",
        };
        f.write_str(s)
    }
}

/// An error raised while loading, validating or binding a workflow.
///
/// `Display` reads `workflows/x.yaml:12:5: nodes.review.after: unknown node `reviw``.
#[derive(Debug, Error)]
pub enum WorkflowError {
    /// The workflow file itself could not be read.
    #[error("{file}: cannot read the workflow file: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// A problem located in the workflow file (1-based line and column of the offending item).
    #[error("{file}:{line}:{column}: {field}: {message}")]
    Invalid {
        file: String,
        line: u64,
        column: u64,
        /// Dotted field path, with node ids in place of list indices where known.
        field: String,
        kind: ErrorKind,
        message: String,
    },
    /// Several independent problems, in file order; each is `Invalid` or `Read`.
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
    Many(Vec<WorkflowError>),
}

impl WorkflowError {
    /// One error for a list of them: the error itself when there is one, `Many` otherwise
    /// (nested lists flattened at every depth, sorted by position).
    pub fn many(errors: Vec<WorkflowError>) -> WorkflowError {
        fn flatten(errors: Vec<WorkflowError>, flat: &mut Vec<WorkflowError>) {
            for e in errors {
                match e {
                    WorkflowError::Many(inner) => flatten(inner, flat),
                    other => flat.push(other),
                }
            }
        }
        let mut flat = Vec::new();
        flatten(errors, &mut flat);
        flat.sort_by_key(|e| e.position().unwrap_or((0, 0)));
        match flat.len() {
            // Only "already reported" markers: never an error without a message.
            0 => WorkflowError::Invalid {
                file: String::new(),
                line: 1,
                column: 1,
                field: "(document)".into(),
                kind: ErrorKind::Syntax,
                message: "the workflow is invalid (no further detail)".into(),
            },
            1 => flat.pop().unwrap_or(WorkflowError::Many(Vec::new())),
            _ => WorkflowError::Many(flat),
        }
    }

    /// Every problem: the list of a `Many`, else this one.
    pub fn all(&self) -> Vec<&WorkflowError> {
        match self {
            WorkflowError::Many(list) => list.iter().collect(),
            other => vec![other],
        }
    }

    /// The kind of problem (`None` for a read failure of the workflow file); for several, the
    /// first's.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            WorkflowError::Read { .. } => None,
            WorkflowError::Invalid { kind, .. } => Some(*kind),
            WorkflowError::Many(list) => list.first().and_then(WorkflowError::kind),
        }
    }

    /// `(line, column)` of the offending item, 1-based; for several, the first's.
    pub fn position(&self) -> Option<(u64, u64)> {
        match self {
            WorkflowError::Read { .. } => None,
            WorkflowError::Invalid { line, column, .. } => Some((*line, *column)),
            WorkflowError::Many(list) => list.first().and_then(WorkflowError::position),
        }
    }

    /// The field path of the offending item; for several, the first's.
    pub fn field(&self) -> Option<&str> {
        match self {
            WorkflowError::Read { .. } => None,
            WorkflowError::Invalid { field, .. } => Some(field),
            WorkflowError::Many(list) => list.first().and_then(WorkflowError::field),
        }
    }
}
