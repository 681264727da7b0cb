//! How a destroyed sandbox leaves the kernel's cache.
//!
//! DestroySandbox expires the sandbox's name at once (it is gone from
//! view); what the kernel cached below it keeps its inodes, and so the
//! daemon's nodes and descriptors, alive until the kernel forgets them.
//! Invalidating the name makes it drop the cached subtree, with one
//! exception the daemon must clean up after: an entry that was in use at
//! that moment (a file being closed, a working directory) survives, and
//! once released it stays cached under its dropped parent for good, with
//! its ancestors, until memory pressure. So after letting a sandbox go,
//! the daemon checks that its top node is gone, and while it is not,
//! invalidates every directory the kernel still knows below it, deepest
//! first (each drops its unused entries), backing off between checks.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::super::inodes::ROOT_INO;
use super::super::node::Node;
use super::super::Invalidator;
use super::reaper;
use super::retention::{Departed, Retention};

/// First look at whether the kernel forgot a sandbox let go, and the
/// longest wait between later looks.
const FIRST_CHECK: Duration = Duration::from_secs(1);
const LONGEST_WAIT: Duration = Duration::from_secs(60);

/// Makes the kernel drop its cache of `departed`: their names now (call it
/// off the request path), then what survives below them, checked later.
pub fn let_go(departed: Vec<Departed>, invalidator: Arc<dyn Invalidator>) {
    for gone in &departed {
        invalidator.invalidate_entry(ROOT_INO, &gone.name);
        if let Some(alias) = &gone.alias {
            invalidator.invalidate_entry(ROOT_INO, alias);
        }
    }
    let tops = departed.into_iter().map(|d| d.top).collect();
    check_later(tops, invalidator, FIRST_CHECK);
}

fn check_later(tops: Vec<Weak<Node>>, invalidator: Arc<dyn Invalidator>, wait: Duration) {
    reaper::after(
        wait,
        Box::new(move || {
            let alive: Vec<Weak<Node>> = tops
                .into_iter()
                .filter(|top| match top.upgrade() {
                    Some(top) => {
                        invalidate_known_dirs(&top, &*invalidator);
                        true
                    }
                    None => false,
                })
                .collect();
            if !alive.is_empty() {
                check_later(alive, invalidator, (wait * 2).min(LONGEST_WAIT));
            }
        }),
    );
}

/// Invalidates every directory below `dir` that the kernel knows, deepest
/// first.
fn invalidate_known_dirs(dir: &Node, invalidator: &dyn Invalidator) {
    let Ok(data) = dir.dir() else {
        return;
    };
    let mut children = data.made_entries();
    children.extend(
        data.discovered()
            .lock()
            .iter()
            .map(|(name, node)| (name.clone(), node.clone())),
    );
    for (name, child) in children {
        if child.is_dir() && child.lookups.load(Ordering::Relaxed) > 0 {
            invalidate_known_dirs(&child, invalidator);
            invalidator.invalidate_entry(dir.ino(), &name);
        }
    }
}

/// Drops the kept caches of destroyed sandboxes that outlived their age,
/// `delay` from now, and again until none is kept.
pub fn sweep_retained(
    retention: Arc<Retention>,
    invalidator: Arc<dyn Invalidator>,
    delay: Duration,
) {
    reaper::after(
        delay,
        Box::new(move || {
            let now = std::time::Instant::now();
            let (dropped, next) = retention.expire(now);
            if !dropped.is_empty() {
                let_go(dropped, invalidator.clone());
            }
            let again = match next {
                Some(due) => Some(due.saturating_duration_since(now) + Duration::from_millis(10)),
                None => retention.end_sweep().then(|| retention.max_age()),
            };
            if let Some(delay) = again {
                sweep_retained(retention, invalidator, delay);
            }
        }),
    );
}
