//! The FUSE data path against native access to the same files, same run.
//!
//! A 5,000-file input tree (2 KiB files, 20 per directory) is mapped one
//! mapping per file, as Bazel maps an action's inputs, into one daemon per
//! way of serving opens: `open` (the default, `--zero_message_opens=off`:
//! an OPEN per open, with kernel passthrough for data where the daemon may
//! use it), `zero` (the opt-in `--zero_message_opens=on`: no OPEN or
//! RELEASE round trips, data through the daemon and the page cache) and,
//! as root, `open-cached` (`open` without passthrough). `native` touches
//! the underlying files. Each mode is named by its flag, so that a
//! baseline binary with another default runs the same modes.
//!
//! Run by an unprivileged user (`scripts/bench-fuse` does both), the
//! daemons are that user's, mounted with fusermount3 and without
//! passthrough, as Bazel users run them; the names then end in `@user`.
//!
//! Inputs live on tmpfs (/dev/shm) unless ACTIONFS_BENCH_DIR says
//! otherwise; the 256 MiB file for the sequential reads lives on
//! ACTIONFS_BENCH_DISK_DIR (default /var/tmp, the root disk) so that a cold
//! read really reads the disk. Cold means the file's pages were dropped
//! with posix_fadvise(DONTNEED) before each read, through every path that
//! could hold them.
//!
//! Per-input operations use paths relative to the workspace directory, as
//! an action does from its working directory: the same components are
//! walked natively and through the mount.
//!
//! ACTIONFS_BENCH_BASELINE=PATH adds the same mounts served by another
//! build of the daemon (names ending in `-baseline`), so a change is
//! measured against the binary before it in the same run.
//!
//! Each way of serving opens runs on both transports where the kernel
//! offers FUSE-over-io_uring: classic `/dev/fuse` (`zero`, `open`, ...)
//! and io_uring (`zero-uring`, `open-uring`, ...), side by side in one
//! run. ACTIONFS_BENCH_TRANSPORTS=classic|io_uring|both (default both)
//! narrows that; ACTIONFS_BENCH_UNPINNED=1 adds io_uring mounts whose
//! queue threads are not pinned to their CPUs (`-uring-unpinned`).

use std::ffi::CString;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actionfs::tools::calibrate::synthetic::SyntheticTree;
use actionfs::tools::calibrate::workload;
use actionfs_protocol::Mapping;
use actionfs_testkit::bench::{bench_dir, dir_from_env};
use actionfs_testkit::{bin, rw, sandbox, Daemon, Fixture};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const INPUTS: usize = 5_000;
const SMALL: usize = 2_048;
const BIG: usize = 256 << 20;
const LISTED: usize = 1_000;

/// One daemon with its fixture and the sandboxes made in it so far.
struct Mounted {
    name: String,
    daemon: Daemon,
    /// Owns the mount point; declared after `daemon`, so dropped after it.
    _fixture: Fixture,
    next_id: AtomicUsize,
}

impl Mounted {
    /// Starts `binary` with `args`, every sandbox a FUSE view; `pinned`:
    /// io_uring queue threads pinned to their CPUs (the default).
    fn start(name: String, binary: &str, args: &[&str], pinned: bool) -> Mounted {
        let fixture = Fixture::new();
        let mut command = fixture.command_of(binary, args);
        if !pinned {
            command.env("ACTIONFS_URING_PIN", "0");
        }
        let daemon = fixture.start_command(command);
        Mounted {
            name,
            _fixture: fixture,
            daemon,
            next_id: AtomicUsize::new(0),
        }
    }

    /// Creates a fresh sandbox with `mappings`; returns its id.
    fn create(&self, mappings: Vec<Mapping>) -> String {
        let id = format!("s{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        self.daemon.create(sandbox(&id, mappings));
        id
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.daemon.path(rel)
    }
}

struct World {
    tree: SyntheticTree,
    /// A directory of LISTED files, mapped one mapping per file.
    listed: Vec<PathBuf>,
    big: PathBuf,
    scratch: tempfile::TempDir,
    mounts: Vec<Mounted>,
    /// The id of the sandbox holding every input, in each mount.
    ids: Vec<String>,
    _inputs: tempfile::TempDir,
    _disk: tempfile::TempDir,
}

/// Every input, the tree's below workspace directory `ws`.
fn input_mappings(tree: &SyntheticTree, listed: &[PathBuf], big: &Path, ws: &str) -> Vec<Mapping> {
    let mut mappings: Vec<Mapping> = tree
        .mappings(ws)
        .into_iter()
        .map(|m| actionfs_testkit::ro(&m.path, &m.underlying))
        .collect();
    for file in listed {
        let name = file.file_name().unwrap().to_str().unwrap();
        mappings.push(actionfs_testkit::ro(&format!("/listed/{name}"), file));
    }
    mappings.push(actionfs_testkit::ro("/big", big));
    mappings
}

impl World {
    fn new() -> World {
        std::env::set_var("ACTIONFS_TEST_DIR", bench_dir());
        let inputs = tempfile::tempdir_in(bench_dir()).expect("inputs dir");
        let tree = SyntheticTree::create(&inputs.path().join("tree"), INPUTS, SMALL).unwrap();
        let listed_dir = inputs.path().join("listed");
        fs::create_dir(&listed_dir).unwrap();
        let listed: Vec<PathBuf> = (0..LISTED)
            .map(|i| {
                let path = listed_dir.join(format!("entry{i:04}.c"));
                fs::write(&path, b"int x;\n").unwrap();
                path
            })
            .collect();
        let disk = tempfile::tempdir_in(dir_from_env("ACTIONFS_BENCH_DISK_DIR", "/var/tmp"))
            .expect("disk");
        let big = disk.path().join("big");
        let mut file = File::create(&big).unwrap();
        let block: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
        for _ in 0..BIG >> 20 {
            file.write_all(&block).unwrap();
        }
        file.sync_all().unwrap();
        let scratch = tempfile::tempdir_in(inputs.path()).unwrap();

        let mut modes: Vec<(&str, &[&str])> = vec![
            ("zero", &["--zero_message_opens=on"]),
            ("open", &["--zero_message_opens=off"]),
        ];
        let root = is_root();
        if root {
            modes.push((
                "open-cached",
                &["--zero_message_opens=off", "--passthrough=off"],
            ));
        }
        let who = if root { "" } else { "@user" };
        let mut mounts: Vec<Mounted> = Vec::new();
        for (suffix, transport, pinned) in transports() {
            for (mode, args) in &modes {
                let mut args = args.to_vec();
                args.push(transport);
                let name = format!("{mode}{suffix}{who}");
                mounts.push(Mounted::start(name, bin(), &args, pinned));
            }
        }
        if let Some(baseline) = std::env::var_os("ACTIONFS_BENCH_BASELINE") {
            let baseline = baseline.to_str().expect("UTF-8 path");
            for (mode, args) in &modes {
                let name = format!("{mode}-baseline{who}");
                mounts.push(Mounted::start(name, baseline, args, true));
            }
        }
        let ids = mounts
            .iter()
            .map(|m| {
                let mut mappings = input_mappings(&tree, &listed, &big, "/ws");
                mappings.push(rw("/out", scratch.path()));
                m.create(mappings)
            })
            .collect();
        World {
            tree,
            listed,
            big,
            scratch,
            mounts,
            ids,
            _inputs: inputs,
            _disk: disk,
        }
    }

    /// The workspace directory natively and through each mount, in the
    /// order of `self.mounts`, opened as an action's working directory.
    fn workspaces(&self) -> Vec<(String, File)> {
        let mut views = vec![(native(), File::open(&self.tree.root).unwrap())];
        for (mount, id) in self.mounts.iter().zip(&self.ids) {
            views.push((
                mount.name.clone(),
                File::open(mount.path(&format!("{id}/ws"))).unwrap(),
            ));
        }
        views
    }

    /// The inputs' paths relative to the workspace.
    fn relative(&self) -> Vec<CString> {
        self.tree
            .files
            .iter()
            .map(|f| CString::new(f.as_os_str().as_bytes()).unwrap())
            .collect()
    }

    /// Where `rel` (inside the all-inputs sandbox) is in each view.
    fn view_of(&self, underneath: &Path, rel: &str) -> Vec<(String, PathBuf)> {
        let mut views = vec![(native(), underneath.to_owned())];
        for (mount, id) in self.mounts.iter().zip(&self.ids) {
            views.push((mount.name.clone(), mount.path(&format!("{id}/{rel}"))));
        }
        views
    }
}

/// The transports measured: name suffix, flag, and whether queue threads
/// are pinned. io_uring only where the kernel offers it.
fn transports() -> Vec<(&'static str, &'static str, bool)> {
    let asked = std::env::var("ACTIONFS_BENCH_TRANSPORTS").unwrap_or_else(|_| "both".into());
    let offered = fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|v| v.trim() == "Y");
    let mut transports = Vec::new();
    if asked != "io_uring" {
        transports.push(("", "--transport=classic", true));
    }
    if asked != "classic" {
        if offered {
            transports.push(("-uring", "--transport=io_uring", true));
            if std::env::var_os("ACTIONFS_BENCH_UNPINNED").is_some_and(|v| v == "1") {
                transports.push(("-uring-unpinned", "--transport=io_uring", false));
            }
        } else {
            eprintln!("fuse_io: enable_uring is not Y; measuring the classic transport only");
        }
    }
    transports
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The native baseline's name: native access by the same user.
fn native() -> String {
    if is_root() {
        "native".to_owned()
    } else {
        "native@user".to_owned()
    }
}

fn stat(path: &Path) {
    fs::symlink_metadata(path).unwrap_or_else(|err| panic!("stat {path:?}: {err}"));
}

/// fstatat(dir, rel): a stat from an action's working directory.
fn stat_at(dir: &File, rel: &CString) {
    // SAFETY: zeroed stat is valid; valid fd, C string and out pointer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            rel.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0, "stat {rel:?}: {}", std::io::Error::last_os_error());
}

/// Round-robin over `rel`, `iters` calls of `op` from `dir`.
fn cycle_at(
    dir: &File,
    rel: &[CString],
    iters: u64,
    mut op: impl FnMut(&File, &CString),
) -> Duration {
    let start = Instant::now();
    for i in 0..iters as usize {
        op(dir, &rel[i % rel.len()]);
    }
    start.elapsed()
}

fn drop_pages(path: &Path) {
    let file = File::open(path).unwrap();
    // SAFETY: a valid fd; advice only.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

fn read_all(path: &Path, buf: &mut [u8]) -> usize {
    let mut file = File::open(path).unwrap();
    let mut total = 0;
    loop {
        match file.read(buf).unwrap() {
            0 => return total,
            n => total += n,
        }
    }
}

fn benches(c: &mut Criterion) {
    let world = World::new();
    let workspaces = world.workspaces();
    let rel = world.relative();

    // Cached stat: every input looked up once before timing.
    let mut group = c.benchmark_group("stat_cached");
    for (name, dir) in &workspaces {
        rel.iter().for_each(|r| stat_at(dir, r));
        group.bench_function(name.as_str(), |b| {
            b.iter_custom(|n| cycle_at(dir, &rel, n, stat_at))
        });
    }
    group.finish();

    // First stat in a new sandbox: each timed stat names an input of a
    // sandbox made (untimed) for the batch after the last one was
    // destroyed, as Bazel's next action does; the daemon may hand it the
    // last one's kernel cache. Native has nothing to look up for the
    // first time, so it stats the underlying files.
    first_stats(c, &world, &workspaces[0].1, &rel, "stat_first", |_| {
        "/ws".to_owned()
    });
    // The same where each sandbox's workspace has a name of its own, so
    // that every timed stat is a LOOKUP sent to the daemon.
    first_stats(c, &world, &workspaces[0].1, &rel, "stat_lookup", |n| {
        format!("/ws{n}")
    });

    // Open, read 2 KiB, close; warm.
    let mut group = c.benchmark_group("open_read_close_2KiB");
    for (name, dir) in &workspaces {
        let mut buf = [0u8; SMALL + 1];
        let mut read = |dir: &File, r: &CString| {
            assert_eq!(workload::read_at(dir, r, &mut buf).unwrap(), SMALL)
        };
        rel.iter().for_each(|r| read(dir, r));
        group.bench_function(name.as_str(), |b| {
            b.iter_custom(|n| cycle_at(dir, &rel, n, &mut read))
        });
    }
    group.finish();

    // Sequential read of 256 MiB, warm and cold.
    let mut buf = vec![0u8; 1 << 20];
    let big_views = world.view_of(&world.big, "big");
    for cold in [false, true] {
        let mut group = c.benchmark_group(if cold {
            "seq_read_cold"
        } else {
            "seq_read_warm"
        });
        group.sample_size(10);
        group.throughput(Throughput::Bytes(BIG as u64));
        for (name, path) in &big_views {
            read_all(path, &mut buf);
            group.bench_function(name.as_str(), |b| {
                b.iter_custom(|n| {
                    let mut elapsed = Duration::ZERO;
                    for _ in 0..n {
                        if cold {
                            // The mount's own cache (cached mode) first,
                            // then the underlying file's.
                            drop_pages(path);
                            drop_pages(&world.big);
                        }
                        let start = Instant::now();
                        assert_eq!(read_all(path, &mut buf), BIG);
                        elapsed += start.elapsed();
                    }
                    elapsed
                })
            });
        }
        group.finish();
    }

    // readdir of 1,000 entries, each its own mapping.
    let mut group = c.benchmark_group("readdir_1000");
    let listed_native = world.listed[0].parent().unwrap().to_owned();
    for (name, dir) in world.view_of(&listed_native, "listed") {
        let list = |dir: &Path| {
            assert_eq!(fs::read_dir(dir).unwrap().count(), LISTED);
        };
        list(&dir);
        group.bench_function(name.as_str(), |b| b.iter(|| list(&dir)));
    }
    group.finish();

    // create + write 4 KiB + close in a writable mapping.
    let mut group = c.benchmark_group("create_write_close_4KiB");
    let outs = world.view_of(world.scratch.path(), "out");
    let data = vec![b'o'; 4096];
    for (n, (name, dir)) in outs.iter().enumerate() {
        let counter = AtomicUsize::new(0);
        group.bench_function(name.as_str(), |b| {
            b.iter(|| {
                let i = counter.fetch_add(1, Ordering::Relaxed);
                let path = dir.join(format!("o{n}-{i}"));
                File::create(&path).unwrap().write_all(&data).unwrap();
            })
        });
    }
    group.finish();
    for entry in fs::read_dir(world.scratch.path()).unwrap() {
        let _ = fs::remove_file(entry.unwrap().path());
    }

    let who = if is_root() { "" } else { "@user" };
    reconfiguration(c, &world.mounts[0], who);
    if let Some(baseline) = world.mounts.iter().find(|m| m.name.contains("-baseline")) {
        reconfiguration(c, baseline, &format!("-baseline{who}"));
    }
}

/// Times stats of each input in fresh sandboxes, batch by batch, with
/// the inputs below `ws(batch)`.
fn first_stats(
    c: &mut Criterion,
    world: &World,
    native_ws: &File,
    rel: &[CString],
    group: &str,
    ws: impl Fn(usize) -> String,
) {
    let mut group = c.benchmark_group(group);
    group.bench_function(native(), |b| {
        b.iter_custom(|n| cycle_at(native_ws, rel, n, stat_at))
    });
    let batches = AtomicUsize::new(0);
    for mount in &world.mounts {
        group.bench_function(mount.name.as_str(), |b| {
            b.iter_custom(|n| {
                let mut elapsed = Duration::ZERO;
                let mut left = n as usize;
                while left > 0 {
                    let ws = ws(batches.fetch_add(1, Ordering::Relaxed));
                    let id =
                        mount.create(input_mappings(&world.tree, &world.listed, &world.big, &ws));
                    let dir = File::open(mount.path(&format!("{id}{ws}"))).unwrap();
                    let batch = left.min(rel.len());
                    elapsed += cycle_at(&dir, &rel[..batch], batch as u64, stat_at);
                    left -= batch;
                    drop(dir);
                    mount.daemon.destroy(&id);
                }
                elapsed
            })
        });
    }
    group.finish();
}

/// CreateSandbox and DestroySandbox round trips through the daemon's
/// request path, for 10 to 20k mappings.
fn reconfiguration(c: &mut Criterion, mount: &Mounted, suffix: &str) {
    let dir = tempfile::tempdir_in(bench_dir()).unwrap();
    let tree = SyntheticTree::create(&dir.path().join("t"), 20_000, 16).unwrap();
    let all: Vec<Mapping> = tree
        .mappings("/ws")
        .into_iter()
        .map(|m| actionfs_testkit::ro(&m.path, &m.underlying))
        .collect();
    let client = mount.daemon.client();
    let mut create = c.benchmark_group(format!("create_sandbox{suffix}"));
    for n in [10, 100, 1_000, 5_003, 10_000, 20_000] {
        create.throughput(Throughput::Elements(n as u64));
        create.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    let request = sandbox("bench", all[..n].to_vec());
                    let start = Instant::now();
                    client.create(&request).unwrap();
                    elapsed += start.elapsed();
                    client.destroy("bench").unwrap();
                }
                elapsed
            })
        });
    }
    create.finish();
    let mut destroy = c.benchmark_group(format!("destroy_sandbox{suffix}"));
    for n in [10, 100, 1_000, 5_003, 10_000, 20_000] {
        destroy.throughput(Throughput::Elements(n as u64));
        destroy.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    client.create(&sandbox("bench", all[..n].to_vec())).unwrap();
                    // What an action does: look at part of its inputs.
                    for m in all[..n].iter().step_by(10) {
                        stat(&mount.path(&format!("bench{}", m.path)));
                    }
                    let start = Instant::now();
                    client.destroy("bench").unwrap();
                    elapsed += start.elapsed();
                }
                elapsed
            })
        });
    }
    destroy.finish();
}

criterion_group! {
    name = fuse_io;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = benches
}
criterion_main!(fuse_io);
