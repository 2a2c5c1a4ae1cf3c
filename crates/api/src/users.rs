//! `spec.users`: ACL users distributed to every node.

use kube::{KubeSchema, core::Rule};
use serde::{Deserialize, Serialize};

/// Maximum number of users.
pub const MAX_USERS: u64 = 64;

/// Message: duplicate user names.
pub const UNIQUE_NAMES_MESSAGE: &str =
    "spec.users names must be unique: remove or rename the duplicate user";
/// Message: reserved `_` prefix.
pub const RESERVED_NAME_MESSAGE: &str = "spec.users[].name must not start with '_' \
     (reserved for operator-managed system users): rename the user";
/// Message: the name `default`.
pub const DEFAULT_USER_MESSAGE: &str = "spec.users[].name must not be 'default': the operator \
     disables Valkey's default user (clients authenticate as a named user); rename the user";
/// Message: invalid characters.
pub const NAME_FORMAT_MESSAGE: &str = "spec.users[].name must start with a letter or digit and \
     contain only letters, digits, '.', '_', '@', ':' or '-' (no spaces): rename the user";
/// Message: `passwordSecret` together with `nopass: true`.
pub const PASSWORD_EXCLUSIVE_MESSAGE: &str = "spec.users[]: passwordSecret and nopass: true are \
     mutually exclusive: remove one of them";
/// Message: empty `passwordSecret.keys`.
pub const PASSWORD_KEYS_MESSAGE: &str =
    "spec.users[].passwordSecret.keys must list at least one key of the Secret";
/// Message: whitespace inside an ACL pattern or command.
pub const TOKEN_MESSAGE: &str = "ACL commands, key patterns and channel patterns must be \
     non-empty and contain no whitespace: split them into separate list entries";
/// Message: a password token in `permissions`.
pub const PERMISSIONS_PASSWORD_MESSAGE: &str = "spec.users[].permissions must not set or reset \
     passwords (tokens starting with >, <, # or !, and nopass, resetpass, reset): put the \
     password in a Secret and name it in passwordSecret, or set nopass: true";
/// Message: line break in `permissions`.
pub const PERMISSIONS_MESSAGE: &str =
    "spec.users[].permissions must not contain line breaks: write the ACL rules on one line";

/// One ACL user.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.passwordSecret) && has(self.nopass) && self.nopass)").message(PASSWORD_EXCLUSIVE_MESSAGE))]
pub struct UserSpec {
    /// ACL user name, for example `app`. Names starting with `_` are reserved for the
    /// operator's system users; `default` is refused (the operator keeps Valkey's default user
    /// disabled, so clients authenticate as a named user).
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new("!self.startsWith('_')").message(RESERVED_NAME_MESSAGE))]
    #[x_kube(validation = Rule::new("self != 'default'").message(DEFAULT_USER_MESSAGE))]
    #[x_kube(validation = Rule::new("self.startsWith('_') || self.matches('^[A-Za-z0-9][A-Za-z0-9._@:-]*$')").message(NAME_FORMAT_MESSAGE))]
    pub name: String,

    /// Passwords of the user, read from keys of a Secret in the cluster's namespace. Several keys
    /// may be listed to rotate passwords without downtime: add the new key, move the clients,
    /// remove the old key. Changes to the Secret apply to every pod within seconds, without a
    /// restart. A missing Secret or key holds this user (its last applied rules stay, or it
    /// is left out) and sets Ready=False with reason UsersACLError; other users still apply.
    /// Mutually exclusive with `nopass: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<PasswordSecret>,

    /// Allow the user to authenticate with any password. Mutually exclusive with `passwordSecret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nopass: Option<bool>,

    /// Commands, command categories (`@read`) and subcommands to allow or deny.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commands: Option<CommandRules>,

    /// Key patterns by access type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<KeyRules>,

    /// Pub/Sub channel patterns the user may access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<ChannelRules>,

    /// Raw ACL rules appended after the generated rules, in Valkey's `ACL SETUSER` syntax, for
    /// example `+@all -@dangerous ~app:* &*`. They are checked by a live server before use: a
    /// rule Valkey refuses holds this user (its last applied rules stay, or it is left out)
    /// and sets Ready=False with reason UsersACLError quoting the server; other users still
    /// apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    #[x_kube(validation = Rule::new(r"!self.contains('\n') && !self.contains('\r')").message(PERMISSIONS_MESSAGE))]
    #[x_kube(validation = Rule::new(r"!self.matches('(^|\\s)([<>#!]|(nopass|resetpass|reset)(\\s|$))')").message(PERMISSIONS_PASSWORD_MESSAGE))]
    pub permissions: Option<String>,
}

impl UserSpec {
    /// Whether `nopass: true` is set.
    pub fn nopass(&self) -> bool {
        self.nopass.unwrap_or(false)
    }
}

/// Secret keys holding a user's passwords.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PasswordSecret {
    /// Name of the Secret in the cluster's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// Keys of the Secret, each holding one password of the user. At least one.
    #[schemars(length(max = 16), inner(length(min = 1, max = 253)))]
    #[x_kube(validation = Rule::new("self.size() > 0").message(PASSWORD_KEYS_MESSAGE))]
    pub keys: Vec<String>,
}

/// Commands a user may run.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CommandRules {
    /// Commands (`get`), categories (`@read`) or subcommands (`config|get`) to allow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128), inner(length(max = 256)))]
    #[x_kube(validation = token_rule())]
    pub allow: Option<Vec<String>>,

    /// Commands, categories or subcommands to deny (applied after `allow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128), inner(length(max = 256)))]
    #[x_kube(validation = token_rule())]
    pub deny: Option<Vec<String>>,
}

/// Key patterns a user may access.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KeyRules {
    /// Glob patterns of keys the user may read and write (`~pattern`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128), inner(length(max = 256)))]
    #[x_kube(validation = token_rule())]
    pub read_write: Option<Vec<String>>,

    /// Glob patterns of keys the user may only read (`%R~pattern`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128), inner(length(max = 256)))]
    #[x_kube(validation = token_rule())]
    pub read_only: Option<Vec<String>>,

    /// Glob patterns of keys the user may only write (`%W~pattern`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128), inner(length(max = 256)))]
    #[x_kube(validation = token_rule())]
    pub write_only: Option<Vec<String>>,
}

/// Pub/Sub channels a user may access.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ChannelRules {
    /// Glob patterns of channels (`&pattern`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128), inner(length(max = 256)))]
    #[x_kube(validation = token_rule())]
    pub patterns: Option<Vec<String>>,
}

fn token_rule() -> Rule {
    Rule::new("self.all(t, t.matches('^[^[:space:]]+$'))").message(TOKEN_MESSAGE)
}

/// CEL rule on the users list: names are unique.
pub(crate) fn unique_names_rule() -> Rule {
    Rule::new("self.all(u, self.exists_one(v, v.name == u.name))").message(UNIQUE_NAMES_MESSAGE)
}
