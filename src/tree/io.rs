//! Open files: open, read, write, sync, release.
//!
//! Reads and writes go to the underlying file with pread/pwrite, so nothing
//! is buffered in the daemon: a write is in the underlying file when the
//! caller's write(2) returns.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::errno::{Errno, FsResult};
use super::handles::OpenFile;
use super::{c_path, SandboxFs};
use crate::sys::check;

/// Open flags passed on to the underlying file; the rest (O_CREAT, O_EXCL,
/// O_DIRECT, O_NOATIME, ...) is either handled by the kernel or would change
/// how the daemon, not the caller, sees the file.
const PASSED_FLAGS: i32 = libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_TRUNC
    | libc::O_EXCL
    | libc::O_CREAT
    | libc::O_SYNC
    | libc::O_DSYNC
    | libc::O_NONBLOCK;

/// Opens an underlying file without following a symlink in its last
/// component.
pub(super) fn open_underlying(path: &Path, flags: i32, mode: u32) -> FsResult<File> {
    let c = c_path(path)?;
    let flags = (flags & PASSED_FLAGS) | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: valid C string; the fd is owned by the File below.
    let fd = check(unsafe { libc::open(c.as_ptr(), flags, mode as libc::c_uint) })?;
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// A fingerprint of a file's identity and version; never 0.
fn identity(meta: &std::fs::Metadata) -> u64 {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::MetadataExt;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec(),
    )
        .hash(&mut hasher);
    hasher.finish() | 1
}

/// An opened file: its handle, whether the kernel may keep its cached
/// pages (read-only files that are the same file as at their last open),
/// and which underlying file it is (device, inode), so that the shell can
/// give all opens of one node the same passthrough backing file.
#[derive(Clone, Copy, Debug)]
pub struct Opened {
    pub fh: u64,
    pub keep_cache: bool,
    pub file_id: (u64, u64),
}

fn file_id(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

impl SandboxFs {
    pub fn open(&self, ino: u64, flags: i32) -> FsResult<Opened> {
        let node = self.node(ino)?;
        let wants_write = (flags & libc::O_ACCMODE) != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        if wants_write && !node.is_writable() {
            return Err(Errno::EPERM);
        }
        if node.is_dir() {
            return Err(Errno(libc::EISDIR));
        }
        let file = open_underlying(&node.require_path()?, flags & !libc::O_CREAT, 0)?;
        // Cached pages stay valid only if this is the file opened last
        // time: an input replaced behind our back must not show old bytes.
        let meta = file.metadata()?;
        let keep_cache = !node.is_writable() && node.reopened_same(identity(&meta));
        let fh = self.files.insert(OpenFile {
            file,
            writable: (flags & libc::O_ACCMODE) != libc::O_RDONLY,
        });
        Ok(Opened {
            fh,
            keep_cache,
            file_id: file_id(&meta),
        })
    }

    /// The underlying file behind handle `fh`, for the shell to register
    /// as a passthrough backing file.
    pub fn open_file(&self, fh: u64) -> Option<std::sync::Arc<OpenFile>> {
        self.files.get(fh)
    }

    /// Reads up to `size` bytes at `offset`; fewer only at end of file.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let open = self.files.get(fh).ok_or(Errno::EBADF)?;
        let mut buf = vec![0; size as usize];
        let mut filled = 0;
        while filled < buf.len() {
            match open
                .file
                .read_at(&mut buf[filled..], offset + filled as u64)
            {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err.into()),
            }
        }
        buf.truncate(filled);
        Ok(buf)
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let open = self.files.get(fh).ok_or(Errno::EBADF)?;
        if !open.writable {
            return Err(Errno::EBADF);
        }
        open.file.write_all_at(data, offset)?;
        Ok(data.len() as u32)
    }

    pub fn fsync(&self, fh: u64, datasync: bool) -> FsResult<()> {
        let open = self.files.get(fh).ok_or(Errno::EBADF)?;
        if datasync {
            open.file.sync_data()?;
        } else {
            open.file.sync_all()?;
        }
        Ok(())
    }

    pub fn fallocate(&self, fh: u64, offset: u64, length: u64, mode: i32) -> FsResult<()> {
        let open = self.files.get(fh).ok_or(Errno::EBADF)?;
        if !open.writable {
            return Err(Errno::EBADF);
        }
        crate::sys::fallocate(open.file.as_raw_fd(), mode, offset, length)?;
        Ok(())
    }

    /// A file created through the mount, opened: see [`SandboxFs::create`].
    pub(super) fn register_created(&self, file: File, flags: i32) -> FsResult<Opened> {
        let meta = file.metadata()?;
        let fh = self.files.insert(OpenFile {
            file,
            writable: (flags & libc::O_ACCMODE) != libc::O_RDONLY,
        });
        Ok(Opened {
            fh,
            keep_cache: false,
            file_id: file_id(&meta),
        })
    }

    pub fn release(&self, fh: u64) {
        self.files.remove(fh);
    }
}
