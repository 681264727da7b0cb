//! The one-shot subcommands: `materialize` and `rmtree`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use actionfs_protocol::{Decoded, PrefixTable, Request, RequestReader};

use crate::cli::MaterializeArgs;
use crate::layout;
use crate::materialize::{self, Options};

/// Builds the sandbox a spec describes under DEST.
pub fn materialize(args: &MaterializeArgs) -> Result<(), String> {
    let spec = read_spec(args.spec.as_deref())?;
    let dest = absolute(&args.dest)?;
    let started = Instant::now();
    let create = match RequestReader::new(spec.as_bytes())
        .collect::<Vec<_>>()
        .as_slice()
    {
        [Ok(Decoded::Request(Request::Create(create)))] => create.clone(),
        [Ok(Decoded::Invalid { message, .. })] => return Err(format!("spec: {message}")),
        [Err(fatal)] => return Err(format!("spec: {fatal}")),
        items => {
            return Err(format!(
                "spec must hold exactly one CreateSandbox request, found {} values",
                items.len()
            ))
        }
    };
    let mappings = PrefixTable::new()
        .resolve_create(&create)
        .map_err(|e| format!("spec: {e}"))?;
    let plan = layout::plan(&mappings, &dest)?;
    let options = Options {
        method: args.method,
        threads: args.threads,
    };
    let made = materialize::materialize(&plan, &dest, options).map_err(|e| e.to_string())?;
    if args.verbose {
        println!(
            "materialized {} mappings into {:?} with --method={}: {} in {:?}",
            mappings.len(),
            dest,
            args.method.name(),
            made.report,
            started.elapsed()
        );
    }
    Ok(())
}

/// Deletes a tree like `rm -rf`.
pub fn rmtree(dir: &Path, verbose: bool) -> Result<(), String> {
    let started = Instant::now();
    let removed = materialize::remove_tree(dir).map_err(|e| e.to_string())?;
    if verbose {
        println!(
            "removed {:?}: {} directories and {} other entries in {:?}",
            dir,
            removed.dirs,
            removed.others,
            started.elapsed()
        );
    }
    Ok(())
}

fn read_spec(path: Option<&Path>) -> Result<String, String> {
    match path {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|e| format!("cannot read spec {path:?}: {e}"))
        }
        None => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| format!("cannot read spec from stdin: {e}"))?;
            Ok(text)
        }
    }
}

fn absolute(path: &Path) -> Result<PathBuf, String> {
    if path.is_absolute() {
        return Ok(path.to_owned());
    }
    std::env::current_dir()
        .map(|cwd| cwd.join(path))
        .map_err(|e| format!("cannot resolve {path:?}: {e}"))
}
