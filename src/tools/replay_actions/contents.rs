//! `--experimental_inmemory_sandbox_stashes` (Bazel 7.2+): what a stash
//! holds, remembered instead of read back from the disk. `SandboxStash.java`
//! and `SandboxHelpers.StashContents` (the 7.2+ copy at Pixeebot-2-0/bazel
//! 7d56deee):
//! - the record is made from the inputs and directories the sandbox was
//!   built with (`createContentMap`), and the time it was built
//!   (`setLastModified`);
//! - when the sandbox is stashed, a background thread
//!   (`stashFileListingPool`) brings it up to date
//!   (`listContentsRecursively`): a directory whose ctime is after that
//!   time is read again, and in it a symlink the record has stays only if
//!   its ctime (through the link: Bazel's `Path.stat()` follows it) is not
//!   after that time, anything else unknown is deleted; a directory not
//!   changed is only descended;
//! - the next action of the mnemonic compares its inputs with the record:
//!   no readdir, no readlink.
//!
//! Bazel compares milliseconds (`currentTimeMillis` against
//! `getLastChangeTime`), and so does this: a change by the action within
//! the millisecond (or the clock tick, on a kernel without fine-grained
//! ctimes) of the record goes unseen, as in Bazel.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::run::remove;
use super::Error;

/// One directory of a stash, as recorded.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Contents {
    pub entries: HashMap<OsString, Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A symlink to this target.
    Link(PathBuf),
    /// An empty regular file (an input with no bytes of its own).
    File,
    Dir(Contents),
}

impl Contents {
    /// The directory at `rel` (names split on `/`), made if missing.
    pub fn dir_mut(&mut self, rel: &str) -> &mut Contents {
        let mut at = self;
        for name in rel.split('/').filter(|n| !n.is_empty()) {
            let entry = at
                .entries
                .entry(OsString::from(name))
                .or_insert_with(|| Entry::Dir(Contents::default()));
            if !matches!(entry, Entry::Dir(_)) {
                *entry = Entry::Dir(Contents::default());
            }
            let Entry::Dir(next) = entry else {
                unreachable!("made a directory just above")
            };
            at = next;
        }
        at
    }

    /// Records `entry` at `rel`, its directories too.
    pub fn put(&mut self, rel: &str, entry: Entry) {
        let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        self.dir_mut(dir)
            .entries
            .insert(OsString::from(name), entry);
    }
}

/// Milliseconds since the epoch, as Java's `System.currentTimeMillis`.
pub fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn ctime_millis(meta: &fs::Metadata) -> i64 {
    meta.ctime() * 1000 + meta.ctime_nsec() / 1_000_000
}

/// `listContentsRecursively`: brings `contents`, the record of the
/// directory `root`, up to date with what the action changed after
/// `since` (ms), deleting what the record does not know. Ok(false) if
/// `root` is gone: a recorded directory moved away (a tree artifact output)
/// within the millisecond or clock tick of `since`, which its parent's
/// ctime did not show. Bazel's `statIfFound()` then returns null and the
/// listing fails; the record forgets it instead.
pub fn refresh(root: &Path, since: i64, contents: &mut Contents) -> Result<bool, Error> {
    let meta = match fs::symlink_metadata(root) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(Error::io("stat", root, err)),
    };
    if ctime_millis(&meta) <= since {
        let mut gone = Vec::new();
        for (name, entry) in &mut contents.entries {
            if let Entry::Dir(sub) = entry {
                if !refresh(&root.join(name), since, sub)? {
                    gone.push(name.clone());
                }
            }
        }
        for name in gone {
            contents.entries.remove(&name);
        }
        return Ok(true);
    }
    let listed = fs::read_dir(root).map_err(|err| Error::io("readdir", root, err))?;
    let mut seen: HashSet<OsString> = HashSet::new();
    for dirent in listed {
        let dirent = dirent.map_err(|err| Error::io("readdir", root, err))?;
        let name = dirent.file_name();
        let path = dirent.path();
        let kind = dirent
            .file_type()
            .map_err(|err| Error::io("lstat", &path, err))?;
        let known = contents.entries.get_mut(&name);
        if kind.is_symlink() {
            // A target that is gone counts as changed (Bazel's stat throws
            // and turns reuse off; dropping the link is the milder choice).
            let unchanged = fs::metadata(&path).is_ok_and(|m| ctime_millis(&m) <= since);
            if matches!(known, Some(Entry::Link(_) | Entry::File)) && unchanged {
                seen.insert(name);
            } else {
                unlink(&path)?;
            }
        } else if kind.is_dir() {
            match known {
                Some(Entry::Dir(sub)) => {
                    if refresh(&path, since, sub)? {
                        seen.insert(name);
                    }
                }
                _ => remove(&path)?,
            }
        } else {
            // Bazel deletes every regular file here, recorded or not.
            unlink(&path)?;
        }
    }
    contents.entries.retain(|name, _| seen.contains(name));
    Ok(true)
}

/// Unlinks a non-directory; already gone is fine.
pub fn unlink(path: &Path) -> Result<(), Error> {
    match fs::remove_file(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(Error::io("unlink", path, err)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn refresh_forgets_and_deletes_what_the_action_changed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("execroot");
        fs::create_dir_all(root.join("ws/keep")).unwrap();
        fs::create_dir_all(root.join("ws/gone")).unwrap();
        let target = dir.path().join("target");
        fs::write(&target, "x").unwrap();
        symlink(&target, root.join("ws/keep/link")).unwrap();
        symlink(&target, root.join("ws/keep/removed")).unwrap();
        let mut record = Contents::default();
        record.put("ws/keep/link", Entry::Link(target.clone()));
        record.put("ws/keep/removed", Entry::Link(target.clone()));
        record.put("ws/gone/x", Entry::File);
        let before = record.clone();
        // Nothing changed since: the record stays as it is.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let since = now_millis();
        // Past a clock tick (10 ms at HZ=100): a change's ctime is the
        // tick's time, which lags the clock `since` was read from.
        std::thread::sleep(std::time::Duration::from_millis(25));
        assert!(refresh(&root, since, &mut record).unwrap());
        assert_eq!(record, before);
        // A recorded directory gone unseen (its parent's ctime not after
        // `since`, as within a clock tick): forgotten, not an error.
        let mut stale = before.clone();
        stale.put("ws/keep/moved/x", Entry::File);
        let far_future = since + 3_600_000;
        assert!(refresh(&root, far_future, &mut stale).unwrap());
        assert_eq!(stale, before);
        // The action removes a link, writes an unknown file, a directory.
        fs::remove_file(root.join("ws/keep/removed")).unwrap();
        fs::write(root.join("ws/keep/undeclared"), "u").unwrap();
        fs::create_dir(root.join("ws/keep/newdir")).unwrap();
        assert!(refresh(&root, since, &mut record).unwrap());
        let Some(Entry::Dir(ws)) = record.entries.get(std::ffi::OsStr::new("ws")) else {
            panic!("{record:?}")
        };
        let Some(Entry::Dir(keep)) = ws.entries.get(std::ffi::OsStr::new("keep")) else {
            panic!("{record:?}")
        };
        let names: Vec<_> = keep.entries.keys().cloned().collect();
        assert_eq!(names, [OsString::from("link")]);
        assert!(!root.join("ws/keep/undeclared").exists());
        assert!(!root.join("ws/keep/newdir").exists());
        assert!(fs::symlink_metadata(root.join("ws/keep/link")).is_ok());
    }
}
