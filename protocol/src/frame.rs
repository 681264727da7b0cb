//! Cutting a byte stream into top-level JSON values.
//!
//! Requests arrive back to back with no separator, and a value must be
//! handed out as soon as its closing bracket arrives. The framer reads
//! whatever the stream has and scans it for the end of the value, checking
//! its structure on the way (brackets, keys, colons, commas; strings with
//! their escapes), so that a broken value is reported at the byte where it
//! breaks instead of swallowing the requests after it. Checking the
//! scalars and typing the value is the parser's job, done afterwards on the
//! whole slice at once, which is several times faster than parsing from
//! the stream a byte at a time.
//!
//! After a broken value the framer skips to where the next request can
//! start: past the end of the line, or to an object that opens with a
//! request key (`{"C":`, `{"D":` or their long names), whichever comes
//! first. Since no request holds another, such an object inside a value
//! also ends a value that was left open. Bazel writes requests back to back on one line, people and
//! scripts one per line; both resume at the next request.
//!
//! Every top-level value must be an object or an array (requests are
//! objects); a value longer than the limit is a fatal error.

use std::io::{self, Read};

/// Why no value could be framed.
#[derive(Debug)]
pub enum FrameError {
    /// The stream ended inside a value.
    Truncated,
    /// The current value is longer than the limit.
    TooLarge {
        limit: u64,
    },
    Io(io::Error),
    /// The value broke its JSON structure; the framer skips past it and the
    /// next call frames the value after it.
    Broken(Broken),
}

impl FrameError {
    /// Whether framing can go on after this error.
    pub fn is_recoverable(&self) -> bool {
        matches!(self, FrameError::Broken(_))
    }
}

/// A value whose structure is broken, as found by the framer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// The sandbox id the value named before it broke, if any.
    pub id: Option<String>,
    /// Line (from 1) and column (from 1, in bytes) of the offending byte.
    pub line: u64,
    pub column: u64,
    /// What was wrong there.
    pub what: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line {}, column {}: {}",
            self.line, self.column, self.what
        )
    }
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Truncated => f.write_str("input ended inside a JSON value"),
            FrameError::TooLarge { limit } => {
                write!(f, "a request is larger than {limit} bytes")
            }
            FrameError::Io(err) => write!(f, "read: {err}"),
            FrameError::Broken(broken) => broken.fmt(f),
        }
    }
}

/// Deepest nesting accepted; serde_json refuses deeper values anyway, and a
/// request nests four levels.
pub const MAX_DEPTH: usize = 128;

/// What may come next outside a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// After `:` or `,` in an array.
    Value,
    /// After `[`.
    ValueOrClose,
    /// After `,` in an object.
    Key,
    /// After `{`.
    KeyOrClose,
    /// After a key.
    Colon,
    /// After a value inside a container.
    CommaOrClose,
}

/// Where the scan of the current value stands.
struct Scan {
    /// Bytes of the buffer already scanned (from the value's start).
    scanned: usize,
    /// Open containers, `{` or `[`.
    stack: Vec<u8>,
    expect: Expect,
    in_string: bool,
    escaped: bool,
    /// Inside a number or a literal (`true`, `null`...), whose spelling
    /// the parser checks.
    in_scalar: bool,
}

impl Scan {
    fn new() -> Scan {
        Scan {
            scanned: 0,
            stack: Vec::with_capacity(8),
            expect: Expect::Value,
            in_string: false,
            escaped: false,
            in_scalar: false,
        }
    }

    /// Ready for a new value, keeping the stack's memory.
    fn reset(&mut self) {
        self.scanned = 0;
        self.stack.clear();
        self.expect = Expect::Value;
        self.in_string = false;
        self.escaped = false;
        self.in_scalar = false;
    }
}

/// Frames values read from `R`.
pub struct Framer<R> {
    input: R,
    buf: Vec<u8>,
    /// Start of the unconsumed bytes in `buf`.
    start: usize,
    /// Stream offset of `buf[0]`, for messages.
    offset: u64,
    /// Line ends before `buf[0]`, for messages.
    lines: u64,
    /// Stream offset just past the last line end before `buf[0]`.
    line_start: u64,
    limit: u64,
    eof: bool,
    /// A broken value was reported: skip to the next request first.
    resync: bool,
    scan: Scan,
}

const READ_SIZE: usize = 64 * 1024;

/// Longest run of bytes looked at to tell whether a `{` opens a request.
const REQUEST_START_WINDOW: usize = 64;

impl<R: Read> Framer<R> {
    pub fn new(input: R, limit: u64) -> Self {
        Framer {
            input,
            buf: Vec::with_capacity(READ_SIZE),
            start: 0,
            offset: 0,
            lines: 0,
            line_start: 0,
            limit,
            eof: false,
            resync: false,
            scan: Scan::new(),
        }
    }

    /// The next value's bytes, or `None` at the end of the stream (only
    /// whitespace left). After [`FrameError::Broken`] it can be called
    /// again; after any other error it must not.
    pub fn next_value(&mut self) -> Result<Option<&[u8]>, FrameError> {
        if self.resync {
            if !self.skip_to_next_request()? {
                return Ok(None);
            }
            self.resync = false;
        }
        // Skip whitespace, reading as needed.
        loop {
            let pending = &self.buf[self.start..];
            match pending.iter().position(|b| !b.is_ascii_whitespace()) {
                Some(skip) => {
                    self.start += skip;
                    break;
                }
                None => {
                    self.start = self.buf.len();
                    if !self.fill()? {
                        return Ok(None);
                    }
                }
            }
        }
        self.scan.reset();
        loop {
            match scan_value(&self.buf[self.start..], &mut self.scan, self.eof) {
                Ok(Some(len)) => {
                    if len as u64 > self.limit {
                        return Err(FrameError::TooLarge { limit: self.limit });
                    }
                    let value = self.start..self.start + len;
                    self.start += len;
                    return Ok(Some(&self.buf[value]));
                }
                Ok(None) => {}
                Err(what) => return Err(FrameError::Broken(self.broken(self.scan.scanned, what))),
            }
            if (self.buf.len() - self.start) as u64 > self.limit {
                return Err(FrameError::TooLarge { limit: self.limit });
            }
            if !self.fill()? {
                return Err(FrameError::Truncated);
            }
        }
    }

    /// Describes the value starting at `self.start` that broke at its byte
    /// `at - 1`, and arranges for the next call to skip past it.
    fn broken(&mut self, at: usize, what: String) -> Broken {
        let value = &self.buf[self.start..self.start + at];
        let id = id_named_in(&value[..at - 1]);
        let bad = self.start + at - 1;
        let (line, column) = self.position(bad);
        // Resuming looks at the bad byte itself: a `{` opening a request
        // after a value left open is that request. (A value never breaks
        // at its first `{`, so this cannot loop.)
        self.start = bad;
        self.resync = true;
        Broken {
            id,
            line,
            column,
            what,
        }
    }

    /// Line and column (both from 1) where the value just handed out,
    /// `len` bytes long, started.
    pub fn position_of_last(&self, len: usize) -> (u64, u64) {
        self.position(self.start - len)
    }

    /// Line and column (both from 1) of `buf[at]`.
    fn position(&self, at: usize) -> (u64, u64) {
        let before = &self.buf[..at];
        let newlines = before.iter().filter(|&&b| b == b'\n').count() as u64;
        let line_start = match before.iter().rposition(|&b| b == b'\n') {
            Some(nl) => self.offset + nl as u64 + 1,
            None => self.line_start,
        };
        (
            self.lines + newlines + 1,
            self.offset + at as u64 - line_start + 1,
        )
    }

    /// Skips to just past the next line end, or to the next `{` that opens
    /// a request, whichever comes first. False at the end of the stream.
    fn skip_to_next_request(&mut self) -> Result<bool, FrameError> {
        loop {
            let pending = &self.buf[self.start..];
            let mut undecided = None;
            for (i, &byte) in pending.iter().enumerate() {
                if byte == b'\n' {
                    self.start += i + 1;
                    return Ok(true);
                }
                if byte == b'{' {
                    match opens_request(&pending[i..]) {
                        Some(true) => {
                            self.start += i;
                            return Ok(true);
                        }
                        Some(false) => {}
                        None if self.eof => {}
                        None => {
                            undecided = Some(i);
                            break;
                        }
                    }
                }
            }
            match undecided {
                // Keep the undecided `{` and read on to decide it.
                Some(i) => self.start += i,
                None => self.start = self.buf.len(),
            }
            if !self.fill()? {
                return Ok(false);
            }
        }
    }

    /// Reads more bytes; false at the end of the stream.
    fn fill(&mut self) -> Result<bool, FrameError> {
        if self.eof {
            return Ok(false);
        }
        // Drop consumed bytes first, so the buffer holds one value at most
        // (plus what was read beyond it).
        if self.start > 0 {
            let dropped = &self.buf[..self.start];
            self.lines += dropped.iter().filter(|&&b| b == b'\n').count() as u64;
            if let Some(nl) = dropped.iter().rposition(|&b| b == b'\n') {
                self.line_start = self.offset + nl as u64 + 1;
            }
            self.buf.drain(..self.start);
            self.offset += self.start as u64;
            self.start = 0;
        }
        let filled = self.buf.len();
        self.buf.resize(filled + READ_SIZE, 0);
        let read = loop {
            match self.input.read(&mut self.buf[filled..]) {
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        match read {
            Ok(n) => {
                self.buf.truncate(filled + n);
                self.eof = n == 0;
                Ok(n > 0)
            }
            Err(err) => {
                self.buf.truncate(filled);
                Err(FrameError::Io(err))
            }
        }
    }
}

/// Whether `bytes`, starting with `{`, open a request: `{`, a request key
/// (`"C"`, `"D"`, `"CreateSandbox"`, `"DestroySandbox"`) and `:`, with any
/// whitespace between. `None` if `bytes` end before that can be told.
fn opens_request(bytes: &[u8]) -> Option<bool> {
    let mut rest = &bytes[1..];
    let skip_space = |rest: &mut &[u8]| {
        let n = rest.iter().take_while(|b| b.is_ascii_whitespace()).count();
        *rest = &rest[n..];
    };
    skip_space(&mut rest);
    if rest.is_empty() {
        return (bytes.len() >= REQUEST_START_WINDOW).then_some(false);
    }
    if rest[0] != b'"' {
        return Some(false);
    }
    let key_end = match rest[1..].iter().position(|&b| b == b'"') {
        Some(end) => end + 1,
        None if rest.len() > 16 => return Some(false),
        None => return None,
    };
    let key = &rest[1..key_end];
    if !matches!(key, b"C" | b"D" | b"CreateSandbox" | b"DestroySandbox") {
        return Some(false);
    }
    rest = &rest[key_end + 1..];
    skip_space(&mut rest);
    match rest.first() {
        Some(&b) => Some(b == b':'),
        None if bytes.len() >= REQUEST_START_WINDOW => Some(false),
        None => None,
    }
}

/// Scans `bytes` (a value's start onwards) from where `scan` stopped;
/// returns the value's length once its closing bracket is in `bytes`, or
/// what is wrong with the byte just before `scan.scanned`. `at_eof`: no
/// more bytes will come.
fn scan_value(bytes: &[u8], scan: &mut Scan, at_eof: bool) -> Result<Option<usize>, String> {
    let mut at = scan.scanned;
    while at < bytes.len() {
        if scan.in_string {
            // Most of a request is strings: jump to the next quote or
            // backslash.
            if scan.escaped {
                scan.escaped = false;
                at += 1;
                continue;
            }
            match string_end_or_escape(&bytes[at..]) {
                Some(i) => {
                    at += i + 1;
                    if bytes[at - 1] == b'\\' {
                        scan.escaped = true;
                    } else {
                        scan.in_string = false;
                    }
                }
                None => at = bytes.len(),
            }
            continue;
        }
        let byte = bytes[at];
        at += 1;
        if byte.is_ascii_whitespace() {
            scan.in_scalar = false;
            continue;
        }
        if scan.in_scalar && is_scalar_byte(byte) {
            continue;
        }
        scan.in_scalar = false;
        if scan.stack.is_empty() && byte != b'{' && byte != b'[' {
            scan.scanned = at;
            return Err(format!("expected '{{' (a request), found {}", shown(byte)));
        }
        let expect = scan.expect;
        let wrong = |scan: &mut Scan| {
            scan.scanned = at;
            let in_object = scan.stack.last() == Some(&b'{');
            Err(format!(
                "expected {}, found {}",
                expected(expect, in_object),
                shown(byte)
            ))
        };
        match byte {
            b'"' => {
                scan.in_string = true;
                scan.expect = match expect {
                    Expect::Value | Expect::ValueOrClose => Expect::CommaOrClose,
                    Expect::Key | Expect::KeyOrClose => Expect::Colon,
                    _ => return wrong(scan),
                };
            }
            b'{' | b'[' => {
                // No request holds another: a request's opening inside a
                // value means that value was left open.
                if byte == b'{' && !scan.stack.is_empty() {
                    match opens_request(&bytes[at - 1..]) {
                        Some(true) => {
                            scan.scanned = at;
                            return Err(
                                "a new request begins here, before this one was closed".into()
                            );
                        }
                        // Look again once more bytes are in.
                        None if !at_eof => {
                            scan.scanned = at - 1;
                            return Ok(None);
                        }
                        _ => {}
                    }
                }
                if !matches!(expect, Expect::Value | Expect::ValueOrClose) {
                    return wrong(scan);
                }
                if scan.stack.len() == MAX_DEPTH {
                    scan.scanned = at;
                    return Err(format!("nested deeper than {MAX_DEPTH} levels"));
                }
                scan.stack.push(byte);
                scan.expect = if byte == b'{' {
                    Expect::KeyOrClose
                } else {
                    Expect::ValueOrClose
                };
            }
            b'}' | b']' => {
                let opener = if byte == b'}' { b'{' } else { b'[' };
                let may_close = match expect {
                    Expect::CommaOrClose => true,
                    Expect::KeyOrClose => byte == b'}',
                    Expect::ValueOrClose => byte == b']',
                    _ => false,
                };
                if !may_close || scan.stack.last() != Some(&opener) {
                    return wrong(scan);
                }
                scan.stack.pop();
                if scan.stack.is_empty() {
                    return Ok(Some(at));
                }
                scan.expect = Expect::CommaOrClose;
            }
            b':' if expect == Expect::Colon => scan.expect = Expect::Value,
            b',' if expect == Expect::CommaOrClose => {
                scan.expect = if scan.stack.last() == Some(&b'{') {
                    Expect::Key
                } else {
                    Expect::Value
                };
            }
            _ if is_scalar_byte(byte) && matches!(expect, Expect::Value | Expect::ValueOrClose) => {
                scan.in_scalar = true;
                scan.expect = Expect::CommaOrClose;
            }
            _ => return wrong(scan),
        }
    }
    scan.scanned = at;
    Ok(None)
}

/// Index of the first `"` or `\\` in `bytes`. Strings are most of a
/// request, so this looks at eight bytes per step.
fn string_end_or_escape(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const QUOTES: u64 = u64::from_ne_bytes([b'"'; 8]);
    const BACKSLASHES: u64 = u64::from_ne_bytes([b'\\'; 8]);
    // Nonzero if a byte of `x` is zero (the classic bit trick; it can only
    // miss nothing, and the byte loop below finds the exact place).
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let mut at = 0;
    while at + 8 <= bytes.len() {
        let word = u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("eight bytes"));
        if has_zero(word ^ QUOTES) | has_zero(word ^ BACKSLASHES) != 0 {
            break;
        }
        at += 8;
    }
    bytes[at..]
        .iter()
        .position(|&b| b == b'"' || b == b'\\')
        .map(|i| at + i)
}

/// Bytes of numbers and of `true`, `false` and `null`.
fn is_scalar_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'+' | b'-' | b'.')
}

fn expected(expect: Expect, in_object: bool) -> &'static str {
    match expect {
        Expect::Value => "a value",
        Expect::ValueOrClose => "a value or ']'",
        Expect::Key => "a key (a string)",
        Expect::KeyOrClose => "a key (a string) or '}'",
        Expect::Colon => "':'",
        Expect::CommaOrClose if in_object => "',' or '}'",
        Expect::CommaOrClose => "',' or ']'",
    }
}

fn shown(byte: u8) -> String {
    if byte.is_ascii_graphic() {
        format!("'{}'", char::from(byte))
    } else {
        format!("byte 0x{byte:02x}")
    }
}

/// The sandbox id that the (possibly broken or cut short) value `bytes`
/// names: the string at `C.i` (or a long name of either) or the string of
/// `D`, if it comes before the break. The value's structure must be sound
/// up to its end, as the framer checked.
pub fn id_named_in(bytes: &[u8]) -> Option<String> {
    // Containers open so far, and the key each object is at, for the
    // first two levels.
    let mut stack: Vec<u8> = Vec::new();
    let mut keys: [&[u8]; 2] = [b"", b""];
    let mut previous = 0u8;
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        match byte {
            b'"' => {
                let start = at;
                at += 1;
                let mut escaped = false;
                while at < bytes.len() && (escaped || bytes[at] != b'"') {
                    escaped = !escaped && bytes[at] == b'\\';
                    at += 1;
                }
                if at >= bytes.len() {
                    return None;
                }
                let token = &bytes[start..=at];
                let depth = stack.len();
                let is_key = stack.last() == Some(&b'{') && matches!(previous, b'{' | b',');
                if is_key {
                    if (1..=2).contains(&depth) {
                        keys[depth - 1] = &token[1..token.len() - 1];
                    }
                } else if previous == b':' {
                    let names_id = match (depth, keys[0]) {
                        (1, b"D" | b"DestroySandbox") => true,
                        (2, b"C" | b"CreateSandbox") => matches!(keys[1], b"i" | b"id"),
                        _ => false,
                    };
                    if names_id {
                        return serde_json::from_slice(token).ok();
                    }
                }
                previous = b'"';
            }
            b'{' | b'[' => {
                stack.push(byte);
                previous = byte;
            }
            b'}' | b']' => {
                stack.pop();
                previous = byte;
            }
            b':' | b',' => previous = byte,
            _ if byte.is_ascii_whitespace() => {}
            _ => previous = b'0',
        }
        at += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out one byte per read, as a slow pipe might.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.0.split_first() {
                Some((&byte, rest)) if !buf.is_empty() => {
                    buf[0] = byte;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    fn frames(input: &[u8], trickle: bool) -> (Vec<String>, Option<String>) {
        let mut values = Vec::new();
        let mut check = |framer: &mut dyn FnMut() -> Result<Option<Vec<u8>>, FrameError>| loop {
            match framer() {
                Ok(Some(value)) => values.push(String::from_utf8(value).unwrap()),
                Ok(None) => return None,
                Err(err) => return Some(err.to_string()),
            }
        };
        let error = if trickle {
            let mut framer = Framer::new(Trickle(input), 1 << 20);
            check(&mut || framer.next_value().map(|v| v.map(<[u8]>::to_vec)))
        } else {
            let mut framer = Framer::new(input, 1 << 20);
            check(&mut || framer.next_value().map(|v| v.map(<[u8]>::to_vec)))
        };
        (values, error)
    }

    #[test]
    fn values_back_to_back_with_brackets_and_escapes_in_strings() {
        let input = br#" {"D":"a"}{"C":{"i":"}{\"[","m":[{"p":"/x\\"}]}}
            [1,{"a":[]}] "#;
        for trickle in [false, true] {
            let (values, error) = frames(input, trickle);
            assert_eq!(
                values,
                [
                    r#"{"D":"a"}"#,
                    r#"{"C":{"i":"}{\"[","m":[{"p":"/x\\"}]}}"#,
                    r#"[1,{"a":[]}]"#
                ]
            );
            assert_eq!(error, None);
        }
    }

    /// Every value framed from `input`, and where each broken one broke,
    /// reading on after them.
    fn resumed(input: &[u8], trickle: bool) -> Vec<String> {
        let mut items = Vec::new();
        let mut step = |item: Result<Option<&[u8]>, FrameError>| match item {
            Ok(Some(value)) => {
                items.push(String::from_utf8(value.to_vec()).unwrap());
                true
            }
            Ok(None) => false,
            Err(FrameError::Broken(b)) => {
                items.push(format!("broken at {}:{} ({:?})", b.line, b.column, b.id));
                true
            }
            Err(err) => panic!("{err}"),
        };
        if trickle {
            let mut framer = Framer::new(Trickle(input), 1 << 20);
            while step(framer.next_value()) {}
        } else {
            let mut framer = Framer::new(input, 1 << 20);
            while step(framer.next_value()) {}
        }
        items
    }

    #[test]
    fn after_a_broken_value_framing_resumes_at_the_next_request_or_line() {
        let input = b"{\"C\":{\"i\":\"a\",\"m\":[}} junk {\"p\":1} {\"D\":\"b\"}\n\
                      {\"C\" oops {\"i\": 1}\n{ \"D\" :\n \"c\"}";
        for trickle in [false, true] {
            assert_eq!(
                resumed(input, trickle),
                [
                    r#"broken at 1:20 (Some("a"))"#,
                    r#"{"D":"b"}"#,
                    "broken at 2:6 (None)",
                    "{ \"D\" :\n \"c\"}",
                ],
                "trickle: {trickle}"
            );
        }
    }

    #[test]
    fn a_request_inside_a_value_ends_the_value_left_open_even_byte_by_byte() {
        let input = b"{\"C\":{\"i\":\"a\",\"m\":[{\"p\":\"/x\"},\n{\"D\":\"b\"}\n[{\"q\":1}]";
        for trickle in [false, true] {
            assert_eq!(
                resumed(input, trickle),
                [
                    r#"broken at 2:1 (Some("a"))"#,
                    r#"{"D":"b"}"#,
                    r#"[{"q":1}]"#
                ],
                "trickle: {trickle}"
            );
        }
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_broken_not_a_crash() {
        let deep = [
            b"{\"D\":".to_vec(),
            vec![b'['; 100_000],
            b"\n{\"D\":\"x\"}".to_vec(),
        ]
        .concat();
        assert_eq!(
            resumed(&deep, false),
            ["broken at 1:133 (None)", r#"{"D":"x"}"#]
        );
    }

    #[test]
    fn a_value_is_handed_out_before_the_next_byte_arrives() {
        // A reader that would block (here: fail) after the first value.
        struct Then<'a>(&'a [u8], bool);
        impl Read for Then<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.1 {
                    return Err(io::Error::other("would block"));
                }
                self.1 = true;
                buf[..self.0.len()].copy_from_slice(self.0);
                Ok(self.0.len())
            }
        }
        let mut framer = Framer::new(Then(br#"{"D":"a"}"#, false), 1 << 20);
        assert_eq!(framer.next_value().unwrap(), Some(&br#"{"D":"a"}"#[..]));
    }

    #[test]
    fn truncation_scalars_and_oversized_values_are_errors() {
        let (values, error) = frames(br#"{"D":"a"}{"C":{"i":"b""#, true);
        assert_eq!(values.len(), 1);
        assert_eq!(error.unwrap(), "input ended inside a JSON value");
        let (_, error) = frames(br#"{"D":"a"} 42"#, false);
        assert_eq!(
            error.unwrap(),
            "line 1, column 11: expected '{' (a request), found '4'"
        );
        let big = format!(r#"{{"m":"{}"}}"#, "x".repeat(300_000));
        let mut framer = Framer::new(big.as_bytes(), 100_000);
        assert!(matches!(
            framer.next_value(),
            Err(FrameError::TooLarge { limit: 100_000 })
        ));
    }
}
