//! Decoding one `Directory` blob and checking every name and digest in it,
//! so that nothing walked from it can name a path outside its directory.

use actionfs_protocol::backend::digest::is_sha256_hex;
use actionfs_protocol::backend::reapi;
use prost::Message;

use super::{Checked, DirEntry, FileEntry, SymlinkEntry, WalkError};
use crate::sandbox::store::Digest;

/// SHA-256 of no bytes: the only hash a digest of size 0 may have.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Decodes directory `hash` and checks every name and digest in it.
pub(super) fn check(hash: &str, blob: &[u8]) -> Result<Checked, WalkError> {
    let invalid = |what: String| WalkError::Invalid(format!("directory {hash}: {what}"));
    let dir = reapi::Directory::decode(blob)
        .map_err(|err| invalid(format!("not a REAPI Directory message: {err}")))?;
    let mut names: Vec<&str> = Vec::with_capacity(dir.files.len() + dir.directories.len());
    let digest_of = |name: &str, digest: &Option<reapi::Digest>| match digest {
        Some(digest) if digest.size_bytes < 0 => Err(invalid(format!(
            "entry {name:?}: negative size {}",
            digest.size_bytes
        ))),
        Some(digest) if digest.size_bytes == 0 && digest.hash != EMPTY_SHA256 => {
            Err(invalid(format!(
                "entry {name:?}: size 0, but the hash {:?} is not that of no bytes",
                digest.hash
            )))
        }
        Some(digest) if is_sha256_hex(&digest.hash) => {
            Ok((Box::<str>::from(digest.hash.as_str()), digest.size_bytes))
        }
        Some(digest) => Err(invalid(format!(
            "entry {name:?}: digest hash {:?} is not SHA-256 (64 lowercase hex digits)",
            digest.hash
        ))),
        None => Err(invalid(format!("entry {name:?}: no digest"))),
    };
    let mut files = Vec::with_capacity(dir.files.len());
    for file in &dir.files {
        check_name(&file.name).map_err(&invalid)?;
        names.push(&file.name);
        let (hash, size) = digest_of(&file.name, &file.digest)?;
        files.push(FileEntry {
            name: file.name.as_str().into(),
            digest: Digest::parse(&hash).expect("checked as SHA-256 hex"),
            hash,
            size,
            executable: file.is_executable,
        });
    }
    let mut dirs = Vec::with_capacity(dir.directories.len());
    for sub in &dir.directories {
        check_name(&sub.name).map_err(&invalid)?;
        names.push(&sub.name);
        let (hash, size) = digest_of(&sub.name, &sub.digest)?;
        dirs.push(DirEntry {
            name: sub.name.as_str().into(),
            hash,
            size,
        });
    }
    let mut symlinks = Vec::with_capacity(dir.symlinks.len());
    for link in &dir.symlinks {
        check_name(&link.name).map_err(&invalid)?;
        names.push(&link.name);
        if link.target.is_empty() || link.target.contains('\0') {
            return Err(invalid(format!(
                "symlink {:?}: its target is empty or holds NUL",
                link.name
            )));
        }
        symlinks.push(SymlinkEntry {
            name: link.name.as_str().into(),
            target: link.target.as_str().into(),
        });
    }
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(invalid(format!("the name {:?} appears twice", pair[0])));
    }
    let sorted = files.is_sorted_by(|a: &FileEntry, b| a.name < b.name)
        && dirs.is_sorted_by(|a: &DirEntry, b| a.name < b.name)
        && symlinks.is_sorted_by(|a: &SymlinkEntry, b| a.name < b.name);
    Ok(Checked {
        files: files.into(),
        dirs: dirs.into(),
        symlinks: symlinks.into(),
        sorted,
    })
}

/// One path component: not empty, not `.` or `..`, no `/` or NUL.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(format!(
            "the entry name {name:?} is not a single path component (empty, '.', '..', or holds \
             '/' or NUL)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_one_component_are_refused() {
        for bad in ["", ".", "..", "a/b", "/", "a\0b"] {
            assert!(check_name(bad).is_err(), "{bad:?} was accepted");
        }
        for good in ["a", "...", ".hidden", "a b", "ü"] {
            assert!(check_name(good).is_ok(), "{good:?} was refused");
        }
    }
}
