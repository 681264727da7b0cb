//! Extended attributes, passed through to underlying objects when enabled.
//!
//! Disabled (the default, as in sandboxfs), every call answers ENOSYS, which
//! tells the kernel to stop asking for the life of the mount. Enabled, each
//! call acts on the object pinned beneath its anchor (see `underlying`),
//! never on what a symlink points to.

use std::ffi::OsStr;
use std::os::fd::AsFd;

use super::error::{Errno, FsError, FsResult};
use super::underlying::{self, UObj};
use super::SandboxFs;
use crate::sys;

/// Answer to a get or list: the needed size when asked with size 0.
#[derive(Debug, PartialEq, Eq)]
pub enum XattrReply {
    Size(u32),
    Data(Vec<u8>),
}

impl SandboxFs {
    /// The underlying object to act on; `None` for a virtual directory.
    fn xattr_object(&self, ino: u64, write: bool) -> FsResult<Option<UObj>> {
        if !self.config.xattrs {
            return Err(Errno::ENOSYS.into());
        }
        let node = self.node(ino)?;
        if write && !node.is_writable() {
            return Err(Errno::EPERM.into());
        }
        match underlying::object(&node)? {
            Some(object) => Ok(Some(object)),
            None if write => Err(Errno::EPERM.into()),
            None => Ok(None),
        }
    }

    pub fn getxattr(&self, ino: u64, name: &OsStr, size: u32) -> FsResult<XattrReply> {
        let Some(object) = self.xattr_object(ino, false)? else {
            return Err(Errno::ENODATA.into());
        };
        let name = underlying::c_string(name)?;
        object.on_pinned("getxattr", |pinned| {
            sized(size, |buf| sys::get_xattr(pinned.as_fd(), &name, buf))
        })
    }

    pub fn listxattr(&self, ino: u64, size: u32) -> FsResult<XattrReply> {
        let Some(object) = self.xattr_object(ino, false)? else {
            return sized(size, |_| Ok(0)).map_err(|e| FsError::call("listxattr", e));
        };
        object.on_pinned("listxattr", |pinned| {
            sized(size, |buf| sys::list_xattr(pinned.as_fd(), buf))
        })
    }

    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> FsResult<()> {
        let object = self
            .xattr_object(ino, true)?
            .ok_or(FsError::refused(Errno::EPERM))?;
        let name = underlying::c_string(name)?;
        object.on_pinned("setxattr", |pinned| {
            sys::set_xattr(pinned.as_fd(), &name, value, flags)
        })
    }

    pub fn removexattr(&self, ino: u64, name: &OsStr) -> FsResult<()> {
        let object = self
            .xattr_object(ino, true)?
            .ok_or(FsError::refused(Errno::EPERM))?;
        let name = underlying::c_string(name)?;
        object.on_pinned("removexattr", |pinned| {
            sys::remove_xattr(pinned.as_fd(), &name)
        })
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
