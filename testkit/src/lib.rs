//! What actionfs's integration tests, benchmarks and fuzz targets share,
//! kept out of the shipped binary: each test gets its own directory with a
//! mount point, starts the real binary on it, and talks to it with the
//! protocol crate's client. Nothing is mocked.
//!
//! - this file: fixtures, the running daemon, small file-system helpers;
//! - [`tier`]: what a test needs from the machine, and skipping (or, in CI,
//!   failing) where it is missing;
//! - [`traces`]: the recorded Bazel request streams, made replayable;
//! - [`fuzz`]: what the fuzz targets run, replayed by a regression test;
//! - [`bench`]: what the benchmarks read from their environment;
//! - [`serve`]: `actionfs serve`, Bazel's sandbox backend, on a client;
//! - [`backend`]: the harness every serve test file uses on top of it.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod backend;
pub mod bench;
pub mod fuzz;
pub mod serve;
pub mod tier;
pub mod traces;
pub mod xattr;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use actionfs_protocol::{Client, CreateSandbox, Mapping};

/// The daemon binary under test: `$ACTIONFS_BIN`, else the `actionfs` that
/// cargo built next to the running test or benchmark (target/PROFILE/).
pub fn bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("ACTIONFS_BIN") {
            return bin.into_string().expect("ACTIONFS_BIN is UTF-8");
        }
        let exe = std::env::current_exe().expect("the test's own path");
        // target/PROFILE/deps/TEST-HASH -> target/PROFILE/actionfs
        let profile_dir = exe.parent().and_then(Path::parent).expect("target/PROFILE");
        let bin = profile_dir.join("actionfs");
        assert!(
            bin.is_file(),
            "{bin:?} is missing: build it (cargo test and cargo bench do) or set ACTIONFS_BIN"
        );
        bin.into_os_string().into_string().expect("UTF-8 path")
    })
}

/// A scratch directory holding `mnt/` (the mount point), `src/` (read-only
/// inputs) and `scratch/` (a writable directory), plus the daemon's log.
pub struct Fixture {
    pub dir: tempfile::TempDir,
}

impl Default for Fixture {
    fn default() -> Fixture {
        Fixture::new()
    }
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("actionfs-test-")
            .tempdir_in(std::env::var_os("ACTIONFS_TEST_DIR").unwrap_or_else(|| "/tmp".into()))
            .expect("temp dir");
        for sub in ["mnt", "src", "scratch"] {
            fs::create_dir(dir.path().join(sub)).unwrap();
        }
        Fixture { dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn mnt(&self) -> PathBuf {
        self.path("mnt")
    }

    /// Writes `content` to `rel`, creating parents.
    pub fn write(&self, rel: &str, content: &str) -> PathBuf {
        let path = self.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, content).unwrap();
        path
    }

    /// The daemon's command line with `args` before the mount point; its
    /// log goes to `daemon.log` in the fixture. Sandboxes are served by the
    /// FUSE view unless `args` set `--native_below` (the default, auto,
    /// builds sandboxes on tmpfs natively). `$ACTIONFS_TRANSPORT`, if set,
    /// becomes `--transport` unless `args` name one, so that one suite
    /// runs on either transport.
    pub fn command(&self, args: &[&str]) -> Command {
        self.command_of(bin(), args)
    }

    /// `command`, for another build of the daemon (e.g. a baseline binary
    /// a benchmark compares against).
    pub fn command_of(&self, binary: &str, args: &[&str]) -> Command {
        let mut command = Command::new(binary);
        if !args.iter().any(|a| a.starts_with("--native_below")) {
            command.arg("--native_below=0");
        }
        if let Some(transport) = transport() {
            if !args.iter().any(|a| a.starts_with("--transport")) {
                command.arg(format!("--transport={transport}"));
            }
        }
        command
            .args(args)
            .arg(self.mnt())
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let log = fs::File::create(self.path("daemon.log")).unwrap();
        command.stderr(Stdio::from(log));
        command
    }

    /// Starts a daemon and waits until its mount answers.
    pub fn start(&self, args: &[&str]) -> Daemon {
        self.start_command(self.command(args))
    }

    /// `start`, with the daemon logging at `level` (RUST_LOG) to the log.
    pub fn start_logged(&self, args: &[&str], level: &str) -> Daemon {
        let mut command = self.command(args);
        command.env("RUST_LOG", level);
        self.start_command(command)
    }

    /// The daemon with its standard input and output piped to the test,
    /// for tests that write requests and read answers byte by byte.
    pub fn spawn_piped(&self, args: &[&str]) -> std::process::Child {
        self.command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {}: {err}", bin()))
    }

    pub fn start_command(&self, command: Command) -> Daemon {
        let client = Client::start(command)
            .unwrap_or_else(|err| panic!("daemon did not start: {err}\nlog:\n{}", self.log()));
        Daemon {
            client: Some(client),
            mnt: self.mnt(),
        }
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.path("daemon.log")).unwrap_or_default()
    }

    /// The daemon's counters now: sends SIGUSR1 and reads the report it
    /// logs (the daemon must log at warn or finer, as `start` does).
    pub fn stats_now(&self, daemon: &Daemon) -> serde_json::Value {
        signalled_report(daemon.client().pid(), || self.log())
    }

    /// The counters the daemon logged as it exited (needs RUST_LOG=info).
    pub fn stats_at_exit(&self) -> serde_json::Value {
        last_report(&self.log(), "stats at exit: ")
    }
}

/// The transport the suite runs on: `$ACTIONFS_TRANSPORT` (auto,
/// io_uring or classic), else the daemon's default.
pub fn transport() -> Option<String> {
    std::env::var("ACTIONFS_TRANSPORT")
        .ok()
        .filter(|t| !t.is_empty())
}

fn nix_pid(pid: u32) -> libc::pid_t {
    libc::pid_t::try_from(pid).expect("pid fits pid_t")
}

/// Sends SIGUSR1 to `pid` and returns the stats report it then logs to
/// what `log` reads.
fn signalled_report(pid: u32, log: impl Fn() -> String) -> serde_json::Value {
    const MARK: &str = "stats (SIGUSR1): ";
    let before = log().matches(MARK).count();
    // SAFETY: kill with a valid signal number has no memory effects.
    assert_eq!(unsafe { libc::kill(nix_pid(pid), libc::SIGUSR1) }, 0);
    // Waits for the whole line: the log may be read while the daemon is
    // still writing it.
    let complete = |log: &str| {
        log.matches(MARK).count() > before
            && log
                .rsplit_once(MARK)
                .is_some_and(|(_, rest)| rest.contains('\n'))
    };
    assert!(
        wait_for(Duration::from_secs(10), || complete(&log())),
        "no stats report after SIGUSR1:\n{}",
        log()
    );
    last_report(&log(), MARK)
}

/// The JSON after the last `mark` in `log` (one report per line).
fn last_report(log: &str, mark: &str) -> serde_json::Value {
    let (_, rest) = log
        .rsplit_once(mark)
        .unwrap_or_else(|| panic!("no {mark:?} in the log:\n{log}"));
    let line = rest.lines().next().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|err| panic!("bad report {line:?}: {err}"))
}

/// The count of FUSE requests of kind `op` (e.g. "read") in a stats report.
pub fn fuse_requests(stats: &serde_json::Value, op: &str) -> u64 {
    stats["fuse"][op]
        .as_u64()
        .unwrap_or_else(|| panic!("no count for {op:?} in {stats}"))
}

/// A running daemon. Dropping it terminates it and makes sure the mount is
/// gone, so a failing test never leaks a mount.
pub struct Daemon {
    pub client: Option<Client>,
    pub mnt: PathBuf,
}

impl Daemon {
    pub fn client(&self) -> &Client {
        self.client.as_ref().expect("daemon running")
    }

    pub fn create(&self, create: CreateSandbox) {
        self.client()
            .create(&create)
            .unwrap_or_else(|err| panic!("create {:?} failed: {err}", create.id));
    }

    /// Creates and returns the error message the daemon answered with.
    pub fn create_err(&self, create: CreateSandbox) -> String {
        match self.client().create(&create) {
            Err(actionfs_protocol::ClientError::Rejected(message)) => message,
            other => panic!("create {:?} should fail, got {other:?}", create.id),
        }
    }

    pub fn destroy(&self, id: &str) {
        self.client()
            .destroy(id)
            .unwrap_or_else(|err| panic!("destroy {id:?} failed: {err}"));
    }

    /// Bazel's shutdown: close stdin, SIGTERM, wait. Returns the exit
    /// status as a shell shows it: 128 + N after a death by signal N
    /// ([`BY_SIGTERM`] when all went well). A daemon still busy after 5
    /// seconds (a file the test left open) is sent SIGTERM again, which
    /// detaches the mount, and after 5 more a third, which ends it.
    pub fn terminate(mut self) -> i32 {
        shell_status(stop(self.client.take().unwrap()))
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            stop(client);
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.mnt)
                .status();
        }
    }
}

/// The status of a daemon stopped by Bazel's SIGTERM, as a shell shows it.
pub const BY_SIGTERM: i32 = 128 + libc::SIGTERM;

/// An exit status as a shell shows it (128 + N for a death by signal N).
pub fn shell_status(status: std::process::ExitStatus) -> i32 {
    match (status.code(), signal_of(status)) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => -1,
    }
}

/// The signal that ended a process, if one did: unlike [`shell_status`],
/// tells a death by SIGTERM from an exit with status 143.
pub fn signal_of(status: std::process::ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(&status)
}

/// A file's content, read by `cat` so that this process never holds a
/// descriptor inside a mount. A test that needs the mount idle uses it: a
/// process another test thread spawns meanwhile gets a copy of every open
/// descriptor until it execs, and that copy makes the mount busy (seen in
/// lifecycle: an idle stop logged "busy" 5 times in 160 beside a thread
/// spawning `true`, 0 in 160 when read this way).
pub fn read_in_child(path: &Path) -> String {
    let out = Command::new("cat").arg(path).output().unwrap();
    assert!(out.status.success(), "cat {path:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Stops a daemon as Bazel does, forcing it if a busy mount holds it up,
/// so that no test can hang on its daemon.
fn stop(mut client: Client) -> std::process::ExitStatus {
    client.close_input();
    for signal in [libc::SIGTERM, libc::SIGTERM, libc::SIGTERM, libc::SIGKILL] {
        if client.signal(signal).is_err() {
            break;
        }
        if let Ok(Some(status)) = client.wait_timeout(Duration::from_secs(5)) {
            return status;
        }
        eprintln!(
            "daemon {} still busy 5 s after signal {signal}",
            client.pid()
        );
    }
    client.wait().expect("the daemon ends after SIGKILL")
}

/// Runs a command as the unprivileged user 65534 (root ignores permission
/// checks, so tests of them need another user).
pub fn as_nobody<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(args)
        .output()
        .unwrap()
}

/// One line of this process's mount table.
#[derive(Debug)]
pub struct Mount {
    pub point: PathBuf,
    pub fs_type: String,
    /// Comma-separated, as the kernel lists them.
    pub options: String,
}

/// The mount table now, from /proc/self/mounts: the one parser of it every
/// test uses. Fields are as the kernel writes them (a space in a path is
/// `\040`); no test's paths hold one.
pub fn mounts() -> Vec<Mount> {
    fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .filter_map(|line| {
            // source, mount point, type, options, dump, pass
            let mut fields = line.split(' ').skip(1);
            Some(Mount {
                point: fields.next()?.into(),
                fs_type: fields.next()?.to_owned(),
                options: fields.next()?.to_owned(),
            })
        })
        .collect()
}

/// Whether `path` is a mount point.
pub fn is_mounted(path: &Path) -> bool {
    mounts().iter().any(|mount| mount.point == path)
}

/// The mount points at or below `dir`.
pub fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    mounts()
        .into_iter()
        .map(|mount| mount.point)
        .filter(|point| point.starts_with(dir))
        .collect()
}

/// The state letter of a process or thread (`R`, `S`, `T`, `Z`, ...) from
/// its /proc stat file (`/proc/PID/stat`, `/proc/PID/task/TID/stat`):
/// the field after the parenthesised name, which may hold spaces and
/// parentheses itself. `None` if the file cannot be read (it is gone).
pub fn proc_state(stat: &Path) -> Option<char> {
    let text = fs::read_to_string(stat).ok()?;
    let state = text
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    Some(state.unwrap_or_else(|| panic!("{stat:?} has no state field: {text:?}")))
}

/// Waits up to `limit` for `condition`; a bounded wait, not a timing check.
pub fn wait_for(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}

pub fn ro(path: &str, underlying: &Path) -> Mapping {
    mapping(path, underlying, false)
}

pub fn rw(path: &str, underlying: &Path) -> Mapping {
    mapping(path, underlying, true)
}

fn mapping(path: &str, underlying: &Path, writable: bool) -> Mapping {
    Mapping {
        path: path.into(),
        underlying_path: underlying.to_str().unwrap().into(),
        writable,
        ..Mapping::default()
    }
}

pub fn sandbox(id: &str, mappings: Vec<Mapping>) -> CreateSandbox {
    CreateSandbox {
        id: id.into(),
        mappings,
        ..CreateSandbox::default()
    }
}

/// The errno of an io::Error, for asserting on it.
pub fn errno(result: std::io::Result<impl std::fmt::Debug>) -> i32 {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(err) => err
            .raw_os_error()
            .unwrap_or_else(|| panic!("no errno in {err}")),
    }
}

/// Sorted names in a directory.
pub fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("read_dir {dir:?}: {err}"))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A fresh loop-mounted xfs with reflink=1 (for clones, and for faults such
/// as a forced shutdown). Unmounted on drop.
pub struct LoopXfs {
    dir: tempfile::TempDir,
}

impl LoopXfs {
    pub fn new() -> Result<LoopXfs, String> {
        let dir = tempfile::tempdir_in("/var/tmp").map_err(|e| e.to_string())?;
        let image = dir.path().join("xfs.img");
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).map_err(|e| e.to_string())?;
        let run = |cmd: &mut Command| -> Result<(), String> {
            let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{cmd:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        run(Command::new("truncate").args(["-s", "400M"]).arg(&image))?;
        run(Command::new("mkfs.xfs")
            .args(["-q", "-m", "reflink=1"])
            .arg(&image))?;
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mnt))?;
        Ok(LoopXfs { dir })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for LoopXfs {
    /// Unmounts, waiting out a moment of busy (a background thread of the
    /// code under test may still hold a directory there), then detaches it
    /// so that no test leaves a loop mount behind.
    fn drop(&mut self) {
        let unmounted = wait_for(Duration::from_secs(10), || {
            Command::new("umount")
                .arg(self.path())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        if !unmounted {
            let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        }
    }
}
