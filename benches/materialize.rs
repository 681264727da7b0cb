//! Per-input cost of building and deleting native sandboxes, against
//! baselines measured in the same run:
//! - `floor-*`: a bare loop of the same system calls (mkdirat + openat per
//!   directory, symlinkat or linkat per file), the least any tool can do;
//! - `cp -rs`: GNU cp building the same symlink forest;
//! - teardown against `rm -rf` and `std::fs::remove_dir_all`.
//!
//! Runs on tmpfs (/dev/shm) unless ACTIONFS_BENCH_DIR names another
//! directory (e.g. a loop-mounted xfs with reflink=1 for `clone`).
//! ACTIONFS_BENCH_SIZES overrides the input counts (comma-separated).
//! `scripts/bench-report` turns the results into the tables of
//! docs/BENCHMARKS.md.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actionfs::sandbox::layout::{self, Entry};
use actionfs::sandbox::materialize::{self, Method, Options, Trash};
use actionfs::tools::calibrate::synthetic::SyntheticTree;
use actionfs_testkit::bench::{bench_dir, sizes};
use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, SamplingMode,
    Throughput,
};

const FILE_SIZE: usize = 2048;

/// A named way to build or delete a tree at a path.
type Case<'a> = (&'static str, Box<dyn Fn(&Path) + 'a>);

/// Fresh destination paths under one scratch directory.
struct Scratch {
    dir: tempfile::TempDir,
    next: AtomicUsize,
}

impl Scratch {
    fn fresh(&self) -> PathBuf {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.dir.path().join(format!("d{n}"))
    }
}

fn c(bytes: &[u8]) -> CString {
    CString::new(bytes).unwrap()
}

/// How the floor makes each file.
#[derive(Clone, Copy, PartialEq)]
enum FloorOp {
    Symlink,
    Hardlink,
    Clone,
    Copy,
}

/// Makes one file the way `op` does, with raw system calls: for clone and
/// copy, open the source, fstat it for the mode, create the target, then
/// FICLONE or copy_file_range.
fn floor_file(op: FloorOp, source: &CString, dir: i32, name: &CString, size: usize) {
    unsafe {
        let ret = match op {
            FloorOp::Symlink => libc::symlinkat(source.as_ptr(), dir, name.as_ptr()),
            FloorOp::Hardlink => {
                libc::linkat(libc::AT_FDCWD, source.as_ptr(), dir, name.as_ptr(), 0)
            }
            FloorOp::Clone | FloorOp::Copy => {
                let src = libc::openat(
                    libc::AT_FDCWD,
                    source.as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC,
                );
                let mut st: libc::stat = std::mem::zeroed();
                assert_eq!(libc::fstat(src, &mut st), 0);
                let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
                let dst = libc::openat(dir, name.as_ptr(), flags, st.st_mode & 0o7777);
                assert!(src >= 0 && dst >= 0);
                let ret = if op == FloorOp::Clone {
                    libc::ioctl(dst, libc::FICLONE, src)
                } else {
                    let copied = libc::copy_file_range(
                        src,
                        std::ptr::null_mut(),
                        dst,
                        std::ptr::null_mut(),
                        size,
                        0,
                    );
                    i32::from(copied != size as isize)
                };
                libc::close(src);
                libc::close(dst);
                ret
            }
        };
        assert_eq!(ret, 0);
    }
}

/// The floor: the same system calls as the materializer, with nothing else.
fn floor(tree: &SyntheticTree, dest: &Path, op: FloorOp) {
    std::fs::create_dir(dest).unwrap();
    std::fs::create_dir(dest.join("ws")).unwrap();
    let open = |dir: i32, name: &CString| -> OwnedFd {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let fd = unsafe { libc::openat(dir, name.as_ptr(), flags) };
        assert!(fd >= 0);
        unsafe { OwnedFd::from_raw_fd(fd) }
    };
    let root = open(libc::AT_FDCWD, &c(dest.join("ws").as_os_str().as_bytes()));
    let mut fds: HashMap<&Path, OwnedFd> = HashMap::new();
    for dir in &tree.dirs {
        let parent = match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(p) => fds[p].as_raw_fd(),
            None => root.as_raw_fd(),
        };
        let name = c(dir.file_name().unwrap().as_bytes());
        assert_eq!(unsafe { libc::mkdirat(parent, name.as_ptr(), 0o755) }, 0);
        fds.insert(dir, open(parent, &name));
    }
    for file in &tree.files {
        let dir = fds[file.parent().unwrap()].as_raw_fd();
        let name = c(file.file_name().unwrap().as_bytes());
        let source = c(tree.root.join(file).as_os_str().as_bytes());
        floor_file(op, &source, dir, &name, FILE_SIZE);
    }
}

fn ours(layout: &Entry, dest: &Path, method: Method, threads: usize) {
    materialize::materialize(layout, dest, Options { method, threads }).unwrap();
}

fn cp_rs(tree: &SyntheticTree, dest: &Path) {
    let ok = Command::new("cp")
        .arg("-rs")
        .arg(&tree.root)
        .arg(dest)
        .status()
        .unwrap();
    assert!(ok.success());
}

/// Whether FICLONE works between files in `dir`.
fn clone_supported(dir: &Path) -> bool {
    let probe = tempfile::tempdir_in(dir).unwrap();
    std::fs::write(probe.path().join("a"), "a").unwrap();
    let a = std::fs::File::open(probe.path().join("a")).unwrap();
    let b = std::fs::File::create(probe.path().join("b")).unwrap();
    unsafe { libc::ioctl(b.as_raw_fd(), libc::FICLONE, a.as_raw_fd()) == 0 }
}

/// Ten samples; for large trees one build per sample (flat sampling), so a
/// 100k-input case takes seconds, not minutes.
fn configure(group: &mut BenchmarkGroup<WallTime>, n: usize) {
    group
        .sample_size(10)
        .throughput(Throughput::Elements(n as u64));
    if n >= 10_000 {
        group
            .sampling_mode(SamplingMode::Flat)
            .measurement_time(Duration::from_secs(1));
    } else {
        group.measurement_time(Duration::from_secs(2));
    }
}

fn bench_materialize(c: &mut Criterion) {
    let base = bench_dir();
    let can_clone = clone_supported(&base);
    for n in sizes(&[10, 100, 1_000, 10_000, 100_000]) {
        let source = tempfile::tempdir_in(&base).unwrap();
        let tree = SyntheticTree::create(&source.path().join("src"), n, FILE_SIZE).unwrap();
        let layout = layout::plan(&tree.mappings("/ws"), Path::new("/nonexistent"), None).unwrap();
        let scratch = Scratch {
            dir: tempfile::tempdir_in(&base).unwrap(),
            next: AtomicUsize::new(0),
        };

        // Creation: time only the build; delete each copy outside the clock.
        let mut group = c.benchmark_group(format!("create-{n}"));
        configure(&mut group, n);
        let mut cases: Vec<Case> = vec![
            (
                "floor-symlink",
                Box::new(|d: &Path| floor(&tree, d, FloorOp::Symlink)),
            ),
            (
                "symlink",
                Box::new(|d: &Path| ours(&layout, d, Method::Symlink, 1)),
            ),
            (
                "symlink-2threads",
                Box::new(|d: &Path| ours(&layout, d, Method::Symlink, 2)),
            ),
            ("cp-rs", Box::new(|d: &Path| cp_rs(&tree, d))),
            (
                "floor-hardlink",
                Box::new(|d: &Path| floor(&tree, d, FloorOp::Hardlink)),
            ),
            (
                "hardlink",
                Box::new(|d: &Path| ours(&layout, d, Method::Hardlink, 1)),
            ),
            (
                "hardlink-2threads",
                Box::new(|d: &Path| ours(&layout, d, Method::Hardlink, 2)),
            ),
            (
                "floor-copy",
                Box::new(|d: &Path| floor(&tree, d, FloorOp::Copy)),
            ),
            (
                "copy",
                Box::new(|d: &Path| ours(&layout, d, Method::Copy, 1)),
            ),
            (
                "auto",
                Box::new(|d: &Path| ours(&layout, d, Method::Auto, 1)),
            ),
        ];
        if can_clone {
            cases.push((
                "floor-clone",
                Box::new(|d: &Path| floor(&tree, d, FloorOp::Clone)),
            ));
            cases.push((
                "clone",
                Box::new(|d: &Path| ours(&layout, d, Method::Clone, 1)),
            ));
            cases.push((
                "clone-2threads",
                Box::new(|d: &Path| ours(&layout, d, Method::Clone, 2)),
            ));
        }
        for (name, run) in &cases {
            group.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let dest = scratch.fresh();
                        let started = Instant::now();
                        run(&dest);
                        total += started.elapsed();
                        materialize::remove_tree(&dest).unwrap();
                    }
                    total
                })
            });
        }
        group.finish();

        // Teardown: build a hard-linked copy outside the clock, time the delete.
        let mut group = c.benchmark_group(format!("teardown-{n}"));
        configure(&mut group, n);
        let trash = Trash::open(&scratch.dir.path().join("trash"), 1).unwrap();
        let deleters: Vec<Case> = vec![
            (
                "remove_tree",
                Box::new(|d: &Path| {
                    materialize::remove_tree(d).unwrap();
                }),
            ),
            (
                "rm-rf",
                Box::new(|d: &Path| {
                    assert!(Command::new("rm")
                        .arg("-rf")
                        .arg(d)
                        .status()
                        .unwrap()
                        .success())
                }),
            ),
            (
                "std-remove_dir_all",
                Box::new(|d: &Path| std::fs::remove_dir_all(d).unwrap()),
            ),
            // Gone from view: one rename; the deletion runs behind.
            (
                "trash-discard",
                Box::new(|d: &Path| trash.discard(d).unwrap()),
            ),
        ];
        for (name, delete) in &deleters {
            group.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let dest = scratch.fresh();
                        ours(&layout, &dest, Method::Hardlink, 1);
                        let started = Instant::now();
                        delete(&dest);
                        total += started.elapsed();
                    }
                    trash.wait_idle();
                    total
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_materialize);
criterion_main!(benches);
