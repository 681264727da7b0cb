//! Extended attributes, passed through to underlying objects when enabled.
//!
//! Disabled (the default, as in sandboxfs), every call answers ENOSYS, which
//! tells the kernel to stop asking for the life of the mount.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;

use super::errno::{Errno, FsResult};
use super::{c_path, SandboxFs};

/// Answer to a get or list: the needed size when asked with size 0.
#[derive(Debug, PartialEq, Eq)]
pub enum XattrReply {
    Size(u32),
    Data(Vec<u8>),
}

impl SandboxFs {
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
        let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
        sized_call(size, |buf, len| {
            // SAFETY: valid C strings; buf is null with len 0 or has len bytes.
            unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), buf.cast(), len) }
        })
    }

    pub fn listxattr(&self, ino: u64, size: u32) -> FsResult<XattrReply> {
        let Some(path) = self.xattr_path(ino, false)? else {
            return Ok(if size == 0 { XattrReply::Size(0) } else { XattrReply::Data(vec![]) });
        };
        sized_call(size, |buf, len| {
            // SAFETY: valid C string; buf is null with len 0 or has len bytes.
            unsafe { libc::llistxattr(path.as_ptr(), buf.cast(), len) }
        })
    }

    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> FsResult<()> {
        let path = self.xattr_path(ino, true)?.ok_or(Errno::EPERM)?;
        let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
        // SAFETY: valid C strings and value slice.
        let ret = unsafe {
            libc::lsetxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), flags)
        };
        super::errno::check(ret).map(drop)
    }

    pub fn removexattr(&self, ino: u64, name: &OsStr) -> FsResult<()> {
        let path = self.xattr_path(ino, true)?.ok_or(Errno::EPERM)?;
        let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
        // SAFETY: valid C strings.
        super::errno::check(unsafe { libc::lremovexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
    }
}

/// Runs a get/list-style call: size 0 asks for the size, else for data.
fn sized_call(size: u32, call: impl Fn(*mut u8, usize) -> isize) -> FsResult<XattrReply> {
    if size == 0 {
        let needed = call(std::ptr::null_mut(), 0);
        if needed < 0 {
            return Err(Errno::last());
        }
        return Ok(XattrReply::Size(needed as u32));
    }
    let mut buf = vec![0u8; size as usize];
    let got = call(buf.as_mut_ptr(), buf.len());
    if got < 0 {
        return Err(Errno::last());
    }
    buf.truncate(got as usize);
    Ok(XattrReply::Data(buf))
}
