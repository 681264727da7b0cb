//! Mount-point housekeeping: clearing a stale mount left by a killed daemon,
//! unmounting on shutdown, and checking `allow_other` permission up front.

use std::io;
use std::path::Path;
use std::process::Command;

use crate::fuse::options::Allow;

/// True if `path` is a FUSE mount whose daemon is gone: every access fails
/// with ENOTCONN ("Transport endpoint is not connected").
///
/// The kernel is asked, not its attribute cache: a daemon that served on
/// io_uring queues is cut off only once the kernel has torn its rings down,
/// a few milliseconds after it died, while cached attributes still answer.
/// A request in that window waits for the teardown and fails with
/// ECONNABORTED, or ECANCELED if it was on its way to a dying ring.
pub fn is_stale(path: &Path) -> bool {
    matches!(
        stat_uncached(path),
        Err(err) if matches!(
            err.raw_os_error(),
            Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
        )
    )
}

/// stat(2) that makes a FUSE file system answer (AT_STATX_FORCE_SYNC).
#[cfg(target_os = "linux")]
fn stat_uncached(path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a zeroed statx is a valid out buffer; the path is a C string
    // that outlives the call.
    let done = unsafe {
        let mut buf: libc::statx = std::mem::zeroed();
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_STATX_FORCE_SYNC,
            libc::STATX_TYPE,
            &mut buf,
        )
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn stat_uncached(path: &Path) -> io::Result<()> {
    std::fs::metadata(path).map(|_| ())
}

/// Clears a stale mount at `path` if there is one. Returns whether it did.
pub fn clear_stale(path: &Path) -> io::Result<bool> {
    if !is_stale(path) {
        return Ok(false);
    }
    log::warn!("{path:?} is a stale mount (its daemon died); unmounting it");
    unmount_lazily(path)?;
    if is_stale(path) {
        return Err(io::Error::other(format!(
            "{path:?} is still a stale mount after unmounting it"
        )));
    }
    Ok(true)
}

/// Unmounts `path` the normal way, which fails with EBUSY while a file in
/// it is open or a process has its working directory inside. Uses umount2
/// directly when privileged, the setuid `fusermount3 -u` otherwise.
pub fn unmount(path: &Path) -> io::Result<()> {
    unmount_with(path, false)
}

/// Detaches the mount at `path` even if files in it are open (they keep
/// working while the daemon serves them). Uses umount2(MNT_DETACH)
/// directly when privileged, and the setuid `fusermount3 -u -z` otherwise.
pub fn unmount_lazily(path: &Path) -> io::Result<()> {
    unmount_with(path, true)
}

fn unmount_with(path: &Path, lazily: bool) -> io::Result<()> {
    let direct = if lazily {
        crate::sys::unmount_detached(path)
    } else {
        crate::sys::unmount(path)
    };
    let direct = match direct {
        Ok(()) => return Ok(()),
        Err(err) => err,
    };
    if direct.raw_os_error() != Some(libc::EPERM) {
        return Err(direct);
    }
    let flags: &[&str] = if lazily {
        &["-u", "-z", "--"]
    } else {
        &["-u", "--"]
    };
    let run = |program: &str| Command::new(program).args(flags).arg(path).output();
    let out = run("fusermount3")
        .or_else(|_| run("fusermount"))
        .map_err(|err| io::Error::new(err.kind(), format!("cannot run fusermount3: {err}")))?;
    if out.status.success() {
        return Ok(());
    }
    let message = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    // fusermount3 says why in words; a busy mount is what callers retry.
    if message.contains("busy") {
        return Err(io::Error::from_raw_os_error(libc::EBUSY));
    }
    Err(io::Error::other(format!(
        "fusermount3 {} {path:?} failed with {}: {message}",
        flags.join(" "),
        out.status
    )))
}

/// Whether this process may ask for `allow_other`, which `--allow=root`
/// and `--allow=other` need (checked up front: fusermount3 would fail with
/// a less helpful message).
pub fn allow_permitted(allow: Allow) -> bool {
    if allow == Allow::OwnerOnly || nix::unistd::geteuid().is_root() {
        return true;
    }
    let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    conf.lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .any(|line| line == "user_allow_other")
}
