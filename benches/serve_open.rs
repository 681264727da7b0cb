//! Open + read + close of a small input (2 KiB) in a FUSE sandbox of
//! `actionfs serve` (`--native_below=0`), next to the same loop on the
//! store file it maps (native), alternating (pin it: `taskset -c 0`);
//! prints the medians per iteration, their ratio, and the OPEN and
//! RELEASE messages the daemon counted during the FUSE loops (its
//! SIGUSR1 reports); exits 1 if there was any (zero-message opens send
//! none).
//!
//! `ACTIONFS_BENCH_ITERS=N` (default 20,000 per round), `ACTIONFS_BENCH_RUNS=K`
//! (default 5 rounds), `ACTIONFS_BENCH_DIR` (default /var/tmp,
//! disk: use /dev/shm for tmpfs), `ACTIONFS_BENCH_PAUSE=1` (print both
//! paths and keep the sandbox until a line arrives on stdin, for a
//! profiler). Run: `cargo build --release --benches && taskset -c 0 cargo bench --bench serve_open`.

mod serve_common;

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::time::Instant;

use actionfs_protocol::backend::digest::{digest_of, sha256_hex};
use actionfs_protocol::backend::sandbox::{content, create, Content, Manifest, Push};
use actionfs_protocol::backend::tree::TreeBuilder;
use actionfs_testkit::fuse_requests;
use serve_common::{env_or, Served};

fn loop_ns(path: &Path, iters: usize) -> f64 {
    let mut buf = [0u8; 4096];
    let started = Instant::now();
    for _ in 0..iters {
        let mut file = std::fs::File::open(path).unwrap();
        let n = file.read(&mut buf).unwrap();
        assert_eq!(n, 2048);
    }
    started.elapsed().as_nanos() as f64 / iters as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let iters = env_or("ACTIONFS_BENCH_ITERS", 20_000);
    let runs = env_or("ACTIONFS_BENCH_RUNS", 5);

    let served = Served::start(&["--native_below=0"]);
    let bytes = vec![b'x'; 2048];
    let mut tb = TreeBuilder::new();
    tb.add_file("ws/include/small.h", digest_of(&bytes), false)
        .unwrap();
    let tree = tb.build();
    served
        .client()
        .push(Push {
            blobs: tree.blobs.clone(),
            content: [(
                sha256_hex(&bytes),
                Content {
                    source: Some(content::Source::Inline(bytes.clone())),
                    retention: 0,
                },
            )]
            .into(),
        })
        .unwrap();
    let manifest = Manifest {
        mnemonic: "Bench".into(),
        exec_root: served.exec_root(),
        hash_function: "SHA-256".into(),
        input_root_digest: Some(tree.root.clone()),
        outputs: HashMap::new(),
        writable_dirs: HashMap::new(),
        confinement_setting: None,
    };
    let answer = served.client().create("bench", manifest).unwrap();
    let Some(create::result::Outcome::Ok(ok)) = answer.outcome else {
        panic!("{answer:?}");
    };
    let in_fuse = Path::new(&ok.path).join("ws/include/small.h");
    // The store file the sandbox maps: the same bytes on the same file
    // system, opened without FUSE.
    let native = std::fs::read_dir(served.dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("actionfs-serve-")
        })
        .unwrap()
        .join("store/c")
        .join(sha256_hex(&bytes));
    // Warm both (the first open of the mount is asked once).
    loop_ns(&in_fuse, 1000);
    loop_ns(&native, 1000);
    let before = served.stats();
    let (mut fuse, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        fuse.push(loop_ns(&in_fuse, iters));
        plain.push(loop_ns(&native, iters));
    }
    let after = served.stats();
    if std::env::var_os("ACTIONFS_BENCH_PAUSE").is_some() {
        // Keep the sandbox for an outside profiler until a line arrives.
        eprintln!("FUSE: {}\nnative: {}", in_fuse.display(), native.display());
        std::io::stdin().read_line(&mut String::new()).unwrap();
    }
    let (f, n) = (median(fuse), median(plain));
    println!(
        "open+read 2 KiB+close, {runs} rounds of {iters}: FUSE sandbox {:.2} us, native {:.2} us, ratio {:.2}",
        f / 1e3,
        n / 1e3,
        f / n
    );
    // Zero-message opens: the kernel opens inputs without asking, so the
    // FUSE loops must have sent no OPEN or RELEASE at all.
    let sent = |op: &str| fuse_requests(&after, op) - fuse_requests(&before, op);
    let (opens, releases) = (sent("open"), sent("release"));
    println!(
        "messages during the {} FUSE opens: OPEN {opens}, RELEASE {releases}",
        runs * iters
    );
    served.client().destroy("bench").unwrap();
    served.stop();
    if opens + releases > 0 {
        eprintln!("serve_open: zero-message opens sent messages");
        std::process::exit(1);
    }
}
