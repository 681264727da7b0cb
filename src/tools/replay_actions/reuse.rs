//! Modes `reuse`, `reuse-shm` and `reuse-inmemory`: Bazel 7-9's own
//! sandbox with its defaults, the baseline `actionfs serve` competes with
//! (`symlinks` is Bazel 6's). Each behaviour follows Bazel's source, at
//! the commits `../shared/bazel-own-sandbox.md` read it at:
//! - the defaults (`SandboxOptions.java`, bazelbuild 03b4a208 for 7.x/8.x,
//!   fmeum/bazel 3aac1bfb for 9): `--reuse_sandbox_directories` on, the
//!   asynchronous tree deleter on, `--sandbox_base` empty, i.e.
//!   `<output_base>/sandbox`. Here the mode's directory plays the output
//!   base: the exec root is `<mode dir>/execroot/<ws>`, the base
//!   `<mode dir>/sandbox`, on the same file system. `reuse-shm` puts the
//!   base on `/dev/shm` instead (`--sandbox_base=/dev/shm`, what tuned
//!   users set: then `/dev/shm/bazel-sandbox.<id>`), so that outputs cross
//!   file systems when the exec root is on a disk;
//! - the sandbox is `<base>/<strategy>/<id>/execroot/<ws>` (strategy
//!   `linux-sandbox` with `--jail linux-sandbox`, else
//!   `processwrapper-sandbox`);
//! - stashes (`SandboxStash.java`, bazelbuild e9022f67): one directory of
//!   stashes per mnemonic, `<base>/sandbox_stash/<mnemonic>/<n>/execroot`;
//!   taking one is renaming its `execroot` into the new sandbox (another
//!   action took it first: the next one). Since 7.2 the stashes are tried
//!   in order of how many leading package segments the stash's target
//!   shares with the action's (`sortStashesByMatchingTargetSegments`,
//!   `Arrays.mismatch`, so an identical package counts -1 and sorts last,
//!   as in Bazel). The 4.2.3 log names no target: the package is taken
//!   from the first output's path below `bazel-out/<config>/bin/`. A
//!   `TestRunner` spawn with one output (the test.xml one) neither takes
//!   nor leaves a stash; a test's `_tmp` is deleted before it is stashed.
//!   Bazel's renaming of a test's runfiles directory in a taken stash is
//!   left out: the 4.2.3 logs replayed here have no such test spawns;
//! - a taken stash is cleaned by `cleanExisting` (`SandboxHelpers.java`,
//!   bazelbuild 00f47a91): its `execroot` is walked on disk (`readdir`
//!   without following links); an entry at an input path stays only if it
//!   is a symlink whose `readlink` is the wanted target, a directory stays
//!   (and is walked) only if the sandbox wants it, everything else is
//!   unlinked, directories through the tree deleter. `reuse-inmemory`
//!   (`--experimental_inmemory_sandbox_stashes`) compares with the stash's
//!   record instead ([`super::contents`]);
//! - then what is missing is made: the directories (parents first), and
//!   one symlink per input to the absolute path `<exec root>/<exec path>`
//!   (a runfiles member to its artifact's exec path), not resolved
//!   further; an empty runfiles marker (no artifact behind it) as an
//!   empty file. Param files are in the exec root already (staged like
//!   `unsandboxed`'s, before the timed run), as Bazel writes virtual
//!   inputs there first;
//! - after the action its outputs are renamed into the exec root (a copy,
//!   said once on stderr, only where the rename fails across file
//!   systems, as Bazel's `moveOutputs` does), the sandbox's `execroot` is
//!   renamed into a new stash, and the rest of the sandbox goes to the
//!   asynchronous tree deleter ([`super::deleter`]).
//!
//! Links point into this mode's own exec root, where earlier actions'
//! outputs land (and sources are reached through its top-level links), so
//! an action whose producer failed is not run. Each run starts with no
//! stash, as a fresh output base does; the session waits for the
//! background threads before it ends (untimed) and removes a base of its
//! own on `/dev/shm`.
//!
//! Jails: with `--jail linux-sandbox` each action runs as Bazel 9's
//! `LinuxSandboxedSpawnRunner` runs it ([`Jail::bazel9`]), with
//! `--jail landlock` in actionfs's jail as `symlinks` does.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::contents::{self, unlink, Contents, Entry};
use super::deleter::{Background, TreeDeleter};
use super::jail::Jail;
use super::plan::{Action, Plan, Source};
use super::run::{self, make_dir, remove, results_root};
use super::steps::{Step, StepClock};
use super::unsandboxed::stage_exec_root;
use super::{Error, Session};

/// Where the base is and how a stash is read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `<mode dir>/sandbox`, stashes walked on disk.
    Disk,
    /// A base of its own on `/dev/shm`, stashes walked on disk.
    Shm,
    /// `<mode dir>/sandbox`, stashes remembered in memory.
    InMemory,
}

/// `SandboxStash.TEST_RUNNER_MNEMONIC`.
const TEST_RUNNER: &str = "TestRunner";

/// What one action's sandbox must hold, paths relative to the sandbox's
/// `execroot` (so `<ws>/<exec path>`).
#[derive(Debug, Clone, Default)]
struct Wanted {
    /// Input path -> its link's target (`None`: an empty file).
    inputs: HashMap<String, Option<PathBuf>>,
    /// Every directory, each with all its parents.
    dirs: BTreeSet<String>,
}

impl Wanted {
    fn add_dir(&mut self, rel: &str) {
        let mut at = rel;
        while self.dirs.insert(at.to_owned()) {
            match at.rfind('/') {
                Some(slash) => at = &at[..slash],
                None => break,
            }
        }
    }

    fn add_parent(&mut self, rel: &str) {
        if let Some((parent, _)) = rel.rsplit_once('/') {
            self.add_dir(parent);
        }
    }

    /// The record `createContentMap` makes of the built sandbox.
    fn record(&self) -> Contents {
        let mut contents = Contents::default();
        for dir in &self.dirs {
            contents.dir_mut(dir);
        }
        for (path, target) in &self.inputs {
            let entry = match target {
                Some(target) => Entry::Link(target.clone()),
                None => Entry::File,
            };
            contents.put(path, entry);
        }
        contents
    }
}

/// What the run did, for its line and the tests.
#[derive(Debug, Default)]
struct Counts {
    fresh: AtomicUsize,
    from_stash: AtomicUsize,
    kept: AtomicUsize,
    made: AtomicUsize,
    removed: AtomicUsize,
    copied: AtomicUsize,
}

/// A stash's target package and, in memory, its record.
#[derive(Default)]
struct Stashes {
    packages: Mutex<HashMap<PathBuf, Option<Vec<String>>>>,
    records: Mutex<HashMap<PathBuf, Contents>>,
}

pub struct Reuse<'a> {
    plan: &'a Plan,
    variant: Variant,
    /// `<mode dir>/execroot/<ws>`: outputs land here, links point here.
    results: PathBuf,
    base: PathBuf,
    /// A base made on /dev/shm: removed at the end.
    own_base: Option<PathBuf>,
    strategy: &'static str,
    jail: Option<&'a Jail>,
    hermetic_tmp: bool,
    next_id: AtomicUsize,
    next_stash: Arc<AtomicUsize>,
    stashes: Arc<Stashes>,
    counts: Arc<Counts>,
    deleter: TreeDeleter,
    /// `stashFileListingPool`, in memory only.
    lister: Option<Background>,
    warned_copy: AtomicBool,
}

impl<'a> Reuse<'a> {
    pub fn start(
        plan: &'a Plan,
        mode_dir: &Path,
        variant: Variant,
        jail: Option<&'a Jail>,
    ) -> Result<Reuse<'a>, Error> {
        let results = results_root(mode_dir, &plan.workspace);
        stage_exec_root(plan, &results)?;
        let (base, own_base) = match variant {
            Variant::Disk | Variant::InMemory => (mode_dir.join("sandbox"), None),
            Variant::Shm => {
                let base = shm_base()?;
                (base.clone(), Some(base))
            }
        };
        make_dir(&base)?;
        let strategy = match jail {
            Some(Jail::LinuxSandbox { .. }) => "linux-sandbox",
            _ => "processwrapper-sandbox",
        };
        // The mount on /tmp would hide a sandbox or exec root below it.
        let under_tmp = [&base, &results, &plan.exec_root]
            .iter()
            .any(|path| path.starts_with("/tmp"));
        let hermetic_tmp = matches!(jail, Some(Jail::LinuxSandbox { .. })) && !under_tmp;
        let deleter = TreeDeleter::start(&base)?;
        let lister = match variant {
            Variant::InMemory => Some(Background::start("stash-lister")?),
            _ => None,
        };
        Ok(Reuse {
            plan,
            variant,
            results,
            base,
            own_base,
            strategy,
            jail,
            hermetic_tmp,
            next_id: AtomicUsize::new(1),
            next_stash: Arc::new(AtomicUsize::new(1)),
            stashes: Arc::default(),
            counts: Arc::default(),
            deleter,
            lister,
            warned_copy: AtomicBool::new(false),
        })
    }

    /// What the sandbox of `action` must hold.
    fn wanted(&self, action: &Action) -> Wanted {
        let ws = &self.plan.workspace;
        let mut wanted = Wanted::default();
        wanted.add_dir(ws);
        for input in &action.inputs {
            let rel = format!("{ws}/{}", input.path);
            let target = match &input.source {
                Source::Runfiles(exec_path) => Some(self.results.join(exec_path)),
                Source::Virtual
                    if input.path.contains(".runfiles/") && input.digest.size_bytes == 0 =>
                {
                    None
                }
                Source::Natural | Source::Virtual => Some(self.results.join(&input.path)),
            };
            wanted.add_parent(&rel);
            wanted.inputs.insert(rel, target);
        }
        for dir in &action.empty_dirs {
            wanted.add_dir(&format!("{ws}/{dir}"));
        }
        for output in &action.outputs {
            let rel = format!("{ws}/{}", output.path);
            if output.dir {
                wanted.add_dir(&rel);
            } else {
                wanted.add_parent(&rel);
            }
        }
        if let Some(dir) = run::test_tmpdir(action).filter(|d| !d.starts_with('/')) {
            wanted.add_dir(&format!("{ws}/{dir}"));
        }
        wanted
    }

    fn stash_dir(&self, mnemonic: &str) -> Result<PathBuf, Error> {
        let dir = self
            .base
            .join("sandbox_stash")
            .join(mnemonic.replace('/', "_"));
        make_dir(&dir)?;
        Ok(dir)
    }

    /// `takeStashedSandbox`: a stash of the mnemonic renamed to
    /// `<sandbox>/execroot`; with its record in memory.
    fn take(&self, action: &Action, sandbox: &Path) -> Result<Option<Option<Contents>>, Error> {
        if test_xml_spawn(action) {
            return Ok(None);
        }
        let dir = self.stash_dir(&action.mnemonic)?;
        let listed = fs::read_dir(&dir)
            .and_then(|entries| {
                entries
                    .map(|e| e.map(|e| e.path()))
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|err| Error::io("readdir", &dir, err))?;
        if listed.is_empty() {
            return Ok(None);
        }
        let ordered = {
            let packages = self
                .stashes
                .packages
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            order_by_package(package(action).as_deref(), listed, &packages)
        };
        let execroot = sandbox.join("execroot");
        for stash in ordered {
            match fs::rename(stash.join("execroot"), &execroot) {
                Ok(()) => {}
                // Another action took it.
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => {
                    return Err(Error::moving(
                        "rename",
                        stash.join("execroot"),
                        &execroot,
                        err,
                    ))
                }
            }
            remove(&stash)?;
            self.stashes
                .packages
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&stash);
            let record = self
                .stashes
                .records
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&stash);
            return Ok(Some(record));
        }
        Ok(None)
    }

    /// `cleanExisting` on disk: `dir` (`rel` below the sandbox's
    /// `execroot`) against what is wanted, which loses what is there.
    fn clean_on_disk(&self, dir: &Path, rel: &str, wanted: &mut Wanted) -> Result<(), Error> {
        let listed = fs::read_dir(dir).map_err(|err| Error::io("readdir", dir, err))?;
        for dirent in listed {
            let dirent = dirent.map_err(|err| Error::io("readdir", dir, err))?;
            let path = dirent.path();
            let child = child_rel(rel, &dirent.file_name().to_string_lossy());
            let kind = dirent
                .file_type()
                .map_err(|err| Error::io("lstat", &path, err))?;
            match wanted.inputs.get(&child) {
                Some(Some(target)) => {
                    let same = kind.is_symlink()
                        && fs::read_link(&path).map_err(|err| Error::io("readlink", &path, err))?
                            == *target;
                    if same {
                        wanted.inputs.remove(&child);
                        self.counts.kept.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.discard(&path, kind.is_dir())?;
                    }
                }
                _ if kind.is_dir() => {
                    if wanted.dirs.remove(&child) {
                        self.clean_on_disk(&path, &child, wanted)?;
                    } else {
                        self.discard(&path, true)?;
                    }
                }
                // An empty file wanted there: made again below.
                Some(None) => {}
                None => self.discard(&path, false)?,
            }
        }
        Ok(())
    }

    /// `cleanExisting` against a stash's record: no readdir, no readlink.
    fn clean_recorded(
        &self,
        dir: &Path,
        rel: &str,
        record: Contents,
        wanted: &mut Wanted,
    ) -> Result<(), Error> {
        for (name, entry) in record.entries {
            let path = dir.join(&name);
            let child = child_rel(rel, &name.to_string_lossy());
            match entry {
                Entry::Link(had) => {
                    if wanted.inputs.get(&child) == Some(&Some(had)) {
                        wanted.inputs.remove(&child);
                        self.counts.kept.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.discard(&path, false)?;
                    }
                }
                Entry::File if wanted.inputs.get(&child) == Some(&None) => {}
                Entry::File => self.discard(&path, false)?,
                Entry::Dir(sub) => {
                    if wanted.dirs.remove(&child) {
                        self.clean_recorded(&path, &child, sub, wanted)?;
                    } else {
                        self.discard(&path, true)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn discard(&self, path: &Path, dir: bool) -> Result<(), Error> {
        self.counts.removed.fetch_add(1, Ordering::Relaxed);
        if dir {
            self.deleter.delete_tree(path)
        } else {
            unlink(path)
        }
    }

    /// The sandbox, from a stash or fresh; in memory, its record and time.
    fn build(&self, action: &Action, sandbox: &Path) -> Result<Option<(Contents, i64)>, Error> {
        make_dir(sandbox)?;
        let all = self.wanted(action);
        let mut wanted = all.clone();
        let execroot = sandbox.join("execroot");
        match self.take(action, sandbox)? {
            None => {
                self.counts.fresh.fetch_add(1, Ordering::Relaxed);
                make_dir(&execroot)?;
            }
            Some(record) => {
                self.counts.from_stash.fetch_add(1, Ordering::Relaxed);
                match record {
                    Some(record) => self.clean_recorded(&execroot, "", record, &mut wanted)?,
                    None => self.clean_on_disk(&execroot, "", &mut wanted)?,
                }
            }
        }
        // Sorted, so each directory's parent is made before it.
        for dir in &wanted.dirs {
            let path = execroot.join(dir);
            match fs::create_dir(&path) {
                Err(err) if err.kind() != io::ErrorKind::AlreadyExists => {
                    return Err(Error::io("mkdir", &path, err))
                }
                _ => {}
            }
        }
        for (rel, target) in &wanted.inputs {
            let path = execroot.join(rel);
            match target {
                Some(target) => {
                    symlink(target, &path).map_err(|err| Error::Move {
                        op: "symlink",
                        from: path.clone(),
                        to_word: "->",
                        to: target.clone(),
                        source: err,
                    })?;
                    self.counts.made.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    fs::File::create(&path).map_err(|err| Error::io("creating", &path, err))?;
                }
            }
        }
        if self.hermetic_tmp {
            make_dir(&sandbox.join("_hermetic_tmp"))?;
        }
        Ok((self.variant == Variant::InMemory).then(|| (all.record(), contents::now_millis())))
    }

    fn run(&self, action: &Action, sandbox: &Path, root: &Path) -> Result<(), Error> {
        let Some(jail) = self.jail else {
            return run::command(action, root, None);
        };
        let test_tmpdir = run::test_tmpdir(action)
            .filter(|dir| dir.starts_with('/'))
            .map(Path::new);
        let argv = jail.bazel9(
            sandbox,
            root,
            test_tmpdir,
            action.timeout_secs,
            self.hermetic_tmp,
        );
        run::jailed(action, root, &argv)
    }

    /// `moveOutputs`: renamed, copied only across file systems.
    fn move_outputs(&self, action: &Action, root: &Path) -> Result<(), Error> {
        run::move_outputs(action, root, &self.results, |from, to| {
            if !self.warned_copy.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "replay-actions: outputs are copied, not renamed: {} and {} are on different file systems",
                    from.display(),
                    to.display()
                );
            }
            copy_tree(from, to)?;
            remove(from)?;
            self.counts.copied.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    }

    /// `stashSandbox`, then the rest of the sandbox to the tree deleter.
    fn stash(
        &self,
        action: &Action,
        sandbox: &Path,
        record: Option<(Contents, i64)>,
    ) -> Result<(), Error> {
        let execroot = sandbox.join("execroot");
        if !test_xml_spawn(action) && execroot.exists() {
            if action.mnemonic == TEST_RUNNER {
                if let Some(tmp) = test_tmp(action) {
                    self.deleter.delete_tree(&execroot.join(tmp))?;
                }
            }
            let n = self.next_stash.fetch_add(1, Ordering::Relaxed).to_string();
            let stash = self.stash_dir(&action.mnemonic)?.join(&n);
            let package = package(action);
            match (&self.lister, record) {
                (Some(lister), Some((mut record, since))) => {
                    // Moved aside now, listed and stashed in the background.
                    let temporary = self.base.join("tmp_sandbox_stash");
                    make_dir(&temporary)?;
                    let moved = temporary.join(&n);
                    rename(&execroot, &moved)?;
                    let stashes = Arc::clone(&self.stashes);
                    lister.submit(Box::new(move || {
                        if !contents::refresh(&moved, since, &mut record)? {
                            return Err(Error::GoneBeforeStash(moved));
                        }
                        make_dir(&stash)?;
                        // Recorded before the stash can be taken.
                        stashes
                            .records
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(stash.clone(), record);
                        stashes
                            .packages
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(stash.clone(), package);
                        rename(&moved, &stash.join("execroot"))
                    }))?;
                }
                _ => {
                    make_dir(&stash)?;
                    rename(&execroot, &stash.join("execroot"))?;
                    self.stashes
                        .packages
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(stash, package);
                }
            }
        }
        self.deleter.delete_tree(sandbox)
    }
}

impl Session for Reuse<'_> {
    fn replay(&self, _index: usize, action: &Action, clock: &StepClock) -> Result<(), Error> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let sandbox = self.base.join(self.strategy).join(id.to_string());
        let root = sandbox.join("execroot").join(&self.plan.workspace);
        let (record, result) = match clock.time(Step::Setup, || self.build(action, &sandbox)) {
            Ok(record) => {
                let result = clock
                    .time(Step::Run, || self.run(action, &sandbox, &root))
                    .and_then(|()| clock.time(Step::Collect, || self.move_outputs(action, &root)));
                (record, result)
            }
            Err(why) => (None, Err(why)),
        };
        // Stashed whatever happened, as Bazel's `delete()` in a `finally`
        // does; without a record, the next taker walks it on disk.
        let stashed = clock
            .time(Step::Teardown, || self.stash(action, &sandbox, record))
            .map_err(|why| why.during("stashing the sandbox"));
        result.and(stashed)
    }

    /// Waits for the background threads (untimed), and says what the
    /// stashes did and where everything is.
    fn finish(self: Box<Self>) -> Result<Option<String>, Error> {
        let listed = self.lister.as_ref().map_or(Ok(()), Background::finish);
        let deleted = self.deleter.finish();
        let trash_empty = fs::read_dir(self.deleter.trash()).map(|mut d| d.next().is_none());
        let c = &self.counts;
        let get = |n: &AtomicUsize| n.load(Ordering::Relaxed);
        let mut note = format!(
            "sandboxes: {} from a stash, {} fresh; links: {} kept, {} made; {} entries removed; outputs copied: {}; trees deleted in the background: {}; exec root {} ({}), sandbox base {} ({}){}",
            get(&c.from_stash),
            get(&c.fresh),
            get(&c.kept),
            get(&c.made),
            get(&c.removed),
            get(&c.copied),
            deleted.as_ref().map_or(0, |n| *n),
            self.results.display(),
            crate::tools::doctor::fs_type(&self.results),
            self.base.display(),
            crate::tools::doctor::fs_type(&self.base),
            match (self.jail, self.hermetic_tmp) {
                (Some(Jail::LinuxSandbox { .. }), false) =>
                    "; no hermetic /tmp: the sandbox or an exec root is below /tmp",
                _ => "",
            }
        );
        if let Some(base) = &self.own_base {
            remove(base)?;
            note.push_str(", removed");
        }
        listed?;
        deleted?;
        match trash_empty {
            Ok(true) => Ok(Some(note)),
            Ok(false) => Err(Error::TrashNotEmpty(self.deleter.trash().to_owned())),
            Err(err) => Err(Error::io("readdir", self.deleter.trash(), err)),
        }
    }
}

impl Drop for Reuse<'_> {
    /// A base of its own on /dev/shm is never left behind.
    fn drop(&mut self) {
        if let Some(lister) = &self.lister {
            let _ = lister.finish();
        }
        let _ = self.deleter.finish();
        if let Some(base) = &self.own_base {
            let _ = remove(base);
        }
    }
}

/// `--sandbox_base=/dev/shm`: `/dev/shm/bazel-sandbox.<id>`, new.
fn shm_base() -> Result<PathBuf, Error> {
    let shm = Path::new("/dev/shm");
    let mut n = 0u32;
    loop {
        let path = shm.join(format!(
            "bazel-sandbox.actionfs-replay.{}.{n}",
            std::process::id()
        ));
        match fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => n += 1,
            Err(err) => return Err(Error::ShmBase { path, source: err }),
        }
    }
}

fn child_rel(rel: &str, name: &str) -> String {
    if rel.is_empty() {
        name.to_owned()
    } else {
        format!("{rel}/{name}")
    }
}

fn rename(from: &Path, to: &Path) -> Result<(), Error> {
    fs::rename(from, to).map_err(|err| Error::moving("rename", from, to, err))
}

/// `isTestXmlGenerationOrCoverageSpawn`: a test spawn with one output.
fn test_xml_spawn(action: &Action) -> bool {
    action.mnemonic == TEST_RUNNER && action.outputs.len() == 1
}

/// A test's `<TEST_WORKSPACE>/_tmp`, which Bazel deletes before stashing.
fn test_tmp(action: &Action) -> Option<String> {
    let get = |name: &str| {
        action
            .env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    get("TEST_TMPDIR")
        .filter(|dir| dir.starts_with("_tmp"))
        .and(get("TEST_WORKSPACE"))
        .map(|ws| format!("{ws}/_tmp"))
}

/// The action's package, from its first output below
/// `bazel-out/<config>/<bin|genfiles|testlogs>/` (the log names no target).
fn package(action: &Action) -> Option<Vec<String>> {
    let path = &action.outputs.first()?.path;
    let parts: Vec<&str> = path.split('/').collect();
    if parts.len() < 4 || parts[0] != "bazel-out" {
        return None;
    }
    let below = &parts[3..parts.len() - 1];
    Some(below.iter().map(|s| (*s).to_owned()).collect())
}

/// `sortStashesByMatchingTargetSegments`: most shared leading package
/// segments first, stably.
fn order_by_package(
    target: Option<&[String]>,
    stashes: Vec<PathBuf>,
    packages: &HashMap<PathBuf, Option<Vec<String>>>,
) -> Vec<PathBuf> {
    let score = |stash: &PathBuf| -> i64 {
        let theirs = packages.get(stash).and_then(Option::as_ref);
        match (target, theirs) {
            (None, None) => 1,
            (None, Some(_)) | (Some(_), None) => 0,
            (Some(ours), Some(theirs)) => mismatch(ours, theirs),
        }
    };
    let mut scored: Vec<(i64, PathBuf)> = stashes.into_iter().map(|s| (score(&s), s)).collect();
    scored.sort_by_key(|s| std::cmp::Reverse(s.0));
    scored.into_iter().map(|(_, s)| s).collect()
}

/// Java's `Arrays.mismatch`: the first index that differs, -1 if none.
fn mismatch(a: &[String], b: &[String]) -> i64 {
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    if common == a.len() && common == b.len() {
        -1
    } else {
        common as i64
    }
}

/// Copies a file, a symlink (as itself) or a tree to `to`.
fn copy_tree(from: &Path, to: &Path) -> Result<(), Error> {
    let meta = fs::symlink_metadata(from).map_err(|err| Error::io("lstat", from, err))?;
    let kind = meta.file_type();
    let copied = if kind.is_symlink() {
        fs::read_link(from).and_then(|target| symlink(target, to))
    } else if kind.is_dir() {
        make_dir(to)?;
        let listed = fs::read_dir(from).map_err(|err| Error::io("readdir", from, err))?;
        for entry in listed {
            let entry = entry.map_err(|err| Error::io("readdir", from, err))?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        Ok(())
    } else {
        fs::copy(from, to).map(drop)
    };
    copied.map_err(|err| Error::moving("copying", from, to, err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stashes_are_ordered_as_bazel_orders_them() {
        let p = |s: &str| Some(s.split('/').map(str::to_owned).collect::<Vec<_>>());
        let packages: HashMap<PathBuf, Option<Vec<String>>> = [
            ("/s/1", p("a/b/c")),
            ("/s/2", p("a/x")),
            ("/s/3", p("a/b")),
            ("/s/4", None),
        ]
        .into_iter()
        .map(|(k, v)| (PathBuf::from(k), v))
        .collect();
        let all: Vec<PathBuf> = ["/s/1", "/s/2", "/s/3", "/s/4"].map(PathBuf::from).into();
        let target = p("a/b/d").unwrap();
        let order = order_by_package(Some(&target), all.clone(), &packages);
        // a/b/c and a/b share 2, a/x 1, none 0.
        assert_eq!(order, ["/s/1", "/s/3", "/s/2", "/s/4"].map(PathBuf::from));
        // The same package counts -1 (Arrays.mismatch): last, as in Bazel.
        let same = p("a/b").unwrap();
        let order = order_by_package(Some(&same), all.clone(), &packages);
        assert_eq!(order.last(), Some(&PathBuf::from("/s/3")));
        // No target: stashes without one first.
        let order = order_by_package(None, all, &packages);
        assert_eq!(order[0], PathBuf::from("/s/4"));
    }

    #[test]
    fn wanted_has_every_parent() {
        let mut wanted = Wanted::default();
        wanted.add_parent("ws/a/b/c/file");
        wanted.add_dir("ws/a/x");
        let dirs: Vec<&str> = wanted.dirs.iter().map(String::as_str).collect();
        assert_eq!(dirs, ["ws", "ws/a", "ws/a/b", "ws/a/b/c", "ws/a/x"]);
    }
}
