//! Native sandboxes built from stashes, checked against fresh builds of
//! the same requests: random create/destroy sequences with overlapping
//! inputs (proptest), a stash that changed, and a build that cannot go in.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use actionfs_protocol::ResolvedMapping;
use proptest::prelude::*;

use super::cutoff::Policy;
use super::{NativeSandboxes, REUSE_FROM};
use crate::sandbox::dirfd::DirFd;
use crate::sandbox::file_kind::FileKind;
use crate::sandbox::layout::{self, Draft, Entry};
use crate::sandbox::materialize::shape::{read_dir_shape, Dir};
use crate::sandbox::materialize::{self, reuse, Method, Options};
use crate::stats::Built;

/// Inputs an action may have, below the workspace: files in nested
/// directories, two inside the output directory Bazel makes beforehand,
/// and a symlink.
const INPUTS: [&str; 16] = [
    "a/f0",
    "a/f1",
    "a/f2",
    "a/f3",
    "a/b/f0",
    "a/b/f1",
    "a/b/f2",
    "c/f0",
    "c/f1",
    "out/g0",
    "out/g1",
    "d/e/f/deep",
    "top",
    "lnk",
    "c/d/f0",
    "a/b/c/f0",
];

const MOUNT: &str = "/nonexistent-mount";

/// Directories an action may write a file of its own into.
const WRITABLE_SPOTS: [&str; 5] = ["a", "a/b", "c", "out", "d/e/f"];

struct Lab {
    _base: tempfile::TempDir,
    base: PathBuf,
    sources: PathBuf,
    next_scratch: usize,
}

impl Lab {
    fn new() -> Lab {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            tempfile::tempdir_in(shm).unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        let sources = base.path().join("src");
        for (i, input) in INPUTS.iter().enumerate() {
            for variant in 0..2 {
                let path = sources.join(format!("{i}-{variant}"));
                fs::create_dir_all(path.parent().unwrap()).unwrap();
                if *input == "lnk" {
                    std::os::unix::fs::symlink(format!("a/f{variant}"), &path).unwrap();
                } else {
                    fs::write(&path, format!("{input} {variant}")).unwrap();
                }
            }
        }
        Lab {
            base: base.path().to_owned(),
            _base: base,
            sources,
            next_scratch: 0,
        }
    }

    /// A new scratch directory as Bazel makes it: BASE/N/scratch/out.
    fn scratch(&mut self) -> PathBuf {
        self.next_scratch += 1;
        let dir = self.base.join(format!("{}/scratch", self.next_scratch));
        fs::create_dir_all(dir.join("out")).unwrap();
        dir
    }

    /// The plan of the reference planner, for a fresh build to compare
    /// with.
    fn plan(&self, scratch: &Path, inputs: u16, variants: u16) -> Entry {
        layout::plan(
            &self.mappings(scratch, inputs, variants),
            Path::new(MOUNT),
            None,
        )
        .unwrap()
    }

    /// The finished draft a create hands the native sandboxes.
    fn draft(&self, scratch: &Path, inputs: u16, variants: u16) -> Draft {
        Draft::of(&self.mappings(scratch, inputs, variants), None)
            .finish(Path::new(MOUNT))
            .unwrap()
    }

    fn mappings(&self, scratch: &Path, inputs: u16, variants: u16) -> Vec<ResolvedMapping> {
        let mut mappings = vec![ResolvedMapping {
            path: "/ws".to_owned(),
            underlying: scratch.to_owned(),
            writable: true,
        }];
        for (i, input) in INPUTS.iter().enumerate() {
            if inputs & (1 << i) != 0 {
                let variant = (variants >> i) & 1;
                mappings.push(ResolvedMapping {
                    path: format!("/ws/{input}"),
                    underlying: self.sources.join(format!("{i}-{variant}")),
                    writable: false,
                });
            }
        }
        mappings
    }

    fn native(&self, stashes: usize) -> NativeSandboxes {
        NativeSandboxes::new(
            &self.base.join("native"),
            Policy::Below(usize::MAX),
            Method::Symlink,
            stashes,
        )
        .reusing_all()
    }
}

fn shape_of(dir: &Path) -> Option<Dir> {
    read_dir_shape(&DirFd::open(dir).unwrap()).unwrap()
}

/// What a fresh build of the same request makes in a scratch directory.
fn fresh_shape(lab: &mut Lab, inputs: u16, variants: u16) -> Option<Dir> {
    let scratch = lab.scratch();
    let plan = lab.plan(&scratch, inputs, variants);
    let dest = scratch.parent().unwrap().join("fresh-root");
    let options = Options {
        method: Method::Symlink,
        threads: 1,
    };
    let built = materialize::materialize(&plan, &dest, options).unwrap();
    let shape = shape_of(&scratch);
    materialize::teardown(&built, None).unwrap();
    shape
}

#[derive(Clone, Debug)]
enum Op {
    Create {
        slot: usize,
        inputs: u16,
        variants: u16,
    },
    Write {
        slot: usize,
        spot: usize,
    },
    /// The action replaces one of its inputs with a file of its own.
    Replace {
        slot: usize,
        input: usize,
    },
    Destroy {
        slot: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        // Input sets near one of three, mostly with the same targets, so
        // that stashes overlap a lot, but not always.
        3 => (0..3usize, 0..3usize, any::<[u16; 3]>(), 0..8u16).prop_map(
            |(slot, base, [r1, r2, r3], variants)| Op::Create {
                slot,
                inputs: [0xffff, 0x0fff, 0xf0f3][base] ^ (r1 & r2 & r3),
                variants: variants.saturating_sub(5) * 0x1111,
            }
        ),
        1 => (0..3usize, 0..WRITABLE_SPOTS.len()).prop_map(|(slot, spot)| Op::Write { slot, spot }),
        1 => (0..3usize, 0..INPUTS.len()).prop_map(|(slot, input)| Op::Replace { slot, input }),
        3 => (0..3usize).prop_map(|slot| Op::Destroy { slot }),
    ]
}

const STASHES: usize = 2;

/// Every mapped entry of `plan`: sandbox path, underlying path, writable,
/// type; sorted.
fn listing(plan: &Entry) -> Vec<(String, PathBuf, bool, FileKind)> {
    type Listed = (String, PathBuf, bool, FileKind);
    fn walk(entry: &Entry, path: &str, all: &mut Vec<Listed>) {
        if let Some(m) = &entry.mapped {
            all.push((path.to_owned(), m.underlying.clone(), m.writable, m.kind));
        }
        for (name, child) in &entry.children {
            walk(child, &format!("{path}/{}", name.to_string_lossy()), all);
        }
    }
    let mut all = Vec::new();
    walk(plan, "", &mut all);
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    /// A create reads its inputs' shape from the draft and types only what
    /// lies outside them; both agree with the reference planner's plan.
    #[test]
    fn a_drafts_shape_and_its_plan_outside_the_inputs_match_the_reference_plan(
        inputs in any::<u16>(),
        variants in any::<u16>(),
    ) {
        let mut lab = Lab::new();
        let scratch = lab.scratch();
        let draft = lab.draft(&scratch, inputs, variants);
        let plan = lab.plan(&scratch, inputs, variants);
        let at = draft.inputs_dir().unwrap();
        prop_assert_eq!(draft.dir_path(at), "/ws");
        let ws = &plan.children[std::ffi::OsStr::new("ws")];
        prop_assert_eq!(Dir::of_draft(&draft, at, None), Dir::of_plan(ws));
        prop_assert_eq!(listing(&draft.typed().unwrap()), listing(&plan));
        prop_assert_eq!(
            listing(&draft.typed_except(Some(at)).unwrap()),
            vec![("/ws".to_owned(), scratch.clone(), true, FileKind::Directory)]
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn sandboxes_from_stashes_equal_fresh_builds(ops in prop::collection::vec(op(), 1..24)) {
        let mut lab = Lab::new();
        let native = lab.native(STASHES);
        // slot -> (id, scratch)
        let mut live: HashMap<usize, (String, PathBuf)> = HashMap::new();
        let mut stray = 0;
        for (n, op) in ops.into_iter().enumerate() {
            match op {
                Op::Create { slot, inputs, variants } => {
                    if live.contains_key(&slot) {
                        continue;
                    }
                    let id = format!("s{n}");
                    let scratch = lab.scratch();
                    let draft = lab.draft(&scratch, inputs, variants);
                    let (_, built) = native.create(&id, &draft).unwrap();
                    prop_assert!(matches!(built, Built::Native | Built::Stash));
                    let made = shape_of(&scratch);
                    prop_assert!(made.is_some(), "a file of an action reached sandbox {}", id);
                    prop_assert_eq!(made, fresh_shape(&mut lab, inputs, variants));
                    // A build from a stash carries most stamps over: they
                    // are those a walk gives.
                    prop_assert_ne!(native.stamps_agree(&id), Some(false), "stamps of {}", id);
                    live.insert(slot, (id, scratch));
                }
                Op::Write { slot, spot } => {
                    if let Some((_, scratch)) = live.get(&slot) {
                        let dir = scratch.join(WRITABLE_SPOTS[spot]);
                        if dir.is_dir() {
                            stray += 1;
                            fs::write(dir.join(format!("stray{stray}")), "mine").unwrap();
                        }
                    }
                }
                Op::Replace { slot, input } => {
                    if let Some((_, scratch)) = live.get(&slot) {
                        let path = scratch.join(INPUTS[input]);
                        if path.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) {
                            fs::remove_file(&path).unwrap();
                            fs::write(&path, "replaced").unwrap();
                        }
                    }
                }
                Op::Destroy { slot } => {
                    let Some((id, scratch)) = live.remove(&slot) else {
                        continue;
                    };
                    prop_assert!(native.destroy(&id).unwrap());
                    // Only the action's files are left, none of the inputs.
                    for entry in walk(&scratch) {
                        let meta = entry.symlink_metadata().unwrap();
                        prop_assert!(!meta.file_type().is_symlink(), "{:?} left", entry);
                    }
                    let kept = native.stashes.as_ref().map_or(0, |s| s.kept());
                    prop_assert!(kept <= STASHES, "{} stashes kept", kept);
                    // The stamps a stash carried from its build are those
                    // it has.
                    let mut stamped = Vec::new();
                    native.stashes.as_ref().unwrap().each_kept(|stash| {
                        let now = reuse::stamp_tree(&stash.dir, &stash.path, &stash.shape).unwrap();
                        stamped.push(now.iter().all(|(rel, stamp)| stash.stamps.get(rel) == Some(stamp)));
                    });
                    prop_assert!(stamped.iter().all(|&same| same), "stamps differ");
                    // As Bazel does after moving the outputs.
                    fs::remove_dir_all(scratch.parent().unwrap()).unwrap();
                }
            }
        }
        native.destroy_all();
        prop_assert!(stash_dirs(&lab).is_empty());
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

/// The stash directories of the only pool, in the native directory.
fn stash_dirs(lab: &Lab) -> Vec<PathBuf> {
    let Ok(native) = fs::read_dir(lab.base.join("native")) else {
        return Vec::new();
    };
    native
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".actionfs-stashes")
        })
        .flat_map(|pool| fs::read_dir(pool.path()).unwrap().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("stash-")
        })
        .collect()
}

/// Builds and destroys a sandbox of every input, leaving one stash:
/// its directory.
fn stash_one(lab: &mut Lab, native: &NativeSandboxes) -> PathBuf {
    let first = lab.scratch();
    native
        .create("first", &lab.draft(&first, u16::MAX, 0))
        .unwrap();
    native.destroy("first").unwrap();
    let mut stashes = stash_dirs(lab);
    assert_eq!(stashes.len(), 1, "{stashes:?}");
    stashes.pop().unwrap()
}

#[test]
fn a_stash_that_changed_is_not_used() {
    let mut lab = Lab::new();
    let native = lab.native(STASHES);
    let all = u16::MAX;
    let stash = stash_one(&mut lab, &native);
    // Someone who got into the stash swaps an input.
    let swapped = stash.join("a/f1");
    fs::remove_file(&swapped).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", &swapped).unwrap();

    let second = lab.scratch();
    let (_, built) = native
        .create("second", &lab.draft(&second, all, 0))
        .unwrap();
    assert_eq!(built, Built::Native, "built afresh");
    assert_eq!(shape_of(&second), fresh_shape(&mut lab, all, 0));
    native.destroy_all();
}

#[test]
fn a_stash_that_cannot_go_in_leaves_nothing_behind() {
    let mut lab = Lab::new();
    let native = lab.native(STASHES);
    let all = u16::MAX;
    stash_one(&mut lab, &native);

    // A file of the owner's where an input directory would go: neither
    // the stash nor a fresh build can make the sandbox.
    let second = lab.scratch();
    fs::write(second.join("c"), "the owner's").unwrap();
    let before = walk(&second);
    let error = native
        .create("second", &lab.draft(&second, all, 0))
        .unwrap_err();
    assert!(error.to_string().contains("already exists"), "{error}");
    assert_eq!(walk(&second), before);
    assert!(!native.trees.join("second").exists());
    native.destroy_all();
    assert!(stash_dirs(&lab).is_empty());
}

#[test]
fn a_small_sandbox_is_built_afresh_and_not_stashed() {
    let mut lab = Lab::new();
    let mut native = lab.native(STASHES);
    native.reuse_from = REUSE_FROM;
    let all = u16::MAX;
    assert!(
        all.count_ones() as usize + 1 < REUSE_FROM,
        "the lab's trees are small"
    );
    for id in ["first", "second"] {
        let scratch = lab.scratch();
        let (_, built) = native.create(id, &lab.draft(&scratch, all, 0)).unwrap();
        assert_eq!(built, Built::Native, "{id}");
        assert_eq!(shape_of(&scratch), fresh_shape(&mut lab, all, 0));
        native.destroy(id).unwrap();
        assert!(stash_dirs(&lab).is_empty(), "{id} was stashed");
    }
    native.destroy_all();
}

#[test]
fn what_is_left_of_a_stash_leaves_with_the_sandbox_built_from_it() {
    // Discarding it wakes a deleting thread, which costs the Create that
    // does it; the sandbox's departure does it instead.
    let mut lab = Lab::new();
    let native = lab.native(STASHES);
    let all = u16::MAX;
    let stash = stash_one(&mut lab, &native);
    let second = lab.scratch();
    let (_, built) = native
        .create("second", &lab.draft(&second, all, 0))
        .unwrap();
    assert_eq!(built, Built::Stash);
    assert!(stash.is_dir(), "the stash's shell went with the create");
    native.destroy("second").unwrap();
    assert!(!stash.exists(), "the stash's shell outlived the departure");
    assert_eq!(stash_dirs(&lab).len(), 1, "the departed inputs are stashed");
    native.destroy_all();
    assert!(stash_dirs(&lab).is_empty());
}
