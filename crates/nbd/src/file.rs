//! A file or block device exported as is.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{BlockSizes, Export};

/// A regular file or a block device as an [`Export`]: positional reads and writes, `fdatasync`
/// for FLUSH and FUA, hole punching for TRIM.
pub struct FileExport {
    file: File,
    size: u64,
    read_only: bool,
    /// Cleared after the first EOPNOTSUPP so later trims and zeroes skip the syscall.
    punch_hole: AtomicBool,
    zero_range: AtomicBool,
    description: Option<String>,
}

const ZERO_CHUNK: usize = 1 << 20;

impl FileExport {
    /// Opens `path` read-write (or read-only). The size is the file length, or the device
    /// size (BLKGETSIZE64) for a block device.
    pub fn open(path: &Path, read_only: bool) -> io::Result<FileExport> {
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let mut fe = FileExport::from_file(file, read_only)?;
        fe.description = Some(path.display().to_string());
        Ok(fe)
    }

    pub fn from_file(file: File, read_only: bool) -> io::Result<FileExport> {
        let meta = file.metadata()?;
        let is_block = meta.file_type().is_block_device();
        let size = if is_block {
            let mut bytes: u64 = 0;
            // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
            const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
            // SAFETY: the ioctl writes one u64 into `bytes`.
            let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut bytes) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            bytes
        } else {
            meta.len()
        };
        Ok(FileExport {
            file,
            size,
            read_only,
            // Hole punching on a block device is BLKDISCARD territory; there zeroes are written.
            punch_hole: AtomicBool::new(!is_block),
            zero_range: AtomicBool::new(!is_block),
            description: None,
        })
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: plain syscall on an fd we own.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn write_zero_bytes(&self, mut offset: u64, len: u64) -> io::Result<()> {
        let zeroes = vec![0u8; (len as usize).min(ZERO_CHUNK)];
        let end = offset + len;
        while offset < end {
            let n = ((end - offset) as usize).min(zeroes.len());
            self.file.write_all_at(&zeroes[..n], offset)?;
            offset += n as u64;
        }
        Ok(())
    }

    fn unsupported(e: &io::Error) -> bool {
        matches!(
            e.raw_os_error(),
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL)
        )
    }
}

impl Export for FileExport {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.file.write_all_at(data, offset)?;
        if fua {
            self.file.sync_data()?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        // Contents after a trim are unspecified, but zeroes are the least surprising.
        self.write_zeroes(offset, len, false, true)
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, may_trim: bool) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let mut done = false;
        if may_trim && self.punch_hole.load(Ordering::Relaxed) {
            match self.fallocate(
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            ) {
                Ok(()) => done = true,
                Err(e) if Self::unsupported(&e) => self.punch_hole.store(false, Ordering::Relaxed),
                Err(e) => return Err(e),
            }
        }
        if !done && self.zero_range.load(Ordering::Relaxed) {
            match self.fallocate(
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            ) {
                Ok(()) => done = true,
                Err(e) if Self::unsupported(&e) => self.zero_range.store(false, Ordering::Relaxed),
                Err(e) => return Err(e),
            }
        }
        if !done {
            self.write_zero_bytes(offset, len)?;
        }
        if fua {
            self.file.sync_data()?;
        }
        Ok(())
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn block_sizes(&self) -> BlockSizes {
        BlockSizes::default()
    }

    fn description(&self) -> Option<String> {
        self.description.clone()
    }
}
