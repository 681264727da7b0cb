//! Open files: open, read, write, sync, release.
//!
//! Reads and writes go to the underlying file with pread/pwrite, so nothing
//! is buffered in the daemon: a write is in the underlying file when the
//! caller's write(2) returns.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use nix::fcntl::OFlag;
use nix::sys::stat::FileStat;

use super::attr::{file_id, fingerprint};
use super::error::{Errno, FsError, FsResult};
use super::handles::OpenFile;
use super::held::HeldFd;
use super::namespace::require_object;
use super::node::Access;
use super::SandboxFs;

/// Open flags passed on to the underlying file; the rest (O_CREAT, O_EXCL,
/// O_DIRECT, O_NOATIME, ...) is either handled by the kernel or would change
/// how the daemon, not the caller, sees the file.
pub(super) const PASSED_FLAGS: i32 = libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_TRUNC
    | libc::O_EXCL
    | libc::O_CREAT
    | libc::O_SYNC
    | libc::O_DSYNC
    | libc::O_NONBLOCK;

/// A file to do I/O on: an open handle, or an inode's own descriptor.
enum IoFile {
    Handle(std::sync::Arc<OpenFile>),
    Inode(std::sync::Arc<File>),
}

impl IoFile {
    fn file(&self) -> &File {
        match self {
            IoFile::Handle(open) => &open.file,
            IoFile::Inode(file) => file,
        }
    }
}

/// An opened file: its handle, whether the kernel may keep its cached
/// pages (read-only files that are the same file as at their last open),
/// which underlying file it is (device, inode), so that the shell can
/// give all opens of one node the same passthrough backing file, and what
/// the shell needs to decide whether passthrough pays (size, writable).
#[derive(Clone, Copy, Debug)]
pub struct Opened {
    pub fh: u64,
    pub keep_cache: bool,
    pub file_id: (u64, u64),
    /// The file's size at open.
    pub size: u64,
    /// Whether the node may be written (a writable mapping or a file made
    /// through the mount).
    pub writable: bool,
}

/// Writes `data` at `offset` and returns how much was written. A write that
/// fails after some bytes went in (ENOSPC, EFBIG, EDQUOT part way) answers
/// that short count, as write(2) does, instead of an error for bytes that
/// are in the file: the caller's next write then gets the error.
fn write_some_at(file: &File, data: &[u8], offset: u64) -> std::io::Result<u32> {
    let mut done = 0;
    while done < data.len() {
        match file.write_at(&data[done..], offset + done as u64) {
            // pwrite(2) makes no progress only on a full device it did not
            // report: say so rather than answer a write of nothing.
            Ok(0) if done == 0 => return Err(std::io::Error::from_raw_os_error(libc::ENOSPC)),
            Ok(0) => break,
            Ok(n) => done += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) if done == 0 => return Err(err),
            Err(_) => break,
        }
    }
    Ok(u32::try_from(done).expect("a FUSE write is at most max_write bytes"))
}

fn fstat(file: &File) -> FsResult<FileStat> {
    nix::sys::stat::fstat(file).map_err(|e| FsError::call("fstat", e))
}

impl SandboxFs {
    pub fn open(&self, ino: u64, flags: i32) -> FsResult<Opened> {
        let known = self.known(ino)?;
        let node = known.node;
        let wants_write = (flags & libc::O_ACCMODE) != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        if wants_write && !node.is_writable() {
            return Err(Errno::EPERM.into());
        }
        if node.is_dir() {
            return Err(Errno::EISDIR.into());
        }
        self.note_access(&node, Access::Read);
        let flags = OFlag::from_bits_truncate(flags & PASSED_FLAGS & !libc::O_CREAT);
        let file = match require_object(&node)?.open(flags) {
            // Removed underneath while the kernel still holds the name:
            // ESTALE makes it walk the path again with a real lookup, so
            // that the open fails as on the underlying files, or with
            // O_CREAT makes a new file, instead of failing with ENOENT on
            // a name it believes exists.
            Err(err) if err.errno() == Errno::ENOENT => {
                log::debug!("open of inode {ino}: {err}; answering ESTALE");
                return Err(Errno::ESTALE.into());
            }
            other => other?,
        };
        // Cached pages stay valid only if this is the file opened last
        // time: an input replaced behind our back must not show old bytes.
        let st = fstat(&file)?;
        if known.identity.is_some_and(|id| id != file_id(&st)) {
            return Err(Errno::ESTALE.into());
        }
        let fingerprint = fingerprint(&st);
        if self.inodes.shown_stale(ino, fingerprint) {
            // Changed since the kernel last saw its attributes (rewritten
            // in place): fresh pages alone are not enough, as reads stop at
            // the cached size until the attribute timeout. Dropped before
            // the answer, so that this open already sees the new size.
            self.invalidate_attrs_now(ino);
        }
        let keep_cache = !node.is_writable()
            && self
                .inodes
                .reopened_same(ino, fingerprint)
                .unwrap_or_else(|| node.reopened_same(fingerprint));
        let (fh, open) = self.files.insert(OpenFile {
            file,
            writable: (flags.bits() & libc::O_ACCMODE) != libc::O_RDONLY,
            ino,
        });
        self.hold(ino, HeldFd::File(open));
        Ok(Opened {
            fh,
            keep_cache,
            file_id: file_id(&st),
            size: st.st_size.max(0) as u64,
            writable: node.is_writable(),
        })
    }

    /// The underlying file behind handle `fh`, for the shell to register
    /// as a passthrough backing file.
    pub fn open_file(&self, fh: u64) -> Option<std::sync::Arc<OpenFile>> {
        self.files.get(fh)
    }

    /// The file to do I/O on: handle `fh`, or, for 0 (the kernel opened
    /// the file without telling us), the inode's own descriptor for
    /// `write` or reading, opened now if need be.
    fn io_file(&self, ino: u64, fh: u64, write: bool) -> FsResult<IoFile> {
        if fh != 0 {
            let open = self.files.get(fh).ok_or(FsError::refused(Errno::EBADF))?;
            if write && !open.writable {
                return Err(Errno::EBADF.into());
            }
            return Ok(IoFile::Handle(open));
        }
        let kept = self.inode_files.get(ino).unwrap_or_default();
        let (same, other) = if write {
            (kept.write, kept.read)
        } else {
            (kept.read, kept.write)
        };
        if let Some(file) = same {
            return Ok(IoFile::Inode(file));
        }
        let known = self.known(ino)?;
        let node = known.node;
        if write && !node.is_writable() {
            return Err(Errno::EPERM.into());
        }
        if node.is_dir() {
            return Err(Errno::EISDIR.into());
        }
        // Opened for one direction only: a file may be write-only or
        // read-only for the daemon's user as for the caller.
        let flags = if write {
            OFlag::O_WRONLY
        } else {
            OFlag::O_RDONLY
        };
        // Both directions act on one object: once the inode has a
        // descriptor, the other direction reopens that object rather than
        // resolving the name again (it may have been renamed, or swapped
        // for something else, since), as an open descriptor would.
        if let Some(held) = other {
            match crate::sys::reopen_fd(held.as_fd(), flags | OFlag::O_NONBLOCK) {
                Ok(fd) => return Ok(IoFile::Inode(self.inode_files.keep(ino, write, fd.into()))),
                Err(nix::errno::Errno::EOPNOTSUPP) => {}
                Err(errno) => return Err(FsError::call("open /proc/self/fd", errno)),
            }
        }
        let file = require_object(&node)?.open(flags | OFlag::O_NONBLOCK)?;
        if let Some(identity) = known.identity {
            if file_id(&fstat(&file)?) != identity {
                return Err(Errno::ESTALE.into());
            }
        }
        Ok(IoFile::Inode(self.inode_files.keep(ino, write, file)))
    }

    /// Reads up to `size` bytes at `offset`; fewer only at end of file.
    pub fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        if self.tracks_access() {
            // Opened without telling us: the first read is the first sign.
            if let Ok(node) = self.node(ino) {
                node.note_access(Access::Read);
            }
        }
        let open = self.io_file(ino, fh, false)?;
        let mut buf = vec![0; size as usize];
        let mut filled = 0;
        while filled < buf.len() {
            match open
                .file()
                .read_at(&mut buf[filled..], offset + filled as u64)
            {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) => return Err(FsError::call("pread", err)),
            }
        }
        buf.truncate(filled);
        Ok(buf)
    }

    pub fn write(&self, ino: u64, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let open = self.io_file(ino, fh, true)?;
        write_some_at(open.file(), data, offset).map_err(|e| FsError::call("pwrite", e))
    }

    pub fn fsync(&self, ino: u64, fh: u64, datasync: bool) -> FsResult<()> {
        // Any descriptor of the file syncs it; without a handle, one opened
        // for reading does (a read-only input has nothing to sync anyway).
        let open = self.io_file(ino, fh, false)?;
        let synced = if datasync {
            open.file().sync_data()
        } else {
            open.file().sync_all()
        };
        synced.map_err(|e| FsError::call("fsync", e))
    }

    pub fn fallocate(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> FsResult<()> {
        let open = self.io_file(ino, fh, true)?;
        crate::sys::fallocate(open.file().as_fd(), mode, offset, length)
            .map_err(|e| FsError::call("fallocate", e))
    }

    /// A file created through the mount, opened with `flags`: see
    /// [`SandboxFs::create`]. When files are opened without asking, the
    /// kernel sends no RELEASE for a created one either, so it gets no
    /// handle (0): its descriptor becomes the inode's own, closed when the
    /// kernel forgets the inode.
    pub(super) fn register_created(
        &self,
        ino: u64,
        file: File,
        flags: i32,
        st: &FileStat,
    ) -> Opened {
        let writable = (flags & libc::O_ACCMODE) != libc::O_RDONLY;
        let fh = if self.zero_message_opens() {
            self.inode_files.keep(ino, writable, file);
            0
        } else {
            let (fh, open) = self.files.insert(OpenFile {
                file,
                writable,
                ino,
            });
            self.hold(ino, HeldFd::File(open));
            fh
        };
        Opened {
            fh,
            keep_cache: false,
            file_id: file_id(st),
            size: st.st_size.max(0) as u64,
            // Made through the mount: in a writable directory.
            writable: true,
        }
    }

    pub fn release(&self, fh: u64) {
        if let Some(file) = self.files.remove(fh) {
            self.unhold(file.ino);
        }
    }
}
