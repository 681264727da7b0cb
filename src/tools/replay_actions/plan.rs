//! From logged spawns to replayable actions: each input typed and checked
//! once against the exec root (its executable bit, a directory expanded
//! into the files below it, hashed), outputs sorted into files and tree
//! artifacts with the digests to expect, and which earlier action made
//! each generated input.
//!
//! Each input is also classified as Bazel 7's sandbox backend runner sees
//! it ([`Source`]), from what the 4.2.3 log and the exec root show:
//! - a virtual input (`VirtualActionInput`): a `.params` file no logged
//!   action makes (Bazel writes spawn-level param files itself), or an
//!   empty runfiles marker (a regular file inside a `*.runfiles` tree,
//!   where every member is otherwise a symlink);
//! - a runfiles-tree member: the 4.2.3 log names each member by its own
//!   exec path (or, in some logs, by its runfiles path), never both; the
//!   tree itself is on disk beside the tool (`<tool>.runfiles/`), each
//!   member a symlink whose readlink chain leads back into the exec root,
//!   which names its exec path. A tool's runfiles tree is added to an
//!   action when every member's exec path is among its logged inputs;
//! - everything else is at its natural exec path.
//!
//! Empty directories are inputs too ([`Action::empty_dirs`]): the 4.2.3
//! log omits an empty tree artifact altogether, so one a logged action
//! made is given to each later action whose command line names its path.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use actionfs_protocol::backend::digest::{is_sha256_hex, sha256_hex};
use actionfs_protocol::backend::reapi;

use super::execlog::{LoggedDigest, Skip, Spawn};
use super::Error;

/// What is replayed, and what was not.
#[derive(Debug)]
pub struct Plan {
    /// The exec root the log's build ran in (`<output_base>/execroot/<ws>`).
    pub exec_root: PathBuf,
    /// Its basename: the workspace name.
    pub workspace: String,
    /// The replayed actions, in the log's order.
    pub actions: Vec<Action>,
    /// Spawns not replayed, by reason.
    pub skipped: BTreeMap<Skip, usize>,
}

#[derive(Debug)]
pub struct Action {
    /// Position in the log, from 1.
    pub number: usize,
    pub mnemonic: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Every input file, sorted by path, directories expanded.
    pub inputs: Vec<Input>,
    /// Empty directories among the inputs (an empty tree artifact), by
    /// exec path: in the tree, an empty directory.
    pub empty_dirs: Vec<String>,
    /// The logged timeout in seconds (tests), 0 for none.
    pub timeout_secs: u64,
    pub outputs: Vec<Output>,
    /// The output files to compare, with the logged digests.
    pub expected: Vec<Expected>,
    /// Indices (into [`Plan::actions`]) of the earlier actions that made
    /// one of its inputs.
    pub deps: Vec<usize>,
}

#[derive(Debug, Clone)]
pub struct Input {
    /// Where it is in the action's tree, below the workspace: its exec
    /// path, or for a runfiles member its runfiles-layout path
    /// (`<tool>.runfiles/<ws>/...`), which the original exec root also
    /// holds (a symlink to the member).
    pub path: String,
    pub digest: reapi::Digest,
    pub executable: bool,
    pub source: Source,
}

/// Where Bazel 7's runner says an input's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// At its own exec path: the default place, no content entry.
    Natural,
    /// A `VirtualActionInput` (param file, empty runfiles marker): no file
    /// of Bazel's holds it; its bytes go inline, single use.
    Virtual,
    /// A runfiles member whose bytes are the artifact at this exec path.
    Runfiles(String),
}

/// A declared output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub path: String,
    /// A tree artifact: a directory the action fills.
    pub dir: bool,
}

/// An output file and the digest the log gives it.
#[derive(Debug, Clone)]
pub struct Expected {
    pub path: String,
    pub hash: String,
    pub size: i64,
}

impl Action {
    /// How the action is named in messages: `#12 Genrule (bazel-out/.../x)`.
    pub fn name(&self) -> String {
        match self.outputs.first() {
            Some(first) => format!("#{} {} ({})", self.number, self.mnemonic, first.path),
            None => format!("#{} {}", self.number, self.mnemonic),
        }
    }
}

/// Plans the replay of `spawns`, whose inputs are under `exec_root`.
pub fn plan(spawns: Vec<Spawn>, exec_root: &Path) -> Result<Plan, Error> {
    let workspace = exec_root
        .file_name()
        .and_then(|name| name.to_str())
        .ok_or_else(|| Error::NoWorkspaceName(exec_root.to_owned()))?
        .to_owned();
    let mut skipped = BTreeMap::new();
    let mut files = Files::new(exec_root)?;
    // Every path a logged spawn makes: a `.params` input among them is an
    // artifact, not a virtual input.
    let made: HashSet<String> = spawns
        .iter()
        .flat_map(|spawn| {
            spawn
                .listed_outputs
                .iter()
                .cloned()
                .chain(spawn.actual_outputs.iter().map(|file| file.path.clone()))
        })
        .collect();
    let mut actions = Vec::new();
    for (i, spawn) in spawns.into_iter().enumerate() {
        if let Some(why) = spawn.skip() {
            *skipped.entry(why).or_insert(0) += 1;
            continue;
        }
        let number = i + 1;
        let action = action(number, spawn, &mut files, &made).map_err(|why| Error::Spawn {
            number,
            source: Box::new(why),
        })?;
        actions.push(action);
    }
    add_empty_trees(&mut actions, exec_root);
    link(&mut actions);
    Ok(Plan {
        exec_root: exec_root.to_owned(),
        workspace,
        actions,
        skipped,
    })
}

fn action(
    number: usize,
    spawn: Spawn,
    files: &mut Files,
    made: &HashSet<String>,
) -> Result<Action, Error> {
    if spawn.command_args.is_empty() {
        return Err(Error::EmptyCommand);
    }
    let mut inputs = BTreeMap::new();
    let mut empty_dirs = BTreeSet::new();
    for input in &spawn.inputs {
        check_path(&input.path)?;
        let (found, empty) = files.expand(&input.path, input.digest.as_ref())?;
        for file in found {
            inputs.insert(file.path.clone(), file);
        }
        empty_dirs.extend(empty);
    }
    classify(&mut inputs, files, made)?;
    let mut outputs = Vec::new();
    let mut expected = Vec::new();
    let mut actual: BTreeMap<&str, &LoggedDigest> = BTreeMap::new();
    for file in &spawn.actual_outputs {
        check_path(&file.path)?;
        let digest = file
            .digest
            .as_ref()
            .ok_or_else(|| Error::NoDigest(file.path.clone()))?;
        if !is_sha256_hex(&digest.hash) {
            return Err(Error::NotSha256 {
                path: file.path.clone(),
                function: digest.function.clone(),
            });
        }
        actual.insert(&file.path, digest);
    }
    let mut claimed = vec![false; spawn.actual_outputs.len()];
    for listed in &spawn.listed_outputs {
        check_path(listed)?;
        let inside = format!("{listed}/");
        let dir = !actual.contains_key(listed.as_str())
            && (actual.keys().any(|path| path.starts_with(&inside))
                || files.root.join(listed).is_dir());
        outputs.push(Output {
            path: listed.clone(),
            dir,
        });
        for (k, file) in spawn.actual_outputs.iter().enumerate() {
            if file.path == *listed || file.path.starts_with(&inside) {
                claimed[k] = true;
            }
        }
    }
    // An actual output no listed one covers (a log without listedOutputs).
    for (k, file) in spawn.actual_outputs.iter().enumerate() {
        if !claimed[k] {
            outputs.push(Output {
                path: file.path.clone(),
                dir: false,
            });
        }
    }
    for (path, digest) in actual {
        expected.push(Expected {
            path: path.to_owned(),
            hash: digest.hash.clone(),
            size: digest.size,
        });
    }
    Ok(Action {
        number,
        mnemonic: spawn.mnemonic,
        argv: spawn.command_args,
        env: spawn.env,
        inputs: inputs.into_values().collect(),
        empty_dirs: empty_dirs.into_iter().collect(),
        timeout_secs: u64::try_from(spawn.timeout_millis / 1000).unwrap_or(0),
        outputs,
        expected,
        deps: Vec::new(),
    })
}

/// Sets each input's [`Source`] and adds the runfiles trees of the tools
/// among them (see the module doc).
fn classify(
    inputs: &mut BTreeMap<String, Input>,
    files: &mut Files,
    made: &HashSet<String>,
) -> Result<(), Error> {
    let mut trees = Vec::new();
    for input in inputs.values_mut() {
        if input.path.contains(".runfiles/") {
            // Logged at its runfiles path: a member itself.
            input.source = match files.runfiles_member(&input.path)? {
                Member::Link(exec_path) => Source::Runfiles(exec_path),
                Member::Marker => Source::Virtual,
            };
        } else if input.path.ends_with(".params") && !made.contains(&input.path) {
            input.source = Source::Virtual;
        } else if let Some(tree) = files.runfiles_tree(&input.path)? {
            trees.push((input.path.clone(), tree));
        }
    }
    for (tool, tree) in trees {
        // Only a tree whose members this action reads is its runfiles.
        let members: Option<Vec<Input>> = tree
            .iter()
            .map(|(rel, member)| {
                let path = format!("{tool}.runfiles/{rel}");
                match member {
                    Member::Link(exec_path) => inputs.get(exec_path).map(|natural| Input {
                        path,
                        digest: natural.digest.clone(),
                        executable: natural.executable,
                        source: Source::Runfiles(exec_path.clone()),
                    }),
                    Member::Marker => Some(Input {
                        digest: files.hash(&path).ok()?,
                        path,
                        executable: false,
                        source: Source::Virtual,
                    }),
                }
            })
            .collect();
        for member in members.into_iter().flatten() {
            inputs.entry(member.path.clone()).or_insert(member);
        }
    }
    Ok(())
}

/// Gives each empty tree artifact a logged action made to the later
/// actions whose command line names it: the 4.2.3 log leaves an empty
/// tree artifact out of its readers' inputs, and an action that names a
/// tree artifact reads it (an extra empty directory would be harmless).
fn add_empty_trees(actions: &mut [Action], exec_root: &Path) {
    let mut empty: Vec<(usize, String)> = Vec::new();
    for (i, action) in actions.iter().enumerate() {
        for output in action.outputs.iter().filter(|o| o.dir) {
            let inside = format!("{}/", output.path);
            let filled = action.expected.iter().any(|e| e.path.starts_with(&inside));
            let is_empty = fs::read_dir(exec_root.join(&output.path))
                .map(|mut entries| entries.next().is_none())
                .unwrap_or(false);
            if !filled && is_empty {
                empty.push((i, output.path.clone()));
            }
        }
    }
    for (producer, dir) in empty {
        for action in &mut actions[producer + 1..] {
            let inside = format!("{dir}/");
            let already = action.empty_dirs.contains(&dir)
                || action.inputs.iter().any(|i| i.path.starts_with(&inside))
                || action.outputs.iter().any(|o| o.path == dir);
            if !already && action.argv.iter().any(|arg| names_path(arg, &dir)) {
                action.empty_dirs.push(dir.clone());
                action.empty_dirs.sort();
            }
        }
    }
}

/// Whether `arg` holds `path` as a whole path (not a prefix of a longer
/// name, nor a suffix of one).
fn names_path(arg: &str, path: &str) -> bool {
    let part_of_path = |c: char| c.is_ascii_alphanumeric() || "._-/+@".contains(c);
    arg.match_indices(path).any(|(at, _)| {
        let before = arg[..at].chars().next_back();
        let after = arg[at + path.len()..].chars().next();
        !before.is_some_and(part_of_path) && !after.is_some_and(|c| part_of_path(c) && c != '/')
    })
}

/// An exec path must stay below the exec root.
fn check_path(path: &str) -> Result<(), Error> {
    if path.starts_with('/')
        || path
            .split('/')
            .any(|name| name.is_empty() || name == "." || name == "..")
    {
        return Err(Error::NotExecPath(path.to_owned()));
    }
    Ok(())
}

/// Sets each action's `deps`: the latest earlier action declaring an
/// output (a file, or a tree artifact holding the input) it reads, and
/// the latest earlier one declaring one of its own outputs. The second
/// matters where the log hides a read: a test's spawn declares `test.xml`
/// and writes `test.log`, which it does not list, and the XML spawn after
/// it reads that log and writes `test.xml`; run first, the XML spawn's
/// output was deleted by the test spawn clearing its declared outputs
/// (seen on CI, `--jobs 4`). Each declarer follows the ones before it, so
/// the latest stands for them all.
fn link(actions: &mut [Action]) {
    // Output path -> the actions declaring it, in log order.
    let mut declarers: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, action) in actions.iter().enumerate() {
        for output in &action.outputs {
            let list = declarers.entry(output.path.as_str()).or_default();
            if list.last() != Some(&i) {
                list.push(i);
            }
        }
    }
    // The latest of `declarers` (in log order) before action `i`.
    let latest_before = |declarers: &[usize], i: usize| {
        let before = declarers.partition_point(|&d| d < i);
        before.checked_sub(1).map(|at| declarers[at])
    };
    let mut all_deps = Vec::with_capacity(actions.len());
    for (i, action) in actions.iter().enumerate() {
        let mut deps = Vec::new();
        let mut add = |dep: usize| {
            if !deps.contains(&dep) {
                deps.push(dep);
            }
        };
        for output in &action.outputs {
            if let Some(before) = latest_before(&declarers[output.path.as_str()], i) {
                add(before);
            }
        }
        let read = action.inputs.iter().map(|input| match &input.source {
            Source::Runfiles(exec_path) => exec_path.as_str(),
            Source::Natural | Source::Virtual => input.path.as_str(),
        });
        for read in read.chain(action.empty_dirs.iter().map(String::as_str)) {
            // The input itself, or a tree artifact above it.
            let mut path = read;
            loop {
                if let Some(list) = declarers.get(path) {
                    if let Some(producer) = latest_before(list, i) {
                        add(producer);
                    }
                    break;
                }
                match path.rfind('/') {
                    Some(slash) => path = &path[..slash],
                    None => break,
                }
            }
        }
        deps.sort_unstable();
        all_deps.push(deps);
    }
    for (action, deps) in actions.iter_mut().zip(all_deps) {
        action.deps = deps;
    }
}

/// A runfiles-tree entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Member {
    /// A link to the artifact at this exec path.
    Link(String),
    /// An empty file Bazel made for an entry with no artifact.
    Marker,
}

/// The exec root's files, each looked at once however many actions read it.
struct Files {
    root: PathBuf,
    /// Exec path -> executable bit.
    seen: HashMap<String, bool>,
    /// Where the exec root's symlinks lead (its links to the source tree,
    /// and `external/`'s to the repositories), longest first: a host path
    /// below a target is the exec path below the link.
    links: Vec<(PathBuf, String)>,
    /// A tool's exec path -> its runfiles tree (relative path -> member),
    /// if it has one.
    runfiles: HashMap<String, Option<Vec<(String, Member)>>>,
}

impl Files {
    fn new(root: &Path) -> Result<Files, Error> {
        let mut links = Vec::new();
        let mut resolved = Vec::new();
        for dir in ["", "external"] {
            let Ok(entries) = fs::read_dir(root.join(dir)) else {
                continue;
            };
            for entry in entries {
                let entry = entry.map_err(|err| Error::io("listing", &root.join(dir), err))?;
                let Ok(name) = entry.file_name().into_string() else {
                    continue;
                };
                let exec = if dir.is_empty() {
                    name
                } else {
                    format!("{dir}/{name}")
                };
                let host = entry.path();
                if let Ok(target) = fs::read_link(&host) {
                    let target = normalize(&host.parent().unwrap_or(root).join(target));
                    if let Ok(real) = fs::canonicalize(&host) {
                        if real != target {
                            resolved.push((real, exec.clone()));
                        }
                    }
                    links.push((target, exec));
                }
            }
        }
        // Where a link says it leads first: two links may resolve to one
        // directory (`linkdir -> data`), and the one named for it wins.
        let longest = |(target, _): &(PathBuf, String)| std::cmp::Reverse(target.as_os_str().len());
        links.sort_by_key(longest);
        resolved.sort_by_key(longest);
        links.extend(resolved);
        Ok(Files {
            root: root.to_owned(),
            seen: HashMap::new(),
            links,
            runfiles: HashMap::new(),
        })
    }

    /// The exec path of host path `path` (absolute, normalized), if the
    /// exec root reaches it: below the exec root, or below where one of
    /// its links leads.
    fn exec_path_of(&self, path: &Path) -> Option<String> {
        if let Ok(rest) = path.strip_prefix(&self.root) {
            return rest.to_str().filter(|s| !s.is_empty()).map(str::to_owned);
        }
        self.links.iter().find_map(|(target, exec)| {
            let rest = path.strip_prefix(target).ok()?.to_str()?;
            Some(if rest.is_empty() {
                exec.clone()
            } else {
                format!("{exec}/{rest}")
            })
        })
    }

    /// The exec path a runfiles link at `host` stands for: its readlink
    /// chain followed, one link at a time, to the first path the exec
    /// root names (Bazel's links are absolute; relative ones work too).
    fn follow(&self, host: &Path) -> Result<String, Error> {
        let mut current = host.to_owned();
        for _ in 0..40 {
            let target = fs::read_link(&current).map_err(|source| Error::RunfilesLink {
                member: host.to_owned(),
                link: current.clone(),
                source,
            })?;
            let next = normalize(&current.parent().unwrap_or(Path::new("/")).join(target));
            if let Some(exec) = self.exec_path_of(&next) {
                return Ok(exec);
            }
            current = next;
        }
        Err(Error::RunfilesOutside {
            member: host.to_owned(),
            exec_root: self.root.clone(),
        })
    }

    /// What the runfiles entry at exec path `path` (`....runfiles/...`) is.
    fn runfiles_member(&self, path: &str) -> Result<Member, Error> {
        let host = self.root.join(path);
        let meta = fs::symlink_metadata(&host).map_err(|err| Error::io("lstat", &host, err))?;
        if meta.file_type().is_symlink() {
            self.follow(&host).map(Member::Link)
        } else {
            Ok(Member::Marker)
        }
    }

    /// The runfiles tree beside the tool at exec path `tool`, if there is
    /// one: every entry below `<tool>.runfiles/` but its `MANIFEST`, by
    /// path below it (a link to a directory stands for the files below).
    fn runfiles_tree(&mut self, tool: &str) -> Result<Option<Vec<(String, Member)>>, Error> {
        if let Some(tree) = self.runfiles.get(tool) {
            return Ok(tree.clone());
        }
        let dir = self.root.join(format!("{tool}.runfiles"));
        let tree = if dir.join("MANIFEST").is_file() {
            let mut members = Vec::new();
            self.walk_runfiles(&dir, "", &mut members)?;
            members.retain(|(rel, _)| rel != "MANIFEST");
            Some(members)
        } else {
            None
        };
        self.runfiles.insert(tool.to_owned(), tree.clone());
        Ok(tree)
    }

    fn walk_runfiles(
        &self,
        dir: &Path,
        rel: &str,
        found: &mut Vec<(String, Member)>,
    ) -> Result<(), Error> {
        for (name, entry) in sorted_entries(dir, "listing runfiles")? {
            let child = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let host = entry.path();
            let kind = entry
                .file_type()
                .map_err(|err| Error::io("lstat", &host, err))?;
            if kind.is_dir() {
                self.walk_runfiles(&host, &child, found)?;
            } else if kind.is_symlink() {
                let exec = self.follow(&host)?;
                if self.root.join(&exec).is_dir() {
                    // A linked directory: its files, each at its own exec path.
                    let mut below = Vec::new();
                    walk(&self.root.join(&exec), &exec, &mut below, &mut Vec::new())?;
                    for file in below {
                        let tail = &file.path[exec.len()..];
                        found.push((format!("{child}{tail}"), Member::Link(file.path)));
                    }
                } else {
                    found.push((child, Member::Link(exec)));
                }
            } else {
                found.push((child, Member::Marker));
            }
        }
        Ok(())
    }

    /// The digest of the file at exec path `path`.
    fn hash(&self, path: &str) -> Result<reapi::Digest, Error> {
        hash_file(&self.root.join(path))
    }

    /// The input files at `path`: itself, with the logged digest (or its
    /// own, hashed, if the log gives none or not a SHA-256), or every file
    /// below it if it is a directory, hashed; and the empty directories
    /// below (or at) it.
    fn expand(
        &mut self,
        path: &str,
        logged: Option<&LoggedDigest>,
    ) -> Result<(Vec<Input>, Vec<String>), Error> {
        if let Some(&executable) = self.seen.get(path) {
            if let Some(digest) = logged.filter(|d| is_sha256_hex(&d.hash)) {
                return Ok((
                    vec![Input {
                        path: path.to_owned(),
                        digest: reapi::Digest {
                            hash: digest.hash.clone(),
                            size_bytes: digest.size,
                        },
                        executable,
                        source: Source::Natural,
                    }],
                    Vec::new(),
                ));
            }
        }
        let host = self.root.join(path);
        // Followed: the exec root reaches sources through symlinks.
        let meta = fs::metadata(&host).map_err(|source| Error::InputMissing {
            input: path.to_owned(),
            host: host.clone(),
            source,
        })?;
        if meta.is_dir() {
            let mut found = Vec::new();
            let mut empty = Vec::new();
            walk(&host, path, &mut found, &mut empty)?;
            return Ok((found, empty));
        }
        let executable = meta.permissions().mode() & 0o111 != 0;
        self.seen.insert(path.to_owned(), executable);
        let digest = match logged.filter(|d| is_sha256_hex(&d.hash)) {
            Some(digest) => reapi::Digest {
                hash: digest.hash.clone(),
                size_bytes: digest.size,
            },
            None => hash_file(&host)?,
        };
        Ok((
            vec![Input {
                path: path.to_owned(),
                digest,
                executable,
                source: Source::Natural,
            }],
            Vec::new(),
        ))
    }
}

/// `path` with `.` and `..` resolved by name, as a link's target is.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Every file below `dir` (exec path `path`), hashed, in name order; and
/// the empty directories, `dir` itself included.
fn walk(
    dir: &Path,
    path: &str,
    found: &mut Vec<Input>,
    empty: &mut Vec<String>,
) -> Result<(), Error> {
    let entries = sorted_entries(dir, "listing input directory")?;
    if entries.is_empty() {
        empty.push(path.to_owned());
    }
    for (name, entry) in entries {
        let child = format!("{path}/{name}");
        let host = entry.path();
        let meta = fs::metadata(&host).map_err(|err| Error::io("stat", &host, err))?;
        if meta.is_dir() {
            walk(&host, &child, found, empty)?;
        } else {
            found.push(Input {
                digest: hash_file(&host)?,
                path: child,
                executable: meta.permissions().mode() & 0o111 != 0,
                source: Source::Natural,
            });
        }
    }
    Ok(())
}

/// The entries of `dir` (`listing` it is told as in messages), by name,
/// names UTF-8.
fn sorted_entries(dir: &Path, listing: &'static str) -> Result<Vec<(String, fs::DirEntry)>, Error> {
    let mut entries = fs::read_dir(dir)
        .and_then(|entries| entries.collect::<Result<Vec<_>, _>>())
        .map_err(|err| Error::io(listing, dir, err))?
        .into_iter()
        .map(|entry| match entry.file_name().into_string() {
            Ok(name) => Ok((name, entry)),
            Err(_) => Err(Error::NotUtf8(entry.path())),
        })
        .collect::<Result<Vec<_>, Error>>()?;
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(entries)
}

/// The SHA-256 digest of a file's bytes.
pub fn hash_file(path: &Path) -> Result<reapi::Digest, Error> {
    let bytes = fs::read(path).map_err(|err| Error::io("reading", path, err))?;
    Ok(reapi::Digest {
        hash: sha256_hex(&bytes),
        size_bytes: bytes.len() as i64,
    })
}

#[cfg(test)]
mod tests {
    use super::super::execlog::LoggedFile;
    use super::*;

    fn file(path: &str, content: Option<&[u8]>) -> LoggedFile {
        LoggedFile {
            path: path.to_owned(),
            digest: content.map(|bytes| LoggedDigest {
                hash: sha256_hex(bytes),
                size: bytes.len() as i64,
                function: "SHA-256".to_owned(),
            }),
        }
    }

    fn spawn(inputs: Vec<LoggedFile>, listed: &[&str], actual: Vec<LoggedFile>) -> Spawn {
        Spawn {
            command_args: vec!["true".into()],
            inputs,
            listed_outputs: listed.iter().map(|s| (*s).to_owned()).collect(),
            actual_outputs: actual,
            mnemonic: "Test".into(),
            runner: "local".into(),
            ..Spawn::default()
        }
    }

    #[test]
    fn expands_directories_types_outputs_and_links_producers() {
        let dir = std::env::temp_dir().join(format!("replay-plan-{}", std::process::id()));
        let root = dir.join("ws");
        fs::create_dir_all(root.join("src/tree/sub")).unwrap();
        fs::write(root.join("src/a"), "a").unwrap();
        fs::write(root.join("src/tool"), "#!/bin/sh").unwrap();
        fs::set_permissions(root.join("src/tool"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(root.join("src/tree/x"), "x").unwrap();
        fs::write(root.join("src/tree/sub/y"), "y").unwrap();
        let spawns = vec![
            spawn(
                vec![
                    file("src/a", Some(b"a")),
                    file("src/tool", Some(b"#!/bin/sh")),
                ],
                &["out/gen", "out/t"],
                vec![file("out/gen", Some(b"g")), file("out/t/1", Some(b"1"))],
            ),
            spawn(vec![], &[], vec![]),
            spawn(
                // A directory input, an input below a tree output, a generated file.
                vec![
                    file("src/tree", None),
                    file("out/gen", Some(b"g")),
                    file("out/t/1", Some(b"1")),
                ],
                &["out/final"],
                vec![file("out/final", Some(b"f"))],
            ),
        ];
        // Generated inputs are in the exec root after the logged build.
        fs::create_dir_all(root.join("out/t")).unwrap();
        fs::write(root.join("out/gen"), "g").unwrap();
        fs::write(root.join("out/t/1"), "1").unwrap();
        let plan = plan(spawns, &root).unwrap();
        fs::remove_dir_all(&dir).unwrap();

        assert_eq!(plan.workspace, "ws");
        assert_eq!(plan.skipped.get(&Skip::NoOutputs), Some(&1));
        assert_eq!(plan.actions.len(), 2);
        let first = &plan.actions[0];
        assert_eq!(first.number, 1);
        assert_eq!(
            first.outputs,
            [
                Output {
                    path: "out/gen".into(),
                    dir: false
                },
                Output {
                    path: "out/t".into(),
                    dir: true
                }
            ]
        );
        assert_eq!(first.expected.len(), 2);
        assert!(!first.inputs[0].executable && first.inputs[1].executable);
        let last = &plan.actions[1];
        assert_eq!(last.number, 3);
        let paths: Vec<&str> = last.inputs.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            ["out/gen", "out/t/1", "src/tree/sub/y", "src/tree/x"]
        );
        assert_eq!(last.inputs[3].digest.hash, sha256_hex(b"x"));
        assert_eq!(last.deps, [0]);
        assert_eq!(last.name(), "#3 Test (out/final)");
    }

    #[test]
    fn writers_of_one_output_chain_and_its_reader_follows_the_latest() {
        let dir = std::env::temp_dir().join(format!("replay-waw-{}", std::process::id()));
        let root = dir.join("ws");
        fs::create_dir_all(root.join("logs")).unwrap();
        fs::write(root.join("logs/test.log"), "log").unwrap();
        fs::write(root.join("src"), "s").unwrap();
        fs::write(root.join("logs/test.xml"), "y").unwrap();
        let spawns = vec![
            // The test: declares test.xml, writes the unlisted test.log.
            spawn(
                vec![file("src", Some(b"s"))],
                &["logs/test.xml", "logs/other"],
                vec![file("logs/other", Some(b"o"))],
            ),
            // The XML: reads test.log, writes test.xml.
            spawn(
                vec![file("logs/test.log", Some(b"log"))],
                &["logs/test.xml"],
                vec![file("logs/test.xml", Some(b"x"))],
            ),
            // A third writer follows the second, which follows the first.
            spawn(
                vec![file("src", Some(b"s"))],
                &["logs/test.xml"],
                vec![file("logs/test.xml", Some(b"y"))],
            ),
            // A reader reads what the latest writer before it left.
            spawn(
                vec![file("logs/test.xml", Some(b"y"))],
                &["out/report"],
                vec![file("out/report", Some(b"r"))],
            ),
        ];
        let plan = plan(spawns, &root).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(plan.actions.len(), 4);
        assert_eq!(plan.actions[0].deps, Vec::<usize>::new());
        assert_eq!(plan.actions[1].deps, [0]);
        assert_eq!(plan.actions[2].deps, [1]);
        assert_eq!(plan.actions[3].deps, [2]);
    }

    #[test]
    fn a_command_line_names_a_path_only_whole() {
        let dir = "bazel-out/bin/empty";
        assert!(names_path(dir, dir));
        assert!(names_path("test -d bazel-out/bin/empty && ls", dir));
        assert!(names_path("--in=bazel-out/bin/empty/", dir));
        assert!(!names_path("bazel-out/bin/empty_listing.txt", dir));
        assert!(!names_path("x/bazel-out/bin/empty", dir));
    }

    #[test]
    fn refuses_escaping_paths_and_missing_inputs() {
        let root = std::env::temp_dir();
        let escaping = spawn(vec![file("../etc/passwd", Some(b""))], &["o"], vec![]);
        let err = plan(vec![escaping], &root).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Spawn { number: 1, source }
                    if matches!(&**source, Error::NotExecPath(path) if path == "../etc/passwd")
            ),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("spawn 1") && text.contains("../etc/passwd"),
            "{text}"
        );
        let missing = spawn(vec![file("no/such/input-xyz", Some(b""))], &["o"], vec![]);
        let err = plan(vec![missing], &root).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Spawn { number: 1, source }
                    if matches!(&**source, Error::InputMissing { input, .. } if input == "no/such/input-xyz")
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("--exec-root"), "{err}");
    }
}
