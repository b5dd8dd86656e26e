//! `sslmode=verify-full` against a TLS PostgreSQL with a CA made here: the
//! daemon sweeps over TLS, a client certificate from libpq's variables logs
//! in a `cert`-only role, and a wrong CA, a wrong host name or a missing
//! client certificate is refused, each named, never with the password.
//!
//! It does not cover how the target is read without a URL (`topology::libpq`).
//! The certificates come from `topology::support`.

use std::path::Path;
use std::time::Duration;

use lease_sweeper::testing::throwaway::ThrowawayPg;
use sqlx::{Connection as _, PgConnection};

use crate::support::free_port;
use crate::support::{
    Daemon, StatsdCapture, blocking, daemon_env, events, insert_expired, wait_until,
};
use crate::topology::support::{Certs, assert_each_once, lease_keys, unprivileged};

#[tokio::test]
async fn verify_full_sweeps_wrong_ca_or_host_refused() {
    const PASSWORD: &str = "Tls-S3cret-pw";
    let certs = Certs::make(unprivileged());
    let port = free_port();
    let (cert, key, ca) = (
        certs.server_cert.display().to_string(),
        certs.server_key.display().to_string(),
        certs.ca.display().to_string(),
    );
    let pg = blocking(move || {
        ThrowawayPg::start_tcp(
            port,
            &[
                ("ssl", "on"),
                ("ssl_cert_file", &cert),
                ("ssl_key_file", &key),
                ("ssl_ca_file", &ca),
            ],
        )
    })
    .await
    .expect("a TLS-enabled PostgreSQL");
    let mut conn = PgConnection::connect(&pg.url("postgres")).await.unwrap();
    lease_sweeper::testing::migrate::migrate(&mut conn)
        .await
        .unwrap();
    insert_expired(&mut conn, "tls-", 5, 10).await;
    // Role `certuser` may log in over TCP only with a client certificate the
    // CA signed (pg_hba `cert`), read first, before the cluster's trust lines.
    sqlx::raw_sql("CREATE ROLE certuser LOGIN SUPERUSER")
        .execute(&mut conn)
        .await
        .unwrap();
    let hba = pg.data_dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!(
            "hostssl all certuser 127.0.0.1/32 cert\nhost all certuser 127.0.0.1/32 reject\n{rules}"
        ),
    )
    .unwrap();
    sqlx::raw_sql("SELECT pg_reload_conf()")
        .execute(&mut conn)
        .await
        .unwrap();

    let statsd = StatsdCapture::start().await;
    let sport = statsd.port.to_string();
    let url = |host: &str, ca: &Path| {
        format!(
            "postgres://postgres:{PASSWORD}@{host}:{port}/postgres?sslmode=verify-full&sslrootcert={}",
            ca.display()
        )
    };
    let (good, wrong_ca, wrong_name) = (
        url("localhost", &certs.ca),
        url("localhost", &certs.wrong_ca),
        url("127.0.0.1", &certs.ca),
    );
    // Client certificate through libpq's variables (PGSSLCERT/PGSSLKEY),
    // and the same role without one.
    let cert_url = format!(
        "postgres://certuser@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={}",
        certs.ca.display()
    );
    let (client_cert, client_key) = (
        certs.client_cert.display().to_string(),
        certs.client_key.display().to_string(),
    );
    let mut with_cert = daemon_env(&cert_url, &sport);
    with_cert.extend([
        ("PGSSLCERT", client_cert.as_str()),
        ("PGSSLKEY", client_key.as_str()),
    ]);
    let mut daemons = [
        Daemon::spawn(&daemon_env(&good, &sport)),
        Daemon::spawn(&daemon_env(&wrong_ca, &sport)),
        Daemon::spawn(&daemon_env(&wrong_name, &sport)),
        Daemon::spawn(&with_cert),
        Daemon::spawn(&daemon_env(&cert_url, &sport)),
    ];
    // The two daemons that may connect split the leases between them.
    wait_until(Duration::from_secs(10), "the leases over TLS", || async {
        lease_keys(&daemons[0].lines()).len() + lease_keys(&daemons[3].lines()).len() == 5
    })
    .await;
    let ssl: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid)
          WHERE application_name = 'lease-sweeper' AND usename = 'postgres' AND ssl",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(ssl >= 1, "the sweeper's session is encrypted");
    for d in [&daemons[1], &daemons[2], &daemons[4]] {
        d.wait_for_event("sweep_failed", Duration::from_secs(10))
            .await;
    }
    // The client-certificate daemon is connected as certuser, over TLS.
    crate::support::poll(
        Duration::from_secs(10),
        "a certuser session over TLS",
        async || {
            let daemon = &daemons[3];
            {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid)
                  WHERE usename = 'certuser' AND ssl AND client_dn = '/CN=certuser'",
                )
                .fetch_one(&mut conn)
                .await
                .unwrap();
                if n >= 1 {
                    Ok(())
                } else {
                    Err(format!("the daemon said:\n{}", daemon.lines().join("\n")))
                }
            }
        },
    )
    .await;
    for d in &mut daemons {
        assert_eq!(d.stop().await.0, Some(0));
    }
    assert_eq!(events(&daemons[3].lines(), "sweep_failed"), vec![]);
    assert_eq!(events(&daemons[0].lines(), "sweep_failed"), vec![]);
    let mut swept = lease_keys(&daemons[0].lines());
    swept.extend(lease_keys(&daemons[3].lines()));
    assert_each_once(&swept, 5, "tls-");
    for (d, word) in [
        (&daemons[1], "unknown CA"),
        (&daemons[2], "host name mismatch"),
        (&daemons[4], "certificate"),
    ] {
        let failed = events(&d.lines(), "sweep_failed");
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0]["error"].contains(word),
            "{:?}",
            failed[0]["error"]
        );
        assert!(lease_keys(&d.lines()).is_empty());
        eprintln!("FIGURES tls refused: {}", failed[0]["error"]);
    }
    for d in &daemons {
        assert!(
            !d.lines().iter().any(|l| l.contains(PASSWORD)),
            "the password never reaches a line"
        );
    }
}
