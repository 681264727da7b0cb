//! The few system calls whose form differs between Linux and macOS, behind
//! one interface: `linux.rs` and `macos.rs` hold the platform forms.
//! Everything else uses calls both platforms share.

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub use linux::*;

#[cfg(target_os = "macos")]
mod macos;
#[cfg(target_os = "macos")]
pub use macos::*;

use std::io;

/// Turns a libc return value (-1 on failure) into a result with the errno.
pub fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The same for calls returning a size (`ssize_t`).
fn check_size(ret: isize) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// Runs a get/list-style xattr call: with an empty buffer it returns the
/// size needed.
pub fn xattr_call(
    buf: &mut [u8],
    call: impl Fn(*mut libc::c_void, usize) -> isize,
) -> io::Result<usize> {
    let ptr = if buf.is_empty() {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr().cast()
    };
    check_size(call(ptr, buf.len()))
}
