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

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use actionfs_protocol::backend::digest::is_sha256_hex;
use actionfs_protocol::backend::sandbox::{
    self, collect, content, create, destroy, Manifest, Push, Retention,
};
use actionfs_protocol::validate_sandbox_id;
use parking_lot::Mutex;

use super::capture::DefaultPlaces;
use super::confine::Jail;
use super::departures::Departures;
use super::jail::Holders;
use super::kept::{InStore, Kept, KeptTrees, StoreAnswers, TreeContent};
use super::outputs::{self, Output};
use crate::sandbox::backend::Backend;
use crate::sandbox::default_place::{Batch, Looked, Looks, Place};
use crate::sandbox::file_kind::FileKind;
use crate::sandbox::hybrid::Sandboxes;
use crate::sandbox::layout::Draft;
use crate::sandbox::materialize::{remove_tree, Trash};
use crate::sandbox::merkle::{
    Fault, FileEntry, InvalidDirectory, MissingDir, Trees, WalkError, Walked,
};
use crate::sandbox::store::{self, AcquireError, ContentStore, Lookup, StoreError};
use crate::sandbox::tree::{EmptyDirs, MerkleInputs, SymlinkTargets};
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

/// Why a pushed entry was not kept.
struct Refusal {
    why: String,
    /// The entry itself is wrong (bytes that are not its digest's, no
    /// bytes at all, a location that is no file, too large): pushing it
    /// again cannot help. Otherwise a system call failed (a full disk, a
    /// location missing when read), and the entry is asked for again:
    /// Bazel pushes each entry once unless told MissingContent.
    lasting: bool,
}

impl Refusal {
    fn of(err: StoreError) -> Refusal {
        Refusal {
            lasting: !matches!(err, StoreError::Io { .. }),
            why: err.to_string(),
        }
    }
}

/// Why a create did not make a sandbox.
enum Refused {
    Missing(Vec<String>),
    Invalid(String),
}

impl From<String> for Refused {
    fn from(why: String) -> Refused {
        Refused::Invalid(why)
    }
}

impl From<&str> for Refused {
    fn from(why: &str) -> Refused {
        Refused::Invalid(why.to_owned())
    }
}

pub struct Service {
    core: Arc<Sandboxes>,
    store: Arc<ContentStore>,
    trees: Trees<Arc<ContentStore>>,
    dirs: Dirs,
    live: Mutex<HashMap<String, Live>>,
    /// Digests whose last Push failed, and why: a Create naming one is
    /// refused with that reason where pushing the same entry again cannot
    /// help, else asks for it again (see [`Refusal`]).
    refused: Mutex<HashMap<String, Refusal>>,
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
        capture_below: u64,
    ) -> Service {
        let store_for_captures = store.clone();
        let own = dirs.own();
        let holders = match &jail {
            Jail::None => None,
            Jail::Landlock { .. } => Some(Holders::of(own, false)),
            Jail::Bazel => Some(Holders::of(own, true)),
        };
        Service {
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
            default_places: DefaultPlaces::new(store_for_captures, capture_below),
            looks: Looks::new(),
        }
    }

    /// Captures a Push into the store, every entry now. A Push has no
    /// answer: a refused entry is logged (Bazel keeps the last lines of
    /// stderr) and remembered for the Create that names it.
    pub fn push(&self, push: Push) {
        for (hash, bytes) in push.blobs {
            let put = self.store.put_directory(&hash, bytes);
            self.note(&hash, put.map_err(Refusal::of));
        }
        for (hash, entry) in push.content {
            let retention = match entry.retention() {
                Retention::Reuse => store::Retention::Keep,
                Retention::SingleUse => store::Retention::SingleUse,
            };
            let put = match entry.source {
                Some(content::Source::Inline(bytes)) => {
                    self.store.put_bytes(&hash, &bytes, retention)
                }
                Some(content::Source::Location(path)) => {
                    self.store.capture(&hash, &self.location(&path), retention)
                }
                None => {
                    let why = "a content entry with neither bytes nor a location".to_owned();
                    self.note(&hash, Err(Refusal { why, lasting: true }));
                    continue;
                }
            };
            self.note(&hash, put.map_err(Refusal::of));
        }
    }

    /// A content location's host path: Bazel sends runfiles members and
    /// displaced files relative to `Manifest.exec_root`, which is the
    /// parent of `--workspace` (a Push comes before any Create says so).
    fn location(&self, path: &str) -> PathBuf {
        self.locations_root.join(path)
    }

    fn note(&self, hash: &str, put: Result<(), Refusal>) {
        match put {
            Ok(()) => {
                self.refused.lock().remove(hash);
            }
            Err(refusal) => {
                log::error!("push: {}", refusal.why);
                self.refused.lock().insert(hash.to_owned(), refusal);
            }
        }
    }

    pub fn create(&self, id: &str, manifest: Manifest) -> create::Result {
        use create::result::Outcome;
        let started = Instant::now();
        let created = self.try_create(id, &manifest);
        // MissingContent is not a failure: Bazel pushes and asks again.
        let failed = matches!(created, Err(Refused::Invalid(_)));
        self.core
            .stats()
            .request(RequestKind::Create, started.elapsed(), !failed);
        let outcome = match created {
            Ok(path) => Outcome::Ok(create::result::Ok {
                confinement: self
                    .jail
                    .confinement(&manifest, &path, &self.dirs.scratch.join(id)),
                path: path.to_string_lossy().into_owned(),
            }),
            Err(Refused::Missing(digest_hashes)) => {
                Outcome::MissingContent(create::result::MissingContent { digest_hashes })
            }
            Err(Refused::Invalid(why)) => Outcome::Error(error(format!("sandbox {id:?}: {why}"))),
        };
        create::Result {
            outcome: Some(outcome),
        }
    }

    fn try_create(&self, id: &str, manifest: &Manifest) -> Result<PathBuf, Refused> {
        validate_sandbox_id(id).map_err(|err| err.to_string())?;
        // Its scratch directory and tree are in the way until then.
        self.departures.wait_for(id);
        if self.live.lock().contains_key(id) {
            return Err("it already exists (destroy it first)".to_owned().into());
        }
        check_hash_function(&manifest.hash_function)?;
        let root = manifest
            .input_root_digest
            .as_ref()
            .ok_or("the manifest has no input_root_digest")?;
        if !is_sha256_hex(&root.hash) {
            return Err(format!("input_root_digest {:?} is not a SHA-256 hash", root.hash).into());
        }
        let kept = self.kept.get(&root.hash);
        let walked = self.walk(&root.hash, root.size_bytes, kept.walked.clone())?;
        let ws = walked.top.as_str();
        let mut outs = Vec::with_capacity(manifest.outputs.len());
        for (key, output) in &manifest.outputs {
            outs.push(outputs::check(ws, key, &output.r#type, &output.dest)?);
        }
        outs.sort_by(|a, b| a.path.cmp(&b.path));
        outputs::check_against_tree(&outs, &walked)?;
        let mut writable: Vec<(&String, &String)> = manifest.writable_dirs.iter().collect();
        writable.sort();
        for (path, host) in &writable {
            outputs::check_sandbox_path(path).map_err(|why| format!("writable dir: {why}"))?;
            if path.strip_prefix('/') == Some(ws) {
                return Err(format!("writable dir {path:?} is the workspace itself").into());
            }
            if !Path::new(host).is_absolute() {
                return Err(
                    format!("writable dir {path:?}: host path {host:?} is not absolute").into(),
                );
            }
        }

        let exec_root = Path::new(&manifest.exec_root);
        let content = self.content(id, &root.hash, &walked, kept, exec_root)?;
        let fuse_only = self.served_by_fuse_for_a_writable_path(id, manifest);
        let mut plan = Plan {
            walked,
            outs,
            writable,
            exec_root,
            content,
            fuse_only,
        };
        match self.make(id, &mut plan) {
            Ok(scratch) => {
                self.live.lock().insert(
                    id.to_owned(),
                    Live {
                        scratch: scratch.into(),
                        outputs: plan.outs.into(),
                    },
                );
                // A native tree is answered by the symlink `MOUNT/ID` maps,
                // not through the view: Bazel's `exists` on the root and
                // the action's first walk to its working directory would
                // each be a FUSE round trip (two an action, counted).
                Ok(self
                    .core
                    .native_link(id)
                    .unwrap_or_else(|| self.dirs.mount.join(id)))
            }
            Err(why) => {
                self.store.release(id);
                Err(why.into())
            }
        }
    }

    /// Each file's content for sandbox `id` of tree `root`, pinned in the
    /// store: the entries a Create of the tree pinned before (`kept`) while
    /// each is still held, with no lookup or path per file; else what the
    /// store holds, after capturing what it lacks from default places
    /// (`None`: served at the default place).
    fn content(
        &self,
        id: &str,
        root: &str,
        walked: &Walked,
        kept: Kept,
        exec_root: &Path,
    ) -> Result<InStore, Refused> {
        if let Some(kept) = kept.content.filter(|kept| !kept.awaits_capture) {
            if kept.in_store.each.contains(&false) {
                self.check_default_places_readable(exec_root)?;
            }
            let wanted = walked
                .files()
                .zip(kept.in_store.each.iter())
                .filter(|(_, &stored)| stored)
                .map(|((_, file), _)| (file.digest, file.executable));
            if self.store.acquire_again(id, &kept.acquired, wanted) {
                return Ok(kept.in_store.clone());
            }
        }
        let found = self.lookups(root, walked, kept.found);
        let found = self.capture_default_places(root, walked, found, exec_root)?;
        // Held once and gone, or pushed and not kept for the moment: for
        // Bazel to push (again).
        let mut evicted = Vec::new();
        {
            let refused = self.refused.lock();
            if found.any_gone || (found.any_absent && !refused.is_empty()) {
                for ((dir, file), found) in walked.files().zip(found.each.iter()) {
                    match found {
                        Lookup::Present => {}
                        Lookup::Gone => evicted.push(file.hash.to_string()),
                        // Pushed, but refused: not to be read from elsewhere.
                        Lookup::Absent => match refused.get(&*file.hash) {
                            Some(refusal) if refusal.lasting => {
                                return Err(format!(
                                    "input {dir}/{}: its pushed content was refused: {}",
                                    file.name, refusal.why
                                )
                                .into())
                            }
                            Some(_) => evicted.push(file.hash.to_string()),
                            None => {}
                        },
                    }
                }
            }
        }
        if !evicted.is_empty() {
            // One digest may be at many paths; name it once.
            evicted.sort_unstable();
            evicted.dedup();
            return Err(self.missing(evicted));
        }
        if found.any_absent {
            self.check_default_places_readable(exec_root)?;
        }
        self.acquire(id, root, walked, &found.each)
    }

    /// [`DefaultPlaces::capture`] for tree `root`, and the lookups after.
    fn capture_default_places(
        &self,
        root: &str,
        walked: &Walked,
        found: Arc<StoreAnswers>,
        exec_root: &Path,
    ) -> Result<Arc<StoreAnswers>, Refused> {
        if !self.default_places.any_to_capture(walked, &found) {
            return Ok(found);
        }
        self.check_default_places_readable(exec_root)?;
        let refused: HashSet<String> = self.refused.lock().keys().cloned().collect();
        Ok(
            match self
                .default_places
                .capture(walked, &found, exec_root, &refused)?
            {
                true => self.lookups(root, walked, None),
                false => found,
            },
        )
    }

    /// Default places are read below `exec_root`, which must be absolute
    /// and outside the mount (the daemon would read its own view) and the
    /// rest of the backend's own directory (a native sandbox's link, say:
    /// its tree goes with its destroy).
    fn check_default_places_readable(&self, exec_root: &Path) -> Result<(), String> {
        if !exec_root.is_absolute() {
            return Err(format!(
                "exec_root {:?} is not absolute, and inputs without pushed content are read below it",
                exec_root
            ));
        }
        let own = self.dirs.own();
        let inside = if exec_root.starts_with(&self.dirs.mount) {
            format!("the mount point {:?}", self.dirs.mount)
        } else if exec_root.starts_with(own) {
            format!("the backend's own directory {own:?}")
        } else {
            return Ok(());
        };
        Err(format!(
            "exec_root {exec_root:?} is inside {inside}, and inputs without pushed content are \
             read below it"
        ))
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

    /// Pins in the store, for sandbox `id`, the content of tree `root`'s
    /// present files, and keeps what it pinned for the tree's next Create;
    /// returns which files are read from the store.
    fn acquire(
        &self,
        id: &str,
        root: &str,
        walked: &Walked,
        found: &[Lookup],
    ) -> Result<InStore, Refused> {
        let wanted: Vec<_> = walked
            .files()
            .zip(found.iter())
            .filter(|(_, found)| **found == Lookup::Present)
            .map(|((_, file), _)| (file.digest, file.executable))
            .collect();
        let acquired = match self.store.acquire_tree(id, &wanted) {
            Ok(acquired) => acquired,
            Err(AcquireError::Missing(missing)) => return Err(self.missing(missing.hashes)),
            Err(AcquireError::Store(err)) => return Err(err.to_string().into()),
        };
        let each: Arc<[bool]> = found.iter().map(|f| *f == Lookup::Present).collect();
        let in_store = InStore::new(each, self.store.clone());
        self.kept.keep_content(
            root,
            Arc::new(TreeContent {
                acquired,
                awaits_capture: walked
                    .files()
                    .zip(in_store.each.iter())
                    .any(|((_, file), &stored)| !stored && self.default_places.captures(file)),
                in_store: in_store.clone(),
            }),
        );
        Ok(in_store)
    }

    /// The walk of tree `root`: the one `kept` if the tree was seen
    /// before (a digest's tree never changes).
    fn walk(
        &self,
        root: &str,
        size: i64,
        kept: Option<Arc<Walked>>,
    ) -> Result<Arc<Walked>, Refused> {
        if let Some(walked) = kept {
            return Ok(walked);
        }
        let walked = match walk_workspace(&self.trees, root, size) {
            Ok(walked) => Arc::new(walked),
            Err(WalkError::Invalid(why)) => return Err(why.to_string().into()),
            Err(WalkError::Missing(missing)) => {
                return Err(self.missing(missing.into_iter().map(|dir| dir.hash).collect()))
            }
        };
        self.kept.keep_walk(root, walked.clone());
        Ok(walked)
    }

    /// What the store says of each file of tree `root` (`walked`): asked
    /// once per tree while no content comes or goes (`kept` holds the
    /// answers of the generation they were made at).
    fn lookups(
        &self,
        root: &str,
        walked: &Walked,
        kept: Option<(u64, Arc<StoreAnswers>)>,
    ) -> Arc<StoreAnswers> {
        let generation = self.store.generation();
        if let Some((at, found)) = kept {
            if at == generation {
                return found;
            }
        }
        let (each, generation) = self.store.lookup_all(walked.files().map(|(_, f)| f.digest));
        let found = Arc::new(StoreAnswers::new(each));
        self.kept.keep_found(root, generation, found.clone());
        found
    }

    /// Makes the scratch directory and the sandbox from a checked tree;
    /// on failure nothing of it is left.
    fn make(&self, id: &str, plan: &mut Plan) -> Result<PathBuf, String> {
        let scratch = self.dirs.scratch.join(id);
        fs::create_dir(&scratch).map_err(|err| format!("mkdir {scratch:?}: {err}"))?;
        let made = (|| {
            let ws_dir = scratch.join(&plan.walked.top);
            fs::create_dir(&ws_dir).map_err(|err| format!("mkdir {ws_dir:?}: {err}"))?;
            outputs::prepare(&scratch, &plan.walked.top, &plan.outs)
                .map_err(|err| err.to_string())?;
            let links = self.links.of(&plan.walked).map_err(|err| err.to_string())?;
            let mappings = mapping_count(plan);
            // Natively, every input (the materializer needs them all). In
            // FUSE, directories off the outputs' paths are lazy, made into
            // nodes when the action first reaches them. Either way default
            // places are looked at (the draft's now, a lazy directory's
            // when it is made): one inside the mount would have the daemon
            // look into its own view.
            let native = !plan.fuse_only && self.core.builds_natively(id, &ws_dir, mappings);
            let mut lazy = Vec::new();
            let draft = self.draft(id, plan, &ws_dir, &links, (!native).then_some(&mut lazy))?;
            if lazy.is_empty() && !plan.fuse_only {
                return self
                    .core
                    .create(id, draft)
                    .map(drop)
                    .map_err(|err| core_refusal(id, err));
            }
            let inputs = MerkleInputs::new(
                id,
                plan.walked.clone(),
                Arc::new(plan.content.clone()),
                plan.exec_root.to_owned(),
                links,
                EmptyDirs::Mapped(self.dirs.empty.clone()),
            );
            let lazy = lazy
                .into_iter()
                .map(|path| {
                    let entries = inputs.dir(&path).expect("a directory of the walk");
                    (path, entries)
                })
                .collect();
            self.core
                .create_lazy(id, draft, lazy, mappings)
                .map_err(|err| core_refusal(id, err))
        })();
        match made {
            Ok(()) => Ok(scratch),
            Err(why) => {
                if let Err(err) = remove_tree(&scratch) {
                    log::warn!("sandbox {id:?}: {err}");
                }
                Err(why)
            }
        }
    }

    /// The layout: the workspace directory writable over `scratch_ws`,
    /// writable directories, then every input read-only. With `lazy`,
    /// only the directories on the outputs' and writable directories'
    /// paths get their inputs here; the others whose parents are among
    /// them are pushed to `lazy` (their paths in the walk) and left out.
    fn draft(
        &self,
        id: &str,
        plan: &Plan,
        scratch_ws: &Path,
        links: &HashMap<Box<str>, PathBuf>,
        mut lazy: Option<&mut Vec<String>>,
    ) -> Result<Draft, String> {
        let Plan {
            walked,
            outs,
            writable,
            exec_root,
            content,
            fuse_only: _,
        } = plan;
        let ws = walked.top.as_str();
        let mut draft = Draft::new(Some(id));
        let mut index = 0;
        // Inputs' types are known: store files and default places looked
        // at are files, links ours; so the native build need not type them.
        let mut add = |path: &str, underlying: &[u8], writable: bool, kind: Option<FileKind>| {
            match kind {
                Some(kind) => draft.add_known(index, path, underlying, writable, kind),
                None => draft.add(index, path, underlying, writable),
            }
            index += 1;
        };
        add(
            &format!("/{ws}"),
            scratch_ws.as_os_str().as_bytes(),
            true,
            None,
        );
        for (path, host) in writable.iter() {
            add(path, host.as_bytes(), true, None);
        }
        // An empty directory on an output's path is the scratch one.
        let output_dirs: HashSet<&str> = outs
            .iter()
            .flat_map(|o| ancestors(&o.path, o.dir))
            .collect();
        // Writable directories are mappings the draft nests: the tree's
        // directories on their paths stay in it too, never lazy.
        let writable_dirs: HashSet<&str> = writable
            .iter()
            .flat_map(|(path, _)| ancestors(&path[1..], true))
            .collect();
        let on_outputs_path =
            |dir: &str| dir == ws || output_dirs.contains(dir) || writable_dirs.contains(dir);
        // One buffer for every sandbox path and one for every default
        // place: no allocation per input.
        let (mut path, mut here) = (String::with_capacity(256), Vec::with_capacity(512));
        let mut store_path = Vec::with_capacity(256);
        let mut first_file = 0;
        let looks = self.looks.batch();
        for (dir, entries) in &walked.dirs {
            let files = first_file..first_file + entries.files.len();
            first_file = files.end;
            if let Some(lazy) = lazy.as_deref_mut() {
                if !on_outputs_path(dir) {
                    let parent = dir.rsplit_once('/').map_or("", |(parent, _)| parent);
                    if !on_outputs_path(parent) {
                        continue; // inside a lazy directory
                    }
                    if !entries.is_empty() {
                        lazy.push(dir.clone());
                        continue;
                    }
                    // Empty: mapped below, as in any draft.
                }
            }
            path.clear();
            path.push('/');
            path.push_str(dir);
            path.push('/');
            let base = path.len();
            let in_store = &content.each[files];
            let looked =
                self.look_at_default_places(&looks, exec_root, dir, &entries.files, in_store);
            // A file found here is linked where the directory's path
            // leads, if known: an open in the sandbox then follows one
            // link, not also the exec root's links into the source tree.
            here.clear();
            match &looked.resolved {
                Some(resolved) => here.extend_from_slice(resolved.as_os_str().as_bytes()),
                None => {
                    here.extend_from_slice(exec_root.as_os_str().as_bytes());
                    here.push(b'/');
                    here.extend_from_slice(dir.as_bytes());
                }
            }
            here.push(b'/');
            let here_base = here.len();
            let mut found = looked.places.into_iter();
            for (entry, &stored) in entries.files.iter().zip(in_store) {
                path.truncate(base);
                path.push_str(&entry.name);
                let file = Some(FileKind::RegularFile);
                match stored {
                    true => {
                        store_path.clear();
                        content.push_path(entry, &mut store_path);
                        add(&path, &store_path, false, file)
                    }
                    false => match found.next().expect("a look per default place") {
                        Place::Here => {
                            here.truncate(here_base);
                            here.extend_from_slice(entry.name.as_bytes());
                            add(&path, &here, false, file);
                        }
                        Place::Elsewhere(target) => {
                            add(&path, target.as_os_str().as_bytes(), false, file)
                        }
                        Place::Refused(why) => return Err(format!("input {}: {why}", &path[1..])),
                    },
                }
            }
            for link in entries.symlinks.iter() {
                path.truncate(base);
                path.push_str(&link.name);
                let ours = links[&*link.target].as_os_str().as_bytes();
                add(&path, ours, false, Some(FileKind::Symlink));
            }
            if entries.is_empty() && dir != ws && !output_dirs.contains(dir.as_str()) {
                add(
                    &path[..base - 1],
                    self.dirs.empty.as_os_str().as_bytes(),
                    false,
                    None,
                );
            }
        }
        Ok(draft)
    }

    /// What is at the default place of each file of directory `dir` that
    /// has no content in the store (`in_store` is false), in order.
    fn look_at_default_places(
        &self,
        looks: &Batch,
        exec_root: &Path,
        dir: &str,
        files: &[FileEntry],
        in_store: &[bool],
    ) -> Looked {
        if !in_store.contains(&false) {
            return Looked::unresolved(Vec::new());
        }
        let defaults: Vec<_> = files
            .iter()
            .zip(in_store)
            .filter(|(_, &stored)| !stored)
            .map(|(file, _)| (&*file.name, file.size))
            .collect();
        looks.look_resolving(&exec_root.join(dir), &defaults)
    }

    /// MissingContent for `hashes`, unless a Push brought an entry for
    /// one of them that pushing again cannot mend: then the reason.
    fn missing(&self, hashes: Vec<String>) -> Refused {
        let refused = self.refused.lock();
        let lasting = hashes
            .iter()
            .find_map(|h| refused.get(h).filter(|refusal| refusal.lasting));
        match lasting {
            Some(refusal) => {
                Refused::Invalid(format!("pushed content was refused: {}", refusal.why))
            }
            None => Refused::Missing(hashes),
        }
    }

    pub fn collect(&self, id: &str, exec_root: &str) -> collect::Result {
        use collect::result::Outcome;
        let outcome = (|| {
            // Not under the lock: other sandboxes' requests go on meanwhile.
            let (scratch, outputs) = match self.live.lock().get(id) {
                Some(live) => (live.scratch.clone(), live.outputs.clone()),
                None => return Err(format!("sandbox {id:?}: no such sandbox")),
            };
            let exec_root = Path::new(exec_root);
            if !exec_root.is_absolute() {
                return Err(format!(
                    "sandbox {id:?}: exec_root {exec_root:?} is not absolute"
                ));
            }
            outputs::collect(&scratch, exec_root, &outputs)
                .map_err(|why| format!("sandbox {id:?}: collect: {why}"))
        })();
        collect::Result {
            outcome: Some(match outcome {
                Ok(()) => Outcome::Ok(collect::result::Ok {}),
                Err(why) => Outcome::Error(error(why)),
            }),
        }
    }

    pub fn destroy(&self, id: &str) -> destroy::Result {
        use destroy::result::Outcome;
        let started = Instant::now();
        let removed = self.live.lock().remove(id);
        let outcome = match removed {
            None => Err(format!("sandbox {id:?}: no such sandbox")),
            Some(live) => self.tear_down(id, live),
        };
        self.core
            .stats()
            .request(RequestKind::Destroy, started.elapsed(), outcome.is_ok());
        destroy::Result {
            outcome: Some(match outcome {
                Ok(()) => Outcome::Ok(destroy::result::Ok {}),
                Err(why) => Outcome::Error(error(why)),
            }),
        }
    }

    /// Takes sandbox `id` out of view and unpins its content now (what
    /// only it used may be evicted, its single-use content is spent);
    /// stashes its inputs and discards its scratch directory on the
    /// departures thread (failures there are logged: the client was
    /// answered).
    fn tear_down(&self, id: &str, live: Live) -> Result<(), String> {
        let (withdrawn, departure) = match self.core.withdraw(id) {
            Ok(departure) => (Ok(()), departure),
            Err(err) => (Err(err.to_string()), None),
        };
        self.store.release(id);
        let trash = self.trash.clone();
        self.departures.send(
            id,
            Box::new(move |id| {
                if let Some(Err(err)) = departure.map(|d| d.finish()) {
                    log::warn!("sandbox {id:?}: destroy: {err}");
                }
                if let Err(err) = trash.discard(&live.scratch) {
                    log::warn!("sandbox {id:?}: destroy: {err}");
                }
            }),
        );
        withdrawn.map_err(|why| format!("sandbox {id:?}: destroy: {why}"))
    }

    /// The directory blobs the store holds, least recently used first.
    pub fn directory_blobs(&self) -> Vec<Arc<[u8]>> {
        self.store.directory_blobs()
    }

    /// Decodes and checks directory blob `bytes` (a predecessor's, see
    /// `trees_handed`) now, so that the first walk through it finds it
    /// done, and keeps it under the digest of its bytes; one that is not
    /// a valid directory is not kept.
    pub fn take_directory(&self, bytes: Vec<u8>) -> Result<(), String> {
        let hash = crate::sandbox::store::Digest::of(&bytes).hex();
        self.trees
            .check_ahead(&hash, &bytes)
            .map_err(|err| err.to_string())?;
        self.store
            .put_directory(&hash, bytes)
            .map_err(|err| err.to_string())
    }

    /// The looks at default places remembered.
    pub fn looks(&self) -> &Looks {
        &self.looks
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
            if let Err(why) = self.tear_down(&id, live) {
                log::warn!("{why}");
            }
        }
        self.departures.wait_idle();
        self.default_places.stop();
        self.trash.wait_idle();
    }
}

/// Why the core refused sandbox `id`, without the sandbox's name it
/// starts with: the Error Bazel gets names it once, in front.
fn core_refusal(id: &str, err: impl std::fmt::Display) -> String {
    let why = err.to_string();
    match why.strip_prefix(&format!("sandbox {id:?}: ")) {
        Some(rest) => rest.to_owned(),
        None => why,
    }
}

/// Walks the tree of root directory `root`, which must hold exactly one
/// directory, the workspace: every path walked starts with its name.
fn walk_workspace(
    trees: &Trees<Arc<ContentStore>>,
    root: &str,
    size: i64,
) -> Result<Walked, WalkError> {
    let Some(top) = trees.checked(root, size)? else {
        return Err(WalkError::Missing(vec![MissingDir {
            hash: root.to_owned(),
            size,
            path: String::new(),
        }]));
    };
    let unexpected = || {
        WalkError::Invalid(InvalidDirectory {
            hash: root.to_owned(),
            fault: Fault::Unexpected {
                dirs: top.dirs.len(),
                files: top.files.len(),
                symlinks: top.symlinks.len(),
                expected: "an input root must hold exactly one directory, named after the \
                           workspace, and nothing beside it",
            },
        })
    };
    let [workspace] = &top.dirs[..] else {
        return Err(unexpected());
    };
    if !top.files.is_empty() || !top.symlinks.is_empty() {
        return Err(unexpected());
    }
    trees.walk(&workspace.name, &workspace.hash, workspace.size)
}

/// How many mappings the sandbox of `plan` has: the workspace, the
/// writable directories, and each input file, symlink and empty directory
/// (as its draft would count them).
fn mapping_count(plan: &Plan) -> usize {
    let ws = plan.walked.top.as_str();
    let inputs: usize = plan
        .walked
        .dirs
        .iter()
        .map(|(dir, entries)| match entries.len() {
            0 => usize::from(dir != ws),
            n => n - entries.dirs.len(),
        })
        .sum();
    1 + plan.writable.len() + inputs
}

/// Every directory from the workspace down to `path` (itself too if it
/// is a directory).
fn ancestors(path: &str, is_dir: bool) -> impl Iterator<Item = &str> {
    let end = if is_dir { Some(path) } else { None };
    path.match_indices('/')
        .map(move |(at, _)| &path[..at])
        .chain(end)
}

fn check_hash_function(name: &str) -> Result<(), String> {
    let normalized: String = name
        .chars()
        .filter(|c| *c != '-' && *c != '_')
        .collect::<String>()
        .to_ascii_uppercase();
    match normalized.as_str() {
        "SHA256" => Ok(()),
        _ => Err(format!(
            "hash function {name:?} is not supported (only SHA-256 is; run Bazel with \
             --digest_function=sha256)"
        )),
    }
}

fn error(message: String) -> sandbox::Error {
    sandbox::Error { message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sha256_is_accepted() {
        for ok in ["SHA-256", "sha256", "SHA256"] {
            assert!(check_hash_function(ok).is_ok(), "{ok}");
        }
        for bad in ["SHA-1", "BLAKE3", "", "MD5"] {
            let err = check_hash_function(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn ancestors_of_an_output() {
        let file: Vec<&str> = ancestors("ws/a/b/f", false).collect();
        assert_eq!(file, ["ws", "ws/a", "ws/a/b"]);
        let dir: Vec<&str> = ancestors("ws/a/d", true).collect();
        assert_eq!(dir, ["ws", "ws/a", "ws/a/d"]);
    }
}
