//! A sandbox behaves like the files it maps (issues 20 and 24), in the
//! default open mode (every open reaches the daemon, which keeps the file
//! it opened for the handle), in the FUSE view, with the daemon as root:
//! true modes on inputs that still refuse every write, inputs rewritten or
//! replaced underneath read afresh, open files removed underneath still
//! readable, space and descriptors given back, and files held open across
//! a forced unmount.
//!
//! Run with ACTIONFS_BIN=/work/bin/actionfs-before (the code before these
//! fixes) to see each of them fail.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;

const NOBODY: u32 = 65534;

/// Reads a whole file through read(2) alone: no fstat that would refresh
/// the kernel's cached attributes first (as `fs::read` does).
fn read_plain(path: &Path) -> std::io::Result<String> {
    read_rest(&mut File::open(path)?)
}

/// What is left to read of `file`, through read(2) alone.
fn read_rest(file: &mut File) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match file.read(&mut buf)? {
            0 => break,
            n => bytes.extend_from_slice(&buf[..n]),
        }
    }
    Ok(String::from_utf8(bytes).expect("UTF-8 test data"))
}

fn pread(file: &File, len: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; len];
    let n = std::os::unix::fs::FileExt::read_at(file, &mut buf, 0)?;
    buf.truncate(n);
    Ok(String::from_utf8(buf).expect("UTF-8 test data"))
}

/// Runs `script` with sh as the unprivileged user; returns (success,
/// stdout, stderr).
fn sh_as_nobody(script: &str) -> (bool, String, String) {
    let out = as_nobody(&["sh", "-c", script]);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A fixture the unprivileged user can walk into, with an input of theirs
/// (so that only the daemon stands between them and writing it) and an
/// output directory of theirs.
fn fixture_for_nobody() -> (Fixture, std::path::PathBuf, std::path::PathBuf) {
    let fx = Fixture::new();
    fs::set_permissions(fx.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let input = fx.write("src/a.txt", "input\n");
    fs::set_permissions(&input, fs::Permissions::from_mode(0o644)).unwrap();
    let out = fx.path("out");
    fs::create_dir(&out).unwrap();
    for path in [&input, &out] {
        std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    (fx, input, out)
}

#[test]
fn a_copied_input_can_be_changed_and_the_input_cannot() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    let (fx, input, out) = fixture_for_nobody();
    let d = fx.start(&["--allow=other"]);
    d.create(sandbox(
        "s",
        vec![ro("/in/a.txt", &input), rw("/out", &out)],
    ));
    let a = d.path("s/in/a.txt");
    let b = d.path("s/out/b.txt");
    // The input shows its own mode, as a symlink forest or a bind mount do.
    assert_eq!(fs::metadata(&a).unwrap().mode() & 0o777, 0o644);
    // What a genrule does: copy an input (cp keeps its mode), then append.
    let (ok, _, err) = sh_as_nobody(&format!(
        "cp {a} {b} && echo more >> {b}",
        a = a.display(),
        b = b.display()
    ));
    assert!(ok, "cp then append failed: {err}\n{}", fx.log());
    assert_eq!(
        fs::read_to_string(out.join("b.txt")).unwrap(),
        "input\nmore\n"
    );
    assert_eq!(
        fs::metadata(out.join("b.txt")).unwrap().mode() & 0o777,
        0o644
    );
    // The input itself is refused every write, though its mode allows the
    // user: appending, truncating by name and by open, each refused.
    for script in [
        format!("echo more >> {}", a.display()),
        format!("echo new > {}", a.display()),
        format!("truncate -s 0 {}", a.display()),
        format!(
            "/usr/bin/python3 -c 'import os; os.truncate(\"{}\", 0)'",
            a.display()
        ),
    ] {
        let (ok, _, err) = sh_as_nobody(&script);
        assert!(!ok, "{script} was let through");
        assert!(err.contains("not permitted"), "{script}: {err}");
    }
    // Root, whom modes do not stop, is refused too.
    let mut append = OpenOptions::new();
    append.append(true);
    assert_eq!(errno(append.open(&a)), libc::EPERM);
    let path = std::ffi::CString::new(a.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; truncate has no other memory effects.
    assert_eq!(unsafe { libc::truncate(path.as_ptr(), 0) }, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPERM)
    );
    assert_eq!(fs::read_to_string(&input).unwrap(), "input\n");
    assert_eq!(fs::read_to_string(&a).unwrap(), "input\n");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn with_zero_message_opens_inputs_show_no_write_bits_and_refuse_writes() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    // The opt-in mode's documented difference: the kernel opens files
    // without asking, so the mode is where a write-open is refused.
    let (fx, input, out) = fixture_for_nobody();
    let d = fx.start(&["--allow=other", "--zero_message_opens=on"]);
    d.create(sandbox(
        "s",
        vec![ro("/in/a.txt", &input), rw("/out", &out)],
    ));
    let a = d.path("s/in/a.txt");
    assert_eq!(fs::read_to_string(&a).unwrap(), "input\n");
    assert_eq!(fs::metadata(&a).unwrap().mode() & 0o777, 0o444);
    for script in [
        format!("echo more >> {}", a.display()),
        format!(
            "/usr/bin/python3 -c 'import os; os.truncate(\"{}\", 0)'",
            a.display()
        ),
    ] {
        let (ok, _, err) = sh_as_nobody(&script);
        assert!(!ok, "{script} was let through");
        assert!(err.contains("denied"), "{script}: {err}");
    }
    let mut append = OpenOptions::new();
    append.append(true);
    let refused = append
        .open(&a)
        .and_then(|mut f| f.write_all(b"more").and_then(|()| f.sync_all()));
    assert_eq!(errno(refused), libc::EPERM);
    assert_eq!(fs::read_to_string(&input).unwrap(), "input\n");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn an_input_rewritten_in_place_reads_back_whole_with_its_new_size() {
    if !require(&[Need::Mount]) {
        return;
    }
    for flags in [&[][..], &["--passthrough=off"][..]] {
        let fx = Fixture::new();
        let file = fx.write("src/f", "first version\n");
        fx.write("src/d/f", "first version\n");
        let d = fx.start(flags);
        d.create(sandbox(
            "s",
            vec![ro("/f", &file), ro("/d", &fx.path("src/d"))],
        ));
        for (view, under) in [("s/f", "src/f"), ("s/d/f", "src/d/f")] {
            let (view, under) = (d.path(view), fx.path(under));
            let ino = fs::metadata(&under).unwrap().ino();
            assert_eq!(read_plain(&view).unwrap(), "first version\n");
            assert_eq!(fs::metadata(&view).unwrap().len(), 14);
            // Longer, then shorter, then as long with other bytes: each
            // in place, as `echo new > file` does.
            for text in ["new contents, longer than before\n", "short\n", "SHORT\n"] {
                fs::write(&under, text).unwrap();
                assert_eq!(fs::metadata(&under).unwrap().ino(), ino, "in place");
                // The next open shows the new size at once (fstat before
                // any read, which would refresh it by itself)...
                let mut opened = File::open(&view).unwrap();
                let size = opened.metadata().unwrap().len();
                assert_eq!(size, text.len() as u64, "{view:?} {flags:?}");
                // ...and reads the new bytes, all of them.
                let read = read_rest(&mut opened).unwrap();
                assert_eq!(read, text, "{view:?} {flags:?}");
                drop(opened);
                assert_eq!(read_plain(&view).unwrap(), text, "{view:?} {flags:?}");
                assert_eq!(
                    fs::metadata(&view).unwrap().len(),
                    text.len() as u64,
                    "{view:?} {flags:?}"
                );
            }
        }
        assert_eq!(d.terminate(), BY_SIGTERM);
    }
}

#[test]
fn an_open_file_removed_underneath_before_its_first_read_still_reads() {
    if !require(&[Need::Mount]) {
        return;
    }
    for flags in [&[][..], &["--passthrough=off"][..]] {
        let fx = Fixture::new();
        let single = fx.write("src/single", "ORIGINAL single");
        for name in ["f", "g", "sub/h"] {
            fx.write(&format!("src/d/{name}"), &format!("ORIGINAL {name}"));
        }
        let d = fx.start(flags);
        d.create(sandbox(
            "s",
            vec![ro("/single", &single), ro("/d", &fx.path("src/d"))],
        ));
        let open = |rel: &str| File::open(d.path(rel)).unwrap();
        let (single_fd, f, g, h) = (
            open("s/single"),
            open("s/d/f"),
            open("s/d/g"),
            open("s/d/sub/h"),
        );
        // Underneath, before any read: unlinked, renamed, directory gone.
        fs::remove_file(&single).unwrap();
        fs::remove_file(fx.path("src/d/f")).unwrap();
        fs::rename(fx.path("src/d/g"), fx.path("src/d/g2")).unwrap();
        fs::remove_dir_all(fx.path("src/d/sub")).unwrap();
        for (file, text, nlink) in [
            (&single_fd, "ORIGINAL single", 0),
            (&f, "ORIGINAL f", 0),
            (&g, "ORIGINAL g", 1),
            (&h, "ORIGINAL sub/h", 0),
        ] {
            assert_eq!(pread(file, 64).unwrap(), text, "{flags:?}");
            let st = file.metadata().unwrap();
            assert_eq!(st.nlink(), nlink, "{text} {flags:?}");
            assert_eq!(st.len(), text.len() as u64);
        }
        drop((single_fd, f, g, h));
        assert_eq!(d.terminate(), BY_SIGTERM);
    }
}

#[test]
fn a_replaced_input_is_read_as_the_new_file_at_its_next_open() {
    if !require(&[Need::Mount]) {
        return;
    }
    // Right in the opt-in zero-message mode too: the replaced file is a new
    // inode, whose descriptor is opened afresh.
    for (ttl, wait, mode) in [
        ("--ttl=0s", 0, "--zero_message_opens=off"),
        ("--ttl=1s", 2, "--zero_message_opens=off"),
        ("--ttl=0s", 0, "--zero_message_opens=on"),
        ("--ttl=1s", 2, "--zero_message_opens=on"),
    ] {
        let fx = Fixture::new();
        let file = fx.write("src/f", "first version\n");
        fx.write("src/d/f", "first version\n");
        let d = fx.start(&[ttl, mode]);
        d.create(sandbox(
            "s",
            vec![ro("/f", &file), ro("/d", &fx.path("src/d"))],
        ));
        for (view, under) in [("s/f", "src/f"), ("s/d/f", "src/d/f")] {
            let (view, under) = (d.path(view), fx.path(under));
            assert_eq!(read_plain(&view).unwrap(), "first version\n");
            let mut shown = fs::metadata(&view).unwrap().ino();
            let renamed_over = |text: &str| {
                let tmp = under.with_extension("tmp");
                fs::write(&tmp, text).unwrap();
                fs::rename(&tmp, &under).unwrap();
            };
            let recreated = |text: &str| {
                fs::remove_file(&under).unwrap();
                fs::write(&under, text).unwrap();
            };
            for (how, replace) in [
                ("renamed over", &renamed_over as &dyn Fn(&str)),
                ("unlinked and created", &recreated),
            ] {
                let text = format!("replaced: {how}\n");
                // The old file stays open underneath meanwhile, so that the
                // new one cannot get its inode number back (file systems
                // reuse them at once).
                let keep_old = File::open(&under).unwrap();
                replace(&text);
                std::thread::sleep(Duration::from_secs(wait));
                let mut opened = File::open(&view).unwrap();
                let mut read = String::new();
                opened.read_to_string(&mut read).unwrap();
                assert_eq!(read, text, "{view:?} {how} {ttl} {mode}");
                let st = opened.metadata().unwrap();
                assert_eq!(st.nlink(), 1, "{view:?} {how} {ttl} {mode}: the old inode");
                assert_eq!(st.len(), text.len() as u64);
                assert_ne!(
                    st.ino(),
                    shown,
                    "{view:?} {how} {ttl} {mode}: the old inode"
                );
                assert_eq!(
                    fs::metadata(&view).unwrap().ino(),
                    st.ino(),
                    "{view:?} {how} {ttl} {mode}: a stat after the open"
                );
                shown = st.ino();
                drop(keep_old);
            }
        }
        assert_eq!(d.terminate(), BY_SIGTERM);
    }
}

/// A 1 MiB tmpfs, unmounted on drop.
struct SmallTmpfs(std::path::PathBuf);

impl SmallTmpfs {
    fn new(at: std::path::PathBuf) -> SmallTmpfs {
        fs::create_dir_all(&at).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(&at)
            .status()
            .unwrap();
        assert!(status.success(), "mount tmpfs at {at:?}");
        SmallTmpfs(at)
    }

    fn free(&self) -> u64 {
        let path = std::ffi::CString::new(self.0.to_str().unwrap()).unwrap();
        // SAFETY: zeroed statvfs is a valid out-parameter; valid C string.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut st) }, 0);
        st.f_bavail * st.f_frsize
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn the_space_of_a_written_file_deleted_underneath_comes_back() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    let fx = Fixture::new();
    let small = SmallTmpfs::new(fx.path("small"));
    let empty = small.free();
    let d = fx.start(&[]);
    let chunk = vec![7u8; 700 * 1024];
    let next_writer = |name: &str| {
        // The space returns once the daemon closed its descriptor; it is
        // never to be held for good.
        assert!(
            wait_for(Duration::from_secs(10), || small.free() == empty),
            "{} bytes still held",
            empty - small.free()
        );
        let written = fs::write(small.0.join(name), &chunk);
        assert!(written.is_ok(), "next writer: {written:?}");
        fs::remove_file(small.0.join(name)).unwrap();
    };
    // Written through the mount, closed, deleted underneath.
    d.create(sandbox("s", vec![rw("/out", &small.0)]));
    fs::write(d.path("s/out/big"), &chunk).unwrap();
    fs::remove_file(small.0.join("big")).unwrap();
    next_writer("next");
    // The same, deleted after the sandbox is destroyed.
    fs::write(d.path("s/out/big"), &chunk).unwrap();
    assert_eq!(fs::read(d.path("s/out/big")).unwrap().len(), chunk.len());
    d.destroy("s");
    fs::remove_file(small.0.join("big")).unwrap();
    next_writer("after-destroy");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

fn descriptors(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// What each descriptor of `pid` refers to, for a failure to show.
fn descriptor_targets(pid: u32) -> Vec<PathBuf> {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|entry| fs::read_link(entry.ok()?.path()).ok())
        .collect()
}

fn rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn descriptors_and_memory_come_back_after_destroys() {
    if !require(&[Need::Mount]) {
        return;
    }
    const SANDBOXES: usize = 20;
    const MAPPINGS: usize = 300;
    let fx = Fixture::new();
    // Inputs in directories of their own, as a build's are: each mapped
    // directory is a descriptor the daemon pins while a sandbox uses it.
    let inputs: Vec<_> = (0..MAPPINGS)
        .map(|i| fx.write(&format!("src/p{i}/f.h"), &format!("header {i}")))
        .collect();
    let d = fx.start(&[]);
    let pid = d.client().pid();
    let start = descriptors(pid);
    let mut after_first = 0;
    for cycle in 1..=10 {
        for s in 0..SANDBOXES {
            let mappings = inputs
                .iter()
                .enumerate()
                .map(|(i, input)| ro(&format!("/ws/p{i}/f.h"), input))
                .collect();
            d.create(sandbox(&format!("s{s}"), mappings));
            for i in 0..MAPPINGS {
                let text = read_plain(&d.path(&format!("s{s}/ws/p{i}/f.h"))).unwrap();
                assert_eq!(text, format!("header {i}"));
            }
        }
        assert!(
            descriptors(pid) > start,
            "the mapped directories are pinned"
        );
        for s in 0..SANDBOXES {
            d.destroy(&format!("s{s}"));
        }
        // An entry in use when its sandbox went (a close still on its way
        // to the daemon, on a loaded machine) keeps its node until the
        // daemon's re-checks (departure.rs: 1 s, then 2 s, 4 s) make the
        // kernel drop it: wait past three of them.
        assert!(
            wait_for(Duration::from_secs(10), || descriptors(pid) == start),
            "cycle {cycle}: {} descriptors held, {start} at start: {:?}",
            descriptors(pid),
            descriptor_targets(pid)
        );
        if cycle == 1 {
            after_first = rss_kib(pid);
        }
    }
    let bound = after_first + after_first / 10;
    assert!(
        wait_for(Duration::from_secs(5), || rss_kib(pid) <= bound),
        "RSS {} KiB after the tenth cycle, {after_first} KiB after the first",
        rss_kib(pid)
    );
    assert_eq!(d.terminate(), BY_SIGTERM);
}

/// fuser gives each FUSE thread a zeroed 16 MiB read buffer, of which a
/// request touches a few pages; mimalloc zeroed reused memory by writing
/// all of it, so an idle daemon held 16 MiB per thread (and its start
/// cost that much `memset`). Mapped fresh, untouched pages cost nothing.
#[test]
fn an_idle_daemon_does_not_hold_its_fuse_read_buffers_in_memory() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/f.h", "header");
    let d = fx.start(&[]);
    d.create(sandbox("s", vec![ro("/ws/f.h", &input)]));
    // Every FUSE thread has served by now or waits in its read.
    for _ in 0..20 {
        assert_eq!(read_plain(&d.path("s/ws/f.h")).unwrap(), "header");
    }
    let threads = fs::read_dir(format!("/proc/{}/task", d.client().pid()))
        .unwrap()
        .count();
    let rss = rss_kib(d.client().pid());
    assert!(
        rss < 32 * 1024,
        "RSS {rss} KiB with {threads} threads: read buffers are held in memory"
    );
    d.destroy("s");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

/// Sends `signal` to the daemon.
fn signal(d: &Daemon, signal: i32) {
    d.client().signal(signal).unwrap();
}

#[test]
fn after_a_forced_unmount_files_held_open_keep_reading_until_closed() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "still here");
    let mut d = fx.start(&[]);
    d.create(sandbox("s", vec![ro("/in", &input)]));
    let held = File::open(d.path("s/in")).unwrap();
    signal(&d, libc::SIGTERM);
    assert!(
        wait_for(Duration::from_secs(10), || fx.log().contains("is busy")),
        "{}",
        fx.log()
    );
    signal(&d, libc::SIGTERM);
    // Detached at once: the mount point is free...
    assert!(
        wait_for(Duration::from_secs(10), || !is_mounted(&d.mnt)),
        "{}",
        fx.log()
    );
    // ...and what was open keeps working, however long it stays open
    // (the code before gave up after five seconds).
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(pread(&held, 64).unwrap(), "still here", "{}", fx.log());
    assert_eq!(held.metadata().unwrap().len(), 10);
    let mut client = d.client.take().unwrap();
    assert!(
        client.wait_timeout(Duration::ZERO).unwrap().is_none(),
        "exited"
    );
    // The daemon ends with the last close, by the first signal.
    drop(held);
    let status = client.wait_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(status.map(shell_status), Some(BY_SIGTERM), "{}", fx.log());
}

#[test]
fn a_third_signal_ends_the_daemon_and_what_is_open_then_fails() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "data");
    let unread = fx.write("src/unread", "unread");
    // Without passthrough and with nothing cached, every read needs the
    // daemon (the kernel still serves cached pages and passthrough files
    // itself once it is gone).
    let mut d = fx.start(&["--passthrough=off"]);
    d.create(sandbox(
        "s",
        vec![ro("/in", &input), ro("/unread", &unread)],
    ));
    let held = File::open(d.path("s/in")).unwrap();
    let never_read = File::open(d.path("s/unread")).unwrap();
    signal(&d, libc::SIGTERM);
    assert!(wait_for(Duration::from_secs(10), || fx
        .log()
        .contains("is busy")));
    signal(&d, libc::SIGTERM);
    assert!(wait_for(Duration::from_secs(10), || !is_mounted(&d.mnt)));
    assert_eq!(pread(&held, 64).unwrap(), "data");
    signal(&d, libc::SIGTERM);
    let mut client = d.client.take().unwrap();
    let status = client.wait_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(status.map(shell_status), Some(BY_SIGTERM), "{}", fx.log());
    // ENOTCONN on /dev/fuse; on io_uring the connection is aborted with
    // its rings (ECONNABORTED), as the man page says.
    let after = errno(pread(&never_read, 64));
    assert!(
        after == libc::ENOTCONN || after == libc::ECONNABORTED,
        "errno {after}"
    );
}

/// `len` bytes of `fill`, with a line break every 64 bytes.
fn large_text(fill: char, len: usize) -> String {
    (0..len)
        .map(|i| if i % 64 == 63 { '\n' } else { fill })
        .collect()
}

#[test]
fn large_inputs_served_by_passthrough_behave_as_the_files_they_map() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    // Inputs of 64 KiB or more are read by the kernel itself as root
    // (passthrough); smaller ones from the page cache, which the tests
    // above cover. The same cases, on the passthrough path.
    const SIZE: usize = 200 * 1024;
    let fx = Fixture::new();
    let rewritten = fx.write("src/rewritten", &large_text('a', SIZE));
    let replaced = fx.write("src/replaced", &large_text('b', SIZE));
    let removed = fx.write("src/removed", &large_text('c', SIZE));
    let d = fx.start_logged(&["--zero_message_opens=off", "--ttl=60s"], "debug");
    d.create(sandbox(
        "s",
        vec![
            ro("/rewritten", &rewritten),
            ro("/replaced", &replaced),
            ro("/removed", &removed),
        ],
    ));
    for name in ["rewritten", "replaced", "removed"] {
        assert_eq!(
            read_plain(&d.path(&format!("s/{name}"))).unwrap().len(),
            SIZE
        );
    }

    // Rewritten in place, shorter: the next open reads the new bytes and
    // shows the new size.
    let shorter = large_text('A', SIZE / 2 + 100);
    fs::write(&rewritten, &shorter).unwrap();
    let mut opened = File::open(d.path("s/rewritten")).unwrap();
    assert_eq!(opened.metadata().unwrap().len(), shorter.len() as u64);
    assert_eq!(read_rest(&mut opened).unwrap(), shorter);
    drop(opened);

    // Replaced by a rename over it (the old file kept open underneath, so
    // that its inode number is not reused at once): the new file.
    let keep_old = File::open(&replaced).unwrap();
    let new_text = large_text('B', SIZE + 4096);
    let tmp = fx.path("src/replaced.tmp");
    fs::write(&tmp, &new_text).unwrap();
    fs::rename(&tmp, &replaced).unwrap();
    let mut opened = File::open(d.path("s/replaced")).unwrap();
    assert_eq!(read_rest(&mut opened).unwrap(), new_text);
    assert_eq!(opened.metadata().unwrap().nlink(), 1);
    drop((opened, keep_old));

    // Open, then removed underneath before its first read: still the
    // original bytes, with no link left.
    let held = File::open(d.path("s/removed")).unwrap();
    fs::remove_file(&removed).unwrap();
    let mut first = vec![0u8; 64];
    std::os::unix::fs::FileExt::read_exact_at(&held, &mut first, 0).unwrap();
    assert_eq!(first, large_text('c', 64).into_bytes());
    assert_eq!(held.metadata().unwrap().nlink(), 0);
    assert_eq!(held.metadata().unwrap().len(), SIZE as u64);
    drop(held);

    assert_eq!(d.terminate(), BY_SIGTERM);
    // The data went by passthrough: no READ reached the daemon.
    let stats = fx.stats_at_exit();
    assert!(fuse_requests(&stats, "open") >= 6, "{stats}");
    assert_eq!(fuse_requests(&stats, "read"), 0, "{stats}");
}
