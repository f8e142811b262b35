//! Real NBD clients (libnbd's nbdinfo/nbdcopy/nbdsh, QEMU's qemu-img/qemu-io, fio's nbd
//! engine) against the in-process server with a FileExport. A test whose tool is missing
//! prints "SKIP: <tool> not installed" and returns.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::*;
use tiercache_nbd::Export;

const MIB: u64 = 1 << 20;

fn number_after(json: &str, key: &str) -> Option<u64> {
    let i = json.find(&format!("\"{key}\""))?;
    let rest = &json[i + key.len() + 2..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn sha256(path: &std::path::Path) -> String {
    run(Command::new("sha256sum").arg(path))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn nbdinfo_reports_size_block_sizes_and_list() {
    if !have("nbdinfo") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, a) = file_export(dir.path(), "a.img", 3 * MIB);
    let (_, b) = file_export(dir.path(), "b.img", MIB);
    let srv = TestServer::start(vec![
        ("disk-a".into(), a as Arc<dyn Export>),
        ("disk-b".into(), b as Arc<dyn Export>),
    ]);
    let out = run(Command::new("nbdinfo").arg("--json").arg(srv.uri("disk-a")));
    assert_eq!(number_after(&out, "export-size"), Some(3 * MIB), "{out}");
    assert_eq!(number_after(&out, "block_size_minimum"), Some(1), "{out}");
    assert_eq!(
        number_after(&out, "block_size_preferred"),
        Some(4096),
        "{out}"
    );
    assert_eq!(
        number_after(&out, "block_size_maximum"),
        Some(32 * MIB),
        "{out}"
    );
    assert!(out.contains("\"can_flush\": true"), "{out}");
    assert!(out.contains("\"can_fua\": true"), "{out}");
    assert!(out.contains("\"can_trim\": true"), "{out}");
    assert!(out.contains("\"can_zero\": true"), "{out}");
    assert!(out.contains("\"can_multi_conn\": true"), "{out}");
    assert!(out.contains("\"is_read_only\": false"), "{out}");
    // The empty name is the first export.
    let out = run(Command::new("nbdinfo").arg("--size").arg(srv.uri("")));
    assert_eq!(out.trim(), (3 * MIB).to_string());
    let out = run(Command::new("nbdinfo").arg("--size").arg(srv.uri("disk-b")));
    assert_eq!(out.trim(), MIB.to_string());
    let out = run(Command::new("nbdinfo")
        .arg("--list")
        .arg("--json")
        .arg(srv.uri("")));
    assert!(out.contains("\"disk-a\""), "{out}");
    assert!(out.contains("\"disk-b\""), "{out}");
    // An unknown export is refused with a clear error, and the server keeps serving.
    let bad = Command::new("nbdinfo")
        .arg(srv.uri("nope"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("nope"), "{err}");
    let out = run(Command::new("nbdinfo").arg("--size").arg(srv.uri("disk-a")));
    assert_eq!(out.trim(), (3 * MIB).to_string());
    srv.stop();
}

#[test]
fn qemu_img_info_and_convert_round_trip() {
    if !have("qemu-img") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, e) = file_export(dir.path(), "disk.img", 8 * MIB);
    let srv = TestServer::start(vec![("disk".into(), e as Arc<dyn Export>)]);
    let out = run(Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(srv.uri("disk")));
    assert_eq!(number_after(&out, "virtual-size"), Some(8 * MIB), "{out}");

    // Random image in, through the server, and back out.
    let src = dir.path().join("src.img");
    let rnd: Vec<u8> = (0..8 * MIB)
        .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as u8)
        .collect();
    std::fs::write(&src, &rnd).unwrap();
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(srv.uri("disk")));
    let back = dir.path().join("back.img");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(srv.uri("disk"))
        .arg(&back));
    assert_eq!(sha256(&src), sha256(&back));
    assert_eq!(std::fs::read(dir.path().join("disk.img")).unwrap(), rnd);
    srv.stop();
}

#[test]
fn qemu_io_patterns() {
    if !have("qemu-io") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, e) = file_export(dir.path(), "disk.img", 4 * MIB);
    let srv = TestServer::start(vec![("disk".into(), e as Arc<dyn Export>)]);
    let out = run(Command::new("qemu-io")
        .args(["-f", "raw"])
        .args(["-c", "write -P 0xab 0 64k"])
        .args(["-c", "write -P 0xcd -f 65536 4k"]) // FUA write
        .args(["-c", "aio_write -P 0x11 1M 128k"])
        .args(["-c", "aio_write -P 0x22 2M 128k"])
        .args(["-c", "aio_flush"])
        .args(["-c", "read -P 0xab 0 64k"])
        .args(["-c", "read -P 0xcd 64k 4k"])
        .args(["-c", "read -P 0x11 1M 128k"])
        .args(["-c", "read -P 0x22 2M 128k"])
        .args(["-c", "write -z 3M 256k"])
        .args(["-c", "read -P 0 3M 256k"])
        .args(["-c", "discard 3584k 64k"])
        .args(["-c", "flush"])
        .arg(srv.uri("disk")));
    assert!(!out.contains("Pattern verification failed"), "{out}");
    assert!(!out.to_lowercase().contains("error"), "{out}");
    assert_eq!(out.matches("read ").count(), 5, "{out}");
    let data = std::fs::read(&path).unwrap();
    assert!(data[..65536].iter().all(|&b| b == 0xab));
    assert!(data[65536..69632].iter().all(|&b| b == 0xcd));
    assert!(data[(2 * MIB) as usize..(2 * MIB + 131072) as usize]
        .iter()
        .all(|&b| b == 0x22));
    assert!(data[(3 * MIB) as usize..(3 * MIB + 262144) as usize]
        .iter()
        .all(|&b| b == 0));
    // Reading past the end is refused by the client or the server, never answered.
    let past = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read 4M 4k"])
        .arg(srv.uri("disk"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&past.stdout).to_string() + &String::from_utf8_lossy(&past.stderr);
    assert!(!text.contains("read 4096/4096"), "{text}");
    srv.stop();
}

#[test]
fn nbdcopy_random_image_in_and_out() {
    if !have("nbdcopy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let size = 16 * MIB;
    let (_, e) = file_export(dir.path(), "disk.img", size);
    let srv = TestServer::start(vec![("disk".into(), e as Arc<dyn Export>)]);
    let src = dir.path().join("src.img");
    let mut rnd = vec![0u8; size as usize];
    let mut x: u64 = 0x1234_5678_9abc_def1;
    for b in rnd.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    // A zero run so nbdcopy uses WRITE_ZEROES as well as WRITE.
    rnd[(4 * MIB) as usize..(6 * MIB) as usize].fill(0);
    std::fs::write(&src, &rnd).unwrap();
    run(Command::new("nbdcopy")
        .args(["--connections=4", "--requests=16"])
        .arg(&src)
        .arg(srv.uri("disk")));
    let back = dir.path().join("back.img");
    run(Command::new("nbdcopy")
        .args(["--connections=4", "--requests=16"])
        .arg(srv.uri("disk"))
        .arg(&back));
    assert_eq!(sha256(&src), sha256(&back));
    srv.stop();
}

#[test]
fn nbdsh_script_pread_pwrite_flush_trim_zero() {
    let Some(mut nbdsh) = nbdsh() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (path, e) = file_export(dir.path(), "disk.img", 4 * MIB);
    let srv = TestServer::start(vec![("disk".into(), e as Arc<dyn Export>)]);
    let script = r#"
assert h.get_size() == 4 * 1024 * 1024
assert h.can_flush() and h.can_fua() and h.can_trim() and h.can_zero()
assert h.get_structured_replies_negotiated()
buf = bytes(range(256)) * 256
h.pwrite(buf, 8192)
assert h.pread(len(buf), 8192) == buf
h.pwrite(b"\x55" * 4096, 0, nbd.CMD_FLAG_FUA)
assert h.pread(4096, 0) == b"\x55" * 4096
h.flush()
h.zero(65536, 8192)
assert h.pread(65536, 8192) == bytes(65536)
h.zero(4096, 1024 * 1024, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(4096, 1024 * 1024) == bytes(4096)
h.trim(65536, 2 * 1024 * 1024)
try:
    h.pread(4096, 4 * 1024 * 1024 - 2048)
    raise Exception("read past the end succeeded")
except nbd.Error as ex:
    print("past end:", ex.errno)
try:
    h.pwrite(b"x" * 4096, 4 * 1024 * 1024 - 2048)
    raise Exception("write past the end succeeded")
except nbd.Error as ex:
    print("write past end:", ex.errno)
print("ok")
"#;
    let out = run(nbdsh.arg("-u").arg(srv.uri("disk")).arg("-c").arg(script));
    assert!(out.contains("ok"), "{out}");
    // libnbd checks bounds itself; with strict mode off the server's own errors show up.
    let data = std::fs::read(&path).unwrap();
    assert!(data[..4096].iter().all(|&b| b == 0x55));
    assert!(data[8192..8192 + 65536].iter().all(|&b| b == 0));
    assert!(data[1 << 20..(1 << 20) + 4096].iter().all(|&b| b == 0));
    assert!(data[65536 + 8192..65536 + 8192 + 4096]
        .iter()
        .any(|&b| b != 0));
    srv.stop();
}

#[test]
fn nbdsh_server_errors_without_client_checks() {
    let Some(mut nbdsh) = nbdsh() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_, e) = file_export(dir.path(), "disk.img", MIB);
    let srv = TestServer::start(vec![("disk".into(), e as Arc<dyn Export>)]);
    // Turn off libnbd's own range checks so the requests reach the server.
    let script = r#"
import errno
h.set_strict_mode(0)
def expect(f, code, what):
    try:
        f()
    except nbd.Error as ex:
        got = ex.errno if isinstance(ex.errno, int) else getattr(errno, ex.errno)
        assert got == code, (what, ex.errno, code)
        return
    raise Exception(what + " succeeded")
expect(lambda: h.pread(4096, 1024 * 1024), errno.EINVAL, "read past end")
expect(lambda: h.pwrite(b"x" * 4096, 1024 * 1024 - 1024), errno.ENOSPC, "write past end")
expect(lambda: h.trim(4096, 1024 * 1024), errno.EINVAL, "trim past end")
expect(lambda: h.zero(4096, 1024 * 1024), errno.ENOSPC, "zero past end")
assert h.pread(16, 0) is not None
print("ok")
"#;
    let out = run(nbdsh.arg("-u").arg(srv.uri("disk")).arg("-c").arg(script));
    assert!(out.contains("ok"), "{out}");
    srv.stop();
}

#[test]
fn fio_verify_crc32c_qd16_several_jobs() {
    if !have("fio") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, e) = file_export(dir.path(), "disk.img", 64 * MIB);
    let srv = TestServer::start(vec![("disk".into(), e as Arc<dyn Export>)]);
    // In the temp dir: fio leaves its verify state files in its working directory.
    let out = run(Command::new("fio")
        .current_dir(dir.path())
        .args([
            "--name=verify",
            "--ioengine=nbd",
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            "--numjobs=4",
            "--size=16m",
            "--offset_increment=16m",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--group_reporting",
        ])
        .arg(format!("--uri={}", srv.uri("disk"))));
    assert!(out.contains("err= 0"), "{out}");
    assert!(!out.contains("verify failed"), "{out}");
    srv.stop();
}
