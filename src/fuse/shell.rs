//! The FUSE shell: turns kernel requests (through `fuser`) into calls on
//! the core [`SandboxFs`], and its answers into replies.
//!
//! It holds no state of its own beyond the cache timeouts and passthrough
//! bookkeeping; every decision is the core's. Errors become errnos in one
//! place, [`FuseShell::failed`], which also logs each failed operation at
//! debug level with its request id.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BsdFileFlags, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::passthrough::{OpenMode, Passthrough};
use crate::config::ZeroMessageOpens;
use crate::stats::{Op, Stats};
use crate::tree::{
    Attr, Caller, Errno, FileKind, FsError, FsResult, Opened, SandboxFs, SetAttr, SetTime,
    XattrReply,
};

/// Generation numbers are constant: inode numbers are never reused.
const GENERATION: Generation = Generation(0);

pub struct FuseShell {
    fs: Arc<SandboxFs>,
    stats: Arc<Stats>,
    /// How long the kernel may cache entries and attributes.
    ttl: Duration,
    passthrough: Passthrough<fuser::BackingId>,
    /// What was asked; decided at init into `zero_open`.
    zero_message_opens: ZeroMessageOpens,
    zero_open: bool,
}

impl FuseShell {
    /// `passthrough`: try FUSE passthrough for file data (falls back, logged,
    /// where the kernel or our privileges do not allow it).
    pub fn new(
        fs: Arc<SandboxFs>,
        stats: Arc<Stats>,
        ttl: Duration,
        passthrough: bool,
        zero_message_opens: ZeroMessageOpens,
    ) -> FuseShell {
        FuseShell {
            fs,
            stats,
            ttl,
            passthrough: Passthrough::new(passthrough),
            zero_message_opens,
            zero_open: false,
        }
    }

    /// Whether opens should skip the daemon on this mount.
    fn wants_zero_message_opens(&self, config: &KernelConfig) -> bool {
        if !config
            .capabilities()
            .contains(InitFlags::FUSE_NO_OPEN_SUPPORT)
        {
            if self.zero_message_opens == ZeroMessageOpens::On {
                log::warn!("the kernel cannot open files without asking (no FUSE_NO_OPEN_SUPPORT)");
            }
            return false;
        }
        match self.zero_message_opens {
            ZeroMessageOpens::On => true,
            ZeroMessageOpens::Off => false,
            ZeroMessageOpens::Auto => true,
        }
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::Directory => FileType::Directory,
        FileKind::RegularFile => FileType::RegularFile,
        FileKind::Symlink => FileType::Symlink,
        FileKind::NamedPipe => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.blocks,
        atime: attr.atime,
        mtime: attr.mtime,
        ctime: attr.ctime,
        crtime: attr.ctime,
        kind: file_type(attr.kind),
        perm: attr.perm,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.blksize,
        flags: 0,
    }
}

/// The attributes of a negative entry (inode 0); the kernel reads none.
fn absent_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: std::time::UNIX_EPOCH,
        mtime: std::time::UNIX_EPOCH,
        ctime: std::time::UNIX_EPOCH,
        crtime: std::time::UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn set_time(time: Option<TimeOrNow>) -> Option<SetTime> {
    time.map(|t| match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(at) => SetTime::At(at),
    })
}

fn open_flags(keep_cache: bool) -> FopenFlags {
    if keep_cache {
        FopenFlags::FOPEN_KEEP_CACHE
    } else {
        FopenFlags::empty()
    }
}

impl FuseShell {
    /// Picks passthrough (the backing id to answer with) or cached service
    /// (`None`) for a handle the core opened. On EBUSY the handle has been
    /// released again.
    fn answer_open(
        &self,
        ino: u64,
        opened: &Opened,
        register: impl FnOnce(&std::fs::File) -> std::io::Result<fuser::BackingId>,
    ) -> FsResult<Option<Arc<fuser::BackingId>>> {
        // The open file is looked up only if a backing id must be made.
        let register = || match self.fs.open_file(opened.fh) {
            Some(file) => register(&file.file),
            None => Err(std::io::Error::from_raw_os_error(libc::EBADF)),
        };
        match self
            .passthrough
            .open(ino, opened.fh, opened.file_id, register)
        {
            OpenMode::Passthrough(backing) => Ok(Some(backing)),
            OpenMode::Cached => Ok(None),
            OpenMode::Busy => {
                self.fs.release(opened.fh);
                Err(Errno::EBUSY.into())
            }
        }
    }

    /// The errno a failed operation answers, after logging it (at debug
    /// level: most failures are lookups of names that do not exist).
    fn failed(&self, req: &Request, op: &'static str, ino: INodeNo, err: FsError) -> fuser::Errno {
        log::debug!(
            "request {} from pid {}: {op} on inode {}: {err}",
            req.unique().0,
            req.pid(),
            ino.0
        );
        fuser::Errno::from_i32(err.errno().0)
    }

    fn reply_entry(
        &self,
        req: &Request,
        op: &'static str,
        ino: INodeNo,
        reply: ReplyEntry,
        result: FsResult<Attr>,
    ) {
        match result {
            Ok(attr) => reply.entry(&self.ttl, &file_attr(&attr), GENERATION),
            Err(err) => reply.error(self.failed(req, op, ino, err)),
        }
    }

    fn reply_attr(
        &self,
        req: &Request,
        op: &'static str,
        ino: INodeNo,
        reply: ReplyAttr,
        result: FsResult<Attr>,
    ) {
        match result {
            Ok(attr) => reply.attr(&self.ttl, &file_attr(&attr)),
            Err(err) => reply.error(self.failed(req, op, ino, err)),
        }
    }

    fn reply_xattr(
        &self,
        req: &Request,
        op: &'static str,
        ino: INodeNo,
        reply: ReplyXattr,
        result: FsResult<XattrReply>,
    ) {
        match result {
            Ok(XattrReply::Size(size)) => reply.size(size),
            Ok(XattrReply::Data(data)) => reply.data(&data),
            Err(err) => reply.error(self.failed(req, op, ino, err)),
        }
    }

    fn reply_empty(
        &self,
        req: &Request,
        op: &'static str,
        ino: INodeNo,
        reply: ReplyEmpty,
        result: FsResult<()>,
    ) {
        match result {
            Ok(()) => reply.ok(),
            Err(err) => reply.error(self.failed(req, op, ino, err)),
        }
    }

    fn reply_data(
        &self,
        req: &Request,
        op: &'static str,
        ino: INodeNo,
        reply: ReplyData,
        result: FsResult<Vec<u8>>,
    ) {
        match result {
            Ok(data) => reply.data(&data),
            Err(err) => reply.error(self.failed(req, op, ino, err)),
        }
    }
}

impl Filesystem for FuseShell {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Lookups in one directory may run in parallel; symlink targets do
        // not change while a node lives, so the kernel may cache them.
        for wanted in [
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
        ] {
            if config.add_capabilities(wanted).is_err() {
                log::info!("kernel does not offer {wanted:?}");
            }
        }
        if self.wants_zero_message_opens(config) {
            self.zero_open = true;
            self.fs.set_zero_message_opens(true);
            self.passthrough
                .not_used("files are opened without asking the daemon (--zero_message_opens)");
            // With no OPEN to decide whether cached pages are still good,
            // an input changed in place is a new inode (`inodes`), and the
            // daemon drops the pages of one the kernel already holds. Not
            // FUSE_AUTO_INVAL_DATA: it would drop a file's pages at every
            // write's mtime change, and each small write would read its
            // page back first.
            log::info!("zero-message opens: no OPEN or RELEASE round trips");
        }
        if self.passthrough.enabled() {
            // Depth 1: backing files may not themselves be on a stacked file
            // system, but ours can sit under one (e.g. overlayfs).
            if config
                .add_capabilities(InitFlags::FUSE_PASSTHROUGH)
                .is_err()
            {
                self.passthrough
                    .disable("the kernel does not offer it (Linux 6.9+ needed)");
            } else if config.set_max_stack_depth(1).is_err() {
                self.passthrough.disable("the kernel refused stack depth 1");
            } else {
                log::info!("FUSE passthrough on: the kernel serves file data directly");
            }
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.stats.op(Op::Lookup);
        let result = self.fs.lookup(parent.0, name);
        if let Err(err) = &result {
            if err.errno() == Errno::ENOENT
                && !self.ttl.is_zero()
                && self.fs.note_absent(parent.0, name)
            {
                // Inode 0: the kernel caches the name as absent (a
                // compiler probing include directories asks again and
                // again otherwise).
                return reply.entry(&self.ttl, &absent_attr(), GENERATION);
            }
        }
        self.reply_entry(req, "lookup", parent, reply, result);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.stats.op(Op::Forget);
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.stats.op(Op::Getattr);
        let result = self.fs.getattr(ino.0, fh.map(|f| f.0));
        self.reply_attr(req, "getattr", ino, reply, result);
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.stats.op(Op::Setattr);
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: set_time(atime),
            mtime: set_time(mtime),
            fh: fh.map(|f| f.0),
        };
        let result = self.fs.setattr(ino.0, &change);
        self.reply_attr(req, "setattr", ino, reply, result);
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.stats.op(Op::Readlink);
        let result = self.fs.readlink(ino.0);
        self.reply_data(req, "readlink", ino, reply, result);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.stats.op(Op::Mknod);
        let result = self
            .fs
            .mknod(parent.0, name, mode & !umask, rdev, caller(req));
        self.reply_entry(req, "mknod", parent, reply, result);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.stats.op(Op::Mkdir);
        let result = self.fs.mkdir(parent.0, name, mode & !umask, caller(req));
        self.reply_entry(req, "mkdir", parent, reply, result);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.stats.op(Op::Unlink);
        let result = self.fs.unlink(parent.0, name);
        self.reply_empty(req, "unlink", parent, reply, result);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.stats.op(Op::Rmdir);
        let result = self.fs.rmdir(parent.0, name);
        self.reply_empty(req, "rmdir", parent, reply, result);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.stats.op(Op::Symlink);
        let result = self.fs.symlink(parent.0, link_name, target, caller(req));
        self.reply_entry(req, "symlink", parent, reply, result);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.stats.op(Op::Rename);
        let result = self
            .fs
            .rename(parent.0, name, newparent.0, newname, flags.bits());
        self.reply_empty(req, "rename", parent, reply, result);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.stats.op(Op::Link);
        let result = self.fs.link(ino.0, newparent.0, newname);
        self.reply_entry(req, "link", ino, reply, result);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.stats.op(Op::Open);
        if self.zero_open {
            // The kernel takes ENOSYS as "open without asking from now on";
            // this open goes ahead too.
            return reply.error(fuser::Errno::from_i32(libc::ENOSYS));
        }
        let opened = match self.fs.open(ino.0, flags.0) {
            Ok(opened) => opened,
            Err(err) => return reply.error(self.failed(req, "open", ino, err)),
        };
        match self.answer_open(ino.0, &opened, |file| reply.open_backing(file)) {
            Ok(Some(backing)) => {
                reply.opened_passthrough(FileHandle(opened.fh), FopenFlags::empty(), &backing)
            }
            Ok(None) => reply.opened(FileHandle(opened.fh), open_flags(opened.keep_cache)),
            Err(err) => reply.error(self.failed(req, "open", ino, err)),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.stats.op(Op::Read);
        let result = self.fs.read(ino.0, fh.0, offset, size);
        self.reply_data(req, "read", ino, reply, result);
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.stats.op(Op::Write);
        match self.fs.write(ino.0, fh.0, offset, data) {
            Ok(written) => reply.written(written),
            Err(err) => reply.error(self.failed(req, "write", ino, err)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.stats.op(Op::Flush);
        // Writes are already in the underlying file; nothing is buffered.
        // ENOSYS tells the kernel never to send FLUSH again, which saves a
        // round trip on every close(2) (close still returns 0).
        reply.error(fuser::Errno::from_i32(libc::ENOSYS));
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.stats.op(Op::Release);
        self.passthrough.release(fh.0);
        self.fs.release(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.stats.op(Op::Fsync);
        let result = self.fs.fsync(ino.0, fh.0, datasync);
        self.reply_empty(req, "fsync", ino, reply, result);
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.stats.op(Op::Opendir);
        match self.fs.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(err) => reply.error(self.failed(req, "opendir", ino, err)),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.stats.op(Op::Readdir);
        let listed = self.fs.readdir(fh.0, offset, |next, entry| {
            reply.add(INodeNo(entry.ino), next, file_type(entry.kind), entry.name)
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(err) => reply.error(self.failed(req, "readdir", ino, err)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.stats.op(Op::Releasedir);
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.stats.op(Op::Fsyncdir);
        // Directory changes are made by syscalls on the underlying file
        // system; syncing them is its business.
        reply.ok();
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.stats.op(Op::Statfs);
        match self.fs.statfs(ino.0) {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(err) => reply.error(self.failed(req, "statfs", ino, err)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.stats.op(Op::Setxattr);
        let result = self.fs.setxattr(ino.0, name, value, flags);
        self.reply_empty(req, "setxattr", ino, reply, result);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.stats.op(Op::Getxattr);
        let result = self.fs.getxattr(ino.0, name, size);
        self.reply_xattr(req, "getxattr", ino, reply, result);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.stats.op(Op::Listxattr);
        let result = self.fs.listxattr(ino.0, size);
        self.reply_xattr(req, "listxattr", ino, reply, result);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.stats.op(Op::Removexattr);
        let result = self.fs.removexattr(ino.0, name);
        self.reply_empty(req, "removexattr", ino, reply, result);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        self.stats.op(Op::Access);
        // Mounted with default_permissions: the kernel checks modes itself.
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.stats.op(Op::Create);
        let created = self
            .fs
            .create(parent.0, name, mode & !umask, flags, caller(req));
        let (attr, opened) = match created {
            Ok(created) => created,
            Err(err) => return reply.error(self.failed(req, "create", parent, err)),
        };
        let fh = FileHandle(opened.fh);
        match self.answer_open(attr.ino, &opened, |file| reply.open_backing(file)) {
            Ok(Some(backing)) => reply.created_passthrough(
                &self.ttl,
                &file_attr(&attr),
                GENERATION,
                fh,
                FopenFlags::empty(),
                &backing,
            ),
            Ok(None) => reply.created(
                &self.ttl,
                &file_attr(&attr),
                GENERATION,
                fh,
                FopenFlags::empty(),
            ),
            Err(err) => reply.error(self.failed(req, "create", parent, err)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.stats.op(Op::Fallocate);
        let result = self.fs.fallocate(ino.0, fh.0, offset, length, mode);
        self.reply_empty(req, "fallocate", ino, reply, result);
    }
}
