//! `replay_volumes` over two exports at queue depth 2: a slow export's request in flight
//! must not hold back the timing of a fast export's replies (the replay used to wait for the
//! oldest request's reply first, timing a fast reply that came meanwhile up to one slow wait
//! late).

mod common;

use common::TestServer;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tiercache_nbd::{replay_volumes, Client, Export, ReplayOp, ReplayOpKind};

/// A zeroed export whose reads take `delay`.
struct Delayed {
    delay: Duration,
}

impl Export for Delayed {
    fn size(&self) -> u64 {
        1 << 20
    }
    fn read(&self, _offset: u64, buf: &mut [u8]) -> io::Result<()> {
        std::thread::sleep(self.delay);
        buf.fill(0);
        Ok(())
    }
    fn write(&self, _: u64, _: &[u8], _: bool) -> io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn trim(&self, _: u64, _: u64) -> io::Result<()> {
        Ok(())
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool, _: bool) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_slow_export_does_not_delay_the_timing_of_a_fast_ones_replies() {
    let export = |ms| {
        Arc::new(Delayed {
            delay: Duration::from_millis(ms),
        }) as Arc<dyn Export>
    };
    let srv = TestServer::start(vec![
        ("slow".into(), export(300)),
        ("fast".into(), export(0)),
    ]);
    let mut clients = vec![
        Client::connect(&srv.uri("slow")).unwrap(),
        Client::connect(&srv.uri("fast")).unwrap(),
    ];
    let read = |v: usize, i: u64| {
        (
            v,
            ReplayOp {
                kind: ReplayOpKind::Read,
                offset: (i % 256) * 4096,
                len: 4096,
                fua: false,
            },
        )
    };
    // One slow read, then fast reads beside it, twice.
    let mut ops = Vec::new();
    for round in 0..2 {
        ops.push(read(0, round));
        ops.extend((0..20).map(|i| read(1, i)));
    }
    let r = replay_volumes(&mut clients, ops, 2, |_, _| {}).unwrap();
    assert_eq!((r.requests, r.errors), (42, 0), "{r:?}");
    let (slow, fast) = (&r.volumes[0], &r.volumes[1]);
    assert_eq!((slow.requests, fast.requests), (2, 40));
    assert!(slow.latency_p50_us >= 250_000.0, "{slow:?}");
    assert!(
        fast.latency_max_us < 150_000.0,
        "a fast export's reply was timed after the slow export's: max {} us",
        fast.latency_max_us
    );
    srv.stop();
}
