//! From logged spawns to replayable actions: each input typed and checked
//! once against the exec root (its executable bit, a directory expanded
//! into the files below it, hashed), outputs sorted into files and tree
//! artifacts with the digests to expect, and which earlier action made
//! each generated input.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use actionfs_protocol::backend::digest::{is_sha256_hex, sha256_hex};
use actionfs_protocol::backend::reapi;

use super::execlog::{LoggedDigest, Skip, Spawn};

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
    pub outputs: Vec<Output>,
    /// The output files to compare, with the logged digests.
    pub expected: Vec<Expected>,
    /// Indices (into [`Plan::actions`]) of the earlier actions that made
    /// one of its inputs.
    pub deps: Vec<usize>,
}

#[derive(Debug, Clone)]
pub struct Input {
    /// Exec path.
    pub path: String,
    pub digest: reapi::Digest,
    pub executable: bool,
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
pub fn plan(spawns: Vec<Spawn>, exec_root: &Path) -> Result<Plan, String> {
    let workspace = exec_root
        .file_name()
        .and_then(|name| name.to_str())
        .ok_or_else(|| format!("{exec_root:?} has no UTF-8 basename to name the workspace"))?
        .to_owned();
    let mut skipped = BTreeMap::new();
    let mut files = Files::new(exec_root);
    let mut actions = Vec::new();
    for (i, spawn) in spawns.into_iter().enumerate() {
        if let Some(why) = spawn.skip() {
            *skipped.entry(why).or_insert(0) += 1;
            continue;
        }
        let number = i + 1;
        let action = action(number, spawn, &mut files)
            .map_err(|why| format!("spawn {number} of the log: {why}"))?;
        actions.push(action);
    }
    link(&mut actions);
    Ok(Plan {
        exec_root: exec_root.to_owned(),
        workspace,
        actions,
        skipped,
    })
}

fn action(number: usize, spawn: Spawn, files: &mut Files) -> Result<Action, String> {
    if spawn.command_args.is_empty() {
        return Err("commandArgs is empty".to_owned());
    }
    let mut inputs = BTreeMap::new();
    for input in &spawn.inputs {
        check_path(&input.path)?;
        for file in files.expand(&input.path, input.digest.as_ref())? {
            inputs.insert(file.path.clone(), file);
        }
    }
    let mut outputs = Vec::new();
    let mut expected = Vec::new();
    let mut actual: BTreeMap<&str, &LoggedDigest> = BTreeMap::new();
    for file in &spawn.actual_outputs {
        check_path(&file.path)?;
        let digest = file
            .digest
            .as_ref()
            .ok_or_else(|| format!("output {} has no digest", file.path))?;
        if !is_sha256_hex(&digest.hash) {
            return Err(format!(
                "output {} has a {} digest, not SHA-256: build with --digest_function=sha256",
                file.path, digest.function
            ));
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
        outputs,
        expected,
        deps: Vec::new(),
    })
}

/// An exec path must stay below the exec root.
fn check_path(path: &str) -> Result<(), String> {
    if path.starts_with('/')
        || path
            .split('/')
            .any(|name| name.is_empty() || name == "." || name == "..")
    {
        return Err(format!("{path:?} is not a plain relative exec path"));
    }
    Ok(())
}

/// Sets each action's `deps`: the earlier actions whose outputs (a file,
/// or a tree artifact holding the input) it reads.
fn link(actions: &mut [Action]) {
    let mut made_by: HashMap<String, usize> = HashMap::new();
    for (i, action) in actions.iter().enumerate() {
        for output in &action.outputs {
            made_by.entry(output.path.clone()).or_insert(i);
        }
    }
    for (i, action) in actions.iter_mut().enumerate() {
        let mut deps = Vec::new();
        for input in &action.inputs {
            // The input itself, or a tree artifact above it.
            let mut path = input.path.as_str();
            loop {
                if let Some(&producer) = made_by.get(path) {
                    if producer < i && !deps.contains(&producer) {
                        deps.push(producer);
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
        action.deps = deps;
    }
}

/// The exec root's files, each looked at once however many actions read it.
struct Files {
    root: PathBuf,
    /// Exec path -> executable bit.
    seen: HashMap<String, bool>,
}

impl Files {
    fn new(root: &Path) -> Files {
        Files {
            root: root.to_owned(),
            seen: HashMap::new(),
        }
    }

    /// The input files at `path`: itself, with the logged digest (or its
    /// own, hashed, if the log gives none or not a SHA-256), or every file
    /// below it if it is a directory, hashed.
    fn expand(&mut self, path: &str, logged: Option<&LoggedDigest>) -> Result<Vec<Input>, String> {
        if let Some(&executable) = self.seen.get(path) {
            if let Some(digest) = logged.filter(|d| is_sha256_hex(&d.hash)) {
                return Ok(vec![Input {
                    path: path.to_owned(),
                    digest: reapi::Digest {
                        hash: digest.hash.clone(),
                        size_bytes: digest.size,
                    },
                    executable,
                }]);
            }
        }
        let host = self.root.join(path);
        // Followed: the exec root reaches sources through symlinks.
        let meta = fs::metadata(&host).map_err(|err| {
            format!(
                "input {path}: {err} at {}: is --exec-root the exec root of the build that wrote the log?",
                host.display()
            )
        })?;
        if meta.is_dir() {
            let mut found = Vec::new();
            walk(&host, path, &mut found)?;
            return Ok(found);
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
        Ok(vec![Input {
            path: path.to_owned(),
            digest,
            executable,
        }])
    }
}

/// Every file below `dir` (exec path `path`), hashed, in name order.
fn walk(dir: &Path, path: &str, found: &mut Vec<Input>) -> Result<(), String> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .and_then(|entries| entries.collect::<Result<Vec<_>, _>>())
        .map_err(|err| format!("listing input directory {}: {err}", dir.display()))?;
    entries.sort_by_key(fs::DirEntry::file_name);
    for entry in entries {
        let name = entry.file_name();
        let name = name
            .to_str()
            .ok_or_else(|| format!("{:?} is not UTF-8", entry.path()))?;
        let child = format!("{path}/{name}");
        let host = entry.path();
        let meta = fs::metadata(&host).map_err(|err| format!("{}: {err}", host.display()))?;
        if meta.is_dir() {
            walk(&host, &child, found)?;
        } else {
            found.push(Input {
                digest: hash_file(&host)?,
                path: child,
                executable: meta.permissions().mode() & 0o111 != 0,
            });
        }
    }
    Ok(())
}

/// The SHA-256 digest of a file's bytes.
pub fn hash_file(path: &Path) -> Result<reapi::Digest, String> {
    let bytes = fs::read(path).map_err(|err| format!("reading {}: {err}", path.display()))?;
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
    fn refuses_escaping_paths_and_missing_inputs() {
        let root = std::env::temp_dir();
        let escaping = spawn(vec![file("../etc/passwd", Some(b""))], &["o"], vec![]);
        let err = plan(vec![escaping], &root).unwrap_err();
        assert!(
            err.contains("spawn 1") && err.contains("../etc/passwd"),
            "{err}"
        );
        let missing = spawn(vec![file("no/such/input-xyz", Some(b""))], &["o"], vec![]);
        let err = plan(vec![missing], &root).unwrap_err();
        assert!(err.contains("--exec-root"), "{err}");
    }
}
