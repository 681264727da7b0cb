//! The core driven directly, without a mount: what the kernel would ask,
//! answered by the same code the FUSE shell calls.

use std::ffi::OsStr;
use std::fs;
use std::path::Path;

use actionfs_protocol::ResolvedMapping;

use super::*;

fn mapping(path: &str, underlying: &Path, writable: bool) -> ResolvedMapping {
    ResolvedMapping {
        path: path.into(),
        underlying: underlying.into(),
        writable,
    }
}

fn new_fs(dir: &Path) -> SandboxFs {
    SandboxFs::new(
        FsConfig {
            mount_point: dir.join("mnt"),
            xattrs: false,
            track_access: false,
        },
        &[],
    )
    .unwrap()
}

/// Looks a path up component by component from the root, as the kernel
/// does, and returns the final inode.
fn walk(fs: &SandboxFs, path: &str) -> Result<u64, Errno> {
    let mut ino = ROOT_INO;
    for name in path.split('/').filter(|c| !c.is_empty()) {
        ino = fs.lookup(ino, OsStr::new(name)).map_err(|e| e.errno())?.ino;
    }
    Ok(ino)
}

/// The errno of a result, for comparing with the expected one.
fn errno<T>(result: FsResult<T>) -> Result<T, Errno> {
    result.map_err(|e| e.errno())
}

const ROOT_CALLER: Caller = Caller { uid: 0, gid: 0 };

#[test]
fn a_failed_create_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    fs::write(&good, "g").unwrap();
    let fs = new_fs(dir.path());
    let err = fs
        .create_sandbox(
            "s",
            &[
                mapping("/a/ok", &good, false),
                mapping("/a/ok/below", &good, false),
            ],
        )
        .unwrap_err();
    let err = err.to_string();
    assert!(
        err.contains("\"s\"")
            && err.contains("mapping #1")
            && err.contains("\"/a/ok\" is mapped to a non-directory"),
        "{err}"
    );
    assert!(fs.sandbox_ids().is_empty());
    assert!(fs.list(ROOT_INO).unwrap().is_empty());
    assert_eq!(fs.known_inodes(), 1);
}

#[test]
fn a_missing_input_is_absent_from_its_sandbox_until_it_exists() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    fs::write(&good, "g").unwrap();
    let later = dir.path().join("later");
    let fs = new_fs(dir.path());
    fs.create_sandbox(
        "s",
        &[
            mapping("/a/ok", &good, false),
            mapping("/a/later", &later, false),
        ],
    )
    .unwrap();
    assert_eq!(walk(&fs, "/s/a/later"), Err(Errno::ENOENT));
    let a = walk(&fs, "/s/a").unwrap();
    assert_eq!(fs.list(a).unwrap(), ["ok"], "a missing input is not listed");
    fs::write(&later, "l").unwrap();
    let ino = walk(&fs, "/s/a/later").unwrap();
    assert_eq!(fs.getattr(ino, None).unwrap().kind, FileKind::RegularFile);
    let mut listed = fs.list(a).unwrap();
    listed.sort();
    assert_eq!(listed, ["later", "ok"]);
}

#[test]
fn inputs_are_typed_when_first_looked_up_or_listed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    fs::write(&file, "f").unwrap();
    let tree = dir.path().join("tree");
    fs::create_dir(&tree).unwrap();
    fs::write(tree.join("inside"), "i").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink("tree", &link).unwrap();
    let fs = new_fs(dir.path());
    let mappings = [
        mapping("/in/file", &file, false),
        mapping("/in/tree", &tree, false),
        mapping("/in/link", &link, false),
    ];
    fs.create_sandbox("s", &mappings).unwrap();
    // A listing types what it shows.
    let input = walk(&fs, "/s/in").unwrap();
    let fh = fs.opendir(input).unwrap();
    let mut kinds = std::collections::HashMap::new();
    fs.readdir(fh, 0, |_, e| {
        kinds.insert(e.name.to_owned(), e.kind);
        false
    })
    .unwrap();
    fs.releasedir(fh);
    assert_eq!(kinds[OsStr::new("file")], FileKind::RegularFile);
    assert_eq!(kinds[OsStr::new("tree")], FileKind::Directory);
    assert_eq!(kinds[OsStr::new("link")], FileKind::Symlink);
    // A directory input shows its entries; a symlink is never followed.
    let tree_ino = walk(&fs, "/s/in/tree").unwrap();
    assert_eq!(fs.list(tree_ino).unwrap(), ["inside"]);
    walk(&fs, "/s/in/tree/inside").unwrap();
    let link_ino = walk(&fs, "/s/in/link").unwrap();
    assert_eq!(fs.getattr(link_ino, None).unwrap().kind, FileKind::Symlink);
    assert_eq!(fs.readlink(link_ino).unwrap(), b"tree");
    assert_eq!(walk(&fs, "/s/in/link/inside"), Err(Errno::ENOTDIR));
    // And by lookup, in a second sandbox never listed.
    fs.create_sandbox("t", &mappings).unwrap();
    let tree_ino = walk(&fs, "/t/in/tree").unwrap();
    assert_eq!(
        fs.getattr(tree_ino, None).unwrap().kind,
        FileKind::Directory
    );
    assert_eq!(fs.list(tree_ino).unwrap(), ["inside"]);
    let file_ino = walk(&fs, "/t/in/file").unwrap();
    assert_eq!(
        errno(fs.open(file_ino, libc::O_RDWR).map(|o| o.fh)),
        Err(Errno::EPERM)
    );
}

#[test]
fn creating_a_large_sandbox_assigns_no_inodes_until_looked_up() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    fs::write(&file, "f").unwrap();
    let fs = new_fs(dir.path());
    let mappings: Vec<_> = (0..2000)
        .map(|n| mapping(&format!("/ws/d{}/f{n}", n % 20), &file, false))
        .collect();
    fs.create_sandbox("big", &mappings).unwrap();
    assert_eq!(fs.known_inodes(), 1, "only the root is known to the kernel");
    walk(&fs, "/big/ws/d3/f3").unwrap();
    assert_eq!(fs.known_inodes(), 5, "big, ws, d3 and f3");
    fs.destroy_sandbox("big").unwrap();
    assert_eq!(walk(&fs, "/big"), Err(Errno::ENOENT));
}

#[test]
fn forgetting_discovered_nodes_returns_their_memory() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    fs::create_dir_all(tree.join("sub")).unwrap();
    fs::write(tree.join("sub/x"), "x").unwrap();
    let fs = new_fs(dir.path());
    fs.create_sandbox("s", &[mapping("/t", &tree, false)])
        .unwrap();
    let sub = walk(&fs, "/s/t/sub").unwrap();
    let x = fs.lookup(sub, OsStr::new("x")).unwrap().ino;
    // The same name keeps its inode while known.
    assert_eq!(fs.lookup(sub, OsStr::new("x")).unwrap().ino, x);
    let before = fs.known_inodes();
    fs.forget(x, 2);
    assert_eq!(fs.known_inodes(), before - 1);
    assert_eq!(errno(fs.getattr(x, None)), Err(Errno::ESTALE));
    let t = walk(&fs, "/s/t").unwrap();
    fs.forget(sub, 2);
    fs.forget(t, 2);
    fs.destroy_sandbox("s").unwrap();
    let s = fs.lookup(ROOT_INO, OsStr::new("s"));
    assert_eq!(errno(s), Err(Errno::ENOENT));
}

#[test]
fn a_lookup_racing_the_forget_of_a_name_keeps_one_inode_for_it() {
    // The kernel forgets a name's inode (its last lookup) while another
    // lookup of the name is being answered: the answered inode must stay
    // the name's, or the next lookup hands out a second inode for the same
    // file while the kernel still holds the first (a stat after an open
    // showed another inode; seen on io_uring, where FORGET travels on
    // /dev/fuse beside the ring's LOOKUPs).
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    fs::create_dir_all(&tree).unwrap();
    fs::write(tree.join("f"), "f").unwrap();
    let fs = new_fs(dir.path());
    fs.create_sandbox("s", &[mapping("/t", &tree, false)])
        .unwrap();
    let t = walk(&fs, "/s/t").unwrap();
    let name = OsStr::new("f");
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        // Lookups the kernel drops at once (a revalidation's).
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let ino = fs.lookup(t, name).unwrap().ino;
                fs.forget(ino, 1);
            }
        });
        // A process holding the name between two lookups of it.
        for round in 0..200_000 {
            let held = fs.lookup(t, name).unwrap().ino;
            let again = fs.lookup(t, name).unwrap().ino;
            if again != held {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                panic!("round {round}: inode {again} for a name the kernel holds as {held}");
            }
            fs.forget(held, 2);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
}

#[test]
fn a_renamed_directory_takes_its_known_children_along() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    let fs = new_fs(dir.path());
    fs.create_sandbox("s", &[mapping("/w", &scratch, true)])
        .unwrap();
    let w = walk(&fs, "/s/w").unwrap();
    let a = fs
        .mkdir(w, OsStr::new("a"), 0o755, ROOT_CALLER)
        .unwrap()
        .ino;
    let (file, fh) = fs
        .create(a, OsStr::new("f"), 0o644, libc::O_WRONLY, ROOT_CALLER)
        .unwrap();
    fs.write(file.ino, fh.fh, 0, b"data").unwrap();
    fs.release(fh.fh);
    fs.rename(w, OsStr::new("a"), w, OsStr::new("b"), 0)
        .unwrap();
    // The file's inode now resolves under its new parent name.
    assert_eq!(fs.getattr(file.ino, None).unwrap().size, 4);
    assert_eq!(fs::read_to_string(scratch.join("b/f")).unwrap(), "data");
    let opened = fs.open(file.ino, libc::O_RDONLY).unwrap();
    assert_eq!(fs.read(file.ino, opened.fh, 0, 100).unwrap(), b"data");
    fs.release(opened.fh);
    assert_eq!(fs.open_handles(), 0);
}

#[test]
fn read_only_nodes_refuse_changes_before_touching_disk() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    fs::write(&file, "f").unwrap();
    let fs = new_fs(dir.path());
    fs.create_sandbox("s", &[mapping("/f", &file, false)])
        .unwrap();
    let ino = walk(&fs, "/s/f").unwrap();
    assert_eq!(
        errno(fs.open(ino, libc::O_RDWR).map(|o| o.fh)),
        Err(Errno::EPERM)
    );
    let truncate = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    assert_eq!(
        errno(fs.setattr(ino, &truncate).map(|a| a.size)),
        Err(Errno::EPERM)
    );
    let s = walk(&fs, "/s").unwrap();
    assert_eq!(errno(fs.unlink(s, OsStr::new("f"))), Err(Errno::EPERM));
    assert_eq!(fs::read_to_string(&file).unwrap(), "f");
}

/// Lazy entries of files `names` in `dir`, counting how often they are made.
struct CountedEntries {
    dir: std::path::PathBuf,
    names: Vec<&'static str>,
    made: Arc<std::sync::atomic::AtomicUsize>,
}

impl LazyEntries for CountedEntries {
    fn len(&self) -> usize {
        self.names.len()
    }

    fn make(self: Box<Self>, _this: &Weak<Node>) -> Vec<(Name, Arc<Node>)> {
        self.made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let anchor = Arc::new(crate::sandbox::dirfd::Anchor::deferred(
            self.dir.clone(),
            None,
        ));
        self.names
            .iter()
            .map(|name| {
                let location = Location {
                    anchor: anchor.clone(),
                    name: Name::new(OsStr::new(name)),
                };
                let node = Node::new_untyped(false, Origin::Mapped(location));
                (Name::new(OsStr::new(name)), Arc::new(node))
            })
            .collect()
    }
}

/// Directories `inputs` and `scratch`, made in `dir`.
fn inputs_and_scratch(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (inputs, scratch) = (dir.join("inputs"), dir.join("scratch"));
    fs::create_dir_all(&inputs).unwrap();
    fs::create_dir_all(&scratch).unwrap();
    (inputs, scratch)
}

/// A lazy directory that cannot go where it is asked for refuses the
/// whole create, saying which path and why; nothing is published.
#[test]
fn a_lazy_directory_that_cannot_be_grafted_is_refused_naming_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let (inputs, scratch) = inputs_and_scratch(dir.path());
    fs::write(inputs.join("file"), "f").unwrap();
    let fs = new_fs(dir.path());
    let entries = || -> Box<dyn LazyEntries> {
        Box::new(CountedEntries {
            dir: inputs.clone(),
            names: vec!["a"],
            made: Arc::default(),
        })
    };
    let create = |id: &str, lazy: Vec<&str>| {
        let mut draft = crate::sandbox::layout::Draft::new(Some(id));
        let bytes = |path: &Path| std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).to_vec();
        draft.add(0, "/ws", &bytes(&scratch), true);
        draft.add(1, "/ws/file", &bytes(&inputs.join("file")), false);
        let draft = draft.finish(&dir.path().join("mnt")).unwrap();
        let lazy = lazy
            .into_iter()
            .map(|path| (path.to_owned(), entries()))
            .collect();
        fs.create_drafted_lazy(id, draft, lazy, 3).unwrap_err()
    };
    let below_a_file = create("a", vec!["/ws/file/lib"]);
    assert!(
        matches!(&below_a_file, SandboxError::Lazy { id, why: GraftError::FileInTheWay { path } }
            if id == "a" && path == "/ws/file/lib"),
        "{below_a_file}"
    );
    assert_eq!(
        below_a_file.to_string(),
        "sandbox \"a\": lazy directory \"/ws/file/lib\": a file is in the way"
    );
    let twice = create("b", vec!["/ws/lib", "/ws/lib"]);
    assert!(
        matches!(&twice, SandboxError::Lazy { why: GraftError::Taken { path }, .. } if path == "ws/lib"),
        "{twice}"
    );
    let top = create("c", vec!["/"]);
    assert!(
        matches!(
            &top,
            SandboxError::Lazy {
                why: GraftError::NotBelowTop { .. },
                ..
            }
        ),
        "{top}"
    );
    assert!(fs.sandbox_ids().is_empty(), "{:?}", fs.sandbox_ids());
}

#[test]
fn a_lazy_directory_is_made_once_at_the_first_lookup_into_it() {
    let dir = tempfile::tempdir().unwrap();
    let (inputs, scratch) = inputs_and_scratch(dir.path());
    let names: Vec<&'static str> = vec!["a", "b", "c", "d", "e", "f", "g", "h"];
    for name in &names {
        fs::write(inputs.join(name), name).unwrap();
    }
    let fs = new_fs(dir.path());
    let create = |id: &str, made: &Arc<std::sync::atomic::AtomicUsize>| {
        let mut draft = crate::sandbox::layout::Draft::new(Some(id));
        draft.add(
            0,
            "/ws",
            std::os::unix::ffi::OsStrExt::as_bytes(scratch.as_os_str()),
            true,
        );
        let draft = draft.finish(&dir.path().join("mnt")).unwrap();
        let entries = CountedEntries {
            dir: inputs.clone(),
            names: names.clone(),
            made: made.clone(),
        };
        fs.create_drafted_lazy(id, draft, vec![("/ws/lib".into(), Box::new(entries))], 9)
            .unwrap();
    };
    let made = |count: &Arc<std::sync::atomic::AtomicUsize>| {
        count.load(std::sync::atomic::Ordering::SeqCst)
    };

    let first = Arc::default();
    create("s", &first);
    // Reaching the directory itself, or listing its parent, makes nothing.
    walk(&fs, "s/ws/lib").unwrap();
    let ws = walk(&fs, "s/ws").unwrap();
    let listed = fs.list(ws).unwrap();
    assert!(listed.iter().any(|name| name == "lib"), "{listed:?}");
    assert_eq!(made(&first), 0);
    // Eight lookups at once into it make it once, and each finds its file.
    std::thread::scope(|scope| {
        for name in &names {
            let fs = &fs;
            scope.spawn(move || walk(fs, &format!("s/ws/lib/{name}")).unwrap());
        }
    });
    assert_eq!(made(&first), 1);
    assert_eq!(
        errno(fs.lookup(walk(&fs, "s/ws/lib").unwrap(), OsStr::new("z"))).unwrap_err(),
        Errno::ENOENT
    );
    assert_eq!(made(&first), 1);

    // Nor does a create, or a destroy, of a sandbox that never reached it.
    let second = Arc::default();
    create("t", &second);
    fs.destroy_sandbox("t").unwrap();
    assert_eq!(made(&second), 0);
}

#[test]
fn a_destroyed_native_sandboxs_link_is_not_kept_for_its_cache() {
    // A symlink has nothing below it for the kernel to cache: keeping it
    // in the retention queue (and sending it to the reaper) only made work
    // at every destroy. A tree is kept, for the next sandbox to take over.
    let dir = tempfile::tempdir().unwrap();
    let links = dir.path().join("links");
    fs::create_dir(&links).unwrap();
    std::os::unix::fs::symlink(dir.path(), links.join("n")).unwrap();
    let fs = new_fs(dir.path());
    let anchor = Arc::new(crate::sandbox::dirfd::Anchor::open(&links, None).unwrap());
    fs.create_sandbox_link("n", anchor, OsStr::new("n"))
        .unwrap();
    walk(&fs, "/n").unwrap();
    fs.destroy_sandbox("n").unwrap();
    assert_eq!(walk(&fs, "/n"), Err(Errno::ENOENT));
    assert!(fs.retention.latest(8).is_empty(), "the link was kept");
    fs.create_sandbox("t", &[mapping("/f", &links, false)])
        .unwrap();
    walk(&fs, "/t/f").unwrap();
    fs.destroy_sandbox("t").unwrap();
    let kept: Vec<_> = fs
        .retention
        .latest(8)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(kept, ["t"], "a tree is kept");
}
