//! Machine-wide allocation of environment slots, so that several environments
//! (one per test binary, or a CLI run) never share a bridge, a pod CIDR or a
//! state directory. A slot is held by an exclusive `flock` for the lifetime
//! of the environment and is released when its process exits, even by crash.

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

fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("localkube-slots")
}

impl Slot {
    /// Takes the first free slot.
    pub fn acquire() -> std::io::Result<Slot> {
        let dir = lock_dir();
        std::fs::create_dir_all(&dir)?;
        for index in 0..SLOTS {
            let file = File::create(dir.join(format!("{index}.lock")))?;
            if let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) {
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
        Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map(|lock| Slot { index, _lock: lock })
            .map_err(|(_, e)| {
                std::io::Error::other(format!("localkube slot {index} is in use: {e}"))
            })
    }

    /// Bridge name of this slot's environment.
    pub fn bridge(&self) -> String {
        format!("lkbr{}", self.index)
    }

    /// Pod CIDR of this slot's environment.
    pub fn pod_cidr(&self) -> ipnet::Ipv4Net {
        ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(10, 244, self.index, 0), 24).unwrap_or_default()
    }
}
