//! Telling the kernel to drop what it cached: the core's [`Invalidator`],
//! implemented with fuser's notifier and, for the expire-only flag fuser has
//! no call for, a notification written to `/dev/fuse` by hand.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};

use fuser::{INodeNo, Notifier};

use crate::sandbox::tree::Invalidator;

/// Lets the core invalidate kernel cache entries: through fuser, and by
/// writing FUSE_NOTIFY_INVAL_ENTRY with FUSE_EXPIRE_ONLY (Linux 6.2+)
/// to the session's /dev/fuse descriptor itself, as fuser has no call for
/// that flag.
pub struct NotifierInvalidator {
    notifier: Notifier,
    device: Option<OwnedFd>,
    /// Cleared when the kernel refuses the flag; then expiring invalidates.
    expire_works: AtomicBool,
}

impl NotifierInvalidator {
    /// `device`: a duplicate of the session's /dev/fuse descriptor.
    pub fn new(notifier: Notifier, device: Option<OwnedFd>) -> NotifierInvalidator {
        NotifierInvalidator {
            notifier,
            device,
            expire_works: AtomicBool::new(true),
        }
    }
}

/// FUSE_NOTIFY_INVAL_ENTRY, and its flag asking only to expire the entry.
const NOTIFY_INVAL_ENTRY: i32 = 3;
const EXPIRE_ONLY: u32 = 1;

/// The notification message: out header (len, notify code as error,
/// unique 0), then parent, name length and flags, then the name and a NUL.
fn expire_message(parent_ino: u64, name: &OsStr) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let name = name.as_bytes();
    let len = 16 + 16 + name.len() + 1;
    let mut message = Vec::with_capacity(len);
    message.extend_from_slice(&(len as u32).to_ne_bytes());
    message.extend_from_slice(&NOTIFY_INVAL_ENTRY.to_ne_bytes());
    message.extend_from_slice(&0u64.to_ne_bytes());
    message.extend_from_slice(&parent_ino.to_ne_bytes());
    message.extend_from_slice(&(name.len() as u32).to_ne_bytes());
    message.extend_from_slice(&EXPIRE_ONLY.to_ne_bytes());
    message.extend_from_slice(name);
    message.push(0);
    message
}

impl Invalidator for NotifierInvalidator {
    fn invalidate_entry(&self, parent_ino: u64, name: &OsStr) {
        // ENOENT means the kernel had nothing cached: nothing to do.
        if let Err(err) = self.notifier.inval_entry(INodeNo(parent_ino), name) {
            if err.raw_os_error() != Some(libc::ENOENT) {
                log::warn!("cannot invalidate kernel cache entry {name:?}: {err}");
            }
        }
    }

    fn invalidate_attrs(&self, ino: u64) {
        // A negative offset leaves the cached pages alone.
        if let Err(err) = self.notifier.inval_inode(INodeNo(ino), -1, 0) {
            if err.raw_os_error() != Some(libc::ENOENT) {
                log::warn!("cannot invalidate kernel attributes of inode {ino}: {err}");
            }
        }
    }

    fn invalidate_data(&self, ino: u64) {
        if let Err(err) = self.notifier.inval_inode(INodeNo(ino), 0, 0) {
            if err.raw_os_error() != Some(libc::ENOENT) {
                log::warn!("cannot invalidate kernel pages of inode {ino}: {err}");
            }
        }
    }

    fn expire_entry(&self, parent_ino: u64, name: &OsStr) {
        let Some(device) = self
            .device
            .as_ref()
            .filter(|_| self.expire_works.load(Ordering::Relaxed))
        else {
            return self.invalidate_entry(parent_ino, name);
        };
        let message = expire_message(parent_ino, name);
        // One write is one notification.
        let err = match nix::unistd::write(device, &message) {
            Ok(written) if written == message.len() => return,
            Ok(_) => nix::errno::Errno::EIO,
            Err(err) => err,
        };
        match err {
            nix::errno::Errno::ENOENT => {}
            nix::errno::Errno::EINVAL => {
                log::info!("kernel cannot expire entries (Linux 6.2+); invalidating instead");
                self.expire_works.store(false, Ordering::Relaxed);
                self.invalidate_entry(parent_ino, name);
            }
            _ => {
                log::warn!("cannot expire kernel cache entry {name:?}: {err}");
                self.invalidate_entry(parent_ino, name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expire_message_is_laid_out_as_the_kernel_reads_it() {
        let message = expire_message(0x0102_0304_0506_0708, OsStr::new("abc"));
        // fuse_out_header: len, error (the notify code), unique 0.
        assert_eq!(message.len(), 16 + 16 + 3 + 1);
        assert_eq!(&message[0..4], &36u32.to_ne_bytes());
        assert_eq!(
            &message[4..8],
            &3i32.to_ne_bytes(),
            "FUSE_NOTIFY_INVAL_ENTRY"
        );
        assert_eq!(&message[8..16], &[0; 8]);
        // fuse_notify_inval_entry_out: parent, namelen, flags.
        assert_eq!(&message[16..24], &0x0102_0304_0506_0708u64.to_ne_bytes());
        assert_eq!(&message[24..28], &3u32.to_ne_bytes());
        assert_eq!(&message[28..32], &1u32.to_ne_bytes(), "FUSE_EXPIRE_ONLY");
        assert_eq!(&message[32..], b"abc\0");
    }
}
