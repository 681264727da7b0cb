//! What Bazel's built-in jail leaves writable, which decides where native
//! sandboxes are safe.
//!
//! A Create answered with `confinement` unset runs the action in Bazel's
//! jail (`linux-sandbox` on Linux, Seatbelt on macOS): read-only except
//! the returned root, the action's scratch directory and the platform's
//! temporary directories. A native sandbox's inputs are symlinks to the
//! store (and to the exec root): if the store is in a writable place, an
//! action could write through one and change a digest's bytes for every
//! later sandbox. FUSE sandboxes refuse writes to inputs themselves, so
//! they are safe anywhere.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The directories Bazel's jail makes writable for every action
/// (`SandboxBackendSpawnRunner`'s confinement list, beside the sandbox
/// root and the action's scratch directory).
const WRITABLE: [&str; 4] = ["/dev", "/tmp", "/private/tmp", "/private/var/tmp"];

/// Whether `path` can be written by an action in Bazel's jail.
/// `linux-sandbox` bind-mounts each writable directory onto itself and
/// remounts every other mount read-only, so a path is writable when it
/// is below one of them on that directory's own mount (`/dev/shm`, a
/// mount of its own, stays read-only under a writable `/dev`). Seatbelt
/// allows whole subtrees.
pub fn writable_in_bazels_jail(path: &Path) -> bool {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let mounts = mount_points();
    WRITABLE.iter().map(Path::new).any(|dir| {
        path.starts_with(dir)
            && match (mount_of(&mounts, &path), mount_of(&mounts, dir)) {
                (Some(of_path), Some(of_dir)) => of_path == of_dir,
                // No mount table (macOS): Seatbelt's subpath rule.
                _ => true,
            }
    })
}

/// Whether `path` can be written by an action in actionfs's Landlock
/// jail, which allows Bazel's writable directories as whole hierarchies
/// (mounts below them included) and `/dev` only as its device nodes.
pub fn writable_in_landlock_jail(path: &Path) -> bool {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    WRITABLE[1..].iter().any(|dir| path.starts_with(dir))
}

/// The directories that hold `dir` (it and each one above it), by
/// device and inode: an action allowed to write one of them may write
/// below it, so into `dir`. Checked per Create against the writable
/// paths that Create names (`--sandbox_writable_path=/dev/shm`, say), as
/// [`writable_in_bazels_jail`] and [`writable_in_landlock_jail`] check
/// the fixed ones at the start.
pub struct Holders(Vec<(u64, u64)>);

impl Holders {
    /// The holders of `dir` in a jail that allows whole hierarchies
    /// (Landlock), or, with `bind_mounts`, one that bind-mounts each
    /// writable directory onto itself and keeps every other mount
    /// read-only (linux-sandbox): there only directories on `dir`'s own
    /// mount count.
    pub fn of(dir: &Path, bind_mounts: bool) -> Holders {
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
        let ids: Vec<(u64, u64)> = dir
            .ancestors()
            .filter_map(|holder| std::fs::metadata(holder).ok())
            .map(|meta| (meta.dev(), meta.ino()))
            .collect();
        let own = ids.first().map(|&(dev, _)| dev);
        Holders(
            ids.into_iter()
                .filter(|&(dev, _)| !bind_mounts || Some(dev) == own)
                .collect(),
        )
    }

    /// Whether `path`, where the symlinks in it lead, is one of them.
    pub fn include(&self, path: &Path) -> bool {
        std::fs::metadata(path).is_ok_and(|meta| self.0.contains(&(meta.dev(), meta.ino())))
    }
}

/// The mount points of this process's mount namespace; empty where the
/// system has no `/proc/self/mountinfo`.
fn mount_points() -> Vec<PathBuf> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_octal(field)))
        .collect()
}

/// The mount `path` is on: the longest mount point above it.
fn mount_of<'a>(mounts: &'a [PathBuf], path: &Path) -> Option<&'a PathBuf> {
    mounts
        .iter()
        .filter(|mount| path.starts_with(mount))
        .max_by_key(|mount| mount.as_os_str().len())
}

/// mountinfo writes a space, tab, newline or backslash as `\NNN`.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'\\' && at + 3 < bytes.len() {
            let digits = std::str::from_utf8(&bytes[at + 1..at + 4]).unwrap_or("");
            if let Ok(code) = u8::from_str_radix(digits, 8) {
                out.push(code);
                at += 4;
                continue;
            }
        }
        out.push(bytes[at]);
        at += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmp_is_writable_in_the_jail_and_dev_shm_is_not() {
        assert!(writable_in_bazels_jail(Path::new("/tmp")));
        assert!(writable_in_bazels_jail(Path::new("/tmp/some/base")));
        assert!(!writable_in_bazels_jail(Path::new("/var/tmp/base")));
        assert!(!writable_in_bazels_jail(Path::new("/work")));
        assert!(writable_in_landlock_jail(Path::new("/tmp/some/base")));
        assert!(!writable_in_landlock_jail(Path::new("/dev/shm/base")));
        if Path::new("/proc/self/mountinfo").exists() {
            let shm_is_a_mount = mount_points().iter().any(|m| m == Path::new("/dev/shm"));
            assert_eq!(
                writable_in_bazels_jail(Path::new("/dev/shm/base")),
                !shm_is_a_mount
            );
        }
    }

    #[test]
    fn a_directory_is_held_by_itself_and_each_above_it_on_its_mount_in_bazels_jail() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("a/b");
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(top.path().join("a"), top.path().join("link")).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        for bind_mounts in [false, true] {
            let holders = Holders::of(&dir, bind_mounts);
            assert!(holders.include(&dir));
            assert!(holders.include(top.path()));
            assert!(
                holders.include(&top.path().join("link")),
                "through a symlink"
            );
            assert!(!holders.include(elsewhere.path()));
            assert!(!holders.include(&dir.join("missing")));
        }
        // "/" is on another mount than /dev/shm where that is one.
        let shm = Path::new("/dev/shm");
        if shm.is_dir() && mount_points().iter().any(|m| m == shm) {
            let below = tempfile::tempdir_in(shm).unwrap();
            assert!(Holders::of(below.path(), false).include(Path::new("/")));
            assert!(!Holders::of(below.path(), true).include(Path::new("/")));
            assert!(Holders::of(below.path(), true).include(shm));
        }
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_octal(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape_octal(r"/plain"), "/plain");
        assert_eq!(unescape_octal(r"/end\"), "/end\\");
    }
}
