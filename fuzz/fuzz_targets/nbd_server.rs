//! Any bytes as what an NBD client sends (handshake, options, requests and payloads), fed to
//! the server over a socketpair: the connection must end without a panic, whatever the input
//! claims (lengths, offsets, commands, flags). One worker per connection, so the server runs
//! on this thread and a drain thread reads its replies.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tiercache_nbd::{BlockSizes, Export, Server, ServerOptions};

const SIZE: usize = 256 << 10;

struct Mem(Mutex<Vec<u8>>);

impl Export for Mem {
    fn size(&self) -> u64 {
        SIZE as u64
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if (128 << 10..132 << 10).contains(&offset) {
            return Err(io::Error::from_raw_os_error(5));
        }
        let d = self.0.lock().unwrap();
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        let mut d = self.0.lock().unwrap();
        d[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write_zeroes(offset, len, false, true)
    }
    fn write_zeroes(&self, offset: u64, len: u64, _fua: bool, _t: bool) -> io::Result<()> {
        let mut d = self.0.lock().unwrap();
        d[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
    fn block_sizes(&self) -> BlockSizes {
        BlockSizes {
            minimum: 1,
            preferred: 4096,
            maximum: 16 << 10,
        }
    }
}

fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| {
        let e = Arc::new(Mem(Mutex::new(vec![0; SIZE])));
        Server::new(vec![("disk".into(), e as Arc<dyn Export>)]).with_options(ServerOptions {
            workers_per_connection: 1,
            max_drain: 64 << 10,
            handshake_deadline: Some(Duration::from_secs(5)),
            ..Default::default()
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let (mut client, theirs) = UnixStream::pair().unwrap();
    let _ = client.write_all(data); // fits the socket buffer at -max_len <= 64k
    let _ = client.shutdown(std::net::Shutdown::Write);
    let drain = std::thread::spawn(move || {
        let mut b = vec![0u8; 64 << 10];
        while matches!(client.read(&mut b), Ok(n) if n > 0) {}
    });
    let _ = server().serve_stream(theirs);
    drain.join().unwrap();
});
