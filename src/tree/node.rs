//! Nodes of the view: what each name in the mount stands for.
//!
//! A node knows where its underlying object is through its [`Origin`]:
//! nothing (a virtual directory), a fixed path (a mapping), or a name inside
//! its parent (an object found in, or created through, a mapped directory).
//! The last kind stores no path: it is derived from the parent on each use,
//! so a rename through the mount moves a whole subtree by updating one node.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::SystemTime;

use parking_lot::{Mutex, RwLock};

use super::attr::FileKind;
use super::error::{Errno, FsResult};
use super::name::Name;
use crate::dirfd::Anchor;

/// Where a node's underlying object lives.
#[derive(Clone, Debug)]
pub enum Origin {
    /// No underlying object: a directory that only holds nested mappings.
    Virtual,
    /// Fixed by a mapping.
    Mapped(Location),
    /// The entry `name` of the parent's underlying directory. The parent is
    /// weak because parents own their children; the kernel keeps every
    /// ancestor of a node it knows looked up, so the parent outlives it.
    Child { parent: Weak<Node>, name: Name },
}

/// A mapping's underlying object: its anchor (shared by every mapping in
/// that directory, and pinned, see [`crate::dirfd::Anchor`]) and its name
/// there, or an empty name for a mapped directory, which is its own anchor.
#[derive(Clone, Debug)]
pub struct Location {
    pub anchor: Arc<Anchor>,
    pub name: Name,
}

/// One name in the view.
pub struct Node {
    /// Inode number; 0 until the kernel first looks the node up.
    ino: AtomicU64,
    /// Lookups the kernel holds (kept here rather than in the inode table,
    /// in what would be padding); changed only under the table's shard lock.
    pub(super) lookups: AtomicU32,
    /// Identity of the underlying file at the last open (0: never opened),
    /// so the kernel keeps cached pages only while it is the same file.
    opened_identity: AtomicU64,
    /// How far the kernel got with this node, when access is tracked
    /// (an [`Access`] as a number; in what would be padding).
    access: AtomicU8,
    kind: FileKind,
    /// Whether operations may change the underlying object (and, for a
    /// directory, its entries).
    writable: bool,
    origin: Mutex<Origin>,
    /// Set for directories only; boxed so that files, most nodes, do not
    /// carry its space.
    dir: Option<Box<DirData>>,
}

/// A directory's explicit entries. Inside a sandbox they never change
/// after creation, so they are a sorted slice: a third of a hash map's
/// size for the thousands of inputs a directory can hold. Only the view's
/// root, where sandboxes come and go, switches to a map on first change.
enum Explicit {
    Sorted(Box<[(Name, Arc<Node>)]>),
    Map(HashMap<Name, Arc<Node>>),
}

impl Explicit {
    fn get(&self, name: &OsStr) -> Option<&Arc<Node>> {
        match self {
            Explicit::Sorted(entries) => entries
                .binary_search_by(|(entry, _)| entry.as_os_str().cmp(name))
                .ok()
                .map(|at| &entries[at].1),
            Explicit::Map(map) => map.get(name),
        }
    }

    fn len(&self) -> usize {
        match self {
            Explicit::Sorted(entries) => entries.len(),
            Explicit::Map(map) => map.len(),
        }
    }

    fn for_each(&self, mut f: impl FnMut(&Name, &Arc<Node>)) {
        match self {
            Explicit::Sorted(entries) => entries.iter().for_each(|(n, node)| f(n, node)),
            Explicit::Map(map) => map.iter().for_each(|(n, node)| f(n, node)),
        }
    }

    fn map(&mut self) -> &mut HashMap<Name, Arc<Node>> {
        if let Explicit::Sorted(entries) = self {
            let map = std::mem::take(entries).into_vec().into_iter().collect();
            *self = Explicit::Map(map);
        }
        match self {
            Explicit::Map(map) => map,
            Explicit::Sorted(_) => unreachable!("converted above"),
        }
    }
}

/// What a directory node holds beyond a plain node.
pub struct DirData {
    /// Entries fixed by mappings and the directories that lead to them.
    /// They shadow the underlying directory's entries of the same name and
    /// cannot be removed or renamed through the mount.
    explicit: RwLock<Explicit>,
    /// Entries of the underlying directory that the kernel has looked up,
    /// kept so that a name keeps its inode while the kernel knows it.
    discovered: Mutex<HashMap<OsString, Arc<Node>>>,
    /// Names the kernel was told are absent and may cache as such (so a
    /// new sandbox taking over this directory's entries can drop them
    /// where it has those names); at most [`NEGATIVES_KEPT`].
    negatives: Mutex<Vec<Name>>,
    /// Shown as all three times of a virtual directory.
    created: SystemTime,
}

/// How many absent names a directory lets the kernel cache; past that, a
/// missing name is answered without letting it cache the answer.
pub const NEGATIVES_KEPT: usize = 1024;

/// What was done with an input, in increasing order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    None = 0,
    /// Looked up (stat, or the path walked through), never read.
    Lookup = 1,
    /// Opened for reading, read, or (a directory) listed.
    Read = 2,
}

impl Node {
    /// Records that the kernel went as far as `access` with this node.
    pub fn note_access(&self, access: Access) {
        self.access.fetch_max(access as u8, Ordering::Relaxed);
    }

    pub fn access(&self) -> Access {
        match self.access.load(Ordering::Relaxed) {
            0 => Access::None,
            1 => Access::Lookup,
            _ => Access::Read,
        }
    }

    pub fn new(kind: FileKind, writable: bool, origin: Origin) -> Node {
        let dir = (kind == FileKind::Directory).then(|| {
            Box::new(DirData {
                explicit: RwLock::new(Explicit::Sorted(Box::default())),
                discovered: Mutex::default(),
                negatives: Mutex::default(),
                created: SystemTime::now(),
            })
        });
        Node {
            ino: AtomicU64::new(0),
            lookups: AtomicU32::new(0),
            opened_identity: AtomicU64::new(0),
            access: AtomicU8::new(Access::None as u8),
            kind,
            writable,
            origin: Mutex::new(origin),
            dir,
        }
    }

    /// A directory whose explicit entries are given up front.
    pub fn new_dir(writable: bool, origin: Origin, mut explicit: Vec<(Name, Arc<Node>)>) -> Node {
        explicit.sort_unstable_by(|(a, _), (b, _)| a.as_os_str().cmp(b.as_os_str()));
        let node = Node::new(FileKind::Directory, writable, origin);
        *node.dir.as_ref().expect("a directory").explicit.write() =
            Explicit::Sorted(explicit.into_boxed_slice());
        node
    }

    pub fn kind(&self) -> FileKind {
        self.kind
    }

    pub fn is_writable(&self) -> bool {
        self.writable
    }

    pub fn is_dir(&self) -> bool {
        self.dir.is_some()
    }

    /// The inode number, or 0 if the kernel has not been told one yet.
    pub fn ino(&self) -> u64 {
        self.ino.load(Ordering::Acquire)
    }

    /// Gives the node `candidate` as its inode number unless it has one.
    /// Returns the number it ends up with.
    pub(super) fn assign_ino(&self, candidate: u64) -> u64 {
        match self
            .ino
            .compare_exchange(0, candidate, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => candidate,
            Err(existing) => existing,
        }
    }

    /// Sets the inode number of a node served as a shared inode: the one
    /// its name stands for in the kernel, which changes if the object it
    /// maps is replaced.
    pub(super) fn set_ino(&self, ino: u64) {
        self.ino.store(ino, Ordering::Release);
    }

    /// Records the identity of the file just opened; true if it is the
    /// same as at the previous open.
    pub(super) fn reopened_same(&self, identity: u64) -> bool {
        self.opened_identity.swap(identity, Ordering::AcqRel) == identity
    }

    pub fn origin(&self) -> Origin {
        self.origin.lock().clone()
    }

    pub(super) fn set_origin(&self, origin: Origin) {
        *self.origin.lock() = origin;
    }

    pub fn dir(&self) -> FsResult<&DirData> {
        self.dir.as_deref().ok_or(Errno::ENOTDIR.into())
    }
}

impl DirData {
    pub fn explicit(&self, name: &OsStr) -> Option<Arc<Node>> {
        self.explicit.read().get(name).cloned()
    }

    pub fn has_explicit(&self, name: &OsStr) -> bool {
        self.explicit.read().get(name).is_some()
    }

    /// A copy of the explicit entries, for listing.
    pub fn explicit_entries(&self) -> Vec<(OsString, Arc<Node>)> {
        let explicit = self.explicit.read();
        let mut entries = Vec::with_capacity(explicit.len());
        explicit.for_each(|name, node| entries.push((name.as_os_str().to_owned(), node.clone())));
        entries
    }

    /// Calls `visit` with each explicit entry, without copying them.
    pub fn visit_explicit(&self, mut visit: impl FnMut(&OsStr, &Arc<Node>)) {
        self.explicit
            .read()
            .for_each(|name, node| visit(name.as_os_str(), node));
    }

    pub fn explicit_count(&self) -> usize {
        self.explicit.read().len()
    }

    /// Adds an explicit entry unless the name is taken.
    pub fn insert_explicit(&self, name: &OsStr, node: Arc<Node>) -> Result<(), Arc<Node>> {
        let mut explicit = self.explicit.write();
        if let Some(existing) = explicit.get(name) {
            return Err(existing.clone());
        }
        explicit.map().insert(Name::new(name), node);
        Ok(())
    }

    pub fn remove_explicit(&self, name: &OsStr) -> Option<Arc<Node>> {
        self.explicit.write().map().remove(name)
    }

    pub fn discovered(&self) -> &Mutex<HashMap<OsString, Arc<Node>>> {
        &self.discovered
    }

    /// Records that the kernel may cache `name` as absent; false if it
    /// may not (too many recorded already).
    pub fn note_negative(&self, name: &OsStr) -> bool {
        let mut negatives = self.negatives.lock();
        if negatives.iter().any(|n| n.as_os_str() == name) {
            return true;
        }
        if negatives.len() >= NEGATIVES_KEPT {
            return false;
        }
        negatives.push(Name::new(name));
        true
    }

    /// The names the kernel may have cached as absent.
    pub fn negatives(&self) -> Vec<OsString> {
        self.negatives
            .lock()
            .iter()
            .map(|n| n.as_os_str().to_owned())
            .collect()
    }

    pub fn created(&self) -> SystemTime {
        self.created
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_records_stay_compact() {
        // Most of the daemon's memory is one of these per mapped input; a
        // file node must not carry directory fields or a full path.
        assert!(
            std::mem::size_of::<Node>() <= 80,
            "{}",
            std::mem::size_of::<Node>()
        );
    }
}
