//! Attributes as the core reports them, independent of the FUSE library.

use std::fs::Metadata;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The type of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    RegularFile,
    Symlink,
    NamedPipe,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileKind {
    pub fn from_std(file_type: std::fs::FileType) -> FileKind {
        if file_type.is_dir() {
            FileKind::Directory
        } else if file_type.is_symlink() {
            FileKind::Symlink
        } else if file_type.is_fifo() {
            FileKind::NamedPipe
        } else if file_type.is_socket() {
            FileKind::Socket
        } else if file_type.is_char_device() {
            FileKind::CharDevice
        } else if file_type.is_block_device() {
            FileKind::BlockDevice
        } else {
            FileKind::RegularFile
        }
    }

    // mode_t is u16 on macOS and u32 on Linux: the conversions are needed.
    #[allow(clippy::useless_conversion)]
    pub fn from_mode(mode: u32) -> FileKind {
        let is = |kind: libc::mode_t| mode & u32::from(libc::S_IFMT) == u32::from(kind);
        if is(libc::S_IFDIR) {
            FileKind::Directory
        } else if is(libc::S_IFLNK) {
            FileKind::Symlink
        } else if is(libc::S_IFIFO) {
            FileKind::NamedPipe
        } else if is(libc::S_IFSOCK) {
            FileKind::Socket
        } else if is(libc::S_IFCHR) {
            FileKind::CharDevice
        } else if is(libc::S_IFBLK) {
            FileKind::BlockDevice
        } else {
            FileKind::RegularFile
        }
    }
}

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
