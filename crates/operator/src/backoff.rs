//! Capped exponential back-off for the start-up waits (CRDs, the Lease).

use std::time::Duration;

/// Delays that start at `initial`, double after each use and stop growing at `max`.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A back-off from `initial` doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial.min(max),
        }
    }

    /// The start-up default: 0.2 s doubling to 5 s.
    pub fn startup() -> Self {
        Self::new(Duration::from_millis(200), Duration::from_secs(5))
    }

    /// The delay to wait now; the following one is twice as long, at most `max`.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        d
    }

    /// Starts over from `initial` (after progress).
    pub fn reset(&mut self) {
        self.next = self.initial.min(self.max);
    }

    /// Sleeps for [`Backoff::next_delay`].
    pub async fn sleep(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::startup();
        let ms: Vec<u128> = (0..8).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(ms, [200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(200));
    }
}
