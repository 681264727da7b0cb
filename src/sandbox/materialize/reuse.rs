//! Reusing the inputs a native build placed inside a writable directory.
//!
//! In Bazel's layout every input lies inside the writable scratch
//! directory, which Bazel deletes after the destroy. Instead of deleting
//! the inputs one by one, [`stash_out`] moves them into a stash directory
//! of ours with one rename per directory that holds only inputs; a later
//! sandbox takes a stash, [`reshape`]s it into its own inputs (only
//! the difference costs system calls) and [`put_in`] moves it into its
//! scratch directory the same way.
//!
//! What an action wrote never reaches the next sandbox: each directory the
//! build made is stamped right after it was made ([`stamp`]); a directory
//! whose stamp changed (an entry added, removed or renamed in it) is not
//! moved whole but entry by entry, so what is not ours stays where the
//! action put it. The stash keeps the build's stamps: a rename changes
//! only the change time of the directory renamed, which is stamped again
//! right after its move, and the directories stash_out made are stamped
//! when it is done. A stash is used only if it is [`unchanged_tree`], so a
//! change anywhere in it after the check before the move is caught when
//! it is taken. A build from a stash keeps the stash's stamps but for the
//! directories its reshape changed or made and those it moved in
//! ([`restamped`]): a change since the check then shows as one.
//!
//! Every path below a writable directory is resolved from its pinned
//! descriptor without following symlinks.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, OsStr, OsString};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::OFlag;
use nix::sys::stat::{FileStat, Mode};

use super::shape::{Dir, Node};
use super::{Error, Trash};
use crate::sandbox::dirfd::beneath::open_beneath;
use crate::sandbox::dirfd::{c_name, kind_of, readlink_at, Anchor, DirFd};
use crate::sandbox::file_kind::FileKind;
use crate::sys;

/// Mode of the directories a reshape makes, as the materializer's.
const DIR_MODE: u32 = 0o755;

/// What changes when an entry is added to, removed from or renamed in a
/// directory: its change time, modification time, size and link count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    ino: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
    size: i64,
    nlink: u64,
}

impl Stamp {
    // Field widths differ between platforms.
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    fn of(st: &FileStat) -> Stamp {
        Stamp {
            ino: st.st_ino as u64,
            ctime: (st.st_ctime as i64, st.st_ctime_nsec as i64),
            mtime: (st.st_mtime as i64, st.st_mtime_nsec as i64),
            size: st.st_size as i64,
            nlink: st.st_nlink as u64,
        }
    }
}

impl Stamp {
    /// The stamp as numbers, for handing a stash on to another process.
    pub fn to_words(self) -> [i64; 7] {
        [
            self.ino as i64,
            self.ctime.0,
            self.ctime.1,
            self.mtime.0,
            self.mtime.1,
            self.size,
            self.nlink as i64,
        ]
    }

    pub fn from_words(words: [i64; 7]) -> Stamp {
        Stamp {
            ino: words[0] as u64,
            ctime: (words[1], words[2]),
            mtime: (words[3], words[4]),
            size: words[5],
            nlink: words[6] as u64,
        }
    }

    /// The stamp of directory `dir` now.
    pub fn of_dir(dir: &DirFd) -> io::Result<Stamp> {
        Ok(Stamp::of(&nix::sys::stat::fstat(dir)?))
    }

    /// Whether `other` differs from this at most in its change time, as a
    /// directory that was only renamed does.
    pub fn same_but_renamed(&self, other: &Stamp) -> bool {
        Stamp {
            ctime: other.ctime,
            ..*self
        } == *other
    }
}

/// Stamps of the directories a build made, by path below the writable
/// directory.
pub type Stamps = HashMap<PathBuf, Stamp>;

fn err(syscall: &'static str, base: &Path, rel: &Path, source: io::Error) -> Error {
    Error::new(syscall, &base.join(rel), source)
}

fn c(name: &OsStr, base: &Path, rel: &Path) -> Result<std::ffi::CString, Error> {
    c_name(name).map_err(|e| err("open", base, rel, e))
}

/// Opens directory `rel` below `root` (`""` for `root` itself), following
/// no symlink.
fn open_rel(root: &Anchor, rel: &Path) -> io::Result<DirFd> {
    if rel.as_os_str().is_empty() {
        return DirFd::reopen(root);
    }
    let rel = c_name(rel.as_os_str())?;
    open_beneath(
        root.fd()?,
        &rel,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        Mode::empty(),
    )
    .map(DirFd::from_owned)
}

/// Stamps every directory at and below the entries `placed` (paths below
/// `root` that a build made, as in `shape`).
pub fn stamp(root: &Anchor, shape: &Dir, placed: &[PathBuf]) -> Result<Stamps, Error> {
    let mut stamps = Stamps::new();
    let base = root.path();
    for rel in placed {
        let Some(Node::Dir(dir)) = shape.at(rel) else {
            continue;
        };
        let (parent, name) = split(rel);
        let parent_dir = open_rel(root, parent).map_err(|e| err("openat2", base, parent, e))?;
        let cname = c(name, base, rel)?;
        stamp_dir(&parent_dir, &cname, dir, rel, base, &mut stamps)?;
    }
    Ok(stamps)
}

/// Stamps directory `name` of `parent` (at `rel` below `base`) and every
/// directory of `dir` below it.
fn stamp_dir(
    parent: &DirFd,
    name: &CStr,
    dir: &Dir,
    rel: &Path,
    base: &Path,
    stamps: &mut Stamps,
) -> Result<(), Error> {
    let st = parent
        .stat_at(name)
        .map_err(|e| err("fstatat", base, rel, e))?;
    stamps.insert(rel.to_owned(), Stamp::of(&st));
    let mut subdirs = dir.subdirs().peekable();
    if subdirs.peek().is_none() {
        return Ok(());
    }
    let opened = parent
        .open_at(name)
        .map_err(|e| err("openat", base, rel, e))?;
    for (sub_name, sub) in subdirs {
        let sub_rel = rel.join(sub_name);
        let cname = c(sub_name, base, &sub_rel)?;
        stamp_dir(&opened, &cname, sub, &sub_rel, base, stamps)?;
    }
    Ok(())
}

fn split(rel: &Path) -> (&Path, &OsStr) {
    (
        rel.parent().unwrap_or(Path::new("")),
        rel.file_name().unwrap_or_default(),
    )
}

/// Whether directory `name` of `parent` (at `rel`) and every directory
/// below it still carries the stamp it had.
fn unchanged(parent: &DirFd, name: &CStr, dir: &Dir, rel: &Path, stamps: &Stamps) -> bool {
    let Some(stamp) = stamps.get(rel) else {
        return false;
    };
    let Ok(st) = parent.stat_at(name) else {
        return false;
    };
    if Stamp::of(&st) != *stamp {
        return false;
    }
    let mut subdirs = dir.subdirs().peekable();
    if subdirs.peek().is_none() {
        return true;
    }
    let Ok(opened) = parent.open_at(name) else {
        return false;
    };
    subdirs.all(|(sub_name, sub)| {
        c_name(sub_name).is_ok_and(|c| unchanged(&opened, &c, sub, &rel.join(sub_name), stamps))
    })
}

/// Whether `name` of `dir` is a symlink to `target`.
fn links_to(dir: &DirFd, name: &CStr, target: &OsStr) -> bool {
    readlink_at(dir.as_fd(), name).is_ok_and(|found| found.as_bytes() == target.as_bytes())
}

/// A shape being assembled from the parts that moved.
#[derive(Default)]
struct Draft(BTreeMap<OsString, Part>);

enum Part {
    Draft(Draft),
    Done(Node),
}

impl Draft {
    /// The directory at `rel`, made (empty) where missing.
    fn dir_at(&mut self, rel: &Path) -> Option<&mut Draft> {
        let mut draft = self;
        for component in rel.iter() {
            let part = draft
                .0
                .entry(component.to_owned())
                .or_insert_with(|| Part::Draft(Draft::default()));
            draft = match part {
                Part::Draft(inner) => inner,
                // Never: placed entries do not lie inside one another.
                Part::Done(_) => return None,
            };
        }
        Some(draft)
    }

    fn insert(&mut self, rel: &Path, node: Node) {
        let (parent, name) = split(rel);
        if let Some(dir) = self.dir_at(parent) {
            dir.0.insert(name.to_owned(), Part::Done(node));
        }
    }

    fn finish(self) -> Dir {
        Dir::new(
            self.0
                .into_iter()
                .map(|(name, part)| match part {
                    Part::Draft(draft) => (name, Node::Dir(Arc::new(draft.finish()))),
                    Part::Done(node) => (name, node),
                })
                .collect(),
        )
    }
}

/// Moves the entries `placed` (paths below `root` that a build made, as
/// in `shape`, stamped in `stamps`) into `stash` (an empty directory of
/// ours at `stash_path`, on the same file system), at the same paths.
/// Returns the shape of what moved, with the stamps the stash has now;
/// what an action added stays behind. On error, what already moved is in
/// the stash.
pub fn stash_out(
    root: &Anchor,
    mut shape: Dir,
    placed: &[PathBuf],
    stamps: Stamps,
    stash: &DirFd,
    stash_path: &Path,
) -> Result<(Dir, Stamps), Error> {
    let base = root.path();
    let mut moved = Draft::default();
    let mut mover = Mover {
        stamps,
        made: Vec::new(),
        base,
    };
    let mut opened: HashMap<PathBuf, (DirFd, DirFd)> = HashMap::new();
    for rel in placed {
        let Some(node) = shape.take(rel) else {
            continue;
        };
        let (parent, name) = split(rel);
        if !opened.contains_key(parent) {
            let from = match open_rel(root, parent) {
                Ok(dir) => dir,
                // The action removed or replaced the directory: nothing
                // of ours is left to take from it.
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(err("openat2", base, parent, e)),
            };
            let to = make_dirs(stash, stash_path, parent, &mut mover.made)?;
            // The shape says what the stash holds, empty directories too.
            moved.dir_at(parent);
            opened.insert(parent.to_owned(), (from, to));
        }
        let (from, to) = &opened[parent];
        let cname = c(name, base, rel)?;
        if let Some(node) = mover.move_node(from, to, &cname, node, rel)? {
            moved.insert(rel, node);
        }
    }
    // Last, as moves into them changed them.
    let mut stamps = mover.stamps;
    let made = mover.made.iter().map(|(rel, dir)| (rel.as_path(), dir));
    for (rel, dir) in made.chain([(Path::new(""), stash)]) {
        let st = nix::sys::stat::fstat(dir).map_err(|e| err("fstat", stash_path, rel, e.into()))?;
        stamps.insert(rel.to_owned(), Stamp::of(&st));
    }
    Ok((moved.finish(), stamps))
}

/// Whether an error says the entry is gone or no longer a directory.
fn gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
    )
}

/// Opens directory `rel` of `stash`, making the missing ones.
fn make_dirs(
    stash: &DirFd,
    stash_path: &Path,
    rel: &Path,
    made: &mut Vec<(PathBuf, DirFd)>,
) -> Result<DirFd, Error> {
    let mut dir = DirFd::open_at_with(stash.as_fd(), c".", OFlag::O_RDONLY | OFlag::O_DIRECTORY)
        .map_err(|e| Error::new("openat", stash_path, e))?;
    let mut walked = PathBuf::new();
    for name in rel.iter() {
        walked.push(name);
        let cname = c(name, stash_path, &walked)?;
        let new = match dir.mkdir_at(&cname, DIR_MODE) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => false,
            Err(e) => return Err(err("mkdirat", stash_path, &walked, e)),
        };
        dir = dir
            .open_at(&cname)
            .map_err(|e| err("openat", stash_path, &walked, e))?;
        if new {
            let level = dir
                .open_at(c".")
                .map_err(|e| err("openat", stash_path, &walked, e))?;
            made.push((walked.clone(), level));
        }
    }
    Ok(dir)
}

/// Moves entries into a stash, carrying their stamps along.
struct Mover<'a> {
    /// The build's stamps, becoming the stash's.
    stamps: Stamps,
    /// Directories made in the stash above the entries placed (a few
    /// levels), stamped once everything moved.
    made: Vec<(PathBuf, DirFd)>,
    base: &'a Path,
}

impl Mover<'_> {
    /// Moves `name` (shaped `node`, at `rel`) from `from` to `to`: whole
    /// if it is a link or an unchanged directory, else entry by entry.
    /// `None` if it is gone.
    fn move_node(
        &mut self,
        from: &DirFd,
        to: &DirFd,
        name: &CStr,
        node: Node,
        rel: &Path,
    ) -> Result<Option<Node>, Error> {
        let base = self.base;
        let whole = match &node {
            // A symlink of ours, not what an action put in its place.
            Node::Link(target) => {
                if !links_to(from, name, target) {
                    return Ok(None);
                }
                true
            }
            Node::Dir(dir) => unchanged(from, name, dir, rel, &self.stamps),
        };
        if whole {
            return match sys::rename_noreplace(from.as_fd(), name, to.as_fd(), name) {
                Ok(()) => {
                    let same = match &node {
                        Node::Link(target) => links_to(to, name, target),
                        Node::Dir(_) => self.restamp_renamed(to, name, rel),
                    };
                    match same {
                        true => Ok(Some(node)),
                        false => Err(Error::other(
                            &base.join(rel),
                            "changed while it was being stashed",
                        )),
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
                Err(e) => Err(err("renameat2", base, rel, e)),
            };
        }
        let Node::Dir(dir) = node else {
            unreachable!("links always move whole")
        };
        let sub_from = match from.open_at(name) {
            Ok(sub) => sub,
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(err("openat", base, rel, e)),
        };
        to.mkdir_at(name, DIR_MODE)
            .map_err(|e| err("mkdirat", base, rel, e))?;
        let sub_to = to.open_at(name).map_err(|e| err("openat", base, rel, e))?;
        let mut entries = BTreeMap::new();
        for (child_name, child) in Arc::unwrap_or_clone(dir).into_entries() {
            let child_rel = rel.join(&child_name);
            let cname = c(&child_name, base, &child_rel)?;
            if let Some(moved) = self.move_node(&sub_from, &sub_to, &cname, child, &child_rel)? {
                entries.insert(child_name, moved);
            }
        }
        // Complete: nothing else moves into it.
        let st = nix::sys::stat::fstat(&sub_to).map_err(|e| err("fstat", base, rel, e.into()))?;
        self.stamps.insert(rel.to_owned(), Stamp::of(&st));
        // Left behind if the action put something of its own in it.
        match from.unlink_at(name, true) {
            Ok(()) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST)) => {}
            Err(e) => return Err(err("unlinkat(AT_REMOVEDIR)", base, rel, e)),
        }
        Ok(Some(Node::Dir(Arc::new(Dir::new(entries)))))
    }

    /// Whether directory `name` of `to`, just renamed there, still carries
    /// its stamp but for the change time the rename gave it, which its
    /// stamp takes. The directories below keep theirs: a rename does not
    /// touch them, and a change to them since the check shows when the
    /// stash is taken.
    fn restamp_renamed(&mut self, to: &DirFd, name: &CStr, rel: &Path) -> bool {
        let (Some(stamp), Ok(st)) = (self.stamps.get_mut(rel), to.stat_at(name)) else {
            return false;
        };
        let now = Stamp::of(&st);
        let kept = Stamp {
            ctime: stamp.ctime,
            ..now
        };
        if kept != *stamp {
            return false;
        }
        stamp.ctime = now.ctime;
        true
    }
}

/// Stamps `dir` (at `path`; under `""`) and every directory of `shape`
/// below it, as [`stash_out`] leaves a stash's stamps.
#[cfg(test)]
pub fn stamp_tree(dir: &DirFd, path: &Path, shape: &Dir) -> Result<Stamps, Error> {
    let mut stamps = Stamps::new();
    let st = nix::sys::stat::fstat(dir).map_err(|e| Error::new("fstat", path, e.into()))?;
    stamps.insert(PathBuf::new(), Stamp::of(&st));
    for (name, sub) in shape.subdirs() {
        let rel = Path::new(name);
        let cname = c(name, path, rel)?;
        stamp_dir(dir, &cname, sub, rel, path, &mut stamps)?;
    }
    Ok(stamps)
}

/// Whether `dir` and every directory of `shape` below it still carry the
/// stamps they had: nothing was added, removed or renamed.
pub fn unchanged_tree(dir: &DirFd, shape: &Dir, stamps: &Stamps) -> bool {
    let root = nix::sys::stat::fstat(dir).map(|st| Stamp::of(&st));
    root.ok().as_ref() == stamps.get(Path::new(""))
        && shape.subdirs().all(|(name, sub)| {
            c_name(name).is_ok_and(|c| unchanged(dir, &c, sub, Path::new(name), stamps))
        })
}

/// The directories of a build from a stash whose stamps changed since the
/// stash's were checked: for a directory alone, or with all below it.
#[derive(Default)]
pub struct Restamp {
    /// Added to, removed from or renamed: the directory alone.
    changed: Vec<PathBuf>,
    /// Made by the reshape: the directory and every one below it.
    made: Vec<PathBuf>,
}

impl Restamp {
    /// Entries `placed` (paths below the writable directory) were renamed
    /// in: a rename changes the change time of what moved.
    pub fn moved_in(&mut self, placed: &[PathBuf]) {
        self.changed.extend_from_slice(placed);
    }
}

/// Turns directory `dir` (at `path`; `rel` below the stash), shaped
/// `have`, into `want`: removes what `want` lacks (directories through
/// `trash`), keeps what both hold and makes the rest. Returns the entries
/// created and removed; notes in `restamp` every directory whose stamp
/// this changed (an entry added or removed in it) or that it made.
pub fn reshape(
    dir: &DirFd,
    path: &Path,
    rel: &Path,
    have: &Dir,
    want: &Dir,
    trash: &Trash,
    restamp: &mut Restamp,
) -> Result<usize, Error> {
    let mut changes = 0;
    for (name, old) in have.entries() {
        if want.get(name).is_none() {
            remove(dir, path, name, old, trash)?;
            changes += 1;
        }
    }
    let removed = changes > 0;
    let mut made = false;
    for (name, new) in want.entries() {
        match have.get(name) {
            Some(old) if old.digest() == new.digest() && old == new => continue,
            Some(Node::Dir(old)) if matches!(new, Node::Dir(_)) => {
                let Node::Dir(new) = new else { unreachable!() };
                let cname = c(name, path, Path::new(""))?;
                let sub_path = path.join(name);
                let sub = dir
                    .open_at(&cname)
                    .map_err(|e| Error::new("openat", &sub_path, e))?;
                changes += reshape(&sub, &sub_path, &rel.join(name), old, new, trash, restamp)?;
                continue;
            }
            Some(old) => {
                remove(dir, path, name, old, trash)?;
                changes += create(dir, path, name, new)?;
            }
            None => changes += create(dir, path, name, new)?,
        }
        made = true;
        if matches!(new, Node::Dir(_)) {
            restamp.made.push(rel.join(name));
        }
    }
    if removed || made {
        restamp.changed.push(rel.to_owned());
    }
    Ok(changes)
}

/// The stamps of a build from a stash: the stash's `carried` (checked
/// just before the reshape) for the directories the reshape and the move
/// in left alone, those of `restamp` (paths below `root`, as in `shape`)
/// stamped anew. Stamps [`stamp`] would give, for a fraction of its
/// system calls; a directory changed since the check carries its old
/// stamp, and shows as changed when the sandbox is stashed.
pub fn restamped(
    root: &Anchor,
    shape: &Dir,
    mut carried: Stamps,
    mut restamp: Restamp,
) -> Result<Stamps, Error> {
    let base = root.path();
    // A directory both changed and moved in is stamped once.
    restamp.changed.sort_unstable();
    restamp.changed.dedup();
    let alone = restamp.changed.iter().map(|rel| (rel, false));
    let with_below = restamp.made.iter().map(|rel| (rel, true));
    for (rel, below) in alone.chain(with_below) {
        let Some(Node::Dir(dir)) = shape.at(rel) else {
            continue;
        };
        let (parent, name) = split(rel);
        let parent_dir = open_rel(root, parent).map_err(|e| err("openat2", base, parent, e))?;
        let cname = c(name, base, rel)?;
        if below {
            stamp_dir(&parent_dir, &cname, dir, rel, base, &mut carried)?;
        } else {
            let st = parent_dir
                .stat_at(&cname)
                .map_err(|e| err("fstatat", base, rel, e))?;
            carried.insert(rel.clone(), Stamp::of(&st));
        }
    }
    Ok(carried)
}

fn remove(dir: &DirFd, path: &Path, name: &OsStr, node: &Node, trash: &Trash) -> Result<(), Error> {
    let entry = path.join(name);
    match node {
        Node::Link(_) => {
            let cname = c(name, path, Path::new(""))?;
            dir.unlink_at(&cname, false)
                .map_err(|e| Error::new("unlinkat", &entry, e))
        }
        Node::Dir(_) => trash.discard(&entry),
    }
}

/// Makes `node` as `name` of `dir`; returns the entries made.
fn create(dir: &DirFd, path: &Path, name: &OsStr, node: &Node) -> Result<usize, Error> {
    let entry = path.join(name);
    let cname = c(name, path, Path::new(""))?;
    match node {
        Node::Link(target) => {
            let target = c_name(target).map_err(|e| Error::new("symlinkat", &entry, e))?;
            dir.symlink_at(&target, &cname)
                .map_err(|e| Error::new("symlinkat", &entry, e))?;
            Ok(1)
        }
        Node::Dir(sub) => {
            dir.mkdir_at(&cname, DIR_MODE)
                .map_err(|e| Error::new("mkdirat", &entry, e))?;
            let opened = dir
                .open_at(&cname)
                .map_err(|e| Error::new("openat", &entry, e))?;
            let mut made = 1;
            for (child_name, child) in sub.entries() {
                made += create(&opened, &entry, child_name, child)?;
            }
            Ok(made)
        }
    }
}

/// Moves the contents of `stash` (shaped `shape`) into `root`'s directory,
/// one rename per entry `root` lacks, descending into directories `root`
/// already has. Returns the paths moved (below `root`) with the outcome:
/// on error, what moved so far is in the list, for the caller to undo.
pub fn put_in(stash: &DirFd, shape: &Dir, root: &Anchor) -> (Vec<PathBuf>, Result<(), Error>) {
    let mut placed = Vec::new();
    let outcome = DirFd::reopen(root)
        .map_err(|e| Error::new("open", root.path(), e))
        .and_then(|dir| put_dir(stash, shape, &dir, Path::new(""), root.path(), &mut placed));
    (placed, outcome)
}

fn put_dir(
    from: &DirFd,
    shape: &Dir,
    to: &DirFd,
    rel: &Path,
    base: &Path,
    placed: &mut Vec<PathBuf>,
) -> Result<(), Error> {
    for (name, node) in shape.entries() {
        let entry_rel = rel.join(name);
        let cname = c(name, base, &entry_rel)?;
        match sys::rename_noreplace(from.as_fd(), &cname, to.as_fd(), &cname) {
            Ok(()) => placed.push(entry_rel),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                let theirs = to.stat_at(&cname).map(|st| kind_of(&st));
                let Node::Dir(sub) = node else {
                    return Err(already_there(base, &entry_rel));
                };
                if !matches!(theirs, Ok(FileKind::Directory)) {
                    return Err(already_there(base, &entry_rel));
                }
                // The owner's directory: fill it, never take it over.
                let sub_from = from
                    .open_at(&cname)
                    .map_err(|e| err("openat", base, &entry_rel, e))?;
                let sub_to = to
                    .open_at(&cname)
                    .map_err(|e| err("openat", base, &entry_rel, e))?;
                put_dir(&sub_from, sub, &sub_to, &entry_rel, base, placed)?;
            }
            Err(e) => return Err(err("renameat2", base, &entry_rel, e)),
        }
    }
    Ok(())
}

fn already_there(base: &Path, rel: &Path) -> Error {
    Error::other(
        &base.join(rel),
        "already exists in a writable directory, and a native sandbox cannot hide it as the \
         mount would",
    )
}
