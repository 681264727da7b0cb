//! Anchors: directories pinned when a sandbox is created.
//!
//! A mapping names its underlying object by a path, which the daemon
//! resolves once, at CreateSandbox, following symlinks on the way as the
//! requester meant. What it finds is pinned as an open directory: the
//! mapped directory itself, or the directory holding a mapped file. From
//! then on every operation on the mapping, and on anything found below it,
//! starts from that descriptor and resolves names with
//! [`super::beneath`], so no later change of the tree, above or below, can
//! redirect the daemon.
//!
//! Sandboxes of one build map thousands of inputs from the same few
//! hundred directories, so the descriptors are shared: a directory pinned
//! by a live sandbox is reused by the next one after a `stat` shows that
//! the path still leads to it (the held descriptor keeps its inode number
//! from being reused). Each sandbox holds its own [`Anchor`] on the shared
//! descriptor, which names the sandbox in messages.

use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;

use super::{DirFd, PATH_DIR_FLAGS};

/// An open directory shared by the anchors of every sandbox that pinned it.
#[derive(Debug)]
struct Pinned {
    dir: DirFd,
    path: PathBuf,
    /// (device, inode) of the directory, to recognize it at the next pin.
    id: (u64, u64),
}

/// A directory pinned by a sandbox.
#[derive(Debug)]
pub struct Anchor {
    pinned: Arc<Pinned>,
    /// The sandbox that pinned it, for messages; `None` for `--mapping`s.
    sandbox: Option<Arc<str>>,
}

impl AsFd for Anchor {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.pinned.dir.as_fd()
    }
}

/// Directories pinned by live anchors, by the path they were pinned at.
fn pinned_dirs() -> &'static Mutex<HashMap<PathBuf, Weak<Pinned>>> {
    static PINNED: OnceLock<Mutex<HashMap<PathBuf, Weak<Pinned>>>> = OnceLock::new();
    PINNED.get_or_init(Mutex::default)
}

fn id_of(st: &nix::sys::stat::FileStat) -> (u64, u64) {
    // dev_t and ino_t differ in width between platforms.
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    (st.st_dev as u64, st.st_ino as u64)
}

impl Anchor {
    /// Pins the directory at `path` for `sandbox`, following symlinks in
    /// any component (the path leads to a mapping; it is not inside one).
    /// Reuses the descriptor of a live pin of the same directory.
    pub fn open(path: &Path, sandbox: Option<Arc<str>>) -> io::Result<Anchor> {
        let cached = pinned_dirs().lock().get(path).and_then(Weak::upgrade);
        if let Some(pinned) = cached {
            let now = nix::sys::stat::stat(path)?;
            if id_of(&now) == pinned.id {
                return Ok(Anchor { pinned, sandbox });
            }
        }
        let flags = PATH_DIR_FLAGS.difference(nix::fcntl::OFlag::O_NOFOLLOW);
        let dir = DirFd::open_at_with(nix::fcntl::AT_FDCWD, path.as_os_str(), flags)?;
        Self::remember(dir, path, sandbox)
    }

    /// Pins subdirectory `name` of this anchor's directory, which must be
    /// a directory and not a symlink (a mapped directory found by lstat).
    pub fn child(&self, name: &CStr, path: &Path) -> io::Result<Anchor> {
        let dir = DirFd::open_at_with(self.as_fd(), name, PATH_DIR_FLAGS)?;
        Self::remember(dir, path, self.sandbox.clone())
    }

    fn remember(dir: DirFd, path: &Path, sandbox: Option<Arc<str>>) -> io::Result<Anchor> {
        let id = id_of(&nix::sys::stat::fstat(&dir)?);
        let pinned = Arc::new(Pinned {
            dir,
            path: path.to_owned(),
            id,
        });
        let mut cache = pinned_dirs().lock();
        // Forget pins nobody holds any more, now and then, so that the
        // map stays the size of what live sandboxes use.
        if cache.len() >= 1024 && cache.len().is_power_of_two() {
            cache.retain(|_, pin| pin.strong_count() > 0);
        }
        cache.insert(path.to_owned(), Arc::downgrade(&pinned));
        Ok(Anchor { pinned, sandbox })
    }

    /// Where the directory was when it was pinned.
    pub fn path(&self) -> &Path {
        &self.pinned.path
    }

    pub fn sandbox(&self) -> Option<&str> {
        self.sandbox.as_deref()
    }

    /// Whether both anchors pin the same directory.
    pub fn same_dir(&self, other: &Anchor) -> bool {
        Arc::ptr_eq(&self.pinned, &other.pinned)
    }
}
