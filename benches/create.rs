//! CreateSandbox end to end, through the real daemon over stdin, from
//! 1,000 to 1,000,000 mappings, and the daemon's peak memory for the
//! largest.
//!
//! Requests are encoded before timing, as Bazel writes them: a writable
//! workspace (`/ws` -> a scratch directory) and then one read-only mapping
//! per input, each named by a prefix per directory on both sides, with
//! the prefixes registered in the same request's `q` (every request
//! carries all it uses, so each is the first of its layout). A create is
//! timed from the first byte written to the answer read; the sandbox is
//! destroyed (untimed) before the next. Shapes:
//!
//! - `tree/N`: the first N files of a 1,000,000-file tree, 200 files per
//!   directory (`p0/d0/f0.c` ... `p49/d4999/f999999.c`). With fewer
//!   files per directory the daemon before this work cannot make the
//!   largest sandbox at all: it pins every input's directory at create,
//!   a descriptor each, and this machine's hard limit is 20,000;
//! - `one_dir/5000`: 5,000 files of one directory mapped one by one.
//!
//! With ACTIONFS_BENCH_BASELINE=PATH another build of the daemon runs the
//! same requests in the same run, alternating with this one request by
//! request, so that drift hits both alike. Prints the median per shape and
//! daemon, and the median per mapping. Then, for each daemon, a fresh
//! process makes one 1,000,000-mapping sandbox and its peak resident size
//! (VmHWM in /proc/PID/status) is printed, against its size before the
//! request (VmRSS).
//!
//! usage: [ACTIONFS_BENCH_BASELINE=/work/bin/actionfs-before]
//!        [ACTIONFS_BENCH_SIZES=1000,10000] [ACTIONFS_CREATE_REPS=N]
//!        cargo bench --bench create
//!
//! Input files are empty (their contents do not matter to a create) and
//! live on ACTIONFS_BENCH_DIR (default /dev/shm).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use actionfs_testkit::bench::{bench_dir, sizes};
use actionfs_testkit::{bin, Daemon, Fixture};

const LARGEST: usize = 1_000_000;
const ONE_DIR: usize = 5_000;
const PER_DIR: usize = 200;

/// One daemon binary under test.
struct Contender {
    name: String,
    binary: String,
}

/// A pre-encoded create request for sandbox `id`.
struct Encoded {
    id: String,
    bytes: Vec<u8>,
    mappings: usize,
}

/// Encodes a create of `id`: `/ws` -> `scratch` (writable), then each of
/// `files` (relative to `root`) at `/ws/FILE`, with a prefix per
/// directory on both sides, registered in the request's `q`.
fn encode(id: &str, root: &Path, scratch: &Path, files: &[PathBuf]) -> Encoded {
    encode_at(id, ("ws", 3), root, scratch, files)
}

/// [`encode`] with the workspace named `ws.0` and the directories'
/// prefixes numbered from `ws.1` (prefixes stay registered, so another
/// workspace name needs other numbers).
fn encode_at(
    id: &str,
    ws: (&str, usize),
    root: &Path,
    scratch: &Path,
    files: &[PathBuf],
) -> Encoded {
    let (ws, mut next) = ws;
    let mut m = String::with_capacity(files.len() * 64);
    let mut q = String::new();
    // Prefix 1: "/", 2: the scratch directory.
    write!(q, r#""1":"/","2":"{}""#, scratch.display()).unwrap();
    write!(m, r#"{{"x":1,"p":"{ws}","y":2,"u":"","w":true}}"#).unwrap();
    let mut current: Option<(&Path, usize)> = None;
    for file in files {
        let dir = file.parent().expect("files are in directories");
        let prefix = match current {
            Some((known, prefix)) if known == dir => prefix,
            _ => {
                write!(
                    q,
                    r#","{next}":"/{ws}/{}","{}":"{}""#,
                    dir.display(),
                    next + 1,
                    root.join(dir).display()
                )
                .unwrap();
                current = Some((dir, next));
                next += 2;
                next - 2
            }
        };
        let name = file.file_name().unwrap().to_str().unwrap();
        write!(
            m,
            r#",{{"x":{prefix},"p":"{name}","y":{},"u":"{name}"}}"#,
            prefix + 1
        )
        .unwrap();
    }
    let bytes = format!(r#"{{"C":{{"i":"{id}","m":[{m}],"q":{{{q}}}}}}}"#).into_bytes();
    Encoded {
        id: id.to_owned(),
        bytes,
        mappings: files.len() + 1,
    }
}

/// A fresh daemon of each contender, each on a fixture of its own.
fn start_each(contenders: &[Contender]) -> Vec<(Fixture, Daemon)> {
    contenders
        .iter()
        .map(|c| {
            let fixture = Fixture::new();
            let daemon = fixture.start_command(fixture.command_of(&c.binary, &[]));
            (fixture, daemon)
        })
        .collect()
}

/// Sends `request` and waits for a successful answer; returns the time,
/// and the CPU time the daemon's request threads spent meanwhile.
fn create(daemon: &Daemon, request: &Encoded) -> (Duration, Duration) {
    let pid = daemon.client().pid();
    let cpu = request_threads_cpu(pid);
    let start = Instant::now();
    let answer = daemon
        .client()
        .call_raw(&request.id, &request.bytes)
        .expect("daemon answers");
    let elapsed = start.elapsed();
    let cpu = request_threads_cpu(pid) - cpu;
    assert_eq!(answer.error, None, "create {} failed", request.id);
    (elapsed, cpu)
}

/// CPU time so far of the daemon's threads that read and apply requests
/// (`requests`, `reconfig-N`; not the reaper, which frees destroyed
/// sandboxes meanwhile), from /proc/PID/task/TID/schedstat (ns). Less
/// disturbed than wall time by other work on a shared machine.
fn request_threads_cpu(pid: u32) -> Duration {
    threads_cpu(pid, |comm| {
        comm == "requests" || comm.starts_with("reconfig")
    })
}

/// CPU time so far of the daemon's threads serving FUSE requests.
fn fuse_threads_cpu(pid: u32) -> Duration {
    threads_cpu(pid, |comm| comm.starts_with("fuse"))
}

/// CPU time so far of the daemon's threads whose name `wanted` picks.
fn threads_cpu(pid: u32, wanted: impl Fn(&str) -> bool) -> Duration {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if !wanted(comm.trim()) {
            continue;
        }
        let stat = std::fs::read_to_string(task.join("schedstat")).unwrap_or_default();
        total += stat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Duration::from_nanos(total)
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2
    }
}

/// Field `key` (in KiB) of /proc/PID/status.
fn status_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// What typing at first lookup moves out of the create: each round makes
/// a sandbox of `files` whose workspace has a name of its own (so no
/// destroyed sandbox's kernel cache can be taken over and every stat is a
/// LOOKUP), then stats every input once from the workspace, as an action
/// would; daemons alternate round by round.
fn first_lookups(contenders: &[Contender], root: &Path, scratch: &Path, files: &[PathBuf]) {
    const ROUNDS: usize = 21;
    let running = start_each(contenders);
    let names: Vec<std::ffi::CString> = files
        .iter()
        .map(|f| std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).unwrap())
        .collect();
    let mut creates = vec![Vec::new(); contenders.len()];
    let mut stats = vec![Vec::new(); contenders.len()];
    let mut cpus = vec![Vec::new(); contenders.len()];
    for round in 0..=ROUNDS {
        for (at, (_, daemon)) in running.iter().enumerate() {
            let ws = format!("ws{round}");
            let request = encode_at("lookups", (&ws, 3 + 1000 * round), root, scratch, files);
            let (created, _) = create(daemon, &request);
            let dir = std::fs::File::open(daemon.path(&format!("lookups/{ws}"))).unwrap();
            let pid = daemon.client().pid();
            let cpu = fuse_threads_cpu(pid);
            let start = Instant::now();
            for name in &names {
                stat_at(&dir, name);
            }
            let statted = start.elapsed();
            let cpu = fuse_threads_cpu(pid) - cpu;
            drop(dir);
            daemon.destroy("lookups");
            if round > 0 {
                creates[at].push(created);
                stats[at].push(statted);
                cpus[at].push(cpu);
            }
        }
    }
    println!();
    println!(
        "| daemon | {} inputs in 25 directories: create (ms) | first stat of every input (ms) | per stat (µs) | daemon CPU per LOOKUP (µs) | create + stats (ms) |",
        files.len()
    );
    println!("|---|---|---|---|---|---|");
    let rows = contenders.iter().zip(creates).zip(stats).zip(cpus);
    for (((contender, creates), stats), cpus) in rows {
        let sums: Vec<Duration> = creates.iter().zip(&stats).map(|(c, s)| *c + *s).collect();
        let (create, stat, sum) = (median(creates), median(stats), median(sums));
        let per = |d: Duration| d.as_secs_f64() * 1e6 / files.len() as f64;
        println!(
            "| {} | {:.3} | {:.3} | {:.2} | {:.2} | {:.3} |",
            contender.name,
            create.as_secs_f64() * 1e3,
            stat.as_secs_f64() * 1e3,
            per(stat),
            per(median(cpus)),
            sum.as_secs_f64() * 1e3
        );
    }
}

/// The daemon's own cost of a first lookup, without FUSE (whose round
/// trip, 15-35 µs here depending on which CPUs the threads land on, hides
/// it): the core's `lookup` of every input of a sandbox of `files`, made
/// with inputs typed at create (`create_planned`, as before this work) or
/// untyped (`create_sandbox`, typed by the lookup), alternating.
fn lookups_in_process(root: &Path, files: &[PathBuf]) {
    use actionfs::sandbox::tree::{FsConfig, SandboxFs, ROOT_INO};
    use actionfs_protocol::ResolvedMapping;
    use std::ffi::OsStr;
    const ROUNDS: usize = 21;
    let mount = root.join("no-mount");
    let fs = SandboxFs::new(
        FsConfig {
            mount_point: mount.clone(),
            xattrs: false,
            track_access: false,
        },
        &[],
    )
    .unwrap();
    let mappings: Vec<ResolvedMapping> = files
        .iter()
        .map(|f| ResolvedMapping {
            path: format!("/ws/{}", f.display()),
            underlying: root.join(f),
            writable: false,
        })
        .collect();
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..=ROUNDS {
        for (at, typed) in [true, false].into_iter().enumerate() {
            let id = format!("s{round}-{typed}");
            if typed {
                let plan = actionfs::sandbox::layout::plan(&mappings, &mount, Some(&id)).unwrap();
                fs.create_planned(&id, plan).unwrap();
            } else {
                fs.create_sandbox(&id, &mappings).unwrap();
            }
            let start = Instant::now();
            let mut ino = ROOT_INO;
            for name in [id.as_str(), "ws"] {
                ino = fs.lookup(ino, OsStr::new(name)).unwrap().ino;
            }
            let mut dirs = std::collections::HashMap::new();
            for file in files {
                let dir = file.parent().unwrap();
                let parent = *dirs.entry(dir.to_owned()).or_insert_with(|| {
                    dir.iter()
                        .fold(ino, |at, name| fs.lookup(at, name).unwrap().ino)
                });
                fs.lookup(parent, file.file_name().unwrap()).unwrap();
            }
            if round > 0 {
                times[at].push(start.elapsed());
            }
            fs.destroy_sandbox(&id).unwrap();
        }
    }
    println!();
    println!(
        "| inputs (core only, no FUSE) | typed at create: lookup of every input (ms) | per lookup (µs) | typed by the lookup: (ms) | per lookup (µs) |"
    );
    println!("|---|---|---|---|---|");
    let [typed, lazy] = times.map(median);
    let per = |d: Duration| d.as_secs_f64() * 1e6 / files.len() as f64;
    println!(
        "| {} | {:.3} | {:.2} | {:.3} | {:.2} |",
        files.len(),
        typed.as_secs_f64() * 1e3,
        per(typed),
        lazy.as_secs_f64() * 1e3,
        per(lazy)
    );
}

/// fstatat(dir, name) without following a symlink; panics on failure.
fn stat_at(dir: &std::fs::File, name: &std::ffi::CStr) {
    use std::os::fd::AsRawFd;
    // SAFETY: zeroed stat is valid; valid fd, C string and out pointer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0, "stat {name:?}: {}", std::io::Error::last_os_error());
}

fn reps_for(mappings: usize) -> usize {
    if let Ok(reps) = std::env::var("ACTIONFS_CREATE_REPS") {
        return reps.parse().expect("a count");
    }
    match mappings {
        0..=2_000 => 101,
        2_001..=20_000 => 41,
        20_001..=200_000 => 11,
        _ => 5,
    }
}

/// Lets the daemons (which raise their soft limit to the hard one) hold
/// a descriptor per directory of the largest tree, as a daemon that pins
/// every input's directory at create needs: as root, the hard limit is
/// raised to the kernel's maximum.
fn raise_descriptor_limit() {
    let max: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20);
    let limit = libc::rlimit {
        rlim_cur: max,
        rlim_max: max,
    };
    // SAFETY: setrlimit reads a valid rlimit; failure (not root) is fine.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        eprintln!(
            "cannot raise the descriptor limit: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn main() {
    raise_descriptor_limit();
    let base = tempfile::tempdir_in(bench_dir()).expect("bench dir");
    std::env::set_var("ACTIONFS_TEST_DIR", base.path());
    let sizes = sizes(&[1_000, 10_000, 100_000, LARGEST]);
    let largest = sizes.iter().copied().max().unwrap_or(0).max(ONE_DIR);
    eprintln!("making {largest} input files in {:?}", base.path());
    let tree_root = base.path().join("tree");
    let tree: Vec<PathBuf> = (0..largest)
        .map(|i| {
            let dir = PathBuf::from(format!("p{}/d{}", i / PER_DIR / 100, i / PER_DIR));
            if i % PER_DIR == 0 {
                std::fs::create_dir_all(tree_root.join(&dir)).unwrap();
            }
            let rel = dir.join(format!("f{i}.c"));
            std::fs::File::create(tree_root.join(&rel)).unwrap();
            rel
        })
        .collect();
    let flat_root = base.path().join("flat");
    std::fs::create_dir(&flat_root).unwrap();
    let flat: Vec<PathBuf> = (0..ONE_DIR)
        .map(|i| {
            let rel = PathBuf::from(format!("dir/f{i:05}.c"));
            std::fs::create_dir_all(flat_root.join("dir")).unwrap();
            std::fs::write(flat_root.join(&rel), b"").unwrap();
            rel
        })
        .collect();
    let scratch = base.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();

    let mut contenders = vec![Contender {
        name: "current".to_owned(),
        binary: bin().to_owned(),
    }];
    if let Ok(baseline) = std::env::var("ACTIONFS_BENCH_BASELINE") {
        contenders.push(Contender {
            name: "baseline".to_owned(),
            binary: baseline,
        });
    }

    let mut shapes: Vec<(String, Encoded)> = sizes
        .iter()
        .map(|&n| {
            let request = encode("bench", &tree_root, &scratch, &tree[..n]);
            (format!("tree/{n}"), request)
        })
        .collect();
    shapes.push((
        format!("one_dir/{ONE_DIR}"),
        encode("bench", &flat_root, &scratch, &flat),
    ));

    println!(
        "| shape | mappings | request bytes | daemon | median create (ms) | per mapping (µs) | median CPU (ms) | CPU per mapping (µs) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (shape, request) in &shapes {
        let running = start_each(&contenders);
        let reps = reps_for(request.mappings);
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); contenders.len()];
        let mut cpus: Vec<Vec<Duration>> = vec![Vec::new(); contenders.len()];
        // One untimed round first: page cache, prefixes, pinned directories.
        for round in 0..=reps {
            for (at, (_, daemon)) in running.iter().enumerate() {
                let (took, cpu) = create(daemon, request);
                daemon.destroy(&request.id);
                if round > 0 {
                    times[at].push(took);
                    cpus[at].push(cpu);
                }
            }
        }
        for ((contender, times), cpus) in contenders.iter().zip(times).zip(cpus) {
            let (median, cpu) = (median(times), median(cpus));
            let per = |d: Duration| d.as_secs_f64() * 1e6 / request.mappings as f64;
            println!(
                "| {shape} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} |",
                request.mappings,
                request.bytes.len(),
                contender.name,
                median.as_secs_f64() * 1e3,
                per(median),
                cpu.as_secs_f64() * 1e3,
                per(cpu)
            );
        }
    }

    first_lookups(&contenders, &tree_root, &scratch, &tree[..ONE_DIR]);
    lookups_in_process(&tree_root, &tree[..ONE_DIR]);

    let Some((_, largest)) = shapes
        .iter()
        .filter(|(shape, _)| shape.starts_with("tree/"))
        .max_by_key(|(_, r)| r.mappings)
    else {
        return;
    };
    println!();
    println!(
        "| daemon | mappings | request MiB | RSS before (MiB) | peak RSS, VmHWM (MiB) | RSS after (MiB) |"
    );
    println!("|---|---|---|---|---|---|");
    for contender in &contenders {
        let fixture = Fixture::new();
        let daemon = fixture.start_command(fixture.command_of(&contender.binary, &[]));
        let pid = daemon.client().pid();
        std::thread::sleep(Duration::from_millis(200));
        let before = status_kib(pid, "VmRSS:");
        create(&daemon, largest);
        let peak = status_kib(pid, "VmHWM:");
        std::thread::sleep(Duration::from_millis(500));
        let after = status_kib(pid, "VmRSS:");
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            contender.name,
            largest.mappings,
            largest.bytes.len() as f64 / (1 << 20) as f64,
            before as f64 / 1024.0,
            peak as f64 / 1024.0,
            after as f64 / 1024.0
        );
        daemon.destroy(&largest.id);
    }
}
