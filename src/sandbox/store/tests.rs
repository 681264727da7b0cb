//! The store on real files in temporary directories (ext4 or tmpfs here:
//! the copy path; tests/store.rs covers reflinks on a loop-mounted xfs).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use super::*;

fn hash(bytes: &[u8]) -> String {
    Digest::of(bytes).hex()
}

fn open(max_bytes: u64) -> (tempfile::TempDir, ContentStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = ContentStore::open(&dir.path().join("store"), max_bytes).unwrap();
    (dir, store)
}

/// Sorted names in a directory.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn content(store: &ContentStore, h: &str) -> PathBuf {
    store.path().join("c").join(h)
}

/// Nothing but `expected` in c/, and nothing in x/ or tmp/.
fn assert_holds(store: &ContentStore, expected: &[&str]) {
    let mut expected: Vec<String> = expected.iter().map(|h| h.to_string()).collect();
    expected.sort();
    assert_eq!(names(&store.path().join("c")), expected);
    assert_eq!(names(&store.path().join("tmp")), Vec::<String>::new());
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().mode() & 0o7777
}

fn missing(err: AcquireError) -> Vec<String> {
    match err {
        AcquireError::Missing(missing) => missing.hashes,
        AcquireError::Store(err) => panic!("not a Missing: {err}"),
    }
}

#[test]
fn directory_blobs_are_kept_and_a_bad_hash_refused() {
    let (_dir, store) = open(1 << 20);
    let blob = b"\x0a\x05hello".to_vec();
    let h = hash(&blob);
    let err = store.put_directory(&h, b"other".to_vec()).unwrap_err();
    assert!(matches!(err, StoreError::Mismatch { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&h) && text.contains(&hash(b"other")),
        "{text}"
    );
    assert_eq!(store.directory(&h), None);
    assert_eq!(store.usage().entries, 0);

    store.put_directory(&h, blob.clone()).unwrap();
    store.put_directory(&h, blob.clone()).unwrap();
    assert_eq!(store.directory(&h).as_deref(), Some(&blob[..]));
    assert_eq!(
        store.usage(),
        Usage {
            entries: 1,
            bytes: blob.len() as u64,
            pinned: 0
        }
    );
    // Directories and content are apart: no file, and no content entry.
    assert!(!store.contains(&h));
    assert_holds(&store, &[]);
}

#[test]
fn an_empty_directory_and_an_empty_file_share_a_digest_not_an_entry() {
    let (_dir, store) = open(1 << 20);
    let h = hash(b"");
    store.put_directory(&h, Vec::new()).unwrap();
    assert!(!store.contains(&h));
    store.put_bytes(&h, b"", Retention::Keep).unwrap();
    assert!(store.contains(&h));
    assert_eq!(store.directory(&h).as_deref(), Some(&[][..]));
    assert_eq!(store.usage().entries, 2);
}

#[test]
fn put_bytes_with_a_bad_hash_is_refused_and_leaves_nothing() {
    let (_dir, store) = open(1 << 20);
    let h = hash(b"right");
    let err = store.put_bytes(&h, b"wrong", Retention::Keep).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("put of {h}: the bytes hash to {}", hash(b"wrong"))
    );
    assert_holds(&store, &[]);
    assert!(!store.contains(&h));
    assert_eq!(store.usage().entries, 0);
}

#[test]
fn put_bytes_stores_a_read_only_file() {
    let (_dir, store) = open(1 << 20);
    let h = hash(b"data");
    store.put_bytes(&h, b"data", Retention::Keep).unwrap();
    store.put_bytes(&h, b"data", Retention::Keep).unwrap();
    assert_holds(&store, &[&h]);
    assert_eq!(fs::read(content(&store, &h)).unwrap(), b"data");
    assert_eq!(mode(&content(&store, &h)), 0o444);
    assert_eq!(
        store.usage(),
        Usage {
            entries: 1,
            bytes: 4,
            pinned: 0
        }
    );
}

#[test]
fn capture_is_a_snapshot_that_later_writes_to_the_source_do_not_change() {
    let (dir, store) = open(1 << 30);
    let source = dir.path().join("input");
    let bytes: Vec<u8> = (0..3 * digest::CHUNK + 5)
        .map(|i| (i % 251) as u8)
        .collect();
    fs::write(&source, &bytes).unwrap();
    let h = hash(&bytes);
    store.capture(&h, &source, Retention::Keep).unwrap();
    let stored = content(&store, &h);
    assert_ne!(
        fs::metadata(&stored).unwrap().ino(),
        fs::metadata(&source).unwrap().ino(),
        "a hard link is no snapshot"
    );
    // Rewritten in place (the same inode) and then replaced.
    fs::OpenOptions::new()
        .write(true)
        .open(&source)
        .unwrap()
        .write_all(b"changed")
        .unwrap();
    assert_eq!(fs::read(&stored).unwrap(), bytes);
    fs::write(&source, b"replaced").unwrap();
    assert_eq!(fs::read(&stored).unwrap(), bytes);
    assert_eq!(mode(&stored), 0o444);
    assert_eq!(store.usage().bytes, bytes.len() as u64);
    // Held already: not read again (the source now hashes otherwise).
    store.capture(&h, &source, Retention::Keep).unwrap();
    assert_holds(&store, &[&h]);
}

#[test]
fn capture_with_mismatching_content_is_refused_and_leaves_nothing() {
    let (dir, store) = open(1 << 20);
    let source = dir.path().join("input");
    fs::write(&source, b"actual").unwrap();
    let h = hash(b"expected");
    let err = store.capture(&h, &source, Retention::Keep).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "capture of {h}: {} hashes to {}",
            source.display(),
            hash(b"actual")
        )
    );
    assert_holds(&store, &[]);
    assert!(!store.contains(&h));
}

#[test]
fn capture_of_an_absent_source_names_digest_call_and_path() {
    let (dir, store) = open(1 << 20);
    let source = dir.path().join("absent");
    let h = hash(b"x");
    let err = store.capture(&h, &source, Retention::Keep).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "capture of {h}: open {}: No such file or directory",
            source.display()
        )
    );
}

#[test]
fn capture_follows_a_symlink_and_refuses_what_is_not_a_regular_file() {
    let (dir, store) = open(1 << 20);
    let target = dir.path().join("target");
    fs::write(&target, b"runfile").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let h = hash(b"runfile");
    store.capture(&h, &link, Retention::Keep).unwrap();
    assert_eq!(fs::read(content(&store, &h)).unwrap(), b"runfile");
    assert!(fs::symlink_metadata(content(&store, &h))
        .unwrap()
        .file_type()
        .is_file());

    let sub = dir.path().join("sub");
    fs::create_dir(&sub).unwrap();
    let dir_link = dir.path().join("dir-link");
    std::os::unix::fs::symlink(&sub, &dir_link).unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
    let other = hash(b"other");
    for (path, kind) in [
        (&sub, FileKind::Directory),
        (&dir_link, FileKind::Directory),
        // Refused without blocking on the open.
        (&fifo, FileKind::NamedPipe),
    ] {
        match store.capture(&other, path, Retention::Keep).unwrap_err() {
            StoreError::NotRegularFile {
                kind: got, path: p, ..
            } => {
                assert_eq!((got, &p), (kind, path))
            }
            err => panic!("{err}"),
        }
    }
    let err = store.capture(&other, &sub, Retention::Keep).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "capture of {other}: {} is a directory, not a regular file",
            sub.display()
        )
    );
    assert_holds(&store, &[&h]);
}

#[test]
fn keys_that_are_not_sha256_hex_are_refused() {
    let (dir, store) = open(1 << 20);
    let source = dir.path().join("input");
    fs::write(&source, b"x").unwrap();
    let good = hash(b"x");
    for key in [
        "../etc/passwd",
        "",
        &good[..63],
        &format!("{good}0"),
        &good.to_uppercase(),
        &format!("../{}", &good[3..]),
    ] {
        let refused = |err: StoreError| matches!(err, StoreError::BadDigest { .. });
        assert!(refused(
            store.put_bytes(key, b"x", Retention::Keep).unwrap_err()
        ));
        assert!(refused(
            store.capture(key, &source, Retention::Keep).unwrap_err()
        ));
        assert!(refused(
            store.put_directory(key, b"x".to_vec()).unwrap_err()
        ));
        assert!(matches!(
            store.acquire("s", &[(key, false)]).unwrap_err(),
            AcquireError::Store(StoreError::BadDigest { .. })
        ));
        assert_eq!(store.directory(key), None);
        assert!(!store.contains(key));
    }
    let err = store
        .put_bytes("../etc/passwd", b"x", Retention::Keep)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "not a SHA-256 digest (64 lowercase hex digits): \"../etc/passwd\""
    );
    assert_holds(&store, &[]);
    assert_eq!(names(dir.path()), ["input", "store"]);
    assert_eq!(store.usage().entries, 0);
}

/// After the first variant (a clone, or a copy where the store's file
/// system cannot clone, which later variants then copy at once), each is
/// still its digest's bytes with mode 0555, and no temporary is left.
#[test]
fn each_executable_variant_holds_its_bytes_after_the_first() {
    let (_dir, store) = open(1 << 20);
    let contents: [&[u8]; 3] = [b"#!/bin/sh\necho a\n", b"#!/bin/sh\necho bb\n", b"\x7fELF"];
    let hashes: Vec<String> = contents.iter().map(|c| hash(c)).collect();
    for (h, c) in hashes.iter().zip(contents) {
        store.put_bytes(h, c, Retention::Keep).unwrap();
    }
    for (n, (h, c)) in hashes.iter().zip(contents).enumerate() {
        let paths = store.acquire(&format!("s{n}"), &[(h, true)]).unwrap();
        assert_eq!(paths, [store.path().join("x").join(h)]);
        assert_eq!(fs::read(&paths[0]).unwrap(), c);
        assert_eq!(mode(&paths[0]), 0o555);
    }
    assert_eq!(names(&store.path().join("tmp")), Vec::<String>::new());
}

#[test]
fn the_executable_variant_is_its_own_inode_with_mode_0555() {
    let (_dir, store) = open(1 << 20);
    let h = hash(b"#!/bin/sh\n");
    store
        .put_bytes(&h, b"#!/bin/sh\n", Retention::Keep)
        .unwrap();
    assert_eq!(names(&store.path().join("x")), Vec::<String>::new());
    let paths = store
        .acquire("s", &[(&h, false), (&h, true), (&h, true)])
        .unwrap();
    let (plain, exec) = (
        store.path().join("c").join(&h),
        store.path().join("x").join(&h),
    );
    assert_eq!(paths, [plain.clone(), exec.clone(), exec.clone()]);
    assert_eq!((mode(&plain), mode(&exec)), (0o444, 0o555));
    assert_eq!(fs::read(&plain).unwrap(), fs::read(&exec).unwrap());
    assert_ne!(
        fs::metadata(&plain).unwrap().ino(),
        fs::metadata(&exec).unwrap().ino()
    );
    assert_eq!(names(&store.path().join("tmp")), Vec::<String>::new());
    // Both copies count, and the entry is pinned once.
    assert_eq!(
        store.usage(),
        Usage {
            entries: 1,
            bytes: 20,
            pinned: 1
        }
    );
    // Made once: a second sandbox gets the same file.
    let ino = fs::metadata(&exec).unwrap().ino();
    store.acquire("t", &[(&h, true)]).unwrap();
    assert_eq!(fs::metadata(&exec).unwrap().ino(), ino);
}

#[test]
fn acquire_is_all_or_nothing_and_names_each_missing_digest_once() {
    let (_dir, store) = open(1 << 20);
    let (a, b) = (hash(b"a"), hash(b"b"));
    let (m1, m2) = (hash(b"m1"), hash(b"m2"));
    store.put_bytes(&a, b"a", Retention::Keep).unwrap();
    store.put_bytes(&b, b"b", Retention::SingleUse).unwrap();
    let err = store
        .acquire(
            "s",
            &[
                (&a, false),
                (&m2, false),
                (&b, true),
                (&m1, true),
                (&m2, true),
            ],
        )
        .unwrap_err();
    assert_eq!(err.to_string(), format!("2 digests missing: {m2}, {m1}"));
    assert_eq!(missing(err), [m2.clone(), m1.clone()]);
    assert_eq!(store.usage().pinned, 0);
    assert_eq!(names(&store.path().join("x")), Vec::<String>::new());
    // Nothing was pinned, so nothing was used: the single-use entry stays.
    store.release("s");
    assert!(store.contains(&b));

    let paths = store.acquire("s", &[(&a, false), (&b, false)]).unwrap();
    assert_eq!(paths, [content(&store, &a), content(&store, &b)]);
    assert_eq!(store.usage().pinned, 2);
    store.release("s");
    assert_eq!(store.usage().pinned, 0);
}

#[test]
fn a_single_use_entry_lives_until_the_sandboxes_that_used_it_are_released() {
    let (_dir, store) = open(1 << 20);
    let (once, kept) = (hash(b"once"), hash(b"kept"));
    store
        .put_bytes(&once, b"once", Retention::SingleUse)
        .unwrap();
    store.put_bytes(&kept, b"kept", Retention::Keep).unwrap();
    // Pushed, not yet used: other sandboxes come and go.
    store.acquire("other", &[(&kept, false)]).unwrap();
    store.release("other");
    store.release("never-acquired");
    assert!(store.contains(&once));

    store.acquire("s1", &[(&once, false)]).unwrap();
    store
        .acquire("s2", &[(&once, true), (&kept, false)])
        .unwrap();
    store.release("s1");
    assert!(store.contains(&once), "s2 still pins it");
    assert!(content(&store, &once).exists());
    store.release("s2");
    assert!(!store.contains(&once));
    assert!(!content(&store, &once).exists());
    assert!(!store.path().join("x").join(&once).exists());
    assert_holds(&store, &[&kept]);
    assert_eq!(
        missing(store.acquire("s3", &[(&once, false)]).unwrap_err()),
        [once]
    );
    assert_eq!(
        store.usage(),
        Usage {
            entries: 1,
            bytes: 4,
            pinned: 0
        }
    );
}

#[test]
fn a_single_use_entry_pushed_again_as_keep_stays() {
    let (_dir, store) = open(1 << 20);
    let h = hash(b"h");
    store.put_bytes(&h, b"h", Retention::SingleUse).unwrap();
    store.put_bytes(&h, b"h", Retention::Keep).unwrap();
    store.acquire("s", &[(&h, false)]).unwrap();
    store.release("s");
    assert!(store.contains(&h));
}

#[test]
fn eviction_takes_the_least_recently_used_unpinned_entries() {
    let (_dir, store) = open(100);
    let blob = |n: u8| vec![n; 40];
    let (a, b, c, d) = (
        hash(&blob(1)),
        hash(&blob(2)),
        hash(&blob(3)),
        hash(&blob(4)),
    );
    store.put_bytes(&a, &blob(1), Retention::Keep).unwrap();
    store.put_bytes(&b, &blob(2), Retention::Keep).unwrap();
    // a is used after b was put: b is the least recently used.
    store.acquire("s", &[(&a, false)]).unwrap();
    store.release("s");
    store.put_bytes(&c, &blob(3), Retention::Keep).unwrap();
    assert_holds(&store, &[&a, &c]);
    assert_eq!(store.usage().bytes, 80);
    assert_eq!(
        missing(store.acquire("s", &[(&a, false), (&b, false)]).unwrap_err()),
        [b]
    );

    // A pinned entry is never evicted, even as the least recently used.
    store.acquire("p", &[(&a, false)]).unwrap();
    store.put_bytes(&d, &blob(4), Retention::Keep).unwrap();
    assert_holds(&store, &[&a, &d]);
    assert_eq!(
        missing(store.acquire("q", &[(&c, false)]).unwrap_err()),
        [c]
    );
    // Directory blobs count and go the same way.
    let dir_blob = vec![9u8; 30];
    let dir_hash = hash(&dir_blob);
    store.put_directory(&dir_hash, dir_blob).unwrap();
    assert_holds(&store, &[&a]);
    assert_eq!(store.directory(&dir_hash).map(|b| b.len()), Some(30));
    assert_eq!(store.usage().bytes, 70);
}

#[test]
fn pinned_entries_may_exceed_the_bound_until_released() {
    let (_dir, store) = open(100);
    let blob = |n: u8| vec![n; 60];
    let (a, b, c) = (hash(&blob(1)), hash(&blob(2)), hash(&blob(3)));
    store.put_bytes(&a, &blob(1), Retention::Keep).unwrap();
    store.acquire("s", &[(&a, false)]).unwrap();
    // The entry just put is not evicted by its own put: over the bound.
    store.put_bytes(&b, &blob(2), Retention::Keep).unwrap();
    assert_eq!(store.usage().bytes, 120);
    store.acquire("t", &[(&b, false)]).unwrap();
    store.put_bytes(&c, &blob(3), Retention::Keep).unwrap();
    assert_eq!(
        store.usage(),
        Usage {
            entries: 3,
            bytes: 180,
            pinned: 2
        }
    );
    // A release brings it back under, least recently used first: c, then
    // a (just released, but b alone fits).
    store.release("s");
    assert_holds(&store, &[&b]);
    assert_eq!(store.usage().bytes, 60);
    store.release("t");
    assert_holds(&store, &[&b]);
}

#[test]
fn an_entry_larger_than_the_bound_is_refused() {
    let (dir, store) = open(10);
    let big = vec![1u8; 11];
    let h = hash(&big);
    let err = store.put_bytes(&h, &big, Retention::Keep).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("put of {h}: 11 bytes exceed the store's bound of 10 bytes")
    );
    let source = dir.path().join("big");
    fs::write(&source, &big).unwrap();
    assert!(matches!(
        store.capture(&h, &source, Retention::Keep),
        Err(StoreError::TooLarge { .. })
    ));
    assert_holds(&store, &[]);
}

#[test]
fn concurrent_captures_of_one_digest_leave_one_intact_file() {
    let (dir, store) = open(1 << 30);
    let bytes: Vec<u8> = (0..4 << 20).map(|i: u32| (i * 7 % 253) as u8).collect();
    let source = dir.path().join("input");
    fs::write(&source, &bytes).unwrap();
    let h = hash(&bytes);
    let barrier = Barrier::new(8);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                barrier.wait();
                store.capture(&h, &source, Retention::Keep).unwrap();
            });
        }
    });
    assert_holds(&store, &[&h]);
    assert_eq!(fs::read(content(&store, &h)).unwrap(), bytes);
    assert_eq!(
        store.usage(),
        Usage {
            entries: 1,
            bytes: bytes.len() as u64,
            pinned: 0
        }
    );
}

#[test]
fn concurrent_pushes_acquires_and_releases_keep_index_and_files_agreeing() {
    // 4 threads, 64 digests of 100 bytes, room for 20: constant eviction.
    let (_dir, store) = open(2_000);
    let blob = |n: usize| vec![n as u8; 100];
    let hashes: Vec<String> = (0..64).map(|n| hash(&blob(n))).collect();
    let served = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (store, hashes, served) = (&store, &hashes, &served);
            scope.spawn(move || {
                for round in 0..200 {
                    let picks: Vec<usize> =
                        (0..5).map(|k| (t * 7 + round * 3 + k * 11) % 64).collect();
                    for &n in &picks {
                        let retention = if n % 3 == 0 {
                            Retention::SingleUse
                        } else {
                            Retention::Keep
                        };
                        store.put_bytes(&hashes[n], &blob(n), retention).unwrap();
                    }
                    let sandbox = format!("{t}-{round}");
                    let wanted: Vec<(&str, bool)> = picks
                        .iter()
                        .map(|&n| (hashes[n].as_str(), n % 2 == 0))
                        .collect();
                    match store.acquire(&sandbox, &wanted) {
                        Ok(paths) => {
                            served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            for (path, &n) in paths.iter().zip(&picks) {
                                assert_eq!(fs::read(path).unwrap(), blob(n));
                            }
                        }
                        // Evicted, or used up by another thread's sandbox.
                        Err(AcquireError::Missing(_)) => {}
                        Err(err) => panic!("{err}"),
                    }
                    store.release(&sandbox);
                }
            });
        }
    });
    // Most acquires find their fresh pushes.
    assert!(served.into_inner() > 400);
    let usage = store.usage();
    assert_eq!(usage.pinned, 0);
    assert!(usage.bytes <= 2_000, "{usage:?}");
    let held: Vec<&str> = hashes
        .iter()
        .filter(|h| store.contains(h))
        .map(String::as_str)
        .collect();
    assert_eq!(held.len(), usage.entries);
    assert_holds(&store, &held);
    for h in names(&store.path().join("x")) {
        assert!(held.contains(&h.as_str()), "x/{h} outlived its entry");
    }
}

#[test]
fn open_removes_leftovers_and_drop_removes_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    fs::create_dir_all(root.join("c")).unwrap();
    fs::write(root.join("c").join("stale"), b"old run").unwrap();
    fs::set_permissions(
        root.join("c").join("stale"),
        fs::Permissions::from_mode(0o444),
    )
    .unwrap();
    fs::create_dir_all(root.join("tmp/deep")).unwrap();
    let store = ContentStore::open(&root, 1 << 20).unwrap();
    assert_eq!(mode(&root), 0o700);
    assert_eq!(names(&root), ["c", "tmp", "x"]);
    assert_holds(&store, &[]);
    let h = hash(b"h");
    store.put_bytes(&h, b"h", Retention::Keep).unwrap();
    store.acquire("s", &[(&h, true)]).unwrap();
    drop(store);
    assert!(!root.exists());
    assert_eq!(names(dir.path()), Vec::<String>::new());
}

#[test]
fn close_removes_the_store_and_reports_what_it_could_not() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("a/b/store");
    let store = ContentStore::open(&root, 1 << 20).unwrap();
    store.put_bytes(&hash(b"h"), b"h", Retention::Keep).unwrap();
    store.close().unwrap();
    assert!(!root.exists());

    // Something the store did not make stays, and closing says so.
    let store = ContentStore::open(&root, 1 << 20).unwrap();
    fs::write(root.join("foreign"), b"not ours").unwrap();
    let err = store.close().unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "removing the content store: rmdir {}: Directory not empty",
            root.canonicalize().unwrap().display()
        )
    );
    assert_eq!(names(&root), ["foreign"]);
}

#[test]
fn errors_display_on_one_line() {
    let missing = Missing {
        hashes: (0..6u8).map(|n| hash(&[n])).collect(),
    };
    let text = missing.to_string();
    assert!(text.starts_with("6 digests missing: "), "{text}");
    assert!(text.ends_with(" and 2 more"), "{text}");
    let long = "z".repeat(500);
    let text = StoreError::BadDigest { key: long }.to_string();
    assert!(text.len() < 200 && !text.contains('\n'), "{text}");
}

#[test]
fn a_store_serves_many_threads_through_an_arc() {
    let (_dir, store) = open(1 << 20);
    let store = Arc::new(store);
    let handles: Vec<_> = (0..4u8)
        .map(|n| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let h = hash(&[n]);
                store.put_bytes(&h, &[n], Retention::Keep).unwrap();
                store.acquire(&format!("s{n}"), &[(&h, false)]).unwrap()
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    assert_eq!(store.usage().pinned, 4);
}

/// A tree's content acquired once pins the same entries for the next
/// sandbox while each is still held, even after other content came and
/// went (every action's single-use inputs do), and is refused (pinning
/// nothing) once one is gone, its slot reused by other content or not.
#[test]
fn acquired_content_is_pinned_again_while_each_entry_is_still_held() {
    let (_dir, store) = open(1 << 20);
    let (a, b, once, c, d) = (
        hash(b"a"),
        hash(b"b"),
        hash(b"once"),
        hash(b"c"),
        hash(b"d"),
    );
    store.put_bytes(&a, b"a", Retention::Keep).unwrap();
    store.put_bytes(&b, b"b", Retention::Keep).unwrap();
    let tree: [(&str, bool); 3] = [(&a, false), (&b, true), (&a, false)];
    let parsed = |wanted: &[(&str, bool)]| {
        wanted
            .iter()
            .map(|&(h, x)| (Digest::parse(h).unwrap(), x))
            .collect::<Vec<_>>()
    };
    let again = |wanted: &[(&str, bool)]| parsed(wanted).into_iter();
    let acquired = store.acquire_tree("s1", &parsed(&tree)).unwrap();
    assert_eq!(store.usage().pinned, 2);
    // The executable variant made for (b, true) is where dir_of says.
    assert!(store.dir_of(true).join(&b).is_file());
    assert!(store.dir_of(false).join(&a).is_file());
    store.release("s1");
    assert_eq!(store.usage().pinned, 0);
    assert!(store.acquire_again("s2", &acquired, again(&tree)));
    assert_eq!(store.usage().pinned, 2);
    store.release("s2");
    // Other content came: every entry is still there.
    store.put_bytes(&c, b"c", Retention::Keep).unwrap();
    assert!(store.acquire_again("s3", &acquired, again(&tree)));
    assert_eq!(store.usage().pinned, 2);
    store.release("s3");

    store
        .put_bytes(&once, b"once", Retention::SingleUse)
        .unwrap();
    let other: [(&str, bool); 2] = [(&once, false), (&a, false)];
    let with_once = store.acquire_tree("s4", &parsed(&other)).unwrap();
    store.release("s4"); // spent: `once` goes
    assert!(!store.acquire_again("s5", &with_once, again(&other)));
    assert_eq!(store.usage().pinned, 0);
    store.put_bytes(&d, b"d", Retention::Keep).unwrap(); // in once's slot
    assert!(!store.acquire_again("s6", &with_once, again(&other)));
    assert_eq!(store.usage().pinned, 0);
    assert!(
        store.acquire_again("s7", &acquired, again(&tree)),
        "the first tree is untouched"
    );
    store.release("s7");
    // Checked against the entries wanted: another list is refused.
    assert!(!store.acquire_again("s8", &acquired, again(&[(&a, false), (&b, false)])));
    let reordered: [(&str, bool); 3] = [(&b, false), (&b, true), (&a, false)];
    assert!(!store.acquire_again("s9", &acquired, again(&reordered)));
    assert_eq!(store.usage().pinned, 0);
}

// ---- warm state: hand-off and adoption ----

/// A store that held `a` (4 bytes, least recently used), `b` (2 bytes,
/// with its executable variant) and an unused single-use entry, handed
/// on to `warm` in `dir`.
fn handed_on(dir: &Path) -> (PathBuf, String, String) {
    let warm = dir.join("warm");
    let (a, b, once) = (hash(b"aaaa"), hash(b"bb"), hash(b"once"));
    let store = ContentStore::open(&dir.join("first"), 1 << 20).unwrap();
    store.put_bytes(&a, b"aaaa", Retention::Keep).unwrap();
    store.put_bytes(&b, b"bb", Retention::Keep).unwrap();
    store.acquire("s", &[(&b, true)]).unwrap();
    store.release("s");
    store
        .put_bytes(&once, b"once", Retention::SingleUse)
        .unwrap();
    let handed = store.hand_on(&warm).unwrap();
    assert_eq!(
        handed,
        HandedOn {
            entries: 2,
            bytes: 8
        }
    );
    assert_eq!(store.usage().entries, 0, "empty once handed on");
    assert_eq!(store.lookup(&a), Lookup::Absent);
    store.close().unwrap();
    (warm, a, b)
}

#[test]
fn handed_on_content_is_adopted_by_the_next_store_in_its_order() {
    let dir = tempfile::tempdir().unwrap();
    let (warm, a, b) = handed_on(dir.path());
    let (store, adopted) =
        ContentStore::open_adopting(&dir.path().join("next"), 1 << 20, &warm).unwrap();
    let adopted = adopted.unwrap().expect("a hand-off to adopt");
    // The unused single-use entry's file was not listed: dropped.
    assert_eq!(
        adopted,
        Adopted {
            entries: 2,
            bytes: 8,
            dropped: 1
        }
    );
    assert!(!warm.exists(), "taken, not copied");
    assert_eq!(store.lookup(&a), Lookup::Present);
    let paths = store.acquire("t", &[(&a, false), (&b, true)]).unwrap();
    assert_eq!(fs::read(&paths[0]).unwrap(), b"aaaa");
    assert_eq!(fs::read(&paths[1]).unwrap(), b"bb");
    assert_eq!(mode(&paths[1]), 0o555);
    assert_holds(&store, &[&a, &b]);
    store.release("t");
    assert_eq!(store.usage().bytes, 8);
    drop(store);

    // In least recently used order: a bound of 5 bytes evicts `a` first.
    let (warm, a, b) = handed_on(&dir.path().join("again"));
    let (store, adopted) =
        ContentStore::open_adopting(&dir.path().join("small"), 5, &warm).unwrap();
    assert_eq!(adopted.unwrap().unwrap().entries, 2);
    assert_ne!(store.lookup(&a), Lookup::Present);
    assert_eq!(store.lookup(&b), Lookup::Present);

    // Nothing handed on: nothing adopted.
    let (_store, adopted) =
        ContentStore::open_adopting(&dir.path().join("cold"), 1 << 20, &warm).unwrap();
    assert_eq!(adopted.unwrap(), None);
}

#[test]
fn an_adopted_entry_that_fails_a_check_is_dropped_and_unlisted_files_go() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("again")).unwrap();
    let (warm, a, b) = handed_on(dir.path());
    // `a` made writable, `b`'s executable variant resized, a stray file,
    // a line that is no entry.
    fs::set_permissions(warm.join("c").join(&a), fs::Permissions::from_mode(0o644)).unwrap();
    let x = warm.join("x").join(&b);
    fs::set_permissions(&x, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(&x, b"longer").unwrap();
    fs::set_permissions(&x, fs::Permissions::from_mode(0o555)).unwrap();
    fs::write(warm.join("c").join("stray"), b"?").unwrap();
    let index = warm.join("index");
    let text = fs::read_to_string(&index).unwrap();
    fs::write(&index, format!("{text}not an entry\n")).unwrap();
    let (store, adopted) =
        ContentStore::open_adopting(&dir.path().join("next"), 1 << 20, &warm).unwrap();
    let adopted = adopted.unwrap().unwrap();
    // `b` without its variant; dropped: `a`, the line, the stray file,
    // the single-use file, `b`'s variant.
    assert_eq!((adopted.entries, adopted.bytes), (1, 2), "{adopted:?}");
    assert_eq!(adopted.dropped, 5, "{adopted:?}");
    assert_eq!(store.lookup(&a), Lookup::Absent);
    assert_holds(&store, &[&b]);
    assert_eq!(names(&store.path().join("x")), Vec::<String>::new());
    assert_eq!(
        names(store.path()),
        ["c", "tmp", "x"],
        "the hand-off removed"
    );
    drop(store);

    // An index of another format: refused, removed, the store empty.
    let (warm, _, _) = handed_on(&dir.path().join("again"));
    fs::write(warm.join("index"), "some other format\n").unwrap();
    let (store, adopted) =
        ContentStore::open_adopting(&dir.path().join("third"), 1 << 20, &warm).unwrap();
    let why = adopted.unwrap_err().to_string();
    assert!(why.contains("not an index of this version"), "{why}");
    assert_eq!(store.usage().entries, 0);
    assert_eq!(names(store.path()), ["c", "tmp", "x"]);
}

/// A hand-off directory another user owns, or that others may enter, is
/// not taken (in /dev/shm its name is anyone's to make): refused and left.
#[test]
fn a_hand_off_not_this_users_alone_is_left_where_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let (warm, a, _) = handed_on(dir.path());
    fs::set_permissions(&warm, fs::Permissions::from_mode(0o755)).unwrap();
    let (store, adopted) =
        ContentStore::open_adopting(&dir.path().join("next"), 1 << 20, &warm).unwrap();
    let why = adopted.unwrap_err().to_string();
    assert!(why.contains("is not ours alone (owner uid"), "{why}");
    assert!(why.contains("not adopted, left where it is"), "{why}");
    assert!(warm.join("index").is_file(), "left where it is");
    assert_eq!(store.lookup(&a), Lookup::Absent);
    drop(store);
    if nix::unistd::geteuid().is_root() {
        fs::set_permissions(&warm, fs::Permissions::from_mode(0o700)).unwrap();
        nix::unistd::chown(&warm, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        let (_store, adopted) =
            ContentStore::open_adopting(&dir.path().join("other"), 1 << 20, &warm).unwrap();
        assert!(adopted.is_err(), "another user's");
        assert!(warm.join("index").is_file());
    }
}

/// A handed-on file another user owns is not adopted (root only: it
/// takes a chown to make one).
#[test]
fn an_adopted_file_another_user_owns_is_dropped() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (warm, a, b) = handed_on(dir.path());
    let nobody = Some(nix::unistd::Uid::from_raw(65534));
    nix::unistd::chown(&warm.join("c").join(&a), nobody, None).unwrap();
    let (store, adopted) =
        ContentStore::open_adopting(&dir.path().join("next"), 1 << 20, &warm).unwrap();
    let adopted = adopted.unwrap().unwrap();
    assert_eq!(adopted.entries, 1, "{adopted:?}");
    assert_eq!(store.lookup(&a), Lookup::Absent);
    assert_eq!(store.lookup(&b), Lookup::Present);
    assert_holds(&store, &[&b]);
}
