//! The messages of the protocol, exactly as they appear on the wire.
//!
//! Requests use one-letter keys (`C`, `D`, `i`, `m`, `q`, `x`, `p`, `y`, `u`,
//! `w`); the long names that sandboxfs 0.2 also accepts are aliases. Unknown
//! keys are rejected so that a typo is an error, not a silently ignored field.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Identifier of a registered path prefix. `0` is reserved: "the path is
/// absolute, no prefix".
pub type PrefixId = u64;

/// One request read from the daemon's input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Request {
    /// Create the top-level directory `/ID` holding the given mappings.
    #[serde(rename = "C", alias = "CreateSandbox")]
    Create(CreateSandbox),
    /// Remove the top-level directory `/ID`.
    #[serde(rename = "D", alias = "DestroySandbox")]
    Destroy(String),
}

impl Request {
    /// The sandbox this request is about.
    pub fn id(&self) -> &str {
        match self {
            Request::Create(create) => &create.id,
            Request::Destroy(id) => id,
        }
    }
}

/// Body of a `C` request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    #[serde(rename = "i", alias = "id")]
    pub id: String,
    #[serde(rename = "m", alias = "mappings", default)]
    pub mappings: Vec<Mapping>,
    /// New prefixes to register. They stay registered for the life of the
    /// daemon, and may be used by mappings of this very request even though
    /// Bazel writes `q` after `m`.
    #[serde(
        rename = "q",
        alias = "prefixes",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub prefixes: BTreeMap<PrefixId, String>,
}

/// One `path -> underlying path` entry of a sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mapping {
    #[serde(rename = "x", alias = "path_prefix", default)]
    pub path_prefix: PrefixId,
    #[serde(rename = "p", alias = "path")]
    pub path: String,
    #[serde(rename = "y", alias = "underlying_path_prefix", default)]
    pub underlying_path_prefix: PrefixId,
    #[serde(rename = "u", alias = "underlying_path")]
    pub underlying_path: String,
    #[serde(
        rename = "w",
        alias = "writable",
        default,
        skip_serializing_if = "is_false"
    )]
    pub writable: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// One answer written to the daemon's output.
///
/// `id` is `None` only for a fatal error after which the daemon reads no
/// more requests; Bazel treats such an answer as the end of the daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Response {
    pub id: Option<String>,
    pub error: Option<String>,
}

impl Response {
    pub fn ok(id: impl Into<String>) -> Self {
        Response {
            id: Some(id.into()),
            error: None,
        }
    }

    pub fn error(id: impl Into<String>, message: impl Into<String>) -> Self {
        Response {
            id: Some(id.into()),
            error: Some(message.into()),
        }
    }

    /// The answer to a bad request that names no sandbox (`"id":null`);
    /// reading goes on.
    pub fn unnamed(message: impl Into<String>) -> Self {
        Response {
            id: None,
            error: Some(message.into()),
        }
    }

    /// The answer to an input that cannot be read on (`"id":null`).
    pub fn fatal(message: impl Into<String>) -> Self {
        Response {
            id: None,
            error: Some(message.into()),
        }
    }
}
