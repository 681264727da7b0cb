//! `actionfs serve` with its sandbox base on another file system than
//! the exec root (the default: /dev/shm, and an exec root on a disk): a
//! sandbox served by FUSE writes its workspace directory beside the exec
//! root, so Collect renames its outputs as Bazel 7-9's own sandbox does;
//! a native one keeps it on the base, where its input links are made
//! fastest, and Collect copies. What the action sees is the same either
//! way.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use actionfs_protocol::backend::digest::{digest_of, sha256_hex};
use actionfs_protocol::backend::sandbox::Push;
use actionfs_protocol::backend::tree::TreeBuilder;
use actionfs_testkit::backend::{assert_built_as, inline, modes, Backend, WS};
use actionfs_testkit::tier::{require, Need};

fn device(path: &Path) -> u64 {
    fs::metadata(path).unwrap().dev()
}

#[test]
fn fuse_sandboxes_write_beside_a_disk_exec_root_and_collect_renames() {
    if !require(&[Need::Mount]) {
        return;
    }
    let shm = Path::new("/dev/shm");
    for (mode, option) in modes() {
        let b = Backend::start_on(shm, &[option]);
        assert_ne!(device(&b.exec_root()), device(&b.base), "{mode}");
        // A generated input in the directory an output is written to.
        let header = b"#define GENERATED 1\n";
        let mut tb = TreeBuilder::new();
        tb.add_file("ws/bazel-out/bin/pkg/gen.h", digest_of(header), false)
            .unwrap();
        let tree = tb.build();
        b.client()
            .push(Push {
                blobs: tree.blobs.clone(),
                content: [(sha256_hex(header), inline(header))].into(),
            })
            .unwrap();
        let manifest = b.manifest(
            &tree,
            &[
                ("/ws/bazel-out/bin/pkg/out.o", "file"),
                ("/ws/bazel-out/bin/pkg2/tree", "dir"),
            ],
        );
        let root = b.create_ok("1", manifest);
        assert_built_as(&b, mode, &root);
        let ws = root.join(WS);
        assert_eq!(
            fs::read(ws.join("bazel-out/bin/pkg/gen.h")).unwrap(),
            header,
            "{mode}"
        );
        // What the action does: writes its outputs, and may remove and
        // make again a directory output's directory.
        fs::write(ws.join("bazel-out/bin/pkg/out.o"), b"object\n").unwrap();
        fs::remove_dir(ws.join("bazel-out/bin/pkg2/tree")).unwrap();
        fs::create_dir(ws.join("bazel-out/bin/pkg2/tree")).unwrap();
        fs::write(ws.join("bazel-out/bin/pkg2/tree/member"), b"member\n").unwrap();
        // Directories are directories, as on the underlying files.
        let kind = fs::symlink_metadata(ws.join("bazel-out/bin/pkg")).unwrap();
        assert!(kind.is_dir(), "{mode}");

        let beside = b.root.path().join(b.dir_name());
        let written = beside.join("1").join(WS).join("bazel-out/bin/pkg/out.o");
        let before = match mode {
            "fuse" => {
                assert_eq!(device(&beside), device(&b.exec_root()), "{mode}");
                fs::metadata(&written).unwrap().ino()
            }
            _ => {
                assert!(!written.exists(), "{mode}: {written:?}");
                0
            }
        };

        let collected = b.collect_ok("1").join(WS);
        assert_eq!(
            fs::read(collected.join("bazel-out/bin/pkg/out.o")).unwrap(),
            b"object\n",
            "{mode}"
        );
        assert_eq!(
            fs::read(collected.join("bazel-out/bin/pkg2/tree/member")).unwrap(),
            b"member\n",
            "{mode}"
        );
        // The input is no output: not collected.
        assert!(
            !collected.join("bazel-out/bin/pkg/gen.h").exists(),
            "{mode}"
        );
        if mode == "fuse" {
            // A rename keeps the inode; a copy would make a new one.
            let after = fs::metadata(collected.join("bazel-out/bin/pkg/out.o")).unwrap();
            assert_eq!(after.ino(), before, "{mode}: copied, not renamed");
        }

        b.destroy_ok("1");
        b.close();
        assert!(!beside.exists(), "{mode}: {beside:?} outlived the backend");
    }
}
