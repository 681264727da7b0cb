//! Work done beside the actions, as Bazel does it off the action's path:
//! a background thread that runs jobs in order ([`Background`]), and
//! Bazel's asynchronous tree deleter on top of it ([`TreeDeleter`]).
//!
//! `AsynchronousTreeDeleter.java` (bazelbuild/bazel 27f837e1): a tree is
//! renamed into `<base>/_moved_trash_dir/<n>` in the caller (so the path is
//! free at once), and deleted later by a background thread. Bazel 7's
//! `--experimental_sandbox_async_tree_delete_idle_threads=4` gives it more
//! threads only once the build is idle; during the build it has one, as
//! here. Java's thread priorities are ignored on Linux by default
//! (HotSpot's `ThreadPriorityPolicy=0`), so the thread is not niced.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::run::{make_dir, remove};
use super::Error;

type Job = Box<dyn FnOnce() -> Result<(), Error> + Send>;

/// One background thread running jobs in order (the daemon's
/// [`crate::background::Background`]), keeping what failed;
/// [`Background::finish`] waits for all of them and says what failed.
pub struct Background {
    jobs: crate::background::Background<Job>,
    errors: Arc<Mutex<Vec<Error>>>,
}

impl Background {
    pub fn start(name: &str) -> Result<Background, Error> {
        let errors = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::clone(&errors);
        let jobs = crate::background::Background::start(name, 1, move || {
            let failed = Arc::clone(&failed);
            move |job: Job| {
                if let Err(why) = job() {
                    failed.lock().push(why);
                }
            }
        })
        .map_err(|source| Error::Thread {
            name: name.to_owned(),
            source,
        })?;
        Ok(Background { jobs, errors })
    }

    /// Queues `job`; after [`Background::finish`], runs it here instead.
    pub fn submit(&self, job: Job) -> Result<(), Error> {
        match self.jobs.send(job) {
            Ok(()) => Ok(()),
            Err(job) => job(),
        }
    }

    /// Waits for every queued job; Err naming the first failures.
    pub fn finish(&self) -> Result<(), Error> {
        self.jobs.stop();
        let mut errors = self.errors.lock();
        let failed = errors.len();
        if failed == 0 {
            return Ok(());
        }
        Err(Error::Background {
            failed,
            first: Box::new(errors.swap_remove(0)),
        })
    }
}

/// Bazel's `AsynchronousTreeDeleter`.
pub struct TreeDeleter {
    trash: PathBuf,
    next: AtomicUsize,
    deleted: Arc<AtomicUsize>,
    worker: Background,
}

impl TreeDeleter {
    /// Trees go to `<base>/_moved_trash_dir`, made here.
    pub fn start(base: &Path) -> Result<TreeDeleter, Error> {
        let trash = base.join("_moved_trash_dir");
        make_dir(&trash)?;
        Ok(TreeDeleter {
            trash,
            next: AtomicUsize::new(0),
            deleted: Arc::new(AtomicUsize::new(0)),
            worker: Background::start("tree-deleter")?,
        })
    }

    /// Moves `path` out of the way now and deletes it in the background;
    /// nothing there is fine (Bazel ignores a missing tree too).
    pub fn delete_tree(&self, path: &Path) -> Result<(), Error> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let moved = self.trash.join(n.to_string());
        match fs::rename(path, &moved) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(err) => {
                return Err(Error::ToTrash {
                    from: path.to_owned(),
                    to: moved,
                    source: err,
                })
            }
        }
        let deleted = Arc::clone(&self.deleted);
        self.worker.submit(Box::new(move || {
            remove(&moved)?;
            deleted.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }))
    }

    /// Waits for every deletion; how many trees were deleted in all.
    pub fn finish(&self) -> Result<usize, Error> {
        self.worker.finish()?;
        Ok(self.deleted.load(Ordering::Relaxed))
    }

    pub fn trash(&self) -> &Path {
        &self.trash
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trees_leave_their_path_at_once_and_are_gone_after_finish() {
        let dir = tempfile::tempdir().unwrap();
        let deleter = TreeDeleter::start(dir.path()).unwrap();
        let tree = dir.path().join("tree");
        make_dir(&tree.join("a/b")).unwrap();
        fs::write(tree.join("a/b/f"), "x").unwrap();
        deleter.delete_tree(&tree).unwrap();
        assert!(!tree.exists());
        deleter.delete_tree(&dir.path().join("missing")).unwrap();
        assert_eq!(deleter.finish().unwrap(), 1);
        assert_eq!(fs::read_dir(deleter.trash()).unwrap().count(), 0);
        // After finish, jobs run in the caller.
        make_dir(&tree).unwrap();
        deleter.delete_tree(&tree).unwrap();
        assert_eq!(deleter.finish().unwrap(), 2);
        assert_eq!(fs::read_dir(deleter.trash()).unwrap().count(), 0);
    }
}
