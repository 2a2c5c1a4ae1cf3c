//! Checking the TLS Secret (pure): what is wrong with it, in words a user can act on.
//!
//! The Secret is judged as the operator's own client would judge a server presenting it: the
//! certificate in `tls.crt` must chain to `ca.crt`, be within its validity period, and match
//! `tls.key`; and as a Valkey node judges a peer presenting it (cluster bus, replication):
//! valid for client authentication. A certificate valid for none of the operator's names is not reported here (the
//! client then tries the pod IP, which an IP SAN may cover).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::{CertificateError, Error, RootCertStore};
use sha2::Digest;
use valkey_api::ValkeyCluster;

use crate::render::names;

/// What is wrong with the TLS Secret `name` (`secret` as read, `None` when it does not exist)
/// for a server checked by `names` at `now`; `None` when nothing is.
pub fn problem(
    name: &str,
    secret: Option<&Secret>,
    names: &[String],
    now: UnixTime,
) -> Option<String> {
    let Some(secret) = secret else {
        return Some(format!(
            "TLS Secret {name} does not exist: create it with ca.crt, tls.crt and tls.key"
        ));
    };
    let data = secret.data.clone().unwrap_or_default();
    let file = |key: &str| data.get(key).map(|b| b.0.clone()).filter(|b| !b.is_empty());
    let (Some(ca), Some(crt), Some(key)) = (file("ca.crt"), file("tls.crt"), file("tls.key"))
    else {
        let missing: Vec<&str> = ["ca.crt", "tls.crt", "tls.key"]
            .into_iter()
            .filter(|k| file(k).is_none())
            .collect();
        return Some(format!("TLS Secret {name} has no {}", missing.join(", ")));
    };
    let certs = |pem: &[u8], key: &str| -> Result<Vec<CertificateDer<'static>>, String> {
        let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{key} of TLS Secret {name} is not valid PEM: {e}"))?;
        if certs.is_empty() {
            return Err(format!(
                "{key} of TLS Secret {name} holds no PEM certificate"
            ));
        }
        Ok(certs)
    };
    let (cas, chain) = match (certs(&ca, "ca.crt"), certs(&crt, "tls.crt")) {
        (Ok(a), Ok(c)) => (a, c),
        (Err(e), _) | (_, Err(e)) => return Some(e),
    };
    let Ok(private_key) = PrivateKeyDer::from_pem_slice(&key) else {
        return Some(format!(
            "tls.key of TLS Secret {name} holds no PEM private key"
        ));
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    match CertifiedKey::from_der(chain.clone(), private_key, &provider) {
        Ok(_) => {}
        Err(Error::InconsistentKeys(_)) => {
            return Some(format!(
                "tls.key of TLS Secret {name} does not belong to the certificate in tls.crt"
            ));
        }
        Err(e) => return Some(format!("tls.key of TLS Secret {name} is not usable: {e}")),
    }
    let mut roots = RootCertStore::empty();
    for ca in cas {
        if let Err(e) = roots.add(ca) {
            return Some(format!(
                "ca.crt of TLS Secret {name} is not a usable CA: {e}"
            ));
        }
    }
    let roots = Arc::new(roots);
    let verifier = match WebPkiServerVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()
    {
        Ok(v) => v,
        Err(e) => return Some(format!("ca.crt of TLS Secret {name} is not usable: {e}")),
    };
    let (leaf, intermediates) = chain.split_first()?;
    for server in names {
        let Ok(server) = ServerName::try_from(server.clone()) else {
            continue;
        };
        let Err(e) = verifier.verify_server_cert(leaf, intermediates, &server, &[], now) else {
            break;
        };
        let what = match e {
            Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => continue,
            Error::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. },
            ) => "has expired".to_owned(),
            Error::InvalidCertificate(
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. },
            ) => "is not valid yet".to_owned(),
            // A CA with the issuer's name but another key fails the signature check.
            Error::InvalidCertificate(
                CertificateError::UnknownIssuer | CertificateError::BadSignature,
            ) => "is not signed by the CA in ca.crt (a CA mismatch)".to_owned(),
            e => format!("is not accepted: {e}"),
        };
        return Some(format!(
            "the certificate in tls.crt of TLS Secret {name} {what}"
        ));
    }
    client_auth_problem(name, roots, provider, leaf, intermediates, now)
}

/// Valkey nodes present the same certificate as TLS clients to each other (cluster bus and
/// replication links, checked against `ca.crt`), so it must also be valid for client
/// authentication: a certificate whose extended key usage names `serverAuth` alone (what
/// cert-manager issues when `usages` is not set) keeps every MEET and replica link from
/// connecting, and the cluster never forms.
fn client_auth_problem(
    name: &str,
    roots: Arc<RootCertStore>,
    provider: Arc<rustls::crypto::CryptoProvider>,
    leaf: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    now: UnixTime,
) -> Option<String> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider)
        .build()
        .ok()?;
    match verifier.verify_client_cert(leaf, intermediates, now) {
        Err(Error::InvalidCertificate(
            CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. },
        )) => Some(format!(
            "the certificate in tls.crt of TLS Secret {name} is not valid for client \
             authentication (its extended key usage lacks clientAuth); Valkey nodes present it \
             to each other on the cluster bus and replication links, which then cannot connect: \
             issue it with both server and client auth (cert-manager: `usages: [server auth, \
             client auth, digital signature, key encipherment]`)"
        )),
        _ => None,
    }
}

/// The TLS Secret as a pass sees it.
#[derive(Clone, Debug, Default)]
pub struct TlsCheck {
    /// What is wrong with it, when TLS is on and something is.
    pub invalid: Option<String>,
    /// The files the pods should have loaded, when TLS is on and the Secret is usable.
    pub wanted: Option<Wanted>,
}

impl TlsCheck {
    /// Checks the TLS Secret of `vc` (`secret`, as observed) at `now`.
    pub fn of(vc: &ValkeyCluster, secret: Option<&Secret>, now: UnixTime) -> Self {
        let Some(name) = vc.spec.tls_secret_name() else {
            return Self::default();
        };
        let names = names::tls_server_names(&vc.name_any(), &vc.namespace().unwrap_or_default());
        let invalid = problem(name, secret, &names, now);
        let wanted = secret.filter(|_| invalid.is_none()).and_then(wanted);
        Self { invalid, wanted }
    }

    /// The TLS files of the live pass.
    pub fn files(&self, vc: &ValkeyCluster) -> super::live::TlsFiles<'_> {
        match (vc.spec.tls_secret_name(), &self.wanted) {
            (None, _) => super::live::TlsFiles::Off,
            (Some(_), None) => super::live::TlsFiles::Unusable,
            (Some(_), Some(w)) => super::live::TlsFiles::Wanted(w),
        }
    }
}

/// What the pods should serve and have loaded, from a TLS Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// SHA-256 (hex) of the certificate in `tls.crt` (the first of its chain).
    pub fingerprint: String,
    /// A short hash of `ca.crt`, `tls.crt` and `tls.key` together: changes with any of them.
    pub revision: String,
}

/// The certificate and revision of a TLS Secret; `None` when it holds no certificate.
pub fn wanted(secret: &Secret) -> Option<Wanted> {
    let data = secret.data.as_ref()?;
    let file = |key: &str| data.get(key).map(|b| b.0.as_slice()).unwrap_or_default();
    let leaf = CertificateDer::pem_slice_iter(file("tls.crt"))
        .next()?
        .ok()?;
    let mut all = sha2::Sha256::new();
    for key in ["ca.crt", "tls.crt", "tls.key"] {
        let f = file(key);
        all.update((f.len() as u64).to_be_bytes());
        all.update(f);
    }
    Some(Wanted {
        fingerprint: valkey_ops::tls::fingerprint(&leaf),
        revision: hex::encode(&all.finalize()[..6]),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };

    use super::*;

    struct Material {
        ca: String,
        crt: String,
        key: String,
    }

    /// A CA and a certificate for `sans` valid from the start of year `from` to that of `to`.
    fn material(sans: &[&str], from: i32, to: i32) -> Material {
        material_with_usages(sans, from, to, &[])
    }

    /// Same, with these extended key usages (none: the extension is left out).
    fn material_with_usages(
        sans: &[&str],
        from: i32,
        to: i32,
        usages: &[ExtendedKeyUsagePurpose],
    ) -> Material {
        let ca_key = KeyPair::generate().expect("key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).expect("ca");
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().expect("key");
        let mut params =
            CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .expect("params");
        params.not_before = rcgen::date_time_ymd(from, 1, 1);
        params.not_after = rcgen::date_time_ymd(to, 1, 1);
        params.extended_key_usages = usages.to_vec();
        let cert = params.signed_by(&key, &issuer).expect("cert");
        Material {
            ca: ca_cert.pem(),
            crt: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    fn secret(files: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                files
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        }
    }

    fn check(s: Option<&Secret>) -> Option<String> {
        let names = vec!["node.valkey-c.ns.svc".to_owned()];
        problem("certs", s, &names, UnixTime::now())
    }

    #[test]
    fn a_good_secret_or_an_ip_only_certificate_has_no_problem() {
        let m = material(&["*.valkey-c.ns.svc"], 2000, 4000);
        let ok = secret(&[("ca.crt", &m.ca), ("tls.crt", &m.crt), ("tls.key", &m.key)]);
        assert_eq!(check(Some(&ok)), None);
        let ip = material(&["10.0.0.7"], 2000, 4000);
        let ip = secret(&[
            ("ca.crt", &ip.ca),
            ("tls.crt", &ip.crt),
            ("tls.key", &ip.key),
        ]);
        assert_eq!(check(Some(&ip)), None);
    }

    #[test]
    fn a_server_only_certificate_is_named_and_server_plus_client_is_fine() {
        use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let of =
            |m: &Material| secret(&[("ca.crt", &m.ca), ("tls.crt", &m.crt), ("tls.key", &m.key)]);
        let server_only = material_with_usages(&["*.valkey-c.ns.svc"], 2000, 4000, &[ServerAuth]);
        let got = check(Some(&of(&server_only))).unwrap_or_default();
        assert!(got.contains("not valid for client authentication"), "{got}");
        assert!(got.contains("client auth"), "{got}");
        let both = material_with_usages(
            &["*.valkey-c.ns.svc"],
            2000,
            4000,
            &[ServerAuth, ClientAuth],
        );
        assert_eq!(check(Some(&of(&both))), None);
    }

    #[test]
    fn wanted_fingerprint_follows_the_certificate_and_revision_every_file() {
        let m = material(&["*.valkey-c.ns.svc"], 2000, 4000);
        let other = material(&["*.valkey-c.ns.svc"], 2000, 4000);
        let w = wanted(&secret(&[
            ("ca.crt", &m.ca),
            ("tls.crt", &m.crt),
            ("tls.key", &m.key),
        ]))
        .expect("wanted");
        assert_eq!(w.fingerprint.len(), 64);
        // A CA bundle change: same certificate, another revision.
        let bundle = format!("{}{}", m.ca, other.ca);
        let b = wanted(&secret(&[
            ("ca.crt", &bundle),
            ("tls.crt", &m.crt),
            ("tls.key", &m.key),
        ]))
        .expect("wanted");
        assert_eq!(b.fingerprint, w.fingerprint);
        assert_ne!(b.revision, w.revision);
        // Another certificate: another fingerprint.
        let o = wanted(&secret(&[
            ("ca.crt", &m.ca),
            ("tls.crt", &other.crt),
            ("tls.key", &other.key),
        ]))
        .expect("wanted");
        assert_ne!(o.fingerprint, w.fingerprint);
        assert_eq!(wanted(&secret(&[("ca.crt", &m.ca)])), None);
    }

    #[test]
    fn each_problem_is_named() {
        let m = material(&["*.valkey-c.ns.svc"], 2000, 4000);
        let other = material(&["*.valkey-c.ns.svc"], 2000, 4000);
        let expired = material(&["*.valkey-c.ns.svc"], 2000, 2001);
        let future = material(&["*.valkey-c.ns.svc"], 3000, 4000);
        let cases: [(Option<Secret>, &str); 8] = [
            (None, "TLS Secret certs does not exist"),
            (
                Some(secret(&[("tls.crt", &m.crt), ("tls.key", &m.key)])),
                "TLS Secret certs has no ca.crt",
            ),
            (
                Some(secret(&[
                    ("ca.crt", &m.ca),
                    ("tls.crt", "garbage"),
                    ("tls.key", &m.key),
                ])),
                "tls.crt of TLS Secret certs holds no PEM certificate",
            ),
            (
                Some(secret(&[
                    ("ca.crt", &m.ca),
                    ("tls.crt", &m.crt),
                    ("tls.key", &other.key),
                ])),
                "does not belong to the certificate",
            ),
            (
                Some(secret(&[
                    ("ca.crt", &other.ca),
                    ("tls.crt", &m.crt),
                    ("tls.key", &m.key),
                ])),
                "a CA mismatch",
            ),
            (
                Some(secret(&[
                    ("ca.crt", &expired.ca),
                    ("tls.crt", &expired.crt),
                    ("tls.key", &expired.key),
                ])),
                "has expired",
            ),
            (
                Some(secret(&[
                    ("ca.crt", &future.ca),
                    ("tls.crt", &future.crt),
                    ("tls.key", &future.key),
                ])),
                "is not valid yet",
            ),
            (
                Some(secret(&[
                    ("ca.crt", &m.ca),
                    ("tls.crt", &m.crt),
                    ("tls.key", "x"),
                ])),
                "tls.key of TLS Secret certs holds no PEM private key",
            ),
        ];
        for (s, want) in cases {
            let got = check(s.as_ref()).unwrap_or_default();
            assert!(got.contains(want), "{want:?} not in {got:?}");
        }
    }
}
