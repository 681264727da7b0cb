//! The content store's reflink path, on a loop-mounted xfs with reflink=1
//! (root, mkfs.xfs): captures and executable variants share extents with
//! their source, and are snapshots all the same. The copy path is covered
//! by the unit tests (src/sandbox/store/tests.rs).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use actionfs::sandbox::store::{ContentStore, Digest, Retention, StoreError};
use actionfs_testkit::tier::{self, require, Need};
use actionfs_testkit::LoopXfs;

/// Free bytes of the file system holding `path`.
fn free_bytes(path: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(path).unwrap();
    st.blocks_available() as u64 * st.fragment_size() as u64
}

fn xfs() -> Option<LoopXfs> {
    if !require(&[Need::LoopDevice]) {
        return None;
    }
    match LoopXfs::new() {
        Ok(xfs) => Some(xfs),
        Err(why) => {
            tier::skip(&format!(
                "no reflink-capable file system could be made here: {why}"
            ));
            None
        }
    }
}

#[test]
fn captures_on_a_reflink_file_system_share_extents_and_stay_snapshots() {
    let Some(xfs) = xfs() else { return };
    let store = ContentStore::open(&xfs.path().join("store"), 1 << 30).unwrap();
    let source = xfs.path().join("input");
    let bytes: Vec<u8> = (0..64u32 << 20).map(|i| (i % 249) as u8).collect();
    fs::write(&source, &bytes).unwrap();
    // Unreadable by mode: the clone is made readable before it is hashed.
    fs::set_permissions(&source, fs::Permissions::from_mode(0o200)).unwrap();
    let h = Digest::of(&bytes).hex();

    let free = free_bytes(xfs.path().as_path());
    store.capture(&h, &source, Retention::Keep).unwrap();
    let paths = store.acquire("s", &[(&h, false), (&h, true)]).unwrap();
    let used = free.saturating_sub(free_bytes(xfs.path().as_path()));
    assert!(
        used < 8 << 20,
        "two 64 MiB clones took {used} bytes: copied, not cloned"
    );
    let modes: Vec<u32> = paths
        .iter()
        .map(|p| fs::metadata(p).unwrap().mode() & 0o7777)
        .collect();
    assert_eq!(modes, [0o444, 0o555]);

    // Written over in place: the clones keep the captured bytes.
    fs::OpenOptions::new()
        .write(true)
        .open(&source)
        .unwrap()
        .write_all(b"changed")
        .unwrap();
    for path in &paths {
        assert!(fs::read(path).unwrap() == bytes, "{}", path.display());
    }
    store.release("s");
    store.close().unwrap();
}

#[test]
fn a_mismatching_clone_is_refused_and_removed() {
    let Some(xfs) = xfs() else { return };
    let store = ContentStore::open(&xfs.path().join("store"), 1 << 30).unwrap();
    let source = xfs.path().join("input");
    fs::write(&source, b"actual").unwrap();
    let h = Digest::of(b"expected").hex();
    let err = store.capture(&h, &source, Retention::Keep).unwrap_err();
    assert!(matches!(err, StoreError::Mismatch { .. }), "{err}");
    for sub in ["c", "tmp"] {
        assert_eq!(
            fs::read_dir(store.path().join(sub)).unwrap().count(),
            0,
            "{sub}/"
        );
    }
}
