//! Which namespaces the controllers watch: every namespace (the default, with a ClusterRole),
//! or one (`--watch-namespace`, with a Role in that namespace and a ClusterRole for the CRDs
//! only).

use kube::{Api, Client, Resource};

/// The namespaces the controllers serve.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace.
    #[default]
    All,
    /// This namespace only: ValkeyClusters elsewhere are not seen, and no object outside it
    /// is read or written.
    Namespace(String),
}

impl Scope {
    /// `--watch-namespace` given or not.
    pub fn from_option(namespace: Option<String>) -> Self {
        match namespace.filter(|n| !n.is_empty()) {
            Some(n) => Self::Namespace(n),
            None => Self::All,
        }
    }

    /// An API of a namespaced kind over this scope.
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        match self {
            Self::All => Api::all(client.clone()),
            Self::Namespace(ns) => Api::namespaced(client.clone(), ns),
        }
    }

    /// Words for the logs: `all namespaces` or `namespace <ns>`.
    pub fn describe(&self) -> String {
        match self {
            Self::All => "all namespaces".to_owned(),
            Self::Namespace(ns) => format!("namespace {ns}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_means_every_namespace() {
        assert_eq!(Scope::from_option(None), Scope::All);
        assert_eq!(Scope::from_option(Some(String::new())), Scope::All);
        assert_eq!(
            Scope::from_option(Some("apps".into())),
            Scope::Namespace("apps".into())
        );
        assert_eq!(Scope::Namespace("apps".into()).describe(), "namespace apps");
    }
}
