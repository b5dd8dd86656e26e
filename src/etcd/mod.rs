//! The etcd lock backend (`backend=etcd`): locks held with etcd's own lock
//! service, whose expiries etcd carries out and never reports. `locks` says
//! which keys are locks and what a deletion means, `watch` follows etcd and
//! classifies, `store` claims each expiry for one sidecar and hands it to
//! the lock sweeper as a batch, as the PostgreSQL backend does. No timing
//! of passes, no lines or metrics (`sweep`, `output`), no PostgreSQL.

pub mod locks;
pub mod store;
mod watch;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use crate::config::EtcdTarget;
use crate::store::{StoreError, Work};

/// Every key the sidecar writes starts with this: its claims, resume points
/// and liveness keys. The role it runs as needs write here and nowhere
/// else.
pub const OWN_PREFIX: &str = "lease-sweeper/";

/// The keys a watch follows: `[key, end)` as etcd ranges them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub key: Vec<u8>,
    pub end: Vec<u8>,
}

impl Scope {
    /// The whole keyspace.
    pub fn everything() -> Self {
        Self {
            key: vec![0],
            end: vec![0],
        }
    }
}

/// What the sidecar follows: every key, unless etcd refuses that to its
/// user; then each key range the user's roles may read (outside the
/// sidecar's own keys), found by asking etcd, which lets a user read its
/// own user and roles. So a role that reads only the locks' prefix needs
/// no setting here.
pub async fn scopes(client: &mut Client, target: &EtcdTarget) -> Result<Vec<Scope>, StoreError> {
    let all = Scope::everything();
    let probe = etcd_client::GetOptions::new()
        .with_range(all.end.clone())
        .with_limit(1)
        .with_keys_only();
    let key = all.key.clone();
    let get = |mut c: Client| {
        let (key, probe) = (key.clone(), probe.clone());
        async move { c.get(key, Some(probe)).await }
    };
    let denied = match call(client, get).await {
        Ok(_) => return Ok(vec![all]),
        Err(e) if e.to_string().contains("permission denied") => e,
        Err(e) => return Err(failed("reading the keyspace", &e)),
    };
    let Some((user, _)) = &target.user else {
        return Err(failed("reading the keyspace", &denied));
    };
    let roles = client
        .user_get(user.as_str())
        .await
        .map_err(|e| failed("reading the user's own roles", &e))?;
    let mut scopes = Vec::new();
    for role in roles.roles() {
        let got = client
            .role_get(role.as_str())
            .await
            .map_err(|e| failed("reading a role's permissions", &e))?;
        for p in got.permissions() {
            // authpb: READ = 0, WRITE = 1, READWRITE = 2.
            if p.get_type() == 1 || p.key().starts_with(OWN_PREFIX.as_bytes()) {
                continue;
            }
            let end = if p.range_end().is_empty() {
                let mut one = p.key().to_vec();
                one.push(0);
                one
            } else {
                p.range_end().to_vec()
            };
            scopes.push(Scope {
                key: p.key().to_vec(),
                end,
            });
        }
    }
    let scopes = merged(scopes);
    if scopes.is_empty() {
        return Err(StoreError::Topology {
            work: Work::LockLeases,
            target: target.display(),
            cause: format!(
                "user {user} may read no keys outside {OWN_PREFIX}: grant its role read on the \
                 prefix that holds the locks (etcdctl role grant-permission --prefix ROLE read \
                 PREFIX)"
            ),
        });
    }
    Ok(scopes)
}

/// `scopes` sorted, with every overlap merged: two watches over one key
/// would each report its deletion.
fn merged(mut scopes: Vec<Scope>) -> Vec<Scope> {
    // An end of "\0" is etcd's "to the end of the keyspace".
    fn end_of(s: &Scope) -> Option<&[u8]> {
        (s.end != [0]).then_some(s.end.as_slice())
    }
    scopes.sort_by(|a, b| a.key.cmp(&b.key));
    let mut out: Vec<Scope> = Vec::with_capacity(scopes.len());
    for next in scopes {
        if let Some(last) = out.last_mut() {
            let overlaps = end_of(last).is_none_or(|end| next.key.as_slice() < end);
            if overlaps {
                let further = match (end_of(last), end_of(&next)) {
                    (None, _) => false,
                    (Some(_), None) => true,
                    (Some(a), Some(b)) => b > a,
                };
                if further {
                    last.end = next.end;
                }
                continue;
            }
        }
        out.push(next);
    }
    out
}

/// The scopes in words, for `check`.
pub fn describe_scopes(scopes: &[Scope]) -> String {
    if scopes == [Scope::everything()] {
        return "follows every key (a lock key: <name>/<its own lease id in hex>, empty value)"
            .to_owned();
    }
    let ranges: Vec<String> = scopes
        .iter()
        .map(|s| format!("[{}, {})", store::key_text(&s.key), store::key_text(&s.end)))
        .collect();
    format!(
        "follows what the user may read: {} (a lock key: <name>/<its own lease id in hex>, empty value)",
        ranges.join(", ")
    )
}

/// Whether this user may write under `OWN_PREFIX`, asked without writing:
/// the put sits on a branch whose condition (a key's version below zero)
/// never holds, and etcd checks the permissions of every branch first.
pub async fn may_write_own(client: &mut Client) -> Result<(), etcd_client::Error> {
    let key = format!("{OWN_PREFIX}check");
    let never = etcd_client::Txn::new()
        .when([etcd_client::Compare::version(
            key.clone(),
            etcd_client::CompareOp::Less,
            0,
        )])
        .and_then([etcd_client::TxnOp::put(key, "", None)]);
    let txn = |mut c: Client| {
        let never = never.clone();
        async move { c.txn(never).await }
    };
    call(client, txn).await.map(|_| ())
}

pub(crate) fn failed(doing: &'static str, e: &etcd_client::Error) -> StoreError {
    StoreError::Query {
        work: Work::LockLeases,
        query: doing,
        cause: cause("etcd", e),
        source: None,
    }
}

/// Longest one etcd request may take. A request that reaches a member
/// whose leader just died waits for etcd's own request timeout (seconds);
/// given up here, it is sent again, to another member.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// How many times a request is sent before its failure is the pass's: the
/// client spreads requests over every endpoint, a dead member's among them,
/// where each fails at once, so one more try reaches a live member.
const ATTEMPTS: u32 = 4;

/// Sends the request `send` makes, again on a failure that another member
/// may not have (a dead endpoint, a leader change, a timeout), at most
/// `ATTEMPTS` times; any other failure (a refused permission) at once.
pub async fn call<T, F, Fut>(client: &Client, mut send: F) -> Result<T, etcd_client::Error>
where
    F: FnMut(Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let mut attempt = 1;
    loop {
        let result = match tokio::time::timeout(CALL_TIMEOUT, send(client.clone())).await {
            Ok(result) => result,
            Err(_) => Err(etcd_client::Error::IoError(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {} s", CALL_TIMEOUT.as_secs()),
            ))),
        };
        match result {
            Err(e) if attempt < ATTEMPTS && transient(&e) => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_millis(20 * u64::from(attempt))).await;
            }
            other => return other,
        }
    }
}

/// A failure another member, or a moment later, may not have.
fn transient(e: &etcd_client::Error) -> bool {
    use etcd_client::Error;
    match e {
        Error::GRpcStatus(s) => {
            matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Aborted
            ) || s.message().contains("leader changed")
                || s.message().contains("request timed out")
        }
        Error::IoError(_) | Error::TransportError(_) => true,
        _ => false,
    }
}

/// The sidecar's clock, in epoch milliseconds: the one clock every deadline
/// and every sighting is measured with.
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// What an etcd call's failure says, prefixed with what was being done.
/// The client's errors carry no password: etcd takes it in an
/// authentication call whose text is never echoed.
pub fn cause(doing: &str, e: &etcd_client::Error) -> String {
    format!("{doing}: {e}")
}

/// Connects to `target`: every endpoint, TLS when its files are set, the
/// user's password exchanged for a token. The error names the endpoints
/// and the user, never the password.
pub async fn connect(target: &EtcdTarget) -> Result<Client, StoreError> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(std::time::Duration::from_secs(5))
        .with_keep_alive(
            std::time::Duration::from_secs(10),
            std::time::Duration::from_secs(5),
        );
    if target.ca.is_some() || target.identity.is_some() {
        let mut tls = TlsOptions::new();
        if let Some(ca) = &target.ca {
            tls = tls.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &target.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        options = options.with_tls(tls);
    }
    if let Some((name, password)) = &target.user {
        options = options.with_user(name.clone(), password.clone());
    }
    Client::connect(&target.endpoints, Some(options))
        .await
        .map_err(|e| unreachable(target, &e))
}

/// A first contact with etcd that failed, as a connection error: the
/// endpoints, the user, the cause (never the password) and what to check.
/// The client connects lazily, so the first request may be where it shows.
pub fn unreachable(target: &EtcdTarget, e: &etcd_client::Error) -> StoreError {
    let mut text = e.to_string();
    if let Some((_, password)) = &target.user
        && !password.is_empty()
    {
        text = text.replace(password.as_str(), "***");
    }
    StoreError::Connect {
        work: Work::LockLeases,
        target: target.display(),
        cause: text,
        hint: hint(e),
    }
}

/// What to check first for a failed connection.
pub fn hint(e: &etcd_client::Error) -> &'static str {
    let text = e.to_string().to_lowercase();
    if text.contains("authentication failed") || text.contains("invalid auth") {
        "check ETCDCTL_USER and its password"
    } else if text.contains("permission denied") {
        "the user's role lacks a permission the sidecar needs"
    } else if text.contains("certificate") || text.contains("tls") || text.contains("unknownissuer")
    {
        "check ETCDCTL_CACERT, ETCDCTL_CERT and ETCDCTL_KEY against the server's certificates"
    } else {
        "is etcd running and reachable at these endpoints?"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(key: &str, end: &str) -> Scope {
        Scope {
            key: key.as_bytes().to_vec(),
            end: end.as_bytes().to_vec(),
        }
    }

    #[test]
    fn overlapping_ranges_are_followed_once() {
        assert_eq!(
            merged(vec![
                scope("locks/payments/", "locks/payments0"),
                scope("locks/", "locks0"),
                scope("other/", "other0"),
            ]),
            vec![scope("locks/", "locks0"), scope("other/", "other0")]
        );
        assert_eq!(
            merged(vec![scope("a", "c"), scope("b", "d")]),
            vec![scope("a", "d")]
        );
        assert_eq!(
            merged(vec![scope("a", "b"), scope("b", "c")]),
            vec![scope("a", "b"), scope("b", "c")],
            "[a, b) and [b, c) share no key"
        );
        assert_eq!(
            merged(vec![scope("m", "\0"), scope("x", "y")]),
            vec![scope("m", "\0")],
            "a range to the end takes in what follows it"
        );
    }
}
