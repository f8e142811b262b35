//! Protocol-level tests with hand-made packets and the Rust client: malformed input gets the
//! right error reply or a clean disconnect, and the server keeps serving everyone else.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::*;
use tiercache_nbd::proto::*;
use tiercache_nbd::{
    replay, BlockSizes, Client, ClientOptions, Export, NbdUri, ReplayOp, ReplayOpKind,
    ServerOptions,
};

const MIB: u64 = 1 << 20;

/// A raw connection for sending what a well-behaved client would not.
struct Raw {
    s: UnixStream,
}

impl Raw {
    fn connect(srv: &TestServer) -> Raw {
        let s = UnixStream::connect(&srv.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Raw { s }
    }
    fn u16(&mut self) -> u16 {
        let mut b = [0; 2];
        self.s.read_exact(&mut b).unwrap();
        u16::from_be_bytes(b)
    }
    fn u32(&mut self) -> u32 {
        let mut b = [0; 4];
        self.s.read_exact(&mut b).unwrap();
        u32::from_be_bytes(b)
    }
    fn u64(&mut self) -> u64 {
        let mut b = [0; 8];
        self.s.read_exact(&mut b).unwrap();
        u64::from_be_bytes(b)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0; n];
        self.s.read_exact(&mut b).unwrap();
        b
    }
    fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap();
    }
    /// Greeting and client flags.
    fn hello(&mut self, cflags: u32) {
        assert_eq!(self.u64(), NBDMAGIC);
        assert_eq!(self.u64(), IHAVEOPT);
        let hf = self.u16();
        assert_eq!(hf, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        self.send(&cflags.to_be_bytes());
    }
    fn option(&mut self, opt: u32, data: &[u8]) {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.send(&b);
    }
    /// (reply type, data)
    fn opt_reply(&mut self, opt: u32) -> (u32, Vec<u8>) {
        assert_eq!(self.u64(), OPT_REPLY_MAGIC);
        assert_eq!(self.u32(), opt);
        let typ = self.u32();
        let len = self.u32() as usize;
        (typ, self.bytes(len))
    }
    fn go(&mut self, name: &str) -> (u64, u16) {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        self.option(OPT_GO, &d);
        let mut size = 0;
        let mut flags = 0;
        loop {
            let (typ, data) = self.opt_reply(OPT_GO);
            match typ {
                REP_ACK => return (size, flags),
                REP_INFO => {
                    if u16::from_be_bytes([data[0], data[1]]) == INFO_EXPORT {
                        size = u64::from_be_bytes(data[2..10].try_into().unwrap());
                        flags = u16::from_be_bytes([data[10], data[11]]);
                    }
                }
                t => panic!("GO failed: {t:#x} {}", String::from_utf8_lossy(&data)),
            }
        }
    }
    fn request(&mut self, typ: u16, flags: u16, handle: u64, offset: u64, len: u32) {
        let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&typ.to_be_bytes());
        b.extend_from_slice(&handle.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        self.send(&b);
    }
    /// Simple reply: (error, handle).
    fn simple_reply(&mut self) -> (u32, u64) {
        assert_eq!(self.u32(), SIMPLE_REPLY_MAGIC);
        (self.u32(), self.u64())
    }
    /// Whether the server closed the connection (EOF before any byte).
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }
}

fn file_server(size: u64) -> (TestServer, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (path, e) = file_export(dir.path(), "disk.img", size);
    let srv = TestServer::start(vec![("disk".into(), e as Arc<dyn Export>)]);
    // Keep the file's directory alive with the server.
    std::mem::forget(dir);
    (srv, path)
}

fn assert_still_serves(srv: &TestServer) {
    let mut c = Client::connect(&srv.uri("disk")).unwrap();
    let mut b = vec![0u8; 4096];
    c.read(0, &mut b).unwrap();
    c.disconnect().unwrap();
}

#[test]
fn bad_option_magic_and_non_fixed_clients_are_disconnected() {
    let (srv, _) = file_server(MIB);
    let mut r = Raw::connect(&srv);
    r.hello(FLAG_C_FIXED_NEWSTYLE);
    let mut b = 0x1122_3344_5566_7788u64.to_be_bytes().to_vec();
    b.extend_from_slice(&[0; 8]);
    r.send(&b);
    assert!(r.closed());
    // A client without the fixed-newstyle flag.
    let mut r = Raw::connect(&srv);
    r.hello(0);
    assert!(r.closed());
    // Unknown client flags.
    let mut r = Raw::connect(&srv);
    r.hello(FLAG_C_FIXED_NEWSTYLE | 1 << 7);
    assert!(r.closed());
    assert_still_serves(&srv);
}

#[test]
fn options_unknown_unsupported_list_info_abort() {
    let (srv, _) = file_server(MIB);
    let mut r = Raw::connect(&srv);
    r.hello(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    r.option(99, b"payload");
    assert_eq!(r.opt_reply(99).0, REP_ERR_UNSUP);
    r.option(OPT_STARTTLS, &[]);
    assert_eq!(r.opt_reply(OPT_STARTTLS).0, REP_ERR_UNSUP);
    r.option(OPT_LIST, b"x");
    assert_eq!(r.opt_reply(OPT_LIST).0, REP_ERR_INVALID);
    r.option(OPT_LIST, &[]);
    let (t, d) = r.opt_reply(OPT_LIST);
    assert_eq!(t, REP_SERVER);
    assert_eq!(&d[4..], b"disk");
    assert_eq!(r.opt_reply(OPT_LIST).0, REP_ACK);
    // Unknown export, over-long name, malformed INFO.
    let mut d = 4u32.to_be_bytes().to_vec();
    d.extend_from_slice(b"nope");
    d.extend_from_slice(&0u16.to_be_bytes());
    r.option(OPT_INFO, &d);
    let (t, msg) = r.opt_reply(OPT_INFO);
    assert_eq!(t, REP_ERR_UNKNOWN);
    assert!(String::from_utf8_lossy(&msg).contains("nope"));
    let long = "x".repeat(5000);
    let mut d = (long.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(long.as_bytes());
    d.extend_from_slice(&0u16.to_be_bytes());
    r.option(OPT_GO, &d);
    assert_eq!(r.opt_reply(OPT_GO).0, REP_ERR_INVALID);
    r.option(OPT_INFO, &[0, 0, 0, 9, b'd']);
    assert_eq!(r.opt_reply(OPT_INFO).0, REP_ERR_INVALID);
    // INFO with NAME, DESCRIPTION and BLOCK_SIZE requests on the default export.
    let mut d = 0u32.to_be_bytes().to_vec();
    d.extend_from_slice(&3u16.to_be_bytes());
    for i in [INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE] {
        d.extend_from_slice(&i.to_be_bytes());
    }
    r.option(OPT_INFO, &d);
    let mut seen = vec![];
    loop {
        let (t, d) = r.opt_reply(OPT_INFO);
        if t == REP_ACK {
            break;
        }
        assert_eq!(t, REP_INFO);
        let it = u16::from_be_bytes([d[0], d[1]]);
        match it {
            INFO_EXPORT => {
                assert_eq!(u64::from_be_bytes(d[2..10].try_into().unwrap()), MIB);
                let f = u16::from_be_bytes([d[10], d[11]]);
                for want in [
                    FLAG_HAS_FLAGS,
                    FLAG_SEND_FLUSH,
                    FLAG_SEND_FUA,
                    FLAG_SEND_TRIM,
                    FLAG_SEND_WRITE_ZEROES,
                    FLAG_CAN_MULTI_CONN,
                ] {
                    assert!(f & want != 0, "flags {f:#x} lack {want:#x}");
                }
                assert_eq!(f & FLAG_READ_ONLY, 0);
            }
            INFO_NAME => assert_eq!(&d[2..], b"disk"),
            INFO_DESCRIPTION => assert!(String::from_utf8_lossy(&d[2..]).ends_with("disk.img")),
            INFO_BLOCK_SIZE => {
                let v: Vec<u32> = d[2..]
                    .chunks(4)
                    .map(|c| u32::from_be_bytes(c.try_into().unwrap()))
                    .collect();
                assert_eq!(v, vec![1, 4096, 32 << 20]);
            }
            _ => panic!("unexpected info {it}"),
        }
        seen.push(it);
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]
    );
    r.option(OPT_ABORT, &[]);
    assert_eq!(r.opt_reply(OPT_ABORT).0, REP_ACK);
    assert!(r.closed());
    assert_eq!(
        Client::list(&srv.uri("")).unwrap(),
        vec!["disk".to_string()]
    );
    assert_still_serves(&srv);
}

#[test]
fn export_name_option_enters_transmission() {
    let (srv, _) = file_server(MIB);
    for no_zeroes in [true, false] {
        let mut r = Raw::connect(&srv);
        r.hello(FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 });
        r.option(OPT_EXPORT_NAME, b"disk");
        assert_eq!(r.u64(), MIB);
        let flags = r.u16();
        assert!(flags & FLAG_HAS_FLAGS != 0);
        if !no_zeroes {
            assert_eq!(r.bytes(124), vec![0; 124]);
        }
        r.request(CMD_READ, 0, 7, 0, 512);
        assert_eq!(r.simple_reply(), (0, 7));
        assert_eq!(r.bytes(512).len(), 512);
        r.request(CMD_DISC, 0, 8, 0, 0);
        assert!(r.closed());
    }
    // An unknown name on EXPORT_NAME can only be answered by closing.
    let mut r = Raw::connect(&srv);
    r.hello(FLAG_C_FIXED_NEWSTYLE);
    r.option(OPT_EXPORT_NAME, b"nope");
    assert!(r.closed());
    assert_still_serves(&srv);
}

#[test]
fn request_errors_simple_replies() {
    let (srv, _) = file_server(MIB);
    let mut r = Raw::connect(&srv);
    r.hello(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    let (size, _) = r.go("disk");
    assert_eq!(size, MIB);
    // Out of range read, trim: EINVAL; write, write zeroes: ENOSPC.
    r.request(CMD_READ, 0, 1, MIB - 512, 1024);
    assert_eq!(r.simple_reply(), (EINVAL, 1));
    r.request(CMD_READ, 0, 2, u64::MAX - 10, 512);
    assert_eq!(r.simple_reply(), (EINVAL, 2));
    r.request(CMD_TRIM, 0, 3, MIB, 1);
    assert_eq!(r.simple_reply(), (EINVAL, 3));
    r.request(CMD_WRITE, 0, 4, MIB - 2, 4);
    r.send(&[1, 2, 3, 4]);
    assert_eq!(r.simple_reply(), (ENOSPC, 4));
    r.request(CMD_WRITE_ZEROES, 0, 5, MIB, 4096);
    assert_eq!(r.simple_reply(), (ENOSPC, 5));
    // Unknown command, unknown flag, DF without structured replies.
    r.request(42, 0, 6, 0, 0);
    assert_eq!(r.simple_reply(), (EINVAL, 6));
    r.request(CMD_READ, 1 << 9, 7, 0, 512);
    assert_eq!(r.simple_reply(), (EINVAL, 7));
    r.request(CMD_READ, CMD_FLAG_DF, 8, 0, 512);
    assert_eq!(r.simple_reply(), (EINVAL, 8));
    // A write with a bad flag is refused, and its payload is consumed.
    r.request(CMD_WRITE, CMD_FLAG_NO_HOLE, 9, 0, 8);
    r.send(&[9; 8]);
    assert_eq!(r.simple_reply(), (EINVAL, 9));
    // Read longer than the maximum block size.
    r.request(CMD_READ, 0, 10, 0, (32 << 20) + 1);
    assert_eq!(r.simple_reply(), (EINVAL, 10));
    // FUA is accepted on every command.
    r.request(CMD_FLUSH, CMD_FLAG_FUA, 11, 0, 0);
    assert_eq!(r.simple_reply(), (0, 11));
    // The connection still works.
    r.request(CMD_WRITE, CMD_FLAG_FUA, 12, 100, 4);
    r.send(&[5, 6, 7, 8]);
    assert_eq!(r.simple_reply(), (0, 12));
    r.request(CMD_READ, 0, 13, 100, 4);
    assert_eq!(r.simple_reply(), (0, 13));
    assert_eq!(r.bytes(4), vec![5, 6, 7, 8]);
    // Bad request magic: disconnect.
    let mut b = vec![0xde, 0xad, 0xbe, 0xef];
    b.extend_from_slice(&[0; 24]);
    r.send(&b);
    assert!(r.closed());
    assert_still_serves(&srv);
}

#[test]
fn request_errors_structured_replies() {
    let (srv, _) = file_server(MIB);
    let mut r = Raw::connect(&srv);
    r.hello(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    r.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(r.opt_reply(OPT_STRUCTURED_REPLY).0, REP_ACK);
    let (_, flags) = r.go("disk");
    assert!(flags & FLAG_SEND_DF != 0);
    r.request(CMD_READ, CMD_FLAG_DF, 1, 4096, 100);
    assert_eq!(r.u32(), STRUCTURED_REPLY_MAGIC);
    assert_eq!(r.u16(), REPLY_FLAG_DONE);
    assert_eq!(r.u16(), REPLY_TYPE_OFFSET_DATA);
    assert_eq!(r.u64(), 1);
    assert_eq!(r.u32(), 108);
    assert_eq!(r.u64(), 4096);
    let data = r.bytes(100);
    let want: Vec<u8> = (4096..4196u64)
        .map(|i| (i.wrapping_mul(31) >> 3) as u8)
        .collect();
    assert_eq!(data, want);
    // Out of range: an error chunk with a message.
    r.request(CMD_READ, 0, 2, MIB, 1);
    assert_eq!(r.u32(), STRUCTURED_REPLY_MAGIC);
    assert_eq!(r.u16(), REPLY_FLAG_DONE);
    assert_eq!(r.u16(), REPLY_TYPE_ERROR);
    assert_eq!(r.u64(), 2);
    let len = r.u32() as usize;
    let body = r.bytes(len);
    assert_eq!(u32::from_be_bytes(body[..4].try_into().unwrap()), EINVAL);
    let ml = u16::from_be_bytes([body[4], body[5]]) as usize;
    assert_eq!(ml + 6, len);
    assert!(String::from_utf8_lossy(&body[6..]).contains("beyond the end"));
    // Read over the maximum with DF: EOVERFLOW.
    r.request(CMD_READ, CMD_FLAG_DF, 3, 0, (32 << 20) + 1);
    assert_eq!(r.u32(), STRUCTURED_REPLY_MAGIC);
    r.u16();
    r.u16();
    assert_eq!(r.u64(), 3);
    let len = r.u32() as usize;
    let body = r.bytes(len);
    assert_eq!(u32::from_be_bytes(body[..4].try_into().unwrap()), EOVERFLOW);
    // Non-read commands still get simple replies.
    r.request(CMD_FLUSH, 0, 4, 0, 0);
    assert_eq!(r.simple_reply(), (0, 4));
}

#[test]
fn oversized_writes_are_refused_without_buffering() {
    let dir = tempfile::tempdir().unwrap();
    let mut fe = FaultyExport::new(MIB as usize, u64::MAX, u64::MAX);
    fe.max_block = 64 << 10;
    let srv = TestServer::start_with(
        vec![("disk".into(), Arc::new(fe) as Arc<dyn Export>)],
        ServerOptions {
            max_drain: 256 << 10,
            ..Default::default()
        },
    );
    let _ = dir;
    let mut r = Raw::connect(&srv);
    r.hello(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    r.go("disk");
    // Over the block size but within the drain limit: payload discarded, EINVAL.
    r.request(CMD_WRITE, 0, 1, 0, 128 << 10);
    r.send(&vec![1u8; 128 << 10]);
    assert_eq!(r.simple_reply(), (EINVAL, 1));
    r.request(CMD_READ, 0, 2, 0, 16);
    assert_eq!(r.simple_reply(), (0, 2));
    assert_eq!(r.bytes(16), vec![0; 16]);
    // A huge write: the server closes instead of reading 3 GiB.
    r.request(CMD_WRITE, 0, 3, 0, 3 << 30);
    let _ = r.s.write_all(&[0; 4096]); // the server may already have closed
    assert!(r.closed());
    let mut c = Client::connect(&srv.uri("disk")).unwrap();
    c.write(0, &[7; 4096]).unwrap();
    let mut b = [0; 4096];
    c.read(0, &mut b).unwrap();
    assert_eq!(b, [7; 4096]);
}

#[test]
fn truncated_packets_and_disconnects_mid_request() {
    let (srv, _) = file_server(MIB);
    // Half a request header, then gone.
    let mut r = Raw::connect(&srv);
    r.hello(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    r.go("disk");
    r.send(&REQUEST_MAGIC.to_be_bytes());
    r.send(&[0; 6]);
    drop(r);
    // A write whose payload stops half-way.
    let mut r = Raw::connect(&srv);
    r.hello(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    r.go("disk");
    r.request(CMD_WRITE, 0, 1, 0, 65536);
    r.send(&[0xee; 1000]);
    drop(r);
    // Truncated option, truncated greeting.
    let mut r = Raw::connect(&srv);
    r.hello(FLAG_C_FIXED_NEWSTYLE);
    r.send(&IHAVEOPT.to_be_bytes());
    r.send(&OPT_GO.to_be_bytes());
    r.send(&100u32.to_be_bytes());
    r.send(&[0; 10]);
    drop(r);
    let r = Raw::connect(&srv);
    drop(r);
    // Reads in flight when the client vanishes.
    let mut r = Raw::connect(&srv);
    r.hello(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    r.go("disk");
    for h in 0..32 {
        r.request(CMD_READ, 0, h, h * 4096, 4096);
    }
    drop(r);
    assert_still_serves(&srv);
    // The half-written payload never reached the file as a write.
    let mut c = Client::connect(&srv.uri("disk")).unwrap();
    let mut b = vec![0; 1000];
    c.read(0, &mut b).unwrap();
    assert!(b.iter().any(|&x| x != 0xee));
    srv.stop();
}

#[test]
fn backing_errors_go_to_the_request_only() {
    let fe = FaultyExport::new(MIB as usize, 65536, 131072);
    let srv = TestServer::start(vec![("disk".into(), Arc::new(fe) as Arc<dyn Export>)]);
    for structured in [false, true] {
        let uri = NbdUri::parse(&srv.uri("disk")).unwrap();
        let mut c = Client::connect_with(
            &uri,
            &ClientOptions {
                structured_replies: structured,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(c.structured_replies(), structured);
        let mut b = vec![0u8; 4096];
        let e = c.read(65536 + 4096, &mut b).unwrap_err();
        assert_eq!(e.errno(), Some(EIO), "{e}");
        if structured {
            assert!(e.to_string().contains("EIO"), "{e}");
        }
        let e = c.write(130000, &[1; 4096]).unwrap_err();
        assert_eq!(e.errno(), Some(EIO));
        // Neighbours work.
        c.write(0, &[3; 4096]).unwrap();
        c.read(0, &mut b).unwrap();
        assert_eq!(b, vec![3; 4096]);
        c.read(131072, &mut b).unwrap();
        c.disconnect().unwrap();
    }
}

/// An export whose read at offset 0 waits until a read at another offset has finished (or,
/// with `manual`, until the test calls `open`), so the reply to the first request must come
/// after the reply to the second.
struct GateExport {
    inner: FaultyExport,
    manual: bool,
    opened: Mutex<bool>,
    cv: Condvar,
    /// Reads inside `read` right now.
    waiting: std::sync::atomic::AtomicUsize,
}

impl GateExport {
    fn new() -> GateExport {
        GateExport {
            inner: FaultyExport::new(MIB as usize, u64::MAX, u64::MAX),
            manual: false,
            opened: Mutex::new(false),
            cv: Condvar::new(),
            waiting: Default::default(),
        }
    }
    fn gated_read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if offset == 0 {
            let mut g = self.opened.lock().unwrap();
            while !*g {
                g = self.cv.wait(g).unwrap();
            }
        }
        let r = self.inner.read(offset, buf);
        if offset != 0 && !self.manual {
            self.open();
        }
        r
    }
    fn open(&self) {
        *self.opened.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

impl Export for GateExport {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let r = self.gated_read(offset, buf);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        r
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> std::io::Result<()> {
        self.inner.write(offset, data, fua)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.trim(offset, len)
    }
    fn write_zeroes(&self, o: u64, l: u64, f: bool, t: bool) -> std::io::Result<()> {
        self.inner.write_zeroes(o, l, f, t)
    }
    fn block_sizes(&self) -> BlockSizes {
        self.inner.block_sizes()
    }
}

#[test]
fn replies_out_of_order_with_a_slow_request() {
    // The gate opens only once the fast reply has arrived: opening it when the fast read
    // returned let the slow reply race the fast one onto the socket (a flaky test).
    let g = Arc::new(GateExport {
        manual: true,
        ..GateExport::new()
    });
    let srv = TestServer::start(vec![("disk".into(), g.clone() as Arc<dyn Export>)]);
    let mut c = Client::connect(&srv.uri("disk")).unwrap();
    let slow = c.submit_read(0, 4096).unwrap();
    let fast = c.submit_read(8192, 4096).unwrap();
    let first = c.wait_any().unwrap();
    assert_eq!(first.handle, fast);
    first.result.unwrap();
    g.open();
    let second = c.wait_any().unwrap();
    assert_eq!(second.handle, slow);
    second.result.unwrap();
}

#[test]
fn shutdown_lets_in_flight_requests_finish() {
    let g = Arc::new(GateExport::new());
    let srv = TestServer::start(vec![("disk".into(), g.clone() as Arc<dyn Export>)]);
    let mut c = Client::connect(&srv.uri("disk")).unwrap();
    let h = c.submit_read(0, 4096).unwrap();
    // Wait until the request is blocked inside the export.
    while g.waiting.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(2));
    }
    let opener = {
        let g = g.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            *g.opened.lock().unwrap() = true;
            g.cv.notify_all();
        })
    };
    srv.stop(); // returns only after the in-flight read was answered
    opener.join().unwrap();
    let done = c.wait(h).unwrap();
    done.result.unwrap();
    assert!(Client::connect(&format!(
        "nbd+unix:///disk?socket={}",
        "/nonexistent/after-shutdown.sock"
    ))
    .is_err());
}

#[test]
fn many_concurrent_connections() {
    let (srv, path) = file_server(8 * MIB);
    let uri = srv.uri("disk");
    let threads: Vec<_> = (0..32u64)
        .map(|t| {
            let uri = uri.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&uri).unwrap();
                let base = t * 256 * 1024;
                let data: Vec<u8> = (0..65536u64).map(|i| (i as u8) ^ (t as u8)).collect();
                let mut hs = vec![];
                for k in 0..4 {
                    hs.push(c.submit_write(base + k * 65536, &data, k == 3).unwrap());
                }
                for h in hs {
                    c.wait(h).unwrap().result.unwrap();
                }
                c.flush().unwrap();
                let mut b = vec![0; 65536];
                for k in 0..4 {
                    c.read(base + k * 65536, &mut b).unwrap();
                    assert_eq!(b, data);
                }
                c.disconnect().unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let file = std::fs::read(path).unwrap();
    for t in 0..32u64 {
        let at = (t * 256 * 1024 + 3 * 65536 + 5) as usize;
        assert_eq!(file[at], 5u8 ^ t as u8);
    }
}

#[test]
fn read_only_export_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = file_export(dir.path(), "ro.img", MIB);
    let e = tiercache_nbd::FileExport::open(&path, true).unwrap();
    let srv = TestServer::start(vec![("ro".into(), Arc::new(e) as Arc<dyn Export>)]);
    let mut c = Client::connect(&srv.uri("ro")).unwrap();
    assert!(c.read_only());
    assert_eq!(c.write(0, &[1; 512]).unwrap_err().errno(), Some(EPERM));
    assert_eq!(c.trim(0, 512).unwrap_err().errno(), Some(EPERM));
    assert_eq!(c.write_zeroes(0, 512).unwrap_err().errno(), Some(EPERM));
    let mut b = [0; 512];
    c.read(0, &mut b).unwrap();
}

#[test]
fn replay_counts_ops_and_writes_the_pattern() {
    let (srv, path) = file_server(4 * MIB);
    let mut c = Client::connect(&srv.uri("disk")).unwrap();
    let mut ops = vec![];
    for i in 0..200u64 {
        ops.push(ReplayOp {
            kind: ReplayOpKind::Write,
            offset: i * 4096,
            len: 4096,
            fua: false,
        });
    }
    for i in 0..300u64 {
        ops.push(ReplayOp {
            kind: ReplayOpKind::Read,
            offset: (i * 7919 % 1000) * 4096,
            len: 4096,
            fua: false,
        });
    }
    ops.push(ReplayOp {
        kind: ReplayOpKind::Flush,
        offset: 0,
        len: 0,
        fua: false,
    });
    ops.push(ReplayOp {
        kind: ReplayOpKind::Read,
        offset: 0,
        len: 0,
        fua: false,
    });
    let rep = replay(&mut c, ops, 16).unwrap();
    assert_eq!(rep.requests, 501);
    assert_eq!(rep.skipped, 1);
    assert_eq!(rep.errors, 0);
    assert_eq!(rep.bytes, 500 * 4096);
    let reads = &rep
        .ops
        .iter()
        .find(|(k, _)| *k == ReplayOpKind::Read)
        .unwrap()
        .1;
    assert_eq!(reads.requests, 300);
    assert!(reads.latency_p50_us > 0.0 && reads.latency_p50_us <= reads.latency_p99_us);
    let file = std::fs::read(path).unwrap();
    let want: Vec<u8> = (0..4096).map(tiercache_nbd::pattern_byte).collect();
    assert_eq!(&file[4096 * 17..4096 * 18], &want[..]);
}
