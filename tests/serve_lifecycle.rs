//! What a client finds when `actionfs serve` answers Negotiate, how it
//! ends when it is killed, and what the next one on the same sandbox base
//! finds of a dead or a live one: real backend processes, real mounts,
//! real signals. Bazel sends SIGTERM when a request times out (and never a
//! second), the OOM killer SIGKILL; either may come with actions running
//! inside sandboxes and requests in flight, while the request loop waits
//! on stdin. What a backend hands on to the next is in serve_stashes.rs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use actionfs_protocol::backend::client::Answer;
use actionfs_testkit::backend::{Backend, Place, NATIVE_BELOW, WS};
use actionfs_testkit::serve::backend_dir_name;
use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::{mounts_below, proc_state, signal_of, wait_for};

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
    let small = place.inputs_tree(2);
    let large = place.inputs_tree(40);
    b.push_tree(&small);
    b.push_tree(&large);
    let mut actions = Vec::new();
    for n in 0..20 {
        let (tree, native) = if n % 2 == 0 {
            (&small, true)
        } else {
            (&large, false)
        };
        let root = b.create_ok(
            &format!("s{n}"),
            place.manifest(tree, &[("/ws/out/o", "file")]),
        );
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
        .map(|n| {
            b.send_create(
                &format!("s{n}"),
                place.manifest(&large, &[("/ws/out/o", "file")]),
            )
        })
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
        let b = Backend::start_in(&place, "threads", &["--reconfig_threads=6"]);
        let threads: Vec<String> = fs::read_dir(format!("/proc/{}/task", b.pid()))
            .unwrap()
            .filter_map(|task| fs::read_to_string(task.unwrap().path().join("comm")).ok())
            .filter(|name| name.starts_with("serve-"))
            .collect();
        // Six apply, and one more reads meanwhile: the main one.
        assert_eq!(threads.len(), 6, "{threads:?}\n{}", b.log());
        b.close_sharing_base();
    }
}

#[test]
fn sigterm_and_sigint_mid_build_unmount_remove_the_base_and_exit_by_the_signal() {
    if !require(&[Need::Mount]) {
        return;
    }
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let place = Place::new();
        let mut b = Backend::start_in(&place, "backend", &[NATIVE_BELOW]);
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
            mounts_below(place.base()),
            Vec::<PathBuf>::new(),
            "signal {signal}: a mount is left\n{}",
            b.log()
        );
        assert_eq!(
            place.names_on_base(),
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
    let mut dead = Backend::start_in(&place, "dead", &[NATIVE_BELOW]);
    let (actions, _in_flight) = busy_build(&place, &dead);
    let dead_dir = dead.dir_name();
    dead.signal(libc::SIGKILL);
    assert_eq!(signal_of(dead.wait()), Some(libc::SIGKILL));
    // A wait, not a timing check: the watcher runs at the backend's death.
    assert!(
        wait_for(Duration::from_secs(10), || mounts_below(place.base())
            .is_empty()),
        "the dead backend's mount is left: {:?}",
        mounts_below(place.base())
    );
    drop(actions);
    assert_eq!(place.names_on_base(), [dead_dir.as_str()]);

    let next = Backend::start_in(&place, "next", &[NATIVE_BELOW]);
    let log = next.log();
    assert_eq!(
        removed_line(&log),
        [format!(
            "actionfs serve: removed what 1 dead backend left in {} ({dead_dir})",
            place.base().display()
        )],
        "{log}"
    );
    assert_eq!(place.names_on_base(), [next.dir_name()]);
    let tree = place.inputs_tree(40);
    next.push_tree(&tree);
    let root = next.create_ok("again", place.manifest(&tree, &[("/ws/out/o", "file")]));
    assert_eq!(
        fs::read_to_string(root.join(WS).join("in40/f7")).unwrap(),
        "input 7 of 40\n"
    );
    next.close_sharing_base();
    assert_eq!(place.names_on_base(), Vec::<String>::new());
    assert_eq!(mounts_below(place.base()), Vec::<PathBuf>::new());
}

#[test]
fn a_stale_mount_a_dead_backend_left_is_unmounted_by_the_next() {
    if !require(&[Need::Mount]) {
        return;
    }
    let place = Place::new();
    let mut dead = Backend::start_in(&place, "dead", &["--native_below=0"]);
    let tree = place.inputs_tree(3);
    dead.push_tree(&tree);
    dead.create_ok("s", place.manifest(&tree, &[("/ws/out/o", "file")]));
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

    let next = Backend::start_in(&place, "next", &[]);
    assert_eq!(removed_line(&next.log()).len(), 1, "{}", next.log());
    assert_eq!(place.names_on_base(), [next.dir_name()]);
    let mounts = mounts_below(place.base());
    assert!(
        mounts
            .iter()
            .all(|m| !m.to_string_lossy().contains(&dead_dir)),
        "the stale mount is left: {mounts:?}"
    );
    next.close_sharing_base();
    assert_eq!(place.names_on_base(), Vec::<String>::new());
}

#[test]
fn a_live_backend_on_the_same_base_is_never_touched() {
    if !require(&[Need::Mount]) {
        return;
    }
    let place = Place::new();
    let first = Backend::start_in(&place, "first", &[NATIVE_BELOW]);
    let (small, large) = (place.inputs_tree(2), place.inputs_tree(40));
    first.push_tree(&small);
    first.push_tree(&large);
    let native = first.create_ok("native", place.manifest(&small, &[("/ws/out/o", "file")]));
    let fuse = first.create_ok("fuse", place.manifest(&large, &[("/ws/out/o", "file")]));

    let second = Backend::start_in(&place, "second", &[NATIVE_BELOW]);
    assert_eq!(removed_line(&second.log()), Vec::<&str>::new());
    second.push_tree(&large);
    let other = second.create_ok("fuse", place.manifest(&large, &[("/ws/out/o", "file")]));
    let mut both = vec![first.dir_name(), second.dir_name()];
    both.sort();
    assert_eq!(place.names_on_base(), both);
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
    let third = Backend::start_in(&place, "third", &[]);
    assert_eq!(removed_line(&third.log()), Vec::<&str>::new());
    third.close_sharing_base();
    first.close_sharing_base();
    assert_eq!(place.names_on_base(), [second.dir_name()]);
    second.close_sharing_base();
    assert_eq!(place.names_on_base(), Vec::<String>::new());
    assert_eq!(mounts_below(place.base()), Vec::<PathBuf>::new());
}

/// A directory whose lock nobody holds is dead, even where its pid names
/// a live process (pids are reused): here this test's own.
#[test]
fn a_directory_named_for_a_live_pid_but_unlocked_is_dead() {
    if !require(&[Need::Mount]) {
        return;
    }
    let place = Place::new();
    let name = backend_dir_name(std::process::id());
    fs::create_dir_all(place.base().join(&name).join("scratch/s1")).unwrap();
    fs::write(place.base().join(&name).join("scratch/s1/f"), "left").unwrap();
    fs::create_dir(place.base().join("not-a-backend")).unwrap();
    let next = Backend::start_in(&place, "next", &[]);
    assert_eq!(
        removed_line(&next.log()),
        [format!(
            "actionfs serve: removed what 1 dead backend left in {} ({name})",
            place.base().display()
        )]
    );
    let mut expected = vec![next.dir_name(), "not-a-backend".to_owned()];
    expected.sort();
    assert_eq!(place.names_on_base(), expected);
    next.close_sharing_base();
    assert_eq!(place.names_on_base(), ["not-a-backend"]);
}
