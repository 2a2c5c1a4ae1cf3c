//! The low-level "container runtime" of localkube: pods are host processes in their own
//! network namespace, containers additionally in their own mount namespace over an overlay of
//! the host root. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and `ip`, `nsenter`, `unshare`,
//! `mount`, `chroot`, `env` on the host.
//!
//! Building blocks, used by the kubelet (`crate::kubelet`):
//!
//! - [`network`]: [`Network::create`]`(`[`NetworkConfig`]`)` makes the bridge + gateway;
//!   [`Network::create_sandbox`]`(id)` → [`Sandbox`] (netns, veth, pod IP);
//!   [`Network::destroy_sandbox`], [`Network::set_link`] (fault injection: cut/restore a pod's
//!   network), [`Network::teardown`] (also on drop). Blocking calls.
//! - [`images`]: [`ImageTable`] maps image references to a directory of host executables plus
//!   `ENTRYPOINT`/`CMD`/`WORKDIR`/`ENV` ([`ResolvedImage`], [`ResolvedImage::argv`]); unknown
//!   images → [`ImageError`] whose message suits an `ErrImagePull`-like waiting reason.
//! - [`container`]: [`spawn`]`(&`[`ContainerSpec`]`)` → [`RunningContainer`] with `pid()`,
//!   `async wait()` → [`ExitStatus`], `signal(`[`Signal`]`)`, `try_status()` and
//!   `async exec_in(argv, env, timeout)` → [`ExecResult`] (exec probes, preStop hooks) and
//!   `exec_spawn(argv, env, stdin)` → a child with piped stdio (`kubectl exec`).
//! - [`cleanup`]: [`cleanup_leftovers`]`(state_dir, bridge)` removes processes, mounts, netns,
//!   veths and the bridge of a (crashed) environment; [`kill_netns_processes`] for pod deletion.
//!
//! A pod's life with this module:
//!
//! ```text
//! let net = Network::create(NetworkConfig { bridge: "lk1234".into(), cidr: "10.244.0.0/16".parse()? })?;
//! let sb = net.create_sandbox(&pod_uid)?;                          // status.podIP = sb.ip
//! let img = images.resolve("valkey/valkey:9.0.0")?;                // or ErrImagePull
//! let c = container::spawn(&ContainerSpec { argv: img.argv(&cmd, &args), env, netns_path: Some(sb.netns_path.clone()), .. })?;
//! c.exec_in(&["valkey-cli".into(), "ping".into()], &env, timeout).await?;   // probe
//! c.signal(Signal::SIGTERM)?; c.wait().await;                       // deletion
//! kill_netns_processes(&sb.netns); net.destroy_sandbox(&sb)?;
//! ```

pub mod cleanup;
mod command;
pub mod container;
pub mod error;
pub mod host_limits;
pub mod images;
pub mod ipam;
pub mod network;
pub mod pidfile;

pub use cleanup::{CleanupReport, cleanup_leftovers, kill_netns_processes};
pub use container::{
    ContainerSpec, ExecResult, ExitStatus, Mount, ProcessUser, RunningContainer,
    SETUP_FAILED_EXIT_CODE, spawn,
};
pub use error::{Result, RuntimeError};
pub use images::{BASE_PATH, ImageEntry, ImageError, ImageTable, ResolvedImage, default_bin_cache};
pub use network::{Network, NetworkConfig, Sandbox};
pub use nix::sys::signal::Signal;
