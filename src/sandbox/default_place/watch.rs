//! Which directories changed since a look: an inotify watch on every
//! directory a default place's path passes through, and a count of the
//! events each has seen. Reads of files make no event (none is asked
//! for), so watching costs nothing while a build only reads its sources.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// File systems whose changes inotify reports whoever makes them: the
/// local ones (an overlay's through itself, as a container makes them).
/// On a network file system another machine's writes make no event, so
/// its default places are looked at every time.
const LOCAL: [i64; 7] = [
    0xEF53,      // ext2, ext3, ext4
    0x5846_5342, // xfs
    0x9123_683E, // btrfs
    0x0102_1994, // tmpfs
    0xF2F5_2010, // f2fs
    0x8584_58F6, // ramfs
    0x794C_7630, // overlayfs
];

/// Watches held at most: the limit is per user (`max_user_watches`,
/// 8,192 on older kernels) and shared with editors and IDEs, which must
/// not run out because a build ran. Beyond, directories are looked at
/// every time.
const MOST_WATCHES: usize = 4096;

/// Paths whose way is kept at most (each made again when next asked).
const MOST_WAYS: usize = 1 << 18;

/// What changes a directory's entries: an entry made, removed or
/// renamed; the directory itself moved or removed. All a directory only
/// on some path's way needs, and cheap to ask for: no event of its
/// entries' own, so the kernel need not mark every entry it has cached
/// there (a watch asking for those cost tens of ms on a busy `/tmp`).
fn entries_changed() -> AddWatchFlags {
    AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

/// What changes a directory whose files were looked at: its entries (as
/// above), and a file in it written, truncated or its mode changed, or
/// the directory's own mode.
fn files_changed() -> AddWatchFlags {
    entries_changed()
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_CLOSE_WRITE
}

/// Why a directory is watched, which decides what is asked of its watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    /// On the way to a directory whose files are looked at.
    Way,
    /// Its files are looked at.
    Leaf,
}

impl Role {
    fn mask(self) -> AddWatchFlags {
        match self {
            Role::Way => entries_changed(),
            Role::Leaf => files_changed(),
        }
    }
}

/// A watch held, and what was asked of it.
#[derive(Debug, Clone, Copy)]
struct Watched {
    wd: WatchDescriptor,
    role: Role,
}

/// Events after which some events may be lost: everything concluded
/// from the watches is void.
fn lost_track() -> AddWatchFlags {
    AddWatchFlags::IN_Q_OVERFLOW | AddWatchFlags::IN_UNMOUNT
}

/// Events after which a watch is gone or watches a directory no longer
/// at its path (its parent's event, on the way, says so).
fn gone() -> AddWatchFlags {
    AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF | AddWatchFlags::IN_IGNORED
}

/// An entry of a watched directory: the directory's watch and a hash of
/// the entry's name (two names sharing a hash only look again sooner).
type Entry = (WatchDescriptor, u64);

fn entry(wd: WatchDescriptor, name: &OsStr) -> Entry {
    let mut hasher = DefaultHasher::new();
    name.hash(&mut hasher);
    (wd, hasher.finish())
}

pub struct Watch {
    inotify: Inotify,
    /// Events seen in each watched directory.
    events: HashMap<WatchDescriptor, u64>,
    /// Events seen on each entry some chain passes through.
    on_way: HashMap<Entry, u64>,
    /// The watch on each directory, by its path with no symlink in it.
    watching: HashMap<PathBuf, Watched>,
    /// Each path's way as last made; void after an event on any way.
    ways: HashMap<PathBuf, Arc<Way>>,
}

/// Where a path resolves, and the entries it passes through.
struct Way {
    resolved: PathBuf,
    entries: Vec<Entry>,
}

impl Watch {
    /// None where inotify cannot be had (the instances limit reached).
    pub fn new() -> Option<Watch> {
        match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(inotify) => Some(Watch {
                inotify,
                events: HashMap::new(),
                on_way: HashMap::new(),
                watching: HashMap::new(),
                ways: HashMap::new(),
            }),
            Err(err) => {
                log::info!("inotify_init1: {err}: default places are looked at every time");
                None
            }
        }
    }

    /// Counts every queued event against its directory and entry. False
    /// if events were lost (see [`lost_track`]): then every watch is
    /// forgotten, and so must be whatever was concluded from them.
    pub fn settle(&mut self) -> bool {
        let mut kept_track = true;
        loop {
            match self.inotify.read_events() {
                Ok(events) => {
                    for event in events {
                        if event.mask.intersects(lost_track()) {
                            kept_track = false;
                            continue;
                        }
                        if let Some(count) = self.events.get_mut(&event.wd) {
                            *count += 1;
                        }
                        if let Some(name) = &event.name {
                            if let Some(count) = self.on_way.get_mut(&entry(event.wd, name)) {
                                *count += 1;
                                // Some way changed: made again when next asked.
                                self.ways.clear();
                            }
                        }
                        if event.mask.intersects(gone()) {
                            // Watched afresh when next reached by its path.
                            self.watching.retain(|_, watched| watched.wd != event.wd);
                            self.ways.clear();
                        }
                    }
                }
                Err(Errno::EAGAIN) => break,
                Err(Errno::EINTR) => continue,
                Err(err) => {
                    log::warn!("reading inotify events: {err}");
                    kept_track = false;
                    break;
                }
            }
        }
        if !kept_track {
            self.forget();
        }
        kept_track
    }

    /// Drops every watch (the kernel's and ours), so that each directory
    /// is watched afresh when next looked at.
    fn forget(&mut self) {
        for (_, watched) in self.watching.drain() {
            // Gone already if its directory was.
            let _ = self.inotify.rm_watch(watched.wd);
        }
        self.events.clear();
        self.on_way.clear();
        self.ways.clear();
    }

    /// What a change to `dir` is seen by: the watch on `dir` itself (an
    /// entry made, removed or written there), and the entries its path
    /// passes through, as written and as each symlink on it resolves (a
    /// link on the way re-pointed, a directory on the way moved); else
    /// why `dir` cannot be watched.
    pub fn chain(&mut self, dir: &Path) -> Result<Chain, Unwatched> {
        let way = self.way_to(dir)?;
        // f_type's width differs between libcs and architectures.
        #[allow(clippy::unnecessary_cast)]
        let local =
            rustix::fs::statfs(&way.resolved).is_ok_and(|fs| LOCAL.contains(&(fs.f_type as i64)));
        if !local {
            return Err(Unwatched::ForGood);
        }
        let leaf = self.watch(&way.resolved, Role::Leaf)?;
        let mut entries = way.entries.clone();
        entries.sort_unstable();
        entries.dedup();
        Ok(Chain {
            leaf,
            way: entries.into(),
            resolved: Arc::from(way.resolved.as_path()),
        })
    }

    /// Where `written` (absolute, no `.` or `..`) resolves, and the
    /// entries on its way, each watched: its parent's way, then its own
    /// entry in the parent's resolved directory, and where a link there
    /// leads, every entry of that path. Made once per prefix while no
    /// event came on a way: a directory's chain costs an `lstat` and the
    /// watch on its parent when its parent's is known.
    fn way_to(&mut self, written: &Path) -> Result<Arc<Way>, Unwatched> {
        if let Some(way) = self.ways.get(written) {
            return Ok(way.clone());
        }
        let way = match (written.parent(), written.file_name()) {
            (Some(parent), Some(name)) => {
                let parent_way = self.way_to(parent)?;
                let mut entries = parent_way.entries.clone();
                entries.push(entry(self.watch(&parent_way.resolved, Role::Way)?, name));
                // Watched before it is read: a change from here on is seen.
                let here = parent_way.resolved.join(name);
                let kind = std::fs::symlink_metadata(&here)
                    .map_err(|_| Unwatched::ForNow)?
                    .file_type();
                let resolved = if kind.is_symlink() {
                    let target = std::fs::canonicalize(&here).map_err(|_| Unwatched::ForNow)?;
                    for ancestor in target.ancestors() {
                        if let (Some(parent), Some(name)) =
                            (ancestor.parent(), ancestor.file_name())
                        {
                            entries.push(entry(self.watch(parent, Role::Way)?, name));
                        }
                    }
                    // Re-pointed while its target's way was watched.
                    if std::fs::canonicalize(&here).ok() != Some(target.clone()) {
                        return Err(Unwatched::ForNow);
                    }
                    target
                } else {
                    here
                };
                Way { resolved, entries }
            }
            _ if written == Path::new("/") => Way {
                resolved: written.to_owned(),
                entries: Vec::new(),
            },
            _ => return Err(Unwatched::ForGood),
        };
        // Counted from now on, whether or not a chain comes of it.
        for &entry in &way.entries {
            self.on_way.entry(entry).or_insert(0);
        }
        let way = Arc::new(way);
        if self.ways.len() >= MOST_WAYS {
            self.ways.clear();
        }
        self.ways.insert(written.to_owned(), way.clone());
        Ok(way)
    }

    /// The watch on `resolved`, asking at least what `role` needs (a
    /// directory first met on a way asks for its files' events once they
    /// are looked at); out of watches (ours or the user's), or refused,
    /// it stays so until the watches are forgotten. A directory gone
    /// since its path was read (removed between the `lstat` and the
    /// watch) is missing, as if the `lstat` had found it so.
    fn watch(&mut self, resolved: &Path, role: Role) -> Result<WatchDescriptor, Unwatched> {
        let held = self.watching.get(resolved).copied();
        if let Some(watched) = held.filter(|watched| watched.role >= role) {
            return Ok(watched.wd);
        }
        if held.is_none() && self.watching.len() >= MOST_WATCHES {
            return Err(Unwatched::ForGood);
        }
        // On a directory watched already, the new mask replaces the old
        // one and the same descriptor comes back.
        match self.inotify.add_watch(resolved, role.mask()) {
            Ok(wd) => {
                self.events.entry(wd).or_insert(0);
                self.watching
                    .insert(resolved.to_owned(), Watched { wd, role });
                Ok(wd)
            }
            Err(Errno::ENOENT | Errno::ENOTDIR) => Err(Unwatched::ForNow),
            Err(err) => {
                log::debug!("inotify_add_watch {}: {err}", resolved.display());
                Err(Unwatched::ForGood)
            }
        }
    }

    /// The events seen so far in `chain`'s directory and on its way:
    /// what was concluded at one count holds while it stays the same.
    pub fn count(&self, chain: &Chain) -> (u64, u64) {
        let leaf = self.events.get(&chain.leaf).copied().unwrap_or(0);
        let way = chain
            .way
            .iter()
            .map(|entry| self.on_way.get(entry).copied().unwrap_or(0))
            .sum();
        (leaf, way)
    }
}

/// Why a directory has no chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unwatched {
    /// Not there, or changing while watched: worth asking again.
    ForNow,
    /// Not on a local file system, or out of watches: asking again
    /// would cost system calls at every look for the same answer.
    ForGood,
}

/// What a directory's looks depend on.
pub struct Chain {
    /// The directory itself: its events change what is in it.
    leaf: WatchDescriptor,
    /// The entries on its way: their events may change which directory
    /// its path names, so the chain is made again after one.
    way: Box<[Entry]>,
    /// Where the directory's path leads (no symlink left on it), while no
    /// event came on its way.
    resolved: Arc<Path>,
}

impl Chain {
    pub fn resolved(&self) -> &Arc<Path> {
        &self.resolved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mask of each watch `watch` holds, by the inode watched (what
    /// the kernel shows of an inotify descriptor).
    fn masks(watch: &Watch) -> HashMap<u64, u32> {
        use std::os::fd::{AsFd, AsRawFd};
        let fd = watch.inotify.as_fd().as_raw_fd();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
        info.lines()
            .filter(|line| line.starts_with("inotify wd:"))
            .map(|line| {
                let field = |key: &str| {
                    let value = line.split(' ').find_map(|f| f.strip_prefix(key)).unwrap();
                    u64::from_str_radix(value, 16).unwrap()
                };
                (field("ino:"), field("mask:") as u32)
            })
            .collect()
    }

    /// Only a directory whose files are looked at asks for their events:
    /// one on the way asks for its entries' (a watch asking for its
    /// entries' own events makes the kernel mark each entry cached
    /// there, milliseconds in a busy `/tmp`).
    #[test]
    fn only_the_directory_looked_in_asks_for_its_files_events() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let leaf = tmp.path().join("a/b");
        std::fs::create_dir_all(&leaf).unwrap();
        let mut watch = Watch::new().expect("inotify");
        watch.chain(&leaf).unwrap();
        let files_only = (files_changed() - entries_changed()).bits();
        let ino = |path: &Path| std::fs::metadata(path).unwrap().ino();
        let held = masks(&watch);
        for way in [tmp.path(), &tmp.path().join("a")] {
            let mask = held[&ino(way)];
            assert_eq!(mask & files_only, 0, "{way:?}: {mask:#x}");
            assert_eq!(
                mask & entries_changed().bits(),
                entries_changed().bits() & !AddWatchFlags::IN_ONLYDIR.bits()
            );
        }
        assert_eq!(held[&ino(&leaf)] & files_only, files_only);

        // Its parent looked in too: raised, on the same watch.
        let count = watch.watching.len();
        watch.chain(&tmp.path().join("a")).unwrap();
        assert_eq!(watch.watching.len(), count);
        assert_eq!(
            masks(&watch)[&ino(&tmp.path().join("a"))] & files_only,
            files_only
        );
        assert_eq!(masks(&watch)[&ino(tmp.path())] & files_only, 0);
    }

    /// A directory removed as it was being watched is missing for now, to
    /// be asked again, not unwatchable for good (which would have it
    /// looked at every time until the watches are forgotten).
    #[test]
    fn a_directory_gone_before_its_watch_is_missing_for_now() {
        let mut watch = Watch::new().expect("inotify");
        let tmp = tempfile::tempdir().unwrap();
        let gone = tmp.path().join("gone");
        assert_eq!(
            watch.watch(&gone, Role::Leaf).err(),
            Some(Unwatched::ForNow)
        );
        std::fs::write(&gone, b"").unwrap();
        let below_a_file = gone.join("dir");
        assert_eq!(
            watch.watch(&below_a_file, Role::Leaf).err(),
            Some(Unwatched::ForNow)
        );
        assert!(watch.watch(tmp.path(), Role::Leaf).is_ok());
    }
}
