//! Declared outputs: where the action writes them (the sandbox's scratch
//! directory, behind the writable workspace directory), and how Collect
//! moves them out.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use std::collections::{HashMap, HashSet};

use crate::sandbox::materialize::remove_tree;
use crate::sandbox::merkle::{check_name, Checked, Walked};

/// One declared output, checked.
#[derive(Clone, Debug)]
pub struct Output {
    /// In-sandbox path, relative to the sandbox root (`ws/bazel-out/...`).
    pub path: String,
    /// Where Collect puts it, relative to Collect's exec root.
    pub dest: String,
    pub dir: bool,
}

/// Checks an output's key (`/<workspace>/<path>`), type and destination.
pub fn check(workspace: &str, key: &str, kind: &str, dest: &str) -> Result<Output, String> {
    let path =
        relative_in_workspace(workspace, key).map_err(|why| format!("output {key:?}: {why}"))?;
    let dest = if dest.is_empty() {
        path.clone()
    } else {
        relative_in_workspace(workspace, dest)
            .map_err(|why| format!("output {key:?}: destination {dest:?}: {why}"))?
    };
    let dir = match kind {
        "file" => false,
        "dir" => true,
        other => {
            return Err(format!(
                "output {key:?}: type {other:?} is neither \"file\" nor \"dir\""
            ))
        }
    };
    Ok(Output { path, dest, dir })
}

/// `/<workspace>/a/b` as `<workspace>/a/b`, refusing anything outside the
/// workspace or not normalized.
fn relative_in_workspace(workspace: &str, key: &str) -> Result<String, String> {
    let rest = key
        .strip_prefix('/')
        .ok_or("not absolute (it must start with /<workspace>/)")?;
    let mut components = rest.split('/');
    if components.next() != Some(workspace) {
        return Err(format!("not inside the workspace /{workspace}"));
    }
    let mut any = false;
    for component in components {
        check_name(component)?;
        any = true;
    }
    if !any {
        return Err("names the workspace itself".to_owned());
    }
    Ok(rest.to_owned())
}

/// Checks a writable directory's sandbox path (`/tmp`, `/<ws>/x`): absolute,
/// normalized, not the root.
pub fn check_sandbox_path(path: &str) -> Result<(), String> {
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| format!("{path:?} is not absolute"))?;
    if rest.is_empty() {
        return Err("the sandbox root cannot be a writable directory".to_owned());
    }
    rest.split('/')
        .try_for_each(check_name)
        .map_err(|why| format!("{path:?}: {why}"))
}

/// Refuses an output the input tree already holds as a file or symlink,
/// or below one (the action could not write it), and a directory output
/// the tree holds as a directory.
pub fn check_against_tree(outputs: &[Output], walked: &Walked) -> Result<(), String> {
    if outputs.is_empty() {
        return Ok(());
    }
    let dirs: HashMap<&str, &Checked> = walked
        .dirs
        .iter()
        .map(|(path, dir)| (path.as_str(), &**dir))
        .collect();
    for output in outputs {
        let mut prefix = output.path.as_str();
        while let Some((parent, name)) = prefix.rsplit_once('/') {
            if dirs.get(parent).is_some_and(|dir| dir.has_leaf(name)) {
                return Err(format!(
                    "output {:?}: the input tree holds {prefix:?} as a file or symlink",
                    output.path
                ));
            }
            prefix = parent;
        }
        if output.dir && dirs.contains_key(output.path.as_str()) {
            return Err(format!(
                "output {:?}: a directory output the input tree already holds",
                output.path
            ));
        }
    }
    Ok(())
}

/// Makes, below `scratch` (the sandbox root's stand-in), each file
/// output's parent and each directory output itself, writable and empty;
/// `made` (the workspace directory, say) is there already.
pub fn prepare(scratch: &Path, made: &str, outputs: &[Output]) -> io::Result<()> {
    // Top down, each directory once: outputs share their parents, and a
    // recursive mkdir tries each missing level twice (the full path
    // first, failing, then its parent).
    let mut made: HashSet<&str> = HashSet::from([made]);
    for output in outputs {
        let dir = if output.dir {
            output.path.as_str()
        } else {
            output
                .path
                .rsplit_once('/')
                .map_or("", |(parent, _)| parent)
        };
        let levels = dir.match_indices('/').map(|(at, _)| &dir[..at]);
        for level in levels.chain([dir]).filter(|level| !level.is_empty()) {
            if made.contains(level) {
                continue;
            }
            let path = scratch.join(level);
            match fs::DirBuilder::new().mode(0o755).create(&path) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {}
                Err(err) => {
                    return Err(io::Error::new(
                        err.kind(),
                        format!("mkdir {}: {err}", path.display()),
                    ))
                }
            }
            made.insert(level);
        }
    }
    Ok(())
}

/// Moves every output that exists below `scratch` to `exec_root`/dest: a
/// rename, or a copy keeping modes where the two are on different file
/// systems. An output the action did not make is left for Bazel to report.
pub fn collect(scratch: &Path, exec_root: &Path, outputs: &[Output]) -> Result<(), String> {
    for output in outputs {
        let from = scratch.join(&output.path);
        let to = exec_root.join(&output.dest);
        match fs::symlink_metadata(&from) {
            Ok(_) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(format!("output {:?}: lstat {from:?}: {err}", output.path)),
        }
        move_output(&from, &to).map_err(|err| format!("output {:?}: {err}", output.path))?;
    }
    Ok(())
}

fn move_output(from: &Path, to: &Path) -> Result<(), String> {
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent).map_err(|err| format!("mkdir {parent:?}: {err}"))?;
    }
    // What a previous build left there, read-only directories included.
    if fs::symlink_metadata(to).is_ok() {
        remove_tree(to).map_err(|err| err.to_string())?;
    }
    match fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(err) if err.raw_os_error() == Some(libc::EXDEV) => {
            copy_tree(from, to).map_err(|err| format!("copy {from:?} to {to:?}: {err}"))?;
            remove_tree(from)
                .map(drop)
                .map_err(|err| format!("after copying {from:?}: {err}"))
        }
        Err(err) => Err(format!("rename {from:?} to {to:?}: {err}")),
    }
}

/// A copy of a file, symlink or directory tree, modes kept.
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(from)?;
    if meta.file_type().is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(from)?, to)
    } else if meta.is_dir() {
        fs::create_dir(to)?;
        for entry in fs::read_dir(from)? {
            let entry = entry?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        fs::set_permissions(to, meta.permissions())
    } else {
        // fs::copy keeps the permission bits.
        fs::copy(from, to).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_keys_must_name_a_path_inside_the_workspace() {
        assert_eq!(check("ws", "/ws/a/b", "file", "").unwrap().path, "ws/a/b");
        assert_eq!(check("ws", "/ws/a", "dir", "/ws/c").unwrap().dest, "ws/c");
        for bad in [
            "ws/a",
            "/other/a",
            "/ws",
            "/ws/",
            "/ws/../x",
            "/ws/a/../../etc",
            "/ws/./a",
            "/ws//a",
            "/ws/a\0b",
        ] {
            assert!(
                check("ws", bad, "file", "").is_err(),
                "{bad:?} was accepted"
            );
        }
        assert!(check("ws", "/ws/a", "file", "/ws/../x").is_err());
        assert!(check("ws", "/ws/a", "symlink", "").is_err());
    }

    #[test]
    fn writable_dirs_must_be_absolute_normalized_and_not_the_root() {
        assert!(check_sandbox_path("/tmp").is_ok());
        assert!(check_sandbox_path("/ws/out").is_ok());
        for bad in ["tmp", "/", "/tmp/..", "/a//b"] {
            assert!(check_sandbox_path(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn prepare_makes_every_parent_once_and_refuses_a_file_in_the_way() {
        let scratch = tempfile::tempdir().unwrap();
        fs::create_dir(scratch.path().join("ws")).unwrap();
        let mut outputs = vec![
            check("ws", "/ws/a/b/c/f.o", "file", "").unwrap(),
            check("ws", "/ws/a/b/c/g.o", "file", "").unwrap(),
            check("ws", "/ws/a/d", "dir", "").unwrap(),
            check("ws", "/ws/top", "file", "").unwrap(),
        ];
        outputs.sort_by(|a, b| a.path.cmp(&b.path));
        // As serve calls it: the workspace directory is made already.
        prepare(scratch.path(), "ws", &outputs).unwrap();
        use std::os::unix::fs::PermissionsExt;
        for dir in ["ws/a", "ws/a/b", "ws/a/b/c", "ws/a/d"] {
            let meta = fs::symlink_metadata(scratch.path().join(dir)).unwrap();
            assert!(meta.is_dir(), "{dir}");
            assert_eq!(meta.permissions().mode() & 0o700, 0o700, "{dir}");
        }
        assert!(!scratch.path().join("ws/top").exists());
        assert!(!scratch.path().join("ws/a/b/c/f.o").exists());
        // Again, over what is there: nothing changes, nothing fails.
        prepare(scratch.path(), "", &outputs).unwrap();
        // A file where a parent goes.
        let blocked = tempfile::tempdir().unwrap();
        fs::create_dir(blocked.path().join("ws")).unwrap();
        fs::write(blocked.path().join("ws/a"), "x").unwrap();
        let err = prepare(blocked.path(), "", &outputs).unwrap_err();
        assert!(err.to_string().contains("ws/a"), "{err}");
    }

    #[test]
    fn collect_moves_outputs_and_leaves_missing_ones() {
        let scratch = tempfile::tempdir().unwrap();
        let exec = tempfile::tempdir().unwrap();
        let outputs = vec![
            check("ws", "/ws/out/f", "file", "").unwrap(),
            check("ws", "/ws/out/d", "dir", "").unwrap(),
            check("ws", "/ws/out/never", "file", "").unwrap(),
        ];
        prepare(scratch.path(), "", &outputs).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::write(scratch.path().join("ws/out/f"), b"x").unwrap();
        fs::set_permissions(
            scratch.path().join("ws/out/f"),
            fs::Permissions::from_mode(0o555),
        )
        .unwrap();
        fs::write(scratch.path().join("ws/out/d/inner"), b"y").unwrap();
        collect(scratch.path(), exec.path(), &outputs).unwrap();
        assert_eq!(fs::read(exec.path().join("ws/out/f")).unwrap(), b"x");
        let mode = fs::metadata(exec.path().join("ws/out/f"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o555);
        assert_eq!(fs::read(exec.path().join("ws/out/d/inner")).unwrap(), b"y");
        assert!(!exec.path().join("ws/out/never").exists());
        assert!(!scratch.path().join("ws/out/f").exists());
    }
}
