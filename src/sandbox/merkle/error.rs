//! Why a tree cannot be walked: a directory blob missing, unreadable, or
//! not a valid REAPI directory, always with the digest it concerns.

use std::io;
use std::path::PathBuf;

/// A directory blob the source lacks, and the first path naming it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MissingDir {
    pub hash: String,
    pub size: i64,
    pub path: String,
}

/// Why a tree cannot be walked.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    /// Directory blobs the source lacks (each once, sorted by hash).
    #[error("directory blobs missing: {}", hashes(.0))]
    Missing(Vec<MissingDir>),
    /// A permanent fault of the tree.
    #[error(transparent)]
    Invalid(#[from] InvalidDirectory),
}

fn hashes(missing: &[MissingDir]) -> String {
    let hashes: Vec<&str> = missing.iter().map(|dir| dir.hash.as_str()).collect();
    hashes.join(", ")
}

/// A directory of a tree that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[error("directory {hash}: {fault}")]
pub struct InvalidDirectory {
    /// The directory's digest hash.
    pub hash: String,
    pub fault: Fault,
}

/// What is wrong with a directory blob or the entries it names.
#[derive(Debug, thiserror::Error)]
pub enum Fault {
    /// The source holds the blob but cannot give it.
    #[error(transparent)]
    Unreadable(#[from] BlobError),
    #[error("not a REAPI Directory message: {0}")]
    NotADirectoryMessage(#[source] prost::DecodeError),
    #[error("entry {name:?}: no digest")]
    NoDigest { name: String },
    #[error("entry {name:?}: negative size {size}")]
    NegativeSize { name: String, size: i64 },
    #[error("entry {name:?}: size 0, but the hash {hash:?} is not that of no bytes")]
    EmptyButHashed { name: String, hash: String },
    #[error("entry {name:?}: digest hash {hash:?} is not SHA-256 (64 lowercase hex digits)")]
    NotSha256 { name: String, hash: String },
    #[error(transparent)]
    BadName(#[from] BadName),
    #[error("symlink {name:?}: its target is empty or holds NUL")]
    BadSymlinkTarget { name: String },
    #[error("the name {name:?} appears twice")]
    NameTwice { name: String },
    /// Entries other than a caller's rule allows where the directory is
    /// (an input root that must hold one directory, say).
    #[error("holds {dirs} directories, {files} files and {symlinks} symlinks; {expected}")]
    Unexpected {
        dirs: usize,
        files: usize,
        symlinks: usize,
        /// What it must hold, in words.
        expected: &'static str,
    },
}

/// An entry name that is not one path component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the entry name {name:?} is not a single path component (empty, '.', '..', or holds '/' or \
     NUL)"
)]
pub struct BadName {
    pub name: String,
}

/// Why a source cannot give a directory blob it is asked for.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// A size no directory blob may have there.
    #[error("a directory blob of {size} bytes is out of bounds (at most {max})")]
    SizeOutOfBounds { size: i64, max: i64 },
    #[error("size 0, but the hash is not that of no bytes")]
    EmptyButHashed,
    #[error("{syscall} {path:?}: {source}")]
    Io {
        syscall: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A blob file of another length than its digest says.
    #[error("{path:?} holds {held} bytes, not the digest's {size}")]
    WrongSize { path: PathBuf, held: u64, size: i64 },
}
