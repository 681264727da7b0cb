//! Hybrid sandboxes: small ones built natively, large ones served by FUSE.
//!
//! A FUSE view makes a sandbox in constant time but charges a round trip
//! for every first lookup and open; a native tree (the materializer) costs
//! a syscall or two per input to make and to delete but then runs at
//! native speed. Below a measured input count ([`cutoff`]) the native tree
//! wins, so such a sandbox is materialized under `<native dir>/trees/ID`
//! and shown in the view as `MOUNT/ID`, a symlink to it (through
//! `<native dir>/links/ID`, a real symlink the view maps). Everything below
//! `MOUNT/ID` is then plain files; nothing crosses FUSE but that one name.
//!
//! A request the layout rejects gets the same answer as in FUSE mode. A
//! layout the materializer cannot make (a writable mapping of the sandbox
//! root, an input that would collide with a file already in a writable
//! directory, a failing system call) falls back to FUSE, logged.

pub mod cutoff;
pub mod handoff;
pub mod stash;

use stash::{Pool, Stash, Stashes};

#[cfg(test)]
mod reuse_tests;

use cutoff::Policy;

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use actionfs_protocol::validate_sandbox_id;
use parking_lot::Mutex;

use crate::sandbox::access_log::AccessLog;
use crate::sandbox::backend::{Backend, Refusal};
use crate::sandbox::dirfd::Anchor;
use crate::sandbox::layout::{Draft, Entry};
use crate::sandbox::materialize::reuse::{self, Stamps};
use crate::sandbox::materialize::shape::Dir;
use crate::sandbox::materialize::shape_cache::ShapeCache;
use crate::sandbox::materialize::{self, InPlace, Materialized, Method, Options, Trash};
use crate::sandbox::ownership::{self, OwnershipError, Rules};
use crate::sandbox::tree::{LazyEntries, SandboxError, SandboxFs};
use crate::stats::{Built, Stats};

/// The sandboxes of a mount, each made by the backend its size calls for:
/// the FUSE view always, native trees too when hybrid mode is on. This is
/// what the request loop drives.
pub struct Sandboxes {
    fs: Arc<SandboxFs>,
    native: Option<Arc<NativeSandboxes>>,
    stats: Arc<Stats>,
    access_log: Option<AccessLog>,
    /// Ids with a request being applied. Requests from one stream are
    /// already one at a time per id; this refuses a second one from
    /// another stream (the control socket) instead of racing it.
    in_flight: Mutex<HashSet<String>>,
}

/// One sandbox as `ctl list` shows it.
pub struct Listed {
    pub id: String,
    pub native: bool,
    pub mappings: usize,
}

impl Sandboxes {
    pub fn new(
        fs: Arc<SandboxFs>,
        native: Option<Arc<NativeSandboxes>>,
        stats: Arc<Stats>,
        access_log: Option<AccessLog>,
    ) -> Sandboxes {
        Sandboxes {
            fs,
            native,
            stats,
            access_log,
            in_flight: Mutex::default(),
        }
    }

    pub fn fs(&self) -> &Arc<SandboxFs> {
        &self.fs
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The sandboxes that exist now, sorted by id.
    pub fn list(&self) -> Vec<Listed> {
        self.fs
            .sandbox_list()
            .into_iter()
            .map(|(id, mappings)| {
                let native = self.native.as_ref().and_then(|n| n.mappings(&id));
                Listed {
                    native: native.is_some(),
                    mappings: native.unwrap_or(mappings),
                    id,
                }
            })
            .collect()
    }

    /// Hands the native sandboxes' stashes on to the next daemon (see
    /// [`Stashes::hand_on`]): `None` where nothing is stashed.
    pub fn hand_on_stashes(
        &self,
        to: &Path,
        own: &Path,
    ) -> Option<Result<usize, materialize::Error>> {
        Some(self.native.as_ref()?.stashes.as_ref()?.hand_on(to, own))
    }

    /// Has the native sandboxes adopt the stashes a predecessor handed on
    /// in the hand-off directory being read (see [`Stashes::adopt_from`]);
    /// removes that directory where nothing is stashed.
    pub fn adopt_stashes(&self, handed: handoff::Reading) {
        match &self.native {
            Some(native) => native.adopt_stashes(handed),
            None => stash::remove_handed(&handed.finish().0),
        }
    }

    /// If sandbox `id` was built natively, the real symlink to its tree
    /// that the view shows as `MOUNT/ID`, for a client that would rather
    /// not cross the view to reach it. Like `MOUNT/ID`, it is gone once
    /// the sandbox's destroy returns (its tree may linger a while).
    pub fn native_link(&self, id: &str) -> Option<PathBuf> {
        self.native.as_ref()?.link(id)
    }

    /// Whether sandbox `id` of `mappings` mappings, whose files a native
    /// build would make in `made_in`, would be built natively.
    pub fn builds_natively(&self, id: &str, made_in: &Path, mappings: usize) -> bool {
        self.native
            .as_deref()
            .is_some_and(|n| n.wants(id, Some(made_in), mappings))
    }

    /// Creates sandbox `id` in the FUSE view from its draft and the lazy
    /// directories grafted into it (see [`SandboxFs::create_drafted_lazy`]);
    /// `mappings` counts the inputs of both. For callers that asked
    /// [`Sandboxes::builds_natively`] first.
    pub fn create_lazy(
        &self,
        id: &str,
        draft: Draft,
        lazy: Vec<(String, Box<dyn LazyEntries>)>,
        mappings: usize,
    ) -> Result<(), Refusal> {
        self.create_in_view(id, || {
            let draft = self.finish(id, draft)?;
            Ok(self.fs.create_drafted_lazy(id, draft, lazy, mappings)?)
        })
    }

    /// Creates sandbox `id` in the FUSE view as one lazy directory over
    /// the writable directory `writable_root`
    /// ([`SandboxFs::create_lazy_root`]).
    pub fn create_lazy_root(
        &self,
        id: &str,
        writable_root: &Path,
        entries: Box<dyn LazyEntries>,
        mappings: usize,
    ) -> Result<(), Refusal> {
        self.create_in_view(id, || {
            Ok(self
                .fs
                .create_lazy_root(id, writable_root, entries, mappings)?)
        })
    }

    /// Creates sandbox `id` in the FUSE view by `make`, once the id is
    /// checked, claimed for this request and free.
    fn create_in_view(
        &self,
        id: &str,
        make: impl FnOnce() -> Result<(), Refusal>,
    ) -> Result<(), Refusal> {
        validate_sandbox_id(id).map_err(SandboxError::InvalidId)?;
        let _claimed = self.claim(id)?;
        if self.fs.has_sandbox(id) {
            return Err(SandboxError::Exists(id.to_owned()).into());
        }
        make()?;
        self.stats.built(Built::Fuse);
        Ok(())
    }

    /// Checks sandbox `id`'s draft against the mount (`Draft::finish`).
    fn finish(&self, id: &str, draft: Draft) -> Result<Draft, SandboxError> {
        draft
            .finish(&self.fs.config().mount_point)
            .map_err(|error| SandboxError::Layout {
                id: id.to_owned(),
                error,
            })
    }

    fn claim<'a>(&'a self, id: &'a str) -> Result<InFlight<'a>, Refusal> {
        if !self.in_flight.lock().insert(id.to_owned()) {
            return Err(SandboxError::Busy(id.to_owned()).into());
        }
        Ok(InFlight { owner: self, id })
    }

    /// Builds sandbox `id` natively from `draft`, or hands the draft to
    /// the FUSE view where the materializer cannot build it.
    fn create_native(
        &self,
        native: &NativeSandboxes,
        id: &str,
        draft: Draft,
    ) -> Result<Built, SandboxError> {
        match native.create(id, &draft) {
            Ok((links, built)) => {
                let shown = self.fs.create_sandbox_link(id, links, OsStr::new(id));
                if shown.is_err() {
                    if let Err(err) = native.destroy(id) {
                        log::error!("sandbox {id:?}: cannot undo a native build: {err}");
                    }
                }
                shown.map(|()| built)
            }
            Err(why) => {
                log::info!("sandbox {id:?}: served by FUSE, as it cannot be built natively: {why}");
                self.fs
                    .create_drafted(id, draft)
                    .map(|()| Built::FuseFallback)
            }
        }
    }
}

/// An id claimed for one request; released when dropped.
struct InFlight<'a> {
    owner: &'a Sandboxes,
    id: &'a str,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.owner.in_flight.lock().remove(self.id);
    }
}

impl Backend for Sandboxes {
    fn create(&self, id: &str, draft: Draft) -> Result<&'static str, Refusal> {
        validate_sandbox_id(id).map_err(SandboxError::InvalidId)?;
        let _claimed = self.claim(id)?;
        if self.fs.has_sandbox(id) {
            // sandboxfs 0.2.0 added a second create's mappings to the
            // sandbox and said "Already mapped" where they met; a sandbox is
            // created whole here, so any second create is refused, in its
            // words (docs/PARITY.md).
            return Err(SandboxError::AlreadyMapped(id.to_owned()).into());
        }
        // Checked once (an lstat per mapped directory, none per input),
        // whichever backend builds it.
        let started = std::time::Instant::now();
        let draft = self.finish(id, draft)?;
        let native = self
            .native
            .as_deref()
            .filter(|n| n.wants(id, draft.made_in(), draft.mapping_count()));
        let built = match native {
            // A sandbox whose root is mapped to a file is that file:
            // served by FUSE, where a read-only one stays read-only.
            Some(_) if draft.root_is_file() => {
                log::debug!("sandbox {id:?}: its root is a file: FUSE");
                self.fs.create_drafted(id, draft)?;
                Built::Fuse
            }
            Some(native) => self.create_native(native, id, draft)?,
            None => {
                let planned = started.elapsed();
                self.fs.create_drafted(id, draft)?;
                log::debug!(
                    "sandbox {id:?}: planned in {planned:?}, built in {:?}",
                    started.elapsed() - planned
                );
                Built::Fuse
            }
        };
        self.stats.built(built);
        Ok(match built {
            Built::Native => "native",
            Built::Stash => "native from a stash",
            Built::FuseFallback => "FUSE (fallback)",
            Built::Fuse => "FUSE",
        })
    }

    fn destroy(&self, id: &str) -> Result<(), Refusal> {
        if let Some(departure) = self.withdraw(id)? {
            departure.finish()?;
        }
        Ok(())
    }
}

impl Sandboxes {
    /// The part of a destroy after which sandbox `id` is gone from view
    /// and its id free; a native sandbox's stashing and deleting are
    /// left in the [`Departure`], for the caller to finish off its
    /// answer's path.
    pub fn withdraw(&self, id: &str) -> Result<Option<Departure>, Refusal> {
        validate_sandbox_id(id).map_err(SandboxError::InvalidId)?;
        let _claimed = self.claim(id)?;
        if let Some(log) = &self.access_log {
            // Read before the tree goes; native sandboxes have nothing to say.
            if let Ok(inputs) = self.fs.accessed(id) {
                log.write(id, &inputs);
            }
        }
        self.fs.destroy_sandbox(id)?;
        match &self.native {
            Some(native) => Ok(native.withdraw(id)?),
            None => Ok(None),
        }
    }
}

/// The natively built sandboxes, where they live, and the policy that
/// picks them.
pub struct NativeSandboxes {
    policy: Policy,
    method: Method,
    dir: PathBuf,
    /// `dir/trees`, where native trees are built.
    trees: PathBuf,
    /// Set up at the first native build (or at start for a fixed cutoff),
    /// so that a daemon that never builds one leaves no directory behind;
    /// `None` if it could not be set up (every sandbox is then FUSE).
    opened: OnceLock<Option<NativeDir>>,
    /// Where destroyed sandboxes' inputs are kept for reuse; `None` when
    /// reuse is off (or the method makes files an action could change).
    stashes: Option<Stashes>,
    /// Sandboxes of fewer mappings are built afresh and not stashed.
    reuse_from: usize,
    /// Shapes of the inputs of recent builds, for the next ones'.
    shapes: ShapeCache<Dir>,
    live: Mutex<HashMap<String, Live>>,
}

/// Below this many mappings a sandbox is built afresh and not stashed:
/// taking a stash (its stamps checked, reshaped, renamed in, restamped)
/// and stashing it after cost more than a few links; measured where
/// reuse starts to win (docs/BENCHMARKS.md, "Reusing native sandboxes").
const REUSE_FROM: usize = 32;

/// A native sandbox.
struct Live {
    built: Materialized,
    mappings: usize,
    /// How to stash its inputs when it is destroyed.
    reusable: Option<Reusable>,
    /// What is left of the stash it was built from, discarded when it
    /// departs: discarding wakes a deleting thread, which on two vCPUs
    /// costs the Create that did it tens of microseconds.
    shell: Option<Shell>,
}

/// A stash whose inputs went into a sandbox.
struct Shell {
    pool: Arc<Pool>,
    stash: Stash,
}

impl Shell {
    fn discard(self) {
        self.pool.discard_stash(self.stash);
    }
}

/// A native sandbox taken out of view, its inputs and tree still where
/// the action left them.
pub struct Departure {
    id: String,
    live: Live,
    /// Set when its inputs are to be stashed (builds wait for them).
    arriving: Option<stash::Arriving>,
    trash: Arc<Trash>,
}

impl Departure {
    /// Stashes the inputs (when worth keeping), and sends the rest of the
    /// tree to the trash.
    pub fn finish(self) -> Result<(), materialize::Error> {
        let Departure {
            id,
            live,
            arriving,
            trash,
        } = self;
        let keep = arriving.is_some();
        if let Some(shell) = live.shell {
            shell.discard();
        }
        let stashed = live.reusable.map(|reusable| {
            stash(reusable, keep).map_err(|err| log::info!("sandbox {id:?}: not stashed: {err}"))
        });
        drop(arriving);
        match stashed {
            // What is left in the writable directory is the action's.
            Some(Ok(())) => trash.discard(&live.built.root),
            _ => materialize::teardown(&live.built, Some(&trash)),
        }
    }
}

/// The inputs a native build placed in its writable directory, for a
/// stash.
struct Reusable {
    root: Arc<Anchor>,
    shape: Dir,
    placed: Vec<PathBuf>,
    stamps: Stamps,
    pool: Arc<Pool>,
}

/// Where a sandbox's inputs would go, when they can come from a stash.
struct ReuseTarget {
    /// The writable directory, in the draft.
    at: u32,
    root: Arc<Anchor>,
    want: Dir,
    pool: Arc<Pool>,
}

/// Why the native directory cannot be used (every sandbox is then served
/// by FUSE).
#[derive(Debug, thiserror::Error)]
pub enum NativeDirError {
    #[error(transparent)]
    Make(#[from] materialize::Error),
    /// It, or a directory in it, is not the daemon's user's alone.
    #[error("{0}: native sandboxes are not built there")]
    NotOurs(#[from] OwnershipError),
}

struct NativeDir {
    /// `links/ID` is the symlink the view shows as `MOUNT/ID`.
    links: Arc<Anchor>,
    trash: Arc<Trash>,
}

impl NativeDir {
    /// Prepares `dir` (created if missing). Whatever an earlier daemon
    /// left there is thrown away.
    fn open(dir: &Path) -> Result<NativeDir, NativeDirError> {
        let trees = dir.join("trees");
        let links = dir.join("links");
        for sub in [&trees, &links] {
            std::fs::create_dir_all(sub).map_err(|e| materialize::Error::new("mkdir", sub, e))?;
        }
        let trash = Trash::open(&dir.join("trash"), 1)?;
        // Everything below becomes an action's inputs, and an older daemon
        // may have left these writable to all.
        for made in [dir, &trees, &links, &dir.join("trash")] {
            ownership::check(made, &Rules::NATIVE_DIR)?;
        }
        for stale in [&trees, &links] {
            let entries = std::fs::read_dir(stale)
                .map_err(|e| materialize::Error::new("opendir", stale, e))?;
            for entry in entries.flatten() {
                trash.discard(&entry.path())?;
            }
        }
        // A daemon that was killed left its stash pool here too (one that
        // stopped deleted its own).
        let entries =
            std::fs::read_dir(dir).map_err(|e| materialize::Error::new("opendir", dir, e))?;
        for entry in entries.flatten() {
            if stash::is_stale_pool(&entry.file_name()) {
                trash.discard(&entry.path())?;
            }
        }
        let links =
            Anchor::open(&links, None).map_err(|e| materialize::Error::new("open", &links, e))?;
        Ok(NativeDir {
            links: Arc::new(links),
            trash: Arc::new(trash),
        })
    }
}

impl NativeSandboxes {
    /// Native sandboxes picked by `policy`, built in `dir` by `method`.
    /// Up to `stashes` destroyed sandboxes per file system are kept for
    /// reuse when `method` is symlink (other methods make files an action
    /// could change in place).
    pub fn new(dir: &Path, policy: Policy, method: Method, stashes: usize) -> NativeSandboxes {
        NativeSandboxes {
            policy,
            method,
            dir: dir.to_owned(),
            trees: dir.join("trees"),
            opened: OnceLock::new(),
            stashes: (method == Method::Symlink && stashes > 0).then(|| Stashes::new(dir, stashes)),
            reuse_from: REUSE_FROM,
            shapes: ShapeCache::default(),
            live: Mutex::default(),
        }
    }

    /// Reuses sandboxes of any size (the reuse tests' trees are small).
    #[cfg(test)]
    fn reusing_all(mut self) -> NativeSandboxes {
        self.reuse_from = 0;
        self
    }

    /// Sets up the native directory now, for an error at start rather
    /// than a fallback later.
    pub fn open_now(&self) -> Result<(), NativeDirError> {
        let mut failed = None;
        self.open_once(|err| failed = Some(err));
        failed.map_or(Ok(()), Err)
    }

    /// Adopts the stashes handed on (see [`Stashes::adopt_from`]). The
    /// native directory, made at the first native build where the cutoff
    /// goes by file system, is made now: adoption starts at once only in a
    /// pool there, and so does not wait for the first build that wants a
    /// stash (which would wait for it).
    fn adopt_stashes(&self, handed: handoff::Reading) {
        let Some(stashes) = &self.stashes else {
            return stash::remove_handed(&handed.finish().0);
        };
        if !self.policy.never_native() {
            let _ = self.native_dir();
        }
        stashes.adopt_from(handed);
    }

    fn native_dir(&self) -> Result<&NativeDir, materialize::Error> {
        self.open_once(|err| {
            log::warn!("native sandboxes are off, every sandbox is served by FUSE: {err}")
        })
        .ok_or_else(|| materialize::Error::other(&self.dir, "the native directory is unusable"))
    }

    /// The native directory, set up by the first call; a failure to set
    /// it up goes to that call's `on_error`, and is final.
    fn open_once(&self, on_error: impl FnOnce(NativeDirError)) -> Option<&NativeDir> {
        self.opened
            .get_or_init(|| NativeDir::open(&self.dir).map_err(on_error).ok())
            .as_ref()
    }

    /// Whether sandbox `id` of `mappings` mappings, whose files a native
    /// build would make in `made_in` (`None`: in the native directory),
    /// should be built natively. Logged at debug level.
    pub fn wants(&self, id: &str, made_in: Option<&Path>, mappings: usize) -> bool {
        if self.policy.never_native() {
            return false;
        }
        let made_in = made_in.unwrap_or(&self.trees);
        let native = self.policy.wants_native(mappings, made_in);
        log::debug!(
            "sandbox {id:?}: {mappings} mappings, files made in {made_in:?} ({}): {}",
            if cutoff::on_tmpfs(made_in) {
                "tmpfs"
            } else {
                "not tmpfs"
            },
            if native { "native" } else { "FUSE" }
        );
        native
    }

    /// The mapping count of native sandbox `id`.
    fn mappings(&self, id: &str) -> Option<usize> {
        self.live.lock().get(id).map(|live| live.mappings)
    }

    /// `links/ID`, the symlink to native sandbox `id`'s tree.
    fn link(&self, id: &str) -> Option<PathBuf> {
        let Some(Some(dir)) = self.opened.get() else {
            return None;
        };
        self.live
            .lock()
            .contains_key(id)
            .then(|| dir.links.path().join(id))
    }

    /// Builds sandbox `id` (a validated id, not yet in use) from `draft`
    /// (finished), from a stash where one fits, and the symlink `links/ID`
    /// to it; returns the `links` directory and how it was built. Inputs a
    /// stash brings are never typed into a plan. On error nothing is left.
    pub fn create(
        &self,
        id: &str,
        draft: &Draft,
    ) -> Result<(Arc<Anchor>, Built), materialize::Error> {
        let dir = self.native_dir()?;
        let root = self.trees.join(id);
        let target = self.reuse_target(draft);
        let stashed = target
            .as_ref()
            .and_then(|target| Some((target, target.pool.take(&target.want)?)));
        let from_stash = stashed.and_then(|(target, stash)| {
            self.build_from_stash(draft, &root, target, stash)
                .map_err(|why| log::info!("sandbox {id:?}: built afresh, as {why}"))
                .ok()
        });
        let (built, how, stamps, shell) = match from_stash {
            Some((built, stamps, shell)) => (built, Built::Stash, stamps, Some(shell)),
            None => {
                let plan = typed(draft, None, &root)?;
                (
                    materialize::materialize(&plan, &root, self.options())?,
                    Built::Native,
                    None,
                    None,
                )
            }
        };
        let link = dir.links.path().join(id);
        if let Err(err) = std::os::unix::fs::symlink(&root, &link) {
            if let Err(cleanup) = materialize::teardown(&built, Some(&dir.trash)) {
                log::error!("sandbox {id:?}: cannot undo a native build: {cleanup}");
            }
            if let Some(shell) = shell {
                shell.discard();
            }
            return Err(materialize::Error::new("symlink", &link, err));
        }
        let reusable = target.and_then(|target| reusable(target, &built, stamps));
        let live = Live {
            built,
            mappings: draft.mapping_count(),
            reusable,
            shell,
        };
        self.live.lock().insert(id.to_owned(), live);
        Ok((dir.links.clone(), how))
    }

    fn options(&self) -> Options {
        Options {
            method: self.method,
            threads: 0,
        }
    }

    /// Where `draft`'s inputs would go if they can come from a stash.
    fn reuse_target(&self, draft: &Draft) -> Option<ReuseTarget> {
        let stashes = self.stashes.as_ref()?;
        if draft.mapping_count() < self.reuse_from {
            return None;
        }
        let at = draft.inputs_dir()?;
        let root = draft.dirs[at as usize].mapped.as_ref()?.anchor.clone()?;
        let pool = stashes.pool_for(&root)?;
        // Last: the only part that costs per input, not built where no
        // stash can be.
        let want = Dir::of_draft(draft, at, Some(&self.shapes))?;
        Some(ReuseTarget {
            at,
            root,
            want,
            pool,
        })
    }

    /// Builds `draft` at `root` with the inputs of its writable directory
    /// taken from `stash`, reshaped; returns it with the stamps of what
    /// the stash brought (`None` if they could not be taken) and what is
    /// left of the stash, for the sandbox's departure to discard. On
    /// error nothing is left and the stash is discarded.
    fn build_from_stash(
        &self,
        draft: &Draft,
        root: &Path,
        target: &ReuseTarget,
        mut stash: Stash,
    ) -> Result<(Materialized, Option<Stamps>, Shell), materialize::Error> {
        let pool = &target.pool;
        let built = if reuse::unchanged_tree(&stash.dir, &stash.shape, &stash.stamps) {
            Ok(())
        } else {
            Err(materialize::Error::other(&stash.path, "the stash changed"))
        };
        let mut restamp = reuse::Restamp::default();
        let built = built
            .and_then(|()| {
                reuse::reshape(
                    &stash.dir,
                    &stash.path,
                    Path::new(""),
                    &stash.shape,
                    &target.want,
                    pool.trash(),
                    &mut restamp,
                )
            })
            .and_then(|_| {
                // Everything but the writable directory's inputs, which
                // come from the stash.
                let plan = typed(draft, Some(target.at), root)?;
                materialize::materialize(&plan, root, self.options())
            });
        let mut built = match built {
            Ok(built) => built,
            Err(err) => {
                pool.discard_stash(stash);
                return Err(err);
            }
        };
        let (placed, outcome) = reuse::put_in(&stash.dir, &target.want, &target.root);
        restamp.moved_in(&placed);
        built.in_place = placed
            .into_iter()
            .map(|rel| InPlace {
                root: target.root.clone(),
                rel,
            })
            .collect();
        let carried = std::mem::take(&mut stash.stamps);
        let shell = Shell {
            pool: pool.clone(),
            stash,
        };
        if let Err(err) = outcome {
            shell.discard();
            if let Err(cleanup) = materialize::teardown(&built, self.opened_trash()) {
                log::error!("cannot undo a build from a stash: {cleanup}");
            }
            return Err(err);
        }
        let stamps = reuse::restamped(&target.root, &target.want, carried, restamp)
            .map_err(|err| log::debug!("inputs not stamped, so not reused: {err}"))
            .ok();
        Ok((built, stamps, shell))
    }

    /// Whether live sandbox `id`'s stamps agree with a walk of what it
    /// would stash, taken now (`None`: it would stash nothing).
    #[cfg(test)]
    fn stamps_agree(&self, id: &str) -> Option<bool> {
        let live = self.live.lock();
        let reusable = live.get(id)?.reusable.as_ref()?;
        let now = reuse::stamp(&reusable.root, &reusable.shape, &reusable.placed).ok()?;
        Some(
            now.iter()
                .all(|(rel, stamp)| reusable.stamps.get(rel) == Some(stamp)),
        )
    }

    fn opened_trash(&self) -> Option<&Trash> {
        self.opened.get()?.as_ref().map(|dir| &*dir.trash)
    }

    /// Removes native sandbox `id` (already gone from the view): its
    /// inputs into a stash where it has one, else what it made inside
    /// writable directories at once; its tree through the trash. Returns
    /// false if `id` is not native.
    pub fn destroy(&self, id: &str) -> Result<bool, materialize::Error> {
        match self.withdraw(id)? {
            Some(departure) => departure.finish().map(|()| true),
            None => Ok(false),
        }
    }

    /// The part of [`NativeSandboxes::destroy`] that takes `id` away:
    /// its link goes, and the id is free. What is left to do (stashing,
    /// deleting) is the [`Departure`], for the caller to finish now or
    /// off the answer's path. `None` if `id` is not native.
    pub fn withdraw(&self, id: &str) -> Result<Option<Departure>, materialize::Error> {
        let Some(live) = self.live.lock().remove(id) else {
            return Ok(None);
        };
        let dir = self.native_dir()?;
        let departure = Departure {
            id: id.to_owned(),
            // Inputs not worth keeping still leave by a stash, deleted in
            // the background, so that the departure does not walk them.
            arriving: live
                .reusable
                .as_ref()
                .filter(|reusable| reusable.pool.wants_more())
                .map(|reusable| reusable.pool.expect()),
            live,
            trash: dir.trash.clone(),
        };
        let link = dir.links.path().join(id);
        match std::fs::remove_file(&link) {
            Ok(()) => Ok(Some(departure)),
            Err(err) => {
                if let Err(left) = departure.finish() {
                    log::warn!("sandbox {id:?}: {left}");
                }
                Err(materialize::Error::new("unlink", &link, err))
            }
        }
    }

    /// Removes every native sandbox still there (at shutdown) and waits
    /// for the trash to empty.
    pub fn destroy_all(&self) {
        let ids: Vec<String> = self.live.lock().keys().cloned().collect();
        for id in ids {
            if let Err(err) = self.destroy(&id) {
                log::warn!("sandbox {id:?}: {err}");
            }
        }
        if let Some(stashes) = &self.stashes {
            stashes.remove_all();
        }
        if let Some(Some(dir)) = self.opened.get() {
            dir.trash.wait_idle();
        }
    }
}

/// What to stash of `built` at destroy, if all it placed in writable
/// directories went into `target`'s; `stamps` if a build from a stash
/// already took them, else they are taken here.
fn reusable(target: ReuseTarget, built: &Materialized, stamps: Option<Stamps>) -> Option<Reusable> {
    let placed = built
        .in_place
        .iter()
        .map(|entry| Arc::ptr_eq(&entry.root, &target.root).then(|| entry.rel.clone()))
        .collect::<Option<Vec<_>>>()?;
    let stamps = match stamps {
        Some(stamps) => stamps,
        None => reuse::stamp(&target.root, &target.want, &placed)
            .map_err(|err| log::debug!("inputs not stamped, so not reused: {err}"))
            .ok()?,
    };
    Some(Reusable {
        root: target.root,
        shape: target.want,
        placed,
        stamps,
        pool: target.pool,
    })
}

/// Moves the inputs `reusable` describes into a new stash of its pool,
/// kept if `keep`, else deleted in the background.
fn stash(reusable: Reusable, keep: bool) -> Result<(), materialize::Error> {
    let pool = &reusable.pool;
    let (path, dir) = pool.new_dir()?;
    let moved = reuse::stash_out(
        &reusable.root,
        reusable.shape,
        &reusable.placed,
        reusable.stamps,
        &dir,
        &path,
    );
    match moved {
        Ok((shape, stamps)) if keep && !shape.is_empty() => {
            pool.keep(path, dir, shape, stamps);
            Ok(())
        }
        Ok(unkept) => {
            pool.discard(&path, Some(Box::new(unkept)));
            Ok(())
        }
        Err(err) => {
            pool.discard(&path, None);
            Err(err)
        }
    }
}

/// `draft` typed into a plan for the materializer, with directory
/// `left_empty`'s inputs left out (see [`Draft::typed_except`]); a leaf
/// that cannot be typed refuses the build of `root`.
fn typed(draft: &Draft, left_empty: Option<u32>, root: &Path) -> Result<Entry, materialize::Error> {
    draft.typed_except(left_empty).map_err(|err| {
        materialize::Error::other(root, &format!("its inputs cannot all be typed: {err}"))
    })
}
