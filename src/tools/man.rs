//! `actionfs man` and `actionfs completions`: the manual pages and shell
//! completions, generated from the command line's definition
//! ([`command_line::command`]) so that they cannot drift from it.
//! docs/actionfs.1.md keeps what a generator cannot say: the semantics of
//! each flag and of the file system, and examples.

use std::io::{self, Write};
use std::path::Path;

use clap_complete::Shell;

use super::command_line;

/// Writing a page failed.
#[derive(Debug)]
pub struct ManError {
    pub what: String,
    pub source: io::Error,
}

impl std::fmt::Display for ManError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "man: {}: {}", self.what, self.source)
    }
}

/// Prints actionfs(1), or with `dir` writes it and a page per subcommand,
/// at every depth (`actionfs-ctl.1`, `actionfs-ctl-create.1`...), there.
pub fn run(dir: Option<&Path>) -> Result<(), ManError> {
    let command = command_line::command();
    match dir {
        None => to_stdout(|out| page(&command, out)),
        Some(dir) => write_pages(&command, dir),
    }
}

/// Writes to stdout; a reader that stopped early (`| head`) is no error.
fn to_stdout(write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<(), ManError> {
    let mut out = io::stdout().lock();
    match write(&mut out).and_then(|()| out.flush()) {
        Err(err) if err.kind() != io::ErrorKind::BrokenPipe => Err(ManError {
            what: "writing to stdout".to_owned(),
            source: err,
        }),
        _ => Ok(()),
    }
}

fn write_pages(command: &clap::Command, dir: &Path) -> Result<(), ManError> {
    let name = command
        .get_display_name()
        .unwrap_or_else(|| command.get_name());
    let path = dir.join(format!("{name}.1"));
    let fail = |source| ManError {
        what: format!("{path:?}"),
        source,
    };
    let mut file = io::BufWriter::new(std::fs::File::create(&path).map_err(fail)?);
    page(command, &mut file)
        .and_then(|()| file.flush())
        .map_err(fail)?;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir)?;
    }
    Ok(())
}

/// One page in roff.
pub fn page(command: &clap::Command, out: &mut dyn Write) -> io::Result<()> {
    clap_mangen::Man::new(command.clone())
        .source(format!("actionfs {}", env!("CARGO_PKG_VERSION")))
        .manual("actionfs manual")
        .render(out)
}

/// Prints the completion script for `shell`.
pub fn completions(shell: Shell) -> Result<(), ManError> {
    let mut command = command_line::command();
    // Rendered whole first: clap_complete panics on a failed write.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "actionfs", &mut script);
    to_stdout(|out| out.write_all(&script))
}
