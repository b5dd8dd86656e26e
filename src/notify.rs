//! systemd's notify protocol. (Being written: issue 5.)
