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
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn failover_choice_is_best_synced_and_order_independent(
            raw in proptest::collection::vec((0u8..20, any::<bool>(), 0i64..50), 0..12),
            rotate in 0usize..12,
        ) {
            let cands: Vec<ReplicaCandidate<u8>> = raw
                .iter()
                .map(|(node, synced, offset)| ReplicaCandidate { node: *node, synced: *synced, offset: *offset })
                .collect();
            let chosen = choose_failover_target(&cands).cloned();
            let mut rotated = cands.clone();
            if !rotated.is_empty() {
                let k = rotate % rotated.len();
                rotated.rotate_left(k);
            }
            rotated.reverse();
            prop_assert_eq!(choose_failover_target(&rotated).cloned(), chosen.clone());
            match chosen {
                None => prop_assert!(cands.iter().all(|c| !c.synced)),
                Some(c) => {
                    prop_assert!(c.synced);
                    for o in cands.iter().filter(|o| o.synced) {
                        prop_assert!(o.offset < c.offset || (o.offset == c.offset && o.node >= c.node));
                    }
                }
            }
        }

        #[test]
        fn failback_only_promotes_synced_replicas_of_the_current_primary(
            shards in proptest::collection::vec(
                proptest::collection::vec((any::<bool>(), 0u8..4, any::<bool>()), 1..4),
                0..5,
            ),
        ) {
            let placements: Vec<ShardPlacement<usize, (usize, u8)>> = shards
                .iter()
                .enumerate()
                .map(|(si, members)| ShardPlacement {
                    shard: si,
                    intended_primary: (si, 0),
                    members: members
                        .iter()
                        .enumerate()
                        .map(|(i, (is_primary, follow, synced))| MemberState {
                            node: (si, i as u8),
                            is_primary: *is_primary,
                            following: (!is_primary).then_some((si, *follow)),
                            synced: *synced,
                        })
                        .collect(),
                })
                .collect();
            match plan_failback(&placements) {
                None => prop_assert!(placements.iter().all(|p| failback_for(p).is_err())),
                Some(step) => {
                    let p = &placements[step.shard];
                    prop_assert!(placements[..step.shard].iter().all(|p| failback_for(p).is_err()));
                    prop_assert_eq!(step.promote, p.intended_primary);
                    let primaries: Vec<_> = p.members.iter().filter(|m| m.is_primary).collect();
                    prop_assert_eq!(primaries.len(), 1);
                    prop_assert_eq!(primaries[0].node, step.current_primary);
                    let m = p.members.iter().find(|m| m.node == step.promote).unwrap();
                    prop_assert!(!m.is_primary && m.synced);
                    prop_assert_eq!(m.following, Some(step.current_primary));
                }
            }
        }
    }

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
