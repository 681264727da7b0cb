//! `actionfs stage-root`: one REAPI input root laid out from a NativeLink
//! CAS by `actionfs::stage`, to look at or rerun a remote action's inputs
//! by hand.

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

/// Stages the root. Executable variants are made in a directory of their
/// own beside DEST (hard links need the same file system) and removed
/// afterwards: the root's links keep them.
pub fn run(args: &StageRootArgs) -> Result<(), String> {
    let dest = std::path::absolute(&args.dest).map_err(|err| format!("{:?}: {err}", args.dest))?;
    let parent = dest.parent().unwrap_or(Path::new("/"));
    let executables = parent.join(format!(".actionfs-exec-{}", std::process::id()));
    let started = Instant::now();
    let staged = (|| {
        let stager =
            Stager::open(&args.cas, &executables, args.mechanism).map_err(|err| err.to_string())?;
        let outputs: Vec<&str> = args.outputs.iter().map(String::as_str).collect();
        stager
            .stage(&args.hash, args.size, &dest, &outputs)
            .map_err(|err| match err {
                StageError::Missing(_) => format!("{err}; fetch them into the CAS first"),
                _ => err.to_string(),
            })
    })();
    if executables.exists() {
        if let Err(err) = remove_tree(&executables) {
            eprintln!("actionfs: stage-root: {err}");
        }
    }
    let staged = staged.map_err(|why| format!("stage-root {dest:?}: {why}"))?;
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
