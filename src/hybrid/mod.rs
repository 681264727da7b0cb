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

use cutoff::Policy;

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use actionfs_protocol::{validate_sandbox_id, ResolvedMapping};
use parking_lot::Mutex;

use crate::access_log::AccessLog;
use crate::dirfd::Anchor;
use crate::file_kind::FileKind;
use crate::layout::{self, Entry};
use crate::materialize::{self, Materialized, Method, Options, Trash};
use crate::reconfig::{Backend, Refusal};
use crate::stats::{Built, Stats};
use crate::tree::{SandboxError, SandboxFs};

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

    fn claim<'a>(&'a self, id: &'a str) -> Result<InFlight<'a>, Refusal> {
        if !self.in_flight.lock().insert(id.to_owned()) {
            return Err(format!(
                "sandbox {id:?}: another request for it is being applied; try again"
            )
            .into());
        }
        Ok(InFlight { owner: self, id })
    }

    /// Builds sandbox `id` natively from `plan`, or hands the same plan to
    /// the FUSE view where the materializer cannot build it.
    fn create_native(
        &self,
        native: &NativeSandboxes,
        id: &str,
        plan: Entry,
    ) -> Result<(), SandboxError> {
        match native.create(id, &plan) {
            Ok(links) => {
                let shown = self.fs.create_sandbox_link(id, links, OsStr::new(id));
                if shown.is_err() {
                    if let Err(err) = native.destroy(id) {
                        log::error!("sandbox {id:?}: cannot undo a native build: {err}");
                    }
                }
                shown
            }
            Err(why) => {
                log::info!("sandbox {id:?}: served by FUSE, as it cannot be built natively: {why}");
                self.fs.create_planned(id, plan)
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
    fn create(&self, id: &str, mappings: &[ResolvedMapping]) -> Result<&'static str, Refusal> {
        validate_sandbox_id(id).map_err(SandboxError::InvalidId)?;
        let _claimed = self.claim(id)?;
        if self.fs.has_sandbox(id) {
            return Err(SandboxError::Exists(id.to_owned()).into());
        }
        // Planned once (one lstat per mapping), whichever backend builds it.
        let started = std::time::Instant::now();
        let plan =
            layout::plan(mappings, &self.fs.config().mount_point, Some(id)).map_err(|error| {
                SandboxError::Layout {
                    id: id.to_owned(),
                    error,
                }
            })?;
        let native = self
            .native
            .as_deref()
            .filter(|n| n.wants(id, &plan, mappings.len()));
        let built = match native {
            Some(native) => {
                self.create_native(native, id, plan)?;
                if native.is_native(id) {
                    Built::Native
                } else {
                    Built::FuseFallback
                }
            }
            None => {
                let planned = started.elapsed();
                self.fs.create_planned(id, plan)?;
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
        let _claimed = self.claim(id)?;
        if let Some(log) = &self.access_log {
            // Read before the tree goes; native sandboxes have nothing to say.
            if let Ok(inputs) = self.fs.accessed(id) {
                log.write(id, &inputs);
            }
        }
        self.fs.destroy_sandbox(id)?;
        if let Some(native) = &self.native {
            native.destroy(id)?;
        }
        Ok(())
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
    /// Each native sandbox's record and mapping count.
    live: Mutex<HashMap<String, (Materialized, usize)>>,
}

struct NativeDir {
    /// `links/ID` is the symlink the view shows as `MOUNT/ID`.
    links: Arc<Anchor>,
    trash: Trash,
}

impl NativeDir {
    /// Prepares `dir` (created if missing). Whatever an earlier daemon
    /// left there is thrown away.
    fn open(dir: &Path) -> Result<NativeDir, materialize::Error> {
        let trees = dir.join("trees");
        let links = dir.join("links");
        for sub in [&trees, &links] {
            std::fs::create_dir_all(sub).map_err(|e| materialize::Error::new("mkdir", sub, e))?;
        }
        let trash = Trash::open(&dir.join("trash"), 1)?;
        for stale in [&trees, &links] {
            let entries = std::fs::read_dir(stale)
                .map_err(|e| materialize::Error::new("opendir", stale, e))?;
            for entry in entries.flatten() {
                trash.discard(&entry.path())?;
            }
        }
        let links =
            Anchor::open(&links, None).map_err(|e| materialize::Error::new("open", &links, e))?;
        Ok(NativeDir {
            links: Arc::new(links),
            trash,
        })
    }
}

impl NativeSandboxes {
    /// Native sandboxes picked by `policy`, built in `dir` by `method`.
    pub fn new(dir: &Path, policy: Policy, method: Method) -> NativeSandboxes {
        NativeSandboxes {
            policy,
            method,
            dir: dir.to_owned(),
            trees: dir.join("trees"),
            opened: OnceLock::new(),
            live: Mutex::default(),
        }
    }

    /// Sets up the native directory now, for an error at start rather
    /// than a fallback later.
    pub fn open_now(&self) -> Result<(), materialize::Error> {
        let mut failed = None;
        self.open_once(|err| failed = Some(err));
        failed.map_or(Ok(()), Err)
    }

    fn native_dir(&self) -> Result<&NativeDir, materialize::Error> {
        self.open_once(|err| {
            log::warn!("native sandboxes are off, every sandbox is served by FUSE: {err}")
        })
        .ok_or_else(|| materialize::Error::other(&self.dir, "the native directory is unusable"))
    }

    /// The native directory, set up by the first call; a failure to set
    /// it up goes to that call's `on_error`, and is final.
    fn open_once(&self, on_error: impl FnOnce(materialize::Error)) -> Option<&NativeDir> {
        self.opened
            .get_or_init(|| NativeDir::open(&self.dir).map_err(on_error).ok())
            .as_ref()
    }

    /// Whether sandbox `id`, planned as `plan` from `mappings` mappings,
    /// should be built natively. Logged at debug level.
    pub fn wants(&self, id: &str, plan: &Entry, mappings: usize) -> bool {
        if self.policy.never_native() {
            return false;
        }
        let made_in = made_in(plan).unwrap_or(&self.trees);
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

    fn is_native(&self, id: &str) -> bool {
        self.live.lock().contains_key(id)
    }

    /// The mapping count of native sandbox `id`.
    fn mappings(&self, id: &str) -> Option<usize> {
        self.live.lock().get(id).map(|(_, count)| *count)
    }

    /// Builds sandbox `id` (a validated id, not yet in use) from `plan`,
    /// and the symlink `links/ID` to it; returns the `links` directory. On
    /// error nothing is left.
    fn create(&self, id: &str, plan: &Entry) -> Result<Arc<Anchor>, materialize::Error> {
        let dir = self.native_dir()?;
        let root = self.trees.join(id);
        let options = Options {
            method: self.method,
            threads: 0,
        };
        let built = materialize::materialize(plan, &root, options)?;
        let link = dir.links.path().join(id);
        if let Err(err) = std::os::unix::fs::symlink(&root, &link) {
            if let Err(cleanup) = materialize::teardown(&built, Some(&dir.trash)) {
                log::error!("sandbox {id:?}: cannot undo a native build: {cleanup}");
            }
            return Err(materialize::Error::new("symlink", &link, err));
        }
        self.live
            .lock()
            .insert(id.to_owned(), (built, plan.mapping_count()));
        Ok(dir.links.clone())
    }

    /// Removes native sandbox `id` (already gone from the view): what it
    /// made inside writable directories at once, its tree through the
    /// trash. Returns false if `id` is not native.
    pub fn destroy(&self, id: &str) -> Result<bool, materialize::Error> {
        let Some((built, _)) = self.live.lock().remove(id) else {
            return Ok(false);
        };
        let dir = self.native_dir()?;
        let link = dir.links.path().join(id);
        let unlinked =
            std::fs::remove_file(&link).map_err(|e| materialize::Error::new("unlink", &link, e));
        materialize::teardown(&built, Some(&dir.trash))?;
        unlinked.map(|()| true)
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
        if let Some(Some(dir)) = self.opened.get() {
            dir.trash.wait_idle();
        }
    }
}

/// Where a native build of `plan` makes most of its files: inside the
/// shallowest writable directory mapping with mappings nested below it
/// (Bazel's layout: the scratch directory holding every input), else
/// (`None`) in the native directory.
fn made_in(plan: &Entry) -> Option<&Path> {
    let mut level = vec![plan];
    while !level.is_empty() {
        for entry in &level {
            if let Some(mapped) = &entry.mapped {
                if mapped.writable && mapped.kind == FileKind::Directory {
                    return Some(&mapped.underlying);
                }
            }
        }
        level = level
            .iter()
            .flat_map(|entry| entry.children.values())
            .filter(|entry| !entry.children.is_empty())
            .collect();
    }
    None
}
