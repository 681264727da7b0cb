//! The Linux checks: the fuse module, `/dev/fuse`, fusermount3,
//! `user_allow_other`, passthrough, `enable_uring`, and FICLONE.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{try_clone, Base, Check, Decision, State};
use crate::fuse::options::Allow;
use crate::tools::doctor::transport_choice::{self, UringFacts, ENABLE_URING, URING_SINCE};

pub const NAME: &str = "Linux";

/// FUSE passthrough arrived in Linux 6.9.
const PASSTHROUGH_SINCE: (u32, u32) = (6, 9);

/// CAP_SYS_ADMIN's bit in /proc/self/status's CapEff.
const CAP_SYS_ADMIN: u32 = 21;

const DEV_FUSE: &str = "/dev/fuse";

pub fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_else(|err| format!("unknown ({err})"))
}

/// The name of the file system `dir` is on.
pub fn fs_type(dir: &Path) -> String {
    let Ok(st) = nix::sys::statfs::statfs(dir) else {
        return "unknown".to_owned();
    };
    let magic = st.filesystem_type().0 as u64;
    let name = match magic {
        0x0102_1994 => "tmpfs",
        0x8584_58f6 => "ramfs",
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x794c_7630 => "overlay",
        0x2fc1_2fc1 => "zfs",
        0x6969 => "nfs",
        0x6573_5546 => "fuse",
        0xF2F5_2010 => "f2fs",
        _ => return format!("file system 0x{magic:x}"),
    };
    name.to_owned()
}

/// May this process mount by itself (mount(2)), without fusermount3?
fn privileged() -> bool {
    nix::unistd::geteuid().is_root() || has_cap_sys_admin()
}

fn has_cap_sys_admin() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

pub fn checks() -> Vec<Check> {
    let kernel = transport_choice::kernel_version();
    vec![
        fuse_module(),
        dev_fuse(),
        fusermount(),
        allow_other(),
        passthrough(kernel),
        enable_uring(&UringFacts::read()),
        landlock(),
    ]
}

/// Landlock, for `serve`'s own jail (`--jail=landlock`, the default).
fn landlock() -> Check {
    const KEY: &str = "landlock";
    const TITLE: &str = "Landlock";
    let abi = crate::jail::landlock_abi();
    if abi >= crate::jail::MIN_ABI {
        Check::ok(KEY, TITLE, format!("ABI {abi}: serve jails actions itself"))
    } else {
        Check::warn(
            KEY,
            TITLE,
            format!(
                "ABI {abi} (needs {}, Linux 6.12+, with landlock in lsm=): serve leaves actions \
                 to Bazel's linux-sandbox, about 10 ms an action",
                crate::jail::MIN_ABI
            ),
        )
    }
}

fn fuse_module() -> Check {
    const KEY: &str = "fuse_module";
    const TITLE: &str = "fuse module";
    match std::fs::read_to_string("/proc/filesystems") {
        Ok(list)
            if list
                .lines()
                .any(|l| l.split_whitespace().last() == Some("fuse")) =>
        {
            Check::ok(KEY, TITLE, "fuse is in /proc/filesystems")
        }
        Ok(_) => {
            Check::fail(KEY, TITLE, "fuse is not in /proc/filesystems").fix("sudo modprobe fuse")
        }
        Err(err) => Check::warn(KEY, TITLE, format!("cannot read /proc/filesystems: {err}")),
    }
}

fn dev_fuse() -> Check {
    const KEY: &str = "dev_fuse";
    const TITLE: &str = "/dev/fuse";
    let uid = nix::unistd::geteuid();
    let shown = match std::fs::metadata(DEV_FUSE) {
        Ok(meta) => format!(
            "mode {:o}, owner uid {}",
            meta.permissions().mode() & 0o7777,
            meta.uid()
        ),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Check::fail(KEY, TITLE, format!("{DEV_FUSE} does not exist"))
                .fix("sudo modprobe fuse || sudo mknod -m 0666 /dev/fuse c 10 229");
        }
        Err(err) => return Check::fail(KEY, TITLE, format!("stat {DEV_FUSE}: {err}")),
    };
    // Opening it is harmless: a descriptor mounts nothing until mount(2).
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(DEV_FUSE)
    {
        Ok(_) => Check::ok(KEY, TITLE, format!("open to uid {uid} ({shown})")),
        Err(err) if err.kind() == io::ErrorKind::PermissionDenied => Check::fail(
            KEY,
            TITLE,
            format!("not open to uid {uid} ({shown}): open: {err}"),
        )
        .fix("sudo chmod 0666 /dev/fuse"),
        Err(err) => Check::fail(KEY, TITLE, format!("open {DEV_FUSE} ({shown}): {err}")),
    }
}

/// The first of `names` found on PATH or in the usual system directories.
fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/bin", "/bin", "/usr/sbin", "/sbin"].map(PathBuf::from));
    names.iter().find_map(|name| {
        dirs.iter()
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

fn fusermount() -> Check {
    const KEY: &str = "fusermount3";
    const TITLE: &str = "fusermount3";
    let privileged = privileged();
    let Some(program) = find_program(&["fusermount3", "fusermount"]) else {
        let detail = "not installed";
        return if privileged {
            Check::ok(
                KEY,
                TITLE,
                format!("{detail}; not needed: with CAP_SYS_ADMIN the daemon mounts by itself"),
            )
        } else {
            Check::fail(
                KEY,
                TITLE,
                format!("{detail}: a daemon without CAP_SYS_ADMIN mounts through it"),
            )
            .fix("sudo apt-get install fuse3")
        };
    };
    let meta = match std::fs::metadata(&program) {
        Ok(meta) => meta,
        Err(err) => return Check::fail(KEY, TITLE, format!("stat {program:?}: {err}")),
    };
    let setuid_root = meta.uid() == 0 && meta.permissions().mode() & 0o4000 != 0;
    let shown = program.display();
    match (setuid_root, privileged) {
        (true, _) => Check::ok(KEY, TITLE, format!("{shown} is setuid root")),
        (false, true) => Check::ok(
            KEY,
            TITLE,
            format!("{shown} is not setuid root; not needed: the daemon mounts by itself"),
        ),
        (false, false) => Check::fail(
            KEY,
            TITLE,
            format!("{shown} is not setuid root, so it cannot mount for this user"),
        )
        .fix(format!("sudo chown root {shown} && sudo chmod u+s {shown}")),
    }
}

fn allow_other() -> Check {
    const KEY: &str = "allow_other";
    const TITLE: &str = "allow_other";
    if nix::unistd::geteuid().is_root() {
        Check::ok(KEY, TITLE, "not needed: the daemon runs as root")
    } else if crate::daemon::mount::allow_permitted(Allow::Everyone) {
        Check::ok(KEY, TITLE, "user_allow_other is in /etc/fuse.conf")
    } else {
        Check::warn(
            KEY,
            TITLE,
            "no user_allow_other in /etc/fuse.conf: --allow=other and --allow=root fail",
        )
        .fix("echo user_allow_other | sudo tee -a /etc/fuse.conf")
    }
}

fn passthrough(kernel: Option<(u32, u32)>) -> Check {
    const KEY: &str = "passthrough";
    const TITLE: &str = "passthrough";
    let (major, minor) = PASSTHROUGH_SINCE;
    match kernel {
        Some(k) if k < PASSTHROUGH_SINCE => Check::warn(
            KEY,
            TITLE,
            format!(
                "Linux {}.{} has no FUSE passthrough ({major}.{minor}+): file data goes through the daemon",
                k.0, k.1
            ),
        ),
        None => Check::warn(KEY, TITLE, "the kernel's version is unknown"),
        Some(_) if !has_cap_sys_admin() => Check::warn(
            KEY,
            TITLE,
            "the kernel has it, but registering backing files needs CAP_SYS_ADMIN",
        )
        .fix("run the daemon as root: sudo actionfs ..."),
        Some(_) => Check::ok(KEY, TITLE, "kernel and CAP_SYS_ADMIN allow it"),
    }
}

fn enable_uring(facts: &UringFacts) -> Check {
    const KEY: &str = "enable_uring";
    const TITLE: &str = "enable_uring";
    let (major, minor) = URING_SINCE;
    match (facts.kernel, facts.enabled) {
        (Some(k), _) if k < URING_SINCE => Check::warn(
            KEY,
            TITLE,
            format!(
                "Linux {}.{} has no FUSE over io_uring ({major}.{minor}+)",
                k.0, k.1
            ),
        ),
        (_, None) => Check::warn(
            KEY,
            TITLE,
            format!("{ENABLE_URING} is missing: the fuse module was built without io_uring"),
        ),
        (_, Some(false)) => Check::warn(
            KEY,
            TITLE,
            format!("off ({ENABLE_URING} is N): the io_uring transport cannot be used"),
        )
        .fix(format!("echo Y | sudo tee {ENABLE_URING}")),
        (_, Some(true)) => Check::ok(KEY, TITLE, format!("on ({ENABLE_URING} is Y)")),
    }
}

pub fn clone_check(base: &Base) -> Check {
    const KEY: &str = "reflink";
    const TITLE: &str = "reflink";
    let Some(dir) = &base.existing else {
        return Check::warn(KEY, TITLE, "cannot try: the sandbox base does not exist");
    };
    match try_clone(dir) {
        Ok(()) => Check::ok(
            KEY,
            TITLE,
            format!("FICLONE works on {}: clone and auto share extents", base.fs_type),
        ),
        Err(err)
            if [libc::EOPNOTSUPP, libc::EXDEV, libc::EINVAL, libc::ENOTTY]
                .contains(&err.raw_os_error().unwrap_or(0)) =>
        {
            Check::warn(
                KEY,
                TITLE,
                format!(
                    "{} cannot clone files (FICLONE: {err}): --native_method=clone fails, auto uses hard links or symlinks",
                    base.fs_type
                ),
            )
            .fix("put the sandbox base on xfs (mkfs.xfs -m reflink=1) or btrfs")
        }
        Err(err) => Check::warn(KEY, TITLE, format!("could not try in {dir:?}: {err}")),
    }
}

/// The transport and the open mode the daemon would use with its
/// defaults (`--transport=auto --zero_message_opens=off --passthrough=auto`).
pub fn decisions(checks: &[Check]) -> Vec<Decision> {
    use crate::fuse::transport::{self, Asked};
    // `auto` never fails: where the ring is not offered, it says why.
    let (chosen, why) = transport::choose(Asked::Auto)
        .unwrap_or_else(|why| (transport::Transport::Classic, why.to_string()));
    let passthrough_ok = checks
        .iter()
        .any(|c| c.key == "passthrough" && c.state == State::Ok);
    let open_mode = Decision {
        title: "open mode",
        choice: if passthrough_ok {
            "open, passthrough"
        } else {
            "open"
        }
        .to_owned(),
        why: format!(
            "--zero_message_opens=off (the default): every open reaches the daemon, which keeps \
             the file it opened for the handle, so open files behave as on the underlying files; \
             {}",
            if passthrough_ok {
                "file data is passed through (the kernel reads and writes the files itself)"
            } else {
                "file data goes through the daemon (passthrough needs CAP_SYS_ADMIN and Linux 6.9+)"
            }
        ),
    };
    vec![
        Decision {
            title: "transport",
            choice: match chosen {
                transport::Transport::Classic => "classic",
                transport::Transport::IoUring => "io_uring",
            }
            .to_owned(),
            why,
        },
        open_mode,
        jail_decision(),
    ]
}

/// The jail `serve --jail=landlock` (the default) would use here.
fn jail_decision() -> Decision {
    let abi = crate::jail::landlock_abi();
    if abi < crate::jail::MIN_ABI {
        return Decision {
            title: "jail",
            choice: "bazel".to_owned(),
            why: format!(
                "Landlock ABI {abi} (needs {}): serve leaves confinement to Bazel's linux-sandbox",
                crate::jail::MIN_ABI
            ),
        };
    }
    let program = crate::serve::confine::wrapper_program();
    let shown = program.join(" ");
    match crate::serve::confine::probe_namespaces(&program) {
        Ok(()) => Decision {
            title: "jail",
            choice: "landlock+namespaces".to_owned(),
            why: format!(
                "Landlock ABI {abi} and user namespaces: serve answers Create with its own \
                 wrapper ({shown}), the host read-only but the action's writable paths by \
                 its mounts (Landlock then rules the file system only where a path is \
                 hidden: no walk at every open), network and signals by Landlock"
            ),
        },
        Err(why) => Decision {
            title: "jail",
            choice: "landlock".to_owned(),
            why: format!(
                "Landlock ABI {abi}, but no user namespace ({why}): serve's own wrapper \
                 ({shown}) cannot keep inputs' modes and times, so every sandbox is FUSE \
                 (allow unprivileged user namespaces, e.g. Ubuntu's \
                 kernel.apparmor_restrict_unprivileged_userns=0, for native ones)"
            ),
        },
    }
}
