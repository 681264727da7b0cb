//! Attributes as the core reports them, independent of the FUSE library.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::stat::FileStat;

pub use crate::sandbox::file_kind::FileKind;

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
    /// Attributes of the underlying object (its `stat`), shown under
    /// inode `ino`.
    // stat field widths differ between Linux and macOS.
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    pub fn from_stat(ino: u64, st: &FileStat) -> Attr {
        let mode = st.st_mode as u32;
        Attr {
            ino,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: time(st.st_atime as i64, st.st_atime_nsec as i64),
            mtime: time(st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime: time(st.st_ctime as i64, st.st_ctime_nsec as i64),
            kind: FileKind::from_mode(mode),
            perm: (mode & 0o7777) as u16,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev as u32,
            blksize: st.st_blksize as u32,
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
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
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

/// A fingerprint of a file's identity and version; never 0.
pub(super) fn fingerprint(st: &FileStat) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (
        file_id(st),
        st.st_size,
        st.st_mtime,
        st.st_mtime_nsec,
        st.st_ctime,
        st.st_ctime_nsec,
    )
        .hash(&mut hasher);
    hasher.finish() | 1
}

/// (device, inode) of a stat result.
// dev_t and ino_t differ in width between platforms.
#[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
pub(super) fn file_id(st: &FileStat) -> (u64, u64) {
    (st.st_dev as u64, st.st_ino as u64)
}
