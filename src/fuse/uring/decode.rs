//! Decoding a request that arrived on a ring: the kernel puts the
//! `fuse_in_header` and the opcode's fixed struct in the entry's header
//! buffer and the rest (names, data) in its payload buffer. Nothing here
//! trusts a length: a short or malformed request is an error, never a
//! panic.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use super::abi::{self, *};
use crate::sandbox::tree::{SetAttr, SetTime};

/// One request, its variable parts borrowed from the ring's buffers.
#[derive(Debug)]
pub enum Request<'a> {
    Lookup {
        name: &'a OsStr,
    },
    Getattr {
        fh: Option<u64>,
    },
    Setattr(SetAttr),
    Readlink,
    Symlink {
        name: &'a OsStr,
        target: &'a Path,
    },
    Mknod {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    },
    Mkdir {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: &'a OsStr,
    },
    Rmdir {
        name: &'a OsStr,
    },
    Rename {
        name: &'a OsStr,
        newparent: u64,
        newname: &'a OsStr,
        flags: u32,
    },
    /// The header's node is the new parent.
    Link {
        ino: u64,
        newname: &'a OsStr,
    },
    Open {
        flags: i32,
    },
    Read {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Write {
        fh: u64,
        offset: u64,
        data: &'a [u8],
    },
    Statfs,
    Release {
        fh: u64,
    },
    Fsync {
        fh: u64,
        datasync: bool,
    },
    Setxattr {
        name: &'a OsStr,
        value: &'a [u8],
        flags: i32,
    },
    Getxattr {
        name: &'a OsStr,
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a OsStr,
    },
    Flush,
    Opendir,
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Releasedir {
        fh: u64,
    },
    Fsyncdir,
    Access,
    Create {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    },
    Fallocate {
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    },
    /// Never on a ring in practice (FORGET, INIT, INTERRUPT...), or not
    /// served: answered ENOSYS.
    Unsupported(u32),
}

/// Why a request could not be decoded.
#[derive(Debug, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

type Decoded<'a> = Result<Request<'a>, Malformed>;

/// The opcode's fixed struct, from the header buffer's op area.
fn op<T: Pod>(op_in: &[u8]) -> Result<T, Malformed> {
    abi::read(op_in).ok_or(Malformed("per-opcode struct cut short"))
}

/// A NUL-terminated name at the start of `bytes`, and what follows it.
fn name(bytes: &[u8]) -> Result<(&OsStr, &[u8]), Malformed> {
    let end = bytes
        .iter()
        .position(|&b| b == 0)
        .ok_or(Malformed("name without its NUL"))?;
    Ok((OsStr::from_bytes(&bytes[..end]), &bytes[end + 1..]))
}

fn time(secs: u64, nsecs: u32, now: bool) -> SetTime {
    if now {
        return SetTime::Now;
    }
    // Seconds are signed in the kernel; before 1970 counts back.
    let secs = secs as i64;
    let at = if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs.into())
    };
    SetTime::At(at)
}

fn setattr(arg: &fuse_setattr_in) -> SetAttr {
    let has = |bit| arg.valid & bit != 0;
    SetAttr {
        mode: has(FATTR_MODE).then_some(arg.mode),
        uid: has(FATTR_UID).then_some(arg.uid),
        gid: has(FATTR_GID).then_some(arg.gid),
        size: has(FATTR_SIZE).then_some(arg.size),
        atime: has(FATTR_ATIME).then(|| time(arg.atime, arg.atimensec, has(FATTR_ATIME_NOW))),
        mtime: has(FATTR_MTIME).then(|| time(arg.mtime, arg.mtimensec, has(FATTR_MTIME_NOW))),
        fh: has(FATTR_FH).then_some(arg.fh),
    }
}

/// Decodes request `opcode` from its fixed struct (`op_in`) and the used
/// part of its payload.
pub fn decode<'a>(opcode: u32, op_in: &'a [u8], payload: &'a [u8]) -> Decoded<'a> {
    Ok(match opcode {
        FUSE_LOOKUP => Request::Lookup {
            name: name(payload)?.0,
        },
        FUSE_GETATTR => {
            let arg: fuse_getattr_in = op(op_in)?;
            Request::Getattr {
                fh: (arg.getattr_flags & FUSE_GETATTR_FH != 0).then_some(arg.fh),
            }
        }
        FUSE_SETATTR => Request::Setattr(setattr(&op(op_in)?)),
        FUSE_READLINK => Request::Readlink,
        FUSE_SYMLINK => {
            let (link, rest) = name(payload)?;
            let target = name(rest)?.0;
            Request::Symlink {
                name: link,
                target: Path::new(target),
            }
        }
        FUSE_MKNOD => {
            let arg: fuse_mknod_in = op(op_in)?;
            Request::Mknod {
                name: name(payload)?.0,
                mode: arg.mode,
                umask: arg.umask,
                rdev: arg.rdev,
            }
        }
        FUSE_MKDIR => {
            let arg: fuse_mkdir_in = op(op_in)?;
            Request::Mkdir {
                name: name(payload)?.0,
                mode: arg.mode,
                umask: arg.umask,
            }
        }
        FUSE_UNLINK => Request::Unlink {
            name: name(payload)?.0,
        },
        FUSE_RMDIR => Request::Rmdir {
            name: name(payload)?.0,
        },
        FUSE_RENAME | abi::FUSE_RENAME2 => {
            let (newparent, flags) = if opcode == FUSE_RENAME {
                (op::<fuse_rename_in>(op_in)?.newdir, 0)
            } else {
                let arg: fuse_rename2_in = op(op_in)?;
                (arg.newdir, arg.flags)
            };
            let (old, rest) = name(payload)?;
            Request::Rename {
                name: old,
                newparent,
                newname: name(rest)?.0,
                flags,
            }
        }
        FUSE_LINK => Request::Link {
            ino: op::<fuse_link_in>(op_in)?.oldnodeid,
            newname: name(payload)?.0,
        },
        FUSE_OPEN => Request::Open {
            flags: op::<fuse_open_in>(op_in)?.flags as i32,
        },
        FUSE_READ => {
            let arg: fuse_read_in = op(op_in)?;
            Request::Read {
                fh: arg.fh,
                offset: arg.offset,
                size: arg.size,
            }
        }
        FUSE_WRITE => {
            let arg: fuse_write_in = op(op_in)?;
            let data = payload
                .get(..arg.size as usize)
                .ok_or(Malformed("write data shorter than its size"))?;
            Request::Write {
                fh: arg.fh,
                offset: arg.offset,
                data,
            }
        }
        FUSE_STATFS => Request::Statfs,
        FUSE_RELEASE => Request::Release {
            fh: op::<fuse_release_in>(op_in)?.fh,
        },
        FUSE_FSYNC | FUSE_FSYNCDIR => {
            let arg: fuse_fsync_in = op(op_in)?;
            if opcode == FUSE_FSYNCDIR {
                Request::Fsyncdir
            } else {
                Request::Fsync {
                    fh: arg.fh,
                    datasync: arg.fsync_flags & FUSE_FSYNC_FDATASYNC != 0,
                }
            }
        }
        FUSE_SETXATTR => {
            let arg: fuse_setxattr_in = op(op_in)?;
            let (attr, rest) = name(payload)?;
            let value = rest
                .get(..arg.size as usize)
                .ok_or(Malformed("xattr value shorter than its size"))?;
            Request::Setxattr {
                name: attr,
                value,
                flags: arg.flags as i32,
            }
        }
        FUSE_GETXATTR => {
            let arg: fuse_getxattr_in = op(op_in)?;
            Request::Getxattr {
                name: name(payload)?.0,
                size: arg.size,
            }
        }
        FUSE_LISTXATTR => Request::Listxattr {
            size: op::<fuse_getxattr_in>(op_in)?.size,
        },
        FUSE_REMOVEXATTR => Request::Removexattr {
            name: name(payload)?.0,
        },
        FUSE_FLUSH => Request::Flush,
        FUSE_OPENDIR => Request::Opendir,
        FUSE_READDIR => {
            let arg: fuse_read_in = op(op_in)?;
            Request::Readdir {
                fh: arg.fh,
                offset: arg.offset,
                size: arg.size,
            }
        }
        FUSE_RELEASEDIR => Request::Releasedir {
            fh: op::<fuse_release_in>(op_in)?.fh,
        },
        FUSE_ACCESS => Request::Access,
        FUSE_CREATE => {
            let arg: fuse_create_in = op(op_in)?;
            Request::Create {
                name: name(payload)?.0,
                mode: arg.mode,
                umask: arg.umask,
                flags: arg.flags as i32,
            }
        }
        FUSE_FALLOCATE => {
            let arg: fuse_fallocate_in = op(op_in)?;
            Request::Fallocate {
                fh: arg.fh,
                offset: arg.offset,
                length: arg.length,
                mode: arg.mode as i32,
            }
        }
        other => Request::Unsupported(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op_bytes<T: Pod>(value: T) -> Vec<u8> {
        let mut bytes = abi::bytes_of(&value).to_vec();
        bytes.resize(FUSE_URING_OP_IN_OUT_SZ, 0);
        bytes
    }

    #[test]
    fn names_and_data_come_from_the_payload() {
        let decoded = decode(FUSE_LOOKUP, &[0; 128], b"foo.h\0").unwrap();
        assert!(matches!(decoded, Request::Lookup { name } if name == "foo.h"));
        let rename = op_bytes(fuse_rename2_in {
            newdir: 9,
            flags: 1,
            padding: 0,
        });
        match decode(abi::FUSE_RENAME2, &rename, b"a\0bc\0").unwrap() {
            Request::Rename {
                name,
                newparent,
                newname,
                flags,
            } => assert_eq!(
                (name, newparent, newname, flags),
                ("a".as_ref(), 9, "bc".as_ref(), 1)
            ),
            other => panic!("decoded as {other:?}"),
        }
        let write = op_bytes(fuse_write_in {
            fh: 3,
            offset: 10,
            size: 4,
            ..Default::default()
        });
        match decode(FUSE_WRITE, &write, b"datamore").unwrap() {
            Request::Write { fh, offset, data } => {
                assert_eq!((fh, offset, data), (3, 10, &b"data"[..]))
            }
            other => panic!("decoded as {other:?}"),
        }
    }

    #[test]
    fn short_or_unterminated_requests_are_errors_not_panics() {
        assert!(decode(FUSE_LOOKUP, &[0; 128], b"no-nul").is_err());
        assert!(decode(FUSE_SYMLINK, &[0; 128], b"name\0target").is_err());
        assert!(decode(FUSE_GETATTR, &[0; 8], b"").is_err());
        let write = op_bytes(fuse_write_in {
            size: 100,
            ..Default::default()
        });
        assert!(decode(FUSE_WRITE, &write, b"short").is_err());
        assert!(matches!(
            decode(4242, &[], &[]),
            Ok(Request::Unsupported(4242))
        ));
    }

    #[test]
    fn setattr_takes_only_the_fields_marked_valid() {
        let arg = op_bytes(fuse_setattr_in {
            valid: FATTR_MODE | FATTR_MTIME | FATTR_MTIME_NOW | FATTR_FH,
            mode: 0o100644,
            uid: 5,
            fh: 7,
            size: 99,
            ..Default::default()
        });
        let Request::Setattr(change) = decode(FUSE_SETATTR, &arg, &[]).unwrap() else {
            panic!("not a setattr");
        };
        assert_eq!(change.mode, Some(0o100644));
        assert_eq!((change.uid, change.size), (None, None));
        assert!(matches!(change.mtime, Some(SetTime::Now)));
        assert!(change.atime.is_none());
        assert_eq!(change.fh, Some(7));
    }
}
