//! Running actions on a few threads, as Bazel's scheduler would: an action
//! starts once every earlier action that makes one of its inputs is done,
//! and among those ready, the first in the log's order goes first.

use std::collections::BTreeSet;
use std::sync::mpsc::channel;
use std::sync::Mutex;

use super::Error;
use crate::tools::progress::Progress;

/// How one action ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<E = Error> {
    Ok,
    Failed(E),
    /// Not run: the action at this index, which makes one of its inputs,
    /// did not succeed.
    Blocked(usize),
}

impl<E> Outcome<E> {
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok)
    }
}

/// Runs `work(i)` for every action `i` (`deps[i]`: the indices it waits
/// for, all below `i`), at most `jobs` at once, and returns each outcome.
/// With `block`, the actions that wait for a failed one are not run
/// ([`Outcome::Blocked`]), nor those that wait for them.
pub fn run<E: Send>(
    deps: &[Vec<usize>],
    jobs: usize,
    block: bool,
    progress: &mut Progress,
    work: &(dyn Fn(usize) -> Result<(), E> + Sync),
) -> Vec<Outcome<E>> {
    let n = deps.len();
    let mut waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut dependents = vec![Vec::new(); n];
    for (i, on) in deps.iter().enumerate() {
        for &p in on {
            assert!(p < i, "action {i} waits for a later one ({p})");
            dependents[p].push(i);
        }
    }
    let mut ready: BTreeSet<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut outcomes: Vec<Option<Outcome<E>>> = (0..n).map(|_| None).collect();
    // The first failed producer of an action, which it will not run for.
    let mut doomed: Vec<Option<usize>> = vec![None; n];
    let (job_tx, job_rx) = channel::<usize>();
    let job_rx = Mutex::new(job_rx);
    let (done_tx, done_rx) = channel::<(usize, Result<(), E>)>();
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, n.max(1)) {
            let done_tx = done_tx.clone();
            let job_rx = &job_rx;
            scope.spawn(move || loop {
                let next = job_rx
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .recv();
                let Ok(i) = next else { break };
                if done_tx.send((i, work(i))).is_err() {
                    break;
                }
            });
        }
        drop(done_tx);
        let mut finished = 0;
        let mut in_flight = 0;
        while finished < n {
            while in_flight < jobs.max(1) {
                let Some(i) = ready.pop_first() else { break };
                job_tx.send(i).expect("the workers wait for jobs");
                in_flight += 1;
            }
            let (i, result) = done_rx.recv().expect("an action in flight");
            in_flight -= 1;
            // The action, then those it dooms that are left with nothing to
            // wait for.
            let mut settled = vec![(
                i,
                match result {
                    Ok(()) => Outcome::Ok,
                    Err(why) => Outcome::Failed(why),
                },
            )];
            while let Some((i, outcome)) = settled.pop() {
                let failed = !outcome.is_ok();
                outcomes[i] = Some(outcome);
                finished += 1;
                progress.step();
                for &d in &dependents[i] {
                    if failed && block && doomed[d].is_none() {
                        doomed[d] = Some(i);
                    }
                    waiting[d] -= 1;
                    if waiting[d] == 0 {
                        match doomed[d] {
                            Some(p) => settled.push((d, Outcome::Blocked(p))),
                            None => {
                                ready.insert(d);
                            }
                        }
                    }
                }
            }
        }
        drop(job_tx);
    });
    outcomes
        .into_iter()
        .map(|o| o.expect("every action settled"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn waits_for_producers_and_blocks_behind_failures() {
        // 0 -> 1 -> 3, 2 alone, 4 waits for 3 and 2.
        let deps = vec![vec![], vec![0], vec![], vec![1], vec![2, 3]];
        let done: Vec<AtomicUsize> = (0..5).map(|_| AtomicUsize::new(0)).collect();
        let clock = AtomicUsize::new(1);
        let work = |i: usize| {
            for &p in &deps[i] {
                assert_ne!(done[p].load(Ordering::SeqCst), 0, "{i} ran before {p}");
            }
            done[i].store(clock.fetch_add(1, Ordering::SeqCst), Ordering::SeqCst);
            if i == 1 {
                Err("boom".to_owned())
            } else {
                Ok(())
            }
        };
        let mut progress = Progress::new("test", 5);
        let outcomes = run(&deps, 3, true, &mut progress, &work);
        assert_eq!(
            outcomes,
            [
                Outcome::Ok,
                Outcome::Failed("boom".into()),
                Outcome::Ok,
                Outcome::Blocked(1),
                Outcome::Blocked(3)
            ]
        );
        assert_eq!(done[3].load(Ordering::SeqCst), 0);

        // Without blocking, everything runs.
        for d in &done {
            d.store(0, Ordering::SeqCst);
        }
        let outcomes = run(&deps, 1, false, &mut progress, &work);
        assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), 4);
        // One job: in the log's order.
        let order: Vec<usize> = done.iter().map(|d| d.load(Ordering::SeqCst)).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
        assert!(run(&[], 4, true, &mut progress, &work).is_empty());
    }
}
