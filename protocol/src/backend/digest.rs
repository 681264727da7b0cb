//! Digests as the protocol spells them: SHA-256, as 64 lowercase hex
//! digits, with the size of the bytes hashed.

use sha2::{Digest as _, Sha256};

use super::reapi;

/// The name of the hash function, as `Manifest.hash_function` carries it.
pub const HASH_FUNCTION: &str = "SHA-256";

/// The SHA-256 of `bytes`, as 64 lowercase hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hash = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for byte in hash.iter() {
        out.push(HEX[usize::from(byte >> 4)] as char);
        out.push(HEX[usize::from(byte & 0xf)] as char);
    }
    out
}

/// The REAPI digest of `bytes`: their SHA-256 and their length.
pub fn digest_of(bytes: &[u8]) -> reapi::Digest {
    reapi::Digest {
        hash: sha256_hex(bytes),
        size_bytes: bytes.len() as i64,
    }
}

/// Whether `s` is spelled like a SHA-256 hash here: exactly 64 lowercase
/// hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn known_hashes() {
        assert_eq!(sha256_hex(b""), EMPTY);
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn digest_carries_the_size() {
        let d = digest_of(b"hello\n");
        assert_eq!(d.size_bytes, 6);
        assert_eq!(
            d.hash,
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert_eq!(digest_of(b"").hash, EMPTY);
    }

    #[test]
    fn recognizes_hashes() {
        assert!(is_sha256_hex(EMPTY));
        assert!(is_sha256_hex(&sha256_hex(b"x")));
        assert!(!is_sha256_hex(&EMPTY.to_uppercase()));
        assert!(!is_sha256_hex(&EMPTY[1..]));
        assert!(!is_sha256_hex(&format!("{EMPTY}0")));
        assert!(!is_sha256_hex(&EMPTY.replace('e', "g")));
        assert!(!is_sha256_hex(""));
        // 64 bytes, but not 64 hex digits.
        assert!(!is_sha256_hex(&format!("{}é", &EMPTY[..62])));
    }
}
