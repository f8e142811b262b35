//! The fault-injecting device's volatile write cache (`tiercache_server::fault`) under
//! concurrency: a read never returns bytes older than a write that completed before it began,
//! whatever sync runs beside it. Found through fault_model's concurrent checker (seed 212,
//! direct layout): an unlocked cache hit read a slot while `ctl mode`'s superblock sync
//! (under the volume lock, not the `io` lock) moved the write cache to the file; the sync had
//! taken the unsynced writes out of the cache but not yet written them, so the read found
//! them in neither place and returned the slot's older bytes (a stale read; a slot newly
//! filled for another line returned that line's bytes: a "misdirected" read; an unlocked
//! write-back reading it wrote those bytes to the backing device and marked the line clean).

use std::io;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tiercache_server::fault::Faults;
use tiercache_server::BlockDev;

/// An in-memory device whose `write_at` can be held: armed, it reports that a write began
/// (`entered`) and holds it for `hold` before applying it.
struct Gated {
    data: Mutex<Vec<u8>>,
    armed: Mutex<Option<mpsc::Sender<()>>>,
    hold: Duration,
}

impl BlockDev for Gated {
    fn size(&self) -> u64 {
        self.data.lock().unwrap().len() as u64
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let d = self.data.lock().unwrap();
        let o = offset as usize;
        buf.copy_from_slice(&d[o..o + buf.len()]);
        Ok(())
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        if let Some(tx) = self.armed.lock().unwrap().take() {
            tx.send(()).unwrap();
            std::thread::sleep(self.hold);
        }
        let mut d = self.data.lock().unwrap();
        let o = offset as usize;
        d[o..o + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}

/// A write (in the volatile write cache) completes; a sync starts moving it to the device and
/// is held just before the device write; a read then must still see the written bytes.
/// Before the fix the read returned the older bytes: "read [1, 1, 1, 1] after the write of
/// [2, 2, 2, 2] completed".
#[test]
fn read_beside_a_sync_sees_the_completed_write() {
    let (tx, entered) = mpsc::channel();
    let gated = Arc::new(Gated {
        data: Mutex::new(vec![1u8; 4096]),
        armed: Mutex::new(None),
        hold: Duration::from_millis(300),
    });
    struct Shared(Arc<Gated>);
    impl BlockDev for Shared {
        fn size(&self) -> u64 {
            self.0.size()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
            self.0.write_at(data, offset)
        }
        fn sync(&self) -> io::Result<()> {
            self.0.sync()
        }
    }
    let faults = Faults::new(1);
    let (dev, _h) = faults.wrap("cache", Box::new(Shared(Arc::clone(&gated))), true);
    let dev = Arc::new(dev);
    dev.write_at(&[2u8; 4], 512).unwrap();
    *gated.armed.lock().unwrap() = Some(tx);
    let syncer = {
        let dev = Arc::clone(&dev);
        std::thread::spawn(move || dev.sync())
    };
    // The sync has taken the write out of the write cache and is about to apply it.
    entered
        .recv_timeout(Duration::from_secs(10))
        .expect("the sync reached the device");
    let mut got = [0u8; 4];
    dev.read_at(&mut got, 512).unwrap();
    syncer.join().unwrap().unwrap();
    assert_eq!(
        got,
        [2u8; 4],
        "read {got:?} after the write of [2, 2, 2, 2] completed (a sync was moving it to the device)"
    );
    let mut after = [0u8; 4];
    dev.read_at(&mut after, 512).unwrap();
    assert_eq!(after, [2u8; 4], "after the sync");
}
