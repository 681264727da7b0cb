//! Decoding a request in place: strings borrowed from the request's bytes,
//! each mapping resolved and handed to the caller as soon as it is read.
//!
//! [`crate::decode_value`] builds the whole request (a `String` per path,
//! a `Vec` of every mapping) and then the caller resolves it into another
//! `Vec`: three copies of a request's mappings before the first is used.
//! Here a mapping is resolved into two reused buffers and given to a
//! [`MappingSink`]; nothing is kept per mapping.
//!
//! Bazel writes a create's new prefixes (`q`) after its mappings (`m`), so
//! a create is read twice: once to find `i` and `q` (skipping `m` by its
//! brackets), then `m` mapping by mapping. The grammar accepted is a
//! strict subset of what `decode_value` accepts (JSON, one-letter keys or
//! their aliases, each key at most once); for anything else, and for every
//! malformed or ill-typed request, the answer is [`InPlace::Fallback`] and
//! the caller decodes the value with `decode_value`, the reference, which
//! gives its exact answer. So this path changes speed, never an answer.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::resolve::{join_into, resolve_path_into, PrefixTable, ResolveError};
use crate::types::PrefixId;

/// Where a create's resolved mappings go, in request order.
pub trait MappingSink {
    /// Mapping number `index`: sandbox path `path` (`/` or `/a/b`,
    /// validated, no trailing `/`) to the absolute `underlying` path.
    fn mapping(&mut self, index: usize, path: &str, underlying: &str, writable: bool);
}

/// What a request decoded in place is.
pub enum InPlace<'a, S> {
    /// A valid create of `id`: its prefixes are registered and every
    /// mapping went to `sink`.
    Create {
        id: Cow<'a, str>,
        sink: S,
    },
    Destroy(Cow<'a, str>),
    /// A well-formed create whose prefixes cannot be registered or whose
    /// mappings cannot be resolved; `message` is its answer. Its prefixes
    /// are registered where the protocol says so.
    Refused {
        id: String,
        message: String,
    },
    /// Not decoded here: decode it with `decode_value`. Nothing was
    /// registered.
    Fallback,
}

/// Decodes `json` (one complete value) in place. Mappings go to the sink
/// `new_sink` makes for the sandbox id, once the id is known.
pub fn decode_in_place<'a, S: MappingSink>(
    json: &'a [u8],
    prefixes: &mut PrefixTable,
    new_sink: impl FnOnce(&str) -> S,
) -> InPlace<'a, S> {
    decode(json, prefixes, new_sink).unwrap_or(InPlace::Fallback)
}

/// Something this decoder leaves to `decode_value`.
struct Bail;

type Parsed<T> = Result<T, Bail>;

fn decode<'a, S: MappingSink>(
    json: &'a [u8],
    prefixes: &mut PrefixTable,
    new_sink: impl FnOnce(&str) -> S,
) -> Parsed<InPlace<'a, S>> {
    let mut p = Parser { bytes: json, at: 0 };
    p.ws();
    p.eat(b'{')?;
    p.ws();
    let tag = p.string()?;
    p.ws();
    p.eat(b':')?;
    p.ws();
    let (outcome, register) = match &*tag {
        "D" | "DestroySandbox" => (InPlace::Destroy(p.string()?), Vec::new()),
        "C" | "CreateSandbox" => create(&mut p, prefixes, new_sink)?,
        _ => return Err(Bail),
    };
    p.ws();
    p.eat(b'}')?;
    p.ws();
    if p.at != json.len() {
        return Err(Bail);
    }
    // Only a request read to its end registers anything.
    let register: Vec<(PrefixId, &str)> = register.iter().map(|(k, v)| (*k, &**v)).collect();
    prefixes.insert(&register);
    Ok(outcome)
}

/// A create, and the prefixes it registers once read to its end.
type Create<'a, S> = (InPlace<'a, S>, Vec<(PrefixId, Cow<'a, str>)>);

/// The body of a create, from its `{`.
fn create<'a, S: MappingSink>(
    p: &mut Parser<'a>,
    prefixes: &PrefixTable,
    new_sink: impl FnOnce(&str) -> S,
) -> Parsed<Create<'a, S>> {
    let (mut id, mut mappings, mut new) = (None, None, None);
    p.object(|p, key| {
        match &*key {
            "i" | "id" if id.is_none() => id = Some(p.string()?),
            "m" | "mappings" if mappings.is_none() => {
                mappings = Some(p.at);
                p.skip_value()?;
            }
            "q" | "prefixes" if new.is_none() => new = Some(prefix_map(p)?),
            _ => return Err(Bail),
        }
        Ok(())
    })?;
    let id = id.ok_or(Bail)?;
    let mut new = new.unwrap_or_default();
    // Registered in id order, as a map of them would be.
    new.sort_unstable_by_key(|&(prefix, _)| prefix);
    let pending: Vec<(PrefixId, &str)> = new.iter().map(|(k, v)| (*k, &**v)).collect();
    let registration = prefixes.check_new(&pending);
    let mut sink = new_sink(&id);
    let mut refusal = registration.err();
    if let Some(at) = mappings {
        let end = p.at;
        p.at = at;
        let lookup: HashMap<PrefixId, &str> = pending.iter().copied().collect();
        let mut resolver = Resolver {
            table: prefixes,
            pending: &lookup,
            last: [None, None],
            path: String::new(),
            underlying: String::new(),
        };
        mapping_list(p, &mut resolver, &mut sink, &mut refusal)?;
        p.at = end;
    }
    // Well-formed and well-typed: it is answered as decoded, and its
    // prefixes are registered unless they cannot be.
    let register = if registration_failed(prefixes, &pending) {
        Vec::new()
    } else {
        new
    };
    if let Some(ResolveError(message)) = refusal {
        let message = format!("sandbox {id:?}: {message}");
        let refused = InPlace::Refused {
            id: id.into_owned(),
            message,
        };
        return Ok((refused, register));
    }
    Ok((InPlace::Create { id, sink }, register))
}

fn registration_failed(prefixes: &PrefixTable, new: &[(PrefixId, &str)]) -> bool {
    prefixes.check_new(new).is_err()
}

/// Resolves mappings against the registered prefixes and the request's
/// own, into buffers reused from one mapping to the next.
struct Resolver<'t> {
    table: &'t PrefixTable,
    pending: &'t HashMap<PrefixId, &'t str>,
    /// The prefix last looked up for each side: consecutive mappings
    /// mostly share theirs.
    last: [Option<(PrefixId, &'t str)>; 2],
    path: String,
    underlying: String,
}

impl<'t> Resolver<'t> {
    /// The path of prefix `id`, for side `side` (0: sandbox, 1: underlying).
    fn base(&mut self, side: usize, id: PrefixId) -> Option<&'t str> {
        if id == 0 {
            return None;
        }
        if let Some((last, base)) = self.last[side] {
            if last == id {
                return Some(base);
            }
        }
        let (pending, table) = (self.pending, self.table);
        let base = pending.get(&id).copied().or_else(|| table.get(id))?;
        self.last[side] = Some((id, base));
        Some(base)
    }
}

/// `m`: each mapping typed, then (until one fails) resolved and given to
/// `sink`. `refusal` keeps the first failure, or a failure to register
/// the request's prefixes, which makes resolving pointless.
fn mapping_list<S: MappingSink>(
    p: &mut Parser<'_>,
    resolver: &mut Resolver<'_>,
    sink: &mut S,
    refusal: &mut Option<ResolveError>,
) -> Parsed<()> {
    p.eat(b'[')?;
    p.ws();
    if p.peek() == Some(b']') {
        p.at += 1;
        return Ok(());
    }
    let mut index = 0;
    loop {
        let m = mapping(p)?;
        if refusal.is_none() {
            if let Err(err) = resolve(resolver, &m) {
                *refusal = Some(ResolveError(format!(
                    "mapping #{index} ({:?}): {err}",
                    &*m.path
                )));
            } else {
                sink.mapping(index, &resolver.path, &resolver.underlying, m.writable);
            }
        }
        index += 1;
        p.ws();
        match p.next()? {
            b',' => p.ws(),
            b']' => return Ok(()),
            _ => return Err(Bail),
        }
    }
}

fn resolve(r: &mut Resolver<'_>, m: &Mapping<'_>) -> Result<(), ResolveError> {
    let base = r.base(0, m.path_prefix);
    resolve_path_into(&mut r.path, |_| base, m.path_prefix, &m.path)?;
    let base = r.base(1, m.underlying_prefix);
    join_into(
        &mut r.underlying,
        |_| base,
        m.underlying_prefix,
        &m.underlying,
        "underlying path",
    )
}

/// One mapping as written.
struct Mapping<'a> {
    path_prefix: PrefixId,
    path: Cow<'a, str>,
    underlying_prefix: PrefixId,
    underlying: Cow<'a, str>,
    writable: bool,
}

fn mapping<'a>(p: &mut Parser<'a>) -> Parsed<Mapping<'a>> {
    let (mut x, mut path, mut y, mut underlying, mut w) = (None, None, None, None, None);
    p.object(|p, key| {
        match &*key {
            "x" | "path_prefix" if x.is_none() => x = Some(p.number()?),
            "p" | "path" if path.is_none() => path = Some(p.string()?),
            "y" | "underlying_path_prefix" if y.is_none() => y = Some(p.number()?),
            "u" | "underlying_path" if underlying.is_none() => underlying = Some(p.string()?),
            "w" | "writable" if w.is_none() => w = Some(p.boolean()?),
            _ => return Err(Bail),
        }
        Ok(())
    })?;
    Ok(Mapping {
        path_prefix: x.unwrap_or(0),
        path: path.ok_or(Bail)?,
        underlying_prefix: y.unwrap_or(0),
        underlying: underlying.ok_or(Bail)?,
        writable: w.unwrap_or(false),
    })
}

/// `q`: prefix ids (decimal, as object keys) to paths.
fn prefix_map<'a>(p: &mut Parser<'a>) -> Parsed<Vec<(PrefixId, Cow<'a, str>)>> {
    let mut map: Vec<(PrefixId, Cow<'a, str>)> = Vec::new();
    p.object(|p, key| {
        map.push((decimal(key.as_bytes())?, p.string()?));
        Ok(())
    })?;
    // A key given twice is left to the reference decoder.
    let mut ids: Vec<PrefixId> = map.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    if ids.windows(2).any(|pair| pair[0] == pair[1]) {
        return Err(Bail);
    }
    Ok(map)
}

/// A canonical decimal number (no sign, no leading zero) that fits.
fn decimal(digits: &[u8]) -> Parsed<u64> {
    if digits.is_empty() || (digits.len() > 1 && digits[0] == b'0') {
        return Err(Bail);
    }
    digits.iter().try_fold(0u64, |value, &digit| {
        if !digit.is_ascii_digit() {
            return Err(Bail);
        }
        value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(digit - b'0')))
            .ok_or(Bail)
    })
}

/// Where the first byte that ends a string's plain part is: a quote, a
/// backslash or a control character. Eight bytes at a time: paths are
/// short, too short for a vectorized search to pay its setup.
fn special_at(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte of `v` is zero: its high bit set in the result.
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let mut chunks = bytes.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let v = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        // Bytes below 0x20, or equal to '"' or '\\' (may flag bytes of
        // 0x80 and above falsely, which the exact scan below sorts out).
        let flagged = v.wrapping_sub(ONES * 0x20) & !v & HIGH
            | zero(v ^ (ONES * u64::from(b'"')))
            | zero(v ^ (ONES * u64::from(b'\\')));
        if flagged != 0 {
            if let Some(found) = chunk.iter().position(|&b| is_special(b)) {
                return Some(at + found);
            }
        }
        at += 8;
    }
    let rest = chunks.remainder();
    rest.iter()
        .position(|&b| is_special(b))
        .map(|found| at + found)
}

fn is_special(byte: u8) -> bool {
    byte == b'"' || byte == b'\\' || byte < 0x20
}

/// A cursor over a JSON value.
struct Parser<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn next(&mut self) -> Parsed<u8> {
        let byte = self.peek().ok_or(Bail)?;
        self.at += 1;
        Ok(byte)
    }

    fn eat(&mut self, byte: u8) -> Parsed<()> {
        if self.next()? == byte {
            Ok(())
        } else {
            Err(Bail)
        }
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// An object, from its `{` to its `}`: `value` is called with each
    /// key and the parser at that key's value, which it must read whole.
    /// Keys go through [`Parser::key`], which reads a key as
    /// [`Parser::string`] would.
    fn object(
        &mut self,
        mut value: impl FnMut(&mut Self, Cow<'a, str>) -> Parsed<()>,
    ) -> Parsed<()> {
        self.eat(b'{')?;
        self.ws();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        loop {
            let key = self.key()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            value(self, key)?;
            self.ws();
            match self.next()? {
                b',' => self.ws(),
                b'}' => return Ok(()),
                _ => return Err(Bail),
            }
        }
    }

    /// An object key: [`Parser::string`], with one-letter keys (every
    /// mapping has four or five) read without scanning. Inlined into
    /// [`Parser::object`]'s callers: a call per key cost a mapping 18%.
    #[inline]
    fn key(&mut self) -> Parsed<Cow<'a, str>> {
        if let [b'"', letter, b'"', ..] = self.bytes[self.at..] {
            if letter.is_ascii_lowercase() {
                self.at += 3;
                let at = self.at - 2;
                let letter = std::str::from_utf8(&self.bytes[at..at + 1]).map_err(|_| Bail)?;
                return Ok(Cow::Borrowed(letter));
            }
        }
        self.string()
    }

    /// A string, borrowed unless it has escapes.
    fn string(&mut self) -> Parsed<Cow<'a, str>> {
        self.eat(b'"')?;
        let start = self.at;
        let rest = &self.bytes[start..];
        let end = special_at(rest).ok_or(Bail)?;
        if rest[end] == b'"' {
            self.at = start + end + 1;
            return std::str::from_utf8(&rest[..end])
                .map(Cow::Borrowed)
                .map_err(|_| Bail);
        }
        if rest[end] < 0x20 {
            return Err(Bail);
        }
        let mut owned = std::str::from_utf8(&rest[..end])
            .map_err(|_| Bail)?
            .to_owned();
        self.at = start + end;
        loop {
            let byte = self.next()?;
            match byte {
                b'"' => return Ok(Cow::Owned(owned)),
                b'\\' => {
                    let escaped = match self.next()? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return Err(Bail),
                    };
                    owned.push(escaped);
                }
                0..0x20 => return Err(Bail),
                _ => {
                    // A run of plain bytes up to the next quote or escape.
                    let from = self.at - 1;
                    let len = special_at(&self.bytes[from..]).ok_or(Bail)?;
                    let run =
                        std::str::from_utf8(&self.bytes[from..from + len]).map_err(|_| Bail)?;
                    owned.push_str(run);
                    self.at = from + len;
                }
            }
        }
    }

    /// The character of a `\u` escape (after the `u`), surrogate pairs
    /// joined; a lone surrogate is left to the reference decoder.
    fn unicode_escape(&mut self) -> Parsed<char> {
        let first = self.hex4()?;
        if (0xDC00..0xE000).contains(&first) {
            return Err(Bail);
        }
        if !(0xD800..0xDC00).contains(&first) {
            return char::from_u32(first).ok_or(Bail);
        }
        self.eat(b'\\')?;
        self.eat(b'u')?;
        let second = self.hex4()?;
        if !(0xDC00..0xE000).contains(&second) {
            return Err(Bail);
        }
        char::from_u32(0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)).ok_or(Bail)
    }

    fn hex4(&mut self) -> Parsed<u32> {
        let mut value = 0;
        for _ in 0..4 {
            let digit = char::from(self.next()?).to_digit(16).ok_or(Bail)?;
            value = value * 16 + digit;
        }
        Ok(value)
    }

    /// An integer that fits a prefix id.
    fn number(&mut self) -> Parsed<u64> {
        let start = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return Err(Bail);
        }
        decimal(&self.bytes[start..self.at])
    }

    fn boolean(&mut self) -> Parsed<bool> {
        let rest = &self.bytes[self.at..];
        if rest.starts_with(b"true") {
            self.at += 4;
            Ok(true)
        } else if rest.starts_with(b"false") {
            self.at += 5;
            Ok(false)
        } else {
            Err(Bail)
        }
    }

    /// Steps over a value by its brackets and strings only (the second
    /// reading checks it).
    fn skip_value(&mut self) -> Parsed<()> {
        let mut depth = 0usize;
        loop {
            let byte = self.next()?;
            match byte {
                b'"' => {
                    // To the closing quote, over escapes.
                    loop {
                        let rest = &self.bytes[self.at..];
                        let at = special_at(rest).ok_or(Bail)?;
                        self.at += at + 1;
                        match rest[at] {
                            b'"' => break,
                            b'\\' => {
                                self.next()?;
                            }
                            // A control character: the second reading
                            // refuses it.
                            _ => {}
                        }
                    }
                }
                b'[' | b'{' => depth += 1,
                b']' | b'}' => depth = depth.checked_sub(1).ok_or(Bail)?,
                _ => {}
            }
            if depth == 0 {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_value, Decoded};
    use crate::types::Request;

    impl MappingSink for Vec<String> {
        fn mapping(&mut self, index: usize, path: &str, underlying: &str, writable: bool) {
            self.push(format!("#{index} {path} -> {underlying} {writable}"));
        }
    }

    /// The answer the reference decoder and resolution give, with what
    /// the table then holds.
    fn reference(json: &[u8], table: &mut PrefixTable) -> String {
        match decode_value(json) {
            Err(fatal) => format!("fatal {}", fatal.message),
            Ok(Decoded::Invalid { id, message }) => format!("invalid {id:?}: {message}"),
            Ok(Decoded::Request(Request::Destroy(id))) => format!("destroy {id}"),
            Ok(Decoded::Request(Request::Create(create))) => match table.resolve_create(&create) {
                Ok(mappings) => {
                    let listed: Vec<String> = mappings
                        .iter()
                        .enumerate()
                        .map(|(index, m)| {
                            format!(
                                "#{index} {} -> {} {}",
                                m.path,
                                m.underlying.display(),
                                m.writable
                            )
                        })
                        .collect();
                    format!("create {} {listed:?}", create.id)
                }
                Err(err) => format!("refused {}: sandbox {:?}: {err}", create.id, create.id),
            },
        }
    }

    /// The same through the in-place decoder; also whether it decoded
    /// the value itself.
    fn in_place(json: &[u8], table: &mut PrefixTable) -> (String, bool) {
        match decode_in_place(json, table, |_| Vec::<String>::new()) {
            InPlace::Create { id, sink } => (format!("create {id} {sink:?}"), true),
            InPlace::Destroy(id) => (format!("destroy {id}"), true),
            InPlace::Refused { id, message } => (format!("refused {id}: {message}"), true),
            InPlace::Fallback => (reference(json, table), false),
        }
    }

    /// What prefixes 1 to 9 resolve to.
    fn registered(table: &PrefixTable) -> Vec<Option<String>> {
        (1..10).map(|id| table.get(id).map(str::to_owned)).collect()
    }

    /// Decodes `json` both ways from a table holding prefix 1 = "/base";
    /// returns whether the in-place decoder took it.
    fn agree(json: &[u8]) -> bool {
        let start = || {
            let mut table = PrefixTable::new();
            table.register(&[(1, "/base".to_string())].into()).unwrap();
            table
        };
        let (mut a, mut b) = (start(), start());
        let expected = reference(json, &mut a);
        let (got, fast) = in_place(json, &mut b);
        assert_eq!(got, expected, "{}", String::from_utf8_lossy(json));
        assert_eq!(
            registered(&b),
            registered(&a),
            "{}",
            String::from_utf8_lossy(json)
        );
        fast
    }

    const BAZEL: &str = r#"{"C":{"i":"12","m":[{"x":2,"p":"ws","y":3,"u":"scratch","w":true},{"x":4,"p":"a.c","y":5,"u":"a.c"},{"x":4,"p":"b.h","y":5,"u":"b.h"}],"q":{"2":"/","3":"/out/12","4":"/ws/pkg","5":"/src/pkg"}}}"#;

    #[test]
    fn well_formed_requests_are_decoded_in_place_as_the_reference_does() {
        for json in [
            BAZEL,
            r#"{"C":{"i":"empty","m":[]}}"#,
            r#"{"C":{"i":"e"}}"#,
            r#" { "CreateSandbox" : { "prefixes" : { "7" : "/p/" } , "id" : "a" , "mappings" : [ { "path_prefix" : 7 , "path" : "x/" , "underlying_path" : "/u\u00e9\"q\\" , "writable" : false } ] } } "#,
            r#"{"C":{"i":"\ud83d\ude00","m":[{"p":"/\u0061\/b","u":"/c\td","w":true}]}}"#,
            r#"{"C":{"i":"r","m":[{"p":"/","u":"/d"},{"x":1,"p":"","u":"/e"}]}}"#,
            r#"{"D":"12"}"#,
            r#"{"DestroySandbox":"x\n"}"#,
            // Refused: unknown prefix, bad paths, a prefix changed.
            r#"{"C":{"i":"u","m":[{"x":9,"p":"a","u":"/b"}],"q":{"3":"/three"}}}"#,
            r#"{"C":{"i":"u","m":[{"p":"/a/../b","u":"/b"}]}}"#,
            r#"{"C":{"i":"u","m":[{"p":"rel","u":"/b"},{"p":"/ok","u":"rel"}]}}"#,
            r#"{"C":{"i":"u","m":[{"p":"/a","u":"/b"}],"q":{"1":"/changed","4":"/four"}}}"#,
            r#"{"C":{"i":"u","m":[{"p":"/a","u":"/b"}],"q":{"0":"/zero"}}}"#,
            r#"{"C":{"i":"u","m":[{"x":1,"p":"/abs","u":"/b"}]}}"#,
        ] {
            assert!(agree(json.as_bytes()), "not decoded in place: {json}");
        }
    }

    #[test]
    fn everything_else_gets_the_reference_answer() {
        for json in [
            r#"{"C":{"i":"a","m":[{"p":"/a","u":"/b","w":null}]}}"#,
            r#"{"C":{"i":"a","m":[{"x":"1","p":"a","u":"/b"}]}}"#,
            r#"{"C":{"i":"a","m":[{"x":1.0,"p":"a","u":"/b"}]}}"#,
            r#"{"C":{"i":"a","m":[{"x":-0,"p":"a","u":"/b"}]}}"#,
            r#"{"C":{"i":"a","m":[{"x":01,"p":"a","u":"/b"}]}}"#,
            r#"{"C":{"i":"a","m":[{"p":"/a"}]}}"#,
            r#"{"C":{"i":"a","id":"b"}}"#,
            r#"{"C":{"i":"a","m":[],"z":1}}"#,
            r#"{"C":{"i":"a","m":[{"p":"/a","path":"/b","u":"/c"}]}}"#,
            r#"{"C":{"i":"a","m":[{"p":"/a","u":"/b",}]}}"#,
            r#"{"C":{"i":"a","m":5}}"#,
            r#"{"C":{"i":"a","q":{"2":"/x","2":"/y"}}}"#,
            r#"{"C":{"i":"a","q":{"02":"/x"}}}"#,
            r#"{"C":{"i":"a","m":[{"p":"/\ud800","u":"/b"}]}}"#,
            r#"{"C":{"i":"a"},"D":"b"}"#,
            r#"{"D":5}"#,
            r#"{"X":"a"}"#,
            r#"[1,2]"#,
            r#"{"C":{"i":"a","m":[{"p":"/a","u":"/b"}]]}}"#,
        ] {
            agree(json.as_bytes());
        }
        agree(b"{\"C\":{\"i\":\"a\",\"m\":[{\"p\":\"/a\xff\",\"u\":\"/b\"}]}}");
        agree(b"{\"C\":{\"i\":\"a\",\"m\":[{\"p\":\"/a\x01\",\"u\":\"/b\"}]}}");
    }

    #[test]
    fn the_word_scan_finds_what_a_byte_scan_finds() {
        let mut bytes: Vec<u8> = (0..=255u8).collect();
        bytes.extend_from_slice(b"plain/path/of/some/length.c");
        for start in 0..bytes.len() {
            for end in start..bytes.len().min(start + 40) {
                let slice = &bytes[start..end];
                assert_eq!(
                    special_at(slice),
                    slice.iter().position(|&b| is_special(b)),
                    "{slice:?}"
                );
            }
        }
        let all_plain: Vec<u8> = (0x20..=0xffu8).filter(|&b| !is_special(b)).collect();
        for window in all_plain.windows(9) {
            assert_eq!(special_at(window), None);
        }
    }

    #[test]
    fn every_one_byte_change_of_a_request_gets_the_reference_answer() {
        let bazel = BAZEL.as_bytes();
        for at in 0..bazel.len() {
            for byte in [
                b'"', b'\\', b'{', b'}', b'[', b']', b',', b':', b' ', b'0', b'9', b'x', b'/',
                b'.', 0xC3,
            ] {
                let mut json = bazel.to_vec();
                json[at] = byte;
                agree(&json);
            }
            let mut json = bazel.to_vec();
            json.remove(at);
            agree(&json);
        }
    }
}
