//! Which transport carries FUSE requests: the classic `/dev/fuse` loop or
//! FUSE-over-io_uring, decided before mounting from what the kernel
//! offers and what was asked, with the reason in words (for the daemon's
//! log line, and for `actionfs doctor`).

use std::sync::atomic::{AtomicBool, Ordering};

/// What `--transport` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asked {
    /// io_uring where the kernel offers it, else classic.
    Auto,
    IoUring,
    Classic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Classic,
    IoUring,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Classic => "classic /dev/fuse",
            Transport::IoUring => "io_uring",
        }
    }
}

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";
const IO_URING_DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";
const IO_URING_GROUP: &str = "/proc/sys/kernel/io_uring_group";

/// Why this process cannot use FUSE-over-io_uring here, and how to change
/// that.
#[derive(Debug, thiserror::Error)]
pub enum UringUnavailable {
    #[error("FUSE-over-io_uring is Linux only")]
    NotLinux,
    #[error(
        "the kernel has no FUSE-over-io_uring ({ENABLE_URING} is missing: Linux 6.14+ with \
         CONFIG_FUSE_IO_URING, and the fuse module loaded)"
    )]
    NotInKernel,
    /// `enable_uring` holds this instead of `Y`.
    #[error("enable_uring is {0}: echo Y > {ENABLE_URING} as root")]
    NotEnabled(String),
    #[error(
        "io_uring is limited to root and the group in {IO_URING_GROUP} ({IO_URING_DISABLED} is \
         1): echo 0 > {IO_URING_DISABLED} as root"
    )]
    LimitedToGroup,
    /// `io_uring_disabled` holds this (2: for everyone).
    #[error(
        "io_uring is disabled ({IO_URING_DISABLED} is {0}): echo 0 > {IO_URING_DISABLED} as root"
    )]
    Disabled(u32),
    /// Making a ring failed (`io_uring_setup`).
    #[error("io_uring cannot be set up by this process: {0}")]
    SetUp(#[source] std::io::Error),
}

/// `--transport=io_uring` where it cannot be had (found before mounting,
/// so nothing is mounted).
#[derive(Debug, thiserror::Error)]
#[error("--transport=io_uring, but {0}")]
pub struct ForcedUringUnavailable(#[source] pub UringUnavailable);

/// Whether this machine lets this process use FUSE-over-io_uring, and if
/// not, why and how to change that.
pub fn uring_available() -> Result<(), UringUnavailable> {
    if !cfg!(target_os = "linux") {
        return Err(UringUnavailable::NotLinux);
    }
    match std::fs::read_to_string(ENABLE_URING) {
        Err(_) => return Err(UringUnavailable::NotInKernel),
        Ok(value) if value.trim() != "Y" => {
            return Err(UringUnavailable::NotEnabled(value.trim().to_owned()))
        }
        Ok(_) => {}
    }
    let disabled = std::fs::read_to_string(IO_URING_DISABLED)
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(0);
    match disabled {
        0 => {}
        1 if nix::unistd::geteuid().is_root() || in_io_uring_group() => {}
        1 => return Err(UringUnavailable::LimitedToGroup),
        _ => return Err(UringUnavailable::Disabled(disabled)),
    }
    // A ring once INIT granted it and none can be made would hang the
    // mount: make sure one can, before mounting.
    #[cfg(target_os = "linux")]
    super::uring::probe().map_err(UringUnavailable::SetUp)?;
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn in_io_uring_group() -> bool {
    false
}

#[cfg(target_os = "linux")]
fn in_io_uring_group() -> bool {
    let Some(group) = std::fs::read_to_string(IO_URING_GROUP)
        .ok()
        .and_then(|g| g.trim().parse::<i64>().ok())
    else {
        return false;
    };
    let Ok(group) = u32::try_from(group) else {
        return false;
    };
    let group = nix::unistd::Gid::from_raw(group);
    nix::unistd::getegid() == group || nix::unistd::getgroups().is_ok_and(|gs| gs.contains(&group))
}

/// The transport to use and why, in words; an error when io_uring is
/// forced and not available.
pub fn choose(asked: Asked) -> Result<(Transport, String), ForcedUringUnavailable> {
    match (asked, uring_available()) {
        (Asked::Classic, _) => Ok((Transport::Classic, "--transport=classic".to_owned())),
        (Asked::IoUring, Ok(())) => Ok((Transport::IoUring, "--transport=io_uring".to_owned())),
        (Asked::IoUring, Err(why)) => Err(ForcedUringUnavailable(why)),
        (Asked::Auto, Ok(())) => Ok((
            Transport::IoUring,
            "the kernel offers FUSE-over-io_uring (enable_uring is Y)".to_owned(),
        )),
        (Asked::Auto, Err(why)) => Ok((Transport::Classic, why.to_string())),
    }
}

/// Whether INIT should ask for the ring, and whether the kernel granted
/// it: shared between the fuser shell (which answers INIT) and the daemon
/// (which then starts the queues).
#[derive(Default)]
pub struct RingOffer {
    wanted: bool,
    granted: AtomicBool,
}

impl RingOffer {
    pub fn new(wanted: bool) -> RingOffer {
        RingOffer {
            wanted,
            granted: AtomicBool::new(false),
        }
    }

    pub fn wanted(&self) -> bool {
        self.wanted
    }

    pub fn grant(&self) {
        self.granted.store(true, Ordering::Relaxed);
    }

    pub fn granted(&self) -> bool {
        self.granted.load(Ordering::Relaxed)
    }
}
