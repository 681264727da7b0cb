//! Input roots for remote-execution workers: the library a worker (such
//! as NativeLink's) calls to lay out an action's REAPI input root from its
//! CAS, and to tear it down afterwards. It is the core's third user, after
//! the sandboxfs stream and `actionfs serve`.
//!
//! ```no_run
//! use actionfs::stage::{Mechanism, Stager};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let stager = Stager::open("/var/cas/content".as_ref(), "/var/work/.exec".as_ref(), Mechanism::Auto)?;
//! let root = stager.stage("4a5b...", 142, "/var/work/action-1".as_ref(), &["out/bin/tool"])?;
//! // ... run the action in root.path() ...
//! stager.tear_down(root)?;
//! # Ok(()) }
//! ```
//!
//! The tree comes from the core's [`crate::sandbox::merkle`] walk, so each
//! `Directory` is decoded and its names checked once per digest, however
//! many actions name it. Files are hard links to the CAS blob (or to its
//! 0555 variant when executable: no chmod walk), reflinks, or copies;
//! symlink nodes are made as symlinks with their target verbatim and are
//! never followed. Every directory made is the worker's and writable, and
//! the parents of declared outputs are made too. A missing blob or a bad
//! name is an error naming it, and nothing of the root is left behind.

mod build;
mod cas;
mod fuse_roots;
mod recycle;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use cas::Cas;
pub use fuse_roots::FuseRoots;
pub use recycle::Spares;

use crate::sandbox::materialize::{self, remove_tree};
use crate::sandbox::merkle::{Trees, WalkError};

/// How files of the input root are made from CAS blobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// A hard link to the blob (same file system only).
    Hardlink,
    /// A copy-on-write clone (FICLONE: xfs with reflink, btrfs).
    Clone,
    /// A full copy.
    Copy,
    /// Per file, a hard link, else a clone, else a copy.
    Auto,
}

impl Mechanism {
    pub fn parse(text: &str) -> Option<Mechanism> {
        Some(match text {
            "hardlink" => Mechanism::Hardlink,
            "clone" => Mechanism::Clone,
            "copy" => Mechanism::Copy,
            "auto" => Mechanism::Auto,
            _ => return None,
        })
    }
}

/// Why an input root was not staged. Nothing of it is left on disk.
#[derive(Debug)]
pub enum StageError {
    /// Blobs the CAS lacks: `(what, hash, size, where in the tree)`, with
    /// `what` "directory" or "file".
    Missing(Vec<MissingBlob>),
    /// The tree or a request argument is malformed.
    Invalid(String),
    /// A system call failed.
    Io(materialize::Error),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingBlob {
    pub what: &'static str,
    pub hash: String,
    pub size: i64,
    /// The path in the input root that names it ("" for the root).
    pub path: String,
}

impl fmt::Display for StageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StageError::Missing(missing) => {
                write!(f, "the CAS lacks {} blob(s):", missing.len())?;
                for blob in missing.iter().take(10) {
                    write!(
                        f,
                        " {} {}-{} (at {:?});",
                        blob.what, blob.hash, blob.size, blob.path
                    )?;
                }
                if missing.len() > 10 {
                    write!(f, " and {} more", missing.len() - 10)?;
                }
                Ok(())
            }
            StageError::Invalid(why) => write!(f, "{why}"),
            StageError::Io(err) => write!(f, "{err}"),
        }
    }
}

impl std::error::Error for StageError {}

impl From<materialize::Error> for StageError {
    fn from(err: materialize::Error) -> StageError {
        StageError::Io(err)
    }
}

/// A staged input root, to be torn down with [`Stager::tear_down`].
#[derive(Debug)]
pub struct Staged {
    root: PathBuf,
    /// The tree it holds: the root directory's digest.
    hash: Box<str>,
    size: i64,
    /// Files and directories made (not those a recycled root kept; for
    /// a root in the mount, its files and the directories made for it).
    pub files: usize,
    pub dirs: usize,
    /// The root's sandbox in [`FuseRoots`]' mount, if it is served there.
    fuse_id: Option<Box<str>>,
}

impl Staged {
    fn new(at: &Path, hash: &str, size: i64) -> Staged {
        Staged {
            root: at.to_owned(),
            hash: hash.into(),
            size,
            files: 0,
            dirs: 0,
            fuse_id: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Whether the root is served by the stager's FUSE mount (its path
    /// is then a symlink into it).
    pub fn is_fuse(&self) -> bool {
        self.fuse_id.is_some()
    }
}

/// Stages input roots from one CAS. Shared by every action of a worker:
/// its cache of checked directories is what later actions reuse.
pub struct Stager {
    trees: Trees<Cas>,
    how: build::How,
    spares: Option<Spares>,
    fuse: Option<Arc<FuseRoots>>,
}

impl Stager {
    /// A stager for the CAS at `content_path` (NativeLink's filesystem
    /// store `content_path`), keeping executable variants in
    /// `executables`, on the file system roots are staged on.
    pub fn open(
        content_path: &Path,
        executables: &Path,
        mechanism: Mechanism,
    ) -> std::io::Result<Stager> {
        Ok(Stager {
            trees: Trees::new(Cas::open(content_path, executables)?),
            how: build::How {
                mechanism,
                threads: 0,
            },
            spares: None,
            fuse: None,
        })
    }

    /// Threads placing the files of a fresh root: 1 or 2; 0 (the default)
    /// uses two from 200 files on: faster with a core to spare, slower
    /// with the other core busy (docs/BENCHMARKS.md).
    pub fn threads(mut self, threads: usize) -> Stager {
        self.how.threads = threads;
        self
    }

    /// Keeps up to `max` torn-down roots in `dir` (on the staging file
    /// system) and makes new roots from them by the difference of the two
    /// trees (see [`recycle`](self)). Hard links only: with clones or
    /// copies a root cannot be checked cheaply, so none is kept.
    pub fn recycling(mut self, dir: &Path, max: usize) -> std::io::Result<Stager> {
        if matches!(self.how.mechanism, Mechanism::Hardlink | Mechanism::Auto) && max > 0 {
            self.spares = Some(Spares::new(dir, max)?);
        }
        Ok(self)
    }

    /// Serves roots of as many files as `roots` wants from its FUSE mount
    /// ([`FuseRoots`]): staging one costs a `stat` per file and a `mkdir`
    /// per directory, and its action then looks each name up through
    /// FUSE. The mount goes with the last stager holding it.
    pub fn fuse_roots(mut self, roots: Arc<FuseRoots>) -> Stager {
        self.fuse = Some(roots);
        self
    }

    /// How many torn-down roots are kept for reuse now.
    pub fn spare_count(&self) -> usize {
        self.spares.as_ref().map_or(0, Spares::len)
    }

    pub fn cas(&self) -> &Cas {
        self.trees.source()
    }

    /// Lays out the input root of directory digest `hash`/`size` at `at`
    /// (missing, its parent there, or an empty directory), with the parent
    /// directory of every path in `outputs` (relative to the root) made as
    /// well. On error `at` is as it was.
    pub fn stage(
        &self,
        hash: &str,
        size: i64,
        at: &Path,
        outputs: &[&str],
    ) -> Result<Staged, StageError> {
        if !actionfs_protocol::backend::digest::is_sha256_hex(hash) {
            return Err(StageError::Invalid(format!(
                "root digest {hash:?} is not SHA-256 (64 lowercase hex digits)"
            )));
        }
        let walked = match self.trees.walk("", hash, size) {
            Ok(walked) => walked,
            Err(WalkError::Invalid(why)) => return Err(StageError::Invalid(why.to_string())),
            Err(WalkError::Missing(missing)) => {
                return Err(StageError::Missing(
                    missing
                        .into_iter()
                        .map(|dir| MissingBlob {
                            what: "directory",
                            hash: dir.hash,
                            size: dir.size,
                            path: dir.path,
                        })
                        .collect(),
                ))
            }
        };
        let parents = build::output_parents(&walked, outputs)
            .map_err(|err| StageError::Invalid(err.to_string()))?;
        if let Some(fuse) = &self.fuse {
            if fuse.wants(walked.file_count()) {
                let staged = Staged::new(at, hash, size);
                return fuse.stage(self.cas(), self.how.threads, walked, &parents, staged);
            }
        }
        if let Some(spares) = &self.spares {
            if let Some(made) =
                self.stage_from_spare(spares, &walked, &parents, Staged::new(at, hash, size))
            {
                return made;
            }
        }
        build::build(
            self.cas(),
            self.how,
            &walked,
            &parents,
            Staged::new(at, hash, size),
        )
    }

    /// Removes a staged root and everything the action left in it (or,
    /// when recycling, keeps it as a spare once that is removed).
    pub fn tear_down(&self, staged: Staged) -> Result<(), StageError> {
        if let (Some(fuse), Some(id)) = (&self.fuse, &staged.fuse_id) {
            return fuse.tear_down(&staged, id);
        }
        match &self.spares {
            Some(spares) => self.recycle(spares, &staged).map(drop),
            None => remove_tree(&staged.root)
                .map(drop)
                .map_err(StageError::from),
        }
    }
}
