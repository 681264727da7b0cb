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

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use actionfs_protocol::{validate_sandbox_id, ResolvedMapping};
use parking_lot::Mutex;

use crate::dirfd::Anchor;
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
}

impl Sandboxes {
    pub fn new(
        fs: Arc<SandboxFs>,
        native: Option<Arc<NativeSandboxes>>,
        stats: Arc<Stats>,
    ) -> Sandboxes {
        Sandboxes { fs, native, stats }
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
            Ok(()) => {
                let shown = self
                    .fs
                    .create_sandbox_link(id, native.links.clone(), OsStr::new(id));
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

impl Backend for Sandboxes {
    fn create(&self, id: &str, mappings: &[ResolvedMapping]) -> Result<&'static str, Refusal> {
        validate_sandbox_id(id).map_err(SandboxError::InvalidId)?;
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
        let built = match self.native.as_deref().filter(|n| n.wants(mappings.len())) {
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
        self.fs.destroy_sandbox(id)?;
        if let Some(native) = &self.native {
            native.destroy(id)?;
        }
        Ok(())
    }
}

/// The natively built sandboxes and where they live.
pub struct NativeSandboxes {
    below: usize,
    method: Method,
    trees: PathBuf,
    /// `links/ID` is the symlink the view shows as `MOUNT/ID`.
    links: Arc<Anchor>,
    trash: Trash,
    live: Mutex<HashMap<String, Materialized>>,
}

impl NativeSandboxes {
    /// Prepares `dir` (created if missing) for native sandboxes of fewer
    /// than `below` mappings. Whatever an earlier daemon left there is
    /// thrown away.
    pub fn open(
        dir: &Path,
        below: usize,
        method: Method,
    ) -> Result<NativeSandboxes, materialize::Error> {
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
        Ok(NativeSandboxes {
            below,
            method,
            trees,
            links: Arc::new(links),
            trash,
            live: Mutex::default(),
        })
    }

    /// Whether a sandbox of `mappings` mappings should be built natively.
    pub fn wants(&self, mappings: usize) -> bool {
        mappings < self.below
    }

    fn is_native(&self, id: &str) -> bool {
        self.live.lock().contains_key(id)
    }

    /// Builds sandbox `id` (a validated id, not yet in use) from `plan`,
    /// and the symlink `links/ID` to it. On error nothing is left.
    fn create(&self, id: &str, plan: &Entry) -> Result<(), materialize::Error> {
        let root = self.trees.join(id);
        let options = Options {
            method: self.method,
            threads: 0,
        };
        let built = materialize::materialize(plan, &root, options)?;
        let link = self.links.path().join(id);
        if let Err(err) = std::os::unix::fs::symlink(&root, &link) {
            if let Err(cleanup) = materialize::teardown(&built, Some(&self.trash)) {
                log::error!("sandbox {id:?}: cannot undo a native build: {cleanup}");
            }
            return Err(materialize::Error::new("symlink", &link, err));
        }
        self.live.lock().insert(id.to_owned(), built);
        Ok(())
    }

    /// Removes native sandbox `id` (already gone from the view): what it
    /// made inside writable directories at once, its tree through the
    /// trash. Returns false if `id` is not native.
    pub fn destroy(&self, id: &str) -> Result<bool, materialize::Error> {
        let Some(built) = self.live.lock().remove(id) else {
            return Ok(false);
        };
        let link = self.links.path().join(id);
        let unlinked =
            std::fs::remove_file(&link).map_err(|e| materialize::Error::new("unlink", &link, e));
        materialize::teardown(&built, Some(&self.trash))?;
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
        self.trash.wait_idle();
    }
}
