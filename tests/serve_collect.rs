//! `actionfs serve`'s Collect: a tree becomes a sandbox whose outputs an
//! action writes and Collect moves into Bazel's exec root, natively and in
//! FUSE; an output path the action replaced with a symlink is refused,
//! never followed.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use actionfs_protocol::backend::digest::digest_of;
use actionfs_protocol::backend::sandbox::collect;
use actionfs_protocol::backend::tree::TreeBuilder;
use actionfs_testkit::backend::{assert_built_as, modes, Backend, WS};
use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::wait_for;

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
        b.push_tree_with_inline(&tree, &[pushed, tool]);
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
        let in_view = b.base().join(b.dir_name()).join("mnt/1");
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
        let collect_root = b.root().join("collected");
        match b
            .client()
            .collect("1", &collect_root.display().to_string())
            .unwrap()
            .outcome
        {
            Some(collect::result::Outcome::Ok(_)) => {}
            other => panic!("{mode}: collect: {other:?}"),
        }
        // Counted with its own time, as Create and Destroy are.
        let collects = &b.stats()["requests"]["collect"];
        assert_eq!(collects["count"], 1, "{mode}: {collects}");
        assert!(collects["p50_us"].as_u64().is_some(), "{mode}: {collects}");
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
        let scratch_dirs: Vec<PathBuf> = fs::read_dir(b.base())
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

            let collected = b.root().join("collected");
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
