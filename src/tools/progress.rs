//! A progress line on stderr for the long subcommands (`calibrate`,
//! `replay`), drawn only when stderr is a terminal: in a log or a pipe it
//! would be noise, so there nothing is written at all.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Redraws at most this often: a terminal need not see every step.
const REDRAW: Duration = Duration::from_millis(100);

pub struct Progress {
    /// Whether anything is written.
    shown: bool,
    label: String,
    total: usize,
    done: usize,
    started: Instant,
    drawn: Option<Instant>,
}

impl Progress {
    /// A progress of `total` steps, shown if stderr is a terminal.
    pub fn new(label: impl Into<String>, total: usize) -> Progress {
        Progress {
            shown: std::io::stderr().is_terminal(),
            label: label.into(),
            total,
            done: 0,
            started: Instant::now(),
            drawn: None,
        }
    }

    /// One more step done.
    pub fn step(&mut self) {
        self.done += 1;
        self.draw(false);
    }

    /// Prints `line` above the progress line, on a terminal only.
    pub fn note(&mut self, line: &str) {
        if self.shown {
            eprint!("\r\x1b[2K{line}\n");
            self.draw(true);
        }
    }

    fn draw(&mut self, now: bool) {
        if !self.shown {
            return;
        }
        let last = self.done >= self.total;
        if !now && !last && self.drawn.is_some_and(|at| at.elapsed() < REDRAW) {
            return;
        }
        self.drawn = Some(Instant::now());
        let percent = (self.done * 100).checked_div(self.total).unwrap_or(100);
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2K{}: {}/{} ({percent}%), {:.0} s",
            self.label,
            self.done,
            self.total,
            self.started.elapsed().as_secs_f64()
        );
        let _ = err.flush();
    }
}

impl Drop for Progress {
    /// Clears the line, so that what follows starts on a clean one.
    fn drop(&mut self) {
        if self.shown && self.drawn.is_some() {
            eprint!("\r\x1b[2K");
        }
    }
}
