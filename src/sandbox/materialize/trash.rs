//! Taking deletion off the critical path: a tree to delete is renamed into
//! a trash directory (one system call, and it is gone from view), then
//! deleted by a small pool of background threads. Whatever a crash left in
//! the trash is deleted when the trash is next opened.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use std::thread::JoinHandle;

use super::remove::remove_tree_within;
use super::Error;

/// Trees waiting to be deleted, and a way to wait until there are none.
#[derive(Default)]
struct Pending {
    count: Mutex<usize>,
    idle: Condvar,
}

/// A tree to delete, with what to free once it is gone.
type Job = (PathBuf, Option<Box<dyn Send>>);

pub struct Trash {
    dir: PathBuf,
    queue: Mutex<Option<Sender<Job>>>,
    pending: Arc<Pending>,
    workers: Vec<JoinHandle<()>>,
    next: AtomicU64,
}

impl Trash {
    /// Opens (creating) trash directory `dir`, on the same file system as
    /// the trees it will take, with `threads` deleting threads, and queues
    /// whatever is already in it.
    pub fn open(dir: &Path, threads: usize) -> Result<Trash, Error> {
        std::fs::create_dir_all(dir).map_err(|e| Error::new("mkdir", dir, e))?;
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let pending = Arc::new(Pending::default());
        let workers = (0..threads.max(1))
            .map(|n| {
                let (rx, pending, dir) = (rx.clone(), pending.clone(), dir.to_owned());
                std::thread::Builder::new()
                    .name(format!("trash-{n}"))
                    .spawn(move || delete_queued(&dir, &rx, &pending))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::new("pthread_create", dir, e))?;
        let trash = Trash {
            dir: dir.to_owned(),
            queue: Mutex::new(Some(tx)),
            pending,
            workers,
            next: AtomicU64::new(0),
        };
        let leftovers = std::fs::read_dir(dir).map_err(|e| Error::new("opendir", dir, e))?;
        for entry in leftovers {
            let entry = entry.map_err(|e| Error::new("readdir", dir, e))?;
            trash.enqueue((entry.path(), None));
        }
        Ok(trash)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Moves `path` into the trash and queues it for deletion. When this
    /// returns, `path` no longer exists. Falls back to deleting in place
    /// when the rename crosses file systems.
    pub fn discard(&self, path: &Path) -> Result<(), Error> {
        self.discard_along(path, None)
    }

    /// Like [`Trash::discard`]; `along` (what describes the tree, large
    /// when the tree is) is freed by the deleting thread too.
    pub fn discard_along(&self, path: &Path, along: Option<Box<dyn Send>>) -> Result<(), Error> {
        let unique = format!(
            "{}-{}",
            std::process::id(),
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let target = self.dir.join(unique);
        match std::fs::rename(path, &target) {
            Ok(()) => {
                self.enqueue((target, along));
                Ok(())
            }
            Err(err) if err.raw_os_error() == Some(libc::EXDEV) => {
                super::remove::remove_tree(path).map(drop)
            }
            Err(err) => Err(Error::new("rename", path, err)),
        }
    }

    fn enqueue(&self, job: Job) {
        *self.pending.count.lock() += 1;
        if let Some(queue) = self.queue.lock().as_ref() {
            let _ = queue.send(job);
        }
    }

    /// Waits until everything queued so far has been deleted.
    pub fn wait_idle(&self) {
        let mut count = self.pending.count.lock();
        while *count > 0 {
            self.pending.idle.wait(&mut count);
        }
    }
}

impl Drop for Trash {
    /// Finishes the queued deletions before returning.
    fn drop(&mut self) {
        self.queue.lock().take();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

fn delete_queued(dir: &Path, queue: &Mutex<Receiver<Job>>, pending: &Pending) {
    loop {
        let next = queue.lock().recv();
        let Ok((path, along)) = next else { return };
        if let Err(err) = remove_tree_within(dir, &path) {
            log::warn!("cannot empty trash entry: {err}");
        }
        drop(along);
        let mut count = pending.count.lock();
        *count -= 1;
        if *count == 0 {
            pending.idle.notify_all();
        }
    }
}
