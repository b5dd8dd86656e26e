//! A StatsD agent in a unit test: a real UDP socket on loopback whose
//! datagrams are read back line by line. Test-only; what is sent, and how,
//! is `statsd`'s and `metrics`'s.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use crate::config::StatsdTarget;

/// A socket bound to a free port on loopback.
pub struct Agent {
    socket: UdpSocket,
}

impl Agent {
    /// Binds it; a read waits at most 10 s, so a line that never comes
    /// fails the test instead of hanging it.
    pub fn bind() -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Self { socket }
    }

    pub fn addr(&self) -> SocketAddr {
        self.socket.local_addr().unwrap()
    }

    /// The target that sends here.
    pub fn target(&self) -> StatsdTarget {
        StatsdTarget {
            host: "127.0.0.1".into(),
            port: self.addr().port(),
        }
    }

    /// Every line received until `n` lines have arrived.
    pub fn receive(&self, n: usize) -> Vec<String> {
        let mut lines = Vec::new();
        let mut buf = [0u8; 2048];
        while lines.len() < n {
            let len = self.socket.recv(&mut buf).expect("a datagram within 10 s");
            let text = String::from_utf8_lossy(&buf[..len]).into_owned();
            lines.extend(text.lines().map(str::to_owned));
        }
        lines
    }
}
