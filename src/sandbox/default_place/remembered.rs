//! Looks at default places remembered while nothing changed where they
//! are. A warm backend's Create of 5,000 sources spent most of its time
//! in one `fstatat` per source, finding what it found the time before;
//! on Linux a look that found the file is now remembered, by name and
//! size, while no event came on any directory its path passes through
//! (inotify, see [`watch`](super::watch)), and looked at again after one.
//!
//! What this does not see, and a look by size would: a size changed by a
//! write through a hard link in a directory not watched; the mode of a
//! directory on the way changed (watched for its entries only, see
//! [`watch`](super::watch)): search permission taken away there fails
//! the action's read instead of the Create. Elsewhere it
//! sees more than a look: a write of the same size to a watched
//! directory's file brings a new look (which finds the same size).
//! Files reached through a symlink, and refusals, are looked at each time.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

#[cfg(target_os = "linux")]
use std::cell::Cell;

#[cfg(target_os = "linux")]
use memo::Memo;
#[cfg(target_os = "linux")]
use parking_lot::Mutex;

use super::{look, FilesFound, Place};

/// Remembered looks for one backend.
pub struct Looks {
    #[cfg(target_os = "linux")]
    memo: Option<Mutex<Memo>>,
    /// Files looked at (a `fstatat` each), for tests and reports.
    made: AtomicU64,
}

impl Default for Looks {
    fn default() -> Self {
        Self::new()
    }
}

impl Looks {
    pub fn new() -> Looks {
        Looks {
            #[cfg(target_os = "linux")]
            memo: Memo::new().map(Mutex::new),
            made: AtomicU64::new(0),
        }
    }

    /// A batch of looks (one Create's): what changed until its first
    /// look counts (the queued events are read then, not for a Create
    /// whose inputs are all in the store).
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            looks: self,
            #[cfg(target_os = "linux")]
            settled: Cell::new(false),
        }
    }

    /// The files remembered, by directory, for a successor serving
    /// `workspace` to look at again ([`Looks::look_again`]).
    pub fn found(&self, workspace: &Path) -> FilesFound {
        #[cfg(target_os = "linux")]
        let dirs = self
            .memo
            .as_ref()
            .map_or_else(Vec::new, |m| m.lock().found());
        #[cfg(not(target_os = "linux"))]
        let dirs = Vec::new();
        FilesFound {
            workspace: workspace.to_owned(),
            dirs,
        }
    }

    /// Looks again at the files a predecessor found (its
    /// [`Looks::found`]), as a Create would, so that those still there
    /// are remembered before a Create asks; until `stop` is set. Returns
    /// how many were found.
    pub fn look_again(&self, found: &FilesFound, stop: &AtomicBool) -> usize {
        if !self.remembers() {
            // Each look would be made again by the Create that asks.
            return 0;
        }
        let batch = self.batch();
        let mut here = 0;
        for (dir, files) in &found.dirs {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let files: Vec<(&str, i64)> = files.iter().map(|(n, s)| (&**n, *s)).collect();
            let places = batch.look(dir, &files);
            here += places.iter().filter(|p| **p == Place::Here).count();
        }
        here
    }

    /// Whether looks are remembered here (Linux, with inotify).
    fn remembers(&self) -> bool {
        #[cfg(target_os = "linux")]
        return self.memo.is_some();
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// How many files were looked at so far.
    pub fn made(&self) -> u64 {
        self.made.load(Ordering::Relaxed)
    }

    fn look_afresh<'a>(
        &self,
        dir: &Path,
        files: impl ExactSizeIterator<Item = (&'a str, i64)>,
    ) -> Vec<Place> {
        self.made.fetch_add(files.len() as u64, Ordering::Relaxed);
        look(dir, files)
    }
}

/// Looks made after the changes seen when the batch's first was.
pub struct Batch<'a> {
    looks: &'a Looks,
    /// The events queued were read, at the batch's first look.
    #[cfg(target_os = "linux")]
    settled: Cell<bool>,
}

impl Batch<'_> {
    /// [`look`] at files `files` of `dir`, answered from memory where a
    /// look found the file and nothing changed on its way since.
    pub fn look(&self, dir: &Path, files: &[(&str, i64)]) -> Vec<Place> {
        self.look_resolving(dir, files).places
    }

    /// [`Batch::look`], and where `dir` leads if that is known (watched)
    /// and another path: a file found [`Place::Here`] is that directory's
    /// too, reached without the links on `dir`'s way.
    pub fn look_resolving(&self, dir: &Path, files: &[(&str, i64)]) -> Looked {
        #[cfg(target_os = "linux")]
        if let Some(memo) = &self.looks.memo {
            return self.remembered(memo, dir, files);
        }
        Looked::unresolved(self.looks.look_afresh(dir, files.iter().copied()))
    }

    #[cfg(target_os = "linux")]
    fn remembered(&self, memo: &Mutex<Memo>, dir: &Path, files: &[(&str, i64)]) -> Looked {
        let mut answers: Vec<Option<Place>> = vec![None; files.len()];
        let (recalled, mut resolved) = {
            let mut memo = memo.lock();
            if !self.settled.replace(true) {
                memo.settle();
            }
            let recalled = memo.recall(dir, files, &mut answers);
            let resolved = recalled.and_then(|at| memo.resolved(dir, at));
            (recalled, resolved)
        };
        // Not under the lock while looking: the other Creates go on.
        let Some(seen_at) = recalled else {
            return Looked::unresolved(self.looks.look_afresh(dir, files.iter().copied()));
        };
        let todo: Vec<usize> = (0..files.len()).filter(|&i| answers[i].is_none()).collect();
        if !todo.is_empty() {
            let looked = self.looks.look_afresh(dir, todo.iter().map(|&i| files[i]));
            let mut memo = memo.lock();
            for (i, place) in todo.into_iter().zip(looked) {
                if place == Place::Here {
                    memo.remember(dir, seen_at, files[i]);
                }
                answers[i] = Some(place);
            }
            // The looks just made went by `dir`: where it leads holds for
            // them as it does for remembering them, if no change on its
            // way was seen meanwhile (events are read at a batch's first
            // look, so one after that shows in the next Create's).
            if memo.resolved(dir, seen_at).is_none() {
                resolved = None;
            }
        }
        Looked {
            places: answers
                .into_iter()
                .map(|a| a.expect("an answer per file"))
                .collect(),
            resolved: resolved.filter(|resolved| **resolved != *dir),
        }
    }
}

/// What [`Batch::look_resolving`] found.
pub struct Looked {
    /// An answer per file, in order.
    pub places: Vec<Place>,
    /// Where the directory leads, if known and not the path asked.
    pub resolved: Option<Arc<Path>>,
}

impl Looked {
    /// Answers with no resolution of the directory known.
    pub fn unresolved(places: Vec<Place>) -> Looked {
        Looked {
            places,
            resolved: None,
        }
    }
}

#[cfg(target_os = "linux")]
mod memo {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use super::super::handed::Files;
    use super::super::watch::{Chain, Unwatched, Watch};
    use super::Place;

    /// Names remembered at most (about 100 bytes each); beyond, all are
    /// forgotten and looked at again.
    const MOST_NAMES: usize = 1 << 20;
    /// Directories remembered at most, watched or not.
    const MOST_DIRS: usize = 1 << 18;
    /// Names handed on at most: a successor looks at each again as it
    /// starts, where a build might need a few.
    const MOST_HANDED_ON: usize = 1 << 18;

    /// When a directory's files were looked at: the memory's generation,
    /// which making of the directory's entry, and the events seen on the
    /// directory and on its way.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct SeenAt {
        generation: u64,
        made: u64,
        leaf: u64,
        way: u64,
    }

    pub struct Memo {
        watch: Watch,
        /// Bumped when the watch lost track: everything before is void.
        generation: u64,
        /// Entries of `dirs` made so far: a look made for an entry since
        /// replaced is not remembered in its successor.
        made: u64,
        /// What looks found in each directory, and when.
        dirs: HashMap<PathBuf, Seen>,
        names: usize,
    }

    struct Seen {
        /// Or why the directory cannot be watched.
        chain: Result<Chain, Unwatched>,
        at: SeenAt,
        /// Files found at their default place, with the size found.
        files: HashMap<Box<str>, i64>,
    }

    impl Memo {
        pub fn new() -> Option<Memo> {
            Some(Memo {
                watch: Watch::new()?,
                generation: 0,
                made: 0,
                dirs: HashMap::new(),
                names: 0,
            })
        }

        pub fn settle(&mut self) {
            if !self.watch.settle() {
                log::debug!("inotify lost track: every remembered look is forgotten");
                self.generation += 1;
                self.dirs.clear();
                self.names = 0;
            }
        }

        fn seen_at(&self, chain: &Result<Chain, Unwatched>) -> SeenAt {
            let (leaf, way) = chain.as_ref().map_or((0, 0), |c| self.watch.count(c));
            SeenAt {
                generation: self.generation,
                made: self.made,
                leaf,
                way,
            }
        }

        /// The files remembered, directories in the order they were
        /// (last) made, up to [`MOST_HANDED_ON`] files.
        pub fn found(&self) -> Vec<(PathBuf, Files)> {
            let mut dirs: Vec<(&PathBuf, &Seen)> = self
                .dirs
                .iter()
                .filter(|(_, seen)| seen.chain.is_ok() && !seen.files.is_empty())
                .collect();
            dirs.sort_by_key(|(_, seen)| seen.at.made);
            let mut names = 0;
            dirs.into_iter()
                .take_while(|(_, seen)| {
                    names += seen.files.len();
                    names <= MOST_HANDED_ON
                })
                .map(|(dir, seen)| {
                    let files = seen.files.iter().map(|(n, s)| (n.clone(), *s)).collect();
                    (dir.clone(), files)
                })
                .collect()
        }

        /// Answers from memory each file of `files` a look found in `dir`
        /// with nothing changed since; returns when this was, for the
        /// looks at the rest to be remembered as of then. None: `dir`
        /// cannot be watched.
        pub fn recall(
            &mut self,
            dir: &Path,
            files: &[(&str, i64)],
            answers: &mut [Option<Place>],
        ) -> Option<SeenAt> {
            if !self.dirs.contains_key(dir) {
                if self.dirs.len() >= MOST_DIRS {
                    self.dirs.clear();
                    self.names = 0;
                }
                self.made += 1;
                let chain = self.watch.chain(dir);
                let at = self.seen_at(&chain);
                let files = HashMap::new();
                self.dirs.insert(dir.to_owned(), Seen { chain, at, files });
            }
            let seen = self.dirs.get(dir).expect("just made");
            let now = SeenAt {
                made: seen.at.made,
                ..self.seen_at(&seen.chain)
            };
            // Not watchable when last asked for now (missing, say, after a
            // clean): asked again, cheaply, as the ways up to it are kept.
            let unwatched = seen.chain.as_ref().err() == Some(&Unwatched::ForNow);
            if now != seen.at || unwatched {
                self.made += 1;
                // Something changed: on the way, the path may name
                // another directory, whose chain is another.
                let chain = match now.way != seen.at.way
                    || now.generation != seen.at.generation
                    || unwatched
                {
                    true => self.watch.chain(dir),
                    false => {
                        let seen = self.dirs.get_mut(dir).expect("just made");
                        std::mem::replace(&mut seen.chain, Err(Unwatched::ForNow))
                    }
                };
                let at = self.seen_at(&chain);
                let seen = self.dirs.get_mut(dir).expect("just made");
                self.names -= seen.files.len();
                *seen = Seen {
                    chain,
                    at,
                    files: HashMap::new(),
                };
            }
            let seen = &self.dirs[dir];
            seen.chain.as_ref().ok()?;
            for ((name, size), answer) in files.iter().zip(answers.iter_mut()) {
                if seen.files.get(*name) == Some(size) {
                    *answer = Some(Place::Here);
                }
            }
            Some(seen.at)
        }

        /// Where `dir` leads, if its chain was made at `at` and nothing
        /// changed since.
        pub fn resolved(&self, dir: &Path, at: SeenAt) -> Option<Arc<Path>> {
            let seen = self.dirs.get(dir).filter(|seen| seen.at == at)?;
            let chain = seen.chain.as_ref().ok()?;
            Some(chain.resolved().clone())
        }

        /// Remembers that a look made at `at` found `file` in `dir`,
        /// unless something changed there since.
        pub fn remember(&mut self, dir: &Path, at: SeenAt, (name, size): (&str, i64)) {
            let Some(seen) = self.dirs.get_mut(dir).filter(|seen| seen.at == at) else {
                return;
            };
            if seen.files.insert(name.into(), size).is_none() {
                self.names += 1;
            }
            if self.names > MOST_NAMES {
                self.dirs.clear();
                self.names = 0;
            }
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    fn look(looks: &Looks, dir: &Path, files: &[(&str, i64)]) -> Vec<Place> {
        looks.batch().look(dir, files)
    }

    fn refused(place: &Place, why: &str) -> bool {
        matches!(place, Place::Refused(reason) if reason.contains(why))
    }

    #[test]
    fn a_look_is_remembered_until_its_directory_changes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("in");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("a"), b"12345").unwrap();
        fs::write(dir.join("b"), b"123").unwrap();
        let looks = Looks::new();
        let files = [("a", 5), ("b", 3)];
        assert_eq!(look(&looks, &dir, &files), [Place::Here, Place::Here]);
        assert_eq!(looks.made(), 2);
        assert_eq!(look(&looks, &dir, &files), [Place::Here, Place::Here]);
        assert_eq!(looks.made(), 2, "nothing changed: nothing looked at");

        // Written in place, the same size: looked at again, found alike.
        fs::write(dir.join("a"), b"54321").unwrap();
        assert_eq!(look(&looks, &dir, &files), [Place::Here, Place::Here]);
        assert_eq!(looks.made(), 4);
        // Grown: refused, and the refusal is not remembered.
        fs::write(dir.join("a"), b"123456").unwrap();
        let found = look(&looks, &dir, &files);
        assert!(refused(&found[0], "holds 6 bytes"), "{found:?}");
        assert_eq!(found[1], Place::Here);
        assert!(refused(&look(&looks, &dir, &files)[0], "holds 6 bytes"));
        assert_eq!(looks.made(), 7, "b remembered, a looked at each time");
        // Replaced by a rename, then removed.
        fs::write(tmp.path().join("new"), b"1234").unwrap();
        fs::rename(tmp.path().join("new"), dir.join("b")).unwrap();
        assert!(refused(&look(&looks, &dir, &files)[1], "holds 4 bytes"));
        fs::remove_file(dir.join("b")).unwrap();
        assert!(refused(&look(&looks, &dir, &files)[1], "missing"));
    }

    #[test]
    fn a_change_on_the_way_to_a_directory_is_seen() {
        let tmp = tempfile::tempdir().unwrap();
        for (src, bytes) in [("src1", &b"12345"[..]), ("src2", b"1234567")] {
            fs::create_dir_all(tmp.path().join(src).join("pkg/in")).unwrap();
            fs::write(tmp.path().join(src).join("pkg/in/f"), bytes).unwrap();
        }
        // The exec root reaches the sources through a link, as Bazel's.
        let exec = tmp.path().join("exec");
        fs::create_dir(&exec).unwrap();
        symlink(tmp.path().join("src1"), exec.join("ws")).unwrap();
        let dir = exec.join("ws/pkg/in");
        let looks = Looks::new();
        assert_eq!(look(&looks, &dir, &[("f", 5)]), [Place::Here]);
        assert_eq!(look(&looks, &dir, &[("f", 5)]), [Place::Here]);
        assert_eq!(looks.made(), 1);

        // The link re-pointed: the directory it names is another.
        fs::remove_file(exec.join("ws")).unwrap();
        symlink(tmp.path().join("src2"), exec.join("ws")).unwrap();
        assert!(refused(
            &look(&looks, &dir, &[("f", 5)])[0],
            "holds 7 bytes"
        ));
        assert_eq!(look(&looks, &dir, &[("f", 7)]), [Place::Here]);
        assert_eq!(look(&looks, &dir, &[("f", 7)]), [Place::Here]);
        let made = looks.made();

        // A directory on the way moved, another in its place.
        fs::rename(tmp.path().join("src2/pkg"), tmp.path().join("src2/old")).unwrap();
        fs::create_dir_all(tmp.path().join("src2/pkg/in")).unwrap();
        fs::write(tmp.path().join("src2/pkg/in/f"), b"12").unwrap();
        assert!(refused(
            &look(&looks, &dir, &[("f", 7)])[0],
            "holds 2 bytes"
        ));
        assert!(looks.made() > made);
    }

    /// A directory first met on another's way is watched for its
    /// entries only; once its own files are looked at, for their writes.
    #[test]
    fn a_directory_on_a_way_then_looked_in_sees_its_files_written() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pkg");
        fs::create_dir_all(dir.join("sub")).unwrap();
        fs::write(dir.join("sub/f"), b"1").unwrap();
        fs::write(dir.join("g"), b"12").unwrap();
        let looks = Looks::new();
        assert_eq!(look(&looks, &dir.join("sub"), &[("f", 1)]), [Place::Here]);
        assert_eq!(look(&looks, &dir, &[("g", 2)]), [Place::Here]);
        assert_eq!(look(&looks, &dir, &[("g", 2)]), [Place::Here]);
        assert_eq!(looks.made(), 2);
        fs::write(dir.join("g"), b"123").unwrap();
        assert!(refused(
            &look(&looks, &dir, &[("g", 2)])[0],
            "holds 3 bytes"
        ));
        assert_eq!(look(&looks, &dir.join("sub"), &[("f", 1)]), [Place::Here]);
        assert_eq!(looks.made(), 3, "sub's look still remembered");
    }

    #[test]
    fn a_directory_missing_when_first_looked_at_is_watched_once_made() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out/pkg");
        let looks = Looks::new();
        assert!(refused(&look(&looks, &dir, &[("f", 3)])[0], "missing"));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("f"), b"123").unwrap();
        assert_eq!(look(&looks, &dir, &[("f", 3)]), [Place::Here]);
        assert_eq!(look(&looks, &dir, &[("f", 3)]), [Place::Here]);
        assert_eq!(looks.made(), 2, "remembered once its directory is there");
        // Removed and made again (a clean, then a build): the same.
        fs::remove_dir_all(tmp.path().join("out")).unwrap();
        assert!(refused(&look(&looks, &dir, &[("f", 3)])[0], "missing"));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("f"), b"1234").unwrap();
        assert_eq!(look(&looks, &dir, &[("f", 4)]), [Place::Here]);
        assert_eq!(look(&looks, &dir, &[("f", 4)]), [Place::Here]);
        assert_eq!(looks.made(), 4);
    }

    /// What one backend's looks found, handed to the next, is looked at
    /// again there, once: what is still there is remembered, what
    /// changed while no backend watched is found changed.
    #[test]
    fn looks_handed_on_are_looked_at_again_and_remembered() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("in");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("a"), b"12345").unwrap();
        fs::write(dir.join("b"), b"123").unwrap();
        let files = [("a", 5), ("b", 3)];
        let first = Looks::new();
        assert_eq!(look(&first, &dir, &files), [Place::Here, Place::Here]);
        let found = first.found(Path::new("/ws"));
        assert_eq!(found.dirs.len(), 1);
        assert_eq!(found.files(), 2);
        drop(first);
        // While no backend watched, b grew.
        fs::write(dir.join("b"), b"1234").unwrap();

        let stopped = Looks::new();
        assert_eq!(stopped.look_again(&found, &AtomicBool::new(true)), 0);
        assert_eq!(stopped.made(), 0, "stopped before any look");

        let next = Looks::new();
        assert_eq!(next.look_again(&found, &AtomicBool::new(false)), 1);
        assert_eq!(next.made(), 2);
        let again = look(&next, &dir, &files);
        assert_eq!(again[0], Place::Here);
        assert!(refused(&again[1], "holds 4 bytes"), "{again:?}");
        assert_eq!(next.made(), 3, "a remembered, b looked at");
        // Watched from the look again on: a change is seen as ever.
        fs::write(dir.join("a"), b"123456").unwrap();
        assert!(refused(&look(&next, &dir, &[("a", 5)])[0], "holds 6 bytes"));
    }

    /// On a file system whose changes inotify may not report (here
    /// /proc, as a network one would be), nothing is remembered.
    #[test]
    fn a_directory_on_a_file_system_not_watched_is_looked_at_each_time() {
        let dir = Path::new("/proc/sys/fs/inotify");
        let looks = Looks::new();
        for made in 1..=3 {
            assert_eq!(look(&looks, dir, &[("max_user_watches", 0)]), [Place::Here]);
            assert_eq!(looks.made(), made);
        }
    }

    #[test]
    fn a_file_reached_through_a_symlink_is_looked_at_each_time() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("real"), b"123").unwrap();
        symlink("real", tmp.path().join("link")).unwrap();
        let looks = Looks::new();
        let real = fs::canonicalize(tmp.path().join("real")).unwrap();
        for made in 1..=3 {
            let found = look(&looks, tmp.path(), &[("link", 3)]);
            assert_eq!(found, [Place::Elsewhere(real.clone())]);
            assert_eq!(looks.made(), made);
        }
    }

    /// A file found in a directory whose path goes through a symlink is
    /// answered with where that path leads, from the first look on and
    /// while nothing changes on the way; re-pointed, the link's new
    /// target is answered. A directory reached without links has none.
    #[test]
    fn a_directory_reached_through_a_symlink_is_answered_where_it_leads() {
        let tmp = tempfile::tempdir().unwrap();
        for (dir, bytes) in [("one", &b"123"[..]), ("two", &b"456"[..])] {
            fs::create_dir(tmp.path().join(dir)).unwrap();
            fs::write(tmp.path().join(dir).join("f"), bytes).unwrap();
        }
        symlink("one", tmp.path().join("link")).unwrap();
        let via_link = tmp.path().join("link");
        let one = fs::canonicalize(tmp.path().join("one")).unwrap();
        let two = fs::canonicalize(tmp.path().join("two")).unwrap();
        let looks = Looks::new();
        for made in [1, 1] {
            let looked = looks.batch().look_resolving(&via_link, &[("f", 3)]);
            assert_eq!(looked.places, [Place::Here]);
            assert_eq!(looked.resolved.as_deref(), Some(one.as_path()));
            assert_eq!(looks.made(), made, "the second look is remembered");
        }
        fs::remove_file(&via_link).unwrap();
        symlink("two", &via_link).unwrap();
        let looked = looks.batch().look_resolving(&via_link, &[("f", 3)]);
        assert_eq!(looked.places, [Place::Here]);
        assert_eq!(looked.resolved.as_deref(), Some(two.as_path()));
        let direct = looks.batch().look_resolving(&two, &[("f", 3)]);
        assert_eq!(direct.places, [Place::Here]);
        assert_eq!(direct.resolved, None);
    }

    /// When the kernel's queue overflows, events are lost, one of them
    /// perhaps the change of a remembered file: everything is forgotten.
    #[test]
    fn events_lost_forget_every_look() {
        let tmp = tempfile::tempdir().unwrap();
        let (quiet, busy) = (tmp.path().join("quiet"), tmp.path().join("busy"));
        fs::create_dir(&quiet).unwrap();
        fs::create_dir(&busy).unwrap();
        fs::write(quiet.join("f"), b"12345").unwrap();
        let looks = Looks::new();
        assert_eq!(look(&looks, &quiet, &[("f", 5)]), [Place::Here]);
        assert_eq!(look(&looks, &busy, &[]), []);
        // Watched too, once a file there is looked at.
        fs::write(busy.join("x"), b"").unwrap();
        assert_eq!(look(&looks, &busy, &[("x", 0)]), [Place::Here]);
        // More events than the queue holds (16,384 by default), each
        // of another name so that none merges with the one before.
        let queue: usize = fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
            .map_or(16384, |text| text.trim().parse().unwrap());
        for i in 0..queue / 2 + 1 {
            let name = busy.join(format!("n{i}"));
            fs::write(&name, b"").unwrap();
            fs::remove_file(&name).unwrap();
        }
        // The queue is full: this change makes no event.
        fs::write(quiet.join("f"), b"123456").unwrap();
        assert!(refused(
            &look(&looks, &quiet, &[("f", 5)])[0],
            "holds 6 bytes"
        ));
    }
}
