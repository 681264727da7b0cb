//! Memory of the content store (`src/sandbox/store/`) with a million
//! digests: puts 1,000,000 small contents (16 bytes each, on tmpfs where
//! /dev/shm exists) and reads the process's RSS from /proc/self/statm
//! before and after, with the time per put; then pins every entry from
//! 1,000 sandboxes of 1,000 digests each and reads it again; then hands
//! the store on and times a new store's adoption of it. The daemon
//! must hold a million digests in at most 200 MiB. Not a criterion
//! benchmark: it measures bytes. Run: `cargo bench --bench store_memory`
//! (ACTIONFS_BENCH_DIGESTS=N for another count).

use std::path::Path;
use std::time::Instant;

use actionfs::sandbox::store::{ContentStore, Digest, Retention};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .expect("resident pages in statm");
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    pages * page
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    // `cargo bench` passes --bench; nothing else is taken.
    let n: usize = std::env::var("ACTIONFS_BENCH_DIGESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    };
    let dir = tempfile::tempdir_in(&base).expect("a temporary directory");
    let store = ContentStore::open(&dir.path().join("store"), u64::MAX).expect("open the store");
    let content = |i: usize| (i as u128).to_le_bytes();

    let before = rss_bytes();
    let start = Instant::now();
    for i in 0..n {
        let bytes = content(i);
        store
            .put_bytes(&Digest::of(&bytes).hex(), &bytes, Retention::Keep)
            .expect("put");
    }
    let elapsed = start.elapsed();
    let after = rss_bytes();
    let usage = store.usage();
    assert_eq!(usage.entries, n);
    println!(
        "{n} digests of 16 bytes in {} ({}): {:.1} µs per put",
        store.path().display(),
        if shm.is_dir() { "tmpfs" } else { "temp dir" },
        elapsed.as_secs_f64() * 1e6 / n as f64
    );
    println!(
        "RSS before {:.1} MiB, after {:.1} MiB: {:.1} MiB for the index, {:.0} bytes per digest",
        mib(before),
        mib(after),
        mib(after.saturating_sub(before)),
        after.saturating_sub(before) as f64 / n as f64
    );

    // Every entry pinned: 1,000 digests per sandbox.
    let sandboxes = n.div_ceil(1000);
    let start = Instant::now();
    for s in 0..sandboxes {
        let hashes: Vec<String> = (s * 1000..n.min(s * 1000 + 1000))
            .map(|i| Digest::of(&content(i)).hex())
            .collect();
        let wanted: Vec<(&str, bool)> = hashes.iter().map(|h| (h.as_str(), false)).collect();
        store
            .acquire(&format!("sandbox-{s}"), &wanted)
            .expect("acquire");
    }
    let elapsed = start.elapsed();
    let pinned = rss_bytes();
    println!(
        "all {} pinned by {sandboxes} sandboxes of 1,000 in {:.2} s: RSS {:.1} MiB",
        store.usage().pinned,
        elapsed.as_secs_f64(),
        mib(pinned),
    );
    for s in 0..sandboxes {
        store.release(&format!("sandbox-{s}"));
    }

    // Warm state: handed on, then adopted by a new store (--keep_state).
    let warm = dir.path().join("warm");
    let start = Instant::now();
    let handed = store.hand_on(&warm).expect("hand on");
    println!(
        "handed on {} entries in {:.2} s",
        handed.entries,
        start.elapsed().as_secs_f64()
    );
    store.close().expect("close the store");
    let before = rss_bytes();
    let start = Instant::now();
    let (next, adopted) = ContentStore::open_adopting(&dir.path().join("next"), u64::MAX, &warm)
        .expect("open the next store");
    let adopted = adopted.expect("adopt").expect("a hand-off");
    println!(
        "adopted {} entries ({} dropped) in {:.2} s: RSS {:.1} MiB ({:.1} MiB more)",
        adopted.entries,
        adopted.dropped,
        start.elapsed().as_secs_f64(),
        mib(rss_bytes()),
        mib(rss_bytes().saturating_sub(before))
    );
    assert_eq!(adopted.entries, n);
    let start = Instant::now();
    next.close().expect("close the store");
    println!(
        "closed (every file removed) in {:.1} s",
        start.elapsed().as_secs_f64()
    );
}
