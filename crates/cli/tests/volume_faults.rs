//! Faults of one volume of several, with the RAM tier on (issue 15 item 1's fault injection):
//! volume `b`'s backing device is an nbdkit error-filter export that fails every request
//! while TRIGGER exists; `a` and `c` are files. While `b`'s disk fails: `a` and `c` keep
//! serving reads and writes; `b`'s refused write-through writes fail with an error and a
//! read of the block afterwards is the old or the new data, the same from every tier (the
//! RAM tier must not keep a copy the SSD no longer agrees with); `b`'s acknowledged
//! write-back writes read back. After the heal every acknowledged write of every volume
//! reads back, also after a restart.

mod common;

use common::*;
use std::path::Path;
use tiercache_nbd::Client;

const VOL: u64 = 16 << 20;

fn block(seed: u64) -> Vec<u8> {
    (0..4096)
        .map(|k| (k as u8).wrapping_mul(29) ^ (seed as u8).wrapping_mul(101) ^ 0x3c)
        .collect()
}

fn client(srv: &Srv, v: &str) -> Client {
    Client::connect(&format!("nbd+unix:///{v}?socket={}", srv.sock.display())).unwrap()
}

fn read(c: &mut Client, off: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    c.read(off, &mut b).unwrap();
    b
}

fn serve(dir: &Path, b_uri: &str) -> Srv {
    let a = format!("a={}", dir.join("a.img").display());
    let b = format!("b={b_uri}");
    let c = format!("c={}", dir.join("c.img").display());
    let cache = dir.join("cache.img").display().to_string();
    Srv::custom(
        dir,
        &[
            "--cache",
            &cache,
            "--format-if-needed",
            "--cache-size",
            "8M",
            "--volume",
            &a,
            "--volume",
            &b,
            "--volume",
            &c,
            "--mode",
            "write-back",
            "--volume-mode",
            "b=write-through",
            "--ram-cache",
            "1MiB",
        ],
    )
}

#[test]
fn one_failing_volume_leaves_the_others_serving_and_the_ram_tier_consistent() {
    if !have("nbdkit") {
        return;
    }
    let tmp = common::tmp();
    let dir = tmp.path();
    for v in ["a", "c"] {
        std::fs::File::create(dir.join(format!("{v}.img")))
            .unwrap()
            .set_len(VOL)
            .unwrap();
    }
    std::fs::write(dir.join("b.img"), vec![0u8; VOL as usize]).unwrap();
    let trigger = dir.join("TRIGGER");
    let img = dir.join("b.img").display().to_string();
    let file = format!("error-file={}", trigger.display());
    let kit = NbdkitProc::start(
        &dir.join("b.sock"),
        &["--filter=error", "file", &img, "error-rate=1", &file],
    );
    let srv = serve(dir, &kit.uri());
    let mut acked: Vec<(&str, u64, Vec<u8>)> = Vec::new();
    let mut cs: Vec<(&str, Client)> = ["a", "b", "c"]
        .into_iter()
        .map(|v| (v, client(&srv, v)))
        .collect();
    // X everywhere, read twice (the second read from the RAM tier).
    for (i, (v, c)) in cs.iter_mut().enumerate() {
        let x = block(i as u64);
        c.write(0, &x).unwrap();
        c.flush().unwrap();
        assert_eq!(read(c, 0), x);
        assert_eq!(read(c, 0), x);
        acked.push((*v, 0, x));
    }
    let before = find_num(&srv.stats(), "ram_hits").unwrap_or(0.0);
    assert!(before > 0.0, "the RAM tier served none of the re-reads");

    std::fs::write(&trigger, b"").unwrap();
    // b (write-through): Y at 0 must fail; what b reads at 0 then is X or Y, from every tier.
    let (_, cb) = &mut cs[1];
    let y = block(50);
    let refused = cb.write(0, &y).is_err();
    assert!(
        refused,
        "a write-through write with a failing backing device was acknowledged"
    );
    // The read may fail (the cached copy was dropped with the refused write and the disk
    // fails), but what it returns is X or Y, the same from every tier.
    let mut seen: Option<Vec<u8>> = None;
    for _ in 0..4 {
        let mut b = vec![0u8; 4096];
        if cb.read(0, &mut b).is_ok() {
            assert!(
                b == acked[1].2 || b == y,
                "b reads neither the old nor the new data after a refused write"
            );
            if let Some(s) = &seen {
                assert_eq!(
                    &b, s,
                    "b's block changes from read to read (tiers disagree)"
                );
            }
            seen = Some(b);
        }
    }
    // a and c go on (write-back and its reads), each its own data.
    for (k, (v, c)) in cs.iter_mut().enumerate().filter(|(k, _)| *k != 1) {
        for i in 1..64u64 {
            let d = block(100 * k as u64 + i);
            c.write(i * 4096, &d).unwrap_or_else(|e| {
                panic!("volume {v}: a write failed while only b's disk fails: {e}")
            });
            acked.push((*v, i * 4096, d));
        }
        c.flush()
            .unwrap_or_else(|e| panic!("volume {v}: FLUSH failed while only b's disk fails: {e}"));
    }
    for (v, off, d) in &acked {
        if *v == "b" {
            continue;
        }
        let c = &mut cs.iter_mut().find(|(n, _)| n == v).unwrap().1;
        assert_eq!(
            &read(c, *off),
            d,
            "volume {v} at {off} while b's disk fails"
        );
    }

    std::fs::remove_file(&trigger).unwrap();
    let (_, cb) = &mut cs[1];
    let healed = read(cb, 0);
    assert!(
        healed == acked[1].2 || healed == y,
        "b after the heal reads neither the old nor the refused data"
    );
    if let Some(s) = &seen {
        assert_eq!(
            &healed, s,
            "b's block changed between the fault and the heal"
        );
    }
    let z = block(60);
    cb.write(0, &z).expect("b after the heal");
    cb.flush().unwrap();
    for _ in 0..3 {
        assert_eq!(read(cb, 0), z, "b after the heal, from every tier");
    }
    acked[1].2 = z;
    drop(cs);
    srv.stop("-TERM");
    let srv = serve(dir, &kit.uri());
    for (v, off, d) in &acked {
        let mut c = client(&srv, v);
        assert_eq!(
            &read(&mut c, *off),
            d,
            "volume {v} at {off} after a restart"
        );
    }
    drop(srv);
}
