//! The native materializer: a sandbox built as real files (symlinks, hard
//! links, clones or copies) instead of served through FUSE, and torn down
//! again. The daemon, the benchmarks and the `materialize` and `rmtree`
//! subcommands all use this module.
//!
//! - [`materialize`] builds a layout under a destination, all or nothing.
//! - [`teardown`] removes what a materialization created, and nothing else.
//! - [`remove_tree`] deletes a tree like `rm -rf`; [`Trash`] does it in the
//!   background after a single rename.
//! - [`reuse`] moves a build's inputs out of a writable directory into a
//!   stash and a stash into another build, changing only the difference
//!   between their [`shape`]s.

mod create;
mod place;
mod remove;
pub mod reuse;
pub mod shape;
pub mod shape_cache;
mod trash;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) use place::{copy_file, may_fall_back};
pub use place::{Made, Method};
pub(crate) use remove::{empty_dir, remove_entry};
pub use remove::{remove_tree, remove_tree_within, Removed};
pub use trash::Trash;

use crate::sandbox::dirfd::{Anchor, DirFd};
use crate::sandbox::layout::Entry;

/// A failed step: which system call, on which path, and why.
#[derive(Debug)]
pub struct Error {
    pub syscall: &'static str,
    pub path: PathBuf,
    pub source: io::Error,
}

impl Error {
    pub fn new(syscall: &'static str, path: &Path, source: io::Error) -> Error {
        Error {
            syscall,
            path: path.to_owned(),
            source,
        }
    }

    /// A refusal that is not a system call's error.
    pub fn other(path: &Path, why: &str) -> Error {
        Error::new("check", path, io::Error::other(why.to_owned()))
    }

    fn is_denied(&self) -> bool {
        is_denied(&self.source)
    }
}

/// A refusal for lack of permission, which granting ourselves access may
/// cure.
fn is_denied(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::EACCES | libc::EPERM))
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.syscall == "check" {
            write!(f, "{:?}: {}", self.path, self.source)
        } else {
            write!(f, "{} {:?}: {}", self.syscall, self.path, self.source)
        }
    }
}

impl std::error::Error for Error {}

/// What a materialization made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Leaves made each way, indexed by `Made as usize`.
    pub made: [usize; 5],
    /// Directories created.
    pub dirs: usize,
}

impl Report {
    pub fn made(&self, how: Made) -> usize {
        self.made[how as usize]
    }

    pub fn leaves(&self) -> usize {
        self.made.iter().sum()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} directories", self.dirs)?;
        for how in Made::ALL {
            if self.made(how) > 0 {
                write!(f, ", {} by {}", self.made(how), how.name())?;
            }
        }
        Ok(())
    }
}

/// A materialized sandbox: what to remove when it is destroyed.
#[derive(Debug)]
pub struct Materialized {
    /// The destination; everything below it was created by us.
    pub root: PathBuf,
    /// Entries created inside the owner's writable directories.
    pub in_place: Vec<InPlace>,
    pub report: Report,
}

/// An entry made inside an owner's writable directory: its path below
/// that directory as pinned when the sandbox was planned. It is removed
/// through the pin, never following a symlink, so whatever the owner does
/// to the directory meanwhile cannot point the removal elsewhere.
#[derive(Clone, Debug)]
pub struct InPlace {
    pub root: Arc<Anchor>,
    pub rel: PathBuf,
}

impl InPlace {
    /// Where the entry is, for messages.
    pub fn path(&self) -> PathBuf {
        if self.rel.as_os_str().is_empty() {
            return self.root.path().to_owned();
        }
        self.root.path().join(&self.rel)
    }
}

/// How to materialize.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub method: Method,
    /// Threads creating leaves; 1 creates everything on the calling thread,
    /// 0 chooses by size (see [`PARALLEL_FROM`]).
    pub threads: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            method: Method::Auto,
            threads: 0,
        }
    }
}

/// From this many mappings on, two threads create leaves: where a second
/// thread starts to save more than it costs (tmpfs, docs/BENCHMARKS.md).
pub const PARALLEL_FROM: usize = 200;

/// Most threads ever used: more gains little on two cores, and a wide
/// fan-out thrashes APFS's metadata lock on macOS.
pub const MAX_THREADS: usize = 2;

fn thread_count(layout: &Entry, requested: usize) -> usize {
    match requested {
        0 if layout.mapping_count() >= PARALLEL_FROM => MAX_THREADS,
        0 => 1,
        n => n.min(MAX_THREADS),
    }
}

/// Builds `layout` under `dest`, which must be missing or an empty
/// directory. On error, everything created is removed again and `dest` is
/// as it was.
pub fn materialize(layout: &Entry, dest: &Path, options: Options) -> Result<Materialized, Error> {
    let created_dest = prepare_destination(dest)?;
    let threads = thread_count(layout, options.threads);
    let (record, error) = create::build(layout, dest, options.method, threads);
    match error {
        None => Ok(record),
        Some(err) => {
            if let Err(cleanup) = undo(&record, created_dest) {
                log::error!("cannot undo a failed materialization: {cleanup}");
            }
            Err(err)
        }
    }
}

/// Removes a materialized sandbox: what it created inside writable
/// directories, then its whole tree (through `trash` when given, so the
/// tree is gone at once and deleted in the background).
pub fn teardown(sandbox: &Materialized, trash: Option<&Trash>) -> Result<(), Error> {
    remove_in_place(sandbox)?;
    match trash {
        Some(trash) => trash.discard(&sandbox.root),
        None => remove_tree(&sandbox.root).map(drop),
    }
}

fn remove_in_place(sandbox: &Materialized) -> Result<(), Error> {
    // Newest first: an entry may lie inside one created before it.
    for entry in sandbox.in_place.iter().rev() {
        match remove::remove_beneath(&entry.root, &entry.rel) {
            Ok(_) => {}
            Err(err) if err.source.raw_os_error() == Some(libc::ENOENT) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

fn undo(record: &Materialized, created_dest: bool) -> Result<(), Error> {
    remove_in_place(record)?;
    if created_dest {
        remove_tree(&record.root).map(drop)
    } else {
        let dir = DirFd::open(&record.root).map_err(|e| Error::new("open", &record.root, e))?;
        remove::empty_dir(&dir, &record.root, &mut Removed::default())
    }
}

/// Checks that `dest` is missing (then creates it) or an empty directory.
/// Returns whether it was created.
fn prepare_destination(dest: &Path) -> Result<bool, Error> {
    match std::fs::symlink_metadata(dest) {
        Ok(meta) if meta.is_dir() => {
            let mut entries =
                std::fs::read_dir(dest).map_err(|e| Error::new("opendir", dest, e))?;
            if entries.next().is_some() {
                return Err(Error::other(dest, "destination is not empty"));
            }
            Ok(false)
        }
        Ok(_) => Err(Error::other(
            dest,
            "destination exists and is not a directory",
        )),
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {
            std::fs::create_dir(dest).map_err(|e| Error::new("mkdir", dest, e))?;
            Ok(true)
        }
        Err(err) => Err(Error::new("lstat", dest, err)),
    }
}
