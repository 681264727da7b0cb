//! Serving one ring entry: decode the request in its buffers, ask the
//! dispatcher, and write the answer back into the same buffers (the out
//! header over the in header, the answer's body over the payload).

use std::time::Duration;

use super::abi::{self, *};
use super::decode::{decode, Request};
use super::encode::{self, Writer};
use crate::fuse::options::Allow;
use crate::fuse::{Ctx, Dispatcher, Entry, Open};
use crate::sandbox::tree::{Attr, Errno, StatFs, XattrReply};

/// Who may use the mount, as fuser checks it on `/dev/fuse`: with
/// allow_other in force for root only, the kernel lets everyone in and
/// the daemon refuses the others.
#[derive(Clone, Copy, Debug)]
pub struct Acl {
    pub allow: Allow,
    /// The daemon's effective uid.
    pub owner: u32,
}

impl Acl {
    /// Whether a request from `uid` is refused: as fuser does, requests
    /// the kernel may send on its own behalf (reads and writes of pages,
    /// releases, syncs) go through whoever's uid they carry.
    fn refuses(&self, uid: u32, opcode: u32) -> bool {
        let stranger = match self.allow {
            Allow::Everyone => false,
            Allow::RootAndOwner => uid != self.owner && uid != 0,
            Allow::OwnerOnly => uid != self.owner,
        };
        stranger
            && !matches!(
                opcode,
                FUSE_READ
                    | FUSE_READDIR
                    | FUSE_READDIRPLUS
                    | FUSE_WRITE
                    | FUSE_FSYNC
                    | FUSE_FSYNCDIR
                    | FUSE_RELEASE
                    | FUSE_RELEASEDIR
                    | FUSE_FORGET
                    | FUSE_BATCH_FORGET
                    | FUSE_INIT
                    | FUSE_DESTROY
            )
    }
}

/// An answer before encoding; owns its data, so the payload buffer the
/// request was read from can be written.
enum Reply {
    Empty,
    Entry(Option<Attr>),
    Attr(Attr),
    Data(Vec<u8>),
    Open(Open),
    Opendir(u64),
    Created(Attr, Open),
    Written(u32),
    Statfs(StatFs),
    Xattr(XattrReply),
}

fn call(dispatch: &Dispatcher, ctx: &Ctx, ino: u64, request: Request) -> Result<Reply, Errno> {
    let d = dispatch;
    Ok(match request {
        Request::Lookup { name } => match d.lookup(ctx, ino, name)? {
            Entry::Node(attr) => Reply::Entry(Some(attr)),
            Entry::Absent => Reply::Entry(None),
        },
        Request::Getattr { fh } => Reply::Attr(d.getattr(ctx, ino, fh)?),
        Request::Setattr(change) => Reply::Attr(d.setattr(ctx, ino, &change)?),
        Request::Readlink => Reply::Data(d.readlink(ctx, ino)?),
        Request::Symlink { name, target } => Reply::Entry(Some(d.symlink(ctx, ino, name, target)?)),
        Request::Mknod {
            name,
            mode,
            umask,
            rdev,
        } => Reply::Entry(Some(d.mknod(ctx, ino, name, mode, umask, rdev)?)),
        Request::Mkdir { name, mode, umask } => {
            Reply::Entry(Some(d.mkdir(ctx, ino, name, mode, umask)?))
        }
        Request::Unlink { name } => d.unlink(ctx, ino, name).map(|()| Reply::Empty)?,
        Request::Rmdir { name } => d.rmdir(ctx, ino, name).map(|()| Reply::Empty)?,
        Request::Rename {
            name,
            newparent,
            newname,
            flags,
        } => d
            .rename(ctx, ino, name, newparent, newname, flags)
            .map(|()| Reply::Empty)?,
        Request::Link { ino: old, newname } => Reply::Entry(Some(d.link(ctx, old, ino, newname)?)),
        Request::Open { flags } => Reply::Open(d.open(ctx, ino, flags)?),
        Request::Read { fh, offset, size } => Reply::Data(d.read(ctx, ino, fh, offset, size)?),
        Request::Write { fh, offset, data } => Reply::Written(d.write(ctx, ino, fh, offset, data)?),
        Request::Statfs => Reply::Statfs(d.statfs(ctx, ino)?),
        Request::Release { fh } => {
            d.release(fh);
            Reply::Empty
        }
        Request::Fsync { fh, datasync } => {
            d.fsync(ctx, ino, fh, datasync).map(|()| Reply::Empty)?
        }
        Request::Setxattr { name, value, flags } => d
            .setxattr(ctx, ino, name, value, flags)
            .map(|()| Reply::Empty)?,
        Request::Getxattr { name, size } => Reply::Xattr(d.getxattr(ctx, ino, name, size)?),
        Request::Listxattr { size } => Reply::Xattr(d.listxattr(ctx, ino, size)?),
        Request::Removexattr { name } => d.removexattr(ctx, ino, name).map(|()| Reply::Empty)?,
        Request::Flush => d.flush().map(|()| Reply::Empty)?,
        Request::Opendir => Reply::Opendir(d.opendir(ctx, ino)?),
        Request::Readdir { fh, offset, size } => {
            // Encoded as listed: only what fits the kernel's buffer is
            // taken from the listing.
            let mut listed = Vec::new();
            d.readdir(ctx, ino, fh, offset, |next, entry| {
                !encode::dirent(&mut listed, next, &entry, size as usize)
            })?;
            Reply::Data(listed)
        }
        Request::Releasedir { fh } => {
            d.releasedir(fh);
            Reply::Empty
        }
        Request::Fsyncdir => d.fsyncdir().map(|()| Reply::Empty)?,
        Request::Access => d.access().map(|()| Reply::Empty)?,
        Request::Create {
            name,
            mode,
            umask,
            flags,
        } => {
            let (attr, open) = d.create(ctx, ino, name, mode, umask, flags)?;
            Reply::Created(attr, open)
        }
        Request::Fallocate {
            fh,
            offset,
            length,
            mode,
        } => d
            .fallocate(ctx, ino, fh, offset, length, mode)
            .map(|()| Reply::Empty)?,
        Request::Unsupported(opcode) => {
            log::debug!(
                "request {} on the ring: opcode {opcode} not served",
                ctx.unique
            );
            return Err(Errno(libc::ENOSYS));
        }
    })
}

fn encode(out: &mut Writer, reply: &Reply, ttl: Duration) -> Result<(), encode::Overflow> {
    match reply {
        Reply::Empty => Ok(()),
        Reply::Entry(node) => out.put(&encode::entry(node.as_ref(), ttl)),
        Reply::Attr(attr) => out.put(&encode::attr_out(attr, ttl)),
        Reply::Data(data) => out.bytes(data),
        Reply::Open(open) => out.put(&encode::open_out(open)),
        Reply::Opendir(fh) => out.put(&fuse_open_out {
            fh: *fh,
            ..Default::default()
        }),
        Reply::Created(attr, open) => {
            out.put(&encode::entry(Some(attr), ttl))?;
            out.put(&encode::open_out(open))
        }
        Reply::Written(size) => out.put(&fuse_write_out {
            size: *size,
            padding: 0,
        }),
        Reply::Statfs(s) => out.put(&encode::statfs(s)),
        Reply::Xattr(XattrReply::Size(size)) => out.put(&fuse_getxattr_out {
            size: *size,
            padding: 0,
        }),
        Reply::Xattr(XattrReply::Data(data)) => out.bytes(data),
    }
}

/// What to commit for one entry: the errno (0 on success) and the bytes
/// of the answer written to the payload.
pub struct Served {
    pub error: i32,
    pub payload_len: usize,
}

/// Serves the request in `header` and `payload`, writing the answer's body
/// into `payload`. `header.in_out` still holds the request header; the
/// caller writes the out header.
pub fn serve(
    dispatch: &Dispatcher,
    acl: &Acl,
    head: &fuse_in_header,
    op_in: &[u8],
    payload: &mut [u8],
    payload_in: usize,
) -> Served {
    let ctx = Ctx {
        unique: head.unique,
        uid: head.uid,
        gid: head.gid,
        pid: head.pid,
    };
    let failed = |errno: i32| Served {
        error: -errno,
        payload_len: 0,
    };
    log::debug!(
        "ring request {}: opcode {} on inode {} from uid {} pid {}",
        head.unique,
        head.opcode,
        head.nodeid,
        head.uid,
        head.pid
    );
    if acl.refuses(head.uid, head.opcode) {
        return failed(libc::EACCES);
    }
    let reply = {
        let Some(input) = payload.get(..payload_in) else {
            log::error!(
                "ring request {} (opcode {}): payload size {payload_in} is larger than the \
                 buffer; answering EIO",
                head.unique,
                head.opcode
            );
            return failed(libc::EIO);
        };
        let request = match decode(head.opcode, op_in, input) {
            Ok(request) => request,
            Err(why) => {
                log::error!(
                    "ring request {} (opcode {}) on inode {}: {}; answering EIO",
                    head.unique,
                    head.opcode,
                    head.nodeid,
                    why.0
                );
                return failed(libc::EIO);
            }
        };
        // Counted as the dispatcher counts: served requests only.
        if !matches!(request, Request::Unsupported(_)) {
            dispatch.stats().ring_request();
        }
        match call(dispatch, &ctx, head.nodeid, request) {
            Ok(reply) => reply,
            Err(errno) => return failed(errno.0),
        }
    };
    let mut out = Writer::new(payload);
    match encode(&mut out, &reply, dispatch.ttl()) {
        Ok(()) => Served {
            error: 0,
            payload_len: out.len(),
        },
        Err(encode::Overflow) => {
            log::error!(
                "ring request {} (opcode {}): the answer does not fit the payload buffer; \
                 answering EIO",
                head.unique,
                head.opcode
            );
            failed(libc::EIO)
        }
    }
}

/// Writes the out header for `served` over the entry's in header.
pub fn out_header(unique: u64, served: &Served) -> fuse_out_header {
    fuse_out_header {
        len: (size_of::<fuse_out_header>() + served.payload_len) as u32,
        error: served.error,
        unique,
    }
}

/// The request header at the start of an entry's header buffer.
pub fn in_header(header: &fuse_uring_req_header) -> Option<fuse_in_header> {
    abi::read(&header.in_out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_root_refuses_strangers_but_not_what_the_kernel_sends_for_them() {
        let acl = Acl {
            allow: Allow::RootAndOwner,
            owner: 1000,
        };
        assert!(!acl.refuses(1000, FUSE_LOOKUP));
        assert!(!acl.refuses(0, FUSE_LOOKUP));
        assert!(acl.refuses(1001, FUSE_LOOKUP));
        assert!(acl.refuses(1001, FUSE_OPEN));
        // Page reads and releases may carry whoever's uid.
        assert!(!acl.refuses(1001, FUSE_READ));
        assert!(!acl.refuses(1001, FUSE_RELEASE));
        let everyone = Acl {
            allow: Allow::Everyone,
            owner: 1000,
        };
        assert!(!everyone.refuses(1001, FUSE_LOOKUP));
        let own = Acl {
            allow: Allow::OwnerOnly,
            owner: 1000,
        };
        assert!(own.refuses(0, FUSE_GETATTR));
    }
}
