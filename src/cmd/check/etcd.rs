//! `check`'s etcd lines, when the locks are in etcd: whether the sidecar
//! reaches etcd as its user, which keys it will follow for locks, and
//! whether it may write its own claims. Changes nothing: the write check is
//! a transaction whose only write is on a branch etcd never takes (etcd
//! checks every branch's permissions before it decides). The etcd calls
//! themselves are `etcd`'s.

use crate::cmd::check::report::Line;
use crate::config::EtcdTarget;

/// The `check` lines of an etcd target, in order; a `FAIL` stops the rest.
pub async fn lines(target: &EtcdTarget) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut client = match crate::etcd::connect(target).await {
        Ok(client) => client,
        Err(e) => {
            lines.push(Line::fail("etcd", e.to_string()));
            return lines;
        }
    };
    match client.status().await {
        Ok(status) => lines.push(Line::ok(
            "etcd",
            format!(
                "{} answers (etcd {}, revision {})",
                target.display(),
                status.version(),
                status.header().map(|h| h.revision()).unwrap_or(0)
            ),
        )),
        Err(e) => {
            lines.push(Line::fail(
                "etcd",
                crate::etcd::unreachable(target, &e).to_string(),
            ));
            return lines;
        }
    }
    match crate::etcd::scopes(&mut client, target).await {
        Ok(scopes) => lines.push(Line::ok(
            "etcd lock keys",
            crate::etcd::describe_scopes(&scopes),
        )),
        Err(e) => {
            lines.push(Line::fail("etcd lock keys", e.to_string()));
            return lines;
        }
    }
    lines.push(match crate::etcd::may_write_own(&mut client).await {
        Ok(()) => Line::ok(
            "etcd claims",
            format!(
                "may write under {} (claims, resume points, liveness)",
                crate::etcd::OWN_PREFIX
            ),
        ),
        Err(e) => Line::fail(
            "etcd claims",
            format!(
                "{e}: grant the user's role readwrite on the prefix {}",
                crate::etcd::OWN_PREFIX
            ),
        ),
    });
    lines
}
