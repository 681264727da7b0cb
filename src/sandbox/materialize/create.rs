//! Building a sandbox's layout as real files under a destination.
//!
//! The calling thread walks the layout depth first and creates directories
//! with `mkdirat` relative to their open parent, so each directory is made
//! once and no path is resolved twice. Leaves (files, symlinks) are
//! gathered per directory and created relative to that directory's
//! descriptor, inline or by a small pool of workers. Only the descriptors of
//! the directories being filled stay open.
//!
//! Read-only mapped directories are copied entry by entry from `getdents`
//! (a `stat` only when the file system does not give the type). A writable
//! mapped directory becomes a symlink to itself, so writes land in it;
//! nested mappings inside it are created in place, and recorded so that
//! teardown removes exactly what was created and nothing of the owner's.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;

use parking_lot::Mutex;
use std::thread::ScopedJoinHandle;

use super::place::{place, Leaf, LeafKind, Made, Method};
use super::{Error, InPlace, Materialized, Report};
use crate::sandbox::dirfd::{c_name, kind_of, DirFd};
use crate::sandbox::file_kind::FileKind;
use crate::sandbox::layout::Entry;

/// Mode of directories the materializer makes up.
const DIR_MODE: u32 = 0o755;

/// Directories whose leaves wait for a worker; bounds open descriptors.
const QUEUE_DEPTH: usize = 64;

/// One directory's leaves, for a worker.
struct Batch {
    dir: Arc<DirFd>,
    dir_path: PathBuf,
    leaves: Vec<Leaf>,
}

/// State shared by the walk and the workers.
struct Build {
    method: Method,
    report: Mutex<Report>,
    /// Set by a worker that failed, so the walk stops early.
    worker_failed: Arc<AtomicBool>,
    /// Entries created inside writable (owner's) directories.
    in_place: Mutex<Vec<InPlace>>,
    workers: Option<SyncSender<Batch>>,
}

/// Creates everything `root` describes inside `dest`, which exists and is
/// empty. On error, some of it may exist: the caller rolls back with the
/// returned record.
pub fn build(
    root: &Entry,
    dest: &Path,
    method: Method,
    threads: usize,
) -> (Materialized, Option<Error>) {
    let mut record = Materialized {
        root: dest.to_owned(),
        in_place: Vec::new(),
        report: Report::default(),
    };
    let error = std::thread::scope(|scope| {
        let worker_failed = Arc::new(AtomicBool::new(false));
        let (workers, handles) = start_workers(scope, threads, method, &worker_failed);
        let mut build = Build {
            method,
            report: Mutex::default(),
            worker_failed,
            in_place: Mutex::default(),
            workers,
        };
        let walked = walk_root(&build, root, dest);
        build.workers = None; // closes the queue: workers finish and exit
        let mut errors = Vec::new();
        for handle in handles {
            match handle.join() {
                Ok((report, error)) => {
                    build.report.lock().add(&report);
                    errors.extend(error);
                }
                // A bug; the caller still undoes what was made.
                Err(_) => errors.push(Error::other(dest, "a materializer worker panicked")),
            }
        }
        record.report.add(&build.report.lock());
        record.in_place = std::mem::take(&mut *build.in_place.lock());
        // A worker's own error explains a walk stopped by its failure.
        errors.into_iter().next().or(walked.err())
    });
    (record, error)
}

type WorkerResult = (Report, Option<Error>);

fn start_workers<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    threads: usize,
    method: Method,
    failed: &Arc<AtomicBool>,
) -> (
    Option<SyncSender<Batch>>,
    Vec<ScopedJoinHandle<'scope, WorkerResult>>,
) {
    if threads <= 1 {
        return (None, Vec::new());
    }
    let (tx, rx) = sync_channel::<Batch>(QUEUE_DEPTH);
    let rx = Arc::new(Mutex::new(rx));
    let handles = (0..threads)
        .map(|_| {
            let rx = rx.clone();
            let failed = failed.clone();
            scope.spawn(move || {
                let mut report = Report::default();
                loop {
                    let batch = rx.lock().recv();
                    let Ok(batch) = batch else {
                        return (report, None);
                    };
                    if let Err(err) = place_all(method, &batch, &mut report) {
                        failed.store(true, Ordering::Release);
                        // Drain the queue so the walk never blocks on us.
                        while rx.lock().recv().is_ok() {}
                        return (report, Some(err));
                    }
                }
            })
        })
        .collect();
    (Some(tx), handles)
}

fn place_all(method: Method, batch: &Batch, report: &mut Report) -> Result<(), Error> {
    for leaf in &batch.leaves {
        let made = place(method, leaf, &batch.dir).map_err(|err| {
            let path = batch.dir_path.join(OsStr::from_bytes(leaf.name.as_bytes()));
            Error::new(syscall_for(method, leaf.kind), &path, err)
        })?;
        report.count(made);
    }
    Ok(())
}

fn syscall_for(method: Method, kind: LeafKind) -> &'static str {
    match (kind, method) {
        (LeafKind::Symlink, _) => "readlinkat/symlinkat",
        (LeafKind::Shared, _) | (LeafKind::File, Method::Symlink) => "symlinkat",
        (LeafKind::File, Method::Hardlink) => "linkat",
        (LeafKind::File, Method::Clone) => "clone",
        (LeafKind::File, Method::Copy) => "openat/copy",
        (LeafKind::File, Method::Auto) => "linkat/clone/symlinkat",
    }
}

impl Build {
    fn failed(&self) -> bool {
        self.worker_failed.load(Ordering::Acquire)
    }

    /// Creates a directory's gathered leaves, here or on a worker.
    fn submit(&self, dir: Arc<DirFd>, dir_path: &Path, leaves: Vec<Leaf>) -> Result<(), Error> {
        if leaves.is_empty() {
            return Ok(());
        }
        let batch = Batch {
            dir,
            dir_path: dir_path.to_owned(),
            leaves,
        };
        match &self.workers {
            Some(queue) => {
                if queue.send(batch).is_err() || self.failed() {
                    return Err(Error::other(dir_path, "a worker failed"));
                }
                Ok(())
            }
            None => {
                let mut report = Report::default();
                let result = place_all(self.method, &batch, &mut report);
                self.report.lock().add(&report);
                result
            }
        }
    }

    fn mkdir(&self, parent: &DirFd, parent_path: &Path, name: &OsStr) -> Result<Arc<DirFd>, Error> {
        let path = parent_path.join(name);
        let c = c_name(name).map_err(|e| Error::new("mkdirat", &path, e))?;
        parent
            .mkdir_at(&c, DIR_MODE)
            .map_err(|e| Error::new("mkdirat", &path, e))?;
        self.report.lock().dirs += 1;
        let dir = parent
            .open_at(&c)
            .map_err(|e| Error::new("openat", &path, e))?;
        Ok(Arc::new(dir))
    }

    /// Fills directory `dir` (at `dir_path`) with `entry`'s children, and
    /// with the entries of `source` (a read-only directory it mirrors) that
    /// no child shadows.
    fn fill(
        &self,
        dir: Arc<DirFd>,
        dir_path: &Path,
        entry: &Entry,
        source: Option<(Arc<DirFd>, PathBuf)>,
    ) -> Result<(), Error> {
        let mut leaves = Vec::new();
        if let Some((src, src_path)) = &source {
            self.mirror(&dir, dir_path, &entry.children, src, src_path, &mut leaves)?;
        }
        for (name, child) in &entry.children {
            let child_source = match &source {
                // A directory leading to mappings inside a mirrored directory
                // merges with the source's directory of that name, if any.
                Some((src, src_path)) if child.mapped.is_none() => {
                    open_source_subdir(src, src_path, name)?
                }
                _ => None,
            };
            self.create_child(&dir, dir_path, name, child, child_source, &mut leaves)?;
        }
        self.submit(dir, dir_path, leaves)
    }

    /// Adds the entries of source directory `src` not shadowed by `skip`.
    fn mirror(
        &self,
        dir: &DirFd,
        dir_path: &Path,
        skip: &HashMap<OsString, Entry>,
        src: &Arc<DirFd>,
        src_path: &Path,
        leaves: &mut Vec<Leaf>,
    ) -> Result<(), Error> {
        let mut listing = src
            .entries()
            .map_err(|e| Error::new("opendir", src_path, e))?;
        for item in listing.iter() {
            let (name, kind, _) = item.map_err(|e| Error::new("readdir", src_path, e))?;
            let os_name = OsStr::from_bytes(name.as_bytes());
            if skip.contains_key(os_name) {
                continue;
            }
            let path = src_path.join(os_name);
            let kind = match kind {
                None => src
                    .kind_at(&name)
                    .map_err(|e| Error::new("fstatat", &path, e))?,
                Some(known) => known,
            };
            if kind == FileKind::Directory {
                let sub = self.mkdir(dir, dir_path, os_name)?;
                let sub_src = src
                    .open_at(&name)
                    .map_err(|e| Error::new("openat", &path, e))?;
                let empty = Entry::default();
                self.fill(
                    sub,
                    &dir_path.join(os_name),
                    &empty,
                    Some((Arc::new(sub_src), path)),
                )?;
                continue;
            }
            let leaf_kind = match kind {
                FileKind::RegularFile => LeafKind::File,
                FileKind::Symlink => LeafKind::Symlink,
                _ => LeafKind::Shared,
            };
            leaves.push(Leaf {
                name: name.clone(),
                kind: leaf_kind,
                source_dir: Some(src.clone()),
                source_name: name,
                source_path: path,
            });
        }
        Ok(())
    }

    /// Creates child `name` of `dir` as layout entry `child` describes.
    fn create_child(
        &self,
        dir: &Arc<DirFd>,
        dir_path: &Path,
        name: &OsStr,
        child: &Entry,
        merge_source: Option<(Arc<DirFd>, PathBuf)>,
        leaves: &mut Vec<Leaf>,
    ) -> Result<(), Error> {
        let path = dir_path.join(name);
        let Some(mapped) = &child.mapped else {
            let sub = self.mkdir(dir, dir_path, name)?;
            return self.fill(sub, &path, child, merge_source);
        };
        let leaf = |kind| -> Result<Leaf, Error> {
            Ok(Leaf {
                name: c_name(name).map_err(|e| Error::new("symlinkat", &path, e))?,
                kind,
                source_dir: None,
                source_name: c_name(mapped.underlying.as_os_str())
                    .map_err(|e| Error::new("symlinkat", &path, e))?,
                source_path: mapped.underlying.clone(),
            })
        };
        match mapped.kind {
            FileKind::Directory if mapped.writable => {
                leaves.push(leaf(LeafKind::Shared)?);
                if !child.children.is_empty() {
                    // The directory pinned when the layout was planned, not
                    // whatever its path leads to now.
                    let owner = DirFd::reopen(&mapped.anchor)
                        .map_err(|e| Error::new("open", &mapped.underlying, e))?;
                    let place = InPlace {
                        root: mapped.anchor.clone(),
                        rel: PathBuf::new(),
                    };
                    self.fill_in_place(Arc::new(owner), &place, child)?;
                }
                Ok(())
            }
            FileKind::Directory if self.method == Method::Symlink && child.children.is_empty() => {
                leaves.push(leaf(LeafKind::Shared)?);
                Ok(())
            }
            // macOS clones a whole tree in one call; its modes come along,
            // so nothing needs a walk afterwards.
            FileKind::Directory
                if self.method == Method::Clone
                    && crate::sys::CLONES_DIRECTORIES
                    && child.children.is_empty() =>
            {
                leaves.push(leaf(LeafKind::File)?);
                Ok(())
            }
            FileKind::Directory => {
                let sub = self.mkdir(dir, dir_path, name)?;
                let src = DirFd::open(&mapped.underlying)
                    .map_err(|e| Error::new("open", &mapped.underlying, e))?;
                self.fill(
                    sub,
                    &path,
                    child,
                    Some((Arc::new(src), mapped.underlying.clone())),
                )
            }
            FileKind::Symlink => {
                leaves.push(leaf(LeafKind::Symlink)?);
                Ok(())
            }
            FileKind::RegularFile if !mapped.writable => {
                leaves.push(leaf(LeafKind::File)?);
                Ok(())
            }
            // Writable files, FIFOs, sockets and devices must stay the
            // very same object.
            _ => {
                leaves.push(leaf(LeafKind::Shared)?);
                Ok(())
            }
        }
    }

    /// Creates `entry`'s children inside the owner's writable directory
    /// `dir` (at `place` below the writable mapping), recording each thing
    /// created there.
    fn fill_in_place(&self, dir: Arc<DirFd>, place: &InPlace, entry: &Entry) -> Result<(), Error> {
        let dir_path = place.path();
        let dir_path = dir_path.as_path();
        let mut leaves = Vec::new();
        for (name, child) in &entry.children {
            let path = dir_path.join(name);
            let here = InPlace {
                root: place.root.clone(),
                rel: place.rel.join(name),
            };
            let c = c_name(name).map_err(|e| Error::new("fstatat", &path, e))?;
            match dir.stat_at(&c) {
                Ok(st) if child.mapped.is_none() && kind_of(&st) == FileKind::Directory => {
                    // The owner's directory: descend without taking it over
                    // (O_NOFOLLOW: a symlink swapped in meanwhile fails).
                    let sub = dir
                        .open_at(&c)
                        .map_err(|e| Error::new("openat", &path, e))?;
                    self.fill_in_place(Arc::new(sub), &here, child)?;
                }
                Ok(_) => {
                    return Err(Error::other(
                        &path,
                        "already exists in a writable directory, and a native sandbox \
                         cannot hide it as the mount would",
                    ))
                }
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {
                    self.in_place.lock().push(here);
                    self.create_child(&dir, dir_path, name, child, None, &mut leaves)?;
                }
                Err(err) => return Err(Error::new("fstatat", &path, err)),
            }
        }
        self.submit(dir, dir_path, leaves)
    }
}

/// The sandbox root: `dest` itself, possibly mirroring a mapped directory.
fn walk_root(build: &Build, root: &Entry, dest: &Path) -> Result<(), Error> {
    let dir = Arc::new(DirFd::open(dest).map_err(|e| Error::new("open", dest, e))?);
    let source = match &root.mapped {
        None => None,
        Some(mapped) if mapped.writable => {
            return Err(Error::other(
                dest,
                "a writable mapping of the sandbox root cannot be materialized natively",
            ))
        }
        Some(mapped) => {
            let src = DirFd::open(&mapped.underlying)
                .map_err(|e| Error::new("open", &mapped.underlying, e))?;
            Some((Arc::new(src), mapped.underlying.clone()))
        }
    };
    build.fill(dir, dest, root, source)
}

/// The subdirectory `name` of a mirrored source, if it is a real directory.
fn open_source_subdir(
    src: &DirFd,
    src_path: &Path,
    name: &OsStr,
) -> Result<Option<(Arc<DirFd>, PathBuf)>, Error> {
    let path = src_path.join(name);
    let c: CString = c_name(name).map_err(|e| Error::new("openat", &path, e))?;
    match src.open_at(&c) {
        Ok(dir) => Ok(Some((Arc::new(dir), path))),
        Err(err)
            if matches!(
                err.raw_os_error(),
                Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
            ) =>
        {
            Ok(None)
        }
        Err(err) => Err(Error::new("openat", &path, err)),
    }
}

impl Report {
    fn count(&mut self, made: Made) {
        self.made[made as usize] += 1;
    }

    fn add(&mut self, other: &Report) {
        for (mine, theirs) in self.made.iter_mut().zip(other.made) {
            *mine += theirs;
        }
        self.dirs += other.dirs;
    }
}
