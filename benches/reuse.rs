//! Native sandboxes built from a stash against fresh builds: the time to
//! create and to destroy a Bazel-shaped sandbox (BASE/N/scratch holding
//! every input) of N = 10..20,000 inputs, when any two sandboxes share 0,
//! 50, 90 or 100% of their inputs. Each iteration is a whole action's
//! life: a new scratch directory, create, destroy, and the scratch
//! directory deleted as Bazel does; only create or destroy is timed.
//!
//! Runs on tmpfs (/dev/shm) unless ACTIONFS_BENCH_DIR names another
//! directory; ACTIONFS_BENCH_SIZES overrides the input counts.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use actionfs::sandbox::hybrid::cutoff::Policy;
use actionfs::sandbox::hybrid::NativeSandboxes;
use actionfs::sandbox::layout::Draft;
use actionfs::sandbox::materialize::Method;
use actionfs_protocol::ResolvedMapping;
use actionfs_testkit::bench::{bench_dir, sizes};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode};

/// Inputs of `n` files: the first `shared` at the same paths in every
/// sandbox, the others at paths no other sandbox has (all mapped to the
/// same `n` underlying files), so that any two sandboxes share exactly
/// `shared` inputs.
struct Inputs {
    dir: tempfile::TempDir,
    n: usize,
    shared: usize,
    next: usize,
}

impl Inputs {
    fn new(base: &Path, n: usize, overlap_percent: usize) -> Inputs {
        let dir = tempfile::tempdir_in(base).unwrap();
        for i in 0..n {
            let path = dir.path().join(format!("src/d{}/f{i}.c", i % 50));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "int x;\n").unwrap();
        }
        Inputs {
            dir,
            n,
            shared: n * overlap_percent / 100,
            next: 0,
        }
    }

    /// The next action's scratch directory and finished draft.
    fn next(&mut self) -> (PathBuf, Draft) {
        self.next += 1;
        let scratch = self.dir.path().join(format!("{}/scratch", self.next));
        std::fs::create_dir_all(&scratch).unwrap();
        let mut mappings = vec![ResolvedMapping {
            path: "/ws".to_owned(),
            underlying: scratch.clone(),
            writable: true,
        }];
        let own = format!("own{}", self.next);
        for i in 0..self.n {
            let file = format!("d{}/f{i}.c", i % 50);
            let top = if i < self.shared { "shared" } else { &own };
            mappings.push(ResolvedMapping {
                path: format!("/ws/{top}/{file}"),
                underlying: self.dir.path().join("src").join(file),
                writable: false,
            });
        }
        let draft = Draft::of(&mappings, None)
            .finish(Path::new("/nonexistent-mount"))
            .unwrap();
        (scratch, draft)
    }
}

/// Runs `iters` actions; returns the time spent creating and destroying.
fn actions(native: &NativeSandboxes, inputs: &mut Inputs, iters: u64) -> (Duration, Duration) {
    let (mut create, mut destroy) = (Duration::ZERO, Duration::ZERO);
    for i in 0..iters {
        let (scratch, draft) = inputs.next();
        let id = format!("a{i}");
        let started = Instant::now();
        native.create(&id, &draft).unwrap();
        create += started.elapsed();
        let started = Instant::now();
        native.destroy(&id).unwrap();
        destroy += started.elapsed();
        // Bazel deletes the action's directory.
        std::fs::remove_dir_all(scratch.parent().unwrap()).unwrap();
    }
    (create, destroy)
}

fn reuse(c: &mut Criterion) {
    let base = bench_dir();
    let mut group = c.benchmark_group("reuse");
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    let modes: [(&str, usize, &[usize]); 2] =
        [("fresh", 0, &[100]), ("stash", 8, &[0, 50, 90, 100])];
    for n in sizes(&[10, 100, 1_000, 5_000, 20_000]) {
        for (mode, stashes, overlaps) in modes {
            for &overlap in overlaps {
                for (phase, pick) in [("create", 0), ("destroy", 1)] {
                    let mut inputs = Inputs::new(&base, n, overlap);
                    let native = NativeSandboxes::new(
                        &inputs.dir.path().join("native"),
                        Policy::Below(usize::MAX),
                        Method::Symlink,
                        stashes,
                    );
                    let name = format!("{phase}/{mode}-{overlap}%");
                    group.bench_function(BenchmarkId::new(name, n), |b| {
                        b.iter_custom(|iters| {
                            let (create, destroy) = actions(&native, &mut inputs, iters);
                            [create, destroy][pick]
                        })
                    });
                    native.destroy_all();
                }
            }
        }
    }
    group.finish();
}

criterion_group!(benches, reuse);
criterion_main!(benches);
