//! What a client finds when `actionfs serve` answers Negotiate, how it
//! ends when it is killed, and what the next one on the same sandbox base
//! finds: real backend processes, real mounts, real signals. Bazel sends SIGTERM when a request times out (and never a
//! second), the OOM killer SIGKILL; either may come with actions running
//! inside sandboxes and requests in flight, while the request loop waits
//! on stdin.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use actionfs_protocol::backend::client::Answer;
use actionfs_protocol::backend::digest::digest_of;
use actionfs_protocol::backend::sandbox::{self, Manifest};
use actionfs_protocol::backend::tree::{Tree, TreeBuilder};
use actionfs_testkit::serve::{ServeProcess, LOGGED};
use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::{bin, proc_state, signal_of, transport, wait_for};

const WS: &str = "ws";

/// Where a backend hands its store on to the next of its user
/// (`--keep_state=on`).
fn warm_name() -> String {
    format!("actionfs-warm-{}", nix::unistd::geteuid())
}

/// Where a backend keeps its state while it runs and hands stashed trees
/// on (`--keep_state=on`).
fn state_name() -> String {
    format!("actionfs-state-{}", nix::unistd::geteuid())
}

/// Below this many mappings a sandbox is built natively: the small tree
/// (2 inputs) is native, the large one (40) is in the FUSE view.
const NATIVE_BELOW: &str = "--native_below=10";

/// A sandbox base, and an exec root whose workspace holds the inputs.
struct Place {
    root: tempfile::TempDir,
}

impl Place {
    /// In /var/tmp: below /tmp, writable in Bazel's jail, `serve` builds
    /// no native sandbox.
    fn new() -> Place {
        let root = tempfile::tempdir_in("/var/tmp").unwrap();
        fs::create_dir(root.path().join("base")).unwrap();
        fs::create_dir_all(root.path().join("execroot").join(WS)).unwrap();
        Place { root }
    }

    fn base(&self) -> PathBuf {
        self.root.path().join("base")
    }

    fn exec_root(&self) -> PathBuf {
        self.root.path().join("execroot")
    }

    /// A tree of `files` inputs read from the default place.
    fn tree(&self, files: usize) -> Tree {
        let mut tb = TreeBuilder::new();
        for n in 0..files {
            let rel = format!("in{files}/f{n}");
            let bytes = format!("input {n} of {files}\n");
            let path = self.exec_root().join(WS).join(&rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, &bytes).unwrap();
            tb.add_file(&format!("{WS}/{rel}"), digest_of(bytes.as_bytes()), false)
                .unwrap();
        }
        tb.build()
    }

    /// Pushes `tree` (made by `self.tree(files)`) to `b`, creates sandbox
    /// `id` of it, checks that input `n` reads right there, destroys it.
    fn serve_tree(&self, b: &Backend, tree: &Tree, id: &str, (files, n): (usize, usize)) {
        b.push_tree(tree);
        let root = b.create_ok(id, self.manifest(tree));
        let read = fs::read_to_string(root.join(WS).join(format!("in{files}/f{n}"))).unwrap();
        assert_eq!(read, format!("input {n} of {files}\n"), "{}", b.log());
        assert!(b.client().destroy(id).is_ok());
    }

    fn manifest(&self, tree: &Tree) -> Manifest {
        Manifest {
            mnemonic: "Test".into(),
            exec_root: self.exec_root().display().to_string(),
            hash_function: "SHA-256".into(),
            input_root_digest: Some(tree.root.clone()),
            outputs: [(
                format!("/{WS}/out/o"),
                sandbox::Output {
                    r#type: "file".into(),
                    dest: String::new(),
                },
            )]
            .into(),
            writable_dirs: HashMap::new(),
            confinement_setting: None,
        }
    }

    /// What is on the base but the state a backend keeps and hands on to
    /// the next (`actionfs-warm-UID` and `actionfs-state-UID`, the
    /// subjects of their own tests).
    fn backends_on_base(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.base())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| *name != warm_name() && *name != state_name())
            .collect();
        names.sort();
        names
    }

    /// The mounts below the base, from /proc/mounts.
    fn mounts_below_base(&self) -> Vec<String> {
        let base = self.base().display().to_string();
        fs::read_to_string("/proc/mounts")
            .unwrap()
            .lines()
            .filter_map(|line| line.split(' ').nth(1))
            .filter(|mount| mount.starts_with(&base))
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Place {
    /// Whatever a failed test left mounted goes, so that the temporary
    /// directory can.
    fn drop(&mut self) {
        for mount in self.mounts_below_base() {
            let _ = Command::new("umount").args(["-l", &mount]).status();
        }
    }
}

/// One `actionfs serve` on a place's base; killed if the test ends first.
struct Backend(ServeProcess);

/// The process's own methods (client, log, signal, wait...) are the
/// backend's.
impl std::ops::Deref for Backend {
    type Target = ServeProcess;
    fn deref(&self) -> &ServeProcess {
        &self.0
    }
}

impl std::ops::DerefMut for Backend {
    fn deref_mut(&mut self) -> &mut ServeProcess {
        &mut self.0
    }
}

impl Backend {
    fn start(place: &Place, name: &str, options: &[&str]) -> Backend {
        Backend::start_for(place, WS, name, options)
    }

    /// A backend of workspace `ws` (another output base's, say).
    fn start_for(place: &Place, ws: &str, name: &str, options: &[&str]) -> Backend {
        let log = place.root.path().join(format!("{name}.log"));
        let serve = ServeProcess::spawn(bin(), &place.exec_root().join(ws), Some(&log), LOGGED);
        serve.negotiate_or_panic(&place.base(), transport(), options);
        Backend(serve)
    }

    /// Whether `what` shows in the log within 10 s (work done on a
    /// thread of the backend's own as it starts).
    fn logs(&self, what: &str) -> bool {
        wait_for(Duration::from_secs(10), || self.log().contains(what))
    }

    /// Closes stdin, as Bazel does at the end, and expects exit 0.
    fn close(mut self) {
        drop(self.close_input());
        let status = self.wait();
        assert!(status.success(), "{status:?}\n{}", self.log());
    }
}

/// A process standing for an action that runs inside a sandbox: its
/// working directory there keeps the mount busy. Killed when dropped.
struct Action(Child);

impl Action {
    fn inside(dir: &Path) -> Action {
        Action(
            Command::new("sleep")
                .arg("600")
                .current_dir(dir)
                .spawn()
                .unwrap(),
        )
    }
}

impl Drop for Action {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// 20 live sandboxes, 10 native and 10 in the FUSE view (each kind shown
/// to be what it is), an action running in one of each, and 10 Creates
/// sent whose answers may not have come.
fn busy_build(place: &Place, b: &Backend) -> (Vec<Action>, Vec<Receiver<Answer>>) {
    let small = place.tree(2);
    let large = place.tree(40);
    b.push_tree(&small);
    b.push_tree(&large);
    let mut actions = Vec::new();
    for n in 0..20 {
        let (tree, native) = if n % 2 == 0 {
            (&small, true)
        } else {
            (&large, false)
        };
        let root = b.create_ok(&format!("s{n}"), place.manifest(tree));
        // A native sandbox's root in the mount is a link to its tree.
        let is_link = fs::symlink_metadata(&root)
            .unwrap()
            .file_type()
            .is_symlink();
        assert_eq!(is_link, native, "s{n}: native {native}, root {root:?}");
        if n < 2 {
            actions.push(Action::inside(&root.join(WS)));
        }
    }
    let in_flight = (20..30)
        .map(|n| b.send_create(&format!("s{n}"), place.manifest(&large)))
        .collect();
    (actions, in_flight)
}

/// Negotiate is answered once every request thread runs: the client's
/// first requests, sent on that answer, find none still starting.
#[test]
fn negotiate_is_answered_once_every_request_thread_runs() {
    if !require(&[Need::Mount]) {
        return;
    }
    let place = Place::new();
    for _ in 0..3 {
        let b = Backend::start(&place, "threads", &["--reconfig_threads=6"]);
        let threads: Vec<String> = fs::read_dir(format!("/proc/{}/task", b.pid()))
            .unwrap()
            .filter_map(|task| fs::read_to_string(task.unwrap().path().join("comm")).ok())
            .filter(|name| name.starts_with("serve-"))
            .collect();
        // Six apply, and one more reads meanwhile: the main one.
        assert_eq!(threads.len(), 6, "{threads:?}\n{}", b.log());
        b.close();
    }
}

#[test]
fn sigterm_and_sigint_mid_build_unmount_remove_the_base_and_exit_by_the_signal() {
    if !require(&[Need::Mount]) {
        return;
    }
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let place = Place::new();
        let mut b = Backend::start(&place, "backend", &[NATIVE_BELOW]);
        let (actions, _in_flight) = busy_build(&place, &b);
        // The request loop now waits on stdin, which stays open.
        b.signal(signal);
        let status = b.wait();
        assert_eq!(
            signal_of(status),
            Some(signal),
            "signal {signal}: {status:?}\n{}",
            b.log()
        );
        assert_eq!(
            place.mounts_below_base(),
            Vec::<String>::new(),
            "signal {signal}: a mount is left\n{}",
            b.log()
        );
        assert_eq!(
            place.backends_on_base(),
            Vec::<String>::new(),
            "signal {signal}: the base is left\n{}",
            b.log()
        );
        drop(actions);
    }
}

/// The watcher process of a backend: its only child (forked once the
/// mount serves), found through every thread's list of children.
fn watcher_of(pid: u32) -> Option<u32> {
    let mut children = Vec::new();
    for task in fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let list = fs::read_to_string(task.ok()?.path().join("children")).unwrap_or_default();
        children.extend(list.split_whitespace().map(|c| c.parse::<u32>().unwrap()));
    }
    match children[..] {
        [one] => Some(one),
        _ => None,
    }
}

/// The line a backend prints when it removed what dead ones left.
fn removed_line(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("dead backend")).collect()
}

#[test]
fn sigkill_mid_build_the_watcher_detaches_the_mount_and_the_next_backend_cleans_up_and_serves() {
    if !require(&[Need::Mount]) {
        return;
    }
    let place = Place::new();
    let mut dead = Backend::start(&place, "dead", &[NATIVE_BELOW]);
    let (actions, _in_flight) = busy_build(&place, &dead);
    let dead_dir = dead.dir_name();
    dead.signal(libc::SIGKILL);
    assert_eq!(signal_of(dead.wait()), Some(libc::SIGKILL));
    // A wait, not a timing check: the watcher runs at the backend's death.
    assert!(
        wait_for(Duration::from_secs(10), || place
            .mounts_below_base()
            .is_empty()),
        "the dead backend's mount is left: {:?}",
        place.mounts_below_base()
    );
    drop(actions);
    assert_eq!(place.backends_on_base(), [dead_dir.as_str()]);

    let next = Backend::start(&place, "next", &[NATIVE_BELOW]);
    let log = next.log();
    assert_eq!(
        removed_line(&log),
        [format!(
            "actionfs serve: removed what 1 dead backend left in {} ({dead_dir})",
            place.base().display()
        )],
        "{log}"
    );
    assert_eq!(place.backends_on_base(), [next.dir_name()]);
    let tree = place.tree(40);
    next.push_tree(&tree);
    let root = next.create_ok("again", place.manifest(&tree));
    assert_eq!(
        fs::read_to_string(root.join(WS).join("in40/f7")).unwrap(),
        "input 7 of 40\n"
    );
    next.close();
    assert_eq!(place.backends_on_base(), Vec::<String>::new());
    assert_eq!(place.mounts_below_base(), Vec::<String>::new());
}

#[test]
fn a_stale_mount_a_dead_backend_left_is_unmounted_by_the_next() {
    if !require(&[Need::Mount]) {
        return;
    }
    let place = Place::new();
    let mut dead = Backend::start(&place, "dead", &["--native_below=0"]);
    let tree = place.tree(3);
    dead.push_tree(&tree);
    dead.create_ok("s", place.manifest(&tree));
    let dead_dir = dead.dir_name();
    // Its watcher killed first, the mount stays behind, disconnected.
    let watcher = watcher_of(dead.pid()).expect("the backend has one watcher");
    // SAFETY: kill with a valid signal number has no memory effects.
    assert_eq!(unsafe { libc::kill(watcher as i32, libc::SIGKILL) }, 0);
    // Dead, if not yet reaped (a zombie until its parent dies too).
    assert!(wait_for(Duration::from_secs(10), || {
        proc_state(Path::new(&format!("/proc/{watcher}/stat"))).is_none_or(|state| state == 'Z')
    }));
    dead.signal(libc::SIGKILL);
    dead.wait();
    let mnt = place.base().join(&dead_dir).join("mnt");
    // ENOTCONN on /dev/fuse; a connection served by io_uring is aborted.
    let stale = fs::metadata(&mnt).map_err(|e| e.raw_os_error()).err();
    assert!(
        matches!(stale, Some(Some(libc::ENOTCONN | libc::ECONNABORTED))),
        "{mnt:?} is not a stale mount: {stale:?}"
    );

    let next = Backend::start(&place, "next", &[]);
    assert_eq!(removed_line(&next.log()).len(), 1, "{}", next.log());
    assert_eq!(place.backends_on_base(), [next.dir_name()]);
    let mounts = place.mounts_below_base();
    assert!(
        mounts.iter().all(|m| !m.contains(&dead_dir)),
        "the stale mount is left: {mounts:?}"
    );
    next.close();
    assert_eq!(place.backends_on_base(), Vec::<String>::new());
}

#[test]
fn a_live_backend_on_the_same_base_is_never_touched() {
    if !require(&[Need::Mount]) {
        return;
    }
    let place = Place::new();
    let first = Backend::start(&place, "first", &[NATIVE_BELOW]);
    let (small, large) = (place.tree(2), place.tree(40));
    first.push_tree(&small);
    first.push_tree(&large);
    let native = first.create_ok("native", place.manifest(&small));
    let fuse = first.create_ok("fuse", place.manifest(&large));

    let second = Backend::start(&place, "second", &[NATIVE_BELOW]);
    assert_eq!(removed_line(&second.log()), Vec::<&str>::new());
    second.push_tree(&large);
    let other = second.create_ok("fuse", place.manifest(&large));
    let mut both = vec![first.dir_name(), second.dir_name()];
    both.sort();
    assert_eq!(place.backends_on_base(), both);
    // Both serve at once, each its own sandboxes.
    for root in [&native, &fuse, &other] {
        let file = if root == &native { "in2/f1" } else { "in40/f1" };
        assert!(
            fs::read_to_string(root.join(WS).join(file))
                .unwrap()
                .starts_with("input 1 of "),
            "{root:?}"
        );
    }
    // A third start while both live leaves both too.
    let third = Backend::start(&place, "third", &[]);
    assert_eq!(removed_line(&third.log()), Vec::<&str>::new());
    third.close();
    first.close();
    assert_eq!(place.backends_on_base(), [second.dir_name()]);
    second.close();
    assert_eq!(place.backends_on_base(), Vec::<String>::new());
    assert_eq!(place.mounts_below_base(), Vec::<String>::new());
}

/// A directory whose lock nobody holds is dead, even where its pid names
/// a live process (pids are reused): here this test's own.
#[test]
fn a_directory_named_for_a_live_pid_but_unlocked_is_dead() {
    if !require(&[Need::Mount]) {
        return;
    }
    let place = Place::new();
    let name = format!("actionfs-serve-{}", std::process::id());
    fs::create_dir_all(place.base().join(&name).join("scratch/s1")).unwrap();
    fs::write(place.base().join(&name).join("scratch/s1/f"), "left").unwrap();
    fs::create_dir(place.base().join("not-a-backend")).unwrap();
    let next = Backend::start(&place, "next", &[]);
    assert_eq!(
        removed_line(&next.log()),
        [format!(
            "actionfs serve: removed what 1 dead backend left in {} ({name})",
            place.base().display()
        )]
    );
    let mut expected = vec![next.dir_name(), "not-a-backend".to_owned()];
    expected.sort();
    assert_eq!(place.backends_on_base(), expected);
    next.close();
    assert_eq!(place.backends_on_base(), ["not-a-backend"]);
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
    let warm = place.base().join(warm_name());
    let tree = place.tree(3);
    let serve_the_tree = |b: &Backend, id: &str| place.serve_tree(b, &tree, id, (3, 1));

    let mut killed = Backend::start(&place, "killed", &[NATIVE_BELOW]);
    serve_the_tree(&killed, "k");
    killed.signal(libc::SIGTERM);
    assert_eq!(signal_of(killed.wait()), Some(libc::SIGTERM));
    assert!(!warm.exists(), "a signal hands nothing on");

    let first = Backend::start(&place, "first", &[NATIVE_BELOW]);
    serve_the_tree(&first, "1");
    first.close();
    assert!(
        warm.join("index").is_file(),
        "handed on: {:?}",
        place.backends_on_base()
    );
    assert_eq!(place.backends_on_base(), Vec::<String>::new());

    // The default places go: only adopted content can serve the tree.
    fs::remove_dir_all(place.exec_root().join(WS).join("in3")).unwrap();
    let off = Backend::start(&place, "off", &[NATIVE_BELOW, "--keep_state=off"]);
    off.push_tree(&tree);
    match off
        .client()
        .create("o", place.manifest(&tree))
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
    off.close();
    assert!(
        warm.join("index").is_file(),
        "--keep_state=off leaves others' state alone"
    );

    let second = Backend::start(&place, "second", &[NATIVE_BELOW]);
    assert!(
        second.log().contains("adopted 3 inputs"),
        "{}",
        second.log()
    );
    assert!(!warm.exists(), "taken by the second backend");
    serve_the_tree(&second, "2");
    second.close();
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
    let looks = place.base().join(state_name()).join("looks");
    let tree = place.tree(3);
    // Nothing captured: every input is looked at where it is.
    let options = [NATIVE_BELOW, "--capture_below=0"];

    let first = Backend::start(&place, "first", &options);
    place.serve_tree(&first, &tree, "1", (3, 1));
    first.close();
    assert!(
        looks.is_file(),
        "{:?}",
        fs::read_dir(place.base()).unwrap().collect::<Vec<_>>()
    );

    // Grown while no backend watched: found so by the look again.
    let changed = place.exec_root().join(WS).join("in3/f2");
    let bytes = fs::read(&changed).unwrap();
    fs::write(&changed, b"grown while handed on\n").unwrap();
    let mut second = Backend::start(&place, "second", &options);
    assert!(
        second.logs(
            "looked again at 3 files in 1 directories a previous backend found: 2 still there"
        ),
        "{}",
        second.log()
    );
    assert!(!looks.exists(), "taken by the second backend");
    fs::write(&changed, &bytes).unwrap();
    place.serve_tree(&second, &tree, "2", (3, 2));
    second.signal(libc::SIGTERM);
    assert_eq!(signal_of(second.wait()), Some(libc::SIGTERM));
    assert!(!looks.exists(), "a signal hands nothing on");

    let third = Backend::start(&place, "third", &options);
    place.serve_tree(&third, &tree, "3", (3, 0));
    third.close();
    let fourth = Backend::start(&place, "fourth", &options);
    assert!(fourth.logs("3 still there"), "{}", fourth.log());
    fourth.close();

    // A backend of another workspace does not look at this one's.
    let other = Backend::start_for(&place, "other", "other", &options);
    assert!(other.logs("are of another workspace"), "{}", other.log());
    assert!(!other.log().contains("still there"), "{}", other.log());
    other.close();
    assert!(!looks.exists(), "taken, and nothing looked at to hand on");

    // A damaged list is not looked at, says why, and goes.
    fs::write(&looks, b"actionfs looks 1\n/ws\x00/d\x00many\x00").unwrap();
    let fifth = Backend::start(&place, "fifth", &options);
    assert!(
        fifth.logs("not looked at again") && fifth.log().contains("a number that is none"),
        "{}",
        fifth.log()
    );
    fifth.close();
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
    let directories = place.base().join(state_name()).join("directories");
    let tree = place.tree(3);

    let first = Backend::start(&place, "first", &[NATIVE_BELOW]);
    place.serve_tree(&first, &tree, "1", (3, 1));
    first.close();
    assert!(directories.is_file(), "{:?}", place.backends_on_base());

    let mut second = Backend::start(&place, "second", &[NATIVE_BELOW]);
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
    let root = second.create_ok("2", place.manifest(&tree));
    let read = fs::read_to_string(root.join(WS).join("in3/f2")).unwrap();
    assert_eq!(read, "input 2 of 3\n");
    assert!(second.client().destroy("2").is_ok());
    second.signal(libc::SIGTERM);
    assert_eq!(signal_of(second.wait()), Some(libc::SIGTERM));
    assert!(!directories.exists(), "a signal hands nothing on");

    let third = Backend::start(&place, "third", &[NATIVE_BELOW]);
    match third
        .client()
        .create("3", place.manifest(&tree))
        .unwrap()
        .outcome
    {
        Some(sandbox::create::result::Outcome::MissingContent(missing)) => {
            assert!(missing.digest_hashes.contains(&tree.root.hash))
        }
        other => panic!("nothing handed on, yet {other:?}\n{}", third.log()),
    }
    place.serve_tree(&third, &tree, "3", (3, 0));
    third.close();
    assert!(directories.is_file(), "handed on again");

    let cut = fs::read(&directories).unwrap();
    fs::write(&directories, &cut[..cut.len() - 1]).unwrap();
    let fourth = Backend::start(&place, "fourth", &[NATIVE_BELOW]);
    assert!(
        fourth.logs("directories handed on are not decoded again")
            && fourth.log().contains("bytes where"),
        "{}",
        fourth.log()
    );
    assert!(!directories.exists(), "a damaged list goes");
    fourth.close();
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
    let fifth = Backend::start(&place, "fifth", &[NATIVE_BELOW]);
    assert!(
        fifth.logs("decoded 0 of 1 directories")
            && fifth.log().contains("a directory handed on is refused"),
        "{}",
        fifth.log()
    );
    fifth.close();
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
    let state = place.base().join(state_name());
    // 40 inputs: enough to be stashed; every sandbox native.
    let tree = place.tree(40);
    let native = "--native_below=1000";
    let built = |b: &Backend, how: &str| b.stats()["built"][how].as_u64().unwrap();
    let serve_the_tree = |b: &Backend, id: &str| place.serve_tree(b, &tree, id, (40, 7));

    let first = Backend::start(&place, "first", &[native]);
    serve_the_tree(&first, "1");
    // Running at once: the state directory is the first's.
    let beside = Backend::start(&place, "beside", &[native]);
    assert!(
        beside.log().contains("another backend keeps its state"),
        "{}",
        beside.log()
    );
    serve_the_tree(&beside, "b");
    beside.close();
    first.close();
    let handed = state.join("stashes");
    assert!(
        handed.join("index").is_file(),
        "{:?}",
        fs::read_dir(&state).unwrap().collect::<Vec<_>>()
    );
    assert!(handed.join("stash-0").is_dir());

    let second = Backend::start(&place, "second", &[native]);
    serve_the_tree(&second, "2");
    assert_eq!(
        (built(&second, "stash"), built(&second, "native")),
        (1, 0),
        "built from the stash handed on: {}",
        second.stats()["built"]
    );
    assert!(!handed.exists(), "adopted, so taken");
    second.close();

    // A stash changed while handed on is not believed.
    fs::write(handed.join("stash-0").join("intruder"), "x").unwrap();
    let third = Backend::start(&place, "third", &[native]);
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
    let fourth = Backend::start(&place, "fourth", &[native]);
    assert!(
        !fourth.log().contains("another backend keeps its state"),
        "{}",
        fourth.log()
    );
    serve_the_tree(&fourth, "4");
    fourth.close();
}
