//! The index of stashes handed on to the next daemon (see
//! [`super::stash::Stashes::hand_on`]): for each stash directory, its
//! name, its directories' stamps and its shape, in a binary form read
//! back with every length checked. The directories are ours alone; the
//! checks are so that a truncated or foreign file is refused whole rather
//! than half believed.
//!
//! Decoding is O(entries of every stash), which the first Create paid
//! while holding the pools (docs/BENCHMARKS.md). So a
//! backend starts reading it at once ([`Reading::start`]), beside its
//! store's adoption and its mount, and the pool takes the stashes read.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::sandbox::handed_on::{Damage, HandedOnError};
use crate::sandbox::materialize::reuse::{Stamp, Stamps};
use crate::sandbox::materialize::shape::{Dir, Node};

/// The index's name in a hand-off directory.
pub const INDEX: &str = "index";

/// The first bytes of an index, naming its format.
const MAGIC: &[u8] = b"actionfs-stashes 1\n";

/// Deeper than any tree a sandbox holds; a bound for reading, so that no
/// file can make the reader recurse without end.
const MAX_DEPTH: usize = 4096;

/// One stash as handed on: its directory's name in the hand-off
/// directory, its stamps and its shape.
#[derive(Debug, PartialEq)]
pub struct Handed {
    pub name: OsString,
    pub stamps: Stamps,
    pub shape: Dir,
}

/// The index of `stashes`.
pub fn encode(stashes: &[Handed]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    put_len(&mut out, stashes.len());
    for stash in stashes {
        put_bytes(&mut out, stash.name.as_bytes());
        put_len(&mut out, stash.stamps.len());
        for (path, stamp) in &stash.stamps {
            put_bytes(&mut out, path.as_os_str().as_bytes());
            for word in stamp.to_words() {
                out.extend_from_slice(&word.to_le_bytes());
            }
        }
        put_dir(&mut out, &stash.shape);
    }
    out
}

/// The stashes of index `bytes` (read from `path`), or why it cannot be
/// read.
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Vec<Handed>, HandedOnError> {
    let mut reader = Reader { path, bytes, at: 0 };
    if reader.take(MAGIC.len()).ok() != Some(MAGIC) {
        return Err(reader.damaged(
            0,
            Damage::Foreign {
                what: "a stash index",
            },
        ));
    }
    let count = reader.len()?;
    let mut stashes = Vec::new();
    for _ in 0..count {
        let name = OsString::from_vec(reader.bytes()?.to_vec());
        let mut stamps = Stamps::new();
        for _ in 0..reader.len()? {
            let path = PathBuf::from(OsString::from_vec(reader.bytes()?.to_vec()));
            let mut words = [0i64; 7];
            for word in &mut words {
                *word = i64::from_le_bytes(reader.take(8)?.try_into().expect("8 bytes"));
            }
            stamps.insert(path, Stamp::from_words(words));
        }
        let shape = reader.dir(0)?;
        stashes.push(Handed {
            name,
            stamps,
            shape,
        });
    }
    if reader.at != bytes.len() {
        return Err(reader.damaged(reader.at, Damage::Trailing(bytes.len() - reader.at)));
    }
    Ok(stashes)
}

/// The stashes handed on in hand-off directory `dir`, or why they cannot
/// be read.
pub fn read(dir: &Path) -> Result<Vec<Handed>, HandedOnError> {
    let index = dir.join(INDEX);
    let bytes = std::fs::read(&index).map_err(|source| HandedOnError::Io {
        syscall: "read",
        path: index.clone(),
        source,
    })?;
    decode(&index, &bytes)
}

/// A hand-off directory whose index is being read on a thread of its own.
pub struct Reading {
    dir: PathBuf,
    /// `None` if the thread could not start: read when taken.
    thread: Option<JoinHandle<Result<Vec<Handed>, HandedOnError>>>,
}

impl Reading {
    /// Starts reading the index of hand-off directory `dir`.
    pub fn start(dir: PathBuf) -> Reading {
        let from = dir.clone();
        let thread = std::thread::Builder::new()
            .name("stash-index".into())
            .spawn(move || read(&from))
            .map_err(|err| log::warn!("reading the stashes handed on at first use: spawn: {err}"))
            .ok();
        Reading { dir, thread }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory and what its index holds, once read.
    pub fn finish(self) -> (PathBuf, Result<Vec<Handed>, HandedOnError>) {
        let read = match self.thread {
            Some(thread) => thread.join().unwrap_or_else(|_| {
                Err(HandedOnError::Unread {
                    path: self.dir.join(INDEX),
                })
            }),
            None => read(&self.dir),
        };
        (self.dir, read)
    }
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(&(len as u64).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

const LINK: u8 = 0;
const DIR: u8 = 1;

fn put_dir(out: &mut Vec<u8>, dir: &Dir) {
    put_len(out, dir.entries().len());
    for (name, node) in dir.entries() {
        put_bytes(out, name.as_bytes());
        match node {
            Node::Link(target) => {
                out.push(LINK);
                put_bytes(out, target.as_bytes());
            }
            Node::Dir(sub) => {
                out.push(DIR);
                put_dir(out, sub);
            }
        }
    }
}

struct Reader<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn damaged(&self, at: usize, damage: Damage) -> HandedOnError {
        HandedOnError::Damaged {
            path: self.path.to_owned(),
            at,
            damage,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], HandedOnError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| self.damaged(self.at, Damage::CutShort))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    /// A length, which cannot exceed the bytes left (every counted item
    /// takes at least one).
    fn len(&mut self) -> Result<usize, HandedOnError> {
        let len = u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes"));
        usize::try_from(len)
            .ok()
            .filter(|&len| len <= self.bytes.len() - self.at)
            .ok_or_else(|| self.damaged(self.at - 8, Damage::Length(len)))
    }

    fn bytes(&mut self) -> Result<&'a [u8], HandedOnError> {
        let len = self.len()?;
        self.take(len)
    }

    fn dir(&mut self, depth: usize) -> Result<Dir, HandedOnError> {
        if depth > MAX_DEPTH {
            return Err(self.damaged(self.at, Damage::TooDeep(MAX_DEPTH)));
        }
        // Written in name order (a BTreeMap's): checked so, then built in
        // one pass rather than inserted name by name.
        let count = self.len()?;
        // (Capacity bounded: a count is only checked against the bytes left.)
        let mut entries: Vec<(OsString, Node)> = Vec::with_capacity(count.min(1024));
        for _ in 0..count {
            let name_at = self.at;
            let name = OsString::from_vec(self.bytes()?.to_vec());
            if entries.last().is_some_and(|(last, _)| *last >= name) {
                return Err(self.damaged(name_at, Damage::NamesOutOfOrder));
            }
            let node = match self.take(1)?[0] {
                LINK => Node::Link(OsString::from_vec(self.bytes()?.to_vec())),
                DIR => Node::Dir(Arc::new(self.dir(depth + 1)?)),
                tag => return Err(self.damaged(self.at - 1, Damage::UnknownKind(tag))),
            };
            entries.push((name, node));
        }
        Ok(Dir::new(entries.into_iter().collect::<BTreeMap<_, _>>()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Dir {
        let sub = Dir::new(BTreeMap::from([(
            OsString::from("a.h"),
            Node::Link("/store/c/abc".into()),
        )]));
        Dir::new(BTreeMap::from([
            (OsString::from("inc"), Node::Dir(Arc::new(sub))),
            (
                OsString::from("odd\nname"),
                Node::Link(OsString::from_vec(vec![0xff, b'x'])),
            ),
        ]))
    }

    #[test]
    fn stashes_read_back_as_they_were_written() {
        let stamps = Stamps::from([
            (PathBuf::new(), Stamp::from_words([1, 2, 3, 4, 5, 6, 7])),
            (
                PathBuf::from("inc"),
                Stamp::from_words([8, -1, 0, 9, 10, 4096, 2]),
            ),
        ]);
        let stashes = vec![
            Handed {
                name: "stash-0".into(),
                stamps,
                shape: shape(),
            },
            Handed {
                name: "stash-1".into(),
                stamps: Stamps::new(),
                shape: Dir::default(),
            },
        ];
        let read = decode(Path::new(INDEX), &encode(&stashes)).unwrap();
        assert_eq!(read, stashes);
        assert_eq!(read[0].shape.digest(), shape().digest());
        assert_eq!(read[0].shape.links(), 2);
    }

    #[test]
    fn an_index_read_on_its_own_thread_is_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let stashes = vec![Handed {
            name: "stash-0".into(),
            stamps: Stamps::new(),
            shape: shape(),
        }];
        std::fs::write(dir.path().join(INDEX), encode(&stashes)).unwrap();
        let (read_in, read) = Reading::start(dir.path().to_owned()).finish();
        assert_eq!(read_in, dir.path());
        assert_eq!(read.unwrap(), stashes);

        let missing = dir.path().join("none");
        let (_, read) = Reading::start(missing.clone()).finish();
        let why = read.unwrap_err().to_string();
        assert!(why.contains(&format!("{:?}", missing.join(INDEX))), "{why}");
    }

    /// An index of one stash whose root holds links named `names`, in
    /// that order (encode writes them sorted, so it cannot make one out
    /// of order).
    fn one_stash_of_links(names: &[&[u8]]) -> Vec<u8> {
        let mut index = MAGIC.to_vec();
        put_len(&mut index, 1);
        put_bytes(&mut index, b"stash-0");
        put_len(&mut index, 0);
        put_len(&mut index, names.len());
        for name in names {
            put_bytes(&mut index, name);
            index.push(LINK);
            put_bytes(&mut index, b"/t");
        }
        index
    }

    #[test]
    fn a_cut_or_foreign_index_is_refused_whole() {
        let decode = |bytes: &[u8]| decode(Path::new("/state/stashes/index"), bytes);
        let why = |bytes: &[u8]| decode(bytes).unwrap_err().to_string();
        let stashes = vec![Handed {
            name: "stash-0".into(),
            stamps: Stamps::new(),
            shape: shape(),
        }];
        let bytes = encode(&stashes);
        for cut in [0, MAGIC.len(), bytes.len() / 2, bytes.len() - 1] {
            let err = why(&bytes[..cut]);
            assert!(
                err.starts_with("\"/state/stashes/index\": "),
                "cut at {cut}: {err}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(why(&longer).contains("after the last stash"));
        let mut foreign = bytes.clone();
        foreign[MAGIC.len() - 2] = b'9';
        assert!(why(&foreign).contains("version"));
        // Names out of order, or twice, in a directory: refused.
        let twice = why(&one_stash_of_links(&[b"same", b"same"]));
        assert!(twice.contains("twice"), "{twice}");
        let backwards = why(&one_stash_of_links(&[b"b", b"a"]));
        assert!(backwards.contains("out of order"), "{backwards}");
        assert!(decode(&one_stash_of_links(&[b"a", b"b"])).is_ok());
        // A huge count is refused before anything is allocated for it.
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            decode(&huge),
            Err(HandedOnError::Damaged {
                at,
                damage: Damage::Length(u64::MAX),
                ..
            }) if at == MAGIC.len()
        ));
        assert!(why(&huge).contains("length"));
    }
}
