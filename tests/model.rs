//! Property test: random sequences of create, destroy, lookup, list, read
//! and write on the file-system core give the same answers as a naive
//! reference model that computes every path directly from the mapping list.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::path::Path;

use actionfs::sandbox::tree::{Caller, Errno, FileKind, FsConfig, SandboxFs, ROOT_INO};
use actionfs_protocol::ResolvedMapping;
use proptest::prelude::*;

const NAMES: [&str; 3] = ["a", "b", "c"];
const IDS: [&str; 3] = ["s0", "s1", "s2"];

/// Where a mapping points.
#[derive(Clone, Debug)]
enum Source {
    /// `files/f{n}`, holding `content-{n}`.
    File(usize),
    /// `srcdir`: files `a` and `x`, directory `b` holding `c`.
    Dir,
    /// The sandbox's own writable scratch directory.
    Scratch,
}

#[derive(Clone, Debug)]
struct MappingSpec {
    path: Vec<&'static str>,
    source: Source,
}

#[derive(Clone, Debug)]
enum Op {
    Create {
        id: usize,
        mappings: Vec<MappingSpec>,
    },
    Destroy {
        id: usize,
    },
    Lookup {
        id: usize,
        path: Vec<&'static str>,
    },
    List {
        id: usize,
        path: Vec<&'static str>,
    },
    Write {
        id: usize,
        name: &'static str,
        content: u8,
    },
}

fn path_strategy() -> impl Strategy<Value = Vec<&'static str>> {
    prop::collection::vec(prop::sample::select(&NAMES[..]), 1..=3)
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let source = prop_oneof![
        (0..3usize).prop_map(Source::File),
        Just(Source::Dir),
        Just(Source::Scratch),
    ];
    let mapping = (path_strategy(), source).prop_map(|(path, source)| MappingSpec { path, source });
    let any_path = prop::collection::vec(prop::sample::select(&NAMES[..]), 0..=4);
    prop_oneof![
        2 => (0..3usize, prop::collection::vec(mapping, 0..5))
            .prop_map(|(id, mappings)| Op::Create { id, mappings }),
        1 => (0..3usize).prop_map(|id| Op::Destroy { id }),
        4 => (0..3usize, any_path.clone()).prop_map(|(id, path)| Op::Lookup { id, path }),
        2 => (0..3usize, any_path).prop_map(|(id, path)| Op::List { id, path }),
        2 => (0..3usize, prop::sample::select(&NAMES[..]), any::<u8>())
            .prop_map(|(id, name, content)| Op::Write { id, name, content }),
    ]
}

/// What the model says a path is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Dir,
    File(String),
}

/// A sandbox in the model: its mappings (valid, in order) and the files of
/// its scratch directory.
#[derive(Clone, Debug, Default)]
struct ModelSandbox {
    mappings: Vec<MappingSpec>,
    scratch: BTreeMap<String, String>,
}

fn dir_source_entry(rel: &[&str]) -> Option<Seen> {
    match rel {
        [] | ["b"] => Some(Seen::Dir),
        ["a"] => Some(Seen::File("dir-a".into())),
        ["x"] => Some(Seen::File("dir-x".into())),
        ["b", "c"] => Some(Seen::File("dir-b-c".into())),
        _ => None,
    }
}

fn dir_source_names(rel: &[&str]) -> Vec<String> {
    match rel {
        [] => vec!["a".into(), "b".into(), "x".into()],
        ["b"] => vec!["c".into()],
        _ => vec![],
    }
}

impl ModelSandbox {
    /// Why these mappings cannot form a sandbox, if they cannot.
    fn invalid(mappings: &[MappingSpec]) -> bool {
        let is_file = |m: &MappingSpec| matches!(m.source, Source::File(_));
        mappings.iter().enumerate().any(|(i, m)| {
            mappings[..i].iter().any(|earlier| {
                earlier.path == m.path
                    // Something below a file, either way round.
                    || (is_file(earlier) && m.path.starts_with(&earlier.path))
                    || (is_file(m) && earlier.path.starts_with(&m.path))
            })
        })
    }

    fn seen(&self, path: &[&str]) -> Option<Seen> {
        if path.is_empty() {
            return Some(Seen::Dir);
        }
        // A path leading to a deeper mapping is a directory.
        if self
            .mappings
            .iter()
            .any(|m| m.path.len() > path.len() && m.path.starts_with(path))
        {
            return Some(Seen::Dir);
        }
        // Otherwise the deepest mapping covering it decides.
        let cover = self
            .mappings
            .iter()
            .filter(|m| path.starts_with(&m.path))
            .max_by_key(|m| m.path.len())?;
        let rel = &path[cover.path.len()..];
        match (&cover.source, rel) {
            (Source::File(n), []) => Some(Seen::File(format!("content-{n}"))),
            (Source::File(_), _) => None,
            (Source::Dir, rel) => dir_source_entry(rel),
            (Source::Scratch, []) => Some(Seen::Dir),
            (Source::Scratch, [name]) => self.scratch.get(*name).map(|c| Seen::File(c.clone())),
            (Source::Scratch, _) => None,
        }
    }

    fn list(&self, path: &[&str]) -> Option<BTreeSet<String>> {
        if self.seen(path)? != Seen::Dir {
            return None;
        }
        let mut candidates: BTreeSet<String> = BTreeSet::new();
        for m in &self.mappings {
            if m.path.len() > path.len() && m.path.starts_with(path) {
                candidates.insert(m.path[path.len()].to_owned());
            }
            if path.starts_with(&m.path) {
                let rel = &path[m.path.len()..];
                match m.source {
                    Source::Dir => candidates.extend(dir_source_names(rel)),
                    Source::Scratch if rel.is_empty() => {
                        candidates.extend(self.scratch.keys().cloned())
                    }
                    _ => {}
                }
            }
        }
        let kept = candidates
            .into_iter()
            .filter(|name| {
                let mut child = path.to_vec();
                child.push(name);
                self.seen(&child).is_some()
            })
            .collect();
        Some(kept)
    }

    /// The scratch mapping a write of `name` goes to, if the name there is
    /// not taken by a mapping.
    fn writable_target(&self, name: &str) -> Option<Vec<&'static str>> {
        let scratch = self
            .mappings
            .iter()
            .find(|m| matches!(m.source, Source::Scratch))?;
        let mut target = scratch.path.clone();
        target.push(NAMES.iter().find(|n| **n == name).unwrap());
        // Writable only if the scratch mapping is what covers the name.
        let covering = self
            .mappings
            .iter()
            .filter(|m| target.starts_with(&m.path))
            .max_by_key(|m| m.path.len())?;
        let shadowed = self
            .mappings
            .iter()
            .any(|m| m.path.len() > scratch.path.len() && m.path.starts_with(&target));
        (matches!(covering.source, Source::Scratch) && !shadowed).then_some(target)
    }
}

struct Harness {
    dir: tempfile::TempDir,
    fs: SandboxFs,
    scratch_count: usize,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        for n in 0..3 {
            fs::create_dir_all(dir.path().join("files")).unwrap();
            fs::write(
                dir.path().join(format!("files/f{n}")),
                format!("content-{n}"),
            )
            .unwrap();
        }
        fs::create_dir_all(dir.path().join("srcdir/b")).unwrap();
        fs::write(dir.path().join("srcdir/a"), "dir-a").unwrap();
        fs::write(dir.path().join("srcdir/x"), "dir-x").unwrap();
        fs::write(dir.path().join("srcdir/b/c"), "dir-b-c").unwrap();
        let config = FsConfig {
            mount_point: dir.path().join("mnt"),
            xattrs: false,
            track_access: false,
        };
        let fs = SandboxFs::new(config, &[]).unwrap();
        Harness {
            dir,
            fs,
            scratch_count: 0,
        }
    }

    fn resolve(&self, spec: &MappingSpec, scratch: &Path) -> ResolvedMapping {
        let underlying = match spec.source {
            Source::File(n) => self.dir.path().join(format!("files/f{n}")),
            Source::Dir => self.dir.path().join("srcdir"),
            Source::Scratch => scratch.to_owned(),
        };
        ResolvedMapping {
            path: format!("/{}", spec.path.join("/")),
            underlying,
            writable: matches!(spec.source, Source::Scratch),
        }
    }

    fn walk(&self, id: &str, path: &[&str]) -> Result<(u64, FileKind), Errno> {
        let mut attr = self.fs.lookup(ROOT_INO, OsStr::new(id))?;
        for name in path {
            attr = self.fs.lookup(attr.ino, OsStr::new(name))?;
        }
        Ok((attr.ino, attr.kind))
    }

    fn observe(&self, id: &str, path: &[&str]) -> Option<Seen> {
        let (ino, kind) = self.walk(id, path).ok()?;
        if kind == FileKind::Directory {
            return Some(Seen::Dir);
        }
        let opened = self.fs.open(ino, libc::O_RDONLY).unwrap();
        let data = self.fs.read(ino, opened.fh, 0, 4096).unwrap();
        self.fs.release(opened.fh);
        Some(Seen::File(String::from_utf8(data).unwrap()))
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut h = Harness::new();
    let mut model: BTreeMap<usize, ModelSandbox> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Create { id, mappings } => {
                h.scratch_count += 1;
                let scratch = h.dir.path().join(format!("scratch{}", h.scratch_count));
                fs::create_dir(&scratch).unwrap();
                let resolved: Vec<_> = mappings.iter().map(|m| h.resolve(m, &scratch)).collect();
                let result = h.fs.create_sandbox(IDS[id], &resolved);
                let expect_ok = !model.contains_key(&id) && !ModelSandbox::invalid(&mappings);
                prop_assert_eq!(
                    result.is_ok(),
                    expect_ok,
                    "create {} {:?}: {:?}",
                    id,
                    mappings,
                    result
                );
                if expect_ok {
                    model.insert(
                        id,
                        ModelSandbox {
                            mappings,
                            scratch: BTreeMap::new(),
                        },
                    );
                }
            }
            Op::Destroy { id } => {
                let result = h.fs.destroy_sandbox(IDS[id]);
                prop_assert_eq!(result.is_ok(), model.remove(&id).is_some());
            }
            Op::Lookup { id, path } => {
                let expected = model.get(&id).and_then(|s| s.seen(&path));
                prop_assert_eq!(
                    h.observe(IDS[id], &path),
                    expected,
                    "lookup {} {:?}",
                    id,
                    path
                );
            }
            Op::List { id, path } => {
                let expected = model.get(&id).and_then(|s| s.list(&path));
                let got = h.walk(IDS[id], &path).ok().and_then(|(ino, kind)| {
                    (kind == FileKind::Directory).then(|| {
                        h.fs.list(ino)
                            .unwrap()
                            .into_iter()
                            .map(|n| n.into_string().unwrap())
                            .collect()
                    })
                });
                prop_assert_eq!(got, expected, "list {} {:?}", id, path);
            }
            Op::Write { id, name, content } => {
                let Some(sandbox) = model.get_mut(&id) else {
                    continue;
                };
                let target = sandbox.writable_target(name);
                let text = format!("written-{content}");
                let Some(target) = target else { continue };
                let (dir, _) = h.walk(IDS[id], &target[..target.len() - 1]).unwrap();
                let (ino, fh) = match h.fs.lookup(dir, OsStr::new(name)) {
                    Ok(attr) => (
                        attr.ino,
                        h.fs.open(attr.ino, libc::O_WRONLY | libc::O_TRUNC)
                            .unwrap()
                            .fh,
                    ),
                    Err(_) => {
                        let (attr, opened) =
                            h.fs.create(
                                dir,
                                OsStr::new(name),
                                0o644,
                                libc::O_WRONLY,
                                Caller { uid: 0, gid: 0 },
                            )
                            .unwrap();
                        (attr.ino, opened.fh)
                    }
                };
                h.fs.write(ino, fh, 0, text.as_bytes()).unwrap();
                h.fs.release(fh);
                sandbox.scratch.insert(name.to_owned(), text);
            }
        }
    }
    prop_assert_eq!(h.fs.open_handles(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("ACTIONFS_MODEL_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_core_matches_the_reference_model(ops in prop::collection::vec(op_strategy(), 1..40)) {
        run(ops)?;
    }
}
