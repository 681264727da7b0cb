//! An open directory and the `*at` system calls relative to it, so that a
//! tree is built and removed without resolving a path string per entry.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::sys::check;

/// What `getdents` says an entry is, without a `stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryType {
    Dir,
    Symlink,
    File,
    Other,
    /// The file system does not say (DT_UNKNOWN): ask with `fstatat`.
    Unknown,
}

pub fn c_name(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// An open directory (O_DIRECTORY | O_NOFOLLOW: never a symlink to one).
pub struct DirFd(OwnedFd);

impl DirFd {
    pub fn open(path: &Path) -> io::Result<DirFd> {
        Self::open_raw(libc::AT_FDCWD, &c_name(path.as_os_str())?)
    }

    pub fn open_at(&self, name: &CStr) -> io::Result<DirFd> {
        Self::open_raw(self.fd(), name)
    }

    fn open_raw(dir: RawFd, name: &CStr) -> io::Result<DirFd> {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: valid C string; the fd is owned by the result.
        let fd = check(unsafe { libc::openat(dir, name.as_ptr(), flags) })?;
        // SAFETY: fd was just opened and belongs to nobody else.
        Ok(DirFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    pub fn mkdir_at(&self, name: &CStr, mode: u32) -> io::Result<()> {
        // SAFETY: valid C string.
        check(unsafe { libc::mkdirat(self.fd(), name.as_ptr(), mode as libc::mode_t) }).map(drop)
    }

    pub fn symlink_at(&self, target: &CStr, name: &CStr) -> io::Result<()> {
        // SAFETY: valid C strings.
        check(unsafe { libc::symlinkat(target.as_ptr(), self.fd(), name.as_ptr()) }).map(drop)
    }

    /// Hard-links `source_name` of `source_dir` as `name` here (the link
    /// itself if it is a symlink).
    pub fn link_at(&self, source_dir: RawFd, source_name: &CStr, name: &CStr) -> io::Result<()> {
        // SAFETY: valid C strings; flags 0 does not follow symlinks.
        check(unsafe {
            libc::linkat(
                source_dir,
                source_name.as_ptr(),
                self.fd(),
                name.as_ptr(),
                0,
            )
        })
        .map(drop)
    }

    /// Creates a new file (never replacing one) for writing.
    pub fn create_file(&self, name: &CStr, mode: u32) -> io::Result<File> {
        let flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: valid C string; the fd is owned by the File.
        let fd =
            check(unsafe { libc::openat(self.fd(), name.as_ptr(), flags, mode as libc::c_uint) })?;
        // SAFETY: fd was just opened and belongs to nobody else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    pub fn unlink_at(&self, name: &CStr, is_dir: bool) -> io::Result<()> {
        let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: valid C string.
        check(unsafe { libc::unlinkat(self.fd(), name.as_ptr(), flags) }).map(drop)
    }

    /// `fstatat` without following a symlink.
    pub fn stat_at(&self, name: &CStr) -> io::Result<libc::stat> {
        // SAFETY: zeroed stat is a valid out-parameter; valid C string.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        check(unsafe {
            libc::fstatat(self.fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW)
        })?;
        Ok(st)
    }

    /// Adds owner read, write and search permission, so entries can be
    /// listed and removed.
    pub fn make_owner_writable(&self) -> io::Result<()> {
        // SAFETY: zeroed stat is a valid out-parameter; plain fstat/fchmod.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        check(unsafe { libc::fstat(self.fd(), &mut st) })?;
        let mode = st.st_mode | libc::S_IRWXU;
        check(unsafe { libc::fchmod(self.fd(), mode) }).map(drop)
    }

    /// The directory's entries (without `.` and `..`), read with `getdents`
    /// through a duplicate of the descriptor.
    pub fn entries(&self) -> io::Result<Entries> {
        // SAFETY: dup of a valid fd; fdopendir takes ownership of the dup.
        let dup = check(unsafe { libc::fcntl(self.fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
        let dir = unsafe { libc::fdopendir(dup) };
        if dir.is_null() {
            let err = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so the dup is still ours to close.
            unsafe { libc::close(dup) };
            return Err(err);
        }
        // SAFETY: the new directory stream starts wherever the shared offset
        // is; rewind so that every listing sees every entry.
        unsafe { libc::rewinddir(dir) };
        Ok(Entries { dir })
    }
}

/// Opens an existing file of `dir` (AT_FDCWD for an absolute name) for
/// reading, not through a symlink.
pub fn open_file_at(dir: RawFd, name: &CStr) -> io::Result<File> {
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: valid C string; the fd is owned by the File.
    let fd = check(unsafe { libc::openat(dir, name.as_ptr(), flags) })?;
    // SAFETY: fd was just opened and belongs to nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Target of symlink `name` of `dir` (AT_FDCWD for an absolute name).
pub fn readlink_at(dir: RawFd, name: &CStr) -> io::Result<CString> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: valid C string and a buffer of buf.len() bytes.
    let len = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if len < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(len as usize);
    CString::new(buf).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A directory stream; yields `(name, type)` pairs.
pub struct Entries {
    dir: *mut libc::DIR,
}

impl Iterator for Entries {
    type Item = io::Result<(CString, EntryType)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            // readdir reports the end and errors alike with NULL; errno
            // tells them apart.
            set_errno(0);
            // SAFETY: self.dir is a valid stream until drop.
            let entry = unsafe { libc::readdir(self.dir) };
            if entry.is_null() {
                let err = io::Error::last_os_error();
                return match err.raw_os_error() {
                    Some(0) | None => None,
                    Some(_) => Some(Err(err)),
                };
            }
            // SAFETY: readdir returned a valid entry with a NUL-terminated name.
            let (name, d_type) =
                unsafe { (CStr::from_ptr((*entry).d_name.as_ptr()), (*entry).d_type) };
            let bytes = name.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            let kind = match d_type {
                libc::DT_DIR => EntryType::Dir,
                libc::DT_LNK => EntryType::Symlink,
                libc::DT_REG => EntryType::File,
                libc::DT_UNKNOWN => EntryType::Unknown,
                _ => EntryType::Other,
            };
            return Some(Ok((name.to_owned(), kind)));
        }
    }
}

impl Drop for Entries {
    fn drop(&mut self) {
        // SAFETY: the stream is valid and closed exactly once.
        unsafe { libc::closedir(self.dir) };
    }
}

// SAFETY: the stream is used by one thread at a time (it is not Sync).
unsafe impl Send for Entries {}

/// The type of an entry from `fstatat` when `getdents` did not say.
pub fn type_from_mode(mode: libc::mode_t) -> EntryType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => EntryType::Dir,
        libc::S_IFLNK => EntryType::Symlink,
        libc::S_IFREG => EntryType::File,
        _ => EntryType::Other,
    }
}

#[cfg(target_os = "linux")]
fn set_errno(value: i32) {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = value };
}

#[cfg(target_os = "macos")]
fn set_errno(value: i32) {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__error() = value };
}
