//! The file type of every mapping's underlying path, found with one
//! `lstat` each, as cheaply as the kernel allows.
//!
//! Bazel lists an action's inputs in exec-path order, so consecutive
//! mappings mostly share a parent directory. Each parent is opened once
//! (O_PATH) and its entries are `fstatat`ed by name, which skips walking
//! the whole path again for every input; that walk was most of the cost of
//! a large CreateSandbox. Large requests are split across two threads.

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::file_kind::FileKind;

/// From this many mappings on, two threads share the work (one thread
/// wins below it: starting one costs about as much as 200 lstats).
const PARALLEL_FROM: usize = 512;

/// The file type of each path, or the `lstat` error, in order.
pub fn lstat_kinds(paths: &[&Path]) -> Vec<std::io::Result<FileKind>> {
    if paths.len() < PARALLEL_FROM {
        return lstat_run(paths);
    }
    let (first, second) = paths.split_at(paths.len() / 2);
    std::thread::scope(|scope| {
        let helper = scope.spawn(|| lstat_run(second));
        let mut kinds = lstat_run(first);
        kinds.extend(helper.join().expect("lstat helper thread panicked"));
        kinds
    })
}

fn lstat_run(paths: &[&Path]) -> Vec<std::io::Result<FileKind>> {
    let mut parent = ParentCache::default();
    paths.iter().map(|path| parent.lstat(path)).collect()
}

/// The directory the previous path was in, kept open.
#[derive(Default)]
struct ParentCache {
    path: PathBuf,
    fd: Option<OwnedFd>,
}

impl ParentCache {
    fn lstat(&mut self, path: &Path) -> std::io::Result<FileKind> {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return std::fs::symlink_metadata(path).map(|m| FileKind::from_std(m.file_type()));
        };
        if self.fd.is_none() || self.path != dir {
            self.fd = None;
            self.fd = Some(open_dir(dir)?);
            self.path = dir.to_owned();
        }
        let fd = self.fd.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        fstatat_kind(fd.expect("opened above"), name.as_bytes())
    }
}

fn c_string(bytes: &[u8]) -> std::io::Result<CString> {
    CString::new(bytes).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

/// Opening a directory only to name things in it: O_PATH where it exists.
#[cfg(target_os = "linux")]
const DIR_FLAGS: libc::c_int = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
#[cfg(not(target_os = "linux"))]
const DIR_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;

fn open_dir(dir: &Path) -> std::io::Result<OwnedFd> {
    let c = c_string(dir.as_os_str().as_bytes())?;
    // SAFETY: valid C string; the fd is owned by the OwnedFd below.
    let fd = unsafe { libc::open(c.as_ptr(), DIR_FLAGS) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstatat_kind(dir: RawFd, name: &[u8]) -> std::io::Result<FileKind> {
    let c = c_string(name)?;
    // SAFETY: an all-zero stat is valid; fstatat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, C string and out pointer.
    if unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // st_mode is u16 on macOS.
    #[allow(clippy::unnecessary_cast)]
    Ok(FileKind::from_mode(st.st_mode as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_errors_come_back_in_order_on_both_paths() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let link = dir.path().join("l");
        std::os::unix::fs::symlink("f", &link).unwrap();
        let missing = dir.path().join("missing");
        let under_file = file.join("child");
        let root = PathBuf::from("/");
        for copies in [1, PARALLEL_FROM] {
            let mut paths: Vec<&Path> = Vec::new();
            for _ in 0..copies {
                paths.extend([
                    file.as_path(),
                    link.as_path(),
                    missing.as_path(),
                    under_file.as_path(),
                    dir.path(),
                    root.as_path(),
                ]);
            }
            let kinds = lstat_kinds(&paths);
            assert_eq!(kinds.len(), paths.len());
            for chunk in kinds.chunks(6) {
                assert_eq!(chunk[0].as_ref().unwrap(), &FileKind::RegularFile);
                assert_eq!(chunk[1].as_ref().unwrap(), &FileKind::Symlink);
                assert_eq!(
                    chunk[2].as_ref().unwrap_err().raw_os_error(),
                    Some(libc::ENOENT)
                );
                assert_eq!(
                    chunk[3].as_ref().unwrap_err().raw_os_error(),
                    Some(libc::ENOTDIR)
                );
                assert_eq!(chunk[4].as_ref().unwrap(), &FileKind::Directory);
                assert_eq!(chunk[5].as_ref().unwrap(), &FileKind::Directory);
            }
        }
    }
}
