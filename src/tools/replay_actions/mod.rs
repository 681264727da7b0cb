//! `actionfs replay-actions --execlog FILE --exec-root DIR`: replays the
//! actions of a real Bazel build, read from its JSON execution log, in
//! several sandbox modes, checks every output against the log's digest,
//! and times each mode: the conformance test of `actionfs serve` on real
//! actions, and its benchmark.
//!
//! The log (Bazel 4.2.3's `--execution_log_json_file`, see [`execlog`])
//! gives each action's argv, environment, inputs and outputs with their
//! SHA-256 digests. DIR is the exec root of the build that wrote it
//! (`<output_base>/execroot/<ws>`, `bazel info execution_root`): after a
//! local build it holds every input, generated ones included. Actions
//! served from a cache, failed ones and those without outputs are skipped
//! ([`plan`]). Each mode puts outputs in its own fresh exec root,
//! `<out>/<mode>/execroot/<ws>`, never in DIR:
//! - `serve` ([`serve`]): through a sandbox backend, as Bazel 7+'s
//!   `SandboxBackendSpawnRunner` does (Push, Create, run, Collect,
//!   Destroy);
//! - `unsandboxed` ([`unsandboxed`]): Bazel's local strategy, in a fresh
//!   exec root that links to DIR's sources and makes generated files anew;
//! - `symlinks` ([`symlinks`]): Bazel 6's classic sandbox, a symlink per
//!   input in a fresh directory per action, deleted in the action's path;
//! - `reuse`, `reuse-shm`, `reuse-inmemory` ([`reuse`]): Bazel 7-9's own
//!   sandbox with its defaults: sandbox directories reused from a stash
//!   per mnemonic, outputs renamed into the exec root, the rest deleted in
//!   the background; the base beside the exec root (`reuse`, Bazel's
//!   `<output_base>/sandbox`), on `/dev/shm` (`reuse-shm`), or beside it
//!   with the stashes remembered in memory (`reuse-inmemory`,
//!   `--experimental_inmemory_sandbox_stashes`).
//!
//! Each action's inputs are those Bazel 7's runner would give it, with
//! their sources classified as it does ([`plan`]). With `--jail`, serve,
//! symlinks and the reuse modes run each action in Bazel's `linux-sandbox`
//! ([`jail`]): serve as `SandboxBackendSpawn` does when Create leaves
//! `confinement` unset, symlinks as Bazel's `linux-sandbox` strategy, the
//! reuse modes as Bazel 9's; unsandboxed stays bare. Without it nothing is jailed, to measure the backend alone.
//!
//! Actions run at most `--jobs` at once, each once the earlier actions
//! making its inputs are done, first in the log's order first ([`pool`]).
//! `--runs K` repeats every mode K times, alternating modes (A1 B1 A2 B2),
//! so that machine noise hits all alike. The wall time of a run covers the
//! actions only: not starting a backend or staging an exec root, not
//! stopping the backend, not comparing outputs. The outputs of the actions
//! that succeeded are compared after each run ([`report`]). Each action's
//! steps are timed too ([`steps`]), to say where a mode's time goes.
//!
//! Exit status 0 only if, in every mode and run, every action succeeded,
//! every output matched, and every backend exited 0.

mod contents;
mod deleter;
mod error;
mod execlog;
mod jail;
mod plan;
mod pool;
mod report;
mod reuse;
mod run;
mod serve;
mod steps;
mod symlinks;
mod unsandboxed;

use std::path::{Path, PathBuf};
use std::time::Instant;

pub use error::{Error, RequestError};
pub use execlog::{ExecLogError, SpawnFault};
pub use jail::Jail;
pub use serve::ContentMode;

use plan::Action;
use report::{Report, RunTime};
use run::{make_dir, remove, results_root};
use steps::StepClock;

use crate::tools::progress::Progress;

/// A way to run actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Serve,
    Unsandboxed,
    Symlinks,
    Reuse,
    ReuseShm,
    ReuseInMemory,
}

impl Mode {
    pub fn parse(text: &str) -> Option<Mode> {
        match text {
            "serve" => Some(Mode::Serve),
            "unsandboxed" => Some(Mode::Unsandboxed),
            "symlinks" => Some(Mode::Symlinks),
            "reuse" => Some(Mode::Reuse),
            "reuse-shm" => Some(Mode::ReuseShm),
            "reuse-inmemory" => Some(Mode::ReuseInMemory),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Serve => "serve",
            Mode::Unsandboxed => "unsandboxed",
            Mode::Symlinks => "symlinks",
            Mode::Reuse => "reuse",
            Mode::ReuseShm => "reuse-shm",
            Mode::ReuseInMemory => "reuse-inmemory",
        }
    }

    /// Its sandbox's links point into its own exec root, where earlier
    /// actions' outputs are: a failed producer blocks its dependents.
    fn reads_own_outputs(self) -> bool {
        matches!(
            self,
            Mode::Unsandboxed | Mode::Reuse | Mode::ReuseShm | Mode::ReuseInMemory
        )
    }
}

/// What each run's backend starts with, in mode serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendState {
    /// Nothing, and it leaves nothing (`--keep_state=off`).
    Cold,
    /// What the previous run's backend handed on (`--keep_state=on`).
    Adopted,
    /// Everything a backend keeps while it lives: the same backend serves
    /// an untimed pass of the log first.
    Warm,
}

impl BackendState {
    pub fn parse(text: &str) -> Option<BackendState> {
        match text {
            "cold" => Some(BackendState::Cold),
            "adopted" => Some(BackendState::Adopted),
            "warm" => Some(BackendState::Warm),
            _ => None,
        }
    }

    /// Negotiate's options with this state's `--keep_state`, unless the
    /// user chose one.
    fn options(self, options: &[String]) -> Vec<String> {
        let mut all = options.to_vec();
        if !options.iter().any(|o| o.starts_with("--keep_state")) {
            let keep = if self == BackendState::Adopted {
                "on"
            } else {
                "off"
            };
            all.push(format!("--keep_state={keep}"));
        }
        all
    }
}

#[derive(Debug, Clone)]
pub struct ReplayActionsArgs {
    pub execlog: PathBuf,
    pub exec_root: PathBuf,
    pub jobs: usize,
    /// In the order given, each once.
    pub modes: Vec<Mode>,
    pub runs: usize,
    /// Negotiate's options, in order.
    pub backend_opts: Vec<String>,
    /// `None`: this executable.
    pub backend: Option<PathBuf>,
    pub content: ContentMode,
    pub backend_state: BackendState,
    /// Bazel's jail around serve's, symlinks' and the reuse modes' actions.
    pub jail: Option<Jail>,
    /// Where the modes' exec roots go; `None`: a fresh temporary directory.
    pub out: Option<PathBuf>,
    pub keep: bool,
}

/// One run of one mode: replays actions, from any thread.
trait Session: Sync {
    /// Replays `action` (`index` in the plan), timing its steps on
    /// `clock`; Ok if it succeeded and its outputs are in the mode's exec
    /// root.
    fn replay(&self, index: usize, action: &Action, clock: &StepClock) -> Result<(), Error>;

    /// Ends the run; a note for the run's line, if any.
    fn finish(self: Box<Self>) -> Result<Option<String>, Error> {
        Ok(None)
    }
}

pub fn run(args: &ReplayActionsArgs) -> Result<(), Error> {
    let exec_root = std::fs::canonicalize(&args.exec_root).map_err(|source| Error::Flag {
        flag: "--exec-root",
        path: args.exec_root.clone(),
        source,
    })?;
    let text = std::fs::read_to_string(&args.execlog).map_err(|source| Error::Flag {
        flag: "--execlog",
        path: args.execlog.clone(),
        source,
    })?;
    let spawns = execlog::parse(&text).map_err(|source| Error::ExecLog {
        path: args.execlog.clone(),
        source,
    })?;
    let total = spawns.len();
    let plan = plan::plan(spawns, &exec_root)?;
    let skipped: Vec<String> = plan
        .skipped
        .iter()
        .map(|(why, n)| format!("{n} {}", why.describe()))
        .collect();
    println!(
        "replay-actions: {total} spawns in {}: {} to replay, {} skipped{}",
        args.execlog.display(),
        plan.actions.len(),
        total - plan.actions.len(),
        if skipped.is_empty() {
            String::new()
        } else {
            format!(" ({})", skipped.join(", "))
        }
    );
    println!(
        "jail: {}",
        match &args.jail {
            Some(jail) => format!(
                "{} (serve: {}; symlinks: around Bazel's linux-sandbox strategy's forest; reuse: as Bazel 9's linux-sandbox strategy; unsandboxed: none)",
                jail.describe(),
                // A --jail among the backend options decides serve's.
                match args.backend_opts.iter().rev().find(|o| o.starts_with("--jail")) {
                    Some(option) if option != "--jail=bazel" => "as Create answers",
                    Some(_) => "when Create leaves confinement unset",
                    None => match jail {
                        Jail::Landlock { .. } => "the wrapper Create answers with",
                        Jail::LinuxSandbox { .. } => "when Create leaves confinement unset",
                    },
                }
            ),
            None => "none".to_owned(),
        }
    );
    if plan.actions.is_empty() {
        return Err(Error::NoAction);
    }
    let trees = if args.modes.contains(&Mode::Serve) {
        serve::trees(&plan)?
    } else {
        Vec::new()
    };
    let backend = match &args.backend {
        Some(bin) => bin.clone(),
        None => std::env::current_exe().map_err(Error::CurrentExe)?,
    };
    let out = Out::make(args.out.as_deref(), args.keep)?;
    let deps: Vec<Vec<usize>> = plan.actions.iter().map(|a| a.deps.clone()).collect();
    let mut report = Report::new(&args.modes);
    let backend_opts = args.backend_state.options(&args.backend_opts);
    for run in 1..=args.runs {
        for &mode in &args.modes {
            let mode_dir = out.path.join(mode.name());
            remove(&mode_dir)?;
            make_dir(&mode_dir)?;
            let started = match mode {
                Mode::Serve => serve::Serve::start(
                    &plan,
                    &trees,
                    &mode_dir,
                    &backend,
                    &backend_opts,
                    args.content,
                    args.jail.as_ref(),
                )
                .map(|s| Box::new(s) as Box<dyn Session>),
                Mode::Unsandboxed => unsandboxed::Unsandboxed::start(&plan, &mode_dir)
                    .map(|(s, _staged)| Box::new(s) as Box<dyn Session>),
                Mode::Symlinks => symlinks::Symlinks::start(&plan, &mode_dir, args.jail.as_ref())
                    .map(|s| Box::new(s) as Box<dyn Session>),
                Mode::Reuse | Mode::ReuseShm | Mode::ReuseInMemory => {
                    let variant = match mode {
                        Mode::ReuseShm => reuse::Variant::Shm,
                        Mode::ReuseInMemory => reuse::Variant::InMemory,
                        _ => reuse::Variant::Disk,
                    };
                    reuse::Reuse::start(&plan, &mode_dir, variant, args.jail.as_ref())
                        .map(|s| Box::new(s) as Box<dyn Session>)
                }
            };
            let session = match started {
                Ok(session) => session,
                Err(why) => {
                    println!("{} run {run}: could not start: {why}", mode.name());
                    report.run_failed(mode, run, &why.to_string());
                    continue;
                }
            };
            if mode == Mode::Serve && args.backend_state == BackendState::Warm {
                let mut progress = Progress::new(
                    format!("serve run {run}/{}, warming", args.runs),
                    plan.actions.len(),
                );
                let untimed = StepClock::default();
                let warming = pool::run(&deps, args.jobs, false, &mut progress, &|i| {
                    session.replay(i, &plan.actions[i], &untimed)
                });
                let failed = warming.iter().find_map(|outcome| match outcome {
                    pool::Outcome::Ok => None,
                    pool::Outcome::Failed(why) => Some(why.to_string()),
                    pool::Outcome::Blocked(at) => Some(format!("blocked by action {at}")),
                });
                if let Some(why) = failed {
                    println!("serve run {run}: the warming pass failed: {why}");
                    report.run_failed(mode, run, &why);
                    drop(session.finish());
                    continue;
                }
                // The timed pass collects into an empty exec root again.
                let results = results_root(&mode_dir, &plan.workspace);
                remove(&mode_dir.join("execroot"))?;
                make_dir(&results)?;
            }
            let mut progress = Progress::new(
                format!("{} run {run}/{}", mode.name(), args.runs),
                plan.actions.len(),
            );
            let steps = StepClock::default();
            let clock = Instant::now();
            let outcomes = pool::run(
                &deps,
                args.jobs,
                mode.reads_own_outputs(),
                &mut progress,
                &|i| session.replay(i, &plan.actions[i], &steps),
            );
            let elapsed = clock.elapsed();
            drop(progress);
            let finished = session.finish();
            let mut line = report.record(
                mode,
                run,
                &plan,
                RunTime {
                    wall: elapsed,
                    steps: steps.totals(),
                },
                &outcomes,
                &results_root(&mode_dir, &plan.workspace),
            );
            match finished {
                Ok(Some(note)) => line.push_str(&format!(", {note}")),
                Ok(None) => {}
                Err(why) => {
                    line.push_str(&format!(", {why}"));
                    report.run_failed(mode, run, &why.to_string());
                }
            }
            println!("{line}");
        }
    }
    print!("{}", report.render(&plan));
    out.finish()?;
    if report.ok() {
        Ok(())
    } else {
        let (mismatches, failures) = report.problems();
        Err(Error::Failed {
            mismatches,
            failures,
        })
    }
}

/// The output directory: made here (or given, then empty or missing), and
/// removed at the end unless kept.
struct Out {
    path: PathBuf,
    keep: bool,
}

impl Out {
    fn make(given: Option<&Path>, keep: bool) -> Result<Out, Error> {
        let path = match given {
            Some(path) => {
                make_dir(path)?;
                let empty = std::fs::read_dir(path)
                    .map_err(|source| Error::Flag {
                        flag: "--out",
                        path: path.to_owned(),
                        source,
                    })?
                    .next()
                    .is_none();
                if !empty {
                    return Err(Error::OutNotEmpty(path.to_owned()));
                }
                path.to_owned()
            }
            None => {
                let base = std::env::temp_dir();
                let mut n = 0u32;
                loop {
                    let path = base.join(format!("actionfs-replay.{}.{n}", std::process::id()));
                    match std::fs::create_dir(&path) {
                        Ok(()) => break path,
                        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
                        Err(err) => return Err(Error::io("mkdir", &path, err)),
                    }
                }
            }
        };
        let path = std::fs::canonicalize(&path).map_err(|err| Error::io("realpath", &path, err))?;
        println!(
            "out: {} ({}): each mode's exec root below it",
            path.display(),
            crate::tools::doctor::fs_type(&path)
        );
        Ok(Out { path, keep })
    }

    fn finish(mut self) -> Result<(), Error> {
        let path = std::mem::take(&mut self.path);
        if self.keep {
            println!("kept: {}", path.display());
            Ok(())
        } else {
            remove(&path)
        }
    }
}

impl Drop for Out {
    /// On an early return: nothing is left behind unless asked.
    fn drop(&mut self) {
        if !self.keep && !self.path.as_os_str().is_empty() {
            let _ = remove(&self.path);
        }
    }
}
