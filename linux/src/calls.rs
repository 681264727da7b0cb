//! The Linux forms of the system calls whose form differs by platform.

use std::ffi::{CStr, CString};
use std::io;

use nix::errno::Errno;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// FICLONE works on regular files only: directories are walked.
pub const CLONES_DIRECTORIES: bool = false;

/// Clones file `src_name` of `src_dir` (AT_FDCWD for an absolute path) as
/// new file `name` in `dest_dir`, with the source's mode, by a reflink
/// (ioctl FICLONE), where the file system shares extents (xfs with
/// reflink=1, btrfs). Elsewhere it fails with EOPNOTSUPP or EXDEV (or
/// EINVAL on some file systems), and `auto` moves on.
pub fn clone_file(
    src_dir: BorrowedFd<'_>,
    src_name: &CStr,
    dest_dir: BorrowedFd<'_>,
    name: &CStr,
) -> io::Result<()> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let source = nix::fcntl::openat(src_dir, src_name, flags, Mode::empty())?;
    clone_open_file(source.as_fd(), dest_dir, name)
}

/// Clones the regular file open as `source` (for reading) as new file
/// `name` in `dest_dir`, with the source's mode, as [`clone_file`] does:
/// for a caller that opened (and checked) the source itself. A failed
/// clone leaves no file behind.
pub fn clone_open_file(
    source: BorrowedFd<'_>,
    dest_dir: BorrowedFd<'_>,
    name: &CStr,
) -> io::Result<()> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    let mode = Mode::from_bits_truncate(nix::sys::stat::fstat(source)?.st_mode & 0o7777);
    let create =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let target = nix::fcntl::openat(dest_dir, name, create, mode)?;
    // SAFETY: FICLONE takes the source descriptor as its integer argument;
    // both descriptors are open for the whole call.
    let ret = unsafe { libc::ioctl(target.as_raw_fd(), libc::FICLONE, source.as_raw_fd()) };
    if ret < 0 {
        let err = io::Error::last_os_error();
        drop(target);
        let _ = nix::unistd::unlinkat(dest_dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
        return Err(err);
    }
    Ok(())
}

/// FUSE_DEV_IOC_BACKING_CLOSE: _IOW(229, 2, uint32_t).
const BACKING_CLOSE: libc::c_ulong = (1 << 30) | (4 << 16) | (229 << 8) | 2;

/// Closes passthrough backing id `id` made on the FUSE connection `device`.
pub fn close_backing(device: BorrowedFd<'_>, id: u32) -> io::Result<()> {
    // SAFETY: the ioctl reads one u32 that lives for the call.
    Errno::result(unsafe { libc::ioctl(device.as_raw_fd(), BACKING_CLOSE, &id) })?;
    Ok(())
}

/// Whether renameat2(2) `flags` swap the two names.
pub fn is_exchange(flags: u32) -> bool {
    flags & libc::RENAME_EXCHANGE != 0
}

/// Unmounts, failing with EBUSY while the mount is in use.
pub fn unmount(path: &std::path::Path) -> io::Result<()> {
    Ok(nix::mount::umount2(path, nix::mount::MntFlags::empty())?)
}

/// Detaches a mount even while files in it are open.
pub fn unmount_detached(path: &std::path::Path) -> io::Result<()> {
    Ok(nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH)?)
}

/// renameat2(2) with its flags (RENAME_NOREPLACE, RENAME_EXCHANGE).
pub fn rename_at(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
    flags: u32,
) -> nix::Result<()> {
    let flags = nix::fcntl::RenameFlags::from_bits(flags).ok_or(nix::errno::Errno::EINVAL)?;
    nix::fcntl::renameat2(from_dir, from, to_dir, to, flags)
}

/// The path through which calls without an fd form reach the object an
/// O_PATH descriptor pins (the magic link resolves to that very object,
/// a symlink included, and never further).
fn pinned_path(pinned: BorrowedFd<'_>) -> CString {
    CString::new(format!("/proc/self/fd/{}", pinned.as_raw_fd())).expect("digits hold no NUL")
}

/// Truncates regular file `name` of `dir` to `size`, never through a
/// symlink and never opening anything but a regular file (a FIFO or a
/// device swapped in would block or act on open).
pub fn truncate_at(dir: BorrowedFd<'_>, name: &CStr, size: u64) -> nix::Result<()> {
    use nix::fcntl::OFlag;
    let pinned = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let st = nix::sys::stat::fstat(&pinned)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(nix::errno::Errno::EINVAL);
    }
    let file = nix::fcntl::open(
        pinned_path(pinned.as_fd()).as_c_str(),
        OFlag::O_WRONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
        nix::sys::stat::Mode::empty(),
    )?;
    nix::unistd::ftruncate(&file, size as libc::off_t)
}

/// mknodat(2): `mode` holds the type and the permission bits.
pub fn mknod_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u32) -> nix::Result<()> {
    use nix::sys::stat::{Mode, SFlag};
    let kind = SFlag::from_bits_truncate(mode) & SFlag::S_IFMT;
    nix::sys::stat::mknodat(dir, name, kind, Mode::from_bits_truncate(mode), rdev.into())
}

/// Truncates the regular file `fd` holds (opened for reading, and perhaps
/// deleted since) by reopening it for writing through its magic link.
pub fn truncate_fd(fd: BorrowedFd<'_>, size: u64) -> nix::Result<()> {
    let st = nix::sys::stat::fstat(fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(nix::errno::Errno::EINVAL);
    }
    let file = reopen_fd(fd, nix::fcntl::OFlag::O_WRONLY)?;
    nix::unistd::ftruncate(&file, size as libc::off_t)
}

/// Opens the very object `fd` holds (perhaps renamed or deleted since)
/// again with `flags`, through its magic link: the access check is the
/// object's own and no path is walked.
pub fn reopen_fd(fd: BorrowedFd<'_>, flags: nix::fcntl::OFlag) -> nix::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    nix::fcntl::open(
        pinned_path(fd).as_c_str(),
        flags | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
        nix::sys::stat::Mode::empty(),
    )
}

pub fn fallocate(fd: BorrowedFd<'_>, mode: i32, offset: u64, length: u64) -> io::Result<()> {
    let mode = nix::fcntl::FallocateFlags::from_bits_retain(mode);
    Ok(nix::fcntl::fallocate(
        fd,
        mode,
        offset as libc::off_t,
        length as libc::off_t,
    )?)
}

/// Extended attributes of the object an O_PATH descriptor pins.
pub fn get_xattr(pinned: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    let path = pinned_path(pinned);
    // SAFETY: valid C strings; buffer pointer/length from xattr_call.
    xattr_call(buf, |ptr, len| unsafe {
        libc::getxattr(path.as_ptr(), name.as_ptr(), ptr, len)
    })
}

pub fn list_xattr(pinned: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    let path = pinned_path(pinned);
    // SAFETY: valid C string; buffer pointer/length from xattr_call.
    xattr_call(buf, |ptr, len| unsafe {
        libc::listxattr(path.as_ptr(), ptr.cast(), len)
    })
}

pub fn set_xattr(pinned: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    let path = pinned_path(pinned);
    // SAFETY: valid C strings and value slice.
    let ret = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    Errno::result(ret)?;
    Ok(())
}

pub fn remove_xattr(pinned: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let path = pinned_path(pinned);
    // SAFETY: valid C strings.
    Errno::result(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) })?;
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
    use nix::fcntl::RenameFlags;
    Ok(nix::fcntl::renameat2(
        from_dir,
        from,
        to_dir,
        to,
        RenameFlags::RENAME_NOREPLACE,
    )?)
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

/// Keeps this process's heap in small pages. The allocator asks for huge
/// ones; a daemon whose requests allocate and free a few MiB each then
/// faults in and zeroes 2 MiB pages again and again (11% of `serve`'s CPU
/// on a replay). Inherited across exec, so only for daemons, which run no
/// action.
pub fn no_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only.
    let _ignored_where_unsupported = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// Asks for short scheduler slices for the calling thread: on EEVDF
/// (Linux 6.12 and later) a waking thread with a shorter slice than the
/// running one may preempt it, so a request thread woken while actions
/// hold every CPU answers at once rather than after an action's slice.
/// Its share of the CPU is unchanged; older kernels ignore the slice.
/// Threads it starts get the default slice (background work should not
/// preempt actions). Best effort.
pub fn short_slices() {
    const SLICE_NS: u64 = 100_000; // the least the kernel accepts
    const SCHED_FLAG_RESET_ON_FORK: u64 = 1;
    // sched_setattr sets the nice value too: keep the thread's own (a
    // backend started under `nice` stays there).
    // SAFETY: getpriority takes integers only; on Linux, PRIO_PROCESS
    // with 0 is the calling thread.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let attr = libc::sched_attr {
        size: size_of::<libc::sched_attr>() as u32,
        sched_policy: libc::SCHED_OTHER as u32,
        sched_flags: SCHED_FLAG_RESET_ON_FORK,
        sched_nice: nice,
        sched_priority: 0,
        sched_runtime: SLICE_NS,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: sched_setattr reads `attr`, which outlives the call; pid 0
    // is the calling thread.
    let _ignored_where_unsupported = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            0,
            &attr as *const libc::sched_attr,
            0,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's scheduler slice in ns, where the kernel shows
    /// it (`/proc/thread-self/sched` needs CONFIG_SCHED_DEBUG).
    fn slice() -> Option<u64> {
        let sched = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
        let line = sched.lines().find(|l| l.starts_with("se.slice"))?;
        line.rsplit(':').next()?.trim().parse().ok()
    }

    /// Whether this kernel takes custom slices (6.12 and later).
    fn takes_custom_slices() -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut numbers = release
            .split(['.', '-'])
            .map(|n| n.parse::<u32>().unwrap_or(0));
        (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0)) >= (6, 12)
    }

    fn nice() -> i32 {
        // SAFETY: as in short_slices.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
    }

    #[test]
    fn short_slices_hold_for_the_thread_and_not_for_threads_it_starts() {
        if !takes_custom_slices() || slice().is_none() {
            eprintln!("skipped: this kernel takes or shows no custom slice");
            return;
        }
        let (mine, its, niceness) = std::thread::spawn(|| {
            // A thread's own nice value stays (raising it needs no
            // privilege).
            // SAFETY: setpriority on the calling thread, integers only.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 5) };
            short_slices();
            (slice(), std::thread::spawn(slice).join().unwrap(), nice())
        })
        .join()
        .unwrap();
        assert_eq!(niceness, 5, "short_slices changed the nice value");
        assert_eq!(mine, Some(100_000));
        assert_ne!(its, Some(100_000), "a started thread kept the short slice");
        assert_ne!(slice(), Some(100_000), "the test's own thread changed");
    }
}
