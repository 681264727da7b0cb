//! Linux forms of the platform-specific calls.

use std::ffi::CStr;
use std::io;

use super::{check, xattr_call};

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
