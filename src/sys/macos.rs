//! macOS forms of the platform-specific calls.

use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;

use super::{check, xattr_call};

/// From <sys/clonefile.h>: do not follow a symlink in the source.
const CLONE_NOFOLLOW: u32 = 0x0001;

/// clonefile(2) clones a whole directory tree in one call.
pub const CLONES_DIRECTORIES: bool = true;

/// Clones `src_name` of `src_dir` (AT_FDCWD for an absolute path) as `name`
/// in `dest_dir` with clonefile(2) on APFS: a file, or a directory with
/// everything in it. Modes come along with the clone, so no permission
/// walk is needed afterwards.
pub fn clone_file(src_dir: RawFd, src_name: &CStr, dest_dir: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: valid C strings and descriptors.
    let ret = unsafe {
        libc::clonefileat(
            src_dir,
            src_name.as_ptr(),
            dest_dir,
            name.as_ptr(),
            CLONE_NOFOLLOW,
        )
    };
    check(ret).map(drop)
}

/// macOS FUSE passes no rename flags; nothing is ever an exchange.
pub fn is_exchange(_flags: u32) -> bool {
    false
}

/// The closest macOS has to a lazy unmount.
pub fn unmount_detached(path: &CStr) -> io::Result<()> {
    // SAFETY: valid C string.
    check(unsafe { libc::unmount(path.as_ptr(), libc::MNT_FORCE) }).map(drop)
}

pub fn rename(from: &CStr, to: &CStr, flags: u32) -> io::Result<()> {
    if flags != 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: valid C strings.
    check(unsafe { libc::rename(from.as_ptr(), to.as_ptr()) }).map(drop)
}

pub fn fallocate(_fd: libc::c_int, _mode: i32, _offset: u64, _length: u64) -> io::Result<()> {
    Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
}

pub fn get_xattr(path: &CStr, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid C strings; buffer pointer/length from xattr_call.
    xattr_call(buf, |ptr, len| unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            ptr,
            len,
            0,
            libc::XATTR_NOFOLLOW,
        )
    })
}

pub fn list_xattr(path: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid C string; buffer pointer/length from xattr_call.
    xattr_call(buf, |ptr, len| unsafe {
        libc::listxattr(path.as_ptr(), ptr.cast(), len, libc::XATTR_NOFOLLOW)
    })
}

pub fn set_xattr(path: &CStr, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    // SAFETY: valid C strings and value slice.
    let ret = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
            flags | libc::XATTR_NOFOLLOW,
        )
    };
    check(ret).map(drop)
}

pub fn remove_xattr(path: &CStr, name: &CStr) -> io::Result<()> {
    // SAFETY: valid C strings.
    check(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr(), libc::XATTR_NOFOLLOW) })
        .map(drop)
}
