//! Default places captured into the store: which files (below
//! `--capture_below`), when (in the Create, or off its path), and what a
//! failure means. A Create that meets many digests the store lacks (a
//! first build's large action: 5,000 sources, half a second of copying)
//! serves them from their default places, checked by size as before, and
//! queues to one thread, which captures each once, those it met often
//! enough; later Creates find them in the store. Until then a digest is
//! looked at where it is: a copy costs about what a dozen looks do, and
//! pays only for a digest met about as often again (mixed: 83% of its
//! digests are read by one action; stress: 5,000 of its 6,005 by four),
//! while it takes CPU from the actions running beside it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hashbrown::HashTable;
use parking_lot::Mutex;

use crate::background::Background;
use crate::sandbox::default_place;
use crate::sandbox::merkle::{FileEntry, Walked};
use crate::sandbox::store::{ContentStore, Digest, Lookup, Retention};
use crate::serve::error::Error;
use crate::serve::kept::StoreAnswers;

/// A Create that finds at most this many digests to capture captures them
/// itself (a copy and a hash each), so that a small action's inputs are
/// checked by their bytes from its first use.
const ON_CREATE: usize = 64;

/// The capture of default places for one backend.
pub struct DefaultPlaces {
    /// Files smaller than this are captured (0: none).
    below: u64,
    store: Arc<ContentStore>,
    background: Capturer,
    /// How often large Creates met the digests they left uncaptured.
    meetings: Mutex<Meetings>,
}

impl DefaultPlaces {
    pub fn new(store: Arc<ContentStore>, below: u64) -> DefaultPlaces {
        DefaultPlaces {
            below,
            background: Capturer::start(store.clone()),
            store,
            meetings: Mutex::new(Meetings::new()),
        }
    }

    /// Whether `file`'s default place is captured (`--capture_below`).
    pub fn captures(&self, file: &FileEntry) -> bool {
        (file.size as u64) < self.below
    }

    /// Whether some file of `walked` the store lacks (`found`) is captured.
    pub fn any_to_capture(&self, walked: &Walked, found: &StoreAnswers) -> bool {
        self.below > 0
            && (found.any_absent || found.any_gone)
            && walked
                .files()
                .zip(found.each.iter())
                .any(|((_, file), found)| *found != Lookup::Present && self.captures(file))
    }

    /// Captures into the store each file of `walked` it lacks (`found`)
    /// and that [`DefaultPlaces::captures`], from its default place
    /// `exec_root/<tree path>`, once per digest: hashed as it is copied,
    /// so a default place that changed since Bazel hashed it is refused
    /// here, and a later Create of the digest touches no file of the
    /// build. A digest that was held and is gone is taken from its
    /// default place if that holds it, else left gone (for Bazel to
    /// push); a pushed digest that was `refused` is left absent. Beyond
    /// [`ON_CREATE`] digests, those never held are served from their
    /// default places, and queued to the background from their
    /// [`CAPTURE_AT_MEETING`]th meeting on. Returns whether anything was
    /// captured here (the caller's lookups are stale).
    pub fn capture(
        &self,
        walked: &Walked,
        found: &StoreAnswers,
        exec_root: &Path,
        refused: &HashSet<String>,
    ) -> Result<bool, Error> {
        // Each digest once. Keyed by the parsed digest's first 8 bytes (a
        // SHA-256's are uniform): hashing each 64-byte hex name took most
        // of a warm 5,000-input Create's capture pass (stress, profiled).
        let mut tried: HashTable<&Digest> = HashTable::new();
        let to_capture: Vec<_> = walked
            .files()
            .zip(found.each.iter())
            .filter(|&((_, file), found)| {
                *found != Lookup::Present
                    && self.captures(file)
                    && !refused.contains(&*file.hash)
                    && first_new(&mut tried, &file.digest)
            })
            .collect();
        // Many: to the background, served from their default places
        // meanwhile; but a digest held once and gone is captured now,
        // else it would be asked of Bazel, which holds no bytes for it.
        let later = to_capture.len() > ON_CREATE;
        let mut captured = false;
        for ((dir, entry), found) in to_capture {
            // Counted before the place is made: most are left where they are.
            let counted = later && *found == Lookup::Absent;
            if counted && !self.meetings.lock().due(&entry.digest) {
                continue;
            }
            let place = exec_root.join(dir).join(&*entry.name);
            if counted && self.background.queue(&entry.hash, place.clone()) {
                continue;
            }
            match self.store.capture(&entry.hash, &place, Retention::Keep) {
                Ok(()) => captured = true,
                Err(_) if *found == Lookup::Gone => {}
                Err(err) => {
                    return Err(Error::DefaultPlace {
                        input: format!("{dir}/{}", entry.name),
                        why: default_place::capture_refusal(&err),
                    })
                }
            }
        }
        Ok(captured)
    }

    /// Stops the background captures (see [`Capturer::stop`]).
    pub fn stop(&self) {
        self.background.stop();
    }
}

/// Whether `digest` was not in `seen` (it is now).
fn first_new<'a>(seen: &mut HashTable<&'a Digest>, digest: &'a Digest) -> bool {
    let key = |d: &Digest| u64::from_le_bytes(d.0[..8].try_into().expect("8 bytes"));
    match seen.entry(key(digest), |d| *d == digest, |d| key(d)) {
        hashbrown::hash_table::Entry::Occupied(_) => false,
        hashbrown::hash_table::Entry::Vacant(vacant) => {
            vacant.insert(digest);
            true
        }
    }
}

/// The meeting at which a large Create queues a digest's capture. Before
/// it, each meeting looks at the default place (an `fstatat`), which
/// costs far less than a capture's copy and hash; counting each log's
/// meetings, the eighth is near the least cost on every log
/// (docs/BENCHMARKS.md).
const CAPTURE_AT_MEETING: u8 = 8;

/// Meetings counted per digest in a fixed table indexed by the digest's
/// leading bytes: digests that share a counter are only captured sooner,
/// as every digest was once, so the table needs no bound but its size.
struct Meetings(Box<[u8]>);

/// 2^20 one-byte counters: 1 MiB.
const MEETING_COUNTERS: usize = 1 << 20;

impl Meetings {
    fn new() -> Meetings {
        Meetings(vec![0; MEETING_COUNTERS].into_boxed_slice())
    }

    /// Counts a meeting of `digest`; true at the [`CAPTURE_AT_MEETING`]th,
    /// which starts the count again (a capture that fails waits as long).
    fn due(&mut self, digest: &Digest) -> bool {
        let [a, b, c, d, ..] = digest.0;
        let at = u32::from_le_bytes([a, b, c, d]) as usize % MEETING_COUNTERS;
        let count = &mut self.0[at];
        *count += 1;
        if *count >= CAPTURE_AT_MEETING {
            *count = 0;
            return true;
        }
        false
    }
}

/// A digest and the default place to capture it from.
type Job = (Box<str>, PathBuf);

struct Capturer {
    /// `None` if the thread could not be started.
    thread: Option<Background<Job>>,
    /// Digests queued and not captured yet: queued once.
    pending: Arc<Mutex<HashSet<Box<str>>>>,
    /// Set at the stop: what is still queued is dropped.
    stopping: Arc<AtomicBool>,
}

impl Capturer {
    fn start(store: Arc<ContentStore>) -> Capturer {
        let pending: Arc<Mutex<HashSet<Box<str>>>> = Arc::default();
        let stopping = Arc::new(AtomicBool::new(false));
        let (done, stopped) = (pending.clone(), stopping.clone());
        let thread = Background::start("capture", 1, move || {
            // Captures are work done once per digest for later Creates,
            // while the actions of this build run beside them, which at
            // normal priority they slowed (docs/BENCHMARKS.md).
            crate::background::lowest_priority();
            let (store, done, stopped) = (store.clone(), done.clone(), stopped.clone());
            move |(hash, place): Job| {
                if !stopped.load(Ordering::Relaxed) {
                    // A default place that fails goes on being looked at,
                    // and refused by size where it differs.
                    if let Err(err) = store.capture(&hash, &place, Retention::Keep) {
                        log::debug!("{}", default_place::capture_refusal(&err));
                    }
                }
                done.lock().remove(&hash);
            }
        })
        .map_err(|err| log::warn!("cannot start the capture thread ({err}); Creates capture"))
        .ok();
        Capturer {
            thread,
            pending,
            stopping,
        }
    }

    /// Queues digest `hash`'s capture from `place`, unless it is queued.
    /// False if nothing captures any more (stopped, or no thread).
    fn queue(&self, hash: &str, place: PathBuf) -> bool {
        let Some(thread) = &self.thread else {
            return false;
        };
        if !self.pending.lock().insert(hash.into()) {
            return true;
        }
        if thread.send((hash.into(), place)).is_err() {
            self.pending.lock().remove(hash);
            return false;
        }
        true
    }

    /// Stops after the capture under way (at most one file's copy): the
    /// backend is ending, and what is still queued is left uncaptured.
    fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        if let Some(thread) = &self.thread {
            thread.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_new_once() {
        let (a, b) = (Digest([1; 32]), Digest([2; 32]));
        // Alike in the bytes the table is keyed by, apart in the rest.
        let mut c = Digest([1; 32]);
        c.0[31] = 9;
        let mut seen = HashTable::new();
        assert!(first_new(&mut seen, &a));
        assert!(first_new(&mut seen, &b));
        assert!(first_new(&mut seen, &c));
        assert!(!first_new(&mut seen, &a));
        assert!(!first_new(&mut seen, &c));
        assert_eq!(seen.len(), 3);
    }

    #[test]
    fn a_digest_is_due_at_its_eighth_meeting_then_counted_afresh() {
        let mut meetings = Meetings::new();
        let digest = |first: u8| Digest([first; 32]);
        for _ in 1..CAPTURE_AT_MEETING {
            assert!(!meetings.due(&digest(1)));
        }
        assert!(!meetings.due(&digest(2)), "another digest's count");
        assert!(meetings.due(&digest(1)), "the eighth meeting");
        for _ in 1..CAPTURE_AT_MEETING {
            assert!(!meetings.due(&digest(1)), "counted afresh");
        }
        assert!(meetings.due(&digest(1)));
    }
}
