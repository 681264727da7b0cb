//! Building the node tree of a sandbox from its mappings.
//!
//! Mappings apply in order into a draft: a plain owned tree that can still
//! change shape (a directory made to hold `/a/b` may later be mapped itself
//! by `/a`). Each underlying path is `lstat`ed exactly once, never followed.
//! Only when every mapping is known to be valid is the draft turned into
//! nodes, so a failed build leaves nothing anywhere.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use actionfs_protocol::ResolvedMapping;

use super::attr::FileKind;
use super::node::{Node, Origin};

/// The underlying object of one mapping.
struct Mapped {
    underlying: PathBuf,
    writable: bool,
    kind: FileKind,
}

#[derive(Default)]
struct Draft {
    mapped: Option<Mapped>,
    children: HashMap<OsString, Draft>,
}

/// Builds the directory tree described by `mappings`, rooted at `/`.
/// Underlying paths inside `mount_point` are refused: serving them would
/// make the daemon wait on itself.
pub fn build_tree(mappings: &[ResolvedMapping], mount_point: &Path) -> Result<Arc<Node>, String> {
    let mut root = Draft::default();
    for (index, mapping) in mappings.iter().enumerate() {
        apply(&mut root, mapping, mount_point).map_err(|problem| {
            format!(
                "mapping #{index} ({:?} -> {:?}): {problem}",
                mapping.path, mapping.underlying
            )
        })?;
    }
    Ok(into_node(root, Origin::Virtual, false))
}

fn apply(root: &mut Draft, mapping: &ResolvedMapping, mount_point: &Path) -> Result<(), String> {
    if mapping.underlying.starts_with(mount_point) {
        return Err(format!(
            "underlying path is inside the mount point {mount_point:?}"
        ));
    }
    let meta = std::fs::symlink_metadata(&mapping.underlying)
        .map_err(|err| format!("cannot use underlying path: lstat: {err}"))?;
    let kind = FileKind::from_std(meta.file_type());

    let mut draft = root;
    let mut walked = String::new();
    for component in mapping.components() {
        if let Some(parent) = &draft.mapped {
            if parent.kind != FileKind::Directory {
                return Err(format!(
                    "{walked:?} is mapped to a non-directory, so nothing can be mapped below it"
                ));
            }
        }
        walked.push('/');
        walked.push_str(component);
        draft = draft.children.entry(component.into()).or_default();
    }
    if draft.mapped.is_some() {
        return Err("the path is mapped twice".to_owned());
    }
    if kind != FileKind::Directory && !draft.children.is_empty() {
        return Err(
            "a non-directory cannot be mapped where nested mappings need a directory".to_owned(),
        );
    }
    if mapping.path == "/" && kind != FileKind::Directory {
        return Err("the root can only be mapped to a directory".to_owned());
    }
    draft.mapped = Some(Mapped {
        underlying: mapping.underlying.clone(),
        writable: mapping.writable,
        kind,
    });
    Ok(())
}

/// Turns a draft into nodes. `origin` and `inherited_writable` apply when
/// the draft is not mapped itself (a directory leading to mappings).
fn into_node(draft: Draft, origin: Origin, inherited_writable: bool) -> Arc<Node> {
    let (origin, writable, kind) = match draft.mapped {
        Some(mapped) => (
            Origin::Mapped(mapped.underlying),
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
        let children = draft
            .children
            .into_iter()
            .map(|(name, child)| {
                // Below a real directory, a directory made up for nested
                // mappings merges with the underlying one of the same name.
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
            .collect();
        Node::new_dir(writable, origin, children)
    })
}
