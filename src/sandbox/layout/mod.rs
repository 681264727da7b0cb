//! The shape of a sandbox: its mappings applied in order into a tree.
//!
//! Both ways of serving a sandbox start here: the FUSE view turns a layout
//! into nodes, the native materializer into files. Applying the mappings
//! validates them: each underlying path is `lstat`ed exactly once and
//! pinned (`kinds`; a symlink is taken as itself, never followed), and the
//! tree can still change shape while mappings apply (a directory made to
//! hold `/a/b` may later be mapped itself by `/a`). Nothing outside this
//! tree changes, so an error leaves nothing to undo.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use actionfs_protocol::ResolvedMapping;

use crate::sandbox::dirfd::Anchor;
use crate::sandbox::file_kind::FileKind;

mod draft;
mod kinds;

pub use draft::Draft;

/// The underlying object of one mapping.
#[derive(Clone, Debug)]
pub struct Mapped {
    /// Where it was found (for messages, and the materializer's symlinks).
    pub underlying: PathBuf,
    pub writable: bool,
    pub kind: FileKind,
    /// What pins it: the directory itself for a directory mapping, else
    /// the directory holding the object (found there by its last name).
    pub anchor: Arc<Anchor>,
}

/// Why a layout cannot be made: which mapping, and what is wrong with it.
#[derive(Debug)]
pub struct PlanError {
    /// Position of the mapping in the request.
    pub index: usize,
    pub path: String,
    pub underlying: PathBuf,
    pub problem: Problem,
}

/// What is wrong with one mapping.
#[derive(Debug)]
pub enum Problem {
    /// The underlying path lies inside the mount point (the daemon would
    /// be asking itself).
    InsideMount(PathBuf),
    /// lstat (or pinning its directory) failed.
    Unusable(std::io::Error),
    /// An earlier mapping made `walked` a non-directory.
    BelowNonDirectory(String),
    MappedTwice,
    /// A non-directory where nested mappings need a directory.
    NotADirectoryForNested,
    /// The mount's root (`--mapping`), or a materialized tree's, mapped to
    /// a non-directory; a sandbox's root may be one.
    RootNotADirectory,
    /// `/` mapped by a mapping other than the first: twice, or after
    /// other mappings.
    RootNotFirst,
}

/// Where sandboxfs 0.2.0 refused the same mapping, the message carries its
/// words (`Failed to map root`, `Cannot map '...'`, `Already mapped`, `Root
/// can be mapped at most once`): scripts written for it grep for them. Our
/// own context (the mapping's number, the syscall, why) stays around them.
impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let index = self.index;
        let underlying = &self.underlying;
        // sandboxfs named a mapping as `'PATH -> UNDERLYING'`.
        let cannot_map = format!(
            "mapping #{index}: Cannot map '{} -> {}'",
            self.path,
            underlying.display()
        );
        match &self.problem {
            Problem::InsideMount(_) => write!(
                f,
                "mapping #{index} ({:?} -> {underlying:?}): {}",
                self.path, self.problem
            ),
            Problem::Unusable(err) if self.path == "/" => write!(
                f,
                "mapping #{index}: Failed to map root: stat failed for {underlying:?}: lstat: {err}"
            ),
            Problem::Unusable(err) => {
                write!(
                    f,
                    "{cannot_map}: Stat failed for {underlying:?}: lstat: {err}"
                )
            }
            Problem::RootNotADirectory => write!(
                f,
                "mapping #{index}: Failed to map root: {underlying:?} is not a directory"
            ),
            Problem::MappedTwice => write!(f, "{cannot_map}: Already mapped"),
            Problem::BelowNonDirectory(_) | Problem::NotADirectoryForNested => {
                write!(f, "{cannot_map}: Already mapped ({})", self.problem)
            }
            Problem::RootNotFirst => write!(
                f,
                "{cannot_map}: Root can be mapped at most once ({})",
                self.problem
            ),
        }
    }
}

/// Our own explanation of a problem, without sandboxfs's words.
impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::InsideMount(mount) => {
                write!(f, "underlying path is inside the mount point {mount:?}")
            }
            Problem::Unusable(err) => write!(f, "cannot use underlying path: lstat: {err}"),
            Problem::BelowNonDirectory(walked) => write!(
                f,
                "{:?} is mapped to a non-directory, so nothing can be mapped below it",
                if walked.is_empty() { "/" } else { walked }
            ),
            Problem::MappedTwice => f.write_str("the path is mapped twice"),
            Problem::NotADirectoryForNested => f.write_str(
                "a non-directory cannot be mapped where nested mappings need a directory",
            ),
            Problem::RootNotADirectory => f.write_str("the root can only be mapped to a directory"),
            Problem::RootNotFirst => f.write_str(
                "only the first mapping may map \"/\": it replaces the directory the others \
                 are made in",
            ),
        }
    }
}

impl std::error::Error for PlanError {}

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
/// mount would make the daemon wait on itself. `sandbox` names the sandbox
/// in later messages about its files; a sandbox's root may be mapped to a
/// file (it is then that file, as in sandboxfs 0.2.0), a mount's or a
/// materialized tree's (`None`) must be a directory. As in sandboxfs
/// 0.2.0, only the first mapping may map the root.
pub fn plan(
    mappings: &[ResolvedMapping],
    forbidden: &Path,
    sandbox: Option<&str>,
) -> Result<Entry, PlanError> {
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
    let sandbox: Option<Arc<str>> = sandbox.map(Arc::from);
    let mut outside_kinds = kinds::lstat_kinds(&underlying, sandbox.as_ref()).into_iter();
    let kinds = inside
        .iter()
        .map(|&inside| (!inside).then(|| outside_kinds.next().expect("one kind per path outside")));
    let root_may_be_file = sandbox.is_some();
    for (index, (mapping, kind)) in mappings.iter().zip(kinds).enumerate() {
        let applied = if index > 0 && is_root(mapping) {
            Err(Problem::RootNotFirst)
        } else {
            apply(&mut root, mapping, kind, forbidden, root_may_be_file)
        };
        applied.map_err(|problem| PlanError {
            index,
            path: mapping.path.clone(),
            underlying: mapping.underlying.clone(),
            problem,
        })?;
    }
    Ok(root)
}

fn is_root(mapping: &ResolvedMapping) -> bool {
    mapping.components().next().is_none()
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
    found: Option<kinds::TypeAndPin>,
    forbidden: &Path,
    root_may_be_file: bool,
) -> Result<(), Problem> {
    let Some(found) = found else {
        return Err(Problem::InsideMount(forbidden.to_owned()));
    };
    let (kind, anchor) = found.map_err(Problem::Unusable)?;

    let mut entry = root;
    let mut walked = String::new();
    for component in mapping.components() {
        if let Some(parent) = &entry.mapped {
            if parent.kind != FileKind::Directory {
                return Err(Problem::BelowNonDirectory(walked));
            }
        }
        walked.push('/');
        walked.push_str(component);
        entry = entry.children.entry(component.into()).or_default();
    }
    if entry.mapped.is_some() {
        return Err(Problem::MappedTwice);
    }
    if kind != FileKind::Directory && !entry.children.is_empty() {
        return Err(Problem::NotADirectoryForNested);
    }
    if is_root(mapping) && kind != FileKind::Directory && !root_may_be_file {
        return Err(Problem::RootNotADirectory);
    }
    entry.mapped = Some(Mapped {
        underlying: mapping.underlying.clone(),
        writable: mapping.writable,
        kind,
        anchor,
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
