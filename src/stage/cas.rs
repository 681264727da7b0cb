//! A CAS in NativeLink's filesystem-store layout: every blob (file content
//! and serialized `Directory` alike) is the file `<content_path>/d/<hash>-
//! <size>`, written once and never changed in place.
//!
//! Executable inputs cannot share the CAS file (its mode has no execute
//! bit, and changing it would change every link to it), so each digest
//! needed as an executable gets one 0555 variant of ours, made once by a
//! clone or a copy created with that mode: no chmod, ever.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::sandbox::dirfd::{open_file_at, DirFd};
use crate::sandbox::merkle::{BlobError, DirectorySource};

/// The subdirectory holding blobs by digest.
const DIGESTS: &str = "d";

// The empty blob (every empty file, and the empty `Directory`): REAPI
// servers answer it without storing it (NativeLink's filesystem store never
// writes a zero-byte blob), so it is never read from the CAS.
use crate::sandbox::merkle::EMPTY_SHA256;

/// Our own empty file, 0444, in the executables directory: what empty
/// files of a root link to.
const EMPTY_FILE: &CStr = c".empty";

/// Directory blobs larger than this are refused rather than read (a
/// `Directory` of a million entries is ~100 MiB).
const MAX_DIRECTORY_BLOB: i64 = 256 << 20;

pub struct Cas {
    content_path: PathBuf,
    digests: DirFd,
    /// Our 0555 variants, `<hash>-<size>`, on the staging file system.
    executables: DirFd,
    executables_path: PathBuf,
    made_executable: Mutex<HashSet<Box<str>>>,
}

/// The blob's file name: `<hash>-<size>`, NUL-terminated for the `*at`
/// calls. The hash was checked as 64 hex digits, so it is a safe name.
pub fn blob_name(hash: &str, size: i64) -> CString {
    CString::new(blob_file_name(hash, size)).expect("hex digits and a number hold no NUL")
}

fn blob_file_name(hash: &str, size: i64) -> String {
    format!("{hash}-{size}")
}

impl Cas {
    /// Opens the CAS at `content_path` (which must hold `d/`), keeping
    /// executable variants in `executables` (made if missing; it must be
    /// on the file system inputs are staged on, for hard links to it).
    pub fn open(content_path: &Path, executables: &Path) -> io::Result<Cas> {
        let digests_path = content_path.join(DIGESTS);
        let digests = DirFd::open(&digests_path).map_err(|err| {
            io::Error::new(
                err.kind(),
                format!("open the CAS's blob directory {digests_path:?}: {err}"),
            )
        })?;
        std::fs::create_dir_all(executables).map_err(|err| {
            io::Error::new(
                err.kind(),
                format!("mkdir for executable variants {executables:?}: {err}"),
            )
        })?;
        let executables_dir = DirFd::open(executables)?;
        for (name, mode) in [(EMPTY_FILE, 0o444), (&*blob_name(EMPTY_SHA256, 0), 0o555)] {
            match executables_dir.create_file(name, mode) {
                Err(err) if err.kind() != io::ErrorKind::AlreadyExists => {
                    return Err(io::Error::new(
                        err.kind(),
                        format!(
                            "create {:?}: {err}",
                            executables.join(name.to_str().expect("ASCII"))
                        ),
                    ))
                }
                _ => {}
            }
        }
        Ok(Cas {
            content_path: content_path.to_owned(),
            digests,
            executables: executables_dir,
            executables_path: executables.to_owned(),
            made_executable: Mutex::default(),
        })
    }

    /// Where the file of blob `hash`/`size` (as an executable or not) is
    /// linked from: a directory and a name in it. The 0555 variant is made
    /// first if needed; `ENOENT` if the CAS lacks the blob. The empty blob
    /// is ours, never looked for in the CAS.
    pub fn source(&self, hash: &str, size: i64, executable: bool) -> io::Result<(&DirFd, CString)> {
        if size == 0 {
            let name = if executable {
                blob_name(EMPTY_SHA256, 0)
            } else {
                EMPTY_FILE.to_owned()
            };
            return Ok((&self.executables, name));
        }
        let name = blob_name(hash, size);
        if executable {
            Ok((self.executable(&name, size)?, name))
        } else {
            Ok((&self.digests, name))
        }
    }

    /// The path of the file [`Cas::source`] names, for a view that maps
    /// it rather than linking it: checked to be there (`ENOENT` if not).
    pub fn source_path(&self, hash: &str, size: i64, executable: bool) -> io::Result<PathBuf> {
        let (dir, name) = self.source(hash, size, executable)?;
        let ours = std::ptr::eq(dir, &self.executables);
        if !ours {
            // Ours were made (and checked) by `source`.
            self.digests.stat_at(&name)?;
        }
        let name = name.into_string().expect("an ASCII name");
        Ok(if ours {
            self.executables_path.join(name)
        } else {
            self.content_path.join(DIGESTS).join(name)
        })
    }

    pub fn content_path(&self) -> &Path {
        &self.content_path
    }

    pub fn digests(&self) -> &DirFd {
        &self.digests
    }

    pub fn blob_path(&self, hash: &str, size: i64) -> PathBuf {
        self.content_path
            .join(DIGESTS)
            .join(blob_file_name(hash, size))
    }

    /// The directory holding the 0555 variant of blob `name`, made first
    /// if it is not there yet. `ENOENT` if the CAS lacks the blob.
    ///
    /// Variants are not synced to disk: an fsync per executable made a
    /// cold build's staging much slower than the stock worker's, and Bazel
    /// 4.2.3 marks every input executable (docs/BENCHMARKS.md). One left short by a crash is found
    /// by its size, once per process, and made again.
    fn executable(&self, name: &CString, size: i64) -> io::Result<&DirFd> {
        let key = name.to_str().expect("an ASCII name");
        if self.made_executable.lock().contains(key) {
            return Ok(&self.executables);
        }
        match self.executables.stat_at(name) {
            Ok(st) if st.st_size == size => {}
            Ok(_) => {
                self.executables.unlink_at(name, false)?;
                self.make_executable(name)?;
            }
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => self.make_executable(name)?,
            Err(err) => return Err(err),
        }
        self.made_executable.lock().insert(key.into());
        Ok(&self.executables)
    }

    /// Copies (or clones, where `copy_file_range` can share extents) blob
    /// `name` into a new 0555 file, then links it into place, so that a
    /// variant is either whole or absent, and once there is never replaced
    /// (roots linked to it stay links to the variant) when stagers race.
    fn make_executable(&self, name: &CString) -> io::Result<()> {
        let mut source = open_file_at(self.digests.as_fd(), name)?;
        let temp = CString::new(format!(
            ".{}.{}.{:?}",
            name.to_str().expect("ASCII"),
            std::process::id(),
            std::thread::current().id()
        ))
        .expect("no NUL");
        let _ = self.executables.unlink_at(&temp, false);
        let mut target = self.executables.create_file(&temp, 0o555)?;
        let copied = io::copy(&mut source, &mut target).map(drop);
        drop(target);
        let linked = copied.and_then(|()| {
            match self
                .executables
                .link_at(self.executables.as_fd(), &temp, name)
            {
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => Ok(()),
                other => other,
            }
        });
        let _ = self.executables.unlink_at(&temp, false);
        if let Err(err) = linked {
            return Err(io::Error::new(
                err.kind(),
                format!(
                    "executable variant {:?}: {err}",
                    self.executables_path.join(name.to_str().expect("ASCII"))
                ),
            ));
        }
        Ok(())
    }
}

impl DirectorySource for Cas {
    fn directory_blob(&self, hash: &str, size: i64) -> Result<Option<Arc<[u8]>>, BlobError> {
        if !(0..=MAX_DIRECTORY_BLOB).contains(&size) {
            return Err(BlobError::SizeOutOfBounds {
                size,
                max: MAX_DIRECTORY_BLOB,
            });
        }
        if size == 0 {
            if hash != EMPTY_SHA256 {
                return Err(BlobError::EmptyButHashed);
            }
            return Ok(Some(Arc::from(&[][..])));
        }
        let name = blob_name(hash, size);
        let io = |syscall, source| BlobError::Io {
            syscall,
            path: self.blob_path(hash, size),
            source,
        };
        let mut file = match open_file_at(self.digests.as_fd(), &name) {
            Ok(file) => file,
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(err) => return Err(io("open", err)),
        };
        let mut blob = Vec::with_capacity(size as usize);
        file.read_to_end(&mut blob).map_err(|err| io("read", err))?;
        if blob.len() as i64 != size {
            return Err(BlobError::WrongSize {
                path: self.blob_path(hash, size),
                held: blob.len() as u64,
                size,
            });
        }
        Ok(Some(blob.into()))
    }
}
