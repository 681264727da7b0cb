//! What staging a REAPI input root with `actionfs::stage` costs, on the
//! tree shapes of iOS builds (64, 219, 635 and 1,978 files; flat: one
//! directory, clustered: 20 files a directory, three levels), from a CAS in
//! NativeLink's layout that this bench writes (or one given): **cold**, a
//! new stager that has decoded none of the tree's directories; **seen**,
//! the stager that staged the same tree before; **recycled**, a stager
//! keeping torn-down roots (`Stager::recycling`) staging the same tree
//! again, or the tree with one file changed (made from the spare by the
//! difference); and teardown (deleting, or checking and keeping a spare),
//! against `rm -rf` of the same tree (the command, and
//! `std::fs::remove_dir_all`).
//!
//! Env: `ACTIONFS_BENCH_DIR` (default /dev/shm: the CAS and the roots go
//! there), `ACTIONFS_BENCH_RUNS` (21), `ACTIONFS_BENCH_MECHANISM`
//! (hardlink, clone, copy, auto; default hardlink), `ACTIONFS_BENCH_SIZES`,
//! `ACTIONFS_BENCH_THREADS` (threads placing files: 0 by size, the
//! default, 1 or 2), `ACTIONFS_BENCH_FUSE=1` (also roots served by FUSE
//! (`actionfs::stage::FuseRoots`, one mount for the whole run): staged
//! cold and seen, torn down, and every file of a root opened and read
//! once after staging, against the same read of a linked root).
//! `STAGE_MANIFEST=FILE`: stage the trees of the manifest NativeLink's
//! staging benchmark wrote (`integrations/nativelink/bench`), from its CAS,
//! so that both measure the same trees.
//! Prints one JSON line per shape and measure (ms: min, median, p95, max).
//! Run: `cargo bench --bench stage`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use actionfs::stage::{FuseRoots, Mechanism, Stager};
use actionfs_protocol::backend::digest::sha256_hex;
use actionfs_protocol::backend::reapi;
use actionfs_protocol::backend::tree::TreeBuilder;
use actionfs_testkit::bench::{bench_dir, sizes};
use serde_json::{json, Value};

struct Shape {
    name: String,
    files: usize,
    hash: String,
    size: i64,
    /// The same tree with one file's content changed, deep in it.
    changed: Option<(String, i64)>,
}

fn put(content: &Path, bytes: &[u8]) -> reapi::Digest {
    let digest = reapi::Digest {
        hash: sha256_hex(bytes),
        size_bytes: bytes.len() as i64,
    };
    let path = content
        .join("d")
        .join(format!("{}-{}", digest.hash, digest.size_bytes));
    if !path.exists() {
        fs::write(&path, bytes).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).unwrap();
    }
    digest
}

/// Writes a tree of `files` 2 KiB files (one in ten executable, plus two
/// symlinks) into the CAS and returns its root, and that of the tree with
/// its last file changed.
fn make_tree(content: &Path, name: &str, files: usize, clustered: bool) -> Shape {
    let (hash, size) = make_one(content, name, files, clustered, false);
    Shape {
        name: name.to_owned(),
        files,
        hash,
        size,
        changed: Some(make_one(content, name, files, clustered, true)),
    }
}

fn make_one(
    content: &Path,
    name: &str,
    files: usize,
    clustered: bool,
    change: bool,
) -> (String, i64) {
    let mut tree = TreeBuilder::new();
    for n in 0..files {
        let version = if change && n == files - 1 {
            "changed"
        } else {
            ""
        };
        let mut bytes = format!("{name} file {n}{version}\n").into_bytes();
        bytes.resize(2048, b'x' + (n % 3) as u8);
        let dir = if clustered {
            let d = n / 20;
            format!("c{}/m{}/l{}", d / 16, d / 4 % 4, d % 4)
        } else {
            "flat".to_owned()
        };
        let digest = put(content, &bytes);
        let ext = if n % 10 == 0 { "sh" } else { "m" };
        tree.add_file(&format!("{dir}/f{n}.{ext}"), digest, n % 10 == 0)
            .unwrap();
    }
    tree.add_symlink("link", "flat/f1.m").unwrap();
    tree.add_symlink("outside", "../../etc/hosts").unwrap();
    let tree = tree.build();
    for blob in tree.blobs.values() {
        put(content, blob);
    }
    (tree.root.hash.clone(), tree.root.size_bytes)
}

/// The trees of a manifest NativeLink's stage_bench example wrote
/// (`integrations/nativelink/`): `{"content_path", "shapes": [{"name",
/// "files", "root_digest": {"hash", "size_bytes"}}]}`.
fn shapes_from_manifest(path: &Path) -> (PathBuf, Vec<Shape>) {
    let manifest: Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    let content = PathBuf::from(manifest["content_path"].as_str().unwrap());
    let shapes = manifest["shapes"].as_array().expect("a shapes list");
    let shapes = shapes
        .iter()
        .map(|t| Shape {
            name: t["name"].as_str().unwrap().to_owned(),
            files: t["files"].as_u64().unwrap() as usize,
            hash: t["root_digest"]["hash"].as_str().unwrap().to_owned(),
            size: t["root_digest"]["size_bytes"].as_i64().unwrap(),
            changed: None,
        })
        .collect();
    (content, shapes)
}

/// Every regular file below `root`, relative to it.
fn file_paths(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path().strip_prefix(root).unwrap().to_owned());
            }
        }
    }
    files
}

/// Opens, reads and closes each of `files` below `root` by its path, as
/// an action that reads every input once (a compiler looks paths up; it
/// does not list directories).
fn read_every_file(root: &Path, files: &[PathBuf]) {
    let mut buf = vec![0u8; 1 << 16];
    for path in files {
        let mut file = fs::File::open(root.join(path)).unwrap();
        while std::io::Read::read(&mut file, &mut buf).unwrap() > 0 {}
    }
}

fn ms(d: &Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn summary(shape: &Shape, measure: &str, mut times: Vec<Duration>) -> Value {
    times.sort();
    let at = |q: f64| ms(&times[((times.len() - 1) as f64 * q).round() as usize]);
    json!({
        "shape": shape.name, "files": shape.files, "measure": measure,
        "runs": times.len(), "min": at(0.0), "median": at(0.5), "p95": at(0.95), "max": at(1.0),
    })
}

fn main() {
    // `cargo bench` passes --bench; nothing to parse.
    let runs: usize = std::env::var("ACTIONFS_BENCH_RUNS")
        .map(|r| r.parse().expect("a number"))
        .unwrap_or(21);
    let mechanism = std::env::var("ACTIONFS_BENCH_MECHANISM")
        .map(|m| Mechanism::parse(&m).expect("hardlink, clone, copy or auto"))
        .unwrap_or(Mechanism::Hardlink);
    let threads: usize = std::env::var("ACTIONFS_BENCH_THREADS")
        .map(|t| t.parse().expect("a number"))
        .unwrap_or(0);
    let open = |content: &Path, exec: &Path| {
        Stager::open(content, exec, mechanism)
            .unwrap()
            .threads(threads)
    };
    let base = tempfile::tempdir_in(bench_dir()).unwrap();
    let (content, shapes) = match std::env::var_os("STAGE_MANIFEST") {
        Some(manifest) => shapes_from_manifest(Path::new(&manifest)),
        None => {
            let content = base.path().join("cas");
            fs::create_dir_all(content.join("d")).unwrap();
            let mut shapes = Vec::new();
            for files in sizes(&[64, 219, 635, 1978]) {
                for clustered in [false, true] {
                    let kind = if clustered { "clustered" } else { "flat" };
                    let name = format!("{kind}-{files}");
                    shapes.push(make_tree(&content, &name, files, clustered));
                }
            }
            (content, shapes)
        }
    };
    let work = base.path().join("work");
    fs::create_dir(&work).unwrap();
    let exec = work.join(".exec");
    let seen = open(&content, &exec);
    let recycling = open(&content, &exec)
        .recycling(&work.join(".spares"), 1)
        .unwrap();
    let fuse = std::env::var_os("ACTIONFS_BENCH_FUSE")
        .is_some_and(|v| v == "1")
        .then(|| std::sync::Arc::new(FuseRoots::open(&base.path().join("fuse"), 0).unwrap()));
    let fuse_seen = fuse
        .as_ref()
        .map(|roots| open(&content, &exec).fuse_roots(roots.clone()));
    let mut times: Vec<[Vec<Duration>; 13]> = shapes.iter().map(|_| Default::default()).collect();
    // Warm: every blob read once, every executable variant made.
    for shape in &shapes {
        let at = work.join("warm");
        let staged = seen.stage(&shape.hash, shape.size, &at, &[]).unwrap();
        seen.tear_down(staged).unwrap();
    }
    for _ in 0..runs {
        for (shape, times) in shapes.iter().zip(&mut times) {
            let at = work.join("root");
            // Cold: directories never decoded by this stager.
            let cold = open(&content, &exec);
            let start = Instant::now();
            let staged = cold.stage(&shape.hash, shape.size, &at, &[]).unwrap();
            times[0].push(start.elapsed());
            let start = Instant::now();
            cold.tear_down(staged).unwrap();
            times[2].push(start.elapsed());

            let start = Instant::now();
            let staged = seen.stage(&shape.hash, shape.size, &at, &[]).unwrap();
            times[1].push(start.elapsed());
            drop(staged);
            if fuse.is_some() {
                let files = file_paths(&at);
                let start = Instant::now();
                read_every_file(&at, &files);
                times[12].push(start.elapsed());
            }
            let start = Instant::now();
            let status = Command::new("rm").arg("-rf").arg(&at).status().unwrap();
            times[3].push(start.elapsed());
            assert!(status.success());

            let staged = seen.stage(&shape.hash, shape.size, &at, &[]).unwrap();
            drop(staged);
            let start = Instant::now();
            fs::remove_dir_all(&at).unwrap();
            times[4].push(start.elapsed());

            // Recycled: the spare is this very tree, or (next) the tree
            // with one file changed.
            let staged = recycling.stage(&shape.hash, shape.size, &at, &[]).unwrap();
            recycling.tear_down(staged).unwrap();
            let start = Instant::now();
            let staged = recycling.stage(&shape.hash, shape.size, &at, &[]).unwrap();
            times[5].push(start.elapsed());
            let start = Instant::now();
            recycling.tear_down(staged).unwrap();
            times[6].push(start.elapsed());
            if let Some((hash, size)) = &shape.changed {
                let start = Instant::now();
                let staged = recycling.stage(hash, *size, &at, &[]).unwrap();
                times[7].push(start.elapsed());
                recycling.tear_down(staged).unwrap();
            }
        }
    }
    // Roots served by FUSE, in a loop of their own: a worker staging by
    // FUSE links no blob, so their attributes (and the kernel's cache of
    // them, taken over from root to root) stay as they are.
    if let (Some(roots), Some(fuse_seen)) = (&fuse, &fuse_seen) {
        let at = work.join("root");
        let files: Vec<Vec<PathBuf>> = shapes
            .iter()
            .map(|shape| {
                let staged = seen.stage(&shape.hash, shape.size, &at, &[]).unwrap();
                let files = file_paths(&at);
                seen.tear_down(staged).unwrap();
                files
            })
            .collect();
        for _ in 0..runs {
            for ((shape, times), files) in shapes.iter().zip(&mut times).zip(&files) {
                let cold = open(&content, &exec).fuse_roots(roots.clone());
                let start = Instant::now();
                let staged = cold.stage(&shape.hash, shape.size, &at, &[]).unwrap();
                times[8].push(start.elapsed());
                let start = Instant::now();
                cold.tear_down(staged).unwrap();
                times[10].push(start.elapsed());
                let start = Instant::now();
                let staged = fuse_seen.stage(&shape.hash, shape.size, &at, &[]).unwrap();
                times[9].push(start.elapsed());
                let start = Instant::now();
                read_every_file(&at, files);
                times[11].push(start.elapsed());
                fuse_seen.tear_down(staged).unwrap();
            }
        }
    }
    let measures = [
        "stage cold",
        "stage seen",
        "teardown",
        "rm -rf",
        "remove_dir_all",
        "stage recycled, same tree",
        "teardown, kept as spare",
        "stage recycled, one file changed",
        "fuse stage cold",
        "fuse stage seen",
        "fuse teardown",
        "fuse root: read every file",
        "linked root: read every file",
    ];
    for (shape, times) in shapes.iter().zip(times) {
        for (measure, times) in measures.iter().zip(times) {
            if times.is_empty() {
                continue;
            }
            println!("{}", summary(shape, measure, times));
        }
    }
}
