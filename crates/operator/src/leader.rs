//! Leader election on a `coordination.k8s.io/v1` Lease, with the crate `kube-lease-manager`.
//!
//! With `--leader-elect` only the instance holding the Lease runs the controllers. The others
//! are standbys: no controller runs, nothing is reconciled, `/readyz` answers `standby`. A
//! standby takes the Lease when it expires (the holder was killed, hung or cut off) or as soon
//! as it is released (the holder stopped on SIGTERM).
//!
//! * **Renewal**: the holder renews the Lease [`Config::grace_secs`] before it expires.
//! * **Fence**: the holder stops acting (aborts the controllers, then the process exits
//!   non-zero) when the Lease names another holder, and, unless it has read its own renewal by
//!   then, half the grace before its term ends. A standby only takes an unreleased Lease after
//!   it expired, so the old holder has stopped before. The term is measured on the holder's own
//!   clock (it writes `renewTime` itself); only a clock skew between instances of more than
//!   half the grace could let two leaders overlap.
//! * **Release**: on SIGTERM the holder stops its controllers, waits for them, then clears the
//!   Lease's holder.
//! * **Hand-written workaround**: a `kube-lease-manager` candidate only looks at the Lease again
//!   at the expiry it last read, so a released Lease would stay free for up to a lease
//!   duration. A small watch on the Lease restarts the candidate as soon as the holder is
//!   cleared.

use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, ListSemantic};
use kube::{Api, Client};
use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseManagerBuilder, LeaseParams};
use rand::Rng;
use rand::distr::Alphanumeric;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::backoff::Backoff;
use crate::http::{Phase, Readiness};
use crate::metrics::Metrics;

/// The shortest lease duration accepted, in seconds.
pub const MIN_DURATION_SECS: u64 = 3;

/// How often the holder reads the Lease while it waits for its renewal to show.
const RENEWAL_POLL: Duration = Duration::from_millis(200);

/// Pause between two renewal attempts after an API error (the fence bounds the total).
const RENEWAL_RETRY: Duration = Duration::from_millis(500);

/// Where the service account's namespace is mounted in a pod.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Leader election settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Name of the Lease.
    pub lease_name: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// This instance's identity, written as the Lease's holder.
    pub identity: String,
    /// Lease duration in seconds, at least [`MIN_DURATION_SECS`].
    pub duration_secs: u64,
}

impl Config {
    /// Seconds before expiry at which the holder renews: a third of the duration, at least 2.
    pub fn grace_secs(&self) -> u64 {
        (self.duration_secs / 3).max(2)
    }

    /// How long before the end of its term the holder stops unless it saw its renewal.
    fn margin(&self) -> Duration {
        Duration::from_secs(self.grace_secs()) / 2
    }

    fn lease_ref(&self) -> String {
        format!("{}/{}", self.namespace, self.lease_name)
    }
}

/// The Lease's namespace when none is given: `$POD_NAMESPACE`, else the namespace of the
/// service account (in a pod), else `default`.
pub fn default_namespace() -> String {
    let env = std::env::var("POD_NAMESPACE").ok();
    let file = || std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE).ok();
    [env, file()]
        .into_iter()
        .flatten()
        .map(|s| s.trim().to_owned())
        .find(|s| !s.is_empty())
        .unwrap_or_else(|| "default".to_owned())
}

/// This process's identity: `$POD_NAME` (else the host name), the pid and a random suffix. It
/// is unique per process, so a restarted container never takes its predecessor's term for its
/// own.
pub fn default_identity() -> String {
    let name = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "valkey-operator".to_owned());
    let suffix: String = rand::rng()
        .sample_iter(Alphanumeric)
        .take(6)
        .map(|b| char::from(b).to_ascii_lowercase())
        .collect();
    format!("{name}_{}_{suffix}", std::process::id())
}

/// What the Lease says, as far as the election goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct LeaseView {
    holder: Option<String>,
    /// `renewTime + leaseDurationSeconds`.
    expiry: Option<SystemTime>,
}

impl LeaseView {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        let holder = spec
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty());
        let expiry = spec.and_then(|s| {
            let renew: SystemTime = s.renew_time.as_ref()?.0.into();
            let secs = u64::try_from(s.lease_duration_seconds?).ok()?;
            renew.checked_add(Duration::from_secs(secs))
        });
        Self { holder, expiry }
    }
}

/// What a read of the Lease means for the holder's term ending at `expiry`.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Renewed: the term now ends at this time.
    Renewed(SystemTime),
    /// Still ours, not renewed since.
    Pending,
    /// Not ours any more.
    Lost(String),
}

/// Judges a read of the Lease for the holder `identity` whose term ends at `expiry`. Pure.
fn judge(view: &LeaseView, identity: &str, expiry: SystemTime) -> Verdict {
    match view.holder.as_deref() {
        None => Verdict::Lost("the Lease has no holder".to_owned()),
        Some(h) if h != identity => Verdict::Lost(format!("the Lease is held by {h}")),
        Some(_) => match view.expiry {
            Some(e) if e > expiry => Verdict::Renewed(e),
            _ => Verdict::Pending,
        },
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `lead` only while this instance holds the Lease of `cfg`, until `shutdown`.
///
/// Returns `Ok` after a shutdown (as a standby, or as the leader once its controllers stopped
/// and the Lease was released), and an error when leadership was lost: the controllers are
/// then already aborted and the caller must exit.
pub async fn run<F, Fut>(
    client: Client,
    cfg: Config,
    phase: Arc<Readiness>,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
    lead: F,
) -> anyhow::Result<()>
where
    F: FnOnce(BoxFuture<'static, ()>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    anyhow::ensure!(
        cfg.duration_secs >= MIN_DURATION_SECS,
        "lease duration must be at least {MIN_DURATION_SECS} s"
    );
    let mut shutdown = pin!(shutdown);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let (tx, view) = watch::channel(None);
    let watch = AbortOnDrop(tokio::spawn(watch_lease(
        leases.clone(),
        cfg.lease_name.clone(),
        tx,
    )));
    phase.set(Phase::Standby);
    metrics.set_leader(false);
    info!(lease = %cfg.lease_ref(), identity = %cfg.identity, "leader election on: waiting for the Lease");
    let Some(manager) = acquire(&client, &cfg, view, shutdown.as_mut()).await else {
        return Ok(());
    };
    // Only a standby needs the watch.
    drop(watch);
    lead_term(manager, &leases, &cfg, &phase, &metrics, shutdown, lead).await
}

/// A candidate for the Lease of `cfg`.
async fn candidate(
    client: &Client,
    cfg: &Config,
) -> Result<LeaseManager, kube_lease_manager::LeaseManagerError> {
    let params = LeaseParams::new(cfg.identity.clone(), cfg.duration_secs, cfg.grace_secs());
    LeaseManagerBuilder::new(client.clone(), cfg.lease_name.clone())
        .with_namespace(cfg.namespace.clone())
        .with_create_mode(LeaseCreateMode::AutoCreate)
        .with_parameters(params)
        .build()
        .await
}

/// Waits as a standby until this instance holds the Lease; `None` on shutdown.
async fn acquire(
    client: &Client,
    cfg: &Config,
    mut view: watch::Receiver<Option<LeaseView>>,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Option<LeaseManager> {
    let mut backoff = Backoff::startup();
    let mut last_error: Option<String> = None;
    let mut holder: Option<String> = None;
    loop {
        let built = tokio::select! {
            r = candidate(client, cfg) => r,
            () = &mut shutdown => return None,
        };
        let failure = match built {
            Ok(manager) => loop {
                tokio::select! {
                    r = manager.changed() => match r {
                        Ok(true) => return Some(manager),
                        // Not a change for a candidate; keep waiting.
                        Ok(false) => {}
                        Err(e) => break Some(e.to_string()),
                    },
                    () = released(&mut view, &cfg.identity, &mut holder) => {
                        debug!(lease = %cfg.lease_ref(), "the Lease was released: trying at once");
                        break None;
                    }
                    () = &mut shutdown => return None,
                }
            },
            Err(e) => Some(e.to_string()),
        };
        let Some(e) = failure else {
            backoff.reset();
            continue;
        };
        if last_error.as_ref() != Some(&e) {
            warn!(lease = %cfg.lease_ref(), error = %e, "cannot take part in leader election, retrying");
            last_error = Some(e);
        }
        tokio::select! {
            () = backoff.sleep() => {}
            () = &mut shutdown => return None,
        }
    }
}

/// Resolves when the Lease, held by another instance, loses its holder (released on SIGTERM,
/// or cleared by a candidate at expiry). Logs each new holder once. Part of the hand-written
/// workaround described in the module documentation.
async fn released(
    view: &mut watch::Receiver<Option<LeaseView>>,
    identity: &str,
    last: &mut Option<String>,
) {
    loop {
        let now = view
            .borrow_and_update()
            .as_ref()
            .and_then(|v| v.holder.clone());
        let was = std::mem::replace(last, now.clone());
        if now != was
            && let Some(h) = now.as_deref().filter(|h| *h != identity)
        {
            info!(holder = %h, "standby: the Lease is held by another instance");
        }
        if now.is_none() && was.is_some_and(|h| h != identity) {
            return;
        }
        if view.changed().await.is_err() {
            // The watch is gone: only the candidate's own retries remain.
            std::future::pending::<()>().await;
        }
    }
}

/// Publishes every state of the Lease (`None`: absent) for [`released`].
async fn watch_lease(api: Api<Lease>, name: String, tx: watch::Sender<Option<LeaseView>>) {
    let config = watcher::Config::default()
        .fields(&format!("metadata.name={name}"))
        .list_semantic(ListSemantic::MostRecent);
    let mut events = pin!(watcher::watcher(api, config).default_backoff());
    let mut listed = false;
    let mut last_error: Option<String> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed = false,
            Ok(watcher::Event::InitApply(l) | watcher::Event::Apply(l)) => {
                listed = true;
                tx.send_replace(Some(LeaseView::of(&l)));
            }
            Ok(watcher::Event::InitDone) if !listed => {
                tx.send_replace(None);
            }
            Ok(watcher::Event::InitDone) => {}
            Ok(watcher::Event::Delete(_)) => {
                tx.send_replace(None);
            }
            Err(e) => {
                let e = e.to_string();
                if last_error.as_ref() != Some(&e) {
                    warn!(lease = %name, error = %e, "watching the Lease failed (a released Lease is then only taken at its expiry)");
                    last_error = Some(e);
                }
            }
        }
    }
}

/// Runs the controllers while this instance holds the Lease.
async fn lead_term<F, Fut>(
    manager: LeaseManager,
    leases: &Api<Lease>,
    cfg: &Config,
    phase: &Readiness,
    metrics: &Metrics,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    lead: F,
) -> anyhow::Result<()>
where
    F: FnOnce(BoxFuture<'static, ()>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    // The term as stored: `renewTime` is this process's own clock when it took the Lease.
    let lease = leases
        .get(&cfg.lease_name)
        .await
        .context("reading the Lease just taken")?;
    let expiry = match judge(
        &LeaseView::of(&lease),
        &cfg.identity,
        SystemTime::UNIX_EPOCH,
    ) {
        Verdict::Renewed(e) => e,
        Verdict::Pending => bail!("the Lease just taken has no renewTime"),
        Verdict::Lost(why) => bail!("lost the Lease right after taking it: {why}"),
    };
    info!(lease = %cfg.lease_ref(), identity = %cfg.identity, "became leader: starting the controllers");
    phase.set(Phase::Running);
    metrics.set_leader(true);
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let stop = async move {
        // An error means the sender is gone, which also means stop.
        let _ = stop_rx.wait_for(|s| *s).await;
    };
    let mut controllers = tokio::spawn(lead(stop.boxed()));
    let lost = {
        let mut renewing = pin!(renew(&manager));
        let mut fence = pin!(fence(leases, cfg, expiry));
        let mut stopping = false;
        loop {
            tokio::select! {
                why = &mut renewing => break Some(why),
                why = &mut fence => break Some(why),
                () = &mut shutdown, if !stopping => {
                    stopping = true;
                    info!("stopping the controllers");
                    let _ = stop_tx.send(true);
                }
                r = &mut controllers => {
                    if let Err(e) = r {
                        error!(error = %e, "controller task failed");
                    } else if !stopping {
                        warn!("the controllers stopped on their own");
                    }
                    break None;
                }
            }
        }
    };
    metrics.set_leader(false);
    if let Some(why) = lost {
        controllers.abort();
        phase.set(Phase::Starting);
        // Logged once, by the caller, as it exits.
        bail!(
            "lost leadership of Lease {} (identity {}): {why}; controllers aborted",
            cfg.lease_ref(),
            cfg.identity
        );
    }
    match manager.release().await {
        Ok(()) => info!(lease = %cfg.lease_ref(), "released the Lease"),
        Err(e) => {
            warn!(lease = %cfg.lease_ref(), error = %e, "releasing the Lease failed: another instance takes over at its expiry")
        }
    }
    Ok(())
}

/// Keeps renewing the Lease; resolves with the reason when the crate finds it held by another.
async fn renew(manager: &LeaseManager) -> String {
    loop {
        match manager.changed().await {
            Ok(true) => {}
            Ok(false) => return "the Lease is held by another instance".to_owned(),
            Err(e) => {
                warn!(error = %e, "renewing the Lease failed, retrying");
                tokio::time::sleep(RENEWAL_RETRY).await;
            }
        }
    }
}

/// Time left until `t` on the wall clock (zero when past).
fn until(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::now()).unwrap_or_default()
}

/// The holder's fence: resolves, with the reason, when this instance must stop acting. After
/// each renewal is due it reads the Lease until it shows the renewal; without one by
/// `expiry - margin`, or when the Lease names another holder, the term is over.
async fn fence(leases: &Api<Lease>, cfg: &Config, mut expiry: SystemTime) -> String {
    let grace = Duration::from_secs(cfg.grace_secs());
    loop {
        let stop_by = expiry.checked_sub(cfg.margin()).unwrap_or(expiry);
        let renewal_due = expiry.checked_sub(grace).unwrap_or(expiry);
        tokio::time::sleep(until(renewal_due) + RENEWAL_POLL / 2).await;
        loop {
            let left = until(stop_by);
            if left.is_zero() {
                return "the Lease was not seen renewed before its term ended".to_owned();
            }
            match tokio::time::timeout(left, leases.get_opt(&cfg.lease_name)).await {
                Err(_) => {
                    return "the Lease could not be read before its term ended".to_owned();
                }
                Ok(Err(e)) => debug!(error = %e, "reading the Lease failed, retrying"),
                Ok(Ok(None)) => return "the Lease was deleted".to_owned(),
                Ok(Ok(Some(lease))) => match judge(&LeaseView::of(&lease), &cfg.identity, expiry) {
                    Verdict::Renewed(e) => {
                        expiry = e;
                        break;
                    }
                    Verdict::Pending => {}
                    Verdict::Lost(why) => return why,
                },
            }
            tokio::time::sleep(RENEWAL_POLL.min(until(stop_by))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(holder: Option<&str>, expiry_secs: Option<u64>) -> LeaseView {
        LeaseView {
            holder: holder.map(str::to_owned),
            expiry: expiry_secs.map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s)),
        }
    }

    #[test]
    fn judges_renewal_and_loss() {
        let t = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        assert_eq!(
            judge(&view(Some("me"), Some(20)), "me", t(10)),
            Verdict::Renewed(t(20))
        );
        assert_eq!(
            judge(&view(Some("me"), Some(10)), "me", t(10)),
            Verdict::Pending
        );
        assert_eq!(
            judge(&view(Some("me"), None), "me", t(10)),
            Verdict::Pending
        );
        assert_eq!(
            judge(&view(Some("other"), Some(30)), "me", t(10)),
            Verdict::Lost("the Lease is held by other".into())
        );
        assert!(matches!(
            judge(&view(None, None), "me", t(10)),
            Verdict::Lost(_)
        ));
    }

    #[test]
    fn reads_holder_and_expiry_from_the_lease() {
        let lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "l"},
            "spec": {"holderIdentity": "a", "renewTime": "2030-01-01T00:00:00.000000Z",
                     "leaseDurationSeconds": 15}
        }))
        .unwrap();
        let v = LeaseView::of(&lease);
        assert_eq!(v.holder.as_deref(), Some("a"));
        let expected = SystemTime::UNIX_EPOCH + Duration::from_secs(1_893_456_000 + 15);
        assert_eq!(v.expiry, Some(expected));
        let released: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "l"}, "spec": {"holderIdentity": ""}
        }))
        .unwrap();
        assert_eq!(LeaseView::of(&released), LeaseView::default());
    }

    #[test]
    fn grace_and_margin_follow_the_duration() {
        let cfg = |d| Config {
            lease_name: "l".into(),
            namespace: "n".into(),
            identity: "i".into(),
            duration_secs: d,
        };
        assert_eq!(cfg(15).grace_secs(), 5);
        assert_eq!(cfg(15).margin(), Duration::from_millis(2500));
        assert_eq!(cfg(5).grace_secs(), 2);
        assert_eq!(cfg(MIN_DURATION_SECS).grace_secs(), 2);
        assert!(cfg(MIN_DURATION_SECS).grace_secs() < MIN_DURATION_SECS);
    }

    #[test]
    fn identity_is_unique_per_call() {
        let (a, b) = (default_identity(), default_identity());
        assert_ne!(a, b);
        assert!(a.contains(&format!("_{}_", std::process::id())), "{a}");
    }
}
