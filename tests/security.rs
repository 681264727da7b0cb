//! The threat model of docs/SECURITY.md, attacked for real: the daemon runs
//! as root with `--allow=other`, and an unprivileged user (65534) who can
//! write an underlying tree swaps a directory, or a file, for a symlink
//! into a root-only directory, then works through the mount. Nothing may
//! reach that directory: no read of its file, no change to it, no name
//! made in it, no link to it made elsewhere. The attacks themselves are in
//! `tests/security/attacker.py`, run as that user.
//!
//! Run with ACTIONFS_BIN=an-older-actionfs and --nocapture to see what an
//! older daemon let through (the assertions then fail).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;

const NOBODY: u32 = 65534;
const SECRET: &str = "TOP SECRET";

/// The fixture of every attack: a root-only directory holding a secret,
/// and two trees the attacker owns, mapped writable and read-only.
struct Target {
    fx: Fixture,
    protected: PathBuf,
    under_rw: PathBuf,
    under_ro: PathBuf,
}

/// Every attack runs against both ways of serving opens: with OPEN
/// messages (each open resolves the name again) and without (the kernel
/// opens on its own and the daemon serves I/O from descriptors per inode).
const OPEN_MODES: [&str; 2] = ["--zero_message_opens=off", "--zero_message_opens=on"];

impl Target {
    fn new() -> Target {
        let fx = Fixture::new();
        // The fixture directory itself must be enterable by the attacker.
        fs::set_permissions(fx.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let protected = fx.path("protected");
        fs::create_dir(&protected).unwrap();
        fs::write(protected.join("secret"), SECRET).unwrap();
        fs::set_permissions(protected.join("secret"), fs::Permissions::from_mode(0o644)).unwrap();
        xattr::set(&protected.join("secret"), "user.mark", b"root's");
        fs::set_permissions(&protected, fs::Permissions::from_mode(0o700)).unwrap();
        let under_rw = fx.path("attacker-rw");
        let under_ro = fx.path("attacker-ro");
        fs::create_dir_all(under_ro.join("sub")).unwrap();
        fs::write(under_ro.join("sub/secret"), "mine").unwrap();
        fs::create_dir(&under_rw).unwrap();
        for path in [
            &under_rw,
            &under_ro,
            &under_ro.join("sub"),
            &under_ro.join("sub/secret"),
        ] {
            std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        Target {
            fx,
            protected,
            under_rw,
            under_ro,
        }
    }

    /// Starts the daemon serving opens in `open_mode` (one of
    /// [`OPEN_MODES`]).
    fn start(&self, open_mode: &str) -> Daemon {
        let d = self
            .fx
            .start_logged(&["--allow=other", "--xattrs", open_mode], "debug");
        d.create(sandbox(
            "s",
            vec![rw("/ws", &self.under_rw), ro("/ro", &self.under_ro)],
        ));
        d
    }

    /// Runs an attack as the unprivileged user; returns its JSON report.
    fn attack(&self, args: &[&str]) -> serde_json::Value {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/security/attacker.py");
        // The system interpreter: the attacker cannot run one under /root.
        let mut command = vec!["/usr/bin/python3", script.to_str().unwrap()];
        command.extend(args);
        let out = as_nobody(&command);
        assert!(
            out.status.success(),
            "attacker failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.fx.log()
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The protected directory is exactly as it was made.
    fn assert_untouched(&self) {
        assert_eq!(names(&self.protected), ["secret"]);
        self.assert_untouched_secret();
    }

    /// The secret and its directory are exactly as they were made.
    fn assert_untouched_secret(&self) {
        let secret = self.protected.join("secret");
        assert_eq!(fs::read_to_string(&secret).unwrap(), SECRET);
        let meta = fs::symlink_metadata(&secret).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o644, "mode changed");
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "owner changed");
        assert_eq!(meta.nlink(), 1, "secret was hard-linked somewhere");
        assert_eq!(xattr::get(&secret, "user.mark"), Some(b"root's".to_vec()));
        assert_eq!(xattr::get(&secret, "user.planted"), None);
        assert_eq!(
            fs::symlink_metadata(&self.protected).unwrap().mode() & 0o7777,
            0o700
        );
    }

    fn view(&self, d: &Daemon, rel: &str) -> String {
        d.path(rel).to_str().unwrap().to_owned()
    }
}

/// Prints the report, then checks that no operation read the secret and
/// that each of `must_fail` failed with one of `errnos`.
fn check_report(scenario: &str, report: &serde_json::Value, must_fail: &[&str], errnos: &[&str]) {
    eprintln!("{scenario}: {report}");
    let results = report.as_object().unwrap();
    for (op, result) in results {
        let result = result.as_str().unwrap();
        assert!(!result.contains(SECRET), "{scenario}: {op} read the secret");
    }
    for op in must_fail {
        let result = results[*op].as_str().unwrap();
        assert!(
            errnos.contains(&result),
            "{scenario}: {op} answered {result}, expected one of {errnos:?}"
        );
    }
}

/// Runs the attack `scenario` (then its `extra` arguments) on sandbox
/// directory `dir`, `ws` over the attacker's writable tree or `ro` over the
/// read-only one, in every open mode; `check` judges each report. Then the
/// protected directory must be untouched and the daemon stop cleanly.
fn attack_in_every_open_mode(
    scenario: &str,
    dir: &str,
    extra: &[&str],
    check: impl Fn(&str, &Target, &serde_json::Value),
) {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    for open_mode in OPEN_MODES {
        let t = Target::new();
        let d = t.start(open_mode);
        let under = match dir {
            "ws" => &t.under_rw,
            "ro" => &t.under_ro,
            _ => panic!("no sandbox directory {dir:?}"),
        };
        let view = t.view(&d, &format!("s/{dir}"));
        let mut args = vec![
            scenario,
            &view,
            under.to_str().unwrap(),
            t.protected.to_str().unwrap(),
        ];
        args.extend(extra);
        let report = t.attack(&args);
        check(open_mode, &t, &report);
        t.assert_untouched();
        assert_eq!(d.terminate(), BY_SIGTERM);
    }
}

#[test]
fn a_directory_swapped_for_a_symlink_under_a_writable_mapping_leads_nowhere() {
    attack_in_every_open_mode("swap-dir", "ws", &[], |open_mode, t, report| {
        // Everything below the swapped directory fails as the walk meets the
        // symlink, whether the kernel cached a name there or not.
        let every_op = [
            "stat",
            "read",
            "list",
            "create",
            "mkdir",
            "symlink",
            "mkfifo",
            "write",
            "truncate",
            "chmod",
            "utime",
            "rename",
            "link-out",
            "unlink",
            "setxattr",
            "getxattr",
            "listxattr",
            "removexattr",
        ];
        check_report(
            &format!("swap-dir {open_mode}"),
            report,
            &every_op,
            &["ELOOP"],
        );
        assert!(
            !t.under_rw.join("stolen").exists(),
            "a link to the secret was made"
        );
    });
}

#[test]
fn a_file_swapped_for_a_symlink_is_never_followed() {
    attack_in_every_open_mode("swap-last", "ws", &[], |open_mode, t, report| {
        if open_mode.ends_with("off") {
            // Each open resolves the name again: opening, truncating or
            // chmodding the symlink itself is refused; a link or a time
            // change acts on the symlink, never on its target.
            check_report(
                "swap-last read/write",
                report,
                &["read", "write"],
                &["ELOOP"],
            );
            check_report("swap-last truncate", report, &["truncate"], &["EINVAL"]);
            // (Python spells EOPNOTSUPP as ENOTSUP, its Linux alias.)
            check_report(
                "swap-last chmod",
                report,
                &["chmod"],
                &["ENOTSUP", "EOPNOTSUPP"],
            );
        } else {
            // The daemon holds the file the attacker made through the
            // mount open for the kernel's inode; like any open descriptor
            // it keeps acting on that file, now renamed, and never on
            // what took its name.
            check_report("swap-last zero-open", report, &[], &[]);
            let original = t.under_rw.join("secret.orig");
            assert_eq!(report["read"], "ok:mine", "{report}");
            assert_eq!(report["write"], "ok", "{report}");
            assert_eq!(report["truncate"], "ok", "{report}");
            assert_eq!(fs::metadata(&original).unwrap().len(), 0, "truncated");
            assert_eq!(report["chmod"], "ok", "{report}");
            assert_eq!(fs::metadata(&original).unwrap().mode() & 0o777, 0o777);
        }
    });
}

#[test]
fn a_directory_swapped_for_a_symlink_under_a_read_only_mapping_leads_nowhere() {
    attack_in_every_open_mode("swap-ro", "ro", &[], |open_mode, _, report| {
        check_report(
            &format!("swap-ro {open_mode}"),
            report,
            &["stat", "read", "list", "getxattr", "listxattr"],
            &["ELOOP"],
        );
    });
}

#[test]
fn racing_swaps_never_let_an_operation_through() {
    let attempts = 10_000;
    attack_in_every_open_mode(
        "race",
        "ws",
        &[&attempts.to_string()],
        |open_mode, _, report| {
            eprintln!("race {open_mode}: {report}");
            assert_eq!(report["attempts"], attempts);
            assert_eq!(report["leaked"], serde_json::json!([]));
            // The race was real: the directory moved thousands of times, and
            // operations still went through while it was a real directory.
            assert!(report["swaps"].as_u64().unwrap() >= 1000, "{report}");
            assert!(report["ok"].as_u64().unwrap() > 0, "{report}");
        },
    );
}

#[test]
fn what_another_user_creates_through_the_mount_is_theirs() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    for open_mode in OPEN_MODES {
        let t = Target::new();
        let d = t.start(open_mode);
        let ws = d.path("s/ws");
        let script = format!(
            "cd {ws:?} && echo x > file && mkdir dir && ln -s file link && mkfifo fifo && \
             ln file hardlink && mkdir dir/nested && echo y > dir/nested/deep"
        );
        let out = as_nobody(&["sh", "-c", &script]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for name in [
            "file",
            "dir",
            "link",
            "fifo",
            "hardlink",
            "dir/nested",
            "dir/nested/deep",
        ] {
            let meta = fs::symlink_metadata(t.under_rw.join(name)).unwrap();
            assert_eq!(
                (meta.uid(), meta.gid()),
                (NOBODY, NOBODY),
                "{name} belongs to {}:{}",
                meta.uid(),
                meta.gid()
            );
        }
        // Root's own creations stay root's.
        fs::write(ws.join("roots"), "r").unwrap();
        let meta = fs::symlink_metadata(t.under_rw.join("roots")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (0, 0));
        assert_eq!(d.terminate(), BY_SIGTERM);
    }
}

/// Every path below `dir` with its mode, owner and contents (for files).
fn snapshot(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let content = if meta.is_file() {
                fs::read_to_string(&path).unwrap()
            } else {
                String::new()
            };
            out.push(format!(
                "{} {:o} {}:{} {content}",
                path.strip_prefix(dir).unwrap().display(),
                meta.mode(),
                meta.uid(),
                meta.gid()
            ));
            if meta.is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn native_teardown_never_follows_a_symlink_swapped_into_the_scratch_directory() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    let t = Target::new();
    // What a teardown that followed the swapped names would delete.
    for rel in ["in/deep/x.txt", "out/bin/gen.txt"] {
        let path = t.protected.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, "root's").unwrap();
    }
    let before = snapshot(&t.protected);
    fs::create_dir_all(t.under_rw.join("out/bin")).unwrap();
    for dir in ["out", "out/bin"] {
        std::os::unix::fs::chown(t.under_rw.join(dir), Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let input = t.fx.write("src/input.txt", "input");
    let d =
        t.fx.start_logged(&["--allow=other", "--native_below=100"], "debug");
    d.create(sandbox(
        "n",
        vec![
            rw("/ws", &t.under_rw),
            ro("/ws/in/deep/x.txt", &input),
            ro("/ws/out/bin/gen.txt", &input),
        ],
    ));
    assert!(
        fs::symlink_metadata(d.path("n"))
            .unwrap()
            .file_type()
            .is_symlink(),
        "the sandbox should be native"
    );
    // The owner of the scratch directory points what the daemon made there
    // at the protected directory: the entry it made (`in`), and a
    // directory on the way to one (`out`, holding `bin/gen.txt`).
    let protected = t.protected.to_str().unwrap();
    let script = format!(
        "cd {:?} && mv in in.orig && ln -s {protected}/in in && \
         mv out out.orig && ln -s {protected}/out out",
        t.under_rw
    );
    let out = as_nobody(&["sh", "-c", &script]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The destroy may report what it could not remove; it must not follow.
    let _ = d.client().destroy("n");
    assert_eq!(snapshot(&t.protected), before);
    t.assert_untouched_secret();
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn rmtree_as_root_removes_planted_symlinks_never_their_targets() {
    if !require(&[Need::Root]) {
        return;
    }
    let t = Target::new();
    let before = snapshot(&t.protected);
    let tree = t.under_rw.join("tree");
    let protected = t.protected.to_str().unwrap();
    let script = format!(
        "mkdir -p {tree:?}/sub/deeper && ln -s {protected} {tree:?}/link && \
         ln -s {protected}/secret {tree:?}/sub/secret && ln -s / {tree:?}/sub/deeper/root"
    );
    let out = as_nobody(&["sh", "-c", &script]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(bin())
        .args(["rmtree", "-v"])
        .arg(&tree)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!tree.exists());
    assert_eq!(snapshot(&t.protected), before);
    t.assert_untouched_secret();
}
