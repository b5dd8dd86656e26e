//! What the process environment adds: libpq's `PG*` variables, the OS user
//! and the home directory.
//!
//! Owns the table of variables, filling in what a connection string left
//! out, and the two facts libpq takes from the OS when nothing says
//! otherwise. It does not read files (`passfile`, `tls` do, under the home
//! directory found here) and makes no OS call of its own: the user name is
//! `whoami`'s `getpwuid_r`, the home directory `std`'s.

use std::path::PathBuf;

use crate::types::{Env, Params};

/// libpq's environment variable for each parameter it reads from one.
pub const ENV_VARS: &[(&str, &str)] = &[
    ("host", "PGHOST"),
    ("hostaddr", "PGHOSTADDR"),
    ("port", "PGPORT"),
    ("dbname", "PGDATABASE"),
    ("user", "PGUSER"),
    ("password", "PGPASSWORD"),
    ("passfile", "PGPASSFILE"),
    ("connect_timeout", "PGCONNECT_TIMEOUT"),
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
    ("application_name", "PGAPPNAME"),
    ("options", "PGOPTIONS"),
    ("target_session_attrs", "PGTARGETSESSIONATTRS"),
];

/// Sets each parameter the string left out from its `PG*` variable, and
/// names the variables used, in table order.
pub fn fill(params: &mut Params, env: Env) -> Vec<&'static str> {
    let mut used = Vec::new();
    for (key, var) in ENV_VARS {
        if !params.contains_key(*key)
            && let Some(v) = env(var)
        {
            params.insert((*key).to_owned(), v);
            used.push(*var);
        }
    }
    used
}

/// The OS user name of the effective uid, as libpq's `pg_fe_getauthname`
/// (never `anonymous`): libpq's default user.
pub fn os_user_name() -> Option<String> {
    whoami::username().ok().filter(|name| !name.is_empty())
}

/// `$HOME`, else the passwd entry's directory (libpq ≥ 15 does the same).
pub fn home_dir(env: Env) -> Option<PathBuf> {
    env("HOME")
        .map(PathBuf::from)
        // std reads $HOME again, then getpwuid_r; an empty $HOME it returns
        // as it is, which means no home here.
        .or_else(std::env::home_dir)
        .filter(|dir| !dir.as_os_str().is_empty())
}
