//! Two builds of the daemon against each other, interleaved: for each
//! operation, rounds of a batch on one mount then a batch on the other
//! (ABBA order, so that drift hits both alike), and the medians of the
//! per-round costs. On this noisy two-core machine criterion's one-after-
//! the-other groups drift by 10-20% between neighbours; alternating
//! batches resolves a few percent.
//!
//! usage: ACTIONFS_BENCH_BASELINE=/path/to/old/actionfs cargo bench --bench fuse_ab
//!        [ACTIONFS_AB_ROUNDS=40] [ACTIONFS_AB_ARGS='--passthrough=off']
//!
//! The current build is `bin()` (target/release/actionfs); the mounts
//! share one 5,000-file input tree on ACTIONFS_BENCH_DIR (default tmpfs).

use std::ffi::CString;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actionfs::tools::calibrate::synthetic::SyntheticTree;
use actionfs::tools::calibrate::workload;
use actionfs_protocol::Mapping;
use actionfs_testkit::bench::bench_dir;
use actionfs_testkit::{bin, ro, rw, sandbox, Daemon, Fixture};

const INPUTS: usize = 5_000;
const SMALL: usize = 2_048;

struct Mount {
    name: &'static str,
    daemon: Daemon,
    _fixture: Fixture,
    next: AtomicUsize,
}

impl Mount {
    /// Starts `binary` with `args`, every sandbox a FUSE view.
    fn start(name: &'static str, binary: &str, args: &[&str]) -> Mount {
        let fixture = Fixture::new();
        let daemon = fixture.start_command(fixture.command_of(binary, args));
        Mount {
            name,
            daemon,
            _fixture: fixture,
            next: AtomicUsize::new(0),
        }
    }

    fn create(&self, mappings: Vec<Mapping>) -> String {
        let id = format!("s{}", self.next.fetch_add(1, Ordering::Relaxed));
        self.daemon.create(sandbox(&id, mappings));
        id
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Runs `round(mount)` for each mount in ABBA order, `rounds` times; each
/// call returns (elapsed, operations). Prints per-mount medians (µs per
/// operation) and the ratio of the first mount to the second, with the
/// spread of the per-round ratios (quartiles).
fn compare(
    label: &str,
    mounts: &[Mount; 2],
    rounds: usize,
    mut round: impl FnMut(&Mount) -> (Duration, usize),
) {
    let mut per_op = [Vec::new(), Vec::new()];
    let mut ratios = Vec::new();
    for r in 0..rounds {
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        let mut this = [0.0; 2];
        for &m in &order {
            let (elapsed, ops) = round(&mounts[m]);
            this[m] = elapsed.as_secs_f64() * 1e6 / ops as f64;
            per_op[m].push(this[m]);
        }
        ratios.push(this[0] / this[1]);
    }
    let quartile = |q: f64| {
        let mut r = ratios.clone();
        r.sort_by(|a, b| a.partial_cmp(b).unwrap());
        r[((r.len() - 1) as f64 * q).round() as usize]
    };
    println!(
        "| {label} | {:.2} | {:.2} | {:.3} | {:.3}-{:.3} |",
        median(per_op[0].clone()),
        median(per_op[1].clone()),
        median(ratios.clone()),
        quartile(0.25),
        quartile(0.75),
    );
}

fn main() {
    // `cargo bench` passes --bench; nothing else is taken.
    let Some(baseline) = std::env::var_os("ACTIONFS_BENCH_BASELINE") else {
        eprintln!("fuse_ab: set ACTIONFS_BENCH_BASELINE to the daemon to compare with; skipped");
        return;
    };
    let baseline = baseline.into_string().expect("UTF-8 path");
    let rounds: usize = std::env::var("ACTIONFS_AB_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(40);
    let extra = std::env::var("ACTIONFS_AB_ARGS").unwrap_or_default();
    let args: Vec<&str> = extra.split_whitespace().collect();
    std::env::set_var("ACTIONFS_TEST_DIR", bench_dir());
    let inputs = tempfile::tempdir_in(bench_dir()).unwrap();
    let tree = SyntheticTree::create(&inputs.path().join("tree"), INPUTS, SMALL).unwrap();
    let scratch = tempfile::tempdir_in(inputs.path()).unwrap();
    let mappings = || -> Vec<Mapping> {
        tree.mappings("/ws")
            .into_iter()
            .map(|m| ro(&m.path, &m.underlying))
            .collect()
    };
    let mounts = [
        Mount::start("current", bin(), &args),
        Mount::start("baseline", &baseline, &args),
    ];
    let rel: Vec<CString> = tree
        .files
        .iter()
        .map(|f| CString::new(f.as_os_str().as_bytes()).unwrap())
        .collect();
    // One long-lived sandbox per mount for the warm operations.
    let warm: Vec<String> = mounts
        .iter()
        .map(|m| {
            let mut all = mappings();
            all.push(rw("/out", scratch.path()));
            m.create(all)
        })
        .collect();
    let ws = |m: &Mount| {
        let index = mounts.iter().position(|x| x.name == m.name).unwrap();
        File::open(m.daemon.path(&format!("{}/ws", warm[index]))).unwrap()
    };
    let batch = 500;
    println!(
        "{rounds} rounds of ABBA batches; args {args:?}; inputs on {:?}",
        bench_dir()
    );
    println!("| operation (µs each) | current | baseline | current / baseline | quartiles |");
    println!("|---|---|---|---|---|");

    let mut offset = 0;
    compare("first stat (new sandbox)", &mounts, rounds, |m| {
        let id = m.create(mappings());
        let dir = File::open(m.daemon.path(&format!("{id}/ws"))).unwrap();
        let start = Instant::now();
        for r in &rel[..batch] {
            workload::stat_at(&dir, r).unwrap();
        }
        let elapsed = start.elapsed();
        drop(dir);
        m.daemon.destroy(&id);
        (elapsed, batch)
    });
    compare("cached stat", &mounts, rounds, |m| {
        let dir = ws(m);
        for r in &rel[..batch] {
            workload::stat_at(&dir, r).unwrap();
        }
        let start = Instant::now();
        for r in &rel[..batch] {
            workload::stat_at(&dir, r).unwrap();
        }
        (start.elapsed(), batch)
    });
    let mut buf = vec![0u8; SMALL + 1];
    compare("open + read 2 KiB + close, warm", &mounts, rounds, |m| {
        let dir = ws(m);
        offset = (offset + batch) % (INPUTS - batch);
        let slice = &rel[offset..offset + batch];
        for r in slice {
            workload::read_at(&dir, r, &mut buf).unwrap();
        }
        let start = Instant::now();
        for r in slice {
            assert_eq!(workload::read_at(&dir, r, &mut buf).unwrap(), SMALL);
        }
        (start.elapsed(), batch)
    });
    let data = vec![b'o'; 4096];
    let counter = AtomicUsize::new(0);
    compare("create + write 4 KiB + close", &mounts, rounds, |m| {
        let index = mounts.iter().position(|x| x.name == m.name).unwrap();
        let out = m.daemon.path(&format!("{}/out", warm[index]));
        let n = 100;
        let start = Instant::now();
        for _ in 0..n {
            let i = counter.fetch_add(1, Ordering::Relaxed);
            File::create(out.join(format!("o{i}")))
                .unwrap()
                .write_all(&data)
                .unwrap();
        }
        let elapsed = start.elapsed();
        for entry in fs::read_dir(scratch.path()).unwrap() {
            let _ = fs::remove_file(entry.unwrap().path());
        }
        (elapsed, n)
    });
    compare(
        "CreateSandbox of 5,000 (per sandbox)",
        &mounts,
        rounds.min(20),
        |m| {
            let all = mappings();
            let client = m.daemon.client();
            let start = Instant::now();
            client.create(&sandbox("ab", all)).unwrap();
            let elapsed = start.elapsed();
            client.destroy("ab").unwrap();
            (elapsed, 1)
        },
    );
}
