//! How the daemon starts and stops: signals, closed pipes, stale mounts,
//! and the command-line contract Bazel relies on.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;

/// A daemon with one sandbox: an input and a writable workspace.
fn daemon_with_sandbox(fx: &Fixture) -> Daemon {
    let input = fx.write("src/in", "data");
    fx.write("src/other", "other");
    let d = fx.start_logged(&[], "info");
    d.create(sandbox(
        "s",
        vec![
            ro("/in", &input),
            ro("/other", &fx.path("src/other")),
            rw("/ws", &fx.path("scratch")),
        ],
    ));
    d
}

/// A daemon with sandbox `s` mapping `/in` to `input`, read-only.
fn daemon_with_input(fx: &Fixture, input: &Path) -> Daemon {
    let d = fx.start(&[]);
    d.create(sandbox("s", vec![ro("/in", input)]));
    d
}

#[test]
fn every_stop_signal_unmounts_an_idle_mount_at_once_and_exits_by_that_signal() {
    if !require(&[Need::Mount]) {
        return;
    }
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT] {
        let fx = Fixture::new();
        let mut d = daemon_with_sandbox(&fx);
        assert_eq!(read_in_child(&d.path("s/in")), "data");
        let mut client = d.client.take().unwrap();
        // Bazel's order: stdin closed, then the signal.
        client.close_input();
        client.signal(signal).unwrap();
        let status = client
            .wait_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap_or_else(|| panic!("signal {signal}: still running\n{}", fx.log()));
        assert_eq!(signal_of(status), Some(signal), "{status:?}\n{}", fx.log());
        assert!(
            !is_mounted(&fx.mnt()),
            "mount left behind after signal {signal}"
        );
        assert!(!fx.log().contains("busy"), "an idle mount is never busy");
    }
}

#[test]
fn a_busy_mount_keeps_serving_until_it_is_free_then_unmounts() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let mut d = daemon_with_sandbox(&fx);
    let open = fs::File::open(d.path("s/in")).unwrap();
    let mut sitter = Command::new("sleep")
        .arg("60")
        .current_dir(d.path("s/ws"))
        .spawn()
        .unwrap();
    let mut client = d.client.take().unwrap();
    client.signal(libc::SIGTERM).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || fx.log().contains("busy")),
        "no busy report:\n{}",
        fx.log()
    );
    // Still the daemon's: a process inside keeps every path.
    assert!(client
        .wait_timeout(Duration::from_millis(500))
        .unwrap()
        .is_none());
    assert!(is_mounted(&fx.mnt()));
    assert_eq!(fs::read_to_string(d.path("s/other")).unwrap(), "other");
    fs::write(d.path("s/ws/late-output"), "written after SIGTERM").unwrap();
    assert_eq!(
        fs::read_to_string(fx.path("scratch/late-output")).unwrap(),
        "written after SIGTERM"
    );
    // Once nothing is inside, the retry succeeds.
    drop(open);
    sitter.kill().unwrap();
    sitter.wait().unwrap();
    let status = client
        .wait_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap_or_else(|| panic!("still running once free:\n{}", fx.log()));
    assert_eq!(signal_of(status), Some(libc::SIGTERM), "{}", fx.log());
    assert!(!is_mounted(&fx.mnt()));
    let retries = fx.log().matches("busy").count();
    assert!(retries >= 1, "one log line per retry:\n{}", fx.log());
    // In sandboxfs 0.2.0's words, which its users' scripts grep for.
    let log = fx.log();
    let retry = messages(&log)
        .into_iter()
        .find(|m| m.starts_with("Unmounting file system failed with "))
        .unwrap_or_else(|| panic!("no retry line:\n{log}"));
    assert!(
        retry.contains("(os error 16)'; will retry in ") && retry.contains("is busy"),
        "{retry}"
    );
    assert_eq!(second_unmount(&log), None, "{log}");
}

/// The messages of a log, without their timestamps and levels.
fn messages(log: &str) -> Vec<&str> {
    log.lines()
        .map(|line| line.split_once("] ").map_or(line, |(_, message)| message))
        .collect()
}

/// What fuser logs when it unmounts a mount the daemon already unmounted.
fn second_unmount(log: &str) -> Option<&str> {
    messages(log).into_iter().find(|m| {
        m.contains("Failed to umount")
            || m.contains("Unmount failed")
            || m.starts_with("Unmounting /")
    })
}

#[test]
fn a_stop_logs_one_line_in_sandboxfs_words_and_nothing_unmounts_twice() {
    if !require(&[Need::Mount]) {
        return;
    }
    for level in [None, Some("info"), Some("debug")] {
        let fx = Fixture::new();
        let input = fx.write("src/in", "data");
        let mut command = fx.command(&[]);
        match level {
            Some(level) => command.env("RUST_LOG", level),
            None => command.env_remove("RUST_LOG"),
        };
        let mut d = fx.start_command(command);
        d.create(sandbox("s", vec![ro("/in", &input)]));
        let mut client = d.client.take().unwrap();
        client.close_input();
        let ended = "Reached end of reconfiguration input; no more requests are read, the mount \
                     stays up until a signal or an unmount";
        assert!(
            wait_for(Duration::from_secs(10), || fx.log().contains(ended)),
            "{level:?}: end of input not logged:\n{}",
            fx.log()
        );
        assert_eq!(read_in_child(&d.path("s/in")), "data");
        client.signal(libc::SIGTERM).unwrap();
        let status = client
            .wait_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap_or_else(|| panic!("{level:?}: still running\n{}", fx.log()));
        assert_eq!(signal_of(status), Some(libc::SIGTERM));
        assert!(!is_mounted(&fx.mnt()));
        let log = fx.log();
        let caught = format!("Caught signal 15; unmounting {}", fx.mnt().display());
        assert_eq!(
            messages(&log).iter().filter(|m| **m == caught).count(),
            1,
            "{level:?}: one {caught:?} line:\n{log}"
        );
        assert_eq!(second_unmount(&log), None, "{level:?}:\n{log}");
        if level.is_none() {
            // At the default level, the stop is all there is to read.
            assert_eq!(messages(&log), [ended, caught.as_str()], "{log}");
        }
    }
    // Unmounted from outside: one line, and no unmount after it.
    let fx = Fixture::new();
    let mut d = fx.start_logged(&[], "info");
    assert!(Command::new("fusermount3")
        .arg("-u")
        .arg(fx.mnt())
        .status()
        .unwrap()
        .success());
    let mut client = d.client.take().unwrap();
    assert_eq!(client.wait().unwrap().code(), Some(0), "{}", fx.log());
    let log = fx.log();
    let outside = format!("{} was unmounted from outside; exiting", fx.mnt().display());
    assert!(messages(&log).contains(&outside.as_str()), "{log}");
    assert_eq!(second_unmount(&log), None, "{log}");
}

#[test]
fn a_second_signal_detaches_a_busy_mount_at_once() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let mut d = daemon_with_sandbox(&fx);
    let open = fs::File::open(d.path("s/in")).unwrap();
    let mut client = d.client.take().unwrap();
    client.signal(libc::SIGTERM).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || fx.log().contains("busy")),
        "no busy report:\n{}",
        fx.log()
    );
    client.signal(libc::SIGINT).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || !is_mounted(&fx.mnt())),
        "a second signal did not detach it:\n{}",
        fx.log()
    );
    // The open file is still served (tests/open_files.rs); its close lets
    // the daemon go.
    drop(open);
    let status = client
        .wait_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap_or_else(|| panic!("the last close did not end it:\n{}", fx.log()));
    assert_eq!(
        signal_of(status),
        Some(libc::SIGTERM),
        "exits by the first signal"
    );
}

#[test]
fn end_of_input_keeps_the_mount_serving() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let d = daemon_with_input(&fx, &fx.write("src/in", "data"));
    d.client().close_input();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(fs::read_to_string(d.path("s/in")).unwrap(), "data");
    assert!(is_mounted(&fx.mnt()));
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn a_closed_output_keeps_the_mount_serving() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "data");
    let mut child = fx.spawn_piped(&[]);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdin.write_all(br#"{"C":{"i":"empty","m":[]}}"#).unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), r#"{"id":"empty","error":null}"#);
    drop(stdout); // the reader goes away: the next answer hits EPIPE
                  // Both creates are applied though neither answer can be written.
    for id in ["a", "b"] {
        let request = format!(
            r#"{{"C":{{"i":"{id}","m":[{{"p":"/in","u":"{}"}}]}}}}"#,
            input.display()
        );
        stdin.write_all(request.as_bytes()).unwrap();
        stdin.flush().unwrap();
        let path = fx.mnt().join(id).join("in");
        assert!(wait_for(Duration::from_secs(10), || path.exists()), "{id}");
    }
    assert_eq!(fs::read_to_string(fx.mnt().join("b/in")).unwrap(), "data");
    drop(stdin);
    // SAFETY: kill(2) with our own child's pid and a plain signal.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(
        shell_status(child.wait().unwrap()),
        BY_SIGTERM,
        "{}",
        fx.log()
    );
    assert!(!is_mounted(&fx.mnt()));
}

#[test]
fn a_stale_mount_from_a_killed_daemon_is_cleared_at_start() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "data");
    let mut first = daemon_with_input(&fx, &input);
    let mut client = first.client.take().unwrap();
    client.signal(libc::SIGKILL).unwrap();
    client.wait().unwrap();
    drop(client);
    let stale = fs::metadata(fx.mnt()).unwrap_err();
    // On io_uring the kernel cuts the mount off once it has torn the dead
    // daemon's rings down; a request in that window fails ECONNABORTED,
    // or ECANCELED if it was on its way to a dying ring.
    assert!(
        matches!(
            stale.raw_os_error(),
            Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
        ),
        "the kill should leave a stale mount, not {stale}"
    );
    std::mem::forget(first); // its Drop would clear the mount we want to test with

    let second = daemon_with_input(&fx, &input);
    assert_eq!(fs::read_to_string(second.path("s/in")).unwrap(), "data");
    assert_eq!(second.terminate(), BY_SIGTERM);
    assert!(
        !is_mounted(&fx.mnt()),
        "one mount was stale, one live: both must be gone"
    );
}

#[test]
fn an_external_unmount_ends_the_daemon_with_status_zero() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let mut d = fx.start(&[]);
    let status = Command::new("fusermount3")
        .arg("-u")
        .arg(fx.mnt())
        .status()
        .unwrap();
    assert!(status.success());
    let mut client = d.client.take().unwrap();
    assert_eq!(client.wait().unwrap().code(), Some(0), "{}", fx.log());
}

#[test]
fn version_first_line_is_what_bazel_parses() {
    let out = Command::new(bin()).arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    // Bazel requires exactly "sandboxfs X.Y.Z", >= 0.2.0 for this protocol.
    assert_eq!(lines.next(), Some("sandboxfs 0.2.0"));
    assert!(lines.next().unwrap().starts_with("actionfs "));
    assert!(
        out.stderr.is_empty(),
        "nothing may precede the version line"
    );
}

#[test]
fn help_lists_every_flag() {
    let out = Command::new(bin()).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--allow",
        "--input",
        "--output",
        "--mapping",
        "--ttl",
        "--xattrs",
        "--node_cache",
        "--reconfig_threads",
        "--cpu_profile",
        "--passthrough",
        "--native_below",
        "--native_method",
        "--native_dir",
        "--calibration",
        "--transport",
        "-h, --help",
        "--version",
        "MOUNTPOINT",
    ] {
        assert!(text.contains(flag), "--help does not mention {flag}");
    }
}

#[test]
fn usage_errors_exit_2_with_the_usage_and_runtime_errors_exit_1_with_one_line() {
    let fx = Fixture::new();
    let file = fx.write("src/file", "x");
    let run = |args: &[&str]| {
        let out = Command::new(bin())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8(out.stderr).unwrap())
    };
    for args in [
        &["--bogus", "/m"][..],
        &[][..],
        &["--allow=all", "/m"][..],
        &["--help", "--bogus"][..],
        &["--version", "--bogus"][..],
        &["materialize", "--bogus", "/d"][..],
    ] {
        let (code, err) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(
            err.contains("Usage: actionfs"),
            "{args:?}: no usage line: {err}"
        );
    }
    // -h is the help, not a mount point, on the command and subcommands.
    for args in [
        &["-h"][..],
        &["--help", "--version"][..],
        &["rmtree", "-h"][..],
    ] {
        let out = Command::new(bin()).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("Usage: actionfs"));
    }
    let missing = fx.path("no/such/dir");
    for (mount_point, expected) in [
        (missing.as_path(), "No such file"),
        (file.as_path(), "not a directory"),
    ] {
        let (code, err) = run(&[mount_point.to_str().unwrap()]);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains(expected) && err.trim_end().lines().count() == 1,
            "{err}"
        );
    }
    let bad_mapping = format!("--mapping=ro:/x:{}", fx.path("src/nope").display());
    let (code, err) = run(&[&bad_mapping, fx.mnt().to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("nope"), "{err}");
    assert!(!is_mounted(&fx.mnt()));
}
