//! Turning wire mappings into absolute, validated paths.
//!
//! A mapping names its paths relative to registered prefixes. Prefixes are
//! state of the whole daemon, not of one sandbox: Bazel registers each prefix
//! once and refers to it in every later request, even after a request that
//! failed. So a request's prefixes are registered as a unit (all or none),
//! independently of whether its sandbox is then created.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;

use crate::types::{CreateSandbox, Mapping, PrefixId};

/// A problem with one request's prefixes or mappings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolveError(pub String);

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ResolveError {}

/// A mapping with both sides resolved to absolute paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedMapping {
    /// Path inside the sandbox: `/` or `/a/b`, with no empty, `.` or `..`
    /// component.
    pub path: String,
    /// Absolute path of the underlying object.
    pub underlying: PathBuf,
    pub writable: bool,
}

impl ResolvedMapping {
    /// The components of `path`; none for the sandbox root.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.path.split('/').filter(|c| !c.is_empty())
    }
}

/// The prefixes registered so far.
#[derive(Debug, Default)]
pub struct PrefixTable {
    prefixes: HashMap<PrefixId, String>,
}

impl PrefixTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `new` as a unit: if any entry is invalid, none is kept.
    /// Registering a prefix again with the same path is allowed.
    pub fn register(&mut self, new: &BTreeMap<PrefixId, String>) -> Result<(), ResolveError> {
        let new: Vec<(PrefixId, &str)> = new.iter().map(|(&id, p)| (id, p.as_str())).collect();
        self.check_new(&new)?;
        self.insert(&new);
        Ok(())
    }

    /// Checks that `new` (sorted by id) can be registered, in the order
    /// [`PrefixTable::register`] reports problems.
    pub(crate) fn check_new(&self, new: &[(PrefixId, &str)]) -> Result<(), ResolveError> {
        for &(id, path) in new {
            if id == 0 {
                return Err(ResolveError(format!(
                    "prefix 0 is reserved for absolute paths and cannot be registered (got {path:?})"
                )));
            }
            check_no_nul(path, "prefix")?;
            if !path.starts_with('/') {
                return Err(ResolveError(format!(
                    "prefix {id} must be an absolute path, got {path:?}"
                )));
            }
            if let Some(old) = self.prefixes.get(&id) {
                if old != path {
                    return Err(ResolveError(format!(
                        "prefix {id} is already registered as {old:?} and cannot be changed to {path:?}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Registers `new`, checked by [`PrefixTable::check_new`].
    pub(crate) fn insert(&mut self, new: &[(PrefixId, &str)]) {
        for &(id, path) in new {
            if self.prefixes.get(&id).map(String::as_str) != Some(path) {
                self.prefixes.insert(id, path.to_owned());
            }
        }
    }

    /// The path of prefix `id`, if registered.
    pub(crate) fn get(&self, id: PrefixId) -> Option<&str> {
        self.prefixes.get(&id).map(String::as_str)
    }

    /// Registers `create`'s prefixes, then resolves each of its mappings, as
    /// a daemon does on receiving it. The prefixes stay registered even if a
    /// mapping then fails: the client counts them as sent.
    pub fn resolve_create(
        &mut self,
        create: &CreateSandbox,
    ) -> Result<Vec<ResolvedMapping>, ResolveError> {
        self.register(&create.prefixes)?;
        create
            .mappings
            .iter()
            .enumerate()
            .map(|(index, m)| {
                self.resolve(m)
                    .map_err(|err| ResolveError(format!("mapping #{index} ({:?}): {err}", m.path)))
            })
            .collect()
    }

    /// Resolves both sides of a mapping.
    pub fn resolve(&self, mapping: &Mapping) -> Result<ResolvedMapping, ResolveError> {
        let path = self.join(mapping.path_prefix, &mapping.path, "path")?;
        validate_sandbox_path(&path)?;
        let underlying = self.join(
            mapping.underlying_path_prefix,
            &mapping.underlying_path,
            "underlying path",
        )?;
        Ok(ResolvedMapping {
            path: normalize_root(path),
            underlying: PathBuf::from(underlying),
            writable: mapping.writable,
        })
    }

    fn join(&self, prefix: PrefixId, tail: &str, what: &str) -> Result<String, ResolveError> {
        let mut joined = String::new();
        join_into(&mut joined, |id| self.get(id), prefix, tail, what)?;
        Ok(joined)
    }
}

/// Joins prefix `prefix` (its path from `base`) and `tail` into `out`
/// (cleared first), as a mapping's side named `what` is resolved.
pub(crate) fn join_into<'p>(
    out: &mut String,
    base: impl FnOnce(PrefixId) -> Option<&'p str>,
    prefix: PrefixId,
    tail: &str,
    what: &str,
) -> Result<(), ResolveError> {
    out.clear();
    check_no_nul(tail, what)?;
    if prefix == 0 {
        if !tail.starts_with('/') {
            return Err(ResolveError(format!(
                "{what} {tail:?} is not absolute (prefix 0 means an absolute path)"
            )));
        }
        out.push_str(tail);
        return Ok(());
    }
    let Some(base) = base(prefix) else {
        return Err(ResolveError(format!(
            "Prefix {prefix} does not exist ({what} {tail:?} uses it)"
        )));
    };
    if tail.starts_with('/') {
        return Err(ResolveError(format!(
            "{what} {tail:?} must be relative to prefix {prefix} ({base:?})"
        )));
    }
    out.push_str(base);
    if !tail.is_empty() {
        if !base.ends_with('/') {
            out.push('/');
        }
        out.push_str(tail);
    }
    Ok(())
}

/// Resolves the sandbox side of a mapping into `out`: joined, validated
/// and with a trailing `/` dropped, as [`PrefixTable::resolve`] does.
pub(crate) fn resolve_path_into<'p>(
    out: &mut String,
    base: impl FnOnce(PrefixId) -> Option<&'p str>,
    prefix: PrefixId,
    tail: &str,
) -> Result<(), ResolveError> {
    join_into(out, base, prefix, tail, "path")?;
    validate_sandbox_path(out)?;
    if out.len() > 1 && out.ends_with('/') {
        out.pop();
    }
    Ok(())
}

/// Longest path and name the kernel accepts.
const PATH_MAX: usize = 4096;
const NAME_MAX: usize = 255;

/// Accepts `/` and `/a/b`; rejects empty, `.` and `..` components, so that no
/// name in a request can climb out of its sandbox.
fn validate_sandbox_path(path: &str) -> Result<(), ResolveError> {
    if path.len() > PATH_MAX {
        return Err(ResolveError(format!(
            "path {:?}... is longer than {PATH_MAX} bytes",
            path.chars().take(64).collect::<String>()
        )));
    }
    if path == "/" {
        return Ok(());
    }
    let trimmed = path.strip_suffix('/').unwrap_or(path);
    for component in trimmed[1..].split('/') {
        match component {
            "" => {
                return Err(ResolveError(format!(
                    "path {path:?} has an empty component"
                )))
            }
            "." | ".." => {
                return Err(ResolveError(format!(
                    "path {path:?} has a {component:?} component"
                )))
            }
            _ if component.len() > NAME_MAX => {
                return Err(ResolveError(format!(
                    "path {path:?} has a component longer than {NAME_MAX} bytes"
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

fn normalize_root(path: String) -> String {
    if path.len() > 1 && path.ends_with('/') {
        path[..path.len() - 1].to_owned()
    } else {
        path
    }
}

fn check_no_nul(value: &str, what: &str) -> Result<(), ResolveError> {
    if value.contains('\0') {
        return Err(ResolveError(format!(
            "{what} {value:?} contains a NUL byte"
        )));
    }
    Ok(())
}

/// Checks a sandbox id: it becomes one directory name at the top of the
/// mount, so it must be a single, ordinary path component.
pub fn validate_sandbox_id(id: &str) -> Result<(), ResolveError> {
    // sandboxfs 0.2.0's words for an empty id; scripts grep for them.
    if id.is_empty() {
        return Err(ResolveError(
            "sandbox id \"\": Identifier cannot be empty".to_owned(),
        ));
    }
    let problem = match id {
        "." | ".." => "is a special directory name",
        _ if id.contains('/') => "contains '/'",
        _ if id.contains('\0') => "contains a NUL byte",
        _ if id.len() > NAME_MAX => "is longer than 255 bytes",
        _ => return Ok(()),
    };
    Err(ResolveError(format!("sandbox id {id:?} {problem}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(x: PrefixId, p: &str, y: PrefixId, u: &str) -> Mapping {
        Mapping {
            path_prefix: x,
            path: p.into(),
            underlying_path_prefix: y,
            underlying_path: u.into(),
            writable: false,
        }
    }

    fn table(entries: &[(PrefixId, &str)]) -> PrefixTable {
        let mut table = PrefixTable::new();
        let new = entries.iter().map(|(k, v)| (*k, v.to_string())).collect();
        table.register(&new).unwrap();
        table
    }

    #[test]
    fn joins_prefixes_without_doubling_slashes() {
        let t = table(&[(1, "/"), (2, "/out/base")]);
        let r = t.resolve(&mapping(1, "ws", 2, "scratch")).unwrap();
        assert_eq!(r.path, "/ws");
        assert_eq!(r.underlying, PathBuf::from("/out/base/scratch"));
        let r = t.resolve(&mapping(0, "/a/b", 0, "/u")).unwrap();
        assert_eq!(r.components().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(
            t.resolve(&mapping(2, "", 0, "/u")).unwrap().path,
            "/out/base"
        );
    }

    #[test]
    fn rejects_escaping_and_malformed_paths() {
        let t = table(&[(1, "/")]);
        for (x, p) in [
            (0, "rel"),
            (0, "/a/../b"),
            (0, "/a/./b"),
            (0, "/a//b"),
            (1, "/abs"),
            (9, "a"),
        ] {
            let err = t.resolve(&mapping(x, p, 0, "/u")).unwrap_err();
            assert!(err.0.contains(p), "{err} should name {p}");
        }
        assert!(t.resolve(&mapping(0, "/a\0b", 0, "/u")).is_err());
        assert!(t.resolve(&mapping(0, "/a", 0, "relative")).is_err());
    }

    #[test]
    fn registration_is_all_or_nothing_and_stable() {
        let mut t = table(&[(1, "/a")]);
        let bad: BTreeMap<_, _> = [(2, "/b".to_string()), (1, "/changed".to_string())].into();
        let err = t.register(&bad).unwrap_err();
        assert!(err.0.contains("prefix 1"), "{err}");
        assert!(
            t.resolve(&mapping(2, "x", 0, "/u")).is_err(),
            "prefix 2 leaked"
        );
        t.register(&[(1, "/a".to_string())].into()).unwrap();
        for bad in [(0, "/z"), (3, "relative")] {
            assert!(t.register(&[(bad.0, bad.1.to_string())].into()).is_err());
        }
    }

    #[test]
    fn a_create_registers_its_prefixes_even_when_a_mapping_fails() {
        let mut t = PrefixTable::new();
        let create = CreateSandbox {
            id: "1".into(),
            mappings: vec![mapping(1, "ok", 0, "/u"), mapping(1, "../up", 0, "/u")],
            prefixes: [(1, "/ws".to_string())].into(),
        };
        let err = t.resolve_create(&create).unwrap_err();
        assert!(err.0.starts_with("mapping #1 (\"../up\"):"), "{err}");
        assert_eq!(
            t.resolve(&mapping(1, "later", 0, "/u")).unwrap().path,
            "/ws/later"
        );
    }

    #[test]
    fn sandbox_ids_are_single_components() {
        for bad in ["", ".", "..", "a/b", "/a", "a\0"] {
            assert!(validate_sandbox_id(bad).is_err(), "{bad:?}");
        }
        validate_sandbox_id("123").unwrap();
        validate_sandbox_id("empty").unwrap();
    }
}
