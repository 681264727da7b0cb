//! What each request does: Push fills the store, Create turns a tree of
//! digests into a layout the existing core builds (FUSE view or native
//! tree, by the cutoff), Collect moves outputs out, Destroy removes it all.
//!
//! A sandbox is laid out as Bazel laid out its sandboxfs sandboxes: the
//! workspace directory `/<ws>` is a writable mapping of the sandbox's
//! scratch directory, where outputs land; each input is a read-only
//! mapping nested in it, of its captured content in the store or, for a
//! leaf nobody pushed, of `exec_root/<tree path>` (the default place).
//! Symlink nodes map to a symlink of the daemon's holding the target
//! verbatim, so nothing here ever follows one.

mod draft;
mod make;
mod manifest;
mod push;
mod resolve;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use actionfs_protocol::backend::sandbox::{collect, create, destroy, Manifest};
use actionfs_protocol::validate_sandbox_id;
use parking_lot::Mutex;

use super::capture::DefaultPlaces;
use super::confine::Jail;
use super::departures::Departures;
use super::error::{self, Error, PushRefusal};
use super::jail::Holders;
use super::kept::{InStore, KeptTrees};
use super::outputs::{self, Output};
use super::slots::{self, Slot, Slots};
use crate::sandbox::default_place::Looks;
use crate::sandbox::hybrid::Sandboxes;
use crate::sandbox::materialize::Trash;
use crate::sandbox::merkle::{Trees, Walked};
use crate::sandbox::store::ContentStore;
use crate::sandbox::tree::SymlinkTargets;
use crate::stats::RequestKind;

/// The directories of one `actionfs serve`, all below its base.
#[derive(Clone, Debug)]
pub struct Dirs {
    pub mount: PathBuf,
    /// One scratch directory per sandbox, holding its workspace directory.
    pub scratch: PathBuf,
    /// Symlinks with the targets of symlink nodes, one per target.
    pub links: PathBuf,
    /// An empty read-only directory, for empty directories of trees.
    pub empty: PathBuf,
}

impl Dirs {
    /// The backend's own directory, holding all of these (and the store
    /// and the native trees).
    fn own(&self) -> &Path {
        self.mount.parent().unwrap_or(&self.mount)
    }
}

/// A live sandbox's own state.
struct Live {
    scratch: Arc<Path>,
    outputs: Arc<[Output]>,
    /// The reused root it is built in, if any (its name in the core is
    /// then the slot's, not the id).
    slot: Option<Slot>,
}

/// Choices of `serve`'s options that the service applies.
#[derive(Clone, Copy, Debug)]
pub struct Choices {
    /// `--capture_below`.
    pub capture_below: u64,
    /// `--slots`: every sandbox in a reused FUSE root.
    pub slots: bool,
}

/// Where a Create builds: the sandbox's name in the core and its scratch
/// directory, new or a slot's.
pub(super) struct Place<'a> {
    pub core_name: &'a str,
    pub scratch: PathBuf,
    /// A slot's scratch directory, which may exist already.
    pub reused: bool,
}

/// A Create checked and resolved, ready to build.
struct Plan<'a> {
    walked: Arc<Walked>,
    /// Sorted by path.
    outs: Vec<Output>,
    writable: Vec<(&'a String, &'a String)>,
    exec_root: &'a Path,
    content: InStore,
    /// Served by FUSE whatever the cutoff says (see
    /// [`Service::writable_path_holding_inputs`]).
    fuse_only: bool,
}

pub struct Service {
    core: Arc<Sandboxes>,
    store: Arc<ContentStore>,
    trees: Trees<Arc<ContentStore>>,
    dirs: Dirs,
    live: Mutex<HashMap<String, Live>>,
    /// Digests whose last Push failed, and why: a Create naming one is
    /// refused with that reason where pushing the same entry again cannot
    /// help, else asks for it again (see [`PushRefusal::is_lasting`]).
    refused: Mutex<HashMap<String, Arc<PushRefusal>>>,
    links: SymlinkTargets,
    /// What earlier Creates worked out for each tree, by root digest.
    kept: KeptTrees,
    /// Where a destroyed sandbox's scratch directory goes, to be deleted
    /// off the Destroy's path.
    trash: Arc<Trash>,
    /// What is left of destroyed sandboxes, finished after the answer.
    departures: Departures,
    /// What relative content locations are relative to: the parent of
    /// `--workspace` (an absolute location is taken as it is).
    locations_root: PathBuf,
    /// Who confines actions, and so what Create answers about it.
    jail: Jail,
    /// The directories holding the backend's own (its store, its native
    /// trees), for the jail in force; `None` without a jail.
    holders: Option<Holders>,
    /// Whether a Create was served by FUSE for a writable path holding
    /// them (said once).
    said_fuse_for_writable: std::sync::atomic::AtomicBool,
    /// Which default places are captured into the store, and how.
    default_places: DefaultPlaces,
    /// Looks at the default places not captured, remembered while
    /// nothing changed there.
    looks: Looks,
    /// Reused roots, with `--slots=on`.
    slots: Option<Arc<Slots>>,
}

impl Service {
    /// `trash` is on the file system of `dirs.scratch`; relative content
    /// locations are below `locations_root`.
    pub fn new(
        core: Arc<Sandboxes>,
        store: Arc<ContentStore>,
        dirs: Dirs,
        trash: Trash,
        locations_root: PathBuf,
        jail: Jail,
        choices: Choices,
    ) -> Service {
        let store_for_captures = store.clone();
        let own = dirs.own();
        let holders = match &jail {
            Jail::None => None,
            Jail::Landlock { .. } => Some(Holders::of(own, false)),
            Jail::Bazel => Some(Holders::of(own, true)),
        };
        let slots = choices
            .slots
            .then(|| Arc::new(Slots::new(dirs.scratch.clone())));
        Service {
            slots,
            trees: Trees::new(store.clone()),
            links: SymlinkTargets::new(dirs.links.clone()),
            core,
            store,
            dirs,
            live: Mutex::default(),
            refused: Mutex::default(),
            kept: KeptTrees::default(),
            trash: Arc::new(trash),
            departures: Departures::start(),
            locations_root,
            jail,
            holders,
            said_fuse_for_writable: Default::default(),
            default_places: DefaultPlaces::new(store_for_captures, choices.capture_below),
            looks: Looks::new(),
        }
    }

    pub fn create(&self, id: &str, manifest: Manifest) -> create::Result {
        let started = Instant::now();
        let created = self.try_create(id, &manifest);
        let failed = created.as_ref().is_err_and(Error::is_failure);
        self.core
            .stats()
            .request(RequestKind::Create, started.elapsed(), !failed);
        let created = created.map(|(path, scratch)| create::result::Ok {
            confinement: self.jail.confinement(&manifest, &path, &scratch),
            path: path.to_string_lossy().into_owned(),
        });
        error::create_answer(id, created)
    }

    /// Checks the manifest, finds each input's content and makes the
    /// sandbox; returns the path Create answers and its scratch directory.
    fn try_create(&self, id: &str, manifest: &Manifest) -> Result<(PathBuf, Arc<Path>), Error> {
        validate_sandbox_id(id).map_err(Error::InvalidId)?;
        // Its scratch directory and tree are in the way until then.
        self.departures.wait_for(id);
        if self.live.lock().contains_key(id) {
            return Err(Error::Exists);
        }
        let root = manifest::input_root(manifest)?;
        let kept = self.kept.get(&root.hash);
        let walked = self.walk(&root.hash, root.size_bytes, kept.walked.clone())?;
        let outs = manifest::outputs(manifest, &walked)?;
        let writable = manifest::writable_dirs(manifest, &walked.top)?;

        let exec_root = Path::new(&manifest.exec_root);
        let content = self.content(id, &root.hash, &walked, kept, exec_root)?;
        let fuse_only = self.served_by_fuse_for_a_writable_path(id, manifest);
        let plan = Plan {
            walked,
            outs,
            writable,
            exec_root,
            content,
            fuse_only,
        };
        let slot = self.slots.as_ref().map(|slots| slots.take(&root.hash));
        let place = match &slot {
            Some(slot) => Place {
                core_name: &slot.name,
                scratch: slot.scratch.clone(),
                reused: true,
            },
            None => Place {
                core_name: id,
                scratch: self.dirs.scratch.join(id),
                reused: false,
            },
        };
        match self.make(id, &place, &plan) {
            Ok(()) => {
                let scratch: Arc<Path> = place.scratch.into();
                // A native tree is answered by the symlink `MOUNT/ID` maps,
                // not through the view: Bazel's `exists` on the root and
                // the action's first walk to its working directory would
                // each be a FUSE round trip (two an action, counted).
                let path = self
                    .core
                    .native_link(place.core_name)
                    .unwrap_or_else(|| self.dirs.mount.join(place.core_name));
                self.live.lock().insert(
                    id.to_owned(),
                    Live {
                        scratch: scratch.clone(),
                        outputs: plan.outs.into(),
                        slot,
                    },
                );
                Ok((path, scratch))
            }
            Err(err) => {
                self.store.release(id);
                if let (Some(slots), Some(slot)) = (&self.slots, &slot) {
                    slots.give_back_unknown(slot);
                }
                Err(err)
            }
        }
    }

    /// Whether sandbox `id` must be served by FUSE because its Create lets
    /// the action write where native inputs link
    /// ([`Service::writable_path_holding_inputs`]); said once in the log.
    fn served_by_fuse_for_a_writable_path(&self, id: &str, manifest: &Manifest) -> bool {
        let Some(path) = self.writable_path_holding_inputs(manifest) else {
            return false;
        };
        let first = !self
            .said_fuse_for_writable
            .swap(true, std::sync::atomic::Ordering::Relaxed);
        let own = self.dirs.own();
        let why = format!(
            "sandbox {id:?}: the writable path {path:?} holds {own:?}, where native inputs \
             link (an action could write a captured input through one): served by FUSE"
        );
        match first {
            true => log::warn!("{why} (said once)"),
            false => log::debug!("{why}"),
        }
        true
    }

    /// A path this Create lets the action write (a writable directory's
    /// host path, or one of its confinement's writable paths, as the jail
    /// in force reads them) that holds the backend's own directory, where
    /// a native sandbox's inputs link: the start checked only the paths
    /// every action may write (`keep_inputs_read_only`), not those a
    /// build adds (`--sandbox_writable_path=/dev/shm`, say).
    fn writable_path_holding_inputs<'m>(&self, manifest: &'m Manifest) -> Option<&'m str> {
        let holders = self.holders.as_ref()?;
        let landlock = matches!(self.jail, Jail::Landlock { .. });
        let confinement = manifest
            .confinement_setting
            .iter()
            .flat_map(|setting| setting.writable_paths.iter())
            // actionfs's jail allows `/dev` only as its device nodes.
            .filter(|path| !(landlock && Path::new(path) == Path::new("/dev")));
        manifest
            .writable_dirs
            .values()
            .chain(confinement)
            .map(String::as_str)
            .find(|path| holders.include(Path::new(path)))
    }

    pub fn collect(&self, id: &str, exec_root: &str) -> collect::Result {
        let started = Instant::now();
        let collected = self.try_collect(id, Path::new(exec_root));
        self.core
            .stats()
            .request(RequestKind::Collect, started.elapsed(), collected.is_ok());
        error::collect_answer(id, collected)
    }

    fn try_collect(&self, id: &str, exec_root: &Path) -> Result<(), Error> {
        // Not under the lock: other sandboxes' requests go on meanwhile.
        let (scratch, outputs) = match self.live.lock().get(id) {
            Some(live) => (live.scratch.clone(), live.outputs.clone()),
            None => return Err(Error::NoSuchSandbox),
        };
        if !exec_root.is_absolute() {
            return Err(Error::CollectExecRootNotAbsolute(exec_root.to_owned()));
        }
        outputs::collect(&scratch, exec_root, &outputs).map_err(Error::Collect)
    }

    pub fn destroy(&self, id: &str) -> destroy::Result {
        let started = Instant::now();
        let removed = self.live.lock().remove(id);
        let destroyed = match removed {
            None => Err(Error::NoSuchSandbox),
            Some(live) => self.tear_down(id, live),
        };
        self.core
            .stats()
            .request(RequestKind::Destroy, started.elapsed(), destroyed.is_ok());
        error::destroy_answer(id, destroyed)
    }

    /// Takes sandbox `id` out of view and unpins its content now (what
    /// only it used may be evicted, its single-use content is spent);
    /// stashes its inputs and discards its scratch directory on the
    /// departures thread (failures there are logged: the client was
    /// answered).
    fn tear_down(&self, id: &str, live: Live) -> Result<(), Error> {
        let core_name = live.slot.as_ref().map_or(id, |slot| &slot.name);
        let (withdrawn, departure) = match self.core.withdraw(core_name) {
            Ok(departure) => (Ok(()), departure),
            Err(err) => (Err(Error::Destroy(err)), None),
        };
        self.store.release(id);
        let trash = self.trash.clone();
        let slots = self.slots.clone();
        if let (Some(slots), Some(slot)) = (&slots, &live.slot) {
            slots.leaving(slot);
        }
        self.departures.send(
            id,
            Box::new(move |id| {
                if let Some(Err(err)) = departure.map(|d| d.finish()) {
                    log::warn!("sandbox {id:?}: destroy: {err}");
                }
                let (Some(slot), Some(slots)) = (&live.slot, slots) else {
                    if let Err(err) = trash.discard(&live.scratch) {
                        log::warn!("sandbox {id:?}: destroy: {err}");
                    }
                    return;
                };
                // Free again only once empty: the next sandbox there must
                // find none of this one's outputs or scratch files. A slot
                // that could not be emptied is never used again.
                match slots::empty(&live.scratch, &trash) {
                    Ok(()) => slots.give_back(slot),
                    Err(err) => {
                        log::warn!("sandbox {id:?}: destroy: {} left unused: {err}", slot.name);
                        slots.abandon(slot);
                    }
                }
            }),
        );
        withdrawn
    }

    /// The directory blobs the store holds, least recently used first.
    pub fn directory_blobs(&self) -> Vec<Arc<[u8]>> {
        self.store.directory_blobs()
    }

    /// Decodes and checks directory blob `bytes` (a predecessor's, see
    /// `trees_handed`) now, so that the first walk through it finds it
    /// done, and keeps it under the digest of its bytes; one that is not
    /// a valid directory is not kept.
    pub fn take_directory(&self, bytes: Vec<u8>) -> Result<(), Error> {
        let hash = crate::sandbox::store::Digest::of(&bytes).hex();
        self.trees
            .check_ahead(&hash, &bytes)
            .map_err(Error::DirectoryBlob)?;
        Ok(self.store.put_directory(&hash, bytes)?)
    }

    /// The looks at default places remembered.
    pub fn looks(&self) -> &Looks {
        &self.looks
    }

    /// Adopts the stashed native trees a predecessor handed on (see
    /// [`Sandboxes::adopt_stashes`]), before the first Create.
    pub fn adopt_stashes(&self, handed: crate::sandbox::hybrid::handoff::Reading) {
        self.core.adopt_stashes(handed);
    }

    /// Hands the stashed native trees on to the next backend (see
    /// [`Sandboxes::hand_on_stashes`]), once every sandbox is gone.
    pub fn hand_on_stashes(
        &self,
        to: &Path,
        own: &Path,
    ) -> Option<Result<usize, crate::sandbox::materialize::Error>> {
        self.core.hand_on_stashes(to, own)
    }

    /// Destroys every sandbox still there (the client went away), and
    /// waits until every scratch directory is deleted.
    pub fn destroy_all(&self) {
        let all: Vec<(String, Live)> = self.live.lock().drain().collect();
        for (id, live) in all {
            if let Err(err) = self.tear_down(&id, live) {
                log::warn!("sandbox {id:?}: {err}");
            }
        }
        self.departures.wait_idle();
        self.default_places.stop();
        self.trash.wait_idle();
    }
}
