//! The whole life of a build action, for choosing the native/FUSE cutoff:
//! create its sandbox through the daemon's request path (stdin/stdout, as
//! Bazel does), stat every input and read a fraction of them from the
//! workspace directory, write one output, destroy the sandbox.
//!
//! Shared by `actionfs calibrate` and `benches/hybrid.rs`, so that the
//! cutoff users measure is the one the benchmark chose.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actionfs_protocol::{Client, CreateSandbox, Mapping};

use super::synthetic::SyntheticTree;
use crate::sandbox::materialize::remove_tree;

/// Bytes per input file, and of the one output.
pub const FILE_SIZE: usize = 2048;

/// A scratch area under the sandbox base directory being measured: the
/// input tree, the mount points and the actions' scratch directories.
/// Removed on drop.
pub struct Lab {
    pub dir: PathBuf,
    pub tree: SyntheticTree,
    next: AtomicUsize,
}

impl Lab {
    /// Creates `inputs` input files under a fresh directory in `base`.
    pub fn new(base: &Path, inputs: usize) -> io::Result<Lab> {
        let dir = base.join(format!("actionfs-lab-{}", std::process::id()));
        if dir.exists() {
            remove_tree(&dir).map_err(|e| io::Error::other(e.to_string()))?;
        }
        std::fs::create_dir(&dir)?;
        let tree = SyntheticTree::create(&dir.join("inputs"), inputs, FILE_SIZE)?;
        for sub in ["scratch", "mounts"] {
            std::fs::create_dir(dir.join(sub))?;
        }
        Ok(Lab {
            dir,
            tree,
            next: AtomicUsize::new(0),
        })
    }

    fn fresh(&self, kind: &str) -> PathBuf {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.dir.join(kind).join(format!("{n}"))
    }

    /// Starts `binary` with `args` on a new mount point in the lab.
    pub fn mount(&self, binary: &Path, args: &[String]) -> io::Result<Mounted> {
        let mnt = self.fresh("mounts");
        std::fs::create_dir(&mnt)?;
        let mut command = Command::new(binary);
        command
            .args(args)
            .arg(&mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // The lab's daemons say only what went wrong, not their start and
        // stop lines (shown by default when a user runs the daemon).
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "warn,fuser=error");
        }
        let client = Client::start(command).map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Mounted {
            client: Some(client),
            mnt,
            next: AtomicUsize::new(0),
        })
    }

    /// Runs one action with the first `inputs` input files, reading every
    /// `1/fraction`-th of them, in a sandbox of `mounted`. Returns the time
    /// from the create request to the destroy answer.
    pub fn action(&self, mounted: &Mounted, inputs: usize, fraction: f64) -> io::Result<Duration> {
        let client = mounted.client.as_ref().expect("daemon running");
        let id = format!("a{}", mounted.next.fetch_add(1, Ordering::Relaxed));
        let scratch = self.fresh("scratch");
        std::fs::create_dir(&scratch)?;
        let files = &self.tree.files[..inputs];
        let mut mappings = Vec::with_capacity(inputs + 1);
        mappings.push(mapping("/ws", &scratch, true));
        for file in files {
            mappings.push(mapping(
                &format!("/ws/{}", file.display()),
                &self.tree.root.join(file),
                false,
            ));
        }
        let request = CreateSandbox {
            id: id.clone(),
            mappings,
            ..CreateSandbox::default()
        };
        let relative: Vec<CString> = files
            .iter()
            .map(|f| CString::new(f.as_os_str().as_bytes()).expect("no NUL in names"))
            .collect();
        let every = if fraction > 0.0 {
            (1.0 / fraction).round().max(1.0) as usize
        } else {
            usize::MAX
        };

        let started = Instant::now();
        client
            .create(&request)
            .map_err(|e| io::Error::other(format!("create {id}: {e}")))?;
        {
            let ws = File::open(mounted.mnt.join(&id).join("ws"))?;
            let mut buf = vec![0u8; FILE_SIZE + 1];
            for (i, rel) in relative.iter().enumerate() {
                stat_at(&ws, rel)?;
                if i % every == 0 {
                    read_at(&ws, rel, &mut buf)?;
                }
            }
            let out = mounted.mnt.join(&id).join("ws/out.txt");
            File::create(out)?.write_all(&buf[..FILE_SIZE])?;
        }
        client
            .destroy(&id)
            .map_err(|e| io::Error::other(format!("destroy {id}: {e}")))?;
        let elapsed = started.elapsed();

        // The output is Bazel's to move away; then the scratch is gone.
        std::fs::remove_file(scratch.join("out.txt"))?;
        std::fs::remove_dir(&scratch)?;
        Ok(elapsed)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(err) = remove_tree(&self.dir) {
            log::warn!("cannot remove {:?}: {err}", self.dir);
        }
    }
}

/// A daemon serving one mount of the lab; stopped on drop.
pub struct Mounted {
    client: Option<Client>,
    mnt: PathBuf,
    next: AtomicUsize,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            let _ = client.terminate();
        }
    }
}

fn mapping(path: &str, underlying: &Path, writable: bool) -> Mapping {
    Mapping {
        path: path.to_owned(),
        underlying_path: underlying.to_string_lossy().into_owned(),
        writable,
        ..Mapping::default()
    }
}

/// stat(2) of `rel` from an action's working directory, following
/// symlinks as an action's tools do.
pub fn stat_at(dir: &File, rel: &CString) -> io::Result<()> {
    nix::sys::stat::fstatat(dir, rel.as_c_str(), nix::fcntl::AtFlags::empty())?;
    Ok(())
}

/// openat + read until end of file + close, from an action's working
/// directory; returns the bytes read.
pub fn read_at(dir: &File, rel: &CString, buf: &mut [u8]) -> io::Result<usize> {
    let flags = nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(dir, rel.as_c_str(), flags, nix::sys::stat::Mode::empty())?;
    let mut file = File::from(fd);
    let mut total = 0;
    loop {
        match file.read(buf)? {
            0 => return Ok(total),
            n => total += n,
        }
    }
}
