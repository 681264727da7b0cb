//! Input trees from digests (REAPI Merkle trees): each `Directory` blob is
//! decoded and checked once per digest, then walked into the list of
//! directories an input root holds.
//!
//! A digest's bytes never change, so a directory checked once stays
//! checked: the next sandbox, staged input root or build naming the same
//! subtree reuses the decoded entries and skips both the protobuf decode
//! and the name checks. Where the blobs come from is a [`DirectorySource`]:
//! the content store `actionfs serve` fills from Push, or a remote
//! execution worker's CAS.

mod check;
mod error;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

pub use check::{check_name, EMPTY_SHA256};
pub use error::{BadName, BlobError, Fault, InvalidDirectory, MissingDir, WalkError};

use crate::sandbox::store::Digest;

/// Decoded directories kept at most; past it the cache starts over (a
/// build's distinct directories are far fewer).
const CHECKED_CAP: usize = 1 << 18;

/// Where serialized `Directory` messages are found by digest.
pub trait DirectorySource: Send + Sync {
    /// The blob of directory `hash` (`size` bytes long), `Ok(None)` if the
    /// source lacks it, `Err` if it cannot be read.
    fn directory_blob(&self, hash: &str, size: i64) -> Result<Option<Arc<[u8]>>, BlobError>;
}

impl<T: DirectorySource + ?Sized> DirectorySource for Arc<T> {
    fn directory_blob(&self, hash: &str, size: i64) -> Result<Option<Arc<[u8]>>, BlobError> {
        (**self).directory_blob(hash, size)
    }
}

/// Pushed blobs, checked against their digests when they were put.
impl DirectorySource for crate::sandbox::store::ContentStore {
    fn directory_blob(&self, hash: &str, _size: i64) -> Result<Option<Arc<[u8]>>, BlobError> {
        Ok(self.directory(hash))
    }
}

/// One directory's entries, names checked, in the blob's order.
#[derive(Debug)]
pub struct Checked {
    pub files: Box<[FileEntry]>,
    pub dirs: Box<[DirEntry]>,
    pub symlinks: Box<[SymlinkEntry]>,
    /// `None` when each list is sorted by name, as REAPI asks (and Bazel
    /// does); else every entry as (kind, position), sorted by name, so
    /// that [`Checked::find`] searches either way.
    pub(super) order: Option<Box<[(u8, u32)]>>,
}

/// One entry of a directory, by kind.
#[derive(Debug, Clone, Copy)]
pub enum Entry<'a> {
    File(&'a FileEntry),
    Dir(&'a DirEntry),
    Symlink(&'a SymlinkEntry),
}

impl<'a> Entry<'a> {
    pub fn name(self) -> &'a str {
        match self {
            Entry::File(f) => &f.name,
            Entry::Dir(d) => &d.name,
            Entry::Symlink(l) => &l.name,
        }
    }
}

impl Checked {
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.dirs.is_empty() && self.symlinks.is_empty()
    }

    pub fn len(&self) -> usize {
        self.files.len() + self.dirs.len() + self.symlinks.len()
    }

    /// Every entry: files, then directories, then symlinks.
    pub fn entries(&self) -> impl Iterator<Item = Entry<'_>> {
        let files = self.files.iter().map(Entry::File);
        let dirs = self.dirs.iter().map(Entry::Dir);
        files
            .chain(dirs)
            .chain(self.symlinks.iter().map(Entry::Symlink))
    }

    /// The entry named `name`, of whatever kind.
    pub fn find(&self, name: &str) -> Option<Entry<'_>> {
        fn search<'a, T>(list: &'a [T], name: &str, key: impl Fn(&T) -> &str) -> Option<&'a T> {
            let at = list.binary_search_by(|e| key(e).cmp(name)).ok()?;
            Some(&list[at])
        }
        match &self.order {
            None => search(&self.files, name, |f| &f.name)
                .map(Entry::File)
                .or_else(|| search(&self.dirs, name, |d| &d.name).map(Entry::Dir))
                .or_else(|| search(&self.symlinks, name, |l| &l.name).map(Entry::Symlink)),
            Some(order) => {
                let at = order
                    .binary_search_by(|&(kind, at)| self.entry(kind, at).name().cmp(name))
                    .ok()?;
                let (kind, at) = order[at];
                Some(self.entry(kind, at))
            }
        }
    }

    /// Entry `at` of the list of `kind` (0 files, 1 directories, 2
    /// symlinks).
    pub(super) fn entry(&self, kind: u8, at: u32) -> Entry<'_> {
        let at = at as usize;
        match kind {
            0 => Entry::File(&self.files[at]),
            1 => Entry::Dir(&self.dirs[at]),
            _ => Entry::Symlink(&self.symlinks[at]),
        }
    }

    /// Whether `name` is a file or symlink here.
    pub fn has_leaf(&self, name: &str) -> bool {
        matches!(self.find(name), Some(Entry::File(_) | Entry::Symlink(_)))
    }
}

#[derive(Debug)]
pub struct FileEntry {
    pub name: Box<str>,
    pub hash: Box<str>,
    pub size: i64,
    /// The hash as bytes, parsed once per directory digest.
    pub digest: Digest,
    pub executable: bool,
}

#[derive(Debug)]
pub struct DirEntry {
    pub name: Box<str>,
    pub hash: Box<str>,
    pub size: i64,
}

#[derive(Debug)]
pub struct SymlinkEntry {
    pub name: Box<str>,
    pub target: Box<str>,
}

/// A tree walked from a directory digest: each directory's path (below
/// the walk's prefix, joined with `/`) and entries, parents before their
/// children. No path per input is made here: users build them in one
/// buffer.
#[derive(Debug, Default, Clone)]
pub struct Walked {
    /// The path the walk started at (the first directory's path).
    pub top: String,
    pub dirs: Vec<(String, Arc<Checked>)>,
    index: std::sync::OnceLock<WalkIndex>,
}

/// Where each directory of a walk is, made once per walk at first use
/// (a tree seen again is found by its walk, index and all).
#[derive(Debug, Default, Clone)]
pub struct WalkIndex {
    /// Each directory's index in `Walked::dirs`, by its path there.
    pub by_path: HashMap<Box<str>, u32>,
    /// Each directory's first file's index in `Walked::files` order.
    pub first_file: Vec<u32>,
}

impl Walked {
    pub fn index(&self) -> &WalkIndex {
        self.index.get_or_init(|| {
            let mut index = WalkIndex {
                by_path: HashMap::with_capacity(self.dirs.len()),
                first_file: Vec::with_capacity(self.dirs.len()),
            };
            let mut files = 0u32;
            for (at, (path, dir)) in self.dirs.iter().enumerate() {
                index.by_path.insert(path.as_str().into(), at as u32);
                index.first_file.push(files);
                files += dir.files.len() as u32;
            }
            index
        })
    }

    /// Every file, with the path of its directory, in a fixed order.
    pub fn files(&self) -> impl Iterator<Item = (&str, &FileEntry)> {
        self.dirs
            .iter()
            .flat_map(|(path, dir)| dir.files.iter().map(move |file| (path.as_str(), file)))
    }

    pub fn file_count(&self) -> usize {
        self.dirs.iter().map(|(_, dir)| dir.files.len()).sum()
    }
}

/// The path of entry `name` of the directory at `dir` in a walk (`dir`
/// empty: the walk's top, whose paths have no leading `/`).
pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

/// The decoded-directory cache, in front of a source of blobs.
pub struct Trees<S> {
    source: S,
    checked: Mutex<HashMap<Box<str>, Arc<Checked>>>,
}

impl<S: DirectorySource> Trees<S> {
    pub fn new(source: S) -> Trees<S> {
        Trees {
            source,
            checked: Mutex::default(),
        }
    }

    pub fn source(&self) -> &S {
        &self.source
    }

    /// Walks the tree of directory `hash`, naming it `top` (which may be
    /// empty: then paths below it have no leading `/`). Every missing blob
    /// reachable from what is present is reported at once, so one fetch
    /// or Push can bring them all.
    pub fn walk(&self, top: &str, hash: &str, size: i64) -> Result<Walked, WalkError> {
        let mut walked = Walked {
            top: top.to_owned(),
            dirs: Vec::new(),
            index: Default::default(),
        };
        let mut missing = Vec::new();
        let mut pending: Vec<(String, Box<str>, i64)> = vec![(top.to_owned(), hash.into(), size)];
        while let Some((path, hash, size)) = pending.pop() {
            let Some(dir) = self.checked(&hash, size)? else {
                missing.push(MissingDir {
                    hash: hash.to_string(),
                    size,
                    path,
                });
                continue;
            };
            for sub in dir.dirs.iter() {
                pending.push((join(&path, &sub.name), sub.hash.clone(), sub.size));
            }
            walked.dirs.push((path, dir));
        }
        if !missing.is_empty() {
            missing.sort();
            missing.dedup_by(|a, b| a.hash == b.hash);
            return Err(WalkError::Missing(missing));
        }
        Ok(walked)
    }

    /// Decodes and checks `blob`, the directory of digest `hash` (which
    /// the caller computed from it), ahead of any walk through it; else
    /// why it is not a valid directory.
    pub fn check_ahead(&self, hash: &str, blob: &[u8]) -> Result<(), InvalidDirectory> {
        let dir = Arc::new(check::check(hash, blob)?);
        self.keep_checked(hash, dir);
        Ok(())
    }

    fn keep_checked(&self, hash: &str, dir: Arc<Checked>) {
        let mut checked = self.checked.lock();
        if checked.len() >= CHECKED_CAP {
            checked.clear();
        }
        checked.insert(hash.into(), dir);
    }

    /// The checked entries of directory `hash`, decoding and checking its
    /// blob the first time; `None` if the source lacks the blob.
    pub fn checked(&self, hash: &str, size: i64) -> Result<Option<Arc<Checked>>, WalkError> {
        if let Some(dir) = self.checked.lock().get(hash) {
            return Ok(Some(dir.clone()));
        }
        // The empty Directory serializes to no bytes: nobody pushes or
        // uploads it (Bazel never does), so no source is asked for it.
        let blob = if hash == EMPTY_SHA256 {
            Arc::default()
        } else {
            match self.source.directory_blob(hash, size) {
                Ok(Some(blob)) => blob,
                Ok(None) => return Ok(None),
                Err(err) => {
                    return Err(WalkError::Invalid(InvalidDirectory {
                        hash: hash.to_owned(),
                        fault: err.into(),
                    }))
                }
            }
        };
        let dir = Arc::new(check::check(hash, &blob)?);
        self.keep_checked(hash, dir.clone());
        Ok(Some(dir))
    }
}
