//! Machine-wide allocation of environment slots, so that several environments
//! (one per test binary, or a CLI run) never share a bridge, a pod CIDR or a
//! state directory. A slot is held by an exclusive `flock` for the lifetime
//! of the environment and is released when its process exits, even by crash.
//!
//! Two environments on one slot would put two pods with the same IP on one bridge: a
//! `CLUSTER MEET` then reaches a server of the other environment and merges two Valkey
//! clusters. So the lock files live in `/run/lock` (where temp-directory cleaners do not
//! reach; the temp directory only when that is not writable), and a slot whose bridge belongs
//! to a live process is skipped even if its lock file was free (deleted under a running
//! environment). A bridge whose owner died is a crashed run's: the new environment cleans it.

use std::fs::File;
use std::path::PathBuf;

use nix::fcntl::{Flock, FlockArg};

/// Number of slots: pod CIDRs are /24 slices `10.244.<slot>.0/24`.
pub const SLOTS: u8 = 250;

/// A held slot.
#[derive(Debug)]
pub struct Slot {
    pub index: u8,
    _lock: Flock<File>,
}

/// Preferred home of the lock files: cleared at boot, like the locks.
const RUN_LOCK_DIR: &str = "/run/lock/localkube-slots";

fn lock_dir() -> PathBuf {
    let run = PathBuf::from(RUN_LOCK_DIR);
    if std::fs::create_dir_all(&run).is_ok() {
        // World-writable like /run/lock itself: environments of other users share the slots.
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o1777));
        if File::create(run.join(".probe")).is_ok() {
            return run;
        }
    }
    std::env::temp_dir().join("localkube-slots")
}

/// Whether another live process owns slot `index`'s bridge (its lock file was deleted under
/// it): taking the slot would put a second pod on each of its IPs.
fn owned_elsewhere(index: u8) -> bool {
    crate::runtime::network::bridge_owner(&bridge_name(index)).is_some_and(|pid| {
        pid != std::process::id() && crate::runtime::pidfile::start_time(pid as i32).is_some()
    })
}

fn bridge_name(index: u8) -> String {
    format!("lkbr{index}")
}

impl Slot {
    /// Takes the first free slot.
    pub fn acquire() -> std::io::Result<Slot> {
        let dir = lock_dir();
        std::fs::create_dir_all(&dir)?;
        for index in 0..SLOTS {
            let file = File::create(dir.join(format!("{index}.lock")))?;
            if let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                if owned_elsewhere(index) {
                    tracing::warn!(
                        slot = index,
                        "the slot's lock file was free but a live process owns its bridge; skipping it"
                    );
                    continue;
                }
                return Ok(Slot { index, _lock: lock });
            }
        }
        Err(std::io::Error::other("all localkube slots are in use"))
    }

    /// Takes a specific slot, failing if it is held.
    pub fn acquire_index(index: u8) -> std::io::Result<Slot> {
        let dir = lock_dir();
        std::fs::create_dir_all(&dir)?;
        let file = File::create(dir.join(format!("{index}.lock")))?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
            std::io::Error::other(format!("localkube slot {index} is in use: {e}"))
        })?;
        if owned_elsewhere(index) {
            return Err(std::io::Error::other(format!(
                "localkube slot {index} is in use: a live process owns its bridge"
            )));
        }
        Ok(Slot { index, _lock: lock })
    }

    /// Bridge name of this slot's environment.
    pub fn bridge(&self) -> String {
        bridge_name(self.index)
    }

    /// Pod CIDR of this slot's environment.
    pub fn pod_cidr(&self) -> ipnet::Ipv4Net {
        ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(10, 244, self.index, 0), 24).unwrap_or_default()
    }
}
