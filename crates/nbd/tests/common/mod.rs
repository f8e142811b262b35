//! Shared helpers: an in-process server on a unix socket in a temp dir.

#![allow(dead_code)]

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tiercache_nbd::proto::{put_request, CMD_WRITE, IHAVEOPT};
use tiercache_nbd::{BlockSizes, Export, FileExport, Server, ServerOptions, ShutdownHandle};

pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    handle: ShutdownHandle,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl TestServer {
    pub fn start(exports: Vec<(String, Arc<dyn Export>)>) -> TestServer {
        Self::start_with(exports, ServerOptions::default())
    }

    pub fn start_with(exports: Vec<(String, Arc<dyn Export>)>, opts: ServerOptions) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nbd.sock");
        let server = Server::new(exports).with_options(opts);
        let handle = server.shutdown_handle();
        let s2 = socket.clone();
        let thread = std::thread::spawn(move || server.serve_unix(&s2));
        for _ in 0..500 {
            if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        TestServer {
            dir,
            socket,
            handle,
            thread: Some(thread),
        }
    }

    /// `nbd+unix:///NAME?socket=PATH`
    pub fn uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.socket.display())
    }

    pub fn stop(mut self) {
        self.handle.shutdown();
        self.thread.take().unwrap().join().unwrap().unwrap();
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A file of `size` bytes with a deterministic pattern, exported as is.
pub fn file_export(dir: &Path, name: &str, size: u64) -> (PathBuf, Arc<FileExport>) {
    let path = dir.join(name);
    let data: Vec<u8> = (0..size).map(|i| (i.wrapping_mul(31) >> 3) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let e = Arc::new(FileExport::open(&path, false).unwrap());
    (path, e)
}

/// Whether a command-line tool is installed; prints the SKIP line when not.
pub fn have(tool: &str) -> bool {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        tiercache_testskip::skip!("{tool} not installed");
    }
    ok
}

/// An `nbdsh` command that works: nbdsh runs `python3`, which must see the libnbd module
/// (a pyenv python3 first on PATH does not); falls back to the system python's PATH.
pub fn nbdsh() -> Option<Command> {
    if !have("nbdsh") {
        return None;
    }
    let works = |path: Option<&str>| {
        let mut c = Command::new("nbdsh");
        if let Some(p) = path {
            c.env("PATH", p);
        }
        c.args(["-c", "pass"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if works(None) {
        return Some(Command::new("nbdsh"));
    }
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    if works(Some(&path)) {
        let mut c = Command::new("nbdsh");
        c.env("PATH", path);
        return Some(c);
    }
    tiercache_testskip::skip!(
        "nbdsh not installed (its python3 cannot import nbd: install python3-libnbd)"
    );
    None
}

/// Runs a command, panics with its output when it fails, returns stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    stdout
}

/// An in-memory export that fails reads and writes touching `[bad_start, bad_end)` with EIO,
/// and optionally sleeps on reads at offset 0 (to force out-of-order replies).
pub struct FaultyExport {
    pub data: std::sync::Mutex<Vec<u8>>,
    pub bad_start: u64,
    pub bad_end: u64,
    pub slow_offset_zero: Option<Duration>,
    pub max_block: u32,
    pub in_flight: AtomicUsize,
    pub peak_in_flight: AtomicUsize,
}

impl FaultyExport {
    pub fn new(size: usize, bad_start: u64, bad_end: u64) -> FaultyExport {
        FaultyExport {
            data: std::sync::Mutex::new(vec![0; size]),
            bad_start,
            bad_end,
            slow_offset_zero: None,
            max_block: 1 << 20,
            in_flight: AtomicUsize::new(0),
            peak_in_flight: AtomicUsize::new(0),
        }
    }
    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        if offset < self.bad_end && offset + len > self.bad_start {
            return Err(io::Error::from_raw_os_error(libc_eio()));
        }
        Ok(())
    }
}

fn libc_eio() -> i32 {
    5
}

impl Export for FaultyExport {
    fn size(&self) -> u64 {
        self.data.lock().unwrap().len() as u64
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak_in_flight.fetch_max(n, Ordering::SeqCst);
        if offset == 0 {
            if let Some(d) = self.slow_offset_zero {
                std::thread::sleep(d);
            }
        }
        let r = self.check(offset, buf.len() as u64).map(|()| {
            let d = self.data.lock().unwrap();
            buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        });
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        r
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        self.check(offset, data.len() as u64)?;
        let mut d = self.data.lock().unwrap();
        d[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write_zeroes(offset, len, false, true)
    }
    fn write_zeroes(&self, offset: u64, len: u64, _fua: bool, _may_trim: bool) -> io::Result<()> {
        self.check(offset, len)?;
        let mut d = self.data.lock().unwrap();
        d[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
    fn block_sizes(&self) -> BlockSizes {
        BlockSizes {
            minimum: 1,
            preferred: 4096,
            maximum: self.max_block,
        }
    }
    fn description(&self) -> Option<String> {
        Some("faulty test export".into())
    }
}

// Raw client byte streams (for tests that speak the protocol byte by byte).

/// Appends an option request (`IHAVEOPT`, option, length, data).
pub fn option(b: &mut Vec<u8>, opt: u32, data: &[u8]) {
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
}

/// The data of NBD_OPT_GO / NBD_OPT_INFO: export name and requested info types.
pub fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

/// Appends a transmission request; a write carries `len` bytes of a counting pattern.
pub fn request(b: &mut Vec<u8>, typ: u16, flags: u16, handle: u64, offset: u64, len: u32) {
    put_request(b, flags, typ, handle, offset, len);
    if typ == CMD_WRITE {
        b.extend((0..len).map(|i| i as u8));
    }
}

/// Fixed-newstyle handshake and NBD_OPT_GO for export `name` on a raw stream (simple
/// replies). Returns false when the server closes the connection instead (refused at the
/// connection limit); panics on a protocol answer other than INFO/ACK.
pub fn raw_go(s: &mut (impl io::Read + io::Write), name: &str) -> bool {
    let mut hello = [0u8; 18];
    if s.read_exact(&mut hello).is_err() {
        return false;
    }
    let mut b = (tiercache_nbd::proto::FLAG_C_FIXED_NEWSTYLE
        | tiercache_nbd::proto::FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    option(&mut b, tiercache_nbd::proto::OPT_GO, &go_data(name, &[]));
    if s.write_all(&b).is_err() {
        return false;
    }
    loop {
        let mut h = [0u8; 20];
        if s.read_exact(&mut h).is_err() {
            return false;
        }
        let typ = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut d = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        if s.read_exact(&mut d).is_err() {
            return false;
        }
        use tiercache_nbd::proto::{REP_ACK, REP_INFO};
        assert!(typ == REP_ACK || typ == REP_INFO, "GO: {typ:#x}");
        if typ == REP_ACK {
            return true;
        }
    }
}

/// One READ of `len` bytes at `offset` in transmission (simple replies): the data, or None
/// when the connection fails; panics on an NBD error reply.
pub fn raw_read(
    s: &mut (impl io::Read + io::Write),
    handle: u64,
    offset: u64,
    len: u32,
) -> Option<Vec<u8>> {
    let mut b = Vec::new();
    request(
        &mut b,
        tiercache_nbd::proto::CMD_READ,
        0,
        handle,
        offset,
        len,
    );
    s.write_all(&b).ok()?;
    let mut r = vec![0u8; 16 + len as usize];
    s.read_exact(&mut r).ok()?;
    assert_eq!(&r[4..8], &[0, 0, 0, 0], "read error");
    assert_eq!(
        u64::from_be_bytes(r[8..16].try_into().unwrap()),
        handle,
        "reply handle"
    );
    Some(r.split_off(16))
}

/// A process status field of `/proc/self/status` in its unit (kB for memory, a count for
/// Threads).
pub fn proc_status(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .unwrap()
}
