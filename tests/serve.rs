//! `actionfs serve`: Bazel's sandbox backend protocol against a real
//! backend process, real mounts and real files. Each test starts one
//! backend with its own sandbox base, drives it with the typed client,
//! and checks that closing stdin leaves no mount and nothing on disk.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use actionfs_protocol::backend::digest::{digest_of, sha256_hex};
use actionfs_protocol::backend::reapi;
use actionfs_protocol::backend::sandbox::{
    self, collect, content, create, destroy, negotiate, Content, Manifest, Push, Retention,
};
use actionfs_protocol::backend::tree::{Tree, TreeBuilder};
use actionfs_testkit::backend::{assert_built_as, assert_nothing_left, inline, modes, Backend, WS};
use actionfs_testkit::serve::{ServeProcess, LOGGED};
use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::{bin, proc_state, transport, wait_for};
use prost::Message;

#[test]
fn a_tree_becomes_a_sandbox_whose_outputs_are_collected() {
    if !require(&[Need::Mount]) {
        return;
    }
    for (mode, option) in modes() {
        let b = Backend::start(&[option]);
        let from_exec_root = b.write_input("src/a.txt", b"default place\n");
        let pushed = b"pushed inline\n";
        let tool = b"#!/bin/sh\necho tool\n";
        let mut tb = TreeBuilder::new();
        tb.add_file("ws/src/a.txt", from_exec_root, false).unwrap();
        tb.add_file("ws/src/b.txt", digest_of(pushed), false)
            .unwrap();
        tb.add_file("ws/bin/tool", digest_of(tool), true).unwrap();
        tb.add_symlink("ws/src/link", "../../outside/target")
            .unwrap();
        tb.add_dir("ws/empty").unwrap();
        let tree = tb.build();
        b.client()
            .push(Push {
                blobs: tree.blobs.clone(),
                content: [
                    (sha256_hex(pushed), inline(pushed)),
                    (sha256_hex(tool), inline(tool)),
                ]
                .into(),
            })
            .unwrap();
        let manifest = b.manifest(
            &tree,
            &[("/ws/out/result", "file"), ("/ws/out/tree", "dir")],
        );
        let root = b.create_ok("1", manifest);
        let ws = root.join(WS);
        assert_built_as(&b, mode, &root);
        // A native tree is answered by a symlink outside the view:
        // reaching it crosses no FUSE (Bazel stats the root, then the
        // action walks into it), while the view still shows it as
        // MOUNT/ID.
        let in_view = b.base.join(b.dir_name()).join("mnt/1");
        if mode == "native" {
            let before = b.stats()["fuse"]["lookup"].as_u64();
            assert!(before.is_some(), "no FUSE lookup count");
            assert!(!root.starts_with(in_view.parent().unwrap()), "{root:?}");
            assert!(root.is_dir() && ws.join("src/a.txt").is_file());
            assert_eq!(b.stats()["fuse"]["lookup"].as_u64(), before, "{mode}");
            assert_eq!(
                fs::canonicalize(&in_view).unwrap(),
                fs::canonicalize(&root).unwrap()
            );
        } else {
            assert_eq!(root, in_view);
        }
        assert_eq!(
            fs::read(ws.join("src/a.txt")).unwrap(),
            b"default place\n",
            "{mode}"
        );
        assert_eq!(fs::read(ws.join("src/b.txt")).unwrap(), pushed, "{mode}");
        assert_eq!(
            fs::read_link(ws.join("src/link")).unwrap(),
            Path::new("../../outside/target"),
            "{mode}: a symlink node keeps its target verbatim"
        );
        let tool_mode = fs::metadata(ws.join("bin/tool"))
            .unwrap()
            .permissions()
            .mode();
        assert_ne!(tool_mode & 0o111, 0, "{mode}: executable lost its x bits");
        assert!(fs::read_dir(ws.join("empty")).unwrap().next().is_none());
        // The action: writes a file output and fills a directory output.
        let status = Command::new("/bin/sh")
            .arg("-c")
            .arg("cat src/a.txt src/b.txt > out/result && ./bin/tool > out/tree/t && chmod 555 out/result")
            .current_dir(&ws)
            .status()
            .unwrap();
        assert!(status.success(), "{mode}: the action failed\n{}", b.log());
        let collect_root = b.root.path().join("collected");
        match b
            .client()
            .collect("1", &collect_root.display().to_string())
            .unwrap()
            .outcome
        {
            Some(collect::result::Outcome::Ok(_)) => {}
            other => panic!("{mode}: collect: {other:?}"),
        }
        let result = collect_root.join("ws/out/result");
        assert_eq!(
            fs::read(&result).unwrap(),
            b"default place\npushed inline\n"
        );
        assert_eq!(
            fs::metadata(&result).unwrap().permissions().mode() & 0o777,
            0o555
        );
        assert_eq!(
            fs::read(collect_root.join("ws/out/tree/t")).unwrap(),
            b"tool\n"
        );
        b.destroy_ok("1");
        assert!(!root.exists(), "{mode}: the sandbox outlived its destroy");
        // Its scratch directory leaves after the answer (stashing and
        // deleting are off the Destroy's path), but the id is free at
        // once: a new sandbox of that id holds none of the old outputs.
        let again = b.create_ok("1", b.manifest(&tree, &[("/ws/out/result", "file")]));
        assert_eq!(again, root);
        assert_eq!(
            fs::read(again.join(WS).join("src/b.txt")).unwrap(),
            pushed,
            "{mode}"
        );
        assert!(
            !again.join(WS).join("out/result").exists(),
            "{mode}: the first sandbox's output is in the second"
        );
        b.destroy_ok("1");
        let scratch_dirs: Vec<PathBuf> = fs::read_dir(&b.base)
            .unwrap()
            .map(|serving| serving.unwrap().path().join("scratch"))
            .collect();
        assert!(
            scratch_dirs.iter().any(|dir| dir.is_dir()),
            "{scratch_dirs:?}"
        );
        for dir in &scratch_dirs {
            assert!(
                wait_for(Duration::from_secs(10), || !dir.join("1").exists()),
                "{mode}: {dir:?}/1 outlived its destroy"
            );
        }
        b.close();
    }
}

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

/// Collect runs outside the action's jail: an output directory the
/// action replaced with a symlink out of the sandbox is refused, never
/// followed, so nothing there is moved, copied or deleted (it was, with
/// the output's whole path resolved by the kernel). Natively and in FUSE,
/// collecting into the same file system (a rename) and into another (a
/// copy, then a removal).
#[test]
fn collect_never_follows_a_symlink_the_action_put_on_an_outputs_path() {
    if !require(&[Need::Mount]) {
        return;
    }
    let shm = Path::new("/dev/shm");
    for (mode, option) in modes() {
        for base_parent in [Path::new("/var/tmp"), shm] {
            if !base_parent.is_dir() {
                continue;
            }
            let b = Backend::start_on(base_parent, &[option]);
            let input = b.write_input("src/a.txt", b"input\n");
            let tree = b.push_files([("ws/src/a.txt", input)]);
            let manifest = b.manifest(
                &tree,
                &[("/ws/out/sub/f", "file"), ("/ws/out/sub/d", "dir")],
            );
            let root = b.create_ok("1", manifest);
            assert_built_as(&b, mode, &root);
            let outside = tempfile::tempdir_in("/var/tmp").unwrap();
            fs::create_dir_all(outside.path().join("sub/d")).unwrap();
            fs::write(outside.path().join("sub/f"), b"the user's\n").unwrap();
            fs::write(outside.path().join("sub/d/g"), b"also the user's\n").unwrap();
            // What the action does in its workspace.
            let out = root.join(WS).join("out");
            fs::remove_dir_all(&out).unwrap();
            std::os::unix::fs::symlink(outside.path(), &out).unwrap();

            let collected = b.root.path().join("collected");
            let answer = b
                .client()
                .collect("1", &collected.display().to_string())
                .unwrap()
                .outcome;
            let shown = format!("{mode}, base below {base_parent:?}");
            match answer {
                Some(collect::result::Outcome::Error(e)) => assert!(
                    e.message.contains("ws/out/sub/") && e.message.contains("symlink"),
                    "{shown}: {}",
                    e.message
                ),
                other => panic!("{shown}: collect answered {other:?}"),
            }
            assert_eq!(
                fs::read(outside.path().join("sub/f")).unwrap(),
                b"the user's\n",
                "{shown}"
            );
            assert_eq!(
                fs::read(outside.path().join("sub/d/g")).unwrap(),
                b"also the user's\n",
                "{shown}"
            );
            assert!(!collected.join("ws/out/sub/f").exists(), "{shown}");
            b.destroy_ok("1");
            assert!(
                outside.path().join("sub/f").exists(),
                "{shown}: after the destroy"
            );
            b.close();
        }
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
        let host = b.root.path().join("host-tmp");
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
fn content_pushed_after_a_create_serves_the_next_create_of_the_same_tree() {
    if !require(&[Need::Mount]) {
        return;
    }
    for (mode, option) in modes() {
        let b = Backend::start(&[option]);
        let original = b"the bytes of the digest\n";
        let digest = b.write_input("lib/a.h", original);
        let tree = b.push_files([("ws/lib/a.h", digest)]);
        let manifest = || b.manifest(&tree, &[("/ws/out/o", "file")]);
        let first = b.create_ok("1", manifest());
        assert_built_as(&b, mode, &first);
        assert_eq!(
            fs::read(first.join("ws/lib/a.h")).unwrap(),
            original,
            "{mode}"
        );
        b.destroy_ok("1");
        // The default place now holds other bytes, and the digest's own
        // bytes are pushed: the same tree must be served from the store.
        b.write_input("lib/a.h", b"rewritten\n");
        b.push_inline(original);
        let second = b.create_ok("2", manifest());
        assert_built_as(&b, mode, &second);
        assert_eq!(
            fs::read(second.join("ws/lib/a.h")).unwrap(),
            original,
            "{mode}: a tree seen before kept its lookups past a Push"
        );
        b.destroy_ok("2");
        b.close();
    }
}

#[test]
fn missing_content_is_named_then_pushed_then_the_create_succeeds() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&[]);
    let bytes = b"only pushed\n";
    let mut tb = TreeBuilder::new();
    tb.add_file("ws/f", digest_of(bytes), false).unwrap();
    tb.add_file("ws/sub/g", b.write_input("sub/g", b"g"), false)
        .unwrap();
    let tree = tb.build();
    let answer = b.client().create("1", b.manifest(&tree, &[])).unwrap();
    let Some(create::result::Outcome::MissingContent(missing)) = answer.outcome else {
        panic!("expected MissingContent, got {answer:?}");
    };
    assert_eq!(missing.digest_hashes, vec![tree.root.hash.clone()]);
    b.push_tree(&tree);
    b.push_inline(bytes);
    let root = b.create_ok("1", b.manifest(&tree, &[]));
    assert_eq!(fs::read(root.join("ws/f")).unwrap(), bytes);
    b.destroy_ok("1");
    b.close();
}

/// Rewriting a default-place input between sandboxes, or the location a
/// Push named once it was captured, never serves a digest with other
/// bytes; nor does a location whose bytes are not the digest's.
#[test]
fn a_digest_is_never_served_with_other_bytes() {
    if !require(&[Need::Mount]) {
        return;
    }
    for (mode, option) in modes() {
        let b = Backend::start(&[option]);
        let located = b.root.path().join("elsewhere.txt");
        fs::write(&located, b"captured\n").unwrap();
        let captured = digest_of(b"captured\n");
        let located_content = |path: &Path| Content {
            source: Some(content::Source::Location(path.display().to_string())),
            retention: Retention::Reuse as i32,
        };
        for round in 0..3 {
            let text = format!("version {round}\n");
            let digest = b.write_input("a.txt", text.as_bytes());
            let tree = b.push_files([("ws/a.txt", digest), ("ws/c.txt", captured.clone())]);
            if round == 0 {
                b.client()
                    .push(Push {
                        blobs: HashMap::new(),
                        content: [(captured.hash.clone(), located_content(&located))].into(),
                    })
                    .unwrap();
            }
            let id = format!("s{round}");
            let root = b.create_ok(&id, b.manifest(&tree, &[]));
            assert_built_as(&b, mode, &root);
            // The Push was applied before that Create was read. Bazel does
            // not promise the path keeps those bytes afterwards.
            fs::write(&located, format!("rewritten {round}\n")).unwrap();
            let read = fs::read_to_string(root.join("ws/a.txt"));
            assert_eq!(
                read.ok().as_deref(),
                Some(text.as_str()),
                "{mode} round {round}\n{}",
                b.log()
            );
            let read = fs::read(root.join("ws/c.txt"));
            assert_eq!(
                read.ok().as_deref(),
                Some(&b"captured\n"[..]),
                "{mode} round {round}\n{}",
                b.log()
            );
            b.destroy_ok(&id);
        }
        // A location that no longer holds the digest's bytes is refused,
        // and so is the Create that needs it (not read from elsewhere).
        let lie = digest_of(b"what the location held once\n");
        b.client()
            .push(Push {
                blobs: HashMap::new(),
                content: [(lie.hash.clone(), located_content(&located))].into(),
            })
            .unwrap();
        let tree = b.push_files([("ws/lie.txt", lie)]);
        let err = b.create_error("lie", b.manifest(&tree, &[]));
        assert!(err.contains("refused") && err.contains("lie.txt"), "{err}");
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

#[test]
fn bad_input_gets_an_error_and_the_backend_keeps_serving() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&[]);
    let good = {
        let mut tb = TreeBuilder::new();
        tb.add_file("ws/f", b.write_input("f", b"f"), false)
            .unwrap();
        tb.build()
    };
    b.push_tree(&good);

    // A directory blob whose bytes do not hash to its key.
    let wrong = reapi::Directory {
        files: vec![],
        directories: vec![reapi::DirectoryNode {
            name: "ws".into(),
            digest: Some(good.root.clone()),
        }],
        symlinks: vec![],
        node_properties: None,
    };
    let lying_hash = sha256_hex(b"not these bytes");
    b.client()
        .push(Push {
            blobs: [(lying_hash.clone(), wrong.encode_to_vec())].into(),
            content: HashMap::new(),
        })
        .unwrap();
    let mut lying = b.manifest(&good, &[]);
    lying.input_root_digest = Some(reapi::Digest {
        hash: lying_hash,
        size_bytes: 1,
    });
    let err = b.create_error("lying", lying);
    assert!(err.contains("hash"), "{err}");

    // Entry names that are not one path component, or repeat.
    let file = |name: &str| reapi::FileNode {
        name: name.into(),
        digest: Some(digest_of(b"f")),
        is_executable: false,
        node_properties: None,
    };
    for (what, files) in [
        ("empty", vec![file("")]),
        ("dot", vec![file(".")]),
        ("dotdot", vec![file("..")]),
        ("slash", vec![file("a/b")]),
        ("nul", vec![file("a\0b")]),
        ("repeat", vec![file("a"), file("a")]),
    ] {
        let ws = reapi::Directory {
            files,
            ..Default::default()
        };
        let ws_bytes = ws.encode_to_vec();
        let top = reapi::Directory {
            directories: vec![reapi::DirectoryNode {
                name: WS.into(),
                digest: Some(digest_of(&ws_bytes)),
            }],
            ..Default::default()
        };
        let top_bytes = top.encode_to_vec();
        b.client()
            .push(Push {
                blobs: [
                    (sha256_hex(&ws_bytes), ws_bytes),
                    (sha256_hex(&top_bytes), top_bytes.clone()),
                ]
                .into(),
                content: HashMap::new(),
            })
            .unwrap();
        let mut manifest = b.manifest(&good, &[]);
        manifest.input_root_digest = Some(digest_of(&top_bytes));
        let err = b.create_error(what, manifest);
        assert!(err.contains("name"), "{what}: {err}");
    }

    // Output keys outside the workspace or through "..".
    for key in ["/elsewhere/x", "/ws/../x", "ws/x", "/ws/a/../../x"] {
        let err = b.create_error("out", b.manifest(&good, &[(key, "file")]));
        assert!(err.contains(key), "{key}: {err}");
    }
    // Outputs where the input tree has a file, or below one.
    for key in ["/ws/f", "/ws/f/below"] {
        let err = b.create_error("out", b.manifest(&good, &[(key, "file")]));
        assert!(err.contains("as a file or symlink"), "{key}: {err}");
    }
    // Another hash function.
    let mut md5 = b.manifest(&good, &[]);
    md5.hash_function = "MD5".into();
    assert!(b.create_error("md5", md5).contains("MD5"));

    // A create for an id that exists; collect and destroy of unknown ids.
    b.create_ok("1", b.manifest(&good, &[]));
    assert!(b
        .create_error("1", b.manifest(&good, &[]))
        .contains("already exists"));
    match b.client().collect("nope", "/tmp").unwrap().outcome {
        Some(collect::result::Outcome::Error(e)) => assert!(e.message.contains("nope")),
        other => panic!("collect of an unknown id: {other:?}"),
    }
    match b.client().destroy("nope").unwrap().outcome {
        Some(destroy::result::Outcome::Error(e)) => assert!(e.message.contains("nope")),
        other => panic!("destroy of an unknown id: {other:?}"),
    }
    // Nothing half-made: every refused id can be created afresh now.
    for id in ["lying", "empty", "dot", "out", "md5"] {
        b.create_ok(id, b.manifest(&good, &[]));
        b.destroy_ok(id);
    }
    b.destroy_ok("1");
    // Scratch directories leave after the Destroy's answer (departures).
    let scratch_left = || -> Vec<PathBuf> {
        fs::read_dir(&b.base)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| {
                path.file_name()
                    .is_some_and(|name| name.to_string_lossy().starts_with("actionfs-serve-"))
            })
            .flat_map(|backend| fs::read_dir(backend.join("scratch")).unwrap())
            .map(|entry| entry.unwrap().path())
            .collect()
    };
    assert!(
        wait_for(Duration::from_secs(10), || scratch_left().is_empty()),
        "{:?}",
        scratch_left()
    );
    b.close();
}

#[test]
fn an_unknown_option_is_refused_by_name() {
    let root = tempfile::tempdir().unwrap();
    let mut serve = ServeProcess::spawn(bin(), Path::new("/nonexistent/ws"), None, LOGGED);
    let answer = serve
        .client()
        .negotiate(vec![
            format!("--sandbox_base={}", root.path().display()),
            "--frobnicate=3".into(),
        ])
        .unwrap();
    match answer.outcome {
        Some(negotiate::result::Outcome::Error(e)) => {
            assert!(e.message.contains("--frobnicate"), "{}", e.message)
        }
        other => panic!("{other:?}"),
    }
    let _ = serve.close_input();
    let status = serve.wait();
    assert!(!status.success());
    assert!(fs::read_dir(root.path()).unwrap().next().is_none());
}

/// A Create that cannot finish until the test lets it: its one input's
/// default place is in the mount of another daemon (the sandboxfs front
/// end, a real FUSE server) that the test stops with SIGSTOP, so the
/// backend's look at that place waits in the kernel until
/// [`Held::release`]. No timing: the wait ends only when released.
struct Held {
    daemon: actionfs_testkit::Daemon,
    _fx: actionfs_testkit::Fixture,
    manifest: Manifest,
    stopped: bool,
}

impl Held {
    fn new(b: &Backend) -> Held {
        use actionfs_testkit::{ro, sandbox, Fixture};
        let fx = Fixture::new();
        let file = fx.write("src/f", "held\n");
        let daemon = fx.start(&[]);
        daemon.create(sandbox("x", vec![ro("/ws/f", &file)]));
        let tree = b.push_files([("ws/f", digest_of(b"held\n"))]);
        let mut manifest = b.manifest(&tree, &[]);
        // Nothing has looked below x yet: the first lookup must be asked.
        manifest.exec_root = daemon.path("x").display().to_string();
        let mut held = Held {
            daemon,
            _fx: fx,
            manifest,
            stopped: false,
        };
        held.signal(libc::SIGSTOP);
        held
    }

    fn signal(&mut self, signal: libc::c_int) {
        let pid = self.daemon.client().pid() as libc::pid_t;
        // SAFETY: kill with a valid signal number has no memory effects.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        self.stopped = signal == libc::SIGSTOP;
        // kill returns before the stop: one thread takes the signal and
        // stops the others only when it next runs, and on a busy machine
        // the FUSE threads went on answering for that long (a held Create
        // read its input in 11 of 100 loaded runs).
        if self.stopped {
            assert!(
                wait_for(Duration::from_secs(60), || every_thread_stopped(pid)),
                "the daemon's threads did not all stop"
            );
        }
    }

    fn release(&mut self) {
        self.signal(libc::SIGCONT);
    }

    fn send(&self, b: &Backend, id: &str) -> std::sync::mpsc::Receiver<Answer> {
        b.send_create(id, self.manifest.clone())
    }
}

impl Drop for Held {
    /// Never leaves a stopped daemon (nor a backend waiting on it) behind
    /// a failed test.
    fn drop(&mut self) {
        if self.stopped {
            self.release();
        }
    }
}

/// Whether every thread of `pid` is in the stopped state (`T` in
/// /proc/PID/task/TID/stat, after the parenthesised name).
fn every_thread_stopped(pid: libc::pid_t) -> bool {
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .map(|task| task.unwrap().path().join("stat"))
        .all(|stat| proc_state(&stat) == Some('T'))
}

type Answer = actionfs_protocol::backend::client::Answer;

/// The path of a Create's Ok answer; panics on anything else.
fn created(id: &str, answer: Answer) -> PathBuf {
    match answer.unwrap().result {
        Some(sandbox::response::Result::Create(create::Result {
            outcome: Some(create::result::Outcome::Ok(ok)),
        })) => {
            assert!(ok.path.ends_with(id), "{} for {id}", ok.path);
            PathBuf::from(ok.path)
        }
        other => panic!("{id}: {other:?}"),
    }
}

fn still_due(answer: &std::sync::mpsc::Receiver<Answer>) -> bool {
    matches!(answer.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty))
}

#[test]
fn hundreds_of_requests_in_flight_are_answered_in_any_order() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&[]);
    let mut tb = TreeBuilder::new();
    for n in 0..20 {
        tb.add_file(
            &format!("ws/d{}/f{n}", n % 4),
            b.write_input(&format!("d{}/f{n}", n % 4), format!("{n}").as_bytes()),
            false,
        )
        .unwrap();
    }
    let tree = tb.build();
    b.push_tree(&tree);
    // The first request cannot finish until released; a backend that
    // answers in request order answers none of the others before it.
    let mut held = Held::new(&b);
    let first = held.send(&b, "held");
    let ids: Vec<String> = (0..300).map(|n| format!("s{n}")).collect();
    let pending: Vec<_> = ids
        .iter()
        .map(|id| {
            b.client()
                .send(
                    id,
                    sandbox::request::Op::Create(sandbox::Create {
                        manifest: Some(b.manifest(&tree, &[])),
                    }),
                )
                .unwrap()
        })
        .collect();
    let mut answers: Vec<Option<Answer>> = (0..ids.len()).map(|_| None).collect();
    let overtook = wait_for(Duration::from_secs(60), || {
        for (slot, answer) in answers.iter_mut().zip(&pending) {
            if slot.is_none() {
                *slot = answer.try_recv().ok();
            }
        }
        answers.iter().any(Option::is_some)
    });
    assert!(
        overtook,
        "no later request was answered while the first one waited: answers in request order\n{}",
        b.log()
    );
    if let Ok(answer) = first.try_recv() {
        panic!(
            "the held Create was answered before it could read its input: {answer:?}\n{}",
            b.log()
        );
    }
    assert!(still_due(&first), "the held Create's answer was lost");
    let overtaking = answers.iter().filter(|a| a.is_some()).count();
    held.release();
    let root = created("held", first.recv().unwrap());
    assert_eq!(fs::read(root.join("ws/f")).unwrap(), b"held\n");
    for ((id, slot), answer) in ids.iter().zip(answers).zip(pending) {
        created(id, slot.unwrap_or_else(|| answer.recv().unwrap()));
    }
    eprintln!(
        "{overtaking} of {} answered while the first waited",
        ids.len()
    );
    let pending: Vec<_> = ids
        .iter()
        .chain([&"held".to_owned()])
        .map(|id| {
            b.client()
                .send(id, sandbox::request::Op::Destroy(sandbox::Destroy {}))
                .unwrap()
        })
        .collect();
    for answer in pending {
        assert!(matches!(
            answer.recv().unwrap().unwrap().result,
            Some(sandbox::response::Result::Destroy(destroy::Result {
                outcome: Some(destroy::result::Outcome::Ok(_))
            }))
        ));
    }
    b.close();
}

/// A Destroy is applied on the request reader when nothing of its
/// sandbox is queued; one sent while its sandbox's Create is still being
/// applied must wait for it, not answer "no such sandbox".
#[test]
fn a_destroy_sent_before_its_create_is_answered_applies_after_it() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&[]);
    let mut held = Held::new(&b);
    let create = held.send(&b, "held");
    let destroy = b
        .client()
        .send("held", sandbox::request::Op::Destroy(sandbox::Destroy {}))
        .unwrap();
    // A second Negotiate, which the reader answers itself, in order: the
    // Destroy before it was read, and not answered on the way.
    let again = b
        .client()
        .send(
            "",
            sandbox::request::Op::Negotiate(sandbox::Negotiate {
                options: Vec::new(),
                versions: vec![sandbox::Version::Version1 as i32],
            }),
        )
        .unwrap();
    assert!(
        matches!(
            again.recv().unwrap().unwrap().result,
            Some(sandbox::response::Result::Negotiate(_))
        ),
        "{}",
        b.log()
    );
    assert!(still_due(&create), "the held Create was answered");
    assert!(still_due(&destroy), "the Destroy overtook its Create");
    held.release();
    created("held", create.recv().unwrap());
    match destroy.recv().unwrap().unwrap().result {
        Some(sandbox::response::Result::Destroy(destroy::Result {
            outcome: Some(destroy::result::Outcome::Ok(_)),
        })) => {}
        other => panic!("the Destroy after its Create: {other:?}\n{}", b.log()),
    }
    b.close();
}

#[test]
fn closing_stdin_with_requests_in_flight_answers_them_and_removes_everything() {
    if !require(&[Need::Mount]) {
        return;
    }
    let mut b = Backend::start(&[]);
    let tree = b.push_files([("ws/f", b.write_input("f", b"f"))]);
    // In flight for sure when stdin closes: the held Create cannot finish
    // until released, after the close, nor can those queued behind it.
    let mut held = Held::new(&b);
    let first = held.send(&b, "held");
    let pending: Vec<_> = (0..50)
        .map(|n| b.send_create(&format!("s{n}"), b.manifest(&tree, &[("/ws/o", "file")])))
        .collect();
    let client = b.take_client();
    let closing = std::thread::spawn(move || client.close());
    assert!(still_due(&first), "answered before its input could be read");
    let running = b.try_wait();
    assert!(
        running.is_none(),
        "the backend ended with a Create in flight: {running:?}"
    );
    held.release();
    closing
        .join()
        .unwrap()
        .expect("the backend's output kept to the protocol");
    let status = b.wait();
    assert!(status.success(), "exit {status:?}\n{}", b.log());
    // Every request read before the end was answered, the held one too.
    created("held", first.recv().unwrap());
    for (n, answer) in pending.into_iter().enumerate() {
        created(&format!("s{n}"), answer.recv().unwrap());
    }
    assert_nothing_left(&b.base, &b.log());
}

/// A frame that cannot be decoded ends the backend with one line on
/// stderr, a non-zero status and nothing mounted.
#[test]
fn a_corrupt_frame_ends_the_backend_with_nothing_mounted() {
    if !require(&[Need::Mount]) {
        return;
    }
    let cases: [(&str, Vec<u8>); 3] = [
        ("bad varint", vec![0xff; 11]),
        ("length past the bound", vec![0xff, 0xff, 0xff, 0xff, 0x0f]),
        ("truncated", vec![0x20, 0x08, 0x01]),
    ];
    for (what, bytes) in cases {
        let root = tempfile::tempdir().unwrap();
        let mut child = Command::new(bin())
            .args(["serve", "--workspace", "/nonexistent/ws"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let negotiate = sandbox::Request {
            rid: 1,
            sandbox_id: String::new(),
            op: Some(sandbox::request::Op::Negotiate(sandbox::Negotiate {
                options: vec![format!("--sandbox_base={}", root.path().display())],
                versions: vec![0],
            })),
        };
        stdin
            .write_all(&negotiate.encode_length_delimited_to_vec())
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let answer: sandbox::Response =
            actionfs_protocol::backend::frame::read_frame(&mut stdout, 1 << 20)
                .unwrap()
                .unwrap();
        assert!(answer.result.is_some());
        stdin.write_all(&bytes).unwrap();
        drop(stdin);
        let output = child.wait_with_output().unwrap();
        assert!(!output.status.success(), "{what}: exit 0");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            stderr
                .trim_end()
                .lines()
                .filter(|l| l.contains("frame"))
                .count(),
            1,
            "{what}: {stderr}"
        );
        let mounts = fs::read_to_string("/proc/mounts").unwrap();
        assert!(
            !mounts.contains(&root.path().display().to_string()),
            "{what}"
        );
        assert!(
            fs::read_dir(root.path()).unwrap().next().is_none(),
            "{what}: left files"
        );
    }
}

/// Evicted and spent single-use content is asked for again
/// (MissingContent), never read from the default place instead.
#[test]
fn evicted_and_spent_content_is_missing_content_until_pushed_again() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&["--store_max_bytes=1500"]);
    let (first, second, once) = ([b'a'; 1000], [b'b'; 1000], [b'c'; 10]);
    // The default place holds other bytes under the same names.
    for name in ["f", "g"] {
        b.write_input(name, b"not the digest's bytes");
    }
    let tree_of =
        |name: &str, bytes: &[u8]| b.push_files([(format!("ws/{name}"), digest_of(bytes))]);
    let push = |bytes: &[u8], retention: Retention| {
        b.client()
            .push(Push {
                blobs: HashMap::new(),
                content: [(
                    sha256_hex(bytes),
                    Content {
                        source: Some(content::Source::Inline(bytes.to_vec())),
                        retention: retention as i32,
                    },
                )]
                .into(),
            })
            .unwrap();
    };
    let expect_missing = |id: &str, tree: &Tree, bytes: &[u8]| match b
        .client()
        .create(id, b.manifest(tree, &[]))
        .unwrap()
        .outcome
    {
        Some(create::result::Outcome::MissingContent(m)) => {
            assert_eq!(m.digest_hashes, vec![sha256_hex(bytes)])
        }
        other => panic!("{id}: expected MissingContent, got {other:?}"),
    };
    let with_first = tree_of("f", &first);
    push(&first, Retention::Reuse);
    let root = b.create_ok("1", b.manifest(&with_first, &[]));
    assert_eq!(fs::read(root.join("ws/f")).unwrap(), first);
    b.destroy_ok("1");
    push(&second, Retention::Reuse); // over the bound: `first` goes
    expect_missing("2", &with_first, &first);
    push(&first, Retention::Reuse);
    let root = b.create_ok("2", b.manifest(&with_first, &[]));
    assert_eq!(fs::read(root.join("ws/f")).unwrap(), first);
    b.destroy_ok("2");

    let with_once = tree_of("g", &once);
    push(&once, Retention::SingleUse);
    let root = b.create_ok("3", b.manifest(&with_once, &[]));
    assert_eq!(fs::read(root.join("ws/g")).unwrap(), once);
    b.destroy_ok("3");
    expect_missing("4", &with_once, &once);
    b.close();
}

/// Without --sandbox_base the backend works below /dev/shm where that is
/// tmpfs (measured faster), and leaves nothing there when it stops.
#[test]
fn the_default_sandbox_base_is_dev_shm_where_it_is_tmpfs() {
    if !require(&[Need::Mount]) {
        return;
    }
    let shm_is_tmpfs = fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some("/dev/shm") && l.split(' ').nth(2) == Some("tmpfs"));
    let exec_root = tempfile::tempdir().unwrap();
    fs::create_dir_all(exec_root.path().join(WS)).unwrap();
    fs::write(exec_root.path().join("ws/f"), b"f").unwrap();
    let mut serve = ServeProcess::spawn(bin(), &exec_root.path().join(WS), None, LOGGED);
    let client = serve.client();
    // Nothing handed on: a test leaves nothing in /dev/shm.
    let options: Vec<String> = transport()
        .map(|t| format!("--transport={t}"))
        .into_iter()
        .chain(["--keep_state=off".to_owned()])
        .collect();
    client.negotiate(options).unwrap();
    let mut tb = TreeBuilder::new();
    tb.add_file("ws/f", digest_of(b"f"), false).unwrap();
    let tree = tb.build();
    client.push(tree.to_push()).unwrap();
    let manifest = Manifest {
        exec_root: exec_root.path().display().to_string(),
        hash_function: "SHA-256".into(),
        input_root_digest: Some(tree.root.clone()),
        ..Default::default()
    };
    let Some(create::result::Outcome::Ok(ok)) = client.create("1", manifest).unwrap().outcome
    else {
        panic!("create failed");
    };
    // The backend's own directory on the base: the sandbox is its
    // `mnt/ID`, or its `native/links/ID` if built natively.
    let base = Path::new(&ok.path)
        .ancestors()
        .find(|dir| {
            dir.file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("actionfs-serve-"))
        })
        .unwrap_or_else(|| panic!("{} is not in a backend's directory", ok.path))
        .to_owned();
    let expected_parent = if shm_is_tmpfs {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    assert_eq!(base.parent().unwrap(), expected_parent, "{}", ok.path);
    assert_eq!(fs::read(Path::new(&ok.path).join("ws/f")).unwrap(), b"f");
    serve.close_input().unwrap();
    assert!(serve.wait().success());
    assert!(!base.exists(), "{base:?} outlived the backend");
}

/// A start that fails (here: the sandbox base does not exist) answers
/// Negotiate with an Error saying why, and exits 1 with nothing made.
#[test]
fn a_failed_start_answers_negotiate_with_the_reason() {
    let mut serve = ServeProcess::spawn(bin(), Path::new("/nonexistent/ws"), None, LOGGED);
    let answer = serve
        .client()
        .negotiate(vec!["--sandbox_base=/nonexistent/base".into()])
        .unwrap();
    match answer.outcome {
        Some(negotiate::result::Outcome::Error(e)) => {
            assert!(e.message.contains("/nonexistent/base"), "{}", e.message)
        }
        other => panic!("{other:?}"),
    }
    let _ = serve.close_input();
    assert_eq!(serve.wait().code(), Some(1));
}

#[test]
fn hard_linked_native_inputs_are_refused_at_negotiate() {
    if !require(&[Need::Mount]) {
        return;
    }
    for method in ["hardlink", "auto"] {
        let root = tempfile::tempdir().unwrap();
        let mut serve = ServeProcess::spawn(bin(), root.path(), None, LOGGED);
        let answer = serve
            .client()
            .negotiate(vec![format!("--native_method={method}")])
            .unwrap();
        match answer.outcome {
            Some(negotiate::result::Outcome::Error(e)) => assert!(
                e.message.contains("--native_method")
                    && e.message.contains(method)
                    && e.message.contains("could change it"),
                "{}",
                e.message
            ),
            other => panic!("{method}: {other:?}"),
        }
        let _ = serve.close_input();
        assert!(!serve.wait().success());
    }
}

#[test]
fn relative_content_locations_are_read_below_the_workspaces_parent() {
    if !require(&[Need::Mount]) {
        return;
    }
    for (mode, option) in modes() {
        let b = Backend::start(&[option]);
        // A runfiles member: its bytes at its own exec path, its place in
        // the tree below the runfiles directory.
        let bytes = b"runfiles member\n";
        b.write_input("data/member.txt", bytes);
        b.client()
            .push(Push {
                blobs: HashMap::new(),
                content: [(
                    sha256_hex(bytes),
                    Content {
                        source: Some(content::Source::Location("ws/data/member.txt".into())),
                        retention: Retention::Reuse as i32,
                    },
                )]
                .into(),
            })
            .unwrap();
        let tree = b.push_files([("ws/bin/tool.runfiles/ws/data/member.txt", digest_of(bytes))]);
        let member = "ws/bin/tool.runfiles/ws/data/member.txt";
        let root = b.create_ok("1", b.manifest(&tree, &[]));
        assert_eq!(fs::read(root.join(member)).unwrap(), bytes, "{mode}");
        assert_built_as(&b, mode, &root);
        b.destroy_ok("1");
        // Captured at the Push: what the location holds later is not read.
        b.write_input("data/member.txt", b"changed after the push\n");
        let root = b.create_ok("2", b.manifest(&tree, &[]));
        assert_eq!(fs::read(root.join(member)).unwrap(), bytes, "{mode}");
        b.destroy_ok("2");
        b.close();
    }
}

/// A Push entry that failed for a reason of the moment (its location
/// missing when read; a full disk would do the same) is asked for again
/// with MissingContent, which Bazel answers with a Push: Bazel pushes an
/// entry to a backend once, so an Error would fail every later action
/// naming that digest until the backend restarts. Bytes that are not
/// the digest's stay an Error: pushing them again cannot help.
#[test]
fn a_push_that_failed_for_the_moment_is_asked_for_again() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&[]);
    let bytes = b"runfiles member\n";
    let location = |path: &str| Push {
        blobs: HashMap::new(),
        content: [(
            sha256_hex(bytes),
            Content {
                source: Some(content::Source::Location(path.into())),
                retention: Retention::Reuse as i32,
            },
        )]
        .into(),
    };
    // Not there yet when the Push is read.
    b.client().push(location("ws/data/member.txt")).unwrap();
    let member = "ws/bin/tool.runfiles/ws/data/member.txt";
    let tree = b.push_files([(member, digest_of(bytes))]);
    let answer = b.client().create("1", b.manifest(&tree, &[])).unwrap();
    match answer.outcome {
        Some(create::result::Outcome::MissingContent(missing)) => {
            assert_eq!(missing.digest_hashes, vec![sha256_hex(bytes)])
        }
        other => panic!("expected MissingContent, got {other:?}\n{}", b.log()),
    }
    // Bazel pushes what was named, now readable, and creates again.
    b.write_input("data/member.txt", bytes);
    b.client().push(location("ws/data/member.txt")).unwrap();
    let root = b.create_ok("1", b.manifest(&tree, &[]));
    assert_eq!(fs::read(root.join(member)).unwrap(), bytes);
    b.destroy_ok("1");

    // Other bytes at the location: an Error, then as before.
    let other = b"other bytes\n";
    b.write_input("data/other.txt", b"not the digest's\n");
    b.client()
        .push(Push {
            blobs: HashMap::new(),
            content: [(
                sha256_hex(other),
                Content {
                    source: Some(content::Source::Location("ws/data/other.txt".into())),
                    retention: Retention::Reuse as i32,
                },
            )]
            .into(),
        })
        .unwrap();
    let tree = b.push_files([("ws/bin/tool.runfiles/ws/data/other.txt", digest_of(other))]);
    let message = b.create_error("2", b.manifest(&tree, &[]));
    assert!(message.contains("refused"), "{message}");
    b.close();
}

#[test]
fn an_empty_directory_is_served_though_its_blob_is_never_pushed() {
    if !require(&[Need::Mount]) {
        return;
    }
    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    for (mode, option) in modes() {
        let b = Backend::start(&[option]);
        let input = b.write_input("src/a.txt", b"a\n");
        let mut tb = TreeBuilder::new();
        tb.add_file("ws/src/a.txt", input, false).unwrap();
        tb.add_dir("ws/empty").unwrap();
        tb.add_dir("ws/src/deeper/empty").unwrap();
        let mut tree = tb.build();
        // As Bazel: the empty Directory serializes to no bytes and is
        // never pushed.
        tree.blobs.remove(EMPTY);
        b.push_tree(&tree);
        let outcome = b.client().create("1", b.manifest(&tree, &[])).unwrap();
        let root = match outcome.outcome {
            Some(create::result::Outcome::Ok(ok)) => PathBuf::from(ok.path),
            other => panic!("{mode}: {other:?}\n{}", b.log()),
        };
        assert_built_as(&b, mode, &root);
        for dir in ["ws/empty", "ws/src/deeper/empty"] {
            let entries: Vec<_> = fs::read_dir(root.join(dir))
                .unwrap_or_else(|err| panic!("{mode}: {dir}: {err}"))
                .collect();
            assert!(entries.is_empty(), "{mode}: {dir} is not empty");
        }
        b.destroy_ok("1");
        b.close();
    }
}

/// A source tree reached from the exec root through a directory link, as
/// Bazel's exec root reaches a workspace's top-level directories, with
/// files that are themselves links.
fn symlinked_sources(b: &Backend) -> tempfile::TempDir {
    use std::os::unix::fs::symlink;
    let sources = tempfile::tempdir_in(b.root.path()).unwrap();
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
                        target.starts_with(&b.base)
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
        fs::read_dir(&b.base)
            .unwrap()
            .flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("actionfs-serve-") || name.starts_with("actionfs-state-")
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
        assert!(fs::read_link(&shown).unwrap().starts_with(&b.base));
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
    assert!(small_target.starts_with(&b.base), "{small_target:?}");
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

/// An ext2 file system with 128-byte inodes, loop-mounted: timestamps in
/// whole seconds, as a directory's ctime moves on kernels without
/// multigrain timestamps (before 6.13) within a clock tick.
struct SecondsFs {
    dir: tempfile::TempDir,
}

impl SecondsFs {
    fn new() -> Result<SecondsFs, String> {
        let dir = tempfile::tempdir_in("/var/tmp").map_err(|e| e.to_string())?;
        let image = dir.path().join("ext2.img");
        fs::create_dir(dir.path().join("mnt")).map_err(|e| e.to_string())?;
        for command in [
            vec!["truncate", "-s", "64M", image.to_str().unwrap()],
            vec![
                "mkfs.ext2",
                "-q",
                "-F",
                "-I",
                "128",
                image.to_str().unwrap(),
            ],
            vec![
                "mount",
                "-o",
                "loop",
                image.to_str().unwrap(),
                dir.path().join("mnt").to_str().unwrap(),
            ],
        ] {
            let out = Command::new(command[0]).args(&command[1..]).output();
            match out {
                Ok(out) if out.status.success() => {}
                Ok(out) => {
                    return Err(format!(
                        "{command:?}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    ))
                }
                Err(err) => return Err(format!("{command:?}: {err}")),
            }
        }
        Ok(SecondsFs { dir })
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for SecondsFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

/// Stashes trust a directory's ctime to show any change made after a
/// stamp: where it moves only with the clock (here in whole seconds), a
/// change in the stamp's tick would go unseen, so native sandboxes are
/// built afresh there, never from a stash; on tmpfs the second build of a
/// tree comes from the first's stash.
#[test]
fn native_sandboxes_are_not_reused_where_ctime_moves_with_the_clock() {
    if !require(&[Need::Mount, Need::LoopDevice]) {
        return;
    }
    let seconds = SecondsFs::new().unwrap_or_else(|why| panic!("an ext2 of seconds: {why}"));
    for (parent, reused) in [
        (Path::new("/dev/shm").to_owned(), true),
        (seconds.path(), false),
    ] {
        let b = Backend::start_on(&parent, &["--native_below=1000000000"]);
        let files: Vec<(String, reapi::Digest)> = (0..40)
            .map(|n| {
                let rel = format!("src/f{n}.txt");
                let digest = b.write_input(&rel, format!("file {n}\n").as_bytes());
                (format!("ws/{rel}"), digest)
            })
            .collect();
        let tree = b.push_files(files);
        for id in ["a", "b"] {
            let root = b.create_ok(id, b.manifest(&tree, &[("/ws/out/x", "file")]));
            assert_eq!(fs::read(root.join("ws/src/f7.txt")).unwrap(), b"file 7\n");
            b.destroy_ok(id);
        }
        let built = &b.stats()["built"];
        let from_stash = built["stash"].as_u64().unwrap();
        assert_eq!(
            (
                built["native"].as_u64().unwrap() + from_stash,
                from_stash > 0
            ),
            (2, reused),
            "below {parent:?}: built {built}\n{}",
            b.log()
        );
        b.close();
    }
}
