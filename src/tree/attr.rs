//! Attributes as the core reports them, independent of the FUSE library.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use crate::file_kind::FileKind;

/// What `stat` shows for a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub kind: FileKind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

impl Attr {
    /// Attributes of the underlying object, shown under inode `ino`.
    pub fn from_metadata(ino: u64, meta: &Metadata) -> Attr {
        Attr {
            ino,
            size: meta.size(),
            blocks: meta.blocks(),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            kind: FileKind::from_mode(meta.mode()),
            perm: (meta.mode() & 0o7777) as u16,
            nlink: meta.nlink() as u32,
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: meta.rdev() as u32,
            blksize: meta.blksize() as u32,
        }
    }

    /// Attributes of a directory that exists only in the view: read-only,
    /// owned by whoever runs the daemon.
    pub fn virtual_dir(ino: u64, created: SystemTime, nlink: u32) -> Attr {
        Attr {
            ino,
            size: 0,
            blocks: 0,
            atime: created,
            mtime: created,
            ctime: created,
            kind: FileKind::Directory,
            perm: 0o555,
            nlink,
            // SAFETY: getuid/getgid cannot fail.
            uid: unsafe { libc::geteuid() },
            gid: unsafe { libc::getegid() },
            rdev: 0,
            blksize: 4096,
        }
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::new(secs.unsigned_abs(), 0) + Duration::from_nanos(nsecs as u64)
    }
}
