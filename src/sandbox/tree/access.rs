//! What a sandbox's actions did with its inputs, when access is tracked
//! (`FsConfig::track_access`, set by `--access_log`).
//!
//! Each node records how far the kernel got with it ([`Access`]): looked
//! up, or read (opened for reading, read, listed, or read as a link). The
//! kernel only asks the daemon when it has nothing cached, so tracking
//! turns off what would hide accesses: inodes shared between sandboxes
//! (an input read in one sandbox would be cached for the next) and taking
//! over a destroyed sandbox's kernel cache (`adoption`). With zero-message
//! opens a file counts as read once bytes are read from it; an empty file
//! can only be looked up.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::Arc;

use super::node::{Access, Node, Origin};
use super::{SandboxError, SandboxFs};
use crate::sandbox::file_kind::FileKind;

/// One declared input of a sandbox and what was done with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputAccess {
    /// As mapped inside the sandbox ("/ws/pkg/a.h").
    pub path: String,
    pub underlying: PathBuf,
    pub access: Access,
}

/// Why a sandbox's accesses cannot be told.
#[derive(Debug)]
pub enum AccessError {
    Sandbox(SandboxError),
    /// The daemon was not asked to track access.
    NotTracked,
    /// A native sandbox: its files never cross FUSE.
    Native(String),
}

impl std::fmt::Display for AccessError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AccessError::Sandbox(err) => write!(f, "{err}"),
            AccessError::NotTracked => f.write_str(
                "access is not tracked: start the daemon with --access_log=FILE \
                 (/dev/null to only ask `ctl accessed`)",
            ),
            AccessError::Native(id) => write!(
                f,
                "sandbox {id:?} is built natively, so its accesses are not seen \
                 (not available for native sandboxes)"
            ),
        }
    }
}

impl std::error::Error for AccessError {}

impl SandboxFs {
    pub fn tracks_access(&self) -> bool {
        self.config.track_access
    }

    /// Records `access` to `node` if access is tracked.
    pub(super) fn note_access(&self, node: &Node, access: Access) {
        if self.config.track_access {
            node.note_access(access);
        }
    }

    /// The read-only mappings of sandbox `id` (its declared inputs), sorted
    /// by path, each with what was done with it so far.
    pub fn accessed(&self, id: &str) -> Result<Vec<InputAccess>, AccessError> {
        if !self.config.track_access {
            return Err(AccessError::NotTracked);
        }
        let top = self
            .root
            .dir()
            .ok()
            .and_then(|root| root.explicit(OsStr::new(id)))
            .filter(|_| self.has_sandbox(id))
            .ok_or_else(|| AccessError::Sandbox(SandboxError::Missing(id.to_owned())))?;
        if top.kind() == FileKind::Symlink {
            return Err(AccessError::Native(id.to_owned()));
        }
        let mut inputs = Vec::new();
        collect_inputs(&top, String::new(), &mut inputs);
        inputs.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(inputs)
    }
}

fn collect_inputs(node: &Arc<Node>, path: String, inputs: &mut Vec<InputAccess>) {
    if let Origin::Mapped(location) = node.origin() {
        if !node.is_writable() {
            let mut underlying = location.anchor.path().to_owned();
            if !location.name.as_os_str().is_empty() {
                underlying.push(location.name.as_os_str());
            }
            inputs.push(InputAccess {
                path: if path.is_empty() {
                    "/".to_owned()
                } else {
                    path.clone()
                },
                underlying,
                access: node.access(),
            });
        }
    }
    if let Ok(dir) = node.dir() {
        dir.visit_explicit(|name, child| {
            let child_path = format!("{path}/{}", name.to_string_lossy());
            collect_inputs(child, child_path, inputs);
        });
    }
}
