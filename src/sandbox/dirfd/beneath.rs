//! Opening a path below a directory without following any symlink in it.
//!
//! An underlying tree can be changed by whoever may write it while the
//! daemon serves it: a directory the kernel has cached as a directory can
//! be replaced by a symlink into a tree its writer may not read. So below
//! a mapping's root nothing is resolved by a path walk that follows
//! symlinks. On Linux 5.6+ one `openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` does it; where `openat2`
//! is missing (ENOSYS, also what container seccomp profiles answer) the
//! path is walked one component at a time with `O_NOFOLLOW | O_DIRECTORY`.
//! macOS has `O_NOFOLLOW_ANY`.
//!
//! Errors say what was found instead of a directory: ELOOP for a symlink,
//! ENOTDIR for another non-directory, ENOENT for nothing. EXDEV (an escape
//! from the directory) cannot occur: relative paths come from names the
//! kernel gave us, which are never `..`.

use std::ffi::CStr;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

/// Opens `rel` (names separated by `/`, none of them `.` or `..`) below
/// `dir` with `flags`, following no symlink on the way nor in the last
/// component (with O_PATH, a symlink there is opened as itself).
pub fn open_beneath(
    dir: BorrowedFd<'_>,
    rel: &CStr,
    flags: OFlag,
    mode: Mode,
) -> io::Result<OwnedFd> {
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    one_call_or_walk(dir, rel, flags, mode)
        .map_err(|err| final_symlink_is_eloop(dir, rel, flags, err))
}

/// The platform's one-call resolution, or the walk where it has none.
fn one_call_or_walk(
    dir: BorrowedFd<'_>,
    rel: &CStr,
    flags: OFlag,
    mode: Mode,
) -> io::Result<OwnedFd> {
    crate::sys::open_beneath(dir, rel, flags, mode)
        .unwrap_or_else(|| walk_beneath(dir, rel, flags, mode))
}

/// O_DIRECTORY | O_NOFOLLOW on a final symlink says ENOTDIR; say ELOOP, as
/// for a symlink on the way, so that a planted symlink always reads alike.
fn final_symlink_is_eloop(
    dir: BorrowedFd<'_>,
    rel: &CStr,
    flags: OFlag,
    err: io::Error,
) -> io::Error {
    if err.raw_os_error() == Some(libc::ENOTDIR)
        && flags.contains(OFlag::O_DIRECTORY)
        && last_is_symlink(dir, rel)
    {
        io::Error::from_raw_os_error(libc::ELOOP)
    } else {
        err
    }
}

/// Whether the last component of `rel` below `dir` is a symlink (checked
/// only on the error path: the directory holding it is opened again).
fn last_is_symlink(dir: BorrowedFd<'_>, rel: &CStr) -> bool {
    let (parent, last) = split_last(rel.to_bytes());
    let holder = if parent.is_empty() {
        None
    } else {
        let Ok(parent) = std::ffi::CString::new(parent) else {
            return false;
        };
        match one_call_or_walk(dir, &parent, super::PATH_DIR_FLAGS, Mode::empty()) {
            Ok(fd) => Some(fd),
            Err(_) => return false,
        }
    };
    is_symlink_at(opened_or(&holder, dir), last)
}

/// `rel` split at its last `/`: the directories leading to the last
/// component (empty if none), and that component.
fn split_last(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(at) => (&rel[..at], &rel[at + 1..]),
        None => (&b""[..], rel),
    }
}

/// The directory opened so far, or `dir` if none was.
fn opened_or<'a>(opened: &'a Option<OwnedFd>, dir: BorrowedFd<'a>) -> BorrowedFd<'a> {
    use std::os::fd::AsFd;
    opened.as_ref().map_or(dir, |fd| fd.as_fd())
}

/// Whether entry `name` of `dir` is a symlink.
fn is_symlink_at(dir: BorrowedFd<'_>, name: &[u8]) -> bool {
    nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK)
}

/// The portable walk: every component but the last opened as a directory
/// with O_NOFOLLOW, relative to the one before.
pub fn walk_beneath(
    dir: BorrowedFd<'_>,
    rel: &CStr,
    flags: OFlag,
    mode: Mode,
) -> io::Result<OwnedFd> {
    let (parents, last) = split_last(rel.to_bytes());
    let mut current: Option<OwnedFd> = None;
    for component in parents.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        let from = opened_or(&current, dir);
        let next = nix::fcntl::openat(from, component, super::PATH_DIR_FLAGS, Mode::empty());
        current = Some(next.map_err(|err| symlink_is_eloop(from, component, err))?);
    }
    let from = opened_or(&current, dir);
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    nix::fcntl::openat(from, last, flags, mode)
        .map_err(|err| final_symlink_is_eloop(dir, rel, flags, err.into()))
}

/// O_DIRECTORY | O_NOFOLLOW fails on a symlink with ENOTDIR; say ELOOP, as
/// openat2 does, so that both paths report a planted symlink alike.
fn symlink_is_eloop(dir: BorrowedFd<'_>, name: &[u8], err: nix::errno::Errno) -> nix::errno::Errno {
    if err == nix::errno::Errno::ENOTDIR && is_symlink_at(dir, name) {
        nix::errno::Errno::ELOOP
    } else {
        err
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn open(dir: &OwnedFd, rel: &str, flags: OFlag) -> io::Result<OwnedFd> {
        let rel = std::ffi::CString::new(rel).unwrap();
        open_beneath(dir.as_fd(), &rel, flags, Mode::empty())
    }

    fn walk(dir: &OwnedFd, rel: &str, flags: OFlag) -> io::Result<OwnedFd> {
        let rel = std::ffi::CString::new(rel).unwrap();
        walk_beneath(dir.as_fd(), &rel, flags, Mode::empty())
    }

    #[test]
    fn symlinks_and_non_directories_on_the_way_are_refused_by_both_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/f"), "f").unwrap();
        std::fs::create_dir(root.join("secret")).unwrap();
        std::fs::write(root.join("secret/s"), "s").unwrap();
        std::os::unix::fs::symlink(root.join("secret"), root.join("a/link")).unwrap();
        std::os::unix::fs::symlink("f", root.join("a/b/lf")).unwrap();
        let base = nix::fcntl::open(
            &root.join("a"),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        for resolve in [open, walk] {
            assert!(resolve(&base, "b/f", OFlag::O_RDONLY).is_ok());
            let errno = |rel: &str| {
                resolve(&base, rel, OFlag::O_RDONLY)
                    .unwrap_err()
                    .raw_os_error()
            };
            assert_eq!(errno("link/s"), Some(libc::ELOOP), "symlink on the way");
            assert_eq!(errno("link"), Some(libc::ELOOP), "symlink at the end");
            assert_eq!(errno("b/lf"), Some(libc::ELOOP), "symlink to a file");
            assert_eq!(errno("b/f/x"), Some(libc::ENOTDIR), "a file on the way");
            assert_eq!(errno("b/none"), Some(libc::ENOENT));
            assert_eq!(
                resolve(&base, "link", super::super::PATH_DIR_FLAGS)
                    .unwrap_err()
                    .raw_os_error(),
                Some(libc::ELOOP),
                "a final symlink where a directory is wanted"
            );
            // O_PATH | O_NOFOLLOW opens a final symlink as itself.
            #[cfg(target_os = "linux")]
            {
                let link = resolve(&base, "b/lf", OFlag::O_PATH).unwrap();
                let st = nix::sys::stat::fstat(&link).unwrap();
                assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFLNK);
            }
        }
    }
}
