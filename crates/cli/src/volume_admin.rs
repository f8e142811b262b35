//! `ctl volume add|remove` on a running `serve` of several volumes (issue 15 item 1): the
//! control socket's `addvolume` and `removevolume` requests, answered here because they
//! need what only `serve` holds: the backing device opener (`--device-timeout`,
//! `--emulate-hdd`), the pool's set of backing devices ([`VolumeSlots`]) and the NBD
//! server's export list ([`ExportsHandle`]). Every other request goes to
//! [`control::handle`].
//!
//! Add: the device is opened and checked, the cache volume records the new volume (table
//! entry written and synced), its device joins the set, then its export is offered: when
//! the reply comes, `nbdinfo --list` lists it and it serves reads and writes.
//! Remove: the cache volume refuses while the volume has dirty lines, otherwise its requests
//! fail from then on (EIO to a client still connected), its entry is flagged removed
//! (synced) and its clean lines leave the pool; then its export is withdrawn (a new
//! connection asking for it is told it was removed) and its device let go.

use anyhow::Result;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use tiercache_engine::Mode;
use tiercache_nbd::ExportsHandle;
use tiercache_server::control::{self, Command};
use tiercache_server::dev::BlockDev;
use tiercache_server::volume_set::VolumeSlots;
use tiercache_server::LiveVolume;

/// Opens a volume's backing device as `serve --volume` does.
pub(crate) type OpenFn = dyn Fn(&Path) -> Result<Box<dyn BlockDev>> + Send + Sync;
/// [`OpenFn`], owned.
pub(crate) type OpenDev = Box<OpenFn>;

/// What `serve` keeps to add and remove volumes while it runs (see the module doc).
pub(crate) struct VolumeAdmin {
    pub slots: VolumeSlots,
    pub open: OpenDev,
    /// Set once the NBD server is built.
    pub exports: Arc<OnceLock<ExportsHandle>>,
    /// One add or remove at a time.
    busy: Mutex<()>,
}

/// A line on the server's stderr (its log), as `serve` says things; errors writing ignored.
fn say(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Why a client asking for a removed export is refused.
const REMOVED: &str = "its volume was removed with `tiercache ctl volume remove`";

impl VolumeAdmin {
    pub fn new(slots: VolumeSlots, open: OpenDev) -> VolumeAdmin {
        VolumeAdmin {
            slots,
            open,
            exports: Arc::new(OnceLock::new()),
            busy: Mutex::new(()),
        }
    }

    /// The reply to one control request line.
    pub fn answer(&self, vol: &Arc<dyn LiveVolume>, line: &str) -> serde_json::Value {
        let r = match serde_json::from_str::<Command>(line) {
            Ok(Command::AddVolume {
                name,
                backing,
                mode,
            }) => self.add(vol, &name, &backing, mode.as_deref()),
            Ok(Command::RemoveVolume { name }) => self.remove(vol, &name),
            _ => return control::handle(&**vol, line),
        };
        r.unwrap_or_else(|e| serde_json::json!({"ok": false, "error": e}))
    }

    fn handle(&self) -> Result<&ExportsHandle, String> {
        self.exports
            .get()
            .ok_or_else(|| "the NBD server is not serving yet: try again".to_string())
    }

    fn add(
        &self,
        vol: &Arc<dyn LiveVolume>,
        name: &str,
        backing: &str,
        mode: Option<&str>,
    ) -> Result<serde_json::Value, String> {
        let _one = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let exports = self.handle()?;
        tiercache_server::volume_set::check_name(name)?;
        if vol.volumes().is_empty() {
            return Err("this server serves one volume (started with --backing): volumes are added to a server of several (serve --volume NAME=BACKING)".into());
        }
        let mode = mode
            .map(|m| m.parse::<Mode>())
            .transpose()
            .map_err(|e| format!("--mode: {e}"))?;
        let dev = (self.open)(Path::new(backing)).map_err(|e| format!("volume {name}: {e:#}"))?;
        let (size, identity) = (dev.size(), dev.identity());
        let id = vol.add_volume(name, size, identity, mode)?;
        let undo = |why: String| {
            // Nothing was offered yet: the volume leaves as it came (no line of it).
            if let Err(e) = vol.remove_volume(name) {
                say(&format!(
                    "error: volume {name}: undoing the add failed: {e}"
                ));
            }
            Err(why)
        };
        if let Err(e) = self.slots.add(id, name, dev) {
            return undo(e);
        }
        if let Err(e) = exports.add(name, tiercache_server::live::export_of(vol, id, size)) {
            self.slots.remove(id);
            return undo(e);
        }
        say(&format!(
            "volume {name} added: backing {backing}, {size} bytes, id {id}"
        ));
        Ok(serde_json::json!({"ok": true, "id": id, "size": size}))
    }

    fn remove(&self, vol: &Arc<dyn LiveVolume>, name: &str) -> Result<serde_json::Value, String> {
        let _one = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let exports = self.handle()?;
        let (id, lines) = vol.remove_volume(name)?;
        exports.remove(name, REMOVED);
        self.slots.remove(id);
        say(&format!(
            "volume {name} removed: {lines} clean lines left the pool"
        ));
        Ok(serde_json::json!({"ok": true, "id": id, "lines_dropped": lines}))
    }
}
