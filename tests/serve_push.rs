//! `actionfs serve`'s Push and what a Create does without it: content
//! pushed inline or by location, missing content named in MissingContent
//! and asked for again (evicted, spent, or failed for the moment), a
//! digest never served with other bytes, and the empty directory whose
//! blob Bazel never pushes.

use std::fs;
use std::path::PathBuf;

use actionfs_protocol::backend::digest::{digest_of, sha256_hex};
use actionfs_protocol::backend::sandbox::{create, Content, Retention};
use actionfs_protocol::backend::tree::{Tree, TreeBuilder};
use actionfs_testkit::backend::{assert_built_as, inline, located_at, modes, Backend};
use actionfs_testkit::tier::{require, Need};

#[test]
fn content_pushed_after_a_create_serves_the_next_create_of_the_same_tree() {
    if !require(&[Need::Mount]) {
        return;
    }
    for (mode, option) in modes() {
        let b = Backend::start(&[option]);
        let original = b"the bytes of the digest\n";
        let digest = b.write_input("lib/a.h", original);
        let tree = b.push_files([("ws/lib/a.h", digest)]);
        let manifest = || b.manifest(&tree, &[("/ws/out/o", "file")]);
        let first = b.create_ok("1", manifest());
        assert_built_as(&b, mode, &first);
        assert_eq!(
            fs::read(first.join("ws/lib/a.h")).unwrap(),
            original,
            "{mode}"
        );
        b.destroy_ok("1");
        // The default place now holds other bytes, and the digest's own
        // bytes are pushed: the same tree must be served from the store.
        b.write_input("lib/a.h", b"rewritten\n");
        b.push_inline(original);
        let second = b.create_ok("2", manifest());
        assert_built_as(&b, mode, &second);
        assert_eq!(
            fs::read(second.join("ws/lib/a.h")).unwrap(),
            original,
            "{mode}: a tree seen before kept its lookups past a Push"
        );
        b.destroy_ok("2");
        b.close();
    }
}

#[test]
fn missing_content_is_named_then_pushed_then_the_create_succeeds() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&[]);
    let bytes = b"only pushed\n";
    let mut tb = TreeBuilder::new();
    tb.add_file("ws/f", digest_of(bytes), false).unwrap();
    tb.add_file("ws/sub/g", b.write_input("sub/g", b"g"), false)
        .unwrap();
    let tree = tb.build();
    let answer = b.client().create("1", b.manifest(&tree, &[])).unwrap();
    let Some(create::result::Outcome::MissingContent(missing)) = answer.outcome else {
        panic!("expected MissingContent, got {answer:?}");
    };
    assert_eq!(missing.digest_hashes, vec![tree.root.hash.clone()]);
    b.push_tree(&tree);
    b.push_inline(bytes);
    let root = b.create_ok("1", b.manifest(&tree, &[]));
    assert_eq!(fs::read(root.join("ws/f")).unwrap(), bytes);
    b.destroy_ok("1");
    b.close();
}

/// Rewriting a default-place input between sandboxes, or the location a
/// Push named once it was captured, never serves a digest with other
/// bytes; nor does a location whose bytes are not the digest's.
#[test]
fn a_digest_is_never_served_with_other_bytes() {
    if !require(&[Need::Mount]) {
        return;
    }
    for (mode, option) in modes() {
        let b = Backend::start(&[option]);
        let located = b.root().join("elsewhere.txt");
        fs::write(&located, b"captured\n").unwrap();
        let captured = digest_of(b"captured\n");
        for round in 0..3 {
            let text = format!("version {round}\n");
            let digest = b.write_input("a.txt", text.as_bytes());
            let tree = b.push_files([("ws/a.txt", digest), ("ws/c.txt", captured.clone())]);
            if round == 0 {
                b.push_content(
                    captured.hash.clone(),
                    located_at(&located.display().to_string()),
                );
            }
            let id = format!("s{round}");
            let root = b.create_ok(&id, b.manifest(&tree, &[]));
            assert_built_as(&b, mode, &root);
            // The Push was applied before that Create was read. Bazel does
            // not promise the path keeps those bytes afterwards.
            fs::write(&located, format!("rewritten {round}\n")).unwrap();
            let read = fs::read_to_string(root.join("ws/a.txt"));
            assert_eq!(
                read.ok().as_deref(),
                Some(text.as_str()),
                "{mode} round {round}\n{}",
                b.log()
            );
            let read = fs::read(root.join("ws/c.txt"));
            assert_eq!(
                read.ok().as_deref(),
                Some(&b"captured\n"[..]),
                "{mode} round {round}\n{}",
                b.log()
            );
            b.destroy_ok(&id);
        }
        // A location that no longer holds the digest's bytes is refused,
        // and so is the Create that needs it (not read from elsewhere).
        let lie = digest_of(b"what the location held once\n");
        b.push_content(lie.hash.clone(), located_at(&located.display().to_string()));
        let tree = b.push_files([("ws/lie.txt", lie)]);
        let err = b.create_error("lie", b.manifest(&tree, &[]));
        assert!(err.contains("refused") && err.contains("lie.txt"), "{err}");
        b.close();
    }
}

/// Evicted and spent single-use content is asked for again
/// (MissingContent), never read from the default place instead.
#[test]
fn evicted_and_spent_content_is_missing_content_until_pushed_again() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&["--store_max_bytes=1500"]);
    let (first, second, once) = ([b'a'; 1000], [b'b'; 1000], [b'c'; 10]);
    // The default place holds other bytes under the same names.
    for name in ["f", "g"] {
        b.write_input(name, b"not the digest's bytes");
    }
    let tree_of =
        |name: &str, bytes: &[u8]| b.push_files([(format!("ws/{name}"), digest_of(bytes))]);
    let push = |bytes: &[u8], retention: Retention| {
        let content = Content {
            retention: retention as i32,
            ..inline(bytes)
        };
        b.push_content(sha256_hex(bytes), content);
    };
    let expect_missing = |id: &str, tree: &Tree, bytes: &[u8]| match b
        .client()
        .create(id, b.manifest(tree, &[]))
        .unwrap()
        .outcome
    {
        Some(create::result::Outcome::MissingContent(m)) => {
            assert_eq!(m.digest_hashes, vec![sha256_hex(bytes)])
        }
        other => panic!("{id}: expected MissingContent, got {other:?}"),
    };
    let with_first = tree_of("f", &first);
    push(&first, Retention::Reuse);
    let root = b.create_ok("1", b.manifest(&with_first, &[]));
    assert_eq!(fs::read(root.join("ws/f")).unwrap(), first);
    b.destroy_ok("1");
    push(&second, Retention::Reuse); // over the bound: `first` goes
    expect_missing("2", &with_first, &first);
    push(&first, Retention::Reuse);
    let root = b.create_ok("2", b.manifest(&with_first, &[]));
    assert_eq!(fs::read(root.join("ws/f")).unwrap(), first);
    b.destroy_ok("2");

    let with_once = tree_of("g", &once);
    push(&once, Retention::SingleUse);
    let root = b.create_ok("3", b.manifest(&with_once, &[]));
    assert_eq!(fs::read(root.join("ws/g")).unwrap(), once);
    b.destroy_ok("3");
    expect_missing("4", &with_once, &once);
    b.close();
}

#[test]
fn relative_content_locations_are_read_below_the_workspaces_parent() {
    if !require(&[Need::Mount]) {
        return;
    }
    for (mode, option) in modes() {
        let b = Backend::start(&[option]);
        // A runfiles member: its bytes at its own exec path, its place in
        // the tree below the runfiles directory.
        let bytes = b"runfiles member\n";
        b.write_input("data/member.txt", bytes);
        b.push_content(sha256_hex(bytes), located_at("ws/data/member.txt"));
        let tree = b.push_files([("ws/bin/tool.runfiles/ws/data/member.txt", digest_of(bytes))]);
        let member = "ws/bin/tool.runfiles/ws/data/member.txt";
        let root = b.create_ok("1", b.manifest(&tree, &[]));
        assert_eq!(fs::read(root.join(member)).unwrap(), bytes, "{mode}");
        assert_built_as(&b, mode, &root);
        b.destroy_ok("1");
        // Captured at the Push: what the location holds later is not read.
        b.write_input("data/member.txt", b"changed after the push\n");
        let root = b.create_ok("2", b.manifest(&tree, &[]));
        assert_eq!(fs::read(root.join(member)).unwrap(), bytes, "{mode}");
        b.destroy_ok("2");
        b.close();
    }
}

/// A Push entry that failed for a reason of the moment (its location
/// missing when read; a full disk would do the same) is asked for again
/// with MissingContent, which Bazel answers with a Push: Bazel pushes an
/// entry to a backend once, so an Error would fail every later action
/// naming that digest until the backend restarts. Bytes that are not
/// the digest's stay an Error: pushing them again cannot help.
#[test]
fn a_push_that_failed_for_the_moment_is_asked_for_again() {
    if !require(&[Need::Mount]) {
        return;
    }
    let b = Backend::start(&[]);
    let bytes = b"runfiles member\n";
    // Not there yet when the Push is read.
    b.push_content(sha256_hex(bytes), located_at("ws/data/member.txt"));
    let member = "ws/bin/tool.runfiles/ws/data/member.txt";
    let tree = b.push_files([(member, digest_of(bytes))]);
    let answer = b.client().create("1", b.manifest(&tree, &[])).unwrap();
    match answer.outcome {
        Some(create::result::Outcome::MissingContent(missing)) => {
            assert_eq!(missing.digest_hashes, vec![sha256_hex(bytes)])
        }
        other => panic!("expected MissingContent, got {other:?}\n{}", b.log()),
    }
    // Bazel pushes what was named, now readable, and creates again.
    b.write_input("data/member.txt", bytes);
    b.push_content(sha256_hex(bytes), located_at("ws/data/member.txt"));
    let root = b.create_ok("1", b.manifest(&tree, &[]));
    assert_eq!(fs::read(root.join(member)).unwrap(), bytes);
    b.destroy_ok("1");

    // Other bytes at the location: an Error, then as before.
    let other = b"other bytes\n";
    b.write_input("data/other.txt", b"not the digest's\n");
    b.push_content(sha256_hex(other), located_at("ws/data/other.txt"));
    let tree = b.push_files([("ws/bin/tool.runfiles/ws/data/other.txt", digest_of(other))]);
    let message = b.create_error("2", b.manifest(&tree, &[]));
    assert!(message.contains("refused"), "{message}");
    b.close();
}

#[test]
fn an_empty_directory_is_served_though_its_blob_is_never_pushed() {
    if !require(&[Need::Mount]) {
        return;
    }
    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    for (mode, option) in modes() {
        let b = Backend::start(&[option]);
        let input = b.write_input("src/a.txt", b"a\n");
        let mut tb = TreeBuilder::new();
        tb.add_file("ws/src/a.txt", input, false).unwrap();
        tb.add_dir("ws/empty").unwrap();
        tb.add_dir("ws/src/deeper/empty").unwrap();
        let mut tree = tb.build();
        // As Bazel: the empty Directory serializes to no bytes and is
        // never pushed.
        tree.blobs.remove(EMPTY);
        b.push_tree(&tree);
        let outcome = b.client().create("1", b.manifest(&tree, &[])).unwrap();
        let root = match outcome.outcome {
            Some(create::result::Outcome::Ok(ok)) => PathBuf::from(ok.path),
            other => panic!("{mode}: {other:?}\n{}", b.log()),
        };
        assert_built_as(&b, mode, &root);
        for dir in ["ws/empty", "ws/src/deeper/empty"] {
            let entries: Vec<_> = fs::read_dir(root.join(dir))
                .unwrap_or_else(|err| panic!("{mode}: {dir}: {err}"))
                .collect();
            assert!(entries.is_empty(), "{mode}: {dir} is not empty");
        }
        b.destroy_ok("1");
        b.close();
    }
}
