//! The FUSE dispatcher: every operation the kernel may ask for, as a method
//! taking plain values and returning a typed answer, served from the core
//! [`SandboxFs`]. The transports (fuser's `/dev/fuse` loop in
//! [`super::shell`], the io_uring queues) only decode requests and encode
//! these answers.
//!
//! Everything decided per request lives here: the counters and service
//! times (a guard from [`Stats::timed`] per method), the errno a
//! failure answers (with its debug log line, in one place:
//! [`Dispatcher::failed`]), negative entries for absent names, passthrough
//! or cached service for an open, and the requests answered ENOSYS so that
//! the kernel stops sending them (FLUSH, OPEN with zero-message opens).

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::passthrough::{self, Backing, OpenMode, Passthrough};
use crate::fuse::options::ZeroMessageOpens;
use crate::sandbox::tree::{
    Attr, Caller, DirEntry, Errno, FsError, FsResult, Opened, SandboxFs, SetAttr, StatFs,
    XattrReply,
};
use crate::stats::{Op, Stats};

/// Who sent a request, as the kernel says in its header.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    pub unique: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Ctx {
    fn caller(&self) -> Caller {
        Caller {
            uid: self.uid,
            gid: self.gid,
        }
    }
}

/// The answer to a LOOKUP.
pub enum Entry {
    Node(Attr),
    /// A negative entry (inode 0): the kernel caches the name as absent.
    Absent,
}

/// The answer to an OPEN (or the open half of a CREATE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Open {
    pub fh: u64,
    /// Whether the kernel may keep the file's cached pages.
    pub keep_cache: bool,
    /// Passthrough: the backing id the kernel serves data from.
    pub backing_id: Option<u32>,
}

/// Answers of the operations that return nothing but success.
pub type Answer<T> = Result<T, Errno>;

pub struct Dispatcher {
    fs: Arc<SandboxFs>,
    stats: Arc<Stats>,
    /// How long the kernel may cache entries and attributes.
    ttl: Duration,
    passthrough: Passthrough<Backing>,
    /// What was asked; decided at init into `zero_open`.
    zero_message_opens: ZeroMessageOpens,
    zero_open: AtomicBool,
    /// The session's `/dev/fuse` descriptor, for backing ids; known once
    /// mounted.
    device: OnceLock<Arc<OwnedFd>>,
}

impl Dispatcher {
    /// `passthrough`: try FUSE passthrough for file data (falls back, logged,
    /// where the kernel or our privileges do not allow it).
    pub fn new(
        fs: Arc<SandboxFs>,
        stats: Arc<Stats>,
        ttl: Duration,
        passthrough: bool,
        zero_message_opens: ZeroMessageOpens,
    ) -> Dispatcher {
        Dispatcher {
            fs,
            stats,
            ttl,
            passthrough: Passthrough::new(passthrough),
            zero_message_opens,
            zero_open: AtomicBool::new(false),
            device: OnceLock::new(),
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn passthrough(&self) -> &Passthrough<Backing> {
        &self.passthrough
    }

    /// The mount's `/dev/fuse` descriptor, which backing ids are made on.
    pub fn set_device(&self, device: OwnedFd) {
        let _ = self.device.set(Arc::new(device));
    }

    /// Decides at init whether opens skip the daemon on this mount;
    /// `kernel_can`: the kernel offered FUSE_NO_OPEN_SUPPORT.
    pub fn decide_zero_message_opens(&self, kernel_can: bool) -> bool {
        // `auto` means off: the default must behave like the files mapped.
        let wanted = self.zero_message_opens == ZeroMessageOpens::On;
        if !kernel_can {
            if self.zero_message_opens == ZeroMessageOpens::On {
                log::warn!("the kernel cannot open files without asking (no FUSE_NO_OPEN_SUPPORT)");
            }
            return false;
        }
        if wanted {
            self.zero_open.store(true, Ordering::Relaxed);
            self.fs.set_zero_message_opens(true);
            self.passthrough
                .not_used("files are opened without asking the daemon (--zero_message_opens)");
        }
        wanted
    }

    /// The errno a failed operation answers, after logging it (at debug
    /// level: most failures are lookups of names that do not exist).
    pub fn failed(&self, ctx: &Ctx, op: &'static str, ino: u64, err: FsError) -> Errno {
        log::debug!(
            "request {} from pid {}: {op} on inode {ino}: {err}",
            ctx.unique,
            ctx.pid,
        );
        err.errno()
    }

    fn answer<T>(&self, ctx: &Ctx, op: &'static str, ino: u64, result: FsResult<T>) -> Answer<T> {
        result.map_err(|err| self.failed(ctx, op, ino, err))
    }

    /// Picks passthrough (the backing id to answer with) or cached service
    /// for a handle the core opened. On EBUSY the handle has been released
    /// again.
    fn answer_open(&self, ino: u64, opened: &Opened) -> FsResult<Open> {
        // The open file is looked up only if a backing id must be made.
        let register = || {
            let device = self
                .device
                .get()
                .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOTCONN))?;
            match self.fs.open_file(opened.fh) {
                Some(file) => Backing::open(device, &file.file),
                None => Err(std::io::Error::from_raw_os_error(libc::EBADF)),
            }
        };
        let backing_id = match self.passthrough.open(
            ino,
            opened.fh,
            opened.file_id,
            passthrough::pays_for(opened.size, opened.writable),
            register,
        ) {
            OpenMode::Passthrough(backing) => Some(backing.id()),
            OpenMode::Cached => None,
            OpenMode::Busy => {
                self.fs.release(opened.fh);
                return Err(Errno::EBUSY.into());
            }
        };
        Ok(Open {
            fh: opened.fh,
            keep_cache: backing_id.is_none() && opened.keep_cache,
            backing_id,
        })
    }

    pub fn lookup(&self, ctx: &Ctx, parent: u64, name: &OsStr) -> Answer<Entry> {
        let _timed = self.stats.timed(Op::Lookup);
        let result = self.fs.lookup(parent, name);
        if let Err(err) = &result {
            if err.errno() == Errno::ENOENT
                && !self.ttl.is_zero()
                && self.fs.note_absent(parent, name)
            {
                // Inode 0: the kernel caches the name as absent (a
                // compiler probing include directories asks again and
                // again otherwise).
                return Ok(Entry::Absent);
            }
        }
        self.answer(ctx, "lookup", parent, result.map(Entry::Node))
    }

    pub fn forget(&self, ino: u64, nlookup: u64) {
        let _timed = self.stats.timed(Op::Forget);
        self.fs.forget(ino, nlookup);
    }

    pub fn getattr(&self, ctx: &Ctx, ino: u64, fh: Option<u64>) -> Answer<Attr> {
        let _timed = self.stats.timed(Op::Getattr);
        self.answer(ctx, "getattr", ino, self.fs.getattr(ino, fh))
    }

    pub fn setattr(&self, ctx: &Ctx, ino: u64, change: &SetAttr) -> Answer<Attr> {
        let _timed = self.stats.timed(Op::Setattr);
        self.answer(ctx, "setattr", ino, self.fs.setattr(ino, change))
    }

    pub fn readlink(&self, ctx: &Ctx, ino: u64) -> Answer<Vec<u8>> {
        let _timed = self.stats.timed(Op::Readlink);
        self.answer(ctx, "readlink", ino, self.fs.readlink(ino))
    }

    pub fn mknod(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Answer<Attr> {
        let _timed = self.stats.timed(Op::Mknod);
        let result = self
            .fs
            .mknod(parent, name, mode & !umask, rdev, ctx.caller());
        self.answer(ctx, "mknod", parent, result)
    }

    pub fn mkdir(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Answer<Attr> {
        let _timed = self.stats.timed(Op::Mkdir);
        let result = self.fs.mkdir(parent, name, mode & !umask, ctx.caller());
        self.answer(ctx, "mkdir", parent, result)
    }

    pub fn unlink(&self, ctx: &Ctx, parent: u64, name: &OsStr) -> Answer<()> {
        let _timed = self.stats.timed(Op::Unlink);
        self.answer(ctx, "unlink", parent, self.fs.unlink(parent, name))
    }

    pub fn rmdir(&self, ctx: &Ctx, parent: u64, name: &OsStr) -> Answer<()> {
        let _timed = self.stats.timed(Op::Rmdir);
        self.answer(ctx, "rmdir", parent, self.fs.rmdir(parent, name))
    }

    pub fn symlink(
        &self,
        ctx: &Ctx,
        parent: u64,
        link_name: &OsStr,
        target: &Path,
    ) -> Answer<Attr> {
        let _timed = self.stats.timed(Op::Symlink);
        let result = self.fs.symlink(parent, link_name, target, ctx.caller());
        self.answer(ctx, "symlink", parent, result)
    }

    pub fn rename(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Answer<()> {
        let _timed = self.stats.timed(Op::Rename);
        let result = self.fs.rename(parent, name, newparent, newname, flags);
        self.answer(ctx, "rename", parent, result)
    }

    pub fn link(&self, ctx: &Ctx, ino: u64, newparent: u64, newname: &OsStr) -> Answer<Attr> {
        let _timed = self.stats.timed(Op::Link);
        self.answer(ctx, "link", ino, self.fs.link(ino, newparent, newname))
    }

    pub fn open(&self, ctx: &Ctx, ino: u64, flags: i32) -> Answer<Open> {
        let _timed = self.stats.timed(Op::Open);
        if self.zero_open.load(Ordering::Relaxed) {
            // The kernel takes ENOSYS as "open without asking from now on";
            // this open goes ahead too.
            return Err(Errno(libc::ENOSYS));
        }
        let result = self
            .fs
            .open(ino, flags)
            .and_then(|opened| self.answer_open(ino, &opened));
        self.answer(ctx, "open", ino, result)
    }

    pub fn read(&self, ctx: &Ctx, ino: u64, fh: u64, offset: u64, size: u32) -> Answer<Vec<u8>> {
        let _timed = self.stats.timed(Op::Read);
        self.answer(ctx, "read", ino, self.fs.read(ino, fh, offset, size))
    }

    pub fn write(&self, ctx: &Ctx, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Answer<u32> {
        let _timed = self.stats.timed(Op::Write);
        self.answer(ctx, "write", ino, self.fs.write(ino, fh, offset, data))
    }

    pub fn flush(&self) -> Answer<()> {
        let _timed = self.stats.timed(Op::Flush);
        // Writes are already in the underlying file; nothing is buffered.
        // ENOSYS tells the kernel never to send FLUSH again, which saves a
        // round trip on every close(2) (close still returns 0).
        Err(Errno(libc::ENOSYS))
    }

    pub fn release(&self, fh: u64) {
        let _timed = self.stats.timed(Op::Release);
        self.passthrough.release(fh);
        self.fs.release(fh);
    }

    pub fn fsync(&self, ctx: &Ctx, ino: u64, fh: u64, datasync: bool) -> Answer<()> {
        let _timed = self.stats.timed(Op::Fsync);
        self.answer(ctx, "fsync", ino, self.fs.fsync(ino, fh, datasync))
    }

    pub fn opendir(&self, ctx: &Ctx, ino: u64) -> Answer<u64> {
        let _timed = self.stats.timed(Op::Opendir);
        self.answer(ctx, "opendir", ino, self.fs.opendir(ino))
    }

    /// Entries from `offset` on, each with the offset of the next.
    pub fn readdir(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        add: impl FnMut(u64, DirEntry) -> bool,
    ) -> Answer<()> {
        let _timed = self.stats.timed(Op::Readdir);
        self.answer(ctx, "readdir", ino, self.fs.readdir(fh, offset, add))
    }

    pub fn releasedir(&self, fh: u64) {
        let _timed = self.stats.timed(Op::Releasedir);
        self.fs.releasedir(fh);
    }

    pub fn fsyncdir(&self) -> Answer<()> {
        let _timed = self.stats.timed(Op::Fsyncdir);
        // Directory changes are made by syscalls on the underlying file
        // system; syncing them is its business.
        Ok(())
    }

    pub fn statfs(&self, ctx: &Ctx, ino: u64) -> Answer<StatFs> {
        let _timed = self.stats.timed(Op::Statfs);
        self.answer(ctx, "statfs", ino, self.fs.statfs(ino))
    }

    pub fn setxattr(
        &self,
        ctx: &Ctx,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Answer<()> {
        let _timed = self.stats.timed(Op::Setxattr);
        let result = self.fs.setxattr(ino, name, value, flags);
        self.answer(ctx, "setxattr", ino, result)
    }

    pub fn getxattr(&self, ctx: &Ctx, ino: u64, name: &OsStr, size: u32) -> Answer<XattrReply> {
        let _timed = self.stats.timed(Op::Getxattr);
        self.answer(ctx, "getxattr", ino, self.fs.getxattr(ino, name, size))
    }

    pub fn listxattr(&self, ctx: &Ctx, ino: u64, size: u32) -> Answer<XattrReply> {
        let _timed = self.stats.timed(Op::Listxattr);
        self.answer(ctx, "listxattr", ino, self.fs.listxattr(ino, size))
    }

    pub fn removexattr(&self, ctx: &Ctx, ino: u64, name: &OsStr) -> Answer<()> {
        let _timed = self.stats.timed(Op::Removexattr);
        self.answer(ctx, "removexattr", ino, self.fs.removexattr(ino, name))
    }

    pub fn access(&self) -> Answer<()> {
        let _timed = self.stats.timed(Op::Access);
        // Mounted with default_permissions: the kernel checks modes itself.
        Ok(())
    }

    pub fn create(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Answer<(Attr, Open)> {
        let _timed = self.stats.timed(Op::Create);
        let result = self
            .fs
            .create(parent, name, mode & !umask, flags, ctx.caller())
            .and_then(|(attr, opened)| {
                let open = self.answer_open(attr.ino, &opened)?;
                // A created file's pages are new: nothing to keep.
                Ok((
                    attr,
                    Open {
                        keep_cache: false,
                        ..open
                    },
                ))
            });
        self.answer(ctx, "create", parent, result)
    }

    pub fn fallocate(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Answer<()> {
        let _timed = self.stats.timed(Op::Fallocate);
        let result = self.fs.fallocate(ino, fh, offset, length, mode);
        self.answer(ctx, "fallocate", ino, result)
    }
}
