//! The jail's rules applied: a Landlock domain for the file system, TCP
//! and scopes, then (without network) a seccomp filter on `socket`. Both
//! are inherited by every child and cannot be lifted.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope, ABI,
};

use crate::{Rules, MIN_ABI};

/// The ABI whose rights the jail handles, all of them required: newer
/// kernels' rights are left out, so that a new kernel changes nothing.
const ABI_USED: ABI = ABI::V6;

/// `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`:
/// the kernel's ABI, 0 where Landlock is missing or disabled.
pub fn abi() -> i32 {
    // SAFETY: with a null attribute and size 0, the version flag only
    // returns a number; no memory is read or written.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    version.max(0) as i32
}

/// Applies `rules` to this process (and so to everything it execs).
pub fn confine(rules: &Rules) -> Result<(), String> {
    let found = abi();
    if found < MIN_ABI {
        return Err(format!(
            "this kernel's Landlock ABI is {found}, the jail needs {MIN_ABI} or later"
        ));
    }
    let all = AccessFs::from_all(ABI_USED);
    let read = AccessFs::from_read(ABI_USED);
    let file_only = AccessFs::from_file(ABI_USED);
    let mut net = AccessNet::from_all(ABI_USED);
    if rules.network {
        net = BitFlags::EMPTY;
    }
    let mut ruleset = Ruleset::default().set_compatibility(CompatLevel::HardRequirement);
    let rule_files = rules_files(rules);
    if rule_files {
        ruleset = ruleset
            .handle_access(all)
            .map_err(|err| format!("landlock ruleset (file system): {err}"))?;
    }
    if !net.is_empty() {
        ruleset = ruleset
            .handle_access(net)
            .map_err(|err| format!("landlock ruleset (TCP): {err}"))?;
    }
    let mut created = ruleset
        .scope(Scope::from_all(ABI_USED))
        .map_err(|err| format!("landlock ruleset (scopes): {err}"))?
        .create()
        .map_err(|err| format!("landlock_create_ruleset: {err}"))?;
    let mut allowed: Vec<(PathBuf, BitFlags<AccessFs>)> = Vec::new();
    if rule_files {
        allowed.extend(readable(&rules.hide)?.into_iter().map(|path| (path, read)));
        allowed.extend(rules.write.iter().map(|path| (path.clone(), all)));
    }
    if rule_files && rules.dev {
        // Device nodes: written, truncated (`> /dev/null`), ioctl'd
        // (terminals); never made or removed.
        let device =
            AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
        allowed.extend(DEVICES.iter().map(|node| (PathBuf::from(node), device)));
    }
    for (path, access) in allowed {
        let fd = match PathFd::new(&path) {
            Ok(fd) => fd,
            // Nothing to allow where nothing is (Bazel lists macOS's
            // /private/tmp on every system).
            Err(_) if path.symlink_metadata().is_err() => continue,
            Err(err) => return Err(format!("open {path:?} (O_PATH): {err}")),
        };
        let meta = std::fs::metadata(&path);
        // A pipe or socket (/dev/stdin's end, when /dev is expanded
        // around a hidden path) is no file system object to rule.
        if meta
            .as_ref()
            .is_ok_and(|m| m.file_type().is_fifo() || m.file_type().is_socket())
        {
            continue;
        }
        let is_dir = meta.is_ok_and(|m| m.is_dir());
        let access = if is_dir { access } else { access & file_only };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|err| format!("landlock_add_rule {path:?}: {err}"))?;
    }
    created
        .restrict_self()
        .map_err(|err| format!("landlock_restrict_self: {err}"))?;
    if !rules.network {
        seccomp::deny_non_tcp_sockets()?;
    }
    Ok(())
}

/// Whether the file system is ruled by Landlock. Not where the jail's
/// mount namespace already makes the host read-only but the writable
/// paths ([`crate::namespaces`]) and no path is hidden: the rules would
/// only repeat the mounts, and cost a walk to `/` at every open of the
/// action. Device nodes are then written as the user's permissions allow,
/// in a `/dev` whose entries cannot change (linux-sandbox leaves all of
/// `/dev` writable).
pub fn rules_files(rules: &Rules) -> bool {
    !(rules.namespaces && rules.hide.is_empty())
}

/// The device nodes an action may write, as on any host: `/dev` itself
/// is not a writable hierarchy (its `shm` may hold the store).
const DEVICES: [&str; 8] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// The hierarchies to allow reading: `/`, or with hidden paths, every
/// entry beside the way to each of them, down to it. Landlock allows and
/// never denies, so a hidden path's siblings are allowed one by one (its
/// ancestors are not listable; entries made later are not readable).
fn readable(hide: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    // A hidden path is denied where it resolves.
    let hidden: Vec<PathBuf> = hide
        .iter()
        .filter_map(|path| std::fs::canonicalize(path).ok())
        .collect();
    if hidden.is_empty() {
        return Ok(vec![PathBuf::from("/")]);
    }
    let mut allowed = Vec::new();
    expand(Path::new("/"), &hidden, &mut allowed)?;
    Ok(allowed)
}

fn expand(dir: &Path, hidden: &[PathBuf], allowed: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|err| format!("readdir {dir:?}: {err}"))?;
    for entry in entries {
        let entry = entry.map_err(|err| format!("readdir {dir:?}: {err}"))?;
        let path = entry.path();
        // A symlink's rule lands on its target.
        let resolved = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if hidden.iter().any(|h| h.starts_with(&resolved)) {
            if resolved == path && !hidden.contains(&path) {
                expand(&path, hidden, allowed)?;
            }
            // The hidden path itself, or a link to or above it: left out.
            continue;
        }
        allowed.push(path);
    }
    Ok(())
}

/// Without network, the sockets Landlock does not rule: UDP, raw,
/// SCTP, MPTCP, packet... `socket()` makes only Unix, netlink and TCP
/// ones (TCP's bind and connect are Landlock's), and `io_uring_setup`
/// fails with ENOSYS (its socket op would bypass this filter; programs
/// fall back to plain syscalls, as on old kernels).
mod seccomp {
    const LD_W_ABS: u16 = 0x20;
    const ALU_AND_K: u16 = 0x54;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    const OFF_NR: u32 = 0;
    const OFF_ARCH: u32 = 4;
    const fn off_arg(n: u32) -> u32 {
        16 + 8 * n
    }

    #[cfg(target_arch = "x86_64")]
    mod arch {
        pub const NATIVE: u32 = 0xc000_003e;
        pub const SOCKET: u32 = 41;
        /// x32 calls are x86-64's numbers with this bit set.
        pub const CLEAR: u32 = !0x4000_0000;
        /// i386 (`int 0x80`): socketcall, socket, io_uring_setup.
        pub const FOREIGN: (u32, [u32; 2], u32) = (0x4000_0003, [102, 359], 425);
    }
    #[cfg(target_arch = "aarch64")]
    mod arch {
        pub const NATIVE: u32 = 0xc000_00b7;
        pub const SOCKET: u32 = 198;
        pub const CLEAR: u32 = !0;
        /// AArch32 compat: socket (twice: it has no socketcall),
        /// io_uring_setup.
        pub const FOREIGN: (u32, [u32; 2], u32) = (0x4000_0028, [281, 281], 425);
    }

    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    pub fn deny_non_tcp_sockets() -> Result<(), String> {
        use arch::*;
        const IO_URING_SETUP: u32 = 425;
        let errno = |e: i32| RET_ERRNO | e as u32;
        let mut p = Asm::default();
        p.ld(OFF_ARCH);
        p.jeq(NATIVE, Next, "foreign");
        p.ld(OFF_NR);
        p.and(CLEAR);
        p.jeq(IO_URING_SETUP, "enosys", Next);
        p.jeq(SOCKET, Next, "allow");
        p.ld(off_arg(0));
        p.jeq(libc::AF_UNIX as u32, "allow", Next);
        p.jeq(libc::AF_NETLINK as u32, "allow", Next);
        p.jeq(libc::AF_INET as u32, "tcp", Next);
        p.jeq(libc::AF_INET6 as u32, "tcp", "eafnosupport");
        p.mark("tcp");
        p.ld(off_arg(1));
        p.and(0xf);
        p.jeq(libc::SOCK_STREAM as u32, Next, "eafnosupport");
        p.ld(off_arg(2));
        p.jeq(0, "allow", Next);
        p.jeq(libc::IPPROTO_TCP as u32, "allow", "eafnosupport");
        p.mark("foreign");
        let (foreign, sockets, uring) = FOREIGN;
        p.jeq(foreign, Next, "allow");
        p.ld(OFF_NR);
        p.jeq(sockets[0], "eafnosupport", Next);
        p.jeq(sockets[1], "eafnosupport", Next);
        p.jeq(uring, "enosys", "allow");
        p.mark("allow");
        p.ret(RET_ALLOW);
        p.mark("eafnosupport");
        p.ret(errno(libc::EAFNOSUPPORT));
        p.mark("enosys");
        p.ret(errno(libc::ENOSYS));
        let filter = p.assemble()?;
        let prog = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: prog points at `filter`, alive across the call; the
        // kernel copies the program. no_new_privs is set (Landlock did).
        // SPEC_ALLOW: on kernels whose speculation mitigations are in
        // seccomp mode, a filter would force them on for every jailed
        // task (slower code); they guard a process against itself, not
        // the host against the action.
        let done = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_SPEC_ALLOW,
                &prog as *const libc::sock_fprog,
            )
        };
        if done != 0 {
            return Err(format!(
                "seccomp(SECCOMP_SET_MODE_FILTER): {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// Elsewhere Landlock alone rules: TCP only (documented).
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub fn deny_non_tcp_sockets() -> Result<(), String> {
        Ok(())
    }

    use Target::Next;

    #[derive(Clone, Copy)]
    enum Target {
        Next,
        Label(&'static str),
    }

    impl From<&'static str> for Target {
        fn from(label: &'static str) -> Target {
            Target::Label(label)
        }
    }

    enum Op {
        Insn(u16, u32),
        Jeq(u32, Target, Target),
        Mark(&'static str),
    }

    /// Classic BPF with forward labels.
    #[derive(Default)]
    struct Asm(Vec<Op>);

    #[allow(dead_code)]
    impl Asm {
        fn ld(&mut self, offset: u32) {
            self.0.push(Op::Insn(LD_W_ABS, offset));
        }
        fn and(&mut self, mask: u32) {
            self.0.push(Op::Insn(ALU_AND_K, mask));
        }
        fn ret(&mut self, value: u32) {
            self.0.push(Op::Insn(RET_K, value));
        }
        fn jeq(&mut self, k: u32, yes: impl Into<Target>, no: impl Into<Target>) {
            self.0.push(Op::Jeq(k, yes.into(), no.into()));
        }
        fn mark(&mut self, label: &'static str) {
            self.0.push(Op::Mark(label));
        }

        fn assemble(&self) -> Result<Vec<libc::sock_filter>, String> {
            let mut at = Vec::new();
            let mut count = 0usize;
            for op in &self.0 {
                match op {
                    Op::Mark(label) => at.push((*label, count)),
                    _ => count += 1,
                }
            }
            let mut out = Vec::with_capacity(count);
            for op in &self.0 {
                let here = out.len();
                let offset = |target: Target| -> Result<u8, String> {
                    let to = match target {
                        Target::Next => return Ok(0),
                        Target::Label(label) => at
                            .iter()
                            .find(|(l, _)| *l == label)
                            .map(|(_, to)| *to)
                            .ok_or_else(|| format!("seccomp filter: no label {label}"))?,
                    };
                    to.checked_sub(here + 1)
                        .and_then(|d| u8::try_from(d).ok())
                        .ok_or_else(|| {
                            format!("seccomp filter: {label:?} out of reach", label = to)
                        })
                };
                match op {
                    Op::Mark(_) => {}
                    Op::Insn(code, k) => out.push(libc::sock_filter {
                        code: *code,
                        jt: 0,
                        jf: 0,
                        k: *k,
                    }),
                    Op::Jeq(k, yes, no) => out.push(libc::sock_filter {
                        code: JEQ_K,
                        jt: offset(*yes)?,
                        jf: offset(*no)?,
                        k: *k,
                    }),
                }
            }
            Ok(out)
        }
    }
}
