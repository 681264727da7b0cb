//! Recording the request stream (`--record=FILE`) for `actionfs replay`.
//!
//! One JSON line per event, flushed at once so that a daemon that is
//! killed still leaves a usable file: `{"t_us":T,"request":R}` when a
//! request has been read (R as on the wire) and `{"t_us":T,"answer":A}`
//! when its answer is written, T counting microseconds from the start.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use actionfs_protocol::{Request, Response};
use parking_lot::Mutex;
use serde_json::{json, Value};

pub struct Recording {
    path: PathBuf,
    started: Instant,
    /// `None` once a write failed (logged once; recording stops).
    file: Mutex<Option<File>>,
}

impl Recording {
    pub fn create(path: &Path) -> io::Result<Recording> {
        Ok(Recording {
            path: path.to_owned(),
            started: Instant::now(),
            file: Mutex::new(Some(File::create(path)?)),
        })
    }

    pub fn request(&self, request: &Request) {
        let request = serde_json::to_value(request).expect("a request always serializes");
        self.write("request", request);
    }

    pub fn answer(&self, response: &Response) {
        let answer = serde_json::to_value(response).expect("a response always serializes");
        self.write("answer", answer);
    }

    fn write(&self, kind: &str, value: Value) {
        let t_us = self.started.elapsed().as_micros() as u64;
        let mut line = json!({ "t_us": t_us, kind: value }).to_string();
        line.push('\n');
        let mut file = self.file.lock();
        if let Some(out) = file.as_mut() {
            if let Err(err) = out.write_all(line.as_bytes()) {
                log::warn!("recording {:?}: write: {err}; recording stops", self.path);
                *file = None;
            }
        }
    }
}
