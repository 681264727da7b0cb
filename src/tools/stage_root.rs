//! `actionfs stage-root`: one REAPI input root laid out from a NativeLink
//! CAS by `actionfs::stage`, to look at or rerun a remote action's inputs
//! by hand.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::sandbox::materialize::remove_tree;
use crate::stage::{Mechanism, StageError, Stager};

#[derive(Clone, Debug)]
pub struct StageRootArgs {
    pub cas: PathBuf,
    pub hash: String,
    pub size: i64,
    pub mechanism: Mechanism,
    pub outputs: Vec<String>,
    pub verbose: bool,
    pub dest: PathBuf,
}

/// Why the root was not staged, with the destination it was for.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// DEST cannot be made absolute.
    #[error("{dest:?}: {source}")]
    Dest { dest: PathBuf, source: io::Error },
    /// The CAS cannot be opened.
    #[error("stage-root {dest:?}: {source}")]
    Open { dest: PathBuf, source: io::Error },
    #[error("stage-root {dest:?}: {source}{}", fetch_hint(.source))]
    Stage { dest: PathBuf, source: StageError },
}

/// Blobs missing from the CAS are fetched there first.
fn fetch_hint(err: &StageError) -> &'static str {
    match err {
        StageError::Missing(_) => "; fetch them into the CAS first",
        _ => "",
    }
}

/// Stages the root. Executable variants are made in a directory of their
/// own beside DEST (hard links need the same file system) and removed
/// afterwards: the root's links keep them.
pub fn run(args: &StageRootArgs) -> Result<(), Error> {
    let dest = std::path::absolute(&args.dest).map_err(|source| Error::Dest {
        dest: args.dest.clone(),
        source,
    })?;
    let parent = dest.parent().unwrap_or(Path::new("/"));
    let executables = parent.join(format!(".actionfs-exec-{}", std::process::id()));
    let started = Instant::now();
    let staged = (|| {
        let stager = Stager::open(&args.cas, &executables, args.mechanism).map_err(|source| {
            Error::Open {
                dest: dest.clone(),
                source,
            }
        })?;
        let outputs: Vec<&str> = args.outputs.iter().map(String::as_str).collect();
        stager
            .stage(&args.hash, args.size, &dest, &outputs)
            .map_err(|source| Error::Stage {
                dest: dest.clone(),
                source,
            })
    })();
    if executables.exists() {
        if let Err(err) = remove_tree(&executables) {
            eprintln!("actionfs: stage-root: {err}");
        }
    }
    let staged = staged?;
    if args.verbose {
        println!(
            "staged {}/{} at {dest:?}: {} files, {} directories in {:?}",
            args.hash,
            args.size,
            staged.files,
            staged.dirs,
            started.elapsed()
        );
    }
    Ok(())
}
