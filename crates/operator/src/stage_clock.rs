//! Stage timings of a reconcile pass, for the debug log.

/// How long each stage of a pass took, logged at debug level when the pass ends.
pub struct StageClock {
    what: &'static str,
    last: std::time::Instant,
    laps: Vec<(&'static str, u128)>,
}

impl StageClock {
    /// Starts timing.
    pub fn start(what: &'static str) -> Self {
        Self {
            what,
            last: std::time::Instant::now(),
            laps: Vec::new(),
        }
    }

    /// Ends the stage `stage`.
    pub fn lap(&mut self, stage: &'static str) {
        let now = std::time::Instant::now();
        self.laps.push((stage, (now - self.last).as_millis()));
        self.last = now;
    }

    /// Logs every stage's duration (debug).
    pub fn log(&self) {
        let total: u128 = self.laps.iter().map(|(_, ms)| ms).sum();
        let laps: Vec<String> = self
            .laps
            .iter()
            .map(|(s, ms)| format!("{s} {ms}"))
            .collect();
        tracing::debug!(what = self.what, total_ms = total, stages_ms = %laps.join(", "), "stage timing");
    }
}
