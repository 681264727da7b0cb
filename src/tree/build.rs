//! Turning a sandbox's layout into the node tree of the FUSE view.

use std::ffi::OsStr;
use std::sync::Arc;

use super::attr::FileKind;
use super::name::Name;
use super::node::{Location, Node, Origin};
use crate::layout::{Entry, Mapped};

/// Builds the directory tree a layout describes, rooted at `/`.
pub fn tree_of(plan: Entry) -> Arc<Node> {
    into_node(plan, Origin::Virtual, false)
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
                // Below a real directory, a directory made up for nested
                // mappings merges with the underlying one of the same name.
                let name = Name::new(&name);
                let child_origin = if has_underlying {
                    Origin::Child {
                        parent: this.clone(),
                        name: name.clone(),
                    }
                } else {
                    Origin::Virtual
                };
                let node = into_node(child, child_origin, has_underlying && writable);
                (name, node)
            })
            .collect::<Vec<_>>();
        Node::new_dir(writable, origin, children)
    })
}
