//! Extended attributes, passed through to underlying objects when enabled.
//!
//! Disabled (the default, as in sandboxfs), every call answers ENOSYS, which
//! tells the kernel to stop asking for the life of the mount.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;

use super::errno::{Errno, FsResult};
use super::{c_path, SandboxFs};
use crate::sys;

/// Answer to a get or list: the needed size when asked with size 0.
#[derive(Debug, PartialEq, Eq)]
pub enum XattrReply {
    Size(u32),
    Data(Vec<u8>),
}

impl SandboxFs {
    /// The underlying path to act on; `None` for a virtual directory.
    fn xattr_path(&self, ino: u64, write: bool) -> FsResult<Option<CString>> {
        if !self.config.xattrs {
            return Err(Errno::ENOSYS);
        }
        let node = self.node(ino)?;
        if write && !node.is_writable() {
            return Err(Errno::EPERM);
        }
        match node.underlying_path()? {
            Some(path) => Ok(Some(c_path(&path)?)),
            None if write => Err(Errno::EPERM),
            None => Ok(None),
        }
    }

    pub fn getxattr(&self, ino: u64, name: &OsStr, size: u32) -> FsResult<XattrReply> {
        let Some(path) = self.xattr_path(ino, false)? else {
            return Err(Errno::ENODATA);
        };
        let name = xattr_name(name)?;
        sized(size, |buf| sys::get_xattr(&path, &name, buf))
    }

    pub fn listxattr(&self, ino: u64, size: u32) -> FsResult<XattrReply> {
        let Some(path) = self.xattr_path(ino, false)? else {
            return sized(size, |_| Ok(0));
        };
        sized(size, |buf| sys::list_xattr(&path, buf))
    }

    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> FsResult<()> {
        let path = self.xattr_path(ino, true)?.ok_or(Errno::EPERM)?;
        Ok(sys::set_xattr(&path, &xattr_name(name)?, value, flags)?)
    }

    pub fn removexattr(&self, ino: u64, name: &OsStr) -> FsResult<()> {
        let path = self.xattr_path(ino, true)?.ok_or(Errno::EPERM)?;
        Ok(sys::remove_xattr(&path, &xattr_name(name)?)?)
    }
}

fn xattr_name(name: &OsStr) -> FsResult<CString> {
    CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)
}

/// Size 0 asks for the size needed; otherwise for at most `size` bytes.
fn sized(
    size: u32,
    call: impl FnOnce(&mut [u8]) -> std::io::Result<usize>,
) -> FsResult<XattrReply> {
    let mut buf = vec![0u8; size as usize];
    let got = call(&mut buf)?;
    if size == 0 {
        return Ok(XattrReply::Size(got as u32));
    }
    buf.truncate(got);
    Ok(XattrReply::Data(buf))
}
