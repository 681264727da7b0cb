//! Default places: an input file nobody pushed content for is read where
//! the build already staged it, `exec_root/<tree path>`.
//!
//! That path may be a chain of symlinks (the exec root links to the source
//! tree, and a source file may itself be a relative symlink): the digest
//! is of the file the chain leads to, so that file is what a sandbox must
//! show, never the link, whose relative target would dangle inside a
//! sandbox. And the file may have changed since the build hashed it: a
//! size that differs from the digest's is caught here, so that a digest
//! is never served with other bytes than its own (bytes of the same size
//! are the build's to keep still, as with any staged input).
//!
//! `serve` captures most default places into its store instead (hashed
//! as copied, so any change is caught); this look is for the rest, and
//! [`Looks`] remembers what it found while nothing changed there.

mod handed;
mod remembered;
#[cfg(target_os = "linux")]
mod watch;

pub use handed::FilesFound;
pub use remembered::{Batch, Looked, Looks};

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::sandbox::dirfd::{kind_of, stat_at};
use crate::sandbox::file_kind::FileKind;
use crate::sandbox::store::StoreError;

/// Where an input file's bytes are, as found at its default place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// The default place is the file itself.
    Here,
    /// The default place is a symlink chain leading to this file.
    Elsewhere(PathBuf),
    /// Not to be served: why (missing, not a file, or changed).
    Refused(String),
}

/// Looks at the default places of files `names` of directory `dir` (a
/// host path, followed wherever it leads), each expected to hold
/// `size` bytes: one `fstatat` per file, a path walk more for a symlink.
pub fn look<'a>(dir: &Path, files: impl IntoIterator<Item = (&'a str, i64)>) -> Vec<Place> {
    let mut files = files.into_iter().peekable();
    if files.peek().is_none() {
        // Every file has content elsewhere: nothing to open.
        return Vec::new();
    }
    let opened = nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map(File::from);
    // One buffer for every name: no allocation per file.
    let mut c_name = Vec::with_capacity(256);
    files
        .map(|(name, size)| match &opened {
            Ok(fd) => look_at(fd, dir, name, size, &mut c_name),
            Err(err) => Refused(format!(
                "missing from its default place: open {}: {err}",
                dir.display()
            )),
        })
        .collect()
}

use Place::Refused;

/// Looks at `name` of `dir` (open as `dir_fd`); `c_name` is a buffer for
/// its C form. The path is made only for a symlink or a refusal.
fn look_at(dir_fd: &File, dir: &Path, name: &str, size: i64, c_name: &mut Vec<u8>) -> Place {
    c_name.clear();
    c_name.extend_from_slice(name.as_bytes());
    c_name.push(0);
    let st = CStr::from_bytes_with_nul(c_name)
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
        .and_then(|c| stat_at(dir_fd.as_fd(), c));
    let st = match st {
        Ok(st) => st,
        Err(err) => {
            return Refused(format!(
                "missing from its default place: lstat {}: {err}",
                dir.join(name).display()
            ))
        }
    };
    match kind_of(&st) {
        FileKind::RegularFile if st.st_size == size => Place::Here,
        FileKind::RegularFile => checked_size(&dir.join(name), st.st_size, size, Place::Here),
        FileKind::Symlink => follow(&dir.join(name), size),
        kind => Refused(format!(
            "its default place {} is a {}, not a file",
            dir.join(name).display(),
            kind.describe()
        )),
    }
}

/// The file a symlink chain at `path` leads to.
fn follow(path: &Path, size: i64) -> Place {
    let target = match std::fs::canonicalize(path) {
        Ok(target) => target,
        Err(err) => {
            return Refused(format!(
                "missing from its default place: {} is a symlink that leads nowhere: {err}",
                path.display()
            ))
        }
    };
    match std::fs::metadata(&target) {
        Ok(meta) if meta.is_file() => {
            let found = Place::Elsewhere(target.clone());
            checked_size(&target, meta.len() as i64, size, found)
        }
        Ok(_) => Refused(format!(
            "its default place {} leads to {}, which is not a file",
            path.display(),
            target.display()
        )),
        Err(err) => Refused(format!(
            "missing from its default place: stat {}: {err}",
            target.display()
        )),
    }
}

// st_size is i64 on Linux and macOS alike.
fn checked_size(path: &Path, actual: i64, expected: i64, found: Place) -> Place {
    if actual == expected {
        found
    } else {
        Refused(format!(
            "changed since Bazel hashed it: {} holds {actual} bytes, its digest says {expected}",
            path.display()
        ))
    }
}

/// Why a default place could not be captured into the store, in the
/// words a look would use: bytes that do not hash to the digest changed
/// since Bazel hashed them; anything else is not there to be served.
pub fn capture_refusal(err: &StoreError) -> String {
    match err {
        StoreError::Mismatch { .. } => format!("changed since Bazel hashed it: {err}"),
        StoreError::NotRegularFile { .. } => format!("its default place is not a file: {err}"),
        StoreError::Io { error, .. } if error.kind() == io::ErrorKind::NotFound => {
            format!("missing from its default place: {err}")
        }
        _ => format!("its default place could not be captured: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn files_links_chains_and_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        std::fs::create_dir_all(src.join("in")).unwrap();
        std::fs::write(src.join("in/f"), b"12345").unwrap();
        symlink("../src/in/f", src.join("rel")).unwrap();
        symlink("rel", src.join("chain")).unwrap();
        symlink(src.join("in/f"), src.join("abs")).unwrap();
        symlink("nowhere", src.join("dangling")).unwrap();
        symlink("in", src.join("dirlink")).unwrap();
        // The exec root reaches the sources through a directory link.
        let exec = tmp.path().join("exec");
        std::fs::create_dir(&exec).unwrap();
        symlink(&src, exec.join("ws")).unwrap();

        let real = std::fs::canonicalize(src.join("in/f")).unwrap();
        let found = look(
            &exec.join("ws"),
            [
                ("in", 5),
                ("rel", 5),
                ("chain", 5),
                ("abs", 5),
                ("dangling", 5),
                ("dirlink", 5),
                ("absent", 5),
                ("rel", 4),
            ],
        );
        assert!(matches!(&found[0], Refused(why) if why.contains("is a directory")));
        assert_eq!(found[1], Place::Elsewhere(real.clone()));
        assert_eq!(found[2], Place::Elsewhere(real.clone()));
        assert_eq!(found[3], Place::Elsewhere(real));
        assert!(matches!(&found[4], Refused(why) if why.contains("leads nowhere")));
        assert!(matches!(&found[5], Refused(why) if why.contains("not a file")));
        assert!(matches!(&found[6], Refused(why) if why.contains("missing")));
        assert!(matches!(&found[7], Refused(why) if why.contains("changed since Bazel hashed it")));
        let here = look(&exec.join("ws/in"), [("f", 5), ("f", 6)]);
        assert_eq!(here[0], Place::Here);
        assert!(matches!(&here[1], Refused(why) if why.contains("holds 5 bytes")));
        let gone = look(&exec.join("ws/none"), [("f", 1)]);
        assert!(matches!(&gone[0], Refused(why) if why.contains("missing")));
    }
}
