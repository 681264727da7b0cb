//! Work taken off a request's path: threads that take jobs from a queue,
//! and a way to wait until every job sent so far is done. The daemon's
//! trash (deleting trees), `serve`'s departures (what is left of a
//! Destroy after its answer) and its background captures are each one of
//! these, with what they do to a job their own.

use std::io;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

pub struct Background<J> {
    /// `None` once stopped.
    queue: Mutex<Option<Sender<J>>>,
    pending: Arc<Pending>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// Jobs sent and not yet done.
#[derive(Default)]
struct Pending {
    count: Mutex<usize>,
    idle: Condvar,
}

impl Pending {
    fn done(&self) {
        let mut count = self.count.lock();
        *count -= 1;
        if *count == 0 {
            self.idle.notify_all();
        }
    }
}

impl<J: Send + 'static> Background<J> {
    /// Starts `threads` threads (at least one) named `name-N`. Each calls
    /// `each_thread` once as it starts, for what it does to a job (and to
    /// set itself up: a priority, say); one thread does the jobs in the
    /// order sent, more take them as they free up.
    pub fn start<W>(
        name: &str,
        threads: usize,
        each_thread: impl Fn() -> W + Send + Sync + 'static,
    ) -> io::Result<Background<J>>
    where
        W: FnMut(J),
    {
        let (queue, jobs) = channel::<J>();
        let jobs = Arc::new(Mutex::new(jobs));
        let pending = Arc::new(Pending::default());
        let each_thread = Arc::new(each_thread);
        let background = Background {
            queue: Mutex::new(Some(queue)),
            pending: pending.clone(),
            threads: Mutex::default(),
        };
        for n in 0..threads.max(1) {
            let (jobs, pending, each_thread) = (jobs.clone(), pending.clone(), each_thread.clone());
            let thread = std::thread::Builder::new()
                .name(format!("{name}-{n}"))
                .spawn(move || take_jobs(&jobs, &pending, each_thread()));
            match thread {
                Ok(thread) => background.threads.lock().push(thread),
                // The threads started end once the queue is dropped.
                Err(err) => return Err(err),
            }
        }
        Ok(background)
    }

    /// Queues `job`; gives it back if no thread takes jobs any more.
    pub fn send(&self, job: J) -> Result<(), J> {
        let queue = self.queue.lock();
        let Some(queue) = queue.as_ref() else {
            return Err(job);
        };
        *self.pending.count.lock() += 1;
        queue.send(job).map_err(|back| {
            self.pending.done();
            back.0
        })
    }
}

impl<J> Background<J> {
    /// Waits until every job sent so far is done.
    pub fn wait_idle(&self) {
        let mut count = self.pending.count.lock();
        while *count > 0 {
            self.pending.idle.wait(&mut count);
        }
    }

    /// Takes no more jobs, and waits for the threads to do those queued
    /// and end (but for the calling thread, if it is one of them: what
    /// a job drops may hold the last reference to its own workers).
    pub fn stop(&self) {
        drop(self.queue.lock().take());
        let me = std::thread::current().id();
        for thread in self.threads.lock().drain(..) {
            if thread.thread().id() != me {
                let _ = thread.join();
            }
        }
    }
}

impl<J> Drop for Background<J> {
    fn drop(&mut self) {
        self.stop();
    }
}

fn take_jobs<J>(jobs: &Mutex<Receiver<J>>, pending: &Pending, mut work: impl FnMut(J)) {
    loop {
        // The lock is let go before the job is done, for the other threads.
        let next = jobs.lock().recv();
        let Ok(job) = next else { return };
        work(job);
        pending.done();
    }
}

/// This thread yields the CPU to everything else (nice 19): for work done
/// ahead for later requests while the build's actions run beside it.
pub fn lowest_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on this thread's own id has no memory effects.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn one_thread_does_the_jobs_in_order_and_waits_see_them_done() {
        let done = Arc::new(Mutex::new(Vec::new()));
        let started = Arc::new(AtomicUsize::new(0));
        let (seen, count) = (done.clone(), started.clone());
        let background = Background::start("test", 1, move || {
            count.fetch_add(1, Ordering::SeqCst);
            let seen = seen.clone();
            move |n: u32| {
                std::thread::sleep(std::time::Duration::from_millis(1));
                seen.lock().push(n);
            }
        })
        .unwrap();
        for n in 0..20 {
            background.send(n).unwrap();
        }
        background.wait_idle();
        assert_eq!(*done.lock(), (0..20).collect::<Vec<_>>());
        assert_eq!(started.load(Ordering::SeqCst), 1, "set up once a thread");
        background.stop();
        assert_eq!(background.send(99), Err(99), "stopped: given back");
        background.wait_idle();
    }

    #[test]
    fn a_stop_finishes_what_was_queued_with_every_thread() {
        let done = Arc::new(AtomicUsize::new(0));
        let count = done.clone();
        let background = Background::start("test", 3, move || {
            let count = count.clone();
            move |_: ()| {
                std::thread::sleep(std::time::Duration::from_millis(2));
                count.fetch_add(1, Ordering::SeqCst);
            }
        })
        .unwrap();
        for _ in 0..30 {
            background.send(()).unwrap();
        }
        background.stop();
        assert_eq!(done.load(Ordering::SeqCst), 30);
    }
}
