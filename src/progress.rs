//! Progress of `switchyard run` on stderr, and Ctrl-C.
//!
//! On a terminal (and without `--json`) an indicatif bar; otherwise — stderr redirected to a
//! file or a pipe, or `--json` — plain lines on stderr: one as the run starts, then one every
//! [`LINE_EVERY`] of wall time (at most), and a final line. Progress never goes to stdout, so the
//! JSON report stays byte-identical for the same seed.
//!
//! Ctrl-C (SIGINT) and SIGTERM set a flag the run polls between events (the simulator) or every
//! 50 ms (the live runtime); the run then stops with a partial report (a live run unloads its
//! engines first) and exits with status 130. A second signal of either kind exits at once
//! (status 130 after SIGINT, 143 after SIGTERM), after a SIGKILL to the process groups of the
//! engines this process recorded in the engine registry; the engine children also die with
//! the process through `PR_SET_PDEATHSIG`. A signal within [`SAME_INTERRUPT`] of the first is
//! the same interrupt, not a second one: coreutils' `timeout` sends its SIGTERM twice, to the
//! process and then to its process group, microseconds apart ([`Interrupts`]). The handler is
//! tokio's (already a dependency through the runtime), on a thread of its own.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

/// Least wall time between two progress lines.
pub const LINE_EVERY: Duration = Duration::from_secs(2);

/// Exit status of a run stopped by Ctrl-C or SIGTERM (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Exit status of an immediate exit on a second signal that was SIGTERM (128 + SIGTERM).
pub const EXIT_TERMINATED: u8 = 143;

/// Where a run stands, as far as the shell tells.
#[derive(Debug, Clone, Copy, Default)]
pub struct Point {
    pub done: usize,
    pub total: usize,
    /// Virtual seconds (the simulator only).
    pub virtual_s: Option<f64>,
    /// Events processed (the simulator only).
    pub events: Option<u64>,
}

pub struct Lines {
    started: Instant,
    /// Wall time and events of the last line printed.
    last: Option<(Instant, u64)>,
    point: Point,
    finished: bool,
}

/// The progress display of one run.
pub enum Reporter {
    Bar(ProgressBar),
    Lines(Mutex<Lines>),
}

impl Reporter {
    /// A bar when stderr is a terminal and the report is not JSON, else lines on stderr.
    pub fn new(total: usize, json: bool) -> Self {
        if !json && std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total as u64);
            bar.set_style(
                ProgressStyle::with_template("{spinner} sessions {pos}/{len} [{bar:30}] {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            Reporter::Bar(bar)
        } else {
            Reporter::Lines(Mutex::new(Lines {
                started: Instant::now(),
                last: None,
                point: Point { total, ..Point::default() },
                finished: false,
            }))
        }
    }

    /// Record where the run stands; prints a line when one is due.
    pub fn update(&self, p: Point) {
        match self {
            Reporter::Bar(bar) => bar.set_position(p.done as u64),
            Reporter::Lines(lines) => {
                let Ok(mut l) = lines.lock() else { return };
                l.point = p;
                l.print_if_due();
            }
        }
    }

    /// For lines: print the last known state every [`LINE_EVERY`] even when the run reports
    /// nothing (a live run calls back only as sessions end; a long simulator tick), until
    /// [`Reporter::finish`]. Does nothing for a bar, which ticks by itself.
    pub fn heartbeat(self: &Arc<Self>) {
        if matches!(**self, Reporter::Bar(_)) {
            return;
        }
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new().name("switchyard-progress".into()).spawn(move || {
            loop {
                std::thread::sleep(LINE_EVERY / 4);
                let Reporter::Lines(lines) = &*me else { return };
                let Ok(mut l) = lines.lock() else { return };
                if l.finished {
                    return;
                }
                l.print_if_due();
            }
        });
        // Without the thread the lines still come with the run's own callbacks.
        drop(spawned);
    }

    /// End the display: clear the bar, or print the final line (`outcome` heads it, e.g.
    /// `done` or `interrupted`; `failed` sessions are named when there are any).
    pub fn finish(&self, outcome: &str, failed: usize) {
        match self {
            Reporter::Bar(bar) => bar.finish_and_clear(),
            Reporter::Lines(lines) => {
                let Ok(mut l) = lines.lock() else { return };
                l.finished = true;
                let now = Instant::now();
                // The final rate is over the whole run.
                l.last = Some((l.started, 0));
                let mut line = l.line(&format!("{outcome}: "), now);
                if failed > 0 {
                    line.push_str(&format!(" · {failed} failed"));
                }
                drop(l);
                emit(&line);
            }
        }
    }
}

impl Lines {
    /// Print a line if none was printed in the last [`LINE_EVERY`] (or ever).
    fn print_if_due(&mut self) {
        let now = Instant::now();
        if self.last.is_none_or(|(at, _)| now.duration_since(at) >= LINE_EVERY) {
            let line = self.line("", now);
            self.last = Some((now, self.point.events.unwrap_or(0)));
            emit(&line);
        }
    }

    fn line(&self, head: &str, now: Instant) -> String {
        let p = self.point;
        let wall = now.duration_since(self.started).as_secs_f64();
        let mut s = format!("progress [{wall:7.1} s wall] {head}sessions {}/{} ended", p.done, p.total);
        if let Some(v) = p.virtual_s {
            s.push_str(&format!(" · virtual time {v:.1} s"));
        }
        if let Some(events) = p.events {
            let (since, before) = self.last.unwrap_or((self.started, 0));
            let dt = now.duration_since(since).as_secs_f64();
            let rate = if dt > 0.0 { (events.saturating_sub(before)) as f64 / dt } else { 0.0 };
            s.push_str(&format!(" · {events} events ({rate:.0} events/s)"));
        }
        s
    }
}

fn emit(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
    let _ = err.flush();
}

/// Signals that come within this long of the first one are that same interrupt, not a request
/// to quit at once. coreutils' `timeout` (and a shell's job control with a supervisor's `kill`)
/// signals the process and then its process group, microseconds apart; this handler's thread
/// may be descheduled for tens or hundreds of milliseconds on a loaded host between taking the
/// two. A person's deliberate second Ctrl-C — after the first one's message, when the run does
/// not stop soon enough — comes seconds later, and even a hurried double press takes a few
/// hundred milliseconds. Erring long costs that person one more key press; erring short loses
/// the partial report.
pub const SAME_INTERRUPT: Duration = Duration::from_millis(500);

/// What one SIGINT or SIGTERM asks for ([`Interrupts::on`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SignalAction {
    /// The first: stop the run and write the partial report.
    Stop,
    /// Within [`SAME_INTERRUPT`] of the first: the same interrupt again (ignored).
    Repeat,
    /// A second interrupt: exit at once with this status.
    Quit(u8),
}

/// The interrupts taken so far: when the first came.
#[derive(Debug, Default)]
struct Interrupts {
    first: Option<Instant>,
}

impl Interrupts {
    /// A signal standing for exit status `status`, taken at `at`.
    fn on(&mut self, status: u8, at: Instant) -> SignalAction {
        match self.first {
            None => {
                self.first = Some(at);
                SignalAction::Stop
            }
            Some(first) if at.saturating_duration_since(first) < SAME_INTERRUPT => SignalAction::Repeat,
            Some(_) => SignalAction::Quit(status),
        }
    }
}

/// The next SIGINT or SIGTERM, as the exit status it stands for (`None`: the signal streams
/// ended, the driver is gone).
async fn next_signal(i: &mut tokio::signal::unix::Signal, t: &mut tokio::signal::unix::Signal) -> Option<u8> {
    tokio::select! {
        s = i.recv() => s.map(|()| EXIT_INTERRUPTED),
        s = t.recv() => s.map(|()| EXIT_TERMINATED),
    }
}

/// Install the Ctrl-C and SIGTERM handler: the first SIGINT or SIGTERM sets the returned flag
/// (and says so on stderr), a second one — [`SAME_INTERRUPT`] or more after the first — exits
/// at once with [`EXIT_INTERRUPTED`] (SIGINT) or [`EXIT_TERMINATED`] (SIGTERM), killing this
/// process's engine groups first.
pub fn on_ctrl_c() -> Result<Arc<AtomicBool>> {
    on_ctrl_c_doing("stopping the run and writing a partial report")
}

/// [`on_ctrl_c`] whose first-signal message says `what` happens (e.g. the server stops).
pub fn on_ctrl_c_doing(what: &'static str) -> Result<Arc<AtomicBool>> {
    use tokio::signal::unix::{SignalKind, signal};
    let flag = Arc::new(AtomicBool::new(false));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the signal handler's runtime")?;
    // Registered here, before the run starts, so that no early signal falls to the default
    // action.
    let (mut interrupts, mut terms) = runtime.block_on(async {
        let i = signal(SignalKind::interrupt()).context("cannot install the Ctrl-C handler")?;
        let t = signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
        anyhow::Ok((i, t))
    })?;
    let set = Arc::clone(&flag);
    std::thread::Builder::new()
        .name("switchyard-sigint".into())
        .spawn(move || {
            runtime.block_on(async move {
                let mut taken = Interrupts::default();
                while let Some(status) = next_signal(&mut interrupts, &mut terms).await {
                    match taken.on(status, Instant::now()) {
                        SignalAction::Stop => {
                            set.store(true, Ordering::SeqCst);
                            let line = if status == EXIT_INTERRUPTED {
                                format!("interrupted: {what} (Ctrl-C again to quit at once)")
                            } else {
                                format!("terminated (SIGTERM): {what} (a second signal quits at once)")
                            };
                            // Said from a thread of its own: a stderr that blocks (a full pipe)
                            // must not hold this one while a repeat of the signal comes, which
                            // would then be taken late, as a second interrupt.
                            let said = std::thread::Builder::new()
                                .name("switchyard-sigint-say".into())
                                .spawn({
                                    let line = line.clone();
                                    move || emit(&line)
                                });
                            if said.is_err() {
                                emit(&line);
                            }
                        }
                        SignalAction::Repeat => {}
                        SignalAction::Quit(status) => {
                            // The engine children die with this process (PR_SET_PDEATHSIG); the
                            // processes they forked are in their groups.
                            let dir = switchyard_runtime::live::engines::registry::default_dir();
                            switchyard_runtime::live::engines::registry::kill_own(&dir);
                            std::process::exit(i32::from(status));
                        }
                    }
                }
            });
        })
        .context("cannot start the Ctrl-C handler's thread")?;
    Ok(flag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_within_the_window_is_the_same_interrupt() {
        let t0 = Instant::now();
        let mut taken = Interrupts::default();
        assert_eq!(taken.on(EXIT_TERMINATED, t0), SignalAction::Stop);
        // `timeout`'s second SIGTERM (to the process group), microseconds later: the same one.
        assert_eq!(taken.on(EXIT_TERMINATED, t0 + Duration::from_micros(30)), SignalAction::Repeat);
        // Any kind, up to just inside the window.
        assert_eq!(taken.on(EXIT_INTERRUPTED, t0 + SAME_INTERRUPT - Duration::from_millis(1)), SignalAction::Repeat);
        // A repeat does not move the window: a signal after it quits.
        assert_eq!(taken.on(EXIT_INTERRUPTED, t0 + SAME_INTERRUPT), SignalAction::Quit(EXIT_INTERRUPTED));
        assert_eq!(taken.on(EXIT_TERMINATED, t0 + Duration::from_secs(3)), SignalAction::Quit(EXIT_TERMINATED));
    }
}
