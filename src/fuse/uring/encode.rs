//! Encoding answers into a ring entry's payload buffer, laid out as the
//! kernel's out structs. A write past the buffer is an error (the request
//! is then answered EIO), never a panic.

use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::abi::{self, *};
use crate::fuse::Open;
use crate::sandbox::tree::{Attr, DirEntry, FileKind, StatFs};

/// The answer did not fit the payload buffer.
#[derive(Debug, PartialEq, Eq)]
pub struct Overflow;

/// Appends to a buffer, counting what was written.
pub struct Writer<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Writer<'a> {
    pub fn new(buf: &'a mut [u8]) -> Writer<'a> {
        Writer { buf, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn bytes(&mut self, bytes: &[u8]) -> Result<(), Overflow> {
        let end = self.len.checked_add(bytes.len()).ok_or(Overflow)?;
        self.buf
            .get_mut(self.len..end)
            .ok_or(Overflow)?
            .copy_from_slice(bytes);
        self.len = end;
        Ok(())
    }

    pub fn put<T: Pod>(&mut self, value: &T) -> Result<(), Overflow> {
        self.bytes(abi::bytes_of(value))
    }
}

/// Seconds and nanoseconds since the epoch; before it, counted back.
fn epoch(time: SystemTime) -> (u64, u32) {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs(), d.subsec_nanos()),
        Err(before) => {
            let d = before.duration();
            let (secs, nanos) = (d.as_secs() as i64, d.subsec_nanos());
            if nanos == 0 {
                ((-secs) as u64, 0)
            } else {
                ((-secs - 1) as u64, 1_000_000_000 - nanos)
            }
        }
    }
}

fn split(ttl: Duration) -> (u64, u32) {
    (ttl.as_secs(), ttl.subsec_nanos())
}

pub fn mode_bits(kind: FileKind) -> u32 {
    // mode_t is u32 on Linux, the only home of this transport.
    match kind {
        FileKind::Directory => libc::S_IFDIR,
        FileKind::RegularFile => libc::S_IFREG,
        FileKind::Symlink => libc::S_IFLNK,
        FileKind::NamedPipe => libc::S_IFIFO,
        FileKind::Socket => libc::S_IFSOCK,
        FileKind::CharDevice => libc::S_IFCHR,
        FileKind::BlockDevice => libc::S_IFBLK,
    }
}

/// The dirent type: the mode's file type bits shifted down (DT_*).
fn dirent_type(kind: FileKind) -> u32 {
    mode_bits(kind) >> 12
}

pub fn attr(attr: &Attr) -> fuse_attr {
    let (atime, atimensec) = epoch(attr.atime);
    let (mtime, mtimensec) = epoch(attr.mtime);
    let (ctime, ctimensec) = epoch(attr.ctime);
    fuse_attr {
        ino: attr.ino,
        size: attr.size,
        blocks: attr.blocks,
        atime,
        mtime,
        ctime,
        atimensec,
        mtimensec,
        ctimensec,
        mode: mode_bits(attr.kind) | u32::from(attr.perm),
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.blksize,
        flags: 0,
    }
}

/// An entry; `None` is a negative one (inode 0, cached as absent).
pub fn entry(node: Option<&Attr>, ttl: Duration) -> fuse_entry_out {
    let (secs, nsecs) = split(ttl);
    fuse_entry_out {
        nodeid: node.map_or(0, |a| a.ino),
        generation: 0,
        entry_valid: secs,
        attr_valid: secs,
        entry_valid_nsec: nsecs,
        attr_valid_nsec: nsecs,
        attr: node.map(attr).unwrap_or_default(),
    }
}

pub fn attr_out(node: &Attr, ttl: Duration) -> fuse_attr_out {
    let (secs, nsecs) = split(ttl);
    fuse_attr_out {
        attr_valid: secs,
        attr_valid_nsec: nsecs,
        dummy: 0,
        attr: attr(node),
    }
}

pub fn open_out(open: &Open) -> fuse_open_out {
    let (open_flags, backing_id) = match open.backing_id {
        Some(id) => (FOPEN_PASSTHROUGH, id as i32),
        None if open.keep_cache => (FOPEN_KEEP_CACHE, 0),
        None => (0, 0),
    };
    fuse_open_out {
        fh: open.fh,
        open_flags,
        backing_id,
    }
}

pub fn statfs(s: &StatFs) -> fuse_kstatfs {
    fuse_kstatfs {
        blocks: s.blocks,
        bfree: s.bfree,
        bavail: s.bavail,
        files: s.files,
        ffree: s.ffree,
        bsize: s.bsize,
        namelen: s.namelen,
        frsize: s.frsize,
        padding: 0,
        spare: [0; 6],
    }
}

/// Appends one directory entry, followed by the offset of the next, to a
/// READDIR answer unless that would take it past `size` bytes (the
/// kernel's buffer); says whether it did.
pub fn dirent(out: &mut Vec<u8>, next: u64, entry: &DirEntry, size: usize) -> bool {
    let name = entry.name.as_bytes();
    let unpadded = size_of::<fuse_dirent>() + name.len();
    let padded = unpadded.next_multiple_of(8);
    if out.len() + padded > size {
        return false;
    }
    let head = fuse_dirent {
        ino: entry.ino,
        off: next,
        namelen: name.len() as u32,
        typ: dirent_type(entry.kind),
    };
    out.extend_from_slice(abi::bytes_of(&head));
    out.extend_from_slice(name);
    out.extend_from_slice(&[0; 8][..padded - unpadded]);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirents_are_padded_to_eight_bytes_and_stop_at_the_kernels_size() {
        let entry = |name: &'static str, ino| DirEntry {
            name: std::ffi::OsStr::new(name),
            ino,
            kind: FileKind::RegularFile,
        };
        let mut buf = Vec::new();
        assert!(dirent(&mut buf, 1, &entry("a", 10), 256));
        assert!(dirent(&mut buf, 2, &entry("bcdefghij", 11), 256));
        // 24 + 1 -> 32; 24 + 9 -> 40.
        assert_eq!(buf.len(), 72);
        assert_eq!(&buf[0..8], &10u64.to_ne_bytes());
        assert_eq!(&buf[8..16], &1u64.to_ne_bytes());
        assert_eq!(&buf[16..20], &1u32.to_ne_bytes());
        assert_eq!(&buf[20..24], &(libc::DT_REG as u32).to_ne_bytes());
        assert_eq!(&buf[24..32], b"a\0\0\0\0\0\0\0");
        let mut small = Vec::new();
        assert!(dirent(&mut small, 1, &entry("a", 10), 40));
        assert!(
            !dirent(&mut small, 2, &entry("bcdefghij", 11), 40),
            "the second entry does not fit in 40 bytes"
        );
        assert_eq!(small.len(), 32);
    }

    #[test]
    fn a_write_past_the_buffer_is_an_error() {
        let mut buf = [0u8; 10];
        let mut out = Writer::new(&mut buf);
        assert_eq!(out.bytes(&[1; 8]), Ok(()));
        assert_eq!(out.bytes(&[1; 3]), Err(Overflow));
        assert_eq!(out.len(), 8);
    }

    #[test]
    fn times_before_the_epoch_count_back() {
        let t = UNIX_EPOCH - Duration::from_millis(1500);
        assert_eq!(epoch(t), ((-2i64) as u64, 500_000_000));
        assert_eq!(epoch(UNIX_EPOCH + Duration::new(3, 7)), (3, 7));
    }

    #[test]
    fn passthrough_opens_name_their_backing_id() {
        let out = open_out(&Open {
            fh: 4,
            keep_cache: false,
            backing_id: Some(9),
        });
        assert_eq!(
            (out.fh, out.open_flags, out.backing_id),
            (4, FOPEN_PASSTHROUGH, 9)
        );
        let cached = open_out(&Open {
            fh: 5,
            keep_cache: true,
            backing_id: None,
        });
        assert_eq!(cached.open_flags, FOPEN_KEEP_CACHE);
    }
}
