//! libpq's own URI regression vectors (`libpq-uri-regress/`, from
//! PostgreSQL's source), run through `Target::resolve` as the daemon runs
//! `LOCKDB_URL`.
//!
//! Every URI libpq refuses must be a configuration error here. Every URI it
//! accepts must give the same parameters (libpq prints those that differ from
//! its defaults) and resolve to a target with those hosts, ports, user and
//! database. The URIs libpq accepts with "WARNING: ignoring unrecognized URI
//! query parameter" must be refused here: an unknown parameter is a
//! configuration error on purpose (`conninfo::vet` says why).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pgconn::{Addr, DEFAULT_PORT, Params, Target, conninfo, os_user_name};

/// The vectors' directory, beside this file.
const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/libpq-uri-regress");
/// How many URIs PostgreSQL's suite has; a truncated copy must not pass.
const VECTOR_COUNT: usize = 57;

/// What libpq answered for one URI.
#[derive(Debug)]
enum Libpq {
    /// Parsed: the parameters it printed, and whether it said `(inet)`.
    Accepts { params: Params, inet: bool },
    /// Parsed, ignoring an unknown query parameter with a warning.
    Warns,
    /// Refused, with libpq's message.
    Refuses(String),
}

/// `expected.out`: blocks of `trying URI`, then a warning, an error
/// (`uri-regress: …`) or the parameters (`key='value' … (inet|local)`).
fn libpq_answers() -> Vec<(String, Libpq)> {
    let text = std::fs::read_to_string(Path::new(VECTORS).join("expected.out")).unwrap();
    text.split("trying ")
        .skip(1)
        .map(|block| {
            let mut lines = block.lines();
            let uri = lines.next().unwrap().to_owned();
            let answer = lines.find(|l| !l.is_empty()).unwrap();
            let libpq = if answer.starts_with("WARNING: ignoring unrecognized URI query parameter")
            {
                Libpq::Warns
            } else if let Some(error) = answer.strip_prefix("uri-regress: ") {
                Libpq::Refuses(error.to_owned())
            } else {
                let (fields, kind) = answer.rsplit_once('(').unwrap();
                let mut params = BTreeMap::new();
                for field in fields.split("' ").filter(|f| !f.trim().is_empty()) {
                    let (k, v) = field.split_once("='").unwrap();
                    params.insert(k.to_owned(), v.trim_end_matches('\'').to_owned());
                }
                Libpq::Accepts {
                    params,
                    inet: kind == "inet)",
                }
            };
            (uri, libpq)
        })
        .collect()
}

fn resolve(uri: &str) -> Result<Target, String> {
    let uri: &'static str = Box::leak(uri.to_owned().into_boxed_str());
    // No PG* variables and no home: only the URI and libpq's defaults.
    let env = |name: &str| (name == "HOME").then(|| "/nonexistent".to_owned());
    Target::resolve(Some(("LOCKDB_URL", uri)), &env).map_err(|e| e.to_string())
}

/// Whether the resolved target agrees with what libpq parsed; `Err` says how
/// it does not.
fn same_target(t: &Target, params: &Params, inet: bool) -> Result<(), String> {
    let want_user = params.get("user").cloned().or_else(os_user_name).unwrap();
    let want_db = params
        .get("dbname")
        .cloned()
        .unwrap_or_else(|| want_user.clone());
    if t.user() != want_user || t.dbname() != want_db {
        return Err(format!("user/dbname {}/{}", t.user(), t.dbname()));
    }
    let [host] = t.hosts() else {
        return Err(format!("{} hosts", t.hosts().len()));
    };
    let want_port = params
        .get("port")
        .map_or(DEFAULT_PORT, |p| p.parse().unwrap());
    if host.port != want_port {
        return Err(format!("port {}", host.port));
    }
    if host.password() != params.get("password").map(String::as_str) {
        return Err("password".to_owned());
    }
    let ok = match (params.get("hostaddr"), params.get("host")) {
        (Some(a), name) => {
            host.addr == Addr::HostAddr(a.parse().unwrap()) && host.name.as_ref() == name
        }
        (None, Some(h)) if h.starts_with('/') => host.addr == Addr::Socket(PathBuf::from(h)),
        (None, Some(h)) => host.addr == Addr::Tcp(h.clone()),
        // libpq's default: a local socket (or localhost when none exists).
        (None, None) => {
            host.name.is_none()
                && (matches!(&host.addr, Addr::Socket(_))
                    || host.addr == Addr::Tcp("localhost".into()))
        }
    };
    if !ok {
        return Err(format!("host {}", host.display()));
    }
    let our_inet = match &host.addr {
        Addr::HostAddr(_) => true,
        Addr::Tcp(_) => host.name.is_some(),
        Addr::Socket(_) => false,
    };
    if our_inet != inet {
        return Err(format!("inet {our_inet}, libpq {inet}"));
    }
    Ok(())
}

#[test]
fn every_libpq_uri_vector_gets_libpqs_answer() {
    let uris: Vec<String> = std::fs::read_to_string(Path::new(VECTORS).join("regress.in"))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let answers = libpq_answers();
    assert_eq!(uris.len(), VECTOR_COUNT);
    assert_eq!(
        answers.iter().map(|(u, _)| u).collect::<Vec<_>>(),
        uris.iter().collect::<Vec<_>>(),
        "expected.out and regress.in list the same URIs"
    );
    let mut disagreements = Vec::new();
    let (mut accepted, mut refused, mut warned) = (0, 0, 0);
    for (uri, libpq) in &answers {
        let ours = resolve(uri);
        let verdict = match (libpq, &ours) {
            (Libpq::Refuses(_), Err(_)) => {
                refused += 1;
                Ok(())
            }
            (Libpq::Warns, Err(e)) if e.starts_with("unsupported parameter uzer ") => {
                warned += 1;
                Ok(())
            }
            (Libpq::Accepts { params, inet }, Ok(t)) => {
                accepted += 1;
                // The parse stage alone gives exactly libpq's parameters.
                match conninfo::parse(uri) {
                    Ok(ref p) if p == params => same_target(t, params, *inet),
                    other => Err(format!("parsed {other:?}")),
                }
            }
            (Libpq::Refuses(e), Ok(t)) => Err(format!("libpq refuses ({e}), we accept {t:?}")),
            (_, Err(e)) => Err(format!("libpq accepts, we refuse: {e}")),
            (Libpq::Warns, Ok(t)) => Err(format!("libpq warns, we accept {t:?}")),
        };
        if let Err(why) = verdict {
            disagreements.push(format!("{uri}: {why}"));
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} of {VECTOR_COUNT} disagree with libpq:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
    // The suite's own mix: a copy that lost a kind of vector must not pass.
    assert_eq!((accepted, refused, warned), (43, 12, 2));
}
