//! Push: every entry captured into the store now; one refused is
//! remembered for the Create that names it.

use std::path::PathBuf;
use std::sync::Arc;

use actionfs_protocol::backend::sandbox::{content, Push, Retention};

use super::Service;
use crate::sandbox::store;
use crate::serve::error::PushRefusal;

impl Service {
    /// Captures a Push into the store, every entry now. A Push has no
    /// answer: a refused entry is logged (Bazel keeps the last lines of
    /// stderr) and remembered for the Create that names it.
    pub fn push(&self, push: Push) {
        for (hash, bytes) in push.blobs {
            let put = self.store.put_directory(&hash, bytes);
            self.note(&hash, put.map_err(PushRefusal::Store));
        }
        for (hash, entry) in push.content {
            let retention = match entry.retention() {
                Retention::Reuse => store::Retention::Keep,
                Retention::SingleUse => store::Retention::SingleUse,
            };
            let put = match entry.source {
                Some(content::Source::Inline(bytes)) => self
                    .store
                    .put_bytes(&hash, &bytes, retention)
                    .map_err(PushRefusal::Store),
                Some(content::Source::Location(path)) => self
                    .store
                    .capture(&hash, &self.location(&path), retention)
                    .map_err(PushRefusal::Store),
                None => Err(PushRefusal::NoSource),
            };
            self.note(&hash, put);
        }
    }

    /// A content location's host path: Bazel sends runfiles members and
    /// displaced files relative to `Manifest.exec_root`, which is the
    /// parent of `--workspace` (a Push comes before any Create says so).
    fn location(&self, path: &str) -> PathBuf {
        self.locations_root.join(path)
    }

    fn note(&self, hash: &str, put: Result<(), PushRefusal>) {
        match put {
            Ok(()) => {
                self.refused.lock().remove(hash);
            }
            Err(refusal) => {
                log::error!("push: {refusal}");
                self.refused
                    .lock()
                    .insert(hash.to_owned(), Arc::new(refusal));
            }
        }
    }
}
