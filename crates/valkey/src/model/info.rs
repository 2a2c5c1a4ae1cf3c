//! Typed `CLUSTER INFO` and `INFO` (`replication`, `server`, `memory`, `persistence`) replies.
//!
//! Both replies are `key:value` lines with `# Section` headers; one `INFO server replication persistence`
//! reply can feed all three `INFO` structs since each reads only its own keys.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::error::ParseError;

/// The `key:value` fields of an `INFO`-style reply, section headers and blank lines skipped.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InfoFields(pub BTreeMap<String, String>);

impl InfoFields {
    /// Splits every `key:value` line on its first `:`.
    pub fn parse(text: &str) -> Self {
        Self(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    /// The raw value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn req(&self, key: &str) -> Result<&str, ParseError> {
        self.get(key)
            .ok_or_else(|| ParseError::MissingField(key.to_owned()))
    }

    fn num<T: FromStr>(&self, key: &str) -> Result<T, ParseError> {
        let v = self.req(key)?;
        v.parse().map_err(|_| ParseError::field(key, v))
    }

    fn opt_num<T: FromStr>(&self, key: &str) -> Result<Option<T>, ParseError> {
        self.get(key)
            .map(|v| v.parse().map_err(|_| ParseError::field(key, v)))
            .transpose()
    }

    fn flag(&self, key: &str) -> Result<bool, ParseError> {
        Ok(self.opt_num::<u8>(key)?.unwrap_or(0) != 0)
    }
}

/// `cluster_state` of `CLUSTER INFO`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClusterState {
    /// `ok`: all slots served.
    Ok,
    /// `fail`: some slot is unserved or the node is in a minority partition.
    Fail,
    /// Any other value, verbatim.
    Other(String),
}

/// Typed `CLUSTER INFO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterInfo {
    /// `cluster_state`.
    pub state: ClusterState,
    /// `cluster_slots_assigned`.
    pub slots_assigned: u32,
    /// `cluster_slots_ok`.
    pub slots_ok: u32,
    /// `cluster_slots_pfail`.
    pub slots_pfail: u32,
    /// `cluster_slots_fail`.
    pub slots_fail: u32,
    /// `cluster_nodes_pfail` (absent before Valkey 9).
    pub nodes_pfail: Option<u32>,
    /// `cluster_nodes_fail` (absent before Valkey 9).
    pub nodes_fail: Option<u32>,
    /// `cluster_known_nodes`.
    pub known_nodes: u32,
    /// `cluster_size`: number of primaries serving at least one slot.
    pub size: u32,
    /// `cluster_current_epoch`.
    pub current_epoch: u64,
    /// `cluster_my_epoch`.
    pub my_epoch: u64,
}

impl ClusterInfo {
    /// Parses a `CLUSTER INFO` reply.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let f = InfoFields::parse(text);
        let state = match f.req("cluster_state")? {
            "ok" => ClusterState::Ok,
            "fail" => ClusterState::Fail,
            other => ClusterState::Other(other.to_owned()),
        };
        Ok(Self {
            state,
            slots_assigned: f.num("cluster_slots_assigned")?,
            slots_ok: f.num("cluster_slots_ok")?,
            slots_pfail: f.num("cluster_slots_pfail")?,
            slots_fail: f.num("cluster_slots_fail")?,
            nodes_pfail: f.opt_num("cluster_nodes_pfail")?,
            nodes_fail: f.opt_num("cluster_nodes_fail")?,
            known_nodes: f.num("cluster_known_nodes")?,
            size: f.num("cluster_size")?,
            current_epoch: f.num("cluster_current_epoch")?,
            my_epoch: f.num("cluster_my_epoch")?,
        })
    }

    /// `cluster_state:ok` with all 16384 slots assigned and served.
    pub fn is_healthy(&self) -> bool {
        self.state == ClusterState::Ok
            && self.slots_assigned == u32::from(crate::slots::SLOT_COUNT)
            && self.slots_ok == self.slots_assigned
    }
}

/// `role` of `INFO replication`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplicationRole {
    /// `master`
    Primary,
    /// `slave`
    Replica,
}

/// `master_link_status` of a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrimaryLinkStatus {
    /// `up`
    Up,
    /// `down`
    Down,
}

/// One `slaveN:ip=…,port=…,state=…,offset=…,lag=…` line of a primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectedReplica {
    /// The `N` of `slaveN`.
    pub index: u32,
    /// Replica IP.
    pub ip: String,
    /// Replica port.
    pub port: u16,
    /// `state` (`online`, `wait_bgsave`, `send_bulk`, …).
    pub state: String,
    /// Acknowledged replication offset.
    pub offset: i64,
    /// Seconds since the last ack.
    pub lag: i64,
}

impl ConnectedReplica {
    /// Whether the replica is streaming (`state=online`).
    pub fn is_online(&self) -> bool {
        self.state == "online"
    }

    fn parse(index: u32, value: &str) -> Result<Self, ParseError> {
        let key = format!("slave{index}");
        let bad = || ParseError::field(&key, value);
        let kv: BTreeMap<&str, &str> = value.split(',').filter_map(|p| p.split_once('=')).collect();
        let get = |k: &str| kv.get(k).copied().ok_or_else(bad);
        Ok(Self {
            index,
            ip: get("ip")?.to_owned(),
            port: get("port")?.parse().map_err(|_| bad())?,
            state: get("state")?.to_owned(),
            offset: get("offset")?.parse().map_err(|_| bad())?,
            lag: kv
                .get("lag")
                .map_or(Ok(0), |l| l.parse().map_err(|_| bad()))?,
        })
    }
}

/// Typed `INFO replication`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicationInfo {
    /// `role`.
    pub role: ReplicationRole,
    /// `connected_slaves`.
    pub connected_replicas: u32,
    /// The `slaveN` lines (on a primary).
    pub replicas: Vec<ConnectedReplica>,
    /// `master_replid`.
    pub replid: String,
    /// `master_repl_offset`.
    pub master_repl_offset: i64,
    /// `master_host` (on a replica).
    pub primary_host: Option<String>,
    /// `master_port` (on a replica).
    pub primary_port: Option<u16>,
    /// `master_link_status` (on a replica).
    pub primary_link_status: Option<PrimaryLinkStatus>,
    /// `master_sync_in_progress` (on a replica).
    pub sync_in_progress: bool,
    /// `slave_repl_offset` (on a replica).
    pub replica_repl_offset: Option<i64>,
    /// `master_failover_state` (`no-failover`, `waiting-for-sync`, `failover-in-progress`).
    pub failover_state: Option<String>,
    /// `master_link_down_since_seconds` (on a replica whose link is down): seconds since the
    /// link broke, `-1` when this process never had a link to its primary (it has only what it
    /// loaded at start, if anything).
    pub primary_link_down_since: Option<i64>,
}

impl ReplicationInfo {
    /// Parses `INFO replication` (or a larger `INFO` reply containing it).
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        Self::from_fields(&InfoFields::parse(text))
    }

    /// Builds from already split fields.
    pub fn from_fields(f: &InfoFields) -> Result<Self, ParseError> {
        let role = match f.req("role")? {
            "master" | "primary" => ReplicationRole::Primary,
            "slave" | "replica" => ReplicationRole::Replica,
            other => return Err(ParseError::field("role", other)),
        };
        let mut replicas = Vec::new();
        for (k, v) in &f.0 {
            if let Some(n) = k.strip_prefix("slave").and_then(|n| n.parse::<u32>().ok()) {
                replicas.push(ConnectedReplica::parse(n, v)?);
            }
        }
        replicas.sort_by_key(|r| r.index);
        let primary_link_status = match f.get("master_link_status") {
            None => None,
            Some("up") => Some(PrimaryLinkStatus::Up),
            Some("down") => Some(PrimaryLinkStatus::Down),
            Some(other) => return Err(ParseError::field("master_link_status", other)),
        };
        Ok(Self {
            role,
            connected_replicas: f.opt_num("connected_slaves")?.unwrap_or(0),
            replicas,
            replid: f.get("master_replid").unwrap_or_default().to_owned(),
            master_repl_offset: f.opt_num("master_repl_offset")?.unwrap_or(0),
            primary_host: f.get("master_host").map(str::to_owned),
            primary_port: f.opt_num("master_port")?,
            primary_link_status,
            sync_in_progress: f.flag("master_sync_in_progress")?,
            replica_repl_offset: f.opt_num("slave_repl_offset")?,
            failover_state: f.get("master_failover_state").map(str::to_owned),
            primary_link_down_since: f.opt_num("master_link_down_since_seconds")?,
        })
    }

    /// A replica whose link to its primary is up and not in a full sync.
    pub fn is_synced_replica(&self) -> bool {
        self.role == ReplicationRole::Replica
            && self.primary_link_status == Some(PrimaryLinkStatus::Up)
            && !self.sync_in_progress
    }

    /// The offset that tells how caught up this node is: `slave_repl_offset` on a
    /// replica, `master_repl_offset` otherwise.
    pub fn offset(&self) -> i64 {
        match self.role {
            ReplicationRole::Replica => self.replica_repl_offset.unwrap_or(self.master_repl_offset),
            ReplicationRole::Primary => self.master_repl_offset,
        }
    }
}

/// A `major.minor.patch` server version, ordered numerically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Version {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

impl Version {
    /// `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// First version with atomic slot migration (`CLUSTER MIGRATESLOTS`).
    pub const ATOMIC_SLOT_MIGRATION: Version = Version::new(9, 0, 0);

    /// Whether `self >= major.minor.0`.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        *self >= Version::new(major, minor, 0)
    }

    /// Whether the server supports `CLUSTER MIGRATESLOTS` / `GETSLOTMIGRATIONS`.
    pub fn has_atomic_slot_migration(&self) -> bool {
        *self >= Self::ATOMIC_SLOT_MIGRATION
    }
}

impl FromStr for Version {
    type Err = ParseError;

    /// Parses `9.1.2`, `8.0`, `9` (missing parts are 0; a `-suffix` is ignored).
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let bad = || ParseError::InvalidVersion(s.to_owned());
        let core = s.trim().split(['-', '+', ' ']).next().unwrap_or_default();
        let mut parts = core.split('.');
        let mut next = |required: bool| -> Result<u32, ParseError> {
            match parts.next() {
                Some(p) => p.parse().map_err(|_| bad()),
                None if required => Err(bad()),
                None => Ok(0),
            }
        };
        let v = Version::new(next(true)?, next(false)?, next(false)?);
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(v)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Typed `INFO server` (the parts the operator uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// `server_name` (`valkey`; absent on Redis).
    pub server_name: Option<String>,
    /// The server's own version: `valkey_version` when present, else `redis_version`.
    pub version: Version,
    /// `redis_version` (Valkey reports the compatible Redis version, e.g. 7.2.4).
    pub redis_version: Version,
    /// `server_mode` (`cluster`, `standalone`, `sentinel`).
    pub mode: Option<String>,
    /// `run_id`.
    pub run_id: Option<String>,
    /// `tcp_port`.
    pub tcp_port: Option<u16>,
    /// `uptime_in_seconds`.
    pub uptime_seconds: Option<u64>,
    /// `server_time_usec`: the server's clock (Unix time in microseconds) when it answered.
    pub time_usec: Option<u64>,
}

impl ServerInfo {
    /// Parses `INFO server` (or a larger `INFO` reply containing it).
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        Self::from_fields(&InfoFields::parse(text))
    }

    /// Builds from already split fields.
    pub fn from_fields(f: &InfoFields) -> Result<Self, ParseError> {
        let redis_version: Version = f.req("redis_version")?.parse()?;
        let version = match f.get("valkey_version") {
            Some(v) => v.parse()?,
            None => redis_version,
        };
        Ok(Self {
            server_name: f.get("server_name").map(str::to_owned),
            version,
            redis_version,
            mode: f.get("server_mode").map(str::to_owned),
            run_id: f.get("run_id").map(str::to_owned),
            tcp_port: f.opt_num("tcp_port")?,
            uptime_seconds: f.opt_num("uptime_in_seconds")?,
            time_usec: f.opt_num("server_time_usec")?,
        })
    }
}

/// Typed `INFO memory` (the parts capacity decisions use), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryInfo {
    /// `used_memory`.
    pub used_memory: u64,
    /// `used_memory_startup`: what the server uses with an empty dataset.
    pub used_memory_startup: u64,
    /// `maxmemory` (0: no limit).
    pub maxmemory: u64,
    /// `mem_not_counted_for_evict` (replication backlog and buffers).
    pub not_counted_for_evict: u64,
}

impl MemoryInfo {
    /// Parses `INFO memory` (or a larger `INFO` reply containing it).
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        Self::from_fields(&InfoFields::parse(text))
    }

    /// Builds from already split fields.
    pub fn from_fields(f: &InfoFields) -> Result<Self, ParseError> {
        Ok(Self {
            used_memory: f.num("used_memory")?,
            used_memory_startup: f.opt_num("used_memory_startup")?.unwrap_or(0),
            maxmemory: f.opt_num("maxmemory")?.unwrap_or(0),
            not_counted_for_evict: f.opt_num("mem_not_counted_for_evict")?.unwrap_or(0),
        })
    }

    /// Memory counted against `maxmemory` (as the server counts it before evicting).
    pub fn counted(&self) -> u64 {
        self.used_memory.saturating_sub(self.not_counted_for_evict)
    }

    /// What the dataset takes beyond an empty server: roughly what moves with its slots.
    pub fn dataset(&self) -> u64 {
        self.counted().saturating_sub(self.used_memory_startup)
    }

    /// Room left under `maxmemory`; `None` without a limit.
    pub fn headroom(&self) -> Option<u64> {
        (self.maxmemory > 0).then(|| self.maxmemory.saturating_sub(self.counted()))
    }
}

/// Typed `INFO persistence` (the parts the operator uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistenceInfo {
    /// `loading`: a dataset is being loaded.
    pub loading: bool,
    /// `rdb_changes_since_last_save`.
    pub rdb_changes_since_last_save: u64,
    /// `rdb_bgsave_in_progress`.
    pub rdb_bgsave_in_progress: bool,
    /// `rdb_last_bgsave_status:ok`.
    pub rdb_last_bgsave_ok: bool,
    /// `rdb_last_save_time` (unix seconds).
    pub rdb_last_save_time: Option<u64>,
    /// `aof_enabled`.
    pub aof_enabled: bool,
    /// `aof_rewrite_in_progress`.
    pub aof_rewrite_in_progress: bool,
    /// `aof_last_bgrewrite_status:ok`.
    pub aof_last_bgrewrite_ok: bool,
    /// `aof_last_write_status:ok`.
    pub aof_last_write_ok: bool,
}

impl PersistenceInfo {
    /// Parses `INFO persistence` (or a larger `INFO` reply containing it).
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        Self::from_fields(&InfoFields::parse(text))
    }

    /// Builds from already split fields.
    pub fn from_fields(f: &InfoFields) -> Result<Self, ParseError> {
        let ok = |k: &str| f.get(k).is_none_or(|v| v == "ok");
        Ok(Self {
            loading: f.flag("loading")?,
            rdb_changes_since_last_save: f.opt_num("rdb_changes_since_last_save")?.unwrap_or(0),
            rdb_bgsave_in_progress: f.flag("rdb_bgsave_in_progress")?,
            rdb_last_bgsave_ok: ok("rdb_last_bgsave_status"),
            rdb_last_save_time: f.opt_num("rdb_last_save_time")?,
            aof_enabled: f.flag("aof_enabled")?,
            aof_rewrite_in_progress: f.flag("aof_rewrite_in_progress")?,
            aof_last_bgrewrite_ok: ok("aof_last_bgrewrite_status"),
            aof_last_write_ok: ok("aof_last_write_status"),
        })
    }

    /// Whether the last background save / AOF write failed.
    pub fn has_persistence_error(&self) -> bool {
        !self.rdb_last_bgsave_ok || !self.aof_last_write_ok || !self.aof_last_bgrewrite_ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real `CLUSTER INFO` of Valkey 9.1.2, healthy 3×1 cluster.
    const CLUSTER_INFO_OK: &str = "cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_slots_ok:16384\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_nodes_pfail:0\r\ncluster_nodes_fail:0\r\ncluster_voting_nodes_pfail:0\r\ncluster_voting_nodes_fail:0\r\ncluster_known_nodes:4\r\ncluster_size:3\r\ncluster_current_epoch:3\r\ncluster_my_epoch:1\r\ncluster_stats_messages_ping_sent:7\r\ncluster_stats_messages_pong_sent:16\r\ncluster_stats_messages_meet_sent:3\r\ncluster_stats_messages_sent:26\r\ncluster_stats_messages_ping_received:13\r\ncluster_stats_messages_pong_received:13\r\ncluster_stats_messages_received:26\r\ncluster_stats_bytes_sent:64128\r\ncluster_stats_bytes_received:63544\r\ncluster_stats_pubsub_bytes_sent:0\r\ncluster_stats_pubsub_bytes_received:0\r\ncluster_stats_module_bytes_sent:0\r\ncluster_stats_module_bytes_received:0\r\ntotal_cluster_links_buffer_limit_exceeded:0\r\n";

    /// Real `CLUSTER INFO` (first lines) of Valkey 9.1.2 after a slot-owning primary died.
    const CLUSTER_INFO_FAIL: &str = "cluster_state:fail\ncluster_slots_assigned:16384\ncluster_slots_ok:8822\ncluster_slots_pfail:0\ncluster_slots_fail:7562\ncluster_nodes_pfail:0\ncluster_nodes_fail:1\ncluster_voting_nodes_pfail:0\ncluster_voting_nodes_fail:1\ncluster_known_nodes:4\ncluster_size:3\ncluster_current_epoch:5\ncluster_my_epoch:4\n";

    /// Real `INFO replication` of a Valkey 9.1.2 primary with one replica.
    const REPL_PRIMARY: &str = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\nslave0:ip=127.0.0.1,port=17004,state=online,offset=14,lag=1,type=replica\r\nreplicas_waiting_psync:0\r\nmaster_failover_state:no-failover\r\nmaster_replid:a91b20da09ad3fc54fa297b832aae155604dce31\r\nmaster_replid2:0000000000000000000000000000000000000000\r\nmaster_repl_offset:14\r\nsecond_repl_offset:-1\r\nrepl_backlog_active:1\r\nrepl_backlog_size:10485760\r\nrepl_backlog_first_byte_offset:1\r\nrepl_backlog_histlen:14\r\n";

    /// Real `INFO replication` of a Valkey 9.1.2 replica during its first full sync.
    const REPL_REPLICA_SYNCING: &str = "# Replication\nrole:slave\nmaster_host:127.0.0.1\nmaster_port:17001\nmaster_link_status:down\nmaster_last_io_seconds_ago:-1\nmaster_sync_in_progress:1\nslave_read_repl_offset:1\nslave_repl_offset:1\nreplicas_repl_buffer_size:0\nreplicas_repl_buffer_peak:0\nmaster_sync_total_bytes:0\nmaster_sync_read_bytes:212\nmaster_sync_left_bytes:-212\nmaster_sync_perc:0.00\nmaster_sync_last_io_seconds_ago:0\nmaster_link_down_since_seconds:-1\nslave_priority:100\nslave_read_only:1\nreplica_announced:1\nconnected_slaves:0\nreplicas_waiting_psync:0\nmaster_failover_state:no-failover\nmaster_replid:8ac0f4d6e7d48f419da1b286a7501740467e6ec1\nmaster_replid2:0000000000000000000000000000000000000000\nmaster_repl_offset:0\nsecond_repl_offset:-1\nrepl_backlog_active:0\nrepl_backlog_size:10485760\nrepl_backlog_first_byte_offset:0\nrepl_backlog_histlen:0\n";

    /// Real `INFO replication` (first lines) of the same replica once synced.
    const REPL_REPLICA_UP: &str = "# Replication\nrole:slave\nmaster_host:127.0.0.1\nmaster_port:17001\nmaster_link_status:up\nmaster_last_io_seconds_ago:3\nmaster_sync_in_progress:0\nslave_read_repl_offset:14\nslave_repl_offset:14\nslave_priority:100\nslave_read_only:1\nreplica_announced:1\nconnected_slaves:0\nmaster_failover_state:no-failover\nmaster_replid:a91b20da09ad3fc54fa297b832aae155604dce31\nmaster_repl_offset:14\n";

    /// Real `INFO server` (first lines) of Valkey 9.1.2 and 8.0.1.
    const SERVER_9: &str = "# Server\nredis_version:7.2.4\nserver_name:valkey\nvalkey_version:9.1.2\nvalkey_release_stage:ga\nredis_git_sha1:00000000\nredis_git_dirty:1\nredis_build_id:1536df31c0395150\nserver_mode:cluster\nos:Linux 6.18.44-fc-v1045 x86_64\narch_bits:64\nmonotonic_clock:X86 TSC @ 2445.66 ticks/us\nmultiplexing_api:epoll\ngcc_version:14.2.1\nprocess_id:10820\nprocess_supervised:no\nrun_id:593323a125590dd07b82f8c46d8d13a49754c289\ntcp_port:17001\nserver_time_usec:1796206472786406\nuptime_in_seconds:11\n";
    const SERVER_8: &str = "# Server\nredis_version:7.2.4\nserver_name:valkey\nvalkey_version:8.0.1\nredis_git_sha1:00000000\nredis_git_dirty:0\nredis_build_id:39f7c371e0a96e3d\nserver_mode:standalone\n";

    /// Real `INFO persistence` of Valkey 9.1.2 (no AOF).
    const PERSISTENCE: &str = "# Persistence\nloading:0\nasync_loading:0\ncurrent_cow_peak:0\ncurrent_cow_size:0\ncurrent_cow_size_age:0\ncurrent_fork_perc:0.00\ncurrent_save_keys_processed:0\ncurrent_save_keys_total:0\nrdb_changes_since_last_save:0\nrdb_bgsave_in_progress:0\nrdb_last_save_time:1796206461\nrdb_last_bgsave_status:ok\nrdb_last_bgsave_time_sec:0\nrdb_current_bgsave_time_sec:-1\nrdb_saves:0\nrdb_last_cow_size:303104\nrdb_last_load_keys_expired:0\nrdb_last_load_keys_loaded:0\naof_enabled:0\naof_rewrite_in_progress:0\naof_rewrite_scheduled:0\naof_last_rewrite_time_sec:-1\naof_current_rewrite_time_sec:-1\naof_last_bgrewrite_status:ok\naof_rewrites:0\naof_rewrites_consecutive_failures:0\naof_last_write_status:ok\naof_last_cow_size:0\nmodule_fork_in_progress:0\nmodule_fork_last_cow_size:0\nslot_migration_fork_in_progress:0\n";

    /// Real `INFO memory` (some lines) of Valkey 9.1.2 with `maxmemory 64mb`.
    const MEMORY: &str = "# Memory\r\nused_memory:1016024\r\nused_memory_human:992.21K\r\nused_memory_overhead:998688\r\nused_memory_startup:998144\r\nused_memory_dataset:17336\r\nmaxmemory:67108864\r\nmaxmemory_human:64.00M\r\nmaxmemory_policy:noeviction\r\nmem_not_counted_for_evict:0\r\nmem_replication_backlog:0\r\n";

    #[test]
    fn memory_info() {
        let m = MemoryInfo::parse(MEMORY).unwrap();
        assert_eq!((m.used_memory, m.maxmemory), (1_016_024, 64 << 20));
        assert_eq!(m.dataset(), 1_016_024 - 998_144);
        assert_eq!(m.headroom(), Some((64 << 20) - 1_016_024));
        let unlimited = MemoryInfo { maxmemory: 0, ..m };
        assert_eq!(unlimited.headroom(), None);
        assert!(MemoryInfo::parse("# Memory\r\nmaxmemory:1\r\n").is_err());
    }

    #[test]
    fn cluster_info() {
        let i = ClusterInfo::parse(CLUSTER_INFO_OK).unwrap();
        assert_eq!(i.state, ClusterState::Ok);
        assert_eq!(
            (i.slots_assigned, i.slots_ok, i.slots_fail),
            (16384, 16384, 0)
        );
        assert_eq!(
            (i.known_nodes, i.size, i.current_epoch, i.my_epoch),
            (4, 3, 3, 1)
        );
        assert_eq!(i.nodes_fail, Some(0));
        assert!(i.is_healthy());
        let f = ClusterInfo::parse(CLUSTER_INFO_FAIL).unwrap();
        assert_eq!(f.state, ClusterState::Fail);
        assert_eq!(
            (f.slots_ok, f.slots_fail, f.nodes_fail),
            (8822, 7562, Some(1))
        );
        assert!(!f.is_healthy());
        assert_eq!(
            ClusterInfo::parse("cluster_state:ok\n"),
            Err(ParseError::MissingField("cluster_slots_assigned".into()))
        );
    }

    #[test]
    fn replication_primary() {
        let r = ReplicationInfo::parse(REPL_PRIMARY).unwrap();
        assert_eq!(r.role, ReplicationRole::Primary);
        assert_eq!(r.connected_replicas, 1);
        assert_eq!(
            r.replicas,
            vec![ConnectedReplica {
                index: 0,
                ip: "127.0.0.1".into(),
                port: 17004,
                state: "online".into(),
                offset: 14,
                lag: 1
            }]
        );
        assert!(r.replicas[0].is_online());
        assert_eq!(r.offset(), 14);
        assert!(!r.is_synced_replica());
        assert_eq!(r.failover_state.as_deref(), Some("no-failover"));
    }

    #[test]
    fn replication_replica() {
        let r = ReplicationInfo::parse(REPL_REPLICA_SYNCING).unwrap();
        assert_eq!(r.role, ReplicationRole::Replica);
        assert_eq!(r.primary_host.as_deref(), Some("127.0.0.1"));
        assert_eq!(r.primary_port, Some(17001));
        assert_eq!(r.primary_link_status, Some(PrimaryLinkStatus::Down));
        assert!(r.sync_in_progress);
        assert!(!r.is_synced_replica());
        assert_eq!(r.primary_link_down_since, Some(-1));
        let r = ReplicationInfo::parse(REPL_REPLICA_UP).unwrap();
        assert!(r.is_synced_replica());
        assert_eq!(r.offset(), 14);
    }

    #[test]
    fn replication_rejects_bad_replica_line() {
        let bad = "role:master\nslave0:ip=127.0.0.1,port=x,state=online,offset=1,lag=0\n";
        assert!(ReplicationInfo::parse(bad).is_err());
        assert!(ReplicationInfo::parse("role:sentinel\n").is_err());
    }

    #[test]
    fn server_versions() {
        let s = ServerInfo::parse(SERVER_9).unwrap();
        assert_eq!(s.version, Version::new(9, 1, 2));
        assert_eq!(s.redis_version, Version::new(7, 2, 4));
        assert!(s.version.has_atomic_slot_migration());
        assert_eq!(s.mode.as_deref(), Some("cluster"));
        assert_eq!(s.tcp_port, Some(17001));
        assert_eq!(s.time_usec, Some(1_796_206_472_786_406));
        let s8 = ServerInfo::parse(SERVER_8).unwrap();
        assert_eq!(s8.version, Version::new(8, 0, 1));
        assert!(!s8.version.has_atomic_slot_migration());
        assert!(s8.version.at_least(8, 0) && !s8.version.at_least(8, 1));
        let redis = ServerInfo::parse("redis_version:7.2.4\n").unwrap();
        assert_eq!(redis.version, Version::new(7, 2, 4));
    }

    #[test]
    fn version_parsing_and_order() {
        assert_eq!("9".parse::<Version>().unwrap(), Version::new(9, 0, 0));
        assert_eq!("8.1".parse::<Version>().unwrap(), Version::new(8, 1, 0));
        assert_eq!(
            "9.0.0-rc1".parse::<Version>().unwrap(),
            Version::new(9, 0, 0)
        );
        assert!("".parse::<Version>().is_err());
        assert!("a.b".parse::<Version>().is_err());
        assert!("1.2.3.4".parse::<Version>().is_err());
        assert!(Version::new(9, 0, 0) > Version::new(8, 10, 99));
        assert!(Version::new(10, 0, 0) > Version::new(9, 1, 2));
        assert_eq!(Version::new(9, 1, 2).to_string(), "9.1.2");
    }

    #[test]
    fn persistence() {
        let p = PersistenceInfo::parse(PERSISTENCE).unwrap();
        assert!(!p.loading && !p.aof_enabled && p.rdb_last_bgsave_ok && p.aof_last_write_ok);
        assert_eq!(p.rdb_last_save_time, Some(1796206461));
        assert!(!p.has_persistence_error());
        let failing =
            PersistenceInfo::parse("loading:1\naof_enabled:1\naof_last_write_status:err\n")
                .unwrap();
        assert!(failing.loading && failing.aof_enabled && failing.has_persistence_error());
    }

    #[test]
    fn combined_info_reply_feeds_all_structs() {
        let all = format!("{SERVER_9}\r\n{REPL_REPLICA_UP}\r\n{PERSISTENCE}");
        let f = InfoFields::parse(&all);
        assert_eq!(
            ServerInfo::from_fields(&f).unwrap().version,
            Version::new(9, 1, 2)
        );
        assert!(
            ReplicationInfo::from_fields(&f)
                .unwrap()
                .is_synced_replica()
        );
        assert!(!PersistenceInfo::from_fields(&f).unwrap().loading);
    }
}
