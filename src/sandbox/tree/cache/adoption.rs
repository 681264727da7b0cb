//! A new sandbox taking over a destroyed sandbox's kernel cache.
//!
//! Every input an action reaches through a new sandbox costs a LOOKUP round
//! trip, because the kernel caches names per directory and every sandbox
//! is a new directory. But consecutive actions map mostly the same inputs
//! at the same paths, and the kernel still holds the last destroyed
//! sandboxes' entries (`retention`). So a new sandbox takes over the
//! inode numbers of one of them: its top directory gets the destroyed
//! one's top inode, and when the kernel looks the new name up and gets an
//! inode it already has a directory entry for, it moves that entry, with
//! everything cached below it, to the new name (a directory has one entry
//! in the kernel). Each name below is checked first:
//!
//! - a directory in both trees keeps its inode (the new sandbox's node
//!   takes over the lookups the kernel holds) and is checked in turn; if
//!   its underlying directory differs, its cached attributes are dropped,
//!   and so is every entry found in the old underlying directory;
//! - a read-only input in both keeps its (shared) inode only if the new
//!   mapping's object is that same file with the attributes the kernel
//!   was last told (one `fstatat`: identity, size, times);
//! - anything else the kernel knows in the old tree is invalidated.
//!
//! A writable directory that is the same directory in both (a reused
//! slot's workspace, emptied and given the next action's output
//! directories) is asked what it holds now: a directory found there
//! before and there again keeps its node, checked in turn.
//!
//! Names the kernel cached as absent in a directory stay so only where the
//! new directory shows the same contents and has no such name. Names only
//! in the new tree need nothing else: the kernel asks for them. What is
//! kept is what the kernel would have been told by a lookup, so the view
//! is the same as without this; only the round trips are gone.

use std::ffi::{OsStr, OsString};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::super::attr::{fingerprint, FileKind};
use super::super::error::Errno;
use super::super::name::Name;
use super::super::namespace::{
    backing_dir, is_shareable, may_be_shareable, require_object, type_entry,
};
use super::super::node::{Node, Origin};
use super::super::underlying::UDir;
use super::super::SandboxFs;
use crate::sandbox::dirfd::kind_of;

/// Inputs of a new sandbox sampled to choose which destroyed sandbox's
/// cache to take over, and how many destroyed sandboxes are considered.
const SAMPLES: usize = 32;
pub(in crate::sandbox::tree) const CANDIDATES: usize = 8;

/// What the kernel must be told for the new tree to show right: entries
/// to drop and directories whose attributes to drop.
#[derive(Default)]
pub(in crate::sandbox::tree) struct Adopted {
    pub stale_entries: Vec<(u64, OsString)>,
    pub stale_attrs: Vec<u64>,
    /// Names kept, for the log and tests.
    pub kept: usize,
}

impl SandboxFs {
    /// Gives `tree` (a new sandbox, not yet visible) the kernel's inodes of
    /// destroyed sandbox top `old` wherever they still stand for the same
    /// objects. `None` if the kernel no longer knows `old`.
    pub(in crate::sandbox::tree) fn adopt_cache(
        &self,
        old: &Arc<Node>,
        tree: &Arc<Node>,
    ) -> Option<Adopted> {
        let ino = old.ino();
        if ino == 0 || !self.inodes.adopt_own(ino, old, tree) {
            return None;
        }
        let mut adopted = Adopted::default();
        self.adopt_dir(old, tree, &mut adopted);
        Some(adopted)
    }

    /// Which of `candidates` (destroyed sandboxes' tops, with their
    /// mapping counts) to take over for `tree` (of `mappings` mappings):
    /// the one whose cache would keep the most of `tree`'s inputs minus
    /// what it would drop. An input cached in a destroyed sandbox but not
    /// in `tree` is dropped from the kernel (its entry must go), and with
    /// it its pages if no other cached sandbox has it: a small action must
    /// not take over a large one's cache. Both sides are estimated from
    /// samples (of the candidates' alone when `tree` has lazy
    /// directories). `None` if no candidate gains.
    pub(in crate::sandbox::tree) fn choose_donor(
        &self,
        tree: &Arc<Node>,
        mappings: usize,
        lazy: bool,
        candidates: &[Candidate],
    ) -> Option<usize> {
        // A tree with lazy directories has few inputs made yet (`sample`
        // sees only those): then the candidates' cached inputs are looked
        // for in it instead, which makes only the directories they are in,
        // those the action will likely reach as the one before did.
        let wanted = if lazy {
            Vec::new()
        } else {
            let wanted = sample(tree, mappings);
            if wanted.is_empty() {
                return None;
            }
            wanted
        };
        // Inputs of `from` that `to` has cached at the same path.
        let cached_in = |to: &Arc<Node>, from: &[(Vec<OsString>, Arc<Node>)]| {
            from.iter()
                .filter(|(path, input)| {
                    cached_at(to, path).is_some_and(|other| {
                        self.kernel_knows(&other) && same_location(&other, input)
                    })
                })
                .count()
        };
        let mut best = None;
        for (at, candidate) in candidates.iter().enumerate() {
            // A cached entry holds its parent's: if the kernel does not
            // know the top, it has nothing below it (no walk then).
            if !self.kernel_knows(&candidate.top) {
                continue;
            }
            let hits = if lazy {
                0
            } else {
                match cached_in(&candidate.top, &wanted) {
                    0 => continue,
                    hits => hits,
                }
            };
            // The candidate's cached inputs, and how many `tree` holds.
            let theirs: Vec<_> = sample(&candidate.top, candidate.mappings)
                .into_iter()
                .filter(|(_, input)| self.kernel_knows(input))
                .collect();
            let found = theirs
                .iter()
                .filter(|(path, input)| {
                    cached_at(tree, path).is_some_and(|mine| same_location(&mine, input))
                })
                .count();
            let scale = |n: usize| n * candidate.mappings / theirs.len().max(1);
            let kept = if lazy {
                if found == 0 {
                    continue;
                }
                scale(found)
            } else {
                hits * mappings / wanted.len()
            };
            let dropped = scale(theirs.len() - found);
            let gain = kept as i64 - dropped as i64;
            if gain > 0 && best.is_none_or(|(best_gain, _)| gain > best_gain) {
                best = Some((gain, at));
            }
        }
        best.map(|(_, at)| at)
    }

    /// `new` took over `old`'s inode: checks their entries the kernel knows.
    fn adopt_dir(&self, old: &Arc<Node>, new: &Arc<Node>, adopted: &mut Adopted) {
        let (Ok(old_dir), Ok(new_dir)) = (old.dir(), new.dir()) else {
            return;
        };
        let ino = new.ino();
        // What the kernel cached of the directory itself, and the names it
        // cached as absent, still hold if both show the same underlying
        // directory, or none (only their explicit entries).
        let same_contents =
            same_backing(old, new) || (!shows_underlying(old) && !shows_underlying(new));
        // The same writable directory (a reused slot's workspace, emptied
        // and given the next action's output directories): what it holds
        // now is asked of it.
        let refilled = same_contents && new.is_writable();
        // `Some(None)`: there is no underlying directory (yet), so every
        // name but the explicit ones is absent.
        let backing = if refilled {
            backing_dir(new).ok()
        } else {
            None
        };
        // A writable directory's own attributes (times, links) change with
        // what the last action made in it, even where it is the same one.
        if !same_contents || new.is_writable() {
            adopted.stale_attrs.push(ino);
        }
        for name in old_dir.negatives() {
            let still_absent = match &backing {
                Some(Some(dir)) => is_absent_in(dir, &name),
                Some(None) => true,
                None => !refilled,
            };
            if same_contents
                && still_absent
                && !new_dir.has_explicit(&name)
                && new_dir.note_negative(&name)
            {
                continue;
            }
            adopted.stale_entries.push((ino, name));
        }
        for (name, old_child) in old_dir.made_entries() {
            if !self.kernel_knows(&old_child) {
                continue;
            }
            let kept = new_dir
                .explicit(&name)
                .is_some_and(|new_child| self.adopt_child(&old_child, &new_child, adopted));
            if kept {
                adopted.kept += 1;
            } else {
                adopted.stale_entries.push((ino, name));
            }
        }
        // Entries found in the old underlying directory. Another directory
        // (a writable mapping's fresh scratch directory) has none of them;
        // a refilled one may have a directory of the same name again (an
        // output's parent, made for the next action too), whose entries
        // the kernel keeps, checked in turn. Everything else is dropped.
        let discovered: Vec<(OsString, Arc<Node>)> = old_dir.discovered().lock().drain().collect();
        let refilled_dir = backing.as_ref().and_then(Option::as_ref);
        self.keep_found_dirs(refilled_dir, new, discovered, adopted);
    }

    /// Of `found` (entries found in `parent`'s old underlying directory,
    /// which is `dir` refilled, or another), keeps the directories that
    /// are there again, each checked in turn
    /// ([`SandboxFs::recheck_found_dir`]); drops the rest from the kernel.
    fn keep_found_dirs(
        &self,
        dir: Option<&UDir>,
        parent: &Arc<Node>,
        found: Vec<(OsString, Arc<Node>)>,
        adopted: &mut Adopted,
    ) {
        for (name, child) in found {
            if dir.is_some_and(|dir| self.keep_found_dir(dir, &name, &child, parent)) {
                adopted.kept += 1;
                self.recheck_found_dir(&child, adopted);
            } else {
                adopted.stale_entries.push((parent.ino(), name));
            }
        }
    }

    /// Whether `child`, a directory found as `name` in a refilled
    /// directory (`dir`, shown by `parent`), is there again and not
    /// hidden by an explicit entry: if so, it becomes `parent`'s, with the
    /// kernel's entry for it.
    fn keep_found_dir(
        &self,
        dir: &UDir,
        name: &OsStr,
        child: &Arc<Node>,
        parent: &Arc<Node>,
    ) -> bool {
        if !child.is_dir() || child.lookups.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let is_dir_again = dir
            .stat_entry(name)
            .is_ok_and(|st| kind_of(&st) == FileKind::Directory);
        if !is_dir_again {
            return false;
        }
        let Ok(parent_dir) = parent.dir() else {
            return false;
        };
        if parent_dir.has_explicit(name) {
            return false;
        }
        child.set_origin(Origin::Child {
            parent: Arc::downgrade(parent),
            name: Name::new(name),
        });
        parent_dir
            .discovered()
            .lock()
            .insert(name.to_owned(), child.clone());
        true
    }

    /// Checks what the kernel knows below `node`, a directory found again
    /// in a refilled directory ([`SandboxFs::keep_found_dir`]): its
    /// attributes are new, names it cached as absent stay so only where
    /// they still are, and entries found in it are kept only where a
    /// directory of the name is there again.
    fn recheck_found_dir(&self, node: &Arc<Node>, adopted: &mut Adopted) {
        let ino = node.ino();
        adopted.stale_attrs.push(ino);
        let (Ok(data), Ok(Some(dir))) = (node.dir(), backing_dir(node)) else {
            return;
        };
        for name in data.take_negatives() {
            if is_absent_in(&dir, &name) && data.note_negative(&name) {
                continue;
            }
            adopted.stale_entries.push((ino, name));
        }
        let discovered: Vec<(OsString, Arc<Node>)> = data.discovered().lock().drain().collect();
        self.keep_found_dirs(Some(&dir), node, discovered, adopted);
    }

    /// Whether the kernel's entry for `old` can stand for `new`.
    fn adopt_child(&self, old: &Arc<Node>, new: &Arc<Node>, adopted: &mut Adopted) -> bool {
        // A new input is typed here rather than at its first lookup (which
        // taking over makes unnecessary), by the lstat this needs anyway.
        let fresh = match new.typed_kind() {
            Some(_) => None,
            None => match type_entry(new) {
                Ok(st) => Some(st),
                Err(_) => return false,
            },
        };
        if old.is_dir() && new.is_dir() {
            if !self.inodes.adopt_own(old.ino(), old, new) {
                return false;
            }
            self.adopt_dir(old, new, adopted);
            return true;
        }
        if !is_shareable(old) || !is_shareable(new) {
            return false;
        }
        // The kernel caches the attributes (and pages) it was last given
        // for the shared inode: keep it only if the file is still that.
        let st = match fresh {
            Some(st) => st,
            None => match require_object(new).and_then(|object| object.stat()) {
                Ok(st) => st,
                Err(_) => return false,
            },
        };
        self.inodes.adopt_shared(old.ino(), fingerprint(&st), new)
    }

    /// Whether the kernel holds an entry for `node` (a name it looked up).
    fn kernel_knows(&self, node: &Node) -> bool {
        if is_shareable(node) {
            return node.ino() != 0 && self.inodes.get(node.ino()).is_some();
        }
        node.lookups.load(Ordering::Relaxed) > 0
    }
}

/// A destroyed sandbox a new one may take over: its top directory and
/// its number of mappings.
pub(in crate::sandbox::tree) struct Candidate {
    pub top: Arc<Node>,
    pub mappings: usize,
}

/// About [`SAMPLES`] read-only inputs of the tree below `top` (of about
/// `mappings` mappings), spread over it, with their paths.
fn sample(top: &Node, mappings: usize) -> Vec<(Vec<OsString>, Arc<Node>)> {
    let mut samples = Vec::with_capacity(SAMPLES);
    let mut path = Vec::new();
    let mut seen = 0;
    sample_inputs(
        top,
        (mappings / SAMPLES).max(1),
        &mut seen,
        &mut path,
        &mut samples,
    );
    samples
}

/// Collects every `stride`-th read-only input below `dir` (up to
/// [`SAMPLES`]) with its path.
fn sample_inputs(
    dir: &Node,
    stride: usize,
    seen: &mut usize,
    path: &mut Vec<OsString>,
    samples: &mut Vec<(Vec<OsString>, Arc<Node>)>,
) {
    let Ok(data) = dir.dir() else {
        return;
    };
    data.visit_explicit(|name, child| {
        if samples.len() >= SAMPLES {
            return;
        }
        path.push(name.to_owned());
        if child.is_dir() {
            sample_inputs(child, stride, seen, path, samples);
        } else if may_be_shareable(child) {
            if *seen % stride == 0 {
                samples.push((path.clone(), child.clone()));
            }
            *seen += 1;
        }
        path.pop();
    });
}

/// The node at `path` below `top`, through explicit entries.
fn cached_at(top: &Arc<Node>, path: &[OsString]) -> Option<Arc<Node>> {
    let mut node = top.clone();
    for name in path {
        let next = node.dir().ok()?.explicit(name)?;
        node = next;
    }
    Some(node)
}

/// Whether two mapped nodes map the same name in the same directory.
fn same_location(a: &Node, b: &Node) -> bool {
    match (a.origin(), b.origin()) {
        (Origin::Mapped(a), Origin::Mapped(b)) => a.anchor.same_dir(&b.anchor) && a.name == b.name,
        _ => false,
    }
}

/// Whether a directory shows the entries of an underlying directory (a
/// directory made up for nested mappings does where a directory of its
/// name exists underneath).
fn shows_underlying(dir: &Node) -> bool {
    match dir.origin() {
        Origin::Virtual | Origin::Refused => false,
        Origin::Mapped(_) => true,
        Origin::Child { .. } => !matches!(backing_dir(dir), Ok(None)),
    }
}

/// Whether two directories show the same underlying directory (or none).
fn same_backing(old: &Node, new: &Node) -> bool {
    match (old.origin(), new.origin()) {
        (Origin::Virtual, Origin::Virtual) => true,
        (Origin::Mapped(a), Origin::Mapped(b)) => a.anchor.same_dir(&b.anchor) && a.name == b.name,
        _ => false,
    }
}

/// Whether `dir` has no entry `name` now.
fn is_absent_in(dir: &UDir, name: &OsStr) -> bool {
    matches!(dir.stat_entry(name), Err(err) if err.errno() == Errno::ENOENT)
}
