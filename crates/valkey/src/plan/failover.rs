//! Failover target choice and failback planning.

/// A replica that could take over its primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaCandidate<N> {
    /// Node identity (node id, pod name, …).
    pub node: N,
    /// Whether the replica is synced: link to its primary up and no full sync in progress.
    pub synced: bool,
    /// Replication offset the replica has processed.
    pub offset: i64,
}

/// The synced replica with the highest offset; ties go to the smallest node key, so the
/// choice is deterministic. `None` when no replica is synced.
pub fn choose_failover_target<N: Ord>(
    candidates: &[ReplicaCandidate<N>],
) -> Option<&ReplicaCandidate<N>> {
    candidates
        .iter()
        .filter(|c| c.synced)
        .max_by(|a, b| a.offset.cmp(&b.offset).then_with(|| b.node.cmp(&a.node)))
}

/// Live state of one member of a shard, as far as failback cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberState<N> {
    /// Node identity.
    pub node: N,
    /// Whether the node is currently the primary of the shard.
    pub is_primary: bool,
    /// The primary this node replicates from, if it is a replica.
    pub following: Option<N>,
    /// Whether its replication link is up and not in a full sync.
    pub synced: bool,
}

/// One shard: which node should be primary and the members' live roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlacement<S, N> {
    /// Shard identity.
    pub shard: S,
    /// The node meant to be primary (e.g. the shard's node-index-0 pod).
    pub intended_primary: N,
    /// Live members.
    pub members: Vec<MemberState<N>>,
}

/// A failback step: promote `promote` (a synced replica of `current_primary`) with a
/// coordinated `CLUSTER FAILOVER` issued on `promote`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailbackStep<S, N> {
    /// Shard being realigned.
    pub shard: S,
    /// Node to promote back to primary.
    pub promote: N,
    /// Current primary that will become a replica.
    pub current_primary: N,
}

/// Why a shard is not failed back now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailbackBlocker {
    /// The intended node already is the primary.
    AlreadyPrimary,
    /// The shard has no single live primary.
    NoPrimary,
    /// The intended node is not a live member.
    IntendedMissing,
    /// The intended node does not replicate from the current primary.
    NotFollowingPrimary,
    /// The intended node's replication is not in sync yet.
    NotSynced,
}

/// Whether shard `p` can be failed back now, and how.
pub fn failback_for<S: Clone, N: Clone + PartialEq>(
    p: &ShardPlacement<S, N>,
) -> Result<FailbackStep<S, N>, FailbackBlocker> {
    let primaries: Vec<&MemberState<N>> = p.members.iter().filter(|m| m.is_primary).collect();
    let intended = p.members.iter().find(|m| m.node == p.intended_primary);
    if intended.is_some_and(|m| m.is_primary) {
        return Err(FailbackBlocker::AlreadyPrimary);
    }
    let [current] = primaries.as_slice() else {
        return Err(FailbackBlocker::NoPrimary);
    };
    let intended = intended.ok_or(FailbackBlocker::IntendedMissing)?;
    if intended.following.as_ref() != Some(&current.node) {
        return Err(FailbackBlocker::NotFollowingPrimary);
    }
    if !intended.synced {
        return Err(FailbackBlocker::NotSynced);
    }
    Ok(FailbackStep {
        shard: p.shard.clone(),
        promote: intended.node.clone(),
        current_primary: current.node.clone(),
    })
}

/// The next failback to perform, one shard at a time: the first shard (in the given order)
/// whose intended primary is a synced replica of the shard's current primary.
pub fn plan_failback<S: Clone, N: Clone + PartialEq>(
    shards: &[ShardPlacement<S, N>],
) -> Option<FailbackStep<S, N>> {
    shards.iter().find_map(|p| failback_for(p).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(node: &str, synced: bool, offset: i64) -> ReplicaCandidate<String> {
        ReplicaCandidate {
            node: node.into(),
            synced,
            offset,
        }
    }

    #[test]
    fn failover_prefers_highest_synced_offset() {
        let c = [
            cand("b", true, 10),
            cand("a", false, 99),
            cand("c", true, 12),
        ];
        assert_eq!(choose_failover_target(&c).unwrap().node, "c");
        let tie = [cand("c", true, 12), cand("b", true, 12)];
        assert_eq!(choose_failover_target(&tie).unwrap().node, "b");
        let tie_rev = [cand("b", true, 12), cand("c", true, 12)];
        assert_eq!(choose_failover_target(&tie_rev).unwrap().node, "b");
        assert_eq!(choose_failover_target(&[cand("a", false, 5)]), None);
        assert_eq!(choose_failover_target::<String>(&[]), None);
    }

    fn member(
        node: &str,
        is_primary: bool,
        following: Option<&str>,
        synced: bool,
    ) -> MemberState<String> {
        MemberState {
            node: node.into(),
            is_primary,
            following: following.map(Into::into),
            synced,
        }
    }

    fn shard(
        name: &str,
        intended: &str,
        members: Vec<MemberState<String>>,
    ) -> ShardPlacement<String, String> {
        ShardPlacement {
            shard: name.into(),
            intended_primary: intended.into(),
            members,
        }
    }

    #[test]
    fn failback_cases() {
        let aligned = shard(
            "s0",
            "s0-0",
            vec![
                member("s0-0", true, None, false),
                member("s0-1", false, Some("s0-0"), true),
            ],
        );
        assert_eq!(failback_for(&aligned), Err(FailbackBlocker::AlreadyPrimary));

        let flipped = shard(
            "s1",
            "s1-0",
            vec![
                member("s1-1", true, None, false),
                member("s1-0", false, Some("s1-1"), true),
            ],
        );
        assert_eq!(
            failback_for(&flipped),
            Ok(FailbackStep {
                shard: "s1".into(),
                promote: "s1-0".into(),
                current_primary: "s1-1".into()
            })
        );

        let syncing = shard(
            "s2",
            "s2-0",
            vec![
                member("s2-1", true, None, false),
                member("s2-0", false, Some("s2-1"), false),
            ],
        );
        assert_eq!(failback_for(&syncing), Err(FailbackBlocker::NotSynced));

        let elsewhere = shard(
            "s3",
            "s3-0",
            vec![
                member("s3-1", true, None, false),
                member("s3-0", false, Some("zz"), true),
            ],
        );
        assert_eq!(
            failback_for(&elsewhere),
            Err(FailbackBlocker::NotFollowingPrimary)
        );

        let gone = shard("s4", "s4-0", vec![member("s4-1", true, None, false)]);
        assert_eq!(failback_for(&gone), Err(FailbackBlocker::IntendedMissing));

        let headless = shard(
            "s5",
            "s5-0",
            vec![member("s5-0", false, Some("s5-1"), false)],
        );
        assert_eq!(failback_for(&headless), Err(FailbackBlocker::NoPrimary));

        let split = shard(
            "s6",
            "s6-0",
            vec![
                member("s6-1", true, None, false),
                member("s6-2", true, None, false),
                member("s6-0", false, Some("s6-1"), true),
            ],
        );
        assert_eq!(failback_for(&split), Err(FailbackBlocker::NoPrimary));

        // one at a time, in order
        let all = vec![
            aligned,
            syncing,
            flipped.clone(),
            shard(
                "s7",
                "s7-0",
                flipped
                    .members
                    .iter()
                    .map(|m| MemberState {
                        node: m.node.replace("s1", "s7"),
                        following: m.following.as_ref().map(|f| f.replace("s1", "s7")),
                        ..m.clone()
                    })
                    .collect(),
            ),
        ];
        assert_eq!(plan_failback(&all).unwrap().shard, "s1");
        assert_eq!(plan_failback(&all[..2]), None);
    }
}
