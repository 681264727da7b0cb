//! Sandbox roots reused across actions ("slots", `--slots=on`).
//!
//! Every FUSE sandbox under a new name is a path the kernel has never
//! seen: its first lookup of every name is a message, and the previous
//! sandbox's cache must be moved to it. A slot is a name at the top of the
//! view (`slot-N`) and a scratch directory below the base that outlive
//! their sandboxes: the next sandbox in a slot takes over the kernel's
//! entries there by name (the core's `predecessor`), and its writable
//! workspace directory is the same directory, emptied, so what the kernel
//! knows of it (names absent included) mostly still holds. A slot is
//! emptied after its Destroy is answered, and only then free again: no
//! sandbox ever finds a previous one's outputs or scratch files.
//!
//! Which free slot a Create takes: the one whose last tree is the same
//! root digest, else the one freed last (its cache is the warmest). With
//! none free but one being emptied, a Create waits for it (at most
//! [`WAIT_FOR_LEAVING`]: a rename or two) rather than make a cold one:
//! Bazel's next Create follows a Destroy's answer at once. There are as
//! many as sandboxes live or leaving at once.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::sandbox::materialize::{self, Trash};

/// The core's name for slot `index`, and the last part of the path a
/// Create answers.
pub fn name(index: usize) -> String {
    format!("slot-{index}")
}

/// A slot taken for one sandbox.
#[derive(Clone, Debug)]
pub struct Slot {
    pub index: usize,
    /// Its name in the view ([`name`]).
    pub name: String,
    /// Its scratch directory, holding the workspace directory.
    pub scratch: PathBuf,
}

/// How long a Create waits for a slot being emptied.
const WAIT_FOR_LEAVING: Duration = Duration::from_millis(20);

struct State {
    busy: bool,
    /// Destroyed, being emptied.
    leaving: bool,
    /// The root digest of the last tree it held.
    last_root: Option<Box<str>>,
    /// When it was freed last (a count of frees), to prefer the warmest.
    freed_at: u64,
}

pub struct Slots {
    /// Where each slot's scratch directory is made.
    scratch: PathBuf,
    state: Mutex<Pool>,
    freed: Condvar,
}

#[derive(Default)]
struct Pool {
    slots: Vec<State>,
    frees: u64,
}

impl Slots {
    /// Slots whose scratch directories go below `scratch`.
    pub fn new(scratch: PathBuf) -> Slots {
        Slots {
            scratch,
            state: Mutex::default(),
            freed: Condvar::new(),
        }
    }

    /// A free slot for a tree of root digest `root`, made if none is free
    /// or about to be.
    pub fn take(&self, root: &str) -> Slot {
        let mut pool = self.state.lock();
        let deadline = Instant::now() + WAIT_FOR_LEAVING;
        let free = loop {
            let free = pool
                .slots
                .iter()
                .enumerate()
                .filter(|(_, slot)| !slot.busy)
                .max_by_key(|(_, slot)| (slot.last_root.as_deref() == Some(root), slot.freed_at))
                .map(|(index, _)| index);
            let leaving = pool.slots.iter().any(|slot| slot.leaving);
            if free.is_some() || !leaving {
                break free;
            }
            if self.freed.wait_until(&mut pool, deadline).timed_out() {
                break None;
            }
        };
        let index = free.unwrap_or_else(|| {
            pool.slots.push(State {
                busy: false,
                leaving: false,
                last_root: None,
                freed_at: 0,
            });
            pool.slots.len() - 1
        });
        let state = &mut pool.slots[index];
        state.busy = true;
        state.last_root = Some(root.into());
        self.slot(index)
    }

    /// Slot `index` as a Create uses it.
    fn slot(&self, index: usize) -> Slot {
        let name = name(index);
        Slot {
            index,
            scratch: self.scratch.join(&name),
            name,
        }
    }

    /// Says `slot`'s sandbox is gone and its scratch directory being
    /// emptied: a Create with none free waits for it.
    pub fn leaving(&self, slot: &Slot) {
        self.state.lock().slots[slot.index].leaving = true;
    }

    /// Frees `slot`: its sandbox is gone and its scratch directory empty.
    pub fn give_back(&self, slot: &Slot) {
        let mut pool = self.state.lock();
        pool.frees += 1;
        let freed_at = pool.frees;
        let state = &mut pool.slots[slot.index];
        debug_assert!(state.busy, "slot {} given back twice", slot.index);
        state.busy = false;
        state.leaving = false;
        state.freed_at = freed_at;
        drop(pool);
        self.freed.notify_all();
    }

    /// Gives up on `slot`, which could not be emptied: never used again.
    pub fn abandon(&self, slot: &Slot) {
        self.state.lock().slots[slot.index].leaving = false;
        self.freed.notify_all();
    }

    /// Frees `slot` after a failed Create: what it held is unknown, so no
    /// tree is said to be its last.
    pub fn give_back_unknown(&self, slot: &Slot) {
        self.state.lock().slots[slot.index].last_root = None;
        self.give_back(slot);
    }
}

/// Empties `scratch`, a slot's scratch directory, keeping the directories
/// at its top (the workspace directory: the view's anchor for it stays
/// the same directory) and sending everything below them to `trash`.
pub fn empty(scratch: &Path, trash: &Trash) -> Result<(), materialize::Error> {
    let listing = match std::fs::read_dir(scratch) {
        Ok(listing) => listing,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(materialize::Error::new("opendir", scratch, err)),
    };
    for entry in listing {
        let entry = entry.map_err(|err| materialize::Error::new("readdir", scratch, err))?;
        let path = entry.path();
        let is_dir = entry
            .file_type()
            .map_err(|err| materialize::Error::new("lstat", &path, err))?
            .is_dir();
        if !is_dir {
            trash.discard(&path)?;
            continue;
        }
        let inner = std::fs::read_dir(&path)
            .map_err(|err| materialize::Error::new("opendir", &path, err))?;
        for child in inner {
            let child = child.map_err(|err| materialize::Error::new("readdir", &path, err))?;
            trash.discard(&child.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_takes_the_slot_of_its_tree_else_the_warmest_else_a_new_one() {
        let slots = Slots::new(PathBuf::from("/s"));
        let a = slots.take("A");
        let b = slots.take("B");
        assert_eq!((a.index, b.index), (0, 1), "none free: new ones");
        assert_eq!(b.scratch, Path::new("/s/slot-1"));
        assert_eq!(slots.take("C").index, 2);
        slots.give_back(&a);
        slots.give_back(&b);
        assert_eq!(slots.take("A").index, 0, "its own last tree");
        assert_eq!(slots.take("D").index, 1, "the one free");
        assert_eq!(slots.take("E").index, 3, "none free");
        slots.give_back(&slots.slot(0));
        slots.give_back(&slots.slot(3));
        assert_eq!(slots.take("F").index, 3, "freed last");
        slots.give_back_unknown(&slots.slot(3));
        assert_eq!(
            slots.take("F").index,
            3,
            "a failed Create leaves no last tree, but the slot is still the warmest"
        );
        assert_eq!(slots.take("X").index, 0);
        // All four busy; one leaving is waited for rather than a fifth made.
        let leaving = slots.slot(1);
        slots.leaving(&leaving);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(2));
                slots.give_back(&leaving);
            });
            assert_eq!(slots.take("G").index, 1, "the one that was leaving");
        });
        slots.leaving(&slots.slot(2));
        slots.abandon(&slots.slot(2));
        assert_eq!(
            slots.take("H").index,
            4,
            "none free, none leaving: a new one"
        );
    }

    #[test]
    fn emptying_keeps_the_top_directories_and_nothing_in_them() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().join("slot-0");
        std::fs::create_dir_all(scratch.join("ws/bazel-out/bin")).unwrap();
        std::fs::write(scratch.join("ws/bazel-out/bin/a.o"), "o").unwrap();
        std::fs::write(scratch.join("ws/stray"), "s").unwrap();
        std::fs::write(scratch.join("top-file"), "t").unwrap();
        let trash = Trash::open(&dir.path().join("trash"), 1).unwrap();
        empty(&scratch, &trash).unwrap();
        trash.wait_idle();
        let left: Vec<_> = std::fs::read_dir(&scratch)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("ws")]);
        assert_eq!(std::fs::read_dir(scratch.join("ws")).unwrap().count(), 0);
        empty(&dir.path().join("never-made"), &trash).expect("a slot not made yet is empty");
    }
}
