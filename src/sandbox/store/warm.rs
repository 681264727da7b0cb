//! Warm state: the content a store kept, handed on to the next store
//! opened beside it, so that a restarted backend does not capture again
//! what its predecessor already held.
//!
//! The store hands on its `c/` and `x/` by renaming them (no copy) into a
//! staging directory of its own with an `index` of what they hold, least
//! recently used first, then renames that into the agreed place: it is
//! published whole or not at all, and a backend killed on the way leaves
//! only its own directory, which the next start sweeps. The next store
//! takes it by one rename too (of two starting at once, one gets it) and
//! believes nothing it did not check: an entry whose file is missing, of
//! another size or mode, or not ours is dropped, as is every file the
//! index does not list. Bytes are not hashed again: the files are 0444 in
//! directories only the backend's user may enter, and that user could
//! change a running store's files as well.

use std::collections::HashSet;
use std::ffi::CStr;
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use super::digest::Digest;
use super::index::{Index, Kind};
use super::{
    file_name, remove_any, ContentStore, Op, StoreError, CONTENT_MODE, EXECUTABLE_MODE, SUBDIRS,
};
use crate::sandbox::dirfd::{kind_of, DirFd};
use crate::sandbox::file_kind::FileKind;
use crate::sandbox::ownership::{self, Rules};

/// The first line of an index, naming its format.
const HEADER: &str = "actionfs-warm-store 1";

/// What a store handed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandedOn {
    pub entries: usize,
    /// Content bytes, executable variants counted again.
    pub bytes: u64,
}

/// What a store adopted of a predecessor's, and what it dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adopted {
    pub entries: usize,
    pub bytes: u64,
    /// Listed entries (or executable variants) that failed a check, and
    /// files nothing listed.
    pub dropped: usize,
}

impl ContentStore {
    /// Hands the content this store keeps (every unpinned entry that is
    /// not single-use) on to `to`, replacing what was there; the store is
    /// empty afterwards. For the end of a backend's life, once its
    /// sandboxes are gone.
    pub fn hand_on(&self, to: &Path) -> Result<HandedOn, StoreError> {
        let err = |call, path: &Path| StoreError::io(Op::Close, None, call, path);
        let mut state = self.state.lock();
        let kept = state.index.kept_content();
        let staging = self.root.join("handing-on");
        remove_any(&staging).map_err(err("remove", &staging))?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&staging)
            .map_err(err("mkdir", &staging))?;
        let index_path = staging.join("index");
        let mut text = String::with_capacity(HEADER.len() + 1 + kept.len() * 80);
        text.push_str(HEADER);
        text.push('\n');
        let mut bytes = 0;
        for (digest, size, executable) in &kept {
            text.push_str(&format!(
                "{} {size} {}\n",
                digest.hex(),
                u8::from(*executable)
            ));
            bytes += size * if *executable { 2 } else { 1 };
        }
        fs::write(&index_path, text).map_err(err("write", &index_path))?;
        for (from, sub) in [
            (&self.content_path, SUBDIRS[0]),
            (&self.executable_path, SUBDIRS[1]),
        ] {
            let dest = staging.join(sub);
            fs::rename(from, &dest).map_err(err("rename", &dest))?;
        }
        // The files went with their directories: the index must agree.
        state.index = Index::default();
        state.gone.clear();
        state.generation += 1;
        drop(state);
        publish(&staging, to, &self.root.join("replaced")).map_err(err("rename", to))?;
        Ok(HandedOn {
            entries: kept.len(),
            bytes,
        })
    }

    /// [`ContentStore::open`], then the content a store handed on to
    /// `from`, if there is any: taken from there (the next store finds
    /// nothing) with one rename of each directory, then checked entry by
    /// entry, least recently used first as it was, and bounded by
    /// `max_bytes`. A hand-off that cannot be read is removed and the
    /// store opens empty; the second value says why.
    pub fn open_adopting(
        dir: &Path,
        max_bytes: u64,
        from: &Path,
    ) -> Result<(ContentStore, Result<Option<Adopted>, StoreError>), StoreError> {
        let (store, index) = ContentStore::open_taking(dir, max_bytes, |root| take(from, root))?;
        let adopted = match index {
            Ok(Some(text)) => store.adopt(&text).map(Some),
            Ok(None) => Ok(None),
            Err(err) => {
                // Nothing of it may stay: the store's index holds none of it.
                let state = store.state.lock();
                let _ = store.remove_unheld(&state.index, &HashSet::new());
                drop(state);
                Err(err)
            }
        };
        Ok((store, adopted))
    }

    /// Keeps each entry of `index` whose file passes the checks, in the
    /// index's order; removes every other file of `c/` and `x/`.
    fn adopt(&self, index: &str) -> Result<Adopted, StoreError> {
        let uid = nix::unistd::geteuid().as_raw();
        // Checked through the store's open directories: no path built.
        // (st_mode is u16 on macOS.)
        #[allow(clippy::unnecessary_cast)]
        let holds = |dir: &DirFd, name: &CStr, size: u64, mode: u32| {
            dir.stat_at(name).is_ok_and(|st| {
                kind_of(&st) == FileKind::RegularFile
                    && st.st_size as u64 == size
                    && st.st_mode as u32 & 0o7777 == mode
                    && st.st_uid == uid
            })
        };
        let mut state = self.state.lock();
        let mut adopted = Adopted {
            entries: 0,
            bytes: 0,
            dropped: 0,
        };
        let mut named = HashSet::new();
        for line in index.lines().skip(1) {
            let Some((digest, size, wants_executable)) = parse_line(line) else {
                adopted.dropped += 1;
                continue;
            };
            named.insert(digest);
            let name = file_name(&digest.hex());
            if state.index.find(&digest, Kind::Content).is_some()
                || size > self.max_bytes
                || !holds(&self.content, &name, size, CONTENT_MODE)
            {
                adopted.dropped += 1;
                continue;
            }
            let slot = state.index.insert(digest, Kind::Content, size, false);
            adopted.entries += 1;
            adopted.bytes += size;
            if !wants_executable {
                continue;
            }
            if holds(&self.executable, &name, size, EXECUTABLE_MODE) {
                state.index.set_executable(slot);
                adopted.bytes += size;
            } else {
                adopted.dropped += 1; // made again when wanted
            }
        }
        adopted.dropped += self.remove_unheld(&state.index, &named)?;
        if adopted.entries > 0 {
            state.generation += 1;
        }
        self.evict(&mut state, None);
        Ok(adopted)
    }

    /// Removes each file of `c/` and `x/` that `index` does not hold (as
    /// content, or as its executable variant); returns how many removed
    /// files of `c/` no line of the hand-off `named`.
    fn remove_unheld(&self, index: &Index, named: &HashSet<Digest>) -> Result<usize, StoreError> {
        let mut unnamed = 0;
        for (dir, executable) in [(&self.content_path, false), (&self.executable_path, true)] {
            let names =
                fs::read_dir(dir).map_err(|e| StoreError::io(Op::Open, None, "opendir", dir)(e))?;
            for entry in names.flatten() {
                let digest = entry.file_name().to_str().and_then(Digest::parse);
                let slot = digest.and_then(|digest| index.find(&digest, Kind::Content));
                if slot.is_some_and(|slot| !executable || index.is_executable(slot)) {
                    continue;
                }
                let _ = remove_any(&entry.path());
                if !executable && !digest.is_some_and(|d| named.contains(&d)) {
                    unnamed += 1;
                }
            }
        }
        Ok(unnamed)
    }
}

/// Takes the hand-off at `from` into store directory `root`: its `c/` and
/// `x/` become the store's, its index is returned (`None`: nothing there).
fn take(from: &Path, root: &Path) -> Result<Option<String>, StoreError> {
    let err = |call, path: &Path| StoreError::io(Op::Open, None, call, path);
    // In a shared base (/dev/shm) the name can be anyone's: only a
    // directory of this user's alone is a hand-off (its files' owners are
    // checked too, as they are adopted).
    match ownership::check(from, &Rules::PRIVATE) {
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(StoreError::NotOurs(e)),
        Ok(()) => {}
    }
    let taken = root.join("adopting");
    remove_any(&taken).map_err(err("remove", &taken))?;
    match fs::rename(from, &taken) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err("rename", from)(e)),
    }
    let index_path = taken.join("index");
    let read = fs::read_to_string(&index_path).map_err(err("read", &index_path));
    let checked = read.and_then(|text| match text.lines().next() {
        Some(HEADER) => Ok(text),
        _ => Err(err("read", &index_path)(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not an index of this version (first line is not {HEADER:?})"),
        ))),
    });
    if checked.is_ok() {
        for sub in &SUBDIRS[..2] {
            let (from, to) = (taken.join(sub), root.join(sub));
            match fs::rename(&from, &to) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    let _ = remove_any(&taken);
                    return Err(err("rename", &from)(e));
                }
                _ => {}
            }
        }
    }
    remove_any(&taken).map_err(err("remove", &taken))?;
    checked.map(Some)
}

/// One index line: `<hex> <size> <0|1>`.
fn parse_line(line: &str) -> Option<(Digest, u64, bool)> {
    let mut fields = line.split(' ');
    let digest = Digest::parse(fields.next()?)?;
    let size = fields.next()?.parse().ok()?;
    let executable = match fields.next()? {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    fields
        .next()
        .is_none()
        .then_some((digest, size, executable))
}

/// Renames `staging` to `to`, moving what is there aside to `aside` (and
/// removing it) first; tried twice, in case another store published in
/// between.
fn publish(staging: &Path, to: &Path, aside: &Path) -> io::Result<()> {
    let mut last = None;
    for _ in 0..2 {
        match fs::rename(to, aside) {
            Ok(()) => remove_any(aside)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        match fs::rename(staging, to) {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    remove_any(staging)?;
    Err(last.expect("two attempts"))
}
