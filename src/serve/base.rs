//! This backend's own directory below the sandbox base,
//! `actionfs-serve-<pid>`, which holds everything it makes (mount, scratch
//! directories, native trees, store), and what dead predecessors left
//! beside it.
//!
//! A backend holds an exclusive `flock` on its directory for as long as it
//! lives; the kernel drops it however the process ends, SIGKILL included.
//! So a directory whose lock can be taken belongs to a dead backend, which
//! a pid cannot tell (pids are reused, and a live pid may be anything).
//! The directory is made and locked under a starting name and renamed into
//! place, so that no live backend's directory is ever seen unlocked.
//!
//! At start, every dead backend's directory on the base is removed, after
//! the mounts below it are detached (a killed backend's FUSE mount answers
//! ENOTCONN until then); a live one's is never touched. At stop, ours is
//! removed whole.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::daemon::mount;
use crate::sandbox::materialize::remove_tree;
use crate::serve::error::StartError;

const PREFIX: &str = "actionfs-serve-";

/// Our directory, locked until dropped.
pub struct Base {
    path: PathBuf,
    _lock: Flock<File>,
}

impl Base {
    /// Removes what dead backends left in `parent`, then makes and locks
    /// our directory there. The error names the path and the call.
    pub fn make(parent: &Path) -> Result<(Base, Swept), StartError> {
        if !parent.is_absolute() {
            return Err(StartError::SandboxBaseNotAbsolute(parent.to_owned()));
        }
        let swept = sweep(parent);
        let name = format!("{PREFIX}{}", std::process::id());
        let path = parent.join(&name);
        let starting = parent.join(format!(".{name}.new"));
        // One of our pid is a dead backend's: ours starts only now.
        if starting.symlink_metadata().is_ok() {
            remove_tree(&starting)?;
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&starting)
            .map_err(|err| StartError::io("mkdir", &starting, err))?;
        let locked = open_dir(&starting)
            .map_err(|err| StartError::io("open", &starting, err))
            .and_then(
                |dir| match Flock::lock(dir, FlockArg::LockExclusiveNonblock) {
                    Ok(lock) => Ok(lock),
                    Err((_, errno)) => Err(StartError::io("flock", &starting, errno.into())),
                },
            )
            .and_then(|lock| {
                std::fs::rename(&starting, &path)
                    .map(|()| lock)
                    .map_err(|err| StartError::io("rename", &starting, err))
            });
        match locked {
            Ok(lock) => Ok((Base { path, _lock: lock }, swept)),
            Err(why) => {
                let _ = std::fs::remove_dir(&starting);
                Err(why)
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes our directory and everything in it; the lock goes with the
    /// value.
    pub fn remove(self) -> Result<(), crate::sandbox::materialize::Error> {
        remove_tree(&self.path).map(drop)
    }
}

/// What a start removed of dead backends' leftovers, and what it could
/// not: said in one line, or nothing if there was nothing.
#[derive(Default)]
pub struct Swept {
    parent: PathBuf,
    removed: Vec<String>,
    failed: Vec<String>,
}

impl Swept {
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.failed.is_empty()
    }
}

impl fmt::Display for Swept {
    /// `removed what 2 dead backends left in /dev/shm (actionfs-serve-1,
    /// actionfs-serve-2)`, then `; cannot remove ...` for each failure.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMED: usize = 8;
        let n = self.removed.len();
        if n > 0 {
            let plural = if n == 1 { "" } else { "s" };
            write!(
                f,
                "removed what {n} dead backend{plural} left in {} ({}",
                self.parent.display(),
                self.removed[..n.min(NAMED)].join(", ")
            )?;
            if n > NAMED {
                write!(f, " and {} more", n - NAMED)?;
            }
            f.write_str(")")?;
        }
        for (i, why) in self.failed.iter().enumerate() {
            let gap = if n > 0 || i > 0 { "; " } else { "" };
            write!(f, "{gap}cannot remove what a dead backend left: {why}")?;
        }
        Ok(())
    }
}

/// Removes every dead backend's directory in `parent`.
fn sweep(parent: &Path) -> Swept {
    let mut swept = Swept {
        parent: parent.to_owned(),
        ..Swept::default()
    };
    let entries = match std::fs::read_dir(parent) {
        Ok(entries) => entries,
        // Made below if missing; any other failure shows there too.
        Err(_) => return swept,
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((pid, starting)) = backend_of(&name) else {
            continue;
        };
        let path = parent.join(&name);
        let dir = match open_dir(&path) {
            Ok(dir) => dir,
            // Gone meanwhile (another start removed it), or not a directory.
            Err(err)
                if matches!(
                    err.raw_os_error(),
                    Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
                ) =>
            {
                continue
            }
            Err(err) => {
                swept.failed.push(format!("open {path:?}: {err}"));
                continue;
            }
        };
        // Another user's (in a shared base such as /dev/shm) is not ours
        // to judge, nor, for a backend running as root, to remove.
        match nix::sys::stat::fstat(&dir) {
            Ok(st) if st.st_uid == nix::unistd::geteuid().as_raw() => {}
            Ok(_) => continue,
            Err(errno) => {
                swept.failed.push(format!("fstat {path:?}: {errno}"));
                continue;
            }
        }
        // Held while removing, so that a start beside us leaves it alone.
        let _lock = match Flock::lock(dir, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => continue,
            Err((_, errno)) => {
                swept.failed.push(format!("flock {path:?}: {errno}"));
                continue;
            }
        };
        // A starting name is unlocked for a moment after its mkdir.
        if starting && is_alive(pid) {
            continue;
        }
        match remove_dead(&path) {
            Ok(()) => swept.removed.push(name),
            Err(why) => swept.failed.push(why.to_string()),
        }
    }
    swept.removed.sort();
    swept
}

/// The pid in a backend directory's name, and whether it is the starting
/// name (`.actionfs-serve-PID.new`).
fn backend_of(name: &str) -> Option<(i32, bool)> {
    let (digits, starting) = match name.strip_prefix(PREFIX) {
        Some(digits) => (digits, false),
        None => (
            name.strip_prefix('.')?
                .strip_prefix(PREFIX)?
                .strip_suffix(".new")?,
            true,
        ),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((digits.parse().ok()?, starting))
}

fn is_alive(pid: i32) -> bool {
    // EPERM: alive, another user's.
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(errno) => errno != nix::errno::Errno::ESRCH,
    }
}

/// A directory, never through a symlink; close-on-exec, so that no child
/// holds its lock.
fn open_dir(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Detaches what is mounted below `dir`, then removes it. Nothing is
/// removed through a mount that stays.
fn remove_dead(dir: &Path) -> Result<(), StartError> {
    for point in mounts_below(dir)? {
        match mount::unmount_lazily(&point) {
            Ok(()) => {}
            // Not a mount (only guessed where the table cannot be read).
            Err(err) if !cfg!(target_os = "linux") && err.raw_os_error() == Some(libc::EINVAL) => {}
            Err(err) => return Err(StartError::io("umount", &point, err)),
        }
    }
    #[cfg(target_os = "linux")]
    if let Some(left) = mounts_below(dir)?.first() {
        return Err(StartError::StillMounted(left.clone()));
    }
    remove_tree(dir)?;
    Ok(())
}

/// The mount points at or below `dir`, deepest first, from the mount table.
#[cfg(target_os = "linux")]
fn mounts_below(dir: &Path) -> Result<Vec<PathBuf>, StartError> {
    const TABLE: &str = "/proc/self/mountinfo";
    // The table names mount points by their resolved paths.
    let dir = &std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    let table = std::fs::read_to_string(TABLE).map_err(|err| StartError::io("read", TABLE, err))?;
    let mut below: Vec<PathBuf> = table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape)
        .filter(|point| point.starts_with(dir))
        .collect();
    below.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    below.dedup();
    Ok(below)
}

/// Where there is no mount table to read: the one mount a backend makes.
#[cfg(not(target_os = "linux"))]
fn mounts_below(dir: &Path) -> Result<Vec<PathBuf>, StartError> {
    let point = dir.join("mnt");
    Ok(if point.symlink_metadata().is_ok() {
        vec![point]
    } else {
        Vec::new()
    })
}

/// A mount table field: space, tab, newline and backslash are written as
/// `\ooo` octal escapes.
#[cfg(target_os = "linux")]
fn unescape(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_and_the_line_that_says_what_was_removed() {
        assert_eq!(backend_of("actionfs-serve-123"), Some((123, false)));
        assert_eq!(backend_of(".actionfs-serve-7.new"), Some((7, true)));
        for other in [
            "actionfs-serve-",
            "actionfs-serve-12x",
            "actionfs-serve-1.new",
            "x",
        ] {
            assert_eq!(backend_of(other), None, "{other}");
        }
        let mut swept = Swept {
            parent: PathBuf::from("/dev/shm"),
            ..Swept::default()
        };
        assert!(swept.is_empty());
        swept.removed = vec!["actionfs-serve-1".into(), "actionfs-serve-2".into()];
        assert_eq!(
            swept.to_string(),
            "removed what 2 dead backends left in /dev/shm (actionfs-serve-1, actionfs-serve-2)"
        );
        swept.removed.truncate(1);
        swept.failed.push("umount \"/x\": EPERM".into());
        assert_eq!(
            swept.to_string(),
            "removed what 1 dead backend left in /dev/shm (actionfs-serve-1); cannot remove what \
             a dead backend left: umount \"/x\": EPERM"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn mount_table_escapes_are_undone() {
        assert_eq!(unescape("/a\\040b\\134c"), PathBuf::from("/a b\\c"));
        assert_eq!(unescape("/plain\\0"), PathBuf::from("/plain\\0"));
    }

    #[test]
    fn another_users_directory_is_left_alone() {
        if !nix::unistd::geteuid().is_root() {
            // Making a directory another user's takes root.
            assert!(
                !actionfs_testkit::tier::require_all(),
                "ACTIONFS_REQUIRE_ALL=1, but this test needs root"
            );
            eprintln!("skipped: needs root");
            return;
        }
        let parent = tempfile::tempdir().unwrap();
        let theirs = parent.path().join("actionfs-serve-2");
        std::fs::create_dir_all(theirs.join("scratch")).unwrap();
        let nobody = Some(nix::unistd::Uid::from_raw(65534));
        nix::unistd::chown(&theirs, nobody, None).unwrap();
        let swept = sweep(parent.path());
        assert!(swept.is_empty(), "{swept}");
        assert!(theirs.join("scratch").is_dir());
    }

    #[test]
    fn a_dead_directory_is_removed_and_a_locked_one_kept() {
        let parent = tempfile::tempdir().unwrap();
        let dead = parent.path().join("actionfs-serve-1");
        std::fs::create_dir_all(dead.join("scratch/s")).unwrap();
        let (ours, swept) = Base::make(parent.path()).unwrap();
        assert_eq!(swept.removed, ["actionfs-serve-1"]);
        assert!(!dead.exists());
        assert_eq!(
            ours.path().file_name().unwrap().to_str().unwrap(),
            format!("actionfs-serve-{}", std::process::id())
        );
        // Ours is locked: a second look at the base leaves it.
        let again = sweep(parent.path());
        assert!(again.is_empty(), "{again}");
        assert!(ours.path().is_dir());
        ours.remove().unwrap();
        assert!(std::fs::read_dir(parent.path()).unwrap().next().is_none());
    }
}
