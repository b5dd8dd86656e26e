//! libpq's host walk, on sqlx: one host at a time, each within
//! `connect_timeout`, kept only when its session has the
//! `target_session_attrs` asked for.
//!
//! Owns handing sqlx one host (`Target::options_for`: sqlx's options hold
//! one host, and are built with its own `.pgpass` and environment reading
//! off), the walk's order (prefer-standby: a standby first, else any), the
//! one round trip that tells a standby and a read-only session apart, and
//! why each host was passed over. It does not word failures for operators,
//! retry or log: the caller does.

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection as _, PgConnection, Row as _};

use crate::target::Target;
use crate::types::{Addr, Role, SessionAttrs};

/// One round trip telling a standby from a primary and a read-only session
/// from a writable one (libpq asks the same with `SHOW transaction_read_only`
/// and `pg_is_in_recovery()`). Simple protocol: no prepared statement.
const SESSION_ROLE: &str = "SELECT pg_catalog.pg_is_in_recovery()::text, \
     pg_catalog.current_setting('transaction_read_only')";

/// How long a session of the wrong kind is given to close politely.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

impl Target {
    /// sqlx's options for host `i` alone.
    pub fn options_for(&self, i: usize) -> PgConnectOptions {
        let host = &self.hosts()[i];
        let settings = &self.settings;
        let tls = &self.tls;
        let mut o = PgConnectOptions::new_without_pgpass()
            .port(host.port)
            .username(self.user())
            .database(self.dbname())
            .ssl_mode(tls.mode)
            .application_name(&settings.application_name)
            // Not a parameter PgBouncer knows: it would refuse the connection
            // unless told to ignore it. Only text-format floats need it; every
            // value here travels in binary.
            .extra_float_digits(None);
        o = match &host.addr {
            Addr::Tcp(h) => o.host(h),
            Addr::HostAddr(ip) => o.host(&ip.to_string()),
            Addr::Socket(dir) => o.socket(dir),
        };
        if let Some(pw) = host.password() {
            o = o.password(pw);
        }
        if let Some(p) = &tls.rootcert {
            o = o.ssl_root_cert(p);
        }
        if let Some(p) = &tls.cert {
            o = o.ssl_client_cert(p);
        }
        if let Some(p) = &tls.key {
            o = o.ssl_client_key(p);
        }
        if !settings.options.is_empty() {
            o = o.options(settings.options.iter().map(|(k, v)| (k, v)));
        }
        o
    }

    /// libpq's host walk: each host in order, each within `connect_timeout`,
    /// the first whose session has `attrs` wins (prefer-standby: the first
    /// standby, else the first that answers at all). Returns the connection
    /// and the host's index, or why each host was passed over.
    pub async fn connect(&self, attrs: SessionAttrs) -> Result<(PgConnection, usize), WalkError> {
        let passes = match attrs {
            SessionAttrs::PreferStandby => vec![SessionAttrs::Standby, SessionAttrs::Any],
            other => vec![other],
        };
        let mut attempts = Vec::new();
        for pass in &passes {
            attempts.clear();
            for i in 0..self.hosts().len() {
                match self.try_host(i, *pass).await {
                    Ok(conn) => return Ok((conn, i)),
                    Err(why) => attempts.push((self.hosts()[i].display(), why)),
                }
            }
        }
        Err(WalkError { attrs, attempts })
    }

    async fn try_host(&self, i: usize, attrs: SessionAttrs) -> Result<PgConnection, HostFailure> {
        let timeout = self.connect_timeout();
        let options = self.options_for(i);
        let mut conn =
            match tokio::time::timeout(timeout, PgConnection::connect_with(&options)).await {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => return Err(HostFailure::Connect(e)),
                Err(_) => return Err(HostFailure::Timeout(timeout)),
            };
        if attrs == SessionAttrs::Any {
            return Ok(conn);
        }
        match tokio::time::timeout(timeout, session_role(&mut conn)).await {
            Ok(Ok(role)) if attrs.accepts(role) => Ok(conn),
            Ok(Ok(role)) => {
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, conn.close()).await;
                Err(HostFailure::Role(role))
            }
            Ok(Err(e)) => Err(HostFailure::Connect(e)),
            Err(_) => Err(HostFailure::Timeout(timeout)),
        }
    }
}

/// What the connected server is, asked in one simple-protocol round trip.
pub async fn session_role(conn: &mut PgConnection) -> Result<Role, sqlx::Error> {
    let row = sqlx::raw_sql(SESSION_ROLE).fetch_one(&mut *conn).await?;
    if row.len() != 2 {
        return Err(sqlx::Error::Protocol(format!(
            "the session check returned {} columns, expected 2",
            row.len()
        )));
    }
    let in_recovery: String = row.try_get(0)?;
    let read_only: String = row.try_get(1)?;
    Ok(if in_recovery == "true" {
        Role::Standby
    } else if read_only == "on" {
        Role::ReadOnlyPrimary
    } else {
        Role::Writable
    })
}

/// Why one host was passed over.
#[derive(Debug)]
pub enum HostFailure {
    Connect(sqlx::Error),
    Timeout(Duration),
    /// It answered, but not with the session asked for.
    Role(Role),
}

/// No host had a session with the attributes asked for.
#[derive(Debug)]
pub struct WalkError {
    pub attrs: SessionAttrs,
    /// Each host (as displayed) and why it was passed over, in walk order.
    pub attempts: Vec<(String, HostFailure)>,
}

impl WalkError {
    /// Every host answered, and every one is a hot standby.
    pub fn all_standby(&self) -> bool {
        !self.attempts.is_empty()
            && self
                .attempts
                .iter()
                .all(|(_, f)| matches!(f, HostFailure::Role(Role::Standby)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_attrs_accept_what_libpq_accepts() {
        use Role::*;
        use SessionAttrs as A;
        let table = [
            (A::Any, [true, true, true]),
            (A::ReadWrite, [true, false, false]),
            (A::ReadOnly, [false, true, true]),
            (A::Primary, [true, true, false]),
            (A::Standby, [false, false, true]),
            // Its first pass; the second is `Any`.
            (A::PreferStandby, [false, false, true]),
        ];
        for (attrs, expected) in table {
            let got = [Writable, ReadOnlyPrimary, Standby].map(|r| attrs.accepts(r));
            assert_eq!(got, expected, "{}", attrs.as_str());
            assert_eq!(SessionAttrs::parse(attrs.as_str()), Some(attrs));
        }
    }
}
