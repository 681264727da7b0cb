//! Nodes of the view: what each name in the mount stands for.
//!
//! A node knows where its underlying object is through its [`Origin`]:
//! nothing (a virtual directory), a fixed path (a mapping), or a name inside
//! its parent (an object found in, or created through, a mapped directory).
//! The last kind stores no path: it is derived from the parent on each use,
//! so a rename through the mount moves a whole subtree by updating one node.
//!
//! A mapped input is made **untyped**: a create makes no system call per
//! input, so its type is learnt when the kernel first looks it up (or a
//! listing shows it), from the `lstat` that lookup makes anyway
//! ([`Node::set_type`]). Only explicit entries can be untyped, and every
//! way the kernel reaches a node goes through a lookup or a listing first,
//! so every node the kernel knows is typed. Once typed, a node keeps its
//! type, as one typed at create did.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::SystemTime;

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::attr::FileKind;
use super::error::{Errno, FsResult};
use super::name::Name;
use crate::sandbox::dirfd::Anchor;

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
    /// An input whose object must not be served (its default place holds
    /// other bytes than its digest's): every use fails with EIO.
    Refused,
}

/// A mapping's underlying object: its anchor (shared by every mapping in
/// that directory, and pinned, see [`crate::sandbox::dirfd::Anchor`]) and its name
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
    /// A [`FileKind`] as a number, or [`UNTYPED`] until the first lookup
    /// of a mapped input; set once, under the `origin` lock.
    kind: AtomicU8,
    /// Whether operations may change the underlying object (and, for a
    /// directory, its entries).
    writable: bool,
    origin: Mutex<Origin>,
    /// Set for directories only (so that files, most nodes, do not carry
    /// its space), before the kind says Directory.
    dir: DirSlot,
}

/// `Node::kind` of a node whose type is not known yet.
const UNTYPED: u8 = u8::MAX;

fn kind_code(kind: FileKind) -> u8 {
    match kind {
        FileKind::Directory => 0,
        FileKind::RegularFile => 1,
        FileKind::Symlink => 2,
        FileKind::NamedPipe => 3,
        FileKind::Socket => 4,
        FileKind::CharDevice => 5,
        FileKind::BlockDevice => 6,
    }
}

fn kind_of_code(code: u8) -> Option<FileKind> {
    Some(match code {
        0 => FileKind::Directory,
        1 => FileKind::RegularFile,
        2 => FileKind::Symlink,
        3 => FileKind::NamedPipe,
        4 => FileKind::Socket,
        5 => FileKind::CharDevice,
        6 => FileKind::BlockDevice,
        _ => return None,
    })
}

/// A directory's data, set at most once and then kept for the node's life:
/// a pointer's size, where a `OnceLock<Box<_>>` takes two words (the node
/// is most of the daemon's memory per input).
struct DirSlot(AtomicPtr<DirData>);

impl DirSlot {
    fn empty() -> DirSlot {
        DirSlot(AtomicPtr::new(std::ptr::null_mut()))
    }

    fn get(&self) -> Option<&DirData> {
        let data = self.0.load(Ordering::Acquire);
        // SAFETY: a non-null pointer came from `Box::into_raw` in `set`,
        // is never replaced, and is freed only in `drop`, which has `&mut
        // self`: it is valid for as long as `self` is borrowed.
        (!data.is_null()).then(|| unsafe { &*data })
    }

    /// Sets the data unless it is set already.
    fn set(&self, data: Box<DirData>) {
        let data = Box::into_raw(data);
        let set = self.0.compare_exchange(
            std::ptr::null_mut(),
            data,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if set.is_err() {
            // SAFETY: `data` came from `Box::into_raw` just above and was
            // not stored, so this is its only owner.
            drop(unsafe { Box::from_raw(data) });
        }
    }
}

impl Drop for DirSlot {
    fn drop(&mut self) {
        let data = *self.0.get_mut();
        if !data.is_null() {
            // SAFETY: set once from `Box::into_raw` and never freed before.
            drop(unsafe { Box::from_raw(data) });
        }
    }
}

fn new_dir_data() -> Box<DirData> {
    Box::new(DirData {
        explicit: RwLock::new(Explicit::Sorted(Box::default())),
        discovered: Mutex::default(),
        negatives: Mutex::default(),
        created: SystemTime::now(),
    })
}

/// A directory's explicit entries. Inside a sandbox they never change
/// after creation, so they are a sorted slice: a third of a hash map's
/// size for the thousands of inputs a directory can hold. Only the view's
/// root, where sandboxes come and go, switches to a map on first change.
/// A directory of an input tree may hold them unmade ([`Explicit::Lazy`])
/// until something asks for them.
enum Explicit {
    Sorted(Box<[(Name, Arc<Node>)]>),
    Map(HashMap<Name, Arc<Node>>),
    Lazy {
        entries: Box<dyn LazyEntries>,
        /// The directory's own node, parent of the entries to be made.
        this: Weak<Node>,
    },
}

/// Explicit entries made on first use: what a directory of an input tree
/// holds, known at create but made into nodes only when the kernel first
/// looks a name up in it or lists it. A sandbox of thousands of inputs
/// then costs its create a node per directory on the outputs' paths, not
/// one per input, and its action pays only for the directories it reaches.
pub trait LazyEntries: Send + Sync {
    /// How many entries [`LazyEntries::make`] will give.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The entries of directory `this`, made now (once per directory).
    fn make(self: Box<Self>, this: &Weak<Node>) -> Vec<(Name, Arc<Node>)>;
}

impl Explicit {
    /// Entries given in any order.
    fn sorted(mut entries: Vec<(Name, Arc<Node>)>) -> Explicit {
        entries.sort_unstable_by(|(a, _), (b, _)| a.as_os_str().cmp(b.as_os_str()));
        Explicit::Sorted(entries.into_boxed_slice())
    }

    fn get(&self, name: &OsStr) -> Option<&Arc<Node>> {
        match self {
            Explicit::Sorted(entries) => entries
                .binary_search_by(|(entry, _)| entry.as_os_str().cmp(name))
                .ok()
                .map(|at| &entries[at].1),
            Explicit::Map(map) => map.get(name),
            Explicit::Lazy { .. } => unreachable!("read through DirData::made"),
        }
    }

    fn len(&self) -> usize {
        match self {
            Explicit::Sorted(entries) => entries.len(),
            Explicit::Map(map) => map.len(),
            Explicit::Lazy { entries, .. } => entries.len(),
        }
    }

    /// Visits the entries made so far: none of a lazy directory not yet
    /// made, which the kernel cannot know any entry of.
    fn for_each(&self, mut f: impl FnMut(&Name, &Arc<Node>)) {
        match self {
            Explicit::Sorted(entries) => entries.iter().for_each(|(n, node)| f(n, node)),
            Explicit::Map(map) => map.iter().for_each(|(n, node)| f(n, node)),
            Explicit::Lazy { .. } => {}
        }
    }

    /// Makes the entries of a lazy directory (once).
    fn make(&mut self) {
        *self = match std::mem::replace(self, Explicit::Sorted(Box::default())) {
            Explicit::Lazy { entries, this } => Explicit::sorted(entries.make(&this)),
            made => made,
        };
    }

    fn map(&mut self) -> &mut HashMap<Name, Arc<Node>> {
        self.make();
        if let Explicit::Sorted(entries) = self {
            let map = std::mem::take(entries).into_vec().into_iter().collect();
            *self = Explicit::Map(map);
        }
        match self {
            Explicit::Map(map) => map,
            _ => unreachable!("converted above"),
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
        let node = Node::new_untyped(writable, origin);
        if kind == FileKind::Directory {
            node.dir.set(new_dir_data());
        }
        node.kind.store(kind_code(kind), Ordering::Release);
        node
    }

    /// A mapped input whose type is learnt at its first lookup.
    pub fn new_untyped(writable: bool, origin: Origin) -> Node {
        Node {
            ino: AtomicU64::new(0),
            lookups: AtomicU32::new(0),
            opened_identity: AtomicU64::new(0),
            access: AtomicU8::new(Access::None as u8),
            kind: AtomicU8::new(UNTYPED),
            writable,
            origin: Mutex::new(origin),
            dir: DirSlot::empty(),
        }
    }

    /// A directory whose explicit entries are made at first use.
    pub fn new_lazy_dir(
        writable: bool,
        origin: Origin,
        entries: Box<dyn LazyEntries>,
    ) -> Arc<Node> {
        Arc::new_cyclic(|this| {
            let node = Node::new(FileKind::Directory, writable, origin);
            *node.dir.get().expect("a directory").explicit.write() = Explicit::Lazy {
                entries,
                this: this.clone(),
            };
            node
        })
    }

    /// A directory whose explicit entries are given up front.
    pub fn new_dir(writable: bool, origin: Origin, explicit: Vec<(Name, Arc<Node>)>) -> Node {
        let node = Node::new(FileKind::Directory, writable, origin);
        *node.dir.get().expect("a directory").explicit.write() = Explicit::sorted(explicit);
        node
    }

    /// The node's type; an untyped node (a mapped input the kernel has
    /// not looked up) reads as a regular file. Code that can meet one
    /// (walking explicit entries) asks [`Node::typed_kind`].
    pub fn kind(&self) -> FileKind {
        self.typed_kind().unwrap_or(FileKind::RegularFile)
    }

    /// The node's type, `None` until it is known.
    pub fn typed_kind(&self) -> Option<FileKind> {
        kind_of_code(self.kind.load(Ordering::Acquire))
    }

    /// Gives an untyped node its type, learnt from an `lstat` of its
    /// object; a directory also gets `pinned`, its origin with the
    /// directory itself pinned. Returns the node's type: the one given
    /// first, if two lookups type it at once.
    pub fn set_type(&self, kind: FileKind, pinned: Option<Origin>) -> FileKind {
        let mut origin = self.origin.lock();
        if let Some(known) = self.typed_kind() {
            return known;
        }
        if kind == FileKind::Directory {
            if let Some(pinned) = pinned {
                *origin = pinned;
            }
            self.dir.set(new_dir_data());
        }
        // Published after the directory data, which readers of the kind
        // may then use.
        self.kind.store(kind_code(kind), Ordering::Release);
        kind
    }

    pub fn is_writable(&self) -> bool {
        self.writable
    }

    pub fn is_dir(&self) -> bool {
        self.dir.get().is_some()
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

    /// Whether the origin is a mapping (without copying it).
    pub fn is_mapped(&self) -> bool {
        matches!(*self.origin.lock(), Origin::Mapped(_))
    }

    pub(super) fn set_origin(&self, origin: Origin) {
        *self.origin.lock() = origin;
    }

    pub fn dir(&self) -> FsResult<&DirData> {
        self.dir.get().ok_or(Errno::ENOTDIR.into())
    }
}

impl DirData {
    /// The explicit entries, made first if the directory is lazy.
    fn made(&self) -> RwLockReadGuard<'_, Explicit> {
        let explicit = self.explicit.read();
        if !matches!(*explicit, Explicit::Lazy { .. }) {
            return explicit;
        }
        drop(explicit);
        let mut explicit = self.explicit.write();
        // Made here unless another thread made them meanwhile.
        explicit.make();
        RwLockWriteGuard::downgrade(explicit)
    }

    pub fn explicit(&self, name: &OsStr) -> Option<Arc<Node>> {
        self.made().get(name).cloned()
    }

    pub fn has_explicit(&self, name: &OsStr) -> bool {
        self.made().get(name).is_some()
    }

    /// A copy of the explicit entries, for listing.
    pub fn explicit_entries(&self) -> Vec<(OsString, Arc<Node>)> {
        let explicit = self.made();
        let mut entries = Vec::with_capacity(explicit.len());
        explicit.for_each(|name, node| entries.push((name.as_os_str().to_owned(), node.clone())));
        entries
    }

    /// Calls `visit` with each explicit entry made so far, without copying
    /// them or making those of a lazy directory: for walks after what the
    /// kernel knows or reached, which a lazy directory's entries are not.
    pub fn visit_explicit(&self, mut visit: impl FnMut(&OsStr, &Arc<Node>)) {
        self.explicit
            .read()
            .for_each(|name, node| visit(name.as_os_str(), node));
    }

    /// A copy of the explicit entries made so far (see
    /// [`DirData::visit_explicit`]).
    pub fn made_entries(&self) -> Vec<(OsString, Arc<Node>)> {
        let mut entries = Vec::new();
        self.visit_explicit(|name, node| entries.push((name.to_owned(), node.clone())));
        entries
    }

    /// How many explicit entries there are, made or not.
    pub fn explicit_count(&self) -> usize {
        self.explicit.read().len()
    }

    /// Adds an explicit entry unless the name is taken.
    pub fn insert_explicit(&self, name: &OsStr, node: Arc<Node>) -> Result<(), Arc<Node>> {
        let mut explicit = self.explicit.write();
        explicit.make();
        if let Some(existing) = explicit.get(name) {
            return Err(existing.clone());
        }
        explicit.map().insert(Name::new(name), node);
        Ok(())
    }

    /// Adds explicit entries, all or none: if a name is taken, or given
    /// twice, that name is the error. Sorted entries stay sorted.
    pub fn insert_explicit_all(&self, mut entries: Vec<(Name, Arc<Node>)>) -> Result<(), Name> {
        entries.sort_unstable_by(|(a, _), (b, _)| a.as_os_str().cmp(b.as_os_str()));
        if let Some(pair) = entries
            .windows(2)
            .find(|pair| pair[0].0.as_os_str() == pair[1].0.as_os_str())
        {
            return Err(pair[0].0.clone());
        }
        let mut explicit = self.explicit.write();
        explicit.make();
        if let Some((taken, _)) = entries
            .iter()
            .find(|(name, _)| explicit.get(name.as_os_str()).is_some())
        {
            return Err(taken.clone());
        }
        match &mut *explicit {
            Explicit::Sorted(made) => {
                let mut all = std::mem::take(made).into_vec();
                all.extend(entries);
                // Two sorted runs: the stable sort merges them.
                all.sort_by(|(a, _), (b, _)| a.as_os_str().cmp(b.as_os_str()));
                *made = all.into_boxed_slice();
            }
            Explicit::Map(map) => map.extend(entries),
            Explicit::Lazy { .. } => unreachable!("made above"),
        }
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

    /// The names the kernel may have cached as absent, forgotten here
    /// (to be noted again where they still are).
    pub fn take_negatives(&self) -> Vec<OsString> {
        std::mem::take(&mut *self.negatives.lock())
            .iter()
            .map(|n| n.as_os_str().to_owned())
            .collect()
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

    fn names(dir: &DirData) -> Vec<String> {
        let mut names = Vec::new();
        dir.visit_explicit(|name, _| names.push(name.to_string_lossy().into_owned()));
        names
    }

    fn entries(names: &[&str]) -> Vec<(Name, Arc<Node>)> {
        names
            .iter()
            .map(|name| {
                let node = Node::new_untyped(false, Origin::Virtual);
                (Name::new(OsStr::new(name)), Arc::new(node))
            })
            .collect()
    }

    #[test]
    fn entries_added_at_once_stay_sorted_and_a_taken_name_adds_none() {
        let node = Node::new_dir(false, Origin::Virtual, entries(&["b", "d"]));
        let dir = node.dir().unwrap();
        dir.insert_explicit_all(entries(&["e", "a", "c"])).unwrap();
        assert_eq!(names(dir), ["a", "b", "c", "d", "e"]);
        assert!(dir.explicit(OsStr::new("c")).is_some());
        // Taken, or given twice: an error naming it, and nothing added.
        let taken = dir.insert_explicit_all(entries(&["f", "b"])).unwrap_err();
        assert_eq!(taken.as_os_str(), "b");
        let twice = dir.insert_explicit_all(entries(&["g", "g"])).unwrap_err();
        assert_eq!(twice.as_os_str(), "g");
        assert_eq!(names(dir), ["a", "b", "c", "d", "e"]);
        // Once a map (a single insert), the same rules.
        assert!(dir
            .insert_explicit(OsStr::new("h"), entries(&["h"]).remove(0).1)
            .is_ok());
        assert!(dir.insert_explicit_all(entries(&["i", "a"])).is_err());
        assert!(dir.explicit(OsStr::new("i")).is_none());
        dir.insert_explicit_all(entries(&["i", "j"])).unwrap();
        assert_eq!(dir.explicit_count(), 8);
    }

    #[test]
    fn an_untyped_node_is_typed_once_and_a_directory_gets_its_data_first() {
        let node = Node::new_untyped(false, Origin::Virtual);
        assert_eq!(node.typed_kind(), None);
        assert!(node.dir().is_err());
        assert_eq!(
            node.set_type(FileKind::Directory, None),
            FileKind::Directory
        );
        assert!(node.dir().is_ok());
        // A second lookup that saw another type keeps the first.
        assert_eq!(
            node.set_type(FileKind::RegularFile, None),
            FileKind::Directory
        );
        assert_eq!(node.kind(), FileKind::Directory);
        let file = Node::new_untyped(true, Origin::Virtual);
        assert_eq!(file.set_type(FileKind::Symlink, None), FileKind::Symlink);
        assert!(file.dir().is_err() && !file.is_dir());
    }
}
