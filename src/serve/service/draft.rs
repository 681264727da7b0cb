//! A Create's layout drafted from its checked plan: a pure step over the
//! walked tree, where each input's content is, and the looks at default
//! places; nothing is made here.

use std::collections::{HashMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::Plan;
use crate::sandbox::default_place::{Batch, Looked, Place};
use crate::sandbox::file_kind::FileKind;
use crate::sandbox::layout::Draft;
use crate::sandbox::merkle::{Checked, FileEntry};
use crate::serve::error::Error;

/// Where the drafted mappings point besides the store and default places.
pub struct Holders<'a> {
    /// The workspace directory's writable stand-in.
    pub scratch_ws: &'a Path,
    /// Each symlink target's holder.
    pub links: &'a HashMap<Box<str>, PathBuf>,
    /// An empty read-only directory, for empty directories of the tree.
    pub empty: &'a Path,
}

/// The layout of sandbox `id`: the workspace directory writable over
/// `holders.scratch_ws`, writable directories, then every input
/// read-only. With `lazy`, only the directories on the outputs' and
/// writable directories' paths get their inputs here; the others whose
/// parents are among them are pushed to `lazy` (their paths in the walk)
/// and left out.
pub fn draft(
    id: &str,
    plan: &Plan,
    holders: &Holders,
    looks: &Batch,
    mut lazy: Option<&mut Vec<String>>,
) -> Result<Draft, Error> {
    let ws = plan.walked.top.as_str();
    let mut drafting = Drafting {
        draft: Draft::new(Some(id)),
        index: 0,
        path: String::with_capacity(256),
        here: Vec::with_capacity(512),
        store_path: Vec::with_capacity(256),
    };
    drafting.add(
        &format!("/{ws}"),
        holders.scratch_ws.as_os_str().as_bytes(),
        true,
        None,
    );
    for (path, host) in plan.writable.iter() {
        drafting.add(path, host.as_bytes(), true, None);
    }
    let kept = KeptWhole::of(plan);
    let mut first_file = 0;
    for (dir, entries) in &plan.walked.dirs {
        let files = first_file..first_file + entries.files.len();
        first_file = files.end;
        if let Some(lazy) = lazy.as_deref_mut() {
            if !kept.on_outputs_path(dir) {
                let parent = dir.rsplit_once('/').map_or("", |(parent, _)| parent);
                if !kept.on_outputs_path(parent) {
                    continue; // inside a lazy directory
                }
                if !entries.is_empty() {
                    lazy.push(dir.clone());
                    continue;
                }
                // Empty: mapped below, as in any draft.
            }
        }
        let in_store = &plan.content.each[files];
        drafting.add_dir(plan, holders, looks, (dir, entries), in_store)?;
        if entries.is_empty() && dir != ws && !kept.output_dirs.contains(dir.as_str()) {
            let empty = holders.empty.as_os_str().as_bytes();
            drafting.add(&format!("/{dir}"), empty, false, None);
        }
    }
    Ok(drafting.draft)
}

/// The directories a lazy draft keeps whole: those on an output's path
/// (an empty one there is the scratch one) and on a writable
/// directory's (a mapping the draft nests).
struct KeptWhole<'p> {
    workspace: &'p str,
    output_dirs: HashSet<&'p str>,
    writable_dirs: HashSet<&'p str>,
}

impl<'p> KeptWhole<'p> {
    fn of(plan: &'p Plan) -> KeptWhole<'p> {
        KeptWhole {
            workspace: plan.walked.top.as_str(),
            output_dirs: plan
                .outs
                .iter()
                .flat_map(|o| ancestors(&o.path, o.dir))
                .collect(),
            writable_dirs: plan
                .writable
                .iter()
                .flat_map(|(path, _)| ancestors(&path[1..], true))
                .collect(),
        }
    }

    fn on_outputs_path(&self, dir: &str) -> bool {
        dir == self.workspace || self.output_dirs.contains(dir) || self.writable_dirs.contains(dir)
    }
}

/// A draft being made: its mappings numbered in order, and one buffer
/// for every sandbox path, default place and store path (no allocation
/// per input).
struct Drafting {
    draft: Draft,
    index: usize,
    path: String,
    here: Vec<u8>,
    store_path: Vec<u8>,
}

impl Drafting {
    /// Inputs' types are known (store files and default places looked at
    /// are files, links ours), so the native build need not type them.
    fn add(&mut self, path: &str, underlying: &[u8], writable: bool, kind: Option<FileKind>) {
        match kind {
            Some(kind) => self
                .draft
                .add_known(self.index, path, underlying, writable, kind),
            None => self.draft.add(self.index, path, underlying, writable),
        }
        self.index += 1;
    }

    /// Directory `dir`'s files (each from the store where `in_store` says
    /// so, else its default place) and symlinks.
    fn add_dir(
        &mut self,
        plan: &Plan,
        holders: &Holders,
        looks: &Batch,
        (dir, entries): (&str, &Checked),
        in_store: &[bool],
    ) -> Result<(), Error> {
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        path.push('/');
        path.push_str(dir);
        path.push('/');
        let base = path.len();
        let looked = look_at_default_places(looks, plan.exec_root, dir, &entries.files, in_store);
        // A file found here is linked where the directory's path leads,
        // if known: an open in the sandbox then follows one link, not
        // also the exec root's links into the source tree.
        let mut here = std::mem::take(&mut self.here);
        here.clear();
        match &looked.resolved {
            Some(resolved) => here.extend_from_slice(resolved.as_os_str().as_bytes()),
            None => {
                here.extend_from_slice(plan.exec_root.as_os_str().as_bytes());
                here.push(b'/');
                here.extend_from_slice(dir.as_bytes());
            }
        }
        here.push(b'/');
        let here_base = here.len();
        let mut found = looked.places.into_iter();
        let file = Some(FileKind::RegularFile);
        let mut added = Ok(());
        for (entry, &stored) in entries.files.iter().zip(in_store) {
            path.truncate(base);
            path.push_str(&entry.name);
            if stored {
                let mut store_path = std::mem::take(&mut self.store_path);
                store_path.clear();
                plan.content.push_path(entry, &mut store_path);
                self.add(&path, &store_path, false, file);
                self.store_path = store_path;
                continue;
            }
            match found.next().expect("a look per default place") {
                Place::Here => {
                    here.truncate(here_base);
                    here.extend_from_slice(entry.name.as_bytes());
                    self.add(&path, &here, false, file);
                }
                Place::Elsewhere(target) => {
                    self.add(&path, target.as_os_str().as_bytes(), false, file)
                }
                Place::Refused(why) => {
                    added = Err(Error::DefaultPlace {
                        input: path[1..].to_owned(),
                        why,
                    });
                    break;
                }
            }
        }
        if added.is_ok() {
            for link in entries.symlinks.iter() {
                path.truncate(base);
                path.push_str(&link.name);
                let ours = holders.links[&*link.target].as_os_str().as_bytes();
                self.add(&path, ours, false, Some(FileKind::Symlink));
            }
        }
        (self.path, self.here) = (path, here);
        added
    }
}

/// How many mappings the sandbox of `plan` has: the workspace, the
/// writable directories, and each input file, symlink and empty directory
/// (as its draft would count them).
pub fn mapping_count(plan: &Plan) -> usize {
    let ws = plan.walked.top.as_str();
    let inputs: usize = plan
        .walked
        .dirs
        .iter()
        .map(|(dir, entries)| match entries.len() {
            0 => usize::from(dir != ws),
            n => n - entries.dirs.len(),
        })
        .sum();
    1 + plan.writable.len() + inputs
}

/// What is at the default place of each file of directory `dir` that has
/// no content in the store (`in_store` is false), in order.
fn look_at_default_places(
    looks: &Batch,
    exec_root: &Path,
    dir: &str,
    files: &[FileEntry],
    in_store: &[bool],
) -> Looked {
    if !in_store.contains(&false) {
        return Looked::unresolved(Vec::new());
    }
    let defaults: Vec<_> = files
        .iter()
        .zip(in_store)
        .filter(|(_, &stored)| !stored)
        .map(|(file, _)| (&*file.name, file.size))
        .collect();
    looks.look_resolving(&exec_root.join(dir), &defaults)
}

/// Every directory from the workspace down to `path` (itself too if it
/// is a directory).
fn ancestors(path: &str, is_dir: bool) -> impl Iterator<Item = &str> {
    let end = if is_dir { Some(path) } else { None };
    path.match_indices('/')
        .map(move |(at, _)| &path[..at])
        .chain(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestors_of_an_output() {
        let file: Vec<&str> = ancestors("ws/a/b/f", false).collect();
        assert_eq!(file, ["ws", "ws/a", "ws/a/b"]);
        let dir: Vec<&str> = ancestors("ws/a/d", true).collect();
        assert_eq!(dir, ["ws", "ws/a", "ws/a/d"]);
    }
}
