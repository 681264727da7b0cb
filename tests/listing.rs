//! Directory listings through the mount: complete and exact (every name
//! once, nothing made up) when read in many READDIR batches, for mapped,
//! virtual and merged directories, and while entries come and go.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::Path;

use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;

/// Enough long names that one listing takes many READDIR requests (the
/// kernel asks for a buffer of entries at a time; asserted below).
const MANY: usize = 3000;

fn long_name(prefix: &str, i: usize) -> String {
    format!("{prefix}_{i:06}_{}", "n".repeat(40))
}

/// Every name in `dir` as listed through the mount, with how often each
/// came back (`.` and `..` left out).
fn listed(dir: &Path) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for entry in fs::read_dir(dir).unwrap_or_else(|err| panic!("read_dir {dir:?}: {err}")) {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        *counts.entry(name).or_insert(0) += 1;
    }
    counts
}

/// READDIR and READDIRPLUS requests the daemon has served.
fn listing_requests(fx: &Fixture, d: &Daemon) -> u64 {
    let stats = fx.stats_now(d);
    fuse_requests(&stats, "readdir") + fuse_requests(&stats, "readdirplus")
}

/// Asserts that `dir` lists exactly `expected`, each name once, read in
/// many READDIR batches (the daemon's counts say so: a listing served in
/// one, or from a cache, would not test resuming at an offset).
fn assert_lists_exactly(fx: &Fixture, d: &Daemon, dir: &Path, expected: &BTreeSet<String>) {
    let before = listing_requests(fx, d);
    let counts = listed(dir);
    let batches = listing_requests(fx, d) - before;
    // 3,000 names of ~70 bytes: 9 requests of ~24 KiB on Linux 6.x.
    assert!(
        batches >= 4,
        "{dir:?}: listed in {batches} READDIR requests"
    );
    let twice: Vec<_> = counts.iter().filter(|(_, &n)| n > 1).collect();
    assert!(
        twice.is_empty(),
        "{dir:?}: names listed more than once: {twice:?}"
    );
    let got: BTreeSet<String> = counts.into_keys().collect();
    let missing: Vec<_> = expected.difference(&got).take(5).collect();
    let extra: Vec<_> = got.difference(expected).take(5).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{dir:?}: {} listed, {} expected; missing {missing:?}, extra {extra:?}",
        got.len(),
        expected.len()
    );
}

#[test]
fn mapped_virtual_and_merged_directories_list_every_name_once_over_many_batches() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let good = fx.write("src/good", "good");
    let many = fx.path("src/many");
    fs::create_dir(&many).unwrap();
    let mut underlying = BTreeSet::new();
    for i in 0..MANY {
        let name = long_name("u", i);
        fs::write(many.join(&name), "").unwrap();
        underlying.insert(name);
    }
    let d = fx.start(&[]);
    let mut mappings = vec![ro("/mapped", &many), ro("/merged", &many)];
    // Merged: the underlying names plus mappings nested in the mapped
    // directory, one of which shadows an underlying name.
    let mut merged = underlying.clone();
    for i in 0..MANY / 2 {
        let name = long_name("m", i);
        mappings.push(ro(&format!("/merged/{name}"), &good));
        merged.insert(name);
    }
    mappings.push(ro(&format!("/merged/{}", long_name("u", 7)), &good));
    // Virtual: a directory made up only of mappings.
    let mut virtual_names = BTreeSet::new();
    for i in 0..MANY {
        let name = long_name("v", i);
        mappings.push(ro(&format!("/virtual/{name}"), &good));
        virtual_names.insert(name);
    }
    d.create(sandbox("s", mappings));

    assert_lists_exactly(&fx, &d, &d.path("s/mapped"), &underlying);
    assert_lists_exactly(&fx, &d, &d.path("s/merged"), &merged);
    assert_lists_exactly(&fx, &d, &d.path("s/virtual"), &virtual_names);
    // The shadowing mapping is what its name shows.
    assert_eq!(
        fs::read_to_string(d.path(&format!("s/merged/{}", long_name("u", 7)))).unwrap(),
        "good"
    );
}

#[test]
fn names_added_and_removed_during_a_listing_are_listed_at_most_once_and_the_rest_exactly_once() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let scratch = fx.path("scratch");
    let good = fx.write("src/good", "good");
    for i in 0..MANY {
        fs::write(scratch.join(long_name("u", i)), "").unwrap();
    }
    let d = fx.start(&[]);
    // A writable mapped directory with a nested mapping: merged.
    d.create(sandbox(
        "s",
        vec![
            rw("/w", &scratch),
            ro(&format!("/w/{}", long_name("m", 0)), &good),
        ],
    ));
    let dir = d.path("s/w");
    // Removed from the middle and the end (through the mount) and added
    // (through the mount and underneath) after the listing began.
    let removed: BTreeSet<String> = (0..MANY)
        .filter(|i| i % 7 == 3)
        .map(|i| long_name("u", i))
        .collect();
    let added: BTreeSet<String> = (0..500).map(|i| long_name("a", i)).collect();
    let steady: BTreeSet<String> = (0..MANY)
        .map(|i| long_name("u", i))
        .filter(|name| !removed.contains(name))
        .chain([long_name("m", 0)])
        .collect();

    let mut counts: HashMap<String, usize> = HashMap::new();
    let mut entries = fs::read_dir(&dir).unwrap();
    for _ in 0..200 {
        let name = entries.next().unwrap().unwrap().file_name();
        *counts
            .entry(name.to_string_lossy().into_owned())
            .or_insert(0) += 1;
    }
    for name in &removed {
        fs::remove_file(dir.join(name)).unwrap();
    }
    for (i, name) in added.iter().enumerate() {
        let at = if i % 2 == 0 {
            dir.join(name)
        } else {
            scratch.join(name)
        };
        fs::write(at, "").unwrap();
    }
    let changed = listing_requests(&fx, &d);
    for entry in entries {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        *counts.entry(name).or_insert(0) += 1;
    }
    // Most of the listing was read after the changes, in many batches.
    let batches = listing_requests(&fx, &d) - changed;
    assert!(batches >= 4, "{batches} READDIR requests after the changes");

    let twice: Vec<_> = counts.iter().filter(|(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "names listed more than once: {twice:?}");
    let missing: Vec<_> = steady.iter().filter(|n| !counts.contains_key(*n)).collect();
    assert!(
        missing.is_empty(),
        "names present throughout but not listed: {missing:?}"
    );
    let made_up: Vec<_> = counts
        .keys()
        .filter(|n| !steady.contains(*n) && !removed.contains(*n) && !added.contains(*n))
        .collect();
    assert!(made_up.is_empty(), "names that never existed: {made_up:?}");
    // A listing opened afterwards shows the changes exactly.
    let now: BTreeSet<String> = steady.union(&added).cloned().collect();
    assert_lists_exactly(&fx, &d, &dir, &now);
}
