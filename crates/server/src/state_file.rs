//! The cache's state file: a durable record, kept outside the cache device, that the cache
//! failed (issue 14 item 6).
//!
//! When the cache device fails, the volume passes every request through to the backing
//! device. Records left on the cache device then map lines older than what the client writes
//! next; the superblock is erased so they are never restored, but that erase is a write to
//! the very device that just failed and may fail too. The state file records the failure
//! beside the cache (`<cache path>.tiercache-state`, or `<uuid>.tiercache-state` in
//! `serve --state-dir`), and `CacheVolume::open` refuses a cache whose uuid it names.
//!
//! Layout (little endian): magic `TCSTATE\0` (8 bytes), version u32, payload length u32,
//! payload, crc32c u32 of everything before it. Payload: cache superblock uuid (16 bytes),
//! state u8 (1 = failed), unix time u64, reason (u32 length + UTF-8), lost ranges (a u32
//! count, then `[start, end)` pairs of u64 volume bytes).
//!
//! Written as a temporary file (mode 0600), fsync, rename, fsync of the directory.

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub const MAGIC: [u8; 8] = *b"TCSTATE\0";
pub const VERSION: u32 = 1;
/// File name suffix of state files.
pub const SUFFIX: &str = ".tiercache-state";
const STATE_FAILED: u8 = 1;
/// Longest reason stored (bytes); longer ones are cut at a character boundary.
const MAX_REASON: usize = 4096;

/// A cache recorded as failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailState {
    /// The failed cache's superblock uuid.
    pub uuid: [u8; 16],
    /// When it failed (seconds since the Unix epoch).
    pub failed_at: u64,
    /// The error that failed it.
    pub reason: String,
    /// Volume byte ranges `[start, end)` whose dirty data was lost with it.
    pub lost: Vec<(u64, u64)>,
}

/// The default state file of a cache device at `cache`: beside it.
pub fn beside(cache: &Path) -> PathBuf {
    let mut s = cache.as_os_str().to_owned();
    s.push(SUFFIX);
    PathBuf::from(s)
}

/// The state file of the cache with superblock uuid `uuid` in a state directory.
pub fn in_dir(dir: &Path, uuid: &[u8; 16]) -> PathBuf {
    dir.join(format!("{}{SUFFIX}", uuid_hex(uuid)))
}

pub fn uuid_hex(uuid: &[u8; 16]) -> String {
    uuid.iter().map(|b| format!("{b:02x}")).collect()
}

fn bad(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "cache state file {} is damaged ({why}): the cache it belongs to may have failed; check the cache device with `tiercache check`, then `tiercache format --force` it (which removes this file) or remove the file by hand if the cache is known good",
            path.display()
        ),
    )
}

impl FailState {
    pub fn encode(&self) -> Vec<u8> {
        let mut reason = self.reason.as_str();
        while reason.len() > MAX_REASON {
            let mut cut = MAX_REASON;
            while !reason.is_char_boundary(cut) {
                cut -= 1;
            }
            reason = &reason[..cut];
        }
        let mut p = Vec::new();
        p.extend_from_slice(&self.uuid);
        p.push(STATE_FAILED);
        p.extend_from_slice(&self.failed_at.to_le_bytes());
        p.extend_from_slice(&(reason.len() as u32).to_le_bytes());
        p.extend_from_slice(reason.as_bytes());
        p.extend_from_slice(&(self.lost.len() as u32).to_le_bytes());
        for &(a, b) in &self.lost {
            p.extend_from_slice(&a.to_le_bytes());
            p.extend_from_slice(&b.to_le_bytes());
        }
        let mut b = Vec::with_capacity(p.len() + 20);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(p.len() as u32).to_le_bytes());
        b.extend_from_slice(&p);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a state file's bytes; the error says what is wrong.
    pub fn decode(b: &[u8]) -> Result<FailState, String> {
        if b.len() < 20 || b[..8] != MAGIC {
            return Err("bad magic".into());
        }
        let version = u32::from_le_bytes(b[8..12].try_into().unwrap());
        if version != VERSION {
            return Err(format!("version {version}, this build reads {VERSION}"));
        }
        let len = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
        if b.len() != 16 + len + 4 {
            return Err(format!("{} bytes, the header says {}", b.len(), 20 + len));
        }
        let stored = u32::from_le_bytes(b[16 + len..].try_into().unwrap());
        let computed = crc32c::crc32c(&b[..16 + len]);
        if stored != computed {
            return Err(format!(
                "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
            ));
        }
        let mut p = &b[16..16 + len];
        let mut take = |n: usize| -> Result<&[u8], String> {
            if p.len() < n {
                return Err("truncated payload".into());
            }
            let (h, t) = p.split_at(n);
            p = t;
            Ok(h)
        };
        let uuid: [u8; 16] = take(16)?.try_into().unwrap();
        let state = take(1)?[0];
        if state != STATE_FAILED {
            return Err(format!("unknown state {state}"));
        }
        let failed_at = u64::from_le_bytes(take(8)?.try_into().unwrap());
        let n = u32::from_le_bytes(take(4)?.try_into().unwrap()) as usize;
        let reason = String::from_utf8_lossy(take(n)?).into_owned();
        let n = u32::from_le_bytes(take(4)?.try_into().unwrap()) as usize;
        let mut lost = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let a = u64::from_le_bytes(take(8)?.try_into().unwrap());
            let e = u64::from_le_bytes(take(8)?.try_into().unwrap());
            lost.push((a, e));
        }
        if !p.is_empty() {
            return Err("trailing bytes in the payload".into());
        }
        Ok(FailState {
            uuid,
            failed_at,
            reason,
            lost,
        })
    }

    /// Human summary for logs and errors.
    pub fn describe(&self) -> String {
        let bytes: u64 = self.lost.iter().map(|(a, b)| b - a).sum();
        format!(
            "cache {} failed at unix time {} ({}); {}",
            uuid_hex(&self.uuid),
            self.failed_at,
            self.reason,
            if self.lost.is_empty() {
                "no dirty data was lost".to_string()
            } else {
                format!(
                    "dirty data lost in {} ranges, {bytes} bytes: {:?}",
                    self.lost.len(),
                    self.lost
                )
            }
        )
    }
}

fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

/// Writes `st` to `path` durably: temporary file (0600), fsync, rename, fsync of the directory.
pub fn write(path: &Path, st: &FailState) -> io::Result<()> {
    write_bytes(path, &st.encode(), "cache state file")
}

fn write_bytes(path: &Path, bytes: &[u8], what: &str) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let res = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        sync_dir(path)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res.map_err(|e| io::Error::new(e.kind(), format!("writing {what} {}: {e}", path.display())))
}

/// Reads the state file at `path`: `None` when there is none; an error naming the file when
/// it cannot be read or is damaged.
pub fn read(path: &Path) -> io::Result<Option<FailState>> {
    match std::fs::read(path) {
        Ok(b) => FailState::decode(&b).map(Some).map_err(|e| bad(path, &e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("reading cache state file {}: {e}", path.display()),
        )),
    }
}

/// Removes the state file at `path` (durably); whether there was one.
pub fn clear(path: &Path) -> io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            sync_dir(path)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("removing cache state file {}: {e}", path.display()),
        )),
    }
}

/// File name suffix of pool generation files ([`PoolGen`]).
pub const POOL_SUFFIX: &str = ".tiercache-pool";
const POOL_MAGIC: [u8; 8] = *b"TCPLGEN\0";
const POOL_VERSION: u32 = 1;
const POOL_BYTES: usize = 8 + 4 + 16 + 8 + 2 + 16 + 4;

/// The pool generation at the newest member failure of a pool of cache devices (plan (d)5),
/// kept in the state directory, not on any member: a stale member started alone (the
/// members whose pool blocks marked it failed all missing) shows an older generation, and
/// is refused. Layout (little endian): magic `TCPLGEN\0`, version u32, pool uuid [16],
/// generation u64, member u16, member uuid [16], crc32c u32 of everything before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolGen {
    pub pool: [u8; 16],
    pub generation: u64,
    /// The member that failed then, and its uuid.
    pub member: u16,
    pub member_uuid: [u8; 16],
}

impl PoolGen {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(POOL_BYTES);
        b.extend_from_slice(&POOL_MAGIC);
        b.extend_from_slice(&POOL_VERSION.to_le_bytes());
        b.extend_from_slice(&self.pool);
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.member.to_le_bytes());
        b.extend_from_slice(&self.member_uuid);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<PoolGen, String> {
        if b.len() != POOL_BYTES || b[..8] != POOL_MAGIC {
            return Err("bad magic or length".into());
        }
        let version = u32::from_le_bytes(b[8..12].try_into().unwrap());
        if version != POOL_VERSION {
            return Err(format!(
                "version {version}, this build reads {POOL_VERSION}"
            ));
        }
        let n = POOL_BYTES - 4;
        let stored = u32::from_le_bytes(b[n..].try_into().unwrap());
        if stored != crc32c::crc32c(&b[..n]) {
            return Err("checksum mismatch".into());
        }
        Ok(PoolGen {
            pool: b[12..28].try_into().unwrap(),
            generation: u64::from_le_bytes(b[28..36].try_into().unwrap()),
            member: u16::from_le_bytes(b[36..38].try_into().unwrap()),
            member_uuid: b[38..54].try_into().unwrap(),
        })
    }
}

/// The pool generation file of pool `pool` in the state directory `dir`.
pub fn pool_gen_path(dir: &Path, pool: &[u8; 16]) -> PathBuf {
    dir.join(format!("{}{POOL_SUFFIX}", uuid_hex(pool)))
}

/// Writes `g` to `path` durably (temporary file, fsync, rename, fsync of the directory),
/// creating the directory (0700) if needed.
pub fn write_pool_gen(path: &Path, g: &PoolGen) -> io::Result<()> {
    if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("creating the state directory {}: {e}", d.display()),
                )
            })?;
    }
    write_bytes(path, &g.encode(), "pool generation file")
}

/// Reads the pool generation file at `path`: `None` when there is none.
pub fn read_pool_gen(path: &Path) -> io::Result<Option<PoolGen>> {
    match std::fs::read(path) {
        Ok(b) => PoolGen::decode(&b).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "pool generation file {} is damaged ({e}): remove it only if every member of the pool is given",
                    path.display()
                ),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("reading pool generation file {}: {e}", path.display()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_flipped_bit_is_detected() {
        let st = FailState {
            uuid: [9; 16],
            failed_at: 1_700_000_000,
            reason: "cache device: injected write error".into(),
            lost: vec![(0, 4096), (8192, 8704)],
        };
        let b = st.encode();
        assert_eq!(FailState::decode(&b).unwrap(), st);
        for bit in 0..b.len() * 8 {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(
                FailState::decode(&c).is_err(),
                "bit {bit} flipped undetected"
            );
        }
        assert!(FailState::decode(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn pool_generation_round_trip_and_every_flipped_bit_is_detected() {
        let g = PoolGen {
            pool: [4; 16],
            generation: 77,
            member: 1,
            member_uuid: [5; 16],
        };
        let b = g.encode();
        assert_eq!(PoolGen::decode(&b).unwrap(), g);
        for bit in 0..b.len() * 8 {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(PoolGen::decode(&c).is_err(), "bit {bit} flipped undetected");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = pool_gen_path(&dir.path().join("new"), &g.pool);
        assert_eq!(read_pool_gen(&path).unwrap(), None);
        write_pool_gen(&path, &g).unwrap();
        assert_eq!(read_pool_gen(&path).unwrap(), Some(g));
    }
}
