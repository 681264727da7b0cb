//! The kernel's FUSE ABI as the io_uring transport needs it, transcribed
//! from include/uapi/linux/fuse.h (protocol 7.42 and later): the request
//! and answer headers, the per-opcode structs, and the ring's own header
//! and command. Native byte order, as the kernel writes them.
//!
//! Every struct is `repr(C)` with explicit padding fields only, so any
//! byte pattern is a valid value ([`Pod`]), and the sizes are checked
//! below against the header's.

#![allow(non_camel_case_types)]

/// Opcodes (enum fuse_opcode).
pub const FUSE_LOOKUP: u32 = 1;
pub const FUSE_FORGET: u32 = 2;
pub const FUSE_GETATTR: u32 = 3;
pub const FUSE_SETATTR: u32 = 4;
pub const FUSE_READLINK: u32 = 5;
pub const FUSE_SYMLINK: u32 = 6;
pub const FUSE_MKNOD: u32 = 8;
pub const FUSE_MKDIR: u32 = 9;
pub const FUSE_UNLINK: u32 = 10;
pub const FUSE_RMDIR: u32 = 11;
pub const FUSE_RENAME: u32 = 12;
pub const FUSE_LINK: u32 = 13;
pub const FUSE_OPEN: u32 = 14;
pub const FUSE_READ: u32 = 15;
pub const FUSE_WRITE: u32 = 16;
pub const FUSE_STATFS: u32 = 17;
pub const FUSE_RELEASE: u32 = 18;
pub const FUSE_FSYNC: u32 = 20;
pub const FUSE_SETXATTR: u32 = 21;
pub const FUSE_GETXATTR: u32 = 22;
pub const FUSE_LISTXATTR: u32 = 23;
pub const FUSE_REMOVEXATTR: u32 = 24;
pub const FUSE_FLUSH: u32 = 25;
pub const FUSE_INIT: u32 = 26;
pub const FUSE_OPENDIR: u32 = 27;
pub const FUSE_READDIR: u32 = 28;
pub const FUSE_RELEASEDIR: u32 = 29;
pub const FUSE_FSYNCDIR: u32 = 30;
pub const FUSE_ACCESS: u32 = 34;
pub const FUSE_CREATE: u32 = 35;
pub const FUSE_DESTROY: u32 = 38;
pub const FUSE_BATCH_FORGET: u32 = 42;
pub const FUSE_FALLOCATE: u32 = 43;
pub const FUSE_READDIRPLUS: u32 = 44;
pub const FUSE_RENAME2: u32 = 45;

/// fuse_getattr_in.getattr_flags: `fh` is valid.
pub const FUSE_GETATTR_FH: u32 = 1 << 0;

/// fuse_setattr_in.valid bits.
pub const FATTR_MODE: u32 = 1 << 0;
pub const FATTR_UID: u32 = 1 << 1;
pub const FATTR_GID: u32 = 1 << 2;
pub const FATTR_SIZE: u32 = 1 << 3;
pub const FATTR_ATIME: u32 = 1 << 4;
pub const FATTR_MTIME: u32 = 1 << 5;
pub const FATTR_FH: u32 = 1 << 6;
pub const FATTR_ATIME_NOW: u32 = 1 << 7;
pub const FATTR_MTIME_NOW: u32 = 1 << 8;

/// fuse_fsync_in.fsync_flags: data only.
pub const FUSE_FSYNC_FDATASYNC: u32 = 1 << 0;

/// fuse_open_out.open_flags.
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
pub const FOPEN_PASSTHROUGH: u32 = 1 << 7;

/// Ring commands (enum fuse_uring_cmd), in the SQE's cmd_op.
pub const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
pub const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;

pub const FUSE_URING_IN_OUT_HEADER_SZ: usize = 128;
pub const FUSE_URING_OP_IN_OUT_SZ: usize = 128;

/// The kernel's smallest request buffer (FUSE_MIN_READ_BUFFER).
pub const FUSE_MIN_READ_BUFFER: usize = 8192;

/// Plain old data: every byte pattern is a valid value and there is no
/// implicit padding.
///
/// # Safety
/// Only for `repr(C)` structs of integers and byte arrays whose size is
/// the sum of their fields'.
pub unsafe trait Pod: Copy + Default {}

/// Reads a `T` from the start of `bytes`, or `None` if they are too short.
pub fn read<T: Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: the length was checked, and any bytes are a valid `T`.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// The bytes of a `T`.
pub fn bytes_of<T: Pod>(value: &T) -> &[u8] {
    // SAFETY: `T` has no padding, so all its bytes are initialized.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
}

macro_rules! pod {
    ($($name:ident = $size:expr;)*) => {
        $(
            // SAFETY: checked below to have no implicit padding.
            unsafe impl Pod for $name {}
            const _: () = assert!(size_of::<$name>() == $size);
        )*
    };
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_in_header {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub total_extlen: u16,
    pub padding: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_out_header {
    pub len: u32,
    pub error: i32,
    pub unique: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_entry_out {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: fuse_attr,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_attr_out {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: fuse_attr,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_getattr_in {
    pub getattr_flags: u32,
    pub dummy: u32,
    pub fh: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_setattr_in {
    pub valid: u32,
    pub padding: u32,
    pub fh: u64,
    pub size: u64,
    pub lock_owner: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub unused4: u32,
    pub uid: u32,
    pub gid: u32,
    pub unused5: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_mknod_in {
    pub mode: u32,
    pub rdev: u32,
    pub umask: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_mkdir_in {
    pub mode: u32,
    pub umask: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_rename_in {
    pub newdir: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_rename2_in {
    pub newdir: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_link_in {
    pub oldnodeid: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_open_in {
    pub flags: u32,
    pub open_flags: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_create_in {
    pub flags: u32,
    pub mode: u32,
    pub umask: u32,
    pub open_flags: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_open_out {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_release_in {
    pub fh: u64,
    pub flags: u32,
    pub release_flags: u32,
    pub lock_owner: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_read_in {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub read_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_write_in {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub write_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_write_out {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_kstatfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_fsync_in {
    pub fh: u64,
    pub fsync_flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_setxattr_in {
    pub size: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_getxattr_in {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_getxattr_out {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_access_in {
    pub mask: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_flush_in {
    pub fh: u64,
    pub unused: u32,
    pub padding: u32,
    pub lock_owner: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_fallocate_in {
    pub fh: u64,
    pub offset: u64,
    pub length: u64,
    pub mode: u32,
    pub padding: u32,
}

/// A directory entry's fixed part; the name and padding to 8 bytes follow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_dirent {
    pub ino: u64,
    pub off: u64,
    pub namelen: u32,
    pub typ: u32,
}

/// The trailer of a ring entry's header buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_uring_ent_in_out {
    pub flags: u64,
    /// The request's id, to name in the COMMIT_AND_FETCH that answers it.
    pub commit_id: u64,
    /// Bytes used in the payload buffer, in either direction.
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// A ring entry's header buffer (iov[0] of a REGISTER).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct fuse_uring_req_header {
    /// fuse_in_header from the kernel, fuse_out_header back.
    pub in_out: [u8; FUSE_URING_IN_OUT_HEADER_SZ],
    /// The request's per-opcode struct (its first argument).
    pub op_in: [u8; FUSE_URING_OP_IN_OUT_SZ],
    pub ring_ent_in_out: fuse_uring_ent_in_out,
}

impl Default for fuse_uring_req_header {
    fn default() -> Self {
        fuse_uring_req_header {
            in_out: [0; FUSE_URING_IN_OUT_HEADER_SZ],
            op_in: [0; FUSE_URING_OP_IN_OUT_SZ],
            ring_ent_in_out: fuse_uring_ent_in_out::default(),
        }
    }
}

/// The command in the first bytes of a 128-byte SQE's 80-byte area.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fuse_uring_cmd_req {
    pub flags: u64,
    pub commit_id: u64,
    pub qid: u16,
    pub padding: [u8; 6],
}

pod! {
    fuse_in_header = 40;
    fuse_out_header = 16;
    fuse_attr = 88;
    fuse_entry_out = 128;
    fuse_attr_out = 104;
    fuse_getattr_in = 16;
    fuse_setattr_in = 88;
    fuse_mknod_in = 16;
    fuse_mkdir_in = 8;
    fuse_rename_in = 8;
    fuse_rename2_in = 16;
    fuse_link_in = 8;
    fuse_open_in = 8;
    fuse_create_in = 16;
    fuse_open_out = 16;
    fuse_release_in = 24;
    fuse_read_in = 40;
    fuse_write_in = 40;
    fuse_write_out = 8;
    fuse_kstatfs = 80;
    fuse_fsync_in = 16;
    fuse_setxattr_in = 8;
    fuse_getxattr_in = 8;
    fuse_getxattr_out = 8;
    fuse_access_in = 8;
    fuse_flush_in = 24;
    fuse_fallocate_in = 32;
    fuse_dirent = 24;
    fuse_uring_ent_in_out = 32;
    fuse_uring_req_header = 288;
    fuse_uring_cmd_req = 24;
}
