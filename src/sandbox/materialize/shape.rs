//! What a native build puts inside a writable directory, as data: the
//! directories it makes and the symlinks it places there. Reusing a
//! sandbox compares two shapes; every directory carries a digest of all
//! below it, so the parts two shapes share are skipped without a walk.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;

use crate::sandbox::dirfd::{c_name, readlink_at};
use crate::sandbox::file_kind::FileKind;
use crate::sandbox::layout::Draft;

use super::shape_cache::{Fingerprints, ShapeCache};

/// One entry of a shape. Directories are shared: shapes built from
/// drafts reuse the unchanged parts of earlier ones ([`ShapeCache`]), and
/// comparing two shared parts is a pointer comparison.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Dir(Arc<Dir>),
    /// A symlink and its target.
    Link(OsString),
}

/// A directory of a shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dir {
    entries: BTreeMap<OsString, Node>,
    digest: u64,
    links: usize,
    /// See [`Dir::bytes`]; kept, as every destroy that stashes asks.
    bytes: usize,
}

/// A tmpfs inode and dentry, roughly: what an entry costs beyond its name
/// and link target.
const BYTES_PER_ENTRY: usize = 768;

impl Node {
    pub fn digest(&self) -> u64 {
        match self {
            Node::Dir(dir) => dir.digest,
            Node::Link(target) => {
                let mut hasher = DefaultHasher::new();
                target.hash(&mut hasher);
                hasher.finish()
            }
        }
    }

    /// Symlinks at and below this node.
    pub fn links(&self) -> usize {
        match self {
            Node::Dir(dir) => dir.links,
            Node::Link(_) => 1,
        }
    }

    /// What the node costs to keep (see [`Dir::bytes`]).
    pub fn bytes(&self) -> usize {
        match self {
            Node::Dir(dir) => dir.bytes(),
            Node::Link(target) => target.len(),
        }
    }
}

impl Default for Dir {
    fn default() -> Dir {
        Dir::new(BTreeMap::new())
    }
}

impl Dir {
    pub fn new(entries: BTreeMap<OsString, Node>) -> Dir {
        // A directory's digest covers its names and its entries' digests,
        // in name order; directories and links hash apart.
        let mut hasher = DefaultHasher::new();
        for (name, node) in &entries {
            name.hash(&mut hasher);
            matches!(node, Node::Dir(_)).hash(&mut hasher);
            node.digest().hash(&mut hasher);
        }
        let links = entries.values().map(Node::links).sum();
        let bytes = entries
            .iter()
            .map(|(name, node)| BYTES_PER_ENTRY + name.len() + node.bytes())
            .sum();
        Dir {
            digest: hasher.finish(),
            links,
            bytes,
            entries,
        }
    }

    /// The shape a symlink build gives the children of `entry` (a writable
    /// directory mapping): `None` if any of them is not made of plain
    /// directories and symlinks fixed by the plan (a read-only directory
    /// copied entry by entry, a writable directory with mappings inside),
    /// or if a mapped symlink cannot be read. The reference for
    /// [`Dir::of_draft`], which builds use.
    #[cfg(test)]
    pub fn of_plan(entry: &crate::sandbox::layout::Entry) -> Option<Dir> {
        let mut entries = BTreeMap::new();
        for (name, child) in &entry.children {
            let node = match &child.mapped {
                None => Node::Dir(Arc::new(Dir::of_plan(child)?)),
                Some(_) if !child.children.is_empty() => return None,
                // Copied as a symlink with the same target (see place).
                Some(mapped) if mapped.kind == FileKind::Symlink => {
                    Node::Link(read_link(&mapped.underlying)?)
                }
                Some(mapped) => Node::Link(mapped.underlying.clone().into_os_string()),
            };
            entries.insert(name.clone(), node);
        }
        Some(Dir::new(entries))
    }

    /// [`Dir::of_plan`] of directory `at` of `draft` (finished), read
    /// from the draft itself: the same shape without typing the inputs
    /// into a plan first. A leaf of unknown type is a symlink if it reads
    /// as one; `None` where `of_plan` gives none, or if a leaf cannot be
    /// read (typing it would fail too). Subdirectories whose shape
    /// follows from the draft alone come from `cache` when it has them.
    pub fn of_draft(draft: &Draft, at: u32, cache: Option<&ShapeCache<Dir>>) -> Option<Dir> {
        let fingerprints = cache.map(|cache| Fingerprints::of(draft, at, cache));
        let cached = cache.zip(fingerprints.as_ref());
        Dir::of_draft_dir(draft, at, cached)
    }

    fn of_draft_dir(
        draft: &Draft,
        at: u32,
        cache: Option<(&ShapeCache<Dir>, &Fingerprints)>,
    ) -> Option<Dir> {
        let dir = &draft.dirs[at as usize];
        let leaves = dir.leaves.iter().map(|leaf| {
            let underlying = draft.leaf_underlying(leaf);
            let node = match leaf.kind {
                Some(FileKind::Symlink) => Node::Link(read_link(&underlying)?),
                Some(_) => Node::Link(underlying.into_os_string()),
                None => match read_link(&underlying) {
                    Some(target) => Node::Link(target),
                    None if is_not_a_link(&underlying) => Node::Link(underlying.into_os_string()),
                    None => return None,
                },
            };
            Some((OsStr::from_bytes(draft.name(leaf.name)).to_owned(), node))
        });
        let subdirs = dir.subdirs.iter().map(|&(name, sub)| {
            // A mapped directory here has mappings below it.
            if draft.dirs[sub as usize].mapped.is_some() {
                return None;
            }
            let node = Node::Dir(Dir::of_draft_subdir(draft, sub, cache)?);
            Some((OsStr::from_bytes(draft.name(name)).to_owned(), node))
        });
        // Collected, not inserted one by one: the map is built in bulk
        // from its sorted entries (leaves mostly come sorted already).
        Some(Dir::new(leaves.chain(subdirs).collect::<Option<_>>()?))
    }

    /// Subdirectory `sub` of a draft: the cached shape of the same
    /// fingerprint, else built (and cached where it has a fingerprint).
    fn of_draft_subdir(
        draft: &Draft,
        sub: u32,
        cache: Option<(&ShapeCache<Dir>, &Fingerprints)>,
    ) -> Option<Arc<Dir>> {
        let keyed = cache.and_then(|(shapes, fingerprints)| Some((shapes, fingerprints.get(sub)?)));
        if let Some(dir) = keyed.and_then(|(shapes, key)| shapes.get(key)) {
            return Some(dir);
        }
        let dir = Arc::new(Dir::of_draft_dir(draft, sub, cache)?);
        if let Some((shapes, key)) = keyed {
            shapes.insert(key, dir.clone());
        }
        Some(dir)
    }

    /// What the directory's entries cost to keep, roughly: a tmpfs inode
    /// and dentry per entry, plus names and targets.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn entries(&self) -> &BTreeMap<OsString, Node> {
        &self.entries
    }

    pub fn into_entries(self) -> BTreeMap<OsString, Node> {
        self.entries
    }

    /// Takes the node at `rel` out of the shape, for taking a shape apart:
    /// the digests, counts and sizes of the directories above it go stale.
    /// A directory on the way that is shared is copied first (its level
    /// only: its entries stay shared).
    pub fn take(&mut self, rel: &std::path::Path) -> Option<Node> {
        let mut names = rel.iter();
        let last = names.next_back()?;
        let mut dir = self;
        for name in names {
            match dir.entries.get_mut(name)? {
                Node::Dir(sub) => dir = Arc::make_mut(sub),
                Node::Link(_) => return None,
            }
        }
        dir.entries.remove(last)
    }

    /// The node at `rel` (names below this directory).
    pub fn at(&self, rel: &std::path::Path) -> Option<&Node> {
        let mut names = rel.iter();
        let mut node = self.get(names.next()?)?;
        for name in names {
            match node {
                Node::Dir(dir) => node = dir.get(name)?,
                Node::Link(_) => return None,
            }
        }
        Some(node)
    }

    /// The subdirectories, with their names.
    pub fn subdirs(&self) -> impl Iterator<Item = (&OsString, &Dir)> {
        self.entries.iter().filter_map(|(name, node)| match node {
            Node::Dir(sub) => Some((name, &**sub)),
            Node::Link(_) => None,
        })
    }

    pub fn get(&self, name: &OsStr) -> Option<&Node> {
        self.entries.get(name)
    }

    pub fn digest(&self) -> u64 {
        self.digest
    }

    pub fn links(&self) -> usize {
        self.links
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Symlinks `self` and `other` both hold at the same path with the
    /// same target. Equal digests are taken for equal directories without
    /// comparing them: the count only ranks stashes (a reshape compares
    /// what it skips), and comparing would walk every equal part.
    pub fn shared_links(&self, other: &Dir) -> usize {
        if self.digest == other.digest {
            return self.links;
        }
        // Both maps are sorted by name: one merged pass, no lookups (a
        // build compares its shape with every stash of its pool).
        let (mut mine, mut theirs) = (self.entries.iter(), other.entries.iter());
        let (mut a, mut b) = (mine.next(), theirs.next());
        let mut shared = 0;
        while let (Some((a_name, a_node)), Some((b_name, b_node))) = (a, b) {
            match a_name.cmp(b_name) {
                std::cmp::Ordering::Less => a = mine.next(),
                std::cmp::Ordering::Greater => b = theirs.next(),
                std::cmp::Ordering::Equal => {
                    shared += match (a_node, b_node) {
                        (Node::Link(x), Node::Link(y)) if x == y => 1,
                        (Node::Dir(x), Node::Dir(y)) => x.shared_links(y),
                        _ => 0,
                    };
                    (a, b) = (mine.next(), theirs.next());
                }
            }
        }
        shared
    }
}

/// The target of symlink `path`, if it is one.
fn read_link(path: &std::path::Path) -> Option<OsString> {
    let path = c_name(path.as_os_str()).ok()?;
    let target = readlink_at(nix::fcntl::AT_FDCWD, &path).ok()?;
    Some(OsString::from_vec(target.into_bytes()))
}

/// Whether `path` exists and is not a symlink.
fn is_not_a_link(path: &std::path::Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| !meta.file_type().is_symlink())
}

/// Reads the directory `dir` as a shape, for tests: every directory and
/// symlink below it; `None` if anything else is there.
#[cfg(test)]
pub(crate) fn read_dir_shape(dir: &crate::sandbox::dirfd::DirFd) -> std::io::Result<Option<Dir>> {
    use std::os::fd::AsFd;
    let mut entries = BTreeMap::new();
    let mut listing = dir.entries()?;
    for item in listing.iter() {
        let (name, kind, _) = item?;
        let kind = match kind {
            Some(kind) => kind,
            None => dir.kind_at(&name)?,
        };
        let node = match kind {
            FileKind::Directory => match read_dir_shape(&dir.open_at(&name)?)? {
                Some(sub) => Node::Dir(Arc::new(sub)),
                None => return Ok(None),
            },
            FileKind::Symlink => {
                let target = readlink_at(dir.as_fd(), &name)?;
                Node::Link(OsString::from_vec(target.into_bytes()))
            }
            _ => return Ok(None),
        };
        entries.insert(OsString::from_vec(name.into_bytes()), node);
    }
    Ok(Some(Dir::new(entries)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(target: &str) -> Node {
        Node::Link(target.into())
    }

    fn dir(entries: Vec<(&str, Node)>) -> Dir {
        Dir::new(entries.into_iter().map(|(n, e)| (n.into(), e)).collect())
    }

    #[test]
    fn digests_tell_shapes_apart_and_shared_links_count_only_equal_paths() {
        let a = dir(vec![
            ("x", link("/u/x")),
            ("sub", Node::Dir(Arc::new(dir(vec![("y", link("/u/y"))])))),
        ]);
        let same = a.clone();
        let moved = dir(vec![
            ("x", link("/u/x")),
            ("other", Node::Dir(Arc::new(dir(vec![("y", link("/u/y"))])))),
        ]);
        let retargeted = dir(vec![
            ("x", link("/u/other")),
            ("sub", Node::Dir(Arc::new(dir(vec![("y", link("/u/y"))])))),
        ]);
        // A link and a directory of the same name never compare equal.
        let flipped = dir(vec![("x", Node::Dir(Arc::default()))]);
        assert_eq!(a.digest(), same.digest());
        assert_ne!(a.digest(), moved.digest());
        assert_ne!(a.digest(), retargeted.digest());
        assert_eq!(a.links(), 2);
        assert_eq!(a.shared_links(&same), 2);
        assert_eq!(a.shared_links(&moved), 1);
        assert_eq!(a.shared_links(&retargeted), 1);
        assert_eq!(a.shared_links(&flipped), 0);
        assert_eq!(flipped.links(), 0);
    }

    /// Shared links by looking each name up, the obvious way.
    fn shared_by_lookup(a: &Dir, b: &Dir) -> usize {
        a.entries()
            .iter()
            .map(|(name, mine)| match (mine, b.get(name)) {
                (Node::Link(x), Some(Node::Link(y))) if x == y => 1,
                (Node::Dir(x), Some(Node::Dir(y))) => shared_by_lookup(x, y),
                _ => 0,
            })
            .sum()
    }

    fn shape() -> impl proptest::strategy::Strategy<Value = Dir> {
        use proptest::prelude::*;
        // Few names and targets, so that two shapes share some.
        let leaf = prop_oneof![
            3 => (0..3u8).prop_map(|t| Node::Link(format!("/u/{t}").into())),
            1 => Just(Node::Dir(Arc::default())),
        ];
        let node = leaf.prop_recursive(3, 40, 5, |inner| {
            prop::collection::btree_map("[a-e]", inner, 0..5)
                .prop_map(|entries| Node::Dir(Arc::new(dir_of(entries))))
        });
        prop::collection::btree_map("[a-e]", node, 0..6).prop_map(dir_of)
    }

    fn dir_of(entries: BTreeMap<String, Node>) -> Dir {
        Dir::new(entries.into_iter().map(|(n, e)| (n.into(), e)).collect())
    }

    proptest::proptest! {
        #[test]
        fn shared_links_by_one_merged_pass_counts_as_lookups_do(a in shape(), b in shape()) {
            proptest::prop_assert_eq!(a.shared_links(&b), shared_by_lookup(&a, &b));
            proptest::prop_assert_eq!(b.shared_links(&a), shared_by_lookup(&a, &b));
            proptest::prop_assert_eq!(a.shared_links(&a), a.links());
        }
    }

    #[test]
    fn a_directory_size_counts_every_entry_below_it_with_names_and_targets() {
        let inner = dir(vec![("y", link("/u/y")), ("z", link("/u/zz"))]);
        let outer = dir(vec![
            ("x", link("/u/x")),
            ("sub", Node::Dir(Arc::new(inner))),
        ]);
        // Four entries; names x, sub, y, z; targets /u/x, /u/y, /u/zz.
        let expected = 4 * BYTES_PER_ENTRY + (1 + 3 + 1 + 1) + (4 + 4 + 5);
        assert_eq!(outer.bytes(), expected);
        assert_eq!(Dir::default().bytes(), 0);
    }
}
