//! Linux battery watcher: polls `/sys/class/power_supply/*` (type `Battery`) and raises
//! `power_state = low_battery` once when a discharging battery falls to the threshold; the
//! machine's `low_battery` interrupt then checkpoints at once and carries on. It re-arms when the
//! battery charges or climbs back above the threshold. No battery (a server): it never fires.
//!
//! Design: a detached thread that only writes one slot, so the engine loop needs no knowledge of
//! it; dropping the [`BatteryWatcher`] stops it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::scheduler::{PowerState, Slots};

/// The kernel's power-supply class directory.
pub const POWER_SUPPLY_DIR: &str = "/sys/class/power_supply";

/// One battery's reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatteryReading {
    /// Charge in percent (sysfs `capacity`).
    pub percent: u32,
    /// Whether the battery is discharging (sysfs `status` is `Discharging`).
    pub discharging: bool,
}

/// Reads every battery under `root`; the lowest charge wins, discharging if any is.
pub fn read_batteries(root: &Path) -> Option<BatteryReading> {
    let mut lowest: Option<BatteryReading> = None;
    for entry in std::fs::read_dir(root).ok()?.flatten() {
        let dir = entry.path();
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        if read("type").is_none_or(|t| t.trim() != "Battery") {
            continue;
        }
        let Some(percent) = read("capacity").and_then(|c| c.trim().parse::<u32>().ok()) else {
            continue;
        };
        let discharging = read("status").is_some_and(|s| s.trim() == "Discharging");
        let reading = BatteryReading {
            percent,
            discharging,
        };
        lowest = Some(match lowest {
            Some(l) if l.percent <= percent => BatteryReading {
                discharging: l.discharging || discharging,
                ..l
            },
            Some(l) => BatteryReading {
                discharging: l.discharging || discharging,
                ..reading
            },
            None => reading,
        });
    }
    lowest
}

/// Whether the watcher should fire now, and whether it stays armed afterwards.
fn decide(reading: Option<BatteryReading>, threshold: u32, armed: bool) -> (bool, bool) {
    match reading {
        Some(r) if r.discharging && r.percent <= threshold => (armed, false),
        _ => (false, true),
    }
}

/// A running watcher; stops when dropped.
pub struct BatteryWatcher {
    stop: Arc<AtomicBool>,
}

impl BatteryWatcher {
    /// Watches `root` every `every`, raising low_battery in `slots` at `threshold` percent.
    /// Returns None when `threshold` is 0 (off) or `root` has no battery to watch.
    pub fn spawn(root: PathBuf, threshold: u32, every: Duration, slots: Slots) -> Option<Self> {
        let first = read_batteries(&root);
        if threshold == 0 || first.is_none() {
            return None;
        }
        // The first reading acts before this returns: an engine started on a low battery
        // checkpoints at its first step, whatever the thread scheduler does.
        let check = move |reading, armed| {
            let (fire, rearm) = decide(reading, threshold, armed);
            if fire {
                tracing::warn!("battery at or below {threshold}%: checkpointing");
                slots.set_power_state(PowerState::LowBattery);
            }
            rearm
        };
        let mut armed = check(first, true);
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        std::thread::Builder::new()
            .name("sov-battery".into())
            .spawn(move || {
                while !thread_stop.load(Ordering::Relaxed) {
                    std::thread::sleep(every);
                    armed = check(read_batteries(&root), armed);
                }
            })
            .ok()?;
        Some(Self { stop })
    }
}

impl Drop for BatteryWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn battery(root: &Path, name: &str, kind: &str, capacity: &str, status: &str) {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("type"), format!("{kind}\n")).unwrap();
        std::fs::write(d.join("capacity"), format!("{capacity}\n")).unwrap();
        std::fs::write(d.join("status"), format!("{status}\n")).unwrap();
    }

    #[test]
    fn reads_the_lowest_battery_and_ignores_mains() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(read_batteries(root.path()), None);
        battery(root.path(), "AC", "Mains", "100", "");
        assert_eq!(read_batteries(root.path()), None);
        battery(root.path(), "BAT0", "Battery", "55", "Charging");
        battery(root.path(), "BAT1", "Battery", "31", "Discharging");
        battery(root.path(), "BAT2", "Battery", "garbage", "Discharging");
        assert_eq!(
            read_batteries(root.path()),
            Some(BatteryReading {
                percent: 31,
                discharging: true
            })
        );
    }

    #[test]
    fn fires_once_per_crossing_and_rearms_on_charge() {
        let low = Some(BatteryReading {
            percent: 8,
            discharging: true,
        });
        let charging = Some(BatteryReading {
            percent: 8,
            discharging: false,
        });
        assert_eq!(decide(low, 10, true), (true, false));
        assert_eq!(decide(low, 10, false), (false, false));
        assert_eq!(decide(charging, 10, false), (false, true));
        assert_eq!(decide(low, 5, true), (false, true));
        assert_eq!(decide(None, 10, true), (false, true));
    }

    #[test]
    fn raises_low_battery_in_the_slots() {
        let root = tempfile::tempdir().unwrap();
        battery(root.path(), "BAT0", "Battery", "50", "Discharging");
        let slots = Slots::new();
        let w = BatteryWatcher::spawn(
            root.path().to_path_buf(),
            20,
            Duration::from_millis(5),
            slots.clone(),
        )
        .expect("a battery to watch");
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(slots.power_state(), PowerState::Active);
        battery(root.path(), "BAT0", "Battery", "19", "Discharging");
        let t0 = std::time::Instant::now();
        while slots.power_state() != PowerState::LowBattery {
            assert!(t0.elapsed() < Duration::from_secs(5), "never fired");
            std::thread::sleep(Duration::from_millis(5));
        }
        // The machine clears it; the watcher must not raise it again while still low.
        slots.set_power_state(PowerState::Active);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(slots.power_state(), PowerState::Active);
        drop(w);
        assert!(
            BatteryWatcher::spawn(root.path().into(), 0, Duration::from_millis(5), slots).is_none()
        );
    }
}
