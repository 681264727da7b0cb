//! The native materializer on real file systems: each method, the safety
//! promises (no symlink followed, nothing half-made, nothing outside the
//! tree removed), the trash, and the `materialize`/`rmtree` subcommands.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use actionfs::sandbox::layout::{self, Entry};
use actionfs::sandbox::materialize::{self, Made, Method, Options, Trash};
use actionfs_protocol::ResolvedMapping;
use actionfs_testkit::tier::{self, require, Need};
use actionfs_testkit::*;

fn mapping(path: &str, underlying: &Path, writable: bool) -> ResolvedMapping {
    ResolvedMapping {
        path: path.into(),
        underlying: underlying.into(),
        writable,
    }
}

fn plan(mappings: &[ResolvedMapping]) -> Entry {
    layout::plan(mappings, Path::new("/nonexistent-mount"), None).unwrap()
}

/// A source tree: files at two levels, a relative symlink, and a symlink
/// pointing out of the tree.
fn source_tree(fx: &Fixture) -> PathBuf {
    fx.write("src/sandbox/tree/a.txt", "a");
    fx.write("src/sandbox/tree/sub/b.txt", "b");
    fx.write("src/sandbox/tree/sub/deeper/c.txt", "c");
    std::os::unix::fs::symlink("a.txt", fx.path("src/sandbox/tree/rel")).unwrap();
    std::os::unix::fs::symlink("/etc", fx.path("src/sandbox/tree/out")).unwrap();
    fx.path("src/sandbox/tree")
}

fn materialize(layout: &Entry, dest: &Path, method: Method) -> materialize::Materialized {
    materialize::materialize(layout, dest, Options { method, threads: 2 })
        .unwrap_or_else(|err| panic!("{method:?}: {err}"))
}

#[test]
fn every_method_builds_the_same_view() {
    let fx = Fixture::new();
    let tree = source_tree(&fx);
    let single = fx.write("src/single.txt", "single");
    let layout = plan(&[
        mapping("/t", &tree, false),
        mapping("/in/single.txt", &single, false),
    ]);
    for method in [
        Method::Symlink,
        Method::Hardlink,
        Method::Copy,
        Method::Auto,
    ] {
        let dest = fx.path(&format!("dest-{}", method.name()));
        let made = materialize(&layout, &dest, method);
        for (rel, content) in [
            ("t/a.txt", "a"),
            ("t/sub/b.txt", "b"),
            ("t/sub/deeper/c.txt", "c"),
            ("t/rel", "a"),
            ("in/single.txt", "single"),
        ] {
            assert_eq!(
                fs::read_to_string(dest.join(rel)).unwrap(),
                content,
                "{method:?} {rel}"
            );
        }
        let view = fs::symlink_metadata(dest.join("in/single.txt")).unwrap();
        let source = fs::metadata(&single).unwrap();
        match method {
            Method::Symlink => assert!(view.file_type().is_symlink()),
            Method::Hardlink | Method::Auto => assert_eq!(view.ino(), source.ino()),
            Method::Copy => {
                assert!(view.is_file());
                assert_ne!(view.ino(), source.ino());
                assert_eq!(view.mode(), source.mode());
            }
            Method::Clone => unreachable!(),
        }
        if method == Method::Auto {
            assert_eq!(made.report.made(Made::Hardlink), 4, "{}", made.report);
        }
    }
}

#[test]
fn symlinks_are_recreated_never_followed() {
    let fx = Fixture::new();
    let tree = source_tree(&fx);
    std::os::unix::fs::symlink("../tree", fx.path("src/top-link")).unwrap();
    let layout = plan(&[
        mapping("/t", &tree, false),
        mapping("/top", &fx.path("src/top-link"), false),
    ]);
    for method in [Method::Hardlink, Method::Copy] {
        let dest = fx.path(&format!("dest-{}", method.name()));
        let made = materialize(&layout, &dest, method);
        for (rel, target) in [("t/rel", "a.txt"), ("t/out", "/etc"), ("top", "../tree")] {
            let meta = fs::symlink_metadata(dest.join(rel)).unwrap();
            assert!(
                meta.file_type().is_symlink(),
                "{method:?}: {rel} must stay a symlink"
            );
            assert_eq!(fs::read_link(dest.join(rel)).unwrap(), Path::new(target));
        }
        assert_eq!(made.report.made(Made::CopiedSymlink), 3);
    }
}

#[test]
fn nested_mappings_in_a_writable_directory_are_made_in_place_and_removed_exactly() {
    let fx = Fixture::new();
    let scratch = fx.path("scratch");
    fx.write("scratch/keep.txt", "owner's");
    fs::create_dir_all(scratch.join("out/bin")).unwrap();
    let input = fx.write("src/input.txt", "input");
    let layout = plan(&[
        mapping("/ws", &scratch, true),
        mapping("/ws/out/bin/gen.txt", &input, false),
        mapping("/ws/in/deep/x.txt", &input, false),
    ]);
    let dest = fx.path("dest");
    let made = materialize(&layout, &dest, Method::Hardlink);
    // The action sees one tree, and writes land in the scratch directory.
    assert_eq!(
        fs::read_to_string(dest.join("ws/out/bin/gen.txt")).unwrap(),
        "input"
    );
    assert_eq!(
        fs::read_to_string(dest.join("ws/in/deep/x.txt")).unwrap(),
        "input"
    );
    fs::write(dest.join("ws/out/bin/result.txt"), "output").unwrap();
    assert_eq!(
        fs::read_to_string(scratch.join("out/bin/result.txt")).unwrap(),
        "output"
    );
    let mut in_place: Vec<_> = made.in_place.iter().map(|e| e.path()).collect();
    in_place.sort();
    assert_eq!(
        in_place,
        [scratch.join("in"), scratch.join("out/bin/gen.txt")]
    );

    materialize::teardown(&made, None).unwrap();
    assert!(!dest.exists());
    assert_eq!(names(&scratch), ["keep.txt", "out"]);
    assert_eq!(
        names(&scratch.join("out/bin")),
        ["result.txt"],
        "the output is the owner's"
    );
    assert_eq!(fs::read_to_string(&input).unwrap(), "input");
}

#[test]
fn a_failure_part_way_leaves_nothing_behind() {
    let fx = Fixture::new();
    let scratch = fx.path("scratch");
    fs::create_dir_all(scratch.join("out")).unwrap();
    fx.write("scratch/taken.txt", "owner's");
    let tree = source_tree(&fx);
    let input = fx.write("src/input.txt", "input");

    // The destination's parent is a file.
    let blocker = fx.write("blocker", "file");
    let err = materialize::materialize(
        &plan(&[mapping("/a", &input, false)]),
        &blocker.join("dest"),
        Options::default(),
    )
    .unwrap_err();
    assert_eq!(
        (err.syscall, err.source.raw_os_error()),
        ("lstat", Some(libc::ENOTDIR))
    );
    assert_eq!(err.path, blocker.join("dest"));
    assert!(
        err.to_string().contains("lstat") && err.to_string().contains("blocker"),
        "{err}"
    );

    // A nested mapping would have to hide an entry of the owner's: found
    // only after other entries were made, in place and under DEST.
    let layout = plan(&[
        mapping("/ws", &scratch, true),
        mapping("/ws/out/made-first.txt", &input, false),
        mapping("/t", &tree, false),
        mapping("/ws/taken.txt", &input, false),
    ]);
    let dest = fx.path("dest");
    let err = materialize::materialize(
        &layout,
        &dest,
        Options {
            method: Method::Copy,
            threads: 2,
        },
    )
    .unwrap_err();
    assert_eq!(err.path, scratch.join("taken.txt"), "{err}");
    assert!(!dest.exists(), "DEST must be gone after a failure");
    assert_eq!(names(&scratch), ["out", "taken.txt"]);
    assert!(
        names(&scratch.join("out")).is_empty(),
        "in-place entries must be undone"
    );

    // A source that vanishes after planning.
    let doomed = fx.write("src/doomed.txt", "d");
    let layout = plan(&[
        mapping("/t", &tree, false),
        mapping("/z/doomed.txt", &doomed, false),
    ]);
    fs::remove_file(&doomed).unwrap();
    fs::create_dir(&dest).unwrap(); // an existing, empty DEST stays, empty
    let err = materialize::materialize(
        &layout,
        &dest,
        Options {
            method: Method::Hardlink,
            threads: 1,
        },
    )
    .unwrap_err();
    assert_eq!(err.syscall, "linkat");
    assert_eq!(err.path, dest.join("z/doomed.txt"));
    assert!(names(&dest).is_empty(), "{:?}", names(&dest));
}

#[test]
fn permission_denied_part_way_is_reported_and_undone() {
    if !require(&[Need::Root]) {
        return;
    }
    // Root ignores permissions, so the command runs as an unprivileged user.
    let fx = Fixture::new();
    let base = fx.dir.path();
    fs::set_permissions(base, fs::Permissions::from_mode(0o777)).unwrap();
    fx.write("src/open/a.txt", "a");
    fx.write("src/locked/secret.txt", "s");
    fs::set_permissions(fx.path("src/locked"), fs::Permissions::from_mode(0o700)).unwrap();
    let spec = format!(
        r#"{{"C":{{"i":"x","m":[{{"p":"/open","u":"{}"}},{{"p":"/zlocked","u":"{}"}}]}}}}"#,
        fx.path("src/open").display(),
        fx.path("src/locked").display()
    );
    fs::write(fx.path("spec.json"), spec).unwrap();
    let dest = fx.path("dest");
    let spec_arg = format!("--spec={}", fx.path("spec.json").display());
    let dest_arg = dest.display().to_string();
    let out = as_nobody(&[bin(), "materialize", "--method=copy", &spec_arg, &dest_arg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("locked") && stderr.contains("Permission denied"),
        "{stderr}"
    );
    assert!(!dest.exists(), "DEST must not be left half-made");
}

#[test]
fn escaping_paths_are_refused_before_anything_is_made() {
    let fx = Fixture::new();
    let input = fx.write("src/in", "x");
    let dest = fx.path("dest");
    for bad in ["/a/../../escape", "relative", "/a//b"] {
        let spec = format!(
            r#"{{"C":{{"i":"x","m":[{{"p":"/ok","u":"{0}"}},{{"p":"{bad}","u":"{0}"}}]}}}}"#,
            input.display()
        );
        let out = Command::new(bin())
            .args(["materialize", "--spec=-"])
            .arg(&dest)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child.stdin.take().unwrap().write_all(spec.as_bytes())?;
                child.wait_with_output()
            })
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains(bad));
        assert!(!dest.exists(), "{bad}: nothing may be created");
    }
}

#[test]
fn teardown_never_follows_symlinks_and_refuses_roots() {
    let fx = Fixture::new();
    let outside = fx.write("outside/precious.txt", "keep me");
    let victim = fx.path("victim");
    fs::create_dir_all(victim.join("d")).unwrap();
    std::os::unix::fs::symlink(fx.path("outside"), victim.join("d/link-to-outside")).unwrap();
    std::os::unix::fs::symlink(&outside, victim.join("file-link")).unwrap();
    let removed = materialize::remove_tree(&victim).unwrap();
    assert_eq!((removed.dirs, removed.others), (2, 2));
    assert!(!victim.exists());
    assert_eq!(fs::read_to_string(&outside).unwrap(), "keep me");

    // A symlink given as the tree is removed as a link.
    std::os::unix::fs::symlink(fx.path("outside"), fx.path("alias")).unwrap();
    materialize::remove_tree(&fx.path("alias")).unwrap();
    assert_eq!(fs::read_to_string(&outside).unwrap(), "keep me");

    assert!(materialize::remove_tree(Path::new("/")).is_err());
    assert!(materialize::remove_tree(&fx.path("outside/..")).is_err());
    let base = fx.path("trash");
    for escaping in [fx.path("outside"), base.join("../outside"), base.clone()] {
        assert!(
            materialize::remove_tree_within(&base, &escaping).is_err(),
            "{escaping:?}"
        );
    }
    assert!(fx.path("outside").exists());
    let out = Command::new(bin()).args(["rmtree", "/"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
}

/// Entries are removed while their directory is listed, a 32 KiB
/// `getdents64` at a time: a directory of many such batches, with a
/// subdirectory of many more, is removed whole, each entry counted once.
#[test]
fn directories_larger_than_one_listing_are_removed_whole() {
    let fx = Fixture::new();
    let victim = fx.path("big");
    let long = "x".repeat(150);
    fs::create_dir_all(victim.join("sub")).unwrap();
    for n in 0..1500 {
        fs::write(victim.join(format!("{long}{n}")), "").unwrap();
        std::os::unix::fs::symlink("nowhere", victim.join(format!("sub/{long}{n}"))).unwrap();
    }
    let removed = materialize::remove_tree(&victim).unwrap();
    assert_eq!((removed.dirs, removed.others), (2, 3000));
    assert!(!victim.exists());
}

#[test]
fn rmtree_grants_itself_access_only_where_refused() {
    if !require(&[Need::Root]) {
        return;
    }
    // As an unprivileged owner: a read-only directory blocks unlink until
    // rmtree adds write permission to it.
    let fx = Fixture::new();
    let tree = fx.path("tree");
    fs::create_dir_all(tree.join("ro/inner")).unwrap();
    fs::write(tree.join("ro/inner/f"), "f").unwrap();
    fs::write(tree.join("ro/g"), "g").unwrap();
    Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(&tree)
        .status()
        .unwrap();
    fs::set_permissions(fx.dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
    fs::set_permissions(tree.join("ro/inner"), fs::Permissions::from_mode(0o500)).unwrap();
    fs::set_permissions(tree.join("ro"), fs::Permissions::from_mode(0o500)).unwrap();
    let tree_arg = tree.display().to_string();
    let out = as_nobody(&[bin(), "rmtree", "-v", &tree_arg]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("3 directories and 2 other entries"));
    assert!(!tree.exists());
}

#[test]
fn the_trash_makes_a_tree_vanish_at_once_and_empties_in_the_background() {
    let fx = Fixture::new();
    let trash_dir = fx.path("sandboxes/.trash");
    // Leftovers of a crash are emptied when the trash is opened.
    fx.write("sandboxes/.trash/left-over/deep/file", "x");
    let trash = Trash::open(&trash_dir, 2).unwrap();
    for n in 0..5 {
        let tree = fx.path(&format!("sandboxes/s{n}"));
        for f in 0..50 {
            fx.write(&format!("sandboxes/s{n}/d{}/f{f}", f % 5), "x");
        }
        trash.discard(&tree).unwrap();
        assert!(!tree.exists(), "gone from view when discard returns");
    }
    trash.wait_idle();
    assert!(names(&trash_dir).is_empty(), "{:?}", names(&trash_dir));
    assert_eq!(names(&fx.path("sandboxes")), [".trash"]);
}

#[test]
fn auto_falls_back_across_file_systems_and_says_so() {
    // /dev/shm is tmpfs, the fixture is elsewhere: no hard link, no clone.
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let fx = Fixture::new();
    if fs::metadata(shm.path()).unwrap().dev() == fs::metadata(fx.dir.path()).unwrap().dev() {
        tier::skip("/dev/shm and the test directory are on one file system");
        return;
    }
    let input = shm.path().join("input.txt");
    fs::write(&input, "across").unwrap();
    let layout = plan(&[mapping("/a", &input, false)]);
    let made = materialize(&layout, &fx.path("auto"), Method::Auto);
    assert_eq!(made.report.made(Made::Symlink), 1, "{}", made.report);
    assert_eq!(fs::read_to_string(fx.path("auto/a")).unwrap(), "across");
    let err = materialize::materialize(
        &layout,
        &fx.path("hard"),
        Options {
            method: Method::Hardlink,
            threads: 1,
        },
    )
    .unwrap_err();
    assert_eq!(err.source.raw_os_error(), Some(libc::EXDEV));
    assert!(!fx.path("hard").exists());
}

#[test]
fn clone_makes_independent_copies_on_a_reflink_filesystem() {
    if !require(&[Need::LoopDevice]) {
        return;
    }
    let xfs = match LoopXfs::new() {
        Ok(xfs) => xfs,
        Err(why) => {
            tier::skip(&format!(
                "no reflink-capable file system could be made here: {why}"
            ));
            return;
        }
    };
    let src = xfs.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("big"), vec![7u8; 1 << 20]).unwrap();
    fs::write(src.join("sub/small"), "small").unwrap();
    fs::set_permissions(src.join("sub/small"), fs::Permissions::from_mode(0o444)).unwrap();
    let layout = plan(&[mapping("/tree", &src, false)]);
    let dest = xfs.path().join("dest");
    let made = materialize(&layout, &dest, Method::Clone);
    assert_eq!(made.report.made(Made::Clone), 2, "{}", made.report);
    let (copy, orig) = (
        fs::metadata(dest.join("tree/sub/small")).unwrap(),
        fs::metadata(src.join("sub/small")).unwrap(),
    );
    assert_ne!(copy.ino(), orig.ino());
    assert_eq!(copy.mode(), orig.mode());
    assert_eq!(fs::read(dest.join("tree/big")).unwrap(), vec![7u8; 1 << 20]);
    // Changing the clone leaves the source alone.
    fs::write(dest.join("tree/big"), "changed").unwrap();
    assert_eq!(fs::metadata(src.join("big")).unwrap().len(), 1 << 20);
}
