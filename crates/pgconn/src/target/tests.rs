use super::*;

fn env_of(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    }
}

fn resolve(url: &str, env: Env) -> Result<Target, String> {
    let leaked: &'static str = Box::leak(url.to_owned().into_boxed_str());
    Target::resolve(Some(("LOCKDB_URL", leaked)), env).map_err(|e| e.to_string())
}

#[test]
fn multi_host_url_with_libpq_parameters() {
    let t = resolve(
        "postgres://u:p%40ss@h1:5432,h2:5433,[::1]/db?target_session_attrs=read-write&connect_timeout=3",
        &env_of(&[("HOME", "/nonexistent")]),
    )
    .unwrap();
    let hosts: Vec<String> = t.hosts().iter().map(Host::display).collect();
    assert_eq!(hosts, ["h1:5432", "h2:5433", "[::1]:5432"]);
    assert_eq!(t.session_attrs(), Some(SessionAttrs::ReadWrite));
    assert_eq!(t.connect_timeout(), Duration::from_secs(3));
    assert_eq!(t.user(), "u");
    assert_eq!(t.dbname(), "db");
    assert!(t.redactor().secrets().contains(&"p@ss".to_owned()));
    assert!(t.redactor().secrets().contains(&"p%40ss".to_owned()));
    assert_eq!(
        t.display(),
        "postgres://u@h1:5432,h2:5433,[::1]:5432/db?target_session_attrs=read-write"
    );
    assert_eq!(t.origin().to_string(), "LOCKDB_URL");
    assert!(!format!("{t:?}").contains("p@ss"));
}

#[test]
fn pg_variables_comma_lists_and_the_os_user() {
    let t = Target::resolve(
        None,
        &env_of(&[
            ("PGHOST", "a,b"),
            ("PGPORT", "6000,6001"),
            ("PGDATABASE", "locks"),
            ("HOME", "/nonexistent"),
        ]),
    )
    .unwrap();
    assert_eq!(t.user(), env::os_user_name().unwrap());
    // sqlx's default when nothing names a user.
    assert_ne!(t.user(), "anonymous");
    let hosts: Vec<String> = t.hosts().iter().map(Host::display).collect();
    assert_eq!(hosts, ["a:6000", "b:6001"]);
    assert_eq!(
        t.origin().to_string(),
        "PG variables (PGHOST PGPORT PGDATABASE) + libpq defaults"
    );
    let err =
        Target::resolve(None, &env_of(&[("PGHOST", "a,b,c"), ("PGPORT", "1,2")])).unwrap_err();
    assert_eq!(err.to_string(), "could not match 2 port numbers to 3 hosts");
}

#[test]
fn conninfo_and_unknown_parameters() {
    let t = resolve(
        "host=/run/pg port=5433 dbname='my db' user=me password='a \\' b'",
        &env_of(&[("HOME", "/nonexistent")]),
    )
    .unwrap();
    assert_eq!(t.dbname(), "my db");
    assert_eq!(t.redactor().secrets(), ["a ' b"]);
    assert_eq!(t.display(), "postgres://me@/my%20db?host=/run/pg&port=5433");
    let err = resolve("postgres://h/db?bogus=1", &|_| None).unwrap_err();
    assert!(err.starts_with("unsupported parameter bogus ("), "{err}");
    let t = resolve("postgres://h/db?keepalives=1&gssencmode=disable", &|_| None).unwrap();
    assert_eq!(t.notes().len(), 2, "{:?}", t.notes());
    let err = resolve("postgres://h/db?channel_binding=require", &|_| None).unwrap_err();
    assert!(
        err.starts_with("unsupported parameter channel_binding"),
        "{err}"
    );
}

#[test]
fn pgpass_matching_escapes_and_permissions() {
    let dir = std::env::temp_dir().join(format!("pgpass-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pass");
    std::fs::write(
        &file,
        "# comment\nother:5432:db:u:wrong\nh\\:x:*:db:u:nope\nh2:5433:*:u:s3\\:cret\n*:*:*:*:fallback\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let url = format!("postgres://u@h1,h2:5433/db?passfile={}", file.display());
    let t = resolve(&url, &|_| None).unwrap();
    assert_eq!(t.hosts()[0].password(), Some("fallback"));
    assert_eq!(t.hosts()[1].password(), Some("s3:cret"));
    assert!(t.notes().is_empty());
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let t = resolve(&url, &|_| None).unwrap();
    assert_eq!(t.hosts()[0].password(), None);
    assert!(
        t.notes()[0].contains("group or world access"),
        "{:?}",
        t.notes()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn defaults_application_name_and_verify_needs_a_ca() {
    let t = resolve(
        "postgres://u@h/db",
        &env_of(&[("PGAPPNAME", "mine"), ("HOME", "/nonexistent")]),
    )
    .unwrap();
    assert_eq!(t.options_for(0).get_application_name(), Some("mine"));
    assert_eq!(t.origin().to_string(), "LOCKDB_URL + PGAPPNAME");
    let t = resolve("postgres://u@h/db", &|_| None).unwrap();
    assert_eq!(
        t.options_for(0).get_application_name(),
        Some(DEFAULT_APPLICATION_NAME)
    );
    let err = resolve(
        "postgres://u@h/db?sslmode=verify-full",
        &env_of(&[("HOME", "/nonexistent")]),
    )
    .unwrap_err();
    assert!(err.contains("sslrootcert"), "{err}");
}

#[test]
fn hostaddr_pairs_with_host_and_is_where_the_connection_goes() {
    let none = env_of(&[("HOME", "/nonexistent")]);
    let t = resolve(
        "postgres://u@db1.example:5433,db2.example/db?hostaddr=10.0.0.1,fd00::2",
        &none,
    )
    .unwrap();
    let hosts: Vec<String> = t.hosts().iter().map(Host::display).collect();
    assert_eq!(
        hosts,
        [
            "db1.example:5433 (hostaddr 10.0.0.1)",
            "db2.example:5432 (hostaddr fd00::2)"
        ]
    );
    assert_eq!(t.hosts()[0].name.as_deref(), Some("db1.example"));
    // sqlx is handed the address, so no name is looked up.
    assert_eq!(t.options_for(0).get_host(), "10.0.0.1");
    assert_eq!(t.options_for(1).get_host(), "fd00::2");
    assert_eq!(
        t.display(),
        "postgres://u@db1.example:5433,db2.example:5432/db?hostaddr=10.0.0.1,fd00::2"
    );
    // An empty hostaddr entry falls back to its host; PGHOSTADDR counts.
    let t = resolve("postgres://u@a,b/db?hostaddr=,10.0.0.2", &none).unwrap();
    assert_eq!(t.hosts()[0].addr, Addr::Tcp("a".into()));
    assert_eq!(
        t.hosts()[1].addr,
        Addr::HostAddr("10.0.0.2".parse().unwrap())
    );
    let t = Target::resolve(
        None,
        &env_of(&[("PGHOSTADDR", "127.0.0.1"), ("PGUSER", "u"), ("HOME", "/x")]),
    )
    .unwrap();
    assert_eq!(t.hosts()[0].display(), "127.0.0.1:5432");
    let err = resolve("postgres://u@a,b,c/db?hostaddr=10.0.0.1,10.0.0.2", &none).unwrap_err();
    assert_eq!(err, "could not match 3 host names to 2 hostaddr values");
    let err = resolve("postgres://u@a/db?hostaddr=db.example", &none).unwrap_err();
    assert!(err.starts_with("invalid hostaddr \"db.example\""), "{err}");
}

#[test]
fn verify_full_with_a_hostaddr_for_another_name_is_refused() {
    let dir = std::env::temp_dir().join(format!("pgconn-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("root.crt");
    std::fs::write(&ca, "not read at resolve time").unwrap();
    let url = |rest: &str| {
        format!(
            "postgres://u@{rest}&sslmode=verify-full&sslrootcert={}",
            ca.display()
        )
    };
    let err = resolve(&url("db.example/db?hostaddr=10.0.0.1"), &|_| None).unwrap_err();
    assert!(
        err.contains("checked against 10.0.0.1, not db.example"),
        "{err}"
    );
    // Verifiable: the address alone, or a host that is that address.
    assert!(resolve(&url("/db?hostaddr=10.0.0.1"), &|_| None).is_ok());
    assert!(resolve(&url("10.0.0.1/db?hostaddr=10.0.0.1"), &|_| None).is_ok());
    let verify_ca = format!(
        "postgres://u@db.example/db?hostaddr=10.0.0.1&sslmode=verify-ca&sslrootcert={}",
        ca.display()
    );
    assert!(resolve(&verify_ca, &|_| None).is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn errors_never_carry_a_password_seen_before_them() {
    for url in [
        "postgres://u:hunter2@host:notaport/db",
        "postgres://u:hunter%32@host/db?sslmode=hunter2",
        "postgres://u:hunter2@host/db?target_session_attrs=hunter2",
        "host=h password=hunter2 port=hunter2",
    ] {
        let err = resolve(url, &|_| None).unwrap_err();
        assert!(!err.contains("hunter"), "{url}: {err}");
    }
}
