//! The target read by libpq's rules: with no URL the daemon connects as the
//! OS user through the `PG*` variables and libpq's defaults, and `hostaddr`
//! is where a connection goes while the host name is what the password file
//! is matched with.
//!
//! It does not cover TLS (`topology::tls`) or multi-host failover
//! (`topology::failover`).

use std::time::Duration;

use lease_sweeper::testing::throwaway::ThrowawayPg;
use sqlx::{Connection as _, PgConnection};

use crate::support::free_port;
use crate::support::{
    Daemon, StatsdCapture, TempDir, TestDb, blocking, events, fields, insert_expired, wait_until,
};
use crate::topology::support::{lease_keys, sbin, server_of, unprivileged};

#[tokio::test]
async fn no_url_connects_by_libpq_defaults() {
    let db = TestDb::new().await;
    let mut conn = db.connect().await;
    let (server, server_port, _) = server_of(&db.url);
    let os_user = match unprivileged() {
        // As root, the test runs the daemon as `postgres` (runuser), a role
        // the throwaway cluster has.
        Some(_) => "postgres".to_owned(),
        None => {
            let me = pgconn::os_user_name().unwrap();
            let exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
                    .bind(&me)
                    .fetch_one(&mut conn)
                    .await
                    .unwrap();
            if !exists {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "CREATE ROLE \"{me}\" LOGIN SUPERUSER"
                )))
                .execute(&mut conn)
                .await
                .unwrap();
            }
            me
        }
    };
    insert_expired(&mut conn, "os-user-", 3, 10).await;
    let statsd = StatsdCapture::start().await;
    let sport = statsd.port.to_string();
    let port = server_port.to_string();
    let vars = [
        ("PGHOST", server.as_str()),
        ("PGPORT", port.as_str()),
        ("PGDATABASE", db.name.as_str()),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", sport.as_str()),
    ];
    let bin = crate::support::binary();
    let mut daemon = match unprivileged() {
        Some(_) => {
            let mut args = vec!["-u", "postgres", "--"];
            args.push(bin.to_str().unwrap());
            args.push("run");
            Daemon::spawn_program(&sbin("runuser"), &args, &vars)
        }
        None => Daemon::spawn_program(&bin, &["run"], &vars),
    };
    wait_until(Duration::from_secs(10), "the leases", || async {
        lease_keys(&daemon.lines()).len() == 3
    })
    .await;
    let role: String = sqlx::query_scalar(
        "SELECT usename::text FROM pg_stat_activity WHERE application_name = 'lease-sweeper'
            AND datname = $1 LIMIT 1",
    )
    .bind(&db.name)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    // runuser passes SIGTERM on to the daemon, then ends itself with it.
    daemon.signal(libc::SIGTERM);
    daemon.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(role, os_user);
    let lines = daemon.lines();
    assert_eq!(
        events(&lines, "sweeper_stopped").len(),
        1,
        "a graceful stop"
    );
    let starting = lines
        .iter()
        .map(|l| fields(l))
        .find(|f| f.get("message").map(String::as_str) == Some("starting"))
        .expect("a starting line");
    assert_eq!(
        starting["databaseFrom"],
        "PG variables (PGHOST PGPORT PGDATABASE) + libpq defaults"
    );
    assert!(
        starting["database"].starts_with(&format!("postgres://{os_user}@")),
        "{starting:?}"
    );
}

/// `hostaddr` is where the connection goes (the host name is never looked
/// up: a `.invalid` name cannot resolve), and the host name is what the
/// password file is matched with, as in libpq.
#[tokio::test]
async fn hostaddr_connected_passfile_by_host() {
    use lease_sweeper::testing::config::DbTarget;
    use lease_sweeper::testing::conn::connect;
    const PASSWORD: &str = "Hostaddr-S3cret-pw";
    const NAME: &str = "lockdb.invalid";
    let port = free_port();
    let pg = blocking(move || ThrowawayPg::start_tcp(port, &[]))
        .await
        .expect("a PostgreSQL on loopback TCP");
    let mut conn = PgConnection::connect(&pg.url("postgres")).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE sweeper LOGIN PASSWORD '{PASSWORD}'"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    // The cluster trusts everyone; over TCP this role must give its password.
    let hba = pg.data_dir().join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!("host all sweeper 127.0.0.1/32 scram-sha-256\n{rules}"),
    )
    .unwrap();
    sqlx::raw_sql("SELECT pg_reload_conf()")
        .execute(&mut conn)
        .await
        .unwrap();
    let dir = TempDir::new("hostaddr");
    let passfile = dir.join("pgpass");
    std::fs::write(
        &passfile,
        format!(
            "127.0.0.1:{port}:postgres:sweeper:Wrong-for-the-address\n\
             {NAME}:{port}:postgres:sweeper:{PASSWORD}\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o600)).unwrap();
    let url = |host: &str, query: &str| {
        let target = format!(
            "postgres://sweeper@{host}:{port}/postgres?sslmode=disable&passfile={}{query}",
            passfile.display()
        );
        DbTarget::from_url("LOCKDB_URL", &target).unwrap()
    };

    let target = url(NAME, "&hostaddr=127.0.0.1");
    assert_eq!(
        target.target().hosts()[0].display(),
        format!("{NAME}:{port} (hostaddr 127.0.0.1)")
    );
    let mut session = connect(&target)
        .await
        .expect("connects to the hostaddr with the host name's password");
    let (user, addr): (String, String) =
        sqlx::query_as("SELECT current_user::text, host(inet_server_addr())")
            .fetch_one(&mut session)
            .await
            .unwrap();
    assert_eq!((user.as_str(), addr.as_str()), ("sweeper", "127.0.0.1"));

    // Without hostaddr the name is looked up, and it does not resolve.
    let err = connect(&url(NAME, "")).await.unwrap_err().to_string();
    assert!(err.contains(NAME), "{err}");
    // With the address alone, the address's line is used: the wrong password.
    let err = connect(&url("", "&hostaddr=127.0.0.1"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("password authentication failed"), "{err}");
    assert!(
        !err.contains("Wrong-for") && !err.contains("S3cret"),
        "{err}"
    );
}
