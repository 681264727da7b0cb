//! The content store of `actionfs serve`: content-addressed inputs a
//! client pushes by SHA-256 digest, kept for the sandboxes whose trees
//! reference them. It knows no protocol: keys are digests in 64 lowercase
//! hex digits (anything else is refused, so a key is always a safe file
//! name), values are file content or directory blobs.
//!
//! - **Content** is captured at once and never read from its source again:
//!   a reflink where the file systems can ([`sys::clone_open_file`]), else
//!   a copy hashed as it is written, into a temporary file that is renamed
//!   into place once its bytes hash to the digest. Files live at
//!   `<dir>/c/<hash>` (mode 0444); the executable variant `<dir>/x/<hash>`
//!   (0555, its own inode, since modes are per inode) is made from it the
//!   first time a sandbox wants it executable.
//! - **Directory blobs** are kept in memory.
//! - **Pins**: [`ContentStore::acquire`] pins every wanted entry for a
//!   sandbox, all or nothing; [`ContentStore::release`] unpins them. A
//!   pinned entry is never evicted; a [`Retention::SingleUse`] entry goes
//!   once the sandboxes that used it are all released.
//! - **Size bound**: past `max_bytes`, the least recently used unpinned
//!   entries are evicted; an evicted digest is simply absent.
//!
//! The store is per daemon run: opening it removes what a previous run
//! left, closing or dropping it removes everything; a run may hand its
//! content on to the next instead ([`warm`]). One mutex guards the
//! index ([`index`]); hashing and copying happen outside it, and only the
//! renames and unlinks that must agree with the index happen under it.

mod digest;
mod error;
mod index;
#[cfg(test)]
mod tests;
mod warm;

use std::ffi::CString;
use std::fs::{self, File, Permissions};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use parking_lot::Mutex;

use crate::sandbox::dirfd::{kind_of, open_file_at, DirFd};
use crate::sandbox::file_kind::FileKind;
use crate::sys;

pub use digest::Digest;
pub use error::{AcquireError, Missing, Op, StoreError};
use index::{Index, Kind, Removed};
pub use warm::{Adopted, HandedOn};

/// How long a content entry is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// Until evicted by the size bound.
    Keep,
    /// Until no sandbox pins it any more after one has used it (a push not
    /// yet used survives until its sandbox comes). Pushing it again as
    /// [`Retention::Keep`] keeps it.
    SingleUse,
}

/// What the store knows of a content digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Present,
    /// Held once, then evicted or spent.
    Gone,
    /// Never put.
    Absent,
}

/// What the store holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Content entries and directory blobs.
    pub entries: usize,
    /// Their bytes (an executable variant counts again).
    pub bytes: u64,
    /// Entries pinned by at least one sandbox.
    pub pinned: usize,
}

/// The entries a sandbox's tree acquired, to acquire again for another
/// sandbox of the same tree.
pub struct Acquired {
    /// The content generation they were pinned at.
    generation: u64,
    /// Their slots, sorted, each once.
    slots: Vec<u32>,
    /// Each wanted entry's slot, in the order wanted: checked against the
    /// same wanted list when the generation changed (4 bytes an entry; the
    /// digests are the caller's, who keeps them anyway).
    of_wanted: Vec<u32>,
}

/// File mode of content files and of executable variants.
const CONTENT_MODE: u32 = 0o444;
const EXECUTABLE_MODE: u32 = 0o555;

/// The subdirectories: content, executable variants, temporary files.
const SUBDIRS: [&str; 3] = ["c", "x", "tmp"];

struct State {
    index: Index,
    /// Content that was held and is gone (evicted, or single-use and
    /// spent): a sandbox needing it must have it pushed again, not read
    /// from elsewhere.
    gone: std::collections::HashSet<Digest>,
    /// Changes whenever content comes or goes, so that lookups made at
    /// one generation hold while it lasts.
    generation: u64,
    /// Over the bound with only pinned entries left (logged once).
    over_bound: bool,
}

pub struct ContentStore {
    root: PathBuf,
    content_path: PathBuf,
    executable_path: PathBuf,
    temp_path: PathBuf,
    content: DirFd,
    executable: DirFd,
    temp: DirFd,
    max_bytes: u64,
    state: Mutex<State>,
    next_temp: AtomicU64,
    /// Devices of sources where a reflink cannot work (EXDEV, EOPNOTSUPP):
    /// captures from them copy at once.
    no_reflink: Mutex<Vec<u64>>,
    /// The store's own file system cannot reflink (tmpfs): executable
    /// variants are copied at once, not after a clone that makes and
    /// unlinks a file to fail.
    copies_own: AtomicBool,
    closed: bool,
}

/// A temporary file's name, unlinked on drop unless it was renamed away.
struct Temp<'a> {
    dir: &'a DirFd,
    name: CString,
    armed: bool,
}

impl Drop for Temp<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.dir.unlink_at(&self.name, false);
        }
    }
}

fn parse(key: &str) -> Result<Digest, StoreError> {
    Digest::parse(key).ok_or_else(|| StoreError::BadDigest {
        key: key.to_owned(),
    })
}

/// A validated digest's hex as a file name.
fn file_name(hex: &str) -> CString {
    CString::new(hex).expect("hex digits hold no NUL")
}

/// Errors that mean a reflink cannot work here, as opposed to a failure.
fn reflink_unsupported(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(
            libc::EXDEV
                | libc::EOPNOTSUPP
                | libc::ENOTTY
                | libc::ENOSYS
                | libc::EINVAL
                | libc::EPERM
        )
    )
}

/// The same for every file from one device (the store's is fixed).
fn reflink_never(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EXDEV | libc::EOPNOTSUPP | libc::ENOTTY | libc::ENOSYS)
    )
}

fn chmod_at(dir: &DirFd, name: &CString, mode: u32) -> io::Result<()> {
    nix::sys::stat::fchmodat(
        dir,
        name.as_c_str(),
        Mode::from_bits_truncate(mode as _),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )?;
    Ok(())
}

/// Removes `path` whatever it is (nothing if absent).
fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err),
    }
}

impl ContentStore {
    /// Opens a store in `dir` (made with mode 0700 if absent), bounded to
    /// `max_bytes`. What a previous run left in its subdirectories is
    /// removed; anything else in `dir` is left alone.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<ContentStore, StoreError> {
        ContentStore::open_taking(dir, max_bytes, |_| ()).map(|(store, ())| store)
    }

    /// [`ContentStore::open`], with `take` called on the store's directory
    /// once what a previous run left is removed and before the
    /// subdirectories are made (those it puts there are kept); returns
    /// what `take` did too.
    fn open_taking<T>(
        dir: &Path,
        max_bytes: u64,
        take: impl FnOnce(&Path) -> T,
    ) -> Result<(ContentStore, T), StoreError> {
        let err = |call, path: &Path| StoreError::io(Op::Open, None, call, path);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err("mkdir", dir))?;
        let root = dir.canonicalize().map_err(err("realpath", dir))?;
        fs::set_permissions(&root, Permissions::from_mode(0o700)).map_err(err("chmod", &root))?;
        for sub in SUBDIRS {
            let path = root.join(sub);
            remove_any(&path).map_err(err("remove", &path))?;
        }
        let taken = take(&root);
        let mut fds = Vec::with_capacity(SUBDIRS.len());
        for sub in SUBDIRS {
            let path = root.join(sub);
            match fs::DirBuilder::new().mode(0o700).create(&path) {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                made => made.map_err(err("mkdir", &path))?,
            }
            // The mode regardless of the umask.
            fs::set_permissions(&path, Permissions::from_mode(0o700))
                .map_err(err("chmod", &path))?;
            fds.push(DirFd::open(&path).map_err(err("open", &path))?);
        }
        let [content, executable, temp] = <[DirFd; 3]>::try_from(fds).expect("three");
        let store = ContentStore {
            content_path: root.join(SUBDIRS[0]),
            executable_path: root.join(SUBDIRS[1]),
            temp_path: root.join(SUBDIRS[2]),
            root,
            content,
            executable,
            temp,
            max_bytes,
            state: Mutex::new(State {
                index: Index::default(),
                gone: Default::default(),
                generation: 0,
                over_bound: false,
            }),
            next_temp: AtomicU64::new(0),
            no_reflink: Mutex::new(Vec::new()),
            copies_own: AtomicBool::new(false),
            closed: false,
        };
        Ok((store, taken))
    }

    /// The store's directory (canonical).
    pub fn path(&self) -> &Path {
        &self.root
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    pub fn usage(&self) -> Usage {
        let state = self.state.lock();
        Usage {
            entries: state.index.entries(),
            bytes: state.index.bytes(),
            pinned: state.index.pinned(),
        }
    }

    /// Whether content `hash` is held, was held and is gone, or was never
    /// held (a bad key is absent).
    pub fn lookup(&self, hash: &str) -> Lookup {
        match Digest::parse(hash) {
            Some(digest) => self.lookup_all(std::iter::once(digest)).0[0],
            None => Lookup::Absent,
        }
    }

    /// The content generation: it changes whenever content comes or goes,
    /// so [`ContentStore::lookup_all`]'s answers hold while it is the same.
    pub fn generation(&self) -> u64 {
        self.state.lock().generation
    }

    /// [`ContentStore::lookup`] of many digests, under one lock, and the
    /// generation they were made at.
    pub fn lookup_all(&self, digests: impl Iterator<Item = Digest>) -> (Vec<Lookup>, u64) {
        let state = self.state.lock();
        let found = digests
            .map(|digest| {
                if state.index.find(&digest, Kind::Content).is_some() {
                    Lookup::Present
                } else if !state.gone.is_empty() && state.gone.contains(&digest) {
                    Lookup::Gone
                } else {
                    Lookup::Absent
                }
            })
            .collect();
        (found, state.generation)
    }

    /// Whether content `hash` is held (a bad key is not).
    pub fn contains(&self, hash: &str) -> bool {
        self.lookup(hash) == Lookup::Present
    }

    /// Keeps directory blob `bytes` under `hash`, which they must hash to.
    pub fn put_directory(&self, hash: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        let digest = parse(hash)?;
        let actual = Digest::of(&bytes);
        if actual != digest {
            return Err(StoreError::Mismatch {
                op: Op::PutDirectory,
                digest: hash.to_owned(),
                path: None,
                actual: actual.hex(),
            });
        }
        let size = bytes.len() as u64;
        self.check_size(Op::PutDirectory, hash, size)?;
        let mut state = self.state.lock();
        if let Some(slot) = state.index.find(&digest, Kind::Directory) {
            state.index.touch(slot);
            return Ok(());
        }
        let slot = state.index.insert(digest, Kind::Directory, size, false);
        state.index.set_blob(slot, Arc::from(bytes));
        self.evict(&mut state, Some(slot));
        Ok(())
    }

    /// Every directory blob held, least recently used first.
    pub fn directory_blobs(&self) -> Vec<Arc<[u8]>> {
        self.state.lock().index.directory_blobs()
    }

    /// Directory blob `hash`, if held (a use, for the size bound).
    pub fn directory(&self, hash: &str) -> Option<Arc<[u8]>> {
        let digest = Digest::parse(hash)?;
        let mut state = self.state.lock();
        let slot = state.index.find(&digest, Kind::Directory)?;
        state.index.touch(slot);
        state.index.blob(slot)
    }

    /// Stores content `bytes` under `hash`, which they must hash to.
    pub fn put_bytes(
        &self,
        hash: &str,
        bytes: &[u8],
        retention: Retention,
    ) -> Result<(), StoreError> {
        let digest = parse(hash)?;
        let actual = Digest::of(bytes);
        if actual != digest {
            return Err(StoreError::Mismatch {
                op: Op::PutBytes,
                digest: hash.to_owned(),
                path: None,
                actual: actual.hex(),
            });
        }
        self.check_size(Op::PutBytes, hash, bytes.len() as u64)?;
        if self.repush(&digest, retention) {
            return Ok(());
        }
        let temp = self.new_temp(hash);
        let temp_path = self.temp_file_path(&temp);
        let err = |call| StoreError::io(Op::PutBytes, Some(hash), call, &temp_path);
        let mut file = self
            .temp
            .create_file(&temp.name, CONTENT_MODE)
            .map_err(err("create"))?;
        file.write_all(bytes).map_err(err("write"))?;
        file.set_permissions(Permissions::from_mode(CONTENT_MODE))
            .map_err(err("fchmod"))?;
        drop(file);
        self.install(
            Op::PutBytes,
            &digest,
            hash,
            bytes.len() as u64,
            retention,
            temp,
        )
    }

    /// Snapshots the file at `source` (symlinks followed; it must be a
    /// regular file) as content `hash`: a reflink where the file systems
    /// share extents, else a copy; never a hard link, and the source is not
    /// read again afterwards. The snapshot must hash to `hash`. Content
    /// already held is not captured again.
    pub fn capture(
        &self,
        hash: &str,
        source: &Path,
        retention: Retention,
    ) -> Result<(), StoreError> {
        let digest = parse(hash)?;
        if self.repush(&digest, retention) {
            return Ok(());
        }
        let err = |call, path: &Path| StoreError::io(Op::Capture, Some(hash), call, path);
        // Not O_NOFOLLOW: runfiles are symlinks. O_NONBLOCK: a FIFO must
        // not hang the open (it is refused just after).
        let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK;
        let file = nix::fcntl::open(source, flags, Mode::empty())
            .map(File::from)
            .map_err(|e| err("open", source)(e.into()))?;
        let st = nix::sys::stat::fstat(&file).map_err(|e| err("fstat", source)(e.into()))?;
        let kind = kind_of(&st);
        if kind != FileKind::RegularFile {
            return Err(StoreError::NotRegularFile {
                digest: hash.to_owned(),
                path: source.to_owned(),
                kind,
            });
        }
        self.check_size(Op::Capture, hash, st.st_size as u64)?;
        // dev_t is i32 on macOS.
        #[allow(clippy::unnecessary_cast)]
        let device = st.st_dev as u64;

        let temp = self.new_temp(hash);
        let temp_path = self.temp_file_path(&temp);
        let (actual, size) = if self
            .reflink(&file, device, &temp)
            .map_err(err("clone", source))?
        {
            // The clone is the snapshot: hash it, not the source.
            chmod_at(&self.temp, &temp.name, CONTENT_MODE).map_err(err("chmod", &temp_path))?;
            let clone =
                open_file_at(self.temp.as_fd(), &temp.name).map_err(err("open", &temp_path))?;
            digest::hash_reader(clone).map_err(err("read", &temp_path))?
        } else {
            let mut target = self
                .temp
                .create_file(&temp.name, CONTENT_MODE)
                .map_err(err("create", &temp_path))?;
            let size = st.st_size as u64;
            let copied =
                copy_hashing(&file, size, &mut target).map_err(|(call, e)| match call {
                    "read" => err(call, source)(e),
                    _ => err(call, &temp_path)(e),
                })?;
            target
                .set_permissions(Permissions::from_mode(CONTENT_MODE))
                .map_err(err("fchmod", &temp_path))?;
            copied
        };
        drop(file);
        if actual != digest {
            return Err(StoreError::Mismatch {
                op: Op::Capture,
                digest: hash.to_owned(),
                path: Some(source.to_owned()),
                actual: actual.hex(),
            });
        }
        self.install(Op::Capture, &digest, hash, size, retention, temp)
    }

    /// Pins every `wanted` content entry for `sandbox` and returns their
    /// paths in order (the executable variant's, made now if it was never
    /// wanted before, for `(hash, true)`). All or nothing: if any is absent,
    /// nothing is pinned and every absent digest is named, each once, in
    /// the order first wanted. A sandbox pins an entry once however often
    /// it wants it; acquire and release of one sandbox must not race.
    pub fn acquire(
        &self,
        sandbox: &str,
        wanted: &[(&str, bool)],
    ) -> Result<Vec<PathBuf>, AcquireError> {
        let digests = wanted
            .iter()
            .map(|&(hash, executable)| Ok((parse(hash)?, executable)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        self.acquire_tree(sandbox, &digests)?;
        Ok(wanted
            .iter()
            .map(|&(hash, executable)| self.dir_of(executable).join(hash))
            .collect())
    }

    /// [`ContentStore::acquire`] of digests already parsed, returning what
    /// it pinned (to pin the same entries for the next sandbox of the
    /// same tree, [`ContentStore::acquire_again`]) and no path: a tree of
    /// thousands of files names each one's by [`ContentStore::dir_of`]
    /// and its hash where it needs it, not in a path allocated per file.
    pub fn acquire_tree(
        &self,
        sandbox: &str,
        wanted: &[(Digest, bool)],
    ) -> Result<Acquired, AcquireError> {
        let mut make_executable = Vec::new();
        let (pinned, generation, slots_of_wanted) = {
            let mut state = self.state.lock();
            let mut slots = Vec::with_capacity(wanted.len());
            let mut missing = Vec::new();
            for (i, (digest, _)) in wanted.iter().enumerate() {
                match state.index.find(digest, Kind::Content) {
                    Some(slot) => slots.push(slot),
                    None => missing.push(i),
                }
            }
            if !missing.is_empty() {
                drop(state);
                let mut seen = std::collections::HashSet::with_capacity(missing.len());
                let hashes = missing
                    .into_iter()
                    .filter(|&i| seen.insert(wanted[i].0))
                    .map(|i| wanted[i].0.hex())
                    .collect();
                return Err(Missing { hashes }.into());
            }
            for (i, &(_, executable)) in wanted.iter().enumerate() {
                if executable && !state.index.is_executable(slots[i]) {
                    make_executable.push(i);
                }
            }
            let pinned = state.index.pin(sandbox, &slots);
            (pinned, state.generation, slots)
        };
        make_executable.sort_unstable_by_key(|&i| wanted[i].0);
        make_executable.dedup_by_key(|i| wanted[*i].0);
        for i in make_executable {
            let digest = &wanted[i].0;
            if let Err(err) = self.make_executable(digest, &digest.hex()) {
                self.state.lock().index.unpin(sandbox, Some(&pinned));
                return Err(err.into());
            }
        }
        Ok(Acquired {
            generation,
            slots: pinned,
            of_wanted: slots_of_wanted,
        })
    }

    /// The directory holding content entries as files named by their
    /// hashes: their executable variants' if `executable`.
    pub fn dir_of(&self, executable: bool) -> &Path {
        if executable {
            &self.executable_path
        } else {
            &self.content_path
        }
    }

    /// Pins for `sandbox` what `acquired` pinned for another sandbox of
    /// the same `wanted` entries (digest, executable), if each is still
    /// held: at once if no content came or went since, else checked slot
    /// by slot (other content comes and goes with every action's
    /// single-use inputs); false, pinning nothing, if one went. Costs no
    /// hash lookup and no path per entry.
    pub fn acquire_again(
        &self,
        sandbox: &str,
        acquired: &Acquired,
        wanted: impl Iterator<Item = (Digest, bool)>,
    ) -> bool {
        let mut state = self.state.lock();
        if state.generation != acquired.generation {
            let index = &state.index;
            let mut count = 0;
            let intact =
                acquired
                    .of_wanted
                    .iter()
                    .zip(wanted)
                    .all(|(&slot, (digest, executable))| {
                        count += 1;
                        index.holds(slot, &digest, executable)
                    });
            if !intact || count != acquired.of_wanted.len() {
                return false;
            }
        }
        state.index.pin(sandbox, &acquired.slots);
        true
    }

    /// Unpins everything `sandbox` pinned; single-use entries no sandbox
    /// pins any more go.
    pub fn release(&self, sandbox: &str) {
        let mut state = self.state.lock();
        for slot in state.index.unpin(sandbox, None) {
            if state.index.is_spent(slot) {
                let removed = state.index.remove(slot);
                self.remove_files(&mut state, &removed);
            }
        }
        self.evict(&mut state, None);
    }

    /// Removes the store's directory and everything in it, saying what
    /// failed (dropping the store does the same, logging a failure).
    pub fn close(mut self) -> Result<(), StoreError> {
        self.closed = true;
        self.remove_everything()
    }

    fn remove_everything(&self) -> Result<(), StoreError> {
        let err = |call, path: &Path| StoreError::io(Op::Close, None, call, path);
        for path in [&self.content_path, &self.executable_path, &self.temp_path] {
            remove_any(path).map_err(err("remove", path))?;
        }
        fs::remove_dir(&self.root).map_err(err("rmdir", &self.root))
    }

    fn check_size(&self, op: Op, hash: &str, size: u64) -> Result<(), StoreError> {
        if size > self.max_bytes {
            return Err(StoreError::TooLarge {
                op,
                digest: hash.to_owned(),
                size,
                max_bytes: self.max_bytes,
            });
        }
        Ok(())
    }

    /// If content `digest` is held, marks the push as a use and says so.
    fn repush(&self, digest: &Digest, retention: Retention) -> bool {
        let mut state = self.state.lock();
        match state.index.find(digest, Kind::Content) {
            Some(slot) => {
                state.index.repush(slot, retention == Retention::SingleUse);
                true
            }
            None => false,
        }
    }

    fn new_temp(&self, hash: &str) -> Temp<'_> {
        let n = self.next_temp.fetch_add(1, Ordering::Relaxed);
        Temp {
            dir: &self.temp,
            name: CString::new(format!("{hash}.{n}")).expect("no NUL"),
            armed: true,
        }
    }

    fn temp_file_path(&self, temp: &Temp<'_>) -> PathBuf {
        self.temp_path
            .join(std::ffi::OsStr::from_bytes(temp.name.to_bytes()))
    }

    /// Clones `source` as `temp`; false where reflinks cannot work.
    fn reflink(&self, source: &File, device: u64, temp: &Temp<'_>) -> io::Result<bool> {
        if self.no_reflink.lock().contains(&device) {
            return Ok(false);
        }
        match sys::clone_open_file(source.as_fd(), self.temp.as_fd(), &temp.name) {
            Ok(()) => Ok(true),
            Err(err) if reflink_unsupported(&err) => {
                if reflink_never(&err) {
                    let mut devices = self.no_reflink.lock();
                    if !devices.contains(&device) {
                        log::debug!(
                            "content store: no reflinks from device {device:#x} ({err}): copying"
                        );
                        devices.push(device);
                    }
                }
                Ok(false)
            }
            Err(err) => Err(err),
        }
    }

    /// Renames `temp` to `c/<hash>` and indexes it, unless a concurrent
    /// push got there first (then `temp` goes).
    fn install(
        &self,
        op: Op,
        digest: &Digest,
        hash: &str,
        size: u64,
        retention: Retention,
        mut temp: Temp<'_>,
    ) -> Result<(), StoreError> {
        let single_use = retention == Retention::SingleUse;
        let mut state = self.state.lock();
        if let Some(slot) = state.index.find(digest, Kind::Content) {
            state.index.repush(slot, single_use);
            return Ok(());
        }
        let name = file_name(hash);
        nix::fcntl::renameat(
            &self.temp,
            temp.name.as_c_str(),
            &self.content,
            name.as_c_str(),
        )
        .map_err(|e| {
            StoreError::io(op, Some(hash), "rename", &self.content_path.join(hash))(e.into())
        })?;
        temp.armed = false;
        let slot = state.index.insert(*digest, Kind::Content, size, single_use);
        state.gone.remove(digest);
        state.generation += 1;
        self.evict(&mut state, Some(slot));
        Ok(())
    }

    /// Makes `x/<hash>` from `c/<hash>` (pinned by the caller): a reflink
    /// or a copy, its own inode with mode 0555.
    fn make_executable(&self, digest: &Digest, hash: &str) -> Result<(), StoreError> {
        let name = file_name(hash);
        let temp = self.new_temp(hash);
        let content_path = self.content_path.join(hash);
        let temp_path = self.temp_file_path(&temp);
        let err = |call, path: &Path| StoreError::io(Op::Executable, Some(hash), call, path);
        let cloned = !self.copies_own.load(Ordering::Relaxed)
            && match sys::clone_file(self.content.as_fd(), &name, self.temp.as_fd(), &temp.name) {
                Ok(()) => true,
                Err(e) if reflink_unsupported(&e) => {
                    self.copies_own.store(reflink_never(&e), Ordering::Relaxed);
                    false
                }
                Err(e) => return Err(err("clone", &content_path)(e)),
            };
        if !cloned {
            let mut source =
                open_file_at(self.content.as_fd(), &name).map_err(err("open", &content_path))?;
            let mut target = self
                .temp
                .create_file(&temp.name, EXECUTABLE_MODE)
                .map_err(err("create", &temp_path))?;
            io::copy(&mut source, &mut target).map_err(err("copy", &temp_path))?;
        }
        chmod_at(&self.temp, &temp.name, EXECUTABLE_MODE).map_err(err("chmod", &temp_path))?;
        let mut temp = temp;
        let mut state = self.state.lock();
        let Some(slot) = state.index.find(digest, Kind::Content) else {
            return Ok(()); // released by a racing release of the sandbox
        };
        if state.index.is_executable(slot) {
            return Ok(()); // a concurrent acquire made it
        }
        nix::fcntl::renameat(
            &self.temp,
            temp.name.as_c_str(),
            &self.executable,
            name.as_c_str(),
        )
        .map_err(|e| err("rename", &self.executable_path.join(hash))(e.into()))?;
        temp.armed = false;
        state.index.set_executable(slot);
        self.evict(&mut state, None);
        Ok(())
    }

    /// Evicts least recently used unpinned entries while over the bound,
    /// never `protect` (the entry just put).
    fn evict(&self, state: &mut State, protect: Option<u32>) {
        while state.index.bytes() > self.max_bytes {
            match state.index.lru_head() {
                Some(slot) if Some(slot) != protect => {
                    let removed = state.index.remove(slot);
                    self.remove_files(state, &removed);
                }
                _ => break,
            }
        }
        let over = state.index.bytes() > self.max_bytes;
        if over && !state.over_bound {
            log::info!(
                "content store: {} bytes held, over the bound of {} bytes: the rest is in use",
                state.index.bytes(),
                self.max_bytes
            );
        }
        state.over_bound = over;
    }

    /// Unlinks an entry's files (under the index lock, so that a push of
    /// the same digest cannot rename its file in between).
    fn remove_files(&self, state: &mut State, removed: &Removed) {
        if removed.kind != Kind::Content {
            return;
        }
        state.gone.insert(removed.digest);
        state.generation += 1;
        let hash = removed.digest.hex();
        let name = file_name(&hash);
        let mut dirs = vec![(&self.content, &self.content_path)];
        if removed.executable {
            dirs.push((&self.executable, &self.executable_path));
        }
        for (dir, path) in dirs {
            if let Err(err) = dir.unlink_at(&name, false) {
                log::warn!(
                    "content store: unlink {}: {err}",
                    path.join(&hash).display()
                );
            }
        }
    }
}

impl Drop for ContentStore {
    fn drop(&mut self) {
        if !self.closed {
            if let Err(err) = self.remove_everything() {
                log::warn!("{err}");
            }
        }
    }
}

/// Copies `source` to `target`, hashing what is written; the failing call
/// ("read" or "write") with its error.
fn copy_hashing(
    mut source: &File,
    size: u64,
    target: &mut File,
) -> Result<(Digest, u64), (&'static str, io::Error)> {
    let mut hasher = digest::Hasher::new();
    // Sized to the file (one more byte reads its end): most inputs are a
    // few KiB, and a zeroed CHUNK per capture was a fifth of the capture
    // thread's time (memset, and page faults on memory the allocator had
    // given back).
    let len = usize::try_from(size.saturating_add(1))
        .map_or(digest::CHUNK, |n| n.clamp(512, digest::CHUNK));
    let mut buf = vec![0u8; len];
    loop {
        let n = match source.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(("read", err)),
        };
        hasher.update(&buf[..n]);
        target.write_all(&buf[..n]).map_err(|err| ("write", err))?;
    }
    let len = hasher.len;
    Ok((hasher.finish(), len))
}
