//! Declared outputs: where the action writes them (the sandbox's scratch
//! directory, behind the writable workspace directory), and how Collect
//! moves them out.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString, OsStr};
use std::fs::{self, Permissions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, AT_FDCWD};
use nix::sys::stat::{utimensat, FileStat, Mode, UtimensatFlags};
use nix::sys::time::TimeSpec;

use crate::sandbox::dirfd::beneath::open_beneath;
use crate::sandbox::dirfd::{kind_of, open_file_at, readlink_at, DirFd};
use crate::sandbox::file_kind::FileKind;
use crate::sandbox::materialize::{remove_entry, remove_tree, Removed};
use crate::sandbox::merkle::{check_name, BadName, Checked, Walked};

/// One declared output, checked.
#[derive(Clone, Debug)]
pub struct Output {
    /// In-sandbox path, relative to the sandbox root (`ws/bazel-out/...`).
    pub path: String,
    /// Where Collect puts it, relative to Collect's exec root.
    pub dest: String,
    pub dir: bool,
}

/// Why a declared output was refused, or could not be made or collected.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("output {key:?}: {why}")]
    Key { key: String, why: PathFault },
    #[error("output {key:?}: destination {dest:?}: {why}")]
    Destination {
        key: String,
        dest: String,
        why: PathFault,
    },
    #[error("output {key:?}: type {kind:?} is neither \"file\" nor \"dir\"")]
    Type { key: String, kind: String },
    #[error("output {output:?}: the input tree holds {holds:?} as a file or symlink")]
    InTheTree { output: String, holds: String },
    #[error("output {0:?}: a directory output the input tree already holds")]
    DirectoryInTheTree(String),
    #[error("mkdir {path:?}: {source}")]
    Mkdir { path: PathBuf, source: io::Error },
    #[error("open {scratch:?}: {source}")]
    OpenScratch { scratch: PathBuf, source: io::Error },
    #[error("output {output:?}: {why}")]
    NotCollected { output: String, why: CollectFault },
}

/// What is wrong with a path a manifest names.
#[derive(Debug, thiserror::Error)]
pub enum PathFault {
    #[error("not absolute (it must start with /<workspace>/)")]
    NotInTheWorkspaceForm,
    #[error("not absolute")]
    NotAbsolute,
    #[error("not inside the workspace /{0}")]
    OutsideTheWorkspace(String),
    #[error("names the workspace itself")]
    TheWorkspaceItself,
    #[error("the sandbox root cannot be a writable directory")]
    TheSandboxRoot,
    #[error(transparent)]
    Name(BadName),
}

/// Why an output the action made was not moved out.
#[derive(Debug, thiserror::Error)]
pub enum CollectFault {
    #[error("a symlink the action put on its path below {0:?} is not followed: not collected")]
    SymlinkOnItsPath(PathBuf),
    #[error("something on its path below {0:?} is no longer a directory: not collected")]
    NoLongerADirectory(PathBuf),
    #[error("{syscall} {path:?}: {source}")]
    Io {
        syscall: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("rename {from:?} to {to:?}: {source}")]
    Rename {
        from: PathBuf,
        to: PathBuf,
        source: io::Error,
    },
    #[error("copy {from:?} to {to:?}: {source}")]
    Copy {
        from: PathBuf,
        to: PathBuf,
        source: io::Error,
    },
    #[error("removing what was at {to:?}: {source}")]
    Replace {
        to: PathBuf,
        source: crate::sandbox::materialize::Error,
    },
    #[error("after copying {from:?}: {source}")]
    AfterCopy {
        from: PathBuf,
        source: crate::sandbox::materialize::Error,
    },
}

/// Checks an output's key (`/<workspace>/<path>`), type and destination.
pub fn check(workspace: &str, key: &str, kind: &str, dest: &str) -> Result<Output, OutputError> {
    let path = relative_in_workspace(workspace, key).map_err(|why| OutputError::Key {
        key: key.to_owned(),
        why,
    })?;
    let dest = if dest.is_empty() {
        path.clone()
    } else {
        relative_in_workspace(workspace, dest).map_err(|why| OutputError::Destination {
            key: key.to_owned(),
            dest: dest.to_owned(),
            why,
        })?
    };
    let dir = match kind {
        "file" => false,
        "dir" => true,
        other => {
            return Err(OutputError::Type {
                key: key.to_owned(),
                kind: other.to_owned(),
            })
        }
    };
    Ok(Output { path, dest, dir })
}

/// `/<workspace>/a/b` as `<workspace>/a/b`, refusing anything outside the
/// workspace or not normalized.
fn relative_in_workspace(workspace: &str, key: &str) -> Result<String, PathFault> {
    let rest = key
        .strip_prefix('/')
        .ok_or(PathFault::NotInTheWorkspaceForm)?;
    let mut components = rest.split('/');
    if components.next() != Some(workspace) {
        return Err(PathFault::OutsideTheWorkspace(workspace.to_owned()));
    }
    let mut any = false;
    for component in components {
        check_name(component).map_err(PathFault::Name)?;
        any = true;
    }
    if !any {
        return Err(PathFault::TheWorkspaceItself);
    }
    Ok(rest.to_owned())
}

/// Checks a writable directory's sandbox path (`/tmp`, `/<ws>/x`): absolute,
/// normalized, not the root.
pub fn check_sandbox_path(path: &str) -> Result<(), PathFault> {
    let rest = path.strip_prefix('/').ok_or(PathFault::NotAbsolute)?;
    if rest.is_empty() {
        return Err(PathFault::TheSandboxRoot);
    }
    rest.split('/')
        .try_for_each(check_name)
        .map_err(PathFault::Name)
}

/// Refuses an output the input tree already holds as a file or symlink,
/// or below one (the action could not write it), and a directory output
/// the tree holds as a directory.
pub fn check_against_tree(outputs: &[Output], walked: &Walked) -> Result<(), OutputError> {
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
                return Err(OutputError::InTheTree {
                    output: output.path.clone(),
                    holds: prefix.to_owned(),
                });
            }
            prefix = parent;
        }
        if output.dir && dirs.contains_key(output.path.as_str()) {
            return Err(OutputError::DirectoryInTheTree(output.path.clone()));
        }
    }
    Ok(())
}

/// Makes, below `scratch` (the sandbox root's stand-in), each file
/// output's parent and each directory output itself, writable and empty;
/// `made` (the workspace directory, say) is there already.
pub fn prepare(scratch: &Path, made: &str, outputs: &[Output]) -> Result<(), OutputError> {
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
                Err(source) => return Err(OutputError::Mkdir { path, source }),
            }
            made.insert(level);
        }
    }
    Ok(())
}

/// Moves every output that exists below `scratch` to `exec_root`/dest: a
/// rename, or a copy keeping modes where the two are on different file
/// systems. An output the action did not make is left for Bazel to report.
///
/// The action could write its scratch directory, so an output's
/// directories are opened below `scratch` following no symlink: one the
/// action put on the way (say, to the user's home) would otherwise have
/// Collect, which runs outside the jail, move, copy or delete what lies
/// there. Such an output is refused, as is a FIFO, socket or device to be
/// copied (opening it could wait forever).
pub fn collect(scratch: &Path, exec_root: &Path, outputs: &[Output]) -> Result<(), OutputError> {
    let root = DirFd::open(scratch).map_err(|source| OutputError::OpenScratch {
        scratch: scratch.to_owned(),
        source,
    })?;
    // Outputs come sorted by path: those of one directory one after
    // another, which is opened once for them (an object file and its .d).
    let mut opened: Option<(&str, DirFd)> = None;
    for output in outputs {
        let (parent, name) = output
            .path
            .rsplit_once('/')
            .expect("an output's path is below the workspace directory");
        let from = scratch.join(&output.path);
        let refused = |why: CollectFault| OutputError::NotCollected {
            output: output.path.clone(),
            why,
        };
        let reuse = opened.take().filter(|(at, _)| *at == parent);
        let dir = match reuse.map_or_else(|| open_dir_beneath(&root, parent), |(_, dir)| Ok(dir)) {
            Ok(dir) => dir,
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(err) => {
                return Err(refused(match err.raw_os_error() {
                    Some(libc::ELOOP) => CollectFault::SymlinkOnItsPath(scratch.to_owned()),
                    Some(libc::ENOTDIR) => CollectFault::NoLongerADirectory(scratch.to_owned()),
                    _ => CollectFault::Io {
                        syscall: "open",
                        path: scratch.join(parent),
                        source: err,
                    },
                }))
            }
        };
        let name = CString::new(name).expect("output paths hold no NUL");
        let dir = &opened.insert((parent, dir)).1;
        match dir.stat_at(&name) {
            Ok(_) => {}
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(source) => {
                return Err(refused(CollectFault::Io {
                    syscall: "lstat",
                    path: from,
                    source,
                }))
            }
        }
        let to = exec_root.join(&output.dest);
        move_output(dir, &name, &from, &to).map_err(refused)?;
    }
    Ok(())
}

/// Directory `rel` below `root`, reached through no symlink.
fn open_dir_beneath(root: &DirFd, rel: &str) -> io::Result<DirFd> {
    let rel = CString::new(rel).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    open_beneath(
        root.as_fd(),
        &rel,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        Mode::empty(),
    )
    .map(DirFd::from_owned)
}

/// Moves entry `name` of `dir` (at `from`) to `to`.
fn move_output(dir: &DirFd, name: &CStr, from: &Path, to: &Path) -> Result<(), CollectFault> {
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent).map_err(|source| CollectFault::Io {
            syscall: "mkdir",
            path: parent.to_owned(),
            source,
        })?;
    }
    // What a previous build left there, read-only directories included.
    if fs::symlink_metadata(to).is_ok() {
        remove_tree(to).map_err(|source| CollectFault::Replace {
            to: to.to_owned(),
            source,
        })?;
    }
    match nix::fcntl::renameat(dir, name, nix::fcntl::AT_FDCWD, to) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EXDEV) => {
            copy_tree(dir, name, from, to).map_err(|source| CollectFault::Copy {
                from: from.to_owned(),
                to: to.to_owned(),
                source,
            })?;
            let parent = from.parent().expect("an output has a parent");
            let mut removed = Removed::default();
            remove_entry(dir, parent, name, None, &mut removed).map_err(|source| {
                CollectFault::AfterCopy {
                    from: from.to_owned(),
                    source,
                }
            })
        }
        Err(errno) => Err(CollectFault::Rename {
            from: from.to_owned(),
            to: to.to_owned(),
            source: errno.into(),
        }),
    }
}

/// A copy of entry `name` of `dir` (at `from`): a file, symlink or
/// directory tree, modes and times kept (as a rename keeps them), read
/// through descriptors that follow no symlink.
fn copy_tree(dir: &DirFd, name: &CStr, from: &Path, to: &Path) -> io::Result<()> {
    let st = dir.stat_at(name)?;
    copy_entry(dir, name, from, to, &st)?;
    // Last: writing a directory's entries moves its times.
    #[allow(clippy::unnecessary_cast)] // time fields differ by platform
    let (atime, mtime) = (
        TimeSpec::new(st.st_atime as _, st.st_atime_nsec as _),
        TimeSpec::new(st.st_mtime as _, st.st_mtime_nsec as _),
    );
    utimensat(
        AT_FDCWD,
        to,
        &atime,
        &mtime,
        UtimensatFlags::NoFollowSymlink,
    )
    .map_err(|err| io::Error::other(format!("utimensat {to:?}: {err}")))
}

fn copy_entry(dir: &DirFd, name: &CStr, from: &Path, to: &Path, st: &FileStat) -> io::Result<()> {
    // st_mode is u16 on macOS.
    #[allow(clippy::unnecessary_cast)]
    let mode = Permissions::from_mode(st.st_mode as u32 & 0o7777);
    match kind_of(st) {
        FileKind::Symlink => {
            let target = readlink_at(dir.as_fd(), name)?;
            std::os::unix::fs::symlink(OsStr::from_bytes(target.to_bytes()), to)
        }
        FileKind::Directory => {
            let sub = dir.open_at(name)?;
            fs::create_dir(to)?;
            for entry in sub.entries()?.iter() {
                let (child, _, _) = entry?;
                let shown = OsStr::from_bytes(child.to_bytes());
                copy_tree(&sub, &child, &from.join(shown), &to.join(shown))?;
            }
            fs::set_permissions(to, mode)
        }
        FileKind::RegularFile => {
            let mut source = open_file_at(dir.as_fd(), name)?;
            let mut target = fs::File::create_new(to)?;
            io::copy(&mut source, &mut target)?;
            target.set_permissions(mode)
        }
        FileKind::NamedPipe | FileKind::Socket | FileKind::CharDevice | FileKind::BlockDevice => {
            Err(io::Error::other(format!(
                "{from:?} is a FIFO, socket or device, which is not copied"
            )))
        }
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

    /// Scratch directories for Collect into an exec root made with
    /// `tempfile::tempdir()`: one on the exec root's file system (a
    /// rename), one on /dev/shm where this machine has it (a copy, then a
    /// removal).
    fn scratch_dirs() -> [tempfile::TempDir; 2] {
        let shm = Path::new("/dev/shm");
        let on_shm = match shm.is_dir() {
            true => tempfile::tempdir_in(shm).unwrap(),
            false => tempfile::tempdir().unwrap(),
        };
        [tempfile::tempdir().unwrap(), on_shm]
    }

    /// The action may replace its outputs' directories (made by `prepare`
    /// in its writable scratch directory) with symlinks out of the
    /// sandbox; Collect, which runs outside the jail, must not follow one
    /// to move, copy or delete what lies there.
    #[test]
    fn collect_follows_no_symlink_the_action_put_on_an_outputs_path() {
        for scratch in scratch_dirs() {
            let exec = tempfile::tempdir().unwrap();
            let outside = tempfile::tempdir().unwrap();
            fs::create_dir(outside.path().join("sub")).unwrap();
            fs::write(outside.path().join("sub/f"), b"not the action's").unwrap();
            fs::create_dir(outside.path().join("sub/d")).unwrap();
            fs::write(outside.path().join("sub/d/g"), b"nor this").unwrap();
            let outputs = vec![
                check("ws", "/ws/out/sub/f", "file", "").unwrap(),
                check("ws", "/ws/out/sub/d", "dir", "").unwrap(),
            ];
            prepare(scratch.path(), "", &outputs).unwrap();
            fs::remove_dir_all(scratch.path().join("ws/out")).unwrap();
            std::os::unix::fs::symlink(outside.path(), scratch.path().join("ws/out")).unwrap();

            let err = collect(scratch.path(), exec.path(), &outputs).unwrap_err();
            assert!(
                matches!(&err, OutputError::NotCollected {
                    output,
                    why: CollectFault::SymlinkOnItsPath(_),
                } if output == "ws/out/sub/f"),
                "{err}"
            );
            assert_eq!(
                fs::read(outside.path().join("sub/f")).unwrap(),
                b"not the action's"
            );
            assert_eq!(
                fs::read(outside.path().join("sub/d/g")).unwrap(),
                b"nor this"
            );
            assert!(!exec.path().join("ws/out/sub/f").exists());
            assert!(!exec.path().join("ws/out/sub/d").exists());
        }
    }

    /// A FIFO or socket output is refused, not opened (a copy would wait
    /// for a writer that never comes).
    #[test]
    fn collect_across_file_systems_refuses_a_fifo_output() {
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            return;
        }
        let scratch = tempfile::tempdir_in(shm).unwrap();
        let exec = tempfile::tempdir().unwrap();
        let outputs = vec![check("ws", "/ws/out/p", "file", "").unwrap()];
        prepare(scratch.path(), "", &outputs).unwrap();
        nix::unistd::mkfifo(
            &scratch.path().join("ws/out/p"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        use std::os::unix::fs::MetadataExt;
        let same_fs =
            fs::metadata(scratch.path()).unwrap().dev() == fs::metadata(exec.path()).unwrap().dev();
        let collected = collect(scratch.path(), exec.path(), &outputs);
        if same_fs {
            // A rename moves the FIFO itself, as Bazel would.
            collected.unwrap();
        } else {
            let err = collected.unwrap_err();
            assert!(
                matches!(&err, OutputError::NotCollected {
                    output,
                    why: CollectFault::Copy { .. },
                } if output == "ws/out/p"),
                "{err}"
            );
            assert!(err.to_string().contains("FIFO"), "{err}");
        }
    }

    #[test]
    fn collect_moves_outputs_and_leaves_missing_ones() {
        for scratch in scratch_dirs() {
            let exec = tempfile::tempdir().unwrap();
            let outputs = vec![
                check("ws", "/ws/out/f", "file", "").unwrap(),
                check("ws", "/ws/out/d", "dir", "").unwrap(),
                check("ws", "/ws/out/never", "file", "").unwrap(),
            ];
            prepare(scratch.path(), "", &outputs).unwrap();
            fs::write(scratch.path().join("ws/out/f"), b"x").unwrap();
            fs::set_permissions(
                scratch.path().join("ws/out/f"),
                fs::Permissions::from_mode(0o555),
            )
            .unwrap();
            fs::write(scratch.path().join("ws/out/d/inner"), b"y").unwrap();
            fs::create_dir(scratch.path().join("ws/out/d/sub")).unwrap();
            std::os::unix::fs::symlink("../inner", scratch.path().join("ws/out/d/sub/link"))
                .unwrap();
            collect(scratch.path(), exec.path(), &outputs).unwrap();
            assert_eq!(fs::read(exec.path().join("ws/out/f")).unwrap(), b"x");
            let mode = fs::metadata(exec.path().join("ws/out/f"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o555);
            assert_eq!(fs::read(exec.path().join("ws/out/d/inner")).unwrap(), b"y");
            assert_eq!(
                fs::read_link(exec.path().join("ws/out/d/sub/link")).unwrap(),
                Path::new("../inner")
            );
            assert!(!exec.path().join("ws/out/never").exists());
            assert!(!scratch.path().join("ws/out/f").exists());
            assert!(!scratch.path().join("ws/out/d").exists());
        }
    }
}
