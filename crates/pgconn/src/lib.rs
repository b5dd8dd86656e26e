//! Where a PostgreSQL database is, by libpq's rules, and the walk over its
//! hosts, on sqlx.
//!
//! Owns reading a connection string (a `postgres://` URL, multi-host
//! `h1:p1,h2:p2` included, or a `key=value` conninfo), filling what it
//! leaves out from libpq's `PG*` variables and defaults (the OS user, never
//! `anonymous`; `~/.pgpass` with its matching and 0600 rules; the
//! `~/.postgresql/` certificates; `hostaddr` paired with `host`), naming
//! the target without secrets, and connecting: each host in order, each
//! within `connect_timeout`, kept only when it has the
//! `target_session_attrs` asked for. README.md says what of libpq is and is
//! not implemented.
//!
//! It does not own session settings beyond libpq's parameters, retries, or
//! the wording of errors for operators, and it never logs.
//!
//! Modules, each over the leaf `types`:
//! - `conninfo`: the two string forms and the parameter tables;
//! - `env`: the `PG*` variables, the OS user, the home directory;
//! - `passfile`: the password file;
//! - `tls`: `sslmode` and the certificate files;
//! - `target`: `Target` and the stages of `Target::resolve`;
//! - `walk`: sqlx's options for one host, and the host walk.

pub mod conninfo;
pub mod env;
pub mod passfile;
pub mod target;
pub mod tls;
pub mod types;
pub mod walk;

pub use env::os_user_name;
pub use target::Target;
pub use types::{
    Addr, DEFAULT_APPLICATION_NAME, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT, Env, Host, Origin,
    Params, Redactor, ResolveError, Role, SessionAttrs, process_env,
};
pub use walk::{HostFailure, WalkError, session_role};
