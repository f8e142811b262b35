//! Who may reach a unix socket the server creates: the socket file is 0600 (owner only) from
//! the moment its name exists, whatever the umask, or 0660 with a chosen group; and the peer's
//! uid, for sockets that check it (`SO_PEERCRED`).
//!
//! The socket is bound inside a fresh 0700 directory beside its final name, given its mode
//! (and group) there, and only then hard-linked to the final name: no client can ever connect
//! through a name with wider permissions (a `chmod` after `bind` leaves a window in which, at
//! umask 000, anyone can connect and keep the connection).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Binds a unix socket at `path`, mode 0600, or 0660 owned by group `group` (a gid). A
/// socket file already at `path` is an error (`AddrInUse`), as with a plain `bind`.
pub fn bind_private(path: &Path, group: Option<u32>) -> io::Result<UnixListener> {
    path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a socket file name", path.display()),
        )
    })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // Short, so that the temporary path fits sun_path (108 bytes) whenever the final one does.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp_dir = parent.join(format!(".b{}.{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp_dir); // left by a crash of an earlier process
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(&tmp_dir)?;
    }
    let r = (|| {
        // The umask may have cleared bits of 0700 (never added any): the directory is ours.
        std::fs::set_permissions(&tmp_dir, std::fs::Permissions::from_mode(0o700))?;
        let tmp = tmp_dir.join("s");
        let listener = UnixListener::bind(&tmp)?;
        if let Some(gid) = group {
            chown_group(&tmp, gid)?;
        }
        let mode = if group.is_some() { 0o660 } else { 0o600 };
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
        std::fs::hard_link(&tmp, path).map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                io::Error::new(io::ErrorKind::AddrInUse, "address already in use")
            } else {
                e
            }
        })?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&tmp_dir);
    r
}

fn cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

fn chown_group(path: &Path, gid: u32) -> io::Result<()> {
    let p = cstr(path)?;
    // SAFETY: `p` is a valid NUL-terminated path; uid -1 leaves the owner unchanged.
    if unsafe { libc::chown(p.as_ptr(), u32::MAX, gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The uid of the process at the other end of a connected unix socket (`SO_PEERCRED`: the
/// credentials it had when it connected).
pub fn peer_uid(sock: &impl AsRawFd) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// This process's effective uid.
pub fn my_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// A group name (or a numeric gid) as a gid.
pub fn group_id(name: &str) -> io::Result<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let c = CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16384];
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the sizes given; `out` is set to `&grp` or null.
    let r =
        unsafe { libc::getgrnam_r(c.as_ptr(), &mut grp, buf.as_mut_ptr(), buf.len(), &mut out) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    if out.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no group named {name:?} (see /etc/group, or give a numeric gid)"),
        ));
    }
    Ok(grp.gr_gid)
}

/// Whether the uid at the other end of `sock` may use a socket that only its owner may use:
/// this process's uid or root. `Err` carries the refusal text (with the peer's uid).
pub fn check_peer_is_owner(sock: &impl AsRawFd) -> Result<u32, String> {
    let me = my_uid();
    match peer_uid(sock) {
        Ok(uid) if uid == me || uid == 0 => Ok(uid),
        Ok(uid) => Err(format!(
            "permission denied: uid {uid} is neither the server's uid {me} nor root"
        )),
        Err(e) => Err(format!(
            "permission denied: cannot read the peer's uid: {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn socket_is_private_whatever_the_name_already_holds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.sock");
        let l = bind_private(&p, None).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        let c = std::os::unix::net::UnixStream::connect(&p).unwrap();
        let (s, _) = l.accept().unwrap();
        assert_eq!(peer_uid(&s).unwrap(), my_uid());
        assert_eq!(check_peer_is_owner(&c).unwrap(), my_uid());
        let e = bind_private(&p, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary directory left behind");
        assert_eq!(group_id("0").unwrap(), 0);
        assert!(group_id("no-such-group-tiercache").is_err());
    }
}
