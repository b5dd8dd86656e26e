use super::*;

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
