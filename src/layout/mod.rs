//! The shape of a sandbox: its mappings applied in order into a tree.
//!
//! Both ways of serving a sandbox start here: the FUSE view turns a layout
//! into nodes, the native materializer into files. Applying the mappings
//! validates them: each underlying path is `lstat`ed exactly once ([`kinds`]; a symlink
//! is taken as itself, never followed), and the tree can still change shape
//! while mappings apply (a directory made to hold `/a/b` may later be mapped
//! itself by `/a`). Nothing outside this tree changes, so an error leaves
//! nothing to undo.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use actionfs_protocol::ResolvedMapping;

use crate::file_kind::FileKind;

mod kinds;

/// The underlying object of one mapping.
#[derive(Clone, Debug)]
pub struct Mapped {
    pub underlying: PathBuf,
    pub writable: bool,
    pub kind: FileKind,
}

/// One path of the sandbox: mapped itself, or a directory leading to
/// mappings, or both.
#[derive(Debug, Default)]
pub struct Entry {
    pub mapped: Option<Mapped>,
    pub children: HashMap<OsString, Entry>,
}

impl Entry {
    /// Number of mapped entries at and below this one.
    pub fn mapping_count(&self) -> usize {
        usize::from(self.mapped.is_some())
            + self
                .children
                .values()
                .map(Entry::mapping_count)
                .sum::<usize>()
    }
}

/// Applies `mappings` in order and returns the root entry (`/`).
/// Underlying paths inside `forbidden` are refused: serving them from the
/// mount would make the daemon wait on itself.
pub fn plan(mappings: &[ResolvedMapping], forbidden: &Path) -> Result<Entry, String> {
    let mut root = Entry::default();
    // Never lstat inside the mount: the daemon would be asking itself.
    let inside: Vec<bool> = mappings
        .iter()
        .map(|m| is_within(&m.underlying, forbidden))
        .collect();
    let underlying: Vec<&Path> = mappings
        .iter()
        .zip(&inside)
        .filter(|(_, &inside)| !inside)
        .map(|(m, _)| m.underlying.as_path())
        .collect();
    let mut outside_kinds = kinds::lstat_kinds(&underlying).into_iter();
    let kinds = inside
        .iter()
        .map(|&inside| (!inside).then(|| outside_kinds.next().expect("one kind per path outside")));
    for (index, (mapping, kind)) in mappings.iter().zip(kinds).enumerate() {
        apply(&mut root, mapping, kind, forbidden).map_err(|problem| {
            format!(
                "mapping #{index} ({:?} -> {:?}): {problem}",
                mapping.path, mapping.underlying
            )
        })?;
    }
    Ok(root)
}

/// `path.starts_with(base)`, component-wise, without walking components
/// for the usual path that is plainly outside: this check runs once per
/// mapping, and comparing components was a twentieth of a large create.
fn is_within(path: &Path, base: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (p, b) = (path.as_os_str().as_bytes(), base.as_os_str().as_bytes());
    let plain = |bytes: &[u8]| {
        !bytes.windows(2).any(|w| w == b"//" || w == b"/.") && !bytes.ends_with(b"/")
    };
    if plain(p) && plain(b) && b.len() > 1 {
        p.starts_with(b) && (p.len() == b.len() || p[b.len()] == b'/')
    } else {
        path.starts_with(base)
    }
}

/// `kind`: the underlying path's lstat, or `None` if it is inside the
/// mount point `forbidden`.
fn apply(
    root: &mut Entry,
    mapping: &ResolvedMapping,
    kind: Option<std::io::Result<FileKind>>,
    forbidden: &Path,
) -> Result<(), String> {
    let Some(kind) = kind else {
        return Err(format!(
            "underlying path is inside the mount point {forbidden:?}"
        ));
    };
    let kind = kind.map_err(|err| format!("cannot use underlying path: lstat: {err}"))?;

    let mut entry = root;
    let mut walked = String::new();
    for component in mapping.components() {
        if let Some(parent) = &entry.mapped {
            if parent.kind != FileKind::Directory {
                return Err(format!(
                    "{walked:?} is mapped to a non-directory, so nothing can be mapped below it"
                ));
            }
        }
        walked.push('/');
        walked.push_str(component);
        entry = entry.children.entry(component.into()).or_default();
    }
    if entry.mapped.is_some() {
        return Err("the path is mapped twice".to_owned());
    }
    if kind != FileKind::Directory && !entry.children.is_empty() {
        return Err(
            "a non-directory cannot be mapped where nested mappings need a directory".to_owned(),
        );
    }
    if mapping.path == "/" && kind != FileKind::Directory {
        return Err("the root can only be mapped to a directory".to_owned());
    }
    entry.mapped = Some(Mapped {
        underlying: mapping.underlying.clone(),
        writable: mapping.writable,
        kind,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_within_agrees_with_component_wise_starts_with() {
        let bases = ["/mnt", "/mnt/", "/", "/a/b", "/a//b", "/a/./b"];
        let paths = [
            "/mnt", "/mnt/x", "/mntx", "/mnt//x", "/m", "/", "/a/b/c", "/a/bc", "/a//b/c",
            "/a/./b/c", "/a/b/", "/x/mnt",
        ];
        for base in bases {
            for path in paths {
                assert_eq!(
                    is_within(Path::new(path), Path::new(base)),
                    Path::new(path).starts_with(base),
                    "{path} within {base}"
                );
            }
        }
    }
}
