//! The kubelet's container restart back-off: the first restart is
//! immediate, then 10 s, doubling on every restart up to 5 minutes; reset
//! once a container has run for longer than twice the maximum.

use std::time::{Duration, Instant};

/// First back-off after a container exits.
pub const INITIAL: Duration = Duration::from_secs(10);
/// Largest back-off.
pub const MAX: Duration = Duration::from_secs(300);

/// Per-container back-off state.
#[derive(Debug, Clone, Default)]
pub struct Backoff {
    current: Option<Duration>,
    last: Option<Instant>,
    initial: Option<Duration>,
}

impl Backoff {
    /// A back-off with a custom initial delay (tests); maximum stays 5 min.
    pub fn with_initial(initial: Duration) -> Self {
        Self {
            initial: Some(initial),
            ..Self::default()
        }
    }

    /// Called when a container exited at `now` and should be restarted:
    /// returns how long to wait first. Like the kubelet, the first restart
    /// is immediate, then 10 s, 20 s, 40 s, ... up to 5 minutes.
    pub fn next(&mut self, now: Instant) -> Duration {
        let initial = self.initial.unwrap_or(INITIAL);
        let stale = self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) > 2 * MAX);
        if stale {
            self.current = None;
        }
        self.last = Some(now);
        match self.current {
            None => {
                self.current = Some(initial);
                Duration::ZERO
            }
            Some(current) => {
                self.current = Some((current * 2).min(MAX));
                current
            }
        }
    }

    /// The delay currently in effect, if any.
    pub fn current(&self) -> Option<Duration> {
        self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_five_minutes() {
        let mut b = Backoff::default();
        let t = Instant::now();
        let delays: Vec<u64> = (0..8)
            .map(|i| b.next(t + Duration::from_secs(i)).as_secs())
            .collect();
        assert_eq!(delays, vec![0, 10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn resets_after_long_quiet_period() {
        let mut b = Backoff::default();
        let t = Instant::now();
        b.next(t);
        b.next(t + Duration::from_secs(1));
        assert_eq!(
            b.next(t + Duration::from_secs(2 * 300 + 10)),
            Duration::ZERO
        );
        assert_eq!(b.next(t + Duration::from_secs(2 * 300 + 11)), INITIAL);
    }
}
