//! What `actionfs serve` keeps for later: native trees stashed and built
//! from again where a directory's ctime can be trusted, and, with
//! `--keep_state=on`, what a backend whose stdin closes hands on to the
//! next on its base (its store, where its looks found files, its
//! directory blobs, its stashed trees) and what that one adopts. A signal
//! hands nothing on.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use actionfs_protocol::backend::reapi;
use actionfs_protocol::backend::sandbox;
use actionfs_testkit::backend::{Backend, Place, NATIVE_BELOW, WS};
use actionfs_testkit::serve::{state_dir_name, warm_dir_name, LOGGED};
use actionfs_testkit::signal_of;
use actionfs_testkit::tier::{require, Need};

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

/// With `--keep_state=on` (the default), a backend whose stdin closes
/// hands its store's content on below the base, and the next backend
/// there adopts it: a tree's inputs are served though their default
/// places are gone. A signal hands nothing on; `--keep_state=off` neither
/// adopts nor hands on.
#[test]
fn closing_stdin_hands_the_store_on_and_the_next_backend_adopts_it() {
    if !require(&[Need::Mount]) {
        return;
    }
    let place = Place::new();
    let warm = place.base().join(warm_dir_name());
    let tree = place.inputs_tree(3);
    let serve_the_tree = |b: &Backend, id: &str| b.serve_inputs_tree(&tree, id, (3, 1));

    let mut killed = Backend::start_in(&place, "killed", &[NATIVE_BELOW]);
    serve_the_tree(&killed, "k");
    killed.signal(libc::SIGTERM);
    assert_eq!(signal_of(killed.wait()), Some(libc::SIGTERM));
    assert!(!warm.exists(), "a signal hands nothing on");

    let first = Backend::start_in(&place, "first", &[NATIVE_BELOW]);
    serve_the_tree(&first, "1");
    first.close_sharing_base();
    assert!(
        warm.join("index").is_file(),
        "handed on: {:?}",
        place.names_on_base()
    );
    assert_eq!(place.names_on_base(), Vec::<String>::new());

    // The default places go: only adopted content can serve the tree.
    fs::remove_dir_all(place.exec_root().join(WS).join("in3")).unwrap();
    let off = Backend::start_in(&place, "off", &[NATIVE_BELOW, "--keep_state=off"]);
    off.push_tree(&tree);
    match off
        .client()
        .create("o", place.manifest(&tree, &[("/ws/out/o", "file")]))
        .unwrap()
        .outcome
    {
        Some(sandbox::create::result::Outcome::Error(e)) => {
            assert!(
                e.message.contains("missing from its default place"),
                "{}",
                e.message
            )
        }
        other => panic!("--keep_state=off adopted? {other:?}\n{}", off.log()),
    }
    off.close_sharing_base();
    assert!(
        warm.join("index").is_file(),
        "--keep_state=off leaves others' state alone"
    );

    let second = Backend::start_in(&place, "second", &[NATIVE_BELOW]);
    assert!(
        second.log().contains("adopted 3 inputs"),
        "{}",
        second.log()
    );
    assert!(!warm.exists(), "taken by the second backend");
    serve_the_tree(&second, "2");
    second.close_sharing_base();
    assert!(warm.join("index").is_file(), "handed on again");
}

/// Where a backend's looks at default places found files is handed on as
/// its stdin closes; the next backend of the same workspace looks at each
/// again as it starts (a file changed meanwhile is found changed), takes
/// the list, and hands on its own; one of another workspace does not look.
/// A signal hands nothing on; a damaged list is refused.
#[test]
fn where_looks_found_files_is_handed_on_and_looked_at_again() {
    if !require(&[Need::Mount]) {
        return;
    }
    let place = Place::new();
    let looks = place.base().join(state_dir_name()).join("looks");
    let tree = place.inputs_tree(3);
    // Nothing captured: every input is looked at where it is.
    let options = [NATIVE_BELOW, "--capture_below=0"];

    let first = Backend::start_in(&place, "first", &options);
    first.serve_inputs_tree(&tree, "1", (3, 1));
    first.close_sharing_base();
    assert!(
        looks.is_file(),
        "{:?}",
        fs::read_dir(place.base()).unwrap().collect::<Vec<_>>()
    );

    // Grown while no backend watched: found so by the look again.
    let changed = place.exec_root().join(WS).join("in3/f2");
    let bytes = fs::read(&changed).unwrap();
    fs::write(&changed, b"grown while handed on\n").unwrap();
    let mut second = Backend::start_in(&place, "second", &options);
    assert!(
        second.logs(
            "looked again at 3 files in 1 directories a previous backend found: 2 still there"
        ),
        "{}",
        second.log()
    );
    assert!(!looks.exists(), "taken by the second backend");
    fs::write(&changed, &bytes).unwrap();
    second.serve_inputs_tree(&tree, "2", (3, 2));
    second.signal(libc::SIGTERM);
    assert_eq!(signal_of(second.wait()), Some(libc::SIGTERM));
    assert!(!looks.exists(), "a signal hands nothing on");

    let third = Backend::start_in(&place, "third", &options);
    third.serve_inputs_tree(&tree, "3", (3, 0));
    third.close_sharing_base();
    let fourth = Backend::start_in(&place, "fourth", &options);
    assert!(fourth.logs("3 still there"), "{}", fourth.log());
    fourth.close_sharing_base();

    // A backend of another workspace does not look at this one's.
    let other = Backend::start_with(&place, "other", "other", &options, LOGGED);
    assert!(other.logs("are of another workspace"), "{}", other.log());
    assert!(!other.log().contains("still there"), "{}", other.log());
    other.close_sharing_base();
    assert!(!looks.exists(), "taken, and nothing looked at to hand on");

    // A damaged list is not looked at, says why, and goes.
    fs::write(&looks, b"actionfs looks 1\n/ws\x00/d\x00many\x00").unwrap();
    let fifth = Backend::start_in(&place, "fifth", &options);
    assert!(
        fifth.logs("not looked at again") && fifth.log().contains("a number that is none"),
        "{}",
        fifth.log()
    );
    fifth.close_sharing_base();
    assert!(
        !looks.exists(),
        "a backend that looked at nothing hands nothing on"
    );
}

/// The directory blobs a backend held are handed on as its stdin closes;
/// the next backend keeps and decodes them as it starts, so that a Create
/// of the same tree is answered though nothing was pushed to that backend
/// (one that did not take them answers MissingContent). A signal hands
/// nothing on; a damaged list is refused whole, says why, and goes; a
/// blob that is no directory is refused and not kept.
#[test]
fn directory_blobs_are_handed_on_and_decoded_again() {
    if !require(&[Need::Mount]) {
        return;
    }
    let place = Place::new();
    let directories = place.base().join(state_dir_name()).join("directories");
    let tree = place.inputs_tree(3);

    let first = Backend::start_in(&place, "first", &[NATIVE_BELOW]);
    first.serve_inputs_tree(&tree, "1", (3, 1));
    first.close_sharing_base();
    assert!(directories.is_file(), "{:?}", place.names_on_base());

    let mut second = Backend::start_in(&place, "second", &[NATIVE_BELOW]);
    let held = tree.blobs.len();
    assert!(
        second.logs(&format!(
            "decoded {held} of {held} directories a previous backend held"
        )),
        "{}",
        second.log()
    );
    assert!(!directories.exists(), "taken by the second backend");
    // Nothing pushed: the tree's directories are the predecessor's.
    let root = second.create_ok("2", place.manifest(&tree, &[("/ws/out/o", "file")]));
    let read = fs::read_to_string(root.join(WS).join("in3/f2")).unwrap();
    assert_eq!(read, "input 2 of 3\n");
    assert!(second.client().destroy("2").is_ok());
    second.signal(libc::SIGTERM);
    assert_eq!(signal_of(second.wait()), Some(libc::SIGTERM));
    assert!(!directories.exists(), "a signal hands nothing on");

    let third = Backend::start_in(&place, "third", &[NATIVE_BELOW]);
    match third
        .client()
        .create("3", place.manifest(&tree, &[("/ws/out/o", "file")]))
        .unwrap()
        .outcome
    {
        Some(sandbox::create::result::Outcome::MissingContent(missing)) => {
            assert!(missing.digest_hashes.contains(&tree.root.hash))
        }
        other => panic!("nothing handed on, yet {other:?}\n{}", third.log()),
    }
    third.serve_inputs_tree(&tree, "3", (3, 0));
    third.close_sharing_base();
    assert!(directories.is_file(), "handed on again");

    let cut = fs::read(&directories).unwrap();
    fs::write(&directories, &cut[..cut.len() - 1]).unwrap();
    let fourth = Backend::start_in(&place, "fourth", &[NATIVE_BELOW]);
    assert!(
        fourth.logs("directories handed on are not decoded again")
            && fourth.log().contains("longer than the file"),
        "{}",
        fourth.log()
    );
    assert!(!directories.exists(), "a damaged list goes");
    fourth.close_sharing_base();
    assert!(
        !directories.exists(),
        "a backend that held no directory hands nothing on"
    );

    // A blob that is no Directory is refused, and not kept: nothing to
    // hand on again.
    let mut list = b"actionfs directories 1\n".to_vec();
    list.extend_from_slice(&2u64.to_le_bytes());
    list.extend_from_slice(b"\xff\xff");
    fs::write(&directories, list).unwrap();
    let fifth = Backend::start_in(&place, "fifth", &[NATIVE_BELOW]);
    assert!(
        fifth.logs("decoded 0 of 1 directories")
            && fifth.log().contains("a directory handed on is refused"),
        "{}",
        fifth.log()
    );
    fifth.close_sharing_base();
    assert!(!directories.exists(), "the refused blob was kept");
}

/// A backend whose stdin closes hands the native trees it stashed on to
/// the next backend on the base, which builds its first sandbox of the
/// same tree from one (reading the right bytes); a stash changed while
/// handed on is not adopted. The store stays at the same paths in the
/// claimed state directory, which a second backend running at once
/// cannot claim (it keeps its store to itself and still works), and
/// which a killed backend's successor claims again.
#[test]
fn stashed_trees_are_handed_on_to_the_next_backend() {
    if !require(&[Need::Mount]) {
        return;
    }
    let place = Place::new();
    let state = place.base().join(state_dir_name());
    // 40 inputs: enough to be stashed; every sandbox native.
    let tree = place.inputs_tree(40);
    let native = "--native_below=1000";
    let built = |b: &Backend, how: &str| b.stats()["built"][how].as_u64().unwrap();
    let serve_the_tree = |b: &Backend, id: &str| b.serve_inputs_tree(&tree, id, (40, 7));

    let first = Backend::start_in(&place, "first", &[native]);
    serve_the_tree(&first, "1");
    // Running at once: the state directory is the first's.
    let beside = Backend::start_in(&place, "beside", &[native]);
    assert!(
        beside.log().contains("another backend keeps its state"),
        "{}",
        beside.log()
    );
    serve_the_tree(&beside, "b");
    beside.close_sharing_base();
    first.close_sharing_base();
    let handed = state.join("stashes");
    assert!(
        handed.join("index").is_file(),
        "{:?}",
        fs::read_dir(&state).unwrap().collect::<Vec<_>>()
    );
    assert!(handed.join("stash-0").is_dir());

    let second = Backend::start_in(&place, "second", &[native]);
    serve_the_tree(&second, "2");
    assert_eq!(
        (built(&second, "stash"), built(&second, "native")),
        (1, 0),
        "built from the stash handed on: {}",
        second.stats()["built"]
    );
    assert!(!handed.exists(), "adopted, so taken");
    second.close_sharing_base();

    // A stash changed while handed on is not believed.
    fs::write(handed.join("stash-0").join("intruder"), "x").unwrap();
    let third = Backend::start_in(&place, "third", &[native]);
    serve_the_tree(&third, "3");
    assert_eq!(
        (built(&third, "stash"), built(&third, "native")),
        (0, 1),
        "a changed stash is built afresh: {}",
        third.stats()["built"]
    );

    // Killed: its claim dies with it; the next backend claims and works.
    let mut third = third;
    third.signal(libc::SIGKILL);
    third.wait();
    let fourth = Backend::start_in(&place, "fourth", &[native]);
    assert!(
        !fourth.log().contains("another backend keeps its state"),
        "{}",
        fourth.log()
    );
    serve_the_tree(&fourth, "4");
    fourth.close_sharing_base();
}
