//! Listing a directory of 100,000 and 1,000,000 entries through the mount
//! against listing it natively, same run: `ls -f` as `read_dir` to the
//! end, a fresh open each time (the kernel caches no FUSE listing, so every
//! listing reaches the daemon in READDIR batches of a page or so).
//!
//! The entries are hard links to one empty file, which keeps a million
//! names cheap on tmpfs. Runs on tmpfs (/dev/shm) unless
//! ACTIONFS_BENCH_DIR names another directory; ACTIONFS_BENCH_SIZES
//! overrides the entry counts. ACTIONFS_BENCH_BASELINE=PATH adds the same
//! listing served by another build of the daemon (`fuse-baseline`).

use std::path::{Path, PathBuf};

use actionfs_testkit::bench::{bench_dir, sizes};
use actionfs_testkit::{ro, sandbox, Daemon, Fixture};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode};

/// A directory of `n` names, all hard links to one file.
fn populate(base: &Path, n: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir_in(base).unwrap();
    let target = dir.path().join("target");
    std::fs::write(&target, "").unwrap();
    let listed = dir.path().join("listed");
    std::fs::create_dir(&listed).unwrap();
    for i in 0..n {
        std::fs::hard_link(&target, listed.join(format!("entry_{i:07}_of_a_listing"))).unwrap();
    }
    dir
}

/// Entries read from `dir`, `.` and `..` left out (as `read_dir` does).
fn list(dir: &Path) -> usize {
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        entry.unwrap();
        count += 1;
    }
    count
}

/// A daemon serving `listed` as sandbox `s`'s `/listed`.
fn serve(binary: Option<&str>, listed: &Path) -> (Daemon, Fixture) {
    let fixture = Fixture::new();
    let daemon = match binary {
        Some(binary) => fixture.start_command(fixture.command_of(binary, &[])),
        None => fixture.start(&[]),
    };
    daemon.create(sandbox("s", vec![ro("/listed", listed)]));
    (daemon, fixture)
}

fn listing(c: &mut Criterion) {
    let baseline = std::env::var("ACTIONFS_BENCH_BASELINE").ok();
    let mut group = c.benchmark_group("listing");
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    for n in sizes(&[100_000, 1_000_000]) {
        let dir = populate(&bench_dir(), n);
        let listed = dir.path().join("listed");
        // Warm the dentry cache of the underlying directory.
        assert_eq!(list(&listed), n);
        group.bench_with_input(BenchmarkId::new("native", n), &listed, |b, listed| {
            b.iter(|| assert_eq!(list(listed), n))
        });
        let mut servers: Vec<(&str, Option<&str>)> = vec![("fuse", None)];
        if let Some(baseline) = &baseline {
            servers.push(("fuse-baseline", Some(baseline.as_str())));
        }
        for (name, binary) in servers {
            let (daemon, _fixture) = serve(binary, &listed);
            let through: PathBuf = daemon.path("s/listed");
            group.bench_with_input(BenchmarkId::new(name, n), &through, |b, through| {
                b.iter(|| assert_eq!(list(through), n))
            });
            drop(daemon);
        }
    }
    group.finish();
}

criterion_group!(benches, listing);
criterion_main!(benches);
