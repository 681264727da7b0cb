//! Checking every argument of the daemon before anything is changed: the
//! mappings, the stream paths, the paths it will create, then the mount
//! point, so that the first mistake is the one reported and a refused
//! start leaves nothing behind. What is created afterwards is undone if a
//! later step fails ([`Created`]).

use std::io;
use std::path::{Path, PathBuf};

use nix::unistd::{access, AccessFlags};

use super::DaemonError;
use crate::daemon::config::DaemonConfig;
use crate::daemon::mount;

/// What a check of the mount point found.
pub struct MountPoint {
    /// Absolute, symlinks resolved where the path can be resolved.
    pub path: PathBuf,
    /// A mount left by a killed daemon is there, to be cleared.
    pub stale: bool,
}

/// The absolute form of `path`, for checks that need one before the mount
/// point itself has been checked: resolved if it can be, else its parent
/// resolved and its name joined, else as given made absolute.
pub fn absolute_mount_point(path: &Path) -> PathBuf {
    if let Ok(resolved) = std::fs::canonicalize(path) {
        return resolved;
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match (std::fs::canonicalize(parent), path.file_name()) {
        (Ok(parent), Some(name)) => parent.join(name),
        _ => std::path::absolute(path).unwrap_or_else(|_| path.to_owned()),
    }
}

/// Checks that the mount point is a directory, or a stale mount that can
/// be cleared; changes nothing.
pub fn mount_point(path: &Path) -> Result<MountPoint, DaemonError> {
    let unusable = |source| DaemonError::MountPoint {
        path: path.to_owned(),
        source,
    };
    if mount::is_stale(path) {
        return Ok(MountPoint {
            path: absolute_mount_point(path),
            stale: true,
        });
    }
    let metadata = std::fs::metadata(path).map_err(unusable)?;
    if !metadata.is_dir() {
        return Err(DaemonError::NotADirectory(path.to_owned()));
    }
    Ok(MountPoint {
        path: std::fs::canonicalize(path).map_err(unusable)?,
        stale: false,
    })
}

/// Checks that every file the daemon will make (`--output`,
/// `--access_log`, `--record`, `--control`) can be made, making none.
pub fn paths_to_make(options: &DaemonConfig) -> Result<(), DaemonError> {
    if let Some(path) = &options.output {
        creatable(path).map_err(|source| DaemonError::Output {
            path: path.clone(),
            source,
        })?;
    }
    if let Some(path) = &options.access_log {
        creatable(path).map_err(|source| DaemonError::AccessLog {
            path: path.clone(),
            source,
        })?;
    }
    if let Some(path) = &options.record {
        creatable(path).map_err(|source| DaemonError::Record {
            path: path.clone(),
            source,
        })?;
    }
    if let Some(path) = &options.control {
        creatable(path).map_err(|err| {
            DaemonError::Control(io::Error::new(
                err.kind(),
                format!("control socket {path:?}: {err}"),
            ))
        })?;
    }
    Ok(())
}

/// Checks that a file can be created or written at `path` without
/// creating it: an existing file must be writable and not a directory, a
/// new one needs a writable directory to be made in.
fn creatable(path: &Path) -> io::Result<()> {
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.is_dir() => Err(io::Error::from_raw_os_error(libc::EISDIR)),
        Ok(_) => access(path, AccessFlags::W_OK).map_err(io::Error::from),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            let parent = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            // The error first: it reads as the file's own ("No such file
            // or directory"), as sandboxfs 0.2.0's open did.
            let metadata = std::fs::metadata(parent).map_err(|err| {
                io::Error::new(
                    err.kind(),
                    format!("{err} (stat of its directory {parent:?})"),
                )
            })?;
            if !metadata.is_dir() {
                return Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{parent:?} is not a directory"),
                ));
            }
            access(parent, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|err| {
                io::Error::new(
                    io::Error::from(err).kind(),
                    format!("{err} (access of its directory {parent:?})"),
                )
            })
        }
        Err(err) => Err(err),
    }
}

/// Paths made while starting, removed again unless the start succeeds.
#[derive(Default)]
pub struct Created {
    paths: Vec<PathBuf>,
}

impl Created {
    /// Runs `make`, which creates `path`; if `path` did not exist before,
    /// it is removed should the start fail later.
    pub fn make<T, E>(&mut self, path: &Path, make: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let existed = std::fs::symlink_metadata(path).is_ok();
        let made = make()?;
        if !existed {
            self.paths.push(path.to_owned());
        }
        Ok(made)
    }

    /// The start succeeded: keep everything.
    pub fn keep(mut self) {
        self.paths.clear();
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        for path in self.paths.iter().rev() {
            let removed = match std::fs::symlink_metadata(path) {
                Ok(metadata) if metadata.is_dir() => std::fs::remove_dir_all(path),
                Ok(_) => std::fs::remove_file(path),
                Err(_) => Ok(()),
            };
            if let Err(err) = removed {
                log::warn!("cannot remove {path:?}, made while starting: {err}");
            }
        }
    }
}
