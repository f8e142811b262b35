//! `tiercache ext4-classify`: blocks per DSS file-system class of an ext4 image or device, as
//! the ext4-aware classifier labels them.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use tiercache_ext4::{class_name, Ext4Classifier, BYTES_PER_EXTENT, FS_CLASSES};

#[derive(Args, Debug)]
#[command(after_help = "\
The classifier learns the layout the way the cache does. By default it reads the metadata
eagerly (superblock, group descriptors, the used part of every inode table, extent tree
blocks), as `tiercache serve` does at start on an existing file system; --observe-all instead
feeds every block in the order a mount plus a full read would (slower, reads the whole image).
Classes: metadata (superblock, descriptors, bitmaps, inode tables, extent tree blocks), journal,
directory, file<4KiB .. file>1GiB by the owning file's size; unallocated = owned by nothing.
Example:
  tiercache ext4-classify /var/tmp/fs.img --json")]
pub struct Ext4Args {
    /// ext4 image file or block device.
    pub image: PathBuf,
    /// Feed every block through the classifier instead of reading metadata eagerly.
    #[arg(long)]
    pub observe_all: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Ext4Args) -> Result<()> {
    let f = File::open(&a.image).with_context(|| format!("opening {}", a.image.display()))?;
    let mut c = Ext4Classifier::new();
    if a.observe_all {
        let mut head = vec![0u8; 4096];
        f.read_exact_at(&mut head, 0)
            .with_context(|| format!("{}: reading the superblock", a.image.display()))?;
        c.observe(0, &head);
        if let Some(bs) = c.block_size() {
            let mut r = std::io::BufReader::with_capacity(1 << 20, &f);
            let mut blk = vec![0u8; bs as usize];
            for b in 0..c.blocks_count().unwrap_or(0) {
                r.read_exact(&mut blk).with_context(|| {
                    format!(
                        "{}: reading block {b} (offset {})",
                        a.image.display(),
                        b * bs
                    )
                })?;
                c.observe(b * bs, &blk);
            }
        }
    } else {
        let mut err = None;
        c.learn_from_image(|off, buf| {
            buf.fill(0);
            let mut done = 0;
            while done < buf.len() {
                match f.read_at(&mut buf[done..], off + done as u64) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) => {
                        err.get_or_insert(format!("offset {}: {e}", off + done as u64));
                        break;
                    }
                }
            }
        });
        if let Some(e) = err {
            bail!("{}: read failed at {e}", a.image.display());
        }
    }
    let (Some(bs), Some(blocks)) = (c.block_size(), c.blocks_count()) else {
        bail!(
            "{}: no ext4 superblock (magic 0xEF53 at byte 1080) or an unsupported feature \
             (bigalloc); the server would classify this device with its rules",
            a.image.display()
        );
    };
    let mut counts: Vec<(&str, u64)> = FS_CLASSES.iter().map(|c| (*c, 0)).collect();
    counts.push(("unallocated", 0));
    for b in 0..blocks {
        let name = class_name(c.classify_block(b));
        if let Some(e) = counts.iter_mut().find(|(n, _)| *n == name) {
            e.1 += 1;
        }
    }
    let st = c.stats();
    let mem = c.approx_memory_bytes();
    if a.json {
        let classes: serde_json::Map<String, serde_json::Value> = counts
            .iter()
            .map(|(n, v)| (n.to_string(), serde_json::json!(v)))
            .collect();
        let v = serde_json::json!({
            "image": a.image.display().to_string(),
            "block_size": bs,
            "blocks": blocks,
            "classes": classes,
            "inodes": st.inodes,
            "extents": st.extents,
            "tree_nodes": st.tree_nodes,
            "groups": st.groups,
            "memory_bytes": mem,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{}: ext4, {} blocks of {} bytes, {} groups",
        a.image.display(),
        blocks,
        bs,
        st.groups
    );
    println!("{:<12} {:>12} {:>8}", "class", "blocks", "share");
    for (n, v) in &counts {
        if *v > 0 {
            println!(
                "{:<12} {:>12} {:>7.2}%",
                n,
                v,
                100.0 * *v as f64 / blocks as f64
            );
        }
    }
    println!(
        "learned {} inodes, {} extents, {} extent tree nodes; ~{} KiB of memory \
         (~{} bytes per extent)",
        st.inodes,
        st.extents,
        st.tree_nodes,
        mem / 1024,
        BYTES_PER_EXTENT
    );
    Ok(())
}
