//! The macOS forms of the system calls whose form differs by platform.

use std::ffi::CStr;
use std::io;

use nix::errno::Errno;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

/// From <sys/clonefile.h>: do not follow a symlink in the source.
const CLONE_NOFOLLOW: u32 = 0x0001;

/// clonefile(2) clones a whole directory tree in one call.
pub const CLONES_DIRECTORIES: bool = true;

/// Clones `src_name` of `src_dir` (AT_FDCWD for an absolute path) as `name`
/// in `dest_dir` with clonefile(2) on APFS: a file, or a directory with
/// everything in it. Modes come along with the clone, so no permission
/// walk is needed afterwards.
pub fn clone_file(
    src_dir: BorrowedFd<'_>,
    src_name: &CStr,
    dest_dir: BorrowedFd<'_>,
    name: &CStr,
) -> io::Result<()> {
    // SAFETY: valid C strings and descriptors, borrowed for the call.
    let ret = unsafe {
        libc::clonefileat(
            src_dir.as_raw_fd(),
            src_name.as_ptr(),
            dest_dir.as_raw_fd(),
            name.as_ptr(),
            CLONE_NOFOLLOW,
        )
    };
    Errno::result(ret)?;
    Ok(())
}

/// Clones the regular file open as `source` as new file `name` in
/// `dest_dir` with fclonefileat(2) on APFS, with the source's mode, as
/// [`clone_file`] does: for a caller that opened (and checked) the source
/// itself.
pub fn clone_open_file(
    source: BorrowedFd<'_>,
    dest_dir: BorrowedFd<'_>,
    name: &CStr,
) -> io::Result<()> {
    // SAFETY: a valid C string and descriptors, borrowed for the call.
    let ret = unsafe {
        libc::fclonefileat(
            source.as_raw_fd(),
            dest_dir.as_raw_fd(),
            name.as_ptr(),
            CLONE_NOFOLLOW,
        )
    };
    Errno::result(ret)?;
    Ok(())
}

/// macOS FUSE has no passthrough, so no backing id is ever made.
pub fn close_backing(_device: BorrowedFd<'_>, _id: u32) -> io::Result<()> {
    Ok(())
}

/// macOS FUSE passes no rename flags; nothing is ever an exchange.
pub fn is_exchange(_flags: u32) -> bool {
    false
}

/// Unmounts, failing with EBUSY while the mount is in use.
pub fn unmount(path: &std::path::Path) -> io::Result<()> {
    Ok(nix::mount::unmount(path, nix::mount::MntFlags::empty())?)
}

/// The closest macOS has to a lazy unmount.
pub fn unmount_detached(path: &std::path::Path) -> io::Result<()> {
    Ok(nix::mount::unmount(path, nix::mount::MntFlags::MNT_FORCE)?)
}

/// renameat; macOS FUSE passes no rename flags.
pub fn rename_at(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
    flags: u32,
) -> nix::Result<()> {
    if flags != 0 {
        return Err(nix::errno::Errno::EINVAL);
    }
    nix::fcntl::renameat(from_dir, from, to_dir, to)
}

/// Truncates regular file `name` of `dir` to `size`, never through a
/// symlink; a non-regular file is refused after opening it without
/// blocking.
pub fn truncate_at(dir: BorrowedFd<'_>, name: &CStr, size: u64) -> nix::Result<()> {
    use nix::fcntl::OFlag;
    let file = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_WRONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let st = nix::sys::stat::fstat(&file)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(nix::errno::Errno::EINVAL);
    }
    nix::unistd::ftruncate(&file, size as libc::off_t)
}

/// mknodat(2) (nix has no form of it for macOS): `mode` holds the type
/// and the permission bits.
pub fn mknod_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u32) -> nix::Result<()> {
    // SAFETY: valid descriptor and C string.
    let ret = unsafe {
        libc::mknodat(
            dir.as_raw_fd(),
            name.as_ptr(),
            mode as libc::mode_t,
            rdev as libc::dev_t,
        )
    };
    nix::errno::Errno::result(ret).map(drop)
}

/// Truncating a file opened only for reading needs its path, which macOS
/// does not offer for a descriptor in a way that survives deletion.
pub fn truncate_fd(_fd: BorrowedFd<'_>, _size: u64) -> nix::Result<()> {
    Err(nix::errno::Errno::EBADF)
}

/// macOS has no magic links to reopen a descriptor's object through.
pub fn reopen_fd(_fd: BorrowedFd<'_>, _flags: nix::fcntl::OFlag) -> nix::Result<OwnedFd> {
    Err(nix::errno::Errno::EOPNOTSUPP)
}

pub fn fallocate(_fd: BorrowedFd<'_>, _mode: i32, _offset: u64, _length: u64) -> io::Result<()> {
    Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
}

/// Extended attributes of the object a descriptor holds open (opened
/// with O_SYMLINK, so a symlink is itself).
pub fn get_xattr(pinned: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid descriptor and C string; buffer pointer/length from
    // xattr_call.
    xattr_call(buf, |ptr, len| unsafe {
        libc::fgetxattr(pinned.as_raw_fd(), name.as_ptr(), ptr, len, 0, 0)
    })
}

pub fn list_xattr(pinned: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid descriptor; buffer pointer/length from xattr_call.
    xattr_call(buf, |ptr, len| unsafe {
        libc::flistxattr(pinned.as_raw_fd(), ptr.cast(), len, 0)
    })
}

pub fn set_xattr(pinned: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    // SAFETY: valid descriptor, C string and value slice.
    let ret = unsafe {
        libc::fsetxattr(
            pinned.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
            flags,
        )
    };
    Errno::result(ret)?;
    Ok(())
}

pub fn remove_xattr(pinned: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: valid descriptor and C string.
    Errno::result(unsafe { libc::fremovexattr(pinned.as_raw_fd(), name.as_ptr(), 0) })?;
    Ok(())
}

/// Renames `from` in `from_dir` to `to` in `to_dir` unless `to` exists
/// (EEXIST then): a move that can never replace what is there.
pub fn rename_noreplace(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
) -> io::Result<()> {
    // SAFETY: valid C strings and descriptors, borrowed for the call.
    let ret = unsafe {
        libc::renameatx_np(
            from_dir.as_raw_fd(),
            from.as_ptr(),
            to_dir.as_raw_fd(),
            to.as_ptr(),
            libc::RENAME_EXCL,
        )
    };
    Errno::result(ret)?;
    Ok(())
}

/// Runs a get/list-style xattr call: with an empty buffer it returns the
/// size needed.
fn xattr_call(
    buf: &mut [u8],
    call: impl Fn(*mut libc::c_void, usize) -> isize,
) -> io::Result<usize> {
    let ptr = if buf.is_empty() {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr().cast()
    };
    Ok(Errno::result(call(ptr, buf.len()))? as usize)
}

/// Transparent huge pages are Linux's; nothing to turn off.
pub fn no_huge_pages() {}

/// EEVDF slices are Linux's; the default scheduling stays.
pub fn short_slices() {}
