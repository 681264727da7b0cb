//! A sandbox's layout as its request gives it, made without a system call
//! per mapping.
//!
//! [`Draft`] takes the mappings one by one, in request order, as the
//! decoder reads them. A mapping of a file (or of anything with no nested
//! mapping below it) stays a [`Leaf`]: its name in the sandbox, the
//! directory holding its underlying object (an [`Anchor`] pinned at its
//! first use, shared by every leaf of that directory) and its name there.
//! Its type is learnt later, where it is needed (the FUSE view's first
//! lookup, or the native materializer). Directories of the sandbox are
//! [`DirDraft`]s; one that is mapped itself (it has nested mappings below
//! it, or is the sandbox root) must be a directory, so [`Draft::finish`]
//! checks it with one `lstat` and pins it, as a create always did.
//!
//! Consecutive mappings mostly share a directory on both sides (Bazel lists
//! inputs in path order), so the last directory found on each side is kept
//! and a mapping usually costs two comparisons and one record.
//!
//! The answer is what applying the mappings in order one by one would give
//! (`super::plan`, the reference): the first mapping in request order that
//! cannot apply is reported. Problems found while drafting and those found
//! by `finish` each carry their mapping's position, and the earliest wins.
//! One deliberate difference: a leaf whose underlying object does not exist
//! is not an error; its name is absent from the sandbox.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{is_within, kinds, Entry, Mapped, PlanError, Problem};
use crate::sandbox::dirfd::Anchor;
use crate::sandbox::file_kind::FileKind;

/// A name kept in [`Draft::names`].
#[derive(Clone, Copy, Debug)]
pub struct NameRef {
    at: u32,
    len: u32,
}

/// A mapping with no mapping below it; typed at its first use.
#[derive(Clone, Copy, Debug)]
pub struct Leaf {
    /// Its name in its sandbox directory.
    pub name: NameRef,
    /// Its underlying object's name in `anchor`'s directory.
    pub underlying_name: NameRef,
    /// Index in [`Draft::anchors`].
    pub anchor: u32,
    /// Position of the mapping in the request.
    pub index: u32,
    pub writable: bool,
    /// Its type, where the caller already knows it (a content-addressed
    /// file, a symlink of its own): [`Draft::typed`] then needs no `lstat`.
    pub kind: Option<FileKind>,
}

/// A directory that is mapped itself, and so must be one.
#[derive(Debug)]
pub struct MappedDir {
    pub underlying: PathBuf,
    pub writable: bool,
    pub index: u32,
    /// The directory, pinned by [`Draft::finish`] (for a sandbox root
    /// mapped to a file: the directory holding it).
    pub anchor: Option<Arc<Anchor>>,
    /// A directory, except for a sandbox root mapped to a file.
    pub kind: FileKind,
}

/// A directory of the sandbox: mapped, or leading to mappings, or both.
#[derive(Debug, Default)]
pub struct DirDraft {
    /// Its name in its parent (none for the root).
    pub name: Option<NameRef>,
    pub parent: u32,
    pub mapped: Option<MappedDir>,
    pub leaves: Vec<Leaf>,
    /// How many of `leaves`, from the start, are sorted by name.
    sorted: usize,
    pub subdirs: Vec<(NameRef, u32)>,
}

/// The earliest problem found so far.
struct FirstProblem {
    index: u32,
    path: String,
    underlying: PathBuf,
    problem: Problem,
}

/// A sandbox's layout, built mapping by mapping without system calls.
pub struct Draft {
    sandbox: Option<Arc<str>>,
    /// Every name the layout keeps, back to back.
    names: Vec<u8>,
    /// The sandbox's directories; the root first, every directory after
    /// its parent.
    pub dirs: Vec<DirDraft>,
    /// Subdirectory by (parent index bytes, name).
    subdir_of: HashMap<Vec<u8>, u32>,
    /// The directories holding leaves' underlying objects.
    pub anchors: Vec<Arc<Anchor>>,
    anchor_of: HashMap<Vec<u8>, u32>,
    /// The parent path of the last mapping, and its directory.
    last_dir: Option<(String, u32)>,
    /// The last underlying parent directory, and its anchor.
    last_anchor: Option<(Vec<u8>, u32)>,
    key: Vec<u8>,
    problem: Option<FirstProblem>,
    /// Mappings applied.
    count: usize,
}

impl Draft {
    /// An empty layout for `sandbox` (named in messages about its files;
    /// `None` for the `--mapping`s of the mount).
    pub fn new(sandbox: Option<&str>) -> Draft {
        Draft {
            sandbox: sandbox.map(Arc::from),
            names: Vec::new(),
            dirs: vec![DirDraft::default()],
            subdir_of: HashMap::new(),
            anchors: Vec::new(),
            anchor_of: HashMap::new(),
            last_dir: None,
            last_anchor: None,
            key: Vec::new(),
            problem: None,
            count: 0,
        }
    }

    /// The layout of `mappings`, in order.
    pub fn of(mappings: &[actionfs_protocol::ResolvedMapping], sandbox: Option<&str>) -> Draft {
        let mut draft = Draft::new(sandbox);
        for (index, m) in mappings.iter().enumerate() {
            let underlying = m.underlying.as_os_str().as_bytes();
            draft.add(index, &m.path, underlying, m.writable);
        }
        draft
    }

    /// Applies mapping number `index`: sandbox path `path` (`/` or `/a/b`,
    /// validated and normalized by the protocol's resolution) to the
    /// absolute `underlying` path.
    pub fn add(&mut self, index: usize, path: &str, underlying: &[u8], writable: bool) {
        self.add_typed(index, path, underlying, writable, None);
    }

    /// [`Draft::add`] for a mapping of a non-directory whose type the
    /// caller knows (checked by it, or its own): typed without an `lstat`.
    pub fn add_known(
        &mut self,
        index: usize,
        path: &str,
        underlying: &[u8],
        writable: bool,
        kind: FileKind,
    ) {
        debug_assert!(
            kind != FileKind::Directory,
            "a directory is pinned by finish"
        );
        self.add_typed(index, path, underlying, writable, Some(kind));
    }

    fn add_typed(
        &mut self,
        index: usize,
        path: &str,
        underlying: &[u8],
        writable: bool,
        kind: Option<FileKind>,
    ) {
        let index = u32::try_from(index).expect("fewer than 2^32 mappings");
        if self.problem.as_ref().is_some_and(|p| p.index < index) {
            // Nothing after the first failing mapping counts.
            return;
        }
        if path == "/" {
            if index > 0 {
                self.found(index, path, underlying, Problem::RootNotFirst);
                return;
            }
            self.map_dir(0, index, path, underlying, writable);
            return;
        }
        let (parent, name) = path.rsplit_once('/').expect("an absolute path");
        let dir = self.dir_at(parent);
        if !self.dirs[dir as usize].subdirs.is_empty() {
            if let Some(sub) = self.subdir(dir, name.as_bytes()) {
                self.map_dir(sub, index, path, underlying, writable);
                return;
            }
        }
        // Consecutive inputs mostly lie in one underlying directory (the
        // store's): then only the last name needs looking at.
        let in_last_anchor = self.last_anchor.as_ref().and_then(|(last, _)| {
            let name = underlying
                .strip_prefix(last.as_slice())?
                .strip_prefix(b"/")?;
            is_plain_name(name).then_some(last.len())
        });
        let split = match in_last_anchor {
            Some(at) => Some((&underlying[..at], &underlying[at + 1..])),
            None => split_last(underlying),
        };
        let Some((under_parent, under_name)) = split else {
            // `/` or a path ending in `..`: a directory, pinned by finish.
            if self.find_leaf(dir, name.as_bytes()).is_some() {
                self.found(index, path, underlying, Problem::MappedTwice);
                return;
            }
            let sub = self.new_dir(dir, name.as_bytes());
            self.map_dir(sub, index, path, underlying, writable);
            return;
        };
        let anchor = self.anchor_for(under_parent);
        let name = self.intern(name.as_bytes());
        let underlying_name = if under_name == self.name(name) {
            name
        } else {
            self.intern(under_name)
        };
        let leaf = Leaf {
            name,
            underlying_name,
            anchor,
            index,
            writable,
            kind,
        };
        let dir = &mut self.dirs[dir as usize];
        let in_order = match dir.leaves.last() {
            None => true,
            Some(last) => {
                let (a, b) = (name_of(&self.names, last.name), name_of(&self.names, name));
                a <= b
            }
        };
        if in_order && dir.sorted == dir.leaves.len() {
            dir.sorted += 1;
        }
        dir.leaves.push(leaf);
        self.count += 1;
    }

    /// The bytes of `name`.
    pub fn name(&self, name: NameRef) -> &[u8] {
        name_of(&self.names, name)
    }

    fn intern(&mut self, bytes: &[u8]) -> NameRef {
        let at = u32::try_from(self.names.len()).expect("a request under 4 GiB");
        self.names.extend_from_slice(bytes);
        NameRef {
            at,
            len: bytes.len() as u32,
        }
    }

    /// Makes `dir` mapped, unless it is already.
    fn map_dir(&mut self, dir: u32, index: u32, path: &str, underlying: &[u8], writable: bool) {
        let draft = &mut self.dirs[dir as usize];
        if draft.mapped.is_some() {
            self.found(index, path, underlying, Problem::MappedTwice);
            return;
        }
        draft.mapped = Some(MappedDir {
            underlying: PathBuf::from(OsStr::from_bytes(underlying)),
            writable,
            index,
            anchor: None,
            kind: FileKind::Directory,
        });
        self.count += 1;
    }

    fn found(&mut self, index: u32, path: &str, underlying: &[u8], problem: Problem) {
        if self.problem.as_ref().is_none_or(|p| index < p.index) {
            self.problem = Some(FirstProblem {
                index,
                path: path.to_owned(),
                underlying: PathBuf::from(OsStr::from_bytes(underlying)),
                problem,
            });
        }
    }

    /// The directory at `path` (`""` for the root), made as needed.
    fn dir_at(&mut self, path: &str) -> u32 {
        if let Some((last, dir)) = &self.last_dir {
            if last == path {
                return *dir;
            }
        }
        let mut dir = 0;
        for component in path.split('/').filter(|c| !c.is_empty()) {
            dir = match self.subdir(dir, component.as_bytes()) {
                Some(sub) => sub,
                None => self.dir_through(dir, component.as_bytes()),
            };
        }
        match &mut self.last_dir {
            Some((last, at)) => {
                last.clear();
                last.push_str(path);
                *at = dir;
            }
            None => self.last_dir = Some((path.to_owned(), dir)),
        }
        dir
    }

    fn subdir(&mut self, dir: u32, name: &[u8]) -> Option<u32> {
        self.key.clear();
        self.key.extend_from_slice(&dir.to_le_bytes());
        self.key.extend_from_slice(name);
        self.subdir_of.get(self.key.as_slice()).copied()
    }

    /// Subdirectory `name` of `dir`, where there is none yet: the leaf of
    /// that name becomes it (a mapping with nested mappings below it,
    /// which finish checks is a directory), else a new one.
    fn dir_through(&mut self, dir: u32, name: &[u8]) -> u32 {
        let Some(at) = self.find_leaf(dir, name) else {
            return self.new_dir(dir, name);
        };
        let leaf = self.dirs[dir as usize].leaves.remove(at);
        self.dirs[dir as usize].sorted -= 1;
        let underlying = self.leaf_underlying(&leaf);
        let sub = self.new_dir(dir, name);
        self.dirs[sub as usize].mapped = Some(MappedDir {
            underlying,
            writable: leaf.writable,
            index: leaf.index,
            anchor: None,
            kind: FileKind::Directory,
        });
        sub
    }

    fn new_dir(&mut self, parent: u32, name: &[u8]) -> u32 {
        let sub = u32::try_from(self.dirs.len()).expect("fewer than 2^32 directories");
        let name_ref = self.intern(name);
        self.dirs.push(DirDraft {
            name: Some(name_ref),
            parent,
            ..DirDraft::default()
        });
        self.dirs[parent as usize].subdirs.push((name_ref, sub));
        self.key.clear();
        self.key.extend_from_slice(&parent.to_le_bytes());
        self.key.extend_from_slice(name);
        self.subdir_of.insert(self.key.clone(), sub);
        sub
    }

    /// Position of the first leaf (in request order) named `name` in
    /// `dir`, after sorting its leaves by name (stably, so that leaves of
    /// one name keep their order).
    fn find_leaf(&mut self, dir: u32, name: &[u8]) -> Option<usize> {
        let names = &self.names;
        let draft = &mut self.dirs[dir as usize];
        if draft.sorted < draft.leaves.len() {
            draft
                .leaves
                .sort_by(|a, b| name_of(names, a.name).cmp(name_of(names, b.name)));
            draft.sorted = draft.leaves.len();
        }
        let at = draft
            .leaves
            .partition_point(|leaf| name_of(names, leaf.name) < name);
        draft
            .leaves
            .get(at)
            .is_some_and(|leaf| name_of(names, leaf.name) == name)
            .then_some(at)
    }

    /// The anchor of underlying directory `path`, made (not pinned) at
    /// its first mention.
    fn anchor_for(&mut self, path: &[u8]) -> u32 {
        if let Some((last, anchor)) = &self.last_anchor {
            if last.as_slice() == path {
                return *anchor;
            }
        }
        let anchor = match self.anchor_of.get(path) {
            Some(&anchor) => anchor,
            None => {
                let anchor = u32::try_from(self.anchors.len()).expect("fewer than 2^32 anchors");
                let dir = PathBuf::from(OsStr::from_bytes(path));
                self.anchors
                    .push(Arc::new(Anchor::deferred(dir, self.sandbox.clone())));
                self.anchor_of.insert(path.to_vec(), anchor);
                anchor
            }
        };
        match &mut self.last_anchor {
            Some((last, at)) => {
                last.clear();
                last.extend_from_slice(path);
                *at = anchor;
            }
            None => self.last_anchor = Some((path.to_vec(), anchor)),
        }
        anchor
    }

    /// Number of mappings applied so far.
    pub fn mapping_count(&self) -> usize {
        self.count
    }

    /// The sandbox path of directory `dir` (`/` for the root).
    pub fn dir_path(&self, dir: u32) -> String {
        let mut names = Vec::new();
        let mut at = dir;
        while let Some(name) = self.dirs[at as usize].name {
            names.push(name);
            at = self.dirs[at as usize].parent;
        }
        if names.is_empty() {
            return "/".to_owned();
        }
        let mut path = String::new();
        for name in names.iter().rev() {
            path.push('/');
            path.push_str(&String::from_utf8_lossy(self.name(*name)));
        }
        path
    }

    fn leaf_path(&self, dir: u32, leaf: &Leaf) -> String {
        let mut path = self.dir_path(dir);
        if path != "/" {
            path.push('/');
        }
        path.push_str(&String::from_utf8_lossy(self.name(leaf.name)));
        path
    }

    /// The underlying path of `leaf`.
    pub fn leaf_underlying(&self, leaf: &Leaf) -> PathBuf {
        // One allocation of the right size.
        let parts = self.leaf_underlying_parts(leaf);
        PathBuf::from(OsString::from_vec(parts.concat()))
    }

    /// The bytes of [`Draft::leaf_underlying`] in three parts, its
    /// anchor, a `/` (or nothing, for the anchor `/`) and its name: what
    /// `PathBuf::push` gives for a name with no `/`, without building it.
    pub fn leaf_underlying_parts(&self, leaf: &Leaf) -> [&[u8]; 3] {
        let dir = self.anchors[leaf.anchor as usize]
            .path()
            .as_os_str()
            .as_bytes();
        let slash: &[u8] = if dir.ends_with(b"/") { b"" } else { b"/" };
        [dir, slash, self.name(leaf.underlying_name)]
    }

    /// Every mapping applied, in request order: (sandbox path, underlying
    /// path, writable). For tests and messages.
    pub fn describe(&self) -> Vec<(String, PathBuf, bool)> {
        let mut all = Vec::with_capacity(self.count);
        for (at, dir) in self.dirs.iter().enumerate() {
            let at = at as u32;
            if let Some(mapped) = &dir.mapped {
                all.push((
                    mapped.index,
                    self.dir_path(at),
                    mapped.underlying.clone(),
                    mapped.writable,
                ));
            }
            for leaf in &dir.leaves {
                all.push((
                    leaf.index,
                    self.leaf_path(at, leaf),
                    self.leaf_underlying(leaf),
                    leaf.writable,
                ));
            }
        }
        all.sort_by_key(|m| m.0);
        all.into_iter().map(|(_, p, u, w)| (p, u, w)).collect()
    }

    /// Checks what drafting could not: no underlying path inside the
    /// mount point `forbidden`, no path mapped twice, every mapped
    /// directory a directory (one `lstat` each, which also pins it). Gives
    /// the first failing mapping in request order, as applying them one by
    /// one would. Leaves stay untyped.
    pub fn finish(mut self, forbidden: &Path) -> Result<Draft, PlanError> {
        self.check_inside_mount(forbidden);
        self.check_twice();
        let below = self.first_below();
        self.check_mapped_dirs(forbidden, &below);
        match self.problem.take() {
            None => Ok(self),
            Some(found) => Err(PlanError {
                index: found.index as usize,
                path: found.path,
                underlying: found.underlying,
                problem: found.problem,
            }),
        }
    }

    fn earliest(&self) -> u32 {
        self.problem.as_ref().map_or(u32::MAX, |p| p.index)
    }

    fn check_inside_mount(&mut self, forbidden: &Path) {
        let inside: Vec<bool> = self
            .anchors
            .iter()
            .map(|a| is_within(a.path(), forbidden))
            .collect();
        // A leaf can also be the mount point itself.
        let exact = forbidden.parent().zip(forbidden.file_name());
        let mut found = Vec::new();
        for (at, dir) in self.dirs.iter().enumerate() {
            if let Some(mapped) = &dir.mapped {
                if is_within(&mapped.underlying, forbidden) {
                    found.push((
                        mapped.index,
                        self.dir_path(at as u32),
                        mapped.underlying.clone(),
                    ));
                }
            }
            for leaf in &dir.leaves {
                let anchor = leaf.anchor as usize;
                let hit = inside[anchor]
                    || exact.is_some_and(|(parent, name)| {
                        self.name(leaf.underlying_name) == name.as_bytes()
                            && self.anchors[anchor].path() == parent
                    });
                if hit {
                    found.push((
                        leaf.index,
                        self.leaf_path(at as u32, leaf),
                        self.leaf_underlying(leaf),
                    ));
                }
            }
        }
        for (index, path, underlying) in found {
            let underlying = underlying.as_os_str().as_bytes().to_vec();
            let problem = Problem::InsideMount(forbidden.to_owned());
            self.found(index, &path, &underlying, problem);
        }
    }

    /// A name given twice in one directory: leaves of the same name, or a
    /// leaf named as a mapped subdirectory (an earlier mapping of it
    /// became that directory).
    fn check_twice(&mut self) {
        let mut found = Vec::new();
        for at in 0..self.dirs.len() {
            let names = &self.names;
            let dir = &mut self.dirs[at];
            if dir.sorted < dir.leaves.len() {
                dir.leaves
                    .sort_by(|a, b| name_of(names, a.name).cmp(name_of(names, b.name)));
                dir.sorted = dir.leaves.len();
            }
            let dir = &self.dirs[at];
            for pair in dir.leaves.windows(2) {
                if name_of(names, pair[0].name) == name_of(names, pair[1].name) {
                    found.push((at as u32, pair[1]));
                }
            }
            if !dir.subdirs.is_empty() {
                let mut subdirs: Vec<&[u8]> = dir
                    .subdirs
                    .iter()
                    .map(|(sub, _)| name_of(names, *sub))
                    .collect();
                subdirs.sort_unstable();
                for leaf in &dir.leaves {
                    if subdirs.binary_search(&name_of(names, leaf.name)).is_ok() {
                        found.push((at as u32, *leaf));
                    }
                }
            }
        }
        for (dir, leaf) in found {
            let path = self.leaf_path(dir, &leaf);
            let underlying = self.leaf_underlying(&leaf);
            let underlying = underlying.as_os_str().as_bytes().to_vec();
            self.found(leaf.index, &path, &underlying, Problem::MappedTwice);
        }
    }

    /// For each directory, the first mapping (in request order) at any
    /// depth below it.
    fn first_below(&self) -> Vec<u32> {
        let mut below = vec![u32::MAX; self.dirs.len()];
        // Children come after their parents: walking backwards sees every
        // directory before its parent.
        for at in (0..self.dirs.len()).rev() {
            let dir = &self.dirs[at];
            let mut first = dir.leaves.iter().map(|l| l.index).min().unwrap_or(u32::MAX);
            for &(_, sub) in &dir.subdirs {
                let sub_dir = &self.dirs[sub as usize];
                first = first.min(below[sub as usize]);
                if let Some(mapped) = &sub_dir.mapped {
                    first = first.min(mapped.index);
                }
            }
            below[at] = first;
        }
        below
    }

    /// `lstat`s and pins each mapped directory that comes before the
    /// first problem found so far.
    fn check_mapped_dirs(&mut self, forbidden: &Path, below: &[u32]) {
        let earliest = self.earliest();
        let wanted: Vec<usize> = (0..self.dirs.len())
            .filter(|&at| {
                self.dirs[at]
                    .mapped
                    .as_ref()
                    .is_some_and(|m| m.index < earliest && !is_within(&m.underlying, forbidden))
            })
            .collect();
        let paths: Vec<&Path> = wanted
            .iter()
            .map(|&at| {
                self.dirs[at]
                    .mapped
                    .as_ref()
                    .expect("mapped")
                    .underlying
                    .as_path()
            })
            .collect();
        let kinds = kinds::lstat_kinds(&paths, self.sandbox.as_ref());
        let mut found = Vec::new();
        for (&at, kind) in wanted.iter().zip(kinds) {
            let mapped = self.dirs[at].mapped.as_mut().expect("mapped");
            let (kind, anchor) = match kind {
                Ok(found) => found,
                Err(err) => {
                    found.push((at, mapped.index, Problem::Unusable(err)));
                    continue;
                }
            };
            if kind == FileKind::Directory {
                mapped.anchor = Some(anchor);
                continue;
            }
            let first_below = below[at];
            if at == 0 && first_below == u32::MAX && self.sandbox.is_some() {
                // A sandbox's root may be a file, served as that file, if
                // nothing is mapped below it.
                mapped.anchor = Some(anchor);
                mapped.kind = kind;
                continue;
            }
            let (index, problem) =
                if at == 0 && first_below > mapped.index && self.sandbox.is_none() {
                    (mapped.index, Problem::RootNotADirectory)
                } else if first_below < mapped.index {
                    (mapped.index, Problem::NotADirectoryForNested)
                } else {
                    let walked = self.dir_path(at as u32);
                    (first_below, Problem::BelowNonDirectory(walked))
                };
            found.push((at, index, problem));
        }
        for (at, index, problem) in found {
            // A mapping below a non-directory is named by its own path.
            let (path, underlying) = if matches!(problem, Problem::BelowNonDirectory(_)) {
                self.mapping_at(index)
            } else {
                let mapped = self.dirs[at].mapped.as_ref().expect("mapped");
                (self.dir_path(at as u32), mapped.underlying.clone())
            };
            let underlying = underlying.as_os_str().as_bytes().to_vec();
            self.found(index, &path, &underlying, problem);
        }
    }

    /// The sandbox and underlying paths of mapping `index`.
    fn mapping_at(&self, index: u32) -> (String, PathBuf) {
        for (at, dir) in self.dirs.iter().enumerate() {
            if let Some(mapped) = dir.mapped.as_ref().filter(|m| m.index == index) {
                return (self.dir_path(at as u32), mapped.underlying.clone());
            }
            if let Some(leaf) = dir.leaves.iter().find(|l| l.index == index) {
                return (self.leaf_path(at as u32, leaf), self.leaf_underlying(leaf));
            }
        }
        unreachable!("mapping #{index} was applied")
    }

    /// Where a native build of this layout makes most of its files: the
    /// shallowest writable mapped directory with mappings below it
    /// (Bazel's scratch directory), if any. The names lead to it from the
    /// root.
    pub fn inputs_dir(&self) -> Option<u32> {
        let mut level = vec![0u32];
        while !level.is_empty() {
            for &at in &level {
                let dir = &self.dirs[at as usize];
                let nested = at == 0 || !dir.leaves.is_empty() || !dir.subdirs.is_empty();
                if nested && dir.mapped.as_ref().is_some_and(|m| m.writable) {
                    return Some(at);
                }
            }
            level = level
                .iter()
                .flat_map(|&at| self.dirs[at as usize].subdirs.iter().map(|&(_, sub)| sub))
                .collect();
        }
        None
    }

    /// The underlying directory [`Draft::inputs_dir`] names.
    pub fn made_in(&self) -> Option<&Path> {
        let at = self.inputs_dir()?;
        Some(&self.dirs[at as usize].mapped.as_ref()?.underlying)
    }

    /// Whether the sandbox's root is mapped to a file: only the typed
    /// layout ([`Draft::typed`]) builds that.
    pub fn root_is_file(&self) -> bool {
        self.dirs[0]
            .mapped
            .as_ref()
            .is_some_and(|m| m.kind != FileKind::Directory)
    }

    /// The same layout with every leaf typed and pinned (one `lstat`
    /// each, but none for a leaf of known type, whose anchor is its
    /// draft's), for the native materializer. Fails on the first leaf that
    /// cannot be typed (a missing input among them).
    pub fn typed(&self) -> Result<Entry, PlanError> {
        self.typed_except(None)
    }

    /// [`Draft::typed`], with directory `left_empty` (if any) kept mapped
    /// but with nothing below it: for a build whose inputs there come
    /// from elsewhere (a stash), so that they are not typed for nothing.
    pub fn typed_except(&self, left_empty: Option<u32>) -> Result<Entry, PlanError> {
        // Directories come after their parents: one pass marks every
        // directory below `left_empty`.
        let mut omitted = vec![false; self.dirs.len()];
        if let Some(empty) = left_empty {
            for at in 1..self.dirs.len() {
                let parent = self.dirs[at].parent;
                omitted[at] = parent == empty || omitted[parent as usize];
            }
        }
        let mut leaves = Vec::with_capacity(self.count);
        for (at, dir) in self.dirs.iter().enumerate() {
            if omitted[at] || left_empty == Some(at as u32) {
                continue;
            }
            leaves.extend(dir.leaves.iter().map(|leaf| (at as u32, *leaf)));
        }
        let paths: Vec<PathBuf> = leaves
            .iter()
            .map(|(_, leaf)| self.leaf_underlying(leaf))
            .collect();
        let unknown: Vec<&Path> = leaves
            .iter()
            .zip(&paths)
            .filter(|((_, leaf), _)| leaf.kind.is_none())
            .map(|(_, path)| path.as_path())
            .collect();
        let mut looked = kinds::lstat_kinds(&unknown, self.sandbox.as_ref()).into_iter();
        let kinds = leaves.iter().map(|(_, leaf)| match leaf.kind {
            Some(kind) => Ok((kind, self.anchors[leaf.anchor as usize].clone())),
            None => looked.next().expect("a type per leaf of unknown type"),
        });
        let mut entries: Vec<Entry> = (0..self.dirs.len()).map(|_| Entry::default()).collect();
        for (((dir, leaf), path), kind) in leaves.iter().zip(paths).zip(kinds) {
            let (kind, anchor) = kind.map_err(|err| PlanError {
                index: leaf.index as usize,
                path: self.leaf_path(*dir, leaf),
                underlying: path.clone(),
                problem: Problem::Unusable(err),
            })?;
            let name = OsStr::from_bytes(self.name(leaf.name)).to_owned();
            let entry = Entry {
                mapped: Some(Mapped {
                    underlying: path,
                    writable: leaf.writable,
                    kind,
                    anchor,
                }),
                children: HashMap::new(),
            };
            entries[*dir as usize].children.insert(name, entry);
        }
        for (at, dir) in self.dirs.iter().enumerate() {
            if let Some(mapped) = &dir.mapped {
                entries[at].mapped = Some(Mapped {
                    underlying: mapped.underlying.clone(),
                    writable: mapped.writable,
                    kind: mapped.kind,
                    anchor: mapped
                        .anchor
                        .clone()
                        .expect("finish pins mapped directories"),
                });
            }
        }
        // Children after parents: fold each directory into its parent,
        // last first.
        for at in (1..self.dirs.len()).rev() {
            if omitted[at] {
                continue;
            }
            let entry = std::mem::take(&mut entries[at]);
            let dir = &self.dirs[at];
            let name = OsStr::from_bytes(self.name(dir.name.expect("not the root"))).to_owned();
            entries[dir.parent as usize].children.insert(name, entry);
        }
        Ok(entries.swap_remove(0))
    }
}

/// The directory and last name of an underlying path, as `Path::parent`
/// and `Path::file_name` give them; `None` where it has no last name (`/`,
/// or ending in `..`). A plain absolute path (no empty, `.` or `..`
/// component) is split at its last `/` without parsing components.
fn split_last(path: &[u8]) -> Option<(&[u8], &[u8])> {
    let plain = path.len() > 1
        && path[0] == b'/'
        && !path[1..]
            .split(|&b| b == b'/')
            .any(|c| c.is_empty() || c == b"." || c == b"..");
    if plain {
        let at = memrchr_slash(path)?;
        let parent = if at == 0 { &path[..1] } else { &path[..at] };
        return Some((parent, &path[at + 1..]));
    }
    let path = Path::new(OsStr::from_bytes(path));
    let parent = path.parent()?.as_os_str().as_bytes();
    Some((parent, path.file_name()?.as_bytes()))
}

/// A name [`split_last`] would give as is: not empty, no `/`, not `.` or
/// `..`.
fn is_plain_name(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/')
}

fn memrchr_slash(path: &[u8]) -> Option<usize> {
    path.iter().rposition(|&b| b == b'/')
}

/// The decoder hands each mapping straight to the draft.
impl actionfs_protocol::MappingSink for Draft {
    fn mapping(&mut self, index: usize, path: &str, underlying: &str, writable: bool) {
        self.add(index, path, underlying.as_bytes(), writable);
    }
}

fn name_of(names: &[u8], name: NameRef) -> &[u8] {
    &names[name.at as usize..(name.at + name.len) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;
    use actionfs_protocol::ResolvedMapping;

    /// What an outcome says, for comparing the draft with the reference.
    fn outcome(result: Result<Entry, PlanError>) -> Result<Vec<String>, String> {
        result
            .map(|entry| shape(&entry, ""))
            .map_err(|e| e.to_string())
    }

    /// Every path of a typed layout with what it maps, sorted.
    fn shape(entry: &Entry, path: &str) -> Vec<String> {
        let mut lines = vec![format!(
            "{path}/ {:?}",
            entry
                .mapped
                .as_ref()
                .map(|m| (&m.underlying, m.writable, m.kind, m.anchor.path()))
        )];
        for (name, child) in &entry.children {
            lines.extend(shape(child, &format!("{path}/{}", name.to_string_lossy())));
        }
        lines.sort();
        lines
    }

    #[test]
    fn a_leaf_in_the_last_underlying_directory_splits_as_any_other() {
        let paths = [
            "/s/c/h1",
            "/s/c/h2",
            "/s/c/./h3",
            "/s/c//h4",
            "/s/c/..",
            "/s/c/.",
            "/s/c/h5/",
            "/s/c/h6",
            "/s//c/h7",
            "/s//c/h8",
            "/s/c/d/h9",
            "/s/c/h10",
        ];
        let mut draft = Draft::new(None);
        for (index, underlying) in paths.iter().enumerate() {
            draft.add(index, &format!("/m{index}"), underlying.as_bytes(), false);
        }
        for leaf in &draft.dirs[0].leaves {
            let underlying = paths[leaf.index as usize].as_bytes();
            let (parent, name) = split_last(underlying).expect("a leaf has a last name");
            let anchor = draft.anchors[leaf.anchor as usize].path();
            assert_eq!(anchor.as_os_str().as_bytes(), parent, "{underlying:?}");
            assert_eq!(draft.name(leaf.underlying_name), name, "{underlying:?}");
        }
    }

    #[test]
    fn a_leafs_underlying_path_is_its_directory_pushed_its_name() {
        let mut draft = Draft::new(None);
        for (index, underlying) in ["/f", "/a/f", "/a/b/long-name.h"].iter().enumerate() {
            draft.add_known(
                index,
                &format!("/m{index}"),
                underlying.as_bytes(),
                false,
                FileKind::RegularFile,
            );
        }
        let leaves = &draft.dirs[0].leaves;
        let paths: Vec<PathBuf> = leaves.iter().map(|l| draft.leaf_underlying(l)).collect();
        assert_eq!(paths, ["/f", "/a/f", "/a/b/long-name.h"].map(PathBuf::from));
        for (leaf, path) in leaves.iter().zip(&paths) {
            let mut pushed = draft.anchors[leaf.anchor as usize].path().to_owned();
            pushed.push(OsStr::from_bytes(draft.name(leaf.underlying_name)));
            assert_eq!(&pushed, path);
        }
    }

    #[test]
    fn a_leaf_of_known_type_is_typed_without_looking() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("there"), "x").unwrap();
        let under = |name: &str| dir.path().join(name).as_os_str().as_bytes().to_vec();
        let mut draft = Draft::new(Some("s"));
        draft.add(0, "/", &under(""), true);
        // Not there: only a draft that takes the caller's word types it.
        draft.add_known(1, "/known", &under("absent"), false, FileKind::RegularFile);
        draft.add(2, "/looked", &under("there"), false);
        draft.add_known(3, "/link", &under("absent-link"), false, FileKind::Symlink);
        let root = draft.finish(Path::new("/nonexistent-mount")).unwrap();
        let typed = root.typed().unwrap();
        let kind = |name: &str| {
            typed.children[OsStr::new(name)]
                .mapped
                .as_ref()
                .unwrap()
                .kind
        };
        assert_eq!(kind("known"), FileKind::RegularFile);
        assert_eq!(kind("looked"), FileKind::RegularFile);
        assert_eq!(kind("link"), FileKind::Symlink);
        // A leaf of unknown type is still looked at: missing, it fails.
        let mut missing = Draft::new(Some("s"));
        missing.add(0, "/", &under(""), true);
        missing.add(1, "/gone", &under("absent"), false);
        let root = missing.finish(Path::new("/nonexistent-mount")).unwrap();
        assert!(root.typed().is_err());
    }

    #[test]
    fn the_draft_answers_as_applying_mappings_one_by_one() {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| dir.path().join(name);
        std::fs::write(at("f"), "f").unwrap();
        std::fs::create_dir(at("d")).unwrap();
        std::fs::write(at("d/x"), "x").unwrap();
        std::fs::create_dir(at("w")).unwrap();
        std::os::unix::fs::symlink("f", at("l")).unwrap();
        let mount = at("mnt");
        let cases: &[&[(&str, &str, bool)]] = &[
            &[("/a", "f", false), ("/a", "f", false)],
            &[("/a", "f", false), ("/a/b", "f", false)],
            &[("/a/b", "f", false), ("/a", "f", false)],
            &[("/a/b", "f", false), ("/a", "d", false)],
            &[("/", "f", false)],
            &[("/x", "f", false), ("/", "f", false)],
            &[("/x", "f", false), ("/", "d", true)],
            &[("/", "d", true), ("/x", "f", false)],
            &[("/x", "mnt/y", false)],
            &[("/x", "mnt", false)],
            &[("/a", "d", false), ("/a/b", "f", false), ("/a", "d", false)],
            &[("/a", "f", false), ("/a", "f", false), ("/a/b", "f", false)],
            &[("/a", "l", false), ("/a/b", "f", false)],
            &[
                ("/p/q", "f", false),
                ("/p/q/r", "f", false),
                ("/p/q", "d", false),
            ],
            &[("/a", "nope", false), ("/a/b", "f", false)],
            &[
                ("/a/b", "f", false),
                ("/c", "mnt", false),
                ("/a/b", "f", false),
            ],
            &[
                ("/w", "w", true),
                ("/w/x/y", "f", false),
                ("/w/x", "d", false),
            ],
            &[("/a", "f", false), ("/b/c", "f", false), ("/b", "f", false)],
            &[("/a/b/c", "f", false), ("/a", "f", false)],
            &[("/a", "f", false), ("/a/b/c", "f", false)],
            &[
                ("/a/z", "f", false),
                ("/a/y", "l", false),
                ("/a/x", "d/x", false),
            ],
            &[
                ("/ws", "w", true),
                ("/ws/f", "f", false),
                ("/ws/g", "f", false),
                ("/ws/f", "d", false),
            ],
            &[("/r", "/", false), ("/r", "f", false)],
        ];
        for case in cases {
            let mappings: Vec<ResolvedMapping> = case
                .iter()
                .map(|(path, under, writable)| ResolvedMapping {
                    path: path.to_string(),
                    underlying: if under.starts_with('/') {
                        PathBuf::from(under)
                    } else {
                        at(under)
                    },
                    writable: *writable,
                })
                .collect();
            let reference = outcome(super::super::plan(&mappings, &mount, None));
            let draft = Draft::of(&mappings, None);
            let described: Vec<_> = draft.describe();
            let drafted = outcome(draft.finish(&mount).and_then(|d| d.typed()));
            assert_eq!(drafted, reference, "{case:?}");
            if reference.is_ok() {
                let given: Vec<_> = mappings
                    .iter()
                    .map(|m| (m.path.clone(), m.underlying.clone(), m.writable))
                    .collect();
                assert_eq!(described, given, "{case:?}");
            }
        }
    }

    #[test]
    fn underlying_paths_split_as_path_splits_them() {
        for path in [
            "/a/b", "/a", "/", "/a/b/", "/a//b", "/a/./b", "/a/b/.", "/a/..", "//a", "/a.b/c.d",
            "/.a/b", "/a/.b", "/a/b/..", "/a/...", "/..", "/.", "/.x/.y", "/a/../b", "a/b", "",
        ] {
            let std = Path::new(path);
            let expected = std
                .parent()
                .zip(std.file_name())
                .map(|(p, n)| (p.as_os_str().as_bytes(), n.as_bytes()));
            assert_eq!(split_last(path.as_bytes()), expected, "{path}");
        }
    }

    #[test]
    fn drafting_makes_no_system_call_and_a_missing_input_is_no_error() {
        // Nothing here exists: a leaf's object is looked for at its first
        // use, and a leaf's directory pinned then.
        let mappings: Vec<ResolvedMapping> = (0..100)
            .map(|n| ResolvedMapping {
                path: format!("/ws/d{}/f{n}", n % 7),
                underlying: PathBuf::from(format!("/nonexistent/d{}/f{n}", n % 7)),
                writable: false,
            })
            .collect();
        let draft = Draft::of(&mappings, Some("s"))
            .finish(Path::new("/mnt"))
            .unwrap();
        assert_eq!(draft.mapping_count(), 100);
        assert_eq!(draft.anchors.len(), 7);
        assert!(draft.anchors.iter().all(|a| !a.is_pinned()));
        let err = draft.typed().unwrap_err().to_string();
        assert!(
            err.contains("mapping #0") && err.contains("No such file"),
            "{err}"
        );
    }
}
