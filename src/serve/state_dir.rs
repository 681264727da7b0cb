//! Where a backend that keeps warm state (`--keep_state=on`) keeps it
//! while it runs: `BASE/actionfs-state-UID`, claimed by a lock held for
//! the backend's life. Its store lives there, so that content handed on
//! comes back to the next backend at the same paths, and the native trees
//! one backend stashed, whose symlinks name those paths, can be handed on
//! too (`stashes/`), as can where its looks at default places found files
//! (`looks`) and its store's directory blobs (`directories`). Of two
//! backends on one base, the second finds the directory held and keeps
//! its store in its own directory (its content is still handed on; the
//! rest is not). A lock dies with its holder, so a killed backend's
//! leftovers are found by the next claim and removed as the store opens.
//! A backend that hands none of these on removes the directory as it
//! ends.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::sandbox::ownership::{self, Rules};

/// The state directory, claimed.
pub struct Claimed {
    path: PathBuf,
    _lock: Flock<File>,
}

impl Claimed {
    /// Claims the state directory of this user on `base` (making it if
    /// missing): `None` if another live backend holds it.
    pub fn claim(base: &Path) -> Result<Option<Claimed>, ClaimError> {
        let path = base.join(format!("actionfs-state-{}", nix::unistd::geteuid()));
        // A holder that ends removes the lock file and the directory: a
        // claim that raced with that finds its lock unlinked, and again.
        let mut last = None;
        for _ in 0..3 {
            match Claimed::try_claim(&path) {
                Ok(claimed) => return Ok(claimed),
                Err(Retry::Raced(why)) => last = Some(why),
                Err(Retry::No(why)) => return Err(why),
            }
        }
        Err(last.expect("three tries, each raced"))
    }

    fn try_claim(path: &Path) -> Result<Option<Claimed>, Retry> {
        let path = path.to_owned();
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(Retry::No(ClaimError::io("mkdir", &path, err)))
            }
            _ => {}
        }
        ownership::check(&path, &Rules::PRIVATE)
            .map_err(|err| Retry::No(ClaimError::NotOurs(err)))?;
        let lock_path = path.join("lock");
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&lock_path)
            .map_err(|err| {
                let raced = err.kind() == std::io::ErrorKind::NotFound;
                let why = ClaimError::io("open", &lock_path, err);
                match raced {
                    true => Retry::Raced(why),
                    false => Retry::No(why),
                }
            })?;
        let lock = match Flock::lock(lock, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, errno)) => {
                return Err(Retry::No(ClaimError::io("flock", &lock_path, errno.into())))
            }
        };
        let held = nix::sys::stat::fstat(&*lock).map(|st| (st.st_dev, st.st_ino));
        let named = nix::sys::stat::lstat(&lock_path).map(|st| (st.st_dev, st.st_ino));
        match (held, named) {
            (Ok(held), Ok(named)) if held == named => Ok(Some(Claimed { path, _lock: lock })),
            _ => Err(Retry::Raced(ClaimError::LockRemoved(lock_path))),
        }
    }

    /// Ends the claim: the store's directory goes (its content was handed
    /// on, or is not to be), and, unless stashes, looks or directories
    /// were handed on, the whole directory, the lock last, while still
    /// held.
    pub fn release(self) {
        let store = self.store();
        if store.exists() {
            if let Err(err) = crate::sandbox::materialize::remove_tree(&store) {
                log::warn!("cannot remove the store's directory: {err}");
            }
        }
        if self.stashes().exists() || self.looks().exists() || self.directories().exists() {
            return;
        }
        let _ = std::fs::remove_file(self.path.join("lock"));
        if let Err(err) = std::fs::remove_dir(&self.path) {
            log::warn!("cannot remove {:?}: {err}", self.path);
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The store's directory.
    pub fn store(&self) -> PathBuf {
        self.path.join("store")
    }

    /// Where stashed native trees are handed on.
    pub fn stashes(&self) -> PathBuf {
        self.path.join("stashes")
    }

    /// Where the looks at default places are handed on.
    pub fn looks(&self) -> PathBuf {
        self.path.join("looks")
    }

    /// Where the store's directory blobs are handed on.
    pub fn directories(&self) -> PathBuf {
        self.path.join("directories")
    }
}

enum Retry {
    /// Raced with a holder that was ending: try again.
    Raced(ClaimError),
    No(ClaimError),
}

/// Why the state directory cannot be claimed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("{syscall} {path:?}: {source}")]
    Io {
        syscall: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    NotOurs(crate::sandbox::ownership::OwnershipError),
    /// A holder that was ending removed it, three times.
    #[error("{0:?} was removed as it was locked")]
    LockRemoved(PathBuf),
}

impl ClaimError {
    fn io(syscall: &'static str, path: &Path, source: std::io::Error) -> ClaimError {
        ClaimError::Io {
            syscall,
            path: path.to_owned(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_claim_at_a_time_and_a_released_one_is_claimed_again() {
        let base = tempfile::tempdir().unwrap();
        let first = Claimed::claim(base.path()).unwrap().expect("free");
        assert!(first.path().starts_with(base.path()));
        // flock locks belong to the open file: a second open is refused
        // even in the same process, as another backend's would be.
        assert!(Claimed::claim(base.path()).unwrap().is_none(), "held");
        drop(first);
        let again = Claimed::claim(base.path()).unwrap().expect("released");
        // Released with nothing handed on: nothing left.
        std::fs::create_dir_all(again.store().join("c")).unwrap();
        again.release();
        assert_eq!(std::fs::read_dir(base.path()).unwrap().count(), 0);
        // With stashes handed on, they and the lock stay.
        let last = Claimed::claim(base.path()).unwrap().expect("free");
        std::fs::create_dir(last.stashes()).unwrap();
        let dir = last.path().to_owned();
        last.release();
        assert!(dir.join("stashes").is_dir() && dir.join("lock").is_file());
        assert!(!dir.join("store").exists());
        // So do looks handed on, without stashes.
        let looks = Claimed::claim(base.path()).unwrap().expect("free");
        std::fs::remove_dir(looks.stashes()).unwrap();
        std::fs::write(looks.looks(), b"").unwrap();
        looks.release();
        assert!(dir.join("looks").is_file() && dir.join("lock").is_file());
        // And directory blobs, alone.
        let directories = Claimed::claim(base.path()).unwrap().expect("free");
        std::fs::remove_file(directories.looks()).unwrap();
        std::fs::write(directories.directories(), b"").unwrap();
        directories.release();
        assert!(dir.join("directories").is_file() && dir.join("lock").is_file());
    }

    #[test]
    fn a_state_directory_others_may_enter_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        let dir = base
            .path()
            .join(format!("actionfs-state-{}", nix::unistd::geteuid()));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let why = Claimed::claim(base.path()).err().expect("refused");
        assert!(matches!(why, ClaimError::NotOurs(_)), "{why}");
        assert!(why.to_string().contains("not ours alone"), "{why}");
    }
}
