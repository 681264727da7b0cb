//! Destroyed sandboxes leave off the Destroy's answer.
//!
//! The answer waits until the sandbox is gone from view and its id is
//! free (a rename or unlink); stashing a native sandbox's inputs for the
//! next build, and sending its tree and scratch directory to the trash,
//! take a few hundred microseconds more and run here, on one thread, in
//! the order the Destroys came. A Create of an id still leaving waits for
//! it; so does the end of the session.

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::background::Background;

/// What is left of destroying a sandbox, given its id.
type Work = Box<dyn FnOnce(&str) + Send>;

pub struct Departures {
    /// `None` if the thread could not be started.
    thread: Option<Background<(String, Work)>>,
    leaving: Arc<Leaving>,
}

/// The ids whose departure is queued or running.
#[derive(Default)]
struct Leaving {
    ids: Mutex<HashSet<String>>,
    changed: Condvar,
}

impl Leaving {
    fn done(&self, id: &str) {
        self.ids.lock().remove(id);
        self.changed.notify_all();
    }
}

impl Departures {
    /// Starts the departures thread; without one (it cannot be started),
    /// each departure runs in its Destroy, as before.
    pub fn start() -> Departures {
        let leaving = Arc::new(Leaving::default());
        let done = leaving.clone();
        let started = Background::start("departures", 1, move || {
            let done = done.clone();
            move |(id, work): (String, Work)| {
                work(&id);
                done.done(&id);
            }
        });
        let thread = match started {
            Ok(thread) => Some(thread),
            Err(err) => {
                log::warn!("cannot start the departures thread ({err}); destroys finish inline");
                None
            }
        };
        Departures { thread, leaving }
    }

    /// Runs `work`, what is left of destroying sandbox `id`, on the
    /// departures thread (inline if there is none).
    pub fn send(&self, id: &str, work: Work) {
        self.leaving.ids.lock().insert(id.to_owned());
        let unsent = match &self.thread {
            Some(thread) => thread.send((id.to_owned(), work)).err().map(|back| back.1),
            None => Some(work),
        };
        if let Some(work) = unsent {
            work(id);
            self.leaving.done(id);
        }
    }

    /// Waits until sandbox `id` has finished leaving (its scratch
    /// directory and tree are out of the way of a new one of that id).
    pub fn wait_for(&self, id: &str) {
        let mut ids = self.leaving.ids.lock();
        while ids.contains(id) {
            self.leaving.changed.wait(&mut ids);
        }
    }

    /// Waits until every departure queued so far is done.
    pub fn wait_idle(&self) {
        let mut ids = self.leaving.ids.lock();
        while !ids.is_empty() {
            self.leaving.changed.wait(&mut ids);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn a_departure_runs_off_the_caller_and_waits_are_kept() {
        let departures = Departures::start();
        let ran = Arc::new(AtomicUsize::new(0));
        let (release, blocked) = channel::<()>();
        let given = Arc::new(Mutex::new(Vec::new()));
        let (counted, seen) = (ran.clone(), given.clone());
        departures.send(
            "a",
            Box::new(move |id| {
                blocked.recv().unwrap();
                seen.lock().push(id.to_owned());
                counted.fetch_add(1, Ordering::SeqCst);
            }),
        );
        // The send returned while the work is blocked: it runs elsewhere.
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        let (counted, seen) = (ran.clone(), given.clone());
        departures.send(
            "b",
            Box::new(move |id| {
                seen.lock().push(id.to_owned());
                counted.fetch_add(10, Ordering::SeqCst);
            }),
        );
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| {
                departures.wait_for("a");
                ran.load(Ordering::SeqCst)
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(!waiter.is_finished(), "wait_for(a) returned before a ran");
            release.send(()).unwrap();
            assert!(waiter.join().unwrap() >= 1);
        });
        departures.wait_idle();
        assert_eq!(ran.load(Ordering::SeqCst), 11, "both ran, once");
        assert_eq!(*given.lock(), ["a", "b"], "each given its id, in order");
        // An id never sent does not wait.
        departures.wait_for("c");
    }
}
