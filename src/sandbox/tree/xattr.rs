//! Extended attributes, passed through to underlying objects when enabled.
//!
//! Disabled (the default, as in sandboxfs), every call answers ENOSYS, which
//! tells the kernel to stop asking for the life of the mount. Enabled, each
//! call acts on an open handle of the inode if there is one, else on the
//! object pinned beneath its anchor (see `underlying`), never on what a
//! symlink points to.

use std::ffi::OsStr;
use std::os::fd::AsFd;

use super::error::{Errno, FsError, FsResult};
use super::held::HeldFd;
use super::namespace::present_object;
use super::underlying::{self, UObj};
use super::SandboxFs;
use crate::sys;

/// Answer to a get or list: the needed size when asked with size 0.
#[derive(Debug, PartialEq, Eq)]
pub enum XattrReply {
    Size(u32),
    Data(Vec<u8>),
}

/// What an xattr call acts on.
enum Target {
    /// An open handle of the inode (the object may be deleted by now).
    Held(HeldFd),
    /// The object by its name.
    Object(UObj),
    /// Nothing underlying: a virtual directory, or one made up for nested
    /// mappings with no real directory behind it, which answers like an
    /// empty read-only directory.
    Nothing,
}

impl Target {
    /// Runs `call` on a descriptor of the object; `None` for nothing.
    fn with<T>(
        &self,
        syscall: &'static str,
        call: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> std::io::Result<T>,
    ) -> Option<FsResult<T>> {
        match self {
            Target::Held(held) => {
                let fd = held.fd()?;
                Some(call(fd).map_err(|e| FsError::call(syscall, e)))
            }
            Target::Object(object) => {
                Some(object.on_pinned(syscall, |pinned| call(pinned.as_fd())))
            }
            Target::Nothing => None,
        }
    }
}

impl SandboxFs {
    fn xattr_target(&self, ino: u64, write: bool) -> FsResult<Target> {
        if !self.config.xattrs {
            return Err(Errno::ENOSYS.into());
        }
        let node = self.node(ino)?;
        if write && !node.is_writable() {
            return Err(Errno::EPERM.into());
        }
        if let Some(held) = self.open_handle(ino, None).filter(|h| h.fd().is_some()) {
            return Ok(Target::Held(held));
        }
        Ok(match present_object(&node)? {
            Some(object) => Target::Object(object),
            None => Target::Nothing,
        })
    }

    pub fn getxattr(&self, ino: u64, name: &OsStr, size: u32) -> FsResult<XattrReply> {
        let name = underlying::c_string(name)?;
        self.xattr_target(ino, false)?
            .with("getxattr", |fd| {
                sized(size, |buf| sys::get_xattr(fd, &name, buf))
            })
            .unwrap_or(Err(Errno::ENODATA.into()))
    }

    pub fn listxattr(&self, ino: u64, size: u32) -> FsResult<XattrReply> {
        self.xattr_target(ino, false)?
            .with("listxattr", |fd| {
                sized(size, |buf| sys::list_xattr(fd, buf))
            })
            .unwrap_or_else(|| sized(size, |_| Ok(0)).map_err(|e| FsError::call("listxattr", e)))
    }

    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> FsResult<()> {
        let name = underlying::c_string(name)?;
        self.xattr_target(ino, true)?
            .with("setxattr", |fd| sys::set_xattr(fd, &name, value, flags))
            .unwrap_or(Err(Errno::EPERM.into()))
    }

    pub fn removexattr(&self, ino: u64, name: &OsStr) -> FsResult<()> {
        let name = underlying::c_string(name)?;
        self.xattr_target(ino, true)?
            .with("removexattr", |fd| sys::remove_xattr(fd, &name))
            .unwrap_or(Err(Errno::EPERM.into()))
    }
}

/// Size 0 asks for the size needed; otherwise for at most `size` bytes.
fn sized(
    size: u32,
    call: impl FnOnce(&mut [u8]) -> std::io::Result<usize>,
) -> std::io::Result<XattrReply> {
    let mut buf = vec![0u8; size as usize];
    let got = call(&mut buf)?;
    if size == 0 {
        return Ok(XattrReply::Size(got as u32));
    }
    buf.truncate(got);
    Ok(XattrReply::Data(buf))
}
