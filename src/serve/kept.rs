//! What a Create keeps of a tree, by root digest, for the next Create of
//! the same tree: a tree seen again is the common case and has thousands
//! of files, so its walk, its store lookups and its acquired content are
//! each worked out once. One entry per root, read under one lock.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::sandbox::merkle::{FileEntry, Walked};
use crate::sandbox::store::{Acquired, ContentStore, Lookup};
use crate::sandbox::tree::FileContent;

/// What the store said of each file of a tree, and whether any answer
/// was other than Present (most often none is: then no pass per file).
pub struct StoreAnswers {
    pub each: Box<[Lookup]>,
    pub any_gone: bool,
    pub any_absent: bool,
}

impl StoreAnswers {
    pub fn new(each: Vec<Lookup>) -> StoreAnswers {
        StoreAnswers {
            any_gone: each.contains(&Lookup::Gone),
            any_absent: each.contains(&Lookup::Absent),
            each: each.into(),
        }
    }
}

/// A tree's content as acquired for a sandbox.
pub struct TreeContent {
    pub acquired: Acquired,
    pub in_store: InStore,
    /// Some default place was left to be captured later: the store may
    /// hold it now, so the tree's next Create looks again.
    pub awaits_capture: bool,
}

/// Per file of a tree, in `walked.files()` order: whether it is read from
/// the store (the file named by its hash in [`ContentStore::dir_of`]) or
/// from its default place. A byte a file: a tree of thousands of files
/// gets no path allocated per file for each sandbox made of it.
#[derive(Clone)]
pub struct InStore {
    pub each: Arc<[bool]>,
    store: Arc<ContentStore>,
}

impl InStore {
    pub fn new(each: Arc<[bool]>, store: Arc<ContentStore>) -> InStore {
        InStore { each, store }
    }

    /// Appends to `path` the store path of `file`, which must be held.
    pub fn push_path(&self, file: &FileEntry, path: &mut Vec<u8>) {
        use std::os::unix::ffi::OsStrExt;
        path.extend_from_slice(self.store.dir_of(file.executable).as_os_str().as_bytes());
        path.push(b'/');
        path.extend_from_slice(file.hash.as_bytes());
    }
}

impl FileContent for InStore {
    fn file_count(&self) -> usize {
        self.each.len()
    }

    fn path(&self, index: usize, file: &FileEntry) -> Option<PathBuf> {
        self.each[index].then(|| self.store.dir_of(file.executable).join(&*file.hash))
    }
}

/// What is kept of one tree. A digest's tree never changes, so its walk
/// holds for good; the lookups hold while the store's generation is the
/// one they were made at; the acquired content while the store can pin it
/// again as it was.
#[derive(Clone, Default)]
pub struct Kept {
    pub walked: Option<Arc<Walked>>,
    pub found: Option<(u64, Arc<StoreAnswers>)>,
    pub content: Option<Arc<TreeContent>>,
}

#[derive(Default)]
pub struct KeptTrees(Mutex<HashMap<Box<str>, Kept>>);

impl KeptTrees {
    /// Trees kept at most; past it the cache starts over.
    const MAX: usize = 4096;

    /// What is kept of tree `root` (nothing if it was not seen).
    pub fn get(&self, root: &str) -> Kept {
        self.0.lock().get(root).cloned().unwrap_or_default()
    }

    /// Keeps the walk of tree `root`.
    pub fn keep_walk(&self, root: &str, walked: Arc<Walked>) {
        self.update(root, |kept| kept.walked = Some(walked));
    }

    /// Keeps the store's lookups for tree `root`, made at `generation`.
    pub fn keep_found(&self, root: &str, generation: u64, found: Arc<StoreAnswers>) {
        self.update(root, |kept| kept.found = Some((generation, found)));
    }

    /// Keeps the content acquired for tree `root`.
    pub fn keep_content(&self, root: &str, content: Arc<TreeContent>) {
        self.update(root, |kept| kept.content = Some(content));
    }

    fn update(&self, root: &str, change: impl FnOnce(&mut Kept)) {
        let mut kept = self.0.lock();
        if let Some(entry) = kept.get_mut(root) {
            return change(entry);
        }
        if kept.len() >= Self::MAX {
            kept.clear();
        }
        change(kept.entry(root.into()).or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_kept_keeps_the_others_and_a_full_cache_starts_over() {
        let kept = KeptTrees::default();
        assert!(kept.get("a").walked.is_none());
        let mut walked = Walked::default();
        walked.top = "ws".into();
        kept.keep_walk("a", Arc::new(walked));
        kept.keep_found("a", 7, Arc::new(StoreAnswers::new(vec![Lookup::Present])));
        let a = kept.get("a");
        assert_eq!(a.walked.as_ref().map(|w| w.top.as_str()), Some("ws"));
        let (generation, found) = a.found.expect("lookups kept beside the walk");
        assert_eq!(generation, 7);
        assert!(!found.any_gone && !found.any_absent);
        assert!(kept.get("b").found.is_none(), "kept by root");

        for n in 1..KeptTrees::MAX {
            kept.keep_walk(&n.to_string(), Arc::default());
        }
        assert!(kept.get("a").walked.is_some(), "full, not past it");
        kept.keep_walk("one more", Arc::default());
        assert!(kept.get("a").walked.is_none(), "past it, started over");
        assert!(kept.get("one more").walked.is_some());
    }
}
