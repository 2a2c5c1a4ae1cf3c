//! `store`: where a backup is written (S3-compatible, Google Cloud Storage, Azure Blob).

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Message: not exactly one kind of store.
pub const ONE_STORE_MESSAGE: &str = "store needs exactly one of s3, gcs or azure: keep the one \
     your backups go to and remove the others";
/// Message: an endpoint without a scheme.
pub const ENDPOINT_SCHEME_MESSAGE: &str = "endpoint must start with https:// (or http:// for a \
     store on a trusted network), for example https://s3.eu-west-1.amazonaws.com";
/// Message: a prefix with a leading or trailing slash, or an empty segment.
pub const PREFIX_MESSAGE: &str = "prefix is a path inside the bucket without a leading or \
     trailing '/' and without empty segments, for example backups/prod";

/// Where backups are written: exactly one of `s3`, `gcs` or `azure`. Each backup goes to
/// `<prefix>/<namespace>/<cluster>/<backup name>/` in the bucket: one RDB file per shard and
/// a `manifest.json` written last (a backup without its manifest is incomplete).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("(has(self.s3) ? 1 : 0) + (has(self.gcs) ? 1 : 0) + (has(self.azure) ? 1 : 0) == 1").message(ONE_STORE_MESSAGE))]
pub struct BackupStore {
    /// Path inside the bucket or container under which backups are written, for example
    /// `backups/prod`. Omitted: the bucket's root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = kube::core::Rule::new("!self.startsWith('/') && !self.endsWith('/') && !self.contains('//')").message(PREFIX_MESSAGE))]
    pub prefix: Option<String>,

    /// An S3-compatible store (AWS S3, SeaweedFS, Ceph RGW, Cloudflare R2, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Store>,

    /// A Google Cloud Storage bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcs: Option<GcsStore>,

    /// An Azure Blob Storage container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure: Option<AzureStore>,
}

/// An S3-compatible bucket.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct S3Store {
    /// Bucket name. The bucket must exist; the operator does not create it.
    #[schemars(length(min = 3, max = 63))]
    pub bucket: String,

    /// Endpoint URL of a store other than AWS, for example `https://minio.storage:9000`.
    /// Omitted: AWS S3 in `region`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 8, max = 2048))]
    #[x_kube(validation = kube::core::Rule::new("self.startsWith('https://') || self.startsWith('http://')").message(ENDPOINT_SCHEME_MESSAGE))]
    pub endpoint: Option<String>,

    /// Region used to sign requests. Defaults to `us-east-1` (what most S3-compatible stores
    /// expect).
    #[serde(default = "region_default")]
    #[schemars(length(min = 1, max = 64))]
    pub region: String,

    /// Address the bucket as `<endpoint>/<bucket>` instead of `<bucket>.<endpoint>`. Most
    /// self-hosted stores need this.
    #[serde(default)]
    pub force_path_style: bool,

    /// The Secret (in the backup's namespace) holding the access key. Omitted: the operator
    /// pod's own identity (environment, web identity token or instance metadata).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<S3Credentials>,
}

fn region_default() -> String {
    "us-east-1".to_owned()
}

/// Keys of a Secret holding an S3 access key.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct S3Credentials {
    /// Name of the Secret, in the backup's namespace. The operator reads only this Secret.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,

    /// Key holding the access key id. Defaults to `AWS_ACCESS_KEY_ID`.
    #[serde(default = "access_key_id_key_default")]
    #[schemars(length(min = 1, max = 253))]
    pub access_key_id_key: String,

    /// Key holding the secret access key. Defaults to `AWS_SECRET_ACCESS_KEY`.
    #[serde(default = "secret_access_key_key_default")]
    #[schemars(length(min = 1, max = 253))]
    pub secret_access_key_key: String,

    /// Key holding a session token, for temporary credentials. Omitted: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub session_token_key: Option<String>,
}

fn access_key_id_key_default() -> String {
    "AWS_ACCESS_KEY_ID".to_owned()
}

fn secret_access_key_key_default() -> String {
    "AWS_SECRET_ACCESS_KEY".to_owned()
}

/// A Google Cloud Storage bucket.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GcsStore {
    /// Bucket name. The bucket must exist.
    #[schemars(length(min = 3, max = 222))]
    pub bucket: String,

    /// Base URL of the storage API, for a private endpoint or an emulator, for example
    /// `https://storage.example.internal`. Omitted: Google's (or the one the key file names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 8, max = 2048))]
    #[x_kube(validation = kube::core::Rule::new("self.startsWith('https://') || self.startsWith('http://')").message(ENDPOINT_SCHEME_MESSAGE))]
    pub endpoint: Option<String>,

    /// The Secret (in the backup's namespace) holding a service account key file. Omitted:
    /// the operator pod's own identity (workload identity or the metadata server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<SecretKey>,
}

/// An Azure Blob Storage container.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AzureStore {
    /// Storage account name.
    #[schemars(length(min = 3, max = 24))]
    pub account: String,

    /// Container name. The container must exist.
    #[schemars(length(min = 3, max = 63))]
    pub container: String,

    /// URL of the account's blob service, for another Azure cloud, a private endpoint or an
    /// emulator, for example `https://myaccount.blob.core.usgovcloudapi.net` or
    /// `http://azurite.storage:10000/devstoreaccount1`. Omitted:
    /// `https://<account>.blob.core.windows.net`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 8, max = 2048))]
    #[x_kube(validation = kube::core::Rule::new("self.startsWith('https://') || self.startsWith('http://')").message(ENDPOINT_SCHEME_MESSAGE))]
    pub endpoint: Option<String>,

    /// The Secret (in the backup's namespace) holding the storage account's access key.
    /// Omitted: the operator pod's own identity (workload identity or managed identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<SecretKey>,
}

/// One key of a Secret in the backup's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKey {
    /// Name of the Secret. The operator reads only this Secret.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,

    /// Key in the Secret: for GCS the service account's JSON key file, for Azure the account
    /// key.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

impl BackupStore {
    /// The object path of a backup's directory: `<prefix>/<namespace>/<cluster>/<backup>`.
    pub fn backup_path(&self, namespace: &str, cluster: &str, backup: &str) -> String {
        match &self.prefix {
            Some(p) => format!("{p}/{namespace}/{cluster}/{backup}"),
            None => format!("{namespace}/{cluster}/{backup}"),
        }
    }

    /// A URL-like name of the store and `path`, for messages: `s3://bucket/path`.
    pub fn location(&self, path: &str) -> String {
        if let Some(s3) = &self.s3 {
            format!("s3://{}/{path}", s3.bucket)
        } else if let Some(gcs) = &self.gcs {
            format!("gs://{}/{path}", gcs.bucket)
        } else if let Some(az) = &self.azure {
            format!("az://{}/{}/{path}", az.account, az.container)
        } else {
            path.to_owned()
        }
    }
}
