//! The one harness of every serve test file: `actionfs serve` backends
//! on a [`Place`] (an exec root and a sandbox base, the backend's own or
//! shared by several), the typed client, and checks that they built
//! sandboxes as asked and left nothing behind.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use actionfs_protocol::backend::digest::{digest_of, sha256_hex};
use actionfs_protocol::backend::reapi;
use actionfs_protocol::backend::sandbox::{
    self, collect, content, create, destroy, Content, Manifest, Push, Retention,
};
use actionfs_protocol::backend::tree::{Tree, TreeBuilder};

use crate::serve::{state_dir_name, warm_dir_name, ServeProcess, LOGGED};
use crate::{bin, mounts_below, transport};

pub const WS: &str = "ws";

/// Below this many mappings a sandbox is built natively: of
/// [`Place::inputs_tree`]s, one of 2 inputs is native, one of 40 is in
/// the FUSE view.
pub const NATIVE_BELOW: &str = "--native_below=10";

/// Where a test's backends work: a directory in /var/tmp holding the exec
/// root (`execroot/ws`, the workspace's default places) and the sandbox
/// base. Backends share a place as a user's backends share a base: one
/// after another, or at once. A clone is another handle on the same
/// place; when the last goes, whatever is still mounted below the base is
/// detached, so that the directories can go too.
#[derive(Clone)]
pub struct Place(Arc<PlaceDirs>);

struct PlaceDirs {
    root: tempfile::TempDir,
    base: PathBuf,
    /// The base, when made elsewhere than in `root`.
    _base_dir: Option<tempfile::TempDir>,
}

impl Drop for PlaceDirs {
    /// What a failed test left mounted goes, so that the temporary
    /// directories can.
    fn drop(&mut self) {
        for mount in mounts_below(&self.base) {
            let _ = Command::new("umount").arg("-l").arg(&mount).status();
        }
    }
}

impl Default for Place {
    fn default() -> Place {
        Place::new()
    }
}

impl Place {
    /// Everything in /var/tmp: below /tmp, which Bazel's jail leaves
    /// writable, `serve` builds no native sandbox.
    pub fn new() -> Place {
        let root = Place::make_root();
        let base = root.path().join("base");
        fs::create_dir(&base).unwrap();
        Place(Arc::new(PlaceDirs {
            root,
            base,
            _base_dir: None,
        }))
    }

    /// A place whose sandbox base is a directory made in `parent` (whose
    /// file system decides what `auto` picks), its exec root in /var/tmp,
    /// where Bazel's jail leaves it read-only as it does Bazel's own.
    pub fn on(parent: &Path) -> Place {
        let root = Place::make_root();
        let base_dir = tempfile::tempdir_in(parent).unwrap();
        Place(Arc::new(PlaceDirs {
            root,
            base: base_dir.path().to_owned(),
            _base_dir: Some(base_dir),
        }))
    }

    fn make_root() -> tempfile::TempDir {
        let root = tempfile::tempdir_in("/var/tmp").unwrap();
        fs::create_dir_all(root.path().join("execroot").join(WS)).unwrap();
        root
    }

    /// The test's own directory (logs, scratch, what Collect fills).
    pub fn path(&self) -> &Path {
        self.0.root.path()
    }

    pub fn base(&self) -> &Path {
        &self.0.base
    }

    pub fn exec_root(&self) -> PathBuf {
        self.path().join("execroot")
    }

    /// A file of the workspace's exec root (the default place).
    pub fn write_input(&self, rel: &str, bytes: &[u8]) -> reapi::Digest {
        let path = self.exec_root().join(WS).join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, bytes).unwrap();
        digest_of(bytes)
    }

    /// A Manifest of `tree` for this place's exec root, with `outputs`
    /// (key, "file" or "dir").
    pub fn manifest(&self, tree: &Tree, outputs: &[(&str, &str)]) -> Manifest {
        Manifest {
            mnemonic: "Test".into(),
            exec_root: self.exec_root().display().to_string(),
            hash_function: "SHA-256".into(),
            input_root_digest: Some(tree.root.clone()),
            outputs: outputs
                .iter()
                .map(|(key, kind)| {
                    (
                        key.to_string(),
                        sandbox::Output {
                            r#type: kind.to_string(),
                            dest: String::new(),
                        },
                    )
                })
                .collect(),
            writable_dirs: HashMap::new(),
            confinement_setting: None,
        }
    }

    /// A tree of `files` inputs at their default places: `ws/inFILES/fN`
    /// holds "input N of FILES".
    pub fn inputs_tree(&self, files: usize) -> Tree {
        let mut tb = TreeBuilder::new();
        for n in 0..files {
            let rel = format!("in{files}/f{n}");
            let digest = self.write_input(&rel, format!("input {n} of {files}\n").as_bytes());
            tb.add_file(&format!("{WS}/{rel}"), digest, false).unwrap();
        }
        tb.build()
    }

    /// The sorted names on the base but the state backends keep and hand
    /// on ([`warm_dir_name`], [`state_dir_name`]: the subjects of their
    /// own tests): backends' own directories, and whatever else is there.
    pub fn names_on_base(&self) -> Vec<String> {
        let (warm, state) = (warm_dir_name(), state_dir_name());
        let mut names: Vec<String> = fs::read_dir(self.base())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| *name != warm && *name != state)
            .collect();
        names.sort();
        names
    }
}

/// One running `actionfs serve` on a [`Place`].
pub struct Backend {
    serve: ServeProcess,
    place: Place,
}

/// The process's own methods (client, log, stats, wait...) are the
/// backend's.
impl std::ops::Deref for Backend {
    type Target = ServeProcess;
    fn deref(&self) -> &ServeProcess {
        &self.serve
    }
}

impl std::ops::DerefMut for Backend {
    fn deref_mut(&mut self) -> &mut ServeProcess {
        &mut self.serve
    }
}

impl Backend {
    /// A backend on a place of its own.
    pub fn start(options: &[&str]) -> Backend {
        Backend::start_in(&Place::new(), "backend", options)
    }

    /// A backend on a place of its own whose base is made in `parent`
    /// ([`Place::on`]).
    pub fn start_on(parent: &Path, options: &[&str]) -> Backend {
        Backend::start_in(&Place::on(parent), "backend", options)
    }

    /// A backend on `place`, logging to `NAME.log` there.
    pub fn start_in(place: &Place, name: &str, options: &[&str]) -> Backend {
        Backend::start_with(place, WS, name, options, LOGGED)
    }

    /// As [`Backend::start_in`], for workspace `workspace` of the exec
    /// root (another output base's, say), with `env` for the process.
    pub fn start_with(
        place: &Place,
        workspace: &str,
        name: &str,
        options: &[&str],
        env: &[(&str, &str)],
    ) -> Backend {
        let log = place.path().join(format!("{name}.log"));
        let serve = ServeProcess::spawn(bin(), &place.exec_root().join(workspace), Some(&log), env);
        serve.negotiate_or_panic(place.base(), transport(), options);
        Backend {
            serve,
            place: place.clone(),
        }
    }

    /// The test's own directory ([`Place::path`]).
    pub fn root(&self) -> &Path {
        self.place.path()
    }

    pub fn base(&self) -> &Path {
        self.place.base()
    }

    pub fn exec_root(&self) -> PathBuf {
        self.place.exec_root()
    }

    /// A file of the workspace's exec root (the default place).
    pub fn write_input(&self, rel: &str, bytes: &[u8]) -> reapi::Digest {
        self.place.write_input(rel, bytes)
    }

    /// Pushes the tree's blobs and each of `inline` as content, in one
    /// Push (as Bazel's client sends them).
    pub fn push_tree_with_inline(&self, tree: &Tree, inline_bytes: &[&[u8]]) {
        let mut push = tree.to_push();
        push.content = inline_bytes
            .iter()
            .map(|bytes| (sha256_hex(bytes), inline(bytes)))
            .collect();
        self.client().push(push).unwrap();
    }

    pub fn push_inline(&self, bytes: &[u8]) {
        self.push_content(sha256_hex(bytes), inline(bytes));
    }

    /// Pushes one content entry under `hash`, and no blobs.
    pub fn push_content(&self, hash: String, content: Content) {
        self.client()
            .push(Push {
                blobs: HashMap::new(),
                content: [(hash, content)].into(),
            })
            .unwrap();
    }

    pub fn manifest(&self, tree: &Tree, outputs: &[(&str, &str)]) -> Manifest {
        self.place.manifest(tree, outputs)
    }

    /// Pushes `tree` (a [`Place::inputs_tree`] of `files` inputs), creates
    /// sandbox `id` of it, checks that input `n` reads right there,
    /// destroys it.
    pub fn serve_inputs_tree(&self, tree: &Tree, id: &str, (files, n): (usize, usize)) {
        self.push_tree(tree);
        let root = self.create_ok(id, self.manifest(tree, &[("/ws/out/o", "file")]));
        let read = fs::read_to_string(root.join(WS).join(format!("in{files}/f{n}"))).unwrap();
        assert_eq!(read, format!("input {n} of {files}\n"), "{}", self.log());
        assert!(self.client().destroy(id).is_ok());
    }

    pub fn create_error(&self, id: &str, manifest: Manifest) -> String {
        match self.client().create(id, manifest).unwrap().outcome {
            Some(create::result::Outcome::Error(e)) => e.message,
            other => panic!("create {id}: expected an error, got {other:?}"),
        }
    }

    /// Collects `id` into a fresh exec root below the test's directory,
    /// expecting Ok; returns that exec root.
    pub fn collect_ok(&self, id: &str) -> PathBuf {
        let collected = self.root().join(format!("collected-{id}"));
        match self
            .client()
            .collect(id, &collected.display().to_string())
            .unwrap()
            .outcome
        {
            Some(collect::result::Outcome::Ok(_)) => collected,
            other => panic!("collect {id}: {other:?}\n{}", self.log()),
        }
    }

    pub fn destroy_ok(&self, id: &str) {
        match self.client().destroy(id).unwrap().outcome {
            Some(destroy::result::Outcome::Ok(_)) => {}
            other => panic!("destroy {id}: {other:?}\n{}", self.log()),
        }
    }

    /// Closes stdin and checks the backend exited 0 and left nothing.
    pub fn close(mut self) {
        self.close_and_expect_exit_0();
        assert_nothing_left(self.base(), &self.log());
    }

    /// Closes stdin and checks the backend exited 0; what is on the base
    /// is the test's to check, since other backends may share it.
    pub fn close_sharing_base(mut self) {
        self.close_and_expect_exit_0();
    }

    fn close_and_expect_exit_0(&mut self) {
        self.close_input().unwrap();
        let status = self.wait();
        assert!(status.success(), "exit {status:?}\n{}", self.log());
    }
}

/// Nothing left below `base` but the store handed on to the next
/// backend (`actionfs-warm-UID`: its index and content directories) and
/// the state directory (`actionfs-state-UID`: its lock, the stashed
/// trees, the list of where looks found files and the directory blobs
/// handed on).
pub fn assert_nothing_left(base: &Path, log: &str) {
    let warm = base.join(warm_dir_name());
    let state = base.join(state_dir_name());
    let left: Vec<_> = fs::read_dir(base)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|path| *path != warm && *path != state)
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}\n{log}");
    if warm.exists() {
        let mut handed: Vec<_> = fs::read_dir(&warm)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        handed.sort();
        assert_eq!(handed, ["c", "index", "x"], "{log}");
    }
    if state.exists() {
        for entry in fs::read_dir(&state).unwrap() {
            let name = entry.unwrap().file_name();
            assert!(
                ["lock", "stashes", "looks", "directories"].contains(&name.to_str().unwrap()),
                "{name:?} left in {state:?}\n{log}"
            );
        }
    }
    let mounts = mounts_below(base);
    assert!(
        mounts.is_empty(),
        "mounts are left below {base:?}: {mounts:?}"
    );
}

pub fn inline(bytes: &[u8]) -> Content {
    Content {
        source: Some(content::Source::Inline(bytes.to_vec())),
        retention: Retention::Reuse as i32,
    }
}

/// Content Bazel names by where it is (absolute, or relative to the
/// workspace's parent), kept for reuse.
pub fn located_at(location: &str) -> Content {
    Content {
        source: Some(content::Source::Location(location.into())),
        retention: Retention::Reuse as i32,
    }
}

pub fn modes() -> Vec<(&'static str, &'static str)> {
    vec![
        ("fuse", "--native_below=0"),
        ("native", "--native_below=1000000000"),
    ]
}

/// Checks that `mode` ("fuse...", or "native") is what `b` built: its own
/// counters of how sandboxes were built, and the file system the action's
/// workspace at `root` is on. Were `--native_below` ignored, a "native"
/// run would compare FUSE with FUSE and pass.
pub fn assert_built_as(b: &Backend, mode: &str, root: &Path) {
    let stats = b.stats();
    let count = |how: &str| {
        stats["built"][how]
            .as_u64()
            .unwrap_or_else(|| panic!("no built count {how:?} in {stats}"))
    };
    let native = count("native") + count("stash");
    let fuse = count("fuse") + count("fuse_fallback");
    let on_fuse = nix::sys::statfs::statfs(&root.join(WS))
        .unwrap_or_else(|err| panic!("statfs {root:?}/{WS}: {err}"))
        .filesystem_type()
        == nix::sys::statfs::FUSE_SUPER_MAGIC;
    if mode.starts_with("fuse") {
        assert!(
            fuse > 0 && native == 0 && on_fuse,
            "{mode}: built {} (workspace on FUSE: {on_fuse})",
            stats["built"]
        );
    } else {
        assert_eq!(mode, "native");
        assert!(
            native > 0 && fuse == 0 && !on_fuse,
            "{mode}: built {} (workspace on FUSE: {on_fuse})",
            stats["built"]
        );
    }
}

pub fn shown(out: &std::process::Output) -> String {
    format!(
        "status {:?}, stdout {:?}, stderr {:?}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
