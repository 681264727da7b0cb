//! Hybrid mode: sandboxes below `--native_below` are built as real files
//! outside the mount and shown as `MOUNT/ID`, a symlink to them; larger
//! ones, and layouts the materializer cannot make, are FUSE views. Either
//! way the action sees the same files, its outputs land in the scratch
//! directory, and destroying removes what actionfs made and nothing else.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;

/// Everything under `dir`, relative, sorted (directories included).
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            out.push(path.strip_prefix(dir).unwrap().display().to_string());
            if path.symlink_metadata().unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

/// A Bazel-shaped sandbox: the workspace is the writable scratch
/// directory, inputs are nested read-only mappings.
fn bazel_like(fx: &Fixture, id: &str, inputs: usize) -> actionfs_protocol::CreateSandbox {
    let mut mappings = vec![rw("/ws", &fx.path("scratch"))];
    for i in 0..inputs {
        let src = fx.write(&format!("src/pkg/in{i}.c"), &format!("input {i}"));
        mappings.push(ro(&format!("/ws/pkg/in{i}.c"), &src));
    }
    sandbox(id, mappings)
}

/// Whether /dev/shm is a directory to make tmpfs sandboxes in (a skip
/// says why it is not, and fails in CI).
fn have_shm() -> bool {
    Path::new("/dev/shm").is_dir() || actionfs_testkit::tier::skip("no tmpfs at /dev/shm")
}

fn native_dir(fx: &Fixture) -> std::path::PathBuf {
    fx.path("mnt.native")
}

/// Native trees and links left: only the client's probe sandbox, `empty`
/// (no mappings, so native), which is never destroyed.
fn assert_only_the_probe_is_native(fx: &Fixture) {
    for sub in ["trees", "links"] {
        assert_eq!(listing(&native_dir(fx).join(sub)), ["empty"], "{sub}");
    }
}

#[test]
fn small_sandboxes_are_native_large_ones_fuse_and_both_look_the_same() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    fs::write(fx.path("scratch/owned-by-user"), "keep me").unwrap();
    let d = fx.start(&["--native_below=5"]);
    d.create(bazel_like(&fx, "small", 3));
    let root = fs::symlink_metadata(d.path("small")).unwrap();
    assert!(
        root.file_type().is_symlink(),
        "native sandbox shown as a symlink"
    );
    assert_eq!(
        fs::read_link(d.path("small")).unwrap(),
        native_dir(&fx).join("trees/small")
    );
    for i in 0..3 {
        let content = fs::read_to_string(d.path(&format!("small/ws/pkg/in{i}.c"))).unwrap();
        assert_eq!(content, format!("input {i}"));
    }
    // The action writes its output into the workspace: it lands in the
    // scratch directory on disk, as Bazel expects.
    fs::write(d.path("small/ws/out.o"), "object").unwrap();
    assert_eq!(
        fs::read_to_string(fx.path("scratch/out.o")).unwrap(),
        "object"
    );
    d.destroy("small");
    assert_eq!(errno(fs::symlink_metadata(d.path("small"))), libc::ENOENT);
    // What actionfs put into the scratch directory is gone; the user's
    // files and the action's output stay.
    assert_eq!(listing(&fx.path("scratch")), ["out.o", "owned-by-user"]);
    assert_only_the_probe_is_native(&fx);

    fs::remove_file(fx.path("scratch/out.o")).unwrap();
    d.create(bazel_like(&fx, "large", 5));
    let root = fs::symlink_metadata(d.path("large")).unwrap();
    assert!(root.is_dir(), "at the cutoff, a FUSE view");
    assert_eq!(
        fs::read_to_string(d.path("large/ws/pkg/in4.c")).unwrap(),
        "input 4"
    );
    d.destroy("large");
    assert_eq!(listing(&fx.path("scratch")), ["owned-by-user"]);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

/// No one but the daemon's user may change a native sandbox: its
/// directories, and those holding every tree and link, follow the umask
/// the daemon started with. A process-wide umask of 0 once made them all
/// writable by everyone, so that another user could swap an action's
/// inputs (or the link that is its root).
#[test]
fn native_sandboxes_are_not_writable_by_other_users() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let d = fx.start(&["--native_below=1000"]);
    d.create(bazel_like(&fx, "small", 3));
    let native = native_dir(&fx);
    let tree = native.join("trees/small");
    let assert_others_cannot_write = |dirs: &[PathBuf]| {
        for dir in dirs {
            let mode = fs::symlink_metadata(dir).unwrap().permissions().mode();
            assert_eq!(mode & 0o022, 0, "{dir:?}: {mode:o}");
        }
    };
    assert_others_cannot_write(&[
        native.clone(),
        native.join("trees"),
        native.join("links"),
        tree.clone(),
        tree.join("ws/pkg"),
    ]);
    d.destroy("small");
    assert_eq!(d.terminate(), BY_SIGTERM);

    // What such a daemon left is mended by the next one.
    for dir in [native.clone(), native.join("trees"), native.join("links")] {
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    }
    let d = fx.start(&["--native_below=1000"]);
    d.create(bazel_like(&fx, "again", 3));
    assert_others_cannot_write(&[
        native.clone(),
        native.join("trees"),
        native.join("links"),
        native.join("trees/again"),
    ]);
    d.destroy("again");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn bad_requests_get_the_fuse_answer_and_leave_nothing_behind() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "x");
    let missing = fx.path("src/missing");
    // A mapped directory with nested mappings must exist.
    let bad = || {
        sandbox(
            "bad",
            vec![ro("/a", &input), ro("/b", &missing), ro("/b/c", &input)],
        )
    };
    let fuse = fx.start(&[]);
    let fuse_answer = fuse.create_err(bad());
    drop(fuse);
    let d = fx.start(&["--native_below=100"]);
    assert_eq!(d.create_err(bad()), fuse_answer);
    assert!(fuse_answer.contains("lstat"), "{fuse_answer}");
    assert_only_the_probe_is_native(&fx);
    // Ids are checked before anything is built.
    d.create(sandbox("twice", vec![ro("/a", &input)]));
    assert!(d
        .create_err(sandbox("twice", vec![ro("/a", &input)]))
        .contains("already exists"));
    assert!(d
        .create_err(sandbox("../escape", vec![ro("/a", &input)]))
        .contains("escape"));
    assert!(!fx.path("escape").exists() && !native_dir(&fx).join("escape").exists());
    d.destroy("twice");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn layouts_the_materializer_cannot_build_fall_back_to_fuse() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "x");
    // An existing file where an input would go inside the writable
    // directory: FUSE shadows it, a native tree cannot.
    fs::write(fx.path("scratch/in"), "user's").unwrap();
    let d = fx.start_logged(&["--native_below=100"], "info");
    d.create(sandbox(
        "s",
        vec![rw("/ws", &fx.path("scratch")), ro("/ws/in", &input)],
    ));
    assert!(fs::symlink_metadata(d.path("s")).unwrap().is_dir());
    assert_eq!(fs::read_to_string(d.path("s/ws/in")).unwrap(), "x");
    d.destroy("s");
    assert_eq!(fs::read_to_string(fx.path("scratch/in")).unwrap(), "user's");
    assert_eq!(d.terminate(), BY_SIGTERM);
    assert!(fx.log().contains("served by FUSE"), "{}", fx.log());
}

#[test]
fn shutdown_removes_native_sandboxes_never_destroyed() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let d = fx.start(&["--native_below=100"]);
    d.create(bazel_like(&fx, "left", 4));
    assert!(
        fx.path("scratch/pkg/in0.c").exists(),
        "inputs made in place"
    );
    assert_eq!(d.terminate(), BY_SIGTERM);
    assert!(!is_mounted(&fx.mnt()));
    assert!(
        listing(&fx.path("scratch")).is_empty(),
        "in-place inputs removed"
    );
    assert!(
        listing(&native_dir(&fx).join("trees")).is_empty(),
        "probe too"
    );
}

#[test]
fn auto_takes_the_calibrated_cutoff() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    fs::write(fx.path("calibration.json"), r#"{"native_below": 3}"#).unwrap();
    let calibration = format!("--calibration={}", fx.path("calibration.json").display());
    let d = fx.start_logged(&["--native_below=auto", &calibration], "info");
    d.create(bazel_like(&fx, "two", 1));
    d.create(bazel_like(&fx, "three", 2));
    assert!(fs::symlink_metadata(d.path("two"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(fs::symlink_metadata(d.path("three")).unwrap().is_dir());
    assert_eq!(d.terminate(), BY_SIGTERM);
    assert!(fx.log().contains("fewer than 3 mappings"), "{}", fx.log());
}

#[test]
fn by_default_sandboxes_made_on_tmpfs_are_native_and_the_others_fuse() {
    if !require(&[Need::Mount]) || !have_shm() {
        return;
    }
    let shm = Path::new("/dev/shm");
    let fx = Fixture::new();
    let d = fx.start_logged(&["--native_below=auto"], "debug");
    // Nothing native yet: the native directory is not even made.
    assert!(!native_dir(&fx).exists());

    // Bazel's layout with --sandbox_base=/dev/shm: the scratch directory
    // holding every input is on tmpfs.
    let scratch = tempfile::tempdir_in(shm).unwrap();
    let mut mappings = vec![rw("/ws", scratch.path())];
    for i in 0..3 {
        let src = fx.write(&format!("src/pkg/in{i}.c"), &format!("input {i}"));
        mappings.push(ro(&format!("/ws/pkg/in{i}.c"), &src));
    }
    d.create(sandbox("on-tmpfs", mappings));
    // Bazel's default sandbox base: the scratch directory is on disk.
    d.create(bazel_like(&fx, "on-disk", 3));

    let kind = |id| fs::symlink_metadata(d.path(id)).unwrap().file_type();
    assert!(
        kind("on-tmpfs").is_symlink(),
        "native: MOUNT/ID is a symlink"
    );
    assert!(kind("on-disk").is_dir(), "FUSE: MOUNT/ID is a directory");
    for id in ["on-tmpfs", "on-disk"] {
        let read = fs::read_to_string(d.path(&format!("{id}/ws/pkg/in2.c"))).unwrap();
        assert_eq!(read, "input 2", "{id}");
    }
    assert_eq!(
        listing(scratch.path()),
        ["pkg", "pkg/in0.c", "pkg/in1.c", "pkg/in2.c"]
    );
    let stats = fx.stats_now(&d);
    assert_eq!(stats["built"]["native"], 1, "{stats}");
    assert!(stats["built"]["fuse"].as_u64().unwrap() >= 2, "{stats}");

    d.destroy("on-tmpfs");
    d.destroy("on-disk");
    assert!(
        listing(scratch.path()).is_empty(),
        "inputs left in the scratch directory"
    );
    assert_eq!(d.terminate(), BY_SIGTERM);
    let log = fx.log();
    assert!(
        log.contains(r#"sandbox "on-tmpfs": 4 mappings"#) && log.contains("(tmpfs): native"),
        "{log}"
    );
    assert!(
        log.contains(r#"sandbox "on-disk": 4 mappings"#) && log.contains("(not tmpfs): FUSE"),
        "{log}"
    );
}

/// Every symlink under `dir` with its target, relative and sorted.
fn links(dir: &Path) -> Vec<(String, String)> {
    listing(dir)
        .into_iter()
        .filter_map(|rel| {
            let target = fs::read_link(dir.join(&rel)).ok()?;
            Some((rel, target.display().to_string()))
        })
        .collect()
}

#[test]
fn a_destroyed_native_sandbox_is_reused_and_nothing_an_action_wrote_moves() {
    if !require(&[Need::Mount]) || !have_shm() {
        return;
    }
    let shm = Path::new("/dev/shm");
    let fx = Fixture::new();
    let d = fx.start_logged(&["--native_below=auto"], "debug");
    // Bazel's layout with --sandbox_base=/dev/shm: BASE/N/scratch, where
    // Bazel made the output directory `out` before the request.
    let base = tempfile::tempdir_in(shm).unwrap();
    let scratch = |n: &str| {
        let dir = base.path().join(n).join("scratch");
        fs::create_dir_all(dir.join("out")).unwrap();
        dir
    };
    let inputs = |scratch: &Path, range: std::ops::Range<usize>, odd: &str| {
        let mut mappings = vec![rw("/ws", scratch)];
        for i in range {
            let src = fx.write(&format!("src/pkg/in{i}.c"), &format!("input {i}"));
            mappings.push(ro(&format!("/ws/pkg/in{i}.c"), &src));
        }
        for i in 0..3 {
            let src = fx.write(&format!("src/pkg/sub/h{i}.h"), "header");
            mappings.push(ro(&format!("/ws/pkg/sub/h{i}.h"), &src));
        }
        mappings.push(ro("/ws/pkg/odd.c", &fx.write(odd, odd)));
        // A generated input inside the output directory Bazel made.
        mappings.push(ro("/ws/out/gen.h", &fx.write("gen/gen.h", "generated")));
        mappings
    };

    let first = scratch("1");
    d.create(sandbox("first", inputs(&first, 0..40, "src/odd-a.c")));
    // The action writes its output, and a file into an input directory.
    fs::write(d.path("first/ws/out/result.o"), "output").unwrap();
    fs::write(d.path("first/ws/pkg/sub/stray.txt"), "stray").unwrap();
    // And replaces an input with a file of its own.
    fs::remove_file(d.path("first/ws/out/gen.h")).unwrap();
    fs::write(d.path("first/ws/out/gen.h"), "not the input").unwrap();
    d.destroy("first");
    // Only what the action wrote is left for Bazel; the inputs are gone.
    assert_eq!(
        listing(&first),
        [
            "out",
            "out/gen.h",
            "out/result.o",
            "pkg",
            "pkg/sub",
            "pkg/sub/stray.txt"
        ]
    );
    assert!(!fs::symlink_metadata(first.join("out/gen.h"))
        .unwrap()
        .file_type()
        .is_symlink());

    // Overlapping inputs, some new, one with another target.
    let second = scratch("2");
    d.create(sandbox("second", inputs(&second, 10..50, "src/odd-b.c")));
    let stats = fx.stats_now(&d);
    assert_eq!(stats["built"]["stash"], 1, "{stats}\n{}", fx.log());
    assert_eq!(
        fs::read_to_string(d.path("second/ws/pkg/odd.c")).unwrap(),
        "src/odd-b.c"
    );
    assert!(!second.join("pkg/sub/stray.txt").exists());
    assert_eq!(
        fs::read_to_string(d.path("second/ws/out/gen.h")).unwrap(),
        "generated"
    );
    // The same tree a fresh build makes, beside the output directory.
    let fresh_scratch = scratch("3");
    d.create(sandbox(
        "fresh",
        inputs(&fresh_scratch, 10..50, "src/odd-b.c"),
    ));
    assert_eq!(links(&second), links(&fresh_scratch));
    assert_eq!(listing(&second), listing(&fresh_scratch));
    assert_eq!(links(&second).len(), 40 + 3 + 2);
    let stats = fx.stats_now(&d);
    assert_eq!(stats["built"]["stash"], 1, "no stash was left: {stats}");
    d.destroy("second");
    d.destroy("fresh");
    assert_eq!(listing(&second), ["out"]);
    assert_eq!(d.terminate(), BY_SIGTERM);
    // The stashes went with the daemon.
    let left: Vec<_> = fs::read_dir(base.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left.len(), 3, "{left:?}");
}
