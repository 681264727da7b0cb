//! Input roots served by a FUSE mount of the worker's own process
//! ([`crate::daemon::Embedded`]), instead of one link per file.
//!
//! A root is a sandbox of the core's view: its directories are lazy nodes
//! (`tree::MerkleInputs`), made at the first lookup into each, and its
//! files read-only mappings of their CAS blobs. Blobs are content-addressed
//! and never change, so the kernel opens and caches them with no message,
//! and a blob is one inode, one page cache, in every root that holds it.
//!
//! Staging costs one `stat` per file (a blob the CAS lacks is an error
//! now, not at the action's open) and one `mkdir` per directory: every
//! directory of the tree is made again in a scratch directory the root is
//! merged with, so that each is writable, as a linked root's are, and
//! whatever the action makes lands there. The root's path is a symlink to
//! the sandbox in the mount. Teardown destroys the sandbox and removes the
//! scratch directory: O(directories and outputs), not O(files).
//!
//! The CAS must keep a root's blobs while its action runs: the view maps
//! them by path, where a hard link would have kept the inode.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::build::{in_halves, io_error, make_dirs, make_parents, open_destination, two_threads};
use super::cas::Cas;
use super::{MissingBlob, StageError, Staged};
use crate::daemon::config::DaemonConfig;
use crate::daemon::Embedded;
use crate::fuse::options::{Allow, ZeroMessageOpens};
use crate::fuse::transport::Asked;
use crate::sandbox::backend::Backend;
use crate::sandbox::dirfd::DirFd;
use crate::sandbox::hybrid::cutoff::NativeBelow;
use crate::sandbox::materialize::{self, remove_tree, Method};
use crate::sandbox::merkle::{join, FileEntry, Walked};
use crate::sandbox::tree::{EmptyDirs, MerkleInputs, SymlinkTargets};

/// The mount and what its roots are made of, below one directory.
pub struct FuseRoots {
    mount: Embedded,
    mount_point: PathBuf,
    /// One directory per root, merged with it: where its writes land.
    scratch: PathBuf,
    links: SymlinkTargets,
    next_id: AtomicU64,
    /// Roots of at least this many files are served here.
    from_files: usize,
}

impl FuseRoots {
    /// Mounts at `dir/mnt`, keeping scratch directories and symlink
    /// targets in `dir` too (made if missing; what a crashed worker left
    /// there is removed first). Roots of `from_files` files or more are
    /// served from the mount.
    pub fn open(dir: &Path, from_files: usize) -> io::Result<FuseRoots> {
        let mount_point = dir.join("mnt");
        let scratch = dir.join("scratch");
        let links = dir.join("links");
        if scratch.exists() {
            remove_tree(&scratch).map_err(io::Error::other)?;
        }
        for made in [&mount_point, &scratch, &links] {
            std::fs::create_dir_all(made)
                .map_err(|err| io::Error::new(err.kind(), format!("mkdir {made:?}: {err}")))?;
        }
        let mount = Embedded::start(&mount_config(&mount_point)).map_err(|err| {
            io::Error::other(format!("mount input roots at {mount_point:?}: {err}"))
        })?;
        Ok(FuseRoots {
            mount,
            mount_point,
            scratch,
            links: SymlinkTargets::new(links),
            next_id: AtomicU64::new(0),
            from_files,
        })
    }

    /// Whether a root of `files` files is served here.
    pub fn wants(&self, files: usize) -> bool {
        files >= self.from_files
    }

    pub fn mount_point(&self) -> &Path {
        &self.mount_point
    }

    /// The mount's counters (FUSE requests by kind), for tests and benches
    /// that check what a root's reads cost.
    pub fn stats(&self) -> &Arc<crate::stats::Stats> {
        self.mount.sandboxes().stats()
    }

    /// Serves `walked` at `staged.root` (missing, or an empty directory,
    /// which becomes a symlink to the root in the mount), with the
    /// directories in `parents` made too. On error nothing is left.
    pub fn stage(
        &self,
        cas: &Cas,
        threads: usize,
        walked: Walked,
        parents: &[String],
        mut staged: Staged,
    ) -> Result<Staged, StageError> {
        let at = staged.root.clone();
        let content = blob_paths(cas, &walked, threads, &at)?;
        let id = format!("r{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let scratch = self.scratch.join(&id);
        let made = (|| {
            mirror_dirs(&scratch, &walked, parents, &mut staged)?;
            let links = self
                .links
                .of(&walked)
                .map_err(|err| StageError::Invalid(err.to_string()))?;
            let files = walked.file_count();
            let inputs = MerkleInputs::new(
                &id,
                Arc::new(walked),
                Arc::new(content),
                PathBuf::new(),
                links,
                EmptyDirs::Merged,
            );
            let root = inputs.dir("").expect("a walk holds its root");
            self.mount
                .sandboxes()
                .create_lazy_root(&id, &scratch, root, files)
                .map_err(|err| StageError::Invalid(format!("input root {at:?}: {err}")))?;
            staged.files = files;
            if let Err(err) = self.point_at_root(&at, &id) {
                self.destroy(&id);
                return Err(err);
            }
            Ok(())
        })();
        match made {
            Ok(()) => {
                staged.fuse_id = Some(id.into());
                Ok(staged)
            }
            Err(err) => {
                if let Err(cleanup) = remove_tree(&scratch) {
                    log::error!(
                        "staging {at:?} failed, and so did removing {scratch:?}: {cleanup}"
                    );
                }
                Err(err)
            }
        }
    }

    /// Removes a root made by [`FuseRoots::stage`], with what its action
    /// left in it.
    pub fn tear_down(&self, staged: &Staged, id: &str) -> Result<(), StageError> {
        let unlinked = std::fs::remove_file(&staged.root)
            .map_err(|err| io_error("unlink", &staged.root, "", err));
        self.destroy(id);
        let removed = remove_tree(&self.scratch.join(id))
            .map(drop)
            .map_err(StageError::from);
        unlinked.and(removed)
    }

    fn destroy(&self, id: &str) {
        if let Err(err) = self.mount.sandboxes().destroy(id) {
            log::error!("input root {id:?} in {:?}: {err}", self.mount_point);
        }
    }

    /// Makes `at` a symlink to root `id` in the mount: `at` missing, or an
    /// empty directory (removed, and made again on failure).
    fn point_at_root(&self, at: &Path, id: &str) -> Result<(), StageError> {
        let (fd, made) = open_destination(at)?;
        drop(fd);
        std::fs::remove_dir(at).map_err(|err| io_error("rmdir", at, "", err))?;
        let linked = std::os::unix::fs::symlink(self.mount_point.join(id), at)
            .map_err(|err| io_error("symlink", at, "", err));
        if linked.is_err() && !made {
            if let Err(err) = std::fs::create_dir(at) {
                log::error!("cannot make {at:?} again: {err}");
            }
        }
        linked
    }
}

/// Each file's blob in the CAS, in the walk's order; every blob the CAS
/// lacks, named, if any. One `stat` each, on as many threads as linking
/// them would take.
fn blob_paths(
    cas: &Cas,
    walked: &Walked,
    threads: usize,
    at: &Path,
) -> Result<Vec<Option<PathBuf>>, StageError> {
    let files: Vec<_> = walked.files().collect();
    let find = |files: &[(&str, &FileEntry)]| {
        let mut content = Vec::with_capacity(files.len());
        let mut missing = Vec::new();
        for (path, file) in files {
            match cas.source_path(&file.hash, file.size, file.executable) {
                Ok(blob) => content.push(Some(blob)),
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => missing.push(MissingBlob {
                    what: "file",
                    hash: file.hash.to_string(),
                    size: file.size,
                    path: join(path, &file.name),
                }),
                Err(err) => return Err(io_error("stat", at, &join(path, &file.name), err)),
            }
        }
        Ok((content, missing))
    };
    let (first, second) = in_halves(&files, two_threads(threads, files.len()), find);
    let (mut content, mut missing) = first?;
    if let Some(second) = second {
        let (more, also_missing) = second?;
        content.extend(more);
        missing.extend(also_missing);
    }
    if !missing.is_empty() {
        return Err(StageError::Missing(missing));
    }
    Ok(content)
}

/// Makes `scratch` and, in it, every directory of the tree and each of
/// `parents`: what the merged view shows as the root's writable
/// directories, counted in `staged.dirs`.
fn mirror_dirs(
    scratch: &Path,
    walked: &Walked,
    parents: &[String],
    staged: &mut Staged,
) -> Result<(), StageError> {
    std::fs::create_dir(scratch)
        .map_err(|err| StageError::Io(materialize::Error::new("mkdir", scratch, err)))?;
    let root = DirFd::open(scratch)
        .map_err(|err| StageError::Io(materialize::Error::new("open", scratch, err)))?;
    staged.dirs = 1;
    let tree_dirs = walked.dirs.iter().map(|(path, _)| path.as_ref());
    make_dirs(
        &root,
        tree_dirs.filter(|path: &&str| !path.is_empty()),
        staged,
        false,
    )?;
    make_parents(&root, parents, staged)
}

/// The mount: the worker's user alone, zero-message opens (blobs never
/// change), every root in FUSE (this module decides which are).
fn mount_config(mount_point: &Path) -> DaemonConfig {
    DaemonConfig {
        allow: Allow::OwnerOnly,
        input: None,
        output: None,
        mappings: Vec::new(),
        ttl: Duration::from_secs(60),
        xattrs: false,
        passthrough: true,
        zero_message_opens: ZeroMessageOpens::On,
        transport: Asked::Auto,
        native_below: NativeBelow::Off,
        native_method: Method::Symlink,
        native_stashes: 0,
        native_dir: None,
        calibration: None,
        reconfig_threads: 1,
        mount_point: mount_point.to_owned(),
        access_log: None,
        control: None,
        record: None,
    }
}
