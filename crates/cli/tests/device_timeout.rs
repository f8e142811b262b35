//! A backing device that stops answering (a hung NBD server, a dead host, a partitioned
//! network): `serve --device-timeout` fails the requests that need it, within the timeout,
//! instead of hanging them and every client behind the volume; cached data is still served
//! meanwhile; once the device answers again the volume reconnects and serves it. Both layouts.
//! The fault device is a proxy in front of nbdkit that holds the server's replies while it is
//! stalled (the connection stays open, as with a hung server). nbdkit or qemu-io missing:
//! `SKIP:` message.

mod common;

use common::{have, Srv};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A unix-socket proxy to `upstream` whose replies stall while `stall` is set: bytes from the
/// server are read and held, the connection stays open, nothing answers. Unstalled, the held
/// bytes go through (late replies, to whoever still listens).
struct StallProxy {
    path: PathBuf,
    stall: Arc<AtomicBool>,
}

impl StallProxy {
    fn start(path: &Path, upstream: &Path) -> StallProxy {
        let l = UnixListener::bind(path).unwrap();
        let stall = Arc::new(AtomicBool::new(false));
        let (st, up) = (Arc::clone(&stall), upstream.to_path_buf());
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(client) = c else { return };
                let Ok(server) = UnixStream::connect(&up) else {
                    return;
                };
                let (mut c_in, mut s_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_in, &mut s_out);
                    let _ = s_out.shutdown(std::net::Shutdown::Both);
                });
                let (mut s_in, mut c_out, st) = (server, client, Arc::clone(&st));
                std::thread::spawn(move || {
                    let mut b = vec![0u8; 1 << 16];
                    loop {
                        let n = match s_in.read(&mut b) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        while st.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        if c_out.write_all(&b[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = c_out.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        StallProxy {
            path: path.to_path_buf(),
            stall,
        }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.path.display())
    }

    fn set(&self, stalled: bool) {
        self.stall.store(stalled, Ordering::SeqCst);
    }
}

impl Drop for StallProxy {
    /// A failed test must not leave the server's requests held.
    fn drop(&mut self) {
        self.set(false);
    }
}

/// `qemu-io -c CMD` against the server, killed after `limit`: (finished in time, succeeded,
/// output, seconds taken). qemu-io exits 0 after a failed command, so success is read from
/// its output too.
fn qemu_io(srv: &Srv, cmd: &str, limit: Duration) -> (bool, bool, String, f64) {
    let t = Instant::now();
    let mut child = Command::new("qemu-io")
        .args(["-f", "raw", "-c", cmd])
        .arg(srv.uri())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return (false, false, String::new(), t.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let ok = out.status.success() && !text.contains("failed") && !text.contains("mismatch");
    (true, ok, text, t.elapsed().as_secs_f64())
}

fn stalled_backing_fails_requests_in_time(layout: &[&str]) {
    if !have("nbdkit") || !have("qemu-io") {
        return;
    }
    let dir = common::tmp();
    let d = dir.path();
    let _mem = common::NbdkitProc::start(&d.join("mem.sock"), &["memory", "64M"]);
    let proxy = StallProxy::start(&d.join("proxy.sock"), &d.join("mem.sock"));
    let mut args = vec!["--mode", "write-through", "--device-timeout", "1"];
    args.extend(layout);
    let srv = Srv::launch(d, &proxy.uri(), "16M", &args);
    let long = Duration::from_secs(30);
    let (_, ok, out, _) = qemu_io(&srv, "write -P 0xab 0 1M", long);
    assert!(ok, "{out}");
    let (_, ok, out, _) = qemu_io(&srv, "read -P 0xab 0 1M", long);
    assert!(ok, "{out}");

    proxy.set(true);
    // A miss needs the backing device, which holds its answer: the read fails in about the
    // timeout, it does not wait for the device (before: it hung until the device answered).
    let (done, ok, out, secs) = qemu_io(&srv, "read 32M 64k", Duration::from_secs(20));
    assert!(
        done,
        "a read of a stalled backing device hung for {secs:.1} s (--device-timeout 1)"
    );
    assert!(!ok, "a read of a stalled backing device succeeded: {out}");
    assert!(secs < 15.0, "the failure took {secs:.1} s: {out}");
    // Cached data is still served, and the server still answers its control socket.
    let (done, ok, out, secs) = qemu_io(&srv, "read -P 0xab 0 1M", Duration::from_secs(20));
    assert!(
        done && ok,
        "cached data not served while the backing device stalls ({secs:.1} s): {out}"
    );
    let v = srv.stats();
    assert!(v["layout"].is_string(), "{v}");

    // The device answers again: the volume reconnects, old and new data read back.
    proxy.set(false);
    let (_, ok, out, _) = qemu_io(&srv, "read -P 0 32M 64k", long);
    assert!(ok, "after the device came back: {out}");
    let (_, ok, out, _) = qemu_io(&srv, "write -P 0xcd 40M 64k", long);
    assert!(ok, "after the device came back: {out}");
    let (_, ok, out, _) = qemu_io(&srv, "read -P 0xcd 40M 64k", long);
    assert!(ok, "{out}");
    let (_, ok, out, _) = qemu_io(&srv, "read -P 0xab 0 1M", long);
    assert!(ok, "{out}");
    srv.stop("-TERM");
}

#[test]
fn direct_layout_fails_requests_of_a_stalled_backing_device_in_time() {
    stalled_backing_fails_requests_in_time(&[]);
}

#[test]
fn log_layout_fails_requests_of_a_stalled_backing_device_in_time() {
    stalled_backing_fails_requests_in_time(&["--layout", "log", "--segment-size", "256k"]);
}

#[test]
fn device_timeout_is_checked() {
    let dir = common::tmp();
    let d = dir.path();
    std::fs::File::create(d.join("backing.img"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let (cache, backing) = (d.join("cache.img"), d.join("backing.img"));
    let (cache, backing) = (cache.to_str().unwrap(), backing.to_str().unwrap());
    let err = common::serve_refused(
        d,
        &[
            "--cache",
            cache,
            "--backing",
            backing,
            "--cache-size",
            "8M",
            "--format-if-needed",
            "--device-timeout=-1",
        ],
    );
    assert!(
        err.contains("--device-timeout -1") && err.contains("negative"),
        "{err}"
    );
}
