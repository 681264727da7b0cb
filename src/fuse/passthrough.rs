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
//! - `Cached`: passthrough is off, unavailable, or refused for this file, so
//!   the daemon serves reads and writes as before.
//! - `Busy`: the node now names another underlying file (an input replaced
//!   while an earlier passthrough open still holds the old one). The kernel
//!   refuses a second backing file for the inode and any open that is not
//!   passthrough, and reusing the old one would show the old file, so this
//!   open fails with EBUSY until the earlier ones are closed.
//!
//! Registration failing with EPERM (no CAP_SYS_ADMIN) turns passthrough off
//! for good, logged once; any other failure is logged and that inode is
//! served `Cached` until all its opens are released.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fuser::BackingId;
use parking_lot::Mutex;

const SHARDS: usize = 16;

/// How one open is answered.
pub enum OpenMode {
    Passthrough(Arc<BackingId>),
    Cached,
    Busy,
}

/// What the kernel has open for one inode.
struct InodeOpens {
    backing: Option<Arc<BackingId>>,
    /// (device, inode) of the underlying file the opens are on.
    file_id: (u64, u64),
    opens: usize,
}

pub struct Passthrough {
    enabled: AtomicBool,
    /// Per inode number.
    inodes: Vec<Mutex<HashMap<u64, InodeOpens>>>,
    /// Inode number of each open handle counted in `inodes`.
    handles: Vec<Mutex<HashMap<u64, u64>>>,
}

impl Passthrough {
    pub fn new(enabled: bool) -> Passthrough {
        Passthrough {
            enabled: AtomicBool::new(enabled),
            inodes: (0..SHARDS).map(|_| Mutex::default()).collect(),
            handles: (0..SHARDS).map(|_| Mutex::default()).collect(),
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

    /// Decides how handle `fh`, just opened on inode `ino` with underlying
    /// file `file_id`, is served. `register` makes a backing id for the
    /// handle's file; it is called only when a new one is needed.
    pub fn open(
        &self,
        ino: u64,
        fh: u64,
        file_id: (u64, u64),
        register: impl FnOnce() -> std::io::Result<BackingId>,
    ) -> OpenMode {
        if !self.enabled() {
            return OpenMode::Cached;
        }
        let mode = {
            let mut inodes = self.inodes[shard(ino)].lock();
            match inodes.get_mut(&ino) {
                Some(entry) if entry.file_id != file_id && entry.backing.is_some() => {
                    log::warn!("inode {ino}: underlying file replaced while open; EBUSY");
                    return OpenMode::Busy;
                }
                Some(entry) => {
                    entry.opens += 1;
                    match &entry.backing {
                        Some(backing) => OpenMode::Passthrough(backing.clone()),
                        None => OpenMode::Cached,
                    }
                }
                None => {
                    let backing = match register() {
                        Ok(backing) => Some(Arc::new(backing)),
                        Err(err) if err.raw_os_error() == Some(libc::EPERM) => {
                            self.disable("registering a backing file needs CAP_SYS_ADMIN");
                            return OpenMode::Cached;
                        }
                        Err(err) => {
                            log::info!("inode {ino}: no passthrough for this file: {err}");
                            None
                        }
                    };
                    let mode = match &backing {
                        Some(backing) => OpenMode::Passthrough(backing.clone()),
                        None => OpenMode::Cached,
                    };
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
        self.handles[shard(fh)].lock().insert(fh, ino);
        mode
    }

    /// Handle `fh` was released; the inode's backing id goes with its last
    /// open.
    pub fn release(&self, fh: u64) {
        let Some(ino) = self.handles[shard(fh)].lock().remove(&fh) else {
            return;
        };
        let mut inodes = self.inodes[shard(ino)].lock();
        if let Some(entry) = inodes.get_mut(&ino) {
            entry.opens -= 1;
            if entry.opens == 0 {
                inodes.remove(&ino);
            }
        }
    }
}

fn shard(key: u64) -> usize {
    (key as usize) % SHARDS
}
