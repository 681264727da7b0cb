//! Frees the nodes of destroyed sandboxes on a background thread, so that
//! DestroySandbox answers without waiting for thousands of deallocations,
//! and then hands the freed memory back to the system: glibc's malloc keeps
//! freed pages otherwise, and the daemon would stay at its peak size.

use std::sync::mpsc::RecvTimeoutError;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::super::node::Node;

/// Work for the reaper thread.
enum Job {
    Free(#[allow(dead_code)] Arc<Node>),
    /// Cache invalidation that the answer to a request need not wait for.
    Later(Box<dyn FnOnce() + Send>),
    /// Work due at a time (expiring kept caches that no later destroy
    /// would drop).
    At(Instant, Box<dyn FnOnce() + Send>),
    /// Return freed memory to the system (after building a large sandbox,
    /// whose request and plan were freed).
    Trim,
}

/// How long the reaper waits after being woken before it works.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(2);

static REAPER: OnceLock<Mutex<Sender<Job>>> = OnceLock::new();

/// Drops `tree` on the reaper thread, or right here if that thread cannot
/// be started.
pub fn dispose(tree: Arc<Node>) {
    send(Job::Free(tree));
}

/// Runs `work` on the reaper thread, in order with the other jobs.
pub fn later(work: Box<dyn FnOnce() + Send>) {
    send(Job::Later(work));
}

/// Runs `work` on the reaper thread once `delay` has passed.
pub fn after(delay: Duration, work: Box<dyn FnOnce() + Send>) {
    send(Job::At(Instant::now() + delay, work));
}

/// Returns freed memory to the system soon, off the caller's thread.
pub fn trim_soon() {
    send(Job::Trim);
}

fn send(job: Job) {
    let sender = REAPER.get_or_init(|| {
        let (sender, receiver) = channel::<Job>();
        let started = std::thread::Builder::new()
            .name("reaper".into())
            .spawn(move || {
                let mut timed = Timed::default();
                loop {
                    let job = match timed.next_due() {
                        None => receiver.recv().map_err(|_| RecvTimeoutError::Disconnected),
                        Some(due) => {
                            receiver.recv_timeout(due.saturating_duration_since(Instant::now()))
                        }
                    };
                    match job {
                        Ok(job) => {
                            // Let the answer that queued this job reach the
                            // client first: the work below takes the malloc
                            // arena's lock and a CPU (of two, here) for up
                            // to a millisecond.
                            std::thread::sleep(SETTLE);
                            timed.run(job);
                            // Trim once per burst of jobs, not once per job.
                            while let Ok(job) = receiver.try_recv() {
                                timed.run(job);
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                    timed.run_due(Instant::now());
                    return_free_memory();
                }
            });
        if let Err(err) = started {
            log::warn!("cannot start the reaper thread ({err}); freeing inline");
        }
        Mutex::new(sender)
    });
    let sent = sender.lock().map(|s| s.send(job));
    // A send fails only if the thread never started: the job comes back
    // and is dropped here (freeing a tree inline).
    drop(sent);
}

/// Jobs waiting for their time, on the reaper thread.
#[derive(Default)]
struct Timed(Vec<(Instant, Box<dyn FnOnce() + Send>)>);

impl Timed {
    fn next_due(&self) -> Option<Instant> {
        self.0.iter().map(|(due, _)| *due).min()
    }

    fn run(&mut self, job: Job) {
        match job {
            Job::Free(tree) => drop(tree),
            Job::Later(work) => work(),
            Job::At(due, work) => self.0.push((due, work)),
            Job::Trim => {}
        }
    }

    fn run_due(&mut self, now: Instant) {
        let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.0)
            .into_iter()
            .partition(|(at, _)| *at <= now);
        self.0 = waiting;
        for (_, work) in due {
            work();
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn return_free_memory() {
    // SAFETY: no preconditions; releases free heap pages in every arena.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_free_memory() {}
