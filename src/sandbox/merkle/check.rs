//! Decoding one `Directory` blob and checking every name and digest in it,
//! so that nothing walked from it can name a path outside its directory.

use actionfs_protocol::backend::reapi;
use prost::Message;

use super::{BadName, Checked, DirEntry, Fault, FileEntry, InvalidDirectory, SymlinkEntry};
use crate::sandbox::store::Digest;

/// SHA-256 of no bytes: the only hash a digest of size 0 may have.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Decodes directory `hash` and checks every name and digest in it; else
/// why it is not a valid directory (a blob alone can miss nothing).
pub(super) fn check(hash: &str, blob: &[u8]) -> Result<Checked, InvalidDirectory> {
    let invalid = |fault: Fault| InvalidDirectory {
        hash: hash.to_owned(),
        fault,
    };
    let dir =
        reapi::Directory::decode(blob).map_err(|err| invalid(Fault::NotADirectoryMessage(err)))?;
    let name_checked = |name: &str| check_name(name).map_err(|err| invalid(err.into()));
    // The decoded strings are moved in, not copied: a tree's first walk
    // decodes thousands of entries.
    let mut files = Vec::with_capacity(dir.files.len());
    for file in dir.files {
        name_checked(&file.name)?;
        let (hash, size, digest) = checked_digest(&file.name, file.digest).map_err(invalid)?;
        files.push(FileEntry {
            name: file.name.into_boxed_str(),
            digest,
            hash,
            size,
            executable: file.is_executable,
        });
    }
    let mut dirs = Vec::with_capacity(dir.directories.len());
    for sub in dir.directories {
        name_checked(&sub.name)?;
        let (hash, size, _) = checked_digest(&sub.name, sub.digest).map_err(invalid)?;
        dirs.push(DirEntry {
            name: sub.name.into_boxed_str(),
            hash,
            size,
        });
    }
    let mut symlinks = Vec::with_capacity(dir.symlinks.len());
    for link in dir.symlinks {
        name_checked(&link.name)?;
        if link.target.is_empty() || link.target.contains('\0') {
            return Err(invalid(Fault::BadSymlinkTarget { name: link.name }));
        }
        symlinks.push(SymlinkEntry {
            name: link.name.into_boxed_str(),
            target: link.target.into_boxed_str(),
        });
    }
    let mut checked = Checked {
        files: files.into(),
        dirs: dirs.into(),
        symlinks: symlinks.into(),
        order: None,
    };
    match name_given_twice(&mut checked) {
        Some(name) => Err(invalid(Fault::NameTwice { name })),
        None => Ok(checked),
    }
}

/// Entry `name`'s digest: present, of a size not negative, SHA-256, and
/// the empty one's hash where its size is 0.
fn checked_digest(
    name: &str,
    digest: Option<reapi::Digest>,
) -> Result<(Box<str>, i64, Digest), Fault> {
    let name = || name.to_owned();
    let Some(digest) = digest else {
        return Err(Fault::NoDigest { name: name() });
    };
    if digest.size_bytes < 0 {
        return Err(Fault::NegativeSize {
            name: name(),
            size: digest.size_bytes,
        });
    }
    if digest.size_bytes == 0 && digest.hash != EMPTY_SHA256 {
        return Err(Fault::EmptyButHashed {
            name: name(),
            hash: digest.hash,
        });
    }
    match Digest::parse(&digest.hash) {
        Some(parsed) => Ok((digest.hash.into_boxed_str(), digest.size_bytes, parsed)),
        None => Err(Fault::NotSha256 {
            name: name(),
            hash: digest.hash,
        }),
    }
}

/// A name `checked` gives twice, across its three lists or in one. Sorted
/// lists (as REAPI asks, and Bazel sends) need a merge each; otherwise an
/// index sorted by name, where twins are neighbours, is kept in `checked`
/// for lookups by name.
fn name_given_twice(checked: &mut Checked) -> Option<String> {
    let file_names = || checked.files.iter().map(|f| &*f.name);
    let dir_names = || checked.dirs.iter().map(|d| &*d.name);
    let link_names = || checked.symlinks.iter().map(|l| &*l.name);
    if strictly_sorted(file_names())
        && strictly_sorted(dir_names())
        && strictly_sorted(link_names())
    {
        return name_in_both(file_names(), dir_names())
            .or_else(|| name_in_both(file_names(), link_names()))
            .or_else(|| name_in_both(dir_names(), link_names()));
    }
    let kinds = [
        checked.files.len(),
        checked.dirs.len(),
        checked.symlinks.len(),
    ];
    let mut order: Vec<(u8, u32)> = (0u8..3)
        .flat_map(|kind| (0..kinds[kind as usize] as u32).map(move |at| (kind, at)))
        .collect();
    let name = |&(kind, at): &(u8, u32)| checked.entry(kind, at).name();
    order.sort_unstable_by(|a, b| name(a).cmp(name(b)));
    let twice = order
        .windows(2)
        .find(|pair| name(&pair[0]) == name(&pair[1]))
        .map(|pair| name(&pair[0]).to_owned());
    checked.order = Some(order.into());
    twice
}

fn strictly_sorted<'a>(mut names: impl Iterator<Item = &'a str>) -> bool {
    let Some(mut last) = names.next() else {
        return true;
    };
    names.all(|name| {
        let ascending = last < name;
        last = name;
        ascending
    })
}

/// A name found in both of two strictly sorted lists.
fn name_in_both<'a>(
    a: impl Iterator<Item = &'a str>,
    b: impl Iterator<Item = &'a str>,
) -> Option<String> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
        match x.cmp(y) {
            std::cmp::Ordering::Less => drop(a.next()),
            std::cmp::Ordering::Greater => drop(b.next()),
            std::cmp::Ordering::Equal => return Some((*x).to_owned()),
        }
    }
    None
}

/// One path component: not empty, not `.` or `..`, no `/` or NUL.
pub fn check_name(name: &str) -> Result<(), BadName> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(BadName {
            name: name.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::Entry;
    use super::*;

    #[test]
    fn names_that_are_not_one_component_are_refused() {
        for bad in ["", ".", "..", "a/b", "/", "a\0b"] {
            assert!(check_name(bad).is_err(), "{bad:?} was accepted");
        }
        for good in ["a", "...", ".hidden", "a b", "ü"] {
            assert!(check_name(good).is_ok(), "{good:?} was refused");
        }
    }

    #[test]
    fn each_fault_of_a_blob_is_typed_and_names_the_directory() {
        let file = |name: &str, digest: Option<reapi::Digest>| reapi::Directory {
            files: vec![reapi::FileNode {
                name: name.into(),
                digest,
                ..Default::default()
            }],
            ..Default::default()
        };
        let digest = |hash: &str, size_bytes| {
            Some(reapi::Digest {
                hash: hash.into(),
                size_bytes,
            })
        };
        let good = "01".repeat(32);
        let link = reapi::Directory {
            symlinks: vec![reapi::SymlinkNode {
                name: "l".into(),
                target: String::new(),
                ..Default::default()
            }],
            ..Default::default()
        };
        // Each blob, and whether the fault is the one it must be.
        type Case = (Vec<u8>, fn(&Fault) -> bool);
        let cases: [Case; 7] = [
            (b"\xff\xff".to_vec(), |f| {
                matches!(f, Fault::NotADirectoryMessage(_))
            }),
            (file("f", None).encode_to_vec(), |f| {
                matches!(f, Fault::NoDigest { .. })
            }),
            (file("f", digest(&good, -1)).encode_to_vec(), |f| {
                matches!(f, Fault::NegativeSize { size: -1, .. })
            }),
            (file("f", digest(&good, 0)).encode_to_vec(), |f| {
                matches!(f, Fault::EmptyButHashed { .. })
            }),
            (
                file("f", digest("ABC", 3)).encode_to_vec(),
                |f| matches!(f, Fault::NotSha256 { hash, .. } if hash == "ABC"),
            ),
            (
                file("..", digest(&good, 1)).encode_to_vec(),
                |f| matches!(f, Fault::BadName(BadName { name }) if name == ".."),
            ),
            (
                link.encode_to_vec(),
                |f| matches!(f, Fault::BadSymlinkTarget { name } if name == "l"),
            ),
        ];
        for (blob, is_the_fault) in cases {
            let err = check("d1", &blob).expect_err("a bad blob was accepted");
            assert!(is_the_fault(&err.fault), "{err}");
            assert_eq!(err.hash, "d1");
            assert!(err.to_string().starts_with("directory d1: "), "{err}");
        }
    }

    #[test]
    fn a_name_given_twice_is_refused_in_one_list_or_across_lists_sorted_or_not() {
        let digest = reapi::Digest {
            hash: "01".repeat(32),
            size_bytes: 1,
        };
        let file = |name: &str| reapi::FileNode {
            name: name.into(),
            digest: Some(digest.clone()),
            ..Default::default()
        };
        let dir = |name: &str| reapi::DirectoryNode {
            name: name.into(),
            digest: Some(digest.clone()),
        };
        let link = |name: &str| reapi::SymlinkNode {
            name: name.into(),
            target: "t".into(),
            ..Default::default()
        };
        let blob = |files: &[&str], dirs: &[&str], links: &[&str]| {
            reapi::Directory {
                files: files.iter().map(|n| file(n)).collect(),
                directories: dirs.iter().map(|n| dir(n)).collect(),
                symlinks: links.iter().map(|n| link(n)).collect(),
                ..Default::default()
            }
            .encode_to_vec()
        };
        // Files, directories, symlinks, and the name given twice.
        type Case<'a> = (&'a [&'a str], &'a [&'a str], &'a [&'a str], &'a str);
        let cases: [Case; 7] = [
            (&["a", "b", "b"], &[], &[], "b"),
            (&["a", "m"], &["b", "m"], &[], "m"),
            (&["a", "z"], &[], &["b", "z"], "z"),
            (&[], &["c", "d"], &["a", "d"], "d"),
            (&["m", "a"], &["b", "m"], &[], "m"),
            (&["b", "a"], &[], &["c", "a"], "a"),
            (&["q"], &["r", "q"], &["s"], "q"),
        ];
        for (files, dirs, links, twice) in cases {
            let Err(why) = check("h", &blob(files, dirs, links)) else {
                panic!("{files:?} {dirs:?} {links:?} accepted");
            };
            assert!(
                matches!(&why.fault, Fault::NameTwice { name } if name == twice),
                "{why}"
            );
            assert_eq!(
                why.to_string(),
                format!("directory h: the name {twice:?} appears twice")
            );
        }
        let distinct = check("h", &blob(&["a", "c"], &["b", "d"], &["e"])).unwrap();
        assert!(distinct.order.is_none(), "sorted: no index needed");
        let distinct = check("h", &blob(&["c", "a"], &["b"], &["e"])).unwrap();
        assert!(distinct.order.is_some(), "unsorted: an index");
    }

    #[test]
    fn entries_are_found_by_name_whether_or_not_the_blob_sorted_them() {
        let digest = |n: u8| reapi::Digest {
            hash: format!("{n:02x}").repeat(32),
            size_bytes: 1,
        };
        let file = |name: &str| reapi::FileNode {
            name: name.into(),
            digest: Some(digest(1)),
            ..Default::default()
        };
        let dir = |name: &str| reapi::DirectoryNode {
            name: name.into(),
            digest: Some(digest(2)),
        };
        let link = |name: &str| reapi::SymlinkNode {
            name: name.into(),
            target: "t".into(),
            ..Default::default()
        };
        for (files, dirs, links) in [
            (["a", "c"], ["b", "d"], ["e", "f"]),
            (["c", "a"], ["d", "b"], ["f", "e"]),
        ] {
            let blob = reapi::Directory {
                files: files.iter().map(|n| file(n)).collect(),
                directories: dirs.iter().map(|n| dir(n)).collect(),
                symlinks: links.iter().map(|n| link(n)).collect(),
                ..Default::default()
            }
            .encode_to_vec();
            let checked = check("h", &blob).unwrap();
            for name in files {
                assert!(matches!(checked.find(name), Some(Entry::File(f)) if &*f.name == name));
            }
            for name in dirs {
                assert!(matches!(checked.find(name), Some(Entry::Dir(d)) if &*d.name == name));
            }
            for name in links {
                assert!(matches!(checked.find(name), Some(Entry::Symlink(l)) if &*l.name == name));
            }
            for absent in ["", "0", "bb", "g"] {
                assert!(checked.find(absent).is_none(), "{absent:?}");
            }
        }
    }
}
