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
//!
//! The directory holding mapped files is pinned when it is first used
//! ([`Anchor::deferred`]), not when its sandbox is created: a create then
//! makes no system call for its inputs, and a sandbox pins only the
//! directories its action reaches (a million-input sandbox would otherwise
//! hold tens of thousands of descriptors). From that first use on it stays
//! pinned as above.

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
    /// (device, inode) of the directory, to recognize it at the next pin.
    id: (u64, u64),
}

/// A directory pinned by a sandbox (now, or at its first use).
#[derive(Debug)]
pub struct Anchor {
    /// Where the directory was (is to be) pinned.
    path: PathBuf,
    pinned: OnceLock<Arc<Pinned>>,
    /// The sandbox that pinned it, for messages; `None` for `--mapping`s.
    sandbox: Option<Arc<str>>,
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
        let anchor = Anchor::deferred(path.to_owned(), sandbox);
        anchor.fd()?;
        Ok(anchor)
    }

    /// An anchor for the directory at `path` that is pinned, as by
    /// [`Anchor::open`], at its first [`Anchor::fd`]. Makes no system call.
    pub fn deferred(path: PathBuf, sandbox: Option<Arc<str>>) -> Anchor {
        Anchor {
            path,
            pinned: OnceLock::new(),
            sandbox,
        }
    }

    /// The pinned directory, pinned now if it was deferred. A failure to
    /// pin is not kept: the next call tries again.
    pub fn fd(&self) -> io::Result<BorrowedFd<'_>> {
        if let Some(pinned) = self.pinned.get() {
            return Ok(pinned.dir.as_fd());
        }
        let pinned = pin(&self.path)?;
        // Two first uses at once pin the same directory; one is kept.
        Ok(self.pinned.get_or_init(|| pinned).dir.as_fd())
    }

    /// Whether the directory is pinned already (no system call).
    pub fn is_pinned(&self) -> bool {
        self.pinned.get().is_some()
    }

    /// Pins subdirectory `name` of this anchor's directory, which must be
    /// a directory and not a symlink (a mapped directory found by lstat).
    pub fn child(&self, name: &CStr, path: &Path) -> io::Result<Anchor> {
        let dir = DirFd::open_at_with(self.fd()?, name, PATH_DIR_FLAGS)?;
        Ok(Anchor {
            path: path.to_owned(),
            pinned: OnceLock::from(remember(dir, path)?),
            sandbox: self.sandbox.clone(),
        })
    }

    /// Where the directory was when it was pinned (or is to be).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn sandbox(&self) -> Option<&str> {
        self.sandbox.as_deref()
    }

    /// Whether both anchors pin the same directory; for one not pinned
    /// yet, whether both name the same path.
    pub fn same_dir(&self, other: &Anchor) -> bool {
        match (self.pinned.get(), other.pinned.get()) {
            // Pins of one directory made apart (`child` pins anew) are
            // the same directory: an open descriptor keeps its inode.
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a.id == b.id,
            _ => self.path == other.path,
        }
    }
}

/// Pins the directory at `path`, following symlinks in any component;
/// reuses the descriptor of a live pin of the same directory.
fn pin(path: &Path) -> io::Result<Arc<Pinned>> {
    let cached = pinned_dirs().lock().get(path).and_then(Weak::upgrade);
    if let Some(pinned) = cached {
        let now = nix::sys::stat::stat(path)?;
        if id_of(&now) == pinned.id {
            return Ok(pinned);
        }
    }
    let flags = PATH_DIR_FLAGS.difference(nix::fcntl::OFlag::O_NOFOLLOW);
    let dir = DirFd::open_at_with(nix::fcntl::AT_FDCWD, path.as_os_str(), flags)?;
    remember(dir, path)
}

fn remember(dir: DirFd, path: &Path) -> io::Result<Arc<Pinned>> {
    let id = id_of(&nix::sys::stat::fstat(&dir)?);
    let pinned = Arc::new(Pinned { dir, id });
    let mut cache = pinned_dirs().lock();
    // Forget pins nobody holds any more, now and then, so that the map
    // stays the size of what live sandboxes use.
    if cache.len() >= 1024 && cache.len().is_power_of_two() {
        cache.retain(|_, pin| pin.strong_count() > 0);
    }
    cache.insert(path.to_owned(), Arc::downgrade(&pinned));
    Ok(pinned)
}
