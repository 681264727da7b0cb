//! How the daemon starts and stops: signals, closed pipes, stale mounts,
//! and the command-line contract Bazel relies on.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;

fn stops_cleanly_on(signal: i32) {
    let fx = Fixture::new();
    let input = fx.write("src/in", "data");
    let d = fx.start(&[]);
    d.create(sandbox(
        "s",
        vec![ro("/in", &input), rw("/ws", &fx.path("scratch"))],
    ));
    // Open files and a process sitting inside the mount must not hold the
    // daemon up.
    let _open = fs::File::open(d.path("s/in")).unwrap();
    let _writing = fs::File::create(d.path("s/ws/out")).unwrap();
    let mut sitter = Command::new("sleep")
        .arg("30")
        .current_dir(d.path("s/ws"))
        .spawn()
        .unwrap();
    let mut d = d;
    let client = d.client.take().unwrap();
    client.signal(signal).unwrap();
    let mut client = client;
    let status = client.wait().unwrap();
    let _ = sitter.kill();
    let _ = sitter.wait();
    assert_eq!(
        status.code(),
        Some(0),
        "signal {signal}; log:\n{}",
        fx.log()
    );
    assert!(
        !is_mounted(&fx.mnt()),
        "mount left behind after signal {signal}"
    );
}

#[test]
fn sigterm_unmounts_and_exits_zero_with_files_open() {
    if !require(&[Need::Mount]) {
        return;
    }
    stops_cleanly_on(libc::SIGTERM);
}

#[test]
fn sigint_unmounts_and_exits_zero_with_files_open() {
    if !require(&[Need::Mount]) {
        return;
    }
    stops_cleanly_on(libc::SIGINT);
}

#[test]
fn sighup_unmounts_and_exits_zero_with_files_open() {
    if !require(&[Need::Mount]) {
        return;
    }
    stops_cleanly_on(libc::SIGHUP);
}

#[test]
fn end_of_input_keeps_the_mount_serving() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "data");
    let d = fx.start(&[]);
    d.create(sandbox("s", vec![ro("/in", &input)]));
    d.client().close_input();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(fs::read_to_string(d.path("s/in")).unwrap(), "data");
    assert!(is_mounted(&fx.mnt()));
    assert_eq!(d.terminate(), 0);
}

#[test]
fn a_closed_output_keeps_the_mount_serving() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "data");
    let mut child = fx
        .command(&[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
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
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(0), "{}", fx.log());
    assert!(!is_mounted(&fx.mnt()));
}

#[test]
fn a_stale_mount_from_a_killed_daemon_is_cleared_at_start() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "data");
    let mut first = fx.start(&[]);
    first.create(sandbox("s", vec![ro("/in", &input)]));
    let mut client = first.client.take().unwrap();
    client.signal(libc::SIGKILL).unwrap();
    client.wait().unwrap();
    drop(client);
    let stale = fs::metadata(fx.mnt()).unwrap_err();
    assert_eq!(
        stale.raw_os_error(),
        Some(libc::ENOTCONN),
        "the kill should leave a stale mount"
    );
    std::mem::forget(first); // its Drop would clear the mount we want to test with

    let second = fx.start(&[]);
    second.create(sandbox("s", vec![ro("/in", &input)]));
    assert_eq!(fs::read_to_string(second.path("s/in")).unwrap(), "data");
    assert_eq!(second.terminate(), 0);
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
        "--help",
        "--version",
        "MOUNTPOINT",
    ] {
        assert!(text.contains(flag), "--help does not mention {flag}");
    }
}

#[test]
fn usage_errors_exit_2_and_runtime_errors_exit_1_with_one_line() {
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
    for args in [&["--bogus", "/m"][..], &[][..], &["--allow=all", "/m"][..]] {
        let (code, err) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with("actionfs: ") && err.trim_end().lines().count() == 1,
            "{err}"
        );
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
