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
//! Names only in the new tree need nothing: the kernel asks for them (a
//! negative entry is never cached). What is kept is what the kernel would
//! have been told by a lookup, so the view is the same as without this;
//! only the round trips are gone.

use std::ffi::OsString;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::io::fingerprint;
use super::namespace::{is_shareable, require_object};
use super::node::{Node, Origin};
use super::SandboxFs;

/// Inputs of a new sandbox sampled to choose which destroyed sandbox's
/// cache to take over, and how many destroyed sandboxes are considered.
const SAMPLES: usize = 32;
pub(super) const CANDIDATES: usize = 8;

/// What the kernel must be told for the new tree to show right: entries
/// to drop and directories whose attributes to drop.
#[derive(Default)]
pub(super) struct Adopted {
    pub stale_entries: Vec<(u64, OsString)>,
    pub stale_attrs: Vec<u64>,
    /// Names kept, for the log and tests.
    pub kept: usize,
}

impl SandboxFs {
    /// Gives `tree` (a new sandbox, not yet visible) the kernel's inodes of
    /// destroyed sandbox top `old` wherever they still stand for the same
    /// objects. `None` if the kernel no longer knows `old`.
    pub(super) fn adopt_cache(&self, old: &Arc<Node>, tree: &Arc<Node>) -> Option<Adopted> {
        let ino = old.ino();
        if ino == 0 || !self.inodes.adopt_own(ino, old, tree) {
            return None;
        }
        let mut adopted = Adopted::default();
        self.adopt_dir(old, tree, &mut adopted);
        Some(adopted)
    }

    /// Which of `candidates` (destroyed sandboxes' tops) has the kernel
    /// entries most useful to `tree` (of about `mappings` mappings): the
    /// most of a sample of its inputs cached at the same path for the same
    /// file. `None` if none has any.
    pub(super) fn choose_donor(
        &self,
        tree: &Arc<Node>,
        mappings: usize,
        candidates: &[(OsString, Arc<Node>)],
    ) -> Option<usize> {
        let mut samples = Vec::with_capacity(SAMPLES);
        let mut path = Vec::new();
        let mut seen = 0;
        sample_inputs(
            tree,
            (mappings / SAMPLES).max(1),
            &mut seen,
            &mut path,
            &mut samples,
        );
        let score = |top: &Arc<Node>| {
            samples
                .iter()
                .filter(|(path, input)| {
                    cached_at(top, path)
                        .is_some_and(|old| self.kernel_knows(&old) && same_location(&old, input))
                })
                .count()
        };
        candidates
            .iter()
            .enumerate()
            .map(|(at, (_, top))| (score(top), at))
            .filter(|&(score, _)| score > 0)
            .max_by_key(|&(score, at)| (score, std::cmp::Reverse(at)))
            .map(|(_, at)| at)
    }

    /// `new` took over `old`'s inode: checks their entries the kernel knows.
    fn adopt_dir(&self, old: &Arc<Node>, new: &Arc<Node>, adopted: &mut Adopted) {
        let (Ok(old_dir), Ok(new_dir)) = (old.dir(), new.dir()) else {
            return;
        };
        let ino = new.ino();
        if !same_backing(old, new) {
            adopted.stale_attrs.push(ino);
        }
        for (name, old_child) in old_dir.explicit_entries() {
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
        // Entries found in the old underlying directory: the new one is
        // another directory (a writable mapping is a fresh scratch
        // directory per action), so they are dropped.
        let discovered: Vec<OsString> = old_dir.discovered().lock().keys().cloned().collect();
        adopted
            .stale_entries
            .extend(discovered.into_iter().map(|name| (ino, name)));
    }

    /// Whether the kernel's entry for `old` can stand for `new`.
    fn adopt_child(&self, old: &Arc<Node>, new: &Arc<Node>, adopted: &mut Adopted) -> bool {
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
        let Ok(st) = require_object(new).and_then(|object| object.stat()) else {
            return false;
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
        } else if is_shareable(child) {
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

/// Whether two directories show the same underlying directory (or none).
fn same_backing(old: &Node, new: &Node) -> bool {
    match (old.origin(), new.origin()) {
        (Origin::Virtual, Origin::Virtual) => true,
        (Origin::Mapped(a), Origin::Mapped(b)) => a.anchor.same_dir(&b.anchor) && a.name == b.name,
        _ => false,
    }
}
