//! Turning a sandbox's layout into the node tree of the FUSE view.
//!
//! A [`Draft`] (what a CreateSandbox request gives) becomes nodes with no
//! system call: its leaves become untyped nodes, typed at their first
//! lookup. A typed [`Entry`] (the `--mapping`s of the mount, or a sandbox
//! typed for the native materializer that then falls back to the view)
//! becomes typed nodes.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Weak};

use super::attr::FileKind;
use super::error::FsError;
use super::name::Name;
use super::namespace::type_entry;
use super::node::{DirData, LazyEntries, Location, Node, Origin};
use crate::sandbox::layout::{Draft, Entry, Mapped};

/// Builds the directory tree a layout describes, rooted at `/`.
pub fn tree_of(plan: Entry) -> Arc<Node> {
    into_node(plan, Origin::Virtual, false)
}

/// Builds the tree of a finished draft, rooted at `/`. Each directory's
/// leaves are freed as its nodes are made.
pub fn tree_of_draft(mut draft: Draft) -> Arc<Node> {
    draft_node(&mut draft, 0, Origin::Virtual, false)
}

fn draft_node(draft: &mut Draft, at: u32, origin: Origin, inherited_writable: bool) -> Arc<Node> {
    let dir = &mut draft.dirs[at as usize];
    let (origin, writable) = match &dir.mapped {
        Some(mapped) => {
            let anchor = mapped
                .anchor
                .clone()
                .expect("a finished draft pins its directories");
            let location = Location {
                anchor,
                name: Name::new(OsStr::new("")),
            };
            (Origin::Mapped(location), mapped.writable)
        }
        None => (origin, inherited_writable),
    };
    let leaves = std::mem::take(&mut dir.leaves);
    let subdirs = std::mem::take(&mut dir.subdirs);
    let has_underlying = !matches!(origin, Origin::Virtual);
    Arc::new_cyclic(|this| {
        let mut children = Vec::with_capacity(leaves.len() + subdirs.len());
        for leaf in leaves {
            let location = Location {
                anchor: draft.anchors[leaf.anchor as usize].clone(),
                name: Name::new(OsStr::from_bytes(draft.name(leaf.underlying_name))),
            };
            let node = Node::new_untyped(leaf.writable, Origin::Mapped(location));
            let name = Name::new(OsStr::from_bytes(draft.name(leaf.name)));
            children.push((name, Arc::new(node)));
        }
        for (name, sub) in subdirs {
            let name = Name::new(OsStr::from_bytes(draft.name(name)));
            let child_origin = made_up_origin(has_underlying, this, &name);
            let node = draft_node(draft, sub, child_origin, has_underlying && writable);
            children.push((name, node));
        }
        Node::new_dir(writable, origin, children)
    })
}

/// Puts each lazy directory of `lazy` (its entries at a path below `/`,
/// components joined by `/`) in `tree`, making the directories that lead
/// to it as a draft would: each below a mapped or merged directory merges
/// with the underlying directory of its name and is writable where its
/// parent is. The siblings of a parent are added at once, so that its
/// entries stay one sorted slice. Fails if a leaf is in the way or a path
/// is taken (the tree is then to be dropped: it is not published yet).
pub fn graft_lazy(
    tree: &Arc<Node>,
    mut lazy: Vec<(String, Box<dyn LazyEntries>)>,
) -> Result<(), GraftError> {
    // A path's parent and last name, borrowed from it.
    fn split(path: &str) -> (&str, &str) {
        let path = path.trim_matches('/');
        path.rsplit_once('/').unwrap_or(("", path))
    }
    // Stable: siblings keep their order, and each parent's come together.
    lazy.sort_by(|(a, _), (b, _)| split(a).0.cmp(split(b).0));
    let mut lazy = lazy.into_iter().peekable();
    while let Some((path, entries)) = lazy.next() {
        let (parent_path, name) = split(&path);
        if name.is_empty() {
            return Err(GraftError::NotBelowTop { path });
        }
        let parent = reach_dir(tree, parent_path, &path)?;
        let dir = parent
            .dir()
            .map_err(|_| GraftError::FileInTheWay { path: path.clone() })?;
        let has_underlying = !matches!(parent.origin(), Origin::Virtual);
        let writable = has_underlying && parent.is_writable();
        let this = Arc::downgrade(&parent);
        let lazy_dir = |name: &str, entries| {
            let name = Name::new(OsStr::new(name));
            let origin = made_up_origin(has_underlying, &this, &name);
            (name, Node::new_lazy_dir(writable, origin, entries))
        };
        let mut nodes = vec![lazy_dir(name, entries)];
        while let Some((sibling, entries)) = lazy.next_if(|(next, _)| split(next).0 == parent_path)
        {
            nodes.push(lazy_dir(split(&sibling).1, entries));
        }
        dir.insert_explicit_all(nodes).map_err(|taken| {
            let taken = taken.as_os_str().to_string_lossy();
            GraftError::Taken {
                path: match parent_path {
                    "" => taken.into_owned(),
                    parent => format!("{parent}/{taken}"),
                },
            }
        })?;
    }
    Ok(())
}

/// The directory at `dir_path` below `tree`, typed, made (as
/// [`graft_lazy`] says) where missing; `for_path` names errors.
fn reach_dir(tree: &Arc<Node>, dir_path: &str, for_path: &str) -> Result<Arc<Node>, GraftError> {
    let mut node = tree.clone();
    for name in dir_path.split('/').filter(|name| !name.is_empty()) {
        let dir = typed_dir(&node, for_path)?;
        let name = Name::new(OsStr::new(name));
        node = match dir.explicit(name.as_os_str()) {
            Some(next) => next,
            None => {
                let has_underlying = !matches!(node.origin(), Origin::Virtual);
                let origin = made_up_origin(has_underlying, &Arc::downgrade(&node), &name);
                let writable = has_underlying && node.is_writable();
                let next = Arc::new(Node::new_dir(writable, origin, Vec::new()));
                // Cannot be taken: this thread alone sees the tree.
                let _ = dir.insert_explicit(name.as_os_str(), next.clone());
                next
            }
        };
    }
    typed_dir(&node, for_path)?;
    Ok(node)
}

/// `node`'s directory data, typing the node first if it is a mapping
/// with nothing nested in it (typed, and a directory pinned, by the
/// `lstat` its first lookup would make).
fn typed_dir<'a>(node: &'a Arc<Node>, for_path: &str) -> Result<&'a DirData, GraftError> {
    if node.typed_kind().is_none() {
        type_entry(node).map_err(|source| GraftError::Typing {
            path: for_path.to_owned(),
            source,
        })?;
    }
    node.dir().map_err(|_| GraftError::FileInTheWay {
        path: for_path.to_owned(),
    })
}

/// Why a lazy directory cannot be put where it was asked for; each names
/// the lazy directory's path below the sandbox's top.
#[derive(Debug, thiserror::Error)]
pub enum GraftError {
    #[error("{path:?}: not below the sandbox's top")]
    NotBelowTop { path: String },
    #[error("{path:?}: a file is in the way")]
    FileInTheWay { path: String },
    /// Another node has this path.
    #[error("{path:?} is there already")]
    Taken { path: String },
    /// A mapping on the way could not be typed.
    #[error("{path:?}: {source}")]
    Typing { path: String, source: FsError },
    /// The writable directory a lazy root merges with.
    #[error("root: open {path:?}: {source}")]
    OpenRoot {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// The origin of directory `name`, made up for nested mappings below
/// `parent`: below a real directory it merges with the underlying one of
/// the same name, below a made-up one it has none.
fn made_up_origin(parent_has_underlying: bool, parent: &Weak<Node>, name: &Name) -> Origin {
    if parent_has_underlying {
        Origin::Child {
            parent: parent.clone(),
            name: name.clone(),
        }
    } else {
        Origin::Virtual
    }
}

/// Where a mapped object is found: a directory is its own anchor, anything
/// else is its last name in the anchored directory.
fn location(mapped: &Mapped) -> Location {
    let name = match mapped.kind {
        FileKind::Directory => OsStr::new(""),
        _ => mapped.underlying.file_name().unwrap_or_default(),
    };
    Location {
        anchor: mapped.anchor.clone(),
        name: Name::new(name),
    }
}

/// Turns a layout entry into nodes. `origin` and `inherited_writable`
/// apply when the entry is not mapped itself (a directory leading to
/// mappings).
fn into_node(entry: Entry, origin: Origin, inherited_writable: bool) -> Arc<Node> {
    let (origin, writable, kind) = match &entry.mapped {
        Some(mapped) => (
            Origin::Mapped(location(mapped)),
            mapped.writable,
            mapped.kind,
        ),
        None => (origin, inherited_writable, FileKind::Directory),
    };
    if kind != FileKind::Directory {
        return Arc::new(Node::new(kind, writable, origin));
    }
    let has_underlying = !matches!(origin, Origin::Virtual);
    Arc::new_cyclic(|this| {
        let children = entry
            .children
            .into_iter()
            .map(|(name, child)| {
                let name = Name::new(&name);
                let child_origin = made_up_origin(has_underlying, this, &name);
                let node = into_node(child, child_origin, has_underlying && writable);
                (name, node)
            })
            .collect::<Vec<_>>();
        Node::new_dir(writable, origin, children)
    })
}
