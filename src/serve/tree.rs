//! Input trees from digests: each REAPI `Directory` blob is decoded and
//! checked once per digest, then walked into the list of what a sandbox
//! holds.
//!
//! A digest's bytes never change, so a directory checked once stays
//! checked: the next sandbox (or build) naming the same subtree reuses the
//! decoded entries and skips both the protobuf decode and the name checks.

use std::collections::HashMap;
use std::sync::Arc;

use actionfs_protocol::backend::digest::is_sha256_hex;
use actionfs_protocol::backend::reapi;
use parking_lot::Mutex;
use prost::Message;

use crate::sandbox::store::{ContentStore, Digest};

/// Decoded directories kept at most; past it the cache starts over (a
/// build's distinct directories are far fewer).
const CHECKED_CAP: usize = 1 << 18;

/// One directory's entries, names checked, in the blob's order.
#[derive(Debug)]
pub struct Checked {
    pub files: Box<[FileEntry]>,
    dirs: Box<[DirEntry]>,
    pub symlinks: Box<[SymlinkEntry]>,
}

impl Checked {
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.dirs.is_empty() && self.symlinks.is_empty()
    }

    /// Whether `name` is a file or symlink here.
    pub fn has_leaf(&self, name: &str) -> bool {
        self.files.iter().any(|f| &*f.name == name)
            || self.symlinks.iter().any(|l| &*l.name == name)
    }
}

#[derive(Debug)]
pub struct FileEntry {
    pub name: Box<str>,
    pub hash: Box<str>,
    /// The hash as bytes, parsed once per directory digest.
    pub digest: Digest,
    pub executable: bool,
}

#[derive(Debug)]
struct DirEntry {
    name: Box<str>,
    hash: Box<str>,
}

#[derive(Debug)]
pub struct SymlinkEntry {
    pub name: Box<str>,
    pub target: Box<str>,
}

/// A tree walked from its root digest: each directory's path (relative
/// to the sandbox root, starting with the workspace's name) and entries.
/// No path per input is made here: the layout builds them in one buffer.
#[derive(Debug, Default)]
pub struct Walked {
    pub workspace: String,
    pub dirs: Vec<(String, Arc<Checked>)>,
}

impl Walked {
    /// Every file, with the path of its directory, in a fixed order.
    pub fn files(&self) -> impl Iterator<Item = (&str, &FileEntry)> {
        self.dirs
            .iter()
            .flat_map(|(path, dir)| dir.files.iter().map(move |file| (path.as_str(), file)))
    }
}

/// Why a tree cannot be walked.
#[derive(Debug)]
pub enum WalkError {
    /// Directory blobs the store lacks (never pushed, or evicted).
    Missing(Vec<String>),
    /// A permanent fault of the tree, with the digest and name it is in.
    Invalid(String),
}

/// The decoded-directory cache, in front of the store's blobs.
pub struct Trees {
    store: Arc<ContentStore>,
    checked: Mutex<HashMap<Box<str>, Arc<Checked>>>,
}

impl Trees {
    pub fn new(store: Arc<ContentStore>) -> Trees {
        Trees {
            store,
            checked: Mutex::default(),
        }
    }

    /// Walks the tree of root directory `root`, which must hold exactly one
    /// directory, the workspace. Every missing blob reachable from what is
    /// present is reported at once, so one Push can bring them all.
    pub fn walk(&self, root: &str) -> Result<Walked, WalkError> {
        let top = match self.checked(root)? {
            Some(top) => top,
            None => return Err(WalkError::Missing(vec![root.to_owned()])),
        };
        let [workspace] = &top.dirs[..] else {
            return Err(WalkError::Invalid(format!(
                "root directory {root}: holds {} directories, {} files and {} symlinks; it must \
                 hold exactly one directory, named after the workspace",
                top.dirs.len(),
                top.files.len(),
                top.symlinks.len()
            )));
        };
        if !top.files.is_empty() || !top.symlinks.is_empty() {
            return Err(WalkError::Invalid(format!(
                "root directory {root}: holds files or symlinks beside the workspace directory"
            )));
        }
        let mut walked = Walked {
            workspace: workspace.name.to_string(),
            ..Walked::default()
        };
        let mut missing = Vec::new();
        let mut pending = vec![(workspace.name.to_string(), workspace.hash.clone())];
        while let Some((path, hash)) = pending.pop() {
            let Some(dir) = self.checked(&hash)? else {
                missing.push(hash.to_string());
                continue;
            };
            for sub in dir.dirs.iter() {
                pending.push((format!("{path}/{}", sub.name), sub.hash.clone()));
            }
            walked.dirs.push((path, dir));
        }
        if !missing.is_empty() {
            missing.sort();
            missing.dedup();
            return Err(WalkError::Missing(missing));
        }
        Ok(walked)
    }

    /// The checked entries of directory `hash`, decoding and checking its
    /// blob the first time; `None` if the store lacks the blob.
    fn checked(&self, hash: &str) -> Result<Option<Arc<Checked>>, WalkError> {
        if let Some(dir) = self.checked.lock().get(hash) {
            return Ok(Some(dir.clone()));
        }
        let Some(blob) = self.store.directory(hash) else {
            return Ok(None);
        };
        let dir = Arc::new(check(hash, &blob)?);
        let mut checked = self.checked.lock();
        if checked.len() >= CHECKED_CAP {
            checked.clear();
        }
        checked.insert(hash.into(), dir.clone());
        Ok(Some(dir))
    }
}

/// Decodes directory `hash` and checks every name and digest in it.
fn check(hash: &str, blob: &[u8]) -> Result<Checked, WalkError> {
    let invalid = |what: String| WalkError::Invalid(format!("directory {hash}: {what}"));
    let dir = reapi::Directory::decode(blob)
        .map_err(|err| invalid(format!("not a REAPI Directory message: {err}")))?;
    let mut names: Vec<&str> = Vec::with_capacity(dir.files.len() + dir.directories.len());
    let digest_hash = |name: &str, digest: &Option<reapi::Digest>| match digest {
        Some(digest) if is_sha256_hex(&digest.hash) => Ok(Box::<str>::from(digest.hash.as_str())),
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
        let hash = digest_hash(&file.name, &file.digest)?;
        files.push(FileEntry {
            name: file.name.as_str().into(),
            digest: Digest::parse(&hash).expect("checked as SHA-256 hex"),
            hash,
            executable: file.is_executable,
        });
    }
    let mut dirs = Vec::with_capacity(dir.directories.len());
    for sub in &dir.directories {
        check_name(&sub.name).map_err(&invalid)?;
        names.push(&sub.name);
        dirs.push(DirEntry {
            name: sub.name.as_str().into(),
            hash: digest_hash(&sub.name, &sub.digest)?,
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
    Ok(Checked {
        files: files.into(),
        dirs: dirs.into(),
        symlinks: symlinks.into(),
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
