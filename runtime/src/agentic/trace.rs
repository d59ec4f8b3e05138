//! The JSONL trace format of agent sessions: one session per line,
//! `{"id": "...", "system_tokens": N, "turns": [{"new_tokens": N, "output_tokens": N,
//! "reasoning_tokens": N, "tool": {"name": "...", "duration_s": S, "hint_s": S}}, ...]}`
//! (`reasoning_tokens` and `hint_s` optional). Blank lines and lines
//! starting with `#` are skipped. Every problem is reported with the file, the line and the
//! field, and all of them at once, before anything runs.
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

/// Every turn of a trace `parse_trace` read from `text` whose context (its prompt, reasoning
/// and answer) passes `max_model_len`, as `FILE:LINE: turns[k]: …` — all of them, before a
/// replay starts on a pool that cannot hold them.
pub fn turns_past_context(file: &str, text: &str, trace: &AgentTrace, max_model_len: u32) -> Vec<String> {
    let lines = text.lines().enumerate().filter(|(_, l)| {
        let t = l.trim();
        !(t.is_empty() || t.starts_with('#'))
    });
    let mut problems = Vec::new();
    let mut more = 0usize;
    for ((i, _), s) in lines.zip(&trace.sessions) {
        for (k, turn) in s.turns.iter().enumerate() {
            let tokens = s.prompt_tokens(k) + turn.reasoning_tokens + turn.output_tokens;
            if tokens > max_model_len && problems.len() >= MAX_LISTED_PROBLEMS {
                more += 1;
            } else if tokens > max_model_len {
                problems.push(format!(
                    "{file}:{}: turns[{k}]: session `{}` needs {tokens} tokens there (prompt, reasoning and answer), more than the pool's max_model_len {max_model_len}",
                    i + 1,
                    s.id
                ));
            }
        }
    }
    if more > 0 {
        problems.push(format!("… and {more} more turns past the context"));
    }
    problems
}

/// Parses a JSONL trace named `file` (the name only labels errors).
pub fn parse_trace(file: &str, text: &str) -> Result<AgentTrace, TraceError> {
    let mut problems = Vec::new();
    let mut sessions = Vec::new();
    let mut ids = BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
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
                        &format!("{} is not a duration in [0, {MAX_TOOL_S}] s", tool.duration_s),
                    );
                }
                if let Some(h) = tool.hint_s
                    && !(h.is_finite() && (0.0..=MAX_TOOL_S).contains(&h))
                {
                    at(&format!("turns[{k}].tool.hint_s"), &format!("{h} is not a duration"));
                }
            }
            None if k < last => at(&format!("turns[{k}].tool"), "every turn but the last calls a tool"),
            None => {}
        }
    }
    let context = u64::from(session.system_tokens)
        + session.turns.iter().map(|t| u64::from(t.new_tokens) + u64::from(t.output_tokens)).sum::<u64>();
    if context > MAX_CONTEXT_TOKENS {
        at("turns", &format!("the conversation reaches {context} tokens (at most {MAX_CONTEXT_TOKENS})"));
    } else {
        // A call's own context: its prompt, its reasoning and its answer (the reasoning is not
        // kept, so it counts once, in its own call).
        let mut prompt = u64::from(session.system_tokens);
        for (k, t) in session.turns.iter().enumerate() {
            prompt += u64::from(t.new_tokens);
            let call = prompt + u64::from(t.reasoning_tokens) + u64::from(t.output_tokens);
            if call > MAX_CONTEXT_TOKENS {
                at(
                    &format!("turns[{k}].reasoning_tokens"),
                    &format!("the call reaches {call} tokens with its reasoning (at most {MAX_CONTEXT_TOKENS})"),
                );
                break;
            }
            prompt += u64::from(t.output_tokens);
        }
    }
    problems
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

    #[test]
    fn an_empty_trace_is_an_error() {
        assert!(parse_trace("e.jsonl", "\n# nothing\n").unwrap_err().to_string().contains("no session"));
    }
}
