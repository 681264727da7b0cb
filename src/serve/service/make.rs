//! A checked Create made: its scratch directory, then the sandbox, built
//! natively or in the FUSE view by the core; on failure nothing is left.

use std::fs;
use std::sync::Arc;

use super::draft::{self, mapping_count, Holders};
use super::{Place, Plan, Service};
use crate::sandbox::backend::Backend;
use crate::sandbox::materialize::remove_tree;
use crate::sandbox::tree::{EmptyDirs, MerkleInputs};
use crate::serve::error::Error;
use crate::serve::outputs;

impl Service {
    /// Makes the scratch directory (a slot's may be there, empty) and the
    /// sandbox from a checked tree, at `place`.
    pub(super) fn make(&self, id: &str, place: &Place, plan: &Plan) -> Result<(), Error> {
        let scratch = &place.scratch;
        make_dir(scratch, place.reused)?;
        match self.make_in(place.core_name, plan, scratch, place.reused) {
            Ok(()) => Ok(()),
            Err(err) => {
                if let Err(left) = remove_tree(scratch) {
                    log::warn!("sandbox {id:?}: {left}");
                }
                Err(err)
            }
        }
    }

    /// Makes sandbox `id` (its name in the core) over `scratch`.
    fn make_in(
        &self,
        id: &str,
        plan: &Plan,
        scratch: &std::path::Path,
        reused: bool,
    ) -> Result<(), Error> {
        let ws_dir = scratch.join(&plan.walked.top);
        make_dir(&ws_dir, reused)?;
        outputs::prepare(scratch, &plan.walked.top, &plan.outs).map_err(Error::Output)?;
        let links = self.links.of(&plan.walked).map_err(Error::SymlinkTargets)?;
        let mappings = mapping_count(plan);
        // Natively, every input (the materializer needs them all). In
        // FUSE, directories off the outputs' paths are lazy, made into
        // nodes when the action first reaches them. Either way default
        // places are looked at (the draft's now, a lazy directory's when
        // it is made): one inside the mount would have the daemon look
        // into its own view.
        let native = !reused && !plan.fuse_only && self.core.builds_natively(id, &ws_dir, mappings);
        let mut lazy = Vec::new();
        let holders = Holders {
            scratch_ws: &ws_dir,
            links: &links,
            empty: &self.dirs.empty,
        };
        let looks = self.looks.batch();
        let draft = draft::draft(id, plan, &holders, &looks, (!native).then_some(&mut lazy))?;
        // A slot is a name in the view: never a native tree.
        if lazy.is_empty() && !plan.fuse_only && !reused {
            return self.core.create(id, draft).map(drop).map_err(Error::Core);
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
            .map_err(Error::Core)
    }
}

/// Makes directory `dir`; with `reused`, one there already will do.
fn make_dir(dir: &std::path::Path, reused: bool) -> Result<(), Error> {
    match fs::create_dir(dir) {
        Err(err) if reused && err.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        made => made.map_err(|err| Error::io("mkdir", dir, err)),
    }
}
