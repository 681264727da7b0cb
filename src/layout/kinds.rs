//! The file type of every mapping's underlying path, found with one
//! `lstat` each, and the directory that pins it ([`Anchor`]).
//!
//! Bazel lists an action's inputs in exec-path order, so consecutive
//! mappings mostly share a parent directory. Each parent is pinned once
//! and its entries are `fstatat`ed by name, which skips walking the whole
//! path again for every input; that walk was most of the cost of a large
//! CreateSandbox. The pinned parent is then where the daemon finds the
//! input for as long as the sandbox lives. Large requests are split across
//! two threads.

use std::ffi::CString;
use std::path::Path;
use std::sync::Arc;

use crate::dirfd::{c_name, kind_of, stat_at, Anchor};
use crate::file_kind::FileKind;

/// From this many mappings on, two threads share the work (one thread
/// wins below it: starting one costs about as much as 200 lstats).
const PARALLEL_FROM: usize = 512;

/// An underlying path's type, and what pins it: the directory itself for
/// a directory, else the directory holding it.
pub type Found = std::io::Result<(FileKind, Arc<Anchor>)>;

/// The file type and pin of each path, or the error, in order.
pub fn lstat_kinds(paths: &[&Path], sandbox: Option<&Arc<str>>) -> Vec<Found> {
    if paths.len() < PARALLEL_FROM {
        return lstat_run(paths, sandbox);
    }
    let (first, second) = paths.split_at(paths.len() / 2);
    std::thread::scope(|scope| {
        let helper = scope.spawn(|| lstat_run(second, sandbox));
        let mut kinds = lstat_run(first, sandbox);
        match helper.join() {
            Ok(more) => kinds.extend(more),
            Err(panic) => std::panic::resume_unwind(panic),
        }
        kinds
    })
}

fn lstat_run(paths: &[&Path], sandbox: Option<&Arc<str>>) -> Vec<Found> {
    let mut parent = ParentCache::default();
    paths
        .iter()
        .map(|path| parent.find(path, sandbox))
        .collect()
}

/// The directory the previous path was in, pinned.
#[derive(Default)]
struct ParentCache {
    last: Option<Arc<Anchor>>,
}

impl ParentCache {
    fn find(&mut self, path: &Path, sandbox: Option<&Arc<str>>) -> Found {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            // `/`: the root pins itself.
            let anchor = Anchor::open(path, sandbox.cloned())?;
            return Ok((FileKind::Directory, Arc::new(anchor)));
        };
        let parent = match &self.last {
            Some(last) if last.path() == dir => last.clone(),
            _ => {
                self.last = None;
                let anchor = Arc::new(Anchor::open(dir, sandbox.cloned())?);
                self.last = Some(anchor.clone());
                anchor
            }
        };
        let name: CString = c_name(name)?;
        let kind = kind_of(&stat_at(std::os::fd::AsFd::as_fd(&*parent), &name)?);
        if kind == FileKind::Directory {
            return Ok((kind, Arc::new(parent.child(&name, path)?)));
        }
        Ok((kind, parent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn kinds_and_errors_come_back_in_order_on_both_paths() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let link = dir.path().join("l");
        std::os::unix::fs::symlink("f", &link).unwrap();
        let missing = dir.path().join("missing");
        let under_file = file.join("child");
        let root = PathBuf::from("/");
        for copies in [1, PARALLEL_FROM] {
            let mut paths: Vec<&Path> = Vec::new();
            for _ in 0..copies {
                paths.extend([
                    file.as_path(),
                    link.as_path(),
                    missing.as_path(),
                    under_file.as_path(),
                    dir.path(),
                    root.as_path(),
                ]);
            }
            let kinds = lstat_kinds(&paths, None);
            assert_eq!(kinds.len(), paths.len());
            for chunk in kinds.chunks(6) {
                let kind = |i: usize| chunk[i].as_ref().map(|(kind, _)| *kind);
                let pinned = |i: usize| chunk[i].as_ref().unwrap().1.path().to_owned();
                assert_eq!(kind(0).unwrap(), FileKind::RegularFile);
                assert_eq!(pinned(0), dir.path(), "a file is pinned by its directory");
                assert_eq!(kind(1).unwrap(), FileKind::Symlink);
                assert_eq!(kind(2).unwrap_err().raw_os_error(), Some(libc::ENOENT));
                assert_eq!(kind(3).unwrap_err().raw_os_error(), Some(libc::ENOTDIR));
                assert_eq!(kind(4).unwrap(), FileKind::Directory);
                assert_eq!(pinned(4), dir.path(), "a directory pins itself");
                assert_eq!(kind(5).unwrap(), FileKind::Directory);
            }
        }
    }
}
