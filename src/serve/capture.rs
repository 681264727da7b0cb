//! Captures of default places off the Create's path: a Create that meets
//! many digests the store lacks (a first build's large action: 5,000
//! sources, half a second of copying) serves them from their default
//! places, checked by size as before, and queues them here; one thread
//! captures them, each once, and later Creates find them in the store.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::sandbox::default_place;
use crate::sandbox::store::{ContentStore, Retention};

/// A Create that finds at most this many digests to capture captures them
/// itself (about 50 us each on tmpfs from a warm page cache), so that a
/// small action's inputs are checked by their bytes from its first use.
pub const ON_CREATE: usize = 64;

/// A digest and the default place to capture it from.
type Job = (Box<str>, PathBuf);

pub struct Capturer {
    queue: Mutex<Option<Sender<Job>>>,
    /// Digests queued and not captured yet: queued once.
    pending: Arc<Mutex<HashSet<Box<str>>>>,
    /// Set at the stop: what is still queued is dropped.
    stopping: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Capturer {
    pub fn start(store: Arc<ContentStore>) -> Capturer {
        let (queue, jobs) = mpsc::channel::<Job>();
        let pending: Arc<Mutex<HashSet<Box<str>>>> = Arc::default();
        let done = pending.clone();
        let stopping = Arc::new(AtomicBool::new(false));
        let stopped = stopping.clone();
        let thread = std::thread::Builder::new()
            .name("capture".into())
            .spawn(move || {
                lowest_priority();
                for (hash, place) in jobs {
                    if stopped.load(Ordering::Relaxed) {
                        break;
                    }
                    // A default place that fails goes on being looked at,
                    // and refused by size where it differs.
                    if let Err(err) = store.capture(&hash, &place, Retention::Keep) {
                        log::debug!("{}", default_place::capture_refusal(&err));
                    }
                    done.lock().remove(&hash);
                }
            })
            .ok();
        Capturer {
            queue: Mutex::new(thread.is_some().then_some(queue)),
            pending,
            stopping,
            thread: Mutex::new(thread),
        }
    }

    /// Queues digest `hash`'s capture from `place`, unless it is queued.
    /// False if nothing captures any more (stopped, or no thread).
    pub fn queue(&self, hash: &str, place: PathBuf) -> bool {
        let queue = self.queue.lock();
        let Some(queue) = queue.as_ref() else {
            return false;
        };
        if self.pending.lock().insert(hash.into()) && queue.send((hash.into(), place)).is_err() {
            self.pending.lock().remove(hash);
            return false;
        }
        true
    }

    /// Stops after the capture under way (at most one file's copy): the
    /// backend is ending, and what is still queued is left uncaptured.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        drop(self.queue.lock().take());
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Capturer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// This thread yields the CPU to everything else: captures are work done
/// once per digest for later Creates, while the actions of this build run
/// beside them (measured on mixed, 2 CPUs: at normal priority the cold
/// replay's run step was 1.42x unsandboxed).
fn lowest_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on this thread's own id has no memory effects.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}
