//! Keeping the kernel's cache of destroyed sandboxes for a while.
//!
//! A destroyed sandbox's name is expired at once (it is gone from view),
//! but what the kernel cached below it is what keeps its inodes alive, and
//! a read-only input is one inode shared by every sandbox that maps it
//! (`inodes`): while one destroyed sandbox's entries still reference it,
//! the next sandbox that maps the same file finds its attributes and page
//! cache, and reads it without asking the daemon. Consecutive actions of a
//! build map largely the same inputs, so the last few destroyed sandboxes
//! are kept, up to a budget of nodes and an age; older ones are then
//! invalidated, which makes the kernel forget their nodes and the daemon's
//! memory return.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Weak;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::super::node::Node;

/// Nodes of destroyed sandboxes kept cached (about 200 bytes each in the
/// daemon, and a dentry and an inode each in the kernel).
pub const BUDGET_NODES: usize = 32_768;

/// How long a destroyed sandbox's cache is kept at most with zero-message
/// opens, where the descriptors it holds serve files the kernel opened
/// without asking.
pub const MAX_AGE: Duration = Duration::from_secs(10);

/// The same with opens reaching the daemon: long enough for the next
/// action of a build (Bazel's come within milliseconds of a destroy),
/// short enough that a destroy gives the descriptors its nodes pin back
/// within a second.
pub const OPEN_MODE_MAX_AGE: Duration = Duration::from_millis(250);

/// A destroyed sandbox: its name at the root and its top directory, alive
/// while the kernel knows it.
pub struct Departed {
    pub name: OsString,
    /// The name the kernel holds the top directory by, if another: a
    /// sandbox that took over a destroyed one's cache (`adoption`) and was
    /// destroyed before anything looked it up.
    pub alias: Option<OsString>,
    pub top: Weak<Node>,
}

impl Departed {
    /// The name the kernel holds its top directory by.
    pub fn kernel_name(&self) -> &OsString {
        self.alias.as_ref().unwrap_or(&self.name)
    }
}

struct Retained {
    departed: Departed,
    nodes: usize,
    since: Instant,
}

#[derive(Default)]
struct Queue {
    oldest_first: VecDeque<Retained>,
    /// Nodes kept, summed.
    nodes: usize,
    /// How many kept sandboxes have each name: a create (every one
    /// forgets its id) asks this, not the queue, which holds every
    /// sandbox destroyed in the last `max_age` (thousands in a busy
    /// build of small native sandboxes, one node each).
    names: HashMap<OsString, usize>,
}

impl Queue {
    fn push(&mut self, retained: Retained) {
        self.nodes += retained.nodes;
        *self
            .names
            .entry(retained.departed.name.clone())
            .or_default() += 1;
        self.oldest_first.push_back(retained);
    }

    fn pop_oldest(&mut self) -> Option<Departed> {
        let oldest = self.oldest_first.pop_front()?;
        Some(self.unlist(oldest))
    }

    /// Takes out the oldest kept sandbox named `name`, if any.
    fn take(&mut self, name: &OsString) -> Option<Departed> {
        if !self.names.contains_key(name) {
            return None;
        }
        let at = self
            .oldest_first
            .iter()
            .position(|r| &r.departed.name == name)?;
        let taken = self.oldest_first.remove(at).expect("just found");
        Some(self.unlist(taken))
    }

    fn unlist(&mut self, gone: Retained) -> Departed {
        self.nodes -= gone.nodes;
        if let Some(count) = self.names.get_mut(&gone.departed.name) {
            *count -= 1;
            if *count == 0 {
                self.names.remove(&gone.departed.name);
            }
        }
        gone.departed
    }
}

pub struct Retention {
    retained: Mutex<Queue>,
    budget: usize,
    /// Nanoseconds; set once the open mode is known.
    max_age: AtomicU64,
    /// A timed sweep is pending (at most one is).
    sweeping: AtomicBool,
}

impl Retention {
    pub fn new(budget: usize, max_age: Duration) -> Retention {
        Retention {
            retained: Mutex::default(),
            budget,
            max_age: AtomicU64::new(max_age.as_nanos() as u64),
            sweeping: AtomicBool::new(false),
        }
    }

    /// Keeps the cache of a destroyed sandbox (of about `nodes` nodes);
    /// returns those whose cache must be dropped now, oldest first: over
    /// the budget, or too old. A sandbox larger than the whole budget is
    /// dropped at once.
    pub fn retain(&self, departed: Departed, nodes: usize, now: Instant) -> Vec<Departed> {
        let mut queue = self.retained.lock();
        queue.push(Retained {
            departed,
            nodes,
            since: now,
        });
        let mut dropped = Vec::new();
        while let Some(oldest) = queue.oldest_first.front() {
            let too_old = now.duration_since(oldest.since) > self.max_age();
            if queue.nodes <= self.budget && !too_old {
                break;
            }
            dropped.extend(queue.pop_oldest());
        }
        dropped
    }

    /// Drops what has been kept longer than the age limit, for when no
    /// destroy comes to do it; returns the names to drop, and when to look
    /// again (if anything is still kept).
    pub fn expire(&self, now: Instant) -> (Vec<Departed>, Option<Instant>) {
        let mut queue = self.retained.lock();
        let mut dropped = Vec::new();
        while let Some(oldest) = queue.oldest_first.front() {
            if now.duration_since(oldest.since) <= self.max_age() {
                break;
            }
            dropped.extend(queue.pop_oldest());
        }
        let next = queue.oldest_first.front().map(|r| r.since + self.max_age());
        (dropped, next)
    }

    pub fn max_age(&self) -> Duration {
        Duration::from_nanos(self.max_age.load(Ordering::Relaxed))
    }

    pub fn set_max_age(&self, max_age: Duration) {
        self.max_age
            .store(max_age.as_nanos() as u64, Ordering::Relaxed);
    }

    /// True if the caller is to schedule the timed sweep (none pending).
    pub fn claim_sweep(&self) -> bool {
        !self.sweeping.swap(true, Ordering::AcqRel)
    }

    /// The sweep ends with nothing left to expire. True if something was
    /// kept meanwhile and the caller must schedule the sweep again.
    pub fn end_sweep(&self) -> bool {
        self.sweeping.store(false, Ordering::Release);
        !self.retained.lock().oldest_first.is_empty() && self.claim_sweep()
    }

    /// The `n` most recently kept sandboxes the kernel still knows the top
    /// of, newest first, for a new sandbox to choose one to take over.
    pub fn latest(&self, n: usize) -> Vec<(OsString, super::adoption::Candidate)> {
        let queue = self.retained.lock();
        queue
            .oldest_first
            .iter()
            .rev()
            .filter_map(|r| {
                let candidate = super::adoption::Candidate {
                    top: r.departed.top.upgrade()?,
                    mappings: r.nodes,
                };
                Some((r.departed.name.clone(), candidate))
            })
            .take(n)
            .collect()
    }

    /// Takes kept sandbox `name` out (a new sandbox takes over its cache).
    pub fn take(&self, name: &OsString) -> Option<Departed> {
        self.retained.lock().take(name)
    }

    /// Forgets `name` if it is kept (its id is being used again, and the
    /// new sandbox's cache must not be dropped for the old one).
    pub fn forget(&self, name: &OsString) {
        self.retained.lock().take(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    fn names(list: Vec<Departed>) -> Vec<String> {
        list.into_iter()
            .map(|d| d.name.into_string().unwrap())
            .collect()
    }

    fn gone(name: &str) -> Departed {
        Departed {
            name: name.into(),
            alias: None,
            top: std::sync::Weak::new(),
        }
    }

    #[test]
    fn the_oldest_go_first_over_the_budget_or_the_age() {
        let retention = Retention::new(100, Duration::from_secs(10));
        let start = Instant::now();
        assert!(retention.retain(gone("a"), 40, start).is_empty());
        assert!(retention.retain(gone("b"), 40, start).is_empty());
        assert_eq!(names(retention.retain(gone("c"), 40, start)), ["a"]);
        assert_eq!(
            names(retention.retain(gone("huge"), 500, start)),
            ["b", "c", "huge"]
        );
        let later = start + Duration::from_secs(11);
        assert!(retention.retain(gone("d"), 1, start).is_empty());
        assert_eq!(names(retention.retain(gone("e"), 1, later)), ["d"]);
        retention.forget(&"e".into());
        let queue = retention.retained.lock();
        assert_eq!(queue.nodes, 0, "e forgotten, d dropped");
        assert!(queue.names.is_empty(), "no name listed: {:?}", queue.names);
    }

    #[test]
    fn a_name_kept_twice_is_taken_once_at_a_time_oldest_first() {
        let retention = Retention::new(100, Duration::from_secs(10));
        let start = Instant::now();
        retention.retain(gone("a"), 10, start);
        retention.retain(gone("b"), 20, start);
        retention.retain(gone("a"), 30, start);
        retention.forget(&"a".into());
        {
            let queue = retention.retained.lock();
            assert_eq!(queue.nodes, 50, "the first a (10 nodes) forgotten");
            assert_eq!(queue.names.get(OsStr::new("a")), Some(&1));
        }
        assert!(retention.take(&"c".into()).is_none());
        assert_eq!(retention.take(&"a".into()).unwrap().name, "a");
        assert!(retention.take(&"a".into()).is_none());
        let queue = retention.retained.lock();
        assert_eq!(queue.nodes, 20);
        assert_eq!(queue.names.len(), 1, "only b: {:?}", queue.names);
    }

    #[test]
    fn what_outlives_the_age_is_dropped_without_another_destroy() {
        let retention = Retention::new(100, Duration::from_secs(10));
        let start = Instant::now();
        retention.retain(gone("a"), 1, start);
        retention.retain(gone("b"), 1, start + Duration::from_secs(5));
        let (dropped, next) = retention.expire(start + Duration::from_secs(3));
        assert!(dropped.is_empty());
        assert_eq!(next, Some(start + Duration::from_secs(10)));
        let (dropped, next) = retention.expire(start + Duration::from_secs(11));
        assert_eq!(names(dropped), ["a"]);
        assert_eq!(next, Some(start + Duration::from_secs(15)));
        let (dropped, next) = retention.expire(start + Duration::from_secs(16));
        assert_eq!(names(dropped), ["b"]);
        assert_eq!(next, None);
    }
}
