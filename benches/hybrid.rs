//! Choosing the native/FUSE cutoff: the whole life of an action (create
//! its sandbox through the daemon's request path, stat every input, read a
//! fraction f of them, write one output, destroy) for 10 to 20k inputs and
//! f in {0.1, 1.0}, served by pure FUSE, pure native (symlink; clone where
//! the file system can), and hybrid with the shipped cutoff, in one run.
//!
//! Runs on tmpfs (/dev/shm) unless ACTIONFS_BENCH_DIR names another
//! directory; ACTIONFS_BENCH_SIZES overrides the input counts and
//! ACTIONFS_HYBRID_CUTOFF the hybrid cutoff. `scripts/hybrid-report`
//! turns the results into the table, the significance tests and the plot
//! of docs/BENCHMARKS.md.

use std::path::Path;
use std::time::Duration;

use actionfs::sandbox::hybrid::cutoff;
use actionfs::sandbox::layout;
use actionfs::sandbox::materialize::{self, Method, Options};
use actionfs::tools::calibrate::workload::{Lab, Mounted};
use actionfs_protocol::ResolvedMapping;
use actionfs_testkit::bench::{bench_dir, sizes};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode};

const BIN: &str = env!("CARGO_BIN_EXE_actionfs");

/// Whether the lab's file system can clone files (FICLONE / clonefile).
fn clones_work(lab: &Lab) -> bool {
    let source = lab.tree.root.join(&lab.tree.files[0]);
    let mapping = ResolvedMapping {
        path: "/f".to_owned(),
        underlying: source,
        writable: false,
    };
    let Ok(plan) = layout::plan(&[mapping], Path::new("/nonexistent-mount"), None) else {
        return false;
    };
    let dest = lab.dir.join("clone-probe");
    let options = Options {
        method: Method::Clone,
        threads: 1,
    };
    match materialize::materialize(&plan, &dest, options) {
        Ok(built) => {
            let _ = materialize::teardown(&built, None);
            true
        }
        Err(_) => false,
    }
}

fn benches(c: &mut Criterion) {
    let sizes = sizes(&[10, 30, 100, 300, 1_000, 3_000, 10_000, 20_000]);
    let largest = *sizes.iter().max().unwrap();
    let lab = Lab::new(&bench_dir(), largest).expect("lab");
    let hybrid_cutoff = std::env::var("ACTIONFS_HYBRID_CUTOFF")
        .map(|n| n.parse().expect("a cutoff"))
        .unwrap_or_else(|_| cutoff::shipped_for(&lab.dir));
    let always = "--native_below=1000000000".to_owned();
    let mut modes: Vec<(&str, Vec<String>)> = vec![
        ("fuse", vec!["--native_below=0".to_owned()]),
        (
            "native-symlink",
            vec![always.clone(), "--native_method=symlink".to_owned()],
        ),
    ];
    if clones_work(&lab) {
        modes.push((
            "native-clone",
            vec![always, "--native_method=clone".to_owned()],
        ));
    }
    // `--native_below=0` would turn hybrid mode off; the same as fuse.
    modes.push(("hybrid", vec![format!("--native_below={hybrid_cutoff}")]));
    eprintln!("hybrid cutoff {hybrid_cutoff}, lab in {:?}", lab.dir);
    let mounts: Vec<(&str, Mounted)> = modes
        .iter()
        .map(|(name, args)| (*name, lab.mount(Path::new(BIN), args).expect("daemon")))
        .collect();

    for fraction in [0.1, 1.0] {
        let mut group = c.benchmark_group(format!("action_f{fraction}"));
        group.sampling_mode(SamplingMode::Flat);
        group.sample_size(10);
        for &n in &sizes {
            for (name, mounted) in &mounts {
                group.bench_with_input(BenchmarkId::new(*name, n), &n, |b, &n| {
                    b.iter_custom(|iters| {
                        (0..iters)
                            .map(|_| lab.action(mounted, n, fraction).expect("action"))
                            .sum::<Duration>()
                    })
                });
            }
        }
        group.finish();
    }
}

criterion_group! {
    name = hybrid;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(hybrid);
