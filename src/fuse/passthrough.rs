//! FUSE passthrough (Linux 6.9+): the kernel reads and writes an open file's
//! underlying file itself, so file data never crosses the daemon.
//!
//! The kernel allows one backing file per inode at a time: every open of a
//! node while another is still open must name the same backing id, and an
//! inode opened in cached mode cannot get a passthrough open meanwhile (and
//! the reverse). This module keeps that bookkeeping, per inode, and decides
//! for each open how it is served:
//!
//! - `Passthrough`: the first open of an inode registers its underlying file
//!   (an ioctl that needs CAP_SYS_ADMIN); later opens of the same file reuse
//!   the id, which lives until the last of them is released.
//! - `Cached`: passthrough is off, unavailable, refused for this file, or not
//!   worth it (a small read-only file, see [`pays_for`]), so the daemon
//!   serves reads and writes, and the kernel keeps the pages it read.
//! - `Busy`: the node now names another underlying file (an input replaced
//!   while an earlier passthrough open still holds the old one). The kernel
//!   refuses a second backing file for the inode and any open that is not
//!   passthrough, and reusing the old one would show the old file, so this
//!   open fails with EBUSY until the earlier ones are closed.
//!
//! Registration failing with EPERM (no CAP_SYS_ADMIN) turns passthrough off
//! for good, logged once; any other failure is logged and that inode is
//! served `Cached` until all its opens are released.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::sandbox::sharded::Sharded;

const SHARDS: usize = 16;

/// Read-only files smaller than this are served from the kernel's page
/// cache instead of passthrough. A passthrough read makes the kernel drop
/// the inode's cached atime, so the reader's next stat costs a GETATTR
/// round trip (a compiler's open, read, fstat), and registering the
/// backing file costs two ioctls per open; the page cache costs one READ
/// per page run on the first read only. Measured side by side
/// (docs/BENCHMARKS.md): below 64 KiB the page cache wins from the
/// second read on, and build inputs are read by many actions.
pub const PASSTHROUGH_FROM_SIZE: u64 = 64 * 1024;

/// Whether passthrough pays for a file of `size` bytes: always for files
/// that may be written (writes would otherwise each be a round trip), and
/// for read-only ones from [`PASSTHROUGH_FROM_SIZE`].
pub fn pays_for(size: u64, writable: bool) -> bool {
    writable || size >= PASSTHROUGH_FROM_SIZE
}

/// A backing id the kernel gave for one underlying file, closed again
/// when dropped. Made on the mount's `/dev/fuse` descriptor, so that every
/// transport can answer with it.
pub struct Backing {
    device: Arc<OwnedFd>,
    id: u32,
}

impl Backing {
    /// Registers `file` (FUSE_DEV_IOC_BACKING_OPEN; needs CAP_SYS_ADMIN).
    pub fn open(device: &Arc<OwnedFd>, file: &impl AsFd) -> std::io::Result<Backing> {
        let id = fuser::BackingId::create_raw(device.as_fd(), file.as_fd())?;
        Ok(Backing {
            device: device.clone(),
            id,
        })
    }

    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        if let Err(err) = crate::sys::close_backing(self.device.as_fd(), self.id) {
            // After an unmount the connection is gone, and the id with it.
            if !matches!(err.raw_os_error(), Some(libc::ENOTCONN | libc::ENODEV)) {
                log::warn!("cannot close passthrough backing id {}: {err}", self.id);
            }
        }
    }
}

/// How one open is answered. `B` is the kernel's backing file reference
/// ([`Backing`]; anything in tests).
pub enum OpenMode<B> {
    Passthrough(Arc<B>),
    Cached,
    Busy,
}

impl<B> OpenMode<B> {
    /// Passthrough on `backing` if the inode has one, else cached.
    fn of(backing: &Option<Arc<B>>) -> OpenMode<B> {
        match backing {
            Some(backing) => OpenMode::Passthrough(backing.clone()),
            None => OpenMode::Cached,
        }
    }
}

/// What the kernel has open for one inode.
struct InodeOpens<B> {
    backing: Option<Arc<B>>,
    /// (device, inode) of the underlying file the opens are on.
    file_id: (u64, u64),
    opens: usize,
}

pub struct Passthrough<B> {
    enabled: AtomicBool,
    /// Per inode number.
    inodes: Sharded<InodeOpens<B>>,
    /// Inode number of each open handle counted in `inodes`.
    handles: Sharded<u64>,
}

impl<B> Passthrough<B> {
    pub fn new(enabled: bool) -> Passthrough<B> {
        Passthrough {
            enabled: AtomicBool::new(enabled),
            inodes: Sharded::new(SHARDS),
            handles: Sharded::new(SHARDS),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Turns passthrough off (the kernel did not grant it at init).
    pub fn disable(&self, why: &str) {
        if self.enabled.swap(false, Ordering::Relaxed) {
            log::warn!("FUSE passthrough off: {why}; file data goes through the daemon");
        }
    }

    /// Turns passthrough off because another way of serving files was
    /// chosen: a decision, not a failure, so logged at info.
    pub fn not_used(&self, why: &str) {
        if self.enabled.swap(false, Ordering::Relaxed) {
            log::info!("FUSE passthrough not used: {why}; file data goes through the daemon");
        }
    }

    /// Decides how handle `fh`, just opened on inode `ino` with underlying
    /// file `file_id`, is served. `wanted`: passthrough pays for this file
    /// (see [`pays_for`]); the first open of an inode decides for every
    /// open of it until the last is released, as the kernel requires.
    /// `register` makes a backing id for the handle's file; it is called
    /// only when a new one is needed.
    pub fn open(
        &self,
        ino: u64,
        fh: u64,
        file_id: (u64, u64),
        wanted: bool,
        register: impl FnOnce() -> std::io::Result<B>,
    ) -> OpenMode<B> {
        if !self.enabled() {
            return OpenMode::Cached;
        }
        let mode = {
            let mut inodes = self.inodes.shard(&ino);
            match inodes.get_mut(&ino) {
                Some(entry) if entry.file_id != file_id && entry.backing.is_some() => {
                    log::warn!("inode {ino}: underlying file replaced while open; EBUSY");
                    return OpenMode::Busy;
                }
                Some(entry) => {
                    entry.opens += 1;
                    OpenMode::of(&entry.backing)
                }
                None => {
                    let backing = if !wanted {
                        None
                    } else {
                        match register() {
                            Ok(backing) => Some(Arc::new(backing)),
                            Err(err) if err.raw_os_error() == Some(libc::EPERM) => {
                                self.disable("registering a backing file needs CAP_SYS_ADMIN");
                                return OpenMode::Cached;
                            }
                            Err(err) => {
                                log::info!("inode {ino}: no passthrough for this file: {err}");
                                None
                            }
                        }
                    };
                    let mode = OpenMode::of(&backing);
                    inodes.insert(
                        ino,
                        InodeOpens {
                            backing,
                            file_id,
                            opens: 1,
                        },
                    );
                    mode
                }
            }
        };
        self.handles.shard(&fh).insert(fh, ino);
        mode
    }

    /// Handle `fh` was released; the inode's backing id goes with its last
    /// open.
    pub fn release(&self, fh: u64) {
        let Some(ino) = self.handles.shard(&fh).remove(&fh) else {
            return;
        };
        let mut inodes = self.inodes.shard(&ino);
        if let Some(entry) = inodes.get_mut(&ino) {
            entry.opens -= 1;
            if entry.opens == 0 {
                inodes.remove(&ino);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::io;

    /// A stand-in backing id: which registration made it.
    type Fake = u32;

    fn registered(mode: &OpenMode<Fake>) -> Option<Fake> {
        match mode {
            OpenMode::Passthrough(id) => Some(**id),
            _ => None,
        }
    }

    #[test]
    fn opens_of_one_inode_share_one_registration_until_the_last_release() {
        let pt = Passthrough::<Fake>::new(true);
        let calls = Cell::new(0);
        let register = || {
            calls.set(calls.get() + 1);
            Ok(calls.get())
        };
        let first = pt.open(7, 100, (1, 2), true, register);
        let second = pt.open(7, 101, (1, 2), true, register);
        assert_eq!(
            (registered(&first), registered(&second)),
            (Some(1), Some(1))
        );
        assert_eq!(calls.get(), 1, "the second open reuses the id");
        pt.release(100);
        assert_eq!(
            registered(&pt.open(7, 102, (1, 2), true, register)),
            Some(1)
        );
        pt.release(101);
        pt.release(102);
        // All released: the next open registers anew.
        assert_eq!(
            registered(&pt.open(7, 103, (1, 2), true, register)),
            Some(2)
        );
        // Releasing an unknown handle is harmless.
        pt.release(999);
    }

    #[test]
    fn a_file_passthrough_does_not_pay_for_is_cached_with_every_open_of_it() {
        assert!(!pays_for(PASSTHROUGH_FROM_SIZE - 1, false));
        assert!(pays_for(PASSTHROUGH_FROM_SIZE, false));
        assert!(pays_for(0, true), "writable files always pass through");
        let pt = Passthrough::<Fake>::new(true);
        let calls = Cell::new(0);
        let register = || {
            calls.set(calls.get() + 1);
            Ok(calls.get())
        };
        assert!(matches!(
            pt.open(7, 1, (1, 2), false, register),
            OpenMode::Cached
        ));
        // While it is open cached, an open that would want passthrough
        // follows the first (the kernel refuses a mix on one inode).
        assert!(matches!(
            pt.open(7, 2, (1, 2), true, register),
            OpenMode::Cached
        ));
        assert_eq!(calls.get(), 0);
        pt.release(1);
        pt.release(2);
        assert_eq!(registered(&pt.open(7, 3, (1, 2), true, register)), Some(1));
    }

    #[test]
    fn a_replaced_file_is_busy_while_the_old_one_is_open() {
        let pt = Passthrough::<Fake>::new(true);
        let next = Cell::new(0);
        let register = || {
            next.set(next.get() + 1);
            Ok(next.get())
        };
        assert!(registered(&pt.open(7, 1, (1, 2), true, register)).is_some());
        assert!(matches!(
            pt.open(7, 2, (1, 3), true, register),
            OpenMode::Busy
        ));
        pt.release(1);
        assert_eq!(registered(&pt.open(7, 3, (1, 3), true, register)), Some(2));
    }

    #[test]
    fn eperm_turns_passthrough_off_for_good_and_other_errors_for_one_inode() {
        let pt = Passthrough::<Fake>::new(true);
        let fail = |errno| move || Err::<Fake, _>(io::Error::from_raw_os_error(errno));
        assert!(matches!(
            pt.open(1, 1, (1, 1), true, fail(libc::EINVAL)),
            OpenMode::Cached
        ));
        assert!(pt.enabled(), "one file's failure leaves passthrough on");
        let calls = Cell::new(0);
        let counting = || {
            calls.set(calls.get() + 1);
            Ok(9)
        };
        assert!(matches!(
            pt.open(1, 2, (1, 1), true, counting),
            OpenMode::Cached
        ));
        assert_eq!(calls.get(), 0, "that inode stays cached while open");
        assert!(matches!(
            pt.open(2, 3, (1, 5), true, fail(libc::EPERM)),
            OpenMode::Cached
        ));
        assert!(!pt.enabled());
        assert!(matches!(
            pt.open(3, 4, (1, 6), true, counting),
            OpenMode::Cached
        ));
        assert_eq!(calls.get(), 0, "off: nothing is registered any more");
        let off = Passthrough::<Fake>::new(false);
        assert!(matches!(
            off.open(1, 1, (1, 1), true, counting),
            OpenMode::Cached
        ));
        assert_eq!(calls.get(), 0);
    }
}
