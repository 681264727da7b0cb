//! The input-root library (`actionfs::stage`) against a CAS in NativeLink's
//! filesystem-store layout, written here blob by blob: trees laid out by
//! each mechanism, REAPI's semantics (modes without a chmod, symlinks
//! verbatim and never followed, output parents), teardown, and every bad
//! input leaving nothing behind.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use actionfs::stage::{FuseRoots, Mechanism, MissingBlob, StageError, Staged, Stager};
use actionfs::stats::Op;
use actionfs_protocol::backend::digest::sha256_hex;
use actionfs_protocol::backend::reapi;
use actionfs_protocol::backend::tree::{Tree, TreeBuilder};
use actionfs_testkit::tier::{self, require, Need};
use actionfs_testkit::{is_mounted, LoopXfs};
use prost::Message;

/// A CAS directory (`content/d/<hash>-<size>`, blobs 0444, as NativeLink
/// writes them), a work directory for staged roots, and a stager.
struct Cas {
    _dir: tempfile::TempDir,
    content: PathBuf,
    work: PathBuf,
}

impl Cas {
    fn new() -> Cas {
        Cas::new_in(&std::env::temp_dir())
    }

    fn new_in(base: &Path) -> Cas {
        let dir = tempfile::tempdir_in(base).unwrap();
        let content = dir.path().join("content");
        fs::create_dir_all(content.join("d")).unwrap();
        let work = dir.path().join("work");
        fs::create_dir(&work).unwrap();
        Cas {
            content,
            work,
            _dir: dir,
        }
    }

    fn stager(&self, mechanism: Mechanism) -> Stager {
        Stager::open(&self.content, &self.work.join(".exec"), mechanism).unwrap()
    }

    /// A stager serving roots of `from_files` files or more from FUSE,
    /// its mount and scratch directories beside the work directory.
    fn fuse_stager(&self, from_files: usize) -> Stager {
        self.fuse_stager_and_roots(from_files).0
    }

    /// `fuse_stager`, and its mount (for its request counts).
    fn fuse_stager_and_roots(&self, from_files: usize) -> (Stager, std::sync::Arc<FuseRoots>) {
        let roots = std::sync::Arc::new(FuseRoots::open(&self.fuse_dir(), from_files).unwrap());
        let stager = self.stager(Mechanism::Hardlink).fuse_roots(roots.clone());
        (stager, roots)
    }

    fn fuse_dir(&self) -> PathBuf {
        self._dir.path().join("fuse")
    }

    fn recycling_stager(&self) -> Stager {
        self.stager(Mechanism::Hardlink)
            .recycling(&self.at(".spares"), 4)
            .unwrap()
    }

    fn put(&self, bytes: &[u8]) -> reapi::Digest {
        let digest = reapi::Digest {
            hash: sha256_hex(bytes),
            size_bytes: bytes.len() as i64,
        };
        let path = self.blob_path(&digest);
        if !path.exists() {
            fs::write(&path, bytes).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).unwrap();
        }
        digest
    }

    fn blob_path(&self, digest: &reapi::Digest) -> PathBuf {
        self.content
            .join("d")
            .join(format!("{}-{}", digest.hash, digest.size_bytes))
    }

    fn put_tree(&self, tree: &Tree) {
        for blob in tree.blobs.values() {
            self.put(blob);
        }
    }

    fn put_directory(&self, dir: &reapi::Directory) -> reapi::Digest {
        self.put(&dir.encode_to_vec())
    }

    fn at(&self, name: &str) -> PathBuf {
        self.work.join(name)
    }

    /// Every entry left in the work directory but the executable variants.
    fn leftovers(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&self.work)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name != ".exec")
            .collect();
        names.sort();
        names
    }
}

fn stage(stager: &Stager, tree: &Tree, at: &Path, outputs: &[&str]) -> Result<Staged, StageError> {
    stager.stage(&tree.root.hash, tree.root.size_bytes, at, outputs)
}

/// A tree with the kinds of node REAPI has: plain and executable files, a
/// shared file at two paths, symlinks (one leaving the root), an empty
/// directory.
fn sample_tree(cas: &Cas) -> Tree {
    let mut tree = TreeBuilder::new();
    let source = cas.put(b"int main() { return 0; }\n");
    let tool = cas.put(b"#!/bin/sh\necho tool\n");
    let header = cas.put(b"#pragma once\n");
    tree.add_file("src/main.c", source.clone(), false).unwrap();
    tree.add_file("src/lib/a.h", header.clone(), false).unwrap();
    tree.add_file("include/a.h", header, false).unwrap();
    tree.add_file("tools/tool.sh", tool, true).unwrap();
    tree.add_symlink("src/link", "main.c").unwrap();
    tree.add_symlink("escape", "../../../../etc/passwd")
        .unwrap();
    tree.add_dir("empty/deeper").unwrap();
    let tree = tree.build();
    cas.put_tree(&tree);
    tree
}

fn stage_sample(cas: &Cas, mechanism: Mechanism) {
    let tree = sample_tree(cas);
    let stager = cas.stager(mechanism);
    let at = cas.at("action");
    let staged = stage(
        &stager,
        &tree,
        &at,
        &["out/bin/prog", "out/gen/dir", "src/made.o"],
    )
    .unwrap();
    assert_eq!(staged.path(), at);
    assert_eq!(staged.files, 4);
    assert_eq!(
        fs::read(at.join("src/main.c")).unwrap(),
        b"int main() { return 0; }\n"
    );
    assert_eq!(fs::read(at.join("include/a.h")).unwrap(), b"#pragma once\n");
    assert_eq!(fs::read(at.join("src/lib/a.h")).unwrap(), b"#pragma once\n");
    let mode = |rel: &str| fs::symlink_metadata(at.join(rel)).unwrap().mode() & 0o7777;
    assert_eq!(mode("src/main.c"), 0o444);
    assert_eq!(mode("tools/tool.sh"), 0o555);
    let out = std::process::Command::new(at.join("tools/tool.sh"))
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"tool\n");
    // Symlinks hold their targets verbatim.
    assert_eq!(
        fs::read_link(at.join("src/link")).unwrap(),
        Path::new("main.c")
    );
    assert_eq!(
        fs::read_link(at.join("escape")).unwrap(),
        Path::new("../../../../etc/passwd")
    );
    assert!(at.join("empty/deeper").is_dir());
    // Output parents (not the outputs) are made, and writable.
    for dir in ["out/bin", "out/gen", "src"] {
        fs::write(at.join(dir).join("written"), b"x").unwrap();
    }
    assert!(!at.join("out/gen/dir").exists());
    assert!(!at.join("out/bin/prog").exists());
    stager.tear_down(staged).unwrap();
    assert!(!at.exists());
    assert!(cas.leftovers().is_empty(), "{:?}", cas.leftovers());
}

#[test]
fn a_tree_is_staged_by_hard_links() {
    let cas = Cas::new();
    stage_sample(&cas, Mechanism::Hardlink);
    // A plain file is the CAS blob itself; an executable is its 0555
    // variant, not the blob with its mode changed.
    let tree = sample_tree(&cas);
    let stager = cas.stager(Mechanism::Hardlink);
    let at = cas.at("again");
    let staged = stage(&stager, &tree, &at, &[]).unwrap();
    let blob = cas.blob_path(&reapi::Digest {
        hash: sha256_hex(b"int main() { return 0; }\n"),
        size_bytes: 25,
    });
    let ino = |p: &Path| fs::metadata(p).unwrap().ino();
    assert_eq!(ino(&at.join("src/main.c")), ino(&blob));
    let tool_blob = cas.blob_path(&reapi::Digest {
        hash: sha256_hex(b"#!/bin/sh\necho tool\n"),
        size_bytes: 20,
    });
    assert_ne!(ino(&at.join("tools/tool.sh")), ino(&tool_blob));
    assert_eq!(fs::metadata(&tool_blob).unwrap().mode() & 0o7777, 0o444);
    stager.tear_down(staged).unwrap();
}

#[test]
fn a_tree_is_staged_by_copies_and_by_auto() {
    for mechanism in [Mechanism::Copy, Mechanism::Auto] {
        let cas = Cas::new();
        stage_sample(&cas, mechanism);
    }
}

#[test]
fn a_tree_is_staged_by_reflinks_on_xfs() {
    if !require(&[Need::LoopDevice]) {
        return;
    }
    let xfs = match LoopXfs::new() {
        Ok(xfs) => xfs,
        Err(why) => {
            tier::skip(&format!("no reflink file system: {why}"));
            return;
        }
    };
    let cas = Cas::new_in(xfs.path().as_path());
    stage_sample(&cas, Mechanism::Clone);
}

#[test]
fn teardown_removes_what_the_action_made_read_only() {
    let cas = Cas::new();
    let tree = sample_tree(&cas);
    let stager = cas.stager(Mechanism::Auto);
    let at = cas.at("action");
    let staged = stage(&stager, &tree, &at, &["out/x"]).unwrap();
    fs::create_dir_all(at.join("out/deep/er")).unwrap();
    fs::write(at.join("out/deep/er/f"), b"x").unwrap();
    fs::set_permissions(at.join("out/deep/er"), fs::Permissions::from_mode(0o500)).unwrap();
    fs::set_permissions(at.join("out/deep"), fs::Permissions::from_mode(0o500)).unwrap();
    stager.tear_down(staged).unwrap();
    assert!(!at.exists());
    // The CAS is untouched by teardown.
    assert!(cas
        .blob_path(&reapi::Digest {
            hash: sha256_hex(b"#pragma once\n"),
            size_bytes: 13,
        })
        .exists());
}

#[test]
fn a_missing_file_blob_is_named_and_nothing_is_left() {
    let cas = Cas::new();
    let mut tree = TreeBuilder::new();
    let present = cas.put(b"here");
    let absent = reapi::Digest {
        hash: sha256_hex(b"never stored"),
        size_bytes: 12,
    };
    let absent_exec = reapi::Digest {
        hash: sha256_hex(b"never stored either"),
        size_bytes: 19,
    };
    tree.add_file("a/present", present, false).unwrap();
    tree.add_file("a/b/absent", absent.clone(), false).unwrap();
    tree.add_file("bin/absent", absent_exec.clone(), true)
        .unwrap();
    let tree = tree.build();
    cas.put_tree(&tree);
    for mechanism in [Mechanism::Hardlink, Mechanism::Copy] {
        let at = cas.at("action");
        let err = cas
            .stager(mechanism)
            .stage(&tree.root.hash, tree.root.size_bytes, &at, &[])
            .unwrap_err();
        let StageError::Missing(mut missing) = err else {
            panic!("{err}");
        };
        // Into an existing empty directory: it stays, empty.
        fs::create_dir(&at).unwrap();
        let again = cas
            .stager(mechanism)
            .stage(&tree.root.hash, tree.root.size_bytes, &at, &[])
            .unwrap_err();
        assert!(matches!(again, StageError::Missing(_)), "{again}");
        assert_eq!(fs::read_dir(&at).unwrap().count(), 0);
        fs::remove_dir(&at).unwrap();
        missing.sort_by(|a, b| a.path.cmp(&b.path));
        assert_eq!(
            missing,
            [
                MissingBlob {
                    what: "file",
                    hash: absent.hash.clone(),
                    size: 12,
                    path: "a/b/absent".into()
                },
                MissingBlob {
                    what: "file",
                    hash: absent_exec.hash.clone(),
                    size: 19,
                    path: "bin/absent".into()
                },
            ]
        );
        assert!(!at.exists());
        assert!(cas.leftovers().is_empty(), "{:?}", cas.leftovers());
    }
}

#[test]
fn a_missing_directory_blob_is_named_and_nothing_is_made() {
    let cas = Cas::new();
    let mut tree = TreeBuilder::new();
    tree.add_file("a/b/f", cas.put(b"f"), false).unwrap();
    tree.add_file("c/g", cas.put(b"g"), false).unwrap();
    let tree = tree.build();
    // Store every directory but the one of `a/b`.
    let b = {
        let mut sub = TreeBuilder::new();
        sub.add_file("f", cas.put(b"f"), false).unwrap();
        sub.build().root
    };
    for blob in tree.blobs.values() {
        if sha256_hex(blob) != b.hash {
            cas.put(blob);
        }
    }
    let at = cas.at("action");
    let err = cas
        .stager(Mechanism::Auto)
        .stage(&tree.root.hash, tree.root.size_bytes, &at, &[])
        .unwrap_err();
    let StageError::Missing(missing) = &err else {
        panic!("{err}");
    };
    assert_eq!(
        missing,
        &[MissingBlob {
            what: "directory",
            hash: b.hash.clone(),
            size: b.size_bytes,
            path: "a/b".into()
        }]
    );
    assert!(err.to_string().contains(&b.hash), "{err}");
    assert!(!at.exists());
    // The root itself missing.
    let err = cas
        .stager(Mechanism::Auto)
        .stage(&sha256_hex(b"nothing"), 7, &at, &[])
        .unwrap_err();
    assert!(matches!(err, StageError::Missing(_)), "{err}");
    assert!(!at.exists());
}

fn file_node(name: &str, digest: &reapi::Digest) -> reapi::FileNode {
    reapi::FileNode {
        name: name.into(),
        digest: Some(digest.clone()),
        ..Default::default()
    }
}

#[test]
fn bad_names_and_duplicates_are_refused_before_anything_is_made() {
    let cas = Cas::new();
    let content = cas.put(b"content");
    let sub = cas.put_directory(&reapi::Directory::default());
    let mut cases: Vec<(String, reapi::Directory)> = Vec::new();
    for bad in ["", ".", "..", "a/b", "/", "a\0b"] {
        cases.push((
            format!("file named {bad:?}"),
            reapi::Directory {
                files: vec![file_node(bad, &content)],
                ..Default::default()
            },
        ));
        cases.push((
            format!("directory named {bad:?}"),
            reapi::Directory {
                directories: vec![reapi::DirectoryNode {
                    name: bad.into(),
                    digest: Some(sub.clone()),
                }],
                ..Default::default()
            },
        ));
        cases.push((
            format!("symlink named {bad:?}"),
            reapi::Directory {
                symlinks: vec![reapi::SymlinkNode {
                    name: bad.into(),
                    target: "x".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
        ));
    }
    cases.push((
        "a name twice".into(),
        reapi::Directory {
            files: vec![file_node("same", &content)],
            directories: vec![reapi::DirectoryNode {
                name: "same".into(),
                digest: Some(sub.clone()),
            }],
            ..Default::default()
        },
    ));
    cases.push((
        "a digest that is not SHA-256".into(),
        reapi::Directory {
            files: vec![file_node(
                "f",
                &reapi::Digest {
                    hash: "ABC".into(),
                    size_bytes: 3,
                },
            )],
            ..Default::default()
        },
    ));
    for (what, dir) in cases {
        // Below a good directory, so that some of the tree would be made
        // if checking came late.
        let bad = cas.put_directory(&dir);
        let root = cas.put_directory(&reapi::Directory {
            files: vec![file_node("good", &content)],
            directories: vec![reapi::DirectoryNode {
                name: "sub".into(),
                digest: Some(bad),
            }],
            ..Default::default()
        });
        let at = cas.at("action");
        let err = cas
            .stager(Mechanism::Auto)
            .stage(&root.hash, root.size_bytes, &at, &[])
            .unwrap_err();
        assert!(matches!(err, StageError::Invalid(_)), "{what}: {err}");
        assert!(!at.exists(), "{what}: {at:?} was made");
    }
}

#[test]
fn a_symlink_leaving_the_root_is_made_never_followed() {
    let cas = Cas::new();
    let victim = cas.at("victim");
    fs::create_dir(&victim).unwrap();
    let mut tree = TreeBuilder::new();
    tree.add_symlink("out", victim.to_str().unwrap()).unwrap();
    tree.add_symlink("rel", "../victim").unwrap();
    tree.add_file("f", cas.put(b"f"), false).unwrap();
    let tree = tree.build();
    cas.put_tree(&tree);
    let stager = cas.stager(Mechanism::Auto);
    // An output below a symlink would make directories through it.
    for output in ["out/x/y", "rel/y", "f/y"] {
        let at = cas.at("action");
        let err = stage(&stager, &tree, &at, &[output]).unwrap_err();
        assert!(matches!(err, StageError::Invalid(_)), "{output}: {err}");
        assert!(!at.exists());
    }
    let at = cas.at("action");
    let staged = stage(&stager, &tree, &at, &["o/y"]).unwrap();
    assert_eq!(fs::read_link(at.join("out")).unwrap(), victim);
    assert_eq!(
        fs::read_link(at.join("rel")).unwrap(),
        Path::new("../victim")
    );
    assert_eq!(fs::read_dir(&victim).unwrap().count(), 0);
    stager.tear_down(staged).unwrap();
    // Teardown removed the links, not what they point to.
    assert!(victim.is_dir());
}

#[test]
fn bad_output_paths_and_destinations_are_refused() {
    let cas = Cas::new();
    let tree = sample_tree(&cas);
    let stager = cas.stager(Mechanism::Auto);
    let at = cas.at("action");
    for output in ["../x", "/abs/x", "a//b", "a/./b", "a/../b", ""] {
        let err = stage(&stager, &tree, &at, &[output]).unwrap_err();
        assert!(matches!(err, StageError::Invalid(_)), "{output:?}: {err}");
        assert!(!at.exists());
    }
    // A destination that is not an empty directory is refused and left
    // as it was.
    fs::create_dir(&at).unwrap();
    fs::write(at.join("mine"), b"x").unwrap();
    let err = stage(&stager, &tree, &at, &[]).unwrap_err();
    assert!(err.to_string().contains("not empty"), "{err}");
    assert_eq!(fs::read(at.join("mine")).unwrap(), b"x");
    let link = cas.at("link");
    std::os::unix::fs::symlink(cas.at("empty"), &link).unwrap();
    fs::create_dir(cas.at("empty")).unwrap();
    let err = stage(&stager, &tree, &link, &[]).unwrap_err();
    assert!(err.to_string().contains("open"), "{err}");
    assert_eq!(fs::read_dir(cas.at("empty")).unwrap().count(), 0);
    // A root digest that is not SHA-256.
    let err = stager
        .stage("not-hex", 1, &cas.at("other"), &[])
        .unwrap_err();
    assert!(matches!(err, StageError::Invalid(_)), "{err}");
}

#[test]
fn a_directory_blob_of_the_wrong_size_is_refused() {
    let cas = Cas::new();
    let dir = reapi::Directory {
        files: vec![file_node("f", &cas.put(b"f"))],
        ..Default::default()
    };
    let bytes = dir.encode_to_vec();
    let digest = cas.put(&bytes);
    // The same bytes under a name claiming another size.
    let lying = cas.content.join("d").join(format!("{}-{}", digest.hash, 1));
    fs::write(&lying, &bytes).unwrap();
    let at = cas.at("action");
    let err = cas
        .stager(Mechanism::Auto)
        .stage(&digest.hash, 1, &at, &[])
        .unwrap_err();
    assert!(err.to_string().contains("not the digest's 1"), "{err}");
    assert!(!at.exists());
}

#[test]
fn many_roots_of_one_tree_staged_at_once_share_checked_directories() {
    let cas = Cas::new();
    let tree = sample_tree(&cas);
    let stager = cas.stager(Mechanism::Hardlink);
    let staged: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (stager, tree, at) = (&stager, &tree, cas.at(&format!("a{i}")));
                s.spawn(move || stage(stager, tree, &at, &["out/f"]).unwrap())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for root in &staged {
        assert_eq!(
            fs::read(root.path().join("include/a.h")).unwrap(),
            b"#pragma once\n"
        );
        assert_eq!(
            fs::metadata(root.path().join("tools/tool.sh"))
                .unwrap()
                .mode()
                & 0o7777,
            0o555
        );
    }
    for root in staged {
        stager.tear_down(root).unwrap();
    }
    assert!(cas.leftovers().is_empty(), "{:?}", cas.leftovers());
}

// Recycling: torn-down roots made into the next roots by the difference.

/// Everything below `root` as `path: kind mode content-or-target`, sorted.
fn listing(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let meta = fs::symlink_metadata(&path).unwrap();
            let mode = meta.mode() & 0o7777;
            if meta.is_dir() {
                out.push(format!("{rel}: dir {mode:o}"));
                walk(root, &path, out);
            } else if meta.file_type().is_symlink() {
                out.push(format!(
                    "{rel}: link -> {}",
                    fs::read_link(&path).unwrap().display()
                ));
            } else {
                let bytes = String::from_utf8_lossy(&fs::read(&path).unwrap()).into_owned();
                out.push(format!("{rel}: file {mode:o} {bytes:?}"));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// A small deterministic generator (no crate needed for a test's dice).
struct Dice(u64);

impl Dice {
    fn roll(&mut self, sides: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % sides
    }
}

/// A random tree over a small alphabet of paths, so that two trees share
/// names with other kinds, contents, modes and targets.
fn random_tree(cas: &Cas, dice: &mut Dice) -> Tree {
    let mut tree = TreeBuilder::new();
    let names = ["a", "b", "c", "d"];
    for _ in 0..(4 + dice.roll(14)) {
        let depth = 1 + dice.roll(3) as usize;
        let path: Vec<&str> = (0..depth).map(|_| names[dice.roll(4) as usize]).collect();
        let path = path.join("/");
        let added = match dice.roll(5) {
            0 => tree.add_symlink(&path, ["a", "../b", "/etc"][dice.roll(3) as usize]),
            1 => tree.add_dir(&path),
            n => {
                let content = format!("content {}", dice.roll(3));
                tree.add_file(&path, cas.put(content.as_bytes()), n == 4)
            }
        };
        // A path through a file, or a name taken by another kind: the
        // builder refuses it, and the tree goes on without it.
        drop(added);
    }
    let tree = tree.build();
    cas.put_tree(&tree);
    tree
}

#[test]
fn recycled_roots_equal_fresh_ones_over_random_sequences_of_trees() {
    let cas = Cas::new();
    let fresh = cas.stager(Mechanism::Hardlink);
    let recycling = cas
        .stager(Mechanism::Hardlink)
        .recycling(&cas.at(".spares"), 2)
        .unwrap();
    let mut dice = Dice(7);
    let mut reused = 0;
    for round in 0..200 {
        let tree = random_tree(&cas, &mut dice);
        let expected = {
            let at = cas.at("expected");
            let staged =
                stage(&fresh, &tree, &at, &[]).unwrap_or_else(|err| panic!("round {round}: {err}"));
            let listed = listing(&at);
            fresh.tear_down(staged).unwrap();
            listed
        };
        let before = recycling.spare_count();
        let at = cas.at("action");
        let staged = stage(&recycling, &tree, &at, &[]).unwrap();
        if before > recycling.spare_count() {
            reused += 1;
        }
        assert_eq!(listing(&at), expected, "round {round}");
        // What an action leaves: outputs and a temporary file.
        fs::create_dir_all(at.join("out")).unwrap();
        fs::write(at.join("out/o"), b"output").unwrap();
        fs::write(at.join("tmp.partial"), b"junk").unwrap();
        recycling.tear_down(staged).unwrap();
        assert!(!at.exists());
    }
    assert!(
        reused >= 150,
        "only {reused} of 200 roots came from a spare"
    );
}

#[test]
fn a_root_the_action_changed_is_not_kept() {
    let cas = Cas::new();
    let tree = sample_tree(&cas);
    let stager = cas.recycling_stager();
    let expected = {
        let fresh = cas.stager(Mechanism::Hardlink);
        let staged = stage(&fresh, &tree, &cas.at("fresh"), &[]).unwrap();
        let listed = listing(staged.path());
        fresh.tear_down(staged).unwrap();
        listed
    };
    type Tamper = fn(&Path);
    let tampering: [(&str, Tamper); 6] = [
        ("an input deleted", |at| {
            fs::remove_file(at.join("src/main.c")).unwrap()
        }),
        ("an input replaced", |at| {
            fs::remove_file(at.join("include/a.h")).unwrap();
            fs::write(at.join("include/a.h"), b"#pragma once\n").unwrap();
        }),
        ("a directory's mode changed", |at| {
            fs::set_permissions(at.join("src/lib"), fs::Permissions::from_mode(0o700)).unwrap()
        }),
        ("a symlink retargeted", |at| {
            fs::remove_file(at.join("src/link")).unwrap();
            std::os::unix::fs::symlink("elsewhere", at.join("src/link")).unwrap();
        }),
        ("an empty directory removed", |at| {
            fs::remove_dir(at.join("empty/deeper")).unwrap()
        }),
        ("a file where a directory was", |at| {
            fs::remove_dir(at.join("empty/deeper")).unwrap();
            fs::write(at.join("empty/deeper"), b"").unwrap();
        }),
    ];
    for (what, tamper) in tampering {
        let at = cas.at("action");
        let staged = stage(&stager, &tree, &at, &[]).unwrap();
        assert_eq!(listing(&at), expected, "{what}: before");
        tamper(&at);
        let spares = stager.spare_count();
        stager.tear_down(staged).unwrap();
        assert!(!at.exists(), "{what}");
        assert!(
            stager.spare_count() <= spares,
            "{what}: the changed root was kept"
        );
    }
    // Untouched but for outputs: kept, and the next root is right.
    let at = cas.at("action");
    let staged = stage(&stager, &tree, &at, &["out/bin/x"]).unwrap();
    fs::write(at.join("out/bin/x"), b"output").unwrap();
    let spares = stager.spare_count();
    stager.tear_down(staged).unwrap();
    assert_eq!(stager.spare_count(), spares + 1);
    let staged = stage(&stager, &tree, &at, &[]).unwrap();
    assert_eq!(stager.spare_count(), spares);
    assert_eq!(listing(&at), expected);
    stager.tear_down(staged).unwrap();
}

#[test]
fn a_missing_blob_while_recycling_leaves_nothing() {
    let cas = Cas::new();
    let stager = cas.recycling_stager();
    let tree = sample_tree(&cas);
    let at = cas.at("action");
    let staged = stage(&stager, &tree, &at, &[]).unwrap();
    stager.tear_down(staged).unwrap();
    assert_eq!(stager.spare_count(), 1);
    let mut next = TreeBuilder::new();
    let absent = reapi::Digest {
        hash: sha256_hex(b"absent"),
        size_bytes: 6,
    };
    next.add_file("src/main.c", cas.put(b"int main() { return 0; }\n"), false)
        .unwrap();
    next.add_file("src/new/absent", absent.clone(), false)
        .unwrap();
    let next = next.build();
    cas.put_tree(&next);
    let err = stage(&stager, &next, &at, &[]).unwrap_err();
    let StageError::Missing(missing) = err else {
        panic!("{err}")
    };
    assert_eq!(missing.len(), 1);
    assert_eq!(missing[0].path, "src/new/absent");
    assert_eq!(missing[0].hash, absent.hash);
    assert!(!at.exists());
    // An empty directory as the destination (as NativeLink makes it)
    // stays one when the stage fails, and is used when it works.
    fs::create_dir(&at).unwrap();
    let err = stage(&stager, &next, &at, &[]).unwrap_err();
    assert!(matches!(err, StageError::Missing(_)), "{err}");
    assert_eq!(fs::read_dir(&at).unwrap().count(), 0);
    let staged = stage(&stager, &tree, &at, &[]).unwrap();
    stager.tear_down(staged).unwrap();
    assert_eq!(stager.spare_count(), 1);
    // A destination that is not empty is refused and the spare stays.
    fs::create_dir(&at).unwrap();
    fs::write(at.join("mine"), b"x").unwrap();
    let err = stage(&stager, &tree, &at, &[]).unwrap_err();
    assert!(err.to_string().contains("not empty"), "{err}");
    assert_eq!(stager.spare_count(), 1);
    assert_eq!(fs::read(at.join("mine")).unwrap(), b"x");
}

/// A file kept from a recycled root must be the blob the new tree names,
/// size and all: a tree naming a held hash with another size gets what
/// a fresh root gets (the blob missing), not the old bytes.
#[test]
fn a_recycled_root_keeps_a_file_only_if_its_size_is_the_one_named() {
    let cas = Cas::new();
    let stager = cas.recycling_stager();
    let bytes = b"ten bytes\n";
    let held = cas.put(bytes);
    let mut first = TreeBuilder::new();
    first.add_file("src/f", held.clone(), false).unwrap();
    first.add_file("src/g", cas.put(b"other\n"), false).unwrap();
    let first = first.build();
    cas.put_tree(&first);
    let at = cas.at("action");
    let staged = stage(&stager, &first, &at, &[]).unwrap();
    stager.tear_down(staged).unwrap();
    assert_eq!(stager.spare_count(), 1);
    let claimed = reapi::Digest {
        hash: held.hash.clone(),
        size_bytes: 20,
    };
    let mut next = TreeBuilder::new();
    next.add_file("src/f", claimed.clone(), false).unwrap();
    let next = next.build();
    cas.put_tree(&next);
    for (how, stager) in [
        ("fresh", cas.stager(Mechanism::Hardlink)),
        ("recycled", stager),
    ] {
        let err = stage(&stager, &next, &at, &[]).unwrap_err();
        let StageError::Missing(missing) = err else {
            panic!("{how}: {err}")
        };
        assert_eq!(
            (missing[0].path.as_str(), missing[0].size),
            ("src/f", 20),
            "{how}"
        );
        assert!(!at.exists(), "{how}");
    }
}

#[test]
fn two_threads_place_a_large_tree_and_report_missing_blobs_from_both() {
    let cas = Cas::new();
    let mut tree = TreeBuilder::new();
    for n in 0..400 {
        let path = format!("d{}/f{n}", n % 3);
        tree.add_file(&path, cas.put(format!("file {n}").as_bytes()), n % 7 == 0)
            .unwrap();
    }
    let complete = tree.clone().build();
    cas.put_tree(&complete);
    // Two more files whose blobs are absent, one in each half.
    for (n, path) in [(0, "d0/a-absent"), (1, "d2/z-absent")] {
        let absent = reapi::Digest {
            hash: sha256_hex(format!("absent {n}").as_bytes()),
            size_bytes: 8,
        };
        tree.add_file(path, absent, false).unwrap();
    }
    let incomplete = tree.build();
    cas.put_tree(&incomplete);
    let stager = cas.stager(Mechanism::Hardlink).threads(2);
    let at = cas.at("action");
    let staged = stage(&stager, &complete, &at, &[]).unwrap();
    assert_eq!(staged.files, 400);
    for n in [0, 7, 199, 200, 399] {
        let path = at.join(format!("d{}/f{n}", n % 3));
        assert_eq!(fs::read(&path).unwrap(), format!("file {n}").as_bytes());
        let mode = fs::metadata(&path).unwrap().mode() & 0o7777;
        assert_eq!(mode, if n % 7 == 0 { 0o555 } else { 0o444 }, "{n}");
    }
    stager.tear_down(staged).unwrap();
    let err = stage(&stager, &incomplete, &at, &[]).unwrap_err();
    let StageError::Missing(missing) = err else {
        panic!("{err}")
    };
    let mut paths: Vec<&str> = missing.iter().map(|m| m.path.as_str()).collect();
    paths.sort();
    assert_eq!(paths, ["d0/a-absent", "d2/z-absent"]);
    assert!(!at.exists());
}

#[test]
fn the_spare_sharing_the_most_subtrees_is_the_one_reused() {
    let cas = Cas::new();
    let stager = cas.recycling_stager();
    let tree_of = |tag: &str, changed: bool| {
        let mut tree = TreeBuilder::new();
        for dir in ["sdk", "lib", "app"] {
            for n in 0..20 {
                let last = changed && dir == "app" && n == 19;
                let content = format!("{tag} {dir} {n} {}", if last { "new" } else { "" });
                tree.add_file(&format!("{dir}/f{n}"), cas.put(content.as_bytes()), false)
                    .unwrap();
            }
        }
        let tree = tree.build();
        cas.put_tree(&tree);
        tree
    };
    let (similar, other, wanted) = (tree_of("b", false), tree_of("a", false), tree_of("b", true));
    // Kept in this order, so the last kept (the other tree) would be taken
    // if spares were chosen by age alone.
    let live: Vec<_> = [&similar, &other]
        .iter()
        .map(|tree| {
            let at = cas.at(&tree.root.hash[..8]);
            stage(&stager, tree, &at, &[]).unwrap()
        })
        .collect();
    for staged in live {
        stager.tear_down(staged).unwrap();
    }
    assert_eq!(stager.spare_count(), 2);
    let at = cas.at("action");
    let staged = stage(&stager, &wanted, &at, &[]).unwrap();
    assert_eq!(
        staged.files, 1,
        "made {} files, not just the changed one",
        staged.files
    );
    assert_eq!(fs::read(at.join("app/f19")).unwrap(), b"b app 19 new");
    assert_eq!(fs::read(at.join("sdk/f3")).unwrap(), b"b sdk 3 ");
    stager.tear_down(staged).unwrap();
}

#[test]
fn a_blob_the_cas_stored_again_does_not_stop_roots_being_kept() {
    let cas = Cas::new();
    let stager = cas.recycling_stager();
    let tree = sample_tree(&cas);
    let stage = |name: &str| stage(&stager, &tree, &cas.at(name), &[]).unwrap();
    let first = stage("first");
    stager.tear_down(first).unwrap();
    assert_eq!(stager.spare_count(), 1);
    // The CAS evicts a blob and stores it again: a new inode.
    let blob = cas.blob_path(&reapi::Digest {
        hash: sha256_hex(b"#pragma once\n"),
        size_bytes: 13,
    });
    fs::remove_file(&blob).unwrap();
    cas.put(b"#pragma once\n");
    let from_spare = stage("second");
    let fresh = stage("third");
    assert_eq!(stager.spare_count(), 0);
    stager.tear_down(fresh).unwrap();
    assert_eq!(
        stager.spare_count(),
        1,
        "a root linked to the new inode was not kept"
    );
    stager.tear_down(from_spare).unwrap();
}

// `actionfs stage-root`, the same library from the command line.

fn stage_root(cas: &Cas, digest: &str, dest: &Path, flags: &[&str]) -> std::process::Output {
    std::process::Command::new(actionfs_testkit::bin())
        .arg("stage-root")
        .args(flags)
        .arg("--cas")
        .arg(&cas.content)
        .args(["--digest", digest])
        .arg(dest)
        .output()
        .unwrap()
}

#[test]
fn stage_root_lays_out_a_root_from_the_command_line() {
    let cas = Cas::new();
    let tree = sample_tree(&cas);
    let dest = cas.at("by-hand");
    let digest = format!("{}/{}", tree.root.hash, tree.root.size_bytes);
    let out = stage_root(&cas, &digest, &dest, &["-v", "--output", "out/bin/x"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("4 files"));
    assert_eq!(
        fs::metadata(dest.join("tools/tool.sh")).unwrap().mode() & 0o7777,
        0o555
    );
    assert!(dest.join("out/bin").is_dir());
    // Nothing beside the root: the executable variants went with the run.
    assert_eq!(cas.leftovers(), ["by-hand"]);

    // A blob the CAS lacks: status 1, the digest named, nothing made.
    let mut missing = TreeBuilder::new();
    let absent = sha256_hex(b"absent");
    missing
        .add_file(
            "a/f",
            reapi::Digest {
                hash: absent.clone(),
                size_bytes: 6,
            },
            false,
        )
        .unwrap();
    let missing = missing.build();
    cas.put_tree(&missing);
    let dest = cas.at("missing");
    let digest = format!("{}/{}", missing.root.hash, missing.root.size_bytes);
    let out = stage_root(&cas, &digest, &dest, &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&absent) && stderr.contains("a/f"),
        "{stderr}"
    );
    assert!(!dest.exists());

    // A digest that is not HASH/SIZE: a usage error.
    let out = std::process::Command::new(actionfs_testkit::bin())
        .args([
            "stage-root",
            "--cas",
            "/nonexistent",
            "--digest",
            "abc",
            "/tmp/x",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HASH/SIZE"));
}

#[test]
fn empty_files_and_directories_need_no_blob_in_the_cas() {
    let cas = Cas::new();
    let empty = reapi::Digest {
        hash: sha256_hex(b""),
        size_bytes: 0,
    };
    let mut tree = TreeBuilder::new();
    tree.add_file("pkg/__init__.py", empty.clone(), false)
        .unwrap();
    tree.add_file("bin/true", empty.clone(), true).unwrap();
    tree.add_file("pkg/a.py", cas.put(b"a = 1\n"), false)
        .unwrap();
    tree.add_dir("pkg/empty").unwrap();
    let tree = tree.build();
    // Every directory but the empty one, which is the empty blob.
    for blob in tree.blobs.values().filter(|blob| !blob.is_empty()) {
        cas.put(blob);
    }
    assert!(!cas.blob_path(&empty).exists());
    let stager = cas.recycling_stager();
    let at = cas.at("action");
    for round in 0..2 {
        let staged = stage(&stager, &tree, &at, &[]).unwrap();
        assert_eq!(fs::read(at.join("pkg/__init__.py")).unwrap(), b"");
        let mode = |rel: &str| fs::metadata(at.join(rel)).unwrap().mode() & 0o7777;
        assert_eq!(mode("pkg/__init__.py"), 0o444);
        assert_eq!(mode("bin/true"), 0o555);
        assert!(at.join("pkg/empty").is_dir());
        stager.tear_down(staged).unwrap();
        // Empty files are links too, so the root is kept for reuse.
        assert_eq!(stager.spare_count(), 1, "round {round}");
    }
    // A size of 0 with another hash is a bad digest.
    let mut bad = TreeBuilder::new();
    bad.add_file(
        "f",
        reapi::Digest {
            hash: sha256_hex(b"not empty"),
            size_bytes: 0,
        },
        false,
    )
    .unwrap();
    let bad = bad.build();
    cas.put_tree(&bad);
    let err = stage(&stager, &bad, &cas.at("bad"), &[]).unwrap_err();
    assert!(matches!(err, StageError::Invalid(_)), "{err}");
    let err = stager
        .stage(&sha256_hex(b"x"), 0, &cas.at("bad"), &[])
        .unwrap_err();
    assert!(matches!(err, StageError::Invalid(_)), "{err}");
    assert!(!cas.at("bad").exists());
}

#[test]
fn an_executable_variant_left_short_is_made_again() {
    let cas = Cas::new();
    let tree = sample_tree(&cas);
    let first = cas.stager(Mechanism::Copy);
    let staged = stage(&first, &tree, &cas.at("first"), &[]).unwrap();
    first.tear_down(staged).unwrap();
    // As a crash could leave it: the variant there, but short.
    let tool = reapi::Digest {
        hash: sha256_hex(b"#!/bin/sh\necho tool\n"),
        size_bytes: 20,
    };
    let variant = cas
        .work
        .join(".exec")
        .join(format!("{}-{}", tool.hash, tool.size_bytes));
    fs::set_permissions(&variant, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(&variant, b"#!/bin/sh\n").unwrap();
    fs::set_permissions(&variant, fs::Permissions::from_mode(0o555)).unwrap();
    // A new stager (a new process) checks it before using it.
    let second = cas.stager(Mechanism::Copy);
    let at = cas.at("second");
    let staged = stage(&second, &tree, &at, &[]).unwrap();
    assert_eq!(
        fs::read(at.join("tools/tool.sh")).unwrap(),
        b"#!/bin/sh\necho tool\n"
    );
    second.tear_down(staged).unwrap();
}

// Roots served by the stager's FUSE mount.

/// What a FUSE root holds equals what a linked root of the same tree
/// holds (kinds, modes, bytes, symlink targets), for the sample tree and
/// random ones; outputs' parents and every directory are writable, and
/// teardown leaves nothing in the work directory, the scratch directory
/// or the mount.
#[test]
fn a_fuse_root_shows_what_a_linked_root_shows() {
    if !require(&[Need::Mount]) {
        return;
    }
    let cas = Cas::new();
    let linked = cas.stager(Mechanism::Hardlink);
    let fuse = cas.fuse_stager(0);
    let mut trees = vec![sample_tree(&cas)];
    let mut dice = Dice(7);
    trees.extend((0..6).map(|_| random_tree(&cas, &mut dice)));
    let outputs = ["out/bin/prog", "out/gen/dir", "src/made.o"];
    for (n, tree) in trees.iter().enumerate() {
        let (a, b) = (cas.at(&format!("linked{n}")), cas.at(&format!("fuse{n}")));
        fs::create_dir(&b).unwrap(); // as NativeLink makes it, empty
        let staged_a = stage(&linked, tree, &a, &outputs).unwrap();
        let staged_b = stage(&fuse, tree, &b, &outputs).unwrap();
        assert!(staged_b.is_fuse() && !staged_a.is_fuse());
        assert!(fs::symlink_metadata(&b).unwrap().file_type().is_symlink());
        assert_eq!(staged_b.files, staged_a.files, "tree {n}");
        assert_eq!(listing(&a), listing(&b), "tree {n}");
        // Every directory takes new entries, as a linked root's do.
        for dir in ["out/bin", "out/gen", "src", ""] {
            if a.join(dir).is_dir() {
                fs::write(b.join(dir).join("written"), b"x").unwrap();
                fs::create_dir(b.join(dir).join("made")).unwrap();
                assert_eq!(fs::read(b.join(dir).join("written")).unwrap(), b"x");
            }
        }
        linked.tear_down(staged_a).unwrap();
        fuse.tear_down(staged_b).unwrap();
        assert!(!b.exists());
    }
    assert!(cas.leftovers().is_empty(), "{:?}", cas.leftovers());
    let scratch: Vec<_> = fs::read_dir(cas.fuse_dir().join("scratch"))
        .unwrap()
        .collect();
    assert!(scratch.is_empty(), "{scratch:?}");
    let shown: Vec<_> = fs::read_dir(cas.fuse_dir().join("mnt")).unwrap().collect();
    assert!(shown.is_empty(), "{shown:?}");
}

/// Executables run from the mount, and a blob is one inode in every root
/// that holds it (one page cache), read with no message per open.
#[test]
fn fuse_roots_share_one_inode_per_blob_and_run_executables() {
    if !require(&[Need::Mount]) {
        return;
    }
    let cas = Cas::new();
    let (fuse, roots) = cas.fuse_stager_and_roots(0);
    let tree = sample_tree(&cas);
    let (a, b) = (cas.at("a"), cas.at("b"));
    let staged_a = stage(&fuse, &tree, &a, &[]).unwrap();
    let staged_b = stage(&fuse, &tree, &b, &[]).unwrap();
    // The mount's first open is asked once (answered ENOSYS); after it,
    // reading every blob of both roots again and again sends no OPEN or
    // RELEASE, and one READ per blob (one inode, one page cache).
    assert_eq!(
        fs::read(a.join("tools/tool.sh")).unwrap(),
        b"#!/bin/sh\necho tool\n"
    );
    let count = |op: Op| roots.stats().ops(op);
    let before = [Op::Open, Op::Release, Op::Read].map(count);
    for _ in 0..10 {
        for root in [&a, &b] {
            for file in ["src/main.c", "src/lib/a.h", "include/a.h"] {
                assert!(!fs::read(root.join(file)).unwrap().is_empty());
            }
        }
    }
    let sent = [Op::Open, Op::Release, Op::Read].map(count);
    assert_eq!(
        [sent[0] - before[0], sent[1] - before[1]],
        [0, 0],
        "OPEN and RELEASE sent for reads of blobs"
    );
    assert_eq!(
        sent[2] - before[2],
        2,
        "one READ per blob read (main.c, a.h)"
    );
    let ino = |path: PathBuf| fs::metadata(path).unwrap().ino();
    assert_eq!(ino(a.join("src/main.c")), ino(b.join("src/main.c")));
    assert_eq!(ino(a.join("include/a.h")), ino(b.join("src/lib/a.h")));
    assert_ne!(ino(a.join("src/main.c")), ino(a.join("include/a.h")));
    let out = std::process::Command::new(b.join("tools/tool.sh"))
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"tool\n");
    // Inputs are read-only, as linked blobs are.
    assert!(fs::write(a.join("src/main.c"), b"changed").is_err());
    assert_eq!(
        fs::read(b.join("src/main.c")).unwrap(),
        b"int main() { return 0; }\n"
    );
    fuse.tear_down(staged_a).unwrap();
    fuse.tear_down(staged_b).unwrap();
}

/// A blob the CAS lacks is named, and nothing of the root is left: not
/// at its path (an empty directory stays one), not in the mount.
#[test]
fn a_missing_blob_of_a_fuse_root_is_named_and_nothing_is_left() {
    if !require(&[Need::Mount]) {
        return;
    }
    let cas = Cas::new();
    let fuse = cas.fuse_stager(0);
    let mut tree = TreeBuilder::new();
    let here = cas.put(b"here");
    let absent = reapi::Digest {
        hash: sha256_hex(b"absent"),
        size_bytes: 6,
    };
    tree.add_file("a/here", here, false).unwrap();
    tree.add_file("a/b/absent", absent.clone(), true).unwrap();
    let tree = tree.build();
    cas.put_tree(&tree);
    let at = cas.at("action");
    fs::create_dir(&at).unwrap();
    match stage(&fuse, &tree, &at, &[]) {
        Err(StageError::Missing(missing)) => assert_eq!(
            missing,
            vec![MissingBlob {
                what: "file",
                hash: absent.hash.clone(),
                size: 6,
                path: "a/b/absent".into(),
            }]
        ),
        other => panic!("expected Missing, got {other:?}"),
    }
    assert!(at.is_dir() && fs::read_dir(&at).unwrap().next().is_none());
    assert_eq!(fs::read_dir(cas.fuse_dir().join("mnt")).unwrap().count(), 0);
    assert_eq!(
        fs::read_dir(cas.fuse_dir().join("scratch"))
            .unwrap()
            .count(),
        0
    );
    // Once the blob is there, the same tree stages.
    cas.put(b"absent");
    fs::remove_dir(&at).unwrap();
    let staged = stage(&fuse, &tree, &at, &[]).unwrap();
    assert_eq!(fs::read(at.join("a/b/absent")).unwrap(), b"absent");
    fuse.tear_down(staged).unwrap();
}

/// Roots below the cutoff are linked; dropping the stager unmounts.
#[test]
fn small_roots_are_linked_and_dropping_the_stager_unmounts() {
    if !require(&[Need::Mount]) {
        return;
    }
    let cas = Cas::new();
    let fuse = cas.fuse_stager(5);
    let mount_point = cas.fuse_dir().join("mnt");
    assert!(is_mounted(&mount_point));
    let small = sample_tree(&cas); // 4 files
    let at = cas.at("small");
    let staged = stage(&fuse, &small, &at, &[]).unwrap();
    assert!(!staged.is_fuse());
    assert!(fs::symlink_metadata(&at).unwrap().is_dir());
    fuse.tear_down(staged).unwrap();
    let mut tree = TreeBuilder::new();
    for n in 0..5 {
        tree.add_file(&format!("f{n}"), cas.put(format!("{n}").as_bytes()), false)
            .unwrap();
    }
    let large = tree.build();
    cas.put_tree(&large);
    let staged = stage(&fuse, &large, &cas.at("large"), &[]).unwrap();
    assert!(staged.is_fuse());
    fuse.tear_down(staged).unwrap();
    drop(fuse);
    assert!(!is_mounted(&mount_point));
}

/// A stager dropped while a process still works inside one of its roots
/// neither hangs nor leaves the mount behind: it is detached, and the
/// process keeps its working directory until it exits.
#[test]
fn dropping_the_stager_with_a_process_inside_detaches_the_mount() {
    if !require(&[Need::Mount]) {
        return;
    }
    let cas = Cas::new();
    let fuse = cas.fuse_stager(0);
    let mount_point = cas.fuse_dir().join("mnt");
    let tree = sample_tree(&cas);
    let at = cas.at("busy");
    let staged = stage(&fuse, &tree, &at, &[]).unwrap();
    let mut inside = std::process::Command::new("sh")
        .args(["-c", "read line; cat main.c"])
        .current_dir(at.join("src").canonicalize().unwrap())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(staged);
    drop(fuse);
    assert!(!is_mounted(&mount_point));
    // Its directory still serves it: the relative open goes through the
    // detached mount.
    drop(inside.stdin.take());
    let out = inside.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"int main() { return 0; }\n");
}

/// A worker killed while its FUSE roots are mounted (no destructor runs)
/// leaves no mount behind: a FUSE mount whose server died stays in the
/// mount table, failing every access, unless something unmounts it.
#[test]
fn a_killed_worker_leaves_no_mount_behind() {
    const CHILD: &str = "ACTIONFS_TEST_FUSE_ROOTS_IN";
    if let Some(dir) = std::env::var_os(CHILD) {
        // The worker: mounts, says so, and waits to be killed.
        let _roots = FuseRoots::open(Path::new(&dir), 0).unwrap();
        println!("mounted");
        std::thread::sleep(std::time::Duration::from_secs(60));
        return;
    }
    if !require(&[Need::Mount]) {
        return;
    }
    let cas = Cas::new();
    let mount_point = cas.fuse_dir().join("mnt");
    let mut worker = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_killed_worker_leaves_no_mount_behind",
            "--nocapture",
        ])
        .env(CHILD, cas.fuse_dir())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    let mut out = std::io::BufReader::new(worker.stdout.take().unwrap());
    while !said.contains("mounted") {
        said.clear();
        assert_ne!(
            std::io::BufRead::read_line(&mut out, &mut said).unwrap(),
            0,
            "the worker ended before mounting"
        );
    }
    assert!(is_mounted(&mount_point));
    worker.kill().unwrap(); // SIGKILL: nothing of the worker runs again
    worker.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while is_mounted(&mount_point) {
        assert!(
            std::time::Instant::now() < deadline,
            "{mount_point:?} is still mounted 10 s after its worker was killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
