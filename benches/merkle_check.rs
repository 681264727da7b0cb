//! Walking an input tree whose `Directory` blobs were never decoded: what
//! a backend's first Create of a tree pays per entry (each blob decoded,
//! every name and digest checked), against the walk of the same tree once
//! its directories are checked. Shaped like a C++ action's inputs: header
//! directories of 1..400 files named as libraries name them, a few
//! subdirectories and symlinks each, sorted by name as REAPI asks.

use std::collections::HashMap;
use std::sync::Arc;

use actionfs::sandbox::merkle::{BlobError, DirectorySource, Trees};
use actionfs::sandbox::store::Digest;
use actionfs_protocol::backend::reapi;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use prost::Message;

// The daemon's allocator: decoding is allocation-heavy.
#[global_allocator]
static ALLOCATOR: actionfs::allocator::Allocator = actionfs::allocator::Allocator::new();

/// Blobs by hash.
struct Blobs(HashMap<String, Arc<[u8]>>);

impl DirectorySource for Blobs {
    fn directory_blob(&self, hash: &str, _size: i64) -> Result<Option<Arc<[u8]>>, BlobError> {
        Ok(self.0.get(hash).cloned())
    }
}

fn digest_of(bytes: &[u8]) -> reapi::Digest {
    reapi::Digest {
        hash: Digest::of(bytes).hex(),
        size_bytes: bytes.len() as i64,
    }
}

/// Adds directory `dir` to `blobs`; its digest.
fn put(blobs: &mut Blobs, dir: &reapi::Directory) -> reapi::Digest {
    let bytes = dir.encode_to_vec();
    let digest = digest_of(&bytes);
    blobs.0.insert(digest.hash.clone(), bytes.into());
    digest
}

/// A directory of `files` headers, `links` symlinks and subdirectories
/// `subs`, every list sorted by name.
fn directory(
    blobs: &mut Blobs,
    tag: &str,
    files: usize,
    links: usize,
    subs: Vec<(String, reapi::Digest)>,
) -> reapi::Digest {
    let mut file_nodes: Vec<_> = (0..files)
        .map(|i| {
            let name = format!("{tag}_component_{i:04}.h");
            reapi::FileNode {
                digest: Some(digest_of(name.as_bytes())),
                name,
                is_executable: i % 17 == 0,
                ..Default::default()
            }
        })
        .collect();
    file_nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut link_nodes: Vec<_> = (0..links)
        .map(|i| reapi::SymlinkNode {
            name: format!("{tag}_alias_{i:03}.h"),
            target: format!("../{tag}/impl_{i:03}.h"),
            ..Default::default()
        })
        .collect();
    link_nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut dir_nodes: Vec<_> = subs
        .into_iter()
        .map(|(name, digest)| reapi::DirectoryNode {
            name,
            digest: Some(digest),
        })
        .collect();
    dir_nodes.sort_by(|a, b| a.name.cmp(&b.name));
    put(
        blobs,
        &reapi::Directory {
            files: file_nodes,
            directories: dir_nodes,
            symlinks: link_nodes,
            ..Default::default()
        },
    )
}

/// A tree of 61 directories (40 of 1..400 files, 5,000 files in all)
/// under one workspace directory; its blobs, its top's digest and how
/// many entries they hold.
fn action_tree() -> (Blobs, reapi::Digest, u64) {
    let mut blobs = Blobs(HashMap::new());
    let mut libraries = Vec::new();
    for lib in 0..20 {
        let mut parts = Vec::new();
        for part in 0..2 {
            let files = [1, 40, 400][(lib + part) % 3];
            let tag = format!("lib{lib}_part{part}");
            parts.push((
                format!("part{part}"),
                directory(&mut blobs, &tag, files, 3, vec![]),
            ));
        }
        libraries.push((
            format!("library_{lib:02}"),
            directory(&mut blobs, &format!("lib{lib}"), 0, 0, parts),
        ));
    }
    let top = directory(&mut blobs, "ws", 10, 0, libraries);
    let entries = blobs
        .0
        .values()
        .map(|blob| {
            let dir = reapi::Directory::decode(&blob[..]).unwrap();
            (dir.files.len() + dir.directories.len() + dir.symlinks.len()) as u64
        })
        .sum();
    (blobs, top, entries)
}

fn bench(c: &mut Criterion) {
    let (blobs, top, entries) = action_tree();
    let blobs = Arc::new(blobs);
    let mut group = c.benchmark_group("merkle_walk");
    group.throughput(Throughput::Elements(entries));
    group.bench_function("first walk (every blob decoded and checked)", |b| {
        b.iter(|| {
            let trees = Trees::new(blobs.clone());
            trees.walk("ws", &top.hash, top.size_bytes).unwrap()
        })
    });
    let trees = Trees::new(blobs.clone());
    trees.walk("ws", &top.hash, top.size_bytes).unwrap();
    group.bench_function("walk again (directories checked)", |b| {
        b.iter(|| trees.walk("ws", &top.hash, top.size_bytes).unwrap())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
