//! The FUSE shell: fuser's `/dev/fuse` loop as a transport. It turns
//! fuser's requests into calls on the [`Dispatcher`] and its answers into
//! fuser replies; every decision is the dispatcher's.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::dispatch::{Answer, Ctx, Dispatcher, Entry, Open};
use super::transport::RingOffer;
use crate::sandbox::tree::{Attr, Errno, FileKind, SetAttr, SetTime, XattrReply};

/// Generation numbers are constant: inode numbers are never reused.
const GENERATION: Generation = Generation(0);

pub struct FuseShell {
    dispatch: Arc<Dispatcher>,
    ring: Arc<RingOffer>,
}

impl FuseShell {
    /// `ring`: whether INIT asks for FUSE-over-io_uring, and where to say
    /// whether the kernel granted it.
    pub fn new(dispatch: Arc<Dispatcher>, ring: Arc<RingOffer>) -> FuseShell {
        FuseShell { dispatch, ring }
    }

    #[cfg(target_os = "linux")]
    fn ask_for_ring(&self, config: &mut KernelConfig) {
        if !self.ring.wanted() {
            return;
        }
        if config
            .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
            .is_err()
        {
            // enable_uring was turned off since the transport was chosen.
            log::warn!("the kernel no longer offers FUSE-over-io_uring at INIT");
            return;
        }
        // Every ring entry's payload buffer is as large as the largest
        // write.
        if let Err(max) = config.set_max_write(super::uring::MAX_WRITE) {
            log::warn!(
                "the kernel refused max_write {} (up to {max})",
                super::uring::MAX_WRITE
            );
        }
        self.ring.grant();
    }

    #[cfg(not(target_os = "linux"))]
    fn ask_for_ring(&self, _config: &mut KernelConfig) {
        // `transport::choose` never picks the ring here.
        debug_assert!(!self.ring.wanted());
    }
}

fn ctx(req: &Request) -> Ctx {
    Ctx {
        unique: req.unique().0,
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn errno(err: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(err.0)
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

fn open_flags(open: &Open) -> FopenFlags {
    if open.keep_cache {
        FopenFlags::FOPEN_KEEP_CACHE
    } else {
        FopenFlags::empty()
    }
}

impl FuseShell {
    fn reply_entry(&self, reply: ReplyEntry, answer: Answer<Attr>) {
        match answer {
            Ok(attr) => reply.entry(&self.dispatch.ttl(), &file_attr(&attr), GENERATION),
            Err(err) => reply.error(errno(err)),
        }
    }

    fn reply_attr(&self, reply: ReplyAttr, answer: Answer<Attr>) {
        match answer {
            Ok(attr) => reply.attr(&self.dispatch.ttl(), &file_attr(&attr)),
            Err(err) => reply.error(errno(err)),
        }
    }
}

fn reply_xattr(reply: ReplyXattr, answer: Answer<XattrReply>) {
    match answer {
        Ok(XattrReply::Size(size)) => reply.size(size),
        Ok(XattrReply::Data(data)) => reply.data(&data),
        Err(err) => reply.error(errno(err)),
    }
}

fn reply_empty(reply: ReplyEmpty, answer: Answer<()>) {
    match answer {
        Ok(()) => reply.ok(),
        Err(err) => reply.error(errno(err)),
    }
}

fn reply_data(reply: ReplyData, answer: Answer<Vec<u8>>) {
    match answer {
        Ok(data) => reply.data(&data),
        Err(err) => reply.error(errno(err)),
    }
}

/// Answers an open: a passthrough one names its backing id, which the
/// dispatcher keeps alive until the handle's release.
fn reply_open(reply: ReplyOpen, open: Open) {
    let fh = FileHandle(open.fh);
    match open.backing_id {
        Some(id) => {
            // SAFETY: the id is open and belongs to this session; the
            // dispatcher closes it, so ownership is handed back below.
            let backing = unsafe { reply.wrap_backing(id) };
            reply.opened_passthrough(fh, FopenFlags::empty(), &backing);
            backing.into_raw();
        }
        None => reply.opened(fh, open_flags(&open)),
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
        self.ask_for_ring(config);
        let kernel_can_skip_open = config
            .capabilities()
            .contains(InitFlags::FUSE_NO_OPEN_SUPPORT);
        if self
            .dispatch
            .decide_zero_message_opens(kernel_can_skip_open)
        {
            // With no OPEN to decide whether cached pages are still good,
            // an input changed in place is a new inode (`inodes`), and the
            // daemon drops the pages of one the kernel already holds. Not
            // FUSE_AUTO_INVAL_DATA: it would drop a file's pages at every
            // write's mtime change, and each small write would read its
            // page back first.
            log::info!("zero-message opens: no OPEN or RELEASE round trips");
        }
        let passthrough = self.dispatch.passthrough();
        if passthrough.enabled() {
            // Depth 1: backing files may not themselves be on a stacked file
            // system, but ours can sit under one (e.g. overlayfs).
            if config
                .add_capabilities(InitFlags::FUSE_PASSTHROUGH)
                .is_err()
            {
                passthrough.disable("the kernel does not offer it (Linux 6.9+ needed)");
            } else if config.set_max_stack_depth(1).is_err() {
                passthrough.disable("the kernel refused stack depth 1");
            } else {
                log::info!("FUSE passthrough on: the kernel serves file data directly");
            }
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.dispatch.lookup(&ctx(req), parent.0, name) {
            Ok(Entry::Node(attr)) => self.reply_entry(reply, Ok(attr)),
            Ok(Entry::Absent) => reply.entry(&self.dispatch.ttl(), &absent_attr(), GENERATION),
            Err(err) => reply.error(errno(err)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.dispatch.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let answer = self.dispatch.getattr(&ctx(req), ino.0, fh.map(|f| f.0));
        self.reply_attr(reply, answer);
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
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: set_time(atime),
            mtime: set_time(mtime),
            fh: fh.map(|f| f.0),
        };
        let answer = self.dispatch.setattr(&ctx(req), ino.0, &change);
        self.reply_attr(reply, answer);
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        reply_data(reply, self.dispatch.readlink(&ctx(req), ino.0));
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
        let answer = self
            .dispatch
            .mknod(&ctx(req), parent.0, name, mode, umask, rdev);
        self.reply_entry(reply, answer);
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
        let answer = self.dispatch.mkdir(&ctx(req), parent.0, name, mode, umask);
        self.reply_entry(reply, answer);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.dispatch.unlink(&ctx(req), parent.0, name));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.dispatch.rmdir(&ctx(req), parent.0, name));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let answer = self
            .dispatch
            .symlink(&ctx(req), parent.0, link_name, target);
        self.reply_entry(reply, answer);
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
        let answer = self.dispatch.rename(
            &ctx(req),
            parent.0,
            name,
            newparent.0,
            newname,
            flags.bits(),
        );
        reply_empty(reply, answer);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let answer = self.dispatch.link(&ctx(req), ino.0, newparent.0, newname);
        self.reply_entry(reply, answer);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.dispatch.open(&ctx(req), ino.0, flags.0) {
            Ok(open) => reply_open(reply, open),
            Err(err) => reply.error(errno(err)),
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
        let answer = self.dispatch.read(&ctx(req), ino.0, fh.0, offset, size);
        reply_data(reply, answer);
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
        match self.dispatch.write(&ctx(req), ino.0, fh.0, offset, data) {
            Ok(written) => reply.written(written),
            Err(err) => reply.error(errno(err)),
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
        reply_empty(reply, self.dispatch.flush());
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
        self.dispatch.release(fh.0);
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
        reply_empty(reply, self.dispatch.fsync(&ctx(req), ino.0, fh.0, datasync));
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.dispatch.opendir(&ctx(req), ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(err) => reply.error(errno(err)),
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
        let listed = self
            .dispatch
            .readdir(&ctx(req), ino.0, fh.0, offset, |next, entry| {
                reply.add(INodeNo(entry.ino), next, file_type(entry.kind), entry.name)
            });
        match listed {
            Ok(()) => reply.ok(),
            Err(err) => reply.error(errno(err)),
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
        self.dispatch.releasedir(fh.0);
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
        reply_empty(reply, self.dispatch.fsyncdir());
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        match self.dispatch.statfs(&ctx(req), ino.0) {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(err) => reply.error(errno(err)),
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
        let answer = self.dispatch.setxattr(&ctx(req), ino.0, name, value, flags);
        reply_empty(reply, answer);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, self.dispatch.getxattr(&ctx(req), ino.0, name, size));
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, self.dispatch.listxattr(&ctx(req), ino.0, size));
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.dispatch.removexattr(&ctx(req), ino.0, name));
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        reply_empty(reply, self.dispatch.access());
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
        let answer = self
            .dispatch
            .create(&ctx(req), parent.0, name, mode, umask, flags);
        let (attr, open) = match answer {
            Ok(created) => created,
            Err(err) => return reply.error(errno(err)),
        };
        let ttl = self.dispatch.ttl();
        let fh = FileHandle(open.fh);
        match open.backing_id {
            Some(id) => {
                // SAFETY: as in `reply_open`.
                let backing = unsafe { reply.wrap_backing(id) };
                reply.created_passthrough(
                    &ttl,
                    &file_attr(&attr),
                    GENERATION,
                    fh,
                    FopenFlags::empty(),
                    &backing,
                );
                backing.into_raw();
            }
            None => reply.created(&ttl, &file_attr(&attr), GENERATION, fh, open_flags(&open)),
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
        let answer = self
            .dispatch
            .fallocate(&ctx(req), ino.0, fh.0, offset, length, mode);
        reply_empty(reply, answer);
    }
}
