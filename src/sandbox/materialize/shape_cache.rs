//! Shapes of draft directories seen before, by fingerprint, so that a
//! build whose inputs mostly repeat an earlier one's builds the shape of
//! the few directories that differ and shares the rest.
//!
//! A directory's shape follows from its draft alone when every leaf below
//! it has a known type other than symlink (a symlink's target is read
//! from disk, which may change): then it is cached under a keyed 128-bit
//! hash of its names, leaves' types and underlying paths, and its
//! subdirectories' fingerprints. The keys are random per process, so no
//! input can be chosen to collide with another.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::sandbox::file_kind::FileKind;
use crate::sandbox::layout::Draft;

/// Directories kept beyond those a stash or a live sandbox still shares.
const MAX_CACHED: usize = 8192;

/// Shapes (`shape::Dir`, generic so that this module needs nothing of
/// the one that builds them) by fingerprint.
pub struct ShapeCache<Shape> {
    keys: [RandomState; 2],
    shapes: Mutex<HashMap<u128, Arc<Shape>>>,
}

impl<Shape> Default for ShapeCache<Shape> {
    fn default() -> ShapeCache<Shape> {
        ShapeCache {
            keys: [RandomState::new(), RandomState::new()],
            shapes: Mutex::default(),
        }
    }
}

impl<Shape> ShapeCache<Shape> {
    pub fn get(&self, key: u128) -> Option<Arc<Shape>> {
        self.shapes.lock().get(&key).cloned()
    }

    pub fn insert(&self, key: u128, dir: Arc<Shape>) {
        let mut shapes = self.shapes.lock();
        if shapes.len() >= MAX_CACHED {
            // Those only the cache holds go first; if that is not enough,
            // everything (what is shared stays alive where it is used).
            shapes.retain(|_, dir| Arc::strong_count(dir) > 1);
            if shapes.len() >= MAX_CACHED / 2 {
                shapes.clear();
            }
        }
        shapes.insert(key, dir);
    }

    fn hasher(&self) -> Fingerprinter {
        Fingerprinter(self.keys.each_ref().map(|key| key.build_hasher()))
    }
}

/// Two keyed hashers fed the same bytes: 128 bits.
struct Fingerprinter([std::hash::DefaultHasher; 2]);

impl Fingerprinter {
    fn bytes(&mut self, bytes: &[u8]) {
        for h in &mut self.0 {
            h.write_usize(bytes.len());
            h.write(bytes);
        }
    }

    /// `parts` as one string of bytes.
    fn joined(&mut self, parts: &[&[u8]]) {
        let len = parts.iter().map(|part| part.len()).sum();
        for h in &mut self.0 {
            h.write_usize(len);
            for part in parts {
                h.write(part);
            }
        }
    }

    fn u128(&mut self, value: u128) {
        for h in &mut self.0 {
            h.write_u128(value);
        }
    }

    fn finish(&self) -> u128 {
        (u128::from(self.0[0].finish()) << 64) | u128::from(self.0[1].finish())
    }
}

/// The fingerprint of each directory below one directory of a draft;
/// `None` for those whose shape does not follow from the draft.
pub struct Fingerprints(Vec<Option<u128>>);

impl Fingerprints {
    /// Of the directories below `at`: `at` itself is built every time.
    pub fn of<Shape>(draft: &Draft, at: u32, cache: &ShapeCache<Shape>) -> Fingerprints {
        let mut all = vec![None; draft.dirs.len()];
        for &(_, sub) in &draft.dirs[at as usize].subdirs {
            fingerprint(draft, sub, cache, &mut all);
        }
        Fingerprints(all)
    }

    pub fn get(&self, dir: u32) -> Option<u128> {
        self.0.get(dir as usize).copied().flatten()
    }
}

/// Fingerprints directory `at` after those below it, into `all`.
fn fingerprint<Shape>(draft: &Draft, at: u32, cache: &ShapeCache<Shape>, all: &mut [Option<u128>]) {
    let dir = &draft.dirs[at as usize];
    let mut whole = dir.mapped.is_none();
    for &(_, sub) in &dir.subdirs {
        fingerprint(draft, sub, cache, all);
        whole &= all[sub as usize].is_some();
    }
    if !whole {
        return;
    }
    let mut h = cache.hasher();
    for leaf in &dir.leaves {
        let kind = match leaf.kind {
            // Read from disk when the shape is built.
            None | Some(FileKind::Symlink) => return,
            Some(kind) => kind,
        };
        h.bytes(draft.name(leaf.name));
        h.bytes(&[kind as u8]);
        h.joined(&draft.leaf_underlying_parts(leaf));
    }
    // Leaves and subdirectories apart: a leaf and a directory of the same
    // name differ.
    h.bytes(b"/");
    for &(name, sub) in &dir.subdirs {
        h.bytes(draft.name(name));
        h.u128(all[sub as usize].expect("checked above"));
    }
    all[at as usize] = Some(h.finish());
}

#[cfg(test)]
mod tests {
    use super::super::shape::Dir;
    use super::*;
    use proptest::prelude::*;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    /// Input paths below the workspace, each with two underlying files
    /// (`f<i>-<variant>`); `l` is a symlink input.
    const PATHS: [&str; 8] = [
        "a/x", "a/y", "a/b/x", "a/b/z", "c/x", "d/e/f/x", "top", "c/l",
    ];

    struct Lab {
        dir: tempfile::TempDir,
    }

    impl Lab {
        fn new() -> Lab {
            let dir = tempfile::tempdir().unwrap();
            for i in 0..PATHS.len() {
                for variant in 0..2 {
                    let path = dir.path().join(format!("f{i}-{variant}"));
                    std::fs::write(&path, format!("{i} {variant}")).unwrap();
                }
            }
            std::os::unix::fs::symlink("target-0", dir.path().join("link")).unwrap();
            let scratch = dir.path().join("scratch");
            std::fs::create_dir(&scratch).unwrap();
            Lab { dir }
        }

        /// The draft serve makes of the inputs in `inputs` (a bit each),
        /// variant by bit of `variants`: types known, the link a symlink.
        fn draft(&self, inputs: u8, variants: u8) -> Draft {
            let base = self.dir.path();
            let mut draft = Draft::new(Some("s"));
            let scratch = base.join("scratch");
            draft.add(0, "/ws", scratch.as_os_str().as_bytes(), true);
            for (i, path) in PATHS.iter().enumerate() {
                if inputs & (1 << i) == 0 {
                    continue;
                }
                let sandbox_path = format!("/ws/{path}");
                if path.ends_with("/l") {
                    let link = base.join("link");
                    let (bytes, kind) = (link.as_os_str().as_bytes(), FileKind::Symlink);
                    draft.add_known(i + 1, &sandbox_path, bytes, false, kind);
                } else {
                    let file = base.join(format!("f{i}-{}", (variants >> i) & 1));
                    let bytes = file.as_os_str().as_bytes();
                    draft.add_known(i + 1, &sandbox_path, bytes, false, FileKind::RegularFile);
                }
            }
            draft.finish(Path::new("/nonexistent-mount")).unwrap()
        }
    }

    fn shape(draft: &Draft, cache: Option<&ShapeCache<Dir>>) -> Option<Dir> {
        Dir::of_draft(draft, draft.inputs_dir()?, cache)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

        /// Over a run of builds sharing one cache, each shape is the one
        /// built without it.
        #[test]
        fn shapes_from_the_cache_equal_shapes_built_afresh(
            builds in prop::collection::vec((any::<u8>(), any::<u8>()), 1..12),
        ) {
            let lab = Lab::new();
            let cache = ShapeCache::default();
            for (inputs, variants) in builds {
                let draft = lab.draft(inputs, variants);
                prop_assert_eq!(shape(&draft, Some(&cache)), shape(&draft, None));
            }
        }
    }

    #[test]
    fn the_cache_stays_bounded_and_keeps_what_is_still_shared() {
        let cache = ShapeCache::default();
        let kept = Arc::new(Dir::default());
        cache.insert(0, kept.clone());
        for key in 1..3 * MAX_CACHED as u128 {
            cache.insert(key, Arc::new(Dir::default()));
            assert!(cache.shapes.lock().len() <= MAX_CACHED);
        }
        // Only what the cache alone held went.
        assert!(cache.get(0).is_some_and(|dir| Arc::ptr_eq(&dir, &kept)));
    }

    #[test]
    fn a_directory_seen_before_is_shared_and_one_that_differs_is_not() {
        let lab = Lab::new();
        let cache = ShapeCache::default();
        // a/x, a/y, a/b/x, c/x.
        let first = shape(&lab.draft(0b0001_0111, 0), Some(&cache)).unwrap();
        // The same, but c/x's other variant.
        let second = shape(&lab.draft(0b0001_0111, 0b0001_0000), Some(&cache)).unwrap();
        let dir = |shape: &Dir, name: &str| match shape.get(name.as_ref()) {
            Some(crate::sandbox::materialize::shape::Node::Dir(dir)) => dir.clone(),
            other => panic!("{name}: {other:?}"),
        };
        assert!(Arc::ptr_eq(&dir(&first, "a"), &dir(&second, "a")));
        assert!(!Arc::ptr_eq(&dir(&first, "c"), &dir(&second, "c")));
        assert_ne!(dir(&first, "c"), dir(&second, "c"));
    }

    #[test]
    fn a_directory_holding_a_symlink_input_reads_its_target_at_each_build() {
        let lab = Lab::new();
        let cache = ShapeCache::default();
        // c/x and the link c/l.
        let inputs = 0b1001_0000;
        let before = shape(&lab.draft(inputs, 0), Some(&cache)).unwrap();
        let link = lab.dir.path().join("link");
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink("target-1", &link).unwrap();
        let after = shape(&lab.draft(inputs, 0), Some(&cache)).unwrap();
        assert_ne!(before, after);
        assert_eq!(Some(after), shape(&lab.draft(inputs, 0), None));
    }
}
