//! What the store answers when it cannot: one line each, naming the digest,
//! the path and the system call.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::sandbox::file_kind::FileKind;
use crate::sandbox::ownership::OwnershipError;

/// The operation an error happened in, for its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Open,
    PutDirectory,
    PutBytes,
    Capture,
    /// Making the executable variant of an entry, for an acquire.
    Executable,
    Close,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Open => "opening the content store",
            Op::PutDirectory => "put of directory",
            Op::PutBytes => "put of",
            Op::Capture => "capture of",
            Op::Executable => "executable copy of",
            Op::Close => "removing the content store",
        }
    }
}

/// A store operation that failed; nothing of it is left in the store.
#[derive(Debug)]
pub enum StoreError {
    /// A key that is not a SHA-256 digest in 64 lowercase hex digits.
    BadDigest { key: String },
    /// Content that does not hash to its digest (`path`: the captured file).
    Mismatch {
        op: Op,
        digest: String,
        path: Option<PathBuf>,
        actual: String,
    },
    /// A capture source (after following symlinks) that is no regular file.
    NotRegularFile {
        digest: String,
        path: PathBuf,
        kind: FileKind,
    },
    /// An entry larger than the store's whole bound.
    TooLarge {
        op: Op,
        digest: String,
        size: u64,
        max_bytes: u64,
    },
    /// A system call that failed on `path`.
    Io {
        op: Op,
        digest: Option<String>,
        call: &'static str,
        path: PathBuf,
        error: io::Error,
    },
    /// A predecessor's hand-off that is not this user's alone: not
    /// adopted, left where it is.
    NotOurs(OwnershipError),
}

impl StoreError {
    pub(super) fn io(
        op: Op,
        digest: Option<&str>,
        call: &'static str,
        path: &Path,
    ) -> impl FnOnce(io::Error) -> StoreError {
        let digest = digest.map(str::to_owned);
        let path = path.to_owned();
        move |error| StoreError::Io {
            op,
            digest,
            call,
            path,
            error,
        }
    }
}

/// An OS error's text without Rust's " (os error N)".
fn describe(error: &io::Error) -> String {
    match error.raw_os_error() {
        Some(code) => nix::errno::Errno::from_raw(code).desc().to_owned(),
        None => error.to_string(),
    }
}

fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::Directory => "a directory",
        FileKind::RegularFile => "a regular file",
        FileKind::Symlink => "a symlink",
        FileKind::NamedPipe => "a named pipe",
        FileKind::Socket => "a socket",
        FileKind::CharDevice => "a character device",
        FileKind::BlockDevice => "a block device",
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::BadDigest { key } => {
                // A key can be anything a client sent: show a bounded part.
                let shown: String = key.chars().take(80).collect();
                let more = if shown.len() < key.len() { "…" } else { "" };
                write!(
                    f,
                    "not a SHA-256 digest (64 lowercase hex digits): {shown:?}{more}"
                )
            }
            StoreError::Mismatch {
                op,
                digest,
                path: Some(path),
                actual,
            } => write!(
                f,
                "{} {digest}: {} hashes to {actual}",
                op.name(),
                path.display()
            ),
            StoreError::Mismatch {
                op,
                digest,
                path: None,
                actual,
            } => write!(f, "{} {digest}: the bytes hash to {actual}", op.name()),
            StoreError::NotRegularFile { digest, path, kind } => write!(
                f,
                "{} {digest}: {} is {}, not a regular file",
                Op::Capture.name(),
                path.display(),
                kind_name(*kind)
            ),
            StoreError::TooLarge {
                op,
                digest,
                size,
                max_bytes,
            } => write!(
                f,
                "{} {digest}: {size} bytes exceed the store's bound of {max_bytes} bytes",
                op.name()
            ),
            StoreError::Io {
                op,
                digest,
                call,
                path,
                error,
            } => {
                f.write_str(op.name())?;
                if let Some(digest) = digest {
                    write!(f, " {digest}")?;
                }
                write!(f, ": {call} {}: {}", path.display(), describe(error))
            }
            StoreError::NotOurs(err) => write!(
                f,
                "{}: {err}: not adopted, left where it is",
                Op::Open.name()
            ),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Io { error, .. } => Some(error),
            StoreError::NotOurs(err) => Some(err),
            _ => None,
        }
    }
}

/// The digests an acquire wanted that the store does not hold (never put,
/// or evicted), each once, in the order first asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    pub hashes: Vec<String>,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 4;
        let n = self.hashes.len();
        write!(f, "{n} digest{} missing: ", if n == 1 { "" } else { "s" })?;
        f.write_str(&self.hashes[..n.min(SHOWN)].join(", "))?;
        if n > SHOWN {
            write!(f, " and {} more", n - SHOWN)?;
        }
        Ok(())
    }
}

impl std::error::Error for Missing {}

/// Why an acquire pinned nothing.
#[derive(Debug)]
pub enum AcquireError {
    /// Some wanted digests are absent: the client must push them.
    Missing(Missing),
    /// A bad key, or an executable variant that could not be made.
    Store(StoreError),
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::Missing(missing) => missing.fmt(f),
            AcquireError::Store(err) => err.fmt(f),
        }
    }
}

impl std::error::Error for AcquireError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AcquireError::Missing(missing) => Some(missing),
            AcquireError::Store(err) => Some(err),
        }
    }
}

impl From<Missing> for AcquireError {
    fn from(missing: Missing) -> AcquireError {
        AcquireError::Missing(missing)
    }
}

impl From<StoreError> for AcquireError {
    fn from(err: StoreError) -> AcquireError {
        AcquireError::Store(err)
    }
}
