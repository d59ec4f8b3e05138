//! The JSONL trace format of agent sessions: one session per line,
//! `{"id": "...", "system_tokens": N, "turns": [{"new_tokens": N, "output_tokens": N,
//! "reasoning_tokens": N, "tool": {"name": "...", "duration_s": S, "hint_s": S}}, ...]}`
//! (`reasoning_tokens` and `hint_s` optional). Blank lines and lines
//! starting with `#` are skipped, and so is a UTF-8 byte-order mark at the start. Every problem
//! is reported with the file, the line and the field, and all of them at once, before anything
//! runs — with [`parse_trace_for_pool`], the turns a pool cannot hold among them.
//!
//! Must not depend on anything of the crate outside `agentic` (its session and trace types),
//! nor on the emulator or the tools (checked for the whole module by `module_boundaries.rs`).

use std::collections::BTreeSet;

use thiserror::Error;

use super::{AgentSession, AgentTrace};

/// Largest context a trace may describe: Qwen3's 128k YaRN window bounds any real session.
const MAX_CONTEXT_TOKENS: u64 = 131_072;
/// Longest tool call a trace may describe (a day): a longer one is a unit mistake.
const MAX_TOOL_S: f64 = 86_400.0;

#[derive(Debug, Error)]
pub enum TraceError {
    #[error("{}", .problems.join("\n"))]
    Invalid { problems: Vec<String> },
}

/// Problems listed at most; the rest are counted.
const MAX_LISTED_PROBLEMS: usize = 50;

/// Largest trace file read (as a dataset: 256 MiB), checked before reading.
pub const MAX_TRACE_FILE_BYTES: u64 = 256 << 20;

/// Parses a JSONL trace named `file` (the name only labels errors).
pub fn parse_trace(file: &str, text: &str) -> Result<AgentTrace, TraceError> {
    parse(file, text, None)
}

/// [`parse_trace`] for a replay on a pool whose replicas hold `max_model_len` tokens: every turn
/// whose context (its prompt, reasoning and answer) passes it is a problem too, as
/// `FILE:LINE: turns[k]: …`, reported with the file's other problems in line order, all at
/// once — before a replay starts on a pool that cannot hold them. (A session past the parser's
/// own limit, 131,072 tokens, is named once, by that limit.)
pub fn parse_trace_for_pool(file: &str, text: &str, max_model_len: u32) -> Result<AgentTrace, TraceError> {
    parse(file, text, Some(max_model_len))
}

fn parse(file: &str, text: &str, max_model_len: Option<u32>) -> Result<AgentTrace, TraceError> {
    // A byte-order mark some editors write is not part of the first line's JSON.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut problems = Vec::new();
    let mut sessions = Vec::new();
    let mut ids = BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if !trimmed.starts_with('{') {
            // serde's reason for such a line ("expected ident", "expected value") or its type
            // ("invalid type: sequence") says less than this.
            problems.push(format!("{file}:{line_no}: the line is not a JSON object (a session is one `{{...}}` object per line)"));
            continue;
        }
        let mut de = serde_json::Deserializer::from_str(trimmed);
        let session: AgentSession = match serde_path_to_error::deserialize(&mut de) {
            Ok(s) => s,
            Err(e) => {
                problems.push(line_problem(file, line_no, e.inner(), &e.path().to_string()));
                continue;
            }
        };
        // Anything after the session object on its line.
        if let Err(e) = de.end() {
            problems.push(line_problem(file, line_no, &e, ""));
            continue;
        }
        let at = |field: &str, why: &str| format!("{file}:{line_no}: {field}: {why}");
        if !session.id.is_empty() && !ids.insert(session.id.clone()) {
            problems.push(at("id", &format!("`{}` appears on an earlier line", session.id)));
        }
        problems.extend(session_problems(&session).into_iter().map(|(field, why)| at(&field, &why)));
        if let Some(max) = max_model_len
            && context_problem(&session).is_none()
        {
            for (k, tokens) in calls_past(&session, max) {
                problems.push(at(
                    &format!("turns[{k}]"),
                    &format!(
                        "session `{}` needs {tokens} tokens there (prompt, reasoning and answer), more than the pool's max_model_len {max}",
                        session.id
                    ),
                ));
            }
        }
        sessions.push(session);
    }
    if sessions.is_empty() && problems.is_empty() {
        problems.push(format!("{file}: the trace has no session"));
    }
    if sessions.is_empty() && problems.len() > 1 {
        // Not one line parsed: the file is not a trace at all (a workflow YAML, say) — one
        // line says so instead of a problem per line.
        let first = problems.swap_remove(0);
        let more = problems.len();
        problems = vec![format!(
            "{file}: not a JSONL agent trace (no line is a session object; format in workflows/traces/README.md): {first} (and {more} more line(s) like it)"
        )];
    } else if problems.len() > MAX_LISTED_PROBLEMS {
        let more = problems.len() - MAX_LISTED_PROBLEMS;
        problems.truncate(MAX_LISTED_PROBLEMS);
        problems.push(format!("{file}: … and {more} more problem(s)"));
    }
    if problems.is_empty() { Ok(AgentTrace { sessions }) } else { Err(TraceError::Invalid { problems }) }
}

/// The turns of `session` whose call (prompt, reasoning and answer) needs more than
/// `max_model_len` tokens, with that need.
fn calls_past(session: &AgentSession, max_model_len: u32) -> Vec<(usize, u64)> {
    let mut prompt = u64::from(session.system_tokens);
    let mut past = Vec::new();
    for (k, t) in session.turns.iter().enumerate() {
        prompt += u64::from(t.new_tokens);
        let call = prompt + u64::from(t.reasoning_tokens) + u64::from(t.output_tokens);
        if call > u64::from(max_model_len) {
            past.push((k, call));
        }
        prompt += u64::from(t.output_tokens);
    }
    past
}

/// One trace line that is not a session: position, the field's path (`turns[2].tool.duration_s`;
/// none when the line is not JSON at all) and serde's reason without its own "at line 1 column
/// N" (each line is parsed alone, so its line would always read 1).
fn line_problem(file: &str, line_no: usize, inner: &serde_json::Error, path: &str) -> String {
    let mut why = inner.to_string();
    let suffix = format!(" at line {} column {}", inner.line(), inner.column());
    if let Some(stripped) = why.strip_suffix(&suffix) {
        why = stripped.to_string();
    }
    // Rust's type names mean nothing to the trace's author.
    for (rust, plain) in [
        ("expected u32", "expected a whole number from 0 to 4294967295"),
        ("expected u64", "expected a whole number of at least 0"),
        ("expected f64", "expected a number"),
    ] {
        why = why.replace(rust, plain);
    }
    let field = if path.is_empty() || path == "." { String::new() } else { format!(" {path}:") };
    format!("{file}:{line_no}:{}:{field} {why}", inner.column())
}

/// What is wrong with one session, as (field, reason) pairs: the checks every trace passes
/// before it runs, whether parsed ([`parse_trace`]) or built in code ([`AgentTrace::validate`]).
pub(super) fn session_problems(session: &AgentSession) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let mut at = |field: &str, why: &str| problems.push((field.to_string(), why.to_string()));
    if session.id.is_empty() {
        at("id", "must not be empty");
    }
    if session.turns.is_empty() {
        at("turns", "a session needs at least one turn");
    }
    let last = session.turns.len().saturating_sub(1);
    for (k, turn) in session.turns.iter().enumerate() {
        if turn.output_tokens == 0 {
            at(&format!("turns[{k}].output_tokens"), "must be at least 1");
        }
        if k == 0 && turn.new_tokens == 0 && session.system_tokens == 0 {
            at("turns[0].new_tokens", "the first prompt is empty");
        }
        match &turn.tool {
            Some(tool) => {
                if k == last {
                    at(&format!("turns[{k}].tool"), "the last turn ends the session: it calls no tool");
                }
                if tool.name.is_empty() {
                    at(&format!("turns[{k}].tool.name"), "must not be empty");
                }
                if !(tool.duration_s.is_finite() && (0.0..=MAX_TOOL_S).contains(&tool.duration_s)) {
                    at(
                        &format!("turns[{k}].tool.duration_s"),
                        &format!("{} is not a duration in [0, {MAX_TOOL_S}] s", shown(tool.duration_s)),
                    );
                }
                if let Some(h) = tool.hint_s
                    && !(h.is_finite() && (0.0..=MAX_TOOL_S).contains(&h))
                {
                    at(&format!("turns[{k}].tool.hint_s"), &format!("{} is not a duration in [0, {MAX_TOOL_S}] s", shown(h)));
                }
            }
            None if k < last => at(&format!("turns[{k}].tool"), "every turn but the last calls a tool"),
            None => {}
        }
    }
    if let Some((field, why)) = context_problem(session) {
        at(&field, &why);
    }
    problems
}

/// The session's context past the parser's own limit ([`MAX_CONTEXT_TOKENS`]), as a (field,
/// reason) pair: the whole conversation, else the first call with its reasoning.
fn context_problem(session: &AgentSession) -> Option<(String, String)> {
    let context = u64::from(session.system_tokens)
        + session.turns.iter().map(|t| u64::from(t.new_tokens) + u64::from(t.output_tokens)).sum::<u64>();
    if context > MAX_CONTEXT_TOKENS {
        return Some(("turns".into(), format!("the conversation reaches {context} tokens (at most {MAX_CONTEXT_TOKENS})")));
    }
    // A call's own context: its prompt, its reasoning and its answer (the reasoning is not
    // kept, so it counts once, in its own call).
    let max = u32::try_from(MAX_CONTEXT_TOKENS).unwrap_or(u32::MAX);
    calls_past(session, max).first().map(|&(k, call)| {
        (
            format!("turns[{k}].reasoning_tokens"),
            format!("the call reaches {call} tokens with its reasoning (at most {MAX_CONTEXT_TOKENS})"),
        )
    })
}

/// A number as an error echoes it: past a million in scientific notation (`1e300`, not 301
/// digits).
fn shown(x: f64) -> String {
    if x.abs() >= 1e6 { format!("{x:e}") } else { x.to_string() }
}

/// The trace as JSONL text (what [`parse_trace`] reads back).
pub fn to_jsonl(trace: &AgentTrace) -> String {
    let mut out = String::new();
    for s in &trace.sessions {
        // A session of plain numbers and strings always serialises.
        if let Ok(line) = serde_json::to_string(s) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_round_trips_and_prompts_grow() {
        let text = r#"
# two sessions
{"id": "a", "system_tokens": 100, "turns": [{"new_tokens": 50, "output_tokens": 10, "tool": {"name": "bash", "duration_s": 1.5, "hint_s": 2.0}}, {"new_tokens": 20, "output_tokens": 5}]}
{"id": "b", "system_tokens": 100, "turns": [{"new_tokens": 7, "output_tokens": 3}]}
"#;
        let t = parse_trace("t.jsonl", text).unwrap();
        assert_eq!(t.sessions.len(), 2);
        assert_eq!(t.sessions[0].prompt_tokens(0), 150);
        assert_eq!(t.sessions[0].prompt_tokens(1), 180);
        assert_eq!(t.sessions[0].final_context(), 185);
        assert_eq!(t.tool_calls(), 1);
        assert_eq!(parse_trace("t.jsonl", &to_jsonl(&t)).unwrap(), t);
    }

    #[test]
    fn every_problem_names_file_line_and_field() {
        let text = "{\"id\": \"a\", \"system_tokens\": 1, \"turns\": [{\"new_tokens\": 1, \"output_tokens\": 0}]}\n\
                    {\"id\": \"a\", \"system_tokens\": 1, \"turns\": [{\"new_tokens\": 1, \"output_tokens\": 1, \"tool\": {\"name\": \"x\", \"duration_s\": -1}}]}\n\
                    {\"id\": \"c\", \"system_tokens\": 1, \"turns\": [], \"extra\": 1}\n\
                    {\"id\": \"d\", \"system_tokens\": 1, \"turns\": [{\"new_tokens\": 1, \"output_tokens\": 1, \"reasoning_tokens\": 4294967295}]}\n";
        let err = parse_trace("f.jsonl", text).unwrap_err().to_string();
        assert!(err.contains("f.jsonl:1: turns[0].output_tokens: must be at least 1"), "{err}");
        assert!(err.contains("f.jsonl:2: id: `a` appears on an earlier line"), "{err}");
        assert!(err.contains("f.jsonl:2: turns[0].tool: the last turn ends the session"), "{err}");
        assert!(err.contains("f.jsonl:2: turns[0].tool.duration_s: -1 is not a duration"), "{err}");
        assert!(err.contains("f.jsonl:3:") && err.contains("unknown field `extra`"), "{err}");
        let typed = "{\"id\": \"e\", \"system_tokens\": \"many\", \"turns\": []}\n\
                     {\"id\": \"f\", \"system_tokens\": 1, \"turns\": [{\"new_tokens\": 1, \"output_tokens\": 1, \"tool\": {\"name\": \"x\", \"duration_s\": \"slow\"}}, {\"new_tokens\": 1, \"output_tokens\": 1}]}\n";
        let typed_err = parse_trace("g.jsonl", &format!("{text}{typed}")).unwrap_err().to_string();
        assert!(
            typed_err.contains("g.jsonl:5:35: system_tokens: invalid type: string \"many\", expected a whole number from 0 to 4294967295"),
            "{typed_err}"
        );
        assert!(
            typed_err.contains("g.jsonl:6:")
                && typed_err.contains(": turns[0].tool.duration_s: invalid type: string \"slow\", expected a number"),
            "{typed_err}"
        );
        assert!(!typed_err.contains("at line 1"), "each line is parsed alone: no inner line number: {typed_err}");
        assert!(
            err.contains("f.jsonl:4: turns[0].reasoning_tokens: the call reaches 4294967298 tokens with its reasoning"),
            "{err}"
        );
    }

    #[test]
    fn a_file_that_is_no_trace_at_all_is_one_problem_not_one_per_line() {
        let yaml = "name: gsm8k\ndeployments:\n  a: {model: Qwen3-8B}\nnodes:\n  x: {}\n";
        let err = parse_trace("w.yaml", yaml).unwrap_err().to_string();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("w.yaml: not a JSONL agent trace") && err.contains("w.yaml:1:") && err.contains("4 more"), "{err}");
        // A trace with many bad lines among good ones lists the first 50 and counts the rest.
        let good = "{\"id\": \"g\", \"system_tokens\": 1, \"turns\": [{\"new_tokens\": 1, \"output_tokens\": 1}]}\n";
        let text = format!("{good}{}", "oops\n".repeat(60));
        let err = parse_trace("m.jsonl", &text).unwrap_err().to_string();
        assert_eq!(err.lines().count(), 51, "{err}");
        assert!(err.ends_with("m.jsonl: … and 10 more problem(s)"), "{err}");
    }

    /// Huge numbers are echoed in scientific notation, `hint_s` names its range as
    /// `duration_s` does, a leading byte-order mark is skipped, and a line that is no JSON
    /// object says so (not serde's "expected ident").
    #[test]
    fn error_text_is_short_and_plain() {
        let tool = |fields: &str| {
            format!(
                "{{\"id\": \"h\", \"system_tokens\": 1, \"turns\": [{{\"new_tokens\": 1, \"output_tokens\": 1, \"tool\": {{\"name\": \"x\", {fields}}}}}, {{\"new_tokens\": 1, \"output_tokens\": 1}}]}}\n"
            )
        };
        let err = parse_trace("h.jsonl", &tool("\"duration_s\": 1e300")).unwrap_err().to_string();
        assert_eq!(err, "h.jsonl:1: turns[0].tool.duration_s: 1e300 is not a duration in [0, 86400] s");
        let err = parse_trace("h.jsonl", &tool("\"duration_s\": 1, \"hint_s\": -3")).unwrap_err().to_string();
        assert_eq!(err, "h.jsonl:1: turns[0].tool.hint_s: -3 is not a duration in [0, 86400] s");
        let good = "{\"id\": \"g\", \"system_tokens\": 1, \"turns\": [{\"new_tokens\": 1, \"output_tokens\": 1}]}\n";
        assert_eq!(parse_trace("bom.jsonl", &format!("\u{feff}{good}")).unwrap().sessions.len(), 1);
        let err = parse_trace("n.jsonl", &format!("{good}not json\n[1]\n")).unwrap_err().to_string();
        let want = "the line is not a JSON object (a session is one `{...}` object per line)";
        assert_eq!(err, format!("n.jsonl:2: {want}\nn.jsonl:3: {want}"));
    }

    /// With a pool, a file's parse errors and the turns the pool cannot hold are reported
    /// together, in line order; a session past the parser's own limit is named once.
    #[test]
    fn pool_limits_are_reported_with_the_parse_errors() {
        let text = "oops\n\
                    {\"id\": \"big\", \"system_tokens\": 50000, \"turns\": [{\"new_tokens\": 1, \"output_tokens\": 1}]}\n\
                    {\"id\": \"huge\", \"system_tokens\": 200000, \"turns\": [{\"new_tokens\": 1, \"output_tokens\": 1}]}\n\
                    {\"id\": \"ok\", \"system_tokens\": 10, \"turns\": [{\"new_tokens\": 1, \"output_tokens\": 1}]}\n";
        let err = parse_trace_for_pool("p.jsonl", text, 40_960).unwrap_err().to_string();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 3, "{err}");
        assert!(lines[0].starts_with("p.jsonl:1: the line is not a JSON object"), "{err}");
        assert_eq!(
            lines[1],
            "p.jsonl:2: turns[0]: session `big` needs 50002 tokens there (prompt, reasoning and answer), more than the pool's max_model_len 40960"
        );
        assert!(lines[2].starts_with("p.jsonl:3: turns: the conversation reaches 200002 tokens"), "{err}");
        // Without a pool, only the parser's own problems.
        assert_eq!(parse_trace("p.jsonl", text).unwrap_err().to_string().lines().count(), 2);
        assert_eq!(parse_trace_for_pool("p.jsonl", &text[5..text.len() - 1], 50_002).unwrap_err().to_string().lines().count(), 1);
    }

    #[test]
    fn an_empty_trace_is_an_error() {
        assert!(parse_trace("e.jsonl", "\n# nothing\n").unwrap_err().to_string().contains("no session"));
    }
}
