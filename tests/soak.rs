//! Soak test: waves of concurrent sandboxes created and destroyed while
//! threads and separate processes stat, read and write inside them.
//!
//! Pass means: every answer and every byte read is right, each wave ends
//! within its watchdog limit, the daemon's open descriptors stay within
//! what the sandboxes the kernel still remembers pin and return to where
//! they started once it forgets them, its memory does not grow from wave
//! to wave, and no mount is left. Bounded by ACTIONFS_SOAK_SECS (default 10; run by hand
//! with 1800 for half an hour, with --nocapture to see the figures).

use std::fs;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;

const SANDBOXES_PER_WAVE: usize = 6;
const INPUTS_PER_SANDBOX: usize = 60;
const WAVE_LIMIT: Duration = Duration::from_secs(120);

#[derive(Default)]
struct Counts {
    creates: AtomicU64,
    destroys: AtomicU64,
    stats: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    processes: AtomicU64,
}

fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// What each open descriptor of `pid` refers to, for failure messages.
fn fd_targets(pid: u32) -> Vec<String> {
    let mut targets: Vec<String> = fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .map(|t| t.display().to_string())
        .collect();
    targets.sort();
    targets
}

/// One sandbox's life: create, use from threads and a process, check,
/// destroy.
fn sandbox_life(d: &Daemon, fx: &Fixture, id: &str, counts: &Counts) {
    let scratch = fx.path(&format!("scratch/{id}"));
    fs::create_dir_all(&scratch).unwrap();
    let mut mappings = vec![rw("/ws", &scratch)];
    for n in 0..INPUTS_PER_SANDBOX {
        mappings.push(ro(
            &format!("/ws/in/d{}/f{n}", n % 6),
            &fx.path(&format!("src/f{n}")),
        ));
    }
    d.create(sandbox(id, mappings));
    counts.creates.fetch_add(1, Ordering::Relaxed);
    let ws = d.path(&format!("{id}/ws"));
    for n in 0..INPUTS_PER_SANDBOX {
        let path = ws.join(format!("in/d{}/f{n}", n % 6));
        assert_eq!(
            fs::metadata(&path).unwrap().len(),
            format!("input {n}").len() as u64
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), format!("input {n}"));
        counts.stats.fetch_add(1, Ordering::Relaxed);
        counts.reads.fetch_add(1, Ordering::Relaxed);
    }
    // A separate process reads every input and writes an output.
    let script = "find in -type f | sort | xargs cat > out.txt && wc -c < out.txt";
    let out = Command::new("sh")
        .args(["-c", script])
        .current_dir(&ws)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    counts.processes.fetch_add(1, Ordering::Relaxed);
    let expected: usize = (0..INPUTS_PER_SANDBOX)
        .map(|n| format!("input {n}").len())
        .sum();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        expected.to_string()
    );
    assert_eq!(
        fs::metadata(scratch.join("out.txt")).unwrap().len(),
        expected as u64
    );
    fs::write(ws.join("result"), id).unwrap();
    counts.writes.fetch_add(2, Ordering::Relaxed);
    assert_eq!(fs::read_to_string(scratch.join("result")).unwrap(), id);
    d.destroy(id);
    counts.destroys.fetch_add(1, Ordering::Relaxed);
    assert!(!d.path(id).exists(), "{id} visible after destroy");
    fs::remove_dir_all(&scratch).unwrap();
}

#[test]
fn waves_of_sandboxes_under_load_with_open_messages() {
    waves_of_sandboxes_under_load("--zero_message_opens=off");
}

#[test]
fn waves_of_sandboxes_under_load_with_zero_message_opens() {
    waves_of_sandboxes_under_load("--zero_message_opens=on");
}

fn waves_of_sandboxes_under_load(open_mode: &str) {
    if !require(&[Need::Mount]) {
        return;
    }
    let zero_message_opens = open_mode.ends_with("on");
    let seconds: u64 = std::env::var("ACTIONFS_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let fx = Fixture::new();
    for n in 0..INPUTS_PER_SANDBOX {
        fx.write(&format!("src/f{n}"), &format!("input {n}"));
    }
    let d = fx.start(&["--reconfig_threads=4", open_mode]);
    let pid = d.client().pid();
    // The FUSE session clones its /dev/fuse descriptors before any of its
    // threads serves a request, possibly after the daemon reported ready:
    // one listing served first, the baseline holds them all.
    assert_eq!(names(&d.mnt), ["empty"]);
    let baseline_fds = open_fds(pid);
    let counts = Counts::default();
    let started = Instant::now();
    let mut samples: Vec<(u64, usize)> = Vec::new();
    let mut wave = 0;
    while started.elapsed() < Duration::from_secs(seconds) || wave < 2 {
        let (done, finished) = channel();
        std::thread::scope(|scope| {
            for t in 0..SANDBOXES_PER_WAVE {
                let (d, fx, counts, done) = (&d, &fx, &counts, done.clone());
                scope.spawn(move || {
                    sandbox_life(d, fx, &format!("w{wave}-{t}"), counts);
                    done.send(()).unwrap();
                });
            }
            // Watchdog: a wave that does not finish in time is a deadlock.
            let deadline = Instant::now() + WAVE_LIMIT;
            for _ in 0..SANDBOXES_PER_WAVE {
                let left = deadline.saturating_duration_since(Instant::now());
                if finished.recv_timeout(left).is_err() {
                    eprintln!("log:\n{}", fx.log());
                    // Abort instead of joining threads stuck in the mount.
                    panic!("wave {wave} did not finish within {WAVE_LIMIT:?}: deadlock?");
                }
            }
        });
        if !zero_message_opens {
            // RELEASEs and FORGETs reach the daemon asynchronously, later
            // on a loaded machine (and on io_uring, where each CPU's
            // requests wait for that CPU's threads): a pile-up is what
            // does not drain.
            wait_for(Duration::from_secs(10), || {
                open_fds(pid) <= baseline_fds + SANDBOXES_PER_WAVE + 1
            });
        }
        samples.push((proc_status_kib(pid, "VmRSS:"), open_fds(pid)));
        wave += 1;
    }
    assert_eq!(names(&d.mnt), ["empty"]);
    let (first_rss, first_fds) = samples[0];
    let peak_rss = samples.iter().map(|s| s.0).max().unwrap();
    eprintln!(
        "soak: {wave} waves in {:?}: {} creates, {} destroys, {} stats, {} reads, {} writes, {} worker processes; \
         RSS first/peak/last {first_rss}/{peak_rss}/{} KiB; fds {first_fds}",
        started.elapsed(),
        counts.creates.load(Ordering::Relaxed),
        counts.destroys.load(Ordering::Relaxed),
        counts.stats.load(Ordering::Relaxed),
        counts.reads.load(Ordering::Relaxed),
        counts.writes.load(Ordering::Relaxed),
        counts.processes.load(Ordering::Relaxed),
        samples.last().unwrap().0,
    );
    // A sandbox pins its scratch directory (and all share the input
    // directory) until the kernel forgets its nodes, shortly after destroy.
    // With zero-message opens the caches of destroyed sandboxes are kept
    // for up to ten seconds (with the descriptors of files written in
    // them), so only the return to the start is checked, later.
    if !zero_message_opens {
        for (n, (_, fds)) in samples.iter().enumerate() {
            assert!(
                *fds <= baseline_fds + SANDBOXES_PER_WAVE + 1,
                "descriptors pile up by wave {n} (baseline {baseline_fds}): {samples:?}"
            );
        }
    }
    let kept_for = Duration::from_secs(if zero_message_opens { 20 } else { 10 });
    assert!(
        wait_for(kept_for, || open_fds(pid) == baseline_fds),
        "descriptors leaked: {} open, {baseline_fds} before the first sandbox ({open_mode}): {:?}\n{}",
        open_fds(pid),
        fd_targets(pid),
        fx.stats_now(&d)["live"]
    );
    // Flat memory: the second half of the run never exceeds the first
    // half's peak by more than allocator slack.
    let half = samples.len() / 2;
    let early_peak = samples[..half.max(1)].iter().map(|s| s.0).max().unwrap();
    let late_peak = samples[half..].iter().map(|s| s.0).max().unwrap();
    assert!(
        late_peak <= early_peak + early_peak / 10 + 4096,
        "RSS grows: {samples:?}"
    );
    assert_eq!(d.terminate(), BY_SIGTERM);
    assert!(!is_mounted(&fx.mnt()));
}
