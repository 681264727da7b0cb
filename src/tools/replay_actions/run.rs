//! What every mode shares: running an action's command line, and the few
//! file operations around it.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::plan::Action;
use super::Error;
use crate::sandbox::materialize::remove_tree;

/// Lines of the action's stderr (or stdout) kept in a failure's message.
const TAIL_LINES: usize = 10;

/// A wrapper argv and environment put around the action (a backend's
/// custom confinement).
pub struct Wrapper<'a> {
    pub argv: &'a [String],
    pub env: &'a HashMap<String, String>,
}

/// Runs `action` in `cwd` behind a jail's `argv` (no environment of its
/// own), as a strategy's jail wraps it.
pub fn jailed(action: &Action, cwd: &Path, argv: &[String]) -> Result<(), Error> {
    let env = HashMap::new();
    command(action, cwd, Some(&Wrapper { argv, env: &env }))
}

/// Runs the action's argv in `cwd` with exactly the logged environment
/// (plus the wrapper's), stdin empty; Ok if it exits 0. A relative program
/// path with a slash (`bazel-out/host/bin/tool`) is taken from `cwd`, as
/// Bazel does.
pub fn command(action: &Action, cwd: &Path, wrapper: Option<&Wrapper>) -> Result<(), Error> {
    let mut argv: Vec<String> = action.argv.clone();
    if argv[0].contains('/') && !argv[0].starts_with('/') {
        argv[0] = cwd.join(&argv[0]).to_string_lossy().into_owned();
    }
    if let Some(wrapper) = wrapper {
        argv.splice(0..0, wrapper.argv.iter().cloned());
    }
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .env_clear()
        .envs(action.env.iter().map(|(k, v)| (k, v)))
        .current_dir(cwd)
        .stdin(Stdio::null());
    if let Some(wrapper) = wrapper {
        command.envs(wrapper.env);
    }
    let output = command.output().map_err(|source| Error::CannotRun {
        program: argv[0].clone(),
        cwd: cwd.to_owned(),
        source,
    })?;
    if output.status.success() {
        return Ok(());
    }
    let said = if output.stderr.is_empty() {
        &output.stdout
    } else {
        &output.stderr
    };
    let said = String::from_utf8_lossy(said);
    let lines: Vec<&str> = said.lines().collect();
    let tail = lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n    ");
    Err(Error::ActionFailed {
        status: output.status,
        cwd: cwd.to_owned(),
        tail,
    })
}

/// A test's TEST_TMPDIR (relative to the exec root, or absolute), if the
/// logged environment sets one.
pub fn test_tmpdir(action: &Action) -> Option<&str> {
    action
        .env
        .iter()
        .find(|(name, value)| name == "TEST_TMPDIR" && !value.is_empty())
        .map(|(_, value)| value.as_str())
}

/// Moves each output `action` made in the sandbox at `root` to the same
/// path below `results` (what is there goes first), by rename; where the
/// two are on different file systems, `across` moves it instead.
pub fn move_outputs(
    action: &Action,
    root: &Path,
    results: &Path,
    across: impl Fn(&Path, &Path) -> Result<(), Error>,
) -> Result<(), Error> {
    for output in &action.outputs {
        let from = root.join(&output.path);
        if fs::symlink_metadata(&from).is_err() {
            // Not made: the comparison says so if the log has it.
            continue;
        }
        let to = results.join(&output.path);
        make_parent(results, &output.path)?;
        remove(&to)?;
        match fs::rename(&from, &to) {
            Ok(()) => {}
            Err(err) if err.raw_os_error() == Some(libc::EXDEV) => across(&from, &to)?,
            Err(err) => return Err(Error::moving("moving", from, to, err)),
        }
    }
    Ok(())
}

/// Makes the directory that holds `root/rel`, and those above it.
pub fn make_parent(root: &Path, rel: &str) -> Result<(), Error> {
    let path = root.join(rel);
    match path.parent() {
        Some(parent) => make_dir(parent),
        None => Ok(()),
    }
}

pub fn make_dir(path: &Path) -> Result<(), Error> {
    fs::create_dir_all(path).map_err(|err| Error::io("mkdir -p", path, err))
}

/// Removes `path` and all below it like `rm -rf`; nothing there is fine.
pub fn remove(path: &Path) -> Result<(), Error> {
    match fs::symlink_metadata(path) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(Error::io("lstat", path, err)),
        Ok(_) => Ok(remove_tree(path).map(drop)?),
    }
}

/// Where a mode's outputs land: `<mode dir>/execroot/<workspace>`.
pub fn results_root(mode_dir: &Path, workspace: &str) -> PathBuf {
    mode_dir.join("execroot").join(workspace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(argv: &[&str], env: &[(&str, &str)]) -> Action {
        Action {
            number: 1,
            mnemonic: "Test".into(),
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            inputs: vec![],
            empty_dirs: vec![],
            timeout_secs: 0,
            outputs: vec![],
            expected: vec![],
            deps: vec![],
        }
    }

    #[test]
    fn runs_with_exactly_the_logged_environment_and_tells_failures() {
        let dir = std::env::temp_dir().join(format!("replay-run-{}", std::process::id()));
        make_dir(&dir.join("bin")).unwrap();
        let env = [("ONLY", "this")];
        command(
            &action(&["/bin/sh", "-c", "env > seen; exit 0"], &env),
            &dir,
            None,
        )
        .unwrap();
        let seen = fs::read_to_string(dir.join("seen")).unwrap();
        assert!(seen.contains("ONLY=this"), "{seen}");
        assert!(!seen.contains("HOME="), "{seen}");

        // A relative program with a slash runs from the working directory.
        fs::write(
            dir.join("bin/tool"),
            "#!/bin/sh\necho from tool >&2\nexit 3\n",
        )
        .unwrap();
        fs::set_permissions(
            dir.join("bin/tool"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let err = command(&action(&["bin/tool"], &[]), &dir, None).unwrap_err();
        let Error::ActionFailed { status, tail, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(status.code(), Some(3));
        assert!(tail.contains("from tool"), "{tail}");
        let text = err.to_string();
        assert!(
            text.contains("exit status: 3") && text.contains("from tool"),
            "{text}"
        );

        let wrapped_env = HashMap::from([("W".to_owned(), "1".to_owned())]);
        let wrapper = ["/usr/bin/env".to_owned()];
        command(
            &action(&["/bin/sh", "-c", "test \"$W$ONLY\" = 1this"], &env),
            &dir,
            Some(&Wrapper {
                argv: &wrapper,
                env: &wrapped_env,
            }),
        )
        .unwrap();
        remove(&dir).unwrap();
        remove(&dir).unwrap();
        assert!(!dir.exists());
    }
}
