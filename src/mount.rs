//! Mount-point housekeeping: clearing a stale mount left by a killed daemon,
//! unmounting on shutdown, and checking `allow_other` permission up front.

use std::io;
use std::path::Path;
use std::process::Command;

use crate::config::Allow;

/// True if `path` is a FUSE mount whose daemon is gone: every access fails
/// with ENOTCONN ("Transport endpoint is not connected").
pub fn is_stale(path: &Path) -> bool {
    matches!(std::fs::metadata(path), Err(err) if err.raw_os_error() == Some(libc::ENOTCONN))
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

/// Detaches the mount at `path` even if files in it are open (they fail
/// from then on). Uses umount2(MNT_DETACH) directly when privileged, and
/// the setuid `fusermount3 -u -z` otherwise.
pub fn unmount_lazily(path: &Path) -> io::Result<()> {
    let direct = match crate::sys::unmount_detached(path) {
        Ok(()) => return Ok(()),
        Err(err) => err,
    };
    if direct.raw_os_error() != Some(libc::EPERM) {
        return Err(io::Error::new(
            direct.kind(),
            format!("detaching unmount of {path:?}: {direct}"),
        ));
    }
    let status = Command::new("fusermount3")
        .args(["-u", "-z", "--"])
        .arg(path)
        .status()
        .or_else(|_| {
            Command::new("fusermount")
                .args(["-u", "-z", "--"])
                .arg(path)
                .status()
        })
        .map_err(|err| io::Error::new(err.kind(), format!("cannot run fusermount3: {err}")))?;
    if !status.success() {
        return Err(io::Error::other(format!(
            "fusermount3 -u -z {path:?} failed with {status}"
        )));
    }
    Ok(())
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
