//! Recycling input roots: a torn-down root that still holds exactly its
//! tree is kept as a spare, and the next root is made from a spare by the
//! Merkle difference of the two trees. A subtree whose digest is in both is
//! not touched at all, so staging costs what changed, not what is there.
//!
//! A root is checked before it is kept, one listing per directory and no
//! `stat` per file: each directory must have mode 0755 and exactly the
//! tree's names, each file entry the inode of its blob (hard links; a
//! clone or copy never matches, so only hard-linked roots are kept), each
//! symlink its target. What the action added (outputs, temporary files) is
//! removed first; anything else amiss and the root is deleted instead.
//! Writing to an input through a hard link would change the CAS itself, so
//! it is outside what this check (or the CAS) can catch, as with any hard
//! link staging.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::build::{self, io_error};
use super::cas::blob_name;
use super::{MissingBlob, StageError, Staged, Stager};
use crate::sandbox::dirfd::{readlink_at, DirFd};
use crate::sandbox::file_kind::FileKind;
use crate::sandbox::materialize::{remove_entry, remove_tree, Removed};
use crate::sandbox::merkle::{join, Checked, DirEntry, Entry, WalkError, Walked};

/// Torn-down roots kept for reuse, in one directory on the staging file
/// system.
pub struct Spares {
    dir: PathBuf,
    max: usize,
    pool: Mutex<Vec<Spare>>,
    next: AtomicU64,
    /// Inode of each blob (or executable variant) as linked, by blob name
    /// and executable bit.
    inodes: Mutex<HashMap<(CString, bool), u64>>,
}

struct Spare {
    path: PathBuf,
    hash: Box<str>,
    size: i64,
    /// Its root directory's entries, to choose a spare by.
    top: Arc<Checked>,
}

impl Spares {
    pub fn new(dir: &Path, max: usize) -> io::Result<Spares> {
        std::fs::create_dir_all(dir)?;
        Ok(Spares {
            dir: dir.to_owned(),
            max,
            pool: Mutex::default(),
            next: AtomicU64::new(0),
            inodes: Mutex::default(),
        })
    }

    pub fn len(&self) -> usize {
        self.pool.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A spare for tree `hash` (root entries `top`): one of that very
    /// tree if there is one, else the one sharing the most root entries
    /// (a subdirectory of the same digest is not entered at all), the one
    /// kept last among equals.
    fn take(&self, hash: &str, top: &Checked) -> Option<Spare> {
        let mut pool = self.pool.lock();
        let score = |spare: &Spare| {
            if &*spare.hash == hash {
                return usize::MAX;
            }
            spare
                .top
                .entries()
                .filter(|was| top.find(was.name()).is_some_and(|now| identical(*was, now)))
                .count()
        };
        let (at, _) = pool
            .iter()
            .enumerate()
            .max_by_key(|(at, spare)| (score(spare), *at))?;
        Some(pool.remove(at))
    }

    /// Deletes every spare.
    pub fn clear(&self) {
        let all: Vec<Spare> = std::mem::take(&mut *self.pool.lock());
        for spare in all {
            if let Err(err) = remove_tree(&spare.path) {
                log::warn!("removing spare input root: {err}");
            }
        }
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        self.clear();
    }
}

impl Stager {
    /// Makes the root of `walked` at `staged.root` from a spare, if there
    /// is one. `None`: no spare; the caller builds afresh.
    pub(super) fn stage_from_spare(
        &self,
        spares: &Spares,
        walked: &Walked,
        parents: &[String],
        mut staged: Staged,
    ) -> Option<Result<Staged, StageError>> {
        let spare = spares.take(&staged.hash, &walked.dirs[0].1)?;
        let at = staged.root.clone();
        let existed = std::fs::symlink_metadata(&at).is_ok();
        // Replaces `at` only if it is an empty directory.
        if let Err(err) = std::fs::rename(&spare.path, &at) {
            spares.pool.lock().push(spare);
            return Some(Err(match err.raw_os_error() {
                Some(libc::ENOTEMPTY | libc::EEXIST) => {
                    StageError::Invalid(format!("destination {at:?} exists and is not empty"))
                }
                _ => io_error("rename", &at, "", err),
            }));
        }
        let made = (|| {
            let root = DirFd::open(&at).map_err(|err| io_error("open", &at, "", err))?;
            // A spare of this very tree was checked to hold it exactly.
            if spare.hash != staged.hash {
                let old = self.checked(&spare.hash, spare.size)?;
                let new = walked.dirs[0].1.clone();
                self.transform(&root, "", &old, &new, &mut staged)?;
            }
            build::make_parents(&root, parents, &mut staged)
        })();
        match made {
            Ok(()) => Some(Ok(staged)),
            Err(err) => {
                // Leave `at` as it was: missing, or an empty directory.
                let restored = remove_tree(&at).map(drop).and_then(|()| {
                    if existed {
                        std::fs::create_dir(&at)
                            .map_err(|e| crate::sandbox::materialize::Error::new("mkdir", &at, e))
                    } else {
                        Ok(())
                    }
                });
                if let Err(cleanup) = restored {
                    log::error!("staging {at:?} failed, and so did removing it: {cleanup}");
                }
                Some(Err(err))
            }
        }
    }

    fn checked(&self, hash: &str, size: i64) -> Result<Arc<Checked>, StageError> {
        match self.trees.checked(hash, size) {
            Ok(Some(dir)) => Ok(dir),
            Ok(None) => Err(StageError::Missing(vec![MissingBlob {
                what: "directory",
                hash: hash.to_owned(),
                size,
                path: String::new(),
            }])),
            Err(WalkError::Invalid(why)) => Err(StageError::Invalid(why.to_string())),
            Err(WalkError::Missing(_)) => unreachable!("checked reports a missing blob as None"),
        }
    }

    /// Turns directory `dir` (at `path`), holding tree `old`, into `new`.
    fn transform(
        &self,
        dir: &DirFd,
        path: &str,
        old: &Checked,
        new: &Checked,
        staged: &mut Staged,
    ) -> Result<(), StageError> {
        let root = staged.root.clone();
        // Entries of `old` that `new` does not hold as they are go first,
        // so that a name may change kind.
        for entry in old.entries() {
            let name = entry.name();
            let now = new.find(name);
            if now.is_some_and(|now| same(entry, now)) {
                if let (Entry::Dir(was), Some(Entry::Dir(now))) = (entry, now) {
                    if was.hash != now.hash {
                        let sub_path = join(path, name);
                        let c = CString::new(name).expect("checked: no NUL");
                        let sub = dir
                            .open_at(&c)
                            .map_err(|err| io_error("open", &root, &sub_path, err))?;
                        let (was, now) = (self.checked_dir(was)?, self.checked_dir(now)?);
                        self.transform(&sub, &sub_path, &was, &now, staged)?;
                    }
                }
                continue;
            }
            let c = CString::new(name).expect("checked: no NUL");
            let kind = Some(match entry {
                Entry::Dir(_) => FileKind::Directory,
                Entry::File(_) => FileKind::RegularFile,
                Entry::Symlink(_) => FileKind::Symlink,
            });
            let dir_path = build::staged_path(&root, path);
            remove_entry(dir, &dir_path, &c, kind, &mut Removed::default())?;
        }
        let mut missing = Vec::new();
        for entry in new.entries() {
            let name = entry.name();
            if old.find(name).is_some_and(|was| same(was, entry)) {
                continue;
            }
            let c = CString::new(name).expect("checked: no NUL");
            let entry_path = join(path, name);
            match entry {
                Entry::File(file) => {
                    let how = self.how.mechanism;
                    match build::place_file(self.cas(), how, dir, path, file, &root)? {
                        None => staged.files += 1,
                        Some(blob) => missing.push(blob),
                    }
                }
                Entry::Symlink(link) => {
                    let target = CString::new(&*link.target).expect("checked: no NUL");
                    dir.symlink_at(&target, &c)
                        .map_err(|err| io_error("symlink", &root, &entry_path, err))?;
                }
                Entry::Dir(sub) => {
                    dir.mkdir_at(&c, 0o755)
                        .map_err(|err| io_error("mkdir", &root, &entry_path, err))?;
                    staged.dirs += 1;
                    let fd = dir
                        .open_at(&c)
                        .map_err(|err| io_error("open", &root, &entry_path, err))?;
                    let walked =
                        self.trees
                            .walk("", &sub.hash, sub.size)
                            .map_err(|err| match err {
                                WalkError::Invalid(why) => StageError::Invalid(why.to_string()),
                                WalkError::Missing(_) => StageError::Invalid(format!(
                                    "{entry_path:?}: a directory blob vanished"
                                )),
                            })?;
                    let mut below =
                        Staged::new(&staged.root.join(&entry_path), &sub.hash, sub.size);
                    let filled = build::fill(self.cas(), self.how, &walked, &fd, &mut below);
                    staged.files += below.files;
                    staged.dirs += below.dirs;
                    match filled {
                        Err(StageError::Missing(more)) => {
                            missing.extend(more.into_iter().map(|mut blob| {
                                blob.path = join(&entry_path, &blob.path);
                                blob
                            }))
                        }
                        other => other?,
                    }
                }
            }
        }
        if !missing.is_empty() {
            return Err(StageError::Missing(missing));
        }
        Ok(())
    }

    fn checked_dir(&self, entry: &DirEntry) -> Result<Arc<Checked>, StageError> {
        self.checked(&entry.hash, entry.size)
    }

    /// Keeps `staged` as a spare if it still holds its tree (after removing
    /// what the action added); deletes it otherwise. Returns whether kept.
    pub(super) fn recycle(&self, spares: &Spares, staged: &Staged) -> Result<bool, StageError> {
        let root = &staged.root;
        let clean = (|| {
            let fd = DirFd::open(root).map_err(|err| io_error("open", root, "", err))?;
            let tree = self.checked(&staged.hash, staged.size)?;
            Ok::<_, StageError>(self.holds(spares, &fd, root, &tree)?.then_some(tree))
        })();
        let kept = match clean {
            Ok(Some(top)) => {
                let n = spares.next.fetch_add(1, Ordering::Relaxed);
                let spare = spares.dir.join(n.to_string());
                match std::fs::rename(root, &spare) {
                    Ok(()) => {
                        let overflow = {
                            let mut pool = spares.pool.lock();
                            pool.push(Spare {
                                path: spare,
                                hash: staged.hash.clone(),
                                size: staged.size,
                                top,
                            });
                            (pool.len() > spares.max).then(|| pool.remove(0))
                        };
                        if let Some(old) = overflow {
                            remove_tree(&old.path)?;
                        }
                        return Ok(true);
                    }
                    Err(err) => {
                        log::warn!("keeping {root:?} as a spare: rename: {err}");
                        false
                    }
                }
            }
            Ok(None) => false,
            Err(err) => {
                log::warn!("checking {root:?} for reuse: {err}");
                false
            }
        };
        remove_tree(root)?;
        Ok(kept)
    }

    /// Whether directory `dir` holds exactly `tree` (removing any name the
    /// tree lacks on the way).
    fn holds(
        &self,
        spares: &Spares,
        dir: &DirFd,
        path: &Path,
        tree: &Checked,
    ) -> Result<bool, StageError> {
        let st =
            nix::sys::stat::fstat(dir).map_err(|err| io_error("fstat", path, "", err.into()))?;
        #[allow(clippy::unnecessary_cast)]
        if st.st_mode as u32 & 0o7777 != 0o755 {
            return Ok(false);
        }
        let mut listing = dir
            .entries()
            .map_err(|err| io_error("opendir", path, "", err))?;
        let mut matched = 0;
        for item in listing.iter() {
            let (name, kind, ino) = item.map_err(|err| io_error("readdir", path, "", err))?;
            let Some(entry) = name.to_str().ok().and_then(|n| tree.find(n)) else {
                remove_entry(dir, path, &name, kind, &mut Removed::default())?;
                continue;
            };
            let holds = match entry {
                // A blob the CAS evicted and got again is a new inode:
                // ask again before calling the entry changed.
                Entry::File(file) => {
                    kind == Some(FileKind::RegularFile)
                        && (Some(ino) == self.inode(spares, file, false)
                            || Some(ino) == self.inode(spares, file, true))
                }
                Entry::Symlink(link) => {
                    kind == Some(FileKind::Symlink)
                        && readlink_at(dir.as_fd(), &name)
                            .is_ok_and(|t| t.as_bytes() == link.target.as_bytes())
                }
                Entry::Dir(sub) => {
                    if kind != Some(FileKind::Directory) {
                        false
                    } else {
                        let sub_path = path.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
                        let fd = dir
                            .open_at(&name)
                            .map_err(|err| io_error("open", &sub_path, "", err))?;
                        let tree = self.checked_dir(sub)?;
                        self.holds(spares, &fd, &sub_path, &tree)?
                    }
                }
            };
            if !holds {
                return Ok(false);
            }
            matched += 1;
        }
        Ok(matched == tree.len())
    }

    /// The inode a hard link to `file`'s blob has, if the blob is there:
    /// as last seen, or (`fresh`) as it is now.
    fn inode(
        &self,
        spares: &Spares,
        file: &crate::sandbox::merkle::FileEntry,
        fresh: bool,
    ) -> Option<u64> {
        let key = (blob_name(&file.hash, file.size), file.executable);
        if !fresh {
            if let Some(ino) = spares.inodes.lock().get(&key) {
                return Some(*ino);
            }
        }
        let (source, name) = self
            .cas()
            .source(&file.hash, file.size, file.executable)
            .ok()?;
        let ino = source.stat_at(&name).ok()?.st_ino;
        spares.inodes.lock().insert(key, ino);
        Some(ino)
    }
}

/// Whether two entries are the same, directories by digest.
fn identical(was: Entry, now: Entry) -> bool {
    match (was, now) {
        (Entry::Dir(a), Entry::Dir(b)) => a.hash == b.hash,
        _ => same(was, now),
    }
}

/// Whether entry `was` of an old tree may stay as entry `now` of the new:
/// the same kind and content (a file's whole digest, size too: a tree
/// naming a held hash with another size names a blob the CAS may lack).
/// Directories of different digests stay too, and are transformed in
/// turn.
fn same(was: Entry, now: Entry) -> bool {
    match (was, now) {
        (Entry::File(a), Entry::File(b)) => {
            a.hash == b.hash && a.size == b.size && a.executable == b.executable
        }
        (Entry::Symlink(a), Entry::Symlink(b)) => a.target == b.target,
        (Entry::Dir(_), Entry::Dir(_)) => true,
        _ => false,
    }
}
