//! One `actionfs serve` backend for a test, as every serve test file uses
//! it: its own exec root and sandbox base, the typed client, and checks
//! that it built sandboxes as asked and left nothing behind.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use actionfs_protocol::backend::digest::{digest_of, sha256_hex};
use actionfs_protocol::backend::reapi;
use actionfs_protocol::backend::sandbox::{
    self, collect, content, create, destroy, Content, Manifest, Push, Retention,
};
use actionfs_protocol::backend::tree::Tree;

use crate::serve::{ServeProcess, LOGGED};
use crate::{bin, transport};

pub const WS: &str = "ws";

/// One running `actionfs serve`, with a workspace exec root of its own.
pub struct Backend {
    serve: ServeProcess,
    pub root: tempfile::TempDir,
    /// The sandbox base (`root/base` unless made elsewhere).
    pub base: PathBuf,
    _base_dir: Option<tempfile::TempDir>,
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
    /// Everything in /var/tmp: below /tmp, which Bazel's jail leaves
    /// writable, `serve` builds no native sandbox.
    pub fn start(options: &[&str]) -> Backend {
        let root = tempfile::tempdir_in("/var/tmp").unwrap();
        let base = root.path().join("base");
        Backend::start_at(root, None, base, options)
    }

    /// A backend whose sandbox base is a directory made in `parent` (whose
    /// file system decides what `auto` picks), its exec root in /var/tmp,
    /// where Bazel's jail leaves it read-only as it does Bazel's own.
    pub fn start_on(parent: &Path, options: &[&str]) -> Backend {
        let root = tempfile::tempdir_in("/var/tmp").unwrap();
        let base_dir = tempfile::tempdir_in(parent).unwrap();
        let base = base_dir.path().to_owned();
        Backend::start_at(root, Some(base_dir), base, options)
    }

    pub fn start_at(
        root: tempfile::TempDir,
        base_dir: Option<tempfile::TempDir>,
        base: PathBuf,
        options: &[&str],
    ) -> Backend {
        Backend::start_with(root, base_dir, base, options, LOGGED)
    }

    /// As [`Backend::start_at`], with `env` for the backend process.
    pub fn start_with(
        root: tempfile::TempDir,
        base_dir: Option<tempfile::TempDir>,
        base: PathBuf,
        options: &[&str],
        env: &[(&str, &str)],
    ) -> Backend {
        fs::create_dir_all(&base).unwrap();
        let workspace = root.path().join("execroot").join(WS);
        fs::create_dir_all(&workspace).unwrap();
        let log = root.path().join("backend.log");
        let serve = ServeProcess::spawn(bin(), &workspace, Some(&log), env);
        serve.negotiate_or_panic(&base, transport(), options);
        Backend {
            serve,
            root,
            base,
            _base_dir: base_dir,
        }
    }

    pub fn exec_root(&self) -> PathBuf {
        self.root.path().join("execroot")
    }

    /// A file of the workspace's exec root (the default place).
    pub fn write_input(&self, rel: &str, bytes: &[u8]) -> reapi::Digest {
        let path = self.exec_root().join(WS).join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, bytes).unwrap();
        digest_of(bytes)
    }

    pub fn push_inline(&self, bytes: &[u8]) {
        self.client()
            .push(Push {
                blobs: HashMap::new(),
                content: [(sha256_hex(bytes), inline(bytes))].into(),
            })
            .unwrap();
    }

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

    pub fn create_error(&self, id: &str, manifest: Manifest) -> String {
        match self.client().create(id, manifest).unwrap().outcome {
            Some(create::result::Outcome::Error(e)) => e.message,
            other => panic!("create {id}: expected an error, got {other:?}"),
        }
    }

    /// Collects `id` into a fresh exec root below the test's directory,
    /// expecting Ok; returns that exec root.
    pub fn collect_ok(&self, id: &str) -> PathBuf {
        let collected = self.root.path().join(format!("collected-{id}"));
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
        self.close_input().unwrap();
        let status = self.wait();
        assert!(status.success(), "exit {status:?}\n{}", self.log());
        assert_nothing_left(&self.base, &self.log());
    }
}

impl Drop for Backend {
    /// Whatever a failed test left mounted goes, so that the temporary
    /// directories can.
    fn drop(&mut self) {
        self.serve.kill();
        for line in fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .lines()
        {
            let mount = line.split(' ').nth(1).unwrap_or("");
            if mount.starts_with(&self.base.display().to_string()) {
                let _ = Command::new("umount").args(["-l", mount]).status();
            }
        }
    }
}

/// Nothing left below `base` but the store handed on to the next
/// backend (`actionfs-warm-UID`: its index and content directories) and
/// the state directory (`actionfs-state-UID`: its lock, the stashed
/// trees, the list of where looks found files and the directory blobs
/// handed on).
pub fn assert_nothing_left(base: &Path, log: &str) {
    let warm = base.join(format!("actionfs-warm-{}", nix::unistd::geteuid()));
    let state = base.join(format!("actionfs-state-{}", nix::unistd::geteuid()));
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
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        !mounts.contains(&base.display().to_string()),
        "a mount is left below {base:?}"
    );
}

pub fn inline(bytes: &[u8]) -> Content {
    Content {
        source: Some(content::Source::Inline(bytes.to_vec())),
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
