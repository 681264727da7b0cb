//! Listing an open directory: each entry's name, type and inode number.
//!
//! On Linux, `getdents64` straight into a buffer on the descriptor itself.
//! glibc's `fdopendir` over a duplicate cost a `fcntl` to duplicate, an
//! `fstat` and two more `fcntl`s to open, an `lseek` to rewind and a
//! `close`: six calls around the two `getdents64` of a small directory.
//! Removing a sandbox lists each of its directories, so those were a
//! third of the system calls of a small sandbox's Create and Destroy.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::BorrowedFd;

use crate::sandbox::file_kind::FileKind;

/// One entry: its name, its type (`None` where the file system does not
/// say, DT_UNKNOWN: ask with `fstatat`) and its inode number.
pub type Entry = (CString, Option<FileKind>, u64);

fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

#[cfg(target_os = "linux")]
pub use linux::Entries;
#[cfg(not(target_os = "linux"))]
pub use portable::Entries;

#[cfg(target_os = "linux")]
mod linux {
    use std::collections::VecDeque;

    use rustix::fs::{FileType, RawDir, SeekFrom};

    use super::*;

    /// Bytes asked of each `getdents64` (glibc asks as many).
    const BATCH_BYTES: usize = 32 * 1024;

    /// A directory's entries, read from its descriptor, which is rewound
    /// when this is dropped so that the next listing starts from the start.
    pub struct Entries<'fd> {
        dir: BorrowedFd<'fd>,
        buf: Vec<u8>,
    }

    impl<'fd> Entries<'fd> {
        pub(in crate::sandbox::dirfd) fn new(dir: BorrowedFd<'fd>) -> io::Result<Entries<'fd>> {
            Ok(Entries {
                dir,
                buf: Vec::with_capacity(BATCH_BYTES),
            })
        }

        /// Calls `visit` with each entry's name and type (not `.` or `..`),
        /// without copying names, until it returns false.
        pub fn visit(
            &mut self,
            mut visit: impl FnMut(&CStr, Option<FileKind>) -> bool,
        ) -> io::Result<()> {
            let mut raw = RawDir::new(self.dir, self.buf.spare_capacity_mut());
            while let Some(entry) = raw.next() {
                let entry = entry?;
                let name = entry.file_name();
                if is_dot(name) {
                    continue;
                }
                if !visit(name, kind_of(entry.file_type())) {
                    break;
                }
            }
            Ok(())
        }

        /// Iterates over the entries, skipping `.` and `..`: one
        /// `getdents64` at a time, so entries may be removed as they come.
        pub fn iter(&mut self) -> impl Iterator<Item = io::Result<Entry>> + use<'_, 'fd> {
            let mut batch = VecDeque::new();
            let mut done = false;
            std::iter::from_fn(move || loop {
                if let Some(entry) = batch.pop_front() {
                    return Some(Ok(entry));
                }
                if done {
                    return None;
                }
                match self.read_batch(&mut batch) {
                    Ok(more) => done = !more,
                    Err(err) => {
                        done = true;
                        return Some(Err(err));
                    }
                }
            })
        }

        /// Appends one `getdents64`'s entries to `batch`; false at the end.
        fn read_batch(&mut self, batch: &mut VecDeque<Entry>) -> io::Result<bool> {
            let mut raw = RawDir::new(self.dir, self.buf.spare_capacity_mut());
            loop {
                let Some(entry) = raw.next() else {
                    return Ok(false);
                };
                let entry = entry?;
                let name = entry.file_name();
                if !is_dot(name) {
                    batch.push_back((name.to_owned(), kind_of(entry.file_type()), entry.ino()));
                }
                if raw.is_buffer_empty() {
                    return Ok(true);
                }
            }
        }
    }

    impl Drop for Entries<'_> {
        fn drop(&mut self) {
            // A failed rewind shows as an empty next listing of this
            // descriptor; nothing reads one after a failure here.
            let _ = rustix::fs::seek(self.dir, SeekFrom::Start(0));
        }
    }

    fn kind_of(file_type: FileType) -> Option<FileKind> {
        Some(match file_type {
            FileType::Directory => FileKind::Directory,
            FileType::RegularFile => FileKind::RegularFile,
            FileType::Symlink => FileKind::Symlink,
            FileType::Fifo => FileKind::NamedPipe,
            FileType::Socket => FileKind::Socket,
            FileType::CharacterDevice => FileKind::CharDevice,
            FileType::BlockDevice => FileKind::BlockDevice,
            FileType::Unknown => return None,
        })
    }
}

#[cfg(not(target_os = "linux"))]
mod portable {
    use std::marker::PhantomData;
    use std::os::fd::{AsFd, OwnedFd};

    use super::*;

    /// A directory's entries, read through `fdopendir` on a duplicate of
    /// its descriptor (whose drop rewinds the shared offset).
    pub struct Entries<'fd> {
        dir: nix::dir::Dir,
        _fd: PhantomData<BorrowedFd<'fd>>,
    }

    impl<'fd> Entries<'fd> {
        pub(in crate::sandbox::dirfd) fn new(dir: BorrowedFd<'fd>) -> io::Result<Entries<'fd>> {
            let dup: OwnedFd = dir.as_fd().try_clone_to_owned()?;
            Ok(Entries {
                dir: nix::dir::Dir::from_fd(dup)?,
                _fd: PhantomData,
            })
        }

        /// Calls `visit` with each entry's name and type (not `.` or `..`),
        /// without copying names, until it returns false.
        pub fn visit(
            &mut self,
            mut visit: impl FnMut(&CStr, Option<FileKind>) -> bool,
        ) -> io::Result<()> {
            for entry in self.dir.iter() {
                let entry = entry?;
                let name = entry.file_name();
                if is_dot(name) {
                    continue;
                }
                if !visit(name, entry.file_type().map(kind_of)) {
                    break;
                }
            }
            Ok(())
        }

        /// Iterates over the entries, skipping `.` and `..`.
        pub fn iter(&mut self) -> impl Iterator<Item = io::Result<Entry>> + use<'_, 'fd> {
            self.dir.iter().filter_map(|entry| match entry {
                Err(err) => Some(Err(err.into())),
                Ok(entry) => {
                    let name = entry.file_name();
                    if is_dot(name) {
                        return None;
                    }
                    let kind = entry.file_type().map(kind_of);
                    #[allow(clippy::unnecessary_cast)]
                    Some(Ok((name.to_owned(), kind, entry.ino() as u64)))
                }
            })
        }
    }

    fn kind_of(kind: nix::dir::Type) -> FileKind {
        use nix::dir::Type;
        match kind {
            Type::Directory => FileKind::Directory,
            Type::File => FileKind::RegularFile,
            Type::Symlink => FileKind::Symlink,
            Type::Fifo => FileKind::NamedPipe,
            Type::Socket => FileKind::Socket,
            Type::CharacterDevice => FileKind::CharDevice,
            Type::BlockDevice => FileKind::BlockDevice,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::os::unix::ffi::OsStrExt;

    use crate::sandbox::dirfd::DirFd;
    use crate::sandbox::file_kind::FileKind;

    /// Every entry of a directory larger than one `getdents64`, typed,
    /// with its inode number, and again from the start on the same
    /// descriptor (after a full listing and after one stopped early).
    #[test]
    fn lists_every_entry_with_its_type_and_again_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut want = BTreeMap::new();
        // Long names: more than one 32 KiB getdents64 batch.
        for n in 0..600 {
            let name = format!("{n:0>120}");
            std::fs::write(dir.path().join(&name), "").unwrap();
            want.insert(name, FileKind::RegularFile);
        }
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        want.insert("sub".into(), FileKind::Directory);
        std::os::unix::fs::symlink("x", dir.path().join("link")).unwrap();
        want.insert("link".into(), FileKind::Symlink);
        let fd = DirFd::open(dir.path()).unwrap();
        let listed = |fd: &DirFd| -> BTreeMap<String, FileKind> {
            let mut listing = fd.entries().unwrap();
            listing
                .iter()
                .map(|entry| {
                    let (name, kind, ino) = entry.unwrap();
                    let name = String::from_utf8(name.into_bytes()).unwrap();
                    let st = std::fs::symlink_metadata(dir.path().join(&name)).unwrap();
                    assert_eq!(ino, std::os::unix::fs::MetadataExt::ino(&st), "{name}");
                    let kind = kind.unwrap_or_else(|| FileKind::from_std(st.file_type()));
                    (name, kind)
                })
                .collect()
        };
        assert_eq!(listed(&fd), want);
        let mut seen = 0;
        fd.entries()
            .unwrap()
            .visit(|name, _| {
                assert!(!matches!(name.to_bytes(), b"." | b".."));
                seen += 1;
                seen < 3
            })
            .unwrap();
        assert_eq!(seen, 3);
        let mut visited = Vec::new();
        fd.entries()
            .unwrap()
            .visit(|name, _| {
                visited.push(std::ffi::OsStr::from_bytes(name.to_bytes()).to_owned());
                true
            })
            .unwrap();
        assert_eq!(visited.len(), want.len());
        assert_eq!(listed(&fd), want);
    }
}
