//! Looks at default places handed from one backend to the next
//! (`--keep_state=on`). A look remembered is void once no backend
//! watches, so what is handed on is only where looks found files: the
//! next backend looks at each again on a thread of its own as it starts,
//! so that the Creates of the next build find them remembered, as a warm
//! backend's would, rather than each making its first looks.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::daemon::stop::LOG;
use crate::sandbox::default_place::Found;

use super::service::Service;

/// Looking again at what a predecessor found, until stopped.
pub struct LookingAgain {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl LookingAgain {
    /// Looks again, on a thread of its own, at the looks handed on in
    /// `file` (read there, not before Negotiate is answered, and removed:
    /// a successor gets this backend's own); `None` if there are none.
    pub fn start(service: &Arc<Service>, file: &Path, workspace: &Path) -> Option<LookingAgain> {
        if !file.exists() {
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (service, stopping) = (service.clone(), stop.clone());
        let (file, workspace) = (file.to_owned(), workspace.to_owned());
        let thread = std::thread::Builder::new()
            .name("looks-again".into())
            .spawn(move || {
                // Ahead of the Creates that would look anyway; beside the
                // build's first actions (measured on mixed and stress, 4
                // rounds: setup alike at nice 0 and nice 19).
                crate::background::lowest_priority();
                let found = Found::read(&file);
                if let Err(err) = std::fs::remove_file(&file) {
                    log::warn!("cannot remove {file:?}: {err}");
                }
                let found = match found {
                    Ok(found) => found,
                    Err(why) => {
                        log::warn!("looks handed on are not looked at again: {why}");
                        return;
                    }
                };
                if found.workspace != workspace {
                    // Another output base's: its directories would take
                    // watches this workspace's need.
                    log::info!(
                        target: LOG,
                        "looks handed on are of another workspace ({:?}): not looked at again",
                        found.workspace
                    );
                    return;
                }
                let began = Instant::now();
                let here = service.looks().look_again(&found, &stopping);
                log::info!(
                    target: LOG,
                    "looked again at {} files in {} directories a previous backend found: {here} \
                     still there, in {:.1} ms",
                    found.files(),
                    found.dirs.len(),
                    began.elapsed().as_secs_f64() * 1e3
                );
            });
        match thread {
            Ok(thread) => Some(LookingAgain { stop, thread }),
            Err(err) => {
                log::warn!("looks handed on are not looked at again: spawn: {err}");
                None
            }
        }
    }

    /// Stops looking, and waits for the look under way.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// Hands the looks `service` remembers on in `file`, for the next backend
/// of `workspace`.
pub fn hand_on(service: &Service, file: &Path, workspace: &Path) {
    let found = service.looks().found(workspace);
    if found.dirs.is_empty() {
        return;
    }
    match found.write(file) {
        Ok(()) => log::info!(
            target: LOG,
            "handed on where looks found {} files, in {file:?}",
            found.files()
        ),
        Err(err) => log::warn!("cannot hand looks on in {file:?}: {err}"),
    }
}
