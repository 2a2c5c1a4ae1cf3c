//! Container probes (exec, tcpSocket, httpGet) and the probe loops that
//! drive `started`, `ready` and liveness restarts, with the kubelet's
//! semantics for initialDelaySeconds, periodSeconds, timeoutSeconds,
//! successThreshold and failureThreshold.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::runtime::RunningContainer;

/// Outcome of one probe attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    /// Passed.
    Success,
    /// Failed, with the reason.
    Failure(String),
}

/// Timing and thresholds of a probe, defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeTiming {
    /// Wait before the first probe.
    pub initial_delay: Duration,
    /// Between probes.
    pub period: Duration,
    /// Per attempt.
    pub timeout: Duration,
    /// Consecutive successes to count as passed.
    pub success_threshold: u32,
    /// Consecutive failures to count as failed.
    pub failure_threshold: u32,
}

impl ProbeTiming {
    /// The probe's timing with Kubernetes defaults (period 10 s, timeout 1 s, thresholds 1/3).
    pub fn of(p: &Probe) -> Self {
        let secs = |v: Option<i32>, d: i32| Duration::from_secs(v.unwrap_or(d).max(0) as u64);
        ProbeTiming {
            initial_delay: secs(p.initial_delay_seconds, 0),
            period: secs(p.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: secs(p.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: p.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: p.failure_threshold.unwrap_or(3).max(1) as u32,
        }
    }
}

/// Consecutive-result bookkeeping of a probe.
#[derive(Debug, Clone, Default)]
pub struct Thresholds {
    successes: u32,
    failures: u32,
}

impl Thresholds {
    /// Records a result; returns `Some(true)` when the success threshold
    /// was just reached, `Some(false)` when the failure threshold was.
    pub fn record(&mut self, ok: bool, timing: &ProbeTiming) -> Option<bool> {
        if ok {
            self.failures = 0;
            self.successes += 1;
            (self.successes >= timing.success_threshold).then_some(true)
        } else {
            self.successes = 0;
            self.failures += 1;
            (self.failures >= timing.failure_threshold).then_some(false)
        }
    }
}

fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).map_err(|_| format!("invalid port {p}")),
        IntOrString::String(name) => {
            if let Ok(p) = name.parse::<u16>() {
                return Ok(p);
            }
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("port {name:?} not found in the container's ports"))
        }
    }
}

/// Runs one probe attempt against a container at `pod_ip`.
pub async fn probe_once(
    probe: &Probe,
    container: &Container,
    running: &RunningContainer,
    env: &[(String, String)],
    pod_ip: &str,
) -> ProbeResult {
    let timeout = ProbeTiming::of(probe).timeout;
    if let Some(exec) = &probe.exec {
        let argv = exec.command.clone().unwrap_or_default();
        return match running.exec_in(&argv, env, timeout).await {
            Ok(r) if r.exit_code == 0 => ProbeResult::Success,
            Ok(r) => ProbeResult::Failure(format!(
                "command {argv:?} exited with {}: {}",
                r.exit_code,
                r.output.trim()
            )),
            Err(e) => ProbeResult::Failure(e.to_string()),
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let port = match resolve_port(&tcp.port, container) {
            Ok(p) => p,
            Err(e) => return ProbeResult::Failure(e),
        };
        let host = tcp.host.clone().unwrap_or_else(|| pod_ip.to_string());
        return match tokio::time::timeout(timeout, TcpStream::connect((host.as_str(), port))).await
        {
            Ok(Ok(_)) => ProbeResult::Success,
            Ok(Err(e)) => ProbeResult::Failure(format!("dial tcp {host}:{port}: {e}")),
            Err(_) => ProbeResult::Failure(format!("dial tcp {host}:{port}: timeout")),
        };
    }
    if let Some(http) = &probe.http_get {
        let port = match resolve_port(&http.port, container) {
            Ok(p) => p,
            Err(e) => return ProbeResult::Failure(e),
        };
        let host = http.host.clone().unwrap_or_else(|| pod_ip.to_string());
        if http.scheme.as_deref() == Some("HTTPS") {
            return ProbeResult::Failure("HTTPS probes are not supported by localkube".into());
        }
        let path = http.path.clone().unwrap_or_else(|| "/".into());
        let headers: String = http
            .http_headers
            .iter()
            .flatten()
            .map(|h| format!("{}: {}\r\n", h.name, h.value))
            .collect();
        let fut = async {
            let mut s = TcpStream::connect((host.as_str(), port)).await?;
            let req = format!(
                "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\n{headers}Connection: close\r\n\r\n"
            );
            s.write_all(req.as_bytes()).await?;
            let mut buf = vec![0u8; 256];
            let mut n = 0;
            while n < 16 {
                let m = s.read(&mut buf[n..]).await?;
                if m == 0 {
                    break;
                }
                n += m;
            }
            Ok::<String, std::io::Error>(String::from_utf8_lossy(&buf[..n]).into_owned())
        };
        return match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(resp)) => {
                let code: u16 = resp
                    .split_whitespace()
                    .nth(1)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                if (200..400).contains(&code) {
                    ProbeResult::Success
                } else {
                    ProbeResult::Failure(format!("HTTP probe failed with statuscode: {code}"))
                }
            }
            Ok(Err(e)) => ProbeResult::Failure(format!("Get http://{host}:{port}{path}: {e}")),
            Err(_) => ProbeResult::Failure(format!("Get http://{host}:{port}{path}: timeout")),
        };
    }
    ProbeResult::Failure("probe has no supported handler (exec, tcpSocket, httpGet)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_thresholds() {
        let t = ProbeTiming::of(&Probe::default());
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.timeout, Duration::from_secs(1));
        assert_eq!((t.success_threshold, t.failure_threshold), (1, 3));
        let mut th = Thresholds::default();
        assert_eq!(th.record(false, &t), None);
        assert_eq!(th.record(false, &t), None);
        assert_eq!(th.record(false, &t), Some(false));
        assert_eq!(th.record(true, &t), Some(true));
        let t2 = ProbeTiming {
            success_threshold: 2,
            ..t
        };
        let mut th = Thresholds::default();
        assert_eq!(th.record(true, &t2), None);
        assert_eq!(th.record(true, &t2), Some(true));
    }

    #[test]
    fn named_ports() {
        let c = Container {
            name: "c".into(),
            ports: Some(vec![k8s_openapi::api::core::v1::ContainerPort {
                name: Some("redis".into()),
                container_port: 6379,
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(
            resolve_port(&IntOrString::String("redis".into()), &c),
            Ok(6379)
        );
        assert_eq!(resolve_port(&IntOrString::Int(80), &c), Ok(80));
        assert!(resolve_port(&IntOrString::String("nope".into()), &c).is_err());
    }
}
