//! Helpers the live-server tests share: the binary, tool checks, and `tiercache serve` as a
//! child process that a failed test never leaves behind.
#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_tiercache");

/// Distinct, poorly compressible bytes from `seed` (so the log layout neither shares nor
/// shrinks them).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A sparse file of `len` bytes (a backing or cache image), created or truncated.
pub fn sparse(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

/// The Prometheus page of a server's `--metrics` address (`host:port`), headers included.
pub fn metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    c.read_to_string(&mut body).unwrap();
    body
}

/// A temporary directory on tmpfs when there is one (the tests sync often and need not wear a
/// disk for it), else in the default temporary directory.
pub fn tmp() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (for `--metrics`, `--http`).
/// A number anywhere in a `ctl stats --json` reply under this key (the first found,
/// depth first).
pub fn find_num(v: &serde_json::Value, key: &str) -> Option<f64> {
    match v {
        serde_json::Value::Object(m) => m
            .get(key)
            .and_then(|x| x.as_f64())
            .or_else(|| m.values().find_map(|x| find_num(x, key))),
        serde_json::Value::Array(a) => a.iter().find_map(|x| find_num(x, key)),
        _ => None,
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether `tool` is installed; prints a SKIP line naming the package when it is not.
pub fn have(tool: &str) -> bool {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        tiercache_testskip::skip!(
            "`{tool}` is not installed (apt-get install -y libnbd-bin fio qemu-utils e2fsprogs)"
        );
    }
    ok
}

/// Runs `cmd`, asserts success, returns its stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `tiercache replay --nbd URI --queue-depth 1 --strict --json ARGS`: its JSON report (the
/// replays that must equal `tiercache sim` counter for counter).
pub fn replay_qd1<S: AsRef<std::ffi::OsStr>>(
    uri: &str,
    args: impl IntoIterator<Item = S>,
) -> serde_json::Value {
    let out = run(Command::new(BIN)
        .args([
            "replay",
            "--nbd",
            uri,
            "--queue-depth",
            "1",
            "--strict",
            "--json",
        ])
        .args(args));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("replay --json: {e}:\n{out}"))
}

/// `tiercache sim --cache-size 8MiB --policy lru --mode MODE ARGS --json`, parsed: the
/// simulator's side of the live tests' 8 MiB caches (`Srv::start`).
pub fn sim_8m<S: AsRef<std::ffi::OsStr>>(
    mode: &str,
    args: impl IntoIterator<Item = S>,
) -> serde_json::Value {
    let out = run(Command::new(BIN)
        .args([
            "sim",
            "--cache-size",
            "8MiB",
            "--policy",
            "lru",
            "--mode",
            mode,
        ])
        .args(args)
        .arg("--json"));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("sim --json: {e}:\n{out}"))
}

pub fn sha(path: &Path) -> String {
    run(Command::new("sha256sum").arg(path))[..64].to_string()
}

/// `tiercache serve` on `dir/cache.img`, with a unix socket and a control socket in `dir`.
pub struct Srv {
    child: Option<Child>,
    /// The server's stderr, drained as it comes: a server that logs more than a pipe holds
    /// (64 KiB) would otherwise block in its logger, holding whatever lock it held, and the
    /// test would look like a server hang.
    log: Option<std::thread::JoinHandle<Vec<u8>>>,
    pub sock: PathBuf,
    pub ctl: PathBuf,
}

impl Srv {
    /// An 8 MiB cache in front of `dir/backing.img`.
    pub fn start(dir: &Path, extra: &[&str]) -> Srv {
        Self::launch(
            dir,
            &dir.join("backing.img").display().to_string(),
            "8M",
            extra,
        )
    }

    /// A `cache_size` cache in front of `dir/backing.img`.
    pub fn sized(dir: &Path, cache_size: &str, extra: &[&str]) -> Srv {
        Self::launch(
            dir,
            &dir.join("backing.img").display().to_string(),
            cache_size,
            extra,
        )
    }

    /// `backing`: a path or an NBD URI; `cache_size` formats a new cache file.
    pub fn launch(dir: &Path, backing: &str, cache_size: &str, extra: &[&str]) -> Srv {
        Self::launch_with(dir, backing, cache_size, extra, |_| {})
    }

    /// [`Srv::launch`], with `prep` adjusting the command first (a umask, an environment).
    pub fn launch_with(
        dir: &Path,
        backing: &str,
        cache_size: &str,
        extra: &[&str],
        prep: impl FnOnce(&mut Command),
    ) -> Srv {
        let cache = dir.join("cache.img").display().to_string();
        let mut args = vec!["--cache", &cache, "--backing", backing];
        args.extend(["--format-if-needed", "--cache-size", cache_size]);
        args.extend(extra);
        Self::custom_with(dir, &args, prep)
    }

    /// `tiercache serve ARGS` with a unix socket and a control socket in `dir`.
    pub fn custom(dir: &Path, args: &[&str]) -> Srv {
        Self::custom_with(dir, args, |_| {})
    }

    /// [`Srv::custom`], with `prep` adjusting the command first.
    pub fn custom_with(dir: &Path, args: &[&str], prep: impl FnOnce(&mut Command)) -> Srv {
        let sock = dir.join("nbd.sock");
        let ctl = dir.join("ctl.sock");
        let _ = std::fs::remove_file(&sock);
        let _ = std::fs::remove_file(&ctl);
        let mut cmd = Command::new(BIN);
        prep(&mut cmd);
        let mut child = cmd
            .arg("serve")
            .arg("--socket")
            .arg(&sock)
            .arg("--control")
            .arg(&ctl)
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = child.stderr.take().unwrap();
        let log = std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = std::io::Read::read_to_end(&mut err, &mut b);
            b
        });
        let t = Instant::now();
        while !(sock.exists() && ctl.exists()) {
            if let Ok(Some(st)) = child.try_wait() {
                let b = log.join().unwrap_or_default();
                panic!(
                    "server exited before it listened ({st}): {}",
                    String::from_utf8_lossy(&b)
                );
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "server did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Srv {
            child: Some(child),
            log: Some(log),
            sock,
            ctl,
        }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }

    /// `tiercache ctl` against this server; asserts success, returns stdout.
    pub fn ctl(&self, args: &[&str]) -> String {
        run(Command::new(BIN)
            .arg("ctl")
            .arg("--control")
            .arg(&self.ctl)
            .args(args))
    }

    /// `tiercache ctl` against this server, whatever its outcome (for refusals).
    pub fn ctl_output(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN)
            .arg("ctl")
            .arg("--control")
            .arg(&self.ctl)
            .args(args)
            .output()
            .unwrap()
    }

    /// `ctl stats --json`, parsed.
    pub fn stats(&self) -> serde_json::Value {
        serde_json::from_str(&self.ctl(&["stats", "--json"])).unwrap()
    }

    /// SIGTERM (asserted clean) or SIGKILL (crash); waits for the exit, returns stderr.
    pub fn stop(mut self, sig: &str) -> String {
        Command::new("kill")
            .args([sig, &self.child.as_ref().unwrap().id().to_string()])
            .status()
            .unwrap();
        let status = self.child.take().unwrap().wait().unwrap();
        let log = self.log.take().unwrap().join().unwrap_or_default();
        let log = String::from_utf8_lossy(&log).into_owned();
        if sig == "-TERM" {
            assert!(status.success(), "unclean exit: {log}");
            assert!(log.contains("shut down cleanly"), "{log}");
        }
        log
    }

    pub fn kill9(self) {
        self.stop("-KILL");
    }
}

/// `tiercache serve ARGS` that must refuse to start: waits up to 20 s for it to exit (killing
/// it and failing otherwise), asserts failure, returns its stderr.
pub fn serve_refused(dir: &Path, args: &[&str]) -> String {
    let mut child = Command::new(BIN)
        .arg("serve")
        .arg("--socket")
        .arg(dir.join("refused.sock"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "serve {args:?} started instead of refusing: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "serve {args:?} exited 0: {log}");
    log
}

impl Drop for Srv {
    /// A failed test must not leave a server behind (it would hold the test's output pipe).
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `nbdkit -f -U SOCK ARGS...`, killed when dropped.
pub struct NbdkitProc(Child, PathBuf);

impl NbdkitProc {
    pub fn start(sock: &Path, args: &[&str]) -> NbdkitProc {
        let child = Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(sock)
            .args(args)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while !sock.exists() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "nbdkit did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        NbdkitProc(child, sock.to_path_buf())
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.1.display())
    }

    /// A 16 MiB memory export behind nbdkit's error filter: while `trigger` exists, the
    /// requests `fault` names fail (e.g. `["error-rate=1"]`, or
    /// `["error=ENOSPC", "error-pwrite-rate=1"]`; the trigger applies to the same class).
    pub fn faulty_memory(sock: &Path, trigger: &Path, fault: &[&str]) -> NbdkitProc {
        let class = fault
            .iter()
            .find_map(|a| a.strip_suffix("-rate=1"))
            .expect("a fault with -rate=1");
        let file = format!("{class}-file={}", trigger.display());
        let mut args = vec!["--filter=error", "memory", "16M"];
        args.extend(fault);
        args.push(&file);
        NbdkitProc::start(sock, &args)
    }
}

impl Drop for NbdkitProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A server's export as a kernel block device (nbdfuse, then a loop device over its `nbd` file),
/// optionally mkfs'd as ext4, mounted at `mnt`; unmounted and detached when dropped.
pub struct Mounted {
    fuse: Option<Child>,
    fuse_dir: PathBuf,
    loop_dev: Option<String>,
    pub mnt: PathBuf,
    mounted: bool,
}

impl Mounted {
    /// `None` (with a SKIP message) when FUSE, loop devices or mount are unavailable.
    pub fn attach(srv: &Srv, dir: &Path, mkfs: bool) -> Option<Mounted> {
        Self::attach_with(srv, dir, mkfs.then_some(&[][..]))
    }

    /// [`Mounted::attach`], running `mkfs.ext4 -q -F ARGS DEV` first when `mkfs` is given.
    pub fn attach_with(srv: &Srv, dir: &Path, mkfs: Option<&[&str]>) -> Option<Mounted> {
        let fuse_dir = dir.join("fuse");
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&fuse_dir).unwrap();
        std::fs::create_dir_all(&mnt).unwrap();
        let fuse = Command::new("nbdfuse")
            .arg(&fuse_dir)
            .arg(srv.uri())
            .spawn()
            .ok()?;
        let mut m = Mounted {
            fuse: Some(fuse),
            fuse_dir: fuse_dir.clone(),
            loop_dev: None,
            mnt,
            mounted: false,
        };
        let t = Instant::now();
        while !fuse_dir.join("nbd").exists() {
            if t.elapsed() > Duration::from_secs(10) {
                tiercache_testskip::skip!("nbdfuse did not mount (no FUSE here?)");
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(fuse_dir.join("nbd"))
            .output()
            .ok()?;
        if !out.status.success() {
            tiercache_testskip::skip!("no loop device: {}", String::from_utf8_lossy(&out.stderr));
            return None;
        }
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        m.loop_dev = Some(dev.clone());
        if let Some(args) = mkfs {
            run(Command::new("mkfs.ext4")
                .args(["-q", "-F"])
                .args(args)
                .arg(&dev));
        }
        let st = Command::new("mount").arg(&dev).arg(&m.mnt).status().ok()?;
        if !st.success() {
            tiercache_testskip::skip!("mount {dev} failed (not allowed in this container?)");
            return None;
        }
        m.mounted = true;
        Some(m)
    }
}

impl Mounted {
    /// Unmounts the file system (the kernel writes back everything first), keeping the loop
    /// device and nbdfuse until drop. Asserts that umount succeeded.
    pub fn umount(&mut self) {
        if self.mounted {
            run(Command::new("umount").arg(&self.mnt));
            self.mounted = false;
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.mnt).status();
        }
        if let Some(d) = &self.loop_dev {
            let _ = Command::new("losetup").args(["-d", d]).status();
        }
        let _ = Command::new("umount").arg(&self.fuse_dir).status();
        if let Some(mut c) = self.fuse.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The fault device: `scripts/faultdev.sh` (an nbdkit `sh` plugin) serving `dir/hdd.img`, whose
/// reads, writes, flushes and trims fail while its control file says so (see the script; e.g.
/// `flush drop`: every FLUSH fails and discards the writes since the last good one, as Linux
/// does after a writeback error). Killed when dropped.
pub struct FaultDev {
    kit: NbdkitProc,
    pub img: PathBuf,
    pub control: PathBuf,
    pub log: PathBuf,
}

impl FaultDev {
    pub const SCRIPT: &'static str =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/faultdev.sh");

    /// A `size`-byte device filled with `fill`, no faults. `None` (with a SKIP line) when
    /// nbdkit or its sh plugin is missing.
    pub fn start(dir: &Path, size: u64, fill: u8) -> Option<FaultDev> {
        if !have("nbdkit") {
            return None;
        }
        let sh = Command::new("nbdkit")
            .args(["sh", "--dump-plugin"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !sh {
            tiercache_testskip::skip!(
                "nbdkit's sh plugin is not installed (apt-get install -y nbdkit): no fault device"
            );
            return None;
        }
        let img = dir.join("hdd.img");
        let control = dir.join("faults");
        let log = dir.join("faultdev.log");
        std::fs::write(&img, vec![fill; size as usize]).unwrap();
        let args = [
            "sh".to_string(),
            Self::SCRIPT.to_string(),
            format!("file={}", img.display()),
            format!("control={}", control.display()),
            format!("log={}", log.display()),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let kit = NbdkitProc::start(&dir.join("hdd.sock"), &args);
        Some(FaultDev {
            kit,
            img,
            control,
            log,
        })
    }

    pub fn uri(&self) -> String {
        self.kit.uri()
    }

    /// Replaces the fault rules (atomically: the device never reads half a file). Rule
    /// counts (`times=`) start again when the contents change.
    pub fn fail(&self, rules: &str) {
        let tmp = self.control.with_extension("new");
        std::fs::write(&tmp, rules).unwrap();
        std::fs::rename(&tmp, &self.control).unwrap();
    }

    /// No faults from now on.
    pub fn heal(&self) {
        self.fail("");
    }

    /// `len` bytes of the device's file at `off` (what it holds now, flushed or not).
    pub fn bytes(&self, off: u64, len: usize) -> Vec<u8> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(&self.img).unwrap();
        f.seek(SeekFrom::Start(off)).unwrap();
        let mut b = vec![0u8; len];
        f.read_exact(&mut b).unwrap();
        b
    }

    /// Requests of `op` the device answered with an injected error so far.
    pub fn failed(&self, op: &str) -> usize {
        self.count(op, false)
    }

    /// Requests of `op` the device completed so far.
    pub fn done(&self, op: &str) -> usize {
        self.count(op, true)
    }

    fn count(&self, op: &str, ok: bool) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.first() == Some(&op) && (w.get(3) == Some(&"ok")) == ok
            })
            .count()
    }
}

/// Member 1 of a test pool behind nbdkit: `file` over `DIR/b.img` with the error filter, every
/// request failing with EIO while `trigger` exists (pool_fio.rs, pool_replace.rs).
#[allow(dead_code)]
pub fn failing_pool_member(dir: &Path, trigger: &Path) -> NbdkitProc {
    let file = dir.join("b.img").display().to_string();
    let trig = format!("error-file={}", trigger.display());
    NbdkitProc::start(
        &dir.join("b.sock"),
        &[
            "--filter=error",
            "file",
            &file,
            "error=EIO",
            "error-rate=1",
            &trig,
        ],
    )
}

/// `tiercache format` of the write-back pool `DIR/a.img` + `b` over `DIR/backing.img`.
#[allow(dead_code)]
pub fn format_write_back_pool(dir: &Path, b: &str) {
    let o = Command::new(BIN)
        .arg("format")
        .arg("--cache")
        .arg(dir.join("a.img"))
        .arg("--cache")
        .arg(b)
        .arg("--backing")
        .arg(dir.join("backing.img"))
        .args(["--mode", "write-back"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
