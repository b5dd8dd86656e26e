//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!`
//! embeds `migrations/` at compile time, and cargo would not otherwise know
//! that a new file there changes the binary.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
