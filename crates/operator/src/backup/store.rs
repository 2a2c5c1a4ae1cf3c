//! The object store a backup is written to, built from `spec.store` and the keys of its
//! credentials Secret (the only Secret of the user's the backup reads).

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Secret;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig};
use valkey_api::backup_store::{BackupStore, S3Store};

use crate::render::secrets::secret_string;

/// Longest wait for a store's connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for one request (an upload part is at most a few MiB).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a store could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    /// The credentials Secret is absent or lacks a key.
    #[error("{0}")]
    CredentialsMissing(String),
    /// The client refused the settings.
    #[error("{0}")]
    Invalid(String),
}

/// The name of the credentials Secret of `store`, when it has one.
pub fn credentials_secret(store: &BackupStore) -> Option<&str> {
    if let Some(s3) = &store.s3 {
        return s3.credentials.as_ref().map(|c| c.secret_name.as_str());
    }
    if let Some(gcs) = &store.gcs {
        return gcs.credentials.as_ref().map(|c| c.secret_name.as_str());
    }
    store
        .azure
        .as_ref()?
        .credentials
        .as_ref()
        .map(|c| c.secret_name.as_str())
}

/// The endpoint to give the S3 client and whether it addresses the bucket as a host name:
/// path style as `<endpoint>/<bucket>`; virtual-hosted style with the bucket prefixed to the
/// endpoint's host (the client expects it there).
pub fn s3_endpoint(s3: &S3Store) -> (Option<String>, bool) {
    let virtual_hosted = !s3.force_path_style;
    let endpoint = s3.endpoint.as_ref().map(|e| {
        let e = e.trim_end_matches('/');
        match (virtual_hosted, e.split_once("://")) {
            (true, Some((scheme, host))) => format!("{scheme}://{}.{host}", s3.bucket),
            _ => e.to_owned(),
        }
    });
    (endpoint, virtual_hosted)
}

fn key(secret: Option<&Secret>, name: &str, key: &str) -> Result<String, SetupError> {
    let secret = secret.ok_or_else(|| {
        SetupError::CredentialsMissing(format!(
            "Secret {name} (the store's credentials) does not exist: create it or fix \
             credentials.secretName"
        ))
    })?;
    secret_string(secret, key).ok_or_else(|| {
        SetupError::CredentialsMissing(format!(
            "Secret {name} has no key {key}: add it or fix the key's name in credentials"
        ))
    })
}

fn client_options(allow_http: bool) -> ClientOptions {
    ClientOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT)
        .with_allow_http(allow_http)
}

fn retry() -> RetryConfig {
    RetryConfig {
        max_retries: 3,
        retry_timeout: Duration::from_secs(30),
        ..RetryConfig::default()
    }
}

/// The client of `store`, with the keys read from `secret` (the Secret named by
/// [`credentials_secret`], `None` when it does not exist).
pub fn build(
    store: &BackupStore,
    secret: Option<&Secret>,
) -> Result<Arc<dyn ObjectStore>, SetupError> {
    // The HTTP client takes rustls's process-wide provider; the binaries install ring's at
    // start, and a library user may not have (a second install is refused and harmless).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let invalid = |e: object_store::Error| SetupError::Invalid(e.to_string());
    if let Some(s3) = &store.s3 {
        let (endpoint, virtual_hosted) = s3_endpoint(s3);
        let allow_http = is_http(endpoint.as_deref());
        let mut b = match &s3.credentials {
            Some(c) => {
                let name = &c.secret_name;
                let mut b = AmazonS3Builder::new()
                    .with_access_key_id(key(secret, name, &c.access_key_id_key)?)
                    .with_secret_access_key(key(secret, name, &c.secret_access_key_key)?);
                if let Some(t) = &c.session_token_key {
                    b = b.with_token(key(secret, name, t)?);
                }
                b
            }
            None => AmazonS3Builder::from_env(),
        }
        .with_bucket_name(&s3.bucket)
        .with_region(&s3.region)
        .with_virtual_hosted_style_request(virtual_hosted)
        .with_client_options(client_options(allow_http))
        .with_retry(retry());
        if let Some(e) = endpoint {
            b = b.with_endpoint(e);
        }
        return Ok(Arc::new(b.build().map_err(invalid)?));
    }
    if let Some(gcs) = &store.gcs {
        let key_file = match &gcs.credentials {
            Some(c) => Some(key(secret, &c.secret_name, &c.key)?),
            None => None,
        };
        // An emulator's key file may name its address (`gcs_base_url`, which `endpoint`
        // overrides); plain HTTP only when the address the client will use says so.
        let base_url = gcs.endpoint.clone().or_else(|| {
            let k: serde_json::Value = serde_json::from_str(key_file.as_deref()?).ok()?;
            k.get("gcs_base_url")?.as_str().map(str::to_owned)
        });
        let mut b = match key_file {
            Some(k) => GoogleCloudStorageBuilder::new().with_service_account_key(k),
            None => GoogleCloudStorageBuilder::from_env(),
        }
        .with_bucket_name(&gcs.bucket)
        .with_client_options(client_options(is_http(base_url.as_deref())))
        .with_retry(retry());
        if let Some(e) = &gcs.endpoint {
            b = b.with_base_url(e.trim_end_matches('/'));
        }
        return Ok(Arc::new(b.build().map_err(invalid)?));
    }
    if let Some(az) = &store.azure {
        let mut b = match &az.credentials {
            Some(c) => {
                MicrosoftAzureBuilder::new().with_access_key(key(secret, &c.secret_name, &c.key)?)
            }
            None => MicrosoftAzureBuilder::from_env(),
        }
        .with_account(&az.account)
        .with_container_name(&az.container)
        .with_client_options(client_options(is_http(az.endpoint.as_deref())))
        .with_retry(retry());
        if let Some(e) = &az.endpoint {
            b = b.with_endpoint(e.trim_end_matches('/').to_owned());
        }
        return Ok(Arc::new(b.build().map_err(invalid)?));
    }
    Err(SetupError::Invalid(
        "store names none of s3, gcs or azure".into(),
    ))
}

/// Whether `endpoint` is plain HTTP (allowed only when the user wrote `http://`).
fn is_http(endpoint: Option<&str>) -> bool {
    endpoint.is_some_and(|e| e.starts_with("http://"))
}

/// Deletes every object under `dir` (a backup's directory); the count deleted.
pub async fn delete_all(store: &Arc<dyn ObjectStore>, dir: &str) -> Result<usize, String> {
    let prefix = Path::from(dir);
    let objects: Vec<_> = store
        .list(Some(&prefix))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .map_err(|e| super::upload::with_causes(&e))?;
    for path in &objects {
        match store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(super::upload::with_causes(&e)),
        }
    }
    Ok(objects.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use valkey_api::backup_store::S3Credentials;

    fn s3(endpoint: Option<&str>, path_style: bool) -> S3Store {
        S3Store {
            bucket: "bk".into(),
            endpoint: endpoint.map(str::to_owned),
            region: "us-east-1".into(),
            force_path_style: path_style,
            credentials: Some(S3Credentials {
                secret_name: "s3".into(),
                access_key_id_key: "id".into(),
                secret_access_key_key: "key".into(),
                session_token_key: None,
            }),
        }
    }

    #[test]
    fn endpoints_by_addressing_style() {
        assert_eq!(
            s3_endpoint(&s3(Some("http://127.0.0.1:8333/"), true)),
            (Some("http://127.0.0.1:8333".into()), false)
        );
        assert_eq!(
            s3_endpoint(&s3(Some("https://store.example"), false)),
            (Some("https://bk.store.example".into()), true)
        );
        assert_eq!(s3_endpoint(&s3(None, false)), (None, true));
    }

    #[test]
    fn missing_credentials_are_named() {
        let store = BackupStore {
            s3: Some(s3(Some("http://127.0.0.1:1"), true)),
            ..Default::default()
        };
        assert_eq!(credentials_secret(&store), Some("s3"));
        let err = build(&store, None).err().unwrap();
        assert!(
            matches!(&err, SetupError::CredentialsMissing(m) if m.contains("Secret s3")),
            "{err}"
        );
        let partial = Secret {
            data: Some([("id".to_owned(), ByteString(b"a".to_vec()))].into()),
            ..Default::default()
        };
        let err = build(&store, Some(&partial)).err().unwrap();
        assert!(err.to_string().contains("has no key key"), "{err}");
        let whole = Secret {
            data: Some(
                [
                    ("id".to_owned(), ByteString(b"a".to_vec())),
                    ("key".to_owned(), ByteString(b"b".to_vec())),
                ]
                .into(),
            ),
            ..Default::default()
        };
        assert!(build(&store, Some(&whole)).is_ok());
    }
}
