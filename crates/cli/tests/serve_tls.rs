//! `tiercache serve --listen PORT --tls require --tls-psk-file FILE`: a bare port binds
//! loopback only, nbdinfo gets in with the key over TLS and is refused in plaintext, and the
//! server shuts down cleanly. Skips (printed) without nbdinfo.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tiercache");

#[test]
fn bare_port_is_loopback_and_tls_require_refuses_plaintext() {
    if Command::new("nbdinfo").arg("--version").output().is_err() {
        tiercache_testskip::skip!("nbdinfo is not installed (apt-get install -y libnbd-bin)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let psk = d.join("k.psk");
    std::fs::write(&psk, "ops:00112233445566778899aabbccddeeff\n").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = d.join("serve.log");
    let mut child = Command::new(BIN)
        .arg("serve")
        .arg("--cache")
        .arg(d.join("cache.img"))
        .arg("--backing")
        .arg(d.join("backing.img"))
        .args(["--format-if-needed", "--cache-size", "4M"])
        .args([
            "--listen",
            &port.to_string(),
            "--tls",
            "require",
            "--tls-psk-file",
        ])
        .arg(&psk)
        .stderr(std::fs::File::create(&log).unwrap())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "server did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!("serving NBD on 127.0.0.1:{port}")),
        "{text}"
    );
    // Listening on loopback only: /proc/net/tcp shows local address 0100007F:PORT in LISTEN.
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let want = format!("0100007F:{port:04X}");
    assert!(
        tcp.lines()
            .any(|l| l.split_whitespace().nth(1) == Some(&want)
                && l.split_whitespace().nth(3) == Some("0A")),
        "no loopback LISTEN socket on port {port}"
    );
    assert!(
        !tcp.lines()
            .any(|l| l.split_whitespace().nth(1) == Some(&format!("00000000:{port:04X}"))),
        "bound to every interface"
    );
    let size = |uri: &str| {
        Command::new("nbdinfo")
            .args(["--size", uri])
            .output()
            .unwrap()
    };
    let o = size(&format!(
        "nbds://ops@127.0.0.1:{port}/tiercache?tls-psk-file={}",
        psk.display()
    ));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "16777216");
    let o = size(&format!("nbd://127.0.0.1:{port}/tiercache"));
    assert!(!o.status.success(), "plaintext accepted");
    let err = String::from_utf8_lossy(&o.stderr).to_lowercase();
    assert!(err.contains("tls"), "{err}");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(child.wait().unwrap().success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("shut down cleanly"), "{text}");
}
