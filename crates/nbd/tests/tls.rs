//! NBD STARTTLS: libnbd's clients (nbdinfo, nbdcopy) connect with a pre-shared key
//! (`tls-psk-file=`) and with X.509 certificates (`tls-certificates=`); `require` refuses
//! every plaintext option but STARTTLS and ABORT with NBD_REP_ERR_TLS_REQD; wrong keys fail
//! the handshake without hurting the server. Tests whose tool is missing print SKIP.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tiercache_nbd::proto::*;
use tiercache_nbd::{Export, ServerOptions, TlsConfig, TlsMode};

const KEY: &str = "3e1f0c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f";

fn psk_file(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("keys.psk");
    std::fs::write(&p, format!("alice:{KEY}\n")).unwrap();
    p
}

fn tls_server(dir: &Path, size: u64, tls: TlsConfig) -> (TestServer, std::path::PathBuf) {
    let (path, e) = file_export(dir, "disk.img", size);
    let srv = TestServer::start_with(
        vec![("disk".into(), e as Arc<dyn Export>)],
        ServerOptions {
            tls: Some(tls),
            ..Default::default()
        },
    );
    (srv, path)
}

fn psk_uri(srv: &TestServer, psk: &Path) -> String {
    format!(
        "nbds+unix://alice@/disk?socket={}&tls-psk-file={}",
        srv.socket.display(),
        psk.display()
    )
}

fn nbdinfo_size(uri: &str) -> Result<u64, String> {
    let out = Command::new("nbdinfo")
        .args(["--size", uri])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("{e}"))
}

struct Raw(UnixStream);

impl Raw {
    fn connect(srv: &TestServer) -> Raw {
        let s = UnixStream::connect(&srv.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut r = Raw(s);
        let mut hello = [0u8; 18];
        r.0.read_exact(&mut hello).unwrap();
        r.0.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        r
    }
    fn option(&mut self, opt: u32, data: &[u8]) -> (u32, Vec<u8>) {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.0.write_all(&b).unwrap();
        let mut h = [0u8; 20];
        self.0.read_exact(&mut h).unwrap();
        assert_eq!(
            u64::from_be_bytes(h[..8].try_into().unwrap()),
            OPT_REPLY_MAGIC
        );
        assert_eq!(u32::from_be_bytes(h[8..12].try_into().unwrap()), opt);
        let typ = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut d = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        self.0.read_exact(&mut d).unwrap();
        (typ, d)
    }
}

fn go_data(name: &str) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&0u16.to_be_bytes());
    d
}

#[test]
fn require_refuses_plaintext_options_but_starttls_and_abort() {
    let dir = tempfile::tempdir().unwrap();
    let psk = psk_file(dir.path());
    let tls = TlsConfig::new(TlsMode::Require, Some(&psk), None).unwrap();
    let (srv, _) = tls_server(dir.path(), 1 << 20, tls);
    let mut r = Raw::connect(&srv);
    for (opt, data) in [
        (OPT_LIST, vec![]),
        (OPT_INFO, go_data("disk")),
        (OPT_GO, go_data("disk")),
        (OPT_STRUCTURED_REPLY, vec![]),
        (99, vec![1, 2, 3]),
    ] {
        let (typ, msg) = r.option(opt, &data);
        assert_eq!(
            typ,
            REP_ERR_TLS_REQD,
            "option {opt}: {}",
            String::from_utf8_lossy(&msg)
        );
    }
    // STARTTLS with data is invalid; a plain one is acknowledged.
    assert_eq!(r.option(OPT_STARTTLS, &[1]).0, REP_ERR_INVALID);
    assert_eq!(r.option(OPT_STARTTLS, &[]).0, REP_ACK);
    // ABORT is allowed in plaintext.
    let mut r = Raw::connect(&srv);
    assert_eq!(r.option(OPT_ABORT, &[]).0, REP_ACK);
    // EXPORT_NAME cannot be answered with an error: the connection closes.
    let mut r = Raw::connect(&srv);
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    b.extend_from_slice(&4u32.to_be_bytes());
    b.extend_from_slice(b"disk");
    r.0.write_all(&b).unwrap();
    let mut x = [0u8; 1];
    assert!(matches!(r.0.read(&mut x), Ok(0) | Err(_)));
    srv.stop();
}

#[test]
fn without_tls_starttls_is_unsupported_and_export_names_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (_p, e) = file_export(dir.path(), "d.img", 1 << 20);
    let srv = TestServer::start(vec![("disk".into(), e as Arc<dyn Export>)]);
    let mut r = Raw::connect(&srv);
    assert_eq!(r.option(OPT_STARTTLS, &[]).0, REP_ERR_UNSUP);
    let (typ, msg) = r.option(OPT_GO, &go_data("nope"));
    assert_eq!(typ, REP_ERR_UNKNOWN);
    assert!(String::from_utf8_lossy(&msg).contains("nope"));
    let long = "x".repeat(4097);
    assert_eq!(r.option(OPT_INFO, &go_data(&long)).0, REP_ERR_INVALID);
    let mut bad = 2u32.to_be_bytes().to_vec();
    bad.extend_from_slice(&[0xff, 0xfe, 0, 0]);
    let (typ, msg) = r.option(OPT_GO, &bad);
    assert_eq!(typ, REP_ERR_INVALID);
    assert!(String::from_utf8_lossy(&msg).contains("UTF-8"));
    // A 4096-byte name is legal, just unknown.
    assert_eq!(
        r.option(OPT_INFO, &go_data(&"y".repeat(4096))).0,
        REP_ERR_UNKNOWN
    );
    srv.stop();
}

#[test]
fn nbdinfo_and_nbdcopy_over_tls_psk() {
    if !have("nbdinfo") || !have("nbdcopy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let psk = psk_file(dir.path());
    let tls = TlsConfig::new(TlsMode::Require, Some(&psk), None).unwrap();
    let size = 8u64 << 20;
    let (srv, img) = tls_server(dir.path(), size, tls);
    let uri = psk_uri(&srv, &psk);
    assert_eq!(nbdinfo_size(&uri).unwrap(), size);
    // Plaintext is refused.
    let plain = srv.uri("disk");
    let e = nbdinfo_size(&plain).unwrap_err();
    assert!(e.to_lowercase().contains("tls"), "{e}");
    // Round trip of random data through the TLS connection.
    let src = dir.path().join("src.bin");
    let data: Vec<u8> = (0..size)
        .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    run(Command::new("nbdcopy").args([
        "--connections=4",
        "--requests=32",
        src.to_str().unwrap(),
        &uri,
    ]));
    let back = dir.path().join("back.bin");
    run(Command::new("nbdcopy").args([&uri, back.to_str().unwrap()]));
    assert!(std::fs::read(&back).unwrap() == data, "TLS round trip");
    assert!(std::fs::read(&img).unwrap() == data, "export file content");
    // A wrong key and an unknown user fail the handshake; the server goes on.
    let wrong = dir.path().join("wrong.psk");
    std::fs::write(&wrong, format!("alice:{}\n", KEY.replace('3', "4"))).unwrap();
    assert!(nbdinfo_size(&psk_uri(&srv, &wrong)).is_err());
    let bob = psk_uri(&srv, &psk).replace("alice@", "bob@");
    assert!(nbdinfo_size(&bob).is_err());
    assert_eq!(nbdinfo_size(&uri).unwrap(), size);
    srv.stop();
}

/// `dir/pki` with a CA and a server certificate for localhost (None: no openssl command).
fn pki(dir: &Path) -> Option<std::path::PathBuf> {
    let certs = dir.join("pki");
    std::fs::create_dir(&certs).unwrap();
    make_certs(&certs).then_some(certs)
}

/// A CA and a server certificate for localhost, made with the openssl command.
fn make_certs(dir: &Path) -> bool {
    make_certs_for(dir, "DNS:localhost,IP:127.0.0.1")
}

fn make_certs_for(dir: &Path, san: &str) -> bool {
    if !have("openssl") {
        return false;
    }
    let sh = format!(
        r#"set -e
cd '{d}'
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca-key.pem -out ca-cert.pem -days 2 -subj /CN=tiercache-test-ca 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout server-key.pem -out server.csr -subj /CN=localhost 2>/dev/null
printf 'subjectAltName={san}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' > ext.cnf
openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -out server-cert.pem -days 2 -extfile ext.cnf 2>/dev/null
"#,
        d = dir.display(),
        san = san
    );
    run(Command::new("sh").args(["-c", &sh]));
    true
}

#[test]
fn nbdinfo_and_nbdcopy_over_tls_x509() {
    if !have("nbdinfo") || !have("nbdcopy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(certs) = pki(dir.path()) else {
        return;
    };
    // The client directory holds only the CA (libnbd reads ca-cert.pem from it).
    let client = dir.path().join("client-pki");
    std::fs::create_dir(&client).unwrap();
    std::fs::copy(certs.join("ca-cert.pem"), client.join("ca-cert.pem")).unwrap();
    let tls = TlsConfig::new(TlsMode::On, None, Some(&certs)).unwrap();
    let size = 4u64 << 20;
    let (_p, e) = file_export(dir.path(), "disk.img", size);
    let exports = vec![("disk".to_string(), e as Arc<dyn Export>)];
    let opts = ServerOptions {
        tls: Some(tls),
        ..Default::default()
    };
    // Unix socket: libnbd has no host name to check there, so the CA check is done over TCP.
    let srv = TestServer::start_with(exports.clone(), opts.clone());
    let tcp = tiercache_nbd::Server::new(exports).with_options(opts);
    let stop = tcp.shutdown_handle();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = std::thread::spawn(move || tcp.serve_tcp(([127, 0, 0, 1], port).into()));
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let uri = format!(
        "nbds://localhost:{port}/disk?tls-certificates={}",
        client.display()
    );
    assert_eq!(nbdinfo_size(&uri).unwrap(), size);
    let unix_uri = format!(
        "nbds+unix:///disk?socket={}&tls-certificates={}",
        srv.socket.display(),
        client.display()
    );
    assert_eq!(nbdinfo_size(&unix_uri).unwrap(), size);
    // `on` also serves plaintext clients.
    assert_eq!(nbdinfo_size(&srv.uri("disk")).unwrap(), size);
    let src = dir.path().join("src.bin");
    let data: Vec<u8> = (0..size).map(|i| (i * 7 + (i >> 12)) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    run(Command::new("nbdcopy").args(["--requests=32", src.to_str().unwrap(), &uri]));
    let back = dir.path().join("back.bin");
    run(Command::new("nbdcopy").args([&unix_uri, back.to_str().unwrap()]));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "X.509 TLS round trip"
    );
    // A client trusting another CA refuses the server.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    assert!(make_certs(&other));
    let other_client = dir.path().join("other-client");
    std::fs::create_dir(&other_client).unwrap();
    std::fs::copy(other.join("ca-cert.pem"), other_client.join("ca-cert.pem")).unwrap();
    let bad = uri.replace(client.to_str().unwrap(), other_client.to_str().unwrap());
    let e = nbdinfo_size(&bad).unwrap_err();
    assert!(e.contains("certificate"), "untrusted CA: {e}");
    assert_eq!(nbdinfo_size(&uri).unwrap(), size, "server still serves");
    stop.shutdown();
    t.join().unwrap().unwrap();
    srv.stop();
}

#[test]
fn psk_file_errors_name_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("k.psk");
    for (text, want) in [
        ("alice:0011\nbob\n", ":2:"),
        ("alice:0g11\n", "not hexadecimal"),
        ("alice:001\n", "even number"),
        ("\n", "no username"),
    ] {
        std::fs::write(&p, text).unwrap();
        let e = tiercache_nbd::read_psk_file(&p).unwrap_err().to_string();
        assert!(e.contains("k.psk") && e.contains(want), "{text:?}: {e}");
    }
    let e = TlsConfig::new(TlsMode::On, None, Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("server-cert.pem"), "{e}");
}

/// The crate's own client speaks TLS too: PSK on a unix socket (many requests in flight),
/// X.509 over TCP with the host name checked; wrong keys and plaintext-to-`require` fail.
#[test]
fn rust_client_over_tls_psk_and_x509() {
    let dir = tempfile::tempdir().unwrap();
    let psk = psk_file(dir.path());
    let tls = TlsConfig::new(TlsMode::Require, Some(&psk), None).unwrap();
    let (srv, _img) = tls_server(dir.path(), 2 << 20, tls);
    let uri = psk_uri(&srv, &psk);
    let mut c = tiercache_nbd::Client::connect(&uri).unwrap();
    assert_eq!(c.size(), 2 << 20);
    let mut handles = Vec::new();
    for i in 0..64u64 {
        let data = vec![(i * 3 + 1) as u8; 16 << 10];
        handles.push(c.submit_write(i * (16 << 10), &data, false).unwrap());
    }
    for _ in 0..64 {
        c.wait_any().unwrap().result.unwrap();
    }
    c.flush().unwrap();
    for i in 0..64u64 {
        let mut b = vec![0u8; 16 << 10];
        c.read(i * (16 << 10), &mut b).unwrap();
        assert!(b.iter().all(|&x| x == (i * 3 + 1) as u8), "block {i}");
    }
    c.disconnect().unwrap();
    // Listing exports works over TLS as well (and is refused in plaintext under `require`).
    assert_eq!(
        tiercache_nbd::Client::list(&uri).unwrap(),
        vec!["disk".to_string()]
    );
    assert!(tiercache_nbd::Client::list(&srv.uri("")).is_err());
    // Plaintext against `require`: refused with TLS required.
    let e = tiercache_nbd::Client::connect(&srv.uri("disk"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("TLS required"), "{e}");
    // A wrong key fails the handshake.
    let wrong = dir.path().join("wrong.psk");
    std::fs::write(&wrong, format!("alice:{}\n", KEY.replace('3', "4"))).unwrap();
    assert!(tiercache_nbd::Client::connect(&psk_uri(&srv, &wrong)).is_err());
    let e = tiercache_nbd::Client::connect(&psk_uri(&srv, &psk).replace("alice@", "carol@"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("carol"), "{e}");
    srv.stop();

    // X.509 over TCP.
    let certs = dir.path().join("pki");
    std::fs::create_dir(&certs).unwrap();
    if !make_certs(&certs) {
        return;
    }
    let client = dir.path().join("client-pki");
    std::fs::create_dir(&client).unwrap();
    std::fs::copy(certs.join("ca-cert.pem"), client.join("ca-cert.pem")).unwrap();
    let (_p, e) = file_export(dir.path(), "x.img", 1 << 20);
    let tcp = tiercache_nbd::Server::new(vec![("disk".into(), e as Arc<dyn Export>)]).with_options(
        ServerOptions {
            tls: Some(TlsConfig::new(TlsMode::Require, None, Some(&certs)).unwrap()),
            ..Default::default()
        },
    );
    let stop = tcp.shutdown_handle();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = std::thread::spawn(move || tcp.serve_tcp(([127, 0, 0, 1], port).into()));
    let good = format!(
        "nbds://localhost:{port}/disk?tls-certificates={}",
        client.display()
    );
    let mut c = None;
    for _ in 0..200 {
        match tiercache_nbd::Client::connect(&good) {
            Ok(x) => {
                c = Some(x);
                break;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    let mut c = c.expect("X.509 TLS connection");
    c.write(4096, &[9u8; 4096]).unwrap();
    let mut b = vec![0u8; 4096];
    c.read(4096, &mut b).unwrap();
    assert_eq!(b, vec![9u8; 4096]);
    c.disconnect().unwrap();
    stop.shutdown();
    t.join().unwrap().unwrap();
    // A certificate (from the trusted CA) for another host name is refused.
    let other = dir.path().join("other-host");
    std::fs::create_dir(&other).unwrap();
    std::fs::copy(certs.join("ca-cert.pem"), other.join("ca-cert.pem")).unwrap();
    std::fs::copy(certs.join("ca-key.pem"), other.join("ca-key.pem")).unwrap();
    let sh = format!(
        "set -e; cd '{}'; openssl req -newkey rsa:2048 -nodes -keyout server-key.pem -out s.csr -subj /CN=elsewhere 2>/dev/null; printf 'subjectAltName=DNS:elsewhere.invalid\\n' > e.cnf; openssl x509 -req -in s.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -out server-cert.pem -days 2 -extfile e.cnf 2>/dev/null",
        other.display()
    );
    run(Command::new("sh").args(["-c", &sh]));
    let (_p, e) = file_export(dir.path(), "y.img", 1 << 20);
    let tcp = tiercache_nbd::Server::new(vec![("disk".into(), e as Arc<dyn Export>)]).with_options(
        ServerOptions {
            tls: Some(TlsConfig::new(TlsMode::Require, None, Some(&other)).unwrap()),
            ..Default::default()
        },
    );
    let stop = tcp.shutdown_handle();
    let t = std::thread::spawn(move || tcp.serve_tcp(([127, 0, 0, 1], port).into()));
    let mut last = String::new();
    for _ in 0..200 {
        match tiercache_nbd::Client::connect(&good) {
            Ok(_) => panic!("a certificate for elsewhere.invalid accepted for localhost"),
            Err(e) if e.to_string().contains("TLS handshake") => {
                last = e.to_string();
                break;
            }
            Err(e) => {
                last = e.to_string();
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    assert!(last.contains("TLS handshake"), "{last}");
    stop.shutdown();
    t.join().unwrap().unwrap();
}

/// A client that finishes the TLS handshake and then says nothing is dropped at the
/// handshake timeout, like a plaintext one.
#[test]
fn idle_client_after_starttls_is_dropped_at_the_handshake_timeout() {
    use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
    let dir = tempfile::tempdir().unwrap();
    let psk = psk_file(dir.path());
    let (_p, e) = file_export(dir.path(), "d.img", 1 << 20);
    let srv = TestServer::start_with(
        vec![("disk".into(), e as Arc<dyn Export>)],
        ServerOptions {
            tls: Some(TlsConfig::new(TlsMode::Require, Some(&psk), None).unwrap()),
            handshake_deadline: Some(Duration::from_millis(500)),
            ..Default::default()
        },
    );
    let mut r = Raw::connect(&srv);
    assert_eq!(r.option(OPT_STARTTLS, &[]).0, REP_ACK);
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_verify(SslVerifyMode::NONE);
    let key: Vec<u8> = (0..KEY.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&KEY[i..i + 2], 16).unwrap())
        .collect();
    // SslConnector's default list leaves out the TLS 1.2 PSK suites.
    b.set_cipher_list("ECDHE-PSK:DHE-PSK:PSK").unwrap();
    b.set_psk_client_callback(move |_, _, id, k| {
        id[..6].copy_from_slice(b"alice\0");
        k[..key.len()].copy_from_slice(&key);
        Ok(key.len())
    });
    let conn = b.build();
    let mut cfg = conn.configure().unwrap();
    cfg.set_verify_hostname(false);
    let mut tls = cfg.connect("localhost", r.0.try_clone().unwrap()).unwrap();
    assert_eq!(tls.ssl().version_str(), "TLSv1.3");
    let t = Instant::now();
    let mut x = [0u8; 1];
    let n = tls.ssl_read(&mut x);
    assert!(!matches!(n, Ok(k) if k > 0), "server sent data unasked");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "idle TLS client kept for {:?}",
        t.elapsed()
    );
    // TLS 1.2 clients get a PSK cipher suite.
    let mut r = Raw::connect(&srv);
    assert_eq!(r.option(OPT_STARTTLS, &[]).0, REP_ACK);
    let mut cfg = conn.configure().unwrap();
    cfg.set_verify_hostname(false);
    let ssl = cfg.into_ssl("localhost").unwrap();
    let mut ssl = ssl;
    ssl.set_max_proto_version(Some(openssl::ssl::SslVersion::TLS1_2))
        .unwrap();
    let tls = ssl.connect(r.0.try_clone().unwrap()).unwrap();
    assert_eq!(tls.ssl().version_str(), "TLSv1.2");
    let cipher = tls.ssl().current_cipher().unwrap().name();
    assert!(cipher.contains("PSK"), "{cipher}");
    srv.stop();
}

/// `verify_peer`: an X.509 client without a certificate from the server's CA is refused; one
/// with a client certificate signed by it (libnbd reads client-cert.pem / client-key.pem from
/// its tls-certificates directory) gets the export.
#[test]
fn verify_peer_requires_a_client_certificate_from_the_ca() {
    if !have("nbdinfo") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(certs) = pki(dir.path()) else {
        return;
    };
    assert!(
        TlsConfig::build(TlsMode::Require, None, Some(dir.path()), true).is_err(),
        "verify_peer without a ca-cert.pem must be refused"
    );
    let tls = TlsConfig::build(TlsMode::Require, None, Some(&certs), true).unwrap();
    let size = 1u64 << 20;
    let (_p, e) = file_export(dir.path(), "disk.img", size);
    let srv = TestServer::start_with(
        vec![("disk".to_string(), e as Arc<dyn Export>)],
        ServerOptions {
            tls: Some(tls),
            ..Default::default()
        },
    );
    let uri_for = |d: &Path| {
        format!(
            "nbds+unix:///disk?socket={}&tls-certificates={}",
            srv.socket.display(),
            d.display()
        )
    };
    // Only the CA: no client certificate to show.
    let anon = dir.path().join("anon");
    std::fs::create_dir(&anon).unwrap();
    std::fs::copy(certs.join("ca-cert.pem"), anon.join("ca-cert.pem")).unwrap();
    assert!(
        nbdinfo_size(&uri_for(&anon)).is_err(),
        "no client certificate"
    );
    // A client certificate signed by the CA.
    let me = dir.path().join("me");
    std::fs::create_dir(&me).unwrap();
    std::fs::copy(certs.join("ca-cert.pem"), me.join("ca-cert.pem")).unwrap();
    let sh = format!(
        r#"set -e
cd '{d}'
openssl req -newkey rsa:2048 -nodes -keyout client-key.pem -out client.csr -subj /CN=alice 2>/dev/null
printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > ext.cnf
openssl x509 -req -in client.csr -CA '{ca}/ca-cert.pem' -CAkey '{ca}/ca-key.pem' -CAcreateserial -out client-cert.pem -days 2 -extfile ext.cnf 2>/dev/null
"#,
        d = me.display(),
        ca = certs.display()
    );
    run(Command::new("sh").args(["-c", &sh]));
    assert_eq!(nbdinfo_size(&uri_for(&me)).unwrap(), size);
    srv.stop();
}

/// A TLS client that pipelines large READs and never reads the replies is cut off at the
/// write timeout like a plaintext one (the writer thread blocks inside the TLS session), and
/// the server goes on serving TLS clients.
#[test]
fn deaf_tls_client_is_dropped_at_the_write_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let psk = psk_file(dir.path());
    let tls = TlsConfig::new(TlsMode::Require, Some(&psk), None).unwrap();
    let size = 64u64 << 20;
    let (_p, e) = file_export(dir.path(), "disk.img", size);
    let srv = TestServer::start_with(
        vec![("disk".into(), e as Arc<dyn Export>)],
        ServerOptions {
            tls: Some(tls),
            write_timeout: Some(Duration::from_secs(1)),
            ..Default::default()
        },
    );
    let uri = psk_uri(&srv, &psk);
    let mut deaf = tiercache_nbd::Client::connect(&uri).unwrap();
    // On a loaded machine the server may cut the client off before all 16 are sent.
    let mut submitted = 0;
    for i in 0..16u64 {
        if deaf.submit_read((i % 2) * (32 << 20), 32 << 20).is_err() {
            break;
        }
        submitted += 1;
    }
    std::thread::sleep(Duration::from_millis(2500));
    // Whatever the socket buffers held can still be read, then the connection ends.
    let mut done = 0;
    let cut = submitted < 16
        || loop {
            match deaf.wait_any() {
                Ok(_) => done += 1,
                Err(_) => break true,
            }
            if done == 16 {
                break false;
            }
        };
    assert!(
        cut,
        "all {done} replies came: the deaf TLS client was not cut off"
    );
    println!("deaf TLS client cut off after {submitted} requests and {done} replies");
    let mut c = tiercache_nbd::Client::connect(&uri).unwrap();
    let mut b = vec![0u8; 4096];
    c.read(0, &mut b).unwrap();
    srv.stop();
}
