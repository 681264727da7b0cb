//! Zero-message opens (`--zero_message_opens=on`): the kernel opens files
//! without asking the daemon, so a read-only input costs one LOOKUP the
//! first time any sandbox reaches it and nothing after, while reads of a
//! changed file, writes to writable files and destroys stay exact.
//!
//! The request counts come from the daemon's own counters (SIGUSR1).

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;

use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;

const ZERO: &str = "--zero_message_opens=on";

#[test]
fn an_input_read_in_many_sandboxes_costs_no_open_and_one_read() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/header.h", "#define X 1\n");
    let first = fx.write("src/first", "first");
    let d = fx.start(&[ZERO]);
    // The first open of the mount is asked, and answered ENOSYS.
    d.create(sandbox("warm", vec![ro("/first", &first)]));
    let before = fx.stats_now(&d);
    assert_eq!(fs::read_to_string(d.path("warm/first")).unwrap(), "first");
    let after_first = fx.stats_now(&d);
    assert_eq!(
        fuse_requests(&after_first, "open") - fuse_requests(&before, "open"),
        1
    );
    let before = after_first;
    for id in ["a", "b", "c"] {
        d.create(sandbox(id, vec![ro("/ws/header.h", &input)]));
        for _ in 0..3 {
            let text = fs::read_to_string(d.path(&format!("{id}/ws/header.h"))).unwrap();
            assert_eq!(text, "#define X 1\n");
        }
    }
    let after = fx.stats_now(&d);
    let sent = |op: &str| fuse_requests(&after, op) - fuse_requests(&before, op);
    assert_eq!(sent("open"), 0, "OPEN after the kernel learned ENOSYS");
    assert_eq!(sent("release"), 0);
    // One inode for the three sandboxes: its page cache is filled once.
    assert_eq!(sent("read"), 1, "{after}");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn a_replaced_or_rewritten_input_is_read_afresh_by_the_next_sandbox() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/gen.txt", "version 1");
    let d = fx.start(&[ZERO]);
    d.create(sandbox("1", vec![ro("/gen.txt", &input)]));
    assert_eq!(
        fs::read_to_string(d.path("1/gen.txt")).unwrap(),
        "version 1"
    );
    d.destroy("1");

    // Replaced by rename, as build tools write outputs: a new inode.
    let fresh = fx.write("src/gen.tmp", "version 2, longer");
    fs::rename(&fresh, &input).unwrap();
    d.create(sandbox("2", vec![ro("/gen.txt", &input)]));
    assert_eq!(
        fs::read_to_string(d.path("2/gen.txt")).unwrap(),
        "version 2, longer"
    );
    d.destroy("2");

    // Rewritten in place: same inode, new size and mtime.
    let old_mtime = fs::metadata(&input).unwrap().mtime_nsec();
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(&input, "v3").unwrap();
    assert_ne!(fs::metadata(&input).unwrap().mtime_nsec(), old_mtime);
    d.create(sandbox("3", vec![ro("/gen.txt", &input)]));
    assert_eq!(fs::read_to_string(d.path("3/gen.txt")).unwrap(), "v3");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn writable_files_are_read_and_written_through_one_descriptor_per_inode() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let scratch = fx.path("scratch");
    let d = fx.start(&[ZERO]);
    d.create(sandbox("s", vec![rw("/out", &scratch)]));
    let out = d.path("s/out/result.o");

    fs::write(&out, "first").unwrap();
    {
        let mut f = OpenOptions::new().append(true).open(&out).unwrap();
        f.write_all(b" second").unwrap();
    }
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&out)
        .unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(b"FIRST").unwrap();
    f.sync_all().unwrap();
    let mut text = String::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_string(&mut text).unwrap();
    assert_eq!(text, "FIRST second");
    drop(f);
    assert_eq!(
        fs::read_to_string(scratch.join("result.o")).unwrap(),
        "FIRST second"
    );
    // A file deleted while open keeps its data for the open descriptor.
    let mut open = fs::File::open(&out).unwrap();
    fs::remove_file(&out).unwrap();
    assert!(!scratch.join("result.o").exists());
    let mut text = String::new();
    open.read_to_string(&mut text).unwrap();
    assert_eq!(text, "FIRST second");
    drop(open);

    // Descriptors are the daemon's per inode (and direction), not per
    // open or request: ten files written leave ten however often each is
    // opened and written, and forgetting the inodes returns them.
    let descriptors = || {
        let stats = fx.stats_now(&d);
        stats["live"]["inode_descriptors"]
            .as_u64()
            .unwrap_or_else(|| panic!("no inode_descriptors in {stats}"))
    };
    assert!(
        wait_for(std::time::Duration::from_secs(10), || descriptors() == 0),
        "the removed file's descriptors were kept"
    );
    let mut after_first_round = 0;
    for round in 0..3 {
        for i in 0..10 {
            let mut f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(d.path(&format!("s/out/f{i}")))
                .unwrap();
            f.write_all(b"x").unwrap();
            f.sync_all().unwrap();
        }
        let now = descriptors();
        if round == 0 {
            assert!((10..=20).contains(&now), "{now} descriptors for ten inodes");
            after_first_round = now;
        } else {
            assert_eq!(now, after_first_round, "more descriptors in round {round}");
        }
    }
    for i in 0..10 {
        assert_eq!(fs::read(scratch.join(format!("f{i}"))).unwrap(), b"xxx");
        fs::remove_file(d.path(&format!("s/out/f{i}"))).unwrap();
    }
    // Removed and closed: the kernel forgets them (FORGET comes queued).
    assert!(
        wait_for(std::time::Duration::from_secs(10), || descriptors() == 0),
        "{} descriptors kept after the kernel forgot their inodes",
        descriptors()
    );
    d.destroy("s");
    assert_eq!(fs::read_dir(&scratch).unwrap().count(), 0);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn a_destroyed_sandbox_is_gone_at_once_though_its_inputs_stay_cached() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "data");
    let d = fx.start(&[ZERO]);
    d.create(sandbox("s", vec![ro("/ws/in", &input)]));
    assert_eq!(fs::read_to_string(d.path("s/ws/in")).unwrap(), "data");
    d.destroy("s");
    assert_eq!(errno(fs::metadata(d.path("s/ws/in"))), libc::ENOENT);
    assert_eq!(errno(fs::metadata(d.path("s"))), libc::ENOENT);
    assert_eq!(names(&d.mnt), ["empty"]);
    // The same id with other mappings shows only those.
    let other = fx.write("src/other", "other");
    d.create(sandbox("s", vec![ro("/ws/other", &other)]));
    assert_eq!(names(&d.path("s/ws")), ["other"]);
    assert_eq!(errno(fs::metadata(d.path("s/ws/in"))), libc::ENOENT);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn the_kept_cache_of_the_last_destroyed_sandboxes_is_dropped_after_its_age() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "data");
    let d = fx.start(&[ZERO]);
    d.create(sandbox(
        "s",
        vec![ro("/ws/in", &input), rw("/ws/out", &fx.path("scratch"))],
    ));
    assert_eq!(fs::read_to_string(d.path("s/ws/in")).unwrap(), "data");
    fs::write(d.path("s/ws/out/o"), "o").unwrap();
    d.destroy("s");
    // Kept right after the destroy (the next sandbox would use it)...
    let known = |stats: &serde_json::Value| stats["live"]["inodes_known"].as_u64().unwrap();
    let kept = fx.stats_now(&d);
    assert!(known(&kept) > 1, "{kept}");
    assert!(kept["live"]["inode_descriptors"].as_u64().unwrap() >= 1);
    // ...and forgotten, descriptors closed, once no sandbox came for it
    // within the age limit (ten seconds), though nothing else happened.
    assert!(
        wait_for(std::time::Duration::from_secs(20), || {
            let now = fx.stats_now(&d);
            known(&now) == 1 && now["live"]["inode_descriptors"] == 0
        }),
        "{}",
        fx.stats_now(&d)
    );
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn a_new_sandbox_takes_over_a_destroyed_ones_cache_and_sees_every_change() {
    takes_over_and_sees_every_change(&[ZERO]);
}

/// In the default mode too (opens reach the daemon, which checks each
/// file at its open): the kept cache is shorter-lived there.
#[test]
fn with_opens_a_new_sandbox_takes_over_a_destroyed_ones_cache_and_sees_every_change() {
    takes_over_and_sees_every_change(&[]);
}

fn takes_over_and_sees_every_change(flags: &[&str]) {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let inputs: Vec<_> = (0..50)
        .map(|i| fx.write(&format!("src/pkg/f{i:02}.h"), &format!("header {i}")))
        .collect();
    let mappings = |scratch: &str, inputs: &[std::path::PathBuf]| {
        fs::create_dir_all(fx.path(scratch)).unwrap();
        let mut m = vec![rw("/ws", &fx.path(scratch))];
        for input in inputs {
            let name = input.file_name().unwrap().to_str().unwrap();
            m.push(ro(&format!("/ws/pkg/{name}"), input));
        }
        m
    };
    let d = fx.start(flags);
    d.create(sandbox("a", mappings("scratch-a", &inputs)));
    for i in 0..50 {
        assert_eq!(
            fs::read_to_string(d.path(&format!("a/ws/pkg/f{i:02}.h"))).unwrap(),
            format!("header {i}")
        );
    }
    fs::write(d.path("a/ws/out.o"), "a's output").unwrap();
    // a probes for a header it does not have; b will have it.
    assert_eq!(errno(fs::metadata(d.path("a/ws/pkg/new.h"))), libc::ENOENT);
    d.destroy("a");

    // Between the two actions: one input replaced (a new file), one
    // rewritten in place, one no longer mapped, one new.
    let replacement = fx.write("src/pkg/f00.tmp", "replaced");
    fs::rename(&replacement, &inputs[0]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(&inputs[1], "rewritten in place").unwrap();
    let added = fx.write("src/pkg/new.h", "new");
    let mut next: Vec<_> = inputs[..49].to_vec();
    next.push(added);
    let before = fx.stats_now(&d);
    d.create(sandbox("b", mappings("scratch-b", &next)));
    let read = |rel: &str| fs::read_to_string(d.path(&format!("b/ws/pkg/{rel}")));
    assert_eq!(read("f00.h").unwrap(), "replaced");
    assert_eq!(read("f01.h").unwrap(), "rewritten in place");
    for i in 2..49 {
        assert_eq!(read(&format!("f{i:02}.h")).unwrap(), format!("header {i}"));
    }
    assert_eq!(read("new.h").unwrap(), "new");
    assert_eq!(errno(read("f49.h")), libc::ENOENT);
    assert_eq!(errno(fs::metadata(d.path("b/ws/out.o"))), libc::ENOENT);
    assert_eq!(errno(fs::metadata(d.path("a"))), libc::ENOENT);
    assert_eq!(names(&d.path("b/ws")), ["pkg"]);
    let after = fx.stats_now(&d);
    // The unchanged inputs cost nothing: lookups went to the new top, the
    // changed and new names, and the 49th name that is gone (and the
    // listing's entries).
    let lookups = fuse_requests(&after, "lookup") - fuse_requests(&before, "lookup");
    assert!(lookups <= 10, "{lookups} lookups: {after}");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn a_refused_create_leaves_no_cache_behind() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "data");
    fx.write("shown/x", "x");
    let mapping = format!("--mapping=ro:/taken:{}", fx.path("shown").display());
    let d = fx.start(&[ZERO, &mapping]);
    let known = || fx.stats_now(&d)["live"]["inodes_known"].as_u64().unwrap();
    let idle = known();
    d.create(sandbox("a", vec![ro("/ws/in", &input)]));
    assert_eq!(fs::read_to_string(d.path("a/ws/in")).unwrap(), "data");
    d.destroy("a");
    // Same inputs, so it would take over a's cache, but its id hides the
    // --mapping at the top: refused, and a's cache goes with it.
    let refused = d.create_err(sandbox("taken", vec![ro("/ws/in", &input)]));
    assert!(refused.contains("taken"), "{refused}");
    assert!(
        wait_for(std::time::Duration::from_secs(20), || known() <= idle + 1),
        "{}",
        fx.stats_now(&d)
    );
    // Read after: the refusal's invalidations run off its thread, and one
    // landing after this read made the kernel drop the mapping's entries
    // too (or, landing before it, keep them: the count then raced).
    assert_eq!(fs::read_to_string(d.path("taken/x")).unwrap(), "x");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn an_input_changed_in_place_is_read_afresh_with_ttl_zero() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/in", "first version");
    let d = fx.start(&[ZERO, "--ttl=0"]);
    d.create(sandbox("s", vec![ro("/in", &input)]));
    assert_eq!(fs::read_to_string(d.path("s/in")).unwrap(), "first version");
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(&input, "second").unwrap();
    assert_eq!(fs::read_to_string(d.path("s/in")).unwrap(), "second");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn small_scattered_writes_never_read_back_their_page() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let d = fx.start(&[ZERO]);
    d.create(sandbox("s", vec![rw("/out", &fx.path("scratch"))]));
    let before = fx.stats_now(&d);
    // How an assembler writes an object file: small pieces at scattered
    // offsets, looking at the size in between.
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(d.path("s/out/x.o"))
        .unwrap();
    let mut expected = vec![0u8; 400];
    for (offset, len) in [
        (280, 16),
        (64, 58),
        (128, 56),
        (296, 24),
        (0, 64),
        (340, 60),
    ] {
        let piece: Vec<u8> = (0..len).map(|i| (offset + i) as u8 | 1).collect();
        f.seek(SeekFrom::Start(offset as u64)).unwrap();
        f.write_all(&piece).unwrap();
        expected[offset..offset + len].copy_from_slice(&piece);
        f.metadata().unwrap();
    }
    drop(f);
    let after = fx.stats_now(&d);
    assert_eq!(
        fuse_requests(&after, "read") - fuse_requests(&before, "read"),
        0,
        "{after}"
    );
    let written = fs::read(fx.path("scratch/x.o")).unwrap();
    assert_eq!(written.len(), expected.len());
    assert_eq!(written, expected);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn zero_message_opens_are_opt_in_and_turn_passthrough_off_without_a_warning() {
    if !require(&[Need::Mount]) {
        return;
    }
    for (args, zero) in [
        (&[][..], false),
        (&["--zero_message_opens=auto"][..], false),
        (&[ZERO][..], true),
    ] {
        let fx = Fixture::new();
        let input = fx.write("src/in.txt", "in");
        let d = fx.start_logged(args, "info");
        d.create(sandbox("s", vec![ro("/in.txt", &input)]));
        assert_eq!(fs::read_to_string(d.path("s/in.txt")).unwrap(), "in");
        assert_eq!(
            fx.stats_now(&d)["live"]["zero_message_opens"],
            zero,
            "{args:?}"
        );
        assert_eq!(d.terminate(), BY_SIGTERM);
        let log = fx.log();
        assert_eq!(
            log.contains("zero-message opens: no OPEN"),
            zero,
            "{args:?}: {log}"
        );
        if zero {
            assert!(log.contains("FUSE passthrough not used"), "{log}");
        }
        let warned = log
            .lines()
            .any(|line| line.contains("WARN") && line.contains("passthrough"));
        assert!(!warned, "a decision is not a warning:\n{log}");
    }
}
