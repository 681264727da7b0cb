//! Where a mode's time goes: every action is timed by step (making its
//! sandbox, running it, collecting its outputs, tearing the sandbox down),
//! summed per run. A mode slower than `unsandboxed` is slower in its own
//! steps or in the action itself (e.g. reads through a FUSE view), and the
//! wall time alone cannot say which.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The steps of an action, in every mode; a mode without one leaves it at
/// zero (`unsandboxed` has no teardown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The sandbox made: serve's Push and Create, the forest's links,
    /// unsandboxed's clearing of old outputs.
    Setup,
    /// The action's command.
    Run,
    /// Outputs moved to the mode's exec root (serve's Collect).
    Collect,
    /// The sandbox gone (serve's Destroy).
    Teardown,
}

impl Step {
    pub const ALL: [Step; 4] = [Step::Setup, Step::Run, Step::Collect, Step::Teardown];

    pub fn name(self) -> &'static str {
        match self {
            Step::Setup => "setup",
            Step::Run => "run",
            Step::Collect => "collect",
            Step::Teardown => "teardown",
        }
    }
}

/// One run's time per step, summed over its actions, from any thread.
#[derive(Debug, Default)]
pub struct StepClock {
    nanos: [AtomicU64; 4],
}

impl StepClock {
    /// Runs `work`, adding its time to `step`.
    pub fn time<T>(&self, step: Step, work: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let done = work();
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.nanos[step as usize].fetch_add(nanos, Ordering::Relaxed);
        done
    }

    /// Each step's total, in [`Step::ALL`] order.
    pub fn totals(&self) -> [Duration; 4] {
        Step::ALL
            .map(|step| Duration::from_nanos(self.nanos[step as usize].load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_sums_its_own_time() {
        let clock = StepClock::default();
        let slept = Duration::from_millis(20);
        assert_eq!(clock.time(Step::Run, || 7), 7);
        clock.time(Step::Collect, || std::thread::sleep(slept));
        clock.time(Step::Collect, || std::thread::sleep(slept));
        let [setup, _run, collect, teardown] = clock.totals();
        assert_eq!(setup, Duration::ZERO);
        assert_eq!(teardown, Duration::ZERO);
        assert!(collect >= slept * 2, "{collect:?}");
    }
}
