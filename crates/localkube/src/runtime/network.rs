//! Pod networking: one host bridge per environment, one network namespace + veth per pod.
//!
//! ```text
//!  host ── BRIDGE (gateway = first host of the CIDR, e.g. 10.244.0.1/16)
//!             ├── lk<hash> ══ veth ══ eth0 (10.244.0.2) in netns BRIDGE-<sandbox id>
//!             └── lk<hash> ══ veth ══ eth0 (10.244.0.3) in netns BRIDGE-<other id>
//! ```
//!
//! Pods reach each other through the bridge (plain L2 switching, no IP forwarding needed) and the
//! host through the gateway address, where the API server can listen. The host reaches pods
//! through the connected route of the bridge. Everything is done with `ip` (iproute2).
//!
//! Names: the netns is `"{bridge}-{id}"` (id sanitized to `[A-Za-z0-9_.-]`), the host end of the
//! veth is `lk` + 12 hex digits of a hash of the netns name and carries the alias
//! `localkube:{bridge}`, so [`super::cleanup::cleanup_leftovers`] can find all of them again.
//!
//! All methods are blocking (each runs a few `ip` commands, ~10 ms in total); call them through
//! `tokio::task::spawn_blocking` from async code if that matters. [`Network`] is `Send + Sync`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ipnet::Ipv4Net;

use super::command::{ip, ip_quiet, run};
use super::error::{Result, RuntimeError};
use super::ipam::Ipam;

/// Where `ip netns add` puts its namespace handles.
pub const NETNS_DIR: &str = "/run/netns";

/// How the pod network of one environment looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfig {
    /// Name of the host bridge (1..=15 characters of `[A-Za-z0-9_.-]`); also the prefix of every
    /// netns name, so it must be unique per environment.
    pub bridge: String,
    /// Pod CIDR, e.g. `10.244.0.0/16`, or a `/24` slice for tests. The first host address is the
    /// gateway (on the bridge).
    pub cidr: Ipv4Net,
}

/// A pod's network sandbox: a network namespace with `lo` and `eth0` up and a default route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    /// The id it was created with.
    pub id: String,
    /// Name of the network namespace (`ip netns` name).
    pub netns: String,
    /// Path of the namespace handle (`/run/netns/<netns>`), for `nsenter --net=` / setns.
    pub netns_path: PathBuf,
    /// The pod IP.
    pub ip: Ipv4Addr,
    /// Prefix length of the pod network.
    pub prefix_len: u8,
    /// The gateway (host bridge address).
    pub gateway: Ipv4Addr,
    /// Host end of the veth pair (on the bridge).
    pub host_veth: String,
}

/// The pod network of one environment. Dropping it calls [`Network::teardown`].
#[derive(Debug)]
pub struct Network {
    cfg: NetworkConfig,
    gateway: Ipv4Addr,
    iptables_rule: bool,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    ipam: Ipam,
    sandboxes: BTreeMap<String, Sandbox>,
    torn_down: bool,
}

/// Alias of a bridge naming the process that created it (see [`bridge_owner`]).
const OWNER_ALIAS_PREFIX: &str = "localkube-owner:";

fn owner_alias() -> String {
    format!("{OWNER_ALIAS_PREFIX}{}", std::process::id())
}

/// The pid of the process that created `bridge` (from its alias), if the bridge exists.
pub fn bridge_owner(bridge: &str) -> Option<u32> {
    let out = ip(&["-o", "link", "show", "dev", bridge]).ok()?;
    let words: Vec<&str> = out.split_whitespace().collect();
    words
        .windows(2)
        .find(|w| w[0] == "alias")?
        .get(1)?
        .strip_prefix(OWNER_ALIAS_PREFIX)?
        .parse()
        .ok()
}

impl Network {
    /// Creates the bridge with the gateway address and makes sure bridged traffic is not
    /// dropped by iptables (when `br_netfilter` is loaded). Fails with
    /// [`RuntimeError::AlreadyExists`] if the bridge exists (a crashed run: clean it up first).
    pub fn create(cfg: NetworkConfig) -> Result<Network> {
        validate_bridge_name(&cfg.bridge)?;
        let ipam = Ipam::new(cfg.cidr)?;
        let cfg = NetworkConfig {
            cidr: ipam.net(),
            ..cfg
        };
        if link_exists(&cfg.bridge) {
            return Err(RuntimeError::AlreadyExists(format!(
                "bridge {}",
                cfg.bridge
            )));
        }
        let gateway = ipam.gateway();
        let br = cfg.bridge.as_str();
        ip(&["link", "add", "name", br, "type", "bridge"])?;
        let setup = (|| {
            // A fixed MAC: otherwise the bridge takes the lowest port MAC, which changes as pods
            // come and go and breaks the pods' ARP caches.
            ip(&["link", "set", "dev", br, "address", &bridge_mac(br)])?;
            ip(&[
                "addr",
                "add",
                &format!("{gateway}/{}", cfg.cidr.prefix_len()),
                "dev",
                br,
            ])?;
            ip(&["link", "set", "dev", br, "alias", &owner_alias()])?;
            ip(&["link", "set", "dev", br, "up"])?;
            Ok::<_, RuntimeError>(())
        })();
        if let Err(e) = setup {
            ip_quiet(&["link", "del", "dev", br]);
            return Err(e);
        }
        let iptables_rule = allow_bridged_traffic(br);
        tracing::info!(bridge = br, cidr = %cfg.cidr, %gateway, "pod network created");
        Ok(Network {
            cfg,
            gateway,
            iptables_rule,
            state: Mutex::new(State {
                ipam,
                sandboxes: BTreeMap::new(),
                torn_down: false,
            }),
        })
    }

    /// The gateway address (on the bridge; where pods reach the host).
    pub fn gateway(&self) -> Ipv4Addr {
        self.gateway
    }

    /// The configuration (with the CIDR normalized to its network address).
    pub fn config(&self) -> &NetworkConfig {
        &self.cfg
    }

    /// The sandboxes currently alive.
    pub fn sandboxes(&self) -> Vec<Sandbox> {
        self.lock().sandboxes.values().cloned().collect()
    }

    /// Creates a pod sandbox: netns `"{bridge}-{id}"`, veth pair (`eth0` inside, host end on
    /// the bridge), `lo` up, an address from the CIDR and a default route via the gateway.
    pub fn create_sandbox(&self, id: &str) -> Result<Sandbox> {
        let netns = netns_name(&self.cfg.bridge, id)?;
        let netns_path = Path::new(NETNS_DIR).join(&netns);
        let pod_ip = {
            let mut st = self.lock();
            if st.torn_down {
                return Err(RuntimeError::invalid("network", "already torn down"));
            }
            if st.sandboxes.contains_key(&netns) || netns_path.exists() {
                return Err(RuntimeError::AlreadyExists(format!("netns {netns}")));
            }
            st.ipam.allocate()?
        };
        let sandbox = Sandbox {
            id: id.to_string(),
            host_veth: veth_name(&netns),
            netns,
            netns_path,
            ip: pod_ip,
            prefix_len: self.cfg.cidr.prefix_len(),
            gateway: self.gateway,
        };
        match self.setup_sandbox(&sandbox) {
            Ok(()) => {
                self.lock()
                    .sandboxes
                    .insert(sandbox.netns.clone(), sandbox.clone());
                tracing::debug!(netns = %sandbox.netns, ip = %sandbox.ip, "sandbox created");
                Ok(sandbox)
            }
            Err(e) => {
                remove_sandbox_links(&sandbox);
                self.lock().ipam.release(pod_ip);
                Err(e)
            }
        }
    }

    fn setup_sandbox(&self, sb: &Sandbox) -> Result<()> {
        let ns = sb.netns.as_str();
        let veth = sb.host_veth.as_str();
        ip(&["netns", "add", ns])?;
        // Creating the peer directly inside the namespace: no half-moved veth can be left over.
        ip(&[
            "link", "add", "name", veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ])?;
        ip(&[
            "link",
            "set",
            "dev",
            veth,
            "master",
            &self.cfg.bridge,
            "alias",
            &veth_alias(&self.cfg.bridge),
            "up",
        ])?;
        ip(&["-n", ns, "link", "set", "dev", "lo", "up"])?;
        // The MAC follows from the IP (as CNI bridge plugins derive it): a recycled address
        // keeps its MAC, so the host's and other pods' neighbour caches stay right for it.
        // A new MAC would leave them pointing at the deleted veth until they expire (tens of
        // seconds without a route to the new pod).
        ip(&[
            "-n",
            ns,
            "link",
            "set",
            "dev",
            "eth0",
            "address",
            &pod_mac(sb.ip),
        ])?;
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{}/{}", sb.ip, sb.prefix_len),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", ns, "link", "set", "dev", "eth0", "up"])?;
        ip(&[
            "-n",
            ns,
            "route",
            "add",
            "default",
            "via",
            &sb.gateway.to_string(),
        ])?;
        Ok(())
    }

    /// Removes a sandbox: deletes its veth pair and netns and releases its address. Processes
    /// still inside keep a namespace without network; kill them first.
    pub fn destroy_sandbox(&self, sandbox: &Sandbox) -> Result<()> {
        remove_sandbox_links(sandbox);
        let mut st = self.lock();
        if st.sandboxes.remove(&sandbox.netns).is_some() {
            st.ipam.release(sandbox.ip);
        }
        drop(st);
        if Path::new(NETNS_DIR).join(&sandbox.netns).exists() || link_exists(&sandbox.host_veth) {
            return Err(RuntimeError::Command {
                command: format!("remove sandbox {}", sandbox.netns),
                status: "incomplete".into(),
                stderr: "netns or veth still present".into(),
            });
        }
        Ok(())
    }

    /// Fault injection: takes the pod's veth down (`up = false`: the pod is cut off from
    /// everything but itself) or up again (`up = true`).
    pub fn set_link(&self, sandbox: &Sandbox, up: bool) -> Result<()> {
        ip(&[
            "link",
            "set",
            "dev",
            &sandbox.host_veth,
            if up { "up" } else { "down" },
        ])?;
        Ok(())
    }

    /// Removes every sandbox, the bridge and the iptables rule. Idempotent.
    pub fn teardown(&self) -> Result<()> {
        let sandboxes = {
            let mut st = self.lock();
            if st.torn_down {
                return Ok(());
            }
            st.torn_down = true;
            std::mem::take(&mut st.sandboxes)
        };
        for sb in sandboxes.values() {
            remove_sandbox_links(sb);
            self.lock().ipam.release(sb.ip);
        }
        ip_quiet(&["link", "del", "dev", &self.cfg.bridge]);
        if self.iptables_rule {
            remove_iptables_rule(&self.cfg.bridge);
        }
        if link_exists(&self.cfg.bridge) {
            return Err(RuntimeError::Command {
                command: format!("ip link del dev {}", self.cfg.bridge),
                status: "incomplete".into(),
                stderr: "bridge still present".into(),
            });
        }
        tracing::info!(bridge = %self.cfg.bridge, "pod network removed");
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State inconsistent in a harmful way.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::warn!(error = %e, "pod network teardown incomplete");
        }
    }
}

fn remove_sandbox_links(sb: &Sandbox) {
    if link_exists(&sb.host_veth) {
        ip_quiet(&["link", "del", "dev", &sb.host_veth]);
    }
    if Path::new(NETNS_DIR).join(&sb.netns).exists() {
        ip_quiet(&["netns", "del", &sb.netns]);
    }
}

/// Whether a network interface of that name exists in the host namespace.
pub(crate) fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// The alias put on every host veth of `bridge`.
pub(crate) fn veth_alias(bridge: &str) -> String {
    format!("localkube:{bridge}")
}

/// The netns name of a sandbox.
pub fn netns_name(bridge: &str, id: &str) -> Result<String> {
    if id.is_empty() {
        return Err(RuntimeError::invalid("sandbox id", "empty"));
    }
    let id: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(200)
        .collect();
    Ok(format!("{bridge}-{id}"))
}

fn veth_name(netns: &str) -> String {
    format!("lk{:012x}", fnv1a(netns.as_bytes()) & 0xffff_ffff_ffff)
}

fn bridge_mac(bridge: &str) -> String {
    let h = fnv1a(bridge.as_bytes()).to_be_bytes();
    // 0x02: locally administered, unicast.
    format!(
        "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        h[3], h[4], h[5], h[6], h[7]
    )
}

/// The MAC of the pod at `ip`: `0a:58:` and the address's four bytes (locally administered,
/// unicast, never a bridge's `02:` MAC).
fn pod_mac(ip: Ipv4Addr) -> String {
    let [a, b, c, d] = ip.octets();
    format!("0a:58:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
}

/// 64-bit FNV-1a: a stable hash for derived interface names.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn validate_bridge_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::invalid(
            "bridge name",
            format!("{name:?} (need 1..=15 characters of [A-Za-z0-9_.-])"),
        ))
    }
}

/// With `br_netfilter` loaded and `net.bridge.bridge-nf-call-iptables = 1`, bridged frames go
/// through the iptables FORWARD chain, where a DROP policy (Docker sets one) would cut pods off
/// from each other. Inserts an ACCEPT rule for traffic within our bridge; returns whether it did.
fn allow_bridged_traffic(bridge: &str) -> bool {
    let active = std::fs::read_to_string("/proc/sys/net/bridge/bridge-nf-call-iptables")
        .map(|v| v.trim() == "1")
        .unwrap_or(false);
    if !active {
        return false;
    }
    if !has_iptables() {
        tracing::debug!(
            "br_netfilter active but no iptables userspace installed: nothing filters bridged traffic"
        );
        return false;
    }
    match run(
        "iptables",
        &[
            "-w", "-I", "FORWARD", "1", "-i", bridge, "-o", bridge, "-j", "ACCEPT",
        ],
    ) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot add iptables ACCEPT rule for the pod bridge");
            false
        }
    }
}

pub(crate) fn has_iptables() -> bool {
    ["/usr/sbin/iptables", "/sbin/iptables", "/usr/bin/iptables"]
        .iter()
        .any(|p| Path::new(p).exists())
}

/// Deletes every copy of our FORWARD ACCEPT rule for `bridge` (best effort).
pub(crate) fn remove_iptables_rule(bridge: &str) {
    if !has_iptables() {
        return;
    }
    for _ in 0..16 {
        let deleted = run(
            "iptables",
            &[
                "-w", "-D", "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT",
            ],
        );
        if deleted.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_are_valid_and_stable() {
        let v = veth_name("lkbr-abc");
        assert_eq!(v.len(), 14);
        assert_eq!(v, veth_name("lkbr-abc"));
        assert_ne!(v, veth_name("lkbr-abd"));
        assert_eq!(
            netns_name("lkbr", "default/pod-0").unwrap(),
            "lkbr-default_pod-0"
        );
        assert!(netns_name("lkbr", "").is_err());
        let mac = bridge_mac("lkbr");
        assert!(mac.starts_with("02:") && mac.len() == 17);
        assert_eq!(pod_mac(Ipv4Addr::new(10, 244, 3, 17)), "0a:58:0a:f4:03:11");
    }

    #[test]
    fn bridge_names_are_checked() {
        assert!(validate_bridge_name("lk-test.1_a").is_ok());
        assert!(validate_bridge_name("").is_err());
        assert!(validate_bridge_name("sixteen-chars-xx").is_err());
        assert!(validate_bridge_name("a/b").is_err());
    }
}
