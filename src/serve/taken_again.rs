//! A file a predecessor handed on in the state directory (where its looks
//! found files, its directory blobs), taken again on a thread of its own
//! as a backend starts: read there, not before Negotiate is answered, and
//! removed (a successor gets this backend's own); then what it holds is
//! worked through for the next build's Creates, until done or stopped.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::sandbox::handed_on::HandedOnError;

/// Taking a handed-on file again, until stopped.
pub struct TakenAgain {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl TakenAgain {
    /// On thread `name`, reads `file` with `read`, removes it, and hands
    /// what was read to `take` with the flag [`TakenAgain::stop`] sets;
    /// `None` if there is no such file. What cannot be read or started is
    /// logged after `not_taken`.
    pub fn start<T>(
        name: &str,
        file: &Path,
        not_taken: &'static str,
        read: impl FnOnce(&Path) -> Result<T, HandedOnError> + Send + 'static,
        take: impl FnOnce(T, &AtomicBool) + Send + 'static,
    ) -> Option<TakenAgain> {
        if !file.exists() {
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let file = file.to_owned();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // Ahead of the Creates that would do the work anyway;
                // beside the build's first actions (measured for the looks
                // on mixed and stress, 4 rounds: setup alike at nice 0 and
                // nice 19; for both, 6 rounds: nice 0 no better).
                crate::background::lowest_priority();
                let read = read(&file);
                if let Err(err) = std::fs::remove_file(&file) {
                    log::warn!("cannot remove {file:?}: {err}");
                }
                match read {
                    Ok(what) => take(what, &stopping),
                    Err(why) => log::warn!("{not_taken}: {why}"),
                }
            });
        match thread {
            Ok(thread) => Some(TakenAgain { stop, thread }),
            Err(err) => {
                log::warn!("{not_taken}: spawn: {err}");
                None
            }
        }
    }

    /// Stops, and waits for the step under way.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}
