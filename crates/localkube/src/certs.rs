//! The control plane's PKI, generated fresh at every start: one CA, the
//! apiserver's serving certificate, client certificates for the admin and the
//! controller components, the kubelets' serving certificate and the apiserver's
//! client certificate towards them, and the service-account signing key.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// Errors while generating or writing certificates.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A PEM certificate and its PEM private key, as written to disk.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Every file the control plane needs, under one directory.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    /// PEM of the CA, for kubeconfigs.
    pub ca_pem: String,
    pub apiserver: CertFiles,
    pub admin: CertFiles,
    pub controller_manager: CertFiles,
    pub scheduler: CertFiles,
    /// The kubelets' serving certificate (same addresses as the apiserver's).
    pub kubelet_serving: CertFiles,
    /// The apiserver's client certificate towards the kubelets (`system:masters`).
    pub kubelet_client: CertFiles,
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
}

/// Names and addresses the apiserver's serving certificate must cover.
#[derive(Debug, Clone)]
pub struct ServingNames {
    pub ips: Vec<IpAddr>,
    pub dns: Vec<String>,
}

impl ServingNames {
    /// The in-cluster names of the `kubernetes` Service plus loopback, the given
    /// extra addresses and the service IP.
    pub fn apiserver(extra_ips: &[IpAddr], service_ip: IpAddr) -> Self {
        let mut ips = vec![IpAddr::from([127, 0, 0, 1]), service_ip];
        ips.extend_from_slice(extra_ips);
        ips.dedup();
        let dns = [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        ServingNames { ips, dns }
    }
}

fn write(path: &Path, contents: &str) -> Result<(), CertError> {
    std::fs::write(path, contents).map_err(|source| CertError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn leaf(
    dir: &Path,
    name: &str,
    common_name: &str,
    organization: Option<&str>,
    sans: Option<&ServingNames>,
    ca: &CertifiedIssuer<'_, KeyPair>,
) -> Result<CertFiles, CertError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        params
            .distinguished_name
            .push(DnType::OrganizationName, org);
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    match sans {
        Some(names) => {
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            for ip in &names.ips {
                params.subject_alt_names.push(SanType::IpAddress(*ip));
            }
            for dns in &names.dns {
                params
                    .subject_alt_names
                    .push(SanType::DnsName(dns.as_str().try_into()?));
            }
        }
        None => params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth],
    }
    let cert = params.signed_by(&key, ca)?;
    let files = CertFiles {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    };
    write(&files.cert, &cert.pem())?;
    write(&files.key, &key.serialize_pem())?;
    Ok(files)
}

impl Pki {
    /// Generates the whole PKI into `dir` (which must exist).
    pub fn generate(dir: &Path, serving: &ServingNames) -> Result<Pki, CertError> {
        let ca_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "localkube-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key_pem = ca_key.serialize_pem();
        let ca = CertifiedIssuer::self_signed(params, ca_key)?;
        let ca_pem = ca.pem();
        let ca_cert = dir.join("ca.crt");
        let ca_key_path = dir.join("ca.key");
        write(&ca_cert, &ca_pem)?;
        write(&ca_key_path, &ca_key_pem)?;

        let apiserver = leaf(dir, "apiserver", "kube-apiserver", None, Some(serving), &ca)?;
        let admin = leaf(
            dir,
            "admin",
            "localkube-admin",
            Some("system:masters"),
            None,
            &ca,
        )?;
        let controller_manager = leaf(
            dir,
            "controller-manager",
            "system:kube-controller-manager",
            None,
            None,
            &ca,
        )?;
        let scheduler = leaf(dir, "scheduler", "system:kube-scheduler", None, None, &ca)?;
        let kubelet_serving = leaf(
            dir,
            "kubelet",
            "localkube-kubelet",
            None,
            Some(serving),
            &ca,
        )?;
        let kubelet_client = leaf(
            dir,
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            Some("system:masters"),
            None,
            &ca,
        )?;

        let sa = KeyPair::generate()?;
        let sa_key = dir.join("sa.key");
        let sa_pub = dir.join("sa.pub");
        write(&sa_key, &sa.serialize_pem())?;
        write(&sa_pub, &sa.public_key_pem())?;

        Ok(Pki {
            ca_cert,
            ca_key: ca_key_path,
            ca_pem,
            apiserver,
            admin,
            controller_manager,
            scheduler,
            kubelet_serving,
            kubelet_client,
            sa_key,
            sa_pub,
        })
    }
}
