//! Turning a sandbox's layout into the node tree of the FUSE view.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use actionfs_protocol::ResolvedMapping;

use super::attr::FileKind;
use super::name::Name;
use super::node::{Node, Origin, Underlying};
use crate::layout::{self, Entry};

/// Builds the directory tree described by `mappings`, rooted at `/`.
pub fn build_tree(mappings: &[ResolvedMapping], mount_point: &Path) -> Result<Arc<Node>, String> {
    let mut dirs = HashMap::new();
    Ok(into_node(
        layout::plan(mappings, mount_point)?,
        Origin::Virtual,
        false,
        &mut dirs,
    ))
}

/// Turns a layout entry into nodes. `origin` and `inherited_writable` apply when
/// the entry is not mapped itself (a directory leading to mappings).
/// `dirs` shares underlying directories between the nodes.
fn into_node(
    entry: Entry,
    origin: Origin,
    inherited_writable: bool,
    dirs: &mut HashMap<PathBuf, Arc<Path>>,
) -> Arc<Node> {
    let (origin, writable, kind) = match entry.mapped {
        Some(mapped) => (
            Origin::Mapped(Underlying::new(&mapped.underlying, dirs)),
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
                let node = into_node(child, child_origin, has_underlying && writable, dirs);
                (name, node)
            })
            .collect::<Vec<_>>();
        Node::new_dir(writable, origin, children)
    })
}
