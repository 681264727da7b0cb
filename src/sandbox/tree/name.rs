//! Compact file names: the view holds one per node, so their size is most
//! of the daemon's memory per mapped input.
//!
//! A name of up to 22 bytes (nearly every file name in a build) is stored
//! inline in the 24 bytes a `String` header would take, with no heap
//! allocation; longer names take one exact-size allocation.

use std::borrow::Borrow;
use std::ffi::OsStr;
use std::hash::{Hash, Hasher};
use std::os::unix::ffi::OsStrExt;

const INLINE: usize = 22;

#[derive(Clone)]
pub enum Name {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl Name {
    pub fn new(name: &OsStr) -> Name {
        let bytes = name.as_bytes();
        if bytes.len() <= INLINE {
            let mut inline = [0; INLINE];
            inline[..bytes.len()].copy_from_slice(bytes);
            Name::Inline {
                len: bytes.len() as u8,
                bytes: inline,
            }
        } else {
            Name::Heap(bytes.into())
        }
    }

    pub fn as_os_str(&self) -> &OsStr {
        OsStr::from_bytes(match self {
            Name::Inline { len, bytes } => &bytes[..*len as usize],
            Name::Heap(bytes) => bytes,
        })
    }
}

impl Borrow<OsStr> for Name {
    fn borrow(&self) -> &OsStr {
        self.as_os_str()
    }
}

// Hash and Eq as the OsStr it borrows as, so maps keyed by Name can be
// searched with an &OsStr.
impl Hash for Name {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_os_str().hash(state)
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Name) -> bool {
        self.as_os_str() == other.as_os_str()
    }
}

impl Eq for Name {}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_os_str().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn names_round_trip_inline_and_on_the_heap_and_look_up_as_os_str() {
        assert_eq!(std::mem::size_of::<Name>(), 24);
        let mut map = HashMap::new();
        for (i, text) in [
            "",
            "a",
            "exactly-22-bytes-long!",
            "twenty-three-bytes-long",
            &"x".repeat(255),
        ]
        .iter()
        .enumerate()
        {
            let name = Name::new(OsStr::new(text));
            assert_eq!(name.as_os_str(), OsStr::new(text));
            assert_eq!(matches!(name, Name::Inline { .. }), text.len() <= INLINE);
            map.insert(name, i);
        }
        assert_eq!(map.get(OsStr::new("exactly-22-bytes-long!")), Some(&2));
        assert_eq!(map.get(OsStr::new("twenty-three-bytes-long")), Some(&3));
        assert_eq!(map.get(OsStr::new("b")), None);
        let non_utf8 = OsStr::from_bytes(b"\xff\xfe");
        assert_eq!(Name::new(non_utf8).as_os_str(), non_utf8);
    }
}
