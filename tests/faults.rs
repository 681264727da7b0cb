//! Fault suite: a FUSE-view sandbox (`--native_below=0`, default open
//! mode unless a test says otherwise) under real processes while the daemon
//! is killed (and restarted on its stale mount), the file system under a
//! writable mapping fills up or fails, the daemon is signalled with a file
//! held open, its input ends mid-request, nobody reads its answers, it runs
//! out of descriptors, and it is loaded with many large sandboxes.
//!
//! Every wait is a bounded poll with a generous deadline, never a timing
//! assertion. Each test owns its daemons and helper processes through
//! guards that kill them and unmount whatever is left at the mount point,
//! so a failing test leaves nothing behind.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use actionfs_testkit::tier::{self, require, Need};
use actionfs_testkit::*;

const PYTHON: &str = "/usr/bin/python3";
/// How long any helper may take to do its next step before the test gives
/// up on it (a hang, not slowness, is what this catches).
const PATIENCE: Duration = Duration::from_secs(60);

/// A helper process with its standard output read line by line on a
/// thread; killed and reaped on drop.
struct Helper {
    child: Reaped,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Helper {
    /// Starts `python3 -c script args...`.
    fn python(script: &str, args: &[&str]) -> Helper {
        let mut child = Command::new(PYTHON)
            .arg("-c")
            .arg(script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("{PYTHON}: {err}"));
        let lines = lines_of(child.stdout.take().unwrap());
        let stdin = child.stdin.take();
        Helper {
            child: Reaped(child),
            stdin,
            lines,
        }
    }

    /// The next line it prints; panics if it prints none in time.
    fn line(&self) -> String {
        self.lines
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("helper {} printed nothing in time", self.child.0.id()))
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }
}

/// The lines `output` carries, read on a thread of their own.
fn lines_of(output: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, lines) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// A process killed and reaped on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Unmounts whatever is still mounted at a path (a stale mount of a killed
/// daemon included) on drop.
struct UnmountOnDrop(PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.0)
                .status();
        }
        if is_mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// Kills a daemon with SIGKILL and reaps it, leaving its mount stale.
/// The caller holds an [`UnmountOnDrop`] for the mount point.
fn kill_9(mut d: Daemon) {
    let mut client = d.client.take().unwrap();
    client.signal(libc::SIGKILL).unwrap();
    client.wait().unwrap();
    // Its Drop would clear the stale mount the restart must recover.
    std::mem::forget(d);
}

/// A 16 KiB chunk that names its own index, so any byte out of place shows.
fn chunk(index: u64) -> Vec<u8> {
    format!("{index:015}\n").repeat(1024).into_bytes()
}
const CHUNK: u64 = 16 * 1024;

/// Writes chunk after chunk to argv[1], fsyncing each and printing how many
/// are acknowledged; on the first error prints `error ERRNO`.
const FSYNCING_WRITER: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
n = 0
try:
    while True:
        data = (b"%015d\n" % n) * 1024
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
        os.fsync(fd)
        n += 1
        print(n, flush=True)
except OSError as e:
    print("error", e.errno, flush=True)
"#;

/// Reads argv[1] whole, again and again, dropping its cached pages after
/// each pass so that every pass asks the daemon; compares each pass with
/// argv[2] (the underlying file) and prints `pass N`, `mismatch N`, or
/// `error ERRNO` on the first error.
const REREADER: &str = r#"
import os, sys
want = open(sys.argv[2], "rb").read()
n = 0
try:
    while True:
        fd = os.open(sys.argv[1], os.O_RDONLY)
        got = b""
        while True:
            block = os.read(fd, 1 << 16)
            if not block:
                break
            got += block
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        n += 1
        print(("pass %d" if got == want else "mismatch %d") % n, flush=True)
except OSError as e:
    print("error", e.errno, flush=True)
"#;

/// The errno in a helper's `error ERRNO` line.
fn error_of(line: &str) -> Option<i32> {
    line.strip_prefix("error ")?.parse().ok()
}

/// After a SIGKILL the kernel ends requests with ENOTCONN (new ones) or
/// ECONNABORTED (those in flight); on the io_uring transport, a request
/// waiting on a ring that is torn down ends with ECANCELED.
fn is_dead_connection(errno: i32) -> bool {
    errno == libc::ENOTCONN || errno == libc::ECONNABORTED || errno == libc::ECANCELED
}

/// The fixture of a test that mounts, with a guard that unmounts whatever
/// is left at its mount point; `None` (the test is skipped) where the
/// machine cannot mount.
fn mounted_fixture() -> Option<(Fixture, UnmountOnDrop)> {
    if !require(&[Need::Mount]) {
        return None;
    }
    let fx = Fixture::new();
    let unmount = UnmountOnDrop(fx.mnt());
    Some((fx, unmount))
}

/// Kills `d` with SIGKILL while `helper` (named `who` in messages) works
/// through its mount, reads the helper's lines while `progress` takes
/// them, and returns the errno of the line that ends them, which must say
/// the connection died.
fn kill_9_under(
    d: Daemon,
    helper: &Helper,
    who: &str,
    mut progress: impl FnMut(&str) -> bool,
) -> i32 {
    kill_9(d);
    let failure = loop {
        let line = helper.line();
        if !progress(&line) {
            break line;
        }
    };
    let errno = error_of(&failure).unwrap_or_else(|| panic!("{who}: {failure}"));
    assert!(
        is_dead_connection(errno),
        "the {who} should see the connection end, not errno {errno}"
    );
    errno
}

/// Starts a daemon again on the stale mount `fx` left by a killed one, and
/// checks that it serves `rel` (a path in sandbox `s`) with `expected`.
fn restart_serves(
    fx: &Fixture,
    args: &[&str],
    mappings: Vec<actionfs_protocol::Mapping>,
    rel: &str,
    expected: &[u8],
) {
    // ENOTCONN; on io_uring, while the dead daemon's rings are torn down,
    // ECONNABORTED or ECANCELED.
    let stale = errno(fs::metadata(fx.mnt()));
    assert!(
        is_dead_connection(stale),
        "the kill should leave a stale mount, not errno {stale}"
    );
    let second = fx.start(args);
    second.create(sandbox("s", mappings));
    let got = fs::read(second.path(rel)).unwrap();
    assert!(
        got == expected,
        "{rel} differs after the restart ({} bytes, want {})",
        got.len(),
        expected.len()
    );
    assert_eq!(second.terminate(), BY_SIGTERM, "{}", fx.log());
    assert!(
        !is_mounted(&fx.mnt()),
        "the stale mount and the live one must both be gone"
    );
}

#[test]
fn kill_9_mid_write_loses_no_fsynced_byte_and_a_restart_recovers_the_mount() {
    kill_9_mid_write(&[]);
}

/// In the opt-in mode where files are opened without asking the daemon
/// (the default now sends an OPEN per open).
#[test]
fn kill_9_mid_write_with_zero_message_opens() {
    kill_9_mid_write(&["--zero_message_opens=on"]);
}

fn kill_9_mid_write(args: &[&str]) {
    let Some((fx, _unmount)) = mounted_fixture() else {
        return;
    };
    let mappings = vec![rw("/ws", &fx.path("scratch"))];
    let d = fx.start(args);
    d.create(sandbox("s", mappings.clone()));
    let target = d.path("s/ws/out");
    // A process inside (as an action still running when the daemon dies)
    // keeps the stale mount busy; the restart must get past that too.
    let _inside = Reaped(
        Command::new("sleep")
            .arg("600")
            .current_dir(d.path("s/ws"))
            .spawn()
            .unwrap(),
    );
    let writer = Helper::python(FSYNCING_WRITER, &[target.to_str().unwrap()]);
    // Mid-write: the writer goes on writing until the connection dies.
    let mut acknowledged = 0;
    while acknowledged < 64 {
        let line = writer.line();
        acknowledged = line
            .parse()
            .unwrap_or_else(|_| panic!("writer: {line}\n{}", fx.log()));
    }
    let errno = kill_9_under(d, &writer, "writer", |line| match line.parse::<u64>() {
        Ok(n) => {
            acknowledged = n;
            true
        }
        Err(_) => false,
    });
    let underlying = fs::read(fx.path("scratch/out")).unwrap();
    eprintln!(
        "{args:?}: {acknowledged} chunks fsynced, then errno {errno}; {} bytes underneath",
        underlying.len()
    );
    assert!(
        underlying.len() as u64 >= acknowledged * CHUNK,
        "{} bytes underneath, {acknowledged} chunks of {CHUNK} were fsynced",
        underlying.len()
    );
    for n in 0..acknowledged {
        let at = (n * CHUNK) as usize;
        assert!(
            underlying[at..at + CHUNK as usize] == chunk(n)[..],
            "fsynced chunk {n} of {acknowledged} is not intact underneath"
        );
    }
    restart_serves(&fx, args, mappings, "s/ws/out", &underlying);
}

#[test]
fn kill_9_mid_read_ends_the_reader_with_an_error_and_a_restart_recovers_the_mount() {
    kill_9_mid_read(&[]);
}

#[test]
fn kill_9_mid_read_with_zero_message_opens() {
    kill_9_mid_read(&["--zero_message_opens=on"]);
}

fn kill_9_mid_read(args: &[&str]) {
    let Some((fx, _unmount)) = mounted_fixture() else {
        return;
    };
    let input = fx.path("src/big");
    let content: Vec<u8> = (0..256).flat_map(chunk).collect(); // 4 MiB
    fs::write(&input, &content).unwrap();
    let mappings = vec![ro("/big", &input)];
    let d = fx.start(args);
    d.create(sandbox("s", mappings.clone()));
    let reader = Helper::python(
        REREADER,
        &[d.path("s/big").to_str().unwrap(), input.to_str().unwrap()],
    );
    let mut passes = 0;
    while passes < 3 {
        let line = reader.line();
        assert!(line.starts_with("pass "), "reader: {line}\n{}", fx.log());
        passes += 1;
    }
    let errno = kill_9_under(d, &reader, "reader", |line| line.starts_with("pass "));
    eprintln!("{args:?}: the reader saw errno {errno} after {passes}+ whole passes");
    restart_serves(&fx, args, mappings, "s/big", &content);
}

/// Mounts a tmpfs of `size` at `path`; unmounted on drop.
struct SmallTmpfs(PathBuf);

impl SmallTmpfs {
    fn mount(path: &Path, size: &str) -> SmallTmpfs {
        fs::create_dir_all(path).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t tmpfs at {path:?}");
        SmallTmpfs(path.to_owned())
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes argv[1] in 48 KiB writes until one fails; prints the bytes the
/// writes returned and then `error ERRNO`. 1 MiB is no multiple of 48 KiB,
/// so the last write that gets anywhere fits only in part.
const FILLER: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
total = 0
try:
    while True:
        total += os.write(fd, b"x" * 49152)
except OSError as e:
    print(total, flush=True)
    print("error", e.errno, flush=True)
"#;

#[test]
fn a_full_writable_mapping_gives_the_writer_enospc_and_the_daemon_keeps_serving() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    let fx = Fixture::new();
    let small = SmallTmpfs::mount(&fx.path("small"), "1m");
    let _unmount = UnmountOnDrop(fx.mnt());
    let input = fx.write("src/in", "input");
    let d = fx.start(&[]);
    d.create(sandbox(
        "s",
        vec![
            rw("/full", &small.0),
            rw("/ws", &fx.path("scratch")),
            ro("/in", &input),
        ],
    ));
    let filler = Helper::python(FILLER, &[d.path("s/full/big").to_str().unwrap()]);
    let written: u64 = filler.line().parse().unwrap();
    let failure = filler.line();
    let mut filler = filler;
    assert!(filler.child.0.wait().unwrap().success());
    assert_eq!(
        error_of(&failure),
        Some(libc::ENOSPC),
        "the writer must see ENOSPC (not EIO): {failure}\n{}",
        fx.log()
    );
    // A write that fits in part returns its short count (POSIX), so the
    // file holds exactly what the writes returned: no byte the writer was
    // told failed is underneath, and none it was told succeeded is missing.
    assert_eq!(
        fs::metadata(small.0.join("big")).unwrap().len(),
        written,
        "the writes returned {written} bytes in all\n{}",
        fx.log()
    );
    assert_ne!(written % 49152, 0, "the last write should have been short");
    // The daemon keeps serving: new requests, lookups, reads and writes
    // elsewhere.
    d.create(sandbox("after", vec![ro("/in", &input)]));
    assert_eq!(fs::read_to_string(d.path("after/in")).unwrap(), "input");
    assert_eq!(fs::read_to_string(d.path("s/in")).unwrap(), "input");
    fs::write(d.path("s/ws/note"), "still writing").unwrap();
    assert_eq!(
        fs::read_to_string(fx.path("scratch/note")).unwrap(),
        "still writing"
    );
    assert_eq!(
        fs::metadata(d.path("s/full/big")).unwrap().len(),
        written,
        "the full file is still served"
    );
    assert_eq!(d.terminate(), BY_SIGTERM, "{}", fx.log());
}

/// Holds argv[1] open; on each line `read` prints what a pread from the
/// start returns (`data ...`) or `error ERRNO`.
const HOLDER: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
print("open", flush=True)
for line in sys.stdin:
    try:
        print("data", os.pread(fd, 100, 0).decode(), flush=True)
    except OSError as e:
        print("error", e.errno, flush=True)
"#;

#[test]
fn sigterm_with_a_file_held_open_keeps_serving_and_retrying_and_a_second_detaches() {
    let Some((fx, _unmount)) = mounted_fixture() else {
        return;
    };
    let input = fx.write("src/in", "held input");
    fx.write("src/other", "other input");
    let mut d = fx.start_logged(&[], "info");
    d.create(sandbox(
        "s",
        vec![
            ro("/in", &input),
            ro("/other", &fx.path("src/other")),
            rw("/ws", &fx.path("scratch")),
        ],
    ));
    let mut holder = Helper::python(HOLDER, &[d.path("s/in").to_str().unwrap()]);
    assert_eq!(holder.line(), "open");
    let mut client = d.client.take().unwrap();
    client.signal(libc::SIGTERM).unwrap();
    // Man page: the unmount fails while busy; the daemon keeps serving and
    // tries again at growing intervals, one log line per attempt (worded
    // as it may be: "trying again", sandboxfs's "will retry").
    let busy_lines = || {
        let log = fx.log().to_lowercase();
        log.matches("trying again").count() + log.matches("will retry").count()
    };
    assert!(
        wait_for(PATIENCE, || busy_lines() >= 3),
        "no repeated retry reports:\n{}",
        fx.log()
    );
    assert!(
        client.wait_timeout(Duration::ZERO).unwrap().is_none(),
        "the first signal must not end a busy daemon:\n{}",
        fx.log()
    );
    assert!(is_mounted(&fx.mnt()));
    holder.send("read");
    assert_eq!(holder.line(), "data held input");
    assert_eq!(
        fs::read_to_string(d.path("s/other")).unwrap(),
        "other input"
    );
    fs::write(d.path("s/ws/late"), "after SIGTERM").unwrap();
    assert_eq!(
        fs::read_to_string(fx.path("scratch/late")).unwrap(),
        "after SIGTERM"
    );
    // A second signal detaches the mount at once; the file still open
    // keeps reading (as after any lazy unmount), and the daemon exits, by
    // the first signal, once it is closed.
    client.signal(libc::SIGINT).unwrap();
    assert!(
        wait_for(PATIENCE, || !is_mounted(&fx.mnt())),
        "the mount must be detached:\n{}",
        fx.log()
    );
    holder.send("read");
    assert_eq!(holder.line(), "data held input", "{}", fx.log());
    assert!(
        client.wait_timeout(Duration::ZERO).unwrap().is_none(),
        "the daemon must serve what is still open:\n{}",
        fx.log()
    );
    drop(holder);
    let status = client
        .wait_timeout(PATIENCE)
        .unwrap()
        .unwrap_or_else(|| panic!("the daemon did not end after the last close:\n{}", fx.log()));
    assert_eq!(signal_of(status), Some(libc::SIGTERM), "{}", fx.log());
}

/// Starts the daemon with piped standard input and output (no client), as
/// a raw stream test needs; killed and its mount cleared on drop.
struct RawDaemon {
    child: Reaped,
    answers: Receiver<String>,
}

impl RawDaemon {
    fn start(fx: &Fixture, args: &[&str]) -> RawDaemon {
        let mut child = fx.spawn_piped(args);
        let answers = lines_of(child.stdout.take().unwrap());
        RawDaemon {
            child: Reaped(child),
            answers,
        }
    }
}

#[test]
fn input_closed_mid_request_answers_every_complete_one_and_the_mount_stays_up() {
    let Some((fx, _unmount)) = mounted_fixture() else {
        return;
    };
    let input = fx.write("src/in", "data");
    let mut d = RawDaemon::start(&fx, &[]);
    let mut stream = String::new();
    let ids: Vec<String> = (0..5).map(|n| format!("s{n}")).collect();
    for id in &ids {
        stream += &format!(
            r#"{{"C":{{"i":"{id}","m":[{{"p":"/in","u":"{}"}}]}}}}"#,
            input.display()
        );
        stream += "\n";
    }
    stream += &format!(
        r#"{{"D":"s4"}}{{"C":{{"i":"cut","m":[{{"p":"/in","u":"{}"#,
        input.display()
    );
    let mut stdin = d.child.0.stdin.take().unwrap();
    stdin.write_all(stream.as_bytes()).unwrap();
    drop(stdin);
    // Five creates and one destroy were complete: each gets a success
    // (s4 two), whatever the cut request gets.
    let successes = |answers: &[String], id: &str| {
        let ok = format!(r#"{{"id":"{id}","error":null}}"#);
        answers.iter().filter(|a| **a == ok).count()
    };
    let want = |id: &str| if id == "s4" { 2 } else { 1 };
    let mut answers: Vec<String> = Vec::new();
    while ids.iter().any(|id| successes(&answers, id) < want(id)) {
        let answer = d
            .answers
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("answers so far: {answers:?}\n{}", fx.log()));
        answers.push(answer);
    }
    for id in &ids {
        assert_eq!(successes(&answers, id), want(id), "{id}: {answers:?}");
    }
    // The mount stays up and serving after the input ended.
    for id in &ids[..4] {
        assert_eq!(
            fs::read_to_string(fx.mnt().join(id).join("in")).unwrap(),
            "data"
        );
    }
    assert!(
        !fx.mnt().join("s4").exists(),
        "the complete destroy was applied"
    );
    assert!(
        !fx.mnt().join("cut").exists(),
        "the cut request was not applied"
    );
    assert!(
        d.child.0.try_wait().unwrap().is_none(),
        "end of input must not end the daemon:\n{}",
        fx.log()
    );
    assert!(is_mounted(&fx.mnt()));
    // SAFETY: kill(2) with our own child's pid and a plain signal.
    unsafe { libc::kill(d.child.0.id() as libc::pid_t, libc::SIGTERM) };
    let mut status = None;
    assert!(
        wait_for(PATIENCE, || {
            status = d.child.0.try_wait().unwrap();
            status.is_some()
        }),
        "SIGTERM did not end the daemon:\n{}",
        fx.log()
    );
    assert_eq!(shell_status(status.unwrap()), BY_SIGTERM, "{}", fx.log());
    assert!(!is_mounted(&fx.mnt()));
}

const SANDBOXES: usize = 200;
const MAPPINGS: usize = 1_000;
const READERS: usize = 4;

#[test]
fn two_hundred_sandboxes_of_a_thousand_mappings_under_four_readers_answer_every_request() {
    let Some((fx, _unmount)) = mounted_fixture() else {
        return;
    };
    for n in 0..MAPPINGS {
        fx.write(&format!("src/d{}/f{n}", n % 10), &format!("input {n}\n"));
    }
    let d = fx.start(&["--reconfig_threads=4"]);
    let (created, to_read) = channel::<usize>();
    let to_read = std::sync::Mutex::new(to_read);
    let mut read_counts = vec![0usize; READERS];
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let (d, to_read) = (&d, &to_read);
                scope.spawn(move || {
                    let mut count = 0;
                    loop {
                        let next = to_read.lock().unwrap().recv();
                        let Ok(s) = next else { break };
                        read_sandbox(&d.path(&format!("s{s}")));
                        count += 1;
                    }
                    count
                })
            })
            .collect();
        for s in 0..SANDBOXES {
            let mappings = (0..MAPPINGS)
                .map(|n| {
                    ro(
                        &format!("/in/d{}/f{n}", n % 10),
                        &fx.path(&format!("src/d{}/f{n}", n % 10)),
                    )
                })
                .collect();
            d.create(sandbox(&format!("s{s}"), mappings));
            created.send(s).unwrap();
        }
        drop(created);
        for (r, reader) in readers.into_iter().enumerate() {
            read_counts[r] = reader.join().expect("a reader failed");
        }
    });
    assert_eq!(
        read_counts.iter().sum::<usize>(),
        SANDBOXES,
        "{read_counts:?}"
    );
    for s in 0..SANDBOXES {
        d.destroy(&format!("s{s}"));
    }
    assert_eq!(names(&d.mnt), ["empty"]);
    assert!(d.client().unexpected_responses().is_empty());
    assert_eq!(d.terminate(), BY_SIGTERM, "{}", fx.log());
}

/// Reads a sandbox from `find | xargs cat` in a separate process and checks
/// every byte: each input holds `input N`, so the sum of N shows a missing,
/// doubled or wrong file.
fn read_sandbox(root: &Path) {
    let out = Command::new("sh")
        .args(["-c", "find in -type f -print0 | xargs -0 cat"])
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{root:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut text = String::new();
    out.stdout.as_slice().read_to_string(&mut text).unwrap();
    let mut seen = vec![false; MAPPINGS];
    for line in text.lines() {
        let n: usize = line
            .strip_prefix("input ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{root:?}: unexpected line {line:?}"));
        assert!(!seen[n], "{root:?}: input {n} read twice");
        seen[n] = true;
    }
    let missing = seen.iter().filter(|s| !**s).count();
    assert_eq!(missing, 0, "{root:?}: {missing} inputs not read");
}

/// Opens argv[2..] (as many as it can, keeping them open), reads each one
/// it opened, and prints one JSON line: how many opened, the errno of each
/// failed open, and the paths whose bytes were not `file N\n`.
const OPEN_ALL: &str = r#"
import json, os, sys
fds, errors, wrong = [], [], []
for n in range(int(sys.argv[2])):
    try:
        fds.append((n, os.open("%s/f%d" % (sys.argv[1], n), os.O_RDONLY)))
    except OSError as e:
        errors.append(e.errno)
for n, fd in fds:
    try:
        if os.pread(fd, 100, 0) != b"file %d\n" % n:
            wrong.append(n)
    except OSError as e:
        errors.append(e.errno)
print(json.dumps({"opened": len(fds), "errors": errors, "wrong": wrong}), flush=True)
"#;

#[test]
fn a_daemon_out_of_descriptors_fails_opens_and_serves_again_once_they_close() {
    out_of_descriptors(&[]);
}

#[test]
fn a_daemon_out_of_descriptors_with_zero_message_opens() {
    out_of_descriptors(&["--zero_message_opens=on"]);
}

/// The daemon with a hard limit of 64 descriptors, and a process that
/// holds 200 files of its sandbox open at once.
fn out_of_descriptors(args: &[&str]) {
    use std::os::unix::process::CommandExt;
    const FILES: usize = 200;
    let Some((fx, _unmount)) = mounted_fixture() else {
        return;
    };
    let mut mappings = Vec::new();
    for n in 0..FILES {
        let input = fx.write(&format!("src/f{n}"), &format!("file {n}\n"));
        mappings.push(ro(&format!("/d/f{n}"), &input));
    }
    let mut command = fx.command(args);
    // SAFETY: setrlimit is async-signal-safe and touches no memory of the
    // parent; a hard limit, so the daemon cannot raise it.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let d = fx.start_command(command);
    d.create(sandbox("s", mappings.clone()));
    let dir = d.path("s/d");
    let opener = Helper::python(OPEN_ALL, &[dir.to_str().unwrap(), &FILES.to_string()]);
    let report: serde_json::Value = serde_json::from_str(&opener.line()).unwrap();
    drop(opener);
    eprintln!(
        "{args:?}: {} of {FILES} opened, {} opens failed",
        report["opened"],
        report["errors"].as_array().unwrap().len()
    );
    assert_eq!(
        report["wrong"],
        serde_json::json!([]),
        "wrong bytes: {report}"
    );
    for errno in report["errors"].as_array().unwrap() {
        assert!(
            [libc::EMFILE, libc::ENFILE].contains(&(errno.as_i64().unwrap() as i32)),
            "an open or read failed other than for want of descriptors: {report}\n{}",
            fx.log()
        );
    }
    // Once they are closed, everything is served again. The helper's
    // files close as it dies, but the kernel sends each RELEASE to the
    // daemon after that: its descriptors come back a moment later (on a
    // loaded machine, after the first read below was refused EMFILE).
    assert!(
        wait_for(PATIENCE, || fs::read_to_string(dir.join("f0")).is_ok()),
        "never served again\n{}",
        fx.log()
    );
    for n in 0..FILES {
        assert_eq!(
            fs::read_to_string(dir.join(format!("f{n}"))).unwrap(),
            format!("file {n}\n")
        );
    }
    d.create(sandbox("again", mappings));
    assert_eq!(
        fs::read_to_string(d.path("again/d/f7")).unwrap(),
        "file 7\n"
    );
    assert_eq!(d.terminate(), BY_SIGTERM, "{}", fx.log());
}

#[test]
fn an_underlying_file_system_that_fails_gives_eio_and_the_rest_keeps_serving() {
    use std::os::unix::fs::FileExt;
    if !require(&[Need::Mount, Need::LoopDevice]) {
        return;
    }
    let xfs = match LoopXfs::new() {
        Ok(xfs) => xfs,
        Err(why) => {
            tier::skip(&format!("no loop-mounted xfs: {why}"));
            return;
        }
    };
    let ws = xfs.path().join("ws");
    fs::create_dir(&ws).unwrap();
    let fx = Fixture::new();
    let _unmount = UnmountOnDrop(fx.mnt());
    let other = fx.write("src/other", "elsewhere");
    let d = fx.start(&[]);
    d.create(sandbox("s", vec![rw("/ws", &ws), ro("/o", &other)]));
    let out = fs::File::create(d.path("s/ws/out")).unwrap();
    out.write_all_at(b"before", 0).unwrap();
    out.sync_all().unwrap();
    // The file system under the writable mapping dies (as on a disk
    // error): every operation on it fails with EIO from now on.
    let status = Command::new("xfs_io")
        .args(["-x", "-c", "shutdown"])
        .arg(xfs.path())
        .status()
        .unwrap();
    assert!(status.success(), "xfs_io shutdown");
    assert_eq!(errno(out.write_all_at(b"after", 6)), libc::EIO);
    assert_eq!(errno(out.sync_all()), libc::EIO);
    assert_eq!(errno(fs::write(d.path("s/ws/new"), "x")), libc::EIO);
    assert_eq!(errno(fs::read_dir(d.path("s/ws"))), libc::EIO);
    drop(out);
    // Everything else is served: the sandbox's other mapping, new
    // sandboxes, and the destroy of the one on the dead file system.
    assert_eq!(fs::read_to_string(d.path("s/o")).unwrap(), "elsewhere");
    d.create(sandbox("t", vec![ro("/o", &other)]));
    assert_eq!(fs::read_to_string(d.path("t/o")).unwrap(), "elsewhere");
    d.destroy("s");
    assert!(!d.path("s").exists());
    assert_eq!(d.terminate(), BY_SIGTERM, "{}", fx.log());
}

/// The `.actionfs-stashes-PID` pools in a native directory.
fn stash_pools(native_dir: &Path) -> Vec<String> {
    let mut pools: Vec<String> = fs::read_dir(native_dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with(".actionfs-stashes-"))
                .collect()
        })
        .unwrap_or_default();
    pools.sort();
    pools
}

#[test]
fn kill_9_in_hybrid_mode_and_a_restart_clears_what_the_killed_daemon_left_in_the_native_dir() {
    let Some((fx, _unmount)) = mounted_fixture() else {
        return;
    };
    let input = fx.write("src/in", "data");
    let native_dir = fx.path("mnt.native");
    let hybrid = ["--native_below=100"];
    let action = |d: &Daemon, id: &str| {
        let ws = fx.path(&format!("scratch/{id}"));
        fs::create_dir_all(&ws).unwrap();
        // Enough inputs to be stashed when destroyed.
        let mut mappings = vec![rw("/ws", &ws)];
        mappings.extend((0..40).map(|n| ro(&format!("/ws/in/{n}"), &input)));
        mappings.push(ro("/ws/in/a", &input));
        d.create(sandbox(id, mappings));
        assert_eq!(
            fs::read_to_string(d.path(&format!("{id}/ws/in/a"))).unwrap(),
            "data"
        );
        fs::write(d.path(&format!("{id}/ws/out")), id).unwrap();
    };
    let d = fx.start(&hybrid);
    let first_pid = d.client().pid();
    for n in 0..4 {
        action(&d, &format!("n{n}"));
    }
    for n in 0..3 {
        d.destroy(&format!("n{n}"));
    }
    let killed_pool = format!(".actionfs-stashes-{first_pid}");
    assert_eq!(
        stash_pools(&native_dir),
        std::slice::from_ref(&killed_pool),
        "destroyed native sandboxes should be stashed in the native directory"
    );
    kill_9(d);

    let second = fx.start(&hybrid);
    action(&second, "n3");
    assert!(
        wait_for(PATIENCE, || !stash_pools(&native_dir)
            .contains(&killed_pool)),
        "the killed daemon's stashes are still in {native_dir:?}: {:?}",
        stash_pools(&native_dir)
    );
    assert_eq!(second.terminate(), BY_SIGTERM, "{}", fx.log());
    assert_eq!(stash_pools(&native_dir), Vec::<String>::new());
}

#[test]
fn answers_nobody_reads_hold_up_requests_but_not_the_mount() {
    const REQUESTS: usize = 5_000;
    let Some((fx, _unmount)) = mounted_fixture() else {
        return;
    };
    let input = fx.write("src/in", "data");
    let mut child = fx.spawn_piped(&[]);
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let pid = child.id();
    let mut child = Reaped(child);
    let writer = std::thread::spawn(move || {
        for n in 0..REQUESTS {
            let request = format!(
                r#"{{"C":{{"i":"a-sandbox-with-a-long-name-{n:05}","m":[{{"p":"/in","u":"{}"}}]}}}}"#,
                input.display()
            );
            if writeln!(stdin, "{request}").is_err() {
                break;
            }
        }
    });
    // Answers pile up unread (a pipe holds about 1,200 of them), so the
    // daemon stops taking requests; the mount keeps serving meanwhile.
    let visible = || fs::read_dir(fx.mnt()).map(|d| d.count()).unwrap_or(0);
    assert!(
        wait_for(PATIENCE, || visible() > 1_000),
        "only {} sandboxes\n{}",
        visible(),
        fx.log()
    );
    for entry in fs::read_dir(fx.mnt()).unwrap().take(100) {
        assert_eq!(
            fs::read_to_string(entry.unwrap().path().join("in")).unwrap(),
            "data"
        );
    }
    assert!(is_mounted(&fx.mnt()));
    // Once read, every request is answered.
    let mut answered = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        assert!(line.ends_with(r#","error":null}"#), "{line}");
        answered += 1;
        if answered == REQUESTS {
            break;
        }
    }
    writer.join().unwrap();
    assert_eq!(visible(), REQUESTS);
    // SAFETY: kill(2) with our own child's pid and a plain signal.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    assert_eq!(shell_status(child.0.wait().unwrap()), BY_SIGTERM);
}

#[test]
fn kill_9_mid_create_leaves_a_stale_mount_and_socket_that_a_restart_takes_over() {
    let Some((fx, _unmount)) = mounted_fixture() else {
        return;
    };
    let input = fx.write("src/in", "data");
    let socket = fx.path("control.sock");
    let control = format!("--control={}", socket.display());
    let d = fx.start(&[&control]);
    // A create large enough to be in progress when the kill comes.
    let mappings = (0..100_000)
        .map(|n| ro(&format!("/d{}/f{n}", n % 50), &input))
        .collect();
    let request = actionfs_protocol::Request::Create(sandbox("big", mappings));
    let bytes = actionfs_protocol::encode_request(&request);
    d.client().write_raw(bytes.as_bytes()).unwrap();
    kill_9(d);
    assert!(socket.exists(), "a killed daemon cannot remove its socket");

    let second = fx.start(&[&control]);
    let ctl = Command::new(bin())
        .args(["ctl", &control, "create", "x", "--map"])
        .arg(format!("ro:/in:{}", input.display()))
        .output()
        .unwrap();
    assert!(
        ctl.status.success(),
        "ctl create through the taken-over socket: {}\n{}",
        String::from_utf8_lossy(&ctl.stderr),
        fx.log()
    );
    assert_eq!(fs::read_to_string(second.path("x/in")).unwrap(), "data");
    assert_eq!(second.terminate(), BY_SIGTERM, "{}", fx.log());
    assert!(!socket.exists(), "the socket is removed at exit");
}

/// The test kit's own cleanup: a loop-mounted file system still busy when
/// its test ends is unmounted once it is free, not left mounted.
#[test]
fn a_loop_file_system_busy_when_its_test_ends_is_still_unmounted() {
    if !require(&[Need::LoopDevice]) {
        return;
    }
    let xfs = match LoopXfs::new() {
        Ok(xfs) => xfs,
        Err(why) => {
            tier::skip(&format!("no loop-mounted xfs: {why}"));
            return;
        }
    };
    let mnt = xfs.path();
    let busy = fs::File::create(mnt.join("held")).unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(busy);
    });
    drop(xfs);
    release.join().unwrap();
    assert!(!is_mounted(&mnt), "{mnt:?} left mounted");
}
