//! Creates that type inputs at their first lookup: what a create no longer
//! checks (an input's existence) and everything that still holds through
//! a real mount, for inputs the kernel meets for the first time.

use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};

use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;

/// A sandbox in Bazel's layout: the writable workspace `/ws` and inputs
/// nested inside it.
fn workspace(
    fx: &Fixture,
    id: &str,
    inputs: &[(&str, &std::path::Path)],
) -> actionfs_protocol::CreateSandbox {
    let mut mappings = vec![rw("/ws", &fx.path("scratch"))];
    mappings.extend(
        inputs
            .iter()
            .map(|(path, under)| ro(&format!("/ws/{path}"), under)),
    );
    sandbox(id, mappings)
}

#[test]
fn a_missing_input_is_absent_until_it_exists() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let present = fx.write("src/present.c", "here");
    let later = fx.path("src/later.c");
    // With no caching, the name shows up in the same sandbox once made.
    let d = fx.start(&["--ttl=0s"]);
    d.create(workspace(
        &fx,
        "s",
        &[("in/present.c", &present), ("in/later.c", &later)],
    ));
    let gone = fs::symlink_metadata(d.path("s/ws/in/later.c")).unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::NotFound);
    assert_eq!(
        names(&d.path("s/ws/in")),
        ["present.c"],
        "not listed either"
    );
    assert_eq!(
        fs::read_to_string(d.path("s/ws/in/present.c")).unwrap(),
        "here"
    );
    fs::write(&later, "now").unwrap();
    assert_eq!(
        fs::read_to_string(d.path("s/ws/in/later.c")).unwrap(),
        "now"
    );
    let mut listed = names(&d.path("s/ws/in"));
    listed.sort();
    assert_eq!(listed, ["later.c", "present.c"]);
    d.destroy("s");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn a_native_sandbox_with_a_missing_input_is_served_by_fuse() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let present = fx.write("src/present.c", "here");
    let d = fx.start(&["--native_below=100"]);
    let before = fx.stats_now(&d)["built"].clone();
    d.create(workspace(
        &fx,
        "n",
        &[("present.c", &present), ("gone.c", &fx.path("src/gone.c"))],
    ));
    // Checked while the sandbox exists: its destroy would remove what a
    // native build had made.
    assert!(
        !fx.path("scratch/present.c").exists(),
        "nothing made natively"
    );
    let built = fx.stats_now(&d)["built"].clone();
    let count = |how: &str, of: &serde_json::Value| {
        of[how]
            .as_u64()
            .unwrap_or_else(|| panic!("no built count {how:?} in {of}"))
    };
    assert_eq!(
        (
            count("fuse_fallback", &built) - count("fuse_fallback", &before),
            count("native", &built) - count("native", &before)
        ),
        (1, 0),
        "{built}"
    );
    // A native sandbox would be a symlink to its tree; this one is the view.
    assert!(fs::symlink_metadata(d.path("n")).unwrap().is_dir());
    assert_eq!(
        fs::read_to_string(d.path("n/ws/present.c")).unwrap(),
        "here"
    );
    let gone = fs::symlink_metadata(d.path("n/ws/gone.c")).unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::NotFound);
    d.destroy("n");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn inputs_first_met_by_a_listing_or_a_lookup_show_their_own_type() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let file = fx.write("src/file.c", "data");
    let tree = fx.path("src/sandbox/tree");
    fx.write("src/sandbox/tree/inside.h", "inside");
    let link = fx.path("src/link");
    std::os::unix::fs::symlink("tree", &link).unwrap();
    let fifo = fx.path("src/fifo");
    nix_mkfifo(&fifo);
    let inputs = [
        ("in/file.c", file.as_path()),
        ("in/tree", tree.as_path()),
        ("in/link", link.as_path()),
        ("in/fifo", fifo.as_path()),
    ];
    let d = fx.start(&[]);
    // First met by a listing: the types readdir gives.
    d.create(workspace(&fx, "listed", &inputs));
    let mut kinds: Vec<(String, &str)> = fs::read_dir(d.path("listed/ws/in"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            let kind = if t.is_dir() {
                "dir"
            } else if t.is_symlink() {
                "symlink"
            } else if t.is_fifo() {
                "fifo"
            } else {
                "file"
            };
            (e.file_name().to_string_lossy().into_owned(), kind)
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            ("fifo".to_owned(), "fifo"),
            ("file.c".to_owned(), "file"),
            ("link".to_owned(), "symlink"),
            ("tree".to_owned(), "dir")
        ]
    );
    // First met by a lookup, in a sandbox never listed.
    d.create(workspace(&fx, "looked", &inputs));
    for id in ["listed", "looked"] {
        let at = |rel: &str| d.path(&format!("{id}/ws/in/{rel}"));
        assert!(fs::symlink_metadata(at("tree")).unwrap().is_dir());
        assert_eq!(fs::read_to_string(at("tree/inside.h")).unwrap(), "inside");
        assert_eq!(names(&at("tree")), ["inside.h"]);
        // A symlink is shown as itself and never followed by the daemon.
        assert!(fs::symlink_metadata(at("link"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            fs::read_link(at("link")).unwrap(),
            std::path::Path::new("tree")
        );
        let nofollow = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(at("link"));
        assert_eq!(nofollow.unwrap_err().raw_os_error(), Some(libc::ELOOP));
        assert!(fs::symlink_metadata(at("fifo"))
            .unwrap()
            .file_type()
            .is_fifo());
        // Read-only inputs refuse changes; nothing reaches the file.
        assert_eq!(fs::read_to_string(at("file.c")).unwrap(), "data");
        // (Root, whom modes do not stop, is refused at its first write.)
        let written = fs::OpenOptions::new()
            .write(true)
            .open(at("file.c"))
            .and_then(|mut f| f.write_all(b"changed").and_then(|()| f.sync_all()));
        assert!(
            matches!(
                written.unwrap_err().raw_os_error(),
                Some(libc::EACCES | libc::EPERM)
            ),
            "a read-only input written"
        );
        let nested = fs::File::create(at("tree/new.h"));
        assert!(matches!(
            nested.unwrap_err().raw_os_error(),
            Some(libc::EACCES | libc::EPERM)
        ));
        assert!(!tree.join("new.h").exists());
        // The writable workspace takes outputs.
        let mut out = fs::File::create(d.path(&format!("{id}/ws/out.o"))).unwrap();
        out.write_all(b"out").unwrap();
        drop(out);
        assert_eq!(fs::read_to_string(fx.path("scratch/out.o")).unwrap(), "out");
        fs::remove_file(fx.path("scratch/out.o")).unwrap();
        d.destroy(id);
    }
    assert_eq!(fs::read_to_string(&file).unwrap(), "data");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn a_mapping_below_an_input_that_is_not_a_directory_still_fails_the_create() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let file = fx.write("src/file.c", "data");
    let d = fx.start(&[]);
    let err = d.create_err(workspace(&fx, "s", &[("f", &file), ("f/below", &file)]));
    assert!(
        err.contains("mapping #2") && err.contains("\"/ws/f\" is mapped to a non-directory"),
        "{err}"
    );
    let err = d.create_err(workspace(&fx, "t", &[("f/below", &file), ("f", &file)]));
    assert!(
        err.contains("mapping #2") && err.contains("nested mappings need a directory"),
        "{err}"
    );
    assert_eq!(names(&d.mnt), ["empty"], "a failed create leaves nothing");
    assert_eq!(d.terminate(), BY_SIGTERM);
}

fn nix_mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}
