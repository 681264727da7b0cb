//! Laying a walked tree out on disk: directories first (parents before
//! children), then each directory's files and symlinks through its own
//! descriptor, so no path is resolved twice and none through a symlink.
//! All or nothing: on any failure the root is removed again.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use super::cas::Cas;
use super::{Mechanism, MissingBlob, StageError, Staged};
use crate::sandbox::dirfd::{c_name, DirFd};
use crate::sandbox::materialize::{
    self, copy_file, empty_dir, may_fall_back, remove_tree, Removed,
};
use crate::sandbox::merkle::{check_name, join, Checked, FileEntry, Walked};
use crate::sys;

/// How files are placed: the mechanism, and threads (0: by size).
#[derive(Clone, Copy, Debug)]
pub struct How {
    pub mechanism: Mechanism,
    pub threads: usize,
}

/// From this many files on, two threads place them (the native
/// materializer's measured threshold, which staging shares).
const PARALLEL_FROM: usize = materialize::PARALLEL_FROM;

/// Why an output's path cannot be made below the root.
#[derive(Debug, thiserror::Error)]
pub enum OutputPathError {
    #[error("output path {output:?}: {source}")]
    Name {
        output: String,
        source: crate::sandbox::merkle::BadName,
    },
    #[error("output path {output:?}: the input root holds {leaf:?} as a file or symlink")]
    ThroughALeaf { output: String, leaf: String },
}

/// The directories to make for `outputs` (paths relative to the root),
/// beyond those of the tree: each output's parent, and its ancestors.
/// Refuses a path that is not relative and normalized, or whose parent
/// would pass through a file or symlink of the tree.
pub fn output_parents(walked: &Walked, outputs: &[&str]) -> Result<Vec<String>, OutputPathError> {
    let dirs: HashMap<&str, &Checked> = walked
        .dirs
        .iter()
        .map(|(path, dir)| (path.as_str(), &**dir))
        .collect();
    let mut parents = Vec::new();
    let mut seen = HashSet::new();
    for output in outputs {
        for name in output.split('/') {
            check_name(name).map_err(|source| OutputPathError::Name {
                output: output.to_string(),
                source,
            })?;
        }
        let Some((parent, _)) = output.rsplit_once('/') else {
            continue;
        };
        let mut above = "";
        let ends = parent.match_indices('/').map(|(at, _)| at);
        for end in ends.chain([parent.len()]) {
            let path = &parent[..end];
            let name = path[above.len()..].trim_start_matches('/');
            if dirs.get(above).is_some_and(|dir| dir.has_leaf(name)) {
                return Err(OutputPathError::ThroughALeaf {
                    output: output.to_string(),
                    leaf: path.to_owned(),
                });
            }
            if !dirs.contains_key(path) && seen.insert(path) {
                parents.push(path.to_owned());
            }
            above = path;
        }
    }
    Ok(parents)
}

/// Makes the root at `staged.root` (missing, or an empty directory) and
/// everything in it.
pub fn build(
    cas: &Cas,
    how: How,
    walked: &Walked,
    parents: &[String],
    mut staged: Staged,
) -> Result<Staged, StageError> {
    let at = staged.root.clone();
    let (root, made) = open_destination(&at)?;
    staged.dirs = usize::from(made);
    let built = fill(cas, how, walked, &root, &mut staged)
        .and_then(|()| make_parents(&root, parents, &mut staged));
    match built {
        Ok(()) => Ok(staged),
        Err(err) => {
            let cleaned = if made {
                drop(root);
                remove_tree(&at).map(drop)
            } else {
                empty_dir(&root, &at, &mut Removed::default())
            };
            if let Err(cleanup) = cleaned {
                log::error!("staging {at:?} failed, and so did removing it: {cleanup}");
            }
            Err(err)
        }
    }
}

/// Opens destination `at`, making it if it is missing; an existing one
/// must be an empty directory (not a symlink to one). Returns whether it
/// was made.
pub fn open_destination(at: &Path) -> Result<(DirFd, bool), StageError> {
    let fail = |syscall, err| StageError::Io(materialize::Error::new(syscall, at, err));
    let made = match std::fs::create_dir(at) {
        Ok(()) => true,
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => false,
        Err(err) => return Err(fail("mkdir", err)),
    };
    let root = DirFd::open(at).map_err(|err| fail("open", err))?;
    if !made {
        let mut listing = root.entries().map_err(|err| fail("opendir", err))?;
        if listing.iter().next().is_some() {
            return Err(StageError::Invalid(format!(
                "destination {at:?} exists and is not empty"
            )));
        }
    }
    Ok((root, made))
}

/// Makes every directory, file and symlink of `walked` below `root`,
/// whose paths are relative to it.
pub fn fill(
    cas: &Cas,
    how: How,
    walked: &Walked,
    root: &DirFd,
    staged: &mut Staged,
) -> Result<(), StageError> {
    let mechanism = how.mechanism;
    let io_error = |syscall, path: &str, err| io_error(syscall, &staged.root, path, err);
    // Directories, parents first (the walk's order), each opened once.
    let mut fds = Vec::with_capacity(walked.dirs.len());
    for (path, _) in &walked.dirs {
        if path.is_empty() {
            fds.push(None);
            continue;
        }
        let name = c_name(path.as_ref()).map_err(|err| io_error("mkdir", path, err))?;
        root.mkdir_at(&name, 0o755)
            .map_err(|err| io_error("mkdir", path, err))?;
        fds.push(Some(
            root.open_at(&name)
                .map_err(|err| io_error("open", path, err))?,
        ));
        staged.dirs += 1;
    }
    let fds: Vec<&DirFd> = fds.iter().map(|fd| fd.as_ref().unwrap_or(root)).collect();
    for ((path, dir), fd) in walked.dirs.iter().zip(&fds) {
        for link in dir.symlinks.iter() {
            let name = CString::new(&*link.name).expect("checked: no NUL");
            let target = CString::new(&*link.target).expect("checked: no NUL");
            fd.symlink_at(&target, &name)
                .map_err(|err| io_error("symlink", &join(path, &link.name), err))?;
        }
    }
    // Files, on two threads from PARALLEL_FROM on: halves of the list of
    // every file, so that one large directory is split too.
    let files: Vec<(usize, &FileEntry)> = walked
        .dirs
        .iter()
        .enumerate()
        .flat_map(|(at, (_, dir))| dir.files.iter().map(move |file| (at, file)))
        .collect();
    let place_files = |files: &[(usize, &FileEntry)]| -> Result<Placed, StageError> {
        let mut placed = Placed::default();
        for (at, file) in files {
            let (path, fd) = (&walked.dirs[*at].0, fds[*at]);
            match place_file(cas, mechanism, fd, path, file, &staged.root)? {
                None => placed.files += 1,
                Some(missing) => placed.missing.push(missing),
            }
        }
        Ok(placed)
    };
    let (first, second) = in_halves(&files, two_threads(how.threads, files.len()), place_files);
    let mut placed = first?;
    if let Some(second) = second {
        let second = second?;
        placed.files += second.files;
        placed.missing.extend(second.missing);
    }
    staged.files += placed.files;
    if !placed.missing.is_empty() {
        return Err(StageError::Missing(placed.missing));
    }
    Ok(())
}

/// Whether files are placed (or looked at) on two threads: `threads`
/// as the stager was told (1 or 2), or 0: by number of files.
pub fn two_threads(threads: usize, files: usize) -> bool {
    match threads {
        0 => files >= PARALLEL_FROM,
        n => n >= 2,
    }
}

/// `work` on `items`, or on each half of them, the second on a thread of
/// its own, when `two`: the first half's result, then the second's.
pub fn in_halves<T: Sync, R: Send>(
    items: &[T],
    two: bool,
    work: impl Fn(&[T]) -> R + Sync,
) -> (R, Option<R>) {
    if !two {
        return (work(items), None);
    }
    let (first, second) = items.split_at(items.len() / 2);
    std::thread::scope(|scope| {
        let other = scope.spawn(|| work(second));
        let first = work(first);
        (
            first,
            Some(other.join().expect("no panic in a half's work")),
        )
    })
}

/// Makes file `file` of directory `dir` (at `dir_path` in the root at
/// `root`) from its blob; `Ok(Some(..))` names the blob if the CAS lacks it.
pub fn place_file(
    cas: &Cas,
    mechanism: Mechanism,
    dir: &DirFd,
    dir_path: &str,
    file: &FileEntry,
    root: &Path,
) -> Result<Option<MissingBlob>, StageError> {
    let name = CString::new(&*file.name).expect("checked: no NUL");
    let source = cas.source(&file.hash, file.size, file.executable);
    match source.and_then(|(source, blob)| place(mechanism, source, &blob, dir, &name)) {
        Ok(()) => Ok(None),
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok(Some(MissingBlob {
            what: "file",
            hash: file.hash.to_string(),
            size: file.size,
            path: join(dir_path, &file.name),
        })),
        Err(err) => Err(io_error("link", root, &join(dir_path, &file.name), err)),
    }
}

/// Files placed by one thread, and blobs it found missing.
#[derive(Default)]
struct Placed {
    files: usize,
    missing: Vec<MissingBlob>,
}

/// Makes the directories outputs need (`output_parents`) below `root`;
/// one the tree already has is kept.
pub fn make_parents(
    root: &DirFd,
    parents: &[String],
    staged: &mut Staged,
) -> Result<(), StageError> {
    make_dirs(root, parents.iter().map(String::as_str), staged, true)
}

/// Makes directories `paths` (parents first) below `root`, counting them
/// in `staged`. One that exists is an error unless `existing_ok`.
pub fn make_dirs<'a>(
    root: &DirFd,
    paths: impl IntoIterator<Item = &'a str>,
    staged: &mut Staged,
    existing_ok: bool,
) -> Result<(), StageError> {
    for path in paths {
        let fail = |err| io_error("mkdir", &staged.root, path, err);
        let name = c_name(path.as_ref()).map_err(fail)?;
        match root.mkdir_at(&name, 0o755) {
            Ok(()) => staged.dirs += 1,
            Err(err) if existing_ok && err.raw_os_error() == Some(libc::EEXIST) => {}
            Err(err) => return Err(fail(err)),
        }
    }
    Ok(())
}

pub fn io_error(syscall: &'static str, root: &Path, path: &str, err: io::Error) -> StageError {
    StageError::Io(materialize::Error::new(
        syscall,
        &staged_path(root, path),
        err,
    ))
}

/// Makes `name` in `dest` from blob `blob` of `source` by `mechanism`.
pub fn place(
    mechanism: Mechanism,
    source: &DirFd,
    blob: &CString,
    dest: &DirFd,
    name: &CString,
) -> io::Result<()> {
    let clone = || sys::clone_file(source.as_fd(), blob, dest.as_fd(), name);
    let copy = || copy_file(source.as_fd(), blob, dest, name);
    match mechanism {
        Mechanism::Hardlink => dest.link_at(source.as_fd(), blob, name),
        Mechanism::Clone => clone(),
        Mechanism::Copy => copy(),
        Mechanism::Auto => match dest.link_at(source.as_fd(), blob, name) {
            Err(err) if may_fall_back(&err) => match clone() {
                Err(err) if may_fall_back(&err) => copy(),
                cloned => cloned,
            },
            linked => linked,
        },
    }
}

/// Where `path` (relative, "" for the root itself) is below `root`.
pub fn staged_path(root: &Path, path: &str) -> std::path::PathBuf {
    if path.is_empty() {
        root.to_owned()
    } else {
        root.join(path)
    }
}
