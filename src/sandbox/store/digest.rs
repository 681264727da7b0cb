//! SHA-256 digests: parsed from their 64 lowercase hex digits (the only
//! keys the store takes, which also makes them safe as file names), and
//! computed over bytes and files.

use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

/// A SHA-256 digest, as the 32 raw bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// Parses 64 lowercase hex digits; anything else is `None` (an empty
    /// string, `../etc/passwd`, uppercase, a digest of another length).
    pub fn parse(key: &str) -> Option<Digest> {
        let key = key.as_bytes();
        if key.len() != 64 {
            return None;
        }
        // Every key of every input of a tree is parsed: a table and one
        // check at the end, not a branch per digit.
        let mut out = [0u8; 32];
        let mut invalid = 0u8;
        for (byte, pair) in out.iter_mut().zip(key.chunks_exact(2)) {
            let (high, low) = (NIBBLE[pair[0] as usize], NIBBLE[pair[1] as usize]);
            invalid |= high | low;
            *byte = (high << 4) | (low & 0x0f);
        }
        (invalid & 0xf0 == 0).then_some(Digest(out))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    /// The 64 lowercase hex digits.
    pub fn hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(64);
        for byte in self.0 {
            out.push(DIGITS[usize::from(byte >> 4)] as char);
            out.push(DIGITS[usize::from(byte & 15)] as char);
        }
        out
    }

    /// The table hash: the digest's first 8 bytes are already uniform.
    pub fn spread(&self) -> u64 {
        u64::from_le_bytes(self.0[..8].try_into().unwrap())
    }
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.hex())
    }
}

/// Each byte's value as a lowercase hex digit, 0xff for any other byte.
const NIBBLE: [u8; 256] = {
    let mut table = [0xffu8; 256];
    let mut digit = 0;
    while digit < 16 {
        table[b"0123456789abcdef"[digit] as usize] = digit as u8;
        digit += 1;
    }
    table
};

/// Hashes bytes as they go by, counting them.
pub struct Hasher {
    sha: Sha256,
    pub len: u64,
}

impl Hasher {
    pub fn new() -> Hasher {
        Hasher {
            sha: Sha256::new(),
            len: 0,
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
        self.len += bytes.len() as u64;
    }

    pub fn finish(self) -> Digest {
        Digest(self.sha.finalize().into())
    }
}

/// The buffer size of the copying and hashing loops.
pub const CHUNK: usize = 256 * 1024;

/// Reads `source` to its end, hashing it.
pub fn hash_reader(mut source: impl Read) -> io::Result<(Digest, u64)> {
    let mut hasher = Hasher::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        match source.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        }
    }
    let len = hasher.len;
    Ok((hasher.finish(), len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_64_lowercase_hex_digits() {
        let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let d = Digest::parse(empty).unwrap();
        assert_eq!(d, Digest::of(b""));
        assert_eq!(d.hex(), empty);
        for bad in [
            "",
            "../etc/passwd",
            &empty[..63],
            &format!("{empty}0"),
            &empty.to_uppercase(),
            &format!("{}g", &empty[..63]),
            &format!("{}/", &empty[..63]),
        ] {
            assert!(Digest::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn hash_reader_matches_digest_of() {
        let bytes: Vec<u8> = (0..CHUNK * 2 + 17).map(|i| i as u8).collect();
        let (d, len) = hash_reader(&bytes[..]).unwrap();
        assert_eq!((d, len), (Digest::of(&bytes), bytes.len() as u64));
    }
}
