//! Changing the tree: creating, removing and renaming entries of writable
//! directories, and changing attributes of writable nodes.
//!
//! Every change goes straight to the underlying object, so whatever an
//! action writes is on disk when its system call returns. Read-only nodes,
//! virtual directories and names fixed by mappings answer EPERM. Every
//! call is relative to the directory resolved beneath the mapping's anchor
//! and never follows a symlink (see `underlying`). New objects belong to
//! the caller when the daemon runs as root ([`crate::sys::as_caller`]).

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FchmodatFlags, Mode, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags};

use super::attr::{file_id, fingerprint};
use super::attr::{Attr, FileKind};
use super::error::{Errno, FsError, FsResult};
use super::held::HeldFd;
use super::io::Opened;
use super::name::Name;
use super::namespace::{backing_dir, require_object};
use super::node::{Node, Origin};
use super::underlying::{self, UDir, UObj};
use super::SandboxFs;
use crate::sandbox::dirfd::kind_of;
use crate::sys::{as_caller, Caller};

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
    /// The directory node and underlying directory where entry `name` of
    /// `parent` may be created, removed or renamed.
    fn mutable_dir(&self, parent: u64, name: &OsStr) -> FsResult<(Arc<Node>, UDir)> {
        let node = self.node(parent)?;
        let dir = node.dir()?;
        if !node.is_writable() || dir.has_explicit(name) {
            return Err(Errno::EPERM.into());
        }
        let backing = backing_dir(&node)?.ok_or(FsError::refused(Errno::EPERM))?;
        Ok((node, backing))
    }

    /// Records a new underlying entry as a discovered child of `parent` and
    /// counts the kernel's lookup of it.
    fn adopt(&self, parent: &Arc<Node>, name: &OsStr, st: &nix::sys::stat::FileStat) -> Attr {
        let node = Arc::new(Node::new(
            kind_of(st),
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
        self.inodes.shown_object(ino, fingerprint(st), file_id(st));
        Attr::from_stat(ino, st)
    }

    /// Adopts entry `name` just made in `dir` (lstat for its attributes).
    fn adopt_made(&self, parent: &Arc<Node>, dir: &UDir, name: &OsStr) -> FsResult<Attr> {
        Ok(self.adopt(parent, name, &dir.stat_entry(name)?))
    }

    /// Keeps a descriptor of entry `name` of `parent` before it goes, if
    /// the kernel may hold it open unbeknownst to us (see
    /// `SandboxFs::pin_before_removal`).
    fn pin_entry(&self, parent: &Node, dir: &UDir, name: &OsStr) {
        let known = parent
            .dir()
            .ok()
            .and_then(|d| d.discovered().lock().get(name).cloned());
        // Only what can be opened without side effects: not a FIFO, a
        // device or a symlink.
        let Some(child) =
            known.filter(|c| matches!(c.kind(), FileKind::RegularFile | FileKind::Directory))
        else {
            return;
        };
        let mut flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        if child.is_dir() {
            flags |= OFlag::O_DIRECTORY;
        }
        self.pin_before_removal(&child, || {
            dir.at("openat", name, |fd, c| {
                nix::fcntl::openat(fd, c, flags, Mode::empty())
            })
            .ok()
            .map(std::fs::File::from)
        });
    }

    /// Removes entry `name` of `parent` (a directory with rmdir(2), else
    /// unlink(2)) and drops its node from the parent's cache.
    fn remove_entry(&self, parent: u64, name: &OsStr, is_dir: bool) -> FsResult<()> {
        let (node, dir) = self.mutable_dir(parent, name)?;
        self.pin_entry(&node, &dir, name);
        let (syscall, flags) = if is_dir {
            ("unlinkat(AT_REMOVEDIR)", UnlinkatFlags::RemoveDir)
        } else {
            ("unlinkat", UnlinkatFlags::NoRemoveDir)
        };
        dir.at(syscall, name, |fd, c| nix::unistd::unlinkat(fd, c, flags))?;
        if let Ok(dir) = node.dir() {
            dir.discovered().lock().remove(name);
        }
        Ok(())
    }

    pub fn mkdir(&self, parent: u64, name: &OsStr, mode: u32, caller: Caller) -> FsResult<Attr> {
        let (node, dir) = self.mutable_dir(parent, name)?;
        let mode = Mode::from_bits_truncate(mode as _);
        as_caller(caller, || {
            dir.at("mkdirat", name, |fd, c| {
                nix::sys::stat::mkdirat(fd, c, mode)
            })
        })?;
        self.adopt_made(&node, &dir, name)
    }

    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> FsResult<Attr> {
        let (node, dir) = self.mutable_dir(parent, name)?;
        as_caller(caller, || {
            dir.at("mknodat", name, |fd, c| {
                crate::sys::mknod_at(fd, c, mode, rdev)
            })
        })?;
        self.adopt_made(&node, &dir, name)
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &Path,
        caller: Caller,
    ) -> FsResult<Attr> {
        let (node, dir) = self.mutable_dir(parent, name)?;
        as_caller(caller, || {
            dir.at("symlinkat", name, |fd, c| {
                nix::unistd::symlinkat(target, fd, c)
            })
        })?;
        self.adopt_made(&node, &dir, name)
    }

    /// Creates and opens a file. Returns its attributes and handle.
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> FsResult<(Attr, Opened)> {
        let (node, dir) = self.mutable_dir(parent, name)?;
        let flags = OFlag::from_bits_truncate(flags & super::io::PASSED_FLAGS);
        let file = as_caller(caller, || dir.create_file(name, flags, mode))?;
        let st = nix::sys::stat::fstat(&file).map_err(|e| FsError::call("fstat", e))?;
        let attr = self.adopt(&node, name, &st);
        let opened = self.register_created(attr.ino, file, flags.bits(), &st);
        Ok((attr, opened))
    }

    /// Hard-links `ino` as `newname` in `newparent`. The source must be
    /// writable: a link to a read-only input would let the action change it.
    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> FsResult<Attr> {
        let source = self.node(ino)?;
        if !source.is_writable() {
            return Err(Errno::EPERM.into());
        }
        let source = require_object(&source)?;
        let (node, dir) = self.mutable_dir(newparent, newname)?;
        if !underlying::same_tree(source.dir(), &dir) {
            return Err(Errno::EXDEV.into());
        }
        // linkat without AT_SYMLINK_FOLLOW: links the symlink itself.
        dir.at("linkat", newname, |fd, c| {
            nix::unistd::linkat(source.dir().fd(), source.name(), fd, c, AtFlags::empty())
        })?;
        self.adopt_made(&node, &dir, newname)
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
        let (from_node, from) = self.mutable_dir(parent, name)?;
        let (to_node, to) = self.mutable_dir(newparent, newname)?;
        if !underlying::same_tree(&from, &to) {
            return Err(Errno::EXDEV.into());
        }
        if !crate::sys::is_exchange(flags) {
            self.pin_entry(&to_node, &to, newname);
        }
        from.at("renameat2", name, |from_fd, from_c| {
            let to_c =
                crate::sandbox::dirfd::c_name(newname).map_err(|_| nix::errno::Errno::EINVAL)?;
            crate::sys::rename_at(from_fd, from_c, to.fd(), &to_c, flags)
        })?;
        let exchange = crate::sys::is_exchange(flags);
        move_discovered(&from_node, name, &to_node, newname, exchange);
        Ok(())
    }

    /// Changes attributes of a writable node and returns the new ones:
    /// through an open handle of it when there is one (the object may be
    /// gone from its name), else through its name.
    pub fn setattr(&self, ino: u64, change: &SetAttr) -> FsResult<Attr> {
        let node = self.node(ino)?;
        if !node.is_writable() {
            return Err(Errno::EPERM.into());
        }
        // chmod(2) follows symlinks, which could reach outside the view.
        if change.mode.is_some() && node.kind() == FileKind::Symlink {
            return Err(Errno::EOPNOTSUPP.into());
        }
        if change.size.is_some() && node.is_dir() {
            return Err(Errno::EISDIR.into());
        }
        if change.size.is_some() && node.kind() != FileKind::RegularFile {
            return Err(Errno::EINVAL.into());
        }
        match self.open_handle(ino, change.fh) {
            Some(held) if held.fd().is_some() => {
                set_through_handle(&held, change)?;
                let fd = held.fd().expect("checked");
                let st = nix::sys::stat::fstat(fd).map_err(|e| FsError::call("fstat", e))?;
                self.inodes.shown(ino, fingerprint(&st));
                Ok(Attr::from_stat(ino, &st))
            }
            _ => {
                set_through_name(&require_object(&node)?, change)?;
                self.attr_of(&node, ino)
            }
        }
    }
}

/// Applies `change` through an open descriptor of the object.
fn set_through_handle(held: &HeldFd, change: &SetAttr) -> FsResult<()> {
    let fd = held.fd().expect("a held descriptor");
    if let Some(mode) = change.mode {
        let mode = Mode::from_bits_truncate(mode as _);
        nix::sys::stat::fchmod(fd, mode).map_err(|e| FsError::call("fchmod", e))?;
    }
    if change.uid.is_some() || change.gid.is_some() {
        let (uid, gid) = (change.uid.map(Uid::from_raw), change.gid.map(Gid::from_raw));
        nix::unistd::fchown(fd, uid, gid).map_err(|e| FsError::call("fchown", e))?;
    }
    if let Some(size) = change.size {
        // A descriptor opened only for reading cannot be truncated; the
        // object is reopened for writing through it, deleted or not.
        let truncated = if held.writable() {
            nix::unistd::ftruncate(fd, size as libc::off_t)
        } else {
            crate::sys::truncate_fd(fd, size)
        };
        truncated.map_err(|e| FsError::call("ftruncate", e))?;
    }
    if change.atime.is_some() || change.mtime.is_some() {
        let (atime, mtime) = (timespec(change.atime), timespec(change.mtime));
        nix::sys::stat::futimens(fd, &atime, &mtime).map_err(|e| FsError::call("futimens", e))?;
    }
    Ok(())
}

/// Applies `change` to the object by its name, never following a symlink.
fn set_through_name(object: &UObj, change: &SetAttr) -> FsResult<()> {
    if let Some(mode) = change.mode {
        let mode = Mode::from_bits_truncate(mode as _);
        object.at("fchmodat", |fd, c| {
            nix::sys::stat::fchmodat(fd, c, mode, FchmodatFlags::NoFollowSymlink)
        })?;
    }
    if change.uid.is_some() || change.gid.is_some() {
        let (uid, gid) = (change.uid.map(Uid::from_raw), change.gid.map(Gid::from_raw));
        object.at("fchownat", |fd, c| {
            nix::unistd::fchownat(fd, c, uid, gid, AtFlags::AT_SYMLINK_NOFOLLOW)
        })?;
    }
    if let Some(size) = change.size {
        object.at("truncate", |fd, c| crate::sys::truncate_at(fd, c, size))?;
    }
    if change.atime.is_some() || change.mtime.is_some() {
        let (atime, mtime) = (timespec(change.atime), timespec(change.mtime));
        object.at("utimensat", |fd, c| {
            nix::sys::stat::utimensat(fd, c, &atime, &mtime, UtimensatFlags::NoFollowSymlink)
        })?;
    }
    Ok(())
}

fn timespec(time: Option<SetTime>) -> TimeSpec {
    match time {
        None => TimeSpec::UTIME_OMIT,
        Some(SetTime::Now) => TimeSpec::UTIME_NOW,
        Some(SetTime::At(at)) => match at.duration_since(UNIX_EPOCH) {
            Ok(d) => TimeSpec::new(d.as_secs() as _, d.subsec_nanos() as _),
            Err(before) => TimeSpec::new(-(before.duration().as_secs() as i64) as _, 0),
        },
    }
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
