//! Mode `unsandboxed`: Bazel's local strategy, each action run directly in
//! an exec root, with nothing built per action.
//!
//! Not in the original exec root itself: an action rewrites its outputs
//! there, and with `--jobs` a later action could read a file while an
//! earlier one rewrites it; a replay that produced different bytes would
//! corrupt the very inputs every other mode reads. Instead each run gets
//! a fresh exec root, `<out>/unsandboxed/execroot/<ws>`, made as Bazel
//! makes its own:
//! - every top-level entry of the original exec root that holds no
//!   replayed output (the workspace's source folders, `external`) is a
//!   symlink to that entry, so sources are read in place;
//! - a top-level entry that holds replayed outputs (`bazel-out`) is a real
//!   directory; the outputs are made in it by the replayed actions
//!   themselves, and the generated inputs nobody replays (outputs of
//!   skipped actions, files Bazel writes itself such as `.params`) are
//!   hard links to the originals (a copy across file systems), made
//!   before the timed run.
//!
//! So actions must wait for the actions that make their inputs, which the
//! pool does in every mode; an action whose producer failed is not run.
//! Outputs are deleted before their action runs, as Bazel does, so
//! writing one never writes through a hard link into the original exec
//! root; an action that writes into some other action's staged file in
//! place would (no sane build does).

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::plan::{Action, Plan};
use super::run::{self, make_dir, remove, results_root};
use super::steps::{Step, StepClock};
use super::{Error, Session};

pub struct Unsandboxed {
    /// The fresh exec root the actions run in.
    root: PathBuf,
}

impl Unsandboxed {
    /// Makes the fresh exec root; says how many files it staged.
    pub fn start(plan: &Plan, mode_dir: &Path) -> Result<(Unsandboxed, usize), Error> {
        let root = results_root(mode_dir, &plan.workspace);
        let staged = stage_exec_root(plan, &root)?;
        Ok((Unsandboxed { root }, staged))
    }
}

/// Makes `root` a fresh exec root as the module doc says (the reuse modes'
/// too, whose links point into it); says how many files it staged.
pub fn stage_exec_root(plan: &Plan, root: &Path) -> Result<usize, Error> {
    make_dir(root)?;
    let top = |path: &str| path.split('/').next().unwrap_or(path).to_owned();
    let mut made: HashSet<&str> = HashSet::new();
    let mut tops: HashSet<String> = HashSet::new();
    for action in &plan.actions {
        for output in &action.outputs {
            made.insert(&output.path);
            tops.insert(top(&output.path));
        }
        // A test writes in its TEST_TMPDIR (`_tmp/...`): here, not in
        // the original exec root.
        if let Some(dir) = run::test_tmpdir(action).filter(|d| !d.starts_with('/')) {
            tops.insert(top(dir));
        }
    }
    let entries = fs::read_dir(&plan.exec_root)
        .and_then(|entries| entries.collect::<Result<Vec<_>, _>>())
        .map_err(|err| Error::io("listing", &plan.exec_root, err))?;
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        let link = root.join(&name);
        if tops.contains(&name) {
            make_dir(&link)?;
        } else {
            symlink(entry.path(), &link).map_err(|err| Error::io("symlink", &link, err))?;
        }
    }
    for name in &tops {
        make_dir(&root.join(name))?;
    }
    let made_by_replay = |path: &str| {
        let mut path = path;
        loop {
            if made.contains(path) {
                return true;
            }
            match path.rfind('/') {
                Some(slash) => path = &path[..slash],
                None => return false,
            }
        }
    };
    let mut staged: HashSet<&str> = HashSet::new();
    for action in &plan.actions {
        for input in &action.inputs {
            if tops.contains(&top(&input.path))
                && !made_by_replay(&input.path)
                && staged.insert(&input.path)
            {
                stage(&plan.exec_root.join(&input.path), root, &input.path)?;
            }
        }
    }
    Ok(staged.len())
}

/// Puts `source` at `root/rel`: a hard link, a copy where that fails, or
/// for a symlink a link to what it resolves to.
fn stage(source: &Path, root: &Path, rel: &str) -> Result<(), Error> {
    run::make_parent(root, rel)?;
    let dest = root.join(rel);
    let meta = fs::symlink_metadata(source).map_err(|err| Error::io("lstat", source, err))?;
    let result = if meta.file_type().is_symlink() {
        fs::canonicalize(source).and_then(|target| symlink(target, &dest))
    } else {
        fs::hard_link(source, &dest).or_else(|_| fs::copy(source, &dest).map(drop))
    };
    result.map_err(|err| Error::Move {
        op: "staging",
        from: source.to_owned(),
        to_word: "at",
        to: dest,
        source: err,
    })
}

impl Session for Unsandboxed {
    fn replay(&self, _index: usize, action: &Action, clock: &StepClock) -> Result<(), Error> {
        clock.time(Step::Setup, || {
            for output in &action.outputs {
                remove(&self.root.join(&output.path))?;
                if output.dir {
                    make_dir(&self.root.join(&output.path))?;
                } else {
                    run::make_parent(&self.root, &output.path)?;
                }
            }
            if let Some(dir) = run::test_tmpdir(action) {
                make_dir(&self.root.join(dir))?;
            }
            Ok::<(), Error>(())
        })?;
        clock.time(Step::Run, || run::command(action, &self.root, None))
    }
}
