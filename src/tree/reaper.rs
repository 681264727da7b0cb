//! Frees the nodes of destroyed sandboxes on a background thread, so that
//! DestroySandbox answers without waiting for thousands of deallocations,
//! and then hands the freed memory back to the system: glibc's malloc keeps
//! freed pages otherwise, and the daemon would stay at its peak size.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use super::node::Node;

/// Work for the reaper thread.
enum Job {
    Free(#[allow(dead_code)] Arc<Node>),
    /// Cache invalidation that the answer to a request need not wait for.
    Later(Box<dyn FnOnce() + Send>),
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
                while let Ok(job) = receiver.recv() {
                    // Let the answer that queued this job reach the client
                    // first: the work below takes the malloc arena's lock
                    // and a CPU (of two, here) for up to a millisecond.
                    std::thread::sleep(SETTLE);
                    run(job);
                    // Trim once per burst of jobs, not once per job.
                    while let Ok(job) = receiver.try_recv() {
                        run(job);
                    }
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

fn run(job: Job) {
    match job {
        Job::Free(tree) => drop(tree),
        Job::Later(work) => work(),
        Job::Trim => {}
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn return_free_memory() {
    // SAFETY: no preconditions; releases free heap pages in every arena.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_free_memory() {}
