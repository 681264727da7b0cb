//! Where each input's content is for a Create: its tree walked (once per
//! digest), the store asked (once per tree while nothing comes or goes),
//! default places captured, and what is served pinned for the sandbox;
//! or which digests Bazel must push.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use super::Service;
use crate::sandbox::merkle::{Fault, InvalidDirectory, MissingDir, Trees, WalkError, Walked};
use crate::sandbox::store::{AcquireError, ContentStore, Lookup};
use crate::serve::error::{Error, ExecRootFault};
use crate::serve::kept::{InStore, Kept, StoreAnswers, TreeContent};

impl Service {
    /// Each file's content for sandbox `id` of tree `root`, pinned in the
    /// store: the entries a Create of the tree pinned before (`kept`) while
    /// each is still held, with no lookup or path per file; else what the
    /// store holds, after capturing what it lacks from default places
    /// (`None`: served at the default place).
    pub(super) fn content(
        &self,
        id: &str,
        root: &str,
        walked: &Walked,
        kept: Kept,
        exec_root: &Path,
    ) -> Result<InStore, Error> {
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
                            Some(refusal) if refusal.is_lasting() => {
                                return Err(Error::PushedContentRefused {
                                    input: Some(format!("{dir}/{}", file.name)),
                                    refusal: refusal.clone(),
                                })
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

    /// [`DefaultPlaces::capture`](crate::serve::capture::DefaultPlaces::capture)
    /// for tree `root`, and the lookups after.
    fn capture_default_places(
        &self,
        root: &str,
        walked: &Walked,
        found: Arc<StoreAnswers>,
        exec_root: &Path,
    ) -> Result<Arc<StoreAnswers>, Error> {
        if !self.default_places.any_to_capture(walked, &found) {
            return Ok(found);
        }
        self.check_default_places_readable(exec_root)?;
        let refused: HashSet<String> = self.refused.lock().keys().cloned().collect();
        let captured = self
            .default_places
            .capture(walked, &found, exec_root, &refused)?;
        Ok(match captured {
            true => self.lookups(root, walked, None),
            false => found,
        })
    }

    /// Default places are read below `exec_root`, which must be absolute
    /// and outside the mount (the daemon would read its own view) and the
    /// rest of the backend's own directory.
    fn check_default_places_readable(&self, exec_root: &Path) -> Result<(), Error> {
        let own = self.dirs.own();
        let fault = if !exec_root.is_absolute() {
            ExecRootFault::NotAbsolute
        } else if exec_root.starts_with(&self.dirs.mount) {
            ExecRootFault::InsideTheMount(self.dirs.mount.clone())
        } else if exec_root.starts_with(own) {
            ExecRootFault::InsideTheBackend(own.to_owned())
        } else {
            return Ok(());
        };
        Err(Error::DefaultPlacesUnreadable {
            exec_root: exec_root.to_owned(),
            fault,
        })
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
    ) -> Result<InStore, Error> {
        let wanted: Vec<_> = walked
            .files()
            .zip(found.iter())
            .filter(|(_, found)| **found == Lookup::Present)
            .map(|((_, file), _)| (file.digest, file.executable))
            .collect();
        let acquired = match self.store.acquire_tree(id, &wanted) {
            Ok(acquired) => acquired,
            Err(AcquireError::Missing(missing)) => return Err(self.missing(missing.hashes)),
            Err(AcquireError::Store(err)) => return Err(Error::Store(err)),
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
    pub(super) fn walk(
        &self,
        root: &str,
        size: i64,
        kept: Option<Arc<Walked>>,
    ) -> Result<Arc<Walked>, Error> {
        if let Some(walked) = kept {
            return Ok(walked);
        }
        let walked = match walk_workspace(&self.trees, root, size) {
            Ok(walked) => Arc::new(walked),
            Err(WalkError::Invalid(why)) => return Err(Error::Tree(why)),
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

    /// MissingContent for `hashes`, unless a Push brought an entry for
    /// one of them that pushing again cannot mend: then the reason.
    fn missing(&self, hashes: Vec<String>) -> Error {
        let refused = self.refused.lock();
        let lasting = hashes
            .iter()
            .find_map(|h| refused.get(h).filter(|refusal| refusal.is_lasting()));
        match lasting {
            Some(refusal) => Error::PushedContentRefused {
                input: None,
                refusal: refusal.clone(),
            },
            None => Error::MissingContent(hashes),
        }
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
