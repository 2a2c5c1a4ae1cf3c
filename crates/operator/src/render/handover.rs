//! The server container's `preStop` hook: hold a primary's `SIGTERM` until the operator has
//! handed its slots over.
//!
//! When a pod is deleted (by a user, a node drain or an eviction), a primary that stops on
//! `SIGTERM` leaves its clients without a writer until a replica is elected, and they must
//! find the new primary on their own. The hook gives the operator time to do better: while the
//! node is a primary owning slots with a replica online, it waits (at most
//! [`handover_wait_seconds`]); the operator sees the pod terminating and runs a coordinated
//! `CLUSTER FAILOVER` on the most caught-up replica (`cluster/plan/handover.rs`). Once the node
//! is demoted, the hook lingers [`LINGER_SECONDS`] so that clients writing to it are redirected
//! by `MOVED` from a live node, then returns and the kubelet sends `SIGTERM` to a replica.
//! Without an operator (or without a synced replica) the hook gives up after the bound and the
//! server stops as before. It authenticates as the read-only `_exporter` user, like the probes.

use super::paths::CONFIG_DIR;
use super::probes::cli_prelude;

/// ConfigMap key of the hook script.
pub const HANDOVER_KEY: &str = "prestop.sh";

/// Seconds the hook lingers after the node was demoted.
pub const LINGER_SECONDS: u32 = 1;

/// Longest wait for the operator's hand-over: a third of the termination grace period (the
/// rest is for the server's shutdown), at most 10 s.
pub fn handover_wait_seconds(termination_grace_period_seconds: i64) -> u32 {
    u32::try_from((termination_grace_period_seconds / 3).clamp(0, 10)).unwrap_or(0)
}

/// Command of the `preStop` exec hook.
pub fn handover_command() -> Vec<String> {
    vec!["sh".into(), format!("{CONFIG_DIR}/{HANDOVER_KEY}")]
}

/// The hook script (POSIX sh, awk and grep, all in the Valkey images).
pub fn handover_script(tls: bool, wait_seconds: u32) -> String {
    format!(
        r#"#!/bin/sh
# Rendered by valkey-operator: preStop hook; see the operator's render/handover.rs.
{prelude}# A primary owning slots (its own CLUSTER NODES line lists slots after 8 fields).
owns_slots() {{
  cli CLUSTER NODES | awk '$3 ~ /myself/ && $3 ~ /master/ && NF > 8 {{found=1}} END {{exit !found}}'
}}
replica_online() {{
  cli INFO replication | grep -q '^slave[0-9]*:.*state=online'
}}
owns_slots && replica_online || exit 0
echo "primary owning slots: waiting up to {wait_seconds}s for the operator to hand them over"
# A failover drops the replica's link just before this node is demoted: only a replica
# missing for 5 ticks in a row ends the wait.
i=0
missing=0
while [ "$i" -lt {ticks} ]; do
  if ! owns_slots; then
    echo "handed over; stopping in {LINGER_SECONDS}s"
    sleep {LINGER_SECONDS}
    exit 0
  fi
  if replica_online; then missing=0; else missing=$((missing + 1)); fi
  if [ "$missing" -ge 5 ]; then
    echo "no replica online any more: stopping"
    exit 0
  fi
  sleep 0.1
  i=$((i + 1))
done
echo "no hand-over within {wait_seconds}s: stopping"
"#,
        prelude = cli_prelude(tls),
        ticks = wait_seconds * 10,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_is_a_third_of_the_grace_period_at_most_ten_seconds() {
        assert_eq!(handover_wait_seconds(30), 10);
        assert_eq!(handover_wait_seconds(12), 4);
        assert_eq!(handover_wait_seconds(2), 0);
        assert_eq!(handover_wait_seconds(3600), 10);
    }

    #[test]
    fn script_snapshot() {
        insta::assert_snapshot!("prestop_plain", handover_script(false, 10));
    }
}
