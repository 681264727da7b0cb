//! How the daemon's flags spell their values: one parser per value, shared
//! by the two grammars that take those flags, the command line
//! ([`crate::cli`]) and `serve`'s Negotiate options
//! ([`crate::serve::options`]), so that both take the same words and say
//! the same thing when refusing one. Each error completes "VALUE ...".

use std::time::Duration;

use crate::fuse::options::{Allow, ZeroMessageOpens};
use crate::fuse::transport::Asked;
use crate::sandbox::hybrid::cutoff::NativeBelow;
use crate::sandbox::materialize::Method;

pub fn parse_allow(text: &str) -> Result<Allow, String> {
    match text {
        "self" => Ok(Allow::OwnerOnly),
        "root" => Ok(Allow::RootAndOwner),
        "other" => Ok(Allow::Everyone),
        _ => Err("takes self, root or other".to_owned()),
    }
}

pub fn parse_zero_message_opens(text: &str) -> Result<ZeroMessageOpens, String> {
    match text {
        // `auto` once chose zero-message opens where the kernel could; it
        // is kept for old command lines and now means the correct default.
        "off" | "auto" => Ok(ZeroMessageOpens::Off),
        "on" => Ok(ZeroMessageOpens::On),
        _ => Err("takes off, auto (the same as off) or on".to_owned()),
    }
}

pub fn parse_transport(text: &str) -> Result<Asked, String> {
    match text {
        "auto" => Ok(Asked::Auto),
        "io_uring" => Ok(Asked::IoUring),
        "classic" => Ok(Asked::Classic),
        _ => Err("takes auto, io_uring or classic".to_owned()),
    }
}

pub fn parse_method(text: &str) -> Result<Method, String> {
    Method::parse(text).ok_or_else(|| "takes symlink, hardlink, clone, copy or auto".to_owned())
}

pub fn parse_native_below(text: &str) -> Result<NativeBelow, String> {
    NativeBelow::parse(text).ok_or_else(|| "takes a count, 0 or auto".to_owned())
}

pub fn parse_positive(text: &str) -> Result<usize, String> {
    text.parse()
        .ok()
        .filter(|&n: &usize| n > 0)
        .ok_or_else(|| "takes a positive number".to_owned())
}

/// `60s`, `500ms`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| "is not a duration such as 60s".to_owned())?;
    let seconds = match unit {
        "" | "s" => number,
        "ms" => number / 1e3,
        "us" => number / 1e6,
        "ns" => number / 1e9,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(format!("has an unknown unit {unit:?}")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| "is out of range".to_owned())
}
