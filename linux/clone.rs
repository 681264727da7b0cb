//! Linux: a reflink copy with ioctl(FICLONE), where the file system shares
//! extents (xfs with reflink=1, btrfs). Elsewhere it fails with EOPNOTSUPP
//! or EXDEV (or EINVAL on some file systems), and `auto` moves on.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use super::dirfd::{open_file_at, DirFd};

/// FICLONE works on regular files only: directories are walked.
pub const CLONES_DIRECTORIES: bool = false;

/// Clones file `src_name` of `src_dir` (AT_FDCWD for an absolute path) as
/// new file `name` in `dest`, with the source's mode.
pub fn clone_file(src_dir: RawFd, src_name: &CStr, dest: &DirFd, name: &CStr) -> io::Result<()> {
    let source = open_file_at(src_dir, src_name)?;
    let mode = std::os::unix::fs::MetadataExt::mode(&source.metadata()?);
    let target = dest.create_file(name, mode & 0o7777)?;
    // SAFETY: FICLONE takes the source fd as its argument.
    let ret = unsafe { libc::ioctl(target.as_raw_fd(), libc::FICLONE, source.as_raw_fd()) };
    if ret < 0 {
        let err = io::Error::last_os_error();
        drop(target);
        let _ = dest.unlink_at(name, false);
        return Err(err);
    }
    Ok(())
}
