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
use std::path::{Path, PathBuf};

use actionfs_protocol::ResolvedMapping;
use parking_lot::Mutex;

use crate::layout;
use crate::materialize::{self, Materialized, Method, Options, Trash};

/// How a CreateSandbox went on the native path.
pub enum NativeOutcome {
    /// Built; the view should show `link`.
    Built { link: PathBuf },
    /// The request itself is wrong: this is the answer, as FUSE would give.
    Rejected(String),
    /// Cannot be built natively; serve it with FUSE instead.
    Unsupported(String),
}

/// The natively built sandboxes and where they live.
pub struct NativeSandboxes {
    below: usize,
    method: Method,
    trees: PathBuf,
    links: PathBuf,
    trash: Trash,
    live: Mutex<HashMap<String, Materialized>>,
}

impl NativeSandboxes {
    /// Prepares `dir` (created if missing) for native sandboxes of fewer
    /// than `below` mappings. Whatever an earlier daemon left there is
    /// thrown away.
    pub fn open(dir: &Path, below: usize, method: Method) -> Result<NativeSandboxes, String> {
        let context = |what: &str, err: &dyn std::fmt::Display| {
            format!("native sandbox directory {dir:?}: {what}: {err}")
        };
        let trees = dir.join("trees");
        let links = dir.join("links");
        for sub in [&trees, &links] {
            std::fs::create_dir_all(sub).map_err(|e| context("mkdir", &e))?;
        }
        let trash = Trash::open(&dir.join("trash"), 1).map_err(|e| context("trash", &e))?;
        for stale in [&trees, &links] {
            let entries = std::fs::read_dir(stale).map_err(|e| context("opendir", &e))?;
            for entry in entries.flatten() {
                trash
                    .discard(&entry.path())
                    .map_err(|e| context("clearing a stale sandbox", &e))?;
            }
        }
        Ok(NativeSandboxes {
            below,
            method,
            trees,
            links,
            trash,
            live: Mutex::default(),
        })
    }

    /// Whether a sandbox of `mappings` mappings should be built natively.
    pub fn wants(&self, mappings: usize) -> bool {
        mappings < self.below
    }

    /// Builds sandbox `id` (a validated id, not yet in use) natively.
    /// `forbidden`: the mount point, which underlying paths may not enter.
    pub fn create(
        &self,
        id: &str,
        mappings: &[ResolvedMapping],
        forbidden: &Path,
    ) -> NativeOutcome {
        let plan = match layout::plan(mappings, forbidden) {
            Ok(plan) => plan,
            Err(problem) => return NativeOutcome::Rejected(format!("sandbox {id:?}: {problem}")),
        };
        let root = self.trees.join(id);
        let options = Options {
            method: self.method,
            threads: 0,
        };
        let built = match materialize::materialize(&plan, &root, options) {
            Ok(built) => built,
            Err(err) => return NativeOutcome::Unsupported(err.to_string()),
        };
        let link = self.links.join(id);
        if let Err(err) = std::os::unix::fs::symlink(&root, &link) {
            let problem = format!("symlink {link:?}: {err}");
            if let Err(cleanup) = materialize::teardown(&built, Some(&self.trash)) {
                log::error!("sandbox {id:?}: cannot undo a native build: {cleanup}");
            }
            return NativeOutcome::Unsupported(problem);
        }
        self.live.lock().insert(id.to_owned(), built);
        NativeOutcome::Built { link }
    }

    /// Removes native sandbox `id` (already gone from the view): what it
    /// made inside writable directories at once, its tree through the
    /// trash. Returns false if `id` is not native.
    pub fn destroy(&self, id: &str) -> Result<bool, String> {
        let Some(built) = self.live.lock().remove(id) else {
            return Ok(false);
        };
        let link = self.links.join(id);
        let unlinked = std::fs::remove_file(&link).map_err(|e| format!("unlink {link:?}: {e}"));
        materialize::teardown(&built, Some(&self.trash))
            .map_err(|e| format!("sandbox {id:?}: removing its native tree: {e}"))?;
        unlinked.map(|()| true)
    }

    /// Removes every native sandbox still there (at shutdown) and waits
    /// for the trash to empty.
    pub fn destroy_all(&self) {
        let ids: Vec<String> = self.live.lock().keys().cloned().collect();
        for id in ids {
            if let Err(err) = self.destroy(&id) {
                log::warn!("{err}");
            }
        }
        self.trash.wait_idle();
    }
}
