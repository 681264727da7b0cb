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

use crate::sandbox::dirfd::{c_name, kind_of, stat_at, Anchor};
use crate::sandbox::file_kind::FileKind;

/// From this many mappings on, two threads share the work (one thread
/// wins below it: starting one costs about as much as 200 lstats).
const PARALLEL_FROM: usize = 512;

/// An underlying path's type, and what pins it: the directory itself for
/// a directory, else the directory holding it.
pub type TypeAndPin = std::io::Result<(FileKind, Arc<Anchor>)>;

/// The file type and pin of each path, or the error, in order.
pub fn lstat_kinds(paths: &[&Path], sandbox: Option<&Arc<str>>) -> Vec<TypeAndPin> {
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

/// From this many consecutive paths in one directory on, the directory is
/// listed once (`getdents`, which gives each entry's type) instead of
/// `fstatat`ing each path: a listing reads about 40 entries in the time of
/// one `fstatat`.
const LIST_FROM: usize = 8;

/// A listing stops after this many entries per path wanted (a huge
/// directory of which only a few entries are mapped); the paths not found
/// by then are `fstatat`ed.
const ENTRIES_PER_WANTED: usize = 32;

fn lstat_run(paths: &[&Path], sandbox: Option<&Arc<str>>) -> Vec<TypeAndPin> {
    let mut parent = ParentCache::default();
    let mut found = Vec::with_capacity(paths.len());
    let mut rest = paths;
    while let Some(first) = rest.first() {
        let dir = first.parent().filter(|_| first.file_name().is_some());
        let run = match dir {
            Some(dir) => rest
                .iter()
                .take_while(|p| p.parent() == Some(dir) && p.file_name().is_some())
                .count(),
            None => 1,
        };
        let (same_dir, next) = rest.split_at(run);
        match dir {
            Some(dir) if run >= LIST_FROM => {
                found.extend(parent.find_listed(dir, same_dir, sandbox));
            }
            _ => found.extend(same_dir.iter().map(|path| parent.find(path, sandbox))),
        }
        rest = next;
    }
    found
}

/// The directory the previous path was in, pinned.
#[derive(Default)]
struct ParentCache {
    last: Option<Arc<Anchor>>,
}

impl ParentCache {
    /// `dir`, pinned (the same anchor as for the previous path there).
    fn pin(&mut self, dir: &Path, sandbox: Option<&Arc<str>>) -> std::io::Result<Arc<Anchor>> {
        match &self.last {
            Some(last) if last.path() == dir => Ok(last.clone()),
            _ => {
                self.last = None;
                let anchor = Arc::new(Anchor::open(dir, sandbox.cloned())?);
                self.last = Some(anchor.clone());
                Ok(anchor)
            }
        }
    }

    fn find(&mut self, path: &Path, sandbox: Option<&Arc<str>>) -> TypeAndPin {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            // `/`: the root pins itself.
            let anchor = Anchor::open(path, sandbox.cloned())?;
            return Ok((FileKind::Directory, Arc::new(anchor)));
        };
        let parent = self.pin(dir, sandbox)?;
        let name: CString = c_name(name)?;
        let kind = kind_of(&stat_at(parent.fd()?, &name)?);
        pinned(parent, kind, &name, path)
    }

    /// `find` for `paths`, all entries of `dir`, from one listing of it.
    /// Where the listing cannot say (no read permission on `dir`, a file
    /// system that gives no types, a listing cut short), each path is
    /// `fstatat`ed as `find` does.
    fn find_listed(
        &mut self,
        dir: &Path,
        paths: &[&Path],
        sandbox: Option<&Arc<str>>,
    ) -> Vec<TypeAndPin> {
        let listed = self
            .pin(dir, sandbox)
            .and_then(|parent| Ok((list_kinds(&parent, paths)?, parent)));
        let Ok(((kinds, complete), parent)) = listed else {
            return paths.iter().map(|path| self.find(path, sandbox)).collect();
        };
        paths
            .iter()
            .zip(kinds)
            .map(|(path, seen)| match seen {
                Seen::Typed(kind) => {
                    let name = c_name(path.file_name().expect("a run has names"))?;
                    pinned(parent.clone(), kind, &name, path)
                }
                Seen::No if complete => Err(std::io::Error::from_raw_os_error(libc::ENOENT)),
                Seen::No | Seen::Untyped => self.find(path, sandbox),
            })
            .collect()
    }
}

/// What pins an object of `kind` found as `name` in `parent`: the
/// directory itself for a directory, else `parent`.
fn pinned(parent: Arc<Anchor>, kind: FileKind, name: &CString, path: &Path) -> TypeAndPin {
    if kind == FileKind::Directory {
        return Ok((kind, Arc::new(parent.child(name, path)?)));
    }
    Ok((kind, parent))
}

/// What a listing says of one name.
#[derive(Clone, Copy)]
enum Seen {
    No,
    /// Listed, but the file system gave no type (DT_UNKNOWN).
    Untyped,
    Typed(FileKind),
}

/// What `parent`'s listing says of each of `paths`' last names, and
/// whether it was read to its end (so that a name not seen does not
/// exist).
fn list_kinds(parent: &Anchor, paths: &[&Path]) -> std::io::Result<(Vec<Seen>, bool)> {
    use std::os::unix::ffi::OsStrExt;
    let mut wanted: std::collections::HashMap<&[u8], Seen> = paths
        .iter()
        .filter_map(|p| p.file_name())
        .map(|name| (name.as_bytes(), Seen::No))
        .collect();
    let budget = wanted.len().saturating_mul(ENTRIES_PER_WANTED);
    let (mut read, mut matched, mut complete) = (0, 0, true);
    crate::sandbox::dirfd::DirFd::reopen(parent)?
        .entries()?
        .visit(|name, kind| {
            if let Some(slot) = wanted.get_mut(name.to_bytes()) {
                *slot = kind.map_or(Seen::Untyped, Seen::Typed);
                matched += 1;
            }
            read += 1;
            if matched == wanted.len() {
                return false;
            }
            if read >= budget {
                complete = false;
                return false;
            }
            true
        })?;
    let kinds = paths
        .iter()
        .map(|p| wanted[p.file_name().expect("a run has names").as_bytes()])
        .collect();
    Ok((kinds, complete))
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

    /// Checks `lstat_run` against one `lstat` per path.
    fn agrees_with_lstat(paths: &[&Path]) {
        let listed = lstat_run(paths, None);
        for (path, found) in paths.iter().zip(&listed) {
            let expected =
                std::fs::symlink_metadata(path).map(|m| FileKind::from_std(m.file_type()));
            match (found, expected) {
                (Ok((kind, anchor)), Ok(expected)) => {
                    assert_eq!(*kind, expected, "{path:?}");
                    let pin = match expected {
                        FileKind::Directory => path,
                        _ => path.parent().unwrap(),
                    };
                    assert_eq!(anchor.path(), pin);
                }
                (Err(err), Err(expected)) => {
                    assert_eq!(err.raw_os_error(), expected.raw_os_error(), "{path:?}")
                }
                (found, expected) => panic!("{path:?}: {found:?} vs {expected:?}"),
            }
        }
    }

    #[test]
    fn a_listed_directory_answers_like_one_lstat_per_path() {
        for entries in [12, 1000] {
            // 12: the listing reads to the end, so the missing name is
            // known missing from it; 1000: the listing stops at its budget
            // and the rest are found by fstatat.
            let dir = tempfile::tempdir().unwrap();
            for i in 0..entries {
                std::fs::write(dir.path().join(format!("f{i:04}")), "x").unwrap();
            }
            std::os::unix::fs::symlink("f0000", dir.path().join("link")).unwrap();
            std::fs::create_dir(dir.path().join("sub")).unwrap();
            let mut names = vec![
                "link".to_owned(),
                "sub".to_owned(),
                "missing".to_owned(),
                "f0000".to_owned(),
            ];
            names.extend((0..LIST_FROM).map(|i| format!("f{:04}", i * (entries / LIST_FROM))));
            names.push(format!("f{:04}", entries - 1));
            let paths: Vec<PathBuf> = names.iter().map(|n| dir.path().join(n)).collect();
            let paths: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
            assert!(paths.len() >= LIST_FROM);
            agrees_with_lstat(&paths);
        }
    }
}
