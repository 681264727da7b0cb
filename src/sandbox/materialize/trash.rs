//! Taking deletion off the critical path: a tree to delete is renamed into
//! a trash directory (one system call, and it is gone from view), then
//! deleted by a small pool of background threads. Whatever a crash left in
//! the trash is deleted when the trash is next opened.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::remove::remove_tree_within;
use super::Error;
use crate::background::Background;

/// A tree to delete, with what to free once it is gone.
type Job = (PathBuf, Option<Box<dyn Send>>);

pub struct Trash {
    dir: PathBuf,
    deleting: Background<Job>,
    next: AtomicU64,
}

impl Trash {
    /// Opens (creating) trash directory `dir`, on the same file system as
    /// the trees it will take, with `threads` deleting threads, and queues
    /// whatever is already in it.
    pub fn open(dir: &Path, threads: usize) -> Result<Trash, Error> {
        std::fs::create_dir_all(dir).map_err(|e| Error::new("mkdir", dir, e))?;
        let within = dir.to_owned();
        let deleting = Background::start("trash", threads, move || {
            let within = within.clone();
            move |(path, along): Job| {
                if let Err(err) = remove_tree_within(&within, &path) {
                    log::warn!("cannot empty trash entry: {err}");
                }
                drop(along);
            }
        })
        .map_err(|e| Error::new("pthread_create", dir, e))?;
        let trash = Trash {
            dir: dir.to_owned(),
            deleting,
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
        // Taken until the trash is dropped, which finishes what is queued.
        if let Err((path, _)) = self.deleting.send(job) {
            log::warn!("trash {:?} is closed: {path:?} is left", self.dir);
        }
    }

    /// Waits until everything queued so far has been deleted.
    pub fn wait_idle(&self) {
        self.deleting.wait_idle();
    }
}
