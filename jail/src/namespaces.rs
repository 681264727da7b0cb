//! The host seen read-only: a user and mount namespace in which every
//! mount is read-only but the rules' `write` hierarchies, which are bind
//! mounts of themselves taken before. A read-only mount refuses every
//! change to what is below it, metadata included (`chmod`, `chown`,
//! `utimensat`, extended attributes, `truncate`, links and renames), which
//! Landlock cannot rule; writes to device nodes and FIFOs are unaffected
//! (as in linux-sandbox; Landlock rules them only where it rules the file
//! system, see `landlock::rules_files`).
//!
//! The action keeps its user and group (mapped to themselves, as
//! linux-sandbox does without `-R`) but no capability: with one it could
//! clear the read-only flag of a mount made read-only here.

use std::ffi::CString;
use std::io::Error;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::Rules;

// <linux/mount.h>, for the new mount API (Linux 5.12).
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
/// A symlink at the target is followed (a native sandbox's root is one).
const MOVE_MOUNT_T_SYMLINKS: libc::c_uint = 0x10;
const MOUNT_ATTR_RDONLY: u64 = 1;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Moves this process into a new user and mount namespace, its user and
/// group mapped to themselves, and makes the host read-only there but
/// `rules.write`; enters the working directory again, so that it is
/// reached through the new mounts.
pub fn enter(rules: &Rules) -> Result<(), String> {
    let cwd = std::env::current_dir().map_err(|err| format!("getcwd: {err}"))?;
    // SAFETY: plain system calls on this process's credentials.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // SAFETY: unshare changes only this (single-threaded) process's
    // namespaces.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
        return Err(format!(
            "unshare(CLONE_NEWUSER | CLONE_NEWNS): {}",
            Error::last_os_error()
        ));
    }
    map_ids(uid, gid)?;
    let mut clones = Vec::new();
    for path in outermost(&rules.write) {
        match open_tree_clone(path) {
            Ok(tree) => clones.push((tree, path)),
            // Nothing to allow where nothing is (Bazel lists macOS's
            // /private/tmp on every system).
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {}
            Err(err) => return Err(format!("open_tree {path:?} (OPEN_TREE_CLONE): {err}")),
        }
    }
    set_read_only(Path::new("/"))?;
    for (tree, path) in &clones {
        move_mount(tree, path)?;
    }
    std::env::set_current_dir(&cwd).map_err(|err| format!("chdir {cwd:?}: {err}"))
}

/// Whether [`enter`] works here (run in a process of its own: it
/// changes the caller's namespaces).
pub fn probe() -> Result<(), String> {
    enter(&Rules::default())
}

/// Leaves this process no capability, and none to gain at an exec: uid 0
/// in the namespace gets none for being root (`SECBIT_NOROOT`, locked),
/// and file capabilities are ignored under `no_new_privs` (Landlock set
/// it).
pub fn drop_capabilities() -> Result<(), String> {
    // <linux/securebits.h>: NOROOT (bit 0), NO_SETUID_FIXUP (2) and
    // NO_CAP_AMBIENT_RAISE (6), each with its lock (the bit above), and
    // KEEP_CAPS locked off (5).
    const SECURE_BITS: libc::c_ulong = 0b1110_1111;
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, SECURE_BITS, 0, 0, 0) } != 0 {
        return Err(format!(
            "prctl(PR_SET_SECUREBITS): {}",
            Error::last_os_error()
        ));
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let none = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: a v3 header and its two data words, alive across the call.
    // Ambient capabilities go with the permitted ones.
    if unsafe { libc::syscall(libc::SYS_capset, &header, none.as_ptr()) } != 0 {
        return Err(format!("capset (none): {}", Error::last_os_error()));
    }
    Ok(())
}

/// Maps this process's user and group (outside) to themselves in its
/// new user namespace: a process may map only its own ids there, after
/// giving up `setgroups`. Other owners show as the overflow id (nobody),
/// as in linux-sandbox.
fn map_ids(uid: libc::uid_t, gid: libc::gid_t) -> Result<(), String> {
    let write = |file: &str, text: String| {
        std::fs::write(file, text.as_bytes()).map_err(|err| format!("write {file} {text:?}: {err}"))
    };
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    write("/proc/self/gid_map", format!("{gid} {gid} 1"))
}

/// The writable paths, shortest first, leaving out any below another (a
/// clone of the one above holds it, with its mounts). Paths are taken as
/// given (Bazel's are absolute and resolved): resolving each would cost
/// a readlink per component, and a path below a symlink is at worst
/// mounted twice.
fn outermost(write: &[PathBuf]) -> Vec<&Path> {
    let mut sorted: Vec<&Path> = write.iter().map(PathBuf::as_path).collect();
    sorted.sort_by_key(|path| path.as_os_str().len());
    let mut kept: Vec<&Path> = Vec::new();
    for path in sorted {
        if !kept.iter().any(|above| path.starts_with(above)) {
            kept.push(path);
        }
    }
    kept
}

fn c_path(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("{path:?}: holds a NUL"))
}

/// A detached copy of the mounts at and below `path`, as they are now.
fn open_tree_clone(path: &Path) -> Result<OwnedFd, Error> {
    let c = c_path(path).map_err(Error::other)?;
    // SAFETY: open_tree with a valid C string; returns a new descriptor.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: a descriptor open_tree just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Every mount at and below `path` read-only.
fn set_read_only(path: &Path) -> Result<(), String> {
    let c = c_path(path)?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr with a valid C string and attribute struct.
    let done = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_RECURSIVE as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if done != 0 {
        return Err(format!(
            "mount_setattr {path:?} (MOUNT_ATTR_RDONLY, recursive): {}",
            Error::last_os_error()
        ));
    }
    Ok(())
}

/// Attaches the detached `tree` at `path`.
fn move_mount(tree: &OwnedFd, path: &Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let c = c_path(path)?;
    // SAFETY: move_mount from a live descriptor to a valid C string.
    let done = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_SYMLINKS,
        )
    };
    if done != 0 {
        return Err(format!(
            "move_mount onto {path:?}: {}",
            Error::last_os_error()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_outermost_writable_paths_are_mounted() {
        let paths: Vec<PathBuf> = ["/s/a/b", "/s/a", "/t", "/s/ab", "/t/x/y"]
            .into_iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(
            outermost(&paths),
            [Path::new("/t"), Path::new("/s/a"), Path::new("/s/ab")]
        );
    }
}
