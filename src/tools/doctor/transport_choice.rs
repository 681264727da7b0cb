//! What the kernel offers for FUSE over io_uring (Linux 6.14+, when the
//! fuse module's `enable_uring` parameter is on), read from the kernel's
//! version and the module parameter only, so that `actionfs doctor` can
//! say it without mounting. Which transport the daemon then takes, and
//! why, is `fuse::transport::choose`.

use std::path::Path;

/// The fuse module's switch for FUSE over io_uring.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// The first kernel with FUSE over io_uring.
pub const URING_SINCE: (u32, u32) = (6, 14);

/// What the kernel offers for io_uring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UringFacts {
    /// `(major, minor)` of the running kernel, if it could be read.
    pub kernel: Option<(u32, u32)>,
    /// The `enable_uring` parameter: `None` when the module has none
    /// (an older kernel, or one built without CONFIG_FUSE_IO_URING).
    pub enabled: Option<bool>,
}

impl UringFacts {
    /// Reads the running kernel's version and the module parameter.
    pub fn read() -> UringFacts {
        UringFacts {
            kernel: kernel_version(),
            enabled: read_switch(Path::new(ENABLE_URING)),
        }
    }

    /// Whether the kernel would accept an io_uring FUSE server.
    pub fn available(&self) -> bool {
        self.kernel.is_some_and(|k| k >= URING_SINCE) && self.enabled == Some(true)
    }
}

/// The running kernel's `(major, minor)`, from uname(2).
pub fn kernel_version() -> Option<(u32, u32)> {
    parse_release(nix::sys::utsname::uname().ok()?.release().to_str()?)
}

/// `(major, minor)` of a release string such as `6.18.44-generic`.
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    Some((parts.next()?.ok()?, parts.next()?.ok()?))
}

/// A boolean module parameter: `Y`/`1` on, `N`/`0` off.
fn read_switch(path: &Path) -> Option<bool> {
    let text = std::fs::read_to_string(path).ok()?;
    match text.trim() {
        "Y" | "y" | "1" => Some(true),
        "N" | "n" | "0" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_to_major_and_minor() {
        assert_eq!(parse_release("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(parse_release("6.9.0"), Some((6, 9)));
        assert_eq!(parse_release("24.3.0"), Some((24, 3)));
        assert_eq!(parse_release("garbage"), None);
    }

    #[test]
    fn io_uring_needs_the_kernel_and_the_switch() {
        let facts = |kernel, enabled| UringFacts { kernel, enabled };
        assert!(facts(Some((6, 18)), Some(true)).available());
        assert!(!facts(Some((6, 9)), Some(true)).available());
        assert!(!facts(Some((6, 18)), Some(false)).available());
        assert!(!facts(Some((6, 18)), None).available());
    }
}
