//! What the mounted view does, checked with real system calls on a real
//! mount served by the real binary.

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use actionfs_testkit::tier::{self, require, Need};
use actionfs_testkit::*;

fn c(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// Sets atime and mtime of `path` (not following symlinks) to `secs`.
fn set_times(path: &Path, secs: i64) -> std::io::Result<()> {
    let t = libc::timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: valid C string and timespec array.
    let ret = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c(path).as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn setxattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let name = CString::new(name).unwrap();
    // SAFETY: valid C strings and buffer.
    let ret = unsafe {
        libc::lsetxattr(
            c(path).as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn getxattr(path: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let name = CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: valid C strings and buffer of buf.len() bytes.
    let ret = unsafe {
        libc::lgetxattr(
            c(path).as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(ret as usize);
    Ok(buf)
}

/// Opens `file` with `options` and writes a byte, returning the first
/// error. With OPEN messages the daemon refuses the open itself; with
/// zero-message opens the kernel opens without asking and the daemon
/// refuses the WRITE (or the SETATTR of O_TRUNC). Either way no byte lands.
fn write_through(file: &Path, options: &OpenOptions) -> std::io::Result<()> {
    let mut f = options.open(file)?;
    f.write_all(b"x")?;
    f.flush()
}

/// Both ways of serving opens, so each test covers the mount as it is run
/// with passthrough (OPEN messages) and without (zero-message opens).
const OPEN_MODES: [&str; 2] = ["--zero_message_opens=off", "--zero_message_opens=on"];

#[test]
fn read_only_mappings_read_back_and_refuse_every_change() {
    if !require(&[Need::Mount]) {
        return;
    }
    for mode in OPEN_MODES {
        read_only_mapping_refusals(mode);
    }
}

fn read_only_mapping_refusals(open_mode: &str) {
    let fx = Fixture::new();
    let input = fx.write("src/in.txt", "input bytes");
    fx.write("src/sandbox/tree/inner.txt", "inner");
    let d = fx.start(&["--xattrs", open_mode]);
    d.create(sandbox(
        "s",
        vec![
            rw("/ws", &fx.path("scratch")),
            ro("/ws/in.txt", &input),
            ro("/ws/tree", &fx.path("src/sandbox/tree")),
        ],
    ));
    let file = d.path("s/ws/in.txt");
    assert_eq!(fs::read_to_string(&file).unwrap(), "input bytes");
    assert_eq!(
        fs::read_to_string(d.path("s/ws/tree/inner.txt")).unwrap(),
        "inner"
    );

    let eperm = libc::EPERM;
    let mut write = OpenOptions::new();
    write.write(true);
    let mut read_write = OpenOptions::new();
    read_write.read(true).write(true);
    let mut append = OpenOptions::new();
    append.append(true);
    let mut truncate = OpenOptions::new();
    truncate.write(true).truncate(true);
    for (what, options) in [
        ("O_WRONLY", &write),
        ("O_RDWR", &read_write),
        ("O_APPEND", &append),
        ("O_TRUNC", &truncate),
    ] {
        assert_eq!(
            errno(write_through(&file, options)),
            eperm,
            "{what} ({open_mode})"
        );
    }
    if open_mode.ends_with("off") {
        // With OPEN messages the refusal comes at open time.
        assert_eq!(errno(write.open(&file)), eperm, "open O_WRONLY");
    } else {
        // Without them the file shows no write bits, so tools that look
        // before they write see a read-only input.
        assert_eq!(fs::metadata(&file).unwrap().mode() & 0o222, 0);
    }
    assert_eq!(
        errno(fs::set_permissions(
            &file,
            fs::Permissions::from_mode(0o777)
        )),
        eperm,
        "chmod"
    );
    assert_eq!(
        errno(std::os::unix::fs::chown(&file, Some(1), Some(1))),
        eperm,
        "chown"
    );
    assert_eq!(errno(set_times(&file, 1000)), eperm, "utimes");
    assert_eq!(errno(fs::remove_file(&file)), eperm, "unlink of a mapping");
    assert_eq!(
        errno(fs::rename(&file, d.path("s/ws/moved.txt"))),
        eperm,
        "rename out"
    );
    assert_eq!(
        errno(fs::hard_link(&file, d.path("s/ws/linked.txt"))),
        eperm,
        "link"
    );
    assert_eq!(errno(setxattr(&file, "user.x", b"1")), eperm, "setxattr");
    // Inside a read-only mapped directory, nothing can be added or removed.
    let inner = d.path("s/ws/tree/inner.txt");
    assert_eq!(
        errno(fs::write(d.path("s/ws/tree/new.txt"), "x")),
        eperm,
        "create"
    );
    assert_eq!(
        errno(fs::create_dir(d.path("s/ws/tree/newdir"))),
        eperm,
        "mkdir"
    );
    assert_eq!(errno(fs::remove_file(&inner)), eperm, "unlink inside");
    assert_eq!(
        errno(fs::rename(
            d.path("s/ws/scratchfile"),
            d.path("s/ws/tree/x")
        )),
        libc::ENOENT
    );
    fs::write(d.path("s/ws/scratchfile"), "w").unwrap();
    assert_eq!(
        errno(fs::rename(
            d.path("s/ws/scratchfile"),
            d.path("s/ws/tree/x")
        )),
        eperm,
        "rename into"
    );
    // Nothing changed underneath.
    assert_eq!(fs::read_to_string(&input).unwrap(), "input bytes");
    assert_eq!(
        fs::read_to_string(fx.path("src/sandbox/tree/inner.txt")).unwrap(),
        "inner"
    );
    assert_eq!(names(&fx.path("src/sandbox/tree")), ["inner.txt"]);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn writable_mapping_passes_every_change_through() {
    if !require(&[Need::Mount]) {
        return;
    }
    for mode in OPEN_MODES {
        writable_mapping_changes(mode);
    }
}

/// What an action creates through the mount has exactly the mode it
/// asked for under its own umask, whatever the daemon's: the daemon keeps
/// the umask it started with (so that what it makes itself follows it)
/// and creates requests' files, directories and FIFOs from threads whose
/// own umask is 0.
#[test]
fn creates_through_the_mount_keep_the_callers_modes_exactly() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let scratch = fx.path("scratch");
    let d = fx.start(&[]);
    d.create(sandbox("s", vec![rw("/ws", &scratch)]));
    let ws = d.path("s/ws");
    // Group-writable: bits the daemon's umask (the test's, 022 or
    // stricter) would strip again.
    let status = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg("umask 002 && mkdir d && : > f && mkfifo p")
        .current_dir(&ws)
        .status()
        .unwrap();
    assert!(status.success(), "{}", fx.log());
    for (name, mode) in [("d", 0o775), ("f", 0o664), ("p", 0o664)] {
        let underlying = fs::symlink_metadata(scratch.join(name)).unwrap().mode() & 0o7777;
        assert_eq!(underlying, mode, "{name}: {underlying:o}");
        let seen = fs::symlink_metadata(ws.join(name)).unwrap().mode() & 0o7777;
        assert_eq!(seen, mode, "{name} through the mount: {seen:o}");
    }
}

fn writable_mapping_changes(open_mode: &str) {
    let fx = Fixture::new();
    let scratch = fx.path("scratch");
    let d = fx.start(&["--xattrs", open_mode]);
    d.create(sandbox("s", vec![rw("/ws", &scratch)]));
    let ws = d.path("s/ws");

    // create + write: bytes are in the underlying file once close returns.
    let mut f = fs::File::create(ws.join("out.txt")).unwrap();
    f.write_all(b"hello world").unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(
        fs::read_to_string(scratch.join("out.txt")).unwrap(),
        "hello world"
    );

    // truncate, through a path and through a handle.
    OpenOptions::new()
        .write(true)
        .open(ws.join("out.txt"))
        .unwrap()
        .set_len(5)
        .unwrap();
    assert_eq!(
        fs::read_to_string(scratch.join("out.txt")).unwrap(),
        "hello"
    );
    fs::write(ws.join("out.txt"), "replaced").unwrap();
    assert_eq!(
        fs::read_to_string(scratch.join("out.txt")).unwrap(),
        "replaced"
    );
    let mut appended = OpenOptions::new()
        .append(true)
        .open(ws.join("out.txt"))
        .unwrap();
    appended.write_all(b"+more").unwrap();
    drop(appended);
    assert_eq!(
        fs::read_to_string(scratch.join("out.txt")).unwrap(),
        "replaced+more"
    );

    // mkdir, nested files, rmdir, unlink.
    fs::create_dir(ws.join("d")).unwrap();
    fs::write(ws.join("d/f"), "f").unwrap();
    assert!(scratch.join("d/f").is_file());
    fs::remove_file(ws.join("d/f")).unwrap();
    fs::remove_dir(ws.join("d")).unwrap();
    assert!(!scratch.join("d").exists());

    // rename within the mapping, keeping the inode.
    fs::create_dir(ws.join("a")).unwrap();
    fs::write(ws.join("a/f"), "moved").unwrap();
    let ino = fs::metadata(ws.join("a/f")).unwrap().ino();
    fs::rename(ws.join("a"), ws.join("b")).unwrap();
    assert_eq!(fs::read_to_string(ws.join("b/f")).unwrap(), "moved");
    assert_eq!(fs::metadata(ws.join("b/f")).unwrap().ino(), ino);
    assert!(scratch.join("b/f").is_file() && !scratch.join("a").exists());

    // symlink and hard link.
    std::os::unix::fs::symlink("b/f", ws.join("sym")).unwrap();
    assert_eq!(
        fs::read_link(scratch.join("sym")).unwrap(),
        Path::new("b/f")
    );
    assert_eq!(fs::read_to_string(ws.join("sym")).unwrap(), "moved");
    fs::hard_link(ws.join("b/f"), ws.join("hard")).unwrap();
    assert_eq!(fs::metadata(scratch.join("hard")).unwrap().nlink(), 2);

    // chmod, chown, utimes, xattrs.
    fs::set_permissions(ws.join("hard"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(
        fs::metadata(scratch.join("hard")).unwrap().mode() & 0o777,
        0o640
    );
    // Giving a file away takes root; as anyone else chown must be refused.
    if tier::is_root() {
        std::os::unix::fs::chown(ws.join("hard"), Some(1), Some(2)).unwrap();
        let meta = fs::metadata(scratch.join("hard")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1, 2));
    } else {
        assert_eq!(
            errno(std::os::unix::fs::chown(ws.join("hard"), Some(1), None)),
            libc::EPERM
        );
    }
    set_times(&ws.join("hard"), 1_000_000).unwrap();
    assert_eq!(
        fs::metadata(scratch.join("hard")).unwrap().mtime(),
        1_000_000
    );
    setxattr(&ws.join("hard"), "user.actionfs", b"yes").unwrap();
    assert_eq!(
        getxattr(&scratch.join("hard"), "user.actionfs").unwrap(),
        b"yes"
    );
    assert_eq!(getxattr(&ws.join("hard"), "user.actionfs").unwrap(), b"yes");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn directories_merge_underlying_entries_with_nested_mappings() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let scratch = fx.path("scratch");
    fx.write("scratch/keep.txt", "from scratch");
    fx.write("scratch/shadowed.txt", "hidden");
    fs::create_dir_all(scratch.join("out/bin")).unwrap();
    let input = fx.write("src/input.txt", "from input");
    let d = fx.start(&[]);
    d.create(sandbox(
        "s",
        vec![
            rw("/ws", &scratch),
            ro("/ws/shadowed.txt", &input),
            ro("/ws/out/bin/gen.txt", &input),
            ro("/ws/in/deep/x.txt", &input),
        ],
    ));
    let ws = d.path("s/ws");
    assert_eq!(names(&ws), ["in", "keep.txt", "out", "shadowed.txt"]);
    assert_eq!(
        fs::read_to_string(ws.join("keep.txt")).unwrap(),
        "from scratch"
    );
    assert_eq!(
        fs::read_to_string(ws.join("shadowed.txt")).unwrap(),
        "from input"
    );
    assert_eq!(
        fs::read_to_string(ws.join("out/bin/gen.txt")).unwrap(),
        "from input"
    );
    // out/bin exists underneath: it merges, so outputs can be written next
    // to mapped inputs and land in the scratch directory.
    fs::write(ws.join("out/bin/result.txt"), "output").unwrap();
    assert_eq!(
        fs::read_to_string(scratch.join("out/bin/result.txt")).unwrap(),
        "output"
    );
    assert_eq!(names(&ws.join("out/bin")), ["gen.txt", "result.txt"]);
    // in/deep does not exist underneath: a read-only virtual directory.
    let meta = fs::metadata(ws.join("in/deep")).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.mode() & 0o777, 0o555);
    assert_eq!(
        errno(fs::write(ws.join("in/deep/new.txt"), "x")),
        libc::EPERM
    );
    assert_eq!(errno(fs::create_dir(ws.join("in/new"))), libc::EPERM);
    // The sandbox directory itself and the mount root are virtual too.
    assert_eq!(errno(fs::create_dir(d.path("s/other"))), libc::EPERM);
    assert_eq!(errno(fs::create_dir(d.path("newtop"))), libc::EPERM);
    assert!(
        !scratch.join("in").exists(),
        "virtual directories must not touch disk"
    );
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn symlinks_are_exposed_as_symlinks_and_never_followed() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    fx.write("src/target.txt", "target");
    std::os::unix::fs::symlink("target.txt", fx.path("src/rel")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", fx.path("src/abs")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/dangling", fx.path("src/dangling")).unwrap();
    let d = fx.start(&[]);
    d.create(sandbox(
        "s",
        vec![
            ro("/rel", &fx.path("src/rel")),
            ro("/abs", &fx.path("src/abs")),
            ro("/dangling", &fx.path("src/dangling")),
            ro("/dir", &fx.path("src")),
        ],
    ));
    for (name, target) in [
        ("rel", "target.txt"),
        ("abs", "/etc/hostname"),
        ("dangling", "/nonexistent/dangling"),
    ] {
        let path = d.path(&format!("s/{name}"));
        assert!(
            fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{name}"
        );
        assert_eq!(fs::read_link(&path).unwrap(), Path::new(target), "{name}");
    }
    // Inside a mapped directory, too.
    assert!(fs::symlink_metadata(d.path("s/dir/rel"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        fs::read_link(d.path("s/dir/rel")).unwrap(),
        Path::new("target.txt")
    );
    // The relative link resolves inside the view, to the view's file.
    assert_eq!(fs::read_to_string(d.path("s/dir/rel")).unwrap(), "target");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn inode_numbers_are_stable_and_distinct() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let a = fx.write("src/a", "a");
    let b = fx.write("src/b", "b");
    let d = fx.start(&["--ttl=0s"]);
    d.create(sandbox(
        "s",
        vec![ro("/a", &a), ro("/b", &b), ro("/dir", &fx.path("src"))],
    ));
    let ino_a = fs::metadata(d.path("s/a")).unwrap().ino();
    let ino_b = fs::metadata(d.path("s/b")).unwrap().ino();
    assert_ne!(ino_a, ino_b);
    for _ in 0..3 {
        assert_eq!(fs::metadata(d.path("s/a")).unwrap().ino(), ino_a);
    }
    let inner = fs::metadata(d.path("s/dir/a")).unwrap().ino();
    assert_eq!(fs::metadata(d.path("s/dir/a")).unwrap().ino(), inner);
    // The same underlying file mapped twice is two nodes.
    assert_ne!(inner, ino_a);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn attributes_come_from_the_underlying_object() {
    if !require(&[Need::Mount]) {
        return;
    }
    for mode in OPEN_MODES {
        attributes_in_open_mode(mode);
    }
}

fn attributes_in_open_mode(open_mode: &str) {
    let fx = Fixture::new();
    let file = fx.write("src/f", "12345");
    fs::set_permissions(&file, fs::Permissions::from_mode(0o751)).unwrap();
    set_times(&file, 123_456_789).unwrap();
    let scratch = fx.write("scratch/w", "w");
    fs::set_permissions(&scratch, fs::Permissions::from_mode(0o664)).unwrap();
    let d = fx.start(&[open_mode]);
    d.create(sandbox(
        "s",
        vec![ro("/f", &file), rw("/rw", &fx.path("scratch"))],
    ));
    let (view, real) = (
        fs::metadata(d.path("s/f")).unwrap(),
        fs::metadata(&file).unwrap(),
    );
    assert_eq!(view.len(), 5);
    // Without OPEN messages a read-only file loses its write bits, the only
    // place the kernel can refuse a write-open on its own.
    let shown_mode = if open_mode.ends_with("on") {
        real.mode() & !0o222
    } else {
        real.mode()
    };
    assert_eq!(view.mode(), shown_mode, "{open_mode}");
    // Writable files show their modes untouched in either way.
    assert_eq!(
        fs::metadata(d.path("s/rw/w")).unwrap().mode(),
        fs::metadata(&scratch).unwrap().mode()
    );
    assert_eq!(view.mtime(), 123_456_789);
    assert_eq!(view.nlink(), real.nlink());
    assert_eq!((view.uid(), view.gid()), (real.uid(), real.gid()));
    // statfs answers for the mount.
    // SAFETY: zeroed statvfs is a valid out-parameter; valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::statvfs(c(&d.path("s/f")).as_ptr(), &mut st) },
        0
    );
    assert!(st.f_blocks > 0 && st.f_bsize > 0);
    assert_eq!(unsafe { libc::statvfs(c(&d.mnt).as_ptr(), &mut st) }, 0);
    assert_eq!(st.f_namemax, 255);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn destroyed_sandbox_is_gone_at_once_and_a_reused_id_shows_new_mappings() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let old = fx.write("src/old", "old");
    let new = fx.write("src/new", "new");
    // A long TTL: without explicit invalidation the kernel would keep
    // showing the destroyed sandbox for a minute.
    let d = fx.start(&["--ttl=60s"]);
    d.create(sandbox("7", vec![ro("/ws/file", &old)]));
    assert_eq!(fs::read_to_string(d.path("7/ws/file")).unwrap(), "old");
    d.destroy("7");
    assert_eq!(errno(fs::metadata(d.path("7"))), libc::ENOENT);
    assert_eq!(errno(fs::metadata(d.path("7/ws/file"))), libc::ENOENT);
    assert_eq!(names(&d.mnt), ["empty"]);
    d.create(sandbox(
        "7",
        vec![ro("/ws/file", &new), ro("/ws/other", &old)],
    ));
    assert_eq!(fs::read_to_string(d.path("7/ws/file")).unwrap(), "new");
    assert_eq!(names(&d.path("7/ws")), ["file", "other"]);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn a_destroyed_sandbox_is_forgotten_even_if_a_process_was_inside_it() {
    if !require(&[Need::Mount]) {
        return;
    }
    for open_mode in OPEN_MODES {
        let fx = Fixture::new();
        let input = fx.write("src/in", "data");
        let d = fx.start(&[open_mode]);
        d.create(sandbox(
            "s",
            vec![ro("/ws/in", &input), rw("/ws/out", &fx.path("scratch"))],
        ));
        // A process sits in the sandbox while it is destroyed: the kernel
        // cannot drop the entries it holds then, and keeps them cached
        // once it leaves unless the daemon sees to it.
        let mut inside = std::process::Command::new("sh")
            .args(["-c", "cat in > out/copy; read _"])
            .current_dir(d.path("s/ws"))
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        assert!(wait_for(std::time::Duration::from_secs(5), || {
            fx.path("scratch/copy").exists()
        }));
        d.destroy("s");
        assert_eq!(errno(fs::metadata(d.path("s"))), libc::ENOENT);
        drop(inside.stdin.take());
        inside.wait().unwrap();
        let known = || fx.stats_now(&d)["live"]["inodes_known"].as_u64().unwrap();
        // The root alone, once the checks after destroy (and, without
        // OPEN messages, the ten seconds a destroyed sandbox is kept for
        // the next one) have passed.
        assert!(
            wait_for(std::time::Duration::from_secs(30), || known() == 1),
            "{open_mode}: {}",
            fx.stats_now(&d)
        );
        assert_eq!(d.terminate(), BY_SIGTERM);
    }
}

#[test]
fn an_absent_name_is_cached_like_a_present_one_and_appears_when_made_through_the_mount() {
    if !require(&[Need::Mount]) {
        return;
    }
    for open_mode in OPEN_MODES {
        let fx = Fixture::new();
        let header = fx.write("src/a.h", "a");
        let d = fx.start(&[open_mode]);
        d.create(sandbox(
            "s",
            vec![rw("/ws", &fx.path("scratch")), ro("/ws/inc/a.h", &header)],
        ));
        let lookups = |d: &Daemon| fuse_requests(&fx.stats_now(d), "lookup");
        // A compiler probing an include directory: the first miss asks
        // the daemon, the next ones do not.
        assert_eq!(errno(fs::metadata(d.path("s/ws/inc/b.h"))), libc::ENOENT);
        let before = lookups(&d);
        for _ in 0..5 {
            assert_eq!(errno(fs::metadata(d.path("s/ws/inc/b.h"))), libc::ENOENT);
        }
        assert_eq!(lookups(&d), before, "{open_mode}: misses were not cached");
        // Made through the mount, the name is there at once.
        assert_eq!(errno(fs::metadata(d.path("s/ws/out.o"))), libc::ENOENT);
        fs::write(d.path("s/ws/out.o"), "o").unwrap();
        assert_eq!(fs::read_to_string(d.path("s/ws/out.o")).unwrap(), "o");
        assert_eq!(errno(fs::metadata(d.path("s/ws/dir"))), libc::ENOENT);
        fs::create_dir(d.path("s/ws/dir")).unwrap();
        assert_eq!(errno(fs::metadata(d.path("s/ws/moved"))), libc::ENOENT);
        fs::rename(d.path("s/ws/out.o"), d.path("s/ws/moved")).unwrap();
        assert_eq!(fs::read_to_string(d.path("s/ws/moved")).unwrap(), "o");
        // At the top, where sandboxes come and go, a miss is not cached.
        assert_eq!(errno(fs::metadata(d.path("t"))), libc::ENOENT);
        d.create(sandbox("t", vec![ro("/a.h", &header)]));
        assert_eq!(fs::read_to_string(d.path("t/a.h")).unwrap(), "a");
        assert_eq!(d.terminate(), BY_SIGTERM);
    }
}

#[test]
fn open_files_keep_working_after_destroy() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "still readable");
    let d = fx.start(&[]);
    d.create(sandbox("s", vec![ro("/in", &input)]));
    let mut open = fs::File::open(d.path("s/in")).unwrap();
    d.destroy("s");
    let mut content = String::new();
    open.read_to_string(&mut content).unwrap();
    assert_eq!(content, "still readable");
    drop(open);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn renames_across_mappings_answer_exdev() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    fs::create_dir(fx.path("scratch/one")).unwrap();
    fs::create_dir(fx.path("scratch/two")).unwrap();
    let d = fx.start(&[]);
    d.create(sandbox(
        "s",
        vec![
            rw("/one", &fx.path("scratch/one")),
            rw("/two", &fx.path("scratch/two")),
        ],
    ));
    fs::write(d.path("s/one/f"), "f").unwrap();
    assert_eq!(
        errno(fs::rename(d.path("s/one/f"), d.path("s/two/f"))),
        libc::EXDEV
    );
    // The writable mapping's root itself is fixed.
    assert_eq!(
        errno(fs::rename(d.path("s/one"), d.path("s/three"))),
        libc::EPERM
    );
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn initial_mappings_from_the_command_line() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    fx.write("src/top.txt", "top");
    let arg_root = format!("--mapping=ro:/:{}", fx.path("src").display());
    let arg_rw = format!("--mapping=rw:/scratch/dir:{}", fx.path("scratch").display());
    let d = fx.start(&[&arg_root, &arg_rw]);
    assert_eq!(names(&d.mnt), ["empty", "scratch", "top.txt"]);
    assert_eq!(fs::read_to_string(d.path("top.txt")).unwrap(), "top");
    fs::write(d.path("scratch/dir/w.txt"), "w").unwrap();
    assert_eq!(fs::read_to_string(fx.path("scratch/w.txt")).unwrap(), "w");
    assert_eq!(errno(fs::write(d.path("new.txt"), "x")), libc::EPERM);
    // A sandbox id cannot hide a mapping of the same name.
    let err = d.create_err(sandbox("scratch", vec![]));
    assert!(err.contains("scratch"), "{err}");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn extended_attributes_are_unsupported_without_the_flag() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let file = fx.write("scratch/f", "f");
    setxattr(&file, "user.present", b"1").unwrap();
    let d = fx.start(&[]);
    d.create(sandbox("s", vec![rw("/ws", &fx.path("scratch"))]));
    assert_eq!(
        errno(getxattr(&d.path("s/ws/f"), "user.present")),
        libc::EOPNOTSUPP
    );
    assert_eq!(
        errno(setxattr(&d.path("s/ws/f"), "user.new", b"1")),
        libc::EOPNOTSUPP
    );
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn made_up_directories_never_follow_an_underlying_symlink() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    fx.write("src/secret.txt", "outside the sandbox");
    let input = fx.write("inputs/x.txt", "x");
    // The scratch directory has a symlink where the view needs a directory
    // for the nested mapping /ws/evil/x.txt.
    std::os::unix::fs::symlink(fx.path("src"), fx.path("scratch/evil")).unwrap();
    let d = fx.start(&[]);
    d.create(sandbox(
        "s",
        vec![rw("/ws", &fx.path("scratch")), ro("/ws/evil/x.txt", &input)],
    ));
    let evil = d.path("s/ws/evil");
    assert!(fs::symlink_metadata(&evil).unwrap().is_dir());
    assert_eq!(names(&evil), ["x.txt"]);
    assert_eq!(errno(fs::metadata(evil.join("secret.txt"))), libc::ENOENT);
    assert_eq!(errno(fs::write(evil.join("planted.txt"), "x")), libc::EPERM);
    assert_eq!(names(&fx.path("src")), ["secret.txt"]);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

fn rename2(from: &Path, to: &Path, flags: u32) -> std::io::Result<()> {
    // SAFETY: valid C strings; AT_FDCWD makes them plain paths.
    let ret = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            c(from).as_ptr(),
            libc::AT_FDCWD,
            c(to).as_ptr(),
            flags,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn rename_flags_exchange_and_noreplace() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let d = fx.start(&["--ttl=0s"]);
    d.create(sandbox("s", vec![rw("/ws", &fx.path("scratch"))]));
    let (x, y) = (d.path("s/ws/x"), d.path("s/ws/sub/y"));
    fs::create_dir(d.path("s/ws/sub")).unwrap();
    fs::write(&x, "x").unwrap();
    fs::write(&y, "y").unwrap();
    let (ino_x, ino_y) = (
        fs::metadata(&x).unwrap().ino(),
        fs::metadata(&y).unwrap().ino(),
    );
    assert_eq!(errno(rename2(&x, &y, libc::RENAME_NOREPLACE)), libc::EEXIST);
    rename2(&x, &y, libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read_to_string(&x).unwrap(), "y");
    assert_eq!(fs::read_to_string(&y).unwrap(), "x");
    // Each file keeps its inode under its new name.
    assert_eq!(fs::metadata(&x).unwrap().ino(), ino_y);
    assert_eq!(fs::metadata(&y).unwrap().ino(), ino_x);
    assert_eq!(fs::read_to_string(fx.path("scratch/sub/y")).unwrap(), "x");
    assert_eq!(d.terminate(), BY_SIGTERM);
}
