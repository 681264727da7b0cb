//! `actionfs serve --slots=on`: every sandbox in a reused root
//! (`MOUNT/slot-N`). What an action sees there is what it would see in a
//! new root: the tree it was given, never a previous sandbox's inputs,
//! outputs or scratch files, however much of them the kernel cached; and
//! what the kernel kept of the last tree is not asked again.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use actionfs_protocol::backend::digest::digest_of;
use actionfs_testkit::backend::{Backend, WS};
use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::{fuse_requests, names};

const SLOTS: &str = "--slots=on";

fn assert_absent(path: &Path, why: &str) {
    match fs::symlink_metadata(path) {
        Err(err) if err.kind() == ErrorKind::NotFound => {}
        other => panic!("{path:?} ({why}): expected ENOENT, got {other:?}"),
    }
}

/// The second sandbox in a slot shows its own tree: a changed input's new
/// bytes, a removed one gone, an added one there (where the first
/// sandbox's lookup left the kernel a negative entry), and none of what
/// the first action made: outputs, stray files in the workspace or in
/// an output directory, a directory of its own.
/// Each of those was looked up in the first sandbox, so the kernel had
/// them cached when the slot changed hands.
#[test]
fn a_slot_shows_the_next_tree_and_nothing_of_the_last_sandbox() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&[SLOTS]);
    let (one, two, kept) = (
        b"one\n".as_slice(),
        b"two\n".as_slice(),
        b"kept\n".as_slice(),
    );
    for bytes in [one, two, kept] {
        b.push_inline(bytes);
    }
    let first = b.push_files([
        ("ws/src/a.txt", digest_of(one)),
        ("ws/src/gone.txt", digest_of(kept)),
        ("ws/lib/kept.txt", digest_of(kept)),
    ]);
    let root = b.create_ok(
        "1",
        b.manifest(
            &first,
            &[("/ws/out/result", "file"), ("/ws/out/tree", "dir")],
        ),
    );
    assert_eq!(root, b.base().join(mount_of(&b)).join("slot-0"));
    let ws = root.join(WS);
    assert_eq!(fs::read(ws.join("src/a.txt")).unwrap(), one);
    assert_eq!(fs::read(ws.join("lib/kept.txt")).unwrap(), kept);
    assert_absent(&ws.join("src/b.txt"), "not in the first tree");
    fs::write(ws.join("out/result"), b"result\n").unwrap();
    fs::write(ws.join("out/tree/member"), b"member\n").unwrap();
    fs::write(ws.join("stray.txt"), b"scratch\n").unwrap();
    fs::write(ws.join("out/stray"), b"scratch\n").unwrap();
    fs::create_dir_all(ws.join("own/dir")).unwrap();
    fs::write(ws.join("own/dir/file"), b"scratch\n").unwrap();
    for made in ["stray.txt", "out/stray", "own/dir/file"] {
        assert!(ws.join(made).exists(), "{made}");
    }
    let collected = b.collect_ok("1");
    assert_eq!(
        fs::read(collected.join("ws/out/result")).unwrap(),
        b"result\n"
    );
    assert_eq!(
        fs::read(collected.join("ws/out/tree/member")).unwrap(),
        b"member\n"
    );
    b.destroy_ok("1");

    let second = b.push_files([
        ("ws/src/a.txt", digest_of(two)),
        ("ws/src/b.txt", digest_of(kept)),
        ("ws/lib/kept.txt", digest_of(kept)),
    ]);
    let again = b.create_ok(
        "2",
        b.manifest(
            &second,
            &[("/ws/out/result", "file"), ("/ws/other/o", "file")],
        ),
    );
    assert_eq!(again, root, "the slot, reused");
    assert_eq!(
        fs::read(ws.join("src/a.txt")).unwrap(),
        two,
        "changed input"
    );
    assert_eq!(fs::read(ws.join("src/b.txt")).unwrap(), kept, "added input");
    assert_eq!(fs::read(ws.join("lib/kept.txt")).unwrap(), kept);
    assert_absent(&ws.join("src/gone.txt"), "removed input");
    for made in ["stray.txt", "out/stray", "out/result", "out/tree", "own"] {
        assert_absent(&ws.join(made), "made by the last action");
    }
    assert_eq!(names(&ws), ["lib", "other", "out", "src"]);
    assert_eq!(names(&ws.join("src")), ["a.txt", "b.txt"]);
    assert!(names(&ws.join("out")).is_empty());
    assert!(names(&ws.join("other")).is_empty());
    fs::write(ws.join("other/o"), b"o\n").unwrap();
    let collected = b.collect_ok("2");
    assert_eq!(fs::read(collected.join("ws/other/o")).unwrap(), b"o\n");
    b.destroy_ok("2");
    b.close();
}

/// The mount's directory name below the base (the backend's own
/// directory, then `mnt`).
fn mount_of(b: &Backend) -> std::path::PathBuf {
    let own = fs::read_dir(b.base())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("mnt").is_dir())
        .expect("the backend's directory on the base");
    own.strip_prefix(b.base()).unwrap().join("mnt")
}

/// Sandboxes live at once take slots of their own; one destroyed is
/// taken again by the next Create (which waits for it to be emptied
/// rather than make a slot whose cache is cold), and a Create refused
/// leaves its slot free and empty.
#[test]
fn live_sandboxes_take_slots_of_their_own_and_a_freed_one_is_taken_again() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&[SLOTS]);
    let bytes = b"x\n";
    b.push_inline(bytes);
    let tree = b.push_files([("ws/x.txt", digest_of(bytes))]);
    let one = b.create_ok("1", b.manifest(&tree, &[("/ws/o", "file")]));
    let two = b.create_ok("2", b.manifest(&tree, &[("/ws/o", "file")]));
    assert_ne!(one, two);
    assert_eq!(
        [&one, &two].map(|p| p.file_name().unwrap().to_owned()),
        ["slot-0", "slot-1"].map(std::ffi::OsString::from)
    );
    fs::write(one.join("ws/o"), b"1\n").unwrap();
    fs::write(two.join("ws/o"), b"2\n").unwrap();
    assert_eq!(fs::read(one.join("ws/o")).unwrap(), b"1\n");
    b.destroy_ok("1");
    let missing = b.push_files([("ws/x.txt", digest_of(b"never pushed\n"))]);
    let refused = b.create_error("3", b.manifest(&missing, &[]));
    assert!(!refused.is_empty());
    let three = b.create_ok("4", b.manifest(&tree, &[("/ws/o", "file")]));
    assert_eq!(three, one, "the freed slot, after a refused Create");
    assert_absent(&three.join("ws/o"), "the last action's output");
    assert_eq!(
        fs::read(two.join("ws/o")).unwrap(),
        b"2\n",
        "its neighbour's"
    );
    b.destroy_ok("2");
    b.destroy_ok("4");
    b.close();
}

/// In a reused slot the kernel keeps what it looked up, names found
/// absent included (in the workspace and in output directories, which
/// are made again for the next action): reading the same inputs again
/// asks the daemon nothing; after a tree that differs in a few files,
/// only those are asked for.
#[test]
fn a_slot_asks_only_for_what_changed_since_its_last_tree() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&[SLOTS]);
    const FILES: usize = 64;
    const CHANGED: usize = 4;
    let file = |i: usize, round: usize| format!("file {i} of round {round}\n").into_bytes();
    let tree_of = |round: usize| {
        let files: Vec<(String, _)> = (0..FILES)
            .map(|i| {
                // Round 2 changes the first CHANGED files only.
                let bytes = file(i, if i < CHANGED { round } else { 0 });
                b.push_inline(&bytes);
                (format!("ws/in/d{}/f{i}", i % 4), digest_of(&bytes))
            })
            .collect();
        b.push_files(files)
    };
    // As a compiler does: every input read, and names looked for where
    // they are not (a header searched along the include path: the
    // workspace, an output directory made for the action).
    let read_all = |root: &Path, round: usize| {
        for i in 0..FILES {
            let expected = file(i, if i < CHANGED { round } else { 0 });
            let path = root.join(format!("ws/in/d{}/f{i}", i % 4));
            assert_eq!(fs::read(&path).unwrap(), expected, "{path:?}");
            for probed in ["ws", "ws/bazel-out/bin"] {
                assert_absent(&root.join(probed).join(format!("f{i}.h")), "searched");
            }
        }
    };
    let outputs = [("/ws/bazel-out/bin/o", "file")];
    let lookups = || fuse_requests(&b.stats(), "lookup");
    let first = tree_of(0);
    let root = b.create_ok("1", b.manifest(&first, &outputs));
    read_all(&root, 0);
    b.destroy_ok("1");

    let root = b.create_ok("2", b.manifest(&first, &outputs));
    let before = lookups();
    read_all(&root, 0);
    let asked = lookups() - before;
    // The slot's own name (expired at Destroy) is asked again, once.
    assert!(
        asked <= 1,
        "the same tree again: {asked} lookups\n{}",
        b.log()
    );
    b.destroy_ok("2");

    let changed = tree_of(2);
    let root = b.create_ok("3", b.manifest(&changed, &outputs));
    let before = lookups();
    read_all(&root, 2);
    let asked = lookups() - before;
    assert!(
        asked <= CHANGED as u64 + 1,
        "{CHANGED} of {FILES} files changed: {asked} lookups\n{}",
        b.log()
    );
    b.destroy_ok("3");
    b.close();
}
