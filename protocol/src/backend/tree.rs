//! Building the REAPI Merkle tree that a manifest's `input_root_digest`
//! names.
//!
//! Each directory is a serialized [`reapi::Directory`] whose entries are
//! sorted by name, and is named by the digest of those bytes; a directory
//! names each child directory by its digest in turn, so the root's digest
//! stands for the whole tree. [`TreeBuilder`] collects paths in any order
//! and [`TreeBuilder::build`] serializes every directory once, so the same
//! entries always give the same bytes and digests.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use prost::Message;

use super::digest::digest_of;
use super::{reapi, sandbox};

/// Why a path could not be added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeError {
    /// The path is not relative, `/`-separated and made of plain names
    /// (no empty component, `.`, `..` or NUL).
    BadPath { path: String, reason: &'static str },
    /// The path was already added as something else: another kind of
    /// node, a file of other content or mode, or a link to another target.
    Conflict { path: String },
    /// A directory above the path (`parent`) was added as a file or link.
    NotADirectory { path: String, parent: String },
}

impl fmt::Display for TreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TreeError::BadPath { path, reason } => write!(f, "bad tree path {path:?}: {reason}"),
            TreeError::Conflict { path } => {
                write!(f, "{path:?} was already added as something else")
            }
            TreeError::NotADirectory { path, parent } => {
                write!(f, "cannot add {path:?}: {parent:?} is not a directory")
            }
        }
    }
}

impl std::error::Error for TreeError {}

/// A serialized tree: the root directory's digest and every directory's
/// bytes, as a Push carries them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    pub root: reapi::Digest,
    /// Digest hash -> serialized [`reapi::Directory`], one per distinct
    /// directory (the root included).
    pub blobs: HashMap<String, Vec<u8>>,
}

impl Tree {
    /// A Push of the tree's directories (no file content).
    pub fn to_push(&self) -> sandbox::Push {
        sandbox::Push {
            blobs: self.blobs.clone(),
            content: HashMap::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    File {
        digest: reapi::Digest,
        executable: bool,
    },
    Symlink {
        target: String,
    },
    Dir(BTreeMap<String, Node>),
}

/// Collects files, links and directories by path; see the module doc.
#[derive(Debug, Clone, Default)]
pub struct TreeBuilder {
    root: BTreeMap<String, Node>,
}

impl TreeBuilder {
    /// An empty tree: only the root directory.
    pub fn new() -> TreeBuilder {
        TreeBuilder::default()
    }

    /// Adds a regular file with content `digest`, making the directories
    /// above it. Adding the same file again is allowed.
    pub fn add_file(
        &mut self,
        path: &str,
        digest: reapi::Digest,
        executable: bool,
    ) -> Result<(), TreeError> {
        self.add(path, Node::File { digest, executable })
    }

    /// Adds a symbolic link to `target` (stored as given, never followed),
    /// making the directories above it.
    pub fn add_symlink(&mut self, path: &str, target: &str) -> Result<(), TreeError> {
        self.add(
            path,
            Node::Symlink {
                target: target.to_owned(),
            },
        )
    }

    /// Makes sure the directory `path` and those above it exist; the
    /// directory stays empty unless something is added below it.
    pub fn add_dir(&mut self, path: &str) -> Result<(), TreeError> {
        self.add(path, Node::Dir(BTreeMap::new()))
    }

    fn add(&mut self, path: &str, node: Node) -> Result<(), TreeError> {
        let names = split(path)?;
        let (last, parents) = names.split_last().expect("split gives one name or more");
        let mut dir = &mut self.root;
        for (depth, name) in parents.iter().enumerate() {
            let child = dir
                .entry((*name).to_owned())
                .or_insert_with(|| Node::Dir(BTreeMap::new()));
            dir = match child {
                Node::Dir(entries) => entries,
                _ => {
                    return Err(TreeError::NotADirectory {
                        path: path.to_owned(),
                        parent: names[..=depth].join("/"),
                    })
                }
            };
        }
        match dir.get(*last) {
            None => {
                dir.insert((*last).to_owned(), node);
                Ok(())
            }
            Some(Node::Dir(_)) if matches!(node, Node::Dir(_)) => Ok(()),
            Some(existing) if *existing == node => Ok(()),
            Some(_) => Err(TreeError::Conflict {
                path: path.to_owned(),
            }),
        }
    }

    /// Serializes every directory, children first.
    pub fn build(&self) -> Tree {
        let mut blobs = HashMap::new();
        let root = serialize(&self.root, &mut blobs);
        Tree { root, blobs }
    }
}

/// The names of a relative `/`-separated path, or why it is not one.
fn split(path: &str) -> Result<Vec<&str>, TreeError> {
    let bad = |reason| TreeError::BadPath {
        path: path.to_owned(),
        reason,
    };
    if path.is_empty() {
        return Err(bad("empty"));
    }
    if path.starts_with('/') {
        return Err(bad("absolute"));
    }
    if path.contains('\0') {
        return Err(bad("contains NUL"));
    }
    let names: Vec<&str> = path.split('/').collect();
    for name in &names {
        match *name {
            "" => return Err(bad("empty component")),
            "." => return Err(bad("`.` component")),
            ".." => return Err(bad("`..` component")),
            _ => {}
        }
    }
    Ok(names)
}

/// Serializes `entries` as a Directory (and its subdirectories first) into
/// `blobs`; returns its digest.
fn serialize(
    entries: &BTreeMap<String, Node>,
    blobs: &mut HashMap<String, Vec<u8>>,
) -> reapi::Digest {
    // A BTreeMap walks its names in byte order, which is the order REAPI
    // asks for, in each of the three lists.
    let mut dir = reapi::Directory::default();
    for (name, node) in entries {
        match node {
            Node::File { digest, executable } => dir.files.push(reapi::FileNode {
                name: name.clone(),
                digest: Some(digest.clone()),
                is_executable: *executable,
                node_properties: None,
            }),
            Node::Symlink { target } => dir.symlinks.push(reapi::SymlinkNode {
                name: name.clone(),
                target: target.clone(),
                node_properties: None,
            }),
            Node::Dir(children) => dir.directories.push(reapi::DirectoryNode {
                name: name.clone(),
                digest: Some(serialize(children, blobs)),
            }),
        }
    }
    let bytes = dir.encode_to_vec();
    let digest = digest_of(&bytes);
    blobs.entry(digest.hash.clone()).or_insert(bytes);
    digest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::digest::{is_sha256_hex, sha256_hex};

    fn directory(tree: &Tree, digest: &reapi::Digest) -> reapi::Directory {
        let bytes = &tree.blobs[&digest.hash];
        assert_eq!(bytes.len() as i64, digest.size_bytes);
        assert_eq!(sha256_hex(bytes), digest.hash);
        reapi::Directory::decode(bytes.as_slice()).unwrap()
    }

    fn child<'a>(dir: &'a reapi::Directory, name: &str) -> &'a reapi::Digest {
        dir.directories
            .iter()
            .find(|d| d.name == name)
            .and_then(|d| d.digest.as_ref())
            .unwrap_or_else(|| panic!("no directory {name}"))
    }

    #[test]
    fn empty_tree_is_the_empty_directory() {
        let tree = TreeBuilder::new().build();
        assert_eq!(tree.root, digest_of(b""));
        assert_eq!(tree.blobs.len(), 1);
        assert_eq!(directory(&tree, &tree.root), reapi::Directory::default());
    }

    #[test]
    fn builds_sorted_directories() {
        let mut b = TreeBuilder::new();
        b.add_file("src/main.rs", digest_of(b"fn main() {}"), false)
            .unwrap();
        b.add_file("src/b.rs", digest_of(b"b"), false).unwrap();
        b.add_file("run.sh", digest_of(b"#!/bin/sh"), true).unwrap();
        b.add_symlink("src/a.rs", "b.rs").unwrap();
        b.add_dir("out/empty").unwrap();
        b.add_file("B", digest_of(b""), false).unwrap();
        let tree = b.build();
        // root, src, out, out/empty.
        assert_eq!(tree.blobs.len(), 4);

        let root = directory(&tree, &tree.root);
        let names = |nodes: Vec<&String>| nodes.into_iter().cloned().collect::<Vec<_>>();
        assert_eq!(
            names(root.files.iter().map(|f| &f.name).collect()),
            ["B", "run.sh"]
        );
        assert!(root.files[1].is_executable && !root.files[0].is_executable);
        assert_eq!(
            names(root.directories.iter().map(|d| &d.name).collect()),
            ["out", "src"]
        );
        assert!(root.symlinks.is_empty());

        let src = directory(&tree, child(&root, "src"));
        assert_eq!(
            names(src.files.iter().map(|f| &f.name).collect()),
            ["b.rs", "main.rs"]
        );
        assert_eq!(src.files[1].digest, Some(digest_of(b"fn main() {}")));
        assert_eq!(src.symlinks.len(), 1);
        assert_eq!(
            (&*src.symlinks[0].name, &*src.symlinks[0].target),
            ("a.rs", "b.rs")
        );

        let out = directory(&tree, child(&root, "out"));
        let empty = child(&out, "empty");
        assert_eq!(*empty, digest_of(b""));
        for hash in tree.blobs.keys() {
            assert!(is_sha256_hex(hash));
        }
    }

    #[test]
    fn same_entries_give_the_same_root_in_any_order() {
        let paths = ["a/b/c", "a/d", "e", "a/b/f"];
        let mut one = TreeBuilder::new();
        for p in paths {
            one.add_file(p, digest_of(p.as_bytes()), false).unwrap();
        }
        let mut two = TreeBuilder::new();
        for p in paths.iter().rev() {
            two.add_file(p, digest_of(p.as_bytes()), false).unwrap();
        }
        two.add_dir("a/b").unwrap();
        assert_eq!(one.build(), two.build());
        // Content, mode and names all count.
        let mut three = two.clone();
        three.add_file("x", digest_of(b"x"), false).unwrap();
        assert_ne!(three.build().root, two.build().root);
    }

    #[test]
    fn identical_directories_share_one_blob() {
        let mut b = TreeBuilder::new();
        b.add_file("x/f", digest_of(b"f"), false).unwrap();
        b.add_file("y/f", digest_of(b"f"), false).unwrap();
        let tree = b.build();
        assert_eq!(tree.blobs.len(), 2);
        let root = directory(&tree, &tree.root);
        assert_eq!(child(&root, "x"), child(&root, "y"));
        assert_eq!(tree.to_push().blobs, tree.blobs);
    }

    #[test]
    fn refuses_bad_paths() {
        let mut b = TreeBuilder::new();
        for path in ["", "/a", "a//b", "a/", "./a", "a/./b", "a/..", "..", "a\0b"] {
            let err = b.add_file(path, digest_of(b""), false).unwrap_err();
            assert!(matches!(err, TreeError::BadPath { .. }), "{path:?}: {err}");
            assert!(b.add_dir(path).is_err(), "{path:?}");
            assert!(b.add_symlink(path, "t").is_err(), "{path:?}");
        }
        // Nothing was added on the way.
        assert_eq!(b.build().root, digest_of(b""));
        // Dots inside names are plain names.
        b.add_file("a/.b/..c/...", digest_of(b""), false).unwrap();
    }

    #[test]
    fn refuses_conflicts() {
        let mut b = TreeBuilder::new();
        let f = digest_of(b"f");
        b.add_file("d/f", f.clone(), false).unwrap();
        b.add_symlink("d/l", "f").unwrap();
        // Again, the same: fine.
        b.add_file("d/f", f.clone(), false).unwrap();
        b.add_symlink("d/l", "f").unwrap();
        b.add_dir("d").unwrap();

        let conflicts: [(&str, Result<(), TreeError>); 6] = [
            ("d/f", b.clone().add_dir("d/f")),
            ("d/f", b.clone().add_symlink("d/f", "x")),
            ("d/f", b.clone().add_file("d/f", digest_of(b"g"), false)),
            ("d/f", b.clone().add_file("d/f", f.clone(), true)),
            ("d/l", b.clone().add_symlink("d/l", "g")),
            ("d", b.clone().add_file("d", f.clone(), false)),
        ];
        for (path, result) in conflicts {
            assert_eq!(
                result,
                Err(TreeError::Conflict {
                    path: path.to_owned()
                })
            );
        }

        for below in ["d/f/x", "d/f/x/y", "d/l/x"] {
            let err = b.add_dir(below).unwrap_err();
            let parent = below[..3].to_owned();
            assert_eq!(
                err,
                TreeError::NotADirectory {
                    path: below.to_owned(),
                    parent
                }
            );
            assert!(!err.to_string().contains('\n'));
        }
    }
}
