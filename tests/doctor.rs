//! `actionfs doctor` on the real machine, in the states CI can make: each
//! state is made inside a private mount namespace (a fresh `/dev/fuse` node
//! or a `enable_uring` file bound over the real one), so the machine's own
//! `/dev/fuse` mode and `enable_uring`, which other test runs and other
//! programs rely on, are never changed.

use std::path::Path;
use std::process::{Command, Output};

use actionfs_testkit::tier::{require, skip, Need};
use actionfs_testkit::{bin, LoopXfs};
use serde_json::Value;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Runs `actionfs doctor ARGS` in a private mount namespace after `setup`
/// (a shell snippet; `$SCRATCH` is a fresh tmpfs), as `uid` 65534 if
/// `unprivileged`.
fn doctor_in_namespace(setup: &str, unprivileged: bool, args: &[&str]) -> Output {
    in_namespace(setup, unprivileged, "exec \"$BIN\" doctor \"$@\"", args)
}

/// Runs the shell snippet `then` (as uid 65534 if `unprivileged`) in a
/// private mount namespace after `setup`.
fn in_namespace(setup: &str, unprivileged: bool, then: &str, args: &[&str]) -> Output {
    let scratch = tempfile::tempdir().unwrap();
    let user = if unprivileged {
        "setpriv --reuid=65534 --regid=65534 --clear-groups"
    } else {
        ""
    };
    let script = format!(
        "set -e; mount -t tmpfs actionfs-doctor-test \"$SCRATCH\"; {setup}; \
         exec {user} sh -c '{}' sh \"$@\"",
        then.replace('\'', r"'\''")
    );
    Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
        ])
        .args(args)
        .env("SCRATCH", scratch.path())
        .env("BIN", bin())
        .output()
        .unwrap()
}

/// Whether the daemon, started as uid 65534 after `setup`, gets its mount
/// up (waiting at most 10 s), as `doctor` predicted.
fn daemon_mounts(setup: &str) -> bool {
    let attempt = r#"
        mkdir "$SCRATCH/mnt"
        "$BIN" "$SCRATCH/mnt" </dev/null >/dev/null 2>"$SCRATCH/err" &
        pid=$!
        for i in $(seq 100); do
            if grep -q " $SCRATCH/mnt fuse" /proc/self/mounts; then
                kill $pid; wait $pid || true; echo MOUNTED; exit 0
            fi
            if ! kill -0 $pid 2>/dev/null; then
                echo FAILED; cat "$SCRATCH/err"; exit 0
            fi
            sleep 0.1
        done
        kill $pid; echo "NEITHER in 10 s"
    "#;
    let out = in_namespace(setup, true, attempt, &[]);
    let said = String::from_utf8_lossy(&out.stdout);
    match said.lines().next() {
        Some("MOUNTED") => true,
        Some("FAILED") => false,
        _ => panic!("the daemon neither mounted nor failed: {out:?}"),
    }
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    let check = &report["checks"][name];
    assert!(check.is_object(), "no check {name}: {report}");
    check
}

/// A `/dev/fuse` of `mode` in the namespace: a new node of the same device.
fn dev_fuse_of_mode(mode: &str) -> String {
    format!("mknod -m {mode} \"$SCRATCH/fuse\" c 10 229; mount --bind \"$SCRATCH/fuse\" /dev/fuse")
}

#[test]
fn a_dev_fuse_closed_to_the_user_fails_with_the_command_that_fixes_it() {
    if !require(&[Need::Root]) {
        return;
    }
    let closed = dev_fuse_of_mode("0600");
    let out = doctor_in_namespace(&closed, true, &["--json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let report = json_of(&out);
    assert_eq!(report["uid"], 65534, "{report}");
    assert_eq!(report["can_mount"], false, "{report}");
    let dev_fuse = check(&report, "dev_fuse");
    assert_eq!(dev_fuse["state"], "fail", "{report}");
    assert_eq!(dev_fuse["fix"], "sudo chmod 0666 /dev/fuse", "{report}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot mount here (dev_fuse"),
        "{out:?}"
    );

    // For people: one line per check, the failure with its fix under it.
    let out = doctor_in_namespace(&closed, true, &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("fail  /dev/fuse"))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        lines[at + 1].trim(),
        "fix: sudo chmod 0666 /dev/fuse",
        "{text}"
    );
    for title in [
        "fuse module",
        "fusermount3",
        "allow_other",
        "passthrough",
        "enable_uring",
        "sandbox base",
        "reflink",
    ] {
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.get(6..).is_some_and(|rest| rest.starts_with(title)))
                .count(),
            1,
            "{title}: {text}"
        );
    }
    assert!(
        text.ends_with("the daemon cannot mount here: /dev/fuse\n"),
        "{text}"
    );
    assert!(!daemon_mounts(&closed), "doctor said it could not");

    // The same user with /dev/fuse open: only fusermount3 decides now.
    let out = doctor_in_namespace(&dev_fuse_of_mode("0666"), true, &["--json"]);
    let report = json_of(&out);
    assert_eq!(check(&report, "dev_fuse")["state"], "ok", "{report}");
    let fusermount = check(&report, "fusermount3");
    let can_mount = fusermount["state"] != "fail";
    assert_eq!(report["can_mount"], can_mount, "{report}");
    assert_eq!(out.status.success(), can_mount, "{out:?}");
    assert_eq!(
        daemon_mounts(&dev_fuse_of_mode("0666")),
        can_mount,
        "doctor said {report}"
    );
    // Not root: passthrough lacks CAP_SYS_ADMIN.
    assert_eq!(check(&report, "passthrough")["state"], "warn", "{report}");
}

#[test]
fn enable_uring_off_and_on_is_reported_with_the_transport_it_allows() {
    if !require(&[Need::Root]) {
        return;
    }
    if !Path::new(ENABLE_URING).exists() {
        skip(&format!(
            "{ENABLE_URING} does not exist (kernel without FUSE io_uring)"
        ));
        return;
    }
    let release = nix::sys::utsname::uname().unwrap();
    let kernel = actionfs::tools::doctor::transport_choice::parse_release(
        release.release().to_str().unwrap(),
    )
    .unwrap();
    let new_enough = kernel >= actionfs::tools::doctor::transport_choice::URING_SINCE;
    for value in ["N", "Y"] {
        let setup = format!(
            "printf '{value}\\n' > \"$SCRATCH/enable_uring\"; \
             mount --bind \"$SCRATCH/enable_uring\" {ENABLE_URING}"
        );
        let out = doctor_in_namespace(&setup, false, &["--json"]);
        assert!(out.status.success(), "{out:?}");
        let report = json_of(&out);
        let uring = check(&report, "enable_uring");
        let transport = &report["would_choose"]["transport"];
        match (value, new_enough) {
            ("N", true) => {
                assert_eq!(uring["state"], "warn", "{report}");
                assert_eq!(uring["fix"], format!("echo Y | sudo tee {ENABLE_URING}"));
                assert_eq!(transport["choice"], "classic", "{report}");
                assert!(
                    transport["why"]
                        .as_str()
                        .unwrap()
                        .contains("enable_uring is N"),
                    "{report}"
                );
            }
            ("Y", true) => {
                assert_eq!(uring["state"], "ok", "{report}");
                assert_eq!(uring["fix"], Value::Null, "{report}");
                assert_eq!(transport["choice"], "io_uring", "{report}");
                assert!(
                    transport["why"]
                        .as_str()
                        .unwrap()
                        .contains("enable_uring is Y"),
                    "{report}"
                );
            }
            (_, false) => assert_eq!(uring["state"], "warn", "{report}"),
            _ => unreachable!(),
        }
    }
    // Outside the namespace: the machine's own value, untouched.
    let real = std::fs::read_to_string(ENABLE_URING).unwrap();
    let out = Command::new(bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let report = json_of(&out);
    if new_enough {
        let expected = if real.trim() == "Y" { "ok" } else { "warn" };
        assert_eq!(
            check(&report, "enable_uring")["state"],
            expected,
            "{report}"
        );
    }
}

#[test]
fn the_sandbox_base_is_told_tmpfs_or_disk_and_a_clone_is_tried_there() {
    if !require(&[Need::Root]) {
        return;
    }
    // No calibration file may decide the cutoff instead of the base.
    let home = tempfile::tempdir().unwrap();
    if Path::new("/etc/actionfs/calibration.json").exists() {
        skip("/etc/actionfs/calibration.json decides the cutoff on this machine");
        return;
    }
    let doctor = |base: &Path| {
        let out = Command::new(bin())
            .args(["doctor", "--json", "--sandbox-base"])
            .arg(base)
            .env("HOME", home.path())
            .env_remove("ACTIONFS_CALIBRATION")
            .output()
            .unwrap();
        json_of(&out)
    };

    let tmpfs = tempfile::tempdir().unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "actionfs-doctor-test"])
        .arg(tmpfs.path())
        .status()
        .unwrap();
    assert!(mounted.success());
    let report = doctor(&tmpfs.path().join("not/made/yet"));
    let _ = Command::new("umount").arg(tmpfs.path()).status();
    assert_eq!(report["sandbox_base"]["tmpfs"], true, "{report}");
    assert_eq!(report["sandbox_base"]["fs_type"], "tmpfs", "{report}");
    let base = check(&report, "sandbox_base");
    assert_eq!(base["state"], "ok", "{report}");
    assert!(
        base["detail"]
            .as_str()
            .unwrap()
            .contains("does not exist yet"),
        "{report}"
    );
    assert_eq!(
        check(&report, "reflink")["state"],
        "warn",
        "tmpfs cannot clone: {report}"
    );
    assert_eq!(
        report["would_choose"]["native_cutoff"]["choice"], "every sandbox native",
        "{report}"
    );

    if !require(&[Need::LoopDevice]) {
        return;
    }
    let xfs = LoopXfs::new().unwrap_or_else(|e| panic!("{e}"));
    let report = doctor(&xfs.path());
    assert_eq!(report["sandbox_base"]["tmpfs"], false, "{report}");
    assert_eq!(report["sandbox_base"]["fs_type"], "xfs", "{report}");
    assert_eq!(check(&report, "reflink")["state"], "ok", "{report}");
    assert_eq!(
        report["would_choose"]["native_cutoff"]["choice"], "every sandbox FUSE",
        "{report}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(xfs.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with(".actionfs-doctor"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "the clone probe is removed: {leftovers:?}"
    );
}

/// doctor reports the kernel's Landlock ABI and the jail serve would use
/// with it.
#[test]
fn landlock_and_the_jail_serve_would_use_are_reported() {
    let out = Command::new(bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let report = json_of(&out);
    let abi = actionfs::jail::landlock_abi();
    let landlock = check(&report, "landlock");
    let jail = &report["would_choose"]["jail"];
    assert!(
        landlock["detail"]
            .as_str()
            .unwrap()
            .starts_with(&format!("ABI {abi}")),
        "{report}"
    );
    if abi >= actionfs::jail::MIN_ABI {
        assert_eq!(landlock["state"], "ok", "{report}");
        assert!(
            jail["why"].as_str().unwrap().contains("actionfs-jail"),
            "{report}"
        );
        // Root may always make user namespaces.
        if nix::unistd::geteuid().is_root() {
            assert_eq!(jail["choice"], "landlock+namespaces", "{report}");
        }
        // Refused (as doctor is told), it says what that costs.
        let refused = Command::new(bin())
            .args(["doctor", "--json"])
            .env(actionfs::serve::confine::NAMESPACES_OVERRIDE, "off")
            .output()
            .unwrap();
        let refused = json_of(&refused);
        let jail = &refused["would_choose"]["jail"];
        assert_eq!(jail["choice"], "landlock", "{refused}");
        assert!(
            jail["why"]
                .as_str()
                .unwrap()
                .contains("every sandbox is FUSE"),
            "{refused}"
        );
    } else {
        assert_eq!(landlock["state"], "warn", "{report}");
        assert_eq!(jail["choice"], "bazel", "{report}");
    }
}
