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

mod access;
mod attr;
mod build;
mod cache;
mod error;
mod handles;
mod held;
mod inode_files;
mod inodes;
mod io;
mod merkle_dirs;
mod mutate;
mod name;
mod namespace;
mod node;
pub use cache::retention::MAX_AGE as RETAINED_MAX_AGE;
mod underlying;
mod xattr;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};

use actionfs_protocol::{validate_sandbox_id, ResolveError, ResolvedMapping};
use parking_lot::Mutex;

pub use crate::sys::Caller;
pub use access::{AccessError, InputAccess};
pub use attr::{Attr, FileKind};
pub use build::GraftError;
pub use error::{Errno, FsError, FsResult};
pub use handles::{DirEntry, OpenFile};
pub use inodes::ROOT_INO;
pub use io::Opened;
pub use merkle_dirs::{EmptyDirs, FileContent, MerkleInputs, SymlinkTargetError, SymlinkTargets};
pub use mutate::{SetAttr, SetTime};
pub use name::Name;
pub use namespace::StatFs;
pub use node::{Access, LazyEntries, Location, Node, Origin};
pub use xattr::XattrReply;

use handles::{HandleTable, OpenDir};
use inodes::InodeTable;

/// How many per-inode descriptors to keep: half the open-file limit,
/// leaving the rest for pinned directories, handles and everything else.
fn descriptor_budget() -> usize {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(512, |(soft, _)| (soft / 2).min(1 << 20) as usize)
}

/// A create this large frees enough (its request, its plan) for a trim of
/// the heap to be worth it.
const TRIM_AFTER_MAPPINGS: usize = 1_000;

/// Tells the kernel to drop what it cached about a name. Implemented by the
/// FUSE shell; the core calls it when a sandbox disappears.
pub trait Invalidator: Send + Sync {
    /// Drops the entry and everything the kernel cached below it.
    fn invalidate_entry(&self, parent_ino: u64, name: &OsStr);
    /// Drops the cached attributes of `ino` (not its pages).
    fn invalidate_attrs(&self, ino: u64);
    /// Drops the cached pages of `ino`.
    fn invalidate_data(&self, ino: u64);
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
    /// Record what each sandbox does with its inputs (`access`).
    pub track_access: bool,
}

/// Why a sandbox cannot be created or destroyed; the text is the answer
/// the client gets.
#[derive(Debug)]
pub enum SandboxError {
    InvalidId(ResolveError),
    Exists(String),
    /// A second create of an existing sandbox, refused in sandboxfs's words
    /// (docs/PARITY.md).
    AlreadyMapped(String),
    /// Another request for the sandbox is being applied.
    Busy(String),
    Missing(String),
    Layout {
        id: String,
        error: crate::sandbox::layout::PlanError,
    },
    /// The id is the name of a `--mapping` at the root.
    HidesMapping(String),
    /// A lazy directory could not be put where it was asked for.
    Lazy {
        id: String,
        why: build::GraftError,
    },
}

impl fmt::Display for SandboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SandboxError::InvalidId(err) => write!(f, "{err}"),
            SandboxError::Exists(id) => write!(f, "sandbox {id:?} already exists"),
            SandboxError::AlreadyMapped(id) => write!(
                f,
                "sandbox {id:?}: Already mapped (the sandbox already exists; destroy it first)"
            ),
            SandboxError::Busy(id) => write!(
                f,
                "sandbox {id:?}: another request for it is being applied; try again"
            ),
            SandboxError::Missing(id) => write!(f, "sandbox {id:?} does not exist"),
            SandboxError::Layout { id, error } => write!(f, "sandbox {id:?}: {error}"),
            SandboxError::HidesMapping(id) => write!(
                f,
                "sandbox {id:?} would hide the mapping of the same name at the root"
            ),
            SandboxError::Lazy { id, why } => write!(f, "sandbox {id:?}: lazy directory {why}"),
        }
    }
}

impl std::error::Error for SandboxError {}

impl SandboxError {
    /// Whether the text names the sandbox (all but an invalid id's do),
    /// so that an answer need not name it again.
    pub fn names_the_sandbox(&self) -> bool {
        !matches!(self, SandboxError::InvalidId(_))
    }
}

/// The whole view.
pub struct SandboxFs {
    config: FsConfig,
    root: Arc<Node>,
    inodes: InodeTable,
    files: HandleTable<OpenFile>,
    dirs: HandleTable<OpenDir>,
    /// Open handles by inode (`held`).
    held: crate::sandbox::sharded::Sharded<held::Held>,
    /// Descriptors per inode for files opened without telling the daemon.
    inode_files: inode_files::InodeFiles,
    /// Whether opens reach the daemon (set by the shell once the kernel
    /// has agreed); without them read-only files show no write bits.
    zero_message_opens: std::sync::atomic::AtomicBool,
    /// Names of the root that are sandboxes (as opposed to `--mapping`s),
    /// with their mapping counts.
    sandboxes: Mutex<HashMap<OsString, usize>>,
    /// Destroyed sandboxes whose kernel cache is kept a while.
    retention: Arc<cache::retention::Retention>,
    /// Top directories of sandboxes that took over a destroyed sandbox's
    /// cache (`adoption`), by inode, with the name the kernel holds them
    /// by until it looks the new name up.
    kernel_names: Mutex<HashMap<u64, OsString>>,
    invalidator: OnceLock<Arc<dyn Invalidator>>,
}

impl SandboxFs {
    /// A view whose root holds `initial` mappings (the `--mapping` flags).
    pub fn new(
        config: FsConfig,
        initial: &[ResolvedMapping],
    ) -> Result<SandboxFs, crate::sandbox::layout::PlanError> {
        let root = build::tree_of(crate::sandbox::layout::plan(
            initial,
            &config.mount_point,
            None,
        )?);
        Ok(SandboxFs {
            config,
            inodes: InodeTable::new(root.clone()),
            root,
            files: HandleTable::default(),
            dirs: HandleTable::default(),
            held: crate::sandbox::sharded::Sharded::new(16),
            inode_files: inode_files::InodeFiles::new(descriptor_budget()),
            zero_message_opens: std::sync::atomic::AtomicBool::new(false),
            sandboxes: Mutex::default(),
            retention: Arc::new(cache::retention::Retention::new(
                cache::retention::BUDGET_NODES,
                cache::retention::OPEN_MODE_MAX_AGE,
            )),
            kernel_names: Mutex::default(),
            invalidator: OnceLock::new(),
        })
    }

    pub fn config(&self) -> &FsConfig {
        &self.config
    }

    /// Opens no longer reach the daemon (the kernel stopped sending OPEN):
    /// reads and writes come without a handle, and read-only files are
    /// shown without write permission so that the kernel refuses opens
    /// for writing itself.
    pub fn set_zero_message_opens(&self, on: bool) {
        self.zero_message_opens
            .store(on, std::sync::atomic::Ordering::Relaxed);
        self.retention.set_max_age(if on {
            cache::retention::MAX_AGE
        } else {
            cache::retention::OPEN_MODE_MAX_AGE
        });
    }

    pub fn zero_message_opens(&self) -> bool {
        self.zero_message_opens
            .load(std::sync::atomic::Ordering::Relaxed)
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

    /// Drops `ino`'s cached attributes (not its pages) before returning;
    /// safe on the request path, as it waits for no page or inode lock.
    fn invalidate_attrs_now(&self, ino: u64) {
        if let Some(invalidator) = self.invalidator.get() {
            invalidator.invalidate_attrs(ino);
        }
    }

    /// Drops `ino`'s cached pages soon, off the request path: the kernel
    /// may hold a page lock waiting for a read this thread is to answer.
    fn invalidate_data_later(&self, ino: u64) {
        if let Some(invalidator) = self.invalidator.get() {
            let invalidator = invalidator.clone();
            cache::reaper::later(Box::new(move || invalidator.invalidate_data(ino)));
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
        let draft = crate::sandbox::layout::Draft::of(mappings, Some(id))
            .finish(&self.config.mount_point)
            .map_err(|error| SandboxError::Layout {
                id: id.to_owned(),
                error,
            })?;
        self.create_drafted(id, draft)
    }

    /// Creates sandbox `id` (a valid id) from its finished draft, its
    /// inputs untyped. On error nothing has changed.
    pub fn create_drafted(
        &self,
        id: &str,
        draft: crate::sandbox::layout::Draft,
    ) -> Result<(), SandboxError> {
        if draft.root_is_file() {
            let plan = draft.typed().map_err(|error| SandboxError::Layout {
                id: id.to_owned(),
                error,
            })?;
            return self.create_planned(id, plan);
        }
        let mappings = draft.mapping_count();
        self.publish(id, build::tree_of_draft(draft), mappings, false)
    }

    /// Creates sandbox `id` (a valid id) from its finished draft and
    /// `lazy` directories grafted into it ([`build::graft_lazy`]: each
    /// one's path and entries, made at first use); `mappings` counts the
    /// inputs of both. On error nothing has changed.
    pub fn create_drafted_lazy(
        &self,
        id: &str,
        draft: crate::sandbox::layout::Draft,
        lazy: Vec<(String, Box<dyn LazyEntries>)>,
        mappings: usize,
    ) -> Result<(), SandboxError> {
        let tree = build::tree_of_draft(draft);
        build::graft_lazy(&tree, lazy).map_err(|why| SandboxError::Lazy {
            id: id.to_owned(),
            why,
        })?;
        self.publish(id, tree, mappings, true)
    }

    /// Creates sandbox `id` (a valid id) as one lazy directory, `entries`,
    /// merged with the writable directory at `writable_root`, where
    /// everything the sandbox's user makes goes (the `stage` front end uses it).
    /// On error nothing has changed.
    pub fn create_lazy_root(
        &self,
        id: &str,
        writable_root: &std::path::Path,
        entries: Box<dyn LazyEntries>,
        mappings: usize,
    ) -> Result<(), SandboxError> {
        let anchor =
            crate::sandbox::dirfd::Anchor::open(writable_root, Some(id.into())).map_err(|err| {
                SandboxError::Lazy {
                    id: id.to_owned(),
                    why: build::GraftError::OpenRoot {
                        path: writable_root.to_owned(),
                        source: err,
                    },
                }
            })?;
        let tree = Node::new_lazy_dir(
            true,
            Origin::Mapped(Location {
                anchor: Arc::new(anchor),
                name: Name::new(OsStr::new("")),
            }),
            entries,
        );
        self.publish(id, tree, mappings, true)
    }

    /// Creates sandbox `id` (a valid id) from its typed layout. On error
    /// nothing has changed.
    pub fn create_planned(
        &self,
        id: &str,
        plan: crate::sandbox::layout::Entry,
    ) -> Result<(), SandboxError> {
        let mappings = plan.mapping_count();
        self.publish(id, build::tree_of(plan), mappings, false)
    }

    /// Puts `tree`, sandbox `id` of `mappings` mappings, at the top of
    /// the view; `lazy` if it has lazy directories. On error nothing has
    /// changed.
    fn publish(
        &self,
        id: &str,
        tree: Arc<Node>,
        mappings: usize,
        lazy: bool,
    ) -> Result<(), SandboxError> {
        let donor = self.take_over_cache(id, &tree, mappings, lazy);
        if let Err(err) = self.insert_sandbox(id, tree.clone(), mappings) {
            if let Some(kernel_name) = donor {
                // Nothing may stay of a refused create: the kernel's
                // entries now standing for `tree` go.
                self.let_go_now(cache::retention::Departed {
                    name: OsString::from(id),
                    alias: Some(kernel_name),
                    top: Arc::downgrade(&tree),
                });
            }
            return Err(err);
        }
        if mappings >= TRIM_AFTER_MAPPINGS {
            cache::reaper::trim_soon();
        }
        Ok(())
    }

    /// Gives new sandbox `tree` the kernel cache
    /// of the most recently destroyed sandbox (`adoption`), and tells the
    /// kernel what of it no longer holds. Returns the name the kernel
    /// holds the taken-over top directory by.
    fn take_over_cache(
        &self,
        id: &str,
        tree: &Arc<Node>,
        mappings: usize,
        lazy: bool,
    ) -> Option<OsString> {
        let invalidator = self.invalidator.get()?;
        // A taken-over cache hides the accesses of the new sandbox.
        if !tree.is_dir() || self.config.track_access {
            return None;
        }
        let (donor, old_top) = match self.predecessor(id) {
            Some(same_name) => same_name,
            None => {
                let (names, candidates): (Vec<_>, Vec<_>) = self
                    .retention
                    .latest(cache::adoption::CANDIDATES)
                    .into_iter()
                    .unzip();
                let chosen = self.choose_donor(tree, mappings, lazy, &candidates)?;
                let donor = self.retention.take(&names[chosen])?;
                (donor, candidates[chosen].top.clone())
            }
        };
        let Some(adopted) = self.adopt_cache(&old_top, tree) else {
            // The kernel let go of it meanwhile: nothing to take over.
            self.let_go_now(donor);
            return None;
        };
        for (parent, name) in &adopted.stale_entries {
            invalidator.invalidate_entry(*parent, name);
        }
        for ino in &adopted.stale_attrs {
            invalidator.invalidate_attrs(*ino);
        }
        log::debug!(
            "sandbox {id:?}: took over the kernel cache of {:?}: {} entries kept, {} dropped",
            donor.name,
            adopted.kept,
            adopted.stale_entries.len()
        );
        let kernel_name = donor.kernel_name().clone();
        self.kernel_names
            .lock()
            .insert(tree.ino(), kernel_name.clone());
        Some(kernel_name)
    }

    /// The kept cache of the sandbox destroyed last under name `id` (a
    /// root reused for the next action, as serve's slots are): the kernel
    /// holds its entries under that very name, so it is taken over
    /// without choosing among the others.
    fn predecessor(&self, id: &str) -> Option<(cache::retention::Departed, Arc<Node>)> {
        let departed = self.retention.take(&OsString::from(id))?;
        match departed.top.upgrade() {
            Some(top) => Some((departed, top)),
            None => {
                self.let_go_now(departed);
                None
            }
        }
    }

    /// Lets the kernel drop a departed sandbox's cache, off this thread.
    fn let_go_now(&self, departed: cache::retention::Departed) {
        if let Some(invalidator) = self.invalidator.get() {
            let invalidator = invalidator.clone();
            cache::reaper::later(Box::new(move || {
                cache::departure::let_go(vec![departed], invalidator)
            }));
        }
    }

    /// Creates sandbox `id` as a symlink to a sandbox built outside the
    /// view: entry `name` of `dir`, a symlink on disk, shown as it is.
    pub fn create_sandbox_link(
        &self,
        id: &str,
        dir: Arc<crate::sandbox::dirfd::Anchor>,
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
        self.insert_sandbox(id, node, 1)
    }

    pub fn has_sandbox(&self, id: &str) -> bool {
        self.sandboxes.lock().contains_key(OsStr::new(id))
    }

    fn insert_sandbox(
        &self,
        id: &str,
        tree: Arc<Node>,
        mappings: usize,
    ) -> Result<(), SandboxError> {
        let name = OsString::from(id);
        {
            let mut sandboxes = self.sandboxes.lock();
            if sandboxes.contains_key(&name) {
                return Err(SandboxError::Exists(id.to_owned()));
            }
            let root = self.root.dir().expect("the root is a directory");
            if root.insert_explicit(&name, tree).is_err() {
                return Err(SandboxError::HidesMapping(id.to_owned()));
            }
            sandboxes.insert(name.clone(), mappings);
        }
        // A reused id whose predecessor's cache was not taken over (see
        // `predecessor`): dropping that later would drop the new sandbox's.
        self.retention.forget(&name);
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
        let (removed, mappings);
        {
            let mut sandboxes = self.sandboxes.lock();
            let Some(count) = sandboxes.remove(&name) else {
                return Err(SandboxError::Missing(id.to_owned()));
            };
            mappings = count;
            let root = self.root.dir().expect("the root is a directory");
            removed = root.remove_explicit(&name);
        }
        // Outside every lock: the kernel may call back into us meanwhile.
        // Expiring (not invalidating) keeps the answer's cost flat however
        // much of the sandbox the kernel cached: the next walk through the
        // name asks us and gets ENOENT (or the new sandbox of a reused id).
        self.expire_entry(ROOT_INO, &name);
        // The cached subtree still holds its inodes, and so their nodes
        // here; letting it go after the answer makes the kernel forget
        // them, so that memory returns (`departure`). The subtrees of the
        // last few destroyed sandboxes are kept first, briefly
        // (`retention`): the next sandbox that shares their inputs takes
        // the kernel's entries, inodes and page cache over, and asks
        // nothing for what the kernel already had. (If an id is reused
        // meanwhile, invalidating only drops the new sandbox's entry.)
        let alias = removed
            .as_ref()
            .and_then(|top| self.kernel_names.lock().remove(&top.ino()));
        // A native sandbox's name is one symlink node: nothing below it for
        // the kernel to have cached, for a later sandbox to take over, or
        // to take long to free. Kept and disposed of like a tree, it woke
        // the reaper at every destroy, beside the actions running.
        if removed
            .as_ref()
            .is_some_and(|top| top.kind() == FileKind::Symlink)
        {
            return Ok(());
        }
        let departed = cache::retention::Departed {
            name,
            alias,
            top: removed.as_ref().map_or_else(Weak::new, Arc::downgrade),
        };
        let dropped = self
            .retention
            .retain(departed, mappings, std::time::Instant::now());
        if let Some(invalidator) = self.invalidator.get() {
            if !dropped.is_empty() {
                let invalidator = invalidator.clone();
                cache::reaper::later(Box::new(move || {
                    cache::departure::let_go(dropped, invalidator)
                }));
            }
            // The last destroys of a build have no later destroy to drop
            // their caches: a timed sweep does.
            if self.retention.claim_sweep() {
                let age = self.retention.max_age();
                cache::departure::sweep_retained(self.retention.clone(), invalidator.clone(), age);
            }
        }
        // Freeing a large tree takes a millisecond or more; the answer need
        // not wait for it either.
        if let Some(tree) = removed {
            cache::reaper::dispose(tree);
        }
        Ok(())
    }

    /// The sandboxes that exist now with their mapping counts, by id.
    pub fn sandbox_list(&self) -> Vec<(String, usize)> {
        let mut list: Vec<(String, usize)> = self
            .sandboxes
            .lock()
            .iter()
            .map(|(name, &count)| (name.to_string_lossy().into_owned(), count))
            .collect();
        list.sort();
        list
    }

    /// Ids of the sandboxes that exist now.
    pub fn sandbox_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .sandboxes
            .lock()
            .keys()
            .map(|n| n.to_string_lossy().into_owned())
            .collect();
        ids.sort();
        ids
    }

    /// Inodes the kernel holds, root included (for tests and memory checks).
    pub fn known_inodes(&self) -> usize {
        self.inodes.len()
    }

    /// Per-inode descriptors kept now, and the most that are kept.
    pub fn inode_descriptors(&self) -> (usize, usize) {
        (self.inode_files.len(), self.inode_files.cap())
    }

    /// Open file and directory handles (for tests and leak checks).
    pub fn open_handles(&self) -> usize {
        self.files.len() + self.dirs.len()
    }

    fn node(&self, ino: u64) -> FsResult<Arc<Node>> {
        Ok(self.known(ino)?.node)
    }

    /// What inode `ino` stands for; ESTALE if the kernel forgot it.
    fn forget_kernel_name(&self, ino: u64) {
        let mut names = self.kernel_names.lock();
        if !names.is_empty() {
            names.remove(&ino);
        }
    }

    fn known(&self, ino: u64) -> FsResult<inodes::Known> {
        self.inodes.get(ino).ok_or(FsError::refused(Errno::ESTALE))
    }
}

#[cfg(test)]
mod tests;
