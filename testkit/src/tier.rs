//! Test tiers: what a test needs from the machine beyond a build.
//!
//! - unit: nothing (`cargo test --lib`, no mount);
//! - mount: a usable `/dev/fuse` (tests/*.rs mount real file systems);
//! - root: root, to act as a second user, mount loop devices or register
//!   passthrough files;
//! - Bazel end to end: `scripts/test` runs `../shared/bazel-e2e`.
//!
//! A test calls [`require`] first. Where the machine lacks what it needs,
//! the test says why on stderr and returns without asserting anything;
//! with `ACTIONFS_REQUIRE_ALL=1` (set by `.ci/run`) it fails instead, so CI
//! never passes by skipping.

use std::path::Path;
use std::process::Command;

/// Something a test needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Mounting a FUSE file system: `/dev/fuse`, and root or fusermount3.
    Mount,
    /// Running as root (other users via setpriv, mount(2), CAP_SYS_ADMIN).
    Root,
    /// A loop-mounted file system (root, losetup and mkfs.xfs).
    LoopDevice,
    /// Bazel's `linux-sandbox` jail ([`linux_sandbox`]) and root to run it.
    LinuxSandbox,
    /// Landlock with the ABI actionfs's jail needs.
    Landlock,
}

/// Bazel's `linux-sandbox` (Debian's bazel-bootstrap ships Bazel 4.2.3's),
/// or `$ACTIONFS_LINUX_SANDBOX`.
pub fn linux_sandbox() -> std::path::PathBuf {
    std::env::var_os("ACTIONFS_LINUX_SANDBOX")
        .map(Into::into)
        .unwrap_or_else(|| "/usr/libexec/x86_64-linux-gnu/bazel/linux-sandbox".into())
}

impl Need {
    fn missing(self) -> Option<String> {
        let root = is_root();
        match self {
            Need::Mount => {
                if !Path::new("/dev/fuse").exists() {
                    Some("/dev/fuse does not exist".to_owned())
                } else if !root && !on_path("fusermount3") {
                    Some("not root and no fusermount3 on PATH".to_owned())
                } else {
                    None
                }
            }
            Need::Root => (!root).then(|| "not running as root".to_owned()),
            Need::LinuxSandbox => {
                if !root {
                    Some("not running as root".to_owned())
                } else if !linux_sandbox().exists() {
                    Some(format!(
                        "{} is missing (bazel-bootstrap)",
                        linux_sandbox().display()
                    ))
                } else {
                    None
                }
            }
            Need::Landlock => {
                let abi = actionfs::jail::landlock_abi();
                (abi < actionfs::jail::MIN_ABI).then(|| {
                    format!(
                        "this kernel's Landlock ABI is {abi}, actionfs's jail needs {}",
                        actionfs::jail::MIN_ABI
                    )
                })
            }
            Need::LoopDevice => {
                if !root {
                    Some("not running as root".to_owned())
                } else if !on_path("mkfs.xfs") {
                    Some("mkfs.xfs is not installed (xfsprogs)".to_owned())
                } else if !Path::new("/dev/loop-control").exists() {
                    Some("no /dev/loop-control".to_owned())
                } else {
                    None
                }
            }
        }
    }
}

/// Whether CI asked that nothing be skipped.
pub fn require_all() -> bool {
    std::env::var_os("ACTIONFS_REQUIRE_ALL").is_some_and(|v| v == "1")
}

/// True if the machine offers every `need`. Otherwise prints why the
/// calling test is skipped and returns false, or panics under
/// `ACTIONFS_REQUIRE_ALL=1`.
pub fn require(needs: &[Need]) -> bool {
    for need in needs {
        if let Some(why) = need.missing() {
            return skip(&format!("{need:?}: {why}"));
        }
    }
    true
}

/// Skips the calling test for `why` (a reason found at run time, such as a
/// file system the test could not make), or fails it in CI.
pub fn skip(why: &str) -> bool {
    assert!(
        !require_all(),
        "ACTIONFS_REQUIRE_ALL=1, but a test cannot run: {why}"
    );
    eprintln!("skipped: {why}");
    false
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn on_path(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|out| out.status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_a_failure_only_when_everything_is_required() {
        // The only test in this binary that touches the variable.
        std::env::remove_var("ACTIONFS_REQUIRE_ALL");
        assert!(!skip("a reason"), "skipping says the test cannot run");
        std::env::set_var("ACTIONFS_REQUIRE_ALL", "1");
        let required = std::panic::catch_unwind(|| skip("a reason"));
        std::env::remove_var("ACTIONFS_REQUIRE_ALL");
        let message = *required.unwrap_err().downcast::<String>().unwrap();
        assert!(message.contains("a reason"), "{message}");
    }
}
