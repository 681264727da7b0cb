//! Daemon memory per mapped node, from the stress trace of a real Bazel
//! build (../shared/traces/bazel-4.2.3/stress-linuxsandbox: 20 sandboxes,
//! 36k mappings).
//!
//! Replays every CreateSandbox of the trace and keeps them all, reads the
//! daemon's RSS, then looks every mapped path up through the mount (so
//! each node also holds an inode number and an inode-table entry), reads it
//! again, destroys everything and reads it once more. Two rounds, to show
//! that memory comes back and does not creep. Not a criterion benchmark:
//! it measures bytes, not time. Run: `cargo bench --bench memory`.

use std::time::Duration;

use actionfs_protocol::{PrefixTable, Request};
use actionfs_testkit::traces::{load, populate};
use actionfs_testkit::Fixture;

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS line");
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

fn main() {
    // `cargo bench` passes --bench; nothing else is taken.
    std::env::set_var("ACTIONFS_TEST_DIR", actionfs_testkit::bench::bench_dir());
    let fx = Fixture::new();
    let requests = load("stress-linuxsandbox", fx.dir.path());
    populate(&requests);
    let creates: Vec<_> = requests[1..]
        .iter()
        .filter_map(|r| match r {
            Request::Create(c) => Some(c.clone()),
            Request::Destroy(_) => None,
        })
        .collect();
    let mappings: usize = creates.iter().map(|c| c.mappings.len()).sum();

    let daemon = fx.start(&[]);
    let pid = daemon.client().pid();
    let settle = || std::thread::sleep(Duration::from_millis(300));
    settle();
    let baseline = rss_bytes(pid);
    println!(
        "stress trace: {} sandboxes, {mappings} mappings; baseline RSS {} KiB",
        creates.len(),
        baseline / 1024
    );
    println!("| round | state | RSS KiB | bytes per mapping over baseline |");
    println!("|---|---|---|---|");
    let row = |round: usize, state: &str, rss: u64| {
        let per = (rss as f64 - baseline as f64) / mappings as f64;
        println!("| {round} | {state} | {} | {per:.0} |", rss / 1024);
    };
    for round in 1..=2 {
        let mut prefixes = PrefixTable::new();
        let mut paths = Vec::with_capacity(mappings);
        for create in &creates {
            daemon.create(create.clone());
            prefixes.register(&create.prefixes).unwrap();
            for mapping in &create.mappings {
                let resolved = prefixes.resolve(mapping).unwrap();
                paths.push(daemon.path(&format!("{}{}", create.id, resolved.path)));
            }
        }
        settle();
        row(round, "all sandboxes created", rss_bytes(pid));
        for path in &paths {
            std::fs::symlink_metadata(path).unwrap();
        }
        settle();
        row(round, "every mapping looked up", rss_bytes(pid));
        for create in &creates {
            daemon.destroy(&create.id);
        }
        settle();
        row(round, "all destroyed", rss_bytes(pid));
        // The destroyed sandboxes' kernel caches are kept for the next
        // ones (bounded in nodes and age), then let go.
        std::thread::sleep(actionfs::sandbox::tree::RETAINED_MAX_AGE + Duration::from_secs(2));
        row(round, "destroyed caches let go", rss_bytes(pid));
        if std::env::var_os("DROP").is_some() {
            std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
            daemon.create(actionfs_testkit::sandbox("trim", vec![]));
            settle();
            daemon.destroy("trim");
            settle();
            row(round, "after drop_caches", rss_bytes(pid));
        }
    }
}
