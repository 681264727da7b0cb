//! Nodes of the view: what each name in the mount stands for.
//!
//! A node knows where its underlying object is through its [`Origin`]:
//! nothing (a virtual directory), a fixed path (a mapping), or a name inside
//! its parent (an object found in, or created through, a mapped directory).
//! The last kind stores no path: it is derived from the parent on each use,
//! so a rename through the mount moves a whole subtree by updating one node.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::SystemTime;

use parking_lot::{Mutex, RwLock};

use super::attr::FileKind;
use super::errno::{Errno, FsResult};

/// Where a node's underlying object lives.
#[derive(Clone, Debug)]
pub enum Origin {
    /// No underlying object: a directory that only holds nested mappings.
    Virtual,
    /// Fixed by a mapping.
    Mapped(PathBuf),
    /// The entry `name` of the parent's underlying directory. The parent is
    /// weak because parents own their children; the kernel keeps every
    /// ancestor of a node it knows looked up, so the parent outlives it.
    Child { parent: Weak<Node>, name: OsString },
}

/// One name in the view.
pub struct Node {
    /// Inode number; 0 until the kernel first looks the node up.
    ino: AtomicU64,
    /// Identity of the underlying file at the last open (0: never opened),
    /// so the kernel keeps cached pages only while it is the same file.
    opened_identity: AtomicU64,
    kind: FileKind,
    /// Whether operations may change the underlying object (and, for a
    /// directory, its entries).
    writable: bool,
    origin: Mutex<Origin>,
    /// Set for directories only.
    dir: Option<DirData>,
}

/// What a directory node holds beyond a plain node.
pub struct DirData {
    /// Entries fixed by mappings and the directories that lead to them.
    /// They shadow the underlying directory's entries of the same name and
    /// cannot be removed or renamed through the mount.
    explicit: RwLock<HashMap<OsString, Arc<Node>>>,
    /// Entries of the underlying directory that the kernel has looked up,
    /// kept so that a name keeps its inode while the kernel knows it.
    discovered: Mutex<HashMap<OsString, Arc<Node>>>,
    /// Shown as all three times of a virtual directory.
    created: SystemTime,
}

impl Node {
    pub fn new(kind: FileKind, writable: bool, origin: Origin) -> Node {
        let dir = (kind == FileKind::Directory).then(|| DirData {
            explicit: RwLock::default(),
            discovered: Mutex::default(),
            created: SystemTime::now(),
        });
        Node {
            ino: AtomicU64::new(0),
            opened_identity: AtomicU64::new(0),
            kind,
            writable,
            origin: Mutex::new(origin),
            dir,
        }
    }

    /// A directory whose explicit entries are given up front.
    pub fn new_dir(writable: bool, origin: Origin, explicit: HashMap<OsString, Arc<Node>>) -> Node {
        let node = Node::new(FileKind::Directory, writable, origin);
        *node.dir.as_ref().expect("a directory").explicit.write() = explicit;
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

    /// Path of the underlying object; `None` for a virtual directory.
    /// Fails with ESTALE if an ancestor is gone.
    pub fn underlying_path(&self) -> FsResult<Option<PathBuf>> {
        match &*self.origin.lock() {
            Origin::Virtual => Ok(None),
            Origin::Mapped(path) => Ok(Some(path.clone())),
            Origin::Child { parent, name } => {
                let parent = parent.upgrade().ok_or(Errno::ESTALE)?;
                Ok(parent.underlying_path()?.map(|p| p.join(name)))
            }
        }
    }

    /// Path of the underlying object; ENOENT for a virtual directory.
    pub fn require_path(&self) -> FsResult<PathBuf> {
        self.underlying_path()?.ok_or(Errno::ENOENT)
    }

    /// The mapping this node's underlying object belongs to: the path of the
    /// nearest ancestor (or self) fixed by a mapping.
    pub fn mapping_root(&self) -> Option<PathBuf> {
        match &*self.origin.lock() {
            Origin::Virtual => None,
            Origin::Mapped(path) => Some(path.clone()),
            Origin::Child { parent, .. } => parent.upgrade()?.mapping_root(),
        }
    }

    pub fn dir(&self) -> FsResult<&DirData> {
        self.dir.as_ref().ok_or(Errno::ENOTDIR)
    }
}

impl DirData {
    pub fn explicit(&self, name: &OsStr) -> Option<Arc<Node>> {
        self.explicit.read().get(name).cloned()
    }

    pub fn has_explicit(&self, name: &OsStr) -> bool {
        self.explicit.read().contains_key(name)
    }

    /// A copy of the explicit entries, for listing.
    pub fn explicit_entries(&self) -> Vec<(OsString, Arc<Node>)> {
        self.explicit
            .read()
            .iter()
            .map(|(name, node)| (name.clone(), node.clone()))
            .collect()
    }

    pub fn explicit_count(&self) -> usize {
        self.explicit.read().len()
    }

    /// Adds an explicit entry unless the name is taken.
    pub fn insert_explicit(&self, name: OsString, node: Arc<Node>) -> Result<(), Arc<Node>> {
        let mut explicit = self.explicit.write();
        if let Some(existing) = explicit.get(&name) {
            return Err(existing.clone());
        }
        explicit.insert(name, node);
        Ok(())
    }

    pub fn remove_explicit(&self, name: &OsStr) -> Option<Arc<Node>> {
        self.explicit.write().remove(name)
    }

    pub fn discovered(&self) -> &Mutex<HashMap<OsString, Arc<Node>>> {
        &self.discovered
    }

    pub fn created(&self) -> SystemTime {
        self.created
    }
}
