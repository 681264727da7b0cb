//! `actionfs serve`'s Create: trees becoming sandboxes of every shape
//! (deep, lazy FUSE directories, empty ones, writable dirs inside inputs),
//! the same through FUSE as natively, inputs opened with no message, what
//! the backend makes following its umask, exec roots it refuses, and
//! inputs read from their default places: captured once by digest, looked
//! at where they are, reached through symlink chains, refused when they
//! changed since Bazel hashed them.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use actionfs_protocol::backend::digest::digest_of;
use actionfs_protocol::backend::reapi;
use actionfs_protocol::backend::tree::{Tree, TreeBuilder};
use actionfs_testkit::backend::{assert_built_as, modes, Backend, WS};
use actionfs_testkit::serve::{state_dir_name, BACKEND_DIR_PREFIX};
use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::wait_for;

/// What the backend makes for an action follows the umask it was started
/// with, as Bazel's own directories would: the daemon runs with umask 0
/// (the kernel has masked the modes FUSE requests carry), which once
/// made the action's workspace and output directories, and the
/// directories Collect makes in Bazel's exec root, writable by everyone.
#[test]
fn what_the_backend_makes_follows_the_umask_it_started_with() {
    if !require(&[Need::Mount]) {
        return;
    }
    // The backend inherits the test's umask (read, not set: tests share it).
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let umask = status
        .lines()
        .find_map(|line| line.strip_prefix("Umask:"))
        .map(|mask| u32::from_str_radix(mask.trim(), 8).unwrap())
        .expect("Umask in /proc/self/status");
    let dir_mode = 0o777 & !umask;
    assert_ne!(
        dir_mode & 0o022,
        0o022,
        "umask {umask:o}: nothing to tell apart"
    );
    for (mode, option) in modes() {
        let b = Backend::start(&[option]);
        let input = b.write_input("src/a.txt", b"input\n");
        let tree = b.push_files([("ws/src/a.txt", input)]);
        let manifest = b.manifest(
            &tree,
            &[("/ws/out/deep/result", "file"), ("/ws/out/tree", "dir")],
        );
        let root = b.create_ok("1", manifest);
        let ws = root.join(WS);
        let mode_of = |path: &Path| {
            fs::metadata(path)
                .unwrap_or_else(|err| panic!("{mode}: stat {path:?}: {err}"))
                .permissions()
                .mode()
                & 0o7777
        };
        for dir in [
            &ws,
            &ws.join("out"),
            &ws.join("out/deep"),
            &ws.join("out/tree"),
        ] {
            assert_eq!(mode_of(dir), dir_mode, "{mode}: {dir:?} in the sandbox");
        }
        fs::write(ws.join("out/deep/result"), b"out\n").unwrap();
        let collected = b.collect_ok("1");
        for dir in [
            collected.clone(),
            collected.join(WS),
            collected.join("ws/out"),
            collected.join("ws/out/deep"),
        ] {
            assert_eq!(mode_of(&dir), dir_mode, "{mode}: {dir:?}, made by Collect");
        }
        b.destroy_ok("1");
        b.close();
    }
}

/// Every entry below `dir`, sorted by path, as an action sees it: its
/// type, and a file's bytes and x bit or a symlink's target. A native
/// sandbox's inputs are symlinks with absolute targets: followed.
fn describe_tree(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(at) = pending.pop() {
        for entry in fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            let mut meta = fs::symlink_metadata(&path).unwrap();
            let target = fs::read_link(&path).ok();
            if target.as_ref().is_some_and(|t| t.is_absolute()) {
                meta = fs::metadata(&path).unwrap();
            }
            let shown = path.strip_prefix(dir).unwrap().display().to_string();
            let what = if meta.file_type().is_symlink() {
                format!("symlink -> {}", target.unwrap().display())
            } else if meta.is_dir() {
                pending.push(path.clone());
                "dir".to_owned()
            } else {
                let x = meta.permissions().mode() & 0o111 != 0;
                format!(
                    "file x={x} {:?}",
                    String::from_utf8_lossy(&fs::read(&path).unwrap())
                )
            };
            found.push(format!("{shown}: {what}"));
        }
    }
    found.sort();
    found
}

#[test]
fn a_deep_tree_shows_the_same_through_fuse_as_natively() {
    if !require(&[Need::Mount]) {
        return;
    }
    // In FUSE, directories off the outputs' paths are made at first use:
    // nested ones, one holding only directories, empty ones inside them,
    // symlinks and both kinds of content inside them must all show as a
    // native sandbox shows them.
    let mut seen = Vec::new();
    for (mode, option) in modes() {
        let b = Backend::start(&[option]);
        let mut tb = TreeBuilder::new();
        for (n, path) in [
            "ws/lib/a.h",
            "ws/lib/deep/er/b.h",
            "ws/lib/deep/er/still/c.h",
            "ws/only/dirs/d.h",
            "ws/out/in.txt",
        ]
        .iter()
        .enumerate()
        {
            let digest = b.write_input(&path[WS.len() + 1..], format!("{path} {n}\n").as_bytes());
            tb.add_file(path, digest, false).unwrap();
        }
        let pushed = b"pushed into a lazy directory\n";
        b.push_inline(pushed);
        tb.add_file("ws/lib/deep/pushed.sh", digest_of(pushed), true)
            .unwrap();
        tb.add_symlink("ws/lib/deep/link", "../a.h").unwrap();
        tb.add_dir("ws/lib/deep/empty").unwrap();
        tb.add_dir("ws/lib/empty").unwrap();
        let tree = tb.build();
        b.push_tree(&tree);
        let root = b.create_ok("1", b.manifest(&tree, &[("/ws/out/o", "file")]));
        let ws = root.join(WS);
        assert_built_as(&b, mode, &root);
        // A name looked up before its directory was listed.
        assert_eq!(
            fs::read(ws.join("lib/deep/er/still/c.h")).unwrap(),
            b"ws/lib/deep/er/still/c.h 2\n",
            "{mode}"
        );
        assert_eq!(
            fs::symlink_metadata(ws.join("lib/nothing"))
                .unwrap_err()
                .kind(),
            std::io::ErrorKind::NotFound,
            "{mode}"
        );
        // Outputs land in the scratch directory below lazy ones' parent.
        fs::write(ws.join("out/o"), b"output\n").unwrap();
        let described = describe_tree(&ws);
        assert!(
            described.contains(&"lib/deep/link: symlink -> ../a.h".to_owned()),
            "{mode}: {described:#?}"
        );
        assert!(
            described.contains(
                &"lib/deep/pushed.sh: file x=true \"pushed into a lazy directory\\n\"".to_owned()
            ),
            "{mode}: {described:#?}"
        );
        seen.push((mode, described));
        b.destroy_ok("1");
        b.close();
    }
    assert_eq!(
        seen[0].1, seen[1].1,
        "{} and {} differ",
        seen[0].0, seen[1].0
    );
}

#[test]
fn a_writable_dir_inside_an_input_directory_is_its_host_directory() {
    if !require(&[Need::Mount]) {
        return;
    }
    for (mode, option) in modes() {
        let b = Backend::start(&[option]);
        let input = b.write_input("lib/a.h", b"input\n");
        let deep = b.write_input("lib/deeper/b.h", b"deeper\n");
        let tree = b.push_files([("ws/lib/a.h", input), ("ws/lib/deeper/b.h", deep)]);
        let host = b.root().join("host-tmp");
        fs::create_dir(&host).unwrap();
        let mut manifest = b.manifest(&tree, &[("/ws/out/o", "file")]);
        manifest
            .writable_dirs
            .insert("/ws/lib/tmp".into(), host.display().to_string());
        let root = b.create_ok("1", manifest);
        assert_built_as(&b, mode, &root);
        let ws = root.join(WS);
        assert_eq!(fs::read(ws.join("lib/a.h")).unwrap(), b"input\n", "{mode}");
        assert_eq!(
            fs::read(ws.join("lib/deeper/b.h")).unwrap(),
            b"deeper\n",
            "{mode}"
        );
        fs::write(ws.join("lib/tmp/made"), b"by the action\n").unwrap();
        assert_eq!(
            fs::read(host.join("made")).unwrap(),
            b"by the action\n",
            "{mode}"
        );
        b.destroy_ok("1");
        b.close();
    }
}

#[test]
fn an_exec_root_inside_the_backends_own_directory_is_refused() {
    if !require(&[Need::Mount]) {
        return;
    }
    for (mode, option) in modes() {
        let b = Backend::start(&[option]);
        let mut tb = TreeBuilder::new();
        tb.add_file("ws/lib/a.h", b.write_input("lib/a.h", b"a"), false)
            .unwrap();
        tb.add_file(
            "ws/lib/deeper/b.h",
            b.write_input("lib/deeper/b.h", b"b"),
            false,
        )
        .unwrap();
        let tree = tb.build();
        b.push_tree(&tree);
        let first = b.create_ok("1", b.manifest(&tree, &[("/ws/out/o", "file")]));
        assert_built_as(&b, mode, &first);
        // Default places below sandbox "1", inside the backend's own view,
        // for a file not captured yet (a tree's captured files are never
        // read there again).
        tb.add_file("ws/lib/c.h", b.write_input("lib/c.h", b"c"), false)
            .unwrap();
        let tree = tb.build();
        b.push_tree(&tree);
        let mut manifest = b.manifest(&tree, &[("/ws/out/o", "file")]);
        manifest.exec_root = first.display().to_string();
        let why = b.create_error("2", manifest);
        // A native sandbox is answered by its link in the backend's own
        // directory, beside the mount.
        let inside = match mode {
            "native" => "inside the backend's own directory",
            _ => "inside the mount point",
        };
        assert!(why.contains(inside), "{mode}: {why}");
        assert_eq!(why.matches("sandbox \"2\"").count(), 1, "{mode}: {why}");
        b.destroy_ok("1");
        b.close();
    }
}

#[test]
fn inputs_open_with_no_message_and_share_one_inode_per_digest() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&["--native_below=0"]);
    let bytes = b"int x;\n";
    let tree = b.push_files([("ws/h.h", digest_of(bytes))]);
    b.push_inline(bytes);
    let one = b.create_ok("one", b.manifest(&tree, &[]));
    let two = b.create_ok("two", b.manifest(&tree, &[]));
    // The first open of the mount is asked once (answered ENOSYS).
    assert_eq!(fs::read(one.join("ws/h.h")).unwrap(), bytes);
    let before = b.stats();
    for _ in 0..50 {
        assert_eq!(fs::read(one.join("ws/h.h")).unwrap(), bytes);
        assert_eq!(fs::read(two.join("ws/h.h")).unwrap(), bytes);
    }
    let after = b.stats();
    // Panics on a missing or renamed counter rather than reading it as 0.
    let count = actionfs_testkit::fuse_requests;
    assert_eq!(count(&after, "open") - count(&before, "open"), 0, "{after}");
    assert_eq!(count(&after, "release") - count(&before, "release"), 0);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        fs::metadata(one.join("ws/h.h")).unwrap().ino(),
        fs::metadata(two.join("ws/h.h")).unwrap().ino(),
        "one digest, one inode"
    );
    b.destroy_ok("one");
    b.destroy_ok("two");
    b.close();
}

/// A source tree reached from the exec root through a directory link, as
/// Bazel's exec root reaches a workspace's top-level directories, with
/// files that are themselves links.
fn symlinked_sources(b: &Backend) -> tempfile::TempDir {
    use std::os::unix::fs::symlink;
    let sources = tempfile::tempdir_in(b.root()).unwrap();
    let src = sources.path();
    fs::create_dir_all(src.join("in10")).unwrap();
    fs::create_dir_all(src.join("links")).unwrap();
    fs::write(src.join("in10/f3.txt"), b"file 3 of set 10\n").unwrap();
    fs::write(src.join("links/sibling.txt"), b"sibling\n").unwrap();
    symlink("../in10/f3.txt", src.join("links/rel_alias.txt")).unwrap();
    symlink("sibling.txt", src.join("links/chain_alias.txt")).unwrap();
    symlink("chain_alias.txt", src.join("links/chain2.txt")).unwrap();
    symlink(src.join("in10/f3.txt"), src.join("links/abs_alias.txt")).unwrap();
    symlink("../in10", src.join("links/dir_alias")).unwrap();
    for top in ["in10", "links"] {
        symlink(src.join(top), b.exec_root().join(WS).join(top)).unwrap();
    }
    sources
}

#[test]
fn sources_reached_through_symlink_chains_are_served_with_their_bytes() {
    if !require(&[Need::Mount]) {
        return;
    }
    let inputs: [(&str, &[u8]); 6] = [
        ("links/rel_alias.txt", b"file 3 of set 10\n"),
        ("links/chain_alias.txt", b"sibling\n"),
        ("links/chain2.txt", b"sibling\n"),
        ("links/abs_alias.txt", b"file 3 of set 10\n"),
        ("links/dir_alias/f3.txt", b"file 3 of set 10\n"),
        ("in10/f3.txt", b"file 3 of set 10\n"),
    ];
    // FUSE with the links' directory made lazily (no output there) and
    // made at the Create (an output below it), and native, each with the
    // default places captured into the store (the default) and looked at
    // where they are (--capture_below=0).
    let mut cases = Vec::new();
    for capture in ["--capture_below=1048576", "--capture_below=0"] {
        for (mode, option, output) in [
            ("fuse, lazy", "--native_below=0", "/ws/out/x"),
            (
                "fuse, made at create",
                "--native_below=0",
                "/ws/links/out/x",
            ),
            ("native", "--native_below=1000000000", "/ws/out/x"),
        ] {
            cases.push((mode, [option, capture], output));
        }
    }
    for (mode, options, output) in cases {
        let captured = options[1] != "--capture_below=0";
        let b = Backend::start(&options);
        fs::create_dir_all(b.exec_root().join(WS)).unwrap();
        let _sources = symlinked_sources(&b);
        let tree = b.push_files(
            inputs
                .iter()
                .map(|(path, bytes)| (format!("ws/{path}"), digest_of(bytes))),
        );
        let root = b.create_ok("1", b.manifest(&tree, &[(output, "file")]));
        for (path, bytes) in inputs {
            assert_built_as(&b, mode, &root);
            let shown = root.join(WS).join(path);
            assert_eq!(
                fs::read(&shown).unwrap_or_else(|err| panic!("{mode}: {path}: {err}")),
                bytes,
                "{mode}: {path}"
            );
            if mode == "native" {
                // A native input is a symlink, absolute, that leads to
                // the file wherever the sandbox is: the store's snapshot
                // of it, or the file the chain leads to.
                let target = fs::read_link(&shown).unwrap();
                assert!(target.is_absolute(), "{mode}: {path} -> {target:?}");
                if captured {
                    assert!(
                        target.starts_with(b.base())
                            && fs::symlink_metadata(&target).unwrap().is_file(),
                        "{mode}, captured: {path} -> {target:?}"
                    );
                } else {
                    // The file itself, not a path through the exec
                    // root's links: an open follows this one link only.
                    assert_eq!(
                        target,
                        fs::canonicalize(b.exec_root().join(WS).join(path)).unwrap(),
                        "{mode}: {path}"
                    );
                }
            } else {
                let meta = fs::symlink_metadata(&shown).unwrap();
                assert!(meta.is_file(), "{mode}: {path} is not a file");
            }
        }
        b.destroy_ok("1");
        b.close();
    }
}

#[test]
fn a_default_place_that_changed_since_bazel_hashed_it_is_refused() {
    if !require(&[Need::Mount]) {
        return;
    }
    // Captured (the default), every mode refuses at the Create, which
    // hashes what it copies; looked at (--capture_below=0), a lazy FUSE
    // directory refuses the file when it is first reached.
    let mut cases = Vec::new();
    for capture in ["--capture_below=1048576", "--capture_below=0"] {
        for (mode, option, output, made_at_create) in [
            ("fuse, lazy", "--native_below=0", "/ws/out/x", false),
            (
                "fuse, made at create",
                "--native_below=0",
                "/ws/src/x",
                true,
            ),
            ("native", "--native_below=1000000000", "/ws/out/x", true),
        ] {
            let at_create = made_at_create || capture != "--capture_below=0";
            cases.push((mode, [option, capture], output, at_create));
        }
    }
    for (mode, options, output, at_create) in cases {
        let b = Backend::start(&options);
        let hashed = b.write_input("src/a.txt", b"as hashed\n");
        let tree = b.push_files([("ws/src/a.txt", hashed)]);
        // Changed, through a link too: the chain's end is what counts.
        b.write_input("src/real.txt", b"other, longer bytes\n");
        fs::remove_file(b.exec_root().join("ws/src/a.txt")).unwrap();
        std::os::unix::fs::symlink("real.txt", b.exec_root().join("ws/src/a.txt")).unwrap();
        let manifest = b.manifest(&tree, &[(output, "file")]);
        if at_create {
            let why = b.create_error("1", manifest);
            assert!(
                why.contains("ws/src/a.txt") && why.contains("changed since Bazel hashed it"),
                "{mode}: {why}"
            );
        } else {
            let root = b.create_ok("1", manifest);
            let err = fs::read(root.join("ws/src/a.txt")).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EIO), "{mode}: {err}");
            assert!(
                b.log().contains("changed since Bazel hashed it"),
                "{mode}: {}",
                b.log()
            );
            b.destroy_ok("1");
        }
        b.close();
    }
}

/// A tree created before, its default places looked at (not captured):
/// a change between its Creates is refused at the next one, though the
/// backend remembers what it found while nothing changed there.
#[test]
fn a_default_place_changed_after_a_create_is_refused_at_the_next() {
    if !require(&[Need::Mount]) {
        return;
    }
    type Change = (&'static str, fn(&Backend));
    let changes: [Change; 3] = [
        ("grown in place", |b| {
            let path = b.exec_root().join("ws/src/a.txt");
            fs::OpenOptions::new()
                .append(true)
                .open(path)
                .unwrap()
                .write_all(b"more")
                .unwrap();
        }),
        ("replaced by a rename", |b| {
            let src = b.exec_root().join("ws/src");
            fs::write(src.join("new"), b"other bytes\n").unwrap();
            fs::rename(src.join("new"), src.join("a.txt")).unwrap();
        }),
        ("its directory moved, another in its place", |b| {
            let ws = b.exec_root().join("ws");
            fs::rename(ws.join("src"), ws.join("old")).unwrap();
            fs::create_dir(ws.join("src")).unwrap();
            fs::write(ws.join("src/a.txt"), b"x").unwrap();
        }),
    ];
    for (change, make) in changes {
        let b = Backend::start(&["--native_below=1000000000", "--capture_below=0"]);
        let hashed = b.write_input("src/a.txt", b"as hashed\n");
        let tree = b.push_files([("ws/src/a.txt", hashed)]);
        for id in ["1", "2"] {
            let root = b.create_ok(id, b.manifest(&tree, &[("/ws/out/x", "file")]));
            assert_eq!(fs::read(root.join("ws/src/a.txt")).unwrap(), b"as hashed\n");
            b.destroy_ok(id);
        }
        make(&b);
        let why = b.create_error("3", b.manifest(&tree, &[("/ws/out/x", "file")]));
        assert!(
            why.contains("ws/src/a.txt")
                && (why.contains("changed since Bazel hashed it") || why.contains("missing")),
            "{change}: {why}"
        );
        b.close();
    }
}

/// Default places are captured into the store once per digest, hashed
/// as they are copied: a change of the same size is caught (a look by
/// size alone would serve other bytes under the digest), a later Create
/// of the digest reads nothing of the build (the file may be gone), and
/// captured content the bound evicted is captured again rather than
/// asked of Bazel, which holds no bytes for a default place.
#[test]
fn default_places_are_captured_once_by_digest_and_checked_by_their_bytes() {
    if !require(&[Need::Mount]) {
        return;
    }
    for (mode, option) in modes() {
        let b = Backend::start(&[option, "--store_max_bytes=1500"]);
        let tree_of = |files: &[(&str, reapi::Digest)]| {
            b.push_files(
                files
                    .iter()
                    .map(|(path, digest)| (format!("ws/{path}"), digest.clone())),
            )
        };

        // Other bytes of the same size.
        let hashed = b.write_input("src/same.txt", b"as hashed\n");
        b.write_input("src/same.txt", b"AS HASHED\n");
        let tree = tree_of(&[("src/same.txt", hashed)]);
        let why = b.create_error("1", b.manifest(&tree, &[]));
        assert!(
            why.contains("ws/src/same.txt") && why.contains("changed since Bazel hashed it"),
            "{mode}: {why}"
        );

        // Captured at the first Create; the second needs no default place.
        let first = [b'a'; 1000];
        let digest = b.write_input("src/f.bin", &first);
        let tree = tree_of(&[("src/f.bin", digest)]);
        let root = b.create_ok("2", b.manifest(&tree, &[]));
        assert_built_as(&b, mode, &root);
        assert_eq!(
            fs::read(root.join("ws/src/f.bin")).unwrap(),
            first,
            "{mode}"
        );
        b.destroy_ok("2");
        fs::remove_file(b.exec_root().join("ws/src/f.bin")).unwrap();
        let root = b.create_ok("3", b.manifest(&tree, &[]));
        assert_eq!(
            fs::read(root.join("ws/src/f.bin")).unwrap(),
            first,
            "{mode}"
        );
        b.destroy_ok("3");

        // Evicted by the bound (1,500 bytes), captured again.
        b.write_input("src/f.bin", &first);
        b.push_inline(&[b'b'; 1000]);
        let root = b.create_ok("4", b.manifest(&tree, &[]));
        assert_eq!(
            fs::read(root.join("ws/src/f.bin")).unwrap(),
            first,
            "{mode}"
        );
        b.destroy_ok("4");
        b.close();
    }
}

/// A Create that meets more digests to capture than it captures itself
/// (64) serves them from their default places. It leaves to the
/// background only the digests met often: one met seven times is not
/// copied (a copy costs about what a dozen looks at its default place
/// do), one met an eighth time is, and the next Create of the tree is
/// served from the store, default places gone or not.
#[test]
fn many_digests_to_capture_are_captured_in_the_background_from_their_eighth_meeting() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&["--native_below=1000000000"]);
    // A tree of 100 new files below `dir`, and their digests.
    let tree_of = |dir: &str| {
        let mut hashes = Vec::new();
        let tree = b.push_files((0..100).map(|n| {
            let rel = format!("{dir}/f{n}");
            let digest = b.write_input(&rel, format!("{dir} {n}\n").as_bytes());
            hashes.push(digest.hash.clone());
            (format!("ws/{rel}"), digest)
        }));
        (tree, hashes)
    };
    // The store is in the state directory the backend claimed (or, were
    // it held, in the backend's own).
    let stored = || -> HashSet<String> {
        fs::read_dir(b.base())
            .unwrap()
            .flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with(BACKEND_DIR_PREFIX) || name == state_dir_name()
            })
            .filter_map(|e| fs::read_dir(e.path().join("store/c")).ok())
            .flat_map(|c| c.flatten())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    let all_stored = |hashes: &[String]| {
        let stored = stored();
        hashes.iter().all(|hash| stored.contains(hash))
    };
    let (once, once_hashes) = tree_of("once");
    let root = b.create_ok("1", b.manifest(&once, &[]));
    assert_built_as(&b, "native", &root);
    assert_eq!(
        fs::read_link(root.join("ws/once/f7")).unwrap(),
        b.exec_root().join("ws/once/f7"),
        "served where it is"
    );
    b.destroy_ok("1");

    let meet = |tree: &Tree, times: usize, id: &str| {
        for n in 0..times {
            b.create_ok(&format!("{id}-{n}"), b.manifest(tree, &[]));
            b.destroy_ok(&format!("{id}-{n}"));
        }
    };
    // A tree met seven times, then one met eight: the latter's digests are
    // queued at its eighth Create, behind whatever came before (one
    // thread, in order).
    let (seven, seven_hashes) = tree_of("seven");
    meet(&seven, 7, "seven");
    let (eight, eight_hashes) = tree_of("eight");
    meet(&eight, 8, "eight");
    assert!(
        wait_for(Duration::from_secs(20), || all_stored(&eight_hashes)),
        "captured: {}\n{}",
        stored().len(),
        b.log()
    );
    let stored_now = stored();
    for (met, hashes) in [("once", &once_hashes), ("seven times", &seven_hashes)] {
        let captured = hashes.iter().filter(|h| stored_now.contains(*h)).count();
        assert_eq!(captured, 0, "digests met {met} were captured");
    }

    // Met seven times more: captured, then served from the store.
    meet(&once, 7, "once");
    assert!(
        wait_for(Duration::from_secs(20), || all_stored(&once_hashes)),
        "captured: {}\n{}",
        stored().len(),
        b.log()
    );
    fs::remove_dir_all(b.exec_root().join("ws/once")).unwrap();
    let root = b.create_ok("5", b.manifest(&once, &[]));
    for n in [0, 7, 99] {
        let shown = root.join(format!("ws/once/f{n}"));
        assert!(fs::read_link(&shown).unwrap().starts_with(b.base()));
        assert_eq!(fs::read_to_string(&shown).unwrap(), format!("once {n}\n"));
    }
    b.destroy_ok("5");
    b.close();
}

/// Files of --capture_below bytes or more stay at their default place
/// (a native input links there), smaller ones are served from the store.
#[test]
fn files_at_or_above_capture_below_are_served_at_their_default_place() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&["--native_below=1000000000", "--capture_below=16"]);
    let small = b.write_input("small.txt", b"15 bytes, this\n");
    let large = b.write_input("large.txt", b"sixteen bytes!!\n");
    let tree = b.push_files([("ws/small.txt", small), ("ws/large.txt", large)]);
    let root = b.create_ok("1", b.manifest(&tree, &[]));
    assert_built_as(&b, "native", &root);
    let small_target = fs::read_link(root.join("ws/small.txt")).unwrap();
    assert!(small_target.starts_with(b.base()), "{small_target:?}");
    assert_eq!(
        fs::read_link(root.join("ws/large.txt")).unwrap(),
        b.exec_root().join("ws/large.txt")
    );
    assert_eq!(
        fs::read(root.join("ws/small.txt")).unwrap(),
        b"15 bytes, this\n"
    );
    assert_eq!(
        fs::read(root.join("ws/large.txt")).unwrap(),
        b"sixteen bytes!!\n"
    );
    b.destroy_ok("1");
    b.close();
}
