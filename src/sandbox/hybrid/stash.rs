//! Stashes: the inputs of destroyed native sandboxes, kept to build the
//! next ones from (see [`crate::sandbox::materialize::reuse`]).
//!
//! A stash must be on the file system of the writable directory it came
//! from and goes back to, since it moves by rename. So stashes live in a
//! pool per file system: in the native directory when that is on the same
//! file system, else in `.actionfs-stashes-PID` beside the writable
//! directory's parent (in Bazel's layout `BASE/STRATEGY/N/scratch` is the
//! writable directory, `BASE/STRATEGY/N` is deleted after each action and
//! `BASE/STRATEGY` lasts the build), but only where that directory belongs
//! to us and no one else may write it. Elsewhere nothing is stashed.
//!
//! A pool keeps at most `limit` stashes and [`MAX_BYTES`] of them, the
//! oldest going first, and is deleted when the daemon stops, unless its
//! stashes are handed on to the next daemon ([`Stashes::hand_on`]): then
//! they are moved to a directory on their file system with an index of
//! their shapes and stamps, and the next daemon's pool there adopts each
//! one whose root is as it was left ([`Stashes::adopt_from`]).

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use super::handoff::{self, Handed, Reading, INDEX};
use crate::sandbox::dirfd::{Anchor, DirFd};
use crate::sandbox::materialize::reuse::{Stamp, Stamps};
use crate::sandbox::materialize::shape::{Dir, Node};
use crate::sandbox::materialize::{self, Error, Trash};
use crate::sandbox::ownership::{self, OwnershipError, Rules};

/// After this many builds in a row found no stash worth taking, only one
/// destroyed sandbox in [`PROBE_EVERY`] is stashed: where inputs do not
/// repeat, stashes are only deleted later, which costs what deleting them
/// at once would, plus the moves.
const MISSES_BEFORE_PROBING: usize = 8;
const PROBE_EVERY: usize = 8;

/// Most bytes (as [`Dir::bytes`] estimates them) the stashes of one pool
/// hold: on tmpfs they are memory.
pub const MAX_BYTES: usize = 64 << 20;

/// Stashes by file system.
pub struct Stashes {
    limit: usize,
    native_dir: PathBuf,
    /// By device; `None` where stashing is not possible.
    pools: Mutex<HashMap<u64, Option<Arc<Pool>>>>,
    /// Stashes a predecessor handed on, for the pool on their file system
    /// to adopt when it opens.
    handed: Mutex<Option<Reading>>,
    /// The thread adopting them, once a pool can.
    adopting: Mutex<Option<JoinHandle<()>>>,
}

/// The stashes on one file system.
pub struct Pool {
    path: PathBuf,
    dev: u64,
    dir: DirFd,
    trash: Trash,
    next: AtomicU64,
    limit: usize,
    kept: Mutex<Kept>,
    /// Builds in a row that found no stash worth taking.
    misses: AtomicUsize,
    /// Destroys while probing.
    probes: AtomicUsize,
    /// Stashes on their way in (destroys answered before their inputs
    /// were moved), which a build waits for before it picks one.
    arriving: Mutex<usize>,
    arrived: Condvar,
}

/// How long a build waits for stashes on their way in: long enough for
/// one destroy's moves, short enough that a stuck one costs a build no
/// more than building afresh.
const ARRIVAL_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// A stash on its way into its pool, from [`Pool::expect`] until dropped
/// (kept, discarded or failed alike).
pub struct Arriving(Arc<Pool>);

impl Drop for Arriving {
    fn drop(&mut self) {
        let mut arriving = self.0.arriving.lock();
        *arriving -= 1;
        if *arriving == 0 {
            self.0.arrived.notify_all();
        }
    }
}

#[derive(Default)]
struct Kept {
    stashes: VecDeque<Stash>,
    bytes: usize,
}

/// One stash: a directory of the pool and its shape.
pub struct Stash {
    pub path: PathBuf,
    pub dir: DirFd,
    pub shape: Dir,
    /// Its directories' stamps when it was made.
    pub stamps: Stamps,
    bytes: usize,
}

/// Why no pool of stashes opens for a file system (its native sandboxes
/// are then not reused).
#[derive(Debug, thiserror::Error)]
pub enum NoPool {
    #[error("it has no grandparent directory to keep stashes in")]
    NoGrandparent,
    #[error(transparent)]
    NotOurs(#[from] OwnershipError),
    #[error(
        "on the file system of {parent:?} a directory's ctime moves with the clock tick, not \
         with every change (Linux before 6.13), so an action's change made in the tick of a \
         stamp would go unseen"
    )]
    CoarseCtime { parent: PathBuf },
    #[error("probing the ctime in {parent:?}: {source}")]
    CtimeProbe {
        parent: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Open(#[from] Error),
}

impl Stashes {
    /// Stashes of at most `limit` sandboxes per file system, in
    /// `native_dir` where they can be.
    pub fn new(native_dir: &Path, limit: usize) -> Stashes {
        Stashes {
            limit,
            native_dir: native_dir.to_owned(),
            pools: Mutex::default(),
            handed: Mutex::default(),
            adopting: Mutex::default(),
        }
    }

    /// Has a pool on the file system of the hand-off directory being read
    /// adopt the stashes a predecessor handed on there, in the background
    /// (see [`Stashes::adopt_in_background`]); the directory is removed
    /// then. When the native directory is on that file system, the pool a
    /// build would open there is opened now, so that adoption starts at
    /// once rather than at the first build that wants a stash; else it
    /// waits for a pool to open there.
    pub fn adopt_from(&self, handed: Reading) {
        let Some(dev) = device_of_path(handed.dir()) else {
            // Gone, or unreadable: nothing to adopt, and `finish` says why.
            let (dir, read) = handed.finish();
            if let Err(why) = read {
                log::warn!("stashes handed on in {dir:?} not adopted: {why}");
            }
            return;
        };
        let mut pools = self.pools.lock();
        if !pools.contains_key(&dev) && device_of_path(&self.native_dir) == Some(dev) {
            pools.insert(dev, self.open_pool(&self.native_dir, dev));
        }
        match pools.get(&dev).cloned().flatten() {
            Some(pool) => self.adopt_in_background(pool, handed),
            None => *self.handed.lock() = Some(handed),
        }
    }

    /// Has `pool` adopt the stashes `handed` reads on a thread of its own,
    /// off the first Create's path: the index is decoded, and every stash
    /// renamed and stamped. Until it is done they count as
    /// stashes on their way in, which a build waits for (bounded) before
    /// it picks one, as it does for a destroy's.
    fn adopt_in_background(&self, pool: Arc<Pool>, handed: Reading) {
        let arriving = pool.expect();
        let adopting = pool.clone();
        let spawned = std::thread::Builder::new()
            .name("stash-adopt".into())
            .spawn(move || {
                let dir = adopting.adopt(handed);
                drop(arriving);
                remove_handed(&dir);
            });
        match spawned {
            Ok(thread) => {
                let previous = self.adopting.lock().replace(thread);
                // One hand-off per daemon; a second would only queue.
                if let Some(previous) = previous {
                    let _ = previous.join();
                }
            }
            Err(err) => log::warn!("cannot adopt the stashes handed on: spawn: {err}"),
        }
    }

    /// Waits until stashes being adopted are kept (or refused).
    fn adopted(&self) {
        if let Some(thread) = self.adopting.lock().take() {
            let _ = thread.join();
        }
    }

    /// Moves the stashes kept on the file system of `to` into `to` (made
    /// anew), with an index of their shapes and stamps, for the next
    /// daemon to adopt; a stash with a link below `own` (which goes with
    /// this daemon) is deleted instead, as is every stash elsewhere when
    /// the pools are removed. Returns how many were handed on.
    pub fn hand_on(&self, to: &Path, own: &Path) -> Result<usize, Error> {
        // A predecessor's stashes not adopted (no pool opened on their file
        // system) are replaced, not removed later with this hand-off; the
        // read of their index ends first.
        if let Some(reading) = self.handed.lock().take() {
            drop(reading.finish());
        }
        self.adopted();
        if to.exists() {
            materialize::remove_tree(to)?;
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(to)
            .map_err(|e| Error::new("mkdir", to, e))?;
        let dev = device_of_path(to);
        let mut handed = Vec::new();
        for pool in self.pools.lock().values().flatten() {
            if Some(pool.dev) != dev {
                continue;
            }
            let stashes = {
                let mut kept = pool.kept.lock();
                kept.bytes = 0;
                std::mem::take(&mut kept.stashes)
            };
            for stash in stashes {
                if links_below(&stash.shape, own) {
                    pool.discard_stash(stash);
                    continue;
                }
                let name = format!("stash-{}", handed.len());
                let dest = to.join(&name);
                if let Err(err) = std::fs::rename(&stash.path, &dest) {
                    log::warn!("cannot hand stash {:?} on: rename: {err}", stash.path);
                    pool.discard_stash(stash);
                    continue;
                }
                handed.push(Handed {
                    name: name.into(),
                    stamps: stash.stamps,
                    shape: stash.shape,
                });
            }
        }
        // Written whole, then named: the next daemon reads all or nothing.
        let (index, partial) = (to.join(INDEX), to.join(".index.new"));
        std::fs::write(&partial, handoff::encode(&handed))
            .and_then(|()| std::fs::rename(&partial, &index))
            .map_err(|e| Error::new("write", &index, e))?;
        Ok(handed.len())
    }

    /// The pool for writable directory `root`, made at first use; `None`
    /// where stashing is not possible (logged once per file system).
    pub fn pool_for(&self, root: &Anchor) -> Option<Arc<Pool>> {
        let dev = device_of(root.fd().ok()?)?;
        let mut pools = self.pools.lock();
        if let Some(pool) = pools.get(&dev) {
            return pool.clone();
        }
        let pool = self.open_pool(root.path(), dev);
        pools.insert(dev, pool.clone());
        let mut handed = self.handed.lock();
        if let Some(pool) = &pool {
            if handed
                .as_ref()
                .is_some_and(|reading| device_of_path(reading.dir()) == Some(dev))
            {
                self.adopt_in_background(pool.clone(), handed.take().expect("checked"));
            }
        }
        pool
    }

    /// The pool for writable directories on device `dev` such as
    /// `writable`, or `None` (logged) if none can be opened.
    fn open_pool(&self, writable: &Path, dev: u64) -> Option<Arc<Pool>> {
        match self.try_open_pool(writable, dev) {
            Ok(pool) => {
                log::debug!("stashes for device {dev} in {:?}", pool.path);
                Some(Arc::new(pool))
            }
            Err(why) => {
                log::info!("native sandboxes made in {writable:?} are not reused: {why}");
                None
            }
        }
    }

    fn try_open_pool(&self, writable: &Path, dev: u64) -> Result<Pool, NoPool> {
        let name = format!("{POOL_PREFIX}{}", std::process::id());
        let parent = if device_of_path(&self.native_dir) == Some(dev) {
            self.native_dir.clone()
        } else {
            let parent = writable
                .parent()
                .and_then(Path::parent)
                .ok_or(NoPool::NoGrandparent)?;
            ownership::check(parent, &Rules::stash_parent(dev))?;
            parent.to_owned()
        };
        match ctime_moves_with_every_change(&parent) {
            Ok(true) => {}
            Ok(false) => return Err(NoPool::CoarseCtime { parent }),
            Err(source) => return Err(NoPool::CtimeProbe { parent, source }),
        }
        Ok(Pool::open(&parent.join(name), dev, self.limit)?)
    }

    /// Stashes kept now, on every file system.
    pub fn kept(&self) -> usize {
        self.pools
            .lock()
            .values()
            .flatten()
            .map(|pool| pool.kept())
            .sum()
    }

    /// Calls `f` with every stash kept now.
    #[cfg(test)]
    pub fn each_kept(&self, mut f: impl FnMut(&Stash)) {
        for pool in self.pools.lock().values().flatten() {
            pool.kept.lock().stashes.iter().for_each(&mut f);
        }
    }

    /// Deletes every pool (at shutdown), waiting for their trash, and
    /// stashes handed on that no pool adopted.
    pub fn remove_all(&self) {
        self.adopted();
        for pool in self.pools.lock().drain().filter_map(|(_, pool)| pool) {
            pool.remove();
        }
        if let Some(reading) = self.handed.lock().take() {
            remove_handed(&reading.finish().0);
        }
    }
}

/// Removes a hand-off directory (adopted, refused or not wanted).
pub fn remove_handed(dir: &Path) {
    if let Err(err) = materialize::remove_tree(dir) {
        log::warn!("cannot remove the stashes handed on in {dir:?}: {err}");
    }
}

/// Whether a symlink of `dir` or below points below `own`.
fn links_below(dir: &Dir, own: &Path) -> bool {
    dir.entries().values().any(|node| match node {
        Node::Link(target) => Path::new(target).starts_with(own),
        Node::Dir(sub) => links_below(sub, own),
    })
}

/// The links a reshape of `have` into `want` removes and makes.
fn reshape_changes(have: &Dir, want: &Dir) -> usize {
    // Saturating: `shared_links` trusts equal digests, so a collision
    // could count more shared links than one side has.
    let shared = want.shared_links(have);
    have.links().saturating_sub(shared) + want.links().saturating_sub(shared)
}

/// A pool's name is this and the daemon's pid.
const POOL_PREFIX: &str = ".actionfs-stashes-";

/// Whether `name` (an entry of the native directory) is the stash pool of
/// another daemon, which can only be one that ended without deleting it.
pub fn is_stale_pool(name: &std::ffi::OsStr) -> bool {
    name.to_str()
        .and_then(|name| name.strip_prefix(POOL_PREFIX))
        .is_some_and(|pid| pid != std::process::id().to_string())
}

#[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
fn device_of(fd: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    nix::sys::stat::fstat(fd).ok().map(|st| st.st_dev as u64)
}

#[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
fn device_of_path(path: &Path) -> Option<u64> {
    nix::sys::stat::stat(path).ok().map(|st| st.st_dev as u64)
}

/// Whether a directory's ctime, read and then changed, always moves: a
/// stamp must show every change made after it was taken. So it does with
/// multigrain timestamps (Linux 6.13 on, tmpfs, ext4, xfs, btrfs: a change
/// after a read of the time gets a finer one); before, ctime moves with
/// the clock tick (1-10 ms), and a change in the tick of a stamp would
/// leave it as it was. Tried eight times in a row, each try far shorter
/// than a tick, on a directory made for it in `parent` and removed.
pub fn ctime_moves_with_every_change(parent: &Path) -> std::io::Result<bool> {
    use nix::sys::stat::{fchmod, fstat, Mode};
    let path = parent.join(format!(".actionfs-ctime-probe-{}", std::process::id()));
    if path.exists() {
        materialize::remove_tree(&path).map_err(std::io::Error::other)?;
    }
    std::fs::DirBuilder::new().mode(0o700).create(&path)?;
    let probe = DirFd::open(&path);
    let moved = probe.and_then(|dir| {
        for attempt in 0..8 {
            let before = fstat(&dir)?;
            let mode = if attempt % 2 == 0 { 0o750 } else { 0o700 };
            fchmod(&dir, Mode::from_bits_truncate(mode))?;
            let after = fstat(&dir)?;
            if (after.st_ctime, after.st_ctime_nsec) == (before.st_ctime, before.st_ctime_nsec) {
                return Ok(false);
            }
        }
        Ok(true)
    });
    std::fs::remove_dir(&path)?;
    moved
}

impl Pool {
    fn open(path: &Path, dev: u64, limit: usize) -> Result<Pool, Error> {
        if path.exists() {
            // Left by a process of the same pid that died.
            materialize::remove_tree(path)?;
        }
        std::fs::create_dir(path).map_err(|e| Error::new("mkdir", path, e))?;
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| Error::new("chmod", path, e))?;
        let dir = DirFd::open(path).map_err(|e| Error::new("open", path, e))?;
        let trash = Trash::open(&path.join("trash"), 1)?;
        Ok(Pool {
            path: path.to_owned(),
            dev,
            dir,
            trash,
            next: AtomicU64::new(0),
            limit,
            kept: Mutex::default(),
            misses: AtomicUsize::new(0),
            probes: AtomicUsize::new(0),
            arriving: Mutex::new(0),
            arrived: Condvar::new(),
        })
    }

    pub fn trash(&self) -> &Trash {
        &self.trash
    }

    /// Keeps the stashes handed on in the directory `handed` reads (see
    /// [`Stashes::hand_on`]) whose roots are as they were left but for the
    /// renames; says what it did in the log. Returns that directory, for
    /// the caller to remove.
    fn adopt(&self, handed: Reading) -> PathBuf {
        let (dir, read) = handed.finish();
        match read {
            Ok(handed) => {
                let offered = handed.len();
                let kept = handed
                    .into_iter()
                    .filter(|stash| self.adopt_one(&dir, stash))
                    .count();
                log::info!("adopted {kept} of {offered} stashes handed on in {dir:?}");
            }
            Err(why) => log::warn!("stashes handed on in {dir:?} not adopted: {why}"),
        }
        dir
    }

    /// Moves stash `handed` of hand-off directory `from` into this pool
    /// and keeps it, if its root has not changed but by being renamed.
    fn adopt_one(&self, from: &Path, handed: &Handed) -> bool {
        let mut names = Path::new(&handed.name).components();
        let plain = matches!(
            (names.next(), names.next()),
            (Some(std::path::Component::Normal(_)), None)
        );
        let left = handed.stamps.get(Path::new(""));
        let (Some(left), true) = (left, plain) else {
            return false;
        };
        let path = self.new_path();
        if std::fs::rename(from.join(&handed.name), &path).is_err() {
            return false;
        }
        let opened = DirFd::open(&path).ok();
        let now = opened.as_ref().and_then(|dir| Stamp::of_dir(dir).ok());
        match (opened, now) {
            (Some(dir), Some(now)) if left.same_but_renamed(&now) => {
                let mut stamps = handed.stamps.clone();
                stamps.insert(PathBuf::new(), now);
                self.keep(path, dir, handed.shape.clone(), stamps);
                true
            }
            _ => {
                self.discard(&path, None);
                false
            }
        }
    }

    /// A name in the pool for a new stash.
    fn new_name(&self) -> String {
        format!("stash-{}", self.next.fetch_add(1, Ordering::Relaxed))
    }

    fn new_path(&self) -> PathBuf {
        self.path.join(self.new_name())
    }

    /// A new, empty stash directory.
    pub fn new_dir(&self) -> Result<(PathBuf, DirFd), Error> {
        let name = self.new_name();
        let path = self.path.join(&name);
        let cname = CString::new(name).expect("no NUL in a number");
        self.dir
            .mkdir_at(&cname, 0o700)
            .map_err(|e| Error::new("mkdirat", &path, e))?;
        let dir = self
            .dir
            .open_at(&cname)
            .map_err(|e| Error::new("openat", &path, e))?;
        Ok((path, dir))
    }

    /// Keeps the stash in `dir` (at `path`), shaped `shape` and stamped
    /// `stamps`, dropping the oldest stashes beyond the bounds.
    pub fn keep(&self, path: PathBuf, dir: DirFd, shape: Dir, stamps: Stamps) {
        let bytes = shape.bytes();
        let mut kept = self.kept.lock();
        kept.bytes += bytes;
        kept.stashes.push_back(Stash {
            path,
            dir,
            shape,
            stamps,
            bytes,
        });
        while kept.stashes.len() > self.limit || kept.bytes > MAX_BYTES {
            let Some(old) = kept.stashes.pop_front() else {
                break;
            };
            kept.bytes -= old.bytes;
            self.discard_stash(old);
        }
    }

    /// Takes the stash that reshapes into `want` with the fewest changes,
    /// if that is fewer than building `want` afresh.
    pub fn take(&self, want: &Dir) -> Option<Stash> {
        {
            let mut arriving = self.arriving.lock();
            if *arriving > 0 {
                // Timing out only means choosing among fewer stashes.
                let _ = self
                    .arrived
                    .wait_while_for(&mut arriving, |n| *n > 0, ARRIVAL_WAIT);
            }
        }
        let taken = self.best(want);
        match taken {
            Some(_) => self.misses.store(0, Ordering::Relaxed),
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        taken
    }

    /// Announces a stash that a destroy will make after its answer, so
    /// that builds meanwhile wait for it rather than miss it.
    pub fn expect(self: &Arc<Pool>) -> Arriving {
        *self.arriving.lock() += 1;
        Arriving(self.clone())
    }

    /// Whether a destroyed sandbox should be stashed: always while
    /// stashes are being taken, else now and then, to notice when they
    /// would be again.
    pub fn wants_more(&self) -> bool {
        self.misses.load(Ordering::Relaxed) < MISSES_BEFORE_PROBING
            || self.probes.fetch_add(1, Ordering::Relaxed) % PROBE_EVERY == 0
    }

    fn best(&self, want: &Dir) -> Option<Stash> {
        let mut kept = self.kept.lock();
        // Reshaping removes the stash's links that `want` lacks and makes
        // those it lacks: not the stash that shares the most links, which
        // may be a large superset, but the one that differs least.
        let (index, changes) = kept
            .stashes
            .iter()
            .enumerate()
            .map(|(i, stash)| (i, reshape_changes(&stash.shape, want)))
            .min_by_key(|&(_, changes)| changes)?;
        // Building afresh makes every link of `want`.
        if changes >= want.links() {
            return None;
        }
        let stash = kept.stashes.remove(index)?;
        kept.bytes -= stash.bytes;
        Some(stash)
    }

    /// Deletes a stash directory in the background; `along` (what
    /// describes it: a shape and stamps, large for a large stash) is freed
    /// there too, off the caller's path.
    pub fn discard(&self, path: &Path, along: Option<Box<dyn Send>>) {
        if let Err(err) = self.trash.discard_along(path, along) {
            log::warn!("cannot discard stash {path:?}: {err}");
        }
    }

    /// Discards a stash that was kept, with its shape and stamps.
    pub fn discard_stash(&self, stash: Stash) {
        let path = stash.path.clone();
        self.discard(&path, Some(Box::new(stash)));
    }

    /// Stashes kept now.
    pub fn kept(&self) -> usize {
        self.kept.lock().stashes.len()
    }

    fn remove(&self) {
        self.kept.lock().stashes.clear();
        self.trash.wait_idle();
        if let Err(err) = materialize::remove_tree(&self.path) {
            log::warn!("cannot remove the stashes in {:?}: {err}", self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::materialize::shape::Node;

    #[test]
    fn only_another_daemons_pool_is_stale() {
        let ours = format!("{POOL_PREFIX}{}", std::process::id());
        let other = format!("{POOL_PREFIX}{}", std::process::id() + 1);
        assert!(is_stale_pool(other.as_ref()));
        assert!(!is_stale_pool(ours.as_ref()));
        for name in ["trees", "links", "trash", ".actionfs-stash"] {
            assert!(!is_stale_pool(name.as_ref()), "{name}");
        }
    }

    /// On a kernel with multigrain timestamps (6.13 on) the probe finds
    /// ctime moving on tmpfs and on the disk, so stashes are kept there;
    /// it leaves nothing behind. (Its other answer, on an older kernel,
    /// cannot be had on this one.)
    #[test]
    fn the_ctime_probe_passes_where_timestamps_are_multigrain_and_leaves_nothing() {
        let release = nix::sys::utsname::uname().unwrap();
        let release = release.release().to_string_lossy().into_owned();
        let mut numbers = release.split(|c: char| !c.is_ascii_digit());
        let major: u32 = numbers.next().unwrap().parse().unwrap();
        let minor: u32 = numbers.next().unwrap().parse().unwrap();
        let disk = tempfile::tempdir_in("/var/tmp").unwrap();
        let shm = Path::new("/dev/shm")
            .is_dir()
            .then(|| tempfile::tempdir_in("/dev/shm").unwrap());
        for dir in [Some(disk.path()), shm.as_ref().map(|d| d.path())]
            .into_iter()
            .flatten()
        {
            let moved = ctime_moves_with_every_change(dir).unwrap();
            if (major, minor) >= (6, 13) {
                assert!(moved, "{release}: {dir:?}");
            }
            assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0, "{dir:?}");
        }
    }

    /// A shape of links `0..n`, each to `/u/<i>`.
    fn links_up_to(n: usize) -> Dir {
        let entries = (0..n)
            .map(|i| (i.to_string().into(), Node::Link(format!("/u/{i}").into())))
            .collect();
        Dir::new(entries)
    }

    fn stash_shaped(pool: &Pool, shape: Dir) {
        let (path, dir) = pool.new_dir().unwrap();
        pool.keep(path, dir, shape, Stamps::new());
    }

    #[test]
    fn a_build_takes_the_stash_that_differs_least_not_the_one_sharing_most() {
        let base = tempfile::tempdir().unwrap();
        let pool = Pool::open(&base.path().join("pool"), 0, 8).unwrap();
        // A chain of builds: each wants a few more inputs than the last.
        stash_shaped(&pool, links_up_to(600));
        stash_shaped(&pool, links_up_to(150));
        // 600 shares all 180 but costs 420 removals; 150 costs 30 links.
        let taken = pool
            .take(&links_up_to(180))
            .expect("a stash cheaper than afresh");
        assert_eq!(taken.shape.links(), 150);
        // Reshaping 600 into 100 (500 removals) costs more than 100 links.
        assert!(pool.take(&links_up_to(100)).is_none());
        assert_eq!(pool.kept(), 1);
        // 600 into 400: 200 removals, fewer than 400 links afresh.
        assert_eq!(pool.take(&links_up_to(400)).unwrap().shape.links(), 600);
        pool.remove();
    }

    /// A real stash in `pool`: one directory holding a link to `target`.
    fn stash_linking_to(pool: &Pool, target: &str) {
        let (path, dir) = pool.new_dir().unwrap();
        std::fs::create_dir(path.join("inc")).unwrap();
        std::os::unix::fs::symlink(target, path.join("inc/a.h")).unwrap();
        let inc = Dir::new(
            [("a.h".into(), Node::Link(target.into()))]
                .into_iter()
                .collect(),
        );
        let shape = Dir::new(
            [("inc".into(), Node::Dir(Arc::new(inc)))]
                .into_iter()
                .collect(),
        );
        let inc_dir = DirFd::open(&path.join("inc")).unwrap();
        let stamps = Stamps::from([
            (PathBuf::new(), Stamp::of_dir(&dir).unwrap()),
            (PathBuf::from("inc"), Stamp::of_dir(&inc_dir).unwrap()),
        ]);
        pool.keep(path, dir, shape, stamps);
    }

    #[test]
    fn stashes_handed_on_are_adopted_unless_they_link_into_the_old_daemon_or_changed() {
        let base = tempfile::tempdir().unwrap();
        let dev = device_of_path(base.path()).unwrap();
        let own = base.path().join("actionfs-serve-1");
        let pool = Pool::open(&base.path().join("pool"), dev, 8).unwrap();
        stash_linking_to(&pool, "/store/c/abc");
        stash_linking_to(&pool, &own.join("links/0").display().to_string());
        stash_linking_to(&pool, "/exec/root/ws/b.h");
        let stashes = Stashes {
            limit: 8,
            native_dir: base.path().to_owned(),
            pools: Mutex::new(HashMap::from([(dev, Some(Arc::new(pool)))])),
            handed: Mutex::default(),
            adopting: Mutex::default(),
        };
        let to = base.path().join("handed");
        assert_eq!(
            stashes.hand_on(&to, &own).unwrap(),
            2,
            "not the one into {own:?}"
        );
        assert_eq!(stashes.kept(), 0);
        // One of the two changes while handed on: an entry added.
        std::fs::write(to.join("stash-1/intruder"), "x").unwrap();

        let next = Pool::open(&base.path().join("next"), dev, 8).unwrap();
        remove_handed(&next.adopt(Reading::start(to.clone())));
        assert!(!to.exists(), "taken");
        assert_eq!(next.kept(), 1, "the changed one is not");
        let mut targets = Vec::new();
        for stash in &next.kept.lock().stashes {
            let Some(Node::Link(target)) = stash.shape.at(Path::new("inc/a.h")) else {
                panic!("shape read back: {:?}", stash.shape);
            };
            targets.push(target.clone());
            assert!(reuse_is_possible(stash), "its stamps hold where it is now");
        }
        assert_eq!(targets, ["/store/c/abc"]);
        next.remove();
        stashes.remove_all();
    }

    #[test]
    fn stashes_handed_on_are_adopted_from_the_start_not_at_the_first_build() {
        let base = tempfile::tempdir().unwrap();
        let dev = device_of_path(base.path()).unwrap();
        let own = base.path().join("actionfs-serve-1");
        let first = Stashes::new(base.path(), 8);
        let pool = Pool::open(&base.path().join("pool"), dev, 8).unwrap();
        stash_linking_to(&pool, "/store/c/abc");
        let shape = pool.kept.lock().stashes[0].shape.clone();
        first.pools.lock().insert(dev, Some(Arc::new(pool)));
        let to = base.path().join("handed");
        assert_eq!(first.hand_on(&to, &own).unwrap(), 1);
        first.remove_all();

        // The native directory is on the hand-off's file system: its pool
        // opens now, before any build asks for one.
        let next = Stashes::new(base.path(), 8);
        next.adopt_from(Reading::start(to.clone()));
        let pool = next.pools.lock().get(&dev).cloned().flatten();
        let pool = pool.expect("a pool opened by the adoption itself");
        next.adopted();
        assert!(!to.exists(), "taken");
        assert_eq!(pool.kept(), 1);
        let taken = pool.take(&shape).expect("the adopted stash");
        assert!(reuse_is_possible(&taken));
        next.remove_all();
    }

    /// Where the cutoff goes by file system (serve's), the native
    /// directory is made at the first native build; adopting stashes
    /// makes it, so that their pool opens, and they are adopted, before
    /// any build.
    #[test]
    fn stashes_are_adopted_before_the_first_build_makes_the_native_directory() {
        let base = tempfile::tempdir().unwrap();
        let dev = device_of_path(base.path()).unwrap();
        let first = Stashes::new(base.path(), 8);
        let pool = Pool::open(&base.path().join("pool"), dev, 8).unwrap();
        stash_linking_to(&pool, "/store/c/abc");
        first.pools.lock().insert(dev, Some(Arc::new(pool)));
        let to = base.path().join("handed");
        assert_eq!(first.hand_on(&to, &base.path().join("own")).unwrap(), 1);
        first.remove_all();

        let dir = base.path().join("native");
        let native = super::super::NativeSandboxes::new(
            &dir,
            super::super::cutoff::Policy::ByFileSystem,
            super::super::Method::Symlink,
            8,
        );
        native.adopt_stashes(Reading::start(to.clone()));
        let stashes = native.stashes.as_ref().unwrap();
        stashes.adopted();
        assert!(!to.exists(), "taken");
        assert_eq!(stashes.kept(), 1);
        stashes.remove_all();
    }

    fn reuse_is_possible(stash: &Stash) -> bool {
        crate::sandbox::materialize::reuse::unchanged_tree(&stash.dir, &stash.shape, &stash.stamps)
    }
}
