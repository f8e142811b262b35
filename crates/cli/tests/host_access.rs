//! Who on the host can reach a served volume (issue 14, item 9), and what `--format-if-needed`
//! may format (item 3): sockets and the cache file are private whatever the umask, the control
//! socket refuses other users by uid, TCP without `--tls require` and metrics off loopback are
//! warned about, and a damaged cache is never reformatted.

mod common;

use common::{Srv, BIN};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A 0755 directory on tmpfs (other users may traverse it) holding a 16 MiB backing file.
fn setup() -> tempfile::TempDir {
    let dir = common::tmp();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let f = std::fs::File::create(dir.path().join("backing.img")).unwrap();
    f.set_len(16 << 20).unwrap();
    dir
}

fn mode_of(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().mode() & 0o777
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The server started with umask 000.
fn umask_000(c: &mut Command) {
    // SAFETY: umask is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
}

/// At umask 000 (where a plain bind makes srwxrwxrwx sockets and a 0666 file) the NBD socket,
/// the control socket and the cache file `--format-if-needed` creates are 0600; with
/// `--socket-group` the NBD socket is 0660 and owned by that group, the control socket stays
/// 0600.
#[test]
fn sockets_and_cache_file_are_private_under_umask_000() {
    let dir = setup();
    let d = dir.path();
    let srv = Srv::launch_with(
        d,
        &d.join("backing.img").display().to_string(),
        "8M",
        &[],
        umask_000,
    );
    let modes = [
        ("NBD socket", mode_of(&srv.sock)),
        ("control socket", mode_of(&srv.ctl)),
        ("cache file", mode_of(&d.join("cache.img"))),
    ];
    for (what, m) in modes {
        assert_eq!(
            m, 0o600,
            "{what} is {m:o} at umask 000: {modes:?} (decimal)"
        );
    }
    srv.stop("-TERM");

    // SAFETY: getegid cannot fail.
    let gid = unsafe { libc::getegid() };
    let srv = Srv::launch_with(
        d,
        &d.join("backing.img").display().to_string(),
        "8M",
        &["--socket-group", &gid.to_string()],
        umask_000,
    );
    assert_eq!(mode_of(&srv.sock), 0o660);
    assert_eq!(std::fs::metadata(&srv.sock).unwrap().gid(), gid);
    assert_eq!(
        mode_of(&srv.ctl),
        0o600,
        "--socket-group leaves the control socket private"
    );
    srv.stop("-TERM");
}

/// `tiercache ctl` run as user `nobody`: refused while the control socket is 0600 (the file
/// system says no), and still refused — by the server, from the peer's uid — when the socket
/// is made world-writable by hand; the volume's mode is unchanged and the refusal is logged.
#[test]
fn control_socket_refuses_other_uids() {
    if !is_root() {
        tiercache_testskip::skip!("needs root to run a client as user nobody (uid 65534)");
        return;
    }
    let dir = setup();
    let d = dir.path();
    let srv = Srv::start(d, &["--mode", "write-back"]);
    // The checkout may sit in a directory user nobody cannot enter (a CI clone in a 0700
    // temp dir): nobody runs a copy of the binary from the test's 0755 directory.
    let bin = d.join("tiercache-as-nobody");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let as_nobody = |args: &[&str]| {
        // ETXTBSY while a child another test thread forks still holds the copy's write fd
        // (until it execs): retry, as a shell would have to.
        for _ in 0..100 {
            match Command::new(&bin)
                .arg("ctl")
                .arg("--control")
                .arg(&srv.ctl)
                .args(args)
                .uid(65534)
                .gid(65534)
                .output()
            {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                r => return r.unwrap(),
            }
        }
        panic!("{}: text file busy for 2 s", bin.display());
    };
    let out = as_nobody(&["mode", "pass-through"]);
    assert!(
        !out.status.success(),
        "nobody switched the mode of a 0600 socket"
    );
    std::fs::set_permissions(&srv.ctl, std::fs::Permissions::from_mode(0o666)).unwrap();
    for args in [&["mode", "pass-through"][..], &["detach"], &["stats"]] {
        let out = as_nobody(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("permission denied") && err.contains("65534"),
            "nobody ran `ctl {args:?}` on the control socket: {}{err}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let stats: serde_json::Value = serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
    assert_eq!(
        stats["mode"], "write-back",
        "root (the server's uid) is served"
    );
    let log = srv.stop("-TERM");
    assert!(
        log.contains("refused a client") && log.contains("uid 65534"),
        "{log}"
    );
}

/// Starts `tiercache serve ARGS`, reads its stderr until it serves (or exits), stops it and
/// returns what it printed.
fn start_log(d: &Path, args: &[&str]) -> String {
    let mut child = Command::new(BIN)
        .arg("serve")
        .arg("--cache")
        .arg(d.join("cache.img"))
        .arg("--backing")
        .arg(d.join("backing.img"))
        .args(["--format-if-needed", "--cache-size", "8M"])
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        log.push_str(&line);
        log.push('\n');
        if line.contains("serving NBD on") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    log
}

/// NBD over TCP without `--tls require` warns at start: every local user (loopback), anyone
/// who can reach it (another address); so does a metrics endpoint off loopback. A unix
/// socket and a loopback metrics endpoint do not.
#[test]
fn tcp_without_tls_and_metrics_off_loopback_warn() {
    let dir = setup();
    let d = dir.path();
    let log = start_log(d, &["--listen", "127.0.0.1:0", "--metrics", "0.0.0.0:0"]);
    assert!(
        log.contains("warning: NBD on 127.0.0.1:0 without --tls require: every local user can read and write the volume"),
        "{log}"
    );
    assert!(
        log.contains("warning: metrics endpoint on 0.0.0.0:0 is off loopback"),
        "{log}"
    );
    let log = start_log(d, &["--listen", "0.0.0.0:0"]);
    assert!(
        log.contains("anyone who can reach 0.0.0.0:0 can read and write the volume"),
        "{log}"
    );
    let log = start_log(
        d,
        &[
            "--socket",
            &d.join("s.sock").display().to_string(),
            "--metrics",
            "127.0.0.1:0",
        ],
    );
    assert!(
        log.contains("serving NBD on") && !log.contains("warning"),
        "{log}"
    );
}

const LOG_LAYOUT: [&str; 4] = ["--layout", "log", "--segment-size", "256k"];

fn layout_args(log: bool) -> Vec<&'static str> {
    let mut a = vec!["--mode", "write-back"];
    if log {
        a.extend(LOG_LAYOUT);
    }
    a
}

/// Runs `cmd` for at most `t`; `None` (after killing it) when it was still running.
fn run_for(cmd: &mut Command, t: Duration) -> Option<Output> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > t {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child.wait_with_output().unwrap())
}

/// A write-back cache holding dirty data with one byte of its superblock magic flipped:
/// `serve --format-if-needed` refuses it (naming `tiercache check` and `tiercache format
/// --force`) and leaves every byte of it alone — in both layouts. Before the fix it formatted
/// the device (a log device as a direct one) and served the backing device's stale data.
#[test]
fn format_if_needed_refuses_a_damaged_cache() {
    for log in [false, true] {
        let dir = setup();
        let d = dir.path();
        let srv = Srv::sized(d, "16M", &layout_args(log));
        let mut c = tiercache_nbd::Client::connect(&srv.uri()).unwrap();
        c.write(0, &[0xab; 65536]).unwrap();
        c.flush().unwrap();
        drop(c);
        let stats: serde_json::Value =
            serde_json::from_str(&srv.ctl(&["stats", "--json"])).unwrap();
        assert!(stats["dirty_lines"].as_u64().unwrap() > 0, "{stats}");
        srv.kill9(); // the dirty lines stay on the cache device only
        let cache = d.join("cache.img");
        let mut bytes = std::fs::read(&cache).unwrap();
        bytes[0] ^= 0x01;
        std::fs::write(&cache, &bytes).unwrap();

        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .arg("--cache")
            .arg(&cache)
            .arg("--backing")
            .arg(d.join("backing.img"))
            .arg("--socket")
            .arg(d.join("nbd.sock"))
            .args(["--format-if-needed", "--cache-size", "16M"])
            .args(layout_args(log));
        let out = run_for(&mut cmd, Duration::from_secs(20)).unwrap_or_else(|| {
            panic!("log layout {log}: serve --format-if-needed served a cache with a damaged superblock")
        });
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "log layout {log}: {err}");
        assert!(
            err.contains("tiercache check")
                && err.contains("tiercache format --force")
                && err.contains(&cache.display().to_string()),
            "log layout {log}: {err}"
        );
        assert!(
            std::fs::read(&cache).unwrap() == bytes,
            "log layout {log}: the damaged cache was modified"
        );
    }
}

/// What `--format-if-needed` is for still works: a cache file it creates, and an existing
/// file whose first MiB is zeros, are formatted and served — in both layouts.
#[test]
fn format_if_needed_formats_new_and_all_zero_files() {
    for log in [false, true] {
        for existing_zeros in [false, true] {
            let dir = setup();
            let d = dir.path();
            if existing_zeros {
                // Room for 16 MiB of lines and the direct layout's metadata.
                let f = std::fs::File::create(d.join("cache.img")).unwrap();
                f.set_len(32 << 20).unwrap();
            }
            let srv = if log && existing_zeros {
                // The log layout takes the whole existing device: --cache-size would not be
                // what it gets, and is refused (first_hour::serve_refuses_a_cache_size_...).
                let (c, b) = (
                    d.join("cache.img").display().to_string(),
                    d.join("backing.img").display().to_string(),
                );
                let mut args = vec!["--cache", &c, "--backing", &b, "--format-if-needed"];
                args.extend(layout_args(log));
                Srv::custom(d, &args)
            } else {
                Srv::sized(d, "16M", &layout_args(log))
            };
            let log_text = srv.stop("-TERM");
            assert!(
                log_text.contains(&format!("formatted {}", d.join("cache.img").display())),
                "log layout {log}, existing zero file {existing_zeros}: {log_text}"
            );
        }
    }
}
