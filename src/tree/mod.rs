//! The file-system core: the tree of sandboxes, the inode table and the open
//! handles, with one method per file-system operation.
//!
//! Nothing here knows about FUSE: the shell in `src/fuse/` translates
//! kernel requests into these calls, and tests call them directly without a
//! mount. Every method returns an [`FsError`] on failure.
//!
//! The operations are grouped by concern:
//! - `namespace`: lookup, forget, attributes, listing (reading the tree);
//! - `mutate`: creating, removing, renaming, changing attributes;
//! - `io`: open files, reads and writes;
//! - `xattr`: extended attributes;
//! - `underlying`: how a node reaches its underlying object, never through
//!   a symlink below a mapping's root (docs/SECURITY.md).

mod attr;
mod build;
mod error;
mod handles;
mod held;
mod inodes;
mod io;
mod mutate;
mod name;
mod namespace;
mod node;
mod reaper;
mod underlying;
mod xattr;

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use actionfs_protocol::{validate_sandbox_id, ResolveError, ResolvedMapping};
use parking_lot::Mutex;

pub use crate::sys::Caller;
pub use attr::{Attr, FileKind};
pub use error::{Errno, FsError, FsResult};
pub use handles::{DirEntry, OpenFile};
pub use inodes::ROOT_INO;
pub use io::Opened;
pub use mutate::{SetAttr, SetTime};
pub use namespace::StatFs;
pub use xattr::XattrReply;

use handles::{HandleTable, OpenDir};
use inodes::InodeTable;
use node::Node;

/// A create this large frees enough (its request, its plan) for a trim of
/// the heap to be worth it.
const TRIM_AFTER_MAPPINGS: usize = 1_000;

/// Tells the kernel to drop what it cached about a name. Implemented by the
/// FUSE shell; the core calls it when a sandbox disappears.
pub trait Invalidator: Send + Sync {
    /// Drops the entry and everything the kernel cached below it.
    fn invalidate_entry(&self, parent_ino: u64, name: &OsStr);
    /// Marks the entry expired, so that the next path walk through it asks
    /// us again; what is cached below it is left for that walk (or memory
    /// pressure) to drop. As good as `invalidate_entry` for making a name
    /// vanish, without a cost per cached descendant.
    fn expire_entry(&self, parent_ino: u64, name: &OsStr) {
        self.invalidate_entry(parent_ino, name);
    }
}

/// Settings of the core that do not change while mounted.
#[derive(Clone, Debug)]
pub struct FsConfig {
    /// Where the view is mounted; underlying paths inside it are refused.
    pub mount_point: PathBuf,
    /// Pass extended attributes through to underlying files.
    pub xattrs: bool,
}

/// Why a sandbox cannot be created or destroyed; the text is the answer
/// the client gets.
#[derive(Debug)]
pub enum SandboxError {
    InvalidId(ResolveError),
    Exists(String),
    Missing(String),
    Layout {
        id: String,
        error: crate::layout::PlanError,
    },
    /// The id is the name of a `--mapping` at the root.
    HidesMapping(String),
}

impl fmt::Display for SandboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SandboxError::InvalidId(err) => write!(f, "{err}"),
            SandboxError::Exists(id) => write!(f, "sandbox {id:?} already exists"),
            SandboxError::Missing(id) => write!(f, "sandbox {id:?} does not exist"),
            SandboxError::Layout { id, error } => write!(f, "sandbox {id:?}: {error}"),
            SandboxError::HidesMapping(id) => write!(
                f,
                "sandbox {id:?} would hide the mapping of the same name at the root"
            ),
        }
    }
}

impl std::error::Error for SandboxError {}

/// The whole view.
pub struct SandboxFs {
    config: FsConfig,
    root: Arc<Node>,
    inodes: InodeTable,
    files: HandleTable<OpenFile>,
    dirs: HandleTable<OpenDir>,
    /// Open handles by inode (`held`).
    held: crate::sharded::Sharded<held::Held>,
    /// Names of the root that are sandboxes (as opposed to `--mapping`s).
    sandboxes: Mutex<HashSet<OsString>>,
    invalidator: OnceLock<Arc<dyn Invalidator>>,
}

impl SandboxFs {
    /// A view whose root holds `initial` mappings (the `--mapping` flags).
    pub fn new(
        config: FsConfig,
        initial: &[ResolvedMapping],
    ) -> Result<SandboxFs, crate::layout::PlanError> {
        let root = build::tree_of(crate::layout::plan(initial, &config.mount_point, None)?);
        Ok(SandboxFs {
            config,
            inodes: InodeTable::new(root.clone()),
            root,
            files: HandleTable::default(),
            dirs: HandleTable::default(),
            held: crate::sharded::Sharded::new(16),
            sandboxes: Mutex::default(),
            invalidator: OnceLock::new(),
        })
    }

    pub fn config(&self) -> &FsConfig {
        &self.config
    }

    /// Connects the kernel's cache invalidation, once mounted.
    pub fn set_invalidator(&self, invalidator: Arc<dyn Invalidator>) {
        if self.invalidator.set(invalidator).is_err() {
            log::warn!("cache invalidator set twice; keeping the first");
        }
    }

    fn invalidate_entry(&self, parent_ino: u64, name: &OsStr) {
        if let Some(invalidator) = self.invalidator.get() {
            invalidator.invalidate_entry(parent_ino, name);
        }
    }

    fn expire_entry(&self, parent_ino: u64, name: &OsStr) {
        if let Some(invalidator) = self.invalidator.get() {
            invalidator.expire_entry(parent_ino, name);
        }
    }

    /// Creates sandbox `id` at the top of the view. On error nothing has
    /// changed.
    pub fn create_sandbox(
        &self,
        id: &str,
        mappings: &[ResolvedMapping],
    ) -> Result<(), SandboxError> {
        validate_sandbox_id(id).map_err(SandboxError::InvalidId)?;
        if self.has_sandbox(id) {
            return Err(SandboxError::Exists(id.to_owned()));
        }
        let plan =
            crate::layout::plan(mappings, &self.config.mount_point, Some(id)).map_err(|error| {
                SandboxError::Layout {
                    id: id.to_owned(),
                    error,
                }
            })?;
        self.create_planned(id, plan)
    }

    /// Creates sandbox `id` (a valid id) from its layout. On error nothing
    /// has changed.
    pub fn create_planned(&self, id: &str, plan: crate::layout::Entry) -> Result<(), SandboxError> {
        let large = plan.mapping_count() >= TRIM_AFTER_MAPPINGS;
        self.insert_sandbox(id, build::tree_of(plan))?;
        if large {
            reaper::trim_soon();
        }
        Ok(())
    }

    /// Creates sandbox `id` as a symlink to a sandbox built outside the
    /// view: entry `name` of `dir`, a symlink on disk, shown as it is.
    pub fn create_sandbox_link(
        &self,
        id: &str,
        dir: Arc<crate::dirfd::Anchor>,
        name: &OsStr,
    ) -> Result<(), SandboxError> {
        validate_sandbox_id(id).map_err(SandboxError::InvalidId)?;
        let node = Arc::new(Node::new(
            FileKind::Symlink,
            false,
            node::Origin::Mapped(node::Location {
                anchor: dir,
                name: name::Name::new(name),
            }),
        ));
        self.insert_sandbox(id, node)
    }

    pub fn has_sandbox(&self, id: &str) -> bool {
        self.sandboxes.lock().contains(OsStr::new(id))
    }

    fn insert_sandbox(&self, id: &str, tree: Arc<Node>) -> Result<(), SandboxError> {
        let name = OsString::from(id);
        {
            let mut sandboxes = self.sandboxes.lock();
            if sandboxes.contains(&name) {
                return Err(SandboxError::Exists(id.to_owned()));
            }
            let root = self.root.dir().expect("the root is a directory");
            if root.insert_explicit(&name, tree).is_err() {
                return Err(SandboxError::HidesMapping(id.to_owned()));
            }
            sandboxes.insert(name.clone());
        }
        // A mapped root may have shown an underlying entry under this name.
        if !matches!(self.root.origin(), node::Origin::Virtual) {
            self.invalidate_entry(ROOT_INO, &name);
        }
        Ok(())
    }

    /// Removes sandbox `id`. When this returns, the kernel has been told to
    /// forget the name, so it is gone from view.
    pub fn destroy_sandbox(&self, id: &str) -> Result<(), SandboxError> {
        let name = OsString::from(id);
        let removed;
        {
            let mut sandboxes = self.sandboxes.lock();
            if !sandboxes.remove(&name) {
                return Err(SandboxError::Missing(id.to_owned()));
            }
            let root = self.root.dir().expect("the root is a directory");
            removed = root.remove_explicit(&name);
        }
        // Outside every lock: the kernel may call back into us meanwhile.
        // Expiring (not invalidating) keeps the answer's cost flat however
        // much of the sandbox the kernel cached: the next walk through the
        // name asks us and gets ENOENT (or the new sandbox of a reused id).
        self.expire_entry(ROOT_INO, &name);
        // The cached subtree still holds its inodes, and so their nodes
        // here; invalidating it after the answer makes the kernel forget
        // them, so that memory returns. (If the id is reused meanwhile,
        // this only drops the new sandbox's entry from the cache.)
        if let Some(invalidator) = self.invalidator.get() {
            let invalidator = invalidator.clone();
            reaper::later(Box::new(move || {
                invalidator.invalidate_entry(ROOT_INO, &name)
            }));
        }
        // Freeing a large tree takes a millisecond or more; the answer need
        // not wait for it either.
        if let Some(tree) = removed {
            reaper::dispose(tree);
        }
        Ok(())
    }

    /// Ids of the sandboxes that exist now.
    pub fn sandbox_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .sandboxes
            .lock()
            .iter()
            .map(|n| n.to_string_lossy().into_owned())
            .collect();
        ids.sort();
        ids
    }

    /// Inodes the kernel holds, root included (for tests and memory checks).
    pub fn known_inodes(&self) -> usize {
        self.inodes.len()
    }

    /// Open file and directory handles (for tests and leak checks).
    pub fn open_handles(&self) -> usize {
        self.files.len() + self.dirs.len()
    }

    fn node(&self, ino: u64) -> FsResult<Arc<Node>> {
        self.inodes.get(ino).ok_or(FsError::refused(Errno::ESTALE))
    }
}

#[cfg(test)]
mod tests;
