//! Extended attributes by path, for tests that plant one and check it is
//! still there (std has no xattr calls).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Sets `name` on `path` (following symlinks); panics, saying why, if it
/// cannot.
pub fn set(path: &Path, name: &str, value: &[u8]) {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let c_name = CString::new(name).unwrap();
    // SAFETY: valid C strings and a value slice, alive across the call.
    let done = unsafe {
        libc::setxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        done,
        0,
        "setxattr {path:?} {name}: {}",
        std::io::Error::last_os_error()
    );
}

/// `name`'s value on `path` (up to 256 bytes), or `None` if it has none.
pub fn get(path: &Path, name: &str) -> Option<Vec<u8>> {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let c_name = CString::new(name).unwrap();
    let mut value = vec![0u8; 256];
    // SAFETY: valid C strings and a buffer of value.len() bytes.
    let got = unsafe {
        libc::getxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    (got >= 0).then(|| {
        value.truncate(got as usize);
        value
    })
}
