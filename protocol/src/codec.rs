//! Reading requests from, and writing responses to, byte streams.
//!
//! Bazel writes requests back to back with no separator (`{..}{..}`), and
//! waits for each answer before it writes anything that depends on it, so the
//! decoder must hand out a request as soon as its closing brace arrives,
//! without waiting for the next byte. Objects are self-delimiting, which is
//! what makes that possible.
//!
//! Decoding happens in two steps. First the stream is cut into values
//! ([`crate::frame`]); then each value is parsed and typed as a
//! [`Request`]. A value that is not a valid request, broken JSON included,
//! is answered with an error for the sandbox it names (or for none) and
//! reading goes on with the next request. Only a stream that cannot be
//! read on (it ends inside a value, a read fails, a value is over the size
//! limit) is fatal.

use std::io::{self, BufRead, Read, Write};

use crate::frame::{FrameError, Framer};
use crate::types::{Request, Response};

/// What the decoder makes of one JSON value.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A valid request.
    Request(Request),
    /// Not a valid request: broken JSON, or well-formed JSON of the wrong
    /// shape. `id` is the sandbox it names, if it names one before going
    /// wrong. The caller answers `id` (null if none) with `message` and
    /// keeps reading.
    Invalid { id: Option<String>, message: String },
}

/// An error after which no further request can be read.
#[derive(Debug, PartialEq, Eq)]
pub struct FatalError {
    pub message: String,
}

impl std::fmt::Display for FatalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FatalError {}

/// The largest request accepted: far above any real one (Bazel's largest
/// recorded request is 250 KB; 100k mappings take about 5 MB), and a bound
/// on what a client that never ends a value can make the daemon buffer.
pub const MAX_REQUEST_BYTES: u64 = 256 << 20;

/// Incremental decoder of a request stream.
///
/// Iterating yields one item per JSON value: `Ok` for a request (valid or
/// not), `Err` once for a fatal error, then nothing more.
pub struct RequestReader<R: Read> {
    framer: Framer<R>,
    finished: bool,
}

impl<R: Read> RequestReader<R> {
    pub fn new(input: R) -> Self {
        Self::with_limit(input, MAX_REQUEST_BYTES)
    }

    /// A decoder that refuses requests of more than `limit` bytes.
    pub fn with_limit(input: R, limit: u64) -> Self {
        RequestReader {
            framer: Framer::new(input, limit),
            finished: false,
        }
    }
}

/// One value of the stream, for [`RequestReader::next_with`]: taken by the
/// caller's fast path, or typed by the reference decoder.
#[derive(Debug, PartialEq, Eq)]
pub enum Typed<T> {
    Fast(T),
    Reference(Decoded),
}

impl<R: Read> RequestReader<R> {
    /// The next value: what `fast` makes of its bytes (see
    /// [`crate::inplace`]), or, where `fast` gives `None`, what the
    /// reference decoder makes of it, exactly as `next` does. Framing
    /// errors are answered or fatal as for `next`.
    pub fn next_with<T>(
        &mut self,
        fast: impl FnOnce(&[u8]) -> Option<T>,
    ) -> Option<Result<Typed<T>, FatalError>> {
        if self.finished {
            return None;
        }
        let item = match self.framer.next_value() {
            Ok(None) => return None,
            Ok(Some(value)) => match fast(value) {
                Some(done) => Ok(Typed::Fast(done)),
                None => {
                    let decoded = decode_value(value);
                    let syntax = match &decoded {
                        Ok(Decoded::Invalid { message, .. }) if message.starts_with(MALFORMED) => {
                            serde_json::from_slice::<serde::de::IgnoredAny>(value).err()
                        }
                        _ => None,
                    };
                    let len = value.len();
                    match syntax {
                        Some(err) => {
                            let place = self.framer.position_of_last(len);
                            located(decoded, err, place).map(Typed::Reference)
                        }
                        None => decoded.map(Typed::Reference),
                    }
                }
            },
            Err(FrameError::Broken(broken)) => Ok(Typed::Reference(Decoded::Invalid {
                id: broken.id.clone(),
                message: format!("{MALFORMED} at {broken}; skipped to the next request"),
            })),
            Err(err) => Err(FatalError {
                message: match err {
                    FrameError::Truncated => format!("truncated request: {err}"),
                    FrameError::Io(_) => format!("cannot read requests: {err}"),
                    FrameError::TooLarge { .. } | FrameError::Broken(_) => {
                        format!("malformed request stream: {err}")
                    }
                },
            }),
        };
        if item.is_err() {
            self.finished = true;
        }
        Some(item)
    }
}

/// A reference decoding whose syntax error (`err`, placed by serde_json
/// within the value) is placed in the stream instead: the value's last
/// byte is at `(line, column)` of the input.
fn located(
    decoded: Result<Decoded, FatalError>,
    err: serde_json::Error,
    (line, column): (u64, u64),
) -> Result<Decoded, FatalError> {
    match decoded {
        Ok(Decoded::Invalid { id, .. }) => {
            let column = if err.line() <= 1 {
                column + err.column() as u64 - 1
            } else {
                err.column() as u64
            };
            let line = line + err.line().max(1) as u64 - 1;
            let text = err.to_string();
            let text = text.split(" at line ").next().unwrap_or(&text);
            Ok(Decoded::Invalid {
                id,
                message: format!("{MALFORMED} at line {line}, column {column}: {text}"),
            })
        }
        other => other,
    }
}

impl<R: Read> Iterator for RequestReader<R> {
    type Item = Result<Decoded, FatalError>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.next_with(|_| None::<std::convert::Infallible>)?;
        Some(item.map(|typed| match typed {
            Typed::Reference(decoded) => decoded,
            Typed::Fast(never) => match never {},
        }))
    }
}

/// How every message about broken JSON begins.
const MALFORMED: &str = "malformed request";

/// Types one complete JSON value as a request.
pub fn decode_value(json: &[u8]) -> Result<Decoded, FatalError> {
    match serde_json::from_slice::<Request>(json) {
        Ok(request) => Ok(Decoded::Request(request)),
        // Which kind of failure it was is only known by parsing again,
        // untyped: serde_json reports a non-object as a syntax error.
        Err(err) => match serde_json::from_slice::<serde::de::IgnoredAny>(json) {
            Err(syntax) => Ok(Decoded::Invalid {
                id: crate::frame::id_named_in(json),
                message: format!("{MALFORMED}: {syntax}"),
            }),
            Ok(_) => Ok(invalid_request(json, err)),
        },
    }
}

/// A well-formed value that is not a request: answered for the sandbox it
/// names, or for none.
fn invalid_request(json: &[u8], err: serde_json::Error) -> Decoded {
    match named_id(json) {
        Some(id) => Decoded::Invalid {
            id: Some(id),
            message: format!("invalid request: {err}"),
        },
        None => Decoded::Invalid {
            id: None,
            message: format!("invalid request that names no sandbox id: {err}"),
        },
    }
}

/// Finds the sandbox id in a value that failed to type as a request, so the
/// error can be answered to the action that caused it.
fn named_id(json: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(json).ok()?;
    let object = value.as_object()?;
    if object.len() != 1 {
        return None;
    }
    let (tag, body) = object.iter().next()?;
    match tag.as_str() {
        "C" | "CreateSandbox" => {
            let body = body.as_object()?;
            body.get("i")
                .or_else(|| body.get("id"))?
                .as_str()
                .map(str::to_owned)
        }
        "D" | "DestroySandbox" => body.as_str().map(str::to_owned),
        _ => None,
    }
}

/// Encodes one response as a single line, newline included.
pub fn encode_response(response: &Response) -> String {
    let mut line = serde_json::to_string(response).expect("a response always serializes");
    line.push('\n');
    line
}

/// Encodes one request exactly as Bazel would write it (no separator).
pub fn encode_request(request: &Request) -> String {
    serde_json::to_string(request).expect("a request always serializes")
}

/// Writes responses, one line each, flushing every line so the reader sees
/// it at once.
pub struct ResponseWriter<W: Write> {
    output: W,
}

impl<W: Write> ResponseWriter<W> {
    pub fn new(output: W) -> Self {
        ResponseWriter { output }
    }

    pub fn write(&mut self, response: &Response) -> io::Result<()> {
        self.output
            .write_all(encode_response(response).as_bytes())?;
        self.output.flush()
    }
}

/// Reads responses (any whitespace between them) from a daemon's output.
pub struct ResponseReader<R: Read> {
    values: serde_json::StreamDeserializer<'static, serde_json::de::IoRead<R>, Response>,
}

impl<R: BufRead> ResponseReader<R> {
    pub fn new(input: R) -> Self {
        ResponseReader {
            values: serde_json::Deserializer::from_reader(input).into_iter(),
        }
    }
}

impl<R: BufRead> Iterator for ResponseReader<R> {
    type Item = io::Result<Response>;

    fn next(&mut self) -> Option<Self::Item> {
        self.values.next().map(|r| r.map_err(io::Error::from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{CreateSandbox, Mapping};

    fn decode_all(input: &str) -> Vec<Result<Decoded, FatalError>> {
        RequestReader::new(input.as_bytes()).collect()
    }

    #[test]
    fn concatenated_requests_without_separator() {
        let items = decode_all(r#"{"C":{"i":"empty","m":[]}}{"D":"13"}"#);
        assert_eq!(
            items,
            vec![
                Ok(Decoded::Request(Request::Create(CreateSandbox {
                    id: "empty".into(),
                    ..Default::default()
                }))),
                Ok(Decoded::Request(Request::Destroy("13".into()))),
            ]
        );
    }

    #[test]
    fn long_names_are_aliases_and_defaults_apply() {
        let items = decode_all(
            r#" {"CreateSandbox":{"id":"a","mappings":[{"path":"/x","underlying_path":"/u",
                "writable":true}],"prefixes":{"3":"/p"}}}
                {"DestroySandbox":"a"} "#,
        );
        let Ok(Decoded::Request(Request::Create(create))) = &items[0] else {
            panic!("not a create: {items:?}");
        };
        assert_eq!(
            create.mappings,
            vec![Mapping {
                path_prefix: 0,
                path: "/x".into(),
                underlying_path_prefix: 0,
                underlying_path: "/u".into(),
                writable: true,
            }]
        );
        assert_eq!(create.prefixes.get(&3).map(String::as_str), Some("/p"));
        assert_eq!(items[1], Ok(Decoded::Request(Request::Destroy("a".into()))));
    }

    #[test]
    fn wrong_type_with_an_id_is_answered_and_reading_goes_on() {
        let items = decode_all(r#"{"C":{"i":"s1","m":5}}{"D":"s2"}"#);
        match &items[0] {
            Ok(Decoded::Invalid { id, message }) => {
                assert_eq!(id.as_deref(), Some("s1"));
                assert!(message.contains("invalid type"), "{message}");
            }
            other => panic!("expected an invalid request, got {other:?}"),
        }
        assert_eq!(
            items[1],
            Ok(Decoded::Request(Request::Destroy("s2".into())))
        );
    }

    #[test]
    fn unknown_key_is_answered_with_an_error() {
        let items = decode_all(r#"{"C":{"i":"s1","m":[],"z":1}}"#);
        assert!(
            matches!(&items[0], Ok(Decoded::Invalid { id: Some(id), message })
                if id == "s1" && message.contains("unknown field")),
            "{items:?}"
        );
    }

    /// The message and id of an item that must be an invalid request.
    fn invalid(item: &Result<Decoded, FatalError>) -> (Option<&str>, &str) {
        match item {
            Ok(Decoded::Invalid { id, message }) => (id.as_deref(), message),
            other => panic!("expected an invalid request, got {other:?}"),
        }
    }

    #[test]
    fn a_broken_request_is_answered_for_its_id_and_the_next_one_is_read() {
        // One per line, as a person or a script writes them.
        let items = decode_all("{\"D\":\"a\"}\n{\"C\":{\"i\":\"syn\",\"m\":[}\n{\"D\":\"c\"}\n");
        assert_eq!(items.len(), 3, "{items:?}");
        let (id, message) = invalid(&items[1]);
        assert_eq!(id, Some("syn"));
        assert_eq!(
            message,
            "malformed request at line 2, column 22: expected a value or ']', found '}'; \
             skipped to the next request"
        );
        assert_eq!(items[2], Ok(Decoded::Request(Request::Destroy("c".into()))));
        // Back to back on one line, as Bazel writes them.
        let items = decode_all(r#"{"C":{"i":"b","m":[}}]{"D":"c"}{"D":"d"}"#);
        assert_eq!(items.len(), 3, "{items:?}");
        assert_eq!(invalid(&items[0]).0, Some("b"));
        assert_eq!(items[1], Ok(Decoded::Request(Request::Destroy("c".into()))));
        assert_eq!(items[2], Ok(Decoded::Request(Request::Destroy("d".into()))));
    }

    #[test]
    fn a_value_left_open_is_broken_where_the_next_request_starts() {
        for (input, column) in [
            (r#"{"C":{"i":"b","m":[{"p":"/x"}{"D":"c"}"#, 30),
            // Where the request would be a valid element of the array.
            (
                "{\"C\":{\"i\":\"b\",\"m\":[\n  { \"DestroySandbox\" : \"c\"}\n",
                3,
            ),
        ] {
            let items = decode_all(input);
            assert_eq!(items.len(), 2, "{items:?}");
            let (id, message) = invalid(&items[0]);
            assert_eq!(id, Some("b"));
            assert!(
                message.contains(&format!(
                    "column {column}: a new request begins here, before this one was closed"
                )),
                "{message}"
            );
            assert_eq!(items[1], Ok(Decoded::Request(Request::Destroy("c".into()))));
        }
    }

    #[test]
    fn broken_json_of_every_kind_is_answered_and_reading_goes_on() {
        for bad in [
            r#"{"D":}"#,
            r#"{"C":{"i":"x",]]"#,
            r#"{"C":{"i":"x","m":[,]}}"#,
            r#"{"C" {"i":"x"}}"#,
            r#"{"C":{"i":"x" "m":[]}}"#,
            r#"{"C":{"i":"x","m":[],}}"#,
            r#"{1:2}"#,
            r#"}"#,
            r#"42"#,
            r#"hello"#,
            r#""text""#,
            r#"{"C":{"i":"x","m":tru}}"#,
            r#"{"C":{"i":"a\qb"}}"#,
        ] {
            let input = format!("{bad}\n{{\"D\":\"next\"}}");
            let items = decode_all(&input);
            assert!(items.len() >= 2, "{bad}: {items:?}");
            for item in &items[..items.len() - 1] {
                let (_, message) = invalid(item);
                assert!(
                    message.starts_with("malformed request at line 1"),
                    "{bad}: {message}"
                );
            }
            assert_eq!(
                items.last().unwrap(),
                &Ok(Decoded::Request(Request::Destroy("next".into()))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_syntax_error_inside_a_balanced_value_is_placed_in_the_input() {
        let items = decode_all("{\"D\":\"a\"}\n  {\"C\":{\"i\":\"s\",\"m\":nul}}{\"D\":\"b\"}");
        assert_eq!(items.len(), 3, "{items:?}");
        let (id, message) = invalid(&items[1]);
        assert_eq!(id, Some("s"));
        assert!(
            message.starts_with("malformed request at line 2, column 24: expected ident"),
            "{message}"
        );
        assert_eq!(items[2], Ok(Decoded::Request(Request::Destroy("b".into()))));
    }

    #[test]
    fn truncated_input_is_fatal() {
        let items = decode_all(r#"{"D":"a"}{"C":{"i":"b""#);
        assert_eq!(items.len(), 2);
        assert!(items[1].as_ref().unwrap_err().message.contains("truncated"));
    }

    #[test]
    fn a_value_without_id_is_answered_for_no_sandbox() {
        let items = decode_all(r#"[1,2]{"X":1}{"D":"a"}"#);
        assert_eq!(items.len(), 3);
        for item in &items[..2] {
            let (id, message) = invalid(item);
            assert_eq!(id, None);
            assert!(message.contains("names no sandbox"), "{message}");
        }
        assert_eq!(items[2], Ok(Decoded::Request(Request::Destroy("a".into()))));
    }

    #[test]
    fn an_oversized_request_is_fatal() {
        let small = r#"{"D":"a"}"#;
        let big = format!(
            r#"{{"C":{{"i":"b","m":[{}]}}}}"#,
            vec![r#"{"p":"/x","u":"/y"}"#; 5000].join(",")
        );
        let input = format!("{small}{big}{small}");
        let items: Vec<_> = RequestReader::with_limit(input.as_bytes(), 64 * 1024).collect();
        assert_eq!(items.len(), 2, "{items:?}");
        assert!(items[0].is_ok());
        let err = items[1].as_ref().unwrap_err();
        assert!(
            err.message.contains("larger than 65536 bytes"),
            "{}",
            err.message
        );
        // Under the limit, the same request passes.
        let items: Vec<_> = RequestReader::with_limit(input.as_bytes(), 1 << 20).collect();
        assert!(items.iter().all(Result::is_ok) && items.len() == 3);
    }

    #[test]
    fn request_round_trips_through_the_encoder() {
        let request = Request::Create(CreateSandbox {
            id: "7".into(),
            mappings: vec![Mapping {
                path_prefix: 1,
                path: "a".into(),
                underlying_path_prefix: 2,
                underlying_path: "b".into(),
                writable: false,
            }],
            prefixes: [(1, "/".to_string()), (2, "/src".to_string())].into(),
        });
        let wire = encode_request(&request);
        assert_eq!(
            wire,
            r#"{"C":{"i":"7","m":[{"x":1,"p":"a","y":2,"u":"b"}],"q":{"1":"/","2":"/src"}}}"#
        );
        assert_eq!(decode_all(&wire), vec![Ok(Decoded::Request(request))]);
    }

    #[test]
    fn responses_are_single_lines() {
        assert_eq!(
            encode_response(&Response::ok("a")),
            "{\"id\":\"a\",\"error\":null}\n"
        );
        assert_eq!(
            encode_response(&Response::fatal("bad \"x\"")),
            "{\"id\":null,\"error\":\"bad \\\"x\\\"\"}\n"
        );
    }
}
