//! Linux forms of the platform-specific calls.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

use super::{check, xattr_call};

/// FICLONE works on regular files only: directories are walked.
pub const CLONES_DIRECTORIES: bool = false;

/// Clones file `src_name` of `src_dir` (AT_FDCWD for an absolute path) as
/// new file `name` in `dest_dir`, with the source's mode, by a reflink
/// (ioctl FICLONE), where the file system shares extents (xfs with
/// reflink=1, btrfs). Elsewhere it fails with EOPNOTSUPP or EXDEV (or
/// EINVAL on some file systems), and `auto` moves on.
pub fn clone_file(src_dir: RawFd, src_name: &CStr, dest_dir: RawFd, name: &CStr) -> io::Result<()> {
    let source = open_at(src_dir, src_name, libc::O_RDONLY, 0)?;
    let mode = std::os::unix::fs::MetadataExt::mode(&source.metadata()?);
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
    let target = open_at(dest_dir, name, flags, mode & 0o7777)?;
    // SAFETY: FICLONE takes the source fd as its argument; both are open.
    let ret = unsafe { libc::ioctl(target.as_raw_fd(), libc::FICLONE, source.as_raw_fd()) };
    if ret < 0 {
        let err = io::Error::last_os_error();
        drop(target);
        // SAFETY: valid descriptor and C string.
        unsafe { libc::unlinkat(dest_dir, name.as_ptr(), 0) };
        return Err(err);
    }
    Ok(())
}

/// openat with O_NOFOLLOW and O_CLOEXEC added.
fn open_at(dir: RawFd, name: &CStr, flags: i32, mode: u32) -> io::Result<File> {
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: valid C string; the descriptor is owned by the File below.
    let fd = check(unsafe { libc::openat(dir, name.as_ptr(), flags, mode as libc::c_uint) })?;
    // SAFETY: just opened, owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Whether renameat2(2) `flags` swap the two names.
pub fn is_exchange(flags: u32) -> bool {
    flags & libc::RENAME_EXCHANGE != 0
}

/// Detaches a mount even while files in it are open.
pub fn unmount_detached(path: &CStr) -> io::Result<()> {
    // SAFETY: valid C string.
    check(unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) }).map(drop)
}

/// rename with renameat2(2) flags (RENAME_NOREPLACE, RENAME_EXCHANGE).
pub fn rename(from: &CStr, to: &CStr, flags: u32) -> io::Result<()> {
    // SAFETY: valid C strings; AT_FDCWD makes them plain paths.
    let ret = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    };
    check(ret).map(drop)
}

pub fn fallocate(fd: libc::c_int, mode: i32, offset: u64, length: u64) -> io::Result<()> {
    // SAFETY: plain syscall on a caller-owned fd.
    let ret = unsafe { libc::fallocate(fd, mode, offset as libc::off_t, length as libc::off_t) };
    check(ret).map(drop)
}

/// Extended attribute calls that never follow a symlink.
pub fn get_xattr(path: &CStr, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid C strings; buffer pointer/length from xattr_call.
    xattr_call(buf, |ptr, len| unsafe {
        libc::lgetxattr(path.as_ptr(), name.as_ptr(), ptr, len)
    })
}

pub fn list_xattr(path: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid C string; buffer pointer/length from xattr_call.
    xattr_call(buf, |ptr, len| unsafe {
        libc::llistxattr(path.as_ptr(), ptr.cast(), len)
    })
}

pub fn set_xattr(path: &CStr, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    // SAFETY: valid C strings and value slice.
    let ret = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    check(ret).map(drop)
}

pub fn remove_xattr(path: &CStr, name: &CStr) -> io::Result<()> {
    // SAFETY: valid C strings.
    check(unsafe { libc::lremovexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}
