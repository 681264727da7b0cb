//! The one-shot subcommands: `materialize` and `rmtree`.

use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

use actionfs_protocol::{Decoded, PrefixTable, Request, RequestReader};

use crate::sandbox::layout::{self, PlanError};
use crate::sandbox::materialize::{self, Method, Options};

/// `actionfs materialize`.
#[derive(Clone, Debug)]
pub struct MaterializeArgs {
    /// `None` means stdin.
    pub spec: Option<PathBuf>,
    pub method: Method,
    /// 0: chosen by size.
    pub threads: usize,
    pub verbose: bool,
    pub dest: PathBuf,
}

/// Why a subcommand failed (exit status 1).
#[derive(Debug)]
pub enum ToolError {
    /// The spec could not be read.
    ReadSpec {
        from: String,
        source: io::Error,
    },
    /// The spec is not one valid CreateSandbox request.
    Spec(String),
    Layout(PlanError),
    Materialize(materialize::Error),
    CurrentDir(io::Error),
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolError::ReadSpec { from, source } => write!(f, "cannot read spec {from}: {source}"),
            ToolError::Spec(problem) => write!(f, "spec: {problem}"),
            ToolError::Layout(err) => write!(f, "{err}"),
            ToolError::Materialize(err) => write!(f, "{err}"),
            ToolError::CurrentDir(err) => write!(f, "cannot find the current directory: {err}"),
        }
    }
}

impl std::error::Error for ToolError {}

/// Builds the sandbox a spec describes under DEST.
pub fn materialize(args: &MaterializeArgs) -> Result<(), ToolError> {
    let spec = read_spec(args.spec.as_deref())?;
    let dest = absolute(&args.dest)?;
    let started = Instant::now();
    let create = match RequestReader::new(spec.as_bytes())
        .collect::<Vec<_>>()
        .as_slice()
    {
        [Ok(Decoded::Request(Request::Create(create)))] => create.clone(),
        [Ok(Decoded::Invalid { message, .. })] => return Err(ToolError::Spec(message.clone())),
        [Err(fatal)] => return Err(ToolError::Spec(fatal.to_string())),
        items => {
            return Err(ToolError::Spec(format!(
                "must hold exactly one CreateSandbox request, found {} values",
                items.len()
            )))
        }
    };
    let mappings = PrefixTable::new()
        .resolve_create(&create)
        .map_err(|e| ToolError::Spec(e.to_string()))?;
    let plan = layout::plan(&mappings, &dest, None).map_err(ToolError::Layout)?;
    let options = Options {
        method: args.method,
        threads: args.threads,
    };
    let made = materialize::materialize(&plan, &dest, options).map_err(ToolError::Materialize)?;
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
pub fn rmtree(dir: &Path, verbose: bool) -> Result<(), ToolError> {
    let started = Instant::now();
    let removed = materialize::remove_tree(dir).map_err(ToolError::Materialize)?;
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

fn read_spec(path: Option<&Path>) -> Result<String, ToolError> {
    match path {
        Some(path) => std::fs::read_to_string(path).map_err(|source| ToolError::ReadSpec {
            from: format!("{path:?}"),
            source,
        }),
        None => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|source| ToolError::ReadSpec {
                    from: "from stdin".to_owned(),
                    source,
                })?;
            Ok(text)
        }
    }
}

fn absolute(path: &Path) -> Result<PathBuf, ToolError> {
    if path.is_absolute() {
        return Ok(path.to_owned());
    }
    std::env::current_dir()
        .map(|cwd| cwd.join(path))
        .map_err(ToolError::CurrentDir)
}
