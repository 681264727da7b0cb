//! macOS: clonefile(2) on APFS, which copies on write and can clone a whole
//! directory tree in one call. Modes come along with the clone, so no
//! permission walk is needed afterwards.

use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;

use super::dirfd::DirFd;

/// From <sys/clonefile.h>: do not follow a symlink in the source.
const CLONE_NOFOLLOW: u32 = 0x0001;

/// clonefile(2) clones a whole directory tree in one call.
pub const CLONES_DIRECTORIES: bool = true;

/// Clones `src_name` of `src_dir` (AT_FDCWD for an absolute path) as `name`
/// in `dest`: a file, or a directory with everything in it.
pub fn clone_file(src_dir: RawFd, src_name: &CStr, dest: &DirFd, name: &CStr) -> io::Result<()> {
    // SAFETY: valid C strings and descriptors.
    let ret = unsafe {
        libc::clonefileat(
            src_dir,
            src_name.as_ptr(),
            dest.fd(),
            name.as_ptr(),
            CLONE_NOFOLLOW,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
