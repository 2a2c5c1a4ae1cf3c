//! Where the pods' files live: the mount points of the rendered volumes and the keys of the
//! ConfigMap and Secrets mounted there (a leaf: it imports nothing).

/// Directory of the ConfigMap volume (`valkey.conf` and the probe scripts).
pub const CONFIG_DIR: &str = "/etc/valkey/config";
/// Path of the rendered configuration file.
pub const CONFIG_FILE: &str = "/etc/valkey/config/valkey.conf";
/// ConfigMap key of the configuration file.
pub const CONFIG_KEY: &str = "valkey.conf";
/// Directory of the ACL Secret volume.
pub const ACL_DIR: &str = "/etc/valkey/acl";
/// Secret key (and file name) of the ACL file.
pub const ACL_KEY: &str = "users.acl";
/// Path of the ACL file.
pub const ACL_FILE: &str = "/etc/valkey/acl/users.acl";
/// Directory of the system Secret volume (only the keys the pod needs are projected).
pub const SYSTEM_DIR: &str = "/etc/valkey/system";
/// Directory of the TLS Secret volume (`ca.crt`, `tls.crt`, `tls.key`).
pub const TLS_DIR: &str = "/etc/valkey/tls";
/// Data directory (PersistentVolumeClaim or emptyDir).
pub const DATA_DIR: &str = "/data";
