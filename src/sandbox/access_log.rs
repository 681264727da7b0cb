//! The access log (`--access_log=FILE`): one JSON line per FUSE sandbox,
//! written when it is destroyed, saying which declared inputs its actions
//! read, which they only looked up, and which they never touched. That is
//! what pruning unused dependencies needs (Bazel's unused_inputs_list).

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::sandbox::tree::{Access, InputAccess};

pub struct AccessLog {
    path: PathBuf,
    file: Mutex<File>,
}

impl AccessLog {
    /// Opens `path` for appending (created if missing).
    pub fn open(path: &Path) -> io::Result<AccessLog> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(AccessLog {
            path: path.to_owned(),
            file: Mutex::new(file),
        })
    }

    /// Appends sandbox `id`'s line. A failure is logged, never fatal: the
    /// build must not fail for want of its log.
    pub fn write(&self, id: &str, inputs: &[InputAccess]) {
        let mut line = summary_json(id, inputs).to_string();
        line.push('\n');
        // One write(2) per line, so that lines never interleave.
        if let Err(err) = self.file.lock().write_all(line.as_bytes()) {
            log::warn!("access log {:?}: sandbox {id:?}: write: {err}", self.path);
        }
    }
}

pub fn access_name(access: Access) -> &'static str {
    match access {
        Access::None => "none",
        Access::Lookup => "lookup",
        Access::Read => "read",
    }
}

/// `{"id": ID, "inputs": [{"path", "underlying", "access"}, ...]}`, as
/// `ctl accessed --json` prints it.
pub fn inputs_json(id: &str, inputs: &[InputAccess]) -> Value {
    let inputs: Vec<Value> = inputs
        .iter()
        .map(|input| {
            json!({
                "path": input.path,
                "underlying": input.underlying.to_string_lossy(),
                "access": access_name(input.access),
            })
        })
        .collect();
    json!({"id": id, "inputs": inputs})
}

/// The access log's line: declared count, then the paths (as mapped in
/// the sandbox) by what was done with them.
pub fn summary_json(id: &str, inputs: &[InputAccess]) -> Value {
    let paths = |wanted: Access| -> Vec<&str> {
        inputs
            .iter()
            .filter(|input| input.access == wanted)
            .map(|input| input.path.as_str())
            .collect()
    };
    json!({
        "id": id,
        "declared": inputs.len(),
        "read": paths(Access::Read),
        "lookup_only": paths(Access::Lookup),
        "untouched": paths(Access::None),
    })
}
