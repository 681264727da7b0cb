//! Directories of a walked input tree (`merkle::Walked`) as lazy
//! directories of the view: a create grafts one node per directory it
//! does not otherwise need, and each becomes its entries' nodes only when
//! the kernel first looks a name up in it or lists it.
//!
//! The nodes made are those a draft of the same tree would give: a file
//! is a read-only mapping of its content (a store file, or its default
//! place below `default_place`, or the file a symlink chain there leads
//! to; EIO if that file is not the digest's size), a symlink a read-only mapping of a
//! symlink holding its target, an empty directory a read-only mapping of
//! an empty directory, and a directory with entries another lazy
//! directory that merges with the underlying directory of its name, as a
//! directory made up for nested mappings does.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use actionfs_protocol::backend::digest::sha256_hex;
use parking_lot::Mutex;

use super::name::Name;
use super::node::{LazyEntries, Location, Node, Origin};
use crate::sandbox::default_place::{self, Place};
use crate::sandbox::dirfd::Anchor;
use crate::sandbox::merkle::{join, FileEntry, Walked};

/// What an empty directory of the tree is.
pub enum EmptyDirs {
    /// A read-only mapping of this empty directory.
    Mapped(PathBuf),
    /// A directory merged with the underlying one of its name, as a
    /// directory with entries is (for a caller that makes every directory
    /// of the tree underneath, writable).
    Merged,
}

/// Where each file of a walked tree is read from.
pub trait FileContent: Send + Sync {
    /// Files described: one per file of the walk.
    fn file_count(&self) -> usize;

    /// The path of file `index` (in `Walked::files` order, `file` its
    /// entry), or `None` for its default place.
    fn path(&self, index: usize, file: &FileEntry) -> Option<PathBuf>;
}

/// A path per file.
impl FileContent for Vec<Option<PathBuf>> {
    fn file_count(&self) -> usize {
        self.len()
    }

    fn path(&self, index: usize, _: &FileEntry) -> Option<PathBuf> {
        self[index].clone()
    }
}

/// What every lazy directory of one sandbox's tree reads from.
pub struct MerkleInputs {
    sandbox: Arc<str>,
    /// Its index says where each directory and its first file are.
    walked: Arc<Walked>,
    content: Arc<dyn FileContent>,
    default_place: PathBuf,
    /// The symlink made for each symlink target.
    links: HashMap<Box<str>, PathBuf>,
    empty_dirs: EmptyDirs,
    /// Anchors made so far, by directory: one per directory per sandbox,
    /// as a draft shares them.
    anchors: Mutex<HashMap<PathBuf, Arc<Anchor>>>,
}

impl MerkleInputs {
    /// The inputs of sandbox `sandbox`'s tree `walked`. `content` has an
    /// entry per file of `walked.files()`; a file without one is read from
    /// `default_place/<its path in walked>`. `links` has the symlink made
    /// for each symlink target of the tree.
    pub fn new(
        sandbox: &str,
        walked: Arc<Walked>,
        content: Arc<dyn FileContent>,
        default_place: PathBuf,
        links: HashMap<Box<str>, PathBuf>,
        empty_dirs: EmptyDirs,
    ) -> Arc<MerkleInputs> {
        assert_eq!(
            content.file_count(),
            walked.file_count(),
            "content for every file"
        );
        Arc::new(MerkleInputs {
            sandbox: sandbox.into(),
            walked,
            content,
            default_place,
            links,
            empty_dirs,
            anchors: Mutex::default(),
        })
    }

    pub fn walked(&self) -> &Walked {
        &self.walked
    }

    /// The lazy entries of the directory at `path` in the walk, if it is
    /// one.
    pub fn dir(self: &Arc<Self>, path: &str) -> Option<Box<dyn LazyEntries>> {
        let at = *self.walked.index().by_path.get(path)?;
        Some(Box::new(LazyDir {
            inputs: self.clone(),
            at,
        }))
    }

    /// A read-only mapping of `path`.
    fn mapping(&self, path: &Path) -> Node {
        let parent = path.parent().unwrap_or(Path::new("/"));
        let name = path.file_name().unwrap_or_default();
        mapping_in(self.anchor(parent), name)
    }

    /// The anchor of directory `dir` for this sandbox.
    fn anchor(&self, dir: &Path) -> Arc<Anchor> {
        let mut anchors = self.anchors.lock();
        if let Some(anchor) = anchors.get(dir) {
            return anchor.clone();
        }
        let anchor = Arc::new(Anchor::deferred(dir.to_owned(), Some(self.sandbox.clone())));
        anchors.insert(dir.to_owned(), anchor.clone());
        anchor
    }
}

/// A read-only mapping of `name` in the directory of `anchor`.
fn mapping_in(anchor: Arc<Anchor>, name: &OsStr) -> Node {
    Node::new_untyped(
        false,
        Origin::Mapped(Location {
            anchor,
            name: Name::new(name),
        }),
    )
}

/// One directory of the tree, not made yet.
struct LazyDir {
    inputs: Arc<MerkleInputs>,
    at: u32,
}

impl LazyEntries for LazyDir {
    fn len(&self) -> usize {
        self.inputs.walked.dirs[self.at as usize].1.len()
    }

    fn make(self: Box<Self>, this: &Weak<Node>) -> Vec<(Name, Arc<Node>)> {
        let inputs = &self.inputs;
        let (path, dir) = &inputs.walked.dirs[self.at as usize];
        // As a draft makes directories below a mapped one: merged with the
        // underlying directory of the same name, writable if this is.
        let writable = this.upgrade().is_some_and(|node| node.is_writable());
        let mut made = Vec::with_capacity(dir.len());
        let first = inputs.walked.index().first_file[self.at as usize] as usize;
        // Paths only for the files of directories reached.
        let content: Vec<Option<PathBuf>> = dir
            .files
            .iter()
            .enumerate()
            .map(|(i, file)| inputs.content.path(first + i, file))
            .collect();
        // Default places are looked at now, once for the directory: a
        // symlink chain is served as the file it leads to, a changed file
        // not at all.
        let default_dir = inputs.default_place.join(path);
        let mut found = default_place::look(
            &default_dir,
            dir.files
                .iter()
                .zip(&content)
                .filter(|(_, content)| content.is_none())
                .map(|(file, _)| (&*file.name, file.size)),
        )
        .into_iter();
        let mut default_anchor = None;
        for (file, content) in dir.files.iter().zip(content) {
            let node = match content {
                Some(stored) => inputs.mapping(&stored),
                None => match found.next().expect("a look per default place") {
                    Place::Here => {
                        let anchor =
                            default_anchor.get_or_insert_with(|| inputs.anchor(&default_dir));
                        mapping_in(anchor.clone(), OsStr::new(&*file.name))
                    }
                    Place::Elsewhere(target) => inputs.mapping(&target),
                    Place::Refused(why) => {
                        log::error!(
                            "sandbox {:?}: input {path}/{}: {why}; reading it fails with EIO",
                            inputs.sandbox,
                            file.name
                        );
                        Node::new_untyped(false, Origin::Refused)
                    }
                },
            };
            made.push((Name::new(OsStr::new(&*file.name)), Arc::new(node)));
        }
        for link in dir.symlinks.iter() {
            let made_link = &inputs.links[&*link.target];
            made.push((
                Name::new(OsStr::new(&*link.name)),
                Arc::new(inputs.mapping(made_link)),
            ));
        }
        for sub in dir.dirs.iter() {
            let name = Name::new(OsStr::new(&*sub.name));
            let node = match inputs.dir(&join(path, &sub.name)) {
                Some(entries) if !entries.is_empty() => Node::new_lazy_dir(
                    writable,
                    Origin::Child {
                        parent: this.clone(),
                        name: name.clone(),
                    },
                    entries,
                ),
                _ => match &inputs.empty_dirs {
                    EmptyDirs::Mapped(empty) => Arc::new(inputs.mapping(empty)),
                    EmptyDirs::Merged => Arc::new(Node::new_dir(
                        writable,
                        Origin::Child {
                            parent: this.clone(),
                            name: name.clone(),
                        },
                        Vec::new(),
                    )),
                },
            };
            made.push((name, node));
        }
        made
    }
}

/// The symlinks that stand for a tree's symlink nodes: one of ours per
/// target, holding it verbatim, made once in `dir` and named by the
/// target's hash, so nothing ever follows a symlink of the tree.
pub struct SymlinkTargets {
    dir: PathBuf,
    made: Mutex<HashSet<String>>,
}

impl SymlinkTargets {
    pub fn new(dir: PathBuf) -> SymlinkTargets {
        SymlinkTargets {
            dir,
            made: Mutex::default(),
        }
    }

    /// The symlink of ours for each symlink target in `walked`.
    pub fn of(&self, walked: &Walked) -> Result<HashMap<Box<str>, PathBuf>, SymlinkTargetError> {
        let mut links = HashMap::new();
        for (_, dir) in &walked.dirs {
            for link in dir.symlinks.iter() {
                if !links.contains_key(&*link.target) {
                    links.insert(link.target.clone(), self.symlink_for(&link.target)?);
                }
            }
        }
        Ok(links)
    }

    /// A symlink of ours whose target is `target`: made by a rename, so
    /// that one is whole whenever it is there.
    fn symlink_for(&self, target: &str) -> Result<PathBuf, SymlinkTargetError> {
        let name = sha256_hex(target.as_bytes());
        let path = self.dir.join(&name);
        if self.made.lock().contains(&name) {
            return Ok(path);
        }
        let temp = self
            .dir
            .join(format!(".{name}.{:?}", std::thread::current().id()));
        let failed = |syscall, at: &Path, source| SymlinkTargetError {
            target: target.into(),
            syscall,
            path: at.to_owned(),
            source,
        };
        let _ = std::fs::remove_file(&temp);
        std::os::unix::fs::symlink(target, &temp).map_err(|err| failed("symlink", &temp, err))?;
        std::fs::rename(&temp, &path).map_err(|err| failed("rename", &path, err))?;
        self.made.lock().insert(name);
        Ok(path)
    }
}

/// A symlink standing for a tree's symlink node that could not be made.
#[derive(Debug, thiserror::Error)]
#[error("{syscall} {path:?} (a symlink to {target:?}): {source}")]
pub struct SymlinkTargetError {
    /// The target the tree's symlink holds.
    pub target: Box<str>,
    pub syscall: &'static str,
    pub path: PathBuf,
    pub source: std::io::Error,
}
