//! Changing the tree: creating, removing and renaming entries of writable
//! directories, and changing attributes of writable nodes.
//!
//! Every change goes straight to the underlying object, so whatever an
//! action writes is on disk when its system call returns. Read-only nodes,
//! virtual directories and names fixed by mappings answer EPERM.

use std::ffi::{OsStr, OsString};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::attr::{Attr, FileKind};
use super::errno::{Errno, FsResult};
use super::io::Opened;
use super::name::Name;
use super::node::{Node, Origin};
use super::{c_path, SandboxFs};
use crate::sys::check;

/// A new access or modification time.
#[derive(Clone, Copy, Debug)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

/// The attributes a `setattr` changes; `None` leaves one as it is.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    /// An open handle to apply the change through, if the kernel gave one.
    pub fh: Option<u64>,
}

impl SandboxFs {
    /// The directory node and underlying path where entry `name` of `parent`
    /// may be created, removed or renamed.
    fn mutable_entry(&self, parent: u64, name: &OsStr) -> FsResult<(Arc<Node>, PathBuf)> {
        let node = self.node(parent)?;
        let dir = node.dir()?;
        if !node.is_writable() || dir.has_explicit(name) {
            return Err(Errno::EPERM);
        }
        let path = super::namespace::backing_dir(&node)?.ok_or(Errno::EPERM)?;
        Ok((node, path.join(name)))
    }

    /// Records a new underlying entry as a discovered child of `parent` and
    /// counts the kernel's lookup of it.
    fn adopt(&self, parent: &Arc<Node>, name: &OsStr, attr_source: &std::fs::Metadata) -> Attr {
        let node = Arc::new(Node::new(
            FileKind::from_std(attr_source.file_type()),
            parent.is_writable(),
            Origin::Child {
                parent: Arc::downgrade(parent),
                name: Name::new(name),
            },
        ));
        if let Ok(dir) = parent.dir() {
            dir.discovered()
                .lock()
                .insert(name.to_owned(), node.clone());
        }
        let ino = self.inodes.remember(&node);
        Attr::from_metadata(ino, attr_source)
    }

    /// Adopts the entry just made at `path` (lstat for its attributes).
    fn adopt_made(&self, parent: &Arc<Node>, name: &OsStr, path: &Path) -> FsResult<Attr> {
        Ok(self.adopt(parent, name, &std::fs::symlink_metadata(path)?))
    }

    /// Removes entry `name` of `parent` (a directory with rmdir(2), else
    /// unlink(2)) and drops its node from the parent's cache.
    fn remove_entry(&self, parent: u64, name: &OsStr, is_dir: bool) -> FsResult<()> {
        let (dir, path) = self.mutable_entry(parent, name)?;
        let c = c_path(&path)?;
        // SAFETY: valid C string.
        check(unsafe {
            if is_dir {
                libc::rmdir(c.as_ptr())
            } else {
                libc::unlink(c.as_ptr())
            }
        })?;
        if let Ok(dir) = dir.dir() {
            dir.discovered().lock().remove(name);
        }
        Ok(())
    }

    pub fn mkdir(&self, parent: u64, name: &OsStr, mode: u32) -> FsResult<Attr> {
        let (dir, path) = self.mutable_entry(parent, name)?;
        let c = c_path(&path)?;
        // SAFETY: valid C string.
        check(unsafe { libc::mkdir(c.as_ptr(), mode as libc::mode_t) })?;
        self.adopt_made(&dir, name, &path)
    }

    pub fn mknod(&self, parent: u64, name: &OsStr, mode: u32, rdev: u32) -> FsResult<Attr> {
        let (dir, path) = self.mutable_entry(parent, name)?;
        let c = c_path(&path)?;
        // SAFETY: valid C string.
        check(unsafe { libc::mknod(c.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) })?;
        self.adopt_made(&dir, name, &path)
    }

    pub fn symlink(&self, parent: u64, name: &OsStr, target: &Path) -> FsResult<Attr> {
        let (dir, path) = self.mutable_entry(parent, name)?;
        std::os::unix::fs::symlink(target, &path)?;
        self.adopt_made(&dir, name, &path)
    }

    /// Creates and opens a file. Returns its attributes and handle.
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> FsResult<(Attr, Opened)> {
        let (dir, path) = self.mutable_entry(parent, name)?;
        let file = super::io::open_underlying(&path, flags | libc::O_CREAT, mode)?;
        let attr = self.adopt(&dir, name, &file.metadata()?);
        let opened = self.register_created(file, flags)?;
        Ok((attr, opened))
    }

    /// Hard-links `ino` as `newname` in `newparent`. The source must be
    /// writable: a link to a read-only input would let the action change it.
    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> FsResult<Attr> {
        let source = self.node(ino)?;
        if !source.is_writable() {
            return Err(Errno::EPERM);
        }
        let source_path = source.require_path()?;
        let (dir, path) = self.mutable_entry(newparent, newname)?;
        // linkat without AT_SYMLINK_FOLLOW: links the symlink itself.
        std::fs::hard_link(&source_path, &path)?;
        self.adopt_made(&dir, newname, &path)
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.remove_entry(parent, name, false)
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.remove_entry(parent, name, true)
    }

    /// Renames within one writable mapping; across mappings answers EXDEV,
    /// as rename(2) does across file systems, so tools fall back to a copy.
    /// `flags` are renameat2(2) flags.
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        let (from_dir, from) = self.mutable_entry(parent, name)?;
        let (to_dir, to) = self.mutable_entry(newparent, newname)?;
        if from_dir.mapping_root() != to_dir.mapping_root() {
            return Err(Errno::EXDEV);
        }
        let (from_c, to_c) = (c_path(&from)?, c_path(&to)?);
        crate::sys::rename(&from_c, &to_c, flags)?;
        let exchange = crate::sys::is_exchange(flags);
        move_discovered(&from_dir, name, &to_dir, newname, exchange);
        Ok(())
    }

    /// Changes attributes of a writable node and returns the new ones.
    pub fn setattr(&self, ino: u64, change: &SetAttr) -> FsResult<Attr> {
        let node = self.node(ino)?;
        if !node.is_writable() {
            return Err(Errno::EPERM);
        }
        let open = change.fh.and_then(|fh| self.files.get(fh));
        let path = node.require_path()?;
        let c = c_path(&path)?;
        if let Some(mode) = change.mode {
            // chmod(2) follows symlinks, which could reach outside the view.
            if node.kind() == FileKind::Symlink {
                return Err(Errno(libc::EOPNOTSUPP));
            }
            // SAFETY: valid fd or C string.
            check(unsafe {
                match &open {
                    Some(f) => libc::fchmod(f.file.as_raw_fd(), mode as libc::mode_t),
                    None => libc::chmod(c.as_ptr(), mode as libc::mode_t),
                }
            })?;
        }
        if change.uid.is_some() || change.gid.is_some() {
            let uid = change.uid.unwrap_or(u32::MAX);
            let gid = change.gid.unwrap_or(u32::MAX);
            // SAFETY: valid C string; -1 leaves an id unchanged.
            check(unsafe { libc::lchown(c.as_ptr(), uid, gid) })?;
        }
        if let Some(size) = change.size {
            match &open {
                Some(f) => f.file.set_len(size)?,
                None if node.kind() == FileKind::RegularFile => {
                    // SAFETY: valid C string; a regular file cannot redirect.
                    check(unsafe { libc::truncate(c.as_ptr(), size as libc::off_t) })?;
                }
                None if node.is_dir() => return Err(Errno(libc::EISDIR)),
                None => return Err(Errno::EINVAL),
            }
        }
        if change.atime.is_some() || change.mtime.is_some() {
            let times = [timespec(change.atime), timespec(change.mtime)];
            // SAFETY: valid C string and a two-element timespec array.
            check(unsafe {
                libc::utimensat(
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    times.as_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            })?;
        }
        match &open {
            Some(f) => Ok(Attr::from_metadata(ino, &f.file.metadata()?)),
            None => self.attr_of(&node, ino),
        }
    }
}

fn timespec(time: Option<SetTime>) -> libc::timespec {
    let (tv_sec, tv_nsec) = match time {
        None => (0, libc::UTIME_OMIT),
        Some(SetTime::Now) => (0, libc::UTIME_NOW),
        Some(SetTime::At(at)) => match at.duration_since(UNIX_EPOCH) {
            Ok(d) => (
                d.as_secs() as libc::time_t,
                d.subsec_nanos() as libc::c_long,
            ),
            Err(before) => (-(before.duration().as_secs() as libc::time_t), 0),
        },
    };
    libc::timespec { tv_sec, tv_nsec }
}

/// Moves the discovered node `name` of `from` to `newname` of `to` after a
/// rename (swapping with the target on exchange), keeping its inode.
///
/// The kernel holds both parents' directory locks for the whole rename, so
/// no lookup in either can run meanwhile; each map is locked on its own.
fn move_discovered(
    from: &Arc<Node>,
    name: &OsStr,
    to: &Arc<Node>,
    newname: &OsStr,
    exchange: bool,
) {
    let (Ok(from_dir), Ok(to_dir)) = (from.dir(), to.dir()) else {
        return;
    };
    let moved = from_dir.discovered().lock().remove(name);
    let displaced = to_dir.discovered().lock().remove(newname);
    let put = |node: Arc<Node>, parent: &Arc<Node>, name: &OsStr| {
        node.set_origin(Origin::Child {
            parent: Arc::downgrade(parent),
            name: Name::new(name),
        });
        if let Ok(dir) = parent.dir() {
            dir.discovered().lock().insert(OsString::from(name), node);
        }
    };
    if let Some(node) = moved {
        put(node, to, newname);
    }
    if let (true, Some(node)) = (exchange, displaced) {
        put(node, from, name);
    }
}
