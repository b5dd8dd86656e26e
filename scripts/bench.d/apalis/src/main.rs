//! `apalis-bench-driver setup URL`: creates apalis's schema (its migrations).
//! `apalis-bench-driver rescue URL QUEUE DEAD_FOR_SECS`: times one call of
//! `apalis_postgres::queries::reenqueue_orphaned` and prints
//! `rows=<n> seconds=<s>`.
use std::time::Instant;

use apalis_postgres::{PgPool, PostgresStorage};
use sqlx::Connection as _;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("setup") => {
            let pool = PgPool::connect(&args[2]).await.expect("connect");
            PostgresStorage::setup(&pool).await.expect("apalis setup");
        }
        Some("rescue") => {
            let mut conn = sqlx::PgConnection::connect(&args[2])
                .await
                .expect("connect");
            let dead_for: u64 = args[4].parse().expect("seconds");
            let t = Instant::now();
            let n = apalis_postgres::queries::reenqueue_orphaned(&mut conn, &args[3], dead_for)
                .await
                .expect("reenqueue_orphaned");
            println!("rows={n} seconds={:.3}", t.elapsed().as_secs_f64());
        }
        _ => {
            eprintln!("usage: apalis-bench-driver setup URL | rescue URL QUEUE DEAD_FOR_SECS");
            std::process::exit(2);
        }
    }
}
