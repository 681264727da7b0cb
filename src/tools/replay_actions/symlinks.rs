//! Mode `symlinks`: Bazel's classic sandbox. Per action, a fresh
//! directory holds one symlink per input to the original exec root, the
//! empty directory inputs and the outputs' parent directories; the action
//! runs there, its outputs are moved into this mode's exec root, and the
//! directory is deleted. With `--jail`, the action runs in Bazel's
//! `linux-sandbox` as Bazel's `linux-sandbox` strategy runs it
//! ([`super::jail`]); without, bare (Bazel's `processwrapper-sandbox`).

use std::collections::HashSet;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::jail::Jail;
use super::plan::{Action, Plan};
use super::run::{self, make_dir, remove, results_root};
use super::steps::{Step, StepClock};
use super::{Error, Session};

pub struct Symlinks<'a> {
    plan: &'a Plan,
    /// `<mode dir>/execroot/<ws>`: where outputs are moved to.
    results: PathBuf,
    /// `<mode dir>/sandbox`: one directory per action below it.
    sandboxes: PathBuf,
    jail: Option<&'a Jail>,
}

impl<'a> Symlinks<'a> {
    pub fn start(
        plan: &'a Plan,
        mode_dir: &Path,
        jail: Option<&'a Jail>,
    ) -> Result<Symlinks<'a>, Error> {
        let results = results_root(mode_dir, &plan.workspace);
        let sandboxes = mode_dir.join("sandbox");
        make_dir(&results)?;
        make_dir(&sandboxes)?;
        Ok(Symlinks {
            plan,
            results,
            sandboxes,
            jail,
        })
    }

    fn build_and_run(&self, action: &Action, root: &Path, clock: &StepClock) -> Result<(), Error> {
        clock.time(Step::Setup, || self.build(action, root))?;
        clock.time(Step::Run, || self.run(action, root))?;
        clock.time(Step::Collect, || self.move_outputs(action, root))
    }

    /// The forest: a symlink per input, and the outputs' directories.
    fn build(&self, action: &Action, root: &Path) -> Result<(), Error> {
        make_dir(root)?;
        let mut made: HashSet<PathBuf> = HashSet::new();
        for input in &action.inputs {
            let link = root.join(&input.path);
            if let Some(parent) = link.parent() {
                if !made.contains(parent) {
                    make_dir(parent)?;
                    made.insert(parent.to_owned());
                }
            }
            let target = self.plan.exec_root.join(&input.path);
            symlink(&target, &link).map_err(|err| Error::Move {
                op: "symlink",
                from: link.clone(),
                to_word: "->",
                to: target.clone(),
                source: err,
            })?;
        }
        for dir in &action.empty_dirs {
            make_dir(&root.join(dir))?;
        }
        for output in &action.outputs {
            if output.dir {
                make_dir(&root.join(&output.path))?;
            } else {
                run::make_parent(root, &output.path)?;
            }
        }
        // Bazel's test strategy makes TEST_TMPDIR before the test runs.
        if let Some(dir) = run::test_tmpdir(action) {
            make_dir(&root.join(dir))?;
        }
        Ok(())
    }

    fn run(&self, action: &Action, root: &Path) -> Result<(), Error> {
        let Some(jail) = self.jail else {
            return run::command(action, root, None);
        };
        let test_tmpdir = run::test_tmpdir(action)
            .filter(|dir| dir.starts_with('/'))
            .map(Path::new);
        let argv = jail.strategy(root, test_tmpdir, action.timeout_secs);
        run::jailed(action, root, &argv)
    }

    fn move_outputs(&self, action: &Action, root: &Path) -> Result<(), Error> {
        run::move_outputs(action, root, &self.results, |from, to| {
            Err(Error::moving(
                "moving",
                from,
                to,
                std::io::Error::from_raw_os_error(libc::EXDEV),
            ))
        })
    }
}

impl Session for Symlinks<'_> {
    fn replay(&self, _index: usize, action: &Action, clock: &StepClock) -> Result<(), Error> {
        let base = self.sandboxes.join(action.number.to_string());
        let root = base.join("execroot").join(&self.plan.workspace);
        let result = self.build_and_run(action, &root, clock);
        let removed = clock
            .time(Step::Teardown, || remove(&base))
            .map_err(|err| err.during("removing the sandbox"));
        result.and(removed)
    }
}
