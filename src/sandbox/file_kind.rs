//! The types of file-system objects, independent of any library.

use std::os::unix::fs::FileTypeExt;

/// The type of a file-system object.
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

    /// The type in words, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            FileKind::Directory => "directory",
            FileKind::RegularFile => "regular file",
            FileKind::Symlink => "symlink",
            FileKind::NamedPipe => "named pipe",
            FileKind::Socket => "socket",
            FileKind::CharDevice => "character device",
            FileKind::BlockDevice => "block device",
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
