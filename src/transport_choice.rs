//! Which FUSE transport the daemon would use on this machine, and why:
//! the classic `/dev/fuse` read/write loop, or FUSE over io_uring (Linux
//! 6.14+, when the fuse module's `enable_uring` parameter is on). Read
//! from the kernel's version and the module parameter only, so `actionfs
//! doctor` can say it without mounting. The io_uring transport itself is
//! not in this build yet; when it lands, its own choice replaces this.

use std::path::Path;

/// The fuse module's switch for FUSE over io_uring.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// The first kernel with FUSE over io_uring.
pub const URING_SINCE: (u32, u32) = (6, 14);

/// Whether this build has an io_uring transport to choose.
pub const URING_BUILT: bool = false;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// read(2)/write(2) on `/dev/fuse`.
    Classic,
    IoUring,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Classic => "classic",
            Transport::IoUring => "io_uring",
        }
    }
}

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

/// The transport chosen and the reason, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub transport: Transport,
    pub why: String,
}

/// The transport the daemon would choose given `facts`.
pub fn choose(facts: &UringFacts) -> Choice {
    let classic = |why: String| Choice {
        transport: Transport::Classic,
        why,
    };
    let (major, minor) = URING_SINCE;
    match (facts.kernel, facts.enabled) {
        (Some(kernel), _) if kernel < URING_SINCE => classic(format!(
            "Linux {}.{} has no FUSE over io_uring ({major}.{minor}+)",
            kernel.0, kernel.1
        )),
        (_, None) => classic(format!(
            "the fuse module has no enable_uring parameter ({ENABLE_URING})"
        )),
        (_, Some(false)) => classic(format!("enable_uring is off ({ENABLE_URING} is N)")),
        (_, Some(true)) if !URING_BUILT => classic(
            "the kernel offers io_uring (enable_uring is Y), but this build serves /dev/fuse only"
                .to_owned(),
        ),
        (_, Some(true)) => Choice {
            transport: Transport::IoUring,
            why: "enable_uring is Y and the kernel has FUSE over io_uring".to_owned(),
        },
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
        let old = choose(&facts(Some((6, 9)), Some(true)));
        assert_eq!(old.transport, Transport::Classic);
        assert!(old.why.contains("6.14"), "{}", old.why);
        let off = choose(&facts(Some((6, 18)), Some(false)));
        assert!(off.why.contains("off"), "{}", off.why);
        assert!(choose(&facts(Some((6, 18)), None))
            .why
            .contains("no enable_uring"));
        let on = facts(Some((6, 18)), Some(true));
        assert!(on.available());
        let chosen = choose(&on);
        let expected = if URING_BUILT {
            Transport::IoUring
        } else {
            Transport::Classic
        };
        assert_eq!(chosen.transport, expected, "{}", chosen.why);
    }
}
