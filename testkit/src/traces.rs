//! The request streams recorded between a real Bazel 4.2.3 and sandboxfs
//! 0.2.0 (../shared/traces/bazel-4.2.3), made replayable here: their
//! placeholder roots point into a scratch directory, and every underlying
//! path they name is created.

use std::fs;
use std::path::{Path, PathBuf};

use actionfs_protocol::{Decoded, Request, RequestReader};

/// Where the recorded streams are: $ACTIONFS_TRACES, else
/// `../shared/traces/bazel-4.2.3` beside this checkout.
pub fn traces_dir() -> PathBuf {
    std::env::var_os("ACTIONFS_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/bazel-4.2.3")
        })
}

/// Whether the recorded streams are here; if not, the calling test is
/// skipped (failed under ACTIONFS_REQUIRE_ALL) with the reason.
pub fn available() -> bool {
    let dir = traces_dir();
    dir.is_dir()
        || crate::tier::skip(&format!(
            "trace directory {dir:?} is missing: clone next to shared/ or set ACTIONFS_TRACES"
        ))
}

/// Decodes a recorded stream after pointing its placeholder roots at
/// `root`.
pub fn load(stem: &str, root: &Path) -> Vec<Request> {
    let raw = fs::read_to_string(traces_dir().join(format!("{stem}.requests.json"))).unwrap();
    let raw = actionfs::tools::replay::rewrite_placeholders(&raw, root);
    RequestReader::new(raw.as_bytes())
        .map(|item| match item {
            Ok(Decoded::Request(request)) => request,
            other => panic!("{stem}: undecodable recorded request: {other:?}"),
        })
        .collect()
}

/// Creates every underlying path the stream names: writable mappings are
/// scratch directories, the rest files holding their own path.
pub fn populate(requests: &[Request]) -> usize {
    actionfs::tools::replay::populate(requests).expect("populating the traced paths")
}
