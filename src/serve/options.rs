//! What `actionfs serve` is told in Negotiate: one option per Bazel
//! `--sandbox_backend_opt`, with the daemon's spellings (values parsed by
//! [`crate::daemon::flag_values`], as on the daemon's command line). Not
//! argv: the command line only names the workspace.

use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, Parser};

use crate::daemon::flag_values::{
    parse_duration, parse_method, parse_native_below, parse_positive, parse_transport,
};
use crate::fuse::transport::Asked;
use crate::sandbox::hybrid::cutoff::NativeBelow;
use crate::sandbox::materialize::Method;
use crate::serve::confine::JailAsked;

#[derive(Parser, Debug)]
#[command(
    name = "serve-options",
    no_binary_name = true,
    disable_help_flag = true
)]
struct BackendFlags {
    /// Where the mount, the scratch directories, the native trees and the
    /// store live (default: /dev/shm where it is a writable tmpfs, else
    /// /var/tmp, else the temporary directory; below /tmp, writable in
    /// Bazel's jail, every sandbox is FUSE)
    #[arg(long = "sandbox_base", value_name = "DIR")]
    sandbox_base: Option<PathBuf>,
    #[arg(long = "native_below", value_name = "N|auto|0", default_value = "auto", value_parser = parse_native_below)]
    native_below: NativeBelow,
    /// How native sandboxes place inputs: symlink, clone or copy (hard
    /// links would put captured content where an action may write)
    #[arg(long = "native_method", value_name = "METHOD", default_value = "symlink", value_parser = parse_serve_method)]
    native_method: Method,
    #[arg(long = "native_stashes", value_name = "N", default_value_t = 8)]
    native_stashes: usize,
    #[arg(long, value_name = "auto|io_uring|classic", default_value = "auto", value_parser = parse_transport)]
    transport: Asked,
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    ttl: Duration,
    #[arg(long, value_name = "auto|off", default_value = "auto", value_parser = ["auto", "off"])]
    passthrough: String,
    /// Bytes of pushed content and directory blobs kept at most; the least
    /// recently used unpinned entries go first (default: 8 GiB, or a
    /// quarter of a tmpfs sandbox base if less)
    #[arg(long = "store_max_bytes", value_name = "N")]
    store_max_bytes: Option<u64>,
    /// Input files nobody pushed and smaller than this many bytes are
    /// captured into the store from their default place the first time a
    /// Create names their digest (hashed as they are copied), then served
    /// from it; larger ones, or all with 0, are served at the default
    /// place, checked by size at each Create
    #[arg(long = "capture_below", value_name = "BYTES", default_value_t = 1 << 20)]
    capture_below: u64,
    /// on: when stdin closes, hand the store's content
    /// (`BASE/actionfs-warm-UID`), stashed native trees and where looks
    /// at default places found files (`BASE/actionfs-state-UID`) on to
    /// the next backend on this base,
    /// and adopt what a predecessor handed on at start; off: neither,
    /// nothing left behind
    #[arg(long = "keep_state", value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    keep_state: String,
    #[arg(long = "reconfig_threads", value_name = "N", value_parser = parse_positive)]
    reconfig_threads: Option<usize>,
    #[arg(long, value_name = "PATH")]
    calibration: Option<PathBuf>,
    /// Who confines actions: landlock (actionfs's own jail, where the
    /// kernel has Landlock ABI 6; else Bazel's), bazel (linux-sandbox or
    /// Seatbelt) or none
    #[arg(long, value_name = "landlock|bazel|none", default_value = "landlock", value_parser = parse_jail)]
    jail: JailAsked,
    /// on: every sandbox is served by FUSE in a reused root (`MOUNT/slot-N`,
    /// emptied after each Destroy), so that what the kernel cached there
    /// serves the next action; off: a new root per sandbox, native below
    /// the cutoff
    #[arg(long, value_name = "on|off", default_value = "off", value_parser = ["on", "off"])]
    slots: String,
}

/// The options, parsed.
#[derive(Clone, Debug)]
pub struct BackendOptions {
    pub sandbox_base: Option<PathBuf>,
    pub native_below: NativeBelow,
    pub native_method: Method,
    pub native_stashes: usize,
    pub transport: Asked,
    pub ttl: Duration,
    pub passthrough: bool,
    pub store_max_bytes: Option<u64>,
    pub capture_below: u64,
    pub keep_state: bool,
    pub reconfig_threads: Option<usize>,
    pub calibration: Option<PathBuf>,
    pub jail: JailAsked,
    pub slots: bool,
}

/// Reads Negotiate's options; the error names the first one refused, in
/// one line (Bazel shows the backend's answer in its own message).
pub fn parse(options: &[String]) -> Result<BackendOptions, String> {
    let flags = BackendFlags::try_parse_from(options).map_err(|err| {
        let text = err.to_string();
        let first = text
            .lines()
            .next()
            .unwrap_or("")
            .trim_start_matches("error: ");
        format!("backend option refused: {first}")
    })?;
    Ok(BackendOptions {
        sandbox_base: flags.sandbox_base,
        native_below: flags.native_below,
        native_method: flags.native_method,
        native_stashes: flags.native_stashes,
        transport: flags.transport,
        ttl: flags.ttl,
        passthrough: flags.passthrough == "auto",
        store_max_bytes: flags.store_max_bytes,
        capture_below: flags.capture_below,
        keep_state: flags.keep_state == "on",
        reconfig_threads: flags.reconfig_threads,
        calibration: flags.calibration,
        jail: flags.jail,
        slots: flags.slots == "on",
    })
}

fn parse_jail(text: &str) -> Result<JailAsked, String> {
    match text {
        "landlock" => Ok(JailAsked::Landlock),
        "bazel" => Ok(JailAsked::Bazel),
        "none" => Ok(JailAsked::None),
        _ => Err(format!("{text:?} is no jail: landlock, bazel or none")),
    }
}

/// The daemon's methods but `hardlink` and `auto` (which prefers hard
/// links): a hard link in the action's writable sandbox root is the
/// store's own file, which the action could change for every sandbox.
fn parse_serve_method(text: &str) -> Result<Method, String> {
    match parse_method(text)? {
        Method::Hardlink | Method::Auto => Err(format!(
            "{text} would hard-link captured content into sandboxes, where an action could \
             change it; use symlink, clone or copy"
        )),
        method => Ok(method),
    }
}

/// Every option as help shows it (`--sandbox_base=DIR`, ...), from the
/// grammar itself, so that `actionfs serve --help` cannot drift from it.
pub fn synopsis() -> Vec<String> {
    BackendFlags::command()
        .get_arguments()
        .filter_map(|arg| {
            let long = arg.get_long()?;
            Some(match arg.get_value_names() {
                Some([value]) => format!("--{long}={value}"),
                _ => format!("--{long}"),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_take_the_daemons_spellings_and_a_refusal_names_the_option() {
        let o = parse(&[
            "--sandbox_base=/b".to_owned(),
            "--native_below".to_owned(),
            "7".to_owned(),
            "--ttl=500ms".to_owned(),
            "--passthrough=off".to_owned(),
        ])
        .unwrap();
        assert_eq!(o.sandbox_base, Some(PathBuf::from("/b")));
        assert_eq!(o.native_below, NativeBelow::Fixed(7));
        assert_eq!(o.ttl, Duration::from_millis(500));
        assert!(!o.passthrough);
        assert_eq!(o.native_method, Method::Symlink);
        assert_eq!(o.jail, JailAsked::Landlock);
        assert_eq!(o.capture_below, 1 << 20);
        assert!(o.keep_state);
        assert!(!o.slots, "off unless asked");
        assert!(parse(&["--slots=on".to_owned()]).unwrap().slots);
        assert!(parse(&["--slots=maybe".to_owned()])
            .unwrap_err()
            .contains("--slots"));
        assert!(!parse(&["--keep_state=off".to_owned()]).unwrap().keep_state);
        assert_eq!(
            parse(&["--capture_below=0".to_owned()])
                .unwrap()
                .capture_below,
            0
        );
        assert_eq!(
            parse(&["--jail=none".to_owned()]).unwrap().jail,
            JailAsked::None
        );
        assert!(parse(&["--jail=chroot".to_owned()])
            .unwrap_err()
            .contains("no jail"));
        let refused = parse(&["--ttl=5parsecs".to_owned()]).unwrap_err();
        assert!(
            refused.starts_with("backend option refused: ") && refused.contains("unknown unit"),
            "{refused}"
        );
        let unknown = parse(&["--bogus".to_owned()]).unwrap_err();
        assert!(
            unknown.contains("--bogus") && !unknown.contains('\n'),
            "{unknown}"
        );
        let synopsis = synopsis();
        assert_eq!(synopsis[0], "--sandbox_base=DIR");
        assert!(
            synopsis.contains(&"--store_max_bytes=N".to_owned()),
            "{synopsis:?}"
        );
    }
}
