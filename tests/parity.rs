//! Behaviours scripts and tools written for sandboxfs 0.2.0 rely on (the
//! man page's "Compatibility with sandboxfs 0.2.0" lists the deliberate
//! differences): operations on open descriptors of deleted objects,
//! extended attributes of directories made up for nested mappings, and
//! `--allow=root` keeping other users out even of what the kernel cached.
//! Stopping (signals, a busy mount) and the command line are tested in
//! lifecycle.rs and src/cli.rs.

use std::ffi::CString;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use actionfs_testkit::tier::{require, Need};
use actionfs_testkit::*;

fn fd_xattr_set(fd: i32, name: &str, value: &[u8]) -> std::io::Result<()> {
    let name = CString::new(name).unwrap();
    // SAFETY: valid descriptor, C string and value slice.
    let ret = unsafe { libc::fsetxattr(fd, name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn fd_xattr_get(fd: i32, name: &str) -> std::io::Result<Vec<u8>> {
    let name = CString::new(name).unwrap();
    let mut buf = vec![0u8; 64];
    // SAFETY: valid descriptor, C string and a buffer of buf.len() bytes.
    let len = unsafe { libc::fgetxattr(fd, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if len < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(len as usize);
    Ok(buf)
}

fn path_xattr(path: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let path = CString::new(path.to_str().unwrap()).unwrap();
    let name = CString::new(name).unwrap();
    let mut buf = vec![0u8; 64];
    // SAFETY: valid C strings and a buffer of buf.len() bytes.
    let len = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if len < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(len as usize);
    Ok(buf)
}

fn path_listxattr(path: &Path) -> std::io::Result<usize> {
    let path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: valid C string; a null buffer of length 0 asks for the size.
    let len = unsafe { libc::listxattr(path.as_ptr(), std::ptr::null_mut(), 0) };
    if len < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(len as usize)
}

fn path_setxattr(path: &Path, name: &str) -> std::io::Result<()> {
    let path = CString::new(path.to_str().unwrap()).unwrap();
    let name = CString::new(name).unwrap();
    // SAFETY: valid C strings and a one-byte value.
    let ret = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), b"x".as_ptr().cast(), 1, 0) };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn path_removexattr(path: &Path, name: &str) -> std::io::Result<()> {
    let path = CString::new(path.to_str().unwrap()).unwrap();
    let name = CString::new(name).unwrap();
    // SAFETY: valid C strings.
    let ret = unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn an_open_file_deleted_through_the_mount_keeps_serving_its_descriptor() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    for args in [&["--xattrs"][..], &["--xattrs", "--passthrough=off"][..]] {
        let d = fx.start(args);
        let id = format!("s{}", args.len());
        d.create(sandbox(&id, vec![rw("/ws", &fx.path("scratch"))]));
        let path = d.path(&format!("{id}/ws/tmp"));
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.write_all(b"hello").unwrap();
        let reader = fs::File::open(&path).unwrap();
        fs::remove_file(&path).unwrap();
        assert!(!path.exists() && !fx.path("scratch/tmp").exists());

        let meta = file.metadata().unwrap();
        assert_eq!((meta.len(), meta.nlink()), (5, 0), "{args:?}: fstat");
        file.set_permissions(fs::Permissions::from_mode(0o600))
            .unwrap();
        assert_eq!(
            file.metadata().unwrap().mode() & 0o777,
            0o600,
            "{args:?}: fchmod"
        );
        std::os::unix::fs::fchown(&file, Some(1), Some(2)).unwrap();
        let meta = reader.metadata().unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1, 2), "{args:?}: fchown");
        file.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000))
            .unwrap();
        assert_eq!(
            file.metadata().unwrap().mtime(),
            1_000,
            "{args:?}: futimens"
        );
        fd_xattr_set(file.as_raw_fd(), "user.k", b"v").unwrap();
        assert_eq!(fd_xattr_get(reader.as_raw_fd(), "user.k").unwrap(), b"v");
        // Truncation through a descriptor opened only for reading.
        file.write_all(b" world").unwrap();
        reader.set_len(3).unwrap_err(); // EINVAL from the kernel: not writable
        file.set_len(8).unwrap();
        let mut text = String::new();
        file.seek(SeekFrom::Start(0)).unwrap();
        file.read_to_string(&mut text).unwrap();
        assert_eq!(text, "hello wo", "{args:?}: data still served");
        drop((file, reader));
        assert_eq!(d.terminate(), BY_SIGTERM);
    }
}

#[test]
fn a_directory_removed_while_open_keeps_serving_its_descriptor() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let d = fx.start(&["--xattrs"]);
    d.create(sandbox("s", vec![rw("/ws", &fx.path("scratch"))]));
    let dir = d.path("s/ws/gone");
    fs::create_dir(&dir).unwrap();
    let open = fs::File::open(&dir).unwrap();
    fs::remove_dir(&dir).unwrap();
    let meta = open.metadata().unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.nlink(), 0, "a removed directory has no links");
    open.set_permissions(fs::Permissions::from_mode(0o700))
        .unwrap();
    assert_eq!(open.metadata().unwrap().mode() & 0o777, 0o700);
    fd_xattr_set(open.as_raw_fd(), "user.k", b"d").unwrap();
    assert_eq!(fd_xattr_get(open.as_raw_fd(), "user.k").unwrap(), b"d");
    drop(open);
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn python_temporary_files_work_in_a_writable_mapping() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let d = fx.start(&[]);
    d.create(sandbox("s", vec![rw("/ws", &fx.path("scratch"))]));
    let script = "import os, tempfile, sys\n\
        d = sys.argv[1]\n\
        with tempfile.TemporaryFile(dir=d) as f:\n\
        \x20   f.write(b'data'); f.flush()\n\
        \x20   st = os.fstat(f.fileno())\n\
        \x20   assert st.st_size == 4 and st.st_nlink == 0, st\n\
        \x20   os.fchmod(f.fileno(), 0o600)\n\
        \x20   f.seek(0); assert f.read() == b'data'\n\
        with tempfile.NamedTemporaryFile(dir=d) as f:\n\
        \x20   f.write(b'x'); f.flush(); assert os.fstat(f.fileno()).st_size == 1\n\
        print('ok')\n";
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(d.path("s/ws"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        fx.log()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    assert_eq!(names(&fx.path("scratch")), Vec::<String>::new());
    assert_eq!(d.terminate(), BY_SIGTERM);
}

#[test]
fn made_up_directories_answer_xattr_calls_like_an_empty_read_only_directory() {
    if !require(&[Need::Mount]) {
        return;
    }
    let fx = Fixture::new();
    let input = fx.write("src/x.txt", "x");
    let d = fx.start(&["--xattrs"]);
    // ws/sub has no real directory behind it; top is virtual outright.
    d.create(sandbox(
        "s",
        vec![
            rw("/ws", &fx.path("scratch")),
            ro("/ws/sub/x.txt", &input),
            ro("/top/y.txt", &input),
        ],
    ));
    for dir in ["s/ws/sub", "s/top", "s"] {
        let path = d.path(dir);
        assert_eq!(errno(path_xattr(&path, "user.k")), libc::ENODATA, "{dir}");
        assert_eq!(path_listxattr(&path).unwrap(), 0, "{dir}");
        assert_eq!(errno(path_setxattr(&path, "user.k")), libc::EPERM, "{dir}");
        assert_eq!(
            errno(path_removexattr(&path, "user.k")),
            libc::EPERM,
            "{dir}"
        );
        // statfs answers too (zeros for nothing underlying).
        nix_statvfs(&path);
    }
    assert_eq!(d.terminate(), BY_SIGTERM);
}

fn nix_statvfs(path: &Path) {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a zeroed statvfs is a valid out-parameter; valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let ret = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    assert_eq!(
        ret,
        0,
        "statvfs {path:?}: {}",
        std::io::Error::last_os_error()
    );
}

#[test]
fn allow_root_keeps_other_users_out_even_of_names_root_looked_up() {
    if !require(&[Need::Mount, Need::Root]) {
        return;
    }
    for (flag, others_see) in [("--allow=root", false), ("--allow=other", true)] {
        let fx = Fixture::new();
        fs::set_permissions(fx.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let input = fx.write("src/in", "data");
        fs::set_permissions(fx.path("src"), fs::Permissions::from_mode(0o755)).unwrap();
        let d = fx.start(&[flag]);
        d.create(sandbox("s", vec![ro("/in", &input)]));
        // Root looks the name up: the kernel now knows it.
        assert_eq!(fs::read_to_string(d.path("s/in")).unwrap(), "data");
        let target = d.path("s/in");
        let out = as_nobody(&["stat", "-c", "%s", target.to_str().unwrap()]);
        assert_eq!(out.status.success(), others_see, "{flag}: {out:?}");
        if !others_see {
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
                "{flag}: {out:?}"
            );
        }
        assert_eq!(d.terminate(), BY_SIGTERM);
    }
}
