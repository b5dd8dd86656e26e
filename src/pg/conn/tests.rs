use super::*;

/// Another future on the one-thread runtime (the next batch's statement,
/// in the daemon) runs while a batch's lines are written, not only after
/// all of them; every row is reported once, in order.
#[tokio::test(flavor = "current_thread")]
async fn other_work_runs_between_chunks_of_a_batch() {
    let rows: Vec<usize> = (0..REPORT_CHUNK * 2 + 7).collect();
    let ticks = std::sync::atomic::AtomicUsize::new(0);
    let mut seen: Vec<(usize, usize)> = Vec::new();
    let mut reported = Vec::new();
    let mut report = |chunk: &[usize]| {
        seen.push((chunk.len(), ticks.load(std::sync::atomic::Ordering::SeqCst)));
        reported.extend_from_slice(chunk);
        Ok(())
    };
    let other = async {
        for _ in 0..3 {
            ticks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::task::yield_now().await;
        }
    };
    let (written, ()) = tokio::join!(report_in_chunks(&rows, &mut report), other);
    written.unwrap();
    assert_eq!(reported, rows);
    let sizes: Vec<usize> = seen.iter().map(|&(n, _)| n).collect();
    assert_eq!(sizes, [REPORT_CHUNK, REPORT_CHUNK, 7]);
    let at: Vec<usize> = seen.iter().map(|&(_, t)| t).collect();
    assert!(
        at[0] < at[2],
        "the other future ran before the last chunk: {at:?}"
    );
}

#[test]
fn topology_failures_get_one_clear_word() {
    let protocol = describe(&sqlx::Error::Protocol("unexpected DataRow".into()));
    assert!(protocol.starts_with("protocol error: "), "{protocol}");
    assert!(protocol.contains("connection pooler"), "{protocol}");
    let tls = |text: &str| describe(&sqlx::Error::Io(std::io::Error::other(text.to_owned())));
    assert!(tls("invalid peer certificate: UnknownIssuer").starts_with("TLS failure: unknown CA"));
    assert!(
        tls("invalid peer certificate: certificate not valid for name \"db\"")
            .starts_with("TLS failure: host name mismatch")
    );
    assert!(
        tls("invalid peer certificate: Expired")
            .starts_with("TLS failure: the server's certificate is expired")
    );
    assert_eq!(
        tls("Connection refused (os error 111)"),
        "error communicating with database: Connection refused (os error 111)"
    );
}
