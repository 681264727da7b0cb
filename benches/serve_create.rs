//! What a Create of `actionfs serve` costs, round trip through the real
//! backend process, for a tree of N inputs (default 5,000 in 50
//! directories): **cold**, every directory digest new to the backend (its
//! blobs pushed and applied just before, outside the timing), and
//! **seen**, the same
//! tree created again under a new id. Each Create is followed by a
//! Destroy, untimed. Prints min/median/max in ms per case, and of
//! **trip**, a Destroy of an unknown id: the round trip through the
//! pipes and threads that every request pays.
//!
//! `ACTIONFS_BENCH_INPUTS=N`, `ACTIONFS_BENCH_RUNS=K` (default 31),
//! `ACTIONFS_BENCH_SEEN_REPEATS=R` (seen Creates per run, default 1; many
//! for a profile of the seen case),
//! `ACTIONFS_BENCH_OPTS="--native_below=0 ..."` (Negotiate options; the
//! sandbox base is a fresh directory below `ACTIONFS_BENCH_DIR`, default
//! /var/tmp). Run: `cargo bench --bench serve_create`.

mod serve_common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use actionfs_protocol::backend::digest::digest_of;
use actionfs_protocol::backend::sandbox::{create, Manifest, Push};
use actionfs_protocol::backend::tree::{Tree, TreeBuilder};
use serve_common::{env_or, Served};

/// A tree of `inputs` files, each written at its default place below
/// `exec_root` (Bazel pushes no content for a source file), so that a
/// native build finds them.
fn tree(inputs: usize, generation: usize, exec_root: &Path) -> Tree {
    let mut tb = TreeBuilder::new();
    for n in 0..inputs {
        let bytes = format!("input {n} of generation {generation}\n");
        let path = format!("ws/pkg{}/file{n}.h", n % 50);
        let place = exec_root.join(&path);
        std::fs::create_dir_all(place.parent().unwrap()).unwrap();
        std::fs::write(&place, &bytes).unwrap();
        tb.add_file(&path, digest_of(bytes.as_bytes()), false)
            .unwrap();
    }
    tb.build()
}

fn manifest(tree: &Tree, exec_root: &str) -> Manifest {
    Manifest {
        mnemonic: "Bench".into(),
        exec_root: exec_root.into(),
        hash_function: "SHA-256".into(),
        input_root_digest: Some(tree.root.clone()),
        outputs: [(
            "/ws/out/o".to_owned(),
            actionfs_protocol::backend::sandbox::Output {
                r#type: "file".into(),
                dest: String::new(),
            },
        )]
        .into(),
        writable_dirs: HashMap::new(),
        confinement_setting: None,
    }
}

fn summary(name: &str, mut times: Vec<Duration>) {
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:>6}: min {:.3} ms  median {:.3} ms  max {:.3} ms  ({} runs)",
        ms(times[0]),
        ms(times[times.len() / 2]),
        ms(times[times.len() - 1]),
        times.len()
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let inputs = env_or("ACTIONFS_BENCH_INPUTS", 5000);
    let runs = env_or("ACTIONFS_BENCH_RUNS", 31);
    let seen_repeats = env_or("ACTIONFS_BENCH_SEEN_REPEATS", 1);
    let served = Served::start(&[]);
    let client = served.client();
    println!("{inputs} inputs");
    let exec_root = served.exec_root();
    let timed_create = |id: &str, tree: &Tree| {
        let started = Instant::now();
        let answer = client.create(id, manifest(tree, &exec_root)).unwrap();
        let took = started.elapsed();
        assert!(
            matches!(answer.outcome, Some(create::result::Outcome::Ok(_))),
            "{answer:?}"
        );
        client.destroy(id).unwrap();
        took
    };
    let (mut cold, mut seen) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let t = tree(inputs, run, Path::new(&exec_root));
        client
            .push(Push {
                blobs: t.blobs.clone(),
                content: HashMap::new(),
            })
            .unwrap();
        // A Push has no answer: a request that has one, read after it,
        // returns once the Push is applied, so that the timing is the
        // Create's alone.
        client.destroy("not-a-sandbox").unwrap();
        cold.push(timed_create(&format!("cold{run}"), &t));
        for again in 0..seen_repeats {
            seen.push(timed_create(&format!("seen{run}-{again}"), &t));
        }
    }
    // The floor under both: a request that does nothing, through the
    // same pipes and threads.
    let trip: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            client.destroy("not-a-sandbox").unwrap();
            started.elapsed()
        })
        .collect();
    summary("cold", cold);
    summary("seen", seen);
    summary("trip", trip);
    served.stop();
}
