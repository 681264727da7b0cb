//! Directories of the daemon's user alone: the only kind a backend keeps
//! state in, or takes a predecessor's state from, in a base other users
//! may share (`/dev/shm`), where any name can be anyone's.

use std::fs::Metadata;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Whether `dir` is a directory (not followed if a symlink) that this
/// process's user owns and no one else may enter; if not, why.
pub fn ours_alone(dir: &Path) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir).map_err(|err| format!("lstat {dir:?}: {err}"))?;
    ours_alone_by(dir, &meta)
}

/// [`ours_alone`] for `dir`'s metadata `meta` (from `symlink_metadata`),
/// already read.
pub fn ours_alone_by(dir: &Path, meta: &Metadata) -> Result<(), String> {
    if !meta.is_dir() {
        return Err(format!("{dir:?} is not a directory"));
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() || meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{dir:?} is not ours alone (owner uid {}, mode {:o})",
            meta.uid(),
            meta.permissions().mode() & 0o7777
        ));
    }
    Ok(())
}
