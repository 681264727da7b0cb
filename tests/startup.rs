//! Starting the daemon with bad arguments: every argument is checked
//! before anything is changed, the first mistake in the order mappings,
//! stream paths, other paths, mount point is the one reported, and a
//! refused start leaves no mount and no file behind.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;

/// Runs the daemon with `args` (mount point included) and no input.
fn run(args: &[String]) -> Output {
    let mut command = Command::new(bin());
    if !args.iter().any(|a| a.starts_with("--native_below")) {
        command.arg("--native_below=0");
    }
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()
        .unwrap()
}

fn arg(flag: &str, path: &Path) -> String {
    format!("{flag}={}", path.display())
}

#[test]
fn the_first_bad_argument_is_reported_and_nothing_is_created_or_mounted() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let a_file = fx.write("src/a_file", "");
    let mnt = fx.mnt();
    let missing_dir = fx.path("no/such/dir");
    let missing = fx.path("src/missing");
    let output = fx.path("made/output");
    let access_log = fx.path("made/access.log");
    let record = fx.path("made/record");
    std::fs::create_dir(fx.path("made")).unwrap();
    let made = [&output, &access_log, &record];
    let no_mount_point = fx.path("no-mount-point");
    let bad_mapping = format!("--mapping=ro:/x:{}", missing.display());
    let good_mapping = format!("--mapping=ro:/g:{}", good.display());
    let cases: Vec<(Vec<String>, String)> = vec![
        // A mapping is checked before the mount point...
        (
            vec![bad_mapping.clone(), arg("", &no_mount_point)],
            "--mapping: mapping #0".into(),
        ),
        // ...and before any file is made.
        (
            vec![
                good_mapping.clone(),
                bad_mapping.clone(),
                arg("--output", &output),
                arg("--access_log", &access_log),
                arg("--record", &record),
                arg("", &mnt),
            ],
            "--mapping: mapping #1".into(),
        ),
        // The mount's root must be a directory, mapped first if at all.
        (
            vec![format!("--mapping=ro:/:{}", good.display()), arg("", &mnt)],
            format!("mapping #0: Failed to map root: {good:?} is not a directory"),
        ),
        (
            vec![
                good_mapping.clone(),
                format!("--mapping=ro:/:{}", fx.path("src").display()),
                arg("", &mnt),
            ],
            format!(
                "mapping #1: Cannot map '/ -> {}': Root can be mapped at most once",
                fx.path("src").display()
            ),
        ),
        (
            vec![
                arg("--input", &missing),
                arg("--output", &output),
                arg("", &no_mount_point),
            ],
            format!(
                "Failed to open reconfiguration input '{}': No such file or directory",
                missing.display()
            ),
        ),
        (
            vec![
                arg("--output", &missing_dir.join("out")),
                arg("", &no_mount_point),
            ],
            format!(
                "Failed to open reconfiguration output '{}': No such file or directory",
                missing_dir.join("out").display()
            ),
        ),
        (
            vec![
                arg("--output", &output),
                arg("--access_log", &missing_dir.join("log")),
                arg("", &mnt),
            ],
            "cannot open the access log".into(),
        ),
        (
            vec![
                arg("--output", &output),
                arg("--record", &missing_dir.join("rec")),
                arg("", &mnt),
            ],
            "cannot create the recording".into(),
        ),
        (
            vec![
                arg("--output", &output),
                arg("--control", &missing_dir.join("sock")),
                arg("", &mnt),
            ],
            "control socket".into(),
        ),
        (
            vec![
                arg("--output", &output),
                "--native_below=auto".into(),
                arg("--calibration", &missing),
                arg("", &mnt),
            ],
            format!("{missing:?}"),
        ),
        (
            vec![arg("--output", &fx.path("src")), arg("", &mnt)],
            "Is a directory".into(),
        ),
        // With everything else right, the mount point is reported, still
        // with nothing made.
        (
            vec![
                arg("--output", &output),
                arg("--access_log", &access_log),
                arg("--record", &record),
                arg("", &no_mount_point),
            ],
            format!("mount point {no_mount_point:?}: No such file or directory"),
        ),
        (
            vec![arg("--output", &output), arg("", &a_file)],
            format!("mount point {a_file:?} is not a directory"),
        ),
    ];
    for (args, expected) in cases {
        let args: Vec<String> = args
            .into_iter()
            .map(|a| a.strip_prefix('=').map(str::to_owned).unwrap_or(a))
            .collect();
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("actionfs: ") && stderr.contains(&expected),
            "{args:?}: expected {expected:?} in:\n{stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line:\n{stderr}");
        for path in made {
            assert!(!path.exists(), "{args:?}: {path:?} was left behind");
        }
        assert!(!is_mounted(&mnt), "{args:?}: left a mount");
        assert!(!missing_dir.exists(), "{args:?}: made {missing_dir:?}");
    }
}

#[test]
fn a_start_that_fails_after_making_files_removes_them() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let output = fx.path("output");
    let access_log = fx.path("access.log");
    // With few descriptors allowed, the start fails at a step after the
    // files are made (signal handlers, the mount), whichever runs out
    // first; with enough, the daemon mounts.
    let mut failed_late = 0;
    for limit in 3..=16 {
        let mut command = Command::new("prlimit");
        command
            .arg(format!("--nofile={limit}:{limit}"))
            .arg(bin())
            .args(["--native_below=0", &arg("--output", &output)])
            .arg(arg("--access_log", &access_log))
            .arg(fx.mnt())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        let stdin = child.stdin.take();
        let started = wait_for(std::time::Duration::from_secs(10), || {
            is_mounted(&fx.mnt()) || matches!(child.try_wait(), Ok(Some(_)))
        });
        assert!(started, "limit {limit}: neither started nor failed");
        let mut mounted = false;
        if is_mounted(&fx.mnt()) {
            // Mounted: a real start, unless a later step of it (the
            // io_uring queues) runs out and undoes it. Stop it, and see.
            drop(stdin);
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            mounted = true;
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // A failed start exits 1; a stopped one by the signal.
        if mounted && out.status.code() != Some(1) {
            assert!(
                output.exists(),
                "a started daemon keeps its output: {stderr}"
            );
            break;
        }
        // Below a few descriptors the loader itself fails (status 127).
        let loader_failed = stderr.contains("error while loading shared libraries");
        assert!(
            out.status.code() == Some(1) || loader_failed,
            "limit {limit}: {:?} {stderr}",
            out.status
        );
        if stderr.contains("FUSE session failed") {
            // It had mounted and was serving when it ran out: a runtime
            // failure, not a refused start; what it made is its own.
            break;
        }
        if [
            "signal handlers",
            "cannot mount",
            "would not go back to /dev/fuse",
        ]
        .iter()
        .any(|step| stderr.contains(step))
        {
            failed_late += 1;
        }
        assert!(!output.exists(), "limit {limit}: output left by: {stderr}");
        assert!(
            !access_log.exists(),
            "limit {limit}: access log left by: {stderr}"
        );
        assert!(!is_mounted(&fx.mnt()), "limit {limit}: mount left");
    }
    assert!(
        failed_late > 0,
        "no limit made the start fail after the files were made"
    );
}
