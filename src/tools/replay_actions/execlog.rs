//! Bazel's JSON execution log (`--execution_log_json_file`, Bazel 4.2.3):
//! one `SpawnExec` message per spawn Bazel ran, written as protobuf JSON
//! objects one after another (pretty-printed, not a JSON array, no
//! separators). The fields read here, as Bazel 4.2.3 spells them:
//!
//! ```text
//! {"commandArgs": ["/bin/bash", "-c", "..."],
//!  "environmentVariables": [{"name": "PATH", "value": "..."}],
//!  "platform": {"properties": []},
//!  "inputs": [{"path": "cc/greet.c",
//!              "digest": {"hash": "c827...", "sizeBytes": "81", "hashFunctionName": "SHA-256"}}],
//!  "listedOutputs": ["bazel-out/k8-fastbuild/bin/cc/hello"],
//!  "remotable": true, "cacheable": true, "timeoutMillis": "0",
//!  "progressMessage": "Linking cc/hello", "mnemonic": "CppLink",
//!  "actualOutputs": [{"path": "...", "digest": {...}}],
//!  "runner": "local", "remoteCacheHit": false, "status": "", "exitCode": 0,
//!  "remoteCacheable": true}
//! ```
//!
//! Paths are exec paths (relative to the exec root). 64-bit integers are
//! strings, as protobuf JSON writes them. Bazel already expands
//! directories: an input tree artifact (or source directory) appears as
//! one entry per file under it, and a tree artifact output appears in
//! `listedOutputs` as the directory and in `actualOutputs` as the files in
//! it. Spawns served from a cache say so in `runner` ("remote cache hit",
//! "disk cache hit") and `remoteCacheHit`.

use serde_json::Value;

/// One spawn of the log, as logged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Spawn {
    pub command_args: Vec<String>,
    /// In the logged order.
    pub env: Vec<(String, String)>,
    pub inputs: Vec<LoggedFile>,
    /// The outputs the spawn declared (files, or tree artifact directories).
    pub listed_outputs: Vec<String>,
    /// The files it made, with their digests.
    pub actual_outputs: Vec<LoggedFile>,
    pub mnemonic: String,
    pub progress_message: String,
    pub runner: String,
    pub remote_cache_hit: bool,
    pub status: String,
    pub exit_code: i64,
    /// `timeoutMillis`: the action's timeout (tests), 0 for none.
    pub timeout_millis: i64,
}

/// A path with its digest, if the log gave one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoggedFile {
    pub path: String,
    pub digest: Option<LoggedDigest>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoggedDigest {
    pub hash: String,
    pub size: i64,
    /// `hashFunctionName`, e.g. "SHA-256"; empty if not logged.
    pub function: String,
}

/// Why a logged spawn is not replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Skip {
    /// Its outputs came from a cache: nothing ran, and its inputs may not
    /// be in the exec root.
    CacheHit,
    /// It failed in the logged build, so there is nothing to compare with.
    Failed,
    /// It declared no outputs: nothing to compare.
    NoOutputs,
}

impl Skip {
    pub fn describe(self) -> &'static str {
        match self {
            Skip::CacheHit => "cache hit",
            Skip::Failed => "failed in the logged build",
            Skip::NoOutputs => "no outputs",
        }
    }
}

impl Spawn {
    /// Why this spawn is not replayed, if it is not.
    pub fn skip(&self) -> Option<Skip> {
        if self.remote_cache_hit || self.runner.contains("cache hit") {
            Some(Skip::CacheHit)
        } else if self.exit_code != 0 || !matches!(self.status.as_str(), "" | "SUCCESS") {
            Some(Skip::Failed)
        } else if self.listed_outputs.is_empty() && self.actual_outputs.is_empty() {
            Some(Skip::NoOutputs)
        } else {
            None
        }
    }
}

/// Why a log does not parse.
#[derive(Debug, thiserror::Error)]
pub enum ExecLogError {
    #[error("not a JSON execution log: after byte {offset} ({read} spawns read): {source}")]
    NotJson {
        offset: usize,
        read: usize,
        source: serde_json::Error,
    },
    /// Spawn `number` (1-based) of the log is not as Bazel writes one.
    #[error("spawn {number} of the log: {fault}")]
    Spawn { number: usize, fault: SpawnFault },
}

/// What is wrong with one logged spawn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpawnFault {
    #[error("is not a JSON object (is this a JSON execution log?)")]
    NotObject,
    #[error("has no commandArgs (is this a JSON execution log?)")]
    NoCommandArgs,
    /// `field` is `found` (JSON), not `wanted` ("a list", "a string", ...).
    #[error("{field} is {found}, not {wanted}")]
    WrongType {
        field: &'static str,
        found: String,
        wanted: &'static str,
    },
    /// An element of list `field` is `found`, not a string.
    #[error("{field} holds {found}, not a string")]
    NotStringElement { field: &'static str, found: String },
    #[error("an entry of {0} has no path")]
    NoPath(&'static str),
    /// In an entry of list `field`.
    #[error("{field}: {fault}")]
    In {
        field: &'static str,
        fault: Box<SpawnFault>,
    },
}

/// Parses a whole log: the objects one after another (a JSON array of them
/// is accepted too). Errors name the spawn (1-based) and what is wrong.
pub fn parse(text: &str) -> Result<Vec<Spawn>, ExecLogError> {
    let mut spawns = Vec::new();
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    loop {
        let offset = stream.byte_offset();
        let value = match stream.next() {
            None => break,
            Some(Ok(value)) => value,
            Some(Err(source)) => {
                return Err(ExecLogError::NotJson {
                    offset,
                    read: spawns.len(),
                    source,
                })
            }
        };
        let objects = match value {
            Value::Array(items) => items,
            other => vec![other],
        };
        for object in objects {
            let number = spawns.len() + 1;
            spawns.push(spawn(&object).map_err(|fault| ExecLogError::Spawn { number, fault })?);
        }
    }
    Ok(spawns)
}

fn spawn(value: &Value) -> Result<Spawn, SpawnFault> {
    if !value.is_object() {
        return Err(SpawnFault::NotObject);
    }
    if value.get("commandArgs").is_none() {
        return Err(SpawnFault::NoCommandArgs);
    }
    let env = list(value, "environmentVariables")?
        .iter()
        .map(|pair| Ok((string(pair, "name")?, string(pair, "value")?)))
        .collect::<Result<_, SpawnFault>>()?;
    Ok(Spawn {
        command_args: strings(value, "commandArgs")?,
        env,
        inputs: files(value, "inputs")?,
        listed_outputs: strings(value, "listedOutputs")?,
        actual_outputs: files(value, "actualOutputs")?,
        mnemonic: string(value, "mnemonic")?,
        progress_message: string(value, "progressMessage")?,
        runner: string(value, "runner")?,
        remote_cache_hit: match value.get("remoteCacheHit") {
            None => false,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| wrong("remoteCacheHit", v, "a boolean"))?,
        },
        status: string(value, "status")?,
        exit_code: integer(value, "exitCode")?,
        timeout_millis: integer(value, "timeoutMillis")?,
    })
}

fn wrong(field: &'static str, found: &impl std::fmt::Display, wanted: &'static str) -> SpawnFault {
    SpawnFault::WrongType {
        field,
        found: found.to_string(),
        wanted,
    }
}

/// A list field; absent (protobuf JSON omits empty lists) is empty.
fn list<'a>(value: &'a Value, field: &'static str) -> Result<&'a [Value], SpawnFault> {
    match value.get(field) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(wrong(field, other, "a list")),
    }
}

/// A list of strings.
fn strings(value: &Value, field: &'static str) -> Result<Vec<String>, SpawnFault> {
    list(value, field)?
        .iter()
        .map(|item| {
            item.as_str()
                .map(str::to_owned)
                .ok_or_else(|| SpawnFault::NotStringElement {
                    field,
                    found: item.to_string(),
                })
        })
        .collect()
}

/// A string field; absent is empty.
fn string(value: &Value, field: &'static str) -> Result<String, SpawnFault> {
    match value.get(field) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(wrong(field, other, "a string")),
    }
}

/// An integer field, as a number or (64-bit, in protobuf JSON) a string;
/// absent is 0.
fn integer(value: &Value, field: &'static str) -> Result<i64, SpawnFault> {
    match value.get(field) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| wrong(field, n, "a 64-bit integer")),
        Some(Value::String(s)) => s
            .parse()
            .map_err(|_| wrong(field, &format!("{s:?}"), "an integer")),
        Some(other) => Err(wrong(field, other, "an integer")),
    }
}

fn files(value: &Value, field: &'static str) -> Result<Vec<LoggedFile>, SpawnFault> {
    list(value, field)?
        .iter()
        .map(|file| {
            let path = string(file, "path")?;
            if path.is_empty() {
                return Err(SpawnFault::NoPath(field));
            }
            let digest = match file.get("digest") {
                None | Some(Value::Null) => None,
                Some(digest) => Some(LoggedDigest {
                    hash: string(digest, "hash")?,
                    size: integer(digest, "sizeBytes")?,
                    function: string(digest, "hashFunctionName")?,
                }),
            };
            Ok(LoggedFile { path, digest })
        })
        .collect::<Result<_, SpawnFault>>()
        .map_err(|fault| SpawnFault::In {
            field,
            fault: Box::new(fault),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two spawns as Bazel 4.2.3 writes them (trimmed).
    const LOG: &str = r#"{
  "commandArgs": ["/bin/bash", "-c", "echo \u0027a\u0027 \u003e out"],
  "environmentVariables": [{
    "name": "PATH",
    "value": "/bin"
  }, {
    "name": "PWD",
    "value": "/proc/self/cwd"
  }],
  "platform": {
    "properties": []
  },
  "inputs": [{
    "path": "external/bazel_tools/tools/genrule/genrule-setup.sh",
    "digest": {
      "hash": "bed43d0bb00449e82a04fbb6535f490fa5d7ed140b1c3ad2d463d5c295e9e836",
      "sizeBytes": "858",
      "hashFunctionName": "SHA-256"
    }
  }],
  "listedOutputs": ["bazel-out/k8-fastbuild/bin/out"],
  "remotable": true,
  "cacheable": true,
  "timeoutMillis": "0",
  "progressMessage": "Executing genrule //:out",
  "mnemonic": "Genrule",
  "actualOutputs": [{
    "path": "bazel-out/k8-fastbuild/bin/out",
    "digest": {
      "hash": "87428fc522803d31065e7bce3cf03fe475096631e5e07bbd7a0fde60c4cf25c7",
      "sizeBytes": "2",
      "hashFunctionName": "SHA-256"
    }
  }],
  "runner": "local",
  "remoteCacheHit": false,
  "status": "",
  "exitCode": 0,
  "remoteCacheable": true
}{
  "commandArgs": ["true"],
  "listedOutputs": ["x"],
  "mnemonic": "Genrule",
  "runner": "disk cache hit",
  "remoteCacheHit": true
}"#;

    #[test]
    fn reads_bazel_4_2_3_objects_one_after_another() {
        let spawns = parse(LOG).unwrap();
        assert_eq!(spawns.len(), 2);
        let first = &spawns[0];
        assert_eq!(first.command_args[2], "echo 'a' > out");
        assert_eq!(
            first.env,
            [
                ("PATH".to_owned(), "/bin".to_owned()),
                ("PWD".to_owned(), "/proc/self/cwd".to_owned())
            ]
        );
        assert_eq!(first.inputs.len(), 1);
        let digest = first.inputs[0].digest.as_ref().unwrap();
        assert_eq!((digest.size, digest.function.as_str()), (858, "SHA-256"));
        assert_eq!(first.listed_outputs, ["bazel-out/k8-fastbuild/bin/out"]);
        assert_eq!(first.actual_outputs[0].digest.as_ref().unwrap().size, 2);
        assert_eq!(
            (first.mnemonic.as_str(), first.runner.as_str()),
            ("Genrule", "local")
        );
        assert_eq!(first.skip(), None);
        // Absent fields take protobuf's defaults.
        let second = &spawns[1];
        assert!(second.inputs.is_empty() && second.env.is_empty());
        assert_eq!(second.skip(), Some(Skip::CacheHit));
        // An array of the same objects reads the same.
        let array = format!("[{}]", LOG.replace("}{", "},{"));
        assert_eq!(parse(&array).unwrap(), spawns);
    }

    #[test]
    fn skips_failed_and_output_less_spawns() {
        let failed = Spawn {
            listed_outputs: vec!["o".into()],
            exit_code: 1,
            status: "NON_ZERO_EXIT".into(),
            ..Spawn::default()
        };
        assert_eq!(failed.skip(), Some(Skip::Failed));
        assert_eq!(Spawn::default().skip(), Some(Skip::NoOutputs));
    }

    #[test]
    fn errors_name_the_spawn() {
        let err = parse(r#"{"commandArgs": []} {"commandArgs": [1]}"#).unwrap_err();
        assert!(
            matches!(
                &err,
                ExecLogError::Spawn {
                    number: 2,
                    fault: SpawnFault::NotStringElement {
                        field: "commandArgs",
                        ..
                    }
                }
            ),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("spawn 2") && text.contains("commandArgs"),
            "{text}"
        );
        let err = parse(r#"{"commandArgs": []} {"#).unwrap_err();
        assert!(
            matches!(err, ExecLogError::NotJson { read: 1, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("1 spawns read"), "{err}");
        let err = parse(r#"{"id": 3}"#).unwrap_err();
        assert!(
            matches!(
                err,
                ExecLogError::Spawn {
                    number: 1,
                    fault: SpawnFault::NoCommandArgs
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("no commandArgs"), "{err}");
    }
}
